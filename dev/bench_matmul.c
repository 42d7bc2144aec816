/*
 * bench_matmul.c: the CPU trainer's matmul_forward and matmul_backward at the
 * shapes of GPT-2 124M (d12) with N = B*T = 256 tokens, in GFLOP/s, and their
 * error against a double-precision reference.
 *
 *   make dev/bench_matmul && ./dev/bench_matmul [runs] [N]
 *
 * Each cell is timed `runs` times (default 5) in wall-clock time with all of
 * OpenMP's threads; it prints the median and the best run: the machine is
 * shared, so the median says what to expect and the best what the code can do.
 * The last line weighs the shapes as one training step does (12 layers of
 * qkv, attproj, fc, fcproj, plus the logits) and gives the step's matmul time.
 * "err" is the worst |kernel - reference| over the outputs, relative to the
 * largest |reference| of that output.
 */
#define TESTING
#include "../train_gpt2.c"

#define MAX_RUNS 21

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *x, size_t n, unsigned *seed) {
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = ((float)(*seed >> 8) / (float)(1u << 24)) * 2.0f - 1.0f;
    }
}

// worst |got - want| / max |want|, want in double
static double rel_err(const float *got, const double *want, size_t n) {
    double worst = 0.0, big = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > worst) worst = d;
        if (fabs(want[i]) > big) big = fabs(want[i]);
    }
    return worst / big;
}

// the reference, in double, on a few rows (forward, dinp) or columns (dweight)
// of the output only, so that it stays fast at the logits' shape
static void check_errors(int N, int IC, int OC, const float *inp, const float *w, const float *b,
                         const float *dout, double *errs) {
    float *out = (float *)malloc((size_t)N * OC * sizeof(float));
    float *dinp = (float *)calloc((size_t)N * IC, sizeof(float));
    float *dw = (float *)calloc((size_t)OC * IC, sizeof(float));
    float *db = (float *)calloc((size_t)OC, sizeof(float));
    matmul_forward(out, inp, w, b, N, IC, OC);
    matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
    int rows[] = {0, 1, N / 2, N - 1};
    int nr = sizeof(rows) / sizeof(rows[0]);
    double *ref = (double *)malloc((size_t)(OC > IC ? OC : IC) * sizeof(double));
    double worst_f = 0.0, worst_di = 0.0, worst_dw = 0.0;
    for (int k = 0; k < nr; k++) {
        int n = rows[k];
        for (int o = 0; o < OC; o++) {
            double s = b[o];
            for (int i = 0; i < IC; i++) s += (double)inp[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            ref[o] = s;
        }
        double e = rel_err(out + (size_t)n * OC, ref, OC);
        if (e > worst_f) worst_f = e;
        for (int i = 0; i < IC; i++) ref[i] = 0.0;
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++) ref[i] += (double)dout[(size_t)n * OC + o] * w[(size_t)o * IC + i];
        e = rel_err(dinp + (size_t)n * IC, ref, IC);
        if (e > worst_di) worst_di = e;
    }
    int cols[] = {0, 1, OC / 2, OC - 1};
    for (int k = 0; k < nr; k++) {
        int o = cols[k];
        for (int i = 0; i < IC; i++) ref[i] = 0.0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < IC; i++) ref[i] += (double)dout[(size_t)n * OC + o] * inp[(size_t)n * IC + i];
        double e = rel_err(dw + (size_t)o * IC, ref, IC);
        if (e > worst_dw) worst_dw = e;
    }
    errs[0] = worst_f;
    errs[1] = worst_di > worst_dw ? worst_di : worst_dw;
    free(ref); free(out); free(dinp); free(dw); free(db);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    int N = argc > 2 ? atoi(argv[2]) : 256;
    if (runs < 1 || runs > MAX_RUNS || N < 1) { fprintf(stderr, "usage: %s [runs 1..%d] [N]\n", argv[0], MAX_RUNS); return 2; }
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    // name, IC, OC, how many per training step
    struct { const char *name; int IC, OC, per_step; } shapes[] = {
        {"qkv", 768, 2304, 12}, {"attproj", 768, 768, 12}, {"fc", 768, 3072, 12},
        {"fcproj", 3072, 768, 12}, {"logits", 768, 50304, 1},
    };
    int nshapes = sizeof(shapes) / sizeof(shapes[0]);
    printf("N=%d, %d threads, %d runs; GFLOP/s median (best), err vs double\n", N, nthreads, runs);
    printf("%-8s %5s %6s | %16s %16s | %8s %8s\n", "shape", "IC", "OC", "forward", "backward", "err fwd", "err bwd");
    double step_ms[2] = {0.0, 0.0};
    double flops_step = 0.0;
    for (int s = 0; s < nshapes; s++) {
        int IC = shapes[s].IC, OC = shapes[s].OC;
        float *inp = (float *)malloc((size_t)N * IC * sizeof(float));
        float *w = (float *)malloc((size_t)OC * IC * sizeof(float));
        float *b = (float *)malloc((size_t)OC * sizeof(float));
        float *out = (float *)malloc((size_t)N * OC * sizeof(float));
        float *dout = (float *)malloc((size_t)N * OC * sizeof(float));
        float *dinp = (float *)calloc((size_t)N * IC, sizeof(float));
        float *dw = (float *)calloc((size_t)OC * IC, sizeof(float));
        float *db = (float *)calloc((size_t)OC, sizeof(float));
        unsigned seed = 42u + s;
        fill(inp, (size_t)N * IC, &seed);
        fill(w, (size_t)OC * IC, &seed);
        fill(b, (size_t)OC, &seed);
        fill(dout, (size_t)N * OC, &seed);
        double flops = 2.0 * N * IC * OC;  // forward; backward is twice that
        double tf[MAX_RUNS], tb[MAX_RUNS];
        matmul_forward(out, inp, w, b, N, IC, OC);  // warm up pages and caches
        matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
        for (int r = 0; r < runs; r++) {
            double t0 = now_seconds();
            matmul_forward(out, inp, w, b, N, IC, OC);
            double t1 = now_seconds();
            matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC);
            double t2 = now_seconds();
            tf[r] = t1 - t0;
            tb[r] = t2 - t1;
        }
        qsort(tf, runs, sizeof(double), compare_doubles);
        qsort(tb, runs, sizeof(double), compare_doubles);
        double mf = tf[(runs - 1) / 2], mb = tb[(runs - 1) / 2];
        double errs[2];
        check_errors(N, IC, OC, inp, w, b, dout, errs);
        printf("%-8s %5d %6d | %7.1f (%6.1f) %7.1f (%6.1f) | %8.1e %8.1e\n", shapes[s].name, IC, OC,
               flops / mf * 1e-9, flops / tf[0] * 1e-9, 2 * flops / mb * 1e-9, 2 * flops / tb[0] * 1e-9,
               errs[0], errs[1]);
        step_ms[0] += shapes[s].per_step * mf * 1e3;
        step_ms[1] += shapes[s].per_step * mb * 1e3;
        flops_step += shapes[s].per_step * 3 * flops;
        free(inp); free(w); free(b); free(out); free(dout); free(dinp); free(dw); free(db);
    }
    printf("one d12 step's matmuls (medians): forward %.0f ms + backward %.0f ms = %.0f ms, %.1f GFLOP/s\n",
           step_ms[0], step_ms[1], step_ms[0] + step_ms[1], flops_step / (step_ms[0] + step_ms[1]) * 1e-6);
    return 0;
}
