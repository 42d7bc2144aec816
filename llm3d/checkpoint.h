/*
 * llm3d/checkpoint.h: what a training checkpoint is on disk, and how one is
 * found, sealed, verified and pruned. Both trainers use it; how a rank writes
 * its own part of the tensors stays in the trainer (gpt2_checkpoint in
 * both). The final model, <out>/model_SSSSSSSS.bin, is written the same
 * way (ckpt_write_model).
 *
 * defines:
 *   CkptState             everything state.bin holds: the step, Adam's t, the
 *                         shape and batch, the data position, the sampling RNG,
 *                         the tokens trained on so far
 *   OPTIM_MAGIC, CKPT_STATE_MAGIC, ckpt_files
 *                         optim.bin's and state.bin's magic; the three files
 *   setting up a run:
 *     ckpt_check_flags    the checkpoint flags against each other
 *     ckpt_setup          the flags checked, -o made and held open, its lock
 *                         taken, the key read or made, and the checkpoint to
 *                         resume from found and verified under the lock
 *     ckpt_dir_open       -o opened, checked to be this user's alone
 *     ckpt_key_at, ckpt_key
 *                         the checkpoint key: --key-file's, or <out>/job.key
 *     ckpt_lock_at, ckpt_lock_is
 *                         one job at a time per output directory (DIR/LOCK,
 *                         which names its holder's pid); a rank's check that
 *                         its launcher holds it
 *     ckpt_catch_signals, ckpt_stop_signal
 *                         SIGINT, SIGTERM, SIGHUP: finish the step, write a
 *                         checkpoint, exit 0 (SIGINT and SIGHUP ignored on
 *                         entry stay ignored)
 *   finding and reading:
 *     ckpt_find_at, ckpt_find
 *                         the checkpoint of a step, or the newest
 *     ckpt_note_not_dirs  the files and links under a checkpoint's name that
 *                         a resume passes over, said
 *     ckpt_verify         a checkpoint directory checked against its MANIFEST,
 *                         its state read
 *     ckpt_open_read, ckpt_read_file
 *                         a checkpoint file, sealed or plain: opened (and
 *                         which it is), or its whole plaintext read
 *     ckpt_model_load     a model file the user names (-e, export_hf -i),
 *                         sealed or plain
 *     ckpt_model_load_part
 *                         a checkpoint's model.bin on a resuming rank: of a
 *                         sealed one, only the chunks of its units decrypted
 *     ckpt_init_config, ckpt_init_load
 *                         -e's sealed model: its shape, then this rank's part
 *     OptimFile, ckpt_optim_open, ckpt_optim_close
 *                         optim.bin's m and v, mapped, or of a sealed one the
 *                         chunks this rank reads, decrypted
 *     ckpt_mark_chunks    the chunks of a sealed file that hold this rank's
 *                         part
 *     ckpt_file_bytes, ckpt_optim_header
 *                         each file's size, and optim.bin's header, for a shape
 *     ckpt_announce       the line a resumed run starts with
 *   writing (every rank of a job, each its part):
 *     CkptJob             how a trainer takes part: its sum over the ranks,
 *                         its part of the files, its timeout
 *     ckpt_write_job      a checkpoint: rank 0 begins, every rank writes its
 *                         part, rank 0 seals; then the older ones are pruned
 *     ckpt_write_model    the final model, the same way
 *     CkptOut, ckpt_out_open_at, ckpt_out_open, ckpt_out_pwrite, ckpt_out_close
 *                         one file open for a rank's writes at plaintext
 *                         offsets, encrypted at their places when sealed
 *     (llm3d/secure/ghash_shares.h: CkptShare and its functions, a sealed
 *                         file's GHASH shares: one writer's, masked for rank
 *                         0, and every writer's added up there)
 *     ckpt_seal_tags      a sealed file's tags from them
 *     ckpt_begin_at, ckpt_seal_at (ckpt_begin, ckpt_seal: by path, for tests)
 *                         rank 0's steps: the .partial directory made, then
 *                         sealed and given its final name
 *     ckpt_dir_name, ckpt_entry_name, ckpt_remove_dir
 *                         a checkpoint directory's path and name, and its
 *                         removal (the tests clean up with it)
 *
 * A checkpoint of step S (S optimizer steps done) is the directory
 * <out>/ckpt_SSSSSSSS (8 digits) holding:
 *   model.bin  the parameters as llm.c's v3 model file (fp32, gpt2.h), so
 *              llm.c and our own sampler read it as it is
 *   optim.bin  AdamW's state: a 1024-byte header, then float m[N], float v[N]
 *              in model.bin's element order (N = the model's parameters)
 *   state.bin  a 1024-byte header: the step, Adam's t, the data position, the
 *              sampling RNG, the shape and batch it was written with, the
 *              tokens trained on so far
 *   MANIFEST   manifest.h's manifest: size and SHA-256 of the three, sealed with
 *              the checkpoint key (HMAC-SHA256)
 * The files hold whole tensors, so they do not depend on the layout that
 * wrote them: any (dp, tp, pp, ZeRO) reads any checkpoint.
 *
 * Writing: the directory is built as ckpt_SSSSSSSS.partial; every rank
 * writes the elements it owns into model.bin and optim.bin at their places
 * (pwrite) and fsyncs; once all have, rank 0 hashes the files, writes the
 * MANIFEST atomically, renames the directory to its final name and fsyncs
 * <out>. A kill at any moment leaves either a .partial directory, which is
 * never read and is removed by the next write, or a complete checkpoint.
 * Only then are checkpoints beyond the newest K (-nk) deleted.
 *
 * Reading: a directory ckpt_SSSSSSSS whose MANIFEST does not verify (a
 * changed byte, a truncated file, a missing file, another key) is refused
 * with one line, never skipped silently: it means damage or tampering.
 *
 * The output directory must be this user's alone: one owned by another user,
 * or that group or others may write in, is refused (they could plant a link
 * named like a checkpoint, which pruning would follow into the directory it
 * points to, or a LOCK), and so is a link as -o. Each process of a job opens
 * -o once at its start (ckpt_setup) and holds that fd for the whole run:
 * everything in it is created, renamed, listed and removed relative to the
 * fd, never by the path again and never through a link. So -o swapped for
 * another directory (or a link to one) while the job runs, by someone who
 * can write its parent, changes nothing: the job goes on in the directory it
 * checked. A link named ckpt_SSSSSSSS is not a checkpoint, and pruning
 * removes the link itself.
 *
 * Encryption at rest (-enc 1; -enc 2 also the final model): the three files
 * are aead.h's sealed files instead, each chunk AES-256-GCM under a key
 * derived from the checkpoint key, so a copy of the volume without the key
 * tells nothing but the sizes. Each file's first bytes say which it is, so
 * any run reads either kind; the MANIFEST (over the sealed bytes) stays as it
 * is. A rank encrypts what it writes at its place and, in the same pass,
 * hashes it: its GHASH shares of the chunks' tags, which go to rank 0 masked,
 * over the job's communicator (never to disk, never in the clear: see
 * "GHASH shares" below); once all have, rank 0 adds them up into the tags,
 * refusing to seal unless every rank's shares came and cover every byte,
 * and reads each file once for the MANIFEST's SHA-256, as for a plain
 * checkpoint. A resuming rank decrypts only the chunks that hold its
 * part of model.bin and optim.bin (ckpt_mark_chunks), each checked against
 * its tag. doc/security.md has more.
 *
 * The checkpoint key: the job key of --key-file when given, else the file
 * <out>/job.key (64 hex digits, mode 0600), made on the first run that writes
 * into <out>. It is not the per-launch key that seals messages between ranks:
 * checkpoints outlive a launch, and a checkpoint copied from another job's
 * directory is refused unless --key-file names that job's key.
 *
 * optim.bin's and state.bin's headers are laid out in doc/formats.md ("optim.bin
 * header", "state.bin header"), the one place that lists their fields;
 * ckpt_optim_header and ckpt_state_header write them, ckpt_verify reads
 * state.bin's.
 */
#ifndef LLM3D_CHECKPOINT_H
#define LLM3D_CHECKPOINT_H

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/secure/aead.h"
#include "llm3d/errors.h"
#include "llm3d/files.h"
#include "llm3d/gpt2.h"
#include "llm3d/flags.h"  // Options
#include "llm3d/secure/manifest.h"  // sealing a checkpoint's files
#include "secure.h"    // keys

#define OPTIM_MAGIC 20241203
#define CKPT_STATE_MAGIC 20241204
#define CKPT_MAX_KEEP (1 << 20)

static const char *const ckpt_files[3] = {"model.bin", "optim.bin", "state.bin"};

// everything state.bin holds, in the order of its header
typedef struct {
    int step, adam_t;
    GPT2Config config;
    int B, T, batch_tokens, steps, seed, shuffle;
    uint64_t data[4];   // DataLoaderState: epoch, shard_pos, sample_pos, rng
    uint64_t sample_rng;
    int np, tp, pp, zero;
    // the tokens trained on in the steps done, every launch of the run
    // together: a resume under another total batch (-d, -mb, dp) goes on
    // counting from here (see ckpt_verify for a checkpoint written before
    // state.bin held it)
    uint64_t tokens;
    // not in state.bin: the checkpoint's id, the first 8 bytes (little-endian)
    // of the SHA-256 of its manifest's three file digests, so that two
    // checkpoints of one step from different runs have different ids
    uint64_t id;
} CkptState;

static void ckpt_put_u64(int32_t *h, uint64_t x) { h[0] = (int32_t)(uint32_t)x; h[1] = (int32_t)(uint32_t)(x >> 32); }
static uint64_t ckpt_get_u64(const int32_t *h) { return (uint64_t)(uint32_t)h[0] | (uint64_t)(uint32_t)h[1] << 32; }

static void ckpt_config_put(int32_t *h, const GPT2Config *c) {
    h[0] = c->maxT; h[1] = c->V; h[2] = c->Vp; h[3] = c->L; h[4] = c->NH; h[5] = c->C;
}

static void ckpt_config_get(const int32_t *h, GPT2Config *c) {
    c->maxT = h[0]; c->V = h[1]; c->Vp = h[2]; c->L = h[3]; c->NH = h[4]; c->C = h[5];
}

static void ckpt_state_header(const CkptState *s, int32_t h[HEADER_INTS]) {
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[0] = CKPT_STATE_MAGIC; h[1] = 1; h[2] = s->step; h[3] = s->adam_t;
    ckpt_config_put(h + 4, &s->config);
    h[10] = s->B; h[11] = s->T; h[12] = s->batch_tokens; h[13] = s->steps; h[14] = s->seed; h[15] = s->shuffle;
    for (int i = 0; i < 4; i++) ckpt_put_u64(h + 16 + 2 * i, s->data[i]);
    ckpt_put_u64(h + 24, s->sample_rng);
    h[26] = s->np; h[27] = s->tp; h[28] = s->pp; h[29] = s->zero;
    ckpt_put_u64(h + 30, s->tokens);
}

static void ckpt_optim_header(int32_t h[HEADER_INTS], const GPT2Config *c, int adam_t) {
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[0] = OPTIM_MAGIC; h[1] = 1; h[2] = adam_t;
    ckpt_config_put(h + 3, c);
}

// the byte size each file must have for config c
static uint64_t ckpt_file_bytes(int file, const GPT2Config *c) {
    uint64_t N = param_count(c), header = HEADER_INTS * 4;
    return file == 0 ? header + 4 * N : file == 1 ? header + 8 * N : header;
}

// path opened for reading, and in *sealed whether it is one of aead.h's
// sealed files (its first bytes say), so that a reader opens it once: the
// fd, or -1 with err naming the file. A checkpoint's own files are never
// read through a symbolic link (follow 0); a model file the user names
// (-e, export_hf -i) is, as fopen reads a plain one (follow 1).
static int ckpt_open_read(const char *path, int follow, int *sealed, char *err, size_t errlen) {
    uint8_t first[8];
    int fd = open(path, O_RDONLY | (follow ? 0 : O_NOFOLLOW) | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    *sealed = pread_all(fd, first, sizeof(first), 0) == 0 && aead_file_is_sealed(first, sizeof(first));
    return fd;
}

// the whole plaintext of the checkpoint file open at fd (path; sealed as
// ckpt_open_read said) in a malloc'd *out of *n bytes (at most max_bytes);
// -1 with err set
static int ckpt_read_fd(int fd, int sealed, const char *path, const uint8_t key[32], uint64_t max_bytes,
                        uint8_t **out, uint64_t *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    if (sealed) {
        AeadFileKey fk;
        aead_file_key(&fk, key);
        int rc = aead_file_read_fd(fd, &fk, out, n, path, err, errlen);
        aead_file_key_wipe(&fk);
        if (rc == 0 && *n > max_bytes) {
            free(*out);
            *out = NULL;
            return errorf(err, errlen, "%s: %llu bytes, over the %llu expected", path, (unsigned long long)*n,
                          (unsigned long long)max_bytes);
        }
        return rc;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max_bytes)
        return errorf(err, errlen, "%s: not a regular file of at most %llu bytes", path, (unsigned long long)max_bytes);
    *out = (uint8_t *)malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
    int rc = *out != NULL && pread_all(fd, *out, (size_t)st.st_size, 0) == 0 ? 0 : -1;
    if (rc != 0) {
        errorf(err, errlen, "%s: read: %s", path, *out == NULL ? "out of memory" : strerror(errno));
        free(*out);
        *out = NULL;
    }
    *n = (uint64_t)st.st_size;
    return rc;
}

// the whole plaintext of a checkpoint file, sealed or not (ckpt_read_fd)
static int ckpt_read_file(const char *path, const uint8_t key[32], uint64_t max_bytes, uint8_t **out, uint64_t *n,
                          char *err, size_t errlen) {
    int sealed = 0, fd = ckpt_open_read(path, 0, &sealed, err, errlen);
    if (fd < 0) {
        *out = NULL;
        *n = 0;
        return -1;
    }
    int rc = ckpt_read_fd(fd, sealed, path, key, max_bytes, out, n, err, errlen);
    close(fd);
    return rc;
}

// the plaintext size of a checkpoint file: its size, or a sealed file's
// header's plain_bytes once the file's size agrees with it
static int ckpt_plain_bytes(const char *path, const uint8_t key[32], uint64_t *n, char *err, size_t errlen) {
    int sealed = 0, fd = ckpt_open_read(path, 0, &sealed, err, errlen);
    if (fd < 0) return -1;
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : errorf(err, errlen, "%s: %s", path, strerror(errno));
    *n = rc == 0 ? (uint64_t)st.st_size : 0;
    if (rc == 0 && sealed) {
        AeadFileKey fk;
        AeadFile f;
        aead_file_key(&fk, key);
        rc = aead_file_read_header(fd, &f, &fk, path, err, errlen);
        aead_file_key_wipe(&fk);
        if (rc == 0) *n = f.plain_bytes;
    }
    close(fd);
    return rc;
}

// a checkpoint's optim.bin, for reading: m and v of every parameter in the
// model file's order (both trainers slice them with unit_fill). A plain
// file is mapped. Of a sealed one, only the chunks holding what this rank
// reads are decrypted (chunks_read of chunks), each at its place in an
// anonymous mapping of the file's size whose other pages stay zero and take
// no memory: a rank of a large job reads a small part of the file.
typedef struct { void *map; size_t bytes; const float *m, *v; uint64_t chunks, chunks_read; } OptimFile;

typedef struct { const AeadFile *f; const GPT2Config *c; const Shard *s; int arrays; uint64_t N; uint8_t *need; } ChunkMarks;

// the chunks of one part (gpt2.h's for_each_unit_part), in each array
static void ckpt_mark_part(const UnitPart *p, void *ctx) {
    const ChunkMarks *m = (const ChunkMarks *)ctx;
    for (uint64_t array = 0; array < (uint64_t)m->arrays; array++) {
        uint64_t first = array * m->N + p->base + local_to_global(m->c, m->s, p->t, p->a - p->t_off);
        uint64_t last = array * m->N + p->base + local_to_global(m->c, m->s, p->t, p->b - 1 - p->t_off);
        uint64_t from = HEADER_INTS * 4 + 4 * first, to = HEADER_INTS * 4 + 4 * last + 4;
        for (uint64_t i = from / m->f->chunk_bytes; i <= (to - 1) / m->f->chunk_bytes; i++) m->need[i] = 1;
    }
}

// marks in need[] the chunks of the sealed file f (model.bin: arrays 1,
// the parameters; optim.bin: 2, m then v) that hold what this rank's
// unit_fill calls use: for each of its units, elements [lo, hi) (sharded,
// ZeRO >= 1: its 1/dp; else all), and of each tensor's part in them the span
// in the full model, in each array. local_to_global grows with the element,
// so a part's first and last elements bound its span. The chunks of the
// header, which is checked, are marked too.
static void ckpt_mark_chunks(const AeadFile *f, int arrays, const GPT2Config *c, const Shard *s, const UnitTable *ut,
                             int sharded, uint8_t *need) {
    for (uint64_t i = 0; i <= (HEADER_INTS * 4 - 1) / f->chunk_bytes; i++) need[i] = 1;
    ChunkMarks m = {f, c, s, arrays, param_count(c), need};
    for_each_unit_part(c, s, ut, sharded, ckpt_mark_part, &m);
}

// the sealed optim.bin at fd into f->map: the chunks ckpt_mark_chunks
// names, each read, checked against its tag and decrypted at its place
static int ckpt_optim_decrypt(OptimFile *f, int fd, const char *path, const uint8_t key[32], const GPT2Config *c,
                              const Shard *s, const UnitTable *ut, int sharded, char *err, size_t errlen) {
    AeadFileKey fk;
    AeadFile af;
    aead_file_key(&fk, key);
    uint8_t *need = NULL;
    int rc = aead_file_read_header(fd, &af, &fk, path, err, errlen);
    if (rc == 0 && af.plain_bytes != f->bytes)
        rc = errorf(err, errlen, "%s: not the AdamW state of this model (%llu bytes sealed, the model's needs %zu)", path,
                    (unsigned long long)af.plain_bytes, f->bytes);
    if (rc == 0) {
        f->map = mmap(NULL, f->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        need = (uint8_t *)calloc((size_t)af.chunks, 1);
        if (f->map == MAP_FAILED) f->map = NULL;
        if (f->map == NULL || need == NULL)
            rc = errorf(err, errlen, "%s: out of memory for %zu bytes of AdamW state", path, f->bytes);
    }
    if (rc == 0) {
        ckpt_mark_chunks(&af, 2, c, s, ut, sharded, need);
        f->chunks = af.chunks;
        for (uint64_t i = 0; i < af.chunks && rc == 0; i++) {
            if (!need[i]) continue;
            rc = aead_file_read_chunk(fd, &af, &fk, i, (uint8_t *)f->map + i * af.chunk_bytes, path, err, errlen);
            if (rc == 0) f->chunks_read++;
        }
    }
    free(need);
    aead_file_key_wipe(&fk);
    return rc;
}

// the plain optim.bin at fd mapped into f->map, once its size is the model's
static int ckpt_optim_map(OptimFile *f, int fd, const char *path, char *err, size_t errlen) {
    struct stat st;
    memset(&st, 0, sizeof(st));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->bytes)
        return errorf(err, errlen, "%s: not the AdamW state of this model (%lld bytes, the model's needs %zu)", path,
                      (long long)st.st_size, f->bytes);
    f->map = mmap(NULL, f->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        return errorf(err, errlen, "%s: cannot map %zu bytes of AdamW state", path, f->bytes);
    }
    return 0;
}

// opens path, for the rank of shard s and unit table ut (sharded: ZeRO >=
// 1, each rank's m and v its 1/dp of each unit), once its size and header
// agree with the model and Adam's t (state.bin's); 0, or -1 with err set.
// ckpt_find verified the bytes; a sealed file's chunks are checked as read.
static int ckpt_optim_open(OptimFile *f, const char *path, const uint8_t key[32], const GPT2Config *c, const Shard *s,
                           const UnitTable *ut, int sharded, int adam_t, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    f->bytes = (size_t)ckpt_file_bytes(1, c);
    int32_t want[HEADER_INTS];
    ckpt_optim_header(want, c, adam_t);
    int sealed = 0, fd = ckpt_open_read(path, 0, &sealed, err, errlen);
    if (fd < 0) return -1;
    int rc = sealed ? ckpt_optim_decrypt(f, fd, path, key, c, s, ut, sharded, err, errlen)
                    : ckpt_optim_map(f, fd, path, err, errlen);
    close(fd);
    const int32_t *h = (const int32_t *)f->map;
    if (rc == 0 && memcmp(h, want, sizeof(want)) != 0)
        rc = errorf(err, errlen, "%s: not the AdamW state of this model at t = %d (magic %d, t %d)", path, adam_t, h[0],
                    h[2]);
    if (rc != 0) {
        if (f->map != NULL) munmap(f->map, f->bytes);
        f->map = NULL;
        return -1;
    }
    f->m = (const float *)((const char *)f->map + HEADER_INTS * 4);
    f->v = f->m + param_count(c);
    return 0;
}

static void ckpt_optim_close(OptimFile *f) {
    if (f->map != NULL) munmap(f->map, f->bytes);
    memset(f, 0, sizeof(*f));
}

static int ckpt_dir_name(char *out, size_t outlen, const char *out_dir, int step, const char *suffix) {
    int n = snprintf(out, outlen, "%s/ckpt_%08d%s", out_dir, step, suffix);
    return n > 0 && (size_t)n < outlen ? 0 : -1;
}

// the name of a checkpoint directory within -o: ckpt_SSSSSSSS and a suffix
static void ckpt_entry_name(char out[64], int step, const char *suffix) {
    snprintf(out, 64, "ckpt_%08d%s", step, suffix);
}

// the step of a directory entry named ckpt_ + 8 or more digits (%08d), else -1
static int ckpt_step_of(const char *name) {
    size_t len = strlen(name);
    if (strncmp(name, "ckpt_", 5) != 0 || len < 13 || len > 15) return -1;
    long step = 0;
    for (size_t i = 5; i < len; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step <= 2147483647L ? (int)step : -1;
}

static int ckpt_is_partial(const char *name) {
    size_t len = strlen(name);
    return strncmp(name, "ckpt_", 5) == 0 && len > 8 && strcmp(name + len - 8, ".partial") == 0;
}

// ckpt_dir_open: -o as a directory fd, once it is known to be this user's
// alone (see the top of this file); -1 with err set otherwise, or when it
// cannot be opened (errno then says why). -o itself must not be a link
// (trailing slashes or not): a trainer holds this fd for its whole run and
// does everything in -o relative to it, and a link would let whoever can
// write its parent choose the directory at the start as well.
static int ckpt_dir_open(const char *out_dir, char *err, size_t errlen) {
    char trimmed[4096];
    size_t n = strlen(out_dir);
    while (n > 1 && out_dir[n - 1] == '/') n--;
    if (n >= sizeof(trimmed)) return errorf(err, errlen, "flag -o: the directory's path is too long");
    memcpy(trimmed, out_dir, n);
    trimmed[n] = '\0';
    int fd = open(trimmed, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat lst;
    if (fd < 0 && (errno == ELOOP || errno == ENOTDIR) && lstat(trimmed, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        errno = ELOOP;
        return errorf(err, errlen, "flag -o: %s is a symbolic link: not followed, as the files in it are not; give the "
                      "directory it points to", out_dir);
    }
    if (fd < 0) return errorf(err, errlen, "flag -o: cannot open directory %s: %s", out_dir, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return errorf(err, errlen, "flag -o: cannot stat directory %s: %s", out_dir, strerror(e));
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        errno = EPERM;
        return errorf(err, errlen, "flag -o: %s is owned by uid %u, not by this user (uid %u): give a directory of "
                      "your own", out_dir, (unsigned)st.st_uid, (unsigned)geteuid());
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        close(fd);
        errno = EPERM;
        return errorf(err, errlen, "flag -o: %s has mode %04o: group or others may write in it and plant links "
                      "there; chmod go-w it, or give a directory of your own", out_dir, (unsigned)(st.st_mode & 07777));
    }
    return fd;
}

// whether the entry `name` of the directory dfd is a directory itself, not
// a link to one
static int ckpt_is_real_dir(int dfd, const char *name) {
    struct stat st;
    return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

static int ckpt_has_manifest_at(int dfd, int step) {
    char name[64];
    ckpt_entry_name(name, step, "/MANIFEST");
    struct stat st;
    return fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// the steps of the checkpoint directories in -o (dfd), newest first: real
// directories only, never a link; their count, or -1. *steps is malloc'd.
static int ckpt_list_at(int dfd, int **steps) {
    *steps = NULL;
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0) close(fd);
        return -1;
    }
    rewinddir(d);  // a dup shares dfd's position, which an earlier listing moved
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int s = ckpt_step_of(e->d_name);
        if (s < 0 || !ckpt_is_real_dir(dfd, e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int *grown = (int *)realloc(*steps, cap * sizeof(int));
            if (grown == NULL) { closedir(d); return -1; }
            *steps = grown;
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort, newest first: there are few
        for (int j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            int t = (*steps)[j]; (*steps)[j] = (*steps)[j - 1]; (*steps)[j - 1] = t;
        }
    return n;
}

// removes the entry `name` of -o (dfd): a checkpoint directory, complete or
// not, and the plain files in it, its MANIFEST first, so a delete cut short
// leaves no complete checkpoint. It is opened without following a link: a
// link (or a file) under that name is removed itself, never what it points
// to. 0 when it is gone (or was not there), else -1 with errno.
static int ckpt_remove_at(int dfd, const char *name) {
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0 && errno == ENOENT) return 0;
    if (sub < 0 && (errno == ELOOP || errno == ENOTDIR)) return unlinkat(dfd, name, 0);
    if (sub < 0) return -1;
    unlinkat(sub, "MANIFEST", 0);
    DIR *d = fdopendir(sub);
    if (d == NULL) {
        close(sub);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        unlinkat(sub, e->d_name, 0);  // unlinkat never follows a link: it removes the link
    }
    closedir(d);
    return unlinkat(dfd, name, AT_REMOVEDIR);
}

// the same for a directory given by its path (the tests clean up with it)
static int ckpt_remove_dir(const char *path) {
    char parent[4096];
    const char *slash = strrchr(path, '/');
    if (slash == NULL) snprintf(parent, sizeof(parent), ".");
    else snprintf(parent, sizeof(parent), "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    int rc = ckpt_remove_at(dfd, slash != NULL ? slash + 1 : path);
    int e = errno;
    close(dfd);
    errno = e;
    return rc;
}

// the checkpoint key (see the top of this file): --key-file's, else
// job.key in -o, open at dfd (out_dir: its name in messages), which is made
// there when create is set and there is none yet
static int ckpt_key_at(int dfd, const char *out_dir, const char *key_file, int create, uint8_t key[32], char *err,
                       size_t errlen) {
    if (key_file != NULL) return key_read_file(key_file, key, err, errlen);
    char path[4096];
    snprintf(path, sizeof(path), "%s/job.key", out_dir);
    struct stat st;
    int there = fstatat(dfd, "job.key", &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (there && S_ISLNK(st.st_mode))
        return errorf(err, errlen, "%s: a symbolic link: the checkpoint key must be a file of %s itself", path, out_dir);
    if (there || !create) {
        int fd = openat(dfd, "job.key", O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return errorf(err, errlen, "key file %s: %s", path, strerror(errno));
        return key_read_opened(fd, path, key, err, errlen);
    }
    int *steps, n = ckpt_list_at(dfd, &steps);
    free(steps);
    if (n > 0)  // a new key would silently disown every checkpoint here
        return errorf(err, errlen, "%s is missing, but %s holds %d checkpoint(s) sealed with it: put it back, or "
                      "pass the key with --key-file", path, out_dir, n);
    if (key_generate(key, err, errlen) != 0) return -1;
    // the ranks of an outside launch may all get here at once: the first key
    // in place is every rank's. Each writes its own whole under a name of its
    // own (O_EXCL, never through a link) and links it into place (linkat never
    // replaces a file), so no rank reads a key half written, nor keeps one
    // that lost the race. The name is 16 random hex digits, not the pid: the
    // ranks of several nodes that share -o may have the same pid, and one
    // would then take, or remove, the other's file
    char tmp[64], hex[17];
    uint8_t rnd[8];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return errorf(err, errlen, "key file %s: getrandom for a temporary name: %s", path, strerror(errno));
    to_hex(rnd, sizeof(rnd), hex);
    snprintf(tmp, sizeof(tmp), "job.key.%s.tmp", hex);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errorf(err, errlen, "key file %s/%s: create: %s", out_dir, tmp, strerror(errno));
    int e = key_write_opened(fd, key);
    if (e == 0) e = linkat(dfd, tmp, dfd, "job.key", 0) == 0 ? 0 : errno;
    unlinkat(dfd, tmp, 0);
    if (e == EEXIST) {  // another rank's key came first: take it
        fd = openat(dfd, "job.key", O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return errorf(err, errlen, "key file %s: %s", path, strerror(errno));
        return key_read_opened(fd, path, key, err, errlen);
    }
    if (e != 0) return errorf(err, errlen, "key file %s: write: %s", path, strerror(e));
    return 0;
}

// the same, read only, with -o given by its path (-e's sealed model)
static int ckpt_key(const char *out_dir, const char *key_file, uint8_t key[32], char *err, size_t errlen) {
    if (key_file != NULL) return key_read_file(key_file, key, err, errlen);
    int dfd = ckpt_dir_open(out_dir, err, errlen);
    if (dfd < 0) return -1;
    int rc = ckpt_key_at(dfd, out_dir, NULL, 0, key, err, errlen);
    close(dfd);
    return rc;
}

// checks that the checkpoint directory dir verifies under key and reads its
// state; one line in err naming the file and what is wrong otherwise. With
// hash_files 0 the files are checked against the manifest's sizes only: for
// ranks whose launcher has just hashed them.
static int ckpt_verify(const char *dir, const uint8_t key[32], int hash_files, CkptState *s, char *err, size_t errlen) {
    Manifest m;
    char why[1024];
    if (manifest_read(&m, dir, "MANIFEST", key, why, sizeof(why)) != 0)
        return errorf(err, errlen, "checkpoint %s: %s (written with another key? pass it with --key-file)", dir, why);
    int rc = 0;
    uint64_t id = 0;
    Sha256 digests;
    sha256_init(&digests);
    for (int i = 0; i < 3 && rc == 0; i++) {
        const ManifestEntry *listed = manifest_find(&m, ckpt_files[i]);
        if (listed != NULL) sha256_update(&digests, listed->sha, sizeof(listed->sha));
        if (hash_files) {
            rc = manifest_verify_file(&m, dir, ckpt_files[i], why, sizeof(why));
            if (rc != 0) errorf(err, errlen, "checkpoint %s: %s", dir, why);
            continue;
        }
        const ManifestEntry *e = manifest_find(&m, ckpt_files[i]);
        struct stat st;
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, ckpt_files[i]);
        if (e == NULL || stat(path, &st) != 0 || (uint64_t)st.st_size != e->size)
            rc = errorf(err, errlen, "checkpoint %s: %s is missing or not the manifest's size", dir, ckpt_files[i]);
    }
    manifest_free(&m);
    if (rc != 0) return -1;
    uint8_t digest[32];
    sha256_final(&digests, digest);
    for (int i = 7; i >= 0; i--) id = id << 8 | digest[i];
    char path[4096];
    snprintf(path, sizeof(path), "%s/state.bin", dir);
    int32_t h[HEADER_INTS];
    uint8_t *bytes;
    uint64_t n;
    if (ckpt_read_file(path, key, sizeof(h), &bytes, &n, why, sizeof(why)) != 0)
        return errorf(err, errlen, "checkpoint %s: %s", dir, why);
    int got = n == sizeof(h);
    if (got) memcpy(h, bytes, sizeof(h));
    free(bytes);
    if (!got || h[0] != CKPT_STATE_MAGIC || h[1] != 1)
        return errorf(err, errlen, "%s: not a version 1 checkpoint state (magic %d, version %d)", path, got ? h[0] : 0,
                      got ? h[1] : 0);
    memset(s, 0, sizeof(*s));
    s->step = h[2]; s->adam_t = h[3];
    ckpt_config_get(h + 4, &s->config);
    s->B = h[10]; s->T = h[11]; s->batch_tokens = h[12]; s->steps = h[13]; s->seed = h[14]; s->shuffle = h[15];
    for (int i = 0; i < 4; i++) s->data[i] = ckpt_get_u64(h + 16 + 2 * i);
    s->sample_rng = ckpt_get_u64(h + 24);
    s->np = h[26]; s->tp = h[27]; s->pp = h[28]; s->zero = h[29];
    // the tokens so far; 0 in a state.bin written before it held them (the
    // slots were spare, and zero): then the checkpoint's steps at its own
    // batch, which is exact unless an earlier launch of that run trained
    // under another batch. A checkpoint of step 0 has 0 either way.
    s->tokens = ckpt_get_u64(h + 30);
    if (s->tokens == 0 && s->step > 0 && s->batch_tokens > 0) s->tokens = (uint64_t)s->batch_tokens * (uint64_t)s->step;
    s->id = id;
    if (check_config(&s->config, path, why, sizeof(why)) != 0) return errorf(err, errlen, "%s", why);
    for (int i = 0; i < 2; i++) {  // the manifest vouches for the bytes; the shape must also agree
        uint64_t bytes_now = 0;
        snprintf(path, sizeof(path), "%s/%s", dir, ckpt_files[i]);
        if (ckpt_plain_bytes(path, key, &bytes_now, why, sizeof(why)) != 0) return errorf(err, errlen, "%s", why);
        if (bytes_now != ckpt_file_bytes(i, &s->config))
            return errorf(err, errlen, "%s: %llu bytes, but state.bin's shape needs %llu", path,
                          (unsigned long long)bytes_now, (unsigned long long)ckpt_file_bytes(i, &s->config));
    }
    return 0;
}

// the model header at h (HEADER_INTS, as in the file) read into c and
// *version by gpt2.h's model_read_header; 0, or -1 with err naming path
static int ckpt_parse_model_header(const void *h, const char *path, GPT2Config *c, int *version, char *err,
                                   size_t errlen) {
    FILE *mem = fmemopen((void *)h, HEADER_INTS * 4, "rb");
    int rc = mem != NULL ? model_read_header(mem, path, c, version, err, errlen)
                         : errorf(err, errlen, "%s: fmemopen: %s", path, strerror(errno));
    if (mem != NULL) fclose(mem);
    return rc;
}

// the header at h of a sealed model of plain_bytes decrypted bytes, into c:
// 0, or -1 with err naming path when it is not a v3 fp32 model of that size
static int ckpt_sealed_model_header(const void *h, uint64_t plain_bytes, const char *path, GPT2Config *c, char *err,
                                    size_t errlen) {
    int version = 0;
    if (plain_bytes < HEADER_INTS * 4)
        return errorf(err, errlen, "%s: %llu bytes decrypted: shorter than a model header", path,
                      (unsigned long long)plain_bytes);
    if (ckpt_parse_model_header(h, path, c, &version, err, errlen) != 0) return -1;
    if (version != 3 || plain_bytes != ckpt_file_bytes(0, c))
        return errorf(err, errlen, "%s: %llu bytes decrypted, version %d: the header's shape needs an fp32 file of %llu",
                      path, (unsigned long long)plain_bytes, version, (unsigned long long)ckpt_file_bytes(0, c));
    return 0;
}

// the parameters of the sealed model file open at fd (path, for messages;
// ckpt_open_read said it is sealed), decrypted whole, as model_load gives
// them (a malloc'd fp32 array; c filled from the header), or NULL with err set
static float *ckpt_sealed_model_read(int fd, const char *path, const uint8_t key[32], GPT2Config *c, char *err,
                                     size_t errlen) {
    uint8_t *bytes;
    uint64_t n;
    if (ckpt_read_fd(fd, 1, path, key, (uint64_t)1 << 40, &bytes, &n, err, errlen) != 0) return NULL;
    if (ckpt_sealed_model_header(bytes, n, path, c, err, errlen) != 0) {
        free(bytes);
        return NULL;
    }
    memmove(bytes, bytes + HEADER_INTS * 4, (size_t)(n - HEADER_INTS * 4));
    float *params = (float *)realloc(bytes, (size_t)(n - HEADER_INTS * 4));
    return params != NULL ? params : (float *)bytes;
}

// the parameters of the model file at path (a link followed, as export_hf
// -i reads it), as model_load gives them, and c its shape: a plain model
// file, or one the trainer sealed, read under the checkpoint key that
// key_file names (the trainer's --key-file). One open tells which and, for
// a sealed file, reads it; the key is read only then, and *sealed (where
// not NULL) says which it was. NULL with err set, and *no_key set when the
// file is sealed but key_file gives no key (none named, or it cannot be
// read), which the caller reports as a flag error.
static float *ckpt_model_load(const char *path, const char *key_file, GPT2Config *c, int *no_key, int *was_sealed,
                              char *err, size_t errlen) {
    *no_key = 0;
    int sealed = 0, fd = ckpt_open_read(path, 1, &sealed, NULL, 0);
    if (was_sealed != NULL) *was_sealed = sealed;
    if (!sealed) {  // plain, or not there: model_load reads it or says why
        if (fd >= 0) close(fd);
        return model_load(path, c, err, errlen);
    }
    float *params = NULL;
    uint8_t key[32];
    *no_key = 1;
    if (key_file == NULL) {
        errorf(err, errlen, "%s: sealed by the trainer's -enc: give the key of the job that wrote it with --key-file "
               "(the run's --key-file, or the job.key in its -o directory)", path);
    } else if (key_read_file(key_file, key, err, errlen) == 0) {
        *no_key = 0;
        params = ckpt_sealed_model_read(fd, path, key, c, err, errlen);
        secure_wipe(key, sizeof(key));
    }
    close(fd);
    return params;
}

// whether the model header at h (HEADER_INTS) is version 3 of shape c,
// which shape_of gave; 0, or -1 with err naming path and what differs
static int ckpt_model_header_is(const int32_t *h, const GPT2Config *c, const char *shape_of, const char *path,
                                char *err, size_t errlen) {
    GPT2Config got;
    int version = 0;
    int rc = ckpt_parse_model_header(h, path, &got, &version, err, errlen);
    if (rc == 0 && (version != 3 || got.L != c->L || got.C != c->C || got.NH != c->NH || got.V != c->V ||
                    got.Vp != c->Vp || got.maxT != c->maxT))
        rc = errorf(err, errlen, "%s: header version %d, L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, but %s says version 3, "
                    "L=%d C=%d NH=%d V=%d Vp=%d maxT=%d", path, version, got.L, got.C, got.NH, got.V, got.Vp, got.maxT,
                    shape_of, c->L, c->C, c->NH, c->V, c->Vp, c->maxT);
    return rc;
}

// of the sealed model file at fd, the chunks holding what the rank of shard
// s and units ut reads (ckpt_mark_chunks, whole units), each checked and
// decrypted, into a calloc'd array of the parameters of shape c (which
// shape_of gave, for the messages); NULL with err set. The other elements
// stay zero, and their pages, never touched, take no memory. With want_id,
// the file's id must be *want_id: the file checked earlier, not another
// sealed under the same key.
static float *ckpt_model_decrypt_part(int fd, const char *path, const uint8_t key[32], const GPT2Config *c,
                                      const char *shape_of, const uint64_t *want_id, const Shard *s,
                                      const UnitTable *ut, char *err, size_t errlen) {
    const uint64_t header = HEADER_INTS * 4;
    AeadFileKey fk;
    AeadFile af;
    aead_file_key(&fk, key);
    uint8_t *need = NULL, *chunk = NULL;
    float *params = NULL;
    int rc = aead_file_read_header(fd, &af, &fk, path, err, errlen);
    if (rc == 0 && want_id != NULL && af.file_id != *want_id)
        rc = errorf(err, errlen, "%s: file id %016llx, but the file checked at the start had %016llx: another "
                    "sealed file put in its place", path, (unsigned long long)af.file_id,
                    (unsigned long long)*want_id);
    if (rc == 0 && (af.plain_bytes != ckpt_file_bytes(0, c) || af.chunk_bytes < header))
        rc = errorf(err, errlen, "%s: %llu bytes sealed in chunks of %llu, but the shape %s says needs %llu in "
                    "chunks of at least %llu", path, (unsigned long long)af.plain_bytes,
                    (unsigned long long)af.chunk_bytes, shape_of, (unsigned long long)ckpt_file_bytes(0, c),
                    (unsigned long long)header);
    if (rc == 0) {
        need = (uint8_t *)calloc((size_t)af.chunks, 1);
        chunk = (uint8_t *)malloc((size_t)af.chunk_bytes);
        params = (float *)calloc(param_count(c), sizeof(float));
        if (need == NULL || chunk == NULL || params == NULL)
            rc = errorf(err, errlen, "%s: out of memory for %zu parameters", path, param_count(c));
    }
    if (rc == 0) ckpt_mark_chunks(&af, 1, c, s, ut, 0, need);
    for (uint64_t i = 0; rc == 0 && i < af.chunks; i++) {
        if (!need[i]) continue;
        uint64_t start = i * af.chunk_bytes, len = aead_file_chunk_len(&af, i), skip = i == 0 ? header : 0;
        rc = aead_file_read_chunk(fd, &af, &fk, i, chunk, path, err, errlen);
        if (rc == 0 && i == 0) rc = ckpt_model_header_is((const int32_t *)chunk, c, shape_of, path, err, errlen);
        if (rc == 0) memcpy((uint8_t *)params + start + skip - header, chunk + skip, (size_t)(len - skip));
    }
    if (chunk != NULL) secure_wipe(chunk, (size_t)af.chunk_bytes);
    free(chunk);
    free(need);
    aead_file_key_wipe(&fk);
    if (rc != 0) {
        free(params);
        return NULL;
    }
    return params;
}

// a checkpoint's model.bin, sealed under key or plain, read on a rank that
// resumes: c is the checkpoint's shape (ckpt_setup checked it against
// -e's), and of a sealed model.bin only the chunks holding the units of
// shard s (ut) are decrypted; the elements of other ranks stay zero. A
// plain one is read whole, as model_load does.
static float *ckpt_model_load_part(const char *path, const uint8_t key[32], GPT2Config *c, const Shard *s,
                                   const UnitTable *ut, char *err, size_t errlen) {
    int sealed = 0, fd = ckpt_open_read(path, 0, &sealed, err, errlen);
    if (fd < 0) return NULL;
    if (!sealed) {
        close(fd);
        return model_load(path, c, err, errlen);
    }
    float *params = ckpt_model_decrypt_part(fd, path, key, c, "the checkpoint's state.bin", NULL, s, ut, err, errlen);
    close(fd);
    return params;
}

// -e names a sealed model (-enc 2's final model): the checkpoint key of the
// job that sealed it, --key-file's or -o's job.key (never made here)
static int ckpt_init_key(const Options *o, uint8_t key[32], char *err, size_t errlen) {
    char why[1024];
    if (o->key_file == NULL && o->out_dir == NULL)
        return errorf(err, errlen, "flag -e %s: an encrypted model (-enc 2): give the key of the job that wrote it "
                      "with --key-file, or its directory with -o", o->init);
    if (ckpt_key(o->out_dir, o->key_file, key, why, sizeof(why)) != 0)
        return errorf(err, errlen, "flag -e %s: an encrypted model, but no key for it: %s", o->init, why);
    return 0;
}

// the shape of -e's model file when it is sealed (-enc 2's final model):
// its first chunk decrypted and the model header in it read, without
// decrypting the rest, from the one open that also tells whether it is
// sealed. 0 with *sealed set, and *file_id the id in its sealed header,
// which ckpt_init_load then requires; 0 with *sealed = 0 when the file is
// not sealed or cannot be opened, and then options_model_file reads it (or
// says why not), so a plain file's error comes before any about the key;
// -1 with err naming the file (another key: aead.h's "sealed with another
// key").
static int ckpt_init_config(const Options *o, GPT2Config *c, int *sealed, uint64_t *file_id, char *err,
                            size_t errlen) {
    *sealed = 0;
    int fd = ckpt_open_read(o->init, 1, sealed, NULL, 0);
    if (fd < 0 || !*sealed) {
        if (fd >= 0) close(fd);
        *sealed = 0;
        return 0;
    }
    uint8_t key[32];
    if (ckpt_init_key(o, key, err, errlen) != 0) {
        close(fd);
        return -1;
    }
    AeadFileKey fk;
    aead_file_key(&fk, key);
    secure_wipe(key, sizeof(key));
    AeadFile f;
    int32_t h[HEADER_INTS];
    uint8_t *chunk = NULL;
    char why[1024];
    int rc = aead_file_read_header(fd, &f, &fk, o->init, why, sizeof(why));
    if (rc == 0 && f.plain_bytes < sizeof(h))
        rc = errorf(why, sizeof(why), "%s: %llu bytes decrypted: shorter than a model header", o->init,
                    (unsigned long long)f.plain_bytes);
    if (rc == 0 && (chunk = (uint8_t *)malloc((size_t)f.chunk_bytes)) == NULL)
        rc = errorf(why, sizeof(why), "%s: out of memory for a chunk", o->init);
    if (rc == 0) rc = aead_file_read_range(fd, &f, &fk, 0, sizeof(h), h, chunk, o->init, why, sizeof(why));
    free(chunk);
    close(fd);
    aead_file_key_wipe(&fk);
    if (rc != 0) return errorf(err, errlen, "flag -e: %s", why);
    *file_id = f.file_id;
    return ckpt_sealed_model_header(h, f.plain_bytes, o->init, c, err, errlen);
}

// the parameters of -e's sealed model on the rank of shard s and units ut,
// as a resume reads a sealed model.bin (ckpt_model_load_part): only the
// chunks holding its units are decrypted, and the other ranks' elements
// stay zero. c is the shape and file_id the id ckpt_init_config read from
// the file's header: the file opened again here must be that one, not
// another model of the same shape sealed under the same key and put in its
// place meanwhile, or the ranks could each load a part of another model.
static float *ckpt_init_load(const Options *o, const GPT2Config *c, uint64_t file_id, const Shard *s,
                             const UnitTable *ut, char *err, size_t errlen) {
    uint8_t key[32];
    if (ckpt_init_key(o, key, err, errlen) != 0) return NULL;
    float *params = NULL;
    int sealed = 0, fd = ckpt_open_read(o->init, 1, &sealed, err, errlen);
    if (fd >= 0 && !sealed) errorf(err, errlen, "flag -e %s: no longer a sealed model (changed since the start?)", o->init);
    if (fd >= 0 && sealed)
        params = ckpt_model_decrypt_part(fd, o->init, key, c, "its header at the start", &file_id, s, ut, err, errlen);
    if (fd >= 0) close(fd);
    secure_wipe(key, sizeof(key));
    return params;
}

// one line on stderr for each entry of -o (dfd) that carries a checkpoint's
// name but is no directory (a file, or a symbolic link, never followed: it
// may point anywhere), where the resume would have looked for one first: a
// step above `chosen` (the one found, -1 for none), or with -ys want_step
// itself. Each is passed over, as a directory without a MANIFEST is, and
// the run's first checkpoint prunes it; the line says why the run resumes
// from an older checkpoint, or from none.
static void ckpt_note_not_dirs(int dfd, const char *out_dir, int want_step, int chosen) {
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0) close(fd);
        return;
    }
    rewinddir(d);  // a dup shares dfd's position, which an earlier listing moved
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int step = ckpt_step_of(e->d_name);
        if (step < 0 || (want_step >= 0 ? step != want_step : step <= chosen)) continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISDIR(st.st_mode)) continue;
        fprintf(stderr, "%s/%s: %s, not a checkpoint directory; passed over\n", out_dir, e->d_name,
                S_ISLNK(st.st_mode) ? "a symbolic link (never followed)" : S_ISREG(st.st_mode) ? "a file"
                                                                   : "another kind of file (a FIFO, socket or device)");
    }
    closedir(d);
}

// the checkpoint to resume from: want_step >= 0 that step, else the newest.
// Returns 1 with *s and dir filled, 0 when want_step < 0 and there is none,
// -1 with err set otherwise. thorough: its files are hashed (the pass of
// the launcher, of the one process, or of each rank of an outside
// launcher); say: what is passed over is said on stderr, by the process
// that holds -o's lock, so once a job.
static int ckpt_find_at(int dfd, const char *out_dir, int want_step, const uint8_t key[32], int thorough, int say,
                        CkptState *s, char *dir, size_t dirlen, char *err, size_t errlen) {
    int *steps, n = ckpt_list_at(dfd, &steps);
    if (n < 0) return errorf(err, errlen, "flag -o: cannot read directory %s: %s", out_dir, strerror(errno));
    int step = -1;
    for (int i = 0; i < n && step < 0; i++) {
        if (want_step >= 0 && steps[i] != want_step) continue;
        ckpt_dir_name(dir, dirlen, out_dir, steps[i], "");
        if (ckpt_has_manifest_at(dfd, steps[i])) step = steps[i];
        else if (say) fprintf(stderr, "%s: no MANIFEST, so not a checkpoint (a delete cut short?); passed over\n", dir);
    }
    free(steps);
    if (say) ckpt_note_not_dirs(dfd, out_dir, want_step, step);
    if (step < 0) {
        if (want_step < 0) return 0;
        return errorf(err, errlen, "flag -ys: no checkpoint of step %d in %s", want_step, out_dir);
    }
    if (ckpt_verify(dir, key, thorough, s, err, errlen) != 0) return -1;
    if (s->step != step)
        return errorf(err, errlen, "checkpoint %s: state.bin says step %d", dir, s->step);
    return 1;
}

// the same with -o given by its path (0 when it does not exist)
static int ckpt_find(const char *out_dir, int want_step, const uint8_t key[32], int thorough, CkptState *s, char *dir,
                     size_t dirlen, char *err, size_t errlen) {
    int dfd = ckpt_dir_open(out_dir, err, errlen);
    if (dfd < 0 && errno == ENOENT && want_step < 0) return 0;
    if (dfd < 0) return -1;
    int rc = ckpt_find_at(dfd, out_dir, want_step, key, thorough, thorough, s, dir, dirlen, err, errlen);
    close(dfd);
    return rc;
}

// the checkpoint flags against each other (a trainer may call it early, before
// the model's shape is known; ckpt_setup calls it too)
static int ckpt_check_flags(const Options *o, char *err, size_t errlen) {
    if ((o->ckpt_every > 0 || o->resume || o->resume_step >= 0) && o->out_dir == NULL)
        return errorf(err, errlen, "flags -n/-y/-ys: checkpoints live in the output directory; give it with -o DIR");
    if (o->encrypt > 0 && o->out_dir == NULL)
        return errorf(err, errlen, "flag -enc %d: encrypts what is written into the output directory; give it with -o DIR",
                      o->encrypt);
    return 0;
}

// the pid a LOCK file holds ("PID\n", written by the job that holds it), or
// 0 when it holds none
static long ckpt_lock_pid(int fd) {
    char text[24];
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    if (n <= 0) return 0;
    text[n] = '\0';
    char *end;
    long pid = strtol(text, &end, 10);
    return end != text && *end == '\n' && pid > 0 ? pid : 0;
}

// ckpt_lock_at: one job at a time per output directory (open at dfd; out_dir
// its name in messages). The job's first process (a single one, our
// launcher, or rank 0 of an outside launch) takes an flock on LOCK before
// it looks at any checkpoint, writes its pid into it, and holds it until it
// ends (the kernel drops it then, a kill included); our launcher's ranks
// run inside its hold (they die with it). A second job is refused at once,
// naming the holder. LOCK is this user's file of mode 0600, never a link:
// anyone who can open a file can flock it, and so block every job in the
// directory. The lock's fd (>= 0), or -1 with err set.
static int ckpt_lock_at(int dfd, const char *out_dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/LOCK", out_dir);
    int fd = openat(dfd, "LOCK", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ELOOP) return errorf(err, errlen, "flag -o: %s is a symbolic link: not followed; remove it", path);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    const char *wrong = fstat(fd, &st) != 0 ? strerror(errno) : !S_ISREG(st.st_mode) ? "not a regular file"
                        : st.st_uid != geteuid() ? "owned by another user" : NULL;
    if (wrong == NULL && (st.st_mode & 077) != 0 && fchmod(fd, 0600) != 0) wrong = strerror(errno);
    if (wrong != NULL) {
        close(fd);
        return errorf(err, errlen, "flag -o: %s: %s; remove it", path, wrong);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        long pid = ckpt_lock_pid(fd);
        close(fd);
        if (e != EWOULDBLOCK) return errorf(err, errlen, "flag -o: %s: flock: %s", path, strerror(e));
        char holder[48] = "a process";
        if (pid > 0) snprintf(holder, sizeof(holder), "pid %ld", pid);
        return errorf(err, errlen, "flag -o: another job is using %s: %s holds %s; one job per directory (resume "
                      "with -y 1 once it has ended)", out_dir, holder, path);
    }
    char text[24];
    int n = snprintf(text, sizeof(text), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite_all(fd, text, (size_t)n, 0) != 0) {
        int e = errno;
        close(fd);
        return errorf(err, errlen, "%s: write: %s", path, strerror(e));
    }
    return fd;
}

// ckpt_lock_is: a rank of our launcher checks that the -o it opened (dfd)
// is the one its launcher (pid launcher) locked: LOCK there names that pid
// and is held. So a directory put in -o's place between the launcher's
// start and the rank's is refused, not written into. 0, or -1 with err set.
static int ckpt_lock_is(int dfd, const char *out_dir, long launcher, char *err, size_t errlen) {
    int fd = openat(dfd, "LOCK", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    long pid = fd >= 0 ? ckpt_lock_pid(fd) : 0;
    int held = fd >= 0 && flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (fd >= 0) close(fd);  // a shared lock it took goes with the close
    if (pid != launcher || !held)
        return errorf(err, errlen, "flag -o: %s is not the directory the launcher (pid %ld) locked (its LOCK names pid "
                      "%ld, %s): was it replaced since the start?", out_dir, launcher, pid, held ? "held" : "not held");
    return 0;
}

// what both trainers do before any rank starts (so that a bad job is refused
// once, by the launcher): checks the checkpoint flags, makes -o and opens it
// (*out_fd, held for the whole run: everything in -o is done relative to
// it), takes -o's lock (lock: see ckpt_lock_at) or, in a rank of our
// launcher (launcher: its pid, else 0), checks that the launcher holds it,
// reads or makes the checkpoint key and, with -y or -ys, finds and verifies
// the checkpoint to resume from, under the lock, which must hold the model
// of config c (from -e) and have been written with the same -b and -t.
// Returns 1 when resuming (ck and dir filled in), 0 when not (no -o, no
// -y/-ys, or -y and no checkpoint yet), -1 with one line in err for a bad
// flag, -2 when another job holds -o (exit 1, not a usage error).
static int ckpt_setup(const Options *o, const GPT2Config *c, int thorough, int lock, long launcher, int *out_fd,
                      uint8_t key[32], CkptState *ck, char *dir, size_t dirlen, char *err, size_t errlen) {
    *out_fd = -1;
    if (ckpt_check_flags(o, err, errlen) != 0) return -1;
    if (o->out_dir == NULL) return 0;
    if (strlen(o->out_dir) > 700) return errorf(err, errlen, "flag -o: the directory's path is over 700 bytes");
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return errorf(err, errlen, "flag -o: cannot create directory %s: %s", o->out_dir, strerror(errno));
    int dfd = ckpt_dir_open(o->out_dir, err, errlen);
    if (dfd < 0) return -1;
    *out_fd = dfd;
    if (lock && ckpt_lock_at(dfd, o->out_dir, err, errlen) < 0) return -2;  // its fd stays open: the lock lives as long as this process
    if (launcher > 0 && ckpt_lock_is(dfd, o->out_dir, launcher, err, errlen) != 0) return -2;
    if (ckpt_key_at(dfd, o->out_dir, o->key_file, 1, key, err, errlen) != 0) return -1;
    if (!o->resume && o->resume_step < 0) return 0;
    int found = ckpt_find_at(dfd, o->out_dir, o->resume_step, key, thorough, lock, ck, dir, dirlen, err, errlen);
    if (found <= 0) return found;
    const GPT2Config *k = &ck->config;
    if (k->L != c->L || k->C != c->C || k->NH != c->NH || k->V != c->V || k->Vp != c->Vp || k->maxT != c->maxT)
        return errorf(err, errlen,
                      "checkpoint %s holds a model of L=%d C=%d NH=%d V=%d maxT=%d, but -e %s is L=%d C=%d NH=%d "
                      "V=%d maxT=%d", dir, k->L, k->C, k->NH, k->V, k->maxT, o->init, c->L, c->C, c->NH, c->V,
                      c->maxT);
    if (ck->B != o->B || ck->T != o->T)  // the data position counts micro-batches of B*T tokens
        return errorf(err, errlen, "checkpoint %s was written with -b %d -t %d; resume with the same, not -b %d -t %d",
                      dir, ck->B, ck->T, o->B, o->T);
    if (ck->shuffle != o->shuffle)  // the data position means another sample under the other order
        return errorf(err, errlen, "checkpoint %s was written with -sh %d; resume with the same, not -sh %d", dir,
                      ck->shuffle, o->shuffle);
    if (o->steps >= 0 && ck->step > o->steps)
        return errorf(err, errlen, "flag -x: %d steps, but checkpoint %s is of step %d", o->steps, dir, ck->step);
    return 1;
}

// after the checkpoint of step `newest` is complete: keeps it and the
// `keep` - 1 sealed ones before it. Deletes the rest: older ones, any of a
// later step (left by the run this one abandoned when it resumed from an
// earlier step: -y 1 must not go back to them), directories without a
// MANIFEST, any .partial left by a kill, and links or files that carry a
// checkpoint's name (the links themselves, never what they point to).
static void ckpt_prune(int dfd, int newest, int keep) {
    int *steps, n = ckpt_list_at(dfd, &steps), kept = 0;
    char name[64];
    for (int i = 0; i < n; i++) {
        int sealed = ckpt_has_manifest_at(dfd, steps[i]);
        if (steps[i] <= newest && sealed && kept < keep) { kept++; continue; }
        ckpt_entry_name(name, steps[i], "");
        ckpt_remove_at(dfd, name);
    }
    free(steps);
    int fd = dup(dfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d != NULL) rewinddir(d);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        int misnamed = ckpt_step_of(e->d_name) >= 0 && !ckpt_is_real_dir(dfd, e->d_name);
        if (misnamed || ckpt_is_partial(e->d_name)) ckpt_remove_at(dfd, e->d_name);
    }
    if (d != NULL) closedir(d);
    else if (fd >= 0) close(fd);
    fsync(dfd);
}

#include "llm3d/secure/ghash_shares.h"  // CkptShare: the writers' GHASH shares of a sealed file

// the SHA-256 of the file at fd, size bytes, read front to back
static int ckpt_sha_fd(int fd, uint64_t size, uint8_t sha[32]) {
    const size_t piece = 1u << 20;
    uint8_t *buf = (uint8_t *)malloc(piece);
    if (buf == NULL) return ENOMEM;
    Sha256 h;
    sha256_init(&h);
    int e = 0;
    for (uint64_t at = 0; at < size && e == 0; at += piece) {
        size_t n = size - at < piece ? (size_t)(size - at) : piece;
        if (pread_all(fd, buf, n, at) != 0) e = errno;
        else sha256_update(&h, buf, n);
    }
    if (e == 0) sha256_final(&h, sha);
    free(buf);
    return e;
}

// a sealed file's chunk tags from the writers' shares (all of them, added
// up: ckpt_shares_combine), once every rank's part is in, and an fsync;
// with sha and size, the file's SHA-256 and size too, read back as a plain
// checkpoint's are for its MANIFEST. Refused, with one line, unless the
// shares are of this file and cover every byte of it once.
static int ckpt_seal_tags(int dfd, const char *name, const char *path, const AeadFileKey *cipher, const CkptShare *share,
                          uint8_t sha[32], uint64_t *size, char *err, size_t errlen) {
    int fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    AeadFile f;
    uint8_t *tags = NULL;
    int rc = aead_file_read_header(fd, &f, cipher, path, err, errlen);
    if (rc == 0 && (share == NULL || share->sums == NULL || share->file_id != f.file_id || share->chunks != f.chunks))
        rc = errorf(err, errlen, "%s: the writers' GHASH shares are not of this file (header: id %016llx, %llu chunks; "
                    "shares: id %016llx, %llu chunks): not sealed", path, (unsigned long long)f.file_id,
                    (unsigned long long)f.chunks, (unsigned long long)(share != NULL ? share->file_id : 0),
                    (unsigned long long)(share != NULL ? share->chunks : 0));
    if (rc == 0) rc = ckpt_shares_cover(share, &f, path, err, errlen);
    if (rc == 0 && (tags = (uint8_t *)malloc((size_t)f.chunks * AEAD_TAG_BYTES)) == NULL)
        rc = errorf(err, errlen, "%s: out of memory for the tags", path);
    if (rc == 0) {
        aead_file_tags_from_sums(&f, cipher, share->sums, tags);
        if (pwrite_all(fd, tags, (size_t)f.chunks * AEAD_TAG_BYTES, AEAD_FILE_HEADER_BYTES + f.plain_bytes) != 0)
            rc = errorf(err, errlen, "%s: write the tags: %s", path, strerror(errno));
    }
    int e = rc == 0 && sha != NULL ? ckpt_sha_fd(fd, aead_file_bytes(f.plain_bytes, f.chunk_bytes), sha) : 0;
    if (e != 0) rc = errorf(err, errlen, "%s: read: %s", path, strerror(e));
    if (rc == 0 && fsync(fd) != 0) rc = errorf(err, errlen, "%s: fsync: %s", path, strerror(errno));
    if (rc == 0 && size != NULL) *size = aead_file_bytes(f.plain_bytes, f.chunk_bytes);
    free(tags);
    close(fd);
    return rc;
}

// rank 0, once every rank's part is in: seals the .partial directory of step
// `step` and gives it its final name. With cipher, each file's chunk tags are
// made from shares[i] (ckpt_files' order: every writer's GHASH shares, added
// up), and the file is read back for the MANIFEST, as a plain one is.
static int ckpt_seal_at(int dfd, const char *out_dir, int step, const uint8_t key[32], const AeadFileKey *cipher,
                        const CkptShare *shares, char *err, size_t errlen) {
    char partial[4096], partial_name[64], final_name[64];
    ckpt_dir_name(partial, sizeof(partial), out_dir, step, ".partial");
    ckpt_entry_name(partial_name, step, ".partial");
    ckpt_entry_name(final_name, step, "");
    int pfd = openat(dfd, partial_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0) return errorf(err, errlen, "%s: %s", partial, strerror(errno));
    Manifest m = {0, NULL};
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (cipher != NULL) {
            char path[4200];
            uint8_t sha[32];
            uint64_t size = 0;
            snprintf(path, sizeof(path), "%s/%s", partial, ckpt_files[i]);
            rc = ckpt_seal_tags(pfd, ckpt_files[i], path, cipher, shares != NULL ? &shares[i] : NULL, sha, &size, err,
                                errlen);
            if (rc == 0) rc = manifest_add_entry(&m, ckpt_files[i], size, sha, err, errlen);
        } else {
            rc = manifest_add_file_at(&m, pfd, partial, ckpt_files[i], err, errlen);
        }
    }
    if (rc == 0) rc = manifest_write_at(&m, pfd, partial, "MANIFEST", key, err, errlen);
    manifest_free(&m);
    close(pfd);
    if (rc != 0) return -1;
    // a checkpoint of this step from an earlier attempt (resumed from before it) gives way
    if (ckpt_remove_at(dfd, final_name) != 0)
        return errorf(err, errlen, "%s/%s: cannot replace: %s", out_dir, final_name, strerror(errno));
    if (renameat(dfd, partial_name, dfd, final_name) != 0 || fsync(dfd) != 0)
        return errorf(err, errlen, "%s: rename to %s: %s", partial, final_name, strerror(errno));
    return 0;
}

// the same with -o given by its path (the tests)
static int ckpt_seal(const char *out_dir, int step, const uint8_t key[32], const AeadFileKey *cipher,
                     const CkptShare *shares, char *err, size_t errlen) {
    int dfd = ckpt_dir_open(out_dir, err, errlen);
    if (dfd < 0) return -1;
    int rc = ckpt_seal_at(dfd, out_dir, step, key, cipher, shares, err, errlen);
    close(dfd);
    return rc;
}

// one checkpoint file open for a rank's writes, at plaintext offsets: a
// plain file, or a sealed one (its header says), whose writes are then
// encrypted at their places through a bounce buffer, their GHASH shares and
// byte counts added into a CkptShare as they go
#define CKPT_BOUNCE_BYTES (4u << 20)
typedef struct { int fd, sealed; AeadFile file; const AeadFileKey *cipher; uint8_t *bounce; CkptShare *share; } CkptOut;

// the file `name` of the directory open at dfd (AT_FDCWD: a path); of a
// sealed one, the shares go into share, which must be given (a sealed file
// gets its tags from its writers' shares only). When share->want, the
// header must hold share->want_id: the header is in -o, which whoever can
// write it may set meanwhile to an older file's (the same step written again
// after a resume), and encrypting under that id would reuse the older file's
// keystream. 0, or an errno (EBADMSG: a sealed file's header is not for this
// key; EINVAL: no share, or share holds another file's; ESTALE: the header's
// id is not want_id, share->stale set and nothing written)
static int ckpt_out_open_at(CkptOut *o, int dfd, const char *name, const AeadFileKey *cipher, CkptShare *share) {
    memset(o, 0, sizeof(*o));
    o->fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (o->fd < 0) return errno;
    uint8_t first[8];
    o->sealed = pread_all(o->fd, first, sizeof(first), 0) == 0 && aead_file_is_sealed(first, sizeof(first));
    if (!o->sealed) return 0;
    o->cipher = cipher;
    o->share = share;
    o->bounce = (uint8_t *)malloc(CKPT_BOUNCE_BYTES);
    if (o->bounce == NULL) return ENOMEM;
    if (cipher == NULL || aead_file_read_header(o->fd, &o->file, cipher, name, NULL, 0) != 0) return EBADMSG;
    return share == NULL ? EINVAL : ckpt_share_start(share, &o->file);
}

static int ckpt_out_open(CkptOut *o, const char *path, const AeadFileKey *cipher, CkptShare *share) {
    return ckpt_out_open_at(o, AT_FDCWD, path, cipher, share);
}

// n bytes at plaintext offset `offset`; -1 with errno
static int ckpt_out_pwrite(CkptOut *o, const void *buf, size_t n, size_t offset) {
    if (!o->sealed) return pwrite_all(o->fd, buf, n, offset);
    return aead_file_pwrite(o->fd, &o->file, o->cipher, buf, n, offset, o->bounce, CKPT_BOUNCE_BYTES, o->share->sums,
                            o->share->bytes);
}

// fsync (when sync) and close; 0, or an errno. The shares stay in the
// CkptShare, for the job to send rank 0.
static int ckpt_out_close(CkptOut *o, int sync) {
    int e = 0;
    if (o->fd >= 0 && sync && fsync(o->fd) != 0) e = errno;
    if (o->fd >= 0 && close(o->fd) != 0 && e == 0) e = errno;
    free(o->bounce);
    memset(o, 0, sizeof(*o));
    o->fd = -1;
    return e;
}

// a new file `name` in the directory dfd (AT_FDCWD: a path) at its full size: the plaintext header
// (header_bytes of it) in, the rest zero; sealed under cipher when given
// (its own header, then the plaintext header encrypted at offset 0, its
// GHASH shares the first in share). 0, or -1 with err naming path (the
// file's name for messages). A file this call made and could not fill is
// removed; one that was there already is left.
static int ckpt_make_file(int dfd, const char *name, const char *path, const void *header, size_t header_bytes,
                          uint64_t bytes, const AeadFileKey *cipher, CkptShare *share, char *err, size_t errlen) {
    AeadFile f;
    // the sealed header first: a file aead_file_new refuses is never made
    if (cipher != NULL && aead_file_new(&f, cipher, bytes, AEAD_FILE_CHUNK_BYTES, path, err, errlen) != 0) return -1;
    // O_EXCL: a link planted under the name is refused, never written through
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644), e = fd < 0 ? errno : 0;
    if (e == 0 && cipher == NULL) {
        if (write_all(fd, header, header_bytes) != 0) e = errno;
        if (e == 0 && ftruncate(fd, (off_t)bytes) != 0) e = errno;
    } else if (e == 0) {
        uint8_t bounce[4096];
        ckpt_share_free(share);  // a share of a file made before (a write that failed) gives way
        e = ckpt_share_start(share, &f);
        if (e == 0 && write_all(fd, f.header, sizeof(f.header)) != 0) e = errno;
        if (e == 0 && ftruncate(fd, (off_t)aead_file_bytes(bytes, AEAD_FILE_CHUNK_BYTES)) != 0) e = errno;
        if (e == 0 && aead_file_pwrite(fd, &f, cipher, header, header_bytes, 0, bounce, sizeof(bounce), share->sums,
                                       share->bytes) != 0)
            e = errno;
    }
    if (e == 0 && fsync(fd) != 0) e = errno;
    if (fd >= 0 && close(fd) != 0 && e == 0) e = errno;
    if (fd >= 0 && e != 0) unlinkat(dfd, name, 0);
    return e == 0 ? 0 : errorf(err, errlen, "%s: write: %s", path, strerror(e));
}

// rank 0, before the ranks write: an empty .partial directory with model.bin
// and optim.bin at their full size (headers in, tensors zero) and state.bin;
// sealed files under cipher when given, rank 0's GHASH shares of what it
// wrote in shares[i] (ckpt_files' order). On a failure the .partial
// directory is removed again.
static int ckpt_begin_at(int dfd, const char *out_dir, const CkptState *s, const AeadFileKey *cipher,
                         CkptShare *shares, char *err, size_t errlen) {
    char name[64];
    ckpt_entry_name(name, s->step, ".partial");
    ckpt_remove_at(dfd, name);
    int pfd = mkdirat(dfd, name, 0755) == 0 ? openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    int e = pfd < 0 ? errno : 0;
    if (pfd < 0) {
        ckpt_remove_at(dfd, name);
        return errorf(err, errlen, "%s/%s: mkdir: %s", out_dir, name, strerror(e));
    }
    int32_t h[3][HEADER_INTS];
    model_fill_header(h[0], &s->config, 3);
    ckpt_optim_header(h[1], &s->config, s->adam_t);
    ckpt_state_header(s, h[2]);
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s/%s", out_dir, name, ckpt_files[i]);
        rc = ckpt_make_file(pfd, ckpt_files[i], path, h[i], sizeof(h[i]), ckpt_file_bytes(i, &s->config), cipher,
                            cipher != NULL ? &shares[i] : NULL, err, errlen);
    }
    close(pfd);
    if (rc != 0) ckpt_remove_at(dfd, name);  // a checkpoint half made is never left
    return rc;
}

// the same with -o given by its path (the tests)
static int ckpt_begin(const char *out_dir, const CkptState *s, const AeadFileKey *cipher, CkptShare *shares, char *err,
                      size_t errlen) {
    int dfd = ckpt_dir_open(out_dir, err, errlen);
    if (dfd < 0) return -1;
    int rc = ckpt_begin_at(dfd, out_dir, s, cipher, shares, err, errlen);
    close(dfd);
    return rc;
}

// how a trainer takes part in ckpt_write_job and ckpt_write_model: sum adds
// one float over every rank of the job (an all-reduce); part writes this
// rank's share of the model file model_name and, when optim_name is not
// NULL, of optim.bin there, both named relative to the directory fd dfd
// (-o, held open since the start), files at full size, and fsyncs them: 0
// or an errno (it opens them with ckpt_out_open_at, cipher and shares[0]
// for the model, shares[1] for optim.bin, which sealed files need: shares
// is NULL when cipher is); gather sends `bytes` at mine from every rank
// r > 0 to rank 0, which gets them at all + r * bytes (all's first bytes
// are left alone), over the job's communicator (world ranks; a wait with
// the job's timeout); set_timeout sets how long the job's waits last, sum's
// and gather's included, and returns the timeout it replaces (shm_comm.h's
// comm_set_timeout does); encrypt: the files sealed (-enc 1 for a
// checkpoint, -enc 2 for the final model)
typedef struct {
    float (*sum)(void *ctx, float x);
    int (*part)(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                CkptShare *shares);
    void (*gather)(void *ctx, const void *mine, void *all, size_t bytes);
    double (*set_timeout)(void *ctx, double seconds);
    void *ctx;
    int rank, world;
    int encrypt;
} CkptJob;

// the room a job's waits need while a checkpoint is written: every rank's
// share and rank 0's hash of all 12 bytes per parameter, at 0.1 GB/s (the
// portable SHA-256's speed), on top of -to. The final model, a third of
// those bytes (the parameters alone), needs a third of it.
static double ckpt_wait_room(const GPT2Config *c) { return 12.0 * (double)param_count(c) / 1e8; }

// makes the job's waits room seconds longer: in a write, rank 0 does
// serial work while the others wait. Returns the timeout to put back.
static double ckpt_wait_longer(const CkptJob *job, double room) {
    // setting 0 reads the timeout in force: no wait comes before the next call
    double timeout = job->set_timeout(job->ctx, 0.0);
    job->set_timeout(job->ctx, timeout + room);
    return timeout;
}

// one write of files by every rank of a job, which ckpt_write_job and
// ckpt_write_model share. arg is what rank 0's three steps take: begin
// makes the files at their full size (of sealed ones, its GHASH shares of
// what it writes in them into shares, ckpt_files' order) and leaves nothing
// behind when it fails; finish seals them (their tags from shares, every
// writer's added up) and renames them into place; abandon removes what
// begin made. label is what a rank's failed write says before "write:
// <reason>". room: the seconds the job's waits get on top of their timeout
// meanwhile (ckpt_wait_room). model_bytes and optim_bytes: the files'
// plaintext sizes, which every rank knows alike; key: the checkpoint key,
// which the masks of the shares come from.
typedef struct {
    int (*begin)(const void *arg, const AeadFileKey *cipher, CkptShare *shares, char *err, size_t errlen);
    int (*finish)(const void *arg, const AeadFileKey *cipher, const CkptShare *shares, char *err, size_t errlen);
    void (*abandon)(const void *arg);
    const void *arg;
    int dfd;                           // -o, which the names below are relative to
    const char *out_dir;               // -o's name, for messages
    const char *model_name, *optim_name;
    uint64_t model_bytes, optim_bytes;
    const uint8_t *key;
    const char *label;
    double room;
} CkptWrite;

// every rank's GHASH shares of the model file and optim.bin to rank 0
// (ckpt_share_pack, ckpt_shares_combine: masked on the way), whose
// shares[0] and shares[1] then hold every writer's, added up. Every rank
// calls it; 0, or on rank 0 -1 with err naming the file and the rank.
static int ckpt_gather_shares(const CkptJob *job, const CkptWrite *w, CkptShare *shares, char *err, size_t errlen) {
    int rc = 0;
    for (int k = 0; k < 2 && job->world > 1; k++) {
        const char *name = k == 0 ? w->model_name : w->optim_name;
        if (name == NULL) continue;
        uint64_t chunks = aead_file_chunk_count(k == 0 ? w->model_bytes : w->optim_bytes, AEAD_FILE_CHUNK_BYTES);
        size_t bytes = ckpt_share_msg_bytes(chunks);
        uint8_t *buf = (uint8_t *)calloc(job->rank == 0 ? (size_t)job->world : 1, bytes);
        if (buf == NULL) {  // the others wait on this rank, until the job's timeout ends it
            fprintf(stderr, "rank %d: out of memory for the GHASH shares of %s\n", job->rank, name);
            exit(1);
        }
        if (job->rank != 0) ckpt_share_pack(&shares[k], w->key, name, job->rank, chunks, buf);
        job->gather(job->ctx, buf, buf, bytes);
        if (job->rank == 0 && rc == 0) {
            char path[4300];
            snprintf(path, sizeof(path), "%s/%s", w->out_dir, name);
            rc = ckpt_shares_combine(&shares[k], buf, job->world, w->key, name, path, err, errlen);
        }
        free(buf);  // masked shares only: nothing to wipe
    }
    return rc;
}

// the ids of the sealed files rank 0 just made (shares[0] and, with
// optim_name, shares[1]) to every rank, into their shares' want_id, before
// any rank opens them: a rank must never take the id from the header in -o
// (ckpt_out_open_at). They cross the job's own channel (MAC'd frames on the
// host backend) as sums that only rank 0 adds to, 16 bits at a time, which
// a float holds exactly. Every rank calls it, world 1 included.
static void ckpt_share_ids(const CkptJob *job, const CkptWrite *w, CkptShare *shares) {
    for (int k = 0; k < 2; k++) {
        if ((k == 0 ? w->model_name : w->optim_name) == NULL) continue;
        uint64_t id = job->rank == 0 ? shares[k].file_id : 0, got = 0;
        for (int p = 0; p < 4; p++) {
            float piece = job->sum(job->ctx, job->rank == 0 ? (float)((id >> (16 * p)) & 0xffff) : 0.0f);
            got |= ((uint64_t)piece & 0xffff) << (16 * p);
        }
        shares[k].want = 1;
        shares[k].want_id = got;
    }
}

// one line for a rank that refused a header (ckpt_out_open_at's ESTALE);
// 0 when none did
static int ckpt_stale_error(const CkptJob *job, const CkptWrite *w, const CkptShare *shares, char *err,
                            size_t errlen) {
    for (int k = 0; k < 2; k++)
        if (shares[k].stale)
            return errorf(err, errlen, "%s/%s: rank %d: sealed file header field file_id = %016llx, but rank 0 made "
                          "the file with id %016llx: another file's header put in its place; nothing encrypted under "
                          "it", w->out_dir, k == 0 ? w->model_name : w->optim_name, job->rank,
                          (unsigned long long)shares[k].stale_id, (unsigned long long)shares[k].want_id);
    return 0;
}

// w by every rank, files sealed under cipher when it is not NULL. All ranks
// agree on a sum of failures three times: once rank 0 began (then rank 0's
// ids of the sealed files reach every rank, ckpt_share_ids, and a rank whose
// file's header holds another id refuses it); once every rank
// wrote its part of model_name and, unless it is NULL, of optim_name; once
// rank 0 finished. Between the last two, every rank's GHASH shares of a
// sealed file go to rank 0 (ckpt_gather_shares), which makes the tags from
// them. Every rank returns the same verdict, 0 when the files are complete;
// on a failure rank 0 abandons, and err holds the line of rank 0, or of a
// rank whose own write failed (empty on the others, so each failure is said
// once). Every share is wiped before it returns.
static int ckpt_write_files(const CkptJob *job, const CkptWrite *w, const AeadFileKey *cipher, char *err,
                            size_t errlen) {
    int rank0 = job->rank == 0;
    CkptShare shares[3];
    memset(shares, 0, sizeof(shares));
    double timeout = ckpt_wait_longer(job, w->room);
    float failed = job->sum(job->ctx, rank0 && w->begin(w->arg, cipher, shares, err, errlen) != 0);
    if (failed == 0 && cipher != NULL) ckpt_share_ids(job, w, shares);
    if (failed == 0) {
        int e = job->part(job->ctx, w->dfd, w->model_name, w->optim_name, cipher, cipher != NULL ? shares : NULL);
        if (e != 0 && ckpt_stale_error(job, w, shares, err, errlen) == 0)
            errorf(err, errlen, "%s write: %s", w->label, strerror(e));
        failed = job->sum(job->ctx, e != 0);
        if (failed == 0 && cipher != NULL && ckpt_gather_shares(job, w, shares, err, errlen) != 0) failed = 1;
        if (failed == 0 && rank0 && w->finish(w->arg, cipher, shares, err, errlen) != 0) failed = 1;
        if (!rank0 && e == 0) err[0] = '\0';  // rank 0 speaks for the job; a rank that failed, for itself
        failed = job->sum(job->ctx, rank0 ? failed : 0.0f);
        if (failed != 0 && rank0) w->abandon(w->arg);
    }
    for (int k = 0; k < 3; k++) ckpt_share_free(&shares[k]);
    job->set_timeout(job->ctx, timeout);
    return failed == 0 ? 0 : -1;
}

// what rank 0 needs to begin, seal and abandon a checkpoint
typedef struct { int dfd; const char *out_dir; const CkptState *st; const uint8_t *key; } CkptDirWrite;

static int ckpt_dir_begin(const void *arg, const AeadFileKey *cipher, CkptShare *shares, char *err, size_t errlen) {
    const CkptDirWrite *d = (const CkptDirWrite *)arg;
    return ckpt_begin_at(d->dfd, d->out_dir, d->st, cipher, shares, err, errlen);
}

static int ckpt_dir_seal(const void *arg, const AeadFileKey *cipher, const CkptShare *shares, char *err,
                         size_t errlen) {
    const CkptDirWrite *d = (const CkptDirWrite *)arg;
    return ckpt_seal_at(d->dfd, d->out_dir, d->st->step, d->key, cipher, shares, err, errlen);
}

// the .partial directory removed: the older checkpoints stay as they were
static void ckpt_dir_abandon(const void *arg) {
    const CkptDirWrite *d = (const CkptDirWrite *)arg;
    char name[64];
    ckpt_entry_name(name, d->st->step, ".partial");
    ckpt_remove_at(d->dfd, name);
}

// the checkpoint of step st->step into -o (out_fd, held open since the
// start; out_dir its name in messages), by every rank of a job (both
// trainers), through ckpt_write_files: rank 0 made the files (ckpt_begin_at);
// every rank wrote its part; rank 0 sealed it (ckpt_seal_at). Every rank
// returns the same verdict, 0 when the checkpoint is complete; on a failure
// the .partial directory is gone and the older checkpoints stay.
static int ckpt_write_job(const CkptJob *job, int out_fd, const char *out_dir, int keep, const CkptState *st,
                          const uint8_t key[32]) {
    char err[1200] = "", dir[4096], partial[64], model_name[128], optim_name[128], label[4300];
    ckpt_dir_name(dir, sizeof(dir), out_dir, st->step, ".partial");
    ckpt_entry_name(partial, st->step, ".partial");
    snprintf(model_name, sizeof(model_name), "%s/model.bin", partial);
    snprintf(optim_name, sizeof(optim_name), "%s/optim.bin", partial);
    snprintf(label, sizeof(label), "rank %d: %s:", job->rank, dir);
    AeadFileKey cipher;
    aead_file_key(&cipher, key);
    CkptDirWrite d = {out_fd, out_dir, st, key};
    CkptWrite w = {ckpt_dir_begin, ckpt_dir_seal, ckpt_dir_abandon, &d, out_fd, out_dir, model_name, optim_name,
                   ckpt_file_bytes(0, &st->config), ckpt_file_bytes(1, &st->config), key, label,
                   ckpt_wait_room(&st->config)};
    int rc = ckpt_write_files(job, &w, job->encrypt ? &cipher : NULL, err, sizeof(err));
    if (rc == 0 && job->rank == 0) ckpt_prune(out_fd, st->step, keep);
    aead_file_key_wipe(&cipher);
    if (err[0] != '\0') fprintf(stderr, "checkpoint of step %d failed: %s\n", st->step, err);
    return rc;
}

// what rank 0 needs to begin, finish and abandon the final model: -o (dfd,
// out_dir its name), the temporary file's name tmp_name in it (tmp its path,
// for messages), the final name and path, the model's shape
typedef struct { int dfd; const char *out_dir, *tmp_name, *tmp, *name, *path; const GPT2Config *c; } CkptModelWrite;

// rank 0, before the ranks write the final model: the temporary file made
// anew at its full size, header in, sealed under cipher when given. A
// regular file left there by a write cut short gives way. A link there is
// refused and left as it is, like the other files the trainer writes in -o
// (files.h's fopen_nofollow), never written through. One planted after the
// check is left too: the create (O_EXCL) then fails and removes nothing.
// Only a link swapped for the old regular file in the instant between its
// check and its unlink would go; even then nothing is written through it.
static int ckpt_model_begin(const void *arg, const AeadFileKey *cipher, CkptShare *shares, char *err, size_t errlen) {
    const CkptModelWrite *f = (const CkptModelWrite *)arg;
    struct stat st;
    int there = fstatat(f->dfd, f->tmp_name, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (there && S_ISLNK(st.st_mode)) return errorf(err, errlen, "%s: a symbolic link, not followed here", f->tmp);
    if (there && S_ISREG(st.st_mode)) unlinkat(f->dfd, f->tmp_name, 0);
    int32_t h[HEADER_INTS];
    model_fill_header(h, f->c, 3);
    return ckpt_make_file(f->dfd, f->tmp_name, f->tmp, h, sizeof(h), ckpt_file_bytes(0, f->c), cipher,
                          cipher != NULL ? &shares[0] : NULL, err, errlen);
}

// rank 0, once every rank's part of the temporary file is in (and
// fsynced): a sealed file's chunk tags (from the writers' shares, shares[0];
// the file is not read back), then the file renamed to its final name and
// -o fsynced, so that the name is the whole file's once this returns
static int ckpt_model_finish(const void *arg, const AeadFileKey *cipher, const CkptShare *shares, char *err,
                             size_t errlen) {
    const CkptModelWrite *f = (const CkptModelWrite *)arg;
    if (cipher != NULL && ckpt_seal_tags(f->dfd, f->tmp_name, f->tmp, cipher, &shares[0], NULL, NULL, err, errlen) != 0)
        return -1;
    if (renameat(f->dfd, f->tmp_name, f->dfd, f->name) != 0)
        return errorf(err, errlen, "%s: rename to %s: %s", f->tmp, f->path, strerror(errno));
    if (fsync(f->dfd) != 0) return errorf(err, errlen, "%s: fsync: %s", f->out_dir, strerror(errno));
    return 0;
}

// rank 0 made the temporary file, so it is not a link that ckpt_model_begin refused
static void ckpt_model_abandon(const void *arg) {
    const CkptModelWrite *f = (const CkptModelWrite *)arg;
    unlinkat(f->dfd, f->tmp_name, 0);
}

// the final model, out_dir/model_SSSSSSSS.bin (into path), by every rank of
// a job (both trainers), in -o held open at out_fd: llm.c's v3 file of the
// fp32 parameters, the bytes of a checkpoint's model.bin, sealed when
// job->encrypt (-enc 2). It is written as a checkpoint is, through
// ckpt_write_files: every rank writes its part of NAME.tmp, which rank 0
// then renames into place. So no rank gathers the whole model, and a reader
// never sees a part. Unlike a checkpoint it is one file with no MANIFEST
// (llm.c reads it as it is), so there is no directory to build and nothing
// to prune. Every rank returns the same verdict, 0 when the file is
// complete; on a failure the .tmp that rank 0 made is gone, and err holds
// the line that ckpt_write_files says.
static int ckpt_write_model(const CkptJob *job, int out_fd, const char *out_dir, int steps, const GPT2Config *c,
                            const uint8_t key[32], char *path, size_t pathlen, char *err, size_t errlen) {
    char name[64], tmp_name[72], tmp[4200], label[4300];
    err[0] = '\0';
    snprintf(name, sizeof(name), "model_%08d.bin", steps);
    snprintf(tmp_name, sizeof(tmp_name), "%s.tmp", name);
    snprintf(path, pathlen, "%s/%s", out_dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    snprintf(label, sizeof(label), "%s: rank %d's", tmp, job->rank);
    AeadFileKey cipher;
    if (job->encrypt) aead_file_key(&cipher, key);
    CkptModelWrite f = {out_fd, out_dir, tmp_name, tmp, name, path, c};
    CkptWrite w = {ckpt_model_begin, ckpt_model_finish, ckpt_model_abandon, &f, out_fd, out_dir, tmp_name, NULL,
                   ckpt_file_bytes(0, c), 0, key, label, ckpt_wait_room(c) / 3};
    int rc = ckpt_write_files(job, &w, job->encrypt ? &cipher : NULL, err, errlen);
    if (job->encrypt) aead_file_key_wipe(&cipher);
    return rc;
}

// the line a resumed run starts with (ck NULL: nothing to resume from;
// verify_ms < 0: the files were hashed by the launcher, not here)
static void ckpt_announce(const Options *o, const CkptState *ck, const char *dir, double verify_ms, double load_ms) {
    char verified[64];
    if (verify_ms < 0) snprintf(verified, sizeof(verified), "hashed by the launcher");
    else snprintf(verified, sizeof(verified), "verified in %.0f ms", verify_ms);
    if (ck != NULL)
        printf("resuming from %s: step %d, %llu tokens trained, written by np %d tp %d pp %d ZeRO-%d (%s, loaded in "
               "%.0f ms)\n", dir, ck->step, (unsigned long long)ck->tokens, ck->np, ck->tp, ck->pp, ck->zero, verified,
               load_ms);
    else if (o->resume || o->resume_step >= 0)
        printf("no checkpoint in %s yet: starting from step 0\n", o->out_dir);
}

// set by SIGINT, SIGTERM and SIGHUP when there is an -o to checkpoint into:
// the trainer finishes its step, writes a checkpoint and exits 0. Each
// handler runs once (SA_RESETHAND): a second signal of the kind kills, as a
// user pressing Ctrl-C twice expects. A launcher's ranks get the first
// Ctrl-C both from the terminal (SIGINT) and from it (SIGTERM): one each.
//
// SIGINT and SIGHUP that the process was started with ignored stay ignored,
// as is the Unix convention for a program that catches them: a shell starts
// a background job (`cmd &` without job control) with SIGINT ignored so that
// a Ctrl-C meant for the foreground leaves it running, and nohup ignores
// SIGHUP so that closing the terminal does too; a trainer that caught them
// anyway would stop such a job. SIGTERM is always caught: it is how our
// launcher, schedulers and kill ask a job to stop, and nothing ignores it on
// a job's behalf. (The launcher leaves the ignored ones out of its signalfd
// too: launcher.h's par_stop_signals.)
//
// Those it catches are also blocked here, and stay so while the job is
// checked: the process does not yet know whether it will train (then
// parallel_main unblocks them, and one that came meanwhile reaches this
// handler) or be a launcher (which reads them from its signalfd, the held
// one included). A flag set in a process that turns out to be the launcher
// would be lost.
static volatile sig_atomic_t ckpt_stop_signal;
static void ckpt_on_signal(int sig) { ckpt_stop_signal = sig; }

static void ckpt_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = ckpt_on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigset_t held;
    sigemptyset(&held);
    int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        struct sigaction was;
        if (sigs[i] != SIGTERM && sigaction(sigs[i], NULL, &was) == 0 && !(was.sa_flags & SA_SIGINFO) &&
            was.sa_handler == SIG_IGN)
            continue;  // ignored on entry: left so, and not held (held, it would be queued rather than dropped)
        sigaction(sigs[i], &sa, NULL);
        sigaddset(&held, sigs[i]);
    }
    sigprocmask(SIG_BLOCK, &held, NULL);
}

#endif
