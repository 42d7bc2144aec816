/*
 * llm3d/cuda/classifier.cuh: softmax and cross-entropy over the vocabulary,
 * with the gradient written over the logits.
 *
 * defines:
 *   classifier, classifier_smem_kernel, classifier_kernel
 *                        the fused classifier (one rank holds every logit of
 *                        a row): smem_kernel reads a row once, keeping it in
 *                        shared memory; classifier_kernel reads it twice, for
 *                        rows wider than shared memory
 *   classifier_stats_kernel, classifier_tp_kernel
 *                        the vocabulary-parallel one: classifier_stats_kernel,
 *                        then classifier_tp_kernel once the ranks have
 *                        swapped their row statistics
 *   CLASSIFIER_THREADS   the block size the three kernels are built for
 */
#ifndef LLM3D_CLASSIFIER_CUH
#define LLM3D_CLASSIFIER_CUH

#include <math.h>

#include "llm3d/cuda/cuda_common.cuh"

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

// the online max and sum of exp(z - max) of one row's x[0..n), one block per
// row (rows 16-byte aligned, so read PACK at a time): each thread its share,
// then each warp, then the block; every thread gets the row's pair. It
// synchronizes the block, so whatever each thread read of x before is read.
static __device__ float2 row_softmax_stats(const floatX *x, int n) {
    __shared__ float shared_m[32], shared_s[32];
    float m = -INFINITY, s = 0.0f;  // online max and sum of exp(z - m)
    for (int i = threadIdx.x * PACK; i < n; i += blockDim.x * PACK) {
        Pack p = load_pack(x + i);
        for (int k = 0; k < PACK && i + k < n; k++) {
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
    __syncthreads();
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) softmax_merge(&m, &s, shared_m[w], shared_s[w]);
    return make_float2(m, s);
}

__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_kernel(floatX *logits, float *losses, const int *targets, float dloss, int V, int Vp, int write_dlogits) {
    int row = blockIdx.x;
    floatX *x = logits + (size_t)row * Vp;
    int target = targets[row];
    float z_target = to_f(x[target]);  // read before anyone overwrites it (row_softmax_stats syncs)
    float2 st = row_softmax_stats(x, V);
    float lse = st.x + logf(st.y);
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

// the same in one read of the row: the block copies its row into shared
// memory as it reads it, and the statistics and the gradient come from there,
// so the logits are read once and written once (at d12, B = 64, T = 1024:
// 13.2 GB moved against classifier_kernel's 19.8 GB). The max first, then the
// sum of exp(z - max): two block reductions, no rescaling per element. Each
// thread reads back only the packs it stored. A bf16 row of GPT-2's Vp =
// 50304 takes 98 KiB: two blocks of 1024 threads an SM, all of an H100's
// warps. (Registers cannot hold it: 8 packs a thread spilled, ptxas -v.)
__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_smem_kernel(floatX *logits, float *losses, const int *targets, float dloss, int V, int Vp, int write_dlogits) {
    extern __shared__ Pack row_packs[];  // the row, Vp / PACK packs
    int row = blockIdx.x;
    floatX *x = logits + (size_t)row * Vp;
    int target = targets[row];
    float m = -INFINITY;
    for (int i = threadIdx.x * PACK; i < Vp; i += blockDim.x * PACK) {
        Pack p = load_pack(x + i);
        row_packs[i / PACK] = p;
        for (int k = 0; k < PACK; k++)
            if (i + k < V) m = fmaxf(m, to_f(p.v[k]));
    }
    m = block_max(m);
    float s = 0.0f, z_target = 0.0f;
    int has_target = 0;
    for (int i = threadIdx.x * PACK; i < Vp; i += blockDim.x * PACK) {
        Pack p = row_packs[i / PACK];
        for (int k = 0; k < PACK; k++) {
            if (i + k < V) s += expf(to_f(p.v[k]) - m);
            if (i + k == target) {
                z_target = to_f(p.v[k]);
                has_target = 1;
            }
        }
    }
    s = block_sum(s);
    float lse = m + logf(s);
    if (has_target) losses[row] += lse - z_target;
    if (!write_dlogits) return;
    for (int i = threadIdx.x * PACK; i < Vp; i += blockDim.x * PACK) {
        Pack p = row_packs[i / PACK], d;
        for (int k = 0; k < PACK; k++) {
            int col = i + k;
            float prob = col < V ? expf(to_f(p.v[k]) - lse) : 0.0f;
            d.v[k] = to_x(col < V ? (prob - (col == target ? 1.0f : 0.0f)) * dloss : 0.0f);
        }
        store_pack(x + i, d);
    }
}

// ----------------------------------------------------------------------------
// the vocabulary-parallel classifier: each rank holds Vl = Vp/tp rows of
// wte, so each holds Vl logits of every row


// per row, the max and the sum of exp(z - max) over this slice's nreal real
// columns (online, as classifier_kernel); stats[row] = (max, sum)
__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_stats_kernel(float2 *stats, const floatX *logits, int Vl, int nreal) {
    float2 st = row_softmax_stats(logits + (size_t)blockIdx.x * Vl, nreal);
    if (threadIdx.x == 0) stats[blockIdx.x] = st;
}

// all_stats: (tp, BT) from every slice, merged in slice order (the same on
// every rank). The rank holding a row's target adds its loss; dlogits over
// this slice's logits as classifier_kernel's, padded columns 0.
__global__ void __launch_bounds__(CLASSIFIER_THREADS)
classifier_tp_kernel(floatX *logits, float *losses, const int *targets, const float2 *all_stats, int tp, int BT,
                     float dloss, int v0, int Vl, int nreal, int write_dlogits) {
    int row = blockIdx.x;
    floatX *x = logits + (size_t)row * Vl;
    float m = -INFINITY, s = 0.0f;
    for (int r = 0; r < tp; r++) softmax_merge(&m, &s, all_stats[(size_t)r * BT + row].x, all_stats[(size_t)r * BT + row].y);
    float lse = m + logf(s);
    int col = targets[row] - v0;  // the target's column in this slice, if it is here
    if (threadIdx.x == 0 && col >= 0 && col < nreal) losses[row] += lse - to_f(x[col]);
    __syncthreads();  // the target's logit is read before anyone overwrites it
    if (!write_dlogits) return;
    for (int i = threadIdx.x; i < Vl; i += blockDim.x) {
        float g = i < nreal ? (expf(to_f(x[i]) - lse) - (i == col ? 1.0f : 0.0f)) * dloss : 0.0f;
        x[i] = to_x(g);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// the fused classifier: the one-read kernel where a row fits in a block's
// shared memory (any GPT-2 vocabulary on an H100: 98 KiB in bf16, 197 KiB in
// fp32, of 227 KiB), else the two-read one
static void classifier(floatX *logits, float *losses, const int *targets, float dloss, int BT, int V, int Vp,
                       int write_dlogits, cudaStream_t stream) {
    int device, smem_max;
    size_t row_bytes = (size_t)Vp * sizeof(floatX);
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (row_bytes + 1024 <= (size_t)smem_max) {  // 1 KiB left for the reductions' static arrays
        CUDA_CHECK(cudaFuncSetAttribute(classifier_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)row_bytes));
        classifier_smem_kernel<<<BT, CLASSIFIER_THREADS, row_bytes, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                                               write_dlogits);
    } else {
        classifier_kernel<<<BT, CLASSIFIER_THREADS, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    }
    CUDA_CHECK(cudaGetLastError());
}

#endif
