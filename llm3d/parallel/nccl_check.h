/*
 * llm3d/parallel/nccl_check.h: checked collectives over NCCL (-ic 1), the
 * GPU trainer's side of sketch.h. NCCL's ring runs inside its own kernels,
 * out of sight, so unlike shm_comm.h no hop can be checked: each member
 * sketches what it puts in and what it gets out, piece by piece, on its GPU,
 * and at the step's check point (nccl_comm.h's nccl_check_point, before the
 * update) the group all-gathers the records and every member judges them
 * alike.
 *
 * defines:
 *   pure C, compiled everywhere (test_integrity checks it):
 *     NCHK_BLOCKS, NCHK_THREADS, NCHK_WARPS
 *                          the sketch kernel's fixed grid (its order of sums)
 *     nchk_rec_count, nchk_rec_in, nchk_rec_out
 *                          a member's record of one collective: 2p sketches
 *     nchk_coef_count, nchk_coef_pack
 *                          sketch.h's coefficients as the GPU reads them
 *                          (floats: each one exact)
 *     nchk_sketch_ref      the GPU kernel's sums, in its order, on the host
 *     nchk_flip_key, nchk_flip_pick
 *                          which value -fault corrupt (corrupt-low) flips
 *     nchk_unit_roundoff   u of a sum of fp32 or bf16 values
 *     NchkCase, nchk_judge, nchk_judge_broadcast, nchk_copies
 *                          the verdict on a group's records of one collective
 *   in CUDA builds (__CUDACC__), the kernels:
 *     nchk_sketch_kernel, nchk_final_kernel
 *                          the sketch of p pieces, then their records
 *     nchk_scale_kernel    -fault poison: a rank's gradients x100
 *     nchk_flip_kernel     -fault corrupt, corrupt-low: one bit flipped
 *     nchk_slots_kernel    this rank's gradient sum of squares into its slot
 *
 * The record. For a group of p, member q keeps 2p sketches (sketch.h's
 * Sketch) of one collective: in[k] (k = 0..p-1), of its input's piece k,
 * full (with |r|.|x| and the sum of squares), and out[k], of its output's
 * piece k. The pieces are sketch.h's chunks (sketch_chunk): an all-reduce's
 * n elements cut in p, a reduce-scatter's or all-gather's pieces of n. An
 * all-reduce fills in[0..p-1] and out[0..p-1]; a reduce-scatter in[0..p-1]
 * and out[me]; an all-gather in[me] and out[0..p-1]; a broadcast of n
 * elements from member root (SK_BROADCAST: one piece, the whole vector) its
 * root in[root], of the buffer before the call, and every member out[root],
 * of the buffer after it; the rest stay zero.
 *
 * The coefficients are sketch.h's (sketch_draw, with the step, the group's
 * digest, the call's number on that group, the op and the vector's length),
 * drawn on the host and copied to the GPU: r_j = a[j / K] b[j % K], two
 * sketches. Each is +-(2^15 + m) / 2^16, exact in a float, so the GPU reads
 * floats, and b x_j is exact in double (17 + 24 bits).
 *
 * The order (nchk_sketch_kernel, nchk_sketch_ref). A piece's elements are
 * cut at the K-blocks of the vector into segments; warp w of the fixed grid
 * (NCHK_WARPS warps) takes the piece's segments w, w + NCHK_WARPS, ...; lane
 * l of a segment sums, in double, the products of its elements j with
 * j = l (mod 32), in order (at most K/32 = 16 of them); the 32 lanes meet in
 * a fixed tree (5 levels), and the warp adds the segment into its running
 * sums with one fma by the segment's a. The 8 warps of a block meet in a
 * fixed tree (3 levels), the NCHK_BLOCKS blocks in another (7 levels). So
 * the result depends only on the values, the piece's first index and its
 * length: an owner's sketch of a piece and a receiver's sketch of its copy
 * agree bit for bit, whatever the buffers' addresses. Its rounding error is
 * at most (15 + 5 + N/K + 1 + 3 + 7) 2^-53 of sum |r||x|, below sketch.h's
 * sketch_eval_error(N) = (K/8 + 16 + 2N/K) 2^-53, so sketch_sum_bound holds
 * for these sketches as it is.
 *
 * The checks (nchk_judge), with u = 2^-24 for fp32 and 2^-8 for bf16 (NCCL
 * rounds bf16 partial sums at every hop), p the group's size:
 *   all-reduce: for each chunk k, each member's out[k] against the sum of
 *     every member's in[k], within sketch_sum_bound; off on every member:
 *     an input changed after its sketch, or the reduction was wrong (the
 *     sketches cannot say whose); off on some: the copy of those members;
 *   reduce-scatter: member k's out[k] against the sum of every in[k], the
 *     same bound: the shard of member k is named;
 *   all-gather: each member's out[k] against member k's in[k], bit for bit:
 *     a member whose copy differs is named; where every copy differs alike,
 *     the owner's piece changed after its sketch (its memory);
 *   broadcast: the same, for the root's one piece (tp rank 0's replicated
 *     gradients, which every tp rank then applies).
 * Inputs that are not finite are the trainer's not-finite rule's, not this
 * check's. doc/security.md, "Checked collectives on the GPU", says more.
 */
#ifndef LLM3D_NCCL_CHECK_H
#define LLM3D_NCCL_CHECK_H

#include "llm3d/parallel/sketch.h"  // Sketch, SketchGen, sketch_draw, sketch_chunk, sketch_sum_bound, SK_*

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NCHK_BLOCKS 128                         // the sketch kernel's blocks per piece, fixed
#define NCHK_THREADS 256                        // 8 warps a block
#define NCHK_WARPS (NCHK_BLOCKS * (NCHK_THREADS / 32))
#define NCHK_FLIP_SCAN 16384                    // -fault corrupt flips one of a rank's first this many values (nchk_flip_key)

#ifdef __CUDACC__
#define NCHK_HOST_DEVICE __host__ __device__    // nchk_flip_key: the same rule in the kernel and on the host
#else
#define NCHK_HOST_DEVICE
#endif

static inline size_t nchk_rec_count(int p) { return (size_t)(2 * p); }
static inline size_t nchk_rec_in(int p, int k) { (void)p; return (size_t)k; }
static inline size_t nchk_rec_out(int p, int k) { return (size_t)(p + k); }

// the coefficients of a vector of `blocks` K-blocks, as floats: b of sketch
// 0, b of sketch 1, then a of sketch 0 and 1 per block, interleaved
static inline size_t nchk_coef_count(size_t blocks) { return 2 * SKETCH_BLOCK + 2 * blocks; }

static inline void nchk_coef_pack(const SketchGen *g, float *out) {
    for (int i = 0; i < SKETCH_BLOCK; i++) {
        out[i] = (float)g->b[0][i];
        out[SKETCH_BLOCK + i] = (float)g->b[1][i];
    }
    for (size_t j = 0; j < 2 * g->blocks; j++) out[2 * SKETCH_BLOCK + j] = (float)g->a[j];
}

static inline double nchk_unit_roundoff(int bf16) { return ldexp(1.0, bf16 ? -8 : -24); }

// nchk_flip_key: which value -fault corrupt (low 0) or corrupt-low (low 1)
// flips: the first of the largest key. corrupt-low: the largest magnitude
// (its last place is the largest change bit 0 can make). corrupt flips bit
// 30, the exponent's highest, which scales a value below 1 by 2^128 but
// takes one of 2 or more to about 0, a change of its own size, which a bf16
// bound over many such values can hide: so the largest value below 1 (a
// zero or a subnormal only when no other is below 1: it becomes 2 to 4);
// then any in [1, 2) (made infinite or NaN); only when every value is 2 or
// more (or not finite), the largest of them. Keys: [0, 1), -1, [-2.5, -2), -3.
static inline NCHK_HOST_DEVICE float nchk_flip_key(float v, int low) {
    float a = fabsf(v);
    if (low) return a;
    if (a < 1.0f) return a;
    if (a < 2.0f) return -1.0f;
    if (a <= FLT_MAX) return -2.0f - 1.0f / a;
    return -3.0f;
}

// nchk_flip_pick: the index the flip kernel picks among x[0 .. n) (all of
// them: the caller cuts at NCHK_FLIP_SCAN), on the host
static inline size_t nchk_flip_pick(const float *x, size_t n, int low) {
    size_t at = 0;
    float best = -4.0f;
    for (size_t i = 0; i < n; i++) {
        float key = nchk_flip_key(x[i], low);
        if (key > best) best = key, at = i;
    }
    return at;
}

// nchk_sketch_ref: the sketch of x[0 .. len) as elements g0 .. g0 + len - 1
// of the vector, in nchk_sketch_kernel's order (full: with |r|.|x| and the
// squares; coef NULL: the squares alone). What the tests compare the GPU's
// arithmetic with, on the host.
static inline Sketch nchk_sketch_ref(const float *x, size_t g0, size_t len, const float *coef, int full) {
    static double warp[NCHK_WARPS][5];
    memset(warp, 0, sizeof(warp));
    size_t first = g0 / SKETCH_BLOCK, last = len > 0 ? (g0 + len - 1) / SKETCH_BLOCK : first;
    for (size_t blk = first; len > 0 && blk <= last; blk++) {
        size_t w = (blk - first) % NCHK_WARPS;
        size_t lo = blk * SKETCH_BLOCK > g0 ? blk * SKETCH_BLOCK : g0;
        size_t hi = (blk + 1) * SKETCH_BLOCK < g0 + len ? (blk + 1) * SKETCH_BLOCK : g0 + len;
        double lane[32][5];
        memset(lane, 0, sizeof(lane));
        for (size_t j = lo; j < hi; j++) {
            double v = (double)x[j - g0], av = fabs(v);
            double *L = lane[j % 32];
            if (coef != NULL) {
                L[0] += (double)coef[j % SKETCH_BLOCK] * v;
                L[1] += (double)coef[SKETCH_BLOCK + j % SKETCH_BLOCK] * v;
                if (full) {
                    L[2] += fabs((double)coef[j % SKETCH_BLOCK]) * av;
                    L[3] += fabs((double)coef[SKETCH_BLOCK + j % SKETCH_BLOCK]) * av;
                }
            }
            if (full) L[4] += v * v;
        }
        for (int off = 16; off >= 1; off /= 2)
            for (int l = 0; l < off; l++)
                for (int k = 0; k < 5; k++) lane[l][k] += lane[l + off][k];
        double a0 = coef != NULL ? (double)coef[2 * SKETCH_BLOCK + 2 * blk] : 0.0;
        double a1 = coef != NULL ? (double)coef[2 * SKETCH_BLOCK + 2 * blk + 1] : 0.0;
        warp[w][0] = fma(a0, lane[0][0], warp[w][0]);
        warp[w][1] = fma(a1, lane[0][1], warp[w][1]);
        warp[w][2] = fma(fabs(a0), lane[0][2], warp[w][2]);
        warp[w][3] = fma(fabs(a1), lane[0][3], warp[w][3]);
        warp[w][4] += lane[0][4];
    }
    double block[NCHK_BLOCKS][5];
    for (int b = 0; b < NCHK_BLOCKS; b++) {
        double (*v)[5] = warp + b * 8;
        for (int k = 0; k < 5; k++)
            block[b][k] = ((v[0][k] + v[1][k]) + (v[2][k] + v[3][k])) + ((v[4][k] + v[5][k]) + (v[6][k] + v[7][k]));
    }
    for (int stride = NCHK_BLOCKS / 2; stride >= 1; stride /= 2)
        for (int b = 0; b < stride; b++)
            for (int k = 0; k < 5; k++) block[b][k] += block[b + stride][k];
    Sketch s = {{block[0][0], block[0][1]}, {block[0][2], block[0][3]}, block[0][4]};
    return s;
}

// ----------------------------------------------------------------------------
// the verdict

typedef struct {
    int kind;             // SK_*
    int p;                // the group's size
    const int *ranks;     // its members' world ranks
    size_t n;             // all-reduce: the vector's elements; the others: a piece's
    double u;             // the values' unit roundoff (nchk_unit_roundoff)
    int avg;              // the op averaged (the sum divided by p, rounded once more)
    const Sketch *recs;   // p records, member by member, nchk_rec_count(p) sketches each
    int root;             // a broadcast's: the member whose buffer the others get
} NchkCase;

static inline const Sketch *nchk_at(const NchkCase *c, int member, size_t i) {
    return c->recs + (size_t)member * nchk_rec_count(c->p) + i;
}

// nchk_off: how far sketch j of got is from the sum of the inputs' piece k,
// beyond its bound: 0 when within (or when the inputs are not finite, or
// sum to an overflow), else 1 with *diff, *bound
static inline int nchk_off(const NchkCase *c, int k, const Sketch *got, size_t len, int *which, double *diff,
                           double *bound) {
    double sum_s[2] = {0, 0}, sum_a[2] = {0, 0};
    for (int q = 0; q < c->p; q++) {
        const Sketch *in = nchk_at(c, q, nchk_rec_in(c->p, k));
        if (!sketch_finite(in)) return 0;
        for (int j = 0; j < 2; j++) {
            sum_s[j] += in->s[j];
            sum_a[j] += in->a[j];
        }
    }
    for (int j = 0; j < 2; j++) {
        double want = sum_s[j], b = sketch_sum_bound(sum_a[j], c->p, c->u, len);
        if (c->avg) {
            want /= c->p;
            b = (b + c->u * sum_a[j]) / c->p;
        }
        double d = got->s[j] - want;
        int overflow = !isfinite(got->s[j]) && sum_a[j] >= 0.125 * FLT_MAX;
        if (!(fabs(d) <= b) && !overflow) {
            *which = j;
            *diff = d;
            *bound = b;
            return 1;
        }
    }
    return 0;
}

// nchk_copies: how many members hold a copy of piece k (their record's
// out[k]) that is not what its owner sketched (own); the first of them goes
// into *first, and into *alike whether those copies all hold the same bits
// (then the piece changed at the owner, before it was copied). moved: data
// not finite at both ends counts as arrived (sketch_moved, as a broadcast's
// judge takes it); else the bits must be the same (sketch_same).
static inline int nchk_copies(const NchkCase *c, const Sketch *own, int k, int moved, int *first, int *alike) {
    int differ = 0;
    *first = -1;
    *alike = 1;
    for (int q = 0; q < c->p; q++) {
        const Sketch *got = nchk_at(c, q, nchk_rec_out(c->p, k));
        if (moved ? sketch_moved(own, got) : sketch_same(got, own)) continue;
        if (differ++ == 0) *first = q;
        else if (!sketch_same(got, nchk_at(c, *first, nchk_rec_out(c->p, k)))) *alike = 0;
    }
    return differ;
}

// nchk_judge_broadcast: every member's copy of the root's buffer, the
// root's own too, against the root's sketch of it before the call: the same
// bits (sketch_moved: or both not finite, which the not-finite rule judges)
static inline int nchk_judge_broadcast(const NchkCase *c, char *msg, size_t len) {
    int p = c->p, root = c->root;
    const int *R = c->ranks;
    const Sketch *own = nchk_at(c, root, nchk_rec_in(p, root));
    int first, alike, differ = nchk_copies(c, own, root, 1, &first, &alike);
    if (differ == 0) return 0;
    const Sketch *held = nchk_at(c, first, nchk_rec_out(p, root));
    if (differ == p && alike)
        snprintf(msg, len, "elements 0..%zu: every rank's copy of rank %d's broadcast, rank %d's own too, differs alike "
                 "from rank %d's sketch of it (%.17g, held as %.17g): it changed in rank %d's memory after its "
                 "sketch, before the broadcast", c->n - 1, R[root], R[root], R[root], own->s[0], held->s[0], R[root]);
    else
        snprintf(msg, len, "elements 0..%zu: rank %d's broadcast as rank %d holds it differs from rank %d's sketch of "
                 "it (%.17g, held as %.17g): it changed on its way to rank %d or in its memory", c->n - 1, R[root],
                 R[first], R[root], own->s[0], held->s[0], R[first]);
    return 1;
}

// nchk_judge: every check of one collective on all the members' records;
// 0 when all hold, else 1 with msg saying the first that fails and, where
// the sketches show it, whose piece
static inline int nchk_judge(const NchkCase *c, char *msg, size_t len) {
    if (c->kind == SK_BROADCAST) return nchk_judge_broadcast(c, msg, len);
    int p = c->p;
    const int *R = c->ranks;
    SketchCase sc = {c->kind, p, c->ranks, c->n, NULL};
    for (int k = 0; k < p; k++) {
        size_t lo, hi;
        sketch_chunk(&sc, k, &lo, &hi);
        if (c->kind == SK_REDUCE_SCATTER) {
            int j;
            double d, b;
            if (nchk_off(c, k, nchk_at(c, k, nchk_rec_out(p, k)), hi - lo, &j, &d, &b)) {
                snprintf(msg, len, "piece %d (elements %zu..%zu), rank %d's shard: the sum it got is off by %.3g, more "
                         "than its rounding bound %.3g (sketch %d): an input changed after its owner's sketch of it, "
                         "or the reduction went wrong", k, lo, hi - 1, R[k], d, b, j);
                return 1;
            }
        } else if (c->kind == SK_ALLREDUCE) {
            int bad = 0, first_bad = -1, first_good = -1, j0 = 0;
            double d0 = 0, b0 = 0;
            for (int q = 0; q < p; q++) {
                int j;
                double d, b;
                if (nchk_off(c, k, nchk_at(c, q, nchk_rec_out(p, k)), hi - lo, &j, &d, &b)) {
                    if (bad++ == 0) first_bad = q, j0 = j, d0 = d, b0 = b;
                } else if (first_good < 0) {
                    first_good = q;
                }
            }
            if (bad == p) {
                snprintf(msg, len, "chunk %d (elements %zu..%zu): the sum is off by %.3g on every rank, more than its "
                         "rounding bound %.3g (sketch %d): an input changed after its owner's sketch of it, or the "
                         "reduction went wrong (the sketches cannot say whose)", k, lo, hi - 1, d0, b0, j0);
                return 1;
            }
            if (bad > 0) {
                snprintf(msg, len, "chunk %d (elements %zu..%zu): rank %d's copy of the sum is off by %.3g, more than "
                         "its rounding bound %.3g (sketch %d), while rank %d's holds: it changed on its way to rank %d "
                         "or in its memory", k, lo, hi - 1, R[first_bad], d0, b0, j0, R[first_good], R[first_bad]);
                return 1;
            }
        } else {
            const Sketch *own = nchk_at(c, k, nchk_rec_in(p, k));
            int first, alike, differ = nchk_copies(c, own, k, 0, &first, &alike);
            if (differ == p && alike) {
                snprintf(msg, len, "piece %d (elements %zu..%zu): every rank's copy of rank %d's piece, rank %d's own "
                         "too, differs alike from rank %d's sketch of it (%.17g, held as %.17g): it changed in rank %d's "
                         "memory after its sketch, before the gather", k, lo, hi - 1, R[k], R[k], R[k], own->s[0],
                         nchk_at(c, k, nchk_rec_out(p, k))->s[0], R[k]);
                return 1;
            }
            if (differ > 0) {
                snprintf(msg, len, "piece %d (elements %zu..%zu): rank %d's piece as rank %d holds it differs from "
                         "rank %d's sketch of it (%.17g, held as %.17g): it changed on its way to rank %d or in its "
                         "memory", k, lo, hi - 1, R[k], R[first], R[k], own->s[0],
                         nchk_at(c, first, nchk_rec_out(p, k))->s[0], R[first]);
                return 1;
            }
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the kernels (CUDA builds)
#ifdef __CUDACC__
#include <cuda_bf16.h>

static __device__ __forceinline__ double nchk_value(float x) { return (double)x; }
static __device__ __forceinline__ double nchk_value(__nv_bfloat16 x) { return (double)__bfloat162float(x); }

// nchk_sketch_kernel: grid (NCHK_BLOCKS, parts), NCHK_THREADS threads. Piece
// k (blockIdx.y) of x: chunked (an all-reduce's), elements [n k / parts,
// n (k+1) / parts) of a vector of n; else elements [k n, (k+1) n) of x,
// which are the vector's from (first + k) n. partial[(k NCHK_BLOCKS + block)
// 5 ..]: the block's s0, s1, a0, a1, q. coef NULL: q alone.
template <typename T>
__global__ void __launch_bounds__(NCHK_THREADS) nchk_sketch_kernel(double *partial, const T *x, size_t n, int parts,
                                                                   int chunked, size_t first, const float *coef,
                                                                   int full) {
    int k = blockIdx.y, lane = threadIdx.x % 32, wib = threadIdx.x / 32;
    size_t lo = chunked ? n * (size_t)k / (size_t)parts : (size_t)k * n;
    size_t len = chunked ? n * (size_t)(k + 1) / (size_t)parts - lo : n;
    size_t g0 = chunked ? lo : (first + (size_t)k) * n;
    const T *piece = x + lo;
    double acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0, acc4 = 0;
    size_t b_first = g0 / SKETCH_BLOCK, nseg = len > 0 ? (g0 + len - 1) / SKETCH_BLOCK - b_first + 1 : 0;
    for (size_t s = (size_t)blockIdx.x * (NCHK_THREADS / 32) + wib; s < nseg; s += NCHK_WARPS) {
        size_t blk = b_first + s;
        size_t slo = blk * SKETCH_BLOCK > g0 ? blk * SKETCH_BLOCK : g0;
        size_t shi = (blk + 1) * SKETCH_BLOCK < g0 + len ? (blk + 1) * SKETCH_BLOCK : g0 + len;
        double v0 = 0, v1 = 0, v2 = 0, v3 = 0, v4 = 0;
        // lane's first element: the first j >= slo with j = lane (mod 32)
        size_t j = slo + (size_t)((lane - (int)(slo % 32) + 32) % 32);
        for (; j < shi; j += 32) {
            double v = nchk_value(piece[j - g0]);
            if (coef != NULL) {
                double c0 = (double)coef[j % SKETCH_BLOCK], c1 = (double)coef[SKETCH_BLOCK + j % SKETCH_BLOCK];
                v0 += c0 * v;
                v1 += c1 * v;
                if (full) {
                    v2 += fabs(c0) * fabs(v);
                    v3 += fabs(c1) * fabs(v);
                }
            }
            if (full) v4 += v * v;
        }
        for (int off = 16; off >= 1; off /= 2) {
            v0 += __shfl_down_sync(0xffffffffu, v0, off);
            v1 += __shfl_down_sync(0xffffffffu, v1, off);
            v2 += __shfl_down_sync(0xffffffffu, v2, off);
            v3 += __shfl_down_sync(0xffffffffu, v3, off);
            v4 += __shfl_down_sync(0xffffffffu, v4, off);
        }
        double a0 = coef != NULL ? (double)coef[2 * SKETCH_BLOCK + 2 * blk] : 0.0;
        double a1 = coef != NULL ? (double)coef[2 * SKETCH_BLOCK + 2 * blk + 1] : 0.0;
        acc0 = fma(a0, v0, acc0);
        acc1 = fma(a1, v1, acc1);
        acc2 = fma(fabs(a0), v2, acc2);
        acc3 = fma(fabs(a1), v3, acc3);
        acc4 += v4;
    }
    __shared__ double w[5][NCHK_THREADS / 32];
    if (lane == 0) {
        w[0][wib] = acc0;
        w[1][wib] = acc1;
        w[2][wib] = acc2;
        w[3][wib] = acc3;
        w[4][wib] = acc4;
    }
    __syncthreads();
    if (threadIdx.x < 5) {
        const double *v = w[threadIdx.x];
        partial[((size_t)k * NCHK_BLOCKS + blockIdx.x) * 5 + threadIdx.x] =
            ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
}

// nchk_final_kernel: one block of NCHK_BLOCKS threads: each piece's block
// partials in a fixed tree, into dst[k] (5 doubles each, sketch.h's Sketch;
// dst NULL: none), and the pieces' squares, in order, into *q_acc (NULL: none)
__global__ void __launch_bounds__(NCHK_BLOCKS) nchk_final_kernel(double *dst, const double *partial, int parts,
                                                                 double *q_acc) {
    __shared__ double t[5][NCHK_BLOCKS];
    for (int k = 0; k < parts; k++) {
        for (int i = 0; i < 5; i++) t[i][threadIdx.x] = partial[((size_t)k * NCHK_BLOCKS + threadIdx.x) * 5 + i];
        __syncthreads();
        for (int stride = NCHK_BLOCKS / 2; stride >= 1; stride /= 2) {
            if ((int)threadIdx.x < stride)
                for (int i = 0; i < 5; i++) t[i][threadIdx.x] += t[i][threadIdx.x + stride];
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            if (dst != NULL)
                for (int i = 0; i < 5; i++) dst[(size_t)k * 5 + i] = t[i][0];
            if (q_acc != NULL) *q_acc += t[4][0];
        }
        __syncthreads();
    }
}

// nchk_scale_kernel: x *= scale (-fault poison: FAULT_POISON_SCALE)
template <typename T>
__global__ void nchk_scale_kernel(T *x, size_t n, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (T)((float)x[i] * scale);
}

// nchk_flip_kernel: one block of 1024 threads: bit `bit` flipped in the value
// of x[0 .. min(n, NCHK_FLIP_SCAN)) of largest nchk_flip_key (low: the
// corrupt-low fault's key; the first such); info: its index, its value
// before and after
template <typename T>
__global__ void __launch_bounds__(1024) nchk_flip_kernel(T *x, size_t n, int bit, int low, double *info) {
    __shared__ float best[1024];
    __shared__ int at[1024];
    size_t m = n < NCHK_FLIP_SCAN ? n : NCHK_FLIP_SCAN;
    float b = -4.0f;
    int a = 0;
    for (size_t i = threadIdx.x; i < m; i += 1024) {
        float v = nchk_flip_key((float)x[i], low);
        if (v > b) b = v, a = (int)i;
    }
    best[threadIdx.x] = b;
    at[threadIdx.x] = a;
    __syncthreads();
    for (int stride = 512; stride >= 1; stride /= 2) {
        if ((int)threadIdx.x < stride) {
            float o = best[threadIdx.x + stride];
            int oa = at[threadIdx.x + stride];
            if (o > best[threadIdx.x] || (o == best[threadIdx.x] && oa < at[threadIdx.x]))
                best[threadIdx.x] = o, at[threadIdx.x] = oa;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0 && m > 0) {
        int i = at[0];
        T before = x[i], after = before;
        if (sizeof(T) == 4) {
            unsigned int u;
            memcpy(&u, &before, 4);
            u ^= 1u << bit;
            memcpy(&after, &u, 4);
        } else {
            unsigned short u;
            memcpy(&u, &before, 2);
            u = (unsigned short)(u ^ (1u << bit));
            memcpy(&after, &u, 2);
        }
        x[i] = after;
        info[0] = (double)i;
        info[1] = (double)(float)before;
        info[2] = (double)(float)after;
    }
}

// nchk_slots_kernel: slots[r] = 0 for every rank r but me, whose slot gets
// its gradient sum of squares: *acc (then zeroed) when acc is given, else v
__global__ void nchk_slots_kernel(float *slots, int world, int me, double v, double *acc) {
    for (int r = threadIdx.x; r < world; r += blockDim.x) {
        if (r != me) slots[r] = 0.0f;
    }
    if (threadIdx.x == 0) {
        double q = acc != NULL ? *acc : v;
        if (acc != NULL) *acc = 0.0;
        slots[me] = (float)q;
    }
}
#endif  // __CUDACC__

#endif
