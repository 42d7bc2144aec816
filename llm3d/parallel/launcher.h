/*
 * launcher.h: how a job of N ranks starts: the launcher, which starts N
 * copies of this program, and how each process learns what it is.
 *
 * defines:
 *   Launch, parallel_main, parallel_world, parallel_launched_rank,
 *   parallel_join          what a trainer's main() calls, first thing
 *   launcher_run           the launcher: the key, the socket, the segment,
 *                          the ranks (fork and exec), the rendezvous served,
 *                          and the wait for the ranks to end
 *   launch_serve, launch_free
 *                          rank 0 of an outside launch serves the rendezvous
 *   par_env_int, par_env_rank
 *                          rank and world from the environment (LLM3D_*,
 *                          torchrun, Open MPI, Slurm)
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
 * --key-file), or the single process of a one-rank run. The ranks then find
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

#include <limits.h>
#include <pthread.h>
#include <signal.h>
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
        return errorf(err, errlen, "rendezvous: out of memory");
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
        return errorf(err, errlen, "rendezvous: pthread_create: %s", strerror(e));
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
        return launcher_run(argv, np, timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s, key_file, err, errlen);
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
        if (launch_serve(L, timeout_s < RDV_MIN_TIMEOUT_S ? RDV_MIN_TIMEOUT_S : timeout_s, err, errlen) != 0)
            return PARALLEL_RUNTIME;
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
static inline int parallel_world(int np, const char *rendezvous, char *err, size_t errlen) {
    Launch L;
    memset(&L, 0, sizeof(L));
    int foreign = rendezvous != NULL && getenv("LLM3D_RANK") == NULL;
    int found = foreign ? par_env_rank(&L, 1, err, errlen) : 0;
    if (found < 0) return -1;
    if (found == 0) return np;
    if (np > 1 && np != L.world)
        return errorf(err, errlen, "-np %d, but the launcher (%s) says the world is %d", np, L.source, L.world);
    return L.world;
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

#endif
