/*
 * bench_matmul.c: the CPU trainer's matmul (cpu_matmul.h) at the shapes of
 * GPT-2 124M (d12) with N = B*T = 256 tokens: each of a Linear layer's three
 * products (forward, dinp, dweight) in GFLOP/s and as a percentage of the
 * machine's FMA peak measured in the same run (dev/bench.h), and the error of
 * forward and backward against a double-precision reference.
 *
 *   make dev/bench_matmul && ./dev/bench_matmul [runs] [N] [C]
 *
 * C (default 768) sets the shapes: C x 3C, C x C, C x 4C, 4C x C and C x
 * 50304; 128 gives the small model of `make run` (its step has 4 layers,
 * the totals still count 12).
 *
 * Each product is timed `runs` times (default 7) in wall-clock time with all
 * of OpenMP's threads; it prints the best run and the median: the machine is
 * shared, so the best says what the code can do and the median what to expect.
 * The peak is the best of its runs before and after. The last line weighs the
 * shapes as one training step does (12 layers of qkv, attproj, fc, fcproj,
 * plus the logits). "err" is the worst |kernel - reference| over the
 * outputs, relative to the largest |reference| of that output.
 */
#define TESTING
#include "train_gpt2.c"
#include "dev/bench.h"

#define MAX_RUNS 21

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
    matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC, 0);
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
    int runs = argc > 1 ? atoi(argv[1]) : 7;
    int N = argc > 2 ? atoi(argv[2]) : 256, C = argc > 3 ? atoi(argv[3]) : 768;
    if (runs < 1 || runs > MAX_RUNS || N < 1 || C < 1) {
        fprintf(stderr, "usage: %s [runs 1..%d] [N] [C]\n", argv[0], MAX_RUNS);
        return 2;
    }
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    double peak = bench_fma_peak(5);
    // name, IC, OC, how many per training step
    struct { const char *name; int IC, OC, per_step; } shapes[] = {
        {"qkv", C, 3 * C, 12}, {"attproj", C, C, 12}, {"fc", C, 4 * C, 12},
        {"fcproj", 4 * C, C, 12}, {"logits", C, 50304, 1},
    };
    const char *products[3] = {"forward", "dinp", "dweight"};
    int nshapes = sizeof(shapes) / sizeof(shapes[0]);
    double best[5][3], median[5][3], errs[5][2];
    double step_s = 0.0, flops_step = 0.0;
    for (int s = 0; s < nshapes; s++) {
        int IC = shapes[s].IC, OC = shapes[s].OC;
        float *inp = (float *)xcalloc_mapped((size_t)N * IC, sizeof(float), "inp");
        float *w = (float *)xcalloc_mapped((size_t)OC * IC, sizeof(float), "w");
        float *b = (float *)xcalloc_mapped((size_t)OC, sizeof(float), "b");
        float *out = (float *)xcalloc_mapped((size_t)N * OC, sizeof(float), "out");
        float *dout = (float *)xcalloc_mapped((size_t)N * OC, sizeof(float), "dout");
        float *dinp = (float *)xcalloc_mapped((size_t)N * IC, sizeof(float), "dinp");
        float *dw = (float *)xcalloc_mapped((size_t)OC * IC, sizeof(float), "dw");
        unsigned seed = 42u + s;
        fill(inp, (size_t)N * IC, &seed);
        fill(w, (size_t)OC * IC, &seed);
        fill(b, (size_t)OC, &seed);
        fill(dout, (size_t)N * OC, &seed);
        double flops = 2.0 * N * IC * OC;  // each of the three products
        for (int p = 0; p < 3; p++) {
            double t[MAX_RUNS];
            for (int r = -1; r < runs; r++) {  // run -1 warms pages and caches
                double t0 = bench_now();
                // the calls of matmul_forward and matmul_backward, one by one,
                // dweight as in a step's first micro-batch, which writes it
                if (p == 0) matmul_blocked_set(out, OC, b, inp, IC, 1, w, 1, IC, N, OC, IC);
                if (p == 1) matmul_blocked_set(dinp, IC, NULL, dout, OC, 1, w, IC, 1, N, IC, OC);
                if (p == 2) matmul_blocked_set(dw, IC, NULL, dout, 1, OC, inp, IC, 1, OC, IC, N);
                if (r >= 0) t[r] = bench_now() - t0;
            }
            qsort(t, runs, sizeof(double), compare_doubles);
            best[s][p] = flops / t[0] * 1e-9;
            median[s][p] = flops / t[(runs - 1) / 2] * 1e-9;
            step_s += shapes[s].per_step * t[(runs - 1) / 2];
        }
        flops_step += shapes[s].per_step * 3 * flops;
        check_errors(N, IC, OC, inp, w, b, dout, errs[s]);
        free(inp); free(w); free(b); free(out); free(dout); free(dinp); free(dw);
    }
    double peak_after = bench_fma_peak(5);
    if (peak_after > peak) peak = peak_after;
    printf("N=%d, C=%d, %d threads, best of %d runs; FMA peak %.1f GFLOP/s (best of 5 before and 5 after)\n", N, C, nthreads,
           runs, peak);
    printf("%-8s %5s %6s | %-8s %9s %7s %9s | %8s %8s\n", "shape", "IC", "OC", "product", "GFLOP/s", "% peak", "(median)",
           "err fwd", "err bwd");
    for (int s = 0; s < nshapes; s++)
        for (int p = 0; p < 3; p++) {
            printf("%-8s %5d %6d | %-8s %9.1f %6.1f%% %9.1f", p == 0 ? shapes[s].name : "", shapes[s].IC, shapes[s].OC,
                   products[p], best[s][p], 100.0 * best[s][p] / peak, median[s][p]);
            if (p == 0) printf(" | %8.1e %8.1e", errs[s][0], errs[s][1]);
            printf("\n");
        }
    printf("one step's matmuls at 12 layers (medians): %.0f ms, %.1f GFLOP/s, %.1f%% of peak\n", step_s * 1e3,
           flops_step / step_s * 1e-9, 100.0 * flops_step / step_s * 1e-9 / peak);
    return 0;
}
