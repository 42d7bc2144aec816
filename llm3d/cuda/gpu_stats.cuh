/*
 * gpu_stats.cuh: llm.c's -lg N in the GPU trainer: a line of the GPU's
 * state (utilization, clocks, power, temperature, what holds the clocks
 * back) every N steps, read through NVML.
 *
 * defines:
 *   GpuStats, gpu_stats_open   NVML found and this rank's GPU in it, or one
 *                              line saying why there will be no stats
 *   GpuSample, gpu_stats_read  one reading of the GPU
 *   gpu_stats_format           a reading as the line -lg prints (its parts:
 *                              gpu_stats_value, gpu_stats_percent,
 *                              gpu_stats_throttle)
 *   gpu_stats_print            read and print it
 *
 * NVML (libnvidia-ml.so.1) comes with the NVIDIA driver, not with the CUDA
 * toolkit: a machine that builds the trainer may have neither the library
 * nor nvml.h. So the build does not link it: gpu_stats_open loads it with
 * dlopen at run time and looks up the few calls it needs, declared here
 * with NVML's C types (its handles are pointers, its enums ints, its
 * return codes 0 for success). Without the library, or without this GPU
 * in it, -lg prints one line saying so and nothing more.
 *
 * Host code only: test_gpt2.cu checks gpu_stats_format and the line of a
 * machine without NVML without a GPU.
 */
#ifndef LLM3D_GPU_STATS_CUH
#define LLM3D_GPU_STATS_CUH

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

// NVML's enums and flags used here, by their documented values
enum { NVML_CLOCK_SM_ = 1, NVML_TEMPERATURE_GPU_ = 0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN_ = 1 };

typedef struct { unsigned int gpu, memory; } NvmlUtilization;  // nvmlUtilization_t: percent over the last sample period

typedef struct {
    void *lib;     // the dlopen handle, or NULL: no stats
    void *device;  // nvmlDevice_t of this rank's GPU
    int (*utilization)(void *, NvmlUtilization *);
    int (*clock)(void *, int, unsigned int *);
    int (*max_clock)(void *, int, unsigned int *);
    int (*power)(void *, unsigned int *);
    int (*power_limit)(void *, unsigned int *);
    int (*temperature)(void *, int, unsigned int *);
    int (*temperature_threshold)(void *, int, unsigned int *);
    int (*fan)(void *, unsigned int *);
    int (*throttle)(void *, unsigned long long *);
} GpuStats;

// one reading; a field NVML could not give is -1 (an H100 SXM has no fan)
typedef struct {
    long compute, memory, fan, clock, max_clock, watts, max_watts, celsius, slowdown_celsius;
    long long throttle;  // NVML's bit mask of what limits the clocks now; -1: unknown
} GpuSample;

// the NVML call name, found in the library, into *fn; 0, or -1
static int gpu_stats_symbol(void *lib, const char *name, void **fn) {
    *fn = dlsym(lib, name);
    return *fn != NULL ? 0 : -1;
}

// when every > 0: NVML loaded from library (NULL: the driver's
// libnvidia-ml.so.1) and the handle of the CUDA device `device` found by
// its PCI bus id (CUDA's numbering follows CUDA_VISIBLE_DEVICES, NVML's does
// not); else, or when NVML cannot be had, s->lib is NULL, and one line on
// out says there will be no GPU stats, and why
static void gpu_stats_open(GpuStats *s, int every, int device, const char *library, FILE *out) {
    memset(s, 0, sizeof(*s));
    if (every <= 0) return;
    const char *name = library != NULL ? library : "libnvidia-ml.so.1";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(out, "note: flag -lg %d: no GPU stats: NVML is absent (%s cannot be loaded; it comes with the NVIDIA "
                "driver)\n", every, name);
        return;
    }
    int (*init)(void) = NULL;
    int (*by_bus)(const char *, void **) = NULL;
    int missing = gpu_stats_symbol(lib, "nvmlInit_v2", (void **)&init) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetHandleByPciBusId_v2", (void **)&by_bus) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetUtilizationRates", (void **)&s->utilization) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetClockInfo", (void **)&s->clock) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetMaxClockInfo", (void **)&s->max_clock) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetPowerUsage", (void **)&s->power) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetEnforcedPowerLimit", (void **)&s->power_limit) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetTemperature", (void **)&s->temperature) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetTemperatureThreshold", (void **)&s->temperature_threshold) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetFanSpeed", (void **)&s->fan) |
                  gpu_stats_symbol(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", (void **)&s->throttle);
    char bus[64] = "";
    const char *why = NULL;
    if (missing) why = "the library lacks calls this trainer reads";
    else if (init() != 0) why = "nvmlInit failed (no driver, or no permission)";
    else if (cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), device) != cudaSuccess) why = "CUDA gave no PCI bus id";
    else if (by_bus(bus, &s->device) != 0) why = "this GPU's PCI bus id is not NVML's";
    if (why != NULL) {
        fprintf(out, "note: flag -lg %d: no GPU stats: %s (%s)\n", every, why, name);
        dlclose(lib);
        memset(s, 0, sizeof(*s));
        return;
    }
    s->lib = lib;
}

// a reading of the GPU; each field NVML does not give is -1
static GpuSample gpu_stats_read(const GpuStats *s) {
    GpuSample r = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    NvmlUtilization u;
    unsigned int x;
    unsigned long long reasons;
    void *d = s->device;
    if (s->utilization(d, &u) == 0) { r.compute = u.gpu; r.memory = u.memory; }
    if (s->fan(d, &x) == 0) r.fan = x;
    if (s->clock(d, NVML_CLOCK_SM_, &x) == 0) r.clock = x;
    if (s->max_clock(d, NVML_CLOCK_SM_, &x) == 0) r.max_clock = x;
    if (s->power(d, &x) == 0) r.watts = x / 1000;  // NVML: milliwatts
    if (s->power_limit(d, &x) == 0) r.max_watts = x / 1000;
    if (s->temperature(d, NVML_TEMPERATURE_GPU_, &x) == 0) r.celsius = x;
    if (s->temperature_threshold(d, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN_, &x) == 0) r.slowdown_celsius = x;
    if (s->throttle(d, &reasons) == 0) r.throttle = (long long)reasons;
    return r;
}

// x into buf as a number, or "-" where NVML did not give it
static const char *gpu_stats_value(long x, char *buf, size_t len) {
    if (x < 0) snprintf(buf, len, "-");
    else snprintf(buf, len, "%ld", x);
    return buf;
}

// x into buf as a percentage, or "-" where NVML did not give it
static const char *gpu_stats_percent(long x, char *buf, size_t len) {
    if (x < 0) snprintf(buf, len, "-");
    else snprintf(buf, len, "%ld%%", x);
    return buf;
}

// what holds the clocks back, from NVML's bit mask (its
// nvmlClocksThrottleReason values), into buf: "none", or the reasons
static const char *gpu_stats_throttle(long long mask, char *buf, size_t len) {
    static const struct { long long bit; const char *name; } reasons[] = {
        {0x1, "idle"}, {0x2, "application clocks"}, {0x4, "power cap"}, {0x8, "hardware slowdown"},
        {0x10, "sync boost"}, {0x20, "thermal (software)"}, {0x40, "thermal (hardware)"},
        {0x80, "power brake"}, {0x100, "display clocks"},
    };
    if (mask < 0) { snprintf(buf, len, "-"); return buf; }
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
        if (!(mask & reasons[i].bit)) continue;
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, "%s%s", n > 0 ? ", " : "", reasons[i].name);
    }
    if (buf[0] == '\0' && mask == 0) snprintf(buf, len, "none");
    else if (buf[0] == '\0') snprintf(buf, len, "other (0x%llx)", mask);
    return buf;
}

// the line -lg prints, llm.c's fields in its order: compute and memory
// utilization, fan, SM clock against its maximum, power against its limit,
// temperature against the slowdown threshold, and what limits the clocks
static void gpu_stats_format(const GpuSample *r, char *out, size_t len) {
    char v[9][24], why[160];
    snprintf(out, len, "gpu: compute %s | memory %s | fan %s | %s / %s MHz | %s / %s W | %s / %s C | clocks held by: %s",
             gpu_stats_percent(r->compute, v[0], 24), gpu_stats_percent(r->memory, v[1], 24),
             gpu_stats_percent(r->fan, v[2], 24), gpu_stats_value(r->clock, v[3], 24),
             gpu_stats_value(r->max_clock, v[4], 24), gpu_stats_value(r->watts, v[5], 24),
             gpu_stats_value(r->max_watts, v[6], 24), gpu_stats_value(r->celsius, v[7], 24),
             gpu_stats_value(r->slowdown_celsius, v[8], 24), gpu_stats_throttle(r->throttle, why, sizeof(why)));
}

// a reading, printed as one line (nothing without NVML)
static void gpu_stats_print(const GpuStats *s) {
    if (s->lib == NULL) return;
    char line[512];
    GpuSample r = gpu_stats_read(s);
    gpu_stats_format(&r, line, sizeof(line));
    printf("%s\n", line);
    fflush(stdout);
}

#endif  // LLM3D_GPU_STATS_CUH
