/*
 * fuzz_manifest.c: libFuzzer target for manifest_parse.
 *
 *   make dev/fuzz/fuzz_manifest
 *   ./dev/fuzz/fuzz_manifest -max_total_time=20 dev/fuzz/corpus/manifest   # fuzz
 *   ./dev/fuzz/fuzz_manifest -runs=0 dev/fuzz/corpus/manifest             # replay the seeds only (CI)
 *
 * A random input almost never carries a valid tag, which would stop the
 * parser at its first check. So each input is parsed twice: as it is, and as
 * a body followed by the tag line it needs (zero key), which lets the fuzzer
 * reach the line parser. Whatever parses must print back to the same bytes:
 * the format has one spelling.
 */
#include "llm3d/secure/manifest.h"

static void must(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "fuzz_manifest: broken invariant: %s\n", what);
        abort();
    }
}

static void parse_and_check(const char *text, size_t len) {
    Manifest m;
    char err[512];
    err[0] = '\0';
    if (manifest_parse(&m, text, len, NULL, err, sizeof(err)) != 0) {
        must(m.n == 0 && m.e == NULL && err[0] != '\0', "a refused manifest leaves nothing and says why");
        return;
    }
    char *again;
    size_t again_len;
    must(manifest_format(&m, NULL, &again, &again_len, err, sizeof(err)) == 0, "a parsed manifest formats");
    must(again_len == len && memcmp(again, text, len) == 0, "parse then format gives back the same bytes");
    free(again);
    manifest_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 20)) return 0;
    parse_and_check((const char *)data, size);

    static const uint8_t zero_key[32] = {0};
    uint8_t tag[32];
    hmac_sha256(zero_key, 32, data, size, tag);
    char *sealed = malloc(size + 4 + 64 + 1);
    must(sealed != NULL, "malloc");
    memcpy(sealed, data, size);
    memcpy(sealed + size, "tag ", 4);
    to_hex(tag, 32, sealed + size + 4);
    sealed[size + 4 + 64] = '\n';
    parse_and_check(sealed, size + 4 + 64 + 1);
    free(sealed);
    return 0;
}
