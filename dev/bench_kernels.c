/*
 * bench_kernels.c: the CPU trainer's memory-bound kernels against what the
 * machine can do, measured in the same run (dev/bench.h): AdamW and the grad
 * norm's sum of squares in GB/s against the memory bandwidth, GELU and the
 * cross-entropy's exp in elements per ns, attention and LayerNorm in ms at
 * one d12 layer's shapes. With the argument "peak" it prints
 * only the FMA peak and the memory bandwidth (for dev/bench_cpu.sh).
 *
 *   make dev/bench_kernels && ./dev/bench_kernels [peak]
 *
 * Best of 5 runs each, wall-clock, all of OpenMP's threads.
 */
#define TESTING
#include "train_gpt2.c"
#include "dev/bench.h"

#define RUNS 5

// allocated as the trainer allocates its large arrays (xcalloc_mapped:
// aligned, on huge pages where they are granted), since misaligned vectors
// alone made AdamW take 1.7 times as long on Zen 4
static float *filled(size_t n, float scale) {
    float *x = (float *)xcalloc_mapped(n, sizeof(float), "a benchmark's array");
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)((long)((i * 2654435761u) % 2001) - 1000) / 1000.0f;
    return x;
}

int main(int argc, char **argv) {
    double peak = bench_fma_peak(5), memory = bench_memory_bandwidth(3);
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    if (argc > 1 && strcmp(argv[1], "peak") == 0) {
        printf("fma peak %.1f GFLOP/s, memory %.1f GB/s, %d threads\n", peak, memory, nthreads);
        return 0;
    }
    printf("%d threads; FMA peak %.1f GFLOP/s, memory bandwidth %.1f GB/s (y += x: read + written)\n", nthreads, peak,
           memory);

    // AdamW over 32M parameters (GPT-2 124M has 124M): reads params, grads,
    // m and v, writes params, m and v
    size_t n = (size_t)32 << 20;
    float *p = filled(n, 0.1f), *g = filled(n, 0.01f), *m = filled(n, 0.001f), *v = filled(n, 0.0f);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) v[i] = m[i] * m[i];
    double best = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        adamw_update(p, g, m, v, n, 0.5f, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1);
        double t = bench_now() - t0;
        if (t < best) best = t;
    }
    double gbs = 7.0 * n * sizeof(float) / best * 1e-9;
    printf("adamw        %6.1f ms for %zuM params: %6.1f GB/s, %5.1f%% of memory\n", best * 1e3, n >> 20, gbs,
           100.0 * gbs / memory);
    best = 1e30;
    double sink = 0.0;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        sink += sum_squares(g, n);
        double t = bench_now() - t0;
        if (t < best) best = t;
    }
    gbs = (double)n * sizeof(float) / best * 1e-9;
    printf("sum_squares  %6.1f ms for %zuM floats: %6.1f GB/s, %5.1f%% of memory (sum %.3e)\n", best * 1e3, n >> 20,
           gbs, 100.0 * gbs / memory, sink / RUNS);
    free(p); free(g); free(m); free(v);

    // GELU over the d12 fc activations of B=4, T=64 (256 x 3072), and the
    // softmax exp over the logits (256 x 50304)
    size_t ng = 256 * 3072;
    float *x = filled(ng, 4.0f), *y = filled(ng, 1.0f), *dy = filled(ng, 1.0f);
    double bf = 1e30, bb = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        gelu_forward(y, x, ng);
        double t1 = bench_now();
        gelu_backward(dy, x, y, ng);
        double t2 = bench_now();
        if (t1 - t0 < bf) bf = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    printf("gelu         forward %.3f ms, backward %.3f ms for 256 x 3072: %.2f and %.2f elements/ns\n", bf * 1e3,
           bb * 1e3, ng / bf * 1e-9, ng / bb * 1e-9);
    free(x); free(y); free(dy);
    int N = 256, V = 50304;
    float *logits = filled((size_t)N * V, 10.0f), *probs = filled((size_t)N * V, 0.0f);
    float maxes[256], sums[256], losses[256];
    int targets[256];
    for (int i = 0; i < N; i++) targets[i] = (i * 7919) % 50257;
    // one rank's forward (rowmax and exp fused row by row) into a buffer of
    // its own (a step writes over the logits, which here must stay for the
    // next round), and the backward in place over the probabilities
    double bs = 1e30, bbw = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        crossentropy_softmax(maxes, probs, sums, logits, N, V, 50257);
        crossentropy_finish(losses, probs, sums, targets, 0, N, V, 50257);
        double t1 = bench_now();
        crossentropy_backward(probs, probs, sums, targets, 1.0f / N, 0, N, V, 50257);
        double t2 = bench_now();
        if (t1 - t0 < bs) bs = t1 - t0;
        if (t2 - t1 < bbw) bbw = t2 - t1;
    }
    printf("cross-entropy forward %.3f ms, backward %.3f ms for 256 x 50257: %.2f and %.2f elements/ns\n", bs * 1e3,
           bbw * 1e3, (double)N * 50257 / bs * 1e-9, (double)N * 50257 / bbw * 1e-9);
    free(logits); free(probs);

    // attention and LayerNorm at one d12 layer's shapes (B=4, T=64, C=768, NH=12)
    int B = 4, T = 64, C = 768, NH = 12;
    size_t btc = (size_t)B * T * C;
    float *qkv = filled(3 * btc, 1.0f), *att = filled((size_t)B * NH * T * T, 0.0f), *atty = filled(btc, 0.0f);
    float *datty = filled(btc, 1.0f), *dqkv = filled(3 * btc, 0.0f);
    bf = bb = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        attention_forward(atty, att, qkv, B, T, C, NH);
        double t1 = bench_now();
        attention_backward(dqkv, datty, qkv, att, B, T, C, NH);
        double t2 = bench_now();
        if (t1 - t0 < bf) bf = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    printf("attention    forward %.3f ms, backward %.3f ms for B=%d T=%d C=%d NH=%d\n", bf * 1e3, bb * 1e3, B, T, C, NH);
    float *ln = filled(btc, 0.0f), *dln = filled(btc, 0.0f), *w = filled(C, 1.0f), *bias = filled(C, 0.1f);
    float *dw = filled(C, 0.0f), *db = filled(C, 0.0f), mean[256], rstd[256];
    bf = bb = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = bench_now();
        layernorm_forward(ln, mean, rstd, atty, w, bias, B * T, C);
        double t1 = bench_now();
        layernorm_backward(dln, dw, db, datty, atty, w, mean, rstd, B * T, C, 0);
        double t2 = bench_now();
        if (t1 - t0 < bf) bf = t1 - t0;
        if (t2 - t1 < bb) bb = t2 - t1;
    }
    printf("layernorm    forward %.3f ms, backward %.3f ms for %d x %d\n", bf * 1e3, bb * 1e3, B * T, C);
    free(qkv); free(att); free(atty); free(datty); free(dqkv); free(ln); free(dln); free(w); free(bias); free(dw); free(db);
    return 0;
}
