/*
 * pipeline_chart: draws one step of the pipeline schedules as ASCII time
 * charts, and their bubble, activation sets and messages as a table.
 *
 *     ./dev/pipeline_chart [-pv V] SCHEDULE P M [F B [W]]
 *     ./dev/pipeline_chart [-pv V] all P M
 *     ./dev/pipeline_chart [-pv V] table P M...
 *
 * SCHEDULE is gpipe, 1f1b, interleaved (V chunks per stage, -pv, default
 * 2), zbh1 or zbv; P stages, M micro-batches. The times come from
 * pipeline_simulate (pipeline.h), the lists the trainers run.
 *
 * One schedule: a forward takes F time units, a backward B and a weight
 * gradient W (default 1 each; where the schedule has no W ops its backward
 * takes B + W; for gpipe and 1f1b given F B alone, W is 0). One row per
 * stage, one column per time unit, Fk / Bk / Wk where the stage runs
 * micro-batch k's op ("F3.1" on chunk 1), "-" where that op goes on, "."
 * where the stage waits. Then the bubble, the activation sets each stage
 * holds at most, each stage's message plan (pipeline_plan: r, the op's
 * input is received alone first; s, its output is sent alone; x, sent in
 * one exchange with the next receive; l, a hand-off within the stage; "-",
 * a step with only messages) and what pipeline_check finds when it plays
 * the plans with sends that block until the peer receives.
 *
 * all: every schedule's chart one under another, one character per time
 * unit on one scale: a stage's whole forward, input gradient and weight
 * gradient take lcm(2, V) units each, a chunk's 1/V (zbv's 1/2) of that;
 * the letter is the op's kind, capital on even chunks and small on odd.
 *
 * table: a markdown row per schedule and M: the bubble by formula
 * (pipeline_bubble_formula) and simulated with F = B = W and with F:B:W =
 * 2:3:1, the activation sets per stage, the messages per step.
 * doc/parallel.md shows all and table for P = 4.
 */
#include "llm3d/parallel/pipeline.h"

#include <stdarg.h>

enum { MAX_P = 32, MAX_M = 64, MAX_TIME = 8 };

// a whole number in [lo, hi], or -1
static int parse_int(const char *s, int lo, int hi) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) return -1;
    return (int)v;
}

// the usage's text, without its line's end
static void print_usage(FILE *f) {
    fprintf(f, "usage: pipeline_chart [-pv V] gpipe|1f1b|interleaved|zbh1|zbv|all|table P M... [F B [W]], "
               "P 1..%d, M 1..%d, F B W 0..%d", MAX_P, MAX_M, MAX_TIME);
}

// one line naming the argument and its value; exit status 2
static __attribute__((format(printf, 1, 2))) int usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pipeline_chart: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (");
    print_usage(stderr);
    fprintf(stderr, ")\n");
    return 2;
}

static void *alloc_or_die(size_t bytes) {
    void *p = calloc(1, bytes);
    if (p == NULL) {
        fprintf(stderr, "pipeline_chart: out of memory\n");
        exit(1);
    }
    return p;
}

// "name     cells", the cells without their trailing blanks
static void print_row(const char *name, char *cells, size_t len) {
    while (len > 0 && cells[len - 1] == ' ') len--;
    printf("%-9s%.*s\n", name, (int)len, cells);
}

// a step's ops, times and plans, all stages
typedef struct {
    PipeLayout pl;
    int n, stride, end, messages, handoffs;
    PipeOp *ops;
    int *start, *idle, *steps;
    PipeStep *plans;
    char err[512];
} Step;

// plays pl with op times f, b, w and makes and checks the plans; 0, or -1
// with a line on stderr
static int step_run(Step *st, PipeLayout pl, int f, int b, int w) {
    st->pl = pl;
    st->n = pipeline_ops(&pl);
    st->stride = pipeline_plan_max(&pl);
    st->ops = (PipeOp *)alloc_or_die(sizeof(PipeOp) * pl.pp * st->n);
    st->start = (int *)alloc_or_die(sizeof(int) * pl.pp * st->n);
    st->idle = (int *)alloc_or_die(sizeof(int) * pl.pp);
    st->steps = (int *)alloc_or_die(sizeof(int) * pl.pp);
    st->plans = (PipeStep *)alloc_or_die(sizeof(PipeStep) * pl.pp * st->stride);
    st->end = pipeline_simulate(&pl, f, b, w, st->ops, st->start, st->idle);
    if (st->end < 0) {  // the tests rule this out; say so rather than draw nonsense
        fprintf(stderr, "pipeline_chart: %s with P %d, M %d deadlocks\n", pipeline_name(pl.schedule), pl.pp, pl.M);
        return -1;
    }
    st->handoffs = 0;
    for (int s = 0; s < pl.pp; s++) {
        PipeStep *plan = st->plans + (size_t)s * st->stride;
        st->steps[s] = pipeline_plan(&pl, s, st->ops + (size_t)s * st->n, st->n, plan);
        if (st->steps[s] < 0) {
            fprintf(stderr, "pipeline_chart: out of memory\n");
            exit(1);
        }
        for (int k = 0; k < st->steps[s]; k++) st->handoffs += plan[k].send.peer == s;
    }
    st->messages = pipeline_check(&pl, st->stride, st->steps, st->plans, st->err, sizeof(st->err));
    return 0;
}

static void step_free(Step *st) {
    free(st->ops), free(st->start), free(st->idle), free(st->steps), free(st->plans);
}

// the most (micro-batch, chunk) activation sets stage s holds at once: from
// its F to its B, or its W where the backward is split
static int peak_sets(const Step *st, int s) {
    int held = 0, peak = 0, last = pipeline_splits_backward(&st->pl) ? PIPE_W : PIPE_B;
    for (int i = 0; i < st->n; i++) {
        PipeOp op = st->ops[(size_t)s * st->n + i];
        held += op.kind == PIPE_F ? 1 : op.kind == last ? -1 : 0;
        if (held > peak) peak = held;
    }
    return peak;
}

// the most inputs stage s has received and not yet used (1: each input
// comes just before its op; more: some come early and wait in a buffer)
static int peak_inputs(const Step *st, int s) {
    const PipeStep *plan = st->plans + (size_t)s * st->stride;
    int held = 0, peak = 0;
    for (int k = 0; k < st->steps[s]; k++) {
        held += plan[k].recv.peer >= 0 && plan[k].recv.peer != s;
        if (held > peak) peak = held;
        PipeMsg in = pipe_input(&st->pl, s, plan[k].op);
        held -= plan[k].op.kind != PIPE_MSG && in.peer >= 0 && in.peer != s;
        held += plan[k].next_recv.peer >= 0;
        if (held > peak) peak = held;
    }
    return peak;
}

// the full chart of one schedule, with its bubble, sets and plans
static int chart(PipeLayout pl, int f, int b, int w) {
    Step st;
    if (step_run(&st, pl, f, b, w) != 0) return 1;
    int P = pl.pp, M = pl.M, n = st.n;
    // a cell holds a label "F<mb>[.<chunk>]" and a space: as wide as the widest label
    int width = 2 + (M > 10) + (M > 100) + (pl.V > 1 ? 2 : 0);
    printf("%s", pipeline_name(pl.schedule));
    if (pl.V > 1) printf(" (%d chunks per stage)", pl.V);
    printf(", %d stages, %d micro-batches, ", P, M);
    if (pipeline_splits_backward(&pl)) printf("F = %d, B = %d and W = %d", f, b, w);
    else printf("F = %d and B = %d", f, b + w);
    printf(" time units: the step takes %d units\n\n", st.end);
    // each row is built in `row` (a cell per time unit), then printed
    // without its trailing blanks
    size_t cols = (size_t)st.end * (width + 1);
    char *row = (char *)alloc_or_die(cols + 16);
    memset(row, ' ', cols + 16);
    for (int t = 0; t < st.end; t += 5) {  // the time at every fifth column; a wide number runs into the next cell
        char num[16];
        int len = snprintf(num, sizeof(num), "%d", t);
        memcpy(row + (size_t)t * (width + 1), num, len);
    }
    print_row("time", row, cols);
    for (int s = 0; s < P; s++) {
        memset(row, ' ', cols + 16);
        for (int t = 0; t < st.end; t++) row[(size_t)t * (width + 1)] = '.';
        for (int i = 0; i < n; i++) {
            PipeOp op = st.ops[s * n + i];
            int t = st.start[s * n + i], dur = pipe_cost(&pl, op, f, b, w);
            char label[32];
            pipe_op_text(op, label, sizeof(label));
            memcpy(row + (size_t)t * (width + 1), label, strlen(label));
            for (int k = 1; k < dur; k++) row[(size_t)(t + k) * (width + 1)] = '-';
        }
        char name[32];
        snprintf(name, sizeof(name), "stage %d", s);
        print_row(name, row, cols);
    }
    free(row);

    // every stage is busy for the same work; the rest is the bubble
    long idle = 0, num, den;
    for (int s = 0; s < P; s++) idle += st.idle[s];
    printf("\nbubble: %ld of %ld stage-units idle = %.3f", idle, (long)P * st.end, (double)idle / ((double)P * st.end));
    if (pipeline_bubble_formula(&pl, &num, &den) == 0)
        printf("; formula%s %ld/%ld = %.3f", pipeline_splits_backward(&pl) ? " (F = B = W)" : "", num, den,
               (double)num / (double)den);
    printf("\nactivation sets held at most (%s):", pipeline_splits_backward(&pl) ? "from F to W" : "from F to B");
    for (int s = 0; s < P; s++) printf(" stage %d: %d%s", s, peak_sets(&st, s), s + 1 < P ? "," : "");
    if (pl.V > 1) printf(" (each of L/%d layers)", P * pl.V);
    printf("\n");

    // the messages: each stage's plan, then the plans played against each other
    size_t text_len = (size_t)st.stride * 12 + 1;  // "rF63.7x " at most per step
    char *text = (char *)alloc_or_die(text_len);
    printf("\nmessages (r: receive the input alone first; s: send the output alone; x: send it in one exchange with "
           "the next receive; l: a hand-off within the stage; -: a step with only messages):\n");
    for (int s = 0; s < P; s++) {
        char name[32];
        snprintf(name, sizeof(name), "stage %d", s);
        printf("%-9s%s\n", name, pipeline_plan_text(s, st.plans + (size_t)s * st.stride, st.steps[s], text, text_len));
    }
    if (st.messages < 0) printf("pipeline_check: %s\n", st.err);
    else {
        printf("pipeline_check: %d messages", st.messages);
        if (st.handoffs > 0) printf(" and %d hand-offs within a stage", st.handoffs);
        printf(", each matched once in micro-batch order; no deadlock with blocking sends\n");
    }
    if (pl.V > 1) {
        printf("inputs received and not yet used, at most:");
        for (int s = 0; s < P; s++) printf(" stage %d: %d%s", s, peak_inputs(&st, s), s + 1 < P ? "," : "\n");
    }
    free(text);
    step_free(&st);
    return st.messages < 0;
}

// a chunk op's time when a stage's whole F, B and W take `unit` each
static int chunk_time(PipeLayout pl, int unit) { return unit / pl.V; }

// all schedules, one character per time unit on one scale
static int chart_all(int P, int M, int V) {
    int unit = V % 2 == 0 ? V : 2 * V;  // lcm(2, V): a stage's F, B or W
    printf("%d stages, %d micro-batches; a stage's F, B and W take %d units each (interleaved: %d chunks per stage)\n",
           P, M, unit, V);
    int rc = 0;
    for (int sched = 0; sched < PIPE_SCHEDULES; sched++) {
        PipeLayout pl = pipe_layout((PipeSchedule)sched, P, M, sched == PIPE_INTERLEAVED ? V : 1);
        char err[256];
        if (pipeline_validate(pl.schedule, P, M, sched == PIPE_INTERLEAVED ? V : 1, 0, err, sizeof(err)) != 0) {
            printf("\n%s: %s\n", pipeline_name(pl.schedule), err);
            continue;
        }
        int t = chunk_time(pl, unit);
        Step st;
        if (step_run(&st, pl, t, t, t) != 0) return 1;
        long idle = 0, total = (long)P * st.end;
        for (int s = 0; s < P; s++) idle += st.idle[s];
        printf("\n%s: %d units, bubble %.3f\n", pipeline_name(pl.schedule), st.end, (double)idle / (double)total);
        char *row = (char *)alloc_or_die((size_t)st.end + 1);
        for (int s = 0; s < P; s++) {
            memset(row, '.', (size_t)st.end);
            row[st.end] = '\0';
            for (int i = 0; i < st.n; i++) {
                PipeOp op = st.ops[s * st.n + i];
                char c = op.kind == PIPE_F ? 'F' : op.kind == PIPE_B ? 'B' : 'W';
                if (op.chunk % 2) c = (char)(c - 'A' + 'a');
                int at = st.start[s * st.n + i], dur = pipe_cost(&pl, op, t, t, t);
                for (int k = 0; k < dur; k++) row[at + k] = c;
            }
            printf("stage %d  %s\n", s, row);
        }
        free(row);
        rc |= st.messages < 0;
        step_free(&st);
    }
    return rc;
}

// the markdown table: a row per schedule and M
static int table(int P, const int *Ms, int nM, int V) {
    printf("| schedule | M | bubble: formula | simulated, F = B = W | simulated, F:B:W = 2:3:1 | activation sets per stage "
           "(each L/(P V) layers) | messages per step |\n|---|---|---|---|---|---|---|\n");
    int rc = 0;
    for (int sched = 0; sched < PIPE_SCHEDULES; sched++)
        for (int k = 0; k < nM; k++) {
            int pv = sched == PIPE_INTERLEAVED ? V : 1;
            PipeLayout pl = pipe_layout((PipeSchedule)sched, P, Ms[k], pv);
            char err[256];
            const char *name = pipeline_name(pl.schedule);
            char label[32];
            if (pl.V > 1 && sched == PIPE_INTERLEAVED) snprintf(label, sizeof(label), "%s, V %d", name, pl.V);
            else snprintf(label, sizeof(label), "%s", name);
            if (pipeline_validate(pl.schedule, P, Ms[k], pv, 0, err, sizeof(err)) != 0) {
                printf("| %s | %d | %s | | | | |\n", label, Ms[k], err);
                continue;
            }
            Step st, other;
            if (step_run(&st, pl, 1, 1, 1) != 0 || step_run(&other, pl, 2, 3, 1) != 0) return 1;
            long num, den, idle = 0, idle2 = 0;
            for (int s = 0; s < P; s++) idle += st.idle[s], idle2 += other.idle[s];
            pipeline_bubble_formula(&pl, &num, &den);
            printf("| %s | %d | %ld/%ld = %.3f | %.3f | %.3f |", label, Ms[k], num, den, (double)num / (double)den,
                   (double)idle / ((double)P * st.end), (double)idle2 / ((double)P * other.end));
            for (int s = 0; s < P; s++) printf("%s%d", s ? " " : " ", peak_sets(&st, s));
            printf(" | %d", st.messages);
            if (st.handoffs > 0) printf(" + %d hand-offs", st.handoffs);
            printf(" |\n");
            rc |= st.messages < 0;
            step_free(&st);
            step_free(&other);
        }
    return rc;
}

int main(int argc, char **argv) {
    int V = 2, a = 1;
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        print_usage(stdout);
        printf("\n");
        return 0;
    }
    if (argc > 2 && strcmp(argv[1], "-pv") == 0) {
        V = parse_int(argv[2], 2, PIPE_MAXV);
        if (V < 0) return usage("-pv '%s' is not a number of chunks per stage in 2..%d", argv[2], PIPE_MAXV);
        a = 3;
    }
    if (argc - a < 3) return usage("%d arguments, expected a schedule, P and M", argc - a);
    const char *what = argv[a];
    int P = parse_int(argv[a + 1], 1, MAX_P);
    if (P < 0) return usage("P '%s' is not a number of stages in range", argv[a + 1]);
    if (strcmp(what, "table") == 0) {
        int Ms[16], nM = 0;
        for (int i = a + 2; i < argc && nM < 16; i++) {
            Ms[nM] = parse_int(argv[i], 1, MAX_M);
            if (Ms[nM++] < 0) return usage("M '%s' is not a number of micro-batches in range", argv[i]);
        }
        return table(P, Ms, nM, V);
    }
    int M = parse_int(argv[a + 2], 1, MAX_M);
    if (M < 0) return usage("M '%s' is not a number of micro-batches in range", argv[a + 2]);
    if (strcmp(what, "all") == 0) {
        if (argc - a != 3) return usage("all takes P and M only");
        return chart_all(P, M, V);
    }
    int sched = pipeline_parse(what);
    if (sched < 0) return usage("schedule '%s' is not gpipe, 1f1b, interleaved, zbh1, zbv, all or table", what);
    int nt = argc - a - 3;
    if (nt != 0 && nt != 2 && nt != 3) return usage("%d op times, expected none, F B, or F B W", nt);
    int pv = sched == PIPE_INTERLEAVED ? V : 1;
    char err[256];
    if (pipeline_validate((PipeSchedule)sched, P, M, pv, 0, err, sizeof(err)) != 0) return usage("%s", err);
    PipeLayout pl = pipe_layout((PipeSchedule)sched, P, M, pv);
    int t[3] = {1, 1, 1}, split = pipeline_splits_backward(&pl);
    if (nt == 2 && !split) t[2] = 0;  // F B: B is the whole backward
    for (int i = 0; i < nt; i++) {
        t[i] = parse_int(argv[a + 3 + i], 0, MAX_TIME);
        if (t[i] < 0) return usage("op time '%s' is not in range", argv[a + 3 + i]);
    }
    if (t[0] == 0 || t[1] + (split ? 0 : t[2]) == 0) return usage("F and B must take at least 1 unit");
    return chart(pl, t[0], t[1], t[2]);
}
