/*
 * test.h: the few helpers every CPU test program shares.
 *
 * A test program calls check() once per assertion and ends with
 * `return test_summary();`, which prints the closing line
 * "N passed, N failed, N skipped" that dev/test/run_tests.sh adds up, and returns
 * the exit status (1 if anything failed).
 *
 * test_run runs a program and keeps its output; test_read_file reads back a
 * file it wrote; test_files_same compares two files.
 *
 * Test data that must not be committed (tinyshakespeare, the GPT-2 BPE files,
 * crypto vectors) is read from test_data_path(): $LLM3D_DATA, else
 * ../shared/data. A test whose data is missing calls skip() and moves on.
 */
#ifndef LLM3D_TEST_H
#define LLM3D_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int test_passed, test_failed, test_skipped;

static void test_vprint(const char *tag, const char *fmt, va_list ap) {
    printf("%-5s ", tag);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
}

// check: one assertion; returns ok so callers can stop a dependent sequence
static int check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    test_vprint(ok ? "ok" : "FAIL", fmt, ap);
    va_end(ap);
    if (ok) test_passed++; else test_failed++;
    return ok;
}

static void skip(const char *fmt, ...) {
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

// test_run: cmd through the shell with its stderr, and its stdout too when
// with_stdout (else stdout is dropped), written to the file log; out gets the
// first outlen - 1 bytes of that file. The exit status, or -1 when cmd did
// not exit
static int test_run(const char *cmd, const char *log, int with_stdout, char *out, size_t outlen) {
    char full[8192];
    if (with_stdout) snprintf(full, sizeof(full), "%s >%s 2>&1", cmd, log);
    else snprintf(full, sizeof(full), "%s >/dev/null 2>%s", cmd, log);
    int status = system(full);
    out[0] = '\0';
    FILE *f = fopen(log, "rb");
    if (f != NULL) {
        size_t n = fread(out, 1, outlen - 1, f);
        out[n] = '\0';
        fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// test_read_file: the whole file at path, malloc'd with a '\0' after it so
// that text reads as a string; *len (when not NULL) gets its bytes. NULL when
// it cannot be opened
static char *test_read_file(const char *path, size_t *len) {
    if (len != NULL) *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = (char *)malloc((size_t)n + 1);
    size_t got = fread(data, 1, (size_t)n, f);
    data[got] = '\0';
    fclose(f);
    if (len != NULL) *len = got;
    return data;
}

// test_files_same: whether the files at a and b both open and hold the
// same bytes, compared a block at a time (checkpoints are hundreds of MB)
static int test_files_same(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa != NULL && fb != NULL;
    static char ba[1 << 16], bb[1 << 16];
    while (same) {
        size_t na = fread(ba, 1, sizeof(ba), fa), nb = fread(bb, 1, sizeof(bb), fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (na == 0) break;
    }
    if (fa != NULL) fclose(fa);
    if (fb != NULL) fclose(fb);
    return same;
}

// test_write_shard: a token shard (dataloader.h's format) of ntok tokens < 256
// from a small repetitive "language", for tests that train on something; -1
// when the file cannot be made
static int test_write_shard(const char *path, int ntok) {
    int32_t h[256] = {20240520, 1, ntok};
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    fwrite(h, 4, 256, f);
    uint64_t x = 12345;
    for (int i = 0; i < ntok; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint16_t t = (uint16_t)(i % 7 == 0 ? 32 : 97 + (x >> 59) + (i % 3));
        fwrite(&t, 2, 1, f);
    }
    return fclose(f) == 0 ? 0 : -1;
}

#endif
