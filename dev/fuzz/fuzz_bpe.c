/*
 * fuzz_bpe.c: libFuzzer target for tokenizer.h's GPT-2 encoder (bpe_encode,
 * the pre-tokenizer and the piece cache), with the real GPT-2 vocabulary.
 *
 *   make dev/fuzz/fuzz_bpe
 *   ./dev/fuzz/fuzz_bpe -max_total_time=20 dev/fuzz/corpus/bpe   # fuzz
 *   ./dev/fuzz/fuzz_bpe -runs=0 dev/fuzz/corpus/bpe              # replay the corpus
 *
 * Run from the repo root: encoder.json and vocab.bpe are loaded once from
 * $LLM3D_DATA/gpt2, else ../shared/data/gpt2; without them it exits with a
 * message. Input: the low bit of the first byte is allow_special, the rest is
 * the text (any bytes; corpus files start with '0' or '1' to stay readable).
 * Besides the sanitizers it checks, aborting on failure: every id is in the
 * vocabulary, the ids decode back to exactly the input bytes, the
 * pre-tokenizer's pieces tile the text, and encoding the two sides of
 * bpe_split_point's cut gives the same ids as encoding the whole.
 */
#include "llm3d/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>

static Bpe fuzz_bpe;  // libFuzzer calls us with no context, so the loaded encoder lives here

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *dir = getenv("LLM3D_DATA");
    if (dir == NULL || dir[0] == '\0') dir = "../shared/data";
    char encoder[1024], vocab[1024], err[1024];
    snprintf(encoder, sizeof(encoder), "%s/gpt2/encoder.json", dir);
    snprintf(vocab, sizeof(vocab), "%s/gpt2/vocab.bpe", dir);
    if (bpe_load(&fuzz_bpe, encoder, vocab, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_bpe: needs GPT-2's encoder.json and vocab.bpe (set LLM3D_DATA): %s\n", err);
        exit(1);
    }
    return 0;
}

static void fuzz_fail(const char *what) {
    fprintf(stderr, "fuzz_bpe: %s\n", what);
    abort();
}

static void fuzz_check_decode(const int *ids, size_t n, const unsigned char *text, size_t len) {
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        int tlen;
        const unsigned char *t = bpe_token_bytes(&fuzz_bpe, ids[i], &tlen);
        if (t == NULL) fuzz_fail("id out of range");
        if (pos + (size_t)tlen > len || memcmp(text + pos, t, (size_t)tlen) != 0) fuzz_fail("decode(encode(x)) != x");
        pos += (size_t)tlen;
    }
    if (pos != len) fuzz_fail("decode(encode(x)) is shorter than x");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int allow_special = data[0] & 1;
    const unsigned char *text = data + 1;
    size_t len = size - 1;

    for (size_t i = 0; i < len;) {
        size_t end = bpe_pretoken_end(text, len, i);
        if (end <= i || end > len) fuzz_fail("a pre-token does not advance or runs past the text");
        i = end;
    }

    int *ids;
    size_t n;
    if (bpe_encode(&fuzz_bpe, (const char *)text, len, allow_special, &ids, &n) != 0) fuzz_fail("bpe_encode failed");
    fuzz_check_decode(ids, n, text, len);

    size_t cut = bpe_split_point((const char *)text, len);
    if (cut > 0) {
        int *left, *right;
        size_t n_left, n_right;
        if (bpe_encode(&fuzz_bpe, (const char *)text, cut, allow_special, &left, &n_left) != 0 ||
            bpe_encode(&fuzz_bpe, (const char *)text + cut, len - cut, allow_special, &right, &n_right) != 0)
            fuzz_fail("bpe_encode failed");
        if (n_left + n_right != n || memcmp(left, ids, n_left * sizeof(int)) != 0 ||
            memcmp(right, ids + n_left, n_right * sizeof(int)) != 0)
            fuzz_fail("encoding the two sides of bpe_split_point differs from encoding the whole");
        free(left);
        free(right);
    }
    free(ids);
    return 0;
}
