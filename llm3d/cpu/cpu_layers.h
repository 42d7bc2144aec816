/*
 * cpu_layers.h: the CPU trainer's layers other than attention, fp32, OpenMP,
 * each layer's forward beside its backward.
 *
 * defines: encoder_forward, encoder_add_positions, encoder_backward;
 * layernorm_forward, layernorm_backward; matmul_forward, matmul_backward
 * (the Linear layer, on cpu_matmul.h); gelu_forward, gelu_backward;
 * residual_forward, residual_backward; crossentropy_rowmax,
 * crossentropy_exp, crossentropy_softmax (the two at once), crossentropy_finish,
 * crossentropy_backward.
 * Attention is in cpu_attention.h; train_gpt2.c puts them together.
 */
#ifndef LLM3D_CPU_LAYERS_H
#define LLM3D_CPU_LAYERS_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "llm3d/cpu/cpu_math.h"    // vec_f, vec_exp, VEC_LANES
#include "llm3d/cpu/cpu_matmul.h"  // matmul_blocked, matmul_blocked_set

// layers, forward and backward side by side. Gradients are written where
// they have one source and added where they have more, so that as little
// as possible is cleared first (a pass over memory each):
// - the gradients of the activations: written by matmul_backward (dinp),
//   gelu_backward, residual_backward (a copy for the residual branch; the
//   other branch reads the incoming gradient in place) and
//   crossentropy_backward; added to by
//   layernorm_backward (a residual stream's gradient comes from the
//   residual and from the LayerNorm that reads it) and attention_backward
//   (dk and dv gather over the positions), whose outputs start cleared;
// - the gradients of the parameters: added to, so that gradient
//   accumulation is free, but written by matmul_backward and
//   layernorm_backward when `fresh` is 1, in a step's first backward, so
//   that the step need not clear them first (500 MB at d12).
// Writing x is adding x to zero, so the sums are the same bit for bit.
// Loops hand their iterations out to the threads in chunks as the threads
// come free (schedule(dynamic)): when another program takes one of the
// cores, the thread that lost it leaves its chunks to the others instead of
// holding everyone at the loop's end. No sum depends on which thread does
// which chunk.

// token embedding from this rank's rows [v0, v0 + Vl) of wte (all of them
// when there is no tensor parallelism): out[b,t,:] = wte[inp[b,t] - v0,:],
// zero for tokens another rank holds; the ranks' outputs are then summed
static void encoder_forward(float *out, const int *inp, const float *wte, int v0, int Vl, int B, int T, int C) {
    #pragma omp parallel for schedule(dynamic, 16)
    for (int bt = 0; bt < B * T; bt++) {
        int row = inp[bt] - v0;
        float *o = out + (size_t)bt * C;
        if (row < 0 || row >= Vl) { memset(o, 0, (size_t)C * sizeof(float)); continue; }
        const float *wte_row = wte + (size_t)row * C;
        for (int i = 0; i < C; i++) o[i] = wte_row[i];
    }
}

// + position embedding, once the token embeddings are complete: out holds
// N rows of the B*T, from row `first` (the row bt is position bt % T)
static void encoder_add_positions(float *out, const float *wpe, int first, int N, int T, int C) {
    #pragma omp parallel for schedule(dynamic, 16)
    for (int n = 0; n < N; n++) {
        const float *wpe_row = wpe + (size_t)((first + n) % T) * C;
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] += wpe_row[i];
    }
}

static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int v0, int Vl,
                             int B, int T, int C) {
    // serial over positions: two positions may share a token row of wte
    for (int bt = 0; bt < B * T; bt++) {
        const float *d = dout + (size_t)bt * C;
        float *dwpe_row = dwpe + (size_t)(bt % T) * C;
        for (int i = 0; i < C; i++) dwpe_row[i] += d[i];
        int row = inp[bt] - v0;
        if (row < 0 || row >= Vl) continue;
        float *dwte_row = dwte + (size_t)row * C;
        for (int i = 0; i < C; i++) dwte_row[i] += d[i];
    }
}

// LayerNorm over C with eps 1e-5; saves mean and 1/std for the backward.
// The sums over a row run in VEC_LANES lanes (cpu_math.h), then the lanes
// and the leftover elements in a fixed order.
#define LN_BLOCK 32  // rows per task of the backward, each task with its own partial sums

static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C) {
    #pragma omp parallel for schedule(dynamic, 16)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float m = 0.0f, var = 0.0f;
        int i = 0;
#ifdef VEC_MATH
        vec_f sums = vec_splat(0.0f);
        for (; i + VEC_LANES <= C; i += VEC_LANES) sums += vec_load(x + i);
        m = vec_sum(sums);
#endif
        for (; i < C; i++) m += x[i];
        m /= C;
        i = 0;
#ifdef VEC_MATH
        sums = vec_splat(0.0f);
        for (; i + VEC_LANES <= C; i += VEC_LANES) {
            vec_f dx = vec_load(x + i) - m;
            sums += dx * dx;
        }
        var = vec_sum(sums);
#endif
        for (; i < C; i++) var += (x[i] - m) * (x[i] - m);
        var /= C;
        float s = 1.0f / sqrtf(var + 1e-5f);
        for (i = 0; i < C; i++) o[i] = (x[i] - m) * s * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

// dx for one row, and the row's terms of dweight and dbias added to pw, pb
static void layernorm_backward_row(float *dx, float *pw, float *pb, const float *d, const float *x,
                                   const float *weight, float m, float s, int C) {
    // dnorm = d * weight; dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)).
    // dx NULL: the weights' sums alone; pw NULL: dx alone (a split backward's W and B)
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    int i = 0;
    if (dx != NULL) {
#ifdef VEC_MATH
        vec_f sum1 = vec_splat(0.0f), sum2 = vec_splat(0.0f);
        for (; i + VEC_LANES <= C; i += VEC_LANES) {
            vec_f norm = (vec_load(x + i) - m) * s, dnorm = vec_load(weight + i) * vec_load(d + i);
            sum1 += dnorm;
            sum2 += dnorm * norm;
        }
        dnorm_mean = vec_sum(sum1);
        dnorm_norm_mean = vec_sum(sum2);
#endif
        for (; i < C; i++) {
            float norm = (x[i] - m) * s, dnorm = weight[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
    }
    i = 0;
#ifdef VEC_MATH
    for (; i + VEC_LANES <= C; i += VEC_LANES) {
        vec_f di = vec_load(d + i), norm = (vec_load(x + i) - m) * s;
        if (pw != NULL) {
            vec_store(pb + i, vec_load(pb + i) + di);
            vec_store(pw + i, vec_load(pw + i) + norm * di);
        }
        if (dx != NULL)
            vec_store(dx + i, vec_load(dx + i) + (vec_load(weight + i) * di - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
#endif
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        if (pw != NULL) {
            pb[i] += d[i];
            pw[i] += norm * d[i];
        }
        if (dx != NULL) dx[i] += (weight[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

// dinp += the input's gradient, dweight and dbias += the weights' (fresh:
// =). A split backward (pipeline schedules with W ops) calls it twice: with
// dweight NULL for the input's gradient (B), then with dinp NULL for the
// weights' (W); each part computes what the whole call does, bit for bit.
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C, int fresh) {
    // dweight/dbias are sums over all N rows: each block of LN_BLOCK rows
    // sums its rows in order into partials of its own, then the blocks'
    // partials are added in block order: the same sums whatever the number
    // of threads
    int nblocks = (N + LN_BLOCK - 1) / LN_BLOCK;
    float *partial = NULL;
    if (dweight != NULL) {
        partial = (float *)calloc((size_t)nblocks * 2 * C, sizeof(float));
        if (partial == NULL) {
            fprintf(stderr, "train_gpt2: out of memory for %d x %d LayerNorm partial sums\n", nblocks, 2 * C);
            exit(1);
        }
    }
    #pragma omp parallel for schedule(dynamic)
    for (int blk = 0; blk < nblocks; blk++) {
        float *pw = partial != NULL ? partial + (size_t)blk * 2 * C : NULL, *pb = pw != NULL ? pw + C : NULL;
        int end = (blk + 1) * LN_BLOCK < N ? (blk + 1) * LN_BLOCK : N;
        for (int n = blk * LN_BLOCK; n < end; n++)
            layernorm_backward_row(dinp != NULL ? dinp + (size_t)n * C : NULL, pw, pb, dout + (size_t)n * C,
                                   inp + (size_t)n * C, weight, mean[n], rstd[n], C);
    }
    if (partial == NULL) return;
    for (int i = 0; i < C; i++) {
        float w = fresh ? 0.0f : dweight[i], b = fresh ? 0.0f : dbias[i];
        for (int blk = 0; blk < nblocks; blk++) {
            w += partial[(size_t)blk * 2 * C + i];
            b += partial[(size_t)blk * 2 * C + C + i];
        }
        dweight[i] = w;
        dbias[i] = b;
    }
    free(partial);
}

// The three matmuls of a Linear layer, out = inp W^T, dinp = dout W and
// dweight = dout^T inp, are each C[M,J] += A[M,K] B[K,J] with A and B read
// through strides: cpu_matmul.h's matmul_blocked does all three.

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] (weight as PyTorch's Linear)
static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC) {
    // out starts as the bias (zeros without); A = inp, B(i,o) = weight[o,i]
    matmul_blocked_set(out, OC, bias, inp, IC, 1, weight, 1, IC, N, OC, IC);
}

// dinp NULL: the weights' part alone (a split backward's W); dweight NULL:
// dinp alone (its B), with dbias left as it is
static void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC, int fresh) {
    // dinp[N,IC] = dout[N,OC] @ weight[OC,IC]
    if (dinp != NULL) matmul_blocked_set(dinp, IC, NULL, dout, OC, 1, weight, IC, 1, N, IC, OC);
    if (dweight == NULL) return;
    // dweight[OC,IC] += dout^T[OC,N] @ inp[N,IC] (fresh: =)
    if (fresh) matmul_blocked_set(dweight, IC, NULL, dout, 1, OC, inp, IC, 1, OC, IC, N);
    else matmul_blocked(dweight, IC, dout, 1, OC, inp, IC, 1, OC, IC, N);
    // dbias[o] += sum_n dout[n,o] (fresh: =), n in order; 64 columns per task so that
    // the rows of dout are read a cache line at a time
    if (dbias) {
        #pragma omp parallel for schedule(dynamic)
        for (int o0 = 0; o0 < OC; o0 += 64) {
            int oc = OC - o0 < 64 ? OC - o0 : 64;
            float db[64] = {0};
            for (int n = 0; n < N; n++)
                for (int o = 0; o < oc; o++) db[o] += dout[(size_t)n * OC + o0 + o];
            for (int o = 0; o < oc; o++) dbias[o0 + o] = (fresh ? 0.0f : dbias[o0 + o]) + db[o];
        }
    }
}

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
// computed as x s with s = (1 + tanh(u)) / 2 = 1 / (1 + exp(-2u)): one exp,
// vectorised (cpu_math.h), and no cancellation in 1 + tanh(u) where u < 0
#define GELU_SCALE 0.7978845608028654f  // sqrt(2/pi)
static inline float gelu_sigmoid(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

// d gelu / dx = s + x s' du/dx, with s' = 2 s (1 - s) the derivative of s in u
static inline float gelu_grad(float x, float s) {
    return s + 2.0f * x * s * (1.0f - s) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
}

#ifdef VEC_MATH
// 1 + exp(-2u) for a vector of x: 1 / it is s, x / it is GELU(x)
static inline vec_f gelu_denominator_vec(vec_f x) {
    vec_f u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f + vec_exp(-2.0f * u);
}
#endif

static void gelu_forward(float *out, const float *inp, size_t N) {
    size_t done = 0;
#ifdef VEC_MATH
    size_t nvec = N / VEC_LANES;
    #pragma omp parallel for schedule(dynamic, 1024)
    for (size_t k = 0; k < nvec; k++) {
        vec_f x = vec_load(inp + k * VEC_LANES);
        vec_store(out + k * VEC_LANES, x / gelu_denominator_vec(x));
    }
    done = nvec * VEC_LANES;
#endif
    for (size_t i = done; i < N; i++) out[i] = inp[i] * gelu_sigmoid(inp[i]);
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t N) {
    size_t done = 0;
#ifdef VEC_MATH
    size_t nvec = N / VEC_LANES;
    #pragma omp parallel for schedule(dynamic, 1024)
    for (size_t k = 0; k < nvec; k++) {
        vec_f x = vec_load(inp + k * VEC_LANES);
        vec_f s = 1.0f / gelu_denominator_vec(x);
        vec_f grad = s + 2.0f * x * s * (1.0f - s) * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        vec_store(dinp + k * VEC_LANES, vec_load(dout + k * VEC_LANES) * grad);
    }
    done = nvec * VEC_LANES;
#endif
    for (size_t i = done; i < N; i++) dinp[i] = dout[i] * gelu_grad(inp[i], gelu_sigmoid(inp[i]));
}

static void residual_forward(float *out, const float *a, const float *b, size_t N) {
    #pragma omp parallel for schedule(dynamic, 16384)
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

// out = a + b passes dout to both: b's branch reads dout where it is, and
// a's gets a copy, which the LayerNorm on that branch then adds to
static void residual_backward(float *da, const float *dout, size_t N) {
    #pragma omp parallel for schedule(dynamic, 16384)
    for (size_t i = 0; i < N; i++) da[i] = dout[i];
}

// softmax cross-entropy over the vocabulary, in three passes so that the
// vocabulary may be split among tensor-parallel ranks (each holding Vl
// columns of the logits, starting at global column v0; nreal of them are
// real tokens, the rest padding that never gets probability or gradient).
// Between the passes the ranks combine their row maxima and row sums. The
// probabilities are kept as exp(z - max), not divided by their row's sum:
// the loss and the backward divide as they read them, which saves a pass
// over the B*T*V floats. With one rank passes 1 and 2 run row by row
// (crossentropy_softmax). The probabilities may be written over the logits,
// and their gradient over the probabilities: the trainer keeps one buffer.

// the largest real logit of one row
static float crossentropy_row_max(const float *z, int nreal) {
    float m = -INFINITY;
    int i = 0;
#ifdef VEC_MATH
    if (nreal >= VEC_LANES) {
        vec_f mv = vec_load(z);
        for (; i + VEC_LANES <= nreal; i += VEC_LANES) mv = vec_max(mv, vec_load(z + i));
        m = vec_max_lane(mv);
    }
#endif
    for (; i < nreal; i++) if (z[i] > m) m = z[i];
    return m;
}

// returns the sum of one row's exp(z - max), which it writes to p (zeros in
// the padding columns)
static float crossentropy_row_exp(float *p, const float *z, float max, int Vl, int nreal) {
    float sum = 0.0f;
    int i = 0;
#ifdef VEC_MATH
    // VEC_LANES running sums, added in a fixed order at the end
    vec_f sums_v = vec_splat(0.0f), max_v = vec_splat(max);
    for (; i + VEC_LANES <= nreal; i += VEC_LANES) {
        vec_f e = vec_exp(vec_load(z + i) - max_v);
        vec_store(p + i, e);
        sums_v += e;
    }
    sum = vec_sum(sums_v);
#endif
    for (; i < nreal; i++) {
        p[i] = expf(z[i] - max);
        sum += p[i];
    }
    for (int i = nreal; i < Vl; i++) p[i] = 0.0f;
    return sum;
}

// pass 1: the largest real logit of each row
static void crossentropy_rowmax(float *maxes, const float *logits, int N, int Vl, int nreal) {
    #pragma omp parallel for schedule(dynamic)
    for (int n = 0; n < N; n++) maxes[n] = crossentropy_row_max(logits + (size_t)n * Vl, nreal);
}

// pass 2: unnormalized probabilities exp(z - max) and their row sums; probs
// may be the logits themselves, overwritten
static void crossentropy_exp(float *probs, float *sums, const float *logits, const float *maxes, int N, int Vl, int nreal) {
    #pragma omp parallel for schedule(dynamic)
    for (int n = 0; n < N; n++)
        sums[n] = crossentropy_row_exp(probs + (size_t)n * Vl, logits + (size_t)n * Vl, maxes[n], Vl, nreal);
}

// passes 1 and 2 row by row, when one rank holds the whole vocabulary: the
// exponentials read the row again while it is still in L2 (201 KB at GPT-2's
// vocabulary), so the logits come from memory once, not twice. The same
// operations in the same order as the two passes: the same bits. probs may
// be the logits, as in crossentropy_exp.
static void crossentropy_softmax(float *maxes, float *probs, float *sums, const float *logits, int N, int Vl, int nreal) {
    #pragma omp parallel for schedule(dynamic)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * Vl;
        maxes[n] = crossentropy_row_max(z, nreal);
        sums[n] = crossentropy_row_exp(probs + (size_t)n * Vl, z, maxes[n], Vl, nreal);
    }
}

// pass 3: the loss of a row, -log(probability of its target), comes from the
// rank holding its target (0 elsewhere, so the ranks' losses add up)
static void crossentropy_finish(float *losses, const float *probs, const float *sums, const int *targets,
                                int v0, int N, int Vl, int nreal) {
    for (int n = 0; n < N; n++) {
        int col = targets[n] - v0;
        losses[n] = col >= 0 && col < nreal ? -logf(probs[(size_t)n * Vl + col] / sums[n]) : 0.0f;
    }
}

// dlogits = (probs / sums - onehot(target)) * dloss, dloss the same for every
// position, and zero in the padding columns: written, not added to. dlogits
// may be probs itself, turned into its gradient in place, which saves
// writing a second buffer as large (51 MB at d12).
static void crossentropy_backward(float *dlogits, const float *probs, const float *sums, const int *targets,
                                  float dloss, int v0, int N, int Vl, int nreal) {
    #pragma omp parallel for schedule(dynamic)
    for (int n = 0; n < N; n++) {
        float *dz = dlogits + (size_t)n * Vl, sum = sums[n];
        const float *p = probs + (size_t)n * Vl;
        int col = targets[n] - v0, has_target = col >= 0 && col < nreal;
        float p_target = has_target ? p[col] : 0.0f;  // read before dz overwrites it
        int i = 0;
#ifdef VEC_MATH
        vec_f sum_v = vec_splat(sum), dloss_v = vec_splat(dloss);
        for (; i + VEC_LANES <= nreal; i += VEC_LANES) vec_store(dz + i, vec_load(p + i) / sum_v * dloss_v);
#endif
        for (; i < nreal; i++) dz[i] = p[i] / sum * dloss;
        for (int i = nreal; i < Vl; i++) dz[i] = 0.0f;
        if (has_target) dz[col] = (p_target / sum - 1.0f) * dloss;
    }
}

#endif  // LLM3D_CPU_LAYERS_H
