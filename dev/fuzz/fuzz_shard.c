/*
 * fuzz_shard.c: libFuzzer target for the shard header and token checks of
 * dataloader.h, first on memory and then through the whole file path
 * (open, mmap, validate, read a few micro-batches).
 *
 *   make dev/fuzz/fuzz_shard
 *   ./dev/fuzz/fuzz_shard -max_total_time=20 dev/fuzz/corpus/shard   # fuzz
 *   ./dev/fuzz/fuzz_shard -runs=0 dev/fuzz/corpus/shard              # replay the corpus
 *
 * The input is a shard file. The vocab size and micro-batch shape come from
 * the header's free ints ([3] and [4]), so the fuzzer can steer them too.
 */
#include "dataloader.h"

#include <assert.h>

static uint32_t fuzz_u32_at(const uint8_t *data, size_t size, size_t offset) {
    if (size < offset + 4) return 0;
    return (uint32_t)shard_read_i32(data + offset);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024];
    uint64_t ntok = 0;
    int vocab_size = 1 + (int)(fuzz_u32_at(data, size, 12) % 70000);
    int B = 1 + (int)(fuzz_u32_at(data, size, 16) % 4);
    int T = 1 + (int)((fuzz_u32_at(data, size, 16) >> 8) % 16);

    // on memory
    int header_ok = shard_parse_header(data, size, "fuzz", &ntok, err, sizeof(err)) == 0;
    if (header_ok) {
        assert((uint64_t)size == SHARD_HEADER_BYTES + 2 * ntok);
        // the token array of a real shard is page-aligned; the fuzzer's buffer may not be
        uint16_t *tokens = (uint16_t *)malloc(ntok * sizeof(uint16_t) + 1);
        if (tokens == NULL) return 0;
        memcpy(tokens, data + SHARD_HEADER_BYTES, ntok * sizeof(uint16_t));
        int tokens_ok = shard_check_tokens(tokens, ntok, vocab_size, "fuzz", err, sizeof(err)) == 0;
        for (uint64_t i = 0; tokens_ok && i < ntok; i++) assert((int)tokens[i] < vocab_size);
        free(tokens);
    }

    // through a file
    char path[64];
    snprintf(path, sizeof(path), "/tmp/llm3d_fuzz_shard_%d.bin", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (f == NULL) return 0;
    if (size > 0) fwrite(data, 1, size, f);
    fclose(f);
    DataLoader dl;
    if (dataloader_init(&dl, path, B, T, 0, 1, (int)(size & 1), size, vocab_size, err, sizeof(err)) == 0) {
        assert(header_ok);
        int in[64], tg[64];
        for (int k = 0; k < 5; k++) {
            assert(dataloader_next(&dl, in, tg) == 0);
            for (int i = 0; i < B * T; i++) assert(in[i] < vocab_size && tg[i] < vocab_size);
        }
        DataLoaderState st;
        dataloader_get_state(&dl, &st);
        assert(dataloader_set_state(&dl, &st, err, sizeof(err)) == 0);
        dataloader_free(&dl);
    }
    unlink(path);
    return 0;
}
