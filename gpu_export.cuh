/*
 * gpu_export.cuh: the GPU model brought to the host in the file's layout,
 * for the tests, the checkpoints and the final model.
 *
 * defines:
 *   Downloaded      host buffers holding one unit's part at a time: its fp32
 *                   master weights and, when asked, AdamW m and v
 *                   (download_unit, downloaded_init, downloaded_free)
 *   gpt2_export     one rank's whole model, or its gradients, as one host
 *                   array in the file's layout
 *   gpt2_save       a v3 model file of one rank's master weights
 *
 * A part of train_gpt2.cu, not a header of its own: train_gpt2.cu includes
 * it before its checkpoints, which use Downloaded; it uses that file's
 * GPT2, master_at, adam_at, grad_at, unit_lo, unit_chunk, gpu_sync and
 * host_alloc.
 */
#ifndef LLM3D_GPU_EXPORT_CUH
#define LLM3D_GPU_EXPORT_CUH

#include <stdlib.h>
#include <string.h>

#include "gpt2.h"  // for_each_owned, OwnedRun, model_save

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

#endif  // LLM3D_GPU_EXPORT_CUH
