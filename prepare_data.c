/*
 * prepare_data.c: text files in, llm.c token shards out.
 *
 *   ./prepare_data -i input.txt [-i more.txt ...] [-o outdir] [-n name] [-v val_tokens]
 *                  [-e 0|1] [-s shard_tokens] [--encoder PATH --vocab PATH | --bytes]
 *
 * The input files are one stream of documents (one per file), tokenized with
 * GPT-2's BPE (tokenizer.h), or, with --bytes, one token per byte (vocab 256,
 * for the offline quick start). With -e 1 the EOT token goes before every
 * document, the first included (llm.c's convention); otherwise no special
 * token is written, and "<|endoftext|>" in the text is plain text. The first
 * -v tokens go to the val split and the rest to train; each split is cut into
 * shards of at most -s tokens, named like llm.c's:
 *   <outdir>/<name>_val_000000.bin, <outdir>/<name>_train_000000.bin, ...
 * (shard format: tokenizer.h's top comment, doc/tokenizer.md), plus the
 * tokenizer for decoding, <outdir>/<name>_tokenizer.bin.
 *
 * A large file is read and encoded block by block, cut only where the
 * pre-tokenizer is known to cut anyway (bpe_split_point), so the ids are the
 * same as encoding the whole file at once. Each shard is written under a
 * temporary name, fsync'd and renamed when complete, so a shard file with its
 * final name is always whole; shard_finished() is where every one is
 * completed, and where its SHA-256 goes into the manifest.
 *
 * Last, <outdir>/MANIFEST (secure.h's format: name, size and SHA-256 of every
 * file written, and a tag over the list) is written atomically; the
 * dataloader checks shards against it. It is sealed with the all-zero key:
 * data outlives any job key, so the tag is a public checksum that catches a
 * changed, truncated, missing or stray shard, not a forger who can write the
 * directory (doc/security.md, "Data shards"). Other datasets may share the
 * directory: the entries of an earlier MANIFEST there are kept for the files
 * this run did not write, except shards of this -n name that this run no
 * longer writes (stale: they are left off, and a warning names them). An
 * earlier MANIFEST that does not verify stops the run before any work.
 * Two runs writing into one directory at the same time are not supported.
 *
 * Exit status: 0 done, 1 runtime error (nothing is left behind), 2 bad flags.
 */
#include "secure.h"  // first: it asks for _GNU_SOURCE (strdup, fsync); manifests

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"
#include "tokenizer.h"
#include "prepare_hellaswag.h"  // ./prepare_data hellaswag

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 1024
#define DEFAULT_VAL_TOKENS 32768          // llm.c's tinyshakespeare split
#define DEFAULT_SHARD_TOKENS 100000000LL  // llm.c's fineweb shard size
#define MAX_SHARD_TOKENS 2147483647LL     // the header holds the count as an int32
#define READ_BLOCK (4 << 20)
#define PROGRESS_MIN_BYTES (16 << 20)     // smaller inputs finish too fast to need it
#define MAX_NAME_BYTES 238                // with "_train_000000.bin", a manifest's 255-byte names

typedef struct {
    const char **inputs;
    int n_inputs;
    const char *out_dir;
    const char *name;
    long long val_tokens;
    int eot_between;
    long long shard_tokens;
    const char *encoder_path, *vocab_path;
    int bytes;
} Options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: prepare_data -i FILE [-i FILE ...] [options]\n"
            "  -i FILE          input text file, one document each (required, repeatable)\n"
            "  -o DIR           output directory, created if missing (default .); gets a MANIFEST of\n"
            "                   the files written (SHA-256 each), which the dataloader checks\n"
            "  -n NAME          shard name prefix, of [A-Za-z0-9._+-] (default: first input's name\n"
            "                   without extension)\n"
            "  -v N             first N tokens go to the val split, 0..  (default %d)\n"
            "  -e 0|1           EOT token before every document (default 0)\n"
            "  -s N             max tokens per shard, 1..%lld (default %lld)\n"
            "  --encoder PATH   GPT-2 encoder.json  } default: $LLM3D_DATA/gpt2/, else ../shared/data/gpt2/\n"
            "  --vocab PATH     GPT-2 vocab.bpe     }\n"
            "  --bytes          byte-level tokens (vocab 256, EOT = 0) instead of GPT-2 BPE\n",
            DEFAULT_VAL_TOKENS, MAX_SHARD_TOKENS, DEFAULT_SHARD_TOKENS);
}

static void usage_error(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "prepare_data: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (see -h)\n");
    exit(2);
}

static long long parse_count(const char *flag, const char *value, long long min, long long max) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (value[0] == '\0' || *end != '\0' || errno != 0 || v < min || v > max) {
        fprintf(stderr, "prepare_data: %s '%s': want an integer in %lld..%lld (see -h)\n", flag, value, min, max);
        exit(2);
    }
    return v;
}

// name_ok: the shards' names fit the manifest's (secure.h): [A-Za-z0-9._+-], not starting with '.'
static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n > MAX_NAME_BYTES) return 0;
    char longest[MAX_NAME_BYTES + 32];
    snprintf(longest, sizeof(longest), "%s_train_000000.bin", name);
    return manifest_name_ok(longest, strlen(longest));
}

// default_name: the first input's file name without directory and extension,
// other bytes than the manifest allows made '_'
static const char *default_name(const char *path, char *out, size_t outlen) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, outlen < MAX_NAME_BYTES + 1 ? outlen : MAX_NAME_BYTES + 1, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot != NULL && dot != out) *dot = '\0';
    if (out[0] == '\0' || out[0] == '.') snprintf(out, outlen, "data");
    for (char *c = out; *c != '\0'; c++) {
        if (*c != '.' && !manifest_name_ok(c, 1)) *c = '_';
    }
    return out;
}

static void parse_options(Options *o, int argc, char **argv, char *name_buf, size_t name_len) {
    memset(o, 0, sizeof(*o));
    o->inputs = malloc((size_t)argc * sizeof(char *));
    if (o->inputs == NULL) { fprintf(stderr, "prepare_data: out of memory\n"); exit(1); }
    o->out_dir = ".";
    o->val_tokens = DEFAULT_VAL_TOKENS;
    o->shard_tokens = DEFAULT_SHARD_TOKENS;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { usage(stdout); exit(0); }
        if (strcmp(flag, "--bytes") == 0) { o->bytes = 1; continue; }
        int known = strcmp(flag, "-i") == 0 || strcmp(flag, "-o") == 0 || strcmp(flag, "-n") == 0 ||
                    strcmp(flag, "-v") == 0 || strcmp(flag, "-e") == 0 || strcmp(flag, "-s") == 0 ||
                    strcmp(flag, "--encoder") == 0 || strcmp(flag, "--vocab") == 0;
        if (!known) usage_error("unknown flag '%s'%s", flag, "");
        if (i + 1 >= argc) usage_error("%s needs a value%s", flag, "");
        const char *value = argv[++i];
        if (value[0] == '\0') usage_error("%s: empty value%s", flag, "");
        if (strcmp(flag, "-i") == 0) o->inputs[o->n_inputs++] = value;
        else if (strcmp(flag, "-o") == 0) o->out_dir = value;
        else if (strcmp(flag, "-n") == 0) o->name = value;
        else if (strcmp(flag, "-v") == 0) o->val_tokens = parse_count("-v", value, 0, 1LL << 62);
        else if (strcmp(flag, "-e") == 0) o->eot_between = (int)parse_count("-e", value, 0, 1);
        else if (strcmp(flag, "-s") == 0) o->shard_tokens = parse_count("-s", value, 1, MAX_SHARD_TOKENS);
        else if (strcmp(flag, "--encoder") == 0) o->encoder_path = value;
        else o->vocab_path = value;
    }
    if (o->n_inputs == 0) usage_error("no input: give at least one -i FILE%s%s", "", "");
    if (o->bytes && (o->encoder_path || o->vocab_path)) usage_error("--bytes and --encoder/--vocab exclude each other%s%s", "", "");
    if ((o->encoder_path == NULL) != (o->vocab_path == NULL))
        usage_error("%s given without %s", o->encoder_path ? "--encoder" : "--vocab", o->encoder_path ? "--vocab" : "--encoder");
    if (o->name == NULL) o->name = default_name(o->inputs[0], name_buf, name_len);
    if (!name_ok(o->name)) usage_error("-n '%s': want a file name prefix of 1..238 of [A-Za-z0-9._+-], not starting "
                                       "with '.'%s", o->name, "");
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// find_gpt2_files: encoder.json and vocab.bpe in $LLM3D_DATA/gpt2, else ../shared/data/gpt2
static int find_gpt2_files(char *encoder, char *vocab, size_t len) {
    const char *env = getenv("LLM3D_DATA");
    const char *dirs[2] = {env != NULL && env[0] != '\0' ? env : NULL, "../shared/data"};
    for (int k = 0; k < 2; k++) {
        if (dirs[k] == NULL) continue;
        snprintf(encoder, len, "%s/gpt2/encoder.json", dirs[k]);
        snprintf(vocab, len, "%s/gpt2/vocab.bpe", dirs[k]);
        if (access(encoder, R_OK) == 0 && access(vocab, R_OK) == 0) return 0;
    }
    return -1;
}

// ----------------------------------------------------------------------------
// shard writing

typedef struct {
    const char *out_dir, *name;
    long long shard_tokens;
    long long val_left;        // tokens still owed to the val split
    FILE *f;                   // the open shard, or NULL
    int split;                 // of the open shard: 0 val, 1 train
    long long in_shard;        // tokens in the open shard
    char path[4096], tmp_path[4200];
    long long tokens[2];       // per split, in finished shards and the open one
    int shards[2];             // per split, finished shards
    char **done;               // paths of finished shards, to report or to remove on failure
    int n_done, cap_done;
    Manifest written;          // every file of this run, with its size and SHA-256
    unsigned char buf[1 << 16];
} ShardWriter;

static const char *split_names[2] = {"val", "train"};

// shard_finished: the one place where a shard file is complete, under its
// final name; it is hashed now, while its pages are still cached. 0 ok, -1
// with err set.
static int shard_finished(ShardWriter *w, char *err, size_t errlen) {
    const char *base = strrchr(w->path, '/') + 1;  // shard_open made path "<out_dir>/<base>"
    return manifest_add_file(&w->written, w->out_dir, base, err, errlen);
}

static int shard_open(ShardWriter *w, char *err, size_t errlen) {
    w->split = w->val_left > 0 ? 0 : 1;
    int n = snprintf(w->path, sizeof(w->path), "%s/%s_%s_%06d.bin", w->out_dir, w->name, split_names[w->split],
                     w->shards[w->split]);
    if (n < 0 || (size_t)n >= sizeof(w->path)) return errorf(err, errlen, "-o %s: output path too long", w->out_dir);
    snprintf(w->tmp_path, sizeof(w->tmp_path), "%s.tmp", w->path);
    w->f = fopen(w->tmp_path, "wb");
    if (w->f == NULL) return errorf(err, errlen, "%s: cannot create: %s", w->tmp_path, strerror(errno));
    unsigned char header[SHARD_HEADER_BYTES] = {0};  // the count is filled in at the end
    if (fwrite(header, 1, sizeof(header), w->f) != sizeof(header))
        return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(errno));
    w->in_shard = 0;
    return 0;
}

static int shard_close(ShardWriter *w, char *err, size_t errlen) {
    unsigned char header[12];
    tok_put_u32le(header, SHARD_MAGIC);
    tok_put_u32le(header + 4, SHARD_VERSION);
    tok_put_u32le(header + 8, (uint32_t)w->in_shard);
    // fsync before the rename: after a crash, a shard under its final name is whole
    int ok = fseek(w->f, 0, SEEK_SET) == 0 && fwrite(header, 1, sizeof(header), w->f) == sizeof(header) &&
             fflush(w->f) == 0 && fsync(fileno(w->f)) == 0;
    int saved_errno = errno;
    if (fclose(w->f) != 0 && ok) { ok = 0; saved_errno = errno; }
    w->f = NULL;
    if (!ok) return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(saved_errno));
    if (rename(w->tmp_path, w->path) != 0)
        return errorf(err, errlen, "%s: cannot rename to %s: %s", w->tmp_path, w->path, strerror(errno));
    if (w->n_done == w->cap_done) {
        int cap = w->cap_done ? 2 * w->cap_done : 16;
        char **bigger = realloc(w->done, (size_t)cap * sizeof(char *));
        if (bigger == NULL) return errorf(err, errlen, "out of memory");
        w->done = bigger;
        w->cap_done = cap;
    }
    w->done[w->n_done] = strdup(w->path);
    if (w->done[w->n_done] == NULL) return errorf(err, errlen, "out of memory");
    w->n_done++;
    w->shards[w->split]++;
    return shard_finished(w, err, errlen);
}

static int shard_add(ShardWriter *w, const int *ids, size_t n, char *err, size_t errlen) {
    size_t i = 0;
    while (i < n) {
        if (w->f == NULL && shard_open(w, err, errlen) != 0) return -1;
        long long room = w->shard_tokens - w->in_shard;
        if (w->split == 0 && w->val_left < room) room = w->val_left;
        size_t run = (size_t)room < n - i ? (size_t)room : n - i;
        for (size_t done = 0; done < run;) {
            size_t chunk = run - done < sizeof(w->buf) / 2 ? run - done : sizeof(w->buf) / 2;
            for (size_t k = 0; k < chunk; k++) {
                uint16_t id = (uint16_t)ids[i + done + k];
                w->buf[2 * k] = (unsigned char)id;
                w->buf[2 * k + 1] = (unsigned char)(id >> 8);
            }
            if (fwrite(w->buf, 2, chunk, w->f) != chunk) return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(errno));
            done += chunk;
        }
        i += run;
        w->in_shard += (long long)run;
        w->tokens[w->split] += (long long)run;
        if (w->split == 0) w->val_left -= (long long)run;
        if (w->in_shard == w->shard_tokens || (w->split == 0 && w->val_left == 0)) {
            if (shard_close(w, err, errlen) != 0) return -1;
        }
    }
    return 0;
}

// shard_abort: on failure leave nothing behind, not even finished shards
static void shard_abort(ShardWriter *w) {
    if (w->f != NULL) {
        fclose(w->f);
        w->f = NULL;
        remove(w->tmp_path);
    }
    for (int k = 0; k < w->n_done; k++) remove(w->done[k]);
}

static void shard_writer_free(ShardWriter *w) {
    for (int k = 0; k < w->n_done; k++) free(w->done[k]);
    free(w->done);
    manifest_free(&w->written);
}

// ----------------------------------------------------------------------------
// tokenizing the inputs

typedef struct {
    double start, last_print;
    long long bytes_done, bytes_total;
    double encode_seconds;   // time inside the tokenizer alone
} Progress;

static void progress_update(Progress *p, long long more) {
    p->bytes_done += more;
    double t = now_seconds();
    if (p->bytes_total < PROGRESS_MIN_BYTES || t - p->last_print < 1.0) return;
    p->last_print = t;
    fprintf(stderr, "prepare_data: %.1f of %.1f MB, %.1f MB/s\n", p->bytes_done / 1e6, p->bytes_total / 1e6,
            p->bytes_done / 1e6 / (t - p->start));
}

static int encode_block(Bpe *bpe, const char *text, size_t len, ShardWriter *w, Progress *p, char *err, size_t errlen) {
    int *ids = NULL;
    size_t n = 0;
    double t0 = now_seconds();
    if (bpe != NULL) {
        if (bpe_encode(bpe, text, len, 0, &ids, &n) != 0) return errorf(err, errlen, "out of memory encoding a block");
    } else {  // byte-level: each byte is its token
        ids = malloc((len ? len : 1) * sizeof(int));
        if (ids == NULL) return errorf(err, errlen, "out of memory encoding a block");
        for (size_t i = 0; i < len; i++) ids[i] = (unsigned char)text[i];
        n = len;
    }
    p->encode_seconds += now_seconds() - t0;
    int rc = shard_add(w, ids, n, err, errlen);
    free(ids);
    progress_update(p, (long long)len);
    return rc;
}

static int tokenize_file(const char *path, Bpe *bpe, ShardWriter *w, Progress *p, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return errorf(err, errlen, "-i %s: cannot open: %s", path, strerror(errno));
    size_t cap = READ_BLOCK, have = 0;
    char *buf = malloc(cap);
    int rc = buf == NULL ? errorf(err, errlen, "out of memory") : 0;
    while (rc == 0) {
        size_t got = fread(buf + have, 1, cap - have, f);
        have += got;
        if (ferror(f)) { rc = errorf(err, errlen, "-i %s: read error: %s", path, strerror(errno)); break; }
        int at_end = got == 0 || feof(f);
        if (!at_end && have < cap) continue;
        // cut at a boundary the pre-tokenizer would cut at anyway; a block
        // without one (a huge line) grows until it has one
        size_t cut = at_end ? have : bpe != NULL ? bpe_split_point(buf, have) : have;
        if (cut == 0 && !at_end) {
            char *bigger = realloc(buf, 2 * cap);
            if (bigger == NULL) { rc = errorf(err, errlen, "-i %s: out of memory for a %zu MB line", path, cap >> 19); break; }
            buf = bigger;
            cap *= 2;
            continue;
        }
        rc = encode_block(bpe, buf, cut, w, p, err, errlen);
        memmove(buf, buf + cut, have - cut);
        have -= cut;
        if (at_end) break;
    }
    free(buf);
    fclose(f);
    return rc;
}

// check_paths: the inputs are readable files (their total size into
// *bytes_total) and the output directory exists or is made. 0 ok, 1 error.
static int check_paths(const Options *o, long long *bytes_total) {
    *bytes_total = 0;
    struct stat st;
    for (int k = 0; k < o->n_inputs; k++) {
        if (stat(o->inputs[k], &st) != 0) { fprintf(stderr, "prepare_data: -i %s: %s\n", o->inputs[k], strerror(errno)); return 1; }
        if (!S_ISREG(st.st_mode)) { fprintf(stderr, "prepare_data: -i %s: not a regular file\n", o->inputs[k]); return 1; }
        *bytes_total += (long long)st.st_size;
    }
    if (stat(o->out_dir, &st) != 0) {
        if (mkdir(o->out_dir, 0755) != 0) {
            fprintf(stderr, "prepare_data: -o %s: cannot create directory: %s\n", o->out_dir, strerror(errno));
            return 1;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "prepare_data: -o %s: exists and is not a directory\n", o->out_dir);
        return 1;
    }
    return 0;
}

// load_bpe: GPT-2's encoder from the flags' files or the data directory.
// 0 ok, 1 error (nothing left to free).
static int load_bpe(const Options *o, Bpe *bpe) {
    char encoder[4096], vocab[4096], err[1024];
    if (o->encoder_path != NULL) {
        snprintf(encoder, sizeof(encoder), "%s", o->encoder_path);
        snprintf(vocab, sizeof(vocab), "%s", o->vocab_path);
    } else if (find_gpt2_files(encoder, vocab, sizeof(encoder)) != 0) {
        const char *env = getenv("LLM3D_DATA");
        fprintf(stderr, "prepare_data: no gpt2/encoder.json + gpt2/vocab.bpe in $LLM3D_DATA (%s) or ../shared/data; "
                "give --encoder and --vocab, or use --bytes\n", env != NULL && env[0] != '\0' ? env : "unset");
        return 1;
    }
    double t0 = now_seconds();
    if (bpe_load(bpe, encoder, vocab, err, sizeof(err)) != 0) { fprintf(stderr, "prepare_data: %s\n", err); return 1; }
    fprintf(stderr, "prepare_data: loaded %s and %s (%d tokens, %d merges) in %.3f s\n", encoder, vocab, bpe->vocab_size,
            bpe->merge_count, now_seconds() - t0);
    if (bpe->vocab_size > 65536) {
        fprintf(stderr, "prepare_data: --encoder %s: %d tokens don't fit the shards' uint16\n", encoder, bpe->vocab_size);
        bpe_free(bpe);
        return 1;
    }
    if (bpe->eot < 0) {
        fprintf(stderr, "prepare_data: --encoder %s: no \"%s\" token (needed for -e and the tokenizer .bin)\n", encoder,
                BPE_EOT_TEXT);
        bpe_free(bpe);
        return 1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the manifest

// read_old_manifest: an earlier <out_dir>/MANIFEST into *old, empty when there
// is none. Its entries will be carried over, so it must verify. 0 ok, 1 error.
static int read_old_manifest(const char *out_dir, Manifest *old) {
    old->n = 0;
    old->e = NULL;
    char path[4200], err[1024];
    snprintf(path, sizeof(path), "%s/MANIFEST", out_dir);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) return 0;
    if (manifest_read(old, out_dir, "MANIFEST", NULL, err, sizeof(err)) == 0) return 0;
    fprintf(stderr, "prepare_data: -o %s: %s; this run would rewrite that list: move the file away, or write to "
            "another directory\n", out_dir, err);
    return 1;
}

// own_shard_name: is file_name a shard of the dataset called name, by any
// run: "<name>_val_<digits>.bin" or "<name>_train_<digits>.bin"
static int own_shard_name(const char *file_name, const char *name) {
    size_t n = strlen(name), len = strlen(file_name);
    if (len < n + 4 || strncmp(file_name, name, n) != 0 || strcmp(file_name + len - 4, ".bin") != 0) return 0;
    const char *rest = file_name + n;
    if (strncmp(rest, "_val_", 5) == 0) rest += 5;
    else if (strncmp(rest, "_train_", 7) == 0) rest += 7;
    else return 0;
    const char *digits_end = file_name + len - 4;
    if (rest == digits_end) return 0;
    for (; rest < digits_end; rest++) {
        if (*rest < '0' || *rest > '9') return 0;
    }
    return 1;
}

// warn_stale_shards: shards of this name that this run did not write (an
// earlier run made more of them) would be refused by the dataloader, as they
// are not in the new manifest; they are the user's to remove, not ours
static void warn_stale_shards(const char *out_dir, const char *name, const Manifest *written) {
    DIR *d = opendir(out_dir);
    if (d == NULL) return;
    struct dirent *entry;
    while ((entry = readdir(d)) != NULL) {
        if (!own_shard_name(entry->d_name, name) || manifest_find(written, entry->d_name) != NULL) continue;
        fprintf(stderr, "prepare_data: warning: %s/%s is from an earlier run and not in the new MANIFEST, so the "
                "dataloader will refuse it: remove it\n", out_dir, entry->d_name);
    }
    closedir(d);
}

static int entry_name_order(const void *a, const void *b) {
    return strcmp(((const ManifestEntry *)a)->name, ((const ManifestEntry *)b)->name);
}

// write_manifest: <out_dir>/MANIFEST, last and atomically: the files this run
// wrote, and the entries of the earlier manifest for files still there that
// this run neither rewrote nor made stale. *kept gets how many were carried.
static int write_manifest(const Options *o, const Manifest *written, const Manifest *old, int *kept,
                          char *err, size_t errlen) {
    Manifest all = {0, NULL};
    all.e = (ManifestEntry *)malloc((size_t)(written->n + old->n + 1) * sizeof(ManifestEntry));
    if (all.e == NULL) return errorf(err, errlen, "out of memory for a manifest of %d files", written->n + old->n);
    memcpy(all.e, written->e, (size_t)written->n * sizeof(ManifestEntry));
    all.n = written->n;
    *kept = 0;
    for (int i = 0; i < old->n; i++) {
        const ManifestEntry *e = &old->e[i];
        if (manifest_find(written, e->name) != NULL || own_shard_name(e->name, o->name)) continue;
        char path[4400];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", o->out_dir, e->name);
        if (lstat(path, &st) != 0 && errno == ENOENT) continue;  // gone: the list describes the directory
        all.e[all.n++] = *e;
        (*kept)++;
    }
    qsort(all.e, (size_t)all.n, sizeof(ManifestEntry), entry_name_order);
    int rc = manifest_write(&all, o->out_dir, "MANIFEST", NULL, err, errlen);  // NULL: the public all-zero key
    free(all.e);
    return rc;
}

// ----------------------------------------------------------------------------
// main

// write_dataset: every input into shards, then the tokenizer .bin, then the
// MANIFEST; prints the counts. bpe NULL means byte-level. 0 ok, 1 error (with
// nothing left behind).
static int write_dataset(const Options *o, Bpe *bpe, long long bytes_total, const Manifest *old) {
    char err[1024];
    int vocab_size = bpe ? bpe->vocab_size : 256, eot = bpe ? bpe->eot : 0;
    ShardWriter *w = calloc(1, sizeof(ShardWriter));
    if (w == NULL) { fprintf(stderr, "prepare_data: out of memory\n"); return 1; }
    w->out_dir = o->out_dir;
    w->name = o->name;
    w->shard_tokens = o->shard_tokens;
    w->val_left = o->val_tokens;
    Progress p = {now_seconds(), now_seconds(), 0, bytes_total, 0.0};
    int rc = 0;
    for (int k = 0; rc == 0 && k < o->n_inputs; k++) {
        if (o->eot_between) rc = shard_add(w, &eot, 1, err, sizeof(err));
        if (rc == 0) rc = tokenize_file(o->inputs[k], bpe, w, &p, err, sizeof(err));
    }
    if (rc == 0 && w->f != NULL) rc = shard_close(w, err, sizeof(err));
    long long total = w->tokens[0] + w->tokens[1];
    if (rc == 0 && w->tokens[1] == 0)
        rc = errorf(err, sizeof(err), "only %lld tokens, all taken by -v %lld: the train split would be empty; "
                    "give more text or a smaller -v", total, o->val_tokens);
    char tok_path[4200];
    snprintf(tok_path, sizeof(tok_path), "%s/%s_tokenizer.bin", o->out_dir, o->name);
    int tok_written = 0, kept = 0;
    if (rc == 0) rc = bpe ? bpe_write_tokenizer_bin(bpe, tok_path, err, sizeof(err)) : tokenizer_write_bytes_bin(tok_path, err, sizeof(err));
    if (rc == 0) {
        tok_written = 1;
        rc = manifest_add_file(&w->written, o->out_dir, strrchr(tok_path, '/') + 1, err, sizeof(err));
    }
    if (rc == 0) rc = write_manifest(o, &w->written, old, &kept, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "prepare_data: %s\n", err);
        if (tok_written) remove(tok_path);
        shard_abort(w);
        shard_writer_free(w);
        free(w);
        return 1;
    }
    double seconds = now_seconds() - p.start;
    printf("prepare_data: %lld tokens from %d file%s (%lld bytes) in %.2f s; tokenizer alone %.1f MB/s\n", total, o->n_inputs,
           o->n_inputs == 1 ? "" : "s", bytes_total, seconds, p.encode_seconds > 0 ? bytes_total / 1e6 / p.encode_seconds : 0.0);
    int first = 0;
    for (int split = 0; split < 2; split++) {
        int count = w->shards[split];
        if (count == 0) { printf("prepare_data: %-5s 0 tokens (-v 0)\n", split_names[split]); continue; }
        printf("prepare_data: %-5s %lld tokens in %d shard%s: %s%s%s\n", split_names[split], w->tokens[split], count,
               count == 1 ? "" : "s", w->done[first], count > 1 ? " .. " : "", count > 1 ? w->done[first + count - 1] : "");
        first += count;
    }
    printf("prepare_data: tokenizer %s (%s, vocab %d, EOT %d)\n", tok_path, bpe ? "GPT-2 BPE" : "bytes", vocab_size, eot);
    printf("prepare_data: manifest %s/MANIFEST: %d files of this run", o->out_dir, w->written.n);
    if (kept > 0) printf(", %d kept from the earlier one", kept);
    printf(" (SHA-256, public all-zero key)\n");
    warn_stale_shards(o->out_dir, o->name, &w->written);
    shard_writer_free(w);
    free(w);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "hellaswag") == 0) return prepare_hellaswag_main(argc - 1, argv + 1);
    Options o;
    char name_buf[256];
    parse_options(&o, argc, argv, name_buf, sizeof(name_buf));
    long long bytes_total;
    Bpe bpe;
    Manifest old = {0, NULL};
    int rc = check_paths(&o, &bytes_total);
    if (rc == 0) rc = read_old_manifest(o.out_dir, &old);
    if (rc == 0 && !o.bytes) rc = load_bpe(&o, &bpe);
    if (rc == 0) {
        rc = write_dataset(&o, o.bytes ? NULL : &bpe, bytes_total, &old);
        if (!o.bytes) bpe_free(&bpe);
    }
    manifest_free(&old);
    free(o.inputs);
    return rc;
}
