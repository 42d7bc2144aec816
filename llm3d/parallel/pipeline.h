/*
 * llm3d/parallel/pipeline.h: the pipeline schedules and their messages, the
 * same for both trainers.
 *
 * defines:
 *   PipeOp, pipe_op       one op of a stage: a forward or a backward of a
 *                         micro-batch
 *   pipeline_schedule     the order of a stage's forwards and backwards,
 *                         gpipe or 1f1b
 *   pipeline_inflight     the activation sets a stage needs
 *   pipeline_bubble       the idle fraction of a step
 *   pipeline_find         where an op sits in a stage's ops
 *   pipeline_play, pipeline_simulate
 *                         the stages played against each other in time, for
 *                         the tests and dev/pipeline_chart
 *   PipeMsg, PIPE_NONE, pipe_input, pipe_output
 *                         a message to or from a stage (or none): what an op
 *                         needs first, and what it hands on
 *   PipeStep, pipeline_plan
 *                         the messages a stage posts around each op, sends
 *                         paired with receives
 *   pipeline_plan_text    a stage's plan as text, "F0s F1x B0 rB1"
 *   pipeline_check        the plans played with sends that block, which finds
 *                         a mismatch or a deadlock
 *
 * Pure C with no I/O: it knows stages and micro-batches, not ranks, models
 * or transports.
 * Header-only (llm.c style): every function is static inline.
 */
#ifndef LLM3D_PIPELINE_H
#define LLM3D_PIPELINE_H

#include "secure.h"  // the message channels: CH_ACTIVATION, CH_GRADIENT, channel_name

#include <stddef.h>
#include <stdio.h>

// ----------------------------------------------------------------------------
// pipeline schedules: the order in which stage `stage` of pp runs the forward
// (F) and backward (B) passes of the M micro-batches of one step. Both
// trainers run exactly this list; doc/parallel.md draws it as a time chart.
//   gpipe: F0 F1 .. F(M-1) B0 B1 .. B(M-1)         (M activation sets)
//   1f1b:  pp - stage - 1 forwards to fill the pipe, then one forward and one
//          backward in turn, then the remaining backwards (PipeDream-flush);
//          at most pp - stage micro-batches are in flight, so that many
//          activation sets suffice.
// No order deadlocks: a stage's k-th forward needs only forwards k of the
// stages before it, its k-th backward only backwards k of the stages after,
// and every stage runs its forwards and its backwards in micro-batch order.

typedef struct { int forward, mb; } PipeOp;

static inline PipeOp pipe_op(int forward, int mb) { PipeOp op; op.forward = forward; op.mb = mb; return op; }

// fills ops (2M entries) and returns their count, 2M
static inline int pipeline_schedule(int gpipe, int pp, int stage, int M, PipeOp *ops) {
    int n = 0, next_f = 0, next_b = 0;
    int warmup = gpipe ? M : pp - stage - 1 < M ? pp - stage - 1 : M;
    while (next_f < warmup) ops[n++] = pipe_op(1, next_f++);
    while (next_f < M) {
        ops[n++] = pipe_op(1, next_f++);
        ops[n++] = pipe_op(0, next_b++);
    }
    while (next_b < M) ops[n++] = pipe_op(0, next_b++);
    return n;
}

// activation sets a stage needs: the most micro-batches between their forward and backward
static inline int pipeline_inflight(int gpipe, int pp, int stage, int M) {
    int k = gpipe ? M : pp - stage;
    return k < M ? k : M;
}

// the idle fraction of a step when F and B take the same time on every stage
static inline double pipeline_bubble(int pp, int M) { return (double)(pp - 1) / (M + pp - 1); }

// where (forward, mb) sits in a stage's n ops; -1 if it is not there
static inline int pipeline_find(const PipeOp *ops, int n, int forward, int mb) {
    for (int i = 0; i < n; i++)
        if (ops[i].forward == forward && ops[i].mb == mb) return i;
    return -1;
}

// pipeline_play: plays one step of pp stages against each other, each stage
// running its 2M ops (ops + s * 2M) in order; for the tests and
// dev/pipeline_chart. start (pp x 2M) gets the time each op starts: once the
// stage's previous op has ended and the op's input is there. Forward k of
// stage s needs forward k of stage s-1 (the activations), backward k needs
// backward k of stage s+1 (their gradient) and forward k of its own stage.
// A message takes no time and a send never blocks (the host backend's do,
// above 512 KiB: pipeline_check below plays the messages with sends that
// block; doc/parallel.md, "And the transport"). Returns the time the
// step ends, or -1 when the stages are stuck (some op can never run).
static inline int pipeline_play(int pp, int M, int f_time, int b_time, const PipeOp *ops, int *start) {
    if (pp < 1 || M < 1) return -1;
    int n = 2 * M;
    for (int i = 0; i < pp * n; i++) start[i] = -1;
    // sweep the stages, each running ops while their inputs are there, until
    // a sweep runs nothing
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            const PipeOp *my = ops + s * n;
            int *my_start = start + s * n;
            for (int i = 0; i < n; i++) {
                if (my_start[i] >= 0) continue;
                int t = i == 0 ? 0 : my_start[i - 1] + (my[i - 1].forward ? f_time : b_time);
                int from = my[i].forward ? s - 1 : s + 1;  // the stage that sends this op its input
                if (from >= 0 && from < pp) {
                    int j = pipeline_find(ops + from * n, n, my[i].forward, my[i].mb);
                    if (j < 0 || start[from * n + j] < 0) break;
                    int arrives = start[from * n + j] + (my[i].forward ? f_time : b_time);
                    if (arrives > t) t = arrives;
                }
                if (!my[i].forward) {  // the activations of its own forward, which runs earlier in the list
                    int j = pipeline_find(my, n, 1, my[i].mb);
                    if (j < 0 || j > i) break;
                }
                my_start[i] = t;
                progress = 1;
            }
        }
    }
    int end = 0;
    for (int s = 0; s < pp; s++) {
        const int last = s * n + n - 1;
        if (start[last] < 0) return -1;
        int stage_end = start[last] + (ops[last].forward ? f_time : b_time);
        if (stage_end > end) end = stage_end;
    }
    return end;
}

// pipeline_simulate: every stage's schedule into ops (pp x 2M), then plays it
static inline int pipeline_simulate(int gpipe, int pp, int M, int f_time, int b_time, PipeOp *ops, int *start) {
    if (pp < 1 || M < 1) return -1;
    for (int s = 0; s < pp; s++) pipeline_schedule(gpipe, pp, s, M, ops + s * 2 * M);
    return pipeline_play(pp, M, f_time, b_time, ops, start);
}

// the message plan: which messages a stage posts around each op, and which
// of them go together. A send blocks once its message outgrows the host
// ring (and on NCCL), so two neighbours that both send first wait on each
// other, as 1f1b's neighbours do where a forward meets a backward. The plan
// posts such a send together with the receive of the next op's input, when
// that input comes from the same neighbour, as one exchange (comm_sendrecv;
// Megatron's send_forward_recv_backward and send_backward_recv_forward).
// Both trainers post exactly these messages; pipeline_check plays them.

typedef struct { int peer, channel, mb; } PipeMsg;  // to or from stage peer; peer -1: no message

typedef struct {
    PipeOp op;
    PipeMsg recv;       // before the op: its input, alone (none on the edge stage, or when it came with the exchange before)
    PipeMsg send;       // after the op: its output (none on the edge stage)
    PipeMsg next_recv;  // posted with send as one exchange: the next op's input (none: send alone)
} PipeStep;

static inline PipeMsg pipe_msg(int peer, int channel, int mb) { PipeMsg m; m.peer = peer; m.channel = channel; m.mb = mb; return m; }
static const PipeMsg PIPE_NONE = {-1, 0, 0};

// what op needs first: a forward, stage-1's activations; a backward, stage+1's gradient
static inline PipeMsg pipe_input(int pp, int stage, PipeOp op) {
    if (op.forward) return stage > 0 ? pipe_msg(stage - 1, CH_ACTIVATION, op.mb) : PIPE_NONE;
    return stage < pp - 1 ? pipe_msg(stage + 1, CH_GRADIENT, op.mb) : PIPE_NONE;
}

// what op hands on: a forward, its output to stage+1; a backward, its input's gradient to stage-1
static inline PipeMsg pipe_output(int pp, int stage, PipeOp op) {
    if (op.forward) return stage < pp - 1 ? pipe_msg(stage + 1, CH_ACTIVATION, op.mb) : PIPE_NONE;
    return stage > 0 ? pipe_msg(stage - 1, CH_GRADIENT, op.mb) : PIPE_NONE;
}

// fills plan (n entries) for a stage's n ops; returns n
static inline int pipeline_plan(int pp, int stage, const PipeOp *ops, int n, PipeStep *plan) {
    PipeMsg arrived = PIPE_NONE;  // the input that came with the previous exchange
    for (int i = 0; i < n; i++) {
        PipeStep *st = &plan[i];
        st->op = ops[i];
        st->recv = arrived.peer >= 0 ? PIPE_NONE : pipe_input(pp, stage, ops[i]);
        st->send = pipe_output(pp, stage, ops[i]);
        PipeMsg next = i + 1 < n ? pipe_input(pp, stage, ops[i + 1]) : PIPE_NONE;
        st->next_recv = st->send.peer >= 0 && next.peer == st->send.peer ? next : PIPE_NONE;
        arrived = st->next_recv;
    }
    return n;
}

// a stage's plan as text, "F0s F1x B0 rB1": each op with r before it when
// it receives its input alone first, and after it s when it sends its
// output alone, x when it sends it in one exchange with the next op's input.
// Writes at most len bytes (cut short if need be); returns buf.
static inline const char *pipeline_plan_text(const PipeStep *plan, int n, char *buf, size_t len) {
    size_t at = 0;
    if (len > 0) buf[0] = '\0';
    for (int i = 0; i < n && at < len; i++) {
        const PipeStep *st = &plan[i];
        at += (size_t)snprintf(buf + at, len - at, "%s%s%c%d%s", i ? " " : "", st->recv.peer >= 0 ? "r" : "",
                               st->op.forward ? 'F' : 'B', st->op.mb,
                               st->send.peer < 0 ? "" : st->next_recv.peer >= 0 ? "x" : "s");
    }
    return buf;
}

// pipeline_check: plays pp stages' plans (n steps each, plans + s * n)
// against each other as the transport's worst case: a send completes only
// when the peer posts the matching receive, an exchange posts its send and
// its receive together and completes once both have matched, and the ops
// take no time. A send to stage p meets the receive stage p posts from this
// stage; they must agree on the channel and the micro-batch, and the k-th
// message from one stage to another must be micro-batch k (messages on a
// link arrive in order, and activation sets are reused in micro-batch
// order). Returns the number of messages, every one matched once, or -1
// with a line in err: a mismatch, or a deadlock naming what each stuck
// stage waits for.
enum { PIPE_CHECK_MAXP = 64 };

// what a stage at step st has posted: in phase 0 its lone receive, in phase
// 1 its send and the receive that goes with it
static inline void pipe_posted(const PipeStep *st, int phase, PipeMsg *out, PipeMsg *in) {
    *out = phase == 0 ? PIPE_NONE : st->send;
    *in = phase == 0 ? st->recv : st->next_recv;
}

static inline int pipeline_check(int pp, int n, const PipeStep *plans, char *err, size_t errlen) {
    if (pp < 1 || pp > PIPE_CHECK_MAXP || n < 0) {
        snprintf(err, errlen, "pp %d, n %d: the checker takes pp 1..%d", pp, n, PIPE_CHECK_MAXP);
        return -1;
    }
    // stage s is at step at[s] (n: finished) in phase[s]; sent[s], got[s]:
    // that phase's send, receive has matched; to_next[s], to_prev[s]: the
    // messages so far from s to s+1, to s-1
    int at[PIPE_CHECK_MAXP], phase[PIPE_CHECK_MAXP], sent[PIPE_CHECK_MAXP], got[PIPE_CHECK_MAXP];
    int to_next[PIPE_CHECK_MAXP], to_prev[PIPE_CHECK_MAXP];
    for (int s = 0; s < pp; s++) at[s] = phase[s] = sent[s] = got[s] = to_next[s] = to_prev[s] = 0;
    int messages = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        // every posted send that meets its peer's posted receive completes both
        for (int s = 0; s < pp; s++) {
            if (at[s] >= n || sent[s]) continue;
            const PipeStep *st = &plans[s * n + at[s]];
            PipeMsg out, in;
            pipe_posted(st, phase[s], &out, &in);
            if (out.peer < 0 && in.peer >= 0 && phase[s] == 1) {
                snprintf(err, errlen, "stage %d step %d (%c%d): an exchange's receive without a send", s, at[s],
                         st->op.forward ? 'F' : 'B', st->op.mb);
                return -1;
            }
            if (out.peer < 0) continue;
            int p = out.peer;
            if ((p != s - 1 && p != s + 1) || p < 0 || p >= pp) {
                snprintf(err, errlen, "stage %d step %d (%c%d): sends to stage %d, not a neighbour", s, at[s],
                         st->op.forward ? 'F' : 'B', st->op.mb, p);
                return -1;
            }
            if (at[p] >= n || got[p]) continue;
            PipeMsg peer_out, want;
            pipe_posted(&plans[p * n + at[p]], phase[p], &peer_out, &want);
            if (want.peer != s) continue;
            int *count = p == s + 1 ? &to_next[s] : &to_prev[s];
            if (want.channel != out.channel || want.mb != out.mb || out.mb != *count) {
                snprintf(err, errlen, "mismatch: stage %d sends %s %d as its message %d to stage %d, which receives %s %d", s,
                         channel_name(out.channel), out.mb, *count, p, channel_name(want.channel), want.mb);
                return -1;
            }
            sent[s] = got[p] = 1;
            (*count)++;
            messages++;
            progress = 1;
        }
        // every stage whose posted messages have all matched moves on
        for (int s = 0; s < pp; s++) {
            if (at[s] >= n) continue;
            PipeMsg out, in;
            pipe_posted(&plans[s * n + at[s]], phase[s], &out, &in);
            if ((out.peer >= 0 && !sent[s]) || (in.peer >= 0 && !got[s])) continue;
            if (phase[s] == 0) phase[s] = 1;
            else phase[s] = 0, at[s]++;
            sent[s] = got[s] = 0;
            progress = 1;
        }
    }
    // whoever has not finished is stuck: say what each one waits for
    int stuck = 0;
    size_t len = 0;
    if (errlen > 0) err[0] = '\0';
    for (int s = 0; s < pp; s++) {
        if (at[s] >= n) continue;
        const PipeStep *st = &plans[s * n + at[s]];
        PipeMsg out, in;
        pipe_posted(st, phase[s], &out, &in);
        if (len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%sstage %d at %c%d", stuck ? "; " : "deadlock: ", s,
                                st->op.forward ? 'F' : 'B', st->op.mb);
        int sending = out.peer >= 0 && !sent[s];
        if (sending && len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, " sends %s %d to stage %d", channel_name(out.channel), out.mb,
                                    out.peer);
        if (in.peer >= 0 && !got[s] && len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%s receives %s %d from stage %d", sending ? " and" : "",
                                    channel_name(in.channel), in.mb, in.peer);
        stuck++;
    }
    return stuck ? -1 : messages;
}

#endif
