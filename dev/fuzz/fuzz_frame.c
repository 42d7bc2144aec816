/*
 * fuzz_frame.c: libFuzzer target for the frame parser (frame_check_header,
 * frame_open) and the seal/open round trip.
 *
 *   make dev/fuzz/fuzz_frame
 *   ./dev/fuzz/fuzz_frame -max_total_time=20 dev/fuzz/corpus/frame  # fuzz
 *   ./dev/fuzz/fuzz_frame -runs=0 dev/fuzz/corpus/frame             # replay the seeds only (CI)
 *
 * The key is the bytes 0, 1, ..., 31; the receiver is rank 1 of 4 waiting for
 * rank 2 on the activation channel, step 7, micro-batch 0. The seeds in
 * corpus/frame are sealed that way (test_secure -corpus dev/fuzz/corpus).
 * Besides "no crash", it checks what must always hold, and aborts if not.
 */
#include "secure.h"
#include "llm3d/secure/fault.h"  // frame_tamper

static void must(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_frame: broken invariant: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i;
    Links rx, tx;
    if (links_init(&rx, key, 1, 4) != 0 || links_init(&tx, key, 2, 4) != 0) abort();
    char err[256];
    const uint8_t *payload;

    // 1. the input as a received frame, expecting the length it implies
    size_t expect = size >= 96 ? size - 96 : 0;
    err[0] = '\0';
    int rc = frame_open(&rx, data, size, 2, CH_ACTIVATION, 7, 0, expect, &payload, err, sizeof(err));
    if (rc == 0) must(payload == data + 64 && rx.recv_seq[2] == 1, "an accepted frame points at its payload and advances seq");
    else must(payload == NULL && rx.recv_seq[2] == 0 && err[0] != '\0' && memchr(err, '\0', sizeof(err)) != NULL,
              "a refused frame leaves seq alone and says why");

    // 2. the header's own length as the expectation, as a careless caller
    // would: must still never read past size
    if (size >= 64) {
        rx.recv_seq[2] = 0;
        frame_open(&rx, data, size, 2, CH_ACTIVATION, 7, 0, (size_t)get_u64(data + 48), &payload, err, sizeof(err));
    }

    // 3. the input as a payload: seal, open, then a tampered copy must fail
    uint8_t *frame = malloc(frame_bytes(size));
    must(frame != NULL, "malloc");
    must(frame_seal(&tx, 1, CH_GRADIENT, 9, 1, data, size, frame) == 0, "seal");
    rx.recv_seq[2] = 0;
    rc = frame_open(&rx, frame, frame_bytes(size), 2, CH_GRADIENT, 9, 1, size, &payload, err, sizeof(err));
    must(rc == 0 && (size == 0 || memcmp(payload, data, size) == 0), "a sealed frame opens to its payload");
    rx.recv_seq[2] = 0;
    frame_tamper(frame, frame_bytes(size));
    rc = frame_open(&rx, frame, frame_bytes(size), 2, CH_GRADIENT, 9, 1, size, &payload, err, sizeof(err));
    must(rc == -1, "a tampered frame is refused");
    free(frame);
    links_free(&rx);
    links_free(&tx);
    return 0;
}
