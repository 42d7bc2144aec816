/*
 * bench_aead.c: aead.h's AES-256-GCM throughput, and what encryption adds
 * to writing a checkpoint.
 *
 *   make dev/bench_aead && ./dev/bench_aead [checkpoint dir]
 *
 * First GB/s (10^9 bytes per second of plaintext) on one thread, for each
 * path (portable, AES-NI on 128-bit registers, VAES on 256-bit and on
 * 512-bit ones, as far as the CPU has them), over 1 MiB chunks as sealed
 * files use: seal and open in one pass, as aead_seal and aead_open do (CTR
 * and GHASH stitched), and in two, as they did before (aead_ctr and
 * aead_tag apart, each a pass over the chunk); then the CTR keystream (AES)
 * and GHASH (the tag's hash) alone. The runs of all of them take turns,
 * ROUNDS times, and each figure is the median, by the thread's CPU time
 * (steadier on a busy machine: time the thread waits for a core is not
 * counted) and by the wall clock.
 *
 * Then a checkpoint the size of GPT-2 124M's (d12: model.bin and AdamW's m
 * and v in optim.bin, 1.5 GB, as checkpoint.h writes it, fsync included)
 * written by one rank into the directory given (default $TMPDIR or /tmp):
 * plain, then sealed (-enc 1), in turn, RUNS times; the medians in wall
 * time and in the process's CPU time (on a shared machine the disk's share
 * of the wall time swings by seconds), and the differences in percent.
 * Both writes read each file back once for the MANIFEST's SHA-256; the
 * sealed write encrypts every byte at its place as the trainer does, its
 * tags made from the GHASH shares of that same pass (checkpoint.h). OpenMP's
 * waiting threads spin and count as CPU time, more so on a busy machine:
 * OMP_WAIT_POLICY=passive measures the work alone.
 */
#include "llm3d/checkpoint.h"
#include "dev/bench.h"

#include <stdio.h>

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *x, int n) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (x[j] < x[i]) { double t = x[i]; x[i] = x[j]; x[j] = t; }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static volatile uint8_t bench_sink;  // keeps the tags from being optimized away

enum { SEAL_ONE, SEAL_TWO, OPEN_ONE, OPEN_TWO, CTR, GHASH, KINDS };
static const char *const kind_names[KINDS] = {"seal, 1 pass", "seal, 2 passes", "open, 1 pass", "open, 2 passes",
                                              "AES (CTR)", "GHASH"};

// one run of `kind` over buf's n bytes in chunks of 1 MiB, each chunk's
// nonce its index; tags[] holds each chunk's tag from the seals, which the
// opens check (a seal leaves buf sealed, an open leaves it plain again)
static void one_run(int kind, const AeadKey *k, uint8_t *buf, size_t n, uint8_t (*tags)[16]) {
    const size_t chunk = 1u << 20;
    for (size_t c = 0; c < n / chunk; c++) {
        uint8_t nonce[12] = {1, 2, 3}, want[16], *p = buf + c * chunk;
        put_u32(nonce + 8, (uint32_t)c);
        if (kind == SEAL_ONE) {
            aead_seal(k, nonce, 12, NULL, 0, p, p, chunk, tags[c]);
        } else if (kind == SEAL_TWO) {
            aead_ctr(k, nonce, 12, 0, p, p, chunk);
            aead_tag(k, nonce, 12, NULL, 0, p, chunk, tags[c]);
        } else if (kind == OPEN_ONE) {
            if (aead_open(k, nonce, 12, NULL, 0, p, p, chunk, tags[c]) != 0) bench_sink ^= 1;
        } else if (kind == OPEN_TWO) {
            aead_tag(k, nonce, 12, NULL, 0, p, chunk, want);
            if (!tag_equal(want, 16, tags[c], 16)) bench_sink ^= 1;
            aead_ctr(k, nonce, 12, 0, p, p, chunk);
        } else if (kind == CTR) {
            aead_ctr(k, nonce, 12, 0, p, p, chunk);
        } else {
            aead_tag(k, nonce, 12, NULL, 0, p, chunk, want);
            bench_sink ^= want[0];
        }
    }
}

static void throughput(void) {
    enum { ROUNDS = 7 };
    uint8_t key[32] = {7};
    AeadKey k;
    aead_init(&k, key);
    size_t n = 64u << 20;
    uint8_t *buf = (uint8_t *)malloc(n), (*tags)[16] = malloc((n >> 20) * 16);
    memset(buf, 1, n);
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    printf("AES-256-GCM, 1 thread, 1 MiB chunks: GB/s, median of %d interleaved runs, by CPU time / by wall time\n",
           ROUNDS);
    printf("%-10s", "path");
    for (int kind = 0; kind < KINDS; kind++) printf(" %15s", kind_names[kind]);
    printf("\n");
    for (int p = 0; p < 4; p++) {
        if ((p >= 1 && !aead_has_aesni()) || (p == 2 && !aead_has_vaes256()) || (p == 3 && !aead_has_vaes())) {
            printf("%-10s (this CPU does not have it)\n", p == 1 ? "aes-ni" : p == 2 ? "vaes-256" : "vaes-512");
            continue;
        }
        aead_force_portable(p == 0);
        aead_force_narrow(p == 1);
        aead_force_avx2(p == 2);
        size_t bytes = p == 0 ? (4u << 20) : n;  // the portable path is slow: a smaller buffer
        double cpu[KINDS][ROUNDS], wall[KINDS][ROUNDS];
        for (int r = 0; r < ROUNDS; r++)
            for (int kind = 0; kind < KINDS; kind++) {  // seal before open: the opens check the seals' tags
                double t0 = bench_now(), c0 = thread_seconds();
                one_run(kind, &k, buf, bytes, tags);
                cpu[kind][r] = (double)bytes / (thread_seconds() - c0) / 1e9;
                wall[kind][r] = (double)bytes / (bench_now() - t0) / 1e9;
            }
        printf("%-10s", aead_impl_name());
        for (int kind = 0; kind < KINDS; kind++) {
            char cell[32];
            snprintf(cell, sizeof(cell), "%.2f / %.2f", median(cpu[kind], ROUNDS), median(wall[kind], ROUNDS));
            printf(" %15s", cell);
        }
        printf("\n");
    }
    printf("(%s)\n", bench_sink & 1 ? "an open failed" : "every open's tag held");
    aead_force_avx2(0);
    aead_force_narrow(0);
    aead_force_portable(0);
    free(buf);
    free(tags);
    aead_wipe(&k);
}

// ----------------------------------------------------------------------------
// a d12 checkpoint by one rank, through checkpoint.h's ckpt_write_job

typedef struct { const float *params, *m, *v; size_t N; } BenchModel;

static float bench_sum(void *ctx, float x) {
    (void)ctx;
    return x;
}

// one rank: nothing to gather
static void bench_gather(void *ctx, const void *mine, void *all, size_t bytes) {
    (void)ctx; (void)mine; (void)all; (void)bytes;
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
static int bench_part(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                      CkptShare *shares) {
    const BenchModel *b = (const BenchModel *)ctx;
    CkptOut model, optim;
    size_t header = HEADER_INTS * 4, bytes = b->N * sizeof(float);
    int e = ckpt_out_open_at(&model, dfd, model_name, cipher, shares != NULL ? &shares[0] : NULL);
    int e2 = ckpt_out_open_at(&optim, dfd, optim_name, cipher, shares != NULL ? &shares[1] : NULL);
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
    // other work on a shared machine disturbs less; medians of RUNS each
    enum { RUNS = 5 };
    int out_fd = ckpt_dir_open(out_dir, NULL, 0);
    double wall[2][RUNS], cpu[2][RUNS];
    for (int run = 0; run < RUNS; run++)
        for (int enc = 0; enc < 2; enc++) {
            CkptJob job = {bench_sum, bench_part, bench_gather, bench_set_timeout, &b, 0, 1, enc};
            st.step = 1 + run * 2 + enc;
            double t0 = bench_now(), c0 = cpu_seconds();
            if (out_fd < 0 || ckpt_write_job(&job, out_fd, out_dir, 1, &st, key) != 0) {
                printf("checkpoint: write failed\n");
                if (out_fd >= 0) close(out_fd);
                free(all);
                return;
            }
            wall[enc][run] = 1e3 * (bench_now() - t0);
            cpu[enc][run] = 1e3 * (cpu_seconds() - c0);
        }
    double w0 = median(wall[0], RUNS), w1 = median(wall[1], RUNS), c0 = median(cpu[0], RUNS), c1 = median(cpu[1], RUNS);
    printf("d12 checkpoint (%zu parameters, %.2f GB, one rank, 2 threads, %s, SHA-256 %s): medians of %d\n", N,
           12.0 * (double)N / 1e9, aead_impl_name(), sha256_impl_name(), RUNS);
    printf("  %-8s %10s %10s\n  %-8s %7.0f ms %7.0f ms\n  %-8s %7.0f ms %7.0f ms\n", "", "wall", "CPU", "plain", w0, c0,
           "-enc 1", w1, c1);
    printf("  encryption adds %.1f%% (wall), %.1f%% (CPU)\n", 100.0 * (w1 - w0) / w0, 100.0 * (c1 - c0) / c0);
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
