/*
 * gpu_checks.cuh: the GPU side of the job's own checks, run between steps.
 *
 * defines:
 *   consistency_check   -ck: the data-parallel replicas compare a SHA-256
 *                       of each parameter tensor; trainer.h judges
 *   drift_parameter     -fault drift: one parameter changed on this rank, so
 *                       that the check above has something to find
 *   watch_report        -wr: every rank's compute and wait per step,
 *                       gathered for trainer.h's watch_judge
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after gpt2_step_loss, and it uses that file's GPT2, Parallel,
 * unit_acquire, unit_release, param_at, gpu_sync and host_alloc.
 */
#ifndef LLM3D_GPU_CHECKS_CUH
#define LLM3D_GPU_CHECKS_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_comm.h"  // nccl_allgather, nccl_wait_ms, nccl_barrier; wait_since (shm_comm.h)
#include "secure.h"     // Sha256
#include "trainer.h"    // replicas_judge, Watch, watch_judge

// every K steps (-ck): the data-parallel replicas compare a SHA-256 of each
// of the parameter tensors they compute with (ZeRO-3 gathers each unit),
// all-gathered over the dp group; trainer.h's replicas_judge names the rank
// that differs, the group's first member says so, and the job ends (as
// train_gpt2.c's)
static void consistency_check(GPT2 *m, Parallel *par, int step) {
    int dp = m->shard.dp;
    if (dp == 1) return;
    int n = unit_table_tensors(&m->ut), t = 0;
    size_t X = sizeof(floatX), bytes = 32 * (size_t)n;
    floatX *host = (floatX *)host_alloc(largest_unit(m) * X, "unit");
    uint8_t *digests = (uint8_t *)host_alloc(bytes * (size_t)dp, "digests"), *dev = m->digests;
    for (int u = 0; u < m->ut.n; u++) {
        const floatX *p = unit_acquire(m, u);
        gpu_sync(m, "the consistency check");
        CUDA_CHECK(cudaMemcpy(host, p, m->ut.units[u].size * X, cudaMemcpyDeviceToHost));
        int kind = m->ut.units[u].kind;
        size_t off = 0;
        for (int k = 0; k < unit_tensor_count(kind); k++) {
            size_t size = local_tensor_size(&m->config, &m->shard, unit_tensor(kind, k));
            Sha256 h;
            sha256_init(&h);
            sha256_update(&h, host + off, size * X);
            sha256_final(&h, digests + 32 * (size_t)t++);
            off += size;
        }
        unit_release(m, u);
    }
    uint8_t *mine = dev + bytes * (size_t)par->nccl->dp.group.me;  // in place: NCCL's rule for in == out
    CUDA_CHECK(cudaMemcpy(mine, digests, bytes, cudaMemcpyHostToDevice));
    nccl_allgather(par->nccl, &par->nccl->dp, mine, dev, bytes, ncclUint8);
    gpu_sync(m, "the consistency check");
    CUDA_CHECK(cudaMemcpy(digests, dev, bytes * (size_t)dp, cudaMemcpyDeviceToHost));
    char msg[4096];
    if (replicas_judge(digests, dp, n, par->nccl->dp.group.ranks, &m->ut, &m->shard, msg, sizeof(msg))) {
        if (par->nccl->dp.group.me == 0) {
            fflush(stdout);
            fprintf(stderr, "rank %d: step %d: data-parallel replicas disagree: %s\n", par->grid.rank, step, msg);
            fflush(stderr);
        }
        nccl_barrier(par->nccl, &par->nccl->dp);  // the line is out before any rank of the group exits
        nccl_abort_all(par->nccl);
        exit(1);
    }
    free(host);
    free(digests);
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

// the watch report (trainer.h) after this step: the waits of the steps
// since the last report, measured once the GPU has done them (nccl_wait_ms;
// *waited: the clock at the last report), then every rank's compute and
// wait per step all-gathered over the world; rank 0 judges
static void watch_report(GPT2 *m, Parallel *par, Watch *w, double *waited, int step, LogLine *l) {
    gpu_sync(m, "the watch report");
    watch_add_wait(w, wait_since(waited, nccl_wait_ms(par->nccl)));
    int world = par->grid.world;
    float *host = (float *)host_alloc((size_t)world * WATCH_FLOATS * sizeof(float), "the watch report"), *dev;
    watch_pack(w, host + (size_t)par->grid.rank * WATCH_FLOATS);
    CUDA_CHECK(cudaMalloc((void **)&dev, (size_t)world * WATCH_FLOATS * sizeof(float)));
    float *mine = dev + (size_t)par->grid.rank * WATCH_FLOATS;
    CUDA_CHECK(cudaMemcpy(mine, host + (size_t)par->grid.rank * WATCH_FLOATS, WATCH_FLOATS * sizeof(float),
                          cudaMemcpyHostToDevice));
    nccl_allgather(par->nccl, &par->nccl->world, mine, dev, WATCH_FLOATS, ncclFloat32);
    gpu_sync(m, "the watch report");
    CUDA_CHECK(cudaMemcpy(host, dev, (size_t)world * WATCH_FLOATS * sizeof(float), cudaMemcpyDeviceToHost));
    if (par->grid.rank == 0) watch_judge(w, step, host, l);
    CUDA_CHECK(cudaFree(dev));
    free(host);
}

#endif  // LLM3D_GPU_CHECKS_CUH
