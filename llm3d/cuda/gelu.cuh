/*
 * llm3d/cuda/gelu.cuh: GELU, tanh approximation.
 *
 * defines:
 *   gelu_forward    out = gelu(inp), elementwise
 *   gelu_backward   d *= gelu'(inp), in place: dout in, dinp out
 *
 * The bf16 build's forward is matmul.cuh's epilogue instead.
 */
#ifndef LLM3D_GELU_CUH
#define LLM3D_GELU_CUH

#include <math.h>

#include "llm3d/cuda/cuda_common.cuh"

// ----------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's). The bf16 build fuses it into the fc
// matmul (cuBLASLt epilogue); these kernels serve the fp32 build and the
// recompute in the backward.

static __device__ __forceinline__ float gelu_value(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float gelu_slope(float x) {
    const float k = 0.7978845608028654f;
    float th = tanhf(k * (x + 0.044715f * x * x * x));
    float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

__global__ void gelu_forward_kernel(floatX *out, const floatX *inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (i >= n) return;
    Pack x = load_pack(inp + i), o;
    for (int k = 0; k < PACK; k++) o.v[k] = to_x(gelu_value(to_f(x.v[k])));
    store_pack(out + i, o);
}

// d holds dout on entry and dinp on exit: d *= gelu'(inp)
__global__ void gelu_backward_kernel(floatX *d, const floatX *inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (i >= n) return;
    Pack x = load_pack(inp + i), g = load_pack(d + i);
    for (int k = 0; k < PACK; k++) g.v[k] = to_x(to_f(g.v[k]) * gelu_slope(to_f(x.v[k])));
    store_pack(d + i, g);
}

// ----------------------------------------------------------------------------
// kernel launchers

static void gelu_forward(floatX *out, const floatX *inp, size_t n, cudaStream_t stream) {
    gelu_forward_kernel<<<ceil_div((long)(n / PACK), 256), 256, 0, stream>>>(out, inp, n);
    CUDA_CHECK(cudaGetLastError());
}

static void gelu_backward(floatX *d, const floatX *inp, size_t n, cudaStream_t stream) {
    gelu_backward_kernel<<<ceil_div((long)(n / PACK), 256), 256, 0, stream>>>(d, inp, n);
    CUDA_CHECK(cudaGetLastError());
}

#endif
