/*
 * encoder.cu: the token + position embedding, forward and backward (the
 * deterministic token-bucket scatter into dwte), against the CPU.
 */
#include "llm3d/cuda/encoder.cuh"
#include "dev/cuda/common.h"

typedef struct {
    floatX *out, *dwte, *dwpe, *dout;
    const floatX *wte, *wpe;
    int *inp, *bstart, *btoken, *bpos;
    int nbuckets, B, T, C, V;
} EncoderCtx;

static void run_forward(void *p) {
    EncoderCtx *c = (EncoderCtx *)p;
    encoder_forward(c->out, c->inp, c->wte, c->wpe, 0, c->V, c->B, c->T, c->C, 0);
}

static void run_backward(void *p) {
    EncoderCtx *c = (EncoderCtx *)p;
    encoder_backward(c->dwte, c->dwpe, c->dout, c->bstart, c->btoken, c->bpos, c->nbuckets, c->B, c->T, c->C, 0);
}

int main(void) {
    if (!require_gpu()) return test_summary();
    // d12 at B = 8 (small: 2 x 64 positions, C = 64, a vocab of 2501)
    int B = shape_size(8, 2), T = shape_size(1024, 64), C = shape_size(768, 64), V = shape_size(50257, 2501), BT = B * T;
    int used = shape_size(1000, 40);  // the tokens the positions take: many repeats
    float *wte = host_random((size_t)V * C, 0.02f, 1), *wpe = host_random((size_t)T * C, 0.02f, 2);
    float *dout = host_random((size_t)BT * C, 1.0f, 3);
    int *inp = (int *)malloc(BT * sizeof(int));
    for (int i = 0; i < BT; i++) inp[i] = (int)(mix64((uint64_t)i) % (uint64_t)used);
    inp[0] = V - 1;

    float *want = (float *)malloc((size_t)BT * C * sizeof(float));
    for (int bt = 0; bt < BT; bt++)
        for (int c = 0; c < C; c++)
            want[(size_t)bt * C + c] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
    float *dwte_want = (float *)calloc((size_t)V * C, sizeof(float)), *dwpe_want = (float *)calloc((size_t)T * C, sizeof(float));
    for (int bt = 0; bt < BT; bt++)
        for (int c = 0; c < C; c++) {
            dwte_want[(size_t)inp[bt] * C + c] += dout[(size_t)bt * C + c];
            dwpe_want[(size_t)(bt % T) * C + c] += dout[(size_t)bt * C + c];
        }

    int *count = (int *)malloc((V + 1) * sizeof(int)), *start = (int *)malloc((BT + 1) * sizeof(int));
    int *token = (int *)malloc(BT * sizeof(int)), *pos = (int *)malloc(BT * sizeof(int));
    int nbuckets = token_buckets(inp, BT, V, 0, V, count, start, token, pos);
    float *zeros = (float *)calloc((size_t)V * C, sizeof(float));
    EncoderCtx ctx = {NULL, to_device(zeros, (size_t)V * C), to_device(zeros, (size_t)T * C), to_device(dout, (size_t)BT * C),
                      to_device(wte, (size_t)V * C), to_device(wpe, (size_t)T * C), to_device_int(inp, BT),
                      to_device_int(start, nbuckets + 1), to_device_int(token, nbuckets), to_device_int(pos, BT),
                      nbuckets, B, T, C, V};
    CUDA_CHECK(cudaMalloc((void **)&ctx.out, (size_t)BT * C * sizeof(floatX)));

    run_forward(&ctx);
    float *got = to_host(ctx.out, (size_t)BT * C);
    compare("encoder forward", got, want, (size_t)BT * C, IS_BF16 ? 1e-2f : 1e-6f);
    run_backward(&ctx);
    float *dwte = to_host(ctx.dwte, (size_t)V * C), *dwpe = to_host(ctx.dwpe, (size_t)T * C);
    // bf16: dwte sums a few rows of N(0,1) per token (BT / used) and rounds once; dwpe sums B
    compare("encoder backward dwte", dwte, dwte_want, (size_t)V * C, IS_BF16 ? 1e-2f : 1e-5f);
    compare("encoder backward dwpe", dwpe, dwpe_want, (size_t)T * C, IS_BF16 ? 1e-2f : 1e-5f);
    run_backward(&ctx);  // a second backward accumulates: twice the gradient
    float *dwte2 = to_host(ctx.dwte, (size_t)V * C);
    for (size_t i = 0; i < (size_t)V * C; i++) dwte_want[i] *= 2.0f;
    compare("encoder backward accumulates", dwte2, dwte_want, (size_t)V * C, IS_BF16 ? 2e-2f : 1e-5f);
    CUDA_CHECK(cudaMemset(ctx.dwte, 0, (size_t)V * C * sizeof(floatX)));
    run_backward(&ctx);
    float *dwte4 = to_host(ctx.dwte, (size_t)V * C);
    CUDA_CHECK(cudaMemset(ctx.dwte, 0, (size_t)V * C * sizeof(floatX)));
    run_backward(&ctx);
    float *dwte5 = to_host(ctx.dwte, (size_t)V * C);
    check(memcmp(dwte4, dwte5, (size_t)V * C * sizeof(float)) == 0, "encoder backward is deterministic");

    // tensor parallel: two vocabulary slices [0, half) with wpe and
    // [half, V) without, each from its own rows, add up to the whole; every
    // token but position 0's (V - 1) is in the lower one
    size_t half = (size_t)shape_size(25000, 1250);
    floatX *out2;
    CUDA_CHECK(cudaMalloc((void **)&out2, (size_t)BT * C * sizeof(floatX)));
    encoder_forward(ctx.out, ctx.inp, ctx.wte, ctx.wpe, 0, (int)half, B, T, C, 0);
    encoder_forward(out2, ctx.inp, ctx.wte + half * C, NULL, (int)half, V - (int)half, B, T, C, 0);
    float *lo = to_host(ctx.out, (size_t)BT * C), *hi = to_host(out2, (size_t)BT * C);
    for (size_t i = 0; i < (size_t)BT * C; i++) lo[i] += hi[i];
    compare("encoder forward over two vocabulary slices", lo, want, (size_t)BT * C, IS_BF16 ? 1e-2f : 1e-6f);
    int *tok_hi = (int *)malloc(BT * sizeof(int));
    int nb_hi = token_buckets(inp, BT, V, (int)half, V - (int)half, count, start, token, tok_hi);
    check(nb_hi == 1 && token[0] == V - 1 - (int)half && start[1] == 1 && tok_hi[0] == 0,
          "the upper slice's buckets: only position 0's token %d, as its row %d", V - 1, token[0]);
    cudaFree(out2);

    if (small_shapes()) return test_summary();
    print_time("encoder forward", time_ms(run_forward, &ctx, 20), 3.0 * BT * C * sizeof(floatX), 0);
    print_time("encoder backward", time_ms(run_backward, &ctx, 20), 4.0 * BT * C * sizeof(floatX), 0);
    return test_summary();
}
