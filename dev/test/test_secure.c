/*
 * test_secure.c: secure.h, manifest.h and chunkmac.h against published
 * vectors, the openssl command, and every way a frame, key file or manifest
 * can be wrong.
 *
 *   make dev/test/test_secure && ./dev/test/test_secure
 *   ./dev/test/test_secure -corpus dev/fuzz/corpus   # (re)writes the fuzz seed corpora
 *
 * Run from the repo root; vectors come from test_data_path() (../shared/data).
 */
#include "secure.h"  // first: it sets the POSIX feature macro
#include "llm3d/secure/chunkmac.h"
#include "llm3d/secure/fault.h"
#include "llm3d/files.h"  // write_all
#include "llm3d/secure/manifest.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

#include <dirent.h>
#include <sys/types.h>
#include <sys/wait.h>

// ----------------------------------------------------------------------------
// a purpose-built JSON scanner: enough to walk the vector files, no more

static const char *json_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

// json_skip: past the value starting at p (string, object, array or scalar)
static const char *json_skip(const char *p, const char *end) {
    if (p >= end) return end;
    if (*p == '"') {
        for (p++; p < end && *p != '"'; p++) if (*p == '\\') p++;
        return p < end ? p + 1 : end;
    }
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            if (*p == '"') { p = json_skip(p, end); continue; }
            if (*p == '{' || *p == '[') depth++;
            if (*p == '}' || *p == ']') depth--;
            p++;
            if (depth == 0) return p;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n') p++;
    return p;
}

// json_member: the value of the top-level member name of the object at obj, or NULL
static const char *json_member(const char *obj, const char *end, const char *name) {
    size_t name_len = strlen(name);
    const char *p = json_ws(obj, end);
    if (p >= end || *p != '{') return NULL;
    p = json_ws(p + 1, end);
    while (p < end && *p == '"') {
        const char *key = p + 1;
        const char *key_end = json_skip(p, end) - 1;
        p = json_ws(key_end + 1, end);
        if (p >= end || *p != ':') return NULL;
        p = json_ws(p + 1, end);
        if ((size_t)(key_end - key) == name_len && memcmp(key, name, name_len) == 0) return p;
        p = json_ws(json_skip(p, end), end);
        if (p < end && *p == ',') p = json_ws(p + 1, end);
    }
    return NULL;
}

// json_string: the string at v (no escapes in the fields we read) into out
static int json_string(const char *v, const char *end, char *out, size_t cap) {
    if (v == NULL || v >= end || *v != '"') return 0;
    const char *close = json_skip(v, end) - 1;
    size_t n = (size_t)(close - v - 1);
    if (n + 1 > cap || memchr(v + 1, '\\', n) != NULL) return 0;
    memcpy(out, v + 1, n);
    out[n] = '\0';
    return 1;
}

// json_first / json_next: walk the elements of the array at arr
static const char *json_first(const char *arr, const char *end) {
    if (arr == NULL || arr >= end || *arr != '[') return NULL;
    const char *p = json_ws(arr + 1, end);
    return p < end && *p != ']' ? p : NULL;
}

static const char *json_next(const char *el, const char *end) {
    const char *p = json_ws(json_skip(el, end), end);
    if (p >= end || *p != ',') return NULL;
    return json_ws(p + 1, end);
}

// hex_bytes: hex text into a malloc'd byte array (NULL on bad hex)
static uint8_t *hex_bytes(const char *hex, size_t *n) {
    size_t len = strlen(hex);
    *n = len / 2;
    uint8_t *out = malloc(*n + 1);
    if (len % 2 != 0 || hex_decode(hex, *n, out, 0) != 0) { free(out); return NULL; }
    return out;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng_next(void) {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}
static void rng_fill(uint8_t *p, size_t n) { for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rng_next() >> 56); }

static void write_bytes(const char *dir, const char *name, const void *data, size_t n) {
    char path[512];
    test_write_file(test_path(path, sizeof(path), dir, name), data, n);
}

// for the cross-checks against the openssl command: a fresh directory for its
// input files, or 0 (said as a skip) when there is no openssl command
static int openssl_tmpdir(char *dir, const char *what) {
    if (system("openssl version >/dev/null 2>&1") != 0) {
        skip("no openssl command: %s not cross-checked", what);
        return 0;
    }
    return check(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
}

// sha256_in_pieces: the same hash through updates split at random points
static void sha256_in_pieces(const uint8_t *data, size_t n, uint8_t out[32]) {
    Sha256 s;
    sha256_init(&s);
    size_t done = 0;
    while (done < n) {
        size_t piece = (size_t)(rng_next() % 200);
        if (rng_next() % 8 == 0) piece = (size_t)(rng_next() % 5000);
        if (piece > n - done) piece = n - done;
        sha256_update(&s, data + done, piece);
        done += piece;
    }
    sha256_final(&s, out);
}

// ----------------------------------------------------------------------------

static void test_basics(void) {
    uint8_t a[4] = {0xde, 0xad, 0xbe, 0xef}, b[4] = {0xde, 0xad, 0xbe, 0xee};
    char hex[9];
    to_hex(a, 4, hex);
    check(strcmp(hex, "deadbeef") == 0, "to_hex gives %s", hex);
    check(tag_equal(a, 4, a, 4) == 1, "tag_equal: equal tags match");
    check(tag_equal(a, 4, b, 4) == 0, "tag_equal: a difference in the last byte is caught");
    check(tag_equal(a, 4, a, 3) == 0, "tag_equal: different lengths never match");
    check(tag_equal(a, 0, a, 0) == 0, "tag_equal: empty tags never match");
    uint8_t back[4];
    check(hex_decode("DEADbeef", 4, back, 0) == 0 && memcmp(back, a, 4) == 0, "hex_decode reads mixed case");
    check(hex_decode("DEADbeef", 4, back, 1) == -1, "hex_decode lowercase_only refuses upper case");
    check(hex_decode("deadbeeg", 4, back, 0) == -1, "hex_decode refuses 'g'");
    check(strcmp(channel_name(CH_ACTIVATION), "activation") == 0 && strcmp(channel_name(CH_HELLO), "hello") == 0 &&
          strcmp(channel_name(99), "unknown") == 0, "channel_name");
}

static void test_fips_rfc(void) {
    char path[1024];
    if (!test_data_path("crypto/rfc4231_fips180_vectors.json", path, sizeof(path))) {
        skip("%s missing: FIPS 180-4 / RFC 4231 vectors not run", path);
        return;
    }
    size_t len;
    char *json = test_read_file(path, &len);
    const char *end = json + len;
    int rfc_cases = 0, sha_cases = 0;
    static char key_hex[4096], data_hex[4096], mac_hex[256], msg[4096];
    for (const char *el = json_first(json_member(json, end, "hmac_sha256_rfc4231"), end); el; el = json_next(el, end)) {
        const char *num = json_member(el, end, "rfc4231_case");
        int id = num != NULL ? atoi(num) : -1;
        if (!json_string(json_member(el, end, "key_hex"), end, key_hex, sizeof(key_hex)) ||
            !json_string(json_member(el, end, "data_hex"), end, data_hex, sizeof(data_hex)) ||
            !json_string(json_member(el, end, "hmac_sha256_hex"), end, mac_hex, sizeof(mac_hex))) {
            check(0, "RFC 4231 case %d: fields key_hex, data_hex, hmac_sha256_hex readable", id);
            continue;
        }
        size_t klen, dlen, tlen;
        uint8_t *key = hex_bytes(key_hex, &klen), *data = hex_bytes(data_hex, &dlen), *want = hex_bytes(mac_hex, &tlen);
        uint8_t mac[32];
        hmac_sha256(key, klen, data, dlen, mac);
        // case 5 lists a 128-bit truncation: compare on the listed length
        check(tag_equal(mac, tlen, want, tlen), "RFC 4231 case %d (%zu-byte key, %zu-byte tag)", id, klen, tlen);
        free(key); free(data); free(want);
        rfc_cases++;
    }
    check(rfc_cases == 7, "RFC 4231: %d of 7 cases found", rfc_cases);
    for (const char *el = json_first(json_member(json, end, "sha256"), end); el; el = json_next(el, end)) {
        char want_hex[128], desc[256];
        size_t mlen;
        uint8_t *big = NULL;
        const uint8_t *m;
        if (!json_string(json_member(el, end, "sha256"), end, want_hex, sizeof(want_hex))) continue;
        if (json_string(json_member(el, end, "msg_ascii"), end, msg, sizeof(msg))) {
            m = (const uint8_t *)msg;
            mlen = strlen(msg);
            snprintf(desc, sizeof(desc), "'%.20s%s' (%zu bytes)", msg, mlen > 20 ? "..." : "", mlen);
        } else if (json_string(json_member(el, end, "msg_desc"), end, desc, sizeof(desc)) && strcmp(desc, "empty") == 0) {
            m = (const uint8_t *)"";
            mlen = 0;
        } else if (strstr(desc, "1,000,000 x 'a'") != NULL) {
            big = malloc(1000000);
            memset(big, 'a', 1000000);
            m = big;
            mlen = 1000000;
        } else {
            check(0, "FIPS vector '%s' understood", desc);
            continue;
        }
        uint8_t out[32], pieces[32];
        char got_hex[65];
        sha256(m, mlen, out);
        to_hex(out, 32, got_hex);
        sha256_in_pieces(m, mlen, pieces);
        check(strcmp(got_hex, want_hex) == 0 && memcmp(out, pieces, 32) == 0, "FIPS 180-4 sha256 of %s (one call and in pieces)", desc);
        free(big);
        sha_cases++;
    }
    check(sha_cases == 5, "FIPS 180-4: %d of 5 sha256 vectors found", sha_cases);
    free(json);
}

static void test_wycheproof(void) {
    char path[1024];
    if (!test_data_path("crypto/wycheproof_hmac_sha256_test.json", path, sizeof(path))) {
        skip("%s missing: Wycheproof vectors not run", path);
        return;
    }
    size_t len;
    char *json = test_read_file(path, &len);
    const char *end = json + len;
    int total = 0, valid = 0, invalid = 0, wrong = 0;
    static char key_hex[4096], msg_hex[8192], tag_hex[256], result[32];
    for (const char *g = json_first(json_member(json, end, "testGroups"), end); g; g = json_next(g, end)) {
        for (const char *t = json_first(json_member(g, end, "tests"), end); t; t = json_next(t, end)) {
            const char *id = json_member(t, end, "tcId");
            int tc = id != NULL ? atoi(id) : -1;
            if (!json_string(json_member(t, end, "key"), end, key_hex, sizeof(key_hex)) ||
                !json_string(json_member(t, end, "msg"), end, msg_hex, sizeof(msg_hex)) ||
                !json_string(json_member(t, end, "tag"), end, tag_hex, sizeof(tag_hex)) ||
                !json_string(json_member(t, end, "result"), end, result, sizeof(result))) {
                check(0, "Wycheproof tcId %d: fields readable", tc);
                continue;
            }
            size_t klen, mlen, tlen;
            uint8_t *key = hex_bytes(key_hex, &klen), *msg = hex_bytes(msg_hex, &mlen), *tag = hex_bytes(tag_hex, &tlen);
            uint8_t mac[32];
            hmac_sha256(key, klen, msg, mlen, mac);
            int match = tlen <= 32 && tag_equal(mac, tlen, tag, tlen);
            int want = strcmp(result, "valid") == 0;
            if (want) valid++; else invalid++;
            if (match != want) {
                wrong++;
                check(0, "Wycheproof tcId %d (%s, %zu-byte key, %zu-byte tag): got %s", tc, result, klen, tlen,
                      match ? "match" : "no match");
            }
            free(key); free(msg); free(tag);
            total++;
        }
    }
    check(total == 174 && wrong == 0, "Wycheproof HMAC-SHA256: %d vectors (%d valid, %d invalid), %d wrong",
          total, valid, invalid, wrong);
    free(json);
}

// test_portable_vs_shani: the two block functions agree on every length,
// alignment and split
static void test_portable_vs_shani(void) {
    if (!sha256_has_shani()) {
        skip("this CPU has no SHA-NI: only the portable path ran");
        return;
    }
    size_t max = 3000;
    uint8_t *data = malloc(max + 1);
    rng_fill(data, max + 1);
    int bad = 0;
    for (size_t n = 0; n <= max; n++) {
        const uint8_t *p = data + (n & 1);  // odd addresses too: the loads are unaligned
        uint8_t fast[32], slow[32], slow_pieces[32];
        sha256_force_portable(0);
        sha256(p, n, fast);
        sha256_force_portable(1);
        sha256(p, n, slow);
        sha256_in_pieces(p, n, slow_pieces);
        sha256_force_portable(0);
        if (memcmp(fast, slow, 32) != 0 || memcmp(slow, slow_pieces, 32) != 0) bad++;
    }
    check(bad == 0, "SHA-NI and portable agree on lengths 0..%zu (%d differ)", max, bad);
    size_t big = (8u << 20) + 13;
    uint8_t *huge = malloc(big);
    rng_fill(huge, big);
    uint8_t fast[32], slow[32];
    sha256(huge, big, fast);
    sha256_force_portable(1);
    sha256(huge, big, slow);
    sha256_force_portable(0);
    check(memcmp(fast, slow, 32) == 0, "SHA-NI and portable agree on %zu bytes", big);
    check(strcmp(sha256_impl_name(), "sha-ni") == 0, "dispatch picks %s on this CPU", sha256_impl_name());
    free(huge);
    free(data);
}

// test_openssl: random inputs of many lengths, one openssl run per batch
static void test_openssl(void) {
    char dir[] = "/tmp/test_secure_ossl.XXXXXX";
    if (!openssl_tmpdir(dir, "random inputs")) return;
    enum { SMALL = 301, COUNT = SMALL + 3 };
    size_t lens[COUNT];
    for (int i = 0; i < SMALL; i++) lens[i] = (size_t)i;
    lens[SMALL] = 4096 * 3 + 1;
    lens[SMALL + 1] = (1u << 20) + 7;
    lens[SMALL + 2] = 3 * (1u << 20) + 61;
    uint8_t *inputs[COUNT];
    size_t cmd_cap = 256 + COUNT * (strlen(dir) + 16);
    char *files = malloc(cmd_cap);
    files[0] = '\0';
    for (int i = 0; i < COUNT; i++) {
        inputs[i] = malloc(lens[i] + 1);
        rng_fill(inputs[i], lens[i]);
        char path[256], name[16];
        snprintf(name, sizeof(name), "in%03d", i);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        write_bytes(dir, name, inputs[i], lens[i]);
        strcat(files, " ");
        strcat(files, path);
    }
    // a short key, one of exactly a block, one longer than a block (hashed first)
    size_t key_lens[] = {0, 5, 64, 100};
    for (int k = 0; k < 4; k++) {
        uint8_t key[100];
        char key_hex[201];
        rng_fill(key, key_lens[k]);
        to_hex(key, key_lens[k], key_hex);
        char *cmd = malloc(cmd_cap + 300);
        if (k == 0) snprintf(cmd, cmd_cap + 300, "openssl dgst -sha256 -r%s", files);
        else snprintf(cmd, cmd_cap + 300, "openssl dgst -sha256 -mac HMAC -macopt hexkey:%s -r%s", key_hex, files);
        FILE *p = popen(cmd, "r");
        int agree = 0, lines = 0, split_agree = 0;
        char line[512];
        while (p != NULL && lines < COUNT && fgets(line, sizeof(line), p) != NULL) {
            uint8_t mine[32], pieces[32];
            char hex[65];
            if (k == 0) {
                sha256(inputs[lines], lens[lines], mine);
                sha256_in_pieces(inputs[lines], lens[lines], pieces);
            } else {
                hmac_sha256(key, key_lens[k], inputs[lines], lens[lines], mine);
                Hmac h;
                hmac_init(&h, key, key_lens[k]);
                size_t half = lens[lines] / 3;
                hmac_update(&h, inputs[lines], half);
                hmac_update(&h, inputs[lines] + half, lens[lines] - half);
                hmac_final(&h, pieces);
            }
            to_hex(mine, 32, hex);
            if (strncmp(line, hex, 64) == 0) agree++;
            if (memcmp(mine, pieces, 32) == 0) split_agree++;
            lines++;
        }
        if (p != NULL) pclose(p);
        if (k == 0) check(agree == COUNT && split_agree == COUNT, "sha256 = openssl dgst on %d random inputs (0..300 bytes, 12 KiB, 1 MiB, 3 MiB), split updates too: %d agree", COUNT, agree);
        else check(agree == COUNT && split_agree == COUNT, "HMAC with a %zu-byte key = openssl HMAC on %d inputs: %d agree", key_lens[k], COUNT, agree);
        free(cmd);
    }
    for (int i = 0; i < COUNT; i++) {
        char path[256];
        snprintf(path, sizeof(path), "%s/in%03d", dir, i);
        unlink(path);
        free(inputs[i]);
    }
    rmdir(dir);
    free(files);
}

// ----------------------------------------------------------------------------
// keys

static int write_text_file(const char *path, const char *text, mode_t mode) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0) return -1;
    int rc = write_all(fd, text, strlen(text));
    fchmod(fd, mode);
    close(fd);
    return rc;
}

static void test_keys(void) {
    char dir[] = "/tmp/test_secure_keys.XXXXXX";
    if (mkdtemp(dir) == NULL) { check(0, "mkdtemp %s", dir); return; }
    char err[512], path[256];
    uint8_t a[32], b[32], back[32];
    check(key_generate(a, err, sizeof(err)) == 0 && key_generate(b, err, sizeof(err)) == 0, "key_generate");
    check(memcmp(a, b, 32) != 0 && !key_is_zero(a), "two generated keys differ and are not zero");

    snprintf(path, sizeof(path), "%s/job.key", dir);
    check(key_write_file(path, a, err, sizeof(err)) == 0, "key_write_file %s", path);
    struct stat st;
    check(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_size == 65, "the key file is mode 0600, 64 hex + newline");
    check(key_read_file(path, back, err, sizeof(err)) == 0 && memcmp(a, back, 32) == 0, "key_read_file reads it back");
    int rc = key_write_file(path, b, err, sizeof(err));
    check(rc == -1 && key_read_file(path, back, NULL, 0) == 0 && memcmp(a, back, 32) == 0,
          "key_write_file never overwrites: %s", err);

    mode_t bad_modes[] = {0644, 0640, 0604, 0620, 0602, 0700 | 0010};
    for (int i = 0; i < 6; i++) {
        chmod(path, bad_modes[i]);
        err[0] = '\0';
        rc = key_read_file(path, back, err, sizeof(err));
        char want[16];
        snprintf(want, sizeof(want), "%04o", (unsigned)bad_modes[i]);
        check(rc == -1 && strstr(err, want) != NULL && strstr(err, path) != NULL, "mode %s refused: %s", want, err);
    }
    chmod(path, 0400);
    check(key_read_file(path, back, err, sizeof(err)) == 0, "mode 0400 accepted");
    chmod(path, 0600);

    if (geteuid() == 0) {
        // only root can give a file away; unprivileged runs cannot build this case
        check(chown(path, 65534, 65534) == 0, "chown %s to uid 65534", path);
        rc = key_read_file(path, back, err, sizeof(err));
        check(rc == -1 && strstr(err, "uid 65534") != NULL, "another user's key file refused (running as root): %s", err);
        check(chown(path, 0, 0) == 0, "chown back");
    } else {
        skip("not root: cannot make a key file owned by another user, owner check not exercised");
    }

    struct { const char *text; int ok; const char *what; } contents[] = {
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", 1, "64 hex digits, no newline"},
        {"000102030405060708090A0B0C0D0E0F101112131415161718191A1B1C1D1E1F\n", 1, "upper case with newline"},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1", 0, "63 digits"},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f0", 0, "65 digits"},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\r\n", 0, "CRLF"},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1g\n", 0, "a 'g'"},
        {"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n\n", 0, "two newlines"},
        {"0000000000000000000000000000000000000000000000000000000000000000\n", 0, "all-zero key"},
        {"", 0, "empty file"},
    };
    for (size_t i = 0; i < sizeof(contents) / sizeof(contents[0]); i++) {
        snprintf(path, sizeof(path), "%s/content.key", dir);
        write_text_file(path, contents[i].text, 0600);
        err[0] = '\0';
        rc = key_read_file(path, back, err, sizeof(err));
        if (contents[i].ok) {
            uint8_t want[32];
            for (int j = 0; j < 32; j++) want[j] = (uint8_t)j;
            check(rc == 0 && memcmp(back, want, 32) == 0, "key file with %s accepted", contents[i].what);
        } else {
            check(rc == -1 && err[0] != '\0', "key file with %s refused: %s", contents[i].what, err);
        }
    }
    check(key_read_file(dir, back, err, sizeof(err)) == -1 && strstr(err, "not a regular file"), "a directory refused: %s", err);
    snprintf(path, sizeof(path), "%s/fifo", dir);
    if (mkfifo(path, 0600) == 0) {
        check(key_read_file(path, back, err, sizeof(err)) == -1, "a FIFO refused without blocking: %s", err);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/missing.key", dir);
    check(key_read_file(path, back, err, sizeof(err)) == -1 && strstr(err, path), "a missing key file: %s", err);

    int fds[2];
    check(pipe(fds) == 0, "pipe");
    check(key_write_fd(fds[1], a, err, sizeof(err)) == 0 && key_read_fd(fds[0], back, err, sizeof(err)) == 0 &&
          memcmp(a, back, 32) == 0, "key through a pipe");
    check(write(fds[1], a, 16) == 16 && write(fds[1], a + 16, 16) == 16 &&
          key_read_fd(fds[0], back, err, sizeof(err)) == 0 && memcmp(a, back, 32) == 0, "key through a pipe in two writes");
    check(write(fds[1], a, 10) == 10, "write 10 bytes");
    close(fds[1]);
    rc = key_read_fd(fds[0], back, err, sizeof(err));
    check(rc == -1 && strstr(err, "10 of 32"), "a short key on the pipe: %s", err);
    close(fds[0]);
    rc = key_read_fd(fds[0], back, err, sizeof(err));
    check(rc == -1 && strstr(err, "fd"), "a closed fd: %s", err);

    uint8_t mac[32];
    hmac_sha256(a, 32, "llm3d job id", 12, mac);
    check(job_id_from_key(a) == get_u64(mac) && job_id_from_key(a) != job_id_from_key(b), "job id = first 8 bytes of HMAC(key, 'llm3d job id')");

    pid_t pid = fork();
    if (pid == 0) {
        secure_harden_process();
        struct rlimit lim;
        getrlimit(RLIMIT_CORE, &lim);
        _exit(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 && lim.rlim_cur == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "secure_harden_process: not dumpable, no core files");

    snprintf(path, sizeof(path), "%s/job.key", dir); unlink(path);
    snprintf(path, sizeof(path), "%s/content.key", dir); unlink(path);
    rmdir(dir);
}

// ----------------------------------------------------------------------------
// frames

static const uint8_t frame_key[32] = {7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                      13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28};

// expect_refused: rc -1, a message, and the receiver's sequence untouched
static int expect_refused(int rc, const char *err, const Links *rx, int src, uint64_t seq_before, const char *what) {
    return check(rc == -1 && err[0] != '\0' && rx->recv_seq[src] == seq_before, "%s refused: %s", what, err);
}

// seal_next: a frame carrying the sequence number rx expects next from tx
static void seal_next(Links *tx, const Links *rx, int dst, int channel, uint64_t step, uint32_t microbatch,
                      size_t len, const uint8_t *payload, uint8_t *out) {
    tx->send_seq[dst] = rx->recv_seq[tx->rank];
    frame_seal(tx, dst, channel, step, microbatch, payload, len, out);
}

static void test_frames(void) {
    Links tx, rx;
    check(links_init(&tx, frame_key, 2, 4) == 0 && links_init(&rx, frame_key, 1, 4) == 0, "links_init ranks 2 and 1 of 4");
    check(links_init(&(Links){0}, frame_key, 4, 4) == -1 && links_init(&(Links){0}, frame_key, 0, 0) == -1 &&
          links_init(&(Links){0}, frame_key, -1, 4) == -1, "links_init refuses rank 4 of 4, world 0, rank -1");
    enum { LEN = 1000 };
    uint8_t payload[LEN];
    rng_fill(payload, LEN);
    size_t fb = frame_bytes(LEN);
    check(fb == LEN + 96, "frame_bytes(%d) = %zu", LEN, fb);
    uint8_t *f = malloc(fb), *g = malloc(fb);
    const uint8_t *got;
    char err[512];

    check(frame_seal(&tx, 1, CH_ACTIVATION, 12, 3, payload, LEN, f) == 0, "frame_seal");
    uint8_t magic_bytes[4] = {0x33, 0x4d, 0x4c, 0x4c};
    check(memcmp(f, magic_bytes, 4) == 0 && get_u16(f + 4) == 1 && get_u16(f + 6) == CH_ACTIVATION &&
          get_u64(f + 8) == tx.job_id && get_u32(f + 16) == 2 && get_u32(f + 20) == 1 && get_u64(f + 24) == 12 &&
          get_u32(f + 32) == 3 && get_u64(f + 40) == 0 && get_u64(f + 48) == LEN, "header bytes are the documented little-endian layout");
    uint8_t want_tag[32];
    hmac_sha256(frame_key, 32, f, 64 + LEN, want_tag);
    check(memcmp(f + 64 + LEN, want_tag, 32) == 0, "the tag is HMAC(key, header || payload)");
    int rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == 0 && got == f + 64 && memcmp(got, payload, LEN) == 0 && rx.recv_seq[2] == 1 && tx.send_seq[1] == 1,
          "round trip: payload back, sequence numbers advanced");

    // every rejection below starts from a frame with the right next sequence number
    uint64_t seq = rx.recv_seq[2];
    int positions[] = {0, LEN / 2, LEN - 1};
    for (int i = 0; i < 3; i++) {
        seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
        f[64 + positions[i]] ^= 0x20;
        rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
        check(rc == -1 && strstr(err, "tag does not match") && got == NULL && rx.recv_seq[2] == seq,
              "tampered payload byte %d refused: %s", positions[i], err);
    }
    int header_refused = 0;
    for (int i = 0; i < 64; i++) {
        seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
        f[i] ^= 0x01;
        err[0] = '\0';
        if (frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == -1 && rx.recv_seq[2] == seq) header_refused++;
        if (i == 60) printf("      (header byte 60, in the pad: %s)\n", err);
    }
    check(header_refused == 64, "a flipped bit in each of the 64 header bytes refused (%d of 64)", header_refused);
    int tag_refused = 0;
    for (int i = 0; i < 32; i++) {
        seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
        f[64 + LEN + i] ^= 0x80;
        if (frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == -1 && rx.recv_seq[2] == seq) tag_refused++;
    }
    check(tag_refused == 32, "a flipped bit in each of the 32 tag bytes refused (%d of 32): %s", tag_refused, err);
    // a key holder's frame with a nonzero reserved field, tagged right: a
    // sender of a future format, refused by the header check, not the tag
    int reserved_at[] = {36, 39};
    for (int i = 0; i < 2; i++) {
        seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
        f[reserved_at[i]] = 0x01;
        hmac_sha256(frame_key, 32, f, 64 + LEN, f + 64 + LEN);
        err[0] = '\0';
        rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
        check(rc == -1 && strstr(err, "reserved header fields are not zero") && rx.recv_seq[2] == seq,
              "a tagged frame with header byte %d (reserved) set refused: %s", reserved_at[i], err);
    }

    seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
    check(frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == 0, "a fresh frame opens");
    seq = rx.recv_seq[2];
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "replayed") && strstr(err, "from rank 2, channel activation, step 12"),
          "the same frame a second time (replay) refused: %s", err);

    tx.send_seq[1] = seq;
    frame_seal(&tx, 1, CH_ACTIVATION, 12, 3, payload, LEN, f);  // seq n
    frame_seal(&tx, 1, CH_ACTIVATION, 12, 3, payload, LEN, g);  // seq n + 1
    rc = frame_open(&rx, g, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "seq n+1 before seq n (reordered)");
    check(frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == 0 &&
          frame_open(&rx, g, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == 0, "then n and n+1 in order open");
    seq = rx.recv_seq[2];

    seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
    rc = frame_open(&rx, f, fb - 1, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "a frame one byte short (truncated)");
    rc = frame_open(&rx, f, 63, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "63 bytes (less than a header)");
    rc = frame_open(&rx, f, 0, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "0 bytes");
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, SIZE_MAX - 10, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "an expected length near SIZE_MAX");

    uint8_t other_key[32];
    memcpy(other_key, frame_key, 32);
    other_key[31] ^= 1;
    Links wrong;
    links_init(&wrong, other_key, 1, 4);
    wrong.recv_seq[2] = rx.recv_seq[2];
    rc = frame_open(&wrong, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "job id"), "a receiver with another key refused it (by job id): %s", err);
    wrong.job_id = rx.job_id;  // a key that somehow shares the job id still fails the tag
    rc = frame_open(&wrong, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "tag does not match"), "another key with the same job id refused (by tag): %s", err);
    links_free(&wrong);
    Links forger;  // a rank without the key, claiming to be rank 2 of this job
    links_init(&forger, other_key, 2, 4);
    forger.job_id = rx.job_id;
    forger.send_seq[1] = rx.recv_seq[2];
    frame_seal(&forger, 1, CH_ACTIVATION, 12, 3, payload, LEN, g);
    rc = frame_open(&rx, g, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "a frame from a rank without the key");
    links_free(&forger);

    rx.job_id ^= 1;
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    rx.job_id ^= 1;
    expect_refused(rc, err, &rx, 2, seq, "wrong job id");

    seal_next(&tx, &rx, 3, CH_ACTIVATION, 12, 3, LEN, payload, f);
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "misaddressed"), "misaddressed (dst 3 arriving at rank 1) refused: %s", err);

    seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
    rc = frame_open(&rx, f, fb, 0, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 0, 0, "wrong source (expected 0, sent by 2)");
    rc = frame_open(&rx, f, fb, 7, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "no such rank"), "source 7 of world 4 refused: %s", err);
    rc = frame_open(&rx, f, fb, 2, CH_GRADIENT, 12, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "wrong channel");
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 13, 3, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "wrong step");
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 4, LEN, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "wrong micro-batch");
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN - 1, &got, err, sizeof(err));
    expect_refused(rc, err, &rx, 2, seq, "wrong payload length");
    rc = frame_check_header(&rx, f, 2, CH_ACTIVATION, 12, 3, LEN, err, sizeof(err));
    check(rc == 0, "frame_check_header passes the header alone");
    check(frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == 0, "and the untouched frame still opens");
    seq = rx.recv_seq[2];

    // a key holder that writes nonzero reserved bytes (a future format)
    seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
    f[60] = 1;
    hmac_sha256(frame_key, 32, f, 64 + LEN, f + 64 + LEN);
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "reserved"), "nonzero pad under a valid tag refused: %s", err);

    // payload already in place: no copy
    tx.send_seq[1] = rx.recv_seq[2];
    memcpy(f + 64, payload, LEN);
    check(frame_seal(&tx, 1, CH_GRADIENT, 12, 0, f + 64, LEN, f) == 0 &&
          frame_open(&rx, f, fb, 2, CH_GRADIENT, 12, 0, LEN, &got, err, sizeof(err)) == 0 && memcmp(got, payload, LEN) == 0,
          "sealing a payload that already sits in the frame");
    seq = rx.recv_seq[2];
    tx.send_seq[1] = seq;
    check(frame_seal(&tx, 1, CH_CONTROL, 12, 0, NULL, 0, f) == 0 &&
          frame_open(&rx, f, frame_bytes(0), 2, CH_CONTROL, 12, 0, 0, &got, err, sizeof(err)) == 0, "an empty payload round trip");
    seq = rx.recv_seq[2];

    // the fault helpers
    seal_next(&tx, &rx, 1, CH_CONTROL, 12, 0, 0, payload, f);
    frame_tamper(f, frame_bytes(0));
    rc = frame_open(&rx, f, frame_bytes(0), 2, CH_CONTROL, 12, 0, 0, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "tag does not match"), "frame_tamper on an empty payload caught by the tag: %s", err);
    seal_next(&tx, &rx, 1, CH_ACTIVATION, 12, 3, LEN, payload, f);
    memcpy(g, f, fb);
    frame_tamper(f, fb);
    check(memcmp(f, g, fb) != 0, "frame_tamper changed the frame");
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "tag does not match"), "frame_tamper on a payload caught by the tag: %s", err);
    check(frame_open(&rx, g, fb, 2, CH_ACTIVATION, 12, 3, LEN, &got, err, sizeof(err)) == 0, "the untampered copy opens");
    seq = rx.recv_seq[2];
    check(links_rewind_send(&tx, 1) == 0, "links_rewind_send");
    frame_seal(&tx, 1, CH_ACTIVATION, 13, 0, payload, LEN, f);
    rc = frame_open(&rx, f, fb, 2, CH_ACTIVATION, 13, 0, LEN, &got, err, sizeof(err));
    check(rc == -1 && strstr(err, "replayed"), "a rewound sequence number refused as a replay: %s", err);
    check(links_rewind_send(&tx, 0) == -1 && links_rewind_send(&tx, 9) == -1, "links_rewind_send refuses a link with nothing sent, and rank 9");

    check(frame_seal(&tx, 4, CH_CONTROL, 0, 0, NULL, 0, f) == -1 && frame_seal(&tx, 1, CH_COUNT, 0, 0, NULL, 0, f) == -1,
          "frame_seal refuses destination 4 of 4 and channel %d", CH_COUNT);

    // a long conversation over several channels, in order
    int opened = 0;
    tx.send_seq[1] = rx.recv_seq[2];
    for (int i = 0; i < 200; i++) {
        int ch = i % 3 == 0 ? CH_ACTIVATION : i % 3 == 1 ? CH_GRADIENT : CH_CHECK;
        size_t len = (size_t)(rng_next() % LEN);
        frame_seal(&tx, 1, ch, (uint64_t)(i / 10), (uint32_t)(i % 10), payload, len, f);
        if (frame_open(&rx, f, frame_bytes(len), 2, ch, (uint64_t)(i / 10), (uint32_t)(i % 10), len, &got, err, sizeof(err)) == 0 &&
            memcmp(got, payload, len) == 0) opened++;
    }
    check(opened == 200, "200 frames of random lengths over 3 channels, in order: %d opened", opened);
    links_free(&tx);
    links_free(&rx);
    free(f);
    free(g);
}

// ----------------------------------------------------------------------------
// manifests and atomic writes

// seal_text: body + its tag line under key, as a manifest writer would
static size_t seal_text(const char *body, const uint8_t *key, char *out, size_t cap) {
    uint8_t tag[32];
    static const uint8_t zero[32] = {0};
    hmac_sha256(key != NULL ? key : zero, 32, body, strlen(body), tag);
    char hex[65];
    to_hex(tag, 32, hex);
    return (size_t)snprintf(out, cap, "%stag %s\n", body, hex);
}

static void test_manifests(void) {
    char dir[] = "/tmp/test_secure_man.XXXXXX";
    if (mkdtemp(dir) == NULL) { check(0, "mkdtemp %s", dir); return; }
    char err[1024];
    size_t big = 100000;
    uint8_t *model = malloc(big);
    rng_fill(model, big);
    write_bytes(dir, "model.bin", model, big);
    write_bytes(dir, "empty.bin", "", 0);
    write_bytes(dir, "b-c_d+e.1", "hello\n", 6);

    Manifest m = {0};
    check(manifest_add_file(&m, dir, "model.bin", err, sizeof(err)) == 0 &&
          manifest_add_file(&m, dir, "empty.bin", err, sizeof(err)) == 0 &&
          manifest_add_file(&m, dir, "b-c_d+e.1", err, sizeof(err)) == 0, "manifest_add_file x3");
    check(m.n == 3 && strcmp(m.e[0].name, "b-c_d+e.1") == 0 && strcmp(m.e[1].name, "empty.bin") == 0 &&
          strcmp(m.e[2].name, "model.bin") == 0, "entries kept in name order");
    uint8_t sha[32];
    sha256(model, big, sha);
    const ManifestEntry *e = manifest_find(&m, "model.bin");
    check(e != NULL && e->size == big && memcmp(e->sha, sha, 32) == 0, "model.bin entry: size and sha256");
    const char *bad_names[] = {"../x", ".hidden", "a b", "", "sub/file", "tab\tname"};
    for (int i = 0; i < 6; i++) {
        check(manifest_add_file(&m, dir, bad_names[i], err, sizeof(err)) == -1 && m.n == 3, "name '%s' refused: %s", bad_names[i], err);
    }
    check(manifest_add_file(&m, dir, "model.bin", err, sizeof(err)) == -1, "a second model.bin refused: %s", err);
    check(manifest_add_file(&m, dir, "nothere", err, sizeof(err)) == -1 && strstr(err, "nothere"), "a missing file: %s", err);

    uint8_t key[32], key2[32];
    key_generate(key, err, sizeof(err));
    key_generate(key2, err, sizeof(err));
    check(manifest_write(&m, dir, "manifest", key, err, sizeof(err)) == 0, "manifest_write");
    Manifest r = {0};
    int rc = manifest_read(&r, dir, "manifest", key, err, sizeof(err));
    int same = rc == 0 && r.n == m.n;
    for (int i = 0; same && i < m.n; i++) same = memcmp(&r.e[i], &m.e[i], sizeof(ManifestEntry)) == 0;
    check(same, "manifest_read gives back the same entries");
    check(manifest_verify_file(&r, dir, "model.bin", err, sizeof(err)) == 0 && manifest_verify_file(&r, dir, "empty.bin", err, sizeof(err)) == 0 &&
          manifest_verify_file(&r, dir, "b-c_d+e.1", err, sizeof(err)) == 0, "every listed file verifies");

    model[big / 3] ^= 4;
    write_bytes(dir, "model.bin", model, big);
    rc = manifest_verify_file(&r, dir, "model.bin", err, sizeof(err));
    check(rc == -1 && strstr(err, "model.bin") && strstr(err, "differs"), "one changed byte in a listed file: %s", err);
    model[big / 3] ^= 4;
    write_bytes(dir, "model.bin", model, big - 1);
    rc = manifest_verify_file(&r, dir, "model.bin", err, sizeof(err));
    check(rc == -1 && strstr(err, "size"), "a shortened listed file: %s", err);
    write_bytes(dir, "model.bin", model, big);
    check(manifest_verify_file(&r, dir, "model.bin", err, sizeof(err)) == 0, "restored, it verifies again");
    check(manifest_verify_file(&r, dir, "other.bin", err, sizeof(err)) == -1 && strstr(err, "not listed"), "an unlisted file: %s", err);
    manifest_free(&r);

    rc = manifest_read(&r, dir, "manifest", key2, err, sizeof(err));
    check(rc == -1 && strstr(err, "manifest") && strstr(err, "tag") && r.n == 0, "the wrong key: %s", err);
    rc = manifest_read(&r, dir, "manifest", NULL, err, sizeof(err));
    check(rc == -1, "the zero key on a keyed manifest: %s", err);

    char path[512];
    snprintf(path, sizeof(path), "%s/manifest", dir);
    size_t len;
    char *text = test_read_file(path, &len);
    check(len > 0 && strncmp(text, "llm3d-manifest 1\nfiles 3\nb-c_d+e.1 6 ", 36) == 0, "the manifest text begins as documented");
    int flips_refused = 0;
    for (size_t i = 0; i < len; i++) {
        text[i] ^= 0x01;
        if (manifest_parse(&r, text, len, key, err, sizeof(err)) == -1) flips_refused++;
        manifest_free(&r);
        text[i] ^= 0x01;
    }
    check(flips_refused == (int)len, "a flipped bit in each of the %zu manifest bytes refused (%d)", len, flips_refused);
    int cuts_refused = 0;
    for (size_t cut = 0; cut < len; cut++) {
        if (manifest_parse(&r, text, cut, key, err, sizeof(err)) == -1) cuts_refused++;
        manifest_free(&r);
    }
    check(cuts_refused == (int)len, "every truncation of the manifest refused (%d of %zu)", cuts_refused, len);
    manifest_parse(&r, text, len - 20, key, err, sizeof(err));
    printf("      (truncated: %s)\n", err);
    check(manifest_parse(&r, text, len, key, err, sizeof(err)) == 0 && r.n == 3, "the untouched text parses");
    manifest_free(&r);
    text[40] ^= 1;
    write_bytes(dir, "manifest", text, len);
    rc = manifest_read(&r, dir, "manifest", key, err, sizeof(err));
    check(rc == -1 && strstr(err, "tag does not match"), "a changed manifest byte on disk: %s", err);
    free(text);

    check(manifest_write(&m, dir, "zero.manifest", NULL, err, sizeof(err)) == 0 &&
          manifest_read(&r, dir, "zero.manifest", NULL, err, sizeof(err)) == 0 && r.n == 3, "an integrity-only (zero key) manifest round trip");
    manifest_free(&r);
    check(manifest_read(&r, dir, "zero.manifest", key, err, sizeof(err)) == -1, "a zero-key manifest is not accepted under a job key");
    check(manifest_read(&r, dir, "no.manifest", key, err, sizeof(err)) == -1 && strstr(err, "no.manifest"), "a missing manifest: %s", err);
    snprintf(path, sizeof(path), "%s/fifo", dir);
    if (mkfifo(path, 0600) == 0) {
        check(manifest_read(&r, dir, "fifo", key, err, sizeof(err)) == -1, "a FIFO as manifest refused without blocking: %s", err);
        unlink(path);
    }

    // the canonical form, each deviation under a correct tag
    const char *h64 = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    const char *H64 = "00112233445566778899AABBCCDDEEFF00112233445566778899aabbccddeeff";
    struct { const char *fmt; int ok; const char *what; } forms[] = {
        {"llm3d-manifest 1\nfiles 2\na 5 %s\nb 0 %s\n", 1, "a good manifest"},
        {"llm3d-manifest 1\nfiles 0\n", 1, "no files"},
        {"llm3d-manifest 2\nfiles 2\na 5 %s\nb 0 %s\n", 0, "version 2"},
        {"llm3d-manifest 1\nfiles 02\na 5 %s\nb 0 %s\n", 0, "count with a leading zero"},
        {"llm3d-manifest 1\nfiles 3\na 5 %s\nb 0 %s\n", 0, "count larger than the entries"},
        {"llm3d-manifest 1\nfiles 1\na 5 %s\nb 0 %s\n", 0, "count smaller than the entries"},
        {"llm3d-manifest 1\nfiles 2\na 05 %s\nb 0 %s\n", 0, "size with a leading zero"},
        {"llm3d-manifest 1\nfiles 2\na  5 %s\nb 0 %s\n", 0, "two spaces"},
        {"llm3d-manifest 1\nfiles 2\nb 5 %s\na 0 %s\n", 0, "entries out of order"},
        {"llm3d-manifest 1\nfiles 2\na 5 %s\na 0 %s\n", 0, "a name twice"},
        {"llm3d-manifest 1\r\nfiles 2\na 5 %s\nb 0 %s\n", 0, "CRLF"},
        {"llm3d-manifest 1\nfiles 2\na 18446744073709551616 %s\nb 0 %s\n", 0, "a size over 2^64-1"},
        {"llm3d-manifest 1\nfiles 2\n../a 5 %s\nb 0 %s\n", 0, "a path as name"},
        {"llm3d-manifest 1\nfiles 2\na 5 %s \nb 0 %s\n", 0, "a trailing space"},
        {"llm3d-manifest 1\nfiles 9999999\na 5 %s\nb 0 %s\n", 0, "a count that cannot fit"},
    };
    char body[1024], sealed[1200];
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        snprintf(body, sizeof(body), forms[i].fmt, h64, h64);
        size_t n = seal_text(body, key, sealed, sizeof(sealed));
        err[0] = '\0';
        rc = manifest_parse(&r, sealed, n, key, err, sizeof(err));
        if (forms[i].ok) check(rc == 0, "canonical form: %s parses (%s)", forms[i].what, err);
        else check(rc == -1 && r.n == 0 && r.e == NULL, "canonical form: %s refused: %s", forms[i].what, err);
        manifest_free(&r);
    }
    snprintf(body, sizeof(body), "llm3d-manifest 1\nfiles 1\na 5 %s\n", H64);
    size_t n = seal_text(body, key, sealed, sizeof(sealed));
    check(manifest_parse(&r, sealed, n, key, err, sizeof(err)) == -1, "canonical form: upper-case sha256 refused: %s", err);
    n = seal_text("llm3d-manifest 1\nfiles 0\n", key, sealed, sizeof(sealed));
    sealed[n - 2] = 'A';
    check(manifest_parse(&r, sealed, n, key, err, sizeof(err)) == -1, "canonical form: upper-case tag refused: %s", err);
    manifest_free(&m);

    // write_file_atomic
    check(write_file_atomic(dir, "atomic.txt", "first", 5, err, sizeof(err)) == 0 &&
          write_file_atomic(dir, "atomic.txt", "second!", 7, err, sizeof(err)) == 0, "write_file_atomic twice");
    snprintf(path, sizeof(path), "%s/atomic.txt", dir);
    text = test_read_file(path, &len);
    check(text != NULL && len == 7 && memcmp(text, "second!", 7) == 0, "the second write replaced the first");
    free(text);
    int leftovers = 0, files = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && strstr(de->d_name, ".tmp.") != NULL) leftovers++;
        if (de->d_name[0] != '.') files++;
    }
    if (d != NULL) closedir(d);
    check(leftovers == 0, "no temporary files left behind (%d)", leftovers);
    check(write_file_atomic(dir, "a/b", "x", 1, err, sizeof(err)) == -1, "a name with '/' refused: %s", err);
    check(write_file_atomic("/nonexistent/dir", "x", "x", 1, err, sizeof(err)) == -1 && strstr(err, "/nonexistent/dir"),
          "a missing directory: %s", err);

    const char *names[] = {"model.bin", "empty.bin", "b-c_d+e.1", "manifest", "zero.manifest", "atomic.txt"};
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    check(files == 6, "the test wrote the 6 files it expected (%d)", files);
    rmdir(dir);
    free(model);
}

static void test_faults(void) {
    struct { const char *spec; int kind, rank; long step; } good[] = {
        {"tamper:1:5", FAULT_TAMPER, 1, 5}, {"replay:0:0", FAULT_REPLAY, 0, 0},
        {"kill:3:100", FAULT_KILL, 3, 100}, {"stall:2:7", FAULT_STALL, 2, 7},
        {"slow:2:3", FAULT_SLOW, 2, 3}, {"drift:1:0", FAULT_DRIFT, 1, 0}, {"corrupt:1:4", FAULT_CORRUPT, 1, 4},
        {"corrupt-low:0:2", FAULT_CORRUPT_LOW, 0, 2}, {"poison:3:7", FAULT_POISON, 3, 7},
        {"corrupt-sum:1:3", FAULT_CORRUPT_SUM, 1, 3},
    };
    char err[256];
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        Fault f;
        int rc = fault_parse(good[i].spec, &f, err, sizeof(err));
        check(rc == 0 && f.kind == good[i].kind && f.rank == good[i].rank && f.step == good[i].step, "-fault %s", good[i].spec);
    }
    const char *bad[] = {"", "tamper", "tamper:1", "tamper:1:5:6", "boom:1:5", "tamper:-1:5", "tamper:1:x",
                         "tamper:1:", "tamper::5", "tamper:99999999999999999999:1", " tamper:1:5", "TAMPER:1:5",
                         "tamper:1:5 ", "tamper:+1:5", "tamper:65536:1", "tamper:1:9999999999999", "corrupt-:1:2",
                         "corruptlow:1:2", "corrupt-sum-:1:2"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        Fault f = {FAULT_KILL, 0, 0};
        err[0] = '\0';
        int rc = fault_parse(bad[i], &f, err, sizeof(err));
        check(rc == -1 && f.kind == FAULT_NONE && strstr(err, "-fault") != NULL, "-fault '%s' refused: %s", bad[i], err);
    }
    Fault f;
    fault_parse("stall:2:7", &f, err, sizeof(err));
    check(fault_fires(&f, 2, 7) && !fault_fires(&f, 2, 8) && !fault_fires(&f, 1, 7), "fault_fires only on rank 2 at step 7");
    fault_parse("slow:2:3", &f, err, sizeof(err));
    check(fault_slow_fires(&f, 2, 3) && fault_slow_fires(&f, 2, 40) && !fault_slow_fires(&f, 2, 2) &&
          !fault_slow_fires(&f, 1, 3), "a slow fault acts on rank 2 from step 3 on");
    fault_parse("poison:2:3", &f, err, sizeof(err));
    check(fault_poison_fires(&f, 2, 3) && fault_poison_fires(&f, 2, 9) && !fault_poison_fires(&f, 2, 2) &&
          !fault_poison_fires(&f, 0, 3) && fault_flip_bit(FAULT_CORRUPT) == 30 && fault_flip_bit(FAULT_CORRUPT_LOW) == 0 &&
          fault_flip_bit(FAULT_CORRUPT_SUM) == 18,
          "poison acts on rank 2 from step 3 on; corrupt flips bit 30, corrupt-low bit 0, corrupt-sum bit 18");
    Fault none = {FAULT_NONE, 0, 0};
    check(!fault_fires(&none, 0, 0) && !fault_fires(NULL, 0, 0), "no fault never fires");
}

// ----------------------------------------------------------------------------
// chunked MAC (chunkmac.h; doc/security.md, "Chunked MAC")

static void chunk_le64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

// the construction's inputs spelled out here byte by byte: the final tag's
// 128-byte prefix (the chunk tags follow it), and chunk i's whole input
static void final_prefix_by_hand(uint8_t *final, const uint8_t header[64], size_t len, size_t chunk, size_t n) {
    memset(final, 0, 64);
    memcpy(final, "llm3d final tag", 16);
    chunk_le64(final + 16, n);
    chunk_le64(final + 24, len);
    chunk_le64(final + 32, chunk);
    memcpy(final + 64, header, 64);
}

// returns the input's length, 128 + the chunk's bytes
static size_t chunk_input_by_hand(uint8_t *buf, const uint8_t header[64], const uint8_t *payload, size_t len,
                                  size_t chunk, size_t n, size_t i) {
    size_t take = len - i * chunk < chunk ? len - i * chunk : chunk;
    memset(buf, 0, 64);
    memcpy(buf, "llm3d chunk tag", 16);
    chunk_le64(buf + 16, i);
    chunk_le64(buf + 24, n);
    chunk_le64(buf + 32, len);
    chunk_le64(buf + 40, chunk);
    memcpy(buf + 64, header, 64);
    memcpy(buf + 128, payload + i * chunk, take);
    return 128 + take;
}

// the construction by hand, on secure.h's plain HMAC
static void chunkmac_by_hand(const uint8_t key[32], const uint8_t header[64], const uint8_t *payload, size_t len,
                             size_t chunk, uint8_t out[32]) {
    size_t n = (len + chunk - 1) / chunk;
    uint8_t *buf = malloc(128 + chunk), *final = malloc(128 + 32 * n);
    final_prefix_by_hand(final, header, len, chunk, n);
    for (size_t i = 0; i < n; i++) {
        size_t bytes = chunk_input_by_hand(buf, header, payload, len, chunk, n, i);
        hmac_sha256(key, 32, buf, bytes, final + 128 + 32 * i);
    }
    hmac_sha256(key, 32, final, 128 + 32 * n, out);
    free(buf);
    free(final);
}

static const uint8_t *chunk_header(void) {  // a real frame header
    static uint8_t header[64];
    FrameHeader h;
    memset(&h, 0, sizeof(h));
    h.magic = FRAME_MAGIC;
    h.version = FRAME_VERSION;
    h.channel = CH_ACTIVATION;
    h.job_id = 0x1122334455667788ull;
    h.src = 1, h.dst = 2, h.step = 7, h.microbatch = 3, h.seq = 41, h.payload_len = 0;
    frame_header_write(&h, header);
    return header;
}

static void test_chunkmac_known_answers(void) {
    uint8_t key[32], header[64];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++) header[i] = (uint8_t)(100 + i);
    size_t big = 150001;
    uint8_t *payload = malloc(big);
    for (size_t i = 0; i < big; i++) payload[i] = (uint8_t)(i * 7 + 3);
    Hmac keyed;
    hmac_init(&keyed, key, 32);
    // from Python's hmac module (doc/security.md has the script): nothing of secure.h's
    struct { size_t len, chunk; const char *hex; } pinned[] = {
        {150001, 65536, "ca2e1e05040cb0f2ac0c19b6c13926e4dc7736c2d59e7e340c22c75ef99bb838"},
        {130, 64, "fc7a454ac5e2a02e90bb86346af4d9610d3db95a069d6b94807042bcf3df9721"},
        {0, 65536, "fb9125ed63da8d1d71d5cb1815c08b15862168ce2f799c7007baee660f34340d"},
    };
    for (int k = 0; k < 3; k++) {
        uint8_t tag[32];
        char hex[65];
        int rc = chunkmac_tag(&keyed, header, payload, pinned[k].len, pinned[k].chunk, tag, NULL, 0);
        to_hex(tag, 32, hex);
        check(rc == 0 && strcmp(hex, pinned[k].hex) == 0, "chunked MAC pinned vector: %zu bytes in %zu-byte chunks: %.16s...",
              pinned[k].len, pinned[k].chunk, hex);
    }
    // by hand on many lengths around the chunk and block edges
    size_t chunks[] = {64, 128, 4096, CHUNKMAC_CHUNK_BYTES};
    int cases = 0, agree = 0, chunk_agree = 0, chunk_cases = 0;
    for (int c = 0; c < 4; c++) {
        size_t ch = chunks[c];
        size_t lens[] = {0, 1, 55, 56, 63, 64, 65, ch - 1, ch, ch + 1, 2 * ch + 55, 2 * ch + 56, 3 * ch - 1, 3 * ch};
        for (size_t j = 0; j < sizeof(lens) / sizeof(lens[0]); j++) {
            size_t len = lens[j];
            if (len > big) continue;
            uint8_t mine[32], want[32];
            chunkmac_tag(&keyed, chunk_header(), payload, len, ch, mine, NULL, 0);
            chunkmac_by_hand(key, chunk_header(), payload, len, ch, want);
            cases++;
            agree += memcmp(mine, want, 32) == 0;
            // each tag_i alone, against the by-hand input of chunk i
            size_t n = chunkmac_count(len, ch);
            for (size_t i = 0; i < n; i++) {
                uint8_t *buf = malloc(128 + ch), got[32], ref[32];
                size_t bytes = chunk_input_by_hand(buf, chunk_header(), payload, len, ch, n, i);
                hmac_sha256(key, 32, buf, bytes, ref);
                chunkmac_chunk_tag(&keyed, chunk_header(), payload, len, ch, i, got);
                chunk_cases++;
                chunk_agree += memcmp(got, ref, 32) == 0;
                free(buf);
            }
        }
    }
    check(cases > 40 && agree == cases, "chunked MAC = the construction by hand on plain HMAC: %d of %d lengths (0..3 chunks, chunks 64 B..64 KiB)",
          agree, cases);
    check(chunk_agree == chunk_cases, "each chunk tag alone = HMAC of its input by hand: %d of %d", chunk_agree, chunk_cases);
    free(payload);
}

// the by-hand inputs through the openssl command: no secure.h hashing at all
static void test_chunkmac_openssl(void) {
    char dir[] = "/tmp/test_secure_chunk.XXXXXX";
    if (!openssl_tmpdir(dir, "the chunked MAC")) return;
    uint8_t key[32], header[64];
    char key_hex[65];
    rng_fill(key, 32);
    rng_fill(header, 64);
    to_hex(key, 32, key_hex);
    Hmac keyed;
    hmac_init(&keyed, key, 32);
    struct { size_t len, chunk; } cases[] = {{0, 4096}, {1, 64}, {4096 * 5 + 77, 4096}, {3 * CHUNKMAC_CHUNK_BYTES + 1000, CHUNKMAC_CHUNK_BYTES}};
    int agree = 0;
    for (int k = 0; k < 4; k++) {
        size_t len = cases[k].len, ch = cases[k].chunk, n = chunkmac_count(len, ch);
        uint8_t *payload = malloc(len + 1), *buf = malloc(128 + ch), *final = malloc(128 + 32 * n);
        rng_fill(payload, len);
        final_prefix_by_hand(final, header, len, ch, n);
        char path[300];
        size_t cmd_cap = 200 + (n + 1) * sizeof(path);
        char *cmd = malloc(cmd_cap);
        snprintf(cmd, cmd_cap, "openssl dgst -sha256 -mac HMAC -macopt hexkey:%s -r", key_hex);
        for (size_t i = 0; i < n; i++) {
            char name[32];
            snprintf(name, sizeof(name), "chunk%03zu", i);
            snprintf(path, sizeof(path), "%s/%s", dir, name);
            write_bytes(dir, name, buf, chunk_input_by_hand(buf, header, payload, len, ch, n, i));
            strcat(cmd, " ");
            strcat(cmd, path);
        }
        size_t got_tags = 0;
        if (n > 0) {  // tag_i from openssl, in order
            FILE *p = popen(cmd, "r");
            char line[512];
            while (p != NULL && got_tags < n && fgets(line, sizeof(line), p) != NULL)
                if (hex_decode(line, 32, final + 128 + 32 * got_tags, 1) == 0) got_tags++;
            if (p != NULL) pclose(p);
        }
        snprintf(path, sizeof(path), "%s/final", dir);
        write_bytes(dir, "final", final, 128 + 32 * n);
        snprintf(cmd, cmd_cap, "openssl dgst -sha256 -mac HMAC -macopt hexkey:%s -r %s", key_hex, path);
        uint8_t want[32], mine[32];
        int have = 0;
        FILE *p = popen(cmd, "r");
        char line[512];
        if (p != NULL && fgets(line, sizeof(line), p) != NULL) have = hex_decode(line, 32, want, 1) == 0;
        if (p != NULL) pclose(p);
        chunkmac_tag(&keyed, header, payload, len, ch, mine, NULL, 0);
        agree += have && got_tags == n && memcmp(mine, want, 32) == 0;
        unlink(path);
        for (size_t i = 0; i < n; i++) {
            snprintf(path, sizeof(path), "%s/chunk%03zu", dir, i);
            unlink(path);
        }
        free(cmd);
        free(payload);
        free(buf);
        free(final);
    }
    rmdir(dir);
    check(agree == 4, "chunked MAC = openssl HMAC composed by hand (0 B, 1 B, 5 chunks + 77 B of 4 KiB, 3 chunks + 1000 B of 64 KiB): %d of 4", agree);
}

// every change an attacker could make to a chunked message changes its tag
static void test_chunkmac_changes(void) {
    const size_t ch = 4096, len = 3 * ch + 1500;  // three whole chunks and a short one
    uint8_t key[32], other_key[32], header[64], base[32], tag[32];
    rng_fill(key, 32);
    memcpy(other_key, key, 32);
    other_key[31] ^= 1;
    memcpy(header, chunk_header(), 64);
    uint8_t *payload = malloc(len), *changed = malloc(len);
    rng_fill(payload, len);
    Hmac keyed, other;
    hmac_init(&keyed, key, 32);
    hmac_init(&other, other_key, 32);
    char err[256];
    check(chunkmac_tag(&keyed, header, payload, len, ch, base, err, sizeof(err)) == 0 &&
          chunkmac_verify(&keyed, header, payload, len, ch, base, err, sizeof(err)) == 0, "chunked MAC verifies its own tag");

    // a flipped bit at the first, a middle and the last byte of every chunk
    int flips = 0, caught = 0, refused = 0;
    for (size_t i = 0; i < chunkmac_count(len, ch); i++) {
        size_t start = i * ch, end = start + ch < len ? start + ch : len;
        size_t at[3] = {start, (start + end) / 2, end - 1};
        for (int k = 0; k < 3; k++) {
            memcpy(changed, payload, len);
            changed[at[k]] ^= 0x10;
            chunkmac_tag(&keyed, header, changed, len, ch, tag, NULL, 0);
            flips++;
            caught += memcmp(tag, base, 32) != 0;
            err[0] = '\0';
            refused += chunkmac_verify(&keyed, header, changed, len, ch, base, err, sizeof(err)) == -1 &&
                       strstr(err, "does not match") != NULL;
        }
    }
    check(flips == 12 && caught == flips && refused == flips, "a flipped byte in any chunk changes the tag and is refused: %d of %d (%s)",
          caught, flips, err);

    // chunks 0 and 1 swapped
    memcpy(changed, payload + ch, ch);
    memcpy(changed + ch, payload, ch);
    memcpy(changed + 2 * ch, payload + 2 * ch, len - 2 * ch);
    chunkmac_tag(&keyed, header, changed, len, ch, tag, NULL, 0);
    check(memcmp(tag, base, 32) != 0, "swapped chunks change the tag");
    // the same bytes in chunk 0 and chunk 1: their tags still differ (the index is bound)
    memcpy(changed, payload, ch);
    memcpy(changed + ch, payload, ch);
    uint8_t t0[32], t1[32];
    chunkmac_chunk_tag(&keyed, header, changed, len, ch, 0, t0);
    chunkmac_chunk_tag(&keyed, header, changed, len, ch, 1, t1);
    check(memcmp(t0, t1, 32) != 0, "two chunks of equal bytes get different chunk tags");

    // truncations: one byte, the short last chunk, a whole chunk more; and one zero byte appended
    size_t cut[3] = {len - 1, 3 * ch, 2 * ch + 1500};
    int cuts = 0;
    for (int k = 0; k < 3; k++) {
        chunkmac_tag(&keyed, header, payload, cut[k], ch, tag, NULL, 0);
        cuts += memcmp(tag, base, 32) != 0;
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, payload, len);
    longer[len] = 0;
    chunkmac_tag(&keyed, header, longer, len + 1, ch, tag, NULL, 0);
    cuts += memcmp(tag, base, 32) != 0;
    check(cuts == 4, "a payload cut short (by 1 byte, by its short last chunk, by 4096 bytes) or one zero byte longer has another tag: %d of 4",
          cuts);

    chunkmac_tag(&other, header, payload, len, ch, tag, NULL, 0);
    check(memcmp(tag, base, 32) != 0, "a key differing in one bit changes the tag");

    // any header byte: a message's chunks cannot be moved into another message
    int header_changes = 0, chunk_tags_moved = 0;
    chunkmac_chunk_tag(&keyed, header, payload, len, ch, 1, t0);
    for (int b = 0; b < 64; b++) {
        uint8_t h2[64];
        memcpy(h2, header, 64);
        h2[b] ^= 0x01;
        chunkmac_tag(&keyed, h2, payload, len, ch, tag, NULL, 0);
        header_changes += memcmp(tag, base, 32) != 0;
        chunkmac_chunk_tag(&keyed, h2, payload, len, ch, 1, t1);
        chunk_tags_moved += memcmp(t0, t1, 32) != 0;
    }
    check(header_changes == 64 && chunk_tags_moved == 64,
          "a flipped bit in any of the 64 header bytes changes the tag (%d) and every chunk tag (%d)", header_changes, chunk_tags_moved);

    chunkmac_tag(&keyed, header, payload, len, 2 * ch, tag, NULL, 0);
    check(memcmp(tag, base, 32) != 0, "the same payload in 8 KiB chunks has another tag");
    uint8_t *framed = malloc(64 + len);
    memcpy(framed, header, 64);
    memcpy(framed + 64, payload, len);
    hmac_sha256(key, 32, framed, 64 + len, tag);
    check(memcmp(tag, base, 32) != 0, "the plain frame tag HMAC(header || payload) differs from the chunked one");

    // the empty payload has a tag of its own, bound to the header
    uint8_t e0[32], e1[32];
    int rc = chunkmac_tag(&keyed, header, NULL, 0, ch, e0, NULL, 0);
    header[40] ^= 1;  // seq
    chunkmac_tag(&keyed, header, NULL, 0, ch, e1, NULL, 0);
    check(rc == 0 && chunkmac_count(0, ch) == 0 && memcmp(e0, e1, 32) != 0, "a 0-byte payload: no chunks, a tag that still binds the header");

    uint64_t bad[] = {0, 63, 100, 4097, CHUNKMAC_MAX_CHUNK_BYTES + 64};
    int refused_sizes = 0;
    for (int k = 0; k < 5; k++) {
        char want[64];
        snprintf(want, sizeof(want), "chunk_bytes %" PRIu64 " ", bad[k]);
        err[0] = '\0';
        refused_sizes += chunkmac_tag(&keyed, header, payload, len, bad[k], tag, err, sizeof(err)) == -1 && strstr(err, want) != NULL;
    }
    check(refused_sizes == 5, "chunk sizes 0, 63, 100, 4097, 16 MiB + 64 are refused, naming chunk_bytes: %s", err);
    free(payload);
    free(changed);
    free(longer);
    free(framed);
}

// ----------------------------------------------------------------------------
// -corpus DIR: the fuzz seeds, sealed with the key the fuzz targets use
// (bytes 0, 1, ..., 31; see dev/fuzz/fuzz_frame.c)

static int write_corpus(const char *dir) {
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i;
    Links tx;
    if (links_init(&tx, key, 2, 4) != 0) return 1;
    char path[1024];
    uint8_t frame[96 + 64];
    const char *payload = "sixteen bytes!!!abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKL";
    struct { const char *name; size_t len; } frames[] = {{"empty", 0}, {"sixteen", 16}, {"sixtyfour", 64}};
    for (int i = 0; i < 3; i++) {
        tx.send_seq[1] = 0;
        frame_seal(&tx, 1, CH_ACTIVATION, 7, 0, payload, frames[i].len, frame);
        snprintf(path, sizeof(path), "%s/frame/%s", dir, frames[i].name);
        test_write_file(path, frame, frame_bytes(frames[i].len));
    }
    links_free(&tx);
    const char *h64 = "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d";
    char body[1024], sealed[1200];
    snprintf(body, sizeof(body), "llm3d-manifest 1\nfiles 3\nmodel.bin 497764352 %s\nstate.bin 0 %s\nz 12 %s\n", h64, h64, h64);
    struct { const char *name; const char *text; int seal; } mans[] = {
        {"three", body, 1}, {"none", "llm3d-manifest 1\nfiles 0\n", 1}, {"body_only", body, 0},
    };
    for (int i = 0; i < 3; i++) {
        size_t n = mans[i].seal ? seal_text(mans[i].text, NULL, sealed, sizeof(sealed))
                                : (size_t)snprintf(sealed, sizeof(sealed), "%s", mans[i].text);
        snprintf(path, sizeof(path), "%s/manifest/%s", dir, mans[i].name);
        test_write_file(path, sealed, n);
    }
    printf("wrote seeds under %s/frame and %s/manifest\n", dir, dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "-corpus") == 0) return write_corpus(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [-corpus DIR]\n", argv[0]);
        return 2;
    }
    printf("SHA-NI on this CPU: %s\n", sha256_has_shani() ? "yes" : "no");
    test_basics();
    test_fips_rfc();
    test_wycheproof();
    sha256_force_portable(1);  // the vectors again, through the portable path
    printf("-- the vectors again, portable SHA-256 forced\n");
    test_fips_rfc();
    test_wycheproof();
    sha256_force_portable(0);
    test_portable_vs_shani();
    test_openssl();
    test_keys();
    test_frames();
    test_manifests();
    test_faults();
    test_chunkmac_known_answers();
    test_chunkmac_openssl();
    test_chunkmac_changes();
    return test_summary();
}
