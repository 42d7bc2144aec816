/*
 * test.h: the checks of every test program, CPU and GPU.
 *
 * A test program calls check() once per assertion and ends with
 * `return test_summary();`, which prints the closing line
 * "N passed, N failed, N skipped" that dev/test/run_tests.sh adds up, and returns
 * the exit status (1 if anything failed).
 *
 * Test data that must not be committed (tinyshakespeare, the GPT-2 BPE files,
 * crypto vectors) is read from test_data_path(): $LLM3D_DATA, else
 * ../shared/data. A test whose data is missing calls skip() and moves on.
 * What the tests do around their checks (files, commands, child processes)
 * is in test_run.h.
 *
 * defines: check, skip, test_summary, test_data_path
 */
#ifndef LLM3D_TEST_H
#define LLM3D_TEST_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int test_passed, test_failed, test_skipped;

static void test_vprint(const char *tag, const char *fmt, va_list ap) {
    printf("%-5s ", tag);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

// check: one assertion; returns ok so callers can stop a dependent sequence
static __attribute__((format(printf, 2, 3))) int check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    test_vprint(ok ? "ok" : "FAIL", fmt, ap);
    va_end(ap);
    if (ok) test_passed++; else test_failed++;
    return ok;
}

static __attribute__((format(printf, 1, 2))) void skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    test_vprint("skip", fmt, ap);
    va_end(ap);
    test_skipped++;
}

static int test_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", test_passed, test_failed, test_skipped);
    return test_failed > 0 ? 1 : 0;
}

// test_data_path: "<data dir>/<rel>" into out; returns 1 if the file exists
static int test_data_path(const char *rel, char *out, size_t outlen) {
    const char *dir = getenv("LLM3D_DATA");
    if (dir == NULL || dir[0] == '\0') dir = "../shared/data";
    snprintf(out, outlen, "%s/%s", dir, rel);
    return access(out, R_OK) == 0;
}

#endif
