/*
 * cpu_attention.h: the CPU trainer's causal self-attention, fp32, OpenMP,
 * forward beside backward, register-tiled.
 *
 * defines: attention_forward, attention_backward, and the pieces they share:
 * attention_product (the small matrix products, tiled in registers),
 * attention_transpose, attention_softmax, attention_scratch.
 *
 * As for the layers in cpu_layers.h, the backward accumulates (+=) into its
 * gradient outputs, and the loops hand out (b, h) tasks with
 * schedule(dynamic), no sum depending on which thread does which task.
 */
#ifndef LLM3D_CPU_ATTENTION_H
#define LLM3D_CPU_ATTENTION_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/cpu/cpu_math.h"  // vec_f, vec_load, vec_exp, VEC_LANES


// causal self-attention. qkv: (B,T,3C) holding q,k,v; out: (B,T,C);
// att: (B,NH,T,T) softmax weights, kept for the backward (row t uses 0..t).
// One (b, h) per task, worked through ATT_ROWS positions t at a time. Every
// product in it (scores, output, and the three gradients) is a small matrix
// product done by attention_product, each element summed in order.
#define ATT_ROWS 4
#ifdef VEC_MATH
#define ATT_WIDTH VEC_LANES
#else
#define ATT_WIDTH 1
#endif

// ATT_ROWS rows by ATT_VECS vectors of output at once: with AVX-512 that is
// 16 sums in registers, enough to keep both FMA units busy while each waits
// on its last multiply-add; AVX2's 16 registers hold 8 of them and the loads.
#if VEC_LANES == 16
#define ATT_VECS 4
#else
#define ATT_VECS 2
#endif

#ifdef VEC_MATH
// rows xrow[0..ATT_ROWS) (nr of them real, the rest repeat row 0) times y,
// nv vectors wide: out[r][v] += sum over k of xrow[r][k*xk] y[k][v]
static inline __attribute__((always_inline)) void attention_block(float *out, size_t ldo, const float *const *xrow,
                                                                  size_t xk, int nr, const float *y, size_t ldy, int K,
                                                                  int nv) {
    vec_f acc[ATT_ROWS][ATT_VECS];
    for (int r = 0; r < ATT_ROWS; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = vec_load(out + (size_t)(r < nr ? r : 0) * ldo + v * VEC_LANES);
    for (int k = 0; k < K; k++) {
        vec_f yk[ATT_VECS];
        for (int v = 0; v < nv; v++) yk[v] = vec_load(y + (size_t)k * ldy + v * VEC_LANES);
        for (int r = 0; r < ATT_ROWS; r++) {
            float xr = xrow[r][(size_t)k * xk];
            for (int v = 0; v < nv; v++) acc[r][v] += xr * yk[v];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < nv; v++) vec_store(out + (size_t)r * ldo + v * VEC_LANES, acc[r][v]);
}
#endif

// out[r*ldo + c] += sum_k x[r*xr + k*xk] y[k*ldy + c] for r < rows, c < ncols,
// each element its old value first, then k = 0, 1, ..., K-1 one multiply-add
// at a time. The vectors run along c, ATT_ROWS rows by ATT_VECS vectors at
// once, the rows sharing each load of y; when ncols is not a whole number of
// vectors, plain loops.
static void attention_product(float *out, size_t ldo, const float *x, size_t xr, size_t xk, int rows,
                              const float *y, size_t ldy, int ncols, int K) {
    for (int r0 = 0; r0 < rows; r0 += ATT_ROWS) {
        int nr = rows - r0 < ATT_ROWS ? rows - r0 : ATT_ROWS, c = 0;
#ifdef VEC_MATH
        const float *xrow[ATT_ROWS];
        for (int r = 0; r < ATT_ROWS; r++) xrow[r] = x + (size_t)(r0 + (r < nr ? r : 0)) * xr;  // spare rows: row r0 again
        float *o = out + (size_t)r0 * ldo;
        // the nv of each call a constant, so that the sums stay in registers
        for (; ncols % VEC_LANES == 0 && c < ncols; c += ATT_VECS * VEC_LANES) {
            int nv = (ncols - c) / VEC_LANES < ATT_VECS ? (ncols - c) / VEC_LANES : ATT_VECS;
            if (nv == ATT_VECS) attention_block(o + c, ldo, xrow, xk, nr, y + c, ldy, K, ATT_VECS);
            else if (nv == 1) attention_block(o + c, ldo, xrow, xk, nr, y + c, ldy, K, 1);
#if ATT_VECS == 4
            else if (nv == 2) attention_block(o + c, ldo, xrow, xk, nr, y + c, ldy, K, 2);
            else attention_block(o + c, ldo, xrow, xk, nr, y + c, ldy, K, 3);
#endif
        }
#endif
        for (; c < ncols; c++)
            for (int r = r0; r < r0 + nr; r++) {
                float sum = out[(size_t)r * ldo + c];
                for (int k = 0; k < K; k++) sum += x[(size_t)r * xr + (size_t)k * xk] * y[(size_t)k * ldy + c];
                out[(size_t)r * ldo + c] = sum;
            }
    }
}

// xt[i*Tp + t2] = x[t2*stride + i] for t2 < T, zero for T <= t2 < Tp: one
// head's keys or values transposed, so that their dot products with a query
// run along t2, rows padded to a whole vector
static void attention_transpose(float *xt, const float *x, int T, int Tp, int hs, int stride) {
    for (int i = 0; i < hs; i++)
        for (int t2 = 0; t2 < Tp; t2++) xt[(size_t)i * Tp + t2] = t2 < T ? x[(size_t)t2 * stride + i] : 0.0f;
}

// a[t2] = softmax over t2 <= t of scale * s[t2], zero for t < t2 < T. The
// exponentials are vectorised (cpu_math.h) over s, which is padded to a
// whole vector past t; the sum runs over lanes and is added up in a fixed
// order.
static void attention_softmax(float *a, float *s, int t, int T, float scale) {
    int n = t + 1, i = 0;
    float maxv = -INFINITY, sum = 0.0f;
    for (i = 0; i < n; i++) {
        s[i] *= scale;
        maxv = s[i] > maxv ? s[i] : maxv;
    }
    i = 0;
#ifdef VEC_MATH
    vec_f sums = vec_splat(0.0f);
    for (; i < n; i += VEC_LANES) {
        vec_i lane = {0};
        for (int l = 0; l < VEC_LANES; l++) lane[l] = i + l;
        vec_f e = vec_select(lane < n, vec_exp(vec_load(s + i) - maxv), vec_splat(0.0f));
        vec_store(s + i, e);
        sums += e;
    }
    sum = vec_sum(sums);
#endif
    for (; i < n; i++) {
        s[i] = expf(s[i] - maxv);
        sum += s[i];
    }
    float inv = 1.0f / sum;
    for (i = 0; i < n; i++) a[i] = s[i] * inv;
    for (; i < T; i++) a[i] = 0.0f;
}

// a task's scratch: one head's keys or values transposed (hs x Tp) and
// `rows` rows of scores, ATT_ROWS for the forward and all T for the
// backward (4.4 MB at T = 1024); one per thread, kept between calls, as the
// matmul's packed blocks are (a fresh one per task is fresh pages at T = 1024)
static float *attention_scratch(int hs, int Tp, int rows) {
    static __thread float *buf;
    static __thread size_t cap;
    size_t floats = (size_t)(hs + rows) * Tp;
    if (floats > cap) {
        free(buf);
        buf = (float *)malloc(floats * sizeof(float));
        if (buf == NULL) {
            fprintf(stderr, "train_gpt2: out of memory for %zu floats of attention scratch\n", floats);
            exit(1);
        }
        cap = floats;
    }
    return buf;
}

static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C, Tp = (T + ATT_WIDTH - 1) / ATT_WIDTH * ATT_WIDTH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;  // position 0's
            float *kt = attention_scratch(hs, Tp, ATT_ROWS), *scores = kt + (size_t)hs * Tp;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            attention_transpose(kt, k, T, Tp, hs, C3);
            for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                int rows = T - t0 < ATT_ROWS ? T - t0 : ATT_ROWS, n = t0 + rows;  // rows t0.. see positions < n
                int nvec = (n + ATT_WIDTH - 1) / ATT_WIDTH * ATT_WIDTH;
                memset(scores, 0, (size_t)ATT_ROWS * Tp * sizeof(float));
                attention_product(scores, Tp, q + (size_t)t0 * C3, C3, 1, rows, kt, Tp, nvec, hs);
                for (int r = 0; r < rows; r++) attention_softmax(a + (size_t)(t0 + r) * T, scores + (size_t)r * Tp, t0 + r, T, scale);
                // out[t] = sum over t2 of a[t][t2] v[t2] (a is zero past t)
                for (int r = 0; r < rows; r++) memset(o + (size_t)(t0 + r) * C, 0, (size_t)hs * sizeof(float));
                attention_product(o + (size_t)t0 * C, C, a + (size_t)t0 * T, T, 1, rows, v, C3, hs, n);
            }
        }
}

// The gradient of every score first, a T x T block per (b, h); then dv, dk
// and dq, one product per block of ATT_ROWS rows of each: dv[t2] and dk[t2]
// sum down column t2 of the weights and of the scores' gradient, dq[t] along
// row t of the latter. Each sum has the terms and the order it had when
// they were added block by block (t = 0, 1, ...): dv[t2] and dk[t2] start
// at the first row of t2's block, since every t < t2 has a zero weight.
static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C, Tp = (T + ATT_WIDTH - 1) / ATT_WIDTH * ATT_WIDTH;
    float scale = 1.0f / sqrtf((float)hs);
    // one (b, h) per task: dk and dv of a head gather from every t of that head
    #pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T, *d = dout + (size_t)b * T * C + h * hs;
            float *vt = attention_scratch(hs, Tp, T), *dpre = vt + (size_t)hs * Tp;
            attention_transpose(vt, v, T, Tp, hs, C3);
            for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                int rows = T - t0 < ATT_ROWS ? T - t0 : ATT_ROWS, n = t0 + rows;
                int nvec = (n + ATT_WIDTH - 1) / ATT_WIDTH * ATT_WIDTH;
                float *dp0 = dpre + (size_t)t0 * Tp;
                // through the weighted sum of values: datt[t][t2] = d[t] . v[t2]
                memset(dp0, 0, (size_t)rows * Tp * sizeof(float));
                attention_product(dp0, Tp, d + (size_t)t0 * C, C, 1, rows, vt, Tp, nvec, hs);
                // through the softmax: dpre = a (datt - sum over t2 of datt a), scaled; zero past t
                for (int r = 0; r < rows; r++) {
                    int t = t0 + r;
                    const float *at = a + (size_t)t * T;
                    float *dp = dp0 + (size_t)r * Tp, dot = 0.0f;
                    for (int t2 = 0; t2 <= t; t2++) dot += dp[t2] * at[t2];
                    for (int t2 = 0; t2 <= t; t2++) dp[t2] = at[t2] * (dp[t2] - dot) * scale;
                    for (int t2 = t + 1; t2 < n; t2++) dp[t2] = 0.0f;
                }
            }
            for (int t0 = 0; t0 < T; t0 += ATT_ROWS) {
                int rows = T - t0 < ATT_ROWS ? T - t0 : ATT_ROWS, n = t0 + rows;
                // dv[t2] += a[t][t2] d[t] and dk[t2] += dpre[t][t2] q[t], t2 in this block, t from t0 on
                attention_product(dv + (size_t)t0 * C3, C3, a + (size_t)t0 * T + t0, 1, T, rows, d + (size_t)t0 * C, C, hs,
                                  T - t0);
                attention_product(dk + (size_t)t0 * C3, C3, dpre + (size_t)t0 * Tp + t0, 1, Tp, rows, q + (size_t)t0 * C3, C3,
                                  hs, T - t0);
                // dq[t] += dpre[t][t2] k[t2], t in this block, t2 < n
                attention_product(dq + (size_t)t0 * C3, C3, dpre + (size_t)t0 * Tp, Tp, 1, rows, k, C3, hs, n);
            }
        }
}

#endif  // LLM3D_CPU_ATTENTION_H
