/*
 * trainer.h: what both trainers' main() do around the training loop, written
 * once. train_gpt2.c and train_gpt2.cu call the same functions in the same
 * order; what differs between them is what the hardware does: building the
 * model, a step, an evaluation, a sample's forward, a checkpoint's writes.
 *
 * defines:
 *   Job                  one run of a trainer: its flags, the model's shape,
 *                        the batch and steps, the checkpoint it resumes, its
 *                        data, tokenizer and log
 *   trainer_name, trainer_start (what each main does first: its name, stdout
 *                        line-buffered), die, die_usage, now_ms, flops_per_token
 *   print_host_collective_times
 *                        rank 0's time per step in the host backend's sums
 *                        and checks (-ic)
 *   before any rank starts (so a bad job is refused once, by the launcher):
 *     parse_flags, check_key_file, parse_fault, check_model, check_batch_and_data,
 *     checkpoint_setup; open_loaders (-i and -j, here and on each rank)
 *   on each rank, after it joined the job:
 *     start_rank, start_mark, start_marks_to_floats, start_marks_from_floats, start_marks_judge, start_marks_refused,
 *     load_params, open_data, open_tokenizer_and_log,
 *     note_idle_checks (-gp, -ck, -ic where the layout leaves them nothing to do),
 *     job_parts, job_shard (a rank's shard with its stage's chunks),
 *     job_pipeline, gpu_stats_due (llm.c's -lg N), step_plan, activation_sets, print_model_and_batch, announce_resume
 *   in the loop: next_batch, evaluate_due, hellaswag_due, sample_due, check_due, checkpoint_due,
 *     Progress, progress_due, progress_start, progress_tick, progress_end (HellaSwag's, as llm.c's),
 *     report_hellaswag, outlier_skip (llm.c's -sl -sg; steps not finite), nonfinite_stop,
 *     tokens_after (the tokens trained on so far, across resumes),
 *     print_not_written, log_write, report_step, print_mfu, checkpoint_state, print_checkpoint_written
 *   after the last step: final_line, report_final, write_done (llm.c's DONE_<steps>)
 *   sampling: random_f32 (xorshift*), sample_token (inverse CDF of the softmax)
 *   at the end: free_job
 *
 * The job's checks on itself between steps, the watch report (-wr) and the
 * consistency check (-ck), are watch.h's.
 *
 * Exit codes: 0 done (or -h), 2 a bad job (flags, files), 1 a failure while
 * running. Every error is one line on stderr that starts with the program's
 * name.
 */
#ifndef LLM3D_TRAINER_H
#define LLM3D_TRAINER_H

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm3d/gpt2.h"
#include "llm3d/flags.h"  // Options, options_parse, TrainerBuild
#include "secure.h"
#include "llm3d/secure/fault.h"  // Fault, fault_parse
#include "llm3d/checkpoint.h"
#include "dataloader.h"
#include "llm3d/tokenizer.h"
#include "llm3d/hellaswag.h"
#include "parallel.h"

typedef struct {
    Options opt;
    Fault fault;             // -fault, for the ranks' communicators
    int checks_built;        // the trainer acts on -fault corrupt, corrupt-low, poison, corrupt-sum (TrainerBuild's checks)
    int nccl_built;          // its ranks talk over NCCL unless -hb 1 (TrainerBuild's nccl)
    GPT2Config config;       // the model's shape
    int random_init;         // 1: -e is a descriptor (the seeded init); 0: a model file
    int init_sealed;         // -e's model file is sealed (-enc 2's final model)
    uint64_t init_file_id;   // its sealed header's file id, read at the start: each rank loads from that file
    Grid layout;             // the layout of -np -tp -pp, checked before any rank starts
    int accum;               // micro-batches per optimizer step on each data-parallel rank
    long total_batch;        // tokens per optimizer step, all ranks together
    int steps, start;        // the run's optimizer steps; the first one this launch does
    long start_tokens;       // the tokens trained on before step `start`: the checkpoint's (tokens_after)
    // the checkpoint key, and the checkpoint this launch resumes from
    uint8_t ckpt_key[32];
    int out_fd;              // -o, opened once at the start and held: everything in it is done relative to it
    int resuming;
    CkptState ck;
    char ck_dir[800];        // -o is at most 700 bytes
    double load_t0, verify_ms;  // when the checkpoint setup began; its verification's time
    DataLoader train, val;
    int data_open;           // train and val are open already: check_batch_and_data's, kept (dp 1, not a launcher)
    int have_val, have_tok;  // an evaluation every -v steps; samples every -s steps
    int val_batches;         // val batches per data-parallel rank per evaluation (-m, at most the split's)
    HsSet hs;                // -h 1: the HellaSwag examples
    int have_hs;
    Tokenizer tok;
    FILE *logf;              // rank 0's JSON-lines log, or NULL
    char log_path[1100];     // its name, for the line that says a write to it failed
    double loop_t0;          // when this launch's first step began (report_step's ETA)
    uint64_t sample_rng;     // xorshift* state, saved in checkpoints
} Job;

// "train_gpt2" or "train_gpt2cu": each main sets it first (trainer_start); every error line starts with it
static const char *trainer_name = "train_gpt2";

// what each main does first, before anything is printed: its name for the
// error lines, and stdout line-buffered. Into a file or a pipe stdout would
// be fully buffered, and a run that a signal ends (timeout, kill, a
// scheduler: without -o none is caught) would lose every line printed since
// the last flush, such as the FMA peak and the first val loss of a run
// killed in its first step. The ranks of a launcher are this program again,
// on the stdout they inherit, so theirs is line-buffered too.
static void trainer_start(const char *name) {
    trainer_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0);
}

static void die(int status, const char *msg) {
    fprintf(stderr, "%s: %s\n", trainer_name, msg);
    exit(status);
}

static void die_usage(const char *msg) { die(2, msg); }

// print_host_collective_times: what the host backend's collectives cost
// this rank (rank 0 calls it), per step of the `steps` trained: with -ic 1
// its sketches made in passes of their own, the records' all-gathers and the
// verdicts, and its reducing receives' passes, which make the sums with or
// without the checks and the sketches with them; with -ic 0 those passes
// alone (dev/bench_ic.sh: the checks cost the first plus the second less
// its -ic 0 figure). Nothing where nothing was timed.
static void print_host_collective_times(const Comm *c, int steps) {
    if (c == NULL || steps <= 0) return;
    if (comm_check_ms(c) > 0)
        printf("checked collectives: %.2f ms per step on rank 0 in the checks' own passes, records and verdicts; "
               "%.2f ms in its reducing receives' sums, sketched in the same pass\n", comm_check_ms(c) / steps,
               comm_sum_ms(c) / steps);
    else if (comm_sum_ms(c) > 0)
        printf("unchecked collectives: %.2f ms per step on rank 0 in its reducing receives' sums\n", comm_sum_ms(c) / steps);
    fflush(stdout);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// FLOPs per token for forward + backward: 6 per parameter (lm_head included,
// position embeddings excluded), plus attention's 6 * L * T * C (causal half of 12)
static double flops_per_token(const GPT2Config *c, int T) {
    double n = (double)param_count(c) - (double)c->maxT * c->C;
    return 6.0 * n + 6.0 * c->L * (double)T * c->C;
}

// ----------------------------------------------------------------------------
// the job, checked before any rank starts

// how the ranks of an outside launch meet without --rendezvous: llm.c's
// multi-node flags and -o (launcher.h's meet_plan)
static LaunchMeet job_meet(const Options *o) {
    LaunchMeet m;
    memset(&m, 0, sizeof(m));
    m.out_dir = o->out_dir;
    m.procs = o->llmc_procs;
    m.rank = o->llmc_rank;
    m.gpus = o->llmc_gpus;
    m.init = o->llmc_init == PI_TCP ? MEET_TCP : o->llmc_init == PI_FS ? MEET_FS : MEET_MPI;
    m.fs_path = o->llmc_fs_path;
    m.server = o->llmc_server;
    return m;
}

// --key-file, read once before anything else reads it (the rendezvous, the
// launcher, the checkpoints, sealed shards and models each read it again),
// so that a missing or unsafe file is refused in a line that names the flag
static void check_key_file(const Options *o) {
    char err[2048];
    uint8_t key[32];
    if (o->key_file == NULL) return;
    int rc = key_read_file(o->key_file, key, err, sizeof(err));
    secure_wipe(key, sizeof(key));
    if (rc == 0) return;
    flag_file_error(err, sizeof(err), "--key-file", "the job key", "key file");
    die_usage(err);
}

// the flags (flags.h's table; more_usage: the trainer's own lines for -h;
// build: what llm.c's -a -f -w -ge -nm may say), and the job's world: the
// ranks of mpirun/srun/torchrun when they started us
static void parse_flags(Job *job, int argc, char **argv, const char *more_usage, const TrainerBuild *build) {
    char err[2048];
    memset(job, 0, sizeof(*job));
    options_defaults(&job->opt);
    int rc = options_parse(&job->opt, argc, argv, err, sizeof(err));
    if (rc == 1) {
        options_usage(stdout, argv[0]);
        fputs(more_usage, stdout);
        exit(0);
    }
    if (rc != 0 || options_check_build(&job->opt, build, err, sizeof(err)) != 0) die_usage(err);
    job->checks_built = build->checks;
    job->nccl_built = build->nccl;
    if (job->opt.ckpt_keep == 0) job->opt.ckpt_keep = INT_MAX;  // -nk 0: keep them all, as llm.c's
    // from here on a signal asks for a checkpoint (with -o), and a full disk
    // fails a write (and says so) instead of killing the process
    if (job->opt.out_dir) ckpt_catch_signals();
    signal(SIGXFSZ, SIG_IGN);
    check_key_file(&job->opt);
    // the job's world: an outside launcher's (mpirun, srun, torchrun), checked against -np, -pn and the way
    // its ranks meet (a rank started without --rendezvous or -o is refused here, once), or -np
    LaunchMeet meet = job_meet(&job->opt);
    int world = parallel_world(job->opt.np, job->opt.rendezvous, job->opt.key_file, &meet, err, sizeof(err));
    if (world < 0) die_usage(err);
    job->opt.np = world;
}

// -fault, its rank one of the job's (the launcher refuses it, not the ranks)
static void parse_fault(Job *job) {
    char err[2048];
    if (job->opt.fault && fault_parse(job->opt.fault, &job->fault, err, sizeof(err)) != 0) die_usage(err);
    if (fault_check_world(&job->fault, job->opt.np, err, sizeof(err)) != 0) die_usage(err);
    int k = job->fault.kind;
    int corrupts = k == FAULT_CORRUPT || k == FAULT_CORRUPT_LOW || k == FAULT_CORRUPT_SUM;
    if ((corrupts || k == FAULT_POISON) && !job->checks_built) {
        snprintf(err, sizeof(err), "-fault %s: %s does not act on this fault yet (the CPU trainer does)", job->opt.fault,
                 trainer_name);
        die_usage(err);
    }
    // poison is for the gradient-norm rule, which compares data-parallel
    // peers, and corrupt for a collective: a job without them would report
    // the fault and show nothing of it (a bad layout is check_model's)
    int tpp = job->opt.tp * job->opt.pp, dp = tpp > 0 ? job->opt.np / tpp : 0;
    if (k == FAULT_POISON && tpp > 0 && dp < 2) {
        snprintf(err, sizeof(err), "-fault %s: dp is %d (-np %d, -tp %d, -pp %d): no data-parallel peers for the "
                 "gradient-norm rule to compare the rank with", job->opt.fault, dp, job->opt.np, job->opt.tp, job->opt.pp);
        die_usage(err);
    }
    if (corrupts && job->opt.np < 2) {
        snprintf(err, sizeof(err), "-fault %s: -np %d runs no collective for it to corrupt", job->opt.fault, job->opt.np);
        die_usage(err);
    }
    // NCCL adds inside its own kernels, where no rank's addition can be
    // reached; the host backend's ranks make their sums themselves
    if (k == FAULT_CORRUPT_SUM && job->nccl_built && job->opt.host_backend != 1) {
        snprintf(err, sizeof(err), "-fault %s: %s sums over NCCL, inside NCCL's kernels, where no rank's addition can "
                 "be reached; -hb 1 runs its ranks on the host backend, whose sums it acts on", job->opt.fault,
                 trainer_name);
        die_usage(err);
    }
}

// the model's shape from -e (a descriptor, or a model file's header, sealed
// or not), -t against its maxT, the layout against the model, and -sp
// against -tp and the micro-batch. A sealed file is opened once here, a
// plain one twice (the first open finds it is not sealed).
static void check_model(Job *job) {
    char err[2048];
    const Options *o = &job->opt;
    const GPT2Config *c = &job->config;
    job->init_sealed = 0;
    int rc = options_descriptor(o, &job->config, err, sizeof(err));  // -e dN, -ev -et -ec
    if (rc == 0) rc = ckpt_init_config(o, &job->config, &job->init_sealed, &job->init_file_id, err, sizeof(err));
    if (rc == 0 && !job->init_sealed) rc = options_model_file(o, &job->config, err, sizeof(err));
    if (rc < 0) flag_file_error(err, sizeof(err), "-e", "the model to start from", "model file");
    if (rc < 0) die_usage(err);
    if (rc == 0 && options_shape_flags_match(o, c, err, sizeof(err)) != 0) die_usage(err);
    job->random_init = rc;
    if (o->T > c->maxT) {
        snprintf(err, sizeof(err), "flag -t: T = %d exceeds the model's maxT = %d (%s)", o->T, c->maxT, o->init);
        die_usage(err);
    }
    if (grid_init(&job->layout, o->np, o->tp, o->pp, 0, err, sizeof(err)) != 0) die_usage(err);
    if (grid_check_model(&job->layout, c->L, c->NH, c->C, c->Vp, err, sizeof(err)) != 0) die_usage(err);
    // -sp 1 splits each micro-batch's B*T positions into tp blocks of rows, one a tp rank
    if (o->sp && job->layout.tp == 1) {
        snprintf(err, sizeof(err), "flag -sp 1: sequence parallelism splits the positions among the tensor-parallel "
                 "ranks, and -tp is 1");
        die_usage(err);
    }
    if (o->sp && (long)o->B * o->T % job->layout.tp != 0) {
        snprintf(err, sizeof(err), "flag -sp 1: the B*T = %d*%d = %ld positions of a micro-batch do not split into "
                 "-tp %d equal blocks", o->B, o->T, (long)o->B * o->T, job->layout.tp);
        die_usage(err);
    }
}

// -h 1: the HellaSwag file, -hf or llm.c's path. Like llm.c, a run without
// the file at the default path goes on without HellaSwag (and says so, when
// chatty); a file that -hf names must be there. It runs with the
// evaluations, so -v 0 turns it off too.
static void open_hellaswag(Job *job, int chatty) {
    char err[2048];
    const Options *o = &job->opt;
    const char *path = o->hellaswag_file != NULL ? o->hellaswag_file : HS_DEFAULT_FILE;
    job->have_hs = 0;
    if (!o->hellaswag) return;
    if (o->val_every == 0) {
        if (chatty) printf("note: flag -h 1: HellaSwag runs with the evaluations, and -v 0 turns them off\n");
        return;
    }
    if (o->hellaswag_file == NULL && access(path, F_OK) != 0) {
        if (chatty)
            printf("note: flag -h 1: no HellaSwag file at %s, so no HellaSwag in this run; make it with "
                   "./prepare_data hellaswag (doc/llmc.md) or give -hf\n", path);
        return;
    }
    if (hs_read(&job->hs, path, job->config.V, o->T, o->B, err, sizeof(err)) != 0) {
        flag_file_error(err, sizeof(err), "-hf", "the HellaSwag examples", "HellaSwag file");
        die_usage(err);
    }
    job->have_hs = 1;
}

// data_hint: err, the loaders' error, with how to make the default data
// when a pattern that matched nothing is the default one: where the first
// run in a fresh clone ends
static void data_hint(const Options *o, char *err, size_t errlen) {
    Options d;
    options_defaults(&d);
    int default_data = (strcmp(o->train_pattern, d.train_pattern) == 0 && strstr(err, d.train_pattern) != NULL) ||
                       (strcmp(o->val_pattern, d.val_pattern) == 0 && strstr(err, d.val_pattern) != NULL);
    size_t n = strlen(err);
    if (!default_data || strstr(err, "no files match") == NULL || n + 1 >= errlen) return;
    snprintf(err + n, errlen - n, "; this default data is made by ./prepare_data -i tinyshakespeare.txt -o "
             "dev/data/tinyshakespeare -n tiny_shakespeare (make run fetches the text, into dev/data/quickstart), "
             "or give -i and -j (make run's: -i 'dev/data/quickstart/tiny_train_*.bin' -j "
             "'dev/data/quickstart/tiny_val_*.bin' -tk dev/data/quickstart/tiny_tokenizer.bin)");
}

// the key of encrypted shards (prepare_data --key-file): --key-file's, read
// into key; NULL without the flag, and then a sealed shard is refused naming it
static const uint8_t *data_key(const Options *o, uint8_t key[32]) {
    char err[1024];
    if (o->key_file == NULL) return NULL;
    if (key_read_file(o->key_file, key, err, sizeof(err)) != 0) {  // changed since check_key_file read it
        flag_file_error(err, sizeof(err), "--key-file", "the job key", "key file");
        die_usage(err);
    }
    return key;
}

// the train stream and, with -v above 0, the val stream, as data-parallel
// rank dp_rank of dp reads them; 0, or -1 with err led by the flag
static int open_loaders(Job *job, int dp_rank, int dp, char *err, size_t errlen) {
    const Options *o = &job->opt;
    int V = job->config.V;
    uint8_t key_bytes[32];
    const uint8_t *key = data_key(o, key_bytes);
    int rc = dataloader_init_key(&job->train, o->train_pattern, o->B, o->T, dp_rank, dp, o->shuffle,
                                 (uint64_t)o->seed, V, key, err, errlen);
    if (rc != 0) flag_file_error(err, errlen, "-i", "the train data", NULL);
    job->have_val = o->val_every > 0;
    if (rc == 0 && job->have_val) {
        rc = dataloader_init_key(&job->val, o->val_pattern, o->B, o->T, dp_rank, dp, 0, 0, V, key, err, errlen);
        if (rc != 0) flag_file_error(err, errlen, "-j", "the val data", NULL);
        if (rc != 0) dataloader_free(&job->train);
    }
    secure_wipe(key_bytes, sizeof(key_bytes));
    return rc;
}

// the batch against the job's data-parallel size, and the data: both
// streams open with this B and T and hold tokens below the model's V. With
// dp 1 every rank reads the whole of both streams, so the loaders opened
// for the check are the ones open_data would open: a rank keeps them, and
// each shard is read, hashed and (sealed) decrypted once, not twice. A
// launcher (-np above 1 without --rendezvous) frees them: it only waits for
// its ranks, which open their own, and holding the data key is no use to it.
static void check_batch_and_data(Job *job) {
    char err[2048];
    const Options *o = &job->opt;
    int dp = job->layout.dp;
    int accum = batch_accum(o, dp, err, sizeof(err));
    if (accum < 0) die_usage(err);
    if (pipeline_validate((PipeSchedule)o->pipe_schedule, o->pp, accum, o->pipe_chunks, job->config.L, err, sizeof(err)) != 0)
        die_usage(err);
    if (parallel_launched_rank()) return;  // its launcher opened (and hashed) the data just now
    int rc = open_loaders(job, 0, dp, err, sizeof(err));
    if (rc != 0) data_hint(o, err, sizeof(err));
    if (rc != 0) die_usage(err);
    LaunchMeet meet = job_meet(o);
    int launcher = parallel_will_launch(o->np, o->rendezvous, o->key_file, &meet);
    job->data_open = dp == 1 && !launcher;
    if (!job->data_open) {
        dataloader_free(&job->train);
        if (job->have_val) dataloader_free(&job->val);
    }
    open_hellaswag(job, 0);
    if (job->have_hs) hs_free(&job->hs);
}

// whether this process is the one that holds -o's lock for the job: a
// single process, our launcher (its ranks run inside its hold), or rank 0 of
// an outside launch (mpirun, srun, torchrun, or llm.c's -pn -pr), whether
// its ranks meet through --rendezvous or in -o
static int holds_out_lock(const Options *o) {
    if (parallel_launched_rank()) return 0;
    Launch L;
    char err[512];
    memset(&L, 0, sizeof(L));
    LaunchMeet meet = job_meet(o);
    return meet_outside_rank(&L, &meet, err, sizeof(err)) != 1 || L.rank == 0;
}

// -o opened and held (job->out_fd), its lock taken by the process that
// holds it for the job (holds_out_lock; a rank of our launcher checks that
// its launcher holds it), the checkpoint key and, with -y or -ys, the
// checkpoint to resume from, chosen only under that lock (checkpoint.h's
// ckpt_setup), verified before any rank starts so that a bad one is refused
// once; the step and the sampling RNG to start from. A second job on the
// same -o is refused at once (exit 1), naming the lock's holder.
static void checkpoint_setup(Job *job) {
    char err[2048];
    job->load_t0 = now_ms();
    const char *launcher = getenv("LLM3D_LAUNCHER_PID");
    // the launcher hashes the files; the ranks it starts moments later check the seal and the sizes
    int rc = ckpt_setup(&job->opt, &job->config, !parallel_launched_rank(), holds_out_lock(&job->opt),
                        launcher != NULL ? atol(launcher) : 0, &job->out_fd, job->ckpt_key, &job->ck, job->ck_dir,
                        sizeof(job->ck_dir), err, sizeof(err));
    if (rc == -2) die(1, err);
    if (rc < 0) die_usage(err);
    job->verify_ms = now_ms() - job->load_t0;
    job->resuming = rc;
    job->start = job->resuming ? job->ck.step : 0;
    job->start_tokens = job->resuming ? (long)job->ck.tokens : 0;
    job->sample_rng = job->resuming ? job->ck.sample_rng : (uint64_t)job->opt.seed * 2654435761ull + 1;
}

// ----------------------------------------------------------------------------
// this rank's run, once it has its place g in the job

// the batch for the layout the ranks joined (an outside launcher's world
// may differ from -np)
static void start_rank(Job *job, const Grid *g) {
    char err[2048];
    job->accum = batch_accum(&job->opt, g->dp, err, sizeof(err));
    if (job->accum < 0) die_usage(err);
    job->total_batch = (long)job->opt.B * job->opt.T * g->dp * job->accum;
}

// What a rank starts from, as its own start-up checks found it: its start
// mark, START_MARK_WORDS words. The checkpoint's step + 1 when it resumes
// (else 0); then what -e gave it: 0 the seeded init, 1 a plain model file,
// 2 a sealed one; and an id: the checkpoint's (CkptState's id, from its
// manifest), or the sealed file's, else 0. Each rank checks on its own, so a
// file swapped or a checkpoint removed between two ranks' checks, or ranks
// on two nodes finding different checkpoints of the same step (one node's
// left from an earlier run), would have them load parts of different models,
// or one rank wait at a collective the other never joins; the ranks compare
// their marks once they are connected. A plain file has no id, so one plain
// model swapped for another is not caught: a plain file is not authenticated
// anyway. After those START_FILE_WORDS come the flags' words (flags.h's
// options_mark): the ranks of an outside launcher are started one by one,
// and one given another -b or -x would train something else than its peers.
// Paths are compared as given; -o also passes where the directories held
// open are one (START_DIR_WORD): by its path, as ranks on several nodes name
// a shared directory (mounts that number inodes their own way differ there),
// or by its inode, as a rank given -o's new name after a rename.
// Last, START_DIR_WORD: the inode of the -o directory this rank holds open
// (0 without -o), so that a rank given -o's new name after a rename is
// still the same job (start_marks_refused takes -o as equal where the
// inodes are).
enum { START_FILE_WORDS = 3, START_DIR_WORD = START_FILE_WORDS + NUM_OPTIONS, START_MARK_WORDS = START_DIR_WORD + 1 };

static void start_mark(const Job *job, uint64_t *mark) {
    mark[0] = job->resuming ? (uint64_t)job->ck.step + 1 : 0;
    mark[1] = job->resuming || job->random_init ? 0 : job->init_sealed ? 2 : 1;
    mark[2] = job->resuming ? job->ck.id : mark[1] == 2 ? job->init_file_id : 0;
    options_mark(&job->opt, mark + START_FILE_WORDS);
    struct stat st;
    mark[START_DIR_WORD] = job->out_fd >= 0 && fstat(job->out_fd, &st) == 0 ? (uint64_t)st.st_ino | 1ull << 63 : 0;
}

// start_marks_to_floats, start_marks_from_floats: the host backend gathers
// the marks as floats, and the checked collectives (-ic 1) sketch floats as
// numbers. A word's raw bits read as floats can be NaN or 1e38, in whose
// sums a changed word vanishes, so each of n words travels as
// START_MARK_FLOATS whole numbers below 2^24 (bits 0-23, 24-47, 48-63),
// every bit of it seen by the sketches. A piece that is no such number (the
// gather's data damaged where no check ran) reads as 2^24 - 1.
enum { START_MARK_FLOATS = 3 };

static void start_marks_to_floats(const uint64_t *w, size_t n, float *f) {
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < START_MARK_FLOATS; k++) f[START_MARK_FLOATS * i + k] = (float)((w[i] >> (24 * k)) & 0xFFFFFF);
}

static void start_marks_from_floats(const float *f, size_t n, uint64_t *w) {
    for (size_t i = 0; i < n; i++) {
        w[i] = 0;
        for (int k = 0; k < START_MARK_FLOATS; k++) {
            float v = f[START_MARK_FLOATS * i + k];
            uint64_t piece = v >= 0.0f && v < 16777216.0f ? (uint64_t)v : 0xFFFFFF;
            w[i] |= piece << (24 * k);
        }
    }
}

static void start_mark_describe(const uint64_t *mark, const char *init, char *out, size_t outlen) {
    if (mark[0] > 0)
        snprintf(out, outlen, "the checkpoint of step %llu, id %016llx", (unsigned long long)(mark[0] - 1),
                 (unsigned long long)mark[2]);
    else if (mark[1] == 2) snprintf(out, outlen, "%s, file id %016llx", init, (unsigned long long)mark[2]);
    else if (mark[1] == 1) snprintf(out, outlen, "%s, a plain model file", init);
    else snprintf(out, outlen, "the seeded init of %s", init);
}

// start_marks_judge: marks holds every rank's start mark, in rank order,
// stride words apart; their first START_FILE_WORDS are judged. Returns the
// number of ranks whose files are not rank 0's, the same on every rank; when
// this rank's are, err says what each started from (else err is empty).
static int start_marks_judge(const char *init, const uint64_t *marks, size_t stride, int world, int rank, char *err,
                             size_t errlen) {
    enum { W = START_FILE_WORDS };
    int differ = 0;
    err[0] = '\0';
    for (int r = 1; r < world; r++) differ += memcmp(marks + r * stride, marks, W * sizeof(uint64_t)) != 0;
    if (memcmp(marks + rank * stride, marks, W * sizeof(uint64_t)) != 0) {
        char mine[1200], first[1200];
        start_mark_describe(marks + rank * stride, init, mine, sizeof(mine));
        start_mark_describe(marks, init, first, sizeof(first));
        errorf(err, errlen, "rank %d starts from %s, but rank 0 from %s: a file changed between the ranks' "
               "start-up checks", rank, mine, first);
    }
    return differ;
}

// after the ranks gathered their start marks: 1 when they disagree, with
// this rank's line printed if its mark is one that differs; else 0
static int start_marks_refused(const Job *job, uint64_t *marks, int world, int rank) {
    char err[3000];
    // -o named otherwise but the same directory (its inode) is the same -o
    for (int i = 0; i < NUM_OPTIONS; i++) {
        if (strcmp(option_specs[i].flag, "-o") != 0) continue;
        for (int r = 1; r < world; r++) {
            uint64_t *m = marks + (size_t)r * START_MARK_WORDS;
            if (m[START_DIR_WORD] != 0 && m[START_DIR_WORD] == marks[START_DIR_WORD])
                m[START_FILE_WORDS + i] = marks[START_FILE_WORDS + i];
        }
    }
    // the flags first: ranks given another -e start from other files too, and the flag is the cause
    if (options_marks_judge(&job->opt, marks + START_FILE_WORDS, START_MARK_WORDS, world, rank, err, sizeof(err)) == 0 &&
        start_marks_judge(job->opt.init, marks, START_MARK_WORDS, world, rank, err, sizeof(err)) == 0)
        return 0;
    if (err[0] != '\0') fprintf(stderr, "%s: %s\n", trainer_name, err);
    fflush(stderr);
    return 1;
}

// the model parts (pipeline.h's pipeline_part) that stage pp_rank's chunks
// hold under the job's schedule, in parts[]; returns the chunks (V)
static int job_parts(const Options *o, int pp, int pp_rank, int *parts) {
    PipeLayout pl = pipe_layout((PipeSchedule)o->pipe_schedule, pp, 1, o->pipe_chunks);
    for (int k = 0; k < pl.V; k++) parts[k] = pipeline_part(&pl, pp_rank, k);
    return pl.V;
}

// this rank's shard of the model: its grid place and its stage's chunks
static Shard job_shard(const Job *job, const Grid *g) {
    Shard s = shard_for(&job->config, g->tp, g->tp_rank, g->pp, g->pp_rank, g->dp, g->dp_rank);
    int parts[SHARD_MAXV];
    shard_set_chunks(&s, &job->config, job_parts(&job->opt, g->pp, g->pp_rank, parts), parts);
    return s;
}

// the parameters: from the checkpoint being resumed, from -e's model file
// (plain, or sealed by -enc 2), or NULL for the seeded init of -e's
// descriptor. Of a sealed file (checkpoint.h's ckpt_model_load_part and
// ckpt_init_load) only what this rank's part of the model g reads is
// decrypted.
static float *load_params(Job *job, const Grid *g) {
    char err[2048], path[1024];
    if (!job->resuming && job->random_init) return NULL;
    float *params = NULL;
    if (!job->resuming && !job->init_sealed) {
        params = model_load(job->opt.init, &job->config, err, sizeof(err));
        if (params == NULL) flag_file_error(err, sizeof(err), "-e", "the model to start from", "model file");
        if (params == NULL) die_usage(err);
        return params;
    }
    Shard s = job_shard(job, g);
    UnitTable ut;
    if (unit_table(&ut, &job->config, &s, 1) != 0) die(1, "out of memory for the unit table");
    if (job->resuming) {
        snprintf(path, sizeof(path), "%s/model.bin", job->ck_dir);
        params = ckpt_model_load_part(path, job->ckpt_key, &job->config, &s, &ut, err, sizeof(err));
    } else {
        params = ckpt_init_load(&job->opt, &job->config, job->init_file_id, &s, &ut, err, sizeof(err));
        if (params == NULL) flag_file_error(err, sizeof(err), "-e", "the model to start from", "model file");
    }
    free(ut.units);
    if (params == NULL) die_usage(err);
    return params;
}

// this rank's slices of the train and val streams (the tp and pp ranks of a
// replica read the same), where the checkpoint left the train stream, and
// the run's steps: -x, or one epoch
static void open_data(Job *job, const Grid *g) {
    char err[2048];
    const Options *o = &job->opt;
    // dp 1 kept check_batch_and_data's loaders, which are these
    if (!job->data_open && open_loaders(job, g->dp_rank, g->dp, err, sizeof(err)) != 0) die_usage(err);
    // -m: llm.c's val_max_steps, batches per rank; never more than the split
    // holds, so that no val token is counted twice
    if (job->have_val) {
        long whole = dataloader_batches_per_epoch(&job->val);
        if (whole < 1) {
            errorf(err, sizeof(err), "flag -j: %s holds fewer than one batch of B*T = %d tokens per data-parallel rank "
                   "(dp %d)", o->val_pattern, o->B * o->T, g->dp);
            die_usage(err);
        }
        job->val_batches = o->val_batches < 0 || o->val_batches > whole ? (int)whole : o->val_batches;
    }
    open_hellaswag(job, g->rank == 0);
    if (g->rank == 0) {  // once per job: the check before launch warned nobody
        fputs(dataloader_warnings(&job->train), stderr);
        if (job->have_val) fputs(dataloader_warnings(&job->val), stderr);
    }
    DataLoaderState pos = {job->ck.data[0], job->ck.data[1], job->ck.data[2], job->ck.data[3]};
    if (job->resuming && dataloader_set_state(&job->train, &pos, err, sizeof(err)) != 0) die_usage(err);
    // -x 0 evaluates only, as in llm.c; one epoch is at least one step
    job->steps = o->steps >= 0 ? o->steps : (int)(dataloader_batches_per_epoch(&job->train) / job->accum);
    if (o->steps < 0 && job->steps < 1) job->steps = 1;
    if (job->resuming && job->ck.step > job->steps) {
        errorf(err, sizeof(err), "flag -x: %d steps, but checkpoint %s is of step %d", job->steps, job->ck_dir,
               job->ck.step);
        die_usage(err);
    }
}

// the tokenizer, when this run prints samples (one-rank runs only), and on
// rank 0 the JSON-lines log: -lg's path, else log.jsonl in -o, opened,
// trimmed and renamed relative to -o held open (job->out_fd), never by -o's
// path again; a resumed run keeps the lines of the steps before its
// checkpoint
static void open_tokenizer_and_log(Job *job, const Grid *g) {
    char err[2048], in_dir[1024];
    const Options *o = &job->opt;
    job->have_tok = o->tokenizer != NULL && o->sample_every > 0 && g->world == 1;
    if (job->have_tok && tokenizer_load_bin(&job->tok, o->tokenizer, err, sizeof(err)) != 0) {
        flag_file_error(err, sizeof(err), "-tk", "the tokenizer for samples", NULL);
        die_usage(err);
    }
    if (g->rank == 0 && job->have_tok && o->gen_tokens > o->T)  // sample() stops at T: the model reads T positions
        printf("note: flag -g %d: a sample is at most -t %d tokens here (the model reads T positions at a time), so "
               "each is %d tokens\n", o->gen_tokens, o->T, o->T);
    if (g->rank == 0 && o->sample_every > 0 && !job->have_tok) {  // (llm.c samples token ids without a tokenizer)
        if (o->tokenizer == NULL) printf("note: flag -s: no samples without a tokenizer .bin (-tk)\n");
        else printf("note: flag -tk: samples are printed by one-rank runs only; none in this run of %d ranks\n", g->world);
    }
    if (g->rank != 0 || (o->log_file == NULL && o->out_dir == NULL)) return;
    const char *path = o->log_file, *name = o->log_file;
    int dfd = AT_FDCWD;
    if (path == NULL) {
        snprintf(in_dir, sizeof(in_dir), "%s/log.jsonl", o->out_dir);
        path = in_dir;
        name = "log.jsonl";
        dfd = job->out_fd;
    }
    if (job->resuming && log_keep_before(dfd, name, path, job->ck.step, err, sizeof(err)) != 0) die_usage(err);
    snprintf(job->log_path, sizeof(job->log_path), "%s", path);
    const char *mode = job->resuming ? "a" : "w";
    // the log, in -o or at -lg's path, is never reached through a link: one
    // planted there would have the trainer append to, or truncate, its target
    job->logf = fopen_nofollow_at(dfd, name, path, mode, err, sizeof(err));
    if (job->logf == NULL) {
        char why[sizeof(err)];
        snprintf(why, sizeof(why), "%s", err);
        if (o->log_file != NULL) errorf(err, sizeof(err), "flag -lg: %s", why);
        die_usage(err);
    }
}

// -gp skip|stop, -ck K and -ic 1 where the job gives them nothing to act
// on: one note each on rank 0, at the start; the run is otherwise the one
// asked for. The gradient-norm rule and the consistency check compare
// data-parallel replicas, so with dp 1 neither ever acts, whatever tp and
// pp are. The checked collectives cover every all-reduce, reduce-scatter
// and all-gather of every group of two or more ranks: tensor parallel's,
// and the world's of each step's norm and loss, so any job of two ranks or
// more has some, and only a job of one rank has none.
static void note_idle_checks(const Job *job, const Grid *g) {
    const Options *o = &job->opt;
    if (g->rank != 0) return;
    if (o->grad_policy != GP_WARN && g->dp == 1)
        printf("note: flag -gp %s: the gradient-norm rule compares data-parallel replicas, and this job has one (dp "
               "1), so it never acts\n", o->grad_policy == GP_SKIP ? "skip" : "stop");
    if (o->check_every > 0 && g->dp == 1)
        printf("note: flag -ck %d: the consistency check compares data-parallel replicas, and this job has one (dp "
               "1), so it never runs\n", o->check_every);
    if (o->check_collectives == 1 && g->world == 1)
        printf("note: flag -ic 1: a job of one rank runs no collective, so there is nothing to check\n");
}

// the step's pipeline (pipeline.h) from -ps, -pp and the micro-batches per step
static PipeLayout job_pipeline(const Options *o, int pp, int accum) {
    return pipe_layout((PipeSchedule)o->pipe_schedule, pp, accum, o->pipe_chunks);
}

// -lg N: GPU stats after every N steps (llm.c's -lg); train_gpt2cu prints them
static int gpu_stats_due(const Job *job, int step) {
    return job->opt.gpu_stats_every > 0 && (step + 1) % job->opt.gpu_stats_every == 0;
}


// this stage's forwards and backwards of one step in the order of the
// pipeline schedule, each with the messages around it (pipeline.h's
// pipeline_plan); *n of them
static PipeStep *step_plan(const Job *job, const Grid *g, int *n) {
    PipeLayout pl = job_pipeline(&job->opt, g->pp, job->accum);
    PipeOp *ops = (PipeOp *)calloc((size_t)pipeline_ops(&pl), sizeof(PipeOp));
    PipeStep *plan = (PipeStep *)calloc((size_t)pipeline_plan_max(&pl), sizeof(PipeStep));
    int nops = ops != NULL && plan != NULL ? pipeline_schedule(&pl, g->pp_rank, ops) : 0;
    *n = ops != NULL && plan != NULL ? pipeline_plan(&pl, g->pp_rank, ops, nops, plan) : -1;
    free(ops);
    if (*n < 0) {
        fprintf(stderr, "out of memory allocating the schedule of %d micro-batches\n", job->accum);
        exit(1);
    }
    return plan;
}

// the micro-batches whose activations this stage holds at once under the schedule
// (with chunks of layers, the plan's early receives can hold one more set
// than the list alone: pipeline_plan_sets counts them)
static int activation_sets(const Job *job, const Grid *g) {
    PipeLayout pl = job_pipeline(&job->opt, g->pp, job->accum);
    int sets = pipeline_inflight(&pl, g->pp_rank);
    if (pl.V > 1) {
        int nops;
        PipeStep *plan = step_plan(job, g, &nops);
        int plan_sets = pipeline_plan_sets(&pl, plan, nops);
        free(plan);
        if (plan_sets > sets) sets = plan_sets;
    }
    return sets;
}

// rank 0's lines about the model and the batch
static void print_model_and_batch(const Job *job, int dp) {
    const GPT2Config *c = &job->config;
    printf("model: L=%d C=%d NH=%d V=%d Vp=%d maxT=%d, %zu parameters\n", c->L, c->C, c->NH, c->V, c->Vp, c->maxT,
           param_count(c));
    printf("batch: B=%d T=%d, %d micro-batches per step x dp %d = %ld tokens, %d steps%s\n", job->opt.B, job->opt.T,
           job->accum, dp, job->total_batch, job->steps, job->steps == 0 ? " (-x 0: evaluate only)" : "");
}

// rank 0's line on what this launch resumed (load_ms: the time to load the
// parameters and the optimizer state, after their verification)
static void announce_resume(const Job *job, double load_ms) {
    double verify_ms = parallel_launched_rank() ? -1.0 : job->verify_ms;  // -1: its launcher hashed the files
    ckpt_announce(&job->opt, job->resuming ? &job->ck : NULL, job->ck_dir, verify_ms, load_ms);
}

// the next micro-batch of a stream; a shard that changed since it was
// checked (dataloader.h) ends the run with the loader's line
static void next_batch(DataLoader *dl, int *inputs, int *targets) {
    if (dataloader_next(dl, inputs, targets) != 0) die(1, dl->err);
}

// ----------------------------------------------------------------------------
// llm.c's outlier guard (-sl, -sg): each step's loss and grad norm get a
// z-score against a window of the last OUTLIER_WINDOW steps' values, the new
// one included (none until the window is full); an update whose z-score is
// above the flag's threshold is skipped. As in llm.c the windows start
// afresh in each launch.
//
// A step whose loss or grad norm is not finite (NaN weights, an overflow, a
// learning rate too high) never reaches the weights, guard or no guard: its
// update is skipped ("not finite") and its values stay out of the windows,
// which they would spoil for good. Under -sl or -sg the run goes on, as for
// any outlier; without them it ends (nonfinite_stop).

#define OUTLIER_WINDOW 128

typedef struct {
    double values[OUTLIER_WINDOW];
    int count, next;
    double sum, sumsq;
} Outliers;

// x's z-score once the window is full (NAN before); x enters the window
static double outlier_zscore(Outliers *d, double x) {
    if (d->count < OUTLIER_WINDOW) {
        d->values[d->count++] = x;
        d->sum += x;
        d->sumsq += x * x;
        return NAN;
    }
    double old = d->values[d->next];
    d->values[d->next] = x;
    d->next = (d->next + 1) % OUTLIER_WINDOW;
    d->sum += x - old;
    d->sumsq += x * x - old * old;
    double mean = d->sum / OUTLIER_WINDOW, var = d->sumsq / OUTLIER_WINDOW - mean * mean;
    return var > 0.0 ? (x - mean) / sqrt(var) : 0.0;
}

typedef struct {
    Outliers loss, norm;
    float loss_z, norm_z;     // the last step's z-scores (NAN: the window is not full yet)
} OutlierGuard;

static int outlier_guard_on(const Job *job) { return job->opt.skip_loss_z > 0 || job->opt.skip_norm_z > 0; }

// this step's z-scores; "loss" or "norm" when -sl or -sg skips its update
// (rank 0 says so, in llm.c's words), "not finite" for a step whose update
// must not be applied at all (above), else NULL. Every rank has the same
// loss and norm (all-reduced), so every rank decides the same.
static const char *outlier_skip(const Job *job, OutlierGuard *g, float loss, float norm, int rank0) {
    if (!isfinite(loss) || !isfinite(norm)) {
        g->loss_z = g->norm_z = NAN;
        if (outlier_guard_on(job) && rank0) printf("skipping update due to a loss or grad norm that is not finite\n");
        return "not finite";
    }
    g->loss_z = (float)outlier_zscore(&g->loss, loss);
    g->norm_z = (float)outlier_zscore(&g->norm, norm);
    const char *what = NULL;
    if (isfinite(g->loss_z) && job->opt.skip_loss_z > 0 && g->loss_z > job->opt.skip_loss_z) what = "loss";
    else if (isfinite(g->norm_z) && job->opt.skip_norm_z > 0 && g->norm_z > job->opt.skip_norm_z) what = "norm";
    if (what != NULL && rank0)
        printf("skipping update due to %s z-score of %f\n", what[0] == 'l' ? "loss" : "grad",
               what[0] == 'l' ? g->loss_z : g->norm_z);
    return what;
}

// nonfinite_stop: whether the step of l ends the run: its loss or norm was
// not finite and skipped as such (it does unless -sl or -sg is on). Rank 0
// then says so in one line, and the caller waits for every rank (so the
// line is out before the launcher hears of an exit) and exits 1. Parameters
// that are not finite while the loss and norm are (one in wte's padded
// rows, which no logit reads) are not looked for in a step: the trainers
// check them before they write them (print_not_written), which ends the run
static int nonfinite_stop(const Job *job, const LogLine *l, int rank0) {
    if (l->skipped == NULL || strcmp(l->skipped, "not finite") != 0 || outlier_guard_on(job)) return 0;
    if (rank0) {
        fflush(stdout);
        fprintf(stderr, "%s: step %d: loss %g, grad norm %g: not finite, so the step's update was not applied and "
                "the run stops (NaN or huge weights, bad data, or a learning rate too high? -sl or -sg skip such "
                "steps and go on)\n", trainer_name, l->step, l->loss, l->norm);
    }
    return 1;
}

// rank 0's line when what was to be written (a checkpoint, the final model)
// is not, because the parameters are not finite (a model file given with
// a NaN, its steps skipped under -sl or -sg; an update that overflowed a
// padded row of wte): no file keeps such a model, and the run ends, exit 1
static void print_not_written(const char *what, int rank0) {
    if (!rank0) return;
    fflush(stdout);
    fprintf(stderr, "%s: %s not written: the parameters are not finite (NaN or infinity)\n", trainer_name, what);
}

// ----------------------------------------------------------------------------
// the loop: what a step does besides training, and what it reports

// the val loss before step 0, every -v steps, and after the last step
// (step == steps: the final model, evaluated after the loop)
static int evaluate_due(const Job *job, int step) {
    return job->have_val && (step == job->steps || step % job->opt.val_every == 0);
}

// HellaSwag (-h 1) with the evaluations, after step 0 as in llm.c, and after the last step
static int hellaswag_due(const Job *job, int step) {
    return job->have_hs && (step == job->steps || (step > 0 && step % job->opt.val_every == 0));
}

// HellaSwag's progress on rank 0, as llm.c prints it ("evaluating
// HellaSwag: i/n", in batches): 10,042 examples take long on a CPU, and
// should not pass in silence. On a terminal one line is rewritten in place
// (\r) every 10 batches, as llm.c's, and wiped at the end; into a file or
// a pipe (a log) a whole line at most every PROGRESS_EVERY_S seconds, so
// that a long evaluation leaves a few lines there, not one per batch, and
// a short one none.
#define PROGRESS_EVERY_S 10.0

typedef struct {
    int on, tty, n;     // printing at all (rank 0); to a terminal; the batches
    double last_ms;     // when the last line was printed (or the start)
    int shown;          // a terminal line is on screen
} Progress;

// whether batch i of n is shown: on a terminal every 10th; elsewhere when
// PROGRESS_EVERY_S have passed since the last line (now and last in ms)
static int progress_due(int tty, int i, double now_ms_, double last_ms) {
    if (tty) return i % 10 == 0;
    return now_ms_ - last_ms >= PROGRESS_EVERY_S * 1e3;
}

static void progress_start(Progress *p, int on, int n) {
    p->on = on;
    p->tty = on && isatty(fileno(stdout));
    p->n = n;
    p->last_ms = now_ms();
    p->shown = 0;
}

// before batch i of the evaluation
static void progress_tick(Progress *p, int i) {
    if (!p->on) return;
    double now = now_ms();
    if (!progress_due(p->tty, i, now, p->last_ms)) return;
    if (p->tty) printf("\revaluating HellaSwag: %d/%d", i, p->n);
    else printf("evaluating HellaSwag: %d/%d\n", i, p->n);
    fflush(stdout);
    p->last_ms = now;
    p->shown = p->tty;
}

// the terminal's line wiped, so that the result's line starts clean
static void progress_end(Progress *p) {
    if (!p->shown) return;
    printf("\r%*s\r", 48, "");
    fflush(stdout);
}

// the accuracy of a HellaSwag evaluation that got `correct` examples right;
// rank 0 prints llm.c's line for it
static float report_hellaswag(const Job *job, float correct, int rank0) {
    if (rank0) printf("HellaSwag: %d/%d = %f\n", (int)correct, job->hs.n, correct / job->hs.n);
    return correct / job->hs.n;
}

// a sample every -s steps (not before any training), and after the last step
static int sample_due(const Job *job, int step) {
    return job->have_tok && (step == job->steps || (step > 0 && step % job->opt.sample_every == 0));
}

// the data-parallel replicas compare their parameters every -ck steps
static int check_due(const Job *job, int step) {
    return job->opt.check_every > 0 && step % job->opt.check_every == 0;
}

// a checkpoint after every -n steps, after the last, and when a signal stopped the run
static int checkpoint_due(const Job *job, int step, int stopped) {
    int done = step + 1;
    return stopped || (job->opt.ckpt_every > 0 && (done % job->opt.ckpt_every == 0 || done == job->steps));
}

// the tokens trained on once `done` steps are done: the checkpoint's count
// (earlier launches may have trained under another total batch), then this
// launch's batch a step
static long tokens_after(const Job *job, int done) {
    return job->start_tokens + job->total_batch * (long)(done - job->start);
}

// a duration in seconds as 1h05m, 4m10s or 12s
static const char *format_duration(double s, char *buf, size_t len) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%lds", t);
    return buf;
}

// a line of the JSON log; a write that fails (a full disk, -lg /dev/full)
// ends the run with one line and exit 1: a log that silently lost lines
// would be taken for the whole run
static void log_write(const Job *job, const LogLine *l) {
    if (log_line(job->logf, l) == 0) return;
    char msg[1400];
    snprintf(msg, sizeof(msg), "%s: cannot write the log: %s (at step %d)", job->log_path, strerror(errno), l->step);
    fflush(stdout);
    die(1, msg);
}

// rank 0's line for a step, up to its ETA (print_mfu ends it), and the
// step's JSON log entry (l: its numbers; the tokens are filled
// in here); with -sl or -sg, the z-scores of g too, as llm.c prints them.
// The ETA: the rest of the steps at this launch's pace so far, its
// evaluations and checkpoints included. Returns the tokens per second.
static double report_step(Job *job, LogLine *l, const OutlierGuard *g) {
    char eta[32];
    double tok_s = job->total_batch / (l->ms / 1e3), now = now_ms();
    if (l->step == job->start) job->loop_t0 = now - l->ms;
    double per_step_s = (now - job->loop_t0) / 1e3 / (l->step - job->start + 1);
    l->trained = 1;
    l->tokens = tokens_after(job, l->step + 1);
    log_write(job, l);  // first: a failed write's line then follows whole lines of stdout
    printf("step %4d/%d | loss %.6f", l->step, job->steps, l->loss);
    if (outlier_guard_on(job)) printf(" (%+.2fz)", g->loss_z);
    printf(" | norm %.4f", l->norm);
    if (outlier_guard_on(job)) printf(" (%+.2fz)", g->norm_z);
    printf(" | lr %.2e | %.1f ms | %.0f tok/s | %.1f GFLOP/s | ETA %s", l->lr, l->ms, tok_s,
           tok_s * flops_per_token(&job->config, job->opt.T) / 1e9,
           format_duration(per_step_s * (job->steps - l->step - 1), eta, sizeof(eta)));
    return tok_s;
}

// the end of rank 0's step line: the model FLOPs utilization of the whole
// job at tok_s tokens per second, against peak, the FLOP/s that all its
// ranks can do together (0 when not known)
static void print_mfu(const Job *job, double tok_s, double peak) {
    double fpt = flops_per_token(&job->config, job->opt.T);
    if (peak > 0) printf(" | MFU %.1f%%\n", 100.0 * tok_s * fpt / peak);
    else printf(" | MFU n/a\n");
    fflush(stdout);
}

// the line after the last step (l: from final_line, its val loss and
// HellaSwag accuracy filled in when measured): the final model's, in the
// log, as llm.c evaluates once more after its last update
static LogLine final_line(const Job *job) {
    LogLine l = {job->steps, 0, 0.0f, 0.0f, 0.0f, -1.0f, -1.0f, 0.0, tokens_after(job, job->steps), NULL, NULL, NULL, NULL};
    return l;
}

static void report_final(const Job *job, const LogLine *l) {
    if (log_measured(l->val_loss) || log_measured(l->hellaswag)) log_write(job, l);
}

// what state.bin records after `done` steps (Adam's t: adam_t), the data
// position, the sampling RNG and the tokens so far included, and the layout
// that wrote it
static CkptState checkpoint_state(const Job *job, int done, int adam_t, const Grid *g, int zero) {
    const Options *o = &job->opt;
    DataLoaderState pos;
    dataloader_get_state(&job->train, &pos);
    CkptState st = {done, adam_t, job->config, o->B, o->T, (int)job->total_batch, job->steps, o->seed, o->shuffle,
                    {pos.epoch, pos.shard_pos, pos.sample_pos, pos.rng}, job->sample_rng,
                    g->world, g->tp, g->pp, zero, (uint64_t)tokens_after(job, done),
                    0};  // its id comes from the manifest once written
    return st;
}

static void print_checkpoint_written(const Job *job, int done, double ms) {
    printf("checkpoint %s/ckpt_%08d written in %.0f ms\n", job->opt.out_dir, done, ms);
}

// llm.c's mark of a run that is over: an empty file DONE_<steps>, the step
// count in 8 digits as llm.c names it (DONE_00018865), in -o once the final
// model is written. llm.c's scripts (scripts/run_gpt2_124M.sh) start the
// trainer again and again until it is there. Rank 0 writes it in -o held
// open (job->out_fd), as the model beside it, never through a link; 0, or
// -1 with err set
static int write_done(const Job *job, char *err, size_t errlen) {
    char name[32], path[1100];
    snprintf(name, sizeof(name), "DONE_%08d", job->steps);
    snprintf(path, sizeof(path), "%s/%s", job->opt.out_dir, name);
    int fd = file_open_checked_at(job->out_fd, name, path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, "", err, errlen);
    if (fd < 0) return -1;
    if (close(fd) != 0) return errorf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return 0;
}

// ----------------------------------------------------------------------------
// sampling

// xorshift*: a float in [0, 1); its state is one number
static float random_f32(uint64_t *state) {
    *state ^= *state >> 12; *state ^= *state << 25; *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

// the token drawn from the softmax of V logits by inverse CDF: the first
// whose cumulative probability passes coin (in [0, 1))
static int sample_token(const float *logits, int V, float coin) {
    float maxv = -INFINITY, sum = 0.0f;
    for (int i = 0; i < V; i++) if (logits[i] > maxv) maxv = logits[i];
    for (int i = 0; i < V; i++) sum += expf(logits[i] - maxv);
    float target = coin * sum, cdf = 0.0f;
    for (int i = 0; i < V; i++) {
        cdf += expf(logits[i] - maxv);
        if (target < cdf) return i;
    }
    return V - 1;
}

// ----------------------------------------------------------------------------

static void free_job(Job *job) {
    if (job->logf) fclose(job->logf);
    dataloader_free(&job->train);
    if (job->have_val) dataloader_free(&job->val);
    if (job->have_hs) hs_free(&job->hs);
    if (job->have_tok) tokenizer_free(&job->tok);
}

#endif
