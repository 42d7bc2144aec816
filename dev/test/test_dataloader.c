/*
 * test_dataloader.c: dataloader.h against shards it writes into a temp dir.
 *
 *   make dev/test/test_dataloader prepare_data train_gpt2 && ./dev/test/test_dataloader
 *   ./dev/test/test_dataloader --bench   # time to open a 100M-token shard (written in /tmp, then deleted)
 *
 * Token i of test shard s is s*1000 + i, so a window's first token says which
 * shard and sample it came from. Besides the layout, shuffle, data
 * parallelism and resume at chosen points: a resume at every position over
 * three epochs on 1 to 3 ranks, and the shuffle's orders against the
 * uniform distribution (chi-square).
 */
#include "dataloader.h"
#include "llm3d/secure/manifest.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

static char tmpdir[256];

// ----------------------------------------------------------------------------
// writing shards

// write_raw: a shard with the given header fields and ntok_real tokens
static int write_raw(const char *path, int32_t magic, int32_t version, int32_t ntok_field,
                     const uint16_t *tokens, size_t ntok_real) {
    int32_t header[SHARD_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = magic; header[1] = version; header[2] = ntok_field;
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    int ok = fwrite(header, sizeof(header), 1, f) == 1;
    if (ntok_real > 0) ok = ok && fwrite(tokens, 2, ntok_real, f) == ntok_real;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : -1;
}

static uint16_t test_token(int shard, size_t i) { return (uint16_t)(shard * 1000 + i); }

// write_shard: a valid shard named <tmpdir>/<name> of ntok tokens of shard id `shard`
static void write_shard(const char *name, int shard, size_t ntok) {
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    uint16_t *t = (uint16_t *)malloc((ntok + 1) * sizeof(uint16_t));
    for (size_t i = 0; i < ntok; i++) t[i] = test_token(shard, i);
    if (write_raw(path, SHARD_MAGIC, SHARD_VERSION, (int32_t)ntok, t, ntok) != 0) {
        fprintf(stderr, "test_dataloader: cannot write %s\n", path);
        exit(1);
    }
    free(t);
}

// ----------------------------------------------------------------------------
// the main test set: in <tmpdir>/main
//   a.bin 100 tokens (12 samples of B*T = 8), b.bin 57 (7), c.bin 9 (1),
//   e.bin 17 (2): 22 samples per epoch. (Skipping short shards is tested
//   on its own set, so the many opens here print no warnings.)

enum { TB = 2, TT = 4, TV = 50257, NSAMPLES = 22 };
static const int main_ids[] = {0, 1, 2, 4};    // usable shards in sorted order
static const int main_ns[] = {12, 7, 1, 2};    // their samples
static char main_glob[512];

typedef struct { int shard; int sample; } SampleId;

// identify: which sample a batch is; {-1, -1} unless the whole window fits the layout
static SampleId identify(const int *in, const int *tg) {
    SampleId bad = {-1, -1};
    int shard = in[0] / 1000, start = in[0] % 1000;
    if (start % (TB * TT) != 0) return bad;
    for (int i = 0; i < TB * TT; i++) {
        if (in[i] != test_token(shard, (size_t)(start + i))) return bad;
        if (tg[i] != test_token(shard, (size_t)(start + i + 1))) return bad;
    }
    SampleId id = {shard, start / (TB * TT)};
    return id;
}

static int open_main(DataLoader *dl, int rank, int size, int shuffle, uint64_t seed) {
    char err[512];
    int rc = dataloader_init(dl, main_glob, TB, TT, rank, size, shuffle, seed, TV, err, sizeof(err));
    if (rc != 0) printf("      init: %s\n", err);
    return rc;
}

// read_ids: the next n batches of dl as sample ids
static void read_ids(DataLoader *dl, SampleId *ids, int n) {
    int in[TB * TT], tg[TB * TT];
    for (int i = 0; i < n; i++) {
        if (dataloader_next(dl, in, tg) != 0) { ids[i].shard = ids[i].sample = -2; continue; }
        ids[i] = identify(in, tg);
    }
}

static int same_ids(const SampleId *a, const SampleId *b, int n) {
    for (int i = 0; i < n; i++) if (a[i].shard != b[i].shard || a[i].sample != b[i].sample) return 0;
    return 1;
}

static void test_layout(void) {
    DataLoader dl;
    if (!check(open_main(&dl, 0, 1, 0, 0) == 0, "layout: open %s", main_glob)) return;
    check(dl.nshards == 4, "layout: 4 shards, got %d", dl.nshards);
    check(dl.samples_per_epoch == NSAMPLES, "layout: %d samples per epoch, got %llu", NSAMPLES,
          (unsigned long long)dl.samples_per_epoch);
    check(dataloader_batches_per_epoch(&dl) == NSAMPLES, "layout: batches_per_epoch 22, got %ld",
          dataloader_batches_per_epoch(&dl));
    SampleId ids[2 * NSAMPLES + 1];
    read_ids(&dl, ids, 2 * NSAMPLES + 1);
    int k = 0, ok = 1;
    for (int epoch = 0; epoch < 2; epoch++)
        for (int s = 0; s < 4; s++)
            for (int j = 0; j < main_ns[s]; j++, k++)
                if (ids[k].shard != main_ids[s] || ids[k].sample != j) ok = 0;
    check(ok, "layout: 2 epochs unshuffled are a,b,c,e in sorted order, samples in order, windows exact");
    check(ids[2 * NSAMPLES].shard == 0 && ids[2 * NSAMPLES].sample == 0, "layout: epoch 3 starts again at a.bin sample 0");
    DataLoaderState st;
    dataloader_get_state(&dl, &st);
    check(st.epoch == 2 && st.shard_pos == 0 && st.sample_pos == 1,
          "layout: state after 45 batches is epoch 2 shard 0 sample 1, got %llu %llu %llu",
          (unsigned long long)st.epoch, (unsigned long long)st.shard_pos, (unsigned long long)st.sample_pos);
    dataloader_reset(&dl);
    read_ids(&dl, ids, 2);
    check(ids[0].shard == 0 && ids[0].sample == 0 && ids[1].shard == 0 && ids[1].sample == 1,
          "layout: reset goes back to a.bin sample 0");
    dataloader_free(&dl);

    // one long window, to check inputs/targets beyond a toy size
    write_shard("long/x.bin", 7, 900);
    char pattern[512], err[512] = "ok";
    test_path(pattern, sizeof(pattern), tmpdir, "long/*.bin");
    if (check(dataloader_init(&dl, pattern, 4, 50, 0, 1, 0, 0, TV, err, sizeof(err)) == 0, "long: open (%s)", err)) {
        int in[200], tg[200], good = 1;
        check(dataloader_batches_per_epoch(&dl) == 4, "long: 900 tokens hold 4 windows of 201, got %ld",
              dataloader_batches_per_epoch(&dl));
        for (int b = 0; b < 5; b++) {
            dataloader_next(&dl, in, tg);
            int base = (b % 4) * 200;
            for (int i = 0; i < 200; i++)
                if (in[i] != test_token(7, (size_t)(base + i)) || tg[i] != test_token(7, (size_t)(base + i + 1))) good = 0;
        }
        check(good, "long: B=4 T=50: inputs are tokens [200k, 200k+200), targets shifted by one, wraps after 4");
        dataloader_free(&dl);
    }
}

static void test_shuffle(void) {
    DataLoader dl;
    if (!check(open_main(&dl, 0, 1, 1, 1234) == 0, "shuffle: open")) return;
    enum { E = 4 };
    SampleId ids[E * NSAMPLES];
    read_ids(&dl, ids, E * NSAMPLES);
    dataloader_free(&dl);
    int perm_ok = 1;
    for (int e = 0; e < E; e++) {
        int seen[5][12];
        memset(seen, 0, sizeof(seen));
        for (int i = 0; i < NSAMPLES; i++) {
            SampleId id = ids[e * NSAMPLES + i];
            if (id.shard < 0 || id.shard > 4) { perm_ok = 0; continue; }
            seen[id.shard][id.sample]++;
        }
        for (int s = 0; s < 4; s++)
            for (int j = 0; j < main_ns[s]; j++)
                if (seen[main_ids[s]][j] != 1) perm_ok = 0;
    }
    check(perm_ok, "shuffle: each of 4 epochs holds every sample exactly once (exact windows)");
    // a shard's samples stay together: the shuffle permutes shards, then samples inside a shard
    int grouped = 1;
    for (int e = 0; e < E; e++) {
        int i = e * NSAMPLES, end = i + NSAMPLES;
        while (i < end) {
            int shard = ids[i].shard, n = 0;
            for (int s = 0; s < 4; s++) if (main_ids[s] == shard) n = main_ns[s];
            for (int j = 0; j < n; j++) if (i + j >= end || ids[i + j].shard != shard) grouped = 0;
            i += n > 0 ? n : 1;
        }
    }
    check(grouped, "shuffle: each shard's samples are contiguous within an epoch");
    int sorted = 1, differ01 = 0;
    for (int i = 0; i < NSAMPLES; i++) {
        if (ids[i].shard != 0 && i < 12) sorted = 0;
        if (ids[i].shard != ids[NSAMPLES + i].shard || ids[i].sample != ids[NSAMPLES + i].sample) differ01 = 1;
    }
    int a_in_order = 1, a_seen = 0;
    for (int i = 0; i < NSAMPLES; i++) if (ids[i].shard == 0) { if (ids[i].sample != a_seen) a_in_order = 0; a_seen++; }
    check(!(sorted && a_in_order), "shuffle: epoch 0 is not the sorted order");
    check(differ01, "shuffle: epoch 1 is ordered differently from epoch 0");

    SampleId again[E * NSAMPLES], other[E * NSAMPLES];
    open_main(&dl, 0, 1, 1, 1234);
    read_ids(&dl, again, E * NSAMPLES);
    dataloader_free(&dl);
    check(same_ids(ids, again, E * NSAMPLES), "shuffle: same seed, same order over 4 epochs");
    open_main(&dl, 0, 1, 1, 1235);
    read_ids(&dl, other, E * NSAMPLES);
    dataloader_free(&dl);
    check(!same_ids(ids, other, NSAMPLES), "shuffle: seed 1235 gives another epoch-0 order than 1234");

    // the PRNG is splitmix64: its first output from state 0 is a published value
    uint64_t s = 0;
    check(dl_splitmix64(&s) == 0xE220A8397B1DCDAFULL, "shuffle: splitmix64(0) first output is 0xE220A8397B1DCDAF");
    uint64_t counts[5] = {0};
    uint64_t st = 99;
    for (int i = 0; i < 50000; i++) counts[dl_below(&st, 5)]++;
    int flat = 1;
    for (int i = 0; i < 5; i++) if (counts[i] < 9500 || counts[i] > 10500) flat = 0;
    check(flat, "shuffle: dl_below(5) over 50000 draws is flat (%llu %llu %llu %llu %llu)",
          (unsigned long long)counts[0], (unsigned long long)counts[1], (unsigned long long)counts[2],
          (unsigned long long)counts[3], (unsigned long long)counts[4]);
}

// the union over R ranks, interleaved, is the single-rank stream
static void test_data_parallel(void) {
    enum { PER_RANK = 18 }; // 18*4 = 72 > 3 epochs of 22: crosses epoch seams at odd offsets
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        DataLoader one;
        if (open_main(&one, 0, 1, shuffle, 77) != 0) { check(0, "dp: open single rank"); return; }
        SampleId single[PER_RANK * 4];
        read_ids(&one, single, PER_RANK * 4);
        dataloader_free(&one);
        for (int R = 1; R <= 4; R++) {
            int ok = 1;
            for (int r = 0; r < R; r++) {
                DataLoader dl;
                if (open_main(&dl, r, R, shuffle, 77) != 0) { ok = 0; continue; }
                if (dataloader_batches_per_epoch(&dl) != NSAMPLES / R) ok = 0;
                SampleId mine[PER_RANK];
                read_ids(&dl, mine, PER_RANK);
                for (int i = 0; i < PER_RANK; i++) {
                    SampleId want = single[i * R + r];
                    if (mine[i].shard != want.shard || mine[i].sample != want.sample || mine[i].shard < 0) ok = 0;
                }
                dataloader_free(&dl);
            }
            check(ok, "dp: shuffle %d, R=%d: rank r's batch i is the single-rank batch i*R+r over %d global batches",
                  shuffle, R, PER_RANK * R);
        }
    }
    // a 4-rank run reads each sample of the epoch exactly once among its ranks
    DataLoader dl;
    int seen[5][12];
    memset(seen, 0, sizeof(seen));
    for (int r = 0; r < 2; r++) {
        open_main(&dl, r, 2, 1, 5);
        SampleId mine[NSAMPLES / 2];
        read_ids(&dl, mine, NSAMPLES / 2);
        for (int i = 0; i < NSAMPLES / 2; i++) if (mine[i].shard >= 0) seen[mine[i].shard][mine[i].sample]++;
        dataloader_free(&dl);
    }
    int once = 1;
    for (int s = 0; s < 4; s++) for (int j = 0; j < main_ns[s]; j++) if (seen[main_ids[s]][j] != 1) once = 0;
    check(once, "dp: 2 ranks x 11 batches, shuffled, cover the 22 samples once each (disjoint)");
}

static void test_resume(void) {
    const int ks[] = {0, 1, 5, 21, 22, 23, 40, 45};
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        for (int R = 1; R <= 3; R += 2) {
            int ok = 1;
            for (size_t ki = 0; ki < sizeof(ks) / sizeof(ks[0]); ki++) {
                for (int r = 0; r < R; r++) {
                    DataLoader a, b;
                    open_main(&a, r, R, shuffle, 9);
                    SampleId skip_ids[45], from_a[30], from_b[30];
                    read_ids(&a, skip_ids, ks[ki]);
                    DataLoaderState st;
                    dataloader_get_state(&a, &st);
                    open_main(&b, r, R, shuffle, 9);
                    char err[256];
                    if (dataloader_set_state(&b, &st, err, sizeof(err)) != 0) { ok = 0; printf("      %s\n", err); }
                    read_ids(&a, from_a, 30);
                    read_ids(&b, from_b, 30);
                    if (!same_ids(from_a, from_b, 30)) ok = 0;
                    dataloader_free(&a);
                    dataloader_free(&b);
                }
            }
            check(ok, "resume: shuffle %d, R=%d: get_state after k in {0,1,5,21,22,23,40,45}, fresh loader + set_state: next 30 batches equal",
                  shuffle, R);
        }
    }
    // the state is the same on every rank, so a 1-rank run may continue as 2 ranks
    DataLoader one, r0, r1;
    open_main(&one, 0, 1, 1, 3);
    SampleId first[30], rest[40], mine0[20], mine1[20];
    read_ids(&one, first, 30);
    DataLoaderState st;
    dataloader_get_state(&one, &st);
    read_ids(&one, rest, 40);
    open_main(&r0, 0, 2, 1, 3);
    open_main(&r1, 1, 2, 1, 3);
    char err[256];
    int set_ok = dataloader_set_state(&r0, &st, err, sizeof(err)) == 0 && dataloader_set_state(&r1, &st, err, sizeof(err)) == 0;
    read_ids(&r0, mine0, 20);
    read_ids(&r1, mine1, 20);
    int ok = set_ok;
    for (int i = 0; i < 20; i++) {
        if (mine0[i].shard != rest[2 * i].shard || mine0[i].sample != rest[2 * i].sample) ok = 0;
        if (mine1[i].shard != rest[2 * i + 1].shard || mine1[i].sample != rest[2 * i + 1].sample) ok = 0;
    }
    check(ok, "resume: a 1-rank state after 30 batches, restored on 2 ranks, continues the same stream");
    DataLoaderState s0, s1;
    dataloader_get_state(&r0, &s0);
    dataloader_get_state(&r1, &s1);
    check(memcmp(&s0, &s1, sizeof(s0)) == 0, "resume: ranks 0 and 1 hold byte-identical states");
    dataloader_free(&one); dataloader_free(&r0); dataloader_free(&r1);

    // states that do not fit the data are refused, naming the field and value
    open_main(&one, 0, 1, 0, 0);
    DataLoaderState bad = {0, 4, 0, 0};
    check(dataloader_set_state(&one, &bad, err, sizeof(err)) != 0 && strstr(err, "shard_pos is 4") != NULL,
          "resume: shard_pos 4 of 4 shards refused: %s", err);
    DataLoaderState bad2 = {0, 1, 7, 0};
    check(dataloader_set_state(&one, &bad2, err, sizeof(err)) != 0 && strstr(err, "sample_pos is 7") != NULL
          && strstr(err, "b.bin") != NULL, "resume: sample_pos 7 of b.bin's 7 refused: %s", err);
    SampleId after[1];
    read_ids(&one, after, 1);
    check(after[0].shard == 0 && after[0].sample == 0, "resume: a refused state leaves the loader where it was");
    dataloader_free(&one);
}

// a resume at every position the stream reaches over three epochs and a
// bit: after every step of a run of R = 1, 2, 3 ranks, each shuffle, the
// state saved, set on fresh loaders of R' = 1, 2, 3 ranks (the state is the
// same on every rank and does not depend on dp_size), and their next
// batches compared with the uninterrupted single-rank stream, and their
// state after them with that stream's. Every position means every word of
// the state matters somewhere: sample_pos mid-shard, shard_pos past the
// first shard, epoch and rng past the first epoch (shuffled, the rng is the
// epoch's permutation key; the epoch also keys the loader's cached orders,
// and a later checkpoint saves it). The resumed loaders read across at
// least one epoch seam from every position.
enum { RESUME_UPTO = 3 * NSAMPLES + 4, RESUME_READ = NSAMPLES + 5 };
static void test_resume_everywhere(void) {
    enum { TOTAL = RESUME_UPTO + RESUME_READ + 3 };  // R2 ranks read up to RESUME_READ + 2
    static SampleId stream[TOTAL];
    static DataLoaderState states[TOTAL + 1];  // states[g]: the position before global batch g
    char err[256];
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        DataLoader one;
        if (open_main(&one, 0, 1, shuffle, 31) != 0) {
            check(0, "resume everywhere: shuffle %d: open", shuffle);
            return;
        }
        for (int g = 0; g < TOTAL; g++) {
            dataloader_get_state(&one, &states[g]);
            read_ids(&one, &stream[g], 1);
        }
        dataloader_get_state(&one, &states[TOTAL]);
        // the stream reaches each of the four words' values: epochs 0..3,
        // every shard_pos, sample_pos past 0, rng keys of several epochs
        int max_epoch = 0, max_shard = 0, mid_shard = 0;
        for (int g = 0; g < RESUME_UPTO; g++) {
            if ((int)states[g].epoch > max_epoch) max_epoch = (int)states[g].epoch;
            if ((int)states[g].shard_pos > max_shard) max_shard = (int)states[g].shard_pos;
            mid_shard += states[g].sample_pos > 0;
        }
        check(max_epoch == 3 && max_shard == 3 && mid_shard > 40 && states[NSAMPLES].rng != states[0].rng,
              "resume everywhere: shuffle %d: positions 0..%d reach epoch %d, shard_pos %d, %d mid-shard, and the "
              "rng changes with the epoch", shuffle, RESUME_UPTO - 1, max_epoch, max_shard, mid_shard);
        for (int R = 1; R <= 3; R++) {
            // the R-rank run, uninterrupted: after each step every rank holds
            // the single-rank state of global position k*R
            DataLoader run[3];
            int opened = 0, same_state = 1, k_last = RESUME_UPTO / R;
            for (int r = 0; r < R; r++) opened += open_main(&run[r], r, R, shuffle, 31) == 0;
            if (opened != R) {
                check(0, "resume everywhere: shuffle %d: open %d ranks", shuffle, R);
                return;
            }
            int bad[4] = {0, 0, 0, 0}, first_bad_k[4] = {-1, -1, -1, -1}, first_bad_rank[4] = {0, 0, 0, 0};
            for (int k = 0; k <= k_last; k++) {
                DataLoaderState st;
                dataloader_get_state(&run[0], &st);
                for (int r = 0; r < R; r++) {
                    DataLoaderState mine;
                    dataloader_get_state(&run[r], &mine);
                    if (memcmp(&mine, &states[k * R], sizeof(mine)) != 0) same_state = 0;
                }
                // resumed here by R2 fresh ranks
                for (int R2 = 1; R2 <= 3; R2++) {
                    int n = (RESUME_READ + R2 - 1) / R2;  // so that the R2 ranks read RESUME_READ or more
                    for (int r = 0; r < R2; r++) {
                        DataLoader dl;
                        if (open_main(&dl, r, R2, shuffle, 31) != 0) { bad[R2]++; continue; }
                        int ok = dataloader_set_state(&dl, &st, err, sizeof(err)) == 0;
                        DataLoaderState set;
                        dataloader_get_state(&dl, &set);
                        ok = ok && memcmp(&set, &st, sizeof(st)) == 0;
                        SampleId got[RESUME_READ];
                        read_ids(&dl, got, n);
                        for (int i = 0; i < n && ok; i++) {
                            SampleId want = stream[k * R + i * R2 + r];
                            ok = got[i].shard == want.shard && got[i].sample == want.sample && got[i].shard >= 0;
                        }
                        DataLoaderState after;
                        dataloader_get_state(&dl, &after);
                        ok = ok && memcmp(&after, &states[k * R + n * R2], sizeof(after)) == 0;
                        if (!ok && bad[R2]++ == 0) { first_bad_k[R2] = k; first_bad_rank[R2] = r; }
                        dataloader_free(&dl);
                    }
                }
                // the run's next step
                for (int r = 0; r < R; r++) {
                    SampleId id;
                    read_ids(&run[r], &id, 1);
                }
            }
            for (int r = 0; r < R; r++) dataloader_free(&run[r]);
            check(same_state, "resume everywhere: shuffle %d, %d ranks: after each of %d steps every rank's state is "
                  "the single-rank state at that global position", shuffle, R, k_last + 1);
            for (int R2 = 1; R2 <= 3; R2++) {
                char first[64] = "";
                if (bad[R2] > 0) snprintf(first, sizeof(first), "; the first at step %d, rank %d", first_bad_k[R2],
                                          first_bad_rank[R2]);
                check(bad[R2] == 0, "resume everywhere: shuffle %d: the state after each of steps 0..%d of %d rank(s), "
                      "set on %d fresh rank(s): state as set, next %d global batches and the state after them as "
                      "uninterrupted (%d wrong%s)", shuffle, k_last, R, R2, RESUME_READ, bad[R2], first);
            }
        }
        // and set on a loader that has read ahead already (its cached orders
        // are of later epochs): every position, from the last back to 0
        int warm_bad = 0, warm_first = -1;
        for (int g = RESUME_UPTO - 1; g >= 0; g--) {
            int ok = dataloader_set_state(&one, &states[g], err, sizeof(err)) == 0;
            SampleId got[RESUME_READ];
            read_ids(&one, got, RESUME_READ);
            ok = ok && same_ids(got, &stream[g], RESUME_READ);
            DataLoaderState after;
            dataloader_get_state(&one, &after);
            ok = ok && memcmp(&after, &states[g + RESUME_READ], sizeof(after)) == 0;
            if (!ok && warm_bad++ == 0) warm_first = g;
        }
        check(warm_bad == 0, "resume everywhere: shuffle %d: a used loader set back to each position %d..0 reads the "
              "next %d batches, and is then where the uninterrupted one is (%d wrong, the first at %d)", shuffle,
              RESUME_UPTO - 1, RESUME_READ, warm_bad, warm_first);
        dataloader_free(&one);
    }
}

// the index of the permutation p of 0..3 among the 24 (its Lehmer code);
// -1 when p is not a permutation
static int perm4_index(const int p[4]) {
    int seen = 0, index = 0;
    for (int i = 0; i < 4; i++) {
        if (p[i] < 0 || p[i] > 3 || (seen >> p[i] & 1)) return -1;
        int smaller_later = 0;
        for (int j = i + 1; j < 4; j++) smaller_later += p[j] < p[i];
        index = index * (4 - i) + smaller_later;
        seen |= 1 << p[i];
    }
    return index;
}

// the shuffle is uniform: over 24,000 epochs (10 fixed seeds, 2,400 epochs
// each; every epoch draws from a fresh key) each of the 24 orders of 4
// items comes up about 1,000 times. Pearson's chi-square against the uniform
// counts has 23 degrees of freedom; the bound 110 is exceeded by a uniform
// shuffle with probability 2.5e-13 (regularized upper gamma Q(11.5, 55)), so
// the check fails falsely with probability < 1e-9 even allowing for the
// approximation of the counts by the chi-square law. The seeds are fixed, so
// its outcome never changes from run to run. A biased shuffle lands far
// above: Sattolo's algorithm (drawing j from [0, i) instead of [0, i]) gives
// only the 6 cyclic orders, a chi-square near 72,000; and no item ever stays
// in its place, which is checked on its own.
// Both shuffles: the shard order (4 shards of one sample each) and the
// sample order inside a shard (one shard of 4 samples), each alone.
static void test_shuffle_uniform(void) {
    enum { SEEDS = 10, EPOCHS = 2400, CELLS = 24 };
    char dir[400], pattern[512], err[512];
    const char *what[2] = {"shard order (4 shards of 1 sample)", "sample order (1 shard of 4 samples)"};
    for (int kind = 0; kind < 2; kind++) {
        test_path(dir, sizeof(dir), tmpdir, kind == 0 ? "uniform_shards" : "uniform_samples");
        mkdir(dir, 0700);
        if (kind == 0) {
            for (int s = 0; s < 4; s++) {
                char name[64];
                snprintf(name, sizeof(name), "uniform_shards/s%d.bin", s);
                write_shard(name, 10 + s, TB * TT + 1);
            }
        } else {
            write_shard("uniform_samples/x.bin", 20, 4 * TB * TT + 1);
        }
        snprintf(pattern, sizeof(pattern), "%s/*.bin", dir);
        long counts[CELLS] = {0}, fixed_points = 0, bad = 0;
        for (int seed = 1; seed <= SEEDS; seed++) {
            DataLoader dl;
            if (dataloader_init(&dl, pattern, TB, TT, 0, 1, 1, (uint64_t)seed, TV, err, sizeof(err)) != 0) {
                check(0, "uniform: %s: open (%s)", what[kind], err);
                return;
            }
            for (int e = 0; e < EPOCHS; e++) {
                SampleId ids[4];
                read_ids(&dl, ids, 4);
                int p[4];
                for (int i = 0; i < 4; i++) p[i] = kind == 0 ? ids[i].shard - 10 : ids[i].sample;
                int index = perm4_index(p);
                if (index < 0) { bad++; continue; }
                counts[index]++;
                for (int i = 0; i < 4; i++) fixed_points += p[i] == i;
            }
            dataloader_free(&dl);
        }
        double expected = (double)SEEDS * EPOCHS / CELLS, chi2 = 0.0;
        long least = counts[0], most = counts[0];
        for (int c = 0; c < CELLS; c++) {
            chi2 += (counts[c] - expected) * (counts[c] - expected) / expected;
            if (counts[c] < least) least = counts[c];
            if (counts[c] > most) most = counts[c];
        }
        check(bad == 0, "uniform: %s: each of %d epochs is an order of the 4 (%ld not)", what[kind], SEEDS * EPOCHS, bad);
        check(chi2 < 110.0, "uniform: %s: the 24 orders over %d epochs: chi-square %.1f < 110 (23 degrees of freedom; "
              "counts %ld..%ld, %.0f expected)", what[kind], SEEDS * EPOCHS, chi2, least, most, expected);
        // a uniform shuffle leaves an item in place with probability 1/4:
        // 24,000 expected (sd 155: a random order's fixed points have
        // variance 1), so 23,000..25,000 is 6.4 sd either way, a false
        // failure under 1e-9; none under Sattolo's
        check(fixed_points > 23000 && fixed_points < 25000, "uniform: %s: %ld items left in place of %d (24000 "
              "expected)", what[kind], fixed_points, 4 * SEEDS * EPOCHS);
    }
}

// ----------------------------------------------------------------------------
// bad input

// expect_init_error: init on pattern fails, err names every one of the needles
static void expect_init_error(const char *what, const char *pattern, int B, int T, int rank, int size,
                              int vocab, const char *needle1, const char *needle2, const char *needle3) {
    DataLoader dl;
    char err[1024] = "";
    int rc = dataloader_init(&dl, pattern, B, T, rank, size, 0, 0, vocab, err, sizeof(err));
    int named = (needle1 == NULL || strstr(err, needle1) != NULL) && (needle2 == NULL || strstr(err, needle2) != NULL)
                && (needle3 == NULL || strstr(err, needle3) != NULL);
    check(rc != 0 && named && dl.shards == NULL, "error: %s: \"%s\"", what, err);
    if (rc == 0) dataloader_free(&dl);
}

static void one_file_dir(const char *dir, char *pattern, size_t len) {
    char path[400];
    test_path(path, sizeof(path), tmpdir, dir);
    mkdir(path, 0700);
    snprintf(pattern, len, "%s/*.bin", path);
}

static void test_errors(void) {
    char pattern[512], path[512];
    uint16_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (uint16_t)i;

    test_path(pattern, sizeof(pattern), tmpdir, "nothing/*.bin");
    expect_init_error("empty glob", pattern, TB, TT, 0, 1, TV, "no files match", pattern, NULL);

    one_file_dir("dangling", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "dangling/x.bin");
    check(symlink("/nonexistent/llm3d/shard.bin", path) == 0, "error setup: dangling symlink");
    expect_init_error("unreadable file (dangling link)", pattern, TB, TT, 0, 1, TV, path, "cannot open", NULL);

    one_file_dir("isdir", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "isdir/sub.bin");
    mkdir(path, 0700);
    expect_init_error("a directory matches", pattern, TB, TT, 0, 1, TV, path, "not a regular file", NULL);

    if (geteuid() != 0) {
        one_file_dir("noperm", pattern, sizeof(pattern));
        test_path(path, sizeof(path), tmpdir, "noperm/x.bin");
        write_raw(path, SHARD_MAGIC, 1, 64, toks, 64);
        chmod(path, 0);
        expect_init_error("unreadable file (mode 000)", pattern, TB, TT, 0, 1, TV, path, "cannot open", NULL);
    } else {
        skip("error: mode-000 file (running as root, which reads it anyway)");
    }

    one_file_dir("short", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "short/x.bin");
    FILE *f = fopen(path, "wb");
    int32_t head[3] = {SHARD_MAGIC, 1, 0};
    fwrite(head, sizeof(head), 1, f);
    fclose(f);
    expect_init_error("file shorter than the header", pattern, TB, TT, 0, 1, TV, path, "12 bytes", "1024-byte");

    one_file_dir("magic", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "magic/x.bin");
    write_raw(path, 20240801, 1, 64, toks, 64);
    expect_init_error("wrong magic", pattern, TB, TT, 0, 1, TV, path, "magic) is 20240801", "20240520");

    one_file_dir("version", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "version/x.bin");
    write_raw(path, SHARD_MAGIC, 7, 64, toks, 64);
    expect_init_error("wrong version", pattern, TB, TT, 0, 1, TV, path, "version) is 7", NULL);

    one_file_dir("trunc", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "trunc/x.bin");
    write_raw(path, SHARD_MAGIC, 1, 64, toks, 63);
    expect_init_error("truncated shard (ntok vs size)", pattern, TB, TT, 0, 1, TV, path, "ntok) is 64", "1152 bytes");
    {
        DataLoader dl;
        char err[512];
        dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, TV, err, sizeof(err));
        check(strstr(err, "file is 1150 bytes") != NULL, "error: truncated shard names the real size 1150: %s", err);
    }

    one_file_dir("long", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "long/x.bin");
    write_raw(path, SHARD_MAGIC, 1, 10, toks, 64);
    expect_init_error("ntok smaller than the file", pattern, TB, TT, 0, 1, TV, path, "needs a file of 1044 bytes", "file is 1152 bytes");

    one_file_dir("neg", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "neg/x.bin");
    write_raw(path, SHARD_MAGIC, 1, -5, toks, 0);
    expect_init_error("negative ntok", pattern, TB, TT, 0, 1, TV, path, "ntok) is -5", NULL);

    // token >= V: the bad one sits past the first check block, so the block logic is exercised
    one_file_dir("vocab", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "vocab/x.bin");
    {
        size_t n = 20000;
        uint16_t *big = (uint16_t *)calloc(n, sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) big[i] = (uint16_t)(i % 50257);
        big[12345] = 50257;
        big[15000] = 60000;
        write_raw(path, SHARD_MAGIC, 1, (int32_t)n, big, n);
        free(big);
    }
    expect_init_error("token >= V", pattern, TB, TT, 0, 1, TV, path, "token 12345 (byte offset 25714) is 50257", "vocab_size 50257");
    {
        DataLoader dl;
        char err[512];
        int rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, 65536, err, sizeof(err));
        check(rc == 0, "error: the same shard is fine with vocab_size 65536 (%s)", rc == 0 ? "" : err);
        if (rc == 0) dataloader_free(&dl);
        rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, 50258, err, sizeof(err));
        check(rc != 0 && strstr(err, "token 15000") != NULL && strstr(err, "is 60000") != NULL,
              "error: with vocab_size 50258 the first bad token is 15000: %s", err);
    }
    // the SWAR test against a plain loop: random lengths (tails of 0..7), limits and bad lanes
    uint64_t rs = 2024;
    int swar_ok = 1;
    for (int trial = 0; trial < 20000; trial++) {
        uint16_t buf[40];
        int n = (int)dl_below(&rs, 41);
        uint16_t limit = (uint16_t)(1 + dl_below(&rs, 65535));
        for (int i = 0; i < n; i++) buf[i] = (uint16_t)dl_below(&rs, limit);
        if (n > 0 && dl_below(&rs, 2) == 0) buf[dl_below(&rs, (uint64_t)n)] = (uint16_t)(limit + dl_below(&rs, 65536u - limit));
        int want = 0;
        for (int i = 0; i < n; i++) if (buf[i] >= limit) want = 1;
        if (shard_any_at_least(buf, (uint64_t)n, limit) != want) swar_ok = 0;
    }
    check(swar_ok, "error: SWAR token test agrees with a plain loop on 20000 random cases");
    uint16_t edge[3] = {0, 99, 100};
    check(shard_check_tokens(edge, 2, 100, "m", path, sizeof(path)) == 0 && shard_check_tokens(edge, 3, 100, "m", path, sizeof(path)) != 0,
          "error: token V-1 passes, token V fails");

    expect_init_error("B = 0", main_glob, 0, TT, 0, 1, TV, "B (0)", NULL, NULL);
    expect_init_error("T = -3", main_glob, TB, -3, 0, 1, TV, "T (-3)", NULL, NULL);
    expect_init_error("dp_rank 2 of 2", main_glob, TB, TT, 2, 2, TV, "dp_rank 2", "dp_size 2", NULL);
    expect_init_error("vocab_size 0", main_glob, TB, TT, 0, 1, 0, "vocab_size is 0", NULL, NULL);
    expect_init_error("fewer micro-batches than dp_size", main_glob, TB, TT, 0, 23, TV, "22 micro-batches", "dp_size 23", NULL);

    // shorter than one batch: one shard of 64 tokens with B*T+1 = 65
    one_file_dir("tiny", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "tiny/x.bin");
    write_raw(path, SHARD_MAGIC, 1, 64, toks, 64);
    expect_init_error("only shard shorter than one batch", pattern, 8, 8, 0, 1, TV, path, "64 tokens", "65");
    test_path(path, sizeof(path), tmpdir, "tiny/y.bin");
    write_raw(path, SHARD_MAGIC, 1, 30, toks, 30);
    expect_init_error("every shard shorter than one batch", pattern, 8, 8, 0, 1, TV, "none of the 2 files", "65", NULL);
    DataLoader dl;
    char err[512];
    int rc = dataloader_init(&dl, pattern, 4, 8, 0, 1, 0, 0, TV, err, sizeof(err));
    check(rc == 0 && dl.nshards == 1 && strstr(dl.shards[0].path, "x.bin") != NULL && dataloader_batches_per_epoch(&dl) == 1,
          "short: B*T+1 = 33: y.bin (30 tokens) skipped with a warning, x.bin (64 tokens, 1 sample) used");
    const char *w = rc == 0 ? dataloader_warnings(&dl) : "";
    check(strstr(w, "y.bin: 30 tokens, fewer than B*T+1 = 33; skipped\n") != NULL && strchr(w, '\n') == w + strlen(w) - 1,
          "short: the warning is one line the caller prints, naming y.bin: %s", w);
    if (rc == 0) {
        int in[32], tg[32], only_x = 1;
        for (int b = 0; b < 3; b++) {
            dataloader_next(&dl, in, tg);
            for (int i = 0; i < 32; i++) if (in[i] != i || tg[i] != i + 1) only_x = 0;
        }
        check(only_x, "short: every batch is x.bin's tokens 0..32; none from y.bin");
        dataloader_free(&dl);
    }

    // a bad shard among good ones fails the whole open (no silent skipping of corrupt data)
    one_file_dir("mixed", pattern, sizeof(pattern));
    test_path(path, sizeof(path), tmpdir, "mixed/a.bin");
    write_raw(path, SHARD_MAGIC, 1, 64, toks, 64);
    test_path(path, sizeof(path), tmpdir, "mixed/b.bin");
    write_raw(path, 1, 1, 64, toks, 64);
    expect_init_error("one bad shard among good ones", pattern, TB, TT, 0, 1, TV, path, "magic) is 1", NULL);

    // the memory parser on its own
    uint8_t buf[SHARD_HEADER_BYTES + 8];
    memset(buf, 0, sizeof(buf));
    int32_t h[3] = {SHARD_MAGIC, 1, 4};
    memcpy(buf, h, sizeof(h));
    uint64_t ntok = 99;
    int prc = shard_parse_header(buf, sizeof(buf), "mem", &ntok, err, sizeof(err));
    check(prc == 0 && ntok == 4, "parse: valid header of 4 tokens, got rc %d ntok %llu", prc, (unsigned long long)ntok);
    check(shard_parse_header(buf, sizeof(buf) - 1, "mem", &ntok, err, sizeof(err)) != 0 && strstr(err, "1031 bytes") != NULL,
          "parse: one byte short: %s", err);
    check(shard_parse_header(buf, 0, "mem", &ntok, err, sizeof(err)) != 0 && ntok == 0, "parse: empty buffer refused");
}

// a MANIFEST next to the shards: every shard listed and matching, else init fails
static void write_manifest(const char *dir, const char *const *names, int n, const uint8_t *key) {
    Manifest m = {0, NULL};
    char err[512];
    for (int i = 0; i < n; i++)
        if (manifest_add_file(&m, dir, names[i], err, sizeof(err)) != 0) printf("      manifest: %s\n", err);
    if (manifest_write(&m, dir, "MANIFEST", key, err, sizeof(err)) != 0) printf("      manifest: %s\n", err);
    manifest_free(&m);
}

static void test_manifest(void) {
    char dir[400], pattern[512], all[512], path[512], err[1024];
    test_path(dir, sizeof(dir), tmpdir, "sealed");
    mkdir(dir, 0700);
    write_shard("sealed/s0.bin", 0, 100);
    write_shard("sealed/s1.bin", 1, 57);
    const char *names[] = {"s0.bin", "s1.bin"};
    write_manifest(dir, names, 2, NULL);
    snprintf(pattern, sizeof(pattern), "%s/s*.bin", dir);
    snprintf(all, sizeof(all), "%s/*", dir);
    DataLoader dl;
    int rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, TV, err, sizeof(err));
    check(rc == 0, "manifest: 2 shards listed and matching open (%s)", rc == 0 ? "ok" : err);
    if (rc == 0) dataloader_free(&dl);
    rc = dataloader_init(&dl, all, TB, TT, 0, 1, 0, 0, TV, err, sizeof(err));
    check(rc == 0 && dl.nshards == 2, "manifest: a glob of the whole dir skips MANIFEST itself (%s)", rc == 0 ? "ok" : err);
    if (rc == 0) dataloader_free(&dl);

    // a shard that is not listed
    write_shard("sealed/s2.bin", 2, 30);
    snprintf(path, sizeof(path), "%s/s2.bin", dir);
    expect_init_error("manifest: shard not listed", pattern, TB, TT, 0, 1, TV, path, "not listed in the manifest", NULL);
    unlink(path);

    // a token changed in place: same size, other hash
    snprintf(path, sizeof(path), "%s/s1.bin", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, SHARD_HEADER_BYTES + 2 * 10, SEEK_SET);
    uint16_t other = 4242;
    fwrite(&other, 2, 1, f);
    fclose(f);
    expect_init_error("manifest: a changed token", pattern, TB, TT, 0, 1, TV, path, "SHA-256", "the file was changed");
    write_shard("sealed/s1.bin", 1, 57);
    rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, TV, err, sizeof(err));
    check(rc == 0, "manifest: the restored shard opens again (%s)", rc == 0 ? "ok" : err);
    if (rc == 0) dataloader_free(&dl);

    // a shard grown by a token (valid shard on its own, but not the one listed)
    write_shard("sealed/s1.bin", 1, 58);
    expect_init_error("manifest: a resized shard", pattern, TB, TT, 0, 1, TV, path, "size 1140", "says 1138");
    write_shard("sealed/s1.bin", 1, 57);

    // a manifest sealed with another key, and one that is not a manifest
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(i + 1);
    write_manifest(dir, names, 2, key);
    char mpath[512];
    snprintf(mpath, sizeof(mpath), "%s/MANIFEST", dir);
    expect_init_error("manifest: sealed with a non-zero key", pattern, TB, TT, 0, 1, TV, mpath, "tag does not match", NULL);
    f = fopen(mpath, "wb");
    fputs("not a manifest\n", f);
    fclose(f);
    expect_init_error("manifest: malformed MANIFEST", pattern, TB, TT, 0, 1, TV, mpath, NULL, NULL);
    unlink(mpath);
    rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, TV, err, sizeof(err));
    check(rc == 0, "manifest: without MANIFEST the same shards open (%s)", rc == 0 ? "ok" : err);
    if (rc == 0) dataloader_free(&dl);

    // only a MANIFEST matches
    char only[512];
    write_manifest(dir, names, 0, NULL);
    snprintf(only, sizeof(only), "%s/MANI*", dir);
    expect_init_error("manifest: a glob that matches only MANIFEST", only, TB, TT, 0, 1, TV, "no files match", "other than MANIFEST", NULL);
}

// ----------------------------------------------------------------------------
// prepare_data end to end: the MANIFEST it writes, and the loader refusing
// shards changed after it

// run_program: the program args[0] with args (stdout and stderr into a new
// log); its exit status, or -1 if it took over 30 s (then killed)
static int run_program(char *const *args, const char *log) {
    unlink(log);
    return test_wait(test_spawn(args, NULL, log, NULL), 30.0, NULL);
}

static int file_contains(const char *path, const char *needle) {
    char *text = test_read_text(path);
    int found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

static void flip_byte(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    if (f == NULL) return;
    fseek(f, offset, SEEK_SET);
    int c = fgetc(f);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}

// opens: does the loader open pattern? err gets its message, or "ok"
static int opens(const char *pattern, int vocab, char *err, size_t errlen) {
    DataLoader dl;
    int rc = dataloader_init(&dl, pattern, TB, TT, 0, 1, 0, 0, vocab, err, errlen);
    if (rc == 0) {
        dataloader_free(&dl);
        snprintf(err, errlen, "ok");
    }
    return rc == 0;
}

static void test_prepare_data(void) {
    if (access("./prepare_data", X_OK) != 0) {
        skip("prepare_data: ./prepare_data not built here (make test runs it from the repo root)");
        return;
    }
    // 6000 bytes of text, byte-level tokens: val is bytes 0..999, then train
    // shards of 1500, 1500, 1500, 500 tokens
    char dir[400], input[512], log[512], err[1024];
    test_path(dir, sizeof(dir), tmpdir, "prepared");
    test_path(input, sizeof(input), tmpdir, "prepared_input.txt");
    test_path(log, sizeof(log), tmpdir, "prepare_data.log");
    char text[6001];
    for (int i = 0; i < 6000; i++) text[i] = (char)(i % 61 == 60 ? '\n' : 'a' + (i * 7 + i / 61) % 26);
    FILE *f = fopen(input, "wb");
    fwrite(text, 1, 6000, f);
    fclose(f);
    char *args[] = {"./prepare_data", "-i", input, "-o", dir, "-n", "tiny", "-v", "1000", "-s", "1500", "--bytes", NULL};
    int rc = run_program(args, log);
    if (!check(rc == 0, "prepare_data: exit status %d (log %s)", rc, log)) return;

    // the MANIFEST verifies and lists every file written, with its size
    Manifest m;
    rc = manifest_read(&m, dir, "MANIFEST", NULL, err, sizeof(err));
    if (!check(rc == 0, "prepare_data: MANIFEST verifies with the all-zero key (%s)", rc == 0 ? "ok" : err)) return;
    const char *names[] = {"tiny_tokenizer.bin", "tiny_train_000000.bin", "tiny_train_000001.bin",
                           "tiny_train_000002.bin", "tiny_train_000003.bin", "tiny_val_000000.bin"};
    const uint64_t sizes[] = {0, 1024 + 3000, 1024 + 3000, 1024 + 3000, 1024 + 1000, 1024 + 2000};
    int listed = m.n == 6;
    for (int i = 0; i < 6 && listed; i++) {
        listed = strcmp(m.e[i].name, names[i]) == 0 && (i == 0 || m.e[i].size == sizes[i]) &&
                 manifest_verify_file(&m, dir, names[i], err, sizeof(err)) == 0;
    }
    check(listed, "prepare_data: MANIFEST lists the tokenizer, 4 train and 1 val shards, sizes 1024 + 2 ntok, "
          "each matching its file (%d entries)", m.n);
    manifest_free(&m);
    char leftovers[512];
    snprintf(leftovers, sizeof(leftovers), "%s/.*.tmp*", dir);
    glob_t g;
    int none_left = glob(leftovers, 0, NULL, &g) == GLOB_NOMATCH;
    globfree(&g);
    snprintf(leftovers, sizeof(leftovers), "%s/*.tmp", dir);
    none_left = none_left && glob(leftovers, 0, NULL, &g) == GLOB_NOMATCH;
    globfree(&g);
    check(none_left, "prepare_data: no temporary files left in %s", dir);

    // the loader reads the sealed shards: train starts at byte 1000
    char train[512], val[512], shard[512];
    snprintf(train, sizeof(train), "%s/tiny_train_*.bin", dir);
    snprintf(val, sizeof(val), "%s/tiny_val_*.bin", dir);
    DataLoader dl;
    rc = dataloader_init(&dl, train, TB, TT, 0, 1, 0, 0, 256, err, sizeof(err));
    if (check(rc == 0, "prepare_data: the loader opens the 4 sealed train shards (%s)", rc == 0 ? "ok" : err)) {
        int in[TB * TT], tg[TB * TT], same = dl.nshards == 4 && dataloader_next(&dl, in, tg) == 0;
        for (int i = 0; i < TB * TT && same; i++) same = in[i] == (unsigned char)text[1000 + i] && tg[i] == (unsigned char)text[1001 + i];
        check(same, "prepare_data: first train batch is text bytes 1000..1008");
        dataloader_free(&dl);
    }
    check(opens(val, 256, err, sizeof(err)), "prepare_data: the loader opens the sealed val shard (%s)", err);

    // one byte changed, in a token and in the header: both reported as a
    // changed file. The token stays < 256, so only the manifest can tell.
    snprintf(shard, sizeof(shard), "%s/tiny_train_000001.bin", dir);
    flip_byte(shard, 2000);
    expect_init_error("prepare_data: a token byte flipped", train, TB, TT, 0, 1, 256, shard, "SHA-256", "the file was changed");
    flip_byte(shard, 2000);
    flip_byte(shard, 8);
    expect_init_error("prepare_data: a header byte flipped", train, TB, TT, 0, 1, 256, shard, "SHA-256", "the file was changed");
    flip_byte(shard, 8);
    check(opens(train, 256, err, sizeof(err)), "prepare_data: the restored shard opens again (%s)", err);

    // truncated by one token
    check(truncate(shard, 4022) == 0, "prepare_data: truncate %s", shard);
    expect_init_error("prepare_data: a truncated shard", train, TB, TT, 0, 1, 256, shard, "size 4022", "truncated");
    f = fopen(shard, "ab");
    fwrite(text + 1000 + 1500 + 1499, 1, 1, f);
    fputc(0, f);
    fclose(f);
    check(opens(train, 256, err, sizeof(err)), "prepare_data: the shard with its last token back opens (%s)", err);

    // a listed shard missing, and a stray one
    char moved[600];
    snprintf(moved, sizeof(moved), "%s.moved", shard);
    rename(shard, moved);
    expect_init_error("prepare_data: a listed shard missing", train, TB, TT, 0, 1, 256, shard, "listed in", "but missing");
    rename(moved, shard);
    char stray[512];
    snprintf(stray, sizeof(stray), "%s/tiny_train_000009.bin", dir);
    write_raw(stray, SHARD_MAGIC, SHARD_VERSION, 0, NULL, 0);
    expect_init_error("prepare_data: a stray shard", train, TB, TT, 0, 1, 256, stray, "not listed in the manifest", NULL);
    unlink(stray);

    // a second dataset in the same directory: both stay listed
    args[6] = "other";
    rc = run_program(args, log);
    rc = rc == 0 ? manifest_read(&m, dir, "MANIFEST", NULL, err, sizeof(err)) : -1;
    check(rc == 0 && m.n == 12, "prepare_data: -n other next to tiny: MANIFEST lists both (%d files)", rc == 0 ? m.n : -1);
    if (rc == 0) manifest_free(&m);
    snprintf(shard, sizeof(shard), "%s/other_train_*.bin", dir);
    check(opens(train, 256, err, sizeof(err)) && opens(shard, 256, err, sizeof(err)),
          "prepare_data: both datasets open (%s)", err);

    // a rerun with longer shards writes 2 train shards: the 2 stale ones are named, and refused
    args[6] = "tiny";
    args[10] = "2500";
    rc = run_program(args, log);
    snprintf(stray, sizeof(stray), "%s/tiny_train_000002.bin", dir);
    check(rc == 0 && file_contains(log, stray) && file_contains(log, "from an earlier run"),
          "prepare_data: rerun warns that %s is stale (exit %d)", stray, rc);
    expect_init_error("prepare_data: a stale shard", train, TB, TT, 0, 1, 256, stray, "not listed in the manifest", NULL);
    unlink(stray);
    snprintf(stray, sizeof(stray), "%s/tiny_train_000003.bin", dir);
    unlink(stray);
    check(opens(train, 256, err, sizeof(err)), "prepare_data: without the stale shards the rerun's open (%s)", err);

    // an earlier MANIFEST that does not verify stops the run before anything is written
    char mpath[512], third[512];
    snprintf(mpath, sizeof(mpath), "%s/MANIFEST", dir);
    flip_byte(mpath, 40);
    args[6] = "third";
    rc = run_program(args, log);
    snprintf(third, sizeof(third), "%s/third_val_000000.bin", dir);
    check(rc == 1 && file_contains(log, mpath) && file_contains(log, "tag does not match") && access(third, F_OK) != 0,
          "prepare_data: a changed MANIFEST in -o stops the run, exit %d, nothing written", rc);
    char *bad_name[] = {"./prepare_data", "-i", input, "-o", dir, "-n", "a b", "--bytes", NULL};
    rc = run_program(bad_name, log);
    check(rc == 2 && file_contains(log, "-n 'a b'"), "prepare_data: -n 'a b' (not a manifest name) is a flag error, exit %d", rc);
}

// ----------------------------------------------------------------------------
// encrypted shards: prepare_data --key-file, read with the key

// a key file of the trainer's kind, of a key made from fill
static void write_key_file(const char *path, uint8_t key[32], uint8_t fill) {
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)(fill + 37 * i);
    if (test_write_key_file(path, key) != 0) printf("      cannot write %s\n", path);
}

// the loss lines of a trainer's -lg log, without their times
static char *losses_of(const char *log_path) {
    size_t n;
    char *text = test_read_file(log_path, &n);
    if (text == NULL) return NULL;
    char *out = (char *)calloc(n + 1, 1), *w = out;
    for (char *line = text; *line != '\0';) {
        char *nl = strchr(line, '\n'), *ms = strstr(line, ", \"ms\"");
        size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
        size_t keep = ms != NULL && ms < line + len ? (size_t)(ms - line) : len;
        memcpy(w, line, keep);
        w += keep;
        *w++ = '\n';
        line += len + (nl != NULL);
    }
    free(text);
    return out;
}

// loads: the loader with this key opens pattern, or the error in err
static int loads(DataLoader *dl, const char *pattern, int B, int T, const uint8_t *key, char *err, size_t errlen) {
    return dataloader_init_key(dl, pattern, B, T, 0, 1, 0, 0, 256, key, err, errlen) == 0;
}

// a sealed shard of version 1 (made before sealed shards held their file
// name) is refused with a line that says so; its name written as version 2
// reads, and under another name is refused naming both
static void test_old_sealed_version(const uint8_t key[32]) {
    enum { NTOK = 100 };
    uint8_t plain[SHARD_HEADER_BYTES + 2 * NTOK];
    memset(plain, 0, sizeof(plain));
    int32_t h[3] = {SHARD_MAGIC, SHARD_VERSION, NTOK};
    memcpy(plain, h, sizeof(h));
    for (int i = 0; i < NTOK; i++) plain[SHARD_HEADER_BYTES + 2 * i] = (uint8_t)i;
    AeadFileKey fk;
    aead_file_key(&fk, key);
    char dir[400], path[512], err[1024];
    test_path(dir, sizeof(dir), tmpdir, "enc_versions");
    mkdir(dir, 0755);
    snprintf(path, sizeof(path), "%s/v_000000.bin", dir);
    const char *names[3] = {NULL, "v_000000.bin", "v_000001.bin"};
    const char *want[3] = {"header[1] (version) is 1, expected 2: a sealed shard made before", NULL,
                           "this sealed shard was made as v_000001.bin, not as v_000000.bin"};
    for (int k = 0; k < 3; k++) {
        if (names[k] != NULL) {  // version 2, the name from byte 16, its length in header[3]
            int32_t v2[4] = {SHARD_MAGIC, SHARD_VERSION_SEALED, NTOK, (int32_t)strlen(names[k])};
            memcpy(plain, v2, sizeof(v2));
            memcpy(plain + SHARD_NAME_OFFSET, names[k], strlen(names[k]));
        }
        unlink(path);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        int written = fd >= 0 && aead_file_write_all(fd, &fk, plain, sizeof(plain), AEAD_FILE_CHUNK_BYTES, NULL, path,
                                                      err, sizeof(err)) == 0;
        if (fd >= 0) close(fd);
        DataLoader dl;
        int rc = written && loads(&dl, path, 1, 8, key, err, sizeof(err));
        if (want[k] == NULL)
            check(rc, "encrypted shards: version 2 under the name it was made as reads (%s)", rc ? "ok" : err);
        else
            check(written && !rc && strstr(err, path) != NULL && strstr(err, want[k]) != NULL,
                  "encrypted shards: %s refused, naming the file: %s", k == 0 ? "version 1" : "another name", err);
        if (rc) dataloader_free(&dl);
    }
    aead_file_key_wipe(&fk);
}

static void test_encrypted_shards(void) {
    if (access("./prepare_data", X_OK) != 0) {
        skip("encrypted shards: ./prepare_data not built here (make test runs it from the repo root)");
        return;
    }
    // 2.5 MB of text, byte-level: a val shard of 20000 tokens and train
    // shards of 1.2M tokens (3 chunks of 1 MiB each) and the last of 80000
    char plain_dir[400], sealed_dir[400], input[512], log[512], key_path[512], other_path[512], err[1024];
    test_path(plain_dir, sizeof(plain_dir), tmpdir, "enc_plain");
    test_path(sealed_dir, sizeof(sealed_dir), tmpdir, "enc_sealed");
    test_path(input, sizeof(input), tmpdir, "enc_input.txt");
    test_path(log, sizeof(log), tmpdir, "enc.log");
    test_path(key_path, sizeof(key_path), tmpdir, "data.key");
    test_path(other_path, sizeof(other_path), tmpdir, "other.key");
    uint8_t key[32], other[32];
    write_key_file(key_path, key, 1);
    write_key_file(other_path, other, 2);
    const size_t text_bytes = 2500000;
    char *text = (char *)malloc(text_bytes);
    for (size_t i = 0; i < text_bytes; i++) text[i] = (char)(i % 61 == 60 ? '\n' : 'a' + (i * 7 + i / 61 + i / 4999) % 26);
    FILE *f = fopen(input, "wb");
    fwrite(text, 1, text_bytes, f);
    fclose(f);
    char *plain_args[] = {"./prepare_data", "-i", input, "-o", plain_dir, "-n", "d", "-v", "20000", "-s", "1200000",
                          "--bytes", NULL};
    char *sealed_args[] = {"./prepare_data", "-i", input, "-o", sealed_dir, "-n", "d", "-v", "20000", "-s", "1200000",
                           "--bytes", "--key-file", key_path, NULL};
    int rc = run_program(plain_args, log);
    if (rc == 0) rc = run_program(sealed_args, log);
    if (!check(rc == 0, "encrypted shards: prepare_data with and without --key-file (exit %d, log %s)", rc, log)) {
        free(text);
        return;
    }

    // a key file that is not there: a flag error naming it, before any shard is written
    char missing[512], missing_dir[512];
    test_path(missing, sizeof(missing), tmpdir, "no.key");
    test_path(missing_dir, sizeof(missing_dir), tmpdir, "enc_none");
    char *missing_args[] = {"./prepare_data", "-i", input, "-o", missing_dir, "--bytes", "--key-file", missing, NULL};
    rc = run_program(missing_args, log);
    char none_written[600];
    snprintf(none_written, sizeof(none_written), "%s/enc_input_train_000000.bin", missing_dir);
    check(rc == 2 && file_contains(log, missing) && access(none_written, F_OK) != 0,
          "encrypted shards: prepare_data --key-file of a missing file: exit %d, naming it, no shard written", rc);

    // sealed files, listed by the MANIFEST at their sealed sizes, holding no run of the text
    Manifest m;
    rc = manifest_read(&m, sealed_dir, "MANIFEST", NULL, err, sizeof(err));
    int sealed_ok = rc == 0 && m.n == 5;  // the tokenizer, 1 val and 3 train shards
    for (int i = 0; i < m.n && sealed_ok; i++) {
        if (strstr(m.e[i].name, "tokenizer") != NULL) continue;
        char path[700];
        snprintf(path, sizeof(path), "%s/%s", sealed_dir, m.e[i].name);
        size_t n;
        uint8_t *bytes = (uint8_t *)test_read_file(path, &n);
        uint64_t ntok = strstr(m.e[i].name, "val") ? 20000 : strstr(m.e[i].name, "000002") ? 80000 : 1200000;
        sealed_ok = bytes != NULL && aead_file_is_sealed(bytes, n) && n == m.e[i].size &&
                    n == aead_file_bytes(SHARD_HEADER_BYTES + 2 * ntok, AEAD_FILE_CHUNK_BYTES) &&
                    memmem(bytes, n, text + 30000, 32) == NULL && memmem(bytes, n, text + 1500000, 32) == NULL;
        free(bytes);
    }
    check(sealed_ok, "encrypted shards: each shard is a sealed file, of the size its MANIFEST entry says, without the "
          "text in it (%s)", rc == 0 ? "ok" : err);
    if (rc == 0) manifest_free(&m);

    // the same tokens, batch by batch, through a whole epoch (windows across chunk boundaries)
    char plain_train[512], sealed_train[512], shard[512];
    snprintf(plain_train, sizeof(plain_train), "%s/d_train_*.bin", plain_dir);
    snprintf(sealed_train, sizeof(sealed_train), "%s/d_train_*.bin", sealed_dir);
    snprintf(shard, sizeof(shard), "%s/d_train_000000.bin", sealed_dir);
    enum { EB = 8, ET = 1000 };
    DataLoader a, b;
    static int in_a[EB * ET], tg_a[EB * ET], in_b[EB * ET], tg_b[EB * ET];
    int opened = loads(&a, plain_train, EB, ET, NULL, err, sizeof(err));
    if (opened && !loads(&b, sealed_train, EB, ET, key, err, sizeof(err))) {
        dataloader_free(&a);
        opened = 0;
    }
    if (check(opened, "encrypted shards: the loader opens them with the key (%s)", opened ? "ok" : err)) {
        long batches = dataloader_batches_per_epoch(&a);
        int same = batches == dataloader_batches_per_epoch(&b) && batches > 300;
        uint64_t decrypted = b.chunks_decrypted, most = 0;
        for (long k = 0; k < batches && same; k++) {
            uint64_t before = b.chunks_decrypted;
            same = dataloader_next(&a, in_a, tg_a) == 0 && dataloader_next(&b, in_b, tg_b) == 0 &&
                   memcmp(in_a, in_b, sizeof(in_a)) == 0 && memcmp(tg_a, tg_b, sizeof(tg_a)) == 0;
            most = b.chunks_decrypted - before > most ? b.chunks_decrypted - before : most;
        }
        check(same, "encrypted shards: the same %ld batches as the plain shards (%s)", batches, b.err);
        // in order, a 16 KiB window inside the 1 MiB chunk held decrypts nothing new, and one that
        // runs past it only the next: each chunk of the 3 shards (3 + 3 + 1) once in the epoch
        decrypted = b.chunks_decrypted - decrypted;
        check(same && decrypted == 7 && most == 1, "encrypted shards: an epoch of %ld batches decrypts each of the 7 "
              "chunks once (%llu decrypted, at most %llu for one batch)", batches, (unsigned long long)decrypted,
              (unsigned long long)most);
        // a byte changed after the open, in a chunk the loader decrypts only
        // later (it holds chunk 0 of the shard): the batch that reaches that
        // chunk is refused, naming it
        dataloader_reset(&b);
        int held = dataloader_next(&b, in_b, tg_b) == 0 && b.chunk_shard == 0 && b.chunk_index == 0;
        flip_byte(shard, AEAD_FILE_HEADER_BYTES + 2 * (1 << 20) + 777);
        int failed = 0;
        for (long k = 1; k < batches && !failed; k++) failed = dataloader_next(&b, in_b, tg_b) != 0;
        check(held && failed && strstr(b.err, shard) != NULL && strstr(b.err, "chunk 2 ") != NULL,
              "encrypted shards: a byte changed after the open fails the batch that reads its chunk: %s", b.err);
        flip_byte(shard, AEAD_FILE_HEADER_BYTES + 2 * (1 << 20) + 777);
        // a byte changed in the chunk the loader holds: the windows served
        // from it are those of the chunk as checked, and the change fails
        // when the chunk is decrypted again, on the next pass over it
        dataloader_reset(&a);
        dataloader_reset(&b);
        held = dataloader_next(&a, in_a, tg_a) == 0 && dataloader_next(&b, in_b, tg_b) == 0 && b.chunk_shard == 0 &&
               b.chunk_index == 0;
        flip_byte(shard, AEAD_FILE_HEADER_BYTES + 300000);
        same = held;
        for (long k = 1; k < batches && same; k++)
            same = dataloader_next(&a, in_a, tg_a) == 0 && dataloader_next(&b, in_b, tg_b) == 0 &&
                   memcmp(in_a, in_b, sizeof(in_a)) == 0 && memcmp(tg_a, tg_b, sizeof(tg_a)) == 0;
        failed = same && dataloader_next(&b, in_b, tg_b) != 0;
        check(same && failed && strstr(b.err, shard) != NULL && strstr(b.err, "chunk 0 ") != NULL,
              "encrypted shards: a byte changed in the chunk held serves the checked copy for the pass, then fails "
              "when the chunk is decrypted again: %s", b.err);
        flip_byte(shard, AEAD_FILE_HEADER_BYTES + 300000);
        dataloader_free(&a);
        dataloader_free(&b);
    }

    // refused: without the key, with another key, with a byte flipped (chunk 1)
    rc = loads(&b, sealed_train, EB, ET, NULL, err, sizeof(err));
    check(!rc && strstr(err, shard) != NULL && strstr(err, "--key-file") != NULL,
          "encrypted shards: without the key, one line naming the file: %s", err);
    if (rc) dataloader_free(&b);
    rc = loads(&b, sealed_train, EB, ET, other, err, sizeof(err));
    check(!rc && strstr(err, shard) != NULL && strstr(err, "another key") != NULL,
          "encrypted shards: another key refused, naming the file: %s", err);
    if (rc) dataloader_free(&b);
    flip_byte(shard, AEAD_FILE_HEADER_BYTES + (1 << 20) + 5);
    rc = loads(&b, sealed_train, EB, ET, key, err, sizeof(err));
    check(!rc && strstr(err, shard) != NULL && strstr(err, "chunk 1 ") != NULL && strstr(err, "tag does not match"),
          "encrypted shards: a flipped byte refused at open, naming the file and the chunk: %s", err);
    if (rc) dataloader_free(&b);
    flip_byte(shard, AEAD_FILE_HEADER_BYTES + (1 << 20) + 5);
    test_old_sealed_version(key);

    // bit-identical losses from a short CPU run on each set (train and val)
    if (access("./train_gpt2", X_OK) != 0) {
        skip("encrypted shards: ./train_gpt2 not built here");
        free(text);
        return;
    }
    char plain_val[512], sealed_val[512], plain_log[512], sealed_log[512], run_log[512];
    snprintf(plain_val, sizeof(plain_val), "%s/d_val_*.bin", plain_dir);
    snprintf(sealed_val, sizeof(sealed_val), "%s/d_val_*.bin", sealed_dir);
    test_path(plain_log, sizeof(plain_log), tmpdir, "enc_plain.jsonl");
    test_path(sealed_log, sizeof(sealed_log), tmpdir, "enc_sealed.jsonl");
    test_path(run_log, sizeof(run_log), tmpdir, "enc_train.log");
    char *train_plain[] = {"./train_gpt2", "-e", "d2", "-ec", "32", "-ev", "256", "-et", "16", "-b", "2", "-t", "16",
                           "-x", "4", "-v", "2", "-m", "1", "-s", "0", "-th", "1", "-sd", "7", "-i", plain_train,
                           "-j", plain_val, "-lg", plain_log, NULL};
    char *train_sealed[] = {"./train_gpt2", "-e", "d2", "-ec", "32", "-ev", "256", "-et", "16", "-b", "2", "-t", "16",
                            "-x", "4", "-v", "2", "-m", "1", "-s", "0", "-th", "1", "-sd", "7", "-i", sealed_train,
                            "-j", sealed_val, "-lg", sealed_log, "--key-file", key_path, NULL};
    rc = run_program(train_plain, run_log);
    if (rc == 0) rc = run_program(train_sealed, run_log);
    char *want = rc == 0 ? losses_of(plain_log) : NULL, *got = rc == 0 ? losses_of(sealed_log) : NULL;
    check(want != NULL && got != NULL && strlen(want) > 100 && strcmp(want, got) == 0,
          "encrypted shards: a short CPU run gives the same losses, bit for bit, as on the plain shards (exit %d, log %s)",
          rc, run_log);
    free(want);
    free(got);
    // and without the key, the trainer says which file and exits as a usage error
    train_sealed[31] = NULL;
    rc = run_program(train_sealed, run_log);
    check(rc == 2 && file_contains(run_log, shard) && file_contains(run_log, "--key-file"),
          "encrypted shards: the trainer without --key-file: one line naming the shard, exit %d", rc);
    free(text);
}

// the loader never writes: bytes and mtime of every shard are unchanged after a run
static uint64_t file_hash(const char *path, struct stat *st) {
    uint64_t h = 1469598103934665603ULL; // FNV-1a
    FILE *f = fopen(path, "rb");
    if (f == NULL) return 0;
    int c;
    while ((c = fgetc(f)) != EOF) { h ^= (uint64_t)c; h *= 1099511628211ULL; }
    fclose(f);
    stat(path, st);
    return h;
}

static void test_read_only(void) {
    const char *names[] = {"a.bin", "b.bin", "c.bin", "e.bin"};
    uint64_t before[4];
    struct stat st_before[4], st_after;
    char path[512];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/main/%s", tmpdir, names[i]);
        chmod(path, 0444);
        before[i] = file_hash(path, &st_before[i]);
    }
    DataLoader dl;
    int rc = open_main(&dl, 0, 1, 1, 1);
    check(rc == 0, "read-only: opens shards of mode 0444");
    if (rc == 0) {
        SampleId ids[100];
        read_ids(&dl, ids, 100);
        dataloader_free(&dl);
    }
    int same = 1;
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), "%s/main/%s", tmpdir, names[i]);
        if (file_hash(path, &st_after) != before[i]) same = 0;
        if (st_after.st_mtime != st_before[i].st_mtime || st_after.st_size != st_before[i].st_size) same = 0;
    }
    check(same, "read-only: every shard's bytes, size and mtime are unchanged after 100 batches");
}

// real text: tinyshakespeare's bytes as tokens (vocab 256, as in the byte-level fallback)
static void test_real_text(void) {
    char src[512];
    if (!test_data_path("tinyshakespeare.txt", src, sizeof(src))) {
        skip("real text: %s not found", src);
        return;
    }
    size_t got;
    uint8_t *text = (uint8_t *)test_read_file(src, &got);
    if (!check(text != NULL, "real text: open %s", src)) return;
    uint16_t *toks = (uint16_t *)malloc(got * sizeof(uint16_t));
    for (size_t i = 0; i < got; i++) toks[i] = text[i];
    char dir[400], path[512], pattern[512], err[512];
    test_path(dir, sizeof(dir), tmpdir, "shakes");
    mkdir(dir, 0700);
    snprintf(path, sizeof(path), "%s/train_000.bin", dir);
    snprintf(pattern, sizeof(pattern), "%s/train_*.bin", dir);
    write_raw(path, SHARD_MAGIC, 1, (int32_t)got, toks, got);
    DataLoader dl;
    int rc = dataloader_init(&dl, pattern, 4, 64, 0, 1, 0, 0, 256, err, sizeof(err));
    if (check(rc == 0, "real text: open %zu byte-tokens with vocab 256 (%s)", got, rc == 0 ? "ok" : err)) {
        check(dataloader_batches_per_epoch(&dl) == (long)((got - 1) / 256), "real text: %ld batches of 4x64 = (n-1)/256",
              dataloader_batches_per_epoch(&dl));
        int in[256], tg[256];
        dataloader_next(&dl, in, tg);
        char first[15];
        for (int i = 0; i < 14; i++) first[i] = (char)in[i];
        first[14] = '\0';
        check(strcmp(first, "First Citizen:") == 0 && tg[12] == ':' && tg[13] == '\n', "real text: batch 0 reads \"%s\"", first);
        dataloader_next(&dl, in, tg);
        check(in[0] == text[256] && in[255] == text[511]
              && tg[255] == text[512], "real text: batch 1 is bytes [256, 512), targets to byte 512");
        dataloader_free(&dl);
        rc = dataloader_init(&dl, pattern, 4, 64, 0, 1, 0, 0, 100, err, sizeof(err));
        check(rc != 0 && strstr(err, "not < vocab_size 100") != NULL, "real text: vocab_size 100 refused: %s", err);
        if (rc == 0) dataloader_free(&dl);
    }
    free(text);
    free(toks);
}

// ----------------------------------------------------------------------------
// benchmark: open (validate) a 100M-token shard

static int bench(void) {
    const size_t ntok = 100u * 1000u * 1000u;
    char path[300];
    snprintf(path, sizeof(path), "%s/bench.bin", tmpdir);
    uint16_t *t = (uint16_t *)malloc(ntok * sizeof(uint16_t));
    if (t == NULL) { fprintf(stderr, "bench: out of memory\n"); return 1; }
    uint64_t s = 42;
    for (size_t i = 0; i < ntok; i++) t[i] = (uint16_t)(dl_splitmix64(&s) % 50257);
    int rc = write_raw(path, SHARD_MAGIC, 1, (int32_t)ntok, t, ntok);
    free(t);
    if (rc != 0) { fprintf(stderr, "bench: cannot write %s\n", path); return 1; }
    char err[512];
    double best = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        DataLoader dl;
        double t0 = test_now();
        rc = dataloader_init(&dl, path, 8, 1024, 0, 1, 0, 0, 50257, err, sizeof(err));
        double dt = test_now() - t0;
        if (rc != 0) { fprintf(stderr, "bench: %s\n", err); break; }
        if (dt < best) best = dt;
        printf("open 100M-token shard (200 MB, file in page cache): %.3f s\n", dt);
        if (rep == 4) {
            int *in = (int *)malloc(8 * 1024 * sizeof(int)), *tg = (int *)malloc(8 * 1024 * sizeof(int));
            double t1 = test_now();
            for (int i = 0; i < 1000; i++) dataloader_next(&dl, in, tg);
            printf("next(): %.1f us per B=8 T=1024 micro-batch\n", (test_now() - t1) * 1e3);
            free(in); free(tg);
        }
        dataloader_free(&dl);
    }
    // the check loop alone, on memory
    DataLoader dl;
    uint16_t *mem = (uint16_t *)malloc(ntok * sizeof(uint16_t));
    FILE *f = fopen(path, "rb");
    if (mem != NULL && f != NULL && fseek(f, SHARD_HEADER_BYTES, SEEK_SET) == 0 && fread(mem, 2, ntok, f) == ntok) {
        double t0 = test_now();
        int bad = shard_check_tokens(mem, ntok, 50257, path, err, sizeof(err));
        double dt = test_now() - t0;
        printf("token check loop alone: %.3f s (%.2f Gtok/s)%s\n", dt, (double)ntok / dt / 1e9, bad ? " (bad?)" : "");
    }
    if (f != NULL) fclose(f);
    free(mem);
    printf("best open: %.3f s = %.0f Mtok/s\n", best, (double)ntok / best / 1e6);
    // the same shard sealed by a MANIFEST: the open hashes all 200 MB too
    const char *names[] = {"bench.bin"};
    write_manifest(tmpdir, names, 1, NULL);
    double best_sealed = 1e9;
    for (int rep = 0; rep < 5 && rc == 0; rep++) {
        double t0 = test_now();
        rc = dataloader_init(&dl, path, 8, 1024, 0, 1, 0, 0, 50257, err, sizeof(err));
        double dt = test_now() - t0;
        if (rc != 0) { fprintf(stderr, "bench: %s\n", err); break; }
        if (dt < best_sealed) best_sealed = dt;
        dataloader_free(&dl);
    }
    printf("best open with a MANIFEST (SHA-256 %s): %.3f s = %.0f Mtok/s\n", sha256_impl_name(), best_sealed,
           (double)ntok / best_sealed / 1e6);
    unlink(path);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    if (test_make_dir(tmpdir, sizeof(tmpdir), "/tmp/llm3d_test_dataloader_XXXXXX") != 0) {
        fprintf(stderr, "test_dataloader: mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        int rc = bench();
        test_remove_dir(tmpdir);
        return rc;
    }
    char dir[512];
    test_path(dir, sizeof(dir), tmpdir, "main");
    mkdir(dir, 0700);
    test_path(dir, sizeof(dir), tmpdir, "long");
    mkdir(dir, 0700);
    write_shard("main/a.bin", 0, 100);
    write_shard("main/b.bin", 1, 57);
    write_shard("main/c.bin", 2, 9);
    write_shard("main/e.bin", 4, 17);
    test_path(main_glob, sizeof(main_glob), tmpdir, "main/*.bin");

    test_layout();
    test_shuffle();
    test_data_parallel();
    test_resume();
    test_resume_everywhere();
    test_shuffle_uniform();
    test_errors();
    test_read_only();
    test_manifest();
    test_prepare_data();
    test_encrypted_shards();
    test_real_text();

    test_remove_dir(tmpdir);
    return test_summary();
}
