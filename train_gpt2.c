/*
 * train_gpt2.c: GPT-2 training on the CPU, fp32, OpenMP.
 *
 * The reference trainer: readable first, fast second. Here the model (GPT2)
 * holds its parameters, gradients, AdamW state and activations as a few flat
 * arrays, and main() at the bottom is the whole training loop; train_gpt2.cu
 * has the same functions under the same names. The rest, by path:
 *   llm3d/cpu/       the layers, each forward beside its backward
 *                    (cpu_layers.h, cpu_attention.h), the matmul
 *                    (cpu_matmul.h), vector math (cpu_math.h), AdamW's
 *                    passes (cpu_optimizer.h), the FMA peak (cpu_peak.h)
 *   llm3d/gpt2.h     the model's shape, slicing and files; llm3d/flags.h the
 *                    flags; llm3d/trainer.h what both trainers' main() do
 *                    around the loop; llm3d/watch.h the -wr and -ck checks;
 *                    llm3d/checkpoint.h the checkpoints
 *   dataloader.h     the token shards; llm3d/tokenizer.h (samples)
 *   parallel.h       the ranks and their messages (llm3d/parallel/)
 *   secure.h         keys, MACs and frames (llm3d/secure/)
 *
 * Shapes: B batch, T time, C channels, NH heads, hs = C/NH head size,
 * L layers, V vocab, Vp padded vocab (the rows of wte), OC output channels.
 */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>  // getrusage: the peak resident memory
#ifdef __GLIBC__
#include <malloc.h>  // mallopt
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "llm3d/gpt2.h"
#include "llm3d/flags.h"
#include "secure.h"
#include "parallel.h"
#include "llm3d/checkpoint.h"
#include "llm3d/cpu/cpu_matmul.h"
#include "llm3d/cpu/cpu_peak.h"
#include "llm3d/cpu/cpu_math.h"
#include "llm3d/cpu/cpu_layers.h"
#include "llm3d/cpu/cpu_attention.h"
#include "llm3d/cpu/cpu_optimizer.h"
#ifndef TESTING
#include "dataloader.h"
#include "llm3d/tokenizer.h"
#endif

// ----------------------------------------------------------------------------
// this rank's place in the job (parallel.h): one rank is the case where every
// group has size 1 and comm is NULL

typedef struct {
    Grid grid;
    Comm *comm;
    Group world, dp, tp, pp;
    Group tied;      // the first and the last pipeline stage of my (dp, tp): they share wte
    int zero;        // ZeRO stage 0-3
    int sp;          // sequence parallelism (-sp 1, with tp > 1): see "sequence parallel" below
    PipeLayout pipe; // the schedule's placement of the model's parts on the stages (its M is not used)
    Launch launch;   // how this process was started (its key, its rendezvous)
    Fault fault;     // -fault: poison acts here (poison_grads), the others in the communicator and the loop
    int step;        // the step in progress (set_step)
} Parallel;

static void par_single(Parallel *par) {
    memset(par, 0, sizeof(*par));
    char err[256];
    grid_init(&par->grid, 1, 1, 1, 0, err, sizeof(err));
    grid_groups(&par->grid, &par->world, &par->dp, &par->tp, &par->pp);
    par->tied = par->pp;
    par->pipe = pipe_layout(PIPE_GPIPE, 1, 1, 1);
}

// what: the data, named by the line of a failed check (-ic 1)
static void group_allreduce(const Parallel *par, const Group *g, float *buf, size_t n, const char *what) {
    if (g->size == 1) return;
    comm_set_label(par->comm, what);
    comm_allreduce(par->comm, g, buf, n, OP_SUM);
}

// ----------------------------------------------------------------------------
// the model on this rank: gpt2.h's Shard and units (its parameters), the
// activations of the micro-batches in flight, and where ZeRO keeps what

typedef struct { float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb; } LayerParams;

static LayerParams layer_params_at(const GPT2Config *c, const Shard *s, float *base) {
    float *v[12];
    for (int k = 0; k < 12; k++) {
        v[k] = base;
        base += local_tensor_size(c, s, layer_tensors[k]);
    }
    LayerParams p = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
    return p;
}

// activations of one micro-batch in flight; the backward's gradients use the
// same layout (one set, as a stage runs one backward at a time)
enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_ATT, A_ATTPROJ, A_RESIDUAL2,
    A_LN2, A_LN2_MEAN, A_LN2_RSTD, A_FCH, A_FCH_GELU, A_FCPROJ, A_RESIDUAL3,
    A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_ROWMAX, A_ROWSUM, NUM_ACT_TENSORS
};

typedef struct {
    float *memory;             // the tensors, one after another, each starting on a cache line
    void *block;               // what to free: memory itself, or for the gradients calloc's block that holds it
    float *t[NUM_ACT_TENSORS];
    int *inputs, *targets;     // B*T each
    float mean_loss;           // of this micro-batch (on the last part)
    float *grad_in;            // rows*C: the gradient of the chunk's output, from the part after (NULL on a
                               // stage that holds only the last part); per set, as it may come before its B
} Acts;

typedef struct { float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2,
                 *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3; } LayerActs;

typedef struct {
    GPT2Config config;
    Shard shard;
    const Parallel *par;
    UnitTable ut;              // the units of this rank's parameters (gpt2.h)
    // ZeRO 0: params, grads, m, v all num_local. 1: m, v num_shard.
    // 2: grads become grad_shard plus a bucket per unit in use. 3: params become
    // param_shard plus a gathered copy per unit in use.
    float *params, *grads;     // num_local (NULL when sharded away)
    float *param_shard, *grad_shard, *m, *v;
    float **unit_params, **unit_grads;  // per unit: where its full values / gradients are now (NULL when not held)
    size_t bytes_params, bytes_grads, bytes_optimizer, bytes_transient_peak, bytes_transient;
    int B, T, nacts;
    // the positions of a micro-batch that the sequence-parallel region holds
    // here (the LayerNorms, the residual stream, the row-parallel outputs, the
    // embeddings' output): rows [row0, row0 + rows) of its B*T, all of them
    // (row0 0, rows B*T) without -sp
    int sp, rows, row0;
    float *sp_whole, *sp_partial;  // -sp 1: B*T*C each, an op's gathered input and its sums before the scatter
    Acts *acts;                // nacts sets, each sized for the stage's largest chunk; in a step, a micro-batch
                               // on a chunk takes one from sets (pipeline_run), outside the steps set i % nacts
    Acts dacts;
    Acts *dsets;               // with the backward split (gpt2_split_backward): nacts sets of activation gradients, kept from a micro-batch's B to its W; else NULL
    int steps_M;               // the step's micro-batches (gpt2_pipeline)
    PipeSets sets;             // the set each (micro-batch, chunk) holds in a step; its peak: print_peak_memory
    long rss_before_acts;      // resident bytes when the activations were about to be allocated, -1 unknown
    // a stage that holds the last part in one of several chunks: the
    // logits (B*T*Vl floats each, the largest tensor of a set at GPT-2's
    // vocabulary) in nheads blocks of their own, lent to the sets of that
    // chunk from its F to its last op (head_take); nheads 0: each set has its own
    float *heads;
    int nheads, *head_busy, *head_of;  // head_of[set]: its block, -1 when none
    size_t act_sizes[NUM_ACT_TENSORS];  // in floats, each rounded up to a cache line's 16
    int adam_t;
    int grads_fresh;           // bit k: chunk k's gradients hold nothing of this step yet, so its backward
                               // writes them (gpt2_zero_grad sets all; 0: every backward adds)
    float loss_sum;            // this step's micro-batch mean losses, summed (last stage; gpt2_zero_losses)
    float norm;                // this step's grad norm, before clipping (gpt2_step_loss)
    float *digests;            // dp > 1: -ck's SHA-256 of every tensor of every replica, each 32 bytes as 8 floats (small: made whether or not -ck is on)
    float *rank_norms;         // dp > 1: every rank's own gradient norm this step, before the dp reduction (world floats)
    char label[80];            // what the collective in progress carries (unit_label)
} GPT2;

static void *xcalloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "out of memory allocating %s (%zu x %zu bytes)\n", what, n, size);
        exit(1);
    }
    return p;
}

// asks the kernel to back the 2 MiB-aligned part of [p, p + bytes) with 2 MiB
// pages (transparent huge pages, granted on request where the system's
// setting is "madvise", as on Debian and Ubuntu). The matmuls read 8 rows of
// the logits' gradient 201 KB apart at once and the weights 3 KB a row: with
// 4 KiB pages each of those rows is on a page of its own, a TLB entry each.
// Measured 1 to 3% a step (d12 and the small model). The peak memory stays
// about the same (2.33 GB at d12): the activation gradients' 2 MiB pages
// that the backward never writes stay unmapped, and only those it writes in
// part are mapped whole. Where the setting is "always" the kernel does this
// unasked.
static void advise_huge_pages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    uintptr_t huge = (uintptr_t)2 << 20, start = ((uintptr_t)p + huge - 1) / huge * huge;
    uintptr_t end = ((uintptr_t)p + bytes) / huge * huge;
    if (end > start) madvise((void *)start, end - start, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

// the large arrays every step uses whole (parameters, gradients, AdamW's
// moments, activations), zeroed and aligned.
// Zeroed here, by all the threads at once, so that their pages are mapped
// before the first step. calloc's pages are mapped at first use instead,
// one fault at a time, and AdamW reads m and v before it writes them: each
// of their pages was mapped twice, the second time with a TLB flush sent to
// the other cores. A d12 run's first step took 4.8 s; now 0.6 to 1.0 s.
// Aligned to a cache line, and those of 1 MiB or more to 2 MiB, so that
// huge pages back the whole array. malloc's large blocks start 16 bytes
// into a page: every vector of 16 floats then spans two cache lines, and
// on Zen 4, which loads it as two halves, one half spans two lines as well.
// There AdamW over 124M parameters took 103.5 ms misaligned and 62.0 ms
// aligned (doc/cpu.md has the step's figures).
static void *xcalloc_mapped(size_t n, size_t size, const char *what) {
    size_t huge = (size_t)2 << 20, large = (size_t)1 << 20, chunk = (size_t)1 << 20;
    size_t bytes = n * size, align = bytes < large ? 64 : huge, rounded = 0;
    char *p = NULL;
    // else n * size, or that rounded up, is more than a size_t holds
    if ((size == 0 || n <= SIZE_MAX / size) && bytes <= SIZE_MAX - align) {
        rounded = bytes ? (bytes + align - 1) / align * align : align;
        p = (char *)aligned_alloc(align, rounded);
    }
    if (p == NULL) {
        fprintf(stderr, "out of memory allocating %s (%zu x %zu bytes)\n", what, n, size);
        exit(1);
    }
    advise_huge_pages(p, rounded);
    size_t chunks = (bytes + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < chunks; i++) memset(p + i * chunk, 0, i + 1 < chunks ? chunk : bytes - i * chunk);
    return p;
}

// the process's resident memory now, in bytes (Linux's /proc/self/statm:
// its second field, in pages); -1 where that cannot be read. The
// activations' share of the peak (print_peak_memory) is measured from it.
static long resident_bytes(void) {
    long pages = -1, size = 0, page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size, &pages) != 2) pages = -1;
    fclose(f);
    return pages < 0 || page <= 0 ? -1 : pages * page;
}

static void transient_add(GPT2 *m, long bytes) {
    m->bytes_transient += bytes;
    if (m->bytes_transient > m->bytes_transient_peak) m->bytes_transient_peak = m->bytes_transient;
}

// builds this rank's part of the model from the full model (file layout) or,
// when full is NULL, from the seeded init; full is not kept
static void gpt2_build(GPT2 *m, const GPT2Config *c, const Parallel *par, const float *full, uint64_t seed) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->par = par;
    const Grid *g = &par->grid;
    m->shard = shard_for(c, g->tp, g->tp_rank, g->pp, g->pp_rank, g->dp, g->dp_rank);
    if (par->pipe.V > 1) {  // the stage's chunks where the schedule places them
        int parts[SHARD_MAXV];
        for (int k = 0; k < par->pipe.V; k++) parts[k] = pipeline_part(&par->pipe, g->pp_rank, k);
        shard_set_chunks(&m->shard, c, par->pipe.V, parts);
    }
    if (unit_table(&m->ut, c, &m->shard, 1) != 0) {
        fprintf(stderr, "out of memory allocating the unit table\n");
        exit(1);
    }
    int zero = par->zero;
    m->unit_params = (float **)xcalloc(m->ut.n, sizeof(float *), "unit views");
    m->unit_grads = (float **)xcalloc(m->ut.n, sizeof(float *), "unit views");
    // ZeRO's memory per rank, N = this rank's (padded) parameter count:
    //   stage   params   grads    AdamW m, v
    //   0       4N       4N       8N
    //   1       4N       4N       8N/dp
    //   2       4N       4N/dp    8N/dp   (+ one unit's gradient bucket at a time)
    //   3       4N/dp    4N/dp    8N/dp   (+ the units gathered for the layer at work)
    size_t nopt = zero >= 1 ? m->ut.num_shard : m->ut.num_local;
    m->m = (float *)xcalloc_mapped(nopt, sizeof(float), "AdamW m");
    m->v = (float *)xcalloc_mapped(nopt, sizeof(float), "AdamW v");
    m->bytes_optimizer = 2 * nopt * sizeof(float);
    if (zero <= 1) {
        m->grads = (float *)xcalloc_mapped(m->ut.num_local, sizeof(float), "gradients");
        m->bytes_grads = m->ut.num_local * sizeof(float);
    } else {
        m->grad_shard = (float *)xcalloc_mapped(m->ut.num_shard, sizeof(float), "gradient shard");
        m->bytes_grads = m->ut.num_shard * sizeof(float);
    }
    float *unit_buf = NULL;
    if (zero <= 2) {
        m->params = (float *)xcalloc_mapped(m->ut.num_local, sizeof(float), "parameters");
        m->bytes_params = m->ut.num_local * sizeof(float);
    } else {
        m->param_shard = (float *)xcalloc_mapped(m->ut.num_shard, sizeof(float), "parameter shard");
        m->bytes_params = m->ut.num_shard * sizeof(float);
        unit_buf = (float *)xcalloc(unit_table_largest(&m->ut), sizeof(float), "unit");
    }
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        if (zero <= 2) {
            unit_fill(c, &m->shard, un, m->params + un->offset, full, seed);
            m->unit_params[u] = m->params + un->offset;
        } else {  // keep only my 1/dp of the unit
            memset(unit_buf, 0, un->padded * sizeof(float));
            unit_fill(c, &m->shard, un, unit_buf, full, seed);
            size_t chunk = un->padded / m->shard.dp;
            memcpy(m->param_shard + un->shard_offset, unit_buf + m->shard.dp_rank * chunk, chunk * sizeof(float));
        }
        if (zero <= 1) m->unit_grads[u] = m->grads + un->offset;
    }
    free(unit_buf);
    if (m->shard.dp > 1) {  // each 32-byte digest travels as 8 floats, its bytes as they are
        m->digests = (float *)xcalloc((size_t)unit_table_tensors(&m->ut) * 8 * m->shard.dp, sizeof(float), "digests");
        m->rank_norms = (float *)xcalloc((size_t)par->world.size, sizeof(float), "the ranks' gradient norms");
    }
}

// one set of activations (grad 0) or of their gradients (grad 1) of
// `total` floats, laid out as m->act_sizes says
static void acts_alloc(GPT2 *m, Acts *a, int grad, size_t total) {
    size_t BT = (size_t)m->B * m->T;
    // the activation gradients are mapped as they are first written: the
    // backward never writes some of them (the logits', 51 MB at d12, made
    // in place of the probabilities), and mapping those would add to d12's
    // peak. calloc's block is aligned by hand: it is 16 floats longer, and
    // the tensors start at its first cache line.
    if (!grad) {
        a->memory = (float *)xcalloc_mapped(total, sizeof(float), "activations");
        a->block = a->memory;
    } else {
        a->block = xcalloc(total + 16, sizeof(float), "activation gradients");
        a->memory = (float *)(((uintptr_t)a->block + 63) / 64 * 64);
        advise_huge_pages(a->memory, total * sizeof(float));
    }
    float *p = a->memory;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) { a->t[i] = p; p += m->act_sizes[i]; }
    a->inputs = (int *)xcalloc(BT, sizeof(int), "inputs");
    a->targets = (int *)xcalloc(BT, sizeof(int), "targets");
}

static size_t acts_total(const GPT2 *m) {
    size_t total = 0;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) total += m->act_sizes[i];
    return total;
}

// the activation gradients' tensors that the backward writes (chunk_backward,
// block_backward). It never writes the attention weights' (attention_backward
// goes from dout to dqkv), attproj's and fcproj's (their residual's serve),
// the LayerNorms' mean and 1/std, the logits' (made in place of the
// probabilities) or the loss's: calloc's pages under those stay unmapped.
static int act_grad_written(int i) {
    return i == A_ENCODED || i == A_LN1 || i == A_QKV || i == A_ATTY || i == A_RESIDUAL2 || i == A_LN2 || i == A_FCH ||
           i == A_FCH_GELU || i == A_RESIDUAL3 || i == A_LNF;
}

// the activation memory of this rank, in bytes: the forward's tensors in
// its nacts sets (with the incoming gradients they hold), the activation
// gradients (one set, or one per set where the backward is split), and
// under -sp the two (B*T, C) buffers of the gathers and scatters. Under -sp
// the sequence-parallel region's tensors hold rows/(B*T) = 1/tp of theirs.
// resident: what of that a training step maps, the prediction that
// print_peak_memory measures: the forward's sets and the sp buffers whole
// (xcalloc_mapped maps them at once), and of the gradient sets the backward
// uses (the one shared set, or where the backward is split each forward
// set's own, not the shared one) the tensors it writes
typedef struct { size_t acts, grads, sp_buffers, resident; } ActBytes;

static ActBytes gpt2_activation_bytes(const GPT2 *m) {
    size_t set = acts_total(m) * sizeof(float), rc = (size_t)m->rows * m->config.C, written = 0;
    size_t grad_in = m->nacts > 0 && m->acts[0].grad_in != NULL ? rc * sizeof(float) : 0;
    size_t heads = (size_t)m->nheads * (((size_t)m->B * m->T * m->shard.Vl + 15) / 16 * 16) * sizeof(float);  // lent logits
    for (int i = 0; i < NUM_ACT_TENSORS; i++) written += act_grad_written(i) ? m->act_sizes[i] * sizeof(float) : 0;
    ActBytes b = {m->nacts * (set + grad_in) + heads, (m->dsets != NULL ? m->nacts + 1 : 1) * set,
                  m->sp ? 2 * (size_t)m->B * m->T * m->config.C * sizeof(float) : 0, 0};
    b.resident = b.acts + b.sp_buffers + (m->dsets != NULL ? (size_t)m->nacts : 1) * written;
    return b;
}

static void acts_free(Acts *a) { free(a->block); free(a->inputs); free(a->targets); free(a->grad_in); }

// a backward split in B and W (pipeline schedules zbh1, zbv): each activation
// set gets its own set of activation gradients, which a micro-batch's B
// writes and its W reads
static void gpt2_split_backward(GPT2 *m) {
    m->dsets = (Acts *)xcalloc(m->nacts, sizeof(Acts), "activation gradient sets");
    for (int k = 0; k < m->nacts; k++) acts_alloc(m, &m->dsets[k], 1, acts_total(m));
}

// n blocks of logits for the sets of the last part's chunk (nheads)
static void gpt2_heads(GPT2 *m, int n) {
    size_t floats = ((size_t)m->B * m->T * m->shard.Vl + 15) / 16 * 16;
    free(m->heads);
    free(m->head_busy);
    m->heads = (float *)xcalloc_mapped((size_t)n * floats, sizeof(float), "logits");
    m->head_busy = (int *)xcalloc(n, sizeof(int), "logits block marks");
    m->nheads = n;
}

// set i's logits from a free block, if it has none (with nheads 0 it has its own)
static void head_take(GPT2 *m, int i) {
    if (m->nheads == 0 || m->head_of[i] >= 0) return;
    int h = 0;
    while (h < m->nheads && m->head_busy[h]) h++;
    if (h == m->nheads) {  // gpt2_pipeline counted them from the schedule: a schedule the count does not know
        fprintf(stderr, "rank %d: activation set %d finds none of the %d logits blocks free\n", m->par->grid.rank, i,
                m->nheads);
        exit(1);
    }
    size_t floats = ((size_t)m->B * m->T * m->shard.Vl + 15) / 16 * 16;
    m->head_busy[h] = 1;
    m->head_of[i] = h;
    m->acts[i].t[A_LOGITS] = m->heads + (size_t)h * floats;
}

static void head_give_back(GPT2 *m, int i) {
    if (m->nheads == 0 || m->head_of[i] < 0) return;
    m->head_busy[m->head_of[i]] = 0;
    m->head_of[i] = -1;
    m->acts[i].t[A_LOGITS] = NULL;
}

static void gpt2_alloc_activations(GPT2 *m, int B, int T, int nacts) {
    const GPT2Config *c = &m->config;
    const Shard *s = &m->shard;
    const Parallel *par = m->par;
    m->rss_before_acts = resident_bytes();  // what the activations add to it: print_peak_memory
    m->sp = par->sp && par->tp.size > 1;
    m->rows = m->sp ? B * T / par->tp.size : B * T;  // trainer.h's check_model: B*T splits by tp
    m->row0 = m->sp ? par->tp.me * m->rows : 0;
    // the sequence-parallel region's tensors hold R positions (all B*T without -sp);
    // the tensor-parallel ones (qkv, attention, fc) and the head's all B*T
    size_t BT = (size_t)B * T, R = m->rows, C = c->C, nl = (size_t)shard_max_chunk(s), Cl = s->Cl;
    size_t *z = m->act_sizes;
    memset(z, 0, sizeof(m->act_sizes));
    z[A_ENCODED] = R * C;  // the stage's input: the embeddings, or what the previous stage sent
    z[A_LN1] = nl * R * C; z[A_LN1_MEAN] = nl * R; z[A_LN1_RSTD] = nl * R;
    z[A_QKV] = nl * BT * 3 * Cl; z[A_ATTY] = nl * BT * Cl; z[A_ATT] = nl * B * s->NHl * T * T;
    z[A_ATTPROJ] = nl * R * C; z[A_RESIDUAL2] = nl * R * C;
    z[A_LN2] = nl * R * C; z[A_LN2_MEAN] = nl * R; z[A_LN2_RSTD] = nl * R;
    z[A_FCH] = nl * BT * 4 * Cl; z[A_FCH_GELU] = nl * BT * 4 * Cl;
    z[A_FCPROJ] = nl * R * C; z[A_RESIDUAL3] = nl * R * C;
    if (s->last) {  // the final LayerNorm's output whole: the head takes the gathered layout (sp_head_input)
        z[A_LNF] = BT * C; z[A_LNF_MEAN] = R; z[A_LNF_RSTD] = R;
        z[A_LOGITS] = BT * s->Vl; z[A_LOSSES] = BT; z[A_ROWMAX] = BT; z[A_ROWSUM] = BT;
    }
    int lent = s->last && s->nchunks > 1;  // the logits in blocks of their own (gpt2_heads), not in every set
    if (lent) z[A_LOGITS] = 0;
    size_t total = 0;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) {
        z[i] = (z[i] + 15) / 16 * 16;
        total += z[i];
    }
    m->B = B;
    m->T = T;
    m->nacts = nacts;
    m->acts = (Acts *)xcalloc(nacts + 1, sizeof(Acts), "activation sets");
    for (int k = 0; k <= nacts; k++) acts_alloc(m, k < nacts ? &m->acts[k] : &m->dacts, k == nacts, total);
    for (int k = 0; k < nacts && (!s->last || s->nchunks > 1); k++)
        m->acts[k].grad_in = (float *)xcalloc(R * C, sizeof(float), "incoming gradient");
    if (m->sp) {
        m->sp_whole = (float *)xcalloc_mapped(BT * C, sizeof(float), "gathered positions");
        m->sp_partial = (float *)xcalloc_mapped(BT * C, sizeof(float), "partial sums");
    }
    m->head_of = (int *)xcalloc(nacts, sizeof(int), "logits block marks");
    for (int k = 0; k < nacts; k++) m->head_of[k] = -1;
    for (int k = 0; k < nacts && lent; k++) m->acts[k].t[A_LOGITS] = NULL;  // none until head_take
    if (lent) gpt2_heads(m, 1);  // for the evaluations; a step's schedule may want more (gpt2_pipeline)
}

// the step's shape: M micro-batches on the stage's chunks, each taking an
// activation set of its own from its first message or op to its last op;
// and on a stage whose chunk k holds the last part among others, as many
// logits blocks as the schedule holds micro-batches on k at once, each
// from its F there to its last op there (its B, or its W where the
// backward is split)
static void gpt2_pipeline(GPT2 *m, int M) {
    const Shard *s = &m->shard;
    m->steps_M = M;
    if (pipe_sets_init(&m->sets, m->nacts, s->nchunks, M) != 0) {
        fprintf(stderr, "out of memory for the activation set map\n");
        exit(1);
    }
    if (m->nheads == 0) return;
    PipeLayout pl = m->par->pipe;
    pl.M = M;
    PipeOp *ops = (PipeOp *)xcalloc((size_t)pipeline_ops(&pl), sizeof(PipeOp), "the schedule");
    int n = pipeline_schedule(&pl, s->pp_rank, ops), held = 0, most = 1, split = pipeline_splits_backward(&pl);
    for (int i = 0; i < n; i++) {
        if (s->chunk[ops[i].chunk].part != s->pp * s->nchunks - 1) continue;
        if (ops[i].kind == PIPE_F) most = ++held > most ? held : most;
        if (ops[i].kind == PIPE_W || (ops[i].kind == PIPE_B && !split)) held--;
    }
    free(ops);
    gpt2_heads(m, most);
}

// this rank's part of the model (gpt2_build) and nacts sets of
// activations for micro-batches of B x T
static void gpt2_init_rank(GPT2 *m, const GPT2Config *c, const float *full, uint64_t seed, int B, int T,
                           const Parallel *par, int nacts) {
    gpt2_build(m, c, par, full, seed);
    gpt2_alloc_activations(m, B, T, nacts);
}

static void gpt2_free(GPT2 *m) {
    free(m->params); free(m->grads); free(m->param_shard); free(m->grad_shard); free(m->m); free(m->v);
    for (int k = 0; k <= m->nacts; k++) acts_free(k < m->nacts ? &m->acts[k] : &m->dacts);
    for (int k = 0; m->dsets != NULL && k < m->nacts; k++) acts_free(&m->dsets[k]);
    free(m->dsets);
    if (m->par->zero == 3)
        for (int u = 0; u < m->ut.n; u++) free(m->unit_params[u]);
    pipe_sets_free(&m->sets);
    free(m->heads); free(m->head_busy); free(m->head_of);
    free(m->sp_whole); free(m->sp_partial);
    free(m->digests);
    free(m->rank_norms);
    free(m->acts); free(m->ut.units); free(m->unit_params); free(m->unit_grads);
}

static LayerActs layer_acts(const GPT2 *m, const Acts *a, int ll) {
    size_t BT = (size_t)m->B * m->T, C = m->config.C, Cl = m->shard.Cl, R = m->rows, rc = R * C;
    size_t att = (size_t)m->B * m->shard.NHl * m->T * m->T;
    float *const *t = a->t;
    LayerActs v = {
        t[A_LN1] + ll * rc, t[A_LN1_MEAN] + ll * R, t[A_LN1_RSTD] + ll * R, t[A_QKV] + ll * 3 * BT * Cl,
        t[A_ATTY] + ll * BT * Cl, t[A_ATT] + ll * att, t[A_ATTPROJ] + ll * rc,
        t[A_RESIDUAL2] + ll * rc, t[A_LN2] + ll * rc, t[A_LN2_MEAN] + ll * R, t[A_LN2_RSTD] + ll * R,
        t[A_FCH] + ll * 4 * BT * Cl, t[A_FCH_GELU] + ll * 4 * BT * Cl, t[A_FCPROJ] + ll * rc, t[A_RESIDUAL3] + ll * rc,
    };
    return v;
}

// the residual stream entering the chunk's layer ll (ll = its nl: leaving the
// chunk): this rank's rows of it (gpt2_alloc_activations)
static float *block_input(const GPT2 *m, const Acts *a, int ll) {
    size_t rc = (size_t)m->rows * m->config.C;
    return ll == 0 ? a->t[A_ENCODED] : a->t[A_RESIDUAL3] + (ll - 1) * rc;
}

// ----------------------------------------------------------------------------
// ZeRO: where a unit's full parameters come from and where its gradients go

// "gradients of layer 3", "parameters of wte": what a collective of unit u
// carries, for the line of a failed check (-ic 1); kept in m until the next
static const char *unit_label(GPT2 *m, int u, const char *what) {
    const Unit *un = &m->ut.units[u];
    if (un->kind >= U_LAYER0)
        snprintf(m->label, sizeof(m->label), "%s of layer %d", what, unit_layer(&m->shard, un));
    else
        snprintf(m->label, sizeof(m->label), "%s of %s", what, un->kind == U_WTE ? "wte" : un->kind == U_WPE ? "wpe" : "lnf");
    return m->label;
}

// makes unit u's full parameters available (ZeRO-3: all-gathers them)
static float *unit_acquire(GPT2 *m, int u) {
    if (m->par->zero < 3 || m->unit_params[u] != NULL) return m->unit_params[u];
    const Unit *un = &m->ut.units[u];
    float *full = (float *)xcalloc(un->padded, sizeof(float), "gathered unit");
    transient_add(m, (long)(un->padded * sizeof(float)));
    if (m->shard.dp > 1) {
        comm_set_label(m->par->comm, unit_label(m, u, "parameters"));
        comm_allgather(m->par->comm, &m->par->dp, m->param_shard + un->shard_offset, full, un->padded / m->shard.dp);
    } else memcpy(full, m->param_shard + un->shard_offset, un->padded * sizeof(float));
    m->unit_params[u] = full;
    return full;
}

static void unit_release(GPT2 *m, int u) {
    if (m->par->zero < 3 || m->unit_params[u] == NULL) return;
    free(m->unit_params[u]);
    m->unit_params[u] = NULL;
    transient_add(m, -(long)(m->ut.units[u].padded * sizeof(float)));
}

// -fault poison: this rank's gradients x100 from the fault's step on, as it
// puts them into the data-parallel reduction: a rogue worker
static void poison_grads(const Parallel *par, float *g, size_t n) {
    if (!fault_poison_fires(&par->fault, par->grid.rank, par->step)) return;
    for (size_t i = 0; i < n; i++) g[i] *= FAULT_POISON_SCALE;
}

// where unit u's gradients accumulate during a backward (ZeRO-2/3: a bucket)
static float *unit_grad_begin(GPT2 *m, int u) {
    if (m->par->zero < 2 || m->unit_grads[u] != NULL) return m->unit_grads[u];
    m->unit_grads[u] = (float *)xcalloc(m->ut.units[u].padded, sizeof(float), "gradient bucket");
    transient_add(m, (long)(m->ut.units[u].padded * sizeof(float)));
    return m->unit_grads[u];
}

// ZeRO-2/3: the unit's backward is done for this micro-batch: reduce-scatter
// the bucket over the data-parallel ranks, add it to my shard, drop the bucket
static void unit_grad_end(GPT2 *m, int u) {
    if (m->par->zero < 2) return;
    const Unit *un = &m->ut.units[u];
    size_t chunk = un->padded / m->shard.dp;
    float *mine = m->grad_shard + un->shard_offset;
    if (m->shard.dp > 1) {
        float *sum = (float *)xcalloc(chunk, sizeof(float), "reduced chunk");
        poison_grads(m->par, m->unit_grads[u], un->padded);
        comm_set_label(m->par->comm, unit_label(m, u, "gradients"));
        comm_count_grads(m->par->comm);
        comm_reduce_scatter(m->par->comm, &m->par->dp, m->unit_grads[u], sum, chunk, OP_SUM);
        for (size_t i = 0; i < chunk; i++) mine[i] += sum[i];
        free(sum);
    } else {
        for (size_t i = 0; i < chunk; i++) mine[i] += m->unit_grads[u][i];
    }
    free(m->unit_grads[u]);
    m->unit_grads[u] = NULL;
    transient_add(m, -(long)(un->padded * sizeof(float)));
}

// ----------------------------------------------------------------------------
// tensor parallel and sequence parallel: the named operations

#include "llm3d/cpu/train_gpt2/tensor_parallel.h"

// ----------------------------------------------------------------------------
// forward and backward of one block. Attention and the MLP each run a
// column-parallel Linear (qkv, fc), this rank's share of the work (its heads,
// its hidden units) and a row-parallel Linear (attproj, fcproj).

// The LayerNorms and the residual adds run on this rank's rows (m->rows:
// all B*T without -sp); the Linears' sequence-parallel forms gather and
// scatter those rows.
static void block_forward(GPT2 *m, LayerParams p, LayerActs a, const float *x) {
    const Parallel *par = m->par;
    int B = m->B, T = m->T, C = m->config.C, Cl = m->shard.Cl, BT = B * T, R = m->rows;
    size_t rc = (size_t)R * C;
    layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1w, p.ln1b, R, C);
    if (m->sp) sp_column_parallel_forward(m, a.qkv, a.ln1, p.qkvw, p.qkvb, C, 3 * Cl);
    else column_parallel_forward(a.qkv, a.ln1, p.qkvw, p.qkvb, BT, C, 3 * Cl);
    attention_forward(a.atty, a.att, a.qkv, B, T, Cl, m->shard.NHl);
    if (m->sp) sp_row_parallel_forward(m, a.attproj, a.atty, p.attprojw, p.attprojb, Cl, C);
    else row_parallel_forward(par, a.attproj, a.atty, p.attprojw, p.attprojb, BT, Cl, C, "tensor-parallel attproj outputs");
    residual_forward(a.residual2, x, a.attproj, rc);
    layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, R, C);
    if (m->sp) sp_column_parallel_forward(m, a.fch, a.ln2, p.fcw, p.fcb, C, 4 * Cl);
    else column_parallel_forward(a.fch, a.ln2, p.fcw, p.fcb, BT, C, 4 * Cl);
    gelu_forward(a.fch_gelu, a.fch, 4 * (size_t)BT * Cl);
    if (m->sp) sp_row_parallel_forward(m, a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, 4 * Cl, C);
    else row_parallel_forward(par, a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb, BT, 4 * Cl, C,
                              "tensor-parallel fcproj outputs");
    residual_forward(a.residual3, a.residual2, a.fcproj, rc);
}

// which part of a backward to run: all of it, or with the backward split
// (pipeline schedules with W ops) the input's gradient (B) or the weights'
// (W). B leaves in the layer's activation gradients (d) all that W reads:
// each Linear's output gradient and each LayerNorm's, which no later part
// of the backward writes over.
enum { BACK_ALL, BACK_INPUT, BACK_WEIGHTS };

// from the gradient of the block's output (d.residual3) to that of its input
// x, dx (+=), and of its parameters g (+=, or = in the step's first backward);
// part: BACK_INPUT leaves g alone, BACK_WEIGHTS reads d and writes g alone
// (p unused), in the same order
static void block_backward(GPT2 *m, LayerParams p, LayerParams g, LayerActs a, LayerActs d, const float *x, float *dx,
                           int part, int fresh) {
    const Parallel *par = m->par;
    int B = m->B, T = m->T, C = m->config.C, Cl = m->shard.Cl, BT = B * T, R = m->rows;
    int in = part != BACK_WEIGHTS;
    size_t rc = (size_t)R * C;
    if (part == BACK_INPUT) memset(&g, 0, sizeof(g));  // NULL: no weight gradients
    if (in) residual_backward(d.residual2, d.residual3, rc);  // fcproj's gradient is d.residual3 itself
    if (m->sp)
        sp_row_parallel_backward(m, in ? d.fch_gelu : NULL, g.fcprojw, g.fcprojb, d.residual3, a.fch_gelu, p.fcprojw,
                                 4 * Cl, C, fresh);
    else
        row_parallel_backward(in ? d.fch_gelu : NULL, g.fcprojw, g.fcprojb, d.residual3, a.fch_gelu, p.fcprojw, BT,
                              4 * Cl, C, fresh);
    if (in) gelu_backward(d.fch, a.fch, d.fch_gelu, 4 * (size_t)BT * Cl);
    if (m->sp) sp_column_parallel_backward(m, in ? d.ln2 : NULL, g.fcw, g.fcb, d.fch, a.ln2, p.fcw, C, 4 * Cl, fresh);
    else column_parallel_backward(par, in ? d.ln2 : NULL, g.fcw, g.fcb, d.fch, a.ln2, p.fcw, BT, C, 4 * Cl, fresh,
                                  "tensor-parallel gradients of fc's input");
    layernorm_backward(in ? d.residual2 : NULL, g.ln2w, g.ln2b, d.ln2, a.residual2, p.ln2w, a.ln2_mean, a.ln2_rstd, R,
                       C, fresh);
    if (in) residual_backward(dx, d.residual2, rc);  // attproj's gradient is d.residual2 itself
    if (m->sp)
        sp_row_parallel_backward(m, in ? d.atty : NULL, g.attprojw, g.attprojb, d.residual2, a.atty, p.attprojw, Cl, C,
                                 fresh);
    else
        row_parallel_backward(in ? d.atty : NULL, g.attprojw, g.attprojb, d.residual2, a.atty, p.attprojw, BT, Cl, C,
                              fresh);
    if (in) attention_backward(d.qkv, d.atty, a.qkv, a.att, B, T, Cl, m->shard.NHl);
    if (m->sp) sp_column_parallel_backward(m, in ? d.ln1 : NULL, g.qkvw, g.qkvb, d.qkv, a.ln1, p.qkvw, C, 3 * Cl, fresh);
    else column_parallel_backward(par, in ? d.ln1 : NULL, g.qkvw, g.qkvb, d.qkv, a.ln1, p.qkvw, BT, C, 3 * Cl, fresh,
                                  "tensor-parallel gradients of qkv's input");
    layernorm_backward(in ? dx : NULL, g.ln1w, g.ln1b, d.ln1, x, p.ln1w, a.ln1_mean, a.ln1_rstd, R, C, fresh);
}

// ----------------------------------------------------------------------------
// a stage's forward and backward of one micro-batch. The first stage starts
// from the tokens, the others from the activations the previous stage sent
// (in A_ENCODED); the last ends in the loss, the others send their output on.

static int stage_rank(const Parallel *par, int pp_rank) {
    return grid_rank(&par->grid, par->grid.dp_rank, pp_rank, par->grid.tp_rank);
}

static void embed_forward(GPT2 *m, Acts *a) {
    const Shard *s = &m->shard;
    int B = m->B, T = m->T, C = m->config.C;
    float *wte = unit_acquire(m, m->ut.u_wte), *wpe = unit_acquire(m, m->ut.u_wpe);
    if (m->sp) sp_vocab_parallel_embedding_forward(m, a->t[A_ENCODED], a->inputs, wte, wpe, s->v0, s->Vl);
    else vocab_parallel_embedding_forward(m->par, a->t[A_ENCODED], a->inputs, wte, wpe, s->v0, s->Vl, B, T, C);
    unit_release(m, m->ut.u_wpe);
    if (!s->last) unit_release(m, m->ut.u_wte);  // one stage: wte stays for the head
}

// final LayerNorm, logits over my vocabulary rows, the loss (mean over B*T).
// With the loss the logits become the softmax in place, so a caller that
// reads the logits (sampling, a test) runs without it. Under -sp the head
// takes the gathered layout: the LayerNorm's output on this rank's rows,
// all-gathered in place into A_LNF, which stays whole for the backward; the
// logits, the loss and its all-reduces are then those without -sp.
static void head_forward(GPT2 *m, Acts *a, int nl, int with_loss) {
    const Shard *s = &m->shard;
    int BT = m->B * m->T, C = m->config.C;
    float *lnf = unit_acquire(m, m->ut.u_lnf), *wte = unit_acquire(m, m->ut.u_wte);
    float *mine = a->t[A_LNF] + (size_t)m->row0 * C;
    layernorm_forward(mine, a->t[A_LNF_MEAN], a->t[A_LNF_RSTD], block_input(m, a, nl), lnf, lnf + C, m->rows, C);
    if (m->sp) sp_gather(m, a->t[A_LNF], mine);
    column_parallel_forward(a->t[A_LOGITS], a->t[A_LNF], wte, NULL, BT, C, s->Vl);
    unit_release(m, m->ut.u_lnf);
    unit_release(m, m->ut.u_wte);
    if (!with_loss) return;
    vocab_parallel_cross_entropy_forward(m->par, a->t[A_LOSSES], a->t[A_ROWMAX], a->t[A_ROWSUM], a->t[A_LOGITS],
                                         a->targets, s->v0, BT, s->Vl, s->nreal);
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += a->t[A_LOSSES][i];
    a->mean_loss = (float)(sum / BT);
}

// whether chunk k of this stage holds the model's first / last part
static int chunk_first(const Shard *s, int k) { return s->chunk[k].part == 0; }
static int chunk_last(const Shard *s, int k) { return s->chunk[k].part == s->pp * s->nchunks - 1; }

// the forward of chunk k on set a: the embeddings on part 0, the chunk's
// layers (units u_layer0 + its offset among the stage's layers), the head on
// the last part
static void chunk_forward(GPT2 *m, Acts *a, int k, int with_loss) {
    const Shard *s = &m->shard;
    const ShardChunk *ch = &s->chunk[k];
    if (chunk_first(s, k)) embed_forward(m, a);
    for (int ll = 0; ll < ch->nl; ll++) {
        int u = m->ut.u_layer0 + ch->off + ll;
        LayerParams p = layer_params_at(&m->config, s, unit_acquire(m, u));
        block_forward(m, p, layer_acts(m, a, ll), block_input(m, a, ll));
        unit_release(m, u);
    }
    if (chunk_last(s, k)) head_forward(m, a, ch->nl, with_loss);
}

// the stage's whole forward: one chunk, or on one rank (pp 1) several in
// model order (-ps zbv's two, in a V), each taking the output of the one
// before into the set's embeddings slot, as pipeline_run's hand-off does
static void stage_forward(GPT2 *m, Acts *a, int with_loss) {
    const Shard *s = &m->shard;
    size_t bytes = (size_t)m->rows * m->config.C * sizeof(float);
    for (int p = 0; p < s->nchunks; p++) {
        int stage, k, before;
        pipeline_place(&m->par->pipe, p, &stage, &k);
        if (p > 0) {
            pipeline_place(&m->par->pipe, p - 1, &stage, &before);
            memmove(a->t[A_ENCODED], block_input(m, a, s->chunk[before].nl), bytes);
        }
        chunk_forward(m, a, k, with_loss);
    }
}

// dloss = d(objective)/d(loss at one position): 1 / (all positions of the
// step). d: the activation gradients (m->dacts, or with the backward split
// the micro-batch's own, which its W reads). part: BACK_ALL, or BACK_INPUT
// then later BACK_WEIGHTS (block_backward): the head's, the layers' and the
// embeddings' weight gradients all wait for W, in the same order.
static void chunk_backward(GPT2 *m, Acts *a, Acts *d, float dloss, int part, int k) {
    const Shard *s = &m->shard;
    const GPT2Config *c = &m->config;
    int B = m->B, T = m->T, C = c->C, BT = B * T, in = part != BACK_WEIGHTS, wt = part != BACK_INPUT;
    int nl = s->chunk[k].nl, fresh = m->grads_fresh >> k & 1;
    size_t rc = (size_t)m->rows * C;
    // most activation gradients are written by the one layer that makes
    // them (cpu_layers.h); two are added to and start cleared: qkv's, which
    // attention_backward gathers, and on the last stage the gradient leaving
    // the last block, which only the final LayerNorm's backward adds to.
    // (The attention weights' is never made: attention_backward goes from
    // dout to dqkv directly.)
    if (in) zero_floats(d->t[A_QKV], (size_t)nl * 3 * BT * m->shard.Cl);
    if (chunk_last(s, k)) {
        if (in) zero_floats(block_input(m, d, nl), rc);
        float *lnf = in ? unit_acquire(m, m->ut.u_lnf) : NULL, *wte = in ? unit_acquire(m, m->ut.u_wte) : NULL;
        float *dlnf = wt ? unit_grad_begin(m, m->ut.u_lnf) : NULL, *dwte = wt ? unit_grad_begin(m, m->ut.u_wte) : NULL;
        // the probabilities, in the logits' place since the forward, become
        // the logits' gradient in place: nothing reads them after (but a
        // split backward's W), and the gradient's own buffer is never touched
        float *dlogits = a->t[A_LOGITS];
        if (in)
            vocab_parallel_cross_entropy_backward(dlogits, a->t[A_LOGITS], a->t[A_ROWSUM], a->targets, dloss, s->v0, BT,
                                                  s->Vl, s->nreal);
        // -sp: the head's input was gathered and kept (head_forward), so its
        // weights need no gather; its gradient is summed over the tp ranks
        // onto each rank's rows, in place
        float *dmine = d->t[A_LNF] + (size_t)m->row0 * C;
        if (m->sp) {
            matmul_backward(in ? d->t[A_LNF] : NULL, dwte, NULL, dlogits, a->t[A_LNF], wte, BT, C, s->Vl, fresh);
            if (in) sp_reduce_scatter(m, dmine, d->t[A_LNF]);
        } else {
            column_parallel_backward(m->par, in ? d->t[A_LNF] : NULL, dwte, NULL, dlogits, a->t[A_LNF], wte, BT, C,
                                     s->Vl, fresh, "tensor-parallel gradients of the head's input");
        }
        layernorm_backward(in ? block_input(m, d, nl) : NULL, dlnf, dlnf != NULL ? dlnf + C : NULL, dmine,
                           block_input(m, a, nl), lnf, a->t[A_LNF_MEAN], a->t[A_LNF_RSTD], m->rows, C, fresh);
        if (in) {
            unit_release(m, m->ut.u_lnf);
            unit_release(m, m->ut.u_wte);
        }
        if (wt) {
            unit_grad_end(m, m->ut.u_lnf);
            if (!s->first) unit_grad_end(m, m->ut.u_wte);
        }
    } else if (in) {
        memcpy(block_input(m, d, nl), a->grad_in, rc * sizeof(float));
    }
    for (int ll = nl - 1; ll >= 0; ll--) {
        int u = m->ut.u_layer0 + s->chunk[k].off + ll;
        LayerParams p, g;
        memset(&p, 0, sizeof(p));
        memset(&g, 0, sizeof(g));
        if (in) p = layer_params_at(c, s, unit_acquire(m, u));
        if (wt) g = layer_params_at(c, s, unit_grad_begin(m, u));
        block_backward(m, p, g, layer_acts(m, a, ll), layer_acts(m, d, ll), block_input(m, a, ll), block_input(m, d, ll),
                       part, fresh);
        if (in) unit_release(m, u);
        if (wt) unit_grad_end(m, u);
    }
    if (chunk_first(s, k) && wt) {
        float *dwte = unit_grad_begin(m, m->ut.u_wte), *dwpe = unit_grad_begin(m, m->ut.u_wpe);
        if (m->sp) sp_vocab_parallel_embedding_backward(m, dwte, dwpe, d->t[A_ENCODED], a->inputs, s->v0, s->Vl);
        else vocab_parallel_embedding_backward(dwte, dwpe, d->t[A_ENCODED], a->inputs, s->v0, s->Vl, B, T, C);
        unit_grad_end(m, m->ut.u_wpe);
        unit_grad_end(m, m->ut.u_wte);
    }
    if (wt) m->grads_fresh &= ~(1 << k);
}

// the whole backward of micro-batch a, through m->dacts (one chunk per stage)
static void stage_backward(GPT2 *m, Acts *a, float dloss) { chunk_backward(m, a, &m->dacts, dloss, BACK_ALL, 0); }

// ----------------------------------------------------------------------------
// the optimizer step: gradients summed over data-parallel ranks (ZeRO-0:
// all-reduce; 1: reduce-scatter; 2, 3: already reduced unit by unit), the
// global norm and clipping, AdamW on what this rank owns, and (ZeRO-1, 2)
// the updated parameters all-gathered.

// the step's gradients start at zero. The backward writes most of them
// (grads_fresh: the Linear and LayerNorm ones), so only the embeddings' are
// cleared here: wpe's rows past T and wte's rows of tokens not in the batch
// get nothing, and on a first stage without the head nothing writes wte's
// first. ZeRO-2/3 add each micro-batch's buckets, fresh and zero, to the
// shard, which is cleared.
static void gpt2_zero_grad(GPT2 *m) {
    const Shard *s = &m->shard;
    m->grads_fresh = (1 << s->nchunks) - 1;
    if (m->grads && s->first) {
        const Unit *wpe = &m->ut.units[m->ut.u_wpe], *wte = &m->ut.units[m->ut.u_wte];
        zero_floats(m->grads + wpe->offset, wpe->padded);
        if (!s->last) zero_floats(m->grads + wte->offset, wte->padded);
    }
    if (m->grad_shard) zero_floats(m->grad_shard, m->ut.num_shard);
}

static void gpt2_zero_losses(GPT2 *m) { m->loss_sum = 0.0f; }

static void gpt2_reduce_grads(GPT2 *m) {
    const Parallel *par = m->par;
    const Shard *s = &m->shard;
    int zero = par->zero;
    // the tied wte: the first and the last stage add their gradients
    if (s->pp > 1 && m->ut.u_wte >= 0) {
        const Unit *un = &m->ut.units[m->ut.u_wte];
        if (zero <= 1) group_allreduce(par, &par->tied, m->grads + un->offset, un->padded, "the tied wte's gradients");
        else group_allreduce(par, &par->tied, m->grad_shard + un->shard_offset, un->padded / s->dp,
                             "the tied wte's gradients");
    }
    if (s->dp == 1 || zero >= 2) return;  // ZeRO-2/3 reduced each unit during the backward
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        size_t chunk = un->padded / s->dp;
        float *g = m->grads + un->offset;
        poison_grads(par, g, un->padded);
        comm_set_label(par->comm, unit_label(m, u, "gradients"));
        comm_count_grads(par->comm);
        if (zero == 0) {
            comm_allreduce(par->comm, &par->dp, g, un->padded, OP_SUM);
        } else {  // ZeRO-1: only my chunk of the sum is needed; it goes back in place
            float *sum = (float *)xcalloc(chunk, sizeof(float), "reduced chunk");
            comm_reduce_scatter(par->comm, &par->dp, g, sum, chunk, OP_SUM);
            memcpy(g + s->dp_rank * chunk, sum, chunk * sizeof(float));
            free(sum);
        }
    }
}

// what this rank updates, one run of one tensor at a time: ZeRO-0 all its
// units; ZeRO-1/2/3 its 1/dp of each unit. The pointers say where that run
// sits in each array (whole units or shards, depending on the stage).
typedef struct { int tensor; size_t n; float *param, *grad, *m, *v; } Run;
typedef void (*RunFn)(GPT2 *m, const Run *r, void *ctx);

// my_chunk: under ZeRO-0 too, only my 1/dp of each unit (for the norm: so
// that every stage sums the same squares in the same order, bit for bit)
static void for_each_run(GPT2 *m, RunFn fn, void *ctx, int my_chunk) {
    int zero = m->par->zero, split = zero >= 1 || my_chunk;
    size_t dp = m->shard.dp;
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        size_t lo = split ? m->shard.dp_rank * (un->padded / dp) : 0;  // my part of the unit
        size_t hi = split ? lo + un->padded / dp : un->padded;
        size_t state = zero >= 1 ? un->shard_offset : un->offset;
        float *param = zero == 3 ? m->param_shard + un->shard_offset : m->params + un->offset + lo;
        float *grad = zero <= 1 ? m->grads + un->offset + lo : m->grad_shard + un->shard_offset;
        size_t t_off = 0;
        for (int k = 0; k < unit_tensor_count(un->kind); k++) {
            int t = unit_tensor(un->kind, k);
            size_t t_end = t_off + local_tensor_size(&m->config, &m->shard, t);
            size_t a = lo > t_off ? lo : t_off, b = hi < t_end ? hi : t_end;
            if (a < b) {
                size_t at = a - lo;
                Run r = {t, b - a, param + at, grad + at, zero >= 1 || !split ? m->m + state + at : NULL,
                         zero >= 1 || !split ? m->v + state + at : NULL};
                fn(m, &r, ctx);
            }
            t_off = t_end;
        }
    }
}

// -sp 1: each LayerNorm's weight and bias gradients came from this rank's
// rows only, so the step sums them over the tp group: the runs of every
// LayerNorm tensor this rank updates, packed into one buffer, one
// all-reduce, unpacked. Every tp rank walks the same units, which hold the
// same tensors at the same offsets, so the runs line up.
typedef struct { float *buf; size_t n; int unpack; } NormGrads;

static void norm_grads_run(GPT2 *m, const Run *r, void *ctx) {
    (void)m;
    NormGrads *ng = (NormGrads *)ctx;
    if (!param_is_layernorm(r->tensor)) return;
    if (ng->buf != NULL && !ng->unpack) memcpy(ng->buf + ng->n, r->grad, r->n * sizeof(float));
    if (ng->buf != NULL && ng->unpack) memcpy(r->grad, ng->buf + ng->n, r->n * sizeof(float));
    ng->n += r->n;
}

static void sp_sum_layernorm_grads(GPT2 *m) {
    if (!m->sp) return;
    NormGrads ng = {NULL, 0, 0};
    for_each_run(m, norm_grads_run, &ng, 0);  // counts them
    ng.buf = (float *)xcalloc(ng.n, sizeof(float), "LayerNorm gradients");
    size_t n = ng.n;
    ng.n = 0;
    for_each_run(m, norm_grads_run, &ng, 0);
    group_allreduce(m->par, &m->par->tp, ng.buf, n, "sequence-parallel LayerNorm gradients");
    ng.n = 0;
    ng.unpack = 1;
    for_each_run(m, norm_grads_run, &ng, 0);
    free(ng.buf);
}

static void add_sumsq(GPT2 *m, const Run *r, void *ctx) {
    const Shard *s = &m->shard;
    // count each gradient once in the job: replicas over tp and the tied
    // wte copy on the last stage count on one rank only
    if (!tensor_counted_here(s, r->tensor)) return;
    *(double *)ctx += sum_squares(r->grad, r->n);
}

typedef struct { float lr, beta1, beta2, eps, weight_decay, grad_clip; } AdamHyper;
typedef struct { const AdamHyper *h; float grad_scale; } AdamStep;

static void adam_run(GPT2 *m, const Run *r, void *ctx) {
    const AdamStep *st = (const AdamStep *)ctx;
    const AdamHyper *h = st->h;
    adamw_update(r->param, r->grad, r->m, r->v, r->n, st->grad_scale, h->lr, h->beta1, h->beta2, h->eps,
                 param_is_matrix(r->tensor) ? h->weight_decay : 0.0f, m->adam_t);
}

// the end of a step, after its pipeline run, up to the update: the
// gradients summed (gpt2_reduce_grads), the grad norm before clipping (kept
// for gpt2_last_norm), the loss and the stop requests, which every rank
// gets. *stop: in, whether this rank was asked to stop (a signal); out,
// whether any rank was, so that all stop after the same step. Returns the
// step's mean loss; the loop then applies the update (gpt2_apply_update)
// unless it is not finite or -sl or -sg skip it.
static float gpt2_step_loss(GPT2 *m, const Parallel *par, int accum, int *stop) {
    const Shard *s = &m->shard;
    gpt2_reduce_grads(m);
    sp_sum_layernorm_grads(m);
    double sumsq = 0.0;
    for_each_run(m, add_sumsq, &sumsq, 1);
    // one all-reduce for the norm, the loss (each counted on one rank per
    // replica) and the stop requests, and with dp > 1 every rank's own
    // gradient sum of squares as it put them into the dp reduction (this
    // rank's slot alone nonzero here, so the sum holds every rank's), padded
    // to a multiple of the ranks so that the ring's chunks are even
    int world = par->world.size, extra = s->dp > 1 ? world : 0, n = (3 + extra + world - 1) / world * world;
    float all[2 * GRID_MAX_WORLD + 3] = {(float)sumsq, s->last && s->tp_rank == 0 ? m->loss_sum / accum / s->dp : 0.0f,
                                         (float)*stop};
    if (extra) all[3 + par->grid.rank] = (float)comm_grad_sumsq(par->comm);
    group_allreduce(par, &par->world, all, (size_t)n, "the step's grad norm, loss and stop requests");
    *stop = all[2] > 0.0f;
    m->norm = sqrtf(all[0]);
    for (int r = 0; r < extra; r++) m->rank_norms[r] = sqrtf(all[3 + r]);
    return all[1];
}

static float gpt2_last_norm(const GPT2 *m) { return m->norm; }

// every rank's own gradient norm of the step, before the dp reduction
// (gpt2_step_loss); NULL with dp 1
static const float *gpt2_rank_norms(const GPT2 *m) { return m->rank_norms; }

// AdamW on what this rank owns, the gradients clipped to h->grad_clip given
// their norm, and (ZeRO-1, 2) the updated parameters all-gathered
static void gpt2_apply_update(GPT2 *m, const AdamHyper *h) {
    const Parallel *par = m->par;
    const Shard *s = &m->shard;
    float norm = m->norm, max_norm = h->grad_clip;
    // clipping as torch.nn.utils.clip_grad_norm_, applied by AdamW as it reads the gradients
    AdamStep st = {h, max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f};
    m->adam_t++;
    for_each_run(m, adam_run, &st, 0);
    if ((par->zero == 1 || par->zero == 2) && s->dp > 1) {  // everyone's updated chunks, to everyone
        for (int u = 0; u < m->ut.n; u++) {
            const Unit *un = &m->ut.units[u];
            size_t chunk = un->padded / s->dp;
            float *mine = (float *)xcalloc(chunk, sizeof(float), "updated chunk");
            memcpy(mine, m->params + un->offset + s->dp_rank * chunk, chunk * sizeof(float));
            comm_set_label(par->comm, unit_label(m, u, "updated parameters"));
            comm_allgather(par->comm, &par->dp, mine, m->params + un->offset, chunk);
            free(mine);
        }
    }
}

// the whole optimizer step on one rank (the tests): the norm, then AdamW
static void gpt2_update(GPT2 *m, const AdamHyper *h) {
    int stop = 0;
    gpt2_step_loss(m, m->par, 1, &stop);
    gpt2_apply_update(m, h);
}

static void add_param_sumsq(GPT2 *m, const Run *r, void *ctx) {
    (void)m;
    *(double *)ctx += sum_squares(r->param, r->n);
}

// whether every parameter this rank updates is finite, the same answer on
// every rank (one all-reduce): checked before the parameters are written (a
// checkpoint, the final model), not after every update, so that a NaN the
// loss cannot show (one in wte's padded rows, which no logit reads) never
// reaches a file, at no cost to a step. A NaN or an infinity makes the sum
// of squares (in double: finite floats' squares cannot overflow it) NaN or
// infinite.
static int gpt2_params_finite(GPT2 *m) {
    const Parallel *par = m->par;
    double sumsq = 0.0;
    for_each_run(m, add_param_sumsq, &sumsq, 0);
    float all[GRID_MAX_WORLD] = {isfinite(sumsq) ? 0.0f : 1.0f};  // one each, padded to the ranks (the ring's chunks)
    group_allreduce(par, &par->world, all, (size_t)par->world.size, "the verdicts on the parameters");
    return all[0] == 0.0f;
}

// ----------------------------------------------------------------------------
// export and checkpoints: through gpt2.h's for_each_owned

typedef struct { float *const *unit_data; float *full; } ExportCtx;

static void export_run(const OwnedRun *r, void *ctx) {
    const ExportCtx *e = (const ExportCtx *)ctx;
    memcpy(e->full + r->g, e->unit_data[r->u] + r->j, r->n * sizeof(float));
}

// whole tensors in the file layout from this rank's units (unit_params or
// unit_grads); a sum over all ranks assembles the full model
static void gpt2_export(GPT2 *m, float *const *unit_data, float *full) {
    ExportCtx e = {unit_data, full};
    for_each_owned(&m->config, &m->shard, &m->ut, 0, export_run, &e);
}

// this rank's slice of tensor t (of `layer`, for the per-layer tensors)
// within unit_data (the model's unit_params or unit_grads); NULL when this
// stage does not hold it
static float *tensor_view(const GPT2 *m, float *const *unit_data, int t, int layer) {
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        if (un->kind >= U_LAYER0 && unit_layer(&m->shard, un) != layer) continue;
        float *p = unit_data[u];
        for (int k = 0; k < unit_tensor_count(un->kind); k++) {
            if (unit_tensor(un->kind, k) == t) return p;
            p += local_tensor_size(&m->config, &m->shard, unit_tensor(un->kind, k));
        }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// checkpoints (checkpoint.h has the files): every rank writes what it owns
// straight into the whole tensors of model.bin and optim.bin, so the files do
// not depend on the layout and no rank ever holds the whole model or state.

typedef struct { GPT2 *m; CkptOut model, optim; int error; size_t N; } SaveCtx;  // optim.fd < 0: no optim.bin

// where element j of unit u lives on this rank: in the whole unit (offset)
// or, when the array is sharded over dp, in my 1/dp of it (shard_offset)
static float *unit_elem(const GPT2 *m, float *arr, int sharded, int u, size_t j) {
    return arr + unit_index(&m->ut, &m->shard, u, j, sharded);
}

static void save_run(const OwnedRun *r, void *ctx) {
    SaveCtx *sc = (SaveCtx *)ctx;
    GPT2 *m = sc->m;
    int zero = m->par->zero;
    const float *p = zero == 3 ? unit_elem(m, m->param_shard, 1, r->u, r->j) : unit_elem(m, m->params, 0, r->u, r->j);
    const float *mo = unit_elem(m, m->m, zero >= 1, r->u, r->j), *vo = unit_elem(m, m->v, zero >= 1, r->u, r->j);
    size_t bytes = r->n * sizeof(float), at = HEADER_INTS * 4 + r->g * sizeof(float);
    if (sc->error == 0 && (ckpt_out_pwrite(&sc->model, p, bytes, at) != 0 ||
                           (sc->optim.fd >= 0 && (ckpt_out_pwrite(&sc->optim, mo, bytes, at) != 0 ||
                                               ckpt_out_pwrite(&sc->optim, vo, bytes, at + sc->N * sizeof(float)) != 0))))
        sc->error = errno;
}

// this rank's share of the model file model_name and, unless optim_name
// is NULL (the final model), of optim.bin, both in -o (dfd) (ckpt_write_job's
// and ckpt_write_model's part; cipher: for files rank 0 made sealed, their
// GHASH shares into shares[0] and shares[1])
static int save_part(void *ctx, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                     CkptShare *shares) {
    GPT2 *m = (GPT2 *)ctx;
    SaveCtx sc;
    memset(&sc, 0, sizeof(sc));
    sc.m = m;
    sc.N = param_count(&m->config);
    sc.optim.fd = -1;
    sc.error = ckpt_out_open_at(&sc.model, dfd, model_name, cipher, shares != NULL ? &shares[0] : NULL);
    int e = optim_name != NULL ? ckpt_out_open_at(&sc.optim, dfd, optim_name, cipher, shares != NULL ? &shares[1] : NULL)
                               : 0;
    if (sc.error == 0) sc.error = e;
    if (sc.error == 0) for_each_owned(&m->config, &m->shard, &m->ut, 1, save_run, &sc);
    e = ckpt_out_close(&sc.model, sc.error == 0);
    if (sc.error == 0) sc.error = e;
    e = ckpt_out_close(&sc.optim, sc.error == 0);
    if (sc.error == 0) sc.error = e;
    return sc.error;
}

static float save_sum(void *ctx, float x) {
    GPT2 *m = (GPT2 *)ctx;
    group_allreduce(m->par, &m->par->world, &x, 1, "the checkpoint's agreement");
    return x;
}

// every rank's bytes to rank 0, in rank order (a checkpoint's masked GHASH
// shares): messages on the control channel, each wait bounded by -to
static void save_gather(void *ctx, const void *mine, void *all, size_t bytes) {
    GPT2 *m = (GPT2 *)ctx;
    const Parallel *par = m->par;
    if (par->grid.world == 1) return;
    if (par->grid.rank != 0) comm_send(par->comm, 0, CH_CONTROL, 0, mine, bytes);
    else
        for (int r = 1; r < par->grid.world; r++) comm_recv(par->comm, r, CH_CONTROL, 0, (uint8_t *)all + r * bytes, bytes);
}

// how long this rank's collectives wait (a write lengthens it for its own waits)
static double save_set_timeout(void *ctx, double seconds) {
    GPT2 *m = (GPT2 *)ctx;
    return comm_set_timeout(m->par->comm, seconds);
}

// the checkpoint of step st->step (checkpoint.h's ckpt_write_job: every rank
// writes its part; the same verdict on every rank, 0 = complete and sealed)
static int gpt2_checkpoint(GPT2 *m, int out_fd, const char *out_dir, int keep, const CkptState *st, const uint8_t key[32],
                           int encrypt) {
    CkptJob job = {save_sum, save_part, save_gather, save_set_timeout, m, m->par->grid.rank, m->par->grid.world,
                   encrypt};
    return ckpt_write_job(&job, out_fd, out_dir, keep, st, key);
}

// the final model, DIR/model_SSSSSSSS.bin into path (checkpoint.h's
// ckpt_write_model: every rank writes its part, as for a checkpoint's
// model.bin); sealed under the checkpoint key with encrypt (-enc 2). On a
// failure err names the file and the reason on the rank that knows, and is
// empty on the others.
static int gpt2_write_model(GPT2 *m, int out_fd, const char *out_dir, int steps, const uint8_t key[32], int encrypt,
                            char *path, size_t pathlen, char *err, size_t errlen) {
    CkptJob job = {save_sum, save_part, save_gather, save_set_timeout, m, m->par->grid.rank, m->par->grid.world,
                   encrypt};
    return ckpt_write_model(&job, out_fd, out_dir, steps, &m->config, key, path, pathlen, err, errlen);
}

// AdamW's m and v for this rank's part from a checkpoint's optim.bin (the
// parameters come in through gpt2_build from its model.bin)
static int gpt2_load_optimizer(GPT2 *m, const char *path, const uint8_t key[32], int adam_t, char *err, size_t errlen) {
    OptimFile f;
    int sharded = m->par->zero >= 1;
    if (ckpt_optim_open(&f, path, key, &m->config, &m->shard, &m->ut, sharded, adam_t, err, errlen) != 0) return -1;
    float *buf = (float *)xcalloc(unit_table_largest(&m->ut), sizeof(float), "unit");
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        size_t chunk = un->padded / m->shard.dp, lo = m->shard.dp_rank * chunk;
        for (int k = 0; k < 2; k++) {
            float *dst = k == 0 ? m->m : m->v;
            memset(buf, 0, un->padded * sizeof(float));
            unit_fill(&m->config, &m->shard, un, buf, k == 0 ? f.m : f.v, 0);
            if (sharded) memcpy(dst + un->shard_offset, buf + lo, chunk * sizeof(float));
            else memcpy(dst + un->offset, buf, un->padded * sizeof(float));
        }
    }
    free(buf);
    ckpt_optim_close(&f);
    m->adam_t = adam_t;
    return 0;
}

// ----------------------------------------------------------------------------
// the FMA peak, the MFU's denominator

// the MFU's denominator, FLOP/s: the FMA peak of all the job's threads
// (cpu_peak.h), the best of `runs` runs, measured before the first step and
// printed by rank 0. Every rank measures at once, each on its own threads,
// so that the ranks' threads share the cores as they do in the steps; alone,
// on a machine with two hardware threads per core, they could have a core
// each. The ranks' records (their threads, rates and CPU sets) are
// all-gathered, and every rank adds them up alike (cpu_job_peak): the CPUs
// of the job, not rank 0's. *threads and *cpus: the job's.
static double job_fma_peak(Parallel *par, int runs, int *all_threads, int *cpus) {
    int threads = 1, world = par->grid.world;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    if (par->comm) comm_barrier(par->comm, &par->world);
    float *all = (float *)xcalloc((size_t)world * CPU_RANK_FLOATS, sizeof(float), "the ranks' CPU records");
    float *mine = all + (size_t)par->grid.rank * CPU_RANK_FLOATS;  // in place
    cpu_rank_record(mine, threads, cpu_fma_rate(runs));
    if (par->comm) comm_allgather(par->comm, &par->world, mine, all, CPU_RANK_FLOATS);
    double peak = cpu_job_peak(all, world, all_threads, cpus);
    free(all);
    return peak * 1e9;
}

static double first_fma_peak(Parallel *par) {
    int threads, cpus;
    double peak = job_fma_peak(par, 3, &threads, &cpus);
    if (par->grid.rank == 0)
        printf("FMA peak: %.1f GFLOP/s for %d threads on %d CPUs (the MFU's denominator)\n", peak * 1e-9, threads, cpus);
    return peak;
}

// the peak measured again, one run, after the launch's steps 1, 10, 100 and
// 1000 (done: steps this launch has trained), and the best kept. On a shared
// machine the cores' FMA rate swings: a thread's ran from 58 to 99 GFLOP/s
// within 0.7 s on the dev box as a job started, and the peak taken in such a
// spell halved it and doubled the MFU of about 1 launch in 10. Rank 0 says
// so when the peak rose by more than a tenth.
static double refine_fma_peak(Parallel *par, double peak, int done, int last) {
    if (last || (done != 1 && done != 10 && done != 100 && done != 1000)) return peak;
    int threads, cpus;
    double again = job_fma_peak(par, 1, &threads, &cpus);
    if (again > 1.1 * peak && par->grid.rank == 0)
        printf("FMA peak measured again after %d step%s: %.1f GFLOP/s (%.1f before: the cores were busier); the MFU "
               "is against it from here on\n", done, done == 1 ? "" : "s", again * 1e-9, peak * 1e-9);
    return again > peak ? again : peak;
}

#ifndef TESTING
// ----------------------------------------------------------------------------
// the trainer

#include "llm3d/trainer.h"
#include "llm3d/watch.h"

#include "llm3d/cpu/train_gpt2/pipeline_run.h"
#include "llm3d/cpu/train_gpt2/eval.h"

// every K steps: the data-parallel replicas compare a SHA-256 of each of
// their parameter tensors (the digests travel MAC'd like every message);
// watch.h's replicas_judge names the rank that differs. The group's first
// member says so, and the group waits for its line before it exits.
static void consistency_check(GPT2 *m, const Parallel *par, int step) {
    if (par->dp.size == 1) return;
    int n = unit_table_tensors(&m->ut), dp = par->dp.size, t = 0;
    float *all = m->digests, *mine = all + (size_t)n * 8 * par->dp.me;  // in place
    for (int u = 0; u < m->ut.n; u++) {
        const float *p = unit_acquire(m, u);
        t += unit_digests(&m->config, &m->shard, m->ut.units[u].kind, p, sizeof(float), (uint8_t *)(mine + 8 * (size_t)t));
        unit_release(m, u);
    }
    comm_set_label(par->comm, "the parameters' digests");
    comm_allgather(par->comm, &par->dp, mine, all, (size_t)n * 8);
    char msg[4096];
    if (replicas_judge((const uint8_t *)all, dp, n, par->dp.ranks, &m->ut, &m->shard, msg, sizeof(msg))) {
        if (par->dp.me == 0) print_replicas_disagree(par->grid.rank, step, msg);
        comm_barrier(par->comm, &par->dp);
        exit(1);
    }
}

// -fault drift: this rank's first parameter changed where its copy lives
// (ZeRO-3: in its shard, which every replica gathers alike, so no check
// can see it there)
static void drift_parameter(GPT2 *m) {
    const Unit *un = &m->ut.units[0];
    float *p = m->par->zero < 3 ? m->unit_params[0] : m->param_shard + un->shard_offset;
    p[0] += FAULT_DRIFT_DELTA;
}

// the watch report (trainer.h) after this step: every rank's compute and
// wait per step all-gathered over the world; rank 0 judges
static void watch_report(GPT2 *m, const Parallel *par, Watch *w, int step, LogLine *l) {
    (void)m;  // as train_gpt2.cu's, which waits for the model's stream
    float *mine = w->all + (size_t)par->grid.rank * WATCH_FLOATS;  // in place
    watch_pack(w, mine);
    comm_set_label(par->comm, "the watch report's times");
    comm_allgather(par->comm, &par->world, mine, w->all, WATCH_FLOATS);
    if (par->grid.rank == 0) watch_judge(w, step, w->all, l);
}

// the pipeline's bubble after this step (pp > 1; watch.h's PipeMeter):
// every rank's times all-gathered over the world; rank 0 judges, into l
static void bubble_report(GPT2 *m, const Parallel *par, PipeMeter *pm, int step, LogLine *l) {
    (void)m;
    if (!pm->on) return;
    float *mine = pm->all + (size_t)par->grid.rank * PIPE_METER_FLOATS;  // in place
    pipe_meter_pack(pm, mine);
    comm_set_label(par->comm, "the pipeline meter's times");
    comm_allgather(par->comm, &par->world, mine, pm->all, PIPE_METER_FLOATS);
    if (par->grid.rank == 0) pipe_meter_judge(pm, step, pm->all, l);
}

static void print_layout(const GPT2 *m, const Parallel *par, const Options *o, int accum) {
    const Shard *s = &m->shard;
    const Grid *g = &par->grid;
    PipeLayout pl = job_pipeline(o, g->pp, accum);
    char chunks[256], lent[96] = "";
    if (m->nheads > 0)  // the head's chunk among others: its logits lent to its sets (gpt2_pipeline)
        snprintf(lent, sizeof(lent), ", logits lent from %d buffer%s to %d activation sets", m->nheads,
                 m->nheads == 1 ? "" : "s", m->nacts);
    if (g->rank == 0)
        printf("layout: %d ranks = dp %d x tp %d x pp %d%s, ZeRO-%d, schedule %s, %d micro-batches per step, bubble %.3f\n",
               g->world, g->dp, g->tp, g->pp, m->sp ? " (sequence parallel)" : "", par->zero, pipeline_name(pl.schedule),
               accum, pipeline_bubble(&pl));
    // one line per rank, in rank order, from the rank itself
    ActBytes act = gpt2_activation_bytes(m);
    for (int r = 0; r < g->world; r++) {
        if (r == g->rank)
            printf("rank %d (dp %d, pp %d, tp %d): layers %s%s%s, heads %d..%d, vocab rows %d..%d, "
                   "bytes: params %zu grads %zu optimizer %zu (%zu elements, shard %zu), "
                   "activations %zu (%d sets, positions %d..%d) gradients %zu sp buffers %zu%s\n",
                   g->rank, g->dp_rank, g->pp_rank, g->tp_rank, shard_chunk_list(s, chunks, sizeof(chunks)),
                   s->first ? " +embeddings" : "",
                   s->last ? " +head" : "", s->tp_rank * s->NHl, (s->tp_rank + 1) * s->NHl - 1, s->v0, s->v0 + s->Vl - 1,
                   m->bytes_params, m->bytes_grads, m->bytes_optimizer,
                   m->ut.num_local, m->ut.num_shard, act.acts, m->nacts, m->row0, m->row0 + m->rows - 1, act.grads,
                   act.sp_buffers, lent);
        fflush(stdout);
        if (g->world > 1) comm_barrier(par->comm, &par->world);
    }
}

// joins the job: with -np > 1 this process becomes the launcher and
// parallel_main never returns; a rank gets its place and its communicator
static void parallel_setup(Parallel *par, const Options *o, const Fault *fault, int argc, char **argv) {
    char err[512];
    memset(par, 0, sizeof(*par));
    LaunchMeet meet = job_meet(o);
    int rc = parallel_join(argc, argv, o->np, o->tp, o->pp, o->rendezvous, o->key_file, &meet, o->timeout, &par->launch,
                           &par->grid, err, sizeof(err));
    if (rc != 0) die(rc, err);
    Launch *L = &par->launch;
    par->zero = o->zero;
    par->sp = o->sp;
    par->fault = *fault;
    par->pipe = pipe_layout((PipeSchedule)o->pipe_schedule, par->grid.pp, 1, o->pipe_chunks);
    grid_groups(&par->grid, &par->world, &par->dp, &par->tp, &par->pp);
    // the tied-embedding group: the stages of my pipeline that hold the
    // model's first part and its last; one rank where they are the same
    // stage (zbv's stage 0, and one stage)
    Group *t = &par->tied;
    int first, last, chunk;
    pipeline_place(&par->pipe, 0, &first, &chunk);
    pipeline_place(&par->pipe, par->pipe.pp * par->pipe.V - 1, &last, &chunk);
    t->size = first != last ? 2 : 1;
    t->ranks[0] = par->pp.ranks[first];
    t->ranks[1] = par->pp.ranks[last];
    t->me = par->grid.pp_rank == first ? 0 : 1;
    int world = par->grid.world;
    if (world > 1) {
#ifdef _OPENMP
        // the ranks share this box's cores
        if (o->threads == 0) {
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            omp_set_num_threads(cores / world > 1 ? (int)(cores / world) : 1);
        }
#endif
        secure_harden_process();
        if (comm_init(&par->comm, &par->grid, L->key, L->rendezvous, o->timeout, fault, err, sizeof(err)) != 0)
            die(1, err);
        comm_set_check(par->comm, o->check_collectives);
    }
}

// the ranks all-gather their start marks, so that every rank starts from
// what rank 0 does: the same checkpoint, or the file rank 0 checked
// (trainer.h's start_mark). Each rank that differs says so in one line; all
// wait for those lines, then exit 2.
static void agree_on_start(const Job *job, const Parallel *par) {
    enum { W = START_MARK_WORDS };
    int world = par->grid.world, rank = par->grid.rank;
    if (world == 1) return;
    enum { F = START_MARK_FLOATS * W };
    uint64_t *marks = (uint64_t *)xcalloc((size_t)world * W, sizeof(uint64_t), "the ranks' start marks");
    float *sent = (float *)xcalloc((size_t)world * F, sizeof(float), "the ranks' start marks");
    start_mark(job, marks + rank * W);
    start_marks_to_floats(marks + rank * W, W, sent + rank * F);
    comm_allgather(par->comm, &par->world, sent + rank * F, sent, F);
    start_marks_from_floats(sent, (size_t)world * W, marks);
    int refused = start_marks_refused(job, marks, world, rank);
    free(sent);
    free(marks);
    if (!refused) return;
    comm_barrier(par->comm, &par->world);
    exit(2);
}

// at the end of a job of several ranks: one table, printed by rank 0, of
// the payload bytes each rank sent by collective and by point-to-point
// channel, and its peak transient bytes (ZeRO's buckets and gathered
// units), with the columns that are 0 on every rank left out. The counts
// travel as floats, each in three 22-bit pieces, exact. Then rank 0's time
// in the checked collectives per step of the `steps` trained.
#define BYTES_PIECE 4194304.0  // 2^22
static void print_rank_bytes(const GPT2 *m, const Parallel *par, int steps) {
    enum { NCOL = COMM_NCOUNTERS + 1 };  // the counters, then the peak transient bytes
    int world = par->grid.world;
    uint64_t mine[NCOL];
    comm_get_bytes(par->comm, mine);
    mine[COMM_NCOUNTERS] = m->bytes_transient_peak;
    float pieces[3 * NCOL];
    for (int k = 0; k < NCOL; k++) {
        uint64_t v = mine[k];
        for (int j = 0; j < 3; j++, v /= (uint64_t)BYTES_PIECE) pieces[3 * k + j] = (float)(v % (uint64_t)BYTES_PIECE);
    }
    float *all = (float *)xcalloc((size_t)world * 3 * NCOL, sizeof(float), "byte counts");
    comm_allgather(par->comm, &par->world, pieces, all, 3 * NCOL);
    if (par->grid.rank == 0) {
        uint64_t *v = (uint64_t *)xcalloc((size_t)world * NCOL, sizeof(uint64_t), "byte counts");
        int show[NCOL], width[NCOL];
        for (int k = 0; k < NCOL; k++) {
            const char *name = k < COMM_NCOUNTERS ? comm_counter_name(k) : "peak transient";
            show[k] = 0;
            width[k] = (int)strlen(name);
            for (int r = 0; r < world; r++) {
                const float *p = all + ((size_t)r * NCOL + k) * 3;
                uint64_t x = (uint64_t)p[0] + (uint64_t)p[1] * (uint64_t)BYTES_PIECE +
                             (uint64_t)p[2] * (uint64_t)BYTES_PIECE * (uint64_t)BYTES_PIECE;
                v[(size_t)r * NCOL + k] = x;
                char digits[32];
                int len = snprintf(digits, sizeof(digits), "%" PRIu64, x);
                if (x != 0) show[k] = 1;
                if (len > width[k]) width[k] = len;
            }
        }
        printf("bytes sent by each rank (collectives, then point-to-point by channel; peak transient: ZeRO buckets "
               "and gathered units held at once):\n%4s", "rank");
        for (int k = 0; k < NCOL; k++)
            if (show[k]) printf("  %*s", width[k], k < COMM_NCOUNTERS ? comm_counter_name(k) : "peak transient");
        printf("\n");
        for (int r = 0; r < world; r++) {
            printf("%4d", r);
            for (int k = 0; k < NCOL; k++)
                if (show[k]) printf("  %*" PRIu64, width[k], v[(size_t)r * NCOL + k]);
            printf("\n");
        }
        fflush(stdout);
        free(v);
    }
    free(all);
    if (par->grid.rank == 0) print_host_collective_times(par->comm, steps);
}

// at the end of a job: each rank's peak resident memory (getrusage's
// ru_maxrss, Linux's VmHWM), printed by rank 0, and beside it what the
// activations come to on each rank: predicted, what a step maps of the sets
// the plan holds at once (gpt2_activation_bytes' resident; the layout
// lines' figures are what is allocated), and measured, the peak less what
// was resident before the activations were allocated (the process, its
// model and optimizer state, its communicator). What is mapped later and is
// no activation (the communicator's rings as they fill, the step's scratch)
// falls into the measured figure: dev/bench_pipeline.sh puts the two side
// by side, and doc/parallel.md has its table. Last the most sets a step held
// at once of those allocated: equal, the allocation is the plan's count.
enum { MEM_PEAK, MEM_BEFORE, MEM_PREDICTED, MEM_SETS_HELD, MEM_SETS, MEM_FLOATS };

static void print_peak_memory(const GPT2 *m, const Parallel *par) {
    struct rusage ru;
    const float mib = 1024.0f * 1024.0f;
    float mine[MEM_FLOATS];
    mine[MEM_PEAK] = getrusage(RUSAGE_SELF, &ru) == 0 ? (float)ru.ru_maxrss / 1024.0f : -1.0f;  // KiB to MiB
    mine[MEM_BEFORE] = m->rss_before_acts >= 0 ? (float)m->rss_before_acts / mib : -1.0f;
    mine[MEM_PREDICTED] = (float)gpt2_activation_bytes(m).resident / mib;
    mine[MEM_SETS_HELD] = (float)m->sets.peak;
    mine[MEM_SETS] = (float)m->nacts;
    int world = par->grid.world;
    float *all = (float *)xcalloc((size_t)world * MEM_FLOATS, sizeof(float), "peak memory");
    memcpy(all + (size_t)par->grid.rank * MEM_FLOATS, mine, sizeof(mine));
    if (par->comm) comm_allgather(par->comm, &par->world, mine, all, MEM_FLOATS);
    if (par->grid.rank == 0) {
        printf("peak resident memory per rank (MiB):");
        for (int r = 0; r < world; r++) printf(" %.1f", all[r * MEM_FLOATS + MEM_PEAK]);
        printf("\nactivation memory per rank (MiB): predicted");
        for (int r = 0; r < world; r++) printf(" %.1f", all[r * MEM_FLOATS + MEM_PREDICTED]);
        printf("; measured");
        for (int r = 0; r < world; r++) {
            const float *v = all + (size_t)r * MEM_FLOATS;
            printf(" %.1f", v[MEM_BEFORE] >= 0 && v[MEM_PEAK] >= 0 ? v[MEM_PEAK] - v[MEM_BEFORE] : -1.0f);
        }
        printf(" (the peak less");
        for (int r = 0; r < world; r++) printf(" %.1f", all[r * MEM_FLOATS + MEM_BEFORE]);
        printf(" resident before them); sets held at most");
        for (int r = 0; r < world; r++)
            printf(" %d/%d", (int)all[r * MEM_FLOATS + MEM_SETS_HELD], (int)all[r * MEM_FLOATS + MEM_SETS]);
        printf("\n");
        fflush(stdout);
    }
    free(all);
}

// From the first step on, memory freed stays in the process for the next
// allocation. ZeRO-2 and -3 allocate and free buffers of up to a unit's size
// at every unit of every step (a gathered unit, a gradient bucket); glibc
// would hand the large ones back to the kernel at each free and map fresh
// pages at the next allocation: 600,000 page faults per step at d12, ZeRO-3
// on 2 ranks. Not before the first step: the model as loaded is freed then,
// and its pages go back to the kernel.
static void keep_freed_memory(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

// -lg N, llm.c's GPU stats every N steps: taken, as llm.c's scripts give
// it, and said once to mean nothing here (train_gpt2cu prints them)
static void note_gpu_stats(const Job *job) {
    if (job->opt.gpu_stats_every > 0)
        printf("note: flag -lg %d: llm.c's GPU stats every %d steps; the CPU trainer has no GPU, so it prints none\n",
               job->opt.gpu_stats_every, job->opt.gpu_stats_every);
}

// the step of the messages that follow (their frames carry it)
static void set_step(Parallel *par, int step) {
    if (par->comm) comm_set_step(par->comm, step);
    par->step = step;
    if (par->fault.kind == FAULT_POISON && fault_fires(&par->fault, par->grid.rank, step))
        fprintf(stderr, "rank %d: fault poison: this rank's gradients x%g from step %d on\n", par->grid.rank,
                FAULT_POISON_SCALE, step);
}

// the watch report's clocks around a step: the time this rank waited for
// its peers, read from the communicator's wait clock
static void watch_begin(Parallel *par, Watch *w) { watch_step_begin(w, comm_wait_ms(par->comm)); }
static void watch_end(Parallel *par, Watch *w, double ms) { watch_step_end(w, ms, comm_wait_ms(par->comm)); }

// every rank here, so that a line printed before an exit is out
static void world_barrier(GPT2 *m, Parallel *par) {
    (void)m;
    if (par->comm) comm_barrier(par->comm, &par->world);
}

// the step's update after gpt2_step_loss, unless it is not finite or -sl or
// -sg skip it, and its norm and skip into l
static void update_unless_skipped(GPT2 *m, Job *job, OutlierGuard *g, const AdamHyper *h, LogLine *l, int rank0,
                                  int outliers) {
    l->norm = gpt2_last_norm(m);
    // -gp skip, stop: a step with outlying gradients (grads_judge) is not applied, nor counted in -sl -sg's windows
    if (outliers > 0 && job->opt.grad_policy != GP_WARN) l->skipped = "outlying gradients";
    else l->skipped = outlier_skip(job, g, l->loss, l->norm, rank0);
    if (l->skipped == NULL) gpt2_apply_update(m, h);
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
    if (gpt2_checkpoint(m, job->out_fd, job->opt.out_dir, job->opt.ckpt_keep, &st, job->ckpt_key, job->opt.encrypt >= 1) != 0)
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
    if (gpt2_write_model(m, job->out_fd, job->opt.out_dir, job->steps, job->ckpt_key, sealed, path, sizeof(path), err,
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

int main(int argc, char **argv) {
    Job job;
    char err[1024], path[1024];
    trainer_start("train_gpt2");
    // the job, checked once, by the launcher, before any rank starts
    // fp32 throughout, no fused GELU; checked collectives (-ic 1) and the
    // gradient-norm rule's gather; sequence parallelism; the host backend only
    TrainerBuild build = {"the CPU trainer", 0, 0, 1u << PS_GPIPE | 1u << PS_1F1B | 1u << PS_INTERLEAVED | 1u << PS_ZBH1 | 1u << PS_ZBV,
                          1, 1, 0};
    parse_flags(&job, argc, argv, "", &build);
#ifdef _OPENMP
    if (job.opt.threads > 0) omp_set_num_threads(job.opt.threads);
#endif
    parse_fault(&job);
    check_model(&job);
    check_batch_and_data(&job);
    checkpoint_setup(&job);

    // this rank: its place in the job, its data and log, its part of the model
    Parallel par;
    parallel_setup(&par, &job.opt, &job.fault, argc, argv);
    start_rank(&job, &par.grid);
    agree_on_start(&job, &par);
    int rank0 = par.grid.rank == 0, dp = par.grid.dp, B = job.opt.B, T = job.opt.T, accum = job.accum;
    float *params = load_params(&job, &par.grid);
    open_data(&job, &par.grid);
    open_tokenizer_and_log(&job, &par.grid);
    note_idle_checks(&job, &par.grid);
    int nops;
    PipeStep *plan = step_plan(&job, &par.grid, &nops);
    PipeLayout layout = job_pipeline(&job.opt, par.grid.pp, accum);
    GPT2 model;
    gpt2_init_rank(&model, &job.config, params, (uint64_t)job.opt.seed, B, T, &par, activation_sets(&job, &par.grid));
    gpt2_pipeline(&model, accum);
    if (pipeline_splits_backward(&layout)) gpt2_split_backward(&model);
    free(params);
    snprintf(path, sizeof(path), "%s/optim.bin", job.ck_dir);
    if (job.resuming && gpt2_load_optimizer(&model, path, job.ckpt_key, job.ck.adam_t, err, sizeof(err)) != 0)
        die_usage(err);
    double load_ms = now_ms() - job.load_t0 - job.verify_ms;
    AdamHyper hyper = {job.opt.lr, job.opt.beta1, job.opt.beta2, job.opt.eps, job.opt.weight_decay, job.opt.grad_clip};
    if (rank0) print_model_and_batch(&job, dp);
    print_layout(&model, &par, &job.opt, accum);
    if (rank0) announce_resume(&job, load_ms);
    if (rank0) note_gpu_stats(&job);
    double peak = first_fma_peak(&par);  // the job's: all its threads'
    keep_freed_memory();

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
    for (int step = job.start; step < job.steps && !stopped; step++) {
        set_step(&par, step);
        LogLine line = {step, 1, 0.0f, 0.0f, 0.0f, -1.0f, -1.0f, 0.0, 0, NULL, NULL, NULL, NULL};
        run_evaluations(&model, &par, &job, step, &line);
        if (sample_due(&job, step)) sample(&model, &job.tok, job.opt.gen_tokens, &job.sample_rng);
        if (fault_drift_due(&job, par.grid.rank, step)) drift_parameter(&model);
        if (check_due(&job, step)) consistency_check(&model, &par, step);

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
        line.ms = now_ms() - t0;
        watch_end(&par, &watch, line.ms);
        if (watch_due(&watch, step)) watch_report(&model, &par, &watch, step, &line);
        bubble_report(&model, &par, &meter, step, &line);
        if (rank0) {
            print_mfu(&job, report_step(&job, &line, &guard), peak);
            watch_print(&watch);
            grads_print(&grads);
        }
        peak = refine_fma_peak(&par, peak, step - job.start + 1, step + 1 == job.steps);
        if (nonfinite_stop(&job, &line, rank0) || grads_stop(&job, outliers)) {
            world_barrier(&model, &par);
            exit(1);
        }

        if (checkpoint_due(&job, step, stopped) && checkpoint_after(&model, &par, &job, step) != 0) return 1;
        if (stopped && rank0) printf("stopped by a signal after step %d; resume with -y 1\n", step);
    }

    if (!stopped && final_model(&model, &par, &job) != 0) return 1;
    pipe_meter_print(&meter);
    if (par.comm) print_rank_bytes(&model, &par, job.steps - job.start);
    print_peak_memory(&model, &par);
    pipe_meter_free(&meter);
    watch_free(&watch);
    grads_free(&grads);
    free_job(&job);
    comm_free(par.comm);
    gpt2_free(&model);
    free(plan);
    launch_free(&par.launch);
    return 0;
}
#endif
