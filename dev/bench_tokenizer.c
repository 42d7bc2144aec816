/*
 * bench_tokenizer.c: how fast tokenizer.h encodes, on one core.
 *
 *   make dev/bench_tokenizer && ./dev/bench_tokenizer [text.txt ...]
 *
 * Default input: tinyshakespeare.txt from $LLM3D_DATA or ../shared/data. For
 * each file it reports the token count and the encode speed in MB of text
 * per second of CPU time, both with a cold piece cache (a freshly loaded
 * Bpe, as prepare_data sees a file's first megabytes) and a warm one (the
 * same text again). Loading encoder.json + vocab.bpe is timed on its own and
 * is not part of either figure. Best of 5 runs.
 */
#define _POSIX_C_SOURCE 200809L  // clock_gettime

#include <time.h>

#include "llm3d/tokenizer.h"

#define RUNS 5

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *dir = getenv("LLM3D_DATA");
    if (dir == NULL || dir[0] == '\0') dir = "../shared/data";
    char encoder[1024], vocab[1024], default_text[1024];
    snprintf(encoder, sizeof(encoder), "%s/gpt2/encoder.json", dir);
    snprintf(vocab, sizeof(vocab), "%s/gpt2/vocab.bpe", dir);
    snprintf(default_text, sizeof(default_text), "%s/tinyshakespeare.txt", dir);
    char err[1024];
    Bpe bpe;
    double best_load = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = cpu_seconds();
        if (bpe_load(&bpe, encoder, vocab, err, sizeof(err)) != 0) { fprintf(stderr, "bench_tokenizer: %s\n", err); return 1; }
        double t = cpu_seconds() - t0;
        if (t < best_load) best_load = t;
        bpe_free(&bpe);
    }
    printf("load encoder.json + vocab.bpe: %.1f ms (best of %d)\n", best_load * 1e3, RUNS);
    int n_files = argc > 1 ? argc - 1 : 1;
    for (int k = 0; k < n_files; k++) {
        const char *path = argc > 1 ? argv[k + 1] : default_text;
        unsigned char *text;
        size_t len;
        if (tok_read_file(path, (size_t)1 << 30, &text, &len, err, sizeof(err)) != 0) { fprintf(stderr, "bench_tokenizer: %s\n", err); return 1; }
        double best_cold = 1e30, best_warm = 1e30;
        size_t n_tokens = 0;
        for (int r = 0; r < RUNS; r++) {
            if (bpe_load(&bpe, encoder, vocab, err, sizeof(err)) != 0) { fprintf(stderr, "bench_tokenizer: %s\n", err); return 1; }
            int *ids;
            double t0 = cpu_seconds();
            if (bpe_encode(&bpe, (const char *)text, len, 0, &ids, &n_tokens) != 0) { fprintf(stderr, "bench_tokenizer: out of memory\n"); return 1; }
            double t1 = cpu_seconds();
            free(ids);
            double t2 = cpu_seconds();
            if (bpe_encode(&bpe, (const char *)text, len, 0, &ids, &n_tokens) != 0) { fprintf(stderr, "bench_tokenizer: out of memory\n"); return 1; }
            double t3 = cpu_seconds();
            free(ids);
            if (t1 - t0 < best_cold) best_cold = t1 - t0;
            if (t3 - t2 < best_warm) best_warm = t3 - t2;
            bpe_free(&bpe);
        }
        printf("%s: %zu bytes, %zu tokens; encode %.1f MB/s cold cache, %.1f MB/s warm (one core, CPU time, best of %d)\n",
               path, len, n_tokens, len / 1e6 / best_cold, len / 1e6 / best_warm, RUNS);
        free(text);
    }
    return 0;
}
