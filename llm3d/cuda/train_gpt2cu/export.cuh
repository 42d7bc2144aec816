/*
 * llm3d/cuda/train_gpt2cu/export.cuh: the GPU model brought to the host in
 * the file's layout, for the tests, the checkpoints and the final model.
 *
 * defines:
 *   Downloaded      host buffers holding one unit's part at a time: its fp32
 *                   master weights and, when asked, AdamW m and v
 *                   (download_unit, downloaded_init, downloaded_free)
 *   gpt2_export     one rank's whole model, or its gradients, as one host
 *                   array in the file's layout
 *   gpt2_save       a v3 model file of one rank's master weights
 *   gpt2_write_share, write_part, gpt2_load_optimizer
 *                   a rank's part of a checkpoint's model.bin and optim.bin,
 *                   written and read back (checkpoint.h's files)
 *
 * A part of train_gpt2.cu, not a header of its own: it uses that file's
 * GPT2, master_at, adam_at, grad_at, unit_lo, unit_chunk, largest_unit,
 * gpu_sync and host_alloc.
 */
#ifndef LLM3D_GPU_EXPORT_CUH
#define LLM3D_GPU_EXPORT_CUH

#include <stdlib.h>
#include <string.h>

#include "llm3d/checkpoint.h"  // CkptOut, ckpt_out_*, OptimFile, ckpt_optim_*
#include "llm3d/gpt2.h"        // for_each_owned, OwnedRun, model_save, unit_fill

// ----------------------------------------------------------------------------
// the model in the file's layout: gpt2.h's for_each_owned says which elements
// of the whole model this rank owns and where they go, unit by unit, as for
// train_gpt2.c. A unit's part comes to the host once (Downloaded), then its
// runs are copied out.

typedef struct {
    GPT2 *m;
    int u;                   // the unit held in the buffers below (-1: none)
    size_t lo;               // unit element of buf[0]
    float *master, *am, *av; // host fp32: the unit's master weights and AdamW m, v from element lo
    floatX *raw;             // host scratch for floatX arrays
    size_t cap;
} Downloaded;

static void download_floatx(GPT2 *m, float *dst, const floatX *src, floatX *raw, size_t n) {
    gpu_sync(m, "a download");
    CUDA_CHECK(cudaMemcpy(raw, src, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) dst[i] = floatx_to_host_float(raw[i]);
}

// brings unit u's [lo, hi) to the host: the master weights, and with_adam m and v
static void download_unit(Downloaded *d, int u, size_t lo, size_t hi, int with_adam) {
    GPT2 *m = d->m;
    size_t n = hi - lo;
    d->u = u;
    d->lo = lo;
    gpu_sync(m, "a download");
    CUDA_CHECK(cudaMemcpy(d->master, master_at(m, u, lo), n * sizeof(float), cudaMemcpyDeviceToHost));
    if (!with_adam) return;
    CUDA_CHECK(cudaMemcpy(d->am, adam_at(m, m->m, u, lo), n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(d->av, adam_at(m, m->v, u, lo), n * sizeof(float), cudaMemcpyDeviceToHost));
}

static void downloaded_init(Downloaded *d, GPT2 *m) {
    memset(d, 0, sizeof(*d));
    d->m = m;
    d->u = -1;
    d->cap = largest_unit(m);
    d->master = (float *)host_alloc(d->cap * sizeof(float), "unit");
    d->am = (float *)host_alloc(d->cap * sizeof(float), "unit");
    d->av = (float *)host_alloc(d->cap * sizeof(float), "unit");
    d->raw = (floatX *)host_alloc(d->cap * sizeof(floatX), "unit");
}

static void downloaded_free(Downloaded *d) { free(d->master); free(d->am); free(d->av); free(d->raw); }

// the fp32 master weights (grads = 0) or the gradients (grads = 1) of this
// rank's units in the file layout, into full (num_params floats, zeroed by
// the caller): one rank's whole model; for several, each adds what it owns
typedef struct { Downloaded d; float *full; int grads; } ExportCtx;

static void export_run(const OwnedRun *r, void *ctx) {
    ExportCtx *e = (ExportCtx *)ctx;
    GPT2 *m = e->d.m;
    if (e->d.u != r->u) {
        size_t n = m->ut.units[r->u].padded;
        if (e->grads) {
            if (m->zero >= 2) {  // only my shard is kept; one rank: the whole unit
                download_floatx(m, e->d.master, grad_at(m, r->u, unit_lo(m, r->u)), e->d.raw, unit_chunk(m, r->u));
            } else {
                download_floatx(m, e->d.master, m->grads + m->ut.units[r->u].offset, e->d.raw, n);
            }
            e->d.u = r->u;
            e->d.lo = m->zero >= 2 ? unit_lo(m, r->u) : 0;
        } else {
            size_t lo = m->master_sharded ? unit_lo(m, r->u) : 0;
            download_unit(&e->d, r->u, lo, m->master_sharded ? lo + unit_chunk(m, r->u) : n, 0);
        }
    }
    memcpy(e->full + r->g, e->d.master + (r->j - e->d.lo), r->n * sizeof(float));
}

// one rank's whole model (or gradients) in the file layout, fresh host array
static float *gpt2_export(GPT2 *m, int grads) {
    ExportCtx e;
    downloaded_init(&e.d, m);
    e.full = (float *)host_alloc(m->num_params * sizeof(float), "model");
    e.grads = grads;
    for_each_owned(&m->config, &m->shard, &m->ut, m->master_sharded || (grads && m->zero >= 2), export_run, &e);
    downloaded_free(&e.d);
    return e.full;
}

// writes a v3 model file of the master weights (one rank)
[[maybe_unused]] static int gpt2_save(GPT2 *m, const char *path, char *err, size_t errlen) {
    float *h = gpt2_export(m, 0);
    int rc = model_save(path, &m->config, h, 0, err, errlen);
    free(h);
    return rc;
}

// ----------------------------------------------------------------------------
// checkpoints: the files of train_gpt2.c (checkpoint.h has them, the seal,
// the search and the pruning). Every rank writes the elements it owns
// (for_each_owned by dp: of every unit its dp shard) straight into the whole
// tensors of model.bin and optim.bin, so the files do not depend on the
// layout, and any layout of either trainer reads them. The master weights
// and AdamW state of a rank's shard are current under every ZeRO stage.

typedef struct { Downloaded d; CkptOut *model, *optim; int error, with_adam; size_t N; } SaveCtx;

static void save_run(const OwnedRun *r, void *ctx) {
    SaveCtx *sc = (SaveCtx *)ctx;
    GPT2 *m = sc->d.m;
    if (sc->error != 0) return;
    if (sc->d.u != r->u) {
        size_t lo = unit_lo(m, r->u);
        download_unit(&sc->d, r->u, lo, lo + unit_chunk(m, r->u), sc->with_adam);
    }
    size_t at = HEADER_INTS * 4 + r->g * sizeof(float), bytes = r->n * sizeof(float), k = r->j - sc->d.lo;
    if (ckpt_out_pwrite(sc->model, sc->d.master + k, bytes, at) != 0 ||
        (sc->with_adam && (ckpt_out_pwrite(sc->optim, sc->d.am + k, bytes, at) != 0 ||
                           ckpt_out_pwrite(sc->optim, sc->d.av + k, bytes, at + sc->N * sizeof(float)) != 0)))
        sc->error = errno;
}

// this rank's part of model.bin and (optim not NULL) optim.bin, both open
// for writing at their full size; 0, or the errno of the failed write
static int gpt2_write_share(GPT2 *m, CkptOut *model, CkptOut *optim) {
    SaveCtx sc;
    downloaded_init(&sc.d, m);
    sc.model = model;
    sc.optim = optim;
    sc.error = 0;
    sc.with_adam = optim != NULL;
    sc.N = m->num_params;
    for_each_owned(&m->config, &m->shard, &m->ut, 1, save_run, &sc);
    downloaded_free(&sc.d);
    return sc.error;
}

// writes this rank's part of the model file model_name (and, unless
// optim_name is NULL, of optim.bin), both in -o (dfd), files that rank 0
// made at full size (sealed ones under cipher, their GHASH shares into
// shares[0] and shares[1]), and fsyncs them; 0, or an errno
static int write_part(GPT2 *m, int dfd, const char *model_name, const char *optim_name, const AeadFileKey *cipher,
                      CkptShare *shares) {
    CkptOut model, adam;
    int e = ckpt_out_open_at(&model, dfd, model_name, cipher, shares != NULL ? &shares[0] : NULL);
    memset(&adam, 0, sizeof(adam));
    adam.fd = -1;
    if (optim_name != NULL) {
        int e_optim = ckpt_out_open_at(&adam, dfd, optim_name, cipher, shares != NULL ? &shares[1] : NULL);
        if (e == 0) e = e_optim;
    }
    if (e == 0) e = gpt2_write_share(m, &model, optim_name != NULL ? &adam : NULL);
    int closed = ckpt_out_close(&model, e == 0);
    if (e == 0) e = closed;
    closed = ckpt_out_close(&adam, e == 0);
    if (e == 0) e = closed;
    return e;
}

// AdamW's m and v for this rank's part from a checkpoint's optim.bin, and
// Adam's t; the parameters come in through gpt2_init_rank from its
// model.bin. ckpt_find verified the bytes; the header must also agree with
// the model and with state.bin's t.
static int gpt2_load_optimizer(GPT2 *m, const char *path, const uint8_t key[32], int adam_t, char *err, size_t errlen) {
    OptimFile f;
    if (ckpt_optim_open(&f, path, key, &m->config, &m->shard, &m->ut, m->zero >= 1, adam_t, err, errlen) != 0) return -1;
    float *buf = (float *)host_alloc(largest_unit(m) * sizeof(float), "unit");
    for (int u = 0; u < m->ut.n; u++) {
        const Unit *un = &m->ut.units[u];
        size_t lo = m->zero >= 1 ? unit_lo(m, u) : 0, n = m->zero >= 1 ? unit_chunk(m, u) : un->padded;
        for (int k = 0; k < 2; k++) {
            memset(buf, 0, un->padded * sizeof(float));
            unit_fill(&m->config, &m->shard, un, buf, k == 0 ? f.m : f.v, 0);
            CUDA_CHECK(cudaMemcpy(adam_at(m, k == 0 ? m->m : m->v, u, lo), buf + lo, n * sizeof(float),
                                  cudaMemcpyHostToDevice));
        }
    }
    free(buf);
    ckpt_optim_close(&f);
    m->adam_t = adam_t;
    return 0;
}

#endif  // LLM3D_GPU_EXPORT_CUH
