/*
 * llm3d/cuda/train_gpt2cu/optimizer.cuh: the GPU trainer's optimizer step, on
 * the host side: which kernels it queues over which parts of the parameters
 * (the kernels themselves are in adamw.cuh).
 *
 * defines:
 *   tied_exchange       the tied wte's gradient halves swapped and added
 *   sp_sum_layernorm_grads
 *                       -sp 1: the LayerNorms' gradients summed over tp
 *   Run, for_each_run   what this rank updates, one run of one tensor at a
 *                       time, under each ZeRO stage
 *   gpt2_norm           the global gradient norm, over the world
 *   AdamHyper, gpt2_apply_update
 *                       clipping and AdamW, then the ZeRO-1/2 all-gather
 *   gpt2_update         the whole step on one rank (the tests)
 *   gpt2_last_norm      the norm, read back to the host
 *   gpt2_rank_norms     each rank's own gradient norm (watch.h's -gp rule),
 *                       as train_gpt2.cu's world_loss_sum gathered them
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after its model's forward and backward, and it uses that file's GPT2,
 * param_at, master_at, grad_at, adam_at, unit_lo, unit_chunk, tied_elems,
 * tp_share_from_lead, gpu_sync and the tp communicator's nccl_allreduce.
 */
#ifndef LLM3D_GPU_OPTIMIZER_CUH
#define LLM3D_GPU_OPTIMIZER_CUH

#include <math.h>

#include "llm3d/cuda/adamw.cuh"    // adamw_kernel, add_into_kernel, sumsq_add_kernel, sumsq_final_kernel
#include "llm3d/gpt2.h"       // unit_tensor, tensor_counted_here, param_is_matrix
#include "llm3d/parallel/nccl_comm.h"  // nccl_sendrecv_mac, nccl_allreduce, nccl_allgather

// ----------------------------------------------------------------------------
// the optimizer step. The gradients were summed over the data-parallel ranks
// unit by unit during the backward (unit_grad_end; ZeRO-0: all-reduce, 1:
// reduce-scatter, 2 and 3: reduce-scatter of every micro-batch's bucket);
// here the tied wte's two halves are added, then the global norm over the
// world and clipping, AdamW on what this rank owns, and (ZeRO-1, 2) the
// updated parameters all-gathered. As train_gpt2.c's gpt2_step_loss and
// gpt2_apply_update.

// the tied wte: the first and the last stage swap their gradients and both
// add (a + b = b + a, so both ends stay bit-identical). The message leaves
// from a copy in tied_peer, as when its MAC tag needed room after the
// payload; sending mine itself should do now, but that has not been tried.
static void tied_exchange(GPT2 *m) {
    const Shard *s = &m->shard;
    size_t n = tied_elems(m), bytes = n * sizeof(floatX);
    if (n == 0) return;
    const Unit *un = &m->ut.units[m->ut.u_wte];
    floatX *mine = m->zero >= 2 ? m->grad_shard + un->shard_offset : m->grads + un->offset;
    floatX *out = m->tied_peer, *in = m->tied_peer + n;
    int peer = grid_rank(&m->grid, s->dp_rank, s->first ? s->pp - 1 : 0, s->tp_rank);
    CUDA_CHECK(cudaMemcpyAsync(out, mine, bytes, cudaMemcpyDeviceToDevice, m->stream));
    nccl_sendrecv_mac(m->nccl, peer, CH_GRADIENT, 0, out, bytes, peer, CH_GRADIENT, 0, in, bytes);
    add_into_kernel<<<grid_for(n / PACK, 256), 256, 0, m->stream>>>(mine, in, n);
    CUDA_CHECK(cudaGetLastError());
}

// what this rank updates, one run of one tensor at a time: ZeRO-0 all its
// units; ZeRO-1/2/3 its 1/dp of each unit (my_chunk: under ZeRO-0 too, for
// the norm, so that every element is counted on one dp rank). A run is
// elements [j, j + n) of unit u, all within tensor `tensor`.
typedef struct { int u, tensor; size_t j, n; } Run;
typedef void (*RunFn)(GPT2 *m, const Run *r, void *ctx);

static void for_each_run(GPT2 *m, RunFn fn, void *ctx, int my_chunk) {
    int split = m->zero >= 1 || my_chunk;
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        size_t lo = split ? unit_lo(m, u) : 0, hi = split ? lo + unit_chunk(m, u) : un->padded, t_off = 0;
        for (int k = 0; k < unit_tensor_count(un->kind); k++) {
            int t = unit_tensor(un->kind, k);
            size_t t_end = t_off + local_tensor_size(&m->config, &m->shard, t);
            size_t a = lo > t_off ? lo : t_off, b = hi < t_end ? hi : t_end;
            if (a < b) {
                Run r = {u, t, a, b - a};
                fn(m, &r, ctx);
            }
            t_off = t_end;
        }
    }
}

static void add_sumsq(GPT2 *m, const Run *r, void *ctx) {
    (void)ctx;
    const Shard *s = &m->shard;
    // each gradient once in the job: replicas over tp and the tied wte
    // copy on the last stage count on one rank only
    if (!tensor_counted_here(s, r->tensor)) return;
    sumsq_add_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, m->stream>>>(m->sc.norm_partial, grad_at(m, r->u, r->j), r->n);
    CUDA_CHECK(cudaGetLastError());
}

typedef struct { float lr, beta1, beta2, eps, weight_decay, max_norm; } AdamHyper;

static void adam_run(GPT2 *m, const Run *r, void *ctx) {
    const AdamHyper *h = (const AdamHyper *)ctx;
    float bc1 = 1.0f - powf(h->beta1, (float)m->adam_t), bc2_sqrt = sqrtf(1.0f - powf(h->beta2, (float)m->adam_t));
    adamw_kernel<<<grid_for(r->n, 256), 256, 0, m->stream>>>(
        param_at(m, r->u, r->j), master_at(m, r->u, r->j), grad_at(m, r->u, r->j), adam_at(m, m->m, r->u, r->j),
        adam_at(m, m->v, r->u, r->j), r->n, h->lr, h->beta1, h->beta2, h->eps,
        param_is_matrix(r->tensor) ? h->weight_decay : 0.0f, h->lr / bc1, bc2_sqrt, m->sc.norm, h->max_norm);
    CUDA_CHECK(cudaGetLastError());
}

// tp > 1: the replicated tensors' gradients from tp rank 0 to the others
// (tp_share_from_lead says why)
static void tp_share_run(GPT2 *m, const Run *r, void *ctx) {
    (void)ctx;
    if (tensor_is_replicated(r->tensor)) tp_share_from_lead(m, grad_at(m, r->u, r->j), r->n);
}

// -sp 1: each LayerNorm's weight and bias gradients came from this rank's
// rows only (train_gpt2.cu's "sequence parallel"), so the step sums them over
// the tp group, after the data-parallel sums and before tp_share_run, one
// all-reduce per run of a LayerNorm tensor. Every tp rank walks the same
// units, which hold the same tensors at the same offsets (the LayerNorms are
// whole on every tp rank), so the runs and the calls line up.
static void sp_layernorm_run(GPT2 *m, const Run *r, void *ctx) {
    (void)ctx;
    if (param_is_layernorm(r->tensor))
        nccl_allreduce(m->nccl, &m->nccl->tp, grad_at(m, r->u, r->j), r->n, NCCL_FLOATX, OP_SUM);
}

static void sp_sum_layernorm_grads(GPT2 *m) {
    if (m->sp) for_each_run(m, sp_layernorm_run, NULL, 0);
}

// the norm (every rank gets it, in sc.norm on the device), queued on the stream
static void gpt2_norm(GPT2 *m) {
    CUDA_CHECK(cudaMemsetAsync(m->sc.norm_partial, 0, NORM_BLOCKS * sizeof(float), m->stream));
    for_each_run(m, add_sumsq, NULL, 1);
    if (m->grid.world > 1) nccl_allreduce(m->nccl, &m->nccl->world, m->sc.norm_partial, NORM_BLOCKS, ncclFloat32, OP_SUM);
    sumsq_final_kernel<<<1, 1024, 0, m->stream>>>(m->sc.norm, m->sc.norm_partial, NORM_BLOCKS);
    CUDA_CHECK(cudaGetLastError());
}

// clipping (by the norm in sc.norm) and AdamW, and the ZeRO-1/2 all-gather
// of the updated parameters; all queued on the stream
static void gpt2_apply_update(GPT2 *m, const AdamHyper *h) {
    const Shard *s = &m->shard;
    m->adam_t++;
    for_each_run(m, adam_run, (void *)h, 0);
    if ((m->zero == 1 || m->zero == 2) && s->dp > 1) {  // everyone's updated chunks, to everyone
        for (int u = 0; u < m->ut.n; u++) {
            const Unit *un = &m->ut.units[u];
            nccl_allgather(m->nccl, &m->nccl->dp, m->params + un->offset + unit_lo(m, u), m->params + un->offset,
                           unit_chunk(m, u), NCCL_FLOATX);
        }
    }
}

// one rank: the whole optimizer step (what the tests run)
[[maybe_unused]] static void gpt2_update(GPT2 *m, float lr, float beta1, float beta2, float eps, float weight_decay, float max_norm) {
    AdamHyper h = {lr, beta1, beta2, eps, weight_decay, max_norm};
    tied_exchange(m);
    gpt2_norm(m);
    gpt2_apply_update(m, &h);
}

static float gpt2_last_norm(GPT2 *m) {
    float *norm = m->pinned + (size_t)m->B * m->T + 1;
    CUDA_CHECK(cudaMemcpyAsync(norm, m->sc.norm, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    gpu_sync(m, "the norm");
    return *norm;
}

// each rank's own gradient norm of the step before the dp reduction, for
// the -gp rule (gathered in world_loss_sum's all-reduce); NULL with dp 1
static const float *gpt2_rank_norms(const GPT2 *m) { return m->rank_norms; }

#endif  // LLM3D_GPU_OPTIMIZER_CUH
