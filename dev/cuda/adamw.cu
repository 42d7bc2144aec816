/*
 * adamw.cu: the global gradient norm (two-pass, deterministic) and AdamW
 * with the clip folded in, on fp32 master weights, against the CPU (the
 * CPU trainer's order of operations).
 */
#include "llm3d/cuda/adamw.cuh"
#include "dev/cuda/common.h"

typedef struct {
    floatX *params, *grads;
    float *master, *m, *v, *norm, *partial;
    size_t n;
    float max_norm;
} AdamCtx;

static const float LR = 1e-3f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

static void run_norm(void *p) {
    AdamCtx *c = (AdamCtx *)p;
    global_norm(c->norm, c->partial, c->grads, c->n, 0);
}

static void run_adamw(void *p) {  // step 3 of AdamW: the bias corrections are not 1
    AdamCtx *c = (AdamCtx *)p;
    float bc1 = 1.0f - powf(BETA1, 3.0f), bc2_sqrt = sqrtf(1.0f - powf(BETA2, 3.0f));
    adamw_kernel<<<grid_for(c->n, 256), 256>>>(c->params, c->master, c->grads, c->m, c->v, c->n, LR, BETA1, BETA2, EPS,
                                               WD, LR / bc1, bc2_sqrt, c->norm, c->max_norm);
    CUDA_CHECK(cudaGetLastError());
}

static void check_size(size_t n, float max_norm) {
    printf("n = %zu, max_norm = %g\n", n, max_norm);
    float *g = host_random(n, 1e-3f, 31), *p = host_random(n, 0.02f, 32), *m = host_random(n, 1e-3f, 33);
    float *v = (float *)malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        v[i] = 1e-6f * fabsf(counter_normal(34, 0, i));
        p[i] = 0.02f * counter_normal(35, 0, i);  // master weights are full fp32
    }
    AdamCtx c = {NULL, to_device(g, n), to_device_f32(p, n), to_device_f32(m, n), to_device_f32(v, n), NULL, NULL, n, max_norm};
#ifdef ENABLE_FP32
    c.params = c.master;
#else
    CUDA_CHECK(cudaMalloc((void **)&c.params, n * sizeof(floatX)));
#endif
    CUDA_CHECK(cudaMalloc((void **)&c.norm, 4));
    CUDA_CHECK(cudaMalloc((void **)&c.partial, NORM_BLOCKS * 4));

    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)g[i] * g[i];
    float norm = (float)sqrt(sum);
    run_norm(&c);
    float gnorm = *to_host_f32(c.norm, 1);
    compare("global grad norm", &gnorm, &norm, 1, 1e-5f);
    run_norm(&c);
    float gnorm2 = *to_host_f32(c.norm, 1);
    check(gnorm == gnorm2, "global grad norm is deterministic (%.9g)", gnorm);

    float scale = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
    float bc1 = 1.0f - powf(BETA1, 3.0f), bc2_sqrt = sqrtf(1.0f - powf(BETA2, 3.0f));
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * scale;
        m[i] = BETA1 * m[i] + (1.0f - BETA1) * gi;
        v[i] = BETA2 * v[i] + (1.0f - BETA2) * gi * gi;
        p[i] *= 1.0f - LR * WD;
        p[i] -= LR / bc1 * m[i] / (sqrtf(v[i]) / bc2_sqrt + EPS);
    }
    run_adamw(&c);
    float *gp = to_host_f32(c.master, n), *gm = to_host_f32(c.m, n), *gv = to_host_f32(c.v, n);
    float *gx = to_host(c.params, n);
    compare("adamw master weights", gp, p, n, 1e-6f);
    compare("adamw m", gm, m, n, 1e-6f);
    compare("adamw v", gv, v, n, 1e-6f);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) off += gx[i] != round_to_floatx(gp[i]);
    check(off == 0, "compute weights are the master weights rounded to floatX (%zu differ)", off);
    free(g); free(p); free(m); free(v); free(gp); free(gm); free(gv); free(gx);
#ifndef ENABLE_FP32
    cudaFree(c.params);
#endif
    cudaFree(c.grads); cudaFree(c.master); cudaFree(c.m); cudaFree(c.v); cudaFree(c.norm); cudaFree(c.partial);
}

int main(void) {
    if (!require_gpu()) return test_summary();
    check_size(shape_size(1 << 20, 1 << 12) + 3, 1e-3f);  // a tail past the last pack; the clip is active
    check_size(1000, 0.0f);                               // clip off
    check_size(5, 1e9f);                                  // fewer elements than one pack; clip inactive
    if (small_shapes()) return test_summary();

    size_t n = 124475904;  // GPT-2 124M
    AdamCtx c = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, n, 1.0f};
    CUDA_CHECK(cudaMalloc((void **)&c.grads, n * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void **)&c.master, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&c.m, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&c.v, n * 4));
    CUDA_CHECK(cudaMalloc((void **)&c.norm, 4));
    CUDA_CHECK(cudaMalloc((void **)&c.partial, NORM_BLOCKS * 4));
    CUDA_CHECK(cudaMemset(c.grads, 0, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemset(c.master, 0, n * 4));
    CUDA_CHECK(cudaMemset(c.m, 0, n * 4));
    CUDA_CHECK(cudaMemset(c.v, 0, n * 4));
#ifdef ENABLE_FP32
    c.params = c.master;
#else
    CUDA_CHECK(cudaMalloc((void **)&c.params, n * sizeof(floatX)));
#endif
    print_time("global norm 124M", time_ms(run_norm, &c, 10), (double)n * sizeof(floatX), 0);
    print_time("adamw 124M", time_ms(run_adamw, &c, 10), (double)n * (2 * sizeof(floatX) + 6 * 4), 0);
    return test_summary();
}
