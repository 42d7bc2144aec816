/*
 * test_run.h: what the test programs do around their checks (test.h): a
 * scratch directory, files written and read back, the programs under test
 * run as commands or as child processes with a deadline, and what those
 * leave behind (their output, the trainer's JSON-lines log, token shards,
 * key files). Last, the two sides of a test's own jobs of ranks
 * (test_parallel, test_host_mode): the flags a rank starts with, and its
 * lines "R <rank> <name> ok|FAIL" that the test looks for.
 *
 * Plain POSIX, and C++ too (test_host_mode.cu includes it). A fixture that
 * cannot be written ends the test program (exit 1): nothing after it would
 * mean anything, and run_tests.sh counts a program that ends without its
 * summary line as a failure.
 *
 * defines:
 *   test_now, test_exit_status           the clock; a wait status as the shell gives it
 *   test_make_dir, test_remove_dir,      the scratch directory, and a name in it
 *   test_path
 *   test_write_file, test_read_file,     whole files
 *   test_read_text, test_files_same,
 *   test_exists
 *   test_count, test_line_of             looking into a program's output
 *   test_write_shard, test_read_shard    token shards (dataloader.h's format)
 *   test_shard_dir                       a scratch directory holding one shard
 *   test_write_tiny_encoder              an encoder.json of the 256 bytes, "ab" and "abc"
 *   test_write_key_file,                 --key-file files
 *   test_random_key_file,
 *   TestKeyCase, test_bad_key_files      four that are no key, and the reasons
 *   test_log_value                       a field of a line of the trainer's log
 *   test_run                             a shell command's output and exit status
 *   test_fifo_refused                    a command given a FIFO refused it at once
 *   test_clear_rank_env, test_spawn, test_spawn_with,     child processes, waited for with a deadline
 *   test_wait, test_free_port,
 *   test_self_exe
 *   TestChild, test_child_args,          a test's own ranks
 *   test_rank_check, test_rank_ok
 */
#ifndef LLM3D_TEST_RUN_H
#define LLM3D_TEST_RUN_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/tokenizer.h"  // bpe_byte_map: GPT-2's spelling of bytes in encoder.json

// ----------------------------------------------------------------------------
// the clock, and how a child ended

// test_now: seconds on a clock that only goes forward
static double test_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// test_exit_status: a wait status as the shell gives it: the exit status, or
// 128 + the signal that ended the process
static int test_exit_status(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// ----------------------------------------------------------------------------
// the scratch directory

// test_make_dir: a new directory named by pattern, whose last six characters
// XXXXXX mkdtemp replaces, into dir; 0, or -1 with errno set
static int test_make_dir(char *dir, size_t len, const char *pattern) {
    snprintf(dir, len, "%s", pattern);
    return mkdtemp(dir) != NULL ? 0 : -1;
}

// test_remove_dir: dir and all it holds (hidden files, other users' files
// and unreadable ones too), as rm -rf removes them; a line when it cannot
static void test_remove_dir(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
}

// test_path: "dir/name" into out, which it returns, so that it can stand
// inside a call
static const char *test_path(char *out, size_t outlen, const char *dir, const char *name) {
    snprintf(out, outlen, "%s/%s", dir, name);
    return out;
}

// ----------------------------------------------------------------------------
// whole files

// test_write_file: len bytes of data as the file at path, which it replaces;
// when it cannot, a line, and the test ends (exit 1)
static void test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        printf("cannot write %s\n", path);
        exit(1);
    }
}

// test_read_file: the whole file at path, malloc'd with a '\0' after it so
// that text reads as a string; *len (when not NULL) gets its bytes. NULL when
// it cannot be opened. Read to its end, not to the size stat gives, which is
// 0 for the files of /proc
static char *test_read_file(const char *path, size_t *len) {
    if (len != NULL) *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    struct stat st;
    // room past the size stat says, so that a file that keeps it reads in one go
    size_t cap = (fstat(fileno(f), &st) == 0 ? (size_t)st.st_size : 0) + 4096, n = 0, got;
    char *data = (char *)malloc(cap + 1);
    while ((got = fread(data + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) data = (char *)realloc(data, (cap *= 2) + 1);
    }
    data[n] = '\0';
    fclose(f);
    if (len != NULL) *len = n;
    return data;
}

// test_read_text: test_read_file's text, or "" (malloc'd too) when there is
// no file: the output of a program that never got to write one
static char *test_read_text(const char *path) {
    char *text = test_read_file(path, NULL);
    return text != NULL ? text : strdup("");
}

// test_files_same: whether the files at a and b both open and hold the
// same bytes, compared a block at a time (checkpoints are hundreds of MB)
static int test_files_same(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa != NULL && fb != NULL;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof(ba), fa), nb = fread(bb, 1, sizeof(bb), fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (na == 0) break;
    }
    if (fa != NULL) fclose(fa);
    if (fb != NULL) fclose(fb);
    return same;
}

// test_exists: whether there is a file at the path that fmt and what follows
// make (printf's way): a directory, or a link even where it leads nowhere
static __attribute__((format(printf, 1, 2))) int test_exists(const char *fmt, ...) {
    char path[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof(path), fmt, ap);
    va_end(ap);
    struct stat st;
    return lstat(path, &st) == 0;
}

// ----------------------------------------------------------------------------
// looking into a program's output

// test_count: how many times what occurs in text, overlapping ones too
// (test_count(out, "\n") is its number of lines); 0 for a NULL text
static int test_count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text != NULL ? strstr(text, what) : NULL; p != NULL; p = strstr(p + 1, what)) n++;
    return n;
}

// test_line_of: the first line of text that holds what, else its last line
// (so that a check's message shows what the program said instead), up to
// 399 bytes of it, in a buffer that the next call overwrites
static const char *test_line_of(const char *text, const char *what) {
    static char line[400];
    const char *p = strstr(text, what);
    if (p == NULL) {
        size_t n = strlen(text);
        while (n > 0 && text[n - 1] == '\n') n--;
        p = text + n;
    }
    while (p > text && p[-1] != '\n') p--;
    size_t k = strcspn(p, "\n");
    snprintf(line, sizeof(line), "%.*s", (int)(k < sizeof(line) - 1 ? k : sizeof(line) - 1), p);
    return line;
}

// ----------------------------------------------------------------------------
// token shards: a header of 256 int32 (magic 20240520, version 1, the
// number of tokens), then the tokens as uint16, little-endian

// test_write_shard: a shard of ntok tokens < 256 from a small repetitive
// "language", for tests that train on something; -1 when the file cannot be
// made
static int test_write_shard(const char *path, int ntok) {
    int32_t h[256] = {20240520, 1, ntok};
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    fwrite(h, 4, 256, f);
    uint64_t x = 12345;
    for (int i = 0; i < ntok; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint16_t t = (uint16_t)(i % 7 == 0 ? 32 : 97 + (x >> 59) + (i % 3));
        fwrite(&t, 2, 1, f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

// test_shard_dir: a scratch directory from pattern (test_make_dir) holding
// one shard of ntok tokens, train_000000.bin (test_write_shard), and in
// shards the pattern a trainer's -i takes for it; 0, or -1
static int test_shard_dir(char *dir, size_t dirlen, char *shards, size_t shardslen, const char *pattern, int ntok) {
    char path[400];
    if (test_make_dir(dir, dirlen, pattern) != 0) return -1;
    snprintf(shards, shardslen, "%s/train_*.bin", dir);
    snprintf(path, sizeof(path), "%s/train_000000.bin", dir);
    return test_write_shard(path, ntok);
}

// test_read_shard: the tokens of the shard at path, malloc'd, their number
// into *ntok; NULL when the file is not such a shard (its magic, its
// version, or a size other than the header's count says)
static uint16_t *test_read_shard(const char *path, size_t *ntok) {
    size_t len;
    unsigned char *data = (unsigned char *)test_read_file(path, &len);
    *ntok = 0;
    uint32_t h[3] = {0, 0, 0};
    for (int k = 0; data != NULL && len >= 1024 && k < 3; k++)
        h[k] = (uint32_t)data[4 * k] | (uint32_t)data[4 * k + 1] << 8 | (uint32_t)data[4 * k + 2] << 16 |
               (uint32_t)data[4 * k + 3] << 24;
    if (data == NULL || len < 1024 || h[0] != 20240520 || h[1] != 1 || len != 1024 + 2 * (size_t)h[2]) {
        free(data);
        return NULL;
    }
    *ntok = h[2];
    uint16_t *tokens = (uint16_t *)malloc(*ntok * 2 + 2);
    for (size_t i = 0; i < *ntok; i++) tokens[i] = (uint16_t)(data[1024 + 2 * i] | data[1025 + 2 * i] << 8);
    free(data);
    return tokens;
}

// test_write_tiny_encoder: a small valid encoder.json at path, as GPT-2's
// spells its keys (bytes_to_unicode): the 256 bytes (ids 0..255), "ab" (256)
// and "abc" (257), then extra_keys (", \"KEY\": ID" pairs, or ""). The
// vocab.bpe that goes with it is "#version: 0.2\na b\nab c\n".
static void test_write_tiny_encoder(const char *path, const char *extra_keys) {
    int byte_of_char[324], char_of_byte[256];
    bpe_byte_map(byte_of_char);
    for (int cp = 0; cp < 324; cp++) if (byte_of_char[cp] >= 0) char_of_byte[byte_of_char[cp]] = cp;
    size_t cap = 16384 + strlen(extra_keys);
    char *json = (char *)malloc(cap);
    if (json == NULL) { printf("out of memory for %s\n", path); exit(1); }
    size_t o = (size_t)snprintf(json, cap, "{");
    for (int byte = 0; byte < 256; byte++) {
        int cp = char_of_byte[byte];
        if (cp == '"' || cp == '\\') o += (size_t)snprintf(json + o, cap - o, "\"\\%c\": %d, ", cp, byte);
        else if (cp < 0x7f) o += (size_t)snprintf(json + o, cap - o, "\"%c\": %d, ", cp, byte);
        else o += (size_t)snprintf(json + o, cap - o, "\"\\u%04x\": %d, ", cp, byte);
    }
    o += (size_t)snprintf(json + o, cap - o, "\"ab\": 256, \"abc\": 257%s}", extra_keys);
    test_write_file(path, json, o);
    free(json);
}

// ----------------------------------------------------------------------------
// key files

// test_write_key_file: key as a --key-file holds one (64 hex digits and a
// newline), in a file of mode 0600 that it replaces; 0, or -1
static int test_write_key_file(const char *path, const uint8_t key[32]) {
    char hex[65 + 1];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    hex[64] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int ok = fd >= 0 && write(fd, hex, 65) == 65;
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

// test_random_key_file: a key file (test_write_key_file) of a fresh key from
// /dev/urandom, made here rather than by the code under test; 0, or -1
static int test_random_key_file(const char *path) {
    uint8_t key[32];
    FILE *f = fopen("/dev/urandom", "rb");
    int got = f != NULL && fread(key, 1, 32, f) == 32;
    if (f != NULL) fclose(f);
    return got ? test_write_key_file(path, key) : -1;
}

// test_bad_key_files: four --key-file paths that are no key, made in dir,
// each with the reason secure.h's key_read_file gives (what a program's
// --key-file line ends in): none at all, a key open to others (mode 0644),
// a file that is not 64 hex digits, and dir itself. 0, or -1 when they
// could not be made.
typedef struct {
    char path[128];
    const char *why;
} TestKeyCase;
enum { TEST_BAD_KEYS = 4 };

static int test_bad_key_files(const char *dir, TestKeyCase cases[TEST_BAD_KEYS]) {
    const char *names[TEST_BAD_KEYS] = {"none.key", "open.key", "bad.key", NULL};
    const char *why[TEST_BAD_KEYS] = {"No such file or directory", "mode 0644 lets group or others at it; chmod 600 it",
                                      "must hold 64 hex digits and an optional newline (6 bytes)", "not a regular file"};
    for (int k = 0; k < TEST_BAD_KEYS; k++) {
        if (names[k] != NULL) test_path(cases[k].path, sizeof(cases[k].path), dir, names[k]);
        else snprintf(cases[k].path, sizeof(cases[k].path), "%s", dir);
        cases[k].why = why[k];
    }
    unlink(cases[0].path);
    int ok = test_random_key_file(cases[1].path) == 0 && chmod(cases[1].path, 0644) == 0;
    test_write_file(cases[2].path, "hello\n", 6);
    ok = ok && chmod(cases[2].path, 0600) == 0;
    return ok ? 0 : -1;
}

// ----------------------------------------------------------------------------
// the trainer's log: one JSON object a line, {"step": 3, "loss": 5.123, ...}

// test_log_value: where the value of field key starts in a line of the log,
// or NULL when the line has none. It looks for "key": with the quotes, so
// that "loss" is not found in "val_loss"
static const char *test_log_value(const char *line, const char *key) {
    char want[64];
    snprintf(want, sizeof(want), "\"%s\": ", key);
    const char *p = strstr(line, want);
    return p != NULL ? p + strlen(want) : NULL;
}

// ----------------------------------------------------------------------------
// commands

// test_run: cmd through the shell; its stderr, and its stdout too when
// with_stdout (else that is dropped), read into out: the first outlen - 1
// bytes and a '\0', the rest read and dropped, so that a program that says
// more never blocks on a full pipe. The exit status (test_exit_status), or
// -1 when no shell could be started
static int test_run(const char *cmd, int with_stdout, char *out, size_t outlen) {
    char full[8192];
    snprintf(full, sizeof(full), "%s 2>&1%s", cmd, with_stdout ? "" : " >/dev/null");
    out[0] = '\0';
    FILE *p = popen(full, "r");
    if (p == NULL) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    char rest[4096];
    while (fread(rest, 1, sizeof(rest), p) > 0) {}
    int status = pclose(p);
    return status == -1 ? -1 : test_exit_status(status);
}

// test_fifo_refused: runs cmd as test_run does, where cmd names the FIFO
// fifo among its paths; 1 when it was refused at once as it should be: exit
// status want_rc and one line naming the FIFO as not a regular file. *rc and
// *secs get the exit status and the time it took, for the check's message
static int test_fifo_refused(const char *cmd, int with_stdout, const char *fifo, int want_rc, char *out,
                             size_t outlen, int *rc, double *secs) {
    double t0 = test_now();
    *rc = test_run(cmd, with_stdout, out, outlen);
    *secs = test_now() - t0;
    char want[600];
    snprintf(want, sizeof(want), "%s: not a regular file", fifo);
    return *rc == want_rc && strstr(out, want) != NULL && test_count(out, "\n") == 1;
}

// ----------------------------------------------------------------------------
// child processes

// the rank variables of every launcher the trainer knows (launcher.h): a
// child gets none but those its test sets, whatever this test runs under
static const char *const test_rank_env[] = {
    "LLM3D_RANK", "LLM3D_WORLD", "LLM3D_LOCAL_RANK", "LLM3D_RENDEZVOUS", "LLM3D_KEY_FD", "LLM3D_LAUNCHER_PID",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    // and what says where the ranks are and which launch they belong to (launcher.h's meet_plan)
    "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
    "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
    "TORCHELASTIC_RUN_ID", "MASTER_PORT",
};

static void test_clear_rank_env(void) {
    for (size_t i = 0; i < sizeof(test_rank_env) / sizeof(test_rank_env[0]); i++) unsetenv(test_rank_env[i]);
}

// test_spawn_with: the program argv[0] with argv (NULL-terminated), started
// in a process group of its own (so that test_wait's kill reaches what it
// starts too), with the rank variables cleared and env's "NAME=VALUE" entries
// (NULL-terminated; NULL for none) set; its stdout appended to the file
// out_path, its stderr to err_path (NULL: to out_path too). Its SIGINT and
// SIGHUP start at their defaults, or ignored with ignore_stop (as a shell
// starts a background job, and nohup), whatever this test was started with:
// the trainer keeps ignoring what it starts ignoring. The two are held from
// before the fork until the child has set them, so that a signal sent at
// once meets the child's disposition, not this test's. Its pid, or -1
static pid_t test_spawn_with(char *const *argv, const char *const *env, const char *out_path, const char *err_path,
                             int ignore_stop) {
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop, &old);
    fflush(NULL);  // else the child would print again what this process still buffers
    pid_t pid = fork();
    if (pid != 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        if (pid > 0) setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a kill
        return pid;
    }
    setpgid(0, 0);
    test_clear_rank_env();
    for (int i = 0; env != NULL && env[i] != NULL; i++) {
        char entry[1024];
        snprintf(entry, sizeof(entry), "%s", env[i]);
        char *eq = strchr(entry, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        setenv(entry, eq + 1, 1);
    }
    signal(SIGINT, ignore_stop ? SIG_IGN : SIG_DFL);
    signal(SIGHUP, ignore_stop ? SIG_IGN : SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, NULL);  // one sent since the fork is delivered now, to that disposition
    int out = open(out_path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    int err = err_path != NULL ? open(err_path, O_WRONLY | O_CREAT | O_APPEND, 0600) : out;
    if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
    if (out > 2) close(out);
    if (err > 2 && err != out) close(err);
    execv(argv[0], argv);
    _exit(127);
}

// test_spawn: test_spawn_with, SIGINT and SIGHUP at their defaults
static pid_t test_spawn(char *const *argv, const char *const *env, const char *out_path, const char *err_path) {
    return test_spawn_with(argv, env, out_path, err_path, 0);
}

// test_wait: the exit status of the child pid (test_exit_status), waiting at
// most timeout_s; past that the child, and its process group when it leads
// one (test_spawn's do), is killed and it returns -1, as it does for no child
// at all. *elapsed (when not NULL) gets the seconds it waited
static int test_wait(pid_t pid, double timeout_s, double *elapsed) {
    double t0 = test_now();
    if (elapsed != NULL) *elapsed = 0.0;
    if (pid <= 0) return -1;  // a failed fork: kill(-pid) would reach other processes
    struct timespec tick = {0, 5 * 1000 * 1000};
    for (;;) {
        int status;
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid || done < 0) {
            if (elapsed != NULL) *elapsed = test_now() - t0;
            return done == pid ? test_exit_status(status) : -1;
        }
        if (test_now() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            if (elapsed != NULL) *elapsed = test_now() - t0;
            return -1;
        }
        nanosleep(&tick, NULL);
    }
}

// test_free_port: a loopback TCP port that the kernel just handed out and
// this process let go again, for a rendezvous to bind next
static int test_free_port(void) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    close(fd);
    return (int)ntohs(sa.sin_port);
}

// test_self_exe: the path of this program, to start it again as the ranks of
// a job (argv0 where /proc cannot say)
static void test_self_exe(char *out, size_t len, const char *argv0) {
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    if (n <= 0) snprintf(out, len, "%s", argv0);
    else out[n] = '\0';
}

// ----------------------------------------------------------------------------
// a test's own ranks: the test program started again, through the launcher,
// as `PROGRAM child MODE -np N [-to S] [-fault KIND:RANK:STEP]
// [--rendezvous A --key-file F]`

// TestChild: those flags as given (-fault still to be parsed by fault_parse)
typedef struct {
    const char *mode, *fault, *rendezvous, *key_file;
    int np;
    double to;
} TestChild;

// test_child_args: argv into c, with -np 1, -to default_to and no other flag
// unless given; 0, or 2 with a line on stderr for a flag it does not know
static int test_child_args(TestChild *c, int argc, char **argv, double default_to) {
    memset(c, 0, sizeof(*c));
    c->mode = argv[2];
    c->np = 1;
    c->to = default_to;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-np") == 0) c->np = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-to") == 0) c->to = atof(argv[i + 1]);
        else if (strcmp(argv[i], "-fault") == 0) c->fault = argv[i + 1];
        else if (strcmp(argv[i], "--rendezvous") == 0) c->rendezvous = argv[i + 1];
        else if (strcmp(argv[i], "--key-file") == 0) c->key_file = argv[i + 1];
        else {
            fprintf(stderr, "child: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    return 0;
}

// Each check a rank makes is a line of its output, "R <rank> <name> ok" or
// "R <rank> <name> FAIL", then what it found when fmt says anything; the
// test looks for them with test_rank_ok. test_rank_failures counts the
// FAILs, for the rank's exit status.
static int test_rank_failures;

static __attribute__((format(printf, 4, 5))) void test_rank_check(int rank, const char *name, int ok, const char *fmt, ...) {
    char detail[256] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    printf("R %d %s %s%s%s\n", rank, name, ok ? "ok" : "FAIL", detail[0] != '\0' ? " " : "", detail);
    fflush(stdout);
    if (!ok) test_rank_failures++;
}

// test_rank_ok: whether the first "R <rank> <name> ok" in out is such a line
static int test_rank_ok(const char *out, int rank, const char *name) {
    char want[160];
    snprintf(want, sizeof(want), "R %d %s ok", rank, name);
    const char *p = strstr(out, want);
    return p != NULL && (p[strlen(want)] == ' ' || p[strlen(want)] == '\n');
}

#endif
