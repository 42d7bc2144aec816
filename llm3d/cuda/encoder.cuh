/*
 * llm3d/cuda/encoder.cuh: the token and position embeddings.
 *
 * defines:
 *   encoder_forward    the forward: wte row plus wpe row, for this rank's
 *                      vocabulary rows
 *   encoder_backward   the backward: dwpe as a sum over the batch, dwte one
 *                      block per token over the host's token_buckets, so no
 *                      atomics
 *   token_buckets      the positions of each token of this rank's rows,
 *                      grouped by token on the host (a stable counting sort)
 */
#ifndef LLM3D_ENCODER_CUH
#define LLM3D_ENCODER_CUH

#include <string.h>

#include "llm3d/cuda/cuda_common.cuh"

// ----------------------------------------------------------------------------
// encoder: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]. Under tensor
// parallelism a rank holds wte rows [v0, v0 + Vl) and adds only those (zero
// for the other tokens), and only tp rank 0 adds wpe (NULL elsewhere): the
// all-reduce over the ranks then gives the sum.

__global__ void encoder_forward_kernel(floatX *out, const int *inp, const floatX *wte, const floatX *wpe,
                                       int BT, int T, int C, int v0, int Vl) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (idx >= (size_t)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C), row = inp[bt] - v0;
    Pack o;
    for (int k = 0; k < PACK; k++) o.v[k] = to_x(0.0f);
    if (row >= 0 && row < Vl) o = load_pack(wte + (size_t)row * C + c);
    if (wpe != NULL) {
        Pack b = load_pack(wpe + (size_t)(bt % T) * C + c);
        for (int k = 0; k < PACK; k++) o.v[k] = to_x(to_f(o.v[k]) + to_f(b.v[k]));
    }
    store_pack(out + idx, o);
}

// dwpe[t,:] += sum over b of dout[b,t,:]
__global__ void encoder_backward_wpe_kernel(floatX *dwpe, const floatX *dout, int B, int T, int C) {
    size_t idx = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (idx >= (size_t)T * C) return;
    float acc[PACK] = {0};
    for (int b = 0; b < B; b++) {
        Pack d = load_pack(dout + (size_t)b * T * C + idx);
        for (int k = 0; k < PACK; k++) acc[k] += to_f(d.v[k]);
    }
    Pack w = load_pack(dwpe + idx);
    for (int k = 0; k < PACK; k++) w.v[k] = to_x(to_f(w.v[k]) + acc[k]);
    store_pack(dwpe + idx, w);
}

// dwte[token,:] += the rows of dout at the positions holding that token. The
// host groups positions by token (token_buckets below), so each block owns
// one token's row: no two blocks write the same row, no atomics.
__global__ void encoder_backward_wte_kernel(floatX *dwte, const floatX *dout, const int *bucket_start,
                                            const int *bucket_token, const int *bucket_pos, int C) {
    int bucket = blockIdx.x;
    int c = (blockIdx.y * blockDim.x + threadIdx.x) * PACK;
    if (c >= C) return;
    float acc[PACK] = {0};
    for (int j = bucket_start[bucket]; j < bucket_start[bucket + 1]; j++) {
        Pack d = load_pack(dout + (size_t)bucket_pos[j] * C + c);
        for (int k = 0; k < PACK; k++) acc[k] += to_f(d.v[k]);
    }
    floatX *row = dwte + (size_t)bucket_token[bucket] * C + c;
    Pack w = load_pack(row);
    for (int k = 0; k < PACK; k++) w.v[k] = to_x(to_f(w.v[k]) + acc[k]);
    store_pack(row, w);
}

// groups the positions holding a token of this rank's vocabulary rows [v0,
// v0 + Vl) by token with a stable counting sort: bucket i is row
// bucket_token[i] (the token less v0) at positions bucket_pos[bucket_start[i]
// .. bucket_start[i+1]), in increasing order. count is scratch of V+1 ints.
// Returns the number of buckets, or -1 if a token is outside [0, V).
static int token_buckets(const int *inputs, int BT, int V, int v0, int Vl, int *count, int *bucket_start,
                         int *bucket_token, int *bucket_pos) {
    memset(count, 0, (size_t)(V + 1) * sizeof(int));
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) return -1;
        count[inputs[i] + 1]++;
    }
    for (int v = 0; v < V; v++) count[v + 1] += count[v];  // count[v]: positions holding a token below v
    int lo = v0 < V ? v0 : V, hi = v0 + Vl < V ? v0 + Vl : V, base = count[lo], nbuckets = 0;
    for (int v = lo; v < hi; v++) {
        if (count[v + 1] == count[v]) continue;
        bucket_token[nbuckets] = v - v0;
        bucket_start[nbuckets] = count[v] - base;
        nbuckets++;
    }
    bucket_start[nbuckets] = count[hi] - base;
    for (int i = 0; i < BT; i++)
        if (inputs[i] >= lo && inputs[i] < hi) bucket_pos[count[inputs[i]]++ - base] = i;
    return nbuckets;
}

// ----------------------------------------------------------------------------
// kernel launchers

// wte: rows [v0, v0 + Vl) of the vocabulary; wpe NULL: no positions added
static void encoder_forward(floatX *out, const int *inp, const floatX *wte, const floatX *wpe, int v0, int Vl, int B,
                            int T, int C, cudaStream_t stream) {
    int n = B * T * C / PACK;
    encoder_forward_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(out, inp, wte, wpe, B * T, T, C, v0, Vl);
    CUDA_CHECK(cudaGetLastError());
}

static void encoder_backward(floatX *dwte, floatX *dwpe, const floatX *dout, const int *bucket_start,
                             const int *bucket_token, const int *bucket_pos, int nbuckets, int B, int T, int C,
                             cudaStream_t stream) {
    encoder_backward_wpe_kernel<<<ceil_div(T * C / PACK, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    CUDA_CHECK(cudaGetLastError());
    if (nbuckets == 0) return;  // a vocabulary slice none of this micro-batch's tokens falls in
    dim3 grid(nbuckets, ceil_div(C / PACK, 128));
    encoder_backward_wte_kernel<<<grid, 128, 0, stream>>>(dwte, dout, bucket_start, bucket_token, bucket_pos, C);
    CUDA_CHECK(cudaGetLastError());
}

#endif
