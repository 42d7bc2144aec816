/*
 * dev/compare_logs.c: does a run's loss curve match a reference curve?
 * dev/reference_cpu.sh uses it to check a fresh CPU reference run against the
 * committed one (dev/reference/).
 *
 *   dev/compare_logs RUN.jsonl REF.jsonl [--prefix] [--window N] [--train-tol X] [--val-tol X]
 *
 * Both are JSON-lines logs as the trainers write them (gpt2.h's log_line):
 * "step", "loss" and, where measured, "val_loss". Three findings:
 *   - whether the losses are identical as logged (6 decimals) at every step:
 *     what the same machine, compiler and thread count give;
 *   - val loss at every step where both measured it: the largest difference,
 *     against --val-tol (default 0.01);
 *   - train loss averaged over windows of --window steps (default 50; one
 *     step's loss is too noisy a thing to hold a run to): the largest
 *     difference of the means, against --train-tol (default 0.02);
 *     --window is a whole number of steps, 1..100000000 (the most a log
 *     may hold here).
 * doc/reproducing.md says why these defaults (the CPU reference run's
 * curves on one machine differ by about 2e-5 after 250 steps when only the
 * order of some sums changes).
 * The run must have every step of the reference, unless --prefix: then only
 * the steps the run has are compared (a run cut short on purpose, as
 * reference_cpu.sh --quick does), and at least one window.
 *
 * Exit status: 0 within tolerance, 1 not (or steps missing), 2 bad flags or
 * an unreadable log.
 */
#include "llm3d/json.h"
#include "llm3d/log_reader.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 100000000  // the largest step a log may hold here, and the largest --window

typedef struct {
    const char *path;
    double *loss, *val;        // by step; NAN where not logged
    int steps;                 // 1 + the largest step logged
} Curve;

static int curve_set(Curve *c, int step, double loss, double val) {
    if (step >= c->steps) {
        int steps = step + 1;
        double *l = realloc(c->loss, (size_t)steps * sizeof(double));
        if (l == NULL) return -1;
        c->loss = l;
        double *v = realloc(c->val, (size_t)steps * sizeof(double));
        if (v == NULL) return -1;
        c->val = v;
        for (int s = c->steps; s < steps; s++) c->loss[s] = c->val[s] = NAN;
        c->steps = steps;
    }
    if (!isnan(loss)) c->loss[step] = loss;
    if (!isnan(val)) c->val[step] = val;
    return 0;
}

// curve_add: one line's losses into the curve (log_read calls it for each line)
static int curve_add(void *ctx, const LogRecord *l, JsonReader *j) {
    if (l->step < 0 || l->step > MAX_STEPS) return json_fail(j, "a step out of range");
    if (curve_set((Curve *)ctx, (int)l->step, l->loss, l->val_loss) != 0) return json_fail(j, "out of memory");
    return 0;
}

// curve_read: a log into c; 0 ok, -1 after printing the file, line and why
static int curve_read(const char *path, Curve *c) {
    memset(c, 0, sizeof(*c));
    c->path = path;
    char err[1024];
    if (log_read(path, curve_add, c, NULL, err, sizeof(err)) != 0) {
        fprintf(stderr, "compare_logs: %s\n", err);
        return -1;
    }
    if (c->steps == 0) { fprintf(stderr, "compare_logs: %s: no steps in it\n", path); return -1; }
    return 0;
}

static double window_mean(const double *x, int from, int to, int *n) {
    double sum = 0;
    *n = 0;
    for (int s = from; s < to; s++)
        if (!isnan(x[s])) { sum += x[s]; (*n)++; }
    return *n > 0 ? sum / *n : NAN;
}

static double parse_number(const char *flag, const char *value, double min) {
    char *end;
    double v = strtod(value, &end);
    if (*value == '\0' || *end != '\0' || !(v >= min)) {
        fprintf(stderr, "compare_logs: %s '%s': want a number >= %g\n", flag, value, min);
        exit(2);
    }
    return v;
}

// --window: a whole number of steps, at most the most steps a log may hold
// (curve_add), so that the windows' bounds stay ints: 2.5 is not rounded
// to 2, nor 3e9 wrapped round to a negative window
static int parse_window(const char *value) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (*value == '\0' || *end != '\0' || errno != 0 || v < 1 || v > MAX_STEPS) {
        fprintf(stderr, "compare_logs: --window '%s': want a whole number of steps in 1..%d\n", value, MAX_STEPS);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL};
    int prefix = 0, n_paths = 0, window = 50;
    double train_tol = 0.02, val_tol = 0.01;
    const char *usage = "usage: compare_logs RUN.jsonl REF.jsonl [--prefix] [--window N] [--train-tol X] [--val-tol X]\n";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { fputs(usage, stdout); return 0; }
        if (strcmp(a, "--prefix") == 0) { prefix = 1; continue; }
        int valued = strcmp(a, "--window") == 0 || strcmp(a, "--train-tol") == 0 || strcmp(a, "--val-tol") == 0;
        if (valued && i + 1 < argc) {
            if (strcmp(a, "--window") == 0) window = parse_window(argv[++i]);
            else if (strcmp(a, "--train-tol") == 0) train_tol = parse_number(a, argv[++i], 0);
            else val_tol = parse_number(a, argv[++i], 0);
        } else if (a[0] != '-' && n_paths < 2) {
            paths[n_paths++] = a;
        } else {
            fputs(usage, stderr);
            return 2;
        }
    }
    if (n_paths != 2) { fprintf(stderr, "compare_logs: give the run's log and the reference's\n"); return 2; }
    Curve run, ref;
    if (curve_read(paths[0], &run) != 0 || curve_read(paths[1], &ref) != 0) return 2;

    int steps = ref.steps, ok = 1;
    if (run.steps < ref.steps) {
        if (!prefix) {
            printf("compare_logs: %s has %d steps, the reference %d: not a whole run (give --prefix to compare the steps it has)\n",
                   run.path, run.steps, ref.steps);
            ok = 0;
        }
        steps = run.steps;
    }
    int first_diff = -1;
    for (int s = 0; s < steps && first_diff < 0; s++) {
        int differ = isnan(run.loss[s]) != isnan(ref.loss[s]) || (!isnan(run.loss[s]) && run.loss[s] != ref.loss[s]) ||
                     isnan(run.val[s]) != isnan(ref.val[s]) || (!isnan(run.val[s]) && run.val[s] != ref.val[s]);
        if (differ) first_diff = s;
    }
    if (first_diff < 0) printf("compare_logs: steps 0..%d: every loss identical as logged\n", steps - 1);
    else printf("compare_logs: steps 0..%d: losses differ from step %d on (train %.6f here, %.6f in the reference)\n", steps - 1,
                first_diff, run.loss[first_diff], ref.loss[first_diff]);

    double worst_val = 0;
    int worst_val_step = -1, evals = 0;
    for (int s = 0; s < steps; s++) {
        if (isnan(run.val[s]) || isnan(ref.val[s])) continue;
        evals++;
        double d = fabs(run.val[s] - ref.val[s]);
        if (d >= worst_val) { worst_val = d; worst_val_step = s; }
    }
    if (evals > 0) {
        printf("compare_logs: val loss at %d steps measured in both: largest difference %.4f at step %d (%.4f here, %.4f in the "
               "reference; tolerance %.4f)\n", evals, worst_val, worst_val_step, run.val[worst_val_step], ref.val[worst_val_step], val_tol);
        if (worst_val > val_tol) ok = 0;
    } else {
        printf("compare_logs: no step has a val loss in both logs\n");
    }

    double worst_train = 0;
    int worst_from = -1, windows = 0;
    for (int from = 0; from + window <= steps; from += window) {
        int n_run, n_ref;
        double a = window_mean(run.loss, from, from + window, &n_run), b = window_mean(ref.loss, from, from + window, &n_ref);
        if (n_run != window || n_ref != window) {
            printf("compare_logs: steps %d..%d: %d train losses here, %d in the reference, of %d\n", from, from + window - 1, n_run,
                   n_ref, window);
            ok = 0;
            continue;
        }
        windows++;
        if (fabs(a - b) >= worst_train) { worst_train = fabs(a - b); worst_from = from; }
    }
    if (windows == 0) {
        printf("compare_logs: not one whole window of %d steps to compare\n", window);
        ok = 0;
    } else {
        int n;
        printf("compare_logs: train loss in %d windows of %d steps: largest difference of the means %.4f at steps %d..%d "
               "(%.4f here, %.4f in the reference; tolerance %.4f)\n", windows, window, worst_train, worst_from, worst_from + window - 1,
               window_mean(run.loss, worst_from, worst_from + window, &n), window_mean(ref.loss, worst_from, worst_from + window, &n),
               train_tol);
        if (worst_train > train_tol) ok = 0;
    }
    printf("compare_logs: %s\n", ok ? "ok: the run reproduces the reference curve" : "FAIL: the run does not reproduce the reference curve");
    free(run.loss); free(run.val); free(ref.loss); free(ref.val);
    return ok ? 0 : 1;
}
