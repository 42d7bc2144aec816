/*
 * secure.h: SHA-256, HMAC-SHA256, per-job keys and authenticated frames
 * between ranks. Header-only (llm.c style):
 * every function is static inline, so any number of translation units may
 * include it and -Wall stays quiet about the ones a unit does not call.
 *
 * defines:
 *   small helpers: secure_wipe, to_hex, hex_decode, put_u16..64, get_u16..64
 *   SHA-256: Sha256, sha256_init, sha256_update, sha256_final, sha256, cpu_has
 *   HMAC-SHA256: Hmac, hmac_init, hmac_update, hmac_final, hmac_sha256,
 *     hmac_keyed, tag_equal
 *   keys: key_generate, key_read_file, key_write_file, key_read_fd,
 *         key_read_opened, key_write_opened (the same on an open file),
 *     key_write_fd, job_id_from_key, secure_harden_process
 *   frames: CH_* (channels), FrameHeader, Links, links_init, frame_bytes,
 *     frame_seal, frame_check_header, frame_open
 *
 * Include it before any system header, or build with -std=gnu11 or
 * -D_GNU_SOURCE: it needs POSIX (fsync, O_NOFOLLOW, ...) even under -std=c11.
 *
 * Why it exists: no rank may accept a message that a rank of this job did not
 * send, that was changed on the way, or that was sent before. doc/security.md
 * says what this does and does not protect against.
 *
 * SHA-256 (FIPS 180-4): portable C, plus a path using the x86 SHA extensions
 * (SHA-NI) that is picked at run time by CPUID. Only that one function is
 * compiled for the SHA target, so the file builds with plain gcc -O2 and runs
 * on any x86-64 (and on other architectures, portable only). CPUID is asked
 * once per feature (cpu_has, which aead.h's AES-NI and VAES checks use too).
 *
 * Keys: 32 random bytes per job from getrandom(). The launcher hands them to
 * the ranks it starts through an inherited pipe (key_write_fd / key_read_fd);
 * ranks started by other launchers read --key-file PATH (key_read_file), which
 * is refused unless it is a regular file owned by the effective user with no
 * group or other permission bits, holding 64 hex digits and an optional "\n".
 * The job id is the first 8 bytes (little-endian) of HMAC(key, "llm3d job id"),
 * so ranks of other jobs, or ranks holding another key, are told apart before
 * any tag is checked.
 *
 * Frame: every point-to-point message between ranks is
 *     header (64 bytes) | payload (payload_len bytes) | tag (32 bytes)
 * with tag = HMAC-SHA256(key, header || payload). Header, little-endian:
 *     off  size  field
 *       0     4  magic        0x4c4c4d33 (bytes 33 4d 4c 4c)
 *       4     2  version      1
 *       6     2  channel      CH_* below
 *       8     8  job_id       job_id_from_key(key)
 *      16     4  src          sending rank
 *      20     4  dst          receiving rank
 *      24     8  step         optimizer step
 *      32     4  microbatch   micro-batch within the step
 *      36     4  reserved     0
 *      40     8  seq          per directed link (src -> dst), from 0
 *      48     8  payload_len  bytes of payload
 *      56     8  pad          0
 * The receiver reads the 64-byte header first and checks every field against
 * what it expects (frame_check_header), so a bad length is refused before a
 * single payload byte is read; then reads payload and tag and checks the tag
 * in constant time (frame_open). One sequence counter per directed link is
 * shared by all channels: the receiver must open frames in the order the
 * sender sealed them, which holds for one ordered stream per link. A frame
 * whose sequence number is not exactly the next one is refused, which catches
 * replayed, reordered and dropped messages alike.
 *
 * Built on these: manifest.h (the sealed lists of a checkpoint's or a data
 * set's files), chunkmac.h (the tag of a large payload, computed on a GPU)
 * and fault.h (-fault KIND:RANK:STEP: a tampered or replayed frame, a rank
 * killed, stalled or slow, a parameter drifted), all in llm3d/secure/.
 *
 * Errors follow errors.h: functions that can fail return 0 or -1 and write one
 * line into err (naming the file, field or flag, and the value); err may be NULL.
 */
#ifndef LLM3D_SECURE_H
#define LLM3D_SECURE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"  // read_all
// C11 atomics; C++ (the CUDA trainer includes this header) spells them in std::
#ifdef __cplusplus
#include <atomic>
using std::atomic_int;
using std::atomic_load_explicit;
using std::atomic_store_explicit;
using std::memory_order_relaxed;
#else
#include <stdatomic.h>
#endif
#if !defined(O_CLOEXEC) || !defined(O_DIRECTORY)
#error "secure.h needs POSIX 2008: include it before any system header, or build with -std=gnu11 or -D_GNU_SOURCE"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define SECURE_HAVE_X86 1
#else
#define SECURE_HAVE_X86 0
#endif

// ----------------------------------------------------------------------------
// small helpers

// secure_wipe: zero memory that held key material; explicit_bzero is a
// memset the compiler may not drop as a dead store before free or return
static inline void secure_wipe(void *p, size_t n) {
    explicit_bzero(p, n);
}

static inline void to_hex(const uint8_t *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

// printable: up to cap-1 bytes of untrusted text for an error message, with
// anything but printable ASCII shown as '?' (no terminal escapes from a file)
static inline void printable(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (; k < n && k + 1 < cap; k++) out[k] = s[k] >= 0x20 && s[k] < 0x7f ? s[k] : '?';
    out[k] = '\0';
}

static inline int hex_digit(char c, int lowercase_only) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (!lowercase_only && c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// hex_decode: exactly 2n digits into n bytes; 0 ok, -1 on a bad digit
static inline int hex_decode(const char *hex, size_t n, uint8_t *out, int lowercase_only) {
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(hex[2 * i], lowercase_only);
        int lo = hex_digit(hex[2 * i + 1], lowercase_only);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

static inline void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static inline uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

// ----------------------------------------------------------------------------
// SHA-256

#define SHA256_BYTES 32

typedef struct {
    uint32_t h[8];
    uint64_t nbytes;  // message bytes so far
    uint8_t buf[64];  // a partial block
    size_t nbuf;
} Sha256;

// the round constants, as a list so the CUDA section's __constant__ copy
// (device code cannot read a host array) is made from the same text
#define SHA256_K_LIST \
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, \
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, \
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, \
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, \
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, \
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, \
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, \
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2

static const uint32_t sha256_k[64] = {SHA256_K_LIST};

static inline uint32_t rotr32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static inline void sha256_blocks_portable(uint32_t h[8], const uint8_t *p, size_t nblocks) {
    for (; nblocks > 0; nblocks--, p += 64) {
        uint32_t w[64];
        for (int t = 0; t < 16; t++) {
            w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
                   (uint32_t)p[4 * t + 2] << 8 | p[4 * t + 3];
        }
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = rotr32(w[t - 15], 7) ^ rotr32(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = rotr32(w[t - 2], 17) ^ rotr32(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int t = 0; t < 64; t++) {
            uint32_t sum1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
            uint32_t choose = (e & f) ^ (~e & g);
            uint32_t t1 = hh + sum1 + choose + sha256_k[t] + w[t];
            uint32_t sum0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
            uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
            uint32_t t2 = sum0 + majority;
            hh = g; g = f; f = e; e = d + t1;
            d = c; c = b; b = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d;
        h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }
}

#if SECURE_HAVE_X86
// The SHA-NI instructions keep the state as two vectors {a,b,e,f} and
// {c,d,g,h} (a in the top lane) and do two rounds per sha256rnds2.

// next 4 message words from the previous 16 (w0 oldest, w3 newest)
__attribute__((target("sha,sse4.1")))
static inline __m128i sha256_shani_schedule(__m128i w0, __m128i w1, __m128i w2, __m128i w3) {
    __m128i x = _mm_sha256msg1_epu32(w0, w1);     // w[t-16] + sigma0(w[t-15])
    x = _mm_add_epi32(x, _mm_alignr_epi8(w3, w2, 4));  // + w[t-7]
    return _mm_sha256msg2_epu32(x, w3);           // + sigma1(w[t-2])
}

__attribute__((target("sha,sse4.1")))
static inline void sha256_shani_rounds4(__m128i *abef, __m128i *cdgh, __m128i w, const uint32_t *k) {
    __m128i msg = _mm_add_epi32(w, _mm_loadu_si128((const __m128i *)k));
    *cdgh = _mm_sha256rnds2_epu32(*cdgh, *abef, msg);  // now holds the new {a,b,e,f}
    msg = _mm_shuffle_epi32(msg, 0x0e);
    *abef = _mm_sha256rnds2_epu32(*abef, *cdgh, msg);  // the old {a,b,e,f} is the new {c,d,g,h}
}

__attribute__((target("sha,sse4.1")))
static inline void sha256_blocks_shani(uint32_t h[8], const uint8_t *p, size_t nblocks) {
    const __m128i big_endian = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i abcd = _mm_loadu_si128((const __m128i *)&h[0]);
    __m128i efgh = _mm_loadu_si128((const __m128i *)&h[4]);
    __m128i badc = _mm_shuffle_epi32(abcd, 0xb1);
    __m128i hgfe = _mm_shuffle_epi32(efgh, 0x1b);
    __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);
    __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xf0);
    for (; nblocks > 0; nblocks--, p += 64) {
        __m128i abef_in = abef, cdgh_in = cdgh;
        __m128i w0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 0)), big_endian);
        __m128i w1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16)), big_endian);
        __m128i w2 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 32)), big_endian);
        __m128i w3 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 48)), big_endian);
        for (int q = 0; q < 4; q++) {  // 16 rounds per pass
            if (q > 0) {
                w0 = sha256_shani_schedule(w0, w1, w2, w3);
                w1 = sha256_shani_schedule(w1, w2, w3, w0);
                w2 = sha256_shani_schedule(w2, w3, w0, w1);
                w3 = sha256_shani_schedule(w3, w0, w1, w2);
            }
            sha256_shani_rounds4(&abef, &cdgh, w0, &sha256_k[16 * q + 0]);
            sha256_shani_rounds4(&abef, &cdgh, w1, &sha256_k[16 * q + 4]);
            sha256_shani_rounds4(&abef, &cdgh, w2, &sha256_k[16 * q + 8]);
            sha256_shani_rounds4(&abef, &cdgh, w3, &sha256_k[16 * q + 12]);
        }
        abef = _mm_add_epi32(abef, abef_in);
        cdgh = _mm_add_epi32(cdgh, cdgh_in);
    }
    __m128i feba = _mm_shuffle_epi32(abef, 0x1b);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xb1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xf0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}
#endif

// cpu_has: whether the CPU has a feature, asked once through ask and kept in
// *known: CPUID traps to the hypervisor in a VM and costs microseconds, too
// much for every small frame. *known is 0 = not asked yet, 1 = no, 2 = yes.
// Relaxed order is enough: two threads that both ask get the same answer.
// Each feature's cache is static in a header, so each translation unit has
// its own. aead.h's AES-NI and VAES checks use it too.
static inline int cpu_has(atomic_int *known, int (*ask)(void)) {
    int answer = atomic_load_explicit(known, memory_order_relaxed);
    if (answer != 0) return answer == 2;
    int yes = ask();
    atomic_store_explicit(known, yes ? 2 : 1, memory_order_relaxed);
    return yes;
}

// SHA-NI, with the SSSE3 and SSE4.1 its code also uses; 0 off x86 (the
// portable code then runs)
static inline int sha256_ask_shani(void) {
    int yes = 0;
#if SECURE_HAVE_X86
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1;
        if (ssse3 && sse41 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) yes = (b >> 29) & 1;
    }
#endif
    return yes;
}

static atomic_int sha256_cpu_has_shani;
static atomic_int sha256_portable_forced;

static inline int sha256_has_shani(void) { return cpu_has(&sha256_cpu_has_shani, sha256_ask_shani); }

static inline void sha256_force_portable(int on) {
    atomic_store_explicit(&sha256_portable_forced, on != 0, memory_order_relaxed);
}

static inline const char *sha256_impl_name(void) {
    int portable = atomic_load_explicit(&sha256_portable_forced, memory_order_relaxed) || !sha256_has_shani();
    return portable ? "portable" : "sha-ni";
}

static inline void sha256_blocks(uint32_t h[8], const uint8_t *p, size_t nblocks) {
#if SECURE_HAVE_X86
    if (!atomic_load_explicit(&sha256_portable_forced, memory_order_relaxed) && sha256_has_shani()) {
        sha256_blocks_shani(h, p, nblocks);
        return;
    }
#endif
    sha256_blocks_portable(h, p, nblocks);
}

static inline void sha256_init(Sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->nbytes = 0;
    s->nbuf = 0;
}

static inline void sha256_update(Sha256 *s, const void *data, size_t n) {
    if (n == 0) return;  // data may be NULL then
    const uint8_t *p = (const uint8_t *)data;
    s->nbytes += n;
    if (s->nbuf > 0) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take; p += take; n -= take;
        if (s->nbuf < 64) return;
        sha256_blocks(s->h, s->buf, 1);
        s->nbuf = 0;
    }
    if (n >= 64) {
        sha256_blocks(s->h, p, n / 64);
        p += n / 64 * 64;
        n %= 64;
    }
    if (n > 0) {
        memcpy(s->buf, p, n);
        s->nbuf = n;
    }
}

static inline void sha256_final(Sha256 *s, uint8_t out[32]) {
    uint64_t bits = s->nbytes * 8;
    s->buf[s->nbuf++] = 0x80;
    if (s->nbuf > 56) {
        memset(s->buf + s->nbuf, 0, 64 - s->nbuf);
        sha256_blocks(s->h, s->buf, 1);
        s->nbuf = 0;
    }
    memset(s->buf + s->nbuf, 0, 56 - s->nbuf);
    for (int i = 0; i < 8; i++) s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_blocks(s->h, s->buf, 1);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
    secure_wipe(s, sizeof(*s));
}

static inline void sha256(const void *data, size_t n, uint8_t out[32]) {
    Sha256 s;
    sha256_init(&s);
    sha256_update(&s, data, n);
    sha256_final(&s, out);
}

// ----------------------------------------------------------------------------
// HMAC-SHA256 (RFC 2104)

typedef struct { Sha256 inner, outer; } Hmac;

static inline void hmac_init(Hmac *h, const uint8_t *key, size_t keylen) {
    uint8_t block[64] = {0};
    if (keylen > 64) sha256(key, keylen, block);
    else if (keylen > 0) memcpy(block, key, keylen);
    uint8_t pad[64];
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
    sha256_init(&h->inner);
    sha256_update(&h->inner, pad, 64);
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
    sha256_init(&h->outer);
    sha256_update(&h->outer, pad, 64);
    secure_wipe(block, sizeof(block));
    secure_wipe(pad, sizeof(pad));
}

static inline void hmac_update(Hmac *h, const void *data, size_t n) {
    sha256_update(&h->inner, data, n);
}

static inline void hmac_final(Hmac *h, uint8_t out[32]) {
    uint8_t inner_hash[32];
    sha256_final(&h->inner, inner_hash);
    sha256_update(&h->outer, inner_hash, 32);
    sha256_final(&h->outer, out);
    secure_wipe(inner_hash, sizeof(inner_hash));
}

static inline void hmac_sha256(const uint8_t *key, size_t keylen, const void *msg, size_t n, uint8_t out[32]) {
    Hmac h;
    hmac_init(&h, key, keylen);
    hmac_update(&h, msg, n);
    hmac_final(&h, out);
}

// hmac_keyed: HMAC of one message, starting from a copy of a state that
// hmac_init made once for the key. The two key-pad blocks are not hashed
// again: they are 2 of the 5 compressions of a 64-byte frame's tag.
static inline void hmac_keyed(const Hmac *keyed, const void *msg, size_t n, uint8_t out[32]) {
    Hmac h = *keyed;
    hmac_update(&h, msg, n);
    hmac_final(&h, out);
}

// tag_equal: 1 iff both tags have the same nonzero length and the same bytes.
// The time taken depends on the length only, never on where the bytes differ,
// so a forger learns nothing from timing. An empty tag never matches: it
// would vouch for anything.
static inline int tag_equal(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
    if (alen != blen || alen == 0) return 0;
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < alen; i++) diff |= a[i] ^ b[i];
    return diff == 0;
}

// ----------------------------------------------------------------------------
// keys

#define KEY_BYTES 32
#define KEY_FD_TIMEOUT_MS 30000  // the launcher writes the key right after fork

static inline int key_is_zero(const uint8_t key[32]) {
    uint8_t any = 0;
    for (int i = 0; i < KEY_BYTES; i++) any |= key[i];
    return any == 0;
}

static inline int key_generate(uint8_t key[32], char *err, size_t errlen) {
    size_t got = 0;
    while (got < KEY_BYTES) {
        ssize_t r = getrandom(key + got, KEY_BYTES - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errorf(err, errlen, "key_generate: getrandom: %s", strerror(errno));
        got += (size_t)r;
    }
    return 0;
}

// key_file_check: a key file must be private: a regular file, owned by this
// user, with no permission bits for group or others
static inline int key_file_check(int fd, const char *path, char *err, size_t errlen) {
    struct stat st;
    if (fstat(fd, &st) != 0) return errorf(err, errlen, "key file %s: fstat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return errorf(err, errlen, "key file %s: not a regular file", path);
    if (st.st_uid != geteuid())
        return errorf(err, errlen, "key file %s: owned by uid %u, not by this user (uid %u)",
                      path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & 077) != 0)
        return errorf(err, errlen, "key file %s: mode %04o lets group or others at it; chmod 600 it",
                      path, (unsigned)(st.st_mode & 07777));
    return 0;
}

// key_read_opened: the key of the key file open at fd (path: its name in
// messages), checked as key_read_file does; closes fd
static inline int key_read_opened(int fd, const char *path, uint8_t key[32], char *err, size_t errlen) {
    int rc = -1;
    char text[68];
    size_t n = 0;
    if (key_file_check(fd, path, err, errlen) != 0) goto done;
    if (read_all(fd, text, sizeof(text), &n) != 0) {
        errorf(err, errlen, "key file %s: read: %s", path, strerror(errno));
        goto done;
    }
    if (!(n == 64 || (n == 65 && text[64] == '\n')) || hex_decode(text, 32, key, 0) != 0) {
        secure_wipe(key, KEY_BYTES);
        errorf(err, errlen, "key file %s: must hold 64 hex digits and an optional newline (%zu%s bytes)",
               path, n, n == sizeof(text) ? "+" : "");
        goto done;
    }
    if (key_is_zero(key)) {
        errorf(err, errlen, "key file %s: the all-zero key is not a secret", path);
        goto done;
    }
    rc = 0;
done:
    close(fd);
    secure_wipe(text, sizeof(text));
    return rc;
}

static inline int key_read_file(const char *path, uint8_t key[32], char *err, size_t errlen) {
    // O_NONBLOCK: a FIFO at that path must not block the open; it fails S_ISREG in key_file_check
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "key file %s: %s", path, strerror(errno));
    return key_read_opened(fd, path, key, err, errlen);
}

// key_write_opened: the key into the new, empty file open at fd, fsync'd;
// closes fd. 0, or an errno (the caller removes the file)
static inline int key_write_opened(int fd, const uint8_t key[32]) {
    char text[65];
    to_hex(key, KEY_BYTES, text);
    text[64] = '\n';
    size_t done = 0;
    int e = 0;
    if (fchmod(fd, 0600) != 0) e = errno;  // the umask can only narrow 0600, but be explicit
    while (e == 0 && done < sizeof(text)) {
        ssize_t r = write(fd, text + done, sizeof(text) - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) e = errno; else done += (size_t)r;
    }
    if (e == 0 && fsync(fd) != 0) e = errno;
    secure_wipe(text, sizeof(text));
    if (close(fd) != 0 && e == 0) e = errno;
    return e;
}

static inline int key_write_file(const char *path, const uint8_t key[32], char *err, size_t errlen) {
    // O_EXCL: never overwrite a key, nor follow a symlink someone planted there
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errorf(err, errlen, "key file %s: create: %s", path, strerror(errno));
    int e = key_write_opened(fd, key);
    if (e != 0) {
        unlink(path);
        return errorf(err, errlen, "key file %s: write: %s", path, strerror(e));
    }
    return 0;
}

// key_read_fd: exactly 32 raw bytes from an inherited pipe, waiting at most
// KEY_FD_TIMEOUT_MS for them. The caller closes fd.
static inline int key_read_fd_bytes(int fd, uint8_t key[32], char *err, size_t errlen) {
    size_t got = 0;
    while (got < KEY_BYTES) {
        struct pollfd pfd;
        memset(&pfd, 0, sizeof(pfd));
        pfd.fd = fd;
        pfd.events = POLLIN;
        int ready = poll(&pfd, 1, KEY_FD_TIMEOUT_MS);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return errorf(err, errlen, "key fd %d: poll: %s", fd, strerror(errno));
        if (ready == 0) return errorf(err, errlen, "key fd %d: no key after %d ms (%zu of 32 bytes)",
                                      fd, KEY_FD_TIMEOUT_MS, got);
        if (pfd.revents & POLLNVAL) return errorf(err, errlen, "key fd %d: not an open descriptor", fd);
        ssize_t r = read(fd, key + got, KEY_BYTES - got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) return errorf(err, errlen, "key fd %d: read: %s", fd, strerror(errno));
        if (r == 0) return errorf(err, errlen, "key fd %d: closed after %zu of 32 bytes", fd, got);
        got += (size_t)r;
    }
    if (key_is_zero(key)) return errorf(err, errlen, "key fd %d: the all-zero key is not a secret", fd);
    return 0;
}

static inline int key_read_fd(int fd, uint8_t key[32], char *err, size_t errlen) {
    if (key_read_fd_bytes(fd, key, err, errlen) == 0) return 0;
    secure_wipe(key, KEY_BYTES);  // no half key left for a careless caller to use
    return -1;
}

// key_write_fd: the caller should ignore SIGPIPE, or a rank that died before
// reading its key takes the launcher down with it
static inline int key_write_fd(int fd, const uint8_t key[32], char *err, size_t errlen) {
    size_t done = 0;
    while (done < KEY_BYTES) {
        ssize_t r = write(fd, key + done, KEY_BYTES - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return errorf(err, errlen, "key fd %d: write: %s", fd, strerror(errno));
        done += (size_t)r;
    }
    return 0;
}

static inline uint64_t job_id_from_key(const uint8_t key[32]) {
    static const char label[] = "llm3d job id";
    uint8_t mac[32];
    hmac_sha256(key, KEY_BYTES, label, sizeof(label) - 1, mac);
    return get_u64(mac);
}

// secure_harden_process: no core dumps and no ptrace attach by other
// processes of the same user, both of which would expose the key
static inline void secure_harden_process(void) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
}

// ----------------------------------------------------------------------------
// frames

enum { CH_CONTROL = 0, CH_ACTIVATION = 1, CH_GRADIENT = 2, CH_COLLECTIVE = 3, CH_PARAM = 4,
       CH_CHECK = 5, CH_HELLO = 6, CH_COUNT = 7 };

static inline const char *channel_name(int channel) {
    static const char *names[CH_COUNT] = {"control", "activation", "gradient", "collective",
                                          "param", "check", "hello"};
    return channel >= 0 && channel < CH_COUNT ? names[channel] : "unknown";
}

#define FRAME_MAGIC 0x4c4c4d33u  /* "LLM3" as a little-endian u32: bytes 33 4d 4c 4c */
#define FRAME_VERSION 1
#define FRAME_HEADER_BYTES 64
#define FRAME_TAG_BYTES 32
#define LINKS_MAX_WORLD 65536

typedef struct {
    uint32_t magic; uint16_t version; uint16_t channel;
    uint64_t job_id;
    uint32_t src, dst;
    uint64_t step;
    uint32_t microbatch; uint32_t reserved;
    uint64_t seq;
    uint64_t payload_len;
    uint8_t pad[8];  // keeps the header 64 bytes; zero, covered by the tag
} FrameHeader;  // the wire form is written byte by byte, not by struct layout

// Links: one per rank, for all its peers. Not locked: a caller with several
// threads keeps each link (each send_seq[i], recv_seq[i]) to one thread.
typedef struct {
    uint8_t key[32];
    Hmac keyed;          // hmac_init(key), done once: every tag starts from a copy (hmac_keyed)
    uint64_t job_id;
    int rank, world;
    uint64_t *send_seq;  // [world] next sequence number to send to each peer
    uint64_t *recv_seq;  // [world] next sequence number expected from each peer
} Links;

static inline void frame_header_write(const FrameHeader *h, uint8_t out[64]) {
    put_u32(out + 0, h->magic);
    put_u16(out + 4, h->version);
    put_u16(out + 6, h->channel);
    put_u64(out + 8, h->job_id);
    put_u32(out + 16, h->src);
    put_u32(out + 20, h->dst);
    put_u64(out + 24, h->step);
    put_u32(out + 32, h->microbatch);
    put_u32(out + 36, h->reserved);
    put_u64(out + 40, h->seq);
    put_u64(out + 48, h->payload_len);
    memcpy(out + 56, h->pad, 8);
}

// frame_header_make: the 64-byte header of a message; frames (frame_seal)
// and MAC'd NCCL messages (nccl_comm.h) are tagged under it
static inline void frame_header_make(uint8_t out[64], uint64_t job_id, int src, int dst, int channel, long step,
                                     int microbatch, uint64_t seq, uint64_t len) {
    FrameHeader h;
    memset(&h, 0, sizeof(h));
    h.magic = FRAME_MAGIC;
    h.version = FRAME_VERSION;
    h.channel = (uint16_t)channel;
    h.job_id = job_id;
    h.src = (uint32_t)src;
    h.dst = (uint32_t)dst;
    h.step = (uint64_t)step;
    h.microbatch = (uint32_t)microbatch;
    h.seq = seq;
    h.payload_len = len;
    frame_header_write(&h, out);
}

static inline void frame_header_read(const uint8_t in[64], FrameHeader *h) {
    h->magic = get_u32(in + 0);
    h->version = get_u16(in + 4);
    h->channel = get_u16(in + 6);
    h->job_id = get_u64(in + 8);
    h->src = get_u32(in + 16);
    h->dst = get_u32(in + 20);
    h->step = get_u64(in + 24);
    h->microbatch = get_u32(in + 32);
    h->reserved = get_u32(in + 36);
    h->seq = get_u64(in + 40);
    h->payload_len = get_u64(in + 48);
    memcpy(h->pad, in + 56, 8);
}

static inline int links_init(Links *l, const uint8_t key[32], int rank, int world) {
    memset(l, 0, sizeof(*l));
    if (world < 1 || world > LINKS_MAX_WORLD || rank < 0 || rank >= world) {
        fprintf(stderr, "links_init: rank %d of world %d is out of range (world 1..%d)\n",
                rank, world, LINKS_MAX_WORLD);
        return -1;
    }
    l->send_seq = (uint64_t *)calloc((size_t)world, sizeof(uint64_t));
    l->recv_seq = (uint64_t *)calloc((size_t)world, sizeof(uint64_t));
    if (l->send_seq == NULL || l->recv_seq == NULL) {
        free(l->send_seq);
        free(l->recv_seq);
        memset(l, 0, sizeof(*l));
        fprintf(stderr, "links_init: out of memory for world %d\n", world);
        return -1;
    }
    memcpy(l->key, key, KEY_BYTES);
    hmac_init(&l->keyed, key, KEY_BYTES);
    l->job_id = job_id_from_key(key);
    l->rank = rank;
    l->world = world;
    return 0;
}

static inline void links_free(Links *l) {
    free(l->send_seq);
    free(l->recv_seq);
    secure_wipe(l, sizeof(*l));
}

static inline size_t frame_bytes(size_t payload_len) {
    size_t overhead = FRAME_HEADER_BYTES + FRAME_TAG_BYTES;
    return payload_len > SIZE_MAX - overhead ? SIZE_MAX : payload_len + overhead;
}

// frame_seal: header, payload (not copied when it already sits at
// out + FRAME_HEADER_BYTES), tag; uses and advances send_seq[dst].
// -1 (and a line on stderr) only for a dst or channel the caller got wrong.
static inline int frame_seal(Links *l, int dst, int channel, uint64_t step, uint32_t microbatch,
                             const void *payload, size_t len, uint8_t *out) {
    if (dst < 0 || dst >= l->world || channel < 0 || channel >= CH_COUNT) {
        fprintf(stderr, "frame_seal: rank %d: destination %d (world %d) or channel %d is out of range\n",
                l->rank, dst, l->world, channel);
        return -1;
    }
    frame_header_make(out, l->job_id, l->rank, dst, channel, (long)step, (int)microbatch, l->send_seq[dst]++, len);
    uint8_t *body = out + FRAME_HEADER_BYTES;
    if (len > 0 && (const uint8_t *)payload != body) memmove(body, payload, len);
    hmac_keyed(&l->keyed, out, FRAME_HEADER_BYTES + len, body + len);
    return 0;
}

// frame_reject: "from rank 3, channel activation, step 12: <reason>", naming
// the link the receiver was waiting on (the header itself is untrusted)
__attribute__((format(printf, 6, 7)))
static inline __attribute__((format(printf, 6, 7))) int frame_reject(char *err, size_t errlen, int src, int channel, uint64_t step, const char *fmt, ...) {
    if (err == NULL || errlen == 0) return -1;
    int n = snprintf(err, errlen, "from rank %d, channel %s, step %" PRIu64 ": ", src, channel_name(channel), step);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static inline int frame_check_header(const Links *l, const uint8_t *frame, int src, int channel, uint64_t step,
                                     uint32_t microbatch, size_t expect_len, char *err, size_t errlen) {
    if (src < 0 || src >= l->world)
        return frame_reject(err, errlen, src, channel, step, "no such rank (world %d)", l->world);
    FrameHeader h;
    frame_header_read(frame, &h);
    if (h.magic != FRAME_MAGIC)
        return frame_reject(err, errlen, src, channel, step, "bad magic 0x%08" PRIx32 ": not an llm3d frame", h.magic);
    if (h.version != FRAME_VERSION)
        return frame_reject(err, errlen, src, channel, step, "frame version %u, this build speaks %d",
                            (unsigned)h.version, FRAME_VERSION);
    if (h.job_id != l->job_id)
        return frame_reject(err, errlen, src, channel, step,
                            "job id %016" PRIx64 " is not this job's (%016" PRIx64 "): another job, or another key",
                            h.job_id, l->job_id);
    if (h.src != (uint32_t)src)
        return frame_reject(err, errlen, src, channel, step, "header says source rank %" PRIu32, h.src);
    if (h.dst != (uint32_t)l->rank)
        return frame_reject(err, errlen, src, channel, step, "misaddressed: destination rank %" PRIu32 ", this is rank %d",
                            h.dst, l->rank);
    if (h.channel != channel)
        return frame_reject(err, errlen, src, channel, step, "header says channel %s (%u)",
                            channel_name(h.channel), (unsigned)h.channel);
    if (h.step != step)
        return frame_reject(err, errlen, src, channel, step, "header says step %" PRIu64, h.step);
    if (h.microbatch != microbatch)
        return frame_reject(err, errlen, src, channel, step, "header says micro-batch %" PRIu32 ", expected %" PRIu32,
                            h.microbatch, microbatch);
    if (h.payload_len != (uint64_t)expect_len)
        return frame_reject(err, errlen, src, channel, step, "payload length %" PRIu64 ", expected %zu",
                            h.payload_len, expect_len);
    if (h.seq != l->recv_seq[src])
        return frame_reject(err, errlen, src, channel, step, "replayed or reordered message (seq %" PRIu64
                            ", expected %" PRIu64 ")", h.seq, l->recv_seq[src]);
    return 0;
}

static inline int frame_open(Links *l, const uint8_t *frame, size_t frame_len, int src, int channel, uint64_t step,
                             uint32_t microbatch, size_t expect_len, const uint8_t **payload, char *err, size_t errlen) {
    *payload = NULL;
    if (frame_len < FRAME_HEADER_BYTES)
        return frame_reject(err, errlen, src, channel, step, "truncated frame (%zu bytes, the header alone is %d)",
                            frame_len, FRAME_HEADER_BYTES);
    if (frame_check_header(l, frame, src, channel, step, microbatch, expect_len, err, errlen) != 0) return -1;
    if (frame_len < frame_bytes(expect_len) || frame_bytes(expect_len) == SIZE_MAX)
        return frame_reject(err, errlen, src, channel, step, "truncated frame (%zu bytes, expected %zu)",
                            frame_len, frame_bytes(expect_len));
    uint8_t tag[32];
    hmac_keyed(&l->keyed, frame, FRAME_HEADER_BYTES + expect_len, tag);
    if (!tag_equal(tag, FRAME_TAG_BYTES, frame + FRAME_HEADER_BYTES + expect_len, FRAME_TAG_BYTES))
        return frame_reject(err, errlen, src, channel, step, "tag does not match: changed in transit, or sent with another key");
    // a key holder wrote these; nonzero means a sender from a future format
    FrameHeader h;
    frame_header_read(frame, &h);
    uint8_t pad_any = 0;
    for (int i = 0; i < 8; i++) pad_any |= h.pad[i];
    if (h.reserved != 0 || pad_any != 0)
        return frame_reject(err, errlen, src, channel, step, "reserved header fields are not zero");
    l->recv_seq[src]++;
    *payload = frame + FRAME_HEADER_BYTES;
    return 0;
}

#endif
