/*
 * llm3d/cpu/train_gpt2/pipeline_run.h: the CPU trainer's pipeline step: the
 * activation sets micro-batches take and give back, the messages between
 * stages (and the hand-offs within one), and the step's ops in the order of
 * the schedule; and the forward in model order that the evaluations use.
 *
 * defines:
 *   set_take, set_index, set_give_back, grads_of
 *                        activation sets per (micro-batch, chunk), kept in
 *                        pipeline.h's PipeSets (its peak: the most a step
 *                        held at once)
 *   sender_chunk, pipe_buffer, pipe_tag, pipe_hand_off, pipe_recv, pipe_send
 *                        the pipeline's messages
 *   pipeline_run         one step's ops and messages, by the plan
 *   forward_in_model_order
 *                        one micro-batch through the model's parts in order
 *
 * A part of train_gpt2.c, not a header of its own (as train_gpt2.cu's
 * llm3d/cuda/train_gpt2cu/ files are of it): train_gpt2.c includes it where
 * its trainer part begins, after watch.h, and it uses that file's GPT2,
 * chunk_forward, chunk_backward, stage_rank, head_take and watch.h's
 * PipeTimes.
 */
#ifndef LLM3D_CPU_PIPELINE_RUN_H
#define LLM3D_CPU_PIPELINE_RUN_H

// one step's forwards and backwards in the order of the pipeline schedule,
// and the messages between neighbouring stages in the order of its plan
// (pipeline.h's pipeline_plan): an op's input received alone before it, or
// with the previous op's send as one exchange, where two neighbours would
// otherwise both send first and wait on each other once a message outgrows
// the ring. With chunks (-ps interleaved, zbv) the plan follows one order of all
// the step's messages, so an input may come an op or more before its op;
// zbv's turn within the last stage is a hand-off, a copy (pipe_hand_off).
// pipeline_check plays these plans in test_parallel.
//
// Activation sets: micro-batch mb on chunk k takes a free set at its first
// receive or op and gives it back after its last op (its B; its W where
// the backward is split), so that an early input has somewhere to land;
// pipeline_plan_sets counts the sets a plan needs that way. A set holds its
// incoming gradient too (grad_in), as that may come before the B.

// the set of mb on chunk k, taken from the free ones when it has none yet
static Acts *set_take(GPT2 *m, int mb, int k) {
    int i = pipe_sets_take(&m->sets, mb, k);
    if (i < 0) {  // pipeline_plan_sets sized them: a plan the count does not know
        fprintf(stderr, "rank %d: micro-batch %d on chunk %d finds none of the %d activation sets free\n",
                m->par->grid.rank, mb, k, m->nacts);
        exit(1);
    }
    return &m->acts[i];
}

// the set index of mb on chunk k, which it must hold
static int set_index(const GPT2 *m, int mb, int k) {
    int i = pipe_sets_index(&m->sets, mb, k);
    if (i < 0) {
        fprintf(stderr, "rank %d: micro-batch %d on chunk %d holds no activation set\n", m->par->grid.rank, mb, k);
        exit(1);
    }
    return i;
}

static void set_give_back(GPT2 *m, int mb, int k) {
    head_give_back(m, set_index(m, mb, k));
    pipe_sets_give_back(&m->sets, mb, k);
}

// the activation gradients of mb's backward on chunk k: its own set where
// the backward is split (its W reads them later), else the one shared set
static Acts *grads_of(GPT2 *m, int mb, int k) { return m->dsets != NULL ? &m->dsets[set_index(m, mb, k)] : &m->dacts; }

// my chunk that sends msg: the part before (an activation) or after (a
// gradient) the receiver's part
static int sender_chunk(const GPT2 *m, PipeMsg msg) {
    const PipeLayout *pl = &m->par->pipe;
    int part = pipeline_part(pl, msg.peer, msg.chunk) + (msg.channel == CH_ACTIVATION ? -1 : 1), stage, k;
    pipeline_place(pl, part, &stage, &k);
    return k;
}

// where a message's rows*C floats live (B*T*C, or under -sp this rank's
// rows, which go to the same tp rank of the next stage): an activation
// arrives as the set's block input and leaves as the chunk's output; a
// gradient arrives in the set's grad_in and leaves from the gradient of the
// chunk's input
static float *pipe_buffer(GPT2 *m, PipeMsg msg, int incoming) {
    if (incoming) {
        Acts *a = msg.channel == CH_ACTIVATION ? set_take(m, msg.mb, msg.chunk) : &m->acts[set_index(m, msg.mb, msg.chunk)];
        return msg.channel == CH_ACTIVATION ? a->t[A_ENCODED] : a->grad_in;
    }
    int k = sender_chunk(m, msg);
    if (msg.channel == CH_ACTIVATION) return block_input(m, &m->acts[set_index(m, msg.mb, k)], m->shard.chunk[k].nl);
    return grads_of(m, msg.mb, k)->t[A_ENCODED];
}

// the frame's tag: the micro-batch and the receiver's chunk (the micro-batch itself with one chunk)
static int pipe_tag(const GPT2 *m, PipeMsg msg) { return msg.mb * m->shard.nchunks + msg.chunk; }

// a hand-off between two of my chunks (zbv's turn, part pp-1 to part pp
// and back, within the last stage; every message on one stage), which
// the transport never sees: the message's floats copied from where the
// sending chunk leaves them to where the receiving chunk reads them, at
// the end where the sender's floats are sure to be there. An activation
// at the receive: the sending chunk's set is held until that micro-batch's
// backward there, which comes after the receiving chunk's forward. A
// gradient at the send: the sending chunk may give its set back (its W)
// before the receiving chunk's B, whose set has been held since its F.
static void pipe_hand_off(GPT2 *m, PipeMsg msg, int at_send) {
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(float);  // -sp: my rows
    if ((msg.channel == CH_ACTIVATION) == at_send) return;  // done at the other end
    memcpy(pipe_buffer(m, msg, 1), pipe_buffer(m, msg, 0), bytes);
}

static void pipe_recv(GPT2 *m, PipeMsg in) {
    if (in.peer < 0) return;
    const Parallel *par = m->par;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(float);  // -sp: my rows, to and from my tp rank's peer
    if (in.peer == m->shard.pp_rank) {
        pipe_hand_off(m, in, 0);
        return;
    }
    comm_recv(par->comm, stage_rank(par, in.peer), in.channel, pipe_tag(m, in), pipe_buffer(m, in, 1), bytes);
}

// sends out; with a message in (an exchange), receives it at the same time
static void pipe_send(GPT2 *m, PipeMsg out, PipeMsg in) {
    if (out.peer < 0) return;
    const Parallel *par = m->par;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(float);
    if (out.peer == m->shard.pp_rank) {  // never in an exchange (pipeline_check)
        pipe_hand_off(m, out, 1);
        return;
    }
    int peer = stage_rank(par, out.peer);
    if (in.peer < 0) comm_send(par->comm, peer, out.channel, pipe_tag(m, out), pipe_buffer(m, out, 0), bytes);
    else comm_sendrecv(par->comm, peer, out.channel, pipe_tag(m, out), pipe_buffer(m, out, 0), bytes,
                       stage_rank(par, in.peer), in.channel, pipe_tag(m, in), pipe_buffer(m, in, 1), bytes);
}

// runs the plan's ops and messages; the micro-batches' mean losses add up
// in m->loss_sum (the last part). dloss as for chunk_backward. Every stage
// reads each micro-batch from the stream once, at its F on chunk 0 (in
// micro-batch order on every schedule); its later chunks copy the tokens
// from that set, which it holds until its last B. t gets the step's times
// (watch.h's PipeTimes: each op's, the messages', the end) for the bubble.
static void pipeline_run(GPT2 *m, DataLoader *train, const PipeStep *plan, int n, float dloss, PipeTimes *t) {
    const Shard *s = &m->shard;
    size_t BT = (size_t)m->B * m->T;
    pipe_times_start(t);
    double at = now_ms(), was;
    for (int i = 0; i < n; i++) {
        const PipeStep *st = &plan[i];
        PipeOp op = st->op;
        pipe_recv(m, st->recv);
        was = at, at = now_ms(), t->msg_ms += at - was;
        if (op.kind == PIPE_F) {
            Acts *a = set_take(m, op.mb, op.chunk);
            if (op.chunk == 0) {
                next_batch(train, a->inputs, a->targets);
            } else {
                const Acts *a0 = &m->acts[set_index(m, op.mb, 0)];
                memcpy(a->inputs, a0->inputs, BT * sizeof(int));
                memcpy(a->targets, a0->targets, BT * sizeof(int));
            }
            if (chunk_last(s, op.chunk)) head_take(m, set_index(m, op.mb, op.chunk));
            chunk_forward(m, a, op.chunk, 1);
            if (chunk_last(s, op.chunk)) m->loss_sum += a->mean_loss;
        } else if (op.kind == PIPE_B || op.kind == PIPE_W) {
            Acts *a = &m->acts[set_index(m, op.mb, op.chunk)];
            int part = m->dsets == NULL ? BACK_ALL : op.kind == PIPE_W ? BACK_WEIGHTS : BACK_INPUT;
            chunk_backward(m, a, grads_of(m, op.mb, op.chunk), dloss, part, op.chunk);
            // the set's last op: a send after it reads the shared gradients
            // (dacts) or, split, the B's own set, still held until the W
            if (part != BACK_INPUT) set_give_back(m, op.mb, op.chunk);
        }
        was = at, at = now_ms();
        if (op.kind != PIPE_MSG) pipe_times_add(t, op.kind, at - was);
        pipe_send(m, st->send, st->next_recv);
        was = at, at = now_ms(), t->msg_ms += at - was;
    }
    t->end_ms = at;
}

// the forward of batch i, set a, through the model's parts in model order
// (the evaluations): each of my chunks receives its input from the part
// before, runs, and sends its output to the part after; the frames tagged
// as in a step
static void forward_in_model_order(GPT2 *m, Acts *a, int i) {
    const Shard *s = &m->shard;
    const PipeLayout *pl = &m->par->pipe;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(float);
    int P = s->pp * s->nchunks;
    for (int p = 0; p < P; p++) {
        int stage, k, peer, peer_chunk;
        pipeline_place(pl, p, &stage, &k);
        if (stage != s->pp_rank) continue;
        if (p > 0) {
            pipeline_place(pl, p - 1, &peer, &peer_chunk);
            if (peer != stage)
                comm_recv(m->par->comm, stage_rank(m->par, peer), CH_ACTIVATION, i * s->nchunks + k, a->t[A_ENCODED], bytes);
            else  // a hand-off between two chunks of mine, in the one set
                memmove(a->t[A_ENCODED], block_input(m, a, s->chunk[peer_chunk].nl), bytes);
        }
        if (p == P - 1) head_take(m, (int)(a - m->acts));  // between steps: every logits block is free
        chunk_forward(m, a, k, 1);
        if (p == P - 1) head_give_back(m, (int)(a - m->acts));
        if (p < P - 1) {
            pipeline_place(pl, p + 1, &peer, &peer_chunk);
            if (peer != stage)
                comm_send(m->par->comm, stage_rank(m->par, peer), CH_ACTIVATION, i * s->nchunks + peer_chunk,
                          block_input(m, a, s->chunk[k].nl), bytes);
        }
    }
}

#endif
