/*
 * train_gpt2.cu: GPT-2 training on one NVIDIA GPU.
 *
 * The same model, loop, flags, printed lines and JSON log as train_gpt2.c,
 * with hand-written kernels (forward and backward side by side) and the
 * GEMMs through cuBLASLt. doc/gpu.md has the longer story.
 *
 * Precision. The default build is bf16 mixed precision: parameters,
 * activations and gradients in bf16, fp32 master weights and fp32 AdamW m/v;
 * every kernel accumulates in fp32. -DENABLE_FP32 (make PRECISION=FP32)
 * builds the same program with fp32 everywhere (no TF32), for exact
 * comparisons with the CPU trainer and PyTorch.
 *
 * Determinism. No kernel uses floating-point atomics; every reduction has a
 * fixed order (partial sums per block, then one pass over the partials), so
 * two runs on the same GPU give bit-identical losses.
 *
 * Shapes: B batch, T time, C channels, NH heads, HS = C/NH head size,
 * L layers, V vocab, Vp padded vocab (the rows of wte), BT = B*T rows.
 * Row-major everywhere, as in train_gpt2.c.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#include "gpt2.h"
#include "dataloader.h"
#include "tokenizer.h"
#include "parallel.h"
#include "checkpoint.h"

// ----------------------------------------------------------------------------
// precision

#ifdef ENABLE_FP32
typedef float floatX;
static const char *precision_name = "fp32";
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
static __device__ __forceinline__ float to_f(float x) { return x; }
static __device__ __forceinline__ float to_x(float x) { return x; }
#else
typedef __nv_bfloat16 floatX;
static const char *precision_name = "bf16";
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ __nv_bfloat16 to_x(float x) { return __float2bfloat16_rn(x); }
#endif

// 16 bytes of floatX: 8 bf16 or 4 fp32, the unit of every vectorized load.
// Every row length the kernels see (C, 3C, 4C, Vp) is a multiple of PACK.
constexpr int PACK = 16 / sizeof(floatX);
struct alignas(16) Pack { floatX v[PACK]; };

static __device__ __forceinline__ Pack load_pack(const floatX *p) { return *reinterpret_cast<const Pack *>(p); }
static __device__ __forceinline__ void store_pack(floatX *p, Pack x) { *reinterpret_cast<Pack *>(p) = x; }

// 4 consecutive floatX as a float4 (8-byte aligned for bf16, 16 for fp32)
static __device__ __forceinline__ float4 load4(const floatX *p) {
#ifdef ENABLE_FP32
    return *reinterpret_cast<const float4 *>(p);
#else
    const __nv_bfloat162 *q = reinterpret_cast<const __nv_bfloat162 *>(p);
    float2 a = __bfloat1622float2(q[0]), b = __bfloat1622float2(q[1]);
    return make_float4(a.x, a.y, b.x, b.y);
#endif
}

static __device__ __forceinline__ void store4(floatX *p, float4 x) {
#ifdef ENABLE_FP32
    *reinterpret_cast<float4 *>(p) = x;
#else
    __nv_bfloat162 *q = reinterpret_cast<__nv_bfloat162 *>(p);
    q[0] = __floats2bfloat162_rn(x.x, x.y);
    q[1] = __floats2bfloat162_rn(x.z, x.w);
#endif
}

// ----------------------------------------------------------------------------
// errors: a failed CUDA or cuBLAS call is a runtime error of the program

static void cuda_check(cudaError_t e, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "%s:%d: CUDA error %d: %s\n", file, line, (int)e, cudaGetErrorString(e));
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), __FILE__, __LINE__)

static void cublas_check(cublasStatus_t s, const char *file, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "%s:%d: cuBLAS error %d\n", file, line, (int)s);
    exit(1);
}
#define CUBLAS_CHECK(call) cublas_check((call), __FILE__, __LINE__)

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

// ----------------------------------------------------------------------------
// reductions inside a warp and a block (fixed order: deterministic)

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it
static __device__ float block_sum(float v) {
    __shared__ float shared[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // shared may still be read by a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(v);
}

// ----------------------------------------------------------------------------
// encoder: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]

__global__ void encoder_forward_kernel(floatX *out, const int *inp, const floatX *wte, const floatX *wpe,
                                       int BT, int T, int C) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (idx >= (size_t)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C);
    Pack a = load_pack(wte + (size_t)inp[bt] * C + c), b = load_pack(wpe + (size_t)(bt % T) * C + c), o;
    for (int k = 0; k < PACK; k++) o.v[k] = to_x(to_f(a.v[k]) + to_f(b.v[k]));
    store_pack(out + idx, o);
}

// dwpe[t,:] += sum over b of dout[b,t,:]
__global__ void encoder_backward_wpe_kernel(floatX *dwpe, const floatX *dout, int B, int T, int C) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (idx >= (size_t)T * C) return;
    float acc[PACK] = {0};
    for (int b = 0; b < B; b++) {
        Pack d = load_pack(dout + (size_t)b * T * C + idx);
        for (int k = 0; k < PACK; k++) acc[k] += to_f(d.v[k]);
    }
    Pack w = load_pack(dwpe + idx);
    for (int k = 0; k < PACK; k++) w.v[k] = to_x(to_f(w.v[k]) + acc[k]);
    store_pack(dwpe + idx, w);
}

// dwte[token,:] += the rows of dout at the positions holding that token. The
// host groups positions by token (token_buckets below), so each block owns
// one token's row: no two blocks write the same row, no atomics.
__global__ void encoder_backward_wte_kernel(floatX *dwte, const floatX *dout, const int *bucket_start,
                                            const int *bucket_token, const int *bucket_pos, int C) {
    int bucket = blockIdx.x;
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * PACK;
    if (c >= C) return;
    float acc[PACK] = {0};
    for (int j = bucket_start[bucket]; j < bucket_start[bucket + 1]; j++) {
        Pack d = load_pack(dout + (size_t)bucket_pos[j] * C + c);
        for (int k = 0; k < PACK; k++) acc[k] += to_f(d.v[k]);
    }
    floatX *row = dwte + (size_t)bucket_token[bucket] * C + c;
    Pack w = load_pack(row);
    for (int k = 0; k < PACK; k++) w.v[k] = to_x(to_f(w.v[k]) + acc[k]);
    store_pack(row, w);
}

// groups the BT positions by token with a stable counting sort: bucket i is
// token bucket_token[i] at positions bucket_pos[bucket_start[i] ..
// bucket_start[i+1]), in increasing order. count is scratch of V+1 ints.
// Returns the number of buckets, or -1 if a token is outside [0, V).
static int token_buckets(const int *inputs, int BT, int V, int *count, int *bucket_start, int *bucket_token,
                         int *bucket_pos) {
    memset(count, 0, (size_t)(V + 1) * sizeof(int));
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) return -1;
        count[inputs[i] + 1]++;
    }
    int nbuckets = 0;
    for (int v = 0; v < V; v++) {
        if (count[v + 1] > 0) {
            bucket_token[nbuckets] = v;
            bucket_start[nbuckets] = count[v];  // the prefix sum so far
            nbuckets++;
        }
        count[v + 1] += count[v];
    }
    bucket_start[nbuckets] = BT;
    for (int i = 0; i < BT; i++) bucket_pos[count[inputs[i]]++] = i;
    return nbuckets;
}

// ----------------------------------------------------------------------------
// LayerNorm over C, eps 1e-5, one warp per row; saves mean and 1/std

static __device__ void layernorm_row(floatX *out, float *mean, float *rstd, const floatX *x, const floatX *weight,
                                     const floatX *bias, int C) {
    int lane = threadIdx.x % 32;
    float sum = 0.0f;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c);
        for (int k = 0; k < PACK; k++) sum += to_f(p.v[k]);
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;  // two passes, as the CPU trainer: no cancellation
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c);
        for (int k = 0; k < PACK; k++) {
            float d = to_f(p.v[k]) - m;
            var += d * d;
        }
    }
    float s = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack p = load_pack(x + c), w = load_pack(weight + c), b = load_pack(bias + c), o;
        for (int k = 0; k < PACK; k++) o.v[k] = to_x((to_f(p.v[k]) - m) * s * to_f(w.v[k]) + to_f(b.v[k]));
        store_pack(out + c, o);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(floatX *out, float *mean, float *rstd, const floatX *inp,
                                         const floatX *weight, const floatX *bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    layernorm_row(out + (size_t)row * C, mean + row, rstd + row, inp + (size_t)row * C, weight, bias, C);
}

// residual = a + b (rounded to floatX, as the backward will read it back),
// then out = LayerNorm(residual): the residual add and the next block's
// first LayerNorm in one pass over the row
__global__ void residual_layernorm_forward_kernel(floatX *residual, floatX *out, float *mean, float *rstd,
                                                  const floatX *a, const floatX *b, const floatX *weight,
                                                  const floatX *bias, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    for (int c = (threadIdx.x % 32) * PACK; c < C; c += 32 * PACK) {
        Pack x = load_pack(a + off + c), y = load_pack(b + off + c), r;
        for (int k = 0; k < PACK; k++) r.v[k] = to_x(to_f(x.v[k]) + to_f(y.v[k]));
        store_pack(residual + off + c, r);
    }
    // each lane reads back only the packs it wrote itself: no barrier needed
    layernorm_row(out + off, mean + row, rstd + row, residual + off, weight, bias, C);
}

// dinp += the LayerNorm backward of dout; the parameter gradients are
// column sums (column_sums_kernel)
__global__ void layernorm_backward_dinp_kernel(floatX *dinp, const floatX *dout, const floatX *inp,
                                               const floatX *weight, const float *mean, const float *rstd,
                                               int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    int lane = threadIdx.x % 32;
    size_t off = (size_t)row * C;
    float m = mean[row], s = rstd[row];
    // dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = weight * dout
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack d = load_pack(dout + off + c), x = load_pack(inp + off + c), w = load_pack(weight + c);
        for (int k = 0; k < PACK; k++) {
            float norm = (to_f(x.v[k]) - m) * s, dnorm = to_f(w.v[k]) * to_f(d.v[k]);
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane * PACK; c < C; c += 32 * PACK) {
        Pack d = load_pack(dout + off + c), x = load_pack(inp + off + c), w = load_pack(weight + c);
        Pack g = load_pack(dinp + off + c);
        for (int k = 0; k < PACK; k++) {
            float norm = (to_f(x.v[k]) - m) * s, dnorm = to_f(w.v[k]) * to_f(d.v[k]);
            g.v[k] = to_x(to_f(g.v[k]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
        }
        store_pack(dinp + off + c, g);
    }
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
// GELU, tanh approximation (GPT-2's). The bf16 build fuses it into the fc
// matmul (cuBLASLt epilogue); these kernels serve the fp32 build and the
// recompute in the backward.

static __device__ __forceinline__ float gelu_value(float x) {
    const float k = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static __device__ __forceinline__ float gelu_slope(float x) {
    const float k = 0.7978845608028654f;
    float th = tanhf(k * (x + 0.044715f * x * x * x));
    float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

__global__ void gelu_forward_kernel(floatX *out, const floatX *inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (i >= n) return;
    Pack x = load_pack(inp + i), o;
    for (int k = 0; k < PACK; k++) o.v[k] = to_x(gelu_value(to_f(x.v[k])));
    store_pack(out + i, o);
}

// d holds dout on entry and dinp on exit: d *= gelu'(inp)
__global__ void gelu_backward_kernel(floatX *d, const floatX *inp, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (i >= n) return;
    Pack x = load_pack(inp + i), g = load_pack(d + i);
    for (int k = 0; k < PACK; k++) g.v[k] = to_x(to_f(g.v[k]) * gelu_slope(to_f(x.v[k])));
    store_pack(d + i, g);
}

// ----------------------------------------------------------------------------
// causal self-attention, flash style: no T x T matrix in memory.
//
// qkv is (B, T, 3C): q, k, v of head h at columns h*HS, C + h*HS, 2C + h*HS.
// out is (B, T, C). lse (B, NH, T) keeps each query row's log-sum-exp of its
// scores, in base 2 (scores are pre-multiplied by log2(e)/sqrt(HS) so the
// kernels use exp2), for the backward to rebuild the softmax.
//
// Layout of a block: 64 rows (queries, or keys in the dK/dV kernel) x 4
// lanes per row = 256 threads. Lane g of a row holds the row's float4 chunks
// g, g+4, g+8, ... so the 4 lanes of a row read 64 adjacent bytes of shared
// memory (no bank conflicts); a dot product is 4 partial sums and two
// shuffles. Tiles of the other side (keys, or queries) sit in shared memory in
// fp32. All accumulation is fp32. Control flow is uniform inside each warp
// (masking, not branching), so full-warp shuffles are always legal.

constexpr int ATT_ROWS = 64;
constexpr int ATT_LANES = 4;
constexpr int ATT_THREADS = ATT_ROWS * ATT_LANES;
constexpr int ATT_ROWS_PER_WARP = 32 / ATT_LANES;

static __host__ __device__ constexpr int att_tile(int hs) { return hs <= 64 ? 64 : 32; }  // shared tile rows

static __device__ __forceinline__ float row_sum(float v) {  // over the 4 lanes of a row
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

static __device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
static __device__ __forceinline__ float4 scale4(float4 a, float s) { return make_float4(a.x * s, a.y * s, a.z * s, a.w * s); }
static __device__ __forceinline__ void axpy4(float4 *y, float a, float4 x) {
    y->x += a * x.x; y->y += a * x.y; y->z += a * x.z; y->w += a * x.w;
}

static const float LOG2E = 1.4426950408889634f;

template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(floatX *out, float *lse, const floatX *qkv, int T, int NH) {
    constexpr int KEYS = att_tile(HS), HS4 = HS / 4, CH = HS4 / ATT_LANES;
    __shared__ float4 sk[KEYS][HS4], sv[KEYS][HS4];
    int C = NH * HS, C3 = 3 * C;
    int qtile = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    int h = blockIdx.y, b = blockIdx.z;
    int row = threadIdx.x / ATT_LANES, g = threadIdx.x % ATT_LANES;
    int t = qtile * ATT_ROWS + row;
    int t_load = min(t, T - 1);  // rows past T compute on a real row and write nothing
    int warp_last_t = qtile * ATT_ROWS + (threadIdx.x / 32 + 1) * ATT_ROWS_PER_WARP - 1;
    const floatX *seq = qkv + (size_t)b * T * C3;
    float scale = LOG2E / sqrtf((float)HS);

    float4 q[CH], o[CH];
    for (int i = 0; i < CH; i++) {
        q[i] = scale4(load4(seq + (size_t)t_load * C3 + h * HS + 4 * (i * ATT_LANES + g)), scale);
        o[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float m = -INFINITY, l = 0.0f;  // running max and sum of exp2(score - m)
    int kend = min(T, (qtile + 1) * ATT_ROWS);
    for (int k0 = 0; k0 < kend; k0 += KEYS) {
        __syncthreads();  // the previous tile is no longer read
        for (int idx = threadIdx.x; idx < KEYS * HS4; idx += ATT_THREADS) {
            int j = idx / HS4, ch = idx % HS4, key = min(k0 + j, T - 1);  // keys past T are masked below
            const floatX *src = seq + (size_t)key * C3 + h * HS + 4 * ch;
            sk[j][ch] = load4(src + C);
            sv[j][ch] = load4(src + 2 * C);
        }
        __syncthreads();
        for (int j0 = 0; j0 < KEYS; j0 += 16) {
            if (k0 + j0 > warp_last_t) break;  // in the future of every row of this warp
            float s[16], m_new = m;
#pragma unroll
            for (int jj = 0; jj < 16; jj++) {
                float d = 0.0f;
#pragma unroll
                for (int i = 0; i < CH; i++) d += dot4(q[i], sk[j0 + jj][i * ATT_LANES + g]);
                d = row_sum(d);
                s[jj] = k0 + j0 + jj <= t ? d : -INFINITY;
                m_new = fmaxf(m_new, s[jj]);
            }
            // key 0 is in every row's past, so m_new is finite from the first chunk on
            float corr = exp2f(m - m_new);
            l *= corr;
            for (int i = 0; i < CH; i++) o[i] = scale4(o[i], corr);
#pragma unroll
            for (int jj = 0; jj < 16; jj++) {
                float p = exp2f(s[jj] - m_new);
                l += p;
#pragma unroll
                for (int i = 0; i < CH; i++) axpy4(&o[i], p, sv[j0 + jj][i * ATT_LANES + g]);
            }
            m = m_new;
        }
    }
    if (t < T) {
        float inv = 1.0f / l;
        floatX *dst = out + ((size_t)b * T + t) * C + h * HS;
        for (int i = 0; i < CH; i++) store4(dst + 4 * (i * ATT_LANES + g), scale4(o[i], inv));
        if (g == 0) lse[((size_t)b * NH + h) * T + t] = m + log2f(l);
    }
}

// delta[b,h,t] = dout[b,t,h,:] . out[b,t,h,:], the softmax backward's row term
__global__ void attention_delta_kernel(float *delta, const floatX *out, const floatX *dout, int B, int T, int NH,
                                       int HS) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * NH) return;
    int h = (int)(idx % NH);
    size_t bt = idx / NH;
    int b = (int)(bt / T), t = (int)(bt % T), C = NH * HS;
    const floatX *o = out + bt * C + h * HS, *d = dout + bt * C + h * HS;
    float sum = 0.0f;
    for (int i = 0; i < HS; i += 4) sum += dot4(load4(o + i), load4(d + i));
    delta[((size_t)b * NH + h) * T + t] = sum;
}

// dq for a tile of query rows, walking the key tiles in its past. With
// p = exp2(s - lse) the softmax, dp = dout . v, ds = p (dp - delta):
// dq = sum over keys of ds k / sqrt(HS). The dK/dV kernel below walks the
// other way; splitting them keeps every gradient row owned by one block.
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dq_kernel(floatX *dqkv, const floatX *qkv, const floatX *dout, const float *lse,
                             const float *delta, int T, int NH) {
    constexpr int KEYS = att_tile(HS), HS4 = HS / 4, CH = HS4 / ATT_LANES;
    __shared__ float4 sk[KEYS][HS4], sv[KEYS][HS4];
    int C = NH * HS, C3 = 3 * C;
    int qtile = gridDim.x - 1 - blockIdx.x;
    int h = blockIdx.y, b = blockIdx.z;
    int row = threadIdx.x / ATT_LANES, g = threadIdx.x % ATT_LANES;
    int t = qtile * ATT_ROWS + row;
    int t_load = min(t, T - 1);
    int warp_last_t = qtile * ATT_ROWS + (threadIdx.x / 32 + 1) * ATT_ROWS_PER_WARP - 1;
    const floatX *seq = qkv + (size_t)b * T * C3;
    float scale = LOG2E / sqrtf((float)HS);

    float4 q[CH], d_o[CH], dq[CH];
    for (int i = 0; i < CH; i++) {
        int col = h * HS + 4 * (i * ATT_LANES + g);
        q[i] = scale4(load4(seq + (size_t)t_load * C3 + col), scale);
        d_o[i] = load4(dout + ((size_t)b * T + t_load) * C + col);
        dq[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    size_t stat = ((size_t)b * NH + h) * T + t_load;
    float lse_t = lse[stat], delta_t = delta[stat];
    int kend = min(T, (qtile + 1) * ATT_ROWS);
    for (int k0 = 0; k0 < kend; k0 += KEYS) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < KEYS * HS4; idx += ATT_THREADS) {
            int j = idx / HS4, ch = idx % HS4, key = min(k0 + j, T - 1);
            const floatX *src = seq + (size_t)key * C3 + h * HS + 4 * ch;
            sk[j][ch] = load4(src + C);
            sv[j][ch] = load4(src + 2 * C);
        }
        __syncthreads();
        for (int j = 0; j < KEYS; j++) {
            if (k0 + j > warp_last_t) break;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < CH; i++) {
                s += dot4(q[i], sk[j][i * ATT_LANES + g]);
                dp += dot4(d_o[i], sv[j][i * ATT_LANES + g]);
            }
            s = row_sum(s);
            dp = row_sum(dp);
            float p = k0 + j <= t ? exp2f(s - lse_t) : 0.0f;
            float ds = p * (dp - delta_t);
#pragma unroll
            for (int i = 0; i < CH; i++) axpy4(&dq[i], ds, sk[j][i * ATT_LANES + g]);
        }
    }
    if (t < T) {
        float inv_sqrt = 1.0f / sqrtf((float)HS);
        floatX *dst = dqkv + ((size_t)b * T + t) * C3 + h * HS;
        for (int i = 0; i < CH; i++) store4(dst + 4 * (i * ATT_LANES + g), scale4(dq[i], inv_sqrt));
    }
}

// dk and dv for a tile of key rows, walking the query tiles in its future:
// dv = sum over queries of p dout, dk = sum of ds q / sqrt(HS)
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dkdv_kernel(floatX *dqkv, const floatX *qkv, const floatX *dout, const float *lse,
                               const float *delta, int T, int NH) {
    constexpr int QUERIES = att_tile(HS), HS4 = HS / 4, CH = HS4 / ATT_LANES;
    __shared__ float4 sq[QUERIES][HS4], sdo[QUERIES][HS4];
    __shared__ float slse[QUERIES], sdelta[QUERIES];
    int C = NH * HS, C3 = 3 * C;
    int ktile = blockIdx.x;  // the early keys have the most queries: first
    int h = blockIdx.y, b = blockIdx.z;
    int row = threadIdx.x / ATT_LANES, g = threadIdx.x % ATT_LANES;
    int s_key = ktile * ATT_ROWS + row;
    int s_load = min(s_key, T - 1);
    int warp_first_s = ktile * ATT_ROWS + (threadIdx.x / 32) * ATT_ROWS_PER_WARP;
    const floatX *seq = qkv + (size_t)b * T * C3;
    const size_t stat0 = ((size_t)b * NH + h) * T;
    float scale = LOG2E / sqrtf((float)HS);

    float4 k[CH], v[CH], dk[CH], dv[CH];
    for (int i = 0; i < CH; i++) {
        const floatX *src = seq + (size_t)s_load * C3 + h * HS + 4 * (i * ATT_LANES + g);
        k[i] = scale4(load4(src + C), scale);
        v[i] = load4(src + 2 * C);
        dk[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        dv[i] = dk[i];
    }
    for (int q0 = ktile * ATT_ROWS; q0 < T; q0 += QUERIES) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < QUERIES * HS4; idx += ATT_THREADS) {
            int j = idx / HS4, ch = idx % HS4, tq = min(q0 + j, T - 1);  // queries past T are masked below
            sq[j][ch] = load4(seq + (size_t)tq * C3 + h * HS + 4 * ch);
            sdo[j][ch] = load4(dout + ((size_t)b * T + tq) * C + h * HS + 4 * ch);
        }
        for (int j = threadIdx.x; j < QUERIES; j += ATT_THREADS) {
            int tq = min(q0 + j, T - 1);
            slse[j] = lse[stat0 + tq];
            sdelta[j] = delta[stat0 + tq];
        }
        __syncthreads();
        int jstart = max(0, warp_first_s - q0);  // queries before the warp's first key see none of its keys
        for (int j = jstart; j < QUERIES; j++) {
            int tq = q0 + j;
            float s = 0.0f, dp = 0.0f;
#pragma unroll
            for (int i = 0; i < CH; i++) {
                s += dot4(k[i], sq[j][i * ATT_LANES + g]);
                dp += dot4(v[i], sdo[j][i * ATT_LANES + g]);
            }
            s = row_sum(s);
            dp = row_sum(dp);
            float p = tq >= s_key && tq < T ? exp2f(s - slse[j]) : 0.0f;
            float ds = p * (dp - sdelta[j]);
#pragma unroll
            for (int i = 0; i < CH; i++) {
                axpy4(&dv[i], p, sdo[j][i * ATT_LANES + g]);
                axpy4(&dk[i], ds, sq[j][i * ATT_LANES + g]);
            }
        }
    }
    if (s_key < T) {
        float inv_sqrt = 1.0f / sqrtf((float)HS);
        floatX *dst = dqkv + ((size_t)b * T + s_key) * C3 + h * HS;
        for (int i = 0; i < CH; i++) {
            store4(dst + C + 4 * (i * ATT_LANES + g), scale4(dk[i], inv_sqrt));
            store4(dst + 2 * C + 4 * (i * ATT_LANES + g), dv[i]);
        }
    }
}

#ifndef ENABLE_FP32
// ----------------------------------------------------------------------------
// causal flash attention on tensor cores (bf16 build): the same maths, lse
// and data layout as the kernels above, with the four products per tile
// (S = Q K^T, O += P V, dP = dO V^T, dQ/dK/dV += dS K / dS^T Q / P^T dO) as
// mma.sync m16n8k16 (bf16 inputs, fp32 accumulators). A warp owns 16 rows; a
// block is 4 warps = 64 rows; the other side's tile (64 rows) sits in shared
// memory in bf16, row-major and, where a product needs it, transposed.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), lane = 4 * gid + tig:
//   A (16x16, row-major): a0 = A[gid][2tig..2tig+1], a1 = A[gid+8][2tig..],
//                         a2 = A[gid][2tig+8..],     a3 = A[gid+8][2tig+8..]
//   B (16x8, "col"):      b0 = B[2tig..2tig+1][gid], b1 = B[2tig+8..2tig+9][gid]
//   C (16x8, fp32):       c0,c1 = C[gid][2tig..2tig+1], c2,c3 = C[gid+8][2tig..]
// so two C tiles side by side (16 x 16) are, packed to bf16, exactly an A
// fragment: the softmax stays in registers between the two products. Each
// 32-bit register holds two bf16, the lower-indexed one in the low half.
// Shared rows are padded by 8 bf16 so the 8 rows a B fragment reads fall in
// 8 different bank groups.

constexpr int TC_ROWS = 64;         // rows per block, 16 per warp
constexpr int TC_THREADS = 128;
constexpr int TC_PAD = 8;

static __device__ __forceinline__ void mma_16816(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t pair_at(const __nv_bfloat16 *p) { return *reinterpret_cast<const uint32_t *>(p); }

// the A fragments of rows r_lo = row0 + gid and r_hi = r_lo + 8 of a (rows,
// HS) slice with row stride ld, for the HS/16 k-steps
template <int HS>
static __device__ __forceinline__ void load_a_rows(uint32_t a[][4], const __nv_bfloat16 *base, size_t ld, int r_lo,
                                                   int r_hi, int tig) {
    #pragma unroll
    for (int ks = 0; ks < HS / 16; ks++) {
        const __nv_bfloat16 *lo = base + (size_t)r_lo * ld + ks * 16 + 2 * tig, *hi = base + (size_t)r_hi * ld + ks * 16 + 2 * tig;
        a[ks][0] = pair_at(lo);
        a[ks][1] = pair_at(hi);
        a[ks][2] = pair_at(lo + 8);
        a[ks][3] = pair_at(hi + 8);
    }
}

// copies rows row0..row0+63 (clamped to T-1) of one head's HS columns into
// shared memory: row-major into rm (if not NULL) and transposed into tr (if
// not NULL). src points at the head's column 0 of sequence row 0.
template <int HS>
static __device__ __forceinline__ void load_tile(__nv_bfloat16 (*rm)[HS + TC_PAD], __nv_bfloat16 (*tr)[TC_ROWS + TC_PAD],
                                                 const __nv_bfloat16 *src, size_t ld, int row0, int T) {
    for (int idx = threadIdx.x; idx < TC_ROWS * HS / 8; idx += TC_THREADS) {
        int j = idx / (HS / 8), c = (idx % (HS / 8)) * 8, row = min(row0 + j, T - 1);
        uint4 v = *reinterpret_cast<const uint4 *>(src + (size_t)row * ld + c);
        if (rm != NULL) *reinterpret_cast<uint4 *>(&rm[j][c]) = v;
        if (tr != NULL) {
            const __nv_bfloat16 *e = reinterpret_cast<const __nv_bfloat16 *>(&v);
            for (int k = 0; k < 8; k++) tr[c + k][j] = e[k];
        }
    }
}

template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attention_forward_tc_kernel(floatX *out, float *lse, const floatX *qkv, int T, int NH) {
    constexpr int KS = HS / 16, DN = HS / 8;  // k-steps over the head, 8-column tiles of the head
    __shared__ __align__(16) __nv_bfloat16 sk[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 svt[HS][TC_ROWS + TC_PAD];
    int C = NH * HS, C3 = 3 * C;
    int qtile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    int row0 = qtile * TC_ROWS + warp * 16, r_lo = row0 + gid, r_hi = r_lo + 8;
    const floatX *seq = qkv + (size_t)b * T * C3 + h * HS;
    float scale = LOG2E / sqrtf((float)HS);

    uint32_t qa[KS][4];
    load_a_rows<HS>(qa, seq, C3, min(r_lo, T - 1), min(r_hi, T - 1), tig);
    float o[DN][4];
    for (int d = 0; d < DN; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // l: this thread's columns only
    int kend = min(T, (qtile + 1) * TC_ROWS);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        __syncthreads();
        load_tile<HS>(sk, NULL, seq + C, C3, k0, T);
        load_tile<HS>(NULL, svt, seq + 2 * C, C3, k0, T);
        __syncthreads();
        float s[8][4];
        float mx_lo = m_lo, mx_hi = m_hi;
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            if (k0 + n * 8 <= row0 + 15) {  // warp-uniform: a tile wholly in the warp's future is all masked
                #pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const __nv_bfloat16 *kr = &sk[n * 8 + gid][ks * 16 + 2 * tig];
                    mma_16816(s[n], qa[ks], pair_at(kr), pair_at(kr + 8));
                }
            }
            int key = k0 + n * 8 + 2 * tig;
            s[n][0] = key <= r_lo ? s[n][0] * scale : -INFINITY;
            s[n][1] = key + 1 <= r_lo ? s[n][1] * scale : -INFINITY;
            s[n][2] = key <= r_hi ? s[n][2] * scale : -INFINITY;
            s[n][3] = key + 1 <= r_hi ? s[n][3] * scale : -INFINITY;
            mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
        }
        for (int off = 1; off < 4; off *= 2) {  // over the 4 lanes that share the rows
            mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
            mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
        }
        // key 0 is in every row's past, so the maxima are finite from the first tile on
        float c_lo = exp2f(m_lo - mx_lo), c_hi = exp2f(m_hi - mx_hi);
        m_lo = mx_lo;
        m_hi = mx_hi;
        l_lo *= c_lo;
        l_hi *= c_hi;
        #pragma unroll
        for (int d = 0; d < DN; d++) {
            o[d][0] *= c_lo; o[d][1] *= c_lo;
            o[d][2] *= c_hi; o[d][3] *= c_hi;
        }
        #pragma unroll
        for (int kk = 0; kk < 4; kk++) {  // 16 keys at a time: n-tiles 2kk and 2kk+1
            if (k0 + kk * 16 > row0 + 15) break;
            float p[8];
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = exp2f(s[2 * kk][e] - (e < 2 ? m_lo : m_hi));
                p[4 + e] = exp2f(s[2 * kk + 1][e] - (e < 2 ? m_lo : m_hi));
            }
            l_lo += p[0] + p[1] + p[4] + p[5];
            l_hi += p[2] + p[3] + p[6] + p[7];
            uint32_t pa[4] = {pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]), pack_bf16(p[4], p[5]), pack_bf16(p[6], p[7])};
            #pragma unroll
            #pragma unroll
        for (int d = 0; d < DN; d++) {
                const __nv_bfloat16 *vr = &svt[d * 8 + gid][kk * 16 + 2 * tig];
                mma_16816(o[d], pa, pair_at(vr), pair_at(vr + 8));
            }
        }
    }
    for (int off = 1; off < 4; off *= 2) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
    }
    floatX *dst = out + (size_t)b * T * C + h * HS + 2 * tig;
    if (r_lo < T) {
        for (int d = 0; d < DN; d++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_lo * C + d * 8) = __floats2bfloat162_rn(o[d][0] / l_lo, o[d][1] / l_lo);
        if (tig == 0) lse[((size_t)b * NH + h) * T + r_lo] = m_lo + log2f(l_lo);
    }
    if (r_hi < T) {
        for (int d = 0; d < DN; d++)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_hi * C + d * 8) = __floats2bfloat162_rn(o[d][2] / l_hi, o[d][3] / l_hi);
        if (tig == 0) lse[((size_t)b * NH + h) * T + r_hi] = m_hi + log2f(l_hi);
    }
}

// dq for 64 query rows: per 16 keys, S and dP (two products), p and ds in
// registers, then dq += ds K
template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attention_backward_dq_tc_kernel(floatX *dqkv, const floatX *qkv, const floatX *dout, const float *lse,
                                const float *delta, int T, int NH) {
    constexpr int KS = HS / 16, DN = HS / 8;
    __shared__ __align__(16) __nv_bfloat16 sk[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 sv[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 skt[HS][TC_ROWS + TC_PAD];
    int C = NH * HS, C3 = 3 * C;
    int qtile = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    int row0 = qtile * TC_ROWS + warp * 16, r_lo = row0 + gid, r_hi = r_lo + 8;
    int rl_lo = min(r_lo, T - 1), rl_hi = min(r_hi, T - 1);
    const floatX *seq = qkv + (size_t)b * T * C3 + h * HS;
    float scale = LOG2E / sqrtf((float)HS);

    uint32_t qa[KS][4], da[KS][4];
    load_a_rows<HS>(qa, seq, C3, rl_lo, rl_hi, tig);
    load_a_rows<HS>(da, dout + (size_t)b * T * C + h * HS, C, rl_lo, rl_hi, tig);
    size_t stat = ((size_t)b * NH + h) * T;
    float lse_lo = lse[stat + rl_lo], lse_hi = lse[stat + rl_hi];
    float dl_lo = delta[stat + rl_lo], dl_hi = delta[stat + rl_hi];
    float dq[DN][4];
    for (int d = 0; d < DN; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    int kend = min(T, (qtile + 1) * TC_ROWS);
    for (int k0 = 0; k0 < kend; k0 += TC_ROWS) {
        __syncthreads();
        load_tile<HS>(sk, skt, seq + C, C3, k0, T);
        load_tile<HS>(sv, NULL, seq + 2 * C, C3, k0, T);
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (k0 + kk * 16 > row0 + 15) break;
            float ds[8];
            #pragma unroll
            for (int half = 0; half < 2; half++) {
                int n = 2 * kk + half;
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                #pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const __nv_bfloat16 *kr = &sk[n * 8 + gid][ks * 16 + 2 * tig], *vr = &sv[n * 8 + gid][ks * 16 + 2 * tig];
                    mma_16816(s, qa[ks], pair_at(kr), pair_at(kr + 8));
                    mma_16816(dp, da[ks], pair_at(vr), pair_at(vr + 8));
                }
                int key = k0 + n * 8 + 2 * tig;
                #pragma unroll
            for (int e = 0; e < 4; e++) {
                    int row = e < 2 ? r_lo : r_hi;
                    float p = key + (e & 1) <= row ? exp2f(s[e] * scale - (e < 2 ? lse_lo : lse_hi)) : 0.0f;
                    ds[half * 4 + e] = p * (dp[e] - (e < 2 ? dl_lo : dl_hi));
                }
            }
            uint32_t dsa[4] = {pack_bf16(ds[0], ds[1]), pack_bf16(ds[2], ds[3]), pack_bf16(ds[4], ds[5]), pack_bf16(ds[6], ds[7])};
            #pragma unroll
            #pragma unroll
        for (int d = 0; d < DN; d++) {
                const __nv_bfloat16 *kr = &skt[d * 8 + gid][kk * 16 + 2 * tig];
                mma_16816(dq[d], dsa, pair_at(kr), pair_at(kr + 8));
            }
        }
    }
    float inv_sqrt = 1.0f / sqrtf((float)HS);
    floatX *dst = dqkv + (size_t)b * T * C3 + h * HS + 2 * tig;
    for (int d = 0; d < DN; d++) {
        if (r_lo < T)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_lo * C3 + d * 8) = __floats2bfloat162_rn(dq[d][0] * inv_sqrt, dq[d][1] * inv_sqrt);
        if (r_hi < T)
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_hi * C3 + d * 8) = __floats2bfloat162_rn(dq[d][2] * inv_sqrt, dq[d][3] * inv_sqrt);
    }
}

// dk, dv for 64 key rows: per 16 queries, S^T = K Q^T and dP^T = V dO^T,
// then dv += P^T dO and dk += dS^T Q
template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attention_backward_dkdv_tc_kernel(floatX *dqkv, const floatX *qkv, const floatX *dout, const float *lse,
                                  const float *delta, int T, int NH) {
    constexpr int KS = HS / 16, DN = HS / 8;
    __shared__ __align__(16) __nv_bfloat16 sq[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 sdo[TC_ROWS][HS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 sqt[HS][TC_ROWS + TC_PAD];
    __shared__ __align__(16) __nv_bfloat16 sdot[HS][TC_ROWS + TC_PAD];
    __shared__ float slse[TC_ROWS], sdelta[TC_ROWS];
    int C = NH * HS, C3 = 3 * C;
    int ktile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    int row0 = ktile * TC_ROWS + warp * 16, r_lo = row0 + gid, r_hi = r_lo + 8;  // key rows
    const floatX *seq = qkv + (size_t)b * T * C3 + h * HS;
    const floatX *dseq = dout + (size_t)b * T * C + h * HS;
    size_t stat = ((size_t)b * NH + h) * T;
    float scale = LOG2E / sqrtf((float)HS);

    uint32_t ka[KS][4], va[KS][4];
    load_a_rows<HS>(ka, seq + C, C3, min(r_lo, T - 1), min(r_hi, T - 1), tig);
    load_a_rows<HS>(va, seq + 2 * C, C3, min(r_lo, T - 1), min(r_hi, T - 1), tig);
    float dk[DN][4], dv[DN][4];
    for (int d = 0; d < DN; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    for (int q0 = ktile * TC_ROWS; q0 < T; q0 += TC_ROWS) {
        __syncthreads();
        load_tile<HS>(sq, sqt, seq, C3, q0, T);
        load_tile<HS>(sdo, sdot, dseq, C, q0, T);
        for (int j = threadIdx.x; j < TC_ROWS; j += TC_THREADS) {
            int tq = min(q0 + j, T - 1);
            slse[j] = lse[stat + tq];
            sdelta[j] = delta[stat + tq];
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (q0 + kk * 16 + 15 < row0) continue;  // warp-uniform: these queries see none of the warp's keys
            float p[8], ds[8];
            #pragma unroll
            for (int half = 0; half < 2; half++) {
                int n = 2 * kk + half;
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                #pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const __nv_bfloat16 *qr = &sq[n * 8 + gid][ks * 16 + 2 * tig], *dr = &sdo[n * 8 + gid][ks * 16 + 2 * tig];
                    mma_16816(s, ka[ks], pair_at(qr), pair_at(qr + 8));
                    mma_16816(dp, va[ks], pair_at(dr), pair_at(dr + 8));
                }
                int jq = n * 8 + 2 * tig;  // this thread's query columns jq, jq + 1 of the tile
                #pragma unroll
            for (int e = 0; e < 4; e++) {
                    int j = jq + (e & 1), tq = q0 + j, key = e < 2 ? r_lo : r_hi;
                    float pe = tq >= key && tq < T ? exp2f(s[e] * scale - slse[j]) : 0.0f;
                    p[half * 4 + e] = pe;
                    ds[half * 4 + e] = pe * (dp[e] - sdelta[j]);
                }
            }
            uint32_t pa[4] = {pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]), pack_bf16(p[4], p[5]), pack_bf16(p[6], p[7])};
            uint32_t dsa[4] = {pack_bf16(ds[0], ds[1]), pack_bf16(ds[2], ds[3]), pack_bf16(ds[4], ds[5]), pack_bf16(ds[6], ds[7])};
            #pragma unroll
            #pragma unroll
        for (int d = 0; d < DN; d++) {
                const __nv_bfloat16 *dr = &sdot[d * 8 + gid][kk * 16 + 2 * tig], *qr = &sqt[d * 8 + gid][kk * 16 + 2 * tig];
                mma_16816(dv[d], pa, pair_at(dr), pair_at(dr + 8));
                mma_16816(dk[d], dsa, pair_at(qr), pair_at(qr + 8));
            }
        }
    }
    float inv_sqrt = 1.0f / sqrtf((float)HS);
    floatX *dst = dqkv + (size_t)b * T * C3 + h * HS + 2 * tig;
    for (int d = 0; d < DN; d++) {
        if (r_lo < T) {
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_lo * C3 + C + d * 8) = __floats2bfloat162_rn(dk[d][0] * inv_sqrt, dk[d][1] * inv_sqrt);
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_lo * C3 + 2 * C + d * 8) = __floats2bfloat162_rn(dv[d][0], dv[d][1]);
        }
        if (r_hi < T) {
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_hi * C3 + C + d * 8) = __floats2bfloat162_rn(dk[d][2] * inv_sqrt, dk[d][3] * inv_sqrt);
            *reinterpret_cast<__nv_bfloat162 *>(dst + (size_t)r_hi * C3 + 2 * C + d * 8) = __floats2bfloat162_rn(dv[d][2], dv[d][3]);
        }
    }
}
#endif

// ----------------------------------------------------------------------------
// fused classifier: per row, softmax over the V real columns, cross-entropy
// against the target, and (when dlogits is wanted) its gradient written over
// the logits: dlogits = (softmax - onehot(target)) * dloss. Padded columns
// V..Vp-1 take no part and get gradient 0. losses[row] += the row's loss.

constexpr int CLASSIFIER_THREADS = 1024;

static __device__ __forceinline__ void softmax_merge(float *m, float *s, float m2, float s2) {
    float mm = fmaxf(*m, m2);
    float a = *m == -INFINITY ? 0.0f : *s * expf(*m - mm);
    float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mm);
    *m = mm;
    *s = a + b;
}

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_kernel(floatX *logits, float *losses, const int *targets, float dloss, int V, int Vp, int write_dlogits) {
    __shared__ float shared_m[32], shared_s[32];
    int row = blockIdx.x;
    floatX *x = logits + (size_t)row * Vp;
    int target = targets[row];
    float z_target = to_f(x[target]);  // read before anyone overwrites it
    float m = -INFINITY, s = 0.0f;     // online max and sum of exp(z - m)
    for (int i = threadIdx.x * PACK; i < V; i += blockDim.x * PACK) {
        Pack p = load_pack(x + i);
        for (int k = 0; k < PACK && i + k < V; k++) {
            float z = to_f(p.v[k]);
            if (z > m) {
                s = s * expf(m - z) + 1.0f;
                m = z;
            } else {
                s += expf(z - m);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        softmax_merge(&m, &s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();  // also: every thread has read z_target
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) softmax_merge(&m, &s, shared_m[w], shared_s[w]);
    float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] += lse - z_target;
    if (!write_dlogits) return;
    for (int i = threadIdx.x * PACK; i < Vp; i += blockDim.x * PACK) {
        Pack p = load_pack(x + i), d;
        for (int k = 0; k < PACK; k++) {
            int col = i + k;
            float prob = col < V ? expf(to_f(p.v[k]) - lse) : 0.0f;
            float g = col < V ? (prob - (col == target ? 1.0f : 0.0f)) * dloss : 0.0f;
            d.v[k] = to_x(g);
        }
        store_pack(x + i, d);
    }
}

// ----------------------------------------------------------------------------
// global gradient norm: fixed grid, per-block partial sums, one final block

constexpr int NORM_BLOCKS = 512;
constexpr int NORM_THREADS = 512;

__global__ void __launch_bounds__(NORM_THREADS) sumsq_partial_kernel(float *partial, const floatX *g, size_t n) {
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float acc = 0.0f;
    for (size_t i = tid; i < n / PACK; i += stride) {
        Pack p = load_pack(g + i * PACK);
        for (int k = 0; k < PACK; k++) acc += to_f(p.v[k]) * to_f(p.v[k]);
    }
    if (tid == 0)
        for (size_t i = n / PACK * PACK; i < n; i++) acc += to_f(g[i]) * to_f(g[i]);
    acc = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sumsq_final_kernel(float *norm, const float *partial, int nparts) {
    __shared__ double shared[1024];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partial[i];
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {  // blockDim.x a power of two
        if ((int)threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) *norm = (float)sqrt(shared[0]);
}

// ----------------------------------------------------------------------------
// AdamW in PyTorch's order (as train_gpt2.c's adamw_update), on the fp32
// master weights; the floatX copy the model computes with is rounded from
// them. The clip scale (as torch.nn.utils.clip_grad_norm_) is folded in,
// computed from the norm on the device, so the host never waits for it.

__global__ void adamw_kernel(floatX *params, float *master, const floatX *grads, float *m, float *v, size_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay, float step_size,
                             float bc2_sqrt, const float *norm, float max_norm) {
    float gn = *norm;
    float scale = max_norm > 0.0f && gn > max_norm ? max_norm / (gn + 1e-6f) : 1.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = to_f(grads[i]) * scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        float p = master[i];
        p *= 1.0f - lr * weight_decay;
        p -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        m[i] = mi;
        v[i] = vi;
        master[i] = p;        // in the fp32 build params and master are one array
        params[i] = to_x(p);
    }
}

__global__ void copy_to_floatx_kernel(floatX *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = to_x(src[i]);
}

// ----------------------------------------------------------------------------
// the seeded init on the device: gpt2.h's param_init_value, ported. Integer
// mixing is exact and the Box-Muller runs in double, so the values equal the
// host's after rounding to float except where a double ulp decides a float
// rounding (test_gpt2.cu counts them).

static __device__ uint64_t device_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static __device__ float device_counter_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t a = device_mix64(seed ^ device_mix64(stream * 0x100000001b3ull ^ device_mix64(2 * i)));
    uint64_t b = device_mix64(seed ^ device_mix64(stream * 0x100000001b3ull ^ device_mix64(2 * i + 1)));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (b >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// how param_init_value fills tensor t: constant for all i, or std * normal
// for i < random_count and 0 after (wte's padded rows)
typedef struct {
    float constant;
    double std;
    size_t random_count;
} InitSpec;

static InitSpec init_spec(const GPT2Config *c, int t, size_t size) {
    InitSpec s = {0.0f, 0.02, size};
    switch (t) {
    case P_LN1W: case P_LN2W: case P_LNFW: s.std = 0.0; s.constant = 1.0f; break;
    case P_QKVB: case P_ATTPROJB: case P_FCB: case P_FCPROJB:
    case P_LN1B: case P_LN2B: case P_LNFB: s.std = 0.0; break;
    case P_WTE: s.random_count = (size_t)c->V * c->C; break;
    case P_ATTPROJW: case P_FCPROJW: s.std = 0.02 / sqrt(2.0 * c->L); break;
    default: break;
    }
    return s;
}

__global__ void init_tensor_kernel(float *out, size_t n, uint64_t seed, int tensor, float constant, double std,
                                   size_t random_count) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (std == 0.0) out[i] = constant;
        else out[i] = i < random_count ? (float)(std * device_counter_normal(seed, (uint64_t)tensor, i)) : 0.0f;
    }
}

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
// kernel launchers

static void encoder_forward(floatX *out, const int *inp, const floatX *wte, const floatX *wpe, int B, int T, int C,
                            cudaStream_t stream) {
    int n = B * T * C / PACK;
    encoder_forward_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, inp, wte, wpe, B * T, T, C);
    CUDA_CHECK(cudaGetLastError());
}

static void encoder_backward(floatX *dwte, floatX *dwpe, const floatX *dout, const int *bucket_start,
                             const int *bucket_token, const int *bucket_pos, int nbuckets, int B, int T, int C,
                             cudaStream_t stream) {
    encoder_backward_wpe_kernel<<<ceil_div(T * C / PACK, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    CUDA_CHECK(cudaGetLastError());
    dim3 grid(nbuckets, ceil_div(C / PACK, 128));
    encoder_backward_wte_kernel<<<grid, 128, 0, stream>>>(dwte, dout, bucket_start, bucket_token, bucket_pos, C);
    CUDA_CHECK(cudaGetLastError());
}

static void layernorm_forward(floatX *out, float *mean, float *rstd, const floatX *inp, const floatX *weight,
                              const floatX *bias, int N, int C, cudaStream_t stream) {
    layernorm_forward_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
    CUDA_CHECK(cudaGetLastError());
}

static void residual_layernorm_forward(floatX *residual, floatX *out, float *mean, float *rstd, const floatX *a,
                                       const floatX *b, const floatX *weight, const floatX *bias, int N, int C,
                                       cudaStream_t stream) {
    residual_layernorm_forward_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(residual, out, mean, rstd, a, b, weight,
                                                                          bias, N, C);
    CUDA_CHECK(cudaGetLastError());
}

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

// dinp += d/dinp, dweight += ..., dbias += ...; partial: colsum_splits(N) * 2C floats
static void layernorm_backward(floatX *dinp, floatX *dweight, floatX *dbias, float *partial, const floatX *dout,
                               const floatX *inp, const floatX *weight, const float *mean, const float *rstd, int N,
                               int C, cudaStream_t stream) {
    layernorm_backward_dinp_kernel<<<ceil_div(N, 8), 256, 0, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    int splits = colsum_splits(N);
    dim3 grid(ceil_div(C, COLSUM_COLS), splits);
    column_sums_kernel<<<grid, COLSUM_WARPS * 32, 0, stream>>>(partial, dout, inp, mean, rstd, N, C,
                                                               ceil_div(N, splits));
    CUDA_CHECK(cudaGetLastError());
    add_column_partials_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dbias, dweight, partial, splits, C);
    CUDA_CHECK(cudaGetLastError());
}

static void gelu_forward(floatX *out, const floatX *inp, size_t n, cudaStream_t stream) {
    gelu_forward_kernel<<<ceil_div((long)(n / PACK), 256), 256, 0, stream>>>(out, inp, n);
    CUDA_CHECK(cudaGetLastError());
}

static void gelu_backward(floatX *d, const floatX *inp, size_t n, cudaStream_t stream) {
    gelu_backward_kernel<<<ceil_div((long)(n / PACK), 256), 256, 0, stream>>>(d, inp, n);
    CUDA_CHECK(cudaGetLastError());
}

// the head sizes the attention kernels are built for
static int attention_supports(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

// the tensor-core kernels (bf16 build) cover head sizes up to 64: larger
// ones would need more than 48 KB of static shared memory per block
static int attention_tc_supports(int hs) {
#ifdef ENABLE_FP32
    (void)hs;
    return 0;
#else
    return hs == 16 || hs == 32 || hs == 64;
#endif
}

// tc: use the tensor-core kernels where attention_tc_supports(C/NH)
static void attention_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH, int tc,
                              cudaStream_t stream) {
    int HS = C / NH;
#ifndef ENABLE_FP32
    if (tc && attention_tc_supports(HS)) {
        dim3 grid(ceil_div(T, TC_ROWS), NH, B);
        switch (HS) {
        case 16: attention_forward_tc_kernel<16><<<grid, TC_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
        case 32: attention_forward_tc_kernel<32><<<grid, TC_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
        case 64: attention_forward_tc_kernel<64><<<grid, TC_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
        }
        CUDA_CHECK(cudaGetLastError());
        return;
    }
#else
    (void)tc;
#endif
    dim3 grid(ceil_div(T, ATT_ROWS), NH, B);
    switch (HS) {
    case 16: attention_forward_kernel<16><<<grid, ATT_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
    case 32: attention_forward_kernel<32><<<grid, ATT_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
    case 64: attention_forward_kernel<64><<<grid, ATT_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
    case 128: attention_forward_kernel<128><<<grid, ATT_THREADS, 0, stream>>>(out, lse, qkv, T, NH); break;
    default: assert(0 && "head size checked by gpu_check_shapes");
    }
    CUDA_CHECK(cudaGetLastError());
}

// dqkv (B,T,3C) is written whole; delta is scratch of B*NH*T floats
static void attention_backward(floatX *dqkv, float *delta, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int B, int T, int C, int NH, int tc, cudaStream_t stream) {
    int HS = C / NH;
    attention_delta_kernel<<<ceil_div((long)B * T * NH, 256), 256, 0, stream>>>(delta, out, dout, B, T, NH, HS);
    CUDA_CHECK(cudaGetLastError());
#ifndef ENABLE_FP32
    if (tc && attention_tc_supports(HS)) {
        dim3 grid(ceil_div(T, TC_ROWS), NH, B);
        switch (HS) {
        case 16:
            attention_backward_dq_tc_kernel<16><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            attention_backward_dkdv_tc_kernel<16><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            break;
        case 32:
            attention_backward_dq_tc_kernel<32><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            attention_backward_dkdv_tc_kernel<32><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            break;
        case 64:
            attention_backward_dq_tc_kernel<64><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            attention_backward_dkdv_tc_kernel<64><<<grid, TC_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
            break;
        }
        CUDA_CHECK(cudaGetLastError());
        return;
    }
#else
    (void)tc;
#endif
    dim3 grid(ceil_div(T, ATT_ROWS), NH, B);
    switch (HS) {
    case 16:
        attention_backward_dq_kernel<16><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        attention_backward_dkdv_kernel<16><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        break;
    case 32:
        attention_backward_dq_kernel<32><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        attention_backward_dkdv_kernel<32><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        break;
    case 64:
        attention_backward_dq_kernel<64><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        attention_backward_dkdv_kernel<64><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        break;
    case 128:
        attention_backward_dq_kernel<128><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        attention_backward_dkdv_kernel<128><<<grid, ATT_THREADS, 0, stream>>>(dqkv, qkv, dout, lse, delta, T, NH);
        break;
    default: assert(0 && "head size checked by gpu_check_shapes");
    }
    CUDA_CHECK(cudaGetLastError());
}

static void classifier(floatX *logits, float *losses, const int *targets, float dloss, int BT, int V, int Vp,
                       int write_dlogits, cudaStream_t stream) {
    classifier_kernel<<<BT, CLASSIFIER_THREADS, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    CUDA_CHECK(cudaGetLastError());
}

// *norm = the L2 norm of g[0..n); partial is scratch of NORM_BLOCKS floats
static void global_norm(float *norm, float *partial, const floatX *g, size_t n, cudaStream_t stream) {
    sumsq_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, stream>>>(partial, g, n);
    CUDA_CHECK(cudaGetLastError());
    sumsq_final_kernel<<<1, 1024, 0, stream>>>(norm, partial, NORM_BLOCKS);
    CUDA_CHECK(cudaGetLastError());
}

static int grid_for(size_t n, int threads) {  // grid-stride loops: enough blocks to fill any GPU
    size_t blocks = (n + threads - 1) / threads;
    return blocks > 65536 ? 65536 : blocks < 1 ? 1 : (int)blocks;
}

// ----------------------------------------------------------------------------
// host-side shape rules: what the kernels need, checked before anything runs

// 0 if the kernels can run this model at (B, T); else one line naming the field
static int gpu_check_shapes(const GPT2Config *c, int B, int T, const char *what, char *err, size_t errlen) {
    if (c->C % 8 != 0) {
        snprintf(err, errlen, "%s: C = %d: the GPU kernels need C to be a multiple of 8", what, c->C);
        return -1;
    }
    if (!attention_supports(c->C / c->NH)) {
        snprintf(err, errlen, "%s: head size C/NH = %d/%d = %d: the GPU attention supports 16, 32, 64 and 128",
                 what, c->C, c->NH, c->C / c->NH);
        return -1;
    }
    if (c->Vp % 8 != 0) {
        snprintf(err, errlen, "%s: Vp = %d: the GPU kernels need the padded vocab to be a multiple of 8", what, c->Vp);
        return -1;
    }
    if ((long)B * T * 4 * c->C > 2147483647L || (long)B * T * c->NH > 2147483647L) {
        snprintf(err, errlen, "flag -b/-t: B*T = %ld rows is too many for one micro-batch at C = %d", (long)B * T, c->C);
        return -1;
    }
    return 0;
}

// GPU flags the CPU trainer has no use for, taken out of argv before
// gpt2.h's options_parse sees it (argv is flag/value pairs)
typedef struct {
    int recompute;     // -r: 1 = recompute GELU in the backward instead of keeping it per layer
    int attention_tc;  // -fa: 1 = tensor-core attention (bf16 build), 0 = the fp32-FMA kernels
} GpuOptions;

static const char *gpu_usage_lines =
    "  -r            recompute GELU in the backward (0/1, default 1)\n"
    "  -fa           attention on tensor cores (0/1, default 1 in the bf16 build; fp32 builds: 0)\n";

static int gpu_options_take(GpuOptions *g, int *argc, char **argv, char *err, size_t errlen) {
    g->recompute = 1;
#ifdef ENABLE_FP32
    g->attention_tc = 0;
#else
    g->attention_tc = 1;
#endif
    int out = 1;
    for (int a = 1; a < *argc; a += 2) {
        int *dst = strcmp(argv[a], "-r") == 0 ? &g->recompute : strcmp(argv[a], "-fa") == 0 ? &g->attention_tc : NULL;
        if (dst == NULL) {
            argv[out++] = argv[a];
            if (a + 1 < *argc) argv[out++] = argv[a + 1];
            continue;
        }
        if (a + 1 >= *argc) {
            snprintf(err, errlen, "flag %s needs a value", argv[a]);
            return -1;
        }
        const char *v = argv[a + 1];
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
            snprintf(err, errlen, "flag %s: '%s' is not 0 or 1", argv[a], v);
            return -1;
        }
        *dst = v[0] - '0';
    }
#ifdef ENABLE_FP32
    if (g->attention_tc) {
        snprintf(err, errlen, "flag -fa: 1: the tensor-core attention is bf16; this is the fp32 build");
        return -1;
    }
#endif
    *argc = out;
    argv[out] = NULL;
    return 0;
}

// bf16 dense tensor-core peak of the GPU, in FLOP/s; 0 when not in the table
static double gpu_peak_flops(const char *name) {
    if (strstr(name, "H200") != NULL) return 989e12;
    if (strstr(name, "H100") != NULL) return strstr(name, "PCIe") != NULL ? 756e12 : 989e12;
    if (strstr(name, "H800") != NULL) return 989e12;
    if (strstr(name, "A100") != NULL || strstr(name, "A800") != NULL) return 312e12;
    return 0.0;
}

// ----------------------------------------------------------------------------
// the model

// what the forward keeps for the backward, and the backward's scratch; all
// carved from one device allocation (buffer_plan), each slice 256-aligned
typedef struct {
    floatX *encoded;                        // (B,T,C)
    floatX *ln1, *qkv, *atty, *residual2;   // per layer: (L,B,T,C), (L,B,T,3C), (L,B,T,C), (L,B,T,C)
    floatX *ln2, *fch, *fch_gelu, *residual3;  // (L,B,T,C), (L,B,T,4C), (L or 1,B,T,4C), (L,B,T,C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // (L,B,T)
    float *lse;                             // (L,B,NH,T)
    floatX *lnf;                            // (B,T,C)
    float *lnf_mean, *lnf_rstd;             // (B,T)
    floatX *logits;                         // (B,T,Vp); the classifier writes dlogits over it
    float *losses;                          // (B,T), summed over micro-batches; then one flag the
                                            // ranks all-reduce (the stop signal rides with the loss)
    floatX *proj;                           // (B,T,C) scratch: attproj, then fcproj output
    floatX *dresidual;                      // (B,T,C): the gradient of the residual stream
    floatX *dbtc;                           // (B,T,C) scratch: dlnf, dln2, datty, dln1
    floatX *dbig;                           // (B,T,4C) scratch: dfch, then dqkv
    float *delta;                           // (B,NH,T) attention backward scratch
    float *colsum_partial;                  // colsum_splits(BT) * 4C
    float *norm_partial, *norm;             // NORM_BLOCKS, 1
    int *batch;                             // the staged micro-batch (see Staging)
} Activations;

// one micro-batch as it travels to the device: inputs, targets and the
// encoder backward's token buckets, one contiguous int array
typedef struct {
    int *inputs, *targets, *bucket_start, *bucket_token, *bucket_pos;
    int nbuckets;
} Staging;

static size_t staging_ints(int BT) { return (size_t)BT * 5 + 1; }

static Staging staging_view(int *base, int BT) {
    Staging s;
    s.inputs = base;
    s.targets = base + BT;
    s.bucket_start = base + 2 * (size_t)BT;  // BT + 1 entries
    s.bucket_token = base + 3 * (size_t)BT + 1;
    s.bucket_pos = base + 4 * (size_t)BT + 1;
    s.nbuckets = 0;
    return s;
}

typedef struct {
    void **ptr;
    size_t bytes;
    size_t offset;  // filled by buffer_plan
} BufferSlice;

#define MAX_SLICES 40

static int add_slice(BufferSlice *s, int n, void **ptr, size_t bytes) {
    assert(n < MAX_SLICES);
    s[n].ptr = ptr;
    s[n].bytes = bytes;
    s[n].offset = 0;
    return n + 1;
}

// lists the slices of the activation buffer for (B, T); returns how many
static int activation_slices(Activations *a, const GPT2Config *c, int B, int T, int recompute, BufferSlice *s) {
    size_t BT = (size_t)B * T, C = c->C, L = c->L, NH = c->NH, X = sizeof(floatX), F = sizeof(float);
    int n = 0;
    n = add_slice(s, n, (void **)&a->encoded, (size_t)(BT * C) * X);
    n = add_slice(s, n, (void **)&a->ln1, (size_t)(L * BT * C) * X);
    n = add_slice(s, n, (void **)&a->qkv, (size_t)(L * BT * 3 * C) * X);
    n = add_slice(s, n, (void **)&a->atty, (size_t)(L * BT * C) * X);
    n = add_slice(s, n, (void **)&a->residual2, (size_t)(L * BT * C) * X);
    n = add_slice(s, n, (void **)&a->ln2, (size_t)(L * BT * C) * X);
    n = add_slice(s, n, (void **)&a->fch, (size_t)(L * BT * 4 * C) * X);
    n = add_slice(s, n, (void **)&a->fch_gelu, (size_t)((recompute ? 1 : L) * BT * 4 * C) * X);
    n = add_slice(s, n, (void **)&a->residual3, (size_t)(L * BT * C) * X);
    n = add_slice(s, n, (void **)&a->ln1_mean, (size_t)(L * BT) * F);
    n = add_slice(s, n, (void **)&a->ln1_rstd, (size_t)(L * BT) * F);
    n = add_slice(s, n, (void **)&a->ln2_mean, (size_t)(L * BT) * F);
    n = add_slice(s, n, (void **)&a->ln2_rstd, (size_t)(L * BT) * F);
    n = add_slice(s, n, (void **)&a->lse, (size_t)(L * BT * NH) * F);
    n = add_slice(s, n, (void **)&a->lnf, (size_t)(BT * C) * X);
    n = add_slice(s, n, (void **)&a->lnf_mean, (size_t)(BT) * F);
    n = add_slice(s, n, (void **)&a->lnf_rstd, (size_t)(BT) * F);
    n = add_slice(s, n, (void **)&a->logits, (size_t)(BT * c->Vp) * X);
    n = add_slice(s, n, (void **)&a->losses, (size_t)(BT + 1) * F);
    n = add_slice(s, n, (void **)&a->proj, (size_t)(BT * C) * X);
    n = add_slice(s, n, (void **)&a->dresidual, (size_t)(BT * C) * X);
    n = add_slice(s, n, (void **)&a->dbtc, (size_t)(BT * C) * X);
    n = add_slice(s, n, (void **)&a->dbig, (size_t)(BT * 4 * C) * X);
    n = add_slice(s, n, (void **)&a->delta, (size_t)(BT * NH) * F);
    n = add_slice(s, n, (void **)&a->colsum_partial, (size_t)((size_t)colsum_splits((int)BT) * 4 * C) * F);
    n = add_slice(s, n, (void **)&a->norm_partial, (size_t)(NORM_BLOCKS) * F);
    n = add_slice(s, n, (void **)&a->norm, (size_t)(1) * F);
    n = add_slice(s, n, (void **)&a->batch, (size_t)(staging_ints((int)BT)) * sizeof(int));
    return n;
}

// gives each slice a 256-aligned offset; returns the total bytes
static size_t buffer_plan(BufferSlice *s, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        s[i].offset = total;
        total += (s[i].bytes + 255) / 256 * 256;
    }
    return total;
}

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t num_params;
    size_t num_padded;                      // num_params rounded up to dp equal shards of whole 128-element rows
    size_t opt_begin, opt_count;            // the elements this rank's AdamW updates: all, or its ZeRO-1 shard
    floatX *params, *grads;                 // device, model-file layout, num_padded each
    float *master;                          // device fp32, num_padded (master == params in the fp32 build)
    float *m, *v;                           // device fp32 AdamW state of the opt_count elements from opt_begin
    floatX *param[NUM_PARAM_TENSORS], *grad[NUM_PARAM_TENSORS];
    int B, T, recompute, fuse_gelu, attention_tc;
    Activations act;
    void *act_memory;
    size_t act_bytes;
    int *inputs, *targets;                  // host: the current micro-batch (B*T each)
    int *staging_host;                      // pinned: staging_ints(B*T)
    int *bucket_count;                      // host scratch: V + 1
    Staging staged;                         // views of staging_host for the batch on the device
    cudaEvent_t staging_free;               // the last copy out of staging_host is done
    Blas blas;
    cudaStream_t stream;
    int adam_t;                             // AdamW steps taken
} GPT2;

static void *device_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "out of GPU memory allocating %s (%zu bytes): %s\n", what, bytes, cudaGetErrorString(e));
        exit(1);
    }
    return p;
}

static void *host_alloc(size_t bytes, const char *what) {
    void *p = calloc(1, bytes);
    if (p == NULL) {
        fprintf(stderr, "out of memory allocating %s (%zu bytes)\n", what, bytes);
        exit(1);
    }
    return p;
}

static void point_param_views(floatX **views, floatX *base, const size_t *sizes) {
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        views[i] = base;
        base += sizes[i];
    }
}

// how dp ranks lay out the num_params parameters on the device: model.bin's
// order, then zeros up to num_padded, dp equal shards of whole 128-element
// rows (so every shard is 16-byte aligned for the vector loads); this rank's
// AdamW state covers [opt_begin, opt_begin + opt_count): every parameter
// (ZeRO-0) or its shard dp_rank (ZeRO-1; the last one reaches into the zeros)
typedef struct { size_t num_padded, shard, opt_begin, opt_count; } DpLayout;

static DpLayout dp_layout(size_t num_params, int dp, int dp_rank, int zero) {
    DpLayout d;
    d.shard = ((num_params + (size_t)dp - 1) / (size_t)dp + 127) / 128 * 128;
    d.num_padded = d.shard * (size_t)dp;
    d.opt_begin = zero == 1 ? (size_t)dp_rank * d.shard : 0;
    d.opt_count = zero == 1 ? d.shard : num_params;
    return d;
}

// the model on the device, from host fp32 params (model_load) or, when
// params is NULL, from the seeded init; activations for (B, T); the
// parameters and AdamW state laid out by dp_layout.
static void gpt2_init_dp(GPT2 *model, const GPT2Config *c, const float *params, uint64_t seed, int B, int T,
                         int recompute, int attention_tc, int dp, int dp_rank, int zero) {
    memset(model, 0, sizeof(*model));
    model->config = *c;
    param_sizes(c, model->param_sizes);
    model->num_params = param_count(c);
    DpLayout lay = dp_layout(model->num_params, dp, dp_rank, zero);
    model->num_padded = lay.num_padded;
    model->opt_begin = lay.opt_begin;
    model->opt_count = lay.opt_count;
    model->B = B;
    model->T = T;
    model->recompute = recompute;
    model->attention_tc = attention_tc;
#ifdef ENABLE_FP32
    model->fuse_gelu = 0;  // our GELU kernel is the CPU trainer's formula; the epilogue's may round differently
#else
    model->fuse_gelu = 1;
#endif
    size_t n = model->num_params, np = model->num_padded, nopt = model->opt_count;
    CUDA_CHECK(cudaStreamCreate(&model->stream));
    model->master = (float *)device_alloc(np * sizeof(float), "master weights");
#ifdef ENABLE_FP32
    model->params = model->master;
#else
    model->params = (floatX *)device_alloc(np * sizeof(floatX), "parameters");
#endif
    model->grads = (floatX *)device_alloc(np * sizeof(floatX), "gradients");
    model->m = (float *)device_alloc(nopt * sizeof(float), "AdamW m");
    model->v = (float *)device_alloc(nopt * sizeof(float), "AdamW v");
    CUDA_CHECK(cudaMemset(model->master, 0, np * sizeof(float)));
    CUDA_CHECK(cudaMemset(model->grads, 0, np * sizeof(floatX)));
    CUDA_CHECK(cudaMemset(model->m, 0, nopt * sizeof(float)));
    CUDA_CHECK(cudaMemset(model->v, 0, nopt * sizeof(float)));
    point_param_views(model->param, model->params, model->param_sizes);
    point_param_views(model->grad, model->grads, model->param_sizes);
    if (params != NULL) {
        CUDA_CHECK(cudaMemcpy(model->master, params, n * sizeof(float), cudaMemcpyHostToDevice));
    } else {
        float *p = model->master;
        for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
            size_t size = model->param_sizes[t];
            InitSpec s = init_spec(c, t, size);
            init_tensor_kernel<<<grid_for(size, 256), 256, 0, model->stream>>>(p, size, seed, t, s.constant, s.std,
                                                                                s.random_count);
            CUDA_CHECK(cudaGetLastError());
            p += size;
        }
    }
    copy_to_floatx_kernel<<<grid_for(np, 256), 256, 0, model->stream>>>(model->params, model->master, np);
    CUDA_CHECK(cudaGetLastError());

    BufferSlice slices[MAX_SLICES];
    int nslices = activation_slices(&model->act, c, B, T, recompute, slices);
    model->act_bytes = buffer_plan(slices, nslices);
    model->act_memory = device_alloc(model->act_bytes, "activations");
    for (int i = 0; i < nslices; i++) *slices[i].ptr = (char *)model->act_memory + slices[i].offset;

    size_t BT = (size_t)B * T;
    model->inputs = (int *)host_alloc(BT * sizeof(int), "inputs");
    model->targets = (int *)host_alloc(BT * sizeof(int), "targets");
    model->bucket_count = (int *)host_alloc((size_t)(c->V + 1) * sizeof(int), "token counts");
    CUDA_CHECK(cudaMallocHost((void **)&model->staging_host, staging_ints((int)BT) * sizeof(int)));
    CUDA_CHECK(cudaEventCreateWithFlags(&model->staging_free, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(model->staging_free, model->stream));

    CUBLAS_CHECK(cublasLtCreate(&model->blas.handle));
    model->blas.workspace_size = 32u << 20;
    model->blas.workspace = device_alloc(model->blas.workspace_size, "cuBLASLt workspace");
    model->blas.stream = model->stream;
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
}

// one rank: every parameter and all of the AdamW state here (what the
// tests build; the trainer itself always names its dp)
[[maybe_unused]] static void gpt2_init(GPT2 *model, const GPT2Config *c, const float *params, uint64_t seed, int B,
                                       int T, int recompute, int attention_tc) {
    gpt2_init_dp(model, c, params, seed, B, T, recompute, attention_tc, 1, 0, 0);
}

static void gpt2_free(GPT2 *model) {
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
#ifndef ENABLE_FP32
    cudaFree(model->params);
#endif
    cudaFree(model->master); cudaFree(model->grads); cudaFree(model->m); cudaFree(model->v);
    cudaFree(model->act_memory); cudaFree(model->blas.workspace);
    cublasLtDestroy(model->blas.handle);
    cudaFreeHost(model->staging_host);
    cudaEventDestroy(model->staging_free);
    cudaStreamDestroy(model->stream);
    free(model->inputs); free(model->targets); free(model->bucket_count);
}

// one block's slices of the per-layer tensors
typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerParams;

static LayerParams layer_params(const GPT2Config *c, floatX *const *t, int l) {
    size_t C = c->C;
    LayerParams p = {
        t[P_LN1W] + l * C, t[P_LN1B] + l * C, t[P_QKVW] + l * 3 * C * C, t[P_QKVB] + l * 3 * C,
        t[P_ATTPROJW] + l * C * C, t[P_ATTPROJB] + l * C, t[P_LN2W] + l * C, t[P_LN2B] + l * C,
        t[P_FCW] + l * 4 * C * C, t[P_FCB] + l * 4 * C, t[P_FCPROJW] + l * 4 * C * C, t[P_FCPROJB] + l * C,
    };
    return p;
}

typedef struct {
    floatX *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} LayerActs;

static LayerActs layer_acts(const GPT2 *model, int l) {
    const Activations *a = &model->act;
    size_t BT = (size_t)model->B * model->T, btc = BT * model->config.C;
    LayerActs s = {
        a->ln1 + l * btc, a->qkv + l * 3 * btc, a->atty + l * btc, a->residual2 + l * btc, a->ln2 + l * btc,
        a->fch + l * 4 * btc, a->fch_gelu + (model->recompute ? 0 : l * 4 * btc), a->residual3 + l * btc,
        a->ln1_mean + l * BT, a->ln1_rstd + l * BT, a->ln2_mean + l * BT, a->ln2_rstd + l * BT,
        a->lse + l * BT * model->config.NH,
    };
    return s;
}

// the residual stream entering block l (block L's is the final LayerNorm's input)
static floatX *block_input(const GPT2 *model, int l) {
    size_t btc = (size_t)model->B * model->T * model->config.C;
    return l == 0 ? model->act.encoded : model->act.residual3 + (l - 1) * btc;
}

// copies model->inputs and ->targets (and, for training, their token
// buckets) to the device. The pinned staging buffer is reused only once its
// previous copy has finished, so the host may refill inputs at any time.
static void gpt2_stage_batch(GPT2 *model, int with_buckets) {
    int BT = model->B * model->T, V = model->config.V;
    for (int i = 0; i < BT; i++) {
        if (model->inputs[i] < 0 || model->inputs[i] >= V || model->targets[i] < 0 || model->targets[i] >= V) {
            fprintf(stderr, "batch position %d: token %d / target %d is outside the vocab [0, %d)\n", i,
                    model->inputs[i], model->targets[i], V);
            exit(1);
        }
    }
    CUDA_CHECK(cudaEventSynchronize(model->staging_free));
    Staging s = staging_view(model->staging_host, BT);
    memcpy(s.inputs, model->inputs, (size_t)BT * sizeof(int));
    memcpy(s.targets, model->targets, (size_t)BT * sizeof(int));
    size_t ints = 2 * (size_t)BT;
    if (with_buckets) {
        s.nbuckets = token_buckets(model->inputs, BT, V, model->bucket_count, s.bucket_start, s.bucket_token, s.bucket_pos);
        ints = staging_ints(BT);
    }
    CUDA_CHECK(cudaMemcpyAsync(model->act.batch, model->staging_host, ints * sizeof(int), cudaMemcpyHostToDevice,
                               model->stream));
    CUDA_CHECK(cudaEventRecord(model->staging_free, model->stream));
    model->staged = staging_view(model->act.batch, BT);
    model->staged.nbuckets = s.nbuckets;
}

enum { FWD_LOGITS, FWD_LOSS, FWD_TRAIN };

// forward over model->inputs. FWD_LOGITS: logits only. FWD_LOSS: also
// losses += the per-position losses (targets). FWD_TRAIN: also dlogits =
// dloss * d(loss)/d(logits) in place of the logits, for gpt2_backward.
static void gpt2_forward(GPT2 *model, int mode, float dloss) {
    const GPT2Config *c = &model->config;
    int B = model->B, T = model->T, C = c->C, L = c->L, NH = c->NH, BT = B * T;
    size_t btc = (size_t)BT * C;
    Activations *a = &model->act;
    cudaStream_t st = model->stream;
    const Blas *blas = &model->blas;
    gpt2_stage_batch(model, mode == FWD_TRAIN);

    encoder_forward(a->encoded, model->staged.inputs, model->param[P_WTE], model->param[P_WPE], B, T, C, st);
    LayerParams p0 = layer_params(c, model->param, 0);
    LayerActs s0 = layer_acts(model, 0);
    layernorm_forward(s0.ln1, s0.ln1_mean, s0.ln1_rstd, a->encoded, p0.ln1w, p0.ln1b, BT, C, st);
    for (int l = 0; l < L; l++) {
        LayerParams p = layer_params(c, model->param, l);
        LayerActs s = layer_acts(model, l);
        const floatX *x = block_input(model, l);
        matmul_forward(blas, s.qkv, NULL, s.ln1, p.qkvw, p.qkvb, BT, C, 3 * C);
        attention_forward(s.atty, s.lse, s.qkv, B, T, C, NH, model->attention_tc, st);
        matmul_forward(blas, a->proj, NULL, s.atty, p.attprojw, p.attprojb, BT, C, C);
        residual_layernorm_forward(s.residual2, s.ln2, s.ln2_mean, s.ln2_rstd, x, a->proj, p.ln2w, p.ln2b, BT, C, st);
        if (model->fuse_gelu) {
            matmul_forward(blas, s.fch_gelu, s.fch, s.ln2, p.fcw, p.fcb, BT, C, 4 * C);
        } else {
            matmul_forward(blas, s.fch, NULL, s.ln2, p.fcw, p.fcb, BT, C, 4 * C);
            gelu_forward(s.fch_gelu, s.fch, 4 * btc, st);
        }
        matmul_forward(blas, a->proj, NULL, s.fch_gelu, p.fcprojw, p.fcprojb, BT, 4 * C, C);
        // the residual add, then the next block's ln1 (or the final LayerNorm)
        if (l + 1 < L) {
            LayerParams pn = layer_params(c, model->param, l + 1);
            LayerActs sn = layer_acts(model, l + 1);
            residual_layernorm_forward(s.residual3, sn.ln1, sn.ln1_mean, sn.ln1_rstd, s.residual2, a->proj, pn.ln1w,
                                       pn.ln1b, BT, C, st);
        } else {
            residual_layernorm_forward(s.residual3, a->lnf, a->lnf_mean, a->lnf_rstd, s.residual2, a->proj,
                                       model->param[P_LNFW], model->param[P_LNFB], BT, C, st);
        }
    }
    matmul_forward(blas, a->logits, NULL, a->lnf, model->param[P_WTE], NULL, BT, C, c->Vp);
    if (mode == FWD_LOGITS) return;
    classifier(a->logits, a->losses, model->staged.targets, dloss, BT, c->V, c->Vp, mode == FWD_TRAIN, st);
}

// backward of the last FWD_TRAIN forward; gradients accumulate (+=)
static void gpt2_backward(GPT2 *model) {
    const GPT2Config *c = &model->config;
    int B = model->B, T = model->T, C = c->C, L = c->L, NH = c->NH, BT = B * T;
    size_t btc = (size_t)BT * C;
    Activations *a = &model->act;
    cudaStream_t st = model->stream;
    const Blas *blas = &model->blas;
    floatX **g = model->grad;
    float *part = a->colsum_partial;

    // logits = lnf @ wte^T
    matmul_backward_dinp(blas, a->dbtc, a->logits, model->param[P_WTE], NULL, BT, C, c->Vp);
    matmul_backward_dweight(blas, g[P_WTE], a->logits, a->lnf, BT, C, c->Vp);
    CUDA_CHECK(cudaMemsetAsync(a->dresidual, 0, btc * sizeof(floatX), st));
    layernorm_backward(a->dresidual, g[P_LNFW], g[P_LNFB], part, a->dbtc, block_input(model, L), model->param[P_LNFW],
                       a->lnf_mean, a->lnf_rstd, BT, C, st);
    // dresidual holds d(residual3 of layer l) on entering, d(its input) on leaving
    for (int l = L - 1; l >= 0; l--) {
        LayerParams p = layer_params(c, model->param, l), gl = layer_params(c, g, l);
        LayerActs s = layer_acts(model, l);
        const floatX *x = block_input(model, l);
        if (model->recompute) gelu_forward(s.fch_gelu, s.fch, 4 * btc, st);
        // fcproj: d(its output) = dresidual
        matmul_backward_dweight(blas, gl.fcprojw, a->dresidual, s.fch_gelu, BT, 4 * C, C);
        bias_backward(gl.fcprojb, a->dresidual, part, BT, C, st);
        if (model->fuse_gelu) {
            matmul_backward_dinp(blas, a->dbig, a->dresidual, p.fcprojw, s.fch, BT, 4 * C, C);
        } else {
            matmul_backward_dinp(blas, a->dbig, a->dresidual, p.fcprojw, NULL, BT, 4 * C, C);
            gelu_backward(a->dbig, s.fch, 4 * btc, st);
        }
        // fc: dbig = d(fch)
        matmul_backward_dweight(blas, gl.fcw, a->dbig, s.ln2, BT, C, 4 * C);
        bias_backward(gl.fcb, a->dbig, part, BT, 4 * C, st);
        matmul_backward_dinp(blas, a->dbtc, a->dbig, p.fcw, NULL, BT, C, 4 * C);
        layernorm_backward(a->dresidual, gl.ln2w, gl.ln2b, part, a->dbtc, s.residual2, p.ln2w, s.ln2_mean, s.ln2_rstd,
                           BT, C, st);
        // attproj: d(its output) = dresidual, now d(residual2)
        matmul_backward_dweight(blas, gl.attprojw, a->dresidual, s.atty, BT, C, C);
        bias_backward(gl.attprojb, a->dresidual, part, BT, C, st);
        matmul_backward_dinp(blas, a->dbtc, a->dresidual, p.attprojw, NULL, BT, C, C);
        attention_backward(a->dbig, a->delta, a->dbtc, s.qkv, s.atty, s.lse, B, T, C, NH, model->attention_tc, st);
        // qkv: dbig = d(qkv)
        matmul_backward_dweight(blas, gl.qkvw, a->dbig, s.ln1, BT, C, 3 * C);
        bias_backward(gl.qkvb, a->dbig, part, BT, 3 * C, st);
        matmul_backward_dinp(blas, a->dbtc, a->dbig, p.qkvw, NULL, BT, C, 3 * C);
        layernorm_backward(a->dresidual, gl.ln1w, gl.ln1b, part, a->dbtc, x, p.ln1w, s.ln1_mean, s.ln1_rstd, BT, C, st);
    }
    encoder_backward(g[P_WTE], g[P_WPE], a->dresidual, model->staged.bucket_start, model->staged.bucket_token,
                     model->staged.bucket_pos, model->staged.nbuckets, B, T, C, st);
}

static void gpt2_zero_grad(GPT2 *model) {
    CUDA_CHECK(cudaMemsetAsync(model->grads, 0, model->num_padded * sizeof(floatX), model->stream));
}

static void gpt2_zero_losses(GPT2 *model) {
    CUDA_CHECK(cudaMemsetAsync(model->act.losses, 0, (size_t)model->B * model->T * sizeof(float), model->stream));
}

// the mean of the losses summed since gpt2_zero_losses over nbatches micro-batches (waits for the GPU)
static float gpt2_mean_loss(GPT2 *model, int nbatches) {
    size_t BT = (size_t)model->B * model->T;
    float *h = (float *)host_alloc(BT * sizeof(float), "losses");
    CUDA_CHECK(cudaMemcpyAsync(h, model->act.losses, BT * sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += h[i];
    free(h);
    return (float)(sum / ((double)BT * nbatches));
}

// the grad norm in two halves, so that data-parallel ranks can add up their
// partial sums in between (ZeRO-1: each holds the gradient of its shard only).
// The partials cover the elements this rank's AdamW updates.
static void gpt2_norm_partials(GPT2 *model) {
    sumsq_partial_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, model->stream>>>(model->act.norm_partial,
                                                                           model->grads + model->opt_begin,
                                                                           model->opt_count);
    CUDA_CHECK(cudaGetLastError());
}

static void gpt2_norm_final(GPT2 *model) {
    sumsq_final_kernel<<<1, 1024, 0, model->stream>>>(model->act.norm, model->act.norm_partial, NORM_BLOCKS);
    CUDA_CHECK(cudaGetLastError());
}

// clipping (as the CPU trainer's gpt2_clip_grads) and AdamW on this rank's
// elements [opt_begin, opt_begin + opt_count), one launch per tensor piece
// (weight decay on the matrices only), after the norm is on the device
static void gpt2_adamw(GPT2 *model, float lr, float beta1, float beta2, float eps, float weight_decay, float max_norm) {
    cudaStream_t st = model->stream;
    model->adam_t++;
    float bc1 = 1.0f - powf(beta1, (float)model->adam_t), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)model->adam_t));
    size_t lo = model->opt_begin, hi = model->opt_begin + model->opt_count, off = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; off += model->param_sizes[t], t++) {
        size_t a = off > lo ? off : lo, b = off + model->param_sizes[t] < hi ? off + model->param_sizes[t] : hi;
        if (a >= b) continue;
        size_t n = b - a;
        adamw_kernel<<<grid_for(n, 256), 256, 0, st>>>(model->params + a, model->master + a, model->grads + a,
                                                       model->m + (a - lo), model->v + (a - lo), n, lr, beta1, beta2,
                                                       eps, param_is_matrix(t) ? weight_decay : 0.0f, lr / bc1,
                                                       bc2_sqrt, model->act.norm, max_norm);
        CUDA_CHECK(cudaGetLastError());
    }
}

// grad norm, clipping and AdamW, all queued on the stream (gpt2_last_norm
// reads the norm back): the whole step of one rank, or of a ZeRO-0 rank
// once its gradients are all-reduced
static void gpt2_update(GPT2 *model, float lr, float beta1, float beta2, float eps, float weight_decay,
                        float max_norm) {
    global_norm(model->act.norm, model->act.norm_partial, model->grads + model->opt_begin, model->opt_count,
                model->stream);
    gpt2_adamw(model, lr, beta1, beta2, eps, weight_decay, max_norm);
}

static float gpt2_last_norm(GPT2 *model) {
    float norm;
    CUDA_CHECK(cudaMemcpyAsync(&norm, model->act.norm, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
    return norm;
}

// the fp32 master weights, in a fresh host array (for model_save)
static float *gpt2_master_to_host(GPT2 *model) {
    float *h = (float *)host_alloc(model->num_params * sizeof(float), "parameters");
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
    CUDA_CHECK(cudaMemcpy(h, model->master, model->num_params * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// writes a v5 (bf16 build) or v3 (fp32 build) model file of the master weights
static int gpt2_save(GPT2 *model, const char *path, char *err, size_t errlen) {
    float *h = gpt2_master_to_host(model);
#ifdef ENABLE_FP32
    int rc = model_save(path, &model->config, h, 0, err, errlen);
#else
    int rc = model_save(path, &model->config, h, 1, err, errlen);
#endif
    free(h);
    return rc;
}

// a floatX read back from the device, as a float
static float floatx_to_host_float(floatX x) {
#ifdef ENABLE_FP32
    return x;
#else
    __nv_bfloat16_raw raw = x;
    return bf16_to_float(raw.x);
#endif
}

// ----------------------------------------------------------------------------
// checkpoints: the files of train_gpt2.c (checkpoint.h has them, the seal,
// the search and the pruning). The device layout is model.bin's element
// order with zeros after the last real element (dp_layout), so a rank's part
// of model.bin and optim.bin is one range of elements of the file order.

// the file elements [lo, hi) this rank writes into a checkpoint: its 1/dp
// of the num_params real ones (by dp_layout's shards, under ZeRO-0 as under
// ZeRO-1, so that the ranks write at once and every element once). Under
// ZeRO-1 that is the shard whose master weights and AdamW state are current
// here (the bf16 build's master weights outside it are stale); under ZeRO-0
// every rank holds all of them current. m and v of element j sit at
// j - opt_begin on the device in both.
typedef struct { size_t lo, hi; } ElemRange;

static ElemRange ckpt_share(size_t num_params, size_t num_padded, int dp, int dp_rank) {
    size_t shard = num_padded / (size_t)dp, lo = (size_t)dp_rank * shard, hi = lo + shard;
    ElemRange r = {lo < num_params ? lo : num_params, hi < num_params ? hi : num_params};
    return r;
}

// the file elements whose AdamW state this rank loads on resume: all it
// keeps, [opt_begin, opt_begin + opt_count), less the padding past num_params
static ElemRange ckpt_adam_range(size_t num_params, size_t opt_begin, size_t opt_count) {
    size_t hi = opt_begin + opt_count;
    ElemRange r = {opt_begin < num_params ? opt_begin : num_params, hi < num_params ? hi : num_params};
    return r;
}

#define CKPT_CHUNK ((size_t)1 << 22)  // floats per round trip through the host (16 MB)

// writes elements [r.lo, r.hi) of the master weights into model.bin and of
// m and v into optim.bin (both open for writing, at their full size:
// ckpt_begin); 0, or the errno of the failed write
static int gpt2_write_share(GPT2 *model, int fd_model, int fd_optim, ElemRange r) {
    size_t N = model->num_params, header = HEADER_INTS * sizeof(int32_t);
    float *buf = (float *)host_alloc(CKPT_CHUNK * sizeof(float), "checkpoint buffer");
    int e = 0;
    CUDA_CHECK(cudaStreamSynchronize(model->stream));  // the step's update is in
    for (size_t j = r.lo; j < r.hi && e == 0; j += CKPT_CHUNK) {
        size_t n = r.hi - j < CKPT_CHUNK ? r.hi - j : CKPT_CHUNK;
        const float *src[3] = {model->master + j, model->m + (j - model->opt_begin), model->v + (j - model->opt_begin)};
        int fd[3] = {fd_model, fd_optim, fd_optim};
        size_t at[3] = {header + j * sizeof(float), header + j * sizeof(float), header + (N + j) * sizeof(float)};
        for (int k = 0; k < 3 && e == 0; k++) {
            CUDA_CHECK(cudaMemcpy(buf, src[k], n * sizeof(float), cudaMemcpyDeviceToHost));
            if (ckpt_pwrite(fd[k], buf, n * sizeof(float), at[k]) != 0) e = errno;
        }
    }
    free(buf);
    return e;
}

// AdamW's m and v of this rank's elements (ckpt_adam_range) from a
// checkpoint's optim.bin, and Adam's t; the parameters come in through
// gpt2_init_dp from its model.bin. ckpt_find verified the bytes; the header
// must also agree with the model and with state.bin's t.
static int gpt2_load_optimizer(GPT2 *model, const char *path, int adam_t, char *err, size_t errlen) {
    size_t N = model->num_params, header = HEADER_INTS * sizeof(int32_t);
    if (N != param_count(&model->config))
        return secure_error(err, errlen, "%s: the model holds %zu parameters, its shape %zu", path, N,
                            param_count(&model->config));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return secure_error(err, errlen, "%s: %s", path, strerror(errno));
    int32_t h[HEADER_INTS], want[HEADER_INTS];
    ckpt_optim_header(want, &model->config, adam_t);
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != ckpt_file_bytes(1, &model->config) ||
        ckpt_pread(fd, h, sizeof(h), 0) != 0 || memcmp(h, want, sizeof(h)) != 0) {
        close(fd);
        return secure_error(err, errlen, "%s: not the AdamW state of this model at t = %d (%lld bytes, magic %d, t %d)",
                            path, adam_t, (long long)st.st_size, h[0], h[2]);
    }
    ElemRange r = ckpt_adam_range(N, model->opt_begin, model->opt_count);
    float *buf = (float *)host_alloc(CKPT_CHUNK * sizeof(float), "checkpoint buffer");
    int e = 0;
    for (size_t j = r.lo; j < r.hi && e == 0; j += CKPT_CHUNK) {
        size_t n = r.hi - j < CKPT_CHUNK ? r.hi - j : CKPT_CHUNK;
        for (int k = 0; k < 2 && e == 0; k++) {
            float *dst = (k == 0 ? model->m : model->v) + (j - model->opt_begin);
            if (ckpt_pread(fd, buf, n * sizeof(float), header + ((size_t)k * N + j) * sizeof(float)) != 0) e = errno;
            else CUDA_CHECK(cudaMemcpy(dst, buf, n * sizeof(float), cudaMemcpyHostToDevice));
        }
    }
    free(buf);
    close(fd);
    if (e != 0) return secure_error(err, errlen, "%s: read: %s", path, strerror(e));
    model->adam_t = adam_t;
    return 0;
}

// FLOPs per token for forward + backward, as the CPU trainer counts them
static double flops_per_token(const GPT2Config *c, int T) {
    double n = (double)param_count(c) - (double)c->maxT * c->C;
    return 6.0 * n + 6.0 * c->L * (double)T * c->C;
}

#ifndef TESTING
// ----------------------------------------------------------------------------
// the trainer

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void die_usage(const char *msg) {
    fprintf(stderr, "train_gpt2cu: %s\n", msg);
    exit(2);
}

// xorshift* for sampling; its state is one number (as the CPU trainer)
static float random_f32(uint64_t *state) {
    *state ^= *state >> 12; *state ^= *state << 25; *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

// prints gen_tokens tokens sampled from the model, starting from EOT
static void sample(GPT2 *model, const Tokenizer *tok, int gen_tokens, uint64_t *rng) {
    int B = model->B, T = model->T, V = model->config.V, Vp = model->config.Vp;
    int eot = tok->eot_token;
    for (int i = 0; i < B * T; i++) model->inputs[i] = eot, model->targets[i] = eot;
    floatX *row = (floatX *)host_alloc((size_t)Vp * sizeof(floatX), "sample logits");
    float *z = (float *)host_alloc((size_t)V * sizeof(float), "sample logits");
    int n = gen_tokens < T ? gen_tokens : T;
    printf("generating:\n---\n");
    for (int t = 1; t < n; t++) {
        gpt2_forward(model, FWD_LOGITS, 0.0f);
        CUDA_CHECK(cudaMemcpyAsync(row, model->act.logits + (size_t)(t - 1) * Vp, (size_t)Vp * sizeof(floatX),
                                   cudaMemcpyDeviceToHost, model->stream));
        CUDA_CHECK(cudaStreamSynchronize(model->stream));
        float maxv = -INFINITY, sum = 0.0f;
        for (int i = 0; i < V; i++) z[i] = floatx_to_host_float(row[i]), maxv = fmaxf(maxv, z[i]);
        for (int i = 0; i < V; i++) sum += expf(z[i] - maxv);
        float coin = random_f32(rng) * sum, cdf = 0.0f;
        int next = V - 1;
        for (int i = 0; i < V; i++) {
            cdf += expf(z[i] - maxv);
            if (coin < cdf) { next = i; break; }
        }
        model->inputs[t] = next;
        int len;
        const char *s = tokenizer_decode(tok, next, &len);
        if (s != NULL) fwrite(s, 1, len, stdout);
        fflush(stdout);
    }
    printf("\n---\n");
    free(row);
    free(z);
}

// ----------------------------------------------------------------------------
// data parallel over NCCL: one process and one GPU per rank (doc/gpu.md)

#ifdef ENABLE_FP32
static const ncclDataType_t NCCL_FLOATX = ncclFloat32;
#else
static const ncclDataType_t NCCL_FLOATX = ncclBfloat16;
#endif

typedef struct {
    Launch launch;
    Grid grid;
    int zero;
    NcclComm *nccl;     // every rank has one, a job of one rank too: -np 1 runs the NCCL path
} Parallel;

// check_launch_gpus: the process that will launch -np ranks on this node
// refuses more ranks than GPUs, once, before it starts any. A short-lived
// child counts them: the launcher itself stays free of CUDA, whose threads
// would otherwise take the signals it waits for on its signalfd.
static void check_launch_gpus(const Options *o) {
    char err[512], msg[600];
    int launcher = getenv("LLM3D_RANK") == NULL && o->rendezvous == NULL && o->np > 1;
    if (!launcher) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n < 255 ? n : 255);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return;  // the ranks will check for themselves
    int ndev = WEXITSTATUS(status);
    if (gpu_for_rank(o->np - 1, ndev, 0, err, sizeof(err)) < 0) {
        snprintf(msg, sizeof(msg), "flag -np %d: %s", o->np, err);
        die_usage(msg);
    }
}

// parallel_setup: with -np > 1 this process becomes the launcher and never
// returns; a rank binds its GPU before anything else touches the device, then
// joins the job's communicators
static void parallel_setup(Parallel *par, const Options *o, const Fault *fault, int argc, char **argv) {
    char err[512];
    memset(par, 0, sizeof(*par));
    int rc = parallel_join(argc, argv, o->np, o->tp, o->pp, o->rendezvous, o->key_file, o->timeout, &par->launch,
                           &par->grid, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "train_gpt2cu: %s\n", err);
        exit(rc);
    }
    Launch *L = &par->launch;
    par->zero = o->zero;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) ndev = 0;
    int device = gpu_for_rank(L->local_rank, ndev, gpu_own_visible(L), err, sizeof(err));
    if (device < 0) {
        fprintf(stderr, "train_gpt2cu: rank %d: %s%s%s\n", L->rank, err, e != cudaSuccess ? ": " : "",
                e != cudaSuccess ? cudaGetErrorString(e) : "");
        exit(1);
    }
    CUDA_CHECK(cudaSetDevice(device));
    if (nccl_init(&par->nccl, &par->grid, L->key, L->rendezvous, o->timeout, fault, err, sizeof(err)) != 0) {
        fprintf(stderr, "train_gpt2cu: %s\n", err);
        exit(1);
    }
}

// the data-parallel end of a step, after every micro-batch's backward. ZeRO-0
// all-reduces the gradients and updates every parameter. ZeRO-1
// reduce-scatters them, adds up the norm's partial sums over the group,
// updates its shard and all-gathers the updated parameters.
static void dp_update(GPT2 *model, Parallel *par, const Options *o, float lr) {
    NcclComm *nc = par->nccl;
    if (par->zero == 0) {
        nccl_allreduce(nc, &nc->dp, model->grads, model->num_params, NCCL_FLOATX, OP_SUM);
        gpt2_update(model, lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip);
        return;
    }
    size_t shard = model->num_padded / (size_t)par->grid.dp;
    nccl_reduce_scatter(nc, &nc->dp, model->grads, model->grads + model->opt_begin, shard, NCCL_FLOATX, OP_SUM);
    gpt2_norm_partials(model);
    nccl_allreduce(nc, &nc->dp, model->act.norm_partial, NORM_BLOCKS, ncclFloat32, OP_SUM);
    gpt2_norm_final(model);
    gpt2_adamw(model, lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->grad_clip);
    nccl_allgather(nc, &nc->dp, model->params + model->opt_begin, model->params, shard, NCCL_FLOATX);
}

// the mean loss of the group: every rank's per-position losses, summed. With
// stop != NULL, *stop (a signal reached this rank) rides along in the slot
// after the losses and comes back as "a signal reached some rank", so every
// rank ends the step with the same verdict (dp is the world here: tp = pp = 1).
static float dp_mean_loss(GPT2 *model, Parallel *par, int nbatches, int *stop) {
    size_t BT = (size_t)model->B * model->T;
    float flag = stop != NULL && *stop ? 1.0f : 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(model->act.losses + BT, &flag, sizeof(float), cudaMemcpyHostToDevice, model->stream));
    nccl_allreduce(par->nccl, &par->nccl->dp, model->act.losses, BT + 1, ncclFloat32, OP_SUM);
    CUDA_CHECK(cudaMemcpyAsync(&flag, model->act.losses + BT, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    float loss = gpt2_mean_loss(model, nbatches * par->grid.dp);  // waits for the stream, the flag's copy too
    if (stop != NULL) *stop = flag > 0.0f;
    return loss;
}

// the sum over the world of one float per rank (the ranks' verdicts on a
// checkpoint), through the same flag slot
static float world_sum(GPT2 *model, Parallel *par, float x) {
    float *slot = model->act.losses + (size_t)model->B * model->T;
    CUDA_CHECK(cudaMemcpyAsync(slot, &x, sizeof(float), cudaMemcpyHostToDevice, model->stream));
    nccl_allreduce(par->nccl, &par->nccl->world, slot, 1, ncclFloat32, OP_SUM);
    CUDA_CHECK(cudaMemcpyAsync(&x, slot, sizeof(float), cudaMemcpyDeviceToHost, model->stream));
    CUDA_CHECK(cudaStreamSynchronize(model->stream));
    return x;
}

// the checkpoint of step st->step (checkpoint.h; train_gpt2.c's gpt2_save
// does the same with its own layout): rank 0 makes the .partial directory
// with the files at full size, every rank writes its share (ckpt_share) and
// fsyncs, rank 0 seals once every rank has succeeded. Every rank returns the
// same verdict: 0 = the checkpoint is complete; otherwise the .partial
// directory is gone and the previous checkpoints stay.
static int gpt2_checkpoint(GPT2 *model, Parallel *par, const char *out_dir, int keep, const CkptState *st,
                           const uint8_t key[32]) {
    int rank0 = par->grid.rank == 0;
    char err[1200] = "", dir[4096], path[4200];
    float failed = rank0 && ckpt_begin(out_dir, st, err, sizeof(err)) != 0;
    failed = world_sum(model, par, failed);  // and the files exist for everyone
    if (failed == 0) {
        ckpt_dir_name(dir, sizeof(dir), out_dir, st->step, ".partial");
        snprintf(path, sizeof(path), "%s/model.bin", dir);
        int fd_model = open(path, O_WRONLY | O_CLOEXEC), e = fd_model < 0 ? errno : 0;
        snprintf(path, sizeof(path), "%s/optim.bin", dir);
        int fd_optim = open(path, O_WRONLY | O_CLOEXEC);
        if (e == 0 && fd_optim < 0) e = errno;
        if (e == 0) e = gpt2_write_share(model, fd_model, fd_optim,
                                         ckpt_share(model->num_params, model->num_padded, par->grid.dp, par->grid.dp_rank));
        if (e == 0 && (fsync(fd_model) != 0 || fsync(fd_optim) != 0)) e = errno;
        if (fd_model >= 0) close(fd_model);
        if (fd_optim >= 0) close(fd_optim);
        if (e != 0) secure_error(err, sizeof(err), "rank %d: %s: write: %s", par->grid.rank, dir, strerror(e));
        failed = world_sum(model, par, e != 0);
        if (failed == 0 && rank0 && ckpt_seal(out_dir, st->step, key, err, sizeof(err)) != 0) failed = 1;
        if (!rank0 && e == 0) err[0] = '\0';  // rank 0 speaks for the job; a rank that failed, for itself
        failed = world_sum(model, par, rank0 ? failed : 0.0f);
    }
    if (failed == 0 && rank0) ckpt_prune(out_dir, st->step, keep);
    if (failed != 0 && rank0 && ckpt_dir_name(dir, sizeof(dir), out_dir, st->step, ".partial") == 0) ckpt_remove_dir(dir);
    if (err[0] != '\0') fprintf(stderr, "checkpoint of step %d failed: %s\n", st->step, err);
    return failed == 0 ? 0 : -1;
}

// the mean loss over `batches` micro-batches of the val stream, split among
// the data-parallel ranks; every rank returns it
static float evaluate(GPT2 *model, Parallel *par, DataLoader *val, int batches) {
    dataloader_reset(val);
    gpt2_zero_losses(model);
    for (int i = 0; i < batches / par->grid.dp; i++) {
        dataloader_next(val, model->inputs, model->targets);
        gpt2_forward(model, FWD_LOSS, 0.0f);
    }
    return dp_mean_loss(model, par, batches / par->grid.dp, NULL);
}

int main(int argc, char **argv) {
    Options opt;
    GpuOptions gopt;
    char err[2048];
    // the launcher starts the ranks with the command line it was given, GPU flags included
    int launch_argc = argc;
    char **launch_argv = (char **)host_alloc((size_t)(argc + 1) * sizeof(char *), "argv");
    memcpy(launch_argv, argv, (size_t)(argc + 1) * sizeof(char *));
    if (gpu_options_take(&gopt, &argc, argv, err, sizeof(err)) != 0) die_usage(err);
    options_defaults(&opt);
    int rc = options_parse(&opt, argc, argv, err, sizeof(err));
    if (rc == 1) {
        options_usage(stdout, argv[0]);
        fputs(gpu_usage_lines, stdout);
        return 0;
    }
    if (rc != 0) die_usage(err);
    // from here on a signal asks for a checkpoint (with -o), and a full disk
    // fails a write (and says so) instead of killing the process
    if (opt.out_dir) ckpt_catch_signals();
    signal(SIGXFSZ, SIG_IGN);
    if (ckpt_check_flags(&opt, err, sizeof(err)) != 0) die_usage(err);
    if (gpu_layout_check(opt.tp, opt.pp, opt.zero, err, sizeof(err)) != 0) die_usage(err);
    check_launch_gpus(&opt);
    if (opt.check_every > 0) die_usage("flag -ck: the data-parallel consistency check is not built in the GPU trainer yet");
    Fault fault;
    memset(&fault, 0, sizeof(fault));
    if (opt.fault && fault_parse(opt.fault, &fault, err, sizeof(err)) != 0) die_usage(err);
    if (fault.kind == FAULT_TAMPER || fault.kind == FAULT_REPLAY)
        die_usage("flag -fault: tamper and replay act on MAC'd frames, and NCCL messages carry none yet (kill, stall)");

    // the model's shape, the batch and the data, on the host: a bad job is
    // refused once, by the launcher, before any rank starts or a GPU is touched
    GPT2Config config;
    int from_file = config_from_descriptor(&config, opt.init, opt.init_vocab, opt.init_maxT) != 0;
    if (from_file) {
        FILE *f = fopen(opt.init, "rb");
        int version;
        if (f == NULL) {
            snprintf(err, sizeof(err), "%s: cannot open model file: %s", opt.init, strerror(errno));
            die_usage(err);
        }
        rc = model_read_header(f, opt.init, &config, &version, err, sizeof(err));
        fclose(f);
        if (rc != 0) die_usage(err);
    }
    if (opt.T > config.maxT) {
        snprintf(err, sizeof(err), "flag -t: T = %d exceeds the model's maxT = %d (%s)", opt.T, config.maxT, opt.init);
        die_usage(err);
    }
    if (gpu_check_shapes(&config, opt.B, opt.T, opt.init, err, sizeof(err)) != 0) die_usage(err);
    if (batch_accum(&opt, opt.np, err, sizeof(err)) < 0) die_usage(err);
    DataLoader train, val;
    if (!parallel_launched_rank()) {  // else its launcher opened (and hashed) the data just now
        if (dataloader_init(&train, opt.train_pattern, opt.B, opt.T, 0, opt.np, opt.shuffle, 0, config.V, err,
                            sizeof(err)) != 0)
            die_usage(err);
        dataloader_free(&train);
        if (opt.val_every > 0) {
            if (dataloader_init(&val, opt.val_pattern, opt.B, opt.T, 0, opt.np, 0, 0, config.V, err, sizeof(err)) != 0)
                die_usage(err);
            dataloader_free(&val);
        }
    }
    // the checkpoint key and the checkpoint to resume from, verified here (checkpoint.h)
    uint8_t ckpt_key[32];
    CkptState ck;
    char ck_dir[800] = "", path[1024];  // -o is at most 700 bytes
    memset(&ck, 0, sizeof(ck));
    double load_t0 = now_ms();
    int resuming = ckpt_setup(&opt, &config, !parallel_launched_rank(), ckpt_key, &ck, ck_dir, sizeof(ck_dir), err,
                              sizeof(err));
    if (resuming < 0) die_usage(err);
    double verify_ms = now_ms() - load_t0;

    Parallel par;
    parallel_setup(&par, &opt, &fault, launch_argc, launch_argv);
    if (par.grid.rank == 0 && opt.out_dir && ckpt_lock(opt.out_dir, err, sizeof(err)) != 0) {
        fprintf(stderr, "train_gpt2cu: %s\n", err);
        exit(1);
    }
    int rank0 = par.grid.rank == 0, dp = par.grid.dp, B = opt.B, T = opt.T;
    int accum = batch_accum(&opt, dp, err, sizeof(err));  // an outside launcher's world may differ from -np
    if (accum < 0) die_usage(err);
    long total_batch = (long)B * T * dp * accum;
    // the parameters: from the checkpoint, the model file, or the seeded init (params NULL)
    float *params = NULL;
    if (resuming) snprintf(path, sizeof(path), "%s/model.bin", ck_dir);
    if (resuming || from_file) {
        params = model_load(resuming ? path : opt.init, &config, err, sizeof(err));
        if (params == NULL) die_usage(err);
    }
    // data: this rank's slice of the stream
    if (dataloader_init(&train, opt.train_pattern, B, T, par.grid.dp_rank, dp, opt.shuffle, (uint64_t)opt.seed, config.V,
                        err, sizeof(err)) != 0)
        die_usage(err);
    int have_val = opt.val_every > 0;
    if (have_val && dataloader_init(&val, opt.val_pattern, B, T, par.grid.dp_rank, dp, 0, 0, config.V, err,
                                    sizeof(err)) != 0)
        die_usage(err);
    DataLoaderState data_pos = {ck.data[0], ck.data[1], ck.data[2], ck.data[3]};
    if (resuming && dataloader_set_state(&train, &data_pos, err, sizeof(err)) != 0) die_usage(err);
    int steps = opt.steps >= 0 ? opt.steps : (int)(dataloader_batches_per_epoch(&train) / accum);
    if (steps < 1) steps = 1;
    if (resuming && ck.step > steps) {
        secure_error(err, sizeof(err), "flag -x: %d steps, but checkpoint %s is of step %d", steps, ck_dir, ck.step);
        die_usage(err);
    }
    Tokenizer tok;
    int have_tok = opt.tokenizer != NULL && opt.sample_every > 0 && par.grid.world == 1;
    if (have_tok && tokenizer_load_bin(&tok, opt.tokenizer, err, sizeof(err)) != 0) die_usage(err);
    FILE *logf = NULL;
    if (rank0 && (opt.log_file || opt.out_dir)) {  // ckpt_setup made -o
        if (opt.log_file) snprintf(path, sizeof(path), "%s", opt.log_file);
        else snprintf(path, sizeof(path), "%s/log.jsonl", opt.out_dir);
        if (resuming && log_keep_before(path, ck.step, err, sizeof(err)) != 0) die_usage(err);
        logf = fopen(path, resuming ? "a" : "w");
        if (logf == NULL) { snprintf(err, sizeof(err), "%s: cannot create log file: %s", path, strerror(errno)); die_usage(err); }
    }

    // the GPU (bound by parallel_setup)
    int device;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    double peak = gpu_peak_flops(prop.name);
    GPT2 model;
    gpt2_init_dp(&model, &config, params, (uint64_t)opt.seed, B, T, gopt.recompute, gopt.attention_tc, dp,
                 par.grid.dp_rank, par.zero);
    free(params);
    snprintf(path, sizeof(path), "%s/optim.bin", ck_dir);
    if (resuming && gpt2_load_optimizer(&model, path, ck.adam_t, err, sizeof(err)) != 0) die_usage(err);
    double load_ms = now_ms() - load_t0 - verify_ms;
    par.nccl->stream = model.stream;  // the collectives queue behind the model's kernels

    if (rank0) {
        printf("device: %s, compute capability %d.%d, %.1f GiB, ", prop.name, prop.major, prop.minor,
               prop.totalGlobalMem / 1073741824.0);
        if (peak > 0) printf("bf16 dense peak %.0f TFLOPS\n", peak / 1e12);
        else printf("bf16 dense peak unknown (MFU n/a)\n");
        printf("precision: %s compute, fp32 master weights and AdamW state; recompute GELU %d; attention %s; "
               "activations %.2f GiB\n", precision_name, gopt.recompute,
               gopt.attention_tc && attention_tc_supports(config.C / config.NH) ? "tensor cores" : "fp32 FMA",
               model.act_bytes / 1073741824.0);
        printf("model: L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, %zu parameters\n",
               config.L, config.C, config.NH, config.V, config.Vp, config.maxT, model.num_params);
        printf("batch: B=%d T=%d, %d micro-batches per step x dp %d = %ld tokens, %d steps\n", B, T, accum, dp,
               total_batch, steps);
        printf("layout: %d ranks = dp %d x tp 1 x pp 1, ZeRO-%d, NCCL %d.%d.%d\n", par.grid.world, dp, par.zero,
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    }
    for (int r = 0; r < par.grid.world; r++) {  // one line per rank, in rank order, from the rank itself
        if (r == par.grid.rank)
            printf("rank %d (dp %d): GPU %d, AdamW state for %zu of %zu parameters\n", r, par.grid.dp_rank, device,
                   model.opt_count < model.num_params ? model.opt_count : model.num_params, model.num_params);
        fflush(stdout);
        nccl_barrier(par.nccl, &par.nccl->world);
    }
    uint64_t sample_rng = resuming ? ck.sample_rng : (uint64_t)opt.seed * 2654435761ull + 1;
    int start = resuming ? ck.step : 0, stopped = 0;
    if (rank0) ckpt_announce(&opt, resuming ? &ck : NULL, ck_dir, parallel_launched_rank() ? -1.0 : verify_ms, load_ms);
    double fpt = flops_per_token(&config, T);

    for (int step = start; step < steps && !stopped; step++) {
        int last = step == steps - 1;
        nccl_set_step(par.nccl, step);
        float val_loss = -1.0f;
        if (have_val && (step % opt.val_every == 0 || last)) {
            val_loss = evaluate(&model, &par, &val, opt.val_batches);
            if (rank0) printf("val loss %.6f\n", val_loss);
        }
        if (have_tok && step > 0 && (step % opt.sample_every == 0 || last))
            sample(&model, &tok, opt.gen_tokens, &sample_rng);

        CUDA_CHECK(cudaStreamSynchronize(model.stream));
        double t0 = now_ms();
        gpt2_zero_grad(&model);
        gpt2_zero_losses(&model);
        for (int micro = 0; micro < accum; micro++) {
            dataloader_next(&train, model.inputs, model.targets);
            gpt2_forward(&model, FWD_TRAIN, 1.0f / (float)((double)B * T * accum * dp));
            gpt2_backward(&model);
        }
        float lr = lr_at_step(&opt, step, steps);
        dp_update(&model, &par, &opt, lr);
        stopped = ckpt_stop_signal != 0;
        float loss = dp_mean_loss(&model, &par, accum, &stopped);
        float norm = gpt2_last_norm(&model);
        double ms = now_ms() - t0;

        double tok_s = total_batch / (ms / 1e3);
        if (rank0) {
            printf("step %4d/%d | loss %.6f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | %.1f GFLOP/s", step, steps,
                   loss, norm, lr, ms, tok_s, tok_s * fpt / 1e9);
            if (peak > 0) printf(" | MFU %.1f%%\n", 100.0 * tok_s * fpt / (peak * dp));
            else printf(" | MFU n/a\n");
            fflush(stdout);
            log_step(logf, step, loss, val_loss, norm, lr, ms, total_batch * (step + 1));
        }
        int done = step + 1;
        if (stopped || (opt.ckpt_every > 0 && (done % opt.ckpt_every == 0 || done == steps))) {
            DataLoaderState pos;
            dataloader_get_state(&train, &pos);
            CkptState st = {done, model.adam_t, config, B, T, (int)total_batch, steps, opt.seed, opt.shuffle,
                            {pos.epoch, pos.shard_pos, pos.sample_pos, pos.rng}, sample_rng,
                            par.grid.world, par.grid.tp, par.grid.pp, par.zero};
            double c0 = now_ms();
            if (gpt2_checkpoint(&model, &par, opt.out_dir, opt.ckpt_keep, &st, ckpt_key) != 0) return 1;
            if (rank0) printf("checkpoint %s/ckpt_%08d written in %.0f ms\n", opt.out_dir, done, now_ms() - c0);
        }
        if (stopped && rank0) printf("stopped by a signal after step %d; resume with -y 1\n", step);
    }

    if (opt.out_dir && !stopped) {
#ifndef ENABLE_FP32
        if (par.zero == 1) {  // the master weights outside this rank's shard are stale: gather them
            size_t shard = model.num_padded / (size_t)dp;
            nccl_allgather(par.nccl, &par.nccl->dp, model.master + model.opt_begin, model.master, shard, ncclFloat32);
        }
#endif
        snprintf(path, sizeof(path), "%s/model_%08d.bin", opt.out_dir, steps);
        if (rank0 && gpt2_save(&model, path, err, sizeof(err)) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        if (rank0) printf("wrote %s\n", path);
    }
    if (logf) fclose(logf);
    dataloader_free(&train);
    if (have_val) dataloader_free(&val);
    if (have_tok) tokenizer_free(&tok);
    nccl_free(par.nccl);
    gpt2_free(&model);
    launch_free(&par.launch);
    free(launch_argv);
    return 0;
}
#endif
