/*
 * test_host_mode.cu: nccl_comm.h's host mode run without a GPU: the GPU
 * trainer's communication calls (nccl_allreduce, nccl_sendrecv_mac, ...)
 * for ranks that share a GPU, which go through the host backend, staged
 * through pinned buffers.
 *
 * A stand-in CUDA runtime, defined here, keeps "device" memory in host
 * memory and holds every asynchronous copy and memset in its stream's queue
 * until something waits for that stream (or an event recorded on it). So a
 * host-mode call that read its staging before waiting for the copy down,
 * or returned before its copy up had landed, would see stale bytes and fail
 * a check; a copy with its direction swapped is counted as an error too.
 * What it cannot show is the GPU's own behaviour: real kernels, real
 * streams running side by side, pinned memory's speed.
 *
 * Ranks are real processes started by launcher.h's launcher, as the
 * trainer's are: `child coll` runs every collective on fp32, bf16 and bytes
 * in a dp 2 x tp 2 grid against the sums expected (with -sp 1's reduce-scatter
 * and in-place all-gather of blocks of rows), the overlapped calls and
 * the MAC'd messages; `child pipe` sends a pipeline message a step under
 * each of the four faults. Built with nvcc -cudart shared (make
 * dev/test/test_host_mode), so that the stand-ins here take the place of
 * libcudart's functions of the same names.
 */
#define LLM3D_NCCL
#include "llm3d/parallel/nccl_comm.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "dev/test/test_child.h"

// ----------------------------------------------------------------------------
// the stand-in CUDA runtime (host code only: the device pass has its own)
#ifndef __CUDA_ARCH__

#define FAKE_QUEUE 256
#define FAKE_BLOCKS 256

typedef struct { uint8_t *dst; const uint8_t *src; size_t bytes; int value; } FakeOp;  // src NULL: a memset
typedef struct { FakeOp ops[FAKE_QUEUE]; int n; } FakeStream;
typedef struct { FakeStream *recorded_on; } FakeEvent;
typedef struct { uint8_t *p; size_t bytes; int pinned; } FakeBlock;

static FakeStream fake_legacy;                 // stream 0
static FakeStream *fake_streams[32];
static int fake_nstreams;
static FakeBlock fake_blocks[FAKE_BLOCKS];     // what cudaMalloc and cudaHostAlloc handed out
static int fake_errors;                        // copies in the wrong direction, unknown buffers

static FakeStream *fake_stream(cudaStream_t s) { return s == NULL ? &fake_legacy : (FakeStream *)s; }

// fake_run: the GPU catches up with stream s
static void fake_run(FakeStream *s) {
    for (int i = 0; i < s->n; i++) {
        FakeOp *op = &s->ops[i];
        if (op->src != NULL) memmove(op->dst, op->src, op->bytes);
        else memset(op->dst, op->value, op->bytes);
    }
    s->n = 0;
}

static void fake_run_all(void) {
    fake_run(&fake_legacy);
    for (int i = 0; i < fake_nstreams; i++) fake_run(fake_streams[i]);
}

static void fake_queue(cudaStream_t st, void *dst, const void *src, size_t bytes, int value) {
    FakeStream *s = fake_stream(st);
    if (s->n == FAKE_QUEUE) fake_run(s);  // a GPU may finish early; never late
    FakeOp op = {(uint8_t *)dst, (const uint8_t *)src, bytes, value};
    s->ops[s->n++] = op;
}

// fake_kind: 1 for memory of cudaHostAlloc, 0 of cudaMalloc, -1 neither
static int fake_kind(const void *p, size_t bytes) {
    const uint8_t *q = (const uint8_t *)p;
    for (int i = 0; i < FAKE_BLOCKS; i++) {
        FakeBlock *b = &fake_blocks[i];
        if (b->p != NULL && q >= b->p && q + bytes <= b->p + b->bytes) return b->pinned;
    }
    return -1;
}

static cudaError_t fake_alloc(void **p, size_t bytes, int pinned) {
    for (int i = 0; i < FAKE_BLOCKS; i++) {
        if (fake_blocks[i].p != NULL) continue;
        fake_blocks[i].p = (uint8_t *)calloc(bytes > 0 ? bytes : 1, 1);
        fake_blocks[i].bytes = bytes;
        fake_blocks[i].pinned = pinned;
        *p = fake_blocks[i].p;
        return *p != NULL ? cudaSuccess : cudaErrorMemoryAllocation;
    }
    return cudaErrorMemoryAllocation;
}

static cudaError_t fake_release(void *p) {
    fake_run_all();  // freeing waits for the device, as the real calls do
    for (int i = 0; i < FAKE_BLOCKS && p != NULL; i++) {
        if (fake_blocks[i].p != (uint8_t *)p) continue;
        free(p);
        fake_blocks[i].p = NULL;
        return cudaSuccess;
    }
    return p == NULL ? cudaSuccess : cudaErrorInvalidValue;
}

extern "C" {
cudaError_t cudaMalloc(void **p, size_t bytes) { return fake_alloc(p, bytes, 0); }
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) { (void)flags; return fake_alloc(p, bytes, 1); }
cudaError_t cudaFree(void *p) { return fake_release(p); }
cudaError_t cudaFreeHost(void *p) { return fake_release(p); }

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t st) {
    int want_dst = kind == cudaMemcpyDeviceToHost ? 1 : 0, want_src = kind == cudaMemcpyHostToDevice ? 1 : 0;
    if (bytes > 0 && (fake_kind(dst, bytes) != want_dst || fake_kind(src, bytes) != want_src)) {
        fprintf(stderr, "stand-in CUDA: a %zu-byte copy of kind %d between buffers of kinds %d <- %d\n", bytes, (int)kind,
                fake_kind(dst, bytes), fake_kind(src, bytes));
        fake_errors++;
    }
    fake_queue(st, dst, src, bytes, 0);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    (void)kind;
    fake_run_all();
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st) {
    fake_queue(st, p, NULL, bytes, value);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes) {
    fake_run_all();
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned int flags) {
    (void)flags;
    if (fake_nstreams == 32) return cudaErrorMemoryAllocation;
    FakeStream *s = (FakeStream *)calloc(1, sizeof(FakeStream));
    fake_streams[fake_nstreams++] = s;
    *st = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *st) { return cudaStreamCreateWithFlags(st, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t st) {
    fake_run(fake_stream(st));
    return cudaSuccess;  // kept allocated: fake_run_all may still walk it
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    if (st == NULL) fake_run_all();  // the legacy stream waits for the others
    else fake_run(fake_stream(st));
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t st) { return cudaStreamSynchronize(st); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags) {
    (void)flags;
    *ev = (cudaEvent_t)calloc(1, sizeof(FakeEvent));
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    free(ev);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st) {
    ((FakeEvent *)ev)->recorded_on = fake_stream(st);
    return cudaSuccess;
}

// waiting on an event: its stream catches up now (earlier than a GPU must, never later)
static cudaError_t fake_event_done(cudaEvent_t ev) {
    FakeStream *s = ((FakeEvent *)ev)->recorded_on;
    if (s != NULL) fake_run(s);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) { return fake_event_done(ev); }
cudaError_t cudaEventSynchronize(cudaEvent_t ev) { return fake_event_done(ev); }

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned int flags) {
    (void)st;
    (void)flags;
    return fake_event_done(ev);
}

cudaError_t cudaDeviceSynchronize(void) {
    fake_run_all();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "stand-in CUDA error"; }
}  // extern "C"

// ----------------------------------------------------------------------------
// the ranks

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cudaMalloc(&p, bytes);
    return p;
}

static uint16_t bf(float x) { return float_to_bf16(x); }

// every collective of the trainer, in a dp 2 x tp 2 grid, against the sums
// expected; device buffers are read right after each call returns, as a
// kernel queued next would read them
static void run_collectives(NcclComm *c, const Grid *g) {
    int r = g->rank, world = g->world;
    const Group *dp = &c->dp.group, *tp = &c->tp.group;

    size_t n = 1000;
    float *f = (float *)dev_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)(r * 1000 + (int)i);
    nccl_allreduce(c, &c->world, f, n, ncclFloat32, OP_SUM);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= f[i] == (float)(1000 * (world * (world - 1) / 2) + world * (int)i);
    test_rank_check(r, "allreduce_fp32", ok, "");

    // bf16: 1, 2^-8, 2^-8, 0 summed in fp32 and rounded once: 1 + 2^-7
    uint16_t *h = (uint16_t *)dev_alloc(8 * sizeof(uint16_t));
    uint16_t mine = r == 0 ? bf(1.0f) : r < 3 ? bf(1.0f / 256) : bf(0.0f);
    for (int i = 0; i < 8; i++) h[i] = mine;
    nccl_allreduce(c, &c->world, h, 8, ncclBfloat16, OP_SUM);
    ok = 1;
    for (int i = 0; i < 8; i++) ok &= h[i] == 0x3F81;
    test_rank_check(r, "allreduce_bf16_one_rounding", ok, "");
    for (int i = 0; i < 8; i++) h[i] = bf((float)r);
    nccl_allreduce(c, &c->world, h, 8, ncclBfloat16, OP_AVG);
    ok = 1;
    for (int i = 0; i < 8; i++) ok &= h[i] == bf(1.5f);
    test_rank_check(r, "allreduce_bf16_avg", ok, "");

    // reduce-scatter over dp, fp32, out of place and in place
    size_t m = 300;
    float *in = (float *)dev_alloc(2 * m * sizeof(float)), *out = (float *)dev_alloc(m * sizeof(float));
    for (size_t i = 0; i < 2 * m; i++) in[i] = (float)(r + (int)i);
    nccl_reduce_scatter(c, &c->dp, in, out, m, ncclFloat32, OP_SUM);
    ok = 1;
    for (size_t i = 0; i < m; i++) ok &= out[i] == (float)(dp->ranks[0] + dp->ranks[1] + 2 * (int)(dp->me * m + i));
    test_rank_check(r, "reduce_scatter_fp32", ok, "");
    for (size_t i = 0; i < 2 * m; i++) in[i] = (float)(r + (int)i);
    nccl_reduce_scatter(c, &c->dp, in, in + dp->me * m, m, ncclFloat32, OP_SUM);
    ok = 1;
    for (size_t i = 0; i < m; i++) ok &= in[dp->me * m + i] == out[i];
    test_rank_check(r, "reduce_scatter_fp32_in_place", ok, "");

    // reduce-scatter over tp, bf16 (small integers: exact)
    uint16_t *hin = (uint16_t *)dev_alloc(2 * 16 * sizeof(uint16_t)), *hout = (uint16_t *)dev_alloc(16 * sizeof(uint16_t));
    for (int i = 0; i < 32; i++) hin[i] = bf((float)(r + i));
    nccl_reduce_scatter(c, &c->tp, hin, hout, 16, ncclBfloat16, OP_SUM);
    ok = 1;
    for (int i = 0; i < 16; i++) ok &= hout[i] == bf((float)(tp->ranks[0] + tp->ranks[1] + 2 * (tp->me * 16 + i)));
    test_rank_check(r, "reduce_scatter_bf16", ok, "");

    // all-gather of 3 bf16 per rank (6 bytes: pieces padded in the staging), in place
    uint16_t *gath = (uint16_t *)dev_alloc((size_t)world * 3 * sizeof(uint16_t));
    for (int i = 0; i < 3; i++) gath[r * 3 + i] = bf((float)(r * 10 + i));
    nccl_allgather(c, &c->world, gath + r * 3, gath, 3, ncclBfloat16);
    ok = 1;
    for (int k = 0; k < world; k++)
        for (int i = 0; i < 3; i++) ok &= gath[k * 3 + i] == bf((float)(k * 10 + i));
    test_rank_check(r, "allgather_bf16_odd", ok, "");

    // all-gather of 5 bytes per rank over tp (the consistency check's digests are bytes)
    uint8_t *bin = (uint8_t *)dev_alloc(5), *bout = (uint8_t *)dev_alloc(10);
    for (int i = 0; i < 5; i++) bin[i] = (uint8_t)(r * 16 + i);
    nccl_allgather(c, &c->tp, bin, bout, 5, ncclUint8);
    ok = 1;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++) ok &= bout[k * 5 + i] == (uint8_t)(tp->ranks[k] * 16 + i);
    test_rank_check(r, "allgather_bytes", ok, "");

    // -sp 1's pair on the tp group, as train_gpt2.cu's sp_reduce_scatter and
    // sp_gather make them: each rank's partial sums of B*T = 6 rows of C = 8
    // bf16, reduce-scattered out of place into its own block of R = 3 rows,
    // then those rows all-gathered in place (mine = whole + me * R * C, as
    // the final LayerNorm's output is): every rank ends with the sums of all
    // the rows, block k from tp member k
    enum { SP_ROWS = 6, SP_C = 8, SP_R = SP_ROWS / 2 };
    uint16_t *partial = (uint16_t *)dev_alloc(SP_ROWS * SP_C * sizeof(uint16_t));
    uint16_t *whole = (uint16_t *)dev_alloc(SP_ROWS * SP_C * sizeof(uint16_t)), *rows = whole + tp->me * SP_R * SP_C;
    for (int i = 0; i < SP_ROWS * SP_C; i++) partial[i] = bf((float)((r * 3 + i) % 16));
    memset(whole, 0, SP_ROWS * SP_C * sizeof(uint16_t));
    nccl_reduce_scatter(c, &c->tp, partial, rows, SP_R * SP_C, ncclBfloat16, OP_SUM);
    ok = 1;
    for (int i = 0; i < SP_R * SP_C; i++) {
        int at = tp->me * SP_R * SP_C + i;
        ok &= rows[i] == bf((float)((tp->ranks[0] * 3 + at) % 16 + (tp->ranks[1] * 3 + at) % 16));
    }
    nccl_allgather(c, &c->tp, rows, whole, SP_R * SP_C, ncclBfloat16);
    for (int i = 0; i < SP_ROWS * SP_C; i++)
        ok &= whole[i] == bf((float)((tp->ranks[0] * 3 + i) % 16 + (tp->ranks[1] * 3 + i) % 16));
    test_rank_check(r, "sp_rows_bf16", ok, "");

    // broadcast from tp member 1
    float *bc = (float *)dev_alloc(50 * sizeof(float));
    for (int i = 0; i < 50; i++) bc[i] = (float)(r * 7 + i);
    nccl_broadcast(c, &c->tp, bc, 50, ncclFloat32, 1);
    ok = 1;
    for (int i = 0; i < 50; i++) ok &= bc[i] == (float)(tp->ranks[1] * 7 + i);
    test_rank_check(r, "broadcast", ok, "");

    nccl_barrier(c, &c->world);
    test_rank_check(r, "barrier", 1, "");

    // the overlapped calls: done when they return; the drain waits for c->side
    for (int i = 0; i < 8; i++) h[i] = bf((float)(r + i));
    nccl_side_allreduce(c, h, 8, ncclBfloat16, OP_SUM);
    ok = 1;
    for (int i = 0; i < 8; i++) ok &= h[i] == bf((float)(dp->ranks[0] + dp->ranks[1] + 2 * i));
    // an earlier kernel on c->side still writing the buffer the call fills
    // must be done first; one queued there after the call, before the drain
    for (size_t i = 0; i < 2 * m; i++) in[i] = (float)(r + (int)i);
    cudaMemsetAsync(out, 0x7f, m * sizeof(float), c->side);
    nccl_side_reduce_scatter(c, in, out, m, ncclFloat32, OP_SUM);
    cudaMemsetAsync(bc, 0, 50 * sizeof(float), c->side);
    nccl_side_drain(c);
    for (size_t i = 0; i < m; i++) ok &= out[i] == (float)(dp->ranks[0] + dp->ranks[1] + 2 * (int)(dp->me * m + i));
    for (int i = 0; i < 50; i++) ok &= bc[i] == 0.0f;
    test_rank_check(r, "side_calls", ok && c->side_pending == 0, "");

    // MAC'd messages around the world's ring, with the tag room the trainer leaves
    size_t bytes = 1000;
    uint8_t *sbuf = (uint8_t *)dev_alloc(bytes + NCCL_MAC_BYTES), *rbuf = (uint8_t *)dev_alloc(bytes + NCCL_MAC_BYTES);
    for (size_t i = 0; i < bytes; i++) sbuf[i] = (uint8_t)(r * 31 + i);
    int next = (r + 1) % world, prev = (r + world - 1) % world;
    nccl_mac_step_begin(c);
    nccl_sendrecv_mac(c, next, CH_ACTIVATION, 0, sbuf, bytes, prev, CH_ACTIVATION, 0, rbuf, bytes);
    ok = 1;
    for (size_t i = 0; i < bytes; i++) ok &= rbuf[i] == (uint8_t)(prev * 31 + i);
    char err[256];
    test_rank_check(r, "sendrecv_mac", ok && nccl_mac_step_check(c, err, sizeof(err)) == 0, "");

    // one-sided messages: 0 -> 1 and 2 -> 3
    memset(rbuf, 0, bytes);
    if (r % 2 == 0) nccl_send(c, r + 1, CH_GRADIENT, 1, sbuf, bytes);
    else nccl_recv(c, r - 1, CH_GRADIENT, 1, rbuf, bytes);
    ok = 1;
    for (size_t i = 0; i < bytes && r % 2 == 1; i++) ok &= rbuf[i] == (uint8_t)((r - 1) * 31 + i);
    test_rank_check(r, "send_recv", ok, "");
    test_rank_check(r, "staging_copies", fake_errors == 0, "");
}

// a pipeline message from rank 0 to rank 1 and a loss all-reduce, a step at a time
static void run_pipe(NcclComm *c, const Grid *g) {
    int r = g->rank;
    size_t bytes = 4096;
    uint8_t *buf = (uint8_t *)dev_alloc(bytes + NCCL_MAC_BYTES);
    float *loss = (float *)dev_alloc(sizeof(float));
    for (long step = 0; step < 6; step++) {
        nccl_set_step(c, step);
        nccl_mac_step_begin(c);
        for (size_t i = 0; i < bytes; i++) buf[i] = (uint8_t)(step + i);
        if (r == 0) nccl_sendrecv_mac(c, 1, CH_ACTIVATION, 0, buf, bytes, -1, CH_ACTIVATION, 0, NULL, 0);
        else nccl_sendrecv_mac(c, -1, CH_ACTIVATION, 0, NULL, 0, 0, CH_ACTIVATION, 0, buf, bytes);
        *loss = 1.0f;
        nccl_allreduce(c, &c->world, loss, 1, ncclFloat32, OP_SUM);
        int ok = *loss == 2.0f;
        for (size_t i = 0; i < bytes; i++) ok &= buf[i] == (uint8_t)(step + i);
        char name[32];
        snprintf(name, sizeof(name), "step_%ld", step);
        test_rank_check(r, name, ok, "");
    }
}

// a rank: child MODE -np N -to S [-fault KIND:RANK:STEP], started by the launcher
static int child_main(int argc, char **argv) {
    TestChild a;
    Fault fault;
    if (test_child_start(&a, &fault, argc, argv, 10.0) != 0) return 2;
    const char *mode = a.mode;
    char err[512];
    Launch L;
    Grid g;
    int tp = strcmp(mode, "coll") == 0 ? 2 : 1, pp = strcmp(mode, "pipe") == 0 ? 2 : 1;
    int rc = parallel_join(argc, argv, a.np, tp, pp, NULL, NULL, NULL, a.to, &L, &g, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    NcclComm *c;
    if (nccl_init(&c, &g, L.key, L.rendezvous, a.to, &fault, 1, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", g.rank, err);
        return 1;
    }
    cudaStreamCreate(&c->stream);  // as the trainer hands over the model's stream
    test_rank_check(g.rank, "host_mode", c->host != NULL && c->world.comm == NULL && c->fault.kind == FAULT_NONE, "");
    if (strcmp(mode, "coll") == 0) run_collectives(c, &g);
    else run_pipe(c, &g);
    nccl_free(c);
    launch_free(&L);
    return test_rank_failures > 0 ? 1 : 0;
}

// ----------------------------------------------------------------------------
// the test side

static char self_exe[4096];

typedef struct { int status; char out[65536]; } Job;

// run_job: ./test_host_mode child MODE -np N -to S [-fault F], stdout and stderr together
static void run_job(Job *j, const char *mode, int np, const char *to, const char *fault) {
    char cmd[5000];
    snprintf(cmd, sizeof(cmd), "timeout 60 %s child %s -np %d -to %s %s %s", self_exe, mode, np, to,
             fault != NULL ? "-fault" : "", fault != NULL ? fault : "");
    j->status = test_run(cmd, 1, j->out, sizeof(j->out));
}

static void test_collectives(void) {
    static Job j;
    run_job(&j, "coll", 4, "10", NULL);
    const char *names[] = {"host_mode", "allreduce_fp32", "allreduce_bf16_one_rounding", "allreduce_bf16_avg",
                           "reduce_scatter_fp32", "reduce_scatter_fp32_in_place", "reduce_scatter_bf16",
                           "allgather_bf16_odd", "allgather_bytes", "sp_rows_bf16", "broadcast", "barrier", "side_calls",
                           "sendrecv_mac", "send_recv", "staging_copies"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        int ranks = 0;
        for (int r = 0; r < 4; r++) ranks += test_rank_ok(j.out, r, names[k]);
        check(ranks == 4, "host mode, dp 2 x tp 2: %s on %d of 4 ranks", names[k], ranks);
    }
    int bytes_lines = 0;
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof(want), "rank %d bytes sent: allreduce ", r);
        bytes_lines += strstr(j.out, want) != NULL;
    }
    check(j.status == 0 && bytes_lines == 4 && strstr(j.out, "host mode: the 4 ranks talk through the host backend"),
          "host mode: the job ends with exit %d, rank 0's host-mode line and %d of 4 bytes-sent lines", j.status,
          bytes_lines);
    if (j.status != 0) printf("%s\n", j.out);
}

// the faults end the job as in the CPU trainer (test_layouts' test_faults):
// steps 0-2 complete, step 3 does not, the line names the message or the rank
static void test_faults(void) {
    static Job j;
    run_job(&j, "pipe", 2, "2", NULL);
    check(j.status == 0 && test_rank_ok(j.out, 1, "step_5"), "host mode, pipeline of 2: 6 steps without a fault (exit %d)",
          j.status);
    const char *cases[][3] = {
        {"tamper:0:3", "from rank 0, channel activation, step 3", "tamper"},
        {"replay:0:3", "from rank 0, channel activation, step 3", "replay"},
        {"kill:1:3", "rank 1: fault kill at step 3 (recv)", "kill"},
        {"stall:1:3", "waiting for rank 1", "stall"},
    };
    for (int i = 0; i < 4; i++) {
        run_job(&j, "pipe", 2, "2", cases[i][0]);
        int ok = j.status != 0 && test_rank_ok(j.out, 1, "step_2") && !test_rank_ok(j.out, 1, "step_3") &&
                 strstr(j.out, cases[i][1]) != NULL && strstr(j.out, "(nccl ") == NULL;
        check(ok, "host mode, %s: the job ends (exit %d) after step 2, naming '%s', the fault acting once", cases[i][2],
              j.status, cases[i][1]);
        if (!ok) printf("%s\n", j.out);
    }
}

// the checked collectives' hooks wait for the GPU inside a call (the first
// checked call's coefficients, a record grown, the fault's flip) through
// nccl_sync, which names itself the call in progress: the call's name must
// come back, or its record, the fault's line and the watchdog's last call
// say "sync". One communicator over NCCL (no host backend), no peers: only
// the hooks' buffers and waits, which the stand-in runtime runs.
static void test_check_waits(void) {
    static NcclComm c;
    memset(&c, 0, sizeof(c));
    c.timeout_s = 5.0;
    cudaStreamCreate(&c.stream);
    cudaStreamCreate(&c.side);
    c.dp.name = "dp";
    nccl_enter(&c, "reduce_scatter", &c.dp);
    size_t off = nchk_coef_take(&c, 1000);  // the first: waits, then allocates
    int kept = strcmp(c.op, "reduce_scatter") == 0 && strcmp(c.what, " on the dp group") == 0;
    size_t at = 0;
    for (int r = 0; r < 257; r++) at = nchk_record(&c, 1, 2, c.stream);  // grows at 0 and 256: waits twice
    kept = kept && strcmp(c.op, "reduce_scatter") == 0 && strcmp(c.what, " on the dp group") == 0;
    check(kept && off == 0 && at == 256 && c.chk.rec_cap[1] == 512 && c.chk.coef_cap >= 1000,
          "the checks' waits inside a call (coefficients, records grown twice): the call is still named '%s%s'", c.op,
          c.what);
    nchk_free(&c);
    cudaStreamDestroy(c.stream);
    cudaStreamDestroy(c.side);
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "child") == 0) return child_main(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_self_exe(self_exe, sizeof(self_exe), argv[0]);
    test_check_waits();
    test_collectives();
    test_faults();
    return test_summary();
}
#endif  // __CUDA_ARCH__
