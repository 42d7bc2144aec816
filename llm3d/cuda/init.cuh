/*
 * llm3d/cuda/init.cuh: the seeded parameter init on the device.
 *
 * defines:
 *   InitSpec, init_spec   how each tensor is filled: a constant, or std times
 *                         a normal for the first random_count elements
 *   init_tensor_kernel    one tensor filled so, gpt2.h's param_init_value
 *                         ported to the GPU
 */
#ifndef LLM3D_INIT_CUH
#define LLM3D_INIT_CUH

#include <math.h>
#include <stdint.h>

#include "llm3d/cuda/cuda_common.cuh"
#include "llm3d/gpt2.h"

// ----------------------------------------------------------------------------
// the seeded init on the device: gpt2.h's param_init_value, ported. Integer
// mixing is exact and the Box-Muller runs in double, so the values equal the
// host's after rounding to float except where a double ulp decides a float
// rounding (test_gpt2.cu counts them).

static __device__ uint64_t device_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static __device__ float device_counter_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t a = device_mix64(seed ^ device_mix64(stream * 0x100000001b3ull ^ device_mix64(2 * i)));
    uint64_t b = device_mix64(seed ^ device_mix64(stream * 0x100000001b3ull ^ device_mix64(2 * i + 1)));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// how param_init_value fills tensor t: constant for all i, or std * normal
// for i < random_count and 0 after (wte's padded rows)
typedef struct {
    float constant;
    double std;
    size_t random_count;
} InitSpec;

static InitSpec init_spec(const GPT2Config *c, int t, size_t size) {
    InitSpec s = {0.0f, 0.02, size};
    switch (t) {
    case P_LN1W: case P_LN2W: case P_LNFW: s.std = 0.0; s.constant = 1.0f; break;
    case P_QKVB: case P_ATTPROJB: case P_FCB: case P_FCPROJB:
    case P_LN1B: case P_LN2B: case P_LNFB: s.std = 0.0; break;
    case P_WTE: s.random_count = (size_t)c->V * c->C; break;
    case P_ATTPROJW: case P_FCPROJW: s.std = 0.02 / sqrt(2.0 * c->L); break;
    default: break;
    }
    return s;
}

__global__ void init_tensor_kernel(float *out, size_t n, uint64_t seed, int tensor, float constant, double std,
                                   size_t random_count) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (std == 0.0) out[i] = constant;
        else out[i] = i < random_count ? (float)(std * device_counter_normal(seed, (uint64_t)tensor, i)) : 0.0f;
    }
}

#endif
