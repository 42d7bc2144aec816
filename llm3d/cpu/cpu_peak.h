/*
 * cpu_peak.h: this machine's FMA peak, measured where it is used: what the
 * CPU trainer's MFU and the CPU benchmarks' shares of the peak are against.
 *
 * defines: cpu_count, cpu_fma_rate(runs) (GFLOP/s of one thread),
 * cpu_fma_peak(threads, runs) in GFLOP/s; for a job of several ranks,
 * CPU_RANK_FLOATS, cpu_rank_record (what a rank tells the others) and
 * cpu_job_peak (the job's peak from all the ranks' records).
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
 *
 * A job's peak counts the CPUs of all its ranks, on each machine the union
 * of their CPU sets (affinity masks). Not rank 0's set: mpirun binds each
 * rank to a core of its own by default, and rank 0's one core made the peak
 * of 2 ranks half what it was, the MFU twice. Not the sum of the sets
 * either: unbound ranks may each run on every CPU, and would count each
 * CPU once per rank. Not the machine's CPUs: taskset or a cpuset may keep
 * the job off some of them. The ranks' CPUs on one machine, at the mean of
 * their ranks' rates, times the smaller of their threads and those CPUs,
 * added up over the machines (ranks tell machines apart by a hash of the
 * host name).
 */
#ifndef LLM3D_CPU_PEAK_H
#define LLM3D_CPU_PEAK_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
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

// the best of `runs` runs: one thread's FMA rate, GFLOP/s
static double cpu_fma_rate(int runs) {
    double best = 0.0;
    for (int r = 0; r < runs; r++) {
        double g = cpu_fma_rate_per_thread();
        if (g > best) best = g;
    }
    return best;
}

static double cpu_fma_peak(int threads, int runs) {
    int cpus = cpu_count();
    return cpu_fma_rate(runs) * (threads < cpus ? threads : cpus);
}

// ----------------------------------------------------------------------------
// a job's peak over its ranks. A rank's record is CPU_RANK_FLOATS floats
// (the collectives carry floats; every integer here is below 2^16, exact):
// [0..2] its host name's hash in 16-bit pieces, [3] its threads, [4] its
// rate per thread (GFLOP/s), [5..] its CPU set, 16 CPUs a float.

#define CPU_SET_MAX 1024                      // CPUs a record can name
#define CPU_RANK_FLOATS (5 + CPU_SET_MAX / 16)

// this process's CPU set into words (CPU_SET_MAX bits); 0, or -1 where the
// kernel will not say (then every CPU up to cpu_count() is taken as its)
static int cpu_affinity(uint64_t words[CPU_SET_MAX / 64]) {
    memset(words, 0, CPU_SET_MAX / 8);
#ifdef SYS_sched_getaffinity
    if (syscall(SYS_sched_getaffinity, 0, (size_t)(CPU_SET_MAX / 8), words) > 0) return 0;
#endif
    int n = cpu_count() < CPU_SET_MAX ? cpu_count() : CPU_SET_MAX;
    for (int c = 0; c < n; c++) words[c / 64] |= 1ull << (c % 64);
    return -1;
}

// this rank's record: threads OpenMP threads measured at rate GFLOP/s each
static void cpu_rank_record(float *rec, int threads, double rate) {
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (const char *p = host; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    uint64_t words[CPU_SET_MAX / 64];
    cpu_affinity(words);
    memset(rec, 0, CPU_RANK_FLOATS * sizeof(float));
    for (int k = 0; k < 3; k++) rec[k] = (float)((h >> (16 * k)) & 0xffff);
    rec[3] = (float)threads;
    rec[4] = (float)rate;
    for (int w = 0; w < CPU_SET_MAX / 16; w++) rec[5 + w] = (float)((words[w / 4] >> (16 * (w % 4))) & 0xffff);
}

// the job's peak, GFLOP/s, from the world ranks' records (all, rank after
// rank); *threads and *cpus get the job's threads and CPUs (over its machines)
static double cpu_job_peak(const float *all, int world, int *threads, int *cpus) {
    double peak = 0.0;
    *threads = *cpus = 0;
    for (int r = 0; r < world; r++) {
        const float *me = all + (size_t)r * CPU_RANK_FLOATS;
        int first = 1;  // the machine's first rank adds up the machine
        for (int q = 0; q < r && first; q++) first = memcmp(all + (size_t)q * CPU_RANK_FLOATS, me, 3 * sizeof(float)) != 0;
        if (!first) continue;
        uint16_t set[CPU_SET_MAX / 16];
        memset(set, 0, sizeof(set));
        int n = 0, machine_threads = 0;
        double rates = 0.0;
        for (int q = r; q < world; q++) {
            const float *rec = all + (size_t)q * CPU_RANK_FLOATS;
            if (memcmp(rec, me, 3 * sizeof(float)) != 0) continue;
            n++;
            machine_threads += (int)rec[3];
            rates += rec[4];
            for (int w = 0; w < CPU_SET_MAX / 16; w++) set[w] |= (uint16_t)rec[5 + w];
        }
        int machine_cpus = 0;
        for (int w = 0; w < CPU_SET_MAX / 16; w++)
            for (int b = 0; b < 16; b++) machine_cpus += (set[w] >> b) & 1;
        if (machine_cpus < 1) machine_cpus = 1;
        peak += rates / n * (machine_threads < machine_cpus ? machine_threads : machine_cpus);
        *threads += machine_threads;
        *cpus += machine_cpus;
    }
    return peak;
}

#endif
