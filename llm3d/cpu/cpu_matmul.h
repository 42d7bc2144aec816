/*
 * cpu_matmul.h: the CPU trainer's matrix product, cache-blocked and packed
 * the way BLAS libraries do it (GotoBLAS, BLIS), fp32, OpenMP.
 *
 * defines: matmul_blocked(c, ldc, a, am, ak, b, bk, bj, M, J, K), which does
 * C[M,J] += A[M,K] B[K,J] with A(m,k) = a[m*am + k*ak], B(k,j) = b[k*bk + j*bj]
 * and C(m,j) = c[m*ldc + j]; and matmul_blocked_set(c, ldc, init, ...), the
 * same with C = init + A B, init a row (a bias) or zeros. Reading A and B through strides lets the three
 * products of a Linear layer (out = inp W^T, dinp = dout W, dweight =
 * dout^T inp) all be this one function.
 *
 * Every element of C is summed in one fixed order, its old value (or the
 * init row's) first, then k = 0, 1, ..., K-1, one multiply-add at a time;
 * how the work is cut into blocks and shared among threads never changes
 * that order, so the result is the same bit for bit whatever the number of
 * threads.
 *
 * How it is fast, from the inside out:
 * - the micro-kernel keeps an MR x NR tile of C in vector registers and, for
 *   each k, loads NR/VL vectors of B and MR scalars of A: MR * NR / VL
 *   multiply-adds for a handful of loads, which is what keeps the FMA units
 *   busy (a row-at-a-time loop needs a load per multiply-add);
 * - a KC x NR sliver of B stays in L1 while the kernel walks down all the MR
 *   row slivers of an MC x KC block of A (from L2);
 * - B is copied ("packed") once per KC x NC panel into the order the kernel
 *   reads it, contiguous and zero-padded; the panel is reused by every row of
 *   the block. A small B that many row blocks would each pack (dweight's) is
 *   packed whole, once per call, for all of them. When the block has few
 *   rows, B's rows already run along j (dinp, dweight) and B is small or
 *   comes from memory anyway, B is read where it is instead;
 * - A is read where it is, along its rows (the forward and dinp products);
 *   packing it as well measured slower. dweight's A, dout transposed, is
 *   packed whole first, by all the threads, into slivers of MR rows; the
 *   logits' dout, too large for that, is transposed by each task a block at
 *   a time. Only a last sliver of fewer than MR rows is packed, zero-padded;
 * - the threads share out (row block, column panel) tasks of C, disjoint and
 *   cache-line sized, so no two threads write the same line; dynamically,
 *   because the machine may have other work on one of its cores. The blocks
 *   are cut so as to read the least of A and B over all the tasks, and the
 *   tasks ordered so that the two running at once share the larger operand;
 * - what comes from memory is asked for ahead (prefetched) while the kernel
 *   works on what it has: C's next tile, and A and B when they are far
 *   larger than the caches (the logits' weight and gradient), a sliver or a
 *   panel ahead, and B whenever a task packs it; all of it into L2 only;
 * - the logits' forward (a weight over MATMUL_TRANSPOSE_BYTES) is computed
 *   as its transpose, logits^T = wte inp^T, so that the 154 MB weight is
 *   read in place and the small input is the one transposed.
 *
 * matmul_plan makes these choices once per call, from the shapes and the
 * number of threads, into a MatmulPlan that every task reads; matmul_run
 * hands the tasks to the threads. The comments give each choice's reason
 * and the figure that decided it; doc/cpu.md has all the measurements, with
 * their machines and sets.
 */
#ifndef LLM3D_CPU_MATMUL_H
#define LLM3D_CPU_MATMUL_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

// The tile must fit in the vector registers with room for the B vectors.
// AVX-512 has 32 registers of 16 floats: 8 x 48 takes 24 of them (48 divides
// 768, 2304, 3072 and 50304; 8 divides B*T). AVX2 has 16 of 8 floats: 6 x 16
// takes 12. Without either (SSE, NEON: 4 floats) 6 x 8 takes 12.
#if defined(__AVX512F__) && !defined(LLM3D_SCALAR)
#define MATMUL_VL 16
#define MATMUL_MR 8
#define MATMUL_NR 48
#elif defined(__AVX2__) && !defined(LLM3D_SCALAR)
#define MATMUL_VL 8
#define MATMUL_MR 6
#define MATMUL_NR 16
#else
#define MATMUL_VL 4
#define MATMUL_MR 6
#define MATMUL_NR 8
#endif
// KC: a KC x NR sliver of B is 24 KiB with AVX-512, half of a 48 KiB L1, so
// it stays there while the A slivers stream past. MC: the forward's whole
// B*T = 256 rows in one block (128 KiB of A, in L2). NC: 192 columns, so that
// even the 768-wide products make a few tasks per thread.
#ifndef MATMUL_KC
#define MATMUL_KC 128
#endif
#define MATMUL_MC 256
#define MATMUL_NC 192
// column panels start at multiples of NR, where B packed whole has its slivers
_Static_assert(MATMUL_NC % MATMUL_NR == 0, "MATMUL_NC must be a multiple of MATMUL_NR");

// scratch for packed blocks, kept between calls: a fresh allocation per
// call would be fresh pages, zeroed by the kernel, on every one of the ~100
// products of a step. Four per thread: MATMUL_TASK_SCRATCH for a task's own
// packed blocks and its block of A transposed, MATMUL_BLOCK_SCRATCH for a
// block of C summed transposed or a row block of A transposed (never both
// in one product), MATMUL_SHARED_SCRATCH for B packed whole and
// MATMUL_A_SCRATCH for A packed whole, the calling thread's, which all
// the call's threads fill and read.
enum { MATMUL_TASK_SCRATCH, MATMUL_BLOCK_SCRATCH, MATMUL_SHARED_SCRATCH, MATMUL_A_SCRATCH, MATMUL_SCRATCHES };
static float *matmul_scratch(int which, size_t floats) {
    static __thread float *buf[MATMUL_SCRATCHES];
    static __thread size_t cap[MATMUL_SCRATCHES];
    if (floats > cap[which]) {
        free(buf[which]);
        buf[which] = (float *)aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (buf[which] == NULL) {
            fprintf(stderr, "cpu_matmul.h: out of memory for %zu floats of packed blocks\n", floats);
            exit(1);
        }
        cap[which] = floats;
    }
    return buf[which];
}

#if defined(__AVX512F__) && !defined(LLM3D_SCALAR)
#define MATMUL_TRANSPOSE16 1
#include <immintrin.h>
// out[k][i] = in[i][k] for a 16 x 16 block, rows of `in` ld apart and rows
// of `out` ldo apart: 16 loads, 64 shuffles, 16 stores, where an element at
// a time takes a load and a store each
static inline void matmul_transpose16(float *out, size_t ldo, const float *in, size_t ld) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(in + i * ld);
    // interleave pairs of rows, then pairs of pairs: afterwards each 128-bit
    // lane of r[4g + q] holds k = 4 * lane + q of rows 4g .. 4g + 3
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int h = 0; h < 2; h++) {
            __m512d x = _mm512_castps_pd(t[i + h]), y = _mm512_castps_pd(t[i + h + 2]);
            r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    // then gather the lanes of the four groups: lane L of each goes to k = 4L + q
    for (int q = 0; q < 4; q++) {
        __m512 even01 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x88), odd01 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xdd);
        __m512 even23 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x88);
        __m512 odd23 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xdd);
        t[q] = _mm512_shuffle_f32x4(even01, even23, 0x88);
        t[8 + q] = _mm512_shuffle_f32x4(even01, even23, 0xdd);
        t[4 + q] = _mm512_shuffle_f32x4(odd01, odd23, 0x88);
        t[12 + q] = _mm512_shuffle_f32x4(odd01, odd23, 0xdd);
    }
    for (int k = 0; k < 16; k++) _mm512_storeu_ps(out + k * ldo, t[k]);
}
#endif

// dst[j][r] = src[r][j] for r < rows and j < cols, rows of src lds floats
// apart and rows of dst ldd apart
static void matmul_transpose(float *dst, size_t ldd, const float *src, size_t lds, int rows, int cols) {
    int rows16 = 0, cols16 = 0;
#ifdef MATMUL_TRANSPOSE16
    rows16 = rows / 16 * 16;
    cols16 = cols / 16 * 16;
    for (int r0 = 0; r0 < rows16; r0 += 16)
        for (int j0 = 0; j0 < cols16; j0 += 16)
            matmul_transpose16(dst + (size_t)j0 * ldd + r0, ldd, src + (size_t)r0 * lds + j0, lds);
#endif
    for (int j = 0; j < cols; j++)
        for (int r = j < cols16 ? rows16 : 0; r < rows; r++) dst[(size_t)j * ldd + r] = src[(size_t)r * lds + j];
}

// pack rows [0, rows) of X, X(i,k) = x[i*xi + k*xk], k in [0, kc), into
// slivers of W rows: dst[i / W][k][i % W], zeros past `rows`. When X runs
// along i (xi == 1) each k is a contiguous copy, done k by k so that X is
// read a whole row at a time; otherwise (xk == 1) it is a transpose.
// Each k of a full sliver is one memcpy, whole vectors (one for A's 8
// floats, three for B's 48): as a loop of floats GCC 12 loaded it a float
// at a time, even with restrict.
static inline __attribute__((always_inline)) void matmul_pack(float *restrict dst, const float *restrict x, size_t xi, size_t xk, int rows, int kc, int W) {
    int padded = (rows + W - 1) / W * W;
    if (xi == 1) {
        for (int k = 0; k < kc; k++) {
            const float *sk = x + (size_t)k * xk;
            for (int i0 = 0; i0 < padded; i0 += W) {
                float *d = dst + (size_t)i0 * kc + (size_t)k * W;
                if (i0 + W <= rows) {
                    memcpy(d, sk + i0, (size_t)W * sizeof(float));
                } else {
                    for (int i = 0; i < W; i++) d[i] = i0 + i < rows ? sk[i0 + i] : 0.0f;
                }
            }
        }
        return;
    }
    for (int i0 = 0; i0 < padded; i0 += W) {
        float *d = dst + (size_t)i0 * kc;
        const float *s = x + (size_t)i0 * xi;
        int w = rows - i0 < W ? rows - i0 : W, k0 = 0;
#ifdef MATMUL_TRANSPOSE16
        if (w == W && W % 16 == 0 && xk == 1)
            for (; k0 + 16 <= kc; k0 += 16)
                for (int g = 0; g < W; g += 16) matmul_transpose16(d + (size_t)k0 * W + g, W, s + g * xi + k0, xi);
#endif
        for (int i = 0; i < W; i++) {
            const float *si = s + (size_t)i * xi;
            for (int k = k0; k < kc; k++) d[(size_t)k * W + i] = i < w ? si[(size_t)k * xk] : 0.0f;
        }
    }
}

// One MR x NR tile of C (row stride ldc) = S + A x bp, A(r,k) = a[r*ars + k*aks]
// (a packed sliver: ars = 1, aks = MR; rows read in place: ars = the row
// stride, aks = 1), bp the packed sliver bp[k][NR], S the tile's starting
// values s (row stride lds): C itself (s = c), or a row repeated (lds = 0).
// S first, then k = 0, 1, ... in order. Only the first nv * VL columns of
// the tile are computed and stored (nv = NR / VL but at C's right edge).
#if defined(__GNUC__) && !defined(LLM3D_SCALAR)
// GCC and Clang: the tile as MR x NR/VL vectors (the compilers' vector
// extension, portable across targets), which they reliably keep in registers;
// from plain loops GCC 12 vectorizes over k instead and spills for AVX2.
// Loads and stores go through matmul_vec_unaligned, the same vector with the
// alignment of a float, which the compiler moves whole. memcpy would be
// expanded at the width -mtune prefers: GCC 12's -march=native on a CPU it
// does not know (a 2024 Xeon, taken for Rocket Lake: 256 bits) copied each
// 64-byte vector in two halves through the stack, the tile's accumulators
// stayed in memory, and the kernel ran at a quarter of its speed.
typedef float matmul_vec __attribute__((vector_size(MATMUL_VL * sizeof(float))));
typedef float matmul_vec_unaligned
    __attribute__((vector_size(MATMUL_VL * sizeof(float)), aligned(sizeof(float)), may_alias));
static inline __attribute__((always_inline)) void matmul_tile(float *c, size_t ldc, const float *s, size_t lds,
                                                              const float *a, size_t ars, size_t aks, const float *bp,
                                                              size_t bks, int kc, int nv) {
    enum { MR = MATMUL_MR, NV = MATMUL_NR / MATMUL_VL, VL = MATMUL_VL };
    // the loops in and out of the registers unrolled whole: left to itself
    // GCC 12 wrote the tile out through the stack, a copy of C's 24 vectors
    // per tile (unrolled, the d12 products 0.3 to 5% faster, none slower)
    matmul_vec acc[MR][NV];
    #pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[r][v] = *(const matmul_vec_unaligned *)(s + r * lds + v * VL);
    for (int k = 0; k < kc; k++) {
        matmul_vec b[NV];
        for (int v = 0; v < nv; v++) b[v] = *(const matmul_vec_unaligned *)(bp + (size_t)k * bks + v * VL);
        for (int r = 0; r < MR; r++) {
            float ar = a[r * ars + k * aks];
            for (int v = 0; v < nv; v++) acc[r][v] += ar * b[v];
        }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < MR; r++)
        #pragma GCC unroll 4
        for (int v = 0; v < nv; v++) *(matmul_vec_unaligned *)(c + r * ldc + v * VL) = acc[r][v];
}
#else
// The plain loop. Built with -ffp-contract=off (the Makefile's SIMD=scalar):
// GCC fuses a * b + c in some inlined copies of it and not in others, and the
// edge tiles would then round unlike the full ones.
static inline void matmul_tile(float *c, size_t ldc, const float *s, size_t lds, const float *a, size_t ars,
                               size_t aks, const float *bp, size_t bks, int kc, int nv) {
    float acc[MATMUL_MR][MATMUL_NR];
    int nr = nv * MATMUL_VL;
    for (int r = 0; r < MATMUL_MR; r++)
        for (int j = 0; j < nr; j++) acc[r][j] = s[r * lds + j];
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < MATMUL_MR; r++)
            for (int j = 0; j < nr; j++) acc[r][j] += a[r * ars + k * aks] * bp[(size_t)k * bks + j];
    for (int r = 0; r < MATMUL_MR; r++)
        for (int j = 0; j < nr; j++) c[r * ldc + j] = acc[r][j];
}
#endif

// the two ways of reading A, packed or along its rows (A's own, or a
// transposed copy's), each compiled with its strides known where they can
// be, so that the inner loop's addressing is simple. B is a sliver whose
// rows of NR floats are bks apart: NR when packed (compiled apart, with the
// stride a constant), B's own row stride when read in place.
enum { MATMUL_NV = MATMUL_NR / MATMUL_VL };
static void matmul_tile_packed(float *c, size_t ldc, const float *s, size_t lds, const float *ap, const float *bp,
                               size_t bks, int kc) {
    if (bks == MATMUL_NR) matmul_tile(c, ldc, s, lds, ap, 1, MATMUL_MR, bp, MATMUL_NR, kc, MATMUL_NV);
    else matmul_tile(c, ldc, s, lds, ap, 1, MATMUL_MR, bp, bks, kc, MATMUL_NV);
}
static void matmul_tile_rows(float *c, size_t ldc, const float *s, size_t lds, const float *a, size_t lda,
                             const float *bp, size_t bks, int kc) {
    if (bks == MATMUL_NR) matmul_tile(c, ldc, s, lds, a, lda, 1, bp, MATMUL_NR, kc, MATMUL_NV);
    else matmul_tile(c, ldc, s, lds, a, lda, 1, bp, bks, kc, MATMUL_NV);
}

// the same at C's right edge when the columns left are whole vectors (the
// small model's 128 = 48 + 48 + 32): nv of them, 1 or 2 (NV is at most 3),
// A still read along its rows
static void matmul_tile_rows_narrow(float *c, size_t ldc, const float *s, size_t lds, const float *a, size_t lda,
                                    const float *bp, size_t bks, int kc, int nv) {
    if (nv == 1) matmul_tile(c, ldc, s, lds, a, lda, 1, bp, bks, kc, 1);
    else matmul_tile(c, ldc, s, lds, a, lda, 1, bp, bks, kc, 2);
}
// and with A packed (dweight's)
static void matmul_tile_packed_narrow(float *c, size_t ldc, const float *s, size_t lds, const float *ap,
                                      const float *bp, size_t bks, int kc, int nv) {
    if (nv == 1) matmul_tile(c, ldc, s, lds, ap, 1, MATMUL_MR, bp, bks, kc, 1);
    else matmul_tile(c, ldc, s, lds, ap, 1, MATMUL_MR, bp, bks, kc, 2);
}

// a tile over the edge of C (fewer than MR rows or NR columns left): through
// a full-size copy, whose extra rows and columns are thrown away. Rows of A
// past the edge must not be read in place, so the caller packs A there, and
// B is packed too, its columns past the edge zeros.
static void matmul_tile_edge(float *c, size_t ldc, const float *s, size_t lds, int mr, int nr, const float *ap,
                             const float *bp, int kc) {
    float tmp[MATMUL_MR * MATMUL_NR] = {0};
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) tmp[r * MATMUL_NR + j] = s[r * lds + j];
    matmul_tile_packed(tmp, MATMUL_NR, tmp, MATMUL_NR, ap, bp, MATMUL_NR, kc);
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) c[r * ldc + j] = tmp[r * MATMUL_NR + j];
}

// the starting row of C = init + A B when init is NULL
static const float matmul_zeros[MATMUL_NR];

// B's rows run along j (bj == 1) in the dinp and dweight products, the order
// the kernel reads, so B can be read where it is. Packing still pays when the
// block has many rows of A to reuse each packed sliver: then the kernel reads
// contiguous slivers, where B's own rows, a multiple of 512 bytes apart,
// fight for the same few sets of L1. With at most MC / 2 rows the copy costs
// more than it saves, but only where B is small (the small model's dinp
// products) or comes from memory anyway (its logits' dinp): d12's layer
// weights, 2 to 9 MB, packed and asked for ahead as they are packed, made
// its dinp products about 10% faster than read in place.
#ifndef MATMUL_B_IN_PLACE_ROWS
#define MATMUL_B_IN_PLACE_ROWS (MATMUL_MC / 2)
#endif

// B far larger than the caches (the logits' weight, 154 MB at d12) comes
// from memory, and the kernel would wait on it: while one panel of B (packed)
// or one sliver (read in place) is worked on, the tiles ask for the next one
// a few cache lines each, so that it is in cache when its turn comes. Any B
// that a task packs is asked for the same way.
// A region of `rows` rows of `row_floats` floats, `stride` floats apart.
typedef struct {
    const char *base;
    size_t stride;
    int rows, lines_per_row;
    int row, line;       // the next line to ask for: line `line` of row `row`
    int lines_per_tile;  // spread over the tiles that run before the region is read
} MatmulAhead;

static void matmul_ahead_start(MatmulAhead *ah, const float *base, size_t stride_floats, int rows, int row_floats,
                               int tiles) {
    ah->base = (const char *)base;
    ah->stride = stride_floats * sizeof(float);
    ah->rows = rows;
    ah->lines_per_row = (row_floats * (int)sizeof(float) + 63) / 64;
    ah->row = 0;
    ah->line = 0;
    ah->lines_per_tile = (rows * ah->lines_per_row + tiles - 1) / tiles;
}

// Everything the matmul asks for ahead, A, B and C alike, goes into L2 only
// (locality 2: prefetcht1). A request into L1 holds one of L1's few line
// buffers until the line arrives from memory or L3, which is likely why the
// thread waited on these requests: in a profile of the d12 step the waits
// took a third of the matmul's time outside the kernel.
static inline void matmul_ahead_step(MatmulAhead *ah) {
    for (int i = 0; i < ah->lines_per_tile && ah->row < ah->rows; i++) {
        __builtin_prefetch(ah->base + (size_t)ah->row * ah->stride + (size_t)ah->line * 64, 0, 2);
        if (++ah->line == ah->lines_per_row) {
            ah->line = 0;
            ah->row++;
        }
    }
}

// asks for the C tile after tile (ir, jr) of the task's mc x nc block,
// whose top left is c: rows ir + MR.. of the same sliver, else the top of
// the next sliver; only its rows and columns inside the block. Asked for
// to be read, into L2 (see matmul_ahead_step): the kernel reads C first,
// and where it only writes it (C = init + A B, first block of k) a line no
// other core holds arrives exclusive, so the store needs nothing more.
// always_inline: a function that only asks for lines has no effect GCC
// can see, so GCC 12 took it for a pure function and dropped every call to
// it that it did not inline.
static inline __attribute__((always_inline)) void matmul_prefetch_next_c(const float *c, size_t ldc, int mc, int nc, int ir, int jr) {
    enum { MR = MATMUL_MR, NR = MATMUL_NR, LINE = 64 / (int)sizeof(float) };
    int row, col;
    if (ir + MR < mc) {
        row = ir + MR;
        col = jr;
    } else if (jr + NR < nc) {
        row = 0;
        col = jr + NR;
    } else {
        return;
    }
    int rows = mc - row < MR ? mc - row : MR, cols = nc - col < NR ? nc - col : NR;
    const float *tile = c + (size_t)row * ldc + col;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j += LINE) __builtin_prefetch(tile + (size_t)r * ldc + j, 0, 2);
}

// How one call computes its product, chosen once by matmul_plan before any
// task runs and read by all of them: the product itself, the blocks it is
// cut into, what is packed for all the tasks at once, and what is asked for
// ahead.
typedef struct {
    // C = init + A B (set = 1; init a row of J values, zeros if NULL) or
    // C += A B (set = 0), C[M,J], A[M,K], B[K,J], C(m,j) = c[m*ldc + j],
    // A(m,k) = a[m*am + k*ak], B(k,j) = b[k*bk + j*bj]. When computed
    // transposed, a and b are B^T and A^T and M and J are swapped; c, ldc
    // and init stay C's.
    float *c;
    size_t ldc;
    int set;
    const float *init;
    const float *a;
    size_t am, ak;
    const float *b;
    size_t bk, bj;
    int M, J, K;
    int nthreads;
    int transposed;  // C^T = B^T A^T (matmul_computes_transposed)
    // the tasks, ntasks of them, mblocks down by jtasks across: a task is a
    // block of mc rows by nc columns of C, or with row_blocks (jtasks = 1) a
    // whole row block, panel after panel. panels_first: tasks next to each
    // other share a row block of A, else a column panel of B.
    int mc, nc, mblocks, jtasks, ntasks;
    int panels_first, row_blocks;
    // A packed whole (matmul_pack_a_whole, its rows padded to M_pad), or
    // NULL; B packed whole (matmul_pack_whole), or NULL; b_in_place: B read
    // where it is, else each task packs its panels
    float *a_whole;
    int M_pad;
    float *b_whole;
    int b_in_place;
    // A, or B read in place, far larger than the caches: asked for ahead
    int prefetch_a, prefetch_b;
} MatmulPlan;

// one task of p's product: rows [m0, m0 + mc) by columns [j0, j0 + nc) of
// C, over all of K, c the block's top left; C's own values first (p->set =
// 0), or the row p->init (zeros if NULL; p->set = 1).
// next_j0: the first column of the task this thread likely runs next (< 0:
// none), whose first panel of B the last block of k asks for.
// a_rows: A read down its columns, already transposed by the caller
// (matmul_task_row_block), a row of K floats per row of the block, or NULL.
static void matmul_task(const MatmulPlan *p, float *c, int m0, int mc, int j0, int nc, int next_j0,
                        const float *a_rows) {
    enum { MR = MATMUL_MR, NR = MATMUL_NR, KC = MATMUL_KC, VL = MATMUL_VL };
    // the strides, in every address below
    const float *a = p->a, *b = p->b;
    size_t ldc = p->ldc, am = p->am, ak = p->ak, bk = p->bk, bj = p->bj;
    int K = p->K;
    int mc_pad = (mc + MR - 1) / MR * MR, nc_pad = (nc + NR - 1) / NR * NR;
    float *bp = matmul_scratch(MATMUL_TASK_SCRATCH, (size_t)(nc_pad + 2 * mc_pad) * KC), *ap = bp + (size_t)nc_pad * KC;
    float *at = ap + (size_t)mc_pad * KC;
    // rows of A along k are read in place, except in a last partial sliver.
    // A read down its columns is packed whole by matmul_run (the layers'
    // dweight), or else (the logits', whose dout is too large for that)
    // transposed by the caller (a_rows) or here, a block of k at a time,
    // into at, and read along its rows from there.
    int a_in_place = p->a_whole == NULL && (ak == 1 || am == 1), full_rows = a_in_place ? mc / MR * MR : 0;
    int a_cols = p->a_whole == NULL && ak != 1 && am == 1;
    // B packed here, a panel per block of k
    int b_packs = !p->b_in_place && p->b_whole == NULL;
    int row_tiles = (mc + MR - 1) / MR, col_tiles = (nc + NR - 1) / NR;
    MatmulAhead ahead = {NULL, 0, 0, 0, 0, 0, 0};
    for (int k0 = 0; k0 < K; k0 += KC) {
        int kc = K - k0 < KC ? K - k0 : KC, kc_next = K - k0 - KC < KC ? K - k0 - KC : KC;
        const float *bblk = b + (size_t)j0 * bj + (size_t)k0 * bk;
        if (b_packs) matmul_pack(bp, bblk, bj, bk, nc, kc, NR);
        // packed: the next block of k's panel, over all the tiles of this
        // one; on the last block, the next task's first panel
        if (b_packs && kc_next > 0) {
            if (bk == 1) matmul_ahead_start(&ahead, bblk + KC, bj, nc, kc_next, row_tiles * col_tiles);
            else matmul_ahead_start(&ahead, bblk + (size_t)KC * bk, bk, kc_next, nc, row_tiles * col_tiles);
        } else if (b_packs && next_j0 >= 0) {
            int kc_first = K < KC ? K : KC, next_nc = p->J - next_j0 < p->nc ? p->J - next_j0 : p->nc;
            if (bk == 1) matmul_ahead_start(&ahead, b + (size_t)next_j0 * bj, bj, next_nc, kc_first, row_tiles * col_tiles);
            else matmul_ahead_start(&ahead, b + next_j0, bk, kc_first, next_nc, row_tiles * col_tiles);
        }
        const float *ablk = a + (size_t)m0 * am + (size_t)k0 * ak;
        // the block's packed slivers of A, apk + ir * kc: A's own packed
        // whole, or the task's for the rows not read in place
        const float *apk = ap;
        if (p->a_whole) apk = p->a_whole + (size_t)k0 * p->M_pad + (size_t)m0 * kc;
        else if (full_rows < mc)
            matmul_pack(ap + (size_t)full_rows * kc, ablk + (size_t)full_rows * am, am, ak, mc - full_rows, kc, MR);
        // the block's rows of A along k, ars floats apart
        const float *arows = ablk;
        size_t ars = am;
        if (a_cols && a_rows) {
            arows = a_rows + k0;
            ars = (size_t)K;
        } else if (a_cols) {
            matmul_transpose(at, (size_t)kc, ablk, ak, kc, full_rows);
            arows = at;
            ars = (size_t)kc;
        }
        for (int jr = 0; jr < nc; jr += NR) {
            int nr = nc - jr < NR ? nc - jr : NR;
            // the sliver of B the kernel reads, packed or in place; an edge
            // tile needs it packed, once
            const float *packed_sliver = bp + (size_t)jr * kc;
            if (p->b_whole) packed_sliver = p->b_whole + (size_t)(j0 + jr) / NR * NR * K + (size_t)k0 * NR;
            const float *bs = packed_sliver;
            size_t bks = NR;
            int packed = !p->b_in_place;
            if (p->b_in_place && nr % VL == 0) {
                bs = bblk + jr;
                bks = bk;
            }
            // in place: the next sliver, this block's or the next block's first
            if (p->prefetch_b && p->b_in_place) {
                int nr_next = nc - jr - NR < NR ? nc - jr - NR : NR;
                if (jr + NR < nc) matmul_ahead_start(&ahead, bblk + jr + NR, bk, kc, nr_next, row_tiles);
                else if (kc_next > 0) matmul_ahead_start(&ahead, bblk + (size_t)KC * bk, bk, kc_next, nc < NR ? nc : NR, row_tiles);
                else ahead.rows = 0;
            }
            for (int ir = 0; ir < mc; ir += MR) {
                int mr = mc - ir < MR ? mc - ir : MR;
                float *ct = c + (size_t)ir * ldc + jr;
                // where the sums start: C, or on the first block of k the init row
                const float *st = ct;
                size_t lds = ldc;
                if (p->set && k0 == 0) {
                    st = p->init ? p->init + j0 + jr : matmul_zeros;
                    lds = 0;
                }
                const float *arow = arows + (size_t)ir * ars;
                // A from memory: ask for the next sliver's MR rows while this
                // one is being worked on, a cache line at a time
                if (p->prefetch_a && jr == 0 && ir + 2 * MR <= full_rows)
                    for (int r = MR; r < 2 * MR; r++)
                        for (int k = 0; k < kc; k += 64 / (int)sizeof(float)) __builtin_prefetch(arow + (size_t)r * ars + k, 0, 2);
                matmul_ahead_step(&ahead);
                // C's next tile, down this sliver or atop the next: on the
                // first block of k it comes from memory (the gradients were
                // last touched a step ago); later blocks find it in L2
                if (k0 == 0) matmul_prefetch_next_c(c, ldc, mc, nc, ir, jr);
                if (mr == MR && nr == NR) {
                    if (ir < full_rows) matmul_tile_rows(ct, ldc, st, lds, arow, ars, bs, bks, kc);
                    else matmul_tile_packed(ct, ldc, st, lds, apk + (size_t)ir * kc, bs, bks, kc);
                } else if (mr == MR && nr % VL == 0 && ir < full_rows) {
                    matmul_tile_rows_narrow(ct, ldc, st, lds, arow, ars, bs, bks, kc, nr / VL);
                } else if (mr == MR && nr % VL == 0 && p->a_whole) {
                    matmul_tile_packed_narrow(ct, ldc, st, lds, apk + (size_t)ir * kc, bs, bks, kc, nr / VL);
                } else {
                    if (ir < full_rows)  // a column edge on rows read in place: pack this sliver alone
                        matmul_pack(ap + (size_t)ir * kc, arow, ars, 1, MR, kc, MR);
                    if (!packed) {
                        matmul_pack(bp + (size_t)jr * kc, bblk + jr, 1, bk, nr, kc, NR);
                        packed = 1;
                    }
                    matmul_tile_edge(ct, ldc, st, lds, mr, nr, apk + (size_t)ir * kc, packed_sliver, kc);
                }
            }
        }
    }
}

// one task of C = A B computed as C^T = B^T A^T (see matmul_plan): p's a
// and b are B^T and A^T, rows [m0, m0 + mc) of C^T are columns of C and
// columns [j0, j0 + nc) are rows of C. The block of C^T is summed in
// scratch, laid out as the kernel writes it, and transposed into C at the
// end: each element of C is transposed once, where the weight's were once
// per row block. C is set, C = init + A B: value r of the init row starts
// row r of the block.
static void matmul_task_transposed(const MatmulPlan *p, int m0, int mc, int j0, int nc) {
    float *block = matmul_scratch(MATMUL_BLOCK_SCRATCH, (size_t)mc * nc);
    if (p->init)
        for (int r = 0; r < mc; r++)
            for (int j = 0; j < nc; j++) block[(size_t)r * nc + j] = p->init[m0 + r];
    // the block's sums go to the scratch, rows nc apart, from the init
    // values just written; without init the kernel starts from zeros itself
    MatmulPlan into_block = *p;
    into_block.ldc = (size_t)nc;
    into_block.set = p->init == NULL;
    into_block.init = NULL;
    matmul_task(&into_block, block, m0, mc, j0, nc, -1, NULL);
    matmul_transpose(p->c + (size_t)j0 * p->ldc + m0, p->ldc, block, nc, mc, nc);
}

// A task of the logits' dweight, C = dout^T inp: rows [m0, m0 + mc) of C,
// all J of its columns, panel after panel of nc. A, dout transposed, is too
// large to pack whole, so the task transposes its rows of A, for all of K,
// once, and every panel reads them: a task per panel transposed them once
// per panel (4 times at d12) and read the block of dout as many times. The
// full rows only; a last partial sliver is packed by matmul_task.
static void matmul_task_row_block(const MatmulPlan *p, int m0, int mc) {
    float *a_rows = matmul_scratch(MATMUL_BLOCK_SCRATCH, (size_t)mc * p->K);
    matmul_transpose(a_rows, (size_t)p->K, p->a + m0, p->ak, p->K, mc / MATMUL_MR * MATMUL_MR);
    for (int j0 = 0; j0 < p->J; j0 += p->nc)
        matmul_task(p, p->c + (size_t)m0 * p->ldc + j0, m0, mc, j0, p->J - j0 < p->nc ? p->J - j0 : p->nc, -1, a_rows);
}

#define MATMUL_STREAM_BYTES (16u << 20)

// a forward's weight this large is read in place and the output transposed
// instead (matmul_plan): in GPT-2's sizes only the logits' weight, 154 MB at
// d12, where the largest layer weight is d48's fc, 41 MB. Tests set it lower
// to reach that path with small shapes.
#ifndef MATMUL_TRANSPOSE_BYTES
#define MATMUL_TRANSPOSE_BYTES (64u << 20)
#endif

// B packed whole for all the tasks of one call: at most this much, about
// what one core's L2 holds, so that the tasks find it in cache. The dweight
// products' B (the layer's input, 768 KiB at d12) fits, fcproj's (3 MiB)
// measured faster packed per task, in the cache of the core that uses it.
#ifndef MATMUL_PACK_ONCE_BYTES
#define MATMUL_PACK_ONCE_BYTES (1u << 20)
#endif

// how many mc x nc blocks cover C[M,J]
static size_t matmul_tasks(int M, int J, int mc, int nc) {
    return (size_t)((M + mc - 1) / mc) * (size_t)((J + nc - 1) / nc);
}

// the blocks' shape, mc x nc, for C[M,J] += A B over K on nthreads: of
// those that make enough tasks to share (or the smallest, when none do), the
// one that reads the least of A and B. Each column panel reads all of A's
// rows and each row block all of B's columns, so the small model's dinp of
// the logits (M = 256 rows, J = 128 columns, K = 50304) cuts rows, where
// d12's products cut columns.
static void matmul_blocks(int M, int J, int K, size_t bj, int nthreads, int a_from_memory, int b_from_memory,
                          int *mc_out, int *nc_out) {
    enum { MR = MATMUL_MR, NR = MATMUL_NR, MC = MATMUL_MC, NC = MATMUL_NC };
    // Enough is 2 tasks per thread: a thread slowed by other work on its
    // core then leaves the others at most half its share to wait on. More
    // tasks cost more than they balance, since a block of half the size
    // packs or reads as much B per multiply-add twice over: with 4 per
    // thread d12's step ran 1 to 3% slower. But 1 per thread when A and B
    // come from memory and all of C's columns fit in one panel (the small
    // model's dinp, J = 128): then more tasks can only cut rows, and each
    // row block streams all of B, 26 MB, again (measured 19% faster).
    size_t want = (a_from_memory && b_from_memory && J <= NC ? 1 : 2) * (size_t)nthreads;
    // A B read down its columns (the forward's weight) is transposed as each
    // row block packs it, which costs about two plain reads: counted twice,
    // the forward keeps its 256 rows in one block (attproj's measured 14%
    // faster).
    double b_cost = bj == 1 ? 1.0 : 2.0;
    int mc = MC, nc = NC;
    double least = -1.0;
    for (int m = MC; m >= 4 * MR; m /= 2)
        for (int n = NC; n >= NR; n -= NR) {
            int smallest = m / 2 < 4 * MR && n == NR;  // the last of both loops
            if (matmul_tasks(M, J, m, n) < want && !smallest) continue;
            double row_blocks = (M + m - 1) / m, col_panels = (J + n - 1) / n;
            double reads = col_panels * M * K + row_blocks * K * J * b_cost;
            if (least < 0 || reads < least) {
                least = reads;
                mc = m;
                nc = n;
            }
        }
    *mc_out = mc / MR * MR;
    *nc_out = nc;
}

// the blocks of C^T when computed transposed (M rows of wte, J of the
// input's): all of the input's rows, C^T's columns, in one panel, so that
// wte is read once; blocks of 256 rows of wte, fewer when that leaves too
// few for the threads to share (2 each, as matmul_blocks)
static void matmul_blocks_transposed(int M, int J, int nthreads, int *mc_out, int *nc_out) {
    int mc = MATMUL_MC;
    while (mc / 2 >= 4 * MATMUL_MR && (M + mc - 1) / mc < 2 * nthreads) mc /= 2;
    *mc_out = mc / MATMUL_MR * MATMUL_MR;
    *nc_out = J;
}

// whether C = init + A B is computed transposed, C^T = B^T A^T. The logits'
// forward, logits = inp wte^T, has a B read down its columns that is far
// larger than the caches (wte, 154 MB at d12) and fewer rows of A (the
// input's 256) than terms in each sum (768). Packing B would transpose all
// of wte on each call, a shuffle per four floats, waiting on memory. So it
// is computed transposed, logits^T = wte inp^T: wte becomes A, read in place
// along its rows, and the input is the one transposed, packed whole once.
// Each task sums a block of C^T and transposes it into C: M x J floats where
// B is K x J, a third as many at d12 (measured 5% faster). The small model's
// logits (K = 128) keep the old way, and so do the layers' forwards, whose
// weights are smaller than MATMUL_TRANSPOSE_BYTES (at d12 they measured up
// to 13% slower this way). Every element is the same multiply-adds in the
// same order, so the result is the same bit for bit; and the choice depends
// on the shapes alone, never on the number of threads, so that a build
// whose edge tiles round differently still gives the same bits on any
// number.
static int matmul_computes_transposed(int set, size_t bj, int M, int J, int K) {
    return set && bj != 1 && (size_t)K * J * sizeof(float) > MATMUL_TRANSPOSE_BYTES && M <= MATMUL_MC && M < K;
}

// A read down its columns (dweight's, A = dout transposed: A(m,k) =
// a[k*ak + m]), M x K, packed whole by the threads of the enclosing
// parallel region: for each block of k, k0 = 0, KC, ..., its slivers of MR
// rows, a_whole[k0 * M_pad + s * MR * kc + k * MR + r], zeros past M. Each
// k of a sliver is MR floats side by side in a row of dout: a plain copy.
static void matmul_pack_a_whole(float *a_whole, int M_pad, const float *a, size_t ak, int M, int K) {
    enum { MR = MATMUL_MR, KC = MATMUL_KC };
    int slivers = M_pad / MR, kblocks = (K + KC - 1) / KC;
    #pragma omp for schedule(static)
    for (int u = 0; u < kblocks * slivers; u++) {
        int k0 = u / slivers * KC, s = u % slivers, kc = K - k0 < KC ? K - k0 : KC;
        int rows = M - s * MR < MR ? M - s * MR : MR;
        matmul_pack(a_whole + (size_t)k0 * M_pad + (size_t)s * MR * kc, a + (size_t)s * MR + (size_t)k0 * ak, 1, ak, rows,
                    kc, MR);
    }
}

// B[K,J] packed whole by the threads of the enclosing parallel region:
// sliver s holds columns [s * NR, s * NR + NR) over all of K,
// b_whole[s][k][NR], so that a block of k of it is kc x NR contiguous
static void matmul_pack_whole(float *b_whole, const float *b, size_t bk, size_t bj, int J, int K) {
    enum { NR = MATMUL_NR };
    #pragma omp for schedule(static)
    for (int s = 0; s < (J + NR - 1) / NR; s++) {
        int cols = J - s * NR < NR ? J - s * NR : NR;
        matmul_pack(b_whole + (size_t)s * NR * K, b + (size_t)s * NR * bj, bj, bk, cols, K, NR);
    }
}

// the plan of C = init + A B (set) or C += A B on this call's threads: the
// blocks, the task order, what is packed once for all the tasks (in the
// calling thread's scratch) and what is asked for ahead
static MatmulPlan matmul_plan(float *c, int ldc, int set, const float *init, const float *a, size_t am, size_t ak,
                              const float *b, size_t bk, size_t bj, int M, int J, int K) {
    enum { NR = MATMUL_NR };
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    int a_from_memory = (size_t)M * K * sizeof(float) > MATMUL_STREAM_BYTES;
    int b_from_memory = (size_t)K * J * sizeof(float) > MATMUL_STREAM_BYTES;
    int transposed = matmul_computes_transposed(set, bj, M, J, K);
    if (transposed) {
        const float *a_was = a;
        size_t am_was = am, ak_was = ak;
        int M_was = M, a_was_from_memory = a_from_memory;
        a = b, am = bj, ak = bk, M = J, a_from_memory = b_from_memory;
        b = a_was, bk = ak_was, bj = am_was, J = M_was, b_from_memory = a_was_from_memory;
    }
    int mc, nc;
    if (transposed) matmul_blocks_transposed(M, J, nthreads, &mc, &nc);
    else matmul_blocks(M, J, K, bj, nthreads, a_from_memory, b_from_memory, &mc, &nc);
    // A far larger than the caches (the logits' gradient, dout, 51 MB at
    // d12 or at the small model) comes from memory read in place, 8 rows far
    // apart at once, more streams than the hardware prefetcher keeps up
    // with, so the task asks for them ahead (the logits' dinp; their dweight
    // transposes its blocks of dout, asking for them ahead measured no
    // faster). Elsewhere A is in L2 or L3 already and the requests only cost.
    // B as large (the logits' weight), read in place, is asked for a sliver
    // ahead (MatmulAhead). A B packed per task is asked for a panel ahead
    // whatever its size: the copy reads kc or nc of its rows at once, far
    // apart, which the hardware prefetcher does not follow (d12's dinp
    // products, whose packing took 14 to 18% of their time, 6 to 7% faster).
    int prefetch_a = ak == 1 && a_from_memory, prefetch_b = b_from_memory;
    // The order of the tasks: tasks next to each other run at about the same
    // time and share what they read in cache. Row blocks first, so that
    // they share a panel of B, unless A is the larger: then the column
    // panels first, sharing a block of A (the dweight products, whose A,
    // dout transposed, has OC rows).
    int mblocks = (M + mc - 1) / mc, jblocks = (J + nc - 1) / nc;
    int panels_first = M > J;
    // B packed once for all the row blocks, when there are several, B would
    // be packed anyway and it is small: each row block packing its own copy
    // repeated the copy as many times as there are row blocks, 197 for the
    // logits' dweight. Only B along j, a copy: a transposed B (the forward)
    // measured faster packed per task, hot in the cache of the core that
    // packed it. But the logits' forward computed transposed has the input
    // as B, which every task reads whole: packed once.
    int slivers = (J + NR - 1) / NR;
    size_t packed_floats = (size_t)slivers * NR * K;
    float *b_whole = NULL;
    if (transposed || (mblocks > 1 && bj == 1 && mc > MATMUL_B_IN_PLACE_ROWS && packed_floats * sizeof(float) <= MATMUL_PACK_ONCE_BYTES))
        b_whole = matmul_scratch(MATMUL_SHARED_SCRATCH, packed_floats);
    // else B along j is read in place by blocks of few rows, when it is small
    // or from memory anyway (MATMUL_B_IN_PLACE_ROWS)
    int b_small = (size_t)K * J * sizeof(float) <= MATMUL_PACK_ONCE_BYTES;
    int b_in_place = !transposed && b_whole == NULL && bj == 1 && mc <= MATMUL_B_IN_PLACE_ROWS && (b_small || b_from_memory);
    // A read down its columns (dweight's, A = dout transposed) is packed
    // whole first, by all the threads, into a_whole, and the tasks read it
    // from there. Read in place, each k of a tile is 8 floats of another row
    // of dout, rows a multiple of 1 KiB apart: the tile's A fell in a few
    // sets of L1 and a new page at every k. Copied first, transposed along
    // its rows, the d12 layers' dweight products ran 10 to 15% faster, the
    // copy included; packed into slivers, a plain copy, faster again in
    // three of four sets. The logits' dout (51 MB at d12, over
    // MATMUL_STREAM_BYTES) would take as much more memory and measured no
    // faster: each task transposes its own blocks of it instead
    // (matmul_task).
    float *a_whole = NULL;
    int M_pad = (M + MATMUL_MR - 1) / MATMUL_MR * MATMUL_MR;
    if (am == 1 && ak != 1 && (size_t)M * K * sizeof(float) <= MATMUL_STREAM_BYTES)
        a_whole = matmul_scratch(MATMUL_A_SCRATCH, (size_t)M_pad * K);
    // A down its columns and too large for that (the logits' dout) is
    // transposed by the tasks, and then each task takes a whole row block,
    // all its column panels, when the block's rows of A, for all of K, fit
    // beside B packed whole in L2 (matmul_task_row_block; the logits'
    // dweight at d12 measured 15 to 18% faster).
    int row_blocks = am == 1 && ak != 1 && a_whole == NULL && jblocks > 1 &&
                     (size_t)mc * K * sizeof(float) <= MATMUL_PACK_ONCE_BYTES / 2;
    int jtasks = row_blocks ? 1 : jblocks;
    MatmulPlan p = {
        .c = c, .ldc = (size_t)ldc, .set = set, .init = init,
        .a = a, .am = am, .ak = ak, .b = b, .bk = bk, .bj = bj, .M = M, .J = J, .K = K,
        .nthreads = nthreads, .transposed = transposed,
        .mc = mc, .nc = nc, .mblocks = mblocks, .jtasks = jtasks, .ntasks = mblocks * jtasks,
        .panels_first = panels_first, .row_blocks = row_blocks,
        .a_whole = a_whole, .M_pad = M_pad, .b_whole = b_whole, .b_in_place = b_in_place,
        .prefetch_a = prefetch_a, .prefetch_b = prefetch_b,
    };
    return p;
}

// the first row and the first column of C that task t covers, in p's order
static int matmul_task_m0(const MatmulPlan *p, int t) {
    return (p->panels_first ? t / p->jtasks : t % p->mblocks) * p->mc;
}
static int matmul_task_j0(const MatmulPlan *p, int t) {
    return (p->panels_first ? t % p->jtasks : t / p->mblocks) * p->nc;
}

static void matmul_run(float *c, int ldc, int set, const float *init, const float *a, size_t am, size_t ak,
                       const float *b, size_t bk, size_t bj, int M, int J, int K) {
    MatmulPlan p = matmul_plan(c, ldc, set, init, a, am, ak, b, bk, bj, M, J, K);
    #pragma omp parallel if (p.ntasks > 1)
    {
        if (p.a_whole) matmul_pack_a_whole(p.a_whole, p.M_pad, p.a, p.ak, p.M, p.K);
        if (p.b_whole) matmul_pack_whole(p.b_whole, p.b, p.bk, p.bj, p.J, p.K);
        #pragma omp for schedule(dynamic)
        for (int t = 0; t < p.ntasks; t++) {
            int m0 = matmul_task_m0(&p, t), j0 = matmul_task_j0(&p, t);
            int mrows = p.M - m0 < p.mc ? p.M - m0 : p.mc, ncols = p.J - j0 < p.nc ? p.J - j0 : p.nc;
            // the task this thread likely takes next: with tasks of equal size
            // the threads take turns, so nthreads further on. A wrong guess
            // costs a panel brought into cache for nothing, or for the
            // other thread. Measured: the logits' forward 10 to 25% faster,
            // where each task's first panel came cold from memory.
            int next = t + p.nthreads, next_j0 = next < p.ntasks ? matmul_task_j0(&p, next) : -1;
            if (p.row_blocks) matmul_task_row_block(&p, m0, mrows);
            else if (p.transposed) matmul_task_transposed(&p, m0, mrows, j0, ncols);
            else matmul_task(&p, p.c + (size_t)m0 * p.ldc + j0, m0, mrows, j0, ncols, next_j0, NULL);
        }
    }
}

static void matmul_blocked(float *c, int ldc, const float *a, size_t am, size_t ak, const float *b, size_t bk,
                           size_t bj, int M, int J, int K) {
    matmul_run(c, ldc, 0, NULL, a, am, ak, b, bk, bj, M, J, K);
}

// C[M,J] = init + A[M,K] B[K,J], init a row of J values added to every row
// (a bias) or zeros when NULL: C's old values are never read, which saves a
// pass that sets them and reading them back (51 MB for the logits)
static void matmul_blocked_set(float *c, int ldc, const float *init, const float *a, size_t am, size_t ak,
                               const float *b, size_t bk, size_t bj, int M, int J, int K) {
    matmul_run(c, ldc, 1, init, a, am, ak, b, bk, bj, M, J, K);
}

#endif
