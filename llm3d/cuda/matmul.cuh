/*
 * llm3d/cuda/matmul.cuh: the GEMMs and the column sums of the linear layers.
 *
 * defines:
 *   Blas                     a cuBLASLt handle, its workspace and stream
 *   matmul_forward           out = inp weight^T on cuBLASLt, with the bias
 *                            and GELU epilogues
 *   matmul_backward_dinp     dinp = dout weight on cuBLASLt (times
 *                            gelu'(pre_gelu) when given)
 *   matmul_backward_dweight  dweight += dout^T inp on cuBLASLt
 *   bias_backward            dbias += the column sums of dout
 *   column_sums_kernel, add_column_partials_kernel, colsum_splits, COLSUM_*
 *                            the deterministic column sums behind
 *                            bias_backward and layernorm.cuh's weight and
 *                            bias gradients
 */
#ifndef LLM3D_MATMUL_CUH
#define LLM3D_MATMUL_CUH

#include <stdio.h>
#include <stdlib.h>

#include "llm3d/cuda/cuda_common.cuh"

// ----------------------------------------------------------------------------
// GEMMs through cuBLASLt. cuBLASLt is column-major: a row-major (R x K)
// array is a column-major (K x R) one, so each row-major product below is
// written as the column-major product of the transposes.

typedef struct {
    cublasLtHandle_t handle;
    void *workspace;
    size_t workspace_size;
    cudaStream_t stream;
} Blas;

enum { GELU_NONE, GELU_FORWARD, GELU_BACKWARD };

// D (m x n, ldd) = op(A) op(B) [+ D when accumulate], all column-major, with
// optional bias (length m) and GELU epilogues: GELU_FORWARD writes D =
// gelu(result) and aux = result; GELU_BACKWARD writes D = result * gelu'(aux).
static void matmul_lt(const Blas *blas, floatX *d, const floatX *a, const floatX *b, int m, int n, int k,
                      int transa, int transb, int lda, int ldb, int ldd, int accumulate, const floatX *bias,
                      floatX *aux, int gelu) {
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));  // no TF32: fp32 stays fp32
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (gelu == GELU_FORWARD) epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (gelu == GELU_BACKWARD) epilogue = CUBLASLT_EPILOGUE_DGELU;
    else if (bias) epilogue = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias && gelu != GELU_BACKWARD)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (gelu != GELU_NONE) {
        int64_t aux_ld = m;  // aux has D's shape
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUBLAS_FLOATX, transa ? k : m, transa ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUBLAS_FLOATX, transb ? n : k, transb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUBLAS_FLOATX, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &blas->workspace_size, sizeof(blas->workspace_size)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(blas->handle, desc, la, lb, ld, ld, pref, 1, &heuristic, &found));
    if (found == 0) {
        fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d transa=%d transb=%d epilogue=%d\n", m, n, k,
                transa, transb, (int)epilogue);
        exit(1);
    }
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(blas->handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &heuristic.algo,
                                blas->workspace, blas->workspace_size, blas->stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
}

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias; with pre_gelu != NULL:
// pre_gelu = that, out = gelu(pre_gelu)
static void matmul_forward(const Blas *blas, floatX *out, floatX *pre_gelu, const floatX *inp, const floatX *weight,
                           const floatX *bias, int N, int IC, int OC) {
    matmul_lt(blas, out, weight, inp, OC, N, IC, 1, 0, IC, IC, OC, 0, bias, pre_gelu,
              pre_gelu ? GELU_FORWARD : GELU_NONE);
}

// dinp[N,IC] = dout[N,OC] @ weight[OC,IC] (times gelu'(pre_gelu) when given)
static void matmul_backward_dinp(const Blas *blas, floatX *dinp, const floatX *dout, const floatX *weight,
                                 const floatX *pre_gelu, int N, int IC, int OC) {
    matmul_lt(blas, dinp, weight, dout, IC, N, OC, 0, 0, IC, OC, IC, 0, NULL, (floatX *)pre_gelu,
              pre_gelu ? GELU_BACKWARD : GELU_NONE);
}

// dweight[OC,IC] += dout[N,OC]^T @ inp[N,IC]
static void matmul_backward_dweight(const Blas *blas, floatX *dweight, const floatX *dout, const floatX *inp,
                                    int N, int IC, int OC) {
    matmul_lt(blas, dweight, inp, dout, IC, OC, N, 0, 1, IC, OC, IC, 1, NULL, NULL, GELU_NONE);
}

// ----------------------------------------------------------------------------
// column sums over N rows, for bias gradients (sum of dout) and LayerNorm's
// weight and bias gradients (sum of dout * norm, sum of dout). Pass 1: block
// (x, y) sums the rows of split y for 32*PACK columns into partial[y];
// pass 2 adds the splits in order into the gradient. Deterministic.

constexpr int COLSUM_WARPS = 8;
constexpr int COLSUM_COLS = 32 * PACK;    // columns per block
constexpr int COLSUM_ROWS_PER_SPLIT = 512;
constexpr int COLSUM_MAX_SPLITS = 1024;

// the number of row splits for N rows (the same on every GPU)
static int colsum_splits(int N) {
    int splits = ceil_div(N, COLSUM_ROWS_PER_SPLIT);
    return splits < 1 ? 1 : splits > COLSUM_MAX_SPLITS ? COLSUM_MAX_SPLITS : splits;
}

// with inp == NULL: partial[y*C + c] = sum dout; else partial[y*2C + c] = sum
// dout and partial[y*2C + C + c] = sum dout * (inp - mean) * rstd
__global__ void __launch_bounds__(COLSUM_WARPS * 32)
column_sums_kernel(float *partial, const floatX *dout, const floatX *inp, const float *mean, const float *rstd,
                   int N, int C, int rows_per_split) {
    __shared__ float sums[2][COLSUM_WARPS][COLSUM_COLS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int c0 = blockIdx.x * COLSUM_COLS + lane * PACK;
    int row_begin = blockIdx.y * rows_per_split;
    int row_end = min(N, row_begin + rows_per_split);
    float sum_d[PACK] = {0}, sum_dn[PACK] = {0};
    if (c0 < C) {
        for (int n = row_begin + warp; n < row_end; n += COLSUM_WARPS) {
            Pack d = load_pack(dout + (size_t)n * C + c0);
            if (inp != NULL) {
                Pack x = load_pack(inp + (size_t)n * C + c0);
                float m = mean[n], s = rstd[n];
                for (int k = 0; k < PACK; k++) {
                    float dk = to_f(d.v[k]);
                    sum_d[k] += dk;
                    sum_dn[k] += dk * ((to_f(x.v[k]) - m) * s);
                }
            } else {
                for (int k = 0; k < PACK; k++) sum_d[k] += to_f(d.v[k]);
            }
        }
    }
    for (int k = 0; k < PACK; k++) {
        sums[0][warp][lane * PACK + k] = sum_d[k];
        sums[1][warp][lane * PACK + k] = sum_dn[k];
    }
    __syncthreads();
    int kinds = inp != NULL ? 2 : 1;
    size_t stride = (size_t)kinds * C;
    for (int i = threadIdx.x; i < kinds * COLSUM_COLS; i += blockDim.x) {
        int kind = i / COLSUM_COLS, col = i % COLSUM_COLS, c = blockIdx.x * COLSUM_COLS + col;
        if (c >= C) continue;
        float s = 0.0f;
        for (int w = 0; w < COLSUM_WARPS; w++) s += sums[kind][w][col];
        partial[blockIdx.y * stride + (size_t)kind * C + c] = s;
    }
}

// out0[c] += sum over splits of partial[y*stride + c]; out1 likewise from
// partial[y*stride + C + c] when not NULL
__global__ void add_column_partials_kernel(floatX *out0, floatX *out1, const float *partial, int splits, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    size_t stride = (size_t)(out1 != NULL ? 2 : 1) * C;
    float s0 = 0.0f, s1 = 0.0f;
    for (int y = 0; y < splits; y++) {
        s0 += partial[y * stride + c];
        if (out1 != NULL) s1 += partial[y * stride + C + c];
    }
    out0[c] = to_x(to_f(out0[c]) + s0);
    if (out1 != NULL) out1[c] = to_x(to_f(out1[c]) + s1);
}

// ----------------------------------------------------------------------------
// kernel launchers

// dbias[OC] += column sums of dout[N,OC]; partial is scratch of colsum_splits(N) * OC floats
static void bias_backward(floatX *dbias, const floatX *dout, float *partial, int N, int OC, cudaStream_t stream) {
    int splits = colsum_splits(N);
    dim3 grid(ceil_div(OC, COLSUM_COLS), splits);
    column_sums_kernel<<<grid, COLSUM_WARPS * 32, 0, stream>>>(partial, dout, NULL, NULL, NULL, N, OC,
                                                               ceil_div(N, splits));
    CUDA_CHECK(cudaGetLastError());
    add_column_partials_kernel<<<ceil_div(OC, 256), 256, 0, stream>>>(dbias, NULL, partial, splits, OC);
    CUDA_CHECK(cudaGetLastError());
}

#endif
