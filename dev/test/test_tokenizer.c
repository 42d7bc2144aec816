/*
 * test_tokenizer.c: tokenizer.h and prepare_data against known answers.
 *
 * Covers: the Unicode classes and UTF-8 decoder; the sample's text
 * (tokenizer_safe_text: control bytes, ESC and invalid UTF-8 escaped, text
 * and a UTF-8 character split over tokens kept); the pre-tokenizer against
 * splits made by GPT-2's own regex (the `regex` module); every vector in
 * gpt2/encode_vectors.json; the tinyshakespeare token count (338025, llm.c's
 * figure); decode(encode(x)) == x on tinyshakespeare, alice and random bytes;
 * block-wise encoding == whole-file encoding; the .bin writer and loader
 * (GPT-2 and byte-level); one-line errors for missing and malformed
 * encoder.json / vocab.bpe / .bin files; and prepare_data end to end
 * (shards, split, EOT, bad flags), when ./prepare_data has been built.
 *
 * Build: make dev/test/test_tokenizer prepare_data
 * Run from the repo root; data from $LLM3D_DATA or ../shared/data.
 */
#define _POSIX_C_SOURCE 200809L  // mkdtemp, popen

#include <stdint.h>
#include <sys/stat.h>

#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "llm3d/tokenizer.h"

static char tmp_dir[64];

static void write_text(const char *path, const char *text) { test_write_file(path, text, strlen(text)); }

// one_line_error: the failure message is non-empty, one line, and names the file
static int one_line_error(const char *err, const char *path) {
    return err[0] != '\0' && strchr(err, '\n') == NULL && strstr(err, path) != NULL;
}

// ----------------------------------------------------------------------------

static void test_unicode(void) {
    struct { uint32_t cp; int cls; } cases[] = {
        {'a', UNICODE_LETTER}, {'Z', UNICODE_LETTER}, {'7', UNICODE_NUMBER}, {' ', UNICODE_SPACE},
        {'\t', UNICODE_SPACE}, {'\n', UNICODE_SPACE}, {0x0B, UNICODE_SPACE}, {'\'', UNICODE_OTHER},
        {0x1C, UNICODE_OTHER},     // Python's re says space; the regex module (GPT-2's) does not
        {0x85, UNICODE_SPACE}, {0xA0, UNICODE_SPACE}, {0x3000, UNICODE_SPACE}, {0x2028, UNICODE_SPACE},
        {0x200B, UNICODE_OTHER},   // zero width space is Cf, not White_Space
        {0xE9, UNICODE_LETTER}, {0xBD, UNICODE_NUMBER}, {0x4E2D, UNICODE_LETTER}, {0x0663, UNICODE_NUMBER},
        {0x2167, UNICODE_NUMBER}, {0x02B0, UNICODE_LETTER}, {0x0301, UNICODE_OTHER}, {0x1F600, UNICODE_OTHER},
        {0x20000, UNICODE_LETTER}, {0x10FFFF, UNICODE_OTHER},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = unicode_class(cases[i].cp);
        if (got != cases[i].cls) { printf("      U+%04X: class %d, want %d\n", cases[i].cp, got, cases[i].cls); bad++; }
    }
    check(bad == 0, "unicode_class on %zu code points (table: Unicode %s, %d ranges)", sizeof(cases) / sizeof(cases[0]),
          UNICODE_TABLE_VERSION, UNICODE_RANGE_COUNT);
}

static void test_utf8(void) {
    struct { const char *bytes; int len; uint32_t cp; } cases[] = {
        {"A", 1, 'A'}, {"\xc3\xa9", 2, 0xE9}, {"\xe2\x82\xac", 3, 0x20AC}, {"\xf0\x9f\x98\x80", 4, 0x1F600},
        {"\xf4\x8f\xbf\xbf", 4, 0x10FFFF},
        {"\xc0\x80", 0, 0}, {"\xc1\xbf", 0, 0},       // overlong
        {"\xe0\x80\xaf", 0, 0},                       // overlong 3-byte
        {"\xed\xa0\x80", 0, 0},                       // a surrogate
        {"\xf4\x90\x80\x80", 0, 0},                   // above U+10FFFF
        {"\xf5\x80\x80\x80", 0, 0}, {"\xff", 0, 0}, {"\x80", 0, 0},
        {"\xe2\x82", 0, 0},                           // truncated
        {"\xe2\x28\xa1", 0, 0},                       // bad continuation
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t cp = 0;
        int len = utf8_decode((const unsigned char *)cases[i].bytes, strlen(cases[i].bytes), &cp);
        if (len != cases[i].len || (len > 0 && cp != cases[i].cp)) {
            printf("      case %zu: length %d cp U+%04X, want %d U+%04X\n", i, len, cp, cases[i].len, cases[i].cp);
            bad++;
        }
        unsigned char enc[4];
        if (len > 0 && (utf8_encode(cp, enc) != len || memcmp(enc, cases[i].bytes, (size_t)len) != 0)) {
            printf("      case %zu: utf8_encode does not give the bytes back\n", i);
            bad++;
        }
    }
    check(bad == 0, "utf8_decode/utf8_encode on %zu valid and invalid sequences", sizeof(cases) / sizeof(cases[0]));
}

// safe_text_of: the tokens (each a string; "" ends the list), as
// tokenizer_safe_text prints them one after another, the text ended
static const char *safe_text_of(const char *const *tokens, const int *lens) {
    static char all[8192];
    char out[TOKENIZER_SAFE_MAX];
    SafeText t = {{0}, 0};
    size_t n = 0;
    for (int i = 0; lens[i] > 0; i++) {
        int k = tokenizer_safe_text(&t, tokens[i], lens[i], out, sizeof(out));
        memcpy(all + n, out, (size_t)k);
        n += (size_t)k;
    }
    int k = tokenizer_safe_text(&t, NULL, 0, out, sizeof(out));
    memcpy(all + n, out, (size_t)k);
    all[n + (size_t)k] = '\0';
    return all;
}

// 1 if s is all printable: ASCII 0x20..0x7e, newline, tab, and valid UTF-8
// characters above U+009F
static int all_printable(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = utf8_decode(u + i, n - i, &cp);
        if (k == 0 || (k == 1 && (cp < 0x20 || cp == 0x7f) && cp != '\n' && cp != '\t') || (k > 1 && cp < 0xA0)) return 0;
        i += (size_t)k;
    }
    return 1;
}

// the sample's text: control bytes and ESC escaped, text as it is, a UTF-8
// character split over tokens printed whole
static void test_safe_text(void) {
    struct { const char *what, *tokens[6]; int lens[7]; const char *want; } cases[] = {
        {"control bytes", {"\x01", "\x1d", "\x1f", "\x0b", "\x7f", "\r"}, {1, 1, 1, 1, 1, 1, 0},
         "\\x01\\x1d\\x1f\\x0b\\x7f\\x0d"},
        {"ESC before a colour code", {"\x1b", "[31m", "red"}, {1, 4, 3, 0}, "\\x1b[31mred"},
        {"NUL (the byte-level EOT)", {"a", "\0", "b"}, {1, 1, 1, 0}, "a\\x00b"},
        {"plain text, newline and tab", {"Hello,", " world\n", "\tend"}, {6, 7, 4, 0}, "Hello, world\n\tend"},
        {"é split over two tokens", {"caf\xc3", "\xa9 au lait"}, {4, 9, 0}, "caf\xc3\xa9 au lait"},
        {"an emoji split over three tokens", {"\xf0\x9f", "\x98", "\x80!"}, {2, 1, 2, 0}, "\xf0\x9f\x98\x80!"},
        {"a character never ended", {"\xe2\x82", "A"}, {2, 1, 0}, "\\xe2\\x82A"},
        {"a character cut short by the end", {"ok\xe2\x82"}, {4, 0}, "ok\\xe2\\x82"},
        {"invalid UTF-8: 0xff, a lone continuation, an overlong /", {"\xff", "\x80", "\xc0\xaf"}, {1, 1, 2, 0},
         "\\xff\\x80\\xc0\\xaf"},
        {"C1 control U+009B (CSI) escaped, U+00A0 kept", {"\xc2\x9b", "\xc2\xa0"}, {2, 2, 0}, "\\xc2\\x9b\xc2\xa0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *got = safe_text_of(cases[i].tokens, cases[i].lens);
        char shown[256];  // a line of its own: newline, tab and what is not printable shown as tok_show's \xNN
        int plain = all_printable(got) && strpbrk(got, "\n\t") == NULL;
        check(strcmp(got, cases[i].want) == 0, "safe text, %s: '%s'", cases[i].what,
              plain ? got : tok_show((const unsigned char *)got, strlen(got), shown, sizeof(shown)));
    }
    // a character split over two tokens: the first prints what comes before it
    // and holds it, the second prints it whole
    SafeText t = {{0}, 0};
    char a[TOKENIZER_SAFE_MAX], b[TOKENIZER_SAFE_MAX], c[TOKENIZER_SAFE_MAX];
    int na = tokenizer_safe_text(&t, "caf\xc3", 4, a, sizeof(a));
    int nb = tokenizer_safe_text(&t, "\xa9", 1, b, sizeof(b));
    int nc = tokenizer_safe_text(&t, NULL, 0, c, sizeof(c));
    check(na == 3 && strcmp(a, "caf") == 0 && nb == 2 && strcmp(b, "\xc3\xa9") == 0 && nc == 0 && c[0] == '\0',
          "é split: 'caf' first, then é whole, nothing held at the end (%d, %d, %d bytes)", na, nb, nc);
    // every byte as a token (the byte-level tokenizer), then a 255-byte token after a held start
    const char *bytes[257];
    int lens[257];
    char each[256];
    for (int i = 0; i < 256; i++) { each[i] = (char)i; bytes[i] = each + i; lens[i] = 1; }
    lens[256] = 0;
    const char *all = safe_text_of(bytes, lens);
    check(all_printable(all) && strstr(all, " !\"#") != NULL && strstr(all, "\\x1b") != NULL,
          "all 256 bytes as tokens: printable text only (%zu bytes), printable ASCII as it is, ESC as \\x1b", strlen(all));
    char big[255];
    memset(big, 'a', sizeof(big));
    SafeText u = {{0}, 0};
    int n1 = tokenizer_safe_text(&u, "\xf0\x9f\x98", 3, a, sizeof(a));
    int n2 = tokenizer_safe_text(&u, big, 255, b, sizeof(b));
    check(n1 == 0 && n2 == 12 + 255 && memcmp(b, "\\xf0\\x9f\\x98aaa", 15) == 0 && all_printable(b),
          "3 held bytes and a 255-byte token that does not end them: the 3 escaped, the 255 kept (%d bytes)", n2);
}

// expected splits from GPT-2's regex (the `regex` module's findall)
static void test_pretokenizer(void) {
    struct { const char *text; const char *pieces[10]; } cases[] = {
        {"Hello world", {"Hello", " world"}},
        {"a   b", {"a", "  ", " b"}},
        {"a   ", {"a", "   "}},
        {"I'm he's they'RE we've", {"I", "'m", " he", "'s", " they", "'", "RE", " we", "'ve"}},
        {" 123abc", {" 123", "abc"}},
        {"x\n\n\ny", {"x", "\n\n", "\n", "y"}},
        {"\t\n", {"\t\n"}},
        {"  \xe3\x80\x80x", {"  ", "\xe3\x80\x80", "x"}},
        {"caf\xc3\xa9 \xc2\xbd!!  ?", {"caf\xc3\xa9", " \xc2\xbd", "!!", " ", " ?"}},
        {"'''", {"'''"}},
        {"a's'll", {"a", "'s", "'ll"}},
        {"\x1c\x1d a", {"\x1c\x1d", " a"}},
        {"x\xc2\xa0y", {"x", "\xc2\xa0", "y"}},
        {"\xe4\xb8\xad\xe6\x96\x87" "123", {"\xe4\xb8\xad\xe6\x96\x87", "123"}},
        {"e\xcc\x81", {"e", "\xcc\x81"}},
        {"hi!\n", {"hi", "!", "\n"}},
        {" \n ", {" \n "}},
        // invalid UTF-8: each bad byte is an "other" character (our rule; no regex to compare)
        {"a\xff\xfe" "b", {"a", "\xff\xfe", "b"}},
        {" \xff!", {" \xff!"}},
        {"\xe2\x82" "x", {"\xe2\x82", "x"}},
    };
    int bad = 0;
    size_t n_cases = sizeof(cases) / sizeof(cases[0]);
    for (size_t c = 0; c < n_cases; c++) {
        const unsigned char *s = (const unsigned char *)cases[c].text;
        size_t n = strlen(cases[c].text), i = 0;
        int k = 0, ok = 1;
        while (i < n) {
            size_t end = bpe_pretoken_end(s, n, i);
            const char *want = cases[c].pieces[k];
            if (k >= 10 || want == NULL || strlen(want) != end - i || memcmp(want, s + i, end - i) != 0) ok = 0;
            if (!ok) break;
            k++;
            i = end;
        }
        if (ok && k < 10 && cases[c].pieces[k] != NULL) ok = 0;
        if (!ok) { printf("      case %zu ('%s'): piece %d differs\n", c, cases[c].text, k); bad++; }
    }
    check(bad == 0, "pre-tokenizer splits %zu strings as GPT-2's regex does", n_cases);
}

static void test_split_point(void) {
    const char *text = "one\ntwo  \n\nthree\n";
    check(bpe_split_point(text, strlen(text)) == 16, "bpe_split_point: last newline after a printable character (16)");
    check(bpe_split_point("a b  \n \n", 8) == 0, "bpe_split_point: none when every newline follows a space");
}

// ----------------------------------------------------------------------------
// encode_vectors.json, read with a small scanner of our own

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    int failed;
} Scan;

static void scan_space(Scan *j) {
    while (j->pos < j->n && strchr(" \t\r\n", j->s[j->pos]) != NULL) j->pos++;
}

static int scan_char(Scan *j, char c) {
    scan_space(j);
    if (j->pos < j->n && j->s[j->pos] == (unsigned char)c) { j->pos++; return 1; }
    return 0;
}

static uint32_t scan_hex4(Scan *j) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = j->pos < j->n ? j->s[j->pos++] : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) { j->failed = 1; return 0; }
        v = v * 16 + (uint32_t)d;
    }
    return v;
}

// scan_string: a JSON string as UTF-8 into out (malloc'd, NUL-terminated), its length into *len
static char *scan_string(Scan *j, size_t *len) {
    if (!scan_char(j, '"')) { j->failed = 1; return NULL; }
    char *out = malloc(j->n + 1);
    size_t o = 0;
    while (j->pos < j->n && j->s[j->pos] != '"') {
        unsigned char c = j->s[j->pos++];
        if (c != '\\') { out[o++] = (char)c; continue; }
        unsigned char e = j->pos < j->n ? j->s[j->pos++] : 0;
        uint32_t cp;
        switch (e) {
        case 'n': cp = '\n'; break;
        case 't': cp = '\t'; break;
        case 'r': cp = '\r'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case '"': case '\\': case '/': cp = e; break;
        case 'u':
            cp = scan_hex4(j);
            if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
                if (j->pos + 2 > j->n || j->s[j->pos] != '\\' || j->s[j->pos + 1] != 'u') { j->failed = 1; break; }
                j->pos += 2;
                uint32_t low = scan_hex4(j);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            break;
        default: j->failed = 1; cp = '?';
        }
        unsigned char enc[4];
        int k = utf8_encode(cp, enc);
        memcpy(out + o, enc, (size_t)k);
        o += (size_t)k;
    }
    if (!scan_char(j, '"')) j->failed = 1;
    out[o] = '\0';
    *len = o;
    return out;
}

static void scan_skip_value(Scan *j) {  // strings, numbers, literals; enough for this file
    scan_space(j);
    if (j->pos < j->n && j->s[j->pos] == '"') { size_t len; free(scan_string(j, &len)); return; }
    while (j->pos < j->n && strchr(",}]", j->s[j->pos]) == NULL) j->pos++;
}

static void test_vectors(Bpe *bpe) {
    char path[512];
    if (!test_data_path("gpt2/encode_vectors.json", path, sizeof(path))) { skip("no %s", path); return; }
    unsigned char *data;
    size_t size;
    char err[512];
    if (!check(tok_read_file(path, (size_t)1 << 30, &data, &size, err, sizeof(err)) == 0, "read %s", path)) return;
    Scan j = {data, size, 0, 0};
    int total = 0, matched = 0;
    scan_char(&j, '[');
    while (!j.failed && scan_char(&j, '{')) {
        char *text = NULL;
        size_t text_len = 0, n_ids = 0;
        int ids[1024], special = 0;
        do {
            size_t klen;
            char *key = scan_string(&j, &klen);
            if (j.failed || !scan_char(&j, ':')) { j.failed = 1; free(key); break; }
            if (strcmp(key, "text") == 0) {
                text = scan_string(&j, &text_len);
            } else if (strcmp(key, "ids") == 0) {
                scan_char(&j, '[');
                while (!scan_char(&j, ']')) {
                    scan_space(&j);
                    char *end;
                    long v = strtol((const char *)j.s + j.pos, &end, 10);
                    if (end == (const char *)j.s + j.pos || n_ids == 1024) { j.failed = 1; break; }
                    ids[n_ids++] = (int)v;
                    j.pos = (size_t)(end - (const char *)j.s);
                    scan_char(&j, ',');
                }
            } else if (strcmp(key, "allowed_special") == 0) {
                scan_space(&j);
                special = j.pos < j.n && j.s[j.pos] == 't';
                scan_skip_value(&j);
            } else {
                scan_skip_value(&j);
            }
            free(key);
        } while (!j.failed && scan_char(&j, ','));
        if (!scan_char(&j, '}') || text == NULL) j.failed = 1;
        scan_char(&j, ',');
        if (j.failed) { free(text); break; }
        total++;
        int *got;
        size_t n_got;
        int ok = bpe_encode(bpe, text, text_len, special, &got, &n_got) == 0 && n_got == n_ids &&
                 memcmp(got, ids, n_ids * sizeof(int)) == 0;
        if (ok) {
            matched++;
        } else {
            printf("      MISMATCH %.40s%s (allow_special %d)\n        want", text, text_len > 40 ? "..." : "", special);
            for (size_t k = 0; k < n_ids && k < 16; k++) printf(" %d", ids[k]);
            printf("%s\n        got ", n_ids > 16 ? " ..." : "");
            for (size_t k = 0; k < n_got && k < 16; k++) printf(" %d", got[k]);
            printf("%s\n", n_got > 16 ? " ..." : "");
        }
        free(got);
        free(text);
    }
    check(!j.failed, "parsed %s (%d vectors)", path, total);
    check(total == 29 && matched == total, "encode_vectors.json: %d of %d vectors reproduced (want 29 of 29)", matched, total);
    free(data);
}

// ----------------------------------------------------------------------------

// decode_matches: the bytes of ids, decoded by the Bpe, equal text
static int decode_matches(const Bpe *bpe, const int *ids, size_t n, const unsigned char *text, size_t len) {
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        int tlen;
        const unsigned char *t = bpe_token_bytes(bpe, ids[i], &tlen);
        if (t == NULL || pos + (size_t)tlen > len || memcmp(text + pos, t, (size_t)tlen) != 0) return 0;
        pos += (size_t)tlen;
    }
    return pos == len;
}

static void test_file_roundtrip(Bpe *bpe, const char *rel, long want_tokens) {
    char path[512], err[512];
    if (!test_data_path(rel, path, sizeof(path))) { skip("no %s", path); return; }
    unsigned char *text;
    size_t len;
    if (!check(tok_read_file(path, (size_t)1 << 30, &text, &len, err, sizeof(err)) == 0, "read %s", path)) return;
    int *ids;
    size_t n;
    bpe_encode(bpe, (const char *)text, len, 0, &ids, &n);
    check(decode_matches(bpe, ids, n, text, len), "decode(encode(x)) == x for %s (%zu bytes, %zu tokens)", rel, len, n);
    if (want_tokens >= 0) check((long)n == want_tokens, "%s: %zu GPT-2 tokens, want %ld (llm.c's count)", rel, n, want_tokens);
    // block-wise, cut by bpe_split_point, as prepare_data does
    size_t pos = 0, n_blocks = 0, n_block_ids = 0;
    int same = 1;
    while (pos < len && same) {
        size_t want = len - pos < 3000 ? len - pos : 3000;
        size_t cut = want == len - pos ? want : bpe_split_point((const char *)text + pos, want);
        if (cut == 0) cut = want;  // not hit with these files; would only mean a weaker test
        int *block;
        size_t nb;
        bpe_encode(bpe, (const char *)text + pos, cut, 0, &block, &nb);
        same = n_block_ids + nb <= n && memcmp(block, ids + n_block_ids, nb * sizeof(int)) == 0;
        free(block);
        n_block_ids += nb;
        pos += cut;
        n_blocks++;
    }
    check(same && n_block_ids == n, "%s encoded in %zu blocks cut at bpe_split_point gives the same ids", rel, n_blocks);
    free(ids);
    free(text);
}

static void test_random_bytes(Bpe *bpe) {
    size_t len = 1 << 16;
    unsigned char *text = malloc(len);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < len; i++) {  // xorshift; mostly bytes >= 0x80, so mostly invalid UTF-8
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        text[i] = (unsigned char)(x >> 24);
    }
    int *ids;
    size_t n;
    bpe_encode(bpe, (const char *)text, len, 0, &ids, &n);
    check(decode_matches(bpe, ids, n, text, len), "decode(encode(x)) == x for %zu random bytes (%zu tokens)", len, n);
    free(ids);
    free(text);
}

static void test_special(Bpe *bpe) {
    struct { const char *text; int special; int n; int ids[9]; } cases[] = {
        {"a<|endoftext|>b", 1, 3, {64, 50256, 65}},
        {"<|endoftext|><|endoftext|>", 1, 2, {50256, 50256}},
        {"<|endoftext|>", 0, 7, {27, 91, 437, 1659, 5239, 91, 29}},  // plain text: "<|", "end", "of", "text", "|>"
        {"a<|endoftext|>b", 0, 9, {64, 27, 91, 437, 1659, 5239, 91, 29, 65}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        int *ids;
        size_t n;
        bpe_encode(bpe, cases[c].text, strlen(cases[c].text), cases[c].special, &ids, &n);
        int ok = n == (size_t)cases[c].n;
        for (size_t k = 0; ok && k < n; k++) ok = ids[k] == cases[c].ids[k];
        check(ok, "special tokens: '%s' with allow_special %d -> %zu ids (want %d)", cases[c].text, cases[c].special, n,
              cases[c].n);
        free(ids);
    }
    int *ids;
    size_t n;
    check(bpe_encode(bpe, "", 0, 1, &ids, &n) == 0 && n == 0, "empty text -> no ids");
    free(ids);
}

static void test_bin(Bpe *bpe) {
    char path[256], err[512];
    test_path(path, sizeof(path), tmp_dir, "gpt2_tokenizer.bin");
    if (!check(bpe_write_tokenizer_bin(bpe, path, err, sizeof(err)) == 0, "bpe_write_tokenizer_bin %s", path)) {
        printf("      %s\n", err);
        return;
    }
    struct stat st;
    stat(path, &st);
    // header + one length byte per token + the bytes of every token
    long want_size = 1024 + bpe->vocab_size + (long)bpe->token_offset[bpe->vocab_size];
    check((long)st.st_size == want_size, ".bin is %ld bytes, want %ld", (long)st.st_size, want_size);
    Tokenizer t;
    if (!check(tokenizer_load_bin(&t, path, err, sizeof(err)) == 0, "tokenizer_load_bin of the written .bin")) {
        printf("      %s\n", err);
        return;
    }
    check(t.vocab_size == 50257 && t.eot_token == 50256, "vocab %d (want 50257), EOT %d (want 50256)", t.vocab_size, t.eot_token);
    int same = 1;
    for (int i = 0; i < t.vocab_size && same; i++) {
        int a, b;
        const char *x = tokenizer_decode(&t, i, &a);
        const unsigned char *y = bpe_token_bytes(bpe, i, &b);
        same = x != NULL && a == b && memcmp(x, y, (size_t)a) == 0 && x[a] == '\0';
    }
    check(same, "every token of the .bin decodes to the encoder's bytes");
    int len;
    const char *s = tokenizer_decode(&t, 31373, &len);
    check(s != NULL && len == 5 && memcmp(s, "hello", 5) == 0, "decode 31373 -> 'hello'");
    s = tokenizer_decode(&t, 995, &len);
    check(s != NULL && len == 6 && memcmp(s, " world", 6) == 0, "decode 995 -> ' world'");
    check(tokenizer_decode(&t, -1, &len) == NULL && len == 0 && tokenizer_decode(&t, 50257, &len) == NULL,
          "decode out of range -> NULL");
    tokenizer_free(&t);
}

static void test_bytes_bin(void) {
    char path[256], err[512];
    test_path(path, sizeof(path), tmp_dir, "bytes_tokenizer.bin");
    check(tokenizer_write_bytes_bin(path, err, sizeof(err)) == 0, "tokenizer_write_bytes_bin");
    Tokenizer t;
    if (!check(tokenizer_load_bin(&t, path, err, sizeof(err)) == 0, "load the byte-level .bin")) return;
    int same = t.vocab_size == 256 && t.eot_token == 0;
    for (int i = 0; i < 256 && same; i++) {
        int len;
        const char *s = tokenizer_decode(&t, i, &len);
        same = len == 1 && (unsigned char)s[0] == i;
    }
    check(same, "byte-level .bin: vocab 256, EOT 0, token i = byte i");
    tokenizer_free(&t);
}

static void expect_bin_error(const char *name, const unsigned char *data, size_t len, const char *want_text) {
    char path[256], err[512] = "";
    test_path(path, sizeof(path), tmp_dir, name);
    test_write_file(path, data, len);
    Tokenizer t;
    int rc = tokenizer_load_bin(&t, path, err, sizeof(err));
    check(rc != 0 && one_line_error(err, path) && strstr(err, want_text) != NULL, "bad .bin (%s): %s", name, err);
}

static void test_bad_bin(void) {
    char path[256], err[512] = "";
    Tokenizer t;
    test_path(path, sizeof(path), tmp_dir, "no_such.bin");
    check(tokenizer_load_bin(&t, path, err, sizeof(err)) != 0 && one_line_error(err, path), "missing .bin: %s", err);
    // a good two-token file, then broken copies of it
    unsigned char good[1024 + 5] = {0};
    tok_put_u32le(good, 20240328);
    tok_put_u32le(good + 4, 2);
    tok_put_u32le(good + 8, 2);
    tok_put_u32le(good + 12, 1);
    memcpy(good + 1024, "\x01" "a" "\x02" "bc", 5);
    test_path(path, sizeof(path), tmp_dir, "good.bin");
    test_write_file(path, good, sizeof(good));
    int rc = tokenizer_load_bin(&t, path, err, sizeof(err));
    int len;
    const char *s = rc == 0 ? tokenizer_decode(&t, 1, &len) : NULL;
    check(rc == 0 && s != NULL && len == 2 && memcmp(s, "bc", 2) == 0, "hand-made two-token .bin loads");
    if (rc == 0) tokenizer_free(&t);
    unsigned char bad[1024 + 6];
    expect_bin_error("short_header.bin", good, 100, "truncated header");
    memcpy(bad, good, sizeof(good)); tok_put_u32le(bad, 20240520);
    expect_bin_error("magic.bin", bad, sizeof(good), "magic is 20240520");
    memcpy(bad, good, sizeof(good)); tok_put_u32le(bad + 4, 1);
    expect_bin_error("version.bin", bad, sizeof(good), "version is 1");
    memcpy(bad, good, sizeof(good)); tok_put_u32le(bad + 8, 0);
    expect_bin_error("vocab0.bin", bad, sizeof(good), "vocab size is 0");
    memcpy(bad, good, sizeof(good)); tok_put_u32le(bad + 8, 0x7fffffff);
    expect_bin_error("vocab_huge.bin", bad, sizeof(good), "vocab size is 2147483647");
    memcpy(bad, good, sizeof(good)); tok_put_u32le(bad + 12, 2);
    expect_bin_error("eot.bin", bad, sizeof(good), "EOT token is 2");
    expect_bin_error("truncated.bin", good, sizeof(good) - 1, "truncated: token 1");
    expect_bin_error("no_tokens.bin", good, 1024, "before token 0");
    memcpy(bad, good, sizeof(good)); bad[1026] = 0;
    expect_bin_error("zero_len.bin", bad, sizeof(good), "token 1 at offset 1026 has length 0");
    memcpy(bad, good, sizeof(good)); bad[sizeof(good)] = 'x';
    expect_bin_error("trailing.bin", bad, sizeof(good) + 1, "1 extra bytes");
}

// ----------------------------------------------------------------------------
// encoder.json / vocab.bpe errors, on small hand-made files

static void expect_load_error(const char *what, const char *encoder, const char *vocab, const char *bad_file,
                              const char *want_text) {
    Bpe b;
    char err[512] = "";
    int rc = bpe_load(&b, encoder, vocab, err, sizeof(err));
    check(rc != 0 && one_line_error(err, bad_file) && strstr(err, want_text) != NULL, "%s: %s", what, err);
    if (rc == 0) bpe_free(&b);
}

static void test_bad_bpe_files(void) {
    char enc[256], voc[256], bad[256], missing[256];
    test_path(enc, sizeof(enc), tmp_dir, "tiny_encoder.json");
    test_path(voc, sizeof(voc), tmp_dir, "tiny_vocab.bpe");
    test_path(bad, sizeof(bad), tmp_dir, "bad_file");
    test_path(missing, sizeof(missing), tmp_dir, "missing_file");
    test_write_tiny_encoder(enc, ", \"<|endoftext|>\": 258");
    write_text(voc, "#version: 0.2\na b\nab c\n");
    Bpe b;
    char err[512] = "";
    int rc = bpe_load(&b, enc, voc, err, sizeof(err));
    if (check(rc == 0 && b.vocab_size == 259 && b.eot == 258 && b.merge_count == 2, "tiny vocab loads: %s", err)) {
        int *ids;
        size_t n;
        bpe_encode(&b, "abcab <|endoftext|>", 19, 1, &ids, &n);
        check(n == 4 && ids[0] == 257 && ids[1] == 256 && ids[2] == b.byte_token[' '] && ids[3] == 258,
              "tiny vocab: 'abcab <|endoftext|>' -> abc, ab, ' ', EOT");
        free(ids);
        bpe_free(&b);
    }

    expect_load_error("missing encoder.json", missing, voc, missing, "cannot open");
    expect_load_error("missing vocab.bpe", enc, missing, missing, "cannot open");
    struct { const char *json; const char *want; } bad_json[] = {
        {"", "file ends"},
        {"[1, 2]", "expected '{'"},
        {"{}", "empty"},
        {"{\"a\": 0", "file ends"},
        {"{\"a\": 0,", "file ends"},
        {"{\"a\" 0}", "expected ':'"},
        {"{\"a\": x}", "integer id, got 'x}'"},
        {"{\"a\": 1.5}", "integer id"},
        {"{\"a\": -1}", "integer id"},
        {"{\"\\q\": 0}", "bad escape"},
        {"{\"\\ud800\": 0}", "high surrogate"},
        {"{\"\\udc00\": 0}", "lone low surrogate"},
        {"{\"a b\": 0}", "U+0020"},
        {"{\"\\u0144\": 0}", "U+0144"},
        {"{\"a\": 0} x", "unexpected data"},
        {"{\"a\": 0, \"b\": 5}", "id 5"},
        {"{\"a\": 0, \"b\": 0}", "id 0 is used twice"},
        {"{\"a\": 0, \"a\": 1}", "key 'a' appears twice"},
        {"{\"a\": 0}", "no key for the single byte 0x00"},
        {"{\"\xff\": 0}", "invalid UTF-8"},
    };
    for (size_t k = 0; k < sizeof(bad_json) / sizeof(bad_json[0]); k++) {
        write_text(bad, bad_json[k].json);
        char what[96];
        snprintf(what, sizeof(what), "malformed encoder.json %zu", k);
        expect_load_error(what, bad, voc, bad, bad_json[k].want);
    }
    test_write_tiny_encoder(bad, ", \"abcd\": 258");
    expect_load_error("token made by no merge", bad, voc, voc, "'abcd' (id 258) is made by no merge");

    struct { const char *merges; const char *want; } bad_vocab[] = {
        {"", "empty file"},
        {"a b\nab c\n", "line 1: expected a '#version' header"},
        {"#version: 0.2\na b\n", "'abc' (id 257) is made by no merge"},  // cut short at a line end
        {"#version: 0.2\na b\nab", "line 3: expected two symbols"},          // cut short mid-line
        {"#version: 0.2\na b\nab c d\n", "line 3: expected two symbols"},
        {"#version: 0.2\na  b\nab c\n", "line 2: expected two symbols"},
        {"#version: 0.2\n\na b\nab c\n", "line 2: expected two symbols"},
        {"#version: 0.2\na b\nab q\n", "line 3: merge result"},
        {"#version: 0.2\na b\nab \x01\n", "not in GPT-2's byte alphabet"},
        {"#version: 0.2\na b\nabc c\n", "line 3: merge result"},
        {"#version: 0.2\nab c\na b\n", "line 2: uses 'ab', which line 3 makes later"},
        {"#version: 0.2\na b\na b\nab c\n", "line 3: merge 'a b' repeats line 2"},
    };
    for (size_t k = 0; k < sizeof(bad_vocab) / sizeof(bad_vocab[0]); k++) {
        write_text(bad, bad_vocab[k].merges);
        char what[96];
        snprintf(what, sizeof(what), "malformed vocab.bpe %zu", k);
        expect_load_error(what, enc, bad, bad, bad_vocab[k].want);
    }
    write_text(bad, "#version: 0.2\r\na b\r\nab c\r\n");
    rc = bpe_load(&b, enc, bad, err, sizeof(err));
    check(rc == 0, "vocab.bpe with CRLF line ends loads: %s", rc == 0 ? "ok" : err);
    if (rc == 0) bpe_free(&b);

    // the real files, cut short
    char real_enc[512], real_voc[512];
    if (!test_data_path("gpt2/encoder.json", real_enc, sizeof(real_enc)) ||
        !test_data_path("gpt2/vocab.bpe", real_voc, sizeof(real_voc))) {
        skip("no GPT-2 files for the truncation tests");
        return;
    }
    unsigned char *data;
    size_t size;
    if (tok_read_file(real_voc, (size_t)1 << 30, &data, &size, err, sizeof(err)) == 0) {
        test_write_file(bad, data, size / 2);
        expect_load_error("real vocab.bpe cut in half", real_enc, bad, bad, "");
        free(data);
    }
    if (tok_read_file(real_enc, (size_t)1 << 30, &data, &size, err, sizeof(err)) == 0) {
        test_write_file(bad, data, size / 2);
        expect_load_error("real encoder.json cut in half", bad, real_voc, bad, "");
        free(data);
    }
}

// ----------------------------------------------------------------------------
// prepare_data, run as a program

// read_split: the tokens of <dir>/<name>_<split>_000000.bin, _000001, ...
// joined, or NULL if a shard is bad, or holds more than max tokens, or holds
// fewer while another follows it
static uint16_t *read_split(const char *dir, const char *name, const char *split, size_t max, size_t *ntok, int *n_shards) {
    uint16_t *all = NULL;
    *ntok = 0;
    int ok = 1;
    size_t last = max;
    for (*n_shards = 0; ok; (*n_shards)++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s_%s_%06d.bin", dir, name, split, *n_shards);
        if (access(path, F_OK) != 0) break;
        size_t n;
        uint16_t *tokens = test_read_shard(path, &n);
        ok = tokens != NULL && n <= max && last == max;
        if (ok) {
            all = realloc(all, (*ntok + n + 1) * sizeof(uint16_t));
            memcpy(all + *ntok, tokens, n * sizeof(uint16_t));
            *ntok += n;
            last = n;
        }
        free(tokens);
    }
    if (!ok || all == NULL) { free(all); return NULL; }
    return all;
}

// flags and runtime errors; needs no data
static void test_prepare_data_errors(void) {
    char out[256], cmd[2048], err[4096], text_path[256];
    test_path(out, sizeof(out), tmp_dir, "shards_err");
    test_path(text_path, sizeof(text_path), tmp_dir, "small.txt");
    write_text(text_path, "a few words of text\n");
    struct { const char *args; const char *want; } usage_cases[] = {
        {"", "no input"},
        {"-i x -q 1", "unknown flag '-q'"},
        {"-i", "-i needs a value"},
        {"-i x -v abc", "-v 'abc'"},
        {"-i x -v -5", "-v '-5'"},
        {"-i x -e 2", "-e '2'"},
        {"-i x -s 0", "-s '0'"},
        {"-i x -s 3000000000", "-s '3000000000'"},
        {"-i x --bytes --encoder e --vocab v", "--bytes and --encoder/--vocab"},
        {"-i x --encoder e", "--encoder given without --vocab"},
        {"-i x -n a/b", "-n 'a/b'"},
    };
    for (size_t k = 0; k < sizeof(usage_cases) / sizeof(usage_cases[0]); k++) {
        snprintf(cmd, sizeof(cmd), "./prepare_data %s", usage_cases[k].args);
        int rc = test_run(cmd, 0, err, sizeof(err));
        check(rc == 2 && test_count(err, "\n") == 1 && strstr(err, usage_cases[k].want) != NULL, "prepare_data %s -> exit %d: %.*s",
              usage_cases[k].args, rc, (int)strcspn(err, "\n"), err);
    }
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s/nonexistent.txt -o %s --bytes", tmp_dir, out);
    int rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 1 && test_count(err, "\n") == 1 && strstr(err, "-i ") != NULL && strstr(err, "nonexistent.txt") != NULL,
          "missing input -> exit %d: %.*s", rc, (int)strcspn(err, "\n"), err);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n small --bytes -v 1000", text_path, out);
    rc = test_run(cmd, 0, err, sizeof(err));
    char path[512];
    snprintf(path, sizeof(path), "%s/small_val_000000.bin", out);
    check(rc == 1 && test_count(err, "\n") == 1 && strstr(err, "train split would be empty") != NULL && access(path, F_OK) != 0,
          "-v above the token count -> exit %d, no shard left behind: %.*s", rc, (int)strcspn(err, "\n"), err);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s --encoder %s/missing.json --vocab %s/missing.bpe", text_path, out,
             tmp_dir, tmp_dir);
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 1 && test_count(err, "\n") == 1 && strstr(err, "missing.json: cannot open") != NULL,
          "missing --encoder -> exit %d: %.*s",
          rc, (int)strcspn(err, "\n"), err);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s --bytes", text_path, text_path);
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 1 && test_count(err, "\n") == 1 && strstr(err, "not a directory") != NULL, "-o naming a file -> exit %d: %.*s", rc,
          (int)strcspn(err, "\n"), err);
}

// --bytes with EOT and small shards, on two made-up documents; needs no data
static void test_prepare_data_bytes(void) {
    char doc1[256], doc2[256], out[256], cmd[2048], err[4096];
    test_path(doc1, sizeof(doc1), tmp_dir, "doc1.txt");
    test_path(doc2, sizeof(doc2), tmp_dir, "doc2.txt");
    test_path(out, sizeof(out), tmp_dir, "shards_bytes");
    unsigned char text1[3000], text2[2000];
    for (size_t i = 0; i < sizeof(text1); i++) text1[i] = (unsigned char)("the first document\n"[i % 19]);
    for (size_t i = 0; i < sizeof(text2); i++) text2[i] = (unsigned char)(1 + (i * 7) % 255);  // every byte but 0
    test_write_file(doc1, text1, sizeof(text1));
    test_write_file(doc2, text2, sizeof(text2));
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -i %s -o %s -n b --bytes -e 1 -v 500 -s 1000", doc1, doc2, out);
    int rc = test_run(cmd, 0, err, sizeof(err));
    if (!check(rc == 0, "prepare_data --bytes -e 1 on two documents -> exit %d %.*s", rc, rc ? (int)strcspn(err, "\n") : 0, err))
        return;
    // the stream: EOT (0), document 1, EOT, document 2
    size_t n_stream = 2 + sizeof(text1) + sizeof(text2);
    uint16_t *stream = malloc(n_stream * sizeof(uint16_t));
    stream[0] = 0;
    for (size_t i = 0; i < sizeof(text1); i++) stream[1 + i] = text1[i];
    stream[1 + sizeof(text1)] = 0;
    for (size_t i = 0; i < sizeof(text2); i++) stream[2 + sizeof(text1) + i] = text2[i];
    size_t n_val, n_train;
    int val_shards, train_shards;
    uint16_t *val = read_split(out, "b", "val", 1000, &n_val, &val_shards);
    uint16_t *train = read_split(out, "b", "train", 1000, &n_train, &train_shards);
    check(val != NULL && n_val == 500 && val_shards == 1 && memcmp(val, stream, 500 * 2) == 0,
          "--bytes val: the first 500 tokens of EOT+doc1+EOT+doc2, one shard");
    check(train != NULL && n_train == n_stream - 500 && train_shards == 5 && memcmp(train, stream + 500, n_train * 2) == 0,
          "--bytes train: the other %zu tokens in 5 full-then-partial shards of <= 1000 (got %d)", n_stream - 500, train_shards);
    Tokenizer t;
    char tok_bin[512], msg[512];
    snprintf(tok_bin, sizeof(tok_bin), "%s/b_tokenizer.bin", out);
    check(tokenizer_load_bin(&t, tok_bin, msg, sizeof(msg)) == 0 && t.vocab_size == 256 && t.eot_token == 0,
          "--bytes writes the byte-level tokenizer .bin");
    tokenizer_free(&t);
    free(stream);
    free(val);
    free(train);
}

// GPT-2 on tinyshakespeare: EOT first, llm.c's val split, small shards
static void test_prepare_data_gpt2(void) {
    char text_path[512], enc[512], voc[512];
    if (!test_data_path("tinyshakespeare.txt", text_path, sizeof(text_path)) ||
        !test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("no tinyshakespeare / GPT-2 files for prepare_data");
        return;
    }
    char out[256], cmd[2048], err[4096];
    test_path(out, sizeof(out), tmp_dir, "shards_gpt2");
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n tiny -e 1 -s 100000 --encoder %s --vocab %s", text_path, out, enc, voc);
    int rc = test_run(cmd, 0, err, sizeof(err));
    if (!check(rc == 0, "prepare_data on tinyshakespeare -> exit %d %.*s", rc, rc ? (int)strcspn(err, "\n") : 0, err)) return;
    size_t n_val, n_train;
    int val_shards, train_shards;
    uint16_t *val = read_split(out, "tiny", "val", 100000, &n_val, &val_shards);
    uint16_t *train = read_split(out, "tiny", "train", 100000, &n_train, &train_shards);
    check(val != NULL && n_val == 32768 && val[0] == 50256, "val: %zu tokens (want 32768), EOT first", n_val);
    check(train != NULL && n_train == 338025 + 1 - 32768 && train_shards == 4, "train: %zu tokens in %d shards (want %d in 4)",
          n_train, train_shards, 338025 + 1 - 32768);
    Tokenizer t;
    char tok_bin[512], msg[512];
    snprintf(tok_bin, sizeof(tok_bin), "%s/tiny_tokenizer.bin", out);
    unsigned char *text;
    size_t len;
    if (val != NULL && train != NULL && tokenizer_load_bin(&t, tok_bin, msg, sizeof(msg)) == 0 &&
        tok_read_file(text_path, (size_t)1 << 30, &text, &len, msg, sizeof(msg)) == 0) {
        size_t pos = 0;
        int same = 1;
        for (size_t i = 1; i < n_val + n_train && same; i++) {  // past the leading EOT
            int tlen;
            const char *s = tokenizer_decode(&t, i < n_val ? val[i] : train[i - n_val], &tlen);
            same = s != NULL && pos + (size_t)tlen <= len && memcmp(text + pos, s, (size_t)tlen) == 0;
            pos += (size_t)tlen;
        }
        check(same && pos == len, "val + train shards, decoded with the written .bin, give back tinyshakespeare");
        tokenizer_free(&t);
        free(text);
    } else {
        check(0, "load %s and the text: %s", tok_bin, msg);
    }
    free(val);
    free(train);
}

static void test_prepare_data(void) {
    if (access("./prepare_data", X_OK) != 0) { skip("./prepare_data not built (run from the repo root after make)"); return; }
    test_prepare_data_errors();
    test_prepare_data_bytes();
    test_prepare_data_gpt2();
}

int main(void) {
    if (test_make_dir(tmp_dir, sizeof(tmp_dir), "/tmp/test_tokenizer_XXXXXX") != 0) {
        printf("cannot make a temp dir\n");
        return 1;
    }
    test_unicode();
    test_utf8();
    test_safe_text();
    test_pretokenizer();
    test_split_point();
    test_bytes_bin();
    test_bad_bin();
    test_bad_bpe_files();

    char enc[512], voc[512], err[512] = "";
    Bpe bpe;
    if (!test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("no GPT-2 encoder.json / vocab.bpe under $LLM3D_DATA or ../shared/data");
    } else if (check(bpe_load(&bpe, enc, voc, err, sizeof(err)) == 0, "bpe_load GPT-2 (%s)", err[0] ? err : "ok")) {
        check(bpe.vocab_size == 50257 && bpe.eot == 50256 && bpe.merge_count == 50000, "GPT-2: 50257 tokens, EOT 50256, 50000 merges");
        test_vectors(&bpe);
        test_special(&bpe);
        test_file_roundtrip(&bpe, "tinyshakespeare.txt", 338025);
        test_file_roundtrip(&bpe, "alice_in_wonderland.txt", -1);
        test_random_bytes(&bpe);
        test_bin(&bpe);
        bpe_free(&bpe);
    }
    test_prepare_data();

    test_remove_dir(tmp_dir);
    return test_summary();
}
