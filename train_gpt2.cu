/*
 * train_gpt2.cu: GPT-2 training on NVIDIA GPUs: one GPU, or one per rank of a
 * dp x tp x pp job over NCCL (the CPU trainer's layouts, on gpt2.h's slicing).
 *
 * The same model, loop, flags, printed lines and JSON log as train_gpt2.c,
 * with hand-written kernels (the .cuh files, forward and backward side by
 * side, in llm3d/cuda/) and the GEMMs through cuBLASLt. Six parts of this
 * file are in files of their own, in llm3d/cuda/train_gpt2cu/:
 * tensor_parallel.cuh, optimizer.cuh, export.cuh, pipeline_run.cuh,
 * checks.cuh and eval.cuh. They are not
 * headers: each uses this file's static functions and is included where its
 * callees are defined.
 * doc/gpu.md has the longer story.
 *
 * Precision. The default build is bf16 mixed precision: parameters,
 * activations and gradients in bf16, fp32 master weights and fp32 AdamW m/v;
 * every kernel accumulates in fp32. -DENABLE_FP32 (make PRECISION=FP32)
 * builds the same program with fp32 everywhere (no TF32), for exact
 * comparisons with the CPU trainer and PyTorch.
 *
 * Determinism. No kernel uses floating-point atomics; every reduction has a
 * fixed order (partial sums per block, then one pass over the partials), so
 * two runs on the same GPU give bit-identical losses.
 *
 * Shapes: B batch, T time, C channels, NH heads, HS = C/NH head size,
 * L layers, V vocab, Vp padded vocab (the rows of wte), BT = B*T rows.
 * Row-major everywhere, as in train_gpt2.c.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#ifndef LLM3D_NCCL
#define LLM3D_NCCL  // nccl_comm.h's NCCL backend: the GPU trainer always runs on it
#endif
#include "llm3d/gpt2.h"
#include "llm3d/flags.h"
#include "llm3d/files.h"  // write_all
#include "dataloader.h"
#include "llm3d/tokenizer.h"
#include "parallel.h"
#include "llm3d/checkpoint.h"

// the kernels and their launchers, one file per layer
#include "llm3d/cuda/cuda_common.cuh"
#include "llm3d/cuda/matmul.cuh"
#include "llm3d/cuda/encoder.cuh"
#include "llm3d/cuda/layernorm.cuh"
#include "llm3d/cuda/gelu.cuh"
#include "llm3d/cuda/attention.cuh"
#include "llm3d/cuda/classifier.cuh"
#include "llm3d/cuda/adamw.cuh"
#include "llm3d/cuda/init.cuh"

// the shape rules, the GPU-only flags and the peak FLOPs table, all host-side
#include "llm3d/cuda/gpu_setup.cuh"
#include "llm3d/cuda/gpu_stats.cuh"

// one micro-batch as it travels to the device: inputs, targets and the
// encoder backward's token buckets, one contiguous int array
typedef struct {
    int *inputs, *targets, *bucket_start, *bucket_token, *bucket_pos;
    int nbuckets;
} Staging;

#ifdef ENABLE_FP32
static const ncclDataType_t NCCL_FLOATX = ncclFloat32;
#else
static const ncclDataType_t NCCL_FLOATX = ncclBfloat16;
#endif

// ----------------------------------------------------------------------------
// the model on this rank: gpt2.h's Shard and units, the same slicing and ZeRO
// shards as train_gpt2.c (a stage's layers, each tensor cut Megatron-style,
// grouped in units padded to dp x 128 elements so every shard is 16-byte
// aligned), the activations of the micro-batches in flight, and the scratch
// of the op at work. All activations and scratch are carved from one device
// allocation (buffer_plan), each slice 256-aligned.

// one micro-batch's activations on one chunk of this stage's layers (the
// stage's one chunk but for -ps interleaved and zbv; a set is sized for the
// largest chunk): what its forward keeps for its backward. encoded (the
// chunk's input) and the last layer of residual3 (its output) are what
// pipeline messages carry (nccl_comm.h, nccl_sendrecv_mac), and grad_in the
// gradient that comes back. A split backward (-ps zbh1, zbv) keeps the
// activation gradients its W reads in sets of the same type (dact_slices).
// Under -sp the tensors of the sequence-parallel region (encoded, ln1,
// residual2, ln2, residual3 and the LayerNorms' statistics) hold R = B*T/tp
// rows, this rank's block of the micro-batch's positions (GPT2's rows, row0);
// (B,T) below reads R there. Without -sp R is B*T.
typedef struct {
    floatX *encoded;                            // (R,C): the embeddings, or what the previous stage sent
    floatX *ln1, *qkv, *atty, *residual2;       // per local layer: (nl,R,C), (nl,B,T,3Cl), (nl,B,T,Cl), (nl,R,C)
    floatX *ln2, *fch, *fch_gelu, *residual3;   // (nl,R,C), (nl,B,T,4Cl), (nl or 1,B,T,4Cl), (nl,R,C)
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // (nl,R)
    float *lse;                                 // (nl,B,NHl,T)
    floatX *lnf;                                // (B,T,C), last stage: whole, the head takes the gathered layout
    float *lnf_mean, *lnf_rstd;                 // (R)
    floatX *logits;                             // (B,T,Vl), last stage; FWD_TRAIN writes dlogits over them;
                                                // lent (head_take) where the last part is one of several chunks
    floatX *grad_in;                            // (R,C): the gradient of the chunk's output, from the part after
                                                // (none where the stage holds the last part alone); per set, as
                                                // with chunks it may come before the chunk's backward
    int *batch;                                 // the staged micro-batch (see Staging)
    Staging staged;                             // views of batch, once staged
} Acts;

// the backward's scratch (one backward runs at a time) and the step's sums;
// R rows as in Acts
typedef struct {
    floatX *proj;               // (R,C): attproj, then fcproj output
    floatX *dresidual;          // (R,C): the residual stream's gradient; after a chunk's backward, that
                                // of the chunk's input, which goes to the part before
    floatX *dbtc;               // (B,T,C): dlnf, dln2, datty, dln1 (under -sp: R rows of dlnf, dln2, dln1)
    floatX *dbig;               // (B,T,4Cl): dfch, then dqkv
    float *delta;               // (B,NHl,T) attention backward scratch
    float *colsum_partial;      // colsum_splits(BT) * 4C
    float *losses;              // (B,T) summed over the step's micro-batches; then the stop flag (1 float), then
                                // with dp > 1 every rank's own gradient sum of squares (world floats)
    float2 *cls_stats;          // (tp,B,T): every vocabulary slice's row max and sum of exp
    float *norm_partial, *norm; // NORM_BLOCKS, 1
    floatX *sp_whole;           // -sp only: (B,T,C), a gathered input or output gradient (sp_gather)
    floatX *sp_partial;         // -sp only: (B,T,C), this rank's partial sums before a reduce-scatter
} Scratch;

// the ints of one staged micro-batch (Staging)
static size_t staging_ints(int BT) { return (size_t)BT * 5 + 1; }

static Staging staging_view(int *base, int BT) {
    Staging s;
    s.inputs = base;
    s.targets = base + BT;
    s.bucket_start = base + 2 * (size_t)BT;  // BT + 1 entries
    s.bucket_token = base + 3 * (size_t)BT + 1;
    s.bucket_pos = base + 4 * (size_t)BT + 1;
    s.nbuckets = 0;
    return s;
}

typedef struct {
    void **ptr;
    size_t bytes;
    size_t offset;  // filled by buffer_plan
} BufferSlice;

#define ACT_SLICES 20      // at most, per activation set (act_slices)
#define DACT_SLICES 8      // at most, per activation gradient set (dact_slices)
#define SCRATCH_SLICES 13  // at most (scratch_slices)

static int add_slice(BufferSlice *s, int n, void **ptr, size_t bytes) {
    s[n].ptr = ptr;
    s[n].bytes = bytes;
    s[n].offset = 0;
    return n + 1;
}

// whether the logits are lent to the sets (head_take) rather than in each:
// where the last part is one of the stage's several chunks, only that
// chunk's sets need them
static int logits_lent(const Shard *sh) { return sh->last && sh->nchunks > 1; }

// the slices of one activation set for (B, T) on this stage, whose
// sequence-parallel region holds R rows (B*T without -sp), sized for the
// stage's largest chunk of layers; returns the new count
static int act_slices(Acts *a, const GPT2Config *c, const Shard *sh, int B, int T, int R, int recompute, BufferSlice *s,
                      int n) {
    int n0 = n;
    size_t BT = (size_t)B * T, Rs = (size_t)R, C = c->C, nl = (size_t)shard_max_chunk(sh), Cl = sh->Cl;
    size_t X = sizeof(floatX), F = sizeof(float);
    n = add_slice(s, n, (void **)&a->encoded, Rs * C * X);
    n = add_slice(s, n, (void **)&a->ln1, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&a->qkv, nl * BT * 3 * Cl * X);
    n = add_slice(s, n, (void **)&a->atty, nl * BT * Cl * X);
    n = add_slice(s, n, (void **)&a->residual2, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&a->ln2, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&a->fch, nl * BT * 4 * Cl * X);
    n = add_slice(s, n, (void **)&a->fch_gelu, (recompute ? 1 : nl) * BT * 4 * Cl * X);
    n = add_slice(s, n, (void **)&a->residual3, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&a->ln1_mean, nl * Rs * F);
    n = add_slice(s, n, (void **)&a->ln1_rstd, nl * Rs * F);
    n = add_slice(s, n, (void **)&a->ln2_mean, nl * Rs * F);
    n = add_slice(s, n, (void **)&a->ln2_rstd, nl * Rs * F);
    n = add_slice(s, n, (void **)&a->lse, nl * BT * sh->NHl * F);
    if (sh->last) {
        n = add_slice(s, n, (void **)&a->lnf, BT * C * X);  // whole: the final LayerNorm's output, gathered
        n = add_slice(s, n, (void **)&a->lnf_mean, Rs * F);
        n = add_slice(s, n, (void **)&a->lnf_rstd, Rs * F);
        if (!logits_lent(sh)) n = add_slice(s, n, (void **)&a->logits, BT * sh->Vl * X);
    }
    if (!sh->last || sh->nchunks > 1) n = add_slice(s, n, (void **)&a->grad_in, Rs * C * X);
    n = add_slice(s, n, (void **)&a->batch, staging_ints((int)BT) * sizeof(int));
    assert(n - n0 <= ACT_SLICES);
    return n;
}

// the slices of one set of activation gradients, for a backward split in B
// and W (-ps zbh1, zbv): per layer what B leaves for W to read (blocks'
// residual3 and residual2: the gradients of the residual stream after and
// between the block's two halves, fcproj's and attproj's outputs'; fch:
// fc's output's; qkv: qkv's; ln2, ln1: the LayerNorms' outputs'), encoded:
// the chunk's input's (what B sends back, and the embeddings' W reads), and
// on the last stage lnf: the final LayerNorm's output's, this rank's rows.
// In the activations' layout, so layer_acts and block_input view both.
static int dact_slices(Acts *d, const GPT2Config *c, const Shard *sh, int B, int T, int R, BufferSlice *s, int n) {
    int n0 = n;
    size_t BT = (size_t)B * T, Rs = (size_t)R, C = c->C, nl = (size_t)shard_max_chunk(sh), Cl = sh->Cl;
    size_t X = sizeof(floatX);
    n = add_slice(s, n, (void **)&d->encoded, Rs * C * X);
    n = add_slice(s, n, (void **)&d->ln1, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&d->qkv, nl * BT * 3 * Cl * X);
    n = add_slice(s, n, (void **)&d->residual2, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&d->ln2, nl * Rs * C * X);
    n = add_slice(s, n, (void **)&d->fch, nl * BT * 4 * Cl * X);
    n = add_slice(s, n, (void **)&d->residual3, nl * Rs * C * X);
    if (sh->last) n = add_slice(s, n, (void **)&d->lnf, Rs * C * X);
    assert(n - n0 <= DACT_SLICES);
    return n;
}

// the scratch for (B, T), R rows as in act_slices; R below B*T (-sp) adds
// the two (B,T,C) buffers of the gathers and scatters
static int scratch_slices(Scratch *a, const GPT2Config *c, const Shard *sh, int B, int T, int R, BufferSlice *s, int n) {
    int n0 = n;
    size_t BT = (size_t)B * T, Rs = (size_t)R, C = c->C, Cl = sh->Cl, X = sizeof(floatX), F = sizeof(float);
    n = add_slice(s, n, (void **)&a->proj, Rs * C * X);
    n = add_slice(s, n, (void **)&a->dresidual, Rs * C * X);
    n = add_slice(s, n, (void **)&a->dbtc, BT * C * X);
    n = add_slice(s, n, (void **)&a->dbig, BT * 4 * Cl * X);
    n = add_slice(s, n, (void **)&a->delta, BT * sh->NHl * F);
    n = add_slice(s, n, (void **)&a->colsum_partial, (size_t)colsum_splits((int)BT) * 4 * C * F);
    n = add_slice(s, n, (void **)&a->losses, (BT + 1 + GRID_MAX_WORLD) * F);
    n = add_slice(s, n, (void **)&a->cls_stats, (size_t)sh->tp * BT * sizeof(float2));
    n = add_slice(s, n, (void **)&a->norm_partial, (size_t)NORM_BLOCKS * F);
    n = add_slice(s, n, (void **)&a->norm, F);
    if (Rs < BT) {
        n = add_slice(s, n, (void **)&a->sp_whole, BT * C * X);
        n = add_slice(s, n, (void **)&a->sp_partial, BT * C * X);
    }
    assert(n - n0 <= SCRATCH_SLICES);
    return n;
}

// gives each slice a 256-aligned offset; returns the total bytes
static size_t buffer_plan(BufferSlice *s, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        s[i].offset = total;
        total += (s[i].bytes + 255) / 256 * 256;
    }
    return total;
}

#define UNIT_ALIGN 128  // elements: a unit is padded to dp x this, so each dp shard starts 256-byte aligned
#define UNIT_SLOTS 3    // units held at once: wte (one stage), a layer and the next layer's or lnf
#define PROGRESS_MARKS 8  // layers the host may queue ahead of the GPU in a job (gpu_progress)

// the pipeline's bubble measured on the GPU (pipeline_run.cuh's pipe_clock_*)
typedef struct {
    cudaEvent_t *marks;  // [cap] on the model's stream: the step's start, then after a forward's data and
                         // after each receive, op and send
    signed char *spans;  // [cap]: what ran up to mark i: PIPE_F, PIPE_B, PIPE_W, or a PIPE_CLOCK_* span
    int n, cap;          // marks recorded this step, and made (0: the meter is off)
    double t0;           // the host's clock (now_ms) when the step's first mark was queued on an idle GPU
    float *floats;       // every rank's PIPE_METER_FLOATS (watch.h), all-gathered on the device
} PipeClock;

typedef struct {
    GPT2Config config;
    Grid grid;                  // this rank's place in the job
    PipeLayout pipe;            // the step's pipeline (pipeline.h): where the stage's chunks sit in the model
    Shard shard;
    UnitTable ut;
    int zero;
    size_t num_params;          // of the whole model
    // where ZeRO keeps what, P = ut.num_local and S = ut.num_shard elements:
    //   stage  params (floatX)  master (fp32)  grads (floatX)    AdamW m, v (fp32)
    //   0      P                P              P                 P
    //   1      P                S              P                 S
    //   2      P                S              S (+ buckets)     S
    //   3      S (+ slots)      S              S (+ buckets)     S
    // The fp32 build's master weights are its params (P, or the S shard under
    // ZeRO-3). A unit's shard is elements [dp_rank * chunk, + chunk) of it.
    floatX *params, *grads;              // P each, or NULL
    floatX *param_shard, *grad_shard;    // S each, or NULL
    float *master;
    int master_sharded;                  // master indexed by shard_offset (else by offset)
    float *m, *v;                        // P (ZeRO-0) or S
    floatX *slot[UNIT_SLOTS];            // ZeRO-3: gathered units (largest padded unit each)
    int slot_unit[UNIT_SLOTS];
    floatX *bucket[UNIT_SLOTS];          // ZeRO-2/3: gradient buckets
    int bucket_unit[UNIT_SLOTS];
    long bucket_freed[UNIT_SLOTS];       // when each was last released (bucket_clock): the oldest is refilled first
    long bucket_clock;
    cudaEvent_t bucket_done[UNIT_SLOTS]; // recorded on the side stream when its reduction has read it
    int overlap;                         // dp > 1: gradients reduced on the side stream (nccl_side_*) during the backward
    int last_micro;                      // the backward at work is the step's last micro-batch's
    floatX *reduced;                     // ZeRO-2/3: one unit's reduced chunk
    // the checks' buffers (train_gpt2cu/checks.cuh's checks_alloc; NULL when that check is off)
    uint8_t *digests, *digests_host;     // -ck, dp > 1: the SHA-256 of every tensor of every replica (32 * tensors * dp
                                         // bytes), on the device for the all-gather and on the host for the verdict
    floatX *unit_host;                   // -ck, dp > 1: the unit being hashed, on the host (the largest unit's size)
    float *watch_floats;                 // -wr: every rank's compute and wait per step (WATCH_FLOATS x world)
    double waited;                       // -wr: the wait clock at the last watch report
    floatX **unit_params, **unit_grads;  // per unit: where its full values / gradients are now (NULL: not held)
    floatX *tied_peer;                   // pp > 1, first and last stage: my wte gradient out, the other end's in
    int B, T, recompute, fuse_gelu, attention_tc;
    // -sp 1 (with tp > 1): the sequence-parallel region (the LayerNorms, the
    // residual stream, the row-parallel outputs, the embeddings' output)
    // holds rows [row0, row0 + rows) of a micro-batch's B*T here; sp 0: all
    // of them (row0 0, rows B*T). See "sequence parallel" below.
    int sp, rows, row0;
    int nacts;                           // activation sets, each sized for the stage's largest chunk; in a step,
    Acts *acts;                          // a micro-batch on a chunk takes one (sets, pipeline_run); outside
                                         // the steps, batch i uses set i % nacts
    Acts *dsets;                         // with the backward split (gpt2_split_backward): nacts sets of
                                         // activation gradients, kept from a micro-batch's B to its W; else NULL
    int steps_M;                         // the step's micro-batches (pipeline_shape)
    PipeSets sets;                       // the set each (micro-batch, chunk) holds in a step (pipeline.h)
    int last_mb[SHARD_MAXV];             // per chunk, the micro-batch of the step's last backward that writes
                                         // its weights' gradients (its B, or its W where split): last_micro
    // a stage that holds the last part in one of several chunks: the logits
    // (B*T*Vl floatX each, the largest tensor of a set at GPT-2's vocabulary)
    // in nheads blocks of their own, lent to the sets of that chunk from its
    // F to its last op (head_take); nheads 0: each set has its own
    floatX *heads;
    int nheads, *head_busy, *head_of;    // head_of[set]: its block, -1 when none
    Scratch sc;
    void *act_memory, *dact_memory;
    size_t act_bytes, dact_bytes, param_bytes;
    int *inputs, *targets;               // host: the next micro-batch (B*T each)
    int *staging_host;                   // pinned: staging_ints(B*T)
    float *pinned;                       // pinned: B*T losses, then the stop flag, the norm, a verdict (and a spare),
                                         // then every rank's own gradient norm (GRID_MAX_WORLD floats)
    const float *rank_norms;             // dp > 1: those norms of the last step (in pinned), else NULL
    int *bucket_count;                   // host scratch: V + 1
    cudaEvent_t staging_free;            // the last copy out of staging_host is done
    Blas blas;
    cudaStream_t stream;
    NcclComm *nccl;                      // NULL for a model of one rank outside a job (the tests)
    cudaEvent_t progress[PROGRESS_MARKS];// gpu_progress's marks, one after each layer's forward or backward
    long progress_n;
    PipeClock clock;                     // pp > 1: the bubble's clock (pipeline_run.cuh); cap 0 when off
    int adam_t;                          // AdamW steps taken
} GPT2;

static void *device_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        fprintf(stderr, "out of GPU memory allocating %s (%zu bytes): %s\n", what, bytes, cudaGetErrorString(e));
        exit(1);
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}

static void *host_alloc(size_t bytes, const char *what) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory allocating %s (%zu bytes)\n", what, bytes);
        exit(1);
    }
    return p;
}

static size_t largest_unit(const GPT2 *m) { return unit_table_largest(&m->ut); }

// my dp shard of unit u: elements [lo, lo + chunk)
static size_t unit_chunk(const GPT2 *m, int u) { return m->ut.units[u].padded / (size_t)m->shard.dp; }
static size_t unit_lo(const GPT2 *m, int u) { return (size_t)m->shard.dp_rank * unit_chunk(m, u); }

// the elements of the tied wte message (tied_exchange): this rank's
// gradient of wte, its shard under ZeRO-2/3; 0 on a stage without wte, or
// with both of its uses (pp = 1, or zbv's stage 0, which holds the first
// part and the last)
static size_t tied_elems(const GPT2 *m) {
    if (m->ut.u_wte < 0 || (m->shard.first && m->shard.last)) return 0;
    return m->zero >= 2 ? unit_chunk(m, m->ut.u_wte) : m->ut.units[m->ut.u_wte].padded;
}

// where element j of unit u (within my shard, for the sharded arrays) lives
static floatX *param_at(const GPT2 *m, int u, size_t j) {
    return (m->zero == 3 ? m->param_shard : m->params) + unit_index(&m->ut, &m->shard, u, j, m->zero == 3);
}
static float *master_at(const GPT2 *m, int u, size_t j) {
    return m->master + unit_index(&m->ut, &m->shard, u, j, m->master_sharded);
}
static floatX *grad_at(const GPT2 *m, int u, size_t j) {
    return (m->zero >= 2 ? m->grad_shard : m->grads) + unit_index(&m->ut, &m->shard, u, j, m->zero >= 2);
}
static float *adam_at(const GPT2 *m, float *mv, int u, size_t j) {
    return mv + unit_index(&m->ut, &m->shard, u, j, m->zero >= 1);
}

// the whole model's fp32 parameters from the seeded init, on the host (the
// device kernel fills it in model-file order; then unit_fill slices it like a file)
static float *device_init_full(const GPT2Config *c, uint64_t seed, cudaStream_t stream) {
    size_t sizes[NUM_PARAM_TENSORS], n = param_count(c);
    param_sizes(c, sizes);
    float *d = (float *)device_alloc(n * sizeof(float), "initial parameters"), *p = d;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        InitSpec s = init_spec(c, t, sizes[t]);
        init_tensor_kernel<<<grid_for(sizes[t], 256), 256, 0, stream>>>(p, sizes[t], seed, t, s.constant, s.std,
                                                                       s.random_count);
        CUDA_CHECK(cudaGetLastError());
        p += sizes[t];
    }
    float *h = (float *)host_alloc(n * sizeof(float), "initial parameters");
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(d);
    return h;
}

// unit u's values (padded fp32, on the device in tmp) into params or
// param_shard and the master weights, whichever this ZeRO stage keeps
static void place_unit(GPT2 *m, int u, const float *tmp) {
    const Unit *un = &m->ut.units[u];
    size_t chunk = unit_chunk(m, u), lo = unit_lo(m, u);
    if (m->params != NULL)
        copy_to_floatx_kernel<<<grid_for(un->padded, 256), 256, 0, m->stream>>>(m->params + un->offset, tmp, un->padded);
    else
        copy_to_floatx_kernel<<<grid_for(chunk, 256), 256, 0, m->stream>>>(m->param_shard + un->shard_offset, tmp + lo, chunk);
    CUDA_CHECK(cudaGetLastError());
#ifndef ENABLE_FP32  // (the fp32 build's master weights are the params just written)
    if (m->master_sharded)
        CUDA_CHECK(cudaMemcpyAsync(m->master + un->shard_offset, tmp + lo, chunk * sizeof(float), cudaMemcpyDeviceToDevice, m->stream));
    else
        CUDA_CHECK(cudaMemcpyAsync(m->master + un->offset, tmp, un->padded * sizeof(float), cudaMemcpyDeviceToDevice, m->stream));
#endif
}

// device memory for the parameters, their gradients, the master weights and
// AdamW's m and v, each whole or this rank's ZeRO shard (the table in GPT2's
// comment), and ZeRO's gathered units and gradient buckets
static void gpt2_alloc_params(GPT2 *m) {
    const Shard *s = &m->shard;
    int zero = m->zero;
    size_t P = m->ut.num_local, S = m->ut.num_shard, X = sizeof(floatX), F = sizeof(float), big = largest_unit(m);
    if (zero <= 2) m->params = (floatX *)device_alloc(P * X, "parameters");
    else m->param_shard = (floatX *)device_alloc(S * X, "parameter shard");
    if (zero <= 1) m->grads = (floatX *)device_alloc(P * X, "gradients");
    else m->grad_shard = (floatX *)device_alloc(S * X, "gradient shard");
#ifdef ENABLE_FP32
    m->master = zero <= 2 ? m->params : m->param_shard;
    m->master_sharded = zero == 3;
#else
    m->master_sharded = zero >= 1;
    m->master = (float *)device_alloc((m->master_sharded ? S : P) * F, "master weights");
#endif
    m->m = (float *)device_alloc((zero >= 1 ? S : P) * F, "AdamW m");
    m->v = (float *)device_alloc((zero >= 1 ? S : P) * F, "AdamW v");
    for (int k = 0; k < UNIT_SLOTS; k++) {
        m->slot_unit[k] = m->bucket_unit[k] = -1;
        if (zero == 3) m->slot[k] = (floatX *)device_alloc(big * X, "gathered unit");
        if (zero >= 2) m->bucket[k] = (floatX *)device_alloc(big * X, "gradient bucket");
    }
    if (zero >= 2) m->reduced = (floatX *)device_alloc(big / s->dp * X, "reduced chunk");
    for (int k = 0; zero >= 2 && k < UNIT_SLOTS; k++)
        CUDA_CHECK(cudaEventCreateWithFlags(&m->bucket_done[k], cudaEventDisableTiming));
    m->unit_params = (floatX **)host_alloc(m->ut.n * sizeof(floatX *), "unit views");
    m->unit_grads = (floatX **)host_alloc(m->ut.n * sizeof(floatX *), "unit views");
    if (tied_elems(m) > 0)  // out, then in
        m->tied_peer = (floatX *)device_alloc(2 * tied_elems(m) * X, "tied wte gradients");
    m->param_bytes = (zero <= 2 ? P : S) * X + (zero <= 1 ? P : S) * X + 2 * (zero >= 1 ? S : P) * F;
#ifndef ENABLE_FP32
    m->param_bytes += (m->master_sharded ? S : P) * F;
#endif
}

// the parameters, unit by unit, sliced from the full model `full` (or, when
// full is NULL, from the seeded init) into what gpt2_alloc_params made room for
static void gpt2_load_params(GPT2 *m, const float *full, uint64_t seed) {
    const GPT2Config *c = &m->config;
    size_t F = sizeof(float), big = largest_unit(m);
    float *init = full == NULL ? device_init_full(c, seed, m->stream) : NULL;
    float *host_unit = (float *)host_alloc(big * F, "unit"), *tmp = (float *)device_alloc(big * F, "unit");
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        memset(host_unit, 0, un->padded * F);
        unit_fill(c, &m->shard, un, host_unit, full ? full : init, 0);
        CUDA_CHECK(cudaMemcpyAsync(tmp, host_unit, un->padded * F, cudaMemcpyHostToDevice, m->stream));
        place_unit(m, u, tmp);
        CUDA_CHECK(cudaStreamSynchronize(m->stream));  // host_unit and tmp are reused
        if (m->zero <= 2) m->unit_params[u] = m->params + un->offset;
        if (m->zero <= 1) m->unit_grads[u] = m->grads + un->offset;
    }
    cudaFree(tmp);
    free(host_unit);
    free(init);
}

// the bytes of one block of lent logits (gpt2_heads), 256-aligned as a slice
static size_t head_bytes(const GPT2 *m) {
    return ((size_t)m->B * m->T * m->shard.Vl * sizeof(floatX) + 255) / 256 * 256;
}

// n blocks of logits for the sets of the last part's chunk (nheads)
static void gpt2_heads(GPT2 *m, int n) {
    cudaFree(m->heads);
    free(m->head_busy);
    m->heads = (floatX *)device_alloc((size_t)n * head_bytes(m), "logits");
    m->head_busy = (int *)host_alloc((size_t)n * sizeof(int), "logits block marks");
    m->nheads = n;
}

// this rank's activation memory as the layout lines print it: the plan's
// allocation (the sets and the scratch) and the lent logits blocks, which
// gpt2_heads allocates apart, as train_gpt2.c's gpt2_activation_bytes counts
// them too
static size_t activation_bytes(const GPT2 *m) { return m->act_bytes + (size_t)m->nheads * head_bytes(m); }

// set i's logits from a free block, if it has none (with nheads 0 it has its own)
static void head_take(GPT2 *m, int i) {
    if (m->nheads == 0 || m->head_of[i] >= 0) return;
    int h = 0;
    while (h < m->nheads && m->head_busy[h]) h++;
    if (h == m->nheads) {  // gpt2_pipeline counted them from the schedule: a schedule the count does not know
        fprintf(stderr, "rank %d: activation set %d finds none of the %d logits blocks free\n", m->grid.rank, i,
                m->nheads);
        exit(1);
    }
    m->head_busy[h] = 1;
    m->head_of[i] = h;
    m->acts[i].logits = (floatX *)((char *)m->heads + (size_t)h * head_bytes(m));
}

static void head_give_back(GPT2 *m, int i) {
    if (m->nheads == 0 || m->head_of[i] < 0) return;
    m->head_busy[m->head_of[i]] = 0;
    m->head_of[i] = -1;
    m->acts[i].logits = NULL;
}

// the nacts activation sets in flight, then the scratch, in one device
// allocation (buffer_plan); with the logits lent, one block of them for the
// evaluations (a step's schedule may want more: gpt2_pipeline)
static void gpt2_alloc_activations(GPT2 *m, int nacts) {
    const GPT2Config *c = &m->config;
    BufferSlice *slices = (BufferSlice *)host_alloc(((size_t)nacts * ACT_SLICES + SCRATCH_SLICES) * sizeof(BufferSlice),
                                                    "buffer plan");
    int nslices = 0;
    m->nacts = nacts;
    m->acts = (Acts *)host_alloc((size_t)nacts * sizeof(Acts), "activation sets");
    for (int k = 0; k < nacts; k++)
        nslices = act_slices(&m->acts[k], c, &m->shard, m->B, m->T, m->rows, m->recompute, slices, nslices);
    nslices = scratch_slices(&m->sc, c, &m->shard, m->B, m->T, m->rows, slices, nslices);
    m->act_bytes = buffer_plan(slices, nslices);
    m->act_memory = device_alloc(m->act_bytes, "activations");
    for (int i = 0; i < nslices; i++) *slices[i].ptr = (char *)m->act_memory + slices[i].offset;
    free(slices);
    m->head_of = (int *)host_alloc((size_t)nacts * sizeof(int), "logits block marks");
    for (int k = 0; k < nacts; k++) m->head_of[k] = -1;
    if (logits_lent(&m->shard)) gpt2_heads(m, 1);
}

// a backward split in B and W (pipeline schedules zbh1, zbv): each
// activation set gets its own set of activation gradients (dact_slices),
// which a micro-batch's B writes and its W reads, in one device allocation
static void gpt2_split_backward(GPT2 *m) {
    BufferSlice *slices = (BufferSlice *)host_alloc((size_t)m->nacts * DACT_SLICES * sizeof(BufferSlice), "buffer plan");
    int nslices = 0;
    m->dsets = (Acts *)host_alloc((size_t)m->nacts * sizeof(Acts), "activation gradient sets");
    for (int k = 0; k < m->nacts; k++)
        nslices = dact_slices(&m->dsets[k], &m->config, &m->shard, m->B, m->T, m->rows, slices, nslices);
    m->dact_bytes = buffer_plan(slices, nslices);
    m->dact_memory = device_alloc(m->dact_bytes, "activation gradients");
    for (int i = 0; i < nslices; i++) *slices[i].ptr = (char *)m->dact_memory + slices[i].offset;
    free(slices);
}

// the step's shape: M micro-batches on the stage's chunks, each taking an
// activation set of its own from its first message or op to its last op;
// per chunk the micro-batch whose backward last writes its weights'
// gradients (last_micro: the data-parallel sums of ZeRO-0/1 start there);
// and on a stage whose chunk k holds the last part among others, as many
// logits blocks as the schedule holds micro-batches on k at once, each
// from its F there to its last op there (its B, or its W where the
// backward is split). As train_gpt2.c's gpt2_pipeline; pipeline_shape is
// its host part, which returns the logits blocks needed (0 where none are
// lent) and exits where the plan breaks the order wte's gradient needs.
static int pipeline_shape(GPT2 *m, int M) {
    const Shard *s = &m->shard;
    m->steps_M = M;
    m->pipe.M = M;
    pipe_sets_free(&m->sets);
    if (pipe_sets_init(&m->sets, m->nacts, s->nchunks, M) != 0) {
        fprintf(stderr, "out of memory for the activation set map\n");
        exit(1);
    }
    PipeOp *ops = (PipeOp *)host_alloc((size_t)pipeline_ops(&m->pipe) * sizeof(PipeOp), "the schedule");
    int n = pipeline_schedule(&m->pipe, s->pp_rank, ops), held = 0, most = 1, split = pipeline_splits_backward(&m->pipe);
    int at[SHARD_MAXV];  // where each chunk's last weight-writing op is in the list
    for (int k = 0; k < SHARD_MAXV; k++) m->last_mb[k] = -1, at[k] = -1;
    for (int i = 0; i < n; i++) {
        int writes = ops[i].kind == PIPE_W || (ops[i].kind == PIPE_B && !split);
        if (writes) m->last_mb[ops[i].chunk] = ops[i].mb, at[ops[i].chunk] = i;
        if (s->chunk[ops[i].chunk].part != s->pp * s->nchunks - 1) continue;
        if (ops[i].kind == PIPE_F) most = ++held > most ? held : most;
        if (writes) held--;
    }
    free(ops);
    // a stage with the first part and the last in two chunks (zbv's stage
    // 0) sums both uses of wte into one gradient, which the embeddings'
    // backward ends (chunk_backward): its last must come after the head's
    int first = -1, last = -1;
    for (int k = 0; k < s->nchunks; k++) {
        if (s->chunk[k].part == 0) first = k;
        if (s->chunk[k].part == s->pp * s->nchunks - 1) last = k;
    }
    if (first >= 0 && last >= 0 && first != last && at[first] < at[last]) {
        fprintf(stderr, "rank %d: -ps %s: the head's last backward comes after the embeddings' on stage %d\n",
                m->grid.rank, pipeline_name(m->pipe.schedule), s->pp_rank);
        exit(1);
    }
    return logits_lent(s) ? most : 0;
}

static void gpt2_pipeline(GPT2 *m, int M) {
    int heads = pipeline_shape(m, M);
    if (heads > 0) gpt2_heads(m, heads);
}

// the host side of a micro-batch on its way to the device (inputs, targets,
// token counts, the pinned staging and readback buffers) and the events that
// pace the host against the GPU
static void gpt2_alloc_staging(GPT2 *m) {
    size_t BT = (size_t)m->B * m->T;
    m->inputs = (int *)host_alloc(BT * sizeof(int), "inputs");
    m->targets = (int *)host_alloc(BT * sizeof(int), "targets");
    m->bucket_count = (int *)host_alloc((size_t)(m->config.V + 1) * sizeof(int), "token counts");
    CUDA_CHECK(cudaMallocHost((void **)&m->staging_host, staging_ints((int)BT) * sizeof(int)));
    CUDA_CHECK(cudaMallocHost((void **)&m->pinned, (BT + 4 + GRID_MAX_WORLD) * sizeof(float)));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->staging_free, cudaEventDisableTiming));
    for (int k = 0; k < PROGRESS_MARKS; k++) CUDA_CHECK(cudaEventCreateWithFlags(&m->progress[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(m->staging_free, m->stream));
}

// -sp 1 (with tp > 1): the rows of a micro-batch's B*T that tp rank
// s->tp_rank holds of the sequence-parallel region, [*row0, *row0 + rows),
// returns rows: the tp_rank-th of tp equal contiguous blocks, in the order
// in which NCCL's all-gather and reduce-scatter lay out the members of the
// tp communicator; without -sp all of them (row0 0). trainer.h's check_model
// has refused a B*T that does not split by tp.
static int sp_rows(int sp, int B, int T, const Shard *s, int *row0) {
    int rows = sp && s->tp > 1 ? B * T / s->tp : B * T;
    *row0 = rows < B * T ? s->tp_rank * rows : 0;
    return rows;
}

// this rank's slice of the model: its stage's layers in one chunk, or in
// the chunks where the schedule places them (interleaved, zbv)
static Shard rank_shard(const GPT2Config *c, const Grid *g, const PipeLayout *pl) {
    Shard s = shard_for(c, g->tp, g->tp_rank, g->pp, g->pp_rank, g->dp, g->dp_rank);
    if (pl->V > 1) {
        int parts[SHARD_MAXV];
        for (int k = 0; k < pl->V; k++) parts[k] = pipeline_part(pl, g->pp_rank, k);
        shard_set_chunks(&s, c, pl->V, parts);
    }
    return s;
}

// this rank's part of the model on the device, from the full model `full`
// (model-file layout, host fp32; not kept) or, when full is NULL, from the
// seeded init; nacts activation sets for (B, T). g is this rank's place in
// the grid (NULL: one rank), pl the step's pipeline (NULL: one chunk a
// stage), nccl its communicators (NULL outside a job); sp: -sp 1 (with tp >
// 1; trainer.h's check_model has checked that B*T splits by tp).
static void gpt2_init_rank(GPT2 *m, const GPT2Config *c, const float *full, uint64_t seed, int B, int T, int recompute,
                           int attention_tc, const Grid *g, const PipeLayout *pl, int zero, int nacts, NcclComm *nccl,
                           int sp) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    char err[256];
    if (g != NULL) m->grid = *g;
    else grid_init(&m->grid, 1, 1, 1, 0, err, sizeof(err));
    g = &m->grid;
    m->pipe = pl != NULL ? *pl : pipe_layout(PIPE_1F1B, g->pp, 1, 1);
    m->shard = rank_shard(c, g, &m->pipe);
    if (unit_table(&m->ut, c, &m->shard, UNIT_ALIGN) != 0) {
        fprintf(stderr, "out of memory allocating the unit table\n");
        exit(1);
    }
    m->zero = zero;
    m->nccl = nccl;
    m->overlap = nccl != NULL && m->shard.dp > 1;
    m->num_params = param_count(c);
    m->B = B;
    m->T = T;
    m->sp = sp && m->shard.tp > 1;
    m->rows = sp_rows(sp, B, T, &m->shard, &m->row0);
    m->recompute = recompute;
    m->attention_tc = attention_tc;
#ifdef ENABLE_FP32
    m->fuse_gelu = 0;  // our GELU kernel is the CPU trainer's formula; the epilogue's may round differently
#else
    m->fuse_gelu = 2;  // forward and backward (llm.c's -ge 2; main may set another level)
#endif
    CUDA_CHECK(cudaStreamCreate(&m->stream));
    gpt2_alloc_params(m);
    gpt2_load_params(m, full, seed);
    gpt2_alloc_activations(m, nacts);
    gpt2_alloc_staging(m);
    CUBLAS_CHECK(cublasLtCreate(&m->blas.handle));
    m->blas.workspace_size = 32u << 20;
    m->blas.workspace = device_alloc(m->blas.workspace_size, "cuBLASLt workspace");
    m->blas.stream = m->stream;
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
}

// one rank, ZeRO-0, one activation set: what the tests build
[[maybe_unused]] static void gpt2_init(GPT2 *m, const GPT2Config *c, const float *full, uint64_t seed, int B, int T,
                                       int recompute, int attention_tc) {
    gpt2_init_rank(m, c, full, seed, B, T, recompute, attention_tc, NULL, NULL, 0, 1, NULL, 0);
}

static void gpt2_free(GPT2 *m) {
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
#ifndef ENABLE_FP32
    cudaFree(m->master);
#endif
    cudaFree(m->params); cudaFree(m->grads); cudaFree(m->param_shard); cudaFree(m->grad_shard);
    cudaFree(m->m); cudaFree(m->v); cudaFree(m->reduced); cudaFree(m->tied_peer);
    for (int k = 0; k < UNIT_SLOTS; k++) {
        cudaFree(m->slot[k]);
        cudaFree(m->bucket[k]);
        if (m->zero >= 2) cudaEventDestroy(m->bucket_done[k]);
    }
    cudaFree(m->act_memory); cudaFree(m->dact_memory); cudaFree(m->heads); cudaFree(m->blas.workspace);
    cublasLtDestroy(m->blas.handle);
    cudaFreeHost(m->staging_host);
    cudaFreeHost(m->pinned);
    cudaEventDestroy(m->staging_free);
    for (int k = 0; k < PROGRESS_MARKS; k++) cudaEventDestroy(m->progress[k]);
    cudaStreamDestroy(m->stream);
    free(m->inputs); free(m->targets); free(m->bucket_count);
    pipe_sets_free(&m->sets); free(m->head_busy); free(m->head_of);
    free(m->acts); free(m->dsets); free(m->ut.units); free(m->unit_params); free(m->unit_grads);
    for (int k = 0; k < m->clock.cap; k++) cudaEventDestroy(m->clock.marks[k]);
    free(m->clock.marks); free(m->clock.spans); cudaFree(m->clock.floats);
}

// ----------------------------------------------------------------------------
// the collectives of the model, each a no-op in a group of one (so a model
// outside a job, without communicators, runs the same code); the tensor
// parallel ones have a section of their own, below

// a mark after each layer's forward or backward. In a job the host waits,
// under the watchdog, for the mark PROGRESS_MARKS back before it goes on, so
// it never queues more than that many layers ahead of the GPU: a stream stuck
// behind a collective whose peer died stops the host here, where the
// watchdog runs, never inside a launch once CUDA's launch queue is full.
static void gpu_progress(GPT2 *m) {
    if (m->nccl == NULL) return;
    int k = (int)(m->progress_n % PROGRESS_MARKS);
    if (m->progress_n >= PROGRESS_MARKS) nccl_sync_event(m->nccl, m->progress[k], "the layers queued before");
    CUDA_CHECK(cudaEventRecord(m->progress[k], m->stream));
    m->progress_n++;
}

// ZeRO: where a unit's full parameters come from and where its gradients go.
// Units are held in UNIT_SLOTS slots; the stream's order makes a released
// slot safe to refill.

// makes unit u's full parameters available (ZeRO-3: all-gathers them)
static floatX *unit_acquire(GPT2 *m, int u) {
    if (m->zero < 3 || m->unit_params[u] != NULL) return m->unit_params[u];
    int k = 0;
    while (k < UNIT_SLOTS && m->slot_unit[k] >= 0) k++;
    assert(k < UNIT_SLOTS && "more units held at once than UNIT_SLOTS");
    const Unit *un = &m->ut.units[u];
    size_t chunk = unit_chunk(m, u);
    if (m->shard.dp > 1) {
        char label[64];
        snprintf(label, sizeof(label), "the parameters of unit %d", u);
        nccl_set_label(m->nccl, label);
        nccl_allgather(m->nccl, &m->nccl->dp, m->param_shard + un->shard_offset, m->slot[k], chunk, NCCL_FLOATX);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(m->slot[k], m->param_shard + un->shard_offset, chunk * sizeof(floatX),
                                   cudaMemcpyDeviceToDevice, m->stream));
    }
    m->slot_unit[k] = u;
    m->unit_params[u] = m->slot[k];
    return m->slot[k];
}

static void unit_release(GPT2 *m, int u) {
    if (m->zero < 3 || m->unit_params[u] == NULL) return;
    for (int k = 0; k < UNIT_SLOTS; k++)
        if (m->slot_unit[k] == u) m->slot_unit[k] = -1;
    m->unit_params[u] = NULL;
}

// where unit u's gradients accumulate during a backward (ZeRO-2/3: a zeroed
// bucket, the one released longest ago, once its last reduction has read it)
static floatX *unit_grad_begin(GPT2 *m, int u) {
    if (m->zero < 2 || m->unit_grads[u] != NULL) return m->unit_grads[u];
    int k = -1;
    for (int j = 0; j < UNIT_SLOTS; j++)
        if (m->bucket_unit[j] < 0 && (k < 0 || m->bucket_freed[j] < m->bucket_freed[k])) k = j;
    assert(k >= 0 && "more gradient buckets open at once than UNIT_SLOTS");
    // (the main stream, nccl->stream, idles there for a late peer: a wait for the watch report)
    if (m->overlap) nccl_main_waits(m->nccl, m->bucket_done[k], "a gradient bucket's reduction");
    CUDA_CHECK(cudaMemsetAsync(m->bucket[k], 0, m->ut.units[u].padded * sizeof(floatX), m->stream));
    m->bucket_unit[k] = u;
    m->unit_grads[u] = m->bucket[k];
    return m->bucket[k];
}

// the next collective reduces unit u's gradients over dp: named for the
// checks (-ic 1), counted for the -gp rule, scaled by -fault poison
static void unit_grads_counted(GPT2 *m, int u) {
    char label[64];
    snprintf(label, sizeof(label), "the gradients of unit %d", u);
    nccl_set_label(m->nccl, label);
    nccl_count_grads(m->nccl);
}

// the unit's backward is done for this micro-batch. ZeRO-2/3: its bucket is
// reduce-scattered over the data-parallel ranks and my chunk added to my
// shard. ZeRO-0/1, after the step's last micro-batch: its gradients are
// all-reduced (0) or reduce-scattered in place (1). With dp > 1 both travel
// on the side stream while the backward goes on (gpt2_step_loss drains them).
static void unit_grad_end(GPT2 *m, int u) {
    const Unit *un = &m->ut.units[u];
    size_t chunk = unit_chunk(m, u);
    if (m->zero <= 1) {
        if (!m->overlap || !m->last_micro) return;
        unit_grads_counted(m, u);
        if (m->zero == 0) nccl_side_allreduce(m->nccl, m->grads + un->offset, un->padded, NCCL_FLOATX, OP_SUM);
        else nccl_side_reduce_scatter(m->nccl, m->grads + un->offset, m->grads + un->offset + unit_lo(m, u), chunk,
                                      NCCL_FLOATX, OP_SUM);
        return;
    }
    int k = 0;
    while (k < UNIT_SLOTS && m->bucket_unit[k] != u) k++;
    assert(k < UNIT_SLOTS);
    cudaStream_t st = m->stream;
    const floatX *mine = m->bucket[k];
    if (m->overlap) {
        unit_grads_counted(m, u);
        nccl_side_reduce_scatter(m->nccl, m->bucket[k], m->reduced, chunk, NCCL_FLOATX, OP_SUM);
        st = m->nccl->side;
        mine = m->reduced;
    }
    add_into_kernel<<<grid_for(chunk / PACK, 256), 256, 0, st>>>(m->grad_shard + un->shard_offset, mine, chunk);
    CUDA_CHECK(cudaGetLastError());
    if (m->overlap) CUDA_CHECK(cudaEventRecord(m->bucket_done[k], st));
    m->bucket_freed[k] = ++m->bucket_clock;
    m->bucket_unit[k] = -1;
    m->unit_grads[u] = NULL;
}

// one block's slices of the per-layer tensors, within its unit
typedef struct {
    floatX *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerParams;

static LayerParams layer_params_at(const GPT2Config *c, const Shard *s, floatX *base) {
    floatX *v[12];
    for (int k = 0; k < 12; k++) {
        v[k] = base;
        base += local_tensor_size(c, s, layer_tensors[k]);
    }
    LayerParams p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    return p;
}

typedef struct {
    floatX *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} LayerActs;

// layer ll's views; the sequence-parallel region's R rows a layer (all B*T without -sp)
static LayerActs layer_acts(const GPT2 *m, const Acts *a, int ll) {
    size_t BT = (size_t)m->B * m->T, R = m->rows, rc = R * m->config.C, btl = BT * m->shard.Cl;
    LayerActs s = {
        a->ln1 + ll * rc, a->qkv + ll * 3 * btl, a->atty + ll * btl, a->residual2 + ll * rc, a->ln2 + ll * rc,
        a->fch + ll * 4 * btl, a->fch_gelu + (m->recompute ? 0 : ll * 4 * btl), a->residual3 + ll * rc,
        a->ln1_mean + ll * R, a->ln1_rstd + ll * R, a->ln2_mean + ll * R, a->ln2_rstd + ll * R,
        a->lse + ll * BT * m->shard.NHl,
    };
    return s;
}

// the residual stream entering the chunk's layer ll (ll = its nl: leaving
// the chunk): this rank's rows of it
static floatX *block_input(const GPT2 *m, const Acts *a, int ll) {
    size_t rc = (size_t)m->rows * m->config.C;
    return ll == 0 ? a->encoded : a->residual3 + (ll - 1) * rc;
}

// where one layer's backward keeps its activation gradients: that of the
// block's output (dres3), of the residual stream between its halves
// (dres2), of fch, ln2, atty, qkv, ln1, and of its input (dx). With d NULL
// the scratch, one backward at a time: the residual stream's gradient in
// place in dresidual, the rest in dbig and dbtc. With a set d (a split
// backward) the layer's own slices, which B writes and W reads, but atty's,
// which only B reads.
typedef struct { floatX *dres3, *dres2, *dfch, *dln2, *datty, *dqkv, *dln1, *dx; } LayerGrads;

static LayerGrads layer_grads(GPT2 *m, Acts *d, int ll) {
    Scratch *sc = &m->sc;
    if (d == NULL) {
        LayerGrads g = {sc->dresidual, sc->dresidual, sc->dbig, sc->dbtc, sc->dbtc, sc->dbig, sc->dbtc, sc->dresidual};
        return g;
    }
    size_t BT = (size_t)m->B * m->T, rc = (size_t)m->rows * m->config.C, btl = BT * m->shard.Cl;
    LayerGrads g = {block_input(m, d, ll + 1), d->residual2 + ll * rc, d->fch + ll * 4 * btl, d->ln2 + ll * rc,
                    sc->dbtc, d->qkv + ll * 3 * btl, d->ln1 + ll * rc, block_input(m, d, ll)};
    return g;
}

// copies m->inputs and ->targets (and, for training, the token buckets of
// this rank's vocabulary rows) into set a on the device. The pinned staging
// buffer is reused only once its previous copy has finished, so the host may
// refill inputs at any time.
static void gpt2_stage_batch(GPT2 *m, Acts *a, int with_buckets) {
    int BT = m->B * m->T, V = m->config.V;
    for (int i = 0; i < BT; i++) {
        if (m->inputs[i] < 0 || m->inputs[i] >= V || m->targets[i] < 0 || m->targets[i] >= V) {
            fprintf(stderr, "batch position %d: token %d / target %d is outside the vocab [0, %d)\n", i, m->inputs[i],
                    m->targets[i], V);
            exit(1);
        }
    }
    if (m->nccl != NULL) nccl_sync_event(m->nccl, m->staging_free, "the staging buffer");
    else CUDA_CHECK(cudaEventSynchronize(m->staging_free));
    Staging s = staging_view(m->staging_host, BT);
    memcpy(s.inputs, m->inputs, (size_t)BT * sizeof(int));
    memcpy(s.targets, m->targets, (size_t)BT * sizeof(int));
    size_t ints = 2 * (size_t)BT;
    if (with_buckets && m->shard.first) {
        s.nbuckets = token_buckets(m->inputs, BT, V, m->shard.v0, m->shard.Vl, m->bucket_count, s.bucket_start,
                                   s.bucket_token, s.bucket_pos);
        ints = staging_ints(BT);
    }
    CUDA_CHECK(cudaMemcpyAsync(a->batch, m->staging_host, ints * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaEventRecord(m->staging_free, m->stream));
    a->staged = staging_view(a->batch, BT);
    a->staged.nbuckets = s.nbuckets;
}

enum { FWD_LOGITS, FWD_LOSS, FWD_TRAIN };

// ----------------------------------------------------------------------------
// tensor parallel and sequence parallel: the named operations

#include "llm3d/cuda/train_gpt2cu/tensor_parallel.cuh"

// ----------------------------------------------------------------------------
// forward and backward of one block. Attention and the MLP each run a
// column-parallel Linear (qkv, fc), this rank's share of the work (its heads,
// its hidden units) and a row-parallel Linear (attproj, fcproj). As
// train_gpt2.c's, with two fusions:
// each LayerNorm is fused into the residual add before it, so the block's
// forward starts from its ln1 (made by the previous block, or by the stage
// for layer 0) and ends before its last residual add, which the stage fuses
// with the next LayerNorm (the output of fcproj is left in sc.proj); GELU is
// fused into fc's matmul where the build does (-ge). The LayerNorms and the
// residual adds run on this rank's rows (m->rows: all B*T without -sp); the
// Linears' sequence-parallel forms gather and scatter those rows.

static void block_forward(GPT2 *m, LayerParams p, LayerActs l, const floatX *x) {
    const Shard *s = &m->shard;
    int B = m->B, T = m->T, C = m->config.C, Cl = s->Cl, BT = B * T, R = m->rows;
    Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    if (m->sp) sp_column_parallel_forward(m, l.qkv, NULL, l.ln1, p.qkvw, p.qkvb, C, 3 * Cl);
    else column_parallel_forward(m, l.qkv, NULL, l.ln1, p.qkvw, p.qkvb, BT, C, 3 * Cl);
    attention_forward(l.atty, l.lse, l.qkv, B, T, Cl, s->NHl, m->attention_tc, st);
    if (m->sp) sp_row_parallel_forward(m, sc->proj, l.atty, p.attprojw, p.attprojb, Cl, C);
    else row_parallel_forward(m, sc->proj, l.atty, p.attprojw, p.attprojb, BT, Cl, C);
    residual_layernorm_forward(l.residual2, l.ln2, l.ln2_mean, l.ln2_rstd, x, sc->proj, p.ln2w, p.ln2b, R, C, st);
    if (m->fuse_gelu >= 1) {
        if (m->sp) sp_column_parallel_forward(m, l.fch_gelu, l.fch, l.ln2, p.fcw, p.fcb, C, 4 * Cl);
        else column_parallel_forward(m, l.fch_gelu, l.fch, l.ln2, p.fcw, p.fcb, BT, C, 4 * Cl);
    } else {
        if (m->sp) sp_column_parallel_forward(m, l.fch, NULL, l.ln2, p.fcw, p.fcb, C, 4 * Cl);
        else column_parallel_forward(m, l.fch, NULL, l.ln2, p.fcw, p.fcb, BT, C, 4 * Cl);
        gelu_forward(l.fch_gelu, l.fch, 4 * (size_t)BT * Cl, st);
    }
    if (m->sp) sp_row_parallel_forward(m, sc->proj, l.fch_gelu, p.fcprojw, p.fcprojb, 4 * Cl, C);
    else row_parallel_forward(m, sc->proj, l.fch_gelu, p.fcprojw, p.fcprojb, BT, 4 * Cl, C);
}

// which part of a backward to run: all of it, or with the backward split
// (pipeline schedules with W ops) the input's gradient (B) or the weights'
// (W). B leaves in the layer's activation gradients (LayerGrads of a set)
// all that W reads: each Linear's output gradient and each LayerNorm's,
// which no later part of the backward writes over.
enum { BACK_ALL, BACK_INPUT, BACK_WEIGHTS };

// from the gradient of the block's output (d.dres3) to that of its input x
// (d.dx; this rank's rows of them under -sp), and of its parameters g (+=).
// part: BACK_INPUT leaves g alone, BACK_WEIGHTS reads d and writes g alone
// (p unused), each in the order of BACK_ALL, which is the whole backward in
// the scratch, d.dres3, d.dres2 and d.dx all sc.dresidual
static void block_backward(GPT2 *m, LayerParams p, LayerParams g, LayerActs l, LayerGrads d, const floatX *x, int part) {
    const Shard *s = &m->shard;
    int B = m->B, T = m->T, C = m->config.C, Cl = s->Cl, BT = B * T, R = m->rows;
    int in = part != BACK_WEIGHTS, wt = part != BACK_INPUT;
    size_t rc = (size_t)R * C;
    Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    float *pt = sc->colsum_partial;
    if (!wt) memset(&g, 0, sizeof(g));  // NULL: no weight gradients
    if (m->recompute && wt) gelu_forward(l.fch_gelu, l.fch, 4 * (size_t)BT * Cl, st);  // fcproj's dweight reads it
    // fcproj: d(its output) = dres3; dfch = d(fch), my slice (through the
    // GELU: fused into the matmul, or after it)
    if (m->sp)
        sp_row_parallel_backward(m, in ? d.dfch : NULL, g.fcprojw, g.fcprojb, d.dres3, l.fch_gelu, p.fcprojw,
                                 m->fuse_gelu >= 2 ? l.fch : NULL, 4 * Cl, C);
    else
        row_parallel_backward(m, in ? d.dfch : NULL, g.fcprojw, g.fcprojb, d.dres3, l.fch_gelu, p.fcprojw,
                              m->fuse_gelu >= 2 ? l.fch : NULL, BT, 4 * Cl, C);
    if (in && m->fuse_gelu < 2) gelu_backward(d.dfch, l.fch, 4 * (size_t)BT * Cl, st);
    // fc: dln2, whole (-sp: my rows)
    if (m->sp) sp_column_parallel_backward(m, in ? d.dln2 : NULL, g.fcw, g.fcb, d.dfch, l.ln2, p.fcw, C, 4 * Cl);
    else column_parallel_backward(m, in ? d.dln2 : NULL, g.fcw, g.fcb, d.dfch, l.ln2, p.fcw, BT, C, 4 * Cl);
    // dres2 = dres3 + the LayerNorm's part (in place in the scratch)
    if (in && d.dres2 != d.dres3)
        CUDA_CHECK(cudaMemcpyAsync(d.dres2, d.dres3, rc * sizeof(floatX), cudaMemcpyDeviceToDevice, st));
    layernorm_backward(in ? d.dres2 : NULL, g.ln2w, g.ln2b, pt, d.dln2, l.residual2, p.ln2w, l.ln2_mean, l.ln2_rstd, R,
                       C, st);
    // attproj: d(its output) = dres2; datty, my heads
    if (m->sp)
        sp_row_parallel_backward(m, in ? d.datty : NULL, g.attprojw, g.attprojb, d.dres2, l.atty, p.attprojw, NULL, Cl,
                                 C);
    else
        row_parallel_backward(m, in ? d.datty : NULL, g.attprojw, g.attprojb, d.dres2, l.atty, p.attprojw, NULL, BT, Cl,
                              C);
    if (in) attention_backward(d.dqkv, sc->delta, d.datty, l.qkv, l.atty, l.lse, B, T, Cl, s->NHl, m->attention_tc, st);
    // qkv: dqkv, my heads; dln1, whole (-sp: my rows)
    if (m->sp) sp_column_parallel_backward(m, in ? d.dln1 : NULL, g.qkvw, g.qkvb, d.dqkv, l.ln1, p.qkvw, C, 3 * Cl);
    else column_parallel_backward(m, in ? d.dln1 : NULL, g.qkvw, g.qkvb, d.dqkv, l.ln1, p.qkvw, BT, C, 3 * Cl);
    if (in && d.dx != d.dres2)
        CUDA_CHECK(cudaMemcpyAsync(d.dx, d.dres2, rc * sizeof(floatX), cudaMemcpyDeviceToDevice, st));
    layernorm_backward(in ? d.dx : NULL, g.ln1w, g.ln1b, pt, d.dln1, x, p.ln1w, l.ln1_mean, l.ln1_rstd, R, C, st);
}

// ----------------------------------------------------------------------------
// a chunk's forward and backward of one micro-batch (a stage holds one
// chunk of layers, or V with -ps interleaved and zbv). The model's first
// part starts from the tokens, the others from what the part before sent;
// the last ends in the loss.

// whether chunk k of this stage holds the model's first / last part
static int chunk_first(const Shard *s, int k) { return s->chunk[k].part == 0; }
static int chunk_last(const Shard *s, int k) { return s->chunk[k].part == s->pp * s->nchunks - 1; }

// the forward of chunk k on set a: the embeddings on part 0, the chunk's
// layers (units u_layer0 + its offset among the stage's layers), the head
// on the last part. FWD_LOGITS: logits only. FWD_LOSS: also sc.losses +=
// the per-position losses. FWD_TRAIN: also dlogits = dloss *
// d(loss)/d(logits) in place of the logits, for chunk_backward. Set a holds
// the staged micro-batch.
static void chunk_forward(GPT2 *m, Acts *a, int k, int mode, float dloss) {
    const GPT2Config *c = &m->config;
    const Shard *s = &m->shard;
    const ShardChunk *ch = &s->chunk[k];
    int B = m->B, T = m->T, C = c->C, BT = B * T, R = m->rows;
    size_t rc = (size_t)R * C;
    Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;

    if (chunk_first(s, k)) {
        // with chunks, a pooled set's encoded may hold what a receive put
        // there for another chunk, its MAC check still to read it
        if (s->nchunks > 1) nccl_mac_before_write(m->nccl, st, a->encoded, rc * sizeof(floatX));
        floatX *wte = unit_acquire(m, m->ut.u_wte), *wpe = unit_acquire(m, m->ut.u_wpe);
        if (m->sp) sp_vocab_parallel_embedding_forward(m, a->encoded, a->staged.inputs, wte, wpe);
        else vocab_parallel_embedding_forward(m, a->encoded, a->staged.inputs, wte, wpe, B, T, C);
        unit_release(m, m->ut.u_wpe);
        // a stage that also holds the head (pp 1, zbv's stage 0) keeps wte for
        // it; under zbv the head's B releases it and chunk 0's next F gathers
        // it again (ZeRO-3: one all-gather more, at most 3 slots)
        if (!s->last) unit_release(m, m->ut.u_wte);
    }
    int u = m->ut.u_layer0 + ch->off;
    LayerParams p = layer_params_at(c, s, unit_acquire(m, u));
    LayerActs l0 = layer_acts(m, a, 0);
    layernorm_forward(l0.ln1, l0.ln1_mean, l0.ln1_rstd, a->encoded, p.ln1w, p.ln1b, R, C, st);
    for (int ll = 0; ll < ch->nl; ll++) {
        LayerActs l = layer_acts(m, a, ll);
        block_forward(m, p, l, block_input(m, a, ll));
        // the block's last residual add, fused with the next LayerNorm: the
        // next layer's ln1 or the final one (ZeRO-3 gathers that unit before
        // dropping this one)
        int next = ll + 1 < ch->nl ? u + 1 : chunk_last(s, k) ? m->ut.u_lnf : -1;
        if (next < 0) {
            residual_forward(l.residual3, l.residual2, sc->proj, rc, st);
            unit_release(m, u);
            gpu_progress(m);
            break;
        }
        floatX *np = unit_acquire(m, next);
        if (next == m->ut.u_lnf) {
            // the head takes the gathered layout: my rows of the final
            // LayerNorm's output, all-gathered in place into lnf (-sp)
            floatX *lnf_mine = a->lnf + (size_t)m->row0 * C;
            residual_layernorm_forward(l.residual3, lnf_mine, a->lnf_mean, a->lnf_rstd, l.residual2, sc->proj, np,
                                       np + C, R, C, st);
            if (m->sp) sp_gather(m, a->lnf, lnf_mine);
        } else {
            LayerParams pn = layer_params_at(c, s, np);
            LayerActs ln = layer_acts(m, a, ll + 1);
            residual_layernorm_forward(l.residual3, ln.ln1, ln.ln1_mean, ln.ln1_rstd, l.residual2, sc->proj, pn.ln1w,
                                       pn.ln1b, R, C, st);
            p = pn;
        }
        unit_release(m, u);
        u = next;
        gpu_progress(m);
    }
    if (!chunk_last(s, k)) return;
    floatX *wte = unit_acquire(m, m->ut.u_wte);
    column_parallel_forward(m, a->logits, NULL, a->lnf, wte, NULL, BT, C, s->Vl);
    unit_release(m, m->ut.u_lnf);
    unit_release(m, m->ut.u_wte);
    if (mode == FWD_LOGITS) return;
    vocab_parallel_cross_entropy(m, a->logits, sc->losses, a->staged.targets, dloss, BT, mode == FWD_TRAIN);
}

// the stage's whole forward of set a: one chunk, or on one rank (pp 1)
// several in model order (-ps zbv's two, in a V), each taking the output of
// the one before into the set's chunk input, as pipeline_run's hand-off does
static void stage_forward(GPT2 *m, Acts *a, int mode, float dloss) {
    const Shard *s = &m->shard;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(floatX);
    for (int p = 0; p < s->nchunks; p++) {
        int stage, k, before;
        pipeline_place(&m->pipe, p, &stage, &k);
        if (p > 0) {
            pipeline_place(&m->pipe, p - 1, &stage, &before);
            CUDA_CHECK(cudaMemcpyAsync(a->encoded, block_input(m, a, s->chunk[before].nl), bytes,
                                       cudaMemcpyDeviceToDevice, m->stream));
        }
        chunk_forward(m, a, k, mode, dloss);
    }
}

// the backward of chunk k after set a's FWD_TRAIN forward; gradients
// accumulate (+=). d: the activation gradients, NULL for the scratch (one
// backward at a time), or with the backward split the micro-batch's own
// set, which its W reads. part: BACK_ALL, or BACK_INPUT then later
// BACK_WEIGHTS (block_backward): the head's, the layers' and the
// embeddings' weight gradients all wait for W, in the same order. On a
// chunk other than the last part, a->grad_in holds the gradient of its
// output; on one other than the first part, the gradient of its input ends
// in sc.dresidual (d NULL) or d->encoded, for the part before.
static void chunk_backward(GPT2 *m, Acts *a, Acts *d, int part, int k) {
    const GPT2Config *c = &m->config;
    const Shard *s = &m->shard;
    int B = m->B, T = m->T, C = c->C, BT = B * T, R = m->rows, nl = s->chunk[k].nl;
    int in = part != BACK_WEIGHTS, wt = part != BACK_INPUT;
    size_t rc = (size_t)R * C;
    Scratch *sc = &m->sc;
    cudaStream_t st = m->stream;
    float *pt = sc->colsum_partial;
    // the gradients of the chunk's output and, on the last part, of the
    // final LayerNorm's output (my rows)
    floatX *dout = d == NULL ? sc->dresidual : block_input(m, d, nl), *dlnf_out = d == NULL ? sc->dbtc : d->lnf;

    if (chunk_last(s, k)) {  // logits = lnf @ wte^T, then the final LayerNorm
        floatX *wte = in ? unit_acquire(m, m->ut.u_wte) : NULL, *lnf = in ? unit_acquire(m, m->ut.u_lnf) : NULL;
        floatX *dwte = wt ? unit_grad_begin(m, m->ut.u_wte) : NULL, *dlnf = wt ? unit_grad_begin(m, m->ut.u_lnf) : NULL;
        if (m->sp) {
            // the head's input was gathered and kept (chunk_forward), so its
            // weights' gradient needs no gather; its own gradient is summed
            // over the tp ranks onto my rows
            if (wt) matmul_backward_dweight(&m->blas, dwte, a->logits, a->lnf, BT, C, s->Vl);
            if (in) {
                matmul_backward_dinp(&m->blas, sc->sp_partial, a->logits, wte, NULL, BT, C, s->Vl);
                sp_reduce_scatter(m, dlnf_out, sc->sp_partial);
            }
        } else {
            column_parallel_backward(m, in ? dlnf_out : NULL, dwte, NULL, a->logits, a->lnf, wte, BT, C, s->Vl);
        }
        if (in) CUDA_CHECK(cudaMemsetAsync(dout, 0, rc * sizeof(floatX), st));
        layernorm_backward(in ? dout : NULL, dlnf, wt ? dlnf + C : NULL, pt, dlnf_out, block_input(m, a, nl), lnf,
                           a->lnf_mean, a->lnf_rstd, R, C, st);
        if (in) {
            unit_release(m, m->ut.u_lnf);
            unit_release(m, m->ut.u_wte);
        }
        if (wt) {
            unit_grad_end(m, m->ut.u_lnf);
            if (!s->first) unit_grad_end(m, m->ut.u_wte);
        }
    } else if (in) {
        CUDA_CHECK(cudaMemcpyAsync(dout, a->grad_in, rc * sizeof(floatX), cudaMemcpyDeviceToDevice, st));
    }
    // the residual stream's gradient: d(residual3 of layer ll) on entering, d(its input) on leaving
    for (int ll = nl - 1; ll >= 0; ll--) {
        int u = m->ut.u_layer0 + s->chunk[k].off + ll;
        LayerParams p, g;
        memset(&p, 0, sizeof(p));
        memset(&g, 0, sizeof(g));
        if (in) p = layer_params_at(c, s, unit_acquire(m, u));
        if (wt) g = layer_params_at(c, s, unit_grad_begin(m, u));
        block_backward(m, p, g, layer_acts(m, a, ll), layer_grads(m, d, ll), block_input(m, a, ll), part);
        if (in) unit_release(m, u);
        if (wt) unit_grad_end(m, u);
        gpu_progress(m);
    }
    if (chunk_first(s, k) && wt) {
        floatX *dwte = unit_grad_begin(m, m->ut.u_wte), *dwpe = unit_grad_begin(m, m->ut.u_wpe);
        floatX *dembed = d == NULL ? sc->dresidual : d->encoded;
        if (m->sp) sp_vocab_parallel_embedding_backward(m, dwte, dwpe, dembed, &a->staged);
        else vocab_parallel_embedding_backward(m, dwte, dwpe, dembed, &a->staged, B, T, C);
        unit_grad_end(m, m->ut.u_wpe);
        unit_grad_end(m, m->ut.u_wte);
    }
}

// the whole backward of set a, in the scratch. One chunk only: a set holds
// one chunk's activations, so after stage_forward ran several (zbv on one
// rank) the earlier chunks' are gone; pipeline_run gives each chunk a set.
static void stage_backward(GPT2 *m, Acts *a) {
    if (m->shard.nchunks != 1) {
        fprintf(stderr, "train_gpt2cu: gpt2_backward: the model holds %d chunks of layers on one rank (-ps %s); "
                "its backward runs one chunk per set: train it through pipeline_run\n", m->shard.nchunks,
                pipeline_name(m->pipe.schedule));
        exit(1);
    }
    chunk_backward(m, a, NULL, BACK_ALL, 0);
}

// one rank, one micro-batch in set 0 (the tests and sampling): stages
// model->inputs and ->targets and runs the forward
static void gpt2_forward(GPT2 *m, int mode, float dloss) {
    gpt2_stage_batch(m, &m->acts[0], mode == FWD_TRAIN);
    stage_forward(m, &m->acts[0], mode, dloss);
}

[[maybe_unused]] static void gpt2_backward(GPT2 *m) { stage_backward(m, &m->acts[0]); }

static void gpt2_zero_grad(GPT2 *m) {
    if (m->grads) CUDA_CHECK(cudaMemsetAsync(m->grads, 0, m->ut.num_local * sizeof(floatX), m->stream));
    if (m->grad_shard) CUDA_CHECK(cudaMemsetAsync(m->grad_shard, 0, m->ut.num_shard * sizeof(floatX), m->stream));
}

static void gpt2_zero_losses(GPT2 *m) {
    CUDA_CHECK(cudaMemsetAsync(m->sc.losses, 0, ((size_t)m->B * m->T + 1) * sizeof(float), m->stream));
}

// waits for everything queued on the model's stream; in a job under the
// NCCL watchdog, since the stream may hold collectives that wait on peers
static void gpu_sync(GPT2 *m, const char *what) {
    if (m->nccl != NULL) nccl_sync(m->nccl, m->stream, what);
    else CUDA_CHECK(cudaStreamSynchronize(m->stream));
}

// this rank's sum of the losses since gpt2_zero_losses, and the slot after
// them in m->pinned[BT] (waits for the GPU)
static double gpt2_loss_sum(GPT2 *m) {
    size_t BT = (size_t)m->B * m->T;
    CUDA_CHECK(cudaMemcpyAsync(m->pinned, m->sc.losses, (BT + 1) * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    gpu_sync(m, "the losses");
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += m->pinned[i];
    return sum;
}

// the mean of the losses over nbatches micro-batches (one rank)
[[maybe_unused]] static float gpt2_mean_loss(GPT2 *m, int nbatches) {
    return (float)(gpt2_loss_sum(m) / ((double)m->B * m->T * nbatches));
}

#include "llm3d/cuda/train_gpt2cu/optimizer.cuh"

#include "llm3d/cuda/train_gpt2cu/export.cuh"

// ----------------------------------------------------------------------------
// the trainer: trainer.h has what train_gpt2.c's main() does too, around
// the loop; here is what the GPU does in it

#include "llm3d/trainer.h"
#include "llm3d/watch.h"

#include "llm3d/cuda/train_gpt2cu/pipeline_run.cuh"

#ifndef TESTING
// ----------------------------------------------------------------------------
// the job: one process per rank, any (dp, tp, pp) layout, over NCCL with one
// GPU per rank, or over the host backend where ranks share a GPU, or with
// -hb 2 over NCCL there too, each rank an NCCL node of its own (doc/gpu.md).
// The model's collectives are in the model section; here are the pipeline's
// messages, the step's end, the checks and evaluation
// (train_gpt2cu/checks.cuh and eval.cuh) and the files.

typedef struct {
    Launch launch;
    Grid grid;
    int zero;
    NcclComm *nccl;     // every rank has one, a job of one rank too: -np 1 runs the NCCL path
} Parallel;

// check_launch_gpus: the process that will launch -np ranks on this node
// refuses a node without a GPU, once, before it starts any (ranks that
// outnumber the GPUs share them, in host mode). A short-lived
// child counts them: the launcher itself stays free of CUDA, whose threads
// would otherwise take the signals it waits for on its signalfd.
static void check_launch_gpus(const Options *o) {
    char err[512], msg[600];
    LaunchMeet meet = job_meet(o);
    int launcher = parallel_will_launch(o->np, o->rendezvous, o->key_file, &meet);
    if (!launcher) return;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n < 255 ? n : 255);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return;  // the ranks will check for themselves
    int ndev = WEXITSTATUS(status);
    if (gpu_for_rank(o->np - 1, ndev, 0, 1, err, sizeof(err)) < 0) {
        snprintf(msg, sizeof(msg), "flag -np %d: %s", o->np, err);
        die_usage(msg);
    }
}

// parallel_setup: with -np > 1 this process becomes the launcher and never
// returns; a rank binds its GPU before anything else touches the device, then
// joins the job's communicators
static void parallel_setup(Parallel *par, const Options *o, const Fault *fault, int argc, char **argv) {
    char err[512];
    memset(par, 0, sizeof(*par));
    LaunchMeet meet = job_meet(o);
    int rc = parallel_join(argc, argv, o->np, o->tp, o->pp, o->rendezvous, o->key_file, &meet, o->timeout, &par->launch,
                           &par->grid, err, sizeof(err));
    if (rc != 0) die(rc, err);
    Launch *L = &par->launch;
    par->zero = o->zero;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) ndev = 0;
    int host_mode = gpu_host_mode(o->host_backend, parallel_launched_rank(), par->grid.world, ndev);
    // -hb 2: NCCL, and ranks may share GPUs as in host mode (each its own NCCL node, nccl_join)
    int shared_nccl = o->host_backend == GPU_HB_NCCL_SHARED;
    int device = gpu_for_rank(L->local_rank, ndev, gpu_own_visible(L), host_mode || shared_nccl, err, sizeof(err));
    if (device < 0) {
        fprintf(stderr, "train_gpt2cu: rank %d: %s%s%s\n", L->rank, err, e != cudaSuccess ? ": " : "",
                e != cudaSuccess ? cudaGetErrorString(e) : "");
        exit(1);
    }
    CUDA_CHECK(cudaSetDevice(device));
    int mode = host_mode ? 1 : shared_nccl ? GPU_HB_NCCL_SHARED : 0;
    if (nccl_init(&par->nccl, &par->grid, L->key, L->rendezvous, o->timeout, fault, mode, err, sizeof(err)) != 0)
        die(1, err);
    nccl_set_check(par->nccl, o->check_collectives);
}

// the ranks all-gather their start marks, so that every rank starts from
// what rank 0 does: the same checkpoint, or the file rank 0 checked
// (trainer.h's start_mark). Each rank that differs says so in one line; all
// wait for those lines, then exit 2. The model is not built yet, so the
// marks travel through a buffer of their own.
static void agree_on_start(const Job *job, Parallel *par) {
    enum { W = START_MARK_WORDS };
    int world = par->grid.world, rank = par->grid.rank;
    if (world == 1) return;
    size_t bytes = (size_t)world * W * sizeof(uint64_t);
    uint64_t *marks = (uint64_t *)malloc(bytes), *d_marks = NULL, mine[W];
    if (marks == NULL) die(1, "out of memory for the ranks' start marks");
    start_mark(job, mine);
    CUDA_CHECK(cudaMalloc((void **)&d_marks, bytes));
    CUDA_CHECK(cudaMemcpy(d_marks + rank * W, mine, sizeof(mine), cudaMemcpyHostToDevice));
    // on nccl->stream, which is still the default stream here (main sets the
    // model's later), so the gather runs after the blocking copy above
    nccl_allgather(par->nccl, &par->nccl->world, d_marks + rank * W, d_marks, W, ncclUint64);
    nccl_sync(par->nccl, par->nccl->stream, "the ranks' start marks");
    CUDA_CHECK(cudaMemcpy(marks, d_marks, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_marks));
    int refused = start_marks_refused(job, marks, world, rank);
    free(marks);
    if (!refused) return;
    nccl_barrier(par->nccl, &par->nccl->world);
    exit(2);
}

// pp > 1: the MAC state for a step's pipeline messages, made now, not
// mid-run: room for the most messages a stage receives in one step (each
// micro-batch's activation and gradient on each of its chunks, the tied
// wte's), each as large as the largest of them (an evaluation checks its
// messages batch by batch: one a chunk). An activation or its gradient is
// this rank's rows (all B*T without -sp).
static void reserve_pipeline_macs(GPT2 *m, Parallel *par, int accum) {
    char err[512];
    size_t msg = (size_t)m->rows * m->config.C * sizeof(floatX), tied = tied_elems(m) * sizeof(floatX);
    int recvs = 2 * accum * m->shard.nchunks + 2;
    if (nccl_mac_reserve(par->nccl, recvs, msg > tied ? msg : tied, err, sizeof(err)) != 0) die(1, err);
}

// rank 0's lines about the GPU and the precision
static void print_device(const cudaDeviceProp *prop, double peak, const GpuOptions *gopt, const GPT2 *m) {
    printf("device: %s, compute capability %d.%d, %.1f GiB, ", prop->name, prop->major, prop->minor,
           prop->totalGlobalMem / 1073741824.0);
    if (peak > 0) printf("bf16 dense peak %.0f TFLOPS\n", peak / 1e12);
    else printf("bf16 dense peak unknown (MFU n/a)\n");
    printf("precision: %s compute, fp32 master weights and AdamW state; recompute GELU %d; GELU fused %s; "
           "attention %s; activations %.2f GiB\n", precision_name, gopt->recompute,
           m->fuse_gelu == 2 ? "forward and backward" : m->fuse_gelu == 1 ? "forward" : "no",
           gopt->attention_tc && attention_tc_supports(m->config.C / m->config.NH) ? "tensor cores" : "fp32 FMA",
           activation_bytes(m) / 1073741824.0);
}

// the layout line (rank 0), then one line per rank, in rank order, from the rank itself
static void print_layout(const GPT2 *m, Parallel *par, const Options *o, int accum, int device) {
    const Grid *g = &par->grid;
    PipeLayout pl = job_pipeline(o, g->pp, accum);
    char rows[96] = "", chunks[256], more[160] = "";  // -sp: this rank's positions of the sequence-parallel region
    if (m->sp) snprintf(rows, sizeof(rows), ", positions %d..%d, %zu bytes of activations", m->row0,
                        m->row0 + m->rows - 1, activation_bytes(m));
    size_t at = 0;
    if (m->nheads > 0)  // the head's chunk among others: its logits lent to its sets (gpt2_pipeline)
        at += (size_t)snprintf(more, sizeof(more), ", logits lent from %d buffer%s", m->nheads, m->nheads == 1 ? "" : "s");
    if (m->dsets != NULL && at < sizeof(more))  // the split backward's activation gradients (gpt2_split_backward)
        snprintf(more + at, sizeof(more) - at, ", %.2f GiB of activation gradients (%d sets)",
                 m->dact_bytes / 1073741824.0, m->nacts);
    if (g->rank == 0)
        printf("layout: %d ranks = dp %d x tp %d x pp %d%s, ZeRO-%d, %s schedule with %d micro-batches "
               "(bubble %.3f), NCCL %d.%d.%d\n", g->world, g->dp, g->tp, g->pp, m->sp ? " (sequence parallel)" : "",
               par->zero, pipeline_name(pl.schedule), accum, pipeline_bubble(&pl), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    for (int r = 0; r < g->world; r++) {
        if (r == g->rank)
            printf("rank %d (dp %d, pp %d, tp %d): GPU %d, layers %s, %zu parameters here, "
                   "%.2f GiB of weights, gradients and AdamW state, %.2f GiB of activations (%d sets)%s%s\n", r,
                   g->dp_rank, g->pp_rank, g->tp_rank, device, shard_chunk_list(&m->shard, chunks, sizeof(chunks)),
                   m->ut.num_local, m->param_bytes / 1073741824.0, activation_bytes(m) / 1073741824.0, m->nacts, rows, more);
        fflush(stdout);
        nccl_barrier(par->nccl, &par->nccl->world);
    }
}

// at the end of a job, rank 0: what the CUDA allocator says of its GPU
// (cudaMemGetInfo, total less free: every process on that GPU, the ranks
// that share it in host mode or under -hb 2 included, and CUDA's and NCCL's
// own buffers), beside the trainer's own counts in the layout lines. The
// trainer allocates everything before the first step, so this is near the
// peak.
static void print_gpu_memory(const Parallel *par, int device) {
    size_t free_bytes = 0, total = 0;
    if (par->grid.rank != 0 || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return;
    printf("GPU %d memory in use at the end: %.1f MiB of %.1f MiB (cudaMemGetInfo: every process on that GPU)\n",
           device, (total - free_bytes) / 1048576.0, total / 1048576.0);
    fflush(stdout);
}

// at the end of a job, rank 0: what shows the checks (-ic 1) ran. Over
// NCCL, the calls judged and the check points that judged them
// (nccl_check_counts); in host mode, the host backend's times, as
// train_gpt2.c prints them
static void print_checked_collectives(const Parallel *par, int steps) {
    const NcclComm *c = par->nccl;
    if (par->grid.rank != 0 || c == NULL || steps <= 0) return;
    if (c->host != NULL) {
        print_host_collective_times(c->host, steps);
        return;
    }
    long calls = 0, points = 0;
    nccl_check_counts(c, &calls, &points);
    if (c->chk.on)
        printf("checked collectives over NCCL: %ld calls judged in %ld check points (rank 0's, %d steps)\n", calls,
               points, steps);
    fflush(stdout);
}

// the sum over the world of this rank's losses (only the last stage has any;
// each position's on the one tp rank holding its target) with, in the slot
// after them, the stop flag: *stop in, "a signal reached some rank" out, so
// every rank ends the step with the same verdict
static double world_loss_sum(GPT2 *m, Parallel *par, int *stop) {
    size_t BT = (size_t)m->B * m->T;
    m->pinned[BT] = stop != NULL && *stop ? 1.0f : 0.0f;  // (the stream reads it before the sum comes back over it)
    CUDA_CHECK(cudaMemcpyAsync(m->sc.losses + BT, m->pinned + BT, sizeof(float), cudaMemcpyHostToDevice, m->stream));
    // dp > 1: every rank's own gradient sum of squares (-gp), in the same all-reduce
    int world = par->grid.world, extra = m->shard.dp > 1 ? world : 0;
    float *norms = m->pinned + BT + 4;
    if (extra) nccl_grad_sumsq_slots(par->nccl, m->sc.losses + BT + 1, m->stream);
    if (world > 1) nccl_allreduce(par->nccl, &par->nccl->world, m->sc.losses, BT + 1 + extra, ncclFloat32, OP_SUM);
    if (extra)
        CUDA_CHECK(cudaMemcpyAsync(norms, m->sc.losses + BT + 1, extra * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    double sum = gpt2_loss_sum(m);  // waits for the stream; the summed flag lands in pinned[BT]
    if (stop != NULL) *stop = m->pinned[BT] > 0.0f;
    for (int r = 0; r < extra; r++) norms[r] = sqrtf(norms[r]);
    m->rank_norms = extra ? norms : NULL;
    return sum;
}

// pp > 1: every MAC'd message received since nccl_mac_step_begin checked;
// a bad one ends the job here, before anything of it is applied
static void mac_check_or_exit(GPT2 *m, Parallel *par, const char *when) {
    char err[512];
    if (m->shard.pp == 1 || nccl_mac_step_check(par->nccl, err, sizeof(err)) == 0) return;
    fprintf(stderr, "train_gpt2cu: %s; %s\n", err, when);
    nccl_abort_all(par->nccl);
    exit(1);
}

// the end of a step, after its pipeline run, up to the update: the
// data-parallel sums drained (they ran during the backward), the tied wte's
// halves swapped, under -sp the LayerNorms' gradients summed over tp, the
// replicated gradients shared from tp rank 0, every MAC tag of the step
// checked (before anything is applied), the norm queued, the loss and the
// stop requests summed (the host waits for them), and last, under -ic 1, the
// step's check point: every collective whose result the update reads (the
// norm's and the losses' all-reduces too) is judged before the update, and a
// failed check ends the job here. Returns the step's mean loss; the loop
// then applies the update (gpt2_apply_update) unless it is not finite or -sl
// or -sg skip it.
static float gpt2_step_loss(GPT2 *m, Parallel *par, int accum, int *stop) {
    nccl_side_drain(par->nccl);  // the data-parallel sums, made during the backward
    tied_exchange(m);
    sp_sum_layernorm_grads(m);
    if (m->shard.tp > 1) for_each_run(m, tp_share_run, NULL, 0);
    mac_check_or_exit(m, par, "the step is not applied");
    gpt2_norm(m);  // queued before the losses' wait, which then covers it
    double loss = world_loss_sum(m, par, stop) / ((double)m->B * m->T * accum * m->shard.dp);
    nccl_check_point(par->nccl);  // -ic 1: the step's checked collectives judged; a failure exits here
    return (float)loss;
}

// the world's host floats, n a rank, all-gathered in place: host holds
// world x n, this rank's n at its own place, and gets everyone's; dev, a
// device buffer of as many, carries them (the reports between steps: the
// watch report's, the pipeline meter's). Waits for the GPU.
static void world_allgather_floats(GPT2 *m, const Parallel *par, float *host, float *dev, size_t n, const char *what) {
    size_t at = (size_t)par->grid.rank * n, bytes = (size_t)par->grid.world * n * sizeof(float);
    CUDA_CHECK(cudaMemcpy(dev + at, host + at, n * sizeof(float), cudaMemcpyHostToDevice));
    nccl_allgather(par->nccl, &par->nccl->world, dev + at, dev, n, ncclFloat32);  // in place
    gpu_sync(m, what);
    CUDA_CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

#include "llm3d/cuda/train_gpt2cu/checks.cuh"

// the sum over the world of one float per rank (the ranks' verdicts on a
// file), through the flag slot
static float world_sum(GPT2 *m, Parallel *par, float x) {
    float *slot = m->sc.losses + (size_t)m->B * m->T, *h = m->pinned + (size_t)m->B * m->T + 2;
    *h = x;
    CUDA_CHECK(cudaMemcpyAsync(slot, h, sizeof(float), cudaMemcpyHostToDevice, m->stream));
    if (par->grid.world > 1) nccl_allreduce(par->nccl, &par->nccl->world, slot, 1, ncclFloat32, OP_SUM);
    CUDA_CHECK(cudaMemcpyAsync(h, slot, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    gpu_sync(m, "a verdict of every rank");
    return *h;
}

#include "llm3d/cuda/train_gpt2cu/eval.cuh"

static void add_param_sumsq(GPT2 *m, const Run *r, void *ctx) {
    (void)ctx;
    sumsq_add_kernel<<<NORM_BLOCKS, NORM_THREADS, 0, m->stream>>>(m->sc.norm_partial, param_at(m, r->u, r->j), r->n);
    CUDA_CHECK(cudaGetLastError());
}

// whether every parameter this rank updates is finite, the same answer on
// every rank, as train_gpt2.c's: checked before the parameters are written
// (a checkpoint, the final model), never in a step, which would cost a pass
// and a wait. The partial sums of squares (the norm's, free once AdamW has
// read the norm) come back to the host, which adds them in double: a NaN or
// an infinity makes the sum NaN or infinite.
static int gpt2_params_finite(GPT2 *m) {
    nccl_check_point(m->nccl);  // -ic 1: no file is written from collectives that fail their checks
    float partial[NORM_BLOCKS];
    CUDA_CHECK(cudaMemsetAsync(m->sc.norm_partial, 0, NORM_BLOCKS * sizeof(float), m->stream));
    for_each_run(m, add_param_sumsq, NULL, 0);
    CUDA_CHECK(cudaMemcpyAsync(partial, m->sc.norm_partial, sizeof(partial), cudaMemcpyDeviceToHost, m->stream));
    gpu_sync(m, "the parameters' check");
    double sum = 0.0;
    for (int i = 0; i < NORM_BLOCKS; i++) sum += partial[i];
    float *slot = m->sc.losses + (size_t)m->B * m->T, *h = m->pinned + (size_t)m->B * m->T + 2;
    *h = isfinite(sum) ? 0.0f : 1.0f;
    CUDA_CHECK(cudaMemcpyAsync(slot, h, sizeof(float), cudaMemcpyHostToDevice, m->stream));
    if (m->grid.world > 1) nccl_allreduce(m->nccl, &m->nccl->world, slot, 1, ncclFloat32, OP_SUM);
    CUDA_CHECK(cudaMemcpyAsync(h, slot, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    gpu_sync(m, "the ranks' parameter checks");
    return *h == 0.0f;
}

// the step of the messages that follow (host mode's frames carry it)
static void set_step(Parallel *par, int step) { nccl_set_step(par->nccl, step); }

// the watch report's clocks around a step: NCCL's wait clock counts the
// watched steps' waits, read at the report once the GPU has done them
static void watch_begin(Parallel *par, Watch *w) {
    if (w->every > 0) nccl_watch(par->nccl, 1);
}
static void watch_end(Parallel *par, Watch *w, double ms) {
    if (w->every > 0) nccl_watch(par->nccl, 0);
    watch_step_end(w, ms, 0.0);
}

// the pipeline's bubble after this step (pp > 1): this rank's ops and
// messages timed on the GPU (pipe_clock_read; the step's last sync has let
// the stream pass them), every rank's figures all-gathered over the world,
// and rank 0 judges them (watch.h), as train_gpt2.c's
static void bubble_report(GPT2 *m, const Parallel *par, PipeMeter *pm, int step, LogLine *l) {
    if (!pm->on) return;
    pipe_clock_read(m, &pm->step);
    pipe_meter_pack(pm, pm->all + (size_t)par->grid.rank * PIPE_METER_FLOATS);  // in place
    world_allgather_floats(m, par, pm->all, m->clock.floats, PIPE_METER_FLOATS, "the pipeline meter");
    if (par->grid.rank == 0) pipe_meter_judge(pm, step, pm->all, l);
}

// every rank here, so that a line printed before an exit is out
static void world_barrier(GPT2 *m, Parallel *par) { world_sum(m, par, 0.0f); }

// the step's update after gpt2_step_loss, unless it is not finite or -sl or
// -sg skip it, and its norm and skip into l. The norm is read first, to
// decide (a NaN must never reach the weights): the GPU waits for the host to
// queue AdamW, tens of microseconds a step.
static void update_unless_skipped(GPT2 *m, Job *job, OutlierGuard *g, const AdamHyper *h, LogLine *l, int rank0,
                                  int outliers) {
    l->norm = gpt2_last_norm(m);
    // -gp skip, stop: a step with outlying gradients (grads_judge) is not applied, nor counted in -sl -sg's windows
    if (outliers > 0 && job->opt.grad_policy != GP_WARN) l->skipped = "outlying gradients";
    else l->skipped = outlier_skip(job, g, l->loss, l->norm, rank0);
    if (l->skipped == NULL) gpt2_apply_update(m, h);
}

typedef struct { GPT2 *m; Parallel *par; } CkptCtx;

static float ckpt_sum(void *ctx, float x) {
    CkptCtx *k = (CkptCtx *)ctx;
    return world_sum(k->m, k->par, x);
}

static int ckpt_part(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                     CkptShare *shares) {
    CkptCtx *k = (CkptCtx *)ctx;
    return write_part(k->m, dfd, model_name, optim_name, cipher, shares);
}

// every rank's bytes to rank 0, in rank order (a checkpoint's masked GHASH
// shares), through a device buffer: NCCL's (or host mode's) send and
// receive, each wait bounded by -to
static void ckpt_gather(void *ctx, const void *mine, void *all, size_t bytes) {
    CkptCtx *k = (CkptCtx *)ctx;
    int world = k->par->grid.world, rank = k->par->grid.rank;
    if (world == 1) return;
    uint8_t *dev = NULL;
    CUDA_CHECK(cudaMalloc((void **)&dev, rank == 0 ? (size_t)world * bytes : bytes));
    if (rank != 0) {
        CUDA_CHECK(cudaMemcpyAsync(dev, mine, bytes, cudaMemcpyHostToDevice, k->par->nccl->stream));
        nccl_sync(k->par->nccl, k->par->nccl->stream, "the checkpoint's GHASH shares");  // in place before a send
        nccl_send(k->par->nccl, 0, CH_CONTROL, 0, dev, bytes);
    } else {
        for (int r = 1; r < world; r++) nccl_recv(k->par->nccl, r, CH_CONTROL, 0, dev + (size_t)r * bytes, bytes);
    }
    nccl_sync(k->par->nccl, k->par->nccl->stream, "the checkpoint's GHASH shares");
    if (rank == 0)
        CUDA_CHECK(cudaMemcpy((uint8_t *)all + bytes, dev + bytes, (size_t)(world - 1) * bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dev));
}

// how long this rank's collectives wait (a write lengthens it for its own waits)
static double ckpt_set_timeout(void *ctx, double seconds) {
    CkptCtx *k = (CkptCtx *)ctx;
    double old = k->par->nccl->timeout_s;
    k->par->nccl->timeout_s = seconds;
    return old;
}

// the checkpoint of step st->step: checkpoint.h's ckpt_write_job, as
// train_gpt2.c's (rank 0 makes the files, every rank writes its
// part, rank 0 seals; the same verdict on every rank, 0 = complete)
static int gpt2_checkpoint(GPT2 *m, Parallel *par, int out_fd, const char *out_dir, int keep, const CkptState *st,
                           const uint8_t key[32], int encrypt) {
    CkptCtx ctx = {m, par};
    CkptJob job = {ckpt_sum, ckpt_part, ckpt_gather, ckpt_set_timeout, &ctx, par->grid.rank, par->grid.world,
                   encrypt};
    return ckpt_write_job(&job, out_fd, out_dir, keep, st, key);
}

// the final model, DIR/model_SSSSSSSS.bin into path: checkpoint.h's
// ckpt_write_model, as train_gpt2.c's (every rank writes the fp32 master
// weights it owns, as for a checkpoint's model.bin; rank 0 renames the file
// into place); sealed under the checkpoint key with encrypt (-enc 2). On a
// failure err names the file and the reason on the rank that knows, and is
// empty on the others.
static int gpt2_write_model(GPT2 *m, Parallel *par, int out_fd, const char *out_dir, int steps, const uint8_t key[32],
                            int encrypt, char *path, size_t pathlen, char *err, size_t errlen) {
    CkptCtx ctx = {m, par};
    CkptJob job = {ckpt_sum, ckpt_part, ckpt_gather, ckpt_set_timeout, &ctx, par->grid.rank, par->grid.world,
                   encrypt};
    return ckpt_write_model(&job, out_fd, out_dir, steps, &m->config, key, path, pathlen, err, errlen);
}

// the checkpoint after `step`, written by every rank; 0, or -1 when it failed
// (gpt2_checkpoint has said why)
static int checkpoint_after(GPT2 *m, Parallel *par, Job *job, int step) {
    if (!gpt2_params_finite(m)) {
        char what[64];
        snprintf(what, sizeof(what), "the checkpoint after step %d", step);
        print_not_written(what, par->grid.rank == 0);
        world_barrier(m, par);
        return -1;
    }
    CkptState st = checkpoint_state(job, step + 1, m->adam_t, &par->grid, par->zero);
    double t0 = now_ms();
    if (gpt2_checkpoint(m, par, job->out_fd, job->opt.out_dir, job->opt.ckpt_keep, &st, job->ckpt_key,
                        job->opt.encrypt >= 1) != 0)
        return -1;
    if (par->grid.rank == 0) print_checkpoint_written(job, step + 1, now_ms() - t0);
    return 0;
}

// after the last step: the final model evaluated, sampled, and written to -o
// (sealed under -enc 2), then llm.c's DONE_<steps> beside it; 0, or -1 when
// a write failed or the parameters are not finite
static int final_model(GPT2 *m, Parallel *par, Job *job) {
    int rank0 = par->grid.rank == 0;
    char path[1024], err[1200];
    set_step(par, job->steps);
    LogLine last = final_line(job);
    run_evaluations(m, par, job, job->steps, &last);
    if (sample_due(job, job->steps)) sample(m, &job->tok, job->opt.gen_tokens, &job->sample_rng);
    if (rank0) report_final(job, &last);
    if (job->opt.out_dir == NULL || job->steps == 0) return 0;  // -x 0 evaluates only, and writes no model
    if (!gpt2_params_finite(m)) {
        print_not_written("the final model", rank0);
        world_barrier(m, par);
        return -1;
    }
    int sealed = job->opt.encrypt >= 2;
    if (gpt2_write_model(m, par, job->out_fd, job->opt.out_dir, job->steps, job->ckpt_key, sealed, path, sizeof(path), err,
                         sizeof(err)) != 0) {
        if (err[0] != '\0') fprintf(stderr, "%s: %s\n", trainer_name, err);
        return -1;
    }
    if (rank0) printf("wrote %s\n", path);
    if (rank0 && write_done(job, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", trainer_name, err);
        return -1;
    }
    return 0;
}

// what this build of the trainer does (parse_flags checks the flags against it)
static TrainerBuild gpu_build(void) {
    unsigned schedules = 1u << PS_GPIPE | 1u << PS_1F1B | 1u << PS_INTERLEAVED | 1u << PS_ZBH1 | 1u << PS_ZBV;
#ifdef ENABLE_FP32
    // exact fp32, GELU unfused; every pipeline schedule; sequence parallelism; checked collectives (-ic 1)
    TrainerBuild build = {"the fp32 build of train_gpt2cu", 0, 0, schedules, 1, 1, 1};
#else
    // bf16 GEMMs, GELU fused both ways; every pipeline schedule; sequence parallelism; checked collectives (-ic 1)
    TrainerBuild build = {"the bf16 build of train_gpt2cu", 1, 2, schedules, 1, 1, 1};
#endif
    return build;
}

// the flags only the GPU trainer checks, before a launcher counts the GPUs:
// checkpoints, NCCL_HOSTID against -hb, and the GPUs the launch needs
static void check_gpu_job(Job *job) {
    char err[2048];
    if (ckpt_check_flags(&job->opt, err, sizeof(err)) != 0) die_usage(err);
    if (gpu_hostid_check(job->opt.host_backend, getenv("NCCL_HOSTID"), err, sizeof(err)) != 0) die_usage(err);
    check_launch_gpus(&job->opt);
}

int main(int argc, char **argv) {
    Job job;
    GpuOptions gopt;
    char err[2048], path[1024];
    trainer_start("train_gpt2cu");
    // the launcher starts the ranks with the command line it was given, GPU flags included
    int launch_argc = argc;
    char **launch_argv = (char **)host_alloc((size_t)(argc + 1) * sizeof(char *), "argv");
    memcpy(launch_argv, argv, (size_t)(argc + 1) * sizeof(char *));
    if (gpu_options_take(&gopt, &argc, argv, err, sizeof(err)) != 0) die_usage(err);
    // the job, checked once, by the launcher, before any rank starts or a GPU is touched
    TrainerBuild build = gpu_build();
    parse_flags(&job, argc, argv, gpu_usage_lines, &build);
    check_gpu_job(&job);
    parse_fault(&job);
    check_model(&job);
    if (gpu_check_shapes(&job.config, job.opt.B, job.opt.T, job.opt.tp, job.opt.init, err, sizeof(err)) != 0)
        die_usage(err);
    check_batch_and_data(&job);
    checkpoint_setup(&job);

    // this rank: its place in the job and its GPU, its data and log, its part of the model
    Parallel par;
    parallel_setup(&par, &job.opt, &job.fault, launch_argc, launch_argv);
    start_rank(&job, &par.grid);
    agree_on_start(&job, &par);
    int rank0 = par.grid.rank == 0, dp = par.grid.dp, pp = par.grid.pp, B = job.opt.B, T = job.opt.T, accum = job.accum;
    float *params = load_params(&job, &par.grid);
    open_data(&job, &par.grid);
    open_tokenizer_and_log(&job, &par.grid);
    note_idle_checks(&job, &par.grid);
    int device;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    double gpu_peak = gpu_peak_flops(prop.name), peak = gpu_peak * par.grid.world;  // the job's: all its GPUs'
    int nops;
    PipeStep *plan = step_plan(&job, &par.grid, &nops);
    PipeLayout layout = job_pipeline(&job.opt, par.grid.pp, accum);
    GPT2 model;
    gpt2_init_rank(&model, &job.config, params, (uint64_t)job.opt.seed, B, T, gopt.recompute, gopt.attention_tc,
                   &par.grid, &layout, par.zero, activation_sets(&job, &par.grid), par.nccl, job.opt.sp);
    gpt2_pipeline(&model, accum);
    if (pipeline_splits_backward(&layout)) gpt2_split_backward(&model);
    free(params);
    model.fuse_gelu = job.opt.gelu_fusion;  // -ge, checked against this build by parse_flags
    snprintf(path, sizeof(path), "%s/optim.bin", job.ck_dir);
    if (job.resuming && gpt2_load_optimizer(&model, path, job.ckpt_key, job.ck.adam_t, err, sizeof(err)) != 0)
        die_usage(err);
    double load_ms = now_ms() - job.load_t0 - job.verify_ms;
    par.nccl->stream = model.stream;  // the collectives queue behind the model's kernels
    if (pp > 1) reserve_pipeline_macs(&model, &par, accum);
    AdamHyper hyper = {job.opt.lr, job.opt.beta1, job.opt.beta2, job.opt.eps, job.opt.weight_decay, job.opt.grad_clip};
    if (rank0) {
        print_device(&prop, gpu_peak, &gopt, &model);
        print_model_and_batch(&job, dp);
    }
    print_layout(&model, &par, &job.opt, accum, device);
    if (rank0) announce_resume(&job, load_ms);
    GpuStats gpu_stats;  // -lg N: llm.c's GPU stats, rank 0's GPU, through NVML where it is found
    gpu_stats_open(&gpu_stats, rank0 ? job.opt.gpu_stats_every : 0, device, NULL, stdout);

    // the training loop: one optimizer step per iteration
    int stopped = 0;
    OutlierGuard guard;
    memset(&guard, 0, sizeof(guard));
    Watch watch;
    watch_init(&watch, &job, &par.grid);
    PipeMeter meter;
    pipe_meter_init(&meter, &job, &par.grid);
    GradWatch grads;
    grads_init(&grads, &par.grid);
    checks_alloc(&model, &job, &watch);
    for (int step = job.start; step < job.steps && !stopped; step++) {
        set_step(&par, step);
        LogLine line = {step, 1, 0.0f, 0.0f, 0.0f, -1.0f, -1.0f, 0.0, 0, NULL, NULL, NULL, NULL};
        run_evaluations(&model, &par, &job, step, &line);
        if (sample_due(&job, step)) sample(&model, &job.tok, job.opt.gen_tokens, &job.sample_rng);
        if (fault_drift_due(&job, par.grid.rank, step)) drift_parameter(&model);
        if (check_due(&job, step)) consistency_check(&model, &par, step);

        gpu_sync(&model, "the step before");
        double t0 = now_ms();
        watch_begin(&par, &watch);
        fault_slow_step(&job, par.grid.rank, step);
        gpt2_zero_grad(&model);
        gpt2_zero_losses(&model);
        float dloss = 1.0f / (float)((double)B * T * accum * dp);
        pipeline_run(&model, &job.train, plan, nops, dloss, &meter.step);  // one stage: F0 B0 F1 B1 ...
        line.lr = lr_at_step(&job.opt, step, job.steps);
        hyper.lr = line.lr;
        stopped = ckpt_stop_signal != 0;
        line.loss = gpt2_step_loss(&model, &par, accum, &stopped);
        int outliers = grads_judge(&grads, gpt2_rank_norms(&model), step, job.opt.grad_policy, &line);
        update_unless_skipped(&model, &job, &guard, &hyper, &line, rank0, outliers);
        gpu_sync(&model, "the step's update");  // so that ms covers AdamW's GPU time too
        line.ms = now_ms() - t0;
        watch_end(&par, &watch, line.ms);
        if (watch_due(&watch, step)) watch_report(&model, &par, &watch, step, &line);
        bubble_report(&model, &par, &meter, step, &line);
        if (rank0) {
            print_mfu(&job, report_step(&job, &line, &guard), peak);
            if (gpu_stats_due(&job, step)) gpu_stats_print(&gpu_stats);
            watch_print(&watch);
            grads_print(&grads);
        }
        if (nonfinite_stop(&job, &line, rank0) || grads_stop(&job, outliers)) {
            world_barrier(&model, &par);
            exit(1);
        }

        if (checkpoint_due(&job, step, stopped) && checkpoint_after(&model, &par, &job, step) != 0) return 1;
        if (stopped && rank0) printf("stopped by a signal after step %d; resume with -y 1\n", step);
    }

    if (!stopped && final_model(&model, &par, &job) != 0) return 1;
    pipe_meter_print(&meter);
    print_checked_collectives(&par, job.steps - job.start);
    print_gpu_memory(&par, device);
    checks_free(&model);
    pipe_meter_free(&meter);
    watch_free(&watch);
    grads_free(&grads);
    free_job(&job);
    nccl_free(par.nccl);
    gpt2_free(&model);
    free(plan);
    launch_free(&par.launch);
    free(launch_argv);
    return 0;
}
#endif
