/*
 * plot_log.c: a run's JSON-lines log drawn as an SVG file, which any browser
 * opens; nothing to install.
 *
 *   ./plot_log out/log.jsonl [-o out/log.svg] [-r ref/log.jsonl] [--ref-label TEXT]
 *              [--baselines gpt2|none] [--x step|tokens] [--title TEXT]
 *
 * Panels, top to bottom: the loss (train, and val where measured), HellaSwag
 * accuracy (when a log has it), the learning rate, throughput in tokens/s,
 * and a pipeline's bubble (when a log has it: the CPU trainer's pp > 1 runs
 * log each step's idle share measured, "bubble", and the simulator's for
 * the step's op costs, "bubble_sim"; drawn in %).
 * A reference run (-r, another log) is drawn dashed in lighter colours on the
 * same axes, and with --baselines gpt2 (the default) the published numbers to
 * beat are labelled horizontal lines: OpenAI's GPT-2 124M reaches a val loss
 * of 3.425 on FineWeb's val split (as llm.c measures it) and 29.4% on
 * HellaSwag; GPT-3's 124M reaches 33.7% on HellaSwag. The loss baseline is for
 * FineWeb: on other data (tinyshakespeare) give --baselines none.
 *
 * The log: one JSON object per line, as the trainers write it (gpt2.h's
 * log_line): "step" (required, from 0), and any of "loss", "val_loss", "lr",
 * "ms" (the step's time), "tokens" (tokens seen when the step is done, every
 * launch of the run together: a run resumed under another batch counts on
 * from its checkpoint; throughput is a step's tokens, its "tokens" less the
 * line before's, over its ms), "hellaswag" (accuracy as a
 * fraction, as llm.c logs it; a value above 1 is taken as a percentage), "bubble" and "bubble_sim".
 * Other fields are read past. A line that is not such an object stops the
 * tool with its file and line.
 *
 * --x tokens puts tokens seen (each line's "tokens"; for a line without it,
 * (step + 1) x the first step's tokens) on the x axis instead of the step, so
 * runs with different batch sizes line up.
 * The loss axis leaves out the losses of the first 10% of the steps when it
 * picks its range (they start near ln V = 10.8 and would flatten the rest);
 * lines that leave a panel are cut at its edge, and a note over the panel
 * ("cut at the axis: 9 points above (up to 10.8)") says so. The header's
 * step count is of the steps trained: the final val loss that a run of
 * -x N logs as step N is not one.
 *
 * The SVG is written to a temporary name and renamed into place, so -o may
 * not name a log it reads (refused, exit 2): the rename would replace it.
 *
 * Exit status: 0 written, 1 a file could not be read or written, 2 bad flags.
 */
#define _GNU_SOURCE  // strdup
#include "llm3d/errors.h"
#include "llm3d/files.h"
#include "llm3d/json.h"
#include "llm3d/log_reader.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define WIDTH 960
#define PANEL_HEIGHT 300
#define MARGIN_LEFT 80
#define MARGIN_RIGHT 30
#define MARGIN_TOP 50               // above each panel's frame: its title
#define MARGIN_BOTTOM 45            // below: tick labels and the x label
#define HEADER_HEIGHT 90
#define LOSS_RANGE_SKIP 0.10        // the first part of the run the loss axis ignores

// GPT-2 124M and GPT-3 124M, the numbers a reproduction is measured against
#define GPT2_124M_VAL_LOSS 3.425    // FineWeb val, as llm.c evaluates it
#define GPT2_124M_HELLASWAG 29.4
#define GPT3_124M_HELLASWAG 33.7

typedef struct {
    double *x, *y;
    double *t;          // each point's line's "tokens" (NAN: none), for --x tokens
    int n, cap;
} Series;

typedef struct {
    const char *path, *label;
    Series train, val, hellaswag, lr, tokens_per_s, bubble, bubble_sim;
    int has_tokens;             // a line had "tokens"
    double tokens_per_step;     // the first such line's step's tokens
    double prev_step, prev_tokens;  // the line before's (a step's tokens are its count less that line's)
    double last_step;           // the last step of any line
    double last_trained;        // the last step with a train loss, -1 if none
} RunLog;

typedef struct {
    const char *log, *out, *ref, *ref_label, *title;
    int baselines, x_tokens;
} PlotOptions;

static void usage(FILE *f) {
    fprintf(f,
            "usage: plot_log LOG.jsonl [options]\n"
            "  -o FILE            the SVG to write (default: LOG with .jsonl replaced by .svg)\n"
            "  -r FILE            a reference run's log, drawn dashed on the same axes\n"
            "  --ref-label TEXT   the reference's name in the legends (default: its file name)\n"
            "  --baselines B      gpt2: GPT-2 124M's FineWeb val loss 3.425 and HellaSwag 29.4%%, GPT-3 124M's\n"
            "                     HellaSwag 33.7%%, as labelled lines (default); none: no such lines\n"
            "  --x step|tokens    the x axis: optimizer steps (default), or tokens seen\n"
            "  --title TEXT       the title (default: the log's file name)\n");
}

static __attribute__((format(printf, 1, 2))) void usage_error(const char *fmt, ...) {
    fprintf(stderr, "plot_log: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see -h)\n");
    exit(2);
}

static void parse_options(PlotOptions *o, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    o->baselines = 1;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { usage(stdout); exit(0); }
        if (flag[0] != '-') {
            if (o->log != NULL) usage_error("two logs given ('%s'): give one, and the reference with -r", flag);
            o->log = flag;
            continue;
        }
        int known = strcmp(flag, "-o") == 0 || strcmp(flag, "-r") == 0 || strcmp(flag, "--ref-label") == 0 ||
                    strcmp(flag, "--baselines") == 0 || strcmp(flag, "--x") == 0 || strcmp(flag, "--title") == 0;
        if (!known) usage_error("unknown flag '%s'", flag);
        if (i + 1 >= argc || argv[i + 1][0] == '\0') usage_error("%s needs a value", flag);
        const char *value = argv[++i];
        if (strcmp(flag, "-o") == 0) o->out = value;
        else if (strcmp(flag, "-r") == 0) o->ref = value;
        else if (strcmp(flag, "--ref-label") == 0) o->ref_label = value;
        else if (strcmp(flag, "--title") == 0) o->title = value;
        else if (strcmp(flag, "--baselines") == 0) {
            if (strcmp(value, "gpt2") != 0 && strcmp(value, "none") != 0) usage_error("--baselines '%s': want gpt2 or none", value);
            o->baselines = strcmp(value, "gpt2") == 0;
        } else {
            if (strcmp(value, "step") != 0 && strcmp(value, "tokens") != 0) usage_error("--x '%s': want step or tokens", value);
            o->x_tokens = strcmp(value, "tokens") == 0;
        }
    }
    if (o->log == NULL) usage_error("no log given");
}

// ----------------------------------------------------------------------------
// reading a log

// the point (x, y) of a line whose "tokens" is t
static int series_add(Series *s, double x, double y, double t) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * (size_t)s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof(double));
        if (nx != NULL) s->x = nx;
        double *ny = nx != NULL ? realloc(s->y, cap * sizeof(double)) : NULL;
        if (ny != NULL) s->y = ny;
        double *nt = ny != NULL ? realloc(s->t, cap * sizeof(double)) : NULL;
        if (nt == NULL) return -1;
        s->t = nt;
        s->cap = (int)cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->t[s->n] = t;
    s->n++;
    return 0;
}

static void series_free(Series *s) {
    free(s->x);
    free(s->y);
    free(s->t);
}

static void run_log_free(RunLog *r) {
    series_free(&r->train);
    series_free(&r->val);
    series_free(&r->hellaswag);
    series_free(&r->lr);
    series_free(&r->tokens_per_s);
    series_free(&r->bubble);
    series_free(&r->bubble_sim);
}

// run_log_add: one line's numbers into r (log_read calls it for each line)
static int run_log_add(void *ctx, const LogRecord *l, JsonReader *j) {
    RunLog *r = (RunLog *)ctx;
    double step = l->step, seen = l->tokens;
    // the step's own tokens: "tokens" counts from the run's start, and a
    // resume may have changed the batch, so its count less the line before's;
    // where that line is not the step before, the mean over the steps so far
    double per_step = NAN;
    if (!isnan(seen)) {
        if (step == 0) per_step = seen;
        else if (r->prev_step == step - 1 && !isnan(r->prev_tokens)) per_step = seen - r->prev_tokens;
        else per_step = seen / (step + 1);
        if (!r->has_tokens) r->tokens_per_step = per_step;
        r->has_tokens = 1;
    }
    r->prev_step = step;
    r->prev_tokens = seen;
    int bad = 0;
    if (!isnan(l->loss)) bad |= series_add(&r->train, step, l->loss, seen);
    if (!isnan(l->val_loss)) bad |= series_add(&r->val, step, l->val_loss, seen);
    if (!isnan(l->hellaswag))
        bad |= series_add(&r->hellaswag, step, l->hellaswag <= 1.0 ? 100.0 * l->hellaswag : l->hellaswag, seen);
    if (!isnan(l->lr)) bad |= series_add(&r->lr, step, l->lr, seen);
    if (!isnan(l->ms) && !isnan(per_step) && l->ms > 0)
        bad |= series_add(&r->tokens_per_s, step, per_step / (l->ms / 1000.0), seen);
    if (!isnan(l->bubble)) bad |= series_add(&r->bubble, step, 100.0 * l->bubble, seen);
    if (!isnan(l->bubble_sim)) bad |= series_add(&r->bubble_sim, step, 100.0 * l->bubble_sim, seen);
    if (bad) return json_fail(j, "out of memory");
    if (step > r->last_step) r->last_step = step;
    if (!isnan(l->loss) && step > r->last_trained) r->last_trained = step;
    return 0;
}

// run_log_read: the file's lines into r; 0 ok, -1 with err naming the file and line
static int run_log_read(const char *path, RunLog *r, char *err, size_t errlen) {
    memset(r, 0, sizeof(*r));
    r->path = path;
    r->last_trained = -1;
    r->prev_step = -2;  // no line before the first
    r->prev_tokens = NAN;
    long lines = 0;
    int rc = log_read(path, run_log_add, r, &lines, err, errlen);
    if (rc == 0 && r->train.n + r->val.n + r->hellaswag.n == 0)
        rc = errorf(err, errlen, "%s: no \"loss\", \"val_loss\" or \"hellaswag\" in any of its %ld lines", path, lines);
    if (rc != 0) run_log_free(r);
    return rc;
}

// to_tokens: the x values as tokens seen when the step is done, instead of
// steps: each point's line's "tokens"; a line without them, its step + 1 at
// the first step's tokens
static void to_tokens(RunLog *r) {
    Series *all[7] = {&r->train, &r->val, &r->hellaswag, &r->lr, &r->tokens_per_s, &r->bubble, &r->bubble_sim};
    for (int k = 0; k < 7; k++)
        for (int i = 0; i < all[k]->n; i++)
            all[k]->x[i] = isnan(all[k]->t[i]) ? (all[k]->x[i] + 1) * r->tokens_per_step : all[k]->t[i];
}

// ----------------------------------------------------------------------------
// drawing

typedef struct {
    const Series *s;
    const char *label, *color, *dash;  // dash NULL: solid
    double width;
    int dots;                          // a dot at each point (sparse series: val loss, HellaSwag)
    int range_skip;                    // leave the first LOSS_RANGE_SKIP of the x range out of the y range
    const char *css_class;             // names the series in the SVG, for the test
} Line;

typedef struct {
    double y;
    const char *label, *color;
} Mark;

typedef struct {
    int left, top, width, height;
    double x0, x1, y0, y1;
} Frame;

static double px(const Frame *fr, double x) { return fr->left + (x - fr->x0) / (fr->x1 - fr->x0) * fr->width; }
static double py(const Frame *fr, double y) { return fr->top + fr->height - (y - fr->y0) / (fr->y1 - fr->y0) * fr->height; }

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);
    }
}

// nice_step: a tick spacing of 1, 2 or 5 times a power of ten, giving about `ticks` ticks over span
static double nice_step(double span, int ticks) {
    double raw = span / ticks, power = pow(10.0, floor(log10(raw))), r = raw / power;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * power;
}

static void tick_label(double v, double step, char *out, size_t outlen) {
    double a = fabs(v);
    if (v == 0) snprintf(out, outlen, "0");
    else if (a >= 1e9) snprintf(out, outlen, "%gB", v / 1e9);
    else if (a >= 1e6) snprintf(out, outlen, "%gM", v / 1e6);
    else if (a >= 1e4 && step >= 1000) snprintf(out, outlen, "%gk", v / 1e3);
    else if (step < 1e-3) snprintf(out, outlen, "%.1e", v);  // one style along an axis of small numbers
    else snprintf(out, outlen, "%g", v);
}

// frame_range: the frame's x and y ranges from its lines and marks, with a margin
static void frame_range(Frame *fr, const Line *lines, int n_lines, const Mark *marks, int n_marks) {
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < n_lines; k++)
        for (int i = 0; i < lines[k].s->n; i++) {
            x0 = fmin(x0, lines[k].s->x[i]);
            x1 = fmax(x1, lines[k].s->x[i]);
        }
    // twice: without the first steps of the lines that ask for it, then, if nothing was left, with them
    double skip_below = x0 + LOSS_RANGE_SKIP * (x1 - x0);
    for (int pass = 0; pass < 2 && !isfinite(y0); pass++) {
        for (int k = 0; k < n_lines; k++) {
            const Series *s = lines[k].s;
            for (int i = 0; i < s->n; i++) {
                if (pass == 0 && lines[k].range_skip && s->x[i] < skip_below) continue;
                if (isfinite(s->y[i])) { y0 = fmin(y0, s->y[i]); y1 = fmax(y1, s->y[i]); }
            }
        }
    }
    for (int k = 0; k < n_marks; k++) { y0 = fmin(y0, marks[k].y); y1 = fmax(y1, marks[k].y); }
    if (!isfinite(x0)) { x0 = 0; x1 = 1; }
    if (x1 <= x0) x1 = x0 + 1;
    if (!isfinite(y0)) { y0 = 0; y1 = 1; }
    double pad = y1 > y0 ? 0.06 * (y1 - y0) : fmax(fabs(y0) * 0.1, 1e-9);
    fr->x0 = x0; fr->x1 = x1;
    fr->y0 = y0 - pad; fr->y1 = y1 + pad;
    if (y0 >= 0 && fr->y0 < 0) fr->y0 = 0;  // no negative axis for values that cannot be
}

static void draw_axes(FILE *f, const Frame *fr, const char *title, const char *ylabel, const char *xlabel) {
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"16\" font-weight=\"bold\">", fr->left, fr->top - 14);
    xml_text(f, title);
    fprintf(f, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" stroke=\"#999\"/>\n", fr->left, fr->top,
            fr->width, fr->height);
    double ys = nice_step(fr->y1 - fr->y0, 6), xs = nice_step(fr->x1 - fr->x0, 8);
    char label[32];
    for (double v = ceil(fr->y0 / ys) * ys; v <= fr->y1 + 1e-9 * ys; v += ys) {
        double y = py(fr, v);
        tick_label(fabs(v) < 1e-9 * ys ? 0 : v, ys, label, sizeof(label));
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
                   "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
                fr->left, y, fr->left + fr->width, y, fr->left - 6, y + 4, label);
    }
    for (double v = ceil(fr->x0 / xs) * xs; v <= fr->x1 + 1e-9 * xs; v += xs) {
        double x = px(fr, v);
        tick_label(v, xs, label, sizeof(label));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e5e5e5\"/>"
                   "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
                x, fr->top, x, fr->top + fr->height, x, fr->top + fr->height + 16, label);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", fr->left + fr->width / 2,
            fr->top + fr->height + 34, xlabel);
    fprintf(f, "<text transform=\"translate(%d,%d) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
            fr->left - 58, fr->top + fr->height / 2, ylabel);
}

static void draw_line(FILE *f, const Frame *fr, const Line *l, int clip_id) {
    if (l->s->n == 0) return;
    fprintf(f, "<polyline class=\"%s\" clip-path=\"url(#clip%d)\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s%s%s points=\"",
            l->css_class, clip_id, l->color, l->width, l->dash ? " stroke-dasharray=\"" : "", l->dash ? l->dash : "",
            l->dash ? "\"" : "");
    for (int i = 0; i < l->s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", px(fr, l->s->x[i]), py(fr, l->s->y[i]));
    fprintf(f, "\"/>\n");
    for (int i = 0; l->dots && i < l->s->n; i++)
        fprintf(f, "<circle clip-path=\"url(#clip%d)\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", clip_id, px(fr, l->s->x[i]),
                py(fr, l->s->y[i]), l->color);
}

static void draw_mark(FILE *f, const Frame *fr, const Mark *m) {
    double y = py(fr, m->y);
    fprintf(f, "<line class=\"baseline\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
               "stroke-dasharray=\"2,3\"/>\n<text x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">",
            fr->left, y, fr->left + fr->width, y, m->color, fr->left + 6, y - 4, m->color);
    xml_text(f, m->label);
    fprintf(f, "</text>\n");
}

// draw_legend: one row per drawn line, in the frame's top right corner
static void draw_legend(FILE *f, const Frame *fr, const Line *lines, int n_lines) {
    int rows = 0, x = fr->left + fr->width - 260;
    for (int k = 0; k < n_lines; k++) rows += lines[k].s->n > 0;
    if (rows == 0) return;
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"252\" height=\"%d\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n", x,
            fr->top + 8, 8 + 16 * rows);
    int row = 0;
    for (int k = 0; k < n_lines; k++) {
        if (lines[k].s->n == 0) continue;
        int y = fr->top + 20 + 16 * row++;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"%.1f\"%s%s%s/>"
                   "<text x=\"%d\" y=\"%d\" font-size=\"11\">",
                x + 8, y - 4, x + 36, y - 4, lines[k].color, lines[k].width + 0.5, lines[k].dash ? " stroke-dasharray=\"" : "",
                lines[k].dash ? lines[k].dash : "", lines[k].dash ? "\"" : "", x + 42, y);
        xml_text(f, lines[k].label);
        fprintf(f, "</text>\n");
    }
}

// draw_clipped_note: when some points of the lines lie outside the frame's
// y range (the loss axis leaves out the first steps' losses), a line over
// the frame's top right corner says how many and how far, so that a line
// cut at an edge is not read as the data's own shape
static void draw_clipped_note(FILE *f, const Frame *fr, const Line *lines, int n_lines) {
    int above = 0, below = 0;
    double high = -INFINITY, low = INFINITY;
    for (int k = 0; k < n_lines; k++)
        for (int i = 0; i < lines[k].s->n; i++) {
            double y = lines[k].s->y[i];
            if (y > fr->y1) { above++; high = fmax(high, y); }
            if (y < fr->y0) { below++; low = fmin(low, y); }
        }
    if (above + below == 0) return;
    char note[200];
    int n = snprintf(note, sizeof(note), "cut at the axis:");
    if (above > 0) n += snprintf(note + n, sizeof(note) - (size_t)n, " %d point%s above (up to %.4g)", above, above == 1 ? "" : "s", high);
    if (below > 0) snprintf(note + n, sizeof(note) - (size_t)n, "%s %d point%s below (down to %.4g)", above > 0 ? "," : "", below,
                            below == 1 ? "" : "s", low);
    fprintf(f, "<text class=\"clipped\" x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#a33\" text-anchor=\"end\">",
            fr->left + fr->width, fr->top - 14);
    xml_text(f, note);
    fprintf(f, "</text>\n");
}

// draw_panel: one chart at vertical offset top
static void draw_panel(FILE *f, int top, int id, const char *title, const char *ylabel, const char *xlabel, const Line *lines,
                       int n_lines, const Mark *marks, int n_marks) {
    Frame fr = {MARGIN_LEFT, top + MARGIN_TOP, WIDTH - MARGIN_LEFT - MARGIN_RIGHT, PANEL_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM, 0, 0, 0, 0};
    frame_range(&fr, lines, n_lines, marks, n_marks);
    fprintf(f, "<clipPath id=\"clip%d\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath>\n", id, fr.left, fr.top,
            fr.width, fr.height);
    draw_axes(f, &fr, title, ylabel, xlabel);
    for (int k = 0; k < n_marks; k++) draw_mark(f, &fr, &marks[k]);
    for (int k = 0; k < n_lines; k++) draw_line(f, &fr, &lines[k], id);
    draw_legend(f, &fr, lines, n_lines);
    draw_clipped_note(f, &fr, lines, n_lines);
}

// ----------------------------------------------------------------------------
// the page

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

// summary: the run's headline numbers, for the header line. The steps are
// those trained (0 .. the last with a train loss): a run of -x 200 logs steps
// 0..199 and then its final val loss as step 200, which is not a step trained.
static void summary(const RunLog *r, char *out, size_t outlen) {
    int n = snprintf(out, outlen, "%.0f steps", (r->last_trained >= 0 ? r->last_trained : r->last_step) + 1);
    if (r->val.n > 0) {
        double best = r->val.y[0];
        for (int i = 1; i < r->val.n; i++) best = fmin(best, r->val.y[i]);
        n += snprintf(out + n, outlen - (size_t)n, ", val loss %.4f last, %.4f best", r->val.y[r->val.n - 1], best);
    }
    if (r->hellaswag.n > 0) n += snprintf(out + n, outlen - (size_t)n, ", HellaSwag %.1f%% last", r->hellaswag.y[r->hellaswag.n - 1]);
    if (r->tokens_per_s.n > 0) {
        double sum = 0;
        for (int i = 0; i < r->tokens_per_s.n; i++) sum += r->tokens_per_s.y[i];
        snprintf(out + n, outlen - (size_t)n, ", %.0f tokens/s mean", sum / r->tokens_per_s.n);
    }
}

static int write_svg(const PlotOptions *o, const char *out_path, const RunLog *run, const RunLog *ref) {
    static const Series empty = {NULL, NULL, NULL, 0, 0};
    const Series *rs[6] = {&empty, &empty, &empty, &empty, &empty, &empty};
    if (ref != NULL) {
        rs[0] = &ref->train, rs[1] = &ref->val, rs[2] = &ref->hellaswag, rs[3] = &ref->lr, rs[4] = &ref->tokens_per_s;
        rs[5] = &ref->bubble;
    }
    const char *ref_name = ref == NULL ? "" : o->ref_label ? o->ref_label : base_name(ref->path);
    char ref_train[300], ref_val[300], ref_other[300];
    snprintf(ref_train, sizeof(ref_train), "%s: train", ref_name);
    snprintf(ref_val, sizeof(ref_val), "%s: val", ref_name);
    snprintf(ref_other, sizeof(ref_other), "%s", ref_name);
    const char *xlabel = o->x_tokens ? "tokens seen" : "step";

    Line loss[4] = {
        {&run->train, "train loss", "#1f77b4", NULL, 1.0, 0, 1, "run train_loss"},
        {&run->val, "val loss", "#d62728", NULL, 2.0, 1, 1, "run val_loss"},
        {rs[0], ref_train, "#8fbbd9", "6,4", 1.0, 0, 1, "ref train_loss"},
        {rs[1], ref_val, "#e99a9b", "6,4", 2.0, 0, 1, "ref val_loss"},
    };
    Mark loss_marks[1] = {{GPT2_124M_VAL_LOSS, "GPT-2 124M: 3.425 (FineWeb val)", "#444"}};
    Line hella[2] = {
        {&run->hellaswag, "HellaSwag", "#2ca02c", NULL, 2.0, 1, 0, "run hellaswag"},
        {rs[2], ref_other, "#98d198", "6,4", 2.0, 1, 0, "ref hellaswag"},
    };
    Mark hella_marks[3] = {
        {GPT2_124M_HELLASWAG, "GPT-2 124M: 29.4%", "#444"},
        {GPT3_124M_HELLASWAG, "GPT-3 124M: 33.7%", "#8e44ad"},
        {25.0, "chance: 25%", "#aaa"},
    };
    Line lr[2] = {{&run->lr, "learning rate", "#ff7f0e", NULL, 1.5, 0, 0, "run lr"}, {rs[3], ref_other, "#ffbf87", "6,4", 1.5, 0, 0, "ref lr"}};
    Line tps[2] = {{&run->tokens_per_s, "tokens/s", "#9467bd", NULL, 1.0, 0, 0, "run tokens_per_s"},
                   {rs[4], ref_other, "#c9b3de", "6,4", 1.0, 0, 0, "ref tokens_per_s"}};
    Line bubble[3] = {{&run->bubble, "measured", "#8c564b", NULL, 1.5, 0, 0, "run bubble"},
                      {&run->bubble_sim, "simulated for the step's op costs", "#17becf", "4,3", 1.5, 0, 0, "run bubble_sim"},
                      {rs[5], ref_other, "#c49c94", "6,4", 1.5, 0, 0, "ref bubble"}};
    int has_hella = run->hellaswag.n > 0 || rs[2]->n > 0, has_bubble = run->bubble.n > 0 || rs[5]->n > 0;
    int panels = 3 + has_hella + has_bubble, height = HEADER_HEIGHT + panels * PANEL_HEIGHT;

    char tmp[4200], err[4400];
    FILE *f = fopen_tmp(out_path, tmp, sizeof(tmp), err, sizeof(err));  // never written through a link planted there
    if (f == NULL) { fprintf(stderr, "plot_log: %s\n", err); return -1; }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fafafa\"/>\n",
            WIDTH, height, WIDTH, height);
    char line[512];
    fprintf(f, "<text x=\"%d\" y=\"30\" font-size=\"20\" font-weight=\"bold\">", MARGIN_LEFT);
    xml_text(f, o->title ? o->title : base_name(run->path));
    summary(run, line, sizeof(line));
    fprintf(f, "</text>\n<text x=\"%d\" y=\"52\" font-size=\"13\" fill=\"#444\">", MARGIN_LEFT);
    xml_text(f, line);
    fprintf(f, "</text>\n");
    if (ref != NULL) {
        summary(ref, line, sizeof(line));
        fprintf(f, "<text x=\"%d\" y=\"72\" font-size=\"13\" fill=\"#777\">reference ", MARGIN_LEFT);
        xml_text(f, ref_name);
        fprintf(f, ": ");
        xml_text(f, line);
        fprintf(f, "</text>\n");
    }
    int top = HEADER_HEIGHT, id = 0;
    draw_panel(f, top, id++, "Loss", "loss", xlabel, loss, 4, loss_marks, o->baselines);
    top += PANEL_HEIGHT;
    if (has_hella) {
        draw_panel(f, top, id++, "HellaSwag", "accuracy (%)", xlabel, hella, 2, hella_marks, o->baselines ? 3 : 0);
        top += PANEL_HEIGHT;
    }
    draw_panel(f, top, id++, "Learning rate", "lr", xlabel, lr, 2, NULL, 0);
    top += PANEL_HEIGHT;
    draw_panel(f, top, id++, "Throughput", "tokens/s", xlabel, tps, 2, NULL, 0);
    top += PANEL_HEIGHT;
    if (has_bubble) draw_panel(f, top, id++, "Pipeline bubble", "idle share (%)", xlabel, bubble, 3, NULL, 0);
    fprintf(f, "</svg>\n");
    if (fclose_rename(f, tmp, out_path, err, sizeof(err)) != 0) {
        fprintf(stderr, "plot_log: %s\n", err);
        return -1;
    }
    return 0;
}

// 1 if the SVG at out would replace the file at path, a log it reads: the
// same file, reached by its name or through a link (a link at out itself is
// replaced, never written through, so out is not followed)
static int same_file(const char *out, const char *path) {
    struct stat a, b;
    return path != NULL && lstat(out, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int main(int argc, char **argv) {
    PlotOptions o;
    parse_options(&o, argc, argv);
    char out_path[4096], err[8192];
    if (o.out != NULL) {
        snprintf(out_path, sizeof(out_path), "%s", o.out);
    } else {
        snprintf(out_path, sizeof(out_path), "%s", o.log);
        size_t n = strlen(out_path);
        if (n > 6 && strcmp(out_path + n - 6, ".jsonl") == 0) out_path[n - 6] = '\0';
        strncat(out_path, ".svg", sizeof(out_path) - strlen(out_path) - 1);
    }
    if (same_file(out_path, o.log) || same_file(out_path, o.ref))
        usage_error("-o %s: that is the log %s, which the SVG would replace; give the SVG another name", out_path,
                    same_file(out_path, o.log) ? "it draws" : "of the reference (-r)");
    RunLog run, ref;
    if (run_log_read(o.log, &run, err, sizeof(err)) != 0) { fprintf(stderr, "plot_log: %s\n", err); return 1; }
    if (o.ref != NULL && run_log_read(o.ref, &ref, err, sizeof(err)) != 0) {
        fprintf(stderr, "plot_log: -r %s\n", err);
        run_log_free(&run);
        return 1;
    }
    if (o.x_tokens) {
        const RunLog *without = !run.has_tokens ? &run : o.ref != NULL && !ref.has_tokens ? &ref : NULL;
        if (without != NULL) {
            fprintf(stderr, "plot_log: --x tokens: %s has no \"tokens\" field to count tokens with\n", without->path);
            run_log_free(&run);
            if (o.ref != NULL) run_log_free(&ref);
            return 1;
        }
        to_tokens(&run);
        if (o.ref != NULL) to_tokens(&ref);
    }
    int rc = write_svg(&o, out_path, &run, o.ref != NULL ? &ref : NULL);
    if (rc == 0) printf("plot_log: wrote %s (open it in a browser)\n", out_path);
    run_log_free(&run);
    if (o.ref != NULL) run_log_free(&ref);
    return rc == 0 ? 0 : 1;
}
