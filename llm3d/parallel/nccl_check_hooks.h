/*
 * nccl_check_hooks.h: the checked collectives' hooks in the NCCL backend
 * (-ic 1; nccl_check.h has the records, the order of the sums and the
 * verdict): what runs around each all-reduce, reduce-scatter and all-gather
 * of fp32 or bf16 values, the -gp rule's gradient count, and -fault corrupt
 * and poison.
 *
 * defines:
 *   nccl_set_check, nccl_set_label, nccl_count_grads, nccl_grad_sumsq_slots
 *                        on or off; what the next collective carries; the
 *                        next collective reduces this rank's gradients; the
 *                        ranks' sums of squares of them (-gp)
 *   nchk_before, nchk_after, nchk_free
 *                        the hooks, and the checks' buffers at the end
 *   and their helpers: nchk_group_index, nchk_gather_group, nchk_malloc,
 *   nchk_buffers, nchk_wait, nchk_quiesce, nchk_coef_take, nchk_record,
 *   nchk_call_number, nchk_sketch, nchk_corrupt
 *
 * A part of nccl_comm.h, not a header of its own (as host_mode.h): it works
 * on nccl_comm.h's NcclComm and NcclGroup, and nccl_comm.h's collectives,
 * which come after it, call its hooks. So nccl_comm.h includes it between
 * the two, in CUDA builds only (-DLLM3D_NCCL). nccl_check_point, which
 * gathers and judges the records at the step's end, stays in nccl_comm.h
 * beside nccl_side_drain, which it waits on.
 */
#ifndef LLM3D_NCCL_CHECK_HOOKS_H
#define LLM3D_NCCL_CHECK_HOOKS_H

#ifdef LLM3D_NCCL
// checked collectives over NCCL (-ic 1; nccl_check.h has the records, the
// order of the sums and the verdict). Around each all-reduce, reduce-scatter,
// all-gather and broadcast of fp32 or bf16 values (nchk_before, nchk_after): the
// coefficients drawn on the host (sketch.h's sketch_draw, under the job's
// sketch key, this launch's, as the host backend's) and copied to the GPU
// through a pinned arena, the input sketched on the call's stream before it,
// the output after it, into this member's records on the GPU. Nothing waits:
// the records are all-gathered and judged at the step's check point
// (nccl_check_point, before the update), where the host waits anyway. Host
// mode turns the host backend's own checks on instead. The same hooks count
// this rank's gradients for the -gp rule (nccl_count_grads, with or without
// the checks: the sum of squares of what it puts into the dp reductions),
// scale them under -fault poison, and flip -fault corrupt's bit in a sender's
// buffer between its sketch and the call.

#define NCHK_COEF_MIN (1u << 22)   // floats of the coefficients' arena at first (16 MiB on each side)

// nccl_set_check: -ic 1 (after nccl_init): the host backend's checks in
// host mode, else this layer's (a world of one has nothing to check)
static inline void nccl_set_check(NcclComm *c, int on) {
    if (c == NULL) return;
    if (c->host != NULL) comm_set_check(c->host, on);
    else c->chk.on = on != 0 && c->chk.gen != NULL && c->world.group.size > 1;
}

// nccl_set_label: what the next collective carries ("the gradients of unit
// 3"), named by the line of a failed check; copied
static inline void nccl_set_label(NcclComm *c, const char *label) {
    if (c != NULL) snprintf(c->chk.label, sizeof(c->chk.label), "%s", label);
}

// nccl_count_grads: the next collective reduces this rank's gradients over
// the dp group: their sum of squares, as this rank puts them in, counts
// towards nccl_grad_sumsq_slots (and -fault poison scales them first)
static inline void nccl_count_grads(NcclComm *c) {
    if (c != NULL) c->chk.count = 1;
}

static inline int nchk_group_index(NcclComm *c, const NcclGroup *g) {
    const NcclGroup *gs[NCHK_GROUPS] = {&c->world, &c->dp, &c->tp, &c->pp, &c->dp_side};
    for (int i = 0; i < NCHK_GROUPS; i++)
        if (gs[i] == g) return i;
    nccl_fail(c, "checked collectives: a group that is not this rank's world, dp, tp or pp");
    return 0;
}

// the communicator the check point gathers group i's records over: dp's for
// the overlapped reductions' (on the main stream, after they are drained)
static inline const NcclGroup *nchk_gather_group(const NcclComm *c, int i) {
    const NcclGroup *gs[NCHK_GROUPS] = {&c->world, &c->dp, &c->tp, &c->pp, &c->dp};
    return gs[i];
}

static inline void nchk_malloc(NcclComm *c, void **p, size_t bytes, const char *what) {
    nccl_check_cuda(c, cudaMalloc(p, bytes), what);
}

// the device buffers every hook needs, made at the first one
static inline void nchk_buffers(NcclComm *c) {
    if (c->chk.grad_q != NULL) return;
    size_t partial = (size_t)c->world.group.size * NCHK_BLOCKS * 5 * sizeof(double);
    for (int k = 0; k < 2; k++) nchk_malloc(c, (void **)&c->chk.partial[k], partial, "the checks' block sums");
    nchk_malloc(c, (void **)&c->chk.grad_q, sizeof(double), "the gradients' sum of squares");
    nchk_malloc(c, (void **)&c->chk.flip, 3 * sizeof(double), "the fault's flip");
    nchk_malloc(c, (void **)&c->chk.verdict, sizeof(float), "the checks' verdict");
    nccl_check_cuda(c, cudaMemset(c->chk.grad_q, 0, sizeof(double)), "the gradients' sum of squares");
}

// nchk_wait: a host wait inside a collective's hooks. nccl_sync names itself
// the call in progress (for its own watchdog's line); the collective's name
// comes back after, so that its record, the fault's line and the watchdog's
// last call queued (nccl_queued) name the collective, not the wait
static inline void nchk_wait(NcclComm *c, cudaStream_t st, const char *what) {
    const char *op = c->op;
    char call_what[sizeof(c->what)];
    memcpy(call_what, c->what, sizeof(call_what));
    nccl_sync(c, st, what);
    c->op = op;
    memcpy(c->what, call_what, sizeof(call_what));
}

// both streams drained: what the arenas and records held for the kernels queued so far is free
static inline void nchk_quiesce(NcclComm *c, const char *what) {
    nchk_wait(c, c->stream, what);
    nchk_wait(c, c->side, what);
}

// nchk_coef_take: room for count floats of coefficients in the arenas; the
// offset. A full arena waits for the GPU and starts over (a bigger one if needed).
static inline size_t nchk_coef_take(NcclComm *c, size_t count) {
    NchkState *k = &c->chk;
    if (k->coef_used + count <= k->coef_cap) {
        k->coef_used += count;
        return k->coef_used - count;
    }
    nchk_quiesce(c, "the checks' coefficients");
    if (count > k->coef_cap) {
        cudaFree(k->coef);
        cudaFreeHost(k->coef_host);
        k->coef_cap = count > NCHK_COEF_MIN ? 2 * count : NCHK_COEF_MIN;
        nchk_malloc(c, (void **)&k->coef, k->coef_cap * sizeof(float), "the checks' coefficients");
        nccl_check_cuda(c, cudaHostAlloc((void **)&k->coef_host, k->coef_cap * sizeof(float), cudaHostAllocDefault),
                        "the checks' coefficients");
    }
    k->coef_used = count;
    return 0;
}

// nchk_record: a new record of group i (2p sketches, zeroed on stream st):
// its index. Records grow by doubling, once the GPU is done with the old ones.
static inline size_t nchk_record(NcclComm *c, int i, int p, cudaStream_t st) {
    NchkState *k = &c->chk;
    size_t each = nchk_rec_count(p) * 5 * sizeof(double);
    if (k->nrec[i] == k->rec_cap[i]) {
        size_t cap = k->rec_cap[i] ? 2 * k->rec_cap[i] : 256;
        double *grown = NULL;
        nchk_quiesce(c, "the checks' records");
        nchk_malloc(c, (void **)&grown, cap * each, "the checks' records");
        if (k->nrec[i] > 0)
            nccl_check_cuda(c, cudaMemcpy(grown, k->rec[i], k->nrec[i] * each, cudaMemcpyDeviceToDevice),
                            "the checks' records");
        cudaFree(k->rec[i]);
        k->rec[i] = grown;
        k->rec_cap[i] = cap;
    }
    size_t at = k->nrec[i]++;
    nccl_check_cuda(c, cudaMemsetAsync(k->rec[i] + at * nchk_rec_count(p) * 5, 0, each, st), "the checks' records");
    return at;
}

// the draw's call number: the checked calls so far on this group (by its
// digest, so dp and its overlapped communicator count as one group)
static inline uint64_t nchk_call_number(NcclComm *c, uint64_t digest) {
    NchkState *k = &c->chk;
    for (int i = 0; i < k->ngroups; i++)
        if (k->group_digest[i] == digest) return k->group_calls[i]++;
    if (k->ngroups == NCHK_GROUPS) nccl_fail(c, "checked collectives: more than %d groups", NCHK_GROUPS);
    k->group_digest[k->ngroups] = digest;
    k->group_calls[k->ngroups++] = 1;
    return 0;
}

// the sketch kernel and its final pass on stream st: `parts` pieces of x
// (nchk_sketch_kernel's chunked and first), their records into dst (NULL:
// none), their squares into *q_acc (NULL: none)
static inline void nchk_sketch(NcclComm *c, cudaStream_t st, const void *x, ncclDataType_t type, size_t n, int parts,
                               int chunked, size_t first, const float *coef, int full, double *dst, double *q_acc) {
    double *partial = c->chk.partial[st == c->side ? 1 : 0];
    dim3 grid(NCHK_BLOCKS, (unsigned)parts);
    if (type == ncclBfloat16)
        nchk_sketch_kernel<<<grid, NCHK_THREADS, 0, st>>>(partial, (const __nv_bfloat16 *)x, n, parts, chunked, first,
                                                          coef, full);
    else
        nchk_sketch_kernel<<<grid, NCHK_THREADS, 0, st>>>(partial, (const float *)x, n, parts, chunked, first, coef,
                                                          full);
    nchk_final_kernel<<<1, NCHK_BLOCKS, 0, st>>>(dst, partial, parts, q_acc);
    nccl_check_cuda(c, cudaGetLastError(), "the checks' sketch");
}

// -fault corrupt, corrupt-low: this rank's first fp32 or bf16 collective of
// the fault's step gets one bit flipped in one of the first NCHK_FLIP_SCAN
// values it puts in (x, len of them; nchk_flip_key's), after its sketch, before
// the call; the host waits to say what changed (a fault's run only)
static inline void nchk_corrupt(NcclComm *c, const NcclGroup *g, void *x, size_t len, ncclDataType_t type,
                                cudaStream_t st) {
    int kind = c->fault.kind;
    if ((kind != FAULT_CORRUPT && kind != FAULT_CORRUPT_LOW) || c->chk.corrupt_done || len == 0 ||
        !fault_fires(&c->fault, c->rank, c->step))
        return;
    c->chk.corrupt_done = 1;
    nchk_buffers(c);
    int bit = fault_flip_bit(kind);
    if (type == ncclBfloat16) bit = bit >= 16 ? bit - 16 : bit;  // bf16: the top half of an fp32's bits
    int low = kind == FAULT_CORRUPT_LOW;
    if (type == ncclBfloat16) nchk_flip_kernel<<<1, 1024, 0, st>>>((__nv_bfloat16 *)x, len, bit, low, c->chk.flip);
    else nchk_flip_kernel<<<1, 1024, 0, st>>>((float *)x, len, bit, low, c->chk.flip);
    nccl_check_cuda(c, cudaGetLastError(), "the fault's flip");
    double info[3] = {0, 0, 0};
    nchk_wait(c, st, "the fault's flip");
    nccl_check_cuda(c, cudaMemcpy(info, c->chk.flip, sizeof(info), cudaMemcpyDeviceToHost), "the fault's flip");
    fprintf(stderr, "rank %d: fault %s: flipped bit %d of element %zu (%.9g to %.9g) of its input to nccl %s on the %s "
            "group (step %ld)\n", c->rank, fault_name(kind), bit, (size_t)info[0], info[1], info[2], c->op, g->name,
            c->step);
}

// nchk_before: the start of a collective of kind on group g over in (its
// input: an all-reduce's n, a reduce-scatter's p pieces of n, an
// all-gather's own piece of n, a broadcast's n from member root), on stream
// st. Returns the index of its checked call, or -1 when it is not checked.
// Host mode: the label and the count go to the host backend, which checks
// and counts itself; a broadcast's frames are MAC'd there, not sketched, so
// its label ends here, not passed on to stick to the next checked call.
static inline int nchk_before(NcclComm *c, const NcclGroup *g, int kind, void *in, size_t n, ncclDataType_t type,
                              int op, int root, cudaStream_t st) {
    NchkState *k = &c->chk;
    int count = k->count, p = g->group.size, me = g->group.me;
    k->count = 0;
    memcpy(k->cur_label, k->label, sizeof(k->label));
    k->label[0] = '\0';
    int floats = type == ncclFloat32 || type == ncclBfloat16, whole = kind == SK_ALLREDUCE || kind == SK_BROADCAST;
    size_t total = whole ? n : n * (size_t)p, in_len = kind == SK_ALLGATHER ? n : total;
    int sends = kind != SK_BROADCAST || me == root;  // a broadcast's other members put nothing in
    if (count && floats && fault_poison_fires(&k->poison, c->rank, c->step) && in_len > 0) {
        if (type == ncclBfloat16) nchk_scale_kernel<<<256, 256, 0, st>>>((__nv_bfloat16 *)in, in_len, FAULT_POISON_SCALE);
        else nchk_scale_kernel<<<256, 256, 0, st>>>((float *)in, in_len, FAULT_POISON_SCALE);
        nccl_check_cuda(c, cudaGetLastError(), "the fault's poison");
    }
    if (c->host != NULL) {
        if (count) comm_count_grads(c->host);
        if (k->cur_label[0] && kind != SK_BROADCAST) comm_set_label(c->host, k->cur_label);
        return -1;
    }
    if (!floats || p == 1) return -1;
    if (!k->on) {
        if (count) {  // the -gp rule's sum of squares alone
            nchk_buffers(c);
            nchk_sketch(c, st, in, type, in_len, 1, 1, 0, NULL, 1, NULL, k->grad_q);
        }
        if (sends) nchk_corrupt(c, g, in, in_len, type, st);
        return -1;
    }
    nchk_buffers(c);
    uint64_t digest = comm_group_digest(&g->group), call = nchk_call_number(c, digest);
    if (sketch_draw(k->gen, c->step, digest, call, kind, total) != 0)
        nccl_fail(c, "out of memory for the checks' coefficients (%zu elements)", total);
    size_t ncoef = nchk_coef_count(k->gen->blocks), off = nchk_coef_take(c, ncoef);
    nchk_coef_pack(k->gen, k->coef_host + off);
    nccl_check_cuda(c, cudaMemcpyAsync(k->coef + off, k->coef_host + off, ncoef * sizeof(float), cudaMemcpyHostToDevice,
                                       st), "the checks' coefficients");
    if (k->ncalls == k->calls_cap) {
        int cap = k->calls_cap ? 2 * k->calls_cap : 256;
        NchkCall *grown = (NchkCall *)realloc(k->calls, (size_t)cap * sizeof(NchkCall));
        if (grown == NULL) nccl_fail(c, "out of memory for the checked calls");
        k->calls = grown;
        k->calls_cap = cap;
    }
    int i = nchk_group_index(c, g);
    NchkCall *call_rec = &k->calls[k->ncalls];
    call_rec->op = c->op;
    call_rec->kind = kind;
    call_rec->group = i;
    call_rec->avg = op == OP_AVG;
    call_rec->bf16 = type == ncclBfloat16;
    call_rec->step = c->step;
    call_rec->n = n;
    call_rec->root = root;
    call_rec->at = nchk_record(c, i, p, st);
    call_rec->coef = off;
    memcpy(call_rec->label, k->cur_label, sizeof(call_rec->label));
    double *rec = k->rec[i] + call_rec->at * nchk_rec_count(p) * 5;
    double *q = count ? k->grad_q : NULL;
    const float *coef = k->coef + off;
    if (kind == SK_BROADCAST) {  // the root's buffer, the one piece of the vector
        if (me == root) nchk_sketch(c, st, in, type, n, 1, 0, 0, coef, 0, rec + nchk_rec_in(p, root) * 5, NULL);
    } else if (kind == SK_ALLGATHER) {
        nchk_sketch(c, st, in, type, n, 1, 0, (size_t)me, coef, 1, rec + nchk_rec_in(p, me) * 5, q);
    } else {
        nchk_sketch(c, st, in, type, n, p, kind == SK_ALLREDUCE, 0, coef, 1, rec + nchk_rec_in(p, 0) * 5, q);
    }
    if (sends) nchk_corrupt(c, g, in, in_len, type, st);
    return k->ncalls++;
}

// nchk_after: the output of checked call idx (from nchk_before) sketched
// on stream st, behind the call
static inline void nchk_after(NcclComm *c, int idx, const NcclGroup *g, const void *out, ncclDataType_t type,
                              cudaStream_t st) {
    if (idx < 0) return;
    NchkState *k = &c->chk;
    const NchkCall *call = &k->calls[idx];
    int p = g->group.size, me = g->group.me;
    double *rec = k->rec[call->group] + call->at * nchk_rec_count(p) * 5;
    const float *coef = k->coef + call->coef;
    if (call->kind == SK_REDUCE_SCATTER)
        nchk_sketch(c, st, out, type, call->n, 1, 0, (size_t)me, coef, 0, rec + nchk_rec_out(p, me) * 5, NULL);
    else if (call->kind == SK_BROADCAST)
        nchk_sketch(c, st, out, type, call->n, 1, 0, 0, coef, 0, rec + nchk_rec_out(p, call->root) * 5, NULL);
    else
        nchk_sketch(c, st, out, type, call->n, p, call->kind == SK_ALLREDUCE, 0, coef, 0, rec + nchk_rec_out(p, 0) * 5,
                    NULL);
}

// nccl_grad_sumsq_slots: slots[world] on the device (stream st): zeros, and
// in this rank's slot the sum of squares of the gradients it counted since
// the last call (nccl_count_grads), which starts afresh. The caller sums the
// slots over the world in a collective it makes anyway, and every rank then
// holds every rank's own gradient norm (the -gp rule's). The overlapped
// reductions must be drained first (nccl_side_drain).
static inline void nccl_grad_sumsq_slots(NcclComm *c, float *slots, cudaStream_t st) {
    double v = 0.0;
    if (c->host != NULL) v = comm_grad_sumsq(c->host);
    else nchk_buffers(c);
    nchk_slots_kernel<<<1, 256, 0, st>>>(slots, c->world.group.size, c->rank, v, c->host != NULL ? NULL : c->chk.grad_q);
    nccl_check_cuda(c, cudaGetLastError(), "the gradients' sums of squares");
}

// nchk_free: the checks' buffers (nccl_free)
static inline void nchk_free(NcclComm *c) {
    NchkState *k = &c->chk;
    for (int i = 0; i < NCHK_GROUPS; i++) cudaFree(k->rec[i]);
    for (int i = 0; i < 2; i++) cudaFree(k->partial[i]);
    cudaFree(k->all);
    cudaFreeHost(k->all_host);
    cudaFree(k->coef);
    cudaFreeHost(k->coef_host);
    cudaFree(k->grad_q);
    cudaFree(k->flip);
    cudaFree(k->verdict);
    free(k->calls);
    if (k->gen != NULL) sketch_gen_free(k->gen);
    free(k->gen);
}

#endif  // LLM3D_NCCL

#endif
