/*
 * host_mode.h: the NCCL backend's host mode, for ranks that share a GPU: the
 * same calls, made through shm_comm.h's host backend, each staged through
 * pinned host memory.
 *
 * defines:
 *   host_allreduce, host_reduce_scatter, host_allgather, host_broadcast,
 *   host_sendrecv        what nccl_comm.h's calls do instead of NCCL's when
 *                        c->host is set (gpu_host_mode said so)
 *   host_reserve         the pinned staging, grown to the largest call
 *   host_print_bytes     each rank's bytes line at the end (nccl_free)
 *   and their helpers: host_pinned, host_copy, host_wait, host_type_bytes,
 *   host_floats, host_unfloat
 *
 * A part of nccl_comm.h, not a header of its own: it works on nccl_comm.h's
 * NcclComm and NcclGroup and fails through its nccl_fail and
 * nccl_check_cuda, and nccl_comm.h's calls, which come after those, hand
 * their work to it. So nccl_comm.h includes it between the two, in CUDA
 * builds only (-DLLM3D_NCCL); anything else includes nccl_comm.h.
 */
#ifndef LLM3D_HOST_MODE_H
#define LLM3D_HOST_MODE_H

#ifdef LLM3D_NCCL
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "llm3d/bf16.h"                // bf16_widen, bf16_narrow
#include "llm3d/parallel/shm_comm.h"   // the host backend: comm_allreduce, comm_sendrecv, ...

// ----------------------------------------------------------------------------
// host mode: ranks that share a GPU (NCCL refuses two ranks on one device),
// or any job run with -hb 1, talk through shm_comm.h's host backend, the
// CPU trainer's, on the same Groups. Each call is synchronous: its input is
// copied down to pinned host memory on c->stream (so behind the kernels
// that made it), the host waits for that copy, runs the host backend's call,
// copies the result up on c->stream and waits for that too, so the pinned
// buffer is free again when the call returns. No wait between ranks lives on
// the device: every one is inside the host backend, with its own timeout,
// checked frames and faults. bf16 values are widened to fp32 on the host,
// summed there in the host backend's fixed order and rounded back once (to
// nearest even); all-gathers, broadcasts and messages move bytes as they are.

#define HOST_MIN_STAGING_BYTES (1u << 20)

// host_reserve: pinned staging of at least bytes, grown (never shrunk) to the
// largest call so far; cudaSuccess or the error
static inline cudaError_t host_reserve(NcclComm *c, size_t bytes) {
    if (c->pinned != NULL && bytes <= c->pinned_bytes) return cudaSuccess;
    cudaFreeHost(c->pinned);  // no copy from it is in flight: every host-mode call waits for its own
    c->pinned = NULL;
    c->pinned_bytes = 0;
    size_t want = bytes < HOST_MIN_STAGING_BYTES ? HOST_MIN_STAGING_BYTES : bytes;
    cudaError_t e = cudaHostAlloc((void **)&c->pinned, want, cudaHostAllocDefault);
    if (e == cudaSuccess) c->pinned_bytes = want;
    else c->pinned = NULL;
    return e;
}

static inline uint8_t *host_pinned(NcclComm *c, size_t bytes) {
    nccl_check_cuda(c, host_reserve(c, bytes), "host mode's pinned staging");
    return c->pinned;
}

// host_copy: a copy between the device and the pinned staging, queued on
// c->stream; host_wait: returns once everything queued there is done
static inline void host_copy(NcclComm *c, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    nccl_check_cuda(c, cudaMemcpyAsync(dst, src, bytes, kind, c->stream), "host mode's staging copy");
}

static inline void host_wait(NcclComm *c) {
    nccl_check_cuda(c, cudaStreamSynchronize(c->stream), "host mode's wait for the GPU");
}

static inline size_t host_type_bytes(NcclComm *c, ncclDataType_t type) {
    switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: nccl_fail(c, "host mode: NCCL data type %d has no size here", (int)type);
    }
    return 0;
}

// host_floats: the n staged values at p as fp32, what the host backend sums:
// p itself for fp32, widened into c->wide for bf16
static inline float *host_floats(NcclComm *c, ncclDataType_t type, uint8_t *p, size_t n) {
    if (type == ncclFloat32) return (float *)p;
    if (type != ncclBfloat16) nccl_fail(c, "host mode sums fp32 and bf16 only, not NCCL data type %d", (int)type);
    if (c->wide == NULL || n > c->wide_floats) {
        free(c->wide);
        c->wide = (float *)malloc((n > 0 ? n : 1) * sizeof(float));
        c->wide_floats = c->wide != NULL ? n : 0;
        if (c->wide == NULL) nccl_fail(c, "host mode: out of memory for %zu floats", n);
    }
    bf16_widen((const uint16_t *)p, c->wide, n);
    return c->wide;
}

// host_unfloat: n sums back into the staged type at p (for fp32 they are there already)
static inline void host_unfloat(ncclDataType_t type, const float *sums, uint8_t *p, size_t n) {
    if (type == ncclBfloat16) bf16_narrow(sums, (uint16_t *)p, n);
}

static inline void host_allreduce(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int op) {
    size_t bytes = n * host_type_bytes(c, type);
    uint8_t *p = host_pinned(c, bytes);
    host_copy(c, p, buf, bytes, cudaMemcpyDeviceToHost);
    host_wait(c);
    float *f = host_floats(c, type, p, n);
    comm_allreduce(c->host, &g->group, f, n, op);
    host_unfloat(type, f, p, n);
    host_copy(c, buf, p, bytes, cudaMemcpyHostToDevice);
    host_wait(c);
}

// host_reduce_scatter: all of in down, reduced in place on the host (the
// host backend's rule: my chunk's sum lands over my chunk), my chunk up
static inline void host_reduce_scatter(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                       ncclDataType_t type, int op) {
    size_t es = host_type_bytes(c, type), all = n_per_rank * (size_t)g->group.size;
    size_t mine = n_per_rank * (size_t)g->group.me;
    uint8_t *p = host_pinned(c, all * es);
    host_copy(c, p, in, all * es, cudaMemcpyDeviceToHost);
    host_wait(c);
    float *f = host_floats(c, type, p, all);
    comm_reduce_scatter(c->host, &g->group, f, f + mine, n_per_rank, op);
    host_unfloat(type, f + mine, p + mine * es, n_per_rank);
    host_copy(c, out, p + mine * es, n_per_rank * es, cudaMemcpyHostToDevice);
    host_wait(c);
}

// host_allgather: the host backend gathers whole floats, so each member's
// piece sits in the staging at a stride rounded up to 4 bytes
static inline void host_allgather(NcclComm *c, const NcclGroup *g, const void *in, void *out, size_t n_per_rank,
                                  ncclDataType_t type) {
    size_t piece = n_per_rank * host_type_bytes(c, type), stride = (piece + 3) / 4 * 4;
    int size = g->group.size, me = g->group.me;
    uint8_t *p = host_pinned(c, stride * (size_t)size);
    host_copy(c, p + (size_t)me * stride, in, piece, cudaMemcpyDeviceToHost);
    host_wait(c);
    comm_allgather(c->host, &g->group, (const float *)(p + (size_t)me * stride), (float *)p, stride / 4);
    if (stride == piece) host_copy(c, out, p, piece * (size_t)size, cudaMemcpyHostToDevice);
    else for (int k = 0; k < size; k++)
        host_copy(c, (uint8_t *)out + (size_t)k * piece, p + (size_t)k * stride, piece, cudaMemcpyHostToDevice);
    host_wait(c);
}

static inline void host_broadcast(NcclComm *c, const NcclGroup *g, void *buf, size_t n, ncclDataType_t type, int root) {
    size_t bytes = n * host_type_bytes(c, type);
    uint8_t *p = host_pinned(c, bytes);
    int from_me = g->group.me == root;
    if (from_me) {
        host_copy(c, p, buf, bytes, cudaMemcpyDeviceToHost);
        host_wait(c);
    }
    comm_broadcast(c->host, &g->group, p, bytes, root);
    if (!from_me) {
        host_copy(c, buf, p, bytes, cudaMemcpyHostToDevice);
        host_wait(c);
    }
}

// host_sendrecv: the payload to send, then the one received, side by side in
// the staging; the host backend seals, numbers and checks every frame
static inline void host_sendrecv(NcclComm *c, int dst_rank, int send_channel, int send_mb, const void *sendbuf,
                                 size_t send_bytes, int src_rank, int recv_channel, int recv_mb, void *recvbuf,
                                 size_t recv_bytes) {
    size_t out_bytes = dst_rank >= 0 ? send_bytes : 0, in_bytes = src_rank >= 0 ? recv_bytes : 0;
    uint8_t *out = host_pinned(c, out_bytes + in_bytes), *in = out + out_bytes;
    if (dst_rank >= 0) {
        host_copy(c, out, sendbuf, send_bytes, cudaMemcpyDeviceToHost);
        host_wait(c);
    }
    if (dst_rank >= 0 && src_rank >= 0)
        comm_sendrecv(c->host, dst_rank, send_channel, send_mb, out, send_bytes, src_rank, recv_channel, recv_mb, in,
                      recv_bytes);
    else if (dst_rank >= 0)
        comm_send(c->host, dst_rank, send_channel, send_mb, out, send_bytes);
    else
        comm_recv(c->host, src_rank, recv_channel, recv_mb, in, recv_bytes);
    if (src_rank >= 0) {
        host_copy(c, recvbuf, in, recv_bytes, cudaMemcpyHostToDevice);
        host_wait(c);
    }
}

// host_print_bytes: each rank's line of bytes sent (comm_print_bytes), in
// rank order, as train_gpt2.c prints them at the end of a job
static inline void host_print_bytes(NcclComm *c) {
    for (int r = 0; r < c->world.group.size; r++) {
        if (r == c->rank) {
            comm_print_bytes(c->host, stdout);
            fflush(stdout);
        }
        comm_barrier(c->host, &c->world.group);
    }
}
#endif  // LLM3D_NCCL

#endif
