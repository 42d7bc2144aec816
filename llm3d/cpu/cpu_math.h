/*
 * cpu_math.h: the vector arithmetic of the CPU trainer's elementwise layers:
 * a vector of floats as wide as this build's SIMD registers, and exp over it.
 *
 * defines: VEC_LANES, vec_f, vec_load, vec_store, vec_splat, vec_exp,
 * vec_max, vec_sum.
 *
 * The width follows what the compiler targets: 16 floats with AVX-512, 8
 * with AVX2, otherwise 4 (SSE, NEON), through GCC's and Clang's vector
 * extension, so the same code is the AVX-512, the AVX2 and the SSE path.
 * Built with -DLLM3D_SCALAR (make SIMD=scalar), or by a compiler without the
 * extension, the layers take their plain loops and libm instead.
 *
 * vec_exp is within 2 ulp of expf over the range where expf is a normal
 * float; below it (x < -87.3) it returns exp(-87.3), about 1e-38, and above
 * it (x > 88) exp(88), about 1.7e38, rather than denormals and infinity.
 */
#ifndef LLM3D_CPU_MATH_H
#define LLM3D_CPU_MATH_H

#include <stdint.h>

#if defined(__GNUC__) && !defined(LLM3D_SCALAR)
#define VEC_MATH 1
#if defined(__AVX512F__)
#define VEC_LANES 16
#elif defined(__AVX2__)
#define VEC_LANES 8
#else
#define VEC_LANES 4
#endif

typedef float vec_f __attribute__((vector_size(VEC_LANES * sizeof(float))));
typedef int32_t vec_i __attribute__((vector_size(VEC_LANES * sizeof(int32_t))));
// the same vector at any float's address: loaded and stored whole, where a
// memcpy is expanded at the width -mtune prefers (cpu_matmul.h says more)
typedef float vec_f_unaligned
    __attribute__((vector_size(VEC_LANES * sizeof(float)), aligned(sizeof(float)), may_alias));

static inline vec_f vec_load(const float *p) { return *(const vec_f_unaligned *)p; }

static inline void vec_store(float *p, vec_f v) { *(vec_f_unaligned *)p = v; }

static inline vec_f vec_splat(float x) { return (vec_f){0} + x; }

// where mask (all ones or all zeros per lane) is set, a; elsewhere b
static inline vec_f vec_select(vec_i mask, vec_f a, vec_f b) { return (vec_f)((mask & (vec_i)a) | (~mask & (vec_i)b)); }

static inline vec_f vec_max(vec_f a, vec_f b) { return vec_select(a > b, a, b); }

// exp(x) = 2^n exp(r) with n the nearest integer to x / ln 2 and r = x - n ln 2
// in [-ln2/2, ln2/2]; ln 2 in two parts so that n ln 2 is exact enough (Cody
// and Waite), and exp(r) from Cephes' degree-6 polynomial for expf
static inline vec_f vec_exp(vec_f x) {
    x = vec_max(x, vec_splat(-87.3f));
    x = vec_select(x > vec_splat(88.0f), vec_splat(88.0f), x);
    const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    vec_f n = (x * 1.44269504088896341f + round_magic) - round_magic;
    vec_f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vec_f p = vec_splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    vec_f er = p * (r * r) + r + 1.0f;
    vec_i pow2n = (__builtin_convertvector(n, vec_i) + 127) << 23;
    return er * (vec_f)pow2n;
}

// the lanes added in a fixed order, the same on every call
static inline float vec_sum(vec_f v) {
    float s = 0.0f;
    for (int i = 0; i < VEC_LANES; i++) s += v[i];
    return s;
}

static inline float vec_max_lane(vec_f v) {
    float m = v[0];
    for (int i = 1; i < VEC_LANES; i++) m = v[i] > m ? v[i] : m;
    return m;
}
#endif

#endif
