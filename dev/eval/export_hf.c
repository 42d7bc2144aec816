/*
 * export_hf.c: a trained model in Hugging Face's GPT-2 layout, so that
 * `transformers` (GPT2LMHeadModel.from_pretrained(DIR)) and lm-eval load it.
 *
 *   ./export_hf -i out/model_00005000.bin -o out/hf [--dtype f32|bf16]
 *               [--encoder PATH --vocab PATH | --no-tokenizer] [--key-file FILE]
 *
 * In: our model file (llm.c's, version 3 fp32 or 5 bf16: what -o writes at
 * the end of a run and what a checkpoint's model.bin is; read by gpt2.h's
 * model_load). A model the trainer sealed (-enc 2, or a checkpoint of -enc 1)
 * is read with the key of the job that sealed it, --key-file: the trainer's
 * --key-file, or the job.key in its -o directory (checkpoint.h's
 * ckpt_model_load). Out, in the -o directory:
 *   model.safetensors  the 12L + 4 tensors, named as in the Hub's "gpt2"
 *                      checkpoint (GPT2Model's names, which GPT2LMHeadModel
 *                      loads too, tying lm_head to wte)
 *   config.json        GPT2Config: the shape, tanh GELU ("gelu_new"),
 *                      LayerNorm eps 1e-5, tied embeddings
 *   vocab.json, merges.txt, tokenizer_config.json
 *                      the tokenizer: copies of --encoder's encoder.json and
 *                      --vocab's vocab.bpe, parsed first with prepare_data's
 *                      loader (tokenizer.h's bpe_load_files) and refused unless
 *                      they load and hold the model's V tokens, "<|endoftext|>"
 *                      among them; without the flags, GPT-2's files, found
 *                      as prepare_data finds them, for a model of GPT-2's
 *                      50257 tokens
 *
 * The mapping, tensor by tensor (llm.c's name, its shape; HF's name, shape):
 *   wte (Vp, C)               wte.weight (V, C): the padded rows V..Vp-1 are dropped
 *   wpe (maxT, C)             wpe.weight (maxT, C)
 *   ln1w, ln1b (L, C)         h.<l>.ln_1.weight, .bias (C)
 *   qkvw (L, 3C, C)           h.<l>.attn.c_attn.weight (C, 3C): transposed
 *   qkvb (L, 3C)              h.<l>.attn.c_attn.bias (3C)
 *   attprojw (L, C, C)        h.<l>.attn.c_proj.weight (C, C): transposed
 *   attprojb (L, C)           h.<l>.attn.c_proj.bias (C)
 *   ln2w, ln2b (L, C)         h.<l>.ln_2.weight, .bias (C)
 *   fcw (L, 4C, C)            h.<l>.mlp.c_fc.weight (C, 4C): transposed
 *   fcb (L, 4C)               h.<l>.mlp.c_fc.bias (4C)
 *   fcprojw (L, C, 4C)        h.<l>.mlp.c_proj.weight (4C, C): transposed
 *   fcprojb (L, C)            h.<l>.mlp.c_proj.bias (C)
 *   lnfw, lnfb (C)            ln_f.weight, ln_f.bias (C)
 * The four matrices are transposed because HF's GPT-2 keeps them in its
 * Conv1D, which computes x @ W + b with W of shape (in, out), where llm.c's
 * matmul computes x @ W^T + b with W of shape (out, in). q, k and v stay in
 * that order within c_attn, as in both.
 *
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON
 * (name -> dtype, shape, data_offsets [begin, end) into the data; padded with
 * spaces so the data starts 8-byte aligned), then the tensors' bytes, one
 * after the other in the order listed, little-endian, row-major.
 *
 * --key-file is read and checked whenever it is given, the model sealed or
 * not: a plain model is exported as without it, and a note says the key was
 * not needed.
 *
 * Exit status: 0 done, 1 a file could not be read or written (a sealed model
 * under another key too, or GPT-2's tokenizer files found in the data
 * directory but broken), 2 bad flags (a sealed model and no --key-file, a
 * key file that is not one, said in the trainers' form: "export_hf: flag
 * --key-file (the key of the job that sealed the model): k: No such file or
 * directory"; an --encoder or --vocab file that does not load or is not the
 * model's vocabulary, in the same form). Nothing is written before the model,
 * the key and the tokenizer's files are checked.
 */
#define _GNU_SOURCE  // strdup
#include "llm3d/checkpoint.h"  // ckpt_model_load
#include "llm3d/gpt2.h"        // GPT2Config, param_count
#include "llm3d/tokenizer.h"   // bpe_find_files, bpe_load_files

#include <sys/stat.h>
#include <unistd.h>

#define HF_NAME_BYTES 48

typedef struct {
    char name[HF_NAME_BYTES];
    int tensor, layer;         // the llm.c tensor (P_*) and layer it comes from
    int rank;
    size_t shape[2];           // HF's shape
    int transpose;             // the llm.c tensor is (shape[1], shape[0])
    size_t offset;             // into the data, in bytes
} HfTensor;

typedef struct {
    const char *in, *out_dir, *encoder, *vocab, *key_file;
    int bf16, no_tokenizer;
} ExportOptions;

static void usage(FILE *f) {
    fprintf(f,
            "usage: export_hf -i MODEL.bin -o DIR [options]\n"
            "  -i FILE          model file: llm.c's version 3 (fp32) or 5 (bf16), as the trainers write\n"
            "  -o DIR           output directory, created if missing: model.safetensors, config.json,\n"
            "                   and the tokenizer (vocab.json, merges.txt, tokenizer_config.json)\n"
            "  --dtype f32|bf16 dtype of the tensors written (default f32; bf16 rounds to nearest even)\n"
            "  --encoder PATH   encoder.json  } checked to load and hold the model's V tokens, then copied as\n"
            "  --vocab PATH     vocab.bpe     } vocab.json and merges.txt; default for a model of 50257 tokens:\n"
            "                   GPT-2's, in $LLM3D_DATA/gpt2/, else ../shared/data/gpt2/\n"
            "  --no-tokenizer   write no tokenizer files\n"
            "  --key-file FILE  the key of the job that sealed MODEL.bin (-enc): the trainer's --key-file,\n"
            "                   or the job.key in its -o directory (checked whenever given; used when MODEL.bin is sealed)\n");
}

static __attribute__((format(printf, 1, 2))) void usage_error(const char *fmt, ...) {
    fprintf(stderr, "export_hf: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see -h)\n");
    exit(2);
}

static void parse_options(ExportOptions *o, int argc, char **argv) {
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "-h") == 0 || strcmp(flag, "--help") == 0) { usage(stdout); exit(0); }
        if (strcmp(flag, "--no-tokenizer") == 0) { o->no_tokenizer = 1; continue; }
        int known = strcmp(flag, "-i") == 0 || strcmp(flag, "-o") == 0 || strcmp(flag, "--dtype") == 0 ||
                    strcmp(flag, "--encoder") == 0 || strcmp(flag, "--vocab") == 0 || strcmp(flag, "--key-file") == 0;
        if (!known) usage_error("unknown flag '%s'", flag);
        if (i + 1 >= argc || argv[i + 1][0] == '\0') usage_error("%s needs a value", flag);
        const char *value = argv[++i];
        if (strcmp(flag, "-i") == 0) o->in = value;
        else if (strcmp(flag, "-o") == 0) o->out_dir = value;
        else if (strcmp(flag, "--encoder") == 0) o->encoder = value;
        else if (strcmp(flag, "--vocab") == 0) o->vocab = value;
        else if (strcmp(flag, "--key-file") == 0) o->key_file = value;
        else if (strcmp(value, "f32") == 0) o->bf16 = 0;
        else if (strcmp(value, "bf16") == 0) o->bf16 = 1;
        else usage_error("--dtype '%s': want f32 or bf16", value);
    }
    if (o->in == NULL) usage_error("no model: give -i FILE");
    if (o->out_dir == NULL) usage_error("no output directory: give -o DIR");
    if ((o->encoder == NULL) != (o->vocab == NULL)) usage_error("%s given alone: give --encoder and --vocab together", o->encoder ? "--encoder" : "--vocab");
    if (o->no_tokenizer && o->encoder != NULL) usage_error("--no-tokenizer and --encoder/--vocab exclude each other");
}

// ----------------------------------------------------------------------------
// the tensors, in HF's names and shapes

static int hf_add(HfTensor *list, int n, const char *name, int tensor, int layer, size_t rows, size_t cols, int transpose) {
    HfTensor *h = &list[n];
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->tensor = tensor;
    h->layer = layer;
    h->rank = cols == 0 ? 1 : 2;
    h->shape[0] = rows;
    h->shape[1] = cols;
    h->transpose = transpose;
    return n + 1;
}

// hf_tensors: the 12L + 4 tensors in the order they are written; their count
static int hf_tensors(const GPT2Config *c, HfTensor *list) {
    size_t C = (size_t)c->C;
    int n = 0;
    n = hf_add(list, n, "wte.weight", P_WTE, 0, (size_t)c->V, C, 0);
    n = hf_add(list, n, "wpe.weight", P_WPE, 0, (size_t)c->maxT, C, 0);
    for (int l = 0; l < c->L; l++) {
        struct { const char *name; int tensor; size_t rows, cols; int transpose; } per_layer[12] = {
            {"ln_1.weight", P_LN1W, C, 0, 0},          {"ln_1.bias", P_LN1B, C, 0, 0},
            {"attn.c_attn.weight", P_QKVW, C, 3 * C, 1}, {"attn.c_attn.bias", P_QKVB, 3 * C, 0, 0},
            {"attn.c_proj.weight", P_ATTPROJW, C, C, 1}, {"attn.c_proj.bias", P_ATTPROJB, C, 0, 0},
            {"ln_2.weight", P_LN2W, C, 0, 0},          {"ln_2.bias", P_LN2B, C, 0, 0},
            {"mlp.c_fc.weight", P_FCW, C, 4 * C, 1},   {"mlp.c_fc.bias", P_FCB, 4 * C, 0, 0},
            {"mlp.c_proj.weight", P_FCPROJW, 4 * C, C, 1}, {"mlp.c_proj.bias", P_FCPROJB, C, 0, 0},
        };
        for (int k = 0; k < 12; k++) {
            char name[HF_NAME_BYTES];
            snprintf(name, sizeof(name), "h.%d.%s", l, per_layer[k].name);
            n = hf_add(list, n, name, per_layer[k].tensor, l, per_layer[k].rows, per_layer[k].cols, per_layer[k].transpose);
        }
    }
    n = hf_add(list, n, "ln_f.weight", P_LNFW, 0, C, 0, 0);
    n = hf_add(list, n, "ln_f.bias", P_LNFB, 0, C, 0, 0);
    return n;
}

static size_t hf_elements(const HfTensor *h) { return h->shape[0] * (h->rank == 2 ? h->shape[1] : 1); }

// hf_values: tensor h's elements in HF's order, from the model's parameters
static void hf_values(const GPT2Config *c, const float *params, const HfTensor *h, float *out) {
    size_t sizes[NUM_PARAM_TENSORS], offset = 0;
    param_sizes(c, sizes);
    for (int t = 0; t < h->tensor; t++) offset += sizes[t];
    int layered = h->tensor != P_WTE && h->tensor != P_WPE && h->tensor != P_LNFW && h->tensor != P_LNFB;
    const float *src = params + offset + (layered ? (size_t)h->layer * (sizes[h->tensor] / (size_t)c->L) : 0);
    size_t n = hf_elements(h);
    if (!h->transpose) {  // wte's first V rows are its first V*C elements: the padding is left behind
        memcpy(out, src, n * sizeof(float));
        return;
    }
    size_t rows = h->shape[0], cols = h->shape[1];  // HF's (in, out); src is (out, in)
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) out[i * cols + j] = src[j * rows + i];
}

// ----------------------------------------------------------------------------
// writing

static void put_u64le(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}

// safetensors_header: the JSON header, padded with spaces to a multiple of 8;
// sets each tensor's offset. Returns a malloc'd string, NULL if out of memory.
static char *safetensors_header(HfTensor *list, int n, int bf16, size_t *len) {
    size_t cap = 256 + (size_t)n * 256, used = 0, offset = 0, elem = bf16 ? 2 : 4;
    char *json = malloc(cap);
    if (json == NULL) return NULL;
    used += (size_t)snprintf(json + used, cap - used, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int k = 0; k < n; k++) {
        HfTensor *h = &list[k];
        h->offset = offset;
        size_t bytes = hf_elements(h) * elem;
        used += (size_t)snprintf(json + used, cap - used, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%zu", h->name, bf16 ? "BF16" : "F32", h->shape[0]);
        if (h->rank == 2) used += (size_t)snprintf(json + used, cap - used, ",%zu", h->shape[1]);
        used += (size_t)snprintf(json + used, cap - used, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    used += (size_t)snprintf(json + used, cap - used, "}");
    while (used % 8 != 0) json[used++] = ' ';
    json[used] = '\0';
    *len = used;
    return json;
}

// write_safetensors: DIR/model.safetensors, through a temporary name. 0 ok, -1 with err set.
static int write_safetensors(const char *path, const GPT2Config *c, const float *params, int bf16, char *err, size_t errlen) {
    HfTensor *list = malloc((size_t)(12 * c->L + 4) * sizeof(HfTensor));
    if (list == NULL) { snprintf(err, errlen, "out of memory"); return -1; }
    int n = hf_tensors(c, list);
    size_t header_len = 0, largest = 0;
    char *header = safetensors_header(list, n, bf16, &header_len);
    for (int k = 0; k < n; k++) largest = hf_elements(&list[k]) > largest ? hf_elements(&list[k]) : largest;
    float *values = malloc(largest * sizeof(float));
    uint16_t *halves = malloc(largest * sizeof(uint16_t));
    char tmp[4200];
    FILE *f = NULL;
    if (header == NULL || values == NULL || halves == NULL) snprintf(err, errlen, "out of memory");
    else f = fopen_tmp(path, tmp, sizeof(tmp), err, errlen);  // never written through a link planted in -o
    int ok = f != NULL;
    unsigned char size_bytes[8];
    put_u64le(size_bytes, header_len);
    ok = ok && fwrite(size_bytes, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len;
    for (int k = 0; ok && k < n; k++) {
        size_t count = hf_elements(&list[k]);
        hf_values(c, params, &list[k], values);
        if (bf16) {
            for (size_t i = 0; i < count; i++) halves[i] = float_to_bf16(values[i]);
            ok = fwrite(halves, 2, count, f) == count;  // little-endian hosts only: main checks
        } else {
            ok = fwrite(values, 4, count, f) == count;
        }
    }
    if (f != NULL) ok = fclose_rename(f, tmp, path, err, errlen) == 0;  // a failed fwrite shows in its ferror
    free(list);
    free(header);
    free(values);
    free(halves);
    return ok ? 0 : -1;
}

// write_text_file: PATH holding text, through a temporary name
static int write_text_file(const char *path, const char *text, char *err, size_t errlen) {
    return write_file(path, text, strlen(text), err, errlen);
}

// copy_file: the file at from (a regular file: a FIFO is refused, not waited
// on) copied to to, through a temporary name
static int copy_file(const char *from, const char *to, char *err, size_t errlen) {
    FILE *in = fopen_regular(from, "", err, errlen);
    if (in == NULL) return -1;
    char tmp[4200], buf[1 << 16];
    FILE *out = fopen_tmp(to, tmp, sizeof(tmp), err, errlen);
    if (out == NULL) {
        fclose(in);
        return -1;
    }
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), in)) > 0 && fwrite(buf, 1, got, out) == got) {}
    int bad = ferror(in);
    fclose(in);
    if (bad) {
        fclose_abandon(out, tmp);
        return errorf(err, errlen, "%s: read error", from);
    }
    return fclose_rename(out, tmp, to, err, errlen);
}

// write_config: DIR/config.json, GPT2Config's fields for this shape
static int write_config(const char *path, const GPT2Config *c, int bf16, int eot, char *err, size_t errlen) {
    char json[2048];
    snprintf(json, sizeof(json),
             "{\n"
             "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
             "  \"model_type\": \"gpt2\",\n"
             "  \"vocab_size\": %d,\n"
             "  \"n_positions\": %d,\n"
             "  \"n_ctx\": %d,\n"
             "  \"n_embd\": %d,\n"
             "  \"n_layer\": %d,\n"
             "  \"n_head\": %d,\n"
             "  \"n_inner\": null,\n"
             "  \"activation_function\": \"gelu_new\",\n"
             "  \"layer_norm_epsilon\": 1e-05,\n"
             "  \"initializer_range\": 0.02,\n"
             "  \"resid_pdrop\": 0.0,\n"
             "  \"embd_pdrop\": 0.0,\n"
             "  \"attn_pdrop\": 0.0,\n"
             "  \"scale_attn_weights\": true,\n"
             "  \"tie_word_embeddings\": true,\n"
             "  \"bos_token_id\": %d,\n"
             "  \"eos_token_id\": %d,\n"
             "  \"torch_dtype\": \"%s\"\n"
             "}\n",
             c->V, c->maxT, c->maxT, c->C, c->L, c->NH, eot, eot, bf16 ? "bfloat16" : "float32");
    return write_text_file(path, json, err, errlen);
}

// tokenizer_files: the encoder.json and vocab.bpe that become vocab.json and
// merges.txt, parsed with prepare_data's loader (tokenizer.h's bpe_load_files)
// before anything is written, so that a truncated or broken file is refused
// rather than copied into a tokenizer that transformers then fails on, and a
// vocabulary that is not the model's (V tokens, "<|endoftext|>" among them:
// tokenizer_config.json names it) is refused too. --encoder and --vocab may
// give any such vocabulary; without them GPT-2's files are looked for, and
// only for a model of GPT-2's 50257 tokens. Returns 1 with encoder, vocab
// (len bytes each) and *eot set; 0 when there are none to write (a line says
// why); -2 a flag's file refused, -1 a file found in the data directory
// refused, with err set.
static int tokenizer_files(const ExportOptions *o, const GPT2Config *c, char *encoder, char *vocab, size_t len, int *eot,
                           char *err, size_t errlen) {
    if (o->no_tokenizer) return 0;
    int given = o->encoder != NULL;
    if (given) {
        snprintf(encoder, len, "%s", o->encoder);
        snprintf(vocab, len, "%s", o->vocab);
    } else if (c->V != 50257) {
        printf("export_hf: no tokenizer files: the model has %d tokens, not GPT-2's 50257 (give --encoder and --vocab "
               "of its own vocabulary)\n", c->V);
        return 0;
    } else if (bpe_find_files(encoder, vocab, len) != 0) {
        printf("export_hf: no tokenizer files: no gpt2/encoder.json and vocab.bpe in $LLM3D_DATA or ../shared/data "
               "(give --encoder and --vocab)\n");
        return 0;
    }
    Bpe b;
    int failed = 0;
    int rc = bpe_load_files(&b, encoder, vocab, &failed, err, errlen);
    int about_vocab = rc != 0 && failed == 1;
    if (rc == 0) {
        if (b.vocab_size != c->V)
            rc = errorf(err, errlen, "%s: %d tokens, but the model has V = %d", encoder, b.vocab_size, c->V);
        else if (b.eot < 0)
            rc = errorf(err, errlen, "%s: no \"%s\" token, which tokenizer_config.json names", encoder, BPE_EOT_TEXT);
        *eot = b.eot;
        bpe_free(&b);
    }
    if (rc == 0) return 1;
    if (given) {
        flag_file_error(err, errlen, about_vocab ? "--vocab" : "--encoder",
                        about_vocab ? "the tokenizer's merges, for merges.txt" : "the tokenizer's vocabulary, for vocab.json", NULL);
        return -2;
    }
    char why[8192];
    snprintf(why, sizeof(why), "%s", err);
    errorf(err, errlen, "%s (GPT-2's tokenizer files, found in $LLM3D_DATA or ../shared/data: replace them, give "
           "--encoder and --vocab, or --no-tokenizer)", why);
    return -1;
}

// write_tokenizer: the files tokenizer_files chose, for GPT2Tokenizer(Fast):
// copied byte for byte, plus tokenizer_config.json. 0, or -1 with err set.
static int write_tokenizer(const ExportOptions *o, const GPT2Config *c, const char *encoder, const char *vocab,
                           char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/vocab.json", o->out_dir);
    if (copy_file(encoder, path, err, errlen) != 0) return -1;
    snprintf(path, sizeof(path), "%s/merges.txt", o->out_dir);
    if (copy_file(vocab, path, err, errlen) != 0) return -1;
    char json[512];
    snprintf(json, sizeof(json),
             "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": %d,\n  \"bos_token\": \"<|endoftext|>\",\n"
             "  \"eos_token\": \"<|endoftext|>\",\n  \"unk_token\": \"<|endoftext|>\",\n  \"add_prefix_space\": false\n}\n", c->maxT);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", o->out_dir);
    return write_text_file(path, json, err, errlen);
}

// check_key_file: --key-file, when given, read and checked whether or not
// the model turns out to be sealed: a user who passes the key to every
// export (not knowing which models were sealed) learns of a wrong path or a
// file that is no key here too, not first on the day a sealed model needs
// it. Exits 2 with the trainers' line for a key file that is not one.
static void check_key_file(const ExportOptions *o) {
    if (o->key_file == NULL) return;
    uint8_t key[32];
    char err[4096];
    if (key_read_file(o->key_file, key, err, sizeof(err)) != 0) {
        flag_file_error(err, sizeof(err), "--key-file", "the key of the job that sealed the model", "key file");
        fprintf(stderr, "export_hf: %s\n", err);
        exit(2);
    }
    secure_wipe(key, sizeof(key));
}

int main(int argc, char **argv) {
    ExportOptions o;
    parse_options(&o, argc, argv);
    uint16_t probe = 1;
    if (*(unsigned char *)&probe != 1) { fprintf(stderr, "export_hf: this host is big-endian; safetensors wants little-endian\n"); return 1; }
    check_key_file(&o);
    char err[8192];
    GPT2Config c;
    int no_key, sealed = 0;
    float *params = ckpt_model_load(o.in, o.key_file, &c, &no_key, &sealed, err, sizeof(err));
    if (params == NULL) {  // a sealed model without a key from --key-file is a flag error
        // with --key-file given, no_key says the key file could not be read
        if (no_key && o.key_file != NULL)
            flag_file_error(err, sizeof(err), "--key-file", "the key of the job that sealed the model", "key file");
        fprintf(stderr, "export_hf: %s\n", err);
        return no_key ? 2 : 1;
    }
    if (o.key_file != NULL && !sealed)
        printf("note: flag --key-file %s: %s is not sealed, so its key is not needed (the key file was read: it is "
               "one)\n", o.key_file, o.in);
    // the tokenizer's files are checked before anything is written
    char encoder[4096], vocab[4096];
    int eot = c.V == 50257 ? 50256 : 0;  // without a tokenizer: GPT-2's <|endoftext|>; 0 for the byte-level vocab
    int tokenizer = tokenizer_files(&o, &c, encoder, vocab, sizeof(encoder), &eot, err, sizeof(err));
    if (tokenizer < 0) {
        fprintf(stderr, "export_hf: %s\n", err);
        free(params);
        return tokenizer == -2 ? 2 : 1;
    }
    struct stat st;
    if (stat(o.out_dir, &st) != 0 && mkdir(o.out_dir, 0755) != 0) {
        fprintf(stderr, "export_hf: -o %s: cannot create directory: %s\n", o.out_dir, strerror(errno));
        free(params);
        return 1;
    }
    char st_path[4200], config_path[4200];
    snprintf(st_path, sizeof(st_path), "%s/model.safetensors", o.out_dir);
    snprintf(config_path, sizeof(config_path), "%s/config.json", o.out_dir);
    int rc = write_safetensors(st_path, &c, params, o.bf16, err, sizeof(err));
    if (rc == 0) rc = write_config(config_path, &c, o.bf16, eot, err, sizeof(err));
    if (rc == 0 && tokenizer) rc = write_tokenizer(&o, &c, encoder, vocab, err, sizeof(err));
    free(params);
    if (rc != 0) { fprintf(stderr, "export_hf: %s\n", err); return 1; }
    printf("export_hf: %s: GPT-2 L=%d NH=%d C=%d V=%d maxT=%d, %zu parameters (%s)\n", o.in, c.L, c.NH, c.C, c.V, c.maxT,
           param_count(&c) - (size_t)(c.Vp - c.V) * c.C, o.bf16 ? "bf16" : "f32");
    printf("export_hf: wrote %s, %s%s\n", st_path, config_path, tokenizer ? ", vocab.json, merges.txt, tokenizer_config.json" : "");
    printf("export_hf: load it with transformers.GPT2LMHeadModel.from_pretrained(\"%s\")\n", o.out_dir);
    return 0;
}
