/*
 * llm3d/cuda/attention.cuh: causal self-attention, flash style.
 *
 * defines:
 *   attention_forward, attention_backward
 *                          the launchers, which pick the kernels: on tensor
 *                          cores when asked and the head size allows
 *   attention_supports     the head sizes the kernels cover
 *   attention_tc_supports  the head sizes the tensor-core kernels cover
 *   attention_forward_kernel, attention_backward_dq_kernel,
 *   attention_backward_dkdv_kernel, attention_delta_kernel
 *                          the kernels on fp32 FMA (every build, head sizes
 *                          16 to 128)
 *   attention_forward_tc_kernel, attention_backward_dq_tc_kernel,
 *   attention_backward_dkdv_tc_kernel
 *                          the kernels on tensor cores (bf16 build, head
 *                          sizes 16 to 64)
 */
#ifndef LLM3D_ATTENTION_CUH
#define LLM3D_ATTENTION_CUH

#include <assert.h>
#include <math.h>
#include <stdint.h>

#include "llm3d/cuda/cuda_common.cuh"

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

// ptxas, left to itself, gives the forward 64 registers for head sizes 16
// and 32 and spills 16 bytes of them in the fp32 build; asking for 3 blocks
// per SM lets it take 80 and spill nothing (the arithmetic is the same).
// From 64 on it fits on its own (0: no minimum).
static __host__ __device__ constexpr int att_forward_min_blocks(int hs) { return hs <= 32 ? 3 : 0; }

template <int HS>
__global__ void __launch_bounds__(ATT_THREADS, att_forward_min_blocks(HS))
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

// delta[b,h,t] = dout[b,t,h,:] . out[b,t,h,:], the softmax backward's row
// term. HS / PACK threads a row (2 to 32, a power of 2), each one 16-byte pack
// of out and of dout, summed across them by shuffles: a warp's loads are
// contiguous (512 bytes of each at HS = 64), where one thread a row read 8
// bytes 128 bytes apart. Threads past the last row take part in the shuffles.
__global__ void attention_delta_kernel(float *delta, const floatX *out, const floatX *dout, int B, int T, int NH,
                                       int HS) {
    int G = HS / PACK;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t row = idx / G;  // (b, t, h) in out's order: (b * T + t) * NH + h
    int part = (int)(idx % G);
    int live = row < (size_t)B * T * NH;
    float sum = 0.0f;
    if (live) {
        Pack o = load_pack(out + row * HS + part * PACK), d = load_pack(dout + row * HS + part * PACK);
        for (int k = 0; k < PACK; k++) sum += to_f(o.v[k]) * to_f(d.v[k]);
    }
    for (int offset = G / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (live && part == 0) {
        int h = (int)(row % NH);
        size_t bt = row / NH;
        delta[((bt / T) * NH + h) * T + bt % T] = sum;
    }
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
// block is 4 warps = 64 rows; the other side's tiles (64 rows) sit in shared
// memory in bf16, two of each: cp.async copies the next tile while the block
// computes on this one.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), lane = 4 * gid + tig:
//   A (16x16, row-major): a0 = A[gid][2tig..2tig+1], a1 = A[gid+8][2tig..],
//                         a2 = A[gid][2tig+8..],     a3 = A[gid+8][2tig+8..]
//   B (16x8, "col"):      b0 = B[2tig..2tig+1][gid], b1 = B[2tig+8..2tig+9][gid]
//   C (16x8, fp32):       c0,c1 = C[gid][2tig..2tig+1], c2,c3 = C[gid+8][2tig..]
// so two C tiles side by side (16 x 16) are, packed to bf16, exactly an A
// fragment: the softmax stays in registers between the two products. Each
// 32-bit register holds two bf16, the lower-indexed one in the low half.
// Every tile sits in shared memory row-major, as it lies in memory. A B
// fragment of a row-major tile's transpose (V in P V, K in dS K, dO in P^T
// dO, Q in dS^T Q) comes from ldmatrix .trans, which hands each lane the
// column pair the fragment wants, so no tile is ever stored transposed
// (scalar 2-byte stores into a transposed tile were 8-way bank-conflicted).
// Shared rows are padded by 8 bf16 so the 8 rows one 8x8 matrix of ldmatrix,
// or one B fragment, reads fall in 8 different bank groups.

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

// the B fragments of two 8-column tiles of the transpose of 16 rows of a
// row-major shared tile, its columns col..col+7 and col+8..col+15: b[0], b[1]
// for the first, b[2], b[3] for the second. rows points at the first of the
// 16 rows. Lane l names row l % 16 at column col + (l / 16) * 8: lanes 0-7 and
// 8-15 the two 8x8 matrices of the first tile (rows 0-7 and 8-15), lanes
// 16-31 those of the second; .trans gives lane 4 * gid + tig the pair of rows
// (2 tig, 2 tig + 1) in column gid of each: b0 and b1 of mma's B fragment.
template <int LD>
static __device__ __forceinline__ void ldmatrix_trans_x4(uint32_t b[4], const __nv_bfloat16 (*rows)[LD], int col, int lane) {
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(&rows[lane % 16][col + (lane / 16) * 8]);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr)
                 : "memory");
}

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

// cp.async: 16 bytes from global to shared memory without a trip through
// registers. The copies a thread issued before cp_async_commit form a group;
// cp_async_wait<N> returns once all but the newest N of its groups landed.
static __device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// starts copying rows row0..row0+63 (clamped to T-1) of one head's HS columns
// into shared memory, row-major, 16 bytes at a time (cp.async: they land by
// a later cp_async_wait). src points at the head's column 0 of sequence row 0.
template <int HS>
static __device__ __forceinline__ void load_tile(__nv_bfloat16 (*rm)[HS + TC_PAD], const __nv_bfloat16 *src, size_t ld,
                                                 int row0, int T) {
    for (int idx = threadIdx.x; idx < TC_ROWS * HS / 8; idx += TC_THREADS) {
        int j = idx / (HS / 8), c = (idx % (HS / 8)) * 8, row = min(row0 + j, T - 1);
        cp_async16(&rm[j][c], src + (size_t)row * ld + c);
    }
}

template <int HS>
__global__ void __launch_bounds__(TC_THREADS)
attention_forward_tc_kernel(floatX *out, float *lse, const floatX *qkv, int T, int NH) {
    constexpr int KS = HS / 16, DN = HS / 8;  // k-steps over the head, 8-column tiles of the head
    __shared__ __align__(16) __nv_bfloat16 sk_buf[2][TC_ROWS][HS + TC_PAD];  // two tiles: one computed on,
    __shared__ __align__(16) __nv_bfloat16 sv_buf[2][TC_ROWS][HS + TC_PAD];  // the next one landing
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
    int ntiles = (min(T, (qtile + 1) * TC_ROWS) + TC_ROWS - 1) / TC_ROWS;  // the key tiles in the block's past
    load_tile<HS>(sk_buf[0], seq + C, C3, 0, T);
    load_tile<HS>(sv_buf[0], seq + 2 * C, C3, 0, T);
    cp_async_commit();
    for (int it = 0; it < ntiles; it++) {
        int k0 = it * TC_ROWS, buf = it & 1;
        if (it + 1 < ntiles) {  // the next tile's copies fly while this one is computed on
            load_tile<HS>(sk_buf[buf ^ 1], seq + C, C3, k0 + TC_ROWS, T);
            load_tile<HS>(sv_buf[buf ^ 1], seq + 2 * C, C3, k0 + TC_ROWS, T);
        }
        cp_async_commit();  // (an empty group on the last tile keeps the count)
        cp_async_wait<1>();  // every group but the newest landed: this tile's
        __syncthreads();
        __nv_bfloat16(*sk)[HS + TC_PAD] = sk_buf[buf];
        __nv_bfloat16(*sv)[HS + TC_PAD] = sv_buf[buf];
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
            for (int d = 0; d < DN; d += 2) {
                uint32_t vb[4];
                ldmatrix_trans_x4<HS + TC_PAD>(vb, &sv[kk * 16], d * 8, lane);
                mma_16816(o[d], pa, vb[0], vb[1]);
                mma_16816(o[d + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads();  // every warp is done with this tile before the next iteration copies into it
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
    __shared__ __align__(16) __nv_bfloat16 sk_buf[2][TC_ROWS][HS + TC_PAD];  // as the forward's
    __shared__ __align__(16) __nv_bfloat16 sv_buf[2][TC_ROWS][HS + TC_PAD];
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
    int ntiles = (min(T, (qtile + 1) * TC_ROWS) + TC_ROWS - 1) / TC_ROWS;
    load_tile<HS>(sk_buf[0], seq + C, C3, 0, T);
    load_tile<HS>(sv_buf[0], seq + 2 * C, C3, 0, T);
    cp_async_commit();
    for (int it = 0; it < ntiles; it++) {
        int k0 = it * TC_ROWS, buf = it & 1;
        if (it + 1 < ntiles) {
            load_tile<HS>(sk_buf[buf ^ 1], seq + C, C3, k0 + TC_ROWS, T);
            load_tile<HS>(sv_buf[buf ^ 1], seq + 2 * C, C3, k0 + TC_ROWS, T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        __nv_bfloat16(*sk)[HS + TC_PAD] = sk_buf[buf];
        __nv_bfloat16(*sv)[HS + TC_PAD] = sv_buf[buf];
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
            for (int d = 0; d < DN; d += 2) {
                uint32_t kb[4];
                ldmatrix_trans_x4<HS + TC_PAD>(kb, &sk[kk * 16], d * 8, lane);
                mma_16816(dq[d], dsa, kb[0], kb[1]);
                mma_16816(dq[d + 1], dsa, kb[2], kb[3]);
            }
        }
        __syncthreads();  // every warp is done with this tile before the next iteration copies into it
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
    __shared__ __align__(16) __nv_bfloat16 sq_buf[2][TC_ROWS][HS + TC_PAD];  // two tiles, as the forward's
    __shared__ __align__(16) __nv_bfloat16 sdo_buf[2][TC_ROWS][HS + TC_PAD];
    __shared__ float slse_buf[2][TC_ROWS], sdelta_buf[2][TC_ROWS];
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
    // the query tiles from the block's own on: tile it's rows, statistics
    // and all, go into buffer it & 1 while tile it - 1 is computed on
    int ntiles = (T - ktile * TC_ROWS + TC_ROWS - 1) / TC_ROWS;
    for (int it = -1; it < ntiles; it++) {
        int q0 = (ktile + it) * TC_ROWS, buf = it & 1;
        if (it + 1 < ntiles) {
            int next = q0 + TC_ROWS, nbuf = (it + 1) & 1;
            load_tile<HS>(sq_buf[nbuf], seq, C3, next, T);
            load_tile<HS>(sdo_buf[nbuf], dseq, C, next, T);
            for (int j = threadIdx.x; j < TC_ROWS; j += TC_THREADS) {
                int tq = min(next + j, T - 1);
                slse_buf[nbuf][j] = lse[stat + tq];
                sdelta_buf[nbuf][j] = delta[stat + tq];
            }
        }
        cp_async_commit();
        if (it < 0) continue;  // the first tile's copies only
        cp_async_wait<1>();
        __syncthreads();
        __nv_bfloat16(*sq)[HS + TC_PAD] = sq_buf[buf];
        __nv_bfloat16(*sdo)[HS + TC_PAD] = sdo_buf[buf];
        const float *slse = slse_buf[buf], *sdelta = sdelta_buf[buf];
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
            for (int d = 0; d < DN; d += 2) {
                uint32_t db[4], qb[4];
                ldmatrix_trans_x4<HS + TC_PAD>(db, &sdo[kk * 16], d * 8, lane);
                ldmatrix_trans_x4<HS + TC_PAD>(qb, &sq[kk * 16], d * 8, lane);
                mma_16816(dv[d], pa, db[0], db[1]);
                mma_16816(dv[d + 1], pa, db[2], db[3]);
                mma_16816(dk[d], dsa, qb[0], qb[1]);
                mma_16816(dk[d + 1], dsa, qb[2], qb[3]);
            }
        }
        __syncthreads();  // every warp is done with this tile before the next iteration copies into it
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
// kernel launchers

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

// one attention call: the forward (out and lse from qkv) or the backward
// (dqkv from qkv, dout, lse and delta), on tensor cores when tc
typedef struct {
    int backward, tc;
    floatX *out, *dqkv;
    float *lse;  // written by the forward, read by the backward
    const floatX *qkv, *dout;
    const float *delta;
    int B, T, NH;
    cudaStream_t stream;
} AttentionCall;

// the kernels of head size HS for call a
template <int HS>
static void attention_launch(const AttentionCall *a) {
#ifndef ENABLE_FP32
    if constexpr (HS <= 64) {  // larger heads have no tensor-core kernels (attention_tc_supports)
        if (a->tc) {
            dim3 grid(ceil_div(a->T, TC_ROWS), a->NH, a->B);
            if (!a->backward) {
                attention_forward_tc_kernel<HS><<<grid, TC_THREADS, 0, a->stream>>>(a->out, a->lse, a->qkv, a->T, a->NH);
            } else {
                attention_backward_dq_tc_kernel<HS><<<grid, TC_THREADS, 0, a->stream>>>(a->dqkv, a->qkv, a->dout, a->lse,
                                                                                       a->delta, a->T, a->NH);
                attention_backward_dkdv_tc_kernel<HS><<<grid, TC_THREADS, 0, a->stream>>>(a->dqkv, a->qkv, a->dout,
                                                                                         a->lse, a->delta, a->T, a->NH);
            }
            CUDA_CHECK(cudaGetLastError());
            return;
        }
    }
#endif
    dim3 grid(ceil_div(a->T, ATT_ROWS), a->NH, a->B);
    if (!a->backward) {
        attention_forward_kernel<HS><<<grid, ATT_THREADS, 0, a->stream>>>(a->out, a->lse, a->qkv, a->T, a->NH);
    } else {
        attention_backward_dq_kernel<HS><<<grid, ATT_THREADS, 0, a->stream>>>(a->dqkv, a->qkv, a->dout, a->lse,
                                                                              a->delta, a->T, a->NH);
        attention_backward_dkdv_kernel<HS><<<grid, ATT_THREADS, 0, a->stream>>>(a->dqkv, a->qkv, a->dout, a->lse,
                                                                                a->delta, a->T, a->NH);
    }
    CUDA_CHECK(cudaGetLastError());
}

// the one place a head size becomes a template instance
static void attention_launch_head_size(const AttentionCall *a, int hs) {
    switch (hs) {
    case 16: attention_launch<16>(a); break;
    case 32: attention_launch<32>(a); break;
    case 64: attention_launch<64>(a); break;
    case 128: attention_launch<128>(a); break;
    default: assert(0 && "head size checked by gpu_check_shapes");
    }
}

// tc: use the tensor-core kernels where attention_tc_supports(C/NH)
static void attention_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int C, int NH, int tc,
                              cudaStream_t stream) {
    AttentionCall a = {};
    a.tc = tc && attention_tc_supports(C / NH);
    a.out = out, a.lse = lse, a.qkv = qkv;
    a.B = B, a.T = T, a.NH = NH, a.stream = stream;
    attention_launch_head_size(&a, C / NH);
}

// dqkv (B,T,3C) is written whole; delta is scratch of B*NH*T floats
static void attention_backward(floatX *dqkv, float *delta, const floatX *dout, const floatX *qkv, const floatX *out,
                               const float *lse, int B, int T, int C, int NH, int tc, cudaStream_t stream) {
    int HS = C / NH;
    attention_delta_kernel<<<ceil_div((long)B * T * NH * (HS / PACK), 256), 256, 0, stream>>>(delta, out, dout, B, T, NH,
                                                                                               HS);
    CUDA_CHECK(cudaGetLastError());
    AttentionCall a = {};
    a.backward = 1;
    a.tc = tc && attention_tc_supports(HS);
    a.dqkv = dqkv, a.qkv = qkv, a.dout = dout, a.delta = delta;
    a.lse = (float *)lse;  // only read
    a.B = B, a.T = T, a.NH = NH, a.stream = stream;
    attention_launch_head_size(&a, HS);
}

#endif
