/*
 * dev/cuda/common.h: what the kernel checks share: test data rounded to
 * floatX, host/device copies, a comparison that prints one ok/FAIL line
 * (test.h's check), a timer, and the small-shapes switch (small_shapes,
 * shape_size: LLM3D_CHECK_SMALL=1).
 *
 * defines:
 *   IS_BF16                   whether floatX is bf16 (the references are then
 *                             computed on the same rounded inputs)
 *   host_to_floatx, round_to_floatx
 *                             a float as floatX, and as the float it rounds to
 *   host_random               n normal values times scale, rounded to floatX
 *                             (deterministic in seed)
 *   to_device, to_device_f32, to_device_int
 *                             a host array copied into a new device array
 *                             (floats as floatX, floats, ints)
 *   to_host, to_host_f32      a device array (floatX, float) copied back into a
 *                             new host array of floats
 *   compare                   got against want: the worst difference relative
 *                             to the largest |want| below tol, one ok/FAIL line
 *   small_shapes, shape_size  the small-shapes switch: a check's size, full
 *                             normally, small under LLM3D_CHECK_SMALL
 *   require_gpu               whether there is a CUDA device (a skip when
 *                             not); prints the device and the build
 *   TimedLaunch, time_ms      the mean milliseconds of one call of a launch,
 *                             after one warm-up call
 *   print_time                a "time" line: ms, GB/s and TFLOPS
 *
 * Each check includes the trainer's own kernel file, so it tests the kernels
 * the trainer runs, not copies of them:
 *     #include "llm3d/cuda/layernorm.cuh"
 *     #include "dev/cuda/common.h"
 */
#ifndef LLM3D_CUDA_COMMON_H
#define LLM3D_CUDA_COMMON_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dev/test/test.h"
#include "llm3d/gpt2.h"         // counter_normal, float_to_bf16
#include "llm3d/cuda/cuda_common.cuh"

// a bf16 build compares against references computed on the same rounded
// inputs, so what is left is output rounding and summation order
static const int IS_BF16 = sizeof(floatX) == 2;

static floatX host_to_floatx(float f) {
#ifdef ENABLE_FP32
    return f;
#else
    __nv_bfloat16_raw raw;
    raw.x = float_to_bf16(f);
    return __nv_bfloat16(raw);
#endif
}

static float round_to_floatx(float f) { return floatx_to_host_float(host_to_floatx(f)); }

// n normal values times scale, already rounded to floatX (deterministic in seed)
static float *host_random(size_t n, float scale, uint64_t seed) {
    float *h = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = round_to_floatx(scale * counter_normal(seed, 99, i));
    return h;
}

static floatX *to_device(const float *h, size_t n) {
    floatX *tmp = (floatX *)malloc(n * sizeof(floatX)), *d;
    for (size_t i = 0; i < n; i++) tmp[i] = host_to_floatx(h[i]);
    CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

static float *to_device_f32(const float *h, size_t n) {
    float *d;
    CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static int *to_device_int(const int *h, size_t n) {
    int *d;
    CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

static float *to_host(const floatX *d, size_t n) {
    floatX *tmp = (floatX *)malloc(n * sizeof(floatX));
    float *h = (float *)malloc(n * sizeof(float));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) h[i] = floatx_to_host_float(tmp[i]);
    free(tmp);
    return h;
}

static float *to_host_f32(const float *d, size_t n) {
    float *h = (float *)malloc(n * sizeof(float));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// worst |got - want| relative to the largest |want| must be below tol
static int compare(const char *what, const float *got, const float *want, size_t n, float tol) {
    float maxref = 0.0f, maxdiff = 0.0f;
    size_t at = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        maxref = fmaxf(maxref, fabsf(want[i]));
        float d = fabsf(got[i] - want[i]);
        if (!(d == d) || isinf(got[i])) finite = 0;
        if (d > maxdiff) { maxdiff = d; at = i; }
    }
    float rel = maxref > 0.0f ? maxdiff / maxref : maxdiff;
    return check(finite && rel < tol, "%-28s worst diff %.3e at %zu (got %.6g want %.6g) = %.2e of max %.3e (< %.0e)",
                 what, maxdiff, at, n ? got[at] : 0.0f, n ? want[at] : 0.0f, rel, maxref, tol);
}

// small_shapes: whether LLM3D_CHECK_SMALL is set (to anything but "" or
// "0"). Then every check makes the same comparisons on small shapes and
// times nothing, so that compute-sanitizer's memcheck and racecheck, which
// run kernels tens to thousands of times slower, go over all the checks in
// seconds each (dev/gpu_check.sh runs them so).
static int small_shapes(void) {
    const char *v = getenv("LLM3D_CHECK_SMALL");
    return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

// shape_size: a check's size, full normally, small under LLM3D_CHECK_SMALL
static int shape_size(int full, int small) { return small_shapes() ? small : full; }

static int require_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        skip("no CUDA device");
        return 0;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (%s build%s)\n", prop.name, precision_name,
           small_shapes() ? ", small shapes: LLM3D_CHECK_SMALL is set, nothing is timed" : "");
    return 1;
}

// mean milliseconds of one call of launch(ctx), after one warm-up call
typedef void (*TimedLaunch)(void *ctx);  // not "Launch": launcher.h has one

static float time_ms(TimedLaunch launch, void *ctx, int repeats) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    launch(ctx);
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < repeats; i++) launch(ctx);
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms / repeats;
}

static void print_time(const char *what, float ms, double bytes, double flops) {
    printf("time  %-28s %8.3f ms", what, ms);
    if (bytes > 0) printf(" | %7.1f GB/s", bytes / (ms * 1e-3) / 1e9);
    if (flops > 0) printf(" | %7.1f TFLOPS", flops / (ms * 1e-3) / 1e12);
    printf("\n");
}

#endif
