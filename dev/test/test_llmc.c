/*
 * test_llmc.c: llm.c's command lines mean the same here.
 *
 * Every flag of llm.c's train_gpt2.cu (its usage text and its parser) is in
 * flags.h's table, and each either means what it means in llm.c or is
 * refused with one line saying what differs; -lg and -ps are told apart
 * from llm.c's by their values (-lg N: llm.c's GPU stats; -ps IPv4: llm.c's
 * server for -pi tcp), -x 0 evaluates only, and AdamW's -ep and betas are
 * refused where they divide by 0. llm.c's GPT-2 124M command
 * (scripts/run_gpt2_124M.sh) runs unchanged on the CPU trainer with a small
 * -e, under that script's loop, which ends once the trainer wrote
 * DONE_<steps>: it starts, evaluates, checkpoints, and, run again, resumes
 * without training a step. Ranks that mpirun starts meet in -o without flags
 * of ours (without -o one line says what to add), or through --rendezvous;
 * llm.c's -pn -pr -pg -pi fs -pf meet in the folder, on one box and over
 * TCP; each trains what -np does. llm.c's outlier guard (-sl, -sg):
 * its z-scores against a direct computation, the updates it skips, which
 * change nothing, and a resume after a skipped update, bit for bit the
 * uninterrupted run.
 * And the user's run: -h shows every flag's default, the step line has an
 * ETA and ends in the MFU, whose peak is of the job's CPUs (ranks bound to a
 * core each, as mpirun binds them, count both cores), a -g above -t is
 * said, HellaSwag shows its progress, and a job of several ranks ends with
 * one table of their bytes.
 */
#include <dirent.h>

#include "llm3d/flags.h"
#include "llm3d/trainer.h"
#include "llm3d/cpu/cpu_peak.h"
#include "dev/test/test.h"
#include "dev/test/test_run.h"

static char dir[128];

// ----------------------------------------------------------------------------
// the flags

// parses the flag/value pairs of args (space separated) into o
static int parse(Options *o, const char *args, char *err, size_t errlen) {
    static char buf[512];  // o keeps pointers into it
    char *argv[64] = {"train_gpt2"};
    int argc = 1;
    snprintf(buf, sizeof(buf), "%s", args);
    for (char *t = strtok(buf, " "); t != NULL && argc < 63; t = strtok(NULL, " ")) argv[argc++] = t;
    options_defaults(o);
    err[0] = '\0';
    return options_parse(o, argc, argv, err, errlen);
}

static void test_flags(void) {
    char err[1024];
    Options o;
    // llm.c's every flag with a value its scripts use: taken, meaning the same
    struct { const char *args; int ok; } taken[] = {
        {"-i a_*.bin -j b_*.bin -e d12 -o out -n 5000 -nk 0 -nm 0 -y 1", 1},
        {"-b 64 -t 1024 -d 524288 -x 18865 -k cosine -l 0.0006 -u 700 -q 0.0 -c 0.1 -sl 5 -sg 5", 1},
        {"-v 250 -m 20 -s 20000 -g 144 -h 1 -a 0 -ge 0 -z 1 -r 0 -w 1 -f 0", 1},
    };
    for (int k = 0; k < 3; k++) check(parse(&o, taken[k].args, err, sizeof(err)) == 0, "llm.c's %s: taken", taken[k].args);
    parse(&o, "-b 64 -t 1024 -d 524288 -l 0.0006 -u 700 -q 0.0 -c 0.1 -v 250 -m 20 -s 20000 -g 144 -h 1 -z 1 -nk 0 -sl 4 "
          "-sg 3.5 -k wsd -e gpt2:d12", err, sizeof(err));
    GPT2Config c;
    check(o.B == 64 && o.T == 1024 && o.total_batch == 524288 && fabsf(o.lr - 6e-4f) < 1e-9f && o.warmup == 700 &&
          o.final_frac == 0.0f && fabsf(o.weight_decay - 0.1f) < 1e-9f && o.val_every == 250 && o.val_batches == 20 &&
          o.sample_every == 20000 && o.gen_tokens == 144 && o.hellaswag == 1 && o.zero == 1 && o.ckpt_keep == 0 &&
          o.skip_loss_z == 4.0f && o.skip_norm_z == 3.5f && o.schedule == SCHED_WSD &&
          options_descriptor(&o, &c, err, sizeof(err)) == 1 && c.L == 12 && c.C == 768 && c.NH == 12,
          "each lands where llm.c's does (gpt2:d12 is d12)");
    // llm.c's depths and shapes: d6 ... d84
    int depths[] = {6, 24, 36, 48, 60, 72, 84}, channels[] = {384, 1024, 1280, 1600, 1920, 2880, 3456},
        heads[] = {6, 16, 20, 25, 30, 30, 36}, same = 1;
    for (int k = 0; k < 7; k++) {
        char d[16];
        snprintf(d, sizeof(d), "d%d", depths[k]);
        same &= config_from_descriptor(&c, d, 50257, 1024) == 0 && c.C == channels[k] && c.NH == heads[k];
    }
    check(same, "dN: llm.c's channels and heads for d6, d24, d36, d48, d60, d72, d84");
    // refused, each with one line saying what llm.c means by it
    struct { const char *args, *want; } refused[] = {
        {"-pn 0", "flag -pn: 0 is out of range [1, 256]"},
        {"-pi nccl", "flag -pi: 'nccl' is not one of {mpi,tcp,fs}"},
        {"-ps 10.0.0", "flag -ps: '10.0.0' is not one of {gpipe,1f1b,interleaved,zbh1,zbv} nor an IPv4 address (llm.c's -ps is the server "
                       "address of its -pi tcp"},
        {"-ps 1fb1", "flag -ps: '1fb1' is not one of {gpipe,1f1b,interleaved,zbh1,zbv} nor an IPv4 address"},
        {"-pp /tmp", "flag -pp: '/tmp' is not an integer (llm.c's usage lists -pp as the fs path"},
        {"-lg 0.5", "flag -lg: '0.5' is neither an integer (llm.c's -lg N: GPU stats every N steps) nor a log file's name"},
        {"-ep 0", "flag -ep: 0 is out of range [1e-30, 1]"},
        {"-ep 1e-50", "flag -ep: 1e-50 is out of range [1e-30, 1]"},
        {"-b2 0.999999999", "flag -b2: 0.999999999 is out of range [0, 0.9999999]"},
        {"-b1 1", "flag -b1: 1 is out of range [0, 0.9999999]"},
        {"-r 2", "flag -r: 2 is out of range [0, 1] (llm.c's -r 2 also recomputes LayerNorm"},
        {"-k step", "not one of {cosine,linear,constant,wsd}"},
    };
    for (size_t k = 0; k < sizeof(refused) / sizeof(refused[0]); k++) {
        int rc = parse(&o, refused[k].args, err, sizeof(err));
        check(rc == -1 && strstr(err, refused[k].want) != NULL && strchr(err, '\n') == NULL, "%s refused: %s",
              refused[k].args, err);
    }
    check(parse(&o, "-ps interleaved -pv 3", err, sizeof(err)) == 0 && o.pipe_schedule == PS_INTERLEAVED &&
              o.pipe_chunks == 3 && parse(&o, "-ps zbv", err, sizeof(err)) == 0 && o.pipe_schedule == PS_ZBV &&
              o.pipe_chunks == 1 && parse(&o, "-pv 9", err, sizeof(err)) == -1 &&
              strstr(err, "flag -pv: 9 is out of range [1, 8]") != NULL,
          "-ps interleaved -pv 3 and -ps zbv taken (PS_* in pipeline.h's order), -pv 9 refused: %s", err);
    check(parse(&o, "-lg run10.jsonl", err, sizeof(err)) == 0 && strcmp(o.log_file, "run10.jsonl") == 0 &&
          o.gpu_stats_every == -1, "-lg takes a file name");
    // -lg and -ps are told apart from llm.c's by their values
    check(parse(&o, "-lg 10", err, sizeof(err)) == 0 && o.log_file == NULL && o.gpu_stats_every == 10 &&
          parse(&o, "-lg -1", err, sizeof(err)) == 0 && o.log_file == NULL && o.gpu_stats_every == -1 &&
          parse(&o, "-lg ./10", err, sizeof(err)) == 0 && strcmp(o.log_file, "./10") == 0 && o.gpu_stats_every == -1,
          "-lg 10 is llm.c's GPU stats every 10 steps (no log file), -lg -1 llm.c's off, -lg ./10 a log file");
    check(parse(&o, "-ps gpipe", err, sizeof(err)) == 0 && o.pipe_schedule == PS_GPIPE &&
          parse(&o, "-x 0", err, sizeof(err)) == 0 && o.steps == 0 &&
          parse(&o, "-ep 1e-30 -b2 0.9999999", err, sizeof(err)) == 0 && o.eps > 0.0f && o.beta2 < 1.0f,
          "-ps gpipe is ours, -x 0 is taken (evaluate only), -ep 1e-30 and -b2 0.9999999 are taken (their floats "
          "above 0, below 1)");
    check(parse(&o, "-lg run10.jsonl", err, sizeof(err)) == 0 && strcmp(o.log_file, "run10.jsonl") == 0,
          "-lg takes a file name");
    // llm.c's multi-node flags, as its scripts give them; -ps told apart by its value
    int rc = parse(&o, "-pn 16 -pr 9 -pg 8 -pi fs -pf /shared/sync -ps 1f1b", err, sizeof(err));
    check(rc == 0 && o.llmc_procs == 16 && o.llmc_rank == 9 && o.llmc_gpus == 8 && o.llmc_init == PI_FS &&
          strcmp(o.llmc_fs_path, "/shared/sync") == 0 && o.pipe_schedule == PS_1F1B && o.llmc_server == NULL,
          "llm.c's -pn -pr -pg -pi fs -pf taken; -ps 1f1b is the pipeline schedule: %s", err);
    rc = parse(&o, "-pm tcp -ps 10.0.0.1 -ps gpipe", err, sizeof(err));
    check(rc == 0 && o.llmc_init == PI_TCP && o.llmc_server != NULL && strcmp(o.llmc_server, "10.0.0.1") == 0 &&
          o.pipe_schedule == PS_GPIPE, "-pm tcp (llm.c's usage's -pi), -ps 10.0.0.1 llm.c's server, -ps gpipe ours: %s",
          err);
    rc = parse(&o, "-pi tcp -ps 192.168.1.7:29500", err, sizeof(err));
    check(rc == 0 && strcmp(o.llmc_server, "192.168.1.7:29500") == 0 && o.pipe_schedule == PS_1F1B,
          "-ps 192.168.1.7:29500: llm.c's server, with a port; the schedule keeps its default: %s", err);
    parse(&o, "-e gpt3:c768", err, sizeof(err));
    check(options_descriptor(&o, &c, err, sizeof(err)) == -1 && strstr(err, "llm.c's GPT-3 shapes are not implemented"),
          "-e gpt3:c768 refused: %s", err);
    // what each build takes of -a -f -w -ge -nm
    // (name, bf16, GELU fusion, schedules, sequence parallelism, checked collectives, NCCL)
    TrainerBuild cpu = {"the CPU trainer", 0, 0, 3, 1, 1, 0}, bf16 = {"the bf16 build of train_gpt2cu", 1, 2, 3, 1, 1, 1},
                 fp32 = {"the fp32 build of train_gpt2cu", 0, 0, 3, 1, 1, 1},
                 no_ic = {"a build without checked collectives", 1, 2, 3, 1, 0, 1},  // none is, now that both trainers check
                 cpu_zb = {"the CPU trainer", 0, 0, 1u << PS_GPIPE | 1u << PS_1F1B | 1u << PS_ZBH1, 1, 1, 0},
                 no_sp = {"a build without -sp", 0, 0, 3, 0, 0, 0};  // none is, now that both trainers run it
    struct { const char *args; const TrainerBuild *b; int ok; int ge; const char *want; } builds[] = {
        {"-f 1", &bf16, 1, 2, NULL},
        {"-f 1", &cpu, 0, 0, "flag -f 1: the CPU trainer computes in exact fp32, without TF32 (llm.c's -f 0)"},
        {"-f 1", &fp32, 0, 0, "flag -f 1: the fp32 build of train_gpt2cu computes in exact fp32"},
        {"-w 0", &bf16, 0, 0, "flag -w 0: the bf16 build of train_gpt2cu always keeps fp32 master weights"},
        {"-w 0", &cpu, 1, 0, NULL},
        {"-ge 1", &bf16, 1, 1, NULL},
        {"-ge 0", &bf16, 1, 0, NULL},
        {"-ge 2", &cpu, 0, 0, "flag -ge 2: the CPU trainer has no fused GELU (llm.c's -ge 0)"},
        {"-a 1", &bf16, 0, 0, "flag -a 1: llm.c's overfit-one-batch debug mode is not implemented here"},
        {"-ps zbh1", &cpu_zb, 1, 0, NULL},
        {"-ps zbv", &bf16, 0, 0, "flag -ps zbv: the bf16 build of train_gpt2cu does not run this schedule yet (it runs "
                                 "gpipe, 1f1b)"},
        {"-ps interleaved -pv 2", &cpu, 0, 0, "flag -ps interleaved: the CPU trainer does not run this schedule yet "
                                                 "(it runs gpipe, 1f1b)"},
        {"-nm 10000", &cpu, 0, 0, "flag -nm 10000: llm.c's major checkpoints are not implemented here; -nk 0 keeps"},
        {"-sp 1", &cpu, 1, 0, NULL},
        {"-sp 1", &fp32, 1, 0, NULL},
        {"-sp 1", &bf16, 1, 2, NULL},
        {"-sp 1", &no_sp, 0, 0, "flag -sp 1: a build without -sp does not run sequence parallelism yet"},
        {"-sp 0", &bf16, 1, 2, NULL},
    };
    for (size_t k = 0; k < sizeof(builds) / sizeof(builds[0]); k++) {
        parse(&o, builds[k].args, err, sizeof(err));
        int rc = options_check_build(&o, builds[k].b, err, sizeof(err));
        check(builds[k].ok ? rc == 0 && o.gelu_fusion == builds[k].ge : rc == -1 && strstr(err, builds[k].want) != NULL,
              "%s on %s: %s", builds[k].args, builds[k].b->name, builds[k].ok ? "taken" : err);
    }
    // -ic and -gp: checked collectives and the gradient-norm rule, in every
    // trainer (-ic off by default: its cost); a build without them refuses them
    struct { const char *args; const TrainerBuild *b; int ic; const char *want; } checks[] = {
        {"-b 4", &cpu, 0, NULL},
        {"-ic 1", &cpu, 1, NULL},
        {"-b 4", &bf16, 0, NULL},
        {"-ic 0 -gp warn", &fp32, 0, NULL},
        {"-ic 1", &bf16, 1, NULL},
        {"-ic 1 -gp skip", &fp32, 1, NULL},
        {"-ic 1", &no_ic, 0, "flag -ic 1: a build without checked collectives does not check its collectives yet"},
        {"-gp skip", &no_ic, 0, "flag -gp skip: a build without checked collectives does not gather its ranks' gradient norms"},
        {"-gp stop -ic 1", &cpu, 1, NULL},
    };
    for (size_t k = 0; k < sizeof(checks) / sizeof(checks[0]); k++) {
        parse(&o, checks[k].args, err, sizeof(err));
        int rc = options_check_build(&o, checks[k].b, err, sizeof(err));
        check(checks[k].want == NULL ? rc == 0 && o.check_collectives == checks[k].ic
                                     : rc == -1 && strstr(err, checks[k].want) != NULL,
              "%s on %s: %s (-ic %d)", checks[k].args, checks[k].b->name, checks[k].want == NULL ? "taken" : err,
              o.check_collectives);
    }
}

// HellaSwag's progress: on a terminal every 10th batch, as llm.c's; into a
// file or a pipe a line at most every PROGRESS_EVERY_S seconds
static void test_progress(void) {
    int tty_ok = progress_due(1, 0, 0.0, 0.0) && !progress_due(1, 9, 0.0, 0.0) && progress_due(1, 10, 0.0, 0.0) &&
                 progress_due(1, 2510, 0.0, 0.0);
    double every = PROGRESS_EVERY_S * 1e3;
    int file_ok = !progress_due(0, 0, 1000.0, 1000.0) && !progress_due(0, 10, 1000.0 + every - 1, 1000.0) &&
                  progress_due(0, 11, 1000.0 + every, 1000.0);
    check(tty_ok && file_ok && PROGRESS_EVERY_S >= 5.0 && PROGRESS_EVERY_S <= 60.0,
          "HellaSwag's progress: on a terminal batches 0, 10, 20 ...; elsewhere a line when %.0f s have passed since "
          "the last, not before", PROGRESS_EVERY_S);
}

// ----------------------------------------------------------------------------
// the trainer

// llm.c's scripts/run_gpt2_124M.sh, as it is but for -e (a small model
// file) and -i -j -o (the test's shards and directory)
static void test_llmc_command(const char *exe) {
    char cmd[2048], out[65536], path[300], err[512];
    // a model of llm.c's maxT 1024 small enough for this box: vocab 256, C 32, one layer
    GPT2Config c = {.maxT = 1024, .V = 256, .Vp = 256, .L = 1, .NH = 1, .C = 32};
    float *params = (float *)calloc(param_count(&c), sizeof(float));
    for (size_t i = 0; i < param_count(&c); i++) params[i] = 0.02f * (float)((i * 2654435761u % 1000) / 500.0 - 1.0);
    snprintf(path, sizeof(path), "%s/small.bin", dir);
    int ok = model_save(path, &c, params, 0, err, sizeof(err)) == 0;
    free(params);
    snprintf(path, sizeof(path), "%s/data_train_000001.bin", dir);
    ok = ok && test_write_shard(path, 524288 + 1) == 0;
    snprintf(path, sizeof(path), "%s/data_val_000000.bin", dir);
    ok = ok && test_write_shard(path, 65536 + 1) == 0;
    if (!check(ok, "a small model (maxT 1024) and shards for one step of 524288 tokens in %s", dir)) return;
    const char *llmc = "-i data_train_*.bin -j data_val_*.bin -o log124M -v 250 -s 20000 -g 144 -h 1 -b 64 -t 1024 "
                       "-d 524288 -r 0 -z 1 -c 0.1 -l 0.0006 -q 0.0 -u 700 -n 5000 -y 1 -e small.bin";
    // in the test's directory, where llm.c's default HellaSwag file is not,
    // under llm.c's loop of run_gpt2_124M.sh: it starts the trainer until
    // DONE_<steps> is in -o (here at most 3 times, and says how often)
    snprintf(cmd, sizeof(cmd), "cd %s && n=0; while true; do if [ -f log124M/DONE_00000001 ]; then echo \"launches: $n\"; "
             "break; fi; [ $n -ge 3 ] && { echo \"launches: $n, no DONE_00000001\"; exit 9; }; n=$((n + 1)); "
             "timeout 300 %s %s || exit $?; done", dir, exe, llmc);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, "launches: 1\n") != NULL,
          "llm.c's loop (run_gpt2_124M.sh) ends after one launch: it wrote log124M/DONE_00000001 (exit %d, %s)", rc,
          test_line_of(out, "launches:"));
    int evals = test_count(out, "val loss");
    ok = check(rc == 0 && strstr(out, "8 micro-batches per step") && evals == 2 &&
               strstr(out, "checkpoint log124M/ckpt_00000001 written") && strstr(out, "no HellaSwag file at") &&
               strstr(out, "note: flag -s: no samples without a tokenizer"),
               "llm.c's 124M command, unchanged but for -e: exit %d, 8 micro-batches a step, %d evaluations (step 0, "
               "after the last), a checkpoint, one line each on HellaSwag and samples", rc, evals);
    if (!ok) printf("%s\n", out);
    snprintf(path, sizeof(path), "%s/log124M/log.jsonl", dir);
    FILE *f = fopen(path, "r");
    char line[512], last[512] = "";
    while (f && fgets(line, sizeof(line), f)) snprintf(last, sizeof(last), "%s", line);
    if (f) fclose(f);
    check(strncmp(last, "{\"step\": 1, \"val_loss\": ", 24) == 0, "its log ends with the final model's val loss: %s", last);
    // the same command again (a retry of a finished run): it resumes from the last checkpoint, evaluates
    // once more and ends, without training a step
    snprintf(cmd, sizeof(cmd), "cd %s && timeout 300 %s %s", dir, exe, llmc);
    rc = test_run(cmd, 1, out, sizeof(out));
    ok = check(rc == 0 && strstr(out, "resum") != NULL && strstr(out, "val loss") != NULL &&
               strstr(out, "step    ") == NULL && test_exists("%s/log124M/DONE_00000001", dir),
               "the same command again: resumes from step 1, trains no step, and ends (exit %d)", rc);
    if (!ok) printf("%s\n", out);
}

// -x 0: llm.c's evaluation without training: the val loss, and nothing
// written in -o but the log (no step, no checkpoint, no model, no DONE)
static void test_eval_only(const char *exe) {
    char cmd[2048], out[65536], odir[300], path[400];
    snprintf(odir, sizeof(odir), "%s/eval_only", dir);
    snprintf(cmd, sizeof(cmd), "%s -e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 0 -v 5 -n 1 -s 0 -th 1 -i %s/tiny_train.bin "
             "-j %s/tiny_train.bin -o %s", exe, dir, dir, odir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    snprintf(path, sizeof(path), "%s/log.jsonl", odir);
    char *log = test_read_text(path);
    check(rc == 0 && test_count(out, "val loss ") == 1 && strstr(out, "step    ") == NULL &&
          strstr(out, "0 steps (-x 0: evaluate only)") != NULL && !test_exists("%s/model_00000000.bin", odir) &&
          !test_exists("%s/ckpt_00000000", odir) && !test_exists("%s/ckpt_00000001", odir) &&
          !test_exists("%s/DONE_00000000", odir) && strncmp(log, "{\"step\": 0, \"val_loss\": ", 24) == 0 &&
          test_count(log, "\n") == 1,
          "-x 0 -n 1: the val loss once, no step trained, no checkpoint, model or DONE file; the log has the one "
          "evaluation (exit %d): %s", rc, log);
    free(log);
}

// llm.c's -lg N on the CPU trainer: taken, said once to mean nothing here,
// and no log file named N
static void test_gpu_stats_flag(const char *exe) {
    char cmd[2048], out[65536];
    snprintf(cmd, sizeof(cmd), "cd %s && %s -e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 4 -v 0 -s 0 -th 1 "
             "-i tiny_train.bin -lg 2", dir, exe);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && test_count(out, "note: flag -lg 2: llm.c's GPU stats every 2 steps; the CPU trainer has no GPU") == 1 &&
          !test_exists("%s/2", dir) && strstr(out, "step    3/4") != NULL,
          "-lg 2: llm.c's GPU stats, one line that the CPU trainer has none, no log file '2', the run goes on (exit %d)",
          rc);
}

// -g above -t: a sample is at most T tokens, and one line says so
static void test_sample_length(const char *exe) {
    char cmd[2048], out[65536], tok[300], err[512];
    snprintf(tok, sizeof(tok), "%s/bytes_tok.bin", dir);
    if (!check(tokenizer_write_bytes_bin(tok, err, sizeof(err)) == 0, "a tokenizer of 256 bytes: %s", err)) return;
    snprintf(cmd, sizeof(cmd), "%s -e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 1 -v 0 -s 1 -g 40 -tk %s -th 1 "
             "-i %s/tiny_train.bin", exe, tok, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && test_count(out, "note: flag -g 40: a sample is at most -t 16 tokens here") == 1 &&
          strstr(out, "generating:") != NULL, "-g 40 -t 16: one line says a sample is at most 16 tokens (exit %d): %s",
          rc, test_line_of(out, "note: flag -g"));
}

// the MFU's peak is the job's: the union of its ranks' CPU sets on each machine
static void test_job_peak(void) {
    float rec[4][CPU_RANK_FLOATS];
    int threads, cpus;
    // records as cpu_rank_record makes them: host hash, threads, rate, CPU set
    struct { const char *what; int n; int host[4], threads[4]; unsigned set[4]; double want; int want_cpus; } cases[] = {
        {"2 ranks bound to a core each (mpirun's default)", 2, {1, 1}, {1, 1}, {0x1, 0x2}, 2 * 10.0, 2},
        {"2 unbound ranks of 2 threads on 2 CPUs", 2, {1, 1}, {2, 2}, {0x3, 0x3}, 2 * 10.0, 2},
        {"2 ranks of 1 thread, each free on 4 CPUs", 2, {1, 1}, {1, 1}, {0xf, 0xf}, 2 * 10.0, 4},
        {"2 machines of 2 bound ranks each", 4, {1, 1, 2, 2}, {1, 1, 1, 1}, {0x1, 0x2, 0x1, 0x2}, 4 * 10.0, 4},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        memset(rec, 0, sizeof(rec));
        for (int r = 0; r < cases[k].n; r++) {
            rec[r][0] = (float)cases[k].host[r];
            rec[r][3] = (float)cases[k].threads[r];
            rec[r][4] = 10.0f;
            rec[r][5] = (float)cases[k].set[r];
        }
        double peak = cpu_job_peak(&rec[0][0], cases[k].n, &threads, &cpus);
        check(fabs(peak - cases[k].want) < 1e-9 && cpus == cases[k].want_cpus,
              "job peak, %s: %.0f GFLOP/s on %d CPUs (want %.0f on %d)", cases[k].what, peak, cpus, cases[k].want,
              cases[k].want_cpus);
    }
    // this process's own record: its CPU set has as many CPUs as OpenMP counts
    float mine[CPU_RANK_FLOATS];
    cpu_rank_record(mine, 1, 10.0);
    cpu_job_peak(mine, 1, &threads, &cpus);
    check(cpus == cpu_count() && threads == 1, "this process's record: %d CPUs in its set, as cpu_count says %d", cpus,
          cpu_count());
}

// ranks that mpirun starts: without --rendezvous and without -o one line
// says what to add; with --rendezvous (and a key file) they join one job
static void test_mpirun(const char *exe) {
    char cmd[4096], out[65536], key[300], shard[300];
    snprintf(shard, sizeof(shard), "%s/tiny_train.bin", dir);
    if (!check(test_write_shard(shard, 20000) == 0, "a shard")) return;
    const char *model = "-e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 3 -v 0 -s 0 -th 1";
    snprintf(cmd, sizeof(cmd), "OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_LOCAL_RANK=3 %s %s -i %s",
             exe, model, shard);
    int rc = test_run(cmd, 1, out, sizeof(out));
    int lines = test_count(out, "\n");
    check(rc == 2 && lines == 1 && strstr(out, "started by Open MPI as rank 3 of 8 without --rendezvous: give -o DIR, "
                                           "where the ranks of one box meet, or --rendezvous") != NULL,
          "under mpirun without --rendezvous and without -o: %s", out);
    snprintf(key, sizeof(key), "%s/job.key", dir);
    if (test_random_key_file(key) != 0) { check(0, "a key file"); return; }
    char flags[1200];
    snprintf(flags, sizeof(flags), "%s -i %s --rendezvous unix:%s/rdv.sock --key-file %s", model, shard, dir, key);
    // each rank bound to a CPU of its own, as mpirun binds them by default
    // (where this test may run on CPUs 0 and 1): the MFU's peak is of both CPUs
    uint64_t words[CPU_SET_MAX / 64];
    int bind = cpu_affinity(words) == 0 && (words[0] & 3) == 3 && system("taskset -c 0 true >/dev/null 2>&1") == 0;
    snprintf(cmd, sizeof(cmd), "(OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=1 timeout 60 "
             "%s %s %s > %s/r1.txt 2>&1 & OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 "
             "timeout 60 %s %s %s 2>&1; a=$?; wait $!; exit $((a + $?)))", bind ? "taskset -c 1" : "", exe, flags, dir,
             bind ? "taskset -c 0" : "", exe, flags);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, "x dp 2 = 64 tokens") != NULL && strstr(out, "step    2/3") != NULL,
          "with --rendezvous and --key-file, mpirun's 2 ranks run one job of dp 2 (exit %d)", rc);
    if (bind)
        check(strstr(out, "GFLOP/s for 2 threads on 2 CPUs (the MFU's denominator)") != NULL,
              "ranks bound to CPU 0 and CPU 1: the MFU's peak is of 2 CPUs, the job's, not rank 0's one: %s",
              test_line_of(out, "FMA peak"));
    else
        skip("the MFU's peak under bound ranks: needs CPUs 0 and 1 and taskset");
    // the end of a job of several ranks: one table, a row per rank, the all-zero columns left out
    const char *t = strstr(out, "bytes sent by each rank");
    const char *header = t != NULL ? strchr(t, '\n') : NULL;
    check(header != NULL && strncmp(header + 1, "rank  allreduce", 15) == 0 && strstr(header, "\n   0  ") != NULL &&
          strstr(header, "\n   1  ") != NULL && strstr(header, "broadcast") == NULL && strstr(out, "rank 1 bytes") == NULL,
          "the ranks' bytes: one table with a row per rank and no all-zero column");
}

// -h: every flag with its default; the step line's ETA and MFU
static void test_usage(const char *exe) {
    char cmd[1024], out[65536];
    snprintf(cmd, sizeof(cmd), "%s -h", exe);
    int rc = test_run(cmd, 1, out, sizeof(out)), all = 1;
    for (int i = 0; i < NUM_OPTIONS; i++) {
        char want[32];
        snprintf(want, sizeof(want), "\n  %-13s ", option_specs[i].flag);
        const char *line = strstr(out, want), *end = line != NULL ? strchr(line + 1, '\n') : NULL;
        int has_default = end != NULL && end[-1] == ']';
        all &= line != NULL && (has_default || option_specs[i].type == OPT_REFUSED);
    }
    check(rc == 0 && all && strstr(out, "micro-batch size B per data-parallel rank [4]") &&
          strstr(out, "{cosine,linear,constant,wsd} [cosine]") && strstr(out, "peak learning rate [0.0003]"),
          "-h: each of the %d flags with its default in brackets (-b [4], -k [cosine], -l [0.0003])", NUM_OPTIONS);
    snprintf(cmd, sizeof(cmd), "%s -e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 2 -v 0 -s 0 -th 1 -i %s/tiny_train.bin",
             exe, dir);
    rc = test_run(cmd, 1, out, sizeof(out));
    const char *last = strstr(out, "| ETA 0s | MFU ");
    float mfu = -1.0f;
    if (last != NULL && sscanf(last, "| ETA 0s | MFU %f%%\n", &mfu) != 1) mfu = -1.0f;
    check(rc == 0 && strstr(out, "GFLOP/s | ETA ") != NULL && last != NULL && mfu > 0.0f && mfu < 100.0f &&
          strstr(out, "FMA peak: ") != NULL && strstr(out, "(the MFU's denominator)\n") != NULL,
          "the step line has an ETA, 0s at the last step, and ends in the MFU, here %.1f%%, against the FMA peak "
          "printed before the first step", mfu);
}

// ----------------------------------------------------------------------------
// llm.c's outlier guard

static void test_outliers(const char *exe) {
    // the z-score against the window, the new value in it, computed directly
    Outliers d;
    memset(&d, 0, sizeof(d));
    double xs[300], worst = 0.0;
    int nan_until_full = 1;
    for (int i = 0; i < 300; i++) {
        xs[i] = 3.0 + sin(i * 0.37) + (i == 250 ? 5.0 : 0.0);
        double z = outlier_zscore(&d, xs[i]);
        if (i < OUTLIER_WINDOW) { nan_until_full &= isnan(z); continue; }
        double mean = 0.0, var = 0.0;
        for (int k = i - OUTLIER_WINDOW + 1; k <= i; k++) mean += xs[k] / OUTLIER_WINDOW;
        for (int k = i - OUTLIER_WINDOW + 1; k <= i; k++) var += (xs[k] - mean) * (xs[k] - mean) / OUTLIER_WINDOW;
        worst = fmax(worst, fabs(z - (xs[i] - mean) / sqrt(var)));
    }
    check(nan_until_full && worst < 1e-9, "z-scores: none until %d values, then (x - mean) / std of the last %d (worst "
          "difference %.1e)", OUTLIER_WINDOW, OUTLIER_WINDOW, worst);
    // the trainer: -sg so small that nearly any step above the window's mean is skipped
    char cmd[2048], out[65536], log[300], shard[300], line[512];
    snprintf(shard, sizeof(shard), "%s/tiny_train.bin", dir);
    snprintf(log, sizeof(log), "%s/sg.jsonl", dir);
    snprintf(cmd, sizeof(cmd), "%s -e dev/fixtures/tiny_model.bin -b 2 -t 16 -x 140 -v 0 -s 0 -th 1 -l 1e-3 -sg 0.01 "
             "-i %s -lg %s", exe, shard, log);
    int rc = test_run(cmd, 1, out, sizeof(out));
    int skipped = 0, early = 0, steps = 0;
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof(line), f)) {
        const char *s = test_log_value(line, "step");
        int step = s != NULL ? atoi(s) : 0;
        if (strstr(line, "\"skipped\": \"norm\"") != NULL) skipped++, early += step < OUTLIER_WINDOW;
        steps++;
    }
    if (f) fclose(f);
    check(rc == 0 && steps == 140 && skipped > 0 && early == 0 && strstr(out, "skipping update due to grad z-score of"),
          "-sg 0.01: %d of the steps after the first %d skip their update (logged \"skipped\", printed as llm.c does), "
          "none before", skipped, OUTLIER_WINDOW);
    // the step line shows the z-scores, as llm.c's does
    snprintf(cmd, sizeof(cmd), "%s -e dev/fixtures/tiny_model.bin -b 2 -t 16 -x 3 -v 0 -s 0 -th 1 -sl 3 -sg 3 -i %s",
             exe, shard);
    rc = test_run(cmd, 1, out, sizeof(out));
    check(rc == 0 && strstr(out, "(+nanz)") != NULL, "with -sl or -sg the step line shows the z-scores (nan until the "
          "window is full)");
}

// the log's steps: each one's loss and norm as printed, and whether -sl or
// -sg skipped its update
#define SKIP_STEPS 140
typedef struct {
    int n;
    char loss[SKIP_STEPS][24], norm[SKIP_STEPS][24];
    int skipped[SKIP_STEPS];
} StepLog;

static void read_step_log(StepLog *s, const char *path) {
    memset(s, 0, sizeof(*s));
    FILE *f = fopen(path, "r");
    char line[512];
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        const char *st = test_log_value(line, "step"), *l = test_log_value(line, "loss"), *m = test_log_value(line, "norm");
        int step = st != NULL ? atoi(st) : -1;
        if (l == NULL || m == NULL || step != s->n || s->n == SKIP_STEPS) continue;  // a line out of order stops the count
        snprintf(s->loss[step], sizeof(s->loss[step]), "%.*s", (int)strcspn(l, ","), l);
        snprintf(s->norm[step], sizeof(s->norm[step]), "%.*s", (int)strcspn(m, ","), m);
        s->skipped[step] = strstr(line, "\"skipped\": ") != NULL;
        s->n++;
    }
    if (f != NULL) fclose(f);
}

// ranks started as llm.c's scripts start them, with none of our flags: by
// mpirun on one box with -o (Open MPI's variables, as mpirun sets them),
// and by llm.c's -pn -pr -pi fs -pf (an srun job's id in the environment),
// on one box and as if across nodes (-pg 1: they meet over TCP). Each trains
// what -np 2 trains, loss for loss, and leaves no meeting directory behind
static void test_mpirun_meets(const char *exe) {
    char cmd[8192], out[65536], flags[2000], shard[300], path[500];
    snprintf(shard, sizeof(shard), "%s/tiny_train.bin", dir);
    const char *model = "-e d2 -ev 256 -et 16 -ec 32 -b 2 -t 16 -x 3 -v 0 -s 0 -th 1";
    snprintf(cmd, sizeof(cmd), "%s %s -i %s -np 2 -o %s/np2", exe, model, shard, dir);
    int rc = test_run(cmd, 1, out, sizeof(out));
    StepLog want, got;
    snprintf(path, sizeof(path), "%s/np2/log.jsonl", dir);
    read_step_log(&want, path);
    if (!check(rc == 0 && want.n == 3, "-np 2: 3 steps (exit %d)", rc)) return;
    struct { const char *name, *env0, *env1, *extra, *out; } runs[] = {
        {"mpirun -np 2 with -o",
         "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=2 "
         "OMPI_MCA_ess_base_jobid=3141",
         "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2 "
         "OMPI_MCA_ess_base_jobid=3141", "", "ompi"},
        {"-pn 2 -pr R -pi fs -pf DIR", "SLURM_JOB_ID=77 SLURM_STEP_ID=0", "SLURM_JOB_ID=77 SLURM_STEP_ID=0",
         "-pi fs -pf %s/sync -pn 2", "fs"},
        {"-pn 2 -pr R -pg 1 -pi fs -pf DIR (nodes: TCP)", "SLURM_JOB_ID=78 SLURM_STEP_ID=0",
         "SLURM_JOB_ID=78 SLURM_STEP_ID=0", "-pi fs -pf %s/sync -pn 2 -pg 1", "fstcp"},
    };
    snprintf(path, sizeof(path), "%s/sync", dir);
    mkdir(path, 0700);
    for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
        char extra[600], o[400];
        snprintf(extra, sizeof(extra), runs[k].extra, dir);
        snprintf(o, sizeof(o), "%s/%s", dir, runs[k].out);
        int fs = runs[k].extra[0] != '\0';
        snprintf(flags, sizeof(flags), "%s -i %s -o %s %s", model, shard, o, extra);
        snprintf(cmd, sizeof(cmd), "(%s timeout 60 %s %s %s > %s/r1.txt 2>&1 & %s timeout 60 %s %s %s 2>&1; a=$?; wait $!; "
                 "exit $((a + $?)))", runs[k].env1, exe, flags, fs ? "-pr 1" : "", dir, runs[k].env0, exe, flags,
                 fs ? "-pr 0" : "");
        rc = test_run(cmd, 1, out, sizeof(out));
        snprintf(path, sizeof(path), "%s/log.jsonl", o);
        read_step_log(&got, path);
        int same = got.n == want.n;
        for (int i = 0; i < got.n && same; i++)
            same = strcmp(got.loss[i], want.loss[i]) == 0 && strcmp(got.norm[i], want.norm[i]) == 0;
        char r1[300], where[400];
        snprintf(r1, sizeof(r1), "%s/r1.txt", dir);
        snprintf(where, sizeof(where), fs ? "%s/sync" : "%s", fs ? dir : o);
        char *r1_out = test_read_text(r1);
        DIR *d = opendir(where);
        int meets = d == NULL;
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) meets += strncmp(e->d_name, "llm3d-rendezvous-", 17) == 0;
        if (d != NULL) closedir(d);
        check(rc == 0 && same && meets == 0 && strstr(out, "x dp 2 = 64 tokens") != NULL,
              "%s: 2 ranks, none of our flags, train what -np 2 trains (exit %d, %d of %d steps, the same losses and "
              "norms: %s), and leave %d meeting directories%s%s", runs[k].name, rc, got.n, want.n, same ? "yes" : "no",
              meets, rc != 0 ? ": " : "", rc != 0 ? test_line_of(strlen(r1_out) ? r1_out : out, "train_gpt2:") : "");
        free(r1_out);
    }
}

// whether DIR_A/ckpt_<step>/name and DIR_B/ckpt_<step2>/name hold the same bytes
static int ckpt_files_same(const char *a, int step_a, const char *b, int step_b, const char *name) {
    char pa[400], pb[400];
    snprintf(pa, sizeof(pa), "%s/ckpt_%08d/%s", a, step_a, name);
    snprintf(pb, sizeof(pb), "%s/ckpt_%08d/%s", b, step_b, name);
    return test_files_same(pa, pb);
}

// an update that -sg skips: it changes nothing, and a resume after it goes on
// as if uninterrupted. A skipped step is where Adam's t (state.bin's adam_t)
// and the step count part: a resume that took t from the step would use the
// wrong bias correction from there on, and an update applied though logged
// as skipped would change the weights and the moments. The windows of -sl
// and -sg start afresh in each launch, so the resumed part must be one that
// skips nothing in the uninterrupted run either: the run is cut after a
// skipped step s that a step not skipped follows, and both runs end before
// the next skip (at `end`; the run of SKIP_STEPS when there is none). Which
// steps skip depends on the last bits of the norms, so it is read from the
// log rather than assumed. The default schedule is constant (-q 1), so -x
// changes no learning rate and a run of fewer steps is the first steps of a
// longer one.
static void test_skip_resume(const char *exe) {
    char cmd[2048], out[65536], shard[300], a[300], p[300], path[400];
    snprintf(shard, sizeof(shard), "%s/tiny_train.bin", dir);
    snprintf(a, sizeof(a), "%s/skip_whole", dir);
    snprintf(p, sizeof(p), "%s/skip_cut", dir);
    const char *flags = "-e dev/fixtures/tiny_model.bin -b 2 -t 16 -v 0 -s 0 -th 1 -l 1e-3 -sg 0.01 -nk 0";
    // the whole run, with a checkpoint at its end
    snprintf(cmd, sizeof(cmd), "%s %s -i %s -x %d -n %d -o %s", exe, flags, shard, SKIP_STEPS, SKIP_STEPS, a);
    int rc = test_run(cmd, 1, out, sizeof(out));
    static StepLog whole, resumed;
    read_step_log(&whole, test_path(path, sizeof(path), a, "log.jsonl"));
    int s = -1, end = SKIP_STEPS;
    for (int i = whole.n - 2; i >= 0 && s < 0; i--) if (whole.skipped[i] && !whole.skipped[i + 1]) s = i;
    for (int i = s + 2; s >= 0 && i < whole.n && end == SKIP_STEPS; i++) if (whole.skipped[i]) end = i;
    if (!check(rc == 0 && whole.n == SKIP_STEPS && s >= 128,
               "-sg 0.01, %d steps: step %d's update is the last skipped one with one applied after it, after the "
               "window of 128 steps (exit %d)", whole.n, s, rc)) {
        printf("%s\n", out);
        return;
    }
    if (end < SKIP_STEPS) {  // the uninterrupted run ends before the next skip too
        snprintf(a, sizeof(a), "%s/skip_whole_%d", dir, end);
        snprintf(cmd, sizeof(cmd), "%s %s -i %s -x %d -n %d -o %s", exe, flags, shard, end, end, a);
        rc = test_run(cmd, 1, out, sizeof(out));
        read_step_log(&whole, test_path(path, sizeof(path), a, "log.jsonl"));
        if (!check(rc == 0 && whole.n == end, "the uninterrupted run of %d steps, before the next skip (exit %d)", end, rc))
            return;
    }
    // the same run cut after step s, with checkpoints before and after it (-n s: after s steps; and after the last, s + 1)
    snprintf(cmd, sizeof(cmd), "%s %s -i %s -x %d -n %d -o %s", exe, flags, shard, s + 1, s, p);
    rc = test_run(cmd, 1, out, sizeof(out));
    if (!check(rc == 0 && test_exists("%s/ckpt_%08d", p, s) && test_exists("%s/ckpt_%08d", p, s + 1),
               "the run cut after step %d: checkpoints after %d and %d steps (exit %d)", s, s, s + 1, rc)) {
        printf("%s\n", out);
        return;
    }
    check(ckpt_files_same(p, s, p, s + 1, "model.bin") && ckpt_files_same(p, s, p, s + 1, "optim.bin"),
          "step %d's skipped update leaves the parameters and AdamW's m, v and t as they were: model.bin and optim.bin "
          "of the checkpoints before and after it are byte-identical", s);
    // resumed from after the skip to the end: the uninterrupted run's losses, norms and bytes
    snprintf(cmd, sizeof(cmd), "%s %s -i %s -x %d -n %d -o %s -y 1", exe, flags, shard, end, end, p);
    rc = test_run(cmd, 1, out, sizeof(out));
    read_step_log(&resumed, test_path(path, sizeof(path), p, "log.jsonl"));
    int differ = -1;
    for (int i = 0; i < end && differ < 0; i++)
        if (i >= resumed.n || strcmp(whole.loss[i], resumed.loss[i]) != 0 || strcmp(whole.norm[i], resumed.norm[i]) != 0 ||
            whole.skipped[i] != resumed.skipped[i])
            differ = i;
    int ok = check(rc == 0 && strstr(out, "resum") != NULL && resumed.n == end && differ < 0,
                   "resumed after the skipped step %d to step %d: the log's %d losses, norms and skips are the "
                   "uninterrupted run's (exit %d, first difference at step %d)", s, end, resumed.n, rc, differ);
    if (!ok) printf("%s\n", test_line_of(out, "train_gpt2:"));
    if (differ >= 0 && differ < resumed.n)
        printf("step %d: loss %s norm %s, uninterrupted %s %s\n", differ, resumed.loss[differ], resumed.norm[differ],
               whole.loss[differ], whole.norm[differ]);
    char ma[400], mp[400];
    snprintf(ma, sizeof(ma), "%s/model_%08d.bin", a, end);
    snprintf(mp, sizeof(mp), "%s/model_%08d.bin", p, end);
    check(test_files_same(ma, mp) && ckpt_files_same(a, end, p, end, "model.bin") &&
          ckpt_files_same(a, end, p, end, "optim.bin"),
          "and its final model and last checkpoint's model.bin and optim.bin are the uninterrupted run's, byte for byte");
}

int main(void) {
    char exe[600];
    if (getcwd(exe, sizeof(exe) - 20) == NULL) return 1;
    strcat(exe, "/train_gpt2");
    if (test_make_dir(dir, sizeof(dir), "/tmp/llm3d_llmc_XXXXXX") != 0) {
        check(0, "mkdtemp");
        return test_summary();
    }
    test_flags();
    test_job_peak();
    test_progress();
    if (access(exe, X_OK) != 0) {
        skip("./train_gpt2 not built");
    } else {
        test_llmc_command(exe);
        test_mpirun(exe);
        test_mpirun_meets(exe);
        test_usage(exe);
        test_eval_only(exe);
        test_gpu_stats_flag(exe);
        test_sample_length(exe);
        test_outliers(exe);
        test_skip_resume(exe);
    }
    test_remove_dir(dir);
    return test_summary();
}
