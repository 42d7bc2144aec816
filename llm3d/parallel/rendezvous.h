/*
 * rendezvous.h: how the ranks of a job find each other: the authenticated
 * rendezvous, and the shared-memory segment it hands out.
 *
 * defines, in order:
 *   par_now, par_sleep     the clocks, which both backends use too
 *   par_wait_fd, par_send_all, par_recv_all, par_io_error
 *                          sockets with deadlines
 *   RdvAddr, rdv_parse, rdv_parse_port, rdv_connect, rdv_listen
 *                          addresses: unix:PATH or tcp:HOST:PORT
 *   ShmHeader, ShmRank, shm_layout, shm_create
 *                          the shared-memory segment the host backend runs on
 *   RdvHello, RdvAnswer    the messages, and their wire forms (rdv_hello_write,
 *                          rdv_hello_read, rdv_answer_write, rdv_answer_read)
 *   RdvServer, rdv_server_open, rdv_server_step, rdv_server_close, rdv_send_refusal
 *                          the server (the launcher, or rank 0 of an outside
 *                          launch)
 *   rdv_join, rdv_join_once
 *                          the client: one hello, one answer (tried again
 *                          when the root drops the connection unanswered)
 * Header-only (llm.c style): every function is static inline.
 *
 * Linux only (SO_PEERCRED, /dev/shm). Builds with -std=gnu11, or -std=c11
 * -D_DEFAULT_SOURCE, whatever was included first.
 *
 * Rendezvous. The root sends each connection a fresh challenge; the rank
 * answers with an authenticated hello (a secure.h frame on CH_HELLO) that
 * carries it, and gets back an authenticated answer naming the job's
 * shared-memory segment and rank 0's 128-byte blob (the NCCL unique id). The
 * root rejects, and logs one line for, a peer of another uid, a wrong key, a
 * wrong job id, a wrong world size, a replayed hello, a duplicate rank and a
 * late joiner, and keeps serving the good ones for as long as the job runs.
 * A connection silent for RDV_HELLO_S after its challenge is dropped, and
 * when RDV_MAX_PENDING wait for their hello the oldest makes room for a new
 * one: a flood of idle connections (anyone may connect to a TCP port) cannot
 * keep the real ranks out, who send their hello at once and, dropped all
 * the same, connect again.
 *
 * The segment is here, not in shm_comm.h, because the launcher (or rank 0 of
 * an outside launch) creates it before any rank joins, and the rendezvous
 * answer names it; shm_comm.h's comm_init maps it. The clocks (par_now,
 * par_sleep) are here too, first in the order, and both backends use them.
 *
 * The set-up calls return errors: -1 with err set.
 */
#ifndef LLM3D_RENDEZVOUS_H
#define LLM3D_RENDEZVOUS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "secure.h"
#include "llm3d/parallel/grid.h"

#include <arpa/inet.h>
#include <assert.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#define COMM_SLOTS 8                // messages in flight per directed link
#define COMM_SLOT_PAYLOAD 65536     // payload bytes per message; larger ones go in pieces
#define COMM_BLOB_BYTES 128         // opaque bytes rank 0 hands every rank (NCCL unique id)
#define COMM_NAME_BYTES 64          // shared-memory segment name, NUL included
#define RDV_MIN_TIMEOUT_S 10.0      // starting N processes can take longer than one collective
#define RDV_MAX_PENDING 64          // connections that have not yet sent a complete hello
#define RDV_HELLO_S 2.0             // how long one may stay silent after its challenge (a rank answers at once)
#define RDV_DROPS_LOGGED 16         // drops of such connections logged, one line each, before the rest go unsaid
#define RDV_MAX_MSG 4096            // bytes of one rendezvous message
#define RDV_ANSWER_GRACE_S 1.0      // a rank waits this long past the rendezvous timeout for its answer, so that
                                    // the root, whose clock started first, tells it which ranks are missing

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

// rdv_parse_port: rdv_parse, and tcp:HOST:0 too with any_port (a root that
// takes the port the kernel gives it: rdv_server_open)
static inline int rdv_parse_port(const char *spec, int any_port, RdvAddr *a, char *err, size_t errlen) {
    memset(a, 0, sizeof(*a));
    if (spec == NULL || spec[0] == '\0')
        return errorf(err, errlen, "--rendezvous: missing value; expected unix:PATH or tcp:HOST:PORT");
    if (strlen(spec) >= sizeof(a->spec))
        return errorf(err, errlen, "--rendezvous '%.40s...': longer than %zu bytes", spec, sizeof(a->spec) - 1);
    snprintf(a->spec, sizeof(a->spec), "%s", spec);
    if (strncmp(spec, "unix:", 5) == 0) {
        const char *path = spec + 5;
        if (path[0] == '\0' || strlen(path) >= sizeof(a->path))
            return errorf(err, errlen, "--rendezvous '%s': the socket path must be 1..%zu bytes",
                          spec, sizeof(a->path) - 1);
        a->is_unix = 1;
        snprintf(a->path, sizeof(a->path), "%s", path);
        return 0;
    }
    if (strncmp(spec, "tcp:", 4) == 0) {
        const char *host = spec + 4;
        const char *colon = strrchr(host, ':');
        if (colon == NULL || colon == host || (size_t)(colon - host) >= sizeof(a->host))
            return errorf(err, errlen, "--rendezvous '%s': expected tcp:HOST:PORT", spec);
        snprintf(a->host, sizeof(a->host), "%.*s", (int)(colon - host), host);
        if (strcmp(a->host, "localhost") == 0) snprintf(a->host, sizeof(a->host), "127.0.0.1");
        struct in_addr ip;
        if (inet_pton(AF_INET, a->host, &ip) != 1)
            return errorf(err, errlen, "--rendezvous '%s': host '%s' is not an IPv4 address", spec, a->host);
        long port = 0;
        const char *p = colon + 1;
        if (*p == '\0') port = -1;
        for (; *p != '\0' && port >= 0; p++) port = (*p >= '0' && *p <= '9' && port < 100000) ? port * 10 + (*p - '0') : -1;
        if (port < (any_port ? 0 : 1) || port > 65535)
            return errorf(err, errlen, "--rendezvous '%s': port '%s' is not 1..65535", spec, colon + 1);
        a->port = (int)port;
        return 0;
    }
    return errorf(err, errlen, "--rendezvous '%s': expected unix:PATH or tcp:HOST:PORT", spec);
}

static inline int rdv_parse(const char *spec, RdvAddr *a, char *err, size_t errlen) {
    return rdv_parse_port(spec, 0, a, err, errlen);
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
        if (fd < 0) return errorf(err, errlen, "rendezvous %s: socket: %s", a->spec, strerror(errno));
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
            return errorf(err, errlen, "rendezvous %s: connect: %s", a->spec, strerror(e));
        par_sleep(0.02);
    }
}

// rdv_listen: the root's listening socket. A unix path left behind by a dead
// job (a socket nobody accepts on) is replaced; a live one is an error.
static inline int rdv_listen(const RdvAddr *a, char *err, size_t errlen) {
    struct sockaddr_storage ss;
    socklen_t sl = rdv_sockaddr(a, &ss);
    int fd = socket(a->is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errorf(err, errlen, "rendezvous %s: socket: %s", a->spec, strerror(errno));
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
                return errorf(err, errlen, "rendezvous %s: another job is listening on that socket", a->spec);
            }
            unlink(a->path);
            e = bind(fd, (struct sockaddr *)&ss, sl) == 0 ? 0 : errno;
        }
        if (e != 0) {
            close(fd);
            return errorf(err, errlen, "rendezvous %s: bind: %s", a->spec, strerror(e));
        }
    }
    if (listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return errorf(err, errlen, "rendezvous %s: listen: %s", a->spec, strerror(e));
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
    int32_t waiting_for;    // the rank this one is blocked on, -1 when not blocked (NCCL mode: -2 while its
                            // host waits for its GPU, NCCL_BOARD_AT_SYNC)
    int64_t wait_step;      // the step of that wait (NCCL mode: of the last call entered)
    uint32_t wait_op;       // COMM_* counter index of the blocked call (NCCL mode: the last call's group)
    uint32_t pid;
    uint64_t pid_ns;        // inode of /proc/self/ns/pid: pids compare only within one
    char nccl_last[SHM_RANK_BYTES - 32];  // NCCL mode: the last call this rank entered, for the
                                          // watchdog's line (nccl_comm.h's nccl_blame); host mode: unused
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

// shm_guard_run: the guard's life (shm_guard_start says why). fd 0 is the
// pipe from the creator. Only async-signal-safe calls: it is a fork of a
// process that may have threads.
static inline void shm_guard_run(const char *path, const ShmHeader *h, uint32_t world) {
    prctl(PR_SET_DUMPABLE, 0);  // it holds a copy of the creator's memory, the key included
    setsid();                   // a Ctrl-C or a kill of the job's process group ends the job, not its guard
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 1, ~0U, 0) != 0)
#endif
        for (int fd = 1; fd < 1024; fd++) close(fd);  // nobody waits on our copy of their pipes
    for (;;) {
        struct pollfd p;
        p.fd = 0;
        p.events = POLLIN;
        p.revents = 0;
        if (poll(&p, 1, 100) > 0) break;  // end of file: the creator has ended
        if (__atomic_load_n(&h->mapped, __ATOMIC_SEQ_CST) >= world) break;  // the last rank unlinked it
    }
    unlink(path);
    _exit(0);
}

// shm_guard_start: a segment's name must not outlive a start that fails,
// whatever way the creator ends (an error, a timeout, a signal, SIGKILL).
// So a guard process watches it: it holds the read end of a pipe whose
// write end only the creator has (close-on-exec, never written), and when
// the creator ends the pipe reads end of file and the guard unlinks the
// name. It also leaves as soon as every rank has mapped the segment (the
// last one unlinks the name itself), so it lives through the rendezvous
// only. A grandchild, so that init, not the trainer, reaps it.
static inline int shm_guard_start(const char *name, const ShmHeader *h, int world, char *err, size_t errlen) {
    char path[16 + COMM_NAME_BYTES];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    int p[2];
    if (pipe(p) != 0 || fcntl(p[1], F_SETFD, FD_CLOEXEC) != 0)
        return errorf(err, errlen, "shared memory %s: pipe for its guard: %s", name, strerror(errno));
    pid_t first = fork();
    if (first == 0) {
        if (fork() != 0) _exit(0);
        dup2(p[0], 0);
        shm_guard_run(path, h, (uint32_t)world);
    }
    int e = first < 0 ? errno : 0;
    close(p[0]);
    if (first < 0) {
        close(p[1]);
        return errorf(err, errlen, "shared memory %s: fork for its guard: %s", name, strerror(e));
    }
    int status;
    while (waitpid(first, &status, 0) < 0 && errno == EINTR) {}
    return 0;  // p[1] stays open, and unused, as long as this process lives
}

// shm_create: a new segment for world ranks under a fresh random name;
// O_EXCL so a name someone planted is an error, never a segment we share.
// A guard process unlinks the name if this process ends before the ranks
// have all mapped it (shm_guard_start).
static inline int shm_create(char name[COMM_NAME_BYTES], int world, uint64_t job_id, char *err, size_t errlen) {
    uint8_t rnd[32];
    if (key_generate(rnd, err, errlen) != 0) return -1;
    char hex[17];
    to_hex(rnd, 8, hex);
    hex[16] = '\0';
    snprintf(name, COMM_NAME_BYTES, "/llm3d-%d-%s", (int)getpid(), hex);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errorf(err, errlen, "shared memory %s: shm_open: %s", name, strerror(errno));
    ShmLayout lay = shm_layout(world);
    int e = fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)lay.total_bytes) == 0 ? 0 : errno;
    void *base = e == 0 ? mmap(NULL, SHM_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (e == 0 && base == MAP_FAILED) e = errno;
    close(fd);
    if (e != 0) {
        shm_unlink(name);
        return errorf(err, errlen, "shared memory %s: %llu bytes for %d ranks: %s", name,
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
    int rc = shm_guard_start(name, h, world, err, errlen);
    munmap(base, SHM_HEADER_BYTES);
    if (rc != 0) shm_unlink(name);
    return rc;
}

// ----------------------------------------------------------------------------
// rendezvous messages
//
// On the socket every message is u32 length | body. The root speaks first:
// a challenge, 'C' | 16 fresh random bytes, new for every connection. Then
// the hello: i32 claimed rank | frame (CH_HELLO, step 0, micro-batch 0) of
// HELLO_BYTES, which carries the challenge and a nonce of the rank's own.
// Answer: 'A' | frame of ANSWER_BYTES, which carries both back, or 'R' | the
// reason in text. The frames use a Links of world + 1 members: ranks
// 0..world-1 and the root as member `world`.
//
// Why both. Every job that uses one --key-file shares its key, so a tag
// alone says "some job of this key", not "this job, now". The challenge in
// the hello's tag makes a hello good for one connection only: a hello
// recorded from an earlier job (by a squatter on its TCP port, say) answers
// a challenge no root will send again. The rank's nonce in the answer's tag
// does the same for answers.

#define RDV_NONCE_BYTES 16
#define HELLO_BYTES (8 + 4 * 4 + 2 * RDV_NONCE_BYTES + COMM_BLOB_BYTES)
#define ANSWER_BYTES (8 + 4 * 4 + 2 * RDV_NONCE_BYTES + COMM_NAME_BYTES + COMM_BLOB_BYTES)

typedef struct {
    uint64_t job_id;
    int rank, world, local_rank;
    uint32_t pid;
    uint8_t nonce[RDV_NONCE_BYTES];       // the rank's, fresh for this hello
    uint8_t challenge[RDV_NONCE_BYTES];   // the root's, from this connection
    uint8_t blob[COMM_BLOB_BYTES];
} RdvHello;

typedef struct {
    uint64_t job_id;
    int rank, world, local_rank;
    uint32_t root_pid;
    uint8_t nonce[RDV_NONCE_BYTES];       // the hello's two, echoed: this answer is for that hello
    uint8_t challenge[RDV_NONCE_BYTES];
    char shm_name[COMM_NAME_BYTES];
    uint8_t blob[COMM_BLOB_BYTES];
} RdvAnswer;

static inline void rdv_hello_write(const RdvHello *h, uint8_t *p) {
    put_u64(p, h->job_id);
    put_u32(p + 8, (uint32_t)h->rank);
    put_u32(p + 12, (uint32_t)h->world);
    put_u32(p + 16, (uint32_t)h->local_rank);
    put_u32(p + 20, h->pid);
    memcpy(p + 24, h->nonce, RDV_NONCE_BYTES);
    memcpy(p + 40, h->challenge, RDV_NONCE_BYTES);
    memcpy(p + 56, h->blob, COMM_BLOB_BYTES);
}

static inline void rdv_hello_read(const uint8_t *p, RdvHello *h) {
    h->job_id = get_u64(p);
    h->rank = (int)get_u32(p + 8);
    h->world = (int)get_u32(p + 12);
    h->local_rank = (int)get_u32(p + 16);
    h->pid = get_u32(p + 20);
    memcpy(h->nonce, p + 24, RDV_NONCE_BYTES);
    memcpy(h->challenge, p + 40, RDV_NONCE_BYTES);
    memcpy(h->blob, p + 56, COMM_BLOB_BYTES);
}

static inline void rdv_answer_write(const RdvAnswer *a, uint8_t *p) {
    put_u64(p, a->job_id);
    put_u32(p + 8, (uint32_t)a->rank);
    put_u32(p + 12, (uint32_t)a->world);
    put_u32(p + 16, (uint32_t)a->local_rank);
    put_u32(p + 20, a->root_pid);
    memcpy(p + 24, a->nonce, RDV_NONCE_BYTES);
    memcpy(p + 40, a->challenge, RDV_NONCE_BYTES);
    memcpy(p + 56, a->shm_name, COMM_NAME_BYTES);
    memcpy(p + 56 + COMM_NAME_BYTES, a->blob, COMM_BLOB_BYTES);
}

static inline void rdv_answer_read(const uint8_t *p, RdvAnswer *a) {
    a->job_id = get_u64(p);
    a->rank = (int)get_u32(p + 8);
    a->world = (int)get_u32(p + 12);
    a->local_rank = (int)get_u32(p + 16);
    a->root_pid = get_u32(p + 20);
    memcpy(a->nonce, p + 24, RDV_NONCE_BYTES);
    memcpy(a->challenge, p + 40, RDV_NONCE_BYTES);
    memcpy(a->shm_name, p + 56, COMM_NAME_BYTES);
    a->shm_name[COMM_NAME_BYTES - 1] = '\0';
    memcpy(a->blob, p + 56 + COMM_NAME_BYTES, COMM_BLOB_BYTES);
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
    uint8_t challenge[RDV_NONCE_BYTES];  // sent on this connection; its hello must carry it
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
    int quiet_expiry;               // 1: the root is rank 0's own thread, and rank 0 prints why it timed out
    int rank_fd[GRID_MAX_WORLD];
    uint32_t rank_pid[GRID_MAX_WORLD];
    int rank_local[GRID_MAX_WORLD];
    uint8_t rank_nonce[GRID_MAX_WORLD][RDV_NONCE_BYTES];
    uint8_t rank_challenge[GRID_MAX_WORLD][RDV_NONCE_BYTES];
    int npending;
    RdvConn pending[RDV_MAX_PENDING];
    int rejected;                   // rejections so far, and the last reason (the tests read them)
    char last_reject[256];
    int dropped;                    // connections dropped without a complete hello (silent, or evicted)
} RdvServer;

// rdv_server_open: listens on spec for world ranks; shm_name is what the
// answers hand out. tcp:HOST:0 takes a port the kernel picks: s->addr.port
// and s->addr.spec say which
static inline int rdv_server_open(RdvServer *s, const char *spec, int world, const uint8_t key[32],
                                  const char *shm_name, double timeout_s, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    s->listen_fd = -1;
    if (world < 1 || world > GRID_MAX_WORLD)
        return errorf(err, errlen, "rendezvous: world %d out of range 1..%d", world, GRID_MAX_WORLD);
    if (rdv_parse_port(spec, 1, &s->addr, err, errlen) != 0) return -1;
    if (links_init(&s->links, key, world, world + 1) != 0)
        return errorf(err, errlen, "rendezvous: links for world %d", world);
    s->listen_fd = rdv_listen(&s->addr, err, errlen);
    if (s->listen_fd < 0) {
        links_free(&s->links);
        return -1;
    }
    if (!s->addr.is_unix && s->addr.port == 0) {
        struct sockaddr_in in;
        socklen_t sl = sizeof(in);
        if (getsockname(s->listen_fd, (struct sockaddr *)&in, &sl) == 0) s->addr.port = ntohs(in.sin_port);
        snprintf(s->addr.spec, sizeof(s->addr.spec), "tcp:%s:%d", s->addr.host, s->addr.port);
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

// rdv_server_drop_idle: drops pending[i], which sent no complete hello in
// time (why), with a line for each of the first RDV_DROPS_LOGGED: a flood
// of idle connections must not flood the log too
static inline void rdv_server_drop_idle(RdvServer *s, int i, const char *why) {
    s->dropped++;
    if (s->dropped <= RDV_DROPS_LOGGED)
        fprintf(stderr, "rendezvous: dropped %s: %s%s\n", s->pending[i].who, why,
                s->dropped == RDV_DROPS_LOGGED ? " (further drops of idle connections go unlogged)" : "");
    rdv_server_drop(s, i);
}

// rdv_send_refusal: 'R' | reason to the peer on fd, which prints it and
// stops (a hang-up alone it would take for a drop and try again)
static inline void rdv_send_refusal(int fd, const char *reason) {
    uint8_t msg[5 + 256];
    size_t n = strlen(reason) < 256 ? strlen(reason) : 256;
    put_u32(msg, (uint32_t)(1 + n));
    msg[4] = 'R';
    memcpy(msg + 5, reason, n);
    par_send_all(fd, msg, 5 + n, par_now() + 0.5);
}

// rdv_server_reject: logs one line, tells the peer why, hangs up
static inline __attribute__((format(printf, 3, 4))) void rdv_server_reject(RdvServer *s, int i, const char *fmt, ...) {
    char reason[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    fprintf(stderr, "rendezvous: rejected %s: %s\n", s->pending[i].who, reason);
    snprintf(s->last_reject, sizeof(s->last_reject), "%s", reason);
    s->rejected++;
    rdv_send_refusal(s->pending[i].fd, reason);
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
    if (memcmp(h.challenge, cn->challenge, RDV_NONCE_BYTES) != 0) {
        rdv_server_reject(s, i, "hello for rank %d answers another connection's challenge: a replayed hello", claimed);
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
    memcpy(s->rank_nonce[claimed], h.nonce, RDV_NONCE_BYTES);
    memcpy(s->rank_challenge[claimed], h.challenge, RDV_NONCE_BYTES);
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
                // told why, it does not take the hang-up for a drop to try again after
                rdv_send_refusal(fd, s->last_reject);
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
            // the table is full of connections that have said nothing yet: the
            // oldest goes, not the newcomer. A rank sends its hello within
            // moments of connecting, so idle connections, however many,
            // cannot keep the real ranks out
            int oldest = 0;
            for (int k = 1; k < s->npending; k++)
                if (s->pending[k].deadline < s->pending[oldest].deadline) oldest = k;
            char why[96];
            snprintf(why, sizeof(why), "the oldest of %d connections without a hello, for a new one", RDV_MAX_PENDING);
            rdv_server_drop_idle(s, oldest, why);
        }
        // the challenge: 20 bytes into a fresh socket's empty buffer, so
        // the send does not wait
        uint8_t rnd[32], msg[5 + RDV_NONCE_BYTES];
        if (key_generate(rnd, NULL, 0) != 0) {
            fprintf(stderr, "rendezvous: dropped %s: no random bytes for its challenge\n", who);
            close(fd);
            continue;
        }
        put_u32(msg, 1 + RDV_NONCE_BYTES);
        msg[4] = 'C';
        memcpy(msg + 5, rnd, RDV_NONCE_BYTES);
        int rc = par_send_all(fd, msg, sizeof(msg), par_now() + 0.5);
        if (rc != 0) {
            fprintf(stderr, "rendezvous: dropped %s: sending its challenge: %s\n", who, par_io_error(rc));
            close(fd);
            continue;
        }
        RdvConn *cn = &s->pending[s->npending++];
        cn->fd = fd;
        cn->got = 0;
        cn->deadline = par_now() + (s->timeout_s < RDV_HELLO_S ? s->timeout_s : RDV_HELLO_S);
        memcpy(cn->challenge, rnd, RDV_NONCE_BYTES);
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
        memcpy(a.nonce, s->rank_nonce[r], RDV_NONCE_BYTES);
        memcpy(a.challenge, s->rank_challenge[r], RDV_NONCE_BYTES);
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
            char why[64];
            snprintf(why, sizeof(why), "no complete hello within %.1f s of its challenge",
                     s->timeout_s < RDV_HELLO_S ? s->timeout_s : RDV_HELLO_S);
            rdv_server_drop_idle(s, i, why);
        }
    }
    if (s->answered || s->expired || now <= s->join_deadline) return;
    char missing[128] = "";
    size_t n = 0;
    for (int r = 0; r < s->world && n + 8 < sizeof(missing); r++) {
        if (s->rank_fd[r] < 0) n += (size_t)snprintf(missing + n, sizeof(missing) - n, " %d", r);
    }
    char why[200];
    snprintf(why, sizeof(why), "the rendezvous timed out: only %d of %d ranks joined within %.1f s; missing rank(s)%s",
             s->joined, s->world, s->timeout_s, missing);
    if (!s->quiet_expiry) fprintf(stderr, "rendezvous: %s\n", why);
    // the ranks that joined wait for their answer (RDV_ANSWER_GRACE_S past their own timeout): they are
    // told who is missing, each in its own line, not left to time out without a name
    for (int r = 0; r < s->world; r++) {
        if (s->rank_fd[r] >= 0) {
            rdv_send_refusal(s->rank_fd[r], why);
            close(s->rank_fd[r]);
        }
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

// rdv_read_msg: one u32 length | body message of 1..RDV_MAX_MSG bytes from
// the root into in (body at in + 4); its length, or -1 with err set (-2:
// the root closed the connection without a word)
static inline long rdv_read_msg(int fd, const char *spec, int rank, const char *what, uint8_t in[4 + RDV_MAX_MSG],
                                double deadline, double timeout_s, char *err, size_t errlen) {
    int rc = par_recv_all(fd, in, 4, deadline);
    uint32_t n = rc == 0 ? get_u32(in) : 0;
    if (rc == 0 && (n < 1 || n > RDV_MAX_MSG))
        return errorf(err, errlen, "rendezvous %s: %s of %u bytes (1..%d)", spec, what, (unsigned)n, RDV_MAX_MSG);
    if (rc == 0) rc = par_recv_all(fd, in + 4, n, deadline);
    if (rc != 0) {
        errorf(err, errlen, "rendezvous %s: rank %d waiting %.1f s for the root's %s: %s", spec, rank, timeout_s,
               what, par_io_error(rc));
        return rc == -2 ? -2 : -1;
    }
    if (in[4] == 'R') {
        char reason[201];
        size_t m = n - 1 < 200 ? n - 1 : 200;
        for (size_t k = 0; k < m; k++) reason[k] = (in[5 + k] >= 32 && in[5 + k] < 127) ? (char)in[5 + k] : '?';
        reason[m] = '\0';
        return errorf(err, errlen, "rendezvous %s: the root rejected rank %d: %s", spec, rank, reason);
    }
    return (long)n;
}

// rdv_join_once: one connection to the root: its challenge, our hello h,
// its answer (into in, its length returned). -1 with err set; -2 when the
// root dropped the connection before a word of its answer (a root that
// idle connections crowd drops the oldest: rdv_server_accept), which is
// worth another try
static inline long rdv_join_once(const RdvAddr *addr, const char *spec, const uint8_t key[32], RdvHello *h,
                                 Links *hl, uint8_t in[4 + RDV_MAX_MSG], double deadline, double timeout_s,
                                 char *err, size_t errlen) {
    int fd = rdv_connect(addr, deadline, err, errlen);
    if (fd < 0) return -1;
    // the root speaks first: this connection's challenge, which the hello's tag covers
    long n = rdv_read_msg(fd, spec, h->rank, "challenge", in, deadline, timeout_s, err, errlen);
    if (n >= 0 && (n != 1 + RDV_NONCE_BYTES || in[4] != 'C'))
        n = errorf(err, errlen, "rendezvous %s: the root's first message is not a challenge ('C' and %d bytes)", spec,
                   RDV_NONCE_BYTES);
    if (n < 0) {
        close(fd);
        return n;
    }
    memcpy(h->challenge, in + 5, RDV_NONCE_BYTES);
    if (links_init(hl, key, h->rank, h->world + 1) != 0) {
        close(fd);
        return errorf(err, errlen, "rendezvous %s: links for rank %d of %d", spec, h->rank, h->world);
    }
    hl->job_id = h->job_id;
    uint8_t payload[HELLO_BYTES];
    rdv_hello_write(h, payload);
    uint8_t msg[8 + FRAME_HEADER_BYTES + HELLO_BYTES + FRAME_TAG_BYTES];
    put_u32(msg, (uint32_t)(sizeof(msg) - 4));
    put_u32(msg + 4, (uint32_t)h->rank);
    frame_seal(hl, h->world, CH_HELLO, 0, 0, payload, HELLO_BYTES, msg + 8);
    int rc = par_send_all(fd, msg, sizeof(msg), deadline);
    if (rc == 0)
        n = rdv_read_msg(fd, spec, h->rank, "answer", in, deadline + RDV_ANSWER_GRACE_S, timeout_s, err, errlen);
    else {
        errorf(err, errlen, "rendezvous %s: rank %d sending its hello: %s", spec, h->rank, par_io_error(rc));
        n = rc == -2 ? -2 : -1;
    }
    close(fd);
    if (n < 0) links_free(hl);
    return n;
}

// rdv_join: joins the job at spec as rank of world. job_id is normally
// job_id_from_key(key) (the tests pass others); blob_in (rank 0's, may be
// NULL) is what every rank gets back in ans->blob. A connection the root
// drops before it answers is tried again, until timeout_s.
static inline int rdv_join(const char *spec, const uint8_t key[32], uint64_t job_id, int rank, int world,
                           int local_rank, const uint8_t *blob_in, double timeout_s, RdvAnswer *ans,
                           char *err, size_t errlen) {
    memset(ans, 0, sizeof(*ans));
    RdvAddr addr;
    if (rdv_parse(spec, &addr, err, errlen) != 0) return -1;
    if (world < 1 || world > GRID_MAX_WORLD || rank < 0 || rank >= world)
        return errorf(err, errlen, "rendezvous %s: rank %d of world %d is out of range", spec, rank, world);
    RdvHello h;
    memset(&h, 0, sizeof(h));
    h.job_id = job_id;
    h.rank = rank;
    h.world = world;
    h.local_rank = local_rank;
    h.pid = (uint32_t)getpid();
    uint8_t rnd[32];
    if (key_generate(rnd, err, errlen) != 0) return -1;
    memcpy(h.nonce, rnd, RDV_NONCE_BYTES);
    if (blob_in != NULL) memcpy(h.blob, blob_in, COMM_BLOB_BYTES);

    double deadline = par_now() + timeout_s;
    uint8_t in[4 + RDV_MAX_MSG];
    Links hl;
    long n;
    while ((n = rdv_join_once(&addr, spec, key, &h, &hl, in, deadline, timeout_s, err, errlen)) == -2 &&
           par_now() < deadline)
        par_sleep(0.02);
    if (n < 0) return -1;
    const uint8_t *p = NULL;
    char why[256];
    if (in[4] != 'A' || frame_open(&hl, in + 5, (size_t)n - 1, world, CH_HELLO, 0, 0, ANSWER_BYTES, &p, why, sizeof(why)) != 0) {
        links_free(&hl);
        return errorf(err, errlen, "rendezvous %s: bad answer from the root: %s", spec,
                      in[4] != 'A' ? "neither 'A' nor 'R'" : why);
    }
    links_free(&hl);
    rdv_answer_read(p, ans);
    if (ans->job_id != job_id || ans->rank != rank || ans->world != world ||
        memcmp(ans->nonce, h.nonce, RDV_NONCE_BYTES) != 0 || memcmp(ans->challenge, h.challenge, RDV_NONCE_BYTES) != 0)
        return errorf(err, errlen, "rendezvous %s: the answer is for rank %d of %d, not for this hello of rank %d of %d",
                      spec, ans->rank, ans->world, rank, world);
    if (ans->shm_name[0] != '/' || strchr(ans->shm_name + 1, '/') != NULL)
        return errorf(err, errlen, "rendezvous %s: shared memory name '%s' is not /NAME", spec, ans->shm_name);
    return 0;
}

#endif
