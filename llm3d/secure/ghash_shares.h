/*
 * llm3d/secure/ghash_shares.h: a sealed checkpoint file's GHASH shares, the
 * way several ranks' writes of one file become its chunk tags without the
 * file being read back and without a GHASH value ever written or sent in
 * the clear (the reasons are below and in doc/security.md).
 *
 * defines:
 *   CkptShare, ckpt_share_free, ckpt_share_start
 *                         one writer's shares of a file, and its bytes
 *   ckpt_mask_key, ckpt_mask_iv, ckpt_share_msg_bytes, ckpt_share_pack
 *                         a writer's message to rank 0, sealed and masked
 *   ckpt_shares_combine   rank 0: every writer's messages checked and added
 *   ckpt_shares_cover     rank 0: the writers' bytes cover each chunk once
 *
 * checkpoint.h uses it (CkptOut hashes as it encrypts; ckpt_seal_tags makes
 * the tags); a part of the checkpoint format, in a file of its own for the
 * one idea.
 */
#ifndef LLM3D_GHASH_SHARES_H
#define LLM3D_GHASH_SHARES_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm3d/errors.h"
#include "llm3d/secure/aead.h"
#include "secure.h"  // hmac_sha256, secure_wipe

// GHASH shares: how a sealed file that several ranks wrote gets its chunk
// tags without being read back, and without a GHASH value ever written or
// sent in the clear.
//
// Each writer hashes what it encrypts, in the same pass (aead.h's
// aead_file_ctr_sums): its share of each chunk's GHASH, and how many bytes
// of the chunk it wrote. A share is secret (aead.h says why: with the
// ciphertext it gives H, and H forges tags), so it never leaves a rank as it
// is. Rank r > 0 sends rank 0, over the job's communicator, its shares and
// byte counts sealed with AES-256-GCM (ckpt_share_pack): so each share goes
// XOR a mask, the keystream, under a key derived from the checkpoint key,
// 16 random bytes the rank draws for this message (sent with it), the
// file's id, its chunk count and its name, with the rank as the nonce
// (ckpt_mask_key, ckpt_mask_iv), and the message's tag lets rank 0 refuse
// one changed on the way (NCCL's payloads carry no MAC). Rank 0 derives the
// same key, checks the tag and takes the masks off; its own share is never
// sent. What crosses the communicator is therefore pseudorandom to anyone
// without the key, and every mask is used once: the random bytes are the
// sender's own, not the file id alone (which rank 0 makes, and a writer
// requires of the header before it encrypts: ckpt_share_ids; the salt holds
// even if that check were gone). Only rank 0 learns the
// full GHASH S of a chunk, in memory, for the moment it makes the tag S xor
// E_K(J0) (S with the tag would give E_K(J0) and then an equation in H).
// Nothing of it is written anywhere.
//
// Rank 0 seals a file only when every rank's message is there, of this file
// (its id and chunk count), from that rank and unchanged (its tag), and the
// bytes the writers counted cover each chunk exactly; otherwise it refuses with one line
// naming the file, the rank or the chunk. There is no fallback to reading
// the file back for the tags.

typedef struct {
    uint64_t file_id, chunks;  // the sealed file the shares are of (chunks 0: none yet)
    uint8_t *sums;             // 16 bytes a chunk: GHASH shares (secret, wiped when freed)
    uint64_t *bytes;           // a chunk's plaintext bytes this writer encrypted (rank 0: all writers')
    int ranks;                 // rank 0 after ckpt_shares_combine: how many writers rank_bytes holds
    uint64_t *rank_bytes;      // ... and each one's bytes of each chunk (rank r's at r * chunks), for errors
    int want;                  // want_id is known: the id rank 0 made the file with, sent over the job's channel
    uint64_t want_id;          // ... which the header must hold before this rank encrypts a byte under it
    int stale;                 // the header held another id (stale_id): refused, nothing encrypted
    uint64_t stale_id;
} CkptShare;

static void ckpt_share_free(CkptShare *s) {
    if (s->sums != NULL) secure_wipe(s->sums, (size_t)s->chunks * 16);
    free(s->sums);
    free(s->bytes);
    free(s->rank_bytes);
    memset(s, 0, sizeof(*s));
}

// s ready for the writes of the sealed file f: kept as it is when it is f's
// already (rank 0 writes a file's header, then its part), else new. 0, or an
// errno (EINVAL: s holds another file's shares; ESTALE: f's header does not
// hold the id s->want_id that rank 0 made it with, s->stale set)
static int ckpt_share_start(CkptShare *s, const AeadFile *f) {
    if (s->want && f->file_id != s->want_id) {
        s->stale = 1;
        s->stale_id = f->file_id;
        return ESTALE;
    }
    if (s->sums != NULL) return s->file_id == f->file_id && s->chunks == f->chunks ? 0 : EINVAL;
    s->sums = (uint8_t *)calloc((size_t)f->chunks, 16);
    s->bytes = (uint64_t *)calloc((size_t)f->chunks, sizeof(uint64_t));
    if (s->sums == NULL || s->bytes == NULL) {
        free(s->sums);
        free(s->bytes);
        memset(s, 0, sizeof(*s));
        return ENOMEM;
    }
    s->file_id = f->file_id;
    s->chunks = f->chunks;
    return 0;
}

#define CKPT_MASK_LABEL "llm3d GHASH share mask 1"
#define CKPT_SHARE_MAGIC "llm3dgs2"
#define CKPT_SHARE_HEAD 48
#define CKPT_SHARE_SALT 32  // where a message's 16 random bytes sit in its head

// the key of one message's masks: HMAC(HMAC(checkpoint key, LABEL), salt ||
// file id || chunks || name), as an AES key. name is the file's name in -o,
// which every rank knows alike. salt is 16 bytes the sender draws for this
// message alone (getrandom) and sends in the clear: the file id and chunk
// count come from the file's header, which whoever can write -o can set to
// an older file's (of the same name: a step written again after a resume),
// and without the salt the sender would then mask its new shares with the
// same keystream as the old ones, whose XOR an observer of the two
// messages would read as the XOR of two shares: an equation in H.
static void ckpt_mask_key(AeadKey *mk, const uint8_t key[32], const uint8_t salt[16], uint64_t file_id,
                          uint64_t chunks, const char *name) {
    uint8_t k1[32], k2[32], msg[32 + 256];
    size_t n = strlen(name) < 256 ? strlen(name) : 256;
    hmac_sha256(key, 32, CKPT_MASK_LABEL, strlen(CKPT_MASK_LABEL), k1);
    memcpy(msg, salt, 16);
    put_u64(msg + 16, file_id);
    put_u64(msg + 24, chunks);
    memcpy(msg + 32, name, n);
    hmac_sha256(k1, 32, msg, 32 + n, k2);
    aead_init(mk, k2);
    secure_wipe(k1, sizeof(k1));
    secure_wipe(k2, sizeof(k2));
}

// the nonce of rank's message under its mask key
static void ckpt_mask_iv(int rank, uint8_t iv[12]) {
    memset(iv, 0, 12);
    memcpy(iv, "mask", 4);
    put_u32(iv + 4, (uint32_t)rank);
}

// what rank r sends rank 0 for a file of `chunks` chunks: the head, the
// body (a share and a byte count a chunk), the body's tag
static size_t ckpt_share_msg_bytes(uint64_t chunks) { return CKPT_SHARE_HEAD + (size_t)chunks * 24 + AEAD_TAG_BYTES; }

// rank's message into msg (ckpt_share_msg_bytes(chunks)): a head of magic,
// the file's id, its chunk count, the rank and a fresh salt; then each
// chunk's share and each chunk's byte count, sealed (AES-256-GCM) under the
// message's mask key with the head as additional data, so that the shares
// cross masked by the keystream, and a message changed on the way (NCCL's
// payloads carry no MAC here) fails its tag at rank 0 rather than making
// tags that fail at the next resume. A share of another size (or none)
// goes as its head alone, for rank 0 to refuse by name; so does one whose
// salt getrandom could not draw, with no magic (rank 0: "did not arrive").
static void ckpt_share_pack(const CkptShare *s, const uint8_t key[32], const char *name, int rank, uint64_t chunks,
                            uint8_t *msg) {
    memset(msg, 0, ckpt_share_msg_bytes(chunks));
    put_u64(msg + 8, s->file_id);
    put_u64(msg + 16, s->chunks);
    put_u32(msg + 24, (uint32_t)rank);
    if (getrandom(msg + CKPT_SHARE_SALT, 16, 0) != 16) return;
    memcpy(msg, CKPT_SHARE_MAGIC, 8);
    if (s->sums == NULL || s->chunks != chunks) return;
    AeadKey mk;
    uint8_t iv[12], *body = msg + CKPT_SHARE_HEAD;
    size_t body_bytes = (size_t)chunks * 24;
    ckpt_mask_key(&mk, key, msg + CKPT_SHARE_SALT, s->file_id, chunks, name);
    ckpt_mask_iv(rank, iv);
    memcpy(body, s->sums, (size_t)chunks * 16);
    for (uint64_t i = 0; i < chunks; i++) put_u64(body + chunks * 16 + 8 * i, s->bytes[i]);
    aead_seal(&mk, iv, sizeof(iv), msg, CKPT_SHARE_HEAD, body, body, body_bytes, body + body_bytes);
    aead_wipe(&mk);
}

// rank 0: the other ranks' messages (msgs: world of msg_bytes each, rank r's
// at r; rank 0's own slot unused) added into its own share s, each one's
// tag checked and masks taken off, and every writer's bytes of each chunk
// kept for errors. -1 with err naming the file (path), the rank and what is
// wrong.
static int ckpt_shares_combine(CkptShare *s, const uint8_t *msgs, int world, const uint8_t key[32], const char *name,
                               const char *path, char *err, size_t errlen) {
    if (s->sums == NULL) return errorf(err, errlen, "%s: rank 0 has no GHASH shares of it: not sealed", path);
    uint64_t chunks = s->chunks;
    size_t msg_bytes = ckpt_share_msg_bytes(chunks);
    s->rank_bytes = (uint64_t *)calloc((size_t)world * chunks, sizeof(uint64_t));
    size_t body_bytes = (size_t)chunks * 24;
    uint8_t *body = (uint8_t *)malloc(body_bytes), iv[12];
    if (s->rank_bytes == NULL || body == NULL) {
        free(body);
        return errorf(err, errlen, "%s: out of memory for %d ranks' GHASH shares", path, world);
    }
    s->ranks = world;
    memcpy(s->rank_bytes, s->bytes, (size_t)chunks * sizeof(uint64_t));
    AeadKey mk;
    int rc = 0;
    for (int r = 1; r < world && rc == 0; r++) {
        const uint8_t *m = msgs + (size_t)r * msg_bytes;
        if (memcmp(m, CKPT_SHARE_MAGIC, 8) != 0 || get_u32(m + 24) != (uint32_t)r) {
            rc = errorf(err, errlen, "%s: rank %d's GHASH shares did not arrive (no message of rank %d's): not sealed",
                        path, r, r);
            continue;
        }
        if (get_u64(m + 8) != s->file_id || get_u64(m + 16) != chunks) {
            rc = errorf(err, errlen, "%s: rank %d's GHASH shares are of file id %016llx in %llu chunks, rank 0's of "
                        "%016llx in %llu: not sealed", path, r, (unsigned long long)get_u64(m + 8),
                        (unsigned long long)get_u64(m + 16), (unsigned long long)s->file_id, (unsigned long long)chunks);
            continue;
        }
        ckpt_mask_key(&mk, key, m + CKPT_SHARE_SALT, s->file_id, chunks, name);
        ckpt_mask_iv(r, iv);
        if (aead_open(&mk, iv, sizeof(iv), m, CKPT_SHARE_HEAD, m + CKPT_SHARE_HEAD, body, body_bytes,
                      m + CKPT_SHARE_HEAD + body_bytes) != 0) {
            rc = errorf(err, errlen, "%s: rank %d's GHASH shares fail their tag: changed on the way: not sealed", path,
                        r);
            continue;
        }
        for (size_t b = 0; b < (size_t)chunks * 16; b++) s->sums[b] ^= body[b];
        for (uint64_t i = 0; i < chunks; i++) {
            uint64_t n = get_u64(body + chunks * 16 + 8 * i);
            s->rank_bytes[(size_t)r * chunks + i] = n;
            s->bytes[i] += n < AEAD_FILE_MAX_CHUNK_BYTES ? n : AEAD_FILE_MAX_CHUNK_BYTES;  // no wrap-around
        }
    }
    secure_wipe(body, body_bytes);
    free(body);
    aead_wipe(&mk);
    return rc;
}

// that the writers' bytes cover each chunk of f exactly once; else -1 with
// err naming the file, the chunk and the ranks that wrote in it
static int ckpt_shares_cover(const CkptShare *s, const AeadFile *f, const char *path, char *err, size_t errlen) {
    for (uint64_t i = 0; i < f->chunks; i++) {
        uint64_t len = aead_file_chunk_len(f, i);
        if (s->bytes[i] == len) continue;
        char who[160] = "";
        size_t at = 0;
        int ranks = s->ranks > 0 ? s->ranks : 1, named = 0;
        for (int r = 0; r < ranks && at < sizeof(who) - 40; r++) {
            uint64_t n = s->rank_bytes != NULL ? s->rank_bytes[(size_t)r * s->chunks + i] : s->bytes[i];
            if (n == 0) continue;
            at += (size_t)snprintf(who + at, sizeof(who) - at, "%srank %d: %llu", named++ ? ", " : "", r,
                                   (unsigned long long)n);
        }
        return errorf(err, errlen, "%s: chunk %llu of %llu (plaintext bytes %llu..%llu): the writers' GHASH shares "
                      "count %llu of its %llu bytes (%s): a rank's share is missing or doubled; not sealed", path,
                      (unsigned long long)i, (unsigned long long)f->chunks, (unsigned long long)(i * f->chunk_bytes),
                      (unsigned long long)(i * f->chunk_bytes + len), (unsigned long long)s->bytes[i],
                      (unsigned long long)len, named ? who : "no rank wrote in it");
    }
    return 0;
}

#endif
