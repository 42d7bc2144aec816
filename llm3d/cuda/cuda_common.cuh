/*
 * llm3d/cuda/cuda_common.cuh: what every GPU kernel file shares.
 *
 * defines:
 *   floatX, precision_name, CUBLAS_FLOATX
 *                          bf16 in the default build, fp32 under
 *                          -DENABLE_FP32; its name and its cuBLAS type
 *   to_f, to_x             a floatX as a float and back, on the device
 *   PACK, Pack, load_pack, store_pack
 *                          the 16 bytes of floatX the kernels load and store
 *                          at a time
 *   load4, store4          4 consecutive floatX as a float4
 *   floatx_to_host_float   a floatX read back from the device, as a float
 *   CUDA_CHECK, CUBLAS_CHECK
 *                          the error checks: a failed call is one line and
 *                          exit(1)
 *   ceil_div, grid_for     the grid sizes
 *   warp_sum, block_sum    the fixed-order sums inside a warp and a block
 *   block_max              the largest value over a block
 */
#ifndef LLM3D_CUDA_COMMON_CUH
#define LLM3D_CUDA_COMMON_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#include "llm3d/gpt2.h"  // bf16_to_float

// ----------------------------------------------------------------------------
// precision

#ifdef ENABLE_FP32
typedef float floatX;
static const char *precision_name = "fp32";
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
static __device__ __forceinline__ float to_f(float x) { return x; }
static __device__ __forceinline__ float to_x(float x) { return x; }
#else
typedef __nv_bfloat16 floatX;
static const char *precision_name = "bf16";
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ __nv_bfloat16 to_x(float x) { return __float2bfloat16_rn(x); }
#endif

// 16 bytes of floatX: 8 bf16 or 4 fp32, the unit of every vectorized load.
// Every row length the kernels see (C, 3C, 4C, Vp) is a multiple of PACK.
constexpr int PACK = 16 / sizeof(floatX);
struct alignas(16) Pack { floatX v[PACK]; };

static __device__ __forceinline__ Pack load_pack(const floatX *p) { return *reinterpret_cast<const Pack *>(p); }
static __device__ __forceinline__ void store_pack(floatX *p, Pack x) { *reinterpret_cast<Pack *>(p) = x; }

// 4 consecutive floatX as a float4 (8-byte aligned for bf16, 16 for fp32)
static __device__ __forceinline__ float4 load4(const floatX *p) {
#ifdef ENABLE_FP32
    return *reinterpret_cast<const float4 *>(p);
#else
    const __nv_bfloat162 *q = reinterpret_cast<const __nv_bfloat162 *>(p);
    float2 a = __bfloat1622float2(q[0]), b = __bfloat1622float2(q[1]);
    return make_float4(a.x, a.y, b.x, b.y);
#endif
}

static __device__ __forceinline__ void store4(floatX *p, float4 x) {
#ifdef ENABLE_FP32
    *reinterpret_cast<float4 *>(p) = x;
#else
    __nv_bfloat162 *q = reinterpret_cast<__nv_bfloat162 *>(p);
    q[0] = __floats2bfloat162_rn(x.x, x.y);
    q[1] = __floats2bfloat162_rn(x.z, x.w);
#endif
}

// a floatX read back from the device, as a float
static float floatx_to_host_float(floatX x) {
#ifdef ENABLE_FP32
    return x;
#else
    __nv_bfloat16_raw raw = x;
    return bf16_to_float(raw.x);
#endif
}

// ----------------------------------------------------------------------------
// errors: a failed CUDA or cuBLAS call is a runtime error of the program

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "%s:%d: CUDA error %d: %s\n", file, line, (int)e, cudaGetErrorString(e));
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__)

static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: cuBLAS error %d\n", file, line, (int)s);
    exit(1);
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__)

// ----------------------------------------------------------------------------
// grid sizes

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

static int grid_for(size_t n, int threads) {  // grid-stride loops: enough blocks to fill any GPU
    size_t blocks = (n + threads - 1) / threads;
    return blocks > 65536 ? 65536 : blocks < 1 ? 1 : (int)blocks;
}

// ----------------------------------------------------------------------------
// reductions inside a warp and a block (fixed order: deterministic)

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it
static __device__ float block_sum(float v) {
    __shared__ float shared[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

// the largest v over the block (as block_sum); every thread gets it
static __device__ float block_max(float v) {
    __shared__ float shared[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
