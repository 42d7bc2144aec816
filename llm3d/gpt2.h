/*
 * gpt2.h: what both trainers (train_gpt2.c, train_gpt2.cu) and their tests share:
 * the model's shape and parameter layout, the llm.c model and debug-state files,
 * the seeded init, a rank's slice of the model (Shard, units, the ZeRO shards,
 * what it writes into a checkpoint), the batch and the learning-rate schedule
 * that the flags (flags.h) ask for, and the log.
 *
 * defines:
 *   GPT2Config, the parameter layout (P_*): param_name, param_sizes,
 *     param_count, param_is_matrix, param_is_layernorm, pad_vocab
 *   the seeded init: counter_normal, param_init_value, config_from_descriptor
 *   model files: check_config, model_read_header, model_load, model_save
 *   the debug state: DebugState, debug_state_load, debug_state_free
 *   a rank's slice: Shard, ShardChunk, SHARD_MAXV, shard_for, shard_set_chunks,
 *                   shard_part_layers, shard_layer, shard_max_chunk, shard_chunk_list, local_tensor_size,
 *                   local_to_global,
 *     tensor_is_replicated, tensor_counted_here; its units (Unit, UnitTable,
 *     unit_table, unit_fill, ...) and their walks (for_each_unit_part,
 *     for_each_owned)
 *   from the flags: options_descriptor, options_model_file,
 *     options_shape_flags_match, batch_accum,
 *     lr_at_step
 *   the log: LogLine, log_line (non-finite values as null; a failed write
 *     reported), log_number, log_measured, log_keep_before
 *
 * ---------------------------------------------------------------------------
 * File headers (all little-endian; every header is 256 x int32 = 1024 bytes)
 * ---------------------------------------------------------------------------
 * model file (llm.c's gpt2_124M.bin)        magic 20240326
 *   [0] magic  [1] version: 3 = fp32 params, 5 = bf16 params
 *   [2] maxT   [3] V (vocab)  [4] L (layers)  [5] NH (heads)  [6] C (channels)
 *   [7] Vp (V padded up to a multiple of 128; older llm.c files have 0 here:
 *       we then take V rounded up to 128)
 *   then the 16 parameter tensors below, flat, in that order, in fp32 or bf16.
 *   wte has Vp rows; rows V..Vp-1 are zero and never trained into meaning.
 *
 * debug state (llm.c's gpt2_124M_debug_state.bin, version 2) magic 20240327
 *   [0] magic  [1] 2  [2] B  [3] T
 *   our extension, ignored by llm.c: [4] nsteps  [5] V  [6] Vp
 *   [8..13] float32 bit patterns: lr, beta1, beta2, eps, weight decay, clip
 *   then int32 inputs[B*T], int32 targets[B*T], float logits[B*T*V],
 *   float loss, float grads[num_parameters] (model-file layout, Vp rows),
 *   then our extension: float losses[nsteps], float grad_norms[nsteps]
 *   (dev/train_gpt2.py writes it; test_gpt2.c and test_gpt2.cu read it).
 *
 * tokenizer (magic 20240328) and token shards (magic 20240520): tokenizer.h
 * and dataloader.h; checkpoints (optim.bin 20241203, state.bin 20241204):
 * checkpoint.h; sealed (encrypted, -enc) files, magic bytes "llm3dgcm":
 * aead.h; doc/formats.md has all of them on one page.
 */
#ifndef LLM3D_GPT2_H
#define LLM3D_GPT2_H

#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>  // access: -e names a file or a descriptor

#include "llm3d/bf16.h"
#include "llm3d/errors.h"
#include "llm3d/files.h"
#include "llm3d/flags.h"  // Options: the batch and the learning rate they ask for

#define MODEL_MAGIC 20240326
#define STATE_MAGIC 20240327
#define HEADER_INTS 256
#define VOCAB_PAD 128

typedef struct {
    int maxT;   // max sequence length (positions in wpe)
    int V;      // vocabulary size
    int Vp;     // vocabulary padded to VOCAB_PAD, the rows of wte
    int L;      // layers
    int NH;     // heads
    int C;      // channels
} GPT2Config;

// ---------------------------------------------------------------------------
// parameter layout: 16 tensors, each holding all L layers (llm.c's order)

enum {
    P_WTE, P_WPE, P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_LNFW, P_LNFB,
    NUM_PARAM_TENSORS
};

static const char *param_name(int t) {
    static const char *names[NUM_PARAM_TENSORS] = {
        "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
        "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
    };
    return t >= 0 && t < NUM_PARAM_TENSORS ? names[t] : "?";
}

static void param_sizes(const GPT2Config *c, size_t sizes[NUM_PARAM_TENSORS]) {
    size_t C = c->C, L = c->L;
    sizes[P_WTE] = (size_t)c->Vp * C;
    sizes[P_WPE] = (size_t)c->maxT * C;
    sizes[P_LN1W] = L * C;
    sizes[P_LN1B] = L * C;
    sizes[P_QKVW] = L * 3 * C * C;
    sizes[P_QKVB] = L * 3 * C;
    sizes[P_ATTPROJW] = L * C * C;
    sizes[P_ATTPROJB] = L * C;
    sizes[P_LN2W] = L * C;
    sizes[P_LN2B] = L * C;
    sizes[P_FCW] = L * 4 * C * C;
    sizes[P_FCB] = L * 4 * C;
    sizes[P_FCPROJW] = L * C * 4 * C;
    sizes[P_FCPROJB] = L * C;
    sizes[P_LNFW] = C;
    sizes[P_LNFB] = C;
}

static size_t param_count(const GPT2Config *c) {
    size_t sizes[NUM_PARAM_TENSORS], n = 0;
    param_sizes(c, sizes);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) n += sizes[i];
    return n;
}

// weight decay applies to the 2-D matrices only, as in GPT-2 and llm.c
static int param_is_matrix(int t) {
    return t == P_WTE || t == P_WPE || t == P_QKVW || t == P_ATTPROJW || t == P_FCW || t == P_FCPROJW;
}

// the LayerNorms' weights and biases: under -sp each tp rank's gradient of
// them covers its own positions only, and the trainers sum them over tp
static int param_is_layernorm(int t) {
    return t == P_LN1W || t == P_LN1B || t == P_LN2W || t == P_LN2B || t == P_LNFW || t == P_LNFB;
}

static int pad_vocab(int V) { return (V + VOCAB_PAD - 1) / VOCAB_PAD * VOCAB_PAD; }

// ---------------------------------------------------------------------------
// seeded init, the same whatever the layout: element i of tensor t is a
// function of (seed, t, i) alone (a counter-based generator), so any rank can
// make any slice of the full model without making the rest, and the GPU
// trainer can make the same numbers on the device.

static uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// standard normal from a counter: Box-Muller on two 53-bit uniforms
static float counter_normal(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t a = mix64(seed ^ mix64(stream * 0x100000001b3ull ^ mix64(2 * i)));
    uint64_t b = mix64(seed ^ mix64(stream * 0x100000001b3ull ^ mix64(2 * i + 1)));
    double u1 = ((a >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    double u2 = (b >> 11) / 9007199254740992.0;          // [0, 1)
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// init value of element i of tensor t (flat index within the tensor)
static float param_init_value(const GPT2Config *c, uint64_t seed, int t, size_t i) {
    double std = 0.02;
    switch (t) {
    case P_LN1W: case P_LN2W: case P_LNFW: return 1.0f;
    case P_QKVB: case P_ATTPROJB: case P_FCB: case P_FCPROJB:
    case P_LN1B: case P_LN2B: case P_LNFB: return 0.0f;
    case P_WTE: if (i >= (size_t)c->V * c->C) return 0.0f; break;  // padded rows
    case P_ATTPROJW: case P_FCPROJW: std = 0.02 / sqrt(2.0 * c->L); break;  // residual projections
    default: break;
    }
    return (float)(std * counter_normal(seed, (uint64_t)t, i));
}

// parse "dN" or "gpt2:dN": L = N and llm.c's shape for N (d12 = GPT-2 124M,
// d48 = 1558M; llm.c refuses depths outside its table, where we take C = 64N, NH = N)
static int config_from_descriptor(GPT2Config *c, const char *desc, int V, int maxT) {
    if (strncmp(desc, "gpt2:", 5) == 0) desc += 5;  // llm.c's newer spelling, gpt2:d12
    if (desc[0] != 'd' || desc[1] < '1' || desc[1] > '9') return -1;
    char *end;
    long n = strtol(desc + 1, &end, 10);
    if (*end != '\0' || n < 1 || n > 128) return -1;
    c->L = (int)n;
    c->C = 64 * (int)n;
    c->NH = (int)n;
    // llm.c's table: GPT-2 350M, 774M and 1558M, and its unofficial 2.7B, 7.3B, 12.2B
    static const int table[][3] = {{24, 1024, 16}, {36, 1280, 20}, {48, 1600, 25}, {60, 1920, 30}, {72, 2880, 30},
                                   {84, 3456, 36}};
    for (int k = 0; k < 6; k++)
        if (n == table[k][0]) { c->C = table[k][1]; c->NH = table[k][2]; }
    c->V = V;
    c->Vp = pad_vocab(V);
    c->maxT = maxT;
    return 0;
}

// ---------------------------------------------------------------------------
// model files. Readers take an error buffer and never exit: the trainer, the
// tests and the checkpoint code decide what a bad file means.

static int check_config(const GPT2Config *c, const char *path, char *err, size_t errlen) {
    const char *field = NULL;
    int value = 0;
    if (c->maxT < 1 || c->maxT > 1 << 20) { field = "maxT"; value = c->maxT; }
    else if (c->V < 1 || c->V > 1 << 24) { field = "V"; value = c->V; }
    else if (c->Vp < c->V || c->Vp > (1 << 24) + VOCAB_PAD) { field = "Vp"; value = c->Vp; }
    else if (c->L < 1 || c->L > 1024) { field = "L"; value = c->L; }
    else if (c->NH < 1 || c->NH > 1024) { field = "NH"; value = c->NH; }
    else if (c->C < 1 || c->C > 1 << 16 || c->C % c->NH != 0) { field = "C"; value = c->C; }
    if (field == NULL) return 0;
    return errorf(err, errlen, "%s: header field %s = %d is out of range or inconsistent", path, field, value);
}

// reads the header only: config and version (3 or 5)
static int model_read_header(FILE *f, const char *path, GPT2Config *c, int *version, char *err, size_t errlen) {
    // zeros on failure: the compiler cannot see that errorf returns -1, and
    // would warn that callers may read the outputs unset
    memset(c, 0, sizeof(*c));
    *version = 0;
    int32_t h[HEADER_INTS];
    if (fread(h, sizeof(int32_t), HEADER_INTS, f) != HEADER_INTS)
        return errorf(err, errlen, "%s: file too short for the 1024-byte model header", path);
    if (h[0] != MODEL_MAGIC)
        return errorf(err, errlen, "%s: header field magic = %d, expected %d (not an llm.c model file)", path, h[0], MODEL_MAGIC);
    if (h[1] != 3 && h[1] != 5)
        return errorf(err, errlen, "%s: header field version = %d, expected 3 (fp32) or 5 (bf16)", path, h[1]);
    *version = h[1];
    c->maxT = h[2]; c->V = h[3]; c->L = h[4]; c->NH = h[5]; c->C = h[6];
    c->Vp = h[7] != 0 ? h[7] : pad_vocab(h[3]);
    return check_config(c, path, err, errlen);
}

// loads a whole model file into a freshly malloc'd fp32 array (bf16 converted)
static float *model_load(const char *path, GPT2Config *c, char *err, size_t errlen) {
    FILE *f = fopen_regular(path, "model file", err, errlen);  // a FIFO is refused, not waited on
    if (f == NULL) return NULL;
    int version;
    if (model_read_header(f, path, c, &version, err, errlen) != 0) { fclose(f); return NULL; }
    size_t n = param_count(c), elem = version == 3 ? 4 : 2;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long want = (long)(HEADER_INTS * 4 + n * elem);
    if (size != want) {
        errorf(err, errlen, "%s: file is %ld bytes, the header's shape (L=%d C=%d Vp=%d maxT=%d, version %d) needs %ld",
               path, size, c->L, c->C, c->Vp, c->maxT, version, want);
        fclose(f);
        return NULL;
    }
    fseek(f, HEADER_INTS * 4, SEEK_SET);
    float *params = (float *)malloc(n * sizeof(float));
    if (params == NULL) {
        errorf(err, errlen, "%s: out of memory for %zu parameters", path, n);
        fclose(f);
        return NULL;
    }
    size_t got;
    if (version == 3) {
        got = fread(params, 4, n, f);
    } else {
        // bf16: read into the upper half of the same buffer, widen from the front
        uint16_t *half = (uint16_t *)params + n;
        got = fread(half, 2, n, f);
        for (size_t i = 0; i < n; i++) params[i] = bf16_to_float(half[i]);
    }
    fclose(f);
    if (got != n) {
        errorf(err, errlen, "%s: read %zu of %zu parameters", path, got, n);
        free(params);
        return NULL;
    }
    return params;
}

static void model_fill_header(int32_t h[HEADER_INTS], const GPT2Config *c, int version) {
    memset(h, 0, HEADER_INTS * sizeof(int32_t));
    h[0] = MODEL_MAGIC; h[1] = version;
    h[2] = c->maxT; h[3] = c->V; h[4] = c->L; h[5] = c->NH; h[6] = c->C; h[7] = c->Vp;
}

// writes a v3 (fp32) model file; version 5 (bf16) when bf16 != 0. It goes
// to PATH.tmp first and is renamed into place: readers never see a part, and
// no link planted at either name is written through (files.h's fopen_tmp).
static int model_save(const char *path, const GPT2Config *c, const float *params, int bf16, char *err, size_t errlen) {
    char tmp[4200];
    FILE *f = fopen_tmp(path, tmp, sizeof(tmp), err, errlen);
    if (f == NULL) return -1;
    int32_t h[HEADER_INTS];
    model_fill_header(h, c, bf16 ? 5 : 3);
    size_t n = param_count(c);
    int ok = fwrite(h, sizeof(int32_t), HEADER_INTS, f) == HEADER_INTS;
    if (!bf16) {
        ok = ok && fwrite(params, 4, n, f) == n;
    } else {
        uint16_t buf[4096];
        for (size_t i = 0; ok && i < n; i += 4096) {
            size_t k = n - i < 4096 ? n - i : 4096;
            for (size_t j = 0; j < k; j++) buf[j] = float_to_bf16(params[i + j]);
            ok = fwrite(buf, 2, k, f) == k;
        }
    }
    if (!ok) {
        errorf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
        fclose_abandon(f, tmp);
        return -1;
    }
    return fclose_rename(f, tmp, path, err, errlen);
}

// ---------------------------------------------------------------------------
// the debug state (layout at the top of this file), read by both trainers' tests

typedef struct {
    int B, T, nsteps, V, Vp;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *inputs, *targets;
    float *logits, loss, *grads, *losses, *norms;
} DebugState;

static int read_exact(FILE *f, void *dst, size_t elem, size_t n) { return fread(dst, elem, n, f) == n; }

static int debug_state_load(DebugState *s, const char *path, size_t num_params) {
    memset(s, 0, sizeof(*s));
    char err[512];
    FILE *f = fopen_regular(path, "", err, sizeof(err));
    if (f == NULL) return -1;
    int32_t h[HEADER_INTS];
    int ok = read_exact(f, h, 4, HEADER_INTS) && h[0] == STATE_MAGIC && h[1] == 2 && h[2] > 0 && h[3] > 0 &&
             h[4] >= 0 && h[5] > 0;
    if (ok) {
        s->B = h[2]; s->T = h[3]; s->nsteps = h[4]; s->V = h[5]; s->Vp = h[6];
        float *hp[6] = {&s->lr, &s->beta1, &s->beta2, &s->eps, &s->weight_decay, &s->grad_clip};
        for (int i = 0; i < 6; i++) memcpy(hp[i], &h[8 + i], 4);
        size_t BT = (size_t)s->B * s->T;
        s->inputs = (int *)malloc(BT * sizeof(int));
        s->targets = (int *)malloc(BT * sizeof(int));
        s->logits = (float *)malloc(BT * s->V * sizeof(float));
        s->grads = (float *)malloc(num_params * sizeof(float));
        s->losses = (float *)malloc((s->nsteps + 1) * sizeof(float));
        s->norms = (float *)malloc((s->nsteps + 1) * sizeof(float));
        ok = read_exact(f, s->inputs, 4, BT) && read_exact(f, s->targets, 4, BT) &&
             read_exact(f, s->logits, 4, BT * s->V) && read_exact(f, &s->loss, 4, 1) &&
             read_exact(f, s->grads, 4, num_params) && read_exact(f, s->losses, 4, s->nsteps) &&
             read_exact(f, s->norms, 4, s->nsteps);
    }
    fclose(f);
    return ok ? 0 : -1;
}

static void debug_state_free(DebugState *s) {
    free(s->inputs); free(s->targets); free(s->logits); free(s->grads); free(s->losses); free(s->norms);
}

// ---------------------------------------------------------------------------
// the model on one rank of the grid: a pipeline stage's layers, each tensor
// cut along the tensor-parallel split (Megatron: qkv and fc by output rows,
// their projections by input columns, wte by vocabulary rows; LayerNorms, wpe
// and the projection biases whole on every rank). Its parameters are grouped
// in units that are contiguous in a rank's flat arrays: wte, wpe, one per
// layer, and lnf. A unit is the grain of ZeRO: each is padded to a multiple
// of dp (times an alignment) and split evenly among the data-parallel ranks,
// and gathered or reduced whole. Both trainers lay out their parameters,
// gradients and AdamW state this way, so the slicing, the ZeRO shards and
// what each rank writes into a checkpoint exist once, here, not in the
// parallel files: they are the model's tensor layout, and grid.h and the
// backends know no model.

// one chunk of a stage's layers: the model part it is (pipeline.h's
// pipeline_part), its model layers [l0, l0 + nl), and where they start
// among the rank's own layers (its units U_LAYER0 + off ..)
enum { SHARD_MAXV = 8 };  // chunks per stage, at most (pipeline.h's PIPE_MAXV)
typedef struct { int part, l0, nl, off; } ShardChunk;

typedef struct {
    int tp, tp_rank, pp, pp_rank, dp, dp_rank;
    int l0, l1, nl;            // nl: this rank's layers in all; [l0, l1): chunk 0's model layers
    int first, last;           // this stage holds the embeddings (part 0) / the head (the last part)
    int nchunks;               // chunks of layers on this stage (pipeline.h's V; 1 but for -ps interleaved)
    ShardChunk chunk[SHARD_MAXV];
    int Cl, NHl, Vl, v0;       // local widths: C/tp channels of attention, NH/tp heads, Vp/tp rows of wte from v0
    int nreal;                 // of the Vl vocabulary rows, those that are real tokens
} Shard;

enum { U_WTE, U_WPE, U_LNF, U_LAYER0 };  // unit kinds; layer units are U_LAYER0 + local layer

typedef struct {
    int kind;                  // U_WTE, U_WPE, U_LNF, or U_LAYER0 + ll
    size_t offset;             // in the flat local arrays (padded layout)
    size_t size, padded;       // elements, and rounded up to a multiple of dp * align
    size_t shard_offset;       // of this rank's 1/dp of the unit in the shard arrays
} Unit;

typedef struct {
    int n;
    Unit *units;               // wte?, wpe?, layers..., lnf?
    int u_wte, u_wpe, u_lnf, u_layer0;  // index of each unit, -1 when this stage has none
    size_t num_local, num_shard;        // elements of the flat local arrays and of the shard arrays
} UnitTable;

// a layer unit holds these tensors in this order (the file's per-layer tensors)
static const int layer_tensors[12] = {
    P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB,
};

// the model layers [*l0, *l0 + *nl) of part `part` of `parts`: contiguous and
// balanced, the first L % parts parts get one layer more
static void shard_part_layers(int L, int parts, int part, int *l0, int *nl) {
    int base = L / parts, extra = L % parts;
    *l0 = part * base + (part < extra ? part : extra);
    *nl = base + (part < extra ? 1 : 0);
}

// the stage's chunks: V of them, chunk k the model part parts[k] of the pp
// x V parts (pipeline.h's pipeline_part: the trainers pass its answers, so
// that this file knows no schedule). The rank's own layers are the chunks'
// in chunk order; units, files and the norm follow them through shard_layer.
// With V = 1 and parts[0] = pp_rank, what shard_for makes.
static void shard_set_chunks(Shard *s, const GPT2Config *c, int V, const int *parts) {
    int P = s->pp * V;
    s->nchunks = V;
    s->nl = 0;
    s->first = s->last = 0;
    for (int k = 0; k < V; k++) {
        ShardChunk *ch = &s->chunk[k];
        ch->part = parts[k];
        shard_part_layers(c->L, P, parts[k], &ch->l0, &ch->nl);
        ch->off = s->nl;
        s->nl += ch->nl;
        if (parts[k] == 0) s->first = 1;
        if (parts[k] == P - 1) s->last = 1;
    }
    s->l0 = s->chunk[0].l0;
    s->l1 = s->chunk[0].l0 + s->chunk[0].nl;
}

// the model's layer of this rank's layer ll (0..nl-1): the one map from a
// rank's layers to the model's (units, init, files, tensor views)
static int shard_layer(const Shard *s, int ll) {
    int k = 0;
    while (k + 1 < s->nchunks && ll >= s->chunk[k + 1].off) k++;
    return s->chunk[k].l0 + ll - s->chunk[k].off;
}

// the most layers a chunk of this stage holds (activation sets are sized for it)
static int shard_max_chunk(const Shard *s) {
    int n = 0;
    for (int k = 0; k < s->nchunks; k++) n = s->chunk[k].nl > n ? s->chunk[k].nl : n;
    return n;
}

// the stage's layers as text (the trainers' layout lines): "0..3", with
// chunks "0..1 (part 0), 4..5 (part 2)"
static const char *shard_chunk_list(const Shard *s, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < s->nchunks && at < len; k++) {
        const ShardChunk *ch = &s->chunk[k];
        if (s->nchunks == 1) at += (size_t)snprintf(buf + at, len - at, "%d..%d", ch->l0, ch->l0 + ch->nl - 1);
        else at += (size_t)snprintf(buf + at, len - at, "%s%d..%d (part %d)", k ? ", " : "", ch->l0, ch->l0 + ch->nl - 1, ch->part);
    }
    return buf;
}

// grid coordinates -> this rank's shard of the model, one chunk per stage
// (shard_set_chunks re-cuts it for -ps interleaved). Stages are contiguous
// and balanced: the first L % pp stages get one layer more.
static Shard shard_for(const GPT2Config *c, int tp, int tp_rank, int pp, int pp_rank, int dp, int dp_rank) {
    Shard s;
    memset(&s, 0, sizeof(s));
    s.tp = tp; s.tp_rank = tp_rank; s.pp = pp; s.pp_rank = pp_rank; s.dp = dp; s.dp_rank = dp_rank;
    shard_set_chunks(&s, c, 1, &pp_rank);
    s.Cl = c->C / tp;
    s.NHl = c->NH / tp;
    s.Vl = c->Vp / tp;
    s.v0 = tp_rank * s.Vl;
    int real = c->V - s.v0;
    s.nreal = real < 0 ? 0 : real > s.Vl ? s.Vl : real;
    return s;
}

// elements of tensor t per layer (or in all, for wte, wpe, lnf) on this rank
static size_t local_tensor_size(const GPT2Config *c, const Shard *s, int t) {
    size_t C = c->C, Cl = s->Cl;
    switch (t) {
    case P_WTE: return (size_t)s->Vl * C;
    case P_WPE: return (size_t)c->maxT * C;
    case P_QKVW: return 3 * Cl * C;
    case P_QKVB: return 3 * Cl;
    case P_ATTPROJW: return C * Cl;
    case P_FCW: return 4 * Cl * C;
    case P_FCB: return 4 * Cl;
    case P_FCPROJW: return C * 4 * Cl;
    case P_LNFW: case P_LNFB: case P_LN1W: case P_LN1B: case P_LN2W: case P_LN2B:
    case P_ATTPROJB: case P_FCPROJB: return C;
    }
    return 0;
}

// whole on every tensor-parallel rank (their gradients agree; counted once in the norm)
static int tensor_is_replicated(int t) {
    return !(t == P_WTE || t == P_QKVW || t == P_QKVB || t == P_ATTPROJW || t == P_FCW || t == P_FCB || t == P_FCPROJW);
}

// where element i of this rank's slice of tensor t (within one layer) sits in
// the full tensor's layer slice: the one map that init, load and save share
static size_t local_to_global(const GPT2Config *c, const Shard *s, int t, size_t i) {
    size_t C = c->C, Cl = s->Cl, r = s->tp_rank;
    switch (t) {
    case P_WTE: return (size_t)s->v0 * C + i;
    case P_QKVW: {  // rows: q, k, v parts of Cl rows each, from row r*Cl of each part
        size_t row = i / C, part = row / Cl;
        return (part * C + r * Cl + row % Cl) * C + i % C;
    }
    case P_QKVB: return (i / Cl) * C + r * Cl + i % Cl;
    case P_ATTPROJW: return (i / Cl) * C + r * Cl + i % Cl;                 // columns r*Cl..
    case P_FCW: return r * 4 * Cl * C + i;                                  // rows r*4Cl..
    case P_FCB: return r * 4 * Cl + i;
    case P_FCPROJW: return (i / (4 * Cl)) * 4 * C + r * 4 * Cl + i % (4 * Cl);  // columns r*4Cl..
    default: return i;
    }
}

// whether this rank counts tensor t (its gradient in the norm, its values in
// the files): each element once per dp replica, the replicated tensors on tp
// rank 0 and the tied wte on the first stage
static int tensor_counted_here(const Shard *s, int t) {
    return (!tensor_is_replicated(t) || s->tp_rank == 0) && (t != P_WTE || s->first);
}

static int unit_tensor_count(int kind) { return kind >= U_LAYER0 ? 12 : kind == U_LNF ? 2 : 1; }
static int unit_tensor(int kind, int k) {
    if (kind >= U_LAYER0) return layer_tensors[k];
    return kind == U_WTE ? P_WTE : kind == U_WPE ? P_WPE : (k == 0 ? P_LNFW : P_LNFB);
}

static size_t unit_size(const GPT2Config *c, const Shard *s, int kind) {
    size_t n = 0;
    for (int k = 0; k < unit_tensor_count(kind); k++) n += local_tensor_size(c, s, unit_tensor(kind, k));
    return n;
}

// lays out this rank's units: each padded to a multiple of dp * align
// elements (align 1 on the CPU; the GPU's 128 keeps every shard 16-byte
// aligned for vector loads). They depend on the layout only through the
// Shard. 0, or -1 when out of memory.
static int unit_table(UnitTable *ut, const GPT2Config *c, const Shard *s, size_t align) {
    int kinds[1024 + 3], n = 0;
    memset(ut, 0, sizeof(*ut));
    ut->u_wte = ut->u_wpe = ut->u_lnf = ut->u_layer0 = -1;
    if (s->first || s->last) { ut->u_wte = n; kinds[n++] = U_WTE; }
    if (s->first) { ut->u_wpe = n; kinds[n++] = U_WPE; }
    ut->u_layer0 = n;
    for (int ll = 0; ll < s->nl; ll++) kinds[n++] = U_LAYER0 + ll;
    if (s->last) { ut->u_lnf = n; kinds[n++] = U_LNF; }
    ut->n = n;
    ut->units = (Unit *)calloc((size_t)n, sizeof(Unit));
    if (ut->units == NULL) return -1;
    size_t off = 0, shard_off = 0, grain = (size_t)s->dp * align;
    for (int u = 0; u < n; u++) {
        Unit *un = &ut->units[u];
        un->kind = kinds[u];
        un->size = unit_size(c, s, kinds[u]);
        un->padded = (un->size + grain - 1) / grain * grain;
        un->offset = off;
        un->shard_offset = shard_off;
        off += un->padded;
        shard_off += un->padded / s->dp;
    }
    ut->num_local = off;
    ut->num_shard = shard_off;
    return 0;
}

// the tensors of all units, each unit's in unit_tensor's order (the
// consistency check hashes each)
static int unit_table_tensors(const UnitTable *ut) {
    int n = 0;
    for (int u = 0; u < ut->n; u++) n += unit_tensor_count(ut->units[u].kind);
    return n;
}

// the largest padded unit (the buffers that hold one unit at a time)
static size_t unit_table_largest(const UnitTable *ut) {
    size_t n = 0;
    for (int u = 0; u < ut->n; u++) n = ut->units[u].padded > n ? ut->units[u].padded : n;
    return n;
}

// where element j of unit u sits in an array of whole units (sharded 0: at
// offset) or of this rank's 1/dp of each (sharded 1: at shard_offset; j must
// be in this rank's chunk)
static size_t unit_index(const UnitTable *ut, const Shard *s, int u, size_t j, int sharded) {
    const Unit *un = &ut->units[u];
    return sharded ? un->shard_offset + (j - (size_t)s->dp_rank * (un->padded / (size_t)s->dp)) : un->offset + j;
}

// the model's layer of unit u (0 for the others)
static int unit_layer(const Shard *s, const Unit *un) { return un->kind >= U_LAYER0 ? shard_layer(s, un->kind - U_LAYER0) : 0; }

// the value of each local element of unit u, in dst (un->size floats): from
// the full model `full` (file layout) or, when full is NULL, from the seeded init
static void unit_fill(const GPT2Config *c, const Shard *s, const Unit *un, float *dst, const float *full, uint64_t seed) {
    size_t full_off[NUM_PARAM_TENSORS], sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(c, sizes);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) { full_off[t] = off; off += sizes[t]; }
    int layer = unit_layer(s, un);
    for (int k = 0; k < unit_tensor_count(un->kind); k++) {
        int t = unit_tensor(un->kind, k);
        size_t n = local_tensor_size(c, s, t);
        size_t layer_off = un->kind >= U_LAYER0 ? (size_t)layer * (sizes[t] / c->L) : 0;
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) {
            size_t gi = layer_off + local_to_global(c, s, t, i);
            dst[i] = full ? full[full_off[t] + gi] : param_init_value(c, seed, t, gi);
        }
        dst += n;
    }
}

// each part of a tensor in this rank's units, in unit order: of unit u,
// the elements [a, b) (counted in the unit) that lie in tensor t, which
// starts at element t_off of the unit; of each unit the dp rank's 1/dp
// (by_dp) or all of it. base is where tensor t's values for the unit's layer
// start in the full model (file layout): element i of the unit is at
// base + local_to_global(c, s, t, i - t_off) there.
typedef struct { int u, t; size_t a, b, t_off, base; } UnitPart;
typedef void (*UnitPartFn)(const UnitPart *p, void *ctx);

static void for_each_unit_part(const GPT2Config *c, const Shard *s, const UnitTable *ut, int by_dp, UnitPartFn fn,
                               void *ctx) {
    size_t full_off[NUM_PARAM_TENSORS], sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(c, sizes);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) { full_off[t] = off; off += sizes[t]; }
    for (int u = 0; u < ut->n; u++) {
        const Unit *un = &ut->units[u];
        size_t chunk = un->padded / s->dp;
        size_t lo = by_dp ? s->dp_rank * chunk : 0, hi = by_dp ? lo + chunk : un->size;
        int layer = unit_layer(s, un);
        size_t t_off = 0;
        for (int k = 0; k < unit_tensor_count(un->kind); k++) {
            int t = unit_tensor(un->kind, k);
            size_t n = local_tensor_size(c, s, t);
            UnitPart p = {u, t, lo > t_off ? lo : t_off, hi < t_off + n ? hi : t_off + n, t_off,
                          full_off[t] + (un->kind >= U_LAYER0 ? (size_t)layer * (sizes[t] / c->L) : 0)};
            if (p.a < p.b) fn(&p, ctx);
            t_off += n;
        }
    }
}

// what this rank owns of the full model (file layout), so that the ranks
// together write every element exactly once: the replicated tensors on tp
// rank 0, wte on the first stage, and of each unit either the dp rank's 1/dp
// (by_dp: checkpoints, written by all ranks at once) or all of it on dp rank
// 0 (export). A run is contiguous in unit u from element j, and in the flat
// model file from element g.
typedef struct { int u; size_t j, g, n; } OwnedRun;
typedef void (*OwnedFn)(const OwnedRun *r, void *ctx);

typedef struct { const GPT2Config *c; const Shard *s; OwnedFn fn; void *ctx; } OwnedWalk;

// the owned runs of one part: its elements in order, cut where their places
// in the file stop following each other
static void owned_runs_of_part(const UnitPart *p, void *ctx) {
    const OwnedWalk *w = (const OwnedWalk *)ctx;
    if (!tensor_counted_here(w->s, p->t)) return;
    OwnedRun r = {p->u, 0, 0, 0};
    for (size_t j = p->a; j < p->b; j++) {
        size_t g = p->base + local_to_global(w->c, w->s, p->t, j - p->t_off);
        if (r.n > 0 && g == r.g + r.n) { r.n++; continue; }
        if (r.n > 0) w->fn(&r, w->ctx);
        r.j = j; r.g = g; r.n = 1;
    }
    if (r.n > 0) w->fn(&r, w->ctx);
}

static void for_each_owned(const GPT2Config *c, const Shard *s, const UnitTable *ut, int by_dp, OwnedFn fn, void *ctx) {
    if (!by_dp && s->dp_rank != 0) return;
    OwnedWalk w = {c, s, fn, ctx};
    for_each_unit_part(c, s, ut, by_dp, owned_runs_of_part, &w);
}

// ---------------------------------------------------------------------------
// the batch: micro-batches per optimizer step for dp data-parallel replicas,
// from -b -t -d -mb; -1 with one line in err when they do not fit together

// the model's shape from -e's descriptor (dN with -ev -et -ec): 1 when -e is
// one, 0 when it is not (so it names a model file), -1 with err set
static int options_descriptor(const Options *o, GPT2Config *c, char *err, size_t errlen) {
    if (strncmp(o->init, "gpt3:", 5) == 0)
        return errorf(err, errlen, "flag -e %s: llm.c's GPT-3 shapes are not implemented here; give dN, with -ec and -et "
                      "for other shapes", o->init);
    int V = o->init_vocab > 0 ? o->init_vocab : 50257, maxT = o->init_maxT > 0 ? o->init_maxT : 1024;  // 0: GPT-2's
    if (config_from_descriptor(c, o->init, V, maxT) != 0) {
        // "d0", "gpt2:d200": a descriptor's form with a depth it does not take, and no file of that name
        const char *d = strncmp(o->init, "gpt2:", 5) == 0 ? o->init + 5 : o->init;
        int shaped = d[0] == 'd' && d[1] != '\0' && strspn(d + 1, "0123456789") == strlen(d + 1);
        if (shaped && access(o->init, F_OK) != 0)
            return errorf(err, errlen, "flag -e %s: a descriptor dN takes a depth N from 1 to 128, and no model file "
                          "of that name exists", o->init);
        return 0;
    }
    if (o->init_channels > 0) c->C = o->init_channels;
    if (c->C % c->NH != 0) return errorf(err, errlen, "flag -ec: %d channels do not split into %d heads", c->C, c->NH);
    return 1;
}

// -ev -et -ec against the shape of -e's model file c: they shape a dN
// descriptor, and a file has its own shape, so a value that differs from
// the file's would be ignored: refused instead (0 or the file's own value
// passes). 0, or -1 with err set
static int options_shape_flags_match(const Options *o, const GPT2Config *c, char *err, size_t errlen) {
    const char *flag[3] = {"-ev", "-et", "-ec"}, *field[3] = {"V", "maxT", "C"};
    int given[3] = {o->init_vocab, o->init_maxT, o->init_channels}, file[3] = {c->V, c->maxT, c->C};
    for (int k = 0; k < 3; k++)
        if (given[k] > 0 && given[k] != file[k])
            return errorf(err, errlen, "flag %s %d: -e %s is a model file, whose header says %s = %d; -ev -et -ec shape "
                          "a dN descriptor only (leave the flag out, or give the file's %d)", flag[k], given[k], o->init,
                          field[k], file[k], file[k]);
    return 0;
}

// the model's shape from the header of -e's model file: 0, or -1 with err set
static int options_model_file(const Options *o, GPT2Config *c, char *err, size_t errlen) {
    FILE *f = fopen_regular(o->init, "model file", err, errlen);
    int version;
    if (f == NULL) return -1;
    int rc = model_read_header(f, o->init, c, &version, err, errlen);
    fclose(f);
    return rc != 0 ? -1 : 0;
}

static int batch_accum(const Options *o, int dp, char *err, size_t errlen) {
    long BTdp = (long)o->B * o->T * dp;
    if (o->total_batch == 0)
        return errorf(err, errlen, "flag -d: 0 tokens per step; give -1 (B*T*dp*mb) or a multiple of B*T*dp");
    long total = o->total_batch < 0 ? BTdp * o->microbatches : o->total_batch;
    if (total % BTdp != 0)
        return errorf(err, errlen, "flag -d: total batch %ld is not a multiple of B*T*dp = %ld", total, BTdp);
    if (total > INT32_MAX)  // state.bin records the batch as an int32 (doc/formats.md)
        return errorf(err, errlen, "flag -d -1: B*T*dp*mb = %ld tokens per step, more than the %d a checkpoint records",
                      total, INT32_MAX);
    if (o->total_batch > 0 && o->microbatches != 1 && total / BTdp != o->microbatches)
        return errorf(err, errlen, "flag -mb: %d micro-batches, but -d %ld makes %ld of B*T*dp", o->microbatches, total,
                      total / BTdp);
    if (o->val_batches == 0)
        return errorf(err, errlen, "flag -m: 0 val batches; give -1 (the whole val split) or a count per rank");
    return (int)(total / BTdp);
}

// ---------------------------------------------------------------------------
// learning rate at step (0-based) of total steps

static float lr_at_step(const Options *o, int step, int total) {
    if (o->schedule == SCHED_CONSTANT) return o->lr;  // llm.c's constant: no warmup either
    if (o->warmup > 0 && step < o->warmup) return o->lr * (float)(step + 1) / (float)o->warmup;
    if (total <= o->warmup) return o->lr;
    float lr_min = o->lr * o->final_frac;
    if (o->schedule == SCHED_WSD) {  // warmup, stable, then the last 20% decays as 1 - sqrt
        int decay_from = (int)(0.8f * (float)total);
        if (step < decay_from) return o->lr;
        float into = (float)(step - decay_from) / (float)(total - decay_from);
        return lr_min + (1.0f - sqrtf(into)) * (o->lr - lr_min);
    }
    float ratio = (float)(step - o->warmup) / (float)(total - o->warmup);
    if (o->schedule == SCHED_LINEAR) return o->lr - ratio * (o->lr - lr_min);
    float coeff = 0.5f * (1.0f + cosf((float)M_PI * ratio));
    return lr_min + coeff * (o->lr - lr_min);
}

// the JSON-lines log: one object per line. A training step's line has the
// step (0-based: the updates made before it), its loss, the val loss and
// HellaSwag accuracy when measured before it, its norm, lr, ms and the
// tokens trained on so far (its own included), and "skipped" when -sl or -sg
// skipped its update, or it was not applied as not finite; on a step where the
// watch report (-wr) found a straggler or a rank that waits unusually, its
// fields (watch.h, watch_judge); on a step where a rank's own gradient norm
// was far above its data-parallel peers', the rule's (watch.h, grads_judge),
// and "skipped" says so under -gp skip; with pp > 1 on the CPU trainer, the
// pipeline's bubble measured and simulated (watch.h, pipe_meter_judge). After the last step one more
// line, {"step": steps, "val_loss", "hellaswag", "tokens"}, evaluates the
// final model.
typedef struct {
    int step;
    int trained;             // 1: a training step's line; 0: the evaluation after the last step
    float loss, norm, lr;    // (trained lines)
    float val_loss;          // < 0: not measured
    float hellaswag;         // < 0: not measured
    double ms;
    long tokens;
    const char *skipped;     // "loss" or "norm": -sl or -sg skipped the step's update; "not finite"; else NULL
    const char *watch;       // more fields, from the watch report (watch.h), as JSON ("\"straggler\": 2, ..."), or NULL
    const char *pipe;        // more fields, the pipeline's bubble (watch.h's PipeMeter: "\"bubble\": 0.1, ..."), or NULL
    const char *grads;       // more fields, from the gradient-norm rule (watch.h's grads_judge), as JSON, or NULL
} LogLine;

// one numeric field, ", \"name\": value": JSON has no NaN or infinity, so a
// value that is not finite is null (Python's json and plot_log read it)
static void log_number(FILE *f, const char *name, const char *fmt, double x) {
    fprintf(f, ", \"%s\": ", name);
    if (isfinite(x)) fprintf(f, fmt, x);
    else fputs("null", f);
}

// "measured": a val loss or accuracy of NaN was measured (a broken model),
// and is logged as null; only the sentinel below 0 means "not measured"
static int log_measured(float x) { return !(x < 0.0f); }

// writes l as one line and flushes it: 0, or -1 with errno set when the
// line did not reach the file whole (a full disk, /dev/full). What was
// written of a failed line is cut off again where the file can be cut, so
// that the log ends with a whole line; the caller ends the run.
static int log_line(FILE *f, const LogLine *l) {
    if (f == NULL) return 0;
    long start = ftell(f);
    errno = 0;
    fprintf(f, "{\"step\": %d", l->step);
    if (l->trained) log_number(f, "loss", "%.6f", l->loss);
    if (log_measured(l->val_loss)) log_number(f, "val_loss", "%.6f", l->val_loss);
    if (log_measured(l->hellaswag)) log_number(f, "hellaswag", "%.6f", l->hellaswag);
    if (l->trained) {
        log_number(f, "norm", "%.6f", l->norm);
        log_number(f, "lr", "%.6e", l->lr);
        log_number(f, "ms", "%.3f", l->ms);
    }
    fprintf(f, ", \"tokens\": %ld", l->tokens);
    if (l->skipped != NULL) fprintf(f, ", \"skipped\": \"%s\"", l->skipped);
    if (l->watch != NULL) fprintf(f, ", %s", l->watch);
    if (l->pipe != NULL) fprintf(f, ", %s", l->pipe);
    if (l->grads != NULL) fprintf(f, ", %s", l->grads);
    fprintf(f, "}\n");
    if (fflush(f) == 0 && !ferror(f)) return 0;
    int saved = errno != 0 ? errno : EIO;
    if (start >= 0 && ftruncate(fileno(f), (off_t)start) != 0) {}  // a device such as /dev/full cannot be cut
    errno = saved;
    return -1;
}

// on resume from step `step`: keeps the log's lines of the steps before it,
// so the log reads as one run however often the job was stopped. The log
// is name in the directory dfd (-o held open; AT_FDCWD for -lg's path),
// path in messages; read as it is opened, never through a link, never a
// FIFO's wait, and rewritten whole in its place (files.h's fopen_tmp_at)
static int log_keep_before(int dfd, const char *name, const char *path, int step, char *err, size_t errlen) {
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) return 0;  // nothing logged yet
    FILE *f = fopen_nofollow_at(dfd, name, path, "r", err, errlen);
    if (f == NULL) return -1;
    char tmp[4200], line[4096];
    FILE *out = fopen_tmp_at(dfd, name, path, tmp, sizeof(tmp), err, errlen);
    if (out == NULL) {
        fclose(f);
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *p = strstr(line, "\"step\": ");
        if (p != NULL && atoi(p + 8) < step) fputs(line, out);
    }
    fclose(f);
    return fclose_rename_at(out, dfd, name, tmp, path, err, errlen);
}

#endif
