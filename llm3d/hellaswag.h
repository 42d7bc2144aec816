/*
 * hellaswag.h: llm.c's multiple-choice eval file (HellaSwag): reading it,
 * writing it, splitting it over the data-parallel ranks, packing examples
 * into micro-batches and scoring them from per-token losses. Both trainers
 * use it; each runs its own forward to get the losses.
 *
 * defines:
 *   HsExample, HsSet       one example (its context, completions, label); a whole file
 *   hs_read, hs_free       a file, read into memory and checked against the model
 *   hs_write               a file from examples (prepare_data hellaswag, the tests)
 *   hs_rank_range          the examples of one data-parallel rank
 *   hs_batches             the micro-batches every rank runs (the most any rank needs)
 *   HsBatch, hs_batch_fill B rows of T tokens holding whole examples, one row per completion
 *   hs_batch_score         the examples of a filled batch that the losses get right
 *
 * The file (llm.c's dev/data/hellaswag.py, through write_evalfile in its
 * data_common.py; read by its EvalLoader in llmc/dataloader.h). Little-endian:
 *   header, 256 int32: [0] 20240522 (magic), [1] 1 (version), [2] the number
 *   of examples, [3] the bytes of the longest example; the rest 0.
 *   Then the examples, each a run of uint16:
 *     65535                  start of an example
 *     bytes                  of the whole example, these six header fields included
 *     index                  0, 1, 2, ... in file order
 *     label                  the index of the correct completion
 *     completions            how many (HellaSwag: 4)
 *     context length, then the context's tokens
 *     per completion: its length, then its tokens
 *   HellaSwag's context is the text "ctx"; each completion is " " + an
 *   ending, tokenized on its own (GPT-2's BPE joins a space to the word after it).
 *
 * Scoring, llm.c's (its acc_norm): each completion goes in a row of its own,
 * after the context. The loss at position t is that of predicting token t+1,
 * so a completion of n tokens after a context of c is scored by the losses
 * at positions c-1 .. c+n-2. The completion with the lowest mean loss over
 * its tokens is the model's answer (the first of equal ones); the accuracy
 * is the fraction of examples answered right. Rank r of dp gets examples
 * [r*k, (r+1)*k) with k = ceil(n/dp), as in llm.c; every rank runs as many
 * batches as the busiest one (the others run empty ones), since a replica's
 * ranks, and ZeRO-3's gathers, move in lockstep.
 *
 * Readers take an error buffer and never exit; every error is one line
 * naming the file, the example and the field.
 */
#ifndef LLM3D_HELLASWAG_H
#define LLM3D_HELLASWAG_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"

#define HS_MAGIC 20240522
#define HS_VERSION 1
#define HS_HEADER_INTS 256
#define HS_START 65535
#define HS_MAX_COMPLETIONS 16   // HellaSwag has 4; llm.c's reader takes 4 only
#define HS_MAX_FILE_BYTES (1L << 30)
#define HS_FIRST_WORDS 32767    // what hs_read reads before the first example's check: the most one example holds
#define HS_DEFAULT_FILE "dev/data/hellaswag/hellaswag_val.bin"  // where llm.c's hellaswag.py puts it

typedef struct {
    int label, ncomp, ctx_len;
    const uint16_t *ctx;                      // into HsSet.words
    int comp_len[HS_MAX_COMPLETIONS];
    const uint16_t *comp[HS_MAX_COMPLETIONS];
} HsExample;

typedef struct {
    int n;                 // examples
    HsExample *ex;
    uint16_t *words;       // the file after its header
    int max_ncomp;        // the most completions of any example
} HsSet;

static void hs_free(HsSet *s) {
    free(s->ex);
    free(s->words);
    memset(s, 0, sizeof(*s));
}

// the example starting at word w of the file's n words: its fields into e, or
// one line in err. V: the model's vocabulary; T: the sequence length every
// context + completion must fit in.
static int hs_parse_example(const char *path, int i, const uint16_t *w, size_t n, int V, int T, HsExample *e,
                            size_t *words, char *err, size_t errlen) {
    if (n < 6) return errorf(err, errlen, "%s: example %d: the file ends inside its header", path, i);
    if (w[0] != HS_START)
        return errorf(err, errlen, "%s: example %d: starts with %u, not the start mark %d", path, i, w[0], HS_START);
    if (w[1] % 2 != 0 || w[1] < 12 || w[1] / 2u > n)
        return errorf(err, errlen, "%s: example %d: its byte count %u is odd, too small, or runs past the end of the "
                      "file", path, i, w[1]);
    size_t len = w[1] / 2u;
    if (w[2] != (uint16_t)i) return errorf(err, errlen, "%s: example %d: its index field says %u", path, i, w[2]);
    e->label = w[3];
    e->ncomp = w[4];
    e->ctx_len = w[5];
    if (e->ncomp < 1 || e->ncomp > HS_MAX_COMPLETIONS)
        return errorf(err, errlen, "%s: example %d: %d completions (1..%d)", path, i, e->ncomp, HS_MAX_COMPLETIONS);
    if (e->label >= e->ncomp)
        return errorf(err, errlen, "%s: example %d: label %d, but %d completions", path, i, e->label, e->ncomp);
    if (e->ctx_len < 1) return errorf(err, errlen, "%s: example %d: an empty context", path, i);
    size_t at = 6;
    e->ctx = w + at;
    at += (size_t)e->ctx_len;
    for (int c = 0; c < e->ncomp; c++) {
        if (at >= len) return errorf(err, errlen, "%s: example %d: completion %d runs past its byte count", path, i, c);
        e->comp_len[c] = w[at];
        e->comp[c] = w + at + 1;
        at += 1 + (size_t)e->comp_len[c];
        if (e->comp_len[c] < 1) return errorf(err, errlen, "%s: example %d: completion %d is empty", path, i, c);
        if (e->ctx_len + e->comp_len[c] > T)
            return errorf(err, errlen, "%s: example %d: context %d + completion %d tokens exceed T = %d (flag -t)",
                          path, i, e->ctx_len, e->comp_len[c], T);
    }
    if (at != len)
        return errorf(err, errlen, "%s: example %d: its fields take %zu bytes, its byte count says %zu", path, i,
                      2 * at, 2 * len);
    for (int c = -1; c < e->ncomp; c++) {  // -1: the context
        const uint16_t *tok = c < 0 ? e->ctx : e->comp[c];
        for (int t = 0; t < (c < 0 ? e->ctx_len : e->comp_len[c]); t++)
            if (tok[t] >= V)
                return errorf(err, errlen, "%s: example %d: token %u is not below the model's vocab size %d", path, i,
                              tok[t], V);
    }
    *words = len;
    return 0;
}

// reads and checks path: every example, for a model of vocab V run at
// sequence length T with B rows a batch. The first example is read and
// checked before the rest, so that a file that is not one is refused after
// its header and at most HS_FIRST_WORDS words, not after up to
// HS_MAX_FILE_BYTES.
static int hs_read(HsSet *s, const char *path, int V, int T, int B, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    int fd = open_regular(path, "HellaSwag file", err, errlen);  // a FIFO is refused, not waited on
    if (fd < 0) return -1;
    int32_t h[HS_HEADER_INTS];
    struct stat st;
    long size = fstat(fd, &st) == 0 ? (long)st.st_size : -1;
    if (size < (long)sizeof(h) || size > HS_MAX_FILE_BYTES || pread_all(fd, h, sizeof(h), 0) != 0) {
        close(fd);
        return errorf(err, errlen, "%s: %ld bytes: not a HellaSwag file (a 1024-byte header, at most %ld bytes)", path,
                      size, HS_MAX_FILE_BYTES);
    }
    if (h[0] != HS_MAGIC || h[1] != HS_VERSION) {
        close(fd);
        return errorf(err, errlen, "%s: header magic %d version %d, expected %d version %d (llm.c's eval file)", path,
                      h[0], h[1], HS_MAGIC, HS_VERSION);
    }
    size_t n = (size_t)(size - (long)sizeof(h)) / 2;
    if (h[2] < 1 || (size - (long)sizeof(h)) % 2 != 0 || (size_t)h[2] > n / 6) {
        close(fd);
        return errorf(err, errlen, "%s: header says %d examples in %ld bytes after it", path, h[2], size - (long)sizeof(h));
    }
    s->n = h[2];
    s->words = (uint16_t *)malloc(n * sizeof(uint16_t));
    s->ex = (HsExample *)calloc((size_t)s->n, sizeof(HsExample));
    size_t first = n < HS_FIRST_WORDS ? n : HS_FIRST_WORDS, used = 0;
    int rc = s->words == NULL || s->ex == NULL ? errorf(err, errlen, "%s: out of memory for %zu bytes", path, 2 * n) : 0;
    if (rc == 0 && pread_all(fd, s->words, 2 * first, sizeof(h)) != 0)
        rc = errorf(err, errlen, "%s: cannot read its first example: %s", path, strerror(errno));
    if (rc == 0) rc = hs_parse_example(path, 0, s->words, first, V, T, &s->ex[0], &used, err, errlen);
    if (rc == 0 && pread_all(fd, s->words + first, 2 * (n - first), sizeof(h) + 2 * first) != 0)
        rc = errorf(err, errlen, "%s: cannot read %zu bytes of examples: %s", path, 2 * n, strerror(errno));
    close(fd);
    size_t at = used;
    s->max_ncomp = s->ex != NULL ? s->ex[0].ncomp : 0;
    for (int i = 1; rc == 0 && i < s->n; i++) {
        rc = hs_parse_example(path, i, s->words + at, n - at, V, T, &s->ex[i], &used, err, errlen);
        at += used;
        if (rc == 0 && s->ex[i].ncomp > s->max_ncomp) s->max_ncomp = s->ex[i].ncomp;
    }
    if (rc == 0 && at != n)
        rc = errorf(err, errlen, "%s: %zu bytes follow the last of the header's %d examples", path, 2 * (n - at), s->n);
    if (rc == 0 && s->max_ncomp > B)
        rc = errorf(err, errlen, "flag -b: B = %d rows, but %s has examples of %d completions, one row each", B, path,
                    s->max_ncomp);
    if (rc != 0) hs_free(s);
    return rc;
}

// writes n examples to path (the header's longest-example field included).
// The examples' pointers may point anywhere; the file is written whole or
// not at all, never through a link (files.h's fopen_tmp and fclose_rename).
static int hs_write(const char *path, const HsExample *ex, int n, char *err, size_t errlen) {
    if (n < 1 || n > 65535) return errorf(err, errlen, "%s: %d examples; the file's index field holds 1..65535", path, n);
    int32_t h[HS_HEADER_INTS] = {HS_MAGIC, HS_VERSION, n, 0};
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        size_t words = 6 + (size_t)ex[i].ctx_len;
        for (int c = 0; c < ex[i].ncomp; c++) words += 1 + (size_t)ex[i].comp_len[c];
        if (2 * words > 65535)
            return errorf(err, errlen, "%s: example %d takes %zu bytes; its byte count field holds 65535", path, i,
                          2 * words);
        if (2 * words > longest) longest = 2 * words;
    }
    h[3] = (int32_t)longest;
    char tmp[4200];
    FILE *f = fopen_tmp(path, tmp, sizeof(tmp), err, errlen);
    if (f == NULL) return -1;
    fwrite(h, sizeof(h), 1, f);  // a failed write shows in ferror, which fclose_rename reads
    for (int i = 0; i < n; i++) {
        const HsExample *e = &ex[i];
        size_t words = 6 + (size_t)e->ctx_len;
        for (int c = 0; c < e->ncomp; c++) words += 1 + (size_t)e->comp_len[c];
        uint16_t head[6] = {HS_START, (uint16_t)(2 * words), (uint16_t)i, (uint16_t)e->label, (uint16_t)e->ncomp,
                            (uint16_t)e->ctx_len};
        fwrite(head, sizeof(head), 1, f);
        fwrite(e->ctx, sizeof(uint16_t), (size_t)e->ctx_len, f);
        for (int c = 0; c < e->ncomp; c++) {
            uint16_t len = (uint16_t)e->comp_len[c];
            fwrite(&len, sizeof(len), 1, f);
            fwrite(e->comp[c], sizeof(uint16_t), len, f);
        }
    }
    return fclose_rename(f, tmp, path, err, errlen);
}

// the examples [*lo, *hi) of data-parallel rank r of dp
static void hs_rank_range(int n, int dp, int r, int *lo, int *hi) {
    int k = (n + dp - 1) / dp;
    *lo = r * k < n ? r * k : n;
    *hi = (r + 1) * k < n ? (r + 1) * k : n;
}

// the examples of [lo, hi) that fit in one batch of B rows from lo on
static int hs_fits(const HsSet *s, int lo, int hi, int B) {
    int rows = 0, k = lo;
    while (k < hi && rows + s->ex[k].ncomp <= B) rows += s->ex[k++].ncomp;
    return k - lo;
}

// the batches of B rows each rank runs: as many as the busiest rank needs
static int hs_batches(const HsSet *s, int dp, int B) {
    int most = 0;
    for (int r = 0; r < dp; r++) {
        int lo, hi, nb = 0;
        hs_rank_range(s->n, dp, r, &lo, &hi);
        for (int k = lo; k < hi; nb++) k += hs_fits(s, k, hi, B);
        if (nb > most) most = nb;
    }
    return most;
}

// which examples a filled batch holds: example first + k starts at row row[k]
typedef struct {
    int B, T;
    int first, count;
    int *row;        // B entries
} HsBatch;

static int hs_batch_init(HsBatch *b, int B, int T) {
    memset(b, 0, sizeof(*b));
    b->B = B;
    b->T = T;
    b->row = (int *)calloc((size_t)B, sizeof(int));
    return b->row == NULL ? -1 : 0;
}

static void hs_batch_free(HsBatch *b) { free(b->row); }

// the next examples of this rank, from *next (below hi) on, into inputs and
// targets (B*T each): context and completion in a row per completion,
// targets the inputs shifted by one; the rest of the rows token 0. Past hi
// the batch is empty (all rows token 0), for a rank with fewer batches.
static void hs_batch_fill(const HsSet *s, int *next, int hi, HsBatch *b, int *inputs, int *targets) {
    int B = b->B, T = b->T;
    memset(inputs, 0, (size_t)B * T * sizeof(int));
    memset(targets, 0, (size_t)B * T * sizeof(int));
    b->first = *next;
    b->count = hs_fits(s, *next, hi, B);
    int row = 0;
    for (int k = 0; k < b->count; k++) {
        const HsExample *e = &s->ex[*next + k];
        b->row[k] = row;
        for (int c = 0; c < e->ncomp; c++, row++) {
            int *in = inputs + (size_t)row * T, *tg = targets + (size_t)row * T;
            for (int t = 0; t < e->ctx_len; t++) in[t] = e->ctx[t];
            for (int t = 0; t < e->comp_len[c]; t++) in[e->ctx_len + t] = e->comp[c][t];
            for (int t = 0; t + 1 < e->ctx_len + e->comp_len[c]; t++) tg[t] = in[t + 1];
        }
    }
    *next += b->count;
}

// from the per-token losses (B*T) of a filled batch: how many of its
// examples the model answers right; pred (may be NULL) gets each example's
// answer, the completion of lowest mean loss
static int hs_batch_score(const HsSet *s, const HsBatch *b, const float *losses, int *pred) {
    int correct = 0;
    for (int k = 0; k < b->count; k++) {
        const HsExample *e = &s->ex[b->first + k];
        int best = 0;
        double best_loss = 0.0;
        for (int c = 0; c < e->ncomp; c++) {
            const float *l = losses + (size_t)(b->row[k] + c) * b->T + (e->ctx_len - 1);
            double sum = 0.0;
            for (int t = 0; t < e->comp_len[c]; t++) sum += l[t];
            double mean = sum / e->comp_len[c];
            if (c == 0 || mean < best_loss) {
                best = c;
                best_loss = mean;
            }
        }
        if (pred != NULL) pred[k] = best;
        correct += best == e->label;
    }
    return correct;
}

#endif
