/*
 * test_hellaswag.c: HellaSwag (hellaswag.h, prepare_hellaswag.h, -h 1).
 *
 * A small file in llm.c's eval format, written here: read back field by
 * field, and refused with one line for each kind of damage; its examples
 * split over data-parallel ranks and packed into batches; scored from the
 * CPU model's per-token losses, against a brute-force scorer that runs
 * every completion alone and takes its mean loss from the logits (a
 * log-softmax in double, not the trainer's cross-entropy); and the accuracy
 * that ./train_gpt2 -h 1 logs, in one rank and in parallel layouts, against
 * that brute force. Then `./prepare_data hellaswag` on a few JSON lines:
 * the fields, the escapes and GPT-2's tokens of a HellaSwag context, and
 * what it refuses (a key twice, a label that is not a JSON integer, a FIFO,
 * links planted where it writes).
 */
#define TESTING
#include "train_gpt2.c"
#include "dev/data/prepare_hellaswag.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

#include <poll.h>
#include <sys/ioctl.h>

#define NEX 13     // examples: uneven over 2 and 4 ranks
#define MODEL_T 32
#define MODEL_B 8
static const char *fixture_model = "dev/fixtures/tiny_model.bin";  // V 500, maxT 32
static char dir[128];

// NEX examples of 2 to 4 completions with random tokens below V
static uint16_t pool[NEX][5][16];
static void make_examples(HsExample *ex, int V) {
    uint64_t x = 42;
    for (int i = 0; i < NEX; i++) {
        HsExample *e = &ex[i];
        memset(e, 0, sizeof(*e));
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        e->ncomp = 2 + (int)((x >> 40) % 3);
        e->label = (int)((x >> 20) % (uint64_t)e->ncomp);
        e->ctx_len = 1 + (int)((x >> 50) % 10);
        for (int c = -1; c < e->ncomp; c++) {
            uint16_t *t = pool[i][c + 1];
            int len = c < 0 ? e->ctx_len : 1 + (int)((x >> (30 + 3 * c)) % 8);
            for (int k = 0; k < len; k++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                t[k] = (uint16_t)((x >> 33) % (uint64_t)V);
            }
            if (c < 0) e->ctx = t;
            else e->comp[c] = t, e->comp_len[c] = len;
        }
    }
}

static int same_example(const HsExample *a, const HsExample *b) {
    if (a->label != b->label || a->ncomp != b->ncomp || a->ctx_len != b->ctx_len ||
        memcmp(a->ctx, b->ctx, (size_t)a->ctx_len * 2) != 0)
        return 0;
    for (int c = 0; c < a->ncomp; c++)
        if (a->comp_len[c] != b->comp_len[c] || memcmp(a->comp[c], b->comp[c], (size_t)a->comp_len[c] * 2) != 0) return 0;
    return 1;
}

// ----------------------------------------------------------------------------
// the file

// the file's bytes with one uint16 of the examples (word w after the header)
// set to v, or the header's int32 h set to v (w < 0: -1 - h), written to
// path; cut > 0: only that many bytes from the end kept off
static void write_patched(const char *good, const char *path, long w, uint32_t v, long cut) {
    FILE *f = fopen(good, "rb");
    char buf[65536];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (w >= 0) memcpy(buf + 1024 + 2 * w, &(uint16_t){(uint16_t)v}, 2);
    else memcpy(buf + 4 * (-1 - w), &(int32_t){(int32_t)v}, 4);
    if (cut > 0) n -= (size_t)cut;
    if (cut < 0) memset(buf + n, 0, (size_t)-cut), n += (size_t)-cut;
    f = fopen(path, "wb");
    fwrite(buf, 1, n, f);
    fclose(f);
}

// this process's bytes read so far (/proc/self/io's rchar), or -1
static long long bytes_read_so_far(void) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    long long n = -1;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (strncmp(line, "rchar: ", 7) == 0) n = atoll(line + 7);
    if (f != NULL) fclose(f);
    return n;
}

// what hs_read reads before it refuses a file: a FIFO is refused at once,
// not waited on; a 64 MiB file whose first example is bad after at most
// its header and one example's worth of bytes, not all of it
static void test_read_bounds(const char *good) {
    char fifo[300], big[300], err[1024];
    HsSet s;
    snprintf(fifo, sizeof(fifo), "%s/fifo.bin", dir);
    if (mkfifo(fifo, 0600) == 0) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {  // a child, so that a read that waits on the FIFO ends at the deadline
            int rc = hs_read(&s, fifo, 500, MODEL_T, MODEL_B, err, sizeof(err));
            _exit(rc == -1 && strstr(err, "fifo.bin: not a regular file") != NULL ? 0 : 1);
        }
        double waited = 0;
        int status = test_wait(pid, 10.0, &waited);
        check(status == 0, "hs_read of a FIFO: refused at once as not a regular file (status %d in %.1f s)", status, waited);
        unlink(fifo);
    } else {
        skip("mkfifo %s", fifo);
    }
    snprintf(big, sizeof(big), "%s/big.bin", dir);
    write_patched(good, big, 0, 7, 0);  // the first example's start mark spoilt
    long long before = bytes_read_so_far();
    if (before < 0 || truncate(big, 64L << 20) != 0) {
        skip("no /proc/self/io, or a 64 MiB file: what hs_read reads first");
        return;
    }
    before = bytes_read_so_far();
    int rc = hs_read(&s, big, 500, MODEL_T, MODEL_B, err, sizeof(err));
    long long read = bytes_read_so_far() - before;
    check(rc == -1 && strstr(err, "example 0: starts with 7") != NULL && read < (1 << 20),
          "a 64 MiB file with a bad first example: refused after reading %lld bytes (under 1 MiB): %s", read, err);
    unlink(big);
}

static void test_file(const HsExample *ex, const char *good) {
    char err[1024], bad[300];
    HsSet s;
    int rc = hs_read(&s, good, 500, MODEL_T, MODEL_B, err, sizeof(err));
    if (!check(rc == 0 && s.n == NEX, "read back %d examples%s%s", rc == 0 ? s.n : 0, rc ? ": " : "", rc ? err : ""))
        return;
    int same = 1;
    for (int i = 0; i < NEX; i++) same &= same_example(&s.ex[i], &ex[i]);
    check(same && s.max_ncomp == 4, "every field of every example as written (most completions %d)", s.max_ncomp);
    FILE *f = fopen(good, "rb");
    int32_t h[256] = {0};
    size_t got = fread(h, 4, 256, f);
    check(got == 256 && h[0] == 20240522 && h[1] == 1 && h[2] == NEX && h[3] > 0, "header: magic "
          "20240522, version 1, %d examples, longest %d bytes", h[2], h[3]);
    fclose(f);
    hs_free(&s);
    // each kind of damage: one line naming it
    snprintf(bad, sizeof(bad), "%s/bad.bin", dir);
    long first_comp_len = 6 + ex[0].ctx_len;
    struct { long w; uint32_t v; long cut; int V, T, B; const char *want; } cases[] = {
        {-1, 20240520, 0, 500, MODEL_T, MODEL_B, "header magic 20240520"},
        {-3, 99, 0, 500, MODEL_T, MODEL_B, "header says 99 examples"},
        {0, 7, 0, 500, MODEL_T, MODEL_B, "example 0: starts with 7"},
        {2, 5, 0, 500, MODEL_T, MODEL_B, "example 0: its index field says 5"},
        {3, 9, 0, 500, MODEL_T, MODEL_B, "example 0: label 9"},
        {5, 0, 0, 500, MODEL_T, MODEL_B, "example 0: an empty context"},
        {first_comp_len, 0, 0, 500, MODEL_T, MODEL_B, "example 0: completion 0 is empty"},
        {6, 499, 0, 499, MODEL_T, MODEL_B, "token 499 is not below the model's vocab size 499"},
        {-1, 20240522, 0, 500, 4, MODEL_B, "exceed T = 4 (flag -t)"},
        {-1, 20240522, 0, 500, MODEL_T, 3, "flag -b: B = 3 rows"},
        {-1, 20240522, 6, 500, MODEL_T, MODEL_B, "runs past the end of the file"},
        {-1, 20240522, -2, 500, MODEL_T, MODEL_B, "bytes follow the last of the header's 13 examples"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        write_patched(good, bad, cases[k].w, cases[k].v, cases[k].cut);
        rc = hs_read(&s, bad, cases[k].V, cases[k].T, cases[k].B, err, sizeof(err));
        check(rc == -1 && strstr(err, cases[k].want) != NULL && strchr(err, '\n') == NULL && strstr(err, bad) != NULL,
              "refused, naming the file: %s", err);
    }
    test_read_bounds(good);
}

// every example on exactly one rank, in order; every rank the same number of batches
static void test_split(const HsSet *s) {
    for (int dp = 1; dp <= 5; dp++) {
        int covered = 0, ok = 1, nb = hs_batches(s, dp, MODEL_B), most = 0;
        for (int r = 0; r < dp; r++) {
            int lo, hi, rank_nb = 0;
            hs_rank_range(s->n, dp, r, &lo, &hi);
            ok &= lo == covered || lo == hi;
            covered = hi > covered ? hi : covered;
            for (int k = lo; k < hi; rank_nb++) k += hs_fits(s, k, hi, MODEL_B);
            most = rank_nb > most ? rank_nb : most;
        }
        check(ok && covered == s->n && nb == most, "dp %d: the ranks' examples cover all %d once, in %d batches each",
              dp, s->n, nb);
    }
}

// ----------------------------------------------------------------------------
// scoring

// the brute force: each completion alone in row 0 after its context, its
// mean loss from the logits; the answer of each example into pred
static void brute_force(GPT2 *m, const HsSet *s, int *pred) {
    Acts *a = &m->acts[0];
    int V = m->config.V, Vp = m->config.Vp, T = m->T;
    for (int i = 0; i < s->n; i++) {
        const HsExample *e = &s->ex[i];
        double best = 0.0;
        for (int c = 0; c < e->ncomp; c++) {
            memset(a->inputs, 0, (size_t)m->B * T * sizeof(int));
            for (int t = 0; t < e->ctx_len; t++) a->inputs[t] = e->ctx[t];
            for (int t = 0; t < e->comp_len[c]; t++) a->inputs[e->ctx_len + t] = e->comp[c][t];
            stage_forward(m, a, 0);
            double sum = 0.0;
            for (int t = 0; t < e->comp_len[c]; t++) {
                const float *z = a->t[A_LOGITS] + (size_t)(e->ctx_len - 1 + t) * Vp;
                double mx = z[0], se = 0.0;
                for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
                for (int v = 0; v < V; v++) se += exp(z[v] - mx);
                sum += mx + log(se) - z[e->comp[c][t]];
            }
            double mean = sum / e->comp_len[c];
            if (c == 0 || mean < best) best = mean, pred[i] = c;
        }
    }
}

static float test_scoring(const HsSet *s) {
    char err[512];
    GPT2Config c;
    float *params = model_load(fixture_model, &c, err, sizeof(err));
    if (params == NULL) {
        check(0, "load %s: %s", fixture_model, err);
        return -1.0f;
    }
    GPT2 m;
    Parallel par;
    par_single(&par);
    gpt2_init_rank(&m, &c, params, 0, MODEL_B, MODEL_T, &par, 1);
    free(params);
    int brute[NEX], packed[NEX], right = 0, counted = 0, batches = 0;
    brute_force(&m, s, brute);
    HsBatch hb;
    hs_batch_init(&hb, MODEL_B, MODEL_T);
    Acts *a = &m.acts[0];
    for (int next = 0; next < s->n; batches++) {
        hs_batch_fill(s, &next, s->n, &hb, a->inputs, a->targets);
        stage_forward(&m, a, 1);
        counted += hs_batch_score(s, &hb, a->t[A_LOSSES], packed + hb.first);
    }
    hs_batch_free(&hb);
    int same = 1;
    for (int i = 0; i < s->n; i++) {
        same &= packed[i] == brute[i];
        right += brute[i] == s->ex[i].label;
    }
    check(same && counted == right, "packed into %d batches of %d rows, scored from the losses: the brute force's "
          "answers, %d of %d right", batches, MODEL_B, counted, s->n);
    gpt2_free(&m);
    return (float)right / s->n;
}

// ----------------------------------------------------------------------------
// the trainer

// runs ./train_gpt2 with args; its output into out; the "hellaswag" of the
// log lines of steps 0..7 into acc (-1 when absent)
static int run_trainer(const char *args, float acc[8], char *out, size_t outlen) {
    char cmd[2048], log[300], line[1024];
    snprintf(log, sizeof(log), "%s/log.jsonl", dir);
    unlink(log);
    snprintf(cmd, sizeof(cmd), "timeout 120 ./train_gpt2 -e %s -b %d -t %d -i '%s/train.bin' -j '%s/train.bin' -lg %s "
             "-s 0 -th 1 %s", fixture_model, MODEL_B, MODEL_T, dir, dir, log, args);
    int rc = test_run(cmd, 1, out, outlen);
    for (int k = 0; k < 8; k++) acc[k] = -1.0f;
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof(line), f)) {
        const char *s = test_log_value(line, "step"), *h = test_log_value(line, "hellaswag");
        int step = s != NULL ? atoi(s) : -1;
        if (step >= 0 && step < 8 && h != NULL) acc[step] = strtof(h, NULL);
    }
    if (f) fclose(f);
    return rc;
}

static void test_trainer(const char *file, float brute_acc) {
    if (access("./train_gpt2", X_OK) != 0) { skip("./train_gpt2 not built"); return; }
    char args[600], out[65536], want[64];
    snprintf(want, sizeof(want), "HellaSwag: %d/%d = ", (int)lroundf(brute_acc * NEX), NEX);
    // lr 0: one step leaves the model as it was, so the final evaluation scores the fixture
    const char *layouts[] = {"", "-np 2", "-np 2 -tp 2", "-np 4 -pp 2 -z 3", "-np 4 -z 1"};
    for (int k = 0; k < 5; k++) {
        snprintf(args, sizeof(args), "-l 0 -x 1 -v 1 -m 1 -h 1 -hf %s %s", file, layouts[k]);
        float acc[8];
        int rc = run_trainer(args, acc, out, sizeof(out));
        int ok = check(rc == 0 && fabsf(acc[1] - brute_acc) < 1e-6f && strstr(out, want) != NULL,
                       "train_gpt2 -h 1 %s: the final model's HellaSwag %.6f in the log (brute force %.6f), '%s' printed",
                       layouts[k][0] ? layouts[k] : "(one rank)", acc[1], brute_acc, want);
        if (!ok) printf("%s\n", out);
    }
    // HellaSwag runs with the evaluations after step 0 (as llm.c's): -v 2 -x 4 logs it at steps 2 and 4 only
    snprintf(args, sizeof(args), "-x 4 -v 2 -m 1 -h 1 -hf %s", file);
    float a[8];
    int rc = run_trainer(args, a, out, sizeof(out));
    check(rc == 0 && a[0] < 0 && a[1] < 0 && a[2] >= 0 && a[3] < 0 && a[4] >= 0,
          "-v 2 -x 4: HellaSwag logged at steps 2 and 4 (the final model), not at 0, 1 or 3");
    // the flag itself
    struct { const char *args, *want; int rc; } cli[] = {
        {"-h 2", "flag -h: 2 is out of range [0, 1]", 2},
        {"-h 1 -hf /nonexistent.bin", "flag -hf (the HellaSwag examples): /nonexistent.bin: cannot open: No such file or "
         "directory", 2},
        {"-h", "usage:", 0},
        {"--help", "usage:", 0},
        {"-x 1 -h -b 8", "usage:", 0},
    };
    for (size_t i = 0; i < sizeof(cli) / sizeof(cli[0]); i++) {
        rc = run_trainer(cli[i].args, a, out, sizeof(out));
        check(rc == cli[i].rc && strstr(out, cli[i].want) != NULL, "train_gpt2 %s -> exit %d, '%s'", cli[i].args, rc,
              cli[i].want);
    }
}

// a pseudo-terminal: its master's fd, and its slave's path into name (for
// test_spawn to open as the child's stdout); -1 where there is none
static int open_pty(char *name, size_t len) {
    int fd = open("/dev/ptmx", O_RDWR | O_NOCTTY), unlock = 0, n = -1;
    if (fd >= 0 && (ioctl(fd, TIOCSPTLCK, &unlock) != 0 || ioctl(fd, TIOCGPTN, &n) != 0)) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0) snprintf(name, len, "/dev/pts/%d", n);
    return fd;
}

// HellaSwag's progress, as llm.c prints it: on a terminal the line
// "evaluating HellaSwag: i/n" rewritten in place (\r), wiped before the
// result; into a pipe (a short evaluation) nothing
static void test_progress(const char *file) {
    char slave[64], cmd[1200], out[65536];
    int master = open_pty(slave, sizeof(slave));
    if (master < 0) { skip("HellaSwag's progress on a terminal: no pseudo-terminal here"); return; }
    char args[600];
    snprintf(args, sizeof(args), "./train_gpt2 -e %s -b %d -t %d -i %s/train.bin -j %s/train.bin -s 0 -th 1 -l 0 -x 2 "
             "-v 1 -m 1 -h 1 -hf %s", fixture_model, MODEL_B, MODEL_T, dir, dir, file);
    char *argv[64];
    int n = 0;
    for (char *t = strtok(args, " "); t != NULL && n < 63; t = strtok(NULL, " ")) argv[n++] = t;
    argv[n] = NULL;
    pid_t pid = test_spawn(argv, NULL, slave, NULL);
    size_t got = 0;
    int status = -1;
    double t0 = test_now();
    for (;;) {  // read the terminal until the child is gone and its output read (EIO), at most 60 s
        struct pollfd pfd = {master, POLLIN, 0};
        ssize_t k = 0;
        if (poll(&pfd, 1, 100) == 1) k = read(master, out + got, sizeof(out) - 1 - got);
        if (k > 0) { got += (size_t)k; continue; }
        if (status < 0 && waitpid(pid, &status, WNOHANG) == pid) status = test_exit_status(status);
        if ((status >= 0 && k < 0) || test_now() - t0 > 60.0 || got == sizeof(out) - 1) break;
    }
    out[got] = '\0';
    close(master);
    if (status < 0) status = test_wait(pid, 5.0, NULL);
    int shown = test_count(out, "\revaluating HellaSwag: 0/");  // (after step 0: at steps 1 and 2)
    check(status == 0 && shown == 2 && strstr(out, "\r                                                \rHellaSwag: ") != NULL,
          "-h 1 on a terminal: \"evaluating HellaSwag: 0/n\" at each of the 2 evaluations, in place (\\r), then "
          "wiped for the result (%d shown, exit %d)", shown, status);
    // into a pipe, a short evaluation prints no progress at all
    snprintf(cmd, sizeof(cmd), "timeout 60 ./train_gpt2 -e %s -b %d -t %d -i %s/train.bin -j %s/train.bin -s 0 -th 1 "
             "-l 0 -x 2 -v 1 -m 1 -h 1 -hf %s", fixture_model, MODEL_B, MODEL_T, dir, dir, file);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, "evaluating HellaSwag") == NULL && test_count(out, "\nHellaSwag: ") == 2,
          "-h 1 into a pipe: a short evaluation prints its result only, no progress lines (exit %d)", rc);
}

// ----------------------------------------------------------------------------
// prepare_data hellaswag

// prepare_data hellaswag, what it takes and leaves: each field once, a
// label that is a JSON integer and nothing else; after an error no -o
// directory it made; without --encoder and --vocab, the BPE files where
// prepare_data finds them; a FIFO as -i refused at once; links planted
// where it writes never written through
static void test_prepare_input_checks(const char *enc, const char *voc) {
    char path[300], out_dir[300], cmd[2048], out[1024];
    snprintf(path, sizeof(path), "%s/in.jsonl", dir);
    snprintf(out_dir, sizeof(out_dir), "%s/hs_fresh", dir);
    struct { const char *line, *want; } cases[] = {
        {"{\"ctx\": \"a\", \"label\": 0, \"endings\": [\"b\"], \"endings\": [\"c\", \"d\"]}", "in.jsonl:1: field endings appears twice"},
        {"{\"ctx\": \"a\", \"ctx\": \"b\", \"label\": 0, \"endings\": [\"b\"]}", "in.jsonl:1: field ctx appears twice"},
        {"{\"ctx\": \"a\", \"label\": 0, \"label\": 1, \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label appears twice"},
        {"{\"ctx\": \"a\", \"label\": +1, \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label is not an integer"},
        {"{\"ctx\": \"a\", \"label\": 1abc, \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label is not an integer"},
        {"{\"ctx\": \"a\", \"label\": 01, \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label is not an integer"},
        {"{\"ctx\": \"a\", \"label\": 1.0, \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label is not an integer"},
        {"{\"ctx\": \"a\", \"label\": \"1\", \"endings\": [\"b\", \"c\"]}", "in.jsonl:1: field label is not an integer"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char text[300];
        snprintf(text, sizeof(text), "%s\n", cases[k].line);
        test_write_file(path, text, strlen(text));
        snprintf(cmd, sizeof(cmd), "./prepare_data hellaswag -i %s -o %s --encoder %s --vocab %s", path, out_dir, enc, voc);
        int rc = test_run(cmd, 1, out, sizeof(out));
        check(rc == 2 && strstr(out, cases[k].want) != NULL && test_count(out, "\n") == 1 && !test_exists("%s", out_dir),
              "%s: exit %d, one line, no -o directory left: %.*s", cases[k].line, rc, (int)strcspn(out, "\n"), out);
    }
    const char *good = "{\"ctx\": \"a\", \"label\": 1, \"endings\": [\"b\", \"c\"]}\n";
    test_write_file(path, good, strlen(good));
    // no --encoder and --vocab: found where prepare_data finds them (here ../shared/data, the test data's default)
    char shared[300];
    snprintf(shared, sizeof(shared), "../shared/data/gpt2/encoder.json");
    if (access(shared, R_OK) == 0 && access("../shared/data/gpt2/vocab.bpe", R_OK) == 0) {
        snprintf(cmd, sizeof(cmd), "env -u LLM3D_DATA ./prepare_data hellaswag -i %s -o %s", path, out_dir);
        int rc = test_run(cmd, 1, out, sizeof(out));
        char bin[400];
        snprintf(bin, sizeof(bin), "%s/in.bin", out_dir);
        check(rc == 0 && access(bin, R_OK) == 0, "no --encoder and --vocab, $LLM3D_DATA unset: the BPE files of "
              "../shared/data/gpt2, as prepare_data finds them (exit %d): %.*s", rc, (int)strcspn(out, "\n"), out);
    } else {
        skip("the default data folder ../shared/data has no GPT-2 BPE files: prepare_data hellaswag without --encoder");
    }
    // its help: the usage on stdout, exit 0, as prepare_data's own -h
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof(cmd), "(./prepare_data hellaswag %s 2>/dev/null)", k == 0 ? "-h" : "--help");
        int rc = test_run(cmd, 1, out, sizeof(out));
        check(rc == 0 && strncmp(out, "usage: ./prepare_data hellaswag", 31) == 0, "prepare_data hellaswag %s -> exit %d, "
              "the usage on stdout: %.*s", k == 0 ? "-h" : "--help", rc, (int)strcspn(out, "\n"), out);
    }
    // a FIFO as the input
    char fifo[300];
    snprintf(fifo, sizeof(fifo), "%s/in_fifo.jsonl", dir);
    if (mkfifo(fifo, 0600) == 0) {
        snprintf(cmd, sizeof(cmd), "timeout -s KILL 10 ./prepare_data hellaswag -i %s -o %s --encoder %s --vocab %s", fifo,
                 out_dir, enc, voc);
        double t0 = test_now();
        int rc = test_run(cmd, 1, out, sizeof(out));
        check(rc == 2 && strstr(out, "in_fifo.jsonl: not a regular file") != NULL, "prepare_data hellaswag -i FIFO: "
              "refused at once (exit %d in %.1f s): %.*s", rc, test_now() - t0, (int)strcspn(out, "\n"), out);
        unlink(fifo);
    }
    // links planted at the file's name and at its temporary name, to a file outside
    char victim[300], link[400];
    snprintf(victim, sizeof(victim), "%s/victim.txt", dir);
    test_write_file(victim, "precious\n", 9);
    mkdir(out_dir, 0755);
    snprintf(link, sizeof(link), "%s/in.bin", out_dir);
    unlink(link);
    int planted = symlink(victim, link) == 0;
    snprintf(cmd, sizeof(cmd), "./prepare_data hellaswag -i %s -o %s --encoder %s --vocab %s", path, out_dir, enc, voc);
    int rc = test_run(cmd, 1, out, sizeof(out));
    char *kept = test_read_text(victim);
    struct stat st;
    check(planted && rc == 0 && strcmp(kept, "precious\n") == 0 && lstat(link, &st) == 0 && S_ISREG(st.st_mode),
          "a link planted at the output's name: replaced by the file, the file it pointed to untouched (exit %d)", rc);
    free(kept);
    snprintf(link, sizeof(link), "%s/in.bin.tmp", out_dir);
    planted = symlink(victim, link) == 0;
    rc = test_run(cmd, 1, out, sizeof(out));
    kept = test_read_text(victim);
    check(planted && rc == 1 && strcmp(kept, "precious\n") == 0 && strstr(out, "in.bin.tmp: a symbolic link") != NULL,
          "a link planted at the output's temporary name: refused, not followed (exit %d): %.*s", rc,
          (int)strcspn(out, "\n"), out);
    free(kept);
}

static void test_prepare(void) {
    char enc[512], voc[512], cmd[2048], path[300], err[1024];
    if (!test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("prepare_data hellaswag: no GPT-2 BPE files in the test data");
        return;
    }
    if (access("./prepare_data", X_OK) != 0) { skip("./prepare_data not built"); return; }
    snprintf(path, sizeof(path), "%s/hs_val.jsonl", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"ind\": 24, \"ctx\": \"A man is sitting on a roof. he\", \"split\": \"val\", \"label\": 3, "
               "\"endings\": [\"is using wrap to wrap a pair of skis.\", \"is ripping level tiles off.\", "
               "\"is holding a rubik's cube.\", \"starts pulling up roofing on a roof.\"], \"n\": [1, {\"x\": null}]}\n"
               "\n"
               "{\"ctx\": \"caf\\u00e9 \\\"q\\\" \\ud83d\\ude00\", \"label\": 0, \"endings\": [\"a\\tb\", \"<|endoftext|>\"]}\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "./prepare_data hellaswag -i %s -o %s/hs --encoder %s --vocab %s > %s/prep.txt 2>&1",
             path, dir, enc, voc, dir);
    if (!check(system(cmd) == 0, "prepare_data hellaswag on 2 JSON lines and a blank one")) return;
    snprintf(path, sizeof(path), "%s/hs/hs_val.bin", dir);
    HsSet s;
    int rc = hs_read(&s, path, 50257, 1024, 4, err, sizeof(err));
    if (!check(rc == 0 && s.n == 2, "its file, named after the input, reads back%s%s", rc ? ": " : "", rc ? err : ""))
        return;
    // GPT-2's tokens of the context (tiktoken's "gpt2"), written down
    static const uint16_t roof[] = {32, 582, 318, 5586, 319, 257, 9753, 13, 339};
    Bpe bpe;
    bpe_load(&bpe, enc, voc, err, sizeof(err));
    int *ids;
    size_t n;
    const char *texts[] = {" is holding a rubik's cube.", "caf\xc3\xa9 \"q\" \xf0\x9f\x98\x80", " <|endoftext|>"};
    int same[3];
    const HsExample *got[3] = {&s.ex[0], &s.ex[1], &s.ex[1]};
    for (int k = 0; k < 3; k++) {
        bpe_encode(&bpe, texts[k], strlen(texts[k]), 0, &ids, &n);
        const uint16_t *t = k == 0 ? got[k]->comp[2] : k == 1 ? got[k]->ctx : got[k]->comp[1];
        int len = k == 0 ? got[k]->comp_len[2] : k == 1 ? got[k]->ctx_len : got[k]->comp_len[1];
        same[k] = len == (int)n;
        for (int i = 0; same[k] && i < len; i++) same[k] &= t[i] == ids[i];
        free(ids);
    }
    bpe_free(&bpe);
    check(s.ex[0].ctx_len == 9 && memcmp(s.ex[0].ctx, roof, sizeof(roof)) == 0 && s.ex[0].label == 3 &&
          s.ex[0].ncomp == 4, "example 0: the context's GPT-2 tokens, label 3, 4 endings");
    check(same[0] && same[1] && same[2] && s.ex[1].label == 0 && s.ex[1].ncomp == 2,
          "endings with a space before them, JSON escapes and surrogate pairs decoded, <|endoftext|> as plain text");
    hs_free(&s);
    // a bad line: one line naming the file, the line and the field
    snprintf(path, sizeof(path), "%s/bad.jsonl", dir);
    f = fopen(path, "w");
    fprintf(f, "{\"ctx\": \"a\", \"label\": 0, \"endings\": [\"b\"]}\n{\"ctx\": \"a\", \"endings\": [\"b\"]}\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "./prepare_data hellaswag -i %s -o %s/hs --encoder %s --vocab %s", path, dir, enc, voc);
    char out[1024];
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 2 && strstr(out, "bad.jsonl:2: no field label") != NULL,
          "a line without a label: exit 2, '%.*s'", (int)strcspn(out, "\n"), out);
    test_prepare_input_checks(enc, voc);
}

int main(void) {
    if (test_make_dir(dir, sizeof(dir), "/tmp/llm3d_hellaswag_XXXXXX") != 0) {
        check(0, "mkdtemp");
        return test_summary();
    }
    HsExample ex[NEX];
    make_examples(ex, 500);
    char good[300], err[512], shard[300];
    snprintf(good, sizeof(good), "%s/hs.bin", dir);
    snprintf(shard, sizeof(shard), "%s/train.bin", dir);
    int wrote = hs_write(good, ex, NEX, err, sizeof(err)) == 0;
    if (check(wrote, "write %d examples%s%s", NEX, wrote ? "" : ": ", wrote ? "" : err)) {
        test_file(ex, good);
        HsSet s;
        if (hs_read(&s, good, 500, MODEL_T, MODEL_B, err, sizeof(err)) == 0) {
            test_split(&s);
            float acc = test_scoring(&s);
            if (acc >= 0 && check(test_write_shard(shard, 40000) == 0, "a shard in %s", dir)) {
                test_trainer(good, acc);
                if (access("./train_gpt2", X_OK) == 0) test_progress(good);
            }
            hs_free(&s);
        }
    }
    test_prepare();
    test_remove_dir(dir);
    return test_summary();
}
