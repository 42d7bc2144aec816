/*
 * aead.h: encryption at rest. AES-256-GCM (FIPS 197 and NIST SP 800-38D) on
 * one buffer, and the sealed file: a file cut into fixed-size chunks, each
 * sealed with AES-256-GCM under its own nonce. Checkpoints (checkpoint.h),
 * the final model and encrypted data shards (prepare_data.c, dataloader.h)
 * use it; doc/formats.md has the file's layout and
 * doc/security.md what it protects.
 *
 * defines:
 *   AeadKey, aead_init, aead_wipe         the key schedule and GHASH's key
 *   aead_seal, aead_open                  one buffer: encrypt + tag, check + decrypt,
 *                                         each in one pass (CTR and GHASH stitched)
 *   aead_ctr, aead_tag                    the two halves apart: the keystream from
 *                                         any byte offset, and the tag of a ciphertext
 *   aead_ctr_ghash_j0, aead_ghash_update, aead_ghash_times_hpow, aead_tag_finish
 *                                         the pass itself, from any offset; GHASH's
 *                                         state carried, or moved by a power of H
 *   aead_has_aesni, aead_has_vaes256, aead_has_vaes, aead_force_portable,
 *   aead_force_narrow, aead_force_avx2, aead_impl_name
 *                                         which path runs (chosen at run time)
 *   AeadFileKey, aead_file_key            the cipher key derived from a 32-byte key
 *   AeadFile, aead_file_*                 the sealed file: header, chunk nonces
 *                                         and AAD, writes at any plaintext offset
 *                                         (with their GHASH shares: aead_file_ctr_sums,
 *                                         aead_file_tags_from_sums), the tag table,
 *                                         whole reads and range reads
 *
 * Four paths, picked at run time by CPUID like secure.h's SHA-256:
 *   - VAES with VPCLMULQDQ on 512-bit registers (AVX-512): four blocks per
 *     instruction, 16 counter blocks in flight, GHASH over 16 blocks with one
 *     reduction (precomputed H^1..H^16); the last few blocks go the next way.
 *     A seal or open takes 16 KiB at a time through CTR, then GHASH.
 *   - the same on 256-bit registers (VAES and VPCLMULQDQ with AVX2, CPUs
 *     without AVX-512): two blocks per instruction, 16 in flight; seal and
 *     open stitched, as next.
 *   - AES-NI with PCLMULQDQ: eight counter blocks in flight, and GHASH over
 *     eight blocks at a time with one reduction. A seal or open is one pass,
 *     stitched: GHASH's products of one group's ciphertext run between the
 *     AES rounds of the next (sealing) or the same (opening) group, on data
 *     still in L1, rather than a second pass over the buffer. Only the
 *     functions of these paths are compiled for their targets, so the file
 *     builds without -maes and under `make SIMD=scalar`.
 *   - portable C for other CPUs. Its GHASH multiplies bit by bit with masks,
 *     so it takes the same time whatever the data. Its AES is NOT constant
 *     time: it looks up a 256-byte S-box, and which entries a block touches
 *     can show in the cache timing seen by another process on the same
 *     machine. It runs only where the CPU lacks AES-NI (and in the tests,
 *     forced); doc/security.md says so too.
 *
 * Nonces: GCM must never see one (key, nonce) pair twice. A sealed file's
 * chunk nonce is its 64-bit file id (random, fresh for every file written)
 * and the chunk's index, so two files collide only if their random ids do.
 */
#ifndef LLM3D_AEAD_H
#define LLM3D_AEAD_H

#include "secure.h"  // first: it needs POSIX; HMAC, secure_wipe, put_u64, errorf, cpu_has
#include "llm3d/files.h"   // pread_all, pwrite_all

#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define AEAD_KEY_BYTES 32
#define AEAD_NONCE_BYTES 12
#define AEAD_TAG_BYTES 16

typedef struct {
    uint8_t round_keys[15][16];  // AES-256's schedule, as FIPS 197 lays it out
    uint64_t h_hi, h_lo;         // GHASH's key H = AES(0), big-endian halves (portable path)
    uint8_t h_powers[16][16];    // H^1..H^16 for the AES-NI paths, in their own form (see below)
    uint8_t h_squares[24][16];   // H^(2^j), GCM's bytes: H^e for any e < 2^24 (aead_ghash_times_hpow)
} AeadKey;

// ----------------------------------------------------------------------------
// AES-256, portable: the S-box is built once from its definition (the
// inverse in GF(2^8) followed by an affine map), not typed in

static uint8_t aead_sbox[256];
static pthread_once_t aead_sbox_once = PTHREAD_ONCE_INIT;

static inline uint8_t aead_xtime(uint8_t x) { return (uint8_t)((x << 1) ^ ((x >> 7) * 0x1b)); }

static inline uint8_t aead_gf_mul(uint8_t a, uint8_t b) {
    uint8_t r = 0;
    for (int i = 0; i < 8; i++) {
        r ^= (uint8_t)(-(b & 1) & a);
        a = aead_xtime(a);
        b >>= 1;
    }
    return r;
}

static void aead_build_sbox(void) {
    for (int x = 0; x < 256; x++) {
        uint8_t inv = 0;  // x^254 = x^-1 (0 stays 0)
        if (x != 0) {
            uint8_t p = (uint8_t)x;
            inv = 1;
            for (int e = 254; e > 0; e >>= 1) {
                if (e & 1) inv = aead_gf_mul(inv, p);
                p = aead_gf_mul(p, p);
            }
        }
        uint8_t s = inv;
        for (int r = 1; r <= 4; r++) s ^= (uint8_t)((inv << r) | (inv >> (8 - r)));
        aead_sbox[x] = s ^ 0x63;
    }
}

static inline void aead_expand_key(uint8_t rk[15][16], const uint8_t key[32]) {
    pthread_once(&aead_sbox_once, aead_build_sbox);
    uint8_t *w = &rk[0][0];  // 60 words of 4 bytes
    memcpy(w, key, 32);
    uint8_t rcon = 1;
    for (int i = 8; i < 60; i++) {
        uint8_t t[4];
        memcpy(t, w + 4 * (i - 1), 4);
        if (i % 8 == 0) {
            uint8_t first = t[0];
            t[0] = aead_sbox[t[1]] ^ rcon; t[1] = aead_sbox[t[2]]; t[2] = aead_sbox[t[3]]; t[3] = aead_sbox[first];
            rcon = aead_xtime(rcon);
        } else if (i % 8 == 4) {
            for (int k = 0; k < 4; k++) t[k] = aead_sbox[t[k]];
        }
        for (int k = 0; k < 4; k++) w[4 * i + k] = w[4 * (i - 8) + k] ^ t[k];
    }
}

// one block; the state is column-major as FIPS 197 has it: s[4*c + r]
static inline void aead_aes_block_portable(const AeadKey *k, const uint8_t in[16], uint8_t out[16]) {
    uint8_t s[16], t[16];
    for (int i = 0; i < 16; i++) s[i] = in[i] ^ k->round_keys[0][i];
    for (int round = 1; round <= 14; round++) {
        for (int c = 0; c < 4; c++)  // SubBytes and ShiftRows: row r moves r columns left
            for (int r = 0; r < 4; r++) t[4 * c + r] = aead_sbox[s[4 * ((c + r) & 3) + r]];
        if (round < 14) {
            for (int c = 0; c < 4; c++) {  // MixColumns
                uint8_t *a = t + 4 * c, all = a[0] ^ a[1] ^ a[2] ^ a[3], first = a[0];
                a[0] ^= all ^ aead_xtime(a[0] ^ a[1]);
                a[1] ^= all ^ aead_xtime(a[1] ^ a[2]);
                a[2] ^= all ^ aead_xtime(a[2] ^ a[3]);
                a[3] ^= all ^ aead_xtime(a[3] ^ first);
            }
        }
        for (int i = 0; i < 16; i++) s[i] = t[i] ^ k->round_keys[round][i];
    }
    memcpy(out, s, 16);
    secure_wipe(t, sizeof(t));
}

// ----------------------------------------------------------------------------
// GHASH, portable: GF(2^128) as SP 800-38D writes it (bit 0 = the top bit of
// byte 0 = the coefficient of x^0), held as two big-endian 64-bit halves.
// Every step runs whatever the bits are: masks, no branches, no tables.

static inline uint64_t aead_load_be64(const uint8_t *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x = x << 8 | p[i];
    return x;
}

static inline void aead_store_be64(uint8_t *p, uint64_t x) {
    for (int i = 7; i >= 0; i--, x >>= 8) p[i] = (uint8_t)x;
}

// (*z_hi, *z_lo) = x * v
static inline void aead_gf_mul_portable(uint64_t x_hi, uint64_t x_lo, uint64_t v_hi, uint64_t v_lo, uint64_t *z_hi_out,
                                        uint64_t *z_lo_out) {
    uint64_t z_hi = 0, z_lo = 0;
    for (int i = 0; i < 128; i++) {
        uint64_t bit = i < 64 ? x_hi >> (63 - i) : x_lo >> (127 - i);
        uint64_t take = 0 - (bit & 1);
        z_hi ^= v_hi & take;
        z_lo ^= v_lo & take;
        uint64_t carry = 0 - (v_lo & 1);  // V * x: one right shift, and x^128 folds back as 0xe1 << 120
        v_lo = (v_lo >> 1) | (v_hi << 63);
        v_hi = (v_hi >> 1) ^ (carry & 0xe100000000000000ull);
    }
    *z_hi_out = z_hi;
    *z_lo_out = z_lo;
}

// (*y_hi, *y_lo) = (y XOR block) * H
static inline void aead_ghash_block_portable(const AeadKey *k, uint64_t *y_hi, uint64_t *y_lo, const uint8_t *block) {
    aead_gf_mul_portable(*y_hi ^ aead_load_be64(block), *y_lo ^ aead_load_be64(block + 8), k->h_hi, k->h_lo, y_hi, y_lo);
}

// ----------------------------------------------------------------------------
// the AES-NI path

#if SECURE_HAVE_X86
// GHASH in the form PCLMULQDQ likes: each block byte-reversed, so that as a
// 128-bit integer bit 127 is the coefficient of x^0 ("reflected"). The
// carry-less product of two reflected values is the reflected product
// times x; keeping every stored power of H multiplied by x^-1 (one shift
// left and, when a bit falls out, 0xc2000...01, which is x^-1 reflected)
// cancels that x, so a product needs no shift. x^128 = x^7 + x^2 + x + 1
// then folds the high half back in twice (aead_clmul_reduce).

__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_byte_reverse(__m128i x) {
    return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

// 128-bit shifts by 0 < n < 64 (SSE shifts the two 64-bit lanes apart)
__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_shr128(__m128i x, int n) {
    return _mm_or_si128(_mm_srli_epi64(x, n), _mm_slli_epi64(_mm_srli_si128(x, 8), 64 - n));
}

__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_shl128(__m128i x, int n) {
    return _mm_or_si128(_mm_slli_epi64(x, n), _mm_srli_epi64(_mm_slli_si128(x, 8), 64 - n));
}

// the 256-bit product hi:lo of reflected values to the 128-bit result: lo
// holds the coefficients of x^128.. (reflected), which times x^7+x^2+x+1
// land in degrees below 135; what passes x^127 (ov) folds once more
__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_clmul_reduce(__m128i lo, __m128i hi) {
    __m128i ov = _mm_xor_si128(_mm_xor_si128(_mm_slli_si128(_mm_slli_epi64(lo, 63), 8),
                                             _mm_slli_si128(_mm_slli_epi64(lo, 62), 8)),
                               _mm_slli_si128(_mm_slli_epi64(lo, 57), 8));
    __m128i folded = _mm_xor_si128(_mm_xor_si128(lo, aead_shr128(lo, 1)),
                                   _mm_xor_si128(aead_shr128(lo, 2), aead_shr128(lo, 7)));
    folded = _mm_xor_si128(folded, _mm_xor_si128(_mm_xor_si128(ov, _mm_srli_epi64(ov, 1)),
                                                 _mm_xor_si128(_mm_srli_epi64(ov, 2), _mm_srli_epi64(ov, 7))));
    return _mm_xor_si128(hi, folded);
}

// acc_lo, acc_mid, acc_hi += a * b, unreduced (four 64x64 products)
__attribute__((target("sse4.1,pclmul")))
static inline void aead_clmul_acc(__m128i a, __m128i b, __m128i *lo, __m128i *mid, __m128i *hi) {
    *lo = _mm_xor_si128(*lo, _mm_clmulepi64_si128(a, b, 0x00));
    *hi = _mm_xor_si128(*hi, _mm_clmulepi64_si128(a, b, 0x11));
    *mid = _mm_xor_si128(*mid, _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10)));
}

__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_clmul_finish(__m128i lo, __m128i mid, __m128i hi) {
    lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    return aead_clmul_reduce(lo, hi);
}

__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_gf_mul_ni(__m128i a, __m128i b) {
    __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
    aead_clmul_acc(a, b, &lo, &mid, &hi);
    return aead_clmul_finish(lo, mid, hi);
}

// a reflected value times x^-1: the form the powers of H are kept in
__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_times_x_inverse(__m128i x) {
    __m128i top = _mm_srai_epi32(_mm_shuffle_epi32(x, 0xff), 31);  // all ones when bit 127 is set
    __m128i poly = _mm_set_epi64x((long long)0xc200000000000000ull, 1);
    return _mm_xor_si128(aead_shl128(x, 1), _mm_and_si128(top, poly));
}

__attribute__((target("sse4.1,pclmul")))
static inline void aead_ghash_powers_ni(AeadKey *k) {
    uint8_t h[16];
    aead_store_be64(h, k->h_hi);
    aead_store_be64(h + 8, k->h_lo);
    __m128i h1 = aead_byte_reverse(_mm_loadu_si128((const __m128i *)h));
    __m128i h1x = aead_times_x_inverse(h1), p = h1;
    _mm_storeu_si128((__m128i *)k->h_powers[0], h1x);
    for (int i = 1; i < 16; i++) {
        p = aead_gf_mul_ni(p, h1x);
        _mm_storeu_si128((__m128i *)k->h_powers[i], aead_times_x_inverse(p));
    }
    secure_wipe(h, sizeof(h));
}

// y = GHASH state (reflected); nblocks whole blocks of data
__attribute__((target("sse4.1,pclmul")))
static inline __m128i aead_ghash_ni(const AeadKey *k, __m128i y, const uint8_t *data, size_t nblocks) {
    const __m128i *hp = (const __m128i *)k->h_powers;
    for (; nblocks >= 8; nblocks -= 8, data += 128) {
        __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
        for (int i = 0; i < 8; i++) {  // (y + X1) H^8 + X2 H^7 + ... + X8 H
            __m128i x = aead_byte_reverse(_mm_loadu_si128((const __m128i *)(data + 16 * i)));
            if (i == 0) x = _mm_xor_si128(x, y);
            aead_clmul_acc(x, _mm_loadu_si128(hp + 7 - i), &lo, &mid, &hi);
        }
        y = aead_clmul_finish(lo, mid, hi);
    }
    for (; nblocks > 0; nblocks--, data += 16) {
        __m128i x = aead_byte_reverse(_mm_loadu_si128((const __m128i *)data));
        y = aead_gf_mul_ni(_mm_xor_si128(y, x), _mm_loadu_si128(hp));
    }
    return y;
}

__attribute__((target("sse4.1,aes")))
static inline __m128i aead_aes_block_ni(const __m128i rk[15], __m128i x) {
    x = _mm_xor_si128(x, rk[0]);
    for (int r = 1; r < 14; r++) x = _mm_aesenc_si128(x, rk[r]);
    return _mm_aesenclast_si128(x, rk[14]);
}

// out = in XOR the keystream of counter blocks ctr, ctr+1, ... (whole
// blocks); eight in flight, as the AES unit pipelines independent blocks
__attribute__((target("sse4.1,aes")))
static inline void aead_ctr_blocks_ni(const AeadKey *k, const uint8_t prefix[12], uint32_t ctr, const uint8_t *in,
                                      uint8_t *out, size_t nblocks) {
    __m128i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm_loadu_si128((const __m128i *)k->round_keys[r]);
    uint8_t base_bytes[16] = {0};
    memcpy(base_bytes, prefix, 12);
    __m128i base = _mm_loadu_si128((const __m128i *)base_bytes);
    for (; nblocks >= 8; nblocks -= 8, in += 128, out += 128, ctr += 8) {
        __m128i b[8];
        for (int i = 0; i < 8; i++) b[i] = _mm_insert_epi32(base, (int)__builtin_bswap32(ctr + (uint32_t)i), 3);
        for (int i = 0; i < 8; i++) b[i] = _mm_xor_si128(b[i], rk[0]);
        for (int r = 1; r < 14; r++)
            for (int i = 0; i < 8; i++) b[i] = _mm_aesenc_si128(b[i], rk[r]);
        for (int i = 0; i < 8; i++) {
            b[i] = _mm_aesenclast_si128(b[i], rk[14]);
            __m128i x = _mm_loadu_si128((const __m128i *)(in + 16 * i));
            _mm_storeu_si128((__m128i *)(out + 16 * i), _mm_xor_si128(x, b[i]));
        }
    }
    for (; nblocks > 0; nblocks--, in += 16, out += 16, ctr++) {
        __m128i b = aead_aes_block_ni(rk, _mm_insert_epi32(base, (int)__builtin_bswap32(ctr), 3));
        _mm_storeu_si128((__m128i *)out, _mm_xor_si128(_mm_loadu_si128((const __m128i *)in), b));
    }
    secure_wipe(rk, sizeof(rk));
}

__attribute__((target("sse4.1,aes")))
static inline void aead_aes_one_ni(const AeadKey *k, const uint8_t in[16], uint8_t out[16]) {
    __m128i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm_loadu_si128((const __m128i *)k->round_keys[r]);
    _mm_storeu_si128((__m128i *)out, aead_aes_block_ni(rk, _mm_loadu_si128((const __m128i *)in)));
    secure_wipe(rk, sizeof(rk));
}

// CTR and GHASH stitched: one group of 8 counter blocks through AES (out =
// in XOR the keystream) and, between its rounds, GHASH's products over 8
// blocks at `hash` whose ciphertext is known already (when decrypting, the
// group's own input; when encrypting, the group before's output, just
// written): y = (y + X1) H^8 + X2 H^7 + ... + X8 H, one reduction. The AES
// unit and the carry-less multiplier then work side by side, on data still
// in L1, instead of in two passes over the buffer. hash may be in (decrypting
// in place): its blocks are loaded before out is stored.
__attribute__((target("sse4.1,aes,pclmul")))
static inline __m128i aead_ctr8_ghash8_ni(const __m128i rk[15], const __m128i hp[8], __m128i base, uint32_t ctr,
                                          const uint8_t *in, uint8_t *out, const uint8_t *hash, __m128i y) {
    __m128i b[8], lo = _mm_setzero_si128(), mid = lo, hi = lo;
    for (int i = 0; i < 8; i++)
        b[i] = _mm_xor_si128(_mm_insert_epi32(base, (int)__builtin_bswap32(ctr + (uint32_t)i), 3), rk[0]);
#ifndef __CUDACC__  // nvcc's front end reads the host code too, and knows no GCC pragma
#pragma GCC unroll 13
#endif
    for (int r = 1; r < 14; r++) {  // unrolled: the products then land between fixed rounds (2x faster here)
        for (int i = 0; i < 8; i++) b[i] = _mm_aesenc_si128(b[i], rk[r]);
        if (r <= 8) {  // one block's product per round, for the first eight rounds
            __m128i x = aead_byte_reverse(_mm_loadu_si128((const __m128i *)(hash + 16 * (r - 1))));
            if (r == 1) x = _mm_xor_si128(x, y);
            aead_clmul_acc(x, hp[8 - r], &lo, &mid, &hi);
        }
    }
    for (int i = 0; i < 8; i++) {
        b[i] = _mm_aesenclast_si128(b[i], rk[14]);
        __m128i x = _mm_loadu_si128((const __m128i *)(in + 16 * i));
        _mm_storeu_si128((__m128i *)(out + 16 * i), _mm_xor_si128(x, b[i]));
    }
    return aead_clmul_finish(lo, mid, hi);
}

// out = in XOR the keystream from counter ctr (whole blocks), and y (GHASH's
// state, reflected) carried over the ciphertext's blocks: in's when
// decrypting, out's when encrypting. Returns the new y.
__attribute__((target("sse4.1,aes,pclmul")))
static inline __m128i aead_ctr_ghash_blocks_ni(const AeadKey *k, const uint8_t prefix[12], uint32_t ctr,
                                               const uint8_t *in, uint8_t *out, size_t nblocks, int decrypt, __m128i y) {
    __m128i rk[15], hp[8];
    for (int r = 0; r < 15; r++) rk[r] = _mm_loadu_si128((const __m128i *)k->round_keys[r]);
    for (int i = 0; i < 8; i++) hp[i] = _mm_loadu_si128((const __m128i *)k->h_powers[i]);
    uint8_t base_bytes[16] = {0};
    memcpy(base_bytes, prefix, 12);
    __m128i base = _mm_loadu_si128((const __m128i *)base_bytes);
    size_t groups = nblocks / 8;
    if (decrypt) {
        for (size_t g = 0; g < groups; g++, in += 128, out += 128, ctr += 8)
            y = aead_ctr8_ghash8_ni(rk, hp, base, ctr, in, out, in, y);
    } else if (groups > 0) {
        // each group's ciphertext is hashed while the next group's AES runs; the first group
        // has none to hash beside it, and the last is hashed after the loop
        aead_ctr_blocks_ni(k, prefix, ctr, in, out, 8);
        in += 128; out += 128; ctr += 8;
        for (size_t g = 1; g < groups; g++, in += 128, out += 128, ctr += 8)
            y = aead_ctr8_ghash8_ni(rk, hp, base, ctr, in, out, out - 128, y);
        y = aead_ghash_ni(k, y, out - 128, 8);
    }
    size_t rest = nblocks % 8;
    if (decrypt) y = aead_ghash_ni(k, y, in, rest);
    aead_ctr_blocks_ni(k, prefix, ctr, in, out, rest);
    if (!decrypt) y = aead_ghash_ni(k, y, out, rest);
    secure_wipe(rk, sizeof(rk));
    return y;
}

// The same on 256-bit registers (VAES and VPCLMULQDQ with AVX2, as CPUs
// without AVX-512 have them): each instruction works on two blocks, one
// per 128-bit lane, so a step takes 16 blocks in 8 registers. Lane l of a
// register is block 2t + l of the step; the counter is kept little-endian
// in each lane's last word, as on 512-bit registers.
#define AEAD_YMM_TARGET "avx2,vaes,vpclmulqdq,sse4.1,aes,pclmul"

__attribute__((target(AEAD_YMM_TARGET)))
static inline void aead_round_keys_ymm(const AeadKey *k, __m256i rk[15]) {
    for (int r = 0; r < 15; r++) rk[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k->round_keys[r]));
}

// H^(16-2t-l) in lane l of hp[t]
__attribute__((target(AEAD_YMM_TARGET)))
static inline void aead_ghash_powers_ymm(const AeadKey *k, __m256i hp[8]) {
    for (int t = 0; t < 8; t++)
        hp[t] = _mm256_loadu2_m128i((const __m128i *)k->h_powers[14 - 2 * t], (const __m128i *)k->h_powers[15 - 2 * t]);
}

// the 16 counter blocks from ctr, each XOR the first round key
__attribute__((target(AEAD_YMM_TARGET)))
static inline void aead_counters_ymm(const uint32_t p[3], uint32_t ctr, __m256i rk0, __m256i b[8]) {
    const __m256i swap_last = _mm256_broadcastsi128_si256(_mm_set_epi8(12, 13, 14, 15, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    const __m256i two = _mm256_set_epi32(2, 0, 0, 0, 2, 0, 0, 0);
    __m256i c = _mm256_set_epi32((int)(ctr + 1), (int)p[2], (int)p[1], (int)p[0], (int)ctr, (int)p[2], (int)p[1], (int)p[0]);
    for (int i = 0; i < 8; i++) {
        b[i] = _mm256_xor_si256(_mm256_shuffle_epi8(c, swap_last), rk0);
        c = _mm256_add_epi32(c, two);
    }
}

// acc += x * h in both lanes, unreduced
__attribute__((target(AEAD_YMM_TARGET)))
static inline void aead_clmul_acc_ymm(__m256i x, __m256i h, __m256i *lo, __m256i *mid, __m256i *hi) {
    *lo = _mm256_xor_si256(*lo, _mm256_clmulepi64_epi128(x, h, 0x00));
    *hi = _mm256_xor_si256(*hi, _mm256_clmulepi64_epi128(x, h, 0x11));
    *mid = _mm256_xor_si256(*mid, _mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x01), _mm256_clmulepi64_epi128(x, h, 0x10)));
}

// the two lanes' sums are one sum: fold them, then reduce once
__attribute__((target(AEAD_YMM_TARGET)))
static inline __m128i aead_clmul_finish_ymm(__m256i lo, __m256i mid, __m256i hi) {
    return aead_clmul_finish(_mm_xor_si128(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)),
                             _mm_xor_si128(_mm256_castsi256_si128(mid), _mm256_extracti128_si256(mid, 1)),
                             _mm_xor_si128(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}

// block pair t of the 16 at data, byte-reversed (and y added into block 0)
__attribute__((target(AEAD_YMM_TARGET)))
static inline __m256i aead_ghash_load_ymm(const uint8_t *data, int t, __m128i y) {
    const __m256i reverse = _mm256_broadcastsi128_si256(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m256i x = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(data + 32 * t)), reverse);
    return t == 0 ? _mm256_xor_si256(x, _mm256_inserti128_si256(_mm256_setzero_si256(), y, 0)) : x;
}

// out = in XOR the keystream from counter ctr, for whole groups of 16 blocks
__attribute__((target(AEAD_YMM_TARGET)))
static inline void aead_ctr_blocks_ymm(const AeadKey *k, const uint8_t prefix[12], uint32_t ctr, const uint8_t *in,
                                       uint8_t *out, size_t groups) {
    __m256i rk[15], b[8];
    aead_round_keys_ymm(k, rk);
    uint32_t p[3];
    memcpy(p, prefix, 12);
    for (; groups > 0; groups--, in += 256, out += 256, ctr += 16) {
        aead_counters_ymm(p, ctr, rk[0], b);
        for (int r = 1; r < 14; r++)
            for (int i = 0; i < 8; i++) b[i] = _mm256_aesenc_epi128(b[i], rk[r]);
        for (int i = 0; i < 8; i++) {
            b[i] = _mm256_aesenclast_epi128(b[i], rk[14]);
            _mm256_storeu_si256((__m256i *)(out + 32 * i),
                                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(in + 32 * i)), b[i]));
        }
    }
    secure_wipe(rk, sizeof(rk));
}

// GHASH over whole groups of 16 blocks, one reduction each
__attribute__((target(AEAD_YMM_TARGET)))
static inline __m128i aead_ghash_ymm(const AeadKey *k, __m128i y, const uint8_t *data, size_t groups) {
    __m256i hp[8];
    aead_ghash_powers_ymm(k, hp);
    for (; groups > 0; groups--, data += 256) {
        __m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo;
        for (int t = 0; t < 8; t++) aead_clmul_acc_ymm(aead_ghash_load_ymm(data, t, y), hp[t], &lo, &mid, &hi);
        y = aead_clmul_finish_ymm(lo, mid, hi);
    }
    return y;
}

// CTR and GHASH stitched as aead_ctr8_ghash8_ni, 16 blocks at a time
__attribute__((target(AEAD_YMM_TARGET)))
static inline __m128i aead_ctr16_ghash16_ymm(const __m256i rk[15], const __m256i hp[8], const uint32_t p[3],
                                             uint32_t ctr, const uint8_t *in, uint8_t *out, const uint8_t *hash,
                                             __m128i y) {
    __m256i b[8], lo = _mm256_setzero_si256(), mid = lo, hi = lo;
    aead_counters_ymm(p, ctr, rk[0], b);
#ifndef __CUDACC__
#pragma GCC unroll 13
#endif
    for (int r = 1; r < 14; r++) {
        for (int i = 0; i < 8; i++) b[i] = _mm256_aesenc_epi128(b[i], rk[r]);
        if (r <= 8) aead_clmul_acc_ymm(aead_ghash_load_ymm(hash, r - 1, y), hp[r - 1], &lo, &mid, &hi);
    }
    for (int i = 0; i < 8; i++) {
        b[i] = _mm256_aesenclast_epi128(b[i], rk[14]);
        __m256i x = _mm256_loadu_si256((const __m256i *)(in + 32 * i));
        _mm256_storeu_si256((__m256i *)(out + 32 * i), _mm256_xor_si256(x, b[i]));
    }
    return aead_clmul_finish_ymm(lo, mid, hi);
}

// aead_ctr_ghash_blocks_ni on 256-bit registers: whole groups of 16 blocks
// here, the rest there
__attribute__((target(AEAD_YMM_TARGET)))
static inline __m128i aead_ctr_ghash_blocks_ymm(const AeadKey *k, const uint8_t prefix[12], uint32_t ctr,
                                                const uint8_t *in, uint8_t *out, size_t nblocks, int decrypt,
                                                __m128i y) {
    __m256i rk[15], hp[8];
    aead_round_keys_ymm(k, rk);
    aead_ghash_powers_ymm(k, hp);
    uint32_t p[3];
    memcpy(p, prefix, 12);
    size_t groups = nblocks / 16;
    if (decrypt) {
        for (size_t g = 0; g < groups; g++, in += 256, out += 256, ctr += 16)
            y = aead_ctr16_ghash16_ymm(rk, hp, p, ctr, in, out, in, y);
    } else if (groups > 0) {  // each group hashed beside the next one's AES, as on 128-bit registers
        aead_ctr_blocks_ymm(k, prefix, ctr, in, out, 1);
        in += 256; out += 256; ctr += 16;
        for (size_t g = 1; g < groups; g++, in += 256, out += 256, ctr += 16)
            y = aead_ctr16_ghash16_ymm(rk, hp, p, ctr, in, out, out - 256, y);
        y = aead_ghash_ymm(k, y, out - 256, 1);
    }
    secure_wipe(rk, sizeof(rk));
    return aead_ctr_ghash_blocks_ni(k, prefix, ctr, in, out, nblocks % 16, decrypt, y);
}

// The same on 512-bit registers (VAES, VPCLMULQDQ): each instruction works
// on four blocks, one per 128-bit lane, so a loop step takes 16 blocks.
#define AEAD_WIDE_TARGET "avx512f,avx512bw,vaes,vpclmulqdq,sse4.1,aes,pclmul"

// out = in XOR the keystream from counter ctr, for whole groups of 16 blocks;
// the counter is kept little-endian in each lane's last word and byte-swapped
// into a block, so one vector add steps four counters
__attribute__((target(AEAD_WIDE_TARGET)))
static inline void aead_ctr_blocks_wide(const AeadKey *k, const uint8_t prefix[12], uint32_t ctr, const uint8_t *in,
                                        uint8_t *out, size_t groups) {
    __m512i rk[15];
    for (int r = 0; r < 15; r++) rk[r] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k->round_keys[r]));
    uint32_t p[3];
    memcpy(p, prefix, 12);
    __m512i c = _mm512_set_epi32((int)(ctr + 3), (int)p[2], (int)p[1], (int)p[0], (int)(ctr + 2), (int)p[2], (int)p[1],
                                 (int)p[0], (int)(ctr + 1), (int)p[2], (int)p[1], (int)p[0], (int)ctr, (int)p[2],
                                 (int)p[1], (int)p[0]);
    const __m512i four = _mm512_set_epi32(4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0);
    const __m512i swap_last =
        _mm512_broadcast_i32x4(_mm_set_epi8(12, 13, 14, 15, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    for (; groups > 0; groups--, in += 256, out += 256) {
        __m512i b[4];
        for (int i = 0; i < 4; i++) {
            b[i] = _mm512_xor_si512(_mm512_shuffle_epi8(c, swap_last), rk[0]);
            c = _mm512_add_epi32(c, four);
        }
        for (int r = 1; r < 14; r++)
            for (int i = 0; i < 4; i++) b[i] = _mm512_aesenc_epi128(b[i], rk[r]);
        for (int i = 0; i < 4; i++) {
            b[i] = _mm512_aesenclast_epi128(b[i], rk[14]);
            _mm512_storeu_si512(out + 64 * i, _mm512_xor_si512(_mm512_loadu_si512(in + 64 * i), b[i]));
        }
    }
    secure_wipe(rk, sizeof(rk));
}

// GHASH over whole groups of 16 blocks, one reduction each:
// (y + X1) H^16 + X2 H^15 + ... + X16 H; lane l of vector t is block 4t + l
__attribute__((target(AEAD_WIDE_TARGET)))
static inline __m128i aead_ghash_wide(const AeadKey *k, __m128i y, const uint8_t *data, size_t groups) {
    const __m512i reverse = _mm512_broadcast_i32x4(_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i hp[4];  // H^(16-4t-l) in lane l of hp[t]
    for (int t = 0; t < 4; t++) {
        uint8_t lanes[64];
        for (int l = 0; l < 4; l++) memcpy(lanes + 16 * l, k->h_powers[15 - 4 * t - l], 16);
        hp[t] = _mm512_loadu_si512(lanes);
    }
    for (; groups > 0; groups--, data += 256) {
        __m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo;
        for (int t = 0; t < 4; t++) {
            __m512i x = _mm512_shuffle_epi8(_mm512_loadu_si512(data + 64 * t), reverse);
            if (t == 0) x = _mm512_xor_si512(x, _mm512_zextsi128_si512(y));
            lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, hp[t], 0x00));
            hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, hp[t], 0x11));
            mid = _mm512_xor_si512(mid, _mm512_xor_si512(_mm512_clmulepi64_epi128(x, hp[t], 0x01),
                                                         _mm512_clmulepi64_epi128(x, hp[t], 0x10)));
        }
        // the four lanes' sums are one sum: fold them, then reduce once
        __m128i l4[3];
        __m512i parts[3] = {lo, mid, hi};
        for (int q = 0; q < 3; q++) {
            __m256i half = _mm256_xor_si256(_mm512_castsi512_si256(parts[q]), _mm512_extracti64x4_epi64(parts[q], 1));
            l4[q] = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
        }
        y = aead_clmul_finish(l4[0], l4[1], l4[2]);
    }
    return y;
}
#endif

// ----------------------------------------------------------------------------
// which path runs: CPUID is asked once (secure.h's cpu_has)

// AES-NI and PCLMULQDQ, with the SSSE3 and SSE4.1 the code also uses; 0 off
// x86 (the portable code then runs)
static inline int aead_ask_aesni(void) {
    int yes = 0;
#if SECURE_HAVE_X86
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int pclmul = (c >> 1) & 1, ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1, aes = (c >> 25) & 1;
        yes = pclmul && ssse3 && sse41 && aes;
    }
#endif
    return yes;
}

static atomic_int aead_cpu_has_aesni;
static atomic_int aead_portable_forced;

static inline int aead_has_aesni(void) { return cpu_has(&aead_cpu_has_aesni, aead_ask_aesni); }

static inline void aead_force_portable(int on) {
    atomic_store_explicit(&aead_portable_forced, on != 0, memory_order_relaxed);
}

static inline int aead_use_aesni(void) {
    return !atomic_load_explicit(&aead_portable_forced, memory_order_relaxed) && aead_has_aesni();
}

// the 512-bit path: VAES and VPCLMULQDQ with AVX-512 (F, BW), and the OS
// saving the registers (XCR0: SSE, AVX and the three AVX-512 states)
static inline int aead_ask_vaes(void) {
    int yes = 0;
#if SECURE_HAVE_X86
    unsigned a, b, c, d;
    if (aead_has_aesni() && __get_cpuid(1, &a, &b, &c, &d) && ((c >> 27) & 1)) {
        unsigned xcr0_lo;  // the states above bit 31 (in edx) are not ours to check
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo) : "c"(0) : "edx");
        int os_saves = (xcr0_lo & 0xe6) == 0xe6;
        if (os_saves && __get_cpuid_count(7, 0, &a, &b, &c, &d))
            yes = ((b >> 16) & 1) && ((b >> 30) & 1) && ((c >> 9) & 1) && ((c >> 10) & 1);
    }
#endif
    return yes;
}

static atomic_int aead_cpu_has_vaes;
static atomic_int aead_narrow_forced;

static inline int aead_has_vaes(void) { return cpu_has(&aead_cpu_has_vaes, aead_ask_vaes); }

// the 256-bit path: VAES and VPCLMULQDQ with AVX2, and the OS saving the
// AVX registers (XCR0: SSE and AVX states)
static inline int aead_ask_vaes256(void) {
    int yes = 0;
#if SECURE_HAVE_X86
    unsigned a, b, c, d;
    if (aead_has_aesni() && __get_cpuid(1, &a, &b, &c, &d) && ((c >> 27) & 1) && ((c >> 28) & 1)) {
        unsigned xcr0_lo;
        __asm__ volatile("xgetbv" : "=a"(xcr0_lo) : "c"(0) : "edx");
        if ((xcr0_lo & 0x6) == 0x6 && __get_cpuid_count(7, 0, &a, &b, &c, &d))
            yes = ((b >> 5) & 1) && ((c >> 9) & 1) && ((c >> 10) & 1);
    }
#endif
    return yes;
}

static atomic_int aead_cpu_has_vaes256;
static atomic_int aead_avx2_forced;

static inline int aead_has_vaes256(void) { return cpu_has(&aead_cpu_has_vaes256, aead_ask_vaes256); }

// tests and benchmarks: 256-bit registers at most, where AVX-512's are there
static inline void aead_force_avx2(int on) {
    atomic_store_explicit(&aead_avx2_forced, on != 0, memory_order_relaxed);
}

// tests and benchmarks: AES-NI on 128-bit registers only, where VAES is there
static inline void aead_force_narrow(int on) {
    atomic_store_explicit(&aead_narrow_forced, on != 0, memory_order_relaxed);
}

static inline int aead_use_wide(void) {
    return aead_use_aesni() && !atomic_load_explicit(&aead_narrow_forced, memory_order_relaxed) &&
           !atomic_load_explicit(&aead_avx2_forced, memory_order_relaxed) && aead_has_vaes();
}

// 256-bit registers: where they are the widest the CPU (or a test) allows
static inline int aead_use_ymm(void) {
    return aead_use_aesni() && !atomic_load_explicit(&aead_narrow_forced, memory_order_relaxed) && !aead_use_wide() &&
           aead_has_vaes256();
}

static inline const char *aead_impl_name(void) {
    return aead_use_wide() ? "vaes-512" : aead_use_ymm() ? "vaes-256" : aead_use_aesni() ? "aes-ni" : "portable";
}

// ----------------------------------------------------------------------------
// AES-256-GCM on one buffer

static inline void aead_aes_one(const AeadKey *k, const uint8_t in[16], uint8_t out[16]) {
#if SECURE_HAVE_X86
    if (aead_use_aesni()) {
        aead_aes_one_ni(k, in, out);
        return;
    }
#endif
    aead_aes_block_portable(k, in, out);
}

// the key schedule and H = AES_K(0^128); the AES-NI path reads the same
// schedule (its round keys are FIPS 197's bytes), and keeps powers of H
static inline void aead_init(AeadKey *k, const uint8_t key[32]) {
    memset(k, 0, sizeof(*k));
    aead_expand_key(k->round_keys, key);
    uint8_t zero[16] = {0}, h[16];
    aead_aes_block_portable(k, zero, h);
    k->h_hi = aead_load_be64(h);
    k->h_lo = aead_load_be64(h + 8);
    uint64_t p_hi = k->h_hi, p_lo = k->h_lo;
    for (int j = 0; j < 24; j++) {
        aead_store_be64(k->h_squares[j], p_hi);
        aead_store_be64(k->h_squares[j] + 8, p_lo);
        aead_gf_mul_portable(p_hi, p_lo, p_hi, p_lo, &p_hi, &p_lo);
    }
#if SECURE_HAVE_X86
    if (aead_has_aesni()) aead_ghash_powers_ni(k);
#endif
    secure_wipe(h, sizeof(h));
}

static inline void aead_wipe(AeadKey *k) { secure_wipe(k, sizeof(*k)); }

// J0, GCM's first counter block: a 12-byte iv followed by the counter 1;
// any other length hashed (GHASH of the iv, padded, and its bit length)
static inline void aead_j0(const AeadKey *k, const uint8_t *iv, size_t ivlen, uint8_t j0[16]);

// out = in XOR the keystream of the message whose first counter block is
// j0, from byte `offset` of the message on: counter block j0 + 1 + offset/16
// (j0 itself makes the tag; only its last 32 bits count up, mod 2^32). Any
// offset and length, so a writer may encrypt its own slice of a message.
static inline void aead_ctr_j0(const AeadKey *k, const uint8_t j0[16], uint64_t offset, const void *in, void *out,
                               size_t len) {
    const uint8_t *src = (const uint8_t *)in;
    uint8_t *dst = (uint8_t *)out, block[16], stream[16];
    memcpy(block, j0, 12);
    uint32_t ctr = (uint32_t)aead_load_be64(j0 + 8) + 1 + (uint32_t)(offset / 16);
    size_t skip = (size_t)(offset % 16);
    if (skip != 0 && len > 0) {  // the rest of a block begun before offset
        put_u32(block + 12, __builtin_bswap32(ctr++));
        aead_aes_one(k, block, stream);
        size_t n = 16 - skip < len ? 16 - skip : len;
        for (size_t i = 0; i < n; i++) dst[i] = src[i] ^ stream[skip + i];
        src += n; dst += n; len -= n;
    }
    size_t whole = len / 16;
#if SECURE_HAVE_X86
    if (aead_use_aesni()) {
        size_t groups = aead_use_wide() || aead_use_ymm() ? whole / 16 : 0;
        if (groups > 0 && aead_use_wide()) aead_ctr_blocks_wide(k, j0, ctr, src, dst, groups);
        else if (groups > 0) aead_ctr_blocks_ymm(k, j0, ctr, src, dst, groups);
        aead_ctr_blocks_ni(k, j0, ctr + (uint32_t)(16 * groups), src + 256 * groups, dst + 256 * groups,
                           whole - 16 * groups);
    } else
#endif
    {
        for (size_t b = 0; b < whole; b++) {
            put_u32(block + 12, __builtin_bswap32(ctr + (uint32_t)b));
            aead_aes_block_portable(k, block, stream);
            for (int i = 0; i < 16; i++) dst[16 * b + i] = src[16 * b + i] ^ stream[i];
        }
    }
    ctr += (uint32_t)whole; src += 16 * whole; dst += 16 * whole; len -= 16 * whole;
    if (len > 0) {
        put_u32(block + 12, __builtin_bswap32(ctr));
        aead_aes_one(k, block, stream);
        for (size_t i = 0; i < len; i++) dst[i] = src[i] ^ stream[i];
    }
    secure_wipe(stream, sizeof(stream));
}

// y (GHASH's state, as GCM's bytes) carried over data's blocks, the last
// one zero-padded: y = (y + X) H for each block X in turn
static inline void aead_ghash_update(const AeadKey *k, uint8_t y[16], const uint8_t *data, size_t len) {
    uint8_t tail[16] = {0};
    size_t blocks = len / 16;
    if (len % 16 != 0) memcpy(tail, data + 16 * blocks, len % 16);
#if SECURE_HAVE_X86
    if (aead_use_aesni()) {
        __m128i s = aead_byte_reverse(_mm_loadu_si128((const __m128i *)y));
        size_t groups = aead_use_wide() || aead_use_ymm() ? blocks / 16 : 0;
        if (groups > 0 && aead_use_wide()) s = aead_ghash_wide(k, s, data, groups);
        else if (groups > 0) s = aead_ghash_ymm(k, s, data, groups);
        s = aead_ghash_ni(k, s, data + 256 * groups, blocks - 16 * groups);
        if (len % 16 != 0) s = aead_ghash_ni(k, s, tail, 1);
        _mm_storeu_si128((__m128i *)y, aead_byte_reverse(s));
        return;
    }
#endif
    uint64_t y_hi = aead_load_be64(y), y_lo = aead_load_be64(y + 8);
    for (size_t b = 0; b < blocks; b++) aead_ghash_block_portable(k, &y_hi, &y_lo, data + 16 * b);
    if (len % 16 != 0) aead_ghash_block_portable(k, &y_hi, &y_lo, tail);
    aead_store_be64(y, y_hi);
    aead_store_be64(y + 8, y_lo);
}

// y = y * H^e (GCM's bytes), for 0 <= e < 2^24: a product per bit of e.
// A writer that hashes a middle part of a message on its own (a slice of a
// sealed file's chunk) moves its sum to where that part ends up with it.
static inline void aead_ghash_times_hpow(const AeadKey *k, uint8_t y[16], uint64_t e) {
    uint64_t y_hi = aead_load_be64(y), y_lo = aead_load_be64(y + 8);
    for (int j = 0; j < 24 && e != 0; j++, e >>= 1)
        if (e & 1) aead_gf_mul_portable(y_hi, y_lo, aead_load_be64(k->h_squares[j]), aead_load_be64(k->h_squares[j] + 8),
                                        &y_hi, &y_lo);
    aead_store_be64(y, y_hi);
    aead_store_be64(y + 8, y_lo);
}

// GHASH of aad and ct (each zero-padded to whole blocks) and the block of
// their bit lengths; out is the hash as GCM's bytes
static inline void aead_ghash(const AeadKey *k, const uint8_t *aad, size_t aadlen, const uint8_t *ct, size_t len,
                              uint8_t out[16]) {
    uint8_t lens[16];
    aead_store_be64(lens, (uint64_t)aadlen * 8);
    aead_store_be64(lens + 8, (uint64_t)len * 8);
    memset(out, 0, 16);
    aead_ghash_update(k, out, aad, aadlen);
    aead_ghash_update(k, out, ct, len);
    aead_ghash_update(k, out, lens, 16);
}

// out = in XOR the keystream of message j0 from byte `offset` on, as
// aead_ctr_j0, and y (GHASH's state, GCM's bytes) carried over the
// ciphertext (in when decrypting, out when encrypting) as its blocks sit in
// the message: a block the bytes fill only partly is hashed with zeros in
// the rest of it. From offset 0 that is aead_ghash_update over the
// ciphertext; GHASH being linear, the parts of a message hashed apart, each
// moved to its place (aead_ghash_times_hpow), add up to the whole's. The
// AES-NI path makes both in one pass, stitched (aead_ctr_ghash_blocks_ni);
// the others take 16 KiB at a time through CTR and then GHASH, in cache.
static inline void aead_ctr_ghash_j0(const AeadKey *k, const uint8_t j0[16], uint64_t offset, const void *in,
                                     void *out, size_t len, int decrypt, uint8_t y[16]) {
    const uint8_t *src = (const uint8_t *)in;
    uint8_t *dst = (uint8_t *)out, block[16];
    size_t skip = (size_t)(offset % 16);
    if (skip != 0 && len > 0) {  // the rest of a block begun before offset
        size_t n = 16 - skip < len ? 16 - skip : len;
        memset(block, 0, 16);
        if (decrypt) memcpy(block + skip, src, n);
        aead_ctr_j0(k, j0, offset, src, dst, n);
        if (!decrypt) memcpy(block + skip, dst, n);
        aead_ghash_update(k, y, block, 16);
        src += n; dst += n; offset += n; len -= n;
    }
    size_t whole = len / 16 * 16;
#if SECURE_HAVE_X86
    if (aead_use_aesni() && !aead_use_wide()) {
        uint32_t ctr = (uint32_t)aead_load_be64(j0 + 8) + 1 + (uint32_t)(offset / 16);
        __m128i s = aead_byte_reverse(_mm_loadu_si128((const __m128i *)y));
        s = aead_use_ymm() ? aead_ctr_ghash_blocks_ymm(k, j0, ctr, src, dst, whole / 16, decrypt, s)
                           : aead_ctr_ghash_blocks_ni(k, j0, ctr, src, dst, whole / 16, decrypt, s);
        _mm_storeu_si128((__m128i *)y, aead_byte_reverse(s));
    } else
#endif
    {
        for (size_t done = 0; done < whole;) {
            size_t n = whole - done < 16384 ? whole - done : 16384;
            if (decrypt) aead_ghash_update(k, y, src + done, n);
            aead_ctr_j0(k, j0, offset + done, src + done, dst + done, n);
            if (!decrypt) aead_ghash_update(k, y, dst + done, n);
            done += n;
        }
    }
    src += whole; dst += whole; offset += whole; len -= whole;
    if (len > 0) {  // a last block, partly filled
        memset(block, 0, 16);
        if (decrypt) memcpy(block, src, len);
        aead_ctr_j0(k, j0, offset, src, dst, len);
        if (!decrypt) memcpy(block, dst, len);
        aead_ghash_update(k, y, block, 16);
    }
    secure_wipe(block, sizeof(block));
}

static inline void aead_j0(const AeadKey *k, const uint8_t *iv, size_t ivlen, uint8_t j0[16]) {
    if (ivlen == 12) {
        memcpy(j0, iv, 12);
        put_u32(j0 + 12, __builtin_bswap32(1));
        return;
    }
    aead_ghash(k, NULL, 0, iv, ivlen, j0);  // no aad: the length block is 0 || the iv's bits, as J0 wants
}

// the tag of ciphertext ct: GHASH XOR AES_K(J0)
static inline void aead_tag_j0(const AeadKey *k, const uint8_t j0[16], const void *aad, size_t aadlen, const void *ct,
                               size_t len, uint8_t tag[16]) {
    uint8_t mask[16];
    aead_ghash(k, (const uint8_t *)aad, aadlen, (const uint8_t *)ct, len, tag);
    aead_aes_one(k, j0, mask);
    for (int i = 0; i < 16; i++) tag[i] ^= mask[i];
}

// the two halves with a nonce (iv of ivlen bytes; 12 is GCM's usual and
// the only one sealed files use)
static inline void aead_ctr(const AeadKey *k, const uint8_t *iv, size_t ivlen, uint64_t offset, const void *in,
                            void *out, size_t len) {
    uint8_t j0[16];
    aead_j0(k, iv, ivlen, j0);
    aead_ctr_j0(k, j0, offset, in, out, len);
}

static inline void aead_tag(const AeadKey *k, const uint8_t *iv, size_t ivlen, const void *aad, size_t aadlen,
                            const void *ct, size_t len, uint8_t tag[16]) {
    uint8_t j0[16];
    aead_j0(k, iv, ivlen, j0);
    aead_tag_j0(k, j0, aad, aadlen, ct, len, tag);
}

// GCM's tag from y, the GHASH state after aad and ciphertext: the length
// block folded in, then XOR AES_K(J0)
static inline void aead_tag_finish(const AeadKey *k, const uint8_t j0[16], uint8_t y[16], size_t aadlen, size_t len,
                                   uint8_t tag[16]) {
    uint8_t lens[16], mask[16];
    aead_store_be64(lens, (uint64_t)aadlen * 8);
    aead_store_be64(lens + 8, (uint64_t)len * 8);
    aead_ghash_update(k, y, lens, 16);
    aead_aes_one(k, j0, mask);
    for (int i = 0; i < 16; i++) tag[i] = y[i] ^ mask[i];
}

// encrypt and tag in one pass over the data (aead_ctr_ghash_j0)
static inline void aead_seal(const AeadKey *k, const uint8_t *iv, size_t ivlen, const void *aad, size_t aadlen,
                             const void *in, void *out, size_t len, uint8_t tag[16]) {
    uint8_t j0[16], y[16] = {0};
    aead_j0(k, iv, ivlen, j0);
    aead_ghash_update(k, y, (const uint8_t *)aad, aadlen);
    aead_ctr_ghash_j0(k, j0, 0, in, out, len, 0, y);
    aead_tag_finish(k, j0, y, aadlen, len, tag);
}

// 0 and the plaintext in out when the tag holds; else -1 and out zeroed
// (nothing unauthenticated escapes). in and out may be the same buffer.
// One pass decrypts into out and hashes the ciphertext as it goes; the
// plaintext stays in out, the caller's, only once the tag is found good.
static inline int aead_open(const AeadKey *k, const uint8_t *iv, size_t ivlen, const void *aad, size_t aadlen,
                            const void *in, void *out, size_t len, const uint8_t tag[16]) {
    uint8_t j0[16], y[16] = {0}, want[16];
    aead_j0(k, iv, ivlen, j0);
    aead_ghash_update(k, y, (const uint8_t *)aad, aadlen);
    aead_ctr_ghash_j0(k, j0, 0, in, out, len, 1, y);
    aead_tag_finish(k, j0, y, aadlen, len, want);
    if (!tag_equal(want, 16, tag, 16)) {
        memset(out, 0, len);
        return -1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Sealed files. doc/formats.md has the layout; in short:
//   header (64 bytes) | ciphertext (plain_bytes) | tags (16 bytes per chunk)
// The ciphertext sits where the plaintext would, shifted by the header, so
// a writer may encrypt and write any slice on its own (every rank its part
// of a checkpoint); the tags, one per chunk, are made once the whole
// ciphertext is in, from the writers' GHASH shares (aead_file_ctr_sums,
// aead_file_tags_from_sums: checkpoint.h) or from the file read back
// (aead_file_write_tags, which the tests check them against). Chunk i (chunk_bytes of the
// plaintext, the last one shorter; an empty file has one empty chunk) is
// AES-256-GCM with
//   nonce = file_id (8 bytes, little-endian) || i (4 bytes, little-endian)
//   aad   = the 64-byte header || i (8 bytes) || 1 if it is the last chunk, else 0 (8 bytes)
// so a changed header, a chunk moved within the file or from another file,
// and a file cut short at a chunk boundary all fail a tag.

#define AEAD_FILE_MAGIC "llm3dgcm"
#define AEAD_FILE_VERSION 1
#define AEAD_FILE_HEADER_BYTES 64
#define AEAD_FILE_AAD_BYTES 80
#define AEAD_FILE_CHUNK_BYTES (1u << 20)
#define AEAD_FILE_MAX_CHUNK_BYTES (64u << 20)
#define AEAD_FILE_MAX_CHUNKS (1ull << 32)
// HMAC-SHA256 labels: the cipher key is HMAC(key, KEY_LABEL), so it is never
// the key that seals manifests and messages; its id is the first 8 bytes of
// HMAC(cipher key, KEY_ID_LABEL), which tells "another key" from "damaged"
#define AEAD_FILE_KEY_LABEL "llm3d at-rest AES-256-GCM key 1"
#define AEAD_FILE_KEY_ID_LABEL "llm3d at-rest key id 1"

typedef struct { AeadKey aes; uint64_t key_id; } AeadFileKey;

typedef struct {
    uint8_t header[AEAD_FILE_HEADER_BYTES];
    uint64_t plain_bytes, chunk_bytes, chunks, file_id;
} AeadFile;

static inline void aead_file_key(AeadFileKey *fk, const uint8_t key[32]) {
    uint8_t cipher_key[32], id[32];
    hmac_sha256(key, 32, AEAD_FILE_KEY_LABEL, strlen(AEAD_FILE_KEY_LABEL), cipher_key);
    hmac_sha256(cipher_key, 32, AEAD_FILE_KEY_ID_LABEL, strlen(AEAD_FILE_KEY_ID_LABEL), id);
    aead_init(&fk->aes, cipher_key);
    fk->key_id = get_u64(id);
    secure_wipe(cipher_key, sizeof(cipher_key));
}

static inline void aead_file_key_wipe(AeadFileKey *fk) { secure_wipe(fk, sizeof(*fk)); }

static inline uint64_t aead_file_chunk_count(uint64_t plain_bytes, uint64_t chunk_bytes) {
    return plain_bytes == 0 ? 1 : (plain_bytes + chunk_bytes - 1) / chunk_bytes;
}

// the sealed file's size for plain_bytes of plaintext
static inline uint64_t aead_file_bytes(uint64_t plain_bytes, uint64_t chunk_bytes) {
    return AEAD_FILE_HEADER_BYTES + plain_bytes + AEAD_TAG_BYTES * aead_file_chunk_count(plain_bytes, chunk_bytes);
}

// whether the first bytes of a file say it is sealed
static inline int aead_file_is_sealed(const void *first, size_t n) {
    return n >= 8 && memcmp(first, AEAD_FILE_MAGIC, 8) == 0;
}

static inline int aead_check_chunk_bytes(uint64_t chunk_bytes, const char *path, char *err, size_t errlen) {
    if (chunk_bytes < 16 || chunk_bytes > AEAD_FILE_MAX_CHUNK_BYTES || chunk_bytes % 16 != 0)
        return errorf(err, errlen, "%s: sealed file header field chunk_bytes = %llu: expected a multiple of 16 from 16 "
                      "to %u", path, (unsigned long long)chunk_bytes, AEAD_FILE_MAX_CHUNK_BYTES);
    return 0;
}

// a new file's header: a fresh random file id, so no two files (the same
// checkpoint written again included) share a nonce
static inline int aead_file_new(AeadFile *f, const AeadFileKey *k, uint64_t plain_bytes, uint64_t chunk_bytes,
                                const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    if (aead_check_chunk_bytes(chunk_bytes, path, err, errlen) != 0) return -1;
    if (aead_file_chunk_count(plain_bytes, chunk_bytes) > AEAD_FILE_MAX_CHUNKS)
        return errorf(err, errlen, "%s: %llu bytes in chunks of %llu: more than 2^32 chunks", path,
                      (unsigned long long)plain_bytes, (unsigned long long)chunk_bytes);
    uint8_t id[8];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        return errorf(err, errlen, "%s: getrandom for the file id: %s", path, strerror(errno));
    f->plain_bytes = plain_bytes;
    f->chunk_bytes = chunk_bytes;
    f->chunks = aead_file_chunk_count(plain_bytes, chunk_bytes);
    f->file_id = get_u64(id);
    memcpy(f->header, AEAD_FILE_MAGIC, 8);
    put_u32(f->header + 8, AEAD_FILE_VERSION);
    put_u32(f->header + 12, (uint32_t)chunk_bytes);
    put_u64(f->header + 16, plain_bytes);
    put_u64(f->header + 24, f->file_id);
    put_u64(f->header + 32, k->key_id);
    return 0;
}

// reads a header back: every field checked, and the file's size against it
// (file_size: what fstat says). The tags vouch for the header later.
static inline int aead_file_parse(AeadFile *f, const AeadFileKey *k, const uint8_t h[AEAD_FILE_HEADER_BYTES],
                                  uint64_t file_size, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof(*f));
    if (!aead_file_is_sealed(h, 8)) return errorf(err, errlen, "%s: header field magic: not a sealed file", path);
    if (get_u32(h + 8) != AEAD_FILE_VERSION)
        return errorf(err, errlen, "%s: sealed file header field version = %u, expected %d", path, get_u32(h + 8),
                      AEAD_FILE_VERSION);
    if (aead_check_chunk_bytes(get_u32(h + 12), path, err, errlen) != 0) return -1;
    for (int i = 40; i < AEAD_FILE_HEADER_BYTES; i++)
        if (h[i] != 0)
            return errorf(err, errlen, "%s: sealed file header byte %d = %u, expected 0 (reserved)", path, i, h[i]);
    if (get_u64(h + 32) != k->key_id)
        return errorf(err, errlen, "%s: sealed file header field key_id = %016llx, but the key in use has id %016llx: "
                      "sealed with another key (pass that key with --key-file)", path,
                      (unsigned long long)get_u64(h + 32), (unsigned long long)k->key_id);
    memcpy(f->header, h, AEAD_FILE_HEADER_BYTES);
    f->chunk_bytes = get_u32(h + 12);
    f->plain_bytes = get_u64(h + 16);
    f->file_id = get_u64(h + 24);
    if (f->plain_bytes > (1ull << 56))
        return errorf(err, errlen, "%s: sealed file header field plain_bytes = %llu: too large", path,
                      (unsigned long long)f->plain_bytes);
    f->chunks = aead_file_chunk_count(f->plain_bytes, f->chunk_bytes);
    if (f->chunks > AEAD_FILE_MAX_CHUNKS)
        return errorf(err, errlen, "%s: sealed file header: plain_bytes = %llu in chunks of %llu: over 2^32 chunks", path,
                      (unsigned long long)f->plain_bytes, (unsigned long long)f->chunk_bytes);
    uint64_t want = aead_file_bytes(f->plain_bytes, f->chunk_bytes);
    if (file_size != want)
        return errorf(err, errlen, "%s: %llu bytes, but its header (plain_bytes = %llu, chunk_bytes = %llu) needs %llu: "
                      "truncated or extended", path, (unsigned long long)file_size, (unsigned long long)f->plain_bytes,
                      (unsigned long long)f->chunk_bytes, (unsigned long long)want);
    return 0;
}

// chunk i's first counter block (J0: the nonce and the counter 1) and AAD
static inline void aead_file_j0(const AeadFile *f, uint64_t i, uint8_t j0[16]) {
    put_u64(j0, f->file_id);
    put_u32(j0 + 8, (uint32_t)i);
    put_u32(j0 + 12, __builtin_bswap32(1));
}

static inline void aead_file_aad(const AeadFile *f, uint64_t i, uint8_t aad[AEAD_FILE_AAD_BYTES]) {
    memcpy(aad, f->header, AEAD_FILE_HEADER_BYTES);
    put_u64(aad + 64, i);
    put_u64(aad + 72, i + 1 == f->chunks);
}

static inline uint64_t aead_file_chunk_len(const AeadFile *f, uint64_t i) {
    uint64_t start = i * f->chunk_bytes;
    return f->plain_bytes - start < f->chunk_bytes ? f->plain_bytes - start : f->chunk_bytes;
}

// out = in encrypted (or decrypted: CTR is its own inverse) as the bytes
// [offset, offset + len) of the file's plaintext, across chunk boundaries
static inline void aead_file_ctr(const AeadFile *f, const AeadFileKey *k, uint64_t offset, const void *in, void *out,
                                 size_t len) {
    const uint8_t *src = (const uint8_t *)in;
    uint8_t *dst = (uint8_t *)out, j0[16];
    while (len > 0) {
        uint64_t i = offset / f->chunk_bytes, within = offset % f->chunk_bytes;
        size_t n = f->chunk_bytes - within < len ? (size_t)(f->chunk_bytes - within) : len;
        aead_file_j0(f, i, j0);
        aead_ctr_j0(&k->aes, j0, within, src, dst, n);
        src += n; dst += n; offset += n; len -= n;
    }
}

static inline void aead_file_chunk_tag(const AeadFile *f, const AeadFileKey *k, uint64_t i, const uint8_t *ct,
                                       uint8_t tag[16]) {
    uint8_t j0[16], aad[AEAD_FILE_AAD_BYTES];
    aead_file_j0(f, i, j0);
    aead_file_aad(f, i, aad);
    aead_tag_j0(&k->aes, j0, aad, sizeof(aad), ct, (size_t)aead_file_chunk_len(f, i), tag);
}

// chunk i in place: 0 when its tag holds (buf then plaintext), else -1 with
// err naming the file and the chunk (buf then zeros). One pass decrypts and
// hashes the ciphertext (aead_ctr_ghash_j0); a chunk whose tag fails leaves
// nothing of its plaintext behind.
static inline int aead_file_open_chunk(const AeadFile *f, const AeadFileKey *k, uint64_t i, uint8_t *buf,
                                       const uint8_t tag[16], const char *path, char *err, size_t errlen) {
    uint8_t want[16], j0[16], aad[AEAD_FILE_AAD_BYTES], y[16] = {0};
    size_t len = (size_t)aead_file_chunk_len(f, i);
    aead_file_j0(f, i, j0);
    aead_file_aad(f, i, aad);
    aead_ghash_update(&k->aes, y, aad, sizeof(aad));
    aead_ctr_ghash_j0(&k->aes, j0, 0, buf, buf, len, 1, y);
    aead_tag_finish(&k->aes, j0, y, sizeof(aad), len, want);
    if (!tag_equal(want, 16, tag, 16)) {
        memset(buf, 0, len);
        return errorf(err, errlen, "%s: chunk %llu of %llu (plaintext bytes %llu..%llu): tag does not match: the file "
                      "was changed, cut short or reordered", path, (unsigned long long)i, (unsigned long long)f->chunks,
                      (unsigned long long)(i * f->chunk_bytes), (unsigned long long)(i * f->chunk_bytes + len));
    }
    return 0;
}

// GHASH shares: a writer that encrypts only some bytes of a chunk (a rank's
// slice of a checkpoint) hashes them as it encrypts, while they are in
// cache, and adds its share into sums[16 i], chunk i's; with every writer's
// sums added (XOR), aead_file_tags_from_sums makes the tags without reading
// the file back. GHASH is linear in the ciphertext: chunk i's hash is
//   A H^(n+1) + C_0 H^n + ... + C_(n-1) H + L H
// (A: the AAD's hash, C_b: its n ciphertext blocks, zero-padded, L: the
// lengths), so a share is the sum of its blocks' C_b H^(n-b), each block
// zero outside the bytes written, and shares of disjoint bytes add up.
// counts[i] counts the bytes of chunk i written, so that whoever adds the
// shares up can check that every byte was written exactly once (two writers
// of the same bytes would cancel their shares; a byte nobody wrote would be
// missing from the hash, and decrypt to garbage).
//
// A share is secret: with the ciphertext beside it, it is a polynomial in H
// with known coefficients, and two of them give H, with which anyone forges
// a tag of any file under this key. It must never be written, nor sent, as
// it is (checkpoint.h masks it before it leaves a rank); this code wipes
// the copies it makes.

// out = in encrypted as plaintext bytes [offset, offset + len) of the file
// (aead_file_ctr), each chunk's share added into sums and the bytes into
// counts (NULL: not counted)
static inline void aead_file_ctr_sums(const AeadFile *f, const AeadFileKey *k, uint64_t offset, const void *in,
                                      void *out, size_t len, uint8_t *sums, uint64_t *counts) {
    const uint8_t *src = (const uint8_t *)in;
    uint8_t *dst = (uint8_t *)out, j0[16], y[16];
    while (len > 0) {
        uint64_t i = offset / f->chunk_bytes, within = offset % f->chunk_bytes;
        size_t n = f->chunk_bytes - within < len ? (size_t)(f->chunk_bytes - within) : len;
        memset(y, 0, 16);
        aead_file_j0(f, i, j0);
        aead_ctr_ghash_j0(&k->aes, j0, within, src, dst, n, 0, y);
        // y = sum C_b H^(last - b + 1) over the blocks written; the share wants H^(blocks - b)
        uint64_t blocks = (aead_file_chunk_len(f, i) + 15) / 16, last = (within + n - 1) / 16;
        aead_ghash_times_hpow(&k->aes, y, blocks - 1 - last);
        for (int b = 0; b < 16; b++) sums[16 * i + b] ^= y[b];
        if (counts != NULL) counts[i] += n;
        src += n; dst += n; offset += n; len -= n;
    }
    secure_wipe(y, sizeof(y));
}

// the tag table (16 bytes per chunk) from the sums of every writer's shares
static inline void aead_file_tags_from_sums(const AeadFile *f, const AeadFileKey *k, const uint8_t *sums,
                                            uint8_t *tags) {
    for (uint64_t i = 0; i < f->chunks; i++) {
        uint8_t j0[16], aad[AEAD_FILE_AAD_BYTES], y[16] = {0};
        uint64_t len = aead_file_chunk_len(f, i);
        aead_file_j0(f, i, j0);
        aead_file_aad(f, i, aad);
        aead_ghash_update(&k->aes, y, aad, sizeof(aad));
        aead_ghash_times_hpow(&k->aes, y, (len + 15) / 16);
        for (int b = 0; b < 16; b++) y[b] ^= sums[16 * i + b];
        aead_tag_finish(&k->aes, j0, y, sizeof(aad), (size_t)len, tags + AEAD_TAG_BYTES * i);
        secure_wipe(y, sizeof(y));  // the chunk's whole GHASH: with its tag, E_K(J0) and then H
    }
}

// opens the sealed file at fd: header read, checked, and the size; 0 or -1
static inline int aead_file_read_header(int fd, AeadFile *f, const AeadFileKey *k, const char *path, char *err,
                                        size_t errlen) {
    uint8_t h[AEAD_FILE_HEADER_BYTES];
    struct stat st;
    if (fstat(fd, &st) != 0) return errorf(err, errlen, "%s: stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return errorf(err, errlen, "%s: not a regular file", path);
    if ((uint64_t)st.st_size < AEAD_FILE_HEADER_BYTES || pread_all(fd, h, sizeof(h), 0) != 0)
        return errorf(err, errlen, "%s: %lld bytes: shorter than a sealed file's %d-byte header", path,
                      (long long)st.st_size, AEAD_FILE_HEADER_BYTES);
    return aead_file_parse(f, k, h, (uint64_t)st.st_size, path, err, errlen);
}

// writes plaintext bytes [offset, offset + n) of the file at fd, encrypted,
// through bounce (bounce_bytes), and with sums (not NULL) each chunk's GHASH
// share of them added there and the bytes into counts (aead_file_ctr_sums).
// The bounce buffer then holds ciphertext only. One thread: CTR runs at
// several GB/s, and more threads would spend the writes between their turns
// waiting, which OpenMP's waiting threads do spinning, at a CPU's cost. 0,
// or -1 with errno.
static inline int aead_file_pwrite(int fd, const AeadFile *f, const AeadFileKey *k, const void *plain, size_t n,
                                   uint64_t offset, uint8_t *bounce, size_t bounce_bytes, uint8_t *sums,
                                   uint64_t *counts) {
    const uint8_t *src = (const uint8_t *)plain;
    for (size_t done = 0; done < n;) {
        size_t len = n - done < bounce_bytes ? n - done : bounce_bytes;
        if (sums != NULL) aead_file_ctr_sums(f, k, offset + done, src + done, bounce, len, sums, counts);
        else aead_file_ctr(f, k, offset + done, src + done, bounce, len);
        if (pwrite_all(fd, bounce, len, AEAD_FILE_HEADER_BYTES + offset + done) != 0) return -1;
        done += len;
    }
    return 0;
}

// the chunk tags of the sealed file f at fd, into the table at its end, and
// with sha the SHA-256 of the whole file (header, ciphertext, tags) for a
// manifest. Each chunk comes either from plain, encrypted in memory and
// written (the file written front to back from one buffer), or, when plain
// is NULL, read back from the file (its ciphertext is in already; checkpoints
// make their tags from their writers' shares instead, and never read back). One thread does it all, chunk by chunk: SHA-256 runs in
// file order anyway and is the slower half (GHASH is about 5 times faster),
// and other threads would only wait for it, which OpenMP's waiting threads
// do spinning, at a CPU's cost. 0 or an errno.
static inline int aead_file_seal_chunks(int fd, const AeadFile *f, const AeadFileKey *k, const uint8_t *plain,
                                        uint8_t sha[32]) {
    size_t table_bytes = (size_t)f->chunks * AEAD_TAG_BYTES;
    uint8_t *tags = (uint8_t *)malloc(table_bytes), *buf = (uint8_t *)malloc((size_t)f->chunk_bytes);
    int e = tags == NULL || buf == NULL ? ENOMEM : 0;
    Sha256 hash;
    sha256_init(&hash);
    if (sha != NULL) sha256_update(&hash, f->header, AEAD_FILE_HEADER_BYTES);
    for (uint64_t i = 0; i < f->chunks && e == 0; i++) {
        size_t len = (size_t)aead_file_chunk_len(f, i);
        uint64_t at = AEAD_FILE_HEADER_BYTES + i * f->chunk_bytes;
        if (plain != NULL) {  // encrypted and hashed in one pass (aead_ctr_ghash_j0)
            uint8_t j0[16], aad[AEAD_FILE_AAD_BYTES], y[16] = {0};
            aead_file_j0(f, i, j0);
            aead_file_aad(f, i, aad);
            aead_ghash_update(&k->aes, y, aad, sizeof(aad));
            aead_ctr_ghash_j0(&k->aes, j0, 0, plain + i * f->chunk_bytes, buf, len, 0, y);
            aead_tag_finish(&k->aes, j0, y, sizeof(aad), len, tags + AEAD_TAG_BYTES * i);
            if (pwrite_all(fd, buf, len, at) != 0) e = errno;
        } else if (pread_all(fd, buf, len, at) == 0) {
            aead_file_chunk_tag(f, k, i, buf, tags + AEAD_TAG_BYTES * i);
        } else {
            e = errno;
        }
        if (e != 0) break;
        if (sha != NULL) sha256_update(&hash, buf, len);
    }
    if (e == 0 && pwrite_all(fd, tags, table_bytes, AEAD_FILE_HEADER_BYTES + f->plain_bytes) != 0) e = errno;
    if (e == 0 && sha != NULL) {
        sha256_update(&hash, tags, table_bytes);
        sha256_final(&hash, sha);
    }
    free(tags);
    free(buf);
    return e;
}

// once all the ciphertext is in: each chunk's tag, from the bytes on disk,
// into the table at the end; with sha the file's SHA-256 from the same read
static inline int aead_file_write_tags(int fd, const AeadFile *f, const AeadFileKey *k, uint8_t sha[32],
                                       const char *path, char *err, size_t errlen) {
    int e = aead_file_seal_chunks(fd, f, k, NULL, sha);
    return e == 0 ? 0 : errorf(err, errlen, "%s: sealing the chunks: %s", path, strerror(e));
}

// the whole file from one buffer, front to back in one pass: the header,
// then each chunk encrypted in memory, written and tagged (and, with sha,
// hashed) from there, then the tag table. Nothing is read back, as
// aead_file_write_tags must for a file that several writers filled. The
// file at fd is empty, open for writing; fsync and close are the caller's.
static inline int aead_file_write_all(int fd, const AeadFileKey *k, const void *plain, uint64_t n,
                                      uint64_t chunk_bytes, uint8_t sha[32], const char *path, char *err,
                                      size_t errlen) {
    AeadFile f;
    if (aead_file_new(&f, k, n, chunk_bytes, path, err, errlen) != 0) return -1;
    int e = pwrite_all(fd, f.header, AEAD_FILE_HEADER_BYTES, 0) != 0 ? errno : 0;
    if (e == 0) e = aead_file_seal_chunks(fd, &f, k, (const uint8_t *)plain, sha);
    return e == 0 ? 0 : errorf(err, errlen, "%s: write: %s", path, strerror(e));
}

// chunk i of the sealed file at fd and its tag read into buf (chunk_bytes),
// checked and decrypted there: 0, or -1 with err naming the chunk
static inline int aead_file_read_chunk(int fd, const AeadFile *f, const AeadFileKey *k, uint64_t i, uint8_t *buf,
                                       const char *path, char *err, size_t errlen) {
    uint8_t tag[16];
    size_t len = (size_t)aead_file_chunk_len(f, i);
    if (pread_all(fd, buf, len, AEAD_FILE_HEADER_BYTES + i * f->chunk_bytes) != 0 ||
        pread_all(fd, tag, 16, AEAD_FILE_HEADER_BYTES + f->plain_bytes + AEAD_TAG_BYTES * i) != 0)
        return errorf(err, errlen, "%s: read chunk %llu: %s", path, (unsigned long long)i, strerror(errno));
    return aead_file_open_chunk(f, k, i, buf, tag, path, err, errlen);
}

// plaintext bytes [offset, offset + n) of the sealed file at fd into out:
// every chunk they touch read and checked whole, one at a time, through
// chunk_buf (chunk_bytes); -1 with err naming the chunk when a tag fails
static inline int aead_file_read_range(int fd, const AeadFile *f, const AeadFileKey *k, uint64_t offset, uint64_t n,
                                       void *out, uint8_t *chunk_buf, const char *path, char *err, size_t errlen) {
    if (offset > f->plain_bytes || n > f->plain_bytes - offset)
        return errorf(err, errlen, "%s: bytes %llu..%llu: past the plaintext's %llu", path, (unsigned long long)offset,
                      (unsigned long long)(offset + n), (unsigned long long)f->plain_bytes);
    uint8_t *dst = (uint8_t *)out;
    while (n > 0) {
        uint64_t i = offset / f->chunk_bytes, within = offset % f->chunk_bytes, len = aead_file_chunk_len(f, i);
        uint64_t take = len - within < n ? len - within : n;
        // a whole chunk wanted goes straight to out; a part, through chunk_buf
        uint8_t *buf = within == 0 && take == len ? dst : chunk_buf;
        if (aead_file_read_chunk(fd, f, k, i, buf, path, err, errlen) != 0) return -1;
        if (buf != dst) memcpy(dst, buf + within, (size_t)take);
        dst += take; offset += take; n -= take;
    }
    if (f->plain_bytes == 0)  // the one empty chunk still vouches for the header
        return aead_file_read_chunk(fd, f, k, 0, chunk_buf, path, err, errlen);
    return 0;
}

// the whole plaintext of the sealed file open at fd (path, for messages)
// into a malloc'd *out of *n bytes; -1 with err set (the file, the field or
// chunk, and the value)
static inline int aead_file_read_fd(int fd, const AeadFileKey *k, uint8_t **out, uint64_t *n, const char *path,
                                    char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    AeadFile f;
    uint8_t *buf = NULL, *chunk = NULL;
    int rc = aead_file_read_header(fd, &f, k, path, err, errlen);
    if (rc == 0) {
        buf = (uint8_t *)malloc(f.plain_bytes > 0 ? (size_t)f.plain_bytes : 1);
        chunk = (uint8_t *)malloc((size_t)f.chunk_bytes);
        if (buf == NULL || chunk == NULL)
            rc = errorf(err, errlen, "%s: out of memory for %llu bytes", path, (unsigned long long)f.plain_bytes);
    }
    if (rc == 0) rc = aead_file_read_range(fd, &f, k, 0, f.plain_bytes, buf, chunk, path, err, errlen);
    free(chunk);
    if (rc != 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    *n = f.plain_bytes;
    return 0;
}

#endif
