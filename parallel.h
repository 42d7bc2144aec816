/*
 * parallel.h: the rank grid, the launcher, the authenticated rendezvous, and
 * the host backend of the communicator (collectives and point-to-point
 * messages between rank processes of one box, through shared memory).
 * Header-only (llm.c style): every function is static inline.
 *
 * Linux only (futex, signalfd, SO_PEERCRED, /dev/shm). Builds with
 * -std=gnu11, or -std=c11 -D_DEFAULT_SOURCE, whatever was included first.
 * Rank 0 of an outside launch serves the rendezvous from a thread: glibc >=
 * 2.34 needs nothing more, older ones -pthread.
 *
 * doc/parallel.md is the long form of this comment: the grid formula with an
 * example, the launch and rendezvous sequence, the shared-memory layout, the
 * collective algorithms and their byte counts, the timeouts.
 *
 * Grid. rank = ((dp_rank * pp) + pp_rank) * tp + tp_rank: tensor-parallel
 * ranks adjacent, then pipeline stages, then data-parallel replicas. A Group
 * lists the ranks of one dimension in coordinate order, so grp->me is this
 * rank's coordinate in it.
 *
 * Launch. parallel_main() decides what this process is: the launcher (-np N
 * and no rank in the environment: it starts N copies of this program and
 * serves the rendezvous, and never returns), a rank (started by that launcher,
 * or by mpirun / srun / torchrun / a script, with --rendezvous and
 * --key-file), or the single process of a one-rank run.
 *
 * Rendezvous. Each rank sends the root an authenticated hello (a secure.h
 * frame on CH_HELLO) and gets back an authenticated answer naming the job's
 * shared-memory segment and rank 0's 128-byte blob (the NCCL unique id). The
 * root rejects, and logs one line for, a peer of another uid, a wrong key, a
 * wrong job id, a wrong world size, a duplicate rank and a late joiner, and
 * keeps serving the good ones for as long as the job runs.
 *
 * Host backend. One ring of COMM_SLOTS message slots per directed link in one
 * shared-memory segment; every message is a frame (header | payload | HMAC
 * tag) that the receiver checks before using a byte of it. Collectives are
 * rings built from those messages: reduce-scatter and all-gather, all-reduce
 * being one then the other. The reduction order is fixed by the group, so the
 * same inputs give bit-identical outputs on every run and on every member.
 *
 * NCCL backend (CUDA builds, -DLLM3D_NCCL). The same calls on device buffers:
 * a communicator per group split from the world's, non-blocking; calls are
 * queued, not waited for, and a watchdog at the host's wait points aborts the
 * communicators on an error or a timeout. gpu_for_rank, its pure-C decision,
 * is compiled everywhere so the CPU tests check it.
 *
 * C and C++. The header compiles as C11 (the CPU programs) and as C++17
 * (nvcc's host compiler, for train_gpt2.cu): shared-memory fields are plain
 * integers under GCC's __atomic builtins, no compound literals.
 *
 * Failure. The collective and point-to-point calls return nothing: a wait
 * that sees no progress for timeout_s, a frame that fails its check, or a
 * caller's wrong argument prints one line naming this rank, the peer, the
 * operation, the channel and the step, and exits(1); the launcher then ends
 * the job. The set-up calls (grid_*, parallel_main, comm_init) return errors.
 */
#ifndef LLM3D_PARALLEL_H
#define LLM3D_PARALLEL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "secure.h"

#include <arpa/inet.h>
#include <assert.h>
#include <limits.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#define GRID_MAX_WORLD 256          // a Group holds at most this many ranks
#define COMM_SLOTS 8                // messages in flight per directed link
#define COMM_SLOT_PAYLOAD 65536     // payload bytes per message; larger ones go in pieces
#define COMM_BLOB_BYTES 128         // opaque bytes rank 0 hands every rank (NCCL unique id)
#define COMM_NAME_BYTES 64          // shared-memory segment name, NUL included
#define RDV_MIN_TIMEOUT_S 10.0      // starting N processes can take longer than one collective
#define RDV_MAX_PENDING 64          // connections that have not yet sent a complete hello
#define RDV_MAX_MSG 4096            // bytes of one rendezvous message
#define LAUNCH_GRACE_S 2.0          // SIGTERM, then this long, then SIGKILL
#define PARALLEL_USAGE 2            // parallel_main's return for a bad flag or environment
#define PARALLEL_RUNTIME 1          // ... and for anything else

// ----------------------------------------------------------------------------
// the rank grid

typedef struct { int world, rank, local_rank, dp, tp, pp, dp_rank, tp_rank, pp_rank; } Grid;

typedef struct { int size, me, ranks[GRID_MAX_WORLD]; } Group;  // me = my index in ranks[]

// grid_init: the layout of world = dp x pp x tp ranks and this rank's place in
// it. local_rank starts equal to rank; a launcher's LOCAL_RANK goes in after.
static inline int grid_init(Grid *g, int world, int tp, int pp, int rank, char *err, size_t errlen) {
    memset(g, 0, sizeof(*g));
    if (world < 1 || world > GRID_MAX_WORLD)
        return secure_error(err, errlen, "-np %d: the number of ranks must be 1..%d", world, GRID_MAX_WORLD);
    if (tp < 1 || tp > world)
        return secure_error(err, errlen, "-tp %d: the tensor-parallel size must be 1..%d (-np)", tp, world);
    if (pp < 1 || pp > world)
        return secure_error(err, errlen, "-pp %d: the pipeline size must be 1..%d (-np)", pp, world);
    if (world % (tp * pp) != 0)
        return secure_error(err, errlen, "-np %d is not divisible by -tp %d x -pp %d = %d", world, tp, pp, tp * pp);
    if (rank < 0 || rank >= world)
        return secure_error(err, errlen, "rank %d is out of range for -np %d", rank, world);
    g->world = world;
    g->rank = rank;
    g->local_rank = rank;
    g->tp = tp;
    g->pp = pp;
    g->dp = world / (tp * pp);
    g->tp_rank = rank % tp;
    g->pp_rank = (rank / tp) % pp;
    g->dp_rank = rank / (tp * pp);
    return 0;
}

// grid_check_model: the splits the model must allow: heads and the MLP's 4C
// columns across tp, the padded vocabulary across tp, a layer per stage
static inline int grid_check_model(const Grid *g, int L, int NH, int C, int Vp, char *err, size_t errlen) {
    if (L < 1 || NH < 1 || C < 1 || Vp < 1)
        return secure_error(err, errlen, "model shape L %d, NH %d, C %d, Vp %d: every size must be >= 1", L, NH, C, Vp);
    if (NH % g->tp != 0)
        return secure_error(err, errlen, "-tp %d: the model's %d heads (NH) do not split evenly across %d ranks",
                            g->tp, NH, g->tp);
    if ((4 * (long)C) % g->tp != 0)
        return secure_error(err, errlen, "-tp %d: the MLP width 4C = %ld does not split evenly across %d ranks",
                            g->tp, 4 * (long)C, g->tp);
    if (Vp % g->tp != 0)
        return secure_error(err, errlen, "-tp %d: the padded vocabulary Vp = %d does not split evenly across %d ranks",
                            g->tp, Vp, g->tp);
    if (L < g->pp)
        return secure_error(err, errlen, "-pp %d: the model has %d layers (L), fewer than the %d pipeline stages",
                            g->pp, L, g->pp);
    return 0;
}

static inline int grid_rank(const Grid *g, int dp_rank, int pp_rank, int tp_rank) {
    return ((dp_rank * g->pp) + pp_rank) * g->tp + tp_rank;
}

// grid_groups: this rank's groups, members in coordinate order; any may be NULL
static inline void grid_groups(const Grid *g, Group *world, Group *dp, Group *tp, Group *pp) {
    if (world != NULL) {
        world->size = g->world;
        world->me = g->rank;
        for (int r = 0; r < g->world; r++) world->ranks[r] = r;
    }
    if (dp != NULL) {
        dp->size = g->dp;
        dp->me = g->dp_rank;
        for (int d = 0; d < g->dp; d++) dp->ranks[d] = grid_rank(g, d, g->pp_rank, g->tp_rank);
    }
    if (tp != NULL) {
        tp->size = g->tp;
        tp->me = g->tp_rank;
        for (int t = 0; t < g->tp; t++) tp->ranks[t] = grid_rank(g, g->dp_rank, g->pp_rank, t);
    }
    if (pp != NULL) {
        pp->size = g->pp;
        pp->me = g->pp_rank;
        for (int p = 0; p < g->pp; p++) pp->ranks[p] = grid_rank(g, g->dp_rank, p, g->tp_rank);
    }
}

enum { GRID_DP = 0, GRID_TP = 1, GRID_PP = 2 };

// grid_split: the (color, key) that puts this rank in its group of dimension
// dim when a world communicator is split (ncclCommSplit): color numbers the
// group by the rank's other two coordinates, key is its place in the group
// (grp->me), so the split communicator's ranks are the Group's, in order
static inline void grid_split(const Grid *g, int dim, int *color, int *key) {
    if (dim == GRID_DP) {
        *color = g->pp_rank * g->tp + g->tp_rank;
        *key = g->dp_rank;
    } else if (dim == GRID_TP) {
        *color = g->dp_rank * g->pp + g->pp_rank;
        *key = g->tp_rank;
    } else {
        *color = g->dp_rank * g->tp + g->tp_rank;
        *key = g->pp_rank;
    }
}

// ----------------------------------------------------------------------------
// small helpers: clocks, sockets with deadlines

static inline double par_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void par_sleep(double seconds) {
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

// par_wait_fd: 1 when fd is ready for events, 0 at the deadline, -1 on error
static inline int par_wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - par_now();
        if (left <= 0) return 0;
        struct pollfd p;
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        int r = poll(&p, 1, (int)(left * 1000.0) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r > 0) return 1;
    }
}

// par_send_all / par_recv_all on a non-blocking socket: 0 done, -1 error
// (errno), -2 the peer closed, -3 the deadline passed
static inline int par_send_all(int fd, const void *buf, size_t n, double deadline) {
    const uint8_t *p = (const uint8_t *)buf;
    while (n > 0) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r > 0) { p += r; n -= (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno == EPIPE || errno == ECONNRESET ? -2 : -1;
        int w = par_wait_fd(fd, POLLOUT, deadline);
        if (w <= 0) return w == 0 ? -3 : -1;
    }
    return 0;
}

static inline int par_recv_all(int fd, void *buf, size_t n, double deadline) {
    uint8_t *p = (uint8_t *)buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) { p += r; n -= (size_t)r; continue; }
        if (r == 0) return -2;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return errno == ECONNRESET ? -2 : -1;
        int w = par_wait_fd(fd, POLLIN, deadline);
        if (w <= 0) return w == 0 ? -3 : -1;
    }
    return 0;
}

// par_fail: err set from fmt, returns code (for calls whose errors are exit codes)
static inline int par_fail(int code, char *err, size_t errlen, const char *fmt, ...) {
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

static inline const char *par_io_error(int code) {
    if (code == -2) return "the other side closed the connection";
    if (code == -3) return "timed out";
    return strerror(errno);
}

// ----------------------------------------------------------------------------
// rendezvous addresses: unix:PATH or tcp:HOST:PORT

typedef struct {
    int is_unix;
    char spec[256];     // as given, for messages
    char path[108];     // unix: sun_path
    char host[64];      // tcp: dotted IPv4 (localhost means 127.0.0.1)
    int port;
} RdvAddr;

static inline int rdv_parse(const char *spec, RdvAddr *a, char *err, size_t errlen) {
    memset(a, 0, sizeof(*a));
    if (spec == NULL || spec[0] == '\0')
        return secure_error(err, errlen, "--rendezvous: missing value; expected unix:PATH or tcp:HOST:PORT");
    if (strlen(spec) >= sizeof(a->spec))
        return secure_error(err, errlen, "--rendezvous '%.40s...': longer than %zu bytes", spec, sizeof(a->spec) - 1);
    snprintf(a->spec, sizeof(a->spec), "%s", spec);
    if (strncmp(spec, "unix:", 5) == 0) {
        const char *path = spec + 5;
        if (path[0] == '\0' || strlen(path) >= sizeof(a->path))
            return secure_error(err, errlen, "--rendezvous '%s': the socket path must be 1..%zu bytes",
                                spec, sizeof(a->path) - 1);
        a->is_unix = 1;
        snprintf(a->path, sizeof(a->path), "%s", path);
        return 0;
    }
    if (strncmp(spec, "tcp:", 4) == 0) {
        const char *host = spec + 4;
        const char *colon = strrchr(host, ':');
        if (colon == NULL || colon == host || (size_t)(colon - host) >= sizeof(a->host))
            return secure_error(err, errlen, "--rendezvous '%s': expected tcp:HOST:PORT", spec);
        snprintf(a->host, sizeof(a->host), "%.*s", (int)(colon - host), host);
        if (strcmp(a->host, "localhost") == 0) snprintf(a->host, sizeof(a->host), "127.0.0.1");
        struct in_addr ip;
        if (inet_pton(AF_INET, a->host, &ip) != 1)
            return secure_error(err, errlen, "--rendezvous '%s': host '%s' is not an IPv4 address", spec, a->host);
        long port = 0;
        const char *p = colon + 1;
        if (*p == '\0') port = -1;
        for (; *p != '\0' && port >= 0; p++) port = (*p >= '0' && *p <= '9' && port < 100000) ? port * 10 + (*p - '0') : -1;
        if (port < 1 || port > 65535)
            return secure_error(err, errlen, "--rendezvous '%s': port '%s' is not 1..65535", spec, colon + 1);
        a->port = (int)port;
        return 0;
    }
    return secure_error(err, errlen, "--rendezvous '%s': expected unix:PATH or tcp:HOST:PORT", spec);
}

static inline socklen_t rdv_sockaddr(const RdvAddr *a, struct sockaddr_storage *ss) {
    memset(ss, 0, sizeof(*ss));
    if (a->is_unix) {
        struct sockaddr_un *un = (struct sockaddr_un *)ss;
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, a->path, strlen(a->path) + 1);
        return (socklen_t)sizeof(*un);
    }
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)a->port);
    inet_pton(AF_INET, a->host, &in->sin_addr);
    return (socklen_t)sizeof(*in);
}

// rdv_connect: a non-blocking socket connected to the root, retrying while
// the root is not up yet (no socket file, connection refused) until deadline
static inline int rdv_connect(const RdvAddr *a, double deadline, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl = rdv_sockaddr(a, &ss);
    for (;;) {
        int fd = socket(a->is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return secure_error(err, errlen, "rendezvous %s: socket: %s", a->spec, strerror(errno));
        int e = 0;
        if (connect(fd, (struct sockaddr *)&ss, sl) != 0) {
            e = errno;
            if (e == EINPROGRESS) {
                int w = par_wait_fd(fd, POLLOUT, deadline);
                socklen_t el = sizeof(e);
                if (w <= 0) e = w == 0 ? ETIMEDOUT : errno;
                else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
            }
        }
        if (e == 0) return fd;
        close(fd);
        int retry = e == ENOENT || e == ECONNREFUSED || e == EAGAIN || e == EINTR || e == ECONNRESET;
        if (!retry || par_now() >= deadline)
            return secure_error(err, errlen, "rendezvous %s: connect: %s", a->spec, strerror(e));
        par_sleep(0.02);
    }
}

// rdv_listen: the root's listening socket. A unix path left behind by a dead
// job (a socket nobody accepts on) is replaced; a live one is an error.
static inline int rdv_listen(const RdvAddr *a, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl = rdv_sockaddr(a, &ss);
    int fd = socket(a->is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return secure_error(err, errlen, "rendezvous %s: socket: %s", a->spec, strerror(errno));
    if (!a->is_unix) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0) {
        int e = errno;
        struct stat st;
        if (a->is_unix && e == EADDRINUSE && lstat(a->path, &st) == 0 && S_ISSOCK(st.st_mode)) {
            int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            int live = probe >= 0 && connect(probe, (struct sockaddr *)&ss, sl) == 0;
            if (probe >= 0) close(probe);
            if (live) {
                close(fd);
                return secure_error(err, errlen, "rendezvous %s: another job is listening on that socket", a->spec);
            }
            unlink(a->path);
            e = bind(fd, (struct sockaddr *)&ss, sl) == 0 ? 0 : errno;
        }
        if (e != 0) {
            close(fd);
            return secure_error(err, errlen, "rendezvous %s: bind: %s", a->spec, strerror(e));
        }
    }
    if (listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return secure_error(err, errlen, "rendezvous %s: listen: %s", a->spec, strerror(e));
    }
    return fd;
}

// ----------------------------------------------------------------------------
// the shared-memory segment (doc/parallel.md, "host backend", has a picture)
//
//   [0, 4096)            ShmHeader
//   [4096, +64*world)    one ShmRank per rank
//   rings_offset ...     world*world rings, ring (src -> dst) at
//                        rings_offset + (src*world + dst) * ring_stride
//   a ring:              head (64 bytes: written by the sender only), tail (64
//                        bytes: the receiver only), then COMM_SLOTS slots
//   a slot:              u32 frame length, 60 zero bytes, then the frame
//
// head and tail count messages ever sent and ever consumed; head - tail is
// the number waiting. The diagonal rings are never used.

#define SHM_MAGIC "llm3dshm"
#define SHM_VERSION 1
#define SHM_HEADER_BYTES 4096
#define SHM_RANK_BYTES 64
#define SHM_RING_CTL_BYTES 128
#define SHM_SLOT_PREFIX 64

// Fields that several processes change are plain integers touched only
// through GCC's __atomic builtins, which C and C++ (nvcc's host compiler)
// both accept; <stdatomic.h> and <atomic> do not mix in one header.
typedef struct {
    char magic[8];
    uint32_t version, world, slots, slot_payload;
    uint64_t job_id, slot_stride, ring_stride, rings_offset, total_bytes;
    uint32_t mapped;    // ranks that have mapped the segment; the last unlinks its name
} ShmHeader;

typedef struct {
    uint32_t bell;          // bumped by whoever changes a ring this rank may be waiting on
    int32_t waiting_for;    // the rank this one is blocked on, -1 when not blocked
    int64_t wait_step;
    uint32_t wait_op;       // COMM_* counter index of the blocked call
    uint32_t pid;
    uint64_t pid_ns;        // inode of /proc/self/ns/pid: pids compare only within one
    uint8_t pad[SHM_RANK_BYTES - 32];
} ShmRank;

static_assert(sizeof(ShmRank) == SHM_RANK_BYTES, "one ShmRank per 64-byte line");
static_assert(sizeof(ShmHeader) <= SHM_HEADER_BYTES, "the header fits its page");

typedef struct { uint64_t slot_stride, ring_stride, rings_offset, total_bytes; } ShmLayout;

static inline ShmLayout shm_layout(int world) {
    ShmLayout s;
    s.slot_stride = ((uint64_t)SHM_SLOT_PREFIX + frame_bytes(COMM_SLOT_PAYLOAD) + 63) / 64 * 64;
    s.ring_stride = ((uint64_t)SHM_RING_CTL_BYTES + COMM_SLOTS * s.slot_stride + 4095) / 4096 * 4096;
    s.rings_offset = ((uint64_t)SHM_HEADER_BYTES + (uint64_t)world * SHM_RANK_BYTES + 4095) / 4096 * 4096;
    s.total_bytes = s.rings_offset + (uint64_t)world * (uint64_t)world * s.ring_stride;
    return s;
}

// shm_create: a new segment for world ranks under a fresh random name;
// O_EXCL so a name someone planted is an error, never a segment we share
static inline int shm_create(char name[COMM_NAME_BYTES], int world, uint64_t job_id, char *err, size_t errlen) {
    uint8_t rnd[32];
    if (key_generate(rnd, err, errlen) != 0) return -1;
    char hex[17];
    to_hex(rnd, 8, hex);
    hex[16] = '\0';
    snprintf(name, COMM_NAME_BYTES, "/llm3d-%d-%s", (int)getpid(), hex);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return secure_error(err, errlen, "shared memory %s: shm_open: %s", name, strerror(errno));
    ShmLayout lay = shm_layout(world);
    int e = fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)lay.total_bytes) == 0 ? 0 : errno;
    void *base = e == 0 ? mmap(NULL, SHM_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (e == 0 && base == MAP_FAILED) e = errno;
    close(fd);
    if (e != 0) {
        shm_unlink(name);
        return secure_error(err, errlen, "shared memory %s: %llu bytes for %d ranks: %s", name,
                            (unsigned long long)lay.total_bytes, world, strerror(e));
    }
    ShmHeader *h = (ShmHeader *)base;
    memcpy(h->magic, SHM_MAGIC, 8);
    h->version = SHM_VERSION;
    h->world = (uint32_t)world;
    h->slots = COMM_SLOTS;
    h->slot_payload = COMM_SLOT_PAYLOAD;
    h->job_id = job_id;
    h->slot_stride = lay.slot_stride;
    h->ring_stride = lay.ring_stride;
    h->rings_offset = lay.rings_offset;
    h->total_bytes = lay.total_bytes;
    __atomic_store_n(&h->mapped, 0, __ATOMIC_SEQ_CST);
    munmap(base, SHM_HEADER_BYTES);
    return 0;
}

// ----------------------------------------------------------------------------
// rendezvous messages
//
// On the socket every message is u32 length | body. Hello: i32 claimed rank
// | frame (CH_HELLO, step 0, micro-batch 0) of HELLO_BYTES. Answer: 'A' | frame
// of ANSWER_BYTES, or 'R' | the reason in text. The frames use a Links of
// world + 1 members: ranks 0..world-1 and the root as member `world`.

#define HELLO_BYTES (8 + 4 * 4 + 16 + COMM_BLOB_BYTES)
#define ANSWER_BYTES (8 + 4 * 4 + 16 + COMM_NAME_BYTES + COMM_BLOB_BYTES)

typedef struct {
    uint64_t job_id;
    int rank, world, local_rank;
    uint32_t pid;
    uint8_t nonce[16];
    uint8_t blob[COMM_BLOB_BYTES];
} RdvHello;

typedef struct {
    uint64_t job_id;
    int rank, world, local_rank;
    uint32_t root_pid;
    uint8_t nonce[16];              // the hello's, echoed: this answer is for that hello
    char shm_name[COMM_NAME_BYTES];
    uint8_t blob[COMM_BLOB_BYTES];
} RdvAnswer;

static inline void rdv_hello_write(const RdvHello *h, uint8_t *p) {
    put_u64(p, h->job_id);
    put_u32(p + 8, (uint32_t)h->rank);
    put_u32(p + 12, (uint32_t)h->world);
    put_u32(p + 16, (uint32_t)h->local_rank);
    put_u32(p + 20, h->pid);
    memcpy(p + 24, h->nonce, 16);
    memcpy(p + 40, h->blob, COMM_BLOB_BYTES);
}

static inline void rdv_hello_read(const uint8_t *p, RdvHello *h) {
    h->job_id = get_u64(p);
    h->rank = (int)get_u32(p + 8);
    h->world = (int)get_u32(p + 12);
    h->local_rank = (int)get_u32(p + 16);
    h->pid = get_u32(p + 20);
    memcpy(h->nonce, p + 24, 16);
    memcpy(h->blob, p + 40, COMM_BLOB_BYTES);
}

static inline void rdv_answer_write(const RdvAnswer *a, uint8_t *p) {
    put_u64(p, a->job_id);
    put_u32(p + 8, (uint32_t)a->rank);
    put_u32(p + 12, (uint32_t)a->world);
    put_u32(p + 16, (uint32_t)a->local_rank);
    put_u32(p + 20, a->root_pid);
    memcpy(p + 24, a->nonce, 16);
    memcpy(p + 40, a->shm_name, COMM_NAME_BYTES);
    memcpy(p + 40 + COMM_NAME_BYTES, a->blob, COMM_BLOB_BYTES);
}

static inline void rdv_answer_read(const uint8_t *p, RdvAnswer *a) {
    a->job_id = get_u64(p);
    a->rank = (int)get_u32(p + 8);
    a->world = (int)get_u32(p + 12);
    a->local_rank = (int)get_u32(p + 16);
    a->root_pid = get_u32(p + 20);
    memcpy(a->nonce, p + 24, 16);
    memcpy(a->shm_name, p + 40, COMM_NAME_BYTES);
    a->shm_name[COMM_NAME_BYTES - 1] = '\0';
    memcpy(a->blob, p + 40 + COMM_NAME_BYTES, COMM_BLOB_BYTES);
}

// ----------------------------------------------------------------------------
// the rendezvous server (the launcher, or rank 0 of an outside launch)

// SO_PEERCRED's answer; Linux's struct ucred, spelled out so that the header
// builds without _GNU_SOURCE too
typedef struct { pid_t pid; uid_t uid; gid_t gid; } PeerCred;

typedef struct {
    int fd;
    double deadline;    // a complete hello by then, or the connection is dropped
    char who[64];       // "pid 123 uid 1000" or "10.0.0.2:51234", for the log
    size_t got;
    uint8_t buf[4 + RDV_MAX_MSG];
} RdvConn;

typedef struct {
    RdvAddr addr;
    int listen_fd;
    int world;
    uint64_t job_id;
    Links links;                    // world + 1 members, the root is member `world`
    double timeout_s, join_deadline;
    char shm_name[COMM_NAME_BYTES];
    uint8_t blob[COMM_BLOB_BYTES];  // from rank 0's hello
    int joined, answered, expired;
    int rank_fd[GRID_MAX_WORLD];
    uint32_t rank_pid[GRID_MAX_WORLD];
    int rank_local[GRID_MAX_WORLD];
    uint8_t rank_nonce[GRID_MAX_WORLD][16];
    int npending;
    RdvConn pending[RDV_MAX_PENDING];
    int rejected;                   // rejections so far, and the last reason (the tests read them)
    char last_reject[256];
} RdvServer;

// rdv_server_open: listens on spec for world ranks; shm_name is what the
// answers hand out
static inline int rdv_server_open(RdvServer *s, const char *spec, int world, const uint8_t key[32],
                                  const char *shm_name, double timeout_s, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    s->listen_fd = -1;
    if (world < 1 || world > GRID_MAX_WORLD)
        return secure_error(err, errlen, "rendezvous: world %d out of range 1..%d", world, GRID_MAX_WORLD);
    if (rdv_parse(spec, &s->addr, err, errlen) != 0) return -1;
    if (links_init(&s->links, key, world, world + 1) != 0)
        return secure_error(err, errlen, "rendezvous: links for world %d", world);
    s->listen_fd = rdv_listen(&s->addr, err, errlen);
    if (s->listen_fd < 0) {
        links_free(&s->links);
        return -1;
    }
    s->world = world;
    s->job_id = job_id_from_key(key);
    s->timeout_s = timeout_s;
    s->join_deadline = par_now() + timeout_s;
    snprintf(s->shm_name, sizeof(s->shm_name), "%s", shm_name);
    for (int r = 0; r < world; r++) s->rank_fd[r] = -1;
    return 0;
}

static inline void rdv_server_close(RdvServer *s) {
    for (int i = 0; i < s->npending; i++) close(s->pending[i].fd);
    s->npending = 0;
    for (int r = 0; r < s->world; r++) {
        if (s->rank_fd[r] >= 0) close(s->rank_fd[r]);
        s->rank_fd[r] = -1;
    }
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        if (s->addr.is_unix) unlink(s->addr.path);
        links_free(&s->links);
    }
    s->listen_fd = -1;
}

static inline void rdv_server_drop(RdvServer *s, int i) {
    close(s->pending[i].fd);
    s->pending[i] = s->pending[s->npending - 1];
    s->npending--;
}

// rdv_server_reject: logs one line, tells the peer why, hangs up
static inline void rdv_server_reject(RdvServer *s, int i, const char *fmt, ...) {
    char reason[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rendezvous: rejected %s: %s\n", s->pending[i].who, reason);
    snprintf(s->last_reject, sizeof(s->last_reject), "%s", reason);
    s->rejected++;
    uint8_t msg[4 + 1 + sizeof(reason)];
    size_t n = strlen(reason);
    put_u32(msg, (uint32_t)(1 + n));
    msg[4] = 'R';
    memcpy(msg + 5, reason, n);
    par_send_all(s->pending[i].fd, msg, 5 + n, par_now() + 0.5);
    rdv_server_drop(s, i);
}

// rdv_server_hello: judges a complete hello in pending[i]. Checked in an
// order that gives each kind of bad peer its own message: the frame first
// (tag, then the header: job id, world, ...), then the claim itself.
static inline void rdv_server_hello(RdvServer *s, int i) {
    RdvConn *cn = &s->pending[i];
    size_t len = cn->got - 4;
    const uint8_t *body = cn->buf + 4;
    if (len < 4 + FRAME_HEADER_BYTES) {
        rdv_server_reject(s, i, "hello of %zu bytes is too short to hold a frame", len);
        return;
    }
    int claimed = (int)get_u32(body);
    const uint8_t *frame = body + 4;
    size_t frame_len = len - 4;
    if (claimed < 0 || claimed >= s->world) {
        rdv_server_reject(s, i, "rank %d is out of range for this job of %d ranks", claimed, s->world);
        return;
    }
    char why[256];
    const uint8_t *payload = NULL;
    s->links.recv_seq[claimed] = 0;  // every client starts its links afresh
    if (frame_open(&s->links, frame, frame_len, claimed, CH_HELLO, 0, 0, HELLO_BYTES, &payload, why, sizeof(why)) != 0) {
        // a frame sealed with our key but refused anyway has an honest header: say what is in it
        FrameHeader h;
        frame_header_read(frame, &h);
        int tag_ok = 0;
        if (h.payload_len <= RDV_MAX_MSG && frame_len == frame_bytes((size_t)h.payload_len)) {
            uint8_t tag[32];
            hmac_sha256(s->links.key, KEY_BYTES, frame, FRAME_HEADER_BYTES + (size_t)h.payload_len, tag);
            tag_ok = tag_equal(tag, 32, frame + FRAME_HEADER_BYTES + h.payload_len, 32);
        }
        if (!tag_ok)
            rdv_server_reject(s, i, "hello for rank %d has a bad tag: not sealed with this job's key", claimed);
        else if (h.job_id != s->job_id)
            rdv_server_reject(s, i, "hello for rank %d has the wrong job id %016" PRIx64 " (this job is %016" PRIx64 ")",
                              claimed, h.job_id, s->job_id);
        else if (h.dst != (uint32_t)s->world)
            rdv_server_reject(s, i, "hello for rank %d has the wrong world size %u (this job has %d ranks)",
                              claimed, (unsigned)h.dst, s->world);
        else
            rdv_server_reject(s, i, "hello for rank %d: %s", claimed, why);
        return;
    }
    RdvHello h;
    rdv_hello_read(payload, &h);
    if (h.job_id != s->job_id) {
        rdv_server_reject(s, i, "hello for rank %d has the wrong job id %016" PRIx64 " (this job is %016" PRIx64 ")",
                          claimed, h.job_id, s->job_id);
        return;
    }
    if (h.world != s->world) {
        rdv_server_reject(s, i, "hello for rank %d has the wrong world size %d (this job has %d ranks)",
                          claimed, h.world, s->world);
        return;
    }
    if (h.rank != claimed) {
        rdv_server_reject(s, i, "hello claims rank %d outside and rank %d inside", claimed, h.rank);
        return;
    }
    if (s->answered || s->expired) {
        rdv_server_reject(s, i, "late joiner for rank %d: %s", claimed,
                          s->answered ? "all ranks have joined and the job is running" : "the rendezvous timed out");
        return;
    }
    if (s->rank_fd[claimed] >= 0) {
        rdv_server_reject(s, i, "duplicate rank %d (already joined from pid %u)", claimed, (unsigned)s->rank_pid[claimed]);
        return;
    }
    s->rank_fd[claimed] = cn->fd;
    s->rank_pid[claimed] = h.pid;
    s->rank_local[claimed] = h.local_rank;
    memcpy(s->rank_nonce[claimed], h.nonce, 16);
    if (claimed == 0) memcpy(s->blob, h.blob, COMM_BLOB_BYTES);
    s->joined++;
    s->pending[i] = s->pending[s->npending - 1];  // the fd now belongs to rank_fd
    s->npending--;
}

static inline void rdv_server_read(RdvServer *s, int i) {
    RdvConn *cn = &s->pending[i];
    for (;;) {
        size_t want = 4;
        if (cn->got >= 4) want = 4 + (size_t)get_u32(cn->buf);
        ssize_t r = recv(cn->fd, cn->buf + cn->got, want - cn->got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            fprintf(stderr, "rendezvous: dropped %s: closed the connection before a complete hello\n", cn->who);
            rdv_server_drop(s, i);
            return;
        }
        cn->got += (size_t)r;
        if (cn->got == 4 && (get_u32(cn->buf) < 4 || get_u32(cn->buf) > RDV_MAX_MSG)) {
            rdv_server_reject(s, i, "message of %u bytes (a hello is 4..%d)", (unsigned)get_u32(cn->buf), RDV_MAX_MSG);
            return;
        }
        if (cn->got >= 4 && cn->got == 4 + (size_t)get_u32(cn->buf)) {
            rdv_server_hello(s, i);
            return;
        }
    }
}

static inline void rdv_server_accept(RdvServer *s) {
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept(s->listen_fd, (struct sockaddr *)&ss, &sl);
        if (fd < 0 && errno == EINTR) continue;
        if (fd < 0) return;
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fcntl(fd, F_SETFL, O_NONBLOCK);
        char who[64];
        if (s->addr.is_unix) {
            PeerCred cred;
            socklen_t cl = sizeof(cred);
            if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
                fprintf(stderr, "rendezvous: dropped a connection: SO_PEERCRED: %s\n", strerror(errno));
                close(fd);
                continue;
            }
            snprintf(who, sizeof(who), "pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
            if (cred.uid != geteuid()) {
                fprintf(stderr, "rendezvous: rejected %s: not this job's user (uid %u)\n", who, (unsigned)geteuid());
                snprintf(s->last_reject, sizeof(s->last_reject), "uid %u is not this job's user (uid %u)",
                         (unsigned)cred.uid, (unsigned)geteuid());
                s->rejected++;
                close(fd);
                continue;
            }
        } else {
            char ip[INET_ADDRSTRLEN] = "?";
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
            snprintf(who, sizeof(who), "%s:%u", ip, (unsigned)ntohs(in->sin_port));
        }
        if (s->npending == RDV_MAX_PENDING) {
            fprintf(stderr, "rendezvous: dropped %s: %d connections already wait for their hello\n", who, RDV_MAX_PENDING);
            close(fd);
            continue;
        }
        RdvConn *cn = &s->pending[s->npending++];
        cn->fd = fd;
        cn->got = 0;
        cn->deadline = par_now() + s->timeout_s;
        snprintf(cn->who, sizeof(cn->who), "%s", who);
    }
}

// rdv_server_answer: every rank has joined; tell each its assignment
static inline void rdv_server_answer(RdvServer *s) {
    for (int r = 0; r < s->world; r++) {
        RdvAnswer a;
        memset(&a, 0, sizeof(a));
        a.job_id = s->job_id;
        a.rank = r;
        a.world = s->world;
        a.local_rank = s->rank_local[r];
        a.root_pid = (uint32_t)getpid();
        memcpy(a.nonce, s->rank_nonce[r], 16);
        snprintf(a.shm_name, sizeof(a.shm_name), "%s", s->shm_name);
        memcpy(a.blob, s->blob, COMM_BLOB_BYTES);
        uint8_t payload[ANSWER_BYTES];
        rdv_answer_write(&a, payload);
        uint8_t msg[5 + FRAME_HEADER_BYTES + ANSWER_BYTES + FRAME_TAG_BYTES];
        s->links.send_seq[r] = 0;
        frame_seal(&s->links, r, CH_HELLO, 0, 0, payload, ANSWER_BYTES, msg + 5);
        put_u32(msg, (uint32_t)(sizeof(msg) - 4));
        msg[4] = 'A';
        int rc = par_send_all(s->rank_fd[r], msg, sizeof(msg), par_now() + 2.0);
        if (rc != 0) fprintf(stderr, "rendezvous: could not answer rank %d (pid %u): %s\n", r,
                             (unsigned)s->rank_pid[r], par_io_error(rc));
        close(s->rank_fd[r]);
        s->rank_fd[r] = -1;
    }
    s->answered = 1;
}

// rdv_server_expire: drops hellos that never completed, and gives up on the
// job when not every rank joined in time
static inline void rdv_server_expire(RdvServer *s) {
    double now = par_now();
    for (int i = s->npending - 1; i >= 0; i--) {
        if (now > s->pending[i].deadline) {
            fprintf(stderr, "rendezvous: dropped %s: no complete hello within %.1f s\n", s->pending[i].who, s->timeout_s);
            rdv_server_drop(s, i);
        }
    }
    if (s->answered || s->expired || now <= s->join_deadline) return;
    char missing[128] = "";
    size_t n = 0;
    for (int r = 0; r < s->world && n + 8 < sizeof(missing); r++) {
        if (s->rank_fd[r] < 0) n += (size_t)snprintf(missing + n, sizeof(missing) - n, " %d", r);
    }
    fprintf(stderr, "rendezvous: only %d of %d ranks joined within %.1f s; missing rank(s)%s\n",
            s->joined, s->world, s->timeout_s, missing);
    for (int r = 0; r < s->world; r++) {
        if (s->rank_fd[r] >= 0) close(s->rank_fd[r]);
        s->rank_fd[r] = -1;
    }
    s->expired = 1;
}

// rdv_server_step: one round of serving, waiting at most timeout_ms; also
// watches extra_fd (>= 0) and returns 1 when it is readable
static inline int rdv_server_step(RdvServer *s, int extra_fd, int timeout_ms) {
    struct pollfd p[2 + RDV_MAX_PENDING];
    memset(p, 0, sizeof(p));
    int n = 0, extra = -1;
    p[n].fd = s->listen_fd;
    p[n++].events = POLLIN;
    if (extra_fd >= 0) {
        extra = n;
        p[n].fd = extra_fd;
        p[n++].events = POLLIN;
    }
    int first = n, npending = s->npending;
    for (int i = 0; i < npending; i++) {
        p[n].fd = s->pending[i].fd;
        p[n++].events = POLLIN;
    }
    int r = poll(p, (nfds_t)n, timeout_ms);
    if (r < 0) r = 0;  // EINTR: nothing ready this round
    // back to front: dropping pending[i] moves the last one into its place
    for (int i = npending - 1; i >= 0; i--) {
        if (r > 0 && p[first + i].revents != 0) rdv_server_read(s, i);
    }
    if (r > 0 && (p[0].revents & POLLIN)) rdv_server_accept(s);
    rdv_server_expire(s);
    if (s->joined == s->world && !s->answered && !s->expired) rdv_server_answer(s);
    return extra >= 0 && r > 0 && (p[extra].revents & POLLIN) != 0;
}

// ----------------------------------------------------------------------------
// the rendezvous client: one hello, one answer

// rdv_join: joins the job at spec as rank of world. job_id is normally
// job_id_from_key(key) (the tests pass others); blob_in (rank 0's, may be
// NULL) is what every rank gets back in ans->blob.
static inline int rdv_join(const char *spec, const uint8_t key[32], uint64_t job_id, int rank, int world,
                           int local_rank, const uint8_t *blob_in, double timeout_s, RdvAnswer *ans,
                           char *err, size_t errlen) {
    memset(ans, 0, sizeof(*ans));
    RdvAddr addr;
    if (rdv_parse(spec, &addr, err, errlen) != 0) return -1;
    if (world < 1 || world > GRID_MAX_WORLD || rank < 0 || rank >= world)
        return secure_error(err, errlen, "rendezvous %s: rank %d of world %d is out of range", spec, rank, world);
    RdvHello h;
    memset(&h, 0, sizeof(h));
    h.job_id = job_id;
    h.rank = rank;
    h.world = world;
    h.local_rank = local_rank;
    h.pid = (uint32_t)getpid();
    uint8_t rnd[32];
    if (key_generate(rnd, err, errlen) != 0) return -1;
    memcpy(h.nonce, rnd, 16);
    if (blob_in != NULL) memcpy(h.blob, blob_in, COMM_BLOB_BYTES);
    Links hl;
    if (links_init(&hl, key, rank, world + 1) != 0)
        return secure_error(err, errlen, "rendezvous %s: links for rank %d of %d", spec, rank, world);
    hl.job_id = job_id;
    uint8_t payload[HELLO_BYTES];
    rdv_hello_write(&h, payload);
    uint8_t msg[8 + FRAME_HEADER_BYTES + HELLO_BYTES + FRAME_TAG_BYTES];
    put_u32(msg, (uint32_t)(sizeof(msg) - 4));
    put_u32(msg + 4, (uint32_t)rank);
    frame_seal(&hl, world, CH_HELLO, 0, 0, payload, HELLO_BYTES, msg + 8);

    double deadline = par_now() + timeout_s;
    int fd = rdv_connect(&addr, deadline, err, errlen);
    if (fd < 0) {
        links_free(&hl);
        return -1;
    }
    uint8_t in[4 + RDV_MAX_MSG];
    int rc = par_send_all(fd, msg, sizeof(msg), deadline);
    if (rc == 0) rc = par_recv_all(fd, in, 4, deadline);
    uint32_t n = rc == 0 ? get_u32(in) : 0;
    if (rc == 0 && (n < 1 || n > RDV_MAX_MSG)) {
        close(fd);
        links_free(&hl);
        return secure_error(err, errlen, "rendezvous %s: answer of %u bytes (at most %d)", spec, (unsigned)n, RDV_MAX_MSG);
    }
    if (rc == 0) rc = par_recv_all(fd, in + 4, n, deadline);
    close(fd);
    if (rc != 0) {
        links_free(&hl);
        return secure_error(err, errlen, "rendezvous %s: rank %d waiting %.1f s for the root's answer: %s", spec,
                            rank, timeout_s, par_io_error(rc));
    }
    if (in[4] == 'R') {
        char reason[201];
        size_t m = n - 1 < 200 ? n - 1 : 200;
        for (size_t k = 0; k < m; k++) reason[k] = (in[5 + k] >= 32 && in[5 + k] < 127) ? (char)in[5 + k] : '?';
        reason[m] = '\0';
        links_free(&hl);
        return secure_error(err, errlen, "rendezvous %s: the root rejected rank %d: %s", spec, rank, reason);
    }
    const uint8_t *p = NULL;
    char why[256];
    if (in[4] != 'A' || frame_open(&hl, in + 5, n - 1, world, CH_HELLO, 0, 0, ANSWER_BYTES, &p, why, sizeof(why)) != 0) {
        links_free(&hl);
        return secure_error(err, errlen, "rendezvous %s: bad answer from the root: %s", spec,
                            in[4] != 'A' ? "neither 'A' nor 'R'" : why);
    }
    links_free(&hl);
    rdv_answer_read(p, ans);
    if (ans->job_id != job_id || ans->rank != rank || ans->world != world || memcmp(ans->nonce, h.nonce, 16) != 0)
        return secure_error(err, errlen, "rendezvous %s: the answer is for rank %d of %d, not for this hello of rank %d of %d",
                            spec, ans->rank, ans->world, rank, world);
    if (ans->shm_name[0] != '/' || strchr(ans->shm_name + 1, '/') != NULL)
        return secure_error(err, errlen, "rendezvous %s: shared memory name '%s' is not /NAME", spec, ans->shm_name);
    return 0;
}

// ----------------------------------------------------------------------------
// launch: the launcher, ranks started by it or by an outside launcher

enum { LAUNCH_SINGLE = 0, LAUNCH_RANK = 1 };

typedef struct {
    int mode;                   // LAUNCH_SINGLE or LAUNCH_RANK
    int rank, world, local_rank;
    const char *source;         // where rank and world came from: "LLM3D_*", "torchrun", "Open MPI", "Slurm"
    char rendezvous[256];       // for comm_init
    uint8_t key[32];
    RdvServer *server;          // rank 0 of an outside launch serves the rendezvous ...
    pthread_t server_thread;    // ... from this thread, until launch_free
    int server_stop;            // set by launch_free (atomic), read by the thread
} Launch;

// par_env_int: *out from the decimal in env name, within [lo, hi]; 0 when
// absent (out untouched), 1 when read, -1 (err set) when malformed
static inline int par_env_int(const char *name, int lo, int hi, int *out, char *err, size_t errlen) {
    const char *v = getenv(name);
    if (v == NULL) return 0;
    long x = 0;
    const char *p = v;
    if (*p == '\0') x = -1;
    for (; *p != '\0' && x >= 0; p++) x = (*p >= '0' && *p <= '9' && x < 100000000) ? x * 10 + (*p - '0') : -1;
    if (x < lo || x > hi) return secure_error(err, errlen, "environment %s='%s': expected an integer %d..%d", name, v, lo, hi);
    *out = (int)x;
    return 1;
}

// par_env_rank: rank, world and local rank from the first convention whose
// rank variable is set. 1 found, 0 none, -1 malformed (err set).
static inline int par_env_rank(Launch *L, int foreign, char *err, size_t errlen) {
    static const char *conv[4][4] = {
        {"LLM3D_RANK", "LLM3D_WORLD", "LLM3D_LOCAL_RANK", "LLM3D_*"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"},
    };
    for (int k = 0; k < (foreign ? 4 : 1); k++) {
        int rank = -1, world = -1, local = -1;
        int got = par_env_int(conv[k][0], 0, GRID_MAX_WORLD - 1, &rank, err, errlen);
        if (got < 0) return -1;
        if (got == 0) continue;
        got = par_env_int(conv[k][1], 1, GRID_MAX_WORLD, &world, err, errlen);
        if (got < 0) return -1;
        if (got == 0) return secure_error(err, errlen, "environment %s=%d is set but %s is not", conv[k][0], rank, conv[k][1]);
        if (rank >= world) return secure_error(err, errlen, "environment %s=%d is not below %s=%d",
                                               conv[k][0], rank, conv[k][1], world);
        local = rank;
        if (par_env_int(conv[k][2], 0, GRID_MAX_WORLD - 1, &local, err, errlen) < 0) return -1;
        L->rank = rank;
        L->world = world;
        L->local_rank = local;
        L->source = conv[k][3];
        return 1;
    }
    return 0;
}

static inline void *rdv_server_thread(void *arg) {
    Launch *L = (Launch *)arg;
    while (!__atomic_load_n(&L->server_stop, __ATOMIC_SEQ_CST)) rdv_server_step(L->server, -1, 100);
    return NULL;
}

// launch_free: stops rank 0's rendezvous thread (if any) and forgets the key
static inline void launch_free(Launch *L) {
    if (L->server != NULL) {
        __atomic_store_n(&L->server_stop, 1, __ATOMIC_SEQ_CST);
        pthread_join(L->server_thread, NULL);
        shm_unlink(L->server->shm_name);  // normally gone already: the last rank to map it unlinks it
        rdv_server_close(L->server);
        free(L->server);
        L->server = NULL;
    }
    secure_wipe(L->key, sizeof(L->key));
}

// launch_serve: rank 0 of an outside launch creates the segment and serves
// the rendezvous from a thread
static inline int launch_serve(Launch *L, double timeout_s, char *err, size_t errlen) {
    char shm_name[COMM_NAME_BYTES];
    if (shm_create(shm_name, L->world, job_id_from_key(L->key), err, errlen) != 0) return -1;
    L->server = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (L->server == NULL) {
        shm_unlink(shm_name);
        return secure_error(err, errlen, "rendezvous: out of memory");
    }
    if (rdv_server_open(L->server, L->rendezvous, L->world, L->key, shm_name, timeout_s, err, errlen) != 0) {
        shm_unlink(shm_name);
        free(L->server);
        L->server = NULL;
        return -1;
    }
    __atomic_store_n(&L->server_stop, 0, __ATOMIC_SEQ_CST);
    int e = pthread_create(&L->server_thread, NULL, rdv_server_thread, L);
    if (e != 0) {
        shm_unlink(shm_name);
        rdv_server_close(L->server);
        free(L->server);
        L->server = NULL;
        return secure_error(err, errlen, "rendezvous: pthread_create: %s", strerror(e));
    }
    return 0;
}

// launcher_stop: SIGTERM to every live rank, then SIGKILL after the grace period
static inline void launcher_stop(pid_t *pids, int np, double *kill_at) {
    for (int i = 0; i < np; i++) {
        if (pids[i] > 0) kill(pids[i], SIGTERM);
    }
    *kill_at = par_now() + LAUNCH_GRACE_S;
}

// launcher_run: the launcher. Makes the key (or reads --key-file's: the
// ranks it starts see that flag too and take the key from it), the socket in a fresh 0700
// directory and the segment, starts np copies of this program, serves the
// rendezvous, and waits: the first rank to fail ends the job, and the
// launcher exits with that rank's status (1 when it was killed). Returns only
// when it could not get going (err set).
static inline int launcher_run(char **argv, int np, double timeout_s, const char *key_file, char *err, size_t errlen) {
    char exe[4096];
    ssize_t el = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (el <= 0) snprintf(exe, sizeof(exe), "%s", argv[0]);
    else exe[el] = '\0';
    uint8_t key[32];
    if (key_file != NULL && key_read_file(key_file, key, err, errlen) != 0) return PARALLEL_USAGE;
    if (key_file == NULL && key_generate(key, err, errlen) != 0) return PARALLEL_RUNTIME;
    const char *tmp = getenv("TMPDIR");
    char dir[256], spec[300];
    snprintf(dir, sizeof(dir), "%s/llm3d-XXXXXX", tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 200 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) return par_fail(PARALLEL_RUNTIME, err, errlen, "launcher: mkdtemp %s: %s", dir, strerror(errno));
    snprintf(spec, sizeof(spec), "unix:%s/rendezvous.sock", dir);
    char shm_name[COMM_NAME_BYTES];
    if (shm_create(shm_name, np, job_id_from_key(key), err, errlen) != 0) {
        rmdir(dir);
        return PARALLEL_RUNTIME;
    }
    RdvServer *srv = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (srv == NULL || rdv_server_open(srv, spec, np, key, shm_name, timeout_s, err, errlen) != 0) {
        if (srv == NULL) secure_error(err, errlen, "launcher: out of memory");
        free(srv);
        shm_unlink(shm_name);
        rmdir(dir);
        return PARALLEL_RUNTIME;
    }
    // child exits and the signals that end the job arrive through a signalfd
    // polled with the rendezvous socket: no handler, no global flag
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);  // a rank that dies before reading its key must not take us down
    pid_t me = getpid();
    pid_t pids[GRID_MAX_WORLD];
    memset(pids, 0, sizeof(pids));
    int started = 0, failed = 0;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < np && !failed; i++) {
        int kfd[2];
        if (pipe(kfd) != 0 || fcntl(kfd[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(kfd[1], F_SETFD, FD_CLOEXEC) != 0) {
            secure_error(err, errlen, "launcher: pipe for rank %d: %s", i, strerror(errno));
            failed = 1;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);  // the ranks never outlive the launcher
            if (getppid() != me) _exit(1);
            sigprocmask(SIG_SETMASK, &old, NULL);
            signal(SIGPIPE, SIG_DFL);
            close(kfd[1]);
            fcntl(kfd[0], F_SETFD, 0);  // this one pipe, and no other, survives the exec
            char v[32];
            snprintf(v, sizeof(v), "%d", i); setenv("LLM3D_RANK", v, 1); setenv("LLM3D_LOCAL_RANK", v, 1);
            snprintf(v, sizeof(v), "%d", np); setenv("LLM3D_WORLD", v, 1);
            snprintf(v, sizeof(v), "%d", kfd[0]); setenv("LLM3D_KEY_FD", v, 1);
            snprintf(v, sizeof(v), "%d", (int)me); setenv("LLM3D_LAUNCHER_PID", v, 1);
            setenv("LLM3D_RENDEZVOUS", spec, 1);
            execv(exe, argv);
            fprintf(stderr, "launcher: rank %d: exec %s: %s\n", i, exe, strerror(errno));
            _exit(127);
        }
        close(kfd[0]);
        if (pid < 0) {
            secure_error(err, errlen, "launcher: fork for rank %d: %s", i, strerror(errno));
            close(kfd[1]);
            failed = 1;
            break;
        }
        pids[i] = pid;
        started++;
        key_write_fd(kfd[1], key, NULL, 0);  // a rank that does not get its key says so itself
        close(kfd[1]);
    }
    secure_wipe(key, sizeof(key));
    double kill_at = 0;
    int alive = started, stopping = 0, draining = 0;
    if (failed) {
        fprintf(stderr, "%s\n", err);
        launcher_stop(pids, np, &kill_at);
        stopping = 1;
    }
    while (alive > 0) {
        if (rdv_server_step(srv, sfd, 100)) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                if (si.ssi_signo == SIGCHLD) continue;
                if (!draining && !stopping) {
                    // the first one: the ranks get SIGTERM and may finish their step
                    // (the trainer then checkpoints) and exit 0, taking their time
                    fprintf(stderr, "launcher: got signal %u; asking the ranks to stop (a second signal kills them)\n",
                            si.ssi_signo);
                    for (int i = 0; i < np; i++) if (pids[i] > 0) kill(pids[i], SIGTERM);
                    draining = 1;
                } else if (draining && !stopping) {
                    fprintf(stderr, "launcher: got signal %u again; killing the ranks\n", si.ssi_signo);
                    for (int i = 0; i < np; i++) if (pids[i] > 0) kill(pids[i], SIGKILL);
                    failed = 1;
                    stopping = 1;
                }
            }
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            int rank = -1;
            for (int i = 0; i < np; i++) if (pids[i] == pid) rank = i;
            if (rank < 0) continue;
            pids[rank] = 0;
            alive--;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok && !stopping) {
                if (WIFEXITED(status)) fprintf(stderr, "rank %d exited with status %d\n", rank, WEXITSTATUS(status));
                else fprintf(stderr, "rank %d killed by signal %d\n", rank, WTERMSIG(status));
                failed = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
                launcher_stop(pids, np, &kill_at);
                stopping = 1;
            }
        }
        if (srv->expired && !stopping) {
            failed = 1;
            launcher_stop(pids, np, &kill_at);
            stopping = 1;
        }
        if (stopping && kill_at > 0 && par_now() > kill_at) {
            for (int i = 0; i < np; i++) if (pids[i] > 0) kill(pids[i], SIGKILL);
            kill_at = 0;
        }
    }
    rdv_server_close(srv);
    free(srv);
    shm_unlink(shm_name);  // normally gone already: the last rank to map it unlinks it
    rmdir(dir);
    exit(failed);
}

// parallel_main: call first thing in main(), with the trainer's -np,
// --rendezvous, --key-file (NULL when absent) and -to. In the launcher it
// never returns. Otherwise it returns 0 with L filled in (mode, rank, world,
// local rank, key, rendezvous) or PARALLEL_USAGE / PARALLEL_RUNTIME with err
// set, for main() to print and exit with.
//
//   LLM3D_RANK in the environment           a rank: LLM3D_WORLD, LLM3D_LOCAL_RANK,
//                                            rendezvous from --rendezvous or LLM3D_RENDEZVOUS,
//                                            key from --key-file or LLM3D_KEY_FD
//   --rendezvous given                      a rank of an outside launcher: rank and world from
//                                            RANK/WORLD_SIZE/LOCAL_RANK (torchrun), OMPI_COMM_WORLD_*,
//                                            or SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; --key-file
//   otherwise, -np > 1                      the launcher
//   otherwise                               a single process (world 1)
//
// Rank 0 serves the rendezvous itself (a thread) unless LLM3D_LAUNCHER_PID
// says our launcher does.
static inline int parallel_main(int argc, char **argv, int np, const char *rendezvous, const char *key_file,
                                double timeout_s, Launch *L, char *err, size_t errlen) {
    memset(L, 0, sizeof(*L));
    L->source = "none";
    (void)argc;
    if (np < 1 || np > GRID_MAX_WORLD)
        return par_fail(PARALLEL_USAGE, err, errlen, "-np %d: the number of ranks must be 1..%d", np, GRID_MAX_WORLD);
    if (!(timeout_s > 0 && timeout_s <= 86400))
        return par_fail(PARALLEL_USAGE, err, errlen, "-to %g: the timeout must be > 0 and <= 86400 seconds", timeout_s);
    if (rendezvous != NULL) {
        RdvAddr a;
        if (rdv_parse(rendezvous, &a, err, errlen) != 0) return PARALLEL_USAGE;
    }
    int own = getenv("LLM3D_RANK") != NULL;
    int found = par_env_rank(L, rendezvous != NULL && !own, err, errlen);
    if (found < 0) return PARALLEL_USAGE;
    if (found == 0 && rendezvous != NULL)
        return par_fail(PARALLEL_USAGE, err, errlen, "--rendezvous %s: no rank in the environment (LLM3D_RANK, RANK, "
                        "OMPI_COMM_WORLD_RANK or SLURM_PROCID)", rendezvous);
    if (found == 0) {
        if (np == 1) {
            L->mode = LAUNCH_SINGLE;
            L->world = 1;
            if (key_generate(L->key, err, errlen) != 0) return PARALLEL_RUNTIME;
            return 0;
        }
        return launcher_run(argv, np, timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s, key_file, err, errlen);
    }
    const char *spec = rendezvous != NULL ? rendezvous : getenv("LLM3D_RENDEZVOUS");
    if (spec == NULL)
        return par_fail(PARALLEL_USAGE, err, errlen, "rank %d (%s): no --rendezvous (nor LLM3D_RENDEZVOUS) to join",
                        L->rank, L->source);
    if (strlen(spec) >= sizeof(L->rendezvous))
        return par_fail(PARALLEL_USAGE, err, errlen, "rendezvous '%.40s...' is too long", spec);
    snprintf(L->rendezvous, sizeof(L->rendezvous), "%s", spec);
    if (np > 1 && np != L->world)
        return par_fail(PARALLEL_USAGE, err, errlen, "-np %d, but the launcher (%s) says the world is %d", np, L->source,
                        L->world);
    if (key_file != NULL) {
        if (key_read_file(key_file, L->key, err, errlen) != 0) return PARALLEL_USAGE;
    } else {
        int fd = -1;
        int got = par_env_int("LLM3D_KEY_FD", 0, INT_MAX, &fd, err, errlen);
        if (got < 0) return PARALLEL_USAGE;
        if (got == 0)
            return par_fail(PARALLEL_USAGE, err, errlen, "rank %d (%s): no --key-file (nor LLM3D_KEY_FD) for the job key",
                            L->rank, L->source);
        int rc = key_read_fd(fd, L->key, err, errlen);
        close(fd);
        if (rc != 0) return PARALLEL_RUNTIME;
    }
    L->mode = LAUNCH_RANK;
    if (L->rank == 0 && getenv("LLM3D_LAUNCHER_PID") == NULL) {
        if (launch_serve(L, timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s, err, errlen) != 0)
            return PARALLEL_RUNTIME;
    }
    return 0;
}

// parallel_world: how many ranks the job will have, known before joining it
// (a trainer checks the batch split and the layout first): the outside
// launcher's world when --rendezvous is given and its variables are set,
// else np
static inline int parallel_world(int np, const char *rendezvous) {
    Launch L;
    char err[256];
    memset(&L, 0, sizeof(L));
    int foreign = rendezvous != NULL && getenv("LLM3D_RANK") == NULL;
    return foreign && par_env_rank(&L, 1, err, sizeof(err)) > 0 ? L.world : np;
}

// parallel_launched_rank: whether this process is a rank our own launcher
// started (it checked the job moments before)
static inline int parallel_launched_rank(void) { return getenv("LLM3D_LAUNCHER_PID") != NULL; }

// parallel_join: what a trainer's main() calls first: parallel_main (in the
// launcher it never returns), then this process's place in the grid of
// world = dp x pp x tp ranks. Returns 0, or PARALLEL_USAGE / PARALLEL_RUNTIME
// with err set.
static inline int parallel_join(int argc, char **argv, int np, int tp, int pp, const char *rendezvous,
                                const char *key_file, double timeout_s, Launch *L, Grid *g, char *err, size_t errlen) {
    int rc = parallel_main(argc, argv, np, rendezvous, key_file, timeout_s, L, err, errlen);
    if (rc != 0) return rc;
    int world = L->mode == LAUNCH_RANK ? L->world : 1;
    if (grid_init(g, world, tp, pp, L->rank, err, errlen) != 0) return PARALLEL_USAGE;
    g->local_rank = L->local_rank;
    return 0;
}

// ----------------------------------------------------------------------------
// pipeline schedules: the order in which stage `stage` of pp runs the forward
// (F) and backward (B) passes of the M micro-batches of one step. Both
// trainers run exactly this list; doc/parallel.md draws it as a time chart.
//   gpipe: F0 F1 .. F(M-1) B0 B1 .. B(M-1)         (M activation sets)
//   1f1b:  pp - stage - 1 forwards to fill the pipe, then one forward and one
//          backward in turn, then the remaining backwards (PipeDream-flush);
//          at most pp - stage micro-batches are in flight, so that many
//          activation sets suffice.
// No order deadlocks: a stage's k-th forward needs only forwards k of the
// stages before it, its k-th backward only backwards k of the stages after,
// and every stage runs its forwards and its backwards in micro-batch order.

typedef struct { int forward, mb; } PipeOp;

static inline PipeOp pipe_op(int forward, int mb) { PipeOp op; op.forward = forward; op.mb = mb; return op; }

// fills ops (2M entries) and returns their count, 2M
static inline int pipeline_schedule(int gpipe, int pp, int stage, int M, PipeOp *ops) {
    int n = 0, next_f = 0, next_b = 0;
    int warmup = gpipe ? M : pp - stage - 1 < M ? pp - stage - 1 : M;
    while (next_f < warmup) ops[n++] = pipe_op(1, next_f++);
    while (next_f < M) {
        ops[n++] = pipe_op(1, next_f++);
        ops[n++] = pipe_op(0, next_b++);
    }
    while (next_b < M) ops[n++] = pipe_op(0, next_b++);
    return n;
}

// activation sets a stage needs: the most micro-batches between their forward and backward
static inline int pipeline_inflight(int gpipe, int pp, int stage, int M) {
    int k = gpipe ? M : pp - stage;
    return k < M ? k : M;
}

// the idle fraction of a step when F and B take the same time on every stage
static inline double pipeline_bubble(int pp, int M) { return (double)(pp - 1) / (M + pp - 1); }

// where (forward, mb) sits in a stage's n ops; -1 if it is not there
static inline int pipeline_find(const PipeOp *ops, int n, int forward, int mb) {
    for (int i = 0; i < n; i++)
        if (ops[i].forward == forward && ops[i].mb == mb) return i;
    return -1;
}

// pipeline_play: plays one step of pp stages against each other, each stage
// running its 2M ops (ops + s * 2M) in order; for the tests and
// dev/pipeline_chart. start (pp x 2M) gets the time each op starts: once the
// stage's previous op has ended and the op's input is there. Forward k of
// stage s needs forward k of stage s-1 (the activations), backward k needs
// backward k of stage s+1 (their gradient) and forward k of its own stage.
// A message takes no time and a send never blocks (the host backend's do,
// above 512 KiB: pipeline_check below plays the messages with sends that
// block; doc/parallel.md, "And the transport"). Returns the time the
// step ends, or -1 when the stages are stuck (some op can never run).
static inline int pipeline_play(int pp, int M, int f_time, int b_time, const PipeOp *ops, int *start) {
    if (pp < 1 || M < 1) return -1;
    int n = 2 * M;
    for (int i = 0; i < pp * n; i++) start[i] = -1;
    // sweep the stages, each running ops while their inputs are there, until
    // a sweep runs nothing
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            const PipeOp *my = ops + s * n;
            int *my_start = start + s * n;
            for (int i = 0; i < n; i++) {
                if (my_start[i] >= 0) continue;
                int t = i == 0 ? 0 : my_start[i - 1] + (my[i - 1].forward ? f_time : b_time);
                int from = my[i].forward ? s - 1 : s + 1;  // the stage that sends this op its input
                if (from >= 0 && from < pp) {
                    int j = pipeline_find(ops + from * n, n, my[i].forward, my[i].mb);
                    if (j < 0 || start[from * n + j] < 0) break;
                    int arrives = start[from * n + j] + (my[i].forward ? f_time : b_time);
                    if (arrives > t) t = arrives;
                }
                if (!my[i].forward) {  // the activations of its own forward, which runs earlier in the list
                    int j = pipeline_find(my, n, 1, my[i].mb);
                    if (j < 0 || j > i) break;
                }
                my_start[i] = t;
                progress = 1;
            }
        }
    }
    int end = 0;
    for (int s = 0; s < pp; s++) {
        const int last = s * n + n - 1;
        if (start[last] < 0) return -1;
        int stage_end = start[last] + (ops[last].forward ? f_time : b_time);
        if (stage_end > end) end = stage_end;
    }
    return end;
}

// pipeline_simulate: every stage's schedule into ops (pp x 2M), then plays it
static inline int pipeline_simulate(int gpipe, int pp, int M, int f_time, int b_time, PipeOp *ops, int *start) {
    if (pp < 1 || M < 1) return -1;
    for (int s = 0; s < pp; s++) pipeline_schedule(gpipe, pp, s, M, ops + s * 2 * M);
    return pipeline_play(pp, M, f_time, b_time, ops, start);
}

// the message plan: which messages a stage posts around each op, and which
// of them go together. A send blocks once its message outgrows the host
// ring (and on NCCL), so two neighbours that both send first wait on each
// other, as 1f1b's neighbours do where a forward meets a backward. The plan
// posts such a send together with the receive of the next op's input, when
// that input comes from the same neighbour, as one exchange (comm_sendrecv;
// Megatron's send_forward_recv_backward and send_backward_recv_forward).
// Both trainers post exactly these messages; pipeline_check plays them.

typedef struct { int peer, channel, mb; } PipeMsg;  // to or from stage peer; peer -1: no message

typedef struct {
    PipeOp op;
    PipeMsg recv;       // before the op: its input, alone (none on the edge stage, or when it came with the exchange before)
    PipeMsg send;       // after the op: its output (none on the edge stage)
    PipeMsg next_recv;  // posted with send as one exchange: the next op's input (none: send alone)
} PipeStep;

static inline PipeMsg pipe_msg(int peer, int channel, int mb) { PipeMsg m; m.peer = peer; m.channel = channel; m.mb = mb; return m; }
static const PipeMsg PIPE_NONE = {-1, 0, 0};

// what op needs first: a forward, stage-1's activations; a backward, stage+1's gradient
static inline PipeMsg pipe_input(int pp, int stage, PipeOp op) {
    if (op.forward) return stage > 0 ? pipe_msg(stage - 1, CH_ACTIVATION, op.mb) : PIPE_NONE;
    return stage < pp - 1 ? pipe_msg(stage + 1, CH_GRADIENT, op.mb) : PIPE_NONE;
}

// what op hands on: a forward, its output to stage+1; a backward, its input's gradient to stage-1
static inline PipeMsg pipe_output(int pp, int stage, PipeOp op) {
    if (op.forward) return stage < pp - 1 ? pipe_msg(stage + 1, CH_ACTIVATION, op.mb) : PIPE_NONE;
    return stage > 0 ? pipe_msg(stage - 1, CH_GRADIENT, op.mb) : PIPE_NONE;
}

// fills plan (n entries) for a stage's n ops; returns n
static inline int pipeline_plan(int pp, int stage, const PipeOp *ops, int n, PipeStep *plan) {
    PipeMsg arrived = PIPE_NONE;  // the input that came with the previous exchange
    for (int i = 0; i < n; i++) {
        PipeStep *st = &plan[i];
        st->op = ops[i];
        st->recv = arrived.peer >= 0 ? PIPE_NONE : pipe_input(pp, stage, ops[i]);
        st->send = pipe_output(pp, stage, ops[i]);
        PipeMsg next = i + 1 < n ? pipe_input(pp, stage, ops[i + 1]) : PIPE_NONE;
        st->next_recv = st->send.peer >= 0 && next.peer == st->send.peer ? next : PIPE_NONE;
        arrived = st->next_recv;
    }
    return n;
}

// a stage's plan as text, "F0s F1x B0 rB1": each op with r before it when
// it receives its input alone first, and after it s when it sends its
// output alone, x when it sends it in one exchange with the next op's input.
// Writes at most len bytes (cut short if need be); returns buf.
static inline const char *pipeline_plan_text(const PipeStep *plan, int n, char *buf, size_t len) {
    size_t at = 0;
    if (len > 0) buf[0] = '\0';
    for (int i = 0; i < n && at < len; i++) {
        const PipeStep *st = &plan[i];
        at += (size_t)snprintf(buf + at, len - at, "%s%s%c%d%s", i ? " " : "", st->recv.peer >= 0 ? "r" : "",
                               st->op.forward ? 'F' : 'B', st->op.mb,
                               st->send.peer < 0 ? "" : st->next_recv.peer >= 0 ? "x" : "s");
    }
    return buf;
}

// pipeline_check: plays pp stages' plans (n steps each, plans + s * n)
// against each other as the transport's worst case: a send completes only
// when the peer posts the matching receive, an exchange posts its send and
// its receive together and completes once both have matched, and the ops
// take no time. A send to stage p meets the receive stage p posts from this
// stage; they must agree on the channel and the micro-batch, and the k-th
// message from one stage to another must be micro-batch k (messages on a
// link arrive in order, and activation sets are reused in micro-batch
// order). Returns the number of messages, every one matched once, or -1
// with a line in err: a mismatch, or a deadlock naming what each stuck
// stage waits for.
enum { PIPE_CHECK_MAXP = 64 };

// what a stage at step st has posted: in phase 0 its lone receive, in phase
// 1 its send and the receive that goes with it
static inline void pipe_posted(const PipeStep *st, int phase, PipeMsg *out, PipeMsg *in) {
    *out = phase == 0 ? PIPE_NONE : st->send;
    *in = phase == 0 ? st->recv : st->next_recv;
}

static inline int pipeline_check(int pp, int n, const PipeStep *plans, char *err, size_t errlen) {
    if (pp < 1 || pp > PIPE_CHECK_MAXP || n < 0) {
        snprintf(err, errlen, "pp %d, n %d: the checker takes pp 1..%d", pp, n, PIPE_CHECK_MAXP);
        return -1;
    }
    // stage s is at step at[s] (n: finished) in phase[s]; sent[s], got[s]:
    // that phase's send, receive has matched; to_next[s], to_prev[s]: the
    // messages so far from s to s+1, to s-1
    int at[PIPE_CHECK_MAXP], phase[PIPE_CHECK_MAXP], sent[PIPE_CHECK_MAXP], got[PIPE_CHECK_MAXP];
    int to_next[PIPE_CHECK_MAXP], to_prev[PIPE_CHECK_MAXP];
    for (int s = 0; s < pp; s++) at[s] = phase[s] = sent[s] = got[s] = to_next[s] = to_prev[s] = 0;
    int messages = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        // every posted send that meets its peer's posted receive completes both
        for (int s = 0; s < pp; s++) {
            if (at[s] >= n || sent[s]) continue;
            const PipeStep *st = &plans[s * n + at[s]];
            PipeMsg out, in;
            pipe_posted(st, phase[s], &out, &in);
            if (out.peer < 0 && in.peer >= 0 && phase[s] == 1) {
                snprintf(err, errlen, "stage %d step %d (%c%d): an exchange's receive without a send", s, at[s],
                         st->op.forward ? 'F' : 'B', st->op.mb);
                return -1;
            }
            if (out.peer < 0) continue;
            int p = out.peer;
            if ((p != s - 1 && p != s + 1) || p < 0 || p >= pp) {
                snprintf(err, errlen, "stage %d step %d (%c%d): sends to stage %d, not a neighbour", s, at[s],
                         st->op.forward ? 'F' : 'B', st->op.mb, p);
                return -1;
            }
            if (at[p] >= n || got[p]) continue;
            PipeMsg peer_out, want;
            pipe_posted(&plans[p * n + at[p]], phase[p], &peer_out, &want);
            if (want.peer != s) continue;
            int *count = p == s + 1 ? &to_next[s] : &to_prev[s];
            if (want.channel != out.channel || want.mb != out.mb || out.mb != *count) {
                snprintf(err, errlen, "mismatch: stage %d sends %s %d as its message %d to stage %d, which receives %s %d", s,
                         channel_name(out.channel), out.mb, *count, p, channel_name(want.channel), want.mb);
                return -1;
            }
            sent[s] = got[p] = 1;
            (*count)++;
            messages++;
            progress = 1;
        }
        // every stage whose posted messages have all matched moves on
        for (int s = 0; s < pp; s++) {
            if (at[s] >= n) continue;
            PipeMsg out, in;
            pipe_posted(&plans[s * n + at[s]], phase[s], &out, &in);
            if ((out.peer >= 0 && !sent[s]) || (in.peer >= 0 && !got[s])) continue;
            if (phase[s] == 0) phase[s] = 1;
            else phase[s] = 0, at[s]++;
            sent[s] = got[s] = 0;
            progress = 1;
        }
    }
    // whoever has not finished is stuck: say what each one waits for
    int stuck = 0;
    size_t len = 0;
    if (errlen > 0) err[0] = '\0';
    for (int s = 0; s < pp; s++) {
        if (at[s] >= n) continue;
        const PipeStep *st = &plans[s * n + at[s]];
        PipeMsg out, in;
        pipe_posted(st, phase[s], &out, &in);
        if (len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%sstage %d at %c%d", stuck ? "; " : "deadlock: ", s,
                                st->op.forward ? 'F' : 'B', st->op.mb);
        int sending = out.peer >= 0 && !sent[s];
        if (sending && len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, " sends %s %d to stage %d", channel_name(out.channel), out.mb,
                                    out.peer);
        if (in.peer >= 0 && !got[s] && len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%s receives %s %d from stage %d", sending ? " and" : "",
                                    channel_name(in.channel), in.mb, in.peer);
        stuck++;
    }
    return stuck ? -1 : messages;
}

// ----------------------------------------------------------------------------
// the host communicator

enum { COMM_ALLREDUCE = 0, COMM_REDUCE_SCATTER, COMM_ALLGATHER, COMM_BROADCAST, COMM_BARRIER,
       COMM_P2P, COMM_NCOUNTERS = COMM_P2P + CH_COUNT };  // COMM_P2P + channel: bytes sent on that channel
enum { OP_SUM = 0, OP_AVG = 1 };

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

static inline void comm_usage_die(Comm *c, const char *fmt, ...) {
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
    if (frame_seal(&c->links, x->peer, x->channel, (uint64_t)c->step, x->microbatch, x->src + off, len, frame) != 0)
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
    if (x->sum != NULL) {
        float *sum = x->sum + off / sizeof(float);
        const float *add = x->addend + off / sizeof(float);
        for (size_t j = 0; j < len / sizeof(float); j++) {
            float v;
            memcpy(&v, payload + j * sizeof(float), sizeof(float));
            sum[j] = v + add[j];
        }
    } else if (len > 0) {
        memcpy(x->dst + off, payload, len);
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
    double last = par_now(), checked = last;
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

// comm_init: joins the job's rendezvous and maps its segment. For a world of
// 1 there is nothing to join and every call is a local no-op or copy.
static inline int comm_init(Comm **out, const Grid *g, const uint8_t key[32], const char *rendezvous, double timeout_s,
                            const Fault *fault, char *err, size_t errlen) {
    *out = NULL;
    if (!(timeout_s > 0 && timeout_s <= 86400))
        return secure_error(err, errlen, "-to %g: the timeout must be > 0 and <= 86400 seconds", timeout_s);
    if (fault != NULL && fault->kind != FAULT_NONE && (fault->rank < 0 || fault->rank >= g->world))
        return secure_error(err, errlen, "-fault %s:%d:%ld: rank %d is not in this job of %d ranks", fault_name(fault->kind),
                            fault->rank, fault->step, fault->rank, g->world);
    Comm *c = (Comm *)calloc(1, sizeof(Comm));
    if (c == NULL) return secure_error(err, errlen, "comm_init: out of memory");
    c->rank = g->rank;
    c->world = g->world;
    c->timeout_s = timeout_s;
    c->op = "init";
    if (fault != NULL) c->fault = *fault;
    if (g->world == 1) {
        *out = c;
        return 0;
    }
    if (rendezvous == NULL) {
        free(c);
        return secure_error(err, errlen, "rank %d: no rendezvous address for a job of %d ranks", g->rank, g->world);
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
        return secure_error(err, errlen, "rank %d: shared memory %s (%llu bytes expected): %s", g->rank, ans.shm_name,
                            (unsigned long long)lay.total_bytes, strerror(e));
    }
    ShmHeader *h = (ShmHeader *)base;
    if (memcmp(h->magic, SHM_MAGIC, 8) != 0 || h->version != SHM_VERSION || h->world != (uint32_t)g->world ||
        h->slots != COMM_SLOTS || h->slot_payload != COMM_SLOT_PAYLOAD || h->job_id != job_id_from_key(key) ||
        h->ring_stride != lay.ring_stride || h->slot_stride != lay.slot_stride || h->rings_offset != lay.rings_offset) {
        munmap(base, lay.total_bytes);
        free(c);
        return secure_error(err, errlen, "rank %d: shared memory %s: header is not this job's (world %u, job id %016" PRIx64 ")",
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
    if (c->frame == NULL || links_init(&c->links, key, g->rank, g->world) != 0) {
        free(c->frame);
        munmap(base, lay.total_bytes);
        free(c);
        return secure_error(err, errlen, "rank %d: comm_init: out of memory", g->rank);
    }
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

// comm_allreduce: ring reduce-scatter, then ring all-gather, in place.
// Element range k = [n*k/size, n*(k+1)/size) is summed along the ring from
// member k+1 to member k, always in that order: ((x[k+1] + x[k+2]) + ...) + x[k].
static inline void comm_allreduce(Comm *c, const Group *grp, float *buf, size_t n, int op) {
    comm_check_group(c, grp, "allreduce");
    if (c != NULL) comm_enter(c, "allreduce", COMM_ALLREDUCE);
    if (op != OP_SUM && op != OP_AVG) comm_usage_die(c, "allreduce: op %d is neither OP_SUM nor OP_AVG", op);
    int size = grp->size, me = grp->me;
    if (size == 1) return;
    int next = comm_next(grp), prev = comm_prev(grp);
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s - 1, size), kr = comm_mod(me - s - 2, size);
        size_t s0 = n * (size_t)ks / (size_t)size, s1 = n * (size_t)(ks + 1) / (size_t)size;
        size_t r0 = n * (size_t)kr / (size_t)size, r1 = n * (size_t)(kr + 1) / (size_t)size;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (s1 - s0) * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (r1 - r0) * sizeof(float));
        tx.src = (const uint8_t *)(buf + s0);
        rx.sum = buf + r0;
        rx.addend = buf + r0;
        comm_run(c, &tx, &rx);
    }
    size_t m0 = n * (size_t)me / (size_t)size, m1 = n * (size_t)(me + 1) / (size_t)size;
    if (op == OP_AVG) for (size_t j = m0; j < m1; j++) buf[j] /= (float)size;
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s, size), kr = comm_mod(me - s - 1, size);
        size_t s0 = n * (size_t)ks / (size_t)size, s1 = n * (size_t)(ks + 1) / (size_t)size;
        size_t r0 = n * (size_t)kr / (size_t)size, r1 = n * (size_t)(kr + 1) / (size_t)size;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (s1 - s0) * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLREDUCE, (r1 - r0) * sizeof(float));
        tx.src = (const uint8_t *)(buf + s0);
        rx.dst = (uint8_t *)(buf + r0);
        comm_run(c, &tx, &rx);
    }
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
        return;
    }
    if (c->scratch_floats < 2 * n) {
        free(c->scratch);
        c->scratch = (float *)malloc(2 * n * sizeof(float) + 1);
        if (c->scratch == NULL) comm_usage_die(c, "reduce_scatter: out of memory for %zu floats", 2 * n);
        c->scratch_floats = 2 * n;
    }
    int next = comm_next(grp), prev = comm_prev(grp);
    const float *sending = in + (size_t)comm_mod(me - 1, size) * n;
    for (int s = 0; s < size - 1; s++) {
        int kr = comm_mod(me - s - 2, size);
        float *sum = s == size - 2 ? out : c->scratch + (size_t)(s % 2) * n;
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_REDUCE_SCATTER, n * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_REDUCE_SCATTER, n * sizeof(float));
        tx.src = (const uint8_t *)sending;
        rx.sum = sum;
        rx.addend = in + (size_t)kr * n;
        comm_run(c, &tx, &rx);
        sending = sum;
    }
    if (op == OP_AVG) for (size_t j = 0; j < n; j++) out[j] /= (float)size;
}

// comm_allgather: out[k*n_per_rank ..] = member k's in; in may be out + me * n_per_rank
static inline void comm_allgather(Comm *c, const Group *grp, const float *in, float *out, size_t n_per_rank) {
    comm_check_group(c, grp, "allgather");
    if (c != NULL) comm_enter(c, "allgather", COMM_ALLGATHER);
    int size = grp->size, me = grp->me;
    size_t n = n_per_rank;
    if (out + (size_t)me * n != in) memmove(out + (size_t)me * n, in, n * sizeof(float));
    if (size == 1) return;
    int next = comm_next(grp), prev = comm_prev(grp);
    for (int s = 0; s < size - 1; s++) {
        int ks = comm_mod(me - s, size), kr = comm_mod(me - s - 1, size);
        Xfer tx = xfer_make(next, CH_COLLECTIVE, 1 + COMM_ALLGATHER, n * sizeof(float));
        Xfer rx = xfer_make(prev, CH_COLLECTIVE, 1 + COMM_ALLGATHER, n * sizeof(float));
        tx.src = (const uint8_t *)(out + (size_t)ks * n);
        rx.dst = (uint8_t *)(out + (size_t)kr * n);
        comm_run(c, &tx, &rx);
    }
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
    free(c->frame);
    free(c->scratch);
    free(c);
}

// ----------------------------------------------------------------------------
// the GPU trainer's side: one GPU per rank.
// Pure C, so the CPU tests check the decisions the CUDA build makes.

// gpu_for_rank: the device a rank binds to (its local rank: rank i of a node
// takes GPU i), or -1 with err set when the node has no GPU for it. own_gpu:
// an outside launcher gave each task its own GPU and made it the only one it
// sees (srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per task): device 0.
static inline int gpu_for_rank(int local_rank, int ndevices, int own_gpu, char *err, size_t errlen) {
    if (ndevices < 1)
        return secure_error(err, errlen, "local rank %d: no CUDA device on this node", local_rank);
    if (own_gpu && ndevices == 1) return 0;
    if (local_rank < 0 || local_rank >= ndevices)
        return secure_error(err, errlen, "local rank %d has no GPU of its own: this node has %d (one rank per GPU)",
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
        return secure_error(err, errlen, "rank %d: ncclCommSplit of the %s group (color %d, key %d): %s "
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
    if (!(timeout_s > 0 && timeout_s <= 86400))
        return secure_error(err, errlen, "-to %g: the timeout must be > 0 and <= 86400 seconds", timeout_s);
    // tamper and replay act on MAC'd point-to-point messages (nccl_sendrecv_mac):
    // a job without any (pp = 1) runs on and they never fire
    if (fault != NULL && fault->kind != FAULT_NONE && (fault->rank < 0 || fault->rank >= g->world))
        return secure_error(err, errlen, "-fault %s:%d:%ld: rank %d is not in this job of %d ranks", fault_name(fault->kind),
                            fault->rank, fault->step, fault->rank, g->world);
    NcclComm *c = (NcclComm *)calloc(1, sizeof(NcclComm));
    if (c == NULL) return secure_error(err, errlen, "nccl_init: out of memory");
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
        return secure_error(err, errlen, "rank 0: ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    if (g->world > 1) {
        if (rendezvous == NULL) {
            free(c);
            return secure_error(err, errlen, "rank %d: no rendezvous address for a job of %d ranks", g->rank, g->world);
        }
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
        return secure_error(err, errlen, "rank %d: ncclCommInitRankConfig for %d ranks: %s", g->rank, g->world,
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
        return secure_error(err, errlen, "rank %d: nccl_init: %s", g->rank,
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
        if (recvs == NULL) return secure_error(err, errlen, "rank %d: out of memory for %d MAC'd receives", c->rank, max_recvs);
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
        return secure_error(err, errlen, "rank %d: reserving the MAC state (%d receives, %zu-byte messages): %s", c->rank,
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
        return secure_error(err, errlen, "rank %d: nccl MAC check (step %ld): out of memory for %d flags", c->rank, c->step, n);
    // both streams under the watchdog: the main one may still hold calls that wait on peers
    nccl_sync(c, c->stream, "the step's MAC checks");
    nccl_sync(c, c->verify, "the step's MAC checks");
    cudaError_t e = cudaMemcpy(flags, c->mac_bad, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(flags);
        return secure_error(err, errlen, "rank %d: nccl MAC check (step %ld): CUDA: %s", c->rank, c->step,
                            cudaGetErrorString(e));
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        if (flags[i] != 0) bad = i;
    }
    free(flags);
    if (bad < 0) return 0;
    const NcclMacRecv *m = &c->mac_recvs[bad];
    return secure_error(err, errlen, "rank %d: the MAC of the %s message of micro-batch %d from rank %d (%zu bytes, step %ld) "
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
