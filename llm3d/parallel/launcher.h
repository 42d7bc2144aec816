/*
 * launcher.h: how a job of N ranks starts: the launcher, which starts N
 * copies of this program, and how each process learns what it is.
 *
 * defines:
 *   Launch, parallel_main, parallel_world, parallel_will_launch, parallel_launched_rank,
 *   parallel_join          what a trainer's main() calls, first thing
 *   launcher_run           the launcher: the key, the socket, the segment,
 *                          the ranks (fork and exec), the rendezvous served,
 *                          and the wait for the ranks to end
 *   launch_serve, launch_free
 *                          rank 0 of an outside launch serves the rendezvous
 *   par_env_int, par_env_rank
 *                          rank and world from the environment (LLM3D_*,
 *                          torchrun, Open MPI, Slurm)
 *   LaunchMeet, MeetPlan, meet_plan, meet_host, meet_join, meet_close (and
 *   their helpers meet_outside_rank, meet_one_box, meet_job_id, meet_dir_check,
 *   meet_write, meet_read, meet_live, meet_lock_state, meet_held, meet_sweep,
 *   meet_my_address, meet_open_folder)
 *                          ranks of mpirun, srun or torchrun without
 *                          --rendezvous, and llm.c's -pn -pr -pg -pi -pf -ps:
 *                          how they meet
 *   par_stop_signals, par_unblock_stop_signals
 *                          SIGINT, SIGTERM and SIGHUP, which ask a job to stop
 *                          (SIGINT and SIGHUP not where they are ignored)
 * Header-only (llm.c style): every function is static inline.
 *
 * Linux only (signalfd, PR_SET_PDEATHSIG). Builds with -std=gnu11, or
 * -std=c11 -D_DEFAULT_SOURCE, whatever was included first. Rank 0 of an
 * outside launch serves the rendezvous from a thread: glibc >= 2.34 needs
 * nothing more, older ones -pthread.
 *
 * Launch. parallel_main() decides what this process is: the launcher (-np N
 * and no rank in the environment: it starts N copies of this program and
 * serves the rendezvous, and never returns), a rank (started by that launcher,
 * or by mpirun / srun / torchrun / a script, with --rendezvous and
 * --key-file, or without them: then rank 0 makes a private directory in -o,
 * or llm.c's -pf, with a fresh key and its socket, and the others take them
 * from there), or the single process of a one-rank run. The ranks then find
 * each other through rendezvous.h.
 *
 * The set-up calls return errors: parallel_main and parallel_join
 * PARALLEL_USAGE or PARALLEL_RUNTIME, the others -1, with err set.
 */
#ifndef LLM3D_LAUNCHER_H
#define LLM3D_LAUNCHER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "secure.h"
#include "llm3d/parallel/grid.h"
#include "llm3d/parallel/rendezvous.h"  // RdvServer, rdv_parse, shm_create, par_now

#include <ctype.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>

#define LAUNCH_GRACE_S 2.0          // SIGTERM, then this long, then SIGKILL
#define PARALLEL_USAGE 2            // parallel_main's return for a bad flag or environment
#define PARALLEL_RUNTIME 1          // ... and for anything else

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
    int meet;                   // 1: the ranks met in a directory (launch_meet): the fds below are open
    int meet_made;              // ... which this process (rank 0) made, and removes in launch_free
    int meet_parent, meet_dir;  // the folder (-o, -pf) and the meeting directory in it
    int meet_lock;              // rank 0: the meeting directory's "live" file, flocked while it serves (-1: none)
    char meet_name[128];        // the meeting directory's name in the folder
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
    if (x < lo || x > hi) return errorf(err, errlen, "environment %s='%s': expected an integer %d..%d", name, v, lo, hi);
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
        if (got == 0) return errorf(err, errlen, "environment %s=%d is set but %s is not", conv[k][0], rank, conv[k][1]);
        if (rank >= world) return errorf(err, errlen, "environment %s=%d is not below %s=%d",
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

// ----------------------------------------------------------------------------
// meeting without --rendezvous (the ranks of mpirun, srun and torchrun, and
// llm.c's multi-node flags): rank 0 makes a private directory in a folder
// (-o, or -pf), named for the launch, with a fresh job key and its
// rendezvous socket (or TCP address) in it; the other ranks wait for them

enum { MEET_MPI = 0, MEET_TCP = 1, MEET_FS = 2 };  // llm.c's -pi, in flags.h's order (PI_*)
#define MEET_TCP_PORT 12345                       // llm.c's port for -pi tcp, where -ps names none
#define MEET_PREFIX "llm3d-rendezvous-"

// what a meeting directory may hold: rank 0 removes these, and only these
static const char *const meet_files[] = {"key", "key.tmp", "address", "address.tmp", "rendezvous.sock", "live"};

// meet_clear: empties the meeting directory dfd of what rank 0 puts there
static inline void meet_clear(int dfd) {
    for (size_t i = 0; i < sizeof(meet_files) / sizeof(meet_files[0]); i++) unlinkat(dfd, meet_files[i], 0);
}

// meet_close: forgets the meeting directory; rank 0, which made it, removes
// it (after its socket: rdv_server_close unlinks that through meet_dir)
static inline void meet_close(Launch *L) {
    if (L->meet_made) {
        meet_clear(L->meet_dir);
        unlinkat(L->meet_parent, L->meet_name, AT_REMOVEDIR);
        if (L->meet_lock >= 0) close(L->meet_lock);
        L->meet_lock = -1;
    }
    close(L->meet_dir);
    close(L->meet_parent);
    L->meet = L->meet_made = 0;
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
        rdv_server_close(L->server);  // the socket goes first: its path runs through meet_dir
        free(L->server);
        L->server = NULL;
    }
    if (L->meet) meet_close(L);
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
        return errorf(err, errlen, "rendezvous: out of memory");
    }
    if (rdv_server_open(L->server, L->rendezvous, L->world, L->key, shm_name, timeout_s, err, errlen) != 0) {
        shm_unlink(shm_name);
        free(L->server);
        L->server = NULL;
        return -1;
    }
    L->server->quiet_expiry = 1;  // rank 0 joins it next, and is told who is missing
    __atomic_store_n(&L->server_stop, 0, __ATOMIC_SEQ_CST);
    int e = pthread_create(&L->server_thread, NULL, rdv_server_thread, L);
    if (e != 0) {
        shm_unlink(shm_name);
        rdv_server_close(L->server);
        free(L->server);
        L->server = NULL;
        return errorf(err, errlen, "rendezvous: pthread_create: %s", strerror(e));
    }
    return 0;
}

// LaunchMeet: the flags that say how the ranks of an outside launch meet
// when no --rendezvous does (a trainer fills it from its flags)
typedef struct {
    const char *out_dir;        // -o: where the ranks of one box meet under -pi mpi (NULL: none)
    int procs, rank, gpus;      // llm.c's -pn -pr -pg (0, -1: not given): the world and rank where no
                                // launcher's variables say them, and -pn above -pg spans nodes
    int init;                   // llm.c's -pi: MEET_MPI, MEET_TCP or MEET_FS
    const char *fs_path;        // -pf: the folder of -pi fs
    const char *server;         // -ps: rank 0's IPv4 address[:port] for -pi tcp (NULL: none)
} LaunchMeet;

// MeetPlan: where this rank meets the others (meet_plan)
typedef struct {
    int by_dir;                 // 1: in a directory of `folder`; 0: at spec, with --key-file's key
    const char *folder, *flag;  // -o or -pf, and which of the two it is, for messages
    char name[128];             // the meeting directory's name: MEET_PREFIX and the launch's id
    int one_box;                // 1: a unix socket in the directory; 0: TCP, its address in the directory
    char spec[256];             // by_dir 0: the rendezvous address
} MeetPlan;

// meet_outside_rank: rank, world and local rank of a process that an
// outside launcher started, from its variables (torchrun, Open MPI, an srun
// step), else from llm.c's -pn -pr -pg; 1 found, 0 none, -1 err set
static inline int meet_outside_rank(Launch *L, const LaunchMeet *m, char *err, size_t errlen) {
    int found = par_env_rank(L, 1, err, errlen);
    if (found < 0) return -1;
    // Slurm's variables are set in an sbatch script too, where one process starts its ranks with -np;
    // only the tasks of an srun step are the ranks themselves
    if (found && strcmp(L->source, "Slurm") == 0 && (getenv("SLURM_STEP_ID") == NULL ||
                                                     getenv("SLURM_STEP_NUM_TASKS") == NULL))
        found = 0;
    if (found) {
        if (m->procs > 0 && m->procs != L->world)
            return errorf(err, errlen, "flag -pn %d, but the launcher (%s) says the world is %d", m->procs, L->source,
                          L->world);
        if (m->rank >= 0 && m->rank != L->rank)
            return errorf(err, errlen, "flag -pr %d, but the launcher (%s) says this is rank %d", m->rank, L->source,
                          L->rank);
        return 1;
    }
    if (m->procs <= 0 && m->rank < 0) return 0;
    L->world = m->procs > 0 ? m->procs : 1;  // llm.c's defaults: -pn 1, -pr 0
    L->rank = m->rank >= 0 ? m->rank : 0;
    if (L->rank >= L->world) return errorf(err, errlen, "flag -pr %d: not below -pn %d", L->rank, L->world);
    L->local_rank = L->rank % m->gpus;
    L->source = "llm.c's -pn -pr";
    return 1;
}

// meet_one_box: whether every rank runs on this box, as the launcher says
// (Open MPI's local size, torchrun's local world size, the nodes of a Slurm
// step), else as llm.c's -pn and -pg do (no more processes than GPUs a node)
static inline int meet_one_box(const Launch *L, const LaunchMeet *m) {
    const char *v = NULL;
    if (strcmp(L->source, "Open MPI") == 0) v = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (strcmp(L->source, "torchrun") == 0) v = getenv("LOCAL_WORLD_SIZE");
    if (strcmp(L->source, "Slurm") == 0) {
        const char *nodes = getenv("SLURM_STEP_NUM_NODES");
        if (nodes == NULL) nodes = getenv("SLURM_NNODES");
        if (nodes == NULL) nodes = getenv("SLURM_JOB_NUM_NODES");
        if (nodes != NULL) return atoi(nodes) == 1;
    }
    if (v != NULL) return atoi(v) == L->world;
    return L->world <= m->gpus;
}

// meet_job_id: a name every rank of this launch shares, and no other
// launch: Open MPI's job (PMIX_NAMESPACE, or OMPI_MCA_ess_base_jobid),
// Slurm's job and step, torchrun's run id and port; that of the launcher
// whose variables gave the rank first. 0 when there is none.
static inline int meet_job_id(const Launch *L, char *out, size_t outlen) {
    const char *ompi = getenv("PMIX_NAMESPACE") != NULL ? getenv("PMIX_NAMESPACE") : getenv("OMPI_MCA_ess_base_jobid");
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    const char *run = getenv("TORCHELASTIC_RUN_ID"), *port = getenv("MASTER_PORT");
    char id[200];
    int is_ompi = strcmp(L->source, "Open MPI") == 0, is_slurm = strcmp(L->source, "Slurm") == 0;
    int is_torch = strcmp(L->source, "torchrun") == 0, any = !is_ompi && !is_slurm && !is_torch;
    if ((is_ompi || any) && ompi != NULL) snprintf(id, sizeof(id), "ompi-%.150s", ompi);
    else if ((is_slurm || any) && job != NULL) snprintf(id, sizeof(id), "slurm-%.80s.%.80s", job, step ? step : "");
    else if ((is_torch || any) && run != NULL) snprintf(id, sizeof(id), "torchrun-%.80s.%.80s", run, port ? port : "");
    else return 0;
    // a file name, whatever the launcher put in its variables
    size_t n = 0;
    for (const char *p = id; *p != '\0' && n + 1 < outlen && n < 100; p++, n++)
        out[n] = (isalnum((unsigned char)*p) || *p == '.' || *p == '-') ? *p : '_';
    out[n] = '\0';
    return 1;
}

// meet_plan: how a process that an outside launcher started, without
// --rendezvous, meets the others. 0: it is not such a process (no
// launcher's variables, nor -pn, say it is one of several), nothing to do;
// 1: plan filled in, and L's rank, world, local rank and source; -1: a
// usage error in err, one line that says what to give instead.
static inline int meet_plan(const LaunchMeet *m, const char *rendezvous, const char *key_file, int np, Launch *L,
                            MeetPlan *plan, char *err, size_t errlen) {
    memset(plan, 0, sizeof(*plan));
    if (m == NULL || getenv("LLM3D_RANK") != NULL) return 0;
    if (m->server != NULL && m->init != MEET_TCP)
        return errorf(err, errlen, "flag -ps %s: llm.c's server address is for -pi tcp only (-ps also takes a pipeline "
                      "schedule's name)", m->server);
    if (rendezvous != NULL) {
        if (m->init != MEET_MPI)
            return errorf(err, errlen, "flag -pi %s: --rendezvous %s already says where the ranks meet",
                          m->init == MEET_TCP ? "tcp" : "fs", rendezvous);
        return 0;
    }
    int found = meet_outside_rank(L, m, err, errlen);
    if (found <= 0) return found;
    if (L->world == 1) return 0;
    if (np > 1 && np != L->world)
        return errorf(err, errlen, "-np %d, but the launcher (%s) says the world is %d", np, L->source, L->world);
    plan->one_box = meet_one_box(L, m);
    char who[160];
    snprintf(who, sizeof(who), "started by %s as rank %d of %d without --rendezvous", L->source, L->rank, L->world);
    if (m->init == MEET_TCP) {
        if (key_file == NULL)
            return errorf(err, errlen, "%s: -pi tcp: ranks that meet over TCP prove they belong to the job with a "
                          "shared secret: add --key-file FILE, the same on every rank (mode 0600)", who);
        if (m->server == NULL)
            return errorf(err, errlen, "%s: -pi tcp: add -ps ADDR, rank 0's IPv4 address (llm.c's server address)", who);
        if (strchr(m->server, ':') != NULL) snprintf(plan->spec, sizeof(plan->spec), "tcp:%.200s", m->server);
        else snprintf(plan->spec, sizeof(plan->spec), "tcp:%.200s:%d", m->server, MEET_TCP_PORT);
        RdvAddr a;
        if (rdv_parse(plan->spec, &a, err, errlen) != 0) return -1;
        return 1;
    }
    if (m->init == MEET_MPI && !plan->one_box)
        return errorf(err, errlen, "%s: the ranks span nodes, and llm.c's -pi mpi needs MPI, which this trainer does "
                      "not link: meet with -pi fs -pf SHARED_DIR, -pi tcp -ps ADDR --key-file FILE, or --rendezvous "
                      "ADDR --key-file FILE", who);
    plan->by_dir = 1;
    plan->folder = m->init == MEET_FS ? m->fs_path : m->out_dir;
    plan->flag = m->init == MEET_FS ? "-pf" : "-o";
    if (plan->folder == NULL)
        return errorf(err, errlen, "%s: give -o DIR, where the ranks of one box meet, or --rendezvous ADDR --key-file "
                      "FILE (doc/llmc.md, \"mpirun\")", who);
    char id[128];
    if (!meet_job_id(L, id, sizeof(id)))
        return errorf(err, errlen, "%s: no job id in the environment (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, "
                      "SLURM_JOB_ID, TORCHELASTIC_RUN_ID) to name where the ranks meet in %s: pass --rendezvous ADDR "
                      "--key-file FILE", who, plan->folder);
    snprintf(plan->name, sizeof(plan->name), MEET_PREFIX "%.100s", id);
    return 1;
}

// meet_dir_check: the meeting directory fd (path, for messages) must be
// this user's and private: another user's, or one that group or others
// may enter, is not this job's, whoever made it
static inline int meet_dir_check(int fd, const char *path, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fd, &st) != 0) return errorf(err, errlen, "%s: fstat: %s", path, strerror(errno));
    if (st.st_uid != geteuid())
        return errorf(err, errlen, "%s: owned by uid %u, not by this user (uid %u): not this job's meeting place; "
                      "refused", path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 077) != 0)
        return errorf(err, errlen, "%s: mode %04o lets group or others in: not this job's meeting place; refused",
                      path, (unsigned)(st.st_mode & 07777));
    return 0;
}

// meet_not_dir: what the entry name of parent is, that openat(O_DIRECTORY |
// O_NOFOLLOW) refused with errno e: a link (which it never follows), not a
// directory, or e's message
static inline const char *meet_not_dir(int parent, const char *name, int e) {
    struct stat st;
    if (e == ELOOP || (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
        return "a symbolic link";
    return e == ENOTDIR ? "not a directory" : strerror(e);
}

// meet_write: text as the file name in the directory dfd, mode 0600, whole
// or not at all: written to name.tmp, then renamed, so that a rank never
// reads half of it
static inline int meet_write(int dfd, const char *name, const char *text, const char *shown, char *err, size_t errlen) {
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%s.tmp", name);
    unlinkat(dfd, tmp, 0);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errorf(err, errlen, "%s/%s: %s", shown, tmp, strerror(errno));
    size_t n = strlen(text), done = 0;
    int e = 0;
    while (e == 0 && done < n) {
        ssize_t r = write(fd, text + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) e = errno; else done += (size_t)r;
    }
    if (e == 0 && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && e == 0) e = errno;
    if (e == 0 && renameat(dfd, tmp, dfd, name) != 0) e = errno;
    if (e != 0) {
        unlinkat(dfd, tmp, 0);
        return errorf(err, errlen, "%s/%s: %s", shown, name, strerror(e));
    }
    return 0;
}

// meet_read: the file name of the directory dfd (not a link, a regular
// file of this user's, mode 0600) into buf, NUL-terminated; 1 read, 0 not
// there yet, -1 err set
static inline int meet_read(int dfd, const char *name, char *buf, size_t buflen, const char *shown, char *err,
                            size_t errlen) {
    char path[600];
    snprintf(path, sizeof(path), "%.560s/%.30s", shown, name);
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) return 0;
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, errno == ELOOP ? "a symbolic link: refused" : strerror(errno));
    size_t n = 0;
    int rc = key_file_check(fd, path, err, errlen);
    if (rc == 0 && read_all(fd, buf, buflen - 1, &n) != 0) rc = errorf(err, errlen, "%s: read: %s", path, strerror(errno));
    close(fd);
    buf[rc == 0 ? n : 0] = '\0';
    return rc == 0 ? 1 : -1;
}

// meet_live: whether a root listens on the socket in the directory dfd
static inline int meet_live(int dfd) {
    char spec[64];
    snprintf(spec, sizeof(spec), "unix:/proc/self/fd/%d/rendezvous.sock", dfd);
    RdvAddr a;
    struct sockaddr_storage ss;
    if (rdv_parse(spec, &a, NULL, 0) != 0) return 0;
    socklen_t sl = rdv_sockaddr(&a, &ss);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int live = fd >= 0 && connect(fd, (struct sockaddr *)&ss, sl) == 0;
    if (fd >= 0) close(fd);
    return live;
}

// meet_lock_state: whether the "live" file of the meeting directory dfd is
// flocked (rank 0 takes the lock before it writes the key, and holds it for
// as long as it serves): 1 held, 0 when the file is missing or nobody holds
// it, -1 where the filesystem has no locks (ENOLCK, EOPNOTSUPP): it cannot
// tell
static inline int meet_lock_state(int dfd) {
    int fd = openat(dfd, "live", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    int state = -1;
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) state = 0;  // ours now: nobody serves; close lets go
    else if (errno == EWOULDBLOCK) state = 1;
    close(fd);
    return state;
}

// meet_held: whether the meeting directory dfd is this launch's rank 0's
// now: 1 when its "live" file is flocked, 0 when the file is missing or
// nobody holds it: a directory a killed launch of the same id left
// (torchrun's default id, "none" and port 29500, repeats from run to run),
// or one whose rank 0 has not got that far. Where the filesystem has no
// locks it cannot tell, and says 1, as before there was a lock.
static inline int meet_held(int dfd) { return meet_lock_state(dfd) != 0; }

// meet_sweep: removes the meeting directories of earlier launches that
// ended without removing theirs (killed): this user's, whose socket nobody
// listens on. One whose rank 0 is still starting has no socket yet, and one
// that met over TCP none at all: those are left alone.
static inline void meet_sweep(int parent, const char *mine) {
    int fd = dup(parent);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0) close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, MEET_PREFIX, strlen(MEET_PREFIX)) != 0 || strcmp(e->d_name, mine) == 0) continue;
        struct stat st;
        int sub = openat(parent, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue;
        int stale = fstat(sub, &st) == 0 && st.st_uid == geteuid() &&
                    fstatat(sub, "rendezvous.sock", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode) &&
                    !meet_live(sub);
        if (stale) meet_clear(sub);
        close(sub);
        if (stale) unlinkat(parent, e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

// meet_my_address: an IPv4 address of this box that the ranks of other
// nodes may reach: its first interface up that is not loopback
static inline void meet_my_address(char *out, size_t outlen) {
    snprintf(out, outlen, "127.0.0.1");
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0) return;
    for (struct ifaddrs *i = all; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET) continue;
        if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)outlen);
        break;
    }
    freeifaddrs(all);
}

// meet_open_folder: the folder of the plan, opened (L->meet_parent), when
// no other user can rename or remove what rank 0 makes in it: the folder
// must be this user's or root's, and one that group or others may write in
// must be sticky (mode +t, as /tmp is), so that only the owner of an entry
// (or of the folder: this user, or root) may rename or remove it. Otherwise
// another user could move the meeting directory away and another directory
// of this user's (a killed job's, with its old key) into its place, or just
// remove it; refused with one line.
static inline int meet_open_folder(Launch *L, const MeetPlan *plan, char *err, size_t errlen) {
    L->meet_parent = open(plan->folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (L->meet_parent < 0)
        return errorf(err, errlen, "flag %s %s: %s", plan->flag, plan->folder, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(L->meet_parent, &st) != 0)
        rc = errorf(err, errlen, "flag %s %s: fstat: %s", plan->flag, plan->folder, strerror(errno));
    else if (st.st_uid != geteuid() && st.st_uid != 0)
        rc = errorf(err, errlen, "flag %s %s: owned by uid %u, neither this user (uid %u) nor root: its owner could "
                    "replace the ranks' meeting directory; refused", plan->flag, plan->folder, (unsigned)st.st_uid,
                    (unsigned)geteuid());
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0)
        rc = errorf(err, errlen, "flag %s %s: mode %04o: group or others may write in it and it is not sticky, so "
                    "they could replace the ranks' meeting directory; chmod go-w or +t it; refused", plan->flag,
                    plan->folder, (unsigned)(st.st_mode & 07777));
    if (rc != 0) {
        close(L->meet_parent);
        L->meet_parent = -1;
        return -1;
    }
    snprintf(L->meet_name, sizeof(L->meet_name), "%s", plan->name);
    return 0;
}

// meet_host: rank 0 makes the meeting directory (0700, created here and
// never through a link), the job key in it, and serves the rendezvous on a
// socket in it (one box) or on TCP, its address written beside the key
static inline int meet_host(Launch *L, const MeetPlan *plan, double timeout_s, char *err, size_t errlen) {
    char shown[600];
    L->meet_lock = -1;
    snprintf(shown, sizeof(shown), "%s/%s", plan->folder, plan->name);
    if (meet_open_folder(L, plan, err, errlen) != 0) return -1;
    meet_sweep(L->meet_parent, plan->name);
    int made = mkdirat(L->meet_parent, plan->name, 0700) == 0, e = errno;
    if (!made && e == EEXIST) {
        // this launch's name, left by a launch of the same id that was killed, or planted
        int old = openat(L->meet_parent, plan->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (old < 0) {
            errorf(err, errlen, "%s: %s: not this job's meeting place; refused", shown,
                   meet_not_dir(L->meet_parent, plan->name, errno));
            close(L->meet_parent);
            return -1;
        }
        int rc = meet_dir_check(old, shown, err, errlen);
        // live: its socket answers (one box), or its rank 0 holds the lock on "live" (TCP leaves no socket)
        if (rc == 0 && (meet_live(old) || meet_lock_state(old) == 1))
            rc = errorf(err, errlen, "%s: another job of this id is meeting there", shown);
        if (rc == 0) meet_clear(old);
        close(old);
        if (rc != 0) {
            close(L->meet_parent);
            return -1;
        }
        unlinkat(L->meet_parent, plan->name, AT_REMOVEDIR);
        made = mkdirat(L->meet_parent, plan->name, 0700) == 0;
        e = errno;
    }
    if (!made) {
        close(L->meet_parent);
        return errorf(err, errlen, "%s: mkdir: %s", shown, strerror(e));
    }
    L->meet_dir = openat(L->meet_parent, plan->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (L->meet_dir < 0) {
        e = errno;
        unlinkat(L->meet_parent, plan->name, AT_REMOVEDIR);
        close(L->meet_parent);
        return errorf(err, errlen, "%s: %s", shown, strerror(e));
    }
    L->meet = L->meet_made = 1;
    char text[80];
    if (meet_dir_check(L->meet_dir, shown, err, errlen) != 0 || key_generate(L->key, err, errlen) != 0) return -1;
    // the lock that tells the other ranks this directory is served now (meet_held), taken before the key
    // is in: a blocking flock, as a rank testing it holds it for an instant
    L->meet_lock = openat(L->meet_dir, "live", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (L->meet_lock < 0) return errorf(err, errlen, "%s/live: %s", shown, strerror(errno));
    while (flock(L->meet_lock, LOCK_EX) != 0)
        if (errno != EINTR) {
            if (errno == ENOLCK || errno == EOPNOTSUPP) break;  // no locks here: the ranks cannot test it either
            return errorf(err, errlen, "%s/live: flock: %s", shown, strerror(errno));
        }
    to_hex(L->key, KEY_BYTES, text);
    snprintf(text + 64, sizeof(text) - 64, "\n");
    int rc = meet_write(L->meet_dir, "key", text, shown, err, errlen);
    secure_wipe(text, sizeof(text));
    if (rc != 0) return -1;
    // the socket's path runs through this process's fd of the directory: short whatever -o's length
    // (a unix socket's path is at most 107 bytes), and always the directory checked just now
    if (plan->one_box) snprintf(L->rendezvous, sizeof(L->rendezvous), "unix:/proc/self/fd/%d/rendezvous.sock", L->meet_dir);
    else snprintf(L->rendezvous, sizeof(L->rendezvous), "tcp:0.0.0.0:0");
    if (launch_serve(L, timeout_s, err, errlen) != 0) return -1;
    if (!plan->one_box) {
        char ip[INET_ADDRSTRLEN], addr[96];
        meet_my_address(ip, sizeof(ip));
        snprintf(addr, sizeof(addr), "tcp:%s:%d\n", ip, L->server->addr.port);
        if (meet_write(L->meet_dir, "address", addr, shown, err, errlen) != 0) return -1;
        snprintf(L->rendezvous, sizeof(L->rendezvous), "tcp:127.0.0.1:%d", L->server->addr.port);
    }
    return 0;
}

// meet_join: a rank other than 0 waits, up to timeout_s, for rank 0's
// meeting directory, checks it is this user's and private, and takes the
// key and the rendezvous address from it once rank 0 holds its lock
// (meet_held): a killed launch's directory of the same name is waited past
static inline int meet_join(Launch *L, const MeetPlan *plan, double timeout_s, char *err, size_t errlen) {
    char shown[600];
    snprintf(shown, sizeof(shown), "%s/%s", plan->folder, plan->name);
    if (meet_open_folder(L, plan, err, errlen) != 0) return -1;
    double deadline = par_now() + timeout_s;
    int unheld = 0;  // the last look found a key whose directory nobody serves
    for (;;) {
        int fd = openat(L->meet_parent, plan->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), got = 0;
        if (fd < 0 && errno != ENOENT) {
            errorf(err, errlen, "%s: %s: not this job's meeting place; refused", shown,
                   meet_not_dir(L->meet_parent, plan->name, errno));
            close(L->meet_parent);
            return -1;
        }
        char text[300];
        if (fd >= 0) got = meet_dir_check(fd, shown, err, errlen) == 0 ? meet_read(fd, "key", text, sizeof(text), shown,
                                                                                     err, errlen) : -1;
        if (got == 1) {
            size_t n = strlen(text);
            if (!(n == 64 || (n == 65 && text[64] == '\n')) || hex_decode(text, 32, L->key, 0) != 0 || key_is_zero(L->key))
                got = errorf(err, errlen, "%s/key: not 64 hex digits of a key", shown);
        }
        secure_wipe(text, sizeof(text));
        // a directory whose rank 0 does not hold its lock is a killed launch's, of the same id: its key and
        // socket (or address) are dead, so it is never taken, only waited past, until this launch's rank 0
        // has put its own in its place
        unheld = got == 1 && !meet_held(fd);
        if (unheld) {
            got = 0;
            secure_wipe(L->key, sizeof(L->key));
        }
        struct stat st;
        if (got == 1 && fstatat(fd, "rendezvous.sock", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode)) {
            snprintf(L->rendezvous, sizeof(L->rendezvous), "unix:/proc/self/fd/%d/rendezvous.sock", fd);
        } else if (got == 1) {
            got = meet_read(fd, "address", text, sizeof(text), shown, err, errlen);
            text[strcspn(text, "\n")] = '\0';
            RdvAddr a;
            if (got == 1 && (strncmp(text, "tcp:", 4) != 0 || rdv_parse(text, &a, err, errlen) != 0))
                got = errorf(err, errlen, "%s/address: '%.60s' is not tcp:HOST:PORT", shown, text);
            if (got == 1) snprintf(L->rendezvous, sizeof(L->rendezvous), "%s", text);
        }
        if (got == 1 && L->rendezvous[0] != '\0') {
            L->meet_dir = fd;
            L->meet = 1;
            return 0;
        }
        if (fd >= 0) close(fd);
        if (got < 0) {
            close(L->meet_parent);
            secure_wipe(L->key, sizeof(L->key));
            return -1;
        }
        if (par_now() > deadline) {
            close(L->meet_parent);
            secure_wipe(L->key, sizeof(L->key));
            // a key there all along but no lock: a killed launch's directory that no rank 0 came to replace, or
            // rank 0's on a filesystem whose locks this node does not see (NFS mounted with local_lock)
            if (unheld)
                return errorf(err, errlen, "rank %d: %s holds a key, but no process holds the lock on its file live "
                              "within %g s (-to): a killed launch's directory that no rank 0 replaced, or one on a "
                              "filesystem whose locks this node does not see (NFS mounted with local_lock)", L->rank,
                              shown, timeout_s);
            return errorf(err, errlen, "rank %d: no key and rendezvous from rank 0 in %s within %.0f s (-to)", L->rank,
                          shown, timeout_s);
        }
        par_sleep(0.02);
    }
}

// launcher_stop: SIGTERM to every live rank, then SIGKILL after the grace period
static inline void launcher_stop(pid_t *pids, int np, double *kill_at) {
    for (int i = 0; i < np; i++) {
        if (pids[i] > 0) kill(pids[i], SIGTERM);
    }
    *kill_at = par_now() + LAUNCH_GRACE_S;
}

// launcher_socket_dir: a fresh 0700 directory (mkdtemp) under $TMPDIR, or
// /tmp, and in spec the rendezvous address of the socket that goes in it
static inline int launcher_socket_dir(char *dir, size_t dirlen, char *spec, size_t speclen, char *err, size_t errlen) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, dirlen, "%s/llm3d-XXXXXX", tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 200 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        errorf(err, errlen, "launcher: mkdtemp %s: %s", dir, strerror(errno));
        return PARALLEL_RUNTIME;
    }
    snprintf(spec, speclen, "unix:%s/rendezvous.sock", dir);
    return 0;
}

// the signals that ask a job to stop: a trainer with -o catches them and
// checkpoints (checkpoint.h); a launcher passes the first on to its ranks.
// SIGTERM always; SIGINT and SIGHUP unless they are ignored here, as they
// are when the process was started so (a background job of a shell, nohup)
// and ckpt_catch_signals left them: such a job keeps ignoring them. Left
// out, they are never held, so they are dropped as they come (a held one,
// even ignored, would be queued and read from the launcher's signalfd), and
// a rank inherits them ignored across its exec
static inline void par_stop_signals(sigset_t *set) {
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    int maybe[2] = {SIGINT, SIGHUP};
    for (int i = 0; i < 2; i++) {
        struct sigaction now;
        if (sigaction(maybe[i], NULL, &now) == 0 && !(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_IGN) continue;
        sigaddset(set, maybe[i]);
    }
}

// par_unblock_stop_signals: a process that trains takes the stop signals
// from here on. Until now they were held: from fork to exec in a rank of our
// launcher (which still had the launcher's handler, whose flag the exec
// would drop), and while a trainer with a handler checked its job. One that
// came meanwhile is pending, and is delivered now, to the handler the
// trainer installed before calling parallel_main.
static inline void par_unblock_stop_signals(void) {
    sigset_t set;
    par_stop_signals(&set);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
}

// launcher_exec_rank: the child forked for rank i of np becomes that rank:
// the environment that says so, then this program again with the same
// arguments. key_pipe: the pipe its key comes through. The stop signals
// stay blocked across the exec (a signal blocked is kept pending by it; one
// caught by the launcher's handler here would be lost with that handler):
// the rank's parallel_main unblocks them. Never returns.
static inline void launcher_exec_rank(const char *exe, char **argv, int i, int np, const int key_pipe[2],
                                      pid_t launcher, const char *spec, const sigset_t *old_mask) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the ranks never outlive the launcher
    if (getppid() != launcher) _exit(1);
    sigset_t mask = *old_mask, stop;
    par_stop_signals(&stop);
    for (int sig = 1; sig < NSIG; sig++) if (sigismember(&stop, sig) == 1) sigaddset(&mask, sig);
    sigprocmask(SIG_SETMASK, &mask, NULL);  // the launcher's, SIGCHLD open again, the stop signals held
    signal(SIGPIPE, SIG_DFL);
    close(key_pipe[1]);
    fcntl(key_pipe[0], F_SETFD, 0);  // this one pipe, and no other, survives the exec
    char v[32];
    snprintf(v, sizeof(v), "%d", i); setenv("LLM3D_RANK", v, 1); setenv("LLM3D_LOCAL_RANK", v, 1);
    snprintf(v, sizeof(v), "%d", np); setenv("LLM3D_WORLD", v, 1);
    snprintf(v, sizeof(v), "%d", key_pipe[0]); setenv("LLM3D_KEY_FD", v, 1);
    snprintf(v, sizeof(v), "%d", (int)launcher); setenv("LLM3D_LAUNCHER_PID", v, 1);
    setenv("LLM3D_RENDEZVOUS", spec, 1);
    execv(exe, argv);
    fprintf(stderr, "launcher: rank %d: exec %s: %s\n", i, exe, strerror(errno));
    _exit(127);
}

// launcher_start_ranks: forks np ranks (launcher_exec_rank) and writes each
// the key through a pipe of its own; pids[i] gets rank i's pid. Returns how
// many started; sets *failed, and err, when one could not be.
static inline int launcher_start_ranks(const char *exe, char **argv, int np, const char *spec, const uint8_t key[32],
                                       const sigset_t *old_mask, pid_t *pids, int *failed, char *err, size_t errlen) {
    pid_t me = getpid();
    int started = 0;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < np && !*failed; i++) {
        int kfd[2];
        if (pipe(kfd) != 0 || fcntl(kfd[0], F_SETFD, FD_CLOEXEC) != 0 || fcntl(kfd[1], F_SETFD, FD_CLOEXEC) != 0) {
            errorf(err, errlen, "launcher: pipe for rank %d: %s", i, strerror(errno));
            *failed = 1;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) launcher_exec_rank(exe, argv, i, np, kfd, me, spec, old_mask);
        close(kfd[0]);
        if (pid < 0) {
            errorf(err, errlen, "launcher: fork for rank %d: %s", i, strerror(errno));
            close(kfd[1]);
            *failed = 1;
            break;
        }
        pids[i] = pid;
        started++;
        key_write_fd(kfd[1], key, NULL, 0);  // a rank that does not get its key says so itself
        close(kfd[1]);
    }
    return started;
}

// launcher_wait: serves the rendezvous and watches the alive ranks until
// every one has exited. The first rank to fail, or the rendezvous timing
// out, ends the job (failed: a rank could not be started, so it is ending
// already); a first signal asks the ranks to stop, a second kills them.
// Returns the launcher's exit status: 0, the failed rank's status, or 1.
static inline int launcher_wait(RdvServer *srv, int sfd, pid_t *pids, int np, int alive, int failed) {
    double kill_at = 0;
    int stopping = 0, draining = 0;
    if (failed) {
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
    return failed;
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
    char dir[256], spec[300];
    if (launcher_socket_dir(dir, sizeof(dir), spec, sizeof(spec), err, errlen) != 0) return PARALLEL_RUNTIME;
    char shm_name[COMM_NAME_BYTES];
    if (shm_create(shm_name, np, job_id_from_key(key), err, errlen) != 0) {
        rmdir(dir);
        return PARALLEL_RUNTIME;
    }
    RdvServer *srv = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (srv == NULL || rdv_server_open(srv, spec, np, key, shm_name, timeout_s, err, errlen) != 0) {
        if (srv == NULL) errorf(err, errlen, "launcher: out of memory");
        free(srv);
        shm_unlink(shm_name);
        rmdir(dir);
        return PARALLEL_RUNTIME;
    }
    // child exits and the signals that end the job arrive through a signalfd
    // polled with the rendezvous socket: no handler, no global flag
    // (a stop signal that came while the trainer checked the job, held by it,
    // is pending and is read from the signalfd like any later one)
    sigset_t mask, old;
    par_stop_signals(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, &old);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);  // a rank that dies before reading its key must not take us down
    pid_t pids[GRID_MAX_WORLD];
    memset(pids, 0, sizeof(pids));
    int failed = 0;
    int started = launcher_start_ranks(exe, argv, np, spec, key, &old, pids, &failed, err, errlen);
    secure_wipe(key, sizeof(key));
    if (failed) fprintf(stderr, "%s\n", err);
    failed = launcher_wait(srv, sfd, pids, np, started, failed);
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
// set, for main() to print and exit with. Before it returns 0 it unblocks
// SIGINT, SIGTERM and SIGHUP (par_unblock_stop_signals): install their
// handlers first.
//
//   LLM3D_RANK in the environment           a rank: LLM3D_WORLD, LLM3D_LOCAL_RANK,
//                                            rendezvous from --rendezvous or LLM3D_RENDEZVOUS,
//                                            key from --key-file or LLM3D_KEY_FD
//   --rendezvous given                      a rank of an outside launcher: rank and world from
//                                            RANK/WORLD_SIZE/LOCAL_RANK (torchrun), OMPI_COMM_WORLD_*,
//                                            or SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; --key-file
//   an outside launcher's world above 1     a rank that meets the others as meet (llm.c's -pi and
//   (its variables, or llm.c's -pn)          the rest) says: in a directory of -o or -pf (meet_plan,
//                                            meet_host, meet_join), or at -ps with --key-file
//   otherwise, -np > 1                      the launcher
//   otherwise                               a single process (world 1)
//
// Rank 0 serves the rendezvous itself (a thread) unless LLM3D_LAUNCHER_PID
// says our launcher does.
static inline int parallel_main(int argc, char **argv, int np, const char *rendezvous, const char *key_file,
                                const LaunchMeet *meet, double timeout_s, Launch *L, char *err, size_t errlen) {
    memset(L, 0, sizeof(*L));
    L->source = "none";
    (void)argc;
    if (np < 1 || np > GRID_MAX_WORLD) {
        errorf(err, errlen, "-np %d: the number of ranks must be 1..%d", np, GRID_MAX_WORLD);
        return PARALLEL_USAGE;
    }
    if (!(timeout_s > 0 && timeout_s <= 86400)) {
        errorf(err, errlen, "-to %g: the timeout must be > 0 and <= 86400 seconds", timeout_s);
        return PARALLEL_USAGE;
    }
    if (rendezvous != NULL) {
        RdvAddr a;
        if (rdv_parse(rendezvous, &a, err, errlen) != 0) return PARALLEL_USAGE;
    }
    double rdv_timeout = timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s;
    MeetPlan plan;
    int planned = meet_plan(meet, rendezvous, key_file, np, L, &plan, err, errlen);
    if (planned < 0) return PARALLEL_USAGE;
    if (planned) {
        L->mode = LAUNCH_RANK;
        if (!plan.by_dir) {  // -pi tcp: as --rendezvous
            snprintf(L->rendezvous, sizeof(L->rendezvous), "%s", plan.spec);
            if (key_read_file(key_file, L->key, err, errlen) != 0) return PARALLEL_USAGE;
            if (L->rank == 0 && launch_serve(L, rdv_timeout, err, errlen) != 0) return PARALLEL_RUNTIME;
        } else if (L->rank == 0) {
            if (meet_host(L, &plan, rdv_timeout, err, errlen) != 0) {
                launch_free(L);
                return PARALLEL_RUNTIME;
            }
        } else if (meet_join(L, &plan, rdv_timeout, err, errlen) != 0) {
            return PARALLEL_RUNTIME;
        }
        par_unblock_stop_signals();
        return 0;
    }
    L->source = "none";
    int own = getenv("LLM3D_RANK") != NULL;
    int found = par_env_rank(L, rendezvous != NULL && !own, err, errlen);
    if (found < 0) return PARALLEL_USAGE;
    if (found == 0 && rendezvous != NULL) {
        errorf(err, errlen, "--rendezvous %s: no rank in the environment (LLM3D_RANK, RANK, "
               "OMPI_COMM_WORLD_RANK or SLURM_PROCID)", rendezvous);
        return PARALLEL_USAGE;
    }
    if (found == 0) {
        if (np == 1) {
            L->mode = LAUNCH_SINGLE;
            L->world = 1;
            if (key_generate(L->key, err, errlen) != 0) return PARALLEL_RUNTIME;
            par_unblock_stop_signals();
            return 0;
        }
        return launcher_run(argv, np, rdv_timeout, key_file, err, errlen);
    }
    const char *spec = rendezvous != NULL ? rendezvous : getenv("LLM3D_RENDEZVOUS");
    if (spec == NULL) {
        errorf(err, errlen, "rank %d (%s): no --rendezvous (nor LLM3D_RENDEZVOUS) to join",
               L->rank, L->source);
        return PARALLEL_USAGE;
    }
    if (strlen(spec) >= sizeof(L->rendezvous)) {
        errorf(err, errlen, "rendezvous '%.40s...' is too long", spec);
        return PARALLEL_USAGE;
    }
    snprintf(L->rendezvous, sizeof(L->rendezvous), "%s", spec);
    if (np > 1 && np != L->world) {
        errorf(err, errlen, "-np %d, but the launcher (%s) says the world is %d", np, L->source,
               L->world);
        return PARALLEL_USAGE;
    }
    if (key_file != NULL) {
        if (key_read_file(key_file, L->key, err, errlen) != 0) return PARALLEL_USAGE;
    } else {
        int fd = -1;
        int got = par_env_int("LLM3D_KEY_FD", 0, INT_MAX, &fd, err, errlen);
        if (got < 0) return PARALLEL_USAGE;
        if (got == 0) {
            errorf(err, errlen, "rank %d (%s): no --key-file (nor LLM3D_KEY_FD) for the job key",
                   L->rank, L->source);
            return PARALLEL_USAGE;
        }
        int rc = key_read_fd(fd, L->key, err, errlen);
        close(fd);
        if (rc != 0) return PARALLEL_RUNTIME;
    }
    L->mode = LAUNCH_RANK;
    if (L->rank == 0 && getenv("LLM3D_LAUNCHER_PID") == NULL) {
        if (launch_serve(L, rdv_timeout, err, errlen) != 0) return PARALLEL_RUNTIME;
    }
    par_unblock_stop_signals();
    return 0;
}

// parallel_world: how many ranks the job will have, known before joining it
// (a trainer checks the batch split and the layout first, and must blame
// -np, not the flag whose check -np's mistake fails): the outside
// launcher's world when --rendezvous is given and its variables are set,
// else np. -1 with err set when -np > 1 names another world than the
// outside launcher's, or its variables are malformed.
static inline int parallel_world(int np, const char *rendezvous, const char *key_file, const LaunchMeet *meet,
                                 char *err, size_t errlen) {
    Launch L;
    memset(&L, 0, sizeof(L));
    MeetPlan plan;
    int planned = meet_plan(meet, rendezvous, key_file, np, &L, &plan, err, errlen);
    if (planned != 0) return planned < 0 ? -1 : L.world;
    int foreign = rendezvous != NULL && getenv("LLM3D_RANK") == NULL;
    int found = foreign ? par_env_rank(&L, 1, err, errlen) : 0;
    if (found < 0) return -1;
    if (found == 0) return np;
    if (np > 1 && np != L.world)
        return errorf(err, errlen, "-np %d, but the launcher (%s) says the world is %d", np, L.source, L.world);
    return L.world;
}

// parallel_will_launch: whether parallel_main will make this process the
// launcher of np ranks (not a rank of an outside launcher's)
static inline int parallel_will_launch(int np, const char *rendezvous, const char *key_file, const LaunchMeet *meet) {
    if (np <= 1 || rendezvous != NULL || getenv("LLM3D_RANK") != NULL) return 0;
    Launch L;
    memset(&L, 0, sizeof(L));
    L.source = "none";
    MeetPlan plan;
    char err[8];
    return meet_plan(meet, rendezvous, key_file, np, &L, &plan, err, sizeof(err)) == 0;
}

// parallel_launched_rank: whether this process is a rank our own launcher
// started (it checked the job moments before)
static inline int parallel_launched_rank(void) { return getenv("LLM3D_LAUNCHER_PID") != NULL; }

// parallel_join: what a trainer's main() calls first: parallel_main (in the
// launcher it never returns), then this process's place in the grid of
// world = dp x pp x tp ranks. Returns 0, or PARALLEL_USAGE / PARALLEL_RUNTIME
// with err set.
static inline int parallel_join(int argc, char **argv, int np, int tp, int pp, const char *rendezvous,
                                const char *key_file, const LaunchMeet *meet, double timeout_s, Launch *L, Grid *g,
                                char *err, size_t errlen) {
    int rc = parallel_main(argc, argv, np, rendezvous, key_file, meet, timeout_s, L, err, errlen);
    if (rc != 0) return rc;
    int world = L->mode == LAUNCH_RANK ? L->world : 1;
    if (grid_init(g, world, tp, pp, L->rank, err, errlen) != 0) return PARALLEL_USAGE;
    g->local_rank = L->local_rank;
    return 0;
}

#endif
