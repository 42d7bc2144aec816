/*
 * llm3d/cpu/train_gpt2/eval.h: the CPU trainer's evaluations, run between
 * steps: the val loss, HellaSwag, and the sample printed from the model.
 *
 * defines:
 *   evaluate          the mean val loss over the job
 *   hellaswag_eval    the HellaSwag examples right, summed over the job
 *   run_evaluations   the evaluations due before a step, into its log line
 *   sample            tokens sampled from the model, printed
 *
 * A part of train_gpt2.c, not a header of its own (as train_gpt2.cu's
 * llm3d/cuda/train_gpt2cu/eval.cuh): train_gpt2.c includes it after
 * pipeline_run.h, and it uses forward_in_model_order and that file's GPT2.
 */
#ifndef LLM3D_CPU_EVAL_H
#define LLM3D_CPU_EVAL_H

// the mean loss over `batches` micro-batches of the val stream on each
// data-parallel rank (each rank its own slice); every rank returns it
static float evaluate(GPT2 *m, DataLoader *val, int batches) {
    dataloader_reset(val);
    float sum = 0.0f;
    for (int i = 0; i < batches; i++) {
        Acts *a = &m->acts[i % m->nacts];
        next_batch(val, a->inputs, a->targets);
        forward_in_model_order(m, a, i);
        if (m->shard.last && m->shard.tp_rank == 0) sum += a->mean_loss;
    }
    group_allreduce(m->par, &m->par->world, &sum, 1, "the val loss");
    return sum / ((float)batches * m->shard.dp);
}

// HellaSwag (hellaswag.h): this data-parallel rank's examples, packed into
// micro-batches, forward through the pipeline; the examples the last
// stage's per-token losses get right, summed over the job (every rank
// returns the sum)
static float hellaswag_eval(GPT2 *m, const HsSet *hs) {
    const Shard *s = &m->shard;
    int next, hi, nb = hs_batches(hs, s->dp, m->B);
    hs_rank_range(hs->n, s->dp, s->dp_rank, &next, &hi);
    HsBatch hb;
    if (hs_batch_init(&hb, m->B, m->T) != 0) {
        fprintf(stderr, "out of memory allocating a HellaSwag batch\n");
        exit(1);
    }
    Progress progress;
    progress_start(&progress, m->par->grid.rank == 0, nb);
    float correct = 0.0f;
    for (int i = 0; i < nb; i++) {
        progress_tick(&progress, i);
        Acts *a = &m->acts[i % m->nacts];
        hs_batch_fill(hs, &next, hi, &hb, a->inputs, a->targets);
        forward_in_model_order(m, a, i);
        if (s->last && s->tp_rank == 0) correct += (float)hs_batch_score(hs, &hb, a->t[A_LOSSES], NULL);
    }
    hs_batch_free(&hb);
    progress_end(&progress);
    group_allreduce(m->par, &m->par->world, &correct, 1, "the HellaSwag count");
    return correct;
}

// the evaluations due before step `step` (step == steps: the final model's),
// printed by rank 0, into l: the val loss and HellaSwag
static void run_evaluations(GPT2 *m, const Parallel *par, Job *job, int step, LogLine *l) {
    int rank0 = par->grid.rank == 0;
    if (evaluate_due(job, step)) {
        l->val_loss = evaluate(m, &job->val, job->val_batches);
        if (rank0) printf("val loss %.6f\n", l->val_loss);
    }
    if (hellaswag_due(job, step)) l->hellaswag = report_hellaswag(job, hellaswag_eval(m, &job->hs), rank0);
}

// prints gen_tokens tokens sampled from the model, starting from EOT (one
// rank only), as text safe for a terminal (tokenizer.h's tokenizer_safe_text)
static void sample(GPT2 *m, const Tokenizer *tok, int gen_tokens, uint64_t *rng) {
    int B = m->B, T = m->T, V = m->config.V, Vp = m->config.Vp;
    SafeText text = {{0}, 0};
    char shown[TOKENIZER_SAFE_MAX];
    Acts *a = &m->acts[0];
    head_take(m, 0);  // between steps: every logits block is free
    for (int i = 0; i < B * T; i++) a->inputs[i] = tok->eot_token;
    int n = gen_tokens < T ? gen_tokens : T;
    printf("generating:\n---\n");
    for (int t = 1; t < n; t++) {
        stage_forward(m, a, 0);  // one rank: the whole model
        int next = sample_token(a->t[A_LOGITS] + (size_t)(t - 1) * Vp, V, random_f32(rng));
        a->inputs[t] = next;
        int len;
        const char *s = tokenizer_decode(tok, next, &len);
        if (s != NULL) fwrite(shown, 1, (size_t)tokenizer_safe_text(&text, s, len, shown, sizeof(shown)), stdout);
        fflush(stdout);
    }
    fwrite(shown, 1, (size_t)tokenizer_safe_text(&text, NULL, 0, shown, sizeof(shown)), stdout);  // a character cut short
    head_give_back(m, 0);
    printf("\n---\n");
}

#endif
