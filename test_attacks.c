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
 * defines: the helpers (a work directory, free ports, other-user children,
 * trainer runs with a deadline), then one function per attack, in the order
 * of doc/security.md's "Attacks tested".
 */
#define _GNU_SOURCE
#include "parallel.h"
#include "test.h"

#include <dirent.h>
#include <ftw.h>
#include <grp.h>
#include <sys/stat.h>

static char work[256];                  // this run's directory
static const char *OTHER_USER = "uid 65534";
#define NOBODY 65534

// ----------------------------------------------------------------------------
// helpers

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(path);
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int is_root(void) { return geteuid() == 0; }

// drop_to_nobody: in a forked child only; 0 done, -1 not possible
static int drop_to_nobody(void) {
    if (!is_root()) return -1;
    return setgroups(0, NULL) == 0 && setgid(NOBODY) == 0 && setuid(NOBODY) == 0 ? 0 : -1;
}

// free_port: a loopback TCP port the kernel just handed out and we let go
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return (int)ntohs(sa.sin_port);
}

// wait_child: the exit status of pid (128 + signal when killed), killing it
// (and its process group, when it leads one) after timeout_s: then -1
static int wait_child(pid_t pid, double timeout_s) {
    double t0 = par_now();
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (par_now() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        par_sleep(0.005);
    }
}

// read_byte: one byte from fd within timeout_s, or 0
static char read_byte(int fd, double timeout_s) {
    char c = 0;
    if (par_wait_fd(fd, POLLIN, par_now() + timeout_s) == 1 && read(fd, &c, 1) != 1) c = 0;
    return c;
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
    int port = free_port(), port2 = free_port();
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
    if (victim > 0) wait_child(victim, 5.0);
    wait_child(att, 5.0);
    check(result == 'R' && s->joined == 0 && strstr(s->last_reject, "replayed") != NULL,
          "hello replay by %s: a hello captured on a squatted port is refused by the next job (reply '%c', %d joined): "
          "\"%s\"", who, result ? result : '?', s->joined, s->last_reject);
    pid_t r0 = honest_rank(spec2, key, 0, 5.0), r1 = honest_rank(spec2, key, 1, 5.0);
    t0 = par_now();
    while (!s->answered && par_now() - t0 < 6.0) rdv_server_step(s, -1, 20);
    int s0 = wait_child(r0, 5.0), s1 = wait_child(r1, 5.0);
    check(s->answered && s0 == 0 && s1 == 0, "hello replay: the real ranks 0 and 1 still join that job (%d %d)", s0, s1);
    rdv_server_close(s);
    free(s);
}

// ----------------------------------------------------------------------------

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(work, sizeof(work), "%s/llm3d-attacks-XXXXXX", tmp != NULL && tmp[0] != '\0' && strlen(tmp) < 200 ? tmp : "/tmp");
    if (mkdtemp(work) == NULL) {
        check(0, "mkdtemp %s: %s", work, strerror(errno));
        return test_summary();
    }
    signal(SIGPIPE, SIG_IGN);
    test_hello_replay();
    remove_tree(work);
    return test_summary();
}
