/*
 * test_prepare_data.c: json.h, and prepare_data's JSON lines, directories,
 * threads, llm.c's shard names and --key-file errors, run as a program on
 * files this test writes, and what it does with FIFOs given to read and links
 * planted where it writes. (Its older behaviour, text files, splits and the MANIFEST, is
 * tested in test_tokenizer.c and test_dataloader.c.)
 *
 *   make dev/test/test_prepare_data prepare_data && ./dev/test/test_prepare_data
 *
 * The byte-level checks need no data; the GPT-2 ones read encoder.json,
 * vocab.bpe and tinyshakespeare.txt from test_data_path() and skip without.
 */
#define _GNU_SOURCE  // memmem
#include "llm3d/json.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"
#include "llm3d/tokenizer.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

static char tmp_dir[64];

// ----------------------------------------------------------------------------
// json.h

// decodes: the JSON string literal decodes to want (want_len bytes)
static int decodes(const char *literal, const char *want, size_t want_len) {
    JsonReader j;
    JsonBuf out = {NULL, 0, 0};
    json_init(&j, literal, strlen(literal));
    int ok = json_string(&j, &out) == 0 && json_at_end(&j) == 0 && out.len == want_len && memcmp(out.bytes, want, want_len) == 0;
    json_buf_free(&out);
    return ok;
}

// fails_with: reading one value of text (then the end) fails at byte pos with a message holding want
static int fails_with(const char *text, const char *want, size_t pos) {
    JsonReader j;
    json_init(&j, text, strlen(text));
    int rc = json_skip_value(&j);
    if (rc == 0) rc = json_at_end(&j);
    int ok = rc != 0 && strstr(j.err, want) != NULL && j.err_pos == pos;
    if (!ok) printf("      got: rc %d at %zu: %s\n", rc, j.err_pos, j.err);
    return ok;
}

static void test_json(void) {
    check(decodes("\"plain\"", "plain", 5), "json: a plain string");
    check(decodes("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "a\"b\\c/d\b\f\n\r\t", 12), "json: the two-character escapes");
    check(decodes("\"caf\\u00e9 \\u20AC\"", "caf\xc3\xa9 \xe2\x82\xac", 9), "json: \\u escapes to 2- and 3-byte UTF-8");
    check(decodes("\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4), "json: a surrogate pair is one 4-byte code point");
    check(decodes("\"\\ud800x\"", "\xef\xbf\xbdx", 4), "json: a high surrogate alone becomes U+FFFD");
    check(decodes("\"\\udc00\"", "\xef\xbf\xbd", 3), "json: a low surrogate alone becomes U+FFFD");
    check(decodes("\"\\ud800\\u0041\"", "\xef\xbf\xbd" "A", 4), "json: a high surrogate before a non-surrogate escape");
    check(decodes("\"\\u0000\"", "\0", 1), "json: \\u0000 is a NUL byte");
    check(decodes("\"raw \xc3\xa9 bytes\"", "raw \xc3\xa9 bytes", 12), "json: raw UTF-8 copied as it is");

    check(fails_with("\"ab", "not closed", 3), "json: unclosed string");
    check(fails_with("\"a\nb\"", "raw control character 0x0a", 2), "json: raw newline in a string");
    check(fails_with("\"a\\qb\"", "unknown escape '\\q'", 2), "json: unknown escape");
    check(fails_with("\"\\u12G4\"", "four hex digits", 3), "json: bad \\u digits");
    check(fails_with("{\"a\": 1,}", "expected a string key", 8), "json: trailing comma in an object");
    check(fails_with("[1, 2,]", "expected a value", 6), "json: trailing comma in an array");
    check(fails_with("{\"a\" 1}", "expected ':'", 5), "json: missing colon");
    check(fails_with("{\"a\": 1 \"b\": 2}", "expected ',' or '}'", 8), "json: missing comma");
    check(fails_with("01", "after the value", 1), "json: a leading zero");
    check(fails_with("1.", "digits after '.'", 2), "json: '1.'");
    check(fails_with("-", "expected a value", 1), "json: '-'");
    check(fails_with("1e+", "exponent", 3), "json: '1e+'");
    check(fails_with("tru", "expected a value", 0), "json: 'tru'");
    check(fails_with("{} x", "'x' after the value", 3), "json: junk after the value");
    char deep[600];
    memset(deep, '[', 300);
    deep[300] = '\0';
    check(fails_with(deep, "nested deeper than 256", 257), "json: nesting past 256 refused");

    const char *doc = " {\"n\": -1.5e2, \"t\": true, \"x\": [null, false, {\"y\": \"\\u0041\"}], \"s\": \"v\"} ";
    JsonReader j;
    JsonBuf key = {NULL, 0, 0}, s = {NULL, 0, 0};
    json_init(&j, doc, strlen(doc));
    int index = 0, more, keys = 0, ok = 1;
    double n = 0;
    while ((more = json_object_next(&j, &index, &key)) == 1) {
        keys++;
        if (strcmp(key.bytes, "n") == 0) ok = ok && json_number(&j, &n) == 0;
        else if (strcmp(key.bytes, "s") == 0) ok = ok && json_string(&j, &s) == 0;
        else ok = ok && json_skip_value(&j) == 0;
    }
    check(ok && more == 0 && json_at_end(&j) == 0 && keys == 4 && n == -150.0 && s.len == 1 && s.bytes[0] == 'v',
          "json: walking an object: 4 keys, a number, nested values skipped, a string read");
    json_buf_free(&key);
    json_buf_free(&s);
}

// ----------------------------------------------------------------------------
// prepare_data, run as a program

static int not_dot(const struct dirent *e) { return e->d_name[0] != '.'; }

// same_dirs: dir_a and dir_b hold files of the same names and bytes, and at least want_files of them
static int same_dirs(const char *dir_a, const char *dir_b, int want_files) {
    struct dirent **na, **nb;
    int n = scandir(dir_a, &na, not_dot, alphasort), m = scandir(dir_b, &nb, not_dot, alphasort);
    int same = n >= want_files && n == m;
    for (int k = 0; same && k < n; k++) {
        char a[512], b[512];
        snprintf(a, sizeof(a), "%s/%s", dir_a, na[k]->d_name);
        snprintf(b, sizeof(b), "%s/%s", dir_b, nb[k]->d_name);
        same = strcmp(na[k]->d_name, nb[k]->d_name) == 0 && test_files_same(a, b);
        if (!same) printf("      %s and %s differ\n", a, b);
    }
    for (int k = 0; k < n; k++) free(na[k]);
    for (int k = 0; k < m; k++) free(nb[k]);
    if (n >= 0) free(na);
    if (m >= 0) free(nb);
    return same;
}

// json_escape: text as the body of a JSON string, escaping what must be and,
// every few characters, something that need not be, so the decoder's paths run
static void json_escape(const unsigned char *text, size_t n, FILE *f) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = text[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else if (c == 'e' && i % 5 == 0) fputs("\\u0065", f);
        else if (c == '/' && i % 2 == 0) fputs("\\/", f);
        else fputc(c, f);
    }
}

// Three documents, byte-level: a .jsonl file and a directory of text files
// holding the same documents give the same shards, EOT before each (the default
// for both); a text file given alone keeps -e 0 as before; --field with no
// .jsonl among the inputs is refused.
static void test_jsonl_and_directory(void) {
    static const char *docs[3] = {"First \"doc\" \\ with\nlines\n", "second: caf\xc3\xa9 \xf0\x9f\x98\x80 / tab\t.", "3"};
    char jsonl[128], dir[128], path[256], out_j[128], out_d[128], cmd[2048], err[4096];
    test_path(jsonl, sizeof(jsonl), tmp_dir, "docs.jsonl");
    test_path(dir, sizeof(dir), tmp_dir, "docs_dir");
    mkdir(dir, 0755);
    FILE *f = fopen(jsonl, "wb");
    for (int k = 0; k < 3; k++) {
        fprintf(f, k == 1 ? "\r\n  {\"id\": %d, \"meta\": {\"a\": [1, 2.5e-3, null]}, \"text\": \"" : "{\"text\": \"", k);
        json_escape((const unsigned char *)docs[k], strlen(docs[k]), f);
        fprintf(f, k == 1 ? "\", \"score\": -0.5}\r\n" : "\"}\n");
        snprintf(path, sizeof(path), "%s/doc%d.txt", dir, k);
        test_write_file(path, docs[k], strlen(docs[k]));
    }
    fclose(f);
    snprintf(path, sizeof(path), "%s/.hidden", dir);  // left out, as dot-names are
    test_write_file(path, "not a document", 14);
    test_path(out_j, sizeof(out_j), tmp_dir, "out_jsonl");
    test_path(out_d, sizeof(out_d), tmp_dir, "out_dir");
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n d -v 10 --bytes -t 2", jsonl, out_j);
    int rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 0, "prepare_data -i docs.jsonl --bytes -> exit %d %.*s", rc, (int)strcspn(err, "\n"), err);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s/ -o %s -v 10 --bytes -t 3 -n d", dir, out_d);
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 0, "prepare_data -i docs_dir/ --bytes -> exit %d %.*s", rc, (int)strcspn(err, "\n"), err);
    check(same_dirs(out_j, out_d, 4), "a .jsonl file and a directory of the same documents give the same shards and MANIFEST");

    // the stream: EOT (0 in bytes) before every document
    unsigned char want[256];
    size_t n_want = 0;
    for (int k = 0; k < 3; k++) {
        want[n_want++] = 0;
        memcpy(want + n_want, docs[k], strlen(docs[k]));
        n_want += strlen(docs[k]);
    }
    size_t n_val, n_train;
    char val_path[256], train_path[256];
    snprintf(val_path, sizeof(val_path), "%s/d_val_000000.bin", out_j);
    snprintf(train_path, sizeof(train_path), "%s/d_train_000000.bin", out_j);
    uint16_t *val = test_read_shard(val_path, &n_val), *train = test_read_shard(train_path, &n_train);
    int same = val != NULL && train != NULL && n_val == 10 && n_val + n_train == n_want;
    for (size_t i = 0; same && i < n_want; i++) same = (i < n_val ? val[i] : train[i - n_val]) == want[i];
    check(same, "JSON lines: EOT + each decoded document, in order (%zu tokens, want %zu)", n_val + n_train, n_want);
    free(val);
    free(train);

    // -e 0 given: no EOT; one text file alone: no EOT either (the old default)
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n e0 -v 5 -e 0 --bytes", jsonl, out_j);
    rc = test_run(cmd, 0, err, sizeof(err));
    snprintf(train_path, sizeof(train_path), "%s/e0_val_000000.bin", out_j);
    val = test_read_shard(train_path, &n_val);
    check(rc == 0 && val != NULL && n_val == 5 && val[0] == 'F' && val[4] == 't', "JSON lines with -e 0: no EOT before the first document");
    free(val);
    snprintf(path, sizeof(path), "%s/doc0.txt", dir);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n one -v 1 --bytes", path, out_j);
    rc = test_run(cmd, 0, err, sizeof(err));
    snprintf(val_path, sizeof(val_path), "%s/one_val_000000.bin", out_j);
    val = test_read_shard(val_path, &n_val);
    check(rc == 0 && val != NULL && n_val == 1 && val[0] == 'F', "one text file: -e defaults to 0 as before");
    free(val);

    // --field reads JSON lines: with none among the inputs it is refused (the
    // text would be taken whole, not the field), in one line, before -o is made
    char out_f[128], body[128];
    test_path(out_f, sizeof(out_f), tmp_dir, "out_field");
    const char *inputs[2] = {path, dir};
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -v 1 --bytes --field body", inputs[k], out_f);
        rc = test_run(cmd, 0, err, sizeof(err));
        check(rc == 2 && test_count(err, "\n") == 1 && strstr(err, "--field body: no input is JSON lines") != NULL &&
              !test_exists("%s", out_f), "--field body with %s and no .jsonl: refused in one line, exit %d, no -o: %.*s",
              k == 0 ? "a text file" : "a directory of text files", rc, (int)strcspn(err, "\n"), err);
    }
    // one .jsonl among the inputs: --field is read there
    test_path(body, sizeof(body), tmp_dir, "body.jsonl");
    test_write_file(body, "{\"body\": \"xy\"}\n", 15);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -i %s -o %s -n f -v 1 -e 0 --bytes --field body", body, path, out_f);
    rc = test_run(cmd, 0, err, sizeof(err));
    snprintf(val_path, sizeof(val_path), "%s/f_val_000000.bin", out_f);
    snprintf(train_path, sizeof(train_path), "%s/f_train_000000.bin", out_f);
    val = test_read_shard(val_path, &n_val);
    train = test_read_shard(train_path, &n_train);
    check(rc == 0 && val != NULL && train != NULL && val[0] == 'x' && train[0] == 'y' && train[1] == 'F',
          "--field body with a .jsonl and a text file: the field's string, then the text (exit %d) %.*s", rc,
          (int)strcspn(err, "\n"), err);
    free(val);
    free(train);
}

// Errors in a JSON-lines file name the file, the line and the byte, stop the
// run with status 1, and leave nothing behind.
static void test_jsonl_errors(void) {
    struct { const char *name, *text, *want; } cases[] = {
        {"escape.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"bad \\q\"}\n", "escape.jsonl line 2 column 15 (file byte 31): unknown escape '\\q'"},
        {"field.jsonl", "{\"text\": \"a\"}\n\n{\"body\": \"b\"}\n", "field.jsonl line 3 column 14 (file byte 28): no \"text\" field"},
        {"type.jsonl", "{\"text\": 5}\n", "line 1 column 10 (file byte 9): the \"text\" field is not a string"},
        {"twice.jsonl", "{\"text\": \"a\", \"text\": \"b\"}\n", "line 1 column 22 (file byte 21): a second \"text\" field"},
        {"array.jsonl", "[\"text\"]\n", "line 1 column 1 (file byte 0): a line must be a JSON object"},
        {"junk.jsonl", "{\"text\": \"a\"} x\n", "line 1 column 15 (file byte 14): 'x' after the value"},
        {"control.jsonl", "{\"text\": \"a\tb\"}\n", "line 1 column 12 (file byte 11): raw control character 0x09"},
        {"open.jsonl", "{\"text\": \"a}\n{\"text\": \"b\"}\n", "line 1 column 13 (file byte 12): string not closed"},
    };
    char out[128], path[128], cmd[2048], err[4096];
    test_path(out, sizeof(out), tmp_dir, "out_errors");
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        test_path(path, sizeof(path), tmp_dir, cases[k].name);
        test_write_file(path, cases[k].text, strlen(cases[k].text));
        snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -v 1 --bytes --block 64", path, out);
        int rc = test_run(cmd, 0, err, sizeof(err));
        char manifest[256];
        snprintf(manifest, sizeof(manifest), "%s/MANIFEST", out);
        check(rc == 1 && test_count(err, "\n") == 1 && strstr(err, cases[k].want) != NULL && access(manifest, F_OK) != 0 &&
              !test_exists("%s", out), "%s -> exit %d, one line, and the -o directory it made is gone: %.*s",
              cases[k].name, rc, (int)strcspn(err, "\n"), err);
    }
    // a directory that was there before stays, as it was
    char kept[128];
    test_path(kept, sizeof(kept), tmp_dir, "out_errors_kept");
    mkdir(kept, 0755);
    test_path(path, sizeof(path), tmp_dir, cases[0].name);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -v 1 --bytes --block 64", path, kept);
    int kept_rc = test_run(cmd, 0, err, sizeof(err));
    DIR *d = opendir(kept);
    int entries = 0;
    for (struct dirent *e = d != NULL ? readdir(d) : NULL; e != NULL; e = readdir(d)) entries += not_dot(e);
    if (d != NULL) closedir(d);
    check(kept_rc == 1 && d != NULL && entries == 0, "an input error into an -o that was there: it stays, empty (exit %d)", kept_rc);
    test_path(path, sizeof(path), tmp_dir, "data.jsonl.gz");
    test_write_file(path, "x", 1);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s --bytes", path, out);
    int rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 1 && strstr(err, "a .gz file is not text") != NULL, "a .gz input is refused -> exit %d: %.*s", rc,
          (int)strcspn(err, "\n"), err);
    test_path(path, sizeof(path), tmp_dir, "empty_dir");
    mkdir(path, 0755);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s --bytes", path, out);
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 1 && strstr(err, "no files in it") != NULL, "an empty directory is refused -> exit %d: %.*s", rc,
          (int)strcspn(err, "\n"), err);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i x --val-shard -v 5");
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 2 && strstr(err, "--val-shard and -v") != NULL, "--val-shard with -v is a flag error -> exit %d", rc);
    snprintf(cmd, sizeof(cmd), "./prepare_data -i x -t 0");
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 2 && strstr(err, "-t '0'") != NULL, "-t 0 is a flag error -> exit %d", rc);
}

// --key-file that is no key file (not there, open to others, not 64 hex
// digits, a directory): one line in the trainers' form, the flag and what the
// key is for, then the file once and why; exit 2, nothing written
static void test_key_file_errors(void) {
    char text[128], out[128], cmd[1024], err[4096], want[700];
    test_path(text, sizeof(text), tmp_dir, "key_input.txt");
    test_write_file(text, "some plain text to seal, long enough for two splits\n", 52);
    test_path(out, sizeof(out), tmp_dir, "out_key");
    TestKeyCase cases[TEST_BAD_KEYS];
    int made = test_bad_key_files(tmp_dir, cases) == 0;
    for (int k = 0; k < TEST_BAD_KEYS; k++) {
        snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -v 8 --bytes --key-file %s", text, out, cases[k].path);
        int rc = test_run(cmd, 0, err, sizeof(err));
        snprintf(want, sizeof(want), "prepare_data: flag --key-file (the key to encrypt the shards under): %s: %s\n",
                 cases[k].path, cases[k].why);
        if (!check(made && rc == 2 && strcmp(err, want) == 0 && !test_exists("%s/MANIFEST", out), "prepare_data "
                   "--key-file %s: exit %d, one line in the trainers' form, no MANIFEST: %.*s", cases[k].why, rc,
                   (int)strcspn(err, "\n"), err))
            printf("      wanted: %s", want);
    }
}

// --val-shard: llm.c's fineweb.py names, the first whole shard val
static void test_val_shard_names(void) {
    char text[128], out[128], cmd[2048], err[4096];
    test_path(text, sizeof(text), tmp_dir, "names.jsonl");
    FILE *f = fopen(text, "wb");
    for (int k = 0; k < 50; k++) fprintf(f, "{\"text\": \"document %02d.\"}\n", k);  // 12 bytes + EOT each: 650 tokens
    fclose(f);
    test_path(out, sizeof(out), tmp_dir, "out_names");
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n fineweb --val-shard -s 300 --bytes -t 1", text, out);
    int rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 0, "--val-shard -s 300 -> exit %d %.*s", rc, (int)strcspn(err, "\n"), err);
    const char *want[] = {"fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"};
    size_t want_n[] = {300, 300, 50};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        char path[256];
        size_t n;
        snprintf(path, sizeof(path), "%s/%s", out, want[k]);
        uint16_t *t = test_read_shard(path, &n);
        ok = ok && t != NULL && n == want_n[k];
        free(t);
    }
    char extra[256];
    snprintf(extra, sizeof(extra), "%s/fineweb_train_000000.bin", out);
    check(ok && access(extra, F_OK) != 0, "--val-shard: fineweb_val_000000 (300), fineweb_train_000001 (300), _000002 (50)");

    // the same on 4 threads in blocks of 64 bytes (a few lines each): the same bytes
    char many[128];
    test_path(many, sizeof(many), tmp_dir, "out_names_t4");
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n fineweb --val-shard -s 300 --bytes -t 4 --block 64", text, many);
    rc = test_run(cmd, 0, err, sizeof(err));
    check(rc == 0 && same_dirs(out, many, 5), "--bytes: -t 4 in 64-byte blocks writes what -t 1 in one block wrote");
}

// The same output for any thread count and block size, with GPT-2 BPE on
// tinyshakespeare: as one text file, and as JSON lines of its paragraphs,
// whose tokens are also checked against bpe_encode of each paragraph.
static void test_threads_gpt2(void) {
    char text_path[512], enc[512], voc[512];
    if (!test_data_path("tinyshakespeare.txt", text_path, sizeof(text_path)) ||
        !test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("no tinyshakespeare / GPT-2 files: the thread and JSON-lines checks with GPT-2 BPE");
        return;
    }
    size_t len;
    unsigned char *text = (unsigned char *)test_read_file(text_path, &len);
    char jsonl[128], cmd[4096], err[4096];
    test_path(jsonl, sizeof(jsonl), tmp_dir, "shakespeare.jsonl");
    FILE *f = fopen(jsonl, "wb");
    size_t n_docs = 0, *starts = malloc((len / 2 + 2) * sizeof(size_t));
    for (size_t at = 0; at < len; n_docs++) {  // a document per paragraph, up to a blank line
        starts[n_docs] = at;
        const unsigned char *blank = memmem(text + at, len - at, "\n\n", 2);
        size_t end = blank != NULL ? (size_t)(blank - text) + 2 : len;
        fputs("{\"text\": \"", f);
        json_escape(text + at, end - at, f);
        fputs("\"}\n", f);
        at = end;
    }
    starts[n_docs] = len;
    fclose(f);

    struct { const char *input, *tag; } inputs[2] = {{text_path, "text file"}, {jsonl, "JSON lines"}};
    for (int k = 0; k < 2; k++) {
        char one[128], many[128];
        test_path(one, sizeof(one), tmp_dir, k ? "t1_jsonl" : "t1_text");
        test_path(many, sizeof(many), tmp_dir, k ? "t3_jsonl" : "t3_text");
        const char *common = "-n s --val-shard -s 100000 -e 1";
        snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s %s -t 1 --encoder %s --vocab %s", inputs[k].input, one, common, enc, voc);
        int rc1 = test_run(cmd, 0, err, sizeof(err));
        snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s %s -t 3 --block 5000 --encoder %s --vocab %s", inputs[k].input, many,
                 common, enc, voc);
        int rc3 = test_run(cmd, 0, err, sizeof(err));
        check(rc1 == 0 && rc3 == 0 && same_dirs(one, many, 6),
              "%s: -t 1 in one 1 MB block and -t 3 in 5000-byte blocks write the same shards", inputs[k].tag);
    }

    // the JSON-lines shards are EOT + bpe_encode(paragraph), paragraph after paragraph
    Bpe bpe;
    char msg[512] = "ok";
    if (!check(bpe_load(&bpe, enc, voc, msg, sizeof(msg)) == 0, "bpe_load (%s)", msg)) { free(starts); free(text); return; }
    uint16_t *got = NULL;
    size_t n_got = 0;
    for (int s = 0; s < 5; s++) {
        char path[1024];
        size_t n;
        snprintf(path, sizeof(path), "%s/t1_jsonl/s_%s_%06d.bin", tmp_dir, s ? "train" : "val", s);
        uint16_t *t = test_read_shard(path, &n);
        got = realloc(got, (n_got + n + 1) * sizeof(uint16_t));
        if (t != NULL) memcpy(got + n_got, t, n * sizeof(uint16_t));
        n_got += n;
        free(t);
    }
    size_t at = 0;
    int same = 1;
    for (size_t d = 0; d < n_docs && same; d++) {
        int *ids;
        size_t n;
        bpe_encode(&bpe, (const char *)text + starts[d], starts[d + 1] - starts[d], 0, &ids, &n);
        same = at + 1 + n <= n_got && got[at] == 50256;
        for (size_t i = 0; same && i < n; i++) same = got[at + 1 + i] == ids[i];
        at += 1 + n;
        free(ids);
    }
    check(same && at == n_got, "JSON lines: the shards are EOT + the BPE of each of %zu paragraphs (%zu tokens)", n_docs, n_got);
    bpe_free(&bpe);
    free(got);
    free(starts);
    free(text);
}

// blocked_in_write: whether process pid sleeps in write(2) (its first
// /proc/PID/syscall number is 1 on x86-64 and 64 on arm64), or, where that
// file cannot be read, in the kernel's pipe_write (/proc/PID/wchan)
static int blocked_in_write(pid_t pid) {
    char path[64], text[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/syscall", (int)pid);
    FILE *f = fopen(path, "r");
    if (f != NULL && fgets(text, sizeof(text), f) != NULL) {
        fclose(f);
#if defined(__aarch64__)
        return strncmp(text, "64 ", 3) == 0;
#else
        return strncmp(text, "1 ", 2) == 0;
#endif
    }
    if (f != NULL) fclose(f);
    snprintf(path, sizeof(path), "/proc/%d/wchan", (int)pid);
    f = fopen(path, "r");
    if (f == NULL) return 0;
    int got = fgets(text, sizeof(text), f) != NULL && strstr(text, "pipe_write") != NULL;
    fclose(f);
    return got;
}

// an input that is a regular file when prepare_data lists it (stat) and a
// FIFO when it opens it: refused at once as not a regular file, where a
// plain fopen would wait for a writer forever. To be sure the swap falls
// between the two, prepare_data's stderr is a pipe this test filled: its
// line about the loaded tokenizer, written after the listing and before
// any input is opened, blocks until the test reads the pipe.
static void test_input_swapped_for_fifo(void) {
    char enc[512], voc[512], input[128], out[128], argv_enc[600], argv_voc[600];
    if (!test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("no GPT-2 files: the input swapped for a FIFO");
        return;
    }
    test_path(input, sizeof(input), tmp_dir, "swapped.txt");
    test_path(out, sizeof(out), tmp_dir, "swapped_out");
    test_write_file(input, "a regular file, at first\n", 25);
    snprintf(argv_enc, sizeof(argv_enc), "%s", enc);
    snprintf(argv_voc, sizeof(argv_voc), "%s", voc);
    int p[2];
    if (!check(pipe(p) == 0, "a pipe for prepare_data's stderr")) return;
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    char fill[4096];
    memset(fill, '.', sizeof(fill));
    size_t filled = 0;
    for (ssize_t w; (w = write(p[1], fill, sizeof(fill))) > 0;) filled += (size_t)w;
    fcntl(p[1], F_SETFL, 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        close(p[0]);
        execl("./prepare_data", "prepare_data", "-i", input, "-o", out, "--encoder", argv_enc, "--vocab", argv_voc,
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    int blocked = 0;
    for (int i = 0; i < 2000 && !(blocked = blocked_in_write(pid)); i++) usleep(5000);  // up to 10 s
    unlink(input);
    int made = mkfifo(input, 0600) == 0;
    // drain the pipe (the filler, then what prepare_data says) until it ends, for at most 10 s
    char said[8192];
    size_t n = 0, drained = 0;
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    int status = -1, done = 0;
    for (int i = 0; i < 2000 && !done; i++) {
        char buf[4096];
        ssize_t r;
        while ((r = read(p[0], buf, sizeof(buf))) > 0) {
            size_t skip_fill = drained < filled ? filled - drained : 0;
            size_t from = (size_t)r < skip_fill ? (size_t)r : skip_fill;
            drained += (size_t)r;
            for (size_t k = from; k < (size_t)r && n + 1 < sizeof(said); k++) said[n++] = buf[k];
        }
        done = waitpid(pid, &status, WNOHANG) == pid;
        if (!done) usleep(5000);
    }
    said[n] = '\0';
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    close(p[0]);
    char want[200];
    snprintf(want, sizeof(want), "-i %s: not a regular file", input);
    check(blocked && made && done && WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(said, want) != NULL,
          "an input swapped for a FIFO after it was listed: refused at once, exit 1, '%s' (blocked in write %d, "
          "ended %d, said: %.300s)", want, blocked, done, said);
    unlink(input);
}

// What prepare_data reads, given as a FIFO: refused at once, not waited on.
// And links planted in its -o directory, to a file outside: the shards and
// the tokenizer .bin replace a link at their names, never writing through
// it, and a link at a shard's temporary name is refused in one line.
static void test_fifos_and_links(void) {
    char fifo[128], text[128], out[128], victim[128], path[256], cmd[2048], err[4096];
    test_path(fifo, sizeof(fifo), tmp_dir, "fifo");
    test_path(text, sizeof(text), tmp_dir, "plain.txt");
    test_path(victim, sizeof(victim), tmp_dir, "victim.txt");
    test_write_file(text, "some plain text to tokenize, long enough for two splits\n", 56);
    if (!check(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo)) return;
    char enc[256], voc[256];
    int have_bpe = test_data_path("gpt2/encoder.json", enc, sizeof(enc)) && test_data_path("gpt2/vocab.bpe", voc, sizeof(voc));
    struct { const char *what, *form; int rc, bpe; } cases[] = {
        {"-i", "-i %s --bytes", 1, 0},
        {"--key-file", "-i TEXT --bytes --key-file %s", 2, 0},
        {"--encoder", "-i TEXT --encoder %s --vocab TEXT", 1, 0},
        {"--vocab", "-i TEXT --encoder ENC --vocab %s", 1, 1},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        if (cases[k].bpe && !have_bpe) {
            skip("no GPT-2 encoder.json: prepare_data --vocab FIFO");
            continue;
        }
        char form[512], args[1024];  // TEXT and ENC: a plain input and GPT-2's encoder.json
        snprintf(form, sizeof(form), "%s", cases[k].form);
        for (char *at; (at = strstr(form, "TEXT")) != NULL || (at = strstr(form, "ENC")) != NULL;) {
            int enc_word = strncmp(at, "ENC", 3) == 0;
            char rest[512];
            snprintf(rest, sizeof(rest), "%s", at + (enc_word ? 3 : 4));
            snprintf(at, sizeof(form) - (size_t)(at - form), "%s%s", enc_word ? enc : text, rest);
        }
        snprintf(args, sizeof(args), form, fifo);
        snprintf(cmd, sizeof(cmd), "timeout -s KILL 10 ./prepare_data %s -o %s/out_fifo", args, tmp_dir);
        int rc = 0;
        double secs = 0.0;
        // called before check(), whose line reads rc
        int refused = test_fifo_refused(cmd, 0, fifo, cases[k].rc, err, sizeof(err), &rc, &secs);
        check(refused, "prepare_data %s FIFO: refused at once (exit %d in %.1f s): %.*s", cases[k].what, rc, secs,
              (int)strcspn(err, "\n"), err);
    }

    // links at the names of the shards and the tokenizer, planted before the run
    test_path(out, sizeof(out), tmp_dir, "out_links");
    mkdir(out, 0755);
    test_write_file(victim, "precious\n", 9);
    const char *names[] = {"ln_val_000000.bin", "ln_train_000000.bin", "ln_tokenizer.bin"};
    int planted = 1;
    for (int k = 0; k < 3; k++) planted &= symlink(victim, test_path(path, sizeof(path), out, names[k])) == 0;
    snprintf(cmd, sizeof(cmd), "./prepare_data -i %s -o %s -n ln -v 8 --bytes", text, out);
    int rc = test_run(cmd, 0, err, sizeof(err));
    char *kept = test_read_text(victim);
    int regular = 1;
    struct stat st;
    for (int k = 0; k < 3; k++) regular &= lstat(test_path(path, sizeof(path), out, names[k]), &st) == 0 && S_ISREG(st.st_mode);
    size_t n = 0;
    uint16_t *val = test_read_shard(test_path(path, sizeof(path), out, names[0]), &n);
    check(planted && rc == 0 && regular && strcmp(kept, "precious\n") == 0 && val != NULL && n == 8,
          "-o with links planted at the shards' and the tokenizer's names: each replaced by prepare_data's file (val: "
          "%zu tokens), the file they pointed to untouched (exit %d): %.*s", n, rc, (int)strcspn(err, "\n"), err);
    free(val);
    free(kept);
    // a link at a shard's temporary name: refused in one line, never followed
    char link[300];
    snprintf(link, sizeof(link), "%s/ln_train_000000.bin.tmp", out);
    planted = symlink(victim, link) == 0;
    rc = test_run(cmd, 0, err, sizeof(err));
    kept = test_read_text(victim);
    check(planted && rc == 1 && strcmp(kept, "precious\n") == 0 && strstr(err, "ln_train_000000.bin.tmp: a symbolic link") != NULL &&
          test_count(err, "\n") == 1, "a link planted at a shard's temporary name: refused, not followed (exit %d): %.*s",
          rc, (int)strcspn(err, "\n"), err);
    free(kept);
    unlink(fifo);
}

// A new user's first runs. ./train_gpt2 in a fresh clone (no data at the
// default glob) says in its one line which prepare_data command makes that
// data; made so, the default globs find it, and they find llm.c's
// tinyshakespeare.py names (tiny_shakespeare_train.bin, _val.bin) too. And
// make run's offline fallback (dev/run.sh) says where it looked, $LLM3D_DATA
// included, then trains.
static void test_first_run(void) {
    char cwd[1024], fresh[256], data[300], text[256], cmd[4096], err[4096], from[400], to[400];
    if (access("./train_gpt2", X_OK) != 0 || getcwd(cwd, sizeof(cwd)) == NULL) {
        skip("./train_gpt2 not built: the first run's data");
        return;
    }
    test_path(fresh, sizeof(fresh), tmp_dir, "fresh_clone");
    mkdir(fresh, 0755);
    const char *tiny = "-e d2 -ev 256 -et 32 -b 2 -t 16 -d 32 -x 1 -v 1 -m 1 -s 0 -th 1";
    snprintf(cmd, sizeof(cmd), "cd %s && %s/train_gpt2 %s", fresh, cwd, tiny);
    int rc = test_run(cmd, 1, err, sizeof(err));
    check(rc == 2 && test_count(err, "\n") == 1 && strstr(err, "flag -i (the train data): no files match dev/data/tinyshakespeare/") != NULL &&
          strstr(err, "./prepare_data -i tinyshakespeare.txt -o dev/data/tinyshakespeare -n tiny_shakespeare") != NULL &&
          strstr(err, "-i 'dev/data/quickstart/tiny_train_*.bin' -j 'dev/data/quickstart/tiny_val_*.bin'") != NULL,
          "a fresh clone's first ./train_gpt2: one line with the prepare_data command that makes the default data, "
          "and make run's shards as the other way "
          "(exit %d): %.*s", rc, (int)strcspn(err, "\n"), err);
    test_path(text, sizeof(text), tmp_dir, "first_text.txt");
    FILE *f = fopen(text, "w");
    for (int k = 0; k < 200; k++) fprintf(f, "line %d of a small text for a first run.\n", k);
    fclose(f);
    snprintf(data, sizeof(data), "%s/dev/data/tinyshakespeare", fresh);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s/dev/data && ./prepare_data -i %s -o %s -n tiny_shakespeare -v 256 --bytes && "
             "cd %s && %s/train_gpt2 %s", fresh, text, data, fresh, cwd, tiny);
    rc = test_run(cmd, 1, err, sizeof(err));
    check(rc == 0, "made by that command, the default globs find the data (exit %d): %s", rc, test_line_of(err, "train_gpt2:"));
    // llm.c's names, without our MANIFEST
    const char *split[2] = {"train", "val"};
    for (int k = 0; k < 2; k++) {
        snprintf(from, sizeof(from), "%s/tiny_shakespeare_%s_000000.bin", data, split[k]);
        snprintf(to, sizeof(to), "%s/tiny_shakespeare_%s.bin", data, split[k]);
        rename(from, to);
    }
    snprintf(from, sizeof(from), "%s/MANIFEST", data);
    unlink(from);
    snprintf(cmd, sizeof(cmd), "cd %s && %s/train_gpt2 %s", fresh, cwd, tiny);
    rc = test_run(cmd, 1, err, sizeof(err));
    check(rc == 0, "llm.c's tiny_shakespeare_train.bin and tiny_shakespeare_val.bin: found by the default globs (exit %d): %s",
          rc, test_line_of(err, "train_gpt2:"));

    // make run with no data where it looks and no network
    if (access("./plot_log", X_OK) != 0) {
        skip("./plot_log not built: make run's offline fallback");
        return;
    }
    char nodata[256], quick[256];
    test_path(nodata, sizeof(nodata), tmp_dir, "no_data_here");
    test_path(quick, sizeof(quick), tmp_dir, "quickstart");
    snprintf(cmd, sizeof(cmd), "LLM3D_DATA=%s LLM3D_QUICKSTART=%s LLM3D_NO_FETCH=1 STEPS=1 ./dev/run.sh", nodata, quick);
    rc = test_run(cmd, 1, err, sizeof(err));
    char want[700], svg[300];
    snprintf(want, sizeof(want), "run: no tinyshakespeare.txt, gpt2/encoder.json and gpt2/vocab.bpe in %s ($LLM3D_DATA, "
             "default ../shared/data) or %s", nodata, quick);
    snprintf(svg, sizeof(svg), "%s/run/plot.svg", quick);
    check(rc == 0 && strstr(err, want) != NULL && access(svg, R_OK) == 0, "make run's offline fallback says where it "
          "looked ($LLM3D_DATA), then trains one step and plots it (exit %d): %s", rc, test_line_of(err, "run: no"));
}

int main(void) {
    if (test_make_dir(tmp_dir, sizeof(tmp_dir), "/tmp/test_prepare_data_XXXXXX") != 0) {
        printf("cannot make a temp dir\n");
        return 1;
    }
    test_json();
    if (access("./prepare_data", X_OK) != 0) {
        skip("./prepare_data not built (run from the repo root after make)");
    } else {
        test_jsonl_and_directory();
        test_jsonl_errors();
        test_key_file_errors();
        test_val_shard_names();
        test_threads_gpt2();
        test_input_swapped_for_fifo();
        test_fifos_and_links();
        test_first_run();
    }
    test_remove_dir(tmp_dir);
    return test_summary();
}
