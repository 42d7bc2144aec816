/*
 * bf16.h: bf16 <-> fp32 on the host, the two conversions everything that
 * reads or writes bf16 values shares: bf16_to_float (exact) and
 * float_to_bf16 (round to nearest even, as the GPU's __float2bfloat16).
 * Used by gpt2.h (bf16 model files) and nccl_comm.h (the host backend's
 * reductions of bf16 gradients).
 */
#ifndef LLM3D_BF16_H
#define LLM3D_BF16_H

#include <stdint.h>
#include <string.h>

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

#endif
