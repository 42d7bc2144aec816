/*
 * pipeline_chart: draws one step of a pipeline schedule as an ASCII time chart.
 *
 *     ./dev/pipeline_chart gpipe|1f1b P M [F B]
 *
 * P stages, M micro-batches; a forward takes F time units and a backward B
 * (default 1 and 1). The times come from pipeline_simulate (pipeline.h), the
 * same schedule the trainers run: one row per stage, one column per time
 * unit, Fk / Bk where the stage runs micro-batch k's forward / backward,
 * "-" where that op goes on, "." where the stage waits. Then the bubble and
 * the activation sets each stage holds at most. Last, each stage's message
 * plan (pipeline_plan: r, the op's input is received alone first; s, its
 * output is sent alone; x, sent in one exchange with the next op's input),
 * and what pipeline_check finds when it plays the plans with sends that
 * block until the peer receives. doc/parallel.md shows its output for
 * P = 4, M = 8.
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

// one line naming the argument and its value; exit status 2
static __attribute__((format(printf, 1, 2))) int usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pipeline_chart: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (usage: pipeline_chart gpipe|1f1b P M [F B], P 1..%d, M 1..%d, F and B 1..%d)\n", MAX_P, MAX_M, MAX_TIME);
    return 2;
}

// "name     cells", the cells without their trailing blanks
static void print_row(const char *name, char *cells, size_t len) {
    while (len > 0 && cells[len - 1] == ' ') len--;
    printf("%-9s%.*s\n", name, (int)len, cells);
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) return usage("%d arguments, expected 3 or 5", argc - 1);
    int gpipe = strcmp(argv[1], "gpipe") == 0;
    if (!gpipe && strcmp(argv[1], "1f1b") != 0) return usage("schedule '%s' is not gpipe or 1f1b", argv[1]);
    int P = parse_int(argv[2], 1, MAX_P), M = parse_int(argv[3], 1, MAX_M);
    if (P < 0) return usage("P '%s' is not a number of stages in range", argv[2]);
    if (M < 0) return usage("M '%s' is not a number of micro-batches in range", argv[3]);
    int F = 1, B = 1;
    if (argc == 6) {
        F = parse_int(argv[4], 1, MAX_TIME);
        B = parse_int(argv[5], 1, MAX_TIME);
        if (F < 0) return usage("F '%s' is not a forward time in range", argv[4]);
        if (B < 0) return usage("B '%s' is not a backward time in range", argv[5]);
    }

    int n = 2 * M;
    PipeOp *ops = (PipeOp *)malloc(sizeof(PipeOp) * P * n);
    int *start = (int *)malloc(sizeof(int) * P * n);
    if (ops == NULL || start == NULL) { fprintf(stderr, "pipeline_chart: out of memory\n"); return 1; }
    int end = pipeline_simulate(gpipe, P, M, F, B, ops, start);
    if (end < 0) {  // the tests rule this out; say so rather than draw nonsense
        fprintf(stderr, "pipeline_chart: %s with P %d, M %d deadlocks\n", argv[1], P, M);
        return 1;
    }

    // a cell holds a label "F<mb>" and a space: as wide as the widest label
    int width = 2 + (M > 10) + (M > 100);
    printf("%s, %d stages, %d micro-batches, F = %d and B = %d time units: the step takes %d units\n\n", argv[1], P, M, F,
           B, end);
    // each row is built in `row` (a cell per time unit), then printed
    // without its trailing blanks
    size_t cols = (size_t)end * (width + 1);
    char *row = (char *)malloc(cols + 16);
    if (row == NULL) { fprintf(stderr, "pipeline_chart: out of memory\n"); return 1; }
    memset(row, ' ', cols + 16);
    for (int t = 0; t < end; t += 5) {  // the time at every fifth column; a wide number runs into the next cell
        char num[16];
        int len = snprintf(num, sizeof(num), "%d", t);
        memcpy(row + (size_t)t * (width + 1), num, len);
    }
    print_row("time", row, cols);
    for (int s = 0; s < P; s++) {
        memset(row, ' ', cols + 16);
        for (int t = 0; t < end; t++) row[(size_t)t * (width + 1)] = '.';
        for (int i = 0; i < n; i++) {
            const PipeOp *op = &ops[s * n + i];
            int t = start[s * n + i], dur = op->forward ? F : B;
            char label[16];
            int len = snprintf(label, sizeof(label), "%c%d", op->forward ? 'F' : 'B', op->mb);
            memcpy(row + (size_t)t * (width + 1), label, len);
            for (int k = 1; k < dur; k++) row[(size_t)(t + k) * (width + 1)] = '-';
        }
        char name[32];
        snprintf(name, sizeof(name), "stage %d", s);
        print_row(name, row, cols);
    }
    free(row);

    // every stage is busy M (F + B) of the step; the rest is the bubble
    long idle = (long)P * end - (long)P * M * (F + B);
    printf("\nbubble: %ld of %ld stage-units idle = %.3f; (p-1)/(m+p-1) = %d/%d = %.3f\n", idle, (long)P * end,
           (double)idle / ((double)P * end), P - 1, M + P - 1, pipeline_bubble(P, M));
    printf("activation sets held at most (micro-batches between their F and B):");
    for (int s = 0; s < P; s++) {
        int held = 0, peak = 0;
        for (int i = 0; i < n; i++) {
            held += ops[s * n + i].forward ? 1 : -1;
            if (held > peak) peak = held;
        }
        printf(" stage %d: %d%s", s, peak, s + 1 < P ? "," : "\n");
    }

    // the messages: each stage's plan, then the plans played against each other
    PipeStep *plan = (PipeStep *)malloc(sizeof(PipeStep) * P * n);
    size_t text_len = (size_t)n * 8 + 1;  // "rF63x " at most per op
    char *text = (char *)malloc(text_len);
    if (plan == NULL || text == NULL) { fprintf(stderr, "pipeline_chart: out of memory\n"); return 1; }
    printf("\nmessages (r: receive the input alone first; s: send the output alone; x: send it and receive the next "
           "op's input in one exchange):\n");
    for (int s = 0; s < P; s++) {
        pipeline_plan(P, s, ops + s * n, n, plan + s * n);
        char name[32];
        snprintf(name, sizeof(name), "stage %d", s);
        printf("%-9s%s\n", name, pipeline_plan_text(plan + s * n, n, text, text_len));
    }
    char err[512];
    int messages = pipeline_check(P, n, plan, err, sizeof(err));
    if (messages < 0) printf("pipeline_check: %s\n", err);
    else printf("pipeline_check: %d messages, each matched once in micro-batch order; no deadlock with blocking sends\n",
                messages);
    free(plan);
    free(text);
    free(ops);
    free(start);
    return messages < 0;
}
