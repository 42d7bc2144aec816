/*
 * llm3d/errors.h: the project's error convention, and errorf, its one helper.
 *
 * defines:
 *   errorf   one line formatted into err (cut to errlen bytes, always
 *            terminated), and -1 returned
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

#endif // LLM3D_ERRORS_H
