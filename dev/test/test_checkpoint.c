/*
 * test_checkpoint.c: checkpoints and recovery, through ./train_gpt2 itself.
 *
 * On a tiny model (d2: L=2 C=128 NH=2, V=256) and a synthetic shard:
 * bit-exact resume (one rank and parallel layouts), resume under other
 * layouts, the refusals (truncated, changed, another key, another shape,
 * a missing file), encrypted checkpoints (-enc), a changed byte in each
 * file, plain and sealed, a shuffled resume at positions deep in the
 * data, -e of a sealed final model, keeping the last K, SIGTERM, a file
 * size limit, the log's tokens across resumes under another total batch
 * (state.bin's count, and an older state.bin without it), the lines printed
 * before a SIGTERM without -o kept in a redirected stdout, and 20 SIGKILLs
 * at random moments in a row.
 */
#define _GNU_SOURCE
#include "dataloader.h"  // the position a checkpoint saves, recomputed
#include "llm3d/checkpoint.h"
#include "llm3d/gpt2.h"
#include "llm3d/flags.h"  // Options
#include "dev/test/test.h"
#include "dev/test/test_run.h"

#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>

#define MAX_STEPS 64
static char dir[128], shards[160];
static const char *MODEL = "-e d2 -ev 256 -et 32 -b 2 -t 16 -d 128 -l 1e-3 -v 0 -s 0 -th 1";

typedef struct {
    int status;      // exit status, or 128 + signal
    int nsteps;      // steps logged: 0..nsteps-1, or -1 when the log is not that
    char loss[MAX_STEPS][16], norm[MAX_STEPS][16];  // as printed: compared as text, bit for bit
    char out[65536]; // stdout and stderr
} Run;

// starts ./train_gpt2 with the shared flags and `args`, output into dir/out.txt;
// a file size limit when fsize > 0
static pid_t start(const char *args, long fsize) {
    char cmd[2048], out[200];
    snprintf(out, sizeof(out), "%s/out.txt", dir);
    snprintf(cmd, sizeof(cmd), "exec ./train_gpt2 %s -i '%s' %s > %s 2>&1", MODEL, shards, args, out);
    pid_t pid = fork();
    if (pid == 0) {
        if (fsize > 0) {
            struct rlimit rl = {(rlim_t)fsize, (rlim_t)fsize};
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        setpgid(0, 0);  // our own group, so a kill reaches the launcher's ranks too
        setenv("TMPDIR", dir, 1);  // a killed launcher's socket directory lands in ours
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a kill
    return pid;
}

// the log's steps; a resumed run's log may start at its checkpoint's step
static void read_log(Run *r, const char *log) {
    r->nsteps = 0;
    FILE *f = fopen(log, "r");
    char line[512];
    int first = 1;
    while (f && fgets(line, sizeof(line), f)) {
        const char *s = test_log_value(line, "step"), *l = test_log_value(line, "loss");
        const char *n = test_log_value(line, "norm");
        int step = s != NULL ? atoi(s) : -1;
        if (first && step > 0 && step < MAX_STEPS) r->nsteps = step;
        first = 0;
        if (step < 0 || step >= MAX_STEPS || !l || !n || step != r->nsteps) { r->nsteps = -1; break; }
        sscanf(l, "%15[^,]", r->loss[step]);
        sscanf(n, "%15[^,]", r->norm[step]);
        r->nsteps++;
    }
    if (f) fclose(f);
}

// r from a run that ended with status (test_exit_status's): its exit, output and log
static void collect(Run *r, int status, const char *out_dir) {
    r->status = status;
    char path[300];
    snprintf(path, sizeof(path), "%s/out.txt", dir);
    char *out = test_read_text(path);
    snprintf(r->out, sizeof(r->out), "%s", out);
    free(out);
    snprintf(path, sizeof(path), "%s/log.jsonl", out_dir);
    read_log(r, path);
}

static void finish(Run *r, pid_t pid, const char *out_dir) {
    int st;
    waitpid(pid, &st, 0);
    collect(r, test_exit_status(st), out_dir);
}

// runs to the end: out_dir, steps, then more flags
static void run(Run *r, const char *out_dir, int steps, const char *args) {
    char all[1024];
    snprintf(all, sizeof(all), "-o %s -x %d %s", out_dir, steps, args);
    finish(r, start(all, 0), out_dir);
}

static int same_steps(const Run *a, const Run *b, int from, int to) {
    if (a->nsteps < to || b->nsteps < to) return 0;
    for (int i = from; i < to; i++)
        if (strcmp(a->loss[i], b->loss[i]) != 0 || strcmp(a->norm[i], b->norm[i]) != 0) return 0;
    return 1;
}

static float worst_diff(const Run *a, const Run *b, int from, int to) {
    if (a->nsteps < to || b->nsteps < to) return INFINITY;
    float w = 0.0f;
    for (int i = from; i < to; i++) {
        w = fmaxf(w, fabsf(strtof(a->loss[i], NULL) - strtof(b->loss[i], NULL)));
        w = fmaxf(w, fabsf(strtof(a->norm[i], NULL) - strtof(b->norm[i], NULL)));
    }
    return w;
}

static __attribute__((format(printf, 1, 2))) void sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) printf("note: '%s' failed\n", cmd);
}

static int files_equal(const char *dir_a, const char *dir_b, const char *name) {
    char pa[400], pb[400];
    snprintf(pa, sizeof(pa), "%s/%s", dir_a, name);
    snprintf(pb, sizeof(pb), "%s/%s", dir_b, name);
    return test_files_same(pa, pb);
}

// ---------------------------------------------------------------------------

// a run that stops at step 20 (its checkpoint copied alone into a fresh
// directory) and resumes to 40 prints the losses of an uninterrupted run
static void test_bit_exact(const char *layout, const char *name) {
    static Run full, resumed;
    char a[200], b[200], args[300];
    snprintf(a, sizeof(a), "%s/exact_full", dir);
    snprintf(b, sizeof(b), "%s/exact_resumed", dir);
    snprintf(args, sizeof(args), "-n 20 %s", layout);
    run(&full, a, 40, args);
    if (!check(full.status == 0 && full.nsteps == 40, "%s: 40 steps with a checkpoint every 20 (exit %d)", name, full.status)) {
        printf("%s\n", full.out);
        return;
    }
    sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000020 %s/job.key %s/", b, b, a, a, b);
    snprintf(args, sizeof(args), "-y 1 -n 20 %s", layout);
    run(&resumed, b, 40, args);
    check(resumed.status == 0 && strstr(resumed.out, "resuming from") != NULL && resumed.nsteps == 40,
          "%s: resumed from step 20 and ran to 40 (exit %d, %d log lines)", name, resumed.status, resumed.nsteps);
    check(same_steps(&full, &resumed, 20, 40), "%s: steps 20..39 print the same losses and norms as the uninterrupted run",
          name);
    check(full.nsteps == 40 && test_exists("%s/ckpt_%08d/MANIFEST", a, 40) && test_exists("%s/ckpt_%08d/MANIFEST", b, 40),
          "%s: both runs end with a sealed checkpoint of step 40", name);
    char fa[300], fb[300];
    snprintf(fa, sizeof(fa), "%s/ckpt_00000040", a);
    snprintf(fb, sizeof(fb), "%s/ckpt_00000040", b);
    check(files_equal(fa, fb, "model.bin") && files_equal(fa, fb, "optim.bin"),
          "%s: the final model.bin and optim.bin are byte-identical", name);
}

// the id ckpt_verify gives the checkpoint of `step` under run directory d
// (its job.key), or 0 when it does not verify
static uint64_t checkpoint_id(const char *d, int step) {
    char path[300], err[2048];
    uint8_t key[32];
    CkptState st;
    snprintf(path, sizeof(path), "%s/job.key", d);
    if (key_read_file(path, key, err, sizeof(err)) != 0) return 0;
    snprintf(path, sizeof(path), "%s/ckpt_%08d", d, step);
    return ckpt_verify(path, key, 1, &st, err, sizeof(err)) == 0 ? st.id : 0;
}

// a checkpoint of (dp, tp, pp, ZeRO) = (2, 2, 2, 1) resumes under other layouts
static void test_other_layouts(void) {
    static Run full, r;
    char a[200], b[200], args[300];
    snprintf(a, sizeof(a), "%s/layout_full", dir);
    run(&full, a, 20, "-n 10 -np 8 -tp 2 -pp 2 -z 1");
    if (!check(full.status == 0 && full.nsteps == 20, "(2,2,2) ZeRO-1: 20 steps, checkpoint every 10 (exit %d)", full.status)) {
        printf("%s\n", full.out);
        return;
    }
    const char *layouts[] = {"-np 1", "-np 4 -z 3", "-np 4 -tp 2 -pp 2", "-np 2 -pp 2 -z 2 -ps gpipe"};
    for (int i = 0; i < 4; i++) {
        snprintf(b, sizeof(b), "%s/layout_%d", dir, i);
        sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000010 %s/job.key %s/", b, b, a, a, b);
        snprintf(args, sizeof(args), "-y 1 -n 10 %s", layouts[i]);  // -n 10: a step-20 checkpoint of its own
        run(&r, b, 20, args);
        if (!check(r.status == 0 && r.nsteps == 20, "(2,2,2) checkpoint resumes under %s (exit %d)", layouts[i], r.status)) {
            printf("%s\n", r.out);
            continue;
        }
        float w = worst_diff(&full, &r, 10, 20);
        check(w <= 1e-5f, "resumed under %s: worst loss/norm difference from the uninterrupted run %.2e (<= 1e-5)",
              layouts[i], w);
    }
    // the checkpoints' ids (the ranks' start marks): a copy has its original's,
    // and a step-20 checkpoint of another run, near as its numbers are, another
    snprintf(b, sizeof(b), "%s/layout_0", dir);
    uint64_t copied = checkpoint_id(b, 10), original = checkpoint_id(a, 10);
    uint64_t mine = checkpoint_id(a, 20), other_run = checkpoint_id(b, 20);
    check(original != 0 && copied == original && mine != 0 && other_run != 0 && other_run != mine,
          "checkpoint ids: step 10 %016llx, its copy %016llx; step 20 %016llx, another run's step 20 %016llx",
          (unsigned long long)original, (unsigned long long)copied, (unsigned long long)mine,
          (unsigned long long)other_run);
}

// each damage is refused with one line that names the file, and exit 2
static void test_refusals(void) {
    static Run good, r;
    char a[200], b[200], k[300];
    snprintf(a, sizeof(a), "%s/refuse_src", dir);
    run(&good, a, 4, "-n 4");
    if (!check(good.status == 0 && test_exists("%s/ckpt_%08d/MANIFEST", a, 4), "a checkpoint of step 4 to damage"))
        return;
    struct { const char *what, *damage, *expect, *flags; } cases[] = {
        {"a truncated optim.bin", "truncate -s -4 %s/ckpt_00000004/optim.bin", "optim.bin: size", ""},
        {"a changed byte in model.bin", "printf 'x' | dd of=%s/ckpt_00000004/model.bin bs=1 seek=5000 conv=notrunc 2>/dev/null",
         "model.bin: sha256", ""},
        {"a changed byte in MANIFEST", "sed -i 's/^files 3/files 3 /' %s/ckpt_00000004/MANIFEST", "MANIFEST", ""},
        {"a missing state.bin", "rm %s/ckpt_00000004/state.bin", "state.bin", ""},
        {"another job's key", "rm %1$s/job.key && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > %1$s/job.key && "
         "echo >> %1$s/job.key && chmod 600 %1$s/job.key", "another key", ""},
        {"a lost job.key", "rm %s/job.key", "job.key is missing, but", ""},
        {"another model shape", "true %s", "holds a model of L=2", "-e d4"},
        {"another micro-batch", "true %s", "written with -b 2 -t 16", "-b 1 -d 128"},
        {"a step that is not there", "true %s", "no checkpoint of step 3", "-ys 3"},
        {"another shuffle", "true %s", "written with -sh 0", "-sh 1"},
        {"fewer steps than the checkpoint's", "true %s", "flag -x: 3 steps, but checkpoint", "-x 3"},
    };
    for (int i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); i++) {
        snprintf(b, sizeof(b), "%s/refuse_%d", dir, i);
        sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000004 %s/job.key %s/", b, b, a, a, b);
        sh(cases[i].damage, b);
        char args[200];
        snprintf(args, sizeof(args), "-y 1 %s", cases[i].flags);
        run(&r, b, 8, args);
        int lines = test_count(r.out, "\n");
        check(r.status == 2 && lines == 1 && strstr(r.out, cases[i].expect) != NULL,
              "%s: refused (exit %d, %d line): %s", cases[i].what, r.status, lines, test_line_of(r.out, "train_gpt2"));
    }
    // another job's checkpoint resumes when --key-file names that job's key,
    // on several ranks too (their launcher takes the job key from the file)
    snprintf(b, sizeof(b), "%s/refuse_4", dir);
    snprintf(k, sizeof(k), "-y 1 -np 2 --key-file %s/job.key", a);
    run(&r, b, 8, k);
    check(r.status == 0 && r.nsteps == 8 && strstr(r.out, "resuming from") != NULL,
          "another job's checkpoint resumes on 2 ranks with --key-file naming its key (exit %d)", r.status);
}

// whether every file of a checkpoint directory (and more) is sealed
static int sealed(const char *fmt, const char *a, int step) {
    char path[400];
    snprintf(path, sizeof(path), fmt, a, step);
    int is_sealed = 0, fd = ckpt_open_read(path, 1, &is_sealed, NULL, 0);
    if (fd >= 0) close(fd);
    return is_sealed;
}

// the key of a directory's job.key
static int read_key(const char *out_dir, uint8_t key[32]) {
    char path[300], err[512];
    snprintf(path, sizeof(path), "%s/job.key", out_dir);
    return key_read_file(path, key, err, sizeof(err));
}

// whether the files at path_a and path_b, each read as a checkpoint's file
// is (ckpt_read_file: decrypted under key if sealed, as it is if plain),
// hold the same bytes; err set when one cannot be read
static int same_plaintext(const char *path_a, const char *path_b, const uint8_t key[32], char *err, size_t errlen) {
    uint8_t *x = NULL, *y = NULL;
    uint64_t xn = 0, yn = 0;
    int same = ckpt_read_file(path_a, key, 1 << 30, &x, &xn, err, errlen) == 0 &&
               ckpt_read_file(path_b, key, 1 << 30, &y, &yn, err, errlen) == 0 && xn == yn && memcmp(x, y, xn) == 0;
    free(x);
    free(y);
    return same;
}

// the Options that ckpt_init_config and ckpt_init_load read: -e init and
// --key-file key_file (NULL for none), the rest zero
static Options init_options(const char *init, const char *key_file) {
    Options o;
    memset(&o, 0, sizeof(o));
    o.init = init;
    o.key_file = key_file;
    return o;
}

// -enc: checkpoints (and with 2 the final model) sealed with AES-256-GCM; the
// losses those of a plain run, bit for bit; a resume reads them with or
// without -enc, bit-exact; damage, another key or no key: one line, exit 2
static void test_encrypted(const char *layout, const char *name) {
    static Run plain, full, resumed;
    char a[200], b[200], p[200], args[300];
    snprintf(p, sizeof(p), "%s/enc_plain", dir);
    snprintf(a, sizeof(a), "%s/enc_full", dir);
    snprintf(b, sizeof(b), "%s/enc_resumed", dir);
    snprintf(args, sizeof(args), "-n 20 %s", layout);
    run(&plain, p, 40, args);
    snprintf(args, sizeof(args), "-n 20 -enc 2 %s", layout);
    run(&full, a, 40, args);
    if (!check(full.status == 0 && full.nsteps == 40, "%s, -enc 2: 40 steps with a checkpoint every 20 (exit %d)", name,
               full.status)) {
        printf("%s\n", full.out);
        return;
    }
    check(same_steps(&plain, &full, 0, 40), "%s, -enc 2: the losses and norms of the run without -enc, bit for bit", name);
    check(sealed("%s/ckpt_%08d/model.bin", a, 20) && sealed("%s/ckpt_%08d/optim.bin", a, 20) &&
          sealed("%s/ckpt_%08d/state.bin", a, 20) && sealed("%s/model_%08d.bin", a, 40) &&
          !sealed("%s/ckpt_%08d/model.bin", p, 20) && !sealed("%s/model_%08d.bin", p, 40),
          "%s: with -enc 2 model.bin, optim.bin, state.bin and the final model are sealed files; without, plain", name);
    // the sealed files hold the plain run's bytes, and none of them readable
    uint8_t key[32], *dec = NULL;
    uint64_t dec_n = 0;
    char pa[300], pp[300], err[1024];
    // the final model, every rank writing its part (ckpt_write_model)
    snprintf(pa, sizeof(pa), "%s/model_00000040.bin", a);
    snprintf(pp, sizeof(pp), "%s/model_00000040.bin", p);
    int same_final = read_key(a, key) == 0 && same_plaintext(pa, pp, key, err, sizeof(err));
    check(same_final && !test_exists("%s/model_%08d.bin.tmp", a, 40) && !test_exists("%s/model_%08d.bin.tmp", p, 40),
          "%s: the sealed final model decrypts to the plain run's, byte for byte, and no .tmp is left %s", name,
          same_final ? "" : err);
    snprintf(pa, sizeof(pa), "%s/ckpt_00000020/optim.bin", a);
    snprintf(pp, sizeof(pp), "%s/ckpt_00000020/optim.bin", p);
    size_t plain_n = 0, sealed_n = 0;
    char *plain_bytes = test_read_file(pp, &plain_n);
    int ok = read_key(a, key) == 0 && ckpt_read_file(pa, key, 1 << 30, &dec, &dec_n, err, sizeof(err)) == 0;
    check(ok && dec_n == plain_n && memcmp(dec, plain_bytes, plain_n) == 0,
          "%s: optim.bin decrypts to the plain run's optim.bin, byte for byte %s", name, ok ? "" : err);
    free(dec);
    char *sealed_bytes = test_read_file(pa, &sealed_n);
    check(sealed_n > 4096 && plain_n > 4096 && memmem(sealed_bytes, sealed_n, plain_bytes + 2048, 64) == NULL,
          "%s: the sealed optim.bin holds none of its plaintext", name);
    free(plain_bytes);
    free(sealed_bytes);

    // resumed with and without -enc: bit-exact either way
    for (int with = 0; with < 2; with++) {
        sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000020 %s/job.key %s/", b, b, a, a, b);
        snprintf(args, sizeof(args), "-y 1 -n 20 %s %s", with ? "-enc 1" : "", layout);
        run(&resumed, b, 40, args);
        check(resumed.status == 0 && strstr(resumed.out, "resuming from") != NULL && same_steps(&full, &resumed, 20, 40),
              "%s: resumed from the sealed checkpoint of step 20 %s: steps 20..39 as the uninterrupted run (exit %d)",
              name, with ? "with -enc 1" : "without -enc", resumed.status);
        check(sealed("%s/ckpt_%08d/model.bin", b, 40) == with,
              "%s: ... and its own checkpoint is %s", name, with ? "sealed" : "plain");
    }
    // the last resume's checkpoint of step 40, decrypted: the plain run's bytes
    int same = read_key(b, key) == 0;
    for (int i = 0; i < 2 && same; i++) {
        snprintf(pa, sizeof(pa), "%s/ckpt_00000040/%s", b, ckpt_files[i]);
        snprintf(pp, sizeof(pp), "%s/ckpt_00000040/%s", p, ckpt_files[i]);
        same = same_plaintext(pa, pp, key, err, sizeof(err));
    }
    check(same, "%s: its model.bin and optim.bin of step 40 decrypt to the plain run's, byte for byte", name);
}

// plain[0..bytes) sealed into the new file path under key's cipher key
static int write_sealed_file(const char *path, const uint8_t key[32], const uint8_t *plain, size_t bytes, char *err,
                             size_t errlen) {
    AeadFileKey fk;
    aead_file_key(&fk, key);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int rc = fd >= 0 ? aead_file_write_all(fd, &fk, plain, bytes, AEAD_FILE_CHUNK_BYTES, NULL, path, err, errlen)
                     : errorf(err, errlen, "%s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    aead_file_key_wipe(&fk);
    return rc;
}

// a sealed model.bin of 14 chunks, loaded by the ranks of several layouts
// as a resume does, and as -e does (ckpt_init_load, the key from
// --key-file): each gets its units as unit_fill gives them from the plain
// array, having decrypted fewer chunks than all where it holds part of the
// layers (pp 2); a header of another shape is refused
static void test_model_slices(void) {
    GPT2Config c = {.maxT = 64, .V = 1000, .Vp = 1024, .L = 4, .NH = 4, .C = 256};
    size_t N = param_count(&c), bytes = (size_t)ckpt_file_bytes(0, &c);
    uint8_t *plain = (uint8_t *)malloc(bytes), key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(5 * i + 2);
    model_fill_header((int32_t *)plain, &c, 3);
    float *full = (float *)(plain + HEADER_INTS * 4);
    for (size_t j = 0; j < N; j++) full[j] = 0.5f + (float)j;
    char path[300], err[1024];
    snprintf(path, sizeof(path), "%s/slices_model.bin", dir);
    int ok = write_sealed_file(path, key, plain, bytes, err, sizeof(err)) == 0;
    char key_path[300];
    snprintf(key_path, sizeof(key_path), "%s/slices.key", dir);
    ok = ok && key_write_file(key_path, key, err, sizeof(err)) == 0;
    if (!check(ok, "a sealed model.bin of %zu bytes and its key file (%s)", bytes, ok ? "ok" : err)) { free(plain); return; }
    Options o = init_options(path, key_path);
    GPT2Config checked;
    int is_sealed = 0;
    uint64_t file_id = 0;
    ok = ckpt_init_config(&o, &checked, &is_sealed, &file_id, err, sizeof(err)) == 0 && is_sealed;
    if (!check(ok, "ckpt_init_config of the sealed model.bin: sealed, its file id read (%s)", ok ? "ok" : err)) {
        free(plain);
        return;
    }
    struct { int dp, tp, pp; } layouts[] = {{1, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}};
    for (int k = 0; k < 8; k++) {
        int by_init = k >= 4;  // -e's ckpt_init_load; before, a resume's ckpt_model_load_part
        int dp = layouts[k % 4].dp, tp = layouts[k % 4].tp, pp = layouts[k % 4].pp, world = dp * tp * pp, same = 1;
        for (int rank = 0; rank < world && same; rank++) {
            Shard s = shard_for(&c, tp, rank % tp, pp, rank / tp % pp, dp, rank / (tp * pp));
            UnitTable ut;
            GPT2Config got = c;
            same = unit_table(&ut, &c, &s, 1) == 0;
            float *params = !same ? NULL : by_init ? ckpt_init_load(&o, &got, file_id, &s, &ut, err, sizeof(err))
                                                   : ckpt_model_load_part(path, key, &got, &s, &ut, err, sizeof(err));
            float *a = (float *)malloc(unit_table_largest(&ut) * sizeof(float));
            float *b = (float *)malloc(unit_table_largest(&ut) * sizeof(float));
            same = params != NULL;
            for (int u = 0; same && u < ut.n; u++) {
                unit_fill(&c, &s, &ut.units[u], a, params, 0);
                unit_fill(&c, &s, &ut.units[u], b, full, 0);
                same = memcmp(a, b, ut.units[u].size * sizeof(float)) == 0;
            }
            // pp 2: a stage's zeros (another stage's layers) show it decrypted less than all
            size_t zeros = 0;
            for (size_t j = 0; params != NULL && j < N; j++) zeros += params[j] == 0.0f;
            if (pp == 2) same = same && zeros > 0;
            free(params);
            free(a);
            free(b);
            free(ut.units);
        }
        check(same, "dp %d tp %d pp %d%s: each rank's units from the sealed model.bin, as from the plain array%s %s", dp,
              tp, pp, by_init ? ", as -e" : "", pp == 2 ? ", other stages' chunks left undecrypted" : "", same ? "" : err);
    }
    GPT2Config other = c;
    other.L = 2;  // its file would be shorter: refused before any chunk is read
    Shard s = shard_for(&other, 1, 0, 1, 0, 1, 0);
    UnitTable ut;
    unit_table(&ut, &other, &s, 1);
    float *params = ckpt_model_load_part(path, key, &other, &s, &ut, err, sizeof(err));
    check(params == NULL && strstr(err, path) != NULL && strstr(err, "bytes sealed"),
          "a model.bin of another shape than the checkpoint's refused, naming it: %s", err);
    free(params);
    free(ut.units);
    other = c;
    other.NH = 8;  // the same size: the header in chunk 0 tells
    s = shard_for(&other, 1, 0, 1, 0, 1, 0);
    unit_table(&ut, &other, &s, 1);
    params = ckpt_model_load_part(path, key, &other, &s, &ut, err, sizeof(err));
    check(params == NULL && strstr(err, path) != NULL && strstr(err, "NH=4") && strstr(err, "NH=8"),
          "a model.bin whose header has another head count refused, naming both: %s", err);
    free(params);
    free(ut.units);
    // -e: another model of the same shape, sealed under the same key, in the
    // place of the one checked at the start: refused, naming both file ids
    char other_path[300], ids[2][32];
    snprintf(other_path, sizeof(other_path), "%s/slices_model_2.bin", dir);
    ok = write_sealed_file(other_path, key, plain, bytes, err, sizeof(err)) == 0;
    s = shard_for(&c, 1, 0, 1, 0, 1, 0);
    unit_table(&ut, &c, &s, 1);
    o.init = other_path;
    uint64_t other_id = 0;
    ok = ok && ckpt_init_config(&o, &checked, &is_sealed, &other_id, err, sizeof(err)) == 0 && other_id != file_id;
    params = ok ? ckpt_init_load(&o, &c, file_id, &s, &ut, err, sizeof(err)) : NULL;
    snprintf(ids[0], sizeof(ids[0]), "%016llx", (unsigned long long)file_id);
    snprintf(ids[1], sizeof(ids[1]), "%016llx", (unsigned long long)other_id);
    check(ok && params == NULL && strstr(err, other_path) != NULL && strstr(err, ids[0]) != NULL &&
          strstr(err, ids[1]) != NULL, "-e: a sealed model of the same shape put in place of the one checked at the "
          "start is refused, naming the file and both ids: %s", err);
    free(params);
    params = ok ? ckpt_init_load(&o, &c, other_id, &s, &ut, err, sizeof(err)) : NULL;
    check(params != NULL, "-e: the same file, with the id read from it at the start, loads (%s)",
          params != NULL ? "ok" : err);
    free(params);
    free(ut.units);
    unlink(other_path);
    free(plain);
    unlink(path);
}

// flips the lowest bit of byte `at` of path; returns 1 when it did. Writing
// a chosen byte instead could leave the file as it was: a sealed file's
// bytes are random, and one in 256 already holds the byte written.
static int flip_bit(const char *path, uint64_t at) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint8_t byte = 0;
    int flipped = fd >= 0 && pread(fd, &byte, 1, (off_t)at) == 1 && (byte ^= 1, pwrite(fd, &byte, 1, (off_t)at) == 1);
    if (fd >= 0) close(fd);
    return flipped;
}

// flips a bit in byte 99 of the first chunk that need1 marks and need0
// does not (a chunk only the second reader decrypts); returns that chunk's
// index, or `chunks` when there is none or the file could not be changed
static uint64_t flip_in_chunk_only_second_reads(const char *path, const uint8_t *need0, const uint8_t *need1,
                                                uint64_t chunks) {
    uint64_t only1 = 0;
    while (only1 < chunks && !(need1[only1] && !need0[only1])) only1++;
    if (only1 == chunks) return chunks;
    return flip_bit(path, AEAD_FILE_HEADER_BYTES + only1 * AEAD_FILE_CHUNK_BYTES + 99) ? only1 : chunks;
}

// a sealed checkpoint written as two ranks write one (ckpt_begin, each
// rank's half of model.bin and optim.bin through CkptOut, split mid-block,
// rank 1's GHASH shares packed masked as it sends them to rank 0, which
// takes the masks off: ckpt_shares_combine; ckpt_seal), its tags made from
// the shares. What rank 1 sends is none of its shares as they are, and the
// .partial directory holds the three files only. Then what must not seal:
// a bit of ciphertext changed on disk between the writes and the seal (the
// MANIFEST, hashed from the disk, takes it in; the chunk's tag, from what
// the ranks encrypted, refuses it at read); rank 1's message missing; rank
// 1's message of another file; rank 1 writing a float short (its chunk's
// bytes not covered); a bit of rank 1's message changed on the way. Each
// refusal is one line naming the file and the rank or the chunk, and
// leaves no MANIFEST: nothing falls back to reading the file back.
static void test_seal_from_shares(void) {
    GPT2Config c = {.maxT = 64, .V = 1000, .Vp = 1024, .L = 2, .NH = 2, .C = 128};
    size_t N = param_count(&c), half = N / 2 + 1, header = HEADER_INTS * 4;
    float *plain = (float *)malloc(3 * N * sizeof(float));
    for (size_t j = 0; j < 3 * N; j++) plain[j] = (float)j * 0.25f - 7.0f;
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(5 * i + 2);
    AeadFileKey cipher;
    aead_file_key(&cipher, key);
    enum { GOOD, DAMAGED, MISSING, OTHER_FILE, SHORT, TAMPERED, CASES };
    for (int kind = 0; kind < CASES; kind++) {
        char out[300], partial[400], names[2][500], final_model[500], err[1024] = "";
        snprintf(out, sizeof(out), "%s/shares_%d", dir, kind);
        mkdir(out, 0700);
        CkptState st;
        memset(&st, 0, sizeof(st));
        st.step = 3; st.adam_t = 3; st.config = c; st.B = 1; st.T = 8; st.np = 2; st.tp = 1; st.pp = 1;
        CkptShare sh0[3], sh1[2];
        memset(sh0, 0, sizeof(sh0));
        memset(sh1, 0, sizeof(sh1));
        int ok = ckpt_begin(out, &st, &cipher, sh0, err, sizeof(err)) == 0;
        ckpt_dir_name(partial, sizeof(partial), out, st.step, ".partial");
        snprintf(names[0], sizeof(names[0]), "%s/model.bin", partial);
        snprintf(names[1], sizeof(names[1]), "%s/optim.bin", partial);
        for (int w = 0; w < 2 && ok; w++) {  // two writers, each its half of every array
            size_t lo = w == 0 ? 0 : half, hi = w == 0 ? half : N - (kind == SHORT);
            CkptShare *sh = w == 0 ? sh0 : sh1;
            CkptOut mo, oo;
            ok = ckpt_out_open(&mo, names[0], &cipher, &sh[0]) == 0 && ckpt_out_open(&oo, names[1], &cipher, &sh[1]) == 0 &&
                 ckpt_out_pwrite(&mo, plain + lo, (hi - lo) * 4, header + 4 * lo) == 0 &&
                 ckpt_out_pwrite(&oo, plain + N + lo, (hi - lo) * 4, header + 4 * lo) == 0 &&
                 ckpt_out_pwrite(&oo, plain + 2 * N + lo, (hi - lo) * 4, header + 4 * (N + lo)) == 0;
            ok = ckpt_out_close(&mo, ok) == 0 && ok;
            ok = ckpt_out_close(&oo, ok) == 0 && ok;
        }
        // rank 1's messages, as they cross the communicator, and rank 0 adding them in
        int in_clear = 0, combined = ok;
        for (int f = 0; f < 2 && ok; f++) {
            uint64_t chunks = aead_file_chunk_count(ckpt_file_bytes(f, &c), AEAD_FILE_CHUNK_BYTES);
            size_t bytes = ckpt_share_msg_bytes(chunks);
            uint8_t *msgs = (uint8_t *)calloc(2, bytes);
            if (kind != MISSING) ckpt_share_pack(&sh1[f], key, names[f], 1, chunks, msgs + bytes);
            if (kind == OTHER_FILE) msgs[bytes + 8] ^= 1;  // its file id
            if (kind == TAMPERED && f == 0) msgs[bytes + CKPT_SHARE_HEAD + 5] ^= 0x10;  // a bit of a masked share
            for (uint64_t i = 0; i < chunks && kind == GOOD; i++)
                in_clear += memcmp(msgs + bytes + CKPT_SHARE_HEAD + 16 * i, sh1[f].sums + 16 * i, 16) == 0;
            if (combined && ckpt_shares_combine(&sh0[f], msgs, 2, key, names[f], names[f], err, sizeof(err)) != 0)
                combined = 0;
            free(msgs);
        }
        DIR *d = opendir(partial);
        int entries = 0;
        for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) entries += e->d_name[0] != '.';
        if (d != NULL) closedir(d);
        if (kind == DAMAGED) ok = ok && flip_bit(names[0], AEAD_FILE_HEADER_BYTES + header + 4 * half + 1);
        int sealed_ok = ok && combined && ckpt_seal(out, st.step, key, &cipher, sh0, err, sizeof(err)) == 0;
        for (int f = 0; f < 3; f++) ckpt_share_free(&sh0[f]);
        for (int f = 0; f < 2; f++) ckpt_share_free(&sh1[f]);
        char final_dir[400];
        ckpt_dir_name(final_dir, sizeof(final_dir), out, st.step, "");
        snprintf(final_model, sizeof(final_model), "%s/model.bin", final_dir);
        uint8_t *bytes = NULL;
        uint64_t n = 0;
        CkptState got;
        char found[400], why[1024] = "";
        int verified = sealed_ok && ckpt_find(out, st.step, key, 1, &got, found, sizeof(found), why, sizeof(why)) == 1;
        int model_ok = sealed_ok && ckpt_read_file(final_model, key, 1 << 30, &bytes, &n, why, sizeof(why)) == 0 &&
                       n == header + 4 * N && memcmp(bytes + header, plain, 4 * N) == 0;
        free(bytes);
        bytes = NULL;
        snprintf(final_model, sizeof(final_model), "%s/optim.bin", final_dir);
        int optim_ok = sealed_ok && ckpt_read_file(final_model, key, 1 << 30, &bytes, &n, err, sizeof(err)) == 0 &&
                       n == header + 8 * N && memcmp(bytes + header, plain + N, 8 * N) == 0;
        free(bytes);
        int manifest = test_exists("%s/MANIFEST", partial) || test_exists("%s/MANIFEST", final_dir);
        char chunk_name[64];  // the chunk of the changed byte
        snprintf(chunk_name, sizeof(chunk_name), "chunk %llu of",
                 (unsigned long long)((header + 4 * half + 1) / AEAD_FILE_CHUNK_BYTES));
        if (kind == GOOD)
            check(sealed_ok && in_clear == 0 && entries == 3 && verified && model_ok && optim_ok,
                  "a sealed checkpoint by two ranks (split mid-block): rank 1 sends none of its GHASH shares as they "
                  "are (%d in the clear), nothing but the three files is written (%d entries), and it seals from the "
                  "shares, verifies and reads back (%s)", in_clear, entries, sealed_ok ? why : err);
        if (kind == DAMAGED)
            check(sealed_ok && verified && !model_ok && strstr(why, chunk_name) != NULL && optim_ok,
                  "a bit of model.bin's ciphertext changed between the writes and the seal: the MANIFEST, hashed "
                  "from the disk, takes it in, but the chunk's tag, from the ranks' shares, refuses it: %s",
                  sealed_ok ? why : err);
        if (kind == MISSING)
            check(!sealed_ok && !manifest && strstr(err, "model.bin: rank 1's GHASH shares did not arrive") != NULL &&
                  strchr(err, '\n') == NULL,
                  "rank 1's shares missing: not sealed, no MANIFEST, one line naming the file and the rank: %s", err);
        if (kind == OTHER_FILE)
            check(!sealed_ok && !manifest && strstr(err, "model.bin: rank 1's GHASH shares are of file id") != NULL,
                  "rank 1's shares of another file: not sealed, one line naming the file and the rank: %s", err);
        if (kind == SHORT)
            check(!sealed_ok && !manifest && strstr(err, "model.bin: chunk 2 of 3") != NULL &&
                  strstr(err, "count 48124 of its 48128 bytes (rank 1: 48124)") != NULL && strchr(err, '\n') == NULL,
                  "rank 1 writes a float short: not sealed, one line naming the file, the chunk and the ranks' "
                  "counts: %s", err);
        if (kind == TAMPERED)  // before, it sealed, and only the next resume found the chunk's tag wrong
            check(!sealed_ok && !manifest && strstr(err, "model.bin: rank 1's GHASH shares fail their tag") != NULL &&
                      strchr(err, '\n') == NULL,
                  "a bit of rank 1's masked shares changed on the way (an NCCL payload): not sealed, no MANIFEST, "
                  "one line naming the file and the rank: %s", err);
    }
    aead_file_key_wipe(&cipher);
    free(plain);
}

// The masks of rank 1's GHASH shares are fresh even when the file id is
// not. Rank 1 takes the file id from the header on disk, which whoever can
// write -o may set, between rank 0 making the file and rank 1 opening it,
// to the id of an older file of the same name (the same step written again
// after a resume). Two writes of step 3: the second one's header is put
// back to the first one's before rank 1 writes other data. XORed, rank 1's
// two messages must not be the XOR of its two share vectors (with the
// ciphertext on disk, that is an equation in H). Rank 0 still refuses the
// second message (another file id).
static void test_share_masks_fresh(void) {
    GPT2Config c = {.maxT = 64, .V = 1000, .Vp = 1024, .L = 2, .NH = 2, .C = 128};
    size_t N = param_count(&c), half = N / 2 + 1, header = HEADER_INTS * 4;
    float *plain = (float *)malloc(N * sizeof(float));
    uint8_t key[32], old_header[AEAD_FILE_HEADER_BYTES];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(3 * i + 1);
    AeadFileKey cipher;
    aead_file_key(&cipher, key);
    char out[300], partial[400], name[500], err[1024] = "";
    snprintf(out, sizeof(out), "%s/masks_fresh", dir);
    mkdir(out, 0700);
    CkptState st;
    memset(&st, 0, sizeof(st));
    st.step = 3; st.adam_t = 3; st.config = c; st.B = 1; st.T = 8; st.np = 2; st.tp = 1; st.pp = 1;
    ckpt_dir_name(partial, sizeof(partial), out, st.step, ".partial");
    snprintf(name, sizeof(name), "%s/model.bin", partial);
    uint64_t chunks = aead_file_chunk_count(ckpt_file_bytes(0, &c), AEAD_FILE_CHUNK_BYTES);
    size_t bytes = ckpt_share_msg_bytes(chunks);
    uint8_t *msgs[2] = {(uint8_t *)calloc(2, bytes), (uint8_t *)calloc(2, bytes)};
    uint8_t *sums[2] = {(uint8_t *)calloc(chunks, 16), (uint8_t *)calloc(chunks, 16)};
    int ok = 1, refused = 0;
    for (int attempt = 0; attempt < 2 && ok; attempt++) {
        CkptShare sh0[3], sh1;
        memset(sh0, 0, sizeof(sh0));
        memset(&sh1, 0, sizeof(sh1));
        ok = ckpt_begin(out, &st, &cipher, sh0, err, sizeof(err)) == 0;
        int fd = ok ? open(name, O_RDWR) : -1;
        if (attempt == 0) ok = ok && pread_all(fd, old_header, sizeof(old_header), 0) == 0;
        else ok = ok && pwrite_all(fd, old_header, sizeof(old_header), 0) == 0;  // the attacker's replay
        if (fd >= 0) close(fd);
        for (size_t j = 0; j < N; j++) plain[j] = (float)j * 0.5f + (float)attempt;
        CkptOut mo = {.fd = -1};
        ok = ok && ckpt_out_open(&mo, name, &cipher, &sh1) == 0 &&
             ckpt_out_pwrite(&mo, plain + half, (N - half) * 4, header + 4 * half) == 0;
        ok = ckpt_out_close(&mo, ok) == 0 && ok;
        if (ok) {
            memcpy(sums[attempt], sh1.sums, (size_t)chunks * 16);
            ckpt_share_pack(&sh1, key, name, 1, chunks, msgs[attempt] + bytes);
        }
        if (ok && attempt == 1)
            refused = ckpt_shares_combine(&sh0[0], msgs[1], 2, key, name, name, err, sizeof(err)) != 0 &&
                      strstr(err, "rank 1's GHASH shares are of file id") != NULL;
        for (int f = 0; f < 3; f++) ckpt_share_free(&sh0[f]);
        ckpt_share_free(&sh1);
    }
    int same_mask = 0;  // chunks whose masked difference is the shares' difference
    for (uint64_t i = 0; i < chunks && ok; i++) {
        uint8_t d_msg[16], d_sum[16];
        for (int b = 0; b < 16; b++) {
            d_msg[b] = msgs[0][bytes + CKPT_SHARE_HEAD + 16 * i + b] ^ msgs[1][bytes + CKPT_SHARE_HEAD + 16 * i + b];
            d_sum[b] = sums[0][16 * i + b] ^ sums[1][16 * i + b];
        }
        same_mask += memcmp(d_msg, d_sum, 16) == 0;
    }
    check(ok && get_u64(msgs[0] + bytes + 8) == get_u64(msgs[1] + bytes + 8) && same_mask == 0 && refused,
          "rank 1 writes step 3 twice, the second time under the first file's id (its header replayed on disk): "
          "its two messages are masked apart (%d of %llu chunks share a mask), and rank 0 refuses the second: %s",
          same_mask, (unsigned long long)chunks, err);
    for (int a = 0; a < 2; a++) {
        secure_wipe(sums[a], (size_t)chunks * 16);
        free(sums[a]);
        free(msgs[a]);
    }
    aead_file_key_wipe(&cipher);
    free(plain);
}

// Two ranks of a job as two processes (fork) joined by pipes, for
// ckpt_write_job and ckpt_write_model as the trainers run them: the
// CkptJob's sum and gather over the pipes, each wait bounded by 30 s. Each
// rank writes its half of every array; rank 1 may first put an older file's
// header back in place of the one rank 0 made (replay, relative to -o), and
// then counts the bytes of its part on disk that are not zero (leaked).
typedef struct {
    int rank, to_peer, from_peer;
    const float *plain;
    size_t N;
    const char *replay;
    const uint8_t *old_header;
    long leaked;
    double timeout;
} TwoRanks;

static void peer_read(const TwoRanks *t, void *buf, size_t n) {
    for (size_t got = 0; got < n;) {
        struct pollfd p = {t->from_peer, POLLIN, 0};
        ssize_t r = poll(&p, 1, 30000) == 1 ? read(t->from_peer, (uint8_t *)buf + got, n - got) : -1;
        if (r <= 0) {
            fprintf(stderr, "rank %d: its peer is silent or gone\n", t->rank);
            _exit(3);
        }
        got += (size_t)r;
    }
}

static float two_sum(void *ctx, float x) {
    TwoRanks *t = (TwoRanks *)ctx;
    float y = 0.0f;
    if (write_all(t->to_peer, &x, sizeof(x)) != 0) _exit(3);
    peer_read(t, &y, sizeof(y));
    return x + y;
}

static void two_gather(void *ctx, const void *mine, void *all, size_t bytes) {
    TwoRanks *t = (TwoRanks *)ctx;
    if (t->rank == 1 && write_all(t->to_peer, mine, bytes) != 0) _exit(3);
    if (t->rank == 0) peer_read(t, (uint8_t *)all + bytes, bytes);
}

static double two_set_timeout(void *ctx, double seconds) {
    TwoRanks *t = (TwoRanks *)ctx;
    double was = t->timeout;
    if (seconds > 0) t->timeout = seconds;
    return was;
}

static int two_part(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                    CkptShare *shares) {
    TwoRanks *t = (TwoRanks *)ctx;
    size_t half = t->N / 2 + 1, lo = t->rank == 0 ? 0 : half, hi = t->rank == 0 ? half : t->N;
    size_t header = HEADER_INTS * 4, n = (hi - lo) * 4;
    if (t->rank == 1 && t->replay != NULL) {  // whoever can write -o, between rank 0's begin and rank 1's open
        int fd = openat(dfd, t->replay, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || pwrite_all(fd, t->old_header, AEAD_FILE_HEADER_BYTES, 0) != 0) _exit(4);
        close(fd);
    }
    CkptOut mo, oo;
    memset(&oo, 0, sizeof(oo));
    oo.fd = -1;
    int e = ckpt_out_open_at(&mo, dfd, model_name, cipher, &shares[0]);
    if (e == 0 && optim_name != NULL) e = ckpt_out_open_at(&oo, dfd, optim_name, cipher, &shares[1]);
    if (e == 0 && ckpt_out_pwrite(&mo, t->plain + lo, n, header + 4 * lo) != 0) e = errno;
    if (e == 0 && optim_name != NULL &&
        (ckpt_out_pwrite(&oo, t->plain + t->N + lo, n, header + 4 * lo) != 0 ||
         ckpt_out_pwrite(&oo, t->plain + 2 * t->N + lo, n, header + 4 * (t->N + lo)) != 0))
        e = errno;
    int c1 = ckpt_out_close(&mo, e == 0), c2 = ckpt_out_close(&oo, e == 0);
    if (e == 0) e = c1 != 0 ? c1 : c2;
    if (t->rank == 1 && t->replay != NULL) {
        uint8_t *back = (uint8_t *)malloc(n);
        int fd = openat(dfd, t->replay, O_RDONLY | O_CLOEXEC);
        if (back == NULL || fd < 0 || pread_all(fd, back, n, AEAD_FILE_HEADER_BYTES + header + 4 * lo) != 0) _exit(4);
        close(fd);
        for (size_t i = 0; i < n; i++) t->leaked += back[i] != 0;
        free(back);
    }
    return e;
}

// one write by the two ranks (a checkpoint of st, or with model the final
// model of step st->step) into out (dfd); rc[r] is rank r's verdict,
// *leaked rank 1's count, rank 1's stderr into out/rank1.err
static void two_ranks_write(int model, int dfd, const char *out, const CkptState *st, const uint8_t key[32],
                            const float *plain, const char *replay, const uint8_t *old_header, int rc[2],
                            long *leaked) {
    int a[2], b[2], res[2];
    rc[0] = rc[1] = -2;
    *leaked = -1;
    if (pipe(a) != 0 || pipe(b) != 0 || pipe(res) != 0) return;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return;
    TwoRanks t = {pid == 0, pid == 0 ? b[1] : a[1], pid == 0 ? a[0] : b[0], plain, param_count(&st->config),
                  pid == 0 ? replay : NULL, old_header, 0, 10.0};
    if (pid == 0) {
        char path[400];
        snprintf(path, sizeof(path), "%s/rank1.err", out);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0) _exit(5);
    }
    CkptJob job = {two_sum, two_part, two_gather, two_set_timeout, &t, t.rank, 2, 1};
    char path[500], err[1200] = "";
    int r = model ? ckpt_write_model(&job, dfd, out, st->step, &st->config, key, path, sizeof(path), err, sizeof(err))
                  : ckpt_write_job(&job, dfd, out, 2, st, key);
    if (model && err[0] != '\0') fprintf(stderr, "%s\n", err);
    if (pid == 0) {
        long got[2] = {r, t.leaked};
        _exit(write_all(res[1], got, sizeof(got)) == 0 ? 0 : 6);
    }
    long got[2] = {-2, -1};
    TwoRanks from = {0, -1, res[0], NULL, 0, NULL, NULL, 0, 0};
    close(res[1]);
    peer_read(&from, got, sizeof(got));
    int status = 0;
    waitpid(pid, &status, 0);
    rc[0] = r;
    rc[1] = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? (int)got[0] : -3;
    *leaked = got[1];
    close(a[0]), close(a[1]), close(b[0]), close(b[1]), close(res[0]);
}

// Every rank encrypts under the file id rank 0 made, sent over the job's
// channel, never under the id it reads from the header in -o: whoever can
// write -o may put an older file's header there (the same step written
// again after a resume), and a rank that took its id would encrypt under
// the older file's keystream, so the two ciphertexts give the XOR of the
// plaintexts. Step 3 written twice by two ranks, the second time with the
// first one's header put back between rank 0 making the file and rank 1
// opening it: rank 1 refuses in one line naming the file and both ids, and
// not a byte of its part reaches the file; the first write stays. For a
// checkpoint (optim.bin replayed) and for the final model (-enc 2).
static void test_ids_from_rank0(void) {
    GPT2Config c = {.maxT = 64, .V = 1000, .Vp = 1024, .L = 2, .NH = 2, .C = 128};
    size_t N = param_count(&c);
    float *plain = (float *)malloc(3 * N * sizeof(float));
    for (size_t j = 0; j < 3 * N; j++) plain[j] = (float)j * 0.125f + 1.0f;
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(7 * i + 3);
    CkptState st;
    memset(&st, 0, sizeof(st));
    st.step = 3; st.adam_t = 3; st.config = c; st.B = 1; st.T = 8; st.np = 2; st.tp = 1; st.pp = 1;
    for (int model = 0; model < 2; model++) {
        char out[300], err[1024] = "", older[400], line[2048] = "";
        snprintf(out, sizeof(out), "%s/ids_%d", dir, model);
        mkdir(out, 0700);
        int dfd = ckpt_dir_open(out, err, sizeof(err));
        const char *replay = model ? "model_00000003.bin.tmp" : "ckpt_00000003.partial/optim.bin";
        snprintf(older, sizeof(older), "%s/%s", out, model ? "model_00000003.bin" : "ckpt_00000003/optim.bin");
        int rc1[2], rc2[2] = {-9, -9};
        long leaked1, leaked2 = -1;
        uint8_t old_header[AEAD_FILE_HEADER_BYTES];
        two_ranks_write(model, dfd, out, &st, key, plain, NULL, NULL, rc1, &leaked1);
        int fd = open(older, O_RDONLY | O_CLOEXEC);
        int ok = fd >= 0 && pread_all(fd, old_header, sizeof(old_header), 0) == 0;
        if (fd >= 0) close(fd);
        if (ok) two_ranks_write(model, dfd, out, &st, key, plain, replay, old_header, rc2, &leaked2);
        char path[400], want[64];
        snprintf(path, sizeof(path), "%s/rank1.err", out);
        FILE *f = fopen(path, "r");
        size_t n = f != NULL ? fread(line, 1, sizeof(line) - 1, f) : 0;
        line[n] = '\0';
        if (f != NULL) fclose(f);
        snprintf(want, sizeof(want), "file_id = %016llx, but rank 0 made the file with id",
                 (unsigned long long)get_u64(old_header + 24));
        uint8_t *bytes = NULL;
        uint64_t got = 0;
        int older_ok = ckpt_read_file(older, key, 1 << 30, &bytes, &got, err, sizeof(err)) == 0 &&
                       got == HEADER_INTS * 4 + (model ? 4 : 8) * N &&
                       memcmp(bytes + HEADER_INTS * 4, plain + (model ? 0 : N), (model ? 4 : 8) * N) == 0;
        free(bytes);
        int left = test_exists("%s/%s", out, model ? "model_00000003.bin.tmp" : "ckpt_00000003.partial");
        check(ok && rc1[0] == 0 && rc1[1] == 0 && rc2[0] != 0 && rc2[1] != 0 && leaked2 == 0 && older_ok && !left &&
                  strstr(line, replay) != NULL && strstr(line, want) != NULL && n > 0 && strchr(line, '\n') == line + n - 1,
              "%s: step 3 written again by two ranks with the first one's header put back before rank 1 opens "
              "it: rank 1 encrypts nothing under the older id (%ld bytes of its part written), refuses in one "
              "line, the first write stays (verdicts %d %d, then %d %d): %s",
              model ? "the final model" : "a checkpoint", leaked2, rc1[0], rc1[1], ok ? rc2[0] : -9,
              ok ? rc2[1] : -9, line);
        if (dfd >= 0) close(dfd);
    }
    free(plain);
}

// a sealed optim.bin of 27 chunks, opened by ranks of several layouts: each
// gets m and v of its units as unit_fill gives them from the plain array,
// over its slice (all of a unit, or its 1/dp with ZeRO >= 1), having
// decrypted only the chunks that hold them (a layer's tensor here is about
// a chunk, so ranks of pp 2 or of ZeRO's dp 2 read fewer chunks than all;
// tp's parts of a layer's tensor are spread across it, so tp alone does
// not); a chunk a rank does not read may be damaged unseen by it, and the
// rank that reads it refuses it, naming the chunk
static void test_optim_slices(void) {
    GPT2Config c = {.maxT = 64, .V = 1000, .Vp = 1024, .L = 4, .NH = 4, .C = 256};
    size_t N = param_count(&c), bytes = (size_t)ckpt_file_bytes(1, &c);
    uint8_t *plain = (uint8_t *)malloc(bytes), key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(3 * i + 1);
    ckpt_optim_header((int32_t *)plain, &c, 5);
    float *mv = (float *)(plain + HEADER_INTS * 4);
    for (size_t j = 0; j < 2 * N; j++) mv[j] = j < N ? (float)j : -(float)(j - N);
    char path[300], err[1024];
    snprintf(path, sizeof(path), "%s/slices_optim.bin", dir);
    int ok = write_sealed_file(path, key, plain, bytes, err, sizeof(err)) == 0;
    if (!check(ok, "a sealed optim.bin of %zu bytes (%s)", bytes, ok ? "ok" : err)) { free(plain); return; }
    struct { int dp, tp, pp, zero; } layouts[] = {{1, 1, 1, 0}, {2, 1, 1, 1}, {1, 2, 1, 0}, {1, 1, 2, 0}, {2, 2, 2, 1}};
    for (int k = 0; k < 5; k++) {
        int dp = layouts[k].dp, tp = layouts[k].tp, pp = layouts[k].pp, world = dp * tp * pp, sharded = layouts[k].zero;
        int same = 1, fewer = 1;
        uint64_t most = 0, chunks = 0;
        for (int rank = 0; rank < world && same; rank++) {
            Shard s = shard_for(&c, tp, rank % tp, pp, rank / tp % pp, dp, rank / (tp * pp));
            UnitTable ut;
            OptimFile f;
            same = unit_table(&ut, &c, &s, 1) == 0 &&
                   ckpt_optim_open(&f, path, key, &c, &s, &ut, sharded, 5, err, sizeof(err)) == 0;
            float *got = (float *)malloc(unit_table_largest(&ut) * sizeof(float));
            float *want = (float *)malloc(unit_table_largest(&ut) * sizeof(float));
            for (int u = 0; same && u < ut.n; u++) {
                const Unit *un = &ut.units[u];
                size_t chunk = un->padded / dp, lo = sharded ? s.dp_rank * chunk : 0, hi = sharded ? lo + chunk : un->size;
                hi = hi < un->size ? hi : un->size;
                for (int half = 0; half < 2 && same && lo < hi; half++) {
                    unit_fill(&c, &s, un, got, half == 0 ? f.m : f.v, 0);
                    unit_fill(&c, &s, un, want, mv + half * N, 0);
                    same = memcmp(got + lo, want + lo, (hi - lo) * sizeof(float)) == 0;
                }
            }
            if (same) {
                most = f.chunks_read > most ? f.chunks_read : most;
                chunks = f.chunks;
                fewer = fewer && (f.chunks_read < f.chunks || (pp == 1 && !sharded));
                ckpt_optim_close(&f);
            }
            free(got);
            free(want);
            free(ut.units);
        }
        check(same && fewer, "dp %d tp %d pp %d ZeRO-%d: each rank's m and v from the sealed optim.bin, as from the plain "
              "array, decrypting at most %llu of its %llu chunks %s", dp, tp, pp, sharded, (unsigned long long)most,
              (unsigned long long)chunks, same ? "" : err);
    }
    // pp 2: a chunk that stage 1 reads and stage 0 does not, damaged
    Shard s0 = shard_for(&c, 1, 0, 2, 0, 1, 0), s1 = shard_for(&c, 1, 0, 2, 1, 1, 0);
    UnitTable ut0, ut1;
    AeadFile af = {.plain_bytes = bytes, .chunk_bytes = AEAD_FILE_CHUNK_BYTES};
    af.chunks = aead_file_chunk_count(bytes, AEAD_FILE_CHUNK_BYTES);
    uint8_t *need0 = (uint8_t *)calloc((size_t)af.chunks, 1), *need1 = (uint8_t *)calloc((size_t)af.chunks, 1);
    unit_table(&ut0, &c, &s0, 1);
    unit_table(&ut1, &c, &s1, 1);
    ckpt_mark_chunks(&af, 2, &c, &s0, &ut0, 0, need0);
    ckpt_mark_chunks(&af, 2, &c, &s1, &ut1, 0, need1);
    uint64_t only1 = flip_in_chunk_only_second_reads(path, need0, need1, af.chunks);
    int flipped = only1 < af.chunks;
    OptimFile f;
    int opened = ckpt_optim_open(&f, path, key, &c, &s0, &ut0, 0, 5, err, sizeof(err)) == 0;
    if (opened) ckpt_optim_close(&f);
    check(flipped && opened, "pp 2 stage 0: a byte changed in chunk %llu, which it does not read, goes unseen (%s)",
          (unsigned long long)only1, opened ? "ok" : err);
    opened = ckpt_optim_open(&f, path, key, &c, &s1, &ut1, 0, 5, err, sizeof(err)) == 0;
    if (opened) ckpt_optim_close(&f);
    char chunk_name[64];
    snprintf(chunk_name, sizeof(chunk_name), "chunk %llu ", (unsigned long long)only1);
    check(!opened && strstr(err, path) != NULL && strstr(err, chunk_name) != NULL && strstr(err, "tag does not match"),
          "pp 2 stage 1, which reads it: refused, naming the file and the chunk: %s", err);
    free(need0);
    free(need1);
    free(ut0.units);
    free(ut1.units);
    free(plain);
    unlink(path);
}

// -e of -enc 2's sealed final model: with its job's key (--key-file, or the
// job.key of -o) the losses of -e of the same model written plain; with no
// key or another key, refused in one line naming the file, exit 2
static void test_encrypted_init(void) {
    static Run plain, full, r, ref;
    char p[200], a[200], b[200], model[300], args[1200], err[1024];
    snprintf(p, sizeof(p), "%s/init_plain", dir);
    snprintf(a, sizeof(a), "%s/init_sealed", dir);
    run(&plain, p, 4, "");
    run(&full, a, 4, "-enc 2");
    snprintf(model, sizeof(model), "%s/model_00000004.bin", a);
    if (!check(plain.status == 0 && full.status == 0 && sealed("%s/model_%08d.bin", a, 4) &&
               !sealed("%s/model_%08d.bin", p, 4), "a plain and a sealed final model of the same 4 steps (exit %d, %d)",
               plain.status, full.status))
        return;
    uint8_t key[32];
    char pp[300];
    snprintf(pp, sizeof(pp), "%s/model_00000004.bin", p);
    int same = read_key(a, key) == 0 && same_plaintext(model, pp, key, err, sizeof(err));
    check(same, "-enc 2's final model decrypts to the plain run's, byte for byte");

    // check_model opens -e once to learn both whether it is sealed and, if so,
    // its shape; a plain file is left to options_model_file, no key asked for
    GPT2Config c;
    char key_path[300];
    snprintf(key_path, sizeof(key_path), "%s/job.key", a);
    int is_sealed = -1;
    Options o = init_options(pp, NULL);
    uint64_t file_id = 0;
    int rc = ckpt_init_config(&o, &c, &is_sealed, &file_id, err, sizeof(err));
    check(rc == 0 && is_sealed == 0, "ckpt_init_config of the plain model, no key given: not sealed (%d, %d)", rc, is_sealed);
    o = init_options(model, key_path);
    rc = ckpt_init_config(&o, &c, &is_sealed, &file_id, err, sizeof(err));
    check(rc == 0 && is_sealed == 1 && c.L == 2 && c.V == 256 && c.maxT == 32,
          "ckpt_init_config of the sealed model with its key: sealed, L=2 V=256 maxT=32 (%d, %d) %s", rc, is_sealed,
          rc != 0 ? err : "");

    snprintf(b, sizeof(b), "%s/init_from_plain", dir);
    snprintf(args, sizeof(args), "-e %s", pp);
    run(&ref, b, 4, args);
    check(ref.status == 0 && ref.nsteps == 4, "-e of the plain final model: 4 steps (exit %d)", ref.status);
    snprintf(b, sizeof(b), "%s/init_key_file", dir);
    snprintf(args, sizeof(args), "-e %s --key-file %s/job.key", model, a);
    run(&r, b, 4, args);
    check(r.status == 0 && same_steps(&ref, &r, 0, 4),
          "-e of the sealed final model with --key-file: the losses and norms of -e of the plain one (exit %d) %s",
          r.status, r.status != 0 ? r.out : "");
    snprintf(b, sizeof(b), "%s/init_job_key", dir);
    sh("rm -rf %s && mkdir -p %s && cp %s/job.key %s/", b, b, a, b);
    snprintf(args, sizeof(args), "-e %s", model);
    run(&r, b, 4, args);
    check(r.status == 0 && same_steps(&ref, &r, 0, 4),
          "-e of the sealed final model with -o holding the job.key that sealed it: the same losses (exit %d) %s",
          r.status, r.status != 0 ? r.out : "");

    // with two stages, each rank decrypting only the chunks of its layers
    static Run ref_pp, r_pp;
    snprintf(b, sizeof(b), "%s/init_plain_pp", dir);
    snprintf(args, sizeof(args), "-e %s -np 2 -pp 2", pp);
    run(&ref_pp, b, 4, args);
    snprintf(b, sizeof(b), "%s/init_sealed_pp", dir);
    snprintf(args, sizeof(args), "-e %s --key-file %s -np 2 -pp 2", model, key_path);
    run(&r_pp, b, 4, args);
    check(ref_pp.status == 0 && r_pp.status == 0 && same_steps(&ref_pp, &r_pp, 0, 4),
          "-e of the sealed final model, pp 2: the losses and norms of -e of the plain one (exit %d, %d) %s",
          ref_pp.status, r_pp.status, r_pp.status != 0 ? r_pp.out : "");

    // export_hf with the job's key: the files that exporting the plain model gives
    char hf_plain[300], hf_sealed[300], cmd[2000];
    snprintf(hf_plain, sizeof(hf_plain), "%s/init_hf_plain", dir);
    snprintf(hf_sealed, sizeof(hf_sealed), "%s/init_hf_sealed", dir);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s > /dev/null && ./export_hf -i %s --key-file %s -o %s > /dev/null",
             pp, hf_plain, model, key_path, hf_sealed);
    int exported = system(cmd) == 0;
    check(exported && files_equal(hf_plain, hf_sealed, "model.safetensors") &&
          files_equal(hf_plain, hf_sealed, "config.json"),
          "export_hf --key-file of the trainer's sealed final model: the plain one's model.safetensors and config.json");

    struct { const char *what, *setup, *flags; } cases[] = {
        {"no key", "rm -rf %1$s", ""},
        {"another key", "rm -rf %1$s && mkdir -p %1$s && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > "
         "%1$s/other.key && echo >> %1$s/other.key && chmod 600 %1$s/other.key", "--key-file %s/other.key"},
    };
    for (int i = 0; i < 2; i++) {
        snprintf(b, sizeof(b), "%s/init_refused_%d", dir, i);
        sh(cases[i].setup, b);
        char flags[400];
        snprintf(flags, sizeof(flags), cases[i].flags, b);
        snprintf(args, sizeof(args), "-e %s %s", model, flags);
        run(&r, b, 4, args);
        int lines = test_count(r.out, "\n");
        check(r.status == 2 && lines == 1 && strstr(r.out, model) != NULL,
              "-e of the sealed final model, %s: refused in one line naming the file (exit %d, %d lines): %s",
              cases[i].what, r.status, lines, r.out);
    }
}

// -e of a sealed final model with one byte changed in a chunk that only
// the second of two stages reads (d4: its 13 chunks hold layers apart):
// under -np 2 -pp 2 the job is refused, exit 2, in one line naming the
// file and the chunk (the test gives up after 30 s; -to 5 bounds a rank
// left waiting, and the message gives the time it took)
static void test_init_damaged_chunk(void) {
    static Run made, r;
    char a[200], b[200], model[300], args[1200], err[1024];
    snprintf(a, sizeof(a), "%s/init_damaged", dir);
    run(&made, a, 1, "-e d4 -enc 2");
    snprintf(model, sizeof(model), "%s/model_00000001.bin", a);
    char key_path[300];
    snprintf(key_path, sizeof(key_path), "%s/job.key", a);
    Options o = init_options(model, key_path);
    GPT2Config c;
    int is_sealed = 0;
    uint64_t file_id = 0;
    int rc = ckpt_init_config(&o, &c, &is_sealed, &file_id, err, sizeof(err));
    if (!check(made.status == 0 && rc == 0 && is_sealed, "a sealed d4 final model (exit %d) %s", made.status,
               rc != 0 ? err : ""))
        return;
    // the chunks each stage reads, as ckpt_init_load marks them
    AeadFile af = {.plain_bytes = ckpt_file_bytes(0, &c), .chunk_bytes = AEAD_FILE_CHUNK_BYTES};
    af.chunks = aead_file_chunk_count(af.plain_bytes, AEAD_FILE_CHUNK_BYTES);
    uint8_t *need[2];
    for (int stage = 0; stage < 2; stage++) {
        Shard s = shard_for(&c, 1, 0, 2, stage, 1, 0);
        UnitTable ut;
        need[stage] = (uint8_t *)calloc((size_t)af.chunks, 1);
        if (unit_table(&ut, &c, &s, 1) == 0) ckpt_mark_chunks(&af, 1, &c, &s, &ut, 0, need[stage]);
        free(ut.units);
    }
    uint64_t only1 = flip_in_chunk_only_second_reads(model, need[0], need[1], af.chunks);
    int flipped = only1 < af.chunks;
    free(need[0]);
    free(need[1]);
    if (!check(flipped, "a byte changed in chunk %llu of %llu, which stage 1 reads and stage 0 does not",
               (unsigned long long)only1, (unsigned long long)af.chunks))
        return;
    snprintf(b, sizeof(b), "%s/init_damaged_pp", dir);
    snprintf(args, sizeof(args), "-o %s -x 4 -e %s --key-file %s -np 2 -pp 2 -to 5", b, model, key_path);
    double t0 = test_now();
    int status = test_wait(start(args, 0), 30, NULL), ended = status != -1;
    collect(&r, status, b);
    // the trainer's error lines (the launcher's and rank 0's notes of rank 1's exit follow)
    int lines = test_count(r.out, "train_gpt2:");
    char chunk_name[64];
    snprintf(chunk_name, sizeof(chunk_name), "chunk %llu", (unsigned long long)only1);
    const char *line = test_line_of(r.out, "train_gpt2:");
    check(ended && r.status == 2 && lines == 1 && strstr(line, model) != NULL && strstr(line, chunk_name) != NULL,
          "-e of a sealed model with chunk %llu damaged, -np 2 -pp 2: refused in one line naming the file and the "
          "chunk, exit %d after %.1f s: %s", (unsigned long long)only1, r.status, test_now() - t0, ended ? line : r.out);
}

// -e of a sealed final model replaced, between two ranks' start-up checks,
// by another of the same shape: sealed under the same key, or plain.
// mpirun's ranks, joined by --rendezvous: rank 0 checks the file, then
// waits at the rendezvous (its socket appears); the file is swapped; rank 1
// starts and checks the other. Once connected the ranks compare what their
// checks read: rank 1 refuses in one line naming the file and both, and
// both exit 2, neither left waiting (the test gives each 30 s). Without the
// comparison a plain file would leave rank 0 waiting at a collective rank 1
// never joins.
static void test_init_swapped_between_ranks(int other_sealed) {
    static Run first, second;
    char a[200], b[200], model[300], other[300], key_path[300], args[400], err[1024];
    // each call its own pair: the swap below moves b's model onto a's
    snprintf(a, sizeof(a), "%s/init_swap%d_a", dir, other_sealed);
    snprintf(b, sizeof(b), "%s/init_swap%d_b", dir, other_sealed);
    snprintf(key_path, sizeof(key_path), "%s/job.key", a);
    run(&first, a, 1, "-e d4 -enc 2");
    snprintf(args, sizeof(args), other_sealed ? "-e d4 -enc 2 --key-file %s" : "-e d4", key_path);
    run(&second, b, 1, args);
    snprintf(model, sizeof(model), "%s/model_00000001.bin", a);
    snprintf(other, sizeof(other), "%s/model_00000001.bin", b);
    GPT2Config c;
    int is_sealed = 0;
    uint64_t id[2] = {0, 0};
    Options o = init_options(model, key_path);
    int rc = ckpt_init_config(&o, &c, &is_sealed, &id[0], err, sizeof(err));
    o = init_options(other, key_path);
    if (rc == 0) rc = ckpt_init_config(&o, &c, &is_sealed, &id[1], err, sizeof(err));
    if (!check(first.status == 0 && second.status == 0 && rc == 0 && id[0] != id[1] && is_sealed == other_sealed,
               "two d4 final models, sealed and %s, file ids %016llx and %016llx (exit %d, %d) %s",
               other_sealed ? "sealed under the same key" : "plain", (unsigned long long)id[0],
               (unsigned long long)id[1], first.status, second.status, rc != 0 ? err : ""))
        return;
    char cmd[5000], rank_cmd[2][2000];
    for (int r = 0; r < 2; r++)
        snprintf(rank_cmd[r], sizeof(rank_cmd[r]), "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=%d "
                 "OMPI_COMM_WORLD_LOCAL_RANK=%d timeout 30 ./train_gpt2 %s -i '%s' -x 2 -e %s --key-file %s "
                 "--rendezvous unix:%s/swap%d.sock -to 5 > %s/swap_rank%d.txt 2>&1", r, r, MODEL, shards, model,
                 key_path, dir, other_sealed, dir, r);
    snprintf(cmd, sizeof(cmd), "%s & i=0; while [ ! -S %s/swap%d.sock ] && [ $i -lt 3000 ]; do sleep 0.01; "
             "i=$((i + 1)); done; mv %s %s; %s; r1=$?; wait $!; echo $? $r1 > %s/swap_status",
             rank_cmd[0], dir, other_sealed, other, model, rank_cmd[1], dir);
    int sys = system(cmd);
    char path[300], *out[2], *status;
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof(path), "%s/swap_rank%d.txt", dir, r);
        out[r] = test_read_file(path, NULL);
    }
    snprintf(path, sizeof(path), "%s/swap_status", dir);
    status = test_read_file(path, NULL);
    char read[2][64], want[1200];
    for (int r = 0; r < 2; r++) snprintf(read[r], sizeof(read[r]), "file id %016llx", (unsigned long long)id[r]);
    if (!other_sealed) snprintf(read[1], sizeof(read[1]), "a plain model file");
    snprintf(want, sizeof(want), "train_gpt2: rank 1 starts from %s, %s, but rank 0 from %s, %s: a file changed "
             "between the ranks' start-up checks", model, read[1], model, read[0]);
    int lines = test_count(out[0], "train_gpt2:") + test_count(out[1], "train_gpt2:");  // the trainer's error lines
    check(sys == 0 && status != NULL && strcmp(status, "2 2\n") == 0 && out[1] != NULL && strstr(out[1], want) != NULL &&
          lines == 1, "-e swapped for another %s model between rank 0's start-up check and rank 1's: the ranks "
          "compare what they read once connected, rank 1 refuses in one line naming the file and both, and both "
          "exit 2 (exits: %s): %s", other_sealed ? "sealed" : "plain", status != NULL ? status : "none",
          out[1] != NULL ? out[1] : "(no output)");
    free(out[0]);
    free(out[1]);
    free(status);
}

// swaps chunks i and j (1 MiB each, with their tags) of a sealed file of a
// checkpoint of step 4 in out_dir
static void swap_chunks(const char *out_dir, const char *name, int i, int j) {
    char path[300];
    snprintf(path, sizeof(path), "%s/ckpt_00000004/%s", out_dir, name);
    FILE *f = fopen(path, "r+b");
    uint8_t h[64];
    if (f == NULL || fread(h, 1, 64, f) != 64) { if (f) fclose(f); return; }
    uint64_t plain = get_u64(h + 16), chunk = AEAD_FILE_CHUNK_BYTES;
    uint64_t at[2][2] = {{64 + i * chunk, 64 + plain + 16 * (uint64_t)i}, {64 + j * chunk, 64 + plain + 16 * (uint64_t)j}};
    uint64_t len[2] = {chunk, 16};
    for (int part = 0; part < 2; part++) {
        uint8_t *x = (uint8_t *)malloc(len[part]), *y = (uint8_t *)malloc(len[part]);
        fseek(f, (long)at[0][part], SEEK_SET);
        size_t got = fread(x, 1, len[part], f);
        fseek(f, (long)at[1][part], SEEK_SET);
        got += fread(y, 1, len[part], f);
        fseek(f, (long)at[0][part], SEEK_SET);
        fwrite(y, 1, len[part], f);
        fseek(f, (long)at[1][part], SEEK_SET);
        fwrite(x, 1, len[part], f);
        if (got != 2 * len[part]) printf("note: %s: short read swapping chunks\n", path);
        free(x);
        free(y);
    }
    fclose(f);
}

// a sealed checkpoint damaged, or read without its key: one line, exit 2;
// and beneath the MANIFEST, the cipher itself refuses a changed byte, two
// chunks swapped and a file cut short, naming the file and chunk
static void test_encrypted_refusals(void) {
    static Run good, r;
    char a[200], b[200];
    snprintf(a, sizeof(a), "%s/enc_refuse_src", dir);
    run(&good, a, 4, "-n 4 -enc 1");
    if (!check(good.status == 0 && sealed("%s/ckpt_%08d/optim.bin", a, 4), "a sealed checkpoint of step 4 to damage"))
        return;
    // optim.bin of d2: 1024 + 8 N bytes (N = 497,408 here: over 3 chunks of 1 MiB)
    // how each case damages the copy: a shell command (damage, %s its
    // directory), or flipping a bit of optim.bin's byte 5000, or swapping
    // its chunks 0 and 1
    enum { SHELL, FLIP_BIT, SWAP_CHUNKS };
    struct { const char *what; int how; const char *damage, *expect; } cases[] = {
        {"a changed byte", FLIP_BIT, NULL, "optim.bin: sha256"},
        {"chunks 0 and 1 swapped", SWAP_CHUNKS, NULL, "optim.bin: sha256"},
        {"a file cut short", SHELL, "truncate -s -16 %s/ckpt_00000004/optim.bin", "optim.bin: size"},
        {"no key: job.key gone", SHELL, "rm %s/job.key", "job.key is missing, but"},
        {"another key", SHELL, "rm %1$s/job.key && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > %1$s/job.key && "
         "echo >> %1$s/job.key && chmod 600 %1$s/job.key", "another key"},
    };
    for (int i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); i++) {
        snprintf(b, sizeof(b), "%s/enc_refuse_%d", dir, i);
        sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000004 %s/job.key %s/", b, b, a, a, b);
        char damaged[300];
        snprintf(damaged, sizeof(damaged), "%s/ckpt_00000004/optim.bin", b);
        if (cases[i].how == SHELL) sh(cases[i].damage, b);
        else if (cases[i].how == FLIP_BIT)
            check(flip_bit(damaged, 5000), "sealed checkpoint: a bit of optim.bin's byte 5000 flipped");
        else swap_chunks(b, "optim.bin", 0, 1);
        run(&r, b, 8, "-y 1");
        int lines = test_count(r.out, "\n");
        check(r.status == 2 && lines == 1 && strstr(r.out, cases[i].expect) != NULL,
              "sealed checkpoint, %s: refused (exit %d, %d line): %s", cases[i].what, r.status, lines,
              test_line_of(r.out, "train_gpt2"));
        if (i > 2) continue;
        // the same damage read past the MANIFEST: the tags refuse it
        uint8_t key[32], *bytes = NULL;
        uint64_t n = 0;
        char path[300], err[1024] = "";
        snprintf(path, sizeof(path), "%s/ckpt_00000004/optim.bin", b);
        int refused = read_key(b, key) == 0 && ckpt_read_file(path, key, 1 << 30, &bytes, &n, err, sizeof(err)) != 0;
        free(bytes);
        check(refused && strstr(err, path) != NULL && (strstr(err, "chunk") != NULL || strstr(err, "truncated") != NULL),
              "sealed checkpoint, %s: the cipher refuses it too, naming file and chunk: %s", cases[i].what, err);
    }
}

// a changed byte in any one file of a checkpoint, plain or sealed (-enc 1),
// is refused by the MANIFEST with one line naming that file and its digest,
// as the top of checkpoint.h promises. The bytes are ones that only the
// MANIFEST vouches for: a weight in model.bin, a moment in optim.bin, and a
// reserved word of state.bin's header (byte 1000: no field reads it, so a
// MANIFEST check that skipped state.bin would let the run resume as if
// nothing had happened). Sealed, the same plaintext byte's ciphertext is
// changed, and there a second lock holds too: read past the MANIFEST
// (ckpt_read_file), each file's chunk tag refuses it, naming the chunk.
// That second lock is why a sealed state.bin stays refused even when the
// MANIFEST skips it; the check on the line ("<file>: sha256") tells the two
// apart.
static void test_changed_byte_every_file(void) {
    static Run src, r;
    for (int enc = 0; enc < 2; enc++) {
        const char *kind = enc ? "sealed" : "plain";
        char a[200], b[200];
        snprintf(a, sizeof(a), "%s/changed_src_%d", dir, enc);
        run(&src, a, 4, enc ? "-n 4 -enc 1" : "-n 4");
        if (!check(src.status == 0 && test_exists("%s/ckpt_%08d/MANIFEST", a, 4) &&
                       sealed("%s/ckpt_%08d/state.bin", a, 4) == enc,
                   "a %s checkpoint of step 4 to change a byte of (exit %d)", kind, src.status))
            continue;
        for (int f = 0; f < 3; f++) {
            snprintf(b, sizeof(b), "%s/changed_%d_%d", dir, enc, f);
            sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000004 %s/job.key %s/", b, b, a, a, b);
            char path[300], expect[64];
            snprintf(path, sizeof(path), "%s/ckpt_00000004/%s", b, ckpt_files[f]);
            uint64_t plain_at = f == 2 ? 1000 : 5000, at = plain_at + (enc ? AEAD_FILE_HEADER_BYTES : 0);
            int flipped = flip_bit(path, at);
            run(&r, b, 8, "-y 1");
            snprintf(expect, sizeof(expect), "%s: sha256", ckpt_files[f]);
            int lines = test_count(r.out, "\n");
            check(flipped && r.status == 2 && lines == 1 && strstr(r.out, expect) != NULL,
                  "%s checkpoint, a bit of %s's byte %llu flipped: the MANIFEST refuses it (exit %d, %d line): %s",
                  kind, ckpt_files[f], (unsigned long long)at, r.status, lines, test_line_of(r.out, "train_gpt2"));
            if (!enc) continue;
            uint8_t key[32], *bytes = NULL;
            uint64_t n = 0;
            char err[1024] = "";
            int refused = read_key(b, key) == 0 && ckpt_read_file(path, key, 1 << 30, &bytes, &n, err, sizeof(err)) != 0;
            free(bytes);
            check(refused && strstr(err, path) != NULL && strstr(err, "chunk 0 of") != NULL,
                  "sealed checkpoint, %s changed: its chunk tag refuses it too, past the MANIFEST: %s", ckpt_files[f],
                  err);
        }
    }
}

// writes tokens[0..n) as a shard at path (test_run.h's format)
static void write_tokens(const char *path, const uint16_t *tokens, size_t n) {
    uint8_t *data = (uint8_t *)calloc(1, 1024 + 2 * n);
    int32_t h[3] = {20240520, 1, (int32_t)n};
    memcpy(data, h, sizeof(h));
    memcpy(data + 1024, tokens, 2 * n);
    test_write_file(path, data, 1024 + 2 * n);
    free(data);
}

// the data position a checkpoint saves, where every word of it matters: the
// run shuffles (-sh 1) three shards of 7, 10 and 4 micro-batches (21 an
// epoch; each step takes 4), so its checkpoints of steps 3, 6, 9 and 12
// stand mid-shard in epochs 0, 1, 1 and 2: past step 3 the epoch and the
// rng (the epoch's permutation key) differ from a fresh start's too. Each
// checkpoint's four words are the position a DataLoader reaches after as
// many micro-batches; a run resumed from each prints the uninterrupted
// run's losses and norms, bit for bit, and writes the same checkpoint of
// step 15: model.bin, optim.bin and state.bin (whose epoch a resume that
// lost it would get wrong, though the batches come out the same). And the
// position does not depend on the ranks: resumed on 2 ranks from step 9,
// the losses are the one-rank run's (to rounding: the sum over
// micro-batches is grouped otherwise) and step 15's position is its.
// (test_dataloader resumes the loader itself at every position, on 1 to 3
// ranks.)
static void test_resume_shuffled(void) {
    static Run full, r;
    char data[200], path[300], saved_shards[sizeof(shards)];
    snprintf(data, sizeof(data), "%s/shuf", dir);
    mkdir(data, 0700);
    size_t ntok = 0;
    uint16_t *tokens = test_read_shard(test_path(path, sizeof(path), dir, "train_000.bin"), &ntok);
    static const int windows[3] = {7, 10, 4};
    for (int s = 0; s < 3 && tokens != NULL && ntok >= 40000; s++) {  // from different places: no two alike
        snprintf(path, sizeof(path), "%s/piece_%d.bin", data, s);
        write_tokens(path, tokens + 10007 * s, (size_t)windows[s] * 32 + 1);
    }
    free(tokens);
    if (!check(ntok >= 40000, "three shards of 7, 10 and 4 micro-batches cut from the test's shard")) return;
    snprintf(saved_shards, sizeof(saved_shards), "%s", shards);
    snprintf(shards, sizeof(shards), "%.140s/piece_*.bin", data);  // start() reads these, until put back below
    char a[200], b[200], args[300];
    const char *flags = "-sh 1 -n 3 -nk 0";
    snprintf(a, sizeof(a), "%s/shuffled_full", dir);
    run(&full, a, 15, flags);
    uint8_t key[32];
    if (!check(full.status == 0 && full.nsteps == 15 && test_exists("%s/ckpt_%08d/MANIFEST", a, 15) &&
                   read_key(a, key) == 0,
               "-sh 1: 15 steps over 3 shards, a checkpoint every 3 (exit %d)", full.status)) {
        printf("%s\n", full.out);
        snprintf(shards, sizeof(shards), "%s", saved_shards);
        return;
    }
    char err[1024] = "";
    CkptState st, last;
    memset(&last, 0, sizeof(last));
    snprintf(path, sizeof(path), "%s/ckpt_00000015", a);
    int have_last = ckpt_verify(path, key, 1, &last, err, sizeof(err)) == 0;
    for (int k = 3; k <= 12; k += 3) {
        // the saved position against the DataLoader's after 4k micro-batches
        memset(&st, 0, sizeof(st));
        snprintf(path, sizeof(path), "%s/ckpt_%08d", a, k);
        int ok = ckpt_verify(path, key, 1, &st, err, sizeof(err)) == 0;
        DataLoader dl;
        DataLoaderState want = {0, 0, 0, 0};
        if (ok && dataloader_init(&dl, shards, 2, 16, 0, 1, 1, (uint64_t)st.seed, 256, err, sizeof(err)) == 0) {
            int in[32], tg[32];
            for (int i = 0; i < 4 * k && ok; i++) ok = dataloader_next(&dl, in, tg) == 0;
            dataloader_get_state(&dl, &want);
            dataloader_free(&dl);
        } else {
            ok = 0;
        }
        uint64_t *got = st.data;
        check(ok && st.shuffle == 1 && got[0] == want.epoch && got[1] == want.shard_pos && got[2] == want.sample_pos &&
              got[3] == want.rng && want.epoch == (uint64_t)(4 * k / 21) && want.sample_pos > 0,
              "ckpt %d saves the position after %d micro-batches: epoch %llu shard_pos %llu sample_pos %llu rng "
              "%016llx (the loader's: %llu %llu %llu %016llx) %s", k, 4 * k, (unsigned long long)got[0],
              (unsigned long long)got[1], (unsigned long long)got[2], (unsigned long long)got[3],
              (unsigned long long)want.epoch, (unsigned long long)want.shard_pos,
              (unsigned long long)want.sample_pos, (unsigned long long)want.rng, ok ? "" : err);
        // resumed from it, alone in a fresh directory
        snprintf(b, sizeof(b), "%s/shuffled_from_%d", dir, k);
        sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_%08d %s/job.key %s/", b, b, a, k, a, b);
        snprintf(args, sizeof(args), "-y 1 %s", flags);
        run(&r, b, 15, args);
        check(r.status == 0 && strstr(r.out, "resuming from") != NULL && same_steps(&full, &r, k, 15),
              "-sh 1: resumed from step %d (epoch %llu), steps %d..14 print the uninterrupted run's losses and norms "
              "(exit %d)", k, (unsigned long long)got[0], k, r.status);
        char fa[300], fb[300];
        snprintf(fa, sizeof(fa), "%s/ckpt_00000015", a);
        snprintf(fb, sizeof(fb), "%s/ckpt_00000015", b);
        check(files_equal(fa, fb, "model.bin") && files_equal(fa, fb, "optim.bin") && files_equal(fa, fb, "state.bin"),
              "-sh 1: resumed from step %d, its checkpoint of step 15 is the uninterrupted run's, state.bin too", k);
    }
    // step 9's checkpoint (epoch 1) resumed on 2 ranks
    snprintf(b, sizeof(b), "%s/shuffled_dp2", dir);
    sh("rm -rf %s && mkdir -p %s && cp -r %s/ckpt_00000009 %s/job.key %s/", b, b, a, a, b);
    snprintf(args, sizeof(args), "-y 1 -np 2 %s", flags);
    run(&r, b, 15, args);
    float w = worst_diff(&full, &r, 9, 15);
    memset(&st, 0, sizeof(st));
    snprintf(path, sizeof(path), "%s/ckpt_00000015", b);
    int have_dp2 = ckpt_verify(path, key, 1, &st, err, sizeof(err)) == 0;
    check(r.status == 0 && strstr(r.out, "resuming from") != NULL && w <= 1e-5f && have_last && have_dp2 &&
          memcmp(st.data, last.data, sizeof(st.data)) == 0,
          "-sh 1: step 9's checkpoint resumed on 2 ranks: losses and norms within %.1e of the one-rank run's (<= 1e-5), "
          "and step 15's position (epoch %llu, shard_pos %llu, sample_pos %llu) its (exit %d)", w,
          (unsigned long long)st.data[0], (unsigned long long)st.data[1], (unsigned long long)st.data[2], r.status);
    snprintf(shards, sizeof(shards), "%s", saved_shards);
}

// job.key made while another node's rank, sharing -o and with this
// process's pid, is writing its own temporary key file: that file (under
// the name the pid alone would give, job.key.PID.tmp) is neither taken nor
// removed, job.key is this process's whole key, and no temporary file of
// its own is left. The name was job.key.PID.tmp: this process removed the
// other's file and wrote its key under the same name.
static void test_key_temp_name(void) {
    char out[300], theirs[400], err[512] = "";
    snprintf(out, sizeof(out), "%s/key_tmp", dir);
    mkdir(out, 0700);
    snprintf(theirs, sizeof(theirs), "%s/job.key.%d.tmp", out, (int)getpid());
    FILE *f = fopen(theirs, "w");
    int planted = f != NULL && fputs("another node's key, half written", f) >= 0;
    if (f != NULL) planted &= fclose(f) == 0;
    uint8_t key[32], again[32];
    int dfd = ckpt_dir_open(out, err, sizeof(err));
    int made = dfd >= 0 && ckpt_key_at(dfd, out, NULL, 1, key, err, sizeof(err)) == 0;
    int read = made && ckpt_key_at(dfd, out, NULL, 0, again, err, sizeof(err)) == 0 && memcmp(key, again, 32) == 0;
    if (dfd >= 0) close(dfd);
    size_t n = 0;
    char *left = test_read_file(theirs, &n);
    int kept = left != NULL && n == strlen("another node's key, half written") &&
               memcmp(left, "another node's key, half written", n) == 0;
    free(left);
    DIR *d = opendir(out);
    int others = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        others += strncmp(e->d_name, "job.key.", 8) == 0 && strcmp(strrchr(theirs, '/') + 1, e->d_name) != 0;
    if (d != NULL) closedir(d);
    check(planted && made && read && kept && others == 0,
          "job.key made beside another node's job.key.%d.tmp (the same pid): that file is left as it was (%s), the "
          "key reads back (%s), and no temporary file of this process is left (%d) %s", (int)getpid(),
          kept ? "yes" : "no", read ? "yes" : "no", others, err);
    test_remove_dir(out);
}

// -nk 2 keeps the newest two; -y 1 with nothing to resume starts afresh
static void test_keep(void) {
    static Run r;
    char a[200];
    snprintf(a, sizeof(a), "%s/keep", dir);
    sh("rm -rf %s", a);
    run(&r, a, 10, "-n 2 -nk 2 -y 1");
    check(r.status == 0 && strstr(r.out, "starting from step 0") != NULL, "-y 1 without a checkpoint starts from step 0");
    int kept = 0;
    for (int s = 2; s <= 10; s += 2) kept += test_exists("%s/ckpt_%08d/MANIFEST", a, s) ? 1 << (s / 2) : 0;
    check(kept == (1 << 4 | 1 << 5), "-n 2 -nk 2 over 10 steps keeps exactly ckpt 8 and 10 (mask 0x%x)", kept);
    check(!test_exists("%s/ckpt_%08d.partial", a, 10), "no .partial directory is left behind");
    // checkpoints need a directory
    finish(&r, start("-x 2 -n 1", 0), a);
    check(r.status == 2 && strstr(r.out, "give it with -o DIR") != NULL, "-n without -o is refused: %s",
          test_line_of(r.out, "train_gpt2"));
    // -ys picks an older one than the newest; its log lines after step 8 go
    run(&r, a, 10, "-ys 8");
    check(r.status == 0 && strstr(r.out, "ckpt_00000008: step 8") != NULL && r.nsteps == 10,
          "-ys 8 resumes from step 8 although ckpt 10 is newer (exit %d, log up to step %d)", r.status, r.nsteps - 1);
    // its first checkpoint drops the abandoned run's newer one (so -y 1 never
    // goes back to it) and keeps itself, also with -nk 1
    run(&r, a, 10, "-ys 8 -n 1 -nk 1 -x 9");
    check(r.status == 0 && test_exists("%s/ckpt_%08d/MANIFEST", a, 9) && !test_exists("%s/ckpt_%08d", a, 10) &&
              !test_exists("%s/ckpt_%08d", a, 8),
          "after -ys 8 -nk 1: ckpt 9 kept, the newer ckpt 10 and the older ckpt 8 deleted (exit %d)", r.status);
    // a checkpoint directory without a MANIFEST is passed over, and pruned
    sh("mkdir -p %s/ckpt_00000050 && touch %s/ckpt_00000050/model.bin", a, a);
    run(&r, a, 11, "-y 1 -n 1");
    check(r.status == 0 && strstr(r.out, "ckpt_00000009: step 9") != NULL && strstr(r.out, "passed over") != NULL &&
              !test_exists("%s/ckpt_%08d", a, 50),
          "a ckpt directory without MANIFEST is passed over and then removed (exit %d)", r.status);
    // a file and a symbolic link (to a real checkpoint) under newer checkpoints'
    // names: each passed over in one line, -ys of one refused, and both pruned
    sh("touch %s/ckpt_00000060 && ln -s ckpt_00000011 %s/ckpt_00000070", a, a);
    const char *file_line = "ckpt_00000060: a file, not a checkpoint directory; passed over";
    const char *link_line = "ckpt_00000070: a symbolic link (never followed), not a checkpoint directory; passed over";
    run(&r, a, 70, "-ys 70");
    check(r.status == 2 && test_count(r.out, link_line) == 1 && strstr(r.out, "flag -ys: no checkpoint of step 70") != NULL,
          "-ys 70 where ckpt_00000070 is a link: refused, the link said in one line (exit %d): %s", r.status,
          test_line_of(r.out, "ckpt_00000070"));
    run(&r, a, 12, "-y 1 -n 1");
    check(r.status == 0 && strstr(r.out, "ckpt_00000011: step 11") != NULL && test_count(r.out, file_line) == 1 &&
              test_count(r.out, link_line) == 1 && !test_exists("%s/ckpt_%08d", a, 60) &&
              !test_exists("%s/ckpt_%08d", a, 70) && test_exists("%s/ckpt_%08d/MANIFEST", a, 12),
          "-y 1 past a file and a link under newer checkpoints' names: each passed over in one line, the run resumes "
          "from step 11, both pruned (exit %d): %s", r.status, test_line_of(r.out, "passed over"));
    // one job per directory
    char args[300];
    char log[300];
    snprintf(log, sizeof(log), "%s/log.jsonl", a);
    unlink(log);
    snprintf(args, sizeof(args), "-o %s -x 5000 -n 0", a);  // outlasts the check, ends if we do not
    pid_t first = start(args, 0);
    static Run seen;
    for (double t0 = test_now(); test_now() - t0 < 60 && waitpid(first, NULL, WNOHANG) == 0;) {
        read_log(&seen, log);  // it logs only once it holds the lock
        if (seen.nsteps >= 1) break;
        usleep(5000);
    }
    if (!check(seen.nsteps >= 1, "a first job holds the lock on %s", a)) {
        kill(first, SIGKILL);
        waitpid(first, NULL, 0);
        return;
    }
    static Run second;
    run(&second, a, 2, "");
    kill(first, SIGKILL);
    waitpid(first, NULL, 0);
    check(second.status == 1 && strstr(second.out, "another job is using") != NULL, "a second job in the same -o: %s",
          test_line_of(second.out, "another job"));
}

// SIGTERM: the step finishes, a checkpoint is written, exit 0; resuming ends
// where the uninterrupted run ends
static void test_sigterm(const char *layout, const Run *ref, const char *name) {
    static Run r, fin;
    char a[200], args[300];
    snprintf(a, sizeof(a), "%s/term_%d", dir, layout[0] != '\0');
    sh("rm -rf %s", a);
    snprintf(args, sizeof(args), "-o %s -x 40 %s", a, layout);
    pid_t pid = start(args, 0);
    char log[300];
    snprintf(log, sizeof(log), "%s/log.jsonl", a);
    for (int i = 0; i < 2000; i++) {  // once 5 steps are logged, or the run ended
        static Run seen;
        read_log(&seen, log);
        if (seen.nsteps >= 5) break;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            skip("%s: the run ended before SIGTERM could be sent", name);
            return;
        }
        usleep(2000);
    }
    kill(pid, SIGTERM);  // the trainer itself, or the launcher of its ranks
    finish(&r, pid, a);
    const char *p = strstr(r.out, "stopped by a signal after step ");
    int step = p ? atoi(p + 31) : -1;
    check(r.status == 0 && step >= 0 && test_exists("%s/ckpt_%08d/MANIFEST", a, step + 1),
          "%s: SIGTERM finishes step %d, checkpoints it and exits 0 (exit %d)", name, step, r.status);
    snprintf(args, sizeof(args), "-y 1 %s", layout);
    run(&fin, a, 40, args);
    check(fin.status == 0 && same_steps(ref, &fin, 0, 40), "%s: resumed after SIGTERM, all 40 steps as the uninterrupted run",
          name);
}

// the "tokens" of each of the log's lines in out_dir, into tokens[]
// (-1 where a line has none); the lines read
static int log_tokens(const char *out_dir, long *tokens, int max) {
    char path[300], line[512];
    snprintf(path, sizeof(path), "%s/log.jsonl", out_dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f != NULL && n < max && fgets(line, sizeof(line), f) != NULL) {
        const char *t = test_log_value(line, "tokens");
        tokens[n++] = t != NULL ? atol(t) : -1;
    }
    if (f != NULL) fclose(f);
    return n;
}

// whether the log in out_dir holds exactly the n counts of want
static int tokens_are(const char *out_dir, const long *want, int n, char *got, size_t gotlen) {
    long tokens[MAX_STEPS];
    int k = log_tokens(out_dir, tokens, MAX_STEPS), len = 0;
    got[0] = '\0';
    for (int i = 0; i < k && len < (int)gotlen; i++)
        len += snprintf(got + len, gotlen - len, "%s%ld", i ? " " : "", tokens[i]);
    if (k != n) return 0;
    for (int i = 0; i < n; i++)
        if (tokens[i] != want[i]) return 0;
    return 1;
}

// state.bin's int32 header slots [30..31] of checkpoint dir/ckpt_<step>,
// a plain one, as one uint64 (low word first); -1 when it cannot be read
static long long state_tokens(const char *out_dir, int step) {
    char path[300];
    snprintf(path, sizeof(path), "%s/ckpt_%08d/state.bin", out_dir, step);
    size_t n = 0;
    char *bytes = test_read_file(path, &n);
    long long v = -1;
    if (bytes != NULL && n == HEADER_INTS * 4) {
        int32_t h[2];
        memcpy(h, bytes + 30 * 4, sizeof(h));
        v = (long long)((uint64_t)(uint32_t)h[0] | (uint64_t)(uint32_t)h[1] << 32);
    }
    free(bytes);
    return v;
}

// a state.bin as the trainers wrote it before it held the tokens so far:
// its slots [30..31] zeroed, and the MANIFEST sealed again over the files
// under the job's key; 0, or -1
static int make_old_state(const char *out_dir, int step) {
    char ck[300], path[400], err[512];
    uint8_t key[32];
    snprintf(ck, sizeof(ck), "%s/ckpt_%08d", out_dir, step);
    snprintf(path, sizeof(path), "%s/state.bin", ck);
    size_t n = 0;
    char *bytes = test_read_file(path, &n);
    if (bytes == NULL || n != HEADER_INTS * 4 || read_key(out_dir, key) != 0) {
        free(bytes);
        return -1;
    }
    memset(bytes + 30 * 4, 0, 8);
    test_write_file(path, bytes, n);
    free(bytes);
    Manifest m = {0, NULL};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) rc = manifest_add_file(&m, ck, ckpt_files[i], err, sizeof(err));
    if (rc == 0) rc = manifest_write(&m, ck, "MANIFEST", key, err, sizeof(err));
    if (rc != 0) printf("note: %s\n", err);
    manifest_free(&m);
    return rc;
}

// the log's "tokens", the tokens trained on so far, count on across resumes
// under another total batch (-d): 4 steps of 64 tokens with checkpoints of
// steps 2 and 4, resumed for 2 steps of 128, then for 2 more of 64, log
// 64 128 192 256 384 512 576 640, and state.bin holds the count (256 at
// step 4, 512 at step 6). A state.bin written before it held the count
// (its slots zero) resumes with the documented fallback, the checkpoint's
// steps at its own batch: step 4 of 64 tokens a step is 256, exact here
static void test_tokens_resumed(void) {
    static Run r;
    char a[200], b[200], got[512];
    snprintf(a, sizeof(a), "%s/tokens", dir);
    snprintf(b, sizeof(b), "%s/tokens_old", dir);
    sh("rm -rf %s %s", a, b);
    run(&r, a, 4, "-n 2 -d 64");
    if (!check(r.status == 0 && r.nsteps == 4 && test_exists("%s/ckpt_%08d/MANIFEST", a, 4),
               "4 steps of 64 tokens, a checkpoint of step 4 (exit %d)", r.status)) {
        printf("%s\n", r.out);
        return;
    }
    sh("mkdir -p %s && cp -r %s/ckpt_00000004 %s/job.key %s/", b, a, a, b);
    long first[4] = {64, 128, 192, 256};
    int same = tokens_are(a, first, 4, got, sizeof(got));
    check(same && state_tokens(a, 4) == 256,
          "tokens 64 a step: the log says %s; state.bin of step 4 holds %lld (256)", got, state_tokens(a, 4));
    run(&r, a, 6, "-n 2 -y 1 -d 128 -np 2");
    long second[6] = {64, 128, 192, 256, 384, 512};
    same = tokens_are(a, second, 6, got, sizeof(got));
    check(r.status == 0 && strstr(r.out, "step 4, 256 tokens trained") != NULL && same && state_tokens(a, 6) == 512,
          "resumed at step 4 under -d 128 on 2 ranks: the log says %s (64 128 192 256 384 512), state.bin of step 6 "
          "holds %lld (512) (exit %d): %s", got, state_tokens(a, 6), r.status, test_line_of(r.out, "resuming"));
    run(&r, a, 8, "-n 2 -y 1 -d 64");
    long third[8] = {64, 128, 192, 256, 384, 512, 576, 640};
    same = tokens_are(a, third, 8, got, sizeof(got));
    check(r.status == 0 && same,
          "resumed at step 6 under -d 64 again: the log says %s (... 512 576 640), not step 6 x 128 + 64 (exit %d)", got,
          r.status);

    if (!check(make_old_state(b, 4) == 0 && state_tokens(b, 4) == 0,
               "the step-4 checkpoint made old-style: state.bin's slots [30..31] zero, its MANIFEST sealed again"))
        return;
    run(&r, b, 6, "-y 1 -d 128");
    long old[2] = {384, 512};
    same = tokens_are(b, old, 2, got, sizeof(got));
    check(r.status == 0 && strstr(r.out, "step 4, 256 tokens trained") != NULL && same,
          "an old-style state.bin of step 4 (64 tokens a step) resumed under -d 128: 256 tokens before it, the log says "
          "%s (384 512) (exit %d): %s", got, r.status, test_line_of(r.out, "resuming"));
}

// Without -o no signal is caught, and SIGTERM ends the trainer at once: its
// stdout, into a file here, must still hold every line it printed before
// (fully buffered, the FMA peak and the val loss went down with the
// process). -fault slow:0:0 holds rank 0 in step 0 for 300 ms after those
// lines and before the step's own, whose end flushes stdout anyway; its
// "fault slow" line is on stderr, which is not buffered, so once it is in
// the file the lines before it have been printed, and the kill lands in
// that window. The wait for it, and the wait for the end, are bounded.
static void test_kill_output(const char *layout, const char *name) {
    char args[600], out[300];
    snprintf(args, sizeof(args), "-x 100000 -v 100000 -m 1 -j '%s' -fault slow:0:0 %s", shards, layout);
    snprintf(out, sizeof(out), "%s/out.txt", dir);
    unlink(out);
    pid_t pid = start(args, 0);
    int seen = 0, ended = 0, st = 0;
    for (int i = 0; i < 3000 && !seen && !ended; i++) {  // 30 s at most
        char *text = test_read_text(out);
        seen = strstr(text, "fault slow") != NULL;
        free(text);
        ended = !seen && waitpid(pid, &st, WNOHANG) == pid;
        if (!seen && !ended) usleep(10000);
    }
    kill(pid, SIGTERM);  // the trainer, or the launcher, which passes it on to its ranks
    for (int i = 0; i < 1000 && !ended; i++) {  // 10 s at most, then the whole group is killed
        ended = waitpid(pid, &st, WNOHANG) == pid;
        if (!ended) usleep(10000);
    }
    if (!ended) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    static Run r;
    collect(&r, test_exit_status(st), dir);
    check(seen && r.status != 0 && strstr(r.out, "FMA peak") != NULL && strstr(r.out, "val loss") != NULL,
          "%s, no -o, stdout into a file: killed by SIGTERM once step 0 began (exit %d), the lines printed before the "
          "kill are there (FMA peak: %s; val loss: %s)", name, r.status, strstr(r.out, "FMA peak") ? "yes" : "no",
          strstr(r.out, "val loss") ? "yes" : "no");
    if (!seen) printf("%s\n", r.out);
    sh("rm -f /dev/shm/llm3d-%d-*", (int)pid);  // a launcher killed before it removed its segment
}

// a file size limit fails the checkpoint write cleanly; the previous one stays
static void test_full_disk(void) {
    static Run r, after;
    char a[200];
    snprintf(a, sizeof(a), "%s/full", dir);
    sh("rm -rf %s", a);
    run(&r, a, 2, "-n 2");
    if (!check(r.status == 0 && test_exists("%s/ckpt_%08d/MANIFEST", a, 2), "a checkpoint of step 2 before the disk fills"))
        return;
    // model.bin (1.7 MB) fits under the limit, optim.bin (3.5 MB) does not
    char args[300];
    snprintf(args, sizeof(args), "-o %s -x 6 -n 2 -y 1", a);
    finish(&r, start(args, 2500000), a);
    check(r.status == 1 && strstr(r.out, "checkpoint of step 4 failed") != NULL && strstr(r.out, "File too large") != NULL,
          "a file size limit: exit %d, %s", r.status, test_line_of(r.out, "failed"));
    check(!test_exists("%s/ckpt_%08d", a, 4) && !test_exists("%s/ckpt_%08d.partial", a, 4),
          "no checkpoint of step 4, not even a part");
    run(&after, a, 6, "-n 2 -y 1");
    check(after.status == 0 && strstr(after.out, "ckpt_00000002: step 2") != NULL && after.nsteps == 6,
          "the checkpoint of step 2 is intact and resumes (exit %d)", after.status);
}

// SIGKILL at random moments, 20 times in a row, each run resuming from the
// newest complete checkpoint; then a run to the end prints every step as the
// uninterrupted run and writes the same model. The kills come at random
// times within 1/15 of an uninterrupted run's length, timed first on this
// machine, scaled by the share of steps still to run: 20 of them stop short
// of the end, and they land in every phase (start-up, steps, checkpoint
// writes).
static void test_kills(const char *layout, const char *name, unsigned seed) {
    static Run ref, r;
    char a[200], ref_dir[200], args[300];
    snprintf(ref_dir, sizeof(ref_dir), "%s/kill_ref_%d", dir, layout[0] != '\0');
    snprintf(args, sizeof(args), "-n 1 %s", layout);
    double t0 = test_now();
    run(&ref, ref_dir, 40, args);
    double window_us = (test_now() - t0) / 15 * 1e6;
    if (!check(ref.status == 0 && ref.nsteps == 40, "%s: an uninterrupted run to time and compare (%.2f s)", name,
               window_us * 15 / 1e6))
        return;
    snprintf(a, sizeof(a), "%s/kill_%d", dir, layout[0] != '\0');
    sh("rm -rf %s", a);
    snprintf(args, sizeof(args), "-o %s -x 40 -n 1 -y 1 %s", a, layout);
    srand(seed);
    int kills = 0, mid_write = 0, finished = 0, partial[41] = {0};
    double run_s = 0.0;
    int complete = 0;  // a complete checkpoint exists
    for (int i = 0; i < 20; i++) {
        pid_t pid = start(args, 0);
        t0 = test_now();
        // the window was timed once, and a machine that got busier since could
        // see every kill land before the first checkpoint: until one exists,
        // the kill waits for it (each later run still starts up, so kills land
        // in start-up too)
        for (int w = 0; !complete && w < 6000 && waitpid(pid, NULL, WNOHANG) == 0; w++) {
            for (int s = 1; s <= 40 && !complete; s++) complete = test_exists("%s/ckpt_%08d", a, s);
            if (!complete) usleep(10000);
        }
        // the window shrinks with the steps left: a machine faster now than
        // when the window was timed must not finish the run before 20 kills
        int newest = 0;
        for (int s = 40; s >= 1 && newest == 0; s--) newest = test_exists("%s/ckpt_%08d", a, s) ? s : 0;
        usleep((useconds_t)(window_us * (40 - newest) / 40 * rand() / RAND_MAX));
        if (waitpid(pid, NULL, WNOHANG) == pid) { finished = 1; break; }
        kill(-pid, SIGKILL);  // the whole group: the trainer, or the launcher and its ranks
        waitpid(pid, NULL, 0);
        sh("rm -f /dev/shm/llm3d-%d-*", (int)pid);  // a killed launcher's segment (the shell exec'd it)
        run_s += test_now() - t0;
        kills++;
        usleep(20000);
        // a .partial directory that this run left: the kill came during a write
        for (int s = 1; s <= 40; s++) {
            int there = test_exists("%s/ckpt_%08d.partial", a, s);
            mid_write += there && !partial[s];
            partial[s] = there;
        }
    }
    finish(&r, start(args, 0), a);
    printf("note  %s: %d kills in %.1f s, %d landed during a checkpoint write%s\n", name, kills, run_s, mid_write,
           finished ? "; the run finished before the next kill" : "");
    check(kills == 20, "%s: %d SIGKILLs in a row%s", name, kills, finished ? " (the run ended first)" : "");
    check(strstr(r.out, "resuming from") != NULL, "%s: the last run resumed from a checkpoint the kills left: %s", name,
          test_line_of(r.out, "resuming"));
    check(r.status == 0 && r.nsteps == 40 && same_steps(&ref, &r, 0, 40),
          "%s: after the kills, all 40 steps print the uninterrupted run's losses and norms (exit %d)", name, r.status);
    char fa[300], fb[300];
    snprintf(fa, sizeof(fa), "%s/ckpt_00000040", a);
    snprintf(fb, sizeof(fb), "%s/ckpt_00000040", ref_dir);
    check(files_equal(fa, fb, "model.bin") && files_equal(fa, fb, "optim.bin"),
          "%s: the final model and AdamW state are byte-identical to the uninterrupted run's", name);
}

int main(void) {
    if (access("./train_gpt2", X_OK) != 0) {
        skip("./train_gpt2 is not built (run from the repository's root)");
        return test_summary();
    }
    if (test_make_dir(dir, sizeof(dir), "/tmp/llm3d_test_checkpoint_XXXXXX") != 0) {
        check(0, "mkdtemp %s: %s", dir, strerror(errno));
        return test_summary();
    }
    snprintf(shards, sizeof(shards), "%s/train_*.bin", dir);
    char path[200];
    snprintf(path, sizeof(path), "%s/train_000.bin", dir);
    if (!check(test_write_shard(path, 40000) == 0, "a 40000-token shard in %s", dir)) return test_summary();

    test_bit_exact("", "one rank");
    test_bit_exact("-np 2 -z 1", "dp 2 ZeRO-1");
    test_bit_exact("-np 2 -tp 2", "tp 2");
    test_bit_exact("-np 2 -pp 2 -ps 1f1b", "pp 2 1f1b");
    test_bit_exact("-np 8 -tp 2 -pp 2 -z 3", "(2,2,2) ZeRO-3");
    test_other_layouts();
    test_refusals();
    test_encrypted("", "one rank");
    test_encrypted("-np 2 -z 1", "dp 2 ZeRO-1");
    test_encrypted_refusals();
    test_changed_byte_every_file();
    test_resume_shuffled();
    test_seal_from_shares();
    test_share_masks_fresh();
    test_ids_from_rank0();
    test_optim_slices();
    test_model_slices();
    test_encrypted_init();
    test_init_damaged_chunk();
    test_init_swapped_between_ranks(1);
    test_init_swapped_between_ranks(0);
    test_keep();
    test_key_temp_name();
    test_full_disk();
    test_tokens_resumed();
    test_kill_output("", "one rank");
    test_kill_output("-np 2", "2 ranks");

    static Run ref1, ref2;
    char r1[200], r2[200];
    snprintf(r1, sizeof(r1), "%s/ref_one", dir);
    snprintf(r2, sizeof(r2), "%s/ref_dp2", dir);
    run(&ref1, r1, 40, "-n 40");
    run(&ref2, r2, 40, "-n 40 -np 2 -z 1");
    if (check(ref1.status == 0 && ref1.nsteps == 40 && ref2.status == 0 && ref2.nsteps == 40,
              "uninterrupted 40-step references (one rank, dp 2)")) {
        test_sigterm("", &ref1, "one rank");
        test_sigterm("-np 2 -z 1", &ref2, "dp 2");
    }
    test_kills("", "one rank", 1);
    test_kills("-np 2 -z 1", "dp 2", 2);
    test_remove_dir(dir);
    return test_summary();
}
