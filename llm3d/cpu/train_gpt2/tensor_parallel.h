/*
 * llm3d/cpu/train_gpt2/tensor_parallel.h: the CPU trainer's tensor-parallel
 * and sequence-parallel operations, each named as Megatron names them: the
 * Linears split by columns and by rows, the vocabulary-parallel embedding and
 * cross-entropy, and their -sp 1 forms, which gather and scatter a tp rank's
 * block of rows.
 *
 * defines:
 *   tp_reduce, tp_copy_backward        the g and f of Megatron
 *   column_parallel_forward, column_parallel_backward,
 *   row_parallel_forward, row_parallel_backward, add_bias,
 *   vocab_parallel_embedding_forward, vocab_parallel_embedding_backward,
 *   vocab_parallel_cross_entropy_forward, vocab_parallel_cross_entropy_backward
 *   sp_gather, sp_reduce_scatter, sp_column_parallel_forward,
 *   sp_column_parallel_backward, sp_row_parallel_forward,
 *   sp_row_parallel_backward, sp_vocab_parallel_embedding_forward,
 *   sp_vocab_parallel_embedding_backward
 *
 * A part of train_gpt2.c, not a header of its own (as train_gpt2.cu's
 * llm3d/cuda/train_gpt2cu/ files are of it): train_gpt2.c includes it after
 * the ZeRO section, and it uses that file's GPT2, Parallel and
 * group_allreduce.
 */
#ifndef LLM3D_CPU_TENSOR_PARALLEL_H
#define LLM3D_CPU_TENSOR_PARALLEL_H

// ----------------------------------------------------------------------------
// tensor parallel: the tp ranks of a stage split every layer Megatron-style
// (doc/parallel.md). A column-parallel Linear holds some rows of its weight,
// that is some output channels: it takes the whole input, the same on every
// tp rank, and gives this rank's slice of the output. A row-parallel Linear
// holds the matching columns, input channels: it takes that slice and gives a
// partial sum of the whole output. qkv and fc are column-parallel, attproj
// and fcproj row-parallel, so attention over this rank's heads and GELU over
// its hidden units need no communication.
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
// the cross-entropy then combines row maxima and row sums across the ranks,
// so no rank ever holds all the logits.

// the sum of the tp ranks' parts, in place on every rank: g's forward
static void tp_reduce(const Parallel *par, float *buf, size_t n, const char *what) {
    group_allreduce(par, &par->tp, buf, n, what);
}

// f's backward: every tp rank used the whole input, so its gradient is the
// sum of the ranks' parts
static void tp_copy_backward(const Parallel *par, float *grad, size_t n, const char *what) {
    group_allreduce(par, &par->tp, grad, n, what);
}

// out[N,OCl] = inp[N,IC] @ weight^T + bias for this rank's OCl output
// channels (weight and bias are its rows); f's forward is the identity
static void column_parallel_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                                    int OCl) {
    matmul_forward(out, inp, weight, bias, N, IC, OCl);
}

// dweight, dbias += this rank's slice; dinp (zero on entry) ends as the whole
// input's gradient, summed over the tp ranks
static void column_parallel_backward(const Parallel *par, float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int N, int IC, int OCl, int fresh,
                                     const char *what) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OCl, fresh);
    if (dinp != NULL) tp_copy_backward(par, dinp, (size_t)N * IC, what);  // NULL: the weights' part alone
}

static void add_bias(float *out, const float *bias, int N, int OC) {
    #pragma omp parallel for schedule(dynamic, 16)
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
}

// out[N,OC] = inp[N,ICl] @ weight^T over this rank's ICl input channels
// (weight: its columns), summed over the tp ranks, then + bias: the bias is
// replicated, so it is added once, after the sum
static void row_parallel_forward(const Parallel *par, float *out, const float *inp, const float *weight,
                                 const float *bias, int N, int ICl, int OC, const char *what) {
    matmul_forward(out, inp, weight, NULL, N, ICl, OC);
    tp_reduce(par, out, (size_t)N * OC, what);
    add_bias(out, bias, N, OC);
}

// no communication: dout is whole on every rank (g's backward is the
// identity), and dinp is the gradient of this rank's slice only
static void row_parallel_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                  const float *weight, int N, int ICl, int OC, int fresh) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, ICl, OC, fresh);
}

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] from this rank's rows [v0, v0 + Vl)
// of wte: the tokens it holds, zeros for the others, summed over the tp
// ranks; wpe is replicated, so it is added after the sum
static void vocab_parallel_embedding_forward(const Parallel *par, float *out, const int *inp, const float *wte,
                                             const float *wpe, int v0, int Vl, int B, int T, int C) {
    encoder_forward(out, inp, wte, v0, Vl, B, T, C);
    tp_reduce(par, out, (size_t)B * T * C, "tensor-parallel embeddings");
    encoder_add_positions(out, wpe, 0, B * T, T, C);
}

// no communication: a position's gradient goes to its token's row of wte
// when this rank holds it, and to wpe
static void vocab_parallel_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int v0,
                                              int Vl, int B, int T, int C) {
    encoder_backward(dwte, dwpe, dout, inp, v0, Vl, B, T, C);
}

// losses[N]: every position's loss, on every tp rank, from this rank's Vl
// columns of the logits (nreal of them real, from global column v0), which
// become this rank's columns of the softmax in place, kept for the backward:
// rewriting the lines just read costs no read for ownership, and no second
// buffer (51 MB at d12). maxes and sums (N each) end as the rows' global
// maximum and sum of exponentials.
static void vocab_parallel_cross_entropy_forward(const Parallel *par, float *losses, float *maxes, float *sums,
                                                 float *logits, const int *targets, int v0, int N, int Vl, int nreal) {
    float *probs = logits;
    if (par->tp.size == 1) {
        crossentropy_softmax(maxes, probs, sums, logits, N, Vl, nreal);
    } else {
        crossentropy_rowmax(maxes, logits, N, Vl, nreal);
        // every slice's row maxima, to every rank (the communicator only sums)
        float *all = (float *)xcalloc((size_t)N * par->tp.size, sizeof(float), "row maxima");
        comm_set_label(par->comm, "tensor-parallel row maxima of the logits");
        comm_allgather(par->comm, &par->tp, maxes, all, N);
        for (int n = 0; n < N; n++) {
            maxes[n] = -INFINITY;
            for (int r = 0; r < par->tp.size; r++) maxes[n] = fmaxf(maxes[n], all[(size_t)r * N + n]);
        }
        free(all);
        crossentropy_exp(probs, sums, logits, maxes, N, Vl, nreal);
        tp_reduce(par, sums, N, "tensor-parallel softmax sums");
    }
    crossentropy_finish(losses, probs, sums, targets, v0, N, Vl, nreal);
    tp_reduce(par, losses, N, "tensor-parallel losses");  // each loss came from the one rank holding its target
}

// dlogits = (probs / sums - onehot(target)) * dloss over this rank's
// columns, sums the whole rows' (all-reduced in the forward): no
// communication (the lm_head's column_parallel_backward sums what follows)
static void vocab_parallel_cross_entropy_backward(float *dlogits, const float *probs, const float *sums,
                                                  const int *targets, float dloss, int v0, int N, int Vl, int nreal) {
    crossentropy_backward(dlogits, probs, sums, targets, dloss, v0, N, Vl, nreal);
}

// ----------------------------------------------------------------------------
// sequence parallel (-sp 1, Megatron's): between a row-parallel Linear and
// the next column-parallel one every tp rank used to hold the same (B,T,C)
// tensors: the residual stream, the LayerNorms' inputs and outputs, the
// row-parallel outputs, the embeddings' output. There every op is per
// position, so the tp ranks split the positions instead: rank r of the
// group holds rows [r R, (r+1) R) of the B*T rows, R = B*T/tp (m->row0,
// m->rows). The activations are (B,T,C) row-major, so a rank's rows are one
// contiguous block, and the collectives move whole blocks without packing.
//
// f and g change into their sequence-parallel forms:
//   before a column-parallel Linear, an all-gather along the positions
//      (sp_gather) in the forward, whose backward is a reduce-scatter of
//      the input's gradient (sp_reduce_scatter): the ranks' partial sums,
//      each rank keeping the sum over its own rows;
//   after a row-parallel Linear, a reduce-scatter of the partial sums in
//      the forward, whose backward is an all-gather of the output's
//      gradient.
// A ring all-reduce is a reduce-scatter then an all-gather, so each pair of
// Linears moves what it moved before, each way. The gathered input of a
// column-parallel Linear is not kept: its weights' gradient gathers it again
// in the backward (one all-gather more per column-parallel Linear, as in
// Megatron), so that no whole (B,T,C) tensor stays on a rank between its
// forward and its backward.
//
// The embedding sums the ranks' lookups with a reduce-scatter, so each rank
// gets its own rows, to which it adds wpe; its backward gathers the
// gradient, so that each rank adds the whole micro-batch into its rows of
// wte and into wpe (wpe's gradient comes out whole, as without -sp). The
// head takes the gathered layout: the final LayerNorm runs on this rank's
// rows, whose output is all-gathered and kept whole (A_LNF) for the
// lm_head and its backward; the vocab-parallel cross-entropy is unchanged,
// every position's loss on every tp rank. A LayerNorm's weight and bias
// gradients come from this rank's rows only: the step sums them over the tp
// group (sp_sum_layernorm_grads).

// every tp rank's rows of a (B*T, C) tensor, whole: whole[B*T*C] from
// mine[R*C] (mine may be whole + row0 * C, in place)
static void sp_gather(const GPT2 *m, float *whole, const float *mine) {
    size_t rc = (size_t)m->rows * m->config.C;
    comm_set_label(m->par->comm, "sequence-parallel rows gathered");
    comm_allgather(m->par->comm, &m->par->tp, mine, whole, rc);
}

// the sum over the tp ranks of partial[B*T*C], this rank's rows of it:
// mine[R*C] (mine may be partial + row0 * C, in place)
static void sp_reduce_scatter(const GPT2 *m, float *mine, const float *partial) {
    size_t rc = (size_t)m->rows * m->config.C;
    comm_set_label(m->par->comm, "sequence-parallel rows summed");
    comm_reduce_scatter(m->par->comm, &m->par->tp, partial, mine, rc, OP_SUM);
}

// out[B*T,OCl] from this rank's rows of the input, inp[R,IC], gathered first
static void sp_column_parallel_forward(GPT2 *m, float *out, const float *inp, const float *weight, const float *bias,
                                       int IC, int OCl) {
    sp_gather(m, m->sp_whole, inp);
    matmul_forward(out, m->sp_whole, weight, bias, m->B * m->T, IC, OCl);
}

// dweight, dbias += this rank's slice, from the input gathered again; dinp
// [R,IC]: the input's gradient on this rank's rows, summed over the tp ranks
// (a reduce-scatter of each rank's part). NULL dinp: the weights' part alone;
// NULL dweight: dinp alone, and no gather
static void sp_column_parallel_backward(GPT2 *m, float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, int IC, int OCl, int fresh) {
    if (dweight != NULL) sp_gather(m, m->sp_whole, inp);
    matmul_backward(dinp != NULL ? m->sp_partial : NULL, dweight, dbias, dout, m->sp_whole, weight, m->B * m->T, IC,
                    OCl, fresh);
    if (dinp != NULL) sp_reduce_scatter(m, dinp, m->sp_partial);
}

// out[R,OC]: this rank's rows of inp[B*T,ICl] @ weight^T summed over the tp
// ranks (a reduce-scatter), then + bias
static void sp_row_parallel_forward(GPT2 *m, float *out, const float *inp, const float *weight, const float *bias,
                                    int ICl, int OC) {
    matmul_forward(m->sp_partial, inp, weight, NULL, m->B * m->T, ICl, OC);
    sp_reduce_scatter(m, out, m->sp_partial);
    add_bias(out, bias, m->rows, OC);
}

// dout[R,OC], this rank's rows of the output's gradient, gathered whole; then
// as row_parallel_backward (dbias whole, as without -sp: every rank sums all
// the rows)
static void sp_row_parallel_backward(GPT2 *m, float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int ICl, int OC, int fresh) {
    sp_gather(m, m->sp_whole, dout);
    matmul_backward(dinp, dweight, dbias, m->sp_whole, inp, weight, m->B * m->T, ICl, OC, fresh);
}

// out[R,C]: this rank's rows of the embeddings, the lookups of the tp ranks
// summed by a reduce-scatter, then + wpe at each row's position
static void sp_vocab_parallel_embedding_forward(GPT2 *m, float *out, const int *inp, const float *wte, const float *wpe,
                                                int v0, int Vl) {
    int B = m->B, T = m->T, C = m->config.C;
    encoder_forward(m->sp_partial, inp, wte, v0, Vl, B, T, C);
    sp_reduce_scatter(m, out, m->sp_partial);
    encoder_add_positions(out, wpe, m->row0, m->rows, T, C);
}

// dout[R,C], this rank's rows of the embeddings' gradient, gathered whole:
// then as vocab_parallel_embedding_backward (wpe's gradient whole)
static void sp_vocab_parallel_embedding_backward(GPT2 *m, float *dwte, float *dwpe, const float *dout, const int *inp,
                                                 int v0, int Vl) {
    sp_gather(m, m->sp_whole, dout);
    encoder_backward(dwte, dwpe, m->sp_whole, inp, v0, Vl, m->B, m->T, m->config.C);
}

#endif
