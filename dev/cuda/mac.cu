/*
 * mac.cu: the chunked MAC kernels (chunkmac.h) against the CPU
 * construction (chunkmac_tag) on payloads of many lengths, aligned or not,
 * and the verify path; then their throughput for 1 MiB to 256 MiB payloads,
 * a few chunk sizes, and the chunk sizes of the NCCL backend's MAC'd messages. The kernels' per-thread code is __host__ __device__,
 * so without a GPU this still checks it, run on the CPU.
 */
#include "llm3d/secure/chunkmac.h"
#include "parallel.h"  // nccl_mac_chunk_bytes
#include "dev/cuda/common.h"

static double mac_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint64_t mac_rng = 0x243f6a8885a308d3ull;
static void mac_fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        mac_rng ^= mac_rng << 13, mac_rng ^= mac_rng >> 7, mac_rng ^= mac_rng << 17;
        p[i] = (uint8_t)(mac_rng >> 32);
    }
}

// what the two kernels compute, with their code, one chunk after another on the CPU
static void emulate_tag(const ChunkMacParams *p, const uint8_t *payload, uint8_t tag[32]) {
    uint8_t *chunk_tags = (uint8_t *)malloc(32 * p->n_chunks + 1);
    for (uint64_t i = 0; i < p->n_chunks; i++) chunkmac_chunk_one(p, payload, i, chunk_tags + 32 * i);
    chunkmac_hmac(tag, p, p->final_block, chunk_tags, 32 * p->n_chunks);
    free(chunk_tags);
}

typedef struct { size_t len, chunk, offset; } MacCase;

static int mac_cases(MacCase *out, int cap) {
    size_t chunks[] = {64, 4096, CHUNKMAC_CHUNK_BYTES};
    int n = 0;
    for (int c = 0; c < 3; c++) {
        size_t ch = chunks[c];
        size_t lens[] = {0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, ch - 1, ch, ch + 1, 5 * ch + 17};
        for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]) && n < cap; j++) {
            out[n++] = {lens[j], ch, 0};
            if (j >= 11 && n < cap) out[n++] = {lens[j], ch, 1 + j % 7};  // not 16-byte aligned
        }
    }
    if (n < cap) out[n++] = {(1u << 20) + 5, CHUNKMAC_CHUNK_BYTES, 0};
    return n;
}

typedef struct {
    ChunkMacParams p;
    const uint8_t *payload;
    uint8_t *scratch, *tag;
} MacCtx;

static void run_mac(void *ctx) {
    MacCtx *c = (MacCtx *)ctx;
    char err[256];
    if (chunkmac_gpu_launch(&c->p, c->payload, c->scratch, c->tag, NULL, NULL, 0, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
}

static void run_final(void *ctx) {  // the one-thread kernel alone
    MacCtx *c = (MacCtx *)ctx;
    chunkmac_final_kernel<<<1, 1>>>(c->p, c->scratch, c->tag, NULL, NULL);
}

int main(void) {
    uint8_t key[32], header[64];
    mac_fill(key, 32);
    FrameHeader fh;
    memset(&fh, 0, sizeof(fh));
    fh.magic = FRAME_MAGIC, fh.version = FRAME_VERSION, fh.channel = CH_ACTIVATION, fh.src = 0, fh.dst = 1, fh.seq = 9;
    frame_header_write(&fh, header);
    Hmac keyed;
    hmac_init(&keyed, key, 32);
    char err[256];

    MacCase cases[64];
    int ncases = mac_cases(cases, 64);
    size_t most = 0;
    for (int k = 0; k < ncases; k++) most = cases[k].len + cases[k].offset > most ? cases[k].len + cases[k].offset : most;
    uint8_t *host = (uint8_t *)malloc(most + 1);
    mac_fill(host, most + 1);
    uint8_t (*cpu_tags)[32] = (uint8_t (*)[32])malloc((size_t)ncases * 32);
    int emulated = 0;
    for (int k = 0; k < ncases; k++) {
        MacCase c = cases[k];
        ChunkMacParams p;
        uint8_t tag[32];
        chunkmac_tag(&keyed, header, host + c.offset, c.len, c.chunk, cpu_tags[k], NULL, 0);
        if (chunkmac_gpu_params(&p, &keyed, header, c.len, c.chunk, err, sizeof(err)) != 0) { check(0, "%s", err); continue; }
        emulate_tag(&p, host + c.offset, tag);
        emulated += memcmp(tag, cpu_tags[k], 32) == 0;
    }
    check(emulated == ncases, "kernel code on the CPU = chunkmac_tag: %d of %d payloads (0 B..1 MiB, chunks 64 B..64 KiB, unaligned too)",
          emulated, ncases);
    Hmac used = keyed;
    hmac_update(&used, "x", 1);
    ChunkMacParams p;
    check(chunkmac_gpu_params(&p, &used, header, 10, 64, err, sizeof(err)) == -1 && strstr(err, "absorbed 65") != NULL,
          "a keyed state that has hashed data is refused: %s", err);
    if (!require_gpu()) return test_summary();

    uint8_t *d_payload, *d_scratch, *d_tag, *d_expected;
    int *d_mismatch;
    CUDA_CHECK(cudaMalloc((void **)&d_payload, most + 16));
    CUDA_CHECK(cudaMalloc((void **)&d_scratch, 32 * chunkmac_count(most, 64) + 32));
    CUDA_CHECK(cudaMalloc((void **)&d_tag, 32));
    CUDA_CHECK(cudaMalloc((void **)&d_expected, 32));
    CUDA_CHECK(cudaMalloc((void **)&d_mismatch, sizeof(int)));
    CUDA_CHECK(cudaMemcpy(d_payload, host, most, cudaMemcpyHostToDevice));
    int agree = 0, chunk_agree = 0, chunk_total = 0;
    for (int k = 0; k < ncases; k++) {
        MacCase c = cases[k];
        uint8_t tag[32];
        chunkmac_gpu_params(&p, &keyed, header, c.len, c.chunk, NULL, 0);
        if (chunkmac_gpu_launch(&p, d_payload + c.offset, d_scratch, d_tag, NULL, NULL, 0, err, sizeof(err)) != 0) {
            check(0, "%s", err);
            continue;
        }
        CUDA_CHECK(cudaMemcpy(tag, d_tag, 32, cudaMemcpyDeviceToHost));
        agree += memcmp(tag, cpu_tags[k], 32) == 0;
        if (p.n_chunks <= 64) {  // each chunk tag too
            uint8_t got[64 * 32], want[32];
            CUDA_CHECK(cudaMemcpy(got, d_scratch, 32 * p.n_chunks, cudaMemcpyDeviceToHost));
            for (uint64_t i = 0; i < p.n_chunks; i++) {
                chunkmac_chunk_tag(&keyed, header, host + c.offset, c.len, c.chunk, i, want);
                chunk_agree += memcmp(got + 32 * i, want, 32) == 0;
                chunk_total++;
            }
        }
    }
    check(agree == ncases, "GPU tag = chunkmac_tag: %d of %d payloads", agree, ncases);
    check(chunk_agree == chunk_total, "GPU chunk tags = chunkmac_chunk_tag: %d of %d", chunk_agree, chunk_total);

    // the receiver's path: the right tag leaves the flag alone, a wrong tag or payload sets it
    MacCase big = cases[ncases - 1];
    int flags[3];
    for (int k = 0; k < 3; k++) {
        uint8_t expected[32];
        memcpy(expected, cpu_tags[ncases - 1], 32);
        if (k == 1) expected[31] ^= 0x80;
        if (k == 2) CUDA_CHECK(cudaMemset(d_payload + big.len / 2, host[big.len / 2] ^ 1, 1));
        CUDA_CHECK(cudaMemcpy(d_expected, expected, 32, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(d_mismatch, 0, sizeof(int)));
        chunkmac_gpu_params(&p, &keyed, header, big.len, big.chunk, NULL, 0);
        if (chunkmac_gpu_launch(&p, d_payload, d_scratch, NULL, d_expected, d_mismatch, 0, err, sizeof(err)) != 0) {
            check(0, "verify launch: %s", err);
            return test_summary();
        }
        CUDA_CHECK(cudaMemcpy(&flags[k], d_mismatch, sizeof(int), cudaMemcpyDeviceToHost));
    }
    CUDA_CHECK(cudaMemcpy(d_payload, host, most, cudaMemcpyHostToDevice));
    check(flags[0] == 0 && flags[1] == 1 && flags[2] == 1, "GPU verify: right tag %d, flipped tag bit %d, flipped payload byte %d (want 0 1 1)",
          flags[0], flags[1], flags[2]);

    if (small_shapes()) {  // the comparisons above are the check; the rest times
        secure_wipe(&p, sizeof(p));
        free(host);
        free(cpu_tags);
        return test_summary();
    }

    // throughput: the tag of one payload, as the sender computes it
    size_t top = (size_t)256 << 20;
    uint8_t *d_big, *d_big_scratch;
    CUDA_CHECK(cudaMalloc((void **)&d_big, top));
    CUDA_CHECK(cudaMalloc((void **)&d_big_scratch, 32 * chunkmac_count(top, 4096)));
    CUDA_CHECK(cudaMemset(d_big, 0x5a, top));
    MacCtx ctx = {p, d_big, d_big_scratch, d_tag};
    for (size_t mib = 1; mib <= 256; mib *= 4) {
        char what[64];
        chunkmac_gpu_params(&ctx.p, &keyed, header, mib << 20, CHUNKMAC_CHUNK_BYTES, NULL, 0);
        snprintf(what, sizeof(what), "chunked MAC %zu MiB", mib);
        print_time(what, time_ms(run_mac, &ctx, 10), (double)(mib << 20), 0);
        snprintf(what, sizeof(what), "  its final (%" PRIu64 " tags)", ctx.p.n_chunks);
        print_time(what, time_ms(run_final, &ctx, 10), 0, 0);
    }
    size_t sweep[] = {4096, 16384, 65536, 262144};
    for (int s = 0; s < 4; s++) {
        for (size_t mib = 16; mib <= 64; mib *= 4) {
            char what[64];
            chunkmac_gpu_params(&ctx.p, &keyed, header, mib << 20, sweep[s], NULL, 0);
            snprintf(what, sizeof(what), "chunked MAC %zu MiB, %zu KiB chunks", mib, sweep[s] >> 10);
            print_time(what, time_ms(run_mac, &ctx, 10), (double)(mib << 20), 0);
        }
    }
    // the chunk sizes the NCCL backend's MAC'd messages use (nccl_comm.h,
    // nccl_mac_chunk_bytes), 25165824 bytes being GPT-2 124M's activation at B 16, T 1024, bf16:
    // a sender pays this once per message, a receiver once more
    size_t nccl_lens[] = {(size_t)1 << 20, (size_t)4 << 20, 25165824, (size_t)64 << 20, (size_t)256 << 20};
    for (int s = 0; s < 5; s++) {
        char what[80];
        uint64_t cb = nccl_mac_chunk_bytes(nccl_lens[s]);
        chunkmac_gpu_params(&ctx.p, &keyed, header, nccl_lens[s], cb, NULL, 0);
        snprintf(what, sizeof(what), "nccl MAC %zu B, %" PRIu64 " chunks of %" PRIu64 " B", nccl_lens[s], ctx.p.n_chunks, cb);
        print_time(what, time_ms(run_mac, &ctx, 10), (double)nccl_lens[s], 0);
    }
    // the same construction on one CPU core, for scale
    uint8_t *cpu_big = (uint8_t *)malloc((size_t)64 << 20), tag[32];
    memset(cpu_big, 0x5a, (size_t)64 << 20);
    double t0 = mac_now_ms();
    chunkmac_tag(&keyed, header, cpu_big, (size_t)64 << 20, CHUNKMAC_CHUNK_BYTES, tag, NULL, 0);
    print_time("cpu chunked MAC 64 MiB", (float)(mac_now_ms() - t0), (double)((size_t)64 << 20), 0);
    secure_wipe(&ctx.p, sizeof(ctx.p));
    secure_wipe(&p, sizeof(p));
    free(cpu_big);
    free(host);
    free(cpu_tags);
    return test_summary();
}
