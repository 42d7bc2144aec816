/*
 * attention.cu: the causal flash attention, forward and backward, against a
 * plain CPU attention (double accumulators, the full softmax), at several
 * head sizes and sequence lengths that are not multiples of the tiles; then
 * timed at GPT-2 124M's shape.
 */
#include "llm3d/cuda/attention.cuh"
#include "dev/cuda/common.h"

// out (B,T,C) and dqkv (B,T,3C) from qkv (B,T,3C) and dout (B,T,C)
static void cpu_attention(float *out, float *dqkv, const float *qkv, const float *dout, int B, int T, int NH, int HS) {
    int C = NH * HS, C3 = 3 * C;
    double scale = 1.0 / sqrt((double)HS);
    double *p = (double *)malloc(T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * HS;
                double maxv = -1e300, sum = 0.0;
                for (int s = 0; s <= t; s++) {
                    const float *k = qkv + ((size_t)b * T + s) * C3 + C + h * HS;
                    double d = 0.0;
                    for (int i = 0; i < HS; i++) d += (double)q[i] * k[i];
                    p[s] = d * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                for (int s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - maxv));
                for (int s = 0; s <= t; s++) p[s] /= sum;
                const float *d = dout + ((size_t)b * T + t) * C + h * HS;
                float *o = out + ((size_t)b * T + t) * C + h * HS;
                double delta = 0.0;
                for (int i = 0; i < HS; i++) {
                    double acc = 0.0;
                    for (int s = 0; s <= t; s++) acc += p[s] * qkv[((size_t)b * T + s) * C3 + 2 * C + h * HS + i];
                    o[i] = (float)acc;
                    delta += acc * d[i];
                }
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * HS;
                for (int s = 0; s <= t; s++) {
                    const float *v = qkv + ((size_t)b * T + s) * C3 + 2 * C + h * HS;
                    const float *k = v - C;
                    float *dk = dqkv + ((size_t)b * T + s) * C3 + C + h * HS, *dv = dk + C;
                    double dps = 0.0;
                    for (int i = 0; i < HS; i++) dps += (double)d[i] * v[i];
                    double ds = p[s] * (dps - delta) * scale;
                    for (int i = 0; i < HS; i++) {
                        dv[i] += (float)(p[s] * d[i]);
                        dq[i] += (float)(ds * k[i]);
                        dk[i] += (float)(ds * q[i]);
                    }
                }
            }
    free(p);
}

typedef struct {
    floatX *out, *dqkv;
    const floatX *qkv, *dout;
    float *lse, *delta;
    int B, T, NH, HS, tc;
} AttCtx;

static void run_forward(void *p) {
    AttCtx *c = (AttCtx *)p;
    attention_forward(c->out, c->lse, c->qkv, c->B, c->T, c->NH * c->HS, c->NH, c->tc, 0);
}
static void run_backward(void *p) {
    AttCtx *c = (AttCtx *)p;
    attention_backward(c->dqkv, c->delta, c->dout, c->qkv, c->out, c->lse, c->B, c->T, c->NH * c->HS, c->NH, c->tc, 0);
}

static AttCtx make_ctx(int B, int T, int NH, int HS, int tc, float **qkv_h, float **dout_h) {
    size_t BT = (size_t)B * T, C = (size_t)NH * HS;
    *qkv_h = host_random(BT * 3 * C, 1.0f, 11 + HS);
    *dout_h = host_random(BT * C, 1.0f, 12 + HS);
    AttCtx c = {NULL, NULL, to_device(*qkv_h, BT * 3 * C), to_device(*dout_h, BT * C), NULL, NULL, B, T, NH, HS, tc};
    CUDA_CHECK(cudaMalloc((void **)&c.out, BT * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void **)&c.dqkv, BT * 3 * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void **)&c.lse, BT * NH * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&c.delta, BT * NH * sizeof(float)));
    return c;
}

static void free_ctx(AttCtx *c) {
    cudaFree(c->out); cudaFree(c->dqkv); cudaFree((void *)c->qkv); cudaFree((void *)c->dout);
    cudaFree(c->lse); cudaFree(c->delta);
}

static void check_shape(int B, int T, int NH, int HS, int tc) {
    char name[128];
    float *qkv, *dout;
    AttCtx c = make_ctx(B, T, NH, HS, tc, &qkv, &dout);
    size_t BT = (size_t)B * T, C = (size_t)NH * HS;
    float *out = (float *)malloc(BT * C * 4), *dqkv = (float *)malloc(BT * 3 * C * 4);
    cpu_attention(out, dqkv, qkv, dout, B, T, NH, HS);
    run_forward(&c);
    run_backward(&c);
    float *gout = to_host(c.out, BT * C), *gd = to_host(c.dqkv, BT * 3 * C);
    snprintf(name, sizeof(name), "%s forward B%d T%d NH%d HS%d", tc ? "tc" : "fma", B, T, NH, HS);
    compare(name, gout, out, BT * C, IS_BF16 ? 2e-2f : 1e-5f);
    snprintf(name, sizeof(name), "%s backward B%d T%d NH%d HS%d", tc ? "tc" : "fma", B, T, NH, HS);
    compare(name, gd, dqkv, BT * 3 * C, IS_BF16 ? 3e-2f : 1e-4f);
    // bit-identical on a second run: no atomics
    run_backward(&c);
    float *gd2 = to_host(c.dqkv, BT * 3 * C);
    snprintf(name, sizeof(name), "%s backward B%d T%d HS%d is deterministic", tc ? "tc" : "fma", B, T, HS);
    check(memcmp(gd, gd2, BT * 3 * C * 4) == 0, "%s", name);
    free(qkv); free(dout); free(out); free(dqkv); free(gout); free(gd); free(gd2);
    free_ctx(&c);
}

int main(void) {
    if (!require_gpu()) return test_summary();
    for (int tc = 0; tc < 2; tc++) {
        if (tc == 1 && !attention_tc_supports(64)) break;  // the fp32 build has no tensor-core path
        check_shape(2, 130, 4, 64, tc);  // a partial last tile of queries and keys
        check_shape(1, 64, shape_size(12, 2), 64, tc);  // d12's heads
        check_shape(2, 16, 4, 16, tc);   // the fixture's shape
        check_shape(1, 100, 2, 32, tc);
        check_shape(1, 97, 2, 128, tc);  // 32-row shared tiles (always the fp32-FMA kernels)
        check_shape(1, 1, 2, 64, tc);    // one position: softmax over one key
    }

    if (small_shapes()) return test_summary();
    // timed at GPT-2 124M's heads: the tensor-core kernels at the benchmark's
    // B = 64, T = 1024 (the step's shape); the fp32 build's FMA kernels, 8x
    // slower, at B = 8. FLOPs of the causal half (forward 2 matmuls, backward 5)
    int T = 1024, NH = 12, HS = 64;
    for (int tc = 0; tc < 2; tc++) {
        if (tc == 1 && !attention_tc_supports(HS)) break;
        int B = tc ? 64 : 8;
        double fwd = 2.0 * 2.0 * B * NH * (T * (T + 1.0) / 2.0) * HS;
        char name[64];
        float *qkv, *dout;
        AttCtx c = make_ctx(B, T, NH, HS, tc, &qkv, &dout);
        snprintf(name, sizeof(name), "%s attention fwd d12 B%d", tc ? "tc" : "fma", B);
        print_time(name, time_ms(run_forward, &c, 10), 0, fwd);
        snprintf(name, sizeof(name), "%s attention bwd d12 B%d", tc ? "tc" : "fma", B);
        print_time(name, time_ms(run_backward, &c, 10), 0, 2.5 * fwd);
        free(qkv); free(dout);
        free_ctx(&c);
    }
    return test_summary();
}
