/*
 * dataloader.h: token shards in, micro-batches out.
 *
 * defines:
 *   DataLoader            the shards of a glob, checked, and this rank's place
 *                         in their stream of micro-batches
 *   DataLoaderState       the position of the next group of dp_size
 *                         micro-batches, the same on every rank (what a
 *                         checkpoint saves)
 *   dataloader_init, dataloader_init_key
 *                         every shard of a glob opened and checked (the second
 *                         also takes the key of sealed shards)
 *   dataloader_next       this rank's next micro-batch: inputs and targets
 *   dataloader_reset      back to the first micro-batch of epoch 0
 *   dataloader_get_state, dataloader_set_state
 *                         the position, saved and continued from
 *   dataloader_batches_per_epoch
 *                         micro-batches per epoch per rank
 *   dataloader_warnings   the lines about shards skipped, to print once
 *   dataloader_free       everything closed and freed
 *   SHARD_MAGIC, SHARD_VERSION, SHARD_VERSION_SEALED, SHARD_HEADER_INTS,
 *   SHARD_HEADER_BYTES, SHARD_NAME_OFFSET, SHARD_NAME_MAX
 *                         the shard header's constants
 *   shard_parse_header, shard_check_tokens, shard_any_at_least
 *                         a shard's header and tokens checked in memory (also
 *                         the fuzz target's entry points)
 *   shard_parse_version, shard_check_name
 *                         a sealed shard's plaintext header, and the file name
 *                         in it against the one it is read under
 *   dl_below              a uniform draw in [0, n) from the shuffle PRNG
 *
 * A shard is llm.c's format: a header of 256 little-endian int32 ([0] magic
 * 20240520, [1] version 1, [2] ntok) and then ntok uint16 tokens; the file
 * is exactly 1024 + 2*ntok bytes. The plaintext of a sealed shard is version
 * 2: the same, with its file name in the header ([3] its length, its bytes
 * from byte 16). doc/formats.md ("Token shards") has the full description.
 *
 * The loader opens every file of a glob O_RDONLY and never writes. On open
 * it reads each file once, checking its header and every token (< vocab
 * size), so a bad byte is reported once, up front, with the file and the
 * offset, and never surfaces as a wrong embedding lookup mid-run.
 *
 * A shard changed while the job runs. Each micro-batch is read (pread) from
 * the file into a buffer of the loader, and what is used is that copy,
 * checked again: the file must be the one checked at open (same device and
 * inode: not replaced), of the size it had then (not truncated, not grown),
 * and every token of the batch must be < vocab size. A failure is one line
 * naming the file (dataloader_next returns -1 with dl->err set), never a
 * token past the embedding table, and never SIGBUS: nothing is mapped. A
 * change that keeps the size and writes valid tokens goes unseen: the check
 * at open is of the file at open, not a snapshot of it.
 *
 * The stream. Sample k of a shard is the window of B*T+1 tokens starting at
 * token k*B*T; a shard's final partial window is dropped, and a shard too
 * short for one window is skipped with a warning (dataloader_warnings: the
 * loader prints nothing, so that a job that opens its data more than once,
 * to check it before launch and again on each rank, warns once). An epoch
 * is every sample of every shard: shards in sorted order and samples in
 * order, or, with shuffle on, both permuted per epoch from the seed. Epochs
 * follow one another without a seam, and that endless sequence is the
 * global stream of micro-batches g = 0, 1, 2, ...
 *
 * Data parallelism. Rank r of R reads global micro-batches r, r+R, r+2R, ...
 * across epoch boundaries too, so R ranks together read exactly what one
 * rank reads, in the same order, for any R. The state (DataLoaderState) is
 * the position of the next group of R micro-batches, which is the same on
 * every rank: the checkpoint code saves one copy, and a run may even resume
 * with a different dp_size.
 *
 * Shuffle PRNG: splitmix64 (Steele, Lea, Flood 2014). Epoch 0's key is the
 * first splitmix64 output from the seed; each next epoch's key is the first
 * output from the previous key. An epoch's shard order is a Fisher-Yates
 * shuffle drawing from the stream that starts at the epoch key; the sample
 * order of the shard with sorted index i draws from the stream that starts
 * at key ^ mix(i + 1). Bounded draws use rejection, so there is no modulo
 * bias. Nothing depends on dp_rank or dp_size.
 *
 * Manifest. When a shard's directory holds a file MANIFEST (manifest.h's
 * format, sealed with the all-zero key as prepare_data writes it), init
 * fails, naming the file, when a shard the pattern matches there is not
 * listed, has another size (truncated, extended) or another SHA-256 (a
 * changed byte), and when a file listed there that the pattern's last
 * component matches is missing. The SHA-256 is taken in the same pass that
 * checks the tokens, before the header is believed. A file named MANIFEST is
 * never taken for a shard, so a glob of a whole directory works. Without a
 * MANIFEST the shards are only checked for their format.
 *
 * Encrypted shards. prepare_data --key-file writes each shard as aead.h's
 * sealed file (a header, the shard's bytes encrypted in place in chunks of
 * 1 MiB, a tag per chunk at the end); its MANIFEST lists the sealed bytes.
 * dataloader_init_key takes the key; a sealed shard is then checked at open
 * like a plain one, every chunk's tag included. While training, the loader
 * holds the last chunk it decrypted and serves the windows inside it from
 * there; a window that runs past it reads the next chunk, checks its tag
 * again and decrypts it, into the loader's buffer only: no plaintext is
 * written anywhere. So every chunk is checked each time it is decrypted:
 * read in order, once per pass over it rather than once per micro-batch;
 * shuffled (-sh 1), the windows land in chunks at random, and about one
 * chunk is decrypted per window, as without the cache. A sealed shard
 * without a key, or under another key, is one line naming the file; a
 * changed byte fails its chunk's tag, named with the file, at open or, when
 * changed later, when that chunk is next decrypted. Its plaintext header
 * holds the file name it was made under (shard_check_name), which must be
 * the name it is read under: a shard copied over another (val over train),
 * two swapped, or one renamed, is refused, MANIFEST rewritten or not, since
 * only the key's holder can make a shard with another name in it.
 *
 * Needs POSIX glob(3): include this header first, or build with gnu11 /
 * -D_DEFAULT_SOURCE. Assumes a little-endian host for the token array
 * (checked at init).
 */
#ifndef LLM3D_DATALOADER_H
#define LLM3D_DATALOADER_H

#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE
#endif

#include "llm3d/secure/aead.h"     // first: sealed (encrypted) shards; it brings secure.h's sha256
#include "llm3d/secure/manifest.h" // manifest_read, manifest_find

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"     // pread_all

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1          // a plain shard: llm.c's format
#define SHARD_VERSION_SEALED 2   // the plaintext of a sealed shard: its file name is in the header
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define SHARD_NAME_OFFSET 16     // version 2: header[3] is the name's length, its bytes start here
#define SHARD_NAME_MAX 255

// ----------------------------------------------------------------------------
// shard validation, on memory (also the fuzz target's entry points)

static int32_t shard_read_i32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
    return (int32_t)v;
}

// shard_parse_version: shard_parse_header for a shard of version `expect`:
// SHARD_VERSION for a plain shard, SHARD_VERSION_SEALED for the plaintext of
// a sealed one (whose file name shard_check_name then checks)
static int shard_parse_version(const uint8_t *buf, size_t len, const char *name, int expect, uint64_t *ntok, char *err,
                               size_t errlen) {
    *ntok = 0;
    if (len < SHARD_HEADER_BYTES)
        return errorf(err, errlen, "%s: file is %zu bytes, shorter than the %d-byte shard header",
                      name, len, SHARD_HEADER_BYTES);
    int32_t magic = shard_read_i32(buf);
    int32_t version = shard_read_i32(buf + 4);
    int32_t count = shard_read_i32(buf + 8);
    if (magic != SHARD_MAGIC)
        return errorf(err, errlen, "%s: header[0] (magic) is %d, expected %d", name, (int)magic, SHARD_MAGIC);
    if (expect == SHARD_VERSION_SEALED && version == SHARD_VERSION)
        return errorf(err, errlen, "%s: header[1] (version) is 1, expected 2: a sealed shard made before sealed shards "
                      "were bound to their file names; make it again with prepare_data --key-file", name);
    if (expect == SHARD_VERSION && version == SHARD_VERSION_SEALED)
        return errorf(err, errlen, "%s: header[1] (version) is 2, expected 1: version 2 is the plaintext of a sealed "
                      "shard, and this file is not sealed", name);
    if (version != expect)
        return errorf(err, errlen, "%s: header[1] (version) is %d, expected %d", name, (int)version, expect);
    if (count < 0)
        return errorf(err, errlen, "%s: header[2] (ntok) is %d, must be >= 0", name, (int)count);
    uint64_t want = (uint64_t)SHARD_HEADER_BYTES + 2 * (uint64_t)count;
    if ((uint64_t)len != want)
        return errorf(err, errlen, "%s: header[2] (ntok) is %d, which needs a file of %llu bytes, but the file is %zu bytes",
                      name, (int)count, (unsigned long long)want, len);
    *ntok = (uint64_t)count;
    return 0;
}

// shard_parse_header: checks a plain shard's header (magic, version, ntok
// against the file size len) and returns its token count in *ntok. buf holds
// the file's first min(len, 1024) bytes (the whole file will do). name is
// only used in the error message. 0 on success, -1 with err set.
static int shard_parse_header(const uint8_t *buf, size_t len, const char *name,
                              uint64_t *ntok, char *err, size_t errlen) {
    return shard_parse_version(buf, len, name, SHARD_VERSION, ntok, err, errlen);
}

// shard_check_name: the file name a sealed shard was made under (header[3]
// bytes from byte 16 of its plaintext header, which its first chunk's tag
// vouches for) must be the base name of path, where it is read now. So a
// shard copied over another (val over train), two shards swapped, or one
// renamed, is refused: without the key no one can make a shard with another
// name in it. 0, or -1 with err naming the file and both names.
static int shard_check_name(const uint8_t header[SHARD_HEADER_BYTES], const char *path, char *err, size_t errlen) {
    int32_t n = shard_read_i32(header + 12);
    const char *slash = strrchr(path, '/'), *base = slash != NULL ? slash + 1 : path;
    const char *bound = (const char *)header + SHARD_NAME_OFFSET;
    if (n < 1 || n > SHARD_NAME_MAX || !manifest_name_ok(bound, (size_t)n))
        return errorf(err, errlen, "%s: header[3] (the sealed shard's name length) is %d, or its name is not 1..%d of "
                      "[A-Za-z0-9._+-]", path, (int)n, SHARD_NAME_MAX);
    if (strlen(base) != (size_t)n || memcmp(base, bound, (size_t)n) != 0)
        return errorf(err, errlen, "%s: this sealed shard was made as %.*s, not as %s: a shard renamed, or copied over "
                      "another, is refused", path, (int)n, bound, base);
    return 0;
}

// shard_any_at_least: does any of t[0..n) reach limit (1..65535)? The loop
// is SWAR, because gcc -O2 does not vectorize a uint16 max: each 64-bit load
// holds 4 tokens, spread into 32-bit slots (even and odd lanes) so that
// token + (0x10000 - limit) sets bit 16 of its slot exactly when
// token >= limit, and the sum (< 2^17) never carries into the next slot.
// About 4 Gtok/s on one core, 3x the plain loop.
static int shard_any_at_least(const uint16_t *t, uint64_t n, uint16_t limit) {
    const uint64_t lanes = 0x0000FFFF0000FFFFULL;
    const uint64_t bias = (0x10000ULL - limit) * 0x0000000100000001ULL;
    const uint64_t bit16 = 0x0001000000010000ULL;
    uint64_t acc0 = 0, acc1 = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, t + i, 8);
        memcpy(&y, t + i + 4, 8);
        acc0 |= ((x & lanes) + bias) | (((x >> 16) & lanes) + bias);
        acc1 |= ((y & lanes) + bias) | (((y >> 16) & lanes) + bias);
    }
    uint64_t acc = acc0 | acc1;
    for (; i < n; i++) acc |= t[i] >= limit ? bit16 : 0;
    return (acc & bit16) != 0;
}

// shard_first_bad_token: the index of the first of t[0..n) that is not <
// vocab_size, or n when all are. Blocks that pass the fast test (all of them,
// for good data) are not looked at again; a block that fails is scanned.
static uint64_t shard_first_bad_token(const uint16_t *t, uint64_t n, int vocab_size) {
    if (vocab_size > 65535) return n; // every uint16 is a valid token
    const uint16_t limit = (uint16_t)vocab_size;
    const uint64_t block = 8192;
    for (uint64_t start = 0; start < n; start += block) {
        uint64_t m = n - start < block ? n - start : block;
        if (!shard_any_at_least(t + start, m, limit)) continue;
        for (uint64_t i = 0; i < m; i++)
            if (t[start + i] >= limit) return start + i;
    }
    return n;
}

// shard_bad_token: the error line for token `index` of a shard, of value v
static int shard_bad_token(const char *name, uint64_t index, unsigned v, int vocab_size, const char *why, char *err,
                           size_t errlen) {
    return errorf(err, errlen, "%s: token %llu (byte offset %llu) is %u, not < vocab_size %d%s", name,
                  (unsigned long long)index, (unsigned long long)(SHARD_HEADER_BYTES + 2 * index), v, vocab_size, why);
}

// shard_check_tokens: every token must be < vocab_size; the first that is
// not is named
static int shard_check_tokens(const uint16_t *tokens, uint64_t ntok, int vocab_size,
                              const char *name, char *err, size_t errlen) {
    uint64_t bad = shard_first_bad_token(tokens, ntok, vocab_size);
    if (bad == ntok) return 0;
    return shard_bad_token(name, bad, tokens[bad], vocab_size, "", err, errlen);
}

// ----------------------------------------------------------------------------
// shuffle PRNG: splitmix64

static uint64_t dl_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t dl_splitmix64(uint64_t *state) {
    *state += 0x9E3779B97F4A7C15ULL;
    return dl_mix64(*state);
}

// dl_below: uniform in [0, n), n >= 1; rejects the few draws that would bias it
static uint64_t dl_below(uint64_t *state, uint64_t n) {
    uint64_t threshold = (0 - n) % n; // 2^64 mod n
    for (;;) {
        uint64_t x = dl_splitmix64(state);
        if (x >= threshold) return x % n;
    }
}

static uint64_t dl_first_epoch_key(uint64_t seed) { return dl_splitmix64(&seed); }
static uint64_t dl_next_epoch_key(uint64_t key) { return dl_splitmix64(&key); }

// ----------------------------------------------------------------------------
// the loader

typedef struct {
    uint64_t epoch;        // completed passes over the data
    uint64_t shard_pos;    // index into the (possibly shuffled) shard order
    uint64_t sample_pos;   // index into the (possibly shuffled) sample order of the current shard
    uint64_t rng;          // shuffle RNG state: the key of this epoch's permutations
} DataLoaderState;

typedef struct {
    char *path;
    dev_t dev;              // the file that was checked, so that a reopen finds that one
    ino_t ino;
    uint64_t bytes;         // its size then
    uint64_t ntok;
    uint64_t nsamples;      // windows of B*T+1 tokens, stride B*T
    int sealed;             // an encrypted shard: file is its sealed-file header
    AeadFile file;
} DataShard;

typedef struct {
    int B, T;
    int dp_rank, dp_size;
    int shuffle;
    int vocab_size;
    uint64_t seed;
    DataShard *shards;          // usable shards (nsamples >= 1), sorted by path
    int nshards;
    uint64_t samples_per_epoch; // global micro-batches per epoch
    uint64_t total_tokens;      // tokens in the usable shards
    DataLoaderState state;      // next group of dp_size micro-batches (same on every rank)
    // shard order of an epoch, cached per epoch parity: a read runs at most
    // one epoch ahead of the state, so two slots never evict each other
    int *order[2];
    uint64_t order_epoch[2];
    int order_valid[2];
    // sample order of the shard being read (shuffle only)
    uint32_t *perm;
    uint64_t perm_cap;
    uint64_t perm_epoch;
    int perm_shard;
    int perm_valid;
    // reading: the open file of shard fd_shard (-1: none), the copy of one
    // window of B*T+1 tokens, and the line saying why a read failed
    int fd, fd_shard;
    uint16_t *window;
    AeadFileKey *cipher;        // the key of sealed shards, or NULL
    // the last sealed chunk decrypted (its tag checked then): chunk
    // chunk_index of shard chunk_shard (-1: none). A window is 16 to 64 KiB
    // and a chunk 1 MiB, so most windows come whole from the chunk held
    // here, and one that runs past it decrypts only the next
    uint8_t *chunk_buf;
    size_t chunk_buf_bytes;
    int chunk_shard;
    uint64_t chunk_index;
    uint64_t chunks_decrypted;  // chunks read, checked and decrypted for windows so far (the tests count them)
    char err[1024];
    char *warnings;             // lines about the shards skipped, or NULL
} DataLoader;

static void dl_fill_shard_order(const DataLoader *dl, uint64_t key, int *order) {
    for (int i = 0; i < dl->nshards; i++) order[i] = i;
    if (!dl->shuffle) return;
    uint64_t s = key;
    for (int i = dl->nshards - 1; i > 0; i--) {
        int j = (int)dl_below(&s, (uint64_t)i + 1);
        int tmp = order[i]; order[i] = order[j]; order[j] = tmp;
    }
}

// dl_shard_order: the shard order of the epoch that pos is in
static const int *dl_shard_order(DataLoader *dl, const DataLoaderState *pos) {
    int slot = (int)(pos->epoch & 1);
    if (!dl->order_valid[slot] || dl->order_epoch[slot] != pos->epoch) {
        dl_fill_shard_order(dl, pos->rng, dl->order[slot]);
        dl->order_epoch[slot] = pos->epoch;
        dl->order_valid[slot] = 1;
    }
    return dl->order[slot];
}

// dl_sample_index: the sample of shard `shard` at position sample_pos of its order in pos's epoch
static uint64_t dl_sample_index(DataLoader *dl, const DataLoaderState *pos, int shard) {
    if (!dl->shuffle) return pos->sample_pos;
    if (!dl->perm_valid || dl->perm_epoch != pos->epoch || dl->perm_shard != shard) {
        uint64_t n = dl->shards[shard].nsamples;
        for (uint64_t i = 0; i < n; i++) dl->perm[i] = (uint32_t)i;
        uint64_t s = pos->rng ^ dl_mix64((uint64_t)shard + 1);
        for (uint64_t i = n - 1; i > 0; i--) {
            uint64_t j = dl_below(&s, i + 1);
            uint32_t tmp = dl->perm[i]; dl->perm[i] = dl->perm[j]; dl->perm[j] = tmp;
        }
        dl->perm_epoch = pos->epoch;
        dl->perm_shard = shard;
        dl->perm_valid = 1;
    }
    return dl->perm[pos->sample_pos];
}

// dl_advance: moves pos n micro-batches along the global stream, into the next epochs as needed
static void dl_advance(DataLoader *dl, DataLoaderState *pos, uint64_t n) {
    for (;;) {
        const int *order = dl_shard_order(dl, pos);
        uint64_t left_in_shard = dl->shards[order[pos->shard_pos]].nsamples - pos->sample_pos;
        if (n < left_in_shard) { pos->sample_pos += n; return; }
        n -= left_in_shard;
        pos->sample_pos = 0;
        pos->shard_pos++;
        if (pos->shard_pos == (uint64_t)dl->nshards) {
            pos->shard_pos = 0;
            pos->epoch++;
            pos->rng = dl_next_epoch_key(pos->rng);
        }
    }
}

static void dl_free_shard(DataShard *s) {
    free(s->path);
    memset(s, 0, sizeof(*s));
}

// the manifest of one directory, read once for all the shards in it
typedef struct {
    char dir[4096];
    char path[4200];  // dir/MANIFEST, for the messages
    int loaded;       // dir is the directory of the last shard checked
    int present;      // dir holds a MANIFEST (then m is read)
    Manifest m;
} DataManifest;

static void dl_manifest_free(DataManifest *dm) {
    if (dm->present) manifest_free(&dm->m);
    memset(dm, 0, sizeof(*dm));
}

static const char *dl_base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

// dl_manifest_missing: a file the MANIFEST lists and the pattern's last
// component matches must exist, else a deleted shard would just be skipped
static int dl_manifest_missing(const DataManifest *dm, const char *pattern, char *err, size_t errlen) {
    const char *last = dl_base_name(pattern);
    for (int i = 0; i < dm->m.n; i++) {
        const char *name = dm->m.e[i].name;
        if (fnmatch(last, name, FNM_PERIOD) != 0) continue;
        char path[4400];
        snprintf(path, sizeof(path), "%s/%s", dm->dir, name);
        struct stat st;
        if (lstat(path, &st) == 0 || errno != ENOENT) continue;  // there: the glob matched it too
        return errorf(err, errlen, "%s: listed in %s but missing (pattern %s)", path, dm->path, pattern);
    }
    return 0;
}

// dl_manifest_entry: *listed gets path's entry in the MANIFEST of its
// directory, or NULL when that directory has none. A shard that is not listed
// is refused, and so is a listed one that is missing.
static int dl_manifest_entry(DataManifest *dm, const char *path, const char *pattern, const ManifestEntry **listed,
                             char *err, size_t errlen) {
    *listed = NULL;
    const char *base = dl_base_name(path);
    char dir[4096];
    size_t dir_len = (size_t)(base - path);
    if (dir_len == 0) {
        snprintf(dir, sizeof(dir), ".");
    } else {
        if (dir_len >= sizeof(dir))
            return errorf(err, errlen, "%s: directory name too long", path);
        memcpy(dir, path, dir_len - 1); // without the '/'
        dir[dir_len - 1] = '\0';
        if (dir_len == 1) snprintf(dir, sizeof(dir), "/");
    }
    if (!dm->loaded || strcmp(dm->dir, dir) != 0) {
        dl_manifest_free(dm);
        snprintf(dm->dir, sizeof(dm->dir), "%s", dir);
        snprintf(dm->path, sizeof(dm->path), "%s/MANIFEST", dir);
        dm->loaded = 1;
        struct stat st;
        if (lstat(dm->path, &st) != 0) return 0; // no manifest: nothing to check
        if (manifest_read(&dm->m, dir, "MANIFEST", NULL, err, errlen) != 0) {
            dm->loaded = 0;
            return -1;
        }
        dm->present = 1;
        if (dl_manifest_missing(dm, pattern, err, errlen) != 0) return -1;
    }
    if (!dm->present) return 0;
    *listed = manifest_find(&dm->m, base);
    if (*listed == NULL)
        return errorf(err, errlen, "%s: not listed in the manifest %s", path, dm->path);
    return 0;
}

// dl_scan_shard: reads the open file fd (path) of `bytes` bytes once, in
// pieces: the SHA-256 of it all into sha (unless NULL), and in *bad the index
// of the first token (bytes from 1024 on) that is not < vocab_size, UINT64_MAX
// when there is none. 0, or -1 with err set when the file cannot be read
// whole (it shrank while read).
static int dl_scan_shard(int fd, const char *path, uint64_t bytes, int vocab_size, uint8_t sha[32], uint64_t *bad,
                         uint16_t *bad_value, char *err, size_t errlen) {
    const size_t piece = 1 << 20;  // even, as is the header: tokens never straddle two pieces
    uint8_t *buf = (uint8_t *)malloc(piece);
    if (buf == NULL) return errorf(err, errlen, "%s: out of memory to read it", path);
    Sha256 h;
    sha256_init(&h);
    *bad = UINT64_MAX;
    int rc = 0;
    for (uint64_t off = 0; off < bytes && rc == 0;) {
        size_t want = bytes - off < piece ? (size_t)(bytes - off) : piece;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = errorf(err, errlen, "%s: read at byte %llu: %s", path, (unsigned long long)off,
                        got < 0 ? strerror(errno) : "the file is shorter than when it was opened");
            break;
        }
        if (sha != NULL) sha256_update(&h, buf, (size_t)got);
        uint64_t end = off + (uint64_t)got;
        if (*bad == UINT64_MAX && end > SHARD_HEADER_BYTES) {
            uint64_t from = off > SHARD_HEADER_BYTES ? off : SHARD_HEADER_BYTES;
            const uint16_t *t = (const uint16_t *)(buf + (from - off));
            uint64_t n = (end - from) / 2, i = shard_first_bad_token(t, n, vocab_size);
            if (i < n) {
                *bad = (from - SHARD_HEADER_BYTES) / 2 + i;
                *bad_value = t[i];
            }
        }
        off = end;
    }
    if (sha != NULL) sha256_final(&h, sha);
    free(buf);
    return rc;
}

// dl_scan_sealed: dl_scan_shard for a sealed shard: the file read once, in
// chunks: the SHA-256 of its bytes (header, ciphertext, tags) into sha
// (unless NULL), each chunk's tag checked, its plaintext's shard header
// into header and its first bad token into *bad as dl_scan_shard does
static int dl_scan_sealed(int fd, const char *path, const AeadFileKey *k, int vocab_size, AeadFile *f, uint8_t sha[32],
                          uint8_t header[SHARD_HEADER_BYTES], uint64_t *bad, uint16_t *bad_value, char *err,
                          size_t errlen) {
    if (aead_file_read_header(fd, f, k, path, err, errlen) != 0) return -1;
    size_t table_bytes = (size_t)f->chunks * AEAD_TAG_BYTES;
    uint8_t *buf = (uint8_t *)malloc((size_t)f->chunk_bytes), *tags = (uint8_t *)malloc(table_bytes);
    int rc = 0;
    if (buf == NULL || tags == NULL) rc = errorf(err, errlen, "%s: out of memory to read it", path);
    if (rc == 0 && pread_all(fd, tags, table_bytes, AEAD_FILE_HEADER_BYTES + f->plain_bytes) != 0)
        rc = errorf(err, errlen, "%s: read of the chunk tags: %s", path, strerror(errno));
    Sha256 h;
    sha256_init(&h);
    sha256_update(&h, f->header, AEAD_FILE_HEADER_BYTES);
    memset(header, 0, SHARD_HEADER_BYTES);
    *bad = UINT64_MAX;
    for (uint64_t i = 0; i < f->chunks && rc == 0; i++) {
        uint64_t start = i * f->chunk_bytes, len = aead_file_chunk_len(f, i);
        if (pread_all(fd, buf, (size_t)len, AEAD_FILE_HEADER_BYTES + start) != 0) {
            rc = errorf(err, errlen, "%s: read of chunk %llu: %s", path, (unsigned long long)i, strerror(errno));
            break;
        }
        if (sha != NULL) sha256_update(&h, buf, (size_t)len);
        if (aead_file_open_chunk(f, k, i, buf, tags + AEAD_TAG_BYTES * i, path, err, errlen) != 0) { rc = -1; break; }
        if (start < SHARD_HEADER_BYTES) {
            uint64_t n = SHARD_HEADER_BYTES - start < len ? SHARD_HEADER_BYTES - start : len;
            memcpy(header + start, buf, (size_t)n);
        }
        uint64_t end = start + len;  // chunk_bytes is even: tokens never straddle two chunks
        if (*bad == UINT64_MAX && end > SHARD_HEADER_BYTES) {
            uint64_t from = start > SHARD_HEADER_BYTES ? start : SHARD_HEADER_BYTES;
            const uint16_t *t = (const uint16_t *)(buf + (from - start));
            uint64_t n = (end - from) / 2, at = shard_first_bad_token(t, n, vocab_size);
            if (at < n) {
                *bad = (from - SHARD_HEADER_BYTES) / 2 + at;
                *bad_value = t[at];
            }
        }
    }
    if (rc == 0 && sha != NULL) {
        sha256_update(&h, tags, table_bytes);
        sha256_final(&h, sha);
    }
    if (buf != NULL) secure_wipe(buf, (size_t)f->chunk_bytes);  // plaintext goes nowhere but the loader's copies
    free(buf);
    free(tags);
    return rc;
}

// dl_check_shard: the checks of one shard, on the open file fd (path): a
// regular file, of the size its MANIFEST entry (listed, may be NULL) says,
// its SHA-256 then (so a changed byte is reported as a changed file, whatever
// header field or token it landed in), its header, and its tokens. Fills s
// but for the path.
static int dl_check_shard(DataShard *s, int fd, const char *path, int vocab_size, const AeadFileKey *cipher,
                          const ManifestEntry *listed, const char *manifest_path, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fd, &st) != 0) return errorf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return errorf(err, errlen, "%s: not a regular file", path);
    uint64_t bytes = (uint64_t)st.st_size;
    if (listed != NULL && bytes != listed->size)
        return errorf(err, errlen, "%s: size %llu, but the manifest %s says %llu: the file was truncated or extended",
                      path, (unsigned long long)bytes, manifest_path, (unsigned long long)listed->size);
    uint8_t header[SHARD_HEADER_BYTES];
    size_t have = bytes < SHARD_HEADER_BYTES ? (size_t)bytes : SHARD_HEADER_BYTES;
    ssize_t got = pread(fd, header, have, 0);
    if (got < 0 || (size_t)got != have)
        return errorf(err, errlen, "%s: cannot read header: %s", path, got < 0 ? strerror(errno) : "short read");
    // without a manifest (or too short to hash usefully) the header comes first: a bad one is found before a read of it all
    uint64_t ntok = 0, plain_bytes = bytes;
    uint8_t sha[32];
    uint64_t bad = UINT64_MAX;
    uint16_t bad_value = 0;
    s->sealed = aead_file_is_sealed(header, (size_t)got);
    if (s->sealed && cipher == NULL)
        return errorf(err, errlen, "%s: an encrypted shard (prepare_data --key-file): give its key with --key-file", path);
    int header_checked = s->sealed || listed == NULL || bytes < SHARD_HEADER_BYTES;
    if (s->sealed) {  // the plaintext's header comes out of the scan, checked below
        if (dl_scan_sealed(fd, path, cipher, vocab_size, &s->file, listed != NULL ? sha : NULL, header, &bad, &bad_value,
                           err, errlen) != 0)
            return -1;
        plain_bytes = s->file.plain_bytes;
    } else {
        if (header_checked && shard_parse_header(header, (size_t)bytes, path, &ntok, err, errlen) != 0) return -1;
        if (dl_scan_shard(fd, path, bytes, vocab_size, listed != NULL ? sha : NULL, &bad, &bad_value, err, errlen) != 0)
            return -1;
    }
    if (listed != NULL && memcmp(sha, listed->sha, 32) != 0) {
        char got_hex[65], want_hex[65];
        to_hex(sha, 32, got_hex);
        to_hex(listed->sha, 32, want_hex);
        return errorf(err, errlen, "%s: SHA-256 %.16s..., but the manifest %s says %.16s...: the file was changed",
                      path, got_hex, manifest_path, want_hex);
    }
    if (s->sealed && (shard_parse_version(header, (size_t)plain_bytes, path, SHARD_VERSION_SEALED, &ntok, err,
                                          errlen) != 0 || shard_check_name(header, path, err, errlen) != 0))
        return -1;
    if (!s->sealed && !header_checked && shard_parse_header(header, (size_t)plain_bytes, path, &ntok, err, errlen) != 0)
        return -1;
    if (bad != UINT64_MAX) return shard_bad_token(path, bad, bad_value, vocab_size, "", err, errlen);
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->bytes = bytes;
    s->ntok = ntok;
    return 0;
}

// dl_open_shard: checks one file (dl_check_shard) into s; the file is closed
// again, and reopened when a batch is read from it
static int dl_open_shard(DataShard *s, const char *path, int vocab_size, const AeadFileKey *cipher,
                         const ManifestEntry *listed, const char *manifest_path, char *err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block the open: it fails S_ISREG
    if (fd < 0) return errorf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    int rc = dl_check_shard(s, fd, path, vocab_size, cipher, listed, manifest_path, err, errlen);
    close(fd);
    if (rc == 0 && (s->path = strdup(path)) == NULL) rc = errorf(err, errlen, "%s: out of memory", path);
    if (rc != 0) dl_free_shard(s);
    return rc;
}

void dataloader_free(DataLoader *dl);
void dataloader_reset(DataLoader *dl);

static int dl_host_is_little_endian(void) {
    uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

// dl_check_args: dataloader_init's arguments, checked before any file is read
static int dl_check_args(const char *pattern, int B, int T, int dp_rank, int dp_size, int shuffle, int vocab_size,
                         char *err, size_t errlen) {
    if (B <= 0 || T <= 0) return errorf(err, errlen, "B (%d) and T (%d) must be > 0", B, T);
    if ((int64_t)B * T + 1 > INT32_MAX)
        return errorf(err, errlen, "B*T+1 = %lld tokens is too many for one micro-batch",
                      (long long)B * T + 1);
    if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
        return errorf(err, errlen, "dp_rank %d of dp_size %d is out of range", dp_rank, dp_size);
    if (shuffle != 0 && shuffle != 1) return errorf(err, errlen, "shuffle is %d, must be 0 or 1", shuffle);
    if (vocab_size < 1) return errorf(err, errlen, "vocab_size is %d, must be >= 1", vocab_size);
    if (!dl_host_is_little_endian())
        return errorf(err, errlen, "shards are little-endian and this host is not");
    if (pattern == NULL || pattern[0] == '\0') return errorf(err, errlen, "the shard pattern is empty");
    return 0;
}

// dl_warn: one more line for dl->warnings (dropped when out of memory)
__attribute__((format(printf, 2, 3)))
static __attribute__((format(printf, 2, 3))) void dl_warn(DataLoader *dl, const char *fmt, ...) {
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    size_t have = dl->warnings != NULL ? strlen(dl->warnings) : 0;
    char *grown = (char *)realloc(dl->warnings, have + strlen(line) + 2);
    if (grown == NULL) return;
    snprintf(grown + have, strlen(line) + 2, "%s\n", line);
    dl->warnings = grown;
}

// dl_open_shards: opens and checks every file that g matched (a MANIFEST
// aside) into dl->shards. A shard too short for one micro-batch is dropped:
// a warning when other shards are usable, and when none is, it is the
// error. On failure dl keeps what it opened, for dataloader_free.
static int dl_open_shards(DataLoader *dl, const glob_t *g, const char *pattern, char *err, size_t errlen) {
    int rc = -1;
    size_t nmatch = g->gl_pathc;
    uint64_t need = (uint64_t)dl->B * dl->T + 1;
    int nfiles = 0, nshort = 0, first_short = -1;
    DataManifest dm;
    memset(&dm, 0, sizeof(dm));
    // the short shards, by glob index, for the warnings or the error at the end
    uint64_t *short_ntok = (uint64_t *)calloc(nmatch, sizeof(uint64_t));
    char *is_short = (char *)calloc(nmatch, 1);
    dl->shards = (DataShard *)calloc(nmatch, sizeof(DataShard));
    if (dl->shards == NULL || short_ntok == NULL || is_short == NULL) {
        errorf(err, errlen, "out of memory for %zu shards of %s", nmatch, pattern);
        goto done;
    }
    for (size_t i = 0; i < nmatch; i++) {
        const char *path = g->gl_pathv[i];
        if (strcmp(dl_base_name(path), "MANIFEST") == 0) continue;
        nfiles++;
        DataShard *s = &dl->shards[dl->nshards];
        const ManifestEntry *listed;
        if (dl_manifest_entry(&dm, path, pattern, &listed, err, errlen) != 0 ||
            dl_open_shard(s, path, dl->vocab_size, dl->cipher, listed, dm.path, err, errlen) != 0)
            goto done;
        s->nsamples = s->ntok < need ? 0 : (s->ntok - 1) / ((uint64_t)dl->B * dl->T);
        if (s->nsamples == 0) {
            if (first_short < 0) first_short = (int)i;
            is_short[i] = 1;
            short_ntok[i] = s->ntok;
            nshort++;
            dl_free_shard(s);
            continue;
        }
        if (s->nsamples > UINT32_MAX) {
            errorf(err, errlen, "%s: %llu samples, more than a shard may hold (%u)",
                   s->path, (unsigned long long)s->nsamples, (unsigned)UINT32_MAX);
            dl_free_shard(s);
            goto done;
        }
        dl->samples_per_epoch += s->nsamples;
        dl->total_tokens += s->ntok;
        dl->nshards++;
    }
    if (nfiles == 0) {
        errorf(err, errlen, "no files match %s (other than MANIFEST)", pattern);
        goto done;
    }
    if (dl->nshards == 0) {
        const char *name = g->gl_pathv[first_short];
        unsigned long long have = (unsigned long long)short_ntok[first_short];
        if (nshort == 1)
            errorf(err, errlen, "%s: %llu tokens, fewer than one micro-batch needs (B*T+1 = %llu)",
                   name, have, (unsigned long long)need);
        else
            errorf(err, errlen, "none of the %d files matching %s has B*T+1 = %llu tokens (e.g. %s: %llu tokens)",
                   nshort, pattern, (unsigned long long)need, name, have);
        goto done;
    }
    for (size_t i = 0; i < nmatch; i++) {
        if (!is_short[i]) continue;
        dl_warn(dl, "dataloader: warning: %s: %llu tokens, fewer than B*T+1 = %llu; skipped", g->gl_pathv[i],
                (unsigned long long)short_ntok[i], (unsigned long long)need);
    }
    rc = 0;
done:
    dl_manifest_free(&dm);
    free(short_ntok);
    free(is_short);
    return rc;
}

// dl_alloc_orders: the shard order of two epochs and, with shuffle on, room
// for the sample order of the longest shard
static int dl_alloc_orders(DataLoader *dl, const char *pattern, char *err, size_t errlen) {
    dl->order[0] = (int *)malloc((size_t)dl->nshards * sizeof(int));
    dl->order[1] = (int *)malloc((size_t)dl->nshards * sizeof(int));
    if (dl->shuffle) {
        uint64_t max_samples = 0;
        for (int i = 0; i < dl->nshards; i++)
            if (dl->shards[i].nsamples > max_samples) max_samples = dl->shards[i].nsamples;
        dl->perm_cap = max_samples;
        dl->perm = (uint32_t *)malloc((size_t)max_samples * sizeof(uint32_t));
    }
    dl->window = (uint16_t *)malloc(((size_t)dl->B * dl->T + 1) * sizeof(uint16_t));
    uint64_t chunk_bytes = 0;  // the largest chunk of the sealed shards
    for (int i = 0; i < dl->nshards; i++)
        if (dl->shards[i].sealed && dl->shards[i].file.chunk_bytes > chunk_bytes) chunk_bytes = dl->shards[i].file.chunk_bytes;
    if (chunk_bytes > 0) dl->chunk_buf = (uint8_t *)malloc((size_t)chunk_bytes);
    if (dl->chunk_buf != NULL) dl->chunk_buf_bytes = (size_t)chunk_bytes;
    if (dl->order[0] == NULL || dl->order[1] == NULL || (dl->shuffle && dl->perm == NULL) || dl->window == NULL ||
        (chunk_bytes > 0 && dl->chunk_buf == NULL))
        return errorf(err, errlen, "out of memory for the shuffle tables of %s", pattern);
    return 0;
}

// dataloader_init_key: see the top of this file; key (32 bytes, or NULL) is
// the key of sealed shards. 0 on success; -1 with err set (and nothing left
// allocated) on failure.
int dataloader_init_key(DataLoader *dl, const char *pattern, int B, int T, int dp_rank, int dp_size, int shuffle,
                        uint64_t seed, int vocab_size, const uint8_t *key, char *err, size_t errlen) {
    memset(dl, 0, sizeof(*dl));
    dl->fd = -1;
    dl->fd_shard = -1;
    dl->chunk_shard = -1;
    if (dl_check_args(pattern, B, T, dp_rank, dp_size, shuffle, vocab_size, err, errlen) != 0) return -1;
    if (key != NULL) {
        dl->cipher = (AeadFileKey *)malloc(sizeof(AeadFileKey));
        if (dl->cipher == NULL) return errorf(err, errlen, "out of memory for the key");
        aead_file_key(dl->cipher, key);
    }
    dl->B = B; dl->T = T;
    dl->dp_rank = dp_rank; dl->dp_size = dp_size;
    dl->shuffle = shuffle;
    dl->seed = seed;
    dl->vocab_size = vocab_size;

    glob_t g;
    int grc = glob(pattern, 0, NULL, &g);
    if (grc != 0) {
        if (grc == GLOB_NOMATCH)
            errorf(err, errlen, "no files match %s", pattern);
        else
            errorf(err, errlen, "glob %s failed (%s)", pattern,
                   grc == GLOB_NOSPACE ? "out of memory" : "read error");
        globfree(&g);
        return -1;
    }
    int opened = dl_open_shards(dl, &g, pattern, err, errlen);
    globfree(&g);
    if (opened != 0) goto fail;
    if (dl->samples_per_epoch < (uint64_t)dp_size) {
        errorf(err, errlen, "%s holds %llu micro-batches of B*T+1 = %llu tokens per epoch, fewer than dp_size %d",
               pattern, (unsigned long long)dl->samples_per_epoch, (unsigned long long)B * T + 1, dp_size);
        goto fail;
    }
    if (dl_alloc_orders(dl, pattern, err, errlen) != 0) goto fail;
    dataloader_reset(dl);
    return 0;
fail:
    dataloader_free(dl);
    return -1;
}

// dataloader_init: dataloader_init_key without a key (plain shards only)
int dataloader_init(DataLoader *dl, const char *pattern, int B, int T, int dp_rank, int dp_size,
                    int shuffle, uint64_t seed, int vocab_size, char *err, size_t errlen) {
    return dataloader_init_key(dl, pattern, B, T, dp_rank, dp_size, shuffle, seed, vocab_size, NULL, err, errlen);
}

// dl_read_sealed: plaintext bytes [offset, offset + n) of sealed shard
// `shard`, open at dl->fd, into out, chunk by chunk through dl->chunk_buf.
// A chunk is read, its tag checked and decrypted only when it is not the
// one held there already; 0, or -1 with dl->err naming the chunk.
static int dl_read_sealed(DataLoader *dl, int shard, uint64_t offset, size_t n, uint8_t *out) {
    const DataShard *s = &dl->shards[shard];
    const AeadFile *f = &s->file;
    while (n > 0) {
        uint64_t i = offset / f->chunk_bytes, within = offset % f->chunk_bytes, len = aead_file_chunk_len(f, i);
        size_t take = len - within < n ? (size_t)(len - within) : n;
        if (dl->chunk_shard != shard || dl->chunk_index != i) {
            dl->chunk_shard = -1;  // until the new chunk's tag holds, the buffer holds no chunk
            if (aead_file_read_chunk(dl->fd, f, dl->cipher, i, dl->chunk_buf, s->path, dl->err, sizeof(dl->err)) != 0)
                return -1;
            dl->chunk_shard = shard;
            dl->chunk_index = i;
            dl->chunks_decrypted++;
        }
        memcpy(out, dl->chunk_buf + within, take);
        out += take; offset += take; n -= take;
    }
    return 0;
}

// dl_read_window: tokens [first, first + count) of shard `shard` into
// dl->window, from the file that was checked at open: reopened when another
// shard was read last, and its identity and size checked again. 0, or -1
// with dl->err set.
static int dl_read_window(DataLoader *dl, int shard, uint64_t first, size_t count) {
    const DataShard *s = &dl->shards[shard];
    const char *changed = "; the file changed after it was checked at start";
    if (dl->fd_shard != shard) {
        if (dl->fd >= 0) close(dl->fd);
        dl->fd_shard = -1;
        dl->fd = open(s->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
        if (dl->fd < 0) return errorf(dl->err, sizeof(dl->err), "%s: cannot open: %s%s", s->path, strerror(errno), changed);
        dl->fd_shard = shard;
    }
    struct stat st;
    if (fstat(dl->fd, &st) != 0) return errorf(dl->err, sizeof(dl->err), "%s: cannot stat: %s", s->path, strerror(errno));
    if (st.st_dev != s->dev || st.st_ino != s->ino)
        return errorf(dl->err, sizeof(dl->err), "%s: another file now has this name%s", s->path, changed);
    if ((uint64_t)st.st_size != s->bytes)
        return errorf(dl->err, sizeof(dl->err), "%s: %llu bytes now, %llu when checked%s", s->path,
                      (unsigned long long)st.st_size, (unsigned long long)s->bytes, changed);
    size_t want = count * sizeof(uint16_t), got = 0;
    uint64_t offset = SHARD_HEADER_BYTES + first * sizeof(uint16_t);
    if (s->sealed) {  // from the chunk held, or the next one checked and decrypted into the loader's buffer
        if (dl_read_sealed(dl, shard, offset, want, (uint8_t *)dl->window) != 0) return -1;
        got = want;
    }
    while (got < want) {
        ssize_t r = pread(dl->fd, (uint8_t *)dl->window + got, want - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return errorf(dl->err, sizeof(dl->err), "%s: read of %zu bytes at byte %llu: %s%s", s->path, want,
                          (unsigned long long)offset, r < 0 ? strerror(errno) : "the file is shorter", changed);
        got += (size_t)r;
    }
    uint64_t bad = shard_first_bad_token(dl->window, count, dl->vocab_size);
    if (bad < count) return shard_bad_token(s->path, first + bad, dl->window[bad], dl->vocab_size, changed, dl->err, sizeof(dl->err));
    return 0;
}

// dataloader_next: this rank's next micro-batch: inputs[B*T] and targets[B*T]
// (inputs shifted by one token), from a copy of its tokens checked again
// (the top of this file). 0 on success; -1 if dl holds no data, or when the
// shard changed since it was checked: then dl->err says how, the batch is
// not filled and the position does not move.
int dataloader_next(DataLoader *dl, int *inputs, int *targets) {
    if (dl->nshards == 0) return errorf(dl->err, sizeof(dl->err), "dataloader: no data");
    DataLoaderState pos = dl->state;
    dl_advance(dl, &pos, (uint64_t)dl->dp_rank);
    int shard = dl_shard_order(dl, &pos)[pos.shard_pos];
    uint64_t sample = dl_sample_index(dl, &pos, shard);
    size_t n = (size_t)dl->B * (size_t)dl->T;
    if (dl_read_window(dl, shard, sample * n, n + 1) != 0) return -1;
    const uint16_t *window = dl->window;
    for (size_t i = 0; i < n; i++) {
        inputs[i] = window[i];
        targets[i] = window[i + 1];
    }
    dl_advance(dl, &dl->state, (uint64_t)dl->dp_size);
    return 0;
}

// dataloader_reset: back to the first micro-batch of epoch 0
void dataloader_reset(DataLoader *dl) {
    dl->state.epoch = 0;
    dl->state.shard_pos = 0;
    dl->state.sample_pos = 0;
    dl->state.rng = dl_first_epoch_key(dl->seed);
}

void dataloader_get_state(const DataLoader *dl, DataLoaderState *s) {
    *s = dl->state;
}

// dataloader_set_state: continues from a saved state. The state is the same
// on every rank and does not depend on dp_size; its rng wins over the seed.
// It must fit the data: a shard_pos and sample_pos that exist.
int dataloader_set_state(DataLoader *dl, const DataLoaderState *s, char *err, size_t errlen) {
    if (dl->nshards == 0)
        return errorf(err, errlen, "dataloader: set_state on a loader that holds no data");
    if (s->shard_pos >= (uint64_t)dl->nshards)
        return errorf(err, errlen, "dataloader: state shard_pos is %llu, but there are %d shards",
                      (unsigned long long)s->shard_pos, dl->nshards);
    int shard = dl_shard_order(dl, s)[s->shard_pos];
    if (s->sample_pos >= dl->shards[shard].nsamples)
        return errorf(err, errlen, "dataloader: state sample_pos is %llu, but shard %s at shard_pos %llu has %llu samples",
                      (unsigned long long)s->sample_pos, dl->shards[shard].path,
                      (unsigned long long)s->shard_pos, (unsigned long long)dl->shards[shard].nsamples);
    dl->state = *s;
    return 0;
}

// dataloader_batches_per_epoch: micro-batches per epoch per rank, rounded
// down so every rank gets the same count (a lockstep loop may use it)
long dataloader_batches_per_epoch(const DataLoader *dl) {
    if (dl->dp_size < 1) return 0;
    return (long)(dl->samples_per_epoch / (uint64_t)dl->dp_size);
}

// dataloader_warnings: what the caller may print once per job (one line per
// shard skipped), or ""
const char *dataloader_warnings(const DataLoader *dl) { return dl->warnings != NULL ? dl->warnings : ""; }

// dataloader_free: closes and frees everything; safe on a zeroed or failed loader
void dataloader_free(DataLoader *dl) {
    if (dl->shards != NULL) {
        for (int i = 0; i < dl->nshards; i++) dl_free_shard(&dl->shards[i]);
        free(dl->shards);
    }
    if (dl->window != NULL && dl->fd >= 0) close(dl->fd);  // a zeroed loader's fd 0 is not ours: it has no window
    free(dl->order[0]);
    free(dl->order[1]);
    free(dl->perm);
    free(dl->window);
    free(dl->warnings);
    if (dl->cipher != NULL) aead_file_key_wipe(dl->cipher);
    free(dl->cipher);
    if (dl->chunk_buf != NULL) secure_wipe(dl->chunk_buf, dl->chunk_buf_bytes);
    free(dl->chunk_buf);
    memset(dl, 0, sizeof(*dl));
    dl->fd = -1;
    dl->fd_shard = -1;
    dl->chunk_shard = -1;
}

#endif
