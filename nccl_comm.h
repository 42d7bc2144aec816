/*
 * nccl_comm.h: the GPU trainer's side of the communicator. Pure C, compiled
 * everywhere so the CPU tests check the decisions the CUDA build makes:
 * gpu_for_rank and gpu_own_visible (which GPU a rank binds to), and the
 * headers of the MAC'd point-to-point messages (nccl_mac_chunk_bytes,
 * mac_send_header, mac_recv_header). Then, in CUDA builds only
 * (-DLLM3D_NCCL), the NCCL backend: NcclComm, nccl_init, the collectives on
 * device buffers, the overlapped gradient reductions (nccl_side_*), the
 * point-to-point calls, the MAC'd messages checked on the GPU
 * (nccl_sendrecv_mac, nccl_mac_step_check), the watchdog and nccl_free.
 * Header-only (llm.c style): every function is static inline.
 *
 * The same calls as the host backend (shm_comm.h: they take its OP_SUM and
 * OP_AVG, and nccl_init checks its arguments with comm_init_check), on
 * device buffers: a communicator per group split from the world's,
 * non-blocking; calls are queued, not waited for, and a watchdog at the
 * host's wait points aborts the communicators on an error or a timeout.
 * Not named nccl.h: that would shadow NCCL's own header.
 */
#ifndef LLM3D_NCCL_COMM_H
#define LLM3D_NCCL_COMM_H

#include "secure.h"
#include "grid.h"
#include "launcher.h"  // Launch, rdv_join, par_now
#include "shm_comm.h"  // OP_SUM, OP_AVG, comm_init_check

// ----------------------------------------------------------------------------
// the GPU trainer's side: one GPU per rank.
// Pure C, so the CPU tests check the decisions the CUDA build makes.

// gpu_for_rank: the device a rank binds to (its local rank: rank i of a node
// takes GPU i), or -1 with err set when the node has no GPU for it. own_gpu:
// an outside launcher gave each task its own GPU and made it the only one it
// sees (srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per task): device 0.
static inline int gpu_for_rank(int local_rank, int ndevices, int own_gpu, char *err, size_t errlen) {
    if (ndevices < 1)
        return errorf(err, errlen, "local rank %d: no CUDA device on this node", local_rank);
    if (own_gpu && ndevices == 1) return 0;
    if (local_rank < 0 || local_rank >= ndevices)
        return errorf(err, errlen, "local rank %d has no GPU of its own: this node has %d (one rank per GPU)",
                      local_rank, ndevices);
    return local_rank;
}

// gpu_own_visible: whether this rank sees exactly the one GPU a launcher
// other than ours gave it (CUDA_VISIBLE_DEVICES names one device)
static inline int gpu_own_visible(const Launch *L) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    return L->source != NULL && strcmp(L->source, "LLM3D_*") != 0 && v != NULL && v[0] != '\0' && strchr(v, ',') == NULL;
}

// ----------------------------------------------------------------------------
// MAC'd point-to-point messages of the NCCL backend: what both sides derive on
// the host. Pure C, so the CPU tests (and test_gpt2cu's host checks) check it.
// A message is `payload | tag (NCCL_MAC_BYTES)`: the chunked MAC of the
// payload (secure.h, doc/security.md "Chunked MAC") under the frame header
// that frame_header_make (secure.h) builds. The header itself never travels: the receiver
// builds the one it expects, so a message MAC'd under any other header fails.

#define NCCL_MAC_BYTES FRAME_TAG_BYTES       // room after every MAC'd payload, for its tag
#define NCCL_MAC_TARGET_CHUNKS 1024          // chunks (GPU threads) a large message is cut into
#define NCCL_MAC_MIN_CHUNK_BYTES (4u << 10)  // a chunk pays ~3 blocks beyond its own: 5% at 4 KiB

// nccl_mac_chunk_bytes: the chunk size of a len-byte message, from len alone
// (sender and receiver must agree without telling each other): len / 1024
// rounded down to a multiple of 64, within 4 KiB .. CHUNKMAC_CHUNK_BYTES.
// Rounding down gives at least 1024 chunks from 4 MiB on (at most 1040 up to
// 64 MiB); from 64 MiB the chunks stay at 64 KiB and their number grows;
// under 4 MiB there are fewer than 1024 chunks of 4 KiB (a small message is
// quick anyway). A 25 MB activation gets 1024 chunks of 24 KiB, near the
// sqrt(32 len) that makes the chunk chain plus the final chain shortest
// (doc/security.md, "Cost"); dev/cuda/mac.cu times the sizes this picks.
static inline uint64_t nccl_mac_chunk_bytes(uint64_t len) {
    uint64_t cb = len / NCCL_MAC_TARGET_CHUNKS / 64 * 64;
    if (cb < NCCL_MAC_MIN_CHUNK_BYTES) return NCCL_MAC_MIN_CHUNK_BYTES;
    if (cb > CHUNKMAC_CHUNK_BYTES) return CHUNKMAC_CHUNK_BYTES;
    return cb;
}

// mac_send_header: the header of the next message to dst; uses and advances
// send_seq[dst], except when replay is set and a message went to dst before:
// then it reuses that message's number and send_seq[dst] stays (returns 1).
// The receiver's count does advance, so from then on the two disagree by one
// on that link: the replayed message and every later one fail their MAC.
static inline int mac_send_header(Links *l, int dst, int channel, long step, int microbatch, uint64_t len, int replay,
                                  uint8_t out[64]) {
    int replayed = replay && links_rewind_send(l, dst) == 0;
    frame_header_make(out, l->job_id, l->rank, dst, channel, step, microbatch, l->send_seq[dst]++, len);
    return replayed;
}

// mac_recv_header: the header the next message from src must have been
// tagged under; uses and advances recv_seq[src]
static inline void mac_recv_header(Links *l, int src, int channel, long step, int microbatch, uint64_t len,
                                   uint8_t out[64]) {
    frame_header_make(out, l->job_id, src, l->rank, channel, step, microbatch, l->recv_seq[src]++, len);
}

#ifdef LLM3D_NCCL
// ----------------------------------------------------------------------------
// the NCCL backend (CUDA builds: nvcc -DLLM3D_NCCL ... -lnccl)
//
// The same calls as the host backend, on device buffers, queued on the
// trainer's stream. One communicator per group, split from the world
// communicator once at start; rank 0 makes the NCCL unique id and the
// authenticated rendezvous hands it out (the 128-byte blob), so a rank only
// ever joins the communicator its job's root named (over tcp: the id is
// authenticated, not secret; anyone on the wire can read it). The communicators are
// non-blocking, and the host never waits inside a call: nccl_queued only
// makes sure NCCL took it, so collectives queue behind the kernels like any
// kernel. The watchdog runs where the host does wait, at the trainer's few
// sync points (nccl_sync, nccl_sync_event, nccl_side_drain, the MAC check):
// it polls every communicator's async error and the stream, and on an error
// or after timeout_s it aborts every communicator (so no kernel waits on a
// dead peer forever) and exits with one line naming the rank, the last call
// queued and its group, and the step.

#include <cuda_runtime.h>
#include <nccl.h>

static_assert(sizeof(ncclUniqueId) == COMM_BLOB_BYTES, "the NCCL unique id is the rendezvous blob");

#define NCCL_POLL_S 20e-6   // between two looks at a call in flight

typedef struct {
    Group group;            // members in coordinate order (grid_groups)
    ncclComm_t comm;        // its ranks are the group's, in the same order
    const char *name;       // "world", "dp", "tp", "pp", for messages
} NcclGroup;

#define NCCL_MAC_MAX_MSGS 4096  // MAC'd receives per step, until nccl_mac_reserve says how many

typedef struct { int src, channel, microbatch; long step; size_t bytes; } NcclMacRecv;  // one checked receive

typedef struct {
    int rank;
    long step;
    double timeout_s;
    Fault fault;
    cudaStream_t stream;    // every call but the side ones is queued here: the caller sets it (0, the legacy stream, until then)
    char last[128];         // the last call queued (op and what), for the watchdog's message
    float *one;             // a device float, what a barrier all-reduces
    NcclGroup world, dp, tp, pp;
    // the gradient reductions overlapped with the backward (nccl_side_*): a
    // stream of their own, and a second communicator of the dp group, so each
    // communicator is used from one stream only
    NcclGroup dp_side;
    cudaStream_t side;
    cudaEvent_t side_follow;  // recorded on stream: where the side stream's next call may start
    int side_pending;         // calls queued on side since the last nccl_side_drain
    const char *op;         // the call in progress, for messages
    char what[96];          // its peer or channel, for messages
    // MAC'd point-to-point messages (nccl_sendrecv_mac)
    Links links;            // the key's HMAC state, the job id, the per-pair sequence numbers
    uint8_t *mac_scratch;   // device: the chunk tags of one message (32 bytes per chunk)
    size_t mac_scratch_bytes;
    int *mac_bad;           // device [mac_cap]: 1 where the step's receive of that index failed its MAC
    NcclMacRecv *mac_recvs; // host [mac_cap]: what each receive of the step was, for the error
    int mac_cap, mac_nrecv; // capacity of both; receives so far this step
    int mac_fault_done;     // tamper or replay has acted (once per job, as in the host backend)
    // receives are verified on a stream of their own, off the critical path:
    // the next receive into any buffer waits until the last check has read its
    cudaStream_t verify;
    cudaEvent_t received, verified;
    uint8_t *verify_scratch;
    size_t verify_scratch_bytes;
} NcclComm;

static inline void nccl_abort_all(NcclComm *c) {
    NcclGroup *gs[5] = {&c->dp_side, &c->dp, &c->tp, &c->pp, &c->world};  // the world, their parent, last
    for (int i = 0; i < 5; i++) {
        if (gs[i]->comm != NULL) ncclCommAbort(gs[i]->comm);
        gs[i]->comm = NULL;
    }
}

// nccl_fail: one line, every communicator aborted, exit 1
static inline void nccl_fail(NcclComm *c, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: nccl %s%s (step %ld): %s\n", c->rank, c->op, c->what, c->step, msg);
    fflush(stderr);
    nccl_abort_all(c);
    exit(1);
}

// nccl_settle: polls comm until its last call has left ncclInProgress (a
// non-blocking communicator may still be connecting or launching); returns
// its state, ncclInProgress when deadline passed first
static inline ncclResult_t nccl_settle(ncclComm_t comm, double deadline) {
    for (;;) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress || par_now() > deadline) return state;
        par_sleep(NCCL_POLL_S);
    }
}

// nccl_queued: the watchdog's part at every call; r is what the call
// returned. The host does not wait for the transfer: it only makes sure NCCL
// has taken the call (a non-blocking communicator may still be launching)
// and that no communicator has failed, then goes on queueing work, as for
// any kernel. The waiting is done at the trainer's few host sync points,
// through nccl_sync, where the clock runs.
static inline void nccl_queued(NcclComm *c, const NcclGroup *g, ncclResult_t r) {
    if (r != ncclSuccess && r != ncclInProgress) nccl_fail(c, "%s: %s", ncclGetErrorString(r), ncclGetLastError(g->comm));
    ncclResult_t state = r == ncclInProgress ? nccl_settle(g->comm, par_now() + c->timeout_s) : ncclSuccess;
    if (state == ncclInProgress) nccl_fail(c, "not launched within %.1f s", c->timeout_s);
    if (state != ncclSuccess) nccl_fail(c, "%s: %s", ncclGetErrorString(state), ncclGetLastError(g->comm));
    snprintf(c->last, sizeof(c->last), "%s%s", c->op, c->what);
}

// nccl_poll_errors: fails on any communicator's asynchronous error
static inline void nccl_poll_errors(NcclComm *c) {
    NcclGroup *gs[5] = {&c->world, &c->dp, &c->tp, &c->pp, &c->dp_side};
    for (int i = 0; i < 5; i++) {
        ncclResult_t state = ncclSuccess;
        if (gs[i]->comm == NULL) continue;
        ncclResult_t q = ncclCommGetAsyncError(gs[i]->comm, &state);
        if (q != ncclSuccess) state = q;
        if (state != ncclSuccess && state != ncclInProgress)
            nccl_fail(c, "%s group: %s: %s", gs[i]->name, ncclGetErrorString(state), ncclGetLastError(gs[i]->comm));
    }
}

// nccl_sync_until: the watchdog at a host sync point: polls until done(arg)
// (a stream or an event has passed), failing on a communicator's error or
// after timeout_s. The clock starts here: the trainer keeps the host at most
// a few layers ahead of the GPU (train_gpt2.cu's gpu_progress), far less work
// than any timeout, so a wait that long is a peer that died, stopped, or
// called something else.
static inline void nccl_sync_until(NcclComm *c, cudaError_t (*query)(void *), void *arg, const char *what) {
    double start = par_now();
    c->op = "sync";
    snprintf(c->what, sizeof(c->what), " (%s)", what);
    for (;;) {
        nccl_poll_errors(c);
        cudaError_t e = query(arg);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) nccl_fail(c, "CUDA: %s", cudaGetErrorString(e));
        double now = par_now();
        if (now - start > c->timeout_s)
            nccl_fail(c, "timeout after %.1f s waiting for the GPU, whose last NCCL call queued was %s: a peer died, "
                      "stopped, or called something else", now - start, c->last[0] ? c->last : "none");
        par_sleep(NCCL_POLL_S);
    }
}

static inline cudaError_t nccl_query_stream(void *s) { return cudaStreamQuery((cudaStream_t)s); }
static inline cudaError_t nccl_query_event(void *e) { return cudaEventQuery((cudaEvent_t)e); }

// nccl_sync: returns once everything queued on stream st is done
static inline void nccl_sync(NcclComm *c, cudaStream_t st, const char *what) {
    nccl_sync_until(c, nccl_query_stream, (void *)st, what);
}

// nccl_sync_event: returns once event ev has passed
static inline void nccl_sync_event(NcclComm *c, cudaEvent_t ev, const char *what) {
    nccl_sync_until(c, nccl_query_event, (void *)ev, what);
}

// nccl_enter: the start of every call (g: a collective's group, NULL for
// point to point); where the kill and stall faults act
static inline void nccl_enter(NcclComm *c, const char *op, const NcclGroup *g) {
    c->op = op;
    c->what[0] = '\0';
    if (g != NULL) snprintf(c->what, sizeof(c->what), " on the %s group", g->name);
    if (!fault_fires(&c->fault, c->rank, c->step)) return;
    if (c->fault.kind == FAULT_KILL) {
        fprintf(stderr, "rank %d: fault kill at step %ld (nccl %s): SIGKILL\n", c->rank, c->step, op);
        raise(SIGKILL);
    }
    if (c->fault.kind == FAULT_STALL) {
        fprintf(stderr, "rank %d: fault stall at step %ld (nccl %s): no more calls\n", c->rank, c->step, op);
        for (;;) pause();
    }
}

static inline ncclRedOp_t nccl_redop(NcclComm *c, int op) {
    if (op != OP_SUM && op != OP_AVG) nccl_fail(c, "op %d is neither OP_SUM nor OP_AVG", op);
    return op == OP_SUM ? ncclSum : ncclAvg;
}

// nccl_split: g's communicator from the world's, with grid_split's color and key
static inline int nccl_split(NcclComm *c, const Grid *grid, int dim, NcclGroup *g, const char *name, double deadline,
                             char *err, size_t errlen) {
    int color, key;
    grid_split(grid, dim, &color, &key);
    g->name = name;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommSplit(c->world.comm, color, key, &g->comm, &config);
    if (r == ncclSuccess || r == ncclInProgress) r = nccl_settle(c->world.comm, deadline);
    if ((r == ncclSuccess || r == ncclInProgress) && g->comm != NULL) r = nccl_settle(g->comm, deadline);
    int count = 0, me = -1;
    if (r == ncclSuccess && g->comm != NULL) {
        ncclCommCount(g->comm, &count);
        ncclCommUserRank(g->comm, &me);
    }
    if (r != ncclSuccess || g->comm == NULL || count != g->group.size || me != g->group.me)
        return errorf(err, errlen, "rank %d: ncclCommSplit of the %s group (color %d, key %d): %s "
                      "(%d ranks, this one %d; expected %d and %d)", c->rank, name, color, key,
                      r == ncclInProgress ? "timed out" : ncclGetErrorString(r), count, me, g->group.size, g->group.me);
    return 0;
}

// nccl_init: the communicators of this rank's world, dp, tp and pp groups
// (and dp_side, a second one of the dp group for the side stream).
// cudaSetDevice must have bound this rank's GPU (gpu_for_rank) before. A
// world of one needs no rendezvous: the id never leaves the process.
static inline int nccl_init(NcclComm **out, const Grid *g, const uint8_t key[32], const char *rendezvous,
                            double timeout_s, const Fault *fault, char *err, size_t errlen) {
    *out = NULL;
    // tamper and replay act on MAC'd point-to-point messages (nccl_sendrecv_mac):
    // a job without any (pp = 1) runs on and they never fire
    if (comm_init_check(g, rendezvous, timeout_s, fault, err, errlen) != 0) return -1;
    NcclComm *c = (NcclComm *)calloc(1, sizeof(NcclComm));
    if (c == NULL) return errorf(err, errlen, "nccl_init: out of memory");
    c->rank = g->rank;
    c->timeout_s = timeout_s;
    c->op = "init";
    if (fault != NULL) c->fault = *fault;
    grid_groups(g, &c->world.group, &c->dp.group, &c->tp.group, &c->pp.group);
    c->world.name = "world";
    double setup_s = timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s;

    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t r = g->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess) {
        free(c);
        return errorf(err, errlen, "rank 0: ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    if (g->world > 1) {
        RdvAnswer ans;
        if (rdv_join(rendezvous, key, job_id_from_key(key), g->rank, g->world, g->local_rank,
                     g->rank == 0 ? (const uint8_t *)&id : NULL, setup_s, &ans, err, errlen) != 0) {
            free(c);
            return -1;
        }
        memcpy(&id, ans.blob, sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    double deadline = par_now() + setup_s;
    r = ncclCommInitRankConfig(&c->world.comm, g->world, id, g->rank, &config);
    secure_wipe(&id, sizeof(id));
    if ((r == ncclSuccess || r == ncclInProgress) && c->world.comm != NULL) r = nccl_settle(c->world.comm, deadline);
    if (r != ncclSuccess || c->world.comm == NULL) {
        if (c->world.comm != NULL) ncclCommAbort(c->world.comm);
        free(c);
        return errorf(err, errlen, "rank %d: ncclCommInitRankConfig for %d ranks: %s", g->rank, g->world,
                      r == ncclInProgress ? "not every rank joined in time" : ncclGetErrorString(r));
    }
    c->dp_side.group = c->dp.group;
    if (nccl_split(c, g, GRID_DP, &c->dp, "dp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_TP, &c->tp, "tp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_PP, &c->pp, "pp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_DP, &c->dp_side, "dp (overlapped)", deadline, err, errlen) != 0) {
        nccl_abort_all(c);
        free(c);
        return -1;
    }
    cudaError_t e = cudaEventCreateWithFlags(&c->side_follow, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->verify, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->received, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->verified, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->one, sizeof(float));
    if (e == cudaSuccess) e = cudaMemset(c->one, 0, sizeof(float));  // the barrier's all-reduce sums zeros
    // the MAC'd messages' state: sequence numbers from 0 on every pair, and
    // the flags of one step's receives (nccl_mac_step_begin clears them)
    c->mac_cap = NCCL_MAC_MAX_MSGS;
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->mac_bad, (size_t)c->mac_cap * sizeof(int));
    if (e == cudaSuccess) e = cudaMemset(c->mac_bad, 0, (size_t)c->mac_cap * sizeof(int));
    c->mac_recvs = (NcclMacRecv *)calloc((size_t)c->mac_cap, sizeof(NcclMacRecv));
    int links_ok = e == cudaSuccess && c->mac_recvs != NULL && links_init(&c->links, key, g->rank, g->world) == 0;
    if (!links_ok) {
        nccl_abort_all(c);
        cudaFree(c->one);
        cudaFree(c->mac_bad);
        free(c->mac_recvs);
        free(c);
        return errorf(err, errlen, "rank %d: nccl_init: %s", g->rank,
                      e != cudaSuccess ? cudaGetErrorString(e) : "out of memory for the MAC state");
    }
    *out = c;
    return 0;
}

static inline void nccl_set_step(NcclComm *c, long step) { c->step = step; }

// nccl_allreduce: buf (n elements of type) summed or averaged over the group, in place
static inline void nccl_allreduce(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int op) {
    nccl_enter(c, "allreduce", g);
    ncclRedOp_t red = nccl_redop(c, op);
    nccl_queued(c, g, ncclAllReduce(buf, buf, n, type, red, g->comm, c->stream));
}

// nccl_reduce_scatter: in holds size chunks of n_per_rank; out gets chunk
// grp.me reduced over the group. out may be in + me * n_per_rank (in place).
static inline void nccl_reduce_scatter(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                       ncclDataType_t type, int op) {
    nccl_enter(c, "reduce_scatter", g);
    ncclRedOp_t red = nccl_redop(c, op);
    nccl_queued(c, g, ncclReduceScatter(in, out, n_per_rank, type, red, g->comm, c->stream));
}

// nccl_allgather: out[k * n_per_rank ..] = member k's in; in may be out + me * n_per_rank
static inline void nccl_allgather(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                  ncclDataType_t type) {
    nccl_enter(c, "allgather", g);
    nccl_queued(c, g, ncclAllGather(in, out, n_per_rank, type, g->comm, c->stream));
}

// ----------------------------------------------------------------------------
// gradient reductions overlapped with the backward: calls on the dp group
// queued on the side stream behind what the main stream has queued so far,
// through the dp_side communicator. The host does not wait for them (only
// for NCCL to take the call): the backward of the next unit is queued on the
// main stream while the previous unit's gradients travel. nccl_side_drain
// waits for all of them, under the watchdog, before anything reads the
// reduced gradients; a kernel that must follow one of them on the main
// stream waits on an event the caller records on c->side.

// nccl_side_queued: as nccl_queued, for a call on the side stream
static inline void nccl_side_queued(NcclComm *c, ncclResult_t r) {
    nccl_queued(c, &c->dp_side, r);
    c->side_pending++;
}

static inline void nccl_side_enter(NcclComm *c, const char *op) {
    nccl_enter(c, op, &c->dp_side);
    cudaEventRecord(c->side_follow, c->stream);
    cudaStreamWaitEvent(c->side, c->side_follow, 0);
}

// nccl_side_allreduce: as nccl_allreduce over the dp group, overlapped
static inline void nccl_side_allreduce(NcclComm *c, void *buf, size_t n, ncclDataType_t type, int op) {
    nccl_side_enter(c, "allreduce (overlapped)");
    nccl_side_queued(c, ncclAllReduce(buf, buf, n, type, nccl_redop(c, op), c->dp_side.comm, c->side));
}

// nccl_side_reduce_scatter: as nccl_reduce_scatter over the dp group, overlapped
static inline void nccl_side_reduce_scatter(NcclComm *c, const void *in, void *out, size_t n_per_rank,
                                            ncclDataType_t type, int op) {
    nccl_side_enter(c, "reduce_scatter (overlapped)");
    nccl_side_queued(c, ncclReduceScatter(in, out, n_per_rank, type, nccl_redop(c, op), c->dp_side.comm, c->side));
}

// nccl_side_drain: returns once every side call (and every kernel the caller
// queued on c->side) is done, under the watchdog of nccl_sync
static inline void nccl_side_drain(NcclComm *c) {
    if (c->side_pending == 0) return;
    nccl_sync(c, c->side, "the overlapped gradient reductions");  // every communicator's errors, not only dp_side's
    c->side_pending = 0;
}

// nccl_broadcast: buf (n elements of type) from the group's member root to all, in place
static inline void nccl_broadcast(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int root) {
    nccl_enter(c, "broadcast", g);
    nccl_queued(c, g, ncclBroadcast(buf, buf, n, type, root, g->comm, c->stream));
}

// nccl_barrier: returns once every member has reached it (an all-reduce of one float)
static inline void nccl_barrier(NcclComm *c, const NcclGroup *g) {
    nccl_enter(c, "barrier", g);
    nccl_queued(c, g, ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclSum, g->comm, c->stream));
    nccl_sync(c, c->stream, "barrier");
}

// nccl_peers_ok: a send to dst and a receive from src (-1: none, not both) between other ranks of the world
static inline int nccl_peers_ok(const NcclComm *c, int dst_rank, int src_rank) {
    int world = c->world.group.size;
    return !((dst_rank < 0 && src_rank < 0) || dst_rank >= world || src_rank >= world || dst_rank == c->rank ||
             src_rank == c->rank);
}

// nccl_sendrecv: a send to dst and a receive from src (world ranks; -1 for
// none) posted in one group call, so two neighbours exchanging at once cannot
// deadlock on each other's order. channel and micro-batch name the message in
// errors; NCCL keeps the messages of a pair in the order posted.
static inline void nccl_sendrecv(NcclComm *c, int dst_rank, int send_channel, int send_microbatch, const void *sendbuf,
                                 size_t send_bytes, int src_rank, int recv_channel, int recv_microbatch, void *recvbuf,
                                 size_t recv_bytes) {
    nccl_enter(c, dst_rank >= 0 && src_rank >= 0 ? "sendrecv" : dst_rank >= 0 ? "send" : "recv", NULL);
    char *what = c->what;
    int world = c->world.group.size;
    if (dst_rank >= 0 && src_rank >= 0)
        snprintf(what, sizeof(c->what), " to rank %d (%s, micro-batch %d) and from rank %d (%s, micro-batch %d)", dst_rank,
                 channel_name(send_channel), send_microbatch, src_rank, channel_name(recv_channel), recv_microbatch);
    else if (dst_rank >= 0)
        snprintf(what, sizeof(c->what), " to rank %d (%s, micro-batch %d)", dst_rank, channel_name(send_channel),
                 send_microbatch);
    else
        snprintf(what, sizeof(c->what), " from rank %d (%s, micro-batch %d)", src_rank, channel_name(recv_channel),
                 recv_microbatch);
    if (!nccl_peers_ok(c, dst_rank, src_rank))
        nccl_fail(c, "peers %d and %d: not other ranks of the world of %d", dst_rank, src_rank, world);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) nccl_fail(c, "ncclGroupStart: %s", ncclGetErrorString(r));
    if (dst_rank >= 0) r = ncclSend(sendbuf, send_bytes, ncclUint8, dst_rank, c->world.comm, c->stream);
    if (r == ncclSuccess && src_rank >= 0) r = ncclRecv(recvbuf, recv_bytes, ncclUint8, src_rank, c->world.comm, c->stream);
    ncclResult_t end = ncclGroupEnd();
    nccl_queued(c, &c->world, r != ncclSuccess && r != ncclInProgress ? r : end);
}

static inline void nccl_send(NcclComm *c, int dst_rank, int channel, int microbatch, const void *buf, size_t bytes) {
    nccl_sendrecv(c, dst_rank, channel, microbatch, buf, bytes, -1, channel, microbatch, NULL, 0);
}

static inline void nccl_recv(NcclComm *c, int src_rank, int channel, int microbatch, void *buf, size_t bytes) {
    nccl_sendrecv(c, -1, channel, microbatch, NULL, 0, src_rank, channel, microbatch, buf, bytes);
}

// ----------------------------------------------------------------------------
// MAC'd point-to-point messages: the chunked MAC (secure.h) computed and
// checked on the GPU, so no payload crosses to the host. A sender tags its
// payload into the NCCL_MAC_BYTES after it (on c->stream: the send needs the
// tag) and sends both; a receiver queues the check of what arrived against
// the header it expects on c->verify, off the critical path, and sets that
// receive's flag on a mismatch. Nothing waits for the checks:
// nccl_mac_step_check reads the step's flags once, before the optimizer
// update, and a bad one refuses the step. doc/security.md, "NCCL pipeline messages".

// the tamper fault's byte flip, and its undoing after the send
static __global__ void nccl_mac_flip_kernel(uint8_t *p) { *p ^= 0x01; }

// nccl_mac_check_cuda: a CUDA error of the MAC's own work ends the job as any call's error does
static inline void nccl_mac_check_cuda(NcclComm *c, cudaError_t e, const char *what) {
    if (e != cudaSuccess) nccl_fail(c, "%s: CUDA: %s", what, cudaGetErrorString(e));
}

// nccl_mac_reserve: the room for MAC'd traffic, made once before the first
// step, while the streams are idle, so that nothing is allocated (or freed,
// which waits for the whole device) mid-run: max_recvs receives per step
// and messages of up to max_bytes. 0, or -1 with err set.
static inline int nccl_mac_reserve(NcclComm *c, int max_recvs, size_t max_bytes, char *err, size_t errlen) {
    size_t scratch = (size_t)(32 * chunkmac_count(max_bytes, nccl_mac_chunk_bytes(max_bytes)));
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess && max_recvs > c->mac_cap) {
        cudaFree(c->mac_bad);
        c->mac_bad = NULL;
        NcclMacRecv *recvs = (NcclMacRecv *)realloc(c->mac_recvs, (size_t)max_recvs * sizeof(NcclMacRecv));
        if (recvs == NULL) return errorf(err, errlen, "rank %d: out of memory for %d MAC'd receives", c->rank, max_recvs);
        c->mac_recvs = recvs;
        e = cudaMalloc((void **)&c->mac_bad, (size_t)max_recvs * sizeof(int));
        if (e == cudaSuccess) e = cudaMemset(c->mac_bad, 0, (size_t)max_recvs * sizeof(int));
        c->mac_cap = e == cudaSuccess ? max_recvs : 0;
    }
    uint8_t **bufs[2] = {&c->mac_scratch, &c->verify_scratch};
    size_t *have[2] = {&c->mac_scratch_bytes, &c->verify_scratch_bytes};
    for (int k = 0; k < 2 && e == cudaSuccess; k++) {
        if (*have[k] >= scratch) continue;
        cudaFree(*bufs[k]);
        *bufs[k] = NULL;
        *have[k] = 0;
        e = cudaMalloc((void **)bufs[k], scratch);
        if (e == cudaSuccess) *have[k] = scratch;
    }
    if (e != cudaSuccess)
        return errorf(err, errlen, "rank %d: reserving the MAC state (%d receives, %zu-byte messages): %s", c->rank,
                      max_recvs, max_bytes, cudaGetErrorString(e));
    return 0;
}

// nccl_mac_launch: the chunked MAC of one message: its tag into tag_out (a
// send, on c->stream), or its check against expected into *bad (a receive,
// on c->verify)
static inline void nccl_mac_launch(NcclComm *c, const uint8_t header[64], const void *payload, size_t bytes,
                                   uint8_t *tag_out, const uint8_t *expected, int *bad) {
    uint64_t chunk_bytes = nccl_mac_chunk_bytes(bytes);
    size_t need = (size_t)(32 * chunkmac_count(bytes, chunk_bytes));
    // tags on the main stream, checks on the verify stream: each its own scratch
    cudaStream_t st = expected != NULL ? c->verify : c->stream;
    uint8_t *scratch = expected != NULL ? c->verify_scratch : c->mac_scratch;
    size_t have = expected != NULL ? c->verify_scratch_bytes : c->mac_scratch_bytes;
    if (need > have)
        nccl_fail(c, "a %zu-byte message needs %zu bytes of MAC scratch, %zu were reserved (nccl_mac_reserve)", bytes,
                  need, have);
    char err[200];
    ChunkMacParams p;
    int rc = chunkmac_gpu_params(&p, &c->links.keyed, header, bytes, chunk_bytes, err, sizeof(err));
    if (rc == 0) rc = chunkmac_gpu_launch(&p, payload, scratch, tag_out, expected, bad, st, err, sizeof(err));
    secure_wipe(&p, sizeof(p));  // the key's ipad/opad states: key-equivalent; the launch took its copy
    if (rc != 0) nccl_fail(c, "%s", err);
}

// nccl_mac_slot: the flag of the step's next receive
static inline int nccl_mac_slot(NcclComm *c) {
    if (c->mac_nrecv == c->mac_cap)
        nccl_fail(c, "more than the %d MAC'd receives in one step that were reserved (nccl_mac_reserve)", c->mac_cap);
    return c->mac_nrecv++;
}

// nccl_sendrecv_mac: nccl_sendrecv (the same peers, -1 for none, and the
// same watchdog) of MAC'd messages. sendbuf holds send_bytes of payload and
// NCCL_MAC_BYTES of room after them, where the tag goes; recvbuf gets
// recv_bytes of payload and the sender's tag after them. Headers: this
// rank to dst_rank and src_rank to this rank, with the job id, c->step, the
// channel, the micro-batch, the length and the pair's next sequence number.
// tamper (on the faulting rank, at the faulting step) flips a payload byte of
// its first MAC'd send after the tag is made, and flips it back once sent;
// replay tags its first MAC'd send on a pair that has sent before under the
// previous sequence number (mac_send_header).
static inline void nccl_sendrecv_mac(NcclComm *c, int dst_rank, int send_channel, int send_mb, void *sendbuf,
                                     size_t send_bytes, int src_rank, int recv_channel, int recv_mb, void *recvbuf,
                                     size_t recv_bytes) {
    if (!nccl_peers_ok(c, dst_rank, src_rank)) {  // its one line, before a sequence number is touched
        nccl_sendrecv(c, dst_rank, send_channel, send_mb, sendbuf, send_bytes, src_rank, recv_channel, recv_mb, recvbuf,
                      recv_bytes);
        return;
    }
    uint8_t header[64];
    uint8_t *flip = NULL;
    if (dst_rank >= 0) {
        c->op = "send_mac";
        snprintf(c->what, sizeof(c->what), " to rank %d (%s, micro-batch %d)", dst_rank, channel_name(send_channel), send_mb);
        int faulting = !c->mac_fault_done && fault_fires(&c->fault, c->rank, c->step);
        int replay = faulting && c->fault.kind == FAULT_REPLAY;
        if (mac_send_header(&c->links, dst_rank, send_channel, c->step, send_mb, send_bytes, replay, header)) {
            c->mac_fault_done = 1;
            fprintf(stderr, "rank %d: fault replay: tagged the %s message of micro-batch %d to rank %d under the "
                    "previous sequence number (step %ld)\n", c->rank, channel_name(send_channel), send_mb, dst_rank, c->step);
        }
        uint8_t *buf = (uint8_t *)sendbuf;
        nccl_mac_launch(c, header, buf, send_bytes, buf + send_bytes, NULL, NULL);
        if (faulting && c->fault.kind == FAULT_TAMPER) {
            flip = buf + send_bytes / 2;  // the middle of the payload; with none, the tag's first byte
            nccl_mac_flip_kernel<<<1, 1, 0, c->stream>>>(flip);
            nccl_mac_check_cuda(c, cudaGetLastError(), "the tamper fault");
            c->mac_fault_done = 1;
            fprintf(stderr, "rank %d: fault tamper: flipped a bit of the MAC'd %s message of micro-batch %d to rank %d "
                    "(step %ld)\n", c->rank, channel_name(send_channel), send_mb, dst_rank, c->step);
        }
    }
    // the last check queued must have read its buffer before this receive may overwrite one
    if (src_rank >= 0) nccl_mac_check_cuda(c, cudaStreamWaitEvent(c->stream, c->verified, 0), "ordering the MAC checks");
    nccl_sendrecv(c, dst_rank, send_channel, send_mb, sendbuf, dst_rank >= 0 ? send_bytes + NCCL_MAC_BYTES : 0, src_rank,
                  recv_channel, recv_mb, recvbuf, src_rank >= 0 ? recv_bytes + NCCL_MAC_BYTES : 0);
    if (flip != NULL) {  // only the message in transit was changed, not this rank's own data
        nccl_mac_flip_kernel<<<1, 1, 0, c->stream>>>(flip);
        nccl_mac_check_cuda(c, cudaGetLastError(), "the tamper fault");
    }
    if (src_rank >= 0) {
        c->op = "recv_mac";
        snprintf(c->what, sizeof(c->what), " from rank %d (%s, micro-batch %d)", src_rank, channel_name(recv_channel),
                 recv_mb);
        int slot = nccl_mac_slot(c);
        NcclMacRecv *m = &c->mac_recvs[slot];
        m->src = src_rank;
        m->channel = recv_channel;
        m->microbatch = recv_mb;
        m->step = c->step;
        m->bytes = recv_bytes;
        mac_recv_header(&c->links, src_rank, recv_channel, c->step, recv_mb, recv_bytes, header);
        uint8_t *buf = (uint8_t *)recvbuf;
        nccl_mac_check_cuda(c, cudaEventRecord(c->received, c->stream), "ordering the MAC checks");
        nccl_mac_check_cuda(c, cudaStreamWaitEvent(c->verify, c->received, 0), "ordering the MAC checks");
        nccl_mac_launch(c, header, buf, recv_bytes, NULL, buf + recv_bytes, c->mac_bad + slot);  // on c->verify
        nccl_mac_check_cuda(c, cudaEventRecord(c->verified, c->verify), "ordering the MAC checks");
    }
}

// nccl_mac_step_begin: at the start of a step, before its first MAC'd receive
static inline void nccl_mac_step_begin(NcclComm *c) {
    c->op = "mac_step_begin";
    c->what[0] = '\0';
    c->mac_nrecv = 0;
    nccl_mac_check_cuda(c, cudaStreamWaitEvent(c->stream, c->verified, 0), "clearing the MAC flags");
    nccl_mac_check_cuda(c, cudaMemsetAsync(c->mac_bad, 0, (size_t)c->mac_cap * sizeof(int), c->stream), "clearing the MAC flags");
}

// nccl_mac_step_check: whether every MAC'd receive of the step verified; the
// caller calls it before the optimizer update and ends the job on -1, with
// err naming the first bad message (in the order received: after a replay
// every later message on that pair fails too, and the first is the replay).
static inline int nccl_mac_step_check(NcclComm *c, char *err, size_t errlen) {
    int n = c->mac_nrecv;
    if (n == 0) return 0;  // no pipeline messages (pp = 1): nothing to wait for
    int *flags = (int *)malloc((size_t)n * sizeof(int));
    if (flags == NULL)
        return errorf(err, errlen, "rank %d: nccl MAC check (step %ld): out of memory for %d flags", c->rank, c->step, n);
    // both streams under the watchdog: the main one may still hold calls that wait on peers
    nccl_sync(c, c->stream, "the step's MAC checks");
    nccl_sync(c, c->verify, "the step's MAC checks");
    cudaError_t e = cudaMemcpy(flags, c->mac_bad, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(flags);
        return errorf(err, errlen, "rank %d: nccl MAC check (step %ld): CUDA: %s", c->rank, c->step,
                      cudaGetErrorString(e));
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        if (flags[i] != 0) bad = i;
    }
    free(flags);
    if (bad < 0) return 0;
    const NcclMacRecv *m = &c->mac_recvs[bad];
    return errorf(err, errlen, "rank %d: the MAC of the %s message of micro-batch %d from rank %d (%zu bytes, step %ld) "
                  "does not verify: the message was changed, replayed or misrouted", c->rank,
                  channel_name(m->channel), m->microbatch, m->src, m->bytes, m->step);
}

// nccl_free: finalizes every communicator (flushing what is queued) within
// the timeout, else aborts them
static inline void nccl_free(NcclComm *c) {
    if (c == NULL) return;
    c->op = "free";
    c->what[0] = '\0';
    NcclGroup *gs[5] = {&c->dp_side, &c->dp, &c->tp, &c->pp, &c->world};
    double deadline = par_now() + c->timeout_s;
    int ok = 1;
    for (int i = 0; i < 5 && ok; i++) {
        ncclResult_t r = ncclCommFinalize(gs[i]->comm);
        if (r == ncclSuccess || r == ncclInProgress) r = nccl_settle(gs[i]->comm, deadline);
        ok = r == ncclSuccess;
    }
    if (ok) {
        for (int i = 0; i < 5; i++) ncclCommDestroy(gs[i]->comm);
    } else {
        fprintf(stderr, "rank %d: nccl free: the communicators did not finalize within %.1f s; aborting them\n", c->rank,
                c->timeout_s);
        nccl_abort_all(c);
    }
    cudaFree(c->one);
    cudaFree(c->mac_scratch);
    cudaFree(c->verify_scratch);
    cudaStreamDestroy(c->verify);
    cudaEventDestroy(c->received);
    cudaEventDestroy(c->verified);
    cudaFree(c->mac_bad);
    cudaEventDestroy(c->side_follow);
    cudaStreamDestroy(c->side);
    free(c->mac_recvs);
    links_free(&c->links);  // wipes the key and its HMAC state
    free(c);
}
#endif  // LLM3D_NCCL

#endif
