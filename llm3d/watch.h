/*
 * watch.h: the job watching itself, between its steps. The rules are
 * written once, here; each trainer gathers what they judge over its own
 * communicator (train_gpt2.c's watch_report and consistency_check,
 * llm3d/cuda/train_gpt2cu/checks.cuh's).
 *
 * defines:
 *   the watch report (-wr): Watch, watch_init, watch_step_begin,
 *     watch_step_end, watch_add_wait, watch_due, watch_pack, watch_judge,
 *     watch_print, watch_free
 *   the faults that make work for it and for the check below, which the
 *     trainers act on: fault_slow_step (-fault slow), fault_drift_due
 *     (-fault drift)
 *   the gradient-norm rule (-gp, rogue workers): GRADS_RATIO, GradWatch,
 *     grads_init, grads_judge, grads_print, grads_stop, grads_free
 *   the consistency check (-ck): unit_digests, replica_tensor_name,
 *     replica_list, replicas_judge, print_replicas_disagree
 *   the pipeline's bubble measured (pp > 1): PipeTimes, pipe_times_start,
 *     pipe_times_add, PipeMeter, PIPE_METER_FLOATS, pipe_meter_init,
 *     pipe_meter_pack, pipe_meter_judge, pipe_meter_print, pipe_meter_free
 */
#ifndef LLM3D_WATCH_H
#define LLM3D_WATCH_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm3d/trainer.h"       // Job, die
#include "llm3d/gpt2.h"          // LogLine, Shard, UnitTable, unit_tensor, param_name
#include "secure.h"              // sha256
#include "llm3d/secure/fault.h"  // fault_fires, fault_slow_fires
#include "llm3d/parallel/grid.h"
#include "llm3d/parallel/shm_comm.h"  // wait_since
#include "llm3d/parallel/pipeline.h"  // pipeline_simulated_bubble

// ----------------------------------------------------------------------------
// the watch report (-wr N): a trainer that watches itself. Each rank times
// every step (report_step's ms) and, within it, the time it spent in the
// communicator's calls (wait: shm_comm.h's comm_wait_ms; the GPU trainer's
// NCCL mode counts its NCCL kernels instead, nccl_comm.h's nccl_wait_ms);
// compute is the rest. Every N steps the ranks all-gather their means over
// the steps since the last report (two floats each, MAC'd like every
// message), and rank 0 compares each rank with its peers, the ranks of its
// pipeline stage, which do the same work (its tp peers and dp replicas; all
// ranks when every stage is one rank):
//   - a straggler: compute above WATCH_RATIO times the peers' median and
//     at least WATCH_MIN_MS above it, in WATCH_REPORTS reports in a row. Its
//     peers then wait for it, so it is the slow one, not they.
//   - a rank that waits unusually: wait above WATCH_RATIO times the peers'
//     median, at least WATCH_MIN_MS above it and above WATCH_WAIT_SHARE of
//     its step, in WATCH_REPORTS reports in a row (a rank that waits for
//     something its peers do not).
// WATCH_MIN_MS keeps out what a busy machine's scheduler does to short
// steps (a few ms), and the run of reports what one bad moment does.
// Each is one line on stdout at every report while it lasts, and fields in
// that step's log line; a report that finds nothing prints and logs nothing.
// A job of one rank has nothing to compare and makes no reports.

#define WATCH_RATIO 1.5
#define WATCH_REPORTS 2
#define WATCH_WAIT_SHARE 0.25
#define WATCH_MIN_MS 5.0f
#define WATCH_FLOATS 2          // what each rank sends: compute and wait, ms per step
#define WATCH_LOG_ARRAYS 64     // the per-rank arrays go into the log up to this many ranks

typedef struct {
    int every;                  // -wr, 0 when off or for one rank
    int world, tp, pp, rank;    // the job's grid: rank r's stage is (r / tp) % pp
    int steps;                  // this rank: steps measured since the last report
    double step_ms, wait_ms;    // their sums
    double wait_before;         // the wait clock at the start of the step being measured
    float *all;                 // every rank's WATCH_FLOATS (rank-major), where the report all-gathers them
    int *slow_for, *wait_for;   // rank 0: the reports in a row in which each rank was slow / waited unusually
    float *medians;             // rank 0: each group of peers' median compute and wait (pp x WATCH_FLOATS)
    float *sorted;              // rank 0: one group's values being sorted for its median (world floats)
    char *fields, *lines;       // rank 0: this report's log fields and lines ("" when nothing was found)
    size_t fields_len, lines_len;
} Watch;

static void watch_init(Watch *w, const Job *job, const Grid *g) {
    memset(w, 0, sizeof(*w));
    w->every = g->world > 1 ? job->opt.watch_every : 0;
    w->world = g->world;
    w->tp = g->tp;
    w->pp = g->pp;
    w->rank = g->rank;
    if (w->every == 0) return;
    w->all = (float *)calloc((size_t)g->world * WATCH_FLOATS, sizeof(float));
    if (w->all == NULL) die(1, "out of memory for the watch report");
    if (g->rank != 0) return;
    w->slow_for = (int *)calloc((size_t)g->world, sizeof(int));
    w->wait_for = (int *)calloc((size_t)g->world, sizeof(int));
    w->medians = (float *)calloc((size_t)g->pp * WATCH_FLOATS, sizeof(float));
    w->sorted = (float *)calloc((size_t)g->world, sizeof(float));
    w->fields_len = 200 + (size_t)g->world * 40;
    w->lines_len = 200 + (size_t)g->world * 400;
    w->fields = (char *)calloc(w->fields_len, 1);
    w->lines = (char *)calloc(w->lines_len, 1);
    if (w->slow_for == NULL || w->wait_for == NULL || w->medians == NULL || w->sorted == NULL || w->fields == NULL ||
        w->lines == NULL)
        die(1, "out of memory for the watch report");
}

// the step being measured starts (wait_now: the wait clock) and ends
static void watch_step_begin(Watch *w, double wait_now) { w->wait_before = wait_now; }

static void watch_step_end(Watch *w, double step_ms, double wait_now) {
    w->steps++;
    w->step_ms += step_ms;
    w->wait_ms += wait_since(&w->wait_before, wait_now);
}

// for a trainer whose wait clock is read at the report rather than around
// each step (the GPU trainer's: the GPU times its NCCL calls as it does
// them): the wait of the steps since the last report
static void watch_add_wait(Watch *w, double ms) { w->wait_ms += ms; }

// a report after this step: every -wr steps, counted from step 0
static int watch_due(const Watch *w, int step) { return w->every > 0 && (step + 1) % w->every == 0; }

// this rank's compute and wait, ms per step since the last report, for the
// all-gather; the sums start afresh
static void watch_pack(Watch *w, float out[WATCH_FLOATS]) {
    double n = w->steps > 0 ? w->steps : 1;
    double wait = w->wait_ms < 0 ? 0 : w->wait_ms;
    double compute = w->step_ms - wait;
    out[0] = (float)((compute > 0 ? compute : 0) / n);
    out[1] = (float)(wait / n);
    w->steps = 0;
    w->step_ms = w->wait_ms = 0.0;
}

static int watch_compare_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

// the group of peers rank r is compared with: its pipeline stage, or group
// 0, all the ranks, when each stage is one rank
static int watch_group(const Watch *w, int r) {
    int alone = w->world / w->pp < 2;
    return alone ? 0 : (r / w->tp) % w->pp;
}

// each group's median of value k (0 compute, 1 wait), once per report, into
// w->medians[group * WATCH_FLOATS + k] (all: world x WATCH_FLOATS, rank-major)
static void watch_peer_medians(Watch *w, const float *all) {
    float *v = w->sorted;
    for (int group = 0; group < w->pp; group++) {
        for (int k = 0; k < WATCH_FLOATS; k++) {
            int n = 0;
            for (int q = 0; q < w->world; q++)
                if (watch_group(w, q) == group) v[n++] = all[(size_t)q * WATCH_FLOATS + k];
            if (n == 0) continue;  // each stage one rank: group 0 holds them all
            qsort(v, (size_t)n, sizeof(float), watch_compare_float);
            w->medians[group * WATCH_FLOATS + k] = n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
        }
    }
}

// appends to one of w's texts (format checked as printf's)
static __attribute__((format(printf, 3, 4))) void watch_add(char *buf, size_t len, const char *fmt, ...) {
    size_t at = strlen(buf);
    if (at + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + at, len - at, fmt, ap);
    va_end(ap);
}

// the JSON array "name": [ranks whose count in `in_a_row` reached WATCH_REPORTS]
static void watch_field_ranks(Watch *w, const char *name, const int *in_a_row) {
    int any = 0;
    for (int r = 0; r < w->world; r++) {
        if (in_a_row[r] < WATCH_REPORTS) continue;
        if (!any) watch_add(w->fields, w->fields_len, "%s\"%s\": [", w->fields[0] ? ", " : "", name);
        watch_add(w->fields, w->fields_len, "%s%d", any ? ", " : "", r);
        any = 1;
    }
    if (any) watch_add(w->fields, w->fields_len, "]");
}

// rank 0, at a report after `step`: all holds every rank's two floats
// (watch_pack). Judges each rank against its peers, keeps the runs of slow
// and waiting reports, and when something is found fills the lines to print
// (watch_print) and the log fields, which l then carries.
static void watch_judge(Watch *w, int step, const float *all, LogLine *l) {
    w->fields[0] = w->lines[0] = '\0';
    watch_peer_medians(w, all);
    for (int r = 0; r < w->world; r++) {
        float compute = all[(size_t)r * WATCH_FLOATS], wait = all[(size_t)r * WATCH_FLOATS + 1];
        const float *median = w->medians + (size_t)watch_group(w, r) * WATCH_FLOATS;
        float mc = median[0], mw = median[1];
        int slow = compute > WATCH_RATIO * mc && compute - mc >= WATCH_MIN_MS;
        int waits = wait > WATCH_RATIO * mw && wait - mw >= WATCH_MIN_MS && wait > WATCH_WAIT_SHARE * (compute + wait);
        w->slow_for[r] = slow ? w->slow_for[r] + 1 : 0;
        w->wait_for[r] = waits ? w->wait_for[r] + 1 : 0;
        if (w->slow_for[r] >= WATCH_REPORTS)
            watch_add(w->lines, w->lines_len, "step %d: rank %d is a straggler: compute %.0f ms/step against a median "
                      "of %.0f ms (%.1fx), for %d reports\n", step, r, compute, mc, mc > 0 ? compute / mc : 0.0f,
                      w->slow_for[r]);
        if (w->wait_for[r] >= WATCH_REPORTS)
            watch_add(w->lines, w->lines_len, "step %d: rank %d waits unusually: %.0f ms/step in communication against "
                      "a median of %.0f ms (%.1fx), for %d reports\n", step, r, wait, mw, mw > 0 ? wait / mw : 0.0f,
                      w->wait_for[r]);
    }
    if (w->lines[0] == '\0') return;
    watch_field_ranks(w, "stragglers", w->slow_for);
    watch_field_ranks(w, "waiting", w->wait_for);
    if (w->world <= WATCH_LOG_ARRAYS) {
        for (int k = 0; k < WATCH_FLOATS; k++) {
            watch_add(w->fields, w->fields_len, ", \"%s\": [", k == 0 ? "compute_ms" : "wait_ms");
            for (int r = 0; r < w->world; r++)
                watch_add(w->fields, w->fields_len, "%s%.1f", r ? ", " : "", all[(size_t)r * WATCH_FLOATS + k]);
            watch_add(w->fields, w->fields_len, "]");
        }
    }
    l->watch = w->fields;
}

// rank 0: the lines of the last report, if it found anything
static void watch_print(Watch *w) {
    if (w->lines == NULL || w->lines[0] == '\0') return;
    fputs(w->lines, stdout);
    fflush(stdout);
    w->lines[0] = '\0';
}

static void watch_free(Watch *w) {
    free(w->all);
    free(w->slow_for);
    free(w->wait_for);
    free(w->medians);
    free(w->sorted);
    free(w->fields);
    free(w->lines);
    memset(w, 0, sizeof(*w));
}

// ----------------------------------------------------------------------------
// the pipeline's bubble, measured (pp > 1), beside the simulator's for the
// same costs. Each rank times its pipeline step (pipeline_run): each op (F,
// B, W, the data a forward reads included) is busy; the pipeline's
// messages (its receives alone, its exchanges, its sends; almost all of it
// waiting in the receives: a send returns once its message is in the ring)
// are idle, and so is its tail, the time from its last message to the end
// of the latest stage's (a stage that is done while others still run, as
// 1f1b's last stage at the drain). So, as the simulator has it
// (pipeline_play), idle + busy is the step's pipeline time on every stage,
// and a stage's bubble is idle / (idle + busy). The ranks' ends are read
// on one clock: the host backend's ranks share one box's monotonic clock
// (train_gpt2cu times its steps on the GPU and places them on that clock:
// pipeline_run.cuh's pipe_clock_start and pipe_clock_read).
// Collectives inside an op (tp's all-reduces, ZeRO's gathers) are part of
// the op. After each step the ranks all-gather their figures
// (PIPE_METER_FLOATS each) and rank 0 judges: the measured bubble, the mean
// over the ranks of their bubbles (every stage has tp x dp ranks, so the
// mean over the stages), and its most; the op costs, each kind's mean over
// all the ops of all the ranks, in whole microseconds; and the simulator's
// bubble for those costs (pipeline_simulated_bubble: the mean, and the
// most, of its stages' idle / step). The step's log line gets "bubble",
// "bubble_sim" and "op_us"; at the end rank 0 prints the run's figures, the
// launch's first step left out when more followed (it maps the pages).

// a rank's pipeline step, timed by its trainer's pipeline_run
typedef struct {
    double op_ms[3];  // the F, B and W ops' time (PIPE_F, PIPE_B, PIPE_W)
    int op_n[3];      // how many of each
    double msg_ms;    // in the pipeline's messages
    double end_ms;    // when the step's last message was done (now_ms: one clock for the box)
} PipeTimes;

static void pipe_times_start(PipeTimes *t) { memset(t, 0, sizeof(*t)); }

// an op of kind `kind` (PIPE_F, PIPE_B, PIPE_W) that took ms
static void pipe_times_add(PipeTimes *t, int kind, double ms) {
    t->op_ms[kind] += ms;
    t->op_n[kind]++;
}

// what each rank sends after a step: busy and message ms, its end (a
// double as two floats: a monotonic clock in ms outgrows a float's 24 bits),
// then each kind's ms and count
enum { PM_BUSY, PM_MSG, PM_END_HI, PM_END_LO, PM_OPS, PIPE_METER_FLOATS = PM_OPS + 6 };

typedef struct {
    int on;                       // pp > 1
    int world, rank;
    PipeLayout pl;                // the step's schedule, with its micro-batches
    PipeTimes step;               // this rank's step: train_gpt2.c's pipeline_run fills it, train_gpt2cu's
                                  // pipe_clock_read after the step
    float *all;                   // every rank's PIPE_METER_FLOATS, where the trainer all-gathers them
    // rank 0: the run's sums, [0] over every step measured, [1] over those after the launch's first
    int steps, first_step, last_step;
    double *busy[2], *idle[2];    // per rank, ms
    double op_ms[2][3], op_n[2][3];
    char fields[160];             // the step's log fields
} PipeMeter;

static void pipe_meter_init(PipeMeter *pm, const Job *job, const Grid *g) {
    memset(pm, 0, sizeof(*pm));
    pm->on = g->pp > 1;
    pm->world = g->world;
    pm->rank = g->rank;
    pm->pl = pipe_layout((PipeSchedule)job->opt.pipe_schedule, g->pp, job->accum, job->opt.pipe_chunks);
    if (!pm->on) return;
    pm->all = (float *)calloc((size_t)g->world * PIPE_METER_FLOATS, sizeof(float));
    for (int k = 0; k < 2 && g->rank == 0; k++) {
        pm->busy[k] = (double *)calloc((size_t)g->world, sizeof(double));
        pm->idle[k] = (double *)calloc((size_t)g->world, sizeof(double));
        if (pm->busy[k] == NULL || pm->idle[k] == NULL) die(1, "out of memory for the bubble's figures");
    }
    if (pm->all == NULL) die(1, "out of memory for the bubble's figures");
}

// this rank's step for the all-gather
static void pipe_meter_pack(const PipeMeter *pm, float out[PIPE_METER_FLOATS]) {
    const PipeTimes *t = &pm->step;
    double busy = t->op_ms[0] + t->op_ms[1] + t->op_ms[2];
    out[PM_BUSY] = (float)busy;
    out[PM_MSG] = (float)t->msg_ms;
    out[PM_END_HI] = (float)t->end_ms;
    out[PM_END_LO] = (float)(t->end_ms - (double)out[PM_END_HI]);
    for (int k = 0; k < 3; k++) {
        out[PM_OPS + 2 * k] = (float)t->op_ms[k];
        out[PM_OPS + 2 * k + 1] = (float)t->op_n[k];
    }
}

// the op costs in whole microseconds from ms and counts of each kind: F and
// B at least 1, W 0 where the schedule has none
static void pipe_meter_costs(const double *ms, const double *n, int us[3]) {
    for (int k = 0; k < 3; k++) {
        double x = n[k] > 0 ? 1e3 * ms[k] / n[k] : 0.0;
        us[k] = x > 1e8 ? 100000000 : (int)(x + 0.5);
        if (k < 2 && us[k] < 1) us[k] = 1;
    }
}

// the simulator's bubble (mean and most) for costs us; -1 for both when
// the step would not fit the simulator's int microseconds
static void pipe_meter_simulate(const PipeMeter *pm, const int us[3], double *mean, double *most) {
    double span = ((double)us[0] + us[1] + us[2]) * pipeline_ops(&pm->pl) * pm->pl.pp;
    *mean = *most = -1.0;
    if (span < 1e9) pipeline_simulated_bubble(&pm->pl, us[0], us[1], us[2], mean, most);
}

// rank 0, after step `step`: all holds every rank's figures (rank-major).
// Adds them to the run's sums and gives l the step's log fields.
static void pipe_meter_judge(PipeMeter *pm, int step, const float *all, LogLine *l) {
    double last = -1e300, sum = 0.0, ms[3] = {0, 0, 0}, n[3] = {0, 0, 0};
    for (int r = 0; r < pm->world; r++) {
        const float *x = all + (size_t)r * PIPE_METER_FLOATS;
        double end = (double)x[PM_END_HI] + (double)x[PM_END_LO];
        last = end > last ? end : last;
    }
    int later = pm->steps > 0;  // the launch's first step goes into [0] only
    for (int r = 0; r < pm->world; r++) {
        const float *x = all + (size_t)r * PIPE_METER_FLOATS;
        double idle = x[PM_MSG] + (last - ((double)x[PM_END_HI] + (double)x[PM_END_LO])), busy = x[PM_BUSY];
        sum += idle + busy > 0 ? idle / (idle + busy) : 0.0;
        for (int k = 0; k <= later; k++) {
            pm->busy[k][r] += busy;
            pm->idle[k][r] += idle;
        }
        for (int j = 0; j < 3; j++) {
            ms[j] += x[PM_OPS + 2 * j];
            n[j] += x[PM_OPS + 2 * j + 1];
            for (int k = 0; k <= later; k++) {
                pm->op_ms[k][j] += x[PM_OPS + 2 * j];
                pm->op_n[k][j] += x[PM_OPS + 2 * j + 1];
            }
        }
    }
    if (pm->steps++ == 0) pm->first_step = step;
    pm->last_step = step;
    int us[3];
    double sim, sim_most;
    pipe_meter_costs(ms, n, us);
    pipe_meter_simulate(pm, us, &sim, &sim_most);
    snprintf(pm->fields, sizeof(pm->fields), "\"bubble\": %.4f, \"bubble_sim\": %.4f, \"op_us\": [%d, %d, %d]",
             sum / pm->world, sim, us[0], us[1], us[2]);
    if (sim < 0) snprintf(pm->fields, sizeof(pm->fields), "\"bubble\": %.4f", sum / pm->world);
    l->pipe = pm->fields;
}

// rank 0, at the end of the run: the run's measured bubble beside the
// simulator's for its mean op costs (and the formula's, F = B = W), one line
static void pipe_meter_print(const PipeMeter *pm) {
    if (!pm->on || pm->rank != 0 || pm->steps == 0) return;
    int k = pm->steps > 1, us[3];
    double mean = 0.0, most = 0.0, sim, sim_most;
    for (int r = 0; r < pm->world; r++) {
        double idle = pm->idle[k][r], busy = pm->busy[k][r], x = idle + busy > 0 ? idle / (idle + busy) : 0.0;
        mean += x / pm->world;
        most = x > most ? x : most;
    }
    pipe_meter_costs(pm->op_ms[k], pm->op_n[k], us);
    pipe_meter_simulate(pm, us, &sim, &sim_most);
    printf("pipeline bubble (%s, pp %d, %d micro-batches), steps %d..%d%s: measured %.4f mean, %.4f most of a rank; simulated %.4f mean, "
           "%.4f most, for F %d us, B %d us, W %d us (the ops' mean costs in this run); %.4f by the formula (F = B = W)\n",
           pipeline_name(pm->pl.schedule), pm->pl.pp, pm->pl.M, k ? pm->first_step + 1 : pm->first_step, pm->last_step,
           k ? " (the launch's first left out)" : "", mean, most, sim, sim_most, us[0], us[1], us[2],
           pipeline_bubble(&pm->pl));
    fflush(stdout);
}

static void pipe_meter_free(PipeMeter *pm) {
    free(pm->all);
    for (int k = 0; k < 2; k++) free(pm->busy[k]), free(pm->idle[k]);
    memset(pm, 0, sizeof(*pm));
}

// -fault slow:RANK:STEP: that rank sleeps FAULT_SLOW_MS in each of its steps
// from STEP on, inside the step's time, as a straggler would compute
static void fault_slow_step(const Job *job, int rank, int step) {
    if (!fault_slow_fires(&job->fault, rank, step)) return;
    if (step == job->fault.step || step == job->start)
        fprintf(stderr, "rank %d: fault slow: %d ms more in every step from step %d on\n", rank, FAULT_SLOW_MS, step);
    struct timespec ts = {FAULT_SLOW_MS / 1000, (long)(FAULT_SLOW_MS % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// -fault drift:RANK:STEP: whether this rank changes one of its parameters
// now, at the start of that step, before the step's consistency check
// (-ck): the first element of its first unit grows by FAULT_DRIFT_DELTA, as
// a bit flip in memory or a replica's bug would change it, unseen by the
// training itself
#define FAULT_DRIFT_DELTA 0.01f
static int fault_drift_due(const Job *job, int rank, int step) {
    if (job->fault.kind != FAULT_DRIFT || !fault_fires(&job->fault, rank, step)) return 0;
    fprintf(stderr, "rank %d: fault drift: the first parameter of this rank's first unit changed by %g at step %d\n",
            rank, FAULT_DRIFT_DELTA, step);
    return 1;
}

// ----------------------------------------------------------------------------
// rogue workers (-gp warn|skip|stop). Every step each rank's own gradient
// norm, of what it puts into the data-parallel reduction, before it
// (train_gpt2.c gathers them in the step's one all-reduce), is compared with
// its data-parallel peers': the ranks that hold the same part of the model in
// the other replicas (the same pipeline stage and tensor-parallel slice), so
// the same work on other data. A rank whose norm is above GRADS_RATIO times
// the median of its peers' norms (itself left out) is an outlier: a poisoned
// or broken replica's gradients, about to be summed into everyone's update.
// Not finite where the median is finite counts too. One step decides, so
// that -gp skip and stop act on the step itself. Batches of the same data
// vary a replica's norm by a few tens of percent, and a step's noise by
// less than 2x in the runs measured (doc/security.md): 8x reports none of
// that, and catches scaling by 8 or more. Each outlier is one line on
// stdout (rank 0), and the step's log line gets "grad_outliers" (their
// ranks) and "rank_norms" (every rank's, up to WATCH_LOG_ARRAYS ranks).
// Every rank judges the same all-reduced numbers, so all agree on a skip.
// Each norm is the one its rank reports of itself: a rank running code of
// its own can report a plausible one beside poisoned gradients (doc/
// security.md, "Rogue workers"), so the rule is for replicas that run as
// written with bad gradients.

#define GRADS_RATIO 8.0f

typedef struct {
    int world, dp, tp, pp;
    float *peers;               // one rank's peers' norms, sorted for the median (dp floats)
    char *fields, *lines;       // this step's log fields and lines ("" when nothing was found)
    size_t fields_len, lines_len;
} GradWatch;

static void grads_init(GradWatch *gw, const Grid *g) {
    memset(gw, 0, sizeof(*gw));
    gw->world = g->world;
    gw->dp = g->dp;
    gw->tp = g->tp;
    gw->pp = g->pp;
    gw->peers = (float *)calloc((size_t)g->dp, sizeof(float));
    gw->fields_len = 200 + (size_t)g->world * 24;
    gw->lines_len = 200 + (size_t)g->world * 400;
    gw->fields = (char *)calloc(gw->fields_len, 1);
    gw->lines = (char *)calloc(gw->lines_len, 1);
    if (gw->peers == NULL || gw->fields == NULL || gw->lines == NULL) die(1, "out of memory for the gradient-norm rule");
}

// grads_judge: norms holds every rank's own gradient norm of the step
// (world floats; NULL with dp 1: no peers, nothing to judge). Returns how
// many ranks are outliers; their lines and log fields go into gw, which l
// then carries. policy: -gp's, for the lines' ends.
static int grads_judge(GradWatch *gw, const float *norms, int step, int policy, LogLine *l) {
    gw->fields[0] = gw->lines[0] = '\0';
    if (norms == NULL || gw->dp < 2) return 0;
    int count = 0, stride = gw->tp * gw->pp;  // rank r's peers: r mod stride, + stride * d
    for (int r = 0; r < gw->world; r++) {
        int n = 0;
        for (int d = 0; d < gw->dp; d++) {
            int q = r % stride + d * stride;
            if (q != r) gw->peers[n++] = norms[q];
        }
        qsort(gw->peers, (size_t)n, sizeof(float), watch_compare_float);
        float median = n % 2 ? gw->peers[n / 2] : 0.5f * (gw->peers[n / 2 - 1] + gw->peers[n / 2]);
        if (!isfinite(median) || norms[r] <= GRADS_RATIO * median) continue;  // NaN and inf fail the test: outliers
        if (count++ == 0) watch_add(gw->fields, gw->fields_len, "\"grad_outliers\": [");
        watch_add(gw->fields, gw->fields_len, "%s%d", count > 1 ? ", " : "", r);
        char peers[200];
        size_t at = 0;
        for (int d = 0, k = 0; d < gw->dp && at < sizeof(peers); d++) {
            int q = r % stride + d * stride;
            if (q == r) continue;
            at += (size_t)snprintf(peers + at, sizeof(peers) - at, k++ ? ", %d" : "%d", q);
        }
        static const char *act[] = {"the update is applied (-gp warn)", "the step's update is skipped (-gp skip)",
                                    "the job stops before the step's update (-gp stop)"};
        char times[48];
        if (isfinite(norms[r]) && median > 0) snprintf(times, sizeof(times), "%.1fx", norms[r] / median);
        else snprintf(times, sizeof(times), "far above");
        watch_add(gw->lines, gw->lines_len, "step %d: rank %d's own gradient norm %.4g is %s the median %.4g of its "
                  "data-parallel peers' (rank%s %s): poisoned or broken gradients? %s\n", step, r, norms[r], times,
                  median, gw->dp > 2 ? "s" : "", peers, act[policy]);
    }
    if (count == 0) return 0;
    watch_add(gw->fields, gw->fields_len, "]");
    if (gw->world <= WATCH_LOG_ARRAYS) {
        watch_add(gw->fields, gw->fields_len, ", \"rank_norms\": [");
        for (int r = 0; r < gw->world; r++) {
            if (isfinite(norms[r])) watch_add(gw->fields, gw->fields_len, "%s%.4g", r ? ", " : "", norms[r]);
            else watch_add(gw->fields, gw->fields_len, "%snull", r ? ", " : "");
        }
        watch_add(gw->fields, gw->fields_len, "]");
    }
    l->grads = gw->fields;
    return count;
}

// rank 0: the lines of this step's verdict, if it found anything
static void grads_print(GradWatch *gw) {
    if (gw->lines == NULL || gw->lines[0] == '\0') return;
    fputs(gw->lines, stdout);
    fflush(stdout);
    gw->lines[0] = '\0';
}

// -gp stop: whether the step's outliers end the job (their lines are out:
// grads_print); the caller then waits for every rank and exits 1, before
// the step's update (update_unless_skipped held it back) and any checkpoint
static int grads_stop(const Job *job, int outliers) { return outliers > 0 && job->opt.grad_policy == GP_STOP; }

static void grads_free(GradWatch *gw) {
    free(gw->peers);
    free(gw->fields);
    free(gw->lines);
    memset(gw, 0, sizeof(*gw));
}

// ----------------------------------------------------------------------------
// the data-parallel consistency check (-ck K): every K steps each replica
// hashes each of its parameter tensors (SHA-256 per tensor, in unit order:
// gpt2.h's unit_table_tensors of them), the digests are all-gathered over the dp group
// (MAC'd on the host backend), and replicas_judge says who differs: the
// ranks whose copy differs from the majority's, or, with two replicas or
// no majority, which copies differ from which, and the first tensor that
// differs. The trainers gather; the hashing and the verdict are written
// once, here.

// unit_digests: the SHA-256 of each tensor of a unit of this kind, 32 bytes
// each into out, from values, the unit's elements as this rank holds them
// (elem bytes each: the trainers' floats differ); returns how many
static int unit_digests(const GPT2Config *c, const Shard *s, int kind, const void *values, size_t elem, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)values;
    int count = unit_tensor_count(kind);
    for (int k = 0; k < count; k++) {
        size_t bytes = local_tensor_size(c, s, unit_tensor(kind, k)) * elem;
        Sha256 h;
        sha256_init(&h);
        sha256_update(&h, p, bytes);
        sha256_final(&h, out + 32 * (size_t)k);
        p += bytes;
    }
    return count;
}

// the name of tensor i of unit_table_tensors' order: "wte", "layer 3 qkvw"
static const char *replica_tensor_name(const UnitTable *ut, const Shard *s, int i, char *buf, size_t len) {
    for (int u = 0; u < ut->n; u++) {
        int kind = ut->units[u].kind, n = unit_tensor_count(kind);
        if (i >= n) {
            i -= n;
            continue;
        }
        if (kind >= U_LAYER0) snprintf(buf, len, "layer %d %s", unit_layer(s, &ut->units[u]), param_name(unit_tensor(kind, i)));
        else snprintf(buf, len, "%s", param_name(unit_tensor(kind, i)));
        return buf;
    }
    snprintf(buf, len, "tensor %d", i);
    return buf;
}

// the ranks of dp members whose class is c (class_of: per member), as "ranks 0, 1, 3" or "rank 2"
static void replica_list(const int *class_of, int c, const int *ranks, int dp, char *buf, size_t len) {
    int count = 0;
    for (int m = 0; m < dp; m++) count += class_of[m] == c;
    snprintf(buf, len, "rank%s", count > 1 ? "s" : "");
    int first = 1;
    for (int m = 0; m < dp; m++) {
        if (class_of[m] != c) continue;
        size_t at = strlen(buf);
        snprintf(buf + at, len - at, "%s%d", first ? " " : ", ", ranks[m]);
        first = 0;
    }
}

// replicas_judge: digests holds dp members' n tensor digests of 32 bytes
// (member-major); ranks their world ranks. 0 when every copy is the same;
// else 1 with msg naming who differs and the first tensor that differs.
static int replicas_judge(const uint8_t *digests, int dp, int n, const int *ranks, const UnitTable *ut, const Shard *s,
                          char *msg, size_t len) {
    size_t stride = (size_t)n * 32;
    int *class_of = (int *)calloc((size_t)dp, sizeof(int)), *size = (int *)calloc((size_t)dp, sizeof(int));
    if (class_of == NULL || size == NULL) die(1, "out of memory for the consistency check");
    int classes = 0;
    for (int m = 0; m < dp; m++) {  // members with the same digests share a class, numbered by first member
        class_of[m] = -1;
        for (int q = 0; q < m && class_of[m] < 0; q++)
            if (memcmp(digests + (size_t)q * stride, digests + (size_t)m * stride, stride) == 0) class_of[m] = class_of[q];
        if (class_of[m] < 0) class_of[m] = classes++;
        size[class_of[m]]++;
    }
    if (classes == 1) {
        free(class_of);
        free(size);
        return 0;
    }
    int major = 0;
    for (int c = 1; c < classes; c++) if (size[c] > size[major]) major = c;
    int has_majority = 2 * size[major] > dp;
    if (!has_majority) major = 0;  // compare with member 0's copy
    // the first member outside the reference class, and the first tensor where it differs
    int odd = 0;
    while (class_of[odd] == major) odd++;
    int ref = 0;
    while (class_of[ref] != major) ref++;
    int t = 0;
    while (t < n && memcmp(digests + (size_t)odd * stride + (size_t)t * 32, digests + (size_t)ref * stride + (size_t)t * 32, 32) == 0) t++;
    char name[96], others[1200], ones[1200];
    replica_tensor_name(ut, s, t, name, sizeof(name));
    if (has_majority) {
        ones[0] = '\0';
        int count = 0;
        for (int m = 0; m < dp; m++) {
            if (class_of[m] == major) continue;
            size_t at = strlen(ones);
            snprintf(ones + at, sizeof(ones) - at, "%s%d", count++ ? ", " : "", ranks[m]);
        }
        replica_list(class_of, major, ranks, dp, others, sizeof(others));
        snprintf(msg, len, "the parameters of rank%s %s differ from those of %s (the majority of the %d replicas), first "
                 "in %s", count > 1 ? "s" : "", ones, others, dp, name);
    } else if (dp == 2) {
        snprintf(msg, len, "the parameters of rank %d differ from those of rank %d, first in %s; with two replicas there "
                 "is no majority to say which one changed", ranks[1], ranks[0], name);
    } else {
        size_t at = (size_t)snprintf(msg, len, "the %d replicas hold %d different copies and no majority:", dp, classes);
        for (int c = 0; c < classes && at < len; c++) {
            replica_list(class_of, c, ranks, dp, others, sizeof(others));
            at += (size_t)snprintf(msg + at, len - at, "%s %s", c ? ";" : "", others);
        }
        if (at < len) snprintf(msg + at, len - at, " (rank %d differs from rank %d first in %s)", ranks[odd], ranks[ref], name);
    }
    free(class_of);
    free(size);
    return 1;
}

// the line that says the replicas disagree (msg: replicas_judge's), after
// whatever stdout holds; the dp group's first member prints it
static void print_replicas_disagree(int rank, int step, const char *msg) {
    fflush(stdout);
    fprintf(stderr, "rank %d: step %d: data-parallel replicas disagree: %s\n", rank, step, msg);
    fflush(stderr);
}

#endif
