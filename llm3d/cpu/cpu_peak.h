/*
 * cpu_peak.h: this machine's FMA peak, measured where it is used: what the
 * CPU trainer's MFU and the CPU benchmarks' shares of the peak are against.
 *
 * defines: cpu_count, cpu_fma_peak(threads, runs) in GFLOP/s.
 *
 * Each of OpenMP's threads runs 12 independent chains of this build's
 * vector multiply-adds (two FMA units with a latency of four cycles need
 * eight in flight) on registers only, 48 million of them, about 15 ms. A
 * thread's rate is its multiply-adds over the CPU time it got: what a core
 * does while it runs this code. Wall-clock time would count the time another
 * program held a core, and the peak of a busy machine would come out low
 * (from 190 to 490 GFLOP/s on the same 2 cores), flattering whatever is
 * compared with it. The peak of `threads` threads is their mean rate times
 * the smaller of threads and the CPUs this process may run on: more threads
 * than CPUs share the cores. The machine may be shared, so the rate is the
 * best of `runs` runs.
 */
#ifndef LLM3D_CPU_PEAK_H
#define LLM3D_CPU_PEAK_H

#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define CPU_PEAK_VL 16
#elif defined(__AVX__)
#define CPU_PEAK_VL 8
#else
#define CPU_PEAK_VL 4
#endif
#define CPU_PEAK_CHAINS 12

typedef float cpu_peak_vec __attribute__((vector_size(CPU_PEAK_VL * sizeof(float))));

// one thread's CPU time, seconds
static double cpu_thread_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// one run: the mean of OpenMP's threads' rates, GFLOP/s per thread
static double cpu_fma_rate_per_thread(void) {
    const long iters = 4000000;
    double rate = 0.0;  // the sum of the threads' GFLOP/s
    float sink = 0.0f;
    int nthreads = 0;
    #pragma omp parallel reduction(+ : sink, rate, nthreads)
    {
        nthreads += 1;
        cpu_peak_vec acc[CPU_PEAK_CHAINS], mul, add;
        for (int i = 0; i < CPU_PEAK_VL; i++) {
            mul[i] = 0.9999999f;
            add[i] = 1e-7f;
        }
        for (int c = 0; c < CPU_PEAK_CHAINS; c++)
            for (int i = 0; i < CPU_PEAK_VL; i++) acc[c][i] = (float)(c + i);
        double t0 = cpu_thread_time();
        for (long it = 0; it < iters; it++) {
            for (int c = 0; c < CPU_PEAK_CHAINS; c++) acc[c] = acc[c] * mul + add;  // one FMA each
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
        double t = cpu_thread_time() - t0;
        for (int c = 0; c < CPU_PEAK_CHAINS; c++) sink += acc[c][0];
        rate += (double)iters * CPU_PEAK_CHAINS * CPU_PEAK_VL * 2.0 / (t > 1e-9 ? t : 1e-9) * 1e-9;
    }
    if (sink == 12345.0f) rate += 1e-9;  // uses the result
    return rate / nthreads;
}

// the CPUs this process may run on: OpenMP's count follows the affinity
// mask (taskset, a container's cpuset), where sysconf counts them all
static int cpu_count(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? (int)cpus : 1;
#endif
}

static double cpu_fma_peak(int threads, int runs) {
    double best = 0.0;
    for (int r = 0; r < runs; r++) {
        double g = cpu_fma_rate_per_thread();
        if (g > best) best = g;
    }
    int cpus = cpu_count();
    return best * (threads < cpus ? threads : cpus);
}

#endif
