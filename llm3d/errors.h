/*
 * llm3d/errors.h: the project's error convention, and its helpers.
 *
 * defines:
 *   errorf           one line formatted into err (cut to errlen bytes, always
 *                    terminated), and -1 returned
 *   flag_file_error  the error of a file a flag names, as one line led by the
 *                    flag and what the file is for (the trainers' and the
 *                    tools' lines for -e, -i, --key-file, ...)
 *
 * A function that can fail takes char *err, size_t errlen as its last two
 * parameters. On failure it writes one line into err that names the file,
 * field or flag and the value, for example
 *     data/train_000.bin: header[0] (magic) is 7, expected 20240520
 * and returns -1, or another code that its comment documents. It does not
 * print and does not exit: the caller decides whether to print the line and
 * exit, to add its own context, or to go on. err may be NULL (errlen 0) when
 * the caller wants only the code.
 *
 * A failing path then reads as one statement:
 *     if (magic != SHARD_MAGIC) return errorf(err, errlen, "%s: ...", path, ...);
 *
 * Plain C and C++ (nvcc), so every header and both trainers can use it.
 */
#ifndef LLM3D_ERRORS_H
#define LLM3D_ERRORS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

// errorf: format one line into err (cut to errlen bytes, always terminated)
// and return -1. The format attribute lets the compiler check the arguments.
__attribute__((format(printf, 3, 4)))
static inline __attribute__((format(printf, 3, 4))) int errorf(char *err, size_t errlen, const char *fmt, ...) {
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// flag_file_error: err, a loader's error about a file that flag names (most
// start "PATH: "), as one line that says the flag and what the file is for
// (role) first, then the file and why: "flag -tk (the tokenizer for samples):
// t.bin: cannot open: No such file or directory". kind is the loader's own
// name for such a file ("model file", "key file"; NULL for none). The role
// says what the file is for now, so where the loader's line names the kind
// ("PATH: cannot open KIND: why", "KIND PATH: why") it is dropped and the line
// says it once: "flag --key-file (the job key): k: No such file or
// directory", not "... (the job key): key file k: ...". The loaders keep their
// words for their other callers. A line that names a flag already is left as
// it is.
static inline void flag_file_error(char *err, size_t errlen, const char *flag, const char *role, const char *kind) {
    if (err == NULL || errlen == 0 || strncmp(err, "flag ", 5) == 0) return;
    size_t k = kind != NULL ? strlen(kind) : 0;
    const char *opening = ": cannot open ";  // files.h's open_regular: "PATH: cannot open KIND: why"
    size_t o = strlen(opening);
    char *at = k > 0 ? strstr(err, opening) : NULL;
    if (k > 0 && strncmp(err, kind, k) == 0 && err[k] == ' ')  // secure.h's key_read_file: "KIND PATH: why"
        memmove(err, err + k + 1, strlen(err + k + 1) + 1);
    else if (at != NULL && strncmp(at + o, kind, k) == 0 && at[o + k] == ':')
        memmove(at + o - 1, at + o + k, strlen(at + o + k) + 1);  // from the space before KIND on
    char prefix[256];
    int p = snprintf(prefix, sizeof(prefix), "flag %s (%s): ", flag, role);
    if (p < 0 || (size_t)p >= sizeof(prefix) || (size_t)p + 1 >= errlen) return;
    size_t n = strlen(err);
    if ((size_t)p + n + 1 > errlen) n = errlen - (size_t)p - 1;  // cut at errlen, as errorf cuts
    memmove(err + p, err, n);
    memcpy(err, prefix, (size_t)p);
    err[p + n] = '\0';
}

#endif // LLM3D_ERRORS_H
