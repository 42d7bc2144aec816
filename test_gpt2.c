/*
 * test_gpt2.c: the CPU trainer against the PyTorch reference (the two
 * fixtures of dev/fixtures, made by dev/train_gpt2.py), each layer's
 * backward against finite differences, the model files, the seeded init,
 * the lr schedule, the command line (flags, and files named by flags) and
 * the printed sample's text.
 */
#define TESTING
// the logits' transposed forward (cpu_matmul.h) from a 16 MiB weight, not
// 64 MiB, so that test_matmul_shapes reaches it with a small shape
#define MATMUL_TRANSPOSE_BYTES (16u << 20)
#include "train_gpt2.c"
#include "llm3d/tokenizer.h"  // (train_gpt2.c leaves it out when TESTING) the byte-level tokenizer's .bin
#include "dev/test/test.h"
#include "dev/test/test_run.h"

static const char *fixture_model = "dev/fixtures/tiny_model.bin";
static const char *fixture_model_bf16 = "dev/fixtures/tiny_model_bf16.bin";
static const char *fixture_state = "dev/fixtures/tiny_state.bin";
// a second, smaller fixture whose LayerNorm weights and biases are seeded
// noise, not 1 and 0 (dev/fixtures/README.md): at 1 and 0 a LayerNorm
// backward that used dout for weight * dout gave PyTorch's gradients exactly
static const char *fixture_ln_model = "dev/fixtures/tiny_ln_model.bin";
static const char *fixture_ln_state = "dev/fixtures/tiny_ln_state.bin";

// ----------------------------------------------------------------------------
// the PyTorch comparison

// a single-rank model of config c from full parameters (file layout; freed)
static void build_single(GPT2 *model, Parallel *par, const GPT2Config *c, float *full, int B, int T) {
    par_single(par);
    gpt2_init_rank(model, c, full, 0, B, T, par, 1);
    free(full);
}

// the LayerNorm tensors of a fixture made with --random-ln: no weight 1 and
// no bias 0, and spread as 1 + 0.2 N(0,1) and 0.1 N(0,1) are (RMS of w - 1
// over 0.1, of b over 0.05), so that a fixture made again without the option
// fails here, not by passing the gradient checks it exists for
static void check_random_layernorms(const char *path, const GPT2Config *c, const float *params) {
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS + 1] = {0};
    param_sizes(c, sizes);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) off[t + 1] = off[t] + sizes[t];
    int tensors[] = {P_LN1W, P_LN1B, P_LN2W, P_LN2B, P_LNFW, P_LNFB};
    for (int k = 0; k < 6; k++) {
        int t = tensors[k];
        float trivial = k % 2 == 0 ? 1.0f : 0.0f, least_rms = k % 2 == 0 ? 0.1f : 0.05f;
        size_t equal = 0;
        double sq = 0.0;
        for (size_t i = 0; i < sizes[t]; i++) {
            float d = params[off[t] + i] - trivial;
            equal += d == 0.0f;
            sq += (double)d * d;
        }
        double rms = sqrt(sq / sizes[t]);
        check(equal == 0 && rms > least_rms, "%s: %-4s is not all %g: %zu of %zu elements equal it, RMS of the "
              "difference %.3f (> %.2f)", path, param_name(t), trivial, equal, sizes[t], rms, least_rms);
    }
}

// the CPU trainer on a fixture's batch: logits, loss and every gradient
// tensor against PyTorch's, then the fixture's AdamW steps against its losses
// and grad norms. random_ln: the fixture must have seeded LayerNorm tensors.
static void test_against_pytorch(const char *model_path, const char *state_path, int random_ln) {
    char err[512];
    GPT2Config c;
    float *params = model_load(model_path, &c, err, sizeof(err));
    if (!check(params != NULL, "load %s (%s)", model_path, params ? "ok" : err)) return;
    check(c.V % VOCAB_PAD != 0 && c.Vp > c.V, "%s exercises padded vocab rows (V=%d Vp=%d)", model_path, c.V, c.Vp);
    if (random_ln) check_random_layernorms(model_path, &c, params);
    size_t n = param_count(&c);
    DebugState s;
    if (!check(debug_state_load(&s, state_path, n) == 0, "load %s", state_path)) {
        free(params);
        return;
    }
    const char *name = strrchr(state_path, '/') ? strrchr(state_path, '/') + 1 : state_path;  // in each line
    printf("%s against %s: B=%d T=%d, %d steps\n", model_path, state_path, s.B, s.T, s.nsteps);
    GPT2 model;
    Parallel par;
    build_single(&model, &par, &c, params, s.B, s.T);
    Acts *a = &model.acts[0];
    size_t BT = (size_t)s.B * s.T;
    memcpy(a->inputs, s.inputs, BT * sizeof(int));
    memcpy(a->targets, s.targets, BT * sizeof(int));

    stage_forward(&model, a, 0);  // with the loss, the logits become the softmax in place
    float worst = 0.0f;
    for (size_t bt = 0; bt < BT; bt++)
        for (int i = 0; i < c.V; i++) {
            float diff = fabsf(a->t[A_LOGITS][bt * c.Vp + i] - s.logits[bt * c.V + i]);
            if (diff > worst) worst = diff;
        }
    check(worst < 1e-4f, "%s: logits vs PyTorch: worst abs diff %.3e (< 1e-4)", name, worst);
    stage_forward(&model, a, 1);
    check(fabsf(a->mean_loss - s.loss) < 1e-5f, "%s: loss %.7f vs PyTorch %.7f: diff %.3e (< 1e-5)", name,
          a->mean_loss, s.loss, fabsf(a->mean_loss - s.loss));

    gpt2_zero_grad(&model);
    stage_backward(&model, a, 1.0f / (float)BT);
    float *grads = (float *)calloc(n, sizeof(float));
    gpt2_export(&model, model.unit_grads, grads);
    size_t sizes[NUM_PARAM_TENSORS], off = 0;
    param_sizes(&c, sizes);
    float worst_rel = 0.0f;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        float maxref = 0.0f, maxdiff = 0.0f;
        for (size_t i = 0; i < sizes[t]; i++) {
            float ref = s.grads[off + i], got = grads[off + i];
            if (fabsf(ref) > maxref) maxref = fabsf(ref);
            if (fabsf(ref - got) > maxdiff) maxdiff = fabsf(ref - got);
        }
        float rel = maxref > 0 ? maxdiff / maxref : maxdiff;
        if (rel > worst_rel) worst_rel = rel;
        check(rel < 1e-4f, "%s: grad %-8s vs PyTorch: worst diff %.3e = %.2e of its largest |g| %.3e", name,
              param_name(t), maxdiff, rel, maxref);
        off += sizes[t];
    }
    printf("worst gradient error: %.2e of the tensor's largest value\n", worst_rel);
    free(grads);

    // nsteps AdamW steps on the same batch, against PyTorch's losses and norms
    AdamHyper h = {s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.grad_clip};
    float worst_loss = 0.0f, worst_norm = 0.0f;
    int clipped = 0;
    for (int step = 0; step < s.nsteps; step++) {
        gpt2_zero_grad(&model);
        stage_forward(&model, a, 1);
        stage_backward(&model, a, 1.0f / (float)BT);
        float loss = a->mean_loss;
        gpt2_update(&model, &h);
        float norm = gpt2_last_norm(&model);
        float dl = fabsf(loss - s.losses[step]), dn = fabsf(norm - s.norms[step]) / s.norms[step];
        printf("  step %d: loss %.7f (torch %.7f) norm %.6f (torch %.6f)\n", step, loss, s.losses[step], norm, s.norms[step]);
        if (dl > worst_loss) worst_loss = dl;
        if (dn > worst_norm) worst_norm = dn;
        clipped += norm > s.grad_clip;
    }
    check(clipped > 0 && clipped < s.nsteps, "%s: the steps exercise clipping both ways (%d of %d clipped at %.2f)",
          name, clipped, s.nsteps, s.grad_clip);
    check(worst_loss < 1e-5f, "%s: %d AdamW steps: worst loss diff vs PyTorch %.3e (< 1e-5)", name, s.nsteps,
          worst_loss);
    check(worst_norm < 1e-4f, "%s: %d AdamW steps: worst relative grad-norm diff %.3e (< 1e-4)", name, s.nsteps,
          worst_norm);
    debug_state_free(&s);
    gpt2_free(&model);
}

// ----------------------------------------------------------------------------
// finite differences. Each layer's forward runs in fp32; the objective
// J = sum(out * r) for a fixed random r is accumulated in double, and
// dJ/dx = (J(x+h) - J(x-h)) / 2h is compared to the backward given dout = r.

static uint64_t test_rng = 42;
static float randn_test(void) { return counter_normal(7, 0, test_rng++); }
static float *rand_array(size_t n, float scale) {
    float *a = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = scale * randn_test();
    return a;
}

typedef struct {
    void (*forward)(void *ctx, float *out);
    size_t nout;
    void *ctx;
} Layer;

static double objective(const Layer *layer, const float *r, float *out) {
    layer->forward(layer->ctx, out);
    double j = 0.0;
    for (size_t i = 0; i < layer->nout; i++) j += (double)out[i] * r[i];
    return j;
}

// compares analytic grad[0..n) of input x with finite differences at up to 24 points
static void fd_check(const char *name, const Layer *layer, const float *r, float *x, const float *grad, size_t n, float h) {
    float *out = (float *)malloc(layer->nout * sizeof(float));
    double worst = 0.0;
    size_t stride = n > 24 ? n / 24 : 1;
    for (size_t i = (size_t)(test_rng % stride); i < n; i += stride) {
        float saved = x[i];
        x[i] = saved + h;
        double jp = objective(layer, r, out);
        x[i] = saved - h;
        double jm = objective(layer, r, out);
        x[i] = saved;
        double fd = (jp - jm) / (2.0 * h);
        double rel = fabs(fd - grad[i]) / (fabs(fd) + fabs(grad[i]) + 1e-2);
        if (rel > worst) worst = rel;
    }
    check(worst < 1e-2, "finite differences: %-28s worst relative error %.2e (< 1e-2)", name, worst);
    free(out);
}

typedef struct { float *inp, *w, *b, *mean, *rstd; int N, C, OC; } MatCtx;
static void ln_fwd(void *p, float *out) { MatCtx *c = p; layernorm_forward(out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C); }
static void mm_fwd(void *p, float *out) { MatCtx *c = p; matmul_forward(out, c->inp, c->w, c->b, c->N, c->C, c->OC); }
static void gelu_fwd(void *p, float *out) { MatCtx *c = p; gelu_forward(out, c->inp, (size_t)c->N * c->C); }

static void test_layernorm_fd(void) {
    int N = 6, C = 16;
    MatCtx c = {rand_array(N * C, 1.0f), rand_array(C, 1.0f), rand_array(C, 1.0f), calloc(N, 4), calloc(N, 4), N, C, 0};
    Layer layer = {ln_fwd, (size_t)N * C, &c};
    float *r = rand_array(N * C, 1.0f), *out = calloc(N * C, 4);
    float *dx = calloc(N * C, 4), *dw = calloc(C, 4), *db = calloc(C, 4);
    ln_fwd(&c, out);
    layernorm_backward(dx, dw, db, r, c.inp, c.w, c.mean, c.rstd, N, C, 0);
    fd_check("layernorm dinp", &layer, r, c.inp, dx, N * C, 1e-2f);
    fd_check("layernorm dweight", &layer, r, c.w, dw, C, 1e-2f);
    fd_check("layernorm dbias", &layer, r, c.b, db, C, 1e-2f);
}

static void test_matmul_fd(void) {
    int N = 7, C = 12, OC = 9;  // N not a multiple of the 4-row tile
    MatCtx c = {rand_array(N * C, 1.0f), rand_array(OC * C, 1.0f), rand_array(OC, 1.0f), NULL, NULL, N, C, OC};
    Layer layer = {mm_fwd, (size_t)N * OC, &c};
    float *r = rand_array(N * OC, 1.0f), *dx = calloc(N * C, 4), *dw = calloc(OC * C, 4), *db = calloc(OC, 4);
    matmul_backward(dx, dw, db, r, c.inp, c.w, N, C, OC, 0);
    fd_check("matmul dinp", &layer, r, c.inp, dx, N * C, 1e-2f);
    fd_check("matmul dweight", &layer, r, c.w, dw, OC * C, 1e-2f);
    fd_check("matmul dbias", &layer, r, c.b, db, OC, 1e-2f);
}

// the three products of a Linear layer against sums in double, at shapes that
// reach every path of cpu_matmul.h: rows past the last whole sliver of A,
// columns past the last whole vector and past the last whole sliver of B,
// B packed (many rows, or a B over 1 MiB) and read in place (few rows of a
// small B, or of one over 16 MiB), on 1 and 3 threads. The fifth shape's
// dweight (M = 1600 rows in 7 blocks, K = 200 over two blocks of k) packs B
// whole for all its row blocks, on 3 threads as on 1. dweight's A, dout
// transposed, is transposed whole first in all but the last shape, whose
// dout is over 16 MiB: there each task transposes its blocks of it, its 50
// columns end in an edge tile (48 + 2 with AVX-512), and the last rows of its
// last block, past a whole sliver (25001 = 8 x 3125 + 1 with AVX-512), are
// packed apart.
static void test_matmul_shapes(void) {
    // N, C, OC. The sixth has a weight over 16 MiB and fewer rows than
    // columns of input, so its forward is computed transposed (cpu_matmul.h):
    // two blocks of k, and a last task of 119 rows of the weight (AVX-512)
    int shapes[][3] = {{21, 112, 100}, {300, 100, 112}, {40, 200, 33}, {50, 100, 300},
                       {200, 200, 1600}, {52, 160, 26999}, {170, 50, 25001}};
#ifdef _OPENMP
    int before = omp_get_max_threads();
#endif
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        // the tolerance, 1e-4, was set for sums of up to 300 terms; the
        // rounding of a sum grows about as its length, so a longer one (the
        // last shape's dinp: 1600 terms) gets 1e-4 per 300 of its terms
        double tol_forward = 1e-4 * fmax(1.0, C / 300.0), tol_dinp = 1e-4 * fmax(1.0, OC / 300.0);
        double tol_dweight = 1e-4 * fmax(1.0, N / 300.0);
        float *inp = rand_array(N * C, 1.0f), *w = rand_array(OC * C, 1.0f), *b = rand_array(OC, 1.0f);
        float *dout = rand_array(N * OC, 1.0f), *out = calloc(N * OC, 4), *dinp = calloc(N * C, 4);
        float *dw = calloc(OC * C, 4), *db = calloc(OC, 4), *again = calloc(N * OC, 4);
        float *dinp1 = calloc(N * C, 4), *dw1 = calloc(OC * C, 4);  // one thread's, to compare with three's
        for (int threads = 1; threads <= 3; threads += 2) {
#ifdef _OPENMP
            omp_set_num_threads(threads);
#endif
            memset(dinp, 0, (size_t)N * C * 4);
            memset(dw, 0, (size_t)OC * C * 4);
            memset(db, 0, (size_t)OC * 4);
            matmul_forward(out, inp, w, b, N, C, OC);
            matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, 0);
            if (threads == 1) {
                memcpy(dinp1, dinp, (size_t)N * C * 4);
                memcpy(dw1, dw, (size_t)OC * C * 4);
            } else {
                check(memcmp(dinp, dinp1, (size_t)N * C * 4) == 0 && memcmp(dw, dw1, (size_t)OC * C * 4) == 0,
                      "matmul N=%d C=%d OC=%d: dinp and dweight on %d threads equal one thread's, bit for bit", N, C,
                      OC, threads);
            }
            // the forward is the bias, then each term added in order, bit for
            // bit, whichever way it is computed: the same as adding A B to C
            // set to the bias (matmul_blocked, never transposed)
            for (int n = 0; n < N; n++) memcpy(again + (size_t)n * OC, b, (size_t)OC * 4);
            matmul_blocked(again, OC, inp, C, 1, w, 1, C, N, OC, C);
            check(memcmp(out, again, (size_t)N * OC * 4) == 0, "matmul N=%d C=%d OC=%d on %d threads: the forward "
                  "equals the bias plus A B added in order, bit for bit", N, C, OC, threads);
            double worst = 0.0;  // the largest error as a share of its tolerance
            for (int n = 0; n < N; n++)
                for (int o = 0; o < OC; o++) {
                    double sum = b[o];
                    for (int i = 0; i < C; i++) sum += (double)inp[n * C + i] * w[o * C + i];
                    worst = fmax(worst, fabs(out[n * OC + o] - sum) / tol_forward);
                }
            for (int n = 0; n < N; n++)
                for (int i = 0; i < C; i++) {
                    double sum = 0.0;
                    for (int o = 0; o < OC; o++) sum += (double)dout[n * OC + o] * w[o * C + i];
                    worst = fmax(worst, fabs(dinp[n * C + i] - sum) / tol_dinp);
                }
            for (int o = 0; o < OC; o++)
                for (int i = 0; i < C; i++) {
                    double sum = 0.0;
                    for (int n = 0; n < N; n++) sum += (double)dout[n * OC + o] * inp[n * C + i];
                    worst = fmax(worst, fabs(dw[o * C + i] - sum) / tol_dweight);
                }
            for (int o = 0; o < OC; o++) {
                double sum = 0.0;
                for (int n = 0; n < N; n++) sum += dout[n * OC + o];
                worst = fmax(worst, fabs(db[o] - sum) / tol_dweight);
            }
            // no bias: the forward starts from zeros
            matmul_forward(out, inp, w, NULL, N, C, OC);
            for (int n = 0; n < N; n++)
                for (int o = 0; o < OC; o++) {
                    double sum = 0.0;
                    for (int i = 0; i < C; i++) sum += (double)inp[n * C + i] * w[o * C + i];
                    worst = fmax(worst, fabs(out[n * OC + o] - sum) / tol_forward);
                }
            check(worst < 1.0, "matmul N=%d C=%d OC=%d on %d threads: forward with and without bias, dinp, dweight, "
                  "dbias within %.2f of their tolerances of double (1e-4 per 300 terms summed, at least 1e-4)", N, C,
                  OC, threads, worst);
        }
        free(inp); free(w); free(b); free(dout); free(out); free(dinp); free(dw); free(db); free(again);
        free(dinp1); free(dw1);
    }
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
}

// the grad norm's sum of squares: against a sum in double on lengths around
// its block size (whole pairs of blocks, an odd block, a short last one), on
// 1 and 3 threads, and bit for bit the same on both
static void test_sum_squares(void) {
    size_t lengths[] = {1, 7, 8, 8191, 8192, 8193, 16384, 3 * 8192, 3 * 8192 + 5, 4 * 8192 - 3, 100003};
    size_t nl = sizeof(lengths) / sizeof(lengths[0]), most = 100003;
    float *x = (float *)malloc((most + 64) * sizeof(float));
    unsigned seed = 7u;
    for (size_t i = 0; i < most + 64; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / (float)(1u << 24)) * 2.0f - 1.0f;
    }
    int fails = 0;
    double worst = 0.0;
#ifdef _OPENMP
    int before = omp_get_max_threads();
#endif
    for (size_t k = 0; k < nl; k++) {
        size_t n = lengths[k];
        long double want = 0.0L;
        for (size_t i = 0; i < n; i++) want += (long double)x[i] * x[i];
#ifdef _OPENMP
        omp_set_num_threads(1);
#endif
        double one = sum_squares(x, n);
#ifdef _OPENMP
        omp_set_num_threads(3);
#endif
        double three = sum_squares(x, n);
        double err = fabs((double)(one - want)) / (double)want;
        if (err > worst) worst = err;
        if (err > 1e-12 || one != three) fails++;
    }
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
    check(fails == 0, "sum_squares on %zu lengths from 1 to %zu: within %.1e of long double (< 1e-12), the same on 1 "
          "and 3 threads", nl, most, worst);
    free(x);
}

static void test_gelu_fd(void) {
    int N = 4, C = 25;
    MatCtx c = {rand_array(N * C, 2.0f), NULL, NULL, NULL, NULL, N, C, 0};
    Layer layer = {gelu_fwd, (size_t)N * C, &c};
    float *r = rand_array(N * C, 1.0f), *dx = calloc(N * C, 4);
    gelu_backward(dx, c.inp, r, N * C);
    fd_check("gelu dinp", &layer, r, c.inp, dx, N * C, 1e-3f);
}

// attention forward and backward against plain loops in double, at head
// sizes that reach each way the products cut their columns: with AVX-512
// 1, 3, 4 and 5 vectors of 16 and none (12, 24); with AVX2 3 vectors of 8
// (24, as 2 + 1), 2, 6, 8 and 10; and T not a multiple of ATT_ROWS. The
// backward adds to what dqkv holds.
static void test_attention_reference(void) {
    struct { int B, T, C, NH; } shapes[] = {{2, 13, 32, 2}, {1, 9, 96, 2}, {1, 64, 128, 2}, {1, 11, 160, 2}, {2, 7, 24, 2}, {1, 10, 48, 2}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        int B = shapes[i].B, T = shapes[i].T, C = shapes[i].C, NH = shapes[i].NH, hs = C / NH, C3 = 3 * C;
        float *qkv = rand_array(B * T * C3, 1.0f), *dout = rand_array(B * T * C, 1.0f), *dqkv = rand_array(B * T * C3, 1.0f);
        float *att = calloc((size_t)B * NH * T * T, 4), *out = calloc((size_t)B * T * C, 4);
        double *ref_out = calloc((size_t)B * T * C, sizeof(double)), *ref_d = calloc((size_t)B * T * C3, sizeof(double));
        double *p = calloc((size_t)T * T, sizeof(double)), *ds = calloc((size_t)T * T, sizeof(double));
        float *start = malloc((size_t)B * T * C3 * 4);
        memcpy(start, dqkv, (size_t)B * T * C3 * 4);
        for (int j = 0; j < B * T * C3; j++) ref_d[j] = dqkv[j];
        double scale = 1.0 / sqrt((double)hs);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C, *d = dout + (size_t)b * T * C + h * hs;
                double *dq = ref_d + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
                for (int t = 0; t < T; t++) {
                    double maxv = -1e300, sum = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        double s = 0.0;
                        for (int e = 0; e < hs; e++) s += (double)q[t * C3 + e] * k[t2 * C3 + e];
                        p[t * T + t2] = s * scale;
                        if (p[t * T + t2] > maxv) maxv = p[t * T + t2];
                    }
                    for (int t2 = 0; t2 <= t; t2++) sum += p[t * T + t2] = exp(p[t * T + t2] - maxv);
                    for (int t2 = 0; t2 <= t; t2++) p[t * T + t2] /= sum;
                    for (int e = 0; e < hs; e++) {
                        double o = 0.0;
                        for (int t2 = 0; t2 <= t; t2++) o += p[t * T + t2] * v[t2 * C3 + e];
                        ref_out[((size_t)b * T + t) * C + h * hs + e] = o;
                    }
                    // the scores' gradient: ds = p (dp - sum of dp p), dp[t2] = d[t] . v[t2]
                    double dot = 0.0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        double dp = 0.0;
                        for (int e = 0; e < hs; e++) dp += (double)d[t * C + e] * v[t2 * C3 + e];
                        ds[t * T + t2] = dp;
                        dot += dp * p[t * T + t2];
                    }
                    for (int t2 = 0; t2 <= t; t2++) ds[t * T + t2] = p[t * T + t2] * (ds[t * T + t2] - dot) * scale;
                    for (int t2 = 0; t2 <= t; t2++)
                        for (int e = 0; e < hs; e++) {
                            dv[t2 * C3 + e] += p[t * T + t2] * d[t * C + e];
                            dq[t * C3 + e] += ds[t * T + t2] * k[t2 * C3 + e];
                            dk[t2 * C3 + e] += ds[t * T + t2] * q[t * C3 + e];
                        }
                }
            }
        attention_forward(out, att, qkv, B, T, C, NH);
        attention_backward(dqkv, dout, qkv, att, B, T, C, NH);
        double worst_out = 0.0, worst_d = 0.0, big_out = 1e-30, big_d = 1e-30;
        for (int j = 0; j < B * T * C; j++) {
            worst_out = fmax(worst_out, fabs(out[j] - ref_out[j]));
            big_out = fmax(big_out, fabs(ref_out[j]));
        }
        // dqkv's error against the largest gradient, not against what it held
        for (int j = 0; j < B * T * C3; j++) {
            worst_d = fmax(worst_d, fabs(dqkv[j] - ref_d[j]));
            big_d = fmax(big_d, fabs(ref_d[j] - start[j]));
        }
        check(worst_out / big_out < 1e-5 && worst_d / big_d < 1e-5,
              "attention B=%d T=%d C=%d NH=%d (head size %d): out and dqkv (added to) within %.1e and %.1e of double, "
              "relative to the largest output and gradient (< 1e-5)", B, T, C, NH, hs, worst_out / big_out, worst_d / big_d);
        free(qkv); free(dout); free(dqkv); free(start); free(att); free(out); free(ref_out); free(ref_d); free(p); free(ds);
    }
}

typedef struct { float *qkv, *att; int B, T, C, NH; } AttCtx;
static void att_fwd(void *p, float *out) { AttCtx *c = p; attention_forward(out, c->att, c->qkv, c->B, c->T, c->C, c->NH); }

static void test_attention_fd(void) {
    int B = 2, T = 5, C = 8, NH = 2;
    AttCtx c = {rand_array(B * T * 3 * C, 1.0f), calloc(B * NH * T * T, 4), B, T, C, NH};
    Layer layer = {att_fwd, (size_t)B * T * C, &c};
    float *r = rand_array(B * T * C, 1.0f), *out = calloc(B * T * C, 4), *dqkv = calloc(B * T * 3 * C, 4);
    att_fwd(&c, out);
    attention_backward(dqkv, r, c.qkv, c.att, B, T, C, NH);
    fd_check("attention dqkv", &layer, r, c.qkv, dqkv, B * T * 3 * C, 1e-2f);
}

typedef struct { float *logits, *probs; int *targets; int N, V, Vp; float sums[16]; } CeCtx;
static void ce_fwd(void *p, float *out) {
    CeCtx *c = p;
    float maxes[16];
    crossentropy_rowmax(maxes, c->logits, c->N, c->Vp, c->V);
    crossentropy_exp(c->probs, c->sums, c->logits, maxes, c->N, c->Vp, c->V);
    crossentropy_finish(out, c->probs, c->sums, c->targets, 0, c->N, c->Vp, c->V);
}

// one rank's fused passes give the two passes' bits, and the gradient made
// in place over the probabilities the same bits as in a buffer of its own:
// 37 real columns, whole vectors and a tail on every SIMD build
static void test_crossentropy_same_bits(void) {
    enum { N = 3, V = 37, Vp = 48 };
    int targets[N] = {0, 36, 20};
    float *logits = rand_array(N * Vp, 4.0f), *probs = calloc(N * Vp, 4), *fused = calloc(N * Vp, 4);
    float *dlogits = calloc(N * Vp, 4), maxes[N], sums[N], fused_maxes[N], fused_sums[N];
    crossentropy_rowmax(maxes, logits, N, Vp, V);
    crossentropy_exp(probs, sums, logits, maxes, N, Vp, V);
    crossentropy_softmax(fused_maxes, fused, fused_sums, logits, N, Vp, V);
    int same = memcmp(fused, probs, sizeof(float) * N * Vp) == 0 && memcmp(fused_sums, sums, sizeof(sums)) == 0 &&
               memcmp(fused_maxes, maxes, sizeof(maxes)) == 0;
    check(same, "crossentropy_softmax: the same bits as crossentropy_rowmax then crossentropy_exp");
    memcpy(dlogits, logits, sizeof(float) * N * Vp);  // and over the logits, as the trainer runs it
    crossentropy_softmax(fused_maxes, dlogits, fused_sums, dlogits, N, Vp, V);
    check(memcmp(dlogits, probs, sizeof(float) * N * Vp) == 0, "crossentropy_softmax in place: the same bits");
    crossentropy_backward(dlogits, probs, sums, targets, 0.25f, 0, N, Vp, V);
    crossentropy_backward(fused, fused, sums, targets, 0.25f, 0, N, Vp, V);
    check(memcmp(fused, dlogits, sizeof(float) * N * Vp) == 0, "crossentropy_backward in place: the same bits");
    check(dlogits[36 + Vp] < 0.0f && dlogits[1] > 0.0f,
          "crossentropy_backward: the target's gradient negative, the others positive");
    free(logits); free(probs); free(fused); free(dlogits);
}

static void test_crossentropy_fd(void) {
    int N = 5, V = 11, Vp = 16;
    int targets[5] = {0, 3, 10, 7, 3};
    CeCtx c = {rand_array(N * Vp, 2.0f), calloc(N * Vp, 4), targets, N, V, Vp, {0}};
    Layer layer = {ce_fwd, (size_t)N, &c};
    float *r = rand_array(N, 0.0f), *out = calloc(N, 4), *dlogits = calloc(N * Vp, 4);
    for (int i = 0; i < N; i++) r[i] = 1.0f;  // crossentropy_backward takes one dloss for every position
    ce_fwd(&c, out);
    crossentropy_backward(dlogits, c.probs, c.sums, targets, 1.0f, 0, N, Vp, V);
    fd_check("crossentropy dlogits", &layer, r, c.logits, dlogits, N * Vp, 1e-2f);
    int padded_zero = 1;
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) padded_zero &= dlogits[n * Vp + i] == 0.0f && c.probs[n * Vp + i] == 0.0f;
    check(padded_zero, "crossentropy: padded columns get probability 0 and gradient 0");
    free(r); free(out); free(dlogits); free(c.logits); free(c.probs);
}

// the whole model: d(mean loss)/d(parameter) for a few entries of every tensor
typedef struct { GPT2 *model; } ModelCtx;
static void model_fwd(void *p, float *out) {
    GPT2 *m = ((ModelCtx *)p)->model;
    stage_forward(m, &m->acts[0], 1);
    out[0] = m->acts[0].mean_loss;
}

static void test_model_fd(void) {
    GPT2Config c = {.maxT = 8, .V = 20, .Vp = 32, .L = 2, .NH = 2, .C = 8};
    size_t n = param_count(&c);
    float *full = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) full[i] = 0.3f * randn_test();  // larger than GPT-2's init: gradients well above rounding
    for (size_t i = (size_t)c.V * c.C; i < (size_t)c.Vp * c.C; i++) full[i] = 0.0f;
    GPT2 model;
    Parallel par;
    build_single(&model, &par, &c, full, 2, 6);
    Acts *a = &model.acts[0];
    for (int i = 0; i < 12; i++) { a->inputs[i] = (i * 7) % c.V; a->targets[i] = (i * 5 + 3) % c.V; }
    stage_forward(&model, a, 1);
    gpt2_zero_grad(&model);
    stage_backward(&model, a, 1.0f / 12);
    ModelCtx ctx = {&model};
    Layer layer = {model_fwd, 1, &ctx};
    float r = 1.0f;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        int per_layer = t != P_WTE && t != P_WPE && t != P_LNFW && t != P_LNFB;
        for (int l = 0; l < (per_layer ? c.L : 1); l++) {
            char name[64];
            snprintf(name, sizeof(name), "model d%s%s", param_name(t), per_layer ? (l ? " layer 1" : " layer 0") : "");
            size_t k = t == P_WTE ? (size_t)c.V * c.C : local_tensor_size(&c, &model.shard, t);
            fd_check(name, &layer, &r, tensor_view(&model, model.unit_params, t, l), tensor_view(&model, model.unit_grads, t, l),
                     k, 1e-2f);
        }
    }
    float maxpad = 0.0f, *dwte = tensor_view(&model, model.unit_grads, P_WTE, 0);
    for (size_t i = (size_t)c.V * c.C; i < (size_t)c.Vp * c.C; i++) maxpad = fmaxf(maxpad, fabsf(dwte[i]));
    check(maxpad == 0.0f, "padded wte rows get zero gradient");
    gpt2_free(&model);
}

// ----------------------------------------------------------------------------
// files, init, schedule, flags

static void test_model_files(void) {
    char err[512];
    GPT2Config c;
    float *p32 = model_load(fixture_model, &c, err, sizeof(err));
    float *p16 = NULL;
    GPT2Config c16;
    if (!check(p32 != NULL, "load fp32 fixture")) return;
    p16 = model_load(fixture_model_bf16, &c16, err, sizeof(err));
    if (check(p16 != NULL, "load bf16 (v5) fixture: %s", p16 ? "ok" : err)) {
        size_t n = param_count(&c), bad = 0;
        for (size_t i = 0; i < n; i++) bad += p16[i] != bf16_to_float(float_to_bf16(p32[i]));
        check(memcmp(&c, &c16, sizeof(c)) == 0 && bad == 0, "v5 file holds the bf16 rounding of the v3 weights (%zu differ)", bad);
    }
    const char *tmp = "/tmp/llm3d_test_model.bin";
    check(model_save(tmp, &c, p32, 0, err, sizeof(err)) == 0, "write v3");
    GPT2Config c2;
    float *back = model_load(tmp, &c2, err, sizeof(err));
    check(back && memcmp(back, p32, param_count(&c) * 4) == 0, "v3 round trip is exact");
    free(back);
    // refusals: truncated, wrong magic, wrong version, missing
    FILE *f = fopen(tmp, "r+b");
    ftruncate(fileno(f), 2000);
    fclose(f);
    back = model_load(tmp, &c2, err, sizeof(err));
    check(back == NULL && strstr(err, "bytes") != NULL, "truncated model file refused: %s", err);
    int32_t h[HEADER_INTS];
    model_fill_header(h, &c, 3);
    h[0] = 12345;
    f = fopen(tmp, "wb");
    fwrite(h, 4, HEADER_INTS, f);
    fclose(f);
    back = model_load(tmp, &c2, err, sizeof(err));
    check(back == NULL && strstr(err, "magic = 12345") != NULL, "wrong magic refused: %s", err);
    model_fill_header(h, &c, 4);
    f = fopen(tmp, "wb");
    fwrite(h, 4, HEADER_INTS, f);
    fclose(f);
    back = model_load(tmp, &c2, err, sizeof(err));
    check(back == NULL && strstr(err, "version = 4") != NULL, "wrong version refused: %s", err);
    model_fill_header(h, &c, 3);
    h[6] = 7;  // C not divisible by NH
    f = fopen(tmp, "wb");
    fwrite(h, 4, HEADER_INTS, f);
    fclose(f);
    back = model_load(tmp, &c2, err, sizeof(err));
    check(back == NULL && strstr(err, "C = 7") != NULL, "inconsistent shape refused: %s", err);
    back = model_load("/nonexistent/model.bin", &c2, err, sizeof(err));
    check(back == NULL && strstr(err, "/nonexistent/model.bin") != NULL, "missing file refused: %s", err);
    unlink(tmp);
    free(p32);
    free(p16);
}

// the full model (file layout) as the ranks of a layout make it from the
// seeded init, each its own slice, assembled the way the trainer saves
static float *init_full(const GPT2Config *c, uint64_t seed, int world, int tp, int pp) {
    float *full = (float *)calloc(param_count(c), sizeof(float));
    for (int r = 0; r < world; r++) {
        Parallel par;
        par_single(&par);
        char err[256];
        grid_init(&par.grid, world, tp, pp, r, err, sizeof(err));
        GPT2 m;
        gpt2_build(&m, c, &par, NULL, seed);
        gpt2_export(&m, m.unit_params, full);
        free(m.params); free(m.grads); free(m.m); free(m.v); free(m.ut.units); free(m.unit_params); free(m.unit_grads);
    }
    return full;
}

static void test_init(void) {
    GPT2Config c;
    check(config_from_descriptor(&c, "d12", 50257, 1024) == 0 && c.L == 12 && c.C == 768 && c.NH == 12 && c.Vp == 50304,
          "d12 = GPT-2 124M shape");
    check(param_count(&c) == 124475904, "d12 has 124475904 parameters (llm.c's count), got %zu", param_count(&c));
    check(config_from_descriptor(&c, "d48", 50257, 1024) == 0 && c.C == 1600 && c.NH == 25, "d48 = GPT-2 1558M shape");
    check(config_from_descriptor(&c, "d0", 50257, 1024) != 0 && config_from_descriptor(&c, "dx", 1, 1) != 0 &&
          config_from_descriptor(&c, "model.bin", 1, 1) != 0, "bad descriptors are not descriptors");
    config_from_descriptor(&c, "d4", 1000, 64);
    float *a = init_full(&c, 1, 1, 1, 1), *b = init_full(&c, 1, 1, 1, 1), *d = init_full(&c, 2, 1, 1, 1);
    size_t n = param_count(&c);
    check(memcmp(a, b, n * 4) == 0 && memcmp(a, d, n * 4) != 0, "init is deterministic in the seed");
    size_t sizes[NUM_PARAM_TENSORS], off[NUM_PARAM_TENSORS + 1] = {0};
    param_sizes(&c, sizes);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) off[t + 1] = off[t] + sizes[t];
    double s2 = 0, p2 = 0;
    for (size_t i = 0; i < sizes[P_QKVW]; i++) s2 += (double)a[off[P_QKVW] + i] * a[off[P_QKVW] + i];
    for (size_t i = 0; i < sizes[P_FCPROJW]; i++) p2 += (double)a[off[P_FCPROJW] + i] * a[off[P_FCPROJW] + i];
    double sq = sqrt(s2 / sizes[P_QKVW]), sp = sqrt(p2 / sizes[P_FCPROJW]);
    check(fabs(sq - 0.02) < 0.0005, "qkvw std %.5f ~ 0.02", sq);
    check(fabs(sp - 0.02 / sqrt(8.0)) < 0.0003, "fcprojw std %.5f ~ 0.02/sqrt(2L) = %.5f", sp, 0.02 / sqrt(8.0));
    int zero_pad = 1, ones = 1;
    for (size_t i = (size_t)c.V * c.C; i < sizes[P_WTE]; i++) zero_pad &= a[i] == 0.0f;
    for (size_t i = 0; i < sizes[P_LN1W]; i++) ones &= a[off[P_LN1W] + i] == 1.0f && a[off[P_LN1B] + i] == 0.0f;
    check(zero_pad && ones, "padded wte rows zero, LayerNorm weights 1 and biases 0");
    check(param_init_value(&c, 1, P_FCW, 12345) == a[off[P_FCW] + 12345], "init element computable on its own");
    // every layout's ranks make their slices of the same model: assembled, they are the one-rank model
    int layouts[][3] = {{2, 1, 2}, {4, 4, 1}, {4, 1, 4}, {8, 2, 2}, {4, 2, 2}};
    for (int k = 0; k < 5; k++) {
        int world = layouts[k][0], tp = layouts[k][1], pp = layouts[k][2];
        float *e = init_full(&c, 1, world, tp, pp);
        check(memcmp(a, e, n * 4) == 0, "init assembled from %d ranks (tp %d, pp %d) equals the one-rank init", world, tp, pp);
        free(e);
    }
    free(a); free(b); free(d);
}

// the number of threads: every kernel sums in an order fixed by the shapes
// alone, so the same steps on 1, 2 and 3 threads give the same losses, grad
// norms, gradients and parameters bit for bit

// three AdamW steps of a small model on `threads` threads; its parameters and
// last gradients (file layout) and the losses and norms
static void run_steps(int threads, float *params, float *grads, float *losses, float *norms) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    // C = 80: five vectors of 16 and ten of 8, so the vector paths and the
    // per-block LayerNorm sums (B*T = 76 rows: three blocks) all take part
    GPT2Config c = {.maxT = 32, .V = 301, .Vp = 320, .L = 2, .NH = 5, .C = 80};
    int B = 4, T = 19, BT = B * T;
    GPT2 model;
    Parallel par;
    build_single(&model, &par, &c, init_full(&c, 3, 1, 1, 1), B, T);
    Acts *a = &model.acts[0];
    for (int i = 0; i < BT; i++) { a->inputs[i] = (i * 37) % c.V; a->targets[i] = (i * 53 + 11) % c.V; }
    AdamHyper h = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    for (int step = 0; step < 3; step++) {
        gpt2_zero_grad(&model);
        stage_forward(&model, a, 1);
        stage_backward(&model, a, 1.0f / (float)BT);
        losses[step] = a->mean_loss;
        gpt2_update(&model, &h);
        norms[step] = gpt2_last_norm(&model);
    }
    gpt2_export(&model, model.unit_params, params);
    gpt2_export(&model, model.unit_grads, grads);
    gpt2_free(&model);
}

// the step's first backward writes the Linear and LayerNorm gradients
// instead of adding to cleared ones (grads_fresh), gpt2_zero_grad clears
// only the embeddings', and the backward writes most activation gradients
// without clearing them: with the gradients and the activation gradients
// full of NaN before the step, two micro-batches of backward must give the
// same gradients, bit for bit, as adding both micro-batches to cleared ones
// (grads_fresh off): no tensor is left only added to, and none written past
// the first micro-batch
static void test_fresh_grads(void) {
    GPT2Config c = {.maxT = 32, .V = 301, .Vp = 320, .L = 2, .NH = 5, .C = 80};
    int B = 4, T = 19, BT = B * T;
    size_t n = param_count(&c);
    float *want = (float *)malloc(n * sizeof(float)), *got = (float *)malloc(n * sizeof(float));
    for (int poison = 0; poison <= 1; poison++) {
        GPT2 model;
        Parallel par;
        build_single(&model, &par, &c, init_full(&c, 3, 1, 1, 1), B, T);
        Acts *a = &model.acts[0];
        for (int i = 0; i < BT; i++) { a->inputs[i] = (i * 37) % c.V; a->targets[i] = (i * 53 + 11) % c.V; }
        for (size_t i = 0; i < model.ut.num_local; i++) model.grads[i] = poison ? NAN : 0.0f;
        size_t nacts = 0;
        for (int t = 0; t < NUM_ACT_TENSORS; t++) nacts += model.act_sizes[t];
        for (size_t i = 0; i < nacts; i++) model.dacts.memory[i] = poison ? NAN : 0.0f;
        gpt2_zero_grad(&model);
        if (!poison) model.grads_fresh = 0;  // the reference adds to the gradients cleared above
        for (int mb = 0; mb < 2; mb++) {
            stage_forward(&model, a, 1);
            stage_backward(&model, a, 1.0f / (float)(2 * BT));
        }
        gpt2_export(&model, model.unit_grads, poison ? got : want);
        gpt2_free(&model);
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !(memcmp(&want[i], &got[i], sizeof(float)) == 0 && isfinite(got[i]));
    check(bad == 0, "2 micro-batches from gradients and activation gradients full of NaN: every one of %zu "
          "gradients finite and bit for bit those from cleared ones (%zu differ)", n, bad);
    free(want);
    free(got);
}

// the large arrays start on a cache line, and so does every activation
// tensor, at a B*T of 76 that is no multiple of 16; xcalloc_mapped's memory
// is zeroed and aligned for no elements at all, below 1 MiB (to a cache
// line) and above it (to 2 MiB, a huge page)
static void test_aligned_arrays(void) {
    GPT2Config c = {.maxT = 32, .V = 301, .Vp = 320, .L = 2, .NH = 5, .C = 80};
    GPT2 model;
    Parallel par;
    build_single(&model, &par, &c, init_full(&c, 3, 1, 1, 1), 4, 19);
    const float *arrays[] = {model.params, model.grads, model.m, model.v};
    int bad = 0, tensors = 0;
    for (int i = 0; i < 4; i++) bad += (uintptr_t)arrays[i] % 64 != 0;
    for (int k = 0; k <= model.nacts; k++) {
        const Acts *a = k < model.nacts ? &model.acts[k] : &model.dacts;
        for (int t = 0; t < NUM_ACT_TENSORS; t++, tensors++) bad += (uintptr_t)a->t[t] % 64 != 0;
    }
    check(bad == 0, "params, grads, m, v and %d activation tensors at B=4 T=19 start on a cache line (%d do not)",
          tensors, bad);
    gpt2_free(&model);
    size_t counts[] = {0, 3, 1000, ((size_t)1 << 18) + 5};  // floats; the largest is 1 MiB and 20 bytes
    for (int i = 0; i < 4; i++) {
        size_t n = counts[i], nonzero = 0, align = i < 3 ? 64 : (size_t)2 << 20;
        float *x = (float *)xcalloc_mapped(n, sizeof(float), "test array");
        for (size_t j = 0; j < n; j++) nonzero += x[j] != 0.0f;
        check(x != NULL && (uintptr_t)x % align == 0 && nonzero == 0,
              "xcalloc_mapped(%zu floats): aligned to %zu bytes (address %% %zu = %zu), all zero (%zu are not)", n,
              align, align, (size_t)((uintptr_t)x % align), nonzero);
        for (size_t j = 0; j < n; j++) x[j] = 1.0f;  // every byte is ours to write
        free(x);
    }
}

static void test_thread_count(void) {
#ifndef _OPENMP
    skip("built without OpenMP: one thread only");
#else
    int before = omp_get_max_threads();
    GPT2Config c = {.maxT = 32, .V = 301, .Vp = 320, .L = 2, .NH = 5, .C = 80};
    size_t n = param_count(&c);
    float *p1 = malloc(n * 4), *g1 = malloc(n * 4), *p = malloc(n * 4), *g = malloc(n * 4);
    float l1[3], n1[3], l[3], nm[3];
    run_steps(1, p1, g1, l1, n1);
    for (int threads = 2; threads <= 3; threads++) {
        run_steps(threads, p, g, l, nm);
        check(memcmp(l, l1, sizeof(l)) == 0 && memcmp(nm, n1, sizeof(nm)) == 0,
              "3 steps on %d threads: losses and grad norms bit for bit those of 1 thread (last loss %.7f, %.7f)",
              threads, l[2], l1[2]);
        check(memcmp(g, g1, n * 4) == 0 && memcmp(p, p1, n * 4) == 0,
              "3 steps on %d threads: gradients and parameters bit for bit those of 1 thread", threads);
    }
    omp_set_num_threads(before);
    free(p1); free(g1); free(p); free(g);
#endif
}

// the FMA peak measured again after the launch's steps 1, 10, 100 and 1000,
// one run, the best kept (refine_fma_peak): a peak taken in a busy spell
// (here 1 FLOP/s) is replaced by the one measured; a higher one is never
// lowered; no measure after other steps or after the launch's last
static void test_fma_peak_refined(void) {
    Parallel par;
    par_single(&par);
    double low = 1.0, high = 1e30;
    double after_1 = refine_fma_peak(&par, low, 1, 0), after_1000 = refine_fma_peak(&par, low, 1000, 0);
    check(after_1 > 1e9 && after_1000 > 1e9, "a peak of 1 FLOP/s measured again after step 1 and step 1000: %.3g and "
          "%.3g FLOP/s (more than 1 GFLOP/s)", after_1, after_1000);
    check(refine_fma_peak(&par, high, 10, 0) == high, "a peak above any measure stays after step 10");
    check(refine_fma_peak(&par, low, 2, 0) == low && refine_fma_peak(&par, low, 999, 0) == low,
          "no measure after steps 2 and 999");
    check(refine_fma_peak(&par, low, 1, 1) == low, "no measure after the launch's last step");
}

static void test_lr_schedule(void) {
    Options o;
    options_defaults(&o);
    o.lr = 1.0f; o.warmup = 10; o.final_frac = 0.1f;
    o.schedule = SCHED_COSINE;
    check(fabsf(lr_at_step(&o, 0, 110) - 0.1f) < 1e-6f && fabsf(lr_at_step(&o, 9, 110) - 1.0f) < 1e-6f, "warmup is linear to the peak");
    check(fabsf(lr_at_step(&o, 10, 110) - 1.0f) < 1e-6f && fabsf(lr_at_step(&o, 60, 110) - 0.55f) < 1e-6f, "cosine: peak, then halfway");
    check(fabsf(lr_at_step(&o, 109, 110) - 0.1f) < 1e-3f, "cosine ends at the floor (%.5f)", lr_at_step(&o, 109, 110));
    o.schedule = SCHED_LINEAR;
    check(fabsf(lr_at_step(&o, 60, 110) - 0.55f) < 1e-6f, "linear halfway");
    o.schedule = SCHED_CONSTANT;
    check(lr_at_step(&o, 0, 110) == 1.0f && lr_at_step(&o, 50, 110) == 1.0f, "constant: the peak from step 0 (llm.c's)");
    o.schedule = SCHED_WSD;  // decays from step 0.8 * 110 = 88 as 1 - sqrt, to the floor
    check(fabsf(lr_at_step(&o, 0, 110) - 0.1f) < 1e-6f && lr_at_step(&o, 87, 110) == 1.0f &&
          fabsf(lr_at_step(&o, 88, 110) - 1.0f) < 1e-6f &&
          fabsf(lr_at_step(&o, 99, 110) - (0.1f + (1.0f - sqrtf(0.5f)) * 0.9f)) < 1e-6f, "wsd: warmup, stable, 1 - sqrt");
}

static void test_flags(void) {
    Options o;
    char err[512];
    struct { const char *args[4]; const char *want; } bad[] = {
        {{"-b", "abc"}, "-b: 'abc' is not an integer"},
        {{"-b", "0"}, "-b: 0 is out of range"},
        {{"-l", "1e3x"}, "-l: '1e3x' is not a number"},
        {{"-k", "step"}, "-k: 'step' is not one of {cosine,linear,constant,wsd}"},
        {{"-zz", "1"}, "unknown flag -zz"},
        {{"-x"}, "flag -x needs a value"},
        {{"-z", "4"}, "-z: 4 is out of range"},
        {{"-l", "nan"}, "-l: 'nan' is not a number"},
        {{"-hb", "3"}, "-hb: 3 is out of range [0, 2]"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *argv[5] = {"train_gpt2"};
        int argc = 1;
        for (int k = 0; k < 4 && bad[i].args[k]; k++) argv[argc++] = (char *)bad[i].args[k];
        options_defaults(&o);
        int rc = options_parse(&o, argc, argv, err, sizeof(err));
        check(rc == -1 && strstr(err, bad[i].want) != NULL, "bad flag refused: %s", err);
    }
    // every integer flag of the table: one past each limit is refused with the
    // limits printed exactly as integers, and the limit itself is taken
    int exact = 1, ints = 0;
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptionSpec *s = &option_specs[i];
        if (s->type != OPT_INT) continue;
        ints++;
        long lo = (long)s->min, hi = (long)s->max;
        long past[2] = {lo - 1, hi + 1};
        for (int k = 0; k < 2; k++) {
            if (strcmp(s->flag, "-h") == 0 && past[k] < 0) continue;  // -h before a value starting '-' asks for help
            char value[32], want[160];
            snprintf(value, sizeof(value), "%ld", past[k]);
            snprintf(want, sizeof(want), "flag %s: %ld is out of range [%ld, %ld]", s->flag, past[k], lo, hi);
            char *argv[3] = {"train_gpt2", (char *)s->flag, value};
            options_defaults(&o);
            int rc = options_parse(&o, 3, argv, err, sizeof(err));
            if (rc != -1 || strncmp(err, want, strlen(want)) != 0) {
                check(0, "integer flag %s %s: want '%s', got (rc %d) '%s'", s->flag, value, want, rc, err);
                exact = 0;
            }
        }
        char value[32];
        snprintf(value, sizeof(value), "%ld", hi);
        char *argv[3] = {"train_gpt2", (char *)s->flag, value};
        options_defaults(&o);
        if (options_parse(&o, 3, argv, err, sizeof(err)) != 0 || *(int *)((char *)&o + s->offset) != (int)hi) {
            check(0, "integer flag %s %s: its own upper limit refused or changed: %s", s->flag, value, err);
            exact = 0;
        }
    }
    check(exact && ints >= 40, "all %d integer flags print their limits as exact integers when out of range, and "
          "take their upper limit", ints);
    struct { const char *args[2]; const char *want; } exact_lines[] = {
        {{"-sd", "-1"}, "flag -sd: -1 is out of range [0, 2147483647]"},
        {{"-x", "-2"}, "flag -x: -2 is out of range [-1, 1073741824]"},
        {{"-ep", "2"}, "flag -ep: 2 is out of range [1e-30, 1]"},  // a float flag keeps %g
    };
    for (size_t i = 0; i < sizeof(exact_lines) / sizeof(exact_lines[0]); i++) {
        char *argv[3] = {"train_gpt2", (char *)exact_lines[i].args[0], (char *)exact_lines[i].args[1]};
        options_defaults(&o);
        int rc = options_parse(&o, 3, argv, err, sizeof(err));
        check(rc == -1 && strcmp(err, exact_lines[i].want) == 0, "%s %s: '%s'", argv[1], argv[2], err);
    }
    char *good[] = {"train_gpt2", "-b", "8", "-l", "6e-4", "-k", "linear", "-gc", "0", "-sh", "1"};
    options_defaults(&o);
    check(options_parse(&o, 11, good, err, sizeof(err)) == 0 && o.B == 8 && fabsf(o.lr - 6e-4f) < 1e-9f &&
          o.schedule == SCHED_LINEAR && o.grad_clip == 0.0f && o.shuffle == 1, "good flags parsed");
    // -hb: the GPU trainer's choice of the host backend; this trainer always uses it and takes the flag as given
    int by_default = o.host_backend;
    char *hb[] = {"train_gpt2", "-hb", "1"};
    options_defaults(&o);
    check(by_default == 0 && options_parse(&o, 3, hb, err, sizeof(err)) == 0 && o.host_backend == 1,
          "-hb: 0 by default, -hb 1 parsed");
}

// the real binary: bad flags and files exit 2 with one line naming them;
// a file's line names the flag that gave it and what it is for, the file,
// and why
static void test_cli(void) {
    if (access("./train_gpt2", X_OK) != 0) { skip("./train_gpt2 not built"); return; }
    char out[4096], dir[64], junk[128], shard[128], small[128], key[128], open_key[128], bad_key[128];
    if (test_make_dir(dir, sizeof(dir), "/tmp/llm3d_cli_XXXXXX") != 0) { check(0, "mkdtemp"); return; }
    // junk: 2 KiB that is no file of ours (its magic 0x6b6e756a is none of theirs)
    char bytes[2048];
    for (size_t i = 0; i < sizeof(bytes); i++) bytes[i] = "junk"[i % 4];
    test_write_file(test_path(junk, sizeof(junk), dir, "junk.bin"), bytes, sizeof(bytes));
    test_write_shard(test_path(shard, sizeof(shard), dir, "shard.bin"), 4096);
    test_write_shard(test_path(small, sizeof(small), dir, "small.bin"), 40);  // one micro-batch of 2 x 16 + 1
    test_random_key_file(test_path(key, sizeof(key), dir, "job.key"));
    test_random_key_file(test_path(open_key, sizeof(open_key), dir, "open.key"));
    chmod(open_key, 0644);
    test_write_file(test_path(bad_key, sizeof(bad_key), dir, "bad.key"), "hello\n", 6);
    chmod(bad_key, 0600);
    // each case: flags after the tiny job's (the last of a flag wins), and the
    // whole line wanted after "train_gpt2: ", both formats of the paths a and
    // b. What the file is for is said once, in the role: the loaders' own
    // words for it ("cannot open model file", "key file PATH") are dropped
    struct { const char *args, *want, *a, *b; } files[] = {
        {"-s 1 -tk %s/none.bin", "flag -tk (the tokenizer for samples): %s/none.bin: cannot open: No such file or "
         "directory", dir, NULL},
        {"-s 1 -tk %s", "flag -tk (the tokenizer for samples): %s: header[0] magic is 1802401130, want 20240328 (not a "
         "tokenizer .bin)", junk, NULL},
        {"-e %s/none.bin", "flag -e (the model to start from): %s/none.bin: cannot open: No such file or directory",
         dir, NULL},
        {"-e %s", "flag -e (the model to start from): %s: header field magic = 1802401130, expected 20240326 (not an "
         "llm.c model file)", junk, NULL},
        {"-e %s", "flag -e (the model to start from): %s: not a regular file", dir, NULL},
        {"-h 1 -hf %s/none.bin -v 1 -j %s", "flag -hf (the HellaSwag examples): %s/none.bin: cannot open: No such file "
         "or directory", dir, shard},
        {"-h 1 -hf %s -v 1 -j %s", "flag -hf (the HellaSwag examples): %s: header magic 1802401130 version 1802401130, "
         "expected 20240522 version 1 (llm.c's eval file)", junk, shard},
        {"-i '%s/none_*.bin'", "flag -i (the train data): no files match %s/none_*.bin", dir, NULL},
        {"-i %s", "flag -i (the train data): %s: header[0] (magic) is 1802401130, expected 20240520", junk, NULL},
        {"-v 1 -j '%s/none_*.bin'", "flag -j (the val data): no files match %s/none_*.bin", dir, NULL},
        {"-v 1 -j %s", "flag -j (the val data): %s: header[0] (magic) is 1802401130, expected 20240520", junk, NULL},
        {"-np 2 -v 1 -j %s", "flag -j (the val data): %s holds 1 micro-batches of B*T+1 = 33 tokens per epoch, fewer "
         "than dp_size 2", small, NULL},  // the loader's own words
        {"--key-file %s/none.key", "flag --key-file (the job key): %s/none.key: No such file or directory", dir, NULL},
        {"--key-file %s", "flag --key-file (the job key): %s: mode 0644 lets group or others at it; chmod 600 it",
         open_key, NULL},
        {"--key-file %s", "flag --key-file (the job key): %s: must hold 64 hex digits and an optional newline (6 "
         "bytes)", bad_key, NULL},
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        char cmd[1024], more[600], want[700];
        snprintf(more, sizeof(more), files[i].args, files[i].a, files[i].b);
        int n = snprintf(want, sizeof(want), "train_gpt2: ");
        n += snprintf(want + n, sizeof(want) - (size_t)n, files[i].want, files[i].a, files[i].b);
        snprintf(want + n, sizeof(want) - (size_t)n, "\n");
        snprintf(cmd, sizeof(cmd), "./train_gpt2 -e d2 -ev 256 -et 32 -b 2 -t 16 -x 1 -v 0 -th 1 -i %s %s", shard, more);
        int rc = test_run(cmd, 0, out, sizeof(out));
        if (!check(rc == 2 && strcmp(out, want) == 0, "a bad file: exit %d, one line led by the flag: %.*s", rc,
                   (int)strcspn(out, "\n"), out))
            printf("      wanted: %s", want);
    }
    test_remove_dir(dir);
    struct { const char *args, *want; } cases[] = {
        {"-t abc", "-t: 'abc' is not an integer"},
        {"-q 2", "-q: 2 is out of range"},
        {"-e /nonexistent.bin", "flag -e (the model to start from): /nonexistent.bin: cannot open: No such file"},
        {"-e d0", "flag -e d0: a descriptor dN takes a depth N from 1 to 128"},
        {"-e gpt2:d200", "flag -e gpt2:d200: a descriptor dN takes a depth N from 1 to 128"},
        {"-e dev/fixtures/tiny_model.bin -t 64", "T = 64 exceeds the model's maxT = 32"},
        // -ev -et -ec shape a dN; a model file has its own shape, so a value unlike the file's is refused, not ignored
        {"-e dev/fixtures/tiny_model.bin -ev 256", "flag -ev 256: -e dev/fixtures/tiny_model.bin is a model file, whose "
                                                   "header says V = 500"},
        {"-e dev/fixtures/tiny_model.bin -et 16", "flag -et 16: -e dev/fixtures/tiny_model.bin is a model file, whose "
                                                  "header says maxT = 32"},
        {"-e dev/fixtures/tiny_model.bin -ec 32", "flag -ec 32: -e dev/fixtures/tiny_model.bin is a model file, whose "
                                                  "header says C = 64"},
        {"-h -1", "flag -h: -1 is out of range [0, 1]"},  // a value, though it starts with '-': not a call for help
        {"-e d2 -ev 64 -et 16 -t 8 -b 2 -i '/nonexistent/*.bin'", "flag -i (the train data): no files match /nonexistent/*.bin"},
        {"-e d2 -ev 64 -et 16 -t 8 -b 2 -d 0", "flag -d: 0 tokens per step"},
        {"-e d2 -ev 64 -et 16 -t 16 -b 65536 -mb 4096", "flag -d -1: B*T*dp*mb = 4294967296 tokens per step, more than "
                                                        "the 2147483647 a checkpoint records"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "./train_gpt2 %s", cases[i].args);
        int rc = test_run(cmd, 1, out, sizeof(out)), lines = test_count(out, "\n");
        check(rc == 2 && strstr(out, cases[i].want) != NULL && lines == 1, "train_gpt2 %s -> exit %d, %d line: %.*s",
              cases[i].args, rc, lines, (int)strcspn(out, "\n"), out);
    }
}

// the sample of a byte-level model, untrained: it draws control bytes, ESC
// and bytes that are no UTF-8, and prints them all as printable text
static void test_sample_text(void) {
    if (access("./train_gpt2", X_OK) != 0) { skip("./train_gpt2 not built"); return; }
    char dir[64], tok[128], shard[128], cmd[1024], err[256];
    static char out[65536];
    if (test_make_dir(dir, sizeof(dir), "/tmp/llm3d_sample_XXXXXX") != 0) { check(0, "mkdtemp"); return; }
    test_write_shard(test_path(shard, sizeof(shard), dir, "shard.bin"), 4096);
    if (!check(tokenizer_write_bytes_bin(test_path(tok, sizeof(tok), dir, "bytes.bin"), err, sizeof(err)) == 0,
               "the byte-level tokenizer: %s", err)) {
        test_remove_dir(dir);
        return;
    }
    snprintf(cmd, sizeof(cmd), "./train_gpt2 -e d2 -ev 256 -et 64 -b 1 -t 64 -x 1 -v 0 -s 1 -g 64 -th 1 -tk %s -i %s",
             tok, shard);
    int rc = test_run(cmd, 1, out, sizeof(out));
    const char *from = strstr(out, "generating:\n---\n"), *to = from != NULL ? strstr(from + 15, "\n---\n") : NULL;
    int bad = -1, escapes = 0;
    if (from != NULL && to != NULL) {
        bad = 0;
        for (const unsigned char *p = (const unsigned char *)from + 15; p < (const unsigned char *)to; p++) {
            bad += (*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7f;
            escapes += p[0] == '\\' && p[1] == 'x';
        }
    }
    check(rc == 0 && bad == 0 && escapes > 0, "an untrained byte-level model's sample (exit %d): %d control bytes "
          "printed raw, %d escaped as \\xNN", rc, bad, escapes);
    test_remove_dir(dir);
}

int main(void) {
    test_against_pytorch(fixture_model, fixture_state, 0);
    test_against_pytorch(fixture_ln_model, fixture_ln_state, 1);
    test_layernorm_fd();
    test_matmul_fd();
    test_matmul_shapes();
    test_sum_squares();
    test_fresh_grads();
    test_aligned_arrays();
    test_gelu_fd();
    test_attention_fd();
    test_attention_reference();
    test_crossentropy_fd();
    test_crossentropy_same_bits();
    test_model_fd();
    test_thread_count();
    test_fma_peak_refined();
    test_model_files();
    test_init();
    test_lr_schedule();
    test_flags();
    test_cli();
    test_sample_text();
    return test_summary();
}
