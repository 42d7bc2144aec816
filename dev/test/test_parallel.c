/*
 * test_parallel.c: the rank grid (grid.h), the pipeline schedules and plans
 * (pipeline.h), the launcher and the rendezvous (launcher.h, rendezvous.h)
 * and the host communicator (shm_comm.h), with real processes.
 *
 * Run without arguments it is the test: in-process checks (grid math, flag
 * and environment handling, how ranks of outside launchers meet without
 * --rendezvous, the rendezvous server against forked clients),
 * then jobs of this same program started through parallel_main:
 *     ./test_parallel child MODE -np N [-to S] [-fault K:R:S] [--rendezvous A --key-file F]
 * The ranks of a job print one line per check, "R <rank> <name> ok|FAIL ...",
 * and "H <rank> <name> <hash>" for results that must be bit-identical on
 * every rank; the test reads those back and asserts on them.
 *
 * Build: make dev/test/test_parallel
 */
#include "parallel.h"
#include "llm3d/bf16.h"          // host mode's bf16 sums
#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "dev/test/test_child.h"

#include <math.h>
#include <sys/stat.h>

// ----------------------------------------------------------------------------
// shared by both sides

// test_value: a reproducible float in [-1, 1) for (seed, index)
static float test_value(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1 << 24)) * 2.0f - 1.0f;
}

// exact: small multiples of 1/8, so every order of summation gives the same float
static float exact_value(int rank, size_t i) { return (float)((rank + 1) * 1000 + (int)(i % 997)) * 0.125f; }

static uint64_t fnv1a(const void *p, size_t n) {
    const uint8_t *b = (const uint8_t *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// ring_sum: what the ring reduction computes for an element of chunk k:
// ((x[k+1] + x[k+2]) + ...) + x[k], with x[q] = test_value(seed_base + q, i)
static float ring_sum(int size, int k, uint64_t seed_base, size_t i) {
    float acc = test_value(seed_base + (uint64_t)((k + 1) % size), i);
    for (int t = 2; t <= size; t++) acc = acc + test_value(seed_base + (uint64_t)((k + t) % size), i);
    return acc;
}

static const char *COLL_CHECKS[] = {
    "allreduce_sum", "allreduce_avg", "allreduce_order", "allreduce_rerun", "allreduce_bytes", "allreduce_bytes_uneven",
    "reduce_scatter", "reduce_scatter_avg", "reduce_scatter_inplace", "reduce_scatter_bytes",
    "allgather", "allgather_bytes", "broadcast", "broadcast_bytes", "broadcast_root0", "barrier", "barrier_bytes",
    "p2p", "p2p_bytes", "sendrecv_big", "send_big", "sendrecv_bytes",
};
static const char *COLL_HASHES[] = {"allreduce_order", "allgather", "broadcast"};
#define NCOLL_CHECKS (int)(sizeof(COLL_CHECKS) / sizeof(COLL_CHECKS[0]))
#define NCOLL_HASHES (int)(sizeof(COLL_HASHES) / sizeof(COLL_HASHES[0]))

// ----------------------------------------------------------------------------
// the rank side: test_rank_check's "R" lines, and these "H" lines

static void hlog(int rank, const char *name, const void *p, size_t n) {
    printf("H %d %s %016llx\n", rank, name, (unsigned long long)fnv1a(p, n));
    fflush(stdout);
}

// bytes_delta_ok: since `before`, counter `which` grew by `want` and no other moved
static int bytes_delta_ok(const Comm *c, const uint64_t before[COMM_NCOUNTERS], int which, uint64_t want, char *why,
                          size_t whylen) {
    uint64_t now[COMM_NCOUNTERS];
    comm_get_bytes(c, now);
    for (int i = 0; i < COMM_NCOUNTERS; i++) {
        uint64_t d = now[i] - before[i], expect = i == which ? want : 0;
        if (d != expect) {
            snprintf(why, whylen, "counter %s grew by %llu, expected %llu", comm_counter_name(i), (unsigned long long)d,
                     (unsigned long long)expect);
            return 0;
        }
    }
    snprintf(why, whylen, "%llu bytes", (unsigned long long)want);
    return 1;
}

static void run_collectives(Comm *c, const Grid *g) {
    Group world;
    grid_groups(g, &world, NULL, NULL, NULL);
    int W = world.size, me = world.me, r = g->rank;
    uint64_t before[COMM_NCOUNTERS];
    char why[200];

    // all-reduce of exactly representable values: sum and average
    size_t N = 1000 * (size_t)W + 7;
    float *buf = (float *)malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) buf[i] = exact_value(r, i);
    comm_get_bytes(c, before);
    comm_allreduce(c, &world, buf, N, OP_SUM);
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < W; q++) want += exact_value(q, i);
        if (buf[i] != want) bad++;
    }
    test_rank_check(r, "allreduce_sum", bad == 0, "%zu of %zu wrong", bad, N);
    // uneven chunks: member i sends everything but chunks i and i+1, twice over
    size_t c_me = N * (size_t)(me + 1) / W - N * (size_t)me / W;
    size_t c_nx = N * (size_t)((me + 1) % W + 1) / W - N * (size_t)((me + 1) % W) / W;
    test_rank_check(r, "allreduce_bytes_uneven",
                    bytes_delta_ok(c, before, COMM_ALLREDUCE, 4 * (2 * N - c_me - c_nx), why, sizeof(why)),
                    "%s", why);
    for (size_t i = 0; i < N; i++) buf[i] = exact_value(r, i);
    comm_allreduce(c, &world, buf, N, OP_AVG);
    bad = 0;
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < W; q++) want += exact_value(q, i);
        if (buf[i] != want / (float)W) bad++;
    }
    test_rank_check(r, "allreduce_avg", bad == 0, "%zu of %zu wrong", bad, N);
    free(buf);

    // all-reduce of arbitrary floats, several frames per chunk: the result is
    // the documented ring order, bit for bit, the same on a second run
    N = 100003;
    float *x = (float *)malloc(N * sizeof(float)), *y = (float *)malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++) x[i] = y[i] = test_value(100 + (uint64_t)r, i);
    comm_allreduce(c, &world, x, N, OP_SUM);
    bad = 0;
    for (int k = 0; k < W; k++) {
        for (size_t i = N * (size_t)k / W; i < N * (size_t)(k + 1) / W; i++) {
            float want = ring_sum(W, k, 100, i);
            if (memcmp(&want, &x[i], 4) != 0) bad++;
        }
    }
    test_rank_check(r, "allreduce_order", bad == 0, "%zu of %zu differ from the ring order", bad, N);
    hlog(r, "allreduce_order", x, N * sizeof(float));
    comm_allreduce(c, &world, y, N, OP_SUM);
    test_rank_check(r, "allreduce_rerun", memcmp(x, y, N * sizeof(float)) == 0, "second run bit-identical");
    free(x);
    free(y);

    // byte count against 2 (n-1)/n x bytes
    N = 1200 * (size_t)W;
    buf = (float *)calloc(N, sizeof(float));
    comm_get_bytes(c, before);
    comm_allreduce(c, &world, buf, N, OP_SUM);
    test_rank_check(r, "allreduce_bytes",
                    bytes_delta_ok(c, before, COMM_ALLREDUCE, 2 * (uint64_t)(W - 1) * 4 * N / W, why, sizeof(why)),
                    "%s", why);
    free(buf);

    // reduce-scatter: my chunk, in ring order; the average; in place
    size_t n = 20000 + (size_t)W;
    float *in = (float *)malloc((size_t)W * n * sizeof(float)), *out = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < (size_t)W * n; i++) in[i] = test_value(200 + (uint64_t)r, i);
    comm_get_bytes(c, before);
    comm_reduce_scatter(c, &world, in, out, n, OP_SUM);
    test_rank_check(r, "reduce_scatter_bytes",
                    bytes_delta_ok(c, before, COMM_REDUCE_SCATTER, (uint64_t)(W - 1) * 4 * n, why, sizeof(why)),
                    "%s", why);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = ring_sum(W, me, 200, (size_t)me * n + i);
        if (memcmp(&want, &out[i], 4) != 0) bad++;
    }
    test_rank_check(r, "reduce_scatter", bad == 0, "%zu of %zu differ", bad, n);
    comm_reduce_scatter(c, &world, in, in + (size_t)me * n, n, OP_SUM);
    test_rank_check(r, "reduce_scatter_inplace", memcmp(out, in + (size_t)me * n, n * sizeof(float)) == 0, "out = in + me*n");
    for (size_t i = 0; i < (size_t)W * n; i++) in[i] = exact_value(r, i);
    comm_reduce_scatter(c, &world, in, out, n, OP_AVG);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int q = 0; q < W; q++) want += exact_value(q, (size_t)me * n + i);
        if (out[i] != want / (float)W) bad++;
    }
    test_rank_check(r, "reduce_scatter_avg", bad == 0, "%zu of %zu wrong", bad, n);
    free(in);
    free(out);

    // all-gather
    n = 30001;
    in = (float *)malloc(n * sizeof(float));
    out = (float *)malloc((size_t)W * n * sizeof(float));
    for (size_t i = 0; i < n; i++) in[i] = (float)(r * 100000 + (int)i);
    comm_get_bytes(c, before);
    comm_allgather(c, &world, in, out, n);
    test_rank_check(r, "allgather_bytes",
                    bytes_delta_ok(c, before, COMM_ALLGATHER, (uint64_t)(W - 1) * 4 * n, why, sizeof(why)),
                    "%s", why);
    bad = 0;
    for (int q = 0; q < W; q++)
        for (size_t i = 0; i < n; i++) if (out[(size_t)q * n + i] != (float)(q * 100000 + (int)i)) bad++;
    test_rank_check(r, "allgather", bad == 0, "%zu of %zu wrong", bad, (size_t)W * n);
    hlog(r, "allgather", out, (size_t)W * n * sizeof(float));
    free(in);
    free(out);

    // broadcast from the last member (bytes, an odd count over several frames), then from 0
    size_t nb = 150001;
    uint8_t *b = (uint8_t *)malloc(nb);
    for (size_t i = 0; i < nb; i++) b[i] = me == W - 1 ? (uint8_t)(i * 7 + 3) : 0xEE;
    comm_get_bytes(c, before);
    comm_broadcast(c, &world, b, nb, W - 1);
    // every member forwards except the one just before the root in ring order
    uint64_t want_b = me == W - 2 || W == 1 ? 0 : nb;
    test_rank_check(r, "broadcast_bytes", bytes_delta_ok(c, before, COMM_BROADCAST, want_b, why, sizeof(why)), "%s", why);
    bad = 0;
    for (size_t i = 0; i < nb; i++) if (b[i] != (uint8_t)(i * 7 + 3)) bad++;
    test_rank_check(r, "broadcast", bad == 0, "%zu of %zu bytes wrong", bad, nb);
    hlog(r, "broadcast", b, nb);
    uint64_t word = me == 0 ? 0x1122334455667788ull : 0;
    comm_broadcast(c, &world, &word, sizeof(word), 0);
    test_rank_check(r, "broadcast_root0", word == 0x1122334455667788ull, "%016llx", (unsigned long long)word);
    free(b);

    // barrier: member k arrives k x 30 ms late; nobody may leave before the
    // last one arrived (CLOCK_MONOTONIC is one clock for every process)
    par_sleep(0.03 * me);
    comm_get_bytes(c, before);
    double arrive = test_now();
    comm_barrier(c, &world);
    double leave = test_now();
    test_rank_check(r, "barrier_bytes", bytes_delta_ok(c, before, COMM_BARRIER, 0, why, sizeof(why)), "%s", why);
    float mine[2], all[2 * GRID_MAX_WORLD];
    memcpy(mine, &arrive, sizeof(arrive));
    comm_allgather(c, &world, mine, all, 2);
    double last = 0;
    for (int q = 0; q < W; q++) {
        double t;
        memcpy(&t, &all[2 * q], sizeof(t));
        if (t > last) last = t;
    }
    test_rank_check(r, "barrier", leave >= last, "left %.4f s after the last arrival", leave - last);

    // point to point on several channels, sizes 0, 8, 1000 and 100000 bytes
    int next = comm_next(&world), prev = comm_prev(&world);
    size_t na = 100000;
    uint8_t *act = (uint8_t *)malloc(na), *got = (uint8_t *)malloc(na);
    for (size_t i = 0; i < na; i++) act[i] = (uint8_t)(r + i);
    float grad[250], grad_in[250];
    for (int i = 0; i < 250; i++) grad[i] = (float)(r * 1000 + i);
    uint64_t ctl = 0xC0DE0000ull + (uint64_t)r, ctl_in = 0;
    comm_get_bytes(c, before);
    comm_send(c, next, CH_ACTIVATION, 0, act, na);
    comm_send(c, next, CH_ACTIVATION, 1, NULL, 0);
    comm_send(c, prev, CH_GRADIENT, 3, grad, sizeof(grad));
    comm_send(c, next, CH_CONTROL, 0, &ctl, sizeof(ctl));
    comm_recv(c, prev, CH_ACTIVATION, 0, got, na);
    comm_recv(c, prev, CH_ACTIVATION, 1, NULL, 0);
    comm_recv(c, next, CH_GRADIENT, 3, grad_in, sizeof(grad_in));
    comm_recv(c, prev, CH_CONTROL, 0, &ctl_in, sizeof(ctl_in));
    bad = 0;
    for (size_t i = 0; i < na; i++) if (got[i] != (uint8_t)(prev + i)) bad++;
    for (int i = 0; i < 250; i++) if (grad_in[i] != (float)(next * 1000 + i)) bad++;
    if (ctl_in != 0xC0DE0000ull + (uint64_t)prev) bad++;
    test_rank_check(r, "p2p", bad == 0, "%zu wrong", bad);
    uint64_t now[COMM_NCOUNTERS];
    comm_get_bytes(c, now);
    int ok = now[COMM_P2P + CH_ACTIVATION] - before[COMM_P2P + CH_ACTIVATION] == na &&
             now[COMM_P2P + CH_GRADIENT] - before[COMM_P2P + CH_GRADIENT] == sizeof(grad) &&
             now[COMM_P2P + CH_CONTROL] - before[COMM_P2P + CH_CONTROL] == sizeof(ctl) &&
             now[COMM_ALLREDUCE] == before[COMM_ALLREDUCE];
    test_rank_check(r, "p2p_bytes", ok, "activation %llu gradient %llu control %llu",
                    (unsigned long long)(now[COMM_P2P + CH_ACTIVATION] - before[COMM_P2P + CH_ACTIVATION]),
                    (unsigned long long)(now[COMM_P2P + CH_GRADIENT] - before[COMM_P2P + CH_GRADIENT]),
                    (unsigned long long)(now[COMM_P2P + CH_CONTROL] - before[COMM_P2P + CH_CONTROL]));
    free(act);
    free(got);

    // 1 MB, twice a ring's capacity: everyone sends and receives at once (sendrecv),
    // then rank 0 -> 1 with a plain blocking send against a receiving peer
    size_t big = 1 << 20;
    uint8_t *sb = (uint8_t *)malloc(big), *rb = (uint8_t *)malloc(big);
    for (size_t i = 0; i < big; i++) sb[i] = (uint8_t)(i * 13 + (size_t)r);
    comm_get_bytes(c, before);
    comm_sendrecv(c, next, CH_PARAM, 7, sb, big, prev, CH_PARAM, 7, rb, big);
    test_rank_check(r, "sendrecv_bytes", bytes_delta_ok(c, before, COMM_P2P + CH_PARAM, big, why, sizeof(why)), "%s", why);
    bad = 0;
    for (size_t i = 0; i < big; i++) if (rb[i] != (uint8_t)(i * 13 + (size_t)prev)) bad++;
    test_rank_check(r, "sendrecv_big", bad == 0, "%zu of %zu wrong", bad, big);
    ok = 1;
    if (r == 0) comm_send(c, 1, CH_CHECK, 0, sb, big);
    if (r == 1) {
        memset(rb, 0, big);
        comm_recv(c, 0, CH_CHECK, 0, rb, big);
        for (size_t i = 0; i < big; i++) ok &= rb[i] == (uint8_t)(i * 13);
    }
    test_rank_check(r, "send_big", ok, "rank 0 -> 1, %zu bytes", big);
    free(sb);
    free(rb);

    // groups smaller than the world (4 ranks as tp 2 x dp 2): rings over their members only
    if (g->tp == 2) {
        Group dp, tp;
        grid_groups(g, NULL, &dp, &tp, NULL);
        float v[777], w[777];
        for (int i = 0; i < 777; i++) v[i] = w[i] = exact_value(r, (size_t)i);
        comm_allreduce(c, &tp, v, 777, OP_SUM);
        comm_allreduce(c, &dp, w, 777, OP_SUM);
        bad = 0;
        for (int i = 0; i < 777; i++) {
            float wt = 0, wd = 0;
            for (int k = 0; k < tp.size; k++) wt += exact_value(tp.ranks[k], (size_t)i);
            for (int k = 0; k < dp.size; k++) wd += exact_value(dp.ranks[k], (size_t)i);
            if (v[i] != wt || w[i] != wd) bad++;
        }
        test_rank_check(r, "subgroups", bad == 0, "tp {%d,%d} dp {%d,%d}: %zu wrong", tp.ranks[0], tp.ranks[1], dp.ranks[0],
                        dp.ranks[1], bad);
    }
    comm_barrier(c, &world);
}

// run_steps: five steps of an all-reduce, a ring of activations and a
// barrier; what the fault tests break
static void run_steps(Comm *c, const Grid *g) {
    Group world;
    grid_groups(g, &world, NULL, NULL, NULL);
    int r = g->rank, W = g->world;
    size_t bad = 0;
    for (long step = 0; step < 5; step++) {
        comm_set_step(c, step);
        float buf[3000];
        for (int i = 0; i < 3000; i++) buf[i] = exact_value(r, (size_t)i);
        comm_allreduce(c, &world, buf, 3000, OP_SUM);
        for (int i = 0; i < 3000; i++) {
            float want = 0;
            for (int q = 0; q < W; q++) want += exact_value(q, (size_t)i);
            if (buf[i] != want) bad++;
        }
        uint8_t act[5000], got[5000];
        for (int i = 0; i < 5000; i++) act[i] = (uint8_t)(step + r + i);
        comm_send(c, comm_next(&world), CH_ACTIVATION, (int)step, act, sizeof(act));
        comm_recv(c, comm_prev(&world), CH_ACTIVATION, (int)step, got, sizeof(got));
        for (int i = 0; i < 5000; i++) if (got[i] != (uint8_t)(step + comm_prev(&world) + i)) bad++;
        comm_barrier(c, &world);
    }
    test_rank_check(r, "steps", bad == 0, "%zu wrong", bad);
}

// intruder: a process that tries to join a running job; exits 0 if rejected
static int intruder(const char *spec, const uint8_t key[32], uint64_t job_id, int rank, int world) {
    pid_t pid = fork();
    if (pid == 0) {
        RdvAnswer ans;
        char err[512];
        int rc = rdv_join(spec, key, job_id, rank, world, rank, NULL, 3.0, &ans, err, sizeof(err));
        _exit(rc != 0 && strstr(err, "rejected") != NULL ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void run_intruders(Comm *c, const Grid *g, const Launch *L) {
    Group world;
    grid_groups(g, &world, NULL, NULL, NULL);
    int r = g->rank;
    float v[100];
    for (int i = 0; i < 100; i++) v[i] = 1.0f;
    comm_allreduce(c, &world, v, 100, OP_SUM);  // the job is running
    if (r == 0) {
        uint8_t other[32];
        key_generate(other, NULL, 0);
        uint64_t job = job_id_from_key(L->key);
        test_rank_check(r, "intruder_key", intruder(L->rendezvous, other, job_id_from_key(other), 1, g->world), "wrong key");
        test_rank_check(r, "intruder_job", intruder(L->rendezvous, L->key, job ^ 0x5a5a, 1, g->world),
                        "right key, wrong job id");
        test_rank_check(r, "intruder_world", intruder(L->rendezvous, L->key, job, 1, g->world + 1), "wrong world size");
        test_rank_check(r, "intruder_late", intruder(L->rendezvous, L->key, job, 1, g->world),
                        "duplicate rank after all joined");
    }
    comm_allreduce(c, &world, v, 100, OP_SUM);  // and runs on
    test_rank_check(r, "job_runs_on", v[0] == (float)(g->world * g->world), "%g", v[0]);
}

static int child_main(int argc, char **argv) {
    TestChild a;
    Fault fault;
    if (test_child_start(&a, &fault, argc, argv, 5.0) != 0) return 2;
    const char *mode = a.mode;
    char err[512];
    Launch L;
    int rc = parallel_main(argc, argv, a.np, a.rendezvous, a.key_file, NULL, a.to, &L, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return rc;
    }
    if (strcmp(mode, "usage") == 0 && L.rank == 1) {
        fprintf(stderr, "rank 1: -x 0: a flag only this rank refuses (test)\n");
        return 2;
    }
    Grid g;
    int tp = strcmp(mode, "coll") == 0 && L.world == 4 ? 2 : 1;
    if (grid_init(&g, L.world, tp, 1, L.rank, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    g.local_rank = L.local_rank;
    Comm *c;
    if (comm_init(&c, &g, L.key, L.rendezvous, a.to, &fault, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", L.rank, err);
        return 1;
    }
    printf("R %d launch ok source %s rank %d world %d local %d\n", L.rank, L.source, L.rank, L.world, L.local_rank);
    fflush(stdout);
    if (strcmp(mode, "coll") == 0) run_collectives(c, &g);
    else if (strcmp(mode, "steps") == 0) run_steps(c, &g);
    else if (strcmp(mode, "intruder") == 0) run_intruders(c, &g, &L);
    comm_free(c);
    launch_free(&L);
    return test_rank_failures > 0 ? 1 : 0;
}

// ----------------------------------------------------------------------------
// the test side

static char self_exe[4096];
static char work_dir[256];

// spawn: this program with args (NULL-terminated, after argv[0]), env
// entries "K=V" (NULL-terminated), stdout and stderr appended to the files
// (test_spawn)
static pid_t spawn(const char *const *args, const char *const *env, const char *out_path, const char *err_path) {
    char *argv[32];
    int n = 0;
    argv[n++] = self_exe;
    for (int i = 0; args[i] != NULL && n < 31; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    return test_spawn(argv, env, out_path, err_path);
}

typedef struct { int status; double elapsed; char *out, *err; } Job;

// run_job: a job through the launcher: ./test_parallel child MODE -np N ...
static Job run_job(const char *mode, int np, const char *to, const char *fault) {
    char out_path[300], err_path[300], nps[16];
    snprintf(out_path, sizeof(out_path), "%s/out.txt", work_dir);
    snprintf(err_path, sizeof(err_path), "%s/err.txt", work_dir);
    unlink(out_path);
    unlink(err_path);
    snprintf(nps, sizeof(nps), "%d", np);
    const char *args[12] = {"child", mode, "-np", nps, "-to", to, NULL};
    if (fault != NULL) {
        args[6] = "-fault";
        args[7] = fault;
        args[8] = NULL;
    }
    Job j;
    pid_t pid = spawn(args, NULL, out_path, err_path);
    j.status = test_wait(pid, 40.0, &j.elapsed);
    j.out = test_read_text(out_path);
    j.err = test_read_text(err_path);
    return j;
}

static void job_free(Job *j) {
    free(j->out);
    free(j->err);
}

// check_rank_lines: every rank printed "R r name ok" for every name
static void check_rank_lines(const char *what, const char *out, int world, const char **names, int nnames) {
    for (int k = 0; k < nnames; k++) {
        int ranks_ok = 0;
        char detail[256] = "";
        for (int r = 0; r < world; r++) {
            if (test_rank_ok(out, r, names[k])) {
                ranks_ok++;
                continue;
            }
            char want[128];
            snprintf(want, sizeof(want), "R %d %s FAIL", r, names[k]);
            const char *f = strstr(out, want);
            if (f != NULL && detail[0] == '\0') {
                const char *eol = strchr(f, '\n');
                snprintf(detail, sizeof(detail), ": %.*s", (int)(eol != NULL ? eol - f : 100), f);
            }
        }
        check(ranks_ok == world, "%s: %s on %d of %d ranks%s", what, names[k], ranks_ok, world, detail);
    }
}

// check_hashes: "H r name hash" present on every rank and equal
static void check_hashes(const char *what, const char *out, int world, const char **names, int nnames) {
    for (int k = 0; k < nnames; k++) {
        char first[32] = "";
        int same = 0;
        for (int r = 0; r < world; r++) {
            char want[128];
            snprintf(want, sizeof(want), "H %d %s ", r, names[k]);
            const char *p = strstr(out, want);
            if (p == NULL) continue;
            char h[32];
            snprintf(h, sizeof(h), "%.16s", p + strlen(want));
            if (r == 0) snprintf(first, sizeof(first), "%s", h);
            if (strcmp(h, first) == 0) same++;
        }
        check(same == world, "%s: %s bit-identical on %d of %d ranks (%s)", what, names[k], same, world, first);
    }
}

static void test_grid(void) {
    Grid g;
    char err[256];
    // rank = ((dp_rank * pp) + pp_rank) * tp + tp_rank, and every coordinate round-trips, for several layouts
    int layouts[][3] = {{1, 1, 1}, {2, 2, 1}, {4, 1, 4}, {8, 2, 2}, {12, 2, 3}, {16, 4, 2}, {6, 1, 3}, {256, 4, 8}};
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++) {
        int W = layouts[k][0], tp = layouts[k][1], pp = layouts[k][2], bad = 0;
        for (int r = 0; r < W; r++) {
            if (grid_init(&g, W, tp, pp, r, err, sizeof(err)) != 0) { bad++; continue; }
            if (((g.dp_rank * pp) + g.pp_rank) * tp + g.tp_rank != r) bad++;
            if (grid_rank(&g, g.dp_rank, g.pp_rank, g.tp_rank) != r) bad++;
            if (g.dp != W / (tp * pp) || g.tp_rank >= tp || g.pp_rank >= pp || g.dp_rank >= g.dp) bad++;
        }
        check(bad == 0, "grid: np %d tp %d pp %d: rank = ((dp_rank*pp)+pp_rank)*tp+tp_rank for every rank", W, tp, pp);
    }
    grid_init(&g, 8, 2, 2, 5, err, sizeof(err));
    check(g.dp == 2 && g.dp_rank == 1 && g.pp_rank == 0 && g.tp_rank == 1 && g.local_rank == 5,
          "grid: np 8 tp 2 pp 2 rank 5 is dp 1, pp 0, tp 1 (got dp %d pp %d tp %d)", g.dp_rank, g.pp_rank, g.tp_rank);
    Group world, dp, tp, pp;
    grid_groups(&g, &world, &dp, &tp, &pp);
    check(world.size == 8 && world.me == 5 && world.ranks[7] == 7, "groups: world of 8, me 5");
    check(tp.size == 2 && tp.me == 1 && tp.ranks[0] == 4 && tp.ranks[1] == 5, "groups: tp {%d,%d} me %d, expected {4,5} me 1",
          tp.ranks[0], tp.ranks[1], tp.me);
    check(pp.size == 2 && pp.me == 0 && pp.ranks[0] == 5 && pp.ranks[1] == 7, "groups: pp {%d,%d} me %d, expected {5,7} me 0",
          pp.ranks[0], pp.ranks[1], pp.me);
    check(dp.size == 2 && dp.me == 1 && dp.ranks[0] == 1 && dp.ranks[1] == 5, "groups: dp {%d,%d} me %d, expected {1,5} me 1",
          dp.ranks[0], dp.ranks[1], dp.me);
    grid_init(&g, 12, 2, 3, 7, err, sizeof(err));
    grid_groups(&g, NULL, &dp, &tp, &pp);
    check(pp.size == 3 && pp.me == 0 && pp.ranks[0] == 7 && pp.ranks[1] == 9 && pp.ranks[2] == 11 && dp.size == 2 &&
          dp.me == 1 && dp.ranks[0] == 1 && dp.ranks[1] == 7 && tp.ranks[0] == 6 && tp.ranks[1] == 7,
          "groups: np 12 tp 2 pp 3 rank 7: pp {%d,%d,%d} dp {%d,%d} tp {%d,%d}, expected {7,9,11} {1,7} {6,7}",
          pp.ranks[0], pp.ranks[1], pp.ranks[2], dp.ranks[0], dp.ranks[1], tp.ranks[0], tp.ranks[1]);

    check(grid_init(&g, 6, 4, 1, 0, err, sizeof(err)) != 0 && strstr(err, "-np 6 is not divisible by -tp 4 x -pp 1 = 4"),
          "grid error: %s", err);
    check(grid_init(&g, 8, 0, 1, 0, err, sizeof(err)) != 0 && strstr(err, "-tp 0"), "grid error: %s", err);
    check(grid_init(&g, 8, 2, 3, 0, err, sizeof(err)) != 0 && strstr(err, "-pp 3 = 6"), "grid error: %s", err);
    check(grid_init(&g, 0, 1, 1, 0, err, sizeof(err)) != 0 && strstr(err, "-np 0"), "grid error: %s", err);
    check(grid_init(&g, 300, 1, 1, 0, err, sizeof(err)) != 0 && strstr(err, "-np 300"), "grid error: %s", err);
    check(grid_init(&g, 4, 1, 1, 4, err, sizeof(err)) != 0 && strstr(err, "rank 4"), "grid error: %s", err);
    check(grid_init(&g, 4, 1, 8, 0, err, sizeof(err)) != 0 && strstr(err, "-pp 8"), "grid error: %s", err);

    grid_init(&g, 8, 4, 2, 0, err, sizeof(err));
    check(grid_check_model(&g, 12, 12, 768, 50304, err, sizeof(err)) == 0, "model check: d12 on tp 4 pp 2 fits");
    check(grid_check_model(&g, 12, 6, 768, 50304, err, sizeof(err)) != 0 && strstr(err, "6 heads"), "model error: %s", err);
    check(grid_check_model(&g, 12, 12, 768, 50257, err, sizeof(err)) != 0 && strstr(err, "Vp = 50257"), "model error: %s", err);
    check(grid_check_model(&g, 1, 12, 768, 50304, err, sizeof(err)) != 0 && strstr(err, "1 layers"), "model error: %s", err);
    grid_init(&g, 8, 8, 1, 0, err, sizeof(err));
    check(grid_check_model(&g, 12, 8, 1, 50304, err, sizeof(err)) != 0 && strstr(err, "4C = 4"), "model error: %s", err);
}

static void test_addresses(void) {
    RdvAddr a;
    char err[256];
    check(rdv_parse("unix:/tmp/x.sock", &a, err, sizeof(err)) == 0 && a.is_unix && strcmp(a.path, "/tmp/x.sock") == 0,
          "rendezvous unix:/tmp/x.sock");
    check(rdv_parse("tcp:localhost:29500", &a, err, sizeof(err)) == 0 && !a.is_unix && strcmp(a.host, "127.0.0.1") == 0 &&
          a.port == 29500, "rendezvous tcp:localhost:29500 -> 127.0.0.1:29500");
    check(rdv_parse("tcp:10.1.2.3:7", &a, err, sizeof(err)) == 0 && strcmp(a.host, "10.1.2.3") == 0 && a.port == 7,
          "rendezvous tcp:10.1.2.3:7");
    const char *bad[] = {"", "foo:bar", "unix:", "tcp:1.2.3.4", "tcp:1.2.3.4:0", "tcp:1.2.3.4:70000", "tcp:host:12",
                         "tcp:1.2.3.4:12x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        check(rdv_parse(bad[i], &a, err, sizeof(err)) != 0 && strstr(err, "--rendezvous") != NULL,
              "rendezvous '%s' refused: %s", bad[i], err);
}

// test_launch_env: parallel_main's choice of role, in-process (never the launcher)
static void test_launch_env(const char *key_path, const uint8_t key[32]) {
    char *argv[] = {self_exe, NULL};
    Launch L;
    char err[512];
    test_clear_rank_env();
    int rc = parallel_main(1, argv, 1, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.mode == LAUNCH_SINGLE && L.world == 1 && L.rank == 0 && !key_is_zero(L.key),
          "launch: -np 1, no environment: a single process with its own key");
    launch_free(&L);

    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "4", 1);
    rc = parallel_main(1, argv, 1, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.mode == LAUNCH_SINGLE, "launch: Slurm variables without --rendezvous are not a rank");
    launch_free(&L);
    test_clear_rank_env();

    setenv("LLM3D_RANK", "1", 1);
    setenv("LLM3D_WORLD", "2", 1);
    rc = parallel_main(1, argv, 1, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "LLM3D_RENDEZVOUS"), "launch error: %s", err);
    setenv("LLM3D_RANK", "x", 1);
    rc = parallel_main(1, argv, 1, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "LLM3D_RANK='x'"), "launch error: %s", err);
    setenv("LLM3D_RANK", "2", 1);
    rc = parallel_main(1, argv, 1, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "LLM3D_RANK=2 is not below LLM3D_WORLD=2"), "launch error: %s", err);
    test_clear_rank_env();

    rc = parallel_main(1, argv, 1, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "no rank in the environment"), "launch error: %s", err);
    rc = parallel_main(1, argv, 2, "bogus", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "--rendezvous 'bogus'"), "launch error: %s", err);
    rc = parallel_main(1, argv, 0, NULL, NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "-np 0"), "launch error: %s", err);
    rc = parallel_main(1, argv, 2, NULL, NULL, NULL, 0.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "-to 0"), "launch error: %s", err);

    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "3", 1);
    setenv("LOCAL_RANK", "0", 1);
    rc = parallel_main(1, argv, 1, "unix:/tmp/nowhere.sock", NULL, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "no --key-file"), "launch error: %s", err);
    rc = parallel_main(1, argv, 4, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "-np 4") && strstr(err, "3"), "launch error: %s", err);
    rc = parallel_main(1, argv, 3, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.mode == LAUNCH_RANK && L.rank == 1 && L.world == 3 && L.local_rank == 0 &&
          strcmp(L.source, "torchrun") == 0 && memcmp(L.key, key, 32) == 0 && L.server == NULL,
          "launch: torchrun variables + --rendezvous + --key-file: rank 1 of 3, local 0, key from the file");
    launch_free(&L);
    unsetenv("WORLD_SIZE");
    rc = parallel_main(1, argv, 1, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == PARALLEL_USAGE && strstr(err, "RANK=1 is set but WORLD_SIZE is not"), "launch error: %s", err);
    test_clear_rank_env();

    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    rc = parallel_main(1, argv, 1, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.rank == 2 && L.world == 4 && L.local_rank == 1 && strcmp(L.source, "Open MPI") == 0,
          "launch: Open MPI variables: rank 2 of 4, local 1");
    launch_free(&L);
    test_clear_rank_env();
    // no local rank variable: the rank is its own local rank (one box), not 0
    setenv("RANK", "2", 1);
    setenv("WORLD_SIZE", "4", 1);
    rc = parallel_main(1, argv, 4, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.rank == 2 && L.world == 4 && L.local_rank == 2 && strcmp(L.source, "torchrun") == 0,
          "launch: RANK and WORLD_SIZE without LOCAL_RANK: rank 2 of 4, local 2 (got rc %d, local %d)", rc, L.local_rank);
    if (rc == 0) launch_free(&L);
    test_clear_rank_env();
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "3", 1);
    rc = parallel_main(1, argv, 1, "unix:/tmp/nowhere.sock", key_path, NULL, 5.0, &L, err, sizeof(err));
    check(rc == 0 && L.rank == 3 && L.world == 8 && L.local_rank == 3 && strcmp(L.source, "Slurm") == 0,
          "launch: Slurm variables: rank 3 of 8");
    launch_free(&L);
    test_clear_rank_env();
}

// test_meet_plan: how the ranks of an outside launcher meet without
// --rendezvous (meet_plan), decided from their variables and llm.c's flags
static void test_meet_plan(const char *key_path) {
    struct {
        const char *name, *env;   // the variables, "K=V" separated by spaces
        LaunchMeet m;
        int want;                 // meet_plan's return
        int by_dir, one_box, world, rank, local;
        const char *dir_name, *err;
    } cases[] = {
        {"mpirun on one box, -o", "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 "
         "OMPI_COMM_WORLD_LOCAL_SIZE=4 PMIX_NAMESPACE=prterun-box-123@1", {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL},
         1, 1, 1, 4, 1, 1, "llm3d-rendezvous-ompi-prterun-box-123_1", NULL},
        {"mpirun without -o", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=2 "
         "OMPI_MCA_ess_base_jobid=9", {NULL, 0, -1, 8, MEET_MPI, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "give -o DIR, where the ranks of one box meet"},
        {"mpirun on two nodes, -pi mpi", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=16 OMPI_COMM_WORLD_LOCAL_SIZE=8 "
         "OMPI_MCA_ess_base_jobid=9", {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "the ranks span nodes, and llm.c's -pi mpi needs MPI, which this trainer does not link"},
        {"mpirun without a job id", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=2",
         {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "no job id in the environment (PMIX_NAMESPACE"},
        {"an sbatch script (no srun step): not a rank", "SLURM_PROCID=0 SLURM_NTASKS=4 SLURM_JOB_ID=5",
         {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL}, 0, 0, 0, 0, 0, 0, NULL, NULL},
        {"an srun step on one node", "SLURM_PROCID=2 SLURM_NTASKS=4 SLURM_LOCALID=2 SLURM_STEP_ID=3 "
         "SLURM_STEP_NUM_TASKS=4 SLURM_STEP_NUM_NODES=1 SLURM_JOB_ID=5", {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL},
         1, 1, 1, 4, 2, 2, "llm3d-rendezvous-slurm-5.3", NULL},
        {"torchrun on one node", "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=abc "
         "MASTER_PORT=29500", {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL}, 1, 1, 1, 2, 1, 1,
         "llm3d-rendezvous-torchrun-abc.29500", NULL},
        {"llm.c's -pn 16 -pr 9 -pi fs (an srun job)", "SLURM_JOB_ID=5 SLURM_STEP_ID=0",
         {NULL, 16, 9, 8, MEET_FS, "/shared", NULL}, 1, 1, 0, 16, 9, 1, "llm3d-rendezvous-slurm-5.0", NULL},
        {"llm.c's -pr 3 -pn 2", "", {NULL, 2, 3, 8, MEET_MPI, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "flag -pr 3: not below -pn 2"},
        {"-pn 4 against mpirun's 2", "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2",
         {"/out", 4, -1, 8, MEET_MPI, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "flag -pn 4, but the launcher (Open MPI) says the world is 2"},
        {"-pi tcp -ps ADDR --key-file", "", {NULL, 2, 1, 8, MEET_TCP, "/tmp", "10.1.2.3"}, 1, 0, 1, 2, 1, 1, NULL, NULL},
        {"-pi tcp without -ps", "", {NULL, 2, 1, 8, MEET_TCP, "/tmp", NULL}, -1, 0, 0, 0, 0, 0, NULL,
         "-pi tcp: add -ps ADDR"},
        {"-ps ADDR without -pi tcp", "", {"/out", 2, 1, 8, MEET_MPI, "/tmp", "10.1.2.3"}, -1, 0, 0, 0, 0, 0, NULL,
         "flag -ps 10.1.2.3: llm.c's server address is for -pi tcp only"},
        {"no launcher, no -pn: not a rank", "", {"/out", 0, -1, 8, MEET_MPI, "/tmp", NULL}, 0, 0, 0, 0, 0, 0, NULL,
         NULL},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        test_clear_rank_env();
        char env[512];
        snprintf(env, sizeof(env), "%s", cases[k].env);
        for (char *t = strtok(env, " "); t != NULL; t = strtok(NULL, " ")) {
            char *eq = strchr(t, '=');
            *eq = '\0';
            setenv(t, eq + 1, 1);
        }
        Launch L;
        memset(&L, 0, sizeof(L));
        L.source = "none";
        MeetPlan plan;
        char err[512] = "";
        int rc = meet_plan(&cases[k].m, NULL, key_path, 1, &L, &plan, err, sizeof(err));
        int ok = rc == cases[k].want;
        if (ok && rc == 1)
            ok = plan.by_dir == cases[k].by_dir && plan.one_box == cases[k].one_box && L.world == cases[k].world &&
                 L.rank == cases[k].rank && L.local_rank == cases[k].local &&
                 (cases[k].dir_name == NULL || strcmp(plan.name, cases[k].dir_name) == 0) &&
                 (plan.by_dir || strcmp(plan.spec, "tcp:10.1.2.3:12345") == 0);
        if (ok && rc < 0) ok = strstr(err, cases[k].err) != NULL && strchr(err, '\n') == NULL;
        check(ok, "meet plan: %s: %d (rank %d of %d, local %d, %s, %s%s) %s", cases[k].name, rc, L.rank, L.world,
              L.local_rank, plan.by_dir ? plan.name : plan.spec, plan.one_box ? "one box" : "nodes", "", err);
    }
    test_clear_rank_env();
}

// client: a forked process joining spec; exit 0 joined (and the answer holds
// shm_name and rank 0's blob), 2 rejected, 1 anything else
static pid_t client(const char *spec, const uint8_t key[32], uint64_t job, int rank, int world, const char *shm_name,
                    int drop_to_nobody) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (drop_to_nobody && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
    uint8_t blob[COMM_BLOB_BYTES];
    for (int i = 0; i < COMM_BLOB_BYTES; i++) blob[i] = (uint8_t)(i ^ 0xA5);
    RdvAnswer ans;
    char err[512];
    int rc = rdv_join(spec, key, job, rank, world, rank, rank == 0 ? blob : NULL, 4.0, &ans, err, sizeof(err));
    if (rc != 0) _exit(strstr(err, "rejected") != NULL || strstr(err, "closed") != NULL ? 2 : 1);
    int ok = strcmp(ans.shm_name, shm_name) == 0 && memcmp(ans.blob, blob, COMM_BLOB_BYTES) == 0 && ans.rank == rank;
    _exit(ok ? 0 : 1);
}

static int serve_until(RdvServer *s, int *field, int want) {
    double t0 = par_now();
    while (*field < want && par_now() - t0 < 5.0) rdv_server_step(s, -1, 20);
    return *field >= want;
}

// test_rendezvous_server: the root against good and bad clients, in order
// a rank that never arrives: the ranks that joined are told which one is
// missing when the rendezvous times out, each in its one line, not left to
// time out on their own naming nobody. Rank 0 here starts first (its clock
// ahead of the root's, as rank 0 of an outside launch joins moments after
// its own root opened): it waits RDV_ANSWER_GRACE_S past its own timeout,
// so that the root's verdict reaches it
static void test_rendezvous_missing_rank(const uint8_t key[32]) {
    char spec[300], err[512] = "";
    snprintf(spec, sizeof(spec), "unix:%s/missing.sock", work_dir);
    int fds[2];
    if (!check(pipe(fds) == 0, "a pipe")) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        RdvAnswer ans;
        int rc = rdv_join(spec, key, job_id_from_key(key), 0, 3, 0, NULL, 1.0, &ans, err, sizeof(err));
        if (write(fds[1], err, strlen(err)) < 0) _exit(3);
        _exit(rc == 0 ? 0 : 1);
    }
    close(fds[1]);
    par_sleep(0.3);
    RdvServer *s = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (!check(rdv_server_open(s, spec, 3, key, "/llm3d-test", 1.0, err, sizeof(err)) == 0, "rendezvous server opens: %s",
               err)) {
        free(s);
        test_wait(pid, 5.0, NULL);
        close(fds[0]);
        return;
    }
    double t0 = par_now();
    while (!s->expired && par_now() - t0 < 5.0) rdv_server_step(s, -1, 20);
    int st = test_wait(pid, 5.0, NULL);
    char got[600];
    ssize_t n = read(fds[0], got, sizeof(got) - 1);
    got[n > 0 ? n : 0] = '\0';
    close(fds[0]);
    check(s->expired && st == 1 &&
          strstr(got, "the root rejected rank 0: the rendezvous timed out: only 1 of 3 ranks joined within 1.0 s; "
                 "missing rank(s) 1 2") != NULL,
          "rendezvous: rank 1 and 2 never arrive: rank 0 is told which (status %d): %s", st, got);
    rdv_server_close(s);
    free(s);
}

static void test_rendezvous_server(const uint8_t key[32]) {
    char spec[300], err[512];
    snprintf(spec, sizeof(spec), "unix:%s/rdv.sock", work_dir);
    RdvServer *s = (RdvServer *)calloc(1, sizeof(RdvServer));
    if (!check(rdv_server_open(s, spec, 3, key, "/llm3d-test", 5.0, err, sizeof(err)) == 0, "rendezvous server opens: %s", err)) {
        free(s);
        return;
    }
    uint64_t job = job_id_from_key(key);
    uint8_t other[32];
    key_generate(other, NULL, 0);
    pid_t a = client(spec, key, job, 0, 3, "/llm3d-test", 0);
    check(serve_until(s, &s->joined, 1), "rendezvous: rank 0 joins");
    struct { int rank, world; const uint8_t *key; uint64_t job; const char *reason; } bad[] = {
        {0, 3, key, job, "duplicate rank 0"},
        {1, 4, key, job, "wrong world size 4"},
        {1, 3, other, job_id_from_key(other), "bad tag"},
        {1, 3, key, job ^ 1, "wrong job id"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int before = s->rejected;
        pid_t b = client(spec, bad[i].key, bad[i].job, bad[i].rank, bad[i].world, "/llm3d-test", 0);
        serve_until(s, &s->rejected, before + 1);
        int st = test_wait(b, 5.0, NULL);
        check(s->rejected == before + 1 && strstr(s->last_reject, bad[i].reason) != NULL && st == 2,
              "rendezvous rejects and logs '%s': \"%s\", client status %d", bad[i].reason, s->last_reject, st);
    }
    if (geteuid() == 0) {
        // another user that can reach the socket is turned away by SO_PEERCRED
        chmod(work_dir, 0755);
        chmod(s->addr.path, 0777);
        int before = s->rejected;
        pid_t b = client(spec, key, job, 1, 3, "/llm3d-test", 1);
        serve_until(s, &s->rejected, before + 1);
        int st = test_wait(b, 5.0, NULL);
        check(s->rejected == before + 1 && strstr(s->last_reject, "uid 65534") != NULL && st == 2,
              "rendezvous rejects another uid: \"%s\", client status %d", s->last_reject, st);
        chmod(work_dir, 0700);
    } else {
        skip("rendezvous uid check: needs root to run a client as another user");
    }
    check(s->joined == 1 && !s->answered, "rendezvous: the bad clients changed nothing (1 joined)");
    pid_t b = client(spec, key, job, 1, 3, "/llm3d-test", 0);
    pid_t c = client(spec, key, job, 2, 3, "/llm3d-test", 0);
    check(serve_until(s, &s->answered, 1), "rendezvous: all 3 joined and were answered");
    int sa = test_wait(a, 5.0, NULL), sb = test_wait(b, 5.0, NULL), sc = test_wait(c, 5.0, NULL);
    check(sa == 0 && sb == 0 && sc == 0, "rendezvous: each rank got the segment name and rank 0's blob (%d %d %d)", sa, sb, sc);
    int before = s->rejected;
    pid_t d = client(spec, key, job, 2, 3, "/llm3d-test", 0);
    serve_until(s, &s->rejected, before + 1);
    int sd = test_wait(d, 5.0, NULL);
    check(strstr(s->last_reject, "late joiner") != NULL && sd == 2, "rendezvous rejects a late joiner: \"%s\"", s->last_reject);
    rdv_server_close(s);
    struct stat st;
    check(lstat(s->addr.path, &st) != 0, "rendezvous: the socket file is gone after close");
    free(s);
}

static void test_launcher_jobs(void) {
    for (int W = 2; W <= 4; W++) {
        Job j = run_job("coll", W, "5", NULL);
        char what[64];
        snprintf(what, sizeof(what), "launcher np %d", W);
        check(j.status == 0, "%s: job exits 0 (status %d, %.2f s)%s%s", what, j.status, j.elapsed, j.status ? ": " : "",
              j.status ? j.err : "");
        check_rank_lines(what, j.out, W, COLL_CHECKS, NCOLL_CHECKS);
        check_hashes(what, j.out, W, COLL_HASHES, NCOLL_HASHES);
        if (W == 4) {
            const char *sub[] = {"subgroups"};
            check_rank_lines(what, j.out, W, sub, 1);
        }
        const char *launch[] = {"launch"};
        check_rank_lines(what, j.out, W, launch, 1);
        job_free(&j);
    }
}

static void test_faults(void) {
    Job j = run_job("steps", 3, "2", "tamper:1:2");
    check(j.status == 1 && strstr(j.err, "from rank 1, channel collective, step 2: tag does not match") &&
          strstr(j.err, "exited with status 1"), "tamper:1:2 is caught (status %d, %.2f s): %s", j.status, j.elapsed, j.err);
    job_free(&j);

    j = run_job("steps", 3, "2", "replay:1:3");
    // the previous frame on the link is step 2's last: refused for its step (a
    // replay whose header matched would be refused for its sequence number)
    check(j.status == 1 && strstr(j.err, "fault replay") &&
          strstr(j.err, "from rank 1, channel collective, step 3: header says step 2"),
          "replay:1:3 is caught (status %d, %.2f s): %s", j.status, j.elapsed, j.err);
    job_free(&j);

    j = run_job("steps", 3, "2", "kill:2:1");
    check(j.status == 1 && strstr(j.err, "rank 2 killed by signal 9") && j.elapsed < 2.0 + 3.0,
          "kill:2:1 ends the job naming rank 2 (status %d, %.2f s): %s", j.status, j.elapsed, j.err);
    job_free(&j);

    j = run_job("steps", 3, "2", "stall:1:2");
    const char *t = strstr(j.err, "timeout after");
    int names = t != NULL && (strstr(t, "rank 1 is not waiting") != NULL || strstr(t, "waiting for rank 1 (") != NULL);
    check(j.status == 1 && names && strstr(t, "step 2") && j.elapsed >= 2.0 && j.elapsed < 2.0 + 3.0,
          "stall:1:2 times out naming rank 1 (status %d, %.2f s): %s", j.status, j.elapsed, j.err);
    job_free(&j);

    j = run_job("usage", 2, "5", NULL);
    check(j.status == 2 && strstr(j.err, "rank 1 exited with status 2") && j.elapsed < 3.0,
          "a rank's usage error: the launcher ends the job with its status 2 (status %d, %.2f s)", j.status, j.elapsed);
    job_free(&j);

    j = run_job("steps", 3, "2", NULL);
    const char *steps[] = {"steps"};
    check(j.status == 0, "no fault: the same job exits 0 (status %d, %.2f s)", j.status, j.elapsed);
    check_rank_lines("no fault", j.out, 3, steps, 1);
    job_free(&j);
}

static void test_intruders(void) {
    Job j = run_job("intruder", 2, "5", NULL);
    check(j.status == 0, "intruders: the job finishes normally (status %d, %.2f s)", j.status, j.elapsed);
    const char *r0[] = {"intruder_key", "intruder_job", "intruder_world", "intruder_late"};
    check_rank_lines("intruders", j.out, 1, r0, 4);
    const char *all[] = {"job_runs_on"};
    check_rank_lines("intruders", j.out, 2, all, 1);
    check(strstr(j.err, "rendezvous: rejected pid") && strstr(j.err, "bad tag: not sealed with this job's key"),
          "the launcher logged the wrong key");
    check(strstr(j.err, "wrong job id") != NULL, "the launcher logged the wrong job id");
    check(strstr(j.err, "wrong world size 3 (this job has 2 ranks)") != NULL, "the launcher logged the wrong world size");
    check(strstr(j.err, "late joiner for rank 1") != NULL, "the launcher logged the late joiner");
    job_free(&j);
}

// test_outside_launch: ranks started by "someone else" with the environment
// of three conventions, rank 0 serving the rendezvous; started last, so the
// others must wait for its socket
static void test_outside_launch(const char *key_path) {
    char spec[300], out_path[300], err_path[300];
    snprintf(spec, sizeof(spec), "unix:%s/outside.sock", work_dir);
    snprintf(out_path, sizeof(out_path), "%s/out.txt", work_dir);
    snprintf(err_path, sizeof(err_path), "%s/err.txt", work_dir);
    unlink(out_path);
    unlink(err_path);
    const char *args[] = {"child", "coll", "-np", "3", "-to", "5", "--rendezvous", spec, "--key-file", key_path, NULL};
    const char *env2[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3", "OMPI_COMM_WORLD_LOCAL_RANK=2", NULL};
    const char *env1[] = {"RANK=1", "WORLD_SIZE=3", "LOCAL_RANK=1", NULL};
    const char *env0[] = {"LLM3D_RANK=0", "LLM3D_WORLD=3", NULL};
    pid_t p2 = spawn(args, env2, out_path, err_path);
    pid_t p1 = spawn(args, env1, out_path, err_path);
    par_sleep(0.2);
    pid_t p0 = spawn(args, env0, out_path, err_path);
    int s0 = test_wait(p0, 30, NULL), s1 = test_wait(p1, 30, NULL), s2 = test_wait(p2, 30, NULL);
    char *out = test_read_text(out_path), *err = test_read_text(err_path);
    check(s0 == 0 && s1 == 0 && s2 == 0, "outside launch (unix, LLM3D_* / torchrun / Open MPI): ranks exit %d %d %d%s%s", s0,
          s1, s2, s0 || s1 || s2 ? ": " : "", s0 || s1 || s2 ? err : "");
    check(strstr(out, "R 0 launch ok source LLM3D_*") && strstr(out, "R 1 launch ok source torchrun") &&
          strstr(out, "R 2 launch ok source Open MPI"), "outside launch: each rank read its own convention");
    check_rank_lines("outside unix", out, 3, COLL_CHECKS, NCOLL_CHECKS);
    check_hashes("outside unix", out, 3, COLL_HASHES, NCOLL_HASHES);
    free(out);
    free(err);

    // tcp on loopback, Slurm's variables; a port the kernel just handed out
    snprintf(spec, sizeof(spec), "tcp:127.0.0.1:%d", test_free_port());
    unlink(out_path);
    unlink(err_path);
    const char *targs[] = {"child", "steps", "-to", "5", "--rendezvous", spec, "--key-file", key_path, NULL};
    const char *t1[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1", NULL};
    const char *t0[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", NULL};
    p1 = spawn(targs, t1, out_path, err_path);
    p0 = spawn(targs, t0, out_path, err_path);
    s0 = test_wait(p0, 30, NULL);
    s1 = test_wait(p1, 30, NULL);
    out = test_read_text(out_path);
    err = test_read_text(err_path);
    check(s0 == 0 && s1 == 0, "outside launch (%s, Slurm): ranks exit %d %d%s%s", spec, s0, s1, s0 || s1 ? ": " : "",
          s0 || s1 ? err : "");
    const char *steps[] = {"steps"};
    check_rank_lines("outside tcp", out, 2, steps, 1);
    free(out);
    free(err);
}

// ----------------------------------------------------------------------------
// pipeline schedules (in-process): every stage's op list, and the time line
// pipeline_simulate gives them

// "F0 F1 B0 ..." for exact comparisons and messages
static const char *ops_text(const PipeOp *ops, int n, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < len; i++) {
        char op[32];
        at += snprintf(buf + at, len - at, "%s%s", i ? " " : "", pipe_op_text(ops[i], op, sizeof(op)));
    }
    return buf;
}

// one stage's list for one chunk: each micro-batch once forward and once
// backward, the forward first, forwards and backwards each in micro-batch
// order (the trainer's activation set mb % nacts relies on that). *peak
// gets the most micro-batches held between their forward and backward at
// any point.
static int schedule_errors(const PipeOp *ops, int n, int M, int *peak) {
    int errors = n != 2 * M, next_f = 0, next_b = 0, held = 0;
    *peak = 0;
    for (int i = 0; i < n; i++) {
        errors += ops[i].chunk != 0 || (ops[i].kind != PIPE_F && ops[i].kind != PIPE_B);
        if (ops[i].kind == PIPE_F) {
            errors += ops[i].mb != next_f++;
            held++;
        } else {
            errors += ops[i].mb != next_b++ || ops[i].mb >= next_f;
            held--;
        }
        if (held > *peak) *peak = held;
    }
    return errors + (next_f != M) + (next_b != M);
}

// the simulator's times, checked on their own: no op starts before 0, a
// stage runs one op at a time, and every op starts after its inputs ended
// (for one chunk per stage: F k after F k of the stage before, B k after
// B k of the stage after and its own F k)
static int timeline_errors(const PipeLayout *pl, int f_time, int b_time, const PipeOp *ops, const int *start) {
    int pp = pl->pp, n = pipeline_ops(pl), errors = 0;
    for (int s = 0; s < pp; s++)
        for (int i = 0; i < n; i++) {
            const PipeOp *op = &ops[s * n + i];
            int t = start[s * n + i], forward = op->kind == PIPE_F;
            errors += t < 0;
            if (i > 0) errors += t < start[s * n + i - 1] + (ops[s * n + i - 1].kind == PIPE_F ? f_time : b_time);
            int from = forward ? s - 1 : s + 1, dur = forward ? f_time : b_time;
            if (from >= 0 && from < pp) {
                int j = pipeline_find(ops + from * n, n, *op);
                errors += j < 0 || t < start[from * n + j] + dur;
            }
            if (!forward) errors += t < start[s * n + pipeline_find(ops + s * n, n, pipe_op(PIPE_F, op->mb, 0))] + f_time;
        }
    return errors;
}

static void test_pipeline_schedules(void) {
    enum { MAXP = 8, MAXM = 16 };
    static PipeOp ops[MAXP * 2 * MAXM];
    static int start[MAXP * 2 * MAXM];
    char text[256];
    // every layout: the lists, the activation sets, no deadlock, and the
    // bubble. The step's lower bound: the last stage starts after (pp-1)
    // forwards, runs its M forwards and M backwards, and its last gradient
    // then needs (pp-1) backwards to reach stage 0, so a step takes at least
    // (M + pp - 1)(F + B), of which each stage is busy M(F + B): an idle
    // fraction of (pp-1)/(M+pp-1). Both schedules reach the bound at every
    // M, M < pp included (1f1b's warm-up, min(pp-stage-1, M), then makes the
    // first stages run as gpipe), with B = F and with B = 2F alike.
    for (int gpipe = 1; gpipe >= 0; gpipe--) {
        const char *name = gpipe ? "gpipe" : "1f1b";
        for (int pp = 1; pp <= MAXP; pp++) {
            int bad_list = 0, bad_sets = 0, stuck = 0, bad_times = 0, bad_bubble = 0, bad_slow_b = 0;
            for (int M = 1; M <= MAXM; M++) {
                PipeLayout pl = pipe_layout(gpipe ? PIPE_GPIPE : PIPE_1F1B, pp, M, 1);
                int n = 2 * M, end = pipeline_simulate(&pl, 1, 1, 0, ops, start, NULL);
                for (int s = 0; s < pp; s++) {
                    int peak;
                    bad_list += schedule_errors(ops + s * n, pipeline_schedule(&pl, s, ops + s * n), M, &peak) != 0;
                    bad_sets += peak != pipeline_inflight(&pl, s);
                }
                if (end < 0) { stuck++; continue; }
                bad_times += timeline_errors(&pl, 1, 1, ops, start) != 0;
                long idle = (long)pp * end - (long)pp * M * 2;  // stage-time units with nothing to run
                bad_bubble += idle * (M + pp - 1) != (long)(pp - 1) * pp * end ||
                              fabs((double)idle / ((double)pp * end) - pipeline_bubble(&pl)) > 1e-12;
                end = pipeline_simulate(&pl, 1, 2, 0, ops, start, NULL);
                bad_slow_b += end != 3 * (M + pp - 1) || timeline_errors(&pl, 1, 2, ops, start) != 0;
            }
            check(bad_list + bad_sets + stuck + bad_times + bad_bubble + bad_slow_b == 0,
                  "pipeline %s pp %d, M 1..%d: lists (bad %d), peak sets = pipeline_inflight (bad %d), deadlocks %d, "
                  "ops after their inputs (bad %d), idle = (p-1)/(m+p-1) at F=B (bad %d), step (m+p-1)(F+B) at B=2F (bad %d)",
                  name, pp, MAXM, bad_list, bad_sets, stuck, bad_times, bad_bubble, bad_slow_b);
        }
    }

    // a few lists by hand from the definitions: 1f1b runs pp-stage-1
    // forwards, then F and B in turn, then the remaining Bs
    struct { int gpipe, pp, stage, M; const char *want; } lists[] = {
        {0, 4, 0, 4, "F0 F1 F2 F3 B0 B1 B2 B3"},  // 3 warm-up forwards, F3 B0, then the rest
        {0, 4, 1, 4, "F0 F1 F2 B0 F3 B1 B2 B3"},
        {0, 4, 3, 4, "F0 B0 F1 B1 F2 B2 F3 B3"},  // the last stage: no warm-up
        {0, 4, 0, 8, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"},
        {0, 4, 1, 2, "F0 F1 B0 B1"},              // M < pp: warm-up min(2, M) = all of them
        {1, 3, 2, 3, "F0 F1 F2 B0 B1 B2"},
    };
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++) {
        PipeLayout pl = pipe_layout(lists[k].gpipe ? PIPE_GPIPE : PIPE_1F1B, lists[k].pp, lists[k].M, 1);
        int n = pipeline_schedule(&pl, lists[k].stage, ops);
        ops_text(ops, n, text, sizeof(text));
        check(strcmp(text, lists[k].want) == 0, "pipeline %s pp %d stage %d M %d: %s (want %s)",
              lists[k].gpipe ? "gpipe" : "1f1b", lists[k].pp, lists[k].stage, lists[k].M, text, lists[k].want);
    }

    // two time lines by hand. 1f1b pp 2 M 3, F = B = 1: stage 0 runs
    // F0 F1 B0 F2 B1 B2, stage 1 F0 B0 F1 B1 F2 B2; stage 0's B0 waits for
    // stage 1's B0 (ends at 3), its B2 for stage 1's B2 (ends at 7)
    int want1[] = {0, 1, 3, 4, 5, 7, 1, 2, 3, 4, 5, 6}, same = 1, idle[2];
    PipeLayout pl = pipe_layout(PIPE_1F1B, 2, 3, 1);
    int end = pipeline_simulate(&pl, 1, 1, 0, ops, start, idle);
    for (int i = 0; i < 12; i++) same &= start[i] == want1[i];
    check(end == 8 && same && idle[0] == 2 && idle[1] == 2,
          "pipeline 1f1b pp 2 M 3 F=B=1: starts %d %d %d %d %d %d | %d %d %d %d %d %d, ends at %d (want 8), idle %d %d "
          "(want 2 2)", start[0], start[1], start[2], start[3], start[4], start[5], start[6], start[7], start[8], start[9],
          start[10], start[11], end, idle[0], idle[1]);
    // gpipe pp 2 M 2, F = 1, B = 2: stage 1 runs B0 at 3 and B1 at 5, so
    // stage 0's B0 waits until 5 and its B1 until 7; the step ends at 9 = (2+1)(1+2)
    int want2[] = {0, 1, 5, 7, 1, 2, 3, 5};
    same = 1;
    pl = pipe_layout(PIPE_GPIPE, 2, 2, 1);
    end = pipeline_simulate(&pl, 1, 1, 1, ops, start, NULL);  // no W: B takes b + w
    for (int i = 0; i < 8; i++) same &= start[i] == want2[i];
    check(end == 9 && same, "pipeline gpipe pp 2 M 2 F=1 B=2: starts %d %d %d %d | %d %d %d %d, ends at %d (want 9)",
          start[0], start[1], start[2], start[3], start[4], start[5], start[6], start[7], end);

    // the simulator finds deadlocks: stage 0 wants B1 before F1, but B1
    // needs stage 1's F1, which needs stage 0's F1
    PipeOp cycle[] = {pipe_op(PIPE_F, 0, 0), pipe_op(PIPE_B, 1, 0), pipe_op(PIPE_F, 1, 0), pipe_op(PIPE_B, 0, 0),
                      pipe_op(PIPE_F, 0, 0), pipe_op(PIPE_F, 1, 0), pipe_op(PIPE_B, 1, 0), pipe_op(PIPE_B, 0, 0)};
    pl = pipe_layout(PIPE_1F1B, 2, 2, 1);
    check(pipeline_play(&pl, 1, 1, 0, cycle, start, NULL) == -1 && start[0] == 0 && start[1] == -1 && start[4] == 1 &&
          start[5] == -1,
          "pipeline deadlock found: stage 0 'F0 B1 F1 B0' against stage 1 'F0 F1 B1 B0' (F0s run at %d and %d, then stuck)",
          start[0], start[4]);
    PipeOp backwards_first[] = {pipe_op(PIPE_B, 0, 0), pipe_op(PIPE_F, 0, 0)};
    pl = pipe_layout(PIPE_1F1B, 1, 1, 1);
    check(pipeline_play(&pl, 1, 1, 0, backwards_first, start, NULL) == -1, "pipeline deadlock found: one stage 'B0 F0'");
    PipeLayout no_stages = pipe_layout(PIPE_GPIPE, 0, 4, 1), no_mbs = pipe_layout(PIPE_1F1B, 4, 0, 1);
    check(pipeline_simulate(&no_stages, 1, 1, 0, ops, start, NULL) == -1 &&
          pipeline_simulate(&no_mbs, 1, 1, 0, ops, start, NULL) == -1, "pipeline_simulate refuses pp 0 and M 0");
}

// ----------------------------------------------------------------------------
// the pipeline's message plans (in-process): what each stage sends and
// receives around each op, played by pipeline_check with sends that block
// until the peer receives

static int same_msg(PipeMsg a, int peer, int channel, int mb) {
    return peer < 0 ? a.peer < 0 : a.peer == peer && a.channel == channel && a.mb == mb && a.chunk == 0;
}

// one stage's plan (one chunk per stage) against the definitions, worked
// out here on their own: every op gets its input once before it runs (a
// forward from stage-1, a backward from stage+1, none at the edges, a W
// none), alone or with the previous op's exchange, and sends its output (a
// forward to stage+1, a backward to stage-1); an exchange's receive is the
// next op's input, from the peer the send goes to
static int plan_errors(int pp, int s, const PipeOp *ops, const PipeStep *plan, int n) {
    int errors = 0;
    for (int i = 0; i < n; i++) {
        const PipeStep *st = &plan[i];
        int f = ops[i].kind == PIPE_F, w = ops[i].kind == PIPE_W, mb = ops[i].mb;
        errors += st->op.kind != ops[i].kind || st->op.mb != mb || st->op.chunk != 0;
        int in_peer = w ? -1 : f ? (s > 0 ? s - 1 : -1) : (s < pp - 1 ? s + 1 : -1);
        int out_peer = w ? -1 : f ? (s < pp - 1 ? s + 1 : -1) : (s > 0 ? s - 1 : -1);
        int channel = f ? CH_ACTIVATION : CH_GRADIENT;
        int came = i > 0 && plan[i - 1].next_recv.peer >= 0;
        if (came) errors += !same_msg(plan[i - 1].next_recv, in_peer, channel, mb) || st->recv.peer >= 0;
        else errors += !same_msg(st->recv, in_peer, channel, mb);
        errors += !same_msg(st->send, out_peer, channel, mb);
        if (st->next_recv.peer >= 0) errors += i + 1 == n || st->send.peer != st->next_recv.peer;
    }
    return errors;
}

// the naive plan: every send alone, every input received just before its op
static void unpair(PipeStep *plan, int n) {
    for (int i = 0; i + 1 < n; i++)
        if (plan[i].next_recv.peer >= 0) {
            plan[i + 1].recv = plan[i].next_recv;
            plan[i].next_recv.peer = -1;
        }
}

// every stage's schedule and plan (pp x n each); returns n
static int make_plans(int gpipe, int pp, int M, PipeOp *ops, PipeStep *plans) {
    PipeLayout pl = pipe_layout(gpipe ? PIPE_GPIPE : PIPE_1F1B, pp, M, 1);
    int n = 2 * M;
    for (int s = 0; s < pp; s++) {
        pipeline_schedule(&pl, s, ops + s * n);
        pipeline_plan(&pl, s, ops + s * n, n, plans + s * n);
    }
    return n;
}

static void test_pipeline_plans(void) {
    enum { MAXP = 8, MAXM = 16 };
    static PipeOp ops[MAXP * 2 * MAXM];
    static PipeStep plans[MAXP * 2 * MAXM];
    char err[512], text[256];
    // every layout: the plan agrees with the definitions, and played with
    // blocking sends it finishes with every message matched once, in
    // micro-batch order on each link: 2 (pp-1) M messages. Unpaired, 1f1b
    // deadlocks wherever two neighbours cross (pp >= 2, M >= 2); gpipe never
    // has them cross.
    for (int gpipe = 1; gpipe >= 0; gpipe--) {
        const char *name = gpipe ? "gpipe" : "1f1b";
        for (int pp = 1; pp <= MAXP; pp++) {
            int bad_plan = 0, failed = 0, naive_wrong = 0;
            for (int M = 1; M <= MAXM; M++) {
                PipeLayout pl = pipe_layout(gpipe ? PIPE_GPIPE : PIPE_1F1B, pp, M, 1);
                int n = make_plans(gpipe, pp, M, ops, plans);
                for (int s = 0; s < pp; s++) bad_plan += plan_errors(pp, s, ops + s * n, plans + s * n, n) != 0;
                int got = pipeline_check(&pl, n, NULL, plans, err, sizeof(err));
                if (got != 2 * (pp - 1) * M && failed++ == 0) printf("      M %d: %d messages: %s\n", M, got, err);
                for (int s = 0; s < pp; s++) unpair(plans + s * n, n);
                int stuck = !gpipe && pp >= 2 && M >= 2;
                got = pipeline_check(&pl, n, NULL, plans, err, sizeof(err));
                naive_wrong += stuck ? got != -1 || strncmp(err, "deadlock: ", 10) != 0 : got != 2 * (pp - 1) * M;
            }
            check(bad_plan + failed + naive_wrong == 0,
                  "pipeline plan %s pp %d, M 1..%d: as defined (bad %d), no deadlock and every message matched (bad %d); "
                  "unpaired, %s (bad %d)",
                  name, pp, MAXM, bad_plan, failed, gpipe || pp == 1 ? "runs too" : "deadlocks from M 2", naive_wrong);
        }
    }

    // plans by hand. 1f1b pp 2 M 3: stage 0 runs F0 F1 B0 F2 B1 B2, stage 1
    // F0 B0 F1 B1 F2 B2. Stage 0's F1 sends activation 1 and receives
    // gradient 0 at once, just as stage 1's B0 sends gradient 0 and receives
    // activation 1; the same for F2 and B1. pp 3 M 2: stage 1 pairs its F1
    // with stage 2's B0, and stage 0's exchange F1x meets stage 1's lone
    // receive rF1 and later its plain send B0s.
    struct { int gpipe, pp, M; const char *want[3]; } cases[] = {
        {0, 2, 3, {"F0s F1x B0 F2x B1 rB2", "rF0 B0x F1 B1x F2 B2s"}},
        {0, 3, 2, {"F0s F1x B0 rB1", "rF0s rF1x B0s rB1s", "rF0 B0x F1 B1s"}},
        {1, 2, 2, {"F0s F1x B0 rB1", "rF0 rF1 B0s B1s"}},
        {0, 1, 2, {"F0 B0 F1 B1"}},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int pp = cases[k].pp, n = make_plans(cases[k].gpipe, pp, cases[k].M, ops, plans);
        PipeLayout pl = pipe_layout(cases[k].gpipe ? PIPE_GPIPE : PIPE_1F1B, pp, cases[k].M, 1);
        for (int s = 0; s < pp; s++) {
            pipeline_plan_text(s, plans + s * n, n, text, sizeof(text));
            check(strcmp(text, cases[k].want[s]) == 0, "pipeline plan %s pp %d M %d stage %d: %s (want %s)",
                  cases[k].gpipe ? "gpipe" : "1f1b", pp, cases[k].M, s, text, cases[k].want[s]);
        }
        int got = pipeline_check(&pl, n, NULL, plans, err, sizeof(err));
        check(got == 2 * (pp - 1) * cases[k].M, "pipeline plan %s pp %d M %d: checked, %d messages",
              cases[k].gpipe ? "gpipe" : "1f1b", pp, cases[k].M, got);
    }

    // the checker's failures, worded. Unpaired 1f1b pp 2 M 2: both stages
    // send first and wait for each other
    PipeLayout pp2 = pipe_layout(PIPE_1F1B, 2, 2, 1), pp3 = pipe_layout(PIPE_1F1B, 3, 1, 1);
    int n = make_plans(0, 2, 2, ops, plans);
    for (int s = 0; s < 2; s++) unpair(plans + s * n, n);
    const char *want = "deadlock: stage 0 at F1 sends activation 1 to stage 1; stage 1 at B0 sends gradient 0 to stage 0";
    check(pipeline_check(&pp2, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);
    // a wrong micro-batch: stage 1 (1f1b pp 2 M 3) sends gradient 1 where
    // stage 0 waits for gradient 0
    n = make_plans(0, 2, 3, ops, plans);
    plans[n + 1].send.mb = 1;
    want = "mismatch: stage 1 sends gradient 1 as its message 0 to stage 0, which receives gradient 0";
    check(pipeline_check(&pp2, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);
    // a wrong channel: stage 0's F0 sends a gradient
    n = make_plans(0, 2, 3, ops, plans);
    plans[0].send.channel = CH_GRADIENT;
    want = "mismatch: stage 0 sends gradient 0 as its message 0 to stage 1, which receives activation 0";
    check(pipeline_check(&pp2, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);
    // out of order, though both sides agree: gpipe pp 2 M 2 with the
    // forwards swapped on both stages
    n = make_plans(1, 2, 2, ops, plans);
    plans[0].send.mb = 1, plans[1].send.mb = 0, plans[n].recv.mb = 1, plans[n + 1].recv.mb = 0;
    want = "mismatch: stage 0 sends activation 1 as its message 0 to stage 1, which receives activation 1";
    check(pipeline_check(&pp2, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);
    // a send to a stage that is not a neighbour
    n = make_plans(0, 3, 1, ops, plans);
    plans[0].send.peer = 2;
    want = "stage 0 step 0 (F0): sends to stage 2, not a neighbour";
    check(pipeline_check(&pp3, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);
}

// ----------------------------------------------------------------------------
// every schedule on every layout the flags allow (pp 1..8, M 1..32, V 1..4;
// pipeline_validate says which): the lists, the activation sets, the time
// line and its bubble, the plans and their messages

enum { LAY_MAXP = 8, LAY_MAXM = 32, LAY_MAXV = 4, LAY_OPS = 3 * LAY_MAXM * LAY_MAXV };

// one stage's list under any schedule: every (kind, mb, chunk) of the
// layout once (W only where the backward is split), F before B before W of
// the same micro-batch and chunk, and each kind on each chunk in micro-
// batch order. *peak: the most (mb, chunk) sets held at once, each from its
// F to its B, or to its W where the backward is split.
static int list_errors(const PipeLayout *pl, const PipeOp *ops, int n, int *peak) {
    int M = pl->M, V = pl->V, split = pipeline_splits_backward(pl), errors = n != pipeline_ops(pl), held = 0;
    int next[3][PIPE_MAXV] = {{0}};  // the next micro-batch of each kind on each chunk
    *peak = 0;
    for (int i = 0; i < n; i++) {
        PipeOp op = ops[i];
        if (op.kind < PIPE_F || op.kind > PIPE_W || (op.kind == PIPE_W && !split) || op.chunk < 0 || op.chunk >= V) {
            errors++;
            continue;
        }
        errors += op.mb != next[op.kind][op.chunk]++;
        if (op.kind != PIPE_F) errors += op.mb >= next[op.kind - 1][op.chunk];  // its F (its B) ran before
        held += op.kind == PIPE_F ? 1 : op.kind == (split ? PIPE_W : PIPE_B) ? -1 : 0;
        if (held > *peak) *peak = held;
    }
    for (int k = PIPE_F; k <= PIPE_W; k++)
        for (int c = 0; c < V; c++) errors += next[k][c] != (k == PIPE_W && !split ? 0 : M);
    return errors;
}

// the time line on its own, for any layout: a stage runs one op at a time,
// and an op starts once its input has ended: F k on part t after F k on
// part t-1, B k after B k on part t+1 and its own F k, W k after its own
// B k. where: scratch for (stage, kind, chunk, mb) -> index.
static int times_errors(const PipeLayout *pl, int f, int b, int w, const PipeOp *ops, const int *start, int *where) {
    int pp = pl->pp, M = pl->M, V = pl->V, n = pipeline_ops(pl), parts = pp * V, errors = 0;
    int full_b = pipeline_splits_backward(pl) ? b : b + w;
    for (int s = 0; s < pp; s++)
        for (int i = 0; i < n; i++) where[((s * 3 + ops[s * n + i].kind) * V + ops[s * n + i].chunk) * M + ops[s * n + i].mb] = s * n + i;
    for (int s = 0; s < pp; s++)
        for (int i = 0; i < n; i++) {
            PipeOp op = ops[s * n + i];
            int t = start[s * n + i], dur[3] = {f, full_b, w};
            errors += t < 0 || (i > 0 && t < start[s * n + i - 1] + dur[ops[s * n + i - 1].kind]);
            int part = pipeline_part(pl, s, op.chunk), from = -1, chunk = 0, kind = op.kind;
            if (op.kind == PIPE_F && part > 0) pipeline_place(pl, part - 1, &from, &chunk);
            if (op.kind == PIPE_B && part < parts - 1) pipeline_place(pl, part + 1, &from, &chunk);
            if (from >= 0) {
                int j = where[((from * 3 + kind) * V + chunk) * M + op.mb];
                errors += t < start[j] + dur[kind];
            }
            if (op.kind != PIPE_F) {  // its own F (B) on the same chunk
                int j = where[((s * 3 + kind - 1) * V + op.chunk) * M + op.mb];
                errors += t < start[j] + dur[kind - 1];
            }
        }
    return errors;
}

// one stage's plan against the definitions, for any layout, worked out
// here on their own: its steps with an op run exactly the stage's ops in
// order; every op's input (pipe_input: none for the first part's F, the
// last part's B and every W) is received exactly once, before the op, and
// its output (pipe_output) sent exactly once, after it; nothing else is
// sent or received; an exchange pairs a send with a receive from another
// stage, never a hand-off. got, made: scratch of 2 x V x M.
static int plan_def_errors(const PipeLayout *pl, int s, const PipeOp *ops, int n, const PipeStep *plan, int steps,
                           int *got, int *made) {
    int M = pl->M, V = pl->V, errors = 0, op_at = 0, received = 0, sent = 0, inputs = 0, outputs = 0;
    for (int i = 0; i < 2 * V * M; i++) got[i] = made[i] = 0;
    for (int k = 0; k < steps; k++) {
        const PipeStep *st = &plan[k];
        PipeMsg rs[2] = {st->recv, st->next_recv};
        if (st->recv.peer >= 0) {
            int slot = ((st->recv.channel == CH_GRADIENT) * V + st->recv.chunk) * M + st->recv.mb;
            errors += got[slot]++ != 0;
            received++;
        }
        if (st->op.kind != PIPE_MSG) {
            errors += op_at >= n || st->op.kind != ops[op_at].kind || st->op.mb != ops[op_at].mb ||
                      st->op.chunk != ops[op_at].chunk;
            op_at++;
            PipeMsg in = pipe_input(pl, s, st->op), out = pipe_output(pl, s, st->op);
            if (in.peer >= 0) {
                inputs++;
                errors += got[((in.channel == CH_GRADIENT) * V + in.chunk) * M + in.mb] != 1;
            }
            if (out.peer >= 0) {
                outputs++;
                made[((out.channel == CH_GRADIENT) * V + out.chunk) * M + out.mb] = 1;  // keyed by the receiver's chunk
            }
        }
        if (st->send.peer >= 0) {
            int slot = ((st->send.channel == CH_GRADIENT) * V + st->send.chunk) * M + st->send.mb;
            errors += made[slot] != 1;  // made by an op before, and sent once
            made[slot] = 2;
            sent++;
        }
        if (rs[1].peer >= 0) {
            errors += st->send.peer < 0 || st->send.peer == s || rs[1].peer == s;
            errors += got[((rs[1].channel == CH_GRADIENT) * V + rs[1].chunk) * M + rs[1].mb]++ != 0;
            received++;
        }
    }
    return errors + (op_at != n) + (received != inputs) + (sent != outputs);
}

static void test_pipeline_layouts(void) {
    static PipeOp ops[LAY_MAXP * LAY_OPS];
    static int start[LAY_MAXP * LAY_OPS], where[LAY_MAXP * LAY_OPS];
    static PipeStep plans[LAY_MAXP * (3 * LAY_OPS + 1)];
    int steps[LAY_MAXP], idle[LAY_MAXP], got[2 * LAY_MAXV * LAY_MAXM], made[2 * LAY_MAXV * LAY_MAXM];
    char err[512];
    // 1f1b's peak sets (over the stages) for each pp and M, for zbh1 and zbv to match
    int peak_1f1b[LAY_MAXP + 1][LAY_MAXM + 1];
    for (int sched = 0; sched < PIPE_SCHEDULES; sched++) {
        int layouts = 0, bad_list = 0, bad_sets = 0, bad_peak = 0, stuck = 0, bad_times = 0, bad_bubble = 0, bad_costs = 0;
        int bad_plan = 0, failed = 0, bad_messages = 0, bad_plan_sets = 0;
        for (int pv = 1; pv <= LAY_MAXV; pv++)
            for (int pp = 1; pp <= LAY_MAXP; pp++)
                for (int M = 1; M <= LAY_MAXM; M++) {
                    if (pipeline_validate((PipeSchedule)sched, pp, M, pv, 0, err, sizeof(err)) != 0) continue;
                    PipeLayout pl = pipe_layout((PipeSchedule)sched, pp, M, pv);
                    int V = pl.V, n = pipeline_ops(&pl), stride = pipeline_plan_max(&pl), peak_all = 0;
                    layouts++;
                    for (int s = 0; s < pp; s++) {
                        int peak;
                        bad_list += list_errors(&pl, ops + s * n, pipeline_schedule(&pl, s, ops + s * n), &peak) != 0;
                        bad_sets += peak != pipeline_inflight(&pl, s);
                        if (peak > peak_all) peak_all = peak;
                    }
                    // zbh1 holds as many sets as 1f1b's first stage; zbv
                    // twice as many of half the layers
                    if (sched == PIPE_1F1B) peak_1f1b[pp][M] = peak_all;
                    if (sched == PIPE_ZBH1) bad_peak += peak_all != peak_1f1b[pp][M];
                    if (sched == PIPE_ZBV) bad_peak += peak_all != 2 * peak_1f1b[pp][M];
                    // F = B = W = 1: the bubble of pipeline_bubble_formula, exactly
                    int end = pipeline_simulate(&pl, 1, 1, 1, ops, start, idle);
                    if (end < 0) {
                        stuck++;
                        continue;
                    }
                    bad_times += times_errors(&pl, 1, 1, 1, ops, start, where) != 0;
                    long num, den, idle_all = 0, busy = (long)M * V * 3;
                    for (int s = 0; s < pp; s++) idle_all += idle[s];
                    bad_bubble += pipeline_bubble_formula(&pl, &num, &den) != 0 || idle_all != (long)pp * (end - busy) ||
                                  idle_all * den != num * pp * end;
                    // other costs: the formula where it holds at any ratio
                    // (one chunk per stage's F and B, or interleaved's); the
                    // zero bubble schedules between the work and 1f1b's step
                    // (zbv's ops are half a stage's)
                    int costs[2][3] = {{1, 2, 1}, {2, 3, 1}};
                    for (int c = 0; c < 2; c++) {
                        int f = costs[c][0], b = costs[c][1], w = costs[c][2];
                        end = pipeline_simulate(&pl, f, b, w, ops, start, NULL);
                        long work = (long)M * V * (f + b + w), line = (long)(M + pp - 1) * (f + b + w);
                        if (sched <= PIPE_INTERLEAVED) bad_costs += end != (long)(M * V + pp - 1) * (f + b + w);
                        else bad_costs += end < work || end > (sched == PIPE_ZBV ? 2 : 1) * line;
                        bad_times += end < 0 || times_errors(&pl, f, b, w, ops, start, where) != 0;
                    }
                    // the plans: as defined, and played with blocking sends
                    // every message matched: 2 (pp V - 1) M part boundaries
                    // crossed, zbv's 2M turns within the last stage not
                    // counted
                    pipeline_simulate(&pl, 1, 1, 1, ops, start, NULL);
                    for (int s = 0; s < pp; s++) {
                        steps[s] = pipeline_plan(&pl, s, ops + s * n, n, plans + s * stride);
                        bad_plan += steps[s] < 0 || steps[s] > stride ||
                                    plan_def_errors(&pl, s, ops + s * n, n, plans + s * stride, steps[s], got, made) != 0;
                        if (V == 1) bad_plan += steps[s] != n || plan_errors(pp, s, ops + s * n, plans + s * stride, n) != 0;
                        // the sets the trainer takes at a first receive or op: one chunk, the
                        // list's own; with chunks early receives add some, never past M V
                        int sets = pipeline_plan_sets(&pl, plans + s * stride, steps[s] > 0 ? steps[s] : 0);
                        bad_plan_sets += V == 1 ? sets != pipeline_inflight(&pl, s)
                                                : sets < pipeline_inflight(&pl, s) || sets > M * V;
                    }
                    int messages = pipeline_check(&pl, stride, steps, plans, err, sizeof(err));
                    if (messages < 0 && failed++ == 0) printf("      pp %d M %d V %d: %s\n", pp, M, V, err);
                    bad_messages += messages >= 0 && messages != 2 * (pp * V - 1) * M - (sched == PIPE_ZBV ? 2 * M : 0);
                }
        check(layouts > 0 && bad_list + bad_sets + bad_peak + stuck + bad_times + bad_bubble + bad_costs == 0,
              "pipeline %s, %d layouts: lists (bad %d), peak sets = pipeline_inflight (bad %d)%s (bad %d), deadlocks %d, "
              "ops after their inputs (bad %d), bubble = pipeline_bubble_formula at F=B=W (bad %d), at other costs (bad %d)",
              pipeline_name((PipeSchedule)sched), layouts, bad_list, bad_sets,
              sched == PIPE_ZBH1 ? ", = 1f1b's" : sched == PIPE_ZBV ? ", = twice 1f1b's" : "", bad_peak, stuck, bad_times,
              bad_bubble, bad_costs);
        check(bad_plan + failed + bad_messages + bad_plan_sets == 0,
              "pipeline plan %s: as defined (bad %d), sets held (pipeline_plan_sets) as the list's with one chunk, "
              "from it to M V with chunks (bad %d), no deadlock or mismatch with blocking sends (bad %d), "
              "2 (pp V - 1) M messages less zbv's turns (bad %d)",
              pipeline_name((PipeSchedule)sched), bad_plan, bad_plan_sets, failed, bad_messages);
    }

    // lists by hand from the definitions in pipeline.h
    struct { PipeSchedule sched; int pp, stage, M, pv; const char *want; } lists[] = {
        // interleaved pp 2 V 2: micro-batches in groups of 2, chunk 0's
        // forwards then chunk 1's; backwards chunk 1 first. Stage 0's
        // warm-up 2(2-0-1) + (2-1)2 = 4 is all of M V = 4 at M 2
        {PIPE_INTERLEAVED, 2, 0, 2, 2, "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1"},
        {PIPE_INTERLEAVED, 2, 1, 2, 2, "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1"},  // warm-up 2
        {PIPE_INTERLEAVED, 2, 1, 4, 2, "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"},
        // pp 4 M 8 stage 0: warm-up 2(4-0-1) + (2-1)4 = 10 of the 16
        // forwards (groups of 4: mbs 0-3 on chunk 0, on chunk 1, then 4-7)
        {PIPE_INTERLEAVED, 4, 0, 8, 2,
         "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 F6 B0.1 F7 B1.1 F4.1 B2.1 F5.1 B3.1 F6.1 B0 F7.1 B1 B2 B3 "
         "B4.1 B5.1 B6.1 B7.1 B4 B5 B6 B7"},
        // zbh1 pp 2 M 3: round x runs F(x), B(x - (1 - stage)), W(x - 1)
        {PIPE_ZBH1, 2, 0, 3, 1, "F0 F1 B0 W0 F2 B1 W1 B2 W2"},
        {PIPE_ZBH1, 2, 1, 3, 1, "F0 B0 F1 B1 W0 F2 B2 W1 W2"},
        // zbv pp 2 M 3, laid out for max(3, 2pp-1) = 3. Stage 0: 3 chunk-0
        // forwards; 2 rounds of F, B, W on chunk 1; one steady round with
        // no chunk-0 forward left (B0 W0 then F B W on chunk 1); then the
        // drain's B and W on chunk 0.
        {PIPE_ZBV, 2, 0, 3, 1, "F0 F1 F2 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 B0 W0 F2.1 B2.1 W2.1 B1 W1 B2 W2"},
        // stage 1: 1 chunk-0 forward; F on chunk 1 then on chunk 0; one
        // round of F, B, W on chunk 1; a steady round; the drain: B on chunk
        // 0 then chunk 1, B and W on chunk 0, the put-off W of chunk 1, of
        // chunk 0
        {PIPE_ZBV, 2, 1, 3, 1, "F0 F0.1 F1 F1.1 B0.1 W0.1 F2 B0 W0 F2.1 B1.1 W1.1 B1 B2.1 B2 W1 W2.1 W2"},
        {PIPE_ZBV, 1, 0, 1, 1, "F0 F0.1 B0.1 W0.1 B0 W0"},
    };
    char text[512];
    for (size_t k = 0; k < sizeof(lists) / sizeof(lists[0]); k++) {
        PipeLayout pl = pipe_layout(lists[k].sched, lists[k].pp, lists[k].M, lists[k].pv);
        int n = pipeline_schedule(&pl, lists[k].stage, ops);
        ops_text(ops, n, text, sizeof(text));
        check(strcmp(text, lists[k].want) == 0, "pipeline %s pp %d stage %d M %d: %s (want %s)",
              pipeline_name(lists[k].sched), lists[k].pp, lists[k].stage, lists[k].M, text, lists[k].want);
    }
    // where the chunks sit: interleaved's chunk c of stage s is part c pp + s,
    // zbv's chunk 1 comes back up
    PipeLayout il = pipe_layout(PIPE_INTERLEAVED, 4, 4, 3), zv = pipe_layout(PIPE_ZBV, 4, 8, 1);
    int st0, ch0, st1, ch1;
    pipeline_place(&il, 9, &st0, &ch0);
    pipeline_place(&zv, 6, &st1, &ch1);
    check(pipeline_part(&il, 1, 2) == 9 && st0 == 1 && ch0 == 2 && pipeline_part(&zv, 1, 1) == 6 && st1 == 1 && ch1 == 1 &&
          pipeline_part(&zv, 3, 0) == 3 && pipeline_part(&zv, 3, 1) == 4,
          "pipeline parts: interleaved pp 4 stage 1 chunk 2 = part 9 (stage %d chunk %d); zbv pp 4 stage 1 chunk 1 = part 6 "
          "(stage %d chunk %d), the last stage holds parts 3 and 4", st0, ch0, st1, ch1);

    // zbv on one stage: every message a hand-off within it. F0 hands its
    // output to chunk 1 (l after), F0.1 takes it (l before), B0.1 hands the
    // gradient back, B0 takes it; the transport carries nothing
    PipeLayout one = pipe_layout(PIPE_ZBV, 1, 1, 1);
    int n = pipeline_schedule(&one, 0, ops), m = pipeline_plan(&one, 0, ops, n, plans);
    pipeline_plan_text(0, plans, m, text, sizeof(text));
    int got_messages = pipeline_check(&one, m, NULL, plans, err, sizeof(err));
    check(strcmp(text, "F0l lF0.1 B0.1l W0.1 lB0 W0") == 0 && got_messages == 0,
          "pipeline plan zbv pp 1 M 1: %s (want F0l lF0.1 B0.1l W0.1 lB0 W0), %d messages", text, got_messages);
    // a hand-off taken before it is made waits forever
    PipeStep first = plans[0];
    plans[0] = plans[1], plans[1] = first;
    const char *want = "deadlock: stage 0 at F0.1 takes activation 0 for chunk 1 from itself";
    check(pipeline_check(&one, m, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0, "pipeline_check: %s", err);

    // why the plans with chunks follow one order of all messages: made as
    // for one chunk (each input received just before its op), interleaved's
    // ring deadlocks, and zbv's stage 1 wants a gradient where stage 0 sends
    // it the activation it ran before
    PipeLayout ring = pipe_layout(PIPE_INTERLEAVED, 3, 3, 2), vee = pipe_layout(PIPE_ZBV, 2, 3, 1);
    n = pipeline_ops(&ring);
    for (int s = 0; s < 3; s++) {
        pipeline_schedule(&ring, s, ops + s * n);
        pipe_plan_line(&ring, s, ops + s * n, n, plans + s * n);
    }
    check(pipeline_check(&ring, n, NULL, plans, err, sizeof(err)) == -1 && strncmp(err, "deadlock: ", 10) == 0,
          "pipeline interleaved pp 3 M 3 V 2 planned as for one chunk: %s", err);
    n = pipeline_ops(&vee);
    for (int s = 0; s < 2; s++) {
        pipeline_schedule(&vee, s, ops + s * n);
        pipe_plan_line(&vee, s, ops + s * n, n, plans + s * n);
    }
    want = "mismatch: stage 0 sends activation 2 as its message 2 to stage 1, which receives gradient 0 for chunk 1";
    check(pipeline_check(&vee, n, NULL, plans, err, sizeof(err)) == -1 && strcmp(err, want) == 0,
          "pipeline zbv pp 2 M 3 planned as for one chunk: %s", err);

    // the flags' check: one line, naming the flag and the value
    struct { PipeSchedule sched; int pp, M, pv, L; const char *want; } flags[] = {
        {PIPE_1F1B, 4, 8, 1, 12, ""},
        {PIPE_INTERLEAVED, 4, 8, 2, 8, ""},
        {PIPE_ZBV, 4, 3, 1, 8, ""},
        {PIPE_INTERLEAVED, 1, 4, 2, 12, "-ps interleaved needs -pp 2 or more (got -pp 1)"},
        {PIPE_INTERLEAVED, 4, 8, 1, 12, "-ps interleaved needs -pv 2 or more (got -pv 1; with one chunk it is 1f1b)"},
        {PIPE_INTERLEAVED, 4, 6, 2, 12, "-ps interleaved needs micro-batches per step a multiple of -pp 4 (got 6)"},
        {PIPE_INTERLEAVED, 4, 8, 2, 6, "-ps interleaved -pp 4: 6 layers cannot fill 4 stages x 2 chunks"},
        {PIPE_ZBV, 4, 8, 1, 7, "-ps zbv -pp 4: 7 layers cannot fill 4 stages x 2 chunks"},
        {PIPE_ZBH1, 2, 8, 2, 12, "-pv 2: only -ps interleaved takes chunks per stage (-ps zbh1 holds 1)"},
        {PIPE_INTERLEAVED, 2, 8, 9, 36, "-pv 9: chunks of layers per stage are 1..8"},
    };
    for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++) {
        err[0] = '\0';
        int rc = pipeline_validate(flags[k].sched, flags[k].pp, flags[k].M, flags[k].pv, flags[k].L, err, sizeof(err));
        int ok = flags[k].want[0] == '\0' ? rc == 0 : rc == -1 && strcmp(err, flags[k].want) == 0;
        check(ok, "pipeline_validate -ps %s -pp %d, %d micro-batches, -pv %d, %d layers: %d '%s' (want '%s')",
              pipeline_name(flags[k].sched), flags[k].pp, flags[k].M, flags[k].pv, flags[k].L, rc, err, flags[k].want);
    }
    check(pipeline_parse("zbv") == PIPE_ZBV && pipeline_parse("interleaved") == PIPE_INTERLEAVED &&
          pipeline_parse("1F1B") == -1, "pipeline_parse: names of pipeline_name");
}

// ----------------------------------------------------------------------------
// the GPU trainer's decisions, made by nccl_comm.h's pure-C side of the NCCL
// backend (the NCCL calls themselves need a GPU; rank 0's 128-byte blob
// reaching every rank is test_rendezvous_server's)

static void test_gpu_binding(void) {
    char err[256] = "";
    check(gpu_for_rank(0, 1, 0, 0, err, sizeof(err)) == 0 && gpu_for_rank(3, 8, 0, 0, err, sizeof(err)) == 3 &&
          gpu_for_rank(7, 8, 0, 0, err, sizeof(err)) == 7, "gpu binding: local rank i takes GPU i");
    int r = gpu_for_rank(1, 1, 0, 0, err, sizeof(err));
    check(r == -1 && strstr(err, "local rank 1 has no GPU of its own: this node has 1") != NULL &&
          strstr(err, "-hb 1") != NULL, "gpu binding refuses a second rank on one GPU unless shared: %s", err);
    r = gpu_for_rank(8, 8, 0, 0, err, sizeof(err));
    check(r == -1 && strstr(err, "local rank 8") != NULL && strstr(err, "has 8") != NULL,
          "gpu binding refuses local rank 8 of 8 GPUs: %s", err);
    r = gpu_for_rank(0, 0, 0, 0, err, sizeof(err));
    check(r == -1 && strcmp(err, "local rank 0: no CUDA device on this node") == 0, "gpu binding without a GPU: %s", err);
    check(gpu_for_rank(-1, 4, 0, 0, err, sizeof(err)) == -1, "gpu binding refuses local rank -1");
    // srun --gpus-per-task=1: each task sees only its own GPU, as device 0
    check(gpu_for_rank(3, 1, 1, 0, err, sizeof(err)) == 0 && gpu_for_rank(3, 8, 1, 0, err, sizeof(err)) == 3 &&
              gpu_for_rank(3, 0, 1, 0, err, sizeof(err)) == -1,
          "gpu binding: a task given its own GPU takes device 0; with more visible, its local rank");
    // host mode: ranks share the GPUs round robin; still none without a GPU
    int all_zero = 1;
    for (int k = 0; k < 8; k++) all_zero &= gpu_for_rank(k, 1, 0, 1, err, sizeof(err)) == 0;
    check(all_zero, "gpu binding, shared: 8 ranks on one GPU all take device 0");
    check(gpu_for_rank(5, 2, 0, 1, err, sizeof(err)) == 1 && gpu_for_rank(7, 4, 0, 1, err, sizeof(err)) == 3 &&
              gpu_for_rank(2, 8, 0, 1, err, sizeof(err)) == 2,
          "gpu binding, shared: local rank i takes GPU i %% ndevices");
    r = gpu_for_rank(63, 0, 0, 1, err, sizeof(err));
    check(r == -1 && strcmp(err, "local rank 63: no CUDA device on this node") == 0,
          "gpu binding, shared, without a GPU: %s", err);
    r = gpu_for_rank(-1, 1, 0, 1, err, sizeof(err));
    check(r == -1 && strstr(err, "local rank -1") != NULL, "gpu binding, shared, refuses local rank -1: %s", err);
    Launch L;
    memset(&L, 0, sizeof(L));
    L.source = "Slurm";
    const char *was = getenv("CUDA_VISIBLE_DEVICES");
    char *saved = was ? strdup(was) : NULL;
    setenv("CUDA_VISIBLE_DEVICES", "5", 1);
    int slurm_one = gpu_own_visible(&L);
    setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
    int slurm_two = gpu_own_visible(&L);
    L.source = "LLM3D_*";
    setenv("CUDA_VISIBLE_DEVICES", "5", 1);
    int ours = gpu_own_visible(&L);
    if (saved) setenv("CUDA_VISIBLE_DEVICES", saved, 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
    free(saved);
    check(slurm_one && !slurm_two && !ours,
          "gpu binding: own GPU only for an outside launcher's task that sees one device (%d %d %d)", slurm_one, slurm_two, ours);
}

// gpu_host_mode: NCCL unless asked for the host backend, or our own
// launcher's ranks (all on this node) outnumber its GPUs
static void test_gpu_host_mode(void) {
    check(gpu_host_mode(1, 0, 16, 8) && gpu_host_mode(1, 1, 1, 1) && gpu_host_mode(1, 1, 2, 8),
          "host mode when asked (-hb 1), whatever the layout");
    check(gpu_host_mode(0, 1, 8, 1) && gpu_host_mode(0, 1, 2, 1) && gpu_host_mode(0, 1, 16, 8),
          "host mode when our launcher's ranks outnumber the GPUs (8 on 1, 2 on 1, 16 on 8)");
    check(!gpu_host_mode(0, 1, 8, 8) && !gpu_host_mode(0, 1, 1, 1) && !gpu_host_mode(0, 1, 2, 8),
          "NCCL when each of our launcher's ranks has a GPU of its own");
    check(!gpu_host_mode(0, 0, 16, 8) && !gpu_host_mode(0, 0, 4, 1),
          "NCCL for an outside launcher's ranks unless asked (they may span nodes)");
    check(!gpu_host_mode(0, 1, 4, 0), "no GPU: not host mode (the binding refuses the rank)");
}

// mac_unread_hit: a write waits for the MAC checks exactly where it
// overlaps the last receive's buffer (nccl_mac_before_write: over NCCL with
// chunks, the embedding into a pooled set, zbv's hand-offs)
static void test_mac_unread_hit(void) {
    static char buf[4096];
    check(mac_unread_hit(buf, 1024, buf, 1024) && mac_unread_hit(buf + 512, 1024, buf, 1024) &&
              mac_unread_hit(buf, 1024, buf + 1023, 1) && mac_unread_hit(buf + 100, 8, buf, 4096),
          "a write into the last received buffer, or overlapping it, waits for its check");
    check(!mac_unread_hit(buf, 1024, buf + 1024, 1024) && !mac_unread_hit(buf + 1024, 1024, buf, 1024) &&
              !mac_unread_hit(NULL, 0, buf, 1024) && !mac_unread_hit(buf, 1024, buf, 0) &&
              !mac_unread_hit(buf, 0, buf, 1024),
          "a write beside it, with no receive unread, or of no bytes does not wait");
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// host mode's bf16 sums (bf16.h): widened exactly, rounded once to nearest even
static void test_bf16_host_sums(void) {
    struct { uint32_t in; uint16_t want; const char *what; } cases[] = {
        {0x3F800000u, 0x3F80, "1.0"},
        {0xC0000000u, 0xC000, "-2.0"},
        {0x80000000u, 0x8000, "-0.0"},
        {0x40490FDBu, 0x4049, "pi rounds down to 3.140625"},
        {0x3F808000u, 0x3F80, "a tie rounds to the even 1.0"},
        {0x3F818000u, 0x3F82, "a tie rounds to the even 0x3F82"},
        {0x3F808001u, 0x3F81, "just above a tie rounds up"},
        {0x7F7FFFFFu, 0x7F80, "FLT_MAX rounds to +inf"},
        {0x7F800000u, 0x7F80, "+inf"},
        {0x00010000u, 0x0001, "the smallest bf16 subnormal"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint16_t got = float_to_bf16(bits_float(cases[i].in));
        if (got != cases[i].want) {
            bad++;
            printf("  float_to_bf16(0x%08X) = 0x%04X, want 0x%04X (%s)\n", cases[i].in, got, cases[i].want, cases[i].what);
        }
        if (float_bits(bf16_to_float(cases[i].want)) != (uint32_t)cases[i].want << 16) bad++;
    }
    check(bad == 0, "bf16: %zu known values round to nearest even and widen exactly", sizeof(cases) / sizeof(cases[0]));
    uint16_t nan = float_to_bf16(bits_float(0x7F800001u));  // a NaN whose payload is all in the dropped half
    check((nan & 0x7F80) == 0x7F80 && (nan & 0x7F) != 0, "bf16: a NaN stays a NaN (0x%04X), never inf", nan);
    // three members' bf16 gradients 1, 2^-8, 2^-8: summed in fp32 and
    // rounded once they give 1 + 2^-7; rounded after each add, 1
    uint16_t member[3] = {0x3F80, 0x3B80, 0x3B80};
    float wide[3], sum = 0.0f;
    bf16_widen(member, wide, 3);
    for (int k = 0; k < 3; k++) sum += wide[k];
    uint16_t once;
    bf16_narrow(&sum, &once, 1);
    uint16_t stepwise = member[0];
    for (int k = 1; k < 3; k++) stepwise = float_to_bf16(bf16_to_float(stepwise) + wide[k]);
    check(once == 0x3F81 && stepwise == 0x3F80, "bf16: host mode's sum rounds once, 1 + 2^-8 + 2^-8 = 0x%04X "
          "(rounded at each add: 0x%04X)", once, stepwise);
    uint16_t back[3];
    bf16_narrow(wide, back, 3);
    check(memcmp(back, member, sizeof(back)) == 0, "bf16: widen then narrow gives the same bits");
}

// every (color, key) of grid_split, over every rank of a layout, makes
// exactly the groups of grid_groups, each rank at its own index
static void test_grid_split(void) {
    int layouts[][3] = {{1, 1, 1}, {4, 1, 1}, {8, 2, 2}, {12, 3, 2}, {8, 4, 1}, {8, 1, 8}, {24, 2, 3}};
    const char *dims[3] = {"dp", "tp", "pp"};
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++) {
        int world = layouts[k][0], tp = layouts[k][1], pp = layouts[k][2];
        int bad = 0;
        for (int dim = GRID_DP; dim <= GRID_PP; dim++) {
            for (int r = 0; r < world; r++) {
                Grid g;
                Group groups[3];
                grid_init(&g, world, tp, pp, r, NULL, 0);
                grid_groups(&g, NULL, &groups[GRID_DP], &groups[GRID_TP], &groups[GRID_PP]);
                const Group *grp = &groups[dim];
                int color, key, members = 0;
                grid_split(&g, dim, &color, &key);
                if (key != grp->me || color < 0 || color >= world) bad++;
                for (int q = 0; q < world; q++) {
                    Grid h;
                    int cq, kq;
                    grid_init(&h, world, tp, pp, q, NULL, 0);
                    grid_split(&h, dim, &cq, &kq);
                    if (cq != color) continue;
                    members++;
                    if (kq < 0 || kq >= grp->size || grp->ranks[kq] != q) bad++;
                }
                if (members != grp->size) bad++;
            }
            if (bad != 0) {
                check(0, "grid_split %s of -np %d -tp %d -pp %d: %d mismatches with grid_groups", dims[dim], world, tp,
                      pp, bad);
                break;
            }
        }
        if (bad == 0)
            check(1, "grid_split of -np %d -tp %d -pp %d: colors and keys make grid_groups' dp, tp and pp groups", world,
                  tp, pp);
    }
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "child") == 0) return child_main(argc, argv);
    (void)test_data_path;  // this test makes its own data
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_self_exe(self_exe, sizeof(self_exe), argv[0]);
    if (test_make_dir(work_dir, sizeof(work_dir), "/tmp/test_parallel-XXXXXX") != 0) {
        fprintf(stderr, "test_parallel: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    uint8_t key[32];
    char key_path[300], err[512];
    snprintf(key_path, sizeof(key_path), "%s/job.key", work_dir);
    if (key_generate(key, err, sizeof(err)) != 0 || key_write_file(key_path, key, err, sizeof(err)) != 0) {
        fprintf(stderr, "test_parallel: %s\n", err);
        return 1;
    }
    double t0 = par_now();
    test_grid();
    test_grid_split();
    test_gpu_binding();
    test_gpu_host_mode();
    test_mac_unread_hit();
    test_bf16_host_sums();
    test_pipeline_schedules();
    test_pipeline_plans();
    test_pipeline_layouts();
    test_addresses();
    test_launch_env(key_path, key);
    test_meet_plan(key_path);
    test_rendezvous_server(key);
    test_rendezvous_missing_rank(key);
    test_launcher_jobs();
    test_faults();
    test_intruders();
    test_outside_launch(key_path);
    printf("(%.1f s)\n", par_now() - t0);
    test_remove_dir(work_dir);
    return test_summary();
}
