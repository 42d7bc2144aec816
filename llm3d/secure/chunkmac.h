/*
 * chunkmac.h: the chunked MAC, the tag of a large payload made from tags of
 * its fixed-size chunks, so that a GPU computes it in parallel.
 *
 * defines:
 *   chunkmac_tag, chunkmac_verify   the construction on the CPU, for any caller
 *   ChunkMacParams                  what the kernels need, from a keyed HMAC
 *   chunkmac_gpu_params, chunkmac_gpu_launch
 *                                   the kernels, under __CUDACC__ only
 *
 * nccl_comm.h tags pipeline messages with it; doc/security.md ("Chunked MAC")
 * has the argument that it is as strong as HMAC over the whole message.
 * Errors follow errors.h.
 */
#ifndef LLM3D_CHUNKMAC_H
#define LLM3D_CHUNKMAC_H

#include "secure.h"  // first: it asks for _GNU_SOURCE; Sha256, Hmac, SHA256_K_LIST, put_u64, tag_equal

#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "llm3d/errors.h"

#ifdef __CUDACC__
#include <cuda_runtime.h>
#endif

// ----------------------------------------------------------------------------
// Chunked MAC: the tag of a large payload made from tags of its fixed-size
// chunks, so a GPU can hash the chunks in parallel (SHA-256 itself is a chain:
// one message is one thread's work). doc/security.md has the argument that it
// is as strong as HMAC over the whole message. With n = ceil(len / chunk_bytes)
// (0 for an empty payload):
//
//   tag_i = HMAC(key, chunk_block(i) || header || chunk_i)          i = 0..n-1
//   tag   = HMAC(key, final_block || header || tag_0 || ... || tag_{n-1})
//
// chunk_block(i): "llm3d chunk tag\0" | i | n | len | chunk_bytes | 16 zero bytes
// final_block:    "llm3d final tag\0" | n | len | chunk_bytes | 24 zero bytes
// (64 bytes each, numbers u64 little-endian); header is the 64-byte frame
// header. The prefixes are whole SHA-256 blocks, so every chunk starts on a
// block boundary and the GPU hashes it straight from memory. The labels keep
// the three kinds of HMAC input (plain frames start with the frame magic)
// apart, so one key serves them all.

#define CHUNKMAC_CHUNK_BYTES (64u << 10)      // the default; measured in dev/cuda/mac.cu
#define CHUNKMAC_MAX_CHUNK_BYTES (16u << 20)
#define CHUNKMAC_CHUNK_LABEL "llm3d chunk tag"  // 15 characters and the NUL: 16 bytes
#define CHUNKMAC_FINAL_LABEL "llm3d final tag"

// a chunk is whole SHA-256 blocks (only the last one of a payload is short)
static inline int chunkmac_check_chunk_bytes(uint64_t chunk_bytes, char *err, size_t errlen) {
    if (chunk_bytes < 64 || chunk_bytes > CHUNKMAC_MAX_CHUNK_BYTES || chunk_bytes % 64 != 0)
        return errorf(err, errlen, "chunked MAC: chunk_bytes %" PRIu64 " is not a multiple of 64 in 64..%u",
                      chunk_bytes, CHUNKMAC_MAX_CHUNK_BYTES);
    return 0;
}

static inline uint64_t chunkmac_count(uint64_t len, uint64_t chunk_bytes) {
    return len / chunk_bytes + (len % chunk_bytes != 0);
}

static inline void chunkmac_chunk_block(uint8_t out[64], uint64_t i, uint64_t len, uint64_t chunk_bytes) {
    memset(out, 0, 64);
    memcpy(out, CHUNKMAC_CHUNK_LABEL, 16);
    put_u64(out + 16, i);
    put_u64(out + 24, chunkmac_count(len, chunk_bytes));
    put_u64(out + 32, len);
    put_u64(out + 40, chunk_bytes);
}

static inline void chunkmac_final_block(uint8_t out[64], uint64_t len, uint64_t chunk_bytes) {
    memset(out, 0, 64);
    memcpy(out, CHUNKMAC_FINAL_LABEL, 16);
    put_u64(out + 16, chunkmac_count(len, chunk_bytes));
    put_u64(out + 24, len);
    put_u64(out + 32, chunk_bytes);
}

// chunkmac_chunk_tag: tag_i alone. keyed is hmac_init(key) done once: each
// chunk starts from a copy of it, so the key pads are hashed once per key.
static inline void chunkmac_chunk_tag(const Hmac *keyed, const uint8_t header[64], const void *payload, uint64_t len,
                                      uint64_t chunk_bytes, uint64_t i, uint8_t out[32]) {
    uint8_t block[64];
    chunkmac_chunk_block(block, i, len, chunk_bytes);
    uint64_t start = i * chunk_bytes;
    uint64_t n = len - start < chunk_bytes ? len - start : chunk_bytes;
    Hmac h = *keyed;
    hmac_update(&h, block, 64);
    hmac_update(&h, header, 64);
    hmac_update(&h, (const uint8_t *)payload + start, (size_t)n);
    hmac_final(&h, out);
}

// chunkmac_tag: the message tag; 0, or -1 with err set for a bad chunk_bytes.
// The CPU streams the chunk tags into the final HMAC instead of storing them.
static inline int chunkmac_tag(const Hmac *keyed, const uint8_t header[64], const void *payload, uint64_t len,
                               uint64_t chunk_bytes, uint8_t out[32], char *err, size_t errlen) {
    if (chunkmac_check_chunk_bytes(chunk_bytes, err, errlen) != 0) return -1;
    uint8_t block[64], chunk_tag[32];
    chunkmac_final_block(block, len, chunk_bytes);
    Hmac whole = *keyed;
    hmac_update(&whole, block, 64);
    hmac_update(&whole, header, 64);
    uint64_t n = chunkmac_count(len, chunk_bytes);
    for (uint64_t i = 0; i < n; i++) {
        chunkmac_chunk_tag(keyed, header, payload, len, chunk_bytes, i, chunk_tag);
        hmac_update(&whole, chunk_tag, 32);
    }
    hmac_final(&whole, out);
    secure_wipe(chunk_tag, sizeof(chunk_tag));
    return 0;
}

// chunkmac_verify: 0 if tag is the payload's, -1 with err set otherwise
static inline int chunkmac_verify(const Hmac *keyed, const uint8_t header[64], const void *payload, uint64_t len,
                                  uint64_t chunk_bytes, const uint8_t tag[32], char *err, size_t errlen) {
    uint8_t want[32];
    if (chunkmac_tag(keyed, header, payload, len, chunk_bytes, want, err, errlen) != 0) return -1;
    int ok = tag_equal(want, 32, tag, 32);
    secure_wipe(want, sizeof(want));
    if (!ok)
        return errorf(err, errlen, "chunked MAC: tag does not match the %" PRIu64 "-byte payload (%" PRIu64
                      "-byte chunks)", len, chunk_bytes);
    return 0;
}

#ifdef __CUDACC__
// ----------------------------------------------------------------------------
// The chunked MAC on the GPU: one thread hashes one chunk, then one thread
// hashes the chunk tags (both are chains of SHA-256 blocks). The work of one
// thread is __host__ __device__, so dev/cuda/mac.cu also runs it on the CPU
// against chunkmac_tag where there is no GPU. Use:
//   sender:   chunkmac_gpu_params(&p, &keyed, header, len, CHUNKMAC_CHUNK_BYTES, ...)
//             chunkmac_gpu_launch(&p, payload, scratch, tag_out, NULL, NULL, stream, ...)
//   receiver: chunkmac_gpu_launch(&p, payload, scratch, NULL, received_tag, step_mismatch, stream, ...)
//             and before the optimizer update, one copy of step_mismatch to the host: any 1 aborts the step.
// (nccl_comm.h launches the two kernels itself, with an event between them,
// and compares the tags on the host at the step's end.)
// scratch holds 32 bytes per chunk (chunkmac_count); every pointer is device memory.

static __constant__ uint32_t chunkmac_k_gpu[64] = {SHA256_K_LIST};

typedef struct {
    uint32_t inner[8], outer[8];  // SHA-256 states after the key's ipad and opad blocks (key-equivalent)
    uint32_t chunk_block[16];     // chunk_block(0) as big-endian words; each thread puts its i in words 4-5
    uint32_t final_block[16];
    uint32_t header[16];
    uint64_t len, chunk_bytes, n_chunks;
} ChunkMacParams;

#define CHUNKMAC_THREADS 64  // per block: few chunks then still spread over many SMs

static __host__ __device__ inline uint32_t chunkmac_rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static __host__ __device__ inline uint32_t chunkmac_bswap(uint32_t x) {
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

static __host__ __device__ inline uint32_t chunkmac_k(int t) {
#ifdef __CUDA_ARCH__
    return chunkmac_k_gpu[t];
#else
    return sha256_k[t];
#endif
}

// one SHA-256 compression; w is the block as big-endian words and is used up
// as the schedule (a rolling window of 16 keeps it in registers)
static __host__ __device__ inline void chunkmac_compress(uint32_t h[8], uint32_t w[16]) {
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
#pragma unroll
    for (int t = 0; t < 64; t++) {
        if (t >= 16) {
            uint32_t w15 = w[(t - 15) & 15], w2 = w[(t - 2) & 15];
            uint32_t s0 = chunkmac_rotr(w15, 7) ^ chunkmac_rotr(w15, 18) ^ (w15 >> 3);
            uint32_t s1 = chunkmac_rotr(w2, 17) ^ chunkmac_rotr(w2, 19) ^ (w2 >> 10);
            w[t & 15] += s0 + w[(t - 7) & 15] + s1;
        }
        uint32_t sum1 = chunkmac_rotr(e, 6) ^ chunkmac_rotr(e, 11) ^ chunkmac_rotr(e, 25);
        uint32_t t1 = hh + sum1 + ((e & f) ^ (~e & g)) + chunkmac_k(t) + w[t & 15];
        uint32_t sum0 = chunkmac_rotr(a, 2) ^ chunkmac_rotr(a, 13) ^ chunkmac_rotr(a, 22);
        uint32_t t2 = sum0 + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1;
        d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

// 64 bytes at p as big-endian words: four 16-byte loads on the GPU when p is
// aligned (payloads from cudaMalloc are; an offset into one may not be)
static __host__ __device__ inline void chunkmac_load(uint32_t w[16], const uint8_t *p, int aligned) {
#ifdef __CUDA_ARCH__
    if (aligned) {
        const uint4 *v = (const uint4 *)p;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint4 x = __ldg(v + q);
            w[4 * q] = chunkmac_bswap(x.x);
            w[4 * q + 1] = chunkmac_bswap(x.y);
            w[4 * q + 2] = chunkmac_bswap(x.z);
            w[4 * q + 3] = chunkmac_bswap(x.w);
        }
        return;
    }
#endif
    (void)aligned;
#pragma unroll
    for (int j = 0; j < 16; j++)
        w[j] = (uint32_t)p[4 * j] << 24 | (uint32_t)p[4 * j + 1] << 16 | (uint32_t)p[4 * j + 2] << 8 | p[4 * j + 3];
}

// the message's last rem (< 64) bytes at p, then SHA-256's padding for a
// message of total_bytes bytes (the key pad block included)
static __host__ __device__ inline void chunkmac_tail(uint32_t h[8], const uint8_t *p, int rem, uint64_t total_bytes) {
    uint32_t w[16];
#pragma unroll
    for (int j = 0; j < 16; j++) {  // unrolled, so w stays in registers
        uint32_t word = 0;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int k = 4 * j + b;
            uint32_t byte = k < rem ? p[k] : k == rem ? 0x80u : 0u;
            word |= byte << (24 - 8 * b);
        }
        w[j] = word;
    }
    if (rem >= 56) {  // no room for the length: it goes in one more block
        chunkmac_compress(h, w);
#pragma unroll
        for (int j = 0; j < 16; j++) w[j] = 0;
    }
    uint64_t bits = total_bytes * 8;
    w[14] = (uint32_t)(bits >> 32);
    w[15] = (uint32_t)bits;
    chunkmac_compress(h, w);
}

// HMAC's outer hash: the opad state, then the inner digest and its padding (one block)
static __host__ __device__ inline void chunkmac_outer(uint8_t tag[32], const uint32_t outer[8], const uint32_t inner_digest[8]) {
    uint32_t h[8], w[16];
    for (int j = 0; j < 8; j++) h[j] = outer[j], w[j] = inner_digest[j];
    w[8] = 0x80000000u;
    for (int j = 9; j < 15; j++) w[j] = 0;
    w[15] = (64 + 32) * 8;
    chunkmac_compress(h, w);
    for (int j = 0; j < 32; j++) tag[j] = (uint8_t)(h[j / 4] >> (24 - 8 * (j % 4)));
}

// HMAC over prefix_block || header || the bytes at p: the shape of both tags
static __host__ __device__ inline void chunkmac_hmac(uint8_t tag[32], const ChunkMacParams *prm, const uint32_t prefix[16],
                                                    const uint8_t *p, uint64_t n) {
    uint32_t h[8], w[16];
    for (int j = 0; j < 8; j++) h[j] = prm->inner[j];
    for (int j = 0; j < 16; j++) w[j] = prefix[j];
    chunkmac_compress(h, w);
    for (int j = 0; j < 16; j++) w[j] = prm->header[j];
    chunkmac_compress(h, w);
    int aligned = ((uintptr_t)p & 15) == 0;
    uint64_t full = n / 64;
    for (uint64_t b = 0; b < full; b++) {
        chunkmac_load(w, p + 64 * b, aligned);
        chunkmac_compress(h, w);
    }
    chunkmac_tail(h, p + 64 * full, (int)(n % 64), 64 + 128 + n);
    chunkmac_outer(tag, prm->outer, h);
}

// tag_i: chunk i of the payload
static __host__ __device__ inline void chunkmac_chunk_one(const ChunkMacParams *prm, const uint8_t *payload, uint64_t i,
                                                         uint8_t tag[32]) {
    uint32_t prefix[16];
    for (int j = 0; j < 16; j++) prefix[j] = prm->chunk_block[j];
    prefix[4] = chunkmac_bswap((uint32_t)i);  // bytes 16..23 of chunk_block(i): i, little-endian
    prefix[5] = chunkmac_bswap((uint32_t)(i >> 32));
    uint64_t start = i * prm->chunk_bytes;
    uint64_t n = prm->len - start < prm->chunk_bytes ? prm->len - start : prm->chunk_bytes;
    chunkmac_hmac(tag, prm, prefix, payload + start, n);
}

static __global__ void chunkmac_chunks_kernel(ChunkMacParams prm, const uint8_t *payload, uint8_t *chunk_tags) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < prm.n_chunks) chunkmac_chunk_one(&prm, payload, i, chunk_tags + 32 * i);
}

// the message tag from the chunk tags: one thread. It writes the tag to
// tag_out, and/or compares it with expected (every byte, whatever differs)
// and sets *mismatch to 1 if they differ; *mismatch is never cleared here, so
// one flag can collect every message of a step.
static __global__ void chunkmac_final_kernel(ChunkMacParams prm, const uint8_t *chunk_tags, uint8_t *tag_out,
                                             const uint8_t *expected, int *mismatch) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    uint8_t tag[32];
    chunkmac_hmac(tag, &prm, prm.final_block, chunk_tags, 32 * prm.n_chunks);
    if (tag_out != NULL)
        for (int j = 0; j < 32; j++) tag_out[j] = tag[j];
    if (expected != NULL) {
        uint32_t diff = 0;
        for (int j = 0; j < 32; j++) diff |= (uint32_t)(tag[j] ^ expected[j]);
        if (diff != 0) *mismatch = 1;
    }
}

static inline void chunkmac_words(uint32_t w[16], const uint8_t block[64]) {
    for (int j = 0; j < 16; j++)
        w[j] = (uint32_t)block[4 * j] << 24 | (uint32_t)block[4 * j + 1] << 16 | (uint32_t)block[4 * j + 2] << 8 | block[4 * j + 3];
}

// chunkmac_gpu_params: what the kernels need for one message. keyed must be
// fresh from hmac_init. p then holds key-equivalent states: secure_wipe it
// when done (the kernels take a copy at launch).
static inline int chunkmac_gpu_params(ChunkMacParams *p, const Hmac *keyed, const uint8_t header[64], uint64_t len,
                                      uint64_t chunk_bytes, char *err, size_t errlen) {
    memset(p, 0, sizeof(*p));
    if (chunkmac_check_chunk_bytes(chunk_bytes, err, errlen) != 0) return -1;
    if (keyed->inner.nbytes != 64 || keyed->inner.nbuf != 0 || keyed->outer.nbytes != 64 || keyed->outer.nbuf != 0)
        return errorf(err, errlen, "chunked MAC: the keyed HMAC state has absorbed %" PRIu64
                      " bytes, want 64 (fresh from hmac_init)", keyed->inner.nbytes);
    memcpy(p->inner, keyed->inner.h, sizeof(p->inner));
    memcpy(p->outer, keyed->outer.h, sizeof(p->outer));
    uint8_t block[64];
    chunkmac_chunk_block(block, 0, len, chunk_bytes);
    chunkmac_words(p->chunk_block, block);
    chunkmac_final_block(block, len, chunk_bytes);
    chunkmac_words(p->final_block, block);
    chunkmac_words(p->header, header);
    p->len = len;
    p->chunk_bytes = chunk_bytes;
    p->n_chunks = chunkmac_count(len, chunk_bytes);
    return 0;
}

// chunkmac_gpu_launch: both kernels on stream (asynchronous); -1 with err set
// for a missing buffer or a failed launch
static inline int chunkmac_gpu_launch(const ChunkMacParams *p, const void *payload, uint8_t *chunk_tags, uint8_t *tag_out,
                                      const uint8_t *expected, int *mismatch, cudaStream_t stream, char *err, size_t errlen) {
    if (p->len > 0 && payload == NULL) return errorf(err, errlen, "chunked MAC: payload is NULL for %" PRIu64 " bytes", p->len);
    if (p->n_chunks > 0 && chunk_tags == NULL)
        return errorf(err, errlen, "chunked MAC: chunk_tags is NULL for %" PRIu64 " chunks", p->n_chunks);
    if (tag_out == NULL && expected == NULL) return errorf(err, errlen, "chunked MAC: neither tag_out nor expected given");
    if (expected != NULL && mismatch == NULL) return errorf(err, errlen, "chunked MAC: expected given without mismatch");
    uint64_t blocks = (p->n_chunks + CHUNKMAC_THREADS - 1) / CHUNKMAC_THREADS;
    if (blocks > 0x7fffffffu)
        return errorf(err, errlen, "chunked MAC: %" PRIu64 " chunks is more than one launch holds", p->n_chunks);
    if (blocks > 0)
        chunkmac_chunks_kernel<<<(unsigned)blocks, CHUNKMAC_THREADS, 0, stream>>>(*p, (const uint8_t *)payload, chunk_tags);
    chunkmac_final_kernel<<<1, 1, 0, stream>>>(*p, chunk_tags, tag_out, expected, mismatch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return errorf(err, errlen, "chunked MAC: kernel launch: %s", cudaGetErrorString(e));
    return 0;
}
#endif  // __CUDACC__

#endif
