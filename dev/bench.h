/*
 * dev/bench.h: what the CPU benchmarks measure their results against, on the
 * machine and in the run where they measure them.
 *
 * defines: bench_now (seconds), bench_fma_peak (GFLOP/s), bench_memory_bandwidth
 * (GB/s), bench_best (the largest of a few runs).
 *
 * The peak is what this build's vector FMAs can do on all of OpenMP's
 * threads: each thread runs 12 independent chains of vector multiply-adds
 * (two FMA units with a latency of four cycles need eight in flight) on
 * registers only. Each thread's rate is its multiply-adds over the CPU time
 * it got, and the peak is the sum of those rates: what the cores do while
 * they run this code. Wall-clock time would count the time another program
 * held a core, and the peak of a busy machine would come out low (from 190
 * to 490 GFLOP/s on the same 2 cores), flattering whatever is compared with
 * it. More threads than CPUs would each count a whole core: the sum is then
 * scaled to the CPUs online. The memory bandwidth is each thread adding its
 * part of one array far larger than the caches into another in place,
 * counted as bytes read plus bytes written. The machine may be shared, so
 * take the best of several runs, and measure both before and after the thing
 * being timed. Built with -DBENCH_CPU_TIME, bench_now counts only the CPU
 * time the process got, which on a busy machine compares code more steadily
 * (with one thread: with more, it counts their waits at barriers too).
 */
#ifndef LLM3D_DEV_BENCH_H
#define LLM3D_DEV_BENCH_H

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static double bench_now(void) {
    struct timespec ts;
#ifdef BENCH_CPU_TIME
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__AVX512F__)
#define BENCH_VL 16
#elif defined(__AVX__)
#define BENCH_VL 8
#else
#define BENCH_VL 4
#endif
#define BENCH_CHAINS 12

typedef float bench_vec __attribute__((vector_size(BENCH_VL * sizeof(float))));

// one thread's CPU time, seconds
static double bench_thread_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// one run of the FMA peak, GFLOP/s over all threads
static double bench_fma_peak_once(void) {
    const long iters = 4000000;
    double rate = 0.0;  // the sum of the threads' GFLOP/s
    float sink = 0.0f;
    #pragma omp parallel reduction(+ : sink, rate)
    {
        bench_vec acc[BENCH_CHAINS], mul, add;
        for (int i = 0; i < BENCH_VL; i++) {
            mul[i] = 0.9999999f;
            add[i] = 1e-7f;
        }
        for (int c = 0; c < BENCH_CHAINS; c++)
            for (int i = 0; i < BENCH_VL; i++) acc[c][i] = (float)(c + i);
        double t0 = bench_thread_time();
        for (long it = 0; it < iters; it++) {
            for (int c = 0; c < BENCH_CHAINS; c++) acc[c] = acc[c] * mul + add;  // one FMA each
            // keeps the compiler from folding the loop, and mul and add in
            // registers: with add read from memory by every FMA (as GCC 12
            // did when mul alone was named) the loop ran at two thirds of
            // the rate the matmul kernel reaches
#if defined(__x86_64__) || defined(__i386__)
            __asm__ volatile("" : "+v"(mul), "+v"(add));
#elif defined(__aarch64__)
            __asm__ volatile("" : "+w"(mul), "+w"(add));  // AArch64's SIMD registers
#endif
        }
        double t = bench_thread_time() - t0;
        for (int c = 0; c < BENCH_CHAINS; c++) sink += acc[c][0];
        rate += (double)iters * BENCH_CHAINS * BENCH_VL * 2.0 / (t > 1e-9 ? t : 1e-9) * 1e-9;
    }
    if (sink == 12345.0f) rate += 1e-9;  // uses the result
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 0 && nthreads > cpus) rate *= (double)cpus / nthreads;
    return rate;
}

static double bench_fma_peak(int runs) {
    double best = 0.0;
    for (int r = 0; r < runs; r++) {
        double g = bench_fma_peak_once();
        if (g > best) best = g;
    }
    return best;
}

// memory bandwidth, GB/s over all threads: y += x over two arrays of 256 MiB,
// each thread its own part, counted as the bytes read (x and y) and written
// (y), both aligned to a cache line as the trainer's arrays are. In place,
// as AdamW and the norm work: a copy into a third array would
// also read each line of the destination before writing it (the cache's read
// for ownership), traffic that a count of bytes read and written leaves out,
// and AdamW then measured at 176 to 177% of it.
static double bench_memory_bandwidth(int runs) {
    size_t n = (size_t)64 << 20;
    float *x = (float *)aligned_alloc(64, n * sizeof(float)), *y = (float *)aligned_alloc(64, n * sizeof(float));
    if (x == NULL || y == NULL) { free(x); free(y); return 0.0; }
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int r = 0; r < runs + 1; r++) {  // the first run touches the pages
        double t0 = bench_now();
        #pragma omp parallel
        {
            int tid = 0, nt = 1;
#ifdef _OPENMP
            tid = omp_get_thread_num();
            nt = omp_get_num_threads();
#endif
            size_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
            if (r == 0) {
                memset(x + lo, 0, (hi - lo) * sizeof(float));
                memset(y + lo, 0, (hi - lo) * sizeof(float));
            } else {
                for (size_t i = lo; i < hi; i++) y[i] += x[i];
            }
        }
        double gbs = 3.0 * n * sizeof(float) / (bench_now() - t0) * 1e-9;
        if (r > 0 && gbs > best) best = gbs;
        sink = sink + y[n / 2];  // the sums are used
    }
    free(x);
    free(y);
    return best;
}

#endif
