/*
 * dev/test/test_child.h: how a test's own ranks start (test_integrity,
 * test_parallel, test_host_mode), once their flags are read.
 *
 * defines:
 *   test_child_start   stdout line-buffered, the flags (test_run.h's
 *                      test_child_args) and the -fault they name, parsed
 *
 * Apart from test_run.h because it needs fault.h, and so secure.h, which
 * must come before any system header: a test includes it after its own
 * secure.h or parallel.h, as it includes fault.h itself.
 */
#ifndef LLM3D_TEST_CHILD_H
#define LLM3D_TEST_CHILD_H

#include <stdio.h>

#include "llm3d/secure/fault.h"  // Fault, fault_parse
#include "dev/test/test_run.h"   // TestChild, test_child_args

// a rank of a test, started as `PROGRAM child MODE ...`: a's flags, with
// -to default_to unless given, and fault the -fault among them (FAULT_NONE
// without one); 0, or 2 after one line on stderr
static int test_child_start(TestChild *a, Fault *fault, int argc, char **argv, double default_to) {
    char err[512];
    setvbuf(stdout, NULL, _IOLBF, 0);
    Fault none = {FAULT_NONE, -1, -1};
    *fault = none;
    if (test_child_args(a, argc, argv, default_to) != 0) return 2;
    if (a->fault != NULL && fault_parse(a->fault, fault, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    return 0;
}

#endif  // LLM3D_TEST_CHILD_H
