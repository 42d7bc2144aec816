/*
 * layernorm.cu: LayerNorm forward, the fused residual + LayerNorm forward,
 * and the backward (dinp, then dweight/dbias as deterministic column sums),
 * against the CPU.
 */
#include "llm3d/cuda/layernorm.cuh"
#include "llm3d/cuda/matmul.cuh"  // colsum_splits
#include "dev/cuda/common.h"

static void cpu_layernorm(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *r = x + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int i = 0; i < C; i++) m += r[i];
        m /= C;
        for (int i = 0; i < C; i++) v += (r[i] - m) * (r[i] - m);
        float s = (float)(1.0 / sqrt(v / C + 1e-5));
        for (int i = 0; i < C; i++) out[(size_t)n * C + i] = (float)(r[i] - m) * s * w[i] + b[i];
        mean[n] = (float)m;
        rstd[n] = s;
    }
}

static void cpu_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                                   const float *mean, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C, *r = x + (size_t)n * C;
        double a = 0.0, b = 0.0;
        for (int i = 0; i < C; i++) {
            double norm = (r[i] - mean[n]) * rstd[n], dnorm = w[i] * d[i];
            a += dnorm;
            b += dnorm * norm;
        }
        a /= C;
        b /= C;
        for (int i = 0; i < C; i++) {
            double norm = (r[i] - mean[n]) * rstd[n], dnorm = w[i] * d[i];
            dx[(size_t)n * C + i] += (float)((dnorm - a - norm * b) * rstd[n]);
            dw[i] += (float)(norm * d[i]);
            db[i] += d[i];
        }
    }
}

typedef struct {
    floatX *out, *res, *dinp, *dw, *db;
    const floatX *x, *y, *w, *b, *dout;
    float *mean, *rstd, *partial;
    int N, C;
} LnCtx;

static void run_forward(void *p) {
    LnCtx *c = (LnCtx *)p;
    layernorm_forward(c->out, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, 0);
}
static void run_fused(void *p) {
    LnCtx *c = (LnCtx *)p;
    residual_layernorm_forward(c->res, c->out, c->mean, c->rstd, c->x, c->y, c->w, c->b, c->N, c->C, 0);
}
static void run_backward(void *p) {
    LnCtx *c = (LnCtx *)p;
    layernorm_backward(c->dinp, c->dw, c->db, c->partial, c->dout, c->x, c->w, c->mean, c->rstd, c->N, c->C, 0);
}

static void check_shape(int N, int C, int timed) {
    printf("N = %d, C = %d\n", N, C);
    size_t NC = (size_t)N * C;
    float *x = host_random(NC, 1.0f, 1), *y = host_random(NC, 0.5f, 2), *w = host_random(C, 1.0f, 3);
    float *b = host_random(C, 1.0f, 4), *dout = host_random(NC, 1.0f, 5), *dinp0 = host_random(NC, 1.0f, 6);
    for (int i = 0; i < C; i++) w[i] = round_to_floatx(1.0f + w[i] * 0.1f);
    float *out = (float *)malloc(NC * 4), *mean = (float *)malloc(N * 4), *rstd = (float *)malloc(N * 4);
    cpu_layernorm(out, mean, rstd, x, w, b, N, C);
    float *zeros = (float *)calloc(C, 4);
    LnCtx c = {NULL, NULL, to_device(dinp0, NC), to_device(zeros, C), to_device(zeros, C), to_device(x, NC),
               to_device(y, NC), to_device(w, C), to_device(b, C), to_device(dout, NC), NULL, NULL, NULL, N, C};
    CUDA_CHECK(cudaMalloc((void **)&c.out, NC * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void **)&c.res, NC * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void **)&c.mean, N * 4));
    CUDA_CHECK(cudaMalloc((void **)&c.rstd, N * 4));
    CUDA_CHECK(cudaMalloc((void **)&c.partial, (size_t)colsum_splits(N) * 2 * C * 4));
    float tol = IS_BF16 ? 2e-2f : 1e-5f;

    run_forward(&c);
    float *got = to_host(c.out, NC), *gmean = to_host_f32(c.mean, N), *grstd = to_host_f32(c.rstd, N);
    compare("layernorm forward out", got, out, NC, tol);
    compare("layernorm forward mean", gmean, mean, N, 1e-5f);
    compare("layernorm forward rstd", grstd, rstd, N, 1e-5f);

    // the backward, from the forward's mean/rstd (now on the device)
    float *dx = (float *)malloc(NC * 4), *dw = (float *)calloc(C, 4), *db = (float *)calloc(C, 4);
    memcpy(dx, dinp0, NC * 4);
    cpu_layernorm_backward(dx, dw, db, dout, x, w, gmean, grstd, N, C);
    run_backward(&c);
    float *gdx = to_host(c.dinp, NC), *gdw = to_host(c.dw, C), *gdb = to_host(c.db, C);
    compare("layernorm backward dinp (+=)", gdx, dx, NC, tol);
    compare("layernorm backward dweight", gdw, dw, C, IS_BF16 ? 2e-2f : 1e-4f);
    compare("layernorm backward dbias", gdb, db, C, IS_BF16 ? 2e-2f : 1e-4f);

    // fused: residual = x + y rounded, then LayerNorm of it
    float *res = (float *)malloc(NC * 4);
    for (size_t i = 0; i < NC; i++) res[i] = round_to_floatx(x[i] + y[i]);
    cpu_layernorm(out, mean, rstd, res, w, b, N, C);
    run_fused(&c);
    float *gres = to_host(c.res, NC), *gout = to_host(c.out, NC);
    compare("residual add", gres, res, NC, 1e-6f);
    compare("residual + layernorm out", gout, out, NC, tol);

    if (timed) {
        double bytes = 2.0 * NC * sizeof(floatX);
        print_time("layernorm forward", time_ms(run_forward, &c, 20), bytes, 0);
        print_time("residual + layernorm forward", time_ms(run_fused, &c, 20), 2 * bytes, 0);
        print_time("layernorm backward", time_ms(run_backward, &c, 20), 3 * bytes, 0);
    }
}

int main(void) {
    if (!require_gpu()) return test_summary();
    check_shape(shape_size(8 * 1024, 64), 768, !small_shapes());  // d12 at B = 8, timed
    check_shape(100, 1600, 0);  // d48's C: not a multiple of 32 * PACK
    check_shape(37, 64, 0);     // the fixture's C, a row count that fills no block
    return test_summary();
}
