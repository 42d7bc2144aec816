/*
 * flags.h: the trainers' command line, one table of flags (option_specs)
 * from which the usage, the parsing and the range checks are all made.
 *
 * defines:
 *   Options              every flag's value (SCHED_* for -k, PS_* for -ps, PI_* for -pi,
 *                        GP_* for -gp)
 *   OptionSpec, option_specs, NUM_OPTIONS
 *                        the table: each flag's type, field, range, help, and
 *                        what llm.c means by it where that differs
 *   options_defaults     the values before any flag
 *   options_usage        -h: every flag, what it does and its default
 *   options_parse        argv into Options; one line into err on any problem
 *   options_mark, options_marks_judge
 *                        every flag's value as a word, and the verdict on the
 *                        ranks' words: the flags a job's ranks must share
 *   TrainerBuild, options_check_build
 *                        llm.c's -a -f -w -ge -nm, -ps, -sp and -ic checked
 *                        against what a trainer build does
 *
 * gpt2.h reads the flags into the model's shape and the batch
 * (options_descriptor, batch_accum) and the learning rate (lr_at_step).
 * Errors follow errors.h.
 */
#ifndef LLM3D_FLAGS_H
#define LLM3D_FLAGS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/errors.h"

// ---------------------------------------------------------------------------
// the command line: one table, so usage, parsing and range checks agree.
// It holds every flag of llm.c's train_gpt2.cu too: each means here what it
// means there, or is refused with one line saying what differs
// (doc/llmc.md has them all).

enum { OPT_INT, OPT_FLOAT, OPT_STR, OPT_CHOICE, OPT_REFUSED };
enum { SCHED_COSINE, SCHED_LINEAR, SCHED_CONSTANT, SCHED_WSD };
enum { PS_GPIPE, PS_1F1B, PS_INTERLEAVED, PS_ZBH1, PS_ZBV };  // pipeline.h's PipeSchedule, in its order
enum { PI_MPI, PI_TCP, PI_FS };  // llm.c's -pi: how the ranks of an outside launch meet (launcher.h)
enum { GP_WARN, GP_SKIP, GP_STOP };  // -gp: what a step with a rank's outlying gradient norm gets (watch.h)

typedef struct {
    const char *train_pattern, *val_pattern, *init, *out_dir, *log_file, *tokenizer;
    int gpu_stats_every;           // -lg N (an integer): llm.c's GPU stats every N steps (0 or below = off)
    int init_vocab, init_maxT, init_channels;
    int B, T, total_batch, steps;
    float lr, final_frac, weight_decay, beta1, beta2, eps, grad_clip;
    int warmup, schedule;
    float skip_loss_z, skip_norm_z;  // -sl -sg: skip an update whose loss / grad norm z-score is above (0 = off)
    int shuffle, seed;
    int val_every, val_batches, sample_every, gen_tokens;
    int hellaswag;                 // -h 1: HellaSwag at every evaluation
    const char *hellaswag_file;    // -hf, NULL: HS_DEFAULT_FILE of hellaswag.h
    int ckpt_every, ckpt_keep, resume, resume_step;
    int encrypt;                   // -enc: 1 checkpoints sealed (AES-256-GCM), 2 the final model too
    int np, tp, pp, zero, microbatches, pipe_schedule, check_every;
    int sp;                        // -sp 1: sequence parallelism with tp (trainer.h's check_model checks it)
    int pipe_chunks;               // -pv: chunks of layers per pipeline rank (-ps interleaved)
    int watch_every;               // -wr: each rank's compute and wait times compared every N steps (0 = off)
    int check_collectives;         // -ic: 1 every collective checked with keyed sketches
    int grad_policy;               // -gp: GP_*
    float timeout;
    const char *fault, *rendezvous, *key_file;
    int threads;
    int host_backend;              // -hb (train_gpt2cu): 0 its rule, 1 host mode, 2 NCCL where ranks share a GPU
    // llm.c's multi-node flags: the world and rank where no launcher's variables say them, and how the
    // ranks meet without --rendezvous (launcher.h's LaunchMeet)
    int llmc_procs, llmc_rank, llmc_gpus;  // -pn -pr -pg (0 and -1: not given)
    int llmc_init;                         // -pi (-pm): PI_*
    const char *llmc_fs_path;              // -pf
    const char *llmc_server;               // -ps when its value is an IPv4 address, not a schedule
    int recompute;                 // -r (the GPU trainer takes it out of argv first)
    // llm.c's switches for what a build here does one way: options_check_build
    int overfit_batch, tf32, master_weights, gelu_fusion, major_every;  // -a -f -w -ge -nm
} Options;

typedef struct {
    const char *flag;
    int type;
    size_t offset;       // into Options
    double min, max;     // for OPT_INT and OPT_FLOAT
    const char *choices; // for OPT_CHOICE: comma separated, value = index
    const char *help;
    const char *llmc;    // where llm.c's flag of this name means something else: what, added to its errors
    const char *dflt;    // the default in words, where its value alone does not say it (-h prints it)
} OptionSpec;


static const OptionSpec option_specs[] = {
    {"-i", OPT_STR, offsetof(Options, train_pattern), 0, 0, NULL, "train shards (glob)", NULL, NULL},
    {"-j", OPT_STR, offsetof(Options, val_pattern), 0, 0, NULL, "val shards (glob)", NULL, NULL},
    {"-e", OPT_STR, offsetof(Options, init), 0, 0, NULL,
     "init: model .bin file, or descriptor dN or gpt2:dN (d12 = GPT-2 124M; llm.c's shapes)", NULL, NULL},
    {"-ev", OPT_INT, offsetof(Options, init_vocab), 0, 1 << 24, NULL,
     "vocab size for a dN init (0 = GPT-2's 50257; with a model file, what its header says)", NULL, NULL},
    {"-et", OPT_INT, offsetof(Options, init_maxT), 0, 1 << 20, NULL,
     "max sequence length for a dN init (0 = GPT-2's 1024; with a model file, what its header says)", NULL, NULL},
    {"-ec", OPT_INT, offsetof(Options, init_channels), 0, 1 << 16, NULL,
     "channels for a dN init (0 = GPT-2's; with a model file, what its header says)", NULL, NULL},
    {"-o", OPT_STR, offsetof(Options, out_dir), 0, 0, NULL,
     "output dir for the log, checkpoints and the final model", NULL, "none"},
    {"-lg", OPT_STR, offsetof(Options, log_file), 0, 0, NULL,
     "JSON-lines log file; told apart by its value, -lg N (an integer) is llm.c's: GPU stats every N steps "
     "(train_gpt2cu, with NVML; a log file named as a number: -lg ./N)",
     "llm.c's -lg N prints GPU stats every N steps", "<-o>/log.jsonl, none without -o; GPU stats off"},
    {"-tk", OPT_STR, offsetof(Options, tokenizer), 0, 0, NULL, "tokenizer .bin for printing samples", NULL, "none"},
    {"-b", OPT_INT, offsetof(Options, B), 1, 1 << 16, NULL, "micro-batch size B per data-parallel rank", NULL, NULL},
    {"-t", OPT_INT, offsetof(Options, T), 1, 1 << 20, NULL, "sequence length T", NULL, NULL},
    {"-d", OPT_INT, offsetof(Options, total_batch), -1, 1 << 30, NULL, "total batch in tokens (-1 = B*T*dp*mb)", NULL, NULL},
    {"-x", OPT_INT, offsetof(Options, steps), -1, 1 << 30, NULL,
     "optimizer steps (-1 = one epoch; 0 = evaluate only, as llm.c: val loss, -h, -s; no model or checkpoint written)",
     NULL, NULL},
    {"-l", OPT_FLOAT, offsetof(Options, lr), 0, 10, NULL, "peak learning rate", NULL, NULL},
    {"-u", OPT_INT, offsetof(Options, warmup), 0, 1 << 30, NULL, "warmup steps (linear, from lr/u)", NULL, NULL},
    {"-q", OPT_FLOAT, offsetof(Options, final_frac), 0, 1, NULL, "final lr as a fraction of the peak", NULL, NULL},
    {"-k", OPT_CHOICE, offsetof(Options, schedule), 0, 0, "cosine,linear,constant,wsd",
     "lr schedule (llm.c's: constant has no warmup, wsd decays the last 20% as 1 - sqrt)", NULL, NULL},
    {"-c", OPT_FLOAT, offsetof(Options, weight_decay), 0, 10, NULL, "AdamW weight decay (2-D weights only)", NULL, NULL},
    // the ranges hold their floats too: 0.9999999 is a float below 1 (a beta
    // of 1 divides by 1 - 1^t = 0), and no value from 1e-30 up rounds to 0
    {"-b1", OPT_FLOAT, offsetof(Options, beta1), 0, 0.9999999, NULL, "AdamW beta1 (below 1)", NULL, NULL},
    {"-b2", OPT_FLOAT, offsetof(Options, beta2), 0, 0.9999999, NULL, "AdamW beta2 (below 1)", NULL, NULL},
    {"-ep", OPT_FLOAT, offsetof(Options, eps), 1e-30, 1, NULL,
     "AdamW epsilon (above 0: the untrained padded rows' update is 0 / epsilon)", NULL, NULL},
    {"-gc", OPT_FLOAT, offsetof(Options, grad_clip), 0, 1e9, NULL, "clip the global grad norm to this (0 = off)", NULL, NULL},
    {"-sl", OPT_FLOAT, offsetof(Options, skip_loss_z), 0, 1e9, NULL,
     "skip an update whose loss is more than this many std above the last 128 steps' mean (0 = off)", NULL, NULL},
    {"-sg", OPT_FLOAT, offsetof(Options, skip_norm_z), 0, 1e9, NULL,
     "skip an update whose grad norm is more than this many std above the last 128 steps' mean (0 = off)", NULL, NULL},
    {"-sh", OPT_INT, offsetof(Options, shuffle), 0, 1, NULL, "shuffle the training data (0/1)", NULL, NULL},
    {"-sd", OPT_INT, offsetof(Options, seed), 0, 2147483647, NULL, "seed (init, shuffle, sampling)", NULL, NULL},
    {"-v", OPT_INT, offsetof(Options, val_every), 0, 1 << 30, NULL,
     "evaluate every N steps and after the last (0 = never)", NULL, NULL},
    {"-m", OPT_INT, offsetof(Options, val_batches), -1, 1 << 30, NULL,
     "val batches per data-parallel rank per evaluation, at most the split's (-1 = the whole split)", NULL, NULL},
    {"-h", OPT_INT, offsetof(Options, hellaswag), 0, 1, NULL,
     "HellaSwag accuracy at every evaluation after step 0 and after the last (0/1; -h alone or --help: this help)", NULL, NULL},
    {"-hf", OPT_STR, offsetof(Options, hellaswag_file), 0, 0, NULL,
     "HellaSwag file, llm.c's eval format (the default is skipped when missing)", NULL, "dev/data/hellaswag/hellaswag_val.bin"},
    {"-s", OPT_INT, offsetof(Options, sample_every), 0, 1 << 30, NULL,
     "sample every N steps and after the last (0 = never; needs -tk and one rank)", NULL, NULL},
    {"-g", OPT_INT, offsetof(Options, gen_tokens), 1, 1 << 20, NULL, "sample length: tokens, the first one EOT", NULL, NULL},
    {"-n", OPT_INT, offsetof(Options, ckpt_every), 0, 1 << 30, NULL,
     "checkpoint into -o every N steps and at the end (0 = off)", NULL, NULL},
    {"-nk", OPT_INT, offsetof(Options, ckpt_keep), 0, 1 << 30, NULL, "checkpoints to keep, the newest (0 = all)", NULL, NULL},
    {"-nm", OPT_INT, offsetof(Options, major_every), 0, 1 << 30, NULL,
     "llm.c's major checkpoints: 0 only here (-nk 0 keeps them all)", NULL, NULL},
    {"-y", OPT_INT, offsetof(Options, resume), 0, 1, NULL,
     "resume from the latest checkpoint in -o (0/1; none yet: start afresh)", NULL, NULL},
    {"-ys", OPT_INT, offsetof(Options, resume_step), -1, 1 << 30, NULL,
     "resume from the checkpoint of this step in -o (-1 = off)", NULL, NULL},
    {"-enc", OPT_INT, offsetof(Options, encrypt), 0, 2, NULL,
     "encrypt at rest (AES-256-GCM, under the checkpoint key): 1 checkpoints, 2 the final model too (0 = off; "
     "a resume reads either)", NULL, NULL},
    {"-np", OPT_INT, offsetof(Options, np), 1, 256, NULL, "ranks (processes)", NULL, NULL},
    {"-tp", OPT_INT, offsetof(Options, tp), 1, 256, NULL, "tensor-parallel size", NULL, NULL},
    {"-pp", OPT_INT, offsetof(Options, pp), 1, 256, NULL, "pipeline stages",
     "llm.c's usage lists -pp as the fs path of its NCCL init, which its parser reads as -pf", NULL},
    {"-z", OPT_INT, offsetof(Options, zero), 0, 3, NULL, "ZeRO stage 0-3", NULL, NULL},
    {"-sp", OPT_INT, offsetof(Options, sp), 0, 1, NULL,
     "sequence parallelism with -tp above 1: the LayerNorms, the residual stream and the embeddings' output hold "
     "B*T/tp of the positions on each tp rank (0/1)", NULL, NULL},
    {"-mb", OPT_INT, offsetof(Options, microbatches), 1, 1 << 16, NULL, "micro-batches per pipeline step", NULL, NULL},
    {"-ps", OPT_CHOICE, offsetof(Options, pipe_schedule), 0, 0, "gpipe,1f1b,interleaved,zbh1,zbv",
     "pipeline schedule (interleaved: -pv chunks per rank; zbh1, zbv: the backward split in B and W); or, an IPv4 address[:port] instead of a schedule's name, llm.c's server for -pi tcp",
     "llm.c's -ps is the server address of its -pi tcp: an IPv4 address, which is taken as such here", NULL},
    {"-pv", OPT_INT, offsetof(Options, pipe_chunks), 1, 8, NULL,
     "chunks of layers per pipeline rank, for -ps interleaved (2 or more there; zbv holds 2 of itself)", NULL, NULL},
    {"-to", OPT_FLOAT, offsetof(Options, timeout), 0.1, 3600, NULL, "seconds any wait between ranks may take", NULL, NULL},
    {"-ck", OPT_INT, offsetof(Options, check_every), 0, 1 << 30, NULL,
     "data-parallel consistency check every K steps (0 = off)", NULL, NULL},
    {"-wr", OPT_INT, offsetof(Options, watch_every), 0, 1 << 30, NULL,
     "watch report every N steps: a line and a log field for a straggler or a rank that waits unusually (0 = off)",
     NULL, NULL},
    {"-ic", OPT_INT, offsetof(Options, check_collectives), 0, 1, NULL,
     "checked collectives: keyed sketches of each rank's part of every all-reduce, reduce-scatter and all-gather, "
     "checked after it; a failure ends the job naming the collective and the rank (0/1; the CPU trainer; off by "
     "default: some 2% of a d12 step on 2 ranks)", NULL, NULL},
    {"-gp", OPT_CHOICE, offsetof(Options, grad_policy), 0, 0, "warn,skip,stop",
     "a data-parallel rank whose own gradient norm is far above its peers' (poisoned?): warn, skip the step's "
     "update, or stop the job", NULL, NULL},
    {"-fault", OPT_STR, offsetof(Options, fault), 0, 0, NULL,
     "fault injection KIND:RANK:STEP (tamper, replay, kill, stall, slow, drift, corrupt, corrupt-low, poison, "
     "corrupt-sum)", NULL,
     "none"},
    {"--rendezvous", OPT_STR, offsetof(Options, rendezvous), 0, 0, NULL,
     "unix:PATH or tcp:HOST:PORT, for ranks started by mpirun, srun or torchrun", NULL, "none"},
    {"--key-file", OPT_STR, offsetof(Options, key_file), 0, 0, NULL,
     "job key file (mode 0600), the same for every rank; also the key of encrypted shards", NULL, "a fresh key per launch; checkpoints: <-o>/job.key"},
    {"-th", OPT_INT, offsetof(Options, threads), 0, 1024, NULL, "OpenMP threads per rank (0 = the cores / ranks)", NULL, NULL},
    {"-hb", OPT_INT, offsetof(Options, host_backend), 0, 2, NULL,
     "train_gpt2cu: 1 = ranks talk through the host backend, not NCCL (ranks sharing a GPU do by default); "
     "2 = NCCL even where ranks share a GPU, to verify it (slow)", NULL, NULL},
    {"-r", OPT_INT, offsetof(Options, recompute), 0, 1, NULL,
     "recompute GELU in the backward (0/1; the CPU trainer keeps every activation either way)",
     "llm.c's -r 2 also recomputes LayerNorm, which this trainer does not", NULL},
    {"-ge", OPT_INT, offsetof(Options, gelu_fusion), -1, 2, NULL,
     "GELU fused into the matmuls: 0 none, 1 forward, 2 both (-1 = as built: bf16 GPU 2, else 0, the only choice)", NULL, NULL},
    {"-f", OPT_INT, offsetof(Options, tf32), -1, 1, NULL,
     "TF32 matmuls (-1 = as built; the bf16 GPU build's GEMMs are bf16 and take 0 or 1, the fp32 trainers 0 only)", NULL, NULL},
    {"-w", OPT_INT, offsetof(Options, master_weights), -1, 1, NULL,
     "fp32 master weights (-1 = as built; the bf16 GPU build keeps them, 1 only; fp32 trainers 0 or 1)", NULL, NULL},
    {"-a", OPT_INT, offsetof(Options, overfit_batch), 0, 1, NULL,
     "llm.c's overfit-one-batch debug switch: 0 only here", NULL, NULL},
    {"-pn", OPT_INT, offsetof(Options, llmc_procs), 1, 256, NULL,
     "llm.c's number of processes: the world, where no launcher's variables say it", NULL, "the launcher's"},
    {"-pr", OPT_INT, offsetof(Options, llmc_rank), 0, 255, NULL,
     "llm.c's process rank: this process's, where no launcher's variables say it", NULL, "the launcher's"},
    {"-pg", OPT_INT, offsetof(Options, llmc_gpus), 1, 256, NULL,
     "llm.c's GPUs per node: with -pn -pr, the local rank is -pr % -pg, and -pn above -pg spans nodes", NULL, NULL},
    {"-pi", OPT_CHOICE, offsetof(Options, llmc_init), 0, 0, "mpi,tcp,fs",
     "llm.c's init method: how the ranks of mpirun, srun or torchrun meet without --rendezvous: mpi, on one box, "
     "in -o; tcp, at -ps ADDR, with --key-file; fs, in the folder -pf (doc/llmc.md)", NULL, NULL},
    {"-pm", OPT_CHOICE, offsetof(Options, llmc_init), 0, 0, "mpi,tcp,fs", "-pi, as llm.c's usage spells it", NULL, NULL},
    {"-pf", OPT_STR, offsetof(Options, llmc_fs_path), 0, 0, NULL,
     "llm.c's fs path: for -pi fs, the folder where the ranks meet, shared by their nodes, private to the user", NULL,
     NULL},
};
#define NUM_OPTIONS ((int)(sizeof(option_specs) / sizeof(option_specs[0])))

static void options_defaults(Options *o) {
    memset(o, 0, sizeof(*o));
    o->gpu_stats_every = -1;  // llm.c's default: off
    // llm.c's tinyshakespeare.py names (tiny_shakespeare_train.bin) and prepare_data's (..._train_000000.bin)
    o->train_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_train*.bin";
    o->val_pattern = "dev/data/tinyshakespeare/tiny_shakespeare_val*.bin";
    o->init = "d12";
    o->init_vocab = 0;   // -ev -et -ec 0: GPT-2's for dN, the file's for a model file (check_model)
    o->init_maxT = 0;
    o->B = 4; o->T = 1024; o->total_batch = -1; o->steps = -1;
    o->lr = 3e-4f; o->warmup = 0; o->final_frac = 1.0f; o->schedule = SCHED_COSINE;
    o->weight_decay = 0.0f; o->beta1 = 0.9f; o->beta2 = 0.95f; o->eps = 1e-8f; o->grad_clip = 1.0f;
    o->skip_loss_z = 0.0f; o->skip_norm_z = 0.0f;
    o->shuffle = 0; o->seed = 1337;
    o->val_every = 20; o->val_batches = 20; o->sample_every = 20; o->gen_tokens = 64;
    o->ckpt_every = 0; o->ckpt_keep = 2; o->resume = 0; o->resume_step = -1;
    o->np = 1; o->tp = 1; o->pp = 1; o->zero = 0; o->microbatches = 1; o->pipe_schedule = PS_1F1B;
    o->pipe_chunks = 1;
    o->timeout = 30.0f; o->check_every = 0; o->watch_every = 20; o->host_backend = 0;
    o->check_collectives = 0; o->grad_policy = GP_WARN;
    o->recompute = 1; o->tf32 = -1; o->master_weights = -1; o->gelu_fusion = -1;
    o->llmc_procs = 0; o->llmc_rank = -1; o->llmc_gpus = 8; o->llmc_init = PI_MPI; o->llmc_fs_path = "/tmp";
}

// -h: every flag, what it does and its default (in brackets)
static void options_usage(FILE *f, const char *prog) {
    Options d;
    options_defaults(&d);
    fprintf(f, "usage: %s [flags], each flag followed by its value; [its default]\n", prog);
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptionSpec *s = &option_specs[i];
        const char *at = (const char *)&d + s->offset;
        char value[80];
        if (s->dflt != NULL) snprintf(value, sizeof(value), "%s", s->dflt);
        else if (s->type == OPT_INT) snprintf(value, sizeof(value), "%d", *(const int *)at);
        else if (s->type == OPT_FLOAT) snprintf(value, sizeof(value), "%g", *(const float *)at);
        else if (s->type == OPT_STR) snprintf(value, sizeof(value), "%s", *(const char *const *)at);
        else if (s->type == OPT_CHOICE) {  // the choice at the default's index
            const char *p = s->choices;
            for (int k = 0; k < *(const int *)at && strchr(p, ',') != NULL; k++) p = strchr(p, ',') + 1;
            snprintf(value, sizeof(value), "%.*s", (int)strcspn(p, ","), p);
        }
        fprintf(f, "  %-13s %s", s->flag, s->help);
        if (s->type == OPT_CHOICE) fprintf(f, " {%s}", s->choices);
        if (s->type != OPT_REFUSED) fprintf(f, " [%s]", value);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-13s this help\n", "--help");
}

// 1 and the index if value is one of the comma-separated choices
static int choice_index(const char *choices, const char *value, int *index) {
    size_t n = strlen(value);
    int k = 0;
    for (const char *p = choices; *p; k++) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && strncmp(p, value, n) == 0) { *index = k; return 1; }
        p += len + (q ? 1 : 0);
    }
    return 0;
}

// the choices whose bit is set in mask, ", " between them, into buf
static void choice_names(const char *choices, unsigned mask, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; *choices && k < 32 && at < len; k++) {
        const char *q = strchr(choices, ',');
        int n = q ? (int)(q - choices) : (int)strlen(choices);
        if (mask >> k & 1u) at += (size_t)snprintf(buf + at, len - at, "%s%.*s", at ? ", " : "", n, choices);
        choices += n + (q ? 1 : 0);
    }
}

// 1 if v reads whole as a number (strtod's syntax)
static int looks_numeric(const char *v) {
    char *end;
    errno = 0;
    (void)strtod(v, &end);
    return end != v && *end == '\0';
}

// 1 if v reads whole as a decimal integer (strtol's syntax) that fits an int
static int looks_integer(const char *v, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < -2147483647L || x > 2147483647L) return 0;
    *out = x;
    return 1;
}

// 1 if v is an IPv4 address, dotted, with an optional :PORT: llm.c's -ps
// (the numbers' ranges are the rendezvous's to check)
static int looks_ipv4(const char *v) {
    int dots = 0, digits = 0;
    for (; *v != '\0' && *v != ':'; v++) {
        if (*v == '.' && digits > 0) { dots++; digits = 0; }
        else if (*v >= '0' && *v <= '9' && digits < 3) digits++;
        else return 0;
    }
    if (dots != 3 || digits == 0) return 0;
    if (*v == ':' && v[1] == '\0') return 0;
    for (v += *v == ':'; *v != '\0'; v++) if (*v < '0' || *v > '9') return 0;
    return 1;
}

// err's line for flag s, with what llm.c means by the flag when that differs
static int flag_error(char *err, size_t errlen, const OptionSpec *s) {
    size_t n = strlen(err);
    if (s->llmc != NULL && n + 4 < errlen) snprintf(err + n, errlen - n, " (%s)", s->llmc);
    return -1;
}

// parses argv into o; on any problem writes one line into err and returns -1
static int options_parse(Options *o, int argc, char **argv, char *err, size_t errlen) {
    for (int a = 1; a < argc; a += 2) {
        const char *flag = argv[a];
        // -h with a value is llm.c's HellaSwag switch; alone (last, or before another flag) it asks for help.
        // A value is anything but a flag, so -h -1 is a bad value, not a request for help
        int help = strcmp(flag, "--help") == 0 ||
                   (strcmp(flag, "-h") == 0 && (a + 1 >= argc || (argv[a + 1][0] == '-' && !looks_numeric(argv[a + 1]))));
        if (help) { err[0] = '\0'; return 1; }
        const OptionSpec *s = NULL;
        for (int i = 0; i < NUM_OPTIONS; i++)
            if (strcmp(option_specs[i].flag, flag) == 0) s = &option_specs[i];
        if (s == NULL) return errorf(err, errlen, "unknown flag %s (see -h)", flag);
        if (s->type == OPT_REFUSED) {
            errorf(err, errlen, "flag %s: %s", flag, s->help);
            return flag_error(err, errlen, s);
        }
        if (a + 1 >= argc) return errorf(err, errlen, "flag %s needs a value", flag);
        const char *val = argv[a + 1];
        char *dst = (char *)o + s->offset, *end;
        if (s->type == OPT_STR) {
            if (val[0] == '\0') return errorf(err, errlen, "flag %s: empty value", flag);
            long n;
            if (strcmp(flag, "-lg") == 0 && looks_integer(val, &n)) {  // llm.c's -lg N: GPU stats every N steps
                if (n > (1 << 30)) return errorf(err, errlen, "flag -lg: %s steps between GPU stats is out of range "
                                                 "[-1, %d]", val, 1 << 30);
                o->gpu_stats_every = (int)n;
                continue;
            }
            if (strcmp(flag, "-lg") == 0 && looks_numeric(val))
                return errorf(err, errlen, "flag -lg: '%s' is neither an integer (llm.c's -lg N: GPU stats every N "
                              "steps) nor a log file's name (a file named so: -lg ./%s)", val, val);
            *(const char **)dst = val;
        } else if (s->type == OPT_CHOICE) {
            int is_schedule = strcmp(flag, "-ps") == 0;  // ours, or llm.c's server: told apart by the value
            if (is_schedule && !choice_index(s->choices, val, (int *)dst) && looks_ipv4(val)) {
                o->llmc_server = val;
                continue;
            }
            if (!choice_index(s->choices, val, (int *)dst)) {
                errorf(err, errlen, "flag %s: '%s' is not one of {%s}%s", flag, val, s->choices,
                       is_schedule ? " nor an IPv4 address" : "");
                return flag_error(err, errlen, s);
            }
        } else {
            errno = 0;
            double v = s->type == OPT_INT ? (double)strtol(val, &end, 10) : strtod(val, &end);
            if (end == val || *end != '\0' || errno != 0 || v != v) {
                errorf(err, errlen, "flag %s: '%s' is not %s", flag, val, s->type == OPT_INT ? "an integer" : "a number");
                return flag_error(err, errlen, s);
            }
            if (v < s->min || v > s->max) {
                // an integer flag's limits exactly (%g would print 2147483647 as 2.14748365e+09)
                if (s->type == OPT_INT)
                    errorf(err, errlen, "flag %s: %s is out of range [%ld, %ld]", flag, val, (long)s->min, (long)s->max);
                else
                    errorf(err, errlen, "flag %s: %s is out of range [%.9g, %.9g]", flag, val, s->min, s->max);
                return flag_error(err, errlen, s);
            }
            if (s->type == OPT_INT) *(int *)dst = (int)v; else *(float *)dst = (float)v;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------
// the flags every rank of a job shares. Our launcher starts its ranks with
// its own argv, but the ranks of mpirun, srun or torchrun are started by
// the user, and one started with another -b, -l, -x or -o would train
// something else than its peers, most often without a word (a different -x
// stops at a collective only at the end, naming no flag). The ranks compare
// their words once connected (trainer.h's start mark). These may differ:
// what each process is told about its own place (-np, checked against the
// launcher's world, llm.c's -pn -pr -pg), how it finds the others (-pi -pm
// -pf --rendezvous: ranks that differ there do not meet), --key-file (a path
// of each box's), -th (each box's cores) and -lg (rank 0's log: no other
// rank writes one). Over --rendezvous and -pi tcp the meeting proves the
// keys the same; over -pi mpi or fs, where rank 0 makes the job's key, a
// rank given another --key-file is not caught here (a gap: a keyed
// fingerprint of the key in the start mark would close it).

static int options_per_rank(const OptionSpec *s) {
    static const char *const per_rank[] = {"-np", "-pn", "-pr", "-pg", "-pi", "-pm", "-pf", "--rendezvous",
                                           "--key-file", "-th", "-lg"};
    for (size_t i = 0; i < sizeof(per_rank) / sizeof(per_rank[0]); i++)
        if (strcmp(s->flag, per_rank[i]) == 0) return 1;
    return 0;
}

// options_mark: NUM_OPTIONS words, one per flag of the table, in its order:
// an integer or a choice's index as it is, a float's bits, a string's 64-bit
// FNV-1a hash (0: not given); 0 for a flag that may differ between ranks
static void options_mark(const Options *o, uint64_t *words) {
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptionSpec *s = &option_specs[i];
        const char *at = (const char *)o + s->offset;
        uint64_t w = 0;
        if (options_per_rank(s) || s->type == OPT_REFUSED) w = 0;
        else if (s->type == OPT_INT || s->type == OPT_CHOICE) w = (uint64_t)(int64_t)*(const int *)at;
        else if (s->type == OPT_FLOAT) {
            uint32_t bits;
            memcpy(&bits, at, sizeof(bits));
            w = bits;
        } else if (*(const char *const *)at != NULL) {
            w = 14695981039346656037ull;
            for (const unsigned char *p = *(const unsigned char *const *)at; *p != '\0'; p++) w = (w ^ *p) * 1099511628211ull;
            if (w == 0) w = 1;  // 0 means not given
        }
        words[i] = w;
    }
}

// options_word_text: flag s's value in word w as "with -b 2", or "without -o"
// (a string that was not given); a string's own value from o when it is this
// rank's, else "with another -o"
static void options_word_text(const OptionSpec *s, uint64_t w, const Options *o, char *out, size_t outlen) {
    if (s->type == OPT_INT) snprintf(out, outlen, "with %s %d", s->flag, (int)(int64_t)w);
    else if (s->type == OPT_FLOAT) {
        uint32_t bits = (uint32_t)w;
        float f;
        memcpy(&f, &bits, sizeof(f));
        snprintf(out, outlen, "with %s %g", s->flag, f);
    } else if (s->type == OPT_CHOICE) {
        const char *p = s->choices;
        for (uint64_t k = 0; k < w && strchr(p, ',') != NULL; k++) p = strchr(p, ',') + 1;
        snprintf(out, outlen, "with %s %.*s", s->flag, (int)strcspn(p, ","), p);
    } else if (w == 0) snprintf(out, outlen, "without %s", s->flag);
    else if (o != NULL) snprintf(out, outlen, "with %s %.300s", s->flag, *(const char *const *)((const char *)o + s->offset));
    else snprintf(out, outlen, "with another %s", s->flag);
}

// options_marks_judge: marks holds every rank's options_mark, rank r's at
// marks + r * stride. Returns the number of ranks whose flags differ from
// rank 0's, the same on every rank; when this rank (whose options are o) is
// one of them, err names the first flag that differs and both values (else
// err is empty).
static int options_marks_judge(const Options *o, const uint64_t *marks, size_t stride, int world, int rank, char *err,
                               size_t errlen) {
    int differ = 0;
    err[0] = '\0';
    for (int r = 1; r < world; r++) differ += memcmp(marks + r * stride, marks, NUM_OPTIONS * sizeof(uint64_t)) != 0;
    const uint64_t *mine = marks + (size_t)rank * stride;
    for (int i = 0; i < NUM_OPTIONS; i++) {
        if (mine[i] == marks[i]) continue;
        char here[400], there[400];
        options_word_text(&option_specs[i], mine[i], o, here, sizeof(here));
        options_word_text(&option_specs[i], marks[i], NULL, there, sizeof(there));
        errorf(err, errlen, "rank %d was started %s, but rank 0 %s: every rank of a job must be started with the same "
               "flags", rank, here, there);
        break;
    }
    return differ;
}

// what a trainer build does where llm.c's -a -f -w -ge -nm choose
typedef struct {
    const char *name;   // for the error lines: "the CPU trainer", ...
    int bf16;           // bf16 GEMMs (so -f means nothing) and fp32 master weights (so -w 0 cannot be)
    int gelu_fusion;    // what -ge -1 means: 2 (forward and backward) or 0 (none, the only choice then)
    unsigned schedules; // the -ps schedules it runs: bit PS_* set
    int sequence_parallel;  // whether it runs -sp 1
    int checks;         // it can check its collectives (-ic 1), gathers its ranks' gradient norms (-gp) and
                        // acts on -fault corrupt, corrupt-low, poison and corrupt-sum
    int nccl;           // its ranks talk over NCCL unless -hb 1, whose sums no rank's code makes
                        // (-fault corrupt-sum acts on the host backend's only)
} TrainerBuild;

// llm.c's switches checked against what build b does: each value taken
// means what it means in llm.c, the others are refused; -ge -1 resolved
static int options_check_build(Options *o, const TrainerBuild *b, char *err, size_t errlen) {
    if (o->overfit_batch != 0)
        return errorf(err, errlen, "flag -a 1: llm.c's overfit-one-batch debug mode is not implemented here");
    if (o->major_every != 0)
        return errorf(err, errlen, "flag -nm %d: llm.c's major checkpoints are not implemented here; -nk 0 keeps "
                      "every checkpoint", o->major_every);
    if (o->tf32 == 1 && !b->bf16)
        return errorf(err, errlen, "flag -f 1: %s computes in exact fp32, without TF32 (llm.c's -f 0)", b->name);
    if (o->master_weights == 0 && b->bf16)
        return errorf(err, errlen, "flag -w 0: %s always keeps fp32 master weights (llm.c's -w 1)", b->name);
    if (!(b->schedules >> o->pipe_schedule & 1u)) {
        const char *choices = "";
        char name[32], runs[128];
        for (int i = 0; i < NUM_OPTIONS; i++)
            if (strcmp(option_specs[i].flag, "-ps") == 0) choices = option_specs[i].choices;
        choice_names(choices, 1u << o->pipe_schedule, name, sizeof(name));
        choice_names(choices, b->schedules, runs, sizeof(runs));
        return errorf(err, errlen, "flag -ps %s: %s does not run this schedule yet (it runs %s)", name, b->name, runs);
    }
    if (o->sp && !b->sequence_parallel)
        return errorf(err, errlen, "flag -sp 1: %s does not run sequence parallelism yet (the CPU trainer, train_gpt2, does)", b->name);
    if (o->check_collectives == 1 && !b->checks)
        return errorf(err, errlen, "flag -ic 1: %s does not check its collectives yet (the CPU trainer does)", b->name);
    if (o->grad_policy != GP_WARN && !b->checks)
        return errorf(err, errlen, "flag -gp %s: %s does not gather its ranks' gradient norms yet (the CPU trainer "
                      "does)", o->grad_policy == GP_SKIP ? "skip" : "stop", b->name);
    if (o->gelu_fusion < 0) o->gelu_fusion = b->gelu_fusion;
    if (o->gelu_fusion > 0 && b->gelu_fusion == 0)
        return errorf(err, errlen, "flag -ge %d: %s has no fused GELU (llm.c's -ge 0)", o->gelu_fusion, b->name);
    return 0;
}

#endif
