/*
 * gelu.cu: the GELU kernels (tanh approximation) of the fp32 build and of
 * the backward's recompute, against the CPU trainer's formula. The bf16
 * build's fused cuBLASLt GELU epilogue is checked in matmul.cu.
 */
#include "llm3d/cuda/gelu.cuh"
#include "dev/cuda/common.h"

typedef struct {
    floatX *out, *d;
    const floatX *x;
    size_t n;
} GeluCtx;

static void run_forward(void *p) {
    GeluCtx *c = (GeluCtx *)p;
    gelu_forward(c->out, c->x, c->n, 0);
}
static void run_backward(void *p) {
    GeluCtx *c = (GeluCtx *)p;
    gelu_backward(c->d, c->x, c->n, 0);
}

int main(void) {
    if (!require_gpu()) return test_summary();
    size_t n = (size_t)shape_size(8 * 1024, 4) * 3072;  // d12's fc output at B = 8 (small: 4 positions)
    float *x = host_random(n, 2.0f, 41), *dout = host_random(n, 1.0f, 42);
    float *y = (float *)malloc(n * 4), *dx = (float *)malloc(n * 4);
    const float k = 0.7978845608028654f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i], u = k * (v + 0.044715f * v * v * v), th = tanhf(u);
        y[i] = 0.5f * v * (1.0f + th);
        dx[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v));
    }
    GeluCtx c = {NULL, to_device(dout, n), to_device(x, n), n};
    CUDA_CHECK(cudaMalloc((void **)&c.out, n * sizeof(floatX)));
    run_forward(&c);
    run_backward(&c);
    float *gy = to_host(c.out, n), *gd = to_host(c.d, n);
    compare("gelu forward", gy, y, n, IS_BF16 ? 1e-2f : 1e-6f);
    compare("gelu backward (in place)", gd, dx, n, IS_BF16 ? 1e-2f : 1e-6f);
    if (small_shapes()) return test_summary();
    print_time("gelu forward", time_ms(run_forward, &c, 20), 2.0 * n * sizeof(floatX), 0);
    print_time("gelu backward", time_ms(run_backward, &c, 20), 3.0 * n * sizeof(floatX), 0);
    return test_summary();
}
