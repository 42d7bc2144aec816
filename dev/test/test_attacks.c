/*
 * test_attacks.c: attacks on a job, kept as repeatable cases. Each case
 * plays the attacker (another user of the machine, or a faulty environment)
 * against the real code: the rendezvous, the launcher and ./train_gpt2
 * itself, and checks that the promise of doc/security.md holds.
 *
 * Cases that need another user run that part in a forked child that drops
 * to uid/gid 65534 (nobody) when this runs as root; elsewhere they skip with
 * a line, or play the attacker as this user where the attack does not rest
 * on the uid. Every case is bounded in time (children are killed at their
 * deadline) and works in a fresh directory under $TMPDIR or /tmp, removed at
 * the end with all it holds.
 *
 * defines: the helpers (other-user children, trainer runs with a deadline,
 * on test_run.h's), then one function per attack, in the order of
 * doc/security.md's "Attacks tested".
 */
#define _GNU_SOURCE
#include "llm3d/gpt2.h"
#include "llm3d/json.h"
#include "parallel.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "llm3d/checkpoint.h"        // ckpt_list_at: the checkpoints a run left
#include "llm3d/secure/manifest.h"  // an attacker's MANIFEST, under the public all-zero key

#include <dirent.h>
#include <grp.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/un.h>

static char work[256];                  // this run's directory
static const char *OTHER_USER = "uid 65534";
#define NOBODY 65534

// ----------------------------------------------------------------------------
// helpers

static int is_root(void) { return geteuid() == 0; }

// drop_to_nobody: in a forked child only; 0 done, -1 not possible
static int drop_to_nobody(void) {
    if (!is_root()) return -1;
    return setgroups(0, NULL) == 0 && setgid(NOBODY) == 0 && setuid(NOBODY) == 0 ? 0 : -1;
}

// read_byte: one byte from fd within timeout_s, or 0
static char read_byte(int fd, double timeout_s) {
    char c = 0;
    if (par_wait_fd(fd, POLLIN, par_now() + timeout_s) == 1 && read(fd, &c, 1) != 1) c = 0;
    return c;
}

// the tiny job every trainer run here trains: a d2 model on one shard
static char shard[300], key_path[300];
static const char *TINY = "-e d2 -ev 256 -et 32 -b 2 -t 16 -d 128 -l 1e-3 -v 0 -s 0 -th 1";

// spawn_trainer: ./train_gpt2 TINY -i shard, then args (a command line split
// on spaces), with env entries "K=V" (NULL-terminated) added, stdout and
// stderr into a new out_path, in a process group of its own; SIGINT and
// SIGHUP at their defaults, or ignored with ignore_stop (test_spawn_with)
static pid_t spawn_trainer_with(const char *args, const char *const *env, const char *out_path, int ignore_stop) {
    char line[2048];
    snprintf(line, sizeof(line), "./train_gpt2 %s -i %s %s", TINY, shard, args);
    char *argv[64];
    int n = 0;
    for (char *tok = strtok(line, " "); tok != NULL && n < 63; tok = strtok(NULL, " ")) argv[n++] = tok;
    argv[n] = NULL;
    unlink(out_path);
    return test_spawn_with(argv, env, out_path, NULL, ignore_stop);
}

static pid_t spawn_trainer(const char *args, const char *const *env, const char *out_path) {
    return spawn_trainer_with(args, env, out_path, 0);
}

typedef struct { int status; double seconds; char *out; int lines; } TrainerRun;

// trainer_ended: r of the trainer pid, started at t0 with its output into
// out_path, waited for at most timeout_s (status -1 then); lines: the
// output's lines that name the trainer (its error lines)
static TrainerRun trainer_ended(pid_t pid, double t0, const char *out_path, double timeout_s) {
    TrainerRun r;
    r.status = test_wait(pid, timeout_s, NULL);
    r.seconds = test_now() - t0;
    r.out = test_read_text(out_path);
    r.lines = test_count(r.out, "train_gpt2:");
    return r;
}

// lines_in: how many lines the file at path holds
static int lines_in(const char *path) {
    char *text = test_read_text(path);
    int n = test_count(text, "\n");
    free(text);
    return n;
}

// run_trainer: spawn_trainer, then trainer_ended
static TrainerRun run_trainer(const char *args, const char *const *env, double timeout_s) {
    char out_path[300];
    snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
    double t0 = test_now();
    return trainer_ended(spawn_trainer(args, env, out_path), t0, out_path, timeout_s);
}

// the lines of the log at path: how many, and how many are not one whole
// JSON object each (json.h's grammar: NaN is not JSON)
static int log_lines(const char *path, int *bad) {
    char *text = test_read_text(path);
    int n = 0;
    *bad = 0;
    for (char *line = text; *line != '\0'; n++) {
        char *end = strchr(line, '\n');
        size_t len = end != NULL ? (size_t)(end - line) : strlen(line);
        JsonReader j;
        json_init(&j, line, len);
        if (end == NULL || json_peek(&j) != '{' || json_skip_value(&j) != 0 || json_at_end(&j) != 0) (*bad)++;
        line += len + (end != NULL);
    }
    free(text);
    return n;
}

// ----------------------------------------------------------------------------
// the rendezvous: a hello captured from one job, replayed into the next

// the squatter: listens on port first, plays the root to the rank that
// connects (a challenge of its own, then it records the hello), and replays
// the hello into the real root at port2. Tells the parent 'r' when it
// listens, then how the real root took the replay: 'A' answered, 'R'
// rejected, 'T' nothing within 3 s, 'E' the attack itself failed.
static void squatter(int port, int port2, int report) {
    char result = 'E';
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 4) != 0) goto done;
    if (write(report, "r", 1) != 1) goto done;
    if (par_wait_fd(lfd, POLLIN, par_now() + 5.0) != 1) goto done;
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) goto done;
    uint8_t msg[4 + RDV_MAX_MSG], challenge[5 + 16];
    put_u32(challenge, 17);
    challenge[4] = 'C';
    key_generate(msg, NULL, 0);
    memcpy(challenge + 5, msg, 16);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (par_send_all(fd, challenge, sizeof(challenge), par_now() + 2.0) != 0 ||
        par_recv_all(fd, msg, 4, par_now() + 3.0) != 0 || get_u32(msg) > RDV_MAX_MSG ||
        par_recv_all(fd, msg + 4, get_u32(msg), par_now() + 3.0) != 0)
        goto done;
    close(fd);
    size_t hello_len = 4 + get_u32(msg);
    // the replay, into the next job's root
    char spec[64];
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", port2);
    RdvAddr a;
    char err[256];
    if (rdv_parse(spec, &a, err, sizeof(err)) != 0) goto done;
    fd = rdv_connect(&a, par_now() + 3.0, err, sizeof(err));
    if (fd < 0) goto done;
    uint8_t in[4 + RDV_MAX_MSG];
    // a root that speaks first (a challenge) is heard out and ignored
    if (par_wait_fd(fd, POLLIN, par_now() + 0.5) == 1 && par_recv_all(fd, in, 4, par_now() + 1.0) == 0)
        par_recv_all(fd, in + 4, get_u32(in) <= RDV_MAX_MSG ? get_u32(in) : 0, par_now() + 1.0);
    if (par_send_all(fd, msg, hello_len, par_now() + 2.0) != 0) goto done;
    int rc = par_recv_all(fd, in, 5, par_now() + 3.0);
    result = rc == 0 ? (char)in[4] : rc == -3 ? 'T' : 'R';  // a root that hangs up has refused it
    close(fd);
done:
    if (write(report, &result, 1) != 1) _exit(1);
    _exit(0);
}

// a rank joining spec as rank of 2; exit 0 when it joined
static pid_t honest_rank(const char *spec, const uint8_t key[32], int rank, double timeout_s) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    RdvAnswer ans;
    char err[512];
    _exit(rdv_join(spec, key, job_id_from_key(key), rank, 2, rank, NULL, timeout_s, &ans, err, sizeof(err)) == 0 ? 0 : 1);
}

// Another user squats the TCP port of a job (first to bind it), so a rank of
// that job hands it a hello sealed with the job's --key-file. The next job of
// that key file must refuse the hello when it is replayed, and its real rank
// 1 must still get in.
static void test_hello_replay(void) {
    uint8_t key[32];
    key_generate(key, NULL, 0);
    int port = test_free_port(), port2 = test_free_port();
    char spec[64], spec2[64], err[512];
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", port);
    snprintf(spec2, sizeof(spec2), "tcp:127.0.0.1:%d", port2);
    RdvServer *s = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (rdv_server_open(s, spec2, 2, key, "/llm3d-attack", 10.0, err, sizeof(err)) != 0) {
        check(0, "hello replay: the next job's root listens on %s: %s", spec2, err);
        free(s);
        return;
    }
    int pipefd[2];
    if (pipe(pipefd) != 0) return;
    fflush(NULL);
    pid_t att = fork();
    if (att == 0) {
        close(pipefd[0]);
        if (is_root() && drop_to_nobody() != 0) _exit(3);
        squatter(port, port2, pipefd[1]);
    }
    close(pipefd[1]);
    const char *who = is_root() ? OTHER_USER : "this user (not root: no other uid)";
    pid_t victim = -1;
    if (read_byte(pipefd[0], 5.0) == 'r') victim = honest_rank(spec, key, 1, 3.0);
    // serve the next job while the squatter replays what it caught
    char result = 0;
    double t0 = par_now();
    while (result == 0 && par_now() - t0 < 8.0) {
        rdv_server_step(s, -1, 20);
        if (par_wait_fd(pipefd[0], POLLIN, par_now() + 0.001) == 1) result = read_byte(pipefd[0], 0.1);
    }
    close(pipefd[0]);
    if (victim > 0) test_wait(victim, 5.0, NULL);
    test_wait(att, 5.0, NULL);
    check(result == 'R' && s->joined == 0 && strstr(s->last_reject, "replayed") != NULL,
          "hello replay by %s: a hello captured on a squatted port is refused by the next job (reply '%c', %d joined): "
          "\"%s\"", who, result ? result : '?', s->joined, s->last_reject);
    pid_t r0 = honest_rank(spec2, key, 0, 5.0), r1 = honest_rank(spec2, key, 1, 5.0);
    t0 = par_now();
    while (!s->answered && par_now() - t0 < 6.0) rdv_server_step(s, -1, 20);
    int s0 = test_wait(r0, 5.0, NULL), s1 = test_wait(r1, 5.0, NULL);
    check(s->answered && s0 == 0 && s1 == 0, "hello replay: the real ranks 0 and 1 still join that job (%d %d)", s0, s1);
    rdv_server_close(s);
    free(s);
}

// ----------------------------------------------------------------------------
// the rendezvous: a flood of idle connections to a TCP root

// flooder: connects to port until the root listens (10 s at most), then
// opens `n` connections in all, says nothing on any, tells the parent 'r'
// (or 'E' when the root never listened) and holds them until the parent
// closes `hold`
static void flooder(int port, int n, int report, int hold) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    int open_ = 0;
    double t0 = par_now();
    while (open_ < n && par_now() - t0 < 10.0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            open_++;  // left open, silent: the fd is never closed till the end
            continue;
        }
        if (fd >= 0) close(fd);
        par_sleep(0.01);
    }
    char c = open_ == n ? 'r' : 'E';
    if (write(report, &c, 1) != 1) _exit(1);
    read_byte(hold, 60.0);
    _exit(0);
}

// Another local user opens 100 idle connections to rank 0's TCP rendezvous
// once it listens (more than the RDV_MAX_PENDING the root keeps waiting),
// then rank 1 starts. The job must still start and finish: the root drops
// the oldest silent connection for a new one and any silent one after
// RDV_HELLO_S, and says so in a bounded number of lines
static void test_idle_flood(void) {
    int port = test_free_port();
    char args[1200], out0[300], out1[300];
    snprintf(args, sizeof(args), "-x 2 -to 10 --rendezvous tcp:127.0.0.1:%d --key-file %s", port, key_path);
    snprintf(out0, sizeof(out0), "%s/flood0.out", work);
    snprintf(out1, sizeof(out1), "%s/flood1.out", work);
    int rep[2], hold[2];
    if (pipe(rep) != 0 || pipe(hold) != 0) return;
    const char *env0[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
    const char *env1[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", NULL};
    double t0 = test_now();
    pid_t r0 = spawn_trainer(args, env0, out0), r1 = -1;
    fflush(NULL);
    pid_t att = fork();
    if (att == 0) {
        close(rep[0]);
        close(hold[1]);
        if (is_root() && drop_to_nobody() != 0) _exit(3);
        flooder(port, 100, rep[1], hold[0]);
    }
    close(rep[1]);
    close(hold[0]);
    char ready = read_byte(rep[0], 12.0);
    if (ready == 'r') r1 = spawn_trainer(args, env1, out1);
    TrainerRun a = trainer_ended(r0, t0, out0, 40.0), b = trainer_ended(r1, t0, out1, 40.0);
    close(hold[1]);  // the flooder lets go
    close(rep[0]);
    test_wait(att, 5.0, NULL);
    int drops = test_count(a.out, "rendezvous: dropped");
    check(ready == 'r' && a.status == 0 && b.status == 0 && strstr(a.out, "step    1/2") != NULL && drops >= 1 &&
          drops <= RDV_DROPS_LOGGED, "idle flood by %s: 100 silent connections to rank 0's tcp rendezvous, then rank 1: "
          "the job starts and ends (%c, exit %d %d, %.1f s, %d lines of drops): %s", is_root() ? OTHER_USER : "this user",
          ready ? ready : '?', a.status, b.status, a.seconds, drops,
          test_line_of(b.status != 0 ? b.out : a.out, b.status != 0 ? "rendezvous" : "dropped"));
    free(a.out);
    free(b.out);
}

// ----------------------------------------------------------------------------
// the ranks of mpirun without --rendezvous: their meeting place in -o

// the Open MPI variables of rank r of 2, job 4242, one box
static const char *const *ompi_env(int r) {
    static const char *env[2][6] = {
        {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_LOCAL_RANK=0",
         "OMPI_COMM_WORLD_LOCAL_SIZE=2", "OMPI_MCA_ess_base_jobid=4242", NULL},
        {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_LOCAL_RANK=1",
         "OMPI_COMM_WORLD_LOCAL_SIZE=2", "OMPI_MCA_ess_base_jobid=4242", NULL},
    };
    return env[r];
}

// a unix socket bound at path and closed, never listened on, as a killed
// rank leaves it; 1 when it was bound
static int dead_socket_at(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un un;
    memset(&un, 0, sizeof(un));
    un.sun_family = AF_UNIX;
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
    int bound = fd >= 0 && bind(fd, (struct sockaddr *)&un, sizeof(un)) == 0;
    if (fd >= 0) close(fd);
    return bound;
}

// Rank 0 of mpirun's job makes DIR/llm3d-rendezvous-ompi-4242 in -o, the
// other ranks take the key and the socket from it. Planted there first, a
// directory of mode 0755, another user's, a link, or a key others may read
// is refused at once (not waited on, never trusted); a meeting directory
// that a killed job left (its socket dead) is swept by the next job, and a
// job leaves none of its own.
static void test_meeting_place(void) {
    char o[300], place[400], path[100], args[1200];  // path: a unix socket's, at most 107 bytes
    snprintf(o, sizeof(o), "%s/meet", work);
    mkdir(o, 0700);
    snprintf(place, sizeof(place), "%s/llm3d-rendezvous-ompi-4242", o);
    snprintf(args, sizeof(args), "-x 2 -to 3 -o %s", o);
    struct { const char *what, *want; int rank, other, mode, link, key_mode; } planted[] = {
        {"a directory of mode 0755", "mode 0755 lets group or others in: not this job's meeting place; refused", 1, 0,
         0755, 0, 0600},
        {"another user's directory", "owned by uid 65534, not by this user", 1, 1, 0700, 0, 0600},
        {"another user's directory, met by rank 0", "owned by uid 65534, not by this user", 0, 1, 0700, 0, 0600},
        {"a link to a directory", "a symbolic link: not this job's meeting place; refused", 1, 0, 0700, 1, 0600},
        {"a key of mode 0644", "mode 0644 lets group or others at it", 1, 0, 0700, 0, 0644},
    };
    for (size_t k = 0; k < sizeof(planted) / sizeof(planted[0]); k++) {
        if (planted[k].other && !is_root()) {
            skip("meeting place: %s: needs root to be another user", planted[k].what);
            continue;
        }
        test_remove_dir(place);
        char target[300];
        snprintf(target, sizeof(target), "%s/elsewhere", work);
        test_remove_dir(target);
        mkdir(planted[k].link ? target : place, planted[k].mode);
        chmod(planted[k].link ? target : place, planted[k].mode);
        snprintf(path, sizeof(path), "%.80s/key", planted[k].link ? target : place);
        uint8_t key[32];
        key_generate(key, NULL, 0);
        test_write_key_file(path, key);
        chmod(path, planted[k].key_mode);
        snprintf(path, sizeof(path), "%.80s/rendezvous.sock", planted[k].link ? target : place);
        int sfd = socket(AF_UNIX, SOCK_STREAM, 0);  // a socket nobody will answer on
        struct sockaddr_un un;
        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
        if (sfd >= 0) {
            bind(sfd, (struct sockaddr *)&un, sizeof(un));
            close(sfd);
        }
        if (planted[k].link && symlink(target, place) != 0) check(0, "a link at %s", place);
        if (planted[k].other && (chown(place, NOBODY, NOBODY) != 0)) check(0, "chown %s", place);
        TrainerRun r = run_trainer(args, ompi_env(planted[k].rank), 20.0);
        check(r.status == 1 && r.lines == 1 && strstr(r.out, planted[k].want) != NULL && r.seconds < 3.0,
              "meeting place: %s planted in -o: rank %d refuses it in one line, at once (exit %d, %.1f s): %s",
              planted[k].what, planted[k].rank, r.status, r.seconds, test_line_of(r.out, "train_gpt2:"));
        free(r.out);
        test_remove_dir(place);
        test_remove_dir(target);
    }

    // a killed job's meeting directory, its socket dead: swept by the next job, which leaves none of its own
    char stale[400];
    snprintf(stale, sizeof(stale), "%s/llm3d-rendezvous-ompi-4141", o);
    mkdir(stale, 0700);
    snprintf(path, sizeof(path), "%.80s/rendezvous.sock", stale);
    int bound = dead_socket_at(path);
    snprintf(path, sizeof(path), "%.80s/key", stale);
    uint8_t key[32];
    key_generate(key, NULL, 0);
    test_write_key_file(path, key);
    char out0[300], out1[300];
    snprintf(out0, sizeof(out0), "%s/meet0.out", work);
    snprintf(out1, sizeof(out1), "%s/meet1.out", work);
    double t0 = test_now();
    pid_t p1 = spawn_trainer(args, ompi_env(1), out1), p0 = spawn_trainer(args, ompi_env(0), out0);
    TrainerRun a = trainer_ended(p0, t0, out0, 30.0), b = trainer_ended(p1, t0, out1, 30.0);
    check(bound && a.status == 0 && b.status == 0 && !test_exists("%s", stale) && !test_exists("%s", place),
          "meeting place: mpirun's 2 ranks meet in -o (exit %d %d); a killed job's directory is swept (%s), and theirs "
          "removed (%s)%s%s", a.status, b.status, test_exists("%s", stale) ? "no" : "yes",
          test_exists("%s", place) ? "no" : "yes", a.status || b.status ? ": " : "",
          a.status || b.status ? test_line_of(a.status ? a.out : b.out, "train_gpt2:") : "");
    free(a.out);
    free(b.out);

    // -pi tcp without a shared secret: refused before anything starts
    snprintf(args, sizeof(args), "-x 2 -pi tcp -ps 127.0.0.1:%d", test_free_port());
    TrainerRun r = run_trainer(args, ompi_env(1), 20.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "-pi tcp: ranks that meet over TCP prove they belong to the "
                                                  "job with a shared secret: add --key-file FILE") != NULL,
          "-pi tcp without --key-file: refused (exit %d): %s", r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
}

// holds_fd_to: whether process pid has a descriptor open on path (its
// /proc/PID/fd links), waiting up to wait_s for it
static int holds_fd_to(pid_t pid, const char *path, double wait_s) {
    char fds[64], link[320], target[400];
    snprintf(fds, sizeof(fds), "/proc/%d/fd", (int)pid);
    double t0 = par_now();
    do {
        DIR *d = opendir(fds);
        struct dirent *e;
        int found = 0;
        while (d != NULL && (e = readdir(d)) != NULL && !found) {
            snprintf(link, sizeof(link), "%s/%s", fds, e->d_name);
            ssize_t n = readlink(link, target, sizeof(target) - 1);
            if (n > 0) target[n] = '\0';
            found = n > 0 && strcmp(target, path) == 0;
        }
        if (d != NULL) closedir(d);
        if (found) return 1;
        par_sleep(0.002);
    } while (par_now() - t0 < wait_s);
    return 0;
}

// the plan of ranks meeting in a directory NAME in -o = folder, over a unix
// socket (one_box) or TCP
static MeetPlan meet_plan_in(const char *folder, const char *name, int one_box) {
    MeetPlan plan;
    memset(&plan, 0, sizeof(plan));
    plan.by_dir = 1;
    plan.one_box = one_box;
    plan.folder = folder;
    plan.flag = "-o";
    snprintf(plan.name, sizeof(plan.name), "%s", name);
    return plan;
}

// A meeting directory that a killed launch of the same id left (its key,
// its dead socket), as torchrun's default id ("none", port 29500) repeats
// from run to run: rank 1, started first, finds it before rank 0 replaces
// it. It must not take that key and socket (it then waited on a dead socket
// until -to and failed): it waits for rank 0's own directory, whose "live"
// file rank 0 holds locked, and the two ranks meet.
static void test_stale_meeting(void) {
    char o[300], place[400], path[100], args[700], out0[300], out1[300];
    snprintf(o, sizeof(o), "%s/stale_meet", work);
    mkdir(o, 0700);
    snprintf(place, sizeof(place), "%s/llm3d-rendezvous-ompi-4242", o);
    test_remove_dir(place);
    mkdir(place, 0700);
    snprintf(path, sizeof(path), "%.80s/key", place);
    uint8_t key[32];
    key_generate(key, NULL, 0);
    test_write_key_file(path, key);
    snprintf(path, sizeof(path), "%.80s/rendezvous.sock", place);
    int bound = dead_socket_at(path);  // a killed root's
    snprintf(args, sizeof(args), "-x 2 -to 3 -o %s", o);
    snprintf(out0, sizeof(out0), "%s/stale0.out", work);
    snprintf(out1, sizeof(out1), "%s/stale1.out", work);
    double t0 = test_now();
    pid_t p1 = spawn_trainer(args, ompi_env(1), out1);
    // rank 1 opens -o, where it looks for the meeting directory, and looks: then rank 0 starts
    int looking = holds_fd_to(p1, o, 10.0);
    par_sleep(0.05);
    pid_t p0 = spawn_trainer(args, ompi_env(0), out0);
    TrainerRun a = trainer_ended(p0, t0, out0, 40.0), b = trainer_ended(p1, t0, out1, 40.0);
    check(bound && looking && a.status == 0 && b.status == 0 && !test_exists("%s", place),
          "a killed launch's meeting directory of the same id, found by rank 1 first: not taken; the ranks meet in "
          "rank 0's (exit %d %d, %.1f s)%s%s", a.status, b.status, b.seconds, a.status || b.status ? ": " : "",
          a.status || b.status ? test_line_of(b.status ? b.out : a.out, "train_gpt2:") : "");
    free(a.out);
    free(b.out);
    // no rank 0 comes: rank 1 waits past the directory (a key and a file live that nobody locks) until its
    // timeout, and says why in one line, not "no key" (also what a filesystem whose locks other nodes do not
    // see gives); meet_join itself, as the trainer waits at least 10 s
    mkdir(place, 0700);
    snprintf(path, sizeof(path), "%.80s/key", place);
    test_write_key_file(path, key);
    snprintf(path, sizeof(path), "%.80s/live", place);
    int live = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (live >= 0) close(live);
    MeetPlan plan = meet_plan_in(o, "llm3d-rendezvous-ompi-4242", 1);
    Launch L;
    memset(&L, 0, sizeof(L));
    L.rank = 1;
    char why[1200] = "";
    double t1 = test_now();
    int joined = meet_join(&L, &plan, 0.3, why, sizeof(why)) == 0;
    double waited = test_now() - t1;
    check(live >= 0 && !joined && waited < 3.0 && strstr(why, "holds a key, but no process holds the lock on its file "
          "live") != NULL && strstr(why, "local_lock") != NULL && strchr(why, '\n') == NULL,
          "a killed launch's meeting directory and no rank 0: rank 1 waits its timeout and says why in one line "
          "(%.1f s): %s", waited, why);
    test_remove_dir(o);
}

// A TCP meeting directory (no socket in it, its address in a file) whose
// rank 0 is alive, holding the lock on its "live" file, as a job of the same
// id over nodes leaves it while it runs: another launch's rank 0 of that id
// must refuse it in one line, not clear it (its key, and the running job's
// ranks that still read it). meet_host itself, with the lock held here.
static void test_live_tcp_meeting(void) {
    char o[300], place[400], path[500];
    snprintf(o, sizeof(o), "%s/live_tcp_meet", work);
    mkdir(o, 0700);
    snprintf(place, sizeof(place), "%s/llm3d-rendezvous-ompi-4343", o);
    test_remove_dir(place);
    mkdir(place, 0700);
    uint8_t key[32];
    key_generate(key, NULL, 0);
    snprintf(path, sizeof(path), "%s/key", place);
    test_write_key_file(path, key);
    snprintf(path, sizeof(path), "%s/address", place);
    FILE *f = fopen(path, "w");
    if (f != NULL) fputs("tcp:127.0.0.1:29500\n", f), fclose(f);
    snprintf(path, sizeof(path), "%s/live", place);
    int live = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    int locked = live >= 0 && flock(live, LOCK_EX | LOCK_NB) == 0;
    MeetPlan plan = meet_plan_in(o, "llm3d-rendezvous-ompi-4343", 0);
    Launch L;
    memset(&L, 0, sizeof(L));
    L.world = 2;
    char why[1200] = "";
    int hosted = meet_host(&L, &plan, 1.0, why, sizeof(why)) == 0;
    snprintf(path, sizeof(path), "%s/key", place);
    int key_kept = test_exists("%s", path);
    check(locked && !hosted && key_kept && strstr(why, "another job of this id is meeting there") != NULL &&
          strchr(why, '\n') == NULL,
          "a live TCP meeting directory of the same id (its lock held, no socket): another rank 0 refuses it in one "
          "line and leaves its key (%s): %s", hosted ? "hosted" : "refused", why);
    if (live >= 0) close(live);
    test_remove_dir(o);
}

// The folder the ranks meet in (-pf, or -o) must be this user's or root's,
// and sticky where group or others may write in it: else they could move
// the meeting directory away and another of this user's into its place.
// Refused at once in one line: a folder of mode 0777, another user's; a
// sticky 1777 folder (as /tmp) is where the ranks meet.
static void test_meeting_folder(void) {
    char f[300], args[700];
    snprintf(f, sizeof(f), "%s/meet_folder", work);
    snprintf(args, sizeof(args), "-x 2 -to 3 -pi fs -pf %s", f);
    struct { const char *what, *want; int mode, other; } cases[] = {
        {"mode 0777", "mode 0777: group or others may write in it and it is not sticky", 0777, 0},
        {"mode 0775", "mode 0775: group or others may write in it and it is not sticky", 0775, 0},
        {"another user's, mode 0755", "owned by uid 65534, neither this user", 0755, 1},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        if (cases[k].other && !is_root()) {
            skip("meeting folder %s: needs root to be another user", cases[k].what);
            continue;
        }
        test_remove_dir(f);
        mkdir(f, 0700);
        chmod(f, (mode_t)cases[k].mode);
        if (cases[k].other && chown(f, NOBODY, NOBODY) != 0) check(0, "chown %s", f);
        for (int rank = 0; rank < 2; rank++) {
            TrainerRun r = run_trainer(args, ompi_env(rank), 20.0);
            check(r.status == 1 && r.lines == 1 && strstr(r.out, cases[k].want) != NULL && r.seconds < 3.0,
                  "meeting folder -pf of %s: rank %d refuses it in one line, at once (exit %d, %.1f s): %s",
                  cases[k].what, rank, r.status, r.seconds, test_line_of(r.out, "train_gpt2:"));
            free(r.out);
        }
    }
    test_remove_dir(f);
    mkdir(f, 0700);
    chmod(f, 01777);
    char out0[300], out1[300];
    snprintf(out0, sizeof(out0), "%s/folder0.out", work);
    snprintf(out1, sizeof(out1), "%s/folder1.out", work);
    double t0 = test_now();
    pid_t p1 = spawn_trainer(args, ompi_env(1), out1), p0 = spawn_trainer(args, ompi_env(0), out0);
    TrainerRun a = trainer_ended(p0, t0, out0, 30.0), b = trainer_ended(p1, t0, out1, 30.0);
    check(a.status == 0 && b.status == 0, "meeting folder -pf of mode 1777 (sticky, as /tmp): the ranks meet there "
          "(exit %d %d)%s%s", a.status, b.status, a.status || b.status ? ": " : "",
          a.status || b.status ? test_line_of(a.status ? a.out : b.out, "train_gpt2:") : "");
    free(a.out);
    free(b.out);
    test_remove_dir(f);
}

// ----------------------------------------------------------------------------
// the shared-memory segment of an outside-launched rank 0 that fails

// shm_names: how many names of pid's segments /dev/shm holds, waiting up to
// wait_s for there to be `want`; with sweep set, it then unlinks them (a
// failing case leaves nothing behind)
static int shm_names(pid_t pid, int want, double wait_s, int sweep) {
    char prefix[64], path[320];
    snprintf(prefix, sizeof(prefix), "llm3d-%d-", (int)pid);
    double t0 = par_now();
    for (;;) {
        int n = 0, last = par_now() - t0 > wait_s;
        DIR *d = opendir("/dev/shm");
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
            n++;
            snprintf(path, sizeof(path), "/dev/shm/%.256s", e->d_name);
            if (sweep && last) unlink(path);
        }
        if (d != NULL) closedir(d);
        if (n == want || last) return n;
        par_sleep(0.02);
    }
}

// rank 0 of an outside launch whose rank 1 is refused (another key): rank 0
// serves and waits, the rendezvous times out after 1 s, and it exits 1, as a
// trainer's die() does
static void rank0_times_out(const char *spec) {
    Launch L;
    memset(&L, 0, sizeof(L));
    L.mode = LAUNCH_RANK;
    L.world = 2;
    snprintf(L.rendezvous, sizeof(L.rendezvous), "%s", spec);
    char err[512];
    if (key_read_file(key_path, L.key, err, sizeof(err)) != 0 || launch_serve(&L, 1.0, err, sizeof(err)) != 0) _exit(2);
    uint8_t other[32];
    key_generate(other, NULL, 0);
    if (fork() == 0) {
        RdvAnswer ans;
        _exit(rdv_join(spec, other, job_id_from_key(other), 1, 2, 1, NULL, 2.0, &ans, err, sizeof(err)) == 0);
    }
    Grid g;
    Comm *c;
    if (grid_init(&g, 2, 1, 1, 0, err, sizeof(err)) != 0) _exit(2);
    if (comm_init(&c, &g, L.key, spec, 1.0, NULL, err, sizeof(err)) != 0) exit(1);
    _exit(3);
}

static void test_segment_leaks(void) {
    char spec[sizeof(((Launch *)0)->rendezvous)];
    snprintf(spec, sizeof(spec), "unix:%.200s/leak.sock", work);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) rank0_times_out(spec);
    int st = test_wait(pid, 15.0, NULL);
    int left = shm_names(pid, 0, 2.0, 1);
    check(st == 1 && left == 0, "segment: rank 0 whose rank 1 was refused and whose rendezvous timed out exits %d "
          "and leaves %d segment name(s) in /dev/shm", st, left);

    // the trainer itself, as rank 0 of an outside launch that never completes
    const int sigs[2] = {SIGTERM, SIGKILL};
    for (int i = 0; i < 2; i++) {
        char args[1024], out_path[300];
        snprintf(args, sizeof(args), "-x 2 -to 5 --rendezvous %s --key-file %s", spec, key_path);
        snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
        const char *env[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
        pid = spawn_trainer(args, env, out_path);
        int made = shm_names(pid, 1, 5.0, 0);
        kill(pid, sigs[i]);
        st = test_wait(pid, 5.0, NULL);
        left = shm_names(pid, 0, 2.0, 1);
        check(made == 1 && st == 128 + sigs[i] && left == 0, "segment: train_gpt2 as rank 0, %s during the rendezvous "
              "(status %d): %d segment name(s) left of %d", strsignal(sigs[i]), st, left, made);
    }
}

// ----------------------------------------------------------------------------
// the output directory (-o): links planted in it, and who may write in it

// victim: a directory of files that no trainer run should ever touch
static void make_victim(const char *dir) {
    char path[400];
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/precious.txt", dir);
    FILE *f = fopen(path, "w");
    if (f != NULL) fclose(f);
}

// plant: a symbolic link at dir/name to target, made by another user when
// `other` is set and this runs as root (else by this user); 0 when made
static int plant(const char *dir, const char *name, const char *target, int other) {
    char path[400];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (other && is_root() && drop_to_nobody() != 0) _exit(3);
        _exit(symlink(target, path) == 0 ? 0 : 1);
    }
    return test_wait(pid, 5.0, NULL);
}

// can_open_as_nobody: whether another user can open path to read
static int can_open_as_nobody(const char *path) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (drop_to_nobody() != 0) _exit(3);
        _exit(open(path, O_RDONLY) >= 0 ? 0 : 1);
    }
    return test_wait(pid, 5.0, NULL) == 0;
}

static void test_output_dir(void) {
    char out[300], victim[300], victim2[300], lock_target[300], args[700];
    snprintf(victim, sizeof(victim), "%s/victim", work);
    snprintf(victim2, sizeof(victim2), "%s/victim2", work);
    make_victim(victim);
    make_victim(victim2);

    // links named like checkpoints, planted after a first run: pruning
    // removes the links, not what they point to
    snprintf(out, sizeof(out), "%s/out_links", work);
    snprintf(args, sizeof(args), "-o %s -x 1 -n 1", out);
    TrainerRun r = run_trainer(args, NULL, 30.0);
    free(r.out);
    plant(out, "ckpt_00000099", victim, 0);
    plant(out, "ckpt_00000098.partial", victim2, 0);
    snprintf(args, sizeof(args), "-o %s -x 3 -n 1 -nk 1", out);
    r = run_trainer(args, NULL, 30.0);
    check(r.status == 0 && test_exists("%s/%s", victim, "precious.txt") && test_exists("%s/%s", victim2, "precious.txt") &&
          !test_exists("%s/%s", out, "ckpt_00000099") && !test_exists("%s/%s", out, "ckpt_00000098.partial") &&
          test_exists("%s/%s", out, "ckpt_00000003"),
          "-o: links named ckpt_00000099 and ckpt_00000098.partial are removed by pruning, and the directories they "
          "point to keep their files (exit %d)", r.status);
    free(r.out);

    // a LOCK link: the trainer neither follows it nor creates its target
    snprintf(out, sizeof(out), "%s/out_lock", work);
    snprintf(lock_target, sizeof(lock_target), "%s/created_through_lock", work);
    mkdir(out, 0755);
    plant(out, "LOCK", lock_target, 0);
    snprintf(args, sizeof(args), "-o %s -x 1", out);
    r = run_trainer(args, NULL, 30.0);
    check(r.status != 0 && r.lines == 1 && strstr(r.out, "LOCK is a symbolic link") != NULL &&
          !test_exists("%s%s", lock_target, ""), "-o: a LOCK link is refused and its target not created (exit %d): %s",
          r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);

    // -o itself a link (to a directory of this user's, trailing slash or not): refused in one line, at start,
    // nothing made in the directory it points to
    char link_dir[300], link_arg[320];
    snprintf(link_dir, sizeof(link_dir), "%s/out_is_link", work);
    int linked = plant(work, "out_is_link", victim, 0) == 0;
    for (int slash = 0; slash < 2; slash++) {
        snprintf(link_arg, sizeof(link_arg), "%s%s", link_dir, slash ? "/" : "");
        snprintf(args, sizeof(args), "-o %s -x 1", link_arg);
        r = run_trainer(args, NULL, 30.0);
        char want[400];
        snprintf(want, sizeof(want), "train_gpt2: flag -o: %s is a symbolic link: not followed", link_arg);
        check(linked && r.status == 2 && r.lines == 1 && strstr(r.out, want) != NULL && !test_exists("%s/LOCK", victim) &&
              !test_exists("%s/job.key", victim) && !test_exists("%s/log.jsonl", victim),
              "-o a link to a directory%s: refused in one line, exit 2, nothing made there (exit %d): %s",
              slash ? ", with a trailing slash" : "", r.status, test_line_of(r.out, "train_gpt2:"));
        free(r.out);
    }

    // -lg given a link to a file outside: refused in one line, the file untouched
    char lg_link[400], victim_file[400];
    snprintf(lg_link, sizeof(lg_link), "%s/lg_link.jsonl", work);
    snprintf(victim_file, sizeof(victim_file), "%s/precious.txt", victim);
    test_write_file(victim_file, "precious\n", 9);
    int lg_planted = plant(work, "lg_link.jsonl", victim_file, 0);
    snprintf(args, sizeof(args), "-x 1 -lg %s", lg_link);
    r = run_trainer(args, NULL, 30.0);
    char *kept = test_read_text(victim_file);
    check(lg_planted == 0 && r.status == 2 && r.lines == 1 && strstr(r.out, "flag -lg: ") != NULL &&
          strstr(r.out, "lg_link.jsonl: a symbolic link") != NULL && strcmp(kept, "precious\n") == 0,
          "-lg a link to a file outside: refused, the file untouched (exit %d): %s", r.status,
          test_line_of(r.out, "train_gpt2:"));
    free(kept);
    free(r.out);

    // a directory others may write in: refused before anything is read or written in it
    snprintf(out, sizeof(out), "%s/out_shared", work);
    snprintf(args, sizeof(args), "-o %s -x 1 -n 1", out);
    r = run_trainer(args, NULL, 30.0);
    free(r.out);
    chmod(out, 0777);
    int planted = plant(out, "ckpt_00000099", victim, 1);
    snprintf(args, sizeof(args), "-o %s -x 3 -n 1 -nk 1", out);
    r = run_trainer(args, NULL, 30.0);
    check(planted == 0 && r.status == 2 && r.lines == 1 && strstr(r.out, "group or others may write") != NULL &&
          test_exists("%s/%s", victim, "precious.txt"), "-o of mode 0777, a link planted by %s: refused (exit %d): %s",
          is_root() ? OTHER_USER : "this user", r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);

    if (!is_root()) {
        skip("-o owned by another user, and LOCK against another user: need root to make one");
        return;
    }
    snprintf(out, sizeof(out), "%s/out_theirs", work);
    mkdir(out, 0755);
    if (chown(out, NOBODY, NOBODY) != 0) check(0, "chown %s", out);
    snprintf(args, sizeof(args), "-o %s -x 1", out);
    r = run_trainer(args, NULL, 30.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "owned by uid 65534") != NULL,
          "-o owned by %s: refused (exit %d): %s", OTHER_USER, r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);

    // a LOCK that others can open (an older run made it 0644) is made 0600
    snprintf(out, sizeof(out), "%s/out_lock_mode", work);
    mkdir(out, 0755);
    char lock[400];
    snprintf(lock, sizeof(lock), "%s/LOCK", out);
    close(open(lock, O_RDWR | O_CREAT, 0644));
    chmod(lock, 0644);
    int before = can_open_as_nobody(lock);
    snprintf(args, sizeof(args), "-o %s -x 1", out);
    r = run_trainer(args, NULL, 30.0);
    struct stat st;
    int mode = stat(lock, &st) == 0 ? (int)(st.st_mode & 0777) : -1;
    check(before && r.status == 0 && mode == 0600 && !can_open_as_nobody(lock),
          "-o: LOCK can no longer be opened by %s, who could flock it and block every job there (mode %04o, exit %d)",
          OTHER_USER, mode, r.status);
    free(r.out);
}

// ----------------------------------------------------------------------------
// -o swapped mid-run for a link to another job's directory, by someone who
// can write its parent; a second job started on -o while the first runs

// snapshot: every name under dir and a checksum of every file's bytes, as text
static void snapshot(const char *dir, char *out, size_t outlen) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "cd %s && find . | sort && find . -type f | sort | xargs cksum", dir);
    if (test_run(cmd, 1, out, outlen) != 0) snprintf(out, outlen, "(no snapshot of %s)", dir);
}

// wait_lines: until the file at path holds n lines, the process pid ended,
// or timeout_s passed; the lines it holds
static int wait_lines(const char *path, int n, pid_t pid, double timeout_s) {
    double t0 = test_now();
    int have;
    while ((have = lines_in(path)) < n && test_now() - t0 < timeout_s && waitpid(pid, NULL, WNOHANG) == 0)
        par_sleep(0.01);
    return have;
}

// still_running: whether pid has not ended, without reaping it (its waiter
// still gets its status)
static int still_running(pid_t pid) {
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    return waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

// -o swapped at the start, after the job opened it and before it opened
// its log: rank 0 of an outside launch opens -o, locks it and waits at the
// rendezvous for rank 1, which is when -o is renamed away and a link to the
// other job's directory put in its place; rank 1 then joins, given the
// directory's new name. The log, made anew, and DONE_<steps> at the end are
// in the job's own directory, and the other's is untouched (its log not
// truncated, no DONE there)
static void test_output_dir_swapped_at_start(const char *other) {
    char out[300], moved[300], lock[400], spec[300], args[1200], out0[300], out1[300], want[32];
    char before[8192], after[8192];
    snprintf(out, sizeof(out), "%s/swapped_start", work);
    snprintf(moved, sizeof(moved), "%s/swapped_start.moved", work);
    snprintf(lock, sizeof(lock), "%s/LOCK", out);
    snprintf(spec, sizeof(spec), "unix:%s/swap.sock", work);
    snprintf(out0, sizeof(out0), "%s/swapped_start_0.out", work);
    snprintf(out1, sizeof(out1), "%s/swapped_start_1.out", work);
    snapshot(other, before, sizeof(before));
    const char *env0[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", NULL};
    const char *env1[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", NULL};
    snprintf(args, sizeof(args), "-x 2 -o %s --rendezvous %s --key-file %s", out, spec, key_path);
    double t0 = test_now();
    pid_t p0 = spawn_trainer(args, env0, out0);
    // LOCK names rank 0 once it holds -o open; it then waits for rank 1
    snprintf(want, sizeof(want), "%d\n", (int)p0);
    int named = 0;
    while (!named && test_now() - t0 < 20.0 && still_running(p0)) {
        char *text = test_read_text(lock);
        named = text != NULL && strcmp(text, want) == 0;
        free(text);
        if (!named) par_sleep(0.01);
    }
    int swapped = named && rename(out, moved) == 0 && symlink(other, out) == 0;
    snprintf(args, sizeof(args), "-x 2 -o %s --rendezvous %s --key-file %s", moved, spec, key_path);
    pid_t p1 = spawn_trainer(args, env1, out1);
    TrainerRun r1 = trainer_ended(p1, t0, out1, 30.0);
    TrainerRun r0 = trainer_ended(p0, t0, out0, 30.0);
    snapshot(other, after, sizeof(after));
    char log[400];
    snprintf(log, sizeof(log), "%s/log.jsonl", moved);
    int logged = lines_in(log), done = test_exists("%s/DONE_00000002", moved);
    check(swapped && r0.status == 0 && r1.status == 0 && logged == 2 && done && strcmp(before, after) == 0,
          "-o renamed and a link to another job's directory put in its place as rank 0 waits for rank 1: the log "
          "(%d lines) and DONE_00000002 (%s) are in the job's own directory, and the other's is untouched (%s); exit %d "
          "and %d: %s", logged, done ? "there" : "missing", strcmp(before, after) == 0 ? "same names and bytes" : "CHANGED",
          r0.status, r1.status, test_line_of(r0.out, "train_gpt2:"));
    free(r0.out);
    free(r1.out);
}

static void test_output_dir_swapped(void) {
    // the other job's directory: checkpoints 2 and 3 and a final model
    char other[300], out[300], moved[300], log[400], args[900], before[8192], after[8192], out_path[300];
    snprintf(other, sizeof(other), "%s/other_job", work);
    snprintf(out, sizeof(out), "%s/swapped_job", work);
    snprintf(moved, sizeof(moved), "%s/swapped_job.moved", work);
    snprintf(log, sizeof(log), "%s/log.jsonl", moved);
    snprintf(out_path, sizeof(out_path), "%s/swapped.out", work);
    snprintf(args, sizeof(args), "-o %s -x 3 -n 1", other);
    TrainerRun r = run_trainer(args, NULL, 30.0);
    free(r.out);
    if (!check(r.status == 0 && test_exists("%s/ckpt_00000003/MANIFEST", other), "-o swapped: the other job ran (exit %d)",
               r.status))
        return;
    snapshot(other, before, sizeof(before));
    // this job checkpoints every step; once it has logged 3 steps, -o is
    // renamed away and a link to the other job's directory put in its place
    snprintf(args, sizeof(args), "-o %s -x 100000 -n 1", out);
    double t0 = test_now();
    pid_t pid = spawn_trainer(args, NULL, out_path);
    char in_out[400];
    snprintf(in_out, sizeof(in_out), "%s/log.jsonl", out);
    int at_swap = wait_lines(in_out, 3, pid, 20.0);
    int swapped = at_swap >= 3 && rename(out, moved) == 0 && symlink(other, out) == 0;
    int later = swapped ? wait_lines(log, at_swap + 3, pid, 20.0) : 0;
    kill(pid, SIGTERM);  // it finishes the step, checkpoints and ends
    r = trainer_ended(pid, t0, out_path, 30.0);
    snapshot(other, after, sizeof(after));
    int *steps = NULL, dfd = open(moved, O_RDONLY | O_DIRECTORY), n = dfd >= 0 ? ckpt_list_at(dfd, &steps) : 0;
    int newest = n > 0 ? steps[0] : -1;
    free(steps);
    if (dfd >= 0) close(dfd);
    check(swapped && later >= at_swap + 3 && r.status == 0 && strcmp(before, after) == 0 && newest >= later,
          "-o renamed and a link to another job's directory put in its place after %d steps: the job goes on in its "
          "own directory (checkpoint %d there, %d steps logged, exit %d) and the other's is untouched (%s): %s",
          at_swap, newest, later, r.status, strcmp(before, after) == 0 ? "same names and bytes" : "CHANGED",
          test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    test_output_dir_swapped_at_start(other);
}

static void test_second_job(void) {
    // a first job holds -o; a second one, -y 1, is refused at once naming
    // the holder (a single process; a launcher of 2 ranks), exit 1
    const char *layouts[2] = {"", "-np 2"};
    for (int k = 0; k < 2; k++) {
        char out[300], in_out[400], args[900], out_path[300], want[800];
        snprintf(out, sizeof(out), "%s/second_%d", work, k);
        snprintf(in_out, sizeof(in_out), "%s/log.jsonl", out);
        snprintf(out_path, sizeof(out_path), "%s/first_%d.out", work, k);
        snprintf(args, sizeof(args), "-o %s -x 100000 -n 1 %s", out, layouts[k]);
        double t0 = test_now();
        pid_t first = spawn_trainer(args, NULL, out_path);
        int ran = wait_lines(in_out, 2, first, 20.0) >= 2;
        snprintf(args, sizeof(args), "-o %s -x 100000 -n 1 -y 1 %s", out, layouts[k]);
        TrainerRun second = run_trainer(args, NULL, 20.0);
        kill(first, SIGTERM);
        TrainerRun r = trainer_ended(first, t0, out_path, 30.0);
        snprintf(want, sizeof(want), "another job is using %s: pid %d holds %s/LOCK", out, (int)first, out);
        check(ran && second.status == 1 && second.lines == 1 && strstr(second.out, want) != NULL && second.seconds < 3.0 &&
              r.status == 0, "a second job with -y 1 on -o while a first (%s) holds it: refused at once naming the "
              "holder (exit %d in %.1f s; the first ended %d): %s", k == 0 ? "one process" : "a launcher of 2 ranks",
              second.status, second.seconds, r.status, test_line_of(second.out, "train_gpt2:"));
        free(second.out);
        free(r.out);
        // once the first has stopped, -y 1 goes on from its newest checkpoint
        int *steps = NULL, dfd = open(out, O_RDONLY | O_DIRECTORY), n = dfd >= 0 ? ckpt_list_at(dfd, &steps) : 0;
        int newest = n > 0 ? steps[0] : -1;
        free(steps);
        if (dfd >= 0) close(dfd);
        char resumed[400];
        snprintf(args, sizeof(args), "-o %s -x %d -n 1 -y 1 %s", out, newest + 1, layouts[k]);
        snprintf(resumed, sizeof(resumed), "ckpt_%08d: step %d", newest, newest);
        r = run_trainer(args, NULL, 30.0);
        check(newest > 0 && r.status == 0 && strstr(r.out, resumed) != NULL,
              "then -y 1 resumes from the first job's newest checkpoint, %d (exit %d)", newest, r.status);
        free(r.out);
    }
}

// ----------------------------------------------------------------------------
// FIFOs where files are read: refused at once, not waited on in open()

static void test_fifos(void) {
    char fifo[300], dir[300], pattern[320], second[320], args[900];
    snprintf(fifo, sizeof(fifo), "%s/fifo.bin", work);
    snprintf(dir, sizeof(dir), "%s/fifo_data", work);
    snprintf(pattern, sizeof(pattern), "%s/*.bin", dir);
    snprintf(second, sizeof(second), "%s/b.bin", dir);
    mkdir(dir, 0755);
    mkfifo(fifo, 0600);
    mkfifo(second, 0600);  // matched by the pattern, beside a good shard
    char good[320];
    snprintf(good, sizeof(good), "%s/a.bin", dir);
    test_write_shard(good, 4096);
    struct { const char *what; char args[700]; const char *path; } cases[7];
    cases[0].what = "-e (a model file)";
    snprintf(cases[0].args, sizeof(cases[0].args), "-x 1 -e %s", fifo);
    cases[0].path = fifo;
    cases[1].what = "-i (a shard the pattern matches, no MANIFEST)";
    snprintf(cases[1].args, sizeof(cases[1].args), "-x 1 -i %s", pattern);
    cases[1].path = second;
    cases[2].what = "-j (the val shards)";
    snprintf(cases[2].args, sizeof(cases[2].args), "-x 1 -v 1 -j %s", fifo);
    cases[2].path = fifo;
    cases[3].what = "-tk (the tokenizer)";
    snprintf(cases[3].args, sizeof(cases[3].args), "-x 2 -s 1 -tk %s", fifo);
    cases[3].path = fifo;
    cases[4].what = "-hf (the HellaSwag file)";
    snprintf(cases[4].args, sizeof(cases[4].args), "-x 1 -v 1 -h 1 -j %s -hf %s", shard, fifo);
    cases[4].path = fifo;
    cases[5].what = "-hf, to the launcher of -np 2";
    snprintf(cases[5].args, sizeof(cases[5].args), "-x 1 -v 1 -h 1 -j %s -np 2 -hf %s", shard, fifo);
    cases[5].path = fifo;
    cases[6].what = "-lg (the log, opened to write)";
    snprintf(cases[6].args, sizeof(cases[6].args), "-x 1 -lg %s", fifo);
    cases[6].path = fifo;
    for (int i = 0; i < 7; i++) {
        snprintf(args, sizeof(args), "%s", cases[i].args);
        TrainerRun r = run_trainer(args, NULL, 5.0);
        char want[400], flag[40];
        snprintf(want, sizeof(want), "%s: not a regular file", cases[i].path);
        // the line names the flag that gave the file (each case's what starts with it)
        snprintf(flag, sizeof(flag), "train_gpt2: flag %.*s", (int)strcspn(cases[i].what, " ,"), cases[i].what);
        check(r.status == 2 && r.lines == 1 && strstr(r.out, want) != NULL && strstr(r.out, flag) != NULL,
              "a FIFO given to %s: refused at once (exit %d in %.1f s): %s", cases[i].what, r.status, r.seconds,
              test_line_of(r.out, "train_gpt2:"));
        free(r.out);
    }
}

// ----------------------------------------------------------------------------
// a shard changed under a running job: tokens written in place, a truncation

// change_while_training: trains on a copy of the shard for many steps; once
// two steps are logged, `change` alters the copy. Returns the run.
static TrainerRun change_while_training(const char *name, void (*change)(const char *path)) {
    char data[300], log[300], args[900], out_path[300];
    snprintf(data, sizeof(data), "%s/%s.bin", work, name);
    snprintf(log, sizeof(log), "%s/%s.jsonl", work, name);
    snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
    test_write_shard(data, 4096);
    unlink(log);
    snprintf(args, sizeof(args), "-x 100000 -i %s -lg %s", data, log);  // the later -i wins
    double t0 = test_now();
    pid_t pid = spawn_trainer(args, NULL, out_path);
    while (lines_in(log) < 2 && test_now() - t0 < 10.0 && waitpid(pid, NULL, WNOHANG) == 0) par_sleep(0.01);
    change(data);
    return trainer_ended(pid, t0, out_path, 20.0);
}

static void write_ffff_in_place(const char *path) {
    int fd = open(path, O_WRONLY);
    uint16_t big[4096];
    for (int i = 0; i < 4096; i++) big[i] = 0xFFFF;
    if (fd < 0 || pwrite(fd, big, sizeof(big), 1024) != (ssize_t)sizeof(big)) check(0, "write %s", path);
    if (fd >= 0) close(fd);
}

static void truncate_to_header(const char *path) {
    if (truncate(path, 1024) != 0) check(0, "truncate %s", path);
}

static void test_shard_changes(void) {
    TrainerRun r = change_while_training("inplace", write_ffff_in_place);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "is 65535, not < vocab_size 256") != NULL &&
          strstr(r.out, "changed after it was checked") != NULL,
          "a shard whose tokens become 0xFFFF in place mid-run: the run ends with one line (exit %d): %s", r.status,
          test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    r = change_while_training("truncated", truncate_to_header);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "changed after it was checked") != NULL,
          "a shard truncated mid-run: one line, not SIGBUS (exit %d): %s", r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
}

// ----------------------------------------------------------------------------
// sealed data shards put in one another's places by someone who can write
// the data directory but not read the key: val copied over train, two train
// shards swapped, a shard renamed, each with the MANIFEST rewritten under
// its public all-zero key, as anyone can

// remanifest: dir's MANIFEST made anew from the files there now, as an
// attacker without the key can
static int remanifest(const char *dir) {
    Manifest m = {0, NULL};
    char err[512];
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = d != NULL ? 0 : -1;
    while (rc == 0 && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "MANIFEST") != 0) rc = manifest_add_file(&m, dir, e->d_name, err, sizeof(err));
    if (d != NULL) closedir(d);
    if (rc == 0) rc = manifest_write(&m, dir, "MANIFEST", NULL, err, sizeof(err));
    manifest_free(&m);
    return rc;
}

static void test_sealed_shard_places(void) {
    if (access("./prepare_data", X_OK) != 0) {
        check(0, "sealed shards: ./prepare_data is not built (make prepare_data)");
        return;
    }
    // 60000 bytes of text: a val shard of 5000 tokens, train shards of 20000, 20000 and 15000
    char text[300], dir[300], cmd[2000], out[4096];
    snprintf(text, sizeof(text), "%s/sealed.txt", work);
    snprintf(dir, sizeof(dir), "%s/sealed", work);
    char *bytes = (char *)malloc(60000);
    for (int i = 0; i < 60000; i++) bytes[i] = (char)(i % 53 == 52 ? '\n' : 'a' + (i * 7 + i / 53) % 26);
    test_write_file(text, bytes, 60000);
    free(bytes);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n d -v 5000 -s 20000 --bytes --key-file %s", text, dir,
             key_path);
    int rc = test_run(cmd, 0, out, sizeof(out));
    if (rc != 0 || !test_exists("%s/d_train_000002.bin", dir)) {
        check(0, "sealed shards: prepare_data --key-file (exit %d): %s", rc, out);
        return;
    }
    struct { const char *what, *shell, *named, *made_as; } cases[4] = {
        {"the honest set", "true", NULL, NULL},
        {"val copied over train", "cp d_val_000000.bin d_train_000001.bin", "d_train_000001.bin", "d_val_000000.bin"},
        {"two train shards swapped", "mv d_train_000000.bin t && mv d_train_000002.bin d_train_000000.bin && "
         "mv t d_train_000002.bin", "d_train_000000.bin", "d_train_000002.bin"},
        {"a shard renamed (train 2 as 1)", "rm d_train_000001.bin && mv d_train_000002.bin d_train_000001.bin",
         "d_train_000001.bin", "d_train_000002.bin"},
    };
    for (int i = 0; i < 4; i++) {
        char copy[300], args[900], named[400], made_as[200];
        snprintf(copy, sizeof(copy), "%s/sealed_%d", work, i);
        snprintf(cmd, sizeof(cmd), "rm -rf %s && cp -r %s %s && cd %s && %s", copy, dir, copy, copy, cases[i].shell);
        rc = test_run(cmd, 1, out, sizeof(out));
        if (rc == 0 && i > 0) rc = remanifest(copy);
        if (rc != 0) {
            check(0, "sealed shards, %s: set up (%s)", cases[i].what, out);
            continue;
        }
        snprintf(args, sizeof(args), "-x 2 -i %s/d_train_*.bin --key-file %s", copy, key_path);  // the later -i wins
        TrainerRun r = run_trainer(args, NULL, 30.0);
        if (cases[i].named == NULL) {
            check(r.status == 0 && r.lines == 0, "sealed shards, %s: trains (exit %d): %s", cases[i].what, r.status,
                  test_line_of(r.out, "train_gpt2:"));
        } else {
            snprintf(named, sizeof(named), "%s/%s: this sealed shard was made as", copy, cases[i].named);
            snprintf(made_as, sizeof(made_as), "made as %s,", cases[i].made_as);
            check(r.status == 2 && r.lines == 1 && strstr(r.out, named) != NULL && strstr(r.out, made_as) != NULL,
                  "sealed shards, %s, MANIFEST rewritten: refused in one line naming the file and the name it was "
                  "made as (exit %d): %s", cases[i].what, r.status, test_line_of(r.out, "train_gpt2:"));
        }
        free(r.out);
    }
}

// ----------------------------------------------------------------------------
// flags that can be checked before launch are: one usage line, exit 2

static void test_flags_before_launch(void) {
    TrainerRun r = run_trainer("-x 2 -np 2 -fault tamper:99:1", NULL, 20.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "-fault tamper:99:1: rank 99 is not in this job of 2 ranks") &&
          strstr(r.out, "exited") == NULL, "-np 2 -fault tamper:99:1: a usage error before any rank starts (exit %d): %s",
          r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);

    // an outside launcher (torchrun's variables) of 3 ranks, and -np 4: -np is to blame
    char args[1400];
    snprintf(args, sizeof(args), "-x 2 -np 4 -v 1 -j %s --rendezvous unix:%s/np.sock --key-file %s", shard, work, key_path);
    const char *env[] = {"RANK=0", "WORLD_SIZE=3", "LOCAL_RANK=0", NULL};
    r = run_trainer(args, env, 20.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "-np 4, but the launcher (torchrun) says the world is 3") &&
          r.seconds < 5.0, "-np 4 under an outside launcher of 3 ranks: refused, blaming -np (exit %d, %.1f s): %s",
          r.status, r.seconds, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
}

// ----------------------------------------------------------------------------
// stop signals: none lost between fork and exec, or while the job is checked

// rank_mask_main: what a rank of the launcher runs here (this program, again):
// it writes the signals it was blocking on entry, from /proc/self/status,
// into DIR/mask.RANK
static int rank_mask_main(const char *dir) {
    char line[256], path[400];
    unsigned long long blocked = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "SigBlk:", 7) == 0) blocked = strtoull(line + 7, NULL, 16);
    if (f != NULL) fclose(f);
    snprintf(path, sizeof(path), "%s/mask.%s", dir, getenv("LLM3D_RANK"));
    f = fopen(path, "w");
    if (f == NULL) return 1;
    fprintf(f, "%llx\n", blocked);
    return fclose(f) == 0 ? 0 : 1;
}

static void test_stop_signals(void) {
    // the ranks of our launcher start with the stop signals held
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {(char *)"test_attacks", (char *)"rank-mask", work, NULL};
        Launch L;
        char err[512];
        test_clear_rank_env();
        // as from an interactive shell: SIGINT or SIGHUP ignored here (this
        // test started in the background) would stay so, and not be held
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        parallel_main(3, argv, 2, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));  // the launcher: never returns
        _exit(3);
    }
    int st = test_wait(pid, 20.0, NULL);
    unsigned long long want = 1ull << (SIGINT - 1) | 1ull << (SIGTERM - 1) | 1ull << (SIGHUP - 1), got[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        char path[400];
        snprintf(path, sizeof(path), "%s/mask.%d", work, r);
        char *text = test_read_text(path);
        got[r] = strtoull(text, NULL, 16);
        free(text);
    }
    check(st == 0 && (got[0] & want) == want && (got[1] & want) == want,
          "stop signals: the launcher's ranks begin with SIGINT, SIGTERM and SIGHUP held, so one sent between fork and "
          "exec is not lost (blocked %llx %llx, launcher exit %d)", got[0], got[1], st);

    // SIGINT to a launcher early in its life: the ranks stop cleanly, with a checkpoint, or (before the
    // launcher has a handler at all) the launcher dies of it before any rank exists
    const double delays_ms[6] = {0, 2, 5, 10, 20, 40};
    int bad = 0;
    char what[600] = "";
    for (int i = 0; i < 6; i++) {
        char out_dir[300], args[700], out_path[300];
        snprintf(out_dir, sizeof(out_dir), "%s/sigint_%d", work, i);
        snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
        snprintf(args, sizeof(args), "-np 2 -x 300 -o %s", out_dir);
        pid = spawn_trainer_with(args, NULL, out_path, 0);
        par_sleep(delays_ms[i] / 1000.0);
        kill(pid, SIGINT);
        st = test_wait(pid, 30.0, NULL);
        char *out = test_read_text(out_path);
        int clean = st == 0 && strstr(out, "stopped by a signal") != NULL && strstr(out, "killed by signal") == NULL;
        int early = st == 128 + SIGINT && strstr(out, "rank") == NULL;
        if (!clean && !early) {
            bad++;
            size_t n = strlen(what);
            snprintf(what + n, sizeof(what) - n, " [%.0f ms: exit %d, %s]", delays_ms[i], st,
                     strstr(out, "killed by signal") ? "a rank killed by the signal" :
                     strstr(out, "stopped by a signal") ? "stopped" : "the run went on to its end");
        }
        free(out);
    }
    check(bad == 0, "stop signals: SIGINT to the launcher 0 to 40 ms after its start stops the job cleanly every time%s",
          what);

    // a job started with SIGINT and SIGHUP ignored (`train_gpt2 ... &` from a
    // script, nohup) keeps ignoring them, the launcher and its ranks alike:
    // the two sent to its process group, as a terminal sends them, it trains
    // on for 5 more steps; SIGTERM still stops it cleanly. Caught, either
    // would stop it after the step in progress: at most two more logged, the
    // one that may end between reading the log and the kill, and that one
    for (int np = 1; np <= 2; np++) {
        char out_dir[300], args[700], out_path[300], log[400];
        snprintf(out_dir, sizeof(out_dir), "%s/sigign_%d", work, np);
        snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
        snprintf(log, sizeof(log), "%s/log.jsonl", out_dir);
        snprintf(args, sizeof(args), "-np %d -x 100000 -o %s", np, out_dir);
        pid = spawn_trainer_with(args, NULL, out_path, 1);
        int logged = 0, at_signal = -1, ended = 0;
        for (double t0 = test_now(); !ended && test_now() - t0 < 30.0; par_sleep(0.005)) {
            char *text = test_read_text(log);
            logged = test_count(text, "\n");
            free(text);
            if (at_signal < 0 && logged >= 2) {
                at_signal = logged;
                kill(-pid, SIGINT);
                kill(-pid, SIGHUP);
            }
            if (at_signal >= 0 && logged >= at_signal + 5) break;
            ended = waitpid(pid, &st, WNOHANG) != 0;
        }
        if (!ended) kill(pid, SIGTERM);
        st = ended ? test_exit_status(st) : test_wait(pid, 30.0, NULL);
        char *out = test_read_text(out_path);
        int stopped = st == 0 && strstr(out, "stopped by a signal") != NULL && strstr(out, "killed by signal") == NULL &&
                      (np == 1 || (strstr(out, "launcher: got signal 15;") != NULL && strstr(out, "got signal 2;") == NULL &&
                                   strstr(out, "got signal 1;") == NULL));
        check(at_signal >= 0 && !ended && logged >= at_signal + 5 && stopped,
              "stop signals: %s started with SIGINT and SIGHUP ignored trains on through both (%d steps logged when "
              "they were sent, %d later, %s), and stops cleanly on SIGTERM (exit %d: %s)",
              np == 1 ? "a trainer" : "a launcher of 2 ranks", at_signal, logged, ended ? "ended" : "running", st,
              test_line_of(out, "stopped by a signal"));
        free(out);
    }
}

// ----------------------------------------------------------------------------
// a rank merely stopped (SIGSTOP) is named as stopped, not as a rank that
// disagrees on the order of calls

static void test_stopped_rank(void) {
    size_t bytes = SHM_HEADER_BYTES + 2 * SHM_RANK_BYTES;
    uint8_t *mem = (uint8_t *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!check(mem != MAP_FAILED, "stopped rank: shared memory for two rank blocks")) return;
    memset(mem, 0, bytes);
    Comm c;
    memset(&c, 0, sizeof(c));
    c.rank = 0;
    c.world = 2;
    c.base = mem;
    ShmRank *me = comm_rank_block(&c, 0), *peer = comm_rank_block(&c, 1);
    me->pid = (uint32_t)getpid();
    me->pid_ns = par_pid_ns();
    me->waiting_for = 1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        // rank 1 was waiting for rank 0 in an all-reduce when it was stopped
        peer->pid = (uint32_t)getpid();
        peer->pid_ns = par_pid_ns();
        peer->wait_op = COMM_ALLREDUCE;
        peer->wait_step = 5;
        __atomic_store_n(&peer->waiting_for, 0, __ATOMIC_SEQ_CST);
        raise(SIGSTOP);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, WUNTRACED);
    char blame[400];
    comm_blame(&c, 1, blame, sizeof(blame));
    check(WIFSTOPPED(status) && strstr(blame, "is stopped") != NULL && strstr(blame, "disagree") == NULL,
          "stopped rank: a rank stopped while it waited for this one is named as stopped:%s", blame);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    munmap(mem, bytes);

    // the same in a job: rank 1 of train_gpt2 -np 2 stopped after two steps
    char log[300], args[700], out_path[300], children[100];
    snprintf(log, sizeof(log), "%s/stopped.jsonl", work);
    snprintf(out_path, sizeof(out_path), "%s/trainer.out", work);
    snprintf(args, sizeof(args), "-np 2 -x 100000 -to 1 -lg %s", log);
    pid = spawn_trainer(args, NULL, out_path);
    double t0 = par_now();
    while (lines_in(log) < 2 && par_now() - t0 < 10.0 && waitpid(pid, NULL, WNOHANG) == 0) par_sleep(0.01);
    snprintf(children, sizeof(children), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    char *kids = test_read_text(children);
    int rank0 = 0, rank1 = 0;
    sscanf(kids, "%d %d", &rank0, &rank1);  // in the order forked: rank 0, then rank 1
    free(kids);
    if (rank1 > 0) kill(rank1, SIGSTOP);
    int st = test_wait(pid, 20.0, NULL);
    if (rank1 > 0) kill(rank1, SIGKILL);
    char *out = test_read_text(out_path);
    check(rank1 > 0 && st == 1 && strstr(out, "rank 1 (pid") != NULL && strstr(out, "is stopped") != NULL &&
          strstr(out, "disagree") == NULL, "stopped rank: in a job of 2, rank 0's timeout names rank 1 as stopped "
          "(exit %d): %s", st, test_line_of(out, "timeout after"));
    free(out);
}

// ----------------------------------------------------------------------------
// a shard too short for one micro-batch: warned about once per job, however
// many times the job opens its data

static void test_tiny_shard_warning(void) {
    char dir[300], tiny[320], big[320], args[900];
    snprintf(dir, sizeof(dir), "%s/tiny_data", work);
    mkdir(dir, 0755);
    snprintf(tiny, sizeof(tiny), "%s/a_tiny.bin", dir);
    snprintf(big, sizeof(big), "%s/b_big.bin", dir);
    test_write_shard(tiny, 10);
    test_write_shard(big, 4096);
    const char *how[2] = {"", "-np 2"};
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof(args), "-x 1 %s -i %s/*.bin", how[i], dir);
        TrainerRun r = run_trainer(args, NULL, 30.0);
        int n = test_count(r.out, "a_tiny.bin: 10 tokens");
        check(r.status == 0 && n == 1, "a shard of 10 tokens (%s): one warning about it (%d printed, exit %d)",
              i == 0 ? "one process" : "a launcher of 2 ranks", n, r.status);
        free(r.out);
    }
}

// ----------------------------------------------------------------------------
// a model whose weights hold a NaN: the first step is not applied, and the
// run ends with a line naming it, instead of training on with a loss of nan

static void test_nan_weights(void) {
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    char path[300], err[512];
    snprintf(path, sizeof(path), "%s/nan_model.bin", work);
    if (!check(config_from_descriptor(&c, "d2", 256, 32) == 0, "NaN weights: the d2 shape")) return;
    size_t n = param_count(&c);
    float *p = (float *)malloc(n * sizeof(float));
    uint64_t x = 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 0.04f;
    }
    p[n / 2] = NAN;
    int saved = model_save(path, &c, p, 0, err, sizeof(err));
    free(p);
    if (!check(saved == 0, "NaN weights: a model file with one NaN: %s", saved ? err : "")) return;
    const char *how[2] = {"", "-np 2"};
    for (int i = 0; i < 2; i++) {
        char args[700];
        snprintf(args, sizeof(args), "-x 3 %s -e %s", how[i], path);
        TrainerRun r = run_trainer(args, NULL, 30.0);
        check(r.status == 1 && r.lines == 1 && strstr(r.out, "train_gpt2: step 0: loss ") != NULL &&
              strstr(r.out, "not finite") != NULL && strstr(r.out, "step    1/") == NULL,
              "NaN weights (%s): step 0 is not applied and the run ends there (exit %d): %s",
              i == 0 ? "one process" : "-np 2", r.status, test_line_of(r.out, "train_gpt2:"));
        free(r.out);
    }
    // under llm.c's outlier guard such a step is skipped like an outlier, and the run goes on; its log is
    // JSON, the loss and norm of each step null (JSON has no NaN)
    char args[700], log[300], odir[300];
    snprintf(log, sizeof(log), "%s/nan.jsonl", work);
    snprintf(args, sizeof(args), "-x 3 -sl 3 -e %s -lg %s", path, log);
    TrainerRun r = run_trainer(args, NULL, 30.0);
    int skips = test_count(r.out, "skipping update due to a loss or grad norm that is not finite"), bad;
    int lines = log_lines(log, &bad);
    char *text = test_read_text(log);
    check(r.status == 0 && skips == 3, "NaN weights under -sl 3: every step skipped, the run goes on (%d skips, exit %d)",
          skips, r.status);
    check(lines == 3 && bad == 0 && test_count(text, "\"norm\": null") == 3 && strstr(text, "nan") == NULL,
          "and its log is JSON: %d lines, %d not JSON, the norms null: %s", lines, bad, test_line_of(text, "norm"));
    free(text);
    free(r.out);
    // with -o, the model it would write holds the NaN: not written, one line, exit 1
    snprintf(odir, sizeof(odir), "%s/nan_out", work);
    snprintf(args, sizeof(args), "-x 2 -sl 3 -e %s -o %s", path, odir);
    r = run_trainer(args, NULL, 30.0);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "train_gpt2: the final model not written: the parameters are "
                                                  "not finite") != NULL &&
          !test_exists("%s/model_00000002.bin", odir) && !test_exists("%s/DONE_00000002", odir),
          "NaN weights under -sl 3 with -o: the final model is not written, one line, exit 1 (exit %d): %s", r.status,
          test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    snprintf(args, sizeof(args), "-x 2 -n 1 -sl 3 -e %s -o %s", path, odir);
    r = run_trainer(args, NULL, 30.0);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "train_gpt2: the checkpoint after step 0 not written: the "
                                                  "parameters are not finite") != NULL &&
          !test_exists("%s/ckpt_00000001", odir),
          "and -n 1: the checkpoint after step 0 is not written either, exit 1 (exit %d): %s", r.status,
          test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    // AdamW's epsilon of 0 divides 0 by 0 in rows that never train: refused before any rank starts
    r = run_trainer("-x 1 -ep 0", NULL, 30.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "flag -ep: 0 is out of range [1e-30, 1]") != NULL,
          "-ep 0: refused in one line, exit 2 (exit %d): %s", r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
}

// ----------------------------------------------------------------------------
// the log: a write that fails ends the run, and every line is JSON

static void test_log_writes(void) {
    // a log that cannot be written at all: -lg /dev/full
    TrainerRun r = run_trainer("-x 3 -lg /dev/full", NULL, 30.0);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "train_gpt2: /dev/full: cannot write the log: No space left on "
                                                  "device (at step 0)") != NULL,
          "-lg /dev/full: the run ends at the first line it cannot write, in one line, exit 1 (exit %d): %s", r.status,
          test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    // a disk that fills up mid-run: a file size limit of 4 KiB (ulimit -f 4) lets some lines through, then a
    // write fails; the run ends there and the log keeps whole lines only. (Its output goes to a pipe, which
    // the limit does not reach.)
    char log[300], cmd[1200], out[65536];
    snprintf(log, sizeof(log), "%s/full.jsonl", work);
    snprintf(cmd, sizeof(cmd), "ulimit -f 4 && exec timeout 60 ./train_gpt2 %s -i %s -x 200 -lg %s", TINY, shard, log);
    int rc = test_run(cmd, 1, out, sizeof(out));
    int bad, n = log_lines(log, &bad);
    struct stat st;
    check(rc == 1 && test_count(out, "train_gpt2:") == 1 && strstr(out, "cannot write the log: File too large") != NULL &&
          n > 10 && n < 200 && bad == 0 && stat(log, &st) == 0 && st.st_size <= 4096 && strstr(out, "step  199/200") == NULL,
          "the log's file full after %d lines: the run ends there in one line, exit 1 (exit %d), and the log holds "
          "whole JSON lines only (%d not): %s", n, rc, bad, test_line_of(out, "train_gpt2:"));
}

// an update that makes a parameter infinite from finite everything else:
// 1e37 in a padded row of wte (V 250 padded to 256 rows), which no logit of
// the loss reads and no gradient reaches, and -l 10 -c 10, whose weight
// decay multiplies it by 1 - 100. The loss and the norm stay finite, so the
// step goes on; what must not happen is a file holding it (as -ep 0's 0 / 0
// in those rows once was saved): the parameters are checked before each
// write, not after each update, and the run ends there, one line, exit 1
static void test_nan_update(void) {
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    char path[300], err[512], odir[300], args[900];
    snprintf(path, sizeof(path), "%s/huge_padded.bin", work);
    if (!check(config_from_descriptor(&c, "d2", 250, 32) == 0 && c.Vp == 256, "a padded row: d2, V 250, Vp 256"))
        return;
    size_t n = param_count(&c);
    float *p = (float *)calloc(n, sizeof(float));
    uint64_t x = 11;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = ((float)(x >> 40) / (float)(1 << 24) - 0.5f) * 0.04f;
    }
    for (size_t i = (size_t)c.V * c.C; i < (size_t)c.Vp * c.C; i++) p[i] = 0.0f;  // wte's padded rows, as files hold them
    p[(size_t)(c.V + 3) * c.C + 5] = 1e37f;
    int saved = model_save(path, &c, p, 0, err, sizeof(err));
    free(p);
    if (!check(saved == 0, "a model file with 1e37 in wte's padded row 253: %s", saved ? err : "")) return;
    const char *how[3] = {"", "-np 2", "-sl 3"};
    for (int i = 0; i < 3; i++) {
        snprintf(odir, sizeof(odir), "%s/nan_update_%d", work, i);
        snprintf(args, sizeof(args), "-x 1 -l 10 -c 10 %s -e %s -ev 250 -o %s", how[i], path, odir);  // the file's V
        TrainerRun r = run_trainer(args, NULL, 30.0);
        check(r.status == 1 && r.lines == 1 && strstr(r.out, "step    0/1 | loss ") != NULL &&
              strstr(r.out, "train_gpt2: the final model not written: the parameters are not finite") != NULL &&
              !test_exists("%s/model_00000001.bin", odir) && !test_exists("%s/DONE_00000001", odir),
              "an update that overflows a padded row (%s): loss and norm finite, step 0 trained, then the final "
              "model not written, one line, exit 1 (exit %d): %s", i == 0 ? "one process" : how[i], r.status,
              test_line_of(r.out, "train_gpt2:"));
        free(r.out);
    }
    // a checkpoint after that update is not written either
    snprintf(odir, sizeof(odir), "%s/nan_update_ckpt", work);
    snprintf(args, sizeof(args), "-x 2 -n 1 -l 10 -c 10 -np 2 -e %s -ev 250 -o %s", path, odir);
    TrainerRun r = run_trainer(args, NULL, 30.0);
    check(r.status == 1 && r.lines == 1 && strstr(r.out, "train_gpt2: the checkpoint after step 0 not written: the "
                                                  "parameters are not finite") != NULL &&
          strstr(r.out, "step    1/2") == NULL && !test_exists("%s/ckpt_00000001", odir) &&
          !test_exists("%s/ckpt_00000001.partial", odir),
          "and -n 1 -np 2: the checkpoint after step 0 not written, the run ends there, one line, exit 1 (exit %d): %s",
          r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
}

// ----------------------------------------------------------------------------
// promises that held already, kept as cases: the segment and the key file
// against another user, and links where the trainer writes into -o

static void test_other_promises(void) {
    // another user cannot open a job's shared-memory segment
    if (is_root()) {
        char name[COMM_NAME_BYTES], err[512];
        int made = shm_create(name, 2, 1, err, sizeof(err)) == 0;
        if (!made) check(0, "segment: made for a look by another user: %s", err);
        if (made) {
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0) {
                if (drop_to_nobody() != 0) _exit(3);
                int fd = shm_open(name, O_RDONLY, 0);
                _exit(fd < 0 && errno == EACCES ? 0 : 1);
            }
            int st = test_wait(pid, 5.0, NULL);
            shm_unlink(name);
            check(st == 0, "segment: %s cannot open it (exit %d)", OTHER_USER, st);
        }
    } else {
        skip("segment against another user: needs root to be one");
    }

    // a key file others can read, or that another user owns, is refused
    char key2[300], args[900];
    snprintf(key2, sizeof(key2), "%s/open.key", work);
    uint8_t key[32];
    key_generate(key, NULL, 0);
    key_write_file(key2, key, NULL, 0);
    chmod(key2, 0644);
    snprintf(args, sizeof(args), "-x 1 -np 2 --key-file %s", key2);
    TrainerRun r = run_trainer(args, NULL, 20.0);
    check(r.status == 2 && r.lines == 1 && strstr(r.out, "lets group or others at it") != NULL,
          "--key-file of mode 0644: refused (exit %d): %s", r.status, test_line_of(r.out, "train_gpt2:"));
    free(r.out);
    if (is_root()) {
        chmod(key2, 0600);
        if (chown(key2, NOBODY, NOBODY) != 0) check(0, "chown %s", key2);
        r = run_trainer(args, NULL, 20.0);
        check(r.status == 2 && r.lines == 1 && strstr(r.out, "owned by uid 65534") != NULL,
              "--key-file owned by %s: refused (exit %d): %s", OTHER_USER, r.status, test_line_of(r.out, "train_gpt2:"));
        free(r.out);
    }

    // links at the names the trainer writes in -o: the final model's .tmp,
    // the log, the checkpoint key; none is written through, and each is
    // still there afterwards, with no final model written
    char out[300], victim[300], link[400], model[400];
    snprintf(victim, sizeof(victim), "%s/victim_file", work);
    const char *names[3] = {"model_00000001.bin.tmp", "log.jsonl", "job.key"};
    for (int i = 0; i < 3; i++) {
        FILE *f = fopen(victim, "w");
        if (f != NULL) { fputs("precious\n", f); fclose(f); }
        snprintf(out, sizeof(out), "%s/out_write_%d", work, i);
        mkdir(out, 0755);
        plant(out, names[i], victim, 0);
        snprintf(args, sizeof(args), "-x 1 -o %s", out);
        r = run_trainer(args, NULL, 20.0);
        char *text = test_read_text(victim);
        check(strcmp(text, "precious\n") == 0 && r.status != 0 && r.lines == 1 && strstr(r.out, "symbolic link") != NULL,
              "-o: a link planted at %s is refused in one line, not written through (exit %d): %s", names[i], r.status,
              test_line_of(r.out, "symbolic link"));
        snprintf(link, sizeof(link), "%s/%s", out, names[i]);
        snprintf(model, sizeof(model), "%s/model_00000001.bin", out);
        struct stat st;
        check(lstat(link, &st) == 0 && S_ISLNK(st.st_mode) && access(model, F_OK) != 0,
              "-o: the link planted at %s is still there, and no model_00000001.bin was written", names[i]);
        free(text);
        free(r.out);
    }

    // a regular model_00000001.bin.tmp, left by a run killed while it wrote,
    // gives way: the run ends well, with the model a clean run writes
    char clean[300], clean_model[400];
    snprintf(clean, sizeof(clean), "%s/out_clean", work);
    snprintf(clean_model, sizeof(clean_model), "%s/model_00000001.bin", clean);
    snprintf(out, sizeof(out), "%s/out_leftover", work);
    snprintf(link, sizeof(link), "%s/model_00000001.bin.tmp", out);
    snprintf(model, sizeof(model), "%s/model_00000001.bin", out);
    mkdir(out, 0755);
    FILE *junk = fopen(link, "w");
    if (junk != NULL) { fputs("half a model from a killed run\n", junk); fclose(junk); }
    snprintf(args, sizeof(args), "-x 1 -o %s", clean);
    TrainerRun ref = run_trainer(args, NULL, 20.0);
    snprintf(args, sizeof(args), "-x 1 -o %s", out);
    r = run_trainer(args, NULL, 20.0);
    int same = test_files_same(clean_model, model);
    check(ref.status == 0 && r.status == 0 && access(link, F_OK) != 0 && same,
          "-o: a regular model_00000001.bin.tmp left by a killed run is replaced: exit %d (a clean run %d), no .tmp "
          "left, the model a clean run's: %s", r.status, ref.status, test_line_of(r.out, "train_gpt2:"));
    free(ref.out);
    free(r.out);
}

// ----------------------------------------------------------------------------

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "rank-mask") == 0) return rank_mask_main(argv[2]);
    const char *tmp = getenv("TMPDIR");
    char pattern[256];
    snprintf(pattern, sizeof(pattern), "%s/llm3d-attacks-XXXXXX",
             tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 200 ? tmp : "/tmp");
    if (test_make_dir(work, sizeof(work), pattern) != 0) {
        check(0, "mkdtemp %s: %s", work, strerror(errno));
        return test_summary();
    }
    chmod(work, 0755);  // the other user's children reach into it
    signal(SIGPIPE, SIG_IGN);
    if (access("./train_gpt2", X_OK) != 0) {
        check(0, "./train_gpt2 is not built (make train_gpt2)");
        return test_summary();
    }
    snprintf(shard, sizeof(shard), "%s/data.bin", work);
    snprintf(key_path, sizeof(key_path), "%s/job.key", work);
    uint8_t key[32];
    char err[256];
    if (!check(test_write_shard(shard, 4096) == 0 && key_generate(key, err, sizeof(err)) == 0 &&
               key_write_file(key_path, key, err, sizeof(err)) == 0, "a shard and a key file in %s", work))
        return test_summary();
    test_hello_replay();
    test_idle_flood();
    test_meeting_place();
    test_stale_meeting();
    test_live_tcp_meeting();
    test_meeting_folder();
    test_segment_leaks();
    test_output_dir();
    test_output_dir_swapped();
    test_second_job();
    test_fifos();
    test_shard_changes();
    test_sealed_shard_places();
    test_flags_before_launch();
    test_stop_signals();
    test_stopped_rank();
    test_tiny_shard_warning();
    test_nan_weights();
    test_nan_update();
    test_log_writes();
    test_other_promises();
    test_remove_dir(work);
    return test_summary();
}
