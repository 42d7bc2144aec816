/*
 * classifier.cu: the fused softmax + cross-entropy + gradient over the
 * logits, in place, padded columns ignored, against the CPU.
 */
#include "llm3d/cuda/classifier.cuh"
#include "dev/cuda/common.h"

typedef struct {
    floatX *logits;
    const floatX *logits0;
    float *losses;
    const int *targets;
    float dloss;
    int BT, V, Vp;
} ClsCtx;

static void run_classifier(void *p) {
    ClsCtx *c = (ClsCtx *)p;
    // restore the logits first: the kernel overwrites them (timed with it)
    CUDA_CHECK(cudaMemcpyAsync(c->logits, c->logits0, (size_t)c->BT * c->Vp * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
    classifier(c->logits, c->losses, c->targets, c->dloss, c->BT, c->V, c->Vp, 1, 0);
}

// the two-read kernel whatever the width, to time against the one-read one
static void run_classifier_two_reads(void *p) {
    ClsCtx *c = (ClsCtx *)p;
    CUDA_CHECK(cudaMemcpyAsync(c->logits, c->logits0, (size_t)c->BT * c->Vp * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
    classifier_kernel<<<c->BT, CLASSIFIER_THREADS>>>(c->logits, c->losses, c->targets, c->dloss, c->V, c->Vp, 1);
    CUDA_CHECK(cudaGetLastError());
}

// the CPU's losses and dlogits for logits z (BT, Vp)
static void cpu_classifier(float *loss, float *dz, const float *z, const int *targets, float dloss, int BT, int V, int Vp) {
    for (int r = 0; r < BT; r++) {
        const float *row = z + (size_t)r * Vp;
        double m = -1e300, s = 0.0;
        for (int i = 0; i < V; i++) m = row[i] > m ? row[i] : m;
        for (int i = 0; i < V; i++) s += exp(row[i] - m);
        loss[r] = (float)(m + log(s) - row[targets[r]]);
        for (int i = 0; i < Vp; i++)
            dz[(size_t)r * Vp + i] = i < V ? (float)((exp(row[i] - m) / s - (i == targets[r])) * dloss) : 0.0f;
    }
}

// checks against the CPU, or (timed) only times: the CPU would take seconds.
// A timed shape draws 256 rows and repeats them on the device: the kernel's
// work is the same, and the host does not draw hundreds of millions of
// numbers first (8192 x 50304 took tens of seconds).
static void check_shape(int BT, int V, int Vp, int timed) {
    printf("BT = %d, V = %d, Vp = %d\n", BT, V, Vp);
    size_t n = (size_t)BT * Vp;
    int drawn = timed && BT > 256 ? 256 : BT;
    size_t nd = (size_t)drawn * Vp;
    float *z = host_random(nd, 2.0f, 21);
    for (int r = 0; r < drawn; r++)  // padded columns hold garbage that must not leak in
        for (int i = V; i < Vp; i++) z[(size_t)r * Vp + i] = 100.0f;
    int *targets = (int *)malloc(BT * sizeof(int));
    for (int r = 0; r < BT; r++) targets[r] = (int)(mix64((uint64_t)r + 5) % (uint64_t)V);
    targets[0] = V - 1;
    float *zeros = (float *)calloc(BT, 4);
    floatX *logits0 = to_device(z, nd);
    if (drawn < BT) {
        floatX *all;
        CUDA_CHECK(cudaMalloc((void **)&all, n * sizeof(floatX)));
        for (int r = 0; r < BT; r += drawn) {
            size_t rows = (size_t)(BT - r < drawn ? BT - r : drawn);
            CUDA_CHECK(cudaMemcpy(all + (size_t)r * Vp, logits0, rows * Vp * sizeof(floatX), cudaMemcpyDeviceToDevice));
        }
        cudaFree(logits0);
        logits0 = all;
    }
    ClsCtx c = {NULL, logits0, to_device_f32(zeros, BT), to_device_int(targets, BT), 1.0f / BT, BT, V, Vp};
    CUDA_CHECK(cudaMalloc((void **)&c.logits, n * sizeof(floatX)));
    if (timed) {
        // bytes: the restore's read and write, then the kernel's (one read and
        // one write; the two-read kernel moves one more read than counted)
        print_time("classifier (+ logits restore)", time_ms(run_classifier, &c, 10), 4.0 * n * sizeof(floatX), 0);
        print_time("classifier two-read kernel (+ logits restore)", time_ms(run_classifier_two_reads, &c, 10),
                   4.0 * n * sizeof(floatX), 0);
    } else {
        float *loss = (float *)malloc(BT * 4), *dz = (float *)malloc(n * 4);
        cpu_classifier(loss, dz, z, targets, c.dloss, BT, V, Vp);
        run_classifier(&c);
        float *gloss = to_host_f32(c.losses, BT), *gdz = to_host(c.logits, n);
        compare("classifier losses", gloss, loss, BT, 1e-5f);
        compare("classifier dlogits (in place)", gdz, dz, n, IS_BF16 ? 1e-2f : 1e-5f);
        int pad_zero = 1;
        for (int r = 0; r < BT; r++)
            for (int i = V; i < Vp; i++) pad_zero &= gdz[(size_t)r * Vp + i] == 0.0f;
        check(pad_zero, "padded columns get gradient 0 (they held 100)");
        run_classifier(&c);  // losses accumulate
        float *gloss2 = to_host_f32(c.losses, BT);
        for (int r = 0; r < BT; r++) loss[r] *= 2.0f;
        compare("classifier losses accumulate", gloss2, loss, BT, 1e-5f);
        free(loss); free(dz); free(gloss); free(gdz); free(gloss2);
    }
    cudaFree(c.logits); cudaFree((void *)c.logits0); cudaFree(c.losses); cudaFree((void *)c.targets);
    free(z); free(targets); free(zeros);
}

// the vocab-parallel cross-entropy of tensor parallelism: tp slices of
// Vp / tp rows each (the last ones may hold only padding), each its row
// statistics (classifier_stats_kernel), all of them merged in slice order
// (classifier_tp_kernel): the losses (each on the slice holding the target)
// add up to the fused classifier's, and the slices of dlogits are its columns
static void check_tp(int BT, int V, int Vp, int tp) {
    printf("tensor parallel: BT = %d, V = %d, Vp = %d over tp = %d\n", BT, V, Vp, tp);
    int Vl = Vp / tp;
    size_t n = (size_t)BT * Vp;
    float *z = host_random(n, 2.0f, 23);
    int *targets = (int *)malloc(BT * sizeof(int));
    for (int r = 0; r < BT; r++) targets[r] = (int)(mix64((uint64_t)r + 9) % (uint64_t)V);
    float *loss = (float *)malloc(BT * 4), *dz = (float *)malloc(n * 4), *zeros = (float *)calloc(BT, 4);
    cpu_classifier(loss, dz, z, targets, 1.0f / BT, BT, V, Vp);
    float *slice = (float *)malloc((size_t)BT * Vl * 4), *got_dz = (float *)malloc(n * 4);
    float2 *stats;
    CUDA_CHECK(cudaMalloc((void **)&stats, (size_t)tp * BT * sizeof(float2)));
    floatX *logits[16];
    float *losses = to_device_f32(zeros, BT);
    int *dtargets = to_device_int(targets, BT);
    for (int k = 0; k < tp; k++) {  // slice k: columns [k Vl, (k+1) Vl) of every row
        for (int r = 0; r < BT; r++) memcpy(slice + (size_t)r * Vl, z + (size_t)r * Vp + (size_t)k * Vl, Vl * 4);
        logits[k] = to_device(slice, (size_t)BT * Vl);
        int real = V - k * Vl, nreal = real < 0 ? 0 : real > Vl ? Vl : real;
        classifier_stats_kernel<<<BT, CLASSIFIER_THREADS>>>(stats + (size_t)k * BT, logits[k], Vl, nreal);
    }
    for (int k = 0; k < tp; k++) {
        int real = V - k * Vl, nreal = real < 0 ? 0 : real > Vl ? Vl : real;
        classifier_tp_kernel<<<BT, CLASSIFIER_THREADS>>>(logits[k], losses, dtargets, stats, tp, BT, 1.0f / BT, k * Vl,
                                                         Vl, nreal, 1);
        float *d = to_host(logits[k], (size_t)BT * Vl);
        for (int r = 0; r < BT; r++) memcpy(got_dz + (size_t)r * Vp + (size_t)k * Vl, d + (size_t)r * Vl, Vl * 4);
        free(d);
        cudaFree(logits[k]);
    }
    CUDA_CHECK(cudaGetLastError());
    float *got_loss = to_host_f32(losses, BT);
    compare("tp classifier losses (each counted on one slice)", got_loss, loss, BT, 1e-5f);
    compare("tp classifier dlogits, slice by slice", got_dz, dz, n, IS_BF16 ? 1e-2f : 1e-5f);
    cudaFree(stats); cudaFree(losses); cudaFree(dtargets);
    free(z); free(targets); free(loss); free(dz); free(zeros); free(slice); free(got_dz); free(got_loss);
}

int main(void) {
    if (!require_gpu()) return test_summary();
    // GPT-2's vocab; small: still more columns than one pass of the block, V not a multiple of PACK
    int rows = shape_size(256, 4), V = shape_size(50257, 9001), Vp = shape_size(50304, 9024);
    check_shape(rows, V, Vp, 0);
    check_shape(64, 500, 512, 0);  // the fixture's vocab
    check_shape(3, 7, 8, 0);       // fewer columns than one thread's share
    // a row wider than the shared memory of an H100's block (227 KiB): the
    // two-read kernel
    check_shape(4, 120001, 120008, 0);
    check_tp(shape_size(64, 4), V, Vp, 2);
    check_tp(64, 500, 512, 4);
    check_tp(16, 100, 512, 4);     // slices 1..3 hold only padding
    if (!small_shapes()) check_shape(64 * 1024, 50257, 50304, 1);  // the benchmark's B = 64, T = 1024
    return test_summary();
}
