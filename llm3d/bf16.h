/*
 * llm3d/bf16.h: bf16 <-> fp32 on the host, the conversions everything that
 * reads or writes bf16 values shares.
 *
 * defines:
 *   bf16_to_float   a bf16 as a float (exact)
 *   float_to_bf16   a float as a bf16, rounded to nearest even, as the GPU's
 *                   __float2bfloat16 (NaN stays NaN)
 *   bf16_widen, bf16_narrow
 *                   their array forms: n values at once
 *
 * Used by gpt2.h (bf16 model files) and nccl_comm.h (host mode's reductions
 * of bf16 gradients).
 */
#ifndef LLM3D_BF16_H
#define LLM3D_BF16_H

#include <stddef.h>
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

// bf16_widen, bf16_narrow: n values at once (host mode sums bf16 gradients in fp32)
static inline void bf16_widen(const uint16_t *in, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = bf16_to_float(in[i]);
}

static inline void bf16_narrow(const float *in, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = float_to_bf16(in[i]);
}

#endif
