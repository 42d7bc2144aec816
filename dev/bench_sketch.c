/*
 * bench_sketch.c: what the checked collectives' passes (-ic 1, sketch.h)
 * cost one rank's thread, in ns per element, beside the work an unchecked
 * collective does anyway:
 *   - an input frame's sketch, full (two sketches, |x| sums, squares), and
 *     a received all-gather frame's, plain: both of a 16384-float frame in
 *     the cache, where the seal or the copy has just left it;
 *   - a reducing receive: z = v + a in place, v a frame in the cache, a the
 *     gradient streaming from an array far larger than the caches, as
 *     sketch_reduce does it (with the frame's own sketches), against the
 *     plain sum and against sketch_sum_sumsq (the gradient-norm rule's pass
 *     when the checks are off).
 * The extra of sketch_reduce over the squares' pass is what the trainer's
 * "Y - Y0" counts per element a data-parallel rank reduces. Single-threaded, as the host
 * backend's collectives run; interleaved rounds, the median of each.
 *
 *   make dev/bench_sketch && ./dev/bench_sketch [rounds]
 *
 * doc/security.md ("Checked collectives", Cost) has the figures and what
 * they add up to in a step.
 */
#include "llm3d/parallel/sketch.h"
#include "dev/bench.h"

#include <stdio.h>
#include <stdlib.h>

#define FRAME 16384                // floats in a host-backend frame
#define STREAM ((size_t)32 << 20)  // floats of the streamed gradient: 128 MiB
#define MAXROUNDS 64

static int compare_doubles(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// each pass through a wrapper not inlined or cloned, so the compiler cannot
// fold one timed loop into another, hoist work out of them, or specialize
// them for the constant length
__attribute__((noinline, noclone)) static void frame_sketches(const SketchGen *g, const float *frame, size_t f, int full,
                                                              Sketch *out) {
    sketch_add(out, g, 0, frame, f, full);
}

__attribute__((noinline, noclone)) static void reduce_sketched(const SketchGen *g, const float *frame, size_t f, float *a,
                                                               size_t n, Sketch out[3]) {
    Sketch piece[3];
    for (size_t g0 = 0; g0 < n; g0 += f) sketch_reduce(&out[0], &out[1], &out[2], piece, g, g0, frame, a + g0, a + g0, f);
}

// GCC 12 inlining sketch_sum_sumsq here warns that a tail loop of at most
// 7 iterations might run 2^62 (-Waggressive-loop-optimizations); it cannot
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waggressive-loop-optimizations"
__attribute__((noinline, noclone)) static double frame_sumsq(const float *frame, float *a, size_t f) {
    return sketch_sum_sumsq(frame, a, a, f);
}
#pragma GCC diagnostic pop

__attribute__((noinline, noclone)) static double reduce_sumsq(const float *frame, size_t f, float *a, size_t n) {
    double q = 0.0;
    for (size_t g0 = 0; g0 < n; g0 += f) q += frame_sumsq(frame, a + g0, f);
    return q;
}

__attribute__((noinline, noclone)) static void reduce_plain(const float *frame, size_t f, float *a, size_t n) {
    for (size_t g0 = 0; g0 < n; g0 += f)
        for (size_t j = 0; j < f; j++) a[g0 + j] = frame[j] + a[g0 + j];
}

// a cache-line aligned array, not inlined: GCC that sees the size of the
// allocation warns of iterations past it in loops it cannot bound
__attribute__((noinline)) static float *floats(size_t n) { return (float *)aligned_alloc(64, n * sizeof(float)); }

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 7;
    if (rounds < 1 || rounds > MAXROUNDS) {
        fprintf(stderr, "bench_sketch: rounds %s: give 1 to %d\n", argv[1], MAXROUNDS);
        return 2;
    }
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i * 7 + 1);
    SketchGen g;
    sketch_gen_init(&g, key, "/bench_sketch");
    float *frame = floats(FRAME), *a = floats(STREAM);
    if (frame == NULL || a == NULL || sketch_draw(&g, 1, 2, 3, SK_ALLREDUCE, STREAM) != 0) {
        fprintf(stderr, "bench_sketch: out of memory\n");
        return 1;
    }
    // small values, so that adding a frame again and again stays finite
    for (size_t i = 0; i < FRAME; i++) frame[i] = 1e-6f * (float)((long)((i * 2654435761u) % 2001) - 1000);
    for (size_t i = 0; i < STREAM; i++) a[i] = 1e-3f * (float)((long)((i * 40503u) % 2001) - 1000);

    // the in-cache passes run over the same frame STREAM / FRAME times, so
    // every figure is of the same count of elements
    enum { FULL, PLAIN, REDUCE, SUMSQ, SUM, NPASS };
    const char *name[NPASS] = {"input frame, full (in cache)", "all-gather frame, plain (in cache)",
                               "reducing pass, sketched", "reducing pass, squares only", "reducing pass, plain sum"};
    double t[NPASS][MAXROUNDS];
    double sink = 0.0;
    for (int r = 0; r < rounds; r++) {
        for (int p = 0; p < NPASS; p++) {
            Sketch out[3];
            memset(out, 0, sizeof(out));
            double t0 = bench_now();
            if (p == FULL || p == PLAIN) {
                for (size_t g0 = 0; g0 < STREAM; g0 += FRAME) frame_sketches(&g, frame, FRAME, p == FULL, &out[0]);
            } else if (p == REDUCE)
                reduce_sketched(&g, frame, FRAME, a, STREAM, out);
            else if (p == SUMSQ)
                sink += reduce_sumsq(frame, FRAME, a, STREAM);
            else
                reduce_plain(frame, FRAME, a, STREAM);
            t[p][r] = (bench_now() - t0) * 1e9 / (double)STREAM;
            sink += out[0].s[0] + out[2].s[1];
        }
    }
    printf("sketch.h's passes, ns per element (median of %d rounds; %zu elements a pass):\n", rounds, STREAM);
    double m[NPASS];
    for (int p = 0; p < NPASS; p++) {
        m[p] = median(t[p], rounds);
        printf("  %-36s %.3f\n", name[p], m[p]);
    }
    printf("  the checks' extra in a reducing pass: %.3f ns an element against the squares' pass (-ic 0 with dp), "
           "%.3f against the plain sum\n", m[REDUCE] - m[SUMSQ], m[REDUCE] - m[SUM]);
    if (sink == 1.2345) printf(" \n");  // uses the results
    sketch_gen_free(&g);
    free(frame);
    free(a);
    return 0;
}
