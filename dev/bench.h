/*
 * dev/bench.h: what the CPU benchmarks measure their results against, on the
 * machine and in the run where they measure them.
 *
 * defines: bench_now (seconds), bench_fma_peak (GFLOP/s), bench_memory_bandwidth
 * (GB/s).
 *
 * The peak is what this build's vector FMAs can do on all of OpenMP's
 * threads, measured by CPU time as cpu_peak.h says (the trainer's MFU is
 * against the same measure). The memory bandwidth is each thread adding its
 * part of one array far larger than the caches into another in place,
 * counted as bytes read plus bytes written. The machine may be shared, so
 * take the best of several runs, and measure both before and after the thing
 * being timed. Built with -DBENCH_CPU_TIME, bench_now counts only the CPU
 * time the process got, which on a busy machine compares code more steadily
 * (with one thread: with more, it counts their waits at barriers too).
 */
#ifndef LLM3D_DEV_BENCH_H
#define LLM3D_DEV_BENCH_H

#include "llm3d/cpu/cpu_peak.h"
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

// the FMA peak of all of OpenMP's threads (cpu_peak.h), the best of `runs`
static double bench_fma_peak(int runs) {
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    return cpu_fma_peak(nthreads, runs);
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
