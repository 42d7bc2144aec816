/*
 * llm3d/cuda/adamw.cuh: the optimizer step on the device.
 *
 * defines:
 *   global_norm            the global gradient norm: per-block partial sums
 *                          on a fixed grid, then one final block
 *   sumsq_add_kernel, sumsq_final_kernel, NORM_BLOCKS, NORM_THREADS
 *                          its two passes and its grid (the trainer adds
 *                          many runs into the same partials)
 *   adamw_kernel           the AdamW update, with the clip folded in
 *   copy_to_floatx_kernel  the floatX copy of the master weights
 *   add_into_kernel        dst += src: adds up the gradient pieces of the
 *                          ZeRO shards and the tied wte
 */
#ifndef LLM3D_ADAMW_CUH
#define LLM3D_ADAMW_CUH

#include <math.h>

#include "llm3d/cuda/cuda_common.cuh"

// ----------------------------------------------------------------------------
// global gradient norm: fixed grid, per-block partial sums, one final block

constexpr int NORM_BLOCKS = 512;
constexpr int NORM_THREADS = 512;

__global__ void sumsq_final_kernel(float *norm, const float *partial, int nparts) {
    __shared__ double shared[1024];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {  // blockDim.x a power of two
        if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) *norm = (float)sqrt(shared[0]);
}

// partial[block] += this block's sum of squares of g[0..n): the norm of many
// runs adds up in the same NORM_BLOCKS partials, in the same order every step
__global__ void __launch_bounds__(NORM_THREADS) sumsq_add_kernel(float *partial, const floatX *g, size_t n) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float acc = 0.0f;
    for (size_t i = tid; i < n; i += stride) acc += to_f(g[i]) * to_f(g[i]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] += acc;
}

// ----------------------------------------------------------------------------
// AdamW in PyTorch's order (as cpu_optimizer.h's adamw_update), on the fp32
// master weights; the floatX copy the model computes with is rounded from
// them. The clip scale (as torch.nn.utils.clip_grad_norm_) is folded in,
// computed from the norm on the device, so the host never waits for it.

__global__ void adamw_kernel(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay, float step_size,
                             float bc2_sqrt, const float *norm, float max_norm) {
    float gn = *norm;
    float scale = max_norm > 0.0f && gn > max_norm ? max_norm / (gn + 1e-6f) : 1.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f(grads[i]) * scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float p = master[i];
        p *= 1.0f - lr * weight_decay;
        p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;        // in the fp32 build params and master are one array
        params[i] = to_x(p);
    }
}

__global__ void copy_to_floatx_kernel(floatX *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_x(src[i]);
}

// ----------------------------------------------------------------------------
// the gradient sums the ZeRO shards and the tied wte need

// dst += src, elementwise (n a multiple of PACK: the units' chunks are)
__global__ void add_into_kernel(floatX *dst, const floatX *src, size_t n) {
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK; i < n;
         i += (size_t)gridDim.x * blockDim.x * PACK) {
        Pack x = load_pack(dst + i), y = load_pack(src + i), o;
        for (int k = 0; k < PACK; k++) o.v[k] = to_x(to_f(x.v[k]) + to_f(y.v[k]));
        store_pack(dst + i, o);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// *norm = the L2 norm of g[0..n); partial is scratch of NORM_BLOCKS floats
// (the trainer adds many runs into the partials: gpt2_norm_and_update)
[[maybe_unused]] static void global_norm(float *norm, float *partial, const floatX *g, size_t n, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(partial, 0, NORM_BLOCKS * sizeof(float), stream));
    sumsq_add_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, stream>>>(partial, g, n);
    CUDA_CHECK(cudaGetLastError());
    sumsq_final_kernel<<<1, 1024, 0, stream>>>(norm, partial, NORM_BLOCKS);
    CUDA_CHECK(cudaGetLastError());
}

#endif
