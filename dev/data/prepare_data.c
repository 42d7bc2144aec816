/*
 * prepare_data.c: text in, llm.c token shards out.
 *
 *   ./prepare_data -i PATH [-i PATH ...] [-o outdir] [-n name] [-v val_tokens | --val-shard]
 *                  [-e 0|1] [-s shard_tokens] [-t threads] [--block bytes] [--field NAME]
 *                  [--encoder PATH --vocab PATH | --bytes] [--key-file PATH]
 *
 * Inputs. Each -i is a text file (one document), a JSON-lines file (a name
 * ending in .jsonl: one document per line, the string in its "text" field, or
 * --field's), or a directory, whose files are taken as the same two kinds, in
 * the byte order of their names, subdirectories included, names starting
 * with '.' left out. The documents are one stream, in the order given. They
 * are tokenized with GPT-2's BPE (tokenizer.h), or, with --bytes, one token
 * per byte (vocab 256, for the offline quick start). With -e 1 the EOT token
 * goes before every document, the first included (llm.c's convention: its
 * fineweb.py does the same); -e defaults to 1 when an input is JSON lines or
 * a directory, else to 0, so a single text file is tokenized as it always
 * was. Without EOT, "<|endoftext|>" in the text is plain text either way.
 *
 * Splits and shards. The first -v tokens go to the val split and the rest to
 * train; each split is cut into shards of at most -s tokens, named like
 * llm.c's tinyshakespeare.py, each split numbered from 0:
 *   <outdir>/<name>_val_000000.bin, <outdir>/<name>_train_000000.bin, ...
 * With --val-shard, the first whole shard is val and shards are numbered
 * across both splits, as llm.c's fineweb.py names them:
 *   <name>_val_000000.bin, <name>_train_000001.bin, <name>_train_000002.bin, ...
 * (shard format: tokenizer.h's top comment, doc/tokenizer.md), plus the
 * tokenizer for decoding, <outdir>/<name>_tokenizer.bin.
 *
 * Threads. The main thread reads the inputs in blocks of about 1 MB (a text
 * file cut only where the pre-tokenizer is known to cut anyway,
 * bpe_split_point; a JSON-lines file cut after a line), -t worker threads
 * encode the blocks, each with its own copy of the BPE cache, and the main
 * thread writes the blocks' tokens in input order. So the shards are the same
 * bytes for any -t, and the same as encoding each document whole. Each shard
 * is written under a temporary name, fsync'd and renamed when complete, so a
 * shard file with its final name is always whole; shard_finished() is where
 * every one is completed, and where its SHA-256 goes into the manifest.
 *
 * Last, <outdir>/MANIFEST (manifest.h's format: name, size and SHA-256 of every
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
 * Encryption at rest. With --key-file (the trainer's flag, the same file),
 * every shard is written as aead.h's sealed file instead: AES-256-GCM in
 * chunks of 1 MiB under a key derived from that key, a tag per chunk. Its
 * plaintext is the shard with version 2 in its header and its file name in
 * it too, so that the trainer refuses it under any other name. The
 * shard is built in memory and written sealed, so no plaintext copy of it
 * reaches the disk; the MANIFEST lists the sealed bytes, hashed as each
 * chunk is encrypted and tagged in memory on its way out (nothing is read
 * back). The tokenizer .bin stays plain: it is GPT-2's public vocabulary.
 * The trainer reads such shards when given the same --key-file
 * (dataloader.h, "Encrypted shards").
 *
 * Exit status: 0 done, 1 runtime error (nothing is left behind), 2 bad flags
 * (--field when no input is JSON lines among them: the run would take the
 * inputs whole as text, not their field), a --key-file that is no key file
 * too, in the trainers' form:
 * "prepare_data: flag --key-file (the key to encrypt the shards under): k:
 * No such file or directory".
 */
#include "llm3d/secure/aead.h"      // first: through secure.h it asks for _GNU_SOURCE (strdup, fsync); sealed shards
#include "llm3d/secure/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/files.h"
#include "llm3d/json.h"
#include "llm3d/tokenizer.h"
#include "dev/data/prepare_hellaswag.h"  // ./prepare_data hellaswag

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_VERSION_SEALED 2            // a sealed shard's plaintext: its file name in the header (dataloader.h)
#define SHARD_NAME_OFFSET 16
#define SHARD_HEADER_BYTES 1024
#define DEFAULT_VAL_TOKENS 32768          // llm.c's tinyshakespeare split
#define DEFAULT_SHARD_TOKENS 100000000LL  // llm.c's fineweb shard size
#define MAX_SHARD_TOKENS 2147483647LL     // the header holds the count as an int32
#define DEFAULT_BLOCK_BYTES (1 << 20)     // what one worker encodes at a time
#define MAX_THREADS 1024
#define MAX_DIR_DEPTH 64                  // deeper is a loop of links more likely than data
#define PROGRESS_MIN_BYTES (16 << 20)     // smaller inputs finish too fast to need it
#define MAX_NAME_BYTES 238                // with "_train_000000.bin", a manifest's 255-byte names

typedef struct {
    const char **inputs;
    int n_inputs;
    const char *out_dir;
    const char *name;
    long long val_tokens;
    int val_shard;             // --val-shard: the first shard is val, numbers run across both splits
    int eot_between;           // -1 until decided: given by -e, else from the inputs' kinds
    long long shard_tokens;
    int threads;
    long long block_bytes;     // input per block a worker encodes
    const char *field;
    int field_given;           // --field was given: some input must be JSON lines
    const char *encoder_path, *vocab_path;
    int bytes;
    const char *key_file;      // --key-file: shards sealed under this key
} Options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: prepare_data -i PATH [-i PATH ...] [options]\n"
            "  -i PATH          input (required, repeatable): a text file, one document; a .jsonl file,\n"
            "                   one document per line (its --field string); or a directory of such\n"
            "                   files, taken in name order, subdirectories too, dot-names left out\n"
            "  -o DIR           output directory, created if missing (default .); gets a MANIFEST of\n"
            "                   the files written (SHA-256 each), which the dataloader checks\n"
            "  -n NAME          shard name prefix, of [A-Za-z0-9._+-] (default: first input's name\n"
            "                   without extension)\n"
            "  -v N             first N tokens go to the val split, 0..  (default %d)\n"
            "  --val-shard      instead of -v: the first shard is val, and shards are numbered across\n"
            "                   both splits, as llm.c's fineweb.py: NAME_val_000000, NAME_train_000001, ..\n"
            "  -e 0|1           EOT token before every document (default 1 when an input is .jsonl or\n"
            "                   a directory, else 0)\n"
            "  -s N             max tokens per shard, 1..%lld (default %lld)\n"
            "  -t N             encoding threads, 1..%d (default: the cores online, here %ld)\n"
            "  --block N        bytes of input a thread encodes at a time, 64..2^30 (default %d);\n"
            "                   the output is the same for any value (the tests use small ones)\n"
            "  --field NAME     the JSON-lines field holding each document (default text; refused when no\n"
            "                   input is .jsonl)\n"
            "  --encoder PATH   GPT-2 encoder.json  } default: $LLM3D_DATA/gpt2/, else ../shared/data/gpt2/\n"
            "  --vocab PATH     GPT-2 vocab.bpe     }\n"
            "  --bytes          byte-level tokens (vocab 256, EOT = 0) instead of GPT-2 BPE\n"
            "  --key-file PATH  encrypt the shards (AES-256-GCM) under this key: 64 hex digits, mode\n"
            "                   0600; the trainer reads them given the same file as its --key-file\n",
            DEFAULT_VAL_TOKENS, MAX_SHARD_TOKENS, DEFAULT_SHARD_TOKENS, MAX_THREADS, sysconf(_SC_NPROCESSORS_ONLN),
            DEFAULT_BLOCK_BYTES);
}

static __attribute__((format(printf, 1, 2))) void usage_error(const char *fmt, ...) {
    fprintf(stderr, "prepare_data: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
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

// name_ok: the shards' names fit the manifest's (manifest.h): [A-Za-z0-9._+-], not starting with '.'
static int name_ok(const char *name) {
    size_t n = strlen(name);
    if (n > MAX_NAME_BYTES) return 0;
    char longest[MAX_NAME_BYTES + 32];
    snprintf(longest, sizeof(longest), "%s_train_000000.bin", name);
    return manifest_name_ok(longest, strlen(longest));
}

// default_name: the first input's file or directory name without its
// directory and extension, other bytes than the manifest allows made '_'
static const char *default_name(const char *path, char *out, size_t outlen) {
    char trimmed[4096];
    snprintf(trimmed, sizeof(trimmed), "%s", path);
    for (size_t n = strlen(trimmed); n > 1 && trimmed[n - 1] == '/'; n--) trimmed[n - 1] = '\0';  // "dir/" names dir
    const char *base = strrchr(trimmed, '/');
    base = base ? base + 1 : trimmed;
    snprintf(out, outlen < MAX_NAME_BYTES + 1 ? outlen : MAX_NAME_BYTES + 1, "%s", base);
    char *dot = strrchr(out, '.');
    if (dot != NULL && dot != out) *dot = '\0';
    if (out[0] == '\0' || out[0] == '.') snprintf(out, outlen, "data");
    for (char *c = out; *c != '\0'; c++) {
        if (*c != '.' && !manifest_name_ok(c, 1)) *c = '_';
    }
    return out;
}

static int default_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static void parse_options(Options *o, int argc, char **argv, char *name_buf, size_t name_len) {
    memset(o, 0, sizeof(*o));
    o->inputs = malloc((size_t)argc * sizeof(char *));
    if (o->inputs == NULL) { fprintf(stderr, "prepare_data: out of memory\n"); exit(1); }
    o->out_dir = ".";
    o->val_tokens = DEFAULT_VAL_TOKENS;
    o->eot_between = -1;
    o->shard_tokens = DEFAULT_SHARD_TOKENS;
    o->threads = default_threads();
    o->block_bytes = DEFAULT_BLOCK_BYTES;
    o->field = "text";
    int v_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { usage(stdout); exit(0); }
        if (strcmp(flag, "--bytes") == 0) { o->bytes = 1; continue; }
        if (strcmp(flag, "--val-shard") == 0) { o->val_shard = 1; continue; }
        int known = strcmp(flag, "-i") == 0 || strcmp(flag, "-o") == 0 || strcmp(flag, "-n") == 0 ||
                    strcmp(flag, "-v") == 0 || strcmp(flag, "-e") == 0 || strcmp(flag, "-s") == 0 ||
                    strcmp(flag, "-t") == 0 || strcmp(flag, "--field") == 0 || strcmp(flag, "--block") == 0 ||
                    strcmp(flag, "--encoder") == 0 || strcmp(flag, "--vocab") == 0 || strcmp(flag, "--key-file") == 0;
        if (!known) usage_error("unknown flag '%s'", flag);
        if (i + 1 >= argc) usage_error("%s needs a value", flag);
        const char *value = argv[++i];
        if (value[0] == '\0') usage_error("%s: empty value", flag);
        if (strcmp(flag, "-i") == 0) o->inputs[o->n_inputs++] = value;
        else if (strcmp(flag, "-o") == 0) o->out_dir = value;
        else if (strcmp(flag, "-n") == 0) o->name = value;
        else if (strcmp(flag, "-v") == 0) { o->val_tokens = parse_count("-v", value, 0, 1LL << 62); v_given = 1; }
        else if (strcmp(flag, "-e") == 0) o->eot_between = (int)parse_count("-e", value, 0, 1);
        else if (strcmp(flag, "-s") == 0) o->shard_tokens = parse_count("-s", value, 1, MAX_SHARD_TOKENS);
        else if (strcmp(flag, "-t") == 0) o->threads = (int)parse_count("-t", value, 1, MAX_THREADS);
        else if (strcmp(flag, "--block") == 0) o->block_bytes = parse_count("--block", value, 64, 1LL << 30);
        else if (strcmp(flag, "--field") == 0) { o->field = value; o->field_given = 1; }
        else if (strcmp(flag, "--encoder") == 0) o->encoder_path = value;
        else if (strcmp(flag, "--key-file") == 0) o->key_file = value;
        else o->vocab_path = value;
    }
    if (o->n_inputs == 0) usage_error("no input: give at least one -i PATH");
    if (o->bytes && (o->encoder_path || o->vocab_path)) usage_error("--bytes and --encoder/--vocab exclude each other");
    if ((o->encoder_path == NULL) != (o->vocab_path == NULL))
        usage_error("%s given without %s", o->encoder_path ? "--encoder" : "--vocab", o->encoder_path ? "--vocab" : "--encoder");
    if (o->val_shard && v_given) usage_error("--val-shard and -v exclude each other: the val split is the first shard (-s)");
    if (o->val_shard) o->val_tokens = o->shard_tokens;
    if (o->name == NULL) o->name = default_name(o->inputs[0], name_buf, name_len);
    if (!name_ok(o->name)) usage_error("-n '%s': want a file name prefix of 1..238 of [A-Za-z0-9._+-], not starting "
                                       "with '.'%s", o->name, "");
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// the input files: -i paths, directories walked, each file's kind

enum { INPUT_TEXT, INPUT_JSONL };

typedef struct {
    char *path;
    int kind;                  // INPUT_TEXT: one document; INPUT_JSONL: one per line
    long long size;
} InputFile;

typedef struct {
    InputFile *files;
    int n, cap;
    long long bytes;           // their sizes added up
    int many_documents;        // some -i is a directory or a JSON-lines file
} InputList;

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int input_add_file(InputList *l, const char *path, long long size) {
    static const char *packed[] = {".gz", ".zst", ".bz2", ".xz", ".zip", ".parquet", ".arrow"};
    for (size_t k = 0; k < sizeof(packed) / sizeof(packed[0]); k++) {
        if (!ends_with(path, packed[k])) continue;
        fprintf(stderr, "prepare_data: -i %s: a %s file is not text; unpack it first (dev/data/hf_to_jsonl.py turns parquet or a "
                "Hugging Face dataset into .jsonl)\n", path, packed[k]);
        return -1;
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        InputFile *bigger = realloc(l->files, (size_t)cap * sizeof(InputFile));
        if (bigger == NULL) { fprintf(stderr, "prepare_data: out of memory listing the inputs\n"); return -1; }
        l->files = bigger;
        l->cap = cap;
    }
    InputFile *f = &l->files[l->n];
    f->path = strdup(path);
    if (f->path == NULL) { fprintf(stderr, "prepare_data: out of memory listing the inputs\n"); return -1; }
    f->kind = ends_with(path, ".jsonl") ? INPUT_JSONL : INPUT_TEXT;
    f->size = size;
    l->n++;
    l->bytes += size;
    if (f->kind == INPUT_JSONL) l->many_documents = 1;
    return 0;
}

static int not_hidden(const struct dirent *e) { return e->d_name[0] != '.'; }

// byte order, whatever the locale (alphasort would follow LC_COLLATE)
static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

// input_add_path: a file, or every file under a directory in name order; 0 ok, -1 after printing why
static int input_add_path(InputList *l, const char *path, int depth) {
    struct stat st;
    if (stat(path, &st) != 0) { fprintf(stderr, "prepare_data: -i %s: %s\n", path, strerror(errno)); return -1; }
    if (S_ISREG(st.st_mode)) return input_add_file(l, path, (long long)st.st_size);
    if (!S_ISDIR(st.st_mode)) { fprintf(stderr, "prepare_data: -i %s: not a regular file or a directory\n", path); return -1; }
    if (depth >= MAX_DIR_DEPTH) { fprintf(stderr, "prepare_data: -i %s: directories nested deeper than %d\n", path, MAX_DIR_DEPTH); return -1; }
    l->many_documents = 1;
    struct dirent **names;
    int n = scandir(path, &names, not_hidden, by_name);
    if (n < 0) { fprintf(stderr, "prepare_data: -i %s: cannot list: %s\n", path, strerror(errno)); return -1; }
    int rc = 0;
    for (int k = 0; k < n; k++) {
        char child[4096];
        int len = snprintf(child, sizeof(child), "%s%s%s", path, ends_with(path, "/") ? "" : "/", names[k]->d_name);
        if (rc == 0 && (len < 0 || (size_t)len >= sizeof(child))) {
            fprintf(stderr, "prepare_data: -i %s: a path under it is too long\n", path);
            rc = -1;
        }
        if (rc == 0) rc = input_add_path(l, child, depth + 1);
        free(names[k]);
    }
    free(names);
    return rc;
}

static void input_list_free(InputList *l) {
    for (int k = 0; k < l->n; k++) free(l->files[k].path);
    free(l->files);
    memset(l, 0, sizeof(*l));
}

// check_paths: the inputs, listed into *l, and the output directory, made if
// missing (*made_dir 1 then, so that a failed run removes it again). 0 ok, 1
// error, 2 --field with no JSON-lines input: every input would be taken
// whole as text, JSON syntax and all, which is not what --field asks for.
static int check_paths(const Options *o, InputList *l, int *made_dir) {
    *made_dir = 0;
    memset(l, 0, sizeof(*l));
    int jsonl = 0;
    for (int k = 0; k < o->n_inputs; k++) {
        int before = l->n;
        if (input_add_path(l, o->inputs[k], 0) != 0) return 1;
        if (l->n == before) { fprintf(stderr, "prepare_data: -i %s: no files in it\n", o->inputs[k]); return 1; }
    }
    for (int k = 0; k < l->n; k++) jsonl += l->files[k].kind == INPUT_JSONL;
    if (o->field_given && jsonl == 0) {
        fprintf(stderr, "prepare_data: --field %s: no input is JSON lines (a name ending in .jsonl), so no field "
                "would be read and every input would be taken whole as text\n", o->field);
        return 2;
    }
    struct stat st;
    if (stat(o->out_dir, &st) != 0) {
        if (mkdir(o->out_dir, 0755) != 0) {
            fprintf(stderr, "prepare_data: -o %s: cannot create directory: %s\n", o->out_dir, strerror(errno));
            return 1;
        }
        *made_dir = 1;
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "prepare_data: -o %s: exists and is not a directory\n", o->out_dir);
        return 1;
    }
    return 0;
}
// ----------------------------------------------------------------------------
// shard writing

typedef struct {
    const char *out_dir, *name;
    long long shard_tokens;
    long long val_left;        // tokens still owed to the val split
    int numbers_across;        // --val-shard: train shards are numbered after the val shards
    FILE *f;                   // the open shard, or NULL
    int split;                 // of the open shard: 0 val, 1 train
    long long in_shard;        // tokens in the open shard
    char path[4096], tmp_path[4200];
    long long tokens[2];       // per split, in finished shards and the open one
    int shards[2];             // per split, finished shards
    char **done;               // paths of finished shards, to report or to remove on failure
    int n_done, cap_done;
    Manifest written;          // every file of this run, with its size and SHA-256
    const AeadFileKey *cipher; // --key-file: the open shard is built in plain, written sealed at close
    uint8_t *plain;            // then: the open shard's bytes, header first
    size_t plain_bytes, plain_cap;
    unsigned char buf[1 << 16];
} ShardWriter;

static const char *split_names[2] = {"val", "train"};

// shard_finished: the one place where a shard file is complete, under its
// final name. A plain one is hashed now, while its pages are still cached;
// a sealed one was hashed as it was written (sealed_sha, of its
// sealed_bytes). 0 ok, -1 with err set.
static int shard_finished(ShardWriter *w, const uint8_t sealed_sha[32], uint64_t sealed_bytes, char *err,
                          size_t errlen) {
    const char *base = strrchr(w->path, '/') + 1;  // shard_open made path "<out_dir>/<base>"
    if (w->cipher != NULL) return manifest_add_entry(&w->written, base, sealed_bytes, sealed_sha, err, errlen);
    return manifest_add_file(&w->written, w->out_dir, base, err, errlen);
}

// bytes of the open shard: into the file, or, when sealing, into memory.
// 0, or -1 with errno
static int shard_write(ShardWriter *w, const void *bytes, size_t n) {
    if (w->cipher == NULL) return fwrite(bytes, 1, n, w->f) == n ? 0 : -1;
    if (w->plain_bytes + n > w->plain_cap) {
        size_t cap = w->plain_cap ? w->plain_cap : (1u << 20);
        while (cap < w->plain_bytes + n) cap *= 2;
        uint8_t *grown = (uint8_t *)realloc(w->plain, cap);
        if (grown == NULL) { errno = ENOMEM; return -1; }
        w->plain = grown;
        w->plain_cap = cap;
    }
    memcpy(w->plain + w->plain_bytes, bytes, n);
    w->plain_bytes += n;
    return 0;
}

static int shard_open(ShardWriter *w, char *err, size_t errlen) {
    w->split = w->val_left > 0 ? 0 : 1;
    int number = w->shards[w->split] + (w->split == 1 && w->numbers_across ? w->shards[0] : 0);
    int n = snprintf(w->path, sizeof(w->path), "%s/%s_%s_%06d.bin", w->out_dir, w->name, split_names[w->split], number);
    if (n < 0 || (size_t)n >= sizeof(w->path)) return errorf(err, errlen, "-o %s: output path too long", w->out_dir);
    w->f = fopen_tmp(w->path, w->tmp_path, sizeof(w->tmp_path), err, errlen);  // never through a link planted in -o
    if (w->f == NULL) return -1;
    unsigned char header[SHARD_HEADER_BYTES] = {0};  // the count is filled in at the end
    w->in_shard = 0;
    w->plain_bytes = 0;
    if (shard_write(w, header, sizeof(header)) != 0)
        return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(errno));
    return 0;
}

// the sealed shard: the plaintext built in memory, encrypted into the empty
// temporary file chunk by chunk, each tagged and hashed from memory as it
// goes out, the file's SHA-256 into sha; 0 or -1 with err set
static int shard_write_sealed(ShardWriter *w, uint8_t sha[32], char *err, size_t errlen) {
    return aead_file_write_all(fileno(w->f), w->cipher, w->plain, w->plain_bytes, AEAD_FILE_CHUNK_BYTES, sha,
                               w->tmp_path, err, errlen);
}

static int shard_close(ShardWriter *w, char *err, size_t errlen) {
    unsigned char header[12];
    tok_put_u32le(header, SHARD_MAGIC);
    tok_put_u32le(header + 4, w->cipher != NULL ? SHARD_VERSION_SEALED : SHARD_VERSION);
    tok_put_u32le(header + 8, (uint32_t)w->in_shard);
    // fclose_rename fsyncs before the rename: after a crash, a shard under its final name is whole
    uint8_t sealed_sha[32] = {0};
    if (w->cipher != NULL) {
        // the file name goes into the plaintext header, under the chunk tags:
        // the loader refuses the shard under any other name (val copied over
        // train, two shards swapped), which only the key's holder could forge
        const char *base = strrchr(w->path, '/') + 1;  // shard_open made path "<out_dir>/<base>"
        size_t name_len = strlen(base);
        if (name_len > 255) return errorf(err, errlen, "%s: name over 255 bytes", w->path);
        memcpy(w->plain, header, sizeof(header));
        tok_put_u32le(w->plain + sizeof(header), (uint32_t)name_len);
        memcpy(w->plain + SHARD_NAME_OFFSET, base, name_len);
        if (shard_write_sealed(w, sealed_sha, err, errlen) != 0) return -1;  // shard_abort removes the file
    } else if (fseek(w->f, 0, SEEK_SET) != 0 || fwrite(header, 1, sizeof(header), w->f) != sizeof(header)) {
        return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(errno));
    }
    FILE *f = w->f;
    w->f = NULL;
    if (fclose_rename(f, w->tmp_path, w->path, err, errlen) != 0) return -1;
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
    return shard_finished(w, sealed_sha, aead_file_bytes(w->plain_bytes, AEAD_FILE_CHUNK_BYTES), err, errlen);
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
            if (shard_write(w, w->buf, 2 * chunk) != 0)
                return errorf(err, errlen, "%s: write error: %s", w->tmp_path, strerror(errno));
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
    if (w->plain != NULL) secure_wipe(w->plain, w->plain_cap);
    free(w->plain);
    for (int k = 0; k < w->n_done; k++) free(w->done[k]);
    free(w->done);
    manifest_free(&w->written);
}

// ----------------------------------------------------------------------------
// blocks of input: read by the main thread, encoded by a worker

enum { WORK_FREE, WORK_FILLED, WORK_ENCODED };

typedef struct {
    int state;                 // WORK_*, changed under the pipeline's lock
    // the input, set by the reader
    const InputFile *file;
    char *text;
    size_t len, cap;
    int starts_document;       // a text file's first block: EOT goes first (with -e 1)
    long long first_line;      // 1-based line of text[0] in its file (JSON lines)
    long long first_byte;      // offset of text[0] in its file
    // the output, set by the worker
    BpeOut out;
    long long documents;       // documents that start in this block
    int failed;
    char err[1024];
} Work;

// The reader's place in the inputs: the file it is in, and what it has read
// of that file but not yet handed out in a block.
typedef struct {
    const InputList *inputs;
    int bytes;                 // --bytes: any cut is a safe one
    int next;                  // index of the next file to open
    FILE *f;
    const InputFile *file;
    char *buf;
    size_t cap, have;
    int at_eof, handed_out;    // handed_out: a block of this file went out already
    long long line, offset;    // of buf[0]
} Reader;

static int work_set_text(Work *w, const char *text, size_t len) {
    if (len > w->cap) {
        char *bigger = realloc(w->text, len);
        if (bigger == NULL) return -1;
        w->text = bigger;
        w->cap = len;
    }
    if (len > 0) memcpy(w->text, text, len);  // an empty file's block: w->text may still be NULL
    w->len = len;
    return 0;
}

static long long count_lines(const char *s, size_t n) {
    long long lines = 0;
    for (const char *p = s, *end = s + n; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++) lines++;
    return lines;
}

// block_cut: how much of the reader's buffer can go out as one block: up to
// the last line end of a JSON-lines file, up to bpe_split_point of a text
// file; 0 if the buffer needs more to find a cut
static size_t block_cut(const Reader *r) {
    if (r->at_eof) return r->have;
    if (r->file->kind == INPUT_JSONL) {
        const char *nl = memrchr(r->buf, '\n', r->have);
        return nl == NULL ? 0 : (size_t)(nl - r->buf) + 1;
    }
    return r->bytes ? r->have : bpe_split_point(r->buf, r->have);
}

// reader_fill: the next block of input into w. 1 filled, 0 no input left,
// -1 with err set.
static int reader_fill(Reader *r, Work *w, char *err, size_t errlen) {
    for (;;) {
        if (r->f == NULL) {
            if (r->next == r->inputs->n) return 0;
            r->file = &r->inputs->files[r->next++];
            // the file was a regular file when listed; if it is now a FIFO, opening
            // it plainly would wait for a writer forever (files.h)
            char why[600];
            r->f = fopen_regular(r->file->path, "", why, sizeof(why));
            if (r->f == NULL) return errorf(err, errlen, "-i %s", why);
            r->have = 0;
            r->at_eof = r->handed_out = 0;
            r->line = 1;
            r->offset = 0;
        }
        while (!r->at_eof && r->have < r->cap) {
            size_t got = fread(r->buf + r->have, 1, r->cap - r->have, r->f);
            r->have += got;
            if (ferror(r->f)) return errorf(err, errlen, "-i %s: read error: %s", r->file->path, strerror(errno));
            if (got == 0 || feof(r->f)) r->at_eof = 1;
        }
        size_t cut = block_cut(r);
        if (cut == 0 && !r->at_eof) {  // one line longer than the buffer: grow it until the line fits
            char *bigger = realloc(r->buf, 2 * r->cap);
            if (bigger == NULL) return errorf(err, errlen, "-i %s: out of memory for a %zu MB line", r->file->path, r->cap >> 19);
            r->buf = bigger;
            r->cap *= 2;
            continue;
        }
        // an empty text file is still a document (an EOT with -e 1); an empty JSON-lines file holds none
        int something = cut > 0 || (!r->handed_out && r->file->kind == INPUT_TEXT);
        if (something) {
            if (work_set_text(w, r->buf, cut) != 0) return errorf(err, errlen, "out of memory for a block of input");
            w->file = r->file;
            w->starts_document = r->file->kind == INPUT_TEXT && !r->handed_out;
            w->first_line = r->line;
            w->first_byte = r->offset;
            r->handed_out = 1;
            if (r->file->kind == INPUT_JSONL) r->line += count_lines(r->buf, cut);
            r->offset += (long long)cut;
            memmove(r->buf, r->buf + cut, r->have - cut);
            r->have -= cut;
        }
        if (r->at_eof && r->have == 0) {
            fclose(r->f);
            r->f = NULL;
        }
        if (something) return 1;
    }
}

// ----------------------------------------------------------------------------
// encoding: what a worker thread does to a block

typedef struct Pipeline Pipeline;

typedef struct {
    Pipeline *p;
    Bpe bpe;                   // the loaded tables, shared; its own cache and scratch
    JsonBuf doc;               // a JSON document's text, decoded
    pthread_t thread;
} Worker;

struct Pipeline {
    Work *work;                // a ring: block number k is work[k % n_work]
    int n_work;
    long long filled, taken, written;  // blocks read in, taken by a worker, written out
    int reading_done, stop;
    pthread_mutex_t lock;
    pthread_cond_t have_work, work_done;
    const Bpe *bpe;            // NULL: byte-level tokens
    int eot, eot_between;
    const char *field;
    Worker *workers;
    int n_workers;
};

// bpe_thread_copy: a Bpe for one thread. The vocabulary and merge tables are
// only read while encoding, so they are shared; the cache of pieces and the
// scratch for merging are written, so each thread has its own.
static int bpe_thread_copy(Bpe *copy, const Bpe *shared) {
    *copy = *shared;
    copy->cache = calloc(BPE_CACHE_SLOTS, sizeof(BpeCacheSlot));
    copy->cache_text = malloc(BPE_CACHE_TEXT_BYTES);
    copy->cache_ids = malloc(BPE_CACHE_IDS * sizeof(int32_t));
    copy->cache_used = copy->cache_text_used = copy->cache_ids_used = 0;
    copy->sym = NULL;
    copy->heap = NULL;
    copy->scratch_cap = 0;
    return copy->cache == NULL || copy->cache_text == NULL || copy->cache_ids == NULL ? -1 : 0;
}

static void bpe_thread_free(Bpe *copy) {
    free(copy->cache);
    free(copy->cache_text);
    free(copy->cache_ids);
    free(copy->sym);
    free(copy->heap);
}

static int push_id(BpeOut *out, int id) {
    if (bpe_out_reserve(out, 1) != 0) return -1;
    out->ids[out->n++] = id;
    return 0;
}

// encode_text: one document's text, or a block of one, appended to out
static int encode_text(Worker *wk, const char *text, size_t len, BpeOut *out) {
    if (wk->p->bpe != NULL) return bpe_encode_ordinary(&wk->bpe, (const unsigned char *)text, len, out);
    if (bpe_out_reserve(out, len) != 0) return -1;
    for (size_t i = 0; i < len; i++) out->ids[out->n++] = (unsigned char)text[i];
    return 0;
}

// json_document: the string of the field named field in one JSON-lines line
// (an object), decoded into doc; -1 with j->err set
static int json_document(JsonReader *j, const char *field, JsonBuf *doc, JsonBuf *key) {
    int index = 0, found = 0, more;
    if (json_peek(j) != '{') return json_fail(j, "a line must be a JSON object");
    while ((more = json_object_next(j, &index, key)) == 1) {
        if (strcmp(key->bytes, field) != 0) {
            if (json_skip_value(j) != 0) return -1;
            continue;
        }
        if (found) return json_fail(j, "a second \"%s\" field", field);
        if (json_peek(j) != '"') return json_fail(j, "the \"%s\" field is not a string", field);
        if (json_string(j, doc) != 0) return -1;
        found = 1;
    }
    if (more < 0 || json_at_end(j) != 0) return -1;
    if (!found) return json_fail(j, "no \"%s\" field", field);
    return 0;
}

static int only_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    }
    return 1;
}

// encode_json_lines: every line of the block is a document; blank lines are skipped
static int encode_json_lines(Worker *wk, Work *w) {
    JsonBuf key = {NULL, 0, 0};
    long long line = w->first_line;
    int rc = 0;
    for (size_t at = 0; rc == 0 && at < w->len; line++) {
        const char *start = w->text + at, *nl = memchr(start, '\n', w->len - at);
        size_t n = nl != NULL ? (size_t)(nl - start) : w->len - at;
        if (!only_space(start, n)) {
            JsonReader j;
            json_init(&j, start, n);
            if (json_document(&j, wk->p->field, &wk->doc, &key) != 0) {
                snprintf(w->err, sizeof(w->err), "%s line %lld column %zu (file byte %lld): %s", w->file->path, line,
                         j.err_pos + 1, w->first_byte + (long long)(at + j.err_pos), j.err);
                rc = -1;
            } else if ((wk->p->eot_between && push_id(&w->out, wk->p->eot) != 0) ||
                       encode_text(wk, wk->doc.bytes, wk->doc.len, &w->out) != 0) {
                snprintf(w->err, sizeof(w->err), "%s line %lld: out of memory encoding it", w->file->path, line);
                rc = -1;
            }
            w->documents++;
        }
        at += n + 1;
    }
    json_buf_free(&key);
    return rc;
}

static void encode_work(Worker *wk, Work *w) {
    w->out.n = 0;
    w->documents = 0;
    w->failed = 0;
    if (w->file->kind == INPUT_JSONL) {
        w->failed = encode_json_lines(wk, w) != 0;
        return;
    }
    if (w->starts_document) w->documents = 1;
    if ((w->starts_document && wk->p->eot_between && push_id(&w->out, wk->p->eot) != 0) ||
        encode_text(wk, w->text, w->len, &w->out) != 0) {
        snprintf(w->err, sizeof(w->err), "%s: out of memory encoding a block at byte %lld", w->file->path, w->first_byte);
        w->failed = 1;
    }
}

static void *worker_main(void *arg) {
    Worker *wk = arg;
    Pipeline *p = wk->p;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && !p->reading_done && p->taken == p->filled) pthread_cond_wait(&p->have_work, &p->lock);
        if (p->stop || p->taken == p->filled) break;
        Work *w = &p->work[p->taken % p->n_work];
        p->taken++;
        pthread_mutex_unlock(&p->lock);
        encode_work(wk, w);
        pthread_mutex_lock(&p->lock);
        w->state = WORK_ENCODED;
        pthread_cond_broadcast(&p->work_done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

// ----------------------------------------------------------------------------
// the main thread: read blocks, hand them out, write their tokens in order

typedef struct {
    double start, last_print;
    long long bytes_done, bytes_total, documents, tokens;
    int on_terminal;
} Progress;

static void progress_print(Progress *p, int last) {
    double t = now_seconds(), elapsed = t - p->start;
    if (p->bytes_total < PROGRESS_MIN_BYTES) return;
    if (!last && t - p->last_print < (p->on_terminal ? 1.0 : 30.0)) return;
    p->last_print = t;
    double rate = elapsed > 0 ? p->bytes_done / elapsed : 0;  // bytes per second
    long eta = rate > 0 ? (long)((p->bytes_total - p->bytes_done) / rate) : 0;
    fprintf(stderr, "%sprepare_data: %.0f of %.0f MB (%.1f%%), %.1f MB/s, %lld documents, %.1fM tokens, ETA %ld:%02ld:%02ld%s",
            p->on_terminal ? "\r" : "", p->bytes_done / 1e6, p->bytes_total / 1e6,
            p->bytes_total > 0 ? 100.0 * p->bytes_done / p->bytes_total : 100.0, rate / 1e6, p->documents, p->tokens / 1e6,
            eta / 3600, eta / 60 % 60, eta % 60, p->on_terminal && !last ? "" : "\n");
}

static int pipeline_start(Pipeline *p, const Options *o, const Bpe *bpe, int eot) {
    memset(p, 0, sizeof(*p));
    p->n_work = 2 * o->threads + 2;  // enough that the reader keeps every worker busy
    p->work = calloc((size_t)p->n_work, sizeof(Work));
    p->workers = calloc((size_t)o->threads, sizeof(Worker));
    if (p->work == NULL || p->workers == NULL) return -1;
    p->bpe = bpe;
    p->eot = eot;
    p->eot_between = o->eot_between;
    p->field = o->field;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->have_work, NULL);
    pthread_cond_init(&p->work_done, NULL);
    for (int k = 0; k < o->threads; k++) {
        Worker *wk = &p->workers[k];
        wk->p = p;
        if (bpe != NULL && bpe_thread_copy(&wk->bpe, bpe) != 0) { bpe_thread_free(&wk->bpe); return -1; }
        if (pthread_create(&wk->thread, NULL, worker_main, wk) != 0) {
            if (bpe != NULL) bpe_thread_free(&wk->bpe);
            return -1;
        }
        p->n_workers++;
    }
    return 0;
}

static void pipeline_stop(Pipeline *p) {
    if (p->n_workers > 0) {
        pthread_mutex_lock(&p->lock);
        p->stop = 1;
        pthread_cond_broadcast(&p->have_work);
        pthread_mutex_unlock(&p->lock);
    }
    for (int k = 0; k < p->n_workers; k++) {
        pthread_join(p->workers[k].thread, NULL);
        if (p->bpe != NULL) bpe_thread_free(&p->workers[k].bpe);
        json_buf_free(&p->workers[k].doc);
    }
    for (int k = 0; p->work != NULL && k < p->n_work; k++) {
        free(p->work[k].text);
        free(p->work[k].out.ids);
    }
    if (p->workers != NULL) {
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->have_work);
        pthread_cond_destroy(&p->work_done);
    }
    free(p->work);
    free(p->workers);
}

// read_ahead: fills every free block with input; the workers start on each at once
static int read_ahead(Pipeline *p, Reader *r, char *err, size_t errlen) {
    while (!p->reading_done && p->filled - p->written < p->n_work) {
        Work *w = &p->work[p->filled % p->n_work];
        int got = reader_fill(r, w, err, errlen);
        pthread_mutex_lock(&p->lock);
        if (got == 1) {
            w->state = WORK_FILLED;
            p->filled++;
            pthread_cond_signal(&p->have_work);
        } else {
            p->reading_done = 1;
            pthread_cond_broadcast(&p->have_work);
        }
        pthread_mutex_unlock(&p->lock);
        if (got < 0) return -1;
    }
    return 0;
}

// tokenize_inputs: every document into the shard writer, in input order
static int tokenize_inputs(const Options *o, const InputList *inputs, const Bpe *bpe, int eot, ShardWriter *sw,
                           Progress *progress, char *err, size_t errlen) {
    Pipeline p;
    Reader r = {inputs, bpe == NULL, 0, NULL, NULL, malloc((size_t)o->block_bytes), (size_t)o->block_bytes, 0, 0, 0, 0, 0};
    int rc = r.buf == NULL || pipeline_start(&p, o, bpe, eot) != 0 ? errorf(err, errlen, "cannot start %d threads: out of memory", o->threads) : 0;
    while (rc == 0) {
        rc = read_ahead(&p, &r, err, errlen);
        if (rc != 0 || (p.reading_done && p.written == p.filled)) break;
        Work *w = &p.work[p.written % p.n_work];
        pthread_mutex_lock(&p.lock);
        while (w->state != WORK_ENCODED) pthread_cond_wait(&p.work_done, &p.lock);
        pthread_mutex_unlock(&p.lock);
        if (w->failed) rc = errorf(err, errlen, "%s", w->err);
        else rc = shard_add(sw, w->out.ids, w->out.n, err, errlen);
        w->state = WORK_FREE;
        p.written++;
        progress->bytes_done += (long long)w->len;
        progress->documents += w->documents;
        progress->tokens += (long long)w->out.n;
        progress_print(progress, 0);
    }
    pipeline_stop(&p);
    if (r.f != NULL) fclose(r.f);
    free(r.buf);
    return rc;
}

// ----------------------------------------------------------------------------
// loading the encoder

// load_bpe: GPT-2's encoder from the flags' files or the data directory.
// 0 ok, 1 error (nothing left to free).
static int load_bpe(const Options *o, Bpe *bpe) {
    char encoder[4096], vocab[4096], err[1024];
    if (o->encoder_path != NULL) {
        snprintf(encoder, sizeof(encoder), "%s", o->encoder_path);
        snprintf(vocab, sizeof(vocab), "%s", o->vocab_path);
    } else if (bpe_find_files(encoder, vocab, sizeof(encoder)) != 0) {
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
static int write_dataset(const Options *o, const InputList *inputs, Bpe *bpe, const Manifest *old) {
    char err[1024];
    int vocab_size = bpe ? bpe->vocab_size : 256, eot = bpe ? bpe->eot : 0;
    ShardWriter *w = calloc(1, sizeof(ShardWriter));
    if (w == NULL) { fprintf(stderr, "prepare_data: out of memory\n"); return 1; }
    w->out_dir = o->out_dir;
    w->name = o->name;
    w->shard_tokens = o->shard_tokens;
    w->val_left = o->val_tokens;
    w->numbers_across = o->val_shard;
    AeadFileKey cipher;
    memset(&cipher, 0, sizeof(cipher));
    if (o->key_file != NULL) {
        uint8_t key[32];
        if (key_read_file(o->key_file, key, err, sizeof(err)) != 0) {
            flag_file_error(err, sizeof(err), "--key-file", "the key to encrypt the shards under", "key file");
            fprintf(stderr, "prepare_data: %s\n", err);
            free(w);
            return 2;
        }
        aead_file_key(&cipher, key);
        secure_wipe(key, sizeof(key));
        w->cipher = &cipher;
    }
    Progress p = {now_seconds(), now_seconds(), 0, inputs->bytes, 0, 0, isatty(STDERR_FILENO)};
    int rc = tokenize_inputs(o, inputs, bpe, eot, w, &p, err, sizeof(err));
    if (rc == 0) progress_print(&p, 1);
    if (rc == 0 && w->f != NULL) rc = shard_close(w, err, sizeof(err));
    long long total = w->tokens[0] + w->tokens[1];
    if (rc == 0 && w->tokens[1] == 0)
        rc = errorf(err, sizeof(err), "only %lld tokens, all taken by %s %lld: the train split would be empty; "
                    "give more text or a smaller %s", total, o->val_shard ? "--val-shard's first shard, -s" : "-v",
                    o->val_tokens, o->val_shard ? "-s" : "-v");
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
        aead_file_key_wipe(&cipher);
        return 1;
    }
    double seconds = now_seconds() - p.start;
    printf("prepare_data: %lld tokens from %lld documents in %d file%s (%lld bytes) in %.2f s: %.1f MB/s on %d thread%s\n",
           total, p.documents, inputs->n, inputs->n == 1 ? "" : "s", inputs->bytes, seconds,
           seconds > 0 ? inputs->bytes / 1e6 / seconds : 0.0, o->threads, o->threads == 1 ? "" : "s");
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
    if (o->key_file != NULL) printf("prepare_data: shards encrypted (AES-256-GCM) under --key-file %s\n", o->key_file);
    warn_stale_shards(o->out_dir, o->name, &w->written);
    shard_writer_free(w);
    free(w);
    aead_file_key_wipe(&cipher);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "hellaswag") == 0) return prepare_hellaswag_main(argc - 1, argv + 1);
    Options o;
    char name_buf[256];
    parse_options(&o, argc, argv, name_buf, sizeof(name_buf));
    InputList inputs;
    Bpe bpe;
    Manifest old = {0, NULL};
    int made_dir, rc = check_paths(&o, &inputs, &made_dir);
    if (o.eot_between < 0) o.eot_between = inputs.many_documents;
    if (rc == 0) rc = read_old_manifest(o.out_dir, &old);
    if (rc == 0 && !o.bytes) rc = load_bpe(&o, &bpe);
    if (rc == 0) {
        rc = write_dataset(&o, &inputs, o.bytes ? NULL : &bpe, &old);
        if (!o.bytes) bpe_free(&bpe);
    }
    if (rc != 0 && made_dir) rmdir(o.out_dir);  // nothing left behind: write_dataset emptied it
    manifest_free(&old);
    input_list_free(&inputs);
    free(o.inputs);
    return rc;
}
