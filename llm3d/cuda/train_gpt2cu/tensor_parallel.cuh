/*
 * llm3d/cuda/train_gpt2cu/tensor_parallel.cuh: the GPU trainer's
 * tensor-parallel and sequence-parallel operations, named as train_gpt2.c's
 * (llm3d/cpu/train_gpt2/tensor_parallel.h) and Megatron's: the Linears
 * split by columns and by rows, the vocabulary-parallel embedding and
 * cross-entropy, and their -sp 1 forms, which gather and scatter a tp
 * rank's block of rows.
 *
 * defines:
 *   tp_lead, tp_reduce, tp_copy_backward, tp_share_from_lead
 *                        the g and f of Megatron, and the tp lead's values
 *                        to the others
 *   column_parallel_forward, column_parallel_backward,
 *   row_parallel_forward, row_parallel_backward,
 *   vocab_parallel_embedding_forward, vocab_parallel_embedding_backward,
 *   vocab_parallel_cross_entropy
 *   sp_gather, sp_reduce_scatter, sp_column_parallel_forward,
 *   sp_column_parallel_backward, sp_row_parallel_forward,
 *   sp_row_parallel_backward, sp_vocab_parallel_embedding_forward,
 *   sp_vocab_parallel_embedding_backward
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after the model's collectives, and it uses that file's GPT2, Staging,
 * the kernels' launchers (matmul, encoder, classifier) and nccl_comm.h's
 * calls on the model's communicators.
 */
#ifndef LLM3D_GPU_TENSOR_PARALLEL_CUH
#define LLM3D_GPU_TENSOR_PARALLEL_CUH

// ----------------------------------------------------------------------------
// tensor parallel: the tp ranks of a stage split every layer Megatron-style,
// as train_gpt2.c does (doc/parallel.md). A column-parallel Linear holds some
// rows of its weight, that is some output channels: it takes the whole input,
// the same on every tp rank, and gives this rank's slice of the output. A
// row-parallel Linear holds the matching columns, input channels: it takes
// that slice and gives a partial sum of the whole output. qkv and fc are
// column-parallel, attproj and fcproj row-parallel, so attention over this
// rank's heads and GELU over its hidden units need no communication.
//
// Megatron calls the two places where the tp ranks talk f and g:
//   f, before a column-parallel Linear: the identity in the forward (the input
//      is already whole everywhere); in the backward each rank holds a partial
//      sum of the input's gradient, so an all-reduce (tp_copy_backward).
//   g, after a row-parallel Linear: an all-reduce of the partial sums in the
//      forward (tp_reduce); the identity in the backward (the output's
//      gradient is whole on every rank).
// So each pair of Linears costs one all-reduce each way.
//
// wte is split by rows, vocabulary entries, in both of its uses. The
// embedding: each rank looks up the tokens it holds, zeros for the others,
// and a sum over the ranks completes every row. The lm_head: a
// column-parallel Linear whose slice of the output is this rank's logits;
// the cross-entropy then merges every slice's row max and sum of exp, so no
// rank ever holds all the logits.
//
// Unlike train_gpt2.c, the replicated terms of a sum (the row-parallel
// biases, wpe) are added by tp rank 0 alone, before the sum, where the
// kernels fuse them; the sum then holds them once. Every collective is queued
// on the model's stream, in the order of the calls, and each is skipped in a
// group of one (a model outside a job has no communicators).

// tp rank 0: the one that adds the replicated terms to its partial sums
static int tp_lead(const GPT2 *m) { return m->shard.tp_rank == 0; }

// the sum of the tp ranks' parts, in place on every rank: g's forward
static void tp_reduce(GPT2 *m, floatX *buf, size_t n) {
    if (m->shard.tp == 1) return;
    nccl_set_label(m->nccl, "tensor-parallel partial sums");
    nccl_allreduce(m->nccl, &m->nccl->tp, buf, n, NCCL_FLOATX, OP_SUM);
}

// f's backward: every tp rank used the whole input, so its gradient is the
// sum of the ranks' parts
static void tp_copy_backward(GPT2 *m, floatX *grad, size_t n) {
    if (m->shard.tp == 1) return;
    nccl_set_label(m->nccl, "tensor-parallel input gradients");
    nccl_allreduce(m->nccl, &m->nccl->tp, grad, n, NCCL_FLOATX, OP_SUM);
}

// tp > 1: a replicated tensor's gradient (LayerNorms, projection biases,
// wpe, lnf) from tp rank 0 to the others, at the step's end. They agree in
// exact arithmetic, but each tp rank's dp reduction ran in its own
// communicator, and NCCL does not promise the same order of summation in two
// of them (dp >= 3); tp rank 0's copy (the one the norm counts and the
// checkpoint keeps) makes them bit-identical again, so the replicas never
// drift apart. (An average would not do: NCCL's bf16 average multiplies by a
// rounded 1/tp.)
static void tp_share_from_lead(GPT2 *m, floatX *grad, size_t n) {
    if (m->shard.tp == 1) return;
    nccl_set_label(m->nccl, "the replicated gradients, tp rank 0's");
    nccl_broadcast(m->nccl, &m->nccl->tp, grad, n, NCCL_FLOATX, 0);
}

// out[N,OCl] = inp[N,IC] @ weight^T + bias for this rank's OCl output
// channels (weight and bias are its rows); f's forward is the identity. With
// pre_gelu: pre_gelu = that, out = gelu(pre_gelu).
static void column_parallel_forward(GPT2 *m, floatX *out, floatX *pre_gelu, const floatX *inp, const floatX *weight,
                                    const floatX *bias, int N, int IC, int OCl) {
    matmul_forward(&m->blas, out, pre_gelu, inp, weight, bias, N, IC, OCl);
}

// dweight, dbias += this rank's slice (dbias NULL: no bias); dinp = the
// whole input's gradient, summed over the tp ranks. A backward split in B
// and W runs one half: dweight NULL, the input's gradient alone (B); dinp
// NULL, the weights' alone (W); so for the tp helpers below
static void column_parallel_backward(GPT2 *m, floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout,
                                     const floatX *inp, const floatX *weight, int N, int IC, int OCl) {
    if (dweight) matmul_backward_dweight(&m->blas, dweight, dout, inp, N, IC, OCl);
    if (dweight && dbias) bias_backward(dbias, dout, m->sc.colsum_partial, N, OCl, m->stream);
    if (dinp == NULL) return;
    matmul_backward_dinp(&m->blas, dinp, dout, weight, NULL, N, IC, OCl);
    tp_copy_backward(m, dinp, (size_t)N * IC);
}

// out[N,OC] = inp[N,ICl] @ weight^T over this rank's ICl input channels
// (weight: its columns), summed over the tp ranks, + bias: tp rank 0 adds
// the bias to its partial sum, in the matmul's epilogue
static void row_parallel_forward(GPT2 *m, floatX *out, const floatX *inp, const floatX *weight, const floatX *bias,
                                 int N, int ICl, int OC) {
    matmul_forward(&m->blas, out, NULL, inp, weight, tp_lead(m) ? bias : NULL, N, ICl, OC);
    tp_reduce(m, out, (size_t)N * OC);
}

// dweight, dbias += ...; dinp = the gradient of this rank's input slice,
// times gelu'(pre_gelu) when pre_gelu is given (the fused GELU backward).
// No communication: dout is whole on every rank (g's backward is the identity).
static void row_parallel_backward(GPT2 *m, floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout,
                                  const floatX *inp, const floatX *weight, const floatX *pre_gelu, int N, int ICl,
                                  int OC) {
    if (dweight) {
        matmul_backward_dweight(&m->blas, dweight, dout, inp, N, ICl, OC);
        bias_backward(dbias, dout, m->sc.colsum_partial, N, OC, m->stream);
    }
    if (dinp) matmul_backward_dinp(&m->blas, dinp, dout, weight, pre_gelu, N, ICl, OC);
}

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] from this rank's rows [v0, v0 + Vl)
// of wte: the tokens it holds, zeros for the others, summed over the tp
// ranks; wpe is replicated, so tp rank 0 adds it before the sum
static void vocab_parallel_embedding_forward(GPT2 *m, floatX *out, const int *inp, const floatX *wte, const floatX *wpe,
                                             int B, int T, int C) {
    const Shard *s = &m->shard;
    encoder_forward(out, inp, wte, tp_lead(m) ? wpe : NULL, s->v0, s->Vl, B, T, C, m->stream);
    tp_reduce(m, out, (size_t)B * T * C);
}

// no communication: a position's gradient goes to its token's row of wte
// when this rank holds it (the staged token buckets list only those), and
// to wpe
static void vocab_parallel_embedding_backward(GPT2 *m, floatX *dwte, floatX *dwpe, const floatX *dout,
                                              const Staging *staged, int B, int T, int C) {
    encoder_backward(dwte, dwpe, dout, staged->bucket_start, staged->bucket_token, staged->bucket_pos,
                     staged->nbuckets, B, T, C, m->stream);
}

// the cross-entropy over this rank's Vl columns of the logits, forward and
// backward in one kernel: losses[row] += the row's loss, on the one rank
// whose slice holds the target; with write_dlogits, dloss * d(loss)/d(logits)
// is written over the logits. With tp > 1 every slice's row max and sum of
// exp go to every rank (one all-gather), and each rank merges them in slice
// order, so all get the same normalizer.
static void vocab_parallel_cross_entropy(GPT2 *m, floatX *logits, float *losses, const int *targets, float dloss,
                                         int BT, int write_dlogits) {
    const Shard *s = &m->shard;
    cudaStream_t st = m->stream;
    if (s->tp == 1) {
        classifier(logits, losses, targets, dloss, BT, s->nreal, s->Vl, write_dlogits, st);
        return;
    }
    float2 *all = m->sc.cls_stats, *mine = all + (size_t)s->tp_rank * BT;
    classifier_stats_kernel<<<BT, CLASSIFIER_THREADS, 0, st>>>(mine, logits, s->Vl, s->nreal);
    CUDA_CHECK(cudaGetLastError());
    nccl_allgather(m->nccl, &m->nccl->tp, mine, all, 2 * (size_t)BT, ncclFloat32);
    classifier_tp_kernel<<<BT, CLASSIFIER_THREADS, 0, st>>>(logits, losses, targets, all, s->tp, BT, dloss, s->v0,
                                                            s->Vl, s->nreal, write_dlogits);
    CUDA_CHECK(cudaGetLastError());
}

// ----------------------------------------------------------------------------
// sequence parallel (-sp 1, Megatron's), as train_gpt2.c's: between a
// row-parallel Linear and the next column-parallel one every tp rank used to
// hold the same (B,T,C) tensors: the residual stream, the LayerNorms' inputs
// and outputs, the row-parallel outputs, the embeddings' output. There every
// op is per position, so the tp ranks split the positions instead: tp rank r
// holds rows [r R, (r+1) R) of the B*T rows, R = B*T/tp (m->row0, m->rows),
// one contiguous block, so NCCL's reduce-scatter and all-gather on the tp
// communicator move whole blocks without packing (and host mode's the same
// through the host backend).
//
// f and g change into their sequence-parallel forms:
//   before a column-parallel Linear, an all-gather along the rows (sp_gather)
//      in the forward; in the backward a reduce-scatter of the input's
//      gradient (sp_reduce_scatter): each rank keeps the sum over its rows;
//   after a row-parallel Linear, a reduce-scatter of the partial sums in the
//      forward (tp rank 0's partial holds the bias, as without -sp); in the
//      backward an all-gather of the output's gradient.
// A ring all-reduce is a reduce-scatter then an all-gather, so each pair of
// Linears moves what it moved before, each way. The gathered input of a
// column-parallel Linear is not kept: its weights' gradient gathers it again
// in the backward (one all-gather more per column-parallel Linear, as in
// Megatron), so no whole (B,T,C) tensor of the region stays per activation
// set; the gathers and the partial sums use two (B,T,C) scratch buffers,
// sc.sp_whole and sc.sp_partial, one for the job.
//
// The embedding sums the ranks' lookups (with wpe on tp rank 0) by a
// reduce-scatter, so each rank gets its own rows; its backward gathers the
// gradient, so wte's and wpe's gradients come out as without -sp. The head
// takes the gathered layout: the final LayerNorm runs on this rank's rows,
// whose output is all-gathered in place into lnf and kept whole for the
// lm_head and its backward; the vocab-parallel cross-entropy is unchanged.
// The LayerNorms' weight and bias gradients come from this rank's rows only:
// the step sums them over the tp group (sp_sum_layernorm_grads, optimizer.cuh).
// Pipeline messages carry this rank's rows only, to the same tp rank of the
// next stage.

// every tp rank's rows of a (B*T, C) tensor: whole[B*T*C] from mine[R*C]
// (mine may be whole + row0 * C: in place)
static void sp_gather(GPT2 *m, floatX *whole, const floatX *mine) {
    nccl_allgather(m->nccl, &m->nccl->tp, mine, whole, (size_t)m->rows * m->config.C, NCCL_FLOATX);
}

// the sum over the tp ranks of partial[B*T*C], this rank's rows of it: mine[R*C]
static void sp_reduce_scatter(GPT2 *m, floatX *mine, const floatX *partial) {
    nccl_reduce_scatter(m->nccl, &m->nccl->tp, partial, mine, (size_t)m->rows * m->config.C, NCCL_FLOATX, OP_SUM);
}

// out[B*T,OCl] (and pre_gelu, as column_parallel_forward) from this rank's
// rows of the input, inp[R,IC], gathered first into sc.sp_whole
static void sp_column_parallel_forward(GPT2 *m, floatX *out, floatX *pre_gelu, const floatX *inp, const floatX *weight,
                                       const floatX *bias, int IC, int OCl) {
    sp_gather(m, m->sc.sp_whole, inp);
    matmul_forward(&m->blas, out, pre_gelu, m->sc.sp_whole, weight, bias, m->B * m->T, IC, OCl);
}

// dweight, dbias += this rank's slice, from the input inp[R,IC] gathered
// again; dinp[R,IC]: the input's gradient on this rank's rows, the ranks'
// parts summed by a reduce-scatter
static void sp_column_parallel_backward(GPT2 *m, floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout,
                                        const floatX *inp, const floatX *weight, int IC, int OCl) {
    int BT = m->B * m->T;
    if (dweight) {  // (B alone needs no gather)
        sp_gather(m, m->sc.sp_whole, inp);
        matmul_backward_dweight(&m->blas, dweight, dout, m->sc.sp_whole, BT, IC, OCl);
        if (dbias) bias_backward(dbias, dout, m->sc.colsum_partial, BT, OCl, m->stream);
    }
    if (dinp == NULL) return;
    matmul_backward_dinp(&m->blas, m->sc.sp_partial, dout, weight, NULL, BT, IC, OCl);
    sp_reduce_scatter(m, dinp, m->sc.sp_partial);
}

// out[R,OC]: this rank's rows of inp[B*T,ICl] @ weight^T summed over the tp
// ranks (a reduce-scatter), + bias, which tp rank 0 adds to its partial sum
static void sp_row_parallel_forward(GPT2 *m, floatX *out, const floatX *inp, const floatX *weight, const floatX *bias,
                                    int ICl, int OC) {
    matmul_forward(&m->blas, m->sc.sp_partial, NULL, inp, weight, tp_lead(m) ? bias : NULL, m->B * m->T, ICl, OC);
    sp_reduce_scatter(m, out, m->sc.sp_partial);
}

// dout[R,OC], this rank's rows of the output's gradient, gathered whole;
// then as row_parallel_backward (dbias from every row, as without -sp);
// B and W each gather it
static void sp_row_parallel_backward(GPT2 *m, floatX *dinp, floatX *dweight, floatX *dbias, const floatX *dout,
                                     const floatX *inp, const floatX *weight, const floatX *pre_gelu, int ICl, int OC) {
    sp_gather(m, m->sc.sp_whole, dout);
    row_parallel_backward(m, dinp, dweight, dbias, m->sc.sp_whole, inp, weight, pre_gelu, m->B * m->T, ICl, OC);
}

// out[R,C]: this rank's rows of the embeddings: the tp ranks' lookups (wpe
// added by tp rank 0) summed by a reduce-scatter
static void sp_vocab_parallel_embedding_forward(GPT2 *m, floatX *out, const int *inp, const floatX *wte,
                                                const floatX *wpe) {
    const Shard *s = &m->shard;
    encoder_forward(m->sc.sp_partial, inp, wte, tp_lead(m) ? wpe : NULL, s->v0, s->Vl, m->B, m->T, m->config.C,
                    m->stream);
    sp_reduce_scatter(m, out, m->sc.sp_partial);
}

// dout[R,C], this rank's rows of the embeddings' gradient, gathered whole;
// then as vocab_parallel_embedding_backward
static void sp_vocab_parallel_embedding_backward(GPT2 *m, floatX *dwte, floatX *dwpe, const floatX *dout,
                                                 const Staging *staged) {
    sp_gather(m, m->sc.sp_whole, dout);
    vocab_parallel_embedding_backward(m, dwte, dwpe, m->sc.sp_whole, staged, m->B, m->T, m->config.C);
}

#endif  // LLM3D_GPU_TENSOR_PARALLEL_CUH
