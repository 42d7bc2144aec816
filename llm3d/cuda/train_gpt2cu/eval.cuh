/*
 * llm3d/cuda/train_gpt2cu/eval.cuh: the GPU trainer's evaluations, run
 * between steps: the val loss, HellaSwag, and the sample printed from the
 * model.
 *
 * defines:
 *   eval_forward      one micro-batch forward through the pipeline, its
 *                     losses kept and its messages checked
 *   evaluate          the mean val loss over the job
 *   hellaswag_eval    the HellaSwag examples right, summed over the job
 *   run_evaluations   the evaluations due before a step, into its log line
 *   sample            tokens sampled from the model, printed
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after world_sum, and it uses that file's GPT2, Parallel,
 * forward_in_model_order (pipeline_run.cuh), head_take, world_loss_sum and
 * world_sum.
 */
#ifndef LLM3D_GPU_EVAL_CUH
#define LLM3D_GPU_EVAL_CUH

#include <stdio.h>
#include <stdlib.h>

#include "dataloader.h"  // DataLoader, next_batch
#include "llm3d/hellaswag.h"   // HsSet, HsBatch
#include "llm3d/tokenizer.h"   // Tokenizer, tokenizer_decode, tokenizer_safe_text
#include "llm3d/trainer.h"     // Job, LogLine, evaluate_due, hellaswag_due

// one micro-batch (staged from m->inputs, m->targets into set i's buffers)
// forward through the pipeline as the i-th of an evaluation, its parts in
// model order (forward_in_model_order): its losses add into sc.losses on
// the last part; its messages are checked before the next batch
static void eval_forward(GPT2 *m, Parallel *par, int i) {
    Acts *a = &m->acts[i % m->nacts];
    gpt2_stage_batch(m, a, 0);
    if (m->shard.pp > 1) nccl_mac_step_begin(par->nccl);
    forward_in_model_order(m, a, i);
    mac_check_or_exit(m, par, "in an evaluation");
}

// the mean loss over `batches` micro-batches of the val stream on each
// data-parallel rank (each its own slice), passed down the pipeline; every
// rank returns it
static float evaluate(GPT2 *m, Parallel *par, DataLoader *val, int batches) {
    dataloader_reset(val);
    gpt2_zero_losses(m);
    for (int i = 0; i < batches; i++) {
        next_batch(val, m->inputs, m->targets);
        eval_forward(m, par, i);
    }
    return (float)(world_loss_sum(m, par, NULL) / ((double)m->B * m->T * batches * m->shard.dp));
}

// HellaSwag (hellaswag.h): this data-parallel rank's examples, packed into
// micro-batches, forward through the pipeline; on the last stage each
// batch's per-token losses summed over tp (each position's is on the rank
// holding its target) and scored on tp rank 0. Returns the examples right,
// summed over the job, on every rank.
static float hellaswag_eval(GPT2 *m, Parallel *par, const HsSet *hs) {
    const Shard *s = &m->shard;
    int next, hi, nb = hs_batches(hs, s->dp, m->B);
    hs_rank_range(hs->n, s->dp, s->dp_rank, &next, &hi);
    HsBatch hb;
    if (hs_batch_init(&hb, m->B, m->T) != 0) {
        fprintf(stderr, "train_gpt2cu: out of memory allocating a HellaSwag batch\n");
        exit(1);
    }
    Progress progress;
    progress_start(&progress, par->grid.rank == 0, nb);
    float correct = 0.0f;
    for (int i = 0; i < nb; i++) {
        progress_tick(&progress, i);
        hs_batch_fill(hs, &next, hi, &hb, m->inputs, m->targets);
        gpt2_zero_losses(m);
        eval_forward(m, par, i);
        if (!s->last) continue;
        if (s->tp > 1) nccl_allreduce(par->nccl, &par->nccl->tp, m->sc.losses, (size_t)m->B * m->T, ncclFloat32, OP_SUM);
        gpt2_loss_sum(m);  // the losses to m->pinned
        if (s->tp_rank == 0) correct += (float)hs_batch_score(hs, &hb, m->pinned, NULL);
    }
    hs_batch_free(&hb);
    progress_end(&progress);
    return world_sum(m, par, correct);
}

// the evaluations due before step `step` (step == steps: the final model's),
// printed by rank 0, into l: the val loss and HellaSwag
static void run_evaluations(GPT2 *m, Parallel *par, Job *job, int step, LogLine *l) {
    int rank0 = par->grid.rank == 0;
    if (evaluate_due(job, step)) {
        l->val_loss = evaluate(m, par, &job->val, job->val_batches);
        if (rank0) printf("val loss %.6f\n", l->val_loss);
    }
    if (hellaswag_due(job, step)) l->hellaswag = report_hellaswag(job, hellaswag_eval(m, par, &job->hs), rank0);
}

// prints gen_tokens tokens sampled from the model, starting from EOT, as
// text safe for a terminal (tokenizer.h's tokenizer_safe_text)
static void sample(GPT2 *model, const Tokenizer *tok, int gen_tokens, uint64_t *rng) {
    int B = model->B, T = model->T, V = model->config.V, Vp = model->config.Vp;
    SafeText text = {{0}, 0};
    char shown[TOKENIZER_SAFE_MAX];
    int eot = tok->eot_token;
    for (int i = 0; i < B * T; i++) model->inputs[i] = eot, model->targets[i] = eot;
    floatX *row = (floatX *)host_alloc((size_t)Vp * sizeof(floatX), "sample logits");
    float *z = (float *)host_alloc((size_t)V * sizeof(float), "sample logits");
    int n = gen_tokens < T ? gen_tokens : T;
    head_take(model, 0);  // between steps: every logits block is free
    printf("generating:\n---\n");
    for (int t = 1; t < n; t++) {
        gpt2_forward(model, FWD_LOGITS, 0.0f);
        CUDA_CHECK(cudaMemcpyAsync(row, model->acts[0].logits + (size_t)(t - 1) * Vp, (size_t)Vp * sizeof(floatX),
                                   cudaMemcpyDeviceToHost, model->stream));
        CUDA_CHECK(cudaStreamSynchronize(model->stream));
        for (int i = 0; i < V; i++) z[i] = floatx_to_host_float(row[i]);
        int next = sample_token(z, V, random_f32(rng));
        model->inputs[t] = next;
        int len;
        const char *s = tokenizer_decode(tok, next, &len);
        if (s != NULL) fwrite(shown, 1, (size_t)tokenizer_safe_text(&text, s, len, shown, sizeof(shown)), stdout);
        fflush(stdout);
    }
    fwrite(shown, 1, (size_t)tokenizer_safe_text(&text, NULL, 0, shown, sizeof(shown)), stdout);  // a character cut short
    head_give_back(model, 0);
    printf("\n---\n");
    free(row);
    free(z);
}

#endif  // LLM3D_GPU_EVAL_CUH
