/*
 * trainer.h: what a trainer's main() does around the training loop: the
 * clock, the exit for a bad job, FLOPs per token, the random numbers of
 * sampling, and the checks of a job before any rank starts (the model, the
 * layout, the batch, the data, the checkpoint to resume from).
 */
#ifndef LLM3D_TRAINER_H
#define LLM3D_TRAINER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpt2.h"
#include "checkpoint.h"
#include "dataloader.h"
#include "parallel.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void die_usage(const char *msg) {
    fprintf(stderr, "train_gpt2: %s\n", msg);
    exit(2);
}

// FLOPs per token for forward + backward: 6 per parameter (lm_head included,
// position embeddings excluded), plus attention's 6 * L * T * C (causal half of 12)
static double flops_per_token(const GPT2Config *c, int T) {
    double n = (double)param_count(c) - (double)c->maxT * c->C;
    return 6.0 * n + 6.0 * c->L * (double)T * c->C;
}

// xorshift* for sampling; its state is one number
static float random_f32(uint64_t *state) {
    *state ^= *state >> 12; *state ^= *state << 25; *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

// the model's shape: from a descriptor (returns 1), or from a model file's header (0)
static int model_config(const Options *o, GPT2Config *c) {
    char err[512];
    int rc = options_model(o, c, err, sizeof(err));
    if (rc < 0) die_usage(err);
    return rc;
}

// everything that can be checked before ranks start (so a bad job is
// refused once, by the launcher): the layout against the model, the batch
// shape, the data. Returns micro-batches per step.
static int check_job(const Options *o, const GPT2Config *c) {
    char err[512];
    Grid g;
    if (o->T > c->maxT) {
        snprintf(err, sizeof(err), "flag -t: T = %d exceeds the model's maxT = %d (%s)", o->T, c->maxT, o->init);
        die_usage(err);
    }
    if (grid_init(&g, o->np, o->tp, o->pp, 0, err, sizeof(err)) != 0) die_usage(err);
    if (grid_check_model(&g, c->L, c->NH, c->C, c->Vp, err, sizeof(err)) != 0) die_usage(err);
    int accum = batch_accum(o, g.dp, err, sizeof(err));
    if (accum < 0) die_usage(err);
    if (parallel_launched_rank()) return accum;  // its launcher opened (and hashed) the data just now
    DataLoader probe;
    if (dataloader_init(&probe, o->train_pattern, o->B, o->T, 0, g.dp, o->shuffle, 0, c->V, err, sizeof(err)) != 0)
        die_usage(err);
    dataloader_free(&probe);
    if (o->val_every > 0) {
        if (dataloader_init(&probe, o->val_pattern, o->B, o->T, 0, g.dp, 0, 0, c->V, err, sizeof(err)) != 0) die_usage(err);
        dataloader_free(&probe);
    }
    return accum;
}

// the checkpoint key and, with -y or -ys, the checkpoint to resume from
// (checkpoint.h's ckpt_setup, shared with train_gpt2cu), verified before any
// rank starts, so that a bad one is refused once. Returns 1 when resuming.
static int checkpoint_setup(const Options *o, const GPT2Config *c, uint8_t key[32], CkptState *ck, char *dir, size_t dirlen) {
    char err[1600];
    // the launcher hashes the files; the ranks it starts moments later check the seal and the sizes
    int rc = ckpt_setup(o, c, !parallel_launched_rank(), key, ck, dir, dirlen, err, sizeof(err));
    if (rc < 0) die_usage(err);
    return rc;
}

#endif
