/*
 * llm3d/cuda/layernorm.cuh: LayerNorm and the residual add.
 *
 * defines:
 *   layernorm_forward    LayerNorm over C, one warp per row; saves the mean
 *                        and 1/std
 *   residual_forward     the residual add, out = a + b
 *   residual_layernorm_forward
 *                        the two fused in one pass
 *   layernorm_backward   dinp += the LayerNorm backward of dout, and the
 *                        weight and bias gradients, which are matmul.cuh's
 *                        column sums (either part alone, for a split backward)
 */
#ifndef LLM3D_LAYERNORM_CUH
#define LLM3D_LAYERNORM_CUH

#include <math.h>

#include "llm3d/cuda/cuda_common.cuh"
#include "llm3d/cuda/matmul.cuh"  // column_sums_kernel, add_column_partials_kernel

// ----------------------------------------------------------------------------
// LayerNorm over C, eps 1e-5, one warp per row; saves mean and 1/std

static __device__ void layernorm_row(floatX *out, float *mean, float *rstd, const floatX *x, const floatX *weight,
                                     const floatX *bias, int C) {
    int lane = threadIdx.x % 32;
    float sum = 0.0f;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c);
        for (int k = 0; k < PACK; k++) sum += to_f(p.v[k]);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;  // two passes, as the CPU trainer: no cancellation
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c);
        for (int k = 0; k < PACK; k++) {
            float d = to_f(p.v[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c), w = load_pack(weight + c), b = load_pack(bias + c), o;
        for (int k = 0; k < PACK; k++) o.v[k] = to_x((to_f(p.v[k]) - m) * s * to_f(w.v[k]) + to_f(b.v[k]));
        store_pack(out + c, o);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(floatX *out, float *mean, float *rstd, const floatX *inp,
                                         const floatX *weight, const floatX *bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    layernorm_row(out + (size_t)row * C, mean + row, rstd + row, inp + (size_t)row * C, weight, bias, C);
}

// residual = a + b (rounded to floatX, as the backward will read it back),
// then out = LayerNorm(residual): the residual add and the next block's
// first LayerNorm in one pass over the row
__global__ void residual_layernorm_forward_kernel(floatX *residual, floatX *out, float *mean, float *rstd,
                                                  const floatX *a, const floatX *b, const floatX *weight,
                                                  const floatX *bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    for (int c = (threadIdx.x % 32) * PACK; c < C; c += 32 * PACK) {
        Pack x = load_pack(a + off + c), y = load_pack(b + off + c), r;
        for (int k = 0; k < PACK; k++) r.v[k] = to_x(to_f(x.v[k]) + to_f(y.v[k]));
        store_pack(residual + off + c, r);
    }
    // each lane reads back only the packs it wrote itself: no barrier needed
    layernorm_row(out + off, mean + row, rstd + row, residual + off, weight, bias, C);
}

// dinp += the LayerNorm backward of dout; the parameter gradients are
// column sums (column_sums_kernel)
__global__ void layernorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp,
                                               const floatX *weight, const float *mean, const float *rstd,
                                               int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    int lane = threadIdx.x % 32;
    size_t off = (size_t)row * C;
    float m = mean[row], s = rstd[row];
    // dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack d = load_pack(dout + off + c), x = load_pack(inp + off + c), w = load_pack(weight + c);
        for (int k = 0; k < PACK; k++) {
            float norm = (to_f(x.v[k]) - m) * s, dnorm = to_f(w.v[k]) * to_f(d.v[k]);
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack d = load_pack(dout + off + c), x = load_pack(inp + off + c), w = load_pack(weight + c);
        Pack g = load_pack(dinp + off + c);
        for (int k = 0; k < PACK; k++) {
            float norm = (to_f(x.v[k]) - m) * s, dnorm = to_f(w.v[k]) * to_f(d.v[k]);
            g.v[k] = to_x(to_f(g.v[k]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
        }
        store_pack(dinp + off + c, g);
    }
}

// ----------------------------------------------------------------------------
// residual add: out = a + b

__global__ void residual_forward_kernel(floatX *out, const floatX *a, const floatX *b, size_t n) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (idx >= n) return;
    Pack x = load_pack(a + idx), y = load_pack(b + idx), o;
    for (int k = 0; k < PACK; k++) o.v[k] = to_x(to_f(x.v[k]) + to_f(y.v[k]));
    store_pack(out + idx, o);
}

// ----------------------------------------------------------------------------
// kernel launchers

static void layernorm_forward(floatX *out, float *mean, float *rstd, const floatX *inp, const floatX *weight,
                              const floatX *bias, int N, int C, cudaStream_t stream) {
    layernorm_forward_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    CUDA_CHECK(cudaGetLastError());
}

static void residual_forward(floatX *out, const floatX *a, const floatX *b, size_t n, cudaStream_t stream) {
    residual_forward_kernel<<<ceil_div((long)(n / PACK), 256), 256, 0, stream>>>(out, a, b, n);
    CUDA_CHECK(cudaGetLastError());
}

static void residual_layernorm_forward(floatX *residual, floatX *out, float *mean, float *rstd, const floatX *a,
                                       const floatX *b, const floatX *weight, const floatX *bias, int N, int C,
                                       cudaStream_t stream) {
    residual_layernorm_forward_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(residual, out, mean, rstd, a, b, weight,
                                                                          bias, N, C);
    CUDA_CHECK(cudaGetLastError());
}

// dinp += d/dinp, dweight += ..., dbias += ...; partial: colsum_splits(N) * 2C floats.
// dinp NULL: the parameters' gradients alone; dweight NULL: dinp alone (a
// backward split in B and W, train_gpt2.cu's BACK_INPUT and BACK_WEIGHTS)
static void layernorm_backward(floatX *dinp, floatX *dweight, floatX *dbias, float *partial, const floatX *dout,
                               const floatX *inp, const floatX *weight, const float *mean, const float *rstd, int N,
                               int C, cudaStream_t stream) {
    if (dinp != NULL) {
        layernorm_backward_dinp_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
        CUDA_CHECK(cudaGetLastError());
    }
    if (dweight == NULL) return;
    int splits = colsum_splits(N);
    dim3 grid(ceil_div(C, COLSUM_COLS), splits);
    column_sums_kernel<<<grid, COLSUM_WARPS * 32, 0, stream>>>(partial, dout, inp, mean, rstd, N, C,
                                                               ceil_div(N, splits));
    CUDA_CHECK(cudaGetLastError());
    add_column_partials_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dbias, dweight, partial, splits, C);
    CUDA_CHECK(cudaGetLastError());
}

#endif
