/*
 * llm3d/parallel/pipeline.h: the pipeline schedules and their messages, the
 * same for both trainers.
 *
 * defines:
 *   PipeSchedule, pipeline_name, pipeline_parse
 *                         the schedules: gpipe, 1f1b, interleaved, zbh1, zbv
 *   PIPE_F, PIPE_B, PIPE_W, PipeOp, pipe_op, pipe_op_text
 *                         one op of a stage: a forward, a backward (the
 *                         input's gradient; with the weights' too where the
 *                         schedule has no W) or a weight gradient, of one
 *                         micro-batch on one of the stage's chunks of layers
 *   PIPE_MAXV, PipeLayout, pipeline_chunks, pipe_layout, pipeline_validate
 *                         a step's shape (schedule, stages, micro-batches,
 *                         chunks per stage), and the check of the flags
 *                         that make it, one line when it cannot run
 *   pipeline_part, pipeline_place
 *                         where a chunk of layers sits in the model
 *   pipeline_schedule     the order of a stage's ops
 *   pipeline_inflight     the activation sets a stage needs
 *   pipeline_splits_backward, pipeline_ops
 *                         whether a schedule has W ops; a stage's op count
 *   pipeline_bubble, pipeline_bubble_formula
 *                         the idle fraction of a step, F, B and W equal
 *   pipeline_find         where an op sits in a stage's ops
 *   pipeline_play, pipeline_simulate
 *                         the stages played against each other in time, for
 *                         the tests and dev/pipeline_chart, and for the
 *                         trainers to set a measured bubble against
 *   pipeline_simulated_bubble
 *                         the simulator's bubble for given F, B, W costs:
 *                         the mean and the most of the stages' idle shares
 *   PipeMsg, PIPE_NONE, pipe_input, pipe_output
 *                         a message to or from a stage (or none, or a hand-
 *                         off within the stage): what an op needs first, and
 *                         what it hands on
 *   PipeStep, PIPE_MSG, pipeline_plan_max, pipeline_plan
 *                         the messages a stage posts around each op, sends
 *                         paired with receives; with chunks, in one order
 *                         of all the step's messages
 *   PipeSets, pipe_sets_init, pipe_sets_take, pipe_sets_index,
 *   pipe_sets_give_back, pipe_sets_free
 *                         which activation set each micro-batch holds on
 *                         each chunk in a step (both trainers' pipeline_run)
 *   pipeline_plan_sets    the activation sets a stage's plan holds at once,
 *                         early inputs counted
 *   pipeline_plan_text    a stage's plan as text, "F0s F1x B0 rB1"
 *   pipeline_check        the plans played with sends that block, which finds
 *                         a mismatch or a deadlock
 *
 * Pure C with no I/O: it knows stages, chunks and micro-batches, not ranks,
 * models or transports. A "stage" is a pipeline rank, as in the trainers;
 * with interleaved and zbv a stage holds V chunks of layers, and the model's
 * pp x V chunks in model order are its "parts" (pipeline_part). Where a
 * schedule has one chunk per stage, part = stage, and everything below is
 * what it was before chunks: gpipe and 1f1b make the same lists, plans and
 * times as ever.
 *
 * Choices. A step's shape travels as one struct, PipeLayout, as the
 * functions need the schedule, pp, M and V together. Interleaved keeps
 * Megatron's warm-up and groups but not its rule that M = pp runs all
 * forwards first: without it the plans still check and the bubble is the
 * formula's. The zero bubble lists are laid out as for enough micro-batches
 * and cut to M, so every M >= 1 runs (more bubble below 2pp, as the
 * formulas say). Plans with chunks are not built op by op as 1f1b's are:
 * a ring and a V both make neighbours' orders disagree, so those plans
 * follow one order of all the step's messages (pipe_plan_ordered), at the
 * cost of some receives posted an op or more before their op needs them.
 * Header-only (llm.c style): every function is static inline.
 */
#ifndef LLM3D_PIPELINE_H
#define LLM3D_PIPELINE_H

#include "secure.h"  // the message channels: CH_ACTIVATION, CH_GRADIENT, channel_name

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// the schedules: the order in which stage `stage` of pp runs the ops of the
// M micro-batches of one step. Both trainers run exactly this list;
// doc/parallel.md draws each as a time chart, with its bubble, activation
// sets and messages side by side.
//   gpipe: F0 F1 .. F(M-1) B0 B1 .. B(M-1)         (M activation sets)
//   1f1b:  pp - stage - 1 forwards to fill the pipe, then one forward and one
//          backward in turn, then the remaining backwards (PipeDream-flush);
//          at most pp - stage micro-batches are in flight, so that many
//          activation sets suffice.
//   interleaved (Megatron-LM's interleaved 1F1B): V chunks of layers per
//          stage, chunk c of stage s the model's part c*pp + s, so a micro-
//          batch goes round the stages V times. The micro-batches go in
//          groups of pp: a stage runs a group's forwards on chunk 0, then on
//          chunk 1, ..., then the next group's; backwards in the same
//          groups from chunk V-1 down. A warm-up of 2(pp - s - 1) + (V-1)pp
//          forwards (all M*V when that is more), then forward and backward
//          in turn, then the remaining backwards. The bubble shrinks by
//          about V, the messages grow by V. Needs pp >= 2, V >= 2 and M a
//          multiple of pp (Megatron's own terms: the groups must be whole).
//   zbh1 (Zero Bubble's ZB-H1): the backward split into B, the gradient of
//          the input, which the stage before waits for, and W, the gradient
//          of the weights, which nobody waits for. Round x of stage s runs
//          F(x), B(x - (pp-1-s)) and W(x - (pp-1)), each left out when its
//          micro-batch is not in 0..M-1: 1f1b's F and B rounds with every W
//          put off by pp - 1 rounds, which fills the drain with W ops. A
//          stage holds a micro-batch from its F to its W: at most pp, as
//          1f1b's first stage, and the bubble is about a third of 1f1b's.
//   zbv (Zero Bubble's ZB-V): V = 2 chunks per stage placed as a V: chunk 0
//          of stage s is part s (going down), chunk 1 is part 2pp-1-s
//          (coming back), so the last stage holds parts pp-1 and pp, whose
//          hand-off stays within it, and stage 0 holds the first and the
//          last part. The order (below, zbv_schedule) holds at most 2pp
//          chunk sets of L/(2pp) layers on a stage: 1f1b's peak of pp sets
//          of L/pp layers; with F, B and W equal the bubble is (pp-1)/(6M +
//          pp - 1) from M about 1.5pp, half of zbh1's.
// No list deadlocks: pipeline_play and pipeline_check play every layout the
// flags allow in test_parallel, and doc/parallel.md has the argument for
// gpipe and 1f1b.

typedef enum { PIPE_GPIPE, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_ZBH1, PIPE_ZBV, PIPE_SCHEDULES } PipeSchedule;

// the names, in the order of the flag table's -ps choices
static inline const char *pipeline_name(PipeSchedule s) {
    static const char *const names[PIPE_SCHEDULES] = {"gpipe", "1f1b", "interleaved", "zbh1", "zbv"};
    return s >= 0 && s < PIPE_SCHEDULES ? names[s] : "unknown";
}

// the schedule of that name, or -1
static inline int pipeline_parse(const char *name) {
    for (int s = 0; s < PIPE_SCHEDULES; s++)
        if (strcmp(name, pipeline_name((PipeSchedule)s)) == 0) return s;
    return -1;
}

enum { PIPE_F, PIPE_B, PIPE_W };  // an op's kind

// kind of micro-batch mb on the stage's chunk `chunk` (0..V-1)
typedef struct { int kind, mb, chunk; } PipeOp;

static inline PipeOp pipe_op(int kind, int mb, int chunk) {
    PipeOp op;
    op.kind = kind, op.mb = mb, op.chunk = chunk;
    return op;
}

// "F3", "B0", "W5"; on a chunk other than 0, "F3.1". Writes at most len bytes; returns buf.
static inline const char *pipe_op_text(PipeOp op, char *buf, size_t len) {
    char kind = op.kind == PIPE_F ? 'F' : op.kind == PIPE_B ? 'B' : op.kind == PIPE_W ? 'W' : '-';  // '-': PIPE_MSG
    if (op.chunk == 0) snprintf(buf, len, "%c%d", kind, op.mb);
    else snprintf(buf, len, "%c%d.%d", kind, op.mb, op.chunk);
    return buf;
}

// ----------------------------------------------------------------------------
// a step's shape: the schedule, pp stages, M micro-batches, V chunks of
// layers per stage (1, but -pv for interleaved and 2 for zbv)

enum { PIPE_MAXV = 8 };  // chunks per stage, at most

typedef struct {
    PipeSchedule schedule;
    int pp, M, V;
} PipeLayout;

// the chunks per stage a schedule runs, pv the -pv flag
static inline int pipeline_chunks(PipeSchedule s, int pv) { return s == PIPE_INTERLEAVED ? pv : s == PIPE_ZBV ? 2 : 1; }

static inline PipeLayout pipe_layout(PipeSchedule s, int pp, int M, int pv) {
    PipeLayout pl;
    pl.schedule = s, pl.pp = pp, pl.M = M, pl.V = pipeline_chunks(s, pv);
    return pl;
}

// whether the flags -ps s, -pp pp, -pv pv with M micro-batches per step (and
// a model of L layers; L <= 0: not known yet) make a step that can run: 0,
// or -1 with one line in err naming the flag and its value
static inline int pipeline_validate(PipeSchedule s, int pp, int M, int pv, int L, char *err, size_t errlen) {
    if (s < 0 || s >= PIPE_SCHEDULES) return snprintf(err, errlen, "-ps %d: not a pipeline schedule", (int)s), -1;
    if (pp < 1) return snprintf(err, errlen, "-pp %d: needs at least 1 stage", pp), -1;
    if (M < 1) return snprintf(err, errlen, "-mb %d: needs at least 1 micro-batch per step", M), -1;
    if (pv < 1 || pv > PIPE_MAXV)
        return snprintf(err, errlen, "-pv %d: chunks of layers per stage are 1..%d", pv, PIPE_MAXV), -1;
    if (s != PIPE_INTERLEAVED && pv != 1)
        return snprintf(err, errlen, "-pv %d: only -ps interleaved takes chunks per stage (-ps %s holds %d)", pv,
                        pipeline_name(s), pipeline_chunks(s, 1)), -1;
    if (s == PIPE_INTERLEAVED) {
        if (pp < 2) return snprintf(err, errlen, "-ps interleaved needs -pp 2 or more (got -pp %d)", pp), -1;
        if (pv < 2)
            return snprintf(err, errlen, "-ps interleaved needs -pv 2 or more (got -pv %d; with one chunk it is 1f1b)", pv), -1;
        if (M % pp != 0)
            return snprintf(err, errlen, "-ps interleaved needs micro-batches per step a multiple of -pp %d (got %d)", pp,
                            M), -1;
    }
    int V = pipeline_chunks(s, pv);
    if (L > 0 && L < pp * V)
        return snprintf(err, errlen, "-ps %s -pp %d: %d layers cannot fill %d stages x %d chunks", pipeline_name(s), pp, L,
                        pp, V), -1;
    return 0;
}

// the model part (0..pp*V-1, in model order) that chunk `chunk` of stage
// `stage` holds
static inline int pipeline_part(const PipeLayout *pl, int stage, int chunk) {
    if (pl->schedule == PIPE_ZBV) return chunk == 0 ? stage : 2 * pl->pp - 1 - stage;
    return chunk * pl->pp + stage;
}

// the stage and the chunk that hold model part `part`
static inline void pipeline_place(const PipeLayout *pl, int part, int *stage, int *chunk) {
    if (pl->schedule == PIPE_ZBV) {
        *chunk = part < pl->pp ? 0 : 1;
        *stage = part < pl->pp ? part : 2 * pl->pp - 1 - part;
    } else {
        *chunk = part / pl->pp;
        *stage = part % pl->pp;
    }
}

// whether the schedule runs W ops (the backward split in two)
static inline int pipeline_splits_backward(const PipeLayout *pl) {
    return pl->schedule == PIPE_ZBH1 || pl->schedule == PIPE_ZBV;
}

// the ops of one stage in one step: every micro-batch on every chunk, F and
// B (and W)
static inline int pipeline_ops(const PipeLayout *pl) { return (pipeline_splits_backward(pl) ? 3 : 2) * pl->M * pl->V; }

// appends op to ops[*n] when its micro-batch is one of the step's M (the
// zero bubble orders are laid out as if there were enough micro-batches,
// and those past M left out: a list without some micro-batches' ops still
// runs, as nothing waits on them but their own later ops)
static inline void pipe_put(PipeOp *ops, int *n, int M, int kind, int mb, int chunk) {
    if (mb >= 0 && mb < M) ops[(*n)++] = pipe_op(kind, mb, chunk);
}

// interleaved: forward or backward k (0..M*V-1) of a stage, in Megatron's
// groups of pp micro-batches: its micro-batch and chunk
static inline PipeOp interleaved_op(int pp, int V, int kind, int k) {
    int group = k / (pp * V), in_group = k % (pp * V), chunk = in_group / pp;
    return pipe_op(kind, group * pp + in_group % pp, kind == PIPE_F ? chunk : V - 1 - chunk);
}

static inline int interleaved_warmup(int pp, int stage, int M, int V) {
    int w = 2 * (pp - stage - 1) + (V - 1) * pp;
    return w < M * V ? w : M * V;
}

// zbv: stage s of pp with M micro-batches, laid out for N = max(M, 2pp-1),
// in six phases (counters f0, b0, w0 for chunk 0, f1, b1, w1 for chunk 1):
//   1. 2(pp-s) - 1 forwards on chunk 0: chunk 1's first input comes down
//      the V and back up to stage s after 2(pp-s) - 1 chunk forwards;
//   2. s times: a forward on chunk 1, then one on chunk 0;
//   3. pp - s times: F on chunk 1, then B and W of its oldest micro-
//      batch (chunk 1 is near the loss on the stages near 0, so its
//      gradients come back soon);
//   4. until the forwards are done: F, B, W on chunk 0 (no F once chunk 0's
//      are all done), then F, B, W on chunk 1;
//   5. s times: B on chunk 0, then B on chunk 1, their W put off;
//   6. pp - s times: B and W on chunk 0; then the put-off W of chunk 1,
//      then of chunk 0, which fill the drain.
static inline int zbv_schedule(int pp, int s, int M, PipeOp *ops) {
    int n = 0, N = M > 2 * pp - 1 ? M : 2 * pp - 1;
    int f0 = 0, b0 = 0, w0 = 0, f1 = 0, b1 = 0, w1 = 0;
    for (int i = 0; i < 2 * (pp - s) - 1; i++) pipe_put(ops, &n, M, PIPE_F, f0++, 0);
    for (int i = 0; i < s; i++) {
        pipe_put(ops, &n, M, PIPE_F, f1++, 1);
        pipe_put(ops, &n, M, PIPE_F, f0++, 0);
    }
    for (int i = 0; i < pp - s; i++) {
        pipe_put(ops, &n, M, PIPE_F, f1++, 1);
        pipe_put(ops, &n, M, PIPE_B, b1, 1);
        pipe_put(ops, &n, M, PIPE_W, b1++, 1);
    }
    while (f0 < N || f1 < f0) {
        if (f0 < N) pipe_put(ops, &n, M, PIPE_F, f0++, 0);
        pipe_put(ops, &n, M, PIPE_B, b0, 0);
        pipe_put(ops, &n, M, PIPE_W, b0++, 0);
        pipe_put(ops, &n, M, PIPE_F, f1++, 1);
        pipe_put(ops, &n, M, PIPE_B, b1, 1);
        pipe_put(ops, &n, M, PIPE_W, b1++, 1);
    }
    w0 = b0, w1 = b1;
    for (int i = 0; i < s; i++) {
        pipe_put(ops, &n, M, PIPE_B, b0++, 0);
        pipe_put(ops, &n, M, PIPE_B, b1++, 1);
    }
    for (int i = 0; i < pp - s; i++) {
        pipe_put(ops, &n, M, PIPE_B, b0++, 0);
        pipe_put(ops, &n, M, PIPE_W, w0++, 0);
    }
    while (w1 < b1) pipe_put(ops, &n, M, PIPE_W, w1++, 1);
    while (w0 < b0) pipe_put(ops, &n, M, PIPE_W, w0++, 0);
    return n;
}

// fills ops (pipeline_ops(pl) entries) with stage `stage`'s list; returns
// their count
static inline int pipeline_schedule(const PipeLayout *pl, int stage, PipeOp *ops) {
    int pp = pl->pp, M = pl->M, V = pl->V, n = 0;
    switch (pl->schedule) {
    case PIPE_GPIPE:
        for (int k = 0; k < M; k++) ops[n++] = pipe_op(PIPE_F, k, 0);
        for (int k = 0; k < M; k++) ops[n++] = pipe_op(PIPE_B, k, 0);
        return n;
    case PIPE_1F1B:
        // round x: F(x) and B(x - warm-up); the warm-up rounds have no B
        for (int x = 0, w = pp - stage - 1; x < M + w; x++) {
            pipe_put(ops, &n, M, PIPE_F, x, 0);
            pipe_put(ops, &n, M, PIPE_B, x - w, 0);
        }
        return n;
    case PIPE_INTERLEAVED: {
        int total = M * V, w = interleaved_warmup(pp, stage, M, V);
        for (int k = 0; k < w; k++) ops[n++] = interleaved_op(pp, V, PIPE_F, k);
        for (int k = 0; k + w < total; k++) {
            ops[n++] = interleaved_op(pp, V, PIPE_F, k + w);
            ops[n++] = interleaved_op(pp, V, PIPE_B, k);
        }
        for (int k = total - w; k < total; k++) ops[n++] = interleaved_op(pp, V, PIPE_B, k);
        return n;
    }
    case PIPE_ZBH1:
        for (int x = 0; x < M + pp - 1; x++) {
            pipe_put(ops, &n, M, PIPE_F, x, 0);
            pipe_put(ops, &n, M, PIPE_B, x - (pp - 1 - stage), 0);
            pipe_put(ops, &n, M, PIPE_W, x - (pp - 1), 0);
        }
        return n;
    case PIPE_ZBV:
        return zbv_schedule(pp, stage, M, ops);
    default:
        return 0;
    }
}

// activation sets a stage needs: the most (micro-batch, chunk) pairs held at
// once, each from its F until its last op that reads them (B, or W where
// the backward is split: the weights' gradient needs the layer inputs).
// A set is one chunk's layers (L/(pp*V)); zbv's 2pp sets of L/(2pp) layers
// are as much memory as 1f1b's pp sets of L/pp. zbv's stage s holds
// min(2pp, M + 1 + s): with few micro-batches, all of chunk 0's and s + 1
// of chunk 1's before its first W.
static inline int pipeline_inflight(const PipeLayout *pl, int stage) {
    int pp = pl->pp, M = pl->M, V = pl->V, k;
    switch (pl->schedule) {
    case PIPE_GPIPE: k = M; break;
    case PIPE_1F1B: k = pp - stage; break;
    case PIPE_INTERLEAVED: k = interleaved_warmup(pp, stage, M, V) + 1; break;
    case PIPE_ZBH1: k = pp; break;
    case PIPE_ZBV: k = M + 1 + stage < 2 * pp ? M + 1 + stage : 2 * pp; break;
    default: k = 0;
    }
    return k < M * V ? k : M * V;
}

// the idle fraction of a step when every op takes one unit (F = B = W;
// where the backward is not split, B is the whole of it and takes two), as
// the fraction num/den that pipeline_simulate gives (test_parallel holds it
// to that on every layout the flags allow). The step takes k units of work
// on every stage plus e units that each stage spends idle: e/(k + e).
//   gpipe, 1f1b   e = 3(pp-1), k = 3M: (pp-1)/(M + pp - 1), and so at any
//                 ratio of B to F
//   interleaved   (pp-1)/(V*M + pp - 1), with a chunk's F and B taking
//                 1/V of a stage's: the bubble shrinks by about V
//   zbh1          e = max(pp-1, 2pp-1-M), k = 3M: (pp-1)/(3M + pp - 1)
//                 from M = pp, a third of 1f1b's (pp-1)(F+B+W) idle,
//                 which is the paper's figure
//   zbv           e = max(pp-1, 2(2pp-1-M)), k = 6M, in units of a chunk's
//                 op (half a stage's): (pp-1)/(6M + pp - 1) from M about
//                 1.5 pp: each stage idles for pp-1 chunk ops, half a
//                 zbh1 stage's, where the paper counts it as none (its
//                 "zero bubble" leaves out the fill, one chunk F per stage)
static inline int pipeline_bubble_formula(const PipeLayout *pl, long *num, long *den) {
    long pp = pl->pp, M = pl->M, V = pl->V, e;
    switch (pl->schedule) {
    case PIPE_GPIPE:
    case PIPE_1F1B: *num = pp - 1, *den = M + pp - 1; return 0;
    case PIPE_INTERLEAVED: *num = pp - 1, *den = V * M + pp - 1; return 0;
    case PIPE_ZBH1:
        e = pp - 1 > 2 * pp - 1 - M ? pp - 1 : 2 * pp - 1 - M;
        *num = e, *den = 3 * M + e;
        return 0;
    case PIPE_ZBV:
        e = pp - 1 > 2 * (2 * pp - 1 - M) ? pp - 1 : 2 * (2 * pp - 1 - M);
        *num = e, *den = 6 * M + e;
        return 0;
    default: return -1;
    }
}

// the formula's value (pipeline_bubble_formula), or -1 where there is none
static inline double pipeline_bubble(const PipeLayout *pl) {
    long num, den;
    return pipeline_bubble_formula(pl, &num, &den) == 0 ? (double)num / (double)den : -1.0;
}

// where op sits in a stage's n ops; -1 if it is not there
static inline int pipeline_find(const PipeOp *ops, int n, PipeOp op) {
    for (int i = 0; i < n; i++)
        if (ops[i].kind == op.kind && ops[i].mb == op.mb && ops[i].chunk == op.chunk) return i;
    return -1;
}

// an op's time: F takes f, B b, W w; B takes b + w where the schedule has
// no W (the whole backward)
static inline int pipe_cost(const PipeLayout *pl, PipeOp op, int f, int b, int w) {
    if (op.kind == PIPE_F) return f;
    if (op.kind == PIPE_W) return w;
    return pipeline_splits_backward(pl) ? b : b + w;
}

// pipeline_play: plays one step of pp stages against each other, each stage
// running its n = pipeline_ops(pl) ops (ops + s * n) in order; for the
// tests, dev/pipeline_chart and the trainers' predicted bubble. start (pp x
// n) gets the time each op starts: once the stage's previous op has ended
// and the op's input is there. F of micro-batch k on model part t needs F k
// of part t-1 (the activations), B k needs B k of part t+1 (their
// gradient) and F k of its own part, W k needs B k of its own part; the
// ones on the same stage must come earlier in its list. An F takes f, a B
// b and a W w (a B b + w where the schedule has no W). A message takes no
// time and a send never blocks (the host backend's do, above 512 KiB:
// pipeline_check below plays the messages with sends that block;
// doc/parallel.md, "And the transport"). idle (pp entries, or NULL) gets
// each stage's time without an op in the step. Returns the time the step
// ends, or -1 when the stages are stuck (some op can never run; its start
// stays -1), an op is not one of the layout's, or memory runs out.
static inline int pipeline_play(const PipeLayout *pl, int f, int b, int w, const PipeOp *ops, int *start, int *idle) {
    int pp = pl->pp, M = pl->M, V = pl->V;
    if (pp < 1 || M < 1 || V < 1 || V > PIPE_MAXV) return -1;
    int n = pipeline_ops(pl), parts = pp * V;
    for (int i = 0; i < pp * n; i++) start[i] = -1;
    // f_end[part * M + mb], b_end[...]: when that F, B ended (-1: not yet);
    // next[s]: stage s's next op
    int *f_end = (int *)malloc(sizeof(int) * ((size_t)2 * parts * M + pp));
    if (f_end == NULL) return -1;
    int *b_end = f_end + (size_t)parts * M, *next = b_end + (size_t)parts * M;
    for (size_t i = 0; i < (size_t)2 * parts * M; i++) f_end[i] = -1;
    for (int s = 0; s < pp; s++) next[s] = 0;
    // sweep the stages, each running ops while their inputs are there, until
    // a sweep runs nothing
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            const PipeOp *my = ops + (size_t)s * n;
            int *my_start = start + (size_t)s * n;
            for (; next[s] < n; next[s]++) {
                int i = next[s];
                PipeOp op = my[i];
                if (op.mb < 0 || op.mb >= M || op.chunk < 0 || op.chunk >= V || op.kind < PIPE_F || op.kind > PIPE_W) break;
                int part = pipeline_part(pl, s, op.chunk), t = i == 0 ? 0 : my_start[i - 1] + pipe_cost(pl, my[i - 1], f, b, w);
                int need = -2;  // the end of what the op waits for (-1: not yet there)
                if (op.kind == PIPE_F && part > 0) need = f_end[(size_t)(part - 1) * M + op.mb];
                if (op.kind == PIPE_B) {
                    if (f_end[(size_t)part * M + op.mb] < 0) break;  // its own F has not run
                    if (part < parts - 1) need = b_end[(size_t)(part + 1) * M + op.mb];
                }
                if (op.kind == PIPE_W && b_end[(size_t)part * M + op.mb] < 0) break;  // nor its own B
                if (need == -1) break;
                if (need > t) t = need;
                my_start[i] = t;
                if (op.kind == PIPE_F) f_end[(size_t)part * M + op.mb] = t + f;
                if (op.kind == PIPE_B) b_end[(size_t)part * M + op.mb] = t + pipe_cost(pl, op, f, b, w);
                progress = 1;
            }
        }
    }
    int end = 0, stuck = 0;
    for (int s = 0; s < pp; s++) {
        stuck |= next[s] < n;
        if (n == 0 || next[s] < n) continue;
        int last = s * n + n - 1, stage_end = start[last] + pipe_cost(pl, ops[last], f, b, w);
        if (stage_end > end) end = stage_end;
    }
    free(f_end);
    if (stuck) return -1;
    for (int s = 0; idle != NULL && s < pp; s++) {
        idle[s] = end;
        for (int i = 0; i < n; i++) idle[s] -= pipe_cost(pl, ops[(size_t)s * n + i], f, b, w);
    }
    return end;
}

// pipeline_simulate: every stage's schedule into ops (pp x pipeline_ops(pl)),
// then plays it
static inline int pipeline_simulate(const PipeLayout *pl, int f, int b, int w, PipeOp *ops, int *start, int *idle) {
    if (pl->pp < 1 || pl->M < 1 || pl->V < 1 || pl->V > PIPE_MAXV) return -1;
    int n = pipeline_ops(pl);
    for (int s = 0; s < pl->pp; s++)
        if (pipeline_schedule(pl, s, ops + (size_t)s * n) != n) return -1;
    return pipeline_play(pl, f, b, w, ops, start, idle);
}

// pipeline_simulated_bubble: the bubble the simulator predicts for F, B
// and W costs f, b, w (w 0 where the schedule has no W: then b is the whole
// backward), defined as for a measured one: each stage's idle over the
// step's time (idle + busy = the step's end on every stage), into *mean
// (over the stages) and *max (the most of any stage; NULL: not wanted).
// 0, or -1 when the layout cannot be played or memory runs out.
static inline int pipeline_simulated_bubble(const PipeLayout *pl, int f, int b, int w, double *mean, double *max) {
    int pp = pl->pp, n = pipeline_ops(pl), rc = -1;
    PipeOp *ops = (PipeOp *)malloc(sizeof(PipeOp) * (size_t)(pp > 0 ? pp : 1) * (n > 0 ? n : 1));
    int *start = (int *)malloc(sizeof(int) * (size_t)(pp > 0 ? pp : 1) * (n > 0 ? n : 1));
    int *idle = (int *)malloc(sizeof(int) * (size_t)(pp > 0 ? pp : 1));
    int end = ops != NULL && start != NULL && idle != NULL ? pipeline_simulate(pl, f, b, w, ops, start, idle) : -1;
    if (end > 0) {
        double sum = 0.0, most = 0.0;
        for (int s = 0; s < pp; s++) {
            double x = (double)idle[s] / end;
            sum += x;
            most = x > most ? x : most;
        }
        *mean = sum / pp;
        if (max != NULL) *max = most;
        rc = 0;
    }
    free(ops), free(start), free(idle);
    return rc;
}

// the message plan: which messages a stage posts around each op, and which
// of them go together. A send blocks once its message outgrows the host
// ring (and on NCCL), so two neighbours that both send first wait on each
// other, as 1f1b's neighbours do where a forward meets a backward. The plan
// posts such a send together with the receive of the next op's input, when
// that input comes from the same neighbour, as one exchange (comm_sendrecv;
// Megatron's send_forward_recv_backward and send_backward_recv_forward).
// A message goes between neighbouring model parts: under interleaved the
// last stage's chunk c sends on to stage 0's chunk c+1 (and gradients come
// back that way), and under zbv the turn from part pp-1 to part pp is within
// the last stage: a hand-off (peer = the stage itself) that the transport
// never sees, and that is never paired. Both trainers post exactly these
// messages; pipeline_check plays them.

// to or from stage peer (peer -1: no message; the stage itself: a hand-off
// between its chunks), on channel, of micro-batch mb, for the receiver's
// chunk `chunk` (both sides name it: it says which of the receiver's
// chunks the input is for)
typedef struct { int peer, channel, mb, chunk; } PipeMsg;

typedef struct {
    PipeOp op;
    PipeMsg recv;       // before the op: its input, alone (none on the edge part, or when it came with the exchange before)
    PipeMsg send;       // after the op: its output (none on the edge part)
    PipeMsg next_recv;  // posted with send as one exchange: the next op's input (none: send alone)
} PipeStep;

static inline PipeMsg pipe_msg(int peer, int channel, int mb, int chunk) {
    PipeMsg m;
    m.peer = peer, m.channel = channel, m.mb = mb, m.chunk = chunk;
    return m;
}
static const PipeMsg PIPE_NONE = {-1, 0, 0, 0};

// what op needs first: an F, the part before's activations; a B, the part
// after's gradient; a W, nothing from anyone
static inline PipeMsg pipe_input(const PipeLayout *pl, int stage, PipeOp op) {
    int part = pipeline_part(pl, stage, op.chunk), from, chunk;
    if (op.kind == PIPE_F && part > 0) {
        pipeline_place(pl, part - 1, &from, &chunk);
        return pipe_msg(from, CH_ACTIVATION, op.mb, op.chunk);
    }
    if (op.kind == PIPE_B && part < pl->pp * pl->V - 1) {
        pipeline_place(pl, part + 1, &from, &chunk);
        return pipe_msg(from, CH_GRADIENT, op.mb, op.chunk);
    }
    return PIPE_NONE;
}

// what op hands on: an F, its output to the part after; a B, its input's
// gradient to the part before; a W, nothing
static inline PipeMsg pipe_output(const PipeLayout *pl, int stage, PipeOp op) {
    int part = pipeline_part(pl, stage, op.chunk), to, chunk;
    if (op.kind == PIPE_F && part < pl->pp * pl->V - 1) {
        pipeline_place(pl, part + 1, &to, &chunk);
        return pipe_msg(to, CH_ACTIVATION, op.mb, chunk);
    }
    if (op.kind == PIPE_B && part > 0) {
        pipeline_place(pl, part - 1, &to, &chunk);
        return pipe_msg(to, CH_GRADIENT, op.mb, chunk);
    }
    return PIPE_NONE;
}

// the most steps a stage's plan has: one per op, and with chunks one more
// per message it sends or receives (a step with no op), and one to spare
static inline int pipeline_plan_max(const PipeLayout *pl) { return (pl->V > 1 ? 3 : 1) * pipeline_ops(pl) + 1; }

// one stage's plan with one chunk per stage: each op's input received just
// before it, alone or with the previous op's send when it comes from the
// neighbour that send goes to
static inline int pipe_plan_line(const PipeLayout *pl, int stage, const PipeOp *ops, int n, PipeStep *plan) {
    PipeMsg arrived = PIPE_NONE;  // the input that came with the previous exchange
    for (int i = 0; i < n; i++) {
        PipeStep *st = &plan[i];
        st->op = ops[i];
        st->recv = arrived.peer >= 0 ? PIPE_NONE : pipe_input(pl, stage, ops[i]);
        st->send = pipe_output(pl, stage, ops[i]);
        PipeMsg next = i + 1 < n ? pipe_input(pl, stage, ops[i + 1]) : PIPE_NONE;
        st->next_recv = st->send.peer >= 0 && st->send.peer != stage && next.peer == st->send.peer ? next : PIPE_NONE;
        arrived = st->next_recv;
    }
    return n;
}

// one stage's plan with chunks (interleaved, zbv). A stage takes a peer's
// messages in the order the peer sends them (a link carries them in
// order), which is not always the order its own ops need them (zbv's stage
// s runs one more chunk-0 forward before its first chunk-1 backward than
// stage s+1 does); and the stages form a ring (interleaved's last stage
// sends on to stage 0), round which sends that block go in a circle. So
// these plans follow one order of all the step's messages, the same on
// every stage: the time each is sent when the stages run the schedule with
// F, B and W taking one unit each (pipeline_simulate), ties going to the
// lower sending stage, then to its earlier op. A stage posts its messages
// in that order: a send right after its op, a receive before the first op
// that starts once the message is out (so no later than the op that needs
// it, and sometimes before an op it does not need it for). Played with
// sends that block, this cannot deadlock: the first message in the order
// not yet matched has every message before it matched on both its stages,
// so both have posted it (each of their ops before it had its input posted
// before it, and matched). A send goes in one exchange with a receive
// posted right after it; a receive or a send that is not next to an op of
// its own gets a step of its own, with no op (kind PIPE_MSG). A hand-off
// within the stage never waits and sits by its ops. The unit times only
// order the messages; any other times run the same plan.
enum { PIPE_MSG = 3 };  // the kind of a step with no op, only messages

typedef struct {
    int time, from, index, send;  // sent at time by stage from after its op index; send: this stage sends it
    PipeMsg msg;                  // as this stage posts it
} PipePost;

static inline int pipe_post_order(const void *a, const void *b) {
    const PipePost *x = (const PipePost *)a, *y = (const PipePost *)b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->from != y->from) return x->from < y->from ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

// the step being filled (pipe_plan_ordered): it posts recv, runs op, then
// posts send and next_recv, each only if set
typedef struct {
    PipeStep *plan;
    int steps, has_recv, has_op, has_send;
} PipeFill;

static inline void pipe_fill_close(PipeFill *f) {
    if (!f->has_recv && !f->has_op && !f->has_send) return;
    PipeStep *st = &f->plan[f->steps++];
    if (!f->has_recv) st->recv = PIPE_NONE;
    if (!f->has_op) st->op = pipe_op(PIPE_MSG, 0, 0);
    if (!f->has_send) st->send = PIPE_NONE;
    if (!f->has_send || st->next_recv.peer < 0) st->next_recv = PIPE_NONE;
    f->has_recv = f->has_op = f->has_send = 0;
    f->plan[f->steps].next_recv = PIPE_NONE;
}

static inline void pipe_fill_recv(PipeFill *f, PipeMsg m, int stage) {
    PipeStep *st = &f->plan[f->steps];
    if (f->has_send && st->send.peer != stage && m.peer != stage) {  // an exchange with the send before
        st->next_recv = m;
        pipe_fill_close(f);
        return;
    }
    if (f->has_recv || f->has_op || f->has_send) pipe_fill_close(f);
    f->plan[f->steps].recv = m;
    f->has_recv = 1;
}

static inline void pipe_fill_op(PipeFill *f, PipeOp op) {
    if (f->has_op || f->has_send) pipe_fill_close(f);
    f->plan[f->steps].op = op;
    f->has_op = 1;
}

static inline void pipe_fill_send(PipeFill *f, PipeMsg m, int stage) {
    if (f->has_send) pipe_fill_close(f);
    f->plan[f->steps].send = m;
    f->plan[f->steps].next_recv = PIPE_NONE;
    f->has_send = 1;
    if (m.peer == stage) pipe_fill_close(f);  // a hand-off goes alone
}

// pipe_plan_ordered with the step's ops and start times played (all,
// start: pp x n) and room for 2n posts
static inline int pipe_plan_posts(const PipeLayout *pl, int stage, const PipeOp *all, const int *start, int n,
                                  PipePost *posts, PipeStep *plan) {
    // this stage's remote sends and receives, each with the time it is sent
    int np = 0;
    for (int p = 0; p < pl->pp; p++)
        for (int i = 0; i < n; i++) {
            PipeOp op = all[(size_t)p * n + i];
            PipeMsg out = pipe_output(pl, p, op);
            if (out.peer < 0 || out.peer == p || (p != stage && out.peer != stage) || np >= 2 * n) continue;
            PipePost *q = &posts[np++];
            q->time = start[(size_t)p * n + i] + pipe_cost(pl, op, 1, 1, 1);
            q->from = p, q->index = i, q->send = p == stage;
            q->msg = p == stage ? out : pipe_msg(p, out.channel, out.mb, out.chunk);
        }
    qsort(posts, (size_t)np, sizeof(PipePost), pipe_post_order);
    PipeFill f = {plan, 0, 0, 0, 0};
    plan[0].next_recv = PIPE_NONE;
    const PipeOp *ops = all + (size_t)stage * n;
    int k = 0;
    for (int i = 0; i <= n; i++) {
        // the messages out by the time op i starts (after the last op: all)
        for (; k < np && (i == n || posts[k].time <= start[(size_t)stage * n + i]); k++) {
            if (posts[k].send) pipe_fill_send(&f, posts[k].msg, stage);
            else pipe_fill_recv(&f, posts[k].msg, stage);
        }
        if (i == n) break;
        PipeMsg local = pipe_input(pl, stage, ops[i]), out = pipe_output(pl, stage, ops[i]);
        if (local.peer == stage) pipe_fill_recv(&f, local, stage);
        pipe_fill_op(&f, ops[i]);
        if (out.peer == stage) pipe_fill_send(&f, out, stage);
    }
    pipe_fill_close(&f);
    return f.steps;
}

// the plan is made from the stage's list as pipeline_schedule makes it (ops
// is not read: the order of the messages comes from every stage's list)
static inline int pipe_plan_ordered(const PipeLayout *pl, int stage, int n, PipeStep *plan) {
    PipeOp *all = (PipeOp *)malloc(sizeof(PipeOp) * (size_t)pl->pp * n);
    int *start = (int *)malloc(sizeof(int) * (size_t)pl->pp * n);
    PipePost *posts = (PipePost *)malloc(sizeof(PipePost) * 2 * (size_t)n);
    int steps = -1;
    if (all != NULL && start != NULL && posts != NULL && pipeline_simulate(pl, 1, 1, 1, all, start, NULL) >= 0)
        steps = pipe_plan_posts(pl, stage, all, start, n, posts, plan);
    free(all), free(start), free(posts);
    return steps;
}

// fills plan (up to pipeline_plan_max(pl) entries) for a stage's n ops
// (with chunks, those of pipeline_schedule, which every stage's plan must
// agree on); returns its steps (n with one chunk per stage), or -1 out of
// memory
static inline int pipeline_plan(const PipeLayout *pl, int stage, const PipeOp *ops, int n, PipeStep *plan) {
    return pl->V > 1 ? pipe_plan_ordered(pl, stage, n, plan) : pipe_plan_line(pl, stage, ops, n, plan);
}

// PipeSets: which activation set each micro-batch holds on each chunk of a
// stage in a step, as both trainers' pipeline_run keep it and
// pipeline_plan_sets counts it: micro-batch mb on chunk k takes the first
// free set at its first receive or op (pipe_sets_take) and gives it back
// after its last op (pipe_sets_give_back: its B, or its W where the backward
// is split). With chunks an input may come before its F, which
// pipeline_inflight does not count.
typedef struct {
    int nsets, nchunks, M;
    int *set_of;     // M * nchunks: the set (mb, chunk) holds, -1 when none
    int *busy;       // nsets: whether a set is taken
    int held, peak;  // sets taken now, and the most at once so far
} PipeSets;

// nsets sets for M micro-batches on nchunks chunks, none taken; 0, or -1 out
// of memory (s then holds nothing)
static inline int pipe_sets_init(PipeSets *s, int nsets, int nchunks, int M) {
    memset(s, 0, sizeof(*s));
    s->set_of = (int *)malloc((size_t)M * nchunks * sizeof(int));
    s->busy = (int *)calloc((size_t)(nsets > 0 ? nsets : 1), sizeof(int));
    if (s->set_of == NULL || s->busy == NULL) {
        free(s->set_of), free(s->busy);
        memset(s, 0, sizeof(*s));
        return -1;
    }
    for (int i = 0; i < M * nchunks; i++) s->set_of[i] = -1;
    s->nsets = nsets, s->nchunks = nchunks, s->M = M;
    return 0;
}

static inline void pipe_sets_free(PipeSets *s) {
    free(s->set_of), free(s->busy);
    memset(s, 0, sizeof(*s));
}

// the set micro-batch mb holds on chunk k, -1 when none
static inline int pipe_sets_index(const PipeSets *s, int mb, int k) { return s->set_of[mb * s->nchunks + k]; }

// the set of mb on chunk k, taken from the free ones when it holds none yet;
// -1 when none is free
static inline int pipe_sets_take(PipeSets *s, int mb, int k) {
    int key = mb * s->nchunks + k;
    if (s->set_of[key] >= 0) return s->set_of[key];
    int i = 0;
    while (i < s->nsets && s->busy[i]) i++;
    if (i == s->nsets) return -1;
    s->busy[i] = 1;
    s->set_of[key] = i;
    if (++s->held > s->peak) s->peak = s->held;
    return i;
}

// mb's set on chunk k free again (nothing when it holds none)
static inline void pipe_sets_give_back(PipeSets *s, int mb, int k) {
    int key = mb * s->nchunks + k;
    if (s->set_of[key] < 0) return;
    s->busy[s->set_of[key]] = 0;
    s->set_of[key] = -1;
    s->held--;
}

// the activation sets a stage's plan holds at once (PipeSets' rule). A step
// posts its receive, runs its op, then posts its send and the receive
// paired with it. Returns the peak, or -1 out of memory.
static inline int pipeline_plan_sets(const PipeLayout *pl, const PipeStep *plan, int n) {
    int split = pipeline_splits_backward(pl);
    PipeSets sets;
    if (pipe_sets_init(&sets, pl->M * pl->V, pl->V, pl->M) != 0) return -1;
    for (int i = 0; i < n; i++) {
        const PipeStep *st = &plan[i];
        PipeOp op = st->op;
        if (st->recv.peer >= 0 && st->recv.channel == CH_ACTIVATION) pipe_sets_take(&sets, st->recv.mb, st->recv.chunk);
        if (op.kind == PIPE_F) pipe_sets_take(&sets, op.mb, op.chunk);
        if ((op.kind == PIPE_B && !split) || op.kind == PIPE_W) pipe_sets_give_back(&sets, op.mb, op.chunk);
        PipeMsg next = st->next_recv;
        if (st->send.peer >= 0 && next.peer >= 0 && next.channel == CH_ACTIVATION)
            pipe_sets_take(&sets, next.mb, next.chunk);
    }
    int peak = sets.peak;
    pipe_sets_free(&sets);
    return peak;
}

// stage `stage`'s plan as text, "F0s F1x B0 rB1": each op (pipe_op_text)
// with r before it when it receives its input alone first, and after it s
// when it sends its output alone, x when it sends it in one exchange with
// the next op's input; l before or after, for a hand-off within the stage.
// Writes at most len bytes (cut short if need be); returns buf.
static inline const char *pipeline_plan_text(int stage, const PipeStep *plan, int n, char *buf, size_t len) {
    size_t at = 0;
    if (len > 0) buf[0] = '\0';
    for (int i = 0; i < n && at < len; i++) {
        const PipeStep *st = &plan[i];
        char op[32];
        const char *in = st->recv.peer < 0 ? "" : st->recv.peer == stage ? "l" : "r";
        const char *out = st->send.peer < 0 ? "" : st->send.peer == stage ? "l" : st->next_recv.peer >= 0 ? "x" : "s";
        if (st->op.kind == PIPE_MSG) snprintf(op, sizeof(op), "-");  // a step with only messages
        else pipe_op_text(st->op, op, sizeof(op));
        at += (size_t)snprintf(buf + at, len - at, "%s%s%s%s", i ? " " : "", in, op, out);
    }
    return buf;
}

// pipeline_check: plays pp stages' plans (stage s's steps[s] steps at
// plans + s * stride; steps NULL: stride steps each)
// against each other as the transport's worst case: a send completes only
// when the peer posts the matching receive, an exchange posts its send and
// its receive together and completes once both have matched, and the ops
// take no time. A hand-off within a stage completes at once, and its
// receive later finds it there, or waits forever. A send to stage p meets
// the receive stage p posts from this stage; they must agree on the
// channel, the micro-batch and the receiver's chunk, and the k-th message
// into one chunk of a stage on one channel must be micro-batch k (messages
// on a link arrive in order, and activation sets are reused in micro-batch
// order). A message goes to a neighbour, stage s-1 or s+1, or with
// interleaved between the last stage and stage 0. Returns the number of
// messages the transport carries (hand-offs not counted), every one
// matched once, or -1 with a line in err: a mismatch, or a deadlock naming
// what each stuck stage waits for.
enum { PIPE_CHECK_MAXP = 64 };

// what a stage at step st has posted: in phase 0 its lone receive, in phase
// 1 its send and the receive that goes with it
static inline void pipe_posted(const PipeStep *st, int phase, PipeMsg *out, PipeMsg *in) {
    *out = phase == 0 ? PIPE_NONE : st->send;
    *in = phase == 0 ? st->recv : st->next_recv;
}

// "activation 3"; for a chunk other than 0, "activation 3 for chunk 1"
static inline const char *pipe_msg_text(PipeMsg m, char *buf, size_t len) {
    if (m.chunk == 0) snprintf(buf, len, "%s %d", channel_name(m.channel), m.mb);
    else snprintf(buf, len, "%s %d for chunk %d", channel_name(m.channel), m.mb, m.chunk);
    return buf;
}

// where the messages into chunk m.chunk of stage p on m's channel are
// counted, or -1 when m names no pipeline channel or no chunk
static inline int pipe_count_slot(int p, PipeMsg m) {
    if ((m.channel != CH_ACTIVATION && m.channel != CH_GRADIENT) || m.chunk < 0 || m.chunk >= PIPE_MAXV) return -1;
    return (p * 2 + (m.channel == CH_GRADIENT)) * PIPE_MAXV + m.chunk;
}

// the checker's state: stage s is at step at[s] (steps_of[s]: finished) in
// phase[s]; sent[s], got[s]: that phase's send, receive has matched.
// count[slot]: the messages so far into a chunk of a stage on a channel
// (pipe_count_slot), taken[slot] how many of them a hand-off's receive has
// taken
typedef struct {
    int pp, stride, ring, messages;
    const PipeStep *plans;
    int steps_of[PIPE_CHECK_MAXP], at[PIPE_CHECK_MAXP], phase[PIPE_CHECK_MAXP];
    int sent[PIPE_CHECK_MAXP], got[PIPE_CHECK_MAXP];
    int count[PIPE_CHECK_MAXP * 2 * PIPE_MAXV], taken[PIPE_CHECK_MAXP * 2 * PIPE_MAXV];
} PipeCheck;

static inline const PipeStep *pipe_check_step(const PipeCheck *c, int s) { return &c->plans[s * c->stride + c->at[s]]; }

// what stage s has posted, if it may be posted at all: 0, or -1 with a line
static inline int pipe_check_shape(const PipeCheck *c, int s, PipeMsg out, PipeMsg in, char *err, size_t errlen) {
    int pp = c->pp;
    char op[32];
    pipe_op_text(pipe_check_step(c, s)->op, op, sizeof(op));
    if ((out.peer >= 0 && (out.peer >= pp || pipe_count_slot(out.peer, out) < 0)) ||
        (in.peer >= 0 && (in.peer >= pp || pipe_count_slot(s, in) < 0))) {
        snprintf(err, errlen, "stage %d step %d (%s): a message with no such stage, channel or chunk", s, c->at[s], op);
        return -1;
    }
    if (out.peer < 0 && in.peer >= 0 && c->phase[s] == 1) {
        snprintf(err, errlen, "stage %d step %d (%s): an exchange's receive without a send", s, c->at[s], op);
        return -1;
    }
    if ((out.peer == s && in.peer >= 0) || (c->phase[s] == 1 && in.peer == s)) {
        snprintf(err, errlen, "stage %d step %d (%s): a hand-off within the stage in an exchange", s, c->at[s], op);
        return -1;
    }
    if (out.peer >= 0 && out.peer != s) {
        int p = out.peer;
        int near = p == s - 1 || p == s + 1 || (c->ring && ((s == pp - 1 && p == 0) || (s == 0 && p == pp - 1)));
        if (!near) {
            snprintf(err, errlen, "stage %d step %d (%s): sends to stage %d, not a neighbour", s, c->at[s], op, p);
            return -1;
        }
    }
    return 0;
}

// stage s's posted messages that can complete now, completed: a hand-off's
// receive that finds its message, a hand-off, a send that meets its peer's
// receive. 1 when one did, 0 when none, -1 with a line on a mismatch.
static inline int pipe_check_match(PipeCheck *c, int s, PipeMsg out, PipeMsg in, char *err, size_t errlen) {
    int progress = 0;
    char a[64], b[64];
    if (in.peer == s && !c->got[s]) {
        int slot = pipe_count_slot(s, in);  // >= 0: pipe_check_shape
        if (slot >= 0 && c->taken[slot] < c->count[slot]) {
            if (in.mb != c->taken[slot]) {
                snprintf(err, errlen, "mismatch: stage %d takes %s from itself, where its next hand-off there is micro-batch %d",
                         s, pipe_msg_text(in, a, sizeof(a)), c->taken[slot]);
                return -1;
            }
            c->got[s] = 1, c->taken[slot]++, progress = 1;
        }
    }
    if (out.peer < 0 || c->sent[s]) return progress;
    int p = out.peer, slot = pipe_count_slot(p, out);
    if (slot < 0) return -1;  // pipe_check_shape said why
    if (p == s) {  // a hand-off
        if (out.mb != c->count[slot]) {
            snprintf(err, errlen, "mismatch: stage %d hands %s to itself as its hand-off %d", s,
                     pipe_msg_text(out, a, sizeof(a)), c->count[slot]);
            return -1;
        }
        c->sent[s] = 1, c->count[slot]++;
        return 1;
    }
    if (c->at[p] >= c->steps_of[p] || c->got[p]) return progress;
    PipeMsg peer_out, want;
    pipe_posted(pipe_check_step(c, p), c->phase[p], &peer_out, &want);
    if (want.peer != s) return progress;
    if (want.channel != out.channel || want.mb != out.mb || want.chunk != out.chunk || out.mb != c->count[slot]) {
        snprintf(err, errlen, "mismatch: stage %d sends %s as its message %d to stage %d, which receives %s", s,
                 pipe_msg_text(out, a, sizeof(a)), c->count[slot], p, pipe_msg_text(want, b, sizeof(b)));
        return -1;
    }
    c->sent[s] = c->got[p] = 1;
    c->count[slot]++;
    c->messages++;
    return 1;
}

// every stage whose posted messages have all matched moves on; 1 when one did
static inline int pipe_check_advance(PipeCheck *c) {
    int progress = 0;
    for (int s = 0; s < c->pp; s++) {
        if (c->at[s] >= c->steps_of[s]) continue;
        PipeMsg out, in;
        pipe_posted(pipe_check_step(c, s), c->phase[s], &out, &in);
        if ((out.peer >= 0 && !c->sent[s]) || (in.peer >= 0 && !c->got[s])) continue;
        if (c->phase[s] == 0) c->phase[s] = 1;
        else c->phase[s] = 0, c->at[s]++;
        c->sent[s] = c->got[s] = 0;
        progress = 1;
    }
    return progress;
}

// the stages that have not finished, each with what it waits for, in err
// ("deadlock: stage 1 at B3 receives ..."); returns how many
static inline int pipe_check_stuck(const PipeCheck *c, char *err, size_t errlen) {
    int stuck = 0;
    size_t len = 0;
    char op[32], a[64];
    if (errlen > 0) err[0] = '\0';
    for (int s = 0; s < c->pp; s++) {
        if (c->at[s] >= c->steps_of[s]) continue;
        const PipeStep *st = pipe_check_step(c, s);
        PipeMsg out, in;
        pipe_posted(st, c->phase[s], &out, &in);
        if (len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%sstage %d at %s", stuck ? "; " : "deadlock: ", s,
                                    pipe_op_text(st->op, op, sizeof(op)));
        int sending = out.peer >= 0 && !c->sent[s];
        if (sending && len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, " sends %s to stage %d", pipe_msg_text(out, a, sizeof(a)), out.peer);
        if (in.peer >= 0 && !c->got[s] && len < errlen) {
            if (in.peer == s)
                len += (size_t)snprintf(err + len, errlen - len, "%s takes %s from itself", sending ? " and" : "",
                                        pipe_msg_text(in, a, sizeof(a)));
            else
                len += (size_t)snprintf(err + len, errlen - len, "%s receives %s from stage %d", sending ? " and" : "",
                                        pipe_msg_text(in, a, sizeof(a)), in.peer);
        }
        stuck++;
    }
    return stuck;
}

static inline int pipeline_check(const PipeLayout *pl, int stride, const int *steps, const PipeStep *plans, char *err,
                                 size_t errlen) {
    if (pl->pp < 1 || pl->pp > PIPE_CHECK_MAXP || stride < 0) {
        snprintf(err, errlen, "pp %d, n %d: the checker takes pp 1..%d", pl->pp, stride, PIPE_CHECK_MAXP);
        return -1;
    }
    PipeCheck c;
    memset(&c, 0, sizeof(c));
    c.pp = pl->pp, c.stride = stride, c.plans = plans, c.ring = pl->schedule == PIPE_INTERLEAVED;
    for (int s = 0; s < c.pp; s++) c.steps_of[s] = steps != NULL ? steps[s] : stride;
    for (int progress = 1; progress;) {
        progress = 0;
        // every posted send that meets its peer's posted receive completes
        // both; a hand-off completes at once, its receive once it is there
        for (int s = 0; s < c.pp; s++) {
            if (c.at[s] >= c.steps_of[s]) continue;
            PipeMsg out, in;
            pipe_posted(pipe_check_step(&c, s), c.phase[s], &out, &in);
            if (pipe_check_shape(&c, s, out, in, err, errlen) != 0) return -1;
            int moved = pipe_check_match(&c, s, out, in, err, errlen);
            if (moved < 0) return -1;
            progress |= moved;
        }
        progress |= pipe_check_advance(&c);
    }
    // whoever has not finished is stuck
    return pipe_check_stuck(&c, err, errlen) ? -1 : c.messages;
}

#endif
