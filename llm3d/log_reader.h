/*
 * log_reader.h: a run's JSON-lines log read back, for the tools that draw or
 * compare runs (plot_log.c, dev/compare_logs.c).
 *
 * defines:
 *   LogRecord        the numbers of one line a tool may want
 *   log_record_read  one line, a JSON object, into a LogRecord
 *   log_read         every line of a file, each handed to the tool's function
 *
 * The log is what the trainers write (gpt2.h's log_line): one JSON object a
 * line, with "step" (required, from 0) and any of "loss", "val_loss", "lr",
 * "ms", "tokens", "hellaswag", and a pipeline's "bubble" and "bubble_sim"
 * (its idle share measured, and the simulator's for the step's op costs;
 * watch.h's PipeMeter). A field that is missing or null (not
 * measured) reads as NAN; other fields are read past. Blank lines are skipped.
 *
 * Errors follow errors.h: one line naming the file, and for a bad line its
 * number and column: "PATH line N column C: why".
 */
#ifndef LLM3D_LOG_READER_H
#define LLM3D_LOG_READER_H

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"
#include "llm3d/json.h"

typedef struct {
    double step, loss, val_loss, hellaswag, lr, ms, tokens, bubble, bubble_sim;
} LogRecord;

// log_record_read: the line under j into r; -1 with j->err set when it is not
// an object, a field it names is not a number or null, or there is no "step"
static int log_record_read(JsonReader *j, LogRecord *r, JsonBuf *key) {
    r->step = r->loss = r->val_loss = r->hellaswag = r->lr = r->ms = r->tokens = r->bubble = r->bubble_sim = NAN;
    struct { const char *name; double *to; } fields[] = {
        {"step", &r->step}, {"loss", &r->loss}, {"val_loss", &r->val_loss}, {"hellaswag", &r->hellaswag},
        {"lr", &r->lr}, {"ms", &r->ms}, {"tokens", &r->tokens}, {"bubble", &r->bubble}, {"bubble_sim", &r->bubble_sim},
    };
    int index = 0, more;
    if (json_peek(j) != '{') return json_fail(j, "a line must be a JSON object");
    while ((more = json_object_next(j, &index, key)) == 1) {
        size_t k = 0;
        while (k < sizeof(fields) / sizeof(fields[0]) && strcmp(fields[k].name, key->bytes) != 0) k++;
        if (k == sizeof(fields) / sizeof(fields[0])) {
            if (json_skip_value(j) != 0) return -1;
        } else if (json_peek(j) == 'n') {  // null: not measured
            if (json_skip_value(j) != 0) return -1;
        } else if (json_number(j, fields[k].to) != 0) {
            return -1;
        }
    }
    if (more < 0 || json_at_end(j) != 0) return -1;
    if (isnan(r->step)) return json_fail(j, "no \"step\" field");
    return 0;
}

// LogUse: what a tool does with one line; it refuses the line by returning
// json_fail(j, why), which log_read reports with the line and column
typedef int (*LogUse)(void *ctx, const LogRecord *r, JsonReader *j);

// log_read: every line of the log at path, read and handed to use(ctx, ...),
// until the first line that fails; *lines (when not NULL) gets the number of
// lines read. 0, or -1 with err naming the file and line
static int log_read(const char *path, LogUse use, void *ctx, long *lines, char *err, size_t errlen) {
    FILE *f = fopen_regular(path, "", err, errlen);  // a FIFO is refused, not waited on
    if (f == NULL) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long number = 0;
    int rc = 0;
    JsonBuf key = {NULL, 0, 0};
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        number++;
        JsonReader j;
        json_init(&j, line, (size_t)len);
        if (json_peek(&j) < 0) continue;  // a blank line
        LogRecord r;
        if (log_record_read(&j, &r, &key) != 0 || use(ctx, &r, &j) != 0)
            rc = errorf(err, errlen, "%s line %ld column %zu: %s", path, number, j.err_pos + 1, j.err);
    }
    if (rc == 0 && ferror(f)) rc = errorf(err, errlen, "%s: read error: %s", path, strerror(errno));
    free(line);
    json_buf_free(&key);
    fclose(f);
    if (lines != NULL) *lines = number;
    return rc;
}

#endif
