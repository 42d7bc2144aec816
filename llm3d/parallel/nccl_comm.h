/*
 * nccl_comm.h: the GPU trainer's side of the communicator.
 *
 * defines:
 *   pure C, compiled everywhere so the CPU tests check the decisions the CUDA
 *   build makes:
 *     gpu_host_mode        NCCL, or the host backend for ranks that share a GPU
 *     gpu_for_rank, gpu_own_visible
 *                          which GPU a rank binds to
 *     GPU_HB_NCCL_SHARED, gpu_hostid_check, gpu_nccl_hostid
 *                          -hb 2: NCCL even where ranks share a GPU, each
 *                          rank an NCCL node of its own (NCCL_HOSTID)
 *     nccl_board_map, nccl_board_enter, nccl_board_wait, nccl_blame
 *                          each rank's last NCCL call in the job's segment,
 *                          so a watchdog that times out names the rank
 *     nccl_mac_chunk_bytes, mac_send_header, mac_recv_header
 *                          the headers of the MAC'd point-to-point messages
 *     mac_unread_hit       whether a write lands where a check may still read
 *   in CUDA builds only (-DLLM3D_NCCL), the backend:
 *     NcclComm, nccl_init, nccl_free
 *     nccl_allreduce, nccl_reduce_scatter, nccl_allgather, nccl_broadcast,
 *     nccl_barrier         the collectives on device buffers
 *     nccl_side_*          the overlapped gradient reductions
 *     nccl_main_waits      the main stream waits for one of them, timed as a
 *                          wait for the watch report
 *     nccl_sendrecv, nccl_send, nccl_recv
 *                          the point-to-point calls
 *     nccl_sendrecv_mac, nccl_mac_step_check
 *                          the MAC'd messages checked on the GPU
 *     nccl_mac_before_write
 *                          a write into a received buffer, after its check
 *     nccl_sync, nccl_sync_event
 *                          the watchdog, where the host waits
 *     nccl_watch, nccl_wait_ms
 *                          the wait clock of the watch report
 *     nccl_set_check, nccl_set_label, nccl_count_grads, nccl_grad_sumsq_slots,
 *     nccl_check_point, nccl_check_counts
 *                          checked collectives (-ic 1, nccl_check.h): on or
 *                          off (host mode: the host backend's); what the next
 *                          collective carries; this rank's gradients counted
 *                          for the -gp rule and their sum of squares; the
 *                          step's records gathered and judged; how many were
 *     NchkCall, NchkState  the checks' state; the hooks around each
 *                          collective (nchk_before, nchk_after; -fault corrupt
 *                          and poison act there too) and all of the above but
 *                          nccl_check_point and nccl_check_counts are in
 *                          nccl_check_hooks.h
 *   and includes its host mode (host_mode.h), where the same calls go
 *   through shm_comm.h's host backend, staged through pinned buffers, and
 *   nccl_check_hooks.h.
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
#include "llm3d/secure/chunkmac.h"  // the MAC of large pipeline messages
#include "llm3d/secure/fault.h"     // Fault, fault_fires, links_rewind_send
#include "llm3d/parallel/grid.h"
#include "llm3d/parallel/launcher.h"    // Launch
#include "llm3d/parallel/rendezvous.h"  // rdv_join, par_now, COMM_BLOB_BYTES
#include "llm3d/parallel/shm_comm.h"  // OP_SUM, OP_AVG, comm_init_check; the host backend of host mode
#include "llm3d/parallel/nccl_check.h"  // checked collectives over NCCL: records, verdicts, kernels

// ----------------------------------------------------------------------------
// the GPU trainer's side: one GPU per rank, or ranks that share GPUs.
// Pure C, so the CPU tests check the decisions the CUDA build makes.

// gpu_host_mode: whether the job's ranks talk through the host backend
// (host mode: shared memory, one box) instead of NCCL. Always when asked
// (-hb 1); else when the ranks our own launcher started outnumber the GPUs:
// NCCL refuses two ranks on one device. Those ranks all run on this node
// and see the same GPUs, so every rank decides alike. Ranks of an outside
// launcher may span nodes, which the host backend cannot reach, so they
// share GPUs only when asked.
// asked is -hb: 1 asks for host mode, GPU_HB_NCCL_SHARED (2) for NCCL even
// where ranks share a GPU (below), 0 leaves it to the rule above.
#define GPU_HB_NCCL_SHARED 2

static inline int gpu_host_mode(int asked, int our_launcher, int world, int ndevices) {
    if (asked == 1) return 1;
    if (asked == GPU_HB_NCCL_SHARED) return 0;
    return our_launcher && ndevices >= 1 && world > ndevices;
}

// gpu_for_rank: the device a rank binds to, or -1 with err set when the node
// has no GPU for it. Rank i of a node takes GPU i; when the ranks share GPUs
// (host mode), GPU i % ndevices, so 8 ranks on one GPU all take device 0.
// own_gpu: an outside launcher gave each task its own GPU and made it the
// only one it sees (srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per
// task): device 0.
static inline int gpu_for_rank(int local_rank, int ndevices, int own_gpu, int shared, char *err, size_t errlen) {
    if (ndevices < 1)
        return errorf(err, errlen, "local rank %d: no CUDA device on this node", local_rank);
    if (own_gpu && ndevices == 1) return 0;
    if (local_rank < 0) return errorf(err, errlen, "local rank %d: a local rank is never negative", local_rank);
    if (shared) return local_rank % ndevices;
    if (local_rank >= ndevices)
        return errorf(err, errlen, "local rank %d has no GPU of its own: this node has %d (one rank per GPU; "
                      "-hb 1 lets ranks share GPUs through the host backend, -hb 2 over NCCL, to verify it)",
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
// -hb 2: NCCL even where ranks share a GPU. It is there to run the NCCL path
// of every layout on fewer GPUs than ranks (one, in the device check), to
// verify it, not for speed. NCCL refuses two ranks on one device ("Duplicate
// GPU detected") only when they also share a host hash, and it takes that
// hash from the environment variable NCCL_HOSTID when it is set, once per
// process, at its first call that needs it. So each rank sets one of its own
// before NCCL starts (nccl_join): NCCL then sees every rank as a node of its
// own with one GPU, and connects them through its network transport
// (sockets over loopback, or InfiniBand's), never shared memory or P2P: real
// NCCL, milliseconds a call. doc/gpu.md, "NCCL where ranks share a GPU".

// gpu_hostid_check: 0 when -hb (hb) can have its way here, else -1 with err
// set. env is NCCL_HOSTID's value (NULL: unset). -hb 2 sets NCCL_HOSTID in
// every rank, so one the user set already (even empty: NCCL takes "" as
// the host's name) is refused rather than silently replaced.
static inline int gpu_hostid_check(int hb, const char *env, char *err, size_t errlen) {
    if (hb != GPU_HB_NCCL_SHARED || env == NULL) return 0;
    return errorf(err, errlen, "flag -hb 2: NCCL_HOSTID is set in the environment ('%.40s'); -hb 2 gives each rank its "
                  "own, to make NCCL treat it as a node of its own: unset NCCL_HOSTID", env);
}

// gpu_nccl_hostid: rank's NCCL_HOSTID under -hb 2, "llm3d-<job id>-rank<r>":
// one per rank of the job, whatever node or GPU it is on, and naming the job
// where NCCL logs it (NCCL_DEBUG=INFO). The job id is secure.h's
// job_id_from_key, which every frame header carries in the clear.
static inline void gpu_nccl_hostid(uint64_t job_id, int rank, char *out, size_t outlen) {
    snprintf(out, outlen, "llm3d-%016" PRIx64 "-rank%d", job_id, rank);
}

// ----------------------------------------------------------------------------
// the board: the NCCL watchdog's view of the job's other ranks. A rank whose
// host has waited -to seconds for its GPU (nccl_sync_until) knows that some
// peer is missing from an NCCL call, not which one: NCCL does not say. So in
// NCCL mode every rank keeps, in its ShmRank block of the job's shared-memory
// segment (rendezvous.h: the one host mode runs its rings in), the last NCCL
// call it entered and its step (nccl_board_enter), and whether its host is
// waiting for its GPU (nccl_board_wait). A rank that stopped calling NCCL
// (a stall, a hang, a rank still computing) is then the one not waiting,
// and the watchdog's line names it (nccl_blame), as host mode's names the
// rank it waits for. Only the header and the rank blocks are mapped, not the
// rings. A rank on another node cannot open the segment: it has no board
// (NULL) and blames nobody, and nobody sees it.

#define NCCL_BOARD_AT_SYNC (-2)   // ShmRank.waiting_for while the rank's host waits for its GPU
#define NCCL_BLAME_MAX 3          // ranks named in one line

static inline ShmRank *nccl_board_block(uint8_t *board, int r) {
    return (ShmRank *)(board + SHM_HEADER_BYTES + (size_t)r * SHM_RANK_BYTES);
}

// nccl_board_map: the header and rank blocks of the segment shm_name of this
// job (world ranks, job_id), with rank me's block filled in and counted as
// mapped (the last rank to map it unlinks the name, as comm_init does);
// NULL when it cannot be opened or is not this job's. *bytes: the length
// mapped, for munmap.
static inline uint8_t *nccl_board_map(const char *shm_name, int world, int me, uint64_t job_id, size_t *bytes) {
    ShmLayout lay = shm_layout(world);
    int fd = shm_open(shm_name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return NULL;
    struct stat st;
    void *base = fstat(fd, &st) == 0 && (uint64_t)st.st_size == lay.total_bytes
                     ? mmap(NULL, lay.rings_offset, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED) return NULL;
    ShmHeader *h = (ShmHeader *)base;
    if (memcmp(h->magic, SHM_MAGIC, 8) != 0 || h->version != SHM_VERSION || h->world != (uint32_t)world ||
        h->job_id != job_id || h->rings_offset != lay.rings_offset || me < 0 || me >= world) {
        munmap(base, lay.rings_offset);
        return NULL;
    }
    ShmRank *mine = nccl_board_block((uint8_t *)base, me);
    mine->nccl_last[0] = '\0';
    __atomic_store_n(&mine->waiting_for, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&mine->pid, (uint32_t)getpid(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&mine->pid_ns, par_pid_ns(), __ATOMIC_SEQ_CST);
    if (__atomic_fetch_add(&h->mapped, 1, __ATOMIC_SEQ_CST) + 1 == (uint32_t)world) shm_unlink(shm_name);
    *bytes = lay.rings_offset;
    return (uint8_t *)base;
}

// the groups a call can be on, by name, as the board keeps them (wait_op): 0 for none (point to point)
static const char *const nccl_board_groups[] = {"", "world", "dp", "tp", "pp", "dp (overlapped)"};
#define NCCL_BOARD_NGROUPS ((int)(sizeof(nccl_board_groups) / sizeof(nccl_board_groups[0])))

// nccl_board_enter: rank me entered an NCCL call, op, on the group named
// group (NULL: point to point), at step. A hint read by other processes
// without a lock: op is cut to its field and a reader ends it itself.
static inline void nccl_board_enter(uint8_t *board, int me, const char *op, const char *group, long step) {
    if (board == NULL) return;
    ShmRank *b = nccl_board_block(board, me);
    char text[sizeof(b->nccl_last)];
    snprintf(text, sizeof(text), "%s", op);
    memcpy(b->nccl_last, text, sizeof(text));
    uint32_t code = 0;
    for (int k = 1; k < NCCL_BOARD_NGROUPS && group != NULL; k++)
        if (strcmp(group, nccl_board_groups[k]) == 0) code = (uint32_t)k;
    __atomic_store_n(&b->wait_op, code, __ATOMIC_SEQ_CST);
    __atomic_store_n(&b->wait_step, (int64_t)step, __ATOMIC_SEQ_CST);
}

// nccl_board_wait: rank me's host starts (on 1) or stops (on 0) waiting for its GPU
static inline void nccl_board_wait(uint8_t *board, int me, int on) {
    if (board == NULL) return;
    __atomic_store_n(&nccl_board_block(board, me)->waiting_for, on ? NCCL_BOARD_AT_SYNC : -1, __ATOMIC_SEQ_CST);
}

// nccl_blame: what the board says of the other ranks, for the line of rank
// me's watchdog: the ranks (NCCL_BLAME_MAX at most) that have exited, are
// stopped, or are not waiting for their GPU (stalled, hung, or still
// computing: with the last NCCL call each entered); when every other rank
// waits too, that they disagree on the order of calls. Ranks that never
// wrote a block (on another node) are left out; empty without a board.
static inline void nccl_blame(uint8_t *board, int world, int me, char *out, size_t outlen) {
    out[0] = '\0';
    if (board == NULL || outlen == 0) return;
    Comm view;  // comm_peer_exited and comm_peer_stopped read the blocks through a Comm
    memset(&view, 0, sizeof(view));
    view.base = board;
    view.rank = me;
    view.world = world;
    size_t n = 0;
    int seen = 0, waiting = 0, named = 0, more = 0;
    for (int r = 0; r < world; r++) {
        ShmRank *b = nccl_board_block(board, r);
        if (r == me || __atomic_load_n(&b->pid, __ATOMIC_SEQ_CST) == 0) continue;
        seen++;
        char line[200], last[sizeof(b->nccl_last) + 1];
        memcpy(last, b->nccl_last, sizeof(b->nccl_last));
        last[sizeof(b->nccl_last)] = '\0';
        long long step = (long long)__atomic_load_n(&b->wait_step, __ATOMIC_SEQ_CST);
        uint32_t code = __atomic_load_n(&b->wait_op, __ATOMIC_SEQ_CST);
        char group[40] = "";
        if (code > 0 && code < (uint32_t)NCCL_BOARD_NGROUPS)
            snprintf(group, sizeof(group), " on the %s group", nccl_board_groups[code]);
        pid_t pid;
        if (comm_peer_stopped(&view, r, &pid))
            snprintf(line, sizeof(line), "; rank %d (pid %d) is stopped (SIGSTOP, Ctrl-Z or a debugger)", r, (int)pid);
        else if (comm_peer_exited(&view, r, &pid))
            snprintf(line, sizeof(line), "; rank %d (pid %d) has exited", r, (int)pid);
        else if (__atomic_load_n(&b->waiting_for, __ATOMIC_SEQ_CST) == NCCL_BOARD_AT_SYNC) {
            waiting++;
            continue;
        } else if (last[0] == '\0')
            snprintf(line, sizeof(line), "; rank %d is not waiting for its GPU and has made no NCCL call yet", r);
        else
            snprintf(line, sizeof(line), "; rank %d is not waiting for its GPU: stalled, or still computing (its last "
                     "NCCL call: %s%s, step %lld)", r, last, group, step);
        if (named == NCCL_BLAME_MAX) {
            more++;
            continue;
        }
        named++;
        if (n < outlen) n += (size_t)snprintf(out + n, outlen - n, "%s", line);
    }
    if (more > 0 && n < outlen) n += (size_t)snprintf(out + n, outlen - n, "; and %d more", more);
    if (named == 0 && seen > 0 && waiting == seen && n < outlen)
        snprintf(out + n, outlen - n, "; every other rank on this node waits for its GPU too: the ranks disagree on the "
                 "order of NCCL calls, or NCCL itself is stuck");
}

// ----------------------------------------------------------------------------
// MAC'd point-to-point messages of the NCCL backend: what both sides derive on
// the host. Pure C, so the CPU tests (and test_gpt2cu's host checks) check it.
// A message's tag (NCCL_MAC_BYTES) is the chunked MAC of its payload
// (chunkmac.h, doc/security.md "Chunked MAC") under the frame header that
// frame_header_make (secure.h) builds. The header itself never travels: the
// receiver builds the one it expects, so a message MAC'd under any other
// header fails. The payload travels at once; its tag follows at the step's
// end, with the step's other tags to the same peer (nccl_mac_step_check).

#define NCCL_MAC_BYTES FRAME_TAG_BYTES       // a message's tag
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

// mac_unread_hit: whether a write of bytes at buf overlaps the last MAC'd
// receive's buffer (unread: NULL for none), whose check may not have read
// it yet. Every receive waits for the checks before it, so that one is the
// only buffer a check may still be reading.
static inline int mac_unread_hit(const void *unread, size_t unread_bytes, const void *buf, size_t bytes) {
    if (unread == NULL || buf == NULL || unread_bytes == 0 || bytes == 0) return 0;
    uintptr_t u = (uintptr_t)unread, b = (uintptr_t)buf;
    return b < u + unread_bytes && u < b + bytes;
}

// The step's tags, pair by pair: a rank keeps the tags of the messages it
// sends to each peer in the order sent, and the tags its checks compute for
// the messages it receives from each peer in the order received; at the
// step's end each pair swaps the tags of what it sent, and the receiver
// compares. Both ends count the messages of a pair alike (one schedule), so
// the k-th tag a rank gets from a peer is that of its k-th message from it.

#define NCCL_MAC_MAX_PEERS 4  // ranks a rank swaps MAC'd messages with in a step: the stages before and
                              // after it, and the other end of the tied wte (at most 2 today)

typedef struct {
    int n;                             // peers met this step
    int rank[NCCL_MAC_MAX_PEERS];      // their world ranks, in the order met
    int sent[NCCL_MAC_MAX_PEERS];      // messages sent to each this step
    int received[NCCL_MAC_MAX_PEERS];  // messages received from each this step
} MacPeers;

// one MAC'd receive of the step: what it was, for the error, and where its
// two tags lie (peer, and its index among that peer's messages)
typedef struct { int src, channel, microbatch, peer, index; long step; size_t bytes; } NcclMacRecv;

// mac_peer: the index of world rank r among the step's peers, added with no
// message yet if new; -1 when NCCL_MAC_MAX_PEERS are there already
static inline int mac_peer(MacPeers *p, int r) {
    for (int i = 0; i < p->n; i++)
        if (p->rank[i] == r) return i;
    if (p->n == NCCL_MAC_MAX_PEERS) return -1;
    p->rank[p->n] = r;
    p->sent[p->n] = 0;
    p->received[p->n] = 0;
    return p->n++;
}

// mac_tag_offset: where the tag of the index-th message of peer lies in an
// array of tags laid out [peer][cap][NCCL_MAC_BYTES]
static inline size_t mac_tag_offset(int peer, int index, int cap) {
    return ((size_t)peer * (size_t)cap + (size_t)index) * NCCL_MAC_BYTES;
}

// mac_first_bad: the first of the step's n receives, in the order received,
// whose tag as its check computed it (in want) is not the tag its sender
// sent (in got); -1 when every one agrees. Every pair is compared whole, in
// constant time.
static inline int mac_first_bad(const NcclMacRecv *recvs, int n, const uint8_t *want, const uint8_t *got, int cap) {
    int bad = -1;
    for (int i = 0; i < n; i++) {
        size_t at = mac_tag_offset(recvs[i].peer, recvs[i].index, cap);
        if (!tag_equal(want + at, NCCL_MAC_BYTES, got + at, NCCL_MAC_BYTES) && bad < 0) bad = i;
    }
    return bad;
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

// checked collectives over NCCL (-ic 1, nccl_check.h): one checked call of
// the period since the last check point
#define NCHK_GROUPS 5   // world, dp, tp, pp, dp (overlapped): where records are kept, the check point's order
typedef struct {
    const char *op;     // "allreduce", "reduce_scatter", "allgather", "broadcast"
    int kind, group;    // SK_*; the group's index (nchk_group_index)
    int avg, bf16;      // the op averaged; the values are bf16 (else fp32)
    long step;
    size_t n, at;       // NchkCase's n; its record's index among the group's of this period
    int root;           // a broadcast's root (NchkCase's)
    size_t coef;        // its coefficients' offset in the period's arena
    char label[96];     // what it carried (nccl_set_label)
} NchkCall;

typedef struct {
    int on;                          // NCCL mode and -ic 1 (host mode: the host backend's checks)
    SketchGen *gen;                  // the job's sketch key (nccl_join), the last draw's coefficients
    uint64_t group_digest[NCHK_GROUPS], group_calls[NCHK_GROUPS];  // checked calls so far on each group: the draws' numbers
    int ngroups;
    NchkCall *calls;                 // this period's, in the order queued
    int ncalls, calls_cap;
    size_t nrec[NCHK_GROUPS], rec_cap[NCHK_GROUPS];
    double *rec[NCHK_GROUPS];        // device: this member's records, [rec_cap][2p sketches][5]
    double *all, *all_host;          // device and pinned: every group's records gathered at the check point
    size_t all_cap;
    float *coef, *coef_host;         // device and pinned: the period's coefficients
    size_t coef_cap, coef_used;
    double *partial[2];              // device: the sketch kernel's block sums, for the main stream and the side
    double *grad_q;                  // device: the sum of squares of this rank's counted gradients (-gp)
    double *flip;                    // device: what -fault corrupt flipped (index, before, after)
    float *verdict;                  // device: the world's count of failed checks
    char label[96], cur_label[96];   // the next collective's (nccl_set_label); the one in progress
    int count;                       // the next collective reduces this rank's gradients (nccl_count_grads)
    Fault poison;                    // -fault poison, in both modes
    int corrupt_done;                // -fault corrupt has flipped its bit
    long judged, points;             // calls judged so far, and the check points that judged them (nccl_check_counts)
} NchkState;

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
    // communicator is used from one stream only. The NCCL kernels of both
    // streams still run one at a time, in the order queued ("the order of
    // NCCL kernels", below).
    NcclGroup dp_side;
    cudaStream_t side;
    cudaEvent_t side_follow;   // recorded on stream before a side call: the side stream starts it after that point
    cudaEvent_t side_queued;   // recorded on side after its last NCCL call
    int side_unfollowed;       // a side call was queued since the main stream last waited for side_queued
    int side_pending;          // calls queued on side since the last nccl_side_drain
    const char *op;         // the call in progress, for messages
    char what[96];          // its peer or channel, for messages
    // MAC'd point-to-point messages (nccl_sendrecv_mac); nccl_mac_reserve
    // makes the room for them
    Links links;            // the key's HMAC state, the job id, the per-pair sequence numbers
    MacPeers peers;         // this step's peers, and its messages to and from each
    NcclMacRecv *mac_recvs; // host [mac_cap]: each receive of the step, in the order received
    int mac_cap, mac_nrecv; // messages per step, peer and direction that fit; receives so far this step
    int mac_fault_done;     // tamper or replay has acted (once per job, as in the host backend)
    uint8_t *tags_out;      // device [NCCL_MAC_MAX_PEERS][mac_cap][32]: the tags of this step's sends, per peer
    uint8_t *tags_in;       // device, the same shape: the tags their senders sent for this step's receives
    uint8_t *tags_want;     // device, the same shape: the tags the checks computed for them
    uint8_t *tags_host;     // host: tags_want's and tags_in's bytes, for the step's comparison
    // a sender tags a copy of its payload (snapshot) on a stream of its own,
    // so neither its send nor the kernels that next write its buffer wait
    cudaStream_t tagger;
    cudaEvent_t snapped;    // on stream: the copy is made
    cudaEvent_t snap_read;  // on tagger: the last tag's chunk kernel has read the copy (the next copy may go)
    cudaEvent_t tagged;     // on tagger: every tag queued so far is made
    uint8_t *snapshot;      // device: the payload being tagged
    size_t snapshot_bytes;
    uint8_t *mac_scratch;   // device: the chunk tags of the message being tagged (32 bytes per chunk)
    size_t mac_scratch_bytes;
    // a receiver checks on a stream of its own, off the critical path: the
    // next receive into any buffer waits until the last check has read its
    cudaStream_t verify;
    cudaEvent_t received;   // on stream: the payload has arrived
    cudaEvent_t verify_read;// on verify: the last check's chunk kernel has read its payload
    const void *unread;     // the last MAC'd receive's buffer, if stream has not waited for its check since
    size_t unread_bytes;
    uint8_t *verify_scratch;
    size_t verify_scratch_bytes;
    // host mode (gpu_host_mode): no NCCL communicator is made; every call
    // goes through the host backend instead, staged through pinned memory
    Comm *host;             // NULL: NCCL
    uint8_t *pinned;        // cudaHostAlloc'd: a call's device bytes on the host
    size_t pinned_bytes;
    float *wide;            // bf16 values widened to fp32 for the host backend's sums
    size_t wide_floats;
    // the wait clock (nccl_wait_ms) of the steps the trainer watches (nccl_watch)
    int watching;
    cudaEvent_t *wait_events; // NCCL mode: [2 * wait_capacity], a pair around each NCCL call on the main stream
    int wait_capacity;        // pairs the events can hold: grows to the most calls of a watched step
    int wait_pairs;           // pairs recorded and not yet summed
    double wait_ms;           // summed so far
    double host_wait_at;      // host mode: comm_wait_ms when the watched step began
    // NCCL mode: this rank's board (the job's segment's header and rank
    // blocks, nccl_board_map), NULL when the segment is out of reach
    uint8_t *board;
    size_t board_bytes;
    int own_hostid;           // -hb 2: this rank set its own NCCL_HOSTID (for the errors' hints)
    NchkState chk;            // checked collectives (-ic 1), the ranks' gradient norms (-gp), -fault corrupt, poison
} NcclComm;

static inline void nccl_abort_all(NcclComm *c) {
    NcclGroup *gs[5] = {&c->dp_side, &c->dp, &c->tp, &c->pp, &c->world};  // the world, their parent, last
    for (int i = 0; i < 5; i++) {
        if (gs[i]->comm != NULL) ncclCommAbort(gs[i]->comm);
        gs[i]->comm = NULL;
    }
}

// nccl_fail: one line, every communicator aborted, exit 1
static inline __attribute__((format(printf, 2, 3))) void nccl_fail(NcclComm *c, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: %s %s%s (step %ld): %s\n", c->rank, c->host != NULL ? "host" : "nccl", c->op, c->what,
            c->step, msg);
    fflush(stderr);
    nccl_abort_all(c);
    exit(1);
}

// nccl_check_cuda: a CUDA error of the layer's own work (the MAC's
// kernels, host mode's copies) ends the job as any call's error does
static inline void nccl_check_cuda(NcclComm *c, cudaError_t e, const char *what) {
    if (e != cudaSuccess) nccl_fail(c, "%s: CUDA: %s", what, cudaGetErrorString(e));
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
    if (state == ncclInProgress) {
        char blame[600];
        nccl_blame(c->board, c->world.group.size, c->rank, blame, sizeof(blame));
        nccl_fail(c, "not launched within %.1f s%s", c->timeout_s, blame);
    }
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
    nccl_board_wait(c->board, c->rank, 1);
    for (;;) {
        nccl_poll_errors(c);
        cudaError_t e = query(arg);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) nccl_fail(c, "CUDA: %s", cudaGetErrorString(e));
        double now = par_now();
        if (now - start > c->timeout_s) {
            // the board names the peers that are not waiting with this one
            char blame[600];
            nccl_blame(c->board, c->world.group.size, c->rank, blame, sizeof(blame));
            nccl_fail(c, "timeout after %.1f s waiting for the GPU, whose last NCCL call queued was %s: a peer died, "
                      "stopped, or called something else%s", now - start, c->last[0] ? c->last : "none", blame);
        }
        par_sleep(NCCL_POLL_S);
    }
    nccl_board_wait(c->board, c->rank, 0);
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
// point to point); over NCCL, where the kill and stall faults act
static inline void nccl_enter(NcclComm *c, const char *op, const NcclGroup *g) {
    c->op = op;
    c->what[0] = '\0';
    if (g != NULL) snprintf(c->what, sizeof(c->what), " on the %s group", g->name);
    nccl_board_enter(c->board, c->rank, op, g != NULL ? g->name : NULL, c->step);  // before a stall or kill below
    // host mode: the host backend waits with the caller's timeout of the moment (a checkpoint lengthens it)
    if (c->host != NULL) comm_set_timeout(c->host, c->timeout_s);
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

// ----------------------------------------------------------------------------
// the wait clock: the time a rank spends waiting for its peers within the
// steps the trainer watches (nccl_watch), read by the watch report
// (trainer.h). NCCL mode: the host does not wait in a call, the GPU does: an
// NCCL kernel spins until its peers arrive. So an event is recorded on the
// main stream before and after each NCCL call queued there (before the
// call's wait for the side stream's reductions, nccl_order_main, so that
// wait counts too), and the pairs' GPU times are summed once the stream has
// passed them (nccl_wait_ms). The overlapped reductions on the side stream
// count only where the main stream waits for them (nccl_main_waits: at
// the drain, and for a ZeRO-2/3 bucket). Host mode: the host
// backend's calls, timed on the host (shm_comm.h's comm_wait_ms).

#define NCCL_WAIT_PAIRS 256   // pairs made at first; more are made as a step needs them

// nccl_wait_sum: adds the recorded pairs' times to wait_ms, waiting (under
// the watchdog) for the GPU to pass each
static inline void nccl_wait_sum(NcclComm *c) {
    for (int i = 0; i < c->wait_pairs; i++) {
        float ms = 0.0f;
        nccl_sync_event(c, c->wait_events[2 * i + 1], "the wait clock");
        nccl_check_cuda(c, cudaEventElapsedTime(&ms, c->wait_events[2 * i], c->wait_events[2 * i + 1]), "the wait clock");
        c->wait_ms += ms;
    }
    c->wait_pairs = 0;
}

// nccl_wait_grow: room for twice the pairs (NCCL_WAIT_PAIRS at first). A
// watched step with more NCCL calls than there are pairs (ZeRO-3, many
// micro-batches) gets more events, rather than waiting mid-step for the GPU
// to pass the ones it has, which would stall the host's queue.
static inline void nccl_wait_grow(NcclComm *c) {
    int capacity = c->wait_capacity ? 2 * c->wait_capacity : NCCL_WAIT_PAIRS;
    cudaEvent_t *events = (cudaEvent_t *)realloc(c->wait_events, 2 * (size_t)capacity * sizeof(cudaEvent_t));
    if (events == NULL) nccl_fail(c, "out of memory for the wait clock");
    c->wait_events = events;
    for (int i = 2 * c->wait_capacity; i < 2 * capacity; i++)
        nccl_check_cuda(c, cudaEventCreate(&c->wait_events[i]), "the wait clock");
    c->wait_capacity = capacity;
}

// nccl_wait_mark: on the main stream, before (end 0) or after (end 1) an
// NCCL call queued there, while a step is watched
static inline void nccl_wait_mark(NcclComm *c, int end) {
    if (!c->watching || c->host != NULL) return;
    if (!end && c->wait_pairs == c->wait_capacity) nccl_wait_grow(c);
    nccl_check_cuda(c, cudaEventRecord(c->wait_events[2 * c->wait_pairs + end], c->stream), "the wait clock");
    if (end) c->wait_pairs++;
}

// nccl_watch: a step the trainer watches begins (on 1) or ends (on 0); only
// the waits between the two count. The caller begins one once the GPU has
// done the steps before (after a sync): their pairs are summed then, with no
// wait, so one step's calls at most are kept.
static inline void nccl_watch(NcclComm *c, int on) {
    if (c->host == NULL && on) nccl_wait_sum(c);
    if (c->host != NULL && on) c->host_wait_at = comm_wait_ms(c->host);
    if (c->host != NULL && !on && c->watching) c->wait_ms += wait_since(&c->host_wait_at, comm_wait_ms(c->host));
    c->watching = on;
}

// nccl_wait_ms: the time waited in watched steps so far, in ms. In NCCL
// mode it waits for the GPU to pass the calls recorded, so the caller calls
// it where the stream has done them (after a sync), to wait for nothing.
static inline double nccl_wait_ms(NcclComm *c) {
    if (c->host == NULL) nccl_wait_sum(c);
    return c->wait_ms;
}

static inline ncclRedOp_t nccl_redop(NcclComm *c, int op) {
    if (op != OP_SUM && op != OP_AVG) nccl_fail(c, "op %d is neither OP_SUM nor OP_AVG", op);
    return op == OP_SUM ? ncclSum : ncclAvg;
}

// ----------------------------------------------------------------------------
// the order of NCCL kernels. An NCCL kernel waits for its peers inside the
// GPU, and the GPU promises no order, nor even that both run at once, between
// kernels of two streams: if one GPU runs the dp group's reduction before a
// tp all-reduce while its tp peer, waiting in that all-reduce, holds the
// SMs its own reduction needs (or the two GPUs pick the two kernels in
// opposite orders), every kernel waits on a kernel that cannot start: a
// deadlock (NCCL's guide, "Using multiple NCCL communicators concurrently").
// This rank queues NCCL calls on two streams, the main one (every group, the
// pipeline messages) and the side one (dp_side: the overlapped gradient
// reductions). So each call first waits for the last NCCL call queued on the
// other stream: a rank's NCCL kernels then run one at a time, each after the
// one queued before it, in the host's program order, as if on one stream.
// That order is the same on every rank (one program), and it is the order in
// which host mode runs the same calls, each to its end. Compute still
// overlaps the side reductions; two NCCL kernels of one rank never overlap.
// NCCL 2.26 and later can order the kernels of one device itself
// (NCCL_LAUNCH_ORDER_IMPLICIT=1), but that is off by default, read from the
// environment once per process and missing from older libraries; the order
// made here holds with any NCCL. Host mode has no NCCL kernel: its calls are
// synchronous, and these are not called.

// nccl_order_main: before an NCCL call on c->stream, the main stream waits
// for the side stream's last NCCL call, if one was queued since it last did
static inline void nccl_order_main(NcclComm *c) {
    if (!c->side_unfollowed) return;
    nccl_check_cuda(c, cudaStreamWaitEvent(c->stream, c->side_queued, 0), "ordering the NCCL calls");
    c->side_unfollowed = 0;
}

// nccl_order_side: before an NCCL call on c->side, the side stream waits for
// everything queued on c->stream so far: its last NCCL call, and the kernels
// that made the gradients the call reduces
static inline void nccl_order_side(NcclComm *c) {
    nccl_check_cuda(c, cudaEventRecord(c->side_follow, c->stream), "ordering the NCCL calls");
    nccl_check_cuda(c, cudaStreamWaitEvent(c->side, c->side_follow, 0), "ordering the NCCL calls");
}

// nccl_order_side_queued: after an NCCL call on c->side, where the main
// stream's next NCCL call will wait
static inline void nccl_order_side_queued(NcclComm *c) {
    nccl_check_cuda(c, cudaEventRecord(c->side_queued, c->side), "ordering the NCCL calls");
    c->side_unfollowed = 1;
}

// ----------------------------------------------------------------------------
// host mode (host_mode.h): ranks that share a GPU, or a job run with -hb 1,
// talk through shm_comm.h's host backend. Its calls use NcclComm and
// nccl_fail above, and the calls below hand their work to them (c->host set).

#include "llm3d/parallel/host_mode.h"

// ----------------------------------------------------------------------------
// joining the job (nccl_init), and the collectives on the main stream

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

// nccl_join: the NCCL communicators of this rank's world, dp, tp and pp
// groups, and dp_side, a second one of the dp group for the side stream. A
// world of one needs no rendezvous: the id never leaves the process. With
// own_hostid (-hb 2), this rank's own NCCL_HOSTID first, before any NCCL
// call: NCCL reads it once per process. The board, where the segment is
// in reach. 0, or -1 with err set and no communicator left.
static inline int nccl_join(NcclComm *c, const Grid *g, const uint8_t key[32], const char *rendezvous, double setup_s,
                            int own_hostid, char *err, size_t errlen) {
    if (own_hostid) {
        char hostid[64];
        if (gpu_hostid_check(GPU_HB_NCCL_SHARED, getenv("NCCL_HOSTID"), err, errlen) != 0) return -1;
        gpu_nccl_hostid(job_id_from_key(key), g->rank, hostid, sizeof(hostid));
        if (setenv("NCCL_HOSTID", hostid, 1) != 0)
            return errorf(err, errlen, "rank %d: flag -hb 2: setenv NCCL_HOSTID: %s", g->rank, strerror(errno));
        c->own_hostid = 1;
    }
    // what an NCCL error means under -hb 2: each rank is a node, so NCCL needs its network transport
    const char *hint = own_hostid ? " (-hb 2: every rank is an NCCL node of its own, joined by NCCL's network "
                                    "transport; NCCL_DEBUG=INFO says which it tried)" : "";
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t r = g->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (r != ncclSuccess) return errorf(err, errlen, "rank 0: ncclGetUniqueId: %s%s", ncclGetErrorString(r), hint);
    if (g->world > 1) {
        RdvAnswer ans;
        if (rdv_join(rendezvous, key, job_id_from_key(key), g->rank, g->world, g->local_rank,
                     g->rank == 0 ? (const uint8_t *)&id : NULL, setup_s, &ans, err, errlen) != 0)
            return -1;
        memcpy(&id, ans.blob, sizeof(id));
        c->board = nccl_board_map(ans.shm_name, g->world, g->rank, job_id_from_key(key), &c->board_bytes);
        // the checks' sketch key, this launch's own as in the host backend (nccl_set_check turns them on)
        c->chk.gen = (SketchGen *)malloc(sizeof(SketchGen));
        if (c->chk.gen == NULL) return errorf(err, errlen, "rank %d: nccl_join: out of memory", g->rank);
        sketch_gen_init(c->chk.gen, key, ans.shm_name);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    double deadline = par_now() + setup_s;
    r = ncclCommInitRankConfig(&c->world.comm, g->world, id, g->rank, &config);
    secure_wipe(&id, sizeof(id));
    if ((r == ncclSuccess || r == ncclInProgress) && c->world.comm != NULL) r = nccl_settle(c->world.comm, deadline);
    if (r != ncclSuccess || c->world.comm == NULL) {
        if (c->world.comm != NULL) ncclCommAbort(c->world.comm);
        c->world.comm = NULL;
        return errorf(err, errlen, "rank %d: ncclCommInitRankConfig for %d ranks: %s%s", g->rank, g->world,
                      r == ncclInProgress ? "not every rank joined in time" : ncclGetErrorString(r), hint);
    }
    if (nccl_split(c, g, GRID_DP, &c->dp, "dp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_TP, &c->tp, "tp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_PP, &c->pp, "pp", deadline, err, errlen) != 0 ||
        nccl_split(c, g, GRID_DP, &c->dp_side, "dp (overlapped)", deadline, err, errlen) != 0) {
        nccl_abort_all(c);
        return -1;
    }
    return 0;
}

// nccl_init: this rank's side of the job, after cudaSetDevice has bound its
// GPU (gpu_for_rank). mode: 0 NCCL, 1 host mode (from gpu_host_mode),
// GPU_HB_NCCL_SHARED NCCL with this rank's own NCCL_HOSTID (-hb 2, where
// ranks may share a GPU). NCCL: the communicators (nccl_join). Host mode:
// none; the host backend joins instead (shm_comm.h's comm_init, with the
// same key, rendezvous, timeout and fault). Either way the side stream and
// the MAC state's streams and events.
static inline int nccl_init(NcclComm **out, const Grid *g, const uint8_t key[32], const char *rendezvous,
                            double timeout_s, const Fault *fault, int mode, char *err, size_t errlen) {
    *out = NULL;
    int host_mode = mode == 1;
    if (mode < 0 || mode > GPU_HB_NCCL_SHARED) return errorf(err, errlen, "nccl_init: mode %d is not 0, 1 or 2", mode);
    if (comm_init_check(g, rendezvous, timeout_s, fault, err, errlen) != 0) return -1;
    NcclComm *c = (NcclComm *)calloc(1, sizeof(NcclComm));
    if (c == NULL) return errorf(err, errlen, "nccl_init: out of memory");
    c->rank = g->rank;
    c->timeout_s = timeout_s;
    c->op = "init";
    // NCCL mode: tamper and replay act on MAC'd point-to-point messages
    // (nccl_sendrecv_mac), so a job without any (pp = 1) runs on and they
    // never fire. Host mode: the host backend acts on the fault, as in the
    // CPU trainer, and this layer keeps none, so nothing fires twice.
    if (fault != NULL && !host_mode) c->fault = *fault;
    // poison acts on the trainer's gradients before they reach either backend
    if (fault != NULL && fault->kind == FAULT_POISON) c->chk.poison = *fault;
    grid_groups(g, &c->world.group, &c->dp.group, &c->tp.group, &c->pp.group);
    c->dp_side.group = c->dp.group;
    c->world.name = "world";
    c->dp.name = "dp";
    c->tp.name = "tp";
    c->pp.name = "pp";
    c->dp_side.name = "dp (overlapped)";
    double setup_s = timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s;
    int rc = host_mode ? comm_init(&c->host, g, key, rendezvous, timeout_s, fault, err, errlen)
                       : nccl_join(c, g, key, rendezvous, setup_s, mode == GPU_HB_NCCL_SHARED, err, errlen);
    if (rc != 0) {
        if (c->board != NULL) munmap(c->board, c->board_bytes);
        free(c);
        return -1;
    }
    cudaError_t e = cudaEventCreateWithFlags(&c->side_follow, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&c->side_queued, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->tagger, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->verify, cudaStreamNonBlocking);
    cudaEvent_t *events[5] = {&c->snapped, &c->snap_read, &c->tagged, &c->received, &c->verify_read};
    for (int k = 0; k < 5 && e == cudaSuccess; k++) e = cudaEventCreateWithFlags(events[k], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->one, sizeof(float));
    if (e == cudaSuccess) e = cudaMemset(c->one, 0, sizeof(float));  // the barrier's all-reduce sums zeros
    // the MAC'd messages' sequence numbers, from 0 on every pair (host mode
    // keeps its own in the host backend); their buffers come with
    // nccl_mac_reserve
    int links_ok = e == cudaSuccess && (host_mode || links_init(&c->links, key, g->rank, g->world) == 0);
    if (!links_ok) {
        nccl_abort_all(c);
        if (c->board != NULL) munmap(c->board, c->board_bytes);
        comm_free(c->host);
        cudaFree(c->one);
        free(c);
        return errorf(err, errlen, "rank %d: nccl_init: %s", g->rank,
                      e != cudaSuccess ? cudaGetErrorString(e) : "out of memory for the MAC state");
    }
    if (host_mode && g->rank == 0)
        printf("host mode: the %d ranks talk through the host backend (shared memory, staged through pinned "
               "buffers), not NCCL\n", g->world);
    if (c->own_hostid && g->rank == 0 && g->world > 1) {
        // a line of its own in a log the ranks share, whole whatever NCCL_DEBUG wrote before it
        fflush(stdout);
        printf("NCCL with -hb 2: the %d ranks are NCCL nodes of their own (NCCL_HOSTID per rank), joined by NCCL's "
               "network transport even where they share a GPU: to verify the NCCL path, not for speed\n", g->world);
        fflush(stdout);
    }
    *out = c;
    return 0;
}

static inline void nccl_set_step(NcclComm *c, long step) {
    c->step = step;
    comm_set_step(c->host, step);  // host mode: its frames carry the step
    if (fault_fires(&c->chk.poison, c->rank, step))
        fprintf(stderr, "rank %d: fault poison: this rank's gradients x%g from step %ld on\n", c->rank,
                FAULT_POISON_SCALE, step);
}

// ----------------------------------------------------------------------------
// checked collectives over NCCL (-ic 1): the hooks around each collective,
// the -gp rule's count and the faults corrupt and poison, in a file of their
// own (nccl_check_hooks.h); the calls below call them

#include "llm3d/parallel/nccl_check_hooks.h"

// nccl_allreduce: buf (n elements of type) summed or averaged over the group, in place
static inline void nccl_allreduce(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int op) {
    nccl_enter(c, "allreduce", g);
    int checked = nchk_before(c, g, SK_ALLREDUCE, buf, n, type, op, 0, c->stream);
    if (c->host != NULL) {
        host_allreduce(c, g, buf, n, type, op);
        return;
    }
    ncclRedOp_t red = nccl_redop(c, op);
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    nccl_queued(c, g, ncclAllReduce(buf, buf, n, type, red, g->comm, c->stream));
    nccl_wait_mark(c, 1);
    nchk_after(c, checked, g, buf, type, c->stream);
}

// nccl_reduce_scatter: in holds size chunks of n_per_rank; out gets chunk
// grp.me reduced over the group. out may be in + me * n_per_rank (in place).
static inline void nccl_reduce_scatter(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                       ncclDataType_t type, int op) {
    nccl_enter(c, "reduce_scatter", g);
    int checked = nchk_before(c, g, SK_REDUCE_SCATTER, (void *)in, n_per_rank, type, op, 0, c->stream);
    if (c->host != NULL) {
        host_reduce_scatter(c, g, in, out, n_per_rank, type, op);
        return;
    }
    ncclRedOp_t red = nccl_redop(c, op);
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    nccl_queued(c, g, ncclReduceScatter(in, out, n_per_rank, type, red, g->comm, c->stream));
    nccl_wait_mark(c, 1);
    nchk_after(c, checked, g, out, type, c->stream);
}

// nccl_allgather: out[k * n_per_rank ..] = member k's in; in may be out + me * n_per_rank
static inline void nccl_allgather(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                  ncclDataType_t type) {
    nccl_enter(c, "allgather", g);
    int checked = nchk_before(c, g, SK_ALLGATHER, (void *)in, n_per_rank, type, OP_SUM, 0, c->stream);
    if (c->host != NULL) {
        host_allgather(c, g, in, out, n_per_rank, type);
        return;
    }
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    nccl_queued(c, g, ncclAllGather(in, out, n_per_rank, type, g->comm, c->stream));
    nccl_wait_mark(c, 1);
    nchk_after(c, checked, g, out, type, c->stream);
}

// ----------------------------------------------------------------------------
// gradient reductions overlapped with the backward: calls on the dp group
// queued on the side stream behind what the main stream has queued so far,
// through the dp_side communicator. The host does not wait for them (only
// for NCCL to take the call): the backward of the next unit is queued on the
// main stream while the previous unit's gradients travel. nccl_side_drain
// waits for all of them, under the watchdog, before anything reads the
// reduced gradients; a kernel that must follow one of them on the main
// stream waits on an event the caller records on c->side. The main stream's
// next NCCL call (a tp all-reduce, a ZeRO-3 gather) waits for the side
// call's kernel to end (nccl_order_main), and with it what the main stream
// queues after that call; the kernels queued before it do not wait.

// nccl_side_queued: as nccl_queued, for a call on the side stream
static inline void nccl_side_queued(NcclComm *c, ncclResult_t r) {
    nccl_queued(c, &c->dp_side, r);
    nccl_order_side_queued(c);
    c->side_pending++;
}

static inline void nccl_side_enter(NcclComm *c, const char *op) {
    nccl_enter(c, op, &c->dp_side);
    if (c->host != NULL) {  // host mode: a kernel queued on c->side may still read the buffer this call fills
        nccl_check_cuda(c, cudaStreamSynchronize(c->side), "host mode's wait for the side stream");
        return;
    }
    nccl_order_side(c);
}

// nccl_side_allreduce: as nccl_allreduce over the dp group, overlapped
static inline void nccl_side_allreduce(NcclComm *c, void *buf, size_t n, ncclDataType_t type, int op) {
    nccl_side_enter(c, "allreduce (overlapped)");
    // host mode: the staging copies run on c->stream, so the checks' hooks do too
    int checked = nchk_before(c, &c->dp_side, SK_ALLREDUCE, buf, n, type, op, 0, c->host != NULL ? c->stream : c->side);
    if (c->host != NULL) {
        host_allreduce(c, &c->dp_side, buf, n, type, op);
        c->side_pending++;  // nccl_side_drain still waits for what the caller queues on c->side
        return;
    }
    nccl_side_queued(c, ncclAllReduce(buf, buf, n, type, nccl_redop(c, op), c->dp_side.comm, c->side));
    nchk_after(c, checked, &c->dp_side, buf, type, c->side);
}

// nccl_side_reduce_scatter: as nccl_reduce_scatter over the dp group, overlapped
static inline void nccl_side_reduce_scatter(NcclComm *c, const void *in, void *out, size_t n_per_rank,
                                            ncclDataType_t type, int op) {
    nccl_side_enter(c, "reduce_scatter (overlapped)");
    int checked = nchk_before(c, &c->dp_side, SK_REDUCE_SCATTER, (void *)in, n_per_rank, type, op, 0,
                              c->host != NULL ? c->stream : c->side);
    if (c->host != NULL) {
        host_reduce_scatter(c, &c->dp_side, in, out, n_per_rank, type, op);
        c->side_pending++;
        return;
    }
    nccl_side_queued(c, ncclReduceScatter(in, out, n_per_rank, type, nccl_redop(c, op), c->dp_side.comm, c->side));
    nchk_after(c, checked, &c->dp_side, out, type, c->side);
}

// nccl_main_waits: the main stream waits for event ev of the side stream
// (a reduction its next work reads). Over NCCL the wait is one of the
// step's NCCL waits for the watch report (nccl_wait_mark): the main stream
// idles there until the slowest peer has joined the reduction, and the host
// never sees that time as a call's (in host mode the side calls are
// synchronous and their waits are the host backend's)
static inline void nccl_main_waits(NcclComm *c, cudaEvent_t ev, const char *why) {
    nccl_wait_mark(c, 0);
    nccl_check_cuda(c, cudaStreamWaitEvent(c->stream, ev, 0), why);
    nccl_wait_mark(c, 1);
}

// nccl_side_drain: returns once every side call (and every kernel the caller
// queued on c->side) is done, under the watchdog of nccl_sync. Over NCCL the
// main stream first waits for the side stream, timed as a wait: without it
// the time a rank waits here for a late peer's reduction would count as its
// compute, and a straggler's peers would look as slow as it (-wr)
static inline void nccl_side_drain(NcclComm *c) {
    if (c->side_pending == 0) return;
    if (c->host == NULL) {
        nccl_check_cuda(c, cudaEventRecord(c->side_queued, c->side), "the overlapped gradient reductions");
        nccl_main_waits(c, c->side_queued, "the overlapped gradient reductions");
        c->side_unfollowed = 0;
    }
    nccl_sync(c, c->side, "the overlapped gradient reductions");  // every communicator's errors, not only dp_side's
    c->side_pending = 0;
}

// nccl_check_point: every checked call since the last check point judged,
// by every member of its group alike: the records all-gathered group by
// group (world, dp, tp, pp, then the overlapped reductions' over dp), judged
// on the host in the order queued, and the verdicts summed over the world,
// so that every rank stops or none. A failure: one line from the group's
// first member naming the step, the collective, its label and group, and
// what the sketches show, and every rank exits(1) before the caller applies
// anything. Every rank calls it at the same points (the step's end, before
// the update; before the parameters are written). Host mode: nothing to do,
// the host backend judged each call at its end.
static inline void nccl_check_point(NcclComm *c) {
    if (c == NULL || c->host != NULL || !c->chk.on) return;
    NchkState *k = &c->chk;
    nccl_side_drain(c);
    nchk_buffers(c);
    size_t off[NCHK_GROUPS], total = 0;
    for (int i = 0; i < NCHK_GROUPS; i++) {
        int p = nchk_gather_group(c, i)->group.size;
        off[i] = total;
        total += (size_t)p * k->nrec[i] * nchk_rec_count(p) * 5;
    }
    if (total > k->all_cap) {
        nccl_sync(c, c->stream, "the checks' records");
        cudaFree(k->all);
        cudaFreeHost(k->all_host);
        k->all_cap = 2 * total;
        nchk_malloc(c, (void **)&k->all, k->all_cap * sizeof(double), "the checks' records");
        nccl_check_cuda(c, cudaHostAlloc((void **)&k->all_host, k->all_cap * sizeof(double), cudaHostAllocDefault),
                        "the checks' records");
    }
    for (int i = 0; i < NCHK_GROUPS; i++) {
        const NcclGroup *g = nchk_gather_group(c, i);
        size_t each = k->nrec[i] * nchk_rec_count(g->group.size) * 5;
        if (each == 0 || g->group.size == 1) continue;
        nccl_enter(c, "allgather (the checks' records)", g);
        nccl_order_main(c);
        nccl_queued(c, g, ncclAllGather(k->rec[i], k->all + off[i], each, ncclFloat64, g->comm, c->stream));
    }
    if (total > 0)
        nccl_check_cuda(c, cudaMemcpyAsync(k->all_host, k->all, total * sizeof(double), cudaMemcpyDeviceToHost,
                                           c->stream), "the checks' records");
    nccl_sync(c, c->stream, "the checks' records");
    float bad = 0.0f;
    Sketch recs[64];
    for (int j = 0; j < k->ncalls && bad == 0.0f; j++) {
        const NchkCall *call = &k->calls[j];
        const NcclGroup *g = call->group == 4 ? &c->dp_side : nchk_gather_group(c, call->group);
        int p = g->group.size;
        size_t count = nchk_rec_count(p), nrec = k->nrec[call->group];
        Sketch *mine = (size_t)p * count <= sizeof(recs) / sizeof(recs[0]) ? recs
                                                                             : (Sketch *)malloc((size_t)p * count * sizeof(Sketch));
        if (mine == NULL) nccl_fail(c, "out of memory for the checks' verdict");
        for (int q = 0; q < p; q++)
            memcpy(mine + (size_t)q * count, k->all_host + off[call->group] + ((size_t)q * nrec + call->at) * count * 5,
                   count * sizeof(Sketch));
        NchkCase nc = {call->kind, p, g->group.ranks, call->n, nchk_unit_roundoff(call->bf16), call->avg, mine,
                       call->root};
        char why[700];
        if (nchk_judge(&nc, why, sizeof(why))) {
            bad = 1.0f;
            if (g->group.me == 0) {
                char names[200];
                comm_group_names(&g->group, names, sizeof(names));
                fflush(stdout);
                fprintf(stderr, "rank %d: step %ld: checked %s%s%s over the %s group (%s) failed: %s\n", c->rank,
                        call->step, call->op, call->label[0] ? " of " : "", call->label, g->name, names, why);
                fflush(stderr);
            }
        }
        if (mine != recs) free(mine);
    }
    // the world's verdict, so that every rank stops at this point or none
    nccl_enter(c, "allreduce (the checks' verdict)", &c->world);
    nccl_check_cuda(c, cudaMemcpy(k->verdict, &bad, sizeof(float), cudaMemcpyHostToDevice), "the checks' verdict");
    nccl_order_main(c);
    nccl_queued(c, &c->world, ncclAllReduce(k->verdict, k->verdict, 1, ncclFloat32, ncclSum, c->world.comm, c->stream));
    nccl_sync(c, c->stream, "the checks' verdict");
    nccl_check_cuda(c, cudaMemcpy(&bad, k->verdict, sizeof(float), cudaMemcpyDeviceToHost), "the checks' verdict");
    if (bad > 0.0f) {
        fflush(stdout);
        nccl_abort_all(c);
        exit(1);
    }
    k->judged += k->ncalls;
    k->points++;
    k->ncalls = 0;
    for (int i = 0; i < NCHK_GROUPS; i++) k->nrec[i] = 0;
    k->coef_used = 0;  // the GPU is past every kernel that read them
}

// nccl_check_counts: this rank's checked calls judged so far over NCCL, and
// the check points that judged them (0 and 0 with the checks off, in host
// mode and in a world of one): what shows that -ic 1 checked anything
static inline void nccl_check_counts(const NcclComm *c, long *calls, long *points) {
    *calls = c != NULL ? c->chk.judged : 0;
    *points = c != NULL ? c->chk.points : 0;
}

// nccl_broadcast: buf (n elements of type) from the group's member root to
// all, in place; -ic 1: checked as an all-gather's piece (the root's sketch
// of buf before, every member's after, the same bits)
static inline void nccl_broadcast(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int root) {
    nccl_enter(c, "broadcast", g);
    int checked = nchk_before(c, g, SK_BROADCAST, buf, n, type, OP_SUM, root, c->stream);
    if (c->host != NULL) {
        host_broadcast(c, g, buf, n, type, root);
        return;
    }
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    nccl_queued(c, g, ncclBroadcast(buf, buf, n, type, root, g->comm, c->stream));
    nccl_wait_mark(c, 1);
    nchk_after(c, checked, g, buf, type, c->stream);
}

// nccl_barrier: returns once every member has reached it (an all-reduce of one float)
static inline void nccl_barrier(NcclComm *c, const NcclGroup *g) {
    nccl_enter(c, "barrier", g);
    if (c->host != NULL) {
        comm_barrier(c->host, &g->group);
        return;
    }
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    nccl_queued(c, g, ncclAllReduce(c->one, c->one, 1, ncclFloat32, ncclSum, g->comm, c->stream));
    nccl_wait_mark(c, 1);
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
    if (c->host != NULL) {
        host_sendrecv(c, dst_rank, send_channel, send_microbatch, sendbuf, send_bytes, src_rank, recv_channel,
                      recv_microbatch, recvbuf, recv_bytes);
        return;
    }
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) nccl_fail(c, "ncclGroupStart: %s", ncclGetErrorString(r));
    if (dst_rank >= 0) r = ncclSend(sendbuf, send_bytes, ncclUint8, dst_rank, c->world.comm, c->stream);
    if (r == ncclSuccess && src_rank >= 0) r = ncclRecv(recvbuf, recv_bytes, ncclUint8, src_rank, c->world.comm, c->stream);
    ncclResult_t end = ncclGroupEnd();
    nccl_queued(c, &c->world, r != ncclSuccess && r != ncclInProgress ? r : end);
    nccl_wait_mark(c, 1);
}

static inline void nccl_send(NcclComm *c, int dst_rank, int channel, int microbatch, const void *buf, size_t bytes) {
    nccl_sendrecv(c, dst_rank, channel, microbatch, buf, bytes, -1, channel, microbatch, NULL, 0);
}

static inline void nccl_recv(NcclComm *c, int src_rank, int channel, int microbatch, void *buf, size_t bytes) {
    nccl_sendrecv(c, -1, channel, microbatch, NULL, 0, src_rank, channel, microbatch, buf, bytes);
}

// ----------------------------------------------------------------------------
// MAC'd point-to-point messages: the chunked MAC (chunkmac.h) computed and
// checked on the GPU, so no payload crosses to the host, and kept off the
// pipeline's critical path on both sides. The payload is sent as it is, at
// once; its tag follows at the step's end. A sender copies its payload
// (c->snapshot, one copy on c->stream) and tags the copy on a stream of its
// own (c->tagger), into the step's tags for that peer: neither the payload's
// send nor the kernels that next write its buffer wait for the MAC. A
// receiver queues the MAC of what arrived, under the header it expects, on
// c->verify, into the step's computed tags. At the step's end, before the
// optimizer update, nccl_mac_step_check swaps every pair's tags in one group
// call and compares each received tag with the computed one on the host: a
// mismatch refuses the step. doc/security.md, "NCCL pipeline messages".

// the tamper fault's byte flip, and its undoing after the send
static __global__ void nccl_mac_flip_kernel(uint8_t *p) { *p ^= 0x01; }

// nccl_mac_reserve: the room for MAC'd traffic, made once before the first
// step, while the streams are idle, so that nothing is allocated (or freed,
// which waits for the whole device) mid-run: max_msgs messages per step to
// and from each peer, and messages of up to max_bytes. 0, or -1 with err set.
static inline int nccl_mac_reserve(NcclComm *c, int max_msgs, size_t max_bytes, char *err, size_t errlen) {
    if (c->host != NULL) {  // host mode: no MAC state, only the staging of an exchange (a send and a receive)
        cudaError_t e = host_reserve(c, 2 * max_bytes);
        if (e != cudaSuccess)
            return errorf(err, errlen, "rank %d: reserving %zu bytes of pinned staging: %s", c->rank, 2 * max_bytes,
                          cudaGetErrorString(e));
        return 0;
    }
    // chunk tags: a message of up to 64 MiB has at most 1040 chunks
    // (nccl_mac_chunk_bytes), whatever its length; above, the longest has most
    uint64_t chunks = chunkmac_count(max_bytes, nccl_mac_chunk_bytes(max_bytes));
    size_t scratch = (size_t)(32 * (chunks > 1040 ? chunks : 1040));
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess && max_msgs > c->mac_cap) {
        size_t tag_bytes = mac_tag_offset(NCCL_MAC_MAX_PEERS, 0, max_msgs);  // one array of tags
        cudaFree(c->tags_out);
        free(c->tags_host);
        c->tags_out = c->tags_in = c->tags_want = c->tags_host = NULL;
        c->mac_cap = 0;
        NcclMacRecv *recvs = (NcclMacRecv *)realloc(c->mac_recvs, (size_t)max_msgs * sizeof(NcclMacRecv));
        if (recvs == NULL) return errorf(err, errlen, "rank %d: out of memory for %d MAC'd receives", c->rank, max_msgs);
        c->mac_recvs = recvs;
        c->tags_host = (uint8_t *)malloc(2 * tag_bytes);
        if (c->tags_host == NULL) return errorf(err, errlen, "rank %d: out of memory for %d MAC tags", c->rank, max_msgs);
        e = cudaMalloc((void **)&c->tags_out, 3 * tag_bytes);
        if (e == cudaSuccess) {
            c->tags_in = c->tags_out + tag_bytes;
            c->tags_want = c->tags_out + 2 * tag_bytes;
            c->mac_cap = max_msgs;
        }
    }
    uint8_t **bufs[3] = {&c->mac_scratch, &c->verify_scratch, &c->snapshot};
    size_t *have[3] = {&c->mac_scratch_bytes, &c->verify_scratch_bytes, &c->snapshot_bytes};
    size_t want[3] = {scratch, scratch, max_bytes};
    for (int k = 0; k < 3 && e == cudaSuccess; k++) {
        if (*have[k] >= want[k]) continue;
        cudaFree(*bufs[k]);
        *bufs[k] = NULL;
        *have[k] = 0;
        e = cudaMalloc((void **)bufs[k], want[k] > 0 ? want[k] : 1);
        if (e == cudaSuccess) *have[k] = want[k];
    }
    if (e != cudaSuccess)
        return errorf(err, errlen, "rank %d: reserving the MAC state (%d messages, %zu-byte messages): %s", c->rank,
                      max_msgs, max_bytes, cudaGetErrorString(e));
    return 0;
}

// nccl_mac_params: the kernels' parameters for one message, after checking
// that its chunk tags fit in scratch_bytes
static inline void nccl_mac_params(NcclComm *c, ChunkMacParams *p, const uint8_t header[64], size_t bytes,
                                   size_t scratch_bytes) {
    uint64_t chunk_bytes = nccl_mac_chunk_bytes(bytes);
    size_t need = (size_t)(32 * chunkmac_count(bytes, chunk_bytes));
    if (need > scratch_bytes)
        nccl_fail(c, "a %zu-byte message needs %zu bytes of MAC scratch, %zu were reserved (nccl_mac_reserve)", bytes,
                  need, scratch_bytes);
    char err[200];
    if (chunkmac_gpu_params(p, &c->links.keyed, header, bytes, chunk_bytes, err, sizeof(err)) != 0)
        nccl_fail(c, "%s", err);
}

// nccl_mac_launch: chunkmac.h's two kernels on stream st, the chunk tags of
// payload into scratch, then the message's tag into tag, with the event
// read recorded between them: once it has passed, the payload has been read
// (the final reads only the chunk tags). The parameters hold the key's
// ipad/opad states: wiped here, the launches took their copies.
static inline void nccl_mac_launch(NcclComm *c, ChunkMacParams *p, const void *payload, uint8_t *scratch, uint8_t *tag,
                                   cudaEvent_t read, cudaStream_t st) {
    uint64_t blocks = (p->n_chunks + CHUNKMAC_THREADS - 1) / CHUNKMAC_THREADS;  // at most a few thousand: reserved
    if (blocks > 0)
        chunkmac_chunks_kernel<<<(unsigned)blocks, CHUNKMAC_THREADS, 0, st>>>(*p, (const uint8_t *)payload, scratch);
    nccl_check_cuda(c, cudaEventRecord(read, st), "ordering the MAC kernels");
    chunkmac_final_kernel<<<1, 1, 0, st>>>(*p, scratch, tag, NULL, NULL);
    secure_wipe(p, sizeof(*p));
    nccl_check_cuda(c, cudaGetLastError(), "the MAC kernels");
}

// nccl_mac_tag: the tag of a message to send, into tag, beside the main
// stream: the payload is copied to c->snapshot on c->stream (behind the
// kernels that made it, so the copy takes the bytes that will be sent), and
// c->tagger tags the copy. The copy first waits until the tagger has read
// the one before (snap_read).
static inline void nccl_mac_tag(NcclComm *c, const uint8_t header[64], const void *payload, size_t bytes, uint8_t *tag) {
    ChunkMacParams p;
    nccl_mac_params(c, &p, header, bytes, c->mac_scratch_bytes);
    if (bytes > c->snapshot_bytes)
        nccl_fail(c, "a %zu-byte message is longer than the %zu bytes reserved for MAC'd messages (nccl_mac_reserve)",
                  bytes, c->snapshot_bytes);
    const char *why = "ordering the MAC of a send";
    nccl_check_cuda(c, cudaStreamWaitEvent(c->stream, c->snap_read, 0), why);
    if (bytes > 0)
        nccl_check_cuda(c, cudaMemcpyAsync(c->snapshot, payload, bytes, cudaMemcpyDeviceToDevice, c->stream), why);
    nccl_check_cuda(c, cudaEventRecord(c->snapped, c->stream), why);
    nccl_check_cuda(c, cudaStreamWaitEvent(c->tagger, c->snapped, 0), why);
    nccl_mac_launch(c, &p, c->snapshot, c->mac_scratch, tag, c->snap_read, c->tagger);
}

// nccl_mac_check: the tag of a received message, as it should be under the
// header the receiver expects, into want, on c->verify once the payload has
// arrived on c->stream; verify_read marks where the check has read it
static inline void nccl_mac_check(NcclComm *c, const uint8_t header[64], const void *payload, size_t bytes,
                                  uint8_t *want) {
    ChunkMacParams p;
    nccl_mac_params(c, &p, header, bytes, c->verify_scratch_bytes);
    const char *why = "ordering the MAC check of a receive";
    nccl_check_cuda(c, cudaEventRecord(c->received, c->stream), why);
    nccl_check_cuda(c, cudaStreamWaitEvent(c->verify, c->received, 0), why);
    nccl_mac_launch(c, &p, payload, c->verify_scratch, want, c->verify_read, c->verify);
}

// nccl_mac_peer: the index of world rank r among the step's peers
static inline int nccl_mac_peer(NcclComm *c, int r) {
    int p = mac_peer(&c->peers, r);
    if (p < 0) nccl_fail(c, "MAC'd messages with more than %d peers in one step", NCCL_MAC_MAX_PEERS);
    return p;
}

// nccl_mac_count: the next index of a pair's messages this step in one
// direction (*count: the peer's sent or received), within what was reserved
static inline int nccl_mac_count(NcclComm *c, int *count) {
    if (*count >= c->mac_cap)
        nccl_fail(c, "more than the %d MAC'd messages per peer and step that were reserved (nccl_mac_reserve)",
                  c->mac_cap);
    return (*count)++;
}

// nccl_sendrecv_mac: nccl_sendrecv (the same peers, -1 for none, and the
// same watchdog) of MAC'd messages: sendbuf's send_bytes go to dst_rank,
// recv_bytes from src_rank land in recvbuf, and the tags follow at the
// step's end. Headers: this rank to dst_rank and src_rank to this rank, with
// the job id, c->step, the channel, the micro-batch, the length and the
// pair's next sequence number. tamper (on the faulting rank, at the faulting
// step) flips a payload byte of its first MAC'd send after the copy the tag
// is made from, and flips it back once sent (with no payload, a bit of the
// tag); replay tags its first MAC'd send on a pair that has sent before under
// the previous sequence number (mac_send_header).
static inline void nccl_sendrecv_mac(NcclComm *c, int dst_rank, int send_channel, int send_mb, void *sendbuf,
                                     size_t send_bytes, int src_rank, int recv_channel, int recv_mb, void *recvbuf,
                                     size_t recv_bytes) {
    // host mode: the payloads alone, through the host backend, whose frames
    // carry their own MAC and sequence number and are checked on receipt.
    // Bad peers: nccl_sendrecv's one line, before a sequence number is touched.
    if (c->host != NULL || !nccl_peers_ok(c, dst_rank, src_rank)) {
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
        int p = nccl_mac_peer(c, dst_rank);
        uint8_t *tag = c->tags_out + mac_tag_offset(p, nccl_mac_count(c, &c->peers.sent[p]), c->mac_cap);
        nccl_mac_tag(c, header, sendbuf, send_bytes, tag);
        if (faulting && c->fault.kind == FAULT_TAMPER) {
            // the middle of the payload, on the main stream after the copy; with
            // no payload, the tag's first byte, once made (it travels later)
            flip = send_bytes > 0 ? (uint8_t *)sendbuf + send_bytes / 2 : tag;
            nccl_mac_flip_kernel<<<1, 1, 0, send_bytes > 0 ? c->stream : c->tagger>>>(flip);
            nccl_check_cuda(c, cudaGetLastError(), "the tamper fault");
            if (send_bytes == 0) flip = NULL;  // nothing to undo: the tag is this message's alone
            c->mac_fault_done = 1;
            fprintf(stderr, "rank %d: fault tamper: flipped a bit of the MAC'd %s message of micro-batch %d to rank %d "
                    "(step %ld)\n", c->rank, channel_name(send_channel), send_mb, dst_rank, c->step);
        }
    }
    // the last check queued must have read its buffer before this receive may overwrite one
    if (src_rank >= 0) nccl_check_cuda(c, cudaStreamWaitEvent(c->stream, c->verify_read, 0), "ordering the MAC checks");
    nccl_sendrecv(c, dst_rank, send_channel, send_mb, sendbuf, dst_rank >= 0 ? send_bytes : 0, src_rank, recv_channel,
                  recv_mb, recvbuf, src_rank >= 0 ? recv_bytes : 0);
    if (flip != NULL) {  // only the message in transit was changed, not this rank's own data
        nccl_mac_flip_kernel<<<1, 1, 0, c->stream>>>(flip);
        nccl_check_cuda(c, cudaGetLastError(), "the tamper fault");
    }
    if (src_rank >= 0) {
        c->op = "recv_mac";
        snprintf(c->what, sizeof(c->what), " from rank %d (%s, micro-batch %d)", src_rank, channel_name(recv_channel),
                 recv_mb);
        if (c->mac_nrecv == c->mac_cap)
            nccl_fail(c, "more than the %d MAC'd receives in one step that were reserved (nccl_mac_reserve)", c->mac_cap);
        NcclMacRecv *m = &c->mac_recvs[c->mac_nrecv++];
        m->src = src_rank;
        m->channel = recv_channel;
        m->microbatch = recv_mb;
        m->step = c->step;
        m->bytes = recv_bytes;
        m->peer = nccl_mac_peer(c, src_rank);
        m->index = nccl_mac_count(c, &c->peers.received[m->peer]);
        mac_recv_header(&c->links, src_rank, recv_channel, c->step, recv_mb, recv_bytes, header);
        nccl_mac_check(c, header, recvbuf, recv_bytes, c->tags_want + mac_tag_offset(m->peer, m->index, c->mac_cap));
        c->unread = recvbuf;  // the checks before it were waited for above
        c->unread_bytes = recv_bytes;
    }
}

// nccl_mac_before_write: before the rank writes bytes at buf on stream s
// other than by a receive (which waits itself), s waits for the MAC checks
// if the last receive's buffer is there: a write that lands before its
// check has read it would make the check refuse the step. Over NCCL with
// chunks of layers a received buffer is written so: a pooled activation
// set retaken for the embedding, zbv's hand-offs (pipeline_run.cuh).
// verify_read covers every check queued, as they run in order on verify.
static inline void nccl_mac_before_write(NcclComm *c, cudaStream_t s, const void *buf, size_t bytes) {
    if (c == NULL || c->host != NULL || !mac_unread_hit(c->unread, c->unread_bytes, buf, bytes)) return;
    nccl_check_cuda(c, cudaStreamWaitEvent(s, c->verify_read, 0), "ordering a write after the MAC checks");
    c->unread = NULL;
}

// nccl_mac_step_begin: at the start of a step, before its first MAC'd message
static inline void nccl_mac_step_begin(NcclComm *c) {
    c->op = "mac_step_begin";
    c->what[0] = '\0';
    c->mac_nrecv = 0;
    c->peers.n = 0;
}

// nccl_mac_send_tags: every tag of the step after its payload: to each peer
// the tags of the messages sent to it this step, in the order sent, and from
// it those of the messages received from it, all in one group call (so no
// pair waits on another's order), on c->stream once the tagger has made them
static inline void nccl_mac_send_tags(NcclComm *c) {
    nccl_enter(c, "mac_tags", NULL);
    snprintf(c->what, sizeof(c->what), " (the step's MAC tags, %d peers)", c->peers.n);
    const char *why = "ordering the MAC tags";
    nccl_check_cuda(c, cudaEventRecord(c->tagged, c->tagger), why);
    nccl_check_cuda(c, cudaStreamWaitEvent(c->stream, c->tagged, 0), why);
    nccl_wait_mark(c, 0);
    nccl_order_main(c);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) nccl_fail(c, "ncclGroupStart: %s", ncclGetErrorString(r));
    for (int p = 0; p < c->peers.n && r == ncclSuccess; p++) {
        size_t at = mac_tag_offset(p, 0, c->mac_cap);
        if (c->peers.sent[p] > 0)
            r = ncclSend(c->tags_out + at, (size_t)c->peers.sent[p] * NCCL_MAC_BYTES, ncclUint8, c->peers.rank[p],
                         c->world.comm, c->stream);
        if (r == ncclSuccess && c->peers.received[p] > 0)
            r = ncclRecv(c->tags_in + at, (size_t)c->peers.received[p] * NCCL_MAC_BYTES, ncclUint8, c->peers.rank[p],
                         c->world.comm, c->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    nccl_queued(c, &c->world, r != ncclSuccess && r != ncclInProgress ? r : end);
    nccl_wait_mark(c, 1);
}

// nccl_mac_step_check: whether every MAC'd receive of the step verified: the
// tags swapped (nccl_mac_send_tags), then each received tag compared with
// the one its check computed. The caller calls it before the optimizer
// update and ends the job on -1, with err naming the first bad message (in
// the order received: after a replay every later message on that pair fails
// too, and the first is the replay). The swap makes it a call between peers:
// every rank that sent or received MAC'd messages since nccl_mac_step_begin
// must call it at the same point of the program, as its peers do.
static inline int nccl_mac_step_check(NcclComm *c, char *err, size_t errlen) {
    if (c->host != NULL || c->peers.n == 0) return 0;  // host mode checks each frame as it arrives; or no messages
    nccl_mac_send_tags(c);
    // both streams under the watchdog: the main one holds the swap, which waits on peers
    nccl_sync(c, c->stream, "the step's MAC tags");
    nccl_sync(c, c->verify, "the step's MAC checks");
    c->unread = NULL;
    size_t bytes = mac_tag_offset(c->peers.n, 0, c->mac_cap), half = mac_tag_offset(NCCL_MAC_MAX_PEERS, 0, c->mac_cap);
    cudaError_t e = cudaMemcpy(c->tags_host, c->tags_want, bytes, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(c->tags_host + half, c->tags_in, bytes, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        return errorf(err, errlen, "rank %d: nccl MAC check (step %ld): CUDA: %s", c->rank, c->step,
                      cudaGetErrorString(e));
    int bad = mac_first_bad(c->mac_recvs, c->mac_nrecv, c->tags_host, c->tags_host + half, c->mac_cap);
    c->peers.n = 0;  // checked: a second call has nothing to swap
    c->mac_nrecv = 0;
    if (bad < 0) return 0;
    const NcclMacRecv *m = &c->mac_recvs[bad];
    return errorf(err, errlen, "rank %d: the MAC of the %s message of micro-batch %d from rank %d (%zu bytes, step %ld) "
                  "does not verify: the message was changed, replayed or misrouted", c->rank,
                  channel_name(m->channel), m->microbatch, m->src, m->bytes, m->step);
}

// nccl_finalize: finalizes every communicator (flushing what is queued)
// within the timeout, else aborts them
static inline void nccl_finalize(NcclComm *c) {
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
}

// nccl_free: the end of a job on every rank. NCCL mode: the communicators
// finalized; host mode: each rank's bytes line printed, then the host
// backend closed. Then the streams, events and buffers.
static inline void nccl_free(NcclComm *c) {
    if (c == NULL) return;
    c->op = "free";
    c->what[0] = '\0';
    if (c->host != NULL) {
        host_print_bytes(c);
        comm_free(c->host);
    } else {
        nccl_finalize(c);
    }
    nchk_free(c);
    cudaFreeHost(c->pinned);
    free(c->wide);
    cudaFree(c->one);
    cudaFree(c->mac_scratch);
    cudaFree(c->verify_scratch);
    cudaFree(c->snapshot);
    cudaFree(c->tags_out);  // tags_in and tags_want lie in the same allocation
    free(c->tags_host);
    cudaStreamDestroy(c->tagger);
    cudaStreamDestroy(c->verify);
    cudaEvent_t events[5] = {c->snapped, c->snap_read, c->tagged, c->received, c->verify_read};
    for (int k = 0; k < 5; k++) cudaEventDestroy(events[k]);
    cudaEventDestroy(c->side_follow);
    cudaEventDestroy(c->side_queued);
    for (int k = 0; k < 2 * c->wait_capacity; k++) cudaEventDestroy(c->wait_events[k]);
    free(c->wait_events);
    cudaStreamDestroy(c->side);
    free(c->mac_recvs);
    if (c->board != NULL) munmap(c->board, c->board_bytes);
    links_free(&c->links);  // wipes the key and its HMAC state
    free(c);
}
#endif  // LLM3D_NCCL

#endif
