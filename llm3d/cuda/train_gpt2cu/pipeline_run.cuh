/*
 * llm3d/cuda/train_gpt2cu/pipeline_run.cuh: the GPU trainer's pipeline step:
 * the activation sets micro-batches take and give back, the messages
 * between stages (and the hand-offs within one), and the step's ops in the
 * order of the schedule; and the forward in model order that the
 * evaluations use. As train_gpt2.c's llm3d/cpu/train_gpt2/pipeline_run.h,
 * on the device: the messages go over NCCL (MAC'd, nccl_sendrecv_mac) or
 * host mode's backend, a hand-off is a copy on the model's stream.
 *
 * defines:
 *   set_take, set_index, set_give_back, grads_of
 *                        activation sets per (micro-batch, chunk)
 *   stage_rank, sender_chunk, pipe_buffer, pipe_tag, pipe_hand_off,
 *   pipe_recv, pipe_send the pipeline's messages
 *   copy_batch           a micro-batch's staged tokens, from its chunk-0 set
 *   pipe_clock_init, pipe_clock_mark, pipe_clock_start, pipe_clock_read
 *                        the bubble's clock: the step's ops and messages
 *                        timed on the GPU
 *   pipeline_run         one step's ops and messages, by the plan
 *   forward_in_model_order
 *                        one micro-batch through the model's parts in order
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it after watch.h, and it uses that file's GPT2, chunk_forward,
 * chunk_backward, gpt2_stage_batch, head_take and watch.h's PipeTimes.
 * Outside TESTING's cut, so test_gpt2.cu walks the plans through the same
 * set bookkeeping.
 */
#ifndef LLM3D_GPU_PIPELINE_RUN_CUH
#define LLM3D_GPU_PIPELINE_RUN_CUH

#include <stdio.h>
#include <stdlib.h>

#include "dataloader.h"               // DataLoader, next_batch
#include "llm3d/parallel/pipeline.h"  // PipeStep, PipeMsg, pipeline_part, pipeline_place
#include "llm3d/watch.h"              // PipeTimes, pipe_times_add, PIPE_METER_FLOATS

// one step's forwards and backwards in the order of the pipeline schedule,
// and the messages between neighbouring stages in the order of its plan
// (pipeline.h's pipeline_plan, the same plan train_gpt2.c's pipeline_run
// posts and test_parallel checks): an op's input received alone before it,
// or with the previous op's send as one exchange. With chunks (-ps
// interleaved, zbv) the plan follows one order of all the step's messages,
// so an input may come an op or more before its op; zbv's turn within the
// last stage is a hand-off, a copy (pipe_hand_off).
//
// Activation sets: micro-batch mb on chunk k takes a free set at its first
// receive or op and gives it back after its last op (its B; its W where
// the backward is split), so that an early input has somewhere to land;
// pipeline_plan_sets counts the sets a plan needs that way (trainer.h's
// activation_sets). A set holds its incoming gradient too (grad_in), as
// that may come before the B. A set given back is free on the host at
// once: the kernels that next write it queue behind those that read it.
// One reader is on another stream: over NCCL a receive's MAC check reads
// its buffer later, and only the next receive waits for it; a set's
// writes other than receives (the embedding into a retaken set, a
// hand-off's copy) wait for it where they land on that buffer
// (nccl_mac_before_write).

// the set of mb on chunk k, taken from the free ones when it has none yet
static Acts *set_take(GPT2 *m, int mb, int k) {
    int i = pipe_sets_take(&m->sets, mb, k);
    if (i < 0) {  // pipeline_plan_sets sized them: a plan the count does not know
        fprintf(stderr, "rank %d: micro-batch %d on chunk %d finds none of the %d activation sets free\n",
                m->grid.rank, mb, k, m->nacts);
        exit(1);
    }
    return &m->acts[i];
}

// the set index of mb on chunk k, which it must hold
static int set_index(const GPT2 *m, int mb, int k) {
    int i = pipe_sets_index(&m->sets, mb, k);
    if (i < 0) {
        fprintf(stderr, "rank %d: micro-batch %d on chunk %d holds no activation set\n", m->grid.rank, mb, k);
        exit(1);
    }
    return i;
}

static void set_give_back(GPT2 *m, int mb, int k) {
    head_give_back(m, set_index(m, mb, k));
    pipe_sets_give_back(&m->sets, mb, k);
}

// the activation gradients of mb's backward on chunk k: its own set where
// the backward is split (its W reads them later), else NULL, the scratch
// (chunk_backward)
static Acts *grads_of(GPT2 *m, int mb, int k) { return m->dsets != NULL ? &m->dsets[set_index(m, mb, k)] : NULL; }

// the world rank of stage pp_rank in my data-parallel replica and tp slot
static int stage_rank(const GPT2 *m, int pp_rank) {
    return grid_rank(&m->grid, m->shard.dp_rank, pp_rank, m->shard.tp_rank);
}

// my chunk that sends msg: the part before (an activation) or after (a
// gradient) the receiver's part
static int sender_chunk(const GPT2 *m, PipeMsg msg) {
    const PipeLayout *pl = &m->pipe;
    int part = pipeline_part(pl, msg.peer, msg.chunk) + (msg.channel == CH_ACTIVATION ? -1 : 1), stage, k;
    pipeline_place(pl, part, &stage, &k);
    return k;
}

// where a message's rows*C floatX live (B*T*C, or under -sp this rank's
// rows, which go to the same tp rank of the next stage): an activation
// arrives as the set's chunk input and leaves as the chunk's output; a
// gradient arrives in the set's grad_in and leaves from the gradient of the
// chunk's input (the scratch's dresidual, or the split B's set)
static floatX *pipe_buffer(GPT2 *m, PipeMsg msg, int incoming) {
    if (incoming) {
        Acts *a = msg.channel == CH_ACTIVATION ? set_take(m, msg.mb, msg.chunk) : &m->acts[set_index(m, msg.mb, msg.chunk)];
        return msg.channel == CH_ACTIVATION ? a->encoded : a->grad_in;
    }
    int k = sender_chunk(m, msg);
    if (msg.channel == CH_ACTIVATION) return block_input(m, &m->acts[set_index(m, msg.mb, k)], m->shard.chunk[k].nl);
    Acts *d = grads_of(m, msg.mb, k);
    return d != NULL ? d->encoded : m->sc.dresidual;
}

// the frame's micro-batch field: the micro-batch and the receiver's chunk
// (the micro-batch itself with one chunk)
static int pipe_tag(const GPT2 *m, PipeMsg msg) { return msg.mb * m->shard.nchunks + msg.chunk; }

// a hand-off between two of my chunks (zbv's turn, part pp-1 to part pp
// and back, within the last stage; every message on one stage), which
// the transport never sees: the message's floatX copied on the stream
// from where the sending chunk leaves them to where the receiving chunk
// reads them, at the end where the sender's are sure to be there. An
// activation at the receive: the sending chunk's set is held until that
// micro-batch's backward there, which comes after the receiving chunk's
// forward. A gradient at the send: the sending chunk may give its set back
// (its W) before the receiving chunk's B, whose set has been held since its F.
static void pipe_hand_off(GPT2 *m, PipeMsg msg, int at_send) {
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(floatX);  // -sp: my rows
    if ((msg.channel == CH_ACTIVATION) == at_send) return;  // done at the other end
    // where a receive over NCCL may have just landed (the sets are pooled)
    floatX *to = pipe_buffer(m, msg, 1);
    nccl_mac_before_write(m->nccl, m->stream, to, bytes);
    CUDA_CHECK(cudaMemcpyAsync(to, pipe_buffer(m, msg, 0), bytes, cudaMemcpyDeviceToDevice, m->stream));
}

static void pipe_recv(GPT2 *m, PipeMsg in) {
    if (in.peer < 0) return;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(floatX);  // -sp: my rows, to and from my tp rank's peer
    if (in.peer == m->shard.pp_rank) {
        pipe_hand_off(m, in, 0);
        return;
    }
    nccl_sendrecv_mac(m->nccl, -1, in.channel, 0, NULL, 0, stage_rank(m, in.peer), in.channel, pipe_tag(m, in),
                      pipe_buffer(m, in, 1), bytes);
}

// sends out; with a message in (an exchange), receives it at the same time
static void pipe_send(GPT2 *m, PipeMsg out, PipeMsg in) {
    if (out.peer < 0) return;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(floatX);
    if (out.peer == m->shard.pp_rank) {  // never in an exchange (pipeline_check)
        pipe_hand_off(m, out, 1);
        return;
    }
    int from = in.peer < 0 ? -1 : stage_rank(m, in.peer);
    nccl_sendrecv_mac(m->nccl, stage_rank(m, out.peer), out.channel, pipe_tag(m, out), pipe_buffer(m, out, 0), bytes,
                      from, in.channel, pipe_tag(m, in), in.peer < 0 ? NULL : pipe_buffer(m, in, 1),
                      in.peer < 0 ? 0 : bytes);
}

// set a's staged micro-batch (tokens, targets, token buckets) from set a0,
// the same micro-batch's on chunk 0: a stage reads each micro-batch from
// the stream once, at its F there, and holds that set until its last B
static void copy_batch(GPT2 *m, Acts *a, const Acts *a0) {
    int BT = m->B * m->T;
    CUDA_CHECK(cudaMemcpyAsync(a->batch, a0->batch, staging_ints(BT) * sizeof(int), cudaMemcpyDeviceToDevice,
                               m->stream));
    a->staged = staging_view(a->batch, BT);
    a->staged.nbuckets = a0->staged.nbuckets;
}

// The bubble's clock (GPT2's PipeClock). The kernels run ahead of the
// host, so host clocks around an op would time its queueing; the GPU times
// its work: an event on the model's stream where train_gpt2.c's
// pipeline_run reads its clock (the step's start, then after each receive,
// op and send, and after the data a forward reads), and the times between
// them, read once the stream has passed the last (pipe_clock_read, after
// the step's sync), are the ops' and the messages' times on the GPU. A
// receive's span holds the GPU's wait for its peer (an NCCL kernel's spin,
// or host mode's wait on the host, with the GPU idle). The ends must be on
// one clock for the box, as the CPU trainer's are (watch.h): the step's
// first mark is queued on an idle GPU just after the host reads its clock
// (pipe_clock_start), so a mark's time from the first, added to that
// reading, is on the host's clock to within a launch's latency. Where
// ranks share a GPU, each rank's ops take longer by the others' kernels
// run between; over NCCL with dp > 1, the side stream's overlapped
// gradient reductions that a message must wait for count in its span
// (nccl_order_main), where the CPU trainer's, made inside the op, count
// as busy.
enum {
    PIPE_CLOCK_MSG = -1,   // a message's span
    PIPE_CLOCK_NONE = -2,  // none: the step's first mark, or a plan step with no op (PIPE_MSG)
    PIPE_CLOCK_DATA = -3,  // the data a forward reads, staged before its receive: the F's time, not an op
};

// events for a plan of nops steps (1 + 4 nops marks) and the meter's device
// floats for world ranks, made at the first step's start
static void pipe_clock_init(GPT2 *m, int nops, int world) {
    PipeClock *c = &m->clock;
    c->cap = 1 + 4 * nops;
    c->marks = (cudaEvent_t *)host_alloc((size_t)c->cap * sizeof(cudaEvent_t), "the pipeline clock's marks");
    c->spans = (signed char *)host_alloc((size_t)c->cap, "the pipeline clock's spans");
    for (int k = 0; k < c->cap; k++) CUDA_CHECK(cudaEventCreate(&c->marks[k]));
    c->floats = (float *)device_alloc((size_t)world * PIPE_METER_FLOATS * sizeof(float), "the pipeline meter");
    c->n = 0;
}

// a mark on the stream; span says what ran since the one before
static void pipe_clock_mark(GPT2 *m, int span) {
    PipeClock *c = &m->clock;
    if (c->n >= c->cap) return;  // off (cap 0), or past a plan it was not made for
    CUDA_CHECK(cudaEventRecord(c->marks[c->n], m->stream));
    c->spans[c->n++] = (signed char)span;
}

// the step's first mark, on the host's clock: the GPU made idle (what is
// queued before the step is the gradients' and losses' zeroing), the clock
// read, the mark queued at once. The clock runs where the meter does
// (watch.h's pipe_meter_init: pp > 1), its events made for this plan of
// nops steps at the first step
static void pipe_clock_start(GPT2 *m, int nops) {
    PipeClock *c = &m->clock;
    c->n = 0;
    if (m->shard.pp <= 1) return;
    if (c->cap == 0) pipe_clock_init(m, nops, m->grid.world);
    gpu_sync(m, "the pipeline clock's start");
    c->t0 = now_ms();
    pipe_clock_mark(m, PIPE_CLOCK_NONE);
}

// the step's marks into t (watch.h's PipeTimes, as train_gpt2.c's
// pipeline_run fills it), once the stream has passed them: each op's time
// by its kind, the messages', and the end on the host's clock
static void pipe_clock_read(GPT2 *m, PipeTimes *t) {
    PipeClock *c = &m->clock;
    if (c->n == 0) return;
    CUDA_CHECK(cudaEventSynchronize(c->marks[c->n - 1]));
    for (int i = 1; i < c->n; i++) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, c->marks[i - 1], c->marks[i]));
        if (c->spans[i] == PIPE_CLOCK_MSG) t->msg_ms += ms;
        else if (c->spans[i] == PIPE_CLOCK_DATA) t->op_ms[PIPE_F] += ms;
        else if (c->spans[i] != PIPE_CLOCK_NONE) pipe_times_add(t, c->spans[i], ms);
    }
    float end = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&end, c->marks[0], c->marks[c->n - 1]));
    t->end_ms = c->t0 + end;
    c->n = 0;
}

// runs the plan's ops and messages; the losses add up in sc.losses (the
// last part). dloss = 1 / (all positions of the step). Every stage reads
// each micro-batch from the stream once, at its F on chunk 0 (in
// micro-batch order on every schedule), and stages it before the op's
// receive, so the copy overlaps the wait; its later chunks copy it from
// that set (copy_batch). last_micro marks the backward after which a
// unit's ZeRO-0/1 data-parallel sum may start (unit_grad_end): the last of
// the step that writes its chunk's weights' gradients. With the meter on,
// the step is marked on the GPU's clock (pipe_clock_mark), and t (watch.h's
// PipeTimes, the CPU trainer's measure of the bubble) is filled from the
// marks after the step (pipe_clock_read).
static void pipeline_run(GPT2 *m, DataLoader *train, const PipeStep *plan, int n, float dloss, PipeTimes *t) {
    const Shard *s = &m->shard;
    pipe_times_start(t);
    pipe_clock_start(m, n);
    if (s->pp > 1) nccl_mac_step_begin(m->nccl);  // the step's MAC'd messages, checked by gpt2_step_loss
    for (int i = 0; i < n; i++) {
        const PipeStep *st = &plan[i];
        PipeOp op = st->op;
        if (op.kind == PIPE_F) {
            Acts *a = set_take(m, op.mb, op.chunk);
            if (op.chunk == 0) {
                next_batch(train, m->inputs, m->targets);
                gpt2_stage_batch(m, a, 1);
            } else {
                copy_batch(m, a, &m->acts[set_index(m, op.mb, 0)]);
            }
            pipe_clock_mark(m, PIPE_CLOCK_DATA);
        }
        pipe_recv(m, st->recv);
        pipe_clock_mark(m, PIPE_CLOCK_MSG);
        if (op.kind == PIPE_F) {
            Acts *a = &m->acts[set_index(m, op.mb, op.chunk)];
            if (chunk_last(s, op.chunk)) head_take(m, set_index(m, op.mb, op.chunk));
            chunk_forward(m, a, op.chunk, FWD_TRAIN, dloss);
        } else if (op.kind == PIPE_B || op.kind == PIPE_W) {
            Acts *a = &m->acts[set_index(m, op.mb, op.chunk)];
            int part = m->dsets == NULL ? BACK_ALL : op.kind == PIPE_W ? BACK_WEIGHTS : BACK_INPUT;
            m->last_micro = part != BACK_INPUT && op.mb == m->last_mb[op.chunk];
            chunk_backward(m, a, grads_of(m, op.mb, op.chunk), part, op.chunk);
            // the set's last op: a send after it reads the scratch (dresidual)
            // or, split, the B's own set, still held until the W
            if (part != BACK_INPUT) set_give_back(m, op.mb, op.chunk);
        }
        pipe_clock_mark(m, op.kind == PIPE_MSG ? PIPE_CLOCK_NONE : op.kind);
        pipe_send(m, st->send, st->next_recv);
        pipe_clock_mark(m, PIPE_CLOCK_MSG);
    }
}

// the forward of batch i, set a, through the model's parts in model order
// (the evaluations): each of my chunks receives its input from the part
// before, runs, and sends its output to the part after; the frames tagged
// as in a step. Its losses add into sc.losses on the last part.
static void forward_in_model_order(GPT2 *m, Acts *a, int i) {
    const Shard *s = &m->shard;
    const PipeLayout *pl = &m->pipe;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(floatX);
    int P = s->pp * s->nchunks;
    for (int p = 0; p < P; p++) {
        int stage, k, peer, peer_chunk;
        pipeline_place(pl, p, &stage, &k);
        if (stage != s->pp_rank) continue;
        if (p > 0) {
            pipeline_place(pl, p - 1, &peer, &peer_chunk);
            if (peer != stage)
                nccl_sendrecv_mac(m->nccl, -1, CH_ACTIVATION, 0, NULL, 0, stage_rank(m, peer), CH_ACTIVATION,
                                  i * s->nchunks + k, a->encoded, bytes);
            else {  // a hand-off between two chunks of mine, in the one set, where
                    // the chunk before received over NCCL: its MAC check reads it first
                nccl_mac_before_write(m->nccl, m->stream, a->encoded, bytes);
                CUDA_CHECK(cudaMemcpyAsync(a->encoded, block_input(m, a, s->chunk[peer_chunk].nl), bytes,
                                           cudaMemcpyDeviceToDevice, m->stream));
            }
        }
        if (p == P - 1) head_take(m, (int)(a - m->acts));  // between steps: every logits block is free
        chunk_forward(m, a, k, FWD_LOSS, 0.0f);
        if (p == P - 1) head_give_back(m, (int)(a - m->acts));
        if (p < P - 1) {
            pipeline_place(pl, p + 1, &peer, &peer_chunk);
            if (peer != stage)
                nccl_sendrecv_mac(m->nccl, stage_rank(m, peer), CH_ACTIVATION, i * s->nchunks + peer_chunk,
                                  block_input(m, a, s->chunk[k].nl), bytes, -1, CH_ACTIVATION, 0, NULL, 0);
        }
    }
}

#endif  // LLM3D_GPU_PIPELINE_RUN_CUH
