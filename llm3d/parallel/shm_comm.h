/*
 * llm3d/parallel/shm_comm.h: the host backend of the communicator:
 * collectives and point-to-point messages between the rank processes of one
 * box, through the shared-memory segment of rendezvous.h.
 *
 * defines:
 *   Comm                  one rank's communicator
 *   comm_init             joins the rendezvous and maps the segment
 *   comm_init_check       what both backends' set-up require first
 *   comm_allreduce, comm_reduce_scatter, comm_allgather, comm_broadcast,
 *   comm_barrier          the collectives over a Group
 *   comm_send, comm_recv, comm_sendrecv
 *                         point-to-point messages on a channel
 *   comm_set_step, comm_set_timeout
 *                         the step messages are stamped with; a longer
 *                         timeout for a wait known to be long
 *   comm_set_check, comm_set_label, comm_count_grads, comm_grad_sumsq,
 *   comm_check_ms, comm_sum_ms, comm_group_digest, comm_check_covers
 *                         checked collectives (-ic 1, sketch.h): on or off;
 *                         what the next collective carries, for the line a
 *                         failed check prints; the sum of squares of this
 *                         rank's gradients as it put them into the
 *                         collectives that reduce them; the checks' time,
 *                         and the reducing receives' (which share a pass);
 *                         a piece past the length drawn ends the job
 *   COMM_ALLREDUCE .. COMM_P2P, COMM_NCOUNTERS, comm_counter_name,
 *   comm_get_bytes, comm_print_bytes
 *                         the byte counters
 *   comm_wait_ms          the wait clock
 *   wait_since            what a wait clock ran since a mark: both backends'
 *                         wait clocks are read with it
 *   comm_free             the communicator closed and freed
 *   OP_SUM, OP_AVG        the reduction ops, which the NCCL backend takes too
 *
 * Header-only (llm.c style): every function is static inline.
 *
 * One ring of COMM_SLOTS message slots per directed link in one
 * shared-memory segment; every message is a frame (header | payload | HMAC
 * tag) that the receiver checks before using a byte of it. Collectives are
 * rings built from those messages: reduce-scatter and all-gather, all-reduce
 * being one then the other. The reduction order is fixed by the group, so the
 * same inputs give bit-identical outputs on every run and on every member.
 * doc/parallel.md has the layout, the algorithms and their byte counts.
 *
 * Checked collectives (comm_set_check). Each member sketches (sketch.h)
 * every piece it sends, receives and sums in all-reduce, reduce-scatter and
 * all-gather, frame by frame while the frame is in its cache; at the end the
 * group all-gathers the records (CH_CHECK frames, MAC'd like the rest) and
 * every member judges every hop alike. A failed check prints one line, from
 * the group's first member, naming the step, the collective, its label and
 * group, and the hop or the rank whose sum is wrong; the group then exits(1)
 * before the caller sees the result. Broadcast and barrier are not checked.
 *
 * Failure. The collective and point-to-point calls return nothing: a wait
 * that sees no progress for timeout_s, a frame that fails its check, or a
 * caller's wrong argument prints one line naming this rank, the peer, the
 * operation, the channel and the step, and exits(1); the launcher then ends
 * the job. comm_init returns errors.
 */
#ifndef LLM3D_SHM_COMM_H
#define LLM3D_SHM_COMM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "secure.h"
#include "llm3d/secure/fault.h"  // Fault: kill, stall, tamper and replay act here
#include "llm3d/parallel/grid.h"
#include "llm3d/parallel/rendezvous.h"  // the segment's layout, rdv_join, par_now
#include "llm3d/parallel/sketch.h"      // checked collectives: the keyed sketches and their verdict

#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

// ----------------------------------------------------------------------------
// the host communicator

enum { COMM_ALLREDUCE = 0, COMM_REDUCE_SCATTER, COMM_ALLGATHER, COMM_BROADCAST, COMM_BARRIER,
       COMM_P2P, COMM_NCOUNTERS = COMM_P2P + CH_COUNT };  // COMM_P2P + channel: bytes sent on that channel
enum { OP_SUM = 0, OP_AVG = 1 };
#define COMM_MAX_GROUPS 32      // groups one rank may run collectives on (world, dp, tp, pp, tied, ...)

static inline const char *comm_counter_name(int i) {
    static const char *names[COMM_P2P] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"};
    if (i >= 0 && i < COMM_P2P) return names[i];
    if (i >= COMM_P2P && i < COMM_NCOUNTERS) return channel_name(i - COMM_P2P);
    return "unknown";
}

typedef struct Comm {
    int rank, world;
    long step;
    double timeout_s;
    Fault fault;
    int fault_done;             // tamper and replay act on one frame only
    Links links;
    uint8_t *base;              // the mapped segment (NULL for world 1)
    size_t map_bytes;
    char shm_name[COMM_NAME_BYTES];
    uint8_t blob[COMM_BLOB_BYTES];
    uint64_t slot_stride, ring_stride, rings_offset;
    uint8_t *frame;             // private copy of the frame being checked
    float *scratch;             // reduce-scatter's two partial sums
    size_t scratch_floats;
    const char *op;             // the call in progress, for messages
    int op_counter;
    uint64_t sent[COMM_NCOUNTERS];
    double wait_ms;             // time spent in comm_run, every call's one loop (comm_wait_ms)
    // checked collectives (-ic 1)
    int check;                  // on: every all-reduce, reduce-scatter and all-gather is sketched and judged
    SketchGen *gen;             // the job's sketch key and the coefficients of the collective in progress
    Sketch *rec, *recs;         // this member's record of it; every member's, gathered
    size_t recs_cap;            // sketches recs holds
    uint64_t group_id[COMM_MAX_GROUPS], group_calls[COMM_MAX_GROUPS];  // collectives so far on each group seen
    int ngroups;
    const char *label;          // what the next collective carries (comm_set_label), for a failure's line
    int count_grads;            // the next collective reduces this rank's gradients (comm_count_grads)
    double grad_sumsq;          // the sum of squares of what this rank put into those
    double check_ms;            // time spent sketching, swapping the records and judging them
    double sum_ms;              // time in the reducing receives' sums (with their sketches, when checking)
    uint8_t *flipped;           // -fault corrupt, corrupt-low: the frame's payload with its bit flipped;
                                // corrupt-sum: the frame's addend, kept while the sum overwrites it
} Comm;

// a transfer: one message of `bytes` to or from one peer, as
// max(1, ceil(bytes / COMM_SLOT_PAYLOAD)) frames
typedef struct Xfer {
    int peer, channel;
    uint32_t microbatch;
    const uint8_t *src;         // send: the bytes
    uint8_t *dst;               // recv: copy the bytes here, or ...
    float *sum;                 // ... recv reducing: sum[j] = received[j] + addend[j]
    const float *addend;
    size_t bytes, frames, done;
    const struct Xfer *gate;    // send: frame k waits until gate has received k + 1 (forwarding)
    // checked collectives: each frame's floats sketched as they pass, elements
    // g0 + offset / 4 of the collective's vector
    size_t g0;
    Sketch *sk;                 // send: what is sent (full: with |r|.|x| and squares, an input);
    int sk_full;                // recv: what arrived (a copy: after it lands in dst)
    Sketch *sk_add, *sk_sum;    // recv reducing: the addend (full, read before the sum overwrites it) and the sum
    Sketch *sk_frame;           // recv reducing: the worst of its frames' sums, each checked on its own
    int squares;                // checks off, gradients counted: this rank's input (send: what is sent; recv
                                // reducing: the addend) into grad_sumsq as it passes
} Xfer;

static inline Xfer xfer_make(int peer, int channel, uint32_t microbatch, size_t bytes) {
    Xfer x;
    memset(&x, 0, sizeof(x));
    x.peer = peer;
    x.channel = channel;
    x.microbatch = microbatch;
    x.bytes = bytes;
    x.frames = bytes == 0 ? 1 : (bytes + COMM_SLOT_PAYLOAD - 1) / COMM_SLOT_PAYLOAD;
    return x;
}

static inline ShmRank *comm_rank_block(const Comm *c, int r) {
    return (ShmRank *)(c->base + SHM_HEADER_BYTES + (size_t)r * SHM_RANK_BYTES);
}

static inline uint64_t par_pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

// comm_peer_exited: 1 when rank r's process is known to be gone (same pid
// namespace, and kill(pid, 0) says no such process)
static inline int comm_peer_exited(const Comm *c, int r, pid_t *pid_out) {
    ShmRank *b = comm_rank_block(c, r);
    pid_t pid = (pid_t)__atomic_load_n(&b->pid, __ATOMIC_SEQ_CST);
    uint64_t ns = __atomic_load_n(&b->pid_ns, __ATOMIC_SEQ_CST);
    *pid_out = pid;
    if (pid <= 0 || ns == 0 || ns != __atomic_load_n(&comm_rank_block(c, c->rank)->pid_ns, __ATOMIC_SEQ_CST)) return 0;
    return kill(pid, 0) != 0 && errno == ESRCH;
}

// comm_peer_stopped: 1 when rank r's process is stopped (SIGSTOP, Ctrl-Z, a
// debugger): its state in /proc/PID/stat is T or t. Same pid namespace only.
static inline int comm_peer_stopped(const Comm *c, int r, pid_t *pid_out) {
    ShmRank *b = comm_rank_block(c, r);
    pid_t pid = (pid_t)__atomic_load_n(&b->pid, __ATOMIC_SEQ_CST);
    uint64_t ns = __atomic_load_n(&b->pid_ns, __ATOMIC_SEQ_CST);
    *pid_out = pid;
    if (pid <= 0 || ns == 0 || ns != __atomic_load_n(&comm_rank_block(c, c->rank)->pid_ns, __ATOMIC_SEQ_CST)) return 0;
    char path[64], text[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = '\0';
    const char *paren = strrchr(text, ')');  // "PID (COMM) STATE ...", and COMM may hold anything
    return paren != NULL && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't');
}

static inline uint8_t *comm_ring(const Comm *c, int src, int dst) {
    return c->base + c->rings_offset + ((size_t)src * (size_t)c->world + (size_t)dst) * c->ring_stride;
}

static inline uint32_t *ring_head(uint8_t *ring) { return (uint32_t *)ring; }
static inline uint32_t *ring_tail(uint8_t *ring) { return (uint32_t *)(ring + 64); }

static inline uint8_t *ring_slot(const Comm *c, uint8_t *ring, uint32_t index) {
    return ring + SHM_RING_CTL_BYTES + (size_t)(index % COMM_SLOTS) * c->slot_stride;
}

static inline void comm_ring_bell(const Comm *c, int r) {
    uint32_t *bell = &comm_rank_block(c, r)->bell;
    __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// comm_die: the job cannot go on; the name is normally unlinked already
static inline void comm_die(Comm *c) {
    if (c != NULL && c->shm_name[0] != '\0') shm_unlink(c->shm_name);
    exit(1);
}

static inline __attribute__((format(printf, 2, 3))) void comm_usage_die(Comm *c, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: %s\n", c != NULL ? c->rank : 0, msg);
    comm_die(c);
}

// comm_blame: follows who-waits-for-whom from peer, to name the rank that
// stopped answering (a hint: the blocks are read without a lock)
static inline void comm_blame(const Comm *c, int peer, char *out, size_t outlen) {
    int r = peer;
    size_t n = 0;
    out[0] = '\0';
    for (int hops = 0; hops < c->world && n < outlen; hops++) {
        // a rank that gave up waiting (its own timeout) still points at whom it waited for
        ShmRank *b = comm_rank_block(c, r);
        int w = __atomic_load_n(&b->waiting_for, __ATOMIC_SEQ_CST);
        pid_t pid;
        if (comm_peer_stopped(c, r, &pid)) {
            // what its block says is from before it stopped, and proves nothing about the order of calls
            snprintf(out + n, outlen - n, "; rank %d (pid %d) is stopped (SIGSTOP, Ctrl-Z or a debugger)", r, (int)pid);
            return;
        }
        int exited = comm_peer_exited(c, r, &pid);
        if ((w < 0 || w >= c->world) && exited) {
            snprintf(out + n, outlen - n, "; rank %d (pid %d) has exited", r, (int)pid);
            return;
        }
        if (w < 0 || w >= c->world) {
            snprintf(out + n, outlen - n, "; rank %d is not waiting in a collective: stopped, or still computing", r);
            return;
        }
        if (w == c->rank) {
            snprintf(out + n, outlen - n, "; rank %d waits for this rank: the ranks disagree on the order of calls", r);
            return;
        }
        int op = (int)__atomic_load_n(&b->wait_op, __ATOMIC_SEQ_CST);
        long long step = (long long)__atomic_load_n(&b->wait_step, __ATOMIC_SEQ_CST);
        n += (size_t)snprintf(out + n, outlen - n, "; rank %d%s waits for rank %d (%s, step %lld)", r,
                              exited ? " (exited)" : "", w, comm_counter_name(op), step);
        r = w;
    }
}

static inline void comm_timeout(Comm *c, int peer, int channel, double waited) {
    char blame[400];
    comm_blame(c, peer, blame, sizeof(blame));
    fprintf(stderr, "rank %d: timeout after %.1f s waiting for rank %d (%s, channel %s, step %ld)%s\n", c->rank,
            waited, peer, c->op, channel_name(channel), c->step, blame);
    comm_die(c);
}

// comm_enter: the start of every call; where kill and stall faults act
static inline void comm_enter(Comm *c, const char *op, int counter) {
    c->op = op;
    c->op_counter = counter;
    if (!fault_fires(&c->fault, c->rank, c->step)) return;
    if (c->fault.kind == FAULT_KILL) {
        fprintf(stderr, "rank %d: fault kill at step %ld (%s): SIGKILL\n", c->rank, c->step, op);
        raise(SIGKILL);
    }
    if (c->fault.kind == FAULT_STALL) {
        fprintf(stderr, "rank %d: fault stall at step %ld (%s): no more answers\n", c->rank, c->step, op);
        for (;;) pause();
    }
}

// comm_check_covers: a piece about to be sketched lies within the length
// the collective's coefficients were drawn for (sketch_covers). Past it an
// element has no coefficient of this draw, and a change to it would pass
// every check; the collectives cut their pieces within the length they
// draw for, so one that does not is this code's fault, and ends the job
static inline void comm_check_covers(Comm *c, size_t g0, size_t n) {
    if (sketch_covers(c->gen, g0, n)) return;
    fprintf(stderr, "rank %d: step %ld: checked %s%s%s: a piece of %zu elements from element %zu reaches past the %zu "
            "elements its coefficients were drawn for\n", c->rank, c->step, c->op, c->label != NULL ? " of " : "",
            c->label != NULL ? c->label : "", n, g0, c->gen->n);
    comm_die(c);
}

// comm_sketch: a piece of a checked collective's data into one of its
// sketches, timed into check_ms
static inline void comm_sketch(Comm *c, Sketch *sk, size_t g0, const float *x, size_t n, int full) {
    comm_check_covers(c, g0, n);
    double t0 = par_now();
    sketch_add(sk, c->gen, g0, x, n, full);
    c->check_ms += (par_now() - t0) * 1e3;
}

// comm_fault_buffer: c->flipped, made on first use (a frame's payload)
static inline uint8_t *comm_fault_buffer(Comm *c) {
    if (c->flipped == NULL && (c->flipped = (uint8_t *)malloc(COMM_SLOT_PAYLOAD)) == NULL)
        comm_usage_die(c, "fault %s: out of memory", fault_name(c->fault.kind));
    return c->flipped;
}

// comm_corrupt_due: -fault corrupt or corrupt-low acts on this frame: this
// rank's first frame of data in an all-reduce, reduce-scatter or all-gather
// of the fault's step
static inline int comm_corrupt_due(const Comm *c, size_t len) {
    int data_op = c->op_counter == COMM_ALLREDUCE || c->op_counter == COMM_REDUCE_SCATTER ||
                  c->op_counter == COMM_ALLGATHER;
    return (c->fault.kind == FAULT_CORRUPT || c->fault.kind == FAULT_CORRUPT_LOW) && !c->fault_done && data_op &&
           len >= sizeof(float) && fault_fires(&c->fault, c->rank, c->step);
}

// comm_corrupt: a copy of the frame's payload with one bit flipped in its
// float of largest magnitude (where a flip changes the most), sealed in its
// place: the tag is right, the sketch was made of the bytes before
static inline const uint8_t *comm_corrupt(Comm *c, const Xfer *x, const uint8_t *payload, size_t len) {
    memcpy(comm_fault_buffer(c), payload, len);
    size_t n = len / sizeof(float), at = 0;
    float best = -1.0f;
    for (size_t j = 0; j < n; j++) {
        float v;
        memcpy(&v, c->flipped + j * sizeof(float), sizeof(float));
        if (fabsf(v) > best) { best = fabsf(v); at = j; }
    }
    uint32_t bits;
    float before, after;
    memcpy(&bits, c->flipped + at * sizeof(float), sizeof(bits));
    memcpy(&before, &bits, sizeof(before));
    bits ^= 1u << fault_flip_bit(c->fault.kind);
    memcpy(&after, &bits, sizeof(after));
    memcpy(c->flipped + at * sizeof(float), &bits, sizeof(bits));
    c->fault_done = 1;
    fprintf(stderr, "rank %d: fault %s: flipped bit %d of element %zu (%.9g to %.9g) in a frame to rank %d (%s, step %ld)\n",
            c->rank, fault_name(c->fault.kind), fault_flip_bit(c->fault.kind), x->g0 + (size_t)(payload - x->src) /
            sizeof(float) + at, before, after, x->peer, c->op, c->step);
    return c->flipped;
}

// comm_corrupt_sum_due: -fault corrupt-sum acts on this frame: this rank's
// first reducing receive of data in the fault's step
static inline int comm_corrupt_sum_due(const Comm *c, size_t m) {
    return c->fault.kind == FAULT_CORRUPT_SUM && !c->fault_done && m > 0 && fault_fires(&c->fault, c->rank, c->step);
}

// comm_corrupt_sum: the frame's sum made as a faulty adder would make it:
// z = v + a, then one mantissa bit (fault_flip_bit) of its largest element
// flipped, and every sketch of the frame made of what is stored, the passes
// apart (sketch_add's sketches are sketch_reduce's, bit for bit). So what
// moved is what each end sketched, and only the sum's rounding bound, for
// the chunk and for this frame, can see the change. z may be a.
static inline void comm_corrupt_sum(Comm *c, Xfer *x, const float *v, const float *a, float *z, size_t g, size_t m) {
    float *kept = (float *)comm_fault_buffer(c);
    memcpy(kept, a, m * sizeof(float));
    size_t at = 0;
    for (size_t j = 0; j < m; j++) {
        z[j] = v[j] + kept[j];
        if (fabsf(z[j]) > fabsf(z[at])) at = j;
    }
    uint32_t bits;
    float before = z[at], after;
    memcpy(&bits, &z[at], sizeof(bits));
    bits ^= 1u << fault_flip_bit(c->fault.kind);
    memcpy(&after, &bits, sizeof(after));
    z[at] = after;
    c->fault_done = 1;
    fprintf(stderr, "rank %d: fault %s: flipped bit %d of element %zu of the sum it made of what rank %d sent (%.9g to "
            "%.9g; %s, step %ld)\n", c->rank, fault_name(c->fault.kind), fault_flip_bit(c->fault.kind), g + at,
            x->peer, before, after, c->op, c->step);
    if (x->sk != NULL && x->sk_add != NULL && x->sk_sum != NULL) {
        double q = x->sk->q;  // what arrived is sketched with its |x| sums, not its squares (as sketch_reduce does)
        sketch_add(x->sk, c->gen, g, v, m, 1);
        x->sk->q = q;
        sketch_add(x->sk_add, c->gen, g, kept, m, 1);
        sketch_add(x->sk_sum, c->gen, g, z, m, 0);
        if (x->sk_frame != NULL) {
            Sketch piece[3];
            memset(piece, 0, sizeof(piece));
            sketch_add(&piece[0], c->gen, g, v, m, 1);
            sketch_add(&piece[1], c->gen, g, kept, m, 1);
            sketch_add(&piece[2], c->gen, g, z, m, 0);
            sketch_piece_note(x->sk_frame, piece, g, m);
        }
    } else if (x->squares)
        c->grad_sumsq += sketch_sumsq(kept, m);
}

// comm_try_send: puts the next frame of x into the ring to x->peer if a slot
// is free; 1 when it did
static inline int comm_try_send(Comm *c, Xfer *x) {
    uint8_t *ring = comm_ring(c, c->rank, x->peer);
    uint32_t head = __atomic_load_n(ring_head(ring), __ATOMIC_RELAXED);
    uint32_t tail = __atomic_load_n(ring_tail(ring), __ATOMIC_ACQUIRE);
    if (head - tail >= COMM_SLOTS) return 0;
    uint8_t *slot = ring_slot(c, ring, head);
    if (c->fault.kind == FAULT_REPLAY && !c->fault_done && head > 0 && fault_fires(&c->fault, c->rank, c->step)) {
        // the previous frame on this link, byte for byte, is still in the slot before
        const uint8_t *prev = ring_slot(c, ring, head - 1);
        size_t prev_len = get_u32(prev);
        if (prev_len > frame_bytes(COMM_SLOT_PAYLOAD)) prev_len = frame_bytes(COMM_SLOT_PAYLOAD);
        memcpy(slot, prev, SHM_SLOT_PREFIX + prev_len);
        c->fault_done = 1;
        fprintf(stderr, "rank %d: fault replay: sent the previous frame to rank %d again (%s, channel %s, step %ld)\n",
                c->rank, x->peer, c->op, channel_name(x->channel), c->step);
        __atomic_store_n(ring_head(ring), head + 1, __ATOMIC_RELEASE);
        comm_ring_bell(c, x->peer);
        return 1;
    }
    size_t off = x->done * COMM_SLOT_PAYLOAD;
    size_t len = x->bytes - off < COMM_SLOT_PAYLOAD ? x->bytes - off : COMM_SLOT_PAYLOAD;
    uint8_t *frame = slot + SHM_SLOT_PREFIX;
    const uint8_t *payload = x->src + off, *sealed = payload;
    if (comm_corrupt_due(c, len)) sealed = comm_corrupt(c, x, payload, len);
    if (frame_seal(&c->links, x->peer, x->channel, (uint64_t)c->step, x->microbatch, sealed, len, frame) != 0)
        comm_usage_die(c, "%s: cannot seal a frame to rank %d", c->op, x->peer);
    size_t flen = frame_bytes(len);
    put_u32(slot, (uint32_t)flen);
    if (c->fault.kind == FAULT_TAMPER && !c->fault_done && fault_fires(&c->fault, c->rank, c->step)) {
        frame_tamper(frame, flen);
        c->fault_done = 1;
        fprintf(stderr, "rank %d: fault tamper: flipped a bit of a frame to rank %d (%s, channel %s, step %ld)\n",
                c->rank, x->peer, c->op, channel_name(x->channel), c->step);
    }
    __atomic_store_n(ring_head(ring), head + 1, __ATOMIC_RELEASE);
    comm_ring_bell(c, x->peer);
    // the piece's sketch (of its bytes as they were, a -fault flip left out)
    // or its squares: once the frame is out, so the peer need not wait for
    // them, and while the seal's pass has left the piece in this core's cache
    if (x->sk != NULL) comm_sketch(c, x->sk, x->g0 + off / sizeof(float), (const float *)payload, len / sizeof(float),
                                   x->sk_full);
    if (x->squares) c->grad_sumsq += sketch_sumsq((const float *)payload, len / sizeof(float));
    c->sent[c->op_counter == COMM_P2P ? COMM_P2P + x->channel : c->op_counter] += len;
    x->done++;
    return 1;
}

// comm_try_recv: takes the next frame from the ring of x->peer if there is
// one, checks it, and uses its payload; 1 when it did
static inline int comm_try_recv(Comm *c, Xfer *x) {
    uint8_t *ring = comm_ring(c, x->peer, c->rank);
    uint32_t head = __atomic_load_n(ring_head(ring), __ATOMIC_ACQUIRE);
    uint32_t tail = __atomic_load_n(ring_tail(ring), __ATOMIC_RELAXED);
    if (head == tail) return 0;
    // copy the frame out first: what we check is then what we use, whatever
    // the segment holds afterwards, and the sender gets its slot back sooner
    const uint8_t *slot = ring_slot(c, ring, tail);
    size_t flen = get_u32(slot);
    if (flen > frame_bytes(COMM_SLOT_PAYLOAD)) flen = frame_bytes(COMM_SLOT_PAYLOAD);
    memcpy(c->frame, slot + SHM_SLOT_PREFIX, flen);
    __atomic_store_n(ring_tail(ring), tail + 1, __ATOMIC_RELEASE);
    comm_ring_bell(c, x->peer);

    size_t off = x->done * COMM_SLOT_PAYLOAD;
    size_t len = x->bytes - off < COMM_SLOT_PAYLOAD ? x->bytes - off : COMM_SLOT_PAYLOAD;
    char why[256];
    const uint8_t *payload = NULL;
    int bad = flen < FRAME_HEADER_BYTES;
    if (bad) snprintf(why, sizeof(why), "from rank %d, channel %s, step %ld: truncated frame (%zu bytes)", x->peer,
                      channel_name(x->channel), c->step, flen);
    if (!bad) bad = frame_check_header(&c->links, c->frame, x->peer, x->channel, (uint64_t)c->step, x->microbatch, len,
                                       why, sizeof(why)) != 0;
    if (!bad) bad = frame_open(&c->links, c->frame, flen, x->peer, x->channel, (uint64_t)c->step, x->microbatch, len,
                               &payload, why, sizeof(why)) != 0;
    if (bad) {
        fprintf(stderr, "rank %d: rejected a frame in %s: %s\n", c->rank, c->op, why);
        comm_die(c);
    }
    size_t g = x->g0 + off / sizeof(float), m = len / sizeof(float);
    if (x->sum != NULL) {
        // one pass: the addend comes from memory once, the sketches (or the
        // squares) taken of what is in registers; the sum may overwrite the
        // addend (in place). Timed apart (sum_ms) from the checks' own
        // passes: its sum is the work of an unchecked receive too
        float *sum = x->sum + off / sizeof(float);
        const float *add = x->addend + off / sizeof(float);
        double t0 = par_now();
        int sketching = x->sk != NULL && x->sk_add != NULL && x->sk_sum != NULL;
        if (sketching) comm_check_covers(c, g, m);
        if (comm_corrupt_sum_due(c, m))
            comm_corrupt_sum(c, x, (const float *)payload, add, sum, g, m);
        else if (sketching) {
            Sketch piece[3];  // this frame's own: its sum checked within its own bound
            sketch_reduce(x->sk, x->sk_add, x->sk_sum, x->sk_frame != NULL ? piece : NULL, c->gen, g,
                          (const float *)payload, add, sum, m);
            if (x->sk_frame != NULL) sketch_piece_note(x->sk_frame, piece, g, m);
        } else if (x->squares)
            c->grad_sumsq += sketch_sum_sumsq((const float *)payload, add, sum, m);
        else
            for (size_t j = 0; j < m; j++) sum[j] = ((const float *)payload)[j] + add[j];
        c->sum_ms += (par_now() - t0) * 1e3;
    } else if (len > 0) {
        memcpy(x->dst + off, payload, len);
        if (x->sk != NULL) comm_sketch(c, x->sk, g, (const float *)(x->dst + off), m, 0);
    }
    x->done++;
    return 1;
}

// comm_run: moves s (may be NULL) and r (may be NULL) frame by frame until
// both are done, interleaved, so a ring of ranks that all send and receive at
// once never deadlocks however large the message. Times out after timeout_s
// without progress.
static inline void comm_run(Comm *c, Xfer *s, Xfer *r) {
    ShmRank *mine = comm_rank_block(c, c->rank);
    double last = par_now(), checked = last, entered = last;
    for (;;) {
        // the bell before looking: a change after this wakes the wait
        uint32_t bell = __atomic_load_n(&mine->bell, __ATOMIC_SEQ_CST);
        int pending = 0, moved = 0;
        if (r != NULL && r->done < r->frames) {
            pending = 1;
            while (r->done < r->frames && comm_try_recv(c, r)) moved = 1;
        }
        if (s != NULL && s->done < s->frames) {
            pending = 1;
            while (s->done < s->frames && (s->gate == NULL || s->done < s->gate->done) && comm_try_send(c, s)) moved = 1;
        }
        if (!pending) {
            __atomic_store_n(&mine->waiting_for, -1, __ATOMIC_SEQ_CST);
            c->wait_ms += (par_now() - entered) * 1e3;
            return;
        }
        if (moved) {
            last = par_now();
            continue;
        }
        int waiting = r != NULL && r->done < r->frames ? r->peer : s->peer;
        int channel = r != NULL && r->done < r->frames ? r->channel : s->channel;
        double now = par_now();
        if (now - last >= c->timeout_s) comm_timeout(c, waiting, channel, now - last);
        if (now - checked > 0.5) {
            // a dead peer ends the wait early (an outside launcher may not stop us)
            pid_t pid;
            if (comm_peer_exited(c, waiting, &pid)) {
                // what it sent before it exited may have come in since the look above
                int more = 0;
                while (r != NULL && r->done < r->frames && comm_try_recv(c, r)) more = 1;
                if (more) continue;
                fprintf(stderr, "rank %d: rank %d (pid %d) has exited; this rank was waiting for it (%s, channel %s, step %ld)\n",
                        c->rank, waiting, (int)pid, c->op, channel_name(channel), c->step);
                comm_die(c);
            }
            checked = now;
        }
        __atomic_store_n(&mine->wait_step, (int64_t)c->step, __ATOMIC_SEQ_CST);
        __atomic_store_n(&mine->wait_op, (uint32_t)c->op_counter, __ATOMIC_SEQ_CST);
        __atomic_store_n(&mine->waiting_for, waiting, __ATOMIC_SEQ_CST);
        double left = c->timeout_s - (now - last);
        if (left > 0.5) left = 0.5;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        syscall(SYS_futex, &mine->bell, FUTEX_WAIT, bell, &ts, NULL, 0);
    }
}

// comm_check_group: a group this rank belongs to, of ranks that exist
static inline void comm_check_group(Comm *c, const Group *g, const char *op) {
    int world = c != NULL ? c->world : 1, rank = c != NULL ? c->rank : 0;
    if (g == NULL || g->size < 1 || g->size > GRID_MAX_WORLD || g->me < 0 || g->me >= g->size)
        comm_usage_die(c, "%s: bad group (size %d, me %d)", op, g != NULL ? g->size : 0, g != NULL ? g->me : 0);
    if (g->ranks[g->me] != rank)
        comm_usage_die(c, "%s: group member %d is rank %d, not this rank %d", op, g->me, g->ranks[g->me], rank);
    for (int i = 0; i < g->size; i++) {
        if (g->ranks[i] < 0 || g->ranks[i] >= world)
            comm_usage_die(c, "%s: group member %d is rank %d, outside the world of %d", op, i, g->ranks[i], world);
    }
}

static inline int comm_next(const Group *g) { return g->ranks[(g->me + 1) % g->size]; }
static inline int comm_prev(const Group *g) { return g->ranks[(g->me + g->size - 1) % g->size]; }
static inline int comm_mod(int a, int n) { return ((a % n) + n) % n; }

// comm_init_check: what both backends' set-up (comm_init, and nccl_init in
// nccl_comm.h) require before they start: a timeout in range, a -fault rank
// that is in the job, and a rendezvous address when there is more than one
// rank to meet. 0, or -1 with err set.
static inline int comm_init_check(const Grid *g, const char *rendezvous, double timeout_s, const Fault *fault, char *err,
                                  size_t errlen) {
    if (!(timeout_s > 0 && timeout_s <= 86400))
        return errorf(err, errlen, "-to %g: the timeout must be > 0 and <= 86400 seconds", timeout_s);
    if (fault_check_world(fault, g->world, err, errlen) != 0) return -1;
    if (g->world > 1 && rendezvous == NULL)
        return errorf(err, errlen, "rank %d: no rendezvous address for a job of %d ranks", g->rank, g->world);
    return 0;
}

// comm_init: joins the job's rendezvous and maps its segment. For a world of
// 1 there is nothing to join and every call is a local no-op or copy.
static inline int comm_init(Comm **out, const Grid *g, const uint8_t key[32], const char *rendezvous, double timeout_s,
                            const Fault *fault, char *err, size_t errlen) {
    *out = NULL;
    if (comm_init_check(g, rendezvous, timeout_s, fault, err, errlen) != 0) return -1;
    Comm *c = (Comm *)calloc(1, sizeof(Comm));
    if (c == NULL) return errorf(err, errlen, "comm_init: out of memory");
    c->rank = g->rank;
    c->world = g->world;
    c->timeout_s = timeout_s;
    c->op = "init";
    if (fault != NULL) c->fault = *fault;
    if (g->world == 1) {
        *out = c;
        return 0;
    }
    RdvAnswer ans;
    if (rdv_join(rendezvous, key, job_id_from_key(key), g->rank, g->world, g->local_rank, NULL,
                 timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s, &ans, err, errlen) != 0) {
        free(c);
        return -1;
    }
    snprintf(c->shm_name, sizeof(c->shm_name), "%s", ans.shm_name);
    memcpy(c->blob, ans.blob, COMM_BLOB_BYTES);
    int fd = shm_open(c->shm_name, O_RDWR | O_CLOEXEC, 0);
    ShmLayout lay = shm_layout(g->world);
    struct stat st;
    int e = fd < 0 ? errno : fstat(fd, &st) != 0 ? errno : 0;
    if (e == 0 && (uint64_t)st.st_size != lay.total_bytes) e = EINVAL;
    void *base = e == 0 ? mmap(NULL, lay.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (e == 0 && base == MAP_FAILED) e = errno;
    if (fd >= 0) close(fd);
    if (e != 0) {
        free(c);
        return errorf(err, errlen, "rank %d: shared memory %s (%llu bytes expected): %s", g->rank, ans.shm_name,
                      (unsigned long long)lay.total_bytes, strerror(e));
    }
    ShmHeader *h = (ShmHeader *)base;
    if (memcmp(h->magic, SHM_MAGIC, 8) != 0 || h->version != SHM_VERSION || h->world != (uint32_t)g->world ||
        h->slots != COMM_SLOTS || h->slot_payload != COMM_SLOT_PAYLOAD || h->job_id != job_id_from_key(key) ||
        h->ring_stride != lay.ring_stride || h->slot_stride != lay.slot_stride || h->rings_offset != lay.rings_offset) {
        munmap(base, lay.total_bytes);
        free(c);
        return errorf(err, errlen, "rank %d: shared memory %s: header is not this job's (world %u, job id %016" PRIx64 ")",
                      g->rank, ans.shm_name, h->world, h->job_id);
    }
    c->base = (uint8_t *)base;
    c->map_bytes = lay.total_bytes;
    c->slot_stride = lay.slot_stride;
    c->ring_stride = lay.ring_stride;
    c->rings_offset = lay.rings_offset;
    ShmRank *mine = comm_rank_block(c, c->rank);
    __atomic_store_n(&mine->waiting_for, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&mine->pid, (uint32_t)getpid(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&mine->pid_ns, par_pid_ns(), __ATOMIC_SEQ_CST);
    if (__atomic_fetch_add(&h->mapped, 1, __ATOMIC_SEQ_CST) + 1 == (uint32_t)g->world) {
        shm_unlink(c->shm_name);  // everyone has it mapped: nobody else can open it now
        c->shm_name[0] = '\0';
    }
    c->frame = (uint8_t *)malloc(frame_bytes(COMM_SLOT_PAYLOAD));
    c->gen = (SketchGen *)malloc(sizeof(SketchGen));
    if (c->frame == NULL || c->gen == NULL || links_init(&c->links, key, g->rank, g->world) != 0) {
        free(c->frame);
        free(c->gen);
        munmap(base, lay.total_bytes);
        free(c);
        return errorf(err, errlen, "rank %d: comm_init: out of memory", g->rank);
    }
    sketch_gen_init(c->gen, key, ans.shm_name);  // this launch's own: fresh random bits every rank got alike
    *out = c;
    return 0;
}

static inline void comm_set_step(Comm *c, long step) {
    if (c != NULL) c->step = step;
}

// comm_set_timeout: for a wait that is known to be long (one rank doing a
// job's serial work while the others wait, as sealing a checkpoint); returns
// the timeout it replaces
static inline double comm_set_timeout(Comm *c, double seconds) {
    if (c == NULL) return seconds;
    double old = c->timeout_s;
    c->timeout_s = seconds;
    return old;
}

// ----------------------------------------------------------------------------
// checked collectives (sketch.h)

// comm_set_check: -ic 1 turns the checks on (off by default, and for world 1
// there is nothing to check)
static inline void comm_set_check(Comm *c, int on) {
    if (c != NULL && c->gen != NULL) c->check = on != 0;
}

// comm_set_label: what the next collective carries ("dp gradients of layer
// 3"), named by the line of a failed check; kept until that collective ends.
// The caller keeps the string alive until then.
static inline void comm_set_label(Comm *c, const char *label) {
    if (c != NULL) c->label = label;
}

// comm_count_grads: the next collective reduces this rank's gradients: the
// sum of squares of what this rank puts in is added to comm_grad_sumsq (from
// the checks' sketch of it, or with the checks off as its frames pass)
static inline void comm_count_grads(Comm *c) {
    if (c != NULL) c->count_grads = 1;
}

// comm_grad_sumsq: that sum since the last call, which starts it afresh
static inline double comm_grad_sumsq(Comm *c) {
    if (c == NULL) return 0.0;
    double v = c->grad_sumsq;
    c->grad_sumsq = 0.0;
    return v;
}

// comm_check_ms: the time spent on the checks so far, in ms: the sketches
// made in passes of their own, the coefficients, the records and verdicts
static inline double comm_check_ms(const Comm *c) { return c != NULL ? c->check_ms : 0.0; }

// comm_sum_ms: the time spent in the reducing receives' passes so far, in
// ms: the sums, and with the checks on the sketches made in the same pass.
// What the checks cost beyond comm_check_ms is this less its figure with
// the checks off (dev/bench_ic.sh)
static inline double comm_sum_ms(const Comm *c) { return c != NULL ? c->sum_ms : 0.0; }

// comm_group_digest: what names a group in the draw of its collectives' r
// (nccl_comm.h's checks draw with it too)
static inline uint64_t comm_group_digest(const Group *grp) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the size and the ranks
    h = (h ^ (uint64_t)grp->size) * 1099511628211ull;
    for (int i = 0; i < grp->size; i++) h = (h ^ (uint64_t)(uint32_t)grp->ranks[i]) * 1099511628211ull;
    return h;
}

// the group's number among those this rank ran collectives on, and how many
// it ran there before: with the step, what makes each collective's r its own
static inline uint64_t comm_group_call(Comm *c, const Group *grp, uint64_t *id) {
    uint64_t h = comm_group_digest(grp);
    *id = h;
    for (int i = 0; i < c->ngroups; i++)
        if (c->group_id[i] == h) return c->group_calls[i]++;
    if (c->ngroups == COMM_MAX_GROUPS)
        comm_usage_die(c, "%s: more than %d groups ran checked collectives on this rank", c->op, COMM_MAX_GROUPS);
    c->group_id[c->ngroups] = h;
    c->group_calls[c->ngroups] = 1;
    c->ngroups++;
    return 0;
}

// comm_check_begin: the checks of one collective over grp of n elements in
// all (the vector r covers): r drawn, this member's record zeroed. 1 when
// this collective is checked.
static inline int comm_check_begin(Comm *c, const Group *grp, int kind, size_t n) {
    if (!c->check) return 0;
    double t0 = par_now();
    size_t count = sketch_rec_count(grp->size), all = count * (size_t)grp->size;
    if (c->recs_cap < all) {
        free(c->recs);
        c->recs = (Sketch *)malloc(all * sizeof(Sketch));
        if (c->recs == NULL) comm_usage_die(c, "%s: out of memory for the checks' records", c->op);
        c->recs_cap = all;
    }
    c->rec = c->recs + count * (size_t)grp->me;  // in place, for the all-gather of the records
    memset(c->rec, 0, count * sizeof(Sketch));
    uint64_t id, call = comm_group_call(c, grp, &id);
    if (sketch_draw(c->gen, c->step, id, call, kind, n) != 0)
        comm_usage_die(c, "%s: out of memory for the checks' coefficients (%zu elements)", c->op, n);
    c->check_ms += (par_now() - t0) * 1e3;
    return 1;
}

// a collective with nothing to check (a group of one): its label and count end
static inline void comm_check_none(Comm *c) {
    if (c == NULL) return;
    c->label = NULL;
    c->count_grads = 0;
}

// sketch i of this member's record when checking, else NULL
static inline Sketch *comm_rec(const Comm *c, int checking, size_t i) { return checking ? c->rec + i : NULL; }

// comm_reduce_hop_checks: what hop s of a ring reduce-scatter (the all-
// reduce's first half too) sketches and counts: at hop 0 the chunk ks this
// member sends, its own input (full: with |r|.|x| and squares); at every hop
// what it receives, its own chunk kr that it adds (full) and the sum, and
// each frame's sum on its own (the worst into the record). squares:
// the checks are off and the gradients counted, so its input's sum of
// squares is taken as it passes instead.
static inline void comm_reduce_hop_checks(const Comm *c, int checking, int squares, int size, int s, int ks, int kr,
                                          Xfer *tx, Xfer *rx) {
    if (s == 0) {
        tx->sk = comm_rec(c, checking, sketch_rec_in(size, ks));
        tx->sk_full = 1;
        tx->squares = squares;
    }
    rx->squares = squares;
    rx->sk = comm_rec(c, checking, sketch_rec_recv(size, s));
    rx->sk_add = comm_rec(c, checking, sketch_rec_in(size, kr));
    rx->sk_sum = comm_rec(c, checking, sketch_rec_out(size, s));
    rx->sk_frame = comm_rec(c, checking, sketch_rec_frame(size, s));
}

// "ranks 0, 2, 4" (the first 16 of a larger group, then how many)
static inline void comm_group_names(const Group *grp, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "rank%s", grp->size > 1 ? "s" : "");
    for (int i = 0; i < grp->size && i < 16 && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? ", " : " ", grp->ranks[i]);
    if (grp->size > 16 && at < len) snprintf(buf + at, len - at, ", ... (%d ranks)", grp->size);
}

// comm_check_end: the records all-gathered (CH_CHECK frames, counted as
// that channel's bytes), judged alike by every member; on a failure the
// group's first member prints the line, the group meets once more so that
// the line is out before any member exits, and every member exits(1)
static inline void comm_check_end(Comm *c, const Group *grp, int kind, size_t n, int checking) {
    const char *label = c->label;
    c->label = NULL;
    int counting = c->count_grads;
    c->count_grads = 0;
    if (!checking) return;
    double t0 = par_now();
    int size = grp->size, me = grp->me, counter = c->op_counter;
    size_t count = sketch_rec_count(size), bytes = count * sizeof(Sketch);
    if (counting)
        for (int k = 0; k < size; k++) c->grad_sumsq += c->rec[sketch_rec_in(size, k)].q;
    c->op_counter = COMM_P2P;  // the records' bytes count under their channel, not the collective
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s, size), kr = comm_mod(me - s - 1, size);
        Xfer tx = xfer_make(comm_next(grp), CH_CHECK, (uint32_t)(1 + counter), bytes);
        Xfer rx = xfer_make(comm_prev(grp), CH_CHECK, (uint32_t)(1 + counter), bytes);
        tx.src = (const uint8_t *)(c->recs + (size_t)ks * count);
        rx.dst = (uint8_t *)(c->recs + (size_t)kr * count);
        comm_run(c, &tx, &rx);
    }
    c->op_counter = counter;
    SketchCase sc;
    sc.kind = kind;
    sc.p = size;
    sc.ranks = grp->ranks;
    sc.n = n;
    sc.recs = c->recs;
    char why[700];
    int bad = sketch_judge(&sc, why, sizeof(why));
    c->check_ms += (par_now() - t0) * 1e3;
    if (!bad) return;
    if (me == 0) {
        char names[200];
        comm_group_names(grp, names, sizeof(names));
        fflush(stdout);
        fprintf(stderr, "rank %d: step %ld: checked %s%s%s over %s failed: %s\n", c->rank, c->step, c->op,
                label != NULL ? " of " : "", label != NULL ? label : "", names, why);
        fflush(stderr);
    }
    for (int s = 0; s < size - 1; s++) {  // comm_barrier's rounds, on the check channel
        Xfer tx = xfer_make(comm_next(grp), CH_CHECK, 0, 0);
        Xfer rx = xfer_make(comm_prev(grp), CH_CHECK, 0, 0);
        comm_run(c, &tx, &rx);
    }
    comm_die(c);
}

// comm_allreduce: ring reduce-scatter, then ring all-gather, in place.
// Element range k = [n*k/size, n*(k+1)/size) is summed along the ring from
// member k+1 to member k, always in that order: ((x[k+1] + x[k+2]) + ...) + x[k].
static inline void comm_allreduce(Comm *c, const Group *grp, float *buf, size_t n, int op) {
    comm_check_group(c, grp, "allreduce");
    if (c != NULL) comm_enter(c, "allreduce", COMM_ALLREDUCE);
    if (op != OP_SUM && op != OP_AVG) comm_usage_die(c, "allreduce: op %d is neither OP_SUM nor OP_AVG", op);
    int size = grp->size, me = grp->me;
    if (size == 1) {
        comm_check_none(c);
        return;
    }
    int ck = comm_check_begin(c, grp, SK_ALLREDUCE, n), squares = c->count_grads && !ck;
    int next = comm_next(grp), prev = comm_prev(grp);
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s - 1, size), kr = comm_mod(me - s - 2, size);
        size_t s0 = n * (size_t)ks / (size_t)size, s1 = n * (size_t)(ks + 1) / (size_t)size;
        size_t r0 = n * (size_t)kr / (size_t)size, r1 = n * (size_t)(kr + 1) / (size_t)size;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (s1 - s0) * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (r1 - r0) * sizeof(float));
        tx.src = (const uint8_t *)(buf + s0);
        tx.g0 = s0;
        rx.sum = buf + r0;
        rx.addend = buf + r0;
        rx.g0 = r0;
        comm_reduce_hop_checks(c, ck, squares, size, s, ks, kr, &tx, &rx);
        comm_run(c, &tx, &rx);
    }
    // my reduced chunk goes out as its last sum left it: that sum's sketch
    // stands for it, and the members that gather it check their copies
    // against it. A sketch of the chunk as sent would cost a pass over it
    // and watch only the moment between the sum and the send
    if (ck) c->rec[sketch_rec_own(size)] = c->rec[sketch_rec_out(size, size - 2)];
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s, size), kr = comm_mod(me - s - 1, size);
        size_t s0 = n * (size_t)ks / (size_t)size, s1 = n * (size_t)(ks + 1) / (size_t)size;
        size_t r0 = n * (size_t)kr / (size_t)size, r1 = n * (size_t)(kr + 1) / (size_t)size;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (s1 - s0) * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (r1 - r0) * sizeof(float));
        tx.src = (const uint8_t *)(buf + s0);
        tx.g0 = s0;
        rx.dst = (uint8_t *)(buf + r0);
        rx.g0 = r0;
        rx.sk = comm_rec(c, ck, sketch_rec_got(size, s));
        comm_run(c, &tx, &rx);
    }
    // the average after the gather, on every member alike (the same bits as
    // dividing before it): the reduced chunk then travels as the sum that the
    // checks tie to its reduce-scatter
    if (op == OP_AVG) for (size_t j = 0; j < n; j++) buf[j] /= (float)size;
    comm_check_end(c, grp, SK_ALLREDUCE, n, ck);
}

// comm_reduce_scatter: in holds size chunks of n_per_rank; out gets chunk
// grp->me summed over the group, in allreduce's order. out may be
// in + me * n_per_rank; otherwise the two must not overlap.
static inline void comm_reduce_scatter(Comm *c, const Group *grp, const float *in, float *out, size_t n_per_rank, int op) {
    comm_check_group(c, grp, "reduce_scatter");
    if (c != NULL) comm_enter(c, "reduce_scatter", COMM_REDUCE_SCATTER);
    if (op != OP_SUM && op != OP_AVG) comm_usage_die(c, "reduce_scatter: op %d is neither OP_SUM nor OP_AVG", op);
    int size = grp->size, me = grp->me;
    size_t n = n_per_rank;
    if (size == 1) {
        if (out != in) memmove(out, in, n * sizeof(float));
        comm_check_none(c);
        return;
    }
    if (c->scratch_floats < 2 * n) {
        free(c->scratch);
        c->scratch = (float *)malloc(2 * n * sizeof(float) + 1);
        if (c->scratch == NULL) comm_usage_die(c, "reduce_scatter: out of memory for %zu floats", 2 * n);
        c->scratch_floats = 2 * n;
    }
    int ck = comm_check_begin(c, grp, SK_REDUCE_SCATTER, n * (size_t)size), squares = c->count_grads && !ck;
    int next = comm_next(grp), prev = comm_prev(grp);
    int k0 = comm_mod(me - 1, size);
    const float *sending = in + (size_t)k0 * n;
    size_t sending_g0 = (size_t)k0 * n;
    for (int s = 0; s < size - 1; s++) {
        int kr = comm_mod(me - s - 2, size);
        float *sum = s == size - 2 ? out : c->scratch + (size_t)(s % 2) * n;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_REDUCE_SCATTER, n * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_REDUCE_SCATTER, n * sizeof(float));
        tx.src = (const uint8_t *)sending;
        tx.g0 = sending_g0;
        rx.sum = sum;
        rx.addend = in + (size_t)kr * n;
        rx.g0 = (size_t)kr * n;
        comm_reduce_hop_checks(c, ck, squares, size, s, k0, kr, &tx, &rx);
        comm_run(c, &tx, &rx);
        sending = sum;
        sending_g0 = (size_t)kr * n;
    }
    if (op == OP_AVG) for (size_t j = 0; j < n; j++) out[j] /= (float)size;
    comm_check_end(c, grp, SK_REDUCE_SCATTER, n, ck);
}

// comm_allgather: out[k*n_per_rank ..] = member k's in; in may be out + me * n_per_rank
static inline void comm_allgather(Comm *c, const Group *grp, const float *in, float *out, size_t n_per_rank) {
    comm_check_group(c, grp, "allgather");
    if (c != NULL) comm_enter(c, "allgather", COMM_ALLGATHER);
    int size = grp->size, me = grp->me;
    size_t n = n_per_rank;
    if (out + (size_t)me * n != in) memmove(out + (size_t)me * n, in, n * sizeof(float));
    if (size == 1) {
        comm_check_none(c);
        return;
    }
    int ck = comm_check_begin(c, grp, SK_ALLGATHER, n * (size_t)size);
    int next = comm_next(grp), prev = comm_prev(grp);
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s, size), kr = comm_mod(me - s - 1, size);
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLGATHER, n * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLGATHER, n * sizeof(float));
        tx.src = (const uint8_t *)(out + (size_t)ks * n);
        tx.g0 = (size_t)ks * n;
        if (s == 0) tx.sk = comm_rec(c, ck, sketch_rec_own(size));
        rx.dst = (uint8_t *)(out + (size_t)kr * n);
        rx.g0 = (size_t)kr * n;
        rx.sk = comm_rec(c, ck, sketch_rec_got(size, s));
        comm_run(c, &tx, &rx);
    }
    comm_check_end(c, grp, SK_ALLGATHER, n, ck);
}

// comm_broadcast: member root_index's bytes to every member, along the ring
// from the root, each member forwarding a piece as soon as it has it
static inline void comm_broadcast(Comm *c, const Group *grp, void *buf, size_t bytes, int root_index) {
    comm_check_group(c, grp, "broadcast");
    if (c != NULL) comm_enter(c, "broadcast", COMM_BROADCAST);
    int size = grp->size;
    if (root_index < 0 || root_index >= size)
        comm_usage_die(c, "broadcast: root index %d is outside the group of %d", root_index, size);
    if (size == 1) return;
    int pos = comm_mod(grp->me - root_index, size);  // 0 is the root, size-1 the end of the chain
    Xfer rx = xfer_make(comm_prev(grp), CH_COLLECTIVE, 1 + COMM_BROADCAST, bytes);
    Xfer tx = xfer_make(comm_next(grp), CH_COLLECTIVE, 1 + COMM_BROADCAST, bytes);
    rx.dst = (uint8_t *)buf;
    tx.src = (const uint8_t *)buf;
    if (pos != 0) tx.gate = &rx;
    comm_run(c, pos == size - 1 ? NULL : &tx, pos == 0 ? NULL : &rx);
}

// comm_barrier: size-1 rounds of an empty message to the next member; after
// round k a member has heard, through the chain, from the k+1 before it
static inline void comm_barrier(Comm *c, const Group *grp) {
    comm_check_group(c, grp, "barrier");
    if (c != NULL) comm_enter(c, "barrier", COMM_BARRIER);
    if (grp->size == 1) return;
    for (int s = 0; s < grp->size - 1; s++) {
        Xfer tx = xfer_make(comm_next(grp), CH_COLLECTIVE, 1 + COMM_BARRIER, 0);
        Xfer rx = xfer_make(comm_prev(grp), CH_COLLECTIVE, 1 + COMM_BARRIER, 0);
        comm_run(c, &tx, &rx);
    }
}

static inline void comm_check_peer(Comm *c, const char *op, int peer, int channel) {
    if (c == NULL) comm_usage_die(c, "%s: no communicator (a single process has no peers)", op);
    if (peer < 0 || peer >= c->world || peer == c->rank)
        comm_usage_die(c, "%s: peer rank %d is not another rank of the world of %d", op, peer, c->world);
    if (channel < 0 || channel >= CH_COUNT || channel == CH_HELLO)
        comm_usage_die(c, "%s: channel %d is not a message channel", op, channel);
}

// comm_send / comm_recv: one message on a channel, stamped with the step and
// micro-batch; the receiver names the same channel, micro-batch and size.
// Messages on a link arrive in the order sent. A send returns once every
// piece is in the ring: one larger than COMM_SLOTS pieces needs the receiver
// to be receiving; two ranks that exchange at once use comm_sendrecv.
static inline void comm_send(Comm *c, int dst_rank, int channel, int microbatch, const void *buf, size_t bytes) {
    comm_check_peer(c, "send", dst_rank, channel);
    comm_enter(c, "send", COMM_P2P);
    Xfer tx = xfer_make(dst_rank, channel, (uint32_t)microbatch, bytes);
    tx.src = (const uint8_t *)buf;
    comm_run(c, &tx, NULL);
}

static inline void comm_recv(Comm *c, int src_rank, int channel, int microbatch, void *buf, size_t bytes) {
    comm_check_peer(c, "recv", src_rank, channel);
    comm_enter(c, "recv", COMM_P2P);
    Xfer rx = xfer_make(src_rank, channel, (uint32_t)microbatch, bytes);
    rx.dst = (uint8_t *)buf;
    comm_run(c, NULL, &rx);
}

// comm_sendrecv: a send and a receive that progress together (NCCL's grouped
// send/recv pair), so neighbours exchanging large messages cannot deadlock
static inline void comm_sendrecv(Comm *c, int dst_rank, int send_channel, int send_microbatch, const void *sendbuf,
                                 size_t send_bytes, int src_rank, int recv_channel, int recv_microbatch, void *recvbuf,
                                 size_t recv_bytes) {
    comm_check_peer(c, "sendrecv", dst_rank, send_channel);
    comm_check_peer(c, "sendrecv", src_rank, recv_channel);
    comm_enter(c, "sendrecv", COMM_P2P);
    Xfer tx = xfer_make(dst_rank, send_channel, (uint32_t)send_microbatch, send_bytes);
    Xfer rx = xfer_make(src_rank, recv_channel, (uint32_t)recv_microbatch, recv_bytes);
    tx.src = (const uint8_t *)sendbuf;
    rx.dst = (uint8_t *)recvbuf;
    comm_run(c, &tx, &rx);
}

// comm_wait_ms: the time this rank has spent in the communicator's calls so
// far, in ms: waiting for its peers, and moving and checking the frames
// (which are quick next to a wait). A rank slower than its peers waits
// little; they wait for it. The trainers' watch report (trainer.h) reads it
// around each step.
static inline double comm_wait_ms(const Comm *c) { return c != NULL ? c->wait_ms : 0.0; }

// wait_since: what a wait clock (comm_wait_ms, or nccl_comm.h's
// nccl_wait_ms) ran since *mark, an earlier reading of it, in ms. *mark
// becomes clock, so the next call counts from here.
static inline double wait_since(double *mark, double clock) {
    double ms = clock - *mark;
    *mark = clock;
    return ms;
}

// comm_get_bytes: payload bytes this rank has sent, per COMM_* counter
// (headers and tags not counted)
static inline void comm_get_bytes(const Comm *c, uint64_t out[COMM_NCOUNTERS]) {
    for (int i = 0; i < COMM_NCOUNTERS; i++) out[i] = c != NULL ? c->sent[i] : 0;
}

static inline void comm_print_bytes(const Comm *c, FILE *f) {
    uint64_t b[COMM_NCOUNTERS];
    comm_get_bytes(c, b);
    fprintf(f, "rank %d bytes sent:", c != NULL ? c->rank : 0);
    for (int i = 0; i < COMM_P2P; i++) fprintf(f, " %s %" PRIu64, comm_counter_name(i), b[i]);
    fprintf(f, " | p2p:");
    for (int ch = 0; ch < CH_COUNT; ch++) {
        if (ch != CH_HELLO) fprintf(f, " %s %" PRIu64, channel_name(ch), b[COMM_P2P + ch]);
    }
    fprintf(f, "\n");
}

static inline void comm_free(Comm *c) {
    if (c == NULL) return;
    if (c->base != NULL) {
        if (c->shm_name[0] != '\0') shm_unlink(c->shm_name);
        munmap(c->base, c->map_bytes);
        links_free(&c->links);
    }
    if (c->gen != NULL) sketch_gen_free(c->gen);
    free(c->gen);
    free(c->recs);
    free(c->flipped);
    free(c->frame);
    free(c->scratch);
    free(c);
}

#endif
