/*
 * fault.h: fault injection, -fault KIND:RANK:STEP: one fault, on one rank at
 * one step, so that a run can show the job notices it.
 *
 * defines:
 *   Fault, FAULT_* (the kinds), fault_name, fault_parse, fault_check_world
 *   fault_fires, fault_slow_fires, fault_poison_fires
 *                                   whether it acts on this rank at this step
 *   fault_flip_bit                  the bit corrupt, corrupt-low and
 *                                   corrupt-sum flip
 *   frame_tamper, links_rewind_send what tamper and replay do to a frame and
 *                                   to a link (secure.h's)
 *
 * tamper flips a bit of an outgoing frame (frame_tamper), replay resends a
 * frame under an already used sequence number (links_rewind_send), kill and
 * stall are acted on by the parallel layer, and so is corrupt (corrupt-low):
 * one bit flipped, an exponent bit (the lowest mantissa bit), in the data
 * RANK puts into its first collective of STEP, after RANK's sketch of it and
 * before the frame's tag, so that only the checked collectives (-ic 1) can
 * see it; and so is corrupt-sum: one bit flipped, a mantissa bit in its
 * middle, in the first sum RANK makes in a reduction of STEP, with the sum
 * sketched as stored (a faulty adder), which only that sum's rounding bound
 * can see: its chunk's, or in a chunk of many frames its frame's. slow (a
 * straggler from STEP on: fault_slow_fires), drift (one parameter changed on
 * one rank) and poison (RANK's gradients x100 from STEP on:
 * fault_poison_fires) are acted on by the trainers (watch.h).
 * doc/security.md, "Fault injection", says what catches each. Errors follow
 * errors.h.
 */
#ifndef LLM3D_FAULT_H
#define LLM3D_FAULT_H

#include "secure.h"  // first: it asks for _GNU_SOURCE; Links, get_u64, FRAME_HEADER_BYTES, LINKS_MAX_WORLD

#include <stdint.h>
#include <string.h>

#include "llm3d/errors.h"

// ----------------------------------------------------------------------------
// fault injection: -fault KIND:RANK:STEP

enum { FAULT_NONE = 0, FAULT_TAMPER, FAULT_REPLAY, FAULT_KILL, FAULT_STALL, FAULT_SLOW, FAULT_DRIFT, FAULT_CORRUPT,
       FAULT_CORRUPT_LOW, FAULT_POISON, FAULT_CORRUPT_SUM, FAULT_LAST = FAULT_CORRUPT_SUM };

#define FAULT_SLOW_MS 300  // what slow adds to each step of its rank: far above any noise of a shared machine
#define FAULT_POISON_SCALE 100.0f  // what poison multiplies its rank's gradients by

typedef struct { int kind; int rank; long step; } Fault;

static inline const char *fault_name(int kind) {
    static const char *names[] = {"none", "tamper", "replay", "kill", "stall", "slow", "drift", "corrupt",
                                  "corrupt-low", "poison", "corrupt-sum"};
    return kind >= FAULT_NONE && kind <= FAULT_LAST ? names[kind] : "unknown";
}

// fault_number: a decimal in [0, max], nothing else
static inline int fault_number(const char *s, size_t n, long max, long *out) {
    if (n == 0 || n > 18) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return -1;
    *out = v;
    return 0;
}

// fault_parse: "tamper:1:5" and the like; RANK is checked against the world
// by the caller, who knows it
static inline int fault_parse(const char *spec, Fault *f, char *err, size_t errlen) {
    f->kind = FAULT_NONE; f->rank = -1; f->step = -1;
    if (spec == NULL) return errorf(err, errlen, "-fault: missing value; expected KIND:RANK:STEP");
    const char *c1 = strchr(spec, ':');
    const char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
    if (c1 == NULL || c2 == NULL || strchr(c2 + 1, ':') != NULL)
        return errorf(err, errlen, "-fault '%s': expected KIND:RANK:STEP, e.g. tamper:1:5", spec);
    size_t kind_len = (size_t)(c1 - spec);
    int kind = FAULT_NONE;
    for (int k = FAULT_TAMPER; k <= FAULT_LAST; k++) {
        if (strlen(fault_name(k)) == kind_len && strncmp(spec, fault_name(k), kind_len) == 0) kind = k;
    }
    if (kind == FAULT_NONE)
        return errorf(err, errlen, "-fault '%s': KIND '%.*s' is not one of tamper, replay, kill, stall, slow, drift, "
                      "corrupt, corrupt-low, poison, corrupt-sum", spec, (int)kind_len, spec);
    long rank, step;
    if (fault_number(c1 + 1, (size_t)(c2 - c1 - 1), LINKS_MAX_WORLD - 1, &rank) != 0)
        return errorf(err, errlen, "-fault '%s': RANK '%.*s' is not a rank 0..%d",
                      spec, (int)(c2 - c1 - 1), c1 + 1, LINKS_MAX_WORLD - 1);
    if (fault_number(c2 + 1, strlen(c2 + 1), 999999999999L, &step) != 0)
        return errorf(err, errlen, "-fault '%s': STEP '%s' is not a step 0..999999999999", spec, c2 + 1);
    f->kind = kind; f->rank = (int)rank; f->step = step;
    return 0;
}

// fault_check_world: the fault's rank must be one of the job's world ranks
static inline int fault_check_world(const Fault *f, int world, char *err, size_t errlen) {
    if (f == NULL || f->kind == FAULT_NONE || (f->rank >= 0 && f->rank < world)) return 0;
    return errorf(err, errlen, "-fault %s:%d:%ld: rank %d is not in this job of %d rank%s", fault_name(f->kind), f->rank,
                  f->step, f->rank, world, world == 1 ? "" : "s");
}

static inline int fault_fires(const Fault *f, int rank, long step) {
    return f != NULL && f->kind != FAULT_NONE && f->rank == rank && f->step == step;
}

// fault_slow_fires: slow acts on every step of its rank from its step on
static inline int fault_slow_fires(const Fault *f, int rank, long step) {
    return f != NULL && f->kind == FAULT_SLOW && f->rank == rank && step >= f->step;
}

// fault_poison_fires: poison acts on every step of its rank from its step on
static inline int fault_poison_fires(const Fault *f, int rank, long step) {
    return f != NULL && f->kind == FAULT_POISON && f->rank == rank && step >= f->step;
}

// fault_flip_bit: the bit of a float that corrupt flips (30, the exponent's
// highest: a value below 1 scaled by 2^128, one in [1, 2) made infinite or
// NaN, one of 2 or more scaled by 2^-128, a change of its own size that a
// bf16 sum's rounding bound can hide: nccl_check.h's nchk_flip_key picks a
// value below 1 on the GPU; the host backend compares what moved exactly, so
// any flip is seen there), corrupt-low (0, the mantissa's lowest: one
// unit in the last place) and corrupt-sum (18: the value moved by 2^-6 to
// 2^-5 of itself, far below an exponent's change and far above the rounding
// of one frame's sum; doc/security.md, "Checked collectives", has figures)
static inline int fault_flip_bit(int kind) {
    return kind == FAULT_CORRUPT_LOW ? 0 : kind == FAULT_CORRUPT_SUM ? 18 : 30;
}

// frame_tamper: flip a bit in the middle of the payload, or in the header pad
// when there is no payload, so the receiver's tag check is what catches it
static inline void frame_tamper(uint8_t *frame, size_t frame_len) {
    if (frame_len < FRAME_HEADER_BYTES) {
        if (frame_len > 0) frame[0] ^= 0x01;
        return;
    }
    uint64_t len = get_u64(frame + 48);
    if (len > 0 && frame_len >= FRAME_HEADER_BYTES + FRAME_TAG_BYTES &&
        len <= frame_len - FRAME_HEADER_BYTES - FRAME_TAG_BYTES) {
        frame[FRAME_HEADER_BYTES + len / 2] ^= 0x01;
    } else {
        frame[56] ^= 0x01;
    }
}

// links_rewind_send: the next frame to dst reuses the sequence number of the
// previous one, which is what a replay looks like to the receiver (a valid
// tag on a sequence number it already consumed). -1 if nothing was sent yet.
static inline int links_rewind_send(Links *l, int dst) {
    if (dst < 0 || dst >= l->world || l->send_seq[dst] == 0) return -1;
    l->send_seq[dst]--;
    return 0;
}

#endif
