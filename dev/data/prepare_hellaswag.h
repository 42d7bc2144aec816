/*
 * prepare_hellaswag.h: `./prepare_data hellaswag`: HellaSwag's JSON lines in,
 * llm.c's eval file out (hellaswag.h has the format).
 *
 *   ./prepare_data hellaswag -i hellaswag_val.jsonl [-o dev/data/hellaswag] [-n hellaswag_val]
 *                  [--encoder encoder.json --vocab vocab.bpe]
 *
 * Each line of the input is one example: a JSON object of which three fields
 * are read, "ctx" (the context), "endings" (the completions, strings) and
 * "label" (the index of the correct ending); the others are skipped. As
 * llm.c's hellaswag.py does with tiktoken, the context is tokenized as it is
 * and each ending with one space before it, on its own. "<|endoftext|>" in
 * the text stays plain text. The file goes to <outdir>/<name>.bin, name
 * being the input's file name without its extension: hellaswag_val.jsonl
 * becomes dev/data/hellaswag/hellaswag_val.bin, where the trainers' -h 1
 * looks for it. The BPE files come from --encoder and --vocab, else from
 * where prepare_data looks: $LLM3D_DATA/gpt2/, else ../shared/data/gpt2/.
 * A key given twice in a line, or a label that is not a JSON integer, is an
 * error naming the line and the field.
 *
 * defines: prepare_hellaswag_main (and its JSON reader: HsJson, hj_*)
 *
 * Exit status: 0 done, 1 runtime error, 2 bad flags or input. Every error is
 * one line naming the file, the line and the field.
 */
#ifndef LLM3D_PREPARE_HELLASWAG_H
#define LLM3D_PREPARE_HELLASWAG_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm3d/errors.h"
#include "llm3d/hellaswag.h"
#include "llm3d/tokenizer.h"

#define HS_MAX_JSONL_BYTES (1L << 30)
#define HJ_MAX_DEPTH 64

// a JSON reader over one line: p moves forward; text collects a decoded string
typedef struct {
    const char *p, *end;
    char *text;
    size_t len, cap;
} HsJson;

static void hj_space(HsJson *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r')) j->p++;
}

static int hj_take(HsJson *j, char c) {
    hj_space(j);
    if (j->p < j->end && *j->p == c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int hj_put(HsJson *j, const unsigned char *b, size_t n) {
    if (j->len + n + 1 > j->cap) {
        size_t cap = 2 * (j->len + n + 1) + 64;
        char *t = (char *)realloc(j->text, cap);
        if (t == NULL) return -1;
        j->text = t;
        j->cap = cap;
    }
    memcpy(j->text + j->len, b, n);
    j->len += n;
    j->text[j->len] = '\0';
    return 0;
}

static int hj_hex4(HsJson *j, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++, j->p++) {
        if (j->p >= j->end) return -1;
        char c = *j->p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

// a JSON string into j->text (UTF-8, escapes decoded); 0, or -1 if malformed
static int hj_string(HsJson *j) {
    j->len = 0;
    if (hj_put(j, (const unsigned char *)"", 0) != 0 || !hj_take(j, '"')) return -1;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20) return -1;
        if (c != '\\') {
            if (hj_put(j, &c, 1) != 0) return -1;
            continue;
        }
        if (j->p >= j->end) return -1;
        char e = *j->p++;
        const char *plain = strchr("\"\\/bfnrt", e);
        if (e != '\0' && plain != NULL) {
            unsigned char out = (unsigned char)"\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
            if (hj_put(j, &out, 1) != 0) return -1;
            continue;
        }
        uint32_t cp, low;
        if (e != 'u' || hj_hex4(j, &cp) != 0) return -1;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;  // a low surrogate alone
        if (cp >= 0xD800 && cp <= 0xDBFF) {            // a high one: its low one follows
            if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u') return -1;
            j->p += 2;
            if (hj_hex4(j, &low) != 0 || low < 0xDC00 || low > 0xDFFF) return -1;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        }
        unsigned char out[4];
        if (hj_put(j, out, (size_t)utf8_encode(cp, out)) != 0) return -1;
    }
    return hj_take(j, '"') ? 0 : -1;
}

// skips one JSON value of any kind
static int hj_skip(HsJson *j, int depth) {
    hj_space(j);
    if (j->p >= j->end || depth > HJ_MAX_DEPTH) return -1;
    char c = *j->p;
    if (c == '"') return hj_string(j);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (hj_take(j, close)) return 0;
        do {
            if (c == '{' && (hj_string(j) != 0 || !hj_take(j, ':'))) return -1;
            if (hj_skip(j, depth + 1) != 0) return -1;
        } while (hj_take(j, ','));
        return hj_take(j, close) ? 0 : -1;
    }
    const char *start = j->p;  // a number, true, false or null
    while (j->p < j->end && strchr(",}] \t\r", *j->p) == NULL) j->p++;
    return j->p > start ? 0 : -1;
}

// a JSON integer (HellaSwag's labels): an optional '-', then 0 or digits
// not starting with 0, up to 9 of them, ended by what may follow a value;
// -1 for anything else ("+1", "1abc", "01", "1.0", "1e0", "\"1\"")
static int hj_int(HsJson *j, long *v) {
    hj_space(j);
    const char *p = j->p;
    int neg = p < j->end && *p == '-';
    p += neg;
    const char *digits = p;
    long x = 0;
    while (p < j->end && *p >= '0' && *p <= '9' && p - digits < 10) x = 10 * x + (*p++ - '0');
    size_t n = (size_t)(p - digits);
    if (n == 0 || n > 9 || (n > 1 && digits[0] == '0')) return -1;
    if (p < j->end && strchr(",}] \t\r", *p) == NULL) return -1;
    *v = neg ? -x : x;
    j->p = p;
    return 0;
}

// the tokens of text (with a space before it when lead_space), as uint16;
// -1 with err set
static int hs_tokens(Bpe *bpe, const char *text, size_t len, int lead_space, uint16_t **out, int *n, char *err,
                     size_t errlen, const char *where) {
    char *buf = (char *)malloc(len + 2);
    int *ids = NULL;
    size_t nids = 0;
    if (buf == NULL) return errorf(err, errlen, "%s: out of memory", where);
    buf[0] = ' ';
    memcpy(buf + lead_space, text, len);
    int rc = bpe_encode(bpe, buf, len + (size_t)lead_space, 0, &ids, &nids);
    free(buf);
    if (rc != 0) return errorf(err, errlen, "%s: out of memory", where);
    if (nids == 0 || nids > 4096) {
        free(ids);
        return errorf(err, errlen, "%s: %zu tokens (1..4096)", where, nids);
    }
    *out = (uint16_t *)malloc(nids * sizeof(uint16_t));
    if (*out == NULL) {
        free(ids);
        return errorf(err, errlen, "%s: out of memory", where);
    }
    for (size_t k = 0; k < nids; k++) (*out)[k] = (uint16_t)ids[k];
    free(ids);
    *n = (int)nids;
    return 0;
}

// one line of the input into e (its token arrays malloc'd); -1 with err set
static int hs_parse_line(Bpe *bpe, HsJson *j, const char *where, HsExample *e, char *err, size_t errlen) {
    memset(e, 0, sizeof(*e));
    long label = -1;
    int have_ctx = 0, have_label = 0, have_endings = 0;
    char what[600];
    if (!hj_take(j, '{')) return errorf(err, errlen, "%s: not a JSON object", where);
    do {
        if (hj_string(j) != 0 || !hj_take(j, ':')) return errorf(err, errlen, "%s: a malformed key", where);
        int again = (strcmp(j->text, "ctx") == 0 && have_ctx) || (strcmp(j->text, "label") == 0 && have_label) ||
                    (strcmp(j->text, "endings") == 0 && have_endings);
        if (again) return errorf(err, errlen, "%s: field %s appears twice", where, j->text);
        if (strcmp(j->text, "ctx") == 0) {
            if (hj_string(j) != 0) return errorf(err, errlen, "%s: field ctx is not a JSON string", where);
            snprintf(what, sizeof(what), "%.560s: field ctx", where);
            if (hs_tokens(bpe, j->text, j->len, 0, (uint16_t **)&e->ctx, &e->ctx_len, err, errlen, what) != 0) return -1;
            have_ctx = 1;
        } else if (strcmp(j->text, "label") == 0) {
            if (hj_int(j, &label) != 0) return errorf(err, errlen, "%s: field label is not an integer", where);
            have_label = 1;
        } else if (strcmp(j->text, "endings") == 0) {
            if (!hj_take(j, '[')) return errorf(err, errlen, "%s: field endings is not an array", where);
            do {
                if (e->ncomp == HS_MAX_COMPLETIONS)
                    return errorf(err, errlen, "%s: field endings has more than %d entries", where, HS_MAX_COMPLETIONS);
                if (hj_string(j) != 0) return errorf(err, errlen, "%s: endings[%d] is not a JSON string", where, e->ncomp);
                snprintf(what, sizeof(what), "%.560s: endings[%d]", where, e->ncomp);
                if (hs_tokens(bpe, j->text, j->len, 1, (uint16_t **)&e->comp[e->ncomp], &e->comp_len[e->ncomp], err,
                              errlen, what) != 0)
                    return -1;
                e->ncomp++;
            } while (hj_take(j, ','));
            if (!hj_take(j, ']')) return errorf(err, errlen, "%s: field endings: a malformed array", where);
            have_endings = 1;
        } else if (hj_skip(j, 0) != 0) {
            return errorf(err, errlen, "%s: field %.60s: a malformed value", where, j->text);
        }
    } while (hj_take(j, ','));
    if (!hj_take(j, '}')) return errorf(err, errlen, "%s: a malformed object", where);
    hj_space(j);
    if (j->p != j->end) return errorf(err, errlen, "%s: text after the object", where);
    if (!have_ctx || !have_label || !have_endings)
        return errorf(err, errlen, "%s: no field %s", where, !have_ctx ? "ctx" : !have_label ? "label" : "endings");
    if (label < 0 || label >= e->ncomp)
        return errorf(err, errlen, "%s: field label is %ld, but there are %d endings", where, label, e->ncomp);
    e->label = (int)label;
    return 0;
}

static void hs_free_parsed(HsExample *ex, int n) {
    for (int i = 0; i < n; i++) {
        free((void *)ex[i].ctx);
        for (int c = 0; c < ex[i].ncomp; c++) free((void *)ex[i].comp[c]);
    }
    free(ex);
}

// every line of text (the input's bytes) into *ex, *n; 2 on bad input, 1 on
// a runtime error, with err set
static int hs_parse_jsonl(Bpe *bpe, const char *path, char *text, size_t size, HsExample **ex, int *n, char *err,
                          size_t errlen) {
    int cap = 0, line = 0, rc = 0;
    HsJson j = {NULL, NULL, NULL, 0, 0};
    char where[600];
    *ex = NULL;
    *n = 0;
    for (char *p = text, *end = text + size; p < end && rc == 0;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl != NULL ? nl : end;
        line++;
        j.p = p;
        j.end = stop;
        p = stop + 1;
        hj_space(&j);
        if (j.p == j.end) continue;  // a blank line
        if (*n == 65535) {
            rc = 2;
            errorf(err, errlen, "%s: more than 65535 examples (the file's index field is a uint16)", path);
            break;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 1024;
            HsExample *more = (HsExample *)realloc(*ex, (size_t)cap * sizeof(HsExample));
            if (more == NULL) {
                rc = 1;
                errorf(err, errlen, "%s: out of memory at line %d", path, line);
                break;
            }
            *ex = more;
        }
        snprintf(where, sizeof(where), "%.500s:%d", path, line);
        if (hs_parse_line(bpe, &j, where, &(*ex)[*n], err, errlen) != 0) {
            HsExample *e = &(*ex)[*n];
            free((void *)e->ctx);
            for (int c = 0; c < e->ncomp; c++) free((void *)e->comp[c]);
            rc = 2;
            break;
        }
        (*n)++;
    }
    free(j.text);
    if (rc == 0 && *n == 0) {
        rc = 2;
        errorf(err, errlen, "%s: no examples", path);
    }
    if (rc != 0) {
        hs_free_parsed(*ex, *n);
        *ex = NULL;
        *n = 0;
    }
    return rc;
}

static const char hs_usage_text[] = "usage: ./prepare_data hellaswag -i hellaswag_val.jsonl [-o dev/data/hellaswag] "
                                    "[-n NAME] [--encoder encoder.json --vocab vocab.bpe]\n";

static int hs_usage(const char *msg) {
    fprintf(stderr, "prepare_data hellaswag: %s\n%s", msg, hs_usage_text);
    return 2;
}

// argv[0] is "hellaswag"
static int prepare_hellaswag_main(int argc, char **argv) {
    const char *in = NULL, *out_dir = "dev/data/hellaswag", *name = NULL, *encoder = NULL, *vocab = NULL;
    char err[2048], enc_buf[1024], voc_buf[1024], name_buf[256], path[2048];
    for (int a = 1; a < argc; a += 2) {
        const char *f = argv[a];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            fputs(hs_usage_text, stdout);
            return 0;
        }
        const char **dst = strcmp(f, "-i") == 0 ? &in : strcmp(f, "-o") == 0 ? &out_dir : strcmp(f, "-n") == 0 ? &name
                         : strcmp(f, "--encoder") == 0 ? &encoder : strcmp(f, "--vocab") == 0 ? &vocab : NULL;
        if (dst == NULL) {
            snprintf(err, sizeof(err), "unknown flag %s", f);
            return hs_usage(err);
        }
        if (a + 1 >= argc || argv[a + 1][0] == '\0') {
            snprintf(err, sizeof(err), "flag %s needs a value", f);
            return hs_usage(err);
        }
        *dst = argv[a + 1];
    }
    if (in == NULL) return hs_usage("no input: give -i hellaswag_val.jsonl");
    if ((encoder == NULL) != (vocab == NULL)) return hs_usage("give --encoder and --vocab together");
    if (encoder == NULL) {  // where prepare_data looks (tokenizer.h's bpe_find_files)
        if (bpe_find_files(enc_buf, voc_buf, sizeof(enc_buf)) != 0) {
            const char *data = getenv("LLM3D_DATA");
            snprintf(err, sizeof(err), "no gpt2/encoder.json + gpt2/vocab.bpe in $LLM3D_DATA (%s) or ../shared/data; "
                     "give --encoder and --vocab", data != NULL && data[0] != '\0' ? data : "unset");
            return hs_usage(err);
        }
        encoder = enc_buf;
        vocab = voc_buf;
    }
    if (name == NULL) {  // the input's file name, up to its last dot
        const char *base = strrchr(in, '/') != NULL ? strrchr(in, '/') + 1 : in;
        snprintf(name_buf, sizeof(name_buf), "%s", base);
        char *dot = strrchr(name_buf, '.');
        if (dot != NULL && dot != name_buf) *dot = '\0';
        name = name_buf;
    }
    Bpe bpe;
    if (bpe_load(&bpe, encoder, vocab, err, sizeof(err)) != 0) {
        fprintf(stderr, "prepare_data hellaswag: %s\n", err);
        return 2;
    }
    unsigned char *text = NULL;
    size_t size = 0;
    HsExample *ex = NULL;
    int n = 0, rc = tok_read_file(in, HS_MAX_JSONL_BYTES, &text, &size, err, sizeof(err)) != 0 ? 2 : 0;
    if (rc == 0) rc = hs_parse_jsonl(&bpe, in, (char *)text, size, &ex, &n, err, sizeof(err));
    snprintf(path, sizeof(path), "%s/%s.bin", out_dir, name);
    int made_dir = 0;
    if (rc == 0 && mkdir(out_dir, 0755) == 0) made_dir = 1;
    else if (rc == 0 && errno != EEXIST) {
        rc = 1;
        errorf(err, sizeof(err), "%s: cannot make the directory: %s", out_dir, strerror(errno));
    }
    if (rc == 0 && hs_write(path, ex, n, err, sizeof(err)) != 0) rc = 1;
    if (rc != 0 && made_dir) rmdir(out_dir);  // nothing left behind
    if (rc == 0) printf("prepare_data hellaswag: %d examples from %s into %s\n", n, in, path);
    else fprintf(stderr, "prepare_data hellaswag: %s\n", err);
    hs_free_parsed(ex, n);
    free(text);
    bpe_free(&bpe);
    return rc;
}

#endif
