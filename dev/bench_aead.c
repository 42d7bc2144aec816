/*
 * bench_aead.c: aead.h's AES-256-GCM throughput, and what encryption adds
 * to writing a checkpoint.
 *
 *   make dev/bench_aead && ./dev/bench_aead [checkpoint dir]
 *
 * First GB/s (10^9 bytes per second of plaintext, the best of 3 runs) for
 * each path (portable, AES-NI on 128-bit registers, VAES on 512-bit ones,
 * as far as the CPU has them) on 1 and 2 OpenMP threads: sealing 1 MiB
 * chunks as sealed files do, and, on one thread, the two halves apart: the
 * CTR keystream (AES) and GHASH (the tag's hash).
 *
 * Then a checkpoint the size of GPT-2 124M's (d12: model.bin and AdamW's m
 * and v in optim.bin, 1.5 GB, as checkpoint.h writes it, fsync included)
 * written by one rank into the directory given (default $TMPDIR or /tmp):
 * plain, then sealed (-enc 1), in turn, the best of 5 each in wall time and
 * in the process's CPU time (on a shared machine the disk's share of the
 * wall time swings by seconds), and the differences in percent. Both
 * writes read each file back once for the MANIFEST's SHA-256; the sealed
 * write encrypts every byte at its place as the trainer does, and makes the
 * chunk tags in that same read. OpenMP's waiting threads spin and count as
 * CPU time, more so on a busy machine: OMP_WAIT_POLICY=passive measures
 * the work alone.
 */
#include "llm3d/checkpoint.h"
#include "dev/bench.h"

#include <stdio.h>

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile uint8_t bench_sink;  // keeps the tags from being optimized away

static double best_rate(int kind, const AeadKey *k, uint8_t *buf, size_t n) {
    const size_t chunk = 1u << 20;
    uint8_t iv[12] = {1, 2, 3};
    double best = 0;
    for (int run = 0; run < 3; run++) {
        double t0 = bench_now();
        if (kind == 0) {
#pragma omp parallel for schedule(static)
            for (long c = 0; c < (long)(n / chunk); c++) {
                uint8_t tag[16], nonce[12];
                memcpy(nonce, iv, 12);
                put_u32(nonce + 8, (uint32_t)c);
                aead_seal(k, nonce, 12, NULL, 0, buf + c * chunk, buf + c * chunk, chunk, tag);
                bench_sink ^= tag[0];
            }
        } else if (kind == 1) {
            aead_ctr(k, iv, 12, 0, buf, buf, n);
        } else {
            uint8_t tag[16];
            for (size_t c = 0; c < n / chunk; c++) {
                aead_tag(k, iv, 12, NULL, 0, buf + c * chunk, chunk, tag);
                bench_sink ^= tag[0];
            }
        }
        double rate = (double)n / (bench_now() - t0) / 1e9;
        if (rate > best) best = rate;
    }
    return best;
}

static void throughput(void) {
    uint8_t key[32] = {7};
    AeadKey k;
    aead_init(&k, key);
    size_t n = 256u << 20;
    uint8_t *buf = (uint8_t *)malloc(n);
    memset(buf, 1, n);
    printf("%-10s %14s %14s %12s %12s\n", "path", "seal 1 thread", "seal 2 threads", "AES (CTR)", "GHASH");
    for (int p = 0; p < 3; p++) {
        if ((p == 1 && !aead_has_aesni()) || (p == 2 && !aead_has_vaes())) {
            printf("%-10s (this CPU does not have it)\n", p == 1 ? "aes-ni" : "vaes-512");
            continue;
        }
        aead_force_portable(p == 0);
        aead_force_narrow(p == 1);
        size_t bytes = p == 0 ? (16u << 20) : n;  // the portable path is slow: a smaller buffer
        double rate[4];
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        rate[0] = best_rate(0, &k, buf, bytes);
#ifdef _OPENMP
        omp_set_num_threads(2);
#endif
        rate[1] = best_rate(0, &k, buf, bytes);
        rate[2] = best_rate(1, &k, buf, bytes);
        rate[3] = best_rate(2, &k, buf, bytes);
        printf("%-10s %9.2f GB/s %9.2f GB/s %7.2f GB/s %7.2f GB/s\n", aead_impl_name(), rate[0], rate[1], rate[2], rate[3]);
    }
    aead_force_narrow(0);
    aead_force_portable(0);
    free(buf);
    aead_wipe(&k);
}

// ----------------------------------------------------------------------------
// a d12 checkpoint by one rank, through checkpoint.h's ckpt_write_job

typedef struct { const float *params, *m, *v; size_t N; } BenchModel;

static float bench_sum(void *ctx, float x) {
    (void)ctx;
    return x;
}

// one rank: no waits to lengthen
// one process, no waits: the timeout is only kept, to hand back as CkptJob asks
static double bench_set_timeout(void *ctx, double seconds) {
    static double timeout;
    (void)ctx;
    double old = timeout;
    timeout = seconds;
    return old;
}

// the whole model and state in three writes, as one rank owning everything
static int bench_part(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher) {
    const BenchModel *b = (const BenchModel *)ctx;
    CkptOut model, optim;
    size_t header = HEADER_INTS * 4, bytes = b->N * sizeof(float);
    int e = ckpt_out_open_at(&model, dfd, model_name, cipher);
    int e2 = ckpt_out_open_at(&optim, dfd, optim_name, cipher);
    if (e == 0) e = e2;
    if (e == 0 && (ckpt_out_pwrite(&model, b->params, bytes, header) != 0 ||
                   ckpt_out_pwrite(&optim, b->m, bytes, header) != 0 ||
                   ckpt_out_pwrite(&optim, b->v, bytes, header + bytes) != 0))
        e = errno;
    e2 = ckpt_out_close(&model, e == 0);
    if (e == 0) e = e2;
    e2 = ckpt_out_close(&optim, e == 0);
    if (e == 0) e = e2;
    return e;
}

static void checkpoint_overhead(const char *base) {
    GPT2Config c = {1024, 50257, 50304, 12, 12, 768};
    size_t N = param_count(&c);
    float *all = (float *)malloc(3 * N * sizeof(float));
    if (all == NULL) {
        printf("checkpoint: no memory for 3 x %zu floats\n", N);
        return;
    }
    for (size_t i = 0; i < 3 * N; i++) all[i] = (float)(i % 1000) * 1e-3f;
    BenchModel b = {all, all + N, all + 2 * N, N};
    char out_dir[1024];
    snprintf(out_dir, sizeof(out_dir), "%s/llm3d_bench_aead_XXXXXX", base);
    if (mkdtemp(out_dir) == NULL) {
        printf("checkpoint: cannot make a directory in %s\n", base);
        free(all);
        return;
    }
    uint8_t key[32] = {9};
    CkptState st;
    memset(&st, 0, sizeof(st));
    st.config = c;
    st.B = 4; st.T = 1024; st.np = 1; st.tp = 1; st.pp = 1;
#ifdef _OPENMP
    omp_set_num_threads(2);  // the trainer's threads on this 2-core machine's one rank
#endif
    // wall time, and the process's CPU time (its threads and the kernel's
    // work for it: copying into the page cache, fsync's submission), which
    // other work on a shared machine disturbs less; best of RUNS each
    enum { RUNS = 5 };
    int out_fd = ckpt_dir_open(out_dir, NULL, 0);
    double best[2] = {1e30, 1e30}, best_cpu[2] = {1e30, 1e30};
    for (int run = 0; run < RUNS; run++)
        for (int enc = 0; enc < 2; enc++) {
            CkptJob job = {bench_sum, bench_part, bench_set_timeout, &b, 0, enc};
            st.step = 1 + run * 2 + enc;
            double t0 = bench_now(), c0 = cpu_seconds();
            if (out_fd < 0 || ckpt_write_job(&job, out_fd, out_dir, 1, &st, key) != 0) {
                printf("checkpoint: write failed\n");
                if (out_fd >= 0) close(out_fd);
                free(all);
                return;
            }
            double ms = 1e3 * (bench_now() - t0), cpu_ms = 1e3 * (cpu_seconds() - c0);
            if (ms < best[enc]) best[enc] = ms;
            if (cpu_ms < best_cpu[enc]) best_cpu[enc] = cpu_ms;
        }
    printf("d12 checkpoint (%zu parameters, %.2f GB, one rank, 2 threads, %s, SHA-256 %s): best of %d\n", N,
           12.0 * (double)N / 1e9, aead_impl_name(), sha256_impl_name(), RUNS);
    printf("  %-8s %10s %10s\n  %-8s %7.0f ms %7.0f ms\n  %-8s %7.0f ms %7.0f ms\n", "", "wall", "CPU", "plain",
           best[0], best_cpu[0], "-enc 1", best[1], best_cpu[1]);
    printf("  encryption adds %.1f%% (wall), %.1f%% (CPU)\n", 100.0 * (best[1] - best[0]) / best[0],
           100.0 * (best_cpu[1] - best_cpu[0]) / best_cpu[0]);
    char name[64];
    for (int s = 1; s <= 2 * RUNS; s++) {
        ckpt_entry_name(name, s, "");
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", out_dir, name);
        ckpt_remove_dir(path);
    }
    close(out_fd);
    rmdir(out_dir);
    free(all);
}

int main(int argc, char **argv) {
    throughput();
    const char *base = argc > 1 ? argv[1] : getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
    checkpoint_overhead(base);
    return 0;
}
