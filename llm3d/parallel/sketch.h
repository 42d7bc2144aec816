/*
 * llm3d/parallel/sketch.h: checked collectives (-ic 1). Every rank makes
 * keyed random sketches <r, x> of what it puts into a collective and of what
 * it gets out, the ranks swap them after the collective, and each hop of the
 * ring is checked against them: a sum within its rounding bound, data moved
 * from one rank to the next bit for bit. shm_comm.h's collectives call it;
 * doc/security.md, "Checked collectives", has the bound and what it means.
 *
 * defines:
 *   Sketch                 two sketches of one vector, bounds of their
 *                          |r|.|x| sums and the vector's sum of squares
 *   SKETCH_BLOCK           K, the block of the coefficients' structure
 *   SketchGen, SKETCH_LAUNCH_MAX, sketch_gen_init, sketch_gen_free, sketch_draw
 *                          the secret coefficients of one collective, under
 *                          the key of one launch of the job
 *   sketch_covers          whether a piece lies within the length drawn
 *   SKETCH_PLAIN .. SKETCH_SQUARES
 *                          what a segment's pass sums besides the sketches
 *   sketch_add             a vector's piece into its sketch
 *   sketch_reduce          a reducing receive's one pass: the sum of what
 *                          arrived and the member's own piece, with the
 *                          sketches of all three
 *   sketch_sumsq, sketch_sum_sumsq
 *                          a piece's sum of squares alone (the gradient-norm
 *                          rule's, when the checks are off), and with a
 *                          reducing receive's sum in the same pass
 *   sketch_eval_error, sketch_hop_bound, sketch_sum_bound
 *                          the rounding bounds (fp32 hops, any p-term sum in
 *                          fp32 or bf16)
 *   sketch_piece_ratio, sketch_piece_note
 *                          a reducing receive's frame checked on its own
 *   SK_*, sketch_rec_count, sketch_rec_in .. sketch_rec_frame, SketchCase,
 *   sketch_same, sketch_moved, sketch_judge
 *                          each rank's record of one collective, and the
 *                          verdict on all the records of a group
 *
 * The coefficients. r_j = a[j / K] * b[j % K] for the element j of the
 * collective's vector (K = SKETCH_BLOCK), two independent draws of a and b
 * (sketch 0 and sketch 1), each coefficient +-(2^15 + m) / 2^16 with a random
 * sign and m, from 16 bits of AES-256 in counter mode under a key derived
 * from the job key (HMAC(job key, SKETCH_KEY_LABEL): the key of the frames'
 * tags is never used as an AES key) and the launch (sketch_gen_init), with a
 * nonce made for each collective
 * (SHA-256 of the step, the group's ranks, the call's number on that group, the
 * op and the length). So |r_j| lies in [1/4, 1), and only K + n/K random
 * coefficients are drawn per collective, not n. Only ranks that hold the
 * job key can compute r.
 *
 * Exactness. b[i] * x_j is exact in double (16 + 24 bits); the sums are
 * rounded in double in one fixed order (8 lanes per block segment, a fixed
 * tree, then one fma per segment), so the same values, cut into the same
 * pieces, give the same sketch bit for bit on every rank and in every
 * build (vector, scalar, -O0): data that only moves (a ring hop, an
 * all-gather) is compared exactly, and a sum within sketch_hop_bound, for
 * its chunk and for each frame of it.
 */
#ifndef LLM3D_SKETCH_H
#define LLM3D_SKETCH_H

#include "secure.h"               // first: hmac_sha256, put_u64, secure_wipe
#include "llm3d/secure/aead.h"    // AES-256 in counter mode (aead_ctr)

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SKETCH_BLOCK 512          // K: b has K coefficients, a one per K elements
#define SKETCH_KEY_LABEL "llm3d collective sketch key 1"
#define SKETCH_NONCE_LABEL "llm3d collective sketch nonce 1"

// what a rank computes of one vector (or piece of one): s[k] = <r_k, x>;
// a[k] = sum over blocks of |a_k[block]| (sum |x_j| over the block's
// elements), a bound of sum |r_k| |x| (|b| < 1), for inputs and what a
// reducing receive got; q = sum x^2 (inputs only)
typedef struct { double s[2], a[2], q; } Sketch;

typedef struct {
    AeadKey aes;                  // the job's sketch key (never the frames' HMAC key)
    double b[2][SKETCH_BLOCK];    // b of sketch 0 and 1
    double *a;                    // per block: a of sketch 0 and 1, interleaved
    size_t n;                     // elements drawn for this collective (sketch_covers)
    size_t blocks, cap;           // blocks drawn for it; room in a
    uint16_t *stream;             // the keystream's words
    size_t stream_cap;
} SketchGen;

// sketch_gen_init: the sketch key of one launch of the job,
// HMAC(job key, SKETCH_KEY_LABEL | launch). launch is what all the ranks of
// this launch hold alike and no other launch does (shm_comm.h: the segment's
// name, 64 fresh random bits, from the rendezvous's tagged answer): jobs that
// share a --key-file, or a job started again, count the same steps and
// calls, and without it would draw the same r, whose sketches an observer
// of one run has seen. At most SKETCH_LAUNCH_MAX characters of it count.
#define SKETCH_LAUNCH_MAX 64
static inline int sketch_gen_init(SketchGen *g, const uint8_t job_key[32], const char *launch) {
    memset(g, 0, sizeof(*g));
    uint8_t msg[sizeof(SKETCH_KEY_LABEL) - 1 + SKETCH_LAUNCH_MAX], k[32];
    size_t label = sizeof(SKETCH_KEY_LABEL) - 1, n = strnlen(launch, SKETCH_LAUNCH_MAX);
    memcpy(msg, SKETCH_KEY_LABEL, label);
    memcpy(msg + label, launch, n);
    hmac_sha256(job_key, 32, msg, label + n, k);
    aead_init(&g->aes, k);
    secure_wipe(k, sizeof(k));
    return 0;
}

static inline void sketch_gen_free(SketchGen *g) {
    aead_wipe(&g->aes);
    free(g->a);
    free(g->stream);
    memset(g, 0, sizeof(*g));
}

// a coefficient from 16 random bits: sign from the top bit, magnitude in [1/2, 1)
static inline double sketch_coef(uint16_t w) {
    double m = (double)(0x8000u | (w & 0x7fffu)) / 65536.0;
    return (w & 0x8000u) ? -m : m;
}

// sketch_draw: the coefficients of one collective of n elements, from its
// context (all the group's members pass the same): the step, a digest of the
// group's ranks, the call's number on that group, the op. 0, or -1 when out
// of memory.
static inline int sketch_draw(SketchGen *g, long step, uint64_t group, uint64_t call, int op, size_t n) {
    uint8_t ctx[sizeof(SKETCH_NONCE_LABEL) - 1 + 40], nonce[32];
    size_t at = sizeof(SKETCH_NONCE_LABEL) - 1;
    memcpy(ctx, SKETCH_NONCE_LABEL, at);
    put_u64(ctx + at, (uint64_t)step);
    put_u64(ctx + at + 8, group);
    put_u64(ctx + at + 16, call);
    put_u64(ctx + at + 24, (uint64_t)op);
    put_u64(ctx + at + 32, (uint64_t)n);
    // the nonce: the context's SHA-256, cut to 96 bits. It need only never
    // repeat under the key (the key keeps r secret); two contexts of a job
    // colliding in 96 bits is beyond any run's length
    sha256(ctx, sizeof(ctx), nonce);
    size_t blocks = (n + SKETCH_BLOCK - 1) / SKETCH_BLOCK, words = 2 * SKETCH_BLOCK + 2 * blocks;
    if (blocks > g->cap) {
        double *a = (double *)realloc(g->a, 2 * blocks * sizeof(double));
        if (a == NULL) return -1;
        g->a = a;
        g->cap = blocks;
    }
    if (words > g->stream_cap) {
        uint16_t *s = (uint16_t *)realloc(g->stream, words * sizeof(uint16_t));
        if (s == NULL) return -1;
        g->stream = s;
        g->stream_cap = words;
    }
    memset(g->stream, 0, words * sizeof(uint16_t));
    aead_ctr(&g->aes, nonce, AEAD_NONCE_BYTES, 0, g->stream, g->stream, words * sizeof(uint16_t));
    for (int i = 0; i < SKETCH_BLOCK; i++) {
        for (int k = 0; k < 2; k++) {
            double c = sketch_coef(g->stream[2 * i + k]);
            g->b[k][i] = c;
        }
    }
    for (size_t j = 0; j < 2 * blocks; j++) g->a[j] = sketch_coef(g->stream[2 * SKETCH_BLOCK + j]);
    g->n = n;
    g->blocks = blocks;
    return 0;
}

// sketch_covers: whether elements g0 .. g0 + len - 1 lie within the n
// elements of the last draw. sketch_add and sketch_reduce take only such
// pieces: an element past n has no coefficient drawn for it (or one of the
// block's padding, which the other members never weigh), so a change there
// would go unseen. shm_comm.h ends the job on a piece that does not.
static inline int sketch_covers(const SketchGen *g, size_t g0, size_t len) {
    return g0 <= g->n && len <= g->n - g0;
}

// one segment within a block: m elements from block offset off. Lane l sums
// the elements i = l (mod 8) from the segment's start, the rest go to lane 0,
// and the lanes meet in a fixed tree: the order is the segment's, never the
// buffer's alignment or the build's vector width, so every build of a job
// sketches alike. A segment's sums of one vector, out[4]: the two sketches
// sum b[i] x_i, then (level 1) the magnitudes sum |x_i|, then (level 2) the
// squares sum x_i^2. GCC's and Clang's vector extension runs the 8 lanes as
// two vectors of 4 doubles; the plain loops (-DLLM3D_SCALAR) add in the same
// order. The magnitudes are summed unweighted (|b| < 1 bounds them), by
// adds, not multiplies: the multiplier units are what a pass runs out of.
//
// sketch_segment sums one vector; sketch_segment_reduce is a reducing
// receive's one pass: z = v + a in fp32 (stored; z may be a), with the sums
// of v (level 1), of a (level 2) and of z (level 0), each alike to
// sketch_segment's of that vector, while the segment is in L1: the addend
// is read from memory once, where three passes and the sum's own read it.
enum { SKETCH_PLAIN = 0, SKETCH_MAGNITUDES = 1, SKETCH_SQUARES = 2 };

#if defined(__GNUC__) && !defined(LLM3D_SCALAR)
typedef double sketch_d4 __attribute__((vector_size(32)));
typedef long long sketch_l4 __attribute__((vector_size(32)));
typedef float sketch_f4 __attribute__((vector_size(16)));
typedef float sketch_f4u __attribute__((vector_size(16), aligned(4), may_alias));
typedef double sketch_d4u __attribute__((vector_size(32), aligned(8), may_alias));

// 4 floats to doubles, element by element: GCC 12 makes one vcvtps2pd of
// this, but splits __builtin_convertvector's in two halves and an insert
static inline sketch_d4 sketch_cvt4(sketch_f4 x) {
    sketch_d4 d = {(double)x[0], (double)x[1], (double)x[2], (double)x[3]};
    return d;
}
static inline sketch_d4 sketch_load4(const float *x) {
    sketch_d4 d = {(double)x[0], (double)x[1], (double)x[2], (double)x[3]};
    return d;
}
static inline sketch_d4 sketch_coef4(const double *b) { return *(const sketch_d4u *)b; }
static inline sketch_d4 sketch_abs4(sketch_d4 v) {
    const sketch_l4 mask = {0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL, 0x7fffffffffffffffLL};
    return (sketch_d4)((sketch_l4)v & mask);
}
// the tree of lanes 0-3 (l) and 4-7 (h)
static inline double sketch_tree(sketch_d4 l, sketch_d4 h) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((h[0] + h[1]) + (h[2] + h[3]));
}

static inline void sketch_segment(const SketchGen *g, size_t off, const float *x, size_t m, int level, double out[4]) {
    const double *b0 = g->b[0] + off, *b1 = g->b[1] + off;
    sketch_d4 s0l = {0, 0, 0, 0}, s0h = s0l, s1l = s0l, s1h = s0l, ml = s0l, mh = s0l, ql = s0l, qh = s0l;
    size_t i = 0;
    if (level == SKETCH_SQUARES) {
        for (; i + 8 <= m; i += 8) {
            sketch_d4 vl = sketch_load4(x + i), vh = sketch_load4(x + i + 4);
            s0l += sketch_coef4(b0 + i) * vl; s0h += sketch_coef4(b0 + i + 4) * vh;
            s1l += sketch_coef4(b1 + i) * vl; s1h += sketch_coef4(b1 + i + 4) * vh;
            ml += sketch_abs4(vl); mh += sketch_abs4(vh);
            ql += vl * vl; qh += vh * vh;
        }
    } else if (level == SKETCH_MAGNITUDES) {
        for (; i + 8 <= m; i += 8) {
            sketch_d4 vl = sketch_load4(x + i), vh = sketch_load4(x + i + 4);
            s0l += sketch_coef4(b0 + i) * vl; s0h += sketch_coef4(b0 + i + 4) * vh;
            s1l += sketch_coef4(b1 + i) * vl; s1h += sketch_coef4(b1 + i + 4) * vh;
            ml += sketch_abs4(vl); mh += sketch_abs4(vh);
        }
    } else {
        for (; i + 8 <= m; i += 8) {
            sketch_d4 vl = sketch_load4(x + i), vh = sketch_load4(x + i + 4);
            s0l += sketch_coef4(b0 + i) * vl; s0h += sketch_coef4(b0 + i + 4) * vh;
            s1l += sketch_coef4(b1 + i) * vl; s1h += sketch_coef4(b1 + i + 4) * vh;
        }
    }
    for (; i < m; i++) {
        double v = (double)x[i];
        s0l[0] += b0[i] * v;
        s1l[0] += b1[i] * v;
        if (level >= SKETCH_MAGNITUDES) ml[0] += fabs(v);
        if (level >= SKETCH_SQUARES) ql[0] += v * v;
    }
    out[0] = sketch_tree(s0l, s0h);
    out[1] = sketch_tree(s1l, s1h);
    out[2] = sketch_tree(ml, mh);
    out[3] = sketch_tree(ql, qh);
}

static inline void sketch_segment_reduce(const SketchGen *g, size_t off, const float *v, const float *a, float *z,
                                         size_t m, double sv[4], double sa[4], double sz[4]) {
    // two loops over the segment (at most K floats, in L1 after the first):
    // the sum and a's sums, then v's and z's; all 18 vectors of lanes at
    // once would not fit the registers
    const double *b0 = g->b[0] + off, *b1 = g->b[1] + off;
    size_t whole = m / 8 * 8;
    sketch_d4 x0l = {0, 0, 0, 0}, x0h = x0l, x1l = x0l, x1h = x0l, xml = x0l, xmh = x0l, ql = x0l, qh = x0l;
    for (size_t i = 0; i < whole; i += 8) {
        sketch_f4 afl = *(const sketch_f4u *)(a + i), afh = *(const sketch_f4u *)(a + i + 4);
        *(sketch_f4u *)(z + i) = *(const sketch_f4u *)(v + i) + afl;  // a read first: z may be a
        *(sketch_f4u *)(z + i + 4) = *(const sketch_f4u *)(v + i + 4) + afh;
        sketch_d4 dl = sketch_cvt4(afl), dh = sketch_cvt4(afh);
        x0l += sketch_coef4(b0 + i) * dl; x0h += sketch_coef4(b0 + i + 4) * dh;
        x1l += sketch_coef4(b1 + i) * dl; x1h += sketch_coef4(b1 + i + 4) * dh;
        xml += sketch_abs4(dl); xmh += sketch_abs4(dh);
        ql += dl * dl; qh += dh * dh;
    }
    sketch_d4 v0l = {0, 0, 0, 0}, v0h = v0l, v1l = v0l, v1h = v0l, vml = v0l, vmh = v0l;
    sketch_d4 z0l = v0l, z0h = v0l, z1l = v0l, z1h = v0l;
    for (size_t i = 0; i < whole; i += 8) {
        sketch_d4 c0l = sketch_coef4(b0 + i), c0h = sketch_coef4(b0 + i + 4);
        sketch_d4 c1l = sketch_coef4(b1 + i), c1h = sketch_coef4(b1 + i + 4);
        sketch_d4 dl = sketch_load4(v + i), dh = sketch_load4(v + i + 4);
        v0l += c0l * dl; v0h += c0h * dh; v1l += c1l * dl; v1h += c1h * dh;
        vml += sketch_abs4(dl); vmh += sketch_abs4(dh);
        dl = sketch_load4(z + i), dh = sketch_load4(z + i + 4);
        z0l += c0l * dl; z0h += c0h * dh; z1l += c1l * dl; z1h += c1h * dh;
    }
    for (size_t i = whole; i < m; i++) {
        float vf = v[i], af = a[i], zf = vf + af;
        z[i] = zf;
        double dv = (double)vf, da = (double)af, dz = (double)zf;
        v0l[0] += b0[i] * dv;
        v1l[0] += b1[i] * dv;
        vml[0] += fabs(dv);
        x0l[0] += b0[i] * da;
        x1l[0] += b1[i] * da;
        xml[0] += fabs(da);
        ql[0] += da * da;
        z0l[0] += b0[i] * dz;
        z1l[0] += b1[i] * dz;
    }
    sv[0] = sketch_tree(v0l, v0h);
    sv[1] = sketch_tree(v1l, v1h);
    sv[2] = sketch_tree(vml, vmh);
    sv[3] = 0.0;
    sa[0] = sketch_tree(x0l, x0h);
    sa[1] = sketch_tree(x1l, x1h);
    sa[2] = sketch_tree(xml, xmh);
    sa[3] = sketch_tree(ql, qh);
    sz[0] = sketch_tree(z0l, z0h);
    sz[1] = sketch_tree(z1l, z1h);
    sz[2] = sz[3] = 0.0;
}
#else
static inline double sketch_tree8(const double v[8]) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

static inline void sketch_segment(const SketchGen *g, size_t off, const float *x, size_t m, int level, double out[4]) {
    const double *b0 = g->b[0] + off, *b1 = g->b[1] + off;
    double lanes[4][8];
    memset(lanes, 0, sizeof(lanes));
    size_t whole = m / 8 * 8;
    for (size_t i = 0; i < m; i++) {
        int l = i < whole ? (int)(i % 8) : 0;
        double v = (double)x[i];
        lanes[0][l] += b0[i] * v;
        lanes[1][l] += b1[i] * v;
        if (level >= SKETCH_MAGNITUDES) lanes[2][l] += fabs(v);
        if (level >= SKETCH_SQUARES) lanes[3][l] += v * v;
    }
    for (int k = 0; k < 4; k++) out[k] = sketch_tree8(lanes[k]);
}

static inline void sketch_segment_reduce(const SketchGen *g, size_t off, const float *v, const float *a, float *z,
                                         size_t m, double sv[4], double sa[4], double sz[4]) {
    const double *b0 = g->b[0] + off, *b1 = g->b[1] + off;
    double lv[4][8], la[4][8], lz[4][8];
    memset(lv, 0, sizeof(lv));
    memset(la, 0, sizeof(la));
    memset(lz, 0, sizeof(lz));
    size_t whole = m / 8 * 8;
    for (size_t i = 0; i < m; i++) {
        int l = i < whole ? (int)(i % 8) : 0;
        float vf = v[i], af = a[i], zf = vf + af;  // a read before z, which may be a, is written
        z[i] = zf;
        double dv = (double)vf, da = (double)af, dz = (double)zf;
        lv[0][l] += b0[i] * dv;
        lv[1][l] += b1[i] * dv;
        lv[2][l] += fabs(dv);
        la[0][l] += b0[i] * da;
        la[1][l] += b1[i] * da;
        la[2][l] += fabs(da);
        la[3][l] += da * da;
        lz[0][l] += b0[i] * dz;
        lz[1][l] += b1[i] * dz;
    }
    for (int k = 0; k < 4; k++) {
        sv[k] = sketch_tree8(lv[k]);
        sa[k] = sketch_tree8(la[k]);
        sz[k] = sketch_tree8(lz[k]);
    }
}
#endif

// sketch_sumsq: sum x^2 over n floats, in double, 8 lanes: what the
// gradient-norm rule reads of a rank's input when the checks (which make it
// with their sketch) are off
static inline double sketch_sumsq(const float *x, size_t n) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
#if defined(__GNUC__) && !defined(LLM3D_SCALAR)
    sketch_d4 ql = {0, 0, 0, 0}, qh = {0, 0, 0, 0};
    for (; i + 8 <= n; i += 8) {
        sketch_d4 vl = sketch_load4(x + i), vh = sketch_load4(x + i + 4);
        ql += vl * vl;
        qh += vh * vh;
    }
    for (int l = 0; l < 4; l++) {
        lanes[l] = ql[l];
        lanes[4 + l] = qh[l];
    }
#endif
    for (; i < n; i++) lanes[i % 8] += (double)x[i] * (double)x[i];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// sketch_sum_sumsq: a reducing receive's pass when the checks are off and
// the gradients counted: z = v + a (fp32; z may be a), returning sum a^2 as
// sketch_sumsq makes it of a, in the same pass
static inline double sketch_sum_sumsq(const float *v, const float *a, float *z, size_t n) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
#if defined(__GNUC__) && !defined(LLM3D_SCALAR)
    sketch_d4 ql = {0, 0, 0, 0}, qh = {0, 0, 0, 0};
    for (; i + 8 <= n; i += 8) {
        sketch_f4 al = *(const sketch_f4u *)(a + i), ah = *(const sketch_f4u *)(a + i + 4);
        *(sketch_f4u *)(z + i) = *(const sketch_f4u *)(v + i) + al;  // a read first: z may be a
        *(sketch_f4u *)(z + i + 4) = *(const sketch_f4u *)(v + i + 4) + ah;
        sketch_d4 dl = sketch_cvt4(al), dh = sketch_cvt4(ah);
        ql += dl * dl;
        qh += dh * dh;
    }
    for (int l = 0; l < 4; l++) {
        lanes[l] = ql[l];
        lanes[4 + l] = qh[l];
    }
#endif
    for (; i < n; i++) {
        float af = a[i];
        z[i] = v[i] + af;
        lanes[i % 8] += (double)af * (double)af;
    }
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

// a segment's sums into acc, with block blk's coefficients: one fma each.
// blk < g->blocks, as the piece lies within the draw (sketch_covers)
static inline void sketch_take(Sketch *acc, const SketchGen *g, size_t blk, const double seg[4], int level) {
    double c0 = g->a[2 * blk], c1 = g->a[2 * blk + 1];
    acc->s[0] = fma(c0, seg[0], acc->s[0]);
    acc->s[1] = fma(c1, seg[1], acc->s[1]);
    if (level >= SKETCH_MAGNITUDES) {
        acc->a[0] = fma(fabs(c0), seg[2], acc->a[0]);
        acc->a[1] = fma(fabs(c1), seg[2], acc->a[1]);
    }
    if (level >= SKETCH_SQUARES) acc->q += seg[3];
}

// sketch_add: elements g0 .. g0 + len - 1 of the collective's vector, whose
// values are x, into acc (full: the |r|.|x| bounds and the squares too).
// Each block segment enters acc through one fma, so the result depends on
// the values and on where the pieces are cut, nothing else.
static inline void sketch_add(Sketch *acc, const SketchGen *g, size_t g0, const float *x, size_t len, int full) {
    int level = full ? SKETCH_SQUARES : SKETCH_PLAIN;
    while (len > 0) {
        size_t blk = g0 / SKETCH_BLOCK, off = g0 % SKETCH_BLOCK;
        size_t m = SKETCH_BLOCK - off < len ? SKETCH_BLOCK - off : len;
        double seg[4];
        sketch_segment(g, off, x, m, level, seg);
        sketch_take(acc, g, blk, seg, level);
        x += m;
        g0 += m;
        len -= m;
    }
}

// sketch_reduce: a reducing receive's piece, elements g0 .. g0 + len - 1:
// z = v + a (fp32; z may be a, not otherwise overlap it), in one pass, with
// v into sv (what arrived, with its |r|.|x| bounds), a into sa (full: the
// member's own input) and z into sz (the sum), each's sketch bit for bit
// what sketch_add makes of that vector. piece (when not NULL): the same
// three of this piece alone, from zero, for its own sum check
// (sketch_piece_ratio).
static inline void sketch_reduce(Sketch *sv, Sketch *sa, Sketch *sz, Sketch piece[3], const SketchGen *g, size_t g0,
                                 const float *v, const float *a, float *z, size_t len) {
    if (piece != NULL) memset(piece, 0, 3 * sizeof(Sketch));
    while (len > 0) {
        size_t blk = g0 / SKETCH_BLOCK, off = g0 % SKETCH_BLOCK;
        size_t m = SKETCH_BLOCK - off < len ? SKETCH_BLOCK - off : len;
        double segv[4], sega[4], segz[4];
        sketch_segment_reduce(g, off, v, a, z, m, segv, sega, segz);
        sketch_take(sv, g, blk, segv, SKETCH_MAGNITUDES);
        sketch_take(sa, g, blk, sega, SKETCH_SQUARES);
        sketch_take(sz, g, blk, segz, SKETCH_PLAIN);
        if (piece != NULL) {
            sketch_take(&piece[0], g, blk, segv, SKETCH_MAGNITUDES);
            sketch_take(&piece[1], g, blk, sega, SKETCH_SQUARES);
            sketch_take(&piece[2], g, blk, segz, SKETCH_PLAIN);
        }
        v += m;
        a += m;
        z += m;
        g0 += m;
        len -= m;
    }
}

// ----------------------------------------------------------------------------
// the bounds. u = 2^-24 (fp32's unit roundoff), e(N) the relative error of a
// sketch of N elements as sketch_add computes it, in double:
//   e(N) <= (K/8 + 16 + 2N/K) 2^-53
// (a lane's sum of at most K/8 + 7 exact products, 3 levels of the lanes'
// tree, one fma per segment into a running sum of at most 2N/K + 2 segments,
// as frames of 16384 elements cut at most N/K more segments than the blocks).
// The products b * x are exact, so no term for them. The |r|.|x| bounds A
// (Sketch's a) are sums of the same shape, of |x| (|b| < 1 dropped, so A
// is at most 2x, some 1.4x on average, sum |r| |x|).

static inline double sketch_eval_error(size_t n) {
    return ((double)SKETCH_BLOCK / 8.0 + 16.0 + 2.0 * (double)n / SKETCH_BLOCK) * ldexp(1.0, -53);
}

// sketch_hop_bound: how far the sketch of one ring hop's sum z = fl(P + x)
// (elementwise, fp32) may be from the sketches of P and x, when the chain
// that made P and x added t + 1 inputs whose |r|.|x| sums total sum_a. Per
// element |fl(P+x) - (P+x)| <= u |P + x| <= u (|P| + |x|), so
//   |S(z) - S(P) - S(x)| <= u (A(P) + A(x)),  A(P) + A(x) <= (1+u)^t sum_a,
// to which the three computed sketches' errors add e (A(z) + A(P) + A(x))
// and the two subtractions 2^-52 of the same. n: the chunk's elements.
// With t = 0 and sum_a = A(P) + A(x) of one piece's own sketches, the bound
// of that piece's sums alone (sketch_piece_ratio).
static inline double sketch_hop_bound(double sum_a, int t, size_t n) {
    double u = ldexp(1.0, -24), e = sketch_eval_error(n);
    return (u + 3.0 * e + ldexp(1.0, -51)) * (1.0 + 2.0 * (t + 1) * u + 4.0 * e) * sum_a;
}

// sketch_sum_bound: the bound for a sum of p inputs made in any order with
// a rounding after every addition (the ring's p - 1 additions, or NCCL's ring
// or tree), of unit roundoff u (2^-24 for fp32; 2^-8 for bf16, whose sums
// NCCL rounds to bf16 at every hop): |S(y) - sum_i S(x_i)| <= gamma(p-1) sum_a,
// gamma(m) = m u / (1 - m u), plus the p + 1 sketches' evaluation errors.
static inline double sketch_sum_bound(double sum_a, int p, double u, size_t n) {
    double m = (double)(p - 1), e = sketch_eval_error(n);
    double gamma = m * u / (1.0 - m * u);
    return (gamma + (p + 2) * e + p * ldexp(1.0, -52)) * (1.0 + gamma) * sum_a;
}

// ----------------------------------------------------------------------------
// the record: what one member of a group of p computed in one collective,
// 5p - 3 sketches:
//   in[k]    its input's chunk k (k = 0..p-1), full: sent at the reduce-
//            scatter's hop 0 (chunk me-1) or added at hop s (chunk me-s-2)
//   recv[s]  what it received at the reduce-scatter's hop s (s = 0..p-2)
//   out[s]   the sum it made there; out[p-2] is its reduced chunk
//   own      its chunk as it sent it at the all-gather's hop 0 (an all-
//            reduce's: a copy of out[p-2], the sum it sends on)
//   got[s]   what it received at the all-gather's hop s (chunk me-s-1)
//   frame[s] not a sketch: the worst of the sums it made at the reduce-
//            scatter's hop s, checked frame by frame (sketch_piece_note):
//            s[0] |diff| / bound (0 when none), s[1] the diff, a[0] the
//            bound, a[1] the frame's first element, q its elements
// A reduce-scatter fills in, recv, out, frame; an all-gather own and got;
// an all-reduce all. SK_BROADCAST is the NCCL checks' alone (nccl_check.h:
// its own record and verdict; the host backend's broadcasts are MAC'd
// frames, not sketched), numbered here so that its draws' op is no other's.

enum { SK_ALLREDUCE = 0, SK_REDUCE_SCATTER = 1, SK_ALLGATHER = 2, SK_BROADCAST = 3 };

static inline size_t sketch_rec_count(int p) { return (size_t)(5 * p - 3); }
static inline size_t sketch_rec_in(int p, int k) { (void)p; return (size_t)k; }
static inline size_t sketch_rec_recv(int p, int s) { return (size_t)(p + s); }
static inline size_t sketch_rec_out(int p, int s) { return (size_t)(2 * p - 1 + s); }
static inline size_t sketch_rec_own(int p) { return (size_t)(3 * p - 2); }
static inline size_t sketch_rec_got(int p, int s) { return (size_t)(3 * p - 1 + s); }
static inline size_t sketch_rec_frame(int p, int s) { return (size_t)(4 * p - 2 + s); }

typedef struct {
    int kind;                 // SK_*
    int p;                    // the group's size
    const int *ranks;         // its members' world ranks
    size_t n;                 // all-reduce: the vector's elements; the others: each chunk's
    const Sketch *recs;       // p records, member by member, sketch_rec_count(p) sketches each
} SketchCase;

static inline int sketch_mod(int a, int p) { return ((a % p) + p) % p; }

// chunk k's elements [lo, hi)
static inline void sketch_chunk(const SketchCase *c, int k, size_t *lo, size_t *hi) {
    if (c->kind == SK_ALLREDUCE) {
        *lo = c->n * (size_t)k / (size_t)c->p;
        *hi = c->n * (size_t)(k + 1) / (size_t)c->p;
    } else {
        *lo = c->n * (size_t)k;
        *hi = *lo + c->n;
    }
}

static inline const Sketch *sketch_at(const SketchCase *c, int member, size_t i) {
    return c->recs + (size_t)member * sketch_rec_count(c->p) + i;
}

// the same bits (data that only moved)
static inline int sketch_same(const Sketch *x, const Sketch *y) {
    return memcmp(x->s, y->s, sizeof(x->s)) == 0;
}

static inline int sketch_finite(const Sketch *x) {
    return isfinite(x->s[0]) && isfinite(x->s[1]) && isfinite(x->a[0]) && isfinite(x->a[1]);
}

// sketch_piece_ratio: a reducing receive's piece of n elements, from its
// own sketches piece[3] (what arrived, the addend, the sum; sketch_reduce):
// how far the sum's sketch is from the other two's, over the piece's
// rounding bound (sketch_hop_bound with t = 0), for the worse of the two
// sketches, whose figures go to diff and bound. At most 1 when the sums
// hold. A frame's bound is some 2^-24 of its 16K elements' |x| sums, where
// the chunk's, checked too, grows with the chunk: a wrong element a frame
// sees can hide in the rounding a chunk of millions allows. 0 for inputs
// not finite (the trainer's not-finite rule acts on them) and for a sum
// that overflowed from inputs that large.
static inline double sketch_piece_ratio(const Sketch piece[3], size_t n, double *diff, double *bound) {
    double worst = 0.0;
    *diff = *bound = 0.0;
    if (!sketch_finite(&piece[0]) || !sketch_finite(&piece[1])) return 0.0;
    for (int j = 0; j < 2; j++) {
        double sum_a = piece[0].a[j] + piece[1].a[j];
        double d = piece[2].s[j] - piece[0].s[j] - piece[1].s[j], b = sketch_hop_bound(sum_a, 0, n);
        if (!isfinite(piece[2].s[j]) && sum_a >= 0.125 * FLT_MAX) continue;
        double r = fabs(d) <= b ? (b > 0.0 ? fabs(d) / b : 0.0) : (b > 0.0 && isfinite(d) ? fabs(d) / b : INFINITY);
        if (r > worst) {
            worst = r;
            *diff = d;
            *bound = b;
        }
    }
    return worst;
}

// sketch_piece_note: a piece's ratio (elements g0 .. g0 + n - 1) into the
// worst of its hop, the record's frame[s]
static inline void sketch_piece_note(Sketch *worst, const Sketch piece[3], size_t g0, size_t n) {
    double diff, bound, r = sketch_piece_ratio(piece, n, &diff, &bound);
    if (r > worst->s[0]) {
        worst->s[0] = r;
        worst->s[1] = diff;
        worst->a[0] = bound;
        worst->a[1] = (double)g0;
        worst->q = (double)n;
    }
}

// sketch_moved: data that only moved arrived as it left: the same bits, or
// both sketches not finite. A sketch of finite floats is always finite (|r|
// < 1, sums in double), so both ends saw data that is not finite: a NaN's
// bits (its payload, which of two NaNs an addition keeps) are no sign of a
// change in transit, and the trainer's not-finite rule acts on such data.
// Finite data that arrived not finite, or the reverse, is a change.
static inline int sketch_moved(const Sketch *sent, const Sketch *got) {
    if (sketch_same(sent, got)) return 1;
    return !(isfinite(sent->s[0]) && isfinite(sent->s[1])) && !(isfinite(got->s[0]) && isfinite(got->s[1]));
}

// sketch_judge: every check of one collective, on all the members' records.
// 0 when all hold; else 1, and msg says the first that fails along the ring:
// a piece changed between one member's sketch and the next one's (which
// hop), or a sum off by more than its bound (which member's addition).
// Every member judges the same records, so all reach the same verdict.
static inline int sketch_judge(const SketchCase *c, char *msg, size_t len) {
    int p = c->p;
    const int *R = c->ranks;
    const char *phase = c->kind == SK_ALLREDUCE ? " in the reduce-scatter" : "";
    if (c->kind != SK_ALLGATHER) {
        for (int k = 0; k < p; k++) {
            size_t lo, hi;
            sketch_chunk(c, k, &lo, &hi);
            int q0 = sketch_mod(k + 1, p);
            const Sketch *sent = sketch_at(c, q0, sketch_rec_in(p, k));  // what q0 put in, and sent at its hop 0
            double sum_a[2] = {sent->a[0], sent->a[1]};
            int finite_in = sketch_finite(sent);
            for (int t = 1; t < p; t++) {
                int q = sketch_mod(k + 1 + t, p), prev = sketch_mod(q - 1, p);
                const Sketch *recv = sketch_at(c, q, sketch_rec_recv(p, t - 1));
                const Sketch *in = sketch_at(c, q, sketch_rec_in(p, k));
                const Sketch *out = sketch_at(c, q, sketch_rec_out(p, t - 1));
                if (!sketch_moved(sent, recv)) {
                    snprintf(msg, len, "chunk %d (elements %zu..%zu)%s: what rank %d sent rank %d at hop %d differs "
                             "from rank %d's sketch of it (%.17g, received as %.17g): it changed after rank %d made it "
                             "(rank %d's memory, the link, or rank %d's copy)", k, lo, hi - 1, phase, R[prev], R[q], t - 1,
                             R[prev], sent->s[0], recv->s[0], R[prev], R[prev], R[q]);
                    return 1;
                }
                finite_in = finite_in && sketch_finite(in);
                sum_a[0] += in->a[0];
                sum_a[1] += in->a[1];
                // inputs that are not finite make sums that are not either: the
                // trainer's not-finite rule acts on them, not this check
                if (finite_in) {
                    for (int j = 0; j < 2; j++) {
                        double diff = out->s[j] - recv->s[j] - in->s[j];
                        double bound = sketch_hop_bound(sum_a[j], t, hi - lo);
                        // a finite sum can overflow fp32 only when its inputs are that large
                        int overflow = !isfinite(out->s[j]) && sum_a[j] >= 0.125 * FLT_MAX;
                        if (!(fabs(diff) <= bound) && !overflow) {
                            snprintf(msg, len, "chunk %d (elements %zu..%zu)%s: the sum rank %d made at hop %d (what "
                                     "rank %d sent plus rank %d's own piece) is off by %.3g, more than its rounding "
                                     "bound %.3g (sketch %d): rank %d's addition, or its piece after its sketch",
                                     k, lo, hi - 1, phase, R[q], t - 1, R[prev], R[q], diff, bound, j, R[q]);
                            return 1;
                        }
                    }
                }
                // the same sum, frame by frame, each within its own bound
                const Sketch *fr = sketch_at(c, q, sketch_rec_frame(p, t - 1));
                if (!(fr->s[0] <= 1.0)) {
                    snprintf(msg, len, "chunk %d (elements %zu..%zu)%s: the sum rank %d made at hop %d (what rank %d "
                             "sent plus rank %d's own piece) is off by %.3g in its frame of elements %.0f..%.0f, more "
                             "than that frame's rounding bound %.3g: rank %d's addition, or its piece after its sketch",
                             k, lo, hi - 1, phase, R[q], t - 1, R[prev], R[q], fr->s[1], fr->a[1], fr->a[1] + fr->q - 1,
                             fr->a[0], R[q]);
                    return 1;
                }
                sent = out;
            }
        }
    }
    if (c->kind != SK_REDUCE_SCATTER) {
        const char *ag = c->kind == SK_ALLREDUCE ? " in the all-gather" : "";
        for (int k = 0; k < p; k++) {
            size_t lo, hi;
            sketch_chunk(c, k, &lo, &hi);
            const Sketch *own = sketch_at(c, k, sketch_rec_own(p));
            for (int t = 1; t < p; t++) {
                int q = sketch_mod(k + t, p), prev = sketch_mod(q - 1, p);
                const Sketch *got = sketch_at(c, q, sketch_rec_got(p, t - 1));
                if (sketch_moved(own, got)) continue;
                if (c->kind == SK_ALLREDUCE && t == 1)
                    // an all-reduce's member k sends on the sum it made at the
                    // last hop, whose sketch stands for what it sent (own is a
                    // copy of it): the chunk's wait in k's memory and the first
                    // link are one stretch to the checks
                    snprintf(msg, len, "chunk %d (elements %zu..%zu)%s: rank %d's reduced chunk as rank %d received "
                             "it differs from the last sum rank %d made (%.17g, received as %.17g): it changed after "
                             "that sum (rank %d's memory, the link, or rank %d's copy)", k, lo, hi - 1, ag, R[k], R[q],
                             R[k], own->s[0], got->s[0], R[k], R[q]);
                else
                    snprintf(msg, len, "chunk %d (elements %zu..%zu)%s: rank %d's piece as rank %d received it from "
                             "rank %d at hop %d differs from rank %d's sketch of it (%.17g, received as %.17g): it "
                             "changed between rank %d and rank %d", k, lo, hi - 1, ag, R[k], R[q], R[prev], t - 1, R[k],
                             own->s[0], got->s[0], R[prev], R[q]);
                return 1;
            }
        }
    }
    return 0;
}

#endif
