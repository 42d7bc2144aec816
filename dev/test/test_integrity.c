/*
 * test_integrity.c: the integrity of the collectives (-ic, sketch.h) and
 * the gradient-norm rule for rogue workers (-gp, watch.h's grads_judge).
 *
 * In-process: the keyed coefficients (the same context gives the same r,
 * another context another); the sketch against its definition written out
 * element by element, and a reducing receive's one pass (sketch_reduce,
 * sketch_sum_sumsq) against the plain sum and the passes apart; a ring
 * all-reduce played here the way shm_comm.h plays it (the same chunks,
 * frames and sketches), judged by sketch_judge: honest rings with data made
 * to round badly pass, and each kind of corruption is named (a piece changed
 * between two ranks, by an exponent or by its lowest mantissa bit; a sum off
 * by more than its bound, or by more than its frame's bound only; the
 * chunk's and the frame's bounds pinned at 1.5x and 16x u A computed here,
 * not by sketch_hop_bound; a sum made infinite or NaN from small inputs, by
 * the chunk's check and the frame's each alone; an all-gather piece
 * changed; finite data turned NaN in transit or the reverse), while a low-mantissa error inside a sum is below the bound and
 * passes, as doc/security.md says, and so does a NaN whose bits changed; the
 * fp32 and bf16 bounds of a whole p-term sum against played sums; the rule's
 * verdicts on made-up norms. Built with SIMD=scalar's flags as
 * test_integrity_scalar, the same checks of sketch.h's plain loops.
 *
 * Then real ranks of the host backend (this program started again through
 * the launcher: child_main): a piece sketched past the length its r was
 * drawn for ends the job, naming the collective and the lengths; -fault
 * corrupt-sum (a faulty adder: a sum's mid-mantissa bit flipped, the sum
 * sketched as stored) in an all-reduce and a reduce-scatter whose chunks
 * make one frame's bound far below the chunk's, caught and named by that
 * frame's check alone, and with -ic 0 returned one element off.
 *
 * Then ./train_gpt2 as real processes on a tiny model: -fault corrupt,
 * corrupt-low and corrupt-sum caught and named on data parallel (ZeRO 0-3: all-reduce,
 * reduce-scatter, all-gather), tensor parallel and both, with no update of
 * that step and no checkpoint from it; the same fault with -ic 0 unseen;
 * -fault poison named under -gp warn, skip and stop; -gp skip|stop, -ck and
 * -ic 1 with nothing to act on (dp 1; one rank) each a note; and normal runs of the
 * layouts, some beside a busy loop, with no failed check and no outlier;
 * the lines that say what the checks cost (dev/bench_ic.sh reads them).
 *
 * The NCCL side (nccl_check.h), on the host: the coefficients as the GPU
 * reads them (floats) are sketch.h's bit for bit; the GPU kernel's order of
 * sums (nchk_sketch_ref) within sketch_eval_error of sketch_add's; NCCL's
 * all-reduce, reduce-scatter, all-gather and broadcast played here in fp32
 * and in bf16 rounded at every hop, judged by nchk_judge: honest ones pass,
 * a flipped exponent bit in an input after its sketch, a member's copy
 * changed, an all-gather owner's or a broadcast root's piece changed are
 * caught and named as the sketches allow; a low-mantissa flip in an fp32 sum
 * is below the bound and passes.
 */
#include "llm3d/parallel/sketch.h"
#include "llm3d/parallel/nccl_check.h"
#include "llm3d/trainer.h"
#include "llm3d/watch.h"
#include "llm3d/bf16.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "dev/test/test_child.h"

#include <math.h>
#include <signal.h>
#include <sys/wait.h>

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float rng_unit(void) { return (float)((double)(rng_next() >> 40) / (double)(1 << 24)) * 2.0f - 1.0f; }

// ----------------------------------------------------------------------------
// the coefficients

static void test_coefficients(void) {
    uint8_t key[32], other[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1), other[i] = (uint8_t)(i * 7 + 2);
    static SketchGen g, h;
    sketch_gen_init(&g, key, "/llm3d-1-a");
    sketch_gen_init(&h, key, "/llm3d-1-a");
    size_t n = 3 * SKETCH_BLOCK + 17;
    sketch_draw(&g, 5, 42, 3, SK_ALLREDUCE, n);
    sketch_draw(&h, 5, 42, 3, SK_ALLREDUCE, n);
    int same = memcmp(g.b, h.b, sizeof(g.b)) == 0 && memcmp(g.a, h.a, 2 * g.blocks * sizeof(double)) == 0;
    double lo = 1.0, hi = 0.0;
    for (size_t j = 0; j < n; j++) {
        double r = fabs(g.a[2 * (j / SKETCH_BLOCK)] * g.b[0][j % SKETCH_BLOCK]);
        lo = fmin(lo, r);
        hi = fmax(hi, r);
    }
    check(same && g.blocks == 4 && lo >= 0.25 && hi < 1.0,
          "the same key and context draw the same r on two ranks; |r_j| in [%.3f, %.3f] within [1/4, 1)", lo, hi);
    // another step, call, group, op or key: other coefficients
    // a launch: another segment name, as jobs that share a --key-file have
    struct { long step; uint64_t group, call; int op; const uint8_t *key; const char *launch, *what; } ctx[] = {
        {6, 42, 3, SK_ALLREDUCE, key, "/llm3d-1-a", "step"}, {5, 43, 3, SK_ALLREDUCE, key, "/llm3d-1-a", "group"},
        {5, 42, 4, SK_ALLREDUCE, key, "/llm3d-1-a", "call"}, {5, 42, 3, SK_ALLGATHER, key, "/llm3d-1-a", "op"},
        {5, 42, 3, SK_ALLREDUCE, other, "/llm3d-1-a", "job key"},
        {5, 42, 3, SK_ALLREDUCE, key, "/llm3d-1-b", "launch of the same job key"},
    };
    for (size_t k = 0; k < sizeof(ctx) / sizeof(ctx[0]); k++) {
        sketch_gen_free(&h);
        sketch_gen_init(&h, ctx[k].key, ctx[k].launch);
        sketch_draw(&h, ctx[k].step, ctx[k].group, ctx[k].call, ctx[k].op, n);
        int equal = 0;
        for (int i = 0; i < SKETCH_BLOCK; i++) equal += g.b[0][i] == h.b[0][i];
        check(equal < SKETCH_BLOCK / 8, "another %s draws another r (%d of %d b coefficients alike)", ctx[k].what,
              equal, SKETCH_BLOCK);
    }
    // the sketch: the same values cut alike give the same bits, whatever
    // the buffer's alignment; a changed element changes it
    float *x = (float *)malloc((n + 1) * sizeof(float));
    for (size_t j = 0; j < n; j++) x[j] = rng_unit();
    memmove(x + 1, x, n * sizeof(float));  // the same values one float further on
    Sketch a = {{0, 0}, {0, 0}, 0}, b = a, c = a;
    sketch_add(&a, &g, 0, x + 1, 700, 1);
    sketch_add(&a, &g, 700, x + 701, n - 700, 1);
    float *y = (float *)malloc(n * sizeof(float));
    memcpy(y, x + 1, n * sizeof(float));
    sketch_add(&b, &g, 0, y, 700, 1);
    sketch_add(&b, &g, 700, y + 700, n - 700, 1);
    y[1000] = nextafterf(y[1000], 2.0f);
    sketch_add(&c, &g, 0, y, 700, 1);
    sketch_add(&c, &g, 700, y + 700, n - 700, 1);
    double q = 0.0;
    for (size_t j = 0; j < n; j++) q += (double)x[j + 1] * x[j + 1];
    check(memcmp(&a, &b, sizeof(a)) == 0 && !sketch_same(&a, &c) && fabs(a.q - q) <= 1e-12 * q,
          "a sketch: bit for bit the same from another buffer cut alike; one ulp of one element changes it; sum of "
          "squares %.6g (%.6g)", a.q, q);
    free(x);
    free(y);
    sketch_gen_free(&g);
    sketch_gen_free(&h);
}

// ----------------------------------------------------------------------------
// the sketch as doc/security.md defines it, one element at a time: per block
// segment, lane l sums b[i] x_i (and |x_i|, x_i^2) of the elements i = l
// (mod 8) of the whole octets, lane 0 the rest, the lanes meet in
// ((0+1)+(2+3))+((4+5)+(6+7)), and the segment enters the sketch through one
// fma with its block's a (|a| for the |x| sums). Every build's sketch_add and
// sketch_reduce must give these bits.
#define FRAME_FLOATS (65536 / 4)  // a frame's floats (COMM_SLOT_PAYLOAD)

static void reference_sketch(Sketch *acc, const SketchGen *g, size_t g0, const float *x, size_t len) {
    while (len > 0) {
        size_t blk = g0 / SKETCH_BLOCK, off = g0 % SKETCH_BLOCK;
        size_t m = SKETCH_BLOCK - off < len ? SKETCH_BLOCK - off : len, whole = m / 8 * 8;
        double lanes[5][8] = {{0}};
        for (size_t i = 0; i < m; i++) {
            int l = i < whole ? (int)(i % 8) : 0;
            double v = x[i];
            lanes[0][l] += g->b[0][off + i] * v;
            lanes[1][l] += g->b[1][off + i] * v;
            lanes[2][l] += fabs(v);
            lanes[4][l] += v * v;
        }
        double seg[5];
        for (int k = 0; k < 5; k++) {
            const double *w = lanes[k];
            seg[k] = ((w[0] + w[1]) + (w[2] + w[3])) + ((w[4] + w[5]) + (w[6] + w[7]));
        }
        double c0 = g->a[2 * blk], c1 = g->a[2 * blk + 1];
        acc->s[0] = fma(c0, seg[0], acc->s[0]);
        acc->s[1] = fma(c1, seg[1], acc->s[1]);
        acc->a[0] = fma(fabs(c0), seg[2], acc->a[0]);
        acc->a[1] = fma(fabs(c1), seg[2], acc->a[1]);
        acc->q += seg[4];
        x += m;
        g0 += m;
        len -= m;
    }
}

// full: 2 with the |x| bounds and the squares, 1 with the bounds
static int same_sketch(const Sketch *x, const Sketch *y, int full) {
    return memcmp(x->s, y->s, sizeof(x->s)) == 0 && (full < 1 || memcmp(x->a, y->a, sizeof(x->a)) == 0) &&
           (full < 2 || memcmp(&x->q, &y->q, sizeof(x->q)) == 0);
}

// a reducing receive's one pass (sketch_reduce; sketch_sum_sumsq with the
// checks off): the same sum bits as the plain fp32 loop, in place or not,
// and the same sketch bits as the definition, whatever the pieces' cuts
static void test_fused_pass(void) {
    uint8_t key[32] = {4, 2};
    static SketchGen g;
    sketch_gen_init(&g, key, "/llm3d-4-a");
    size_t cap = FRAME_FLOATS + 13;
    sketch_draw(&g, 1, 1, 1, SK_ALLREDUCE, cap + 4 * SKETCH_BLOCK);
    float *v = (float *)malloc(cap * sizeof(float)), *a = (float *)malloc(cap * sizeof(float));
    float *a0 = (float *)malloc(cap * sizeof(float)), *z = (float *)malloc(cap * sizeof(float));
    float *want = (float *)malloc(cap * sizeof(float));
    size_t lens[] = {1, 7, 8, 9, 100, 511, 512, 513, 1029, FRAME_FLOATS, FRAME_FLOATS + 13};
    size_t starts[] = {0, 3, 509, 3 * SKETCH_BLOCK + 100};
    int cases = 0, sums_bad = 0, sketches_bad = 0, squares_bad = 0;
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
        for (size_t si = 0; si < sizeof(starts) / sizeof(starts[0]); si++) {
            for (int inplace = 0; inplace < 2; inplace++) {
                size_t len = lens[li], g0 = starts[si], cut = len / 3;  // two pieces, as frames cut a transfer
                for (size_t j = 0; j < len; j++) {
                    v[j] = ldexpf(rng_unit(), (int)(rng_next() % 40) - 20);
                    a0[j] = j % 11 == 0 ? -v[j] : ldexpf(rng_unit(), (int)(rng_next() % 40) - 20);
                    want[j] = v[j] + a0[j];
                }
                Sketch zero = {{0, 0}, {0, 0}, 0}, rv = zero, ra = zero, rz = zero, fv = zero, fa = zero, fz = zero;
                Sketch sv = zero, sa = zero, sz = zero, piece[3], first[3], rp[3] = {zero, zero, zero};
                for (int piece = 0; piece < 2; piece++) {  // the definition and sketch_add, cut alike
                    size_t at = piece ? cut : 0, m = piece ? len - cut : cut;
                    reference_sketch(&rv, &g, g0 + at, v + at, m);
                    reference_sketch(&ra, &g, g0 + at, a0 + at, m);
                    reference_sketch(&rz, &g, g0 + at, want + at, m);
                    sketch_add(&sv, &g, g0 + at, v + at, m, 0);
                    sketch_add(&sa, &g, g0 + at, a0 + at, m, 1);
                    sketch_add(&sz, &g, g0 + at, want + at, m, 0);
                }
                memcpy(a, a0, len * sizeof(float));
                float *out = inplace ? a : z;
                sketch_reduce(&fv, &fa, &fz, first, &g, g0, v, a, out, cut);
                sketch_reduce(&fv, &fa, &fz, piece, &g, g0 + cut, v + cut, a + cut, out + cut, len - cut);
                // the second piece alone, from zero
                reference_sketch(&rp[0], &g, g0 + cut, v + cut, len - cut);
                reference_sketch(&rp[1], &g, g0 + cut, a0 + cut, len - cut);
                reference_sketch(&rp[2], &g, g0 + cut, want + cut, len - cut);
                cases++;
                sums_bad += memcmp(out, want, len * sizeof(float)) != 0;
                sketches_bad += !same_sketch(&rv, &sv, 0) || !same_sketch(&ra, &sa, 2) || !same_sketch(&rz, &sz, 0) ||
                                !same_sketch(&rv, &fv, 1) || !same_sketch(&ra, &fa, 2) || !same_sketch(&rz, &fz, 0) ||
                                !same_sketch(&rp[0], &piece[0], 1) || !same_sketch(&rp[1], &piece[1], 2) ||
                                !same_sketch(&rp[2], &piece[2], 0);
                // with the checks off: the sum and sketch_sumsq's squares of the addend
                memcpy(a, a0, len * sizeof(float));
                double q = sketch_sum_sumsq(v, a, inplace ? a : z, len), want_q = sketch_sumsq(a0, len);
                squares_bad += memcmp(&q, &want_q, sizeof(q)) != 0 || memcmp(inplace ? a : z, want, len * sizeof(float));
            }
        }
    }
    check(cases > 0 && sums_bad == 0 && squares_bad == 0, "%d reducing passes (1 to %d elements from block offsets 0 "
          "to 3K+100, in place and not, in two pieces): the fp32 sums bit for bit the plain loop's (%d differ), and "
          "with the checks off the addend's sum of squares sketch_sumsq's (%d differ)", cases, FRAME_FLOATS + 13,
          sums_bad, squares_bad);
    check(sketches_bad == 0, "the same %d: sketch_add's and sketch_reduce's sketches of what arrived (with its |x| "
          "bounds), the addend (with its bounds and squares) and the sum, bit for bit the definition's (8 lanes, the "
          "fixed tree, one fma per segment), for the whole and for a piece alone (%d differ)", cases, sketches_bad);
    free(v);
    free(a);
    free(a0);
    free(z);
    free(want);
    sketch_gen_free(&g);
}

// ----------------------------------------------------------------------------
// a ring all-reduce played as shm_comm.h plays it: chunk k = [n k/p, n (k+1)/p)
// summed from member k+1 round to member k, then passed on; every transfer in
// frames of COMM_SLOT_PAYLOAD bytes, each frame sketched as it passes

enum { NO_FAULT, TRANSIT_EXP, TRANSIT_LOW, SUM_EXP, SUM_LOW, GATHER_EXP, REDUCED_EXP, REDUCED_LOW, INPUT_NAN,
       TRANSIT_NAN_BITS, TRANSIT_TO_NAN, TRANSIT_FROM_NAN, SUM_BY, SUM_SKETCH_BY, SUM_TO_INF, SUM_TO_NAN };

// SUM_BY: the largest element of a hop's sum moved by this much (a change
// between a frame's rounding bound and its chunk's); SUM_SKETCH_BY: moved so
// that its sketch 0 moves by this much (by it over |r_j|)
static float sum_by = 0.0f;

typedef struct { int kind, member, hop; } Injected;

static void sketch_frames(Sketch *sk, const SketchGen *g, size_t g0, const float *x, size_t len, int full) {
    for (size_t off = 0; off < len; off += FRAME_FLOATS)
        sketch_add(sk, g, g0 + off, x + off, len - off < FRAME_FLOATS ? len - off : FRAME_FLOATS, full);
}

static void flip(float *v, int bit) {
    uint32_t u;
    memcpy(&u, v, 4);
    u ^= 1u << bit;
    memcpy(v, &u, 4);
}

static size_t largest(const float *x, size_t n) {
    size_t at = 0;
    for (size_t j = 1; j < n; j++) if (fabsf(x[j]) > fabsf(x[at])) at = j;
    return at;
}

static size_t first_nan(const float *x, size_t n) {
    size_t at = 0;
    while (at + 1 < n && !isnan(x[at])) at++;
    return at;
}

// a NaN with payload bits: another payload is another NaN, bit for bit
static float nan_with(uint32_t payload) {
    uint32_t u = 0x7fc00000u | (payload & 0x3fffffu);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

// plays the all-reduce of x (p members x n, member-major) into recs
// (sketch_rec_count(p) per member), with one injected fault; the members'
// buffers end reduced in x
static void play_allreduce(const SketchGen *g, int p, size_t n, float *x, Sketch *recs, Injected f) {
    size_t count = sketch_rec_count(p);
    memset(recs, 0, (size_t)p * count * sizeof(Sketch));
    float *wire = (float *)malloc((n / p + 2) * sizeof(float));
    for (int s = 0; s < p - 1; s++) {  // reduce-scatter: every member sends, then receives, at each hop
        for (int me = 0; me < p; me++) {
            int prev = (me + p - 1) % p, kr = ((me - s - 2) % p + p) % p;
            size_t r0 = n * (size_t)kr / p, r1 = n * (size_t)(kr + 1) / p, len = r1 - r0;
            float *sent = x + (size_t)prev * n + r0, *mine = x + (size_t)me * n + r0;
            Sketch *rec = recs + (size_t)me * count, *prec = recs + (size_t)prev * count;
            if (s == 0) sketch_frames(prec + sketch_rec_in(p, kr), g, r0, sent, len, 1);  // prev's own chunk, as sent
            memcpy(wire, sent, len * sizeof(float));
            int here = f.member == prev && f.hop == s;
            if (f.kind == TRANSIT_EXP && here) flip(wire + largest(wire, len), 30);
            if (f.kind == TRANSIT_LOW && here) flip(wire + largest(wire, len), 0);
            if (f.kind == TRANSIT_NAN_BITS && here) flip(wire + first_nan(wire, len), 0);  // another NaN
            if (f.kind == TRANSIT_TO_NAN && here) wire[largest(wire, len)] = NAN;
            if (f.kind == TRANSIT_FROM_NAN && here) wire[first_nan(wire, len)] = 1.0f;
            if (f.kind == SUM_EXP || f.kind == SUM_LOW || f.kind == SUM_BY || f.kind == SUM_SKETCH_BY || f.kind == SUM_TO_INF ||
                f.kind == SUM_TO_NAN) {
                // the sum changed in memory before its sketch: the passes apart,
                // each frame's own sketches too
                float *add = (float *)malloc(len * sizeof(float));
                memcpy(add, mine, len * sizeof(float));
                sketch_frames(rec + sketch_rec_in(p, kr), g, r0, mine, len, 1);
                sketch_frames(rec + sketch_rec_recv(p, s), g, r0, wire, len, 0);
                for (size_t j = 0; j < len; j++) mine[j] = wire[j] + mine[j];
                if (f.member == me && f.hop == s) {
                    size_t at = largest(mine, len);
                    if (f.kind == SUM_BY) mine[at] += mine[at] < 0 ? -sum_by : sum_by;
                    else if (f.kind == SUM_SKETCH_BY) {
                        size_t gj = r0 + at;
                        mine[at] += (float)(sum_by / fabs(g->a[2 * (gj / SKETCH_BLOCK)] * g->b[0][gj % SKETCH_BLOCK]));
                    } else if (f.kind == SUM_TO_INF) mine[at] = INFINITY;
                    else if (f.kind == SUM_TO_NAN) mine[at] = NAN;
                    else flip(mine + at, f.kind == SUM_EXP ? 30 : 0);
                }
                sketch_frames(rec + sketch_rec_out(p, s), g, r0, mine, len, 0);
                for (size_t off = 0; off < len; off += FRAME_FLOATS) {
                    size_t m = len - off < FRAME_FLOATS ? len - off : FRAME_FLOATS;
                    Sketch piece[3] = {{{0, 0}, {0, 0}, 0}, {{0, 0}, {0, 0}, 0}, {{0, 0}, {0, 0}, 0}};
                    sketch_add(&piece[0], g, r0 + off, wire + off, m, 1);
                    sketch_add(&piece[1], g, r0 + off, add + off, m, 1);
                    sketch_add(&piece[2], g, r0 + off, mine + off, m, 0);
                    sketch_piece_note(rec + sketch_rec_frame(p, s), piece, r0 + off, m);
                }
                free(add);
            } else {
                // shm_comm.h's one pass per frame
                for (size_t off = 0; off < len; off += FRAME_FLOATS) {
                    size_t m = len - off < FRAME_FLOATS ? len - off : FRAME_FLOATS;
                    Sketch piece[3];
                    sketch_reduce(rec + sketch_rec_recv(p, s), rec + sketch_rec_in(p, kr), rec + sketch_rec_out(p, s),
                                  piece, g, r0 + off, wire + off, mine + off, mine + off, m);
                    sketch_piece_note(rec + sketch_rec_frame(p, s), piece, r0 + off, m);
                }
            }
        }
    }
    // a member's reduced chunk changed where it waits between its last sum
    // (sketched) and the all-gather's first send (sketched again)
    if (f.kind == REDUCED_EXP || f.kind == REDUCED_LOW) {
        size_t r0 = n * (size_t)f.member / p, len = n * (size_t)(f.member + 1) / p - r0;
        float *mine = x + (size_t)f.member * n + r0;
        flip(mine + largest(mine, len), f.kind == REDUCED_EXP ? 30 : 0);
    }
    for (int s = 0; s < p - 1; s++) {  // all-gather
        for (int me = 0; me < p; me++) {
            int prev = (me + p - 1) % p, kr = ((me - s - 1) % p + p) % p;
            size_t r0 = n * (size_t)kr / p, r1 = n * (size_t)(kr + 1) / p, len = r1 - r0;
            float *sent = x + (size_t)prev * n + r0, *mine = x + (size_t)me * n + r0;
            if (s == 0)  // shm_comm.h's: the sum it sends on stands for what it sends
                recs[(size_t)prev * count + sketch_rec_own(p)] = recs[(size_t)prev * count + sketch_rec_out(p, p - 2)];
            memcpy(mine, sent, len * sizeof(float));
            if (f.kind == GATHER_EXP && f.member == prev && f.hop == s) flip(mine + largest(mine, len), 30);
            sketch_frames(recs + (size_t)me * count + sketch_rec_got(p, s), g, r0, mine, len, 0);
        }
    }
    free(wire);
}

// data that rounds badly: wide exponents, members that nearly cancel, zeros,
// tiny and huge values, by kind
static void fill(float *x, int p, size_t n, int kind) {
    for (size_t j = 0; j < n; j++) {
        float base = rng_unit();
        for (int q = 0; q < p; q++) {
            float v = rng_unit();
            if (kind == 1) v = ldexpf(v, (int)(rng_next() % 60) - 30);
            if (kind == 2) v = (q % 2 ? -base : base) * (1.0f + ldexpf(v, -18));  // near cancellation
            if (kind == 3) v = j % 5 == 0 ? 0.0f : j % 5 == 1 ? ldexpf(v, -140) : j % 5 == 2 ? ldexpf(v, 100) : v;
            if (kind == 4) v *= 4.0f;  // O(1) values, half of them 2 or more (a model's activations)
            x[(size_t)q * n + j] = v;
        }
    }
}

static int judge(int p, size_t n, const int *ranks, const Sketch *recs, char *msg, size_t len) {
    SketchCase c;
    c.kind = SK_ALLREDUCE;
    c.p = p;
    c.ranks = ranks;
    c.n = n;
    c.recs = recs;
    msg[0] = '\0';
    return sketch_judge(&c, msg, len);
}

static void test_ring_verdicts(void) {
    uint8_t key[32] = {9, 8, 7};
    static SketchGen g;
    sketch_gen_init(&g, key, "/llm3d-2-a");
    int ranks[8] = {0, 2, 4, 6, 8, 10, 12, 14};
    char msg[800];
    // honest rings: no false alarm, on data made to round badly
    int runs = 0, alarms = 0;
    double worst = 0.0, worst_frame = 0.0;
    for (int p = 2; p <= 5; p++) {
        size_t sizes[] = {1, 3, 1000, 2 * FRAME_FLOATS + 7};
        for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
            size_t n = sizes[si] * (size_t)p + (size_t)si;
            float *x = (float *)malloc((size_t)p * n * sizeof(float));
            Sketch *recs = (Sketch *)malloc((size_t)p * sketch_rec_count(p) * sizeof(Sketch));
            for (int kind = 0; kind < 4; kind++) {
                for (int rep = 0; rep < (n > 10000 ? 2 : 12); rep++) {
                    fill(x, p, n, kind);
                    sketch_draw(&g, rep, (uint64_t)p, (uint64_t)kind, SK_ALLREDUCE, n);
                    Injected none = {NO_FAULT, 0, 0};
                    play_allreduce(&g, p, n, x, recs, none);
                    runs++;
                    if (judge(p, n, ranks, recs, msg, sizeof(msg))) {
                        if (alarms++ == 0) printf("      first false alarm (p %d, n %zu, kind %d): %s\n", p, n, kind, msg);
                    }
                    // how close the hops came to their bounds
                    size_t count = sketch_rec_count(p);
                    for (int k = 0; k < p; k++) {
                        size_t lo = n * (size_t)k / p, hi = n * (size_t)(k + 1) / p;
                        double sum_a = recs[(size_t)((k + 1) % p) * count + sketch_rec_in(p, k)].a[0];
                        for (int t = 1; t < p; t++) {
                            int q = (k + 1 + t) % p;
                            const Sketch *rq = recs + (size_t)q * count;
                            sum_a += rq[sketch_rec_in(p, k)].a[0];
                            double diff = rq[sketch_rec_out(p, t - 1)].s[0] - rq[sketch_rec_recv(p, t - 1)].s[0] -
                                          rq[sketch_rec_in(p, k)].s[0];
                            double bound = sketch_hop_bound(sum_a, t, hi - lo);
                            if (bound > 0 && isfinite(diff)) worst = fmax(worst, fabs(diff) / bound);
                            worst_frame = fmax(worst_frame, rq[sketch_rec_frame(p, t - 1)].s[0]);
                        }
                    }
                }
            }
            free(x);
            free(recs);
        }
    }
    check(alarms == 0 && worst <= 1.0 && worst_frame <= 1.0, "%d honest all-reduces (2 to 5 members, wide exponents, "
          "near cancellation, zeros, denormals, 1e30s): %d false alarms; the largest hop error was %.4f of its bound, "
          "the largest frame's %.4f of its own", runs, alarms, worst, worst_frame);

    // each fault, on 3 members of 3 chunks of 2 frames and more
    int p = 3;
    size_t n = 3 * (2 * FRAME_FLOATS + 100);
    float *x = (float *)malloc((size_t)p * n * sizeof(float));
    Sketch *recs = (Sketch *)malloc((size_t)p * sketch_rec_count(p) * sizeof(Sketch));
    struct { Injected f; int caught; const char *want; } cases[] = {
        {{TRANSIT_EXP, 1, 0}, 1, "what rank 2 sent rank 4 at hop 0 differs from rank 2's sketch of it"},
        {{TRANSIT_LOW, 2, 1}, 1, "what rank 4 sent rank 0 at hop 1 differs from rank 4's sketch of it"},
        {{SUM_EXP, 1, 1}, 1, "the sum rank 2 made at hop 1 (what rank 0 sent plus rank 2's own piece) is off by"},
        {{SUM_LOW, 1, 1}, 0, NULL},  // one ulp of a sum: below the rounding bound, not caught
        {{GATHER_EXP, 0, 1}, 1, "rank 4's piece as rank 2 received it from rank 0 at hop 1 differs from rank 4's sketch"},
        {{REDUCED_EXP, 1, 0}, 1, "chunk 1 (elements 32868..65735) in the all-gather: rank 2's reduced chunk as rank 4 "
                                 "received it differs from the last sum rank 2 made"},
        {{REDUCED_LOW, 2, 0}, 1, "chunk 2 (elements 65736..98603) in the all-gather: rank 4's reduced chunk as rank 0 "
                                 "received it differs from the last sum rank 4 made"},
    };
    const char *names[] = {"", "an exponent bit flipped in transit", "the lowest mantissa bit flipped in transit",
                           "an exponent bit flipped in a member's sum before its sketch",
                           "the lowest mantissa bit flipped in a member's sum before its sketch",
                           "an exponent bit flipped in an all-gather's piece",
                           "an exponent bit flipped in a member's reduced chunk before the all-gather",
                           "the lowest mantissa bit flipped in a member's reduced chunk before the all-gather"};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        fill(x, p, n, 0);
        sketch_draw(&g, 7, 1, k, SK_ALLREDUCE, n);
        play_allreduce(&g, p, n, x, recs, cases[k].f);
        int bad = judge(p, n, ranks, recs, msg, sizeof(msg));
        if (cases[k].caught)
            check(bad && strstr(msg, cases[k].want) != NULL, "%s: caught and named: %s", names[cases[k].f.kind], msg);
        else
            check(!bad, "%s: within the rounding bound, so not caught (%s)", names[cases[k].f.kind],
                  bad ? msg : "no failure");
    }
    // a sum off by more than its frame's bound but less than its chunk's: a
    // chunk of 64 frames on 2 members, its largest element moved by 16 times
    // the largest frame bound (so by 4 at least, |r| >= 1/4, in its frame,
    // and 1/4 of the chunk's bound at most): the frames catch it, naming the
    // frame; the chunk's check alone (the records' frame entries cleared) does not
    {
        int p2 = 2;
        size_t n2 = (size_t)p2 * 64 * FRAME_FLOATS, half = n2 / 2;
        float *x2 = (float *)malloc((size_t)p2 * n2 * sizeof(float));
        Sketch *recs2 = (Sketch *)malloc((size_t)p2 * sketch_rec_count(p2) * sizeof(Sketch));
        fill(x2, p2, n2, 0);
        sketch_draw(&g, 12, 2, 1, SK_ALLREDUCE, n2);
        // member 1 adds member 0's chunk 1 to its own at hop 0: each frame's
        // bound, u (A(P) + A(x)) as doc/security.md derives it, computed here
        // and not by sketch_hop_bound, so a bound made looser fails this
        double fb = 0.0;
        for (size_t off = half; off < n2; off += FRAME_FLOATS) {
            Sketch v = {{0, 0}, {0, 0}, 0}, a = v;
            sketch_add(&v, &g, off, x2 + off, FRAME_FLOATS, 1);
            sketch_add(&a, &g, off, x2 + n2 + off, FRAME_FLOATS, 1);
            for (int j = 0; j < 2; j++) fb = fmax(fb, ldexp(v.a[j] + a.a[j], -24));
        }
        sum_by = (float)(16.0 * fb);
        Injected by = {SUM_BY, 1, 0};
        play_allreduce(&g, p2, n2, x2, recs2, by);
        int frame_bad = judge(p2, n2, ranks, recs2, msg, sizeof(msg));
        const Sketch *in0 = recs2 + sketch_rec_in(p2, 1), *in1 = recs2 + sketch_rec_count(p2) + sketch_rec_in(p2, 1);
        double cb = sketch_hop_bound(in0->a[0] + in1->a[0], 1, half);
        check(frame_bad && strstr(msg, "the sum rank 2 made at hop 0 (what rank 0 sent plus rank 2's own piece) is off "
              "by") != NULL && strstr(msg, "in its frame of elements") != NULL, "a sum's element moved by %.3g (its "
              "frame's bound %.3g, its chunk's %.3g): caught and named frame by frame: %s", sum_by, fb, cb, msg);
        for (int q = 0; q < p2; q++)
            memset(recs2 + (size_t)q * sketch_rec_count(p2) + sketch_rec_frame(p2, 0), 0, sizeof(Sketch));
        int chunk_bad = judge(p2, n2, ranks, recs2, msg, sizeof(msg));
        check(!chunk_bad, "the same change is within its chunk's bound: the chunk's check alone passes it (%s)",
              chunk_bad ? msg : "no failure");
        free(x2);
        free(recs2);
    }
    // the chunk's bound pinned the same way: a sum's element moved so that its
    // sketch 0 moves by 1.5 u (A(P) + A(x)) of its chunk, A from the inputs'
    // sketches (the bound is u A and a little; the honest rounding of a chunk
    // of random signs far less), caught by the chunk's check alone (the frame
    // entries cleared), so a bound twice as loose fails; and a member's sum made not
    // finite from small finite inputs, caught by the chunk's check alone and
    // by the frame's alone (the overflow rule is for inputs near FLT_MAX)
    {
        int p2 = 2;
        size_t n2 = (size_t)p2 * 4 * FRAME_FLOATS, half = n2 / 2;
        float *x2 = (float *)malloc((size_t)p2 * n2 * sizeof(float));
        Sketch *recs2 = (Sketch *)malloc((size_t)p2 * sketch_rec_count(p2) * sizeof(Sketch));
        const char *what[] = {"moved by 1.5 u of its chunk's |r|.|x| sum, in sketch 0", "made +inf", "made NaN"};
        int kinds[] = {SUM_SKETCH_BY, SUM_TO_INF, SUM_TO_NAN};
        for (int c = 0; c < 3; c++) {
            fill(x2, p2, n2, 0);
            sketch_draw(&g, 13, 2, (uint64_t)c, SK_ALLREDUCE, n2);
            Sketch in0 = {{0, 0}, {0, 0}, 0}, in1 = in0;
            sketch_frames(&in0, &g, half, x2 + half, half, 1);
            sketch_frames(&in1, &g, half, x2 + n2 + half, half, 1);
            sum_by = (float)ldexp(1.5 * (in0.a[0] + in1.a[0]), -24);
            Injected f = {kinds[c], 1, 0};
            play_allreduce(&g, p2, n2, x2, recs2, f);
            Sketch frames[2];
            for (int q = 0; q < p2; q++) {
                Sketch *fr = recs2 + (size_t)q * sketch_rec_count(p2) + sketch_rec_frame(p2, 0);
                frames[q] = *fr;
                memset(fr, 0, sizeof(Sketch));
            }
            int chunk_bad = judge(p2, n2, ranks, recs2, msg, sizeof(msg));
            check(chunk_bad && strstr(msg, "the sum rank 2 made at hop 0 (what rank 0 sent plus rank 2's own piece) is "
                  "off by") != NULL && strstr(msg, "in its frame") == NULL, "a sum's element %s: caught by the "
                  "chunk's check alone: %s", what[c], msg);
            if (c == 0) continue;
            // the frames alone: the records' frame entries back, the chunk's
            // sums made to agree (the sum's sketches set to what they should be)
            for (int q = 0; q < p2; q++) {
                size_t count = sketch_rec_count(p2);
                *(recs2 + (size_t)q * count + sketch_rec_frame(p2, 0)) = frames[q];
                Sketch *out = recs2 + (size_t)q * count + sketch_rec_out(p2, 0);
                const Sketch *rv = recs2 + (size_t)q * count + sketch_rec_recv(p2, 0);
                const Sketch *in = recs2 + (size_t)q * count + sketch_rec_in(p2, q);  // the chunk it adds at hop 0
                for (int j = 0; j < 2; j++) out->s[j] = rv->s[j] + in->s[j];
            }
            int frame_bad = judge(p2, n2, ranks, recs2, msg, sizeof(msg));
            check(frame_bad && strstr(msg, "in its frame of elements") != NULL, "a sum's element %s: caught by its "
                  "frame's check alone: %s", what[c], msg);
        }
        free(x2);
        free(recs2);
    }
    // one ulp in transit where the sketches are large (every element the
    // sign of its r_j, so they add up): the line still shows two numbers
    // that differ, or a reader would see the same value twice
    sketch_draw(&g, 7, 1, 99, SK_ALLREDUCE, n);
    for (int q = 0; q < p; q++)
        for (size_t j = 0; j < n; j++)
            x[(size_t)q * n + j] = g.a[2 * (j / SKETCH_BLOCK)] * g.b[0][j % SKETCH_BLOCK] < 0 ? -1.0f : 1.0f;
    Injected low = {TRANSIT_LOW, 0, 0};
    play_allreduce(&g, p, n, x, recs, low);
    char was[64] = "", got[64] = "";
    int low_bad = judge(p, n, ranks, recs, msg, sizeof(msg));
    const char *at = strstr(msg, "sketch of it (");
    if (at != NULL) sscanf(at, "sketch of it (%63[^,], received as %63[^)])", was, got);
    check(low_bad && was[0] != '\0' && strcmp(was, got) != 0, "one ulp in transit on a sketch of %s: the line shows "
          "it (%s against %s)", was, was, got);
    // an input that is not finite: the sums are not either, and the
    // trainer's not-finite rule acts on them, not a failed check
    fill(x, p, n, 0);
    x[n + 5] = NAN;
    sketch_draw(&g, 8, 1, 1, SK_ALLREDUCE, n);
    Injected none = {NO_FAULT, 0, 0};
    play_allreduce(&g, p, n, x, recs, none);
    int nan_bad = judge(p, n, ranks, recs, msg, sizeof(msg));
    check(!nan_bad, "a NaN in a member's input is not a failed check (%s)", nan_bad ? msg : "no failure");
    // NaNs by their bits: data that is not finite at both ends of a hop is
    // not a change in transit (its NaNs' payloads, which of two NaNs a sum
    // keeps, may differ), while finite data that arrives not finite, or the
    // reverse, is. Member 1 sends its input's chunk 0 at hop 0.
    struct { int kind, caught; const char *what; } nans[] = {
        {TRANSIT_NAN_BITS, 0, "a NaN that arrives as another NaN (its payload changed)"},
        {TRANSIT_FROM_NAN, 1, "a NaN that arrives as 1.0"},
        {TRANSIT_TO_NAN, 1, "a finite element that arrives as a NaN"},
    };
    for (size_t k = 0; k < sizeof(nans) / sizeof(nans[0]); k++) {
        fill(x, p, n, 0);
        if (nans[k].kind != TRANSIT_TO_NAN) x[n + 5] = nan_with(1);
        sketch_draw(&g, 10, 1, k, SK_ALLREDUCE, n);
        Injected f = {nans[k].kind, 1, 0};
        play_allreduce(&g, p, n, x, recs, f);
        int bad = judge(p, n, ranks, recs, msg, sizeof(msg));
        if (nans[k].caught)
            check(bad && strstr(msg, "what rank 2 sent rank 4 at hop 0 differs from rank 2's sketch of it") != NULL,
                  "%s: caught as a change in transit: %s", nans[k].what, msg);
        else
            check(!bad, "%s: not a failed check, the data being not finite at both ends (%s)", nans[k].what,
                  bad ? msg : "no failure");
    }
    // NaNs of other payloads and infinities of both signs in every member's
    // input, several to a lane: an honest ring passes
    fill(x, p, n, 0);
    for (int q = 0; q < p; q++)
        for (int j = 0; j < 6; j++) {
            size_t at = (size_t)q * n + (size_t)j * 8 + (size_t)q * (n / p);
            x[at] = j % 3 == 2 ? (j % 2 ? INFINITY : -INFINITY) : nan_with((uint32_t)(q * 64 + j + 1));
        }
    sketch_draw(&g, 11, 1, 1, SK_ALLREDUCE, n);
    play_allreduce(&g, p, n, x, recs, none);
    int nans_bad = judge(p, n, ranks, recs, msg, sizeof(msg));
    check(!nans_bad, "NaNs of %d payloads and infinities in every member's input: not a failed check (%s)", 4 * p,
          nans_bad ? msg : "no failure");
    // an overflow of finite inputs (3e38 + 3e38) is not one either
    fill(x, p, n, 0);
    x[7] = x[n + 7] = x[2 * n + 7] = 3e38f;
    sketch_draw(&g, 9, 1, 1, SK_ALLREDUCE, n);
    play_allreduce(&g, p, n, x, recs, none);
    int inf_bad = judge(p, n, ranks, recs, msg, sizeof(msg));
    check(!inf_bad && isinf(x[7]), "a sum of finite inputs that overflows to infinity is not a failed check (%s)",
          inf_bad ? msg : "no failure");
    // changes that are not one element: two elements moved against each
    // other by the same amount, 200 draws of r: both sketches see every one
    int missed = 0;
    for (int rep = 0; rep < 200; rep++) {
        fill(x, p, n, 0);
        sketch_draw(&g, 100 + rep, 1, 1, SK_ALLREDUCE, n);
        Sketch s0 = {{0, 0}, {0, 0}, 0}, s1 = s0;
        sketch_frames(&s0, &g, 0, x, n / 3, 0);
        x[10] += 0.5f;
        x[11 + rep] -= 0.5f;
        sketch_frames(&s1, &g, 0, x, n / 3, 0);
        missed += fabs(s1.s[0] - s0.s[0]) < 1e-3 && fabs(s1.s[1] - s0.s[1]) < 1e-3;
    }
    check(missed == 0, "+0.5 on one element and -0.5 on another (sum unchanged): seen by the sketches in %d of 200 "
          "draws of r", 200 - missed);
    free(x);
    free(recs);
    sketch_gen_free(&g);
}

// each checked collective's draw of r is its own: the host backend numbers
// a rank's collectives on each group (comm_group_call), and that number goes
// into the nonce with the step, so two collectives of one step on one group
// never share r (an observer who saw one sketch learns nothing of the next)
static void test_group_calls(void) {
    static Group a, b;
    a.size = 2, a.ranks[0] = 0, a.ranks[1] = 2;
    b.size = 2, b.ranks[0] = 1, b.ranks[1] = 3;
    Comm *c = (Comm *)calloc(1, sizeof(Comm));
    uint64_t id_a, id_b, id_again;
    int got[5];
    got[0] = (int)comm_group_call(c, &a, &id_a);
    got[1] = (int)comm_group_call(c, &a, &id_again);
    got[2] = (int)comm_group_call(c, &b, &id_b);
    got[3] = (int)comm_group_call(c, &a, &id_again);
    got[4] = (int)comm_group_call(c, &b, &id_b);
    check(got[0] == 0 && got[1] == 1 && got[2] == 0 && got[3] == 2 && got[4] == 1 && id_a == id_again && id_a != id_b,
          "a rank's collectives numbered per group: a, a, b, a, b are calls %d %d %d %d %d (want 0 1 0 2 1), the "
          "groups' ids %s", got[0], got[1], got[2], got[3], got[4], id_a != id_b ? "differ" : "the same");
    // and what the numbers are for: calls 0 and 1 of one group in one step draw different r
    static SketchGen g;
    uint8_t key[32] = {4};
    sketch_gen_init(&g, key, "/llm3d-5-a");
    sketch_draw(&g, 3, id_a, 0, SK_ALLREDUCE, 1000);
    double b0 = g.b[0][0], a0 = g.a[0];
    sketch_draw(&g, 3, id_a, 1, SK_ALLREDUCE, 1000);
    check(g.b[0][0] != b0 || g.a[0] != a0, "calls 0 and 1 on one group in one step draw different coefficients");
    sketch_gen_free(&g);
    free(c);
}

// the bound of a whole p-term sum (sketch_sum_bound), for fp32 and for bf16
// rounded at every hop as NCCL's ring does, against sums played here
static void test_sum_bounds(void) {
    uint8_t key[32] = {1};
    static SketchGen g;
    sketch_gen_init(&g, key, "/llm3d-3-a");
    size_t n = 5000;
    double worst[2] = {0, 0};
    int over[2] = {0, 0}, runs = 0, loose = 0;
    double loosest = 0.0;
    float *x = (float *)malloc(8 * n * sizeof(float)), *y = (float *)malloc(n * sizeof(float));
    for (int p = 2; p <= 8; p++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int rep = 0; rep < 6; rep++, runs++) {
                fill(x, p, n, kind);
                sketch_draw(&g, rep, (uint64_t)p, (uint64_t)kind, SK_ALLREDUCE, n);
                for (int bf = 0; bf < 2; bf++) {
                    if (bf) for (size_t j = 0; j < (size_t)p * n; j++) x[j] = bf16_to_float(float_to_bf16(x[j]));
                    double sum_s = 0.0, sum_a = 0.0;
                    for (int q = 0; q < p; q++) {
                        Sketch s = {{0, 0}, {0, 0}, 0};
                        sketch_add(&s, &g, 0, x + (size_t)q * n, n, 1);
                        sum_s += s.s[0];
                        sum_a += s.a[0];
                    }
                    for (size_t j = 0; j < n; j++) {
                        float acc = x[j];
                        for (int q = 1; q < p; q++) {
                            acc = acc + x[(size_t)q * n + j];
                            if (bf) acc = bf16_to_float(float_to_bf16(acc));
                        }
                        y[j] = acc;
                    }
                    Sketch sy = {{0, 0}, {0, 0}, 0};
                    sketch_add(&sy, &g, 0, y, n, 0);
                    double bound = sketch_sum_bound(sum_a, p, ldexp(1.0, bf ? -8 : -24), n);
                    double ratio = bound > 0 ? fabs(sy.s[0] - sum_s) / bound : 0.0;
                    worst[bf] = fmax(worst[bf], ratio);
                    over[bf] += ratio > 1.0;
                    // and no looser than gamma(p-1) sum |r||x| (doc/security.md),
                    // computed here, with the code's margin of (1 + gamma) on it: the
                    // sketches' evaluation errors add some 1e-6 of that
                    double uu = ldexp(1.0, bf ? -8 : -24), gamma = (p - 1) * uu / (1.0 - (p - 1) * uu);
                    double looser = bound / (gamma * (1.0 + gamma) * sum_a);
                    loosest = fmax(loosest, looser);
                    loose += !(looser >= 1.0 && looser <= 1.0001);
                }
            }
        }
    }
    check(over[0] == 0 && over[1] == 0, "%d sums of 2 to 8 inputs: the whole sum within gamma(p-1) sum |r||x| in fp32 "
          "(largest %.3f of it) and in bf16 rounded at every hop (largest %.3f of it)", runs, worst[0], worst[1]);
    check(loose == 0, "%d bounds of 2 to 8 inputs, fp32 and bf16: gamma(p-1) (1 + gamma(p-1)) sum |r||x| and no "
          "more than 1e-4 of it over (the loosest %.7f of it)", 2 * runs, loosest);
    free(x);
    free(y);
    sketch_gen_free(&g);
}

// ----------------------------------------------------------------------------
// the gradient-norm rule on made-up norms

static int judge_norms(int world, int tp, int pp, const float *norms, char *lines, size_t len, char *fields,
                       size_t flen) {
    Grid grid;
    char err[256];
    grid_init(&grid, world, tp, pp, 0, err, sizeof(err));
    GradWatch gw;
    grads_init(&gw, &grid);
    LogLine l = {3, 1, 0, 0, 0, -1, -1, 0, 0, NULL, NULL, NULL, NULL};
    int n = grads_judge(&gw, norms, 3, GP_WARN, &l);
    snprintf(lines, len, "%s", gw.lines);
    snprintf(fields, flen, "%s", l.grads != NULL ? l.grads : "");
    grads_free(&gw);
    return n;
}

static void test_grads_rule(void) {
    char lines[2048], fields[1024];
    float poisoned[4] = {2.0f, 2.4f, 210.0f, 1.7f};
    int n = judge_norms(4, 1, 1, poisoned, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "step 3: rank 2's own gradient norm 210 is 105.0x the median 2 of its data-parallel "
                                  "peers' (ranks 0, 1, 3)") != NULL &&
          strcmp(fields, "\"grad_outliers\": [2], \"rank_norms\": [2, 2.4, 210, 1.7]") == 0,
          "a rank at 100x its peers' median is named, in a line and in the log: %s / %s", lines, fields);
    float high[4] = {2.0f, 2.4f, 15.5f, 1.7f};
    n = judge_norms(4, 1, 1, high, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 0 && lines[0] == '\0' && fields[0] == '\0', "7.8x its peers' median is not an outlier (the rule: above "
          "%.0fx)", GRADS_RATIO);
    float two[2] = {3.0f, 300.0f};
    n = judge_norms(2, 1, 1, two, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "rank 1's own gradient norm 300 is 100.0x the median 3 of its data-parallel peers' "
                                  "(rank 0)") != NULL, "two replicas: the one 100x the other is named: %s", lines);
    float nan[3] = {1.0f, NAN, 1.2f};
    n = judge_norms(3, 1, 1, nan, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "rank 1's own gradient norm nan is far above the median 1.1") != NULL &&
          strstr(fields, "null") != NULL,
          "a norm that is not finite among finite peers is named: %s", lines);
    // tp 2 x dp 2: the peers of rank 3 are rank 1 (the same slice), not rank 2;
    // the tp slices may differ from each other by far
    float grid[4] = {1.0f, 50.0f, 1.1f, 4000.0f};
    n = judge_norms(4, 2, 1, grid, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "rank 3's own gradient norm 4000 is 80.0x the median 50 of its data-parallel peers' "
                                  "(rank 1)") != NULL,
          "tp 2 x dp 2: each rank against the same slice of the other replicas: %s", lines);
    // just above the rule: 9x its peers' median is an outlier (the rule is
    // above 8x, where 7.8x above is not one)
    float above[4] = {2.0f, 2.4f, 18.0f, 1.7f};
    n = judge_norms(4, 1, 1, above, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "rank 2's own gradient norm 18 is 9.0x the median 2 of its data-parallel peers' "
                                  "(ranks 0, 1, 3)") != NULL,
          "9x its peers' median is an outlier (the rule: above %.0fx): %s", GRADS_RATIO, lines);
    // pp 2 x dp 3: the peers of rank 5 (stage 1) are ranks 1 and 3, the same
    // stage of the other replicas, not ranks 0 to 2; the last stage (the
    // head) may have norms far above the first's
    float stages[6] = {1.0f, 40.0f, 1.2f, 44.0f, 0.9f, 400.0f};
    n = judge_norms(6, 1, 2, stages, lines, sizeof(lines), fields, sizeof(fields));
    check(n == 1 && strstr(lines, "step 3: rank 5's own gradient norm 400 is 9.5x the median 42 of its data-parallel "
                                  "peers' (ranks 1, 3)") != NULL &&
          strcmp(fields, "\"grad_outliers\": [5], \"rank_norms\": [1, 40, 1.2, 44, 0.9, 400]") == 0,
          "pp 2 x dp 3: each rank against its own stage of the other replicas: %s / %s", lines, fields);
    check(judge_norms(2, 1, 1, NULL, lines, sizeof(lines), fields, sizeof(fields)) == 0 && lines[0] == '\0',
          "dp 1 (no norms gathered): nothing judged");
}

// ----------------------------------------------------------------------------
// the trainer

#define STEPS 4
static char dir[128], shards[160];

typedef struct {
    int status, nsteps;
    char out[65536];
} Run;

static int log_steps(const char *log, const char *field, char *lines, size_t len) {
    int n = 0;
    FILE *f = fopen(log, "r");
    char line[2048];
    if (lines != NULL) lines[0] = '\0';
    while (f != NULL && fgets(line, sizeof(line), f)) {
        if (test_log_value(line, "loss") == NULL) continue;
        n++;
        if (field != NULL && strstr(line, field) != NULL && lines != NULL) {
            size_t at = strlen(lines);
            snprintf(lines + at, len - at, "%s", line);
        }
    }
    if (f != NULL) fclose(f);
    return n;
}

static void run(Run *r, const char *args, int steps) {
    char cmd[1200], log[300];
    snprintf(log, sizeof(log), "%s/log.jsonl", dir);
    unlink(log);
    snprintf(cmd, sizeof(cmd), "timeout 60 ./train_gpt2 -ic 1 -x %d -v 0 -s 0 -th 1 -to 10 -i '%s' -lg %s "
             "-e dev/fixtures/tiny_model.bin -b 2 -t 16 %s", steps, shards, log, args);
    r->status = test_run(cmd, 1, r->out, sizeof(r->out));
    r->nsteps = log_steps(log, NULL, NULL, 0);
}

// -fault corrupt and corrupt-low: one bit flipped in what RANK puts into its
// first collective of step 2, after its sketch, under a valid tag: the check
// ends the job at that collective, before the step's update, naming it
static void test_corrupt(void) {
    static Run r;
    struct { const char *args, *want, *detail; } cases[] = {
        {"-d 64 -np 2 -fault corrupt:0:2", "rank 0: step 2: checked allreduce of gradients of wte over ranks 0, 1 failed",
         "what rank 0 sent rank 1 at hop 0 differs from rank 0's sketch of it"},
        {"-d 64 -np 2 -fault corrupt-low:1:2", "step 2: checked allreduce of gradients of wte over ranks 0, 1 failed",
         "what rank 1 sent rank 0 at hop 0 differs from rank 1's sketch of it"},
        {"-d 64 -np 2 -z 1 -fault corrupt:1:2", "step 2: checked reduce_scatter of gradients of wte over ranks 0, 1 failed",
         "what rank 1 sent rank 0 at hop 0"},
        {"-d 64 -np 2 -z 2 -fault corrupt:0:2", "step 2: checked reduce_scatter of gradients of",
         "what rank 0 sent rank 1 at hop 0"},
        {"-d 64 -np 2 -z 3 -fault corrupt:1:2", "step 2: checked allgather of parameters of wte over ranks 0, 1 failed",
         "rank 1's piece as rank 0 received it from rank 1 at hop 0 differs"},
        {"-d 32 -np 2 -tp 2 -fault corrupt:1:2", "step 2: checked allreduce of tensor-parallel embeddings over ranks 0, 1",
         "what rank 1 sent rank 0 at hop 0"},
        {"-d 32 -np 2 -tp 2 -fault corrupt-low:0:2", "step 2: checked allreduce of tensor-parallel embeddings over ranks 0, 1",
         "what rank 0 sent rank 1 at hop 0"},
        {"-d 96 -np 6 -tp 2 -z 1 -fault corrupt:5:2", "step 2: checked allreduce of tensor-parallel embeddings over ranks 4, 5",
         "what rank 5 sent rank 4 at hop 0"},
        {"-d 128 -np 4 -z 3 -fault corrupt:2:2", "step 2: checked allgather of parameters of wte over ranks 0, 1, 2, 3",
         "rank 2's piece as rank 3 received it from rank 2 at hop 0 differs"},
        // a faulty adder: the tiny model's chunks are a frame or two, so the chunk's bound names it
        {"-d 64 -np 2 -z 1 -fault corrupt-sum:1:2", "step 2: checked reduce_scatter of gradients of wte over ranks 0, 1 failed",
         "the sum rank 1 made at hop 0 (what rank 0 sent plus rank 1's own piece) is off by"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        run(&r, cases[k].args, STEPS);
        int named = strstr(r.out, cases[k].want) != NULL && strstr(r.out, cases[k].detail) != NULL;
        // step 2 never logged; step 1's line may be missing too where the failing
        // group lacks rank 0, which logs: its members can fail step 2 and end
        // the job while rank 0 still finishes step 1 (seen once on a busy box)
        check(r.status == 1 && named && r.nsteps >= 1 && r.nsteps <= 2 && strstr(r.out, "fault corrupt") != NULL,
              "%s: caught at step 2's collective, before its update (exit %d, %d steps logged): '%s ... %s'",
              cases[k].args, r.status, r.nsteps, cases[k].want, cases[k].detail);
        if (!named) printf("%s\n", r.out);
    }
    // the same flip with the checks off goes through: the step is applied
    run(&r, "-d 64 -np 2 -ic 0 -fault corrupt:0:2", STEPS);
    check(strstr(r.out, "fault corrupt: flipped bit 30") != NULL && strstr(r.out, " failed: chunk") == NULL && r.nsteps >= 3,
          "-ic 0: the same flip is not seen, and step 2 is trained on it (exit %d, %d steps logged)", r.status,
          r.nsteps);
    // no checkpoint from the corrupted step: -n 1 writes one after each step
    char args[400], path[400];
    snprintf(args, sizeof(args), "-d 64 -np 2 -z 3 -n 1 -nk 0 -o %s/ck -fault corrupt:1:2", dir);
    run(&r, args, STEPS);
    snprintf(path, sizeof(path), "%s/ck/ckpt_00000002", dir);
    int before = access(path, F_OK) == 0;
    snprintf(path, sizeof(path), "%s/ck/ckpt_00000003", dir);
    int after = access(path, F_OK) == 0;
    snprintf(path, sizeof(path), "%s/ck/model_%08d.bin", dir, STEPS);
    int model = access(path, F_OK) == 0;
    check(r.status == 1 && before && !after && !model, "ZeRO-3 -n 1: the checkpoint after step 1 is there, none after step 2, "
          "no final model (exit %d)", r.status);
}

// -fault poison: RANK's gradients x100 from STEP on, named by the rule
static void test_poison(void) {
    static Run r;
    char log[300], lines[8192];
    snprintf(log, sizeof(log), "%s/log.jsonl", dir);
    run(&r, "-d 96 -np 3 -fault poison:2:2", 5);
    int named = strstr(r.out, "step 2: rank 2's own gradient norm") && strstr(r.out, "step 4: rank 2's own gradient norm");
    int others = strstr(r.out, "rank 0's own gradient norm") || strstr(r.out, "rank 1's own gradient norm") ||
                 strstr(r.out, "step 1: rank 2");
    int logged = log_steps(log, "\"grad_outliers\": [2], \"rank_norms\": [", lines, sizeof(lines));
    check(r.status == 0 && named && !others && logged == 5 && strstr(lines, "{\"step\": 2,") != NULL &&
          strstr(lines, "{\"step\": 1,") == NULL && strstr(lines, "skipped") == NULL,
          "-np 3 -fault poison:2:2 (-gp warn): rank 2 named at steps 2..4, nobody else, the log's \"grad_outliers\": "
          "[2]; the updates applied (exit %d)", r.status);
    if (!named || others) printf("%s\n", r.out);
    run(&r, "-d 96 -np 3 -gp skip -fault poison:2:2", 5);
    log_steps(log, "\"skipped\": \"outlying gradients\"", lines, sizeof(lines));
    check(r.status == 0 && r.nsteps == 5 && strstr(lines, "{\"step\": 2,") && strstr(lines, "{\"step\": 4,") &&
          !strstr(lines, "{\"step\": 1,") && strstr(r.out, "the step's update is skipped (-gp skip)"),
          "-gp skip: steps 2..4 not applied, \"skipped\": \"outlying gradients\" in the log, the run goes on (exit %d)",
          r.status);
    // the checks off: the norms come from the frames as they pass, not the sketches
    run(&r, "-d 96 -np 3 -z 2 -ic 0 -fault poison:2:2", 4);
    check(r.status == 0 && strstr(r.out, "step 2: rank 2's own gradient norm") && strstr(r.out, "step 3: rank 2's own") &&
          !strstr(r.out, "step 1: rank 2") && !strstr(r.out, "rank 0's own") && !strstr(r.out, "rank 1's own"),
          "-ic 0, ZeRO-2: rank 2 named at steps 2 and 3, nobody else (exit %d)", r.status);
    run(&r, "-d 96 -np 3 -gp stop -fault poison:2:2", 5);
    check(r.status == 1 && r.nsteps == 3 && strstr(r.out, "the job stops before the step's update (-gp stop)"),
          "-gp stop: the job stops at step 2, before its update (exit %d, %d steps logged)", r.status, r.nsteps);
    // a job where the fault could show nothing is refused before launch
    run(&r, "-d 32 -np 2 -tp 2 -fault poison:1:1", 3);
    check(r.status == 2 && strstr(r.out, "-fault poison:1:1: dp is 1 (-np 2, -tp 2, -pp 1)") != NULL &&
          strstr(r.out, "fault poison: this rank's gradients") == NULL,
          "-np 2 -tp 2 -fault poison:1:1 (dp 1, no peers): refused, exit 2 (exit %d)", r.status);
    if (r.status != 2) printf("%s\n", r.out);
    run(&r, "-d 32 -np 1 -fault corrupt:0:1", 3);
    check(r.status == 2 && strstr(r.out, "-fault corrupt:0:1: -np 1 runs no collective") != NULL,
          "-np 1 -fault corrupt:0:1 (no collective): refused, exit 2 (exit %d)", r.status);
    run(&r, "-d 32 -np 1 -fault corrupt-sum:0:1", 3);
    check(r.status == 2 && strstr(r.out, "-fault corrupt-sum:0:1: -np 1 runs no collective") != NULL,
          "-np 1 -fault corrupt-sum:0:1 (no collective): refused, exit 2 (exit %d)", r.status);
    // tp 2 x dp 2: the poisoned rank against the same slice of the other replica
    run(&r, "-d 64 -np 4 -tp 2 -fault poison:3:2", 4);
    check(r.status == 0 && strstr(r.out, "step 2: rank 3's own gradient norm") &&
          strstr(r.out, "data-parallel peers' (rank 1)") && !strstr(r.out, "rank 2's own"),
          "tp 2 x dp 2 -fault poison:3:2: rank 3 named against rank 1 (exit %d)", r.status);
}

// -gp skip|stop, -ck K and -ic 1 where the layout gives them nothing to act
// on: one note each, and the run trains as asked; where they act, no note.
// run() adds -ic 1 to every run.
static void test_idle_notes(void) {
    static Run r;
    const char *gp = "note: flag -gp skip: the gradient-norm rule compares data-parallel replicas";
    const char *gp_stop = "note: flag -gp stop: the gradient-norm rule compares data-parallel replicas";
    const char *ck = "note: flag -ck 1: the consistency check compares data-parallel replicas";
    const char *ic = "note: flag -ic 1: a job of one rank runs no collective";
    run(&r, "-d 32 -np 1 -gp skip -ck 1", 2);
    check(r.status == 0 && r.nsteps == 2 && test_count(r.out, gp) == 1 && test_count(r.out, ck) == 1 &&
          test_count(r.out, ic) == 1, "-np 1 -gp skip -ck 1 -ic 1: one note each that it has nothing to act on, 2 "
          "steps trained (exit %d): %s", r.status, test_line_of(r.out, "note: flag -gp"));
    // tp 2, dp 1: the rule and the check have no replica to compare; the tp collectives are checked
    run(&r, "-d 32 -np 2 -tp 2 -gp stop -ck 1", 2);
    check(r.status == 0 && r.nsteps == 2 && test_count(r.out, gp_stop) == 1 && test_count(r.out, ck) == 1 &&
          test_count(r.out, "note: flag -ic") == 0, "-np 2 -tp 2 (dp 1) -gp stop -ck 1 -ic 1: a note each on -gp and "
          "-ck, none on -ic (exit %d): %s", r.status, test_line_of(r.out, "note: flag -ic"));
    // dp 2: every one of them acts, no note
    run(&r, "-d 64 -np 2 -gp skip -ck 1", 2);
    check(r.status == 0 && r.nsteps == 2 && test_count(r.out, "note: flag -") == 0, "-np 2 (dp 2) -gp skip -ck 1 "
          "-ic 1: no note (exit %d): %s", r.status, test_line_of(r.out, "note: flag -"));
}

// a count from the environment: name's value, or def where it is unset or
// not a number from 0 to 1000
static int env_count(const char *name, int def) {
    const char *v = getenv(name);
    char *end;
    long n = v != NULL ? strtol(v, &end, 10) : -1;
    return v != NULL && *v != '\0' && *end == '\0' && n >= 0 && n <= 1000 ? (int)n : def;
}

// normal runs: no failed check, no outlier, on the layouts of test_layouts,
// twice each, and once more beside a busy loop on every core. The issue's
// campaign of 100 runs and more takes the rounds from the environment:
// LLM3D_IC_QUIET=6 LLM3D_IC_BUSY=3 ./dev/test/test_integrity runs 108
static void test_quiet(void) {
    const char *layouts[] = {
        "-d 64 -np 2", "-d 64 -np 2 -z 1", "-d 64 -np 2 -z 2", "-d 64 -np 2 -z 3", "-d 96 -np 3 -z 1",
        "-d 96 -np 3 -z 3", "-d 128 -np 4 -z 2", "-d 32 -np 2 -tp 2", "-d 32 -np 4 -tp 4", "-d 32 -np 2 -pp 2",
        "-d 128 -np 8 -tp 2 -pp 2 -z 1", "-d 64 -np 4 -pp 2 -z 3 -ps zbh1",
    };
    int n = (int)(sizeof(layouts) / sizeof(layouts[0])), runs = 0, bad = 0;
    int rounds[2] = {env_count("LLM3D_IC_QUIET", 2), env_count("LLM3D_IC_BUSY", 1)};
    static Run r;
    for (int busy = 0; busy < 2; busy++) {
        pid_t spin[2] = {0, 0};
        for (int k = 0; busy && rounds[1] > 0 && k < 2; k++) {
            spin[k] = fork();
            if (spin[k] == 0) {
                alarm(120 + 60 * rounds[1]);  // never outlives a test that dies
                for (volatile unsigned long i = 0;; i++) {}
            }
        }
        for (int rep = 0; rep < rounds[busy]; rep++) {
            for (int k = 0; k < n; k++) {
                run(&r, layouts[k], STEPS);
                runs++;
                int quiet = strstr(r.out, " failed: chunk") == NULL && strstr(r.out, "gradient norm") == NULL;
                if (r.status != 0 || r.nsteps != STEPS || !quiet) {
                    if (bad++ == 0) printf("      %s:\n%s\n", layouts[k], r.out);
                }
            }
        }
        for (int k = 0; busy && rounds[1] > 0 && k < 2; k++) {
            kill(spin[k], SIGKILL);
            waitpid(spin[k], NULL, 0);
        }
    }
    check(runs == (rounds[0] + rounds[1]) * n && bad == 0, "%d normal runs of %d layouts with -ic 1 (the last %d beside "
          "two busy loops): %d with a failed check, an outlier or an error", runs, n, rounds[1] * n, bad);
    // what the checks cost, as rank 0 prints it at the end (dev/bench_ic.sh
    // reads these lines): the checks' own passes, and the reducing receives'
    // sums, sketched in their pass under -ic 1, plain under -ic 0
    double x = -1, y = -1, y0 = -1;
    run(&r, "-d 64 -np 2", STEPS);
    const char *line = strstr(r.out, "checked collectives: ");
    if (line != NULL) sscanf(line, "checked collectives: %lf ms per step on rank 0 in the checks' own passes, records "
                             "and verdicts; %lf ms in its reducing receives' sums, sketched in the same pass", &x, &y);
    run(&r, "-d 64 -np 2 -ic 0", STEPS);
    line = strstr(r.out, "unchecked collectives: ");
    if (line != NULL) sscanf(line, "unchecked collectives: %lf ms per step on rank 0 in its reducing receives' sums", &y0);
    check(x > 0 && y > 0 && y0 > 0 && strstr(r.out, "checked collectives: ") == strstr(r.out, "unchecked collectives: ") + 2,
          "the end of a job: -ic 1 prints the checks' own %.3f ms and the receives' %.3f ms per step on rank 0; -ic 0 "
          "the receives' %.3f ms alone", x, y, y0);
}

// ----------------------------------------------------------------------------
// the NCCL side (nccl_check.h), on the host

// the coefficients as floats (nchk_coef_pack) are sketch.h's, bit for bit,
// and the GPU's order of sums (nchk_sketch_ref) is within sketch_eval_error
// of sketch_add's, for pieces cut anywhere in the blocks
static void test_nccl_coefficients(void) {
    uint8_t key[32] = {4, 4, 4};
    static SketchGen g;
    sketch_gen_init(&g, key, "/llm3d-4-a");
    size_t n = 7 * SKETCH_BLOCK + 301;
    sketch_draw(&g, 3, 77, 5, SK_REDUCE_SCATTER, n);
    float *coef = (float *)malloc(nchk_coef_count(g.blocks) * sizeof(float));
    nchk_coef_pack(&g, coef);
    int exact = nchk_coef_count(g.blocks) == 2 * SKETCH_BLOCK + 2 * g.blocks;
    for (size_t j = 0; j < n; j++) {
        double r0 = g.a[2 * (j / SKETCH_BLOCK)] * g.b[0][j % SKETCH_BLOCK];
        double r1 = g.a[2 * (j / SKETCH_BLOCK) + 1] * g.b[1][j % SKETCH_BLOCK];
        double f0 = (double)coef[2 * SKETCH_BLOCK + 2 * (j / SKETCH_BLOCK)] * (double)coef[j % SKETCH_BLOCK];
        double f1 = (double)coef[2 * SKETCH_BLOCK + 2 * (j / SKETCH_BLOCK) + 1] *
                    (double)coef[SKETCH_BLOCK + j % SKETCH_BLOCK];
        exact = exact && memcmp(&r0, &f0, sizeof(r0)) == 0 && memcmp(&r1, &f1, sizeof(r1)) == 0;
    }
    float *x = (float *)malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++) x[j] = ldexpf(rng_unit(), (int)(rng_next() % 40) - 20);
    size_t cuts[][2] = {{0, n}, {1, 600}, {511, 2}, {700, 3000}, {SKETCH_BLOCK, 3 * SKETCH_BLOCK}, {n - 5, 5}};
    double worst = 0.0;
    int within = 1, same = 1;
    for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
        size_t g0 = cuts[c][0], len = cuts[c][1];
        Sketch ref = nchk_sketch_ref(x + g0, g0, len, coef, 1), host = {{0, 0}, {0, 0}, 0};
        sketch_add(&host, &g, g0, x + g0, len, 1);
        Sketch again = nchk_sketch_ref(x + g0, g0, len, coef, 1);
        same = same && memcmp(&ref, &again, sizeof(ref)) == 0;
        for (int k = 0; k < 2; k++) {
            // sketch_add's a is sum |x| per block times |a| (cheap, an upper bound of sum |r||x|), the
            // kernel's the exact sum |r||x|: each within its error of the exact one, and below the host's
            double exact = 0.0;
            for (size_t j = g0; j < g0 + len; j++)
                exact += fabs(g.a[2 * (j / SKETCH_BLOCK) + k] * g.b[k][j % SKETCH_BLOCK]) * fabs((double)x[j]);
            double e = 2 * sketch_eval_error(len) * host.a[k] + 1e-300;
            double d = fabs(ref.s[k] - host.s[k]) / e;
            worst = fmax(worst, d);
            within = within && d <= 1.0 && fabs(ref.a[k] - exact) <= e && ref.a[k] <= host.a[k] + e;
        }
        within = within && fabs(ref.q - host.q) <= 2 * sketch_eval_error(len) * host.q;
        Sketch q_only = nchk_sketch_ref(x + g0, g0, len, NULL, 1);
        within = within && q_only.s[0] == 0.0 && q_only.a[1] == 0.0 && q_only.q == ref.q;
    }
    check(exact, "the GPU's coefficients: %zu floats, every r_j = a[j/K] b[j%%K] of sketch.h's draw bit for bit",
          nchk_coef_count(g.blocks));
    check(within && same, "the GPU kernel's order of sums (nchk_sketch_ref) against sketch_add on 6 pieces cut "
          "anywhere: within both sketches' evaluation errors (largest %.3f of their sum), the same bits twice, the "
          "squares alone without coefficients", worst);
    free(x);
    free(coef);
    sketch_gen_free(&g);
}

// nchk_sketch_ref's order pinned by sums whose value a different order
// changes: one big value B and four 1s, which B + 1 loses (an ulp of B is 4,
// and a tie goes to the even B), so the result is B + 4 only where the order
// meets the 1s in pairs before B, and B where it adds them to B one by one.
// With every coefficient 1 the sketches are the plain sum (B = 2^54); with
// none, the squares (B = 2^27 squared).
static int order_case(size_t len, size_t g0, size_t big, const size_t ones[4], double want_over_b) {
    float *x = (float *)calloc(len, sizeof(float));
    size_t blocks = (g0 + len) / SKETCH_BLOCK + 1;
    float *coef = (float *)malloc(nchk_coef_count(blocks) * sizeof(float));
    for (size_t i = 0; i < nchk_coef_count(blocks); i++) coef[i] = 1.0f;
    for (int k = 0; k < 4; k++) x[ones[k] - g0] = 1.0f;
    x[big - g0] = 0x1p54f;
    Sketch s = nchk_sketch_ref(x, g0, len, coef, 1);
    x[big - g0] = 0x1p27f;
    Sketch q = nchk_sketch_ref(x, g0, len, NULL, 1);
    double want = 0x1p54 + want_over_b;
    free(x);
    free(coef);
    return s.s[0] == want && s.s[1] == want && s.a[0] == want && s.a[1] == want && q.q == want;
}

static void test_nccl_order(void) {
    size_t K = SKETCH_BLOCK, W = NCHK_THREADS / 32;
    // the lanes' tree (16, 8, 4, 2, 1 apart): lanes 1 + 17 and 9 + 25, then together, then to lane 0; a piece that
    // starts inside a block: lanes go by the vector's index
    size_t g0 = 3 * K + 100, l0 = 3 * K + 128;
    size_t lanes[4] = {l0 + 1, l0 + 17, l0 + 9, l0 + 25};
    // the warps' tree in a block ((0 1) (2 3)) ((4 5) (6 7)): segment w is warp w's
    size_t warps[4] = {4 * K, 5 * K, 6 * K, 7 * K};
    // the blocks' tree (64, 32, ..., 1 apart): blocks 1 + 65 and 33 + 97, then together, then to block 0
    size_t blocks[4] = {1 * W * K, 65 * W * K, 33 * W * K, 97 * W * K};
    // one warp's segments w, w + NCHK_WARPS, ... in turn (one by one: the 1s are lost)
    size_t wraps[4] = {1 * NCHK_WARPS * K, 2 * NCHK_WARPS * K, 3 * NCHK_WARPS * K, 4 * NCHK_WARPS * K};
    int lane_ok = order_case(2 * K, g0, l0, lanes, 4.0), warp_ok = order_case(8 * K, 0, 0, warps, 4.0);
    int block_ok = order_case(98 * W * K, 0, 0, blocks, 4.0), wrap_ok = order_case(4 * NCHK_WARPS * K + 1, 0, 0, wraps, 0.0);
    check(lane_ok && warp_ok && block_ok && wrap_ok, "the GPU kernel's order of sums (nchk_sketch_ref) pinned: 2^54 "
          "and four 1s give 2^54 + 4 through the lanes' tree (%d), the warps' (%d) and the blocks' (%d), and 2^54 "
          "along one warp's segments (%d)", lane_ok, warp_ok, block_ok, wrap_ok);
}

// what a played collective does wrong, if anything
typedef struct {
    int input_member;     // -1, or this member's input gets flip_bit of element input_elem flipped after its sketch
    size_t input_elem;    // NCHK_PICK: the one the fault's kernel picks (nchk_flip_pick)
    int copy_member;      // -1, or this member's output gets flip_bit of element copy_elem flipped before its sketch
    size_t copy_elem;
    int flip_bit;         // of an fp32 value (bf16: the same bit of its top half)
    double ratio;         // not 0: input_elem gets, instead of a flip, the change that moves its chunk's sum, on the
                          // sketch it moves most, by ratio times (p - 1) u of the chunk's |r|.|x| sum (the bound's
                          // main term, computed here from sketch.h's draw, not by nccl_check.h)
    int avg;              // the op averages, as NCCL's does (each input times 1/avg_by rounded, then summed)
    int avg_by;           // what it divides by: p, or a wrong member count
    double got;           // out: the change ratio makes, after rounding to the values' type
} NcclMishap;

#define NCHK_PICK ((size_t)-1)

static float flip_float(float v, int bit, int bf) {
    uint32_t u;
    memcpy(&u, &v, 4);
    u ^= 1u << (bf && bit < 16 ? bit + 16 : bit);
    memcpy(&v, &u, 4);
    return v;
}

// one collective of kind over p members of n (nchk_judge's n) played as NCCL
// plays it (the sums rounded at every hop; bf16: to bf16), the records made
// in the GPU's order (nchk_sketch_ref); nchk_judge's verdict, its line in msg.
// A broadcast's root is the last member (so that no default of 0 passes for it).
static int nccl_play(int kind, int p, size_t n, int bf, int data, NcclMishap *m, char *msg, size_t len) {
    uint8_t key[32] = {5};
    static SketchGen g;
    sketch_gen_init(&g, key, "/llm3d-5-a");
    int bc = kind == SK_BROADCAST, root = bc ? p - 1 : 0;
    size_t in_len = kind == SK_REDUCE_SCATTER ? (size_t)p * n : n;
    size_t out_len = kind == SK_ALLGATHER ? (size_t)p * n : n, total = kind == SK_ALLREDUCE || bc ? n : (size_t)p * n;
    sketch_draw(&g, 1, 2, 3, kind, total);
    float *coef = (float *)malloc(nchk_coef_count(g.blocks) * sizeof(float));
    nchk_coef_pack(&g, coef);
    float *x = (float *)malloc((size_t)p * in_len * sizeof(float)), *y = (float *)calloc((size_t)p * out_len, sizeof(float));
    fill(x, p, in_len, data);
    if (bf) for (size_t j = 0; j < (size_t)p * in_len; j++) x[j] = bf16_to_float(float_to_bf16(x[j]));
    Sketch *recs = (Sketch *)calloc((size_t)p * nchk_rec_count(p), sizeof(Sketch));
    SketchCase sc = {kind, p, NULL, n, NULL};
    for (int q = 0; q < p; q++) {
        Sketch *rec = recs + (size_t)q * nchk_rec_count(p);
        float *xq = x + (size_t)q * in_len;
        if (bc) {
            if (q == root) rec[nchk_rec_in(p, root)] = nchk_sketch_ref(xq, 0, n, coef, 0);
        } else if (kind == SK_ALLGATHER) {
            rec[nchk_rec_in(p, q)] = nchk_sketch_ref(xq, (size_t)q * n, n, coef, 1);
        } else {
            for (int k = 0; k < p; k++) {
                size_t lo, hi;
                sketch_chunk(&sc, k, &lo, &hi);
                rec[nchk_rec_in(p, k)] = nchk_sketch_ref(xq + lo, lo, hi - lo, coef, 1);
            }
        }
    }
    if (m != NULL && m->input_member >= 0) {
        float *xm = x + (size_t)m->input_member * in_len;
        size_t at = m->input_elem;
        if (at == NCHK_PICK) at = nchk_flip_pick(xm, in_len < NCHK_FLIP_SCAN ? in_len : NCHK_FLIP_SCAN, m->flip_bit == 0);
        if (m->ratio == 0.0) {
            xm[at] = flip_float(xm[at], m->flip_bit, bf);
        } else {
            // the element's chunk: an all-reduce's k-th p-th of n, a reduce-scatter's k-th piece of n
            size_t e = at, K = SKETCH_BLOCK, clo, chi;
            if (kind == SK_ALLREDUCE) {
                size_t k = 0;
                while (n * (k + 1) / (size_t)p <= e) k++;
                clo = n * k / (size_t)p, chi = n * (k + 1) / (size_t)p;
            } else {
                clo = e / n * n, chi = clo + n;
            }
            double worst = 0.0, r[2];
            for (int j = 0; j < 2; j++) {
                double A = 0.0;
                for (int q = 0; q < p; q++)
                    for (size_t i = clo; i < chi; i++)
                        A += fabs(g.a[2 * (i / K) + j] * g.b[j][i % K]) * fabs((double)x[(size_t)q * in_len + i]);
                r[j] = g.a[2 * (e / K) + j] * g.b[j][e % K];
                double b = (p - 1) * (bf ? 0x1p-8 : 0x1p-24) * A;
                worst = fmax(worst, fabs(r[j]) / b);
            }
            float was = xm[e], now = was + (float)(m->ratio / worst);
            if (bf) now = bf16_to_float(float_to_bf16(now));
            xm[e] = now;
            m->got = ((double)now - (double)was) * worst;
        }
    }
    // the sums, in a ring's order from the member after the chunk's owner
    for (int q = 0; q < p; q++) {
        float *yq = y + (size_t)q * out_len;
        for (size_t j = 0; j < out_len; j++) {
            if (kind == SK_ALLGATHER || bc) {
                yq[j] = bc ? x[(size_t)root * in_len + j] : x[(j / n) * in_len + j % n];
                continue;
            }
            size_t e = kind == SK_ALLREDUCE ? j : (size_t)q * n + j;  // the element of the vector
            int owner = q;  // the chunk's (an all-reduce's: the one e lies in)
            if (kind == SK_ALLREDUCE)
                for (owner = 0; n * (size_t)(owner + 1) / (size_t)p <= e; owner++) {}
            // an average: NCCL's multiplies each input by 1/p in the values' type first
            float scale = m != NULL && m->avg ? 1.0f / (float)m->avg_by : 1.0f;
            if (bf) scale = bf16_to_float(float_to_bf16(scale));
            float acc = 0.0f;
            for (int t = 1; t <= p; t++) {
                float v = x[(size_t)((owner + t) % p) * in_len + e];
                if (scale != 1.0f) {
                    v *= scale;
                    if (bf) v = bf16_to_float(float_to_bf16(v));
                }
                acc = t == 1 ? v : acc + v;
                if (bf) acc = bf16_to_float(float_to_bf16(acc));
            }
            yq[j] = acc;
        }
    }
    if (m != NULL && m->copy_member >= 0)
        y[(size_t)m->copy_member * out_len + m->copy_elem] =
            flip_float(y[(size_t)m->copy_member * out_len + m->copy_elem], m->flip_bit, bf);
    for (int q = 0; q < p; q++) {
        Sketch *rec = recs + (size_t)q * nchk_rec_count(p);
        float *yq = y + (size_t)q * out_len;
        if (kind == SK_REDUCE_SCATTER) {
            rec[nchk_rec_out(p, q)] = nchk_sketch_ref(yq, (size_t)q * n, n, coef, 0);
        } else if (bc) {
            rec[nchk_rec_out(p, root)] = nchk_sketch_ref(yq, 0, n, coef, 0);
        } else {
            for (int k = 0; k < p; k++) {
                size_t lo, hi;
                sketch_chunk(&sc, k, &lo, &hi);
                rec[nchk_rec_out(p, k)] = nchk_sketch_ref(yq + lo, lo, hi - lo, coef, 0);
            }
        }
    }
    int ranks[8];
    for (int q = 0; q < p; q++) ranks[q] = 10 + q;
    NchkCase c = {kind, p, ranks, n, nchk_unit_roundoff(bf), m != NULL && m->avg, recs, root};
    msg[0] = '\0';
    int bad = nchk_judge(&c, msg, len);
    free(recs);
    free(x);
    free(y);
    free(coef);
    sketch_gen_free(&g);
    return bad;
}

static void test_nccl_verdicts(void) {
    static const char *kinds[] = {"all-reduce", "reduce-scatter", "all-gather", "broadcast"};
    char msg[800];
    int runs = 0, false_alarms = 0;
    for (int kind = 0; kind < 4; kind++)
        for (int p = 2; p <= 8; p *= 2)
            for (int bf = 0; bf < 2; bf++)
                for (int data = 0; data < 4; data++, runs++)
                    if (nccl_play(kind, p, 1500 + 37 * (size_t)p, bf, data, NULL, msg, sizeof(msg)))
                        false_alarms++, printf("      %s p %d bf16 %d data %d: %s\n", kinds[kind], p, bf, data, msg);
    check(false_alarms == 0, "%d honest NCCL collectives (all-reduce, reduce-scatter, all-gather, broadcast; 2, 4, 8 "
          "members; fp32 and bf16 rounded at every hop; data that rounds badly): %d failed a check", runs, false_alarms);

    // an exponent bit of an input flipped after its sketch: every rank's sum is off, whoever flipped it
    NcclMishap flip = {.input_member = 1, .input_elem = 900, .copy_member = -1, .flip_bit = 30};
    for (int bf = 0; bf < 2; bf++) {
        int bad = nccl_play(SK_ALLREDUCE, 4, 3000, bf, 0, &flip, msg, sizeof(msg));
        check(bad && strstr(msg, "chunk 1 (elements 750..1499): the sum is off by") != NULL &&
                  strstr(msg, "on every rank") != NULL,
              "all-reduce (%s), rank 11's input flipped after its sketch: caught: %s", bf ? "bf16" : "fp32", msg);
    }
    // -fault corrupt's own choice on O(1) values, half of them 2 or more: bit 30 of a value >= 2 would take it
    // to about 0, a change below a bf16 chunk's bound; the value it picks is below 1 and scales by 2^128
    int caught = 0, plays = 0;
    for (int bf = 0; bf < 2; bf++)
        for (size_t n = 3000; n <= 3000000; n *= 10, plays++) {
            NcclMishap pick = {.input_member = 1, .input_elem = NCHK_PICK, .copy_member = -1, .flip_bit = 30};
            caught += nccl_play(SK_ALLREDUCE, 4, n, bf, 4, &pick, msg, sizeof(msg)) && strstr(msg, "on every rank");
        }
    float big[] = {3.0f, -2.5f, 0.75f, -0.9f, 1.5f, 0.0f}, high[] = {2.0f, 4.0f, -8.0f, 1.25f};
    float only_big[] = {2.0f, -8.0f, 4.0f}, tiny[] = {0.0f, 1e-40f, 0.0f};
    int picks = nchk_flip_pick(big, 6, 0) == 3 && nchk_flip_pick(big, 6, 1) == 0 && nchk_flip_pick(high, 4, 0) == 3 &&
                nchk_flip_pick(only_big, 3, 0) == 1 && nchk_flip_pick(tiny, 3, 0) == 1;
    check(caught == plays && picks, "-fault corrupt's bit 30 on data of 2 or more (all-reduce of 4, fp32 and bf16, "
          "3000 to 3e6 elements): %d of %d caught; it picks the largest value below 1 (corrupt-low: the largest)",
          caught, plays);
    // one member's copy of a sum changed: that member named
    NcclMishap copy = {.input_member = -1, .copy_member = 2, .copy_elem = 100, .flip_bit = 30};
    int bad = nccl_play(SK_ALLREDUCE, 4, 3000, 1, 0, &copy, msg, sizeof(msg));
    check(bad && strstr(msg, "chunk 0 (elements 0..749): rank 12's copy of the sum is off by") != NULL &&
              strstr(msg, "changed on its way to rank 12") != NULL,
          "all-reduce (bf16), rank 12's copy of chunk 0 changed: named: %s", msg);
    // reduce-scatter: the shard the flipped piece lands in is named
    NcclMishap rs = {.input_member = 0, .input_elem = 1500 + 17, .copy_member = -1, .flip_bit = 30};
    bad = nccl_play(SK_REDUCE_SCATTER, 3, 1500, 0, 0, &rs, msg, sizeof(msg));
    check(bad && strstr(msg, "piece 1 (elements 1500..2999), rank 11's shard: the sum it got is off by") != NULL,
          "reduce-scatter (fp32), rank 10's piece 1 flipped after its sketch: caught in rank 11's shard: %s", msg);
    // all-gather: an owner's piece changed after its sketch, and a copy changed on its way
    NcclMishap owner = {.input_member = 2, .input_elem = 40, .copy_member = -1, .flip_bit = 30};
    bad = nccl_play(SK_ALLGATHER, 4, 700, 1, 0, &owner, msg, sizeof(msg));
    check(bad && strstr(msg, "piece 2 (elements 1400..2099): every rank's copy of rank 12's piece") != NULL &&
              strstr(msg, "changed in rank 12's memory") != NULL,
          "all-gather (bf16), rank 12's piece changed after its sketch: rank 12 named: %s", msg);
    NcclMishap way = {.input_member = -1, .copy_member = 3, .copy_elem = 700 + 5, .flip_bit = 0};
    bad = nccl_play(SK_ALLGATHER, 4, 700, 0, 0, &way, msg, sizeof(msg));
    check(bad && strstr(msg, "piece 1 (elements 700..1399): rank 11's piece as rank 13 holds it differs") != NULL,
          "all-gather (fp32), one low mantissa bit of rank 11's piece changed on its way to rank 13: exact, so "
          "named: %s", msg);
    // broadcast (tp rank 0's replicated gradients): the root's buffer changed after its sketch, and one member's
    // copy changed on its way (its lowest mantissa bit: exact, so caught)
    NcclMishap root_flip = {.input_member = 3, .input_elem = 222, .copy_member = -1, .flip_bit = 30};
    bad = nccl_play(SK_BROADCAST, 4, 1300, 1, 0, &root_flip, msg, sizeof(msg));
    check(bad && strstr(msg, "elements 0..1299: every rank's copy of rank 13's broadcast, rank 13's own too") != NULL &&
              strstr(msg, "changed in rank 13's memory") != NULL,
          "broadcast (bf16, root rank 13), the root's buffer changed after its sketch: rank 13 named: %s", msg);
    NcclMishap bc_way = {.input_member = -1, .copy_member = 1, .copy_elem = 1299, .flip_bit = 0};
    bad = nccl_play(SK_BROADCAST, 4, 1300, 0, 0, &bc_way, msg, sizeof(msg));
    check(bad && strstr(msg, "elements 0..1299: rank 13's broadcast as rank 11 holds it differs") != NULL &&
              strstr(msg, "on its way to rank 11") != NULL,
          "broadcast (fp32, root rank 13), one low mantissa bit of rank 11's copy changed: named: %s", msg);
    // the lowest mantissa bit of an input, inside a sum: below the fp32 bound, as doc/security.md says
    NcclMishap low = {.input_member = 1, .input_elem = 900, .copy_member = -1, .flip_bit = 0};
    bad = nccl_play(SK_ALLREDUCE, 4, 3000, 0, 0, &low, msg, sizeof(msg));
    check(!bad, "all-reduce (fp32), the lowest mantissa bit of an input flipped after its sketch: within the rounding "
          "bound, not caught (%s)", bad ? msg : "passes");
    // the bound's size: one input changed after its sketch by twice the bound's main term (on the sketch it moves
    // most) is caught, by half of it is not, in fp32 and bf16, all-reduce and reduce-scatter
    int tight = 1;
    for (int kind = 0; kind < 2; kind++)
        for (int bf = 0; bf < 2; bf++)
            for (int side = 0; side < 2; side++) {
                NcclMishap move = {.input_member = 2, .input_elem = kind == SK_ALLREDUCE ? 1700 : 1500 + 333, .copy_member = -1,
                                   .ratio = side ? 2.0 : 0.5};
                int caught_now = nccl_play(kind, 4, kind == SK_ALLREDUCE ? 3000 : 1500, bf, 0, &move, msg, sizeof(msg));
                int want = side == 1;
                int near = fabs(move.got / move.ratio - 1.0) < 0.01;  // bf16's rounding of the changed value
                if (caught_now != want || !near) {
                    tight = 0;
                    printf("      %s %s, change %.4g of the bound: %s\n", kind == SK_ALLREDUCE ? "all-reduce" :
                           "reduce-scatter", bf ? "bf16" : "fp32", move.got, caught_now ? msg : "passed");
                }
            }
    check(tight, "the bound's size: an input changed after its sketch by 2x (p - 1) u of its chunk's |r|.|x| sum "
          "caught, by 0.5x passes (all-reduce and reduce-scatter of 4, fp32 and bf16)");
    // an average: honest ones pass (p a power of 2 or not: 1/p rounded); one divided by p - 1 members is caught in
    // fp32. In bf16 it is not, on data like these: the sketch of a whole chunk off by a factor grows as the root of
    // its length (r's random signs), the bound as its length, and 2^-8 (p - 1) of it is wider than a third of it
    int avg_ok = 1;
    for (int p = 3; p <= 4; p++)
        for (int bf = 0; bf < 2; bf++)
            for (int data = 0; data < 4; data += 1 + (data == 1)) {  // not 2's cancellation: its sum is about 0
                NcclMishap honest = {.input_member = -1, .copy_member = -1, .avg = 1, .avg_by = p};
                NcclMishap wrong = {.input_member = -1, .copy_member = -1, .avg = 1, .avg_by = p - 1};
                int h = nccl_play(SK_ALLREDUCE, p, 1500, bf, data, &honest, msg, sizeof(msg));
                if (h) printf("      honest average of %d, bf16 %d, data %d: %s\n", p, bf, data, msg);
                avg_ok = avg_ok && !h;
                if (bf) continue;
                int w = nccl_play(SK_ALLREDUCE, p, 1500, bf, data, &wrong, msg, sizeof(msg));
                avg_ok = avg_ok && w && strstr(msg, "on every rank") != NULL;
            }
    check(avg_ok, "averages (all-reduce of 3 and 4, fp32 and bf16, 3 kinds of data, 1/p rounded to the type): honest "
          "ones pass; fp32 ones divided by p - 1 members are caught");
    // the record's layout: 2p sketches, inputs then outputs
    int layout = 1;
    for (int p = 1; p <= 8; p++)
        for (int k = 0; k < p; k++)
            layout = layout && nchk_rec_count(p) == (size_t)(2 * p) && nchk_rec_in(p, k) == (size_t)k &&
                     nchk_rec_out(p, k) == (size_t)(p + k);
    check(layout && sizeof(Sketch) == 5 * sizeof(double), "the GPU's record: 2p sketches of 5 doubles (in[k] at k, "
          "out[k] at p + k), the layout its kernels write");
}

// ----------------------------------------------------------------------------
// the host backend's checks between real ranks: this program started again
// through the launcher as the ranks of a job,
//     ./dev/test/test_integrity child MODE -np N [-fault KIND:RANK:STEP]
// past: every rank draws a checked all-reduce's r for its n elements, then
//       sketches a piece that reaches past them, as no collective cuts one:
//       the job ends, the piece and the lengths named
// sum:  an all-reduce (2 ranks) or a reduce-scatter (3), -ic 1, of data
//       whose chunks open with a frame of values below 1 and go on in frames
//       1024 times larger, so that one frame's rounding bound is far below its
//       chunk's; with -fault corrupt-sum the job ends at the collective
// sum0: the same all-reduce with the checks off: it returns, and says how its
//       result differs from the plain sums

#define REAL_FRAMES 4  // frames per chunk in the real ranks' collectives
#define REAL_STEP 3    // the step they are stamped with

// real_value: a rank's input element i, in collectives of chunks of chunk
// elements: the first frame of each chunk in [-1, 1), the rest 1024 times that
static float real_value(int rank, size_t i, size_t chunk) {
    uint64_t h = (uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 29;
    float v = (float)((double)(h >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
    return i % chunk < FRAME_FLOATS ? v : 1024.0f * v;
}

static int child_main(int argc, char **argv) {
    TestChild a;
    Fault fault;
    if (test_child_start(&a, &fault, argc, argv, 10.0) != 0) return 2;
    char err[512];
    Launch L;
    int rc = parallel_main(argc, argv, a.np, a.rendezvous, a.key_file, NULL, a.to, &L, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    Grid g;
    if (grid_init(&g, L.world, 1, 1, L.rank, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    g.local_rank = L.local_rank;
    Comm *c;
    if (comm_init(&c, &g, L.key, L.rendezvous, a.to, &fault, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", L.rank, err);
        return 1;
    }
    Group world;
    grid_groups(&g, &world, NULL, NULL, NULL);
    int p = world.size;
    size_t chunk = REAL_FRAMES * FRAME_FLOATS, n = (size_t)p * chunk;
    float *x = (float *)malloc(n * sizeof(float)), *out = (float *)malloc(chunk * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = real_value(L.rank, i, chunk);
    comm_set_check(c, strcmp(a.mode, "sum0") != 0);
    comm_set_step(c, REAL_STEP);
    if (strcmp(a.mode, "past") == 0) {
        // what a collective does first, then a piece cut past its length
        comm_enter(c, "allreduce", COMM_ALLREDUCE);
        comm_set_label(c, "a piece past the draw");
        comm_check_begin(c, &world, SK_ALLREDUCE, n);
        Sketch sk = {{0, 0}, {0, 0}, 0};
        comm_sketch(c, &sk, n - 100, x, 200, 1);
        test_rank_check(L.rank, "past_unseen", 0, "a piece of 200 elements from element %zu, past the %zu drawn, "
                        "was sketched (%.17g)", n - 100, n, sk.s[0]);
    } else if (p == 2) {
        comm_set_label(c, "test sums");
        comm_allreduce(c, &world, x, n, OP_SUM);
        // only the checks off come here: the result against the plain sums
        // (x0 + x1 is x1 + x0 in fp32), one element moved by the flip
        int differ = 0;
        double rel = 0.0;
        for (size_t i = 0; i < n; i++) {
            float want = real_value(0, i, chunk) + real_value(1, i, chunk);
            if (memcmp(&want, &x[i], sizeof(float)) != 0) {
                differ++;
                rel = fabs((double)x[i] - (double)want) / fabs((double)want);
            }
        }
        test_rank_check(L.rank, "sum_changed", differ == 1 && rel > ldexp(1.0, -6) && rel <= ldexp(1.0, -5),
                        "%d elements differ from the plain sums, the last by %.3g of itself", differ, rel);
    } else {
        comm_set_label(c, "test sums");
        comm_reduce_scatter(c, &world, x, out, chunk, OP_SUM);
        // with -fault corrupt-sum the checks end the job inside the call
        test_rank_check(L.rank, "returned", 0, "the reduce-scatter returned past a corrupted sum");
    }
    free(x);
    free(out);
    comm_free(c);
    launch_free(&L);
    return test_rank_failures > 0 ? 1 : 0;
}

static char self_exe[4096];

// real_job: a job of this program's ranks (child_main), its exit status and
// its output, stdout and stderr, in out
static int real_job(const char *mode, int np, const char *fault, char *out, size_t len) {
    char cmd[4400];
    snprintf(cmd, sizeof(cmd), "timeout 60 '%s' child %s -np %d%s%s", self_exe, mode, np, fault != NULL ? " -fault " : "",
             fault != NULL ? fault : "");
    return test_run(cmd, 1, out, len);
}

// real_off_by: the figures of a failed frame's line, "is off by D in its
// frame of elements F0..F1, more than that frame's rounding bound B"
static int real_off_by(const char *out, double *d, long *f0, long *f1, double *b) {
    const char *at = strstr(out, "is off by ");
    return at != NULL && sscanf(at, "is off by %lf in its frame of elements %ld..%ld, more than that frame's rounding "
                                "bound %lf", d, f0, f1, b) == 4;
}

// a lower bound of the chunk's rounding bound at hop 0, u (A(P) + A(x)) and
// more, where A sums |a| |x| over the blocks and |a| >= 1/2: half of u times
// the two inputs' sums of |x| over the chunk (elements lo .. lo + chunk - 1)
static double real_chunk_bound_below(int r0, int r1, size_t lo, size_t chunk) {
    double s = 0.0;
    for (size_t i = lo; i < lo + chunk; i++)
        s += fabs((double)real_value(r0, i, chunk)) + fabs((double)real_value(r1, i, chunk));
    return ldexp(0.5 * s, -24);
}

static void test_real_ranks(void) {
    static char out[65536];
    // a piece past the length drawn: never silent
    int st = real_job("past", 2, NULL, out, sizeof(out));
    size_t n2 = 2 * REAL_FRAMES * FRAME_FLOATS;
    char want[300];
    snprintf(want, sizeof(want), "step %d: checked allreduce of a piece past the draw: a piece of 200 elements from "
             "element %zu reaches past the %zu elements its coefficients were drawn for", REAL_STEP, n2 - 100, n2);
    check(st == 1 && strstr(out, want) != NULL && strstr(out, "past_unseen") == NULL,
          "a piece sketched past the length its r was drawn for ends the job, naming the collective and the lengths "
          "(exit %d): '%s'", st, want);
    if (strstr(out, want) == NULL) printf("%s\n", out);

    // -fault corrupt-sum: one mantissa bit of a sum, sketched as stored, in
    // the first frame of its chunk: above that frame's bound, far below the chunk's
    struct { int np; const char *fault, *collective, *hop; int r0, r1; size_t lo; } cases[] = {
        {2, "corrupt-sum:1:3", "checked allreduce of test sums over ranks 0, 1 failed: chunk 1 (elements 65536..131071) "
         "in the reduce-scatter", "the sum rank 1 made at hop 0 (what rank 0 sent plus rank 1's own piece)", 0, 1, 65536},
        {3, "corrupt-sum:2:3", "checked reduce_scatter of test sums over ranks 0, 1, 2 failed: chunk 0 (elements "
         "0..65535)", "the sum rank 2 made at hop 0 (what rank 1 sent plus rank 2's own piece)", 1, 2, 0},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        st = real_job("sum", cases[k].np, cases[k].fault, out, sizeof(out));
        long f0 = -1, f1 = -1;
        double d = 0, b = 0, below = real_chunk_bound_below(cases[k].r0, cases[k].r1, cases[k].lo,
                                                                               REAL_FRAMES * FRAME_FLOATS);
        int parsed = real_off_by(out, &d, &f0, &f1, &b);
        int named = strstr(out, cases[k].collective) != NULL && strstr(out, cases[k].hop) != NULL;
        int frame = parsed && f0 == (long)cases[k].lo && f1 == (long)(cases[k].lo + FRAME_FLOATS - 1);
        int returned = strstr(out, " returned FAIL") != NULL || strstr(out, " sum_changed ") != NULL;
        check(st == 1 && named && frame && !returned && fabs(d) > 2.0 * b && fabs(d) < below / 16.0 &&
              strstr(out, "fault corrupt-sum: flipped bit 18") != NULL,
              "-np %d -fault %s: the job ends at the collective, naming the sum's hop and its frame (elements %ld.."
              "%ld): off by %.3g, above the frame's bound %.3g, below 1/16 of the chunk's (%.3g at least) (exit %d)",
              cases[k].np, cases[k].fault, f0, f1, d, b, below, st);
        if (!named || !frame) printf("%s\n", out);
    }
    // the checks off: the job runs on, its result one element off
    st = real_job("sum0", 2, "corrupt-sum:1:3", out, sizeof(out));
    check(st == 0 && test_rank_ok(out, 0, "sum_changed") && test_rank_ok(out, 1, "sum_changed"),
          "-ic 0 -fault corrupt-sum:1:3: the all-reduce returns, one element of its result moved by 2^-6 to 2^-5 "
          "of itself on both ranks (exit %d)", st);
    if (st != 0) printf("%s\n", out);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "child") == 0) return child_main(argc, argv);
    test_self_exe(self_exe, sizeof(self_exe), argv[0]);
    test_coefficients();
    test_fused_pass();
    test_ring_verdicts();
    test_group_calls();
    test_sum_bounds();
    test_grads_rule();
    test_nccl_coefficients();
    test_nccl_order();
    test_nccl_verdicts();
#ifdef LLM3D_SCALAR
    // test_integrity_scalar: sketch.h's plain loops; the trainer's runs are
    // test_integrity's (./train_gpt2 is whatever SIMD it was built with)
    printf("note: the scalar build checks sketch.h's plain loops; the trainer's runs are test_integrity's\n");
    return test_summary();
#endif
    test_real_ranks();
    if (access("./train_gpt2", X_OK) != 0) {
        skip("./train_gpt2 not built: the trainer's runs");
        return test_summary();
    }
    if (!check(test_shard_dir(dir, sizeof(dir), shards, sizeof(shards), "/tmp/llm3d_integrity_XXXXXX", 40000) == 0,
               "a 40000-token shard in a new folder %s", dir))
        return test_summary();
    test_idle_notes();
    test_corrupt();
    test_poison();
    test_quiet();
    test_remove_dir(dir);
    return test_summary();
}
