/*
 * bench_secure.c: SHA-256 and HMAC-SHA256 throughput on one core, for the
 * message sizes the trainer sends (64 B control, 4 KiB, 1 MiB activations,
 * 64 MiB gradients and checkpoint shards), portable and SHA-NI.
 *
 *   make dev/bench_secure && ./dev/bench_secure [seconds per run] [runs]
 *
 * Each cell repeats its message for about 0.2 s of the thread's CPU time (or
 * the given time), that many times (default 5), and prints the median and the
 * best run in GB/s (10^9 bytes per second): the machine is shared, so the
 * median says what to expect and the best what the code can do. Columns:
 *   sha256       sha256() of the message
 *   hmac         hmac_sha256(): the key's pads hashed again for every message
 *   frame tag    hmac_keyed() from a state made once, as frame_seal/open do
 * The last line measures the bound a single SHA-256 stream cannot beat on
 * this core: a block is 32 sha256rnds2 in a row, each needing the last one's
 * result, so a block takes at least 32 times that instruction's latency.
 * Compare with `openssl speed -evp sha256` run at the same time.
 */
#include "secure.h"

#include <time.h>

#define MAX_RUNS 21

// now_seconds: this thread's CPU time, so that time the scheduler gives to
// other processes on a shared machine does not count against the hashing
static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { KIND_SHA256, KIND_HMAC, KIND_FRAME_TAG };

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// measure: runs of about `seconds` each; median and best GB/s
static void measure(int kind, const uint8_t *msg, size_t n, double seconds, int runs, double *median, double *best) {
    static const uint8_t key[32] = {1, 2, 3};
    Hmac keyed;
    hmac_init(&keyed, key, 32);
    uint8_t out[32];
    volatile uint8_t sink = 0;  // keeps the hashing from being optimized away
    double rate[MAX_RUNS];
    for (int run = 0; run < runs; run++) {
        long reps = 0, batch = 1;
        double start = now_seconds(), elapsed = 0;
        do {
            for (long i = 0; i < batch; i++) {
                if (kind == KIND_SHA256) sha256(msg, n, out);
                else if (kind == KIND_HMAC) hmac_sha256(key, 32, msg, n, out);
                else hmac_keyed(&keyed, msg, n, out);
                sink ^= out[0];
            }
            reps += batch;
            double before = elapsed;
            elapsed = now_seconds() - start;
            // reading the CPU-time clock is a system call: read it about once a millisecond
            if (elapsed - before < 1e-3) batch *= 2;
        } while (elapsed < seconds);
        rate[run] = (double)reps * (double)n / elapsed / 1e9;
    }
    (void)sink;
    qsort(rate, (size_t)runs, sizeof(double), compare_doubles);
    *median = rate[runs / 2];
    *best = rate[runs - 1];
}

#if SECURE_HAVE_X86
// rnds2_chain: n pairs of dependent sha256rnds2, as in a block's rounds
__attribute__((target("sha,sse4.1"), noinline))
static uint32_t rnds2_chain(long n) {
    __m128i abef = _mm_set1_epi32(1), cdgh = _mm_set1_epi32(2), msg = _mm_set1_epi32(3);
    for (long i = 0; i < n; i++) {
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
        abef = _mm_sha256rnds2_epu32(abef, cdgh, msg);
    }
    return (uint32_t)_mm_cvtsi128_si32(_mm_add_epi32(abef, cdgh));
}

// rnds2_ns: the best of `runs` timings of one sha256rnds2 in a dependent chain, in ns
static double rnds2_ns(int runs) {
    const long pairs = 20 * 1000 * 1000;
    double best = 1e9;
    volatile uint32_t sink = 0;
    for (int run = 0; run < runs; run++) {
        double start = now_seconds();
        sink ^= rnds2_chain(pairs);
        double ns = (now_seconds() - start) * 1e9 / (2.0 * (double)pairs);
        if (ns < best) best = ns;
    }
    (void)sink;
    return best;
}
#endif

int main(int argc, char **argv) {
    double seconds = 0.2;
    int runs = 5;
    int bad = argc > 3;
    if (argc >= 2 && (sscanf(argv[1], "%lf", &seconds) != 1 || seconds <= 0 || seconds > 60)) bad = 1;
    if (argc >= 3 && (sscanf(argv[2], "%d", &runs) != 1 || runs < 1 || runs > MAX_RUNS)) bad = 1;
    if (bad) {
        fprintf(stderr, "usage: %s [seconds per run, above 0 and at most 60, default 0.2] [runs, 1..%d, default 5]\n", argv[0], MAX_RUNS);
        return 2;
    }
    size_t sizes[] = {64, 4096, 1 << 20, 64 << 20};
    const char *labels[] = {"64 B", "4 KiB", "1 MiB", "64 MiB"};
    uint8_t *msg = (uint8_t *)malloc(64 << 20);
    if (msg == NULL) {
        fprintf(stderr, "bench_secure: out of memory for a 64 MiB message\n");
        return 1;
    }
    for (size_t i = 0; i < (64u << 20); i++) msg[i] = (uint8_t)(i * 131 + 7);
    int has_shani = sha256_has_shani();
    printf("SHA-NI on this CPU: %s; one core; GB/s = 10^9 bytes/s; each cell: median / best of %d runs of %.2f s\n",
           has_shani ? "yes" : "no", runs, seconds);
    const char *kinds[] = {"sha256", "hmac", "frame tag"};
    printf("%-7s", "size");
    for (int impl = 0; impl < 2; impl++)
        for (int k = 0; k < 3; k++) printf(" %9s %-7s", kinds[k], impl == 0 ? "port." : "sha-ni");
    printf("\n");
    for (int s = 0; s < 4; s++) {
        printf("%-7s", labels[s]);
        for (int impl = 0; impl < 2; impl++) {
            sha256_force_portable(impl == 0);
            for (int k = 0; k < 3; k++) {
                if (impl == 1 && !has_shani) { printf(" %17s", "-"); continue; }
                double median, best;
                measure(k, msg, sizes[s], seconds, runs, &median, &best);
                printf("   %6.3f / %6.3f", median, best);
                fflush(stdout);
            }
        }
        printf("\n");
    }
    sha256_force_portable(0);
#if SECURE_HAVE_X86
    if (has_shani) {
        double ns = rnds2_ns(runs);
        printf("bound: one sha256rnds2 in a dependent chain takes %.3f ns; 32 per 64-byte block: at most %.3f GB/s "
               "for one SHA-256 stream on this core\n", ns, 64.0 / (32.0 * ns));
    }
#endif
    free(msg);
    return 0;
}
