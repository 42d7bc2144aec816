/*
 * test_plot.c: plot_log, run as a program on small logs this test writes:
 * the SVG is well formed, holds one polyline per series with a point per
 * logged value, placed at the frame's edges for the first and last step, the
 * baselines as labelled lines (or none), the HellaSwag panel only when a log
 * has it; a log resumed under another batch: throughput from each step's
 * own tokens, --x tokens at each line's count; and its errors name the file
 * and line. Then dev/compare_logs, the
 * check of reference_cpu.sh, on the same kind of logs: identical, within
 * its tolerances, outside them, and cut short; its -h and pipeline_chart's.
 * Last, the header's step count, the note of lines cut at an axis, FIFOs
 * given as logs and links planted where the SVG goes; -o naming a log it
 * reads is refused.
 *
 *   make dev/test/test_plot plot_log dev/compare_logs dev/pipeline_chart && ./dev/test/test_plot
 */
#include "dev/test/test.h"
#include "dev/test/test_run.h"

#include <math.h>
#include <sys/stat.h>

static char tmp_dir[64];

// write_log: steps 0..steps-1 with train loss, val loss every 25 steps and at
// the last, HellaSwag (a fraction) every 50 when with_hellaswag
static void write_log(const char *path, int steps, double offset, int with_hellaswag, int with_tokens) {
    FILE *f = fopen(path, "w");
    for (int s = 0; s < steps; s++) {
        double loss = 4.0 + 6.0 / (1.0 + s / 10.0) + offset;
        fprintf(f, "{\"step\": %d, \"loss\": %.6f", s, loss);
        if (s % 25 == 0 || s == steps - 1) fprintf(f, ", \"val_loss\": %.6f", loss + 0.1);
        else if (s % 25 == 1) fprintf(f, ", \"val_loss\": null");  // not measured, said so
        if (with_hellaswag && (s % 50 == 0 || s == steps - 1)) fprintf(f, ", \"hellaswag\": %.4f", 0.25 + 0.0005 * s);
        fprintf(f, ", \"norm\": 1.5, \"lr\": %.6e, \"ms\": %.3f", 1e-3 * (s < 10 ? (s + 1) / 10.0 : 1.0), 100.0 + s % 7);
        if (with_tokens) fprintf(f, ", \"tokens\": %d", 4096 * (s + 1));  // tokens seen, as log_line writes it
        if (with_hellaswag)  // a pipeline's bubble, as the CPU trainer logs it with pp > 1
            fprintf(f, ", \"bubble\": %.4f, \"bubble_sim\": 0.2000, \"op_us\": [10, 20, 0]", 0.25 - 0.0002 * s);
        fprintf(f, ", \"extra\": {\"nested\": [1, \"x\"]}}\n");
        if (s == 3) fprintf(f, "\n");  // a blank line is read past
    }
    fclose(f);
}

// well_formed: every element opened in the SVG is closed, in order, and it is one <svg> element
static int well_formed(const char *svg) {
    char stack[64][32];
    int depth = 0, roots = 0;
    for (const char *p = strchr(svg, '<'); p != NULL; p = strchr(p + 1, '<')) {
        const char *end = strchr(p, '>');
        if (end == NULL) return 0;
        if (p[1] == '/') {
            size_t n = strcspn(p + 2, ">");
            if (depth == 0 || strlen(stack[depth - 1]) != n || strncmp(stack[depth - 1], p + 2, n) != 0) return 0;
            depth--;
        } else if (end[-1] != '/') {
            if (depth == 64) return 0;
            size_t n = strcspn(p + 1, " >");
            snprintf(stack[depth++], sizeof(stack[0]), "%.*s", (int)n, p + 1);
            if (depth == 1) roots++;
        }
    }
    return depth == 0 && roots == 1 && strncmp(svg, "<svg", 4) == 0;
}

// points_of: the number of points of the polyline of class cls, and its first and last x; -1 if absent
static int points_of(const char *svg, const char *cls, double *first_x, double *last_x) {
    char want[64];
    snprintf(want, sizeof(want), "class=\"%s\"", cls);
    const char *p = strstr(svg, want);
    if (p == NULL || (p = strstr(p, "points=\"")) == NULL) return -1;
    p += 8;
    int n = 0;
    while (*p != '"') {
        double x, y;
        int used;
        if (sscanf(p, "%lf,%lf%n", &x, &y, &used) != 2) return -1;
        if (n == 0) *first_x = x;
        *last_x = x;
        n++;
        p += used;
        while (*p == ' ') p++;
    }
    return n;
}

// the x of point i (from 0) of the polyline of class cls, or NAN
static double point_x(const char *svg, const char *cls, int i) {
    char want[64];
    snprintf(want, sizeof(want), "class=\"%s\"", cls);
    const char *p = strstr(svg, want);
    if (p == NULL || (p = strstr(p, "points=\"")) == NULL) return NAN;
    p += 8;
    for (int n = 0; *p != '"'; n++) {
        double x, y;
        int used;
        if (sscanf(p, "%lf,%lf%n", &x, &y, &used) != 2) return NAN;
        if (n == i) return x;
        p += used;
        while (*p == ' ') p++;
    }
    return NAN;
}

// a log resumed at step 10 under twice the batch: its "tokens" count on by
// 8192 a step from 40960 (what the trainers log across a resume). The
// throughput is each step's own tokens over its ms, 40960 tokens/s before
// and 81920 after (61440 mean), and --x tokens puts each point at its line's
// count: step 9's at 40960 on an axis from 4096 to 122880
static void test_resumed_batch(void) {
    char log[128], svg_path[128], cmd[512], out[4096];
    snprintf(log, sizeof(log), "%s/resumed.jsonl", tmp_dir);
    snprintf(svg_path, sizeof(svg_path), "%s/resumed.svg", tmp_dir);
    FILE *f = fopen(log, "w");
    for (int s = 0; s < 20; s++) {
        long tokens = s < 10 ? 4096L * (s + 1) : 40960L + 8192L * (s - 9);
        fprintf(f, "{\"step\": %d, \"loss\": %.6f, \"ms\": 100.000, \"tokens\": %ld}\n", s, 5.0 - 0.1 * s, tokens);
    }
    fclose(f);
    snprintf(cmd, sizeof(cmd), "./plot_log %s -o %s --baselines none", log, svg_path);
    int rc = test_run(cmd, 1, out, sizeof(out));
    char *svg = test_read_file(svg_path, NULL);
    const char *at = svg != NULL ? strstr(svg, " tokens/s mean") : NULL, *digits = at;
    while (digits != NULL && digits > svg && digits[-1] >= '0' && digits[-1] <= '9') digits--;
    long mean = digits != NULL && digits < at ? atol(digits) : -1;
    check(rc == 0 && mean == 61440, "a log resumed under twice the batch: throughput from each step's own tokens, "
          "%ld tokens/s mean (61440) (exit %d)", mean, rc);
    free(svg);
    snprintf(cmd, sizeof(cmd), "./plot_log %s -o %s --baselines none --x tokens", log, svg_path);
    rc = test_run(cmd, 1, out, sizeof(out));
    svg = test_read_file(svg_path, NULL);
    double want = 80.0 + (40960.0 - 4096.0) / (122880.0 - 4096.0) * 850.0;  // the frame: x 80 to 930
    double x9 = svg != NULL ? point_x(svg, "run train_loss", 9) : NAN;
    double x19 = svg != NULL ? point_x(svg, "run train_loss", 19) : NAN;
    check(rc == 0 && fabs(x9 - want) < 0.11 && x19 == 930.0, "--x tokens on it: step 9 at x %.1f (%.1f: 40960 tokens), "
          "step 19 at the right edge (x %.1f) (exit %d)", x9, want, x19, rc);
    free(svg);
}

// dev/compare_logs against the 120-step log at path: itself, shifted by less
// and by more than its tolerances, and cut to 60 steps
static void test_compare_logs(const char *path) {
    if (access("./dev/compare_logs", X_OK) != 0) {
        skip("./dev/compare_logs not built");
        return;
    }
    char near[128], far[128], val_far[128], cut[128], cmd[1024], out[4096];
    snprintf(near, sizeof(near), "%s/near.jsonl", tmp_dir);
    snprintf(far, sizeof(far), "%s/far.jsonl", tmp_dir);
    snprintf(val_far, sizeof(val_far), "%s/val_far.jsonl", tmp_dir);
    snprintf(cut, sizeof(cut), "%s/cut.jsonl", tmp_dir);
    write_log(near, 120, 0.005, 0, 1);  // train and val 0.005 above: within 0.02 and 0.01
    write_log(far, 120, 0.08, 0, 1);    // 0.08: outside both
    write_log(cut, 60, 0.0, 1, 1);
    FILE *f = fopen(val_far, "w");     // the train losses of path, one val loss 0.04 off
    for (int s = 0; s < 120; s++) {
        double loss = 4.0 + 6.0 / (1.0 + s / 10.0);
        fprintf(f, "{\"step\": %d, \"loss\": %.6f", s, loss);
        if (s % 25 == 0 || s == 119) fprintf(f, ", \"val_loss\": %.6f", loss + 0.1 + (s == 50 ? 0.04 : 0.0));
        fprintf(f, "}\n");
    }
    fclose(f);
    struct { const char *run, *flags, *want; int rc; } cases[] = {
        {path, "", "every loss identical as logged", 0},
        {near, "", "ok: the run reproduces", 0},
        {far, "", "largest difference 0.0800 at step", 1},
        {val_far, "", "largest difference 0.0400 at step 50", 1},
        {val_far, "--val-tol 0.05", "ok: the run reproduces", 0},
        {cut, "", "not a whole run", 1},
        {cut, "--prefix", "train loss in 1 windows of 50 steps", 0},
        // a window that is no whole number of steps, or past an int: one line, exit 2 (3e9 once wrapped to a
        // negative window and read past the curve; 2.5 was cut to 2)
        {path, "--window 3000000000", "--window '3000000000': want a whole number of steps in 1..100000000", 2},
        {path, "--window 2.5", "--window '2.5': want a whole number of steps", 2},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        snprintf(cmd, sizeof(cmd), "./dev/compare_logs %s %s %s", cases[k].run, path, cases[k].flags);
        int rc = test_run(cmd, 1, out, sizeof(out));
        check(rc == cases[k].rc && strstr(out, cases[k].want) != NULL, "compare_logs %s %s -> exit %d, says '%s'",
              strrchr(cases[k].run, '/') + 1, cases[k].flags, rc, cases[k].want);
    }
}

// -h and --help of the dev tools here: the usage on stdout, exit 0, as
// plot_log's, prepare_data's and export_hf's (they had said it on stderr
// with exit 2, or taken -h for a bad argument)
static void test_tools_help(void) {
    const char *tools[] = {"./dev/compare_logs", "./dev/pipeline_chart"}, *flags[] = {"-h", "--help"};
    for (int t = 0; t < 2; t++) {
        if (access(tools[t], X_OK) != 0) {
            skip("%s not built", tools[t]);
            continue;
        }
        for (int f = 0; f < 2; f++) {
            char cmd[256], out[1024];
            snprintf(cmd, sizeof(cmd), "(%s %s 2>/dev/null)", tools[t], flags[f]);  // stdout alone
            int rc = test_run(cmd, 1, out, sizeof(out));
            check(rc == 0 && strncmp(out, "usage: ", 7) == 0, "%s %s -> exit %d, the usage on stdout: %.*s", tools[t],
                  flags[f], rc, (int)strcspn(out, "\n"), out);
        }
    }
}

// the steps in the header: a run of -x 200 logs steps 0..199 and then its
// final val loss as step 200; the header counts 200 steps. And the note that
// a panel's lines are cut at its axis, there only when they are.
static void test_header_and_cuts(void) {
    char log[128], flat[128], svg_path[128], cmd[1024], out[4096];
    snprintf(log, sizeof(log), "%s/x200.jsonl", tmp_dir);
    snprintf(flat, sizeof(flat), "%s/flat.jsonl", tmp_dir);
    FILE *f = fopen(log, "w");
    FILE *g = fopen(flat, "w");
    for (int s = 0; s < 200; s++) {
        fprintf(f, "{\"step\": %d, \"loss\": %.6f%s}\n", s, 4.0 + 6.0 / (1.0 + s / 10.0), s % 50 == 0 ? ", \"val_loss\": 5.0" : "");
        fprintf(g, "{\"step\": %d, \"loss\": %.6f}\n", s, 3.0 + 0.001 * (s % 3));
    }
    fprintf(f, "{\"step\": 200, \"val_loss\": 4.5}\n");
    fclose(f);
    fclose(g);
    snprintf(svg_path, sizeof(svg_path), "%s/x200.svg", tmp_dir);
    snprintf(cmd, sizeof(cmd), "./plot_log %s --baselines none", log);
    int rc = test_run(cmd, 1, out, sizeof(out));
    char *svg = test_read_text(svg_path);
    const char *cut = strstr(svg, "class=\"clipped\"");
    check(rc == 0 && strstr(svg, ">200 steps, val loss 4.5000 last") != NULL,
          "-x 200's log (steps 0..199, then the final val loss as step 200): the header says 200 steps (exit %d)", rc);
    check(rc == 0 && cut != NULL && strstr(cut, "cut at the axis: ") != NULL && strstr(cut, " above (up to 10)") != NULL,
          "the loss panel, whose axis leaves out the first steps' losses, says that its lines are cut there: %.80s",
          cut != NULL ? cut : "(no note)");
    free(svg);
    snprintf(svg_path, sizeof(svg_path), "%s/flat.svg", tmp_dir);
    snprintf(cmd, sizeof(cmd), "./plot_log %s --baselines none", flat);
    rc = test_run(cmd, 1, out, sizeof(out));
    svg = test_read_text(svg_path);
    check(rc == 0 && strstr(svg, "<svg") != NULL && strstr(svg, "class=\"clipped\"") == NULL,
          "a log whose losses all fit the axis: no note of a cut (exit %d)", rc);
    free(svg);
}

// files that are not what they seem: a FIFO where a log is read is refused
// at once, not waited on; links planted where the SVG goes are never written
// through
static void test_fifos_and_links(const char *log) {
    char fifo[128], cmd[1024], out[4096], victim[128], link[160], svg[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo.jsonl", tmp_dir);
    if (mkfifo(fifo, 0600) != 0) {
        skip("mkfifo %s", fifo);
        return;
    }
    struct { const char *what, *cmd; int rc; } cases[] = {  // compare_logs: 2 for an unreadable log
        {"plot_log FIFO", "./plot_log %s", 1},
        {"plot_log LOG -r FIFO", "./plot_log LOG -r %s", 1},
        {"compare_logs FIFO LOG", "./dev/compare_logs %s LOG", 2},
        {"compare_logs LOG FIFO", "./dev/compare_logs LOG %s", 2},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char form[256], *at;
        snprintf(form, sizeof(form), "timeout -s KILL 10 %s", cases[k].cmd);
        if ((at = strstr(form, "LOG")) != NULL) {  // the good log in place of LOG
            char rest[256];
            snprintf(rest, sizeof(rest), "%s", at + 3);
            snprintf(at, sizeof(form) - (size_t)(at - form), "%s%s", log, rest);
        }
        snprintf(cmd, sizeof(cmd), form, fifo);
        int rc = 0;
        double secs = 0.0;
        // called before check(), whose line reads rc
        int refused = test_fifo_refused(cmd, 1, fifo, cases[k].rc, out, sizeof(out), &rc, &secs);
        check(refused, "%s: refused at once (exit %d in %.1f s): %.*s", cases[k].what, rc, secs,
              (int)strcspn(out, "\n"), out);
    }

    // a link at the SVG's name, to a file outside: replaced by the SVG, the file untouched
    snprintf(victim, sizeof(victim), "%s/victim.txt", tmp_dir);
    snprintf(svg, sizeof(svg), "%s/linked.svg", tmp_dir);
    test_write_file(victim, "precious\n", 9);
    if (symlink(victim, svg) != 0) check(0, "symlink %s", svg);
    snprintf(cmd, sizeof(cmd), "./plot_log %s -o %s", log, svg);
    int rc = test_run(cmd, 1, out, sizeof(out));
    char *kept = test_read_text(victim), *drawn = test_read_text(svg);
    struct stat st;
    check(rc == 0 && strcmp(kept, "precious\n") == 0 && lstat(svg, &st) == 0 && S_ISREG(st.st_mode) &&
          strncmp(drawn, "<svg", 4) == 0, "-o through a planted link: the link is replaced by the SVG, the file it "
          "pointed to keeps its bytes (exit %d)", rc);
    free(kept);
    free(drawn);
    // a link at SVG.tmp: refused in one line, never written through
    snprintf(link, sizeof(link), "%s.tmp", svg);
    if (symlink(victim, link) != 0) check(0, "symlink %s", link);
    rc = test_run(cmd, 1, out, sizeof(out));
    kept = test_read_text(victim);
    check(rc == 1 && strcmp(kept, "precious\n") == 0 && strstr(out, "linked.svg.tmp: a symbolic link") != NULL &&
          test_count(out, "\n") == 1, "a link planted at the SVG's temporary name: refused, not followed (exit %d): %.*s",
          rc, (int)strcspn(out, "\n"), out);
    free(kept);
}

int main(void) {
    if (test_make_dir(tmp_dir, sizeof(tmp_dir), "/tmp/test_plot_XXXXXX") != 0) {
        printf("cannot make a temp dir\n");
        return 1;
    }
    if (access("./plot_log", X_OK) != 0) {
        skip("./plot_log not built (run from the repo root after make)");
        return test_summary();
    }
    char log[128], ref[128], svg_path[128], cmd[1024], out[4096];
    snprintf(log, sizeof(log), "%s/run.jsonl", tmp_dir);
    snprintf(ref, sizeof(ref), "%s/ref.jsonl", tmp_dir);
    snprintf(svg_path, sizeof(svg_path), "%s/run.svg", tmp_dir);
    write_log(log, 120, 0.0, 1, 1);
    write_log(ref, 100, 0.2, 0, 1);

    // the run and a reference, the GPT-2 baselines: written next to the log, as run.svg
    snprintf(cmd, sizeof(cmd), "./plot_log %s -r %s --ref-label 'llm.c <ref> & co'", log, ref);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, svg_path) != NULL, "plot_log run.jsonl -r ref.jsonl -> exit %d, writes run.svg: %.*s", rc,
          (int)strcspn(out, "\n"), out);
    char *svg = test_read_file(svg_path, NULL);
    if (!check(svg != NULL, "%s written", svg_path)) return test_summary();
    check(well_formed(svg), "the SVG is one <svg> element with every element closed");
    check(strstr(svg, "nan") == NULL && strstr(svg, "inf") == NULL, "no nan or inf anywhere in it");
    double first = 0, last = 0;
    int n = points_of(svg, "run train_loss", &first, &last);
    check(n == 120, "train loss: one point per step (%d of 120)", n);
    n = points_of(svg, "run val_loss", &first, &last);
    check(n == 6 && first == 80.0 && last == 930.0, "val loss: 6 points (steps 0, 25, .., 100, 119; nulls skipped), from the "
          "frame's left edge (x %.1f) to its right (x %.1f)", first, last);
    n = points_of(svg, "run hellaswag", &first, &last);
    check(n == 4, "HellaSwag: 4 points (%d)", n);
    n = points_of(svg, "ref val_loss", &first, &last);
    check(n == 5 && last < 930.0, "reference val loss: 5 points, ending before the run's last step (x %.1f)", last);
    check(points_of(svg, "run lr", &first, &last) == 120 && points_of(svg, "run tokens_per_s", &first, &last) == 120,
          "lr and tokens/s: one point per step");
    check(points_of(svg, "run bubble", &first, &last) == 120 && points_of(svg, "run bubble_sim", &first, &last) == 120 &&
              strstr(svg, ">Pipeline bubble<") != NULL,
          "a pipeline's bubble, measured and simulated: a panel of its own, one point per step");
    check(strstr(svg, "39792 tokens/s mean") != NULL, "throughput: 4096 tokens per step over its ms (mean 39792 tokens/s)");
    check(strstr(svg, "GPT-2 124M: 3.425 (FineWeb val)") != NULL && strstr(svg, "GPT-2 124M: 29.4%") != NULL &&
          strstr(svg, "GPT-3 124M: 33.7%") != NULL && test_count(svg, "class=\"baseline\"") == 4,
          "the baselines: GPT-2 124M val loss 3.425 and HellaSwag 29.4%%, GPT-3 124M 33.7%%, chance 25%%, as labelled lines");
    check(strstr(svg, "llm.c &lt;ref&gt; &amp; co: val") != NULL, "the reference's label is in the legend, escaped for XML");
    check(strstr(svg, "120 steps, val loss 4.") != NULL, "the header gives the steps and the last val loss");
    free(svg);

    // no baselines; no HellaSwag panel without HellaSwag; -o; --x tokens
    snprintf(svg_path, sizeof(svg_path), "%s/other.svg", tmp_dir);
    snprintf(cmd, sizeof(cmd), "./plot_log %s -o %s --baselines none --x tokens", ref, svg_path);
    rc = test_run(cmd, 1, out, sizeof(out));
    svg = test_read_file(svg_path, NULL);
    check(rc == 0 && svg != NULL && well_formed(svg) && strstr(svg, "3.425") == NULL && strstr(svg, "class=\"baseline\"") == NULL &&
          strstr(svg, ">HellaSwag<") == NULL && strstr(svg, ">Pipeline bubble<") == NULL && strstr(svg, "tokens seen") != NULL,
          "--baselines none --x tokens on a log without HellaSwag or a bubble: no baseline lines, no HellaSwag or bubble "
          "panel, tokens on x (exit %d)", rc);
    free(svg);

    // errors: one line, naming the file and the line
    char bad[128];
    snprintf(bad, sizeof(bad), "%s/bad.jsonl", tmp_dir);
    FILE *f = fopen(bad, "w");
    fprintf(f, "{\"step\": 0, \"loss\": 5.0}\n{\"step\": 1, \"loss\": 4.9}\n{\"step\": 2, \"loss\": 4.8,}\n");
    fclose(f);
    snprintf(cmd, sizeof(cmd), "./plot_log %s", bad);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "bad.jsonl line 3 column 25: expected a string key") != NULL, "a bad line -> exit %d: %.*s", rc,
          (int)strcspn(out, "\n"), out);
    f = fopen(bad, "w");
    fprintf(f, "{\"loss\": 5.0}\n");
    fclose(f);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "line 1") != NULL && strstr(out, "no \"step\" field") != NULL, "a line without a step -> exit %d: %.*s",
          rc, (int)strcspn(out, "\n"), out);
    snprintf(cmd, sizeof(cmd), "./plot_log %s/none.jsonl", tmp_dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "none.jsonl: cannot open") != NULL, "a missing log -> exit %d", rc);
    write_log(bad, 10, 0.0, 0, 0);
    snprintf(cmd, sizeof(cmd), "./plot_log %s --x tokens", bad);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "no \"tokens\" field") != NULL, "--x tokens on a log without tokens -> exit %d", rc);
    snprintf(cmd, sizeof(cmd), "./plot_log %s --baselines gpt3", log);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 2 && strstr(out, "--baselines 'gpt3'") != NULL, "--baselines gpt3 -> exit %d (flag error)", rc);
    // -o naming a log it reads, by its name or through a link: refused, the log keeps its bytes (the SVG
    // was renamed over it)
    char own[128], link[160];
    snprintf(own, sizeof(own), "%s/own.jsonl", tmp_dir);  // a log of its own: the later checks keep theirs
    snprintf(link, sizeof(link), "%s/link.jsonl", tmp_dir);
    write_log(own, 20, 0.0, 0, 1);
    char *before = test_read_text(own);
    if (symlink(own, link) != 0) check(0, "symlink %s", link);
    const char *forms[] = {"./plot_log %s -o %s", "./plot_log %s -o %s", "./plot_log %s -r %s -o %s"};
    const char *what[] = {"the log", "the log, read through a link", "the reference (-r)"};
    for (int k = 0; k < 3; k++) {
        if (k == 0) snprintf(cmd, sizeof(cmd), forms[k], own, own);
        if (k == 1) snprintf(cmd, sizeof(cmd), forms[k], link, own);
        if (k == 2) snprintf(cmd, sizeof(cmd), forms[k], bad, own, own);
        rc = test_run(cmd, 1, out, sizeof(out));
        char *after = test_read_text(own);
        if (rc == 0) write_log(own, 20, 0.0, 0, 1);  // an SVG replaced it: the next case gets a log again
        check(rc == 2 && strcmp(before, after) == 0 && strstr(out, "which the SVG would replace") != NULL &&
              test_count(out, "\n") == 1, "-o naming %s: refused (exit %d), the log unchanged: %.*s", what[k], rc,
              (int)strcspn(out, "\n"), out);
        free(after);
    }
    free(before);

    test_resumed_batch();
    test_compare_logs(log);
    test_tools_help();
    test_header_and_cuts();
    test_fifos_and_links(log);

    test_remove_dir(tmp_dir);
    return test_summary();
}
