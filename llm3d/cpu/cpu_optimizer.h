/*
 * cpu_optimizer.h: the CPU trainer's loops over the flat arrays of the
 * parameters and gradients: clearing them, AdamW, and the sum of squares of
 * the global norm. Each is one pass over memory, shared among the threads.
 *
 * defines: zero_floats, adamw_update, sum_squares.
 */
#ifndef LLM3D_CPU_OPTIMIZER_H
#define LLM3D_CPU_OPTIMIZER_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// x[0..n) = 0 on all threads: a single thread's memset does not reach the
// memory bandwidth that clearing the gradients needs
static void zero_floats(float *x, size_t n) {
    size_t chunk = 1 << 16, nchunks = (n + chunk - 1) / chunk;
    #pragma omp parallel for schedule(dynamic) if (nchunks > 1)
    for (size_t c = 0; c < nchunks; c++) memset(x + c * chunk, 0, (n - c * chunk < chunk ? n - c * chunk : chunk) * sizeof(float));
}

// AdamW in PyTorch's order of operations (decoupled decay first, then the
// bias-corrected step), so the trainer follows torch.optim.AdamW closely.
// The gradient is multiplied by grad_scale as it is read (the clipping of the
// global norm: 1 when there is none), which saves a pass over the gradients.
// One pass over params, grads, m and v: memory-bound, vectorised by the
// compiler. Chunks of 64K floats, 256 KiB of each array, so that each
// thread's four streams run long enough for the hardware prefetcher, and
// no lines asked for ahead in software: with the arrays aligned, 124M
// parameters took 53.4 ms this way against 64.7 ms in 16K chunks asked
// for 4 KiB ahead (doc/cpu.md has the earlier figures).
static void adamw_update(float *params, const float *grads, float *m, float *v, size_t n, float grad_scale,
                         float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    float bc1 = 1.0f - powf(beta1, (float)t), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)t));
    float step_size = lr / bc1;
    size_t chunk = 65536, nchunks = (n + chunk - 1) / chunk;
    #pragma omp parallel for schedule(dynamic) if (nchunks > 1)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = c * chunk, hi = n - lo < chunk ? n : lo + chunk;
        for (size_t i = lo; i < hi; i++) {
            float g = grads[i] * grad_scale;
            m[i] = beta1 * m[i] + (1.0f - beta1) * g;
            v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
            params[i] *= 1.0f - lr * weight_decay;
            params[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        }
    }
}

// sum of x[i]^2 in double, in blocks of a fixed size, each summed over 8
// lanes and the lanes and blocks added in order: the same sum whatever the
// number of threads. The lanes are one vector of 8 doubles (GCC's and
// Clang's vector extension: from the plain loop GCC 12 makes scalar code).
// Each lane's sum is a chain of dependent multiply-adds, one per 8 floats,
// slower than memory: a task sums two blocks side by side, so that two
// chains are in flight, without changing either. The two streams are asked
// for ahead: the hardware prefetcher alone left the pass at about half the
// bandwidth AdamW reaches (with the arrays aligned, on Zen 4, they made no
// difference).
#define SUMSQ_BLOCK 8192
#define SUMSQ_AHEAD 1024  // floats
typedef double sumsq_lanes __attribute__((vector_size(8 * sizeof(double))));
typedef float sumsq_floats __attribute__((vector_size(8 * sizeof(float))));

// lanes += the squares of x[0..8), in double (pointers, not vectors by
// value: a build without AVX-512 would pass them in a different way)
static inline void sumsq_add(sumsq_lanes *lanes, const float *x) {
    sumsq_floats f;
    memcpy(&f, x, sizeof(f));
    sumsq_lanes d = __builtin_convertvector(f, sumsq_lanes);
    *lanes += d * d;
}

static inline double sumsq_total(const sumsq_lanes *lanes) {
    double s = 0.0;
    for (int l = 0; l < 8; l++) s += (*lanes)[l];
    return s;
}

// one block of len <= SUMSQ_BLOCK floats; the tail past the last 8 goes to lane 0
static double sum_squares_block(const float *xb, size_t len) {
    sumsq_lanes lanes = {0};
    size_t i = 0;
    for (; i + 8 <= len; i += 8) sumsq_add(&lanes, xb + i);
    for (; i < len; i++) lanes[0] += (double)xb[i] * xb[i];
    return sumsq_total(&lanes);
}

static double sum_squares(const float *x, size_t n) {
    size_t nblocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK, npairs = n / SUMSQ_BLOCK / 2;
    double *block_sums = (double *)malloc(nblocks * sizeof(double));
    if (block_sums == NULL) {
        fprintf(stderr, "train_gpt2: out of memory for %zu block sums of the grad norm\n", nblocks);
        exit(1);
    }
    #pragma omp parallel for schedule(dynamic, 4) if (npairs > 1)
    for (size_t pair = 0; pair < npairs; pair++) {  // two whole blocks, as sum_squares_block does each
        const float *x0 = x + 2 * pair * SUMSQ_BLOCK, *x1 = x0 + SUMSQ_BLOCK;
        sumsq_lanes lanes0 = {0}, lanes1 = {0};
        for (size_t i = 0; i < SUMSQ_BLOCK; i += 16) {
            // a cache line of each stream 4 KiB ahead; near the blocks' end,
            // into the next pair's two blocks (this thread's next, most
            // often); never past x
            size_t at = i + SUMSQ_AHEAD, ahead0 = 2 * pair * SUMSQ_BLOCK + at + (at < SUMSQ_BLOCK ? 0 : SUMSQ_BLOCK);
            size_t ahead1 = ahead0 + SUMSQ_BLOCK;
            if (ahead0 < n) __builtin_prefetch(x + ahead0);
            if (ahead1 < n) __builtin_prefetch(x + ahead1);
            sumsq_add(&lanes0, x0 + i);
            sumsq_add(&lanes1, x1 + i);
            sumsq_add(&lanes0, x0 + i + 8);
            sumsq_add(&lanes1, x1 + i + 8);
        }
        block_sums[2 * pair] = sumsq_total(&lanes0);
        block_sums[2 * pair + 1] = sumsq_total(&lanes1);
    }
    for (size_t blk = 2 * npairs; blk < nblocks; blk++) {  // the one or two blocks left, the last maybe short
        size_t len = n - blk * SUMSQ_BLOCK < SUMSQ_BLOCK ? n - blk * SUMSQ_BLOCK : SUMSQ_BLOCK;
        block_sums[blk] = sum_squares_block(x + blk * SUMSQ_BLOCK, len);
    }
    double sum = 0.0;
    for (size_t blk = 0; blk < nblocks; blk++) sum += block_sums[blk];
    free(block_sums);
    return sum;
}

#endif
