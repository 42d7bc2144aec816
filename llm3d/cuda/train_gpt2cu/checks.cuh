/*
 * llm3d/cuda/train_gpt2cu/checks.cuh: the GPU side of the job's own checks,
 * run between steps.
 *
 * defines:
 *   consistency_check   -ck: the data-parallel replicas compare a SHA-256
 *                       of each parameter tensor; watch.h hashes and judges
 *   drift_parameter     -fault drift: one parameter changed on this rank, so
 *                       that the check above has something to find
 *   watch_report        -wr: every rank's compute and wait per step,
 *                       gathered for watch.h's watch_judge
 *   checks_alloc        the buffers of the two checks, sized once, and
 *   checks_free         freed at the end
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after gpt2_step_loss, and it uses that file's GPT2, Parallel,
 * unit_acquire, unit_release, param_at, gpu_sync, world_allgather_floats,
 * host_alloc and device_alloc.
 */
#ifndef LLM3D_GPU_CHECKS_CUH
#define LLM3D_GPU_CHECKS_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "llm3d/parallel/nccl_comm.h"  // nccl_allgather, nccl_wait_ms, nccl_barrier; wait_since (shm_comm.h)
#include "llm3d/trainer.h"    // Job
#include "llm3d/watch.h"      // unit_digests, replicas_judge, print_replicas_disagree, Watch, watch_judge

// every K steps (-ck): the data-parallel replicas compare a SHA-256 of each
// of the parameter tensors they compute with (ZeRO-3 gathers each unit),
// all-gathered over the dp group; watch.h's replicas_judge names the rank
// that differs, the group's first member says so, and the job ends (as
// train_gpt2.c's)
static void consistency_check(GPT2 *m, Parallel *par, int step) {
    int dp = m->shard.dp;
    if (dp == 1) return;
    int n = unit_table_tensors(&m->ut), t = 0;
    size_t X = sizeof(floatX), bytes = 32 * (size_t)n;
    floatX *host = m->unit_host;
    uint8_t *digests = m->digests_host, *dev = m->digests;
    for (int u = 0; u < m->ut.n; u++) {
        const floatX *p = unit_acquire(m, u);
        gpu_sync(m, "the consistency check");
        CUDA_CHECK(cudaMemcpy(host, p, m->ut.units[u].size * X, cudaMemcpyDeviceToHost));
        t += unit_digests(&m->config, &m->shard, m->ut.units[u].kind, host, X, digests + 32 * (size_t)t);
        unit_release(m, u);
    }
    uint8_t *mine = dev + bytes * (size_t)par->nccl->dp.group.me;  // in place: NCCL's rule for in == out
    CUDA_CHECK(cudaMemcpy(mine, digests, bytes, cudaMemcpyHostToDevice));
    nccl_allgather(par->nccl, &par->nccl->dp, mine, dev, bytes, ncclUint8);
    gpu_sync(m, "the consistency check");
    CUDA_CHECK(cudaMemcpy(digests, dev, bytes * (size_t)dp, cudaMemcpyDeviceToHost));
    char msg[4096];
    if (replicas_judge(digests, dp, n, par->nccl->dp.group.ranks, &m->ut, &m->shard, msg, sizeof(msg))) {
        if (par->nccl->dp.group.me == 0) print_replicas_disagree(par->grid.rank, step, msg);
        nccl_barrier(par->nccl, &par->nccl->dp);  // the line is out before any rank of the group exits
        nccl_abort_all(par->nccl);
        exit(1);
    }
}

// -fault drift: this rank's first parameter changed in the copy it computes
// with (ZeRO-3: in its shard, which every replica gathers alike, so no check
// can see it there)
static void drift_parameter(GPT2 *m) {
    size_t j = m->zero == 3 ? unit_lo(m, 0) : 0;
    floatX x;
    gpu_sync(m, "the drift fault");
    CUDA_CHECK(cudaMemcpy(&x, param_at(m, 0, j), sizeof(x), cudaMemcpyDeviceToHost));
    x = (floatX)((float)x + FAULT_DRIFT_DELTA);
    CUDA_CHECK(cudaMemcpy(param_at(m, 0, j), &x, sizeof(x), cudaMemcpyHostToDevice));
}

// the watch report (watch.h) after this step: the waits of the steps
// since the last report, measured once the GPU has done them (nccl_wait_ms;
// m->waited: the clock at the last report), then every rank's compute and
// wait per step all-gathered over the world; rank 0 judges
static void watch_report(GPT2 *m, Parallel *par, Watch *w, int step, LogLine *l) {
    gpu_sync(m, "the watch report");
    watch_add_wait(w, wait_since(&m->waited, nccl_wait_ms(par->nccl)));
    watch_pack(w, w->all + (size_t)par->grid.rank * WATCH_FLOATS);  // in place
    world_allgather_floats(m, par, w->all, m->watch_floats, WATCH_FLOATS, "the watch report");
    if (par->grid.rank == 0) watch_judge(w, step, w->all, l);
}

// the buffers of the checks above, sized once before the first step and
// kept to the end (checks_free). The copy of a unit is as large as the
// largest unit, so it is made only when -ck is on. The watch report's
// floats on the host are the Watch's (watch.h); these are the device's.
static void checks_alloc(GPT2 *m, const Job *job, const Watch *w) {
    int dp = m->shard.dp;
    if (job->opt.check_every > 0 && dp > 1) {
        size_t bytes = 32 * (size_t)unit_table_tensors(&m->ut) * dp;
        m->digests = (uint8_t *)device_alloc(bytes, "replica digests");
        m->digests_host = (uint8_t *)host_alloc(bytes, "replica digests");
        m->unit_host = (floatX *)host_alloc(largest_unit(m) * sizeof(floatX), "unit");
    }
    if (w->every > 0)
        m->watch_floats = (float *)device_alloc((size_t)w->world * WATCH_FLOATS * sizeof(float), "the watch report");
}

static void checks_free(GPT2 *m) {
    cudaFree(m->digests);
    cudaFree(m->watch_floats);
    free(m->digests_host);
    free(m->unit_host);
    m->digests = m->digests_host = NULL;
    m->unit_host = NULL;
    m->watch_floats = NULL;
}

#endif  // LLM3D_GPU_CHECKS_CUH
