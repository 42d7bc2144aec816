/*
 * test_aead.c: aead.h's AES-256-GCM and sealed files, on both paths (the
 * portable one forced, AES-NI on 128-bit registers, and VAES on 512-bit
 * ones, where the CPU has them).
 *
 * Known answers: FIPS 197's AES-256 example (appendix C.3) and the AES-256
 * test cases 13 to 18 of McGrew and Viega's GCM specification ("The
 * Galois/Counter Mode of Operation", the document NIST's SP 800-38D builds
 * on). Then round trips of many lengths, every single-bit flip refused, and,
 * where OpenSSL's header is found at build time, the same inputs sealed by
 * OpenSSL's EVP_aes_256_gcm (the Makefile adds -DLLM3D_OPENSSL -lcrypto).
 * Sealed files: written and read back, damage refused, and their bytes
 * rebuilt from doc/formats.md's layout with one-buffer GCM (ours, and
 * OpenSSL's where found), so that the format itself, each chunk's own
 * nonce included, is held to its description and not only to its reader.
 */
#include "llm3d/secure/aead.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

#ifdef LLM3D_OPENSSL
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

static int unhex(const char *hex, uint8_t *out) {
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return (int)n;
}

typedef struct { const char *name, *key, *iv, *aad, *plain, *cipher, *tag; } GcmCase;

static const char *const key_feffe = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
static const char *const plain_d931 =
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39";  // + "1aafd255" in case 15
static const char *const aad_feed = "feedfacedeadbeeffeedfacedeadbeefabaddad2";

static void test_known_answers(void) {
    static const char *const zero_key = "0000000000000000000000000000000000000000000000000000000000000000";
    char plain64[200];
    snprintf(plain64, sizeof(plain64), "%s1aafd255", plain_d931);
    GcmCase cases[6] = {
        {"case 13 (empty)", zero_key, "000000000000000000000000", "", "", "", "530f8afbc74536b9a963b4f1c4cb738b"},
        {"case 14 (one zero block)", zero_key, "000000000000000000000000", "", "00000000000000000000000000000000",
         "cea7403d4d606b6e074ec5d3baf39d18", "d0d1c8a799996bf0265b98b5d48ab919"},
        {"case 15 (64 bytes)", key_feffe, "cafebabefacedbaddecaf888", "", plain64,
         "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
         "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
         "b094dac5d93471bdec1a502270e3cc6c"},
        {"case 16 (60 bytes, aad)", key_feffe, "cafebabefacedbaddecaf888", aad_feed, plain_d931,
         "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
         "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
         "76fc6ece0f4e1768cddf8853bb2d551b"},
        {"case 17 (8-byte iv)", key_feffe, "cafebabefacedbad", aad_feed, plain_d931,
         "c3762df1ca787d32ae47c13bf19844cbaf1ae14d0b976afac52ff7d79bba9de0"
         "feb582d33934a4f0954cc2363bc73f7862ac430e64abe499f47c9b1f",
         "3a337dbf46a792c45e454913fe2ea8f2"},
        {"case 18 (60-byte iv)", key_feffe,
         "9313225df88406e555909c5aff5269aa6a7a9538534f7da1e4c303d2a318a728c3c0c95156809539fcf0e2429a6b5254"
         "16aedbf5a0de6a57a637b39b",
         aad_feed, plain_d931,
         "5a8def2f0c9e53f1f75d7853659e2a20eeb2b22aafde6419a058ab4f6f746bf4"
         "0fc0c3b780f244452da3ebf1c5d82cdea2418997200ef82e44ae7e3f",
         "a44a8266ee1c8eb0c8b5d4cf5ae9f19a"},
    };
    for (int c = 0; c < 6; c++) {
        const GcmCase *t = &cases[c];
        uint8_t key[32], iv[64], aad[64], plain[64], want[64], want_tag[16], got[64], tag[16], back[64];
        unhex(t->key, key);
        int ivlen = unhex(t->iv, iv), aadlen = unhex(t->aad, aad), len = unhex(t->plain, plain);
        unhex(t->cipher, want);
        unhex(t->tag, want_tag);
        AeadKey k;
        aead_init(&k, key);
        aead_seal(&k, iv, (size_t)ivlen, aad, (size_t)aadlen, plain, got, (size_t)len, tag);
        check(memcmp(got, want, (size_t)len) == 0 && memcmp(tag, want_tag, 16) == 0, "%s: GCM %s: ciphertext and tag",
              aead_impl_name(), t->name);
        int opened = aead_open(&k, iv, (size_t)ivlen, aad, (size_t)aadlen, want, back, (size_t)len, want_tag);
        check(opened == 0 && memcmp(back, plain, (size_t)len) == 0, "%s: GCM %s: opens to the plaintext",
              aead_impl_name(), t->name);
        aead_wipe(&k);
    }
    // FIPS 197 appendix C.3: one AES-256 block
    uint8_t key[32], in[16], want[16], out[16];
    unhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", key);
    unhex("00112233445566778899aabbccddeeff", in);
    unhex("8ea2b7ca516745bfeafc49904b496089", want);
    AeadKey k;
    aead_init(&k, key);
    aead_aes_one(&k, in, out);
    check(memcmp(out, want, 16) == 0, "%s: FIPS 197 C.3 AES-256 block", aead_impl_name());
    aead_wipe(&k);
}

// a fixed stream of test bytes (splitmix64), so a failure repeats
static uint64_t test_rng = 0x243f6a8885a308d3ull;
static uint64_t next_random(void) {
    uint64_t z = (test_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static void fill_random(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)next_random();
}

// seal and open lengths around the block size, the 8-block batch and a page,
// on the path in force; and a message sealed on one path opens on the other
static void test_round_trips(void) {
    static const size_t lengths[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 4095, 4096 + 3, (3u << 20) + 5};
    uint8_t key[32], iv[12], aad[37], tag[16];
    fill_random(key, 32);
    fill_random(iv, 12);
    fill_random(aad, sizeof(aad));
    AeadKey k;
    aead_init(&k, key);
    int bad = 0, crossed = 0, n = (int)(sizeof(lengths) / sizeof(lengths[0]));
    for (int i = 0; i < n; i++) {
        size_t len = lengths[i];
        uint8_t *plain = (uint8_t *)malloc(len + 1), *ct = (uint8_t *)malloc(len + 1), *back = (uint8_t *)malloc(len + 1);
        fill_random(plain, len);
        aead_seal(&k, iv, 12, aad, sizeof(aad), plain, ct, len, tag);
        if (aead_open(&k, iv, 12, aad, sizeof(aad), ct, back, len, tag) != 0 || memcmp(back, plain, len) != 0) bad++;
        // in place, as sealed files decrypt
        memcpy(back, ct, len);
        if (aead_open(&k, iv, 12, aad, sizeof(aad), back, back, len, tag) != 0 || memcmp(back, plain, len) != 0) bad++;
        if (aead_has_aesni()) {  // the portable path must read it too (or, from it, the best one)
            int portable = strcmp(aead_impl_name(), "portable") == 0;
            aead_force_portable(!portable);
            if (aead_open(&k, iv, 12, aad, sizeof(aad), ct, back, len, tag) != 0 || memcmp(back, plain, len) != 0) crossed++;
            aead_force_portable(portable);
        }
        free(plain); free(ct); free(back);
    }
    check(bad == 0, "%s: %d lengths from 0 to 3 MiB + 5 seal and open back (%d wrong)", aead_impl_name(), n, bad);
    if (aead_has_aesni())
        check(crossed == 0, "%s: what it sealed opens on %s (%d wrong)", aead_impl_name(),
              strcmp(aead_impl_name(), "portable") == 0 ? "the fastest path" : "the portable path", crossed);
    // every length to 1100 (each tail after the 8- and 16-block loops) and
    // two whole chunks: the same ciphertext and tag as the portable path, byte
    // for byte, so the fast paths are held to a reference without OpenSSL
    if (aead_has_aesni() && strcmp(aead_impl_name(), "portable") != 0) {
        static const size_t longer[] = {(1u << 20) - 1, (2u << 20) + 17};
        int differ = 0, tried = 0;
        for (size_t i = 0; i <= 1100 + 2; i++) {
            size_t len = i <= 1100 ? i : longer[i - 1101];
            uint8_t *plain = (uint8_t *)malloc(len + 1), *fast = (uint8_t *)malloc(len + 1);
            uint8_t *slow = (uint8_t *)malloc(len + 1), fast_tag[16], slow_tag[16];
            fill_random(plain, len);
            aead_seal(&k, iv, 12, aad, i % sizeof(aad), plain, fast, len, fast_tag);
            aead_force_portable(1);
            aead_seal(&k, iv, 12, aad, i % sizeof(aad), plain, slow, len, slow_tag);
            aead_force_portable(0);
            differ += memcmp(fast, slow, len) != 0 || memcmp(fast_tag, slow_tag, 16) != 0;
            tried++;
            free(plain); free(fast); free(slow);
        }
        check(differ == 0, "%s: every length 0 to 1100 and two of about 1 and 2 MiB seal as the portable path does, "
              "ciphertext and tag (%d of %d differ)", aead_impl_name(), differ, tried);
    }
    // aead_ctr from any offset is a slice of the whole keystream
    uint8_t plain[300], whole[300], part[300];
    fill_random(plain, sizeof(plain));
    aead_ctr(&k, iv, 12, 0, plain, whole, sizeof(plain));
    int slices_bad = 0;
    for (size_t at = 0; at < sizeof(plain); at += 7) {
        aead_ctr(&k, iv, 12, at, plain + at, part, sizeof(plain) - at);
        if (memcmp(part, whole + at, sizeof(plain) - at) != 0) slices_bad++;
    }
    check(slices_bad == 0, "%s: the keystream from any byte offset is that slice of the whole (%d wrong)",
          aead_impl_name(), slices_bad);
    aead_wipe(&k);
}

// GCM's counter is the last 32 bits of the block, counted mod 2^32 (inc32):
// a J0 of counter 2^32 - 20 (as an IV of another length than 12 can give)
// wraps within 40 blocks, in the 16-block groups of the wide paths, the
// 8-block groups of AES-NI and the single blocks. The keystream must be
// each counter block through AES, built here one by one, from offset 0 and
// from within a block, and the one-pass CTR with GHASH must give the same.
static void test_counter_wrap(void) {
    uint8_t key[32], j0[16], plain[16 * 41 + 5], want[sizeof(plain)], got[sizeof(plain)], y[16] = {0};
    fill_random(key, 32);
    fill_random(j0, 12);
    put_u32(j0 + 12, __builtin_bswap32(0xffffffecu));
    fill_random(plain, sizeof(plain));
    AeadKey k;
    aead_init(&k, key);
    for (size_t b = 0; b * 16 < sizeof(plain); b++) {
        uint8_t block[16], stream[16];
        memcpy(block, j0, 12);
        put_u32(block + 12, __builtin_bswap32(0xffffffecu + 1u + (uint32_t)b));
        aead_aes_block_portable(&k, block, stream);
        for (size_t i = 0; i < 16 && 16 * b + i < sizeof(plain); i++) want[16 * b + i] = plain[16 * b + i] ^ stream[i];
    }
    int bad = 0;
    static const size_t offsets[] = {0, 3, 16, 250};
    for (size_t o = 0; o < sizeof(offsets) / sizeof(offsets[0]); o++) {
        size_t at = offsets[o], n = sizeof(plain) - at;
        aead_ctr_j0(&k, j0, at, plain + at, got, n);
        bad += memcmp(got, want + at, n) != 0;
        aead_ctr_ghash_j0(&k, j0, at, plain + at, got, n, 0, y);
        bad += memcmp(got, want + at, n) != 0;
    }
    check(bad == 0, "%s: the counter wraps mod 2^32 within a message (J0's counter 2^32 - 20, 661 bytes, from 4 "
          "offsets): CTR, and CTR with GHASH, give AES of each counter block (%d wrong)", aead_impl_name(), bad);
    aead_wipe(&k);
}

// every single-bit change of ciphertext, tag, aad or nonce is refused, and
// nothing of the plaintext comes out
static void test_bit_flips(void) {
    uint8_t key[32], iv[12], aad[20], plain[65], ct[65], tag[16], back[65];
    fill_random(key, 32);
    fill_random(iv, 12);
    fill_random(aad, sizeof(aad));
    fill_random(plain, sizeof(plain));
    AeadKey k;
    aead_init(&k, key);
    aead_seal(&k, iv, 12, aad, sizeof(aad), plain, ct, sizeof(plain), tag);
    uint8_t *parts[4] = {ct, tag, aad, iv};
    size_t sizes[4] = {sizeof(ct), sizeof(tag), sizeof(aad), sizeof(iv)};
    const char *names[4] = {"ciphertext", "tag", "aad", "nonce"};
    for (int p = 0; p < 4; p++) {
        int accepted = 0, leaked = 0;
        for (size_t bit = 0; bit < 8 * sizes[p]; bit++) {
            parts[p][bit / 8] ^= (uint8_t)(1 << (bit % 8));
            memset(back, 0xaa, sizeof(back));
            if (aead_open(&k, iv, 12, aad, sizeof(aad), ct, back, sizeof(ct), tag) == 0) accepted++;
            for (size_t i = 0; i < sizeof(back); i++) leaked += back[i] != 0;
            parts[p][bit / 8] ^= (uint8_t)(1 << (bit % 8));
        }
        check(accepted == 0 && leaked == 0, "%s: each of the %zu one-bit changes of the %s is refused (%d accepted, %d "
              "bytes out)", aead_impl_name(), 8 * sizes[p], names[p], accepted, leaked);
    }
    check(aead_open(&k, iv, 12, aad, sizeof(aad), ct, back, sizeof(ct), tag) == 0 && memcmp(back, plain, 65) == 0,
          "%s: unchanged, it opens", aead_impl_name());
    aead_wipe(&k);
}

#ifdef LLM3D_OPENSSL
// OpenSSL's AES-256-GCM on the same key, nonce, aad and plaintext
static int openssl_seal(const uint8_t key[32], const uint8_t *iv, int ivlen, const uint8_t *aad, int aadlen,
                        const uint8_t *plain, int len, uint8_t *out, uint8_t tag[16]) {
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int n = 0, ok = c != NULL && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL) == 1 &&
                     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, ivlen, NULL) == 1 &&
                     EVP_EncryptInit_ex(c, NULL, NULL, key, iv) == 1 &&
                     (aadlen == 0 || EVP_EncryptUpdate(c, NULL, &n, aad, aadlen) == 1) &&
                     EVP_EncryptUpdate(c, out, &n, plain, len) == 1 && EVP_EncryptFinal_ex(c, out + n, &n) == 1 &&
                     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
    EVP_CIPHER_CTX_free(c);
    return ok ? 0 : -1;
}

static void test_openssl(void) {
    enum { MAX_LEN = 70000 };
    uint8_t *plain = (uint8_t *)malloc(MAX_LEN), *ours = (uint8_t *)malloc(MAX_LEN), *theirs = (uint8_t *)malloc(MAX_LEN);
    int cases = 0, differ = 0, failed = 0;
    for (int i = 0; i < 301 + 200; i++) {
        // every length 0..300, then 200 random ones up to 70000; aad 0..99
        // bytes; a 12-byte nonce, and every 10th case another length
        int len = i <= 300 ? i : (int)(next_random() % MAX_LEN), aadlen = (int)(next_random() % 100);
        int ivlen = i % 10 == 9 ? 1 + (int)(next_random() % 64) : 12;
        uint8_t key[32], iv[64], aad[100], tag_ours[16], tag_theirs[16];
        fill_random(key, 32);
        fill_random(iv, (size_t)ivlen);
        fill_random(aad, (size_t)aadlen);
        fill_random(plain, (size_t)len);
        AeadKey k;
        aead_init(&k, key);
        aead_seal(&k, iv, (size_t)ivlen, aad, (size_t)aadlen, plain, ours, (size_t)len, tag_ours);
        aead_wipe(&k);
        if (openssl_seal(key, iv, ivlen, aad, aadlen, plain, len, theirs, tag_theirs) != 0) {
            failed++;
            continue;
        }
        cases++;
        if (memcmp(ours, theirs, (size_t)len) != 0 || memcmp(tag_ours, tag_theirs, 16) != 0) {
            if (differ++ == 0) printf("      first difference: length %d, aad %d, iv %d\n", len, aadlen, ivlen);
        }
    }
    check(failed == 0 && differ == 0, "%s: the same as OpenSSL's EVP_aes_256_gcm on %d random cases (every length "
          "0..300 and 200 up to 70000; %d differ, %d OpenSSL errors)", aead_impl_name(), cases, differ, failed);
    free(plain); free(ours); free(theirs);
}
#endif

// seal and open in one pass (CTR and GHASH stitched) against the two halves
// apart (aead_ctr, then aead_tag: separate CTR and GHASH code) and, where
// found, OpenSSL: every length 0..300, and around each multiple of the
// block groups (8 and 16 blocks: 128 and 256 bytes, and 64) up to 16 of
// them, with aad of 0, 13 and 80 bytes; opened out of place and in place
static void test_one_pass(void) {
    size_t lengths[800], nlen = 0;
    for (size_t n = 0; n <= 300; n++) lengths[nlen++] = n;
    static const int near[] = {-17, -16, -15, -1, 1, 15, 16, 17};
    for (size_t m = 64; m <= 256; m *= 2)
        for (size_t g = 1; g <= 16; g++)
            for (int d = -1; d < 8; d++) {
                long n = (long)(g * m) + (d < 0 ? 0 : near[d]);
                if (n > 300) lengths[nlen++] = (size_t)n;
            }
    lengths[nlen++] = (1u << 20) - 1;
    lengths[nlen++] = (1u << 20) + 17;
    uint8_t key[32], iv[12], aad[80];
    fill_random(key, 32);
    fill_random(iv, 12);
    fill_random(aad, sizeof(aad));
    AeadKey k;
    aead_init(&k, key);
    size_t most = (1u << 20) + 17;
    uint8_t *plain = (uint8_t *)malloc(most), *one = (uint8_t *)malloc(most), *two = (uint8_t *)malloc(most);
    uint8_t *back = (uint8_t *)malloc(most);
    fill_random(plain, most);
    int differ = 0, unopened = 0, openssl_differ = 0;
    static const size_t aads[] = {0, 13, 80};
    for (size_t c = 0; c < nlen; c++) {
        size_t n = lengths[c], aadlen = aads[c % 3];
        uint8_t tag_one[16], tag_two[16];
        aead_seal(&k, iv, 12, aad, aadlen, plain, one, n, tag_one);
        aead_ctr(&k, iv, 12, 0, plain, two, n);
        aead_tag(&k, iv, 12, aad, aadlen, two, n, tag_two);
        if (memcmp(one, two, n) != 0 || memcmp(tag_one, tag_two, 16) != 0) {
            if (differ++ == 0) printf("      first difference: length %zu, aad %zu\n", n, aadlen);
        }
        memset(back, 0xee, n);
        int opened = aead_open(&k, iv, 12, aad, aadlen, one, back, n, tag_one) == 0 && memcmp(back, plain, n) == 0;
        opened = opened && aead_open(&k, iv, 12, aad, aadlen, two, two, n, tag_one) == 0 && memcmp(two, plain, n) == 0;
        if (!opened && unopened++ == 0) printf("      first not opened: length %zu, aad %zu\n", n, aadlen);
#ifdef LLM3D_OPENSSL
        uint8_t tag_theirs[16];
        if (openssl_seal(key, iv, 12, aad, (int)aadlen, plain, (int)n, two, tag_theirs) != 0 ||
            memcmp(one, two, n) != 0 || memcmp(tag_one, tag_theirs, 16) != 0)
            openssl_differ++;
#endif
    }
    check(differ == 0 && unopened == 0 && openssl_differ == 0,
          "%s: seal and open in one pass, on %zu lengths around the 4-, 8- and 16-block groups: the same as CTR "
          "and GHASH apart%s (%d differ, %d not opened, %d differ from OpenSSL)", aead_impl_name(), nlen,
#ifdef LLM3D_OPENSSL
          " and as OpenSSL",
#else
          "",
#endif
          differ, unopened, openssl_differ);
    free(plain); free(one); free(two); free(back);
    aead_wipe(&k);
}

// ----------------------------------------------------------------------------
// sealed files

static const char *tmp_dir(void) {
    static char dir[64];
    if (dir[0] == '\0' && test_make_dir(dir, sizeof(dir), "/tmp/test_aead_XXXXXX") != 0) {
        perror("mkdtemp");
        exit(1);
    }
    return dir;
}

static int write_sealed(const char *path, const AeadFileKey *k, const uint8_t *plain, uint64_t n, uint64_t chunk) {
    char err[512];
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    int rc = aead_file_write_all(fd, k, plain, n, chunk, NULL, path, err, sizeof(err));
    if (rc != 0) printf("      %s\n", err);
    close(fd);
    return rc;
}

// whether path reads back as plain[0..n); err gets the reader's line
static int reads_back(const char *path, const AeadFileKey *k, const uint8_t *plain, uint64_t n, char *err, size_t errlen) {
    uint8_t *got;
    uint64_t got_n;
    err[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int rc = aead_file_read_fd(fd, k, &got, &got_n, path, err, errlen);
    close(fd);
    if (rc != 0) return 0;
    int same = got_n == n && (n == 0 || memcmp(got, plain, (size_t)n) == 0);
    free(got);
    return same;
}

static void test_sealed_files(void) {
    uint8_t key[32], other[32];
    fill_random(key, 32);
    fill_random(other, 32);
    AeadFileKey k, wrong;
    aead_file_key(&k, key);
    aead_file_key(&wrong, other);
    char path[256], err[1024];
    snprintf(path, sizeof(path), "%s/sealed.bin", tmp_dir());
    const uint64_t chunk = 4096;
    static const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 8 * 4096};
    uint8_t *plain = (uint8_t *)malloc(8 * 4096);
    fill_random(plain, 8 * 4096);
    int bad = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t file_n;
        if (write_sealed(path, &k, plain, sizes[i], chunk) != 0) { bad++; continue; }
        uint8_t *file = (uint8_t *)test_read_file(path, &file_n);
        if (file_n != aead_file_bytes(sizes[i], chunk) || !reads_back(path, &k, plain, sizes[i], err, sizeof(err)) ||
            (sizes[i] >= 16 && memmem(file, file_n, plain, 16) != NULL))  // no plaintext on disk
            bad++;
        free(file);
    }
    check(bad == 0, "%s: sealed files of 0 to 8 chunks of 4 KiB write and read back, no plaintext in them (%d wrong)",
          aead_impl_name(), bad);

    // random access: every range within a few chunks
    const uint64_t n = 3 * 4096 + 5;
    write_sealed(path, &k, plain, n, chunk);
    int fd = open(path, O_RDONLY | O_CLOEXEC), range_bad = 0;
    AeadFile f;
    uint8_t *buf = (uint8_t *)malloc(n), *chunk_buf = (uint8_t *)malloc(chunk);
    if (aead_file_read_header(fd, &f, &k, path, err, sizeof(err)) != 0) range_bad++;
    for (uint64_t at = 0; at < n && range_bad == 0; at += 1021)
        for (uint64_t len = 0; at + len <= n; len += 2039)
            if (aead_file_read_range(fd, &f, &k, at, len, buf, chunk_buf, path, err, sizeof(err)) != 0 ||
                memcmp(buf, plain + at, (size_t)len) != 0)
                range_bad++;
    close(fd);
    check(range_bad == 0, "%s: any byte range of a sealed file reads back alone (%d wrong)", aead_impl_name(), range_bad);

    // damage: every bit of the header and of a tag, bytes of each chunk
    size_t file_n;
    uint8_t *good = (uint8_t *)test_read_file(path, &file_n), *copy = (uint8_t *)malloc(file_n + 4096);
    int accepted = 0;
    for (int bit = 0; bit < 8 * AEAD_FILE_HEADER_BYTES; bit++) {
        memcpy(copy, good, file_n);
        copy[bit / 8] ^= (uint8_t)(1 << (bit % 8));
        test_write_file(path, copy, file_n);
        accepted += reads_back(path, &k, plain, n, err, sizeof(err));
    }
    check(accepted == 0, "%s: each of the 512 one-bit changes of a sealed file's header is refused (%d accepted)",
          aead_impl_name(), accepted);
    accepted = 0;
    for (uint64_t c = 0; c < 4; c++)
        for (int bit = 0; bit < 8 * 16; bit += 3) {
            memcpy(copy, good, file_n);
            copy[AEAD_FILE_HEADER_BYTES + n + 16 * c + bit / 8] ^= (uint8_t)(1 << (bit % 8));
            test_write_file(path, copy, file_n);
            accepted += reads_back(path, &k, plain, n, err, sizeof(err));
        }
    for (uint64_t at = 0; at < n; at += 97) {
        memcpy(copy, good, file_n);
        copy[AEAD_FILE_HEADER_BYTES + at] ^= (uint8_t)(1 << (at % 8));
        test_write_file(path, copy, file_n);
        accepted += reads_back(path, &k, plain, n, err, sizeof(err));
    }
    check(accepted == 0, "%s: one-bit changes of the tags and of the ciphertext are refused (%d accepted)",
          aead_impl_name(), accepted);
    check(strstr(err, "chunk") != NULL && strstr(err, path) != NULL, "the refusal names the file and the chunk: %s", err);

    // two chunks swapped, with their tags
    memcpy(copy, good, file_n);
    memcpy(copy + AEAD_FILE_HEADER_BYTES, good + AEAD_FILE_HEADER_BYTES + chunk, chunk);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + chunk, good + AEAD_FILE_HEADER_BYTES, chunk);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + n, good + AEAD_FILE_HEADER_BYTES + n + 16, 16);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + n + 16, good + AEAD_FILE_HEADER_BYTES + n, 16);
    test_write_file(path, copy, file_n);
    check(!reads_back(path, &k, plain, n, err, sizeof(err)) && strstr(err, "chunk 0") != NULL,
          "two chunks swapped (tags too) are refused: %s", err);

    // cut short at a chunk boundary, the header and tag table made to fit:
    // the old last-but-one chunk is not marked last, and the header differs
    memcpy(copy, good, file_n);
    uint64_t cut = 2 * chunk;
    put_u64(copy + 16, cut);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + cut, good + AEAD_FILE_HEADER_BYTES + n, 32);
    test_write_file(path, copy, (size_t)aead_file_bytes(cut, chunk));
    check(!reads_back(path, &k, plain, cut, err, sizeof(err)), "cut to 2 whole chunks, header and tags fitted: refused: %s", err);
    test_write_file(path, good, file_n - 1);
    check(!reads_back(path, &k, plain, n, err, sizeof(err)) && strstr(err, "truncated") != NULL,
          "one byte short: refused: %s", err);
    memcpy(copy, good, file_n);
    copy[file_n] = 0;
    test_write_file(path, copy, file_n + 1);
    check(!reads_back(path, &k, plain, n, err, sizeof(err)), "one byte longer: refused: %s", err);

    // a chunk from another file sealed under the same key
    char other_path[256];
    snprintf(other_path, sizeof(other_path), "%s/other.bin", tmp_dir());
    write_sealed(other_path, &k, plain, n, chunk);
    size_t other_n;
    uint8_t *other_file = (uint8_t *)test_read_file(other_path, &other_n);
    check(memcmp(other_file + 24, good + 24, 8) != 0 && memcmp(other_file + 64, good + 64, 64) != 0,
          "the same bytes sealed again get a fresh file id, so other ciphertext");
    memcpy(copy, good, file_n);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + chunk, other_file + AEAD_FILE_HEADER_BYTES + chunk, chunk);
    memcpy(copy + AEAD_FILE_HEADER_BYTES + n + 16, other_file + AEAD_FILE_HEADER_BYTES + n + 16, 16);
    test_write_file(path, copy, file_n);
    check(!reads_back(path, &k, plain, n, err, sizeof(err)) && strstr(err, "chunk 1") != NULL,
          "a chunk (and its tag) from another file of the same key: refused: %s", err);

    // another key
    test_write_file(path, good, file_n);
    check(reads_back(path, &k, plain, n, err, sizeof(err)), "restored, it reads back");
    check(!reads_back(path, &wrong, plain, n, err, sizeof(err)) && strstr(err, "another key") != NULL,
          "under another key: refused: %s", err);

    // an empty file still has one chunk, and its tag is checked: each bit of
    // it flipped is refused
    write_sealed(path, &k, plain, 0, chunk);
    uint8_t *empty = (uint8_t *)test_read_file(path, &file_n);
    accepted = 0;
    for (int bit = 0; empty != NULL && file_n == AEAD_FILE_HEADER_BYTES + 16 && bit < 8 * 16; bit++) {
        empty[AEAD_FILE_HEADER_BYTES + bit / 8] ^= (uint8_t)(1 << (bit % 8));
        test_write_file(path, empty, file_n);
        accepted += reads_back(path, &k, plain, 0, err, sizeof(err));
        empty[AEAD_FILE_HEADER_BYTES + bit / 8] ^= (uint8_t)(1 << (bit % 8));
    }
    check(empty != NULL && file_n == AEAD_FILE_HEADER_BYTES + 16 && accepted == 0 && strstr(err, "chunk 0") != NULL,
          "an empty sealed file (%zu bytes): each of the 128 one-bit changes of its one tag is refused "
          "(%d accepted): %s", file_n, accepted, err);
    free(empty);
    free(good); free(copy); free(other_file); free(buf); free(chunk_buf); free(plain);
    unlink(path);
    unlink(other_path);
    aead_file_key_wipe(&k);
    aead_file_key_wipe(&wrong);
}

// ----------------------------------------------------------------------------
// the sealed file's bytes, rebuilt from its documented layout

// one buffer's AES-256-GCM with a 12-byte nonce, and HMAC-SHA256: the two
// primitives a sealed file is made of, from aead.h and secure.h, or from
// OpenSSL
typedef struct {
    const char *name;
    int (*seal)(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *aad, int aadlen, const uint8_t *plain,
                int len, uint8_t *out, uint8_t tag[16]);
    void (*mac)(const uint8_t key[32], const char *label, uint8_t out[32]);
} Primitives;

static int our_seal(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *aad, int aadlen,
                    const uint8_t *plain, int len, uint8_t *out, uint8_t tag[16]) {
    AeadKey k;
    aead_init(&k, key);
    aead_seal(&k, nonce, 12, aad, (size_t)aadlen, plain, out, (size_t)len, tag);
    aead_wipe(&k);
    return 0;
}

static void our_mac(const uint8_t key[32], const char *label, uint8_t out[32]) {
    hmac_sha256(key, 32, label, strlen(label), out);
}

#ifdef LLM3D_OPENSSL
static int openssl_seal12(const uint8_t key[32], const uint8_t nonce[12], const uint8_t *aad, int aadlen,
                          const uint8_t *plain, int len, uint8_t *out, uint8_t tag[16]) {
    return openssl_seal(key, nonce, 12, aad, aadlen, plain, len, out, tag);
}

static void openssl_mac(const uint8_t key[32], const char *label, uint8_t out[32]) {
    unsigned int n = 32;
    if (HMAC(EVP_sha256(), key, 32, (const unsigned char *)label, strlen(label), out, &n) == NULL) memset(out, 0, 32);
}
#endif

static void le_put(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// the sealed file of plain[0..n) in chunks of chunk bytes under key, with
// the file id file_id (random when written, so taken from the file under
// test), laid out as doc/formats.md says, with p's primitives and none of
// aead.h's file code or constants: malloc'd, its size into *len
static uint8_t *build_sealed(const Primitives *p, const uint8_t key[32], uint64_t file_id, const uint8_t *plain,
                             uint64_t n, uint32_t chunk, size_t *len) {
    uint64_t chunks = n == 0 ? 1 : (n + chunk - 1) / chunk;
    *len = (size_t)(64 + n + 16 * chunks);
    uint8_t *file = (uint8_t *)calloc(1, *len), cipher_key[32], key_id[32];
    p->mac(key, "llm3d at-rest AES-256-GCM key 1", cipher_key);
    p->mac(cipher_key, "llm3d at-rest key id 1", key_id);
    memcpy(file, "llm3dgcm", 8);
    le_put(file + 8, 1, 4);         // version
    le_put(file + 12, chunk, 4);
    le_put(file + 16, n, 8);        // plain_bytes
    le_put(file + 24, file_id, 8);
    memcpy(file + 32, key_id, 8);   // the HMAC's first 8 bytes; 40..63 stay zero
    for (uint64_t i = 0; i < chunks; i++) {
        uint8_t nonce[12], aad[80];
        le_put(nonce, file_id, 8);
        le_put(nonce + 8, i, 4);
        memcpy(aad, file, 64);
        le_put(aad + 64, i, 8);
        le_put(aad + 72, i + 1 == chunks, 8);
        uint64_t at = i * chunk, bytes = n - at < chunk ? n - at : chunk;
        if (n == 0) bytes = 0;
        if (p->seal(cipher_key, nonce, aad, 80, plain + at, (int)bytes, file + 64 + at, file + 64 + n + 16 * i) != 0) {
            free(file);
            return NULL;
        }
    }
    return file;
}

// equal plaintext in every chunk: every chunk's ciphertext differs from
// every other's (each chunk its own nonce, so its own keystream; under one
// nonce for all they would be the same bytes). Two 4 KiB ciphertexts of
// independent keystreams agree in about 16 bytes (1 in 256); 100 or more
// has a probability far below 1e-30.
static void test_chunk_nonces(void) {
    enum { CHUNK = 4096, CHUNKS = 3 };
    uint8_t key[32];
    fill_random(key, 32);
    AeadFileKey k;
    aead_file_key(&k, key);
    uint8_t *plain = (uint8_t *)malloc(CHUNKS * CHUNK);
    for (int i = 0; i < CHUNKS * CHUNK; i++) plain[i] = (uint8_t)(i % CHUNK * 7);  // chunk 0 again and again
    char path[256], err[512];
    snprintf(path, sizeof(path), "%s/equal_chunks.bin", tmp_dir());
    size_t file_n = 0;
    uint8_t *file = write_sealed(path, &k, plain, CHUNKS * CHUNK, CHUNK) == 0 ? (uint8_t *)test_read_file(path, &file_n)
                                                                            : NULL;
    int most_equal = CHUNK;
    if (file != NULL && file_n == aead_file_bytes(CHUNKS * CHUNK, CHUNK)) {
        most_equal = 0;
        for (int a = 0; a < CHUNKS; a++)
            for (int b = a + 1; b < CHUNKS; b++) {
                int equal = 0;
                for (int i = 0; i < CHUNK; i++)
                    equal += file[AEAD_FILE_HEADER_BYTES + a * CHUNK + i] == file[AEAD_FILE_HEADER_BYTES + b * CHUNK + i];
                if (equal > most_equal) most_equal = equal;
            }
    }
    check(most_equal < 100 && reads_back(path, &k, plain, CHUNKS * CHUNK, err, sizeof(err)),
          "%s: %d chunks of equal plaintext seal to different ciphertexts (at most %d of %d bytes alike in any two)",
          aead_impl_name(), CHUNKS, most_equal, CHUNK);
    free(file);
    free(plain);
    unlink(path);
    aead_file_key_wipe(&k);
}

// a sealed file, byte for byte, as doc/formats.md lays it out (header
// fields, nonce = file_id || chunk index, aad = header || index || last),
// rebuilt with aead.h's one-buffer GCM (held to the published vectors
// above), and with OpenSSL's where it was found: files of 3 chunks (the last
// short), 2 whole chunks and none (one empty chunk), written whole, and
// one written in slices with its tags after
static void test_sealed_layout(void) {
    enum { CHUNK = 4096 };
    static const uint64_t sizes[] = {2 * CHUNK + 1000, 2 * CHUNK, 0, 2 * CHUNK + 1000};
    Primitives with[2] = {{"aead.h's one-buffer GCM", our_seal, our_mac}};
    int nwith = 1;
#ifdef LLM3D_OPENSSL
    with[nwith++] = (Primitives){"OpenSSL's EVP_aes_256_gcm and HMAC", openssl_seal12, openssl_mac};
#endif
    uint8_t key[32], *plain = (uint8_t *)malloc(3 * CHUNK);
    fill_random(key, 32);
    fill_random(plain, 3 * CHUNK);
    AeadFileKey k;
    aead_file_key(&k, key);
    char path[256], err[512];
    snprintf(path, sizeof(path), "%s/layout.bin", tmp_dir());
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        uint64_t n = sizes[s];
        int sliced = s == 3, rc;
        if (!sliced) {
            rc = write_sealed(path, &k, plain, n, CHUNK);
        } else {  // as ranks write a checkpoint: slices at their places, then the tags
            AeadFile f;
            uint8_t bounce[1000];
            int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            rc = fd < 0 || aead_file_new(&f, &k, n, CHUNK, path, err, sizeof(err)) != 0 ||
                 pwrite_all(fd, f.header, AEAD_FILE_HEADER_BYTES, 0) != 0;
            for (uint64_t at = 0; rc == 0 && at < n; at += 3001) {
                size_t len = (size_t)(n - at < 3001 ? n - at : 3001);
                rc = aead_file_pwrite(fd, &f, &k, plain + at, len, at, bounce, sizeof(bounce), NULL, NULL);
            }
            if (rc == 0) rc = aead_file_write_tags(fd, &f, &k, NULL, path, err, sizeof(err));
            if (fd >= 0) close(fd);
        }
        size_t file_n = 0;
        uint8_t *file = rc == 0 ? (uint8_t *)test_read_file(path, &file_n) : NULL;
        for (int w = 0; w < nwith; w++) {
            size_t want_n = 0;
            uint64_t file_id = 0;
            for (int i = 0; file != NULL && file_n >= 32 && i < 8; i++) file_id |= (uint64_t)file[24 + i] << (8 * i);
            uint8_t *want = file != NULL ? build_sealed(&with[w], key, file_id, plain, n, CHUNK, &want_n) : NULL;
            size_t first_diff = 0;
            while (want != NULL && first_diff < want_n && first_diff < file_n && want[first_diff] == file[first_diff])
                first_diff++;
            check(want != NULL && file_n == want_n && first_diff == want_n,
                  "%s: a sealed file of %llu bytes (%llu chunk(s)%s) is, byte for byte, the layout rebuilt with %s "
                  "(%zu and %zu bytes, alike for the first %zu)", aead_impl_name(), (unsigned long long)n,
                  (unsigned long long)(n == 0 ? 1 : (n + CHUNK - 1) / CHUNK), sliced ? ", written in slices" : "",
                  with[w].name, file_n, want_n, first_diff);
            free(want);
        }
        free(file);
    }
#ifndef LLM3D_OPENSSL
    skip("the sealed layout against OpenSSL: <openssl/evp.h> was not found when this test was built");
#endif
    unlink(path);
    free(plain);
    aead_file_key_wipe(&k);
}

// ranks write their own slices at any offsets, then one seals the tags:
// the same file as sealing it whole (but for the file id)
static void test_sliced_writes(void) {
    uint8_t key[32];
    fill_random(key, 32);
    AeadFileKey k;
    aead_file_key(&k, key);
    char path[256], err[512];
    snprintf(path, sizeof(path), "%s/sliced.bin", tmp_dir());
    const uint64_t n = 5 * 4096 + 77, chunk = 4096;
    uint8_t *plain = (uint8_t *)malloc(n), bounce[64 << 10];
    fill_random(plain, n);
    AeadFile f;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), rc = fd < 0;
    rc |= aead_file_new(&f, &k, n, chunk, path, err, sizeof(err));
    rc |= pwrite_all(fd, f.header, sizeof(f.header), 0);
    rc |= ftruncate(fd, (off_t)aead_file_bytes(n, chunk));
    for (uint64_t at = n; at > 0;) {  // from the end, in odd-sized slices
        uint64_t len = at < 3001 ? at : 3001;
        at -= len;
        rc |= aead_file_pwrite(fd, &f, &k, plain + at, (size_t)len, at, bounce, sizeof(bounce), NULL, NULL);
    }
    uint8_t sha[32], want[32];
    rc |= aead_file_write_tags(fd, &f, &k, sha, path, err, sizeof(err));
    close(fd);
    check(rc == 0 && reads_back(path, &k, plain, n, err, sizeof(err)),
          "%s: a sealed file written in slices out of order, then its tags, reads back %s", aead_impl_name(), err);
    // the SHA-256 made while tagging is the whole file's, tags included
    size_t whole_bytes = (size_t)aead_file_bytes(n, chunk);
    uint8_t *whole = (uint8_t *)malloc(whole_bytes);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    int read_ok = fd >= 0 && pread_all(fd, whole, whole_bytes, 0) == 0;
    if (fd >= 0) close(fd);
    if (read_ok) sha256(whole, whole_bytes, want);
    check(read_ok && memcmp(sha, want, 32) == 0,
          "%s: the SHA-256 from the tag pass is the sealed file's", aead_impl_name());
    // aead_file_write_all makes the tags and the SHA-256 in its one pass
    fd = open(path, O_RDWR | O_TRUNC | O_CLOEXEC);
    rc = fd < 0 || aead_file_write_all(fd, &k, plain, n, chunk, sha, path, err, sizeof(err)) != 0;
    read_ok = rc == 0 && pread_all(fd, whole, whole_bytes, 0) == 0;
    if (fd >= 0) close(fd);
    if (read_ok) sha256(whole, whole_bytes, want);
    check(read_ok && memcmp(sha, want, 32) == 0 && reads_back(path, &k, plain, n, err, sizeof(err)),
          "%s: aead_file_write_all's file reads back, and its SHA-256 is the file's %s", aead_impl_name(), err);
    free(whole);
    unlink(path);
    free(plain);
    aead_file_key_wipe(&k);
}

// GHASH shares (aead_file_ctr_sums): a file written in random slices, odd
// lengths at odd offsets, by three writers each adding its own shares, one
// of them the header's first 1024 bytes; the shares added up make the very
// tags that reading the file back makes (aead_file_write_tags), and the
// file reads back with them. Files of 0 bytes, one block, one chunk, and
// several chunks with a short last one.
static void test_ghash_shares(void) {
    uint8_t key[32];
    fill_random(key, 32);
    AeadFileKey k;
    aead_file_key(&k, key);
    char path[256], err[512] = "";
    snprintf(path, sizeof(path), "%s/shares.bin", tmp_dir());
    const uint64_t chunk = 4096;
    static const uint64_t sizes[] = {0, 16, 4096, 5 * 4096 + 77};
    int bad = 0;
    for (int c = 0; c < 4; c++) {
        uint64_t n = sizes[c];
        AeadFile f;
        uint8_t *plain = (uint8_t *)malloc(n + 1), bounce[1000];
        fill_random(plain, n);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), rc = fd < 0;
        rc |= aead_file_new(&f, &k, n, chunk, path, err, sizeof(err));
        rc |= pwrite_all(fd, f.header, sizeof(f.header), 0);
        rc |= ftruncate(fd, (off_t)aead_file_bytes(n, chunk));
        size_t table = (size_t)f.chunks * 16;
        uint8_t *sums[3], *total = (uint8_t *)calloc(table, 1), *tags = (uint8_t *)malloc(table);
        uint8_t *want = (uint8_t *)malloc(table);
        uint64_t *counts[3];
        for (int w = 0; w < 3; w++) {
            sums[w] = (uint8_t *)calloc(table, 1);
            counts[w] = (uint64_t *)calloc((size_t)f.chunks, sizeof(uint64_t));
        }
        uint64_t at = 0;
        if (n >= 1024) {  // the header, as ckpt_make_file writes it
            rc |= aead_file_pwrite(fd, &f, &k, plain, 1024, 0, bounce, sizeof(bounce), sums[0], counts[0]);
            at = 1024;
        }
        while (at < n) {
            uint64_t len = 1 + next_random() % 700;
            len = len < n - at ? len : n - at;
            int w = (int)(next_random() % 3);
            rc |= aead_file_pwrite(fd, &f, &k, plain + at, (size_t)len, at, bounce, sizeof(bounce), sums[w], counts[w]);
            at += len;
        }
        for (int w = 0; w < 3; w++)
            for (size_t b = 0; b < table; b++) total[b] ^= sums[w][b];
        for (uint64_t i = 0; i < f.chunks; i++)  // every byte counted once, by the writer that wrote it
            if (counts[0][i] + counts[1][i] + counts[2][i] != aead_file_chunk_len(&f, i)) rc |= 1;
        aead_file_tags_from_sums(&f, &k, total, tags);
        rc |= aead_file_write_tags(fd, &f, &k, NULL, path, err, sizeof(err));
        rc |= pread_all(fd, want, table, AEAD_FILE_HEADER_BYTES + n);
        if (fd >= 0) close(fd);
        if (rc != 0 || memcmp(tags, want, table) != 0 || !reads_back(path, &k, plain, n, err, sizeof(err))) {
            if (bad++ == 0) printf("      first wrong: %llu bytes %s\n", (unsigned long long)n, err);
        }
        for (int w = 0; w < 3; w++) {
            free(sums[w]);
            free(counts[w]);
        }
        free(total); free(tags); free(want); free(plain);
    }
    check(bad == 0, "%s: three writers' GHASH shares of a sealed file written in random slices make the tags that "
          "reading it back makes, and count each chunk's bytes once, for files of 0, 16, 4096 and 20557 bytes "
          "(%d wrong)", aead_impl_name(), bad);
    unlink(path);
    aead_file_key_wipe(&k);
}

int main(void) {
    // the paths: portable (forced), AES-NI on 128-bit registers (forced
    // narrow), VAES on 256-bit ones (AVX-512 forced off) and on 512-bit
    // ones, as far as this CPU has them
    if (!aead_has_aesni()) skip("AES-NI with PCLMULQDQ: this CPU has none; the portable path only");
    else if (!aead_has_vaes256()) skip("VAES with AVX2: this CPU has none; the 256-bit path untested here");
    if (aead_has_aesni() && !aead_has_vaes()) skip("VAES with AVX-512: this CPU has none; the 512-bit path untested here");
    for (int p = 0; p < 4; p++) {
        if ((p >= 1 && !aead_has_aesni()) || (p == 2 && !aead_has_vaes256()) || (p == 3 && !aead_has_vaes())) continue;
        aead_force_portable(p == 0);
        aead_force_narrow(p == 1);
        aead_force_avx2(p == 2);
        test_known_answers();
        test_round_trips();
        test_counter_wrap();
        test_bit_flips();
#ifdef LLM3D_OPENSSL
        test_openssl();
#endif
        test_one_pass();
        test_sealed_files();
        test_sliced_writes();
        test_ghash_shares();
        test_chunk_nonces();
        test_sealed_layout();
    }
#ifndef LLM3D_OPENSSL
    skip("OpenSSL cross-check: <openssl/evp.h> was not found when this test was built (install libssl-dev)");
#endif
    aead_force_portable(0);
    aead_force_narrow(0);
    aead_force_avx2(0);
    test_remove_dir(tmp_dir());
    return test_summary();
}
