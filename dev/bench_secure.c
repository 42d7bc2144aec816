/*
 * bench_secure.c: SHA-256 and HMAC-SHA256 throughput on one core, for the
 * message sizes the trainer sends (64 B control, 4 KiB, 1 MiB activations,
 * 64 MiB gradients and checkpoint shards), portable and SHA-NI.
 *
 *   gcc -O2 -Wall -Wextra -o bench_secure dev/bench_secure.c && ./bench_secure [seconds per cell]
 *
 * Each cell repeats its message until about 0.25 s (or the given time) has
 * passed and prints the best of 3 such runs, in GB/s (10^9 bytes per second).
 * HMAC is timed as frames are: a fresh hmac_init per message.
 */
#include "../secure.h"

#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// gb_per_s: best of 3 runs of about `seconds` each
static double gb_per_s(int hmac, const uint8_t *msg, size_t n, double seconds) {
    static const uint8_t key[32] = {1, 2, 3};
    uint8_t out[32];
    volatile uint8_t sink = 0;  // keeps the hashing from being optimized away
    double best = 0;
    for (int run = 0; run < 3; run++) {
        long reps = 0;
        double start = now_seconds(), elapsed = 0;
        do {
            for (int i = 0; i < 16; i++) {
                if (hmac) hmac_sha256(key, 32, msg, n, out);
                else sha256(msg, n, out);
                sink ^= out[0];
            }
            reps += 16;
            elapsed = now_seconds() - start;
        } while (elapsed < seconds);
        double rate = (double)reps * (double)n / elapsed / 1e9;
        if (rate > best) best = rate;
    }
    (void)sink;
    return best;
}

int main(int argc, char **argv) {
    double seconds = 0.25;
    if (argc > 2 || (argc == 2 && (sscanf(argv[1], "%lf", &seconds) != 1 || seconds <= 0 || seconds > 60))) {
        fprintf(stderr, "usage: %s [seconds per cell, 0..60, default 0.25]\n", argv[0]);
        return 2;
    }
    size_t sizes[] = {64, 4096, 1 << 20, 64 << 20};
    const char *labels[] = {"64 B", "4 KiB", "1 MiB", "64 MiB"};
    uint8_t *msg = malloc(64 << 20);
    if (msg == NULL) {
        fprintf(stderr, "bench_secure: out of memory for a 64 MiB message\n");
        return 1;
    }
    for (size_t i = 0; i < (64u << 20); i++) msg[i] = (uint8_t)(i * 131 + 7);
    int has_shani = sha256_has_shani();
    printf("SHA-NI on this CPU: %s; one core; GB/s = 10^9 bytes/s, best of 3 x %.2f s\n", has_shani ? "yes" : "no", seconds);
    printf("%-8s %14s %14s %14s %14s\n", "size", "sha256 port.", "sha256 sha-ni", "hmac port.", "hmac sha-ni");
    for (int s = 0; s < 4; s++) {
        double rate[4] = {0};
        for (int hmac = 0; hmac < 2; hmac++) {
            sha256_force_portable(1);
            rate[2 * hmac] = gb_per_s(hmac, msg, sizes[s], seconds);
            sha256_force_portable(0);
            if (has_shani) rate[2 * hmac + 1] = gb_per_s(hmac, msg, sizes[s], seconds);
        }
        char fast_sha[16] = "-", fast_hmac[16] = "-";
        if (has_shani) {
            snprintf(fast_sha, sizeof(fast_sha), "%.3f", rate[1]);
            snprintf(fast_hmac, sizeof(fast_hmac), "%.3f", rate[3]);
        }
        printf("%-8s %14.3f %14s %14.3f %14s\n", labels[s], rate[0], fast_sha, rate[2], fast_hmac);
        fflush(stdout);
    }
    free(msg);
    return 0;
}
