/*
 * test_export.c: export_hf, run as a program on small model files this test
 * writes, and its output read back here: the safetensors header (every name,
 * dtype and shape, offsets that tile the data exactly), the values of the
 * tensors against the model file's (the transposed ones included), config.json,
 * the bf16 rounding, a v5 (bf16) model file in, a model sealed as the
 * trainer's -enc 2 seals it (read with --key-file, refused without, and a
 * --key-file that is no key file refused in the trainers' form, for a plain
 * model too), the tokenizer's files (a small vocabulary of the model's V
 * exported; files cut short, another V, no "<|endoftext|>" refused before
 * anything is written), and its errors: FIFOs where it reads, links planted
 * where it writes.
 *
 *   make dev/test/test_export export_hf && ./dev/test/test_export
 */
#include "llm3d/checkpoint.h"  // ckpt_open_read, key_generate, key_write_file; includes gpt2.h, aead.h
#include "llm3d/json.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

static char tmp_dir[64];

// a shape with every dimension different, so a swapped one shows: V=300 is padded to Vp=384
static const GPT2Config shape = {.maxT = 16, .V = 300, .Vp = 384, .L = 2, .NH = 2, .C = 8};

// A tensor as the header lists it.
typedef struct {
    char name[64], dtype[8];
    int rank;
    size_t shape[2], begin, end;
} Listed;

// read_header: the safetensors header of data (len bytes) into list; the
// count, or -1 with why in err
static int read_header(const unsigned char *data, size_t len, Listed *list, int max, size_t *data_start, char *err, size_t errlen) {
    if (len < 8) { snprintf(err, errlen, "shorter than 8 bytes"); return -1; }
    uint64_t n = 0;
    for (int k = 7; k >= 0; k--) n = n << 8 | data[k];
    if (n > len - 8) { snprintf(err, errlen, "header length %llu past the end", (unsigned long long)n); return -1; }
    *data_start = 8 + (size_t)n;
    JsonReader j;
    json_init(&j, data + 8, (size_t)n);
    JsonBuf key = {NULL, 0, 0}, field = {NULL, 0, 0};
    int index = 0, more, count = 0, ok = 1;
    while (ok && (more = json_object_next(&j, &index, &key)) == 1) {
        if (strcmp(key.bytes, "__metadata__") == 0) { ok = json_skip_value(&j) == 0; continue; }
        if (count == max) { snprintf(err, errlen, "more than %d tensors", max); ok = 0; break; }
        Listed *t = &list[count++];
        memset(t, 0, sizeof(*t));
        snprintf(t->name, sizeof(t->name), "%s", key.bytes);
        int inner = 0;
        while (ok && json_object_next(&j, &inner, &field) == 1) {
            int items = 0;
            double v = 0;
            if (strcmp(field.bytes, "dtype") == 0) {
                JsonBuf s = {NULL, 0, 0};
                ok = json_string(&j, &s) == 0;
                if (ok) snprintf(t->dtype, sizeof(t->dtype), "%s", s.bytes);
                json_buf_free(&s);
            } else if (strcmp(field.bytes, "shape") == 0) {
                while (ok && json_array_next(&j, &items) == 1) {
                    ok = json_number(&j, &v) == 0 && items <= 2;
                    if (ok) t->shape[items - 1] = (size_t)v;
                }
                t->rank = items;
            } else if (strcmp(field.bytes, "data_offsets") == 0) {
                while (ok && json_array_next(&j, &items) == 1) {
                    ok = json_number(&j, &v) == 0 && items <= 2;
                    if (ok && items == 1) t->begin = (size_t)v;
                    if (ok && items == 2) t->end = (size_t)v;
                }
            } else {
                ok = json_skip_value(&j) == 0;
            }
        }
    }
    if (ok && json_at_end(&j) != 0) ok = 0;
    if (!ok && j.err[0] != '\0') snprintf(err, errlen, "header JSON, byte %zu: %s", j.err_pos, j.err);
    json_buf_free(&key);
    json_buf_free(&field);
    return ok ? count : -1;
}

static const Listed *find(const Listed *list, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (strcmp(list[k].name, name) == 0) return &list[k];
    return NULL;
}

// value: element i of a listed tensor, as a float
static float value(const unsigned char *data, size_t data_start, const Listed *t, size_t i) {
    const unsigned char *p = data + data_start + t->begin;
    if (strcmp(t->dtype, "BF16") == 0) {
        uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
        return bf16_to_float(h);
    }
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

// the model file's tensor t, layer l, as a pointer into params
static const float *llmc_tensor(const float *params, int t, int l) {
    size_t sizes[NUM_PARAM_TENSORS], offset = 0;
    param_sizes(&shape, sizes);
    for (int k = 0; k < t; k++) offset += sizes[k];
    return params + offset + (size_t)l * (sizes[t] / shape.L);
}

static float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// check_export: dir's model.safetensors against params, in the given dtype
static void check_export(const char *dir, const float *params, int bf16) {
    const char *tag = bf16 ? "bf16" : "f32";
    char path[256], err[256] = "";
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    size_t len, data_start = 0;
    unsigned char *data = (unsigned char *)test_read_file(path, &len);
    Listed list[64];
    int n = data != NULL ? read_header(data, len, list, 64, &data_start, err, sizeof(err)) : -1;
    if (!check(n >= 0, "%s: %s reads back (%s)", tag, path, data == NULL ? "missing" : err)) { free(data); return; }
    size_t C = (size_t)shape.C, elem = bf16 ? 2 : 4;
    check(n == 12 * shape.L + 4, "%s: %d tensors listed (want 12L + 4 = %d)", tag, n, 12 * shape.L + 4);
    check(data_start % 8 == 0, "%s: the data starts at byte %zu, 8-aligned", tag, data_start);

    // every name with its shape: HF's GPT-2 (Conv1D keeps its weights as (in, out))
    struct { const char *suffix; size_t rows, cols; } per_layer[12] = {
        {"ln_1.weight", C, 0}, {"ln_1.bias", C, 0}, {"attn.c_attn.weight", C, 3 * C}, {"attn.c_attn.bias", 3 * C, 0},
        {"attn.c_proj.weight", C, C}, {"attn.c_proj.bias", C, 0}, {"ln_2.weight", C, 0}, {"ln_2.bias", C, 0},
        {"mlp.c_fc.weight", C, 4 * C}, {"mlp.c_fc.bias", 4 * C, 0}, {"mlp.c_proj.weight", 4 * C, C}, {"mlp.c_proj.bias", C, 0},
    };
    int names_ok = 1;
    for (int k = 0; k < 4 + 12 * shape.L; k++) {
        char name[64];
        size_t rows, cols;
        if (k < 4) {
            const char *top[4] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
            size_t top_rows[4] = {(size_t)shape.V, (size_t)shape.maxT, C, C}, top_cols[4] = {C, C, 0, 0};
            snprintf(name, sizeof(name), "%s", top[k]);
            rows = top_rows[k];
            cols = top_cols[k];
        } else {
            int l = (k - 4) / 12, i = (k - 4) % 12;
            snprintf(name, sizeof(name), "h.%d.%s", l, per_layer[i].suffix);
            rows = per_layer[i].rows;
            cols = per_layer[i].cols;
        }
        const Listed *t = find(list, n, name);
        int ok = t != NULL && strcmp(t->dtype, bf16 ? "BF16" : "F32") == 0 && t->rank == (cols ? 2 : 1) && t->shape[0] == rows &&
                 (cols == 0 || t->shape[1] == cols) && t->end - t->begin == rows * (cols ? cols : 1) * elem;
        if (!ok) printf("      %s: %s\n", name, t == NULL ? "missing" : "wrong dtype, shape or size");
        names_ok = names_ok && ok;
    }
    check(names_ok, "%s: every tensor has HF's name, dtype, shape (wte (V, C), c_attn (C, 3C), mlp.c_proj (4C, C), ...) and byte size",
          tag);

    // the offsets tile the data: sorted by begin, each starts where the last ended, the last at the file's end
    size_t at = 0;
    int tiled = 1;
    for (int done = 0; done < n && tiled; done++) {
        const Listed *next = NULL;
        for (int k = 0; k < n; k++)
            if (list[k].begin == at && list[k].end > at) next = &list[k];
        tiled = next != NULL;
        if (tiled) at = next->end;
    }
    check(tiled && data_start + at == len, "%s: data_offsets tile the %zu data bytes with no gap or overlap, to the file's end", tag,
          len - data_start);

    // values, against the model file's: plain, transposed, and wte without its padded rows
    float (*want)(float) = bf16 ? round_bf16 : NULL;
    int same = 1;
    const Listed *wte = find(list, n, "wte.weight");
    const float *src = llmc_tensor(params, P_WTE, 0);
    for (size_t i = 0; same && wte != NULL && i < (size_t)shape.V * C; i++)
        same = value(data, data_start, wte, i) == (want ? want(src[i]) : src[i]);
    check(same && wte != NULL, "%s: wte.weight is the first V = %d rows of wte (Vp = %d)", tag, shape.V, shape.Vp);
    struct { const char *name; int tensor; size_t out, in; } mats[4] = {
        {"attn.c_attn.weight", P_QKVW, 3 * C, C}, {"attn.c_proj.weight", P_ATTPROJW, C, C},
        {"mlp.c_fc.weight", P_FCW, 4 * C, C}, {"mlp.c_proj.weight", P_FCPROJW, C, 4 * C},
    };
    for (int m = 0; m < 4; m++) {
        same = 1;
        for (int l = 0; l < shape.L; l++) {
            char name[64];
            snprintf(name, sizeof(name), "h.%d.%s", l, mats[m].name);
            const Listed *t = find(list, n, name);
            const float *w = llmc_tensor(params, mats[m].tensor, l);  // (out, in)
            for (size_t i = 0; same && t != NULL && i < mats[m].in; i++)
                for (size_t o = 0; same && o < mats[m].out; o++) {
                    float x = w[o * mats[m].in + i];
                    same = value(data, data_start, t, i * mats[m].out + o) == (want ? want(x) : x);
                }
            same = same && t != NULL;
        }
        check(same, "%s: h.<l>.%s[i][o] == llm.c's %s[l][o][i], every layer (transposed)", tag, mats[m].name, param_name(mats[m].tensor));
    }
    struct { const char *name; int tensor, layer; size_t count; } vecs[4] = {
        {"h.1.attn.c_attn.bias", P_QKVB, 1, 3 * C}, {"h.0.ln_2.weight", P_LN2W, 0, C},
        {"ln_f.bias", P_LNFB, 0, C}, {"wpe.weight", P_WPE, 0, (size_t)shape.maxT * C},
    };
    for (int k = 0; k < 4; k++) {
        const Listed *t = find(list, n, vecs[k].name);
        const float *w = llmc_tensor(params, vecs[k].tensor, vecs[k].layer);
        same = t != NULL;
        for (size_t i = 0; same && i < vecs[k].count; i++) same = value(data, data_start, t, i) == (want ? want(w[i]) : w[i]);
        check(same, "%s: %s equals llm.c's %s, layer %d", tag, vecs[k].name, param_name(vecs[k].tensor), vecs[k].layer);
    }
    free(data);
}

// check_config_json: config.json holds the shape under GPT2Config's names
static void check_config_json(const char *dir) {
    char path[256];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    size_t len;
    unsigned char *text = (unsigned char *)test_read_file(path, &len);
    if (!check(text != NULL, "config.json written")) return;
    JsonReader j;
    json_init(&j, text, len);
    JsonBuf key = {NULL, 0, 0}, s = {NULL, 0, 0};
    int index = 0, found = 0, ok = 1;
    struct { const char *name; double want; } ints[6] = {{"vocab_size", 300}, {"n_positions", 16}, {"n_embd", 8},
                                                         {"n_layer", 2}, {"n_head", 2}, {"layer_norm_epsilon", 1e-5}};
    while (ok && json_object_next(&j, &index, &key) == 1) {
        int k = 0;
        while (k < 6 && strcmp(ints[k].name, key.bytes) != 0) k++;
        double v = 0;
        if (k < 6) {
            ok = json_number(&j, &v) == 0 && v == ints[k].want;
            found++;
        } else if (strcmp(key.bytes, "activation_function") == 0 || strcmp(key.bytes, "model_type") == 0) {
            ok = json_string(&j, &s) == 0 && (strcmp(s.bytes, "gelu_new") == 0 || strcmp(s.bytes, "gpt2") == 0);
            found++;
        } else {
            ok = json_skip_value(&j) == 0;
        }
    }
    check(ok && found == 8 && json_at_end(&j) == 0, "config.json: model_type gpt2, the shape, gelu_new (tanh GELU), eps 1e-5");
    json_buf_free(&key);
    json_buf_free(&s);
    free(text);
}

// check_tokenizer_files: a model with GPT-2's 50257 tokens gets GPT-2's
// tokenizer files, copied byte for byte (GPT2Tokenizer's names); a copy of
// encoder.json cut short is refused
static void check_tokenizer_files(void) {
    char enc[512], voc[512];
    if (!test_data_path("gpt2/encoder.json", enc, sizeof(enc)) || !test_data_path("gpt2/vocab.bpe", voc, sizeof(voc))) {
        skip("no GPT-2 encoder.json / vocab.bpe: export_hf's tokenizer files");
        return;
    }
    GPT2Config gpt2_vocab = {.maxT = 8, .V = 50257, .Vp = 50304, .L = 1, .NH = 1, .C = 4};
    float *params = calloc(param_count(&gpt2_vocab), sizeof(float));
    char model[128], dir[128], cmd[2048], out[4096], err[256], path[256];
    snprintf(model, sizeof(model), "%s/model_gpt2_vocab.bin", tmp_dir);
    snprintf(dir, sizeof(dir), "%s/hf_tok", tmp_dir);
    model_save(model, &gpt2_vocab, params, 0, err, sizeof(err));
    free(params);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s --encoder %s --vocab %s", model, dir, enc, voc);
    int rc = test_run(cmd, 1, out, sizeof(out));
    const char *from[2] = {enc, voc}, *to[2] = {"vocab.json", "merges.txt"};
    int same = rc == 0;
    for (int k = 0; same && k < 2; k++) same = test_files_same(from[k], test_path(path, sizeof(path), dir, to[k]));
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    check(same && access(path, R_OK) == 0, "V = 50257: vocab.json and merges.txt are encoder.json and vocab.bpe, plus "
          "tokenizer_config.json (exit %d)", rc);
    // GPT-2's encoder.json cut short: refused, not copied into a broken vocab.json
    char cut[128];
    size_t len = 0;
    char *text = test_read_file(enc, &len);
    snprintf(cut, sizeof(cut), "%s/encoder_cut.json", tmp_dir);
    test_write_file(cut, text, len - len / 3);
    free(text);
    snprintf(dir, sizeof(dir), "%s/hf_tok_cut", tmp_dir);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s --encoder %s --vocab %s", model, dir, cut, voc);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 2 && test_count(out, "\n") == 1 && strncmp(out, "export_hf: flag --encoder (", 27) == 0 &&
          strstr(out, cut) != NULL && !test_exists("%s", dir), "GPT-2's encoder.json cut short: refused in one line "
          "naming --encoder and the file, nothing written (exit %d): %.*s", rc, (int)strcspn(out, "\n"), out);
}

// tiny_tokenizer: in tmp_dir, test_run.h's tiny encoder.json with
// "<|endoftext|>" as id 258 (enc), its vocab.bpe (voc), both len bytes, and
// a model of its 259 tokens (model, modellen bytes); 0, or -1
static int tiny_tokenizer(char *enc, char *voc, size_t len, char *model, size_t modellen) {
    snprintf(enc, len, "%s/tiny_encoder.json", tmp_dir);
    snprintf(voc, len, "%s/tiny_vocab.bpe", tmp_dir);
    snprintf(model, modellen, "%s/model_v259.bin", tmp_dir);
    test_write_tiny_encoder(enc, ", \"<|endoftext|>\": 258");
    test_write_file(voc, "#version: 0.2\na b\nab c\n", 23);
    GPT2Config tiny_vocab = {.maxT = 8, .V = 259, .Vp = 384, .L = 1, .NH = 1, .C = 4};
    float *params = calloc(param_count(&tiny_vocab), sizeof(float));
    char err[256];
    int rc = params != NULL ? model_save(model, &tiny_vocab, params, 0, err, sizeof(err)) : -1;
    free(params);
    return rc;
}

// the tokenizer's files are parsed (prepare_data's loader) before anything
// is written: a small vocabulary of the model's V is exported, its EOT's id
// in config.json; a truncated encoder.json, a vocab.bpe cut short, a
// vocabulary of another size than the model's, or one without
// "<|endoftext|>" is refused in one line naming the flag and the file, exit
// 2, and -o is not made. model300: the test's plain model of V = 300.
static void check_tokenizer_parsed(const char *model300) {
    char enc[128], voc[128], tiny_model[128], cut[128], cut_voc[128], no_eot[128], dir[128];
    char cmd[2048], out[4096], path[256];
    if (!check(tiny_tokenizer(enc, voc, sizeof(enc), tiny_model, sizeof(tiny_model)) == 0, "a tiny tokenizer and a "
               "model of its 259 tokens"))
        return;
    snprintf(dir, sizeof(dir), "%s/hf_tiny", tmp_dir);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s --encoder %s --vocab %s -o %s", tiny_model, enc, voc, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    int same = rc == 0 && test_files_same(enc, test_path(path, sizeof(path), dir, "vocab.json")) &&
               test_files_same(voc, test_path(path, sizeof(path), dir, "merges.txt"));
    char *config = test_read_text(test_path(path, sizeof(path), dir, "config.json"));
    check(same && strstr(config, "\"eos_token_id\": 258") != NULL, "V = 259 and a tokenizer of 259 tokens: "
          "vocab.json and merges.txt are its files, config.json's eos_token_id is its EOT, 258 (exit %d) %.*s", rc,
          (int)strcspn(out, "\n"), out);
    free(config);

    // the broken files and the vocabularies that are not the model's
    size_t len = 0;
    char *text = test_read_file(enc, &len);
    snprintf(cut, sizeof(cut), "%s/cut_encoder.json", tmp_dir);
    test_write_file(cut, text, len / 2);
    free(text);
    snprintf(cut_voc, sizeof(cut_voc), "%s/cut_vocab.bpe", tmp_dir);
    test_write_file(cut_voc, "#version: 0.2\na b\n", 18);  // cut short at a line end
    snprintf(no_eot, sizeof(no_eot), "%s/no_eot.json", tmp_dir);
    test_write_tiny_encoder(no_eot, ", \"abcd\": 258");
    struct { const char *what, *model, *enc, *voc, *flag, *file, *says; } cases[] = {
        {"encoder.json cut in half", tiny_model, cut, voc, "--encoder", cut, ": offset "},
        {"vocab.bpe cut short", tiny_model, enc, cut_voc, "--vocab", cut_voc, "'abc' (id 257) is made by no merge"},
        {"259 tokens for a model of V = 300", model300, enc, voc, "--encoder", enc, "259 tokens, but the model has V = 300"},
        {"no <|endoftext|>", tiny_model, no_eot, "#version: 0.2\na b\nab c\nabc d\n", "--encoder", no_eot,
         "no \"<|endoftext|>\" token"},
        {"encoder.json given as --vocab too", tiny_model, enc, enc, "--vocab", enc, "#version"},
    };
    char voc4[128];
    snprintf(voc4, sizeof(voc4), "%s/vocab4.bpe", tmp_dir);
    test_write_file(voc4, cases[3].voc, strlen(cases[3].voc));
    cases[3].voc = voc4;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        snprintf(dir, sizeof(dir), "%s/hf_refused_tok%zu", tmp_dir, k);
        snprintf(cmd, sizeof(cmd), "./export_hf -i %s --encoder %s --vocab %s -o %s", cases[k].model, cases[k].enc,
                 cases[k].voc, dir);
        rc = test_run(cmd, 1, out, sizeof(out));
        char lead[400];
        snprintf(lead, sizeof(lead), "export_hf: flag %s (", cases[k].flag);
        check(rc == 2 && test_count(out, "\n") == 1 && strncmp(out, lead, strlen(lead)) == 0 &&
              strstr(out, cases[k].file) != NULL && strstr(out, cases[k].says) != NULL && !test_exists("%s", dir),
              "%s: refused in one line naming %s and the file, nothing written (exit %d): %.*s", cases[k].what,
              cases[k].flag, rc, (int)strcspn(out, "\n"), out);
    }
}

// GPT-2's files found in the data directory ($LLM3D_DATA) but broken: the
// export of a model of 50257 tokens fails as a whole (exit 1), naming the
// file and how to go on, rather than copying them into a broken tokenizer
static void check_broken_data_tokenizer(void) {
    char data[128], gpt2[160], path[200], model[128], dir[128], cmd[1024], out[4096], err[256];
    snprintf(data, sizeof(data), "%s/data", tmp_dir);
    snprintf(gpt2, sizeof(gpt2), "%s/gpt2", data);
    mkdir(data, 0700);
    mkdir(gpt2, 0700);
    snprintf(path, sizeof(path), "%s/encoder.json", gpt2);
    test_write_file(path, "{\"!\": 0, \"\\\"", 12);  // cut inside its second key
    snprintf(path, sizeof(path), "%s/vocab.bpe", gpt2);
    test_write_file(path, "#version: 0.2\n", 14);
    GPT2Config gpt2_vocab = {.maxT = 8, .V = 50257, .Vp = 50304, .L = 1, .NH = 1, .C = 4};
    float *params = calloc(param_count(&gpt2_vocab), sizeof(float));
    snprintf(model, sizeof(model), "%s/model_v50257.bin", tmp_dir);
    int saved = params != NULL && model_save(model, &gpt2_vocab, params, 0, err, sizeof(err)) == 0;
    free(params);
    if (!check(saved, "write a model of 50257 tokens")) return;
    snprintf(dir, sizeof(dir), "%s/hf_broken_data", tmp_dir);
    snprintf(cmd, sizeof(cmd), "LLM3D_DATA=%s ./export_hf -i %s -o %s", data, model, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && test_count(out, "\n") == 1 && strstr(out, "gpt2/encoder.json") != NULL &&
          strstr(out, "found in $LLM3D_DATA") != NULL && strstr(out, "--no-tokenizer") != NULL && !test_exists("%s", dir),
          "GPT-2's encoder.json in $LLM3D_DATA broken: the export refused in one line naming it (exit %d), nothing "
          "written: %.*s", rc, (int)strcspn(out, "\n"), out);
}

// a plain model with --key-file: the key file is read and checked all the
// same (a file that is no key is refused in the trainers' form, exit 2), and
// a good one exports the plain model as without it, with one note that the
// key was not needed
static void check_plain_key(const char *model, const char *plain_dir) {
    char key_file[128], dir[128], cmd[1024], out[8192], want[700], a[256], b[256];
    snprintf(key_file, sizeof(key_file), "%s/plain_job.key", tmp_dir);
    snprintf(dir, sizeof(dir), "%s/hf_plain_key", tmp_dir);
    if (!check(test_random_key_file(key_file) == 0, "a key file")) return;
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s --key-file %s -o %s", model, key_file, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/model.safetensors", plain_dir);
    snprintf(b, sizeof(b), "%s/model.safetensors", dir);
    snprintf(want, sizeof(want), "note: flag --key-file %s: %s is not sealed, so its key is not needed", key_file, model);
    check(rc == 0 && test_files_same(a, b) && test_count(out, want) == 1, "a plain model, --key-file of a key: the "
          "same model.safetensors, and one note that the key was not needed (exit %d): %s", rc,
          test_line_of(out, "note:"));
    TestKeyCase keys[TEST_BAD_KEYS];
    int ok = test_bad_key_files(tmp_dir, keys) == 0;
    for (int i = 0; i < TEST_BAD_KEYS; i++) {
        snprintf(dir, sizeof(dir), "%s/hf_plain_badkey%d", tmp_dir, i);
        snprintf(cmd, sizeof(cmd), "./export_hf -i %s --key-file %s -o %s", model, keys[i].path, dir);
        rc = test_run(cmd, 1, out, sizeof(out));
        snprintf(want, sizeof(want), "export_hf: flag --key-file (the key of the job that sealed the model): %s: %s\n",
                 keys[i].path, keys[i].why);
        if (!check(ok && rc == 2 && strcmp(out, want) == 0 && !test_exists("%s", dir), "a plain model, --key-file %s: "
                   "exit %d, one line in the trainers' form, nothing written: %.*s", keys[i].why, rc,
                   (int)strcspn(out, "\n"), out))
            printf("      wanted: %s", want);
    }
}

// a v3 model file of params and shape c, sealed under key's cipher key as
// the trainer's -enc 2 seals its final model: 0, or -1 with err set
static int save_sealed_model(const char *path, const uint8_t key[32], const GPT2Config *c, const float *params,
                             char *err, size_t errlen) {
    size_t header = HEADER_INTS * sizeof(int32_t), n = param_count(c) * sizeof(float);
    uint8_t *plain = (uint8_t *)malloc(header + n);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    AeadFileKey fk;
    aead_file_key(&fk, key);
    int rc = plain != NULL && fd >= 0 ? 0 : errorf(err, errlen, "%s: cannot make it", path);
    if (rc == 0) {
        model_fill_header((int32_t *)plain, c, 3);
        memcpy(plain + header, params, n);
        rc = aead_file_write_all(fd, &fk, plain, header + n, AEAD_FILE_CHUNK_BYTES, NULL, path, err, errlen);
    }
    if (fd >= 0) close(fd);
    aead_file_key_wipe(&fk);
    free(plain);
    return rc;
}

// check_sealed: params sealed as the trainer's -enc 2 seals its final model
// export, given the job's key with --key-file, to the very bytes that
// exporting the plain model (already in plain_dir) gives; without the key,
// with another key, or with a key file that is not one, it is refused in one
// line naming the file
static void check_sealed(const float *params, const char *plain_dir) {
    char model[128], key_file[128], other_file[128], dir[128], cmd[1024], out[8192], err[1024], a[256], b[256];
    uint8_t key[32], other[32];
    snprintf(model, sizeof(model), "%s/model_sealed.bin", tmp_dir);
    snprintf(key_file, sizeof(key_file), "%s/job.key", tmp_dir);
    snprintf(other_file, sizeof(other_file), "%s/other.key", tmp_dir);
    snprintf(dir, sizeof(dir), "%s/hf_sealed", tmp_dir);
    int ok = key_generate(key, err, sizeof(err)) == 0 && key_write_file(key_file, key, err, sizeof(err)) == 0 &&
             key_generate(other, err, sizeof(err)) == 0 && key_write_file(other_file, other, err, sizeof(err)) == 0 &&
             save_sealed_model(model, key, &shape, params, err, sizeof(err)) == 0;
    int is_sealed = 0, fd = ok ? ckpt_open_read(model, 1, &is_sealed, NULL, 0) : -1;
    if (fd >= 0) close(fd);
    if (!check(ok && is_sealed, "a sealed model and its job key (%s)", ok ? "ok" : err)) return;

    snprintf(cmd, sizeof(cmd), "./export_hf -i %s --key-file %s -o %s", model, key_file, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/model.safetensors", plain_dir);
    snprintf(b, sizeof(b), "%s/model.safetensors", dir);
    int same = rc == 0 && test_files_same(a, b);
    snprintf(a, sizeof(a), "%s/config.json", plain_dir);
    snprintf(b, sizeof(b), "%s/config.json", dir);
    check(same && test_files_same(a, b), "export_hf --key-file of the sealed model: model.safetensors and config.json "
          "byte for byte those of the plain model (exit %d) %.*s", rc, (int)strcspn(out, "\n"), out);

    // through a symbolic link, as a plain model is read
    char link[160];
    snprintf(link, sizeof(link), "%s/model_link.bin", tmp_dir);
    snprintf(b, sizeof(b), "%s/hf_link", tmp_dir);
    ok = symlink(model, link) == 0;
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s --key-file %s -o %s", link, key_file, b);
    rc = ok ? test_run(cmd, 1, out, sizeof(out)) : -1;
    snprintf(a, sizeof(a), "%s/model.safetensors", plain_dir);
    strncat(b, "/model.safetensors", sizeof(b) - strlen(b) - 1);
    check(rc == 0 && test_files_same(a, b), "export_hf --key-file of a symbolic link to the sealed model: the same "
          "model.safetensors (exit %d) %.*s", rc, (int)strcspn(out, "\n"), out);

    char none_file[128];
    snprintf(none_file, sizeof(none_file), "%s/none.key", tmp_dir);
    struct { const char *what, *key_file, *names, *says; int status; } cases[] = {
        {"no --key-file", NULL, model, "give the key of the job that wrote it with --key-file", 2},
        {"another key", other_file, model, "sealed with another key", 1},
    };
    for (int i = 0; i < 2; i++) {
        char flags[256] = "";
        if (cases[i].key_file != NULL) snprintf(flags, sizeof(flags), "--key-file %s", cases[i].key_file);
        snprintf(cmd, sizeof(cmd), "./export_hf -i %s %s -o %s/hf_refused", model, flags, tmp_dir);
        rc = test_run(cmd, 1, out, sizeof(out));
        int lines = test_count(out, "\n");
        check(rc == cases[i].status && lines == 1 && strstr(out, cases[i].names) != NULL && strstr(out, cases[i].says) != NULL,
              "the sealed model, %s: refused in one line naming the model (exit %d, %d lines): %.*s", cases[i].what,
              rc, lines, (int)strcspn(out, "\n"), out);
    }
    // a --key-file that is no key file: one line in the trainers' form, the
    // flag and what the key is for, then the file once and why; exit 2
    char want[700];
    TestKeyCase keys[TEST_BAD_KEYS];
    ok = test_bad_key_files(tmp_dir, keys) == 0;
    for (int i = 0; i < TEST_BAD_KEYS; i++) {
        snprintf(cmd, sizeof(cmd), "./export_hf -i %s --key-file %s -o %s/hf_refused", model, keys[i].path, tmp_dir);
        rc = test_run(cmd, 1, out, sizeof(out));
        snprintf(want, sizeof(want), "export_hf: flag --key-file (the key of the job that sealed the model): %s: %s\n",
                 keys[i].path, keys[i].why);
        if (!check(ok && rc == 2 && strcmp(out, want) == 0, "the sealed model, --key-file %s: exit %d, one line in the "
                   "trainers' form: %.*s", keys[i].why, rc, (int)strcspn(out, "\n"), out))
            printf("      wanted: %s", want);
    }
}

// what export_hf reads, given as a FIFO: refused at once, not waited on;
// and links planted in its -o directory: the files it writes replace a link
// at their names and never write through one, and a link at a temporary
// name is refused. model: a plain model of the test's shape.
static void check_fifos_and_links(const char *model) {
    char fifo[128], enc[128], voc[128], tiny_model[128], sealed[128], cmd[2048], out[4096];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmp_dir);
    snprintf(sealed, sizeof(sealed), "%s/model_sealed.bin", tmp_dir);
    int made = tiny_tokenizer(enc, voc, sizeof(enc), tiny_model, sizeof(tiny_model)) == 0 && mkfifo(fifo, 0600) == 0;
    if (!check(made, "a FIFO, and a tiny tokenizer and a model of its vocab for export_hf")) return;
    struct { const char *what, *args; int rc; } cases[] = {
        {"-i", "-i FIFO -o DIR", 1},
        {"--encoder", "-i TINY --encoder FIFO --vocab VOCB -o DIR", 2},  // the tokenizer's files are flags' files
        {"--vocab", "-i TINY --encoder ENCD --vocab FIFO -o DIR", 2},
        {"--key-file", "-i SEAL --key-file FIFO -o DIR", 2},  // check_sealed's model
        {"--key-file (a plain model)", "-i PLAN --key-file FIFO -o DIR", 2},  // the key file is checked all the same
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char args[1024] = "";
        for (const char *p = cases[k].args; *p != '\0';) {  // the words in capitals are the paths
            const char *word = strncmp(p, "FIFO", 4) == 0 ? fifo : strncmp(p, "TINY", 4) == 0 ? tiny_model
                             : strncmp(p, "ENCD", 4) == 0 ? enc : strncmp(p, "VOCB", 4) == 0 ? voc
                             : strncmp(p, "SEAL", 4) == 0 ? sealed : strncmp(p, "PLAN", 4) == 0 ? model : NULL;
            if (strncmp(p, "DIR", 3) == 0) {
                snprintf(args + strlen(args), sizeof(args) - strlen(args), "%s/hf_fifo%zu", tmp_dir, k);
                p += 3;
            } else if (word != NULL) {
                snprintf(args + strlen(args), sizeof(args) - strlen(args), "%s", word);
                p += 4;
            } else {
                snprintf(args + strlen(args), sizeof(args) - strlen(args), "%c", *p++);
            }
        }
        snprintf(cmd, sizeof(cmd), "timeout -s KILL 10 ./export_hf %s", args);
        int rc = 0;
        double secs = 0.0;
        // called before check(), whose line reads rc
        int refused = test_fifo_refused(cmd, 0, fifo, cases[k].rc, out, sizeof(out), &rc, &secs);
        check(refused, "export_hf %s FIFO: refused at once (exit %d in %.1f s): %.*s", cases[k].what, rc, secs,
              (int)strcspn(out, "\n"), out);
    }

    // links at every name export_hf writes, to files outside -o
    char dir[128], victim[128], path[256], link[256];
    snprintf(dir, sizeof(dir), "%s/hf_links", tmp_dir);
    snprintf(victim, sizeof(victim), "%s/victim.txt", tmp_dir);
    mkdir(dir, 0755);
    test_write_file(victim, "precious\n", 9);
    const char *names[] = {"model.safetensors", "config.json", "vocab.json", "merges.txt", "tokenizer_config.json"};
    int planted = 1;
    for (int k = 0; k < 5; k++) planted &= symlink(victim, test_path(path, sizeof(path), dir, names[k])) == 0;
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s --encoder %s --vocab %s -o %s", tiny_model, enc, voc, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    char *kept = test_read_text(victim);
    int regular = 1;
    struct stat st;
    for (int k = 0; k < 5; k++) regular &= lstat(test_path(path, sizeof(path), dir, names[k]), &st) == 0 && S_ISREG(st.st_mode);
    check(planted && rc == 0 && regular && strcmp(kept, "precious\n") == 0, "-o with links planted at its five file "
          "names: each replaced by export_hf's file, the file they pointed to untouched (exit %d)", rc);
    free(kept);
    // a link at a temporary name: refused in one line, never followed
    snprintf(link, sizeof(link), "%s/model.safetensors.tmp", dir);
    planted = symlink(victim, link) == 0;
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s", model, dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    kept = test_read_text(victim);
    check(planted && rc == 1 && strcmp(kept, "precious\n") == 0 && strstr(out, "model.safetensors.tmp: a symbolic link") != NULL,
          "a link planted at model.safetensors.tmp: refused, not followed (exit %d): %.*s", rc, (int)strcspn(out, "\n"), out);
    free(kept);
}

int main(void) {
    if (test_make_dir(tmp_dir, sizeof(tmp_dir), "/tmp/test_export_XXXXXX") != 0) {
        printf("cannot make a temp dir\n");
        return 1;
    }
    if (access("./export_hf", X_OK) != 0) {
        skip("./export_hf not built (run from the repo root after make)");
        return test_summary();
    }
    size_t n = param_count(&shape);
    float *params = malloc(n * sizeof(float));
    uint64_t x = 42;
    for (size_t i = 0; i < n; i++) {  // values with low bits set, so a bf16 rounding shows
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        params[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 2.0f;
    }
    memset(params + (size_t)shape.V * shape.C, 0, (size_t)(shape.Vp - shape.V) * shape.C * sizeof(float));  // padded rows

    char model[128], model5[128], dir[128], dir16[128], dir5[128], cmd[1024], out[8192], err[256];
    snprintf(model, sizeof(model), "%s/model.bin", tmp_dir);
    snprintf(model5, sizeof(model5), "%s/model_bf16.bin", tmp_dir);
    snprintf(dir, sizeof(dir), "%s/hf", tmp_dir);
    snprintf(dir16, sizeof(dir16), "%s/hf16", tmp_dir);
    snprintf(dir5, sizeof(dir5), "%s/hf5", tmp_dir);
    if (!check(model_save(model, &shape, params, 0, err, sizeof(err)) == 0 && model_save(model5, &shape, params, 1, err, sizeof(err)) == 0,
               "write the test models (%s)", err))
        return test_summary();

    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s", model, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, "no tokenizer files: the model has 300 tokens") != NULL, "export_hf f32 -> exit %d: %.*s", rc,
          (int)strcspn(out, "\n"), out);
    check_export(dir, params, 0);
    check_config_json(dir);

    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s --dtype bf16", model, dir16);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0, "export_hf --dtype bf16 -> exit %d", rc);
    check_export(dir16, params, 1);

    // a bf16 model file in: its values are bf16 already, so f32 out holds them exactly
    float *rounded = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) rounded[i] = round_bf16(params[i]);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s", model5, dir5);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0, "export_hf on a version 5 (bf16) model file -> exit %d", rc);
    check_export(dir5, rounded, 0);

    check_tokenizer_files();
    check_tokenizer_parsed(model);
    check_broken_data_tokenizer();
    check_sealed(params, dir);
    check_plain_key(model, dir);
    check_fifos_and_links(model);

    // errors: one line, the file named
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s/none.bin -o %s", tmp_dir, dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "none.bin: cannot open model file") != NULL, "a missing model -> exit %d: %.*s", rc,
          (int)strcspn(out, "\n"), out);
    FILE *f = fopen(model, "r+b");
    fputc(0, f);  // the magic's low byte
    fclose(f);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s", model, dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 1 && strstr(out, "header field magic") != NULL, "a model file with a bad magic -> exit %d: %.*s", rc,
          (int)strcspn(out, "\n"), out);
    snprintf(cmd, sizeof(cmd), "./export_hf -i %s -o %s --dtype f16", model, dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 2 && strstr(out, "--dtype 'f16'") != NULL, "--dtype f16 -> exit %d (flag error)", rc);

    free(params);
    free(rounded);
    test_remove_dir(tmp_dir);
    return test_summary();
}
