/*
 * gpu_setup.cuh: what the GPU trainer checks and reads before it builds the
 * model, apart from the model and the loop in train_gpt2.cu.
 *
 * defines:
 *   gpu_check_shapes   the shapes the kernels can run (C, head size, Vp, B*T)
 *   GpuOptions         the flags only the GPU trainer has (-r, -fa), taken out
 *                      of argv by gpu_options_take; gpu_usage_lines for -h
 *   gpu_peak_flops     the bf16 tensor-core peak of known GPUs, for MFU
 *
 * Host code only: test_gpt2.cu checks all of it without a GPU.
 * Errors follow errors.h: one line naming the flag or field and the value.
 */
#ifndef LLM3D_GPU_SETUP_CUH
#define LLM3D_GPU_SETUP_CUH

#include <stddef.h>
#include <string.h>

#include "llm3d/errors.h"
#include "llm3d/gpt2.h"           // GPT2Config
#include "llm3d/cuda/attention.cuh"    // attention_supports

// ----------------------------------------------------------------------------
// host-side shape rules: what the kernels need, checked before anything runs

// 0 if the kernels can run this model at (B, T) with tensor-parallel size
// tp (a rank holds C/tp channels of attention and the MLP, NH/tp heads and
// Vp/tp vocabulary rows; grid_check_model says whether they split at all);
// else one line naming the field
static int gpu_check_shapes(const GPT2Config *c, int B, int T, int tp, const char *what, char *err, size_t errlen) {
    if (c->C % 8 != 0)
        return errorf(err, errlen, "%s: C = %d: the GPU kernels need C to be a multiple of 8", what, c->C);
    if (!attention_supports(c->C / c->NH))
        return errorf(err, errlen, "%s: head size C/NH = %d/%d = %d: the GPU attention supports 16, 32, 64 and 128",
                      what, c->C, c->NH, c->C / c->NH);
    if (c->Vp % 8 != 0)
        return errorf(err, errlen, "%s: Vp = %d: the GPU kernels need the padded vocab to be a multiple of 8", what, c->Vp);
    if (tp > 1 && (c->Vp / tp) % 8 != 0) {  // (grid_check_model has checked that the heads and rows split)
        return errorf(err, errlen, "flag -tp %d: %s: Vp / tp = %d / %d vocabulary rows per rank: the GPU kernels need a "
                      "multiple of 8", tp, what, c->Vp, tp);
    }
    if ((long)B * T * 4 * c->C > 2147483647L || (long)B * T * c->NH > 2147483647L)
        return errorf(err, errlen, "flag -b/-t: B*T = %ld rows is too many for one micro-batch at C = %d", (long)B * T, c->C);
    return 0;
}

// GPU flags taken out of argv before flags.h's options_parse sees it (argv is
// flag/value pairs): -fa, which the CPU trainer has no use for, and -r, which
// flags.h's table lists for both (the CPU trainer takes it and keeps every
// activation anyway)
typedef struct {
    int recompute;     // -r: 1 = recompute GELU in the backward instead of keeping it per layer
    int attention_tc;  // -fa: 1 = tensor-core attention (bf16 build), 0 = the fp32-FMA kernels
} GpuOptions;

static const char *gpu_usage_lines =
    "  -fa           attention on tensor cores (0/1, default 1 in the bf16 build; fp32 builds: 0)\n";

static int gpu_options_take(GpuOptions *g, int *argc, char **argv, char *err, size_t errlen) {
    g->recompute = 1;
#ifdef ENABLE_FP32
    g->attention_tc = 0;
#else
    g->attention_tc = 1;
#endif
    int out = 1;
    for (int a = 1; a < *argc; a += 2) {
        int *dst = strcmp(argv[a], "-r") == 0 ? &g->recompute : strcmp(argv[a], "-fa") == 0 ? &g->attention_tc : NULL;
        if (dst == NULL) {
            argv[out++] = argv[a];
            if (a + 1 < *argc) argv[out++] = argv[a + 1];
            continue;
        }
        if (a + 1 >= *argc) return errorf(err, errlen, "flag %s needs a value", argv[a]);
        const char *v = argv[a + 1];
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
            return errorf(err, errlen, "flag %s: '%s' is not 0 or 1%s", argv[a], v, dst == &g->recompute && strcmp(v, "2") == 0
                          ? " (llm.c's -r 2 also recomputes LayerNorm, which this trainer does not)" : "");
        *dst = v[0] - '0';
    }
#ifdef ENABLE_FP32
    if (g->attention_tc)
        return errorf(err, errlen, "flag -fa: 1: the tensor-core attention is bf16; this is the fp32 build");
#endif
    *argc = out;
    argv[out] = NULL;
    return 0;
}

// bf16 dense tensor-core peak of the GPU, in FLOP/s; 0 when not in the table
static double gpu_peak_flops(const char *name) {
    if (strstr(name, "H200") != NULL) return 989e12;
    if (strstr(name, "H100") != NULL || strstr(name, "H800") != NULL)
        return strstr(name, "PCIe") != NULL ? 756e12 : 989e12;
    if (strstr(name, "A100") != NULL || strstr(name, "A800") != NULL) return 312e12;
    return 0.0;
}

#endif
