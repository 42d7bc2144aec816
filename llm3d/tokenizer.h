/*
 * llm3d/tokenizer.h: GPT-2's byte-level BPE tokenizer, both directions.
 *
 * defines:
 *   decode side:
 *     Tokenizer, tokenizer_load_bin, tokenizer_free
 *                           llm.c's tokenizer .bin, loaded and checked
 *     tokenizer_decode      the bytes of a token id
 *     SafeText, tokenizer_safe_text
 *                           decoded tokens as text safe to print (samples)
 *     tokenizer_write_bytes_bin
 *                           the byte-level tokenizer's .bin
 *   encode side:
 *     Bpe, bpe_load, bpe_load_files, bpe_free
 *                           the encoder from encoder.json and vocab.bpe
 *     bpe_find_files        where GPT-2's encoder.json and vocab.bpe are
 *     bpe_encode            text to ids ("<|endoftext|>", BPE_EOT_TEXT, the
 *                           EOT id when allow_special)
 *     BpeOut, bpe_encode_ordinary
 *                           text without special tokens to ids, appended to a
 *                           growing array
 *     bpe_split_point       a cut where a large text can be encoded in blocks
 *     bpe_pretoken_end      the end of a pre-tokenizer piece
 *     bpe_token_bytes       the raw bytes of a token id
 *     bpe_write_tokenizer_bin
 *                           llm.c's tokenizer .bin for this vocabulary
 *     bpe_byte_map          GPT-2's bytes_to_unicode, as a map back to bytes
 *   the helpers both use:
 *     utf8_decode, utf8_encode, utf8_incomplete, unicode_class
 *                           UTF-8 and the pre-tokenizer's character classes
 *     tok_read_file         a whole file into a buffer, up to a size
 *     tok_get_u32le, tok_put_u32le
 *                           little-endian uint32 in bytes
 *
 * Decode side (the trainers): a Tokenizer loaded from llm.c's tokenizer .bin
 * maps a token id to its bytes. Encode side (prepare_data): a Bpe loaded from
 * GPT-2's encoder.json and vocab.bpe turns text into token ids exactly as
 * OpenAI's encoder.py (and tiktoken's "gpt2") does, and can write the .bin.
 *
 * Tokenizer .bin (llm.c's format, all integers little-endian):
 *   header, 256 int32: [0] 20240328 (magic), [1] 2 (version), [2] V (vocab
 *   size), [3] the EOT token id, the rest 0. Then for each token 0..V-1: one
 *   uint8 length L (1..255) and L bytes, the token's raw bytes (not GPT-2's
 *   printable-unicode spelling). Nothing follows the last token.
 *   The byte-level tokenizer (tokenizer_write_bytes_bin, for the offline
 *   quick start) has V = 256, token i = the byte i, and EOT = 0: the NUL byte,
 *   which plain text never holds, so a sample can start from it and a
 *   document boundary cannot be confused with text.
 * Token shards (written by prepare_data.c, read by dataloader.h): a header of
 * 256 int32 ([0] 20240520, [1] 1, [2] token count), then the tokens as uint16.
 *
 * Encoding runs in three steps.
 * 1. Special token. With allow_special, every "<|endoftext|>" becomes the EOT
 *    id and the text between two of them is encoded on its own (tiktoken's
 *    rule). Without it, "<|endoftext|>" is plain text (encoder.py's rule).
 * 2. Pre-tokenization: the text is cut into pieces by GPT-2's pattern
 *      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *    read as a hand-written scanner, bpe_pretoken_end(). At each position the
 *    first alternative that matches wins: a lower-case contraction; else an
 *    optional single space (U+0020 only) and a run of letters, or of numbers,
 *    or of "other" characters (neither space, letter nor number); else a run
 *    of whitespace, all of it at the end of the text, otherwise all but its
 *    last character when it has two or more (so the last one can lead the
 *    next word: "a   b" -> "a", "  ", " b"). Classes come from unicode_table.h
 *    (letters \p{L}, numbers \p{N}, \s = Unicode White_Space, as the `regex`
 *    module that encoder.py uses).
 *    Invalid UTF-8: a byte that does not start a valid shortest-form UTF-8
 *    sequence (of a code point <= U+10FFFF that is not a surrogate) is one
 *    character on its own, of the "other" class. Byte-level BPE then encodes
 *    it like any byte, so decode(encode(x)) == x for every byte string x.
 * 3. Byte-level BPE on each piece's bytes: start from one token per byte, then
 *    repeatedly merge the adjacent pair of lowest rank (its line in
 *    vocab.bpe), the leftmost one first, until no pair has a rank. encoder.py
 *    spells bytes as printable characters (bytes_to_unicode); we undo that
 *    spelling once, at load, and work on raw bytes and ids. The merging uses a
 *    heap, O(n log n) in the piece length, which equals encoder.py's "merge
 *    every occurrence of the best pair, then look again" because bpe_load
 *    checks that every merge's two parts are made by earlier merges (true for
 *    GPT-2's file). A cache of recent pieces and their ids skips the merging
 *    for words seen before.
 *
 * bpe_load validates its files: encoder.json must be one JSON object of
 * string keys to ids 0..V-1, each id once, all 256 single bytes present, every
 * multi-byte token (but "<|endoftext|>") made by some merge; vocab.bpe must
 * start with a "#version" line followed by "a b" merge lines whose parts and
 * result are tokens. Every error is one line naming the file, the line or
 * byte offset and the value.
 *
 * Functions are static inline so that a program using one side only (the
 * trainers decode, prepare_data encodes) compiles warning-free.
 */
#ifndef LLM3D_TOKENIZER_H
#define LLM3D_TOKENIZER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"
#include "llm3d/unicode_table.h"

#define TOKENIZER_MAGIC 20240328
#define TOKENIZER_VERSION 2
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_HEADER_BYTES (TOKENIZER_HEADER_INTS * 4)
#define TOKENIZER_MAX_VOCAB (1 << 20)   // far above any BPE vocab; bounds what a bad header can allocate
#define BPE_EOT_TEXT "<|endoftext|>"
#define BPE_MAX_TOKEN_BYTES 255         // the .bin stores a token's length in one byte
#define BPE_CACHE_SLOTS (1u << 17)      // must be a power of two
#define BPE_CACHE_MAX_PIECE 64          // longer pieces are rare; they skip the cache
#define BPE_CACHE_TEXT_BYTES (1u << 21)
#define BPE_CACHE_IDS (1u << 20)
#define BPE_MAX_FILE_BYTES (256u << 20)  // encoder.json / vocab.bpe: GPT-2's are 1 MB and 0.5 MB

// ----------------------------------------------------------------------------
// small helpers

static inline uint32_t tok_get_u32le(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline void tok_put_u32le(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

static inline uint64_t tok_hash_bytes(const unsigned char *s, size_t n) {  // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ull; }
    return h;
}

// tok_show: bytes as printable text for an error message (\xNN for the rest),
// cut to about 40 characters
static inline const char *tok_show(const unsigned char *s, size_t n, char *out, size_t outlen) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < outlen; i++) {
        if (o >= 40) { memcpy(out + o, "...", 3); o += 3; break; }
        if (s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\') out[o++] = (char)s[i];
        else o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", s[i]);
    }
    out[o] = '\0';
    return out;
}

// tok_read_file: the whole file into a malloc'd buffer (one spare NUL byte);
// a file over max_size bytes is an error, not an attempt to hold it
static inline int tok_read_file(const char *path, size_t max_size, unsigned char **data, size_t *size, char *err,
                                size_t errlen) {
    *data = NULL;
    *size = 0;
    FILE *f = fopen_regular(path, "", err, errlen);  // a FIFO is refused, not waited on
    if (f == NULL) return -1;
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = (unsigned char *)malloc(cap + 1);
    while (buf != NULL) {
        if (n == cap) {
            unsigned char *bigger = (unsigned char *)realloc(buf, 2 * cap + 1);
            if (bigger == NULL) { free(buf); buf = NULL; break; }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0 || n > max_size) break;
    }
    int failed = ferror(f);
    int saved_errno = errno;
    fclose(f);
    if (buf == NULL) return errorf(err, errlen, "%s: out of memory reading it", path);
    if (failed) {
        free(buf);
        return errorf(err, errlen, "%s: read error: %s", path, strerror(saved_errno));
    }
    if (n > max_size) {
        free(buf);
        return errorf(err, errlen, "%s: larger than %zu bytes, too large for this file type", path, max_size);
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return 0;
}

// ----------------------------------------------------------------------------
// UTF-8 and character classes

// utf8_lead: the length of the sequence that lead byte c starts (1..4; 0 if
// c starts none) and the range [*lo, *hi] its second byte must be in, which
// rules out overlong forms, surrogates and code points above U+10FFFF
static inline int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) { if (c == 0xE0) *lo = 0xA0; if (c == 0xED) *hi = 0x9F; return 3; }
    if (c >= 0xF0 && c <= 0xF4) { if (c == 0xF0) *lo = 0x90; if (c == 0xF4) *hi = 0x8F; return 4; }
    return 0;
}

// utf8_decode: the code point at s[0..n) into *cp and its length in bytes, or
// 0 if s does not start a valid shortest-form sequence (n >= 1)
static inline int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0], lo, hi;
    if (c < 0x80) { *cp = c; return 1; }
    int len = utf8_lead(c, &lo, &hi);
    if (len == 0 || (size_t)len > n || s[1] < lo || s[1] > hi) return 0;
    uint32_t v = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

// utf8_incomplete: when s[0..n) (n >= 1) is the start of a valid sequence
// cut short, the sequence's whole length (2..4, more than n); else 0
static inline int utf8_incomplete(const unsigned char *s, size_t n) {
    unsigned char lo, hi;
    int len = utf8_lead(s[0], &lo, &hi);
    if (len < 2 || n >= (size_t)len) return 0;
    if (n >= 2 && (s[1] < lo || s[1] > hi)) return 0;
    if (n >= 3 && (s[2] & 0xC0) != 0x80) return 0;
    return len;
}

// utf8_encode: cp (<= 0x10FFFF) into out; returns the length
static inline int utf8_encode(uint32_t cp, unsigned char out[4]) {
    if (cp < 0x80) { out[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { out[0] = (unsigned char)(0xC0 | (cp >> 6)); out[1] = (unsigned char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12)); out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18)); out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static inline int unicode_class(uint32_t cp) {
    if (cp < 128) return unicode_ascii_class[cp];
    int lo = 0, hi = UNICODE_RANGE_COUNT - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < unicode_ranges[mid].first) hi = mid - 1;
        else if (cp > unicode_ranges[mid].last) lo = mid + 1;
        else return unicode_ranges[mid].cls;
    }
    return UNICODE_OTHER;
}

// tok_char_at: length and class of the character at s[i] (an invalid byte is
// a one-byte UNICODE_OTHER character)
static inline size_t tok_char_at(const unsigned char *s, size_t n, size_t i, int *cls) {
    if (s[i] < 128) { *cls = unicode_ascii_class[s[i]]; return 1; }
    uint32_t cp;
    int len = utf8_decode(s + i, n - i, &cp);
    if (len == 0) { *cls = UNICODE_OTHER; return 1; }
    *cls = unicode_class(cp);
    return (size_t)len;
}

// ----------------------------------------------------------------------------
// pre-tokenization: GPT-2's regex as a scanner (rules in the top comment)

// bpe_pretoken_end: end of the piece that starts at s[i] (i < n)
static inline size_t bpe_pretoken_end(const unsigned char *s, size_t n, size_t i) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char c2 = s[i + 2];
            if ((c == 'r' && c2 == 'e') || (c == 'v' && c2 == 'e') || (c == 'l' && c2 == 'l')) return i + 3;
        }
    }
    int cls;
    size_t j = i + tok_char_at(s, n, i, &cls);
    if (s[i] == ' ' && j < n) {  // " ?" before a letter/number/other run
        int next_cls;
        size_t next_len = tok_char_at(s, n, j, &next_cls);
        if (next_cls != UNICODE_SPACE) { cls = next_cls; j += next_len; }
    }
    if (cls != UNICODE_SPACE) {
        while (j < n) {
            int c;
            size_t len = tok_char_at(s, n, j, &c);
            if (c != cls) break;
            j += len;
        }
        return j;
    }
    // whitespace: \s+(?!\S) takes the run but its last character, unless the
    // run ends the text; a run of one character falls through to \s+
    size_t last_start = i, chars = 1;
    while (j < n) {
        int c;
        size_t len = tok_char_at(s, n, j, &c);
        if (c != UNICODE_SPACE) break;
        last_start = j;
        j += len;
        chars++;
    }
    if (j == n || chars == 1) return j;
    return last_start;
}

// bpe_split_point: a cut p (0 < p < len) such that encoding text[0..p) and
// text[p..len) separately gives the same ids as encoding the whole; 0 if
// none is found. It is the last "\n" right after a printable non-space ASCII
// character: no piece spans that boundary and no piece before it looks past
// it. prepare_data uses it to encode a large file block by block.
static inline size_t bpe_split_point(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    for (size_t p = len; p-- > 1;) {
        if (s[p] == '\n' && s[p - 1] > 0x20 && s[p - 1] < 0x7f) return p;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// decode side: llm.c's tokenizer .bin

typedef struct {
    int vocab_size;
    int eot_token;
    char *token_bytes;       // every token's bytes, each followed by a NUL
    uint32_t *token_offset;  // token i starts at token_bytes + token_offset[i]; V+1 entries
} Tokenizer;

static inline void tokenizer_free(Tokenizer *t) {
    free(t->token_bytes);
    free(t->token_offset);
    memset(t, 0, sizeof(*t));
}

// tokenizer_load_bin: validates the header and every length; 0 ok, -1 with err set
static inline int tokenizer_load_bin(Tokenizer *t, const char *path, char *err, size_t errlen) {
    memset(t, 0, sizeof(*t));
    unsigned char *data;
    size_t size;
    if (tok_read_file(path, TOKENIZER_HEADER_BYTES + 256 * (size_t)TOKENIZER_MAX_VOCAB, &data, &size, err, errlen) != 0) return -1;
    int rc = -1;
    // declared before the first goto: C++ (the CUDA trainer) forbids jumping over an initialization
    int32_t magic, version, vocab, eot;
    size_t pos = TOKENIZER_HEADER_BYTES, out = 0;
    if (size < TOKENIZER_HEADER_BYTES) {
        errorf(err, errlen, "%s: truncated header: %zu bytes, need %d", path, size, TOKENIZER_HEADER_BYTES);
        goto done;
    }
    magic = (int32_t)tok_get_u32le(data);
    version = (int32_t)tok_get_u32le(data + 4);
    vocab = (int32_t)tok_get_u32le(data + 8);
    eot = (int32_t)tok_get_u32le(data + 12);
    if (magic != TOKENIZER_MAGIC) {
        errorf(err, errlen, "%s: header[0] magic is %d, want %d (not a tokenizer .bin)", path, (int)magic, TOKENIZER_MAGIC);
        goto done;
    }
    if (version != TOKENIZER_VERSION) {
        errorf(err, errlen, "%s: header[1] version is %d, want %d", path, (int)version, TOKENIZER_VERSION);
        goto done;
    }
    if (vocab < 1 || vocab > TOKENIZER_MAX_VOCAB) {
        errorf(err, errlen, "%s: header[2] vocab size is %d, want 1..%d", path, (int)vocab, TOKENIZER_MAX_VOCAB);
        goto done;
    }
    if (eot < 0 || eot >= vocab) {
        errorf(err, errlen, "%s: header[3] EOT token is %d, want 0..%d", path, (int)eot, (int)vocab - 1);
        goto done;
    }
    // the token bytes plus one NUL each take exactly the file's remaining size
    t->token_bytes = (char *)malloc(size - TOKENIZER_HEADER_BYTES + 1);
    t->token_offset = (uint32_t *)malloc(((size_t)vocab + 1) * sizeof(uint32_t));
    if (t->token_bytes == NULL || t->token_offset == NULL) {
        errorf(err, errlen, "%s: out of memory for %d tokens", path, (int)vocab);
        goto done;
    }
    for (int i = 0; i < vocab; i++) {
        if (pos >= size) {
            errorf(err, errlen, "%s: truncated: file ends at offset %zu before token %d of %d", path, pos, i, (int)vocab);
            goto done;
        }
        size_t len = data[pos];
        if (len == 0) {
            errorf(err, errlen, "%s: token %d at offset %zu has length 0 (want 1..255)", path, i, pos);
            goto done;
        }
        if (len > size - pos - 1) {
            errorf(err, errlen, "%s: truncated: token %d at offset %zu needs %zu bytes, %zu left", path, i, pos, len,
                   size - pos - 1);
            goto done;
        }
        t->token_offset[i] = (uint32_t)out;
        memcpy(t->token_bytes + out, data + pos + 1, len);
        out += len;
        t->token_bytes[out++] = '\0';
        pos += 1 + len;
    }
    t->token_offset[vocab] = (uint32_t)out;
    if (pos != size) {
        errorf(err, errlen, "%s: %zu extra bytes after the last token (offset %zu)", path, size - pos, pos);
        goto done;
    }
    t->vocab_size = vocab;
    t->eot_token = eot;
    rc = 0;
done:
    free(data);
    if (rc != 0) tokenizer_free(t);
    return rc;
}

// tokenizer_decode: the bytes of token id (NUL-terminated; *len without the
// NUL), or NULL with *len = 0 if id is out of range. len may be NULL.
static inline const char *tokenizer_decode(const Tokenizer *t, int id, int *len) {
    if (id < 0 || id >= t->vocab_size) {
        if (len != NULL) *len = 0;
        return NULL;
    }
    if (len != NULL) *len = (int)(t->token_offset[id + 1] - t->token_offset[id] - 1);
    return t->token_bytes + t->token_offset[id];
}

// Printing decoded tokens. A sample is whatever the model drew, and a token's
// bytes need not be text: the byte-level tokenizer's 256 tokens include every
// control byte (ESC would reach the terminal), and a GPT-2 token can hold part
// of a UTF-8 character whose rest is in the next token, or bytes that are no
// UTF-8 at all. tokenizer_safe_text prints printable ASCII, newline, tab and
// every valid UTF-8 character above U+009F as they are; a UTF-8 character
// split over tokens is held until its last byte comes, then printed whole.
// Every other byte is escaped as \xNN (four printable characters), not
// dropped: the C0 controls and DEL, the C1 controls U+0080..U+009F (which
// some terminals read as escape sequences), and bytes that start no valid
// UTF-8 character (an invalid byte is escaped on its own, and what follows it
// is read afresh). Escaped, not skipped, so that the sample still shows how
// many tokens the model drew and which: an untrained model draws many.
typedef struct {
    unsigned char held[3];  // the start of a UTF-8 character that the next token may end
    int n_held;
} SafeText;

#define TOKENIZER_SAFE_MAX (4 * (3 + BPE_MAX_TOKEN_BYTES) + 1)  // out's size for one token of up to 255 bytes

// tokenizer_safe_text: a token's bytes (len of them, len <= 255) as text safe
// to print, into out (outlen >= TOKENIZER_SAFE_MAX, NUL-terminated), after
// what t holds from the tokens before; returns the length written. bytes ==
// NULL ends the text: a character still held is escaped. t starts zeroed.
static inline int tokenizer_safe_text(SafeText *t, const char *bytes, int len, char *out, size_t outlen) {
    unsigned char buf[3 + BPE_MAX_TOKEN_BYTES];
    size_t n = (size_t)t->n_held, o = 0;
    memcpy(buf, t->held, n);
    if (bytes != NULL && len > 0) {
        size_t take = len < BPE_MAX_TOKEN_BYTES ? (size_t)len : BPE_MAX_TOKEN_BYTES;
        memcpy(buf + n, bytes, take);
        n += take;
    }
    t->n_held = 0;
    for (size_t i = 0; i < n && o + 4 < outlen;) {
        unsigned char c = buf[i];
        uint32_t cp = 0;
        int k = c < 0x80 ? 1 : utf8_decode(buf + i, n - i, &cp);
        if (k == 0 && bytes != NULL && utf8_incomplete(buf + i, n - i)) {  // the next token may end it
            t->n_held = (int)(n - i);
            memcpy(t->held, buf + i, n - i);
            break;
        }
        int plain = (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t' || (k > 1 && cp >= 0xA0);
        if (k == 0) k = 1;  // no character starts here: this byte alone is escaped
        for (int j = 0; j < k && o + 4 < outlen; j++, i++) {
            if (plain) out[o++] = (char)buf[i];
            else o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", buf[i]);
        }
    }
    out[o] = '\0';
    return (int)o;
}

// tok_write_bin: the .bin for V tokens; token i is bytes[offset[i]..offset[i+1]),
// written whole under a temporary name and renamed into place
static inline int tok_write_bin(const char *path, int vocab, int eot, const unsigned char *bytes,
                                const uint32_t *offset, char *err, size_t errlen) {
    for (int i = 0; i < vocab; i++) {
        uint32_t len = offset[i + 1] - offset[i];
        if (len < 1 || len > BPE_MAX_TOKEN_BYTES)
            return errorf(err, errlen, "%s: token %d has %u bytes, the format allows 1..255", path, i, len);
    }
    char tmp[4200];
    FILE *f = fopen_tmp(path, tmp, sizeof(tmp), err, errlen);  // never written through a link planted at path
    if (f == NULL) return -1;
    unsigned char header[TOKENIZER_HEADER_BYTES] = {0};
    tok_put_u32le(header, TOKENIZER_MAGIC);
    tok_put_u32le(header + 4, TOKENIZER_VERSION);
    tok_put_u32le(header + 8, (uint32_t)vocab);
    tok_put_u32le(header + 12, (uint32_t)eot);
    fwrite(header, 1, sizeof(header), f);  // a failed write shows in ferror, which fclose_rename reads
    for (int i = 0; i < vocab; i++) {
        unsigned char len = (unsigned char)(offset[i + 1] - offset[i]);
        fputc(len, f);
        fwrite(bytes + offset[i], 1, len, f);
    }
    return fclose_rename(f, tmp, path, err, errlen);
}

// tokenizer_write_bytes_bin: the byte-level tokenizer: V = 256, token i = byte i, EOT = 0
static inline int tokenizer_write_bytes_bin(const char *path, char *err, size_t errlen) {
    unsigned char bytes[256];
    uint32_t offset[257];
    for (int i = 0; i < 256; i++) { bytes[i] = (unsigned char)i; offset[i] = (uint32_t)i; }
    offset[256] = 256;
    return tok_write_bin(path, 256, 0, bytes, offset, err, errlen);
}

// ----------------------------------------------------------------------------
// encode side: byte-level BPE from encoder.json + vocab.bpe

typedef struct { uint64_t pair; int32_t rank, merged; } BpeMerge;  // merged < 0: empty slot
typedef struct { uint64_t hash; uint32_t text_off, ids_off; uint16_t text_len, n_ids; } BpeCacheSlot;  // text_len 0: empty
typedef struct { int32_t id, prev, next; } BpeSymbol;    // id < 0: merged into its left neighbour
typedef struct { int32_t rank, left; } BpeCandidate;  // the pair at symbol left, if its rank is still this

typedef struct {
    int vocab_size;
    int eot;                   // id of "<|endoftext|>", or -1 if encoder.json has none
    unsigned char *token_bytes;
    uint32_t *token_offset;    // token i is token_bytes[token_offset[i] .. token_offset[i+1])
    int byte_token[256];       // the id of each single byte
    BpeMerge *merges;          // open addressing on (left id, right id)
    uint32_t merge_mask;
    int merge_count;
    // cache of pieces seen before and their ids; emptied when full
    BpeCacheSlot *cache;
    uint32_t cache_used;
    unsigned char *cache_text;
    uint32_t cache_text_used;
    int32_t *cache_ids;
    uint32_t cache_ids_used;
    // scratch for merging one piece
    BpeSymbol *sym;
    BpeCandidate *heap;
    size_t scratch_cap;        // sym holds this many; heap three times as many
} Bpe;

static inline void bpe_free(Bpe *b) {
    free(b->token_bytes);
    free(b->token_offset);
    free(b->merges);
    free(b->cache);
    free(b->cache_text);
    free(b->cache_ids);
    free(b->sym);
    free(b->heap);
    memset(b, 0, sizeof(*b));
}

static inline uint32_t bpe_pair_slot(uint64_t pair, uint32_t mask) {
    return (uint32_t)((pair * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static inline const BpeMerge *bpe_find_merge(const Bpe *b, int32_t left, int32_t right) {
    uint64_t pair = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (uint32_t slot = bpe_pair_slot(pair, b->merge_mask);; slot = (slot + 1) & b->merge_mask) {
        const BpeMerge *m = &b->merges[slot];
        if (m->merged < 0) return NULL;
        if (m->pair == pair) return m;
    }
}

// bpe_token_bytes: the raw bytes of token id, or NULL (with *len = 0) if out of range
static inline const unsigned char *bpe_token_bytes(const Bpe *b, int id, int *len) {
    if (id < 0 || id >= b->vocab_size) { *len = 0; return NULL; }
    *len = (int)(b->token_offset[id + 1] - b->token_offset[id]);
    return b->token_bytes + b->token_offset[id];
}

// GPT-2's bytes_to_unicode: bytes that are printable Latin-1 stand for
// themselves, the other 68 are spelled U+0100 + their order among them.
// byte_of_char[cp] (cp < 324) is the byte code point cp spells, or -1.
static inline void bpe_byte_map(int byte_of_char[324]) {
    for (int cp = 0; cp < 324; cp++) byte_of_char[cp] = -1;
    int next = 256;
    for (int byte = 0; byte < 256; byte++) {
        int printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
        byte_of_char[printable ? byte : next++] = byte;
    }
}

// A temporary map from a token's bytes to its id, used only while loading.
typedef struct { uint64_t hash; uint32_t off, len; int32_t id; } BpeNameSlot;  // id < 0: empty

typedef struct {
    BpeNameSlot *slots;
    uint32_t mask;
} BpeNames;

static inline int32_t bpe_names_find(const BpeNames *names, const Bpe *b, const unsigned char *s, uint32_t len,
                                     uint64_t hash, uint32_t *slot_out) {
    uint32_t slot = (uint32_t)hash & names->mask;
    for (;; slot = (slot + 1) & names->mask) {
        const BpeNameSlot *e = &names->slots[slot];
        if (e->id < 0) break;
        if (e->hash == hash && e->len == len && memcmp(b->token_bytes + e->off, s, len) == 0) break;
    }
    if (slot_out != NULL) *slot_out = slot;
    return names->slots[slot].id;
}

// Reading encoder.json: one object of "key": id pairs, keys spelled in
// bytes_to_unicode characters. A hand-written scanner, strict on purpose.
typedef struct {
    const unsigned char *s;
    size_t n, pos;
    const char *path;
    char *err;
    size_t errlen;
} BpeJson;

static inline void bpe_json_skip_space(BpeJson *j) {
    while (j->pos < j->n && (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' || j->s[j->pos] == '\n' || j->s[j->pos] == '\r'))
        j->pos++;
}

static inline int bpe_json_expect(BpeJson *j, char c, const char *what) {
    bpe_json_skip_space(j);
    if (j->pos >= j->n)
        return errorf(j->err, j->errlen, "%s: offset %zu: file ends, expected '%c' %s", j->path, j->pos, c, what);
    if (j->s[j->pos] != (unsigned char)c)
        return errorf(j->err, j->errlen, "%s: offset %zu: expected '%c' %s, got '%c'", j->path, j->pos, c, what,
                      j->s[j->pos] >= 0x20 && j->s[j->pos] < 0x7f ? j->s[j->pos] : '?');
    j->pos++;
    return 0;
}

static inline int bpe_json_hex4(BpeJson *j, uint32_t *v) {
    *v = 0;
    if (j->n - j->pos < 4) return errorf(j->err, j->errlen, "%s: offset %zu: truncated \\u escape", j->path, j->pos);
    for (int k = 0; k < 4; k++) {
        unsigned char c = j->s[j->pos + k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return errorf(j->err, j->errlen, "%s: offset %zu: bad hex digit in \\u escape", j->path, j->pos + k);
        *v = *v * 16 + (uint32_t)d;
    }
    j->pos += 4;
    return 0;
}

// bpe_json_key: a key string into raw bytes (undoing bytes_to_unicode)
static inline int bpe_json_key(BpeJson *j, const int byte_of_char[324], unsigned char *out, uint32_t *len) {
    size_t start = j->pos;
    if (bpe_json_expect(j, '"', "to start a key") != 0) return -1;
    *len = 0;
    for (;;) {
        if (j->pos >= j->n) return errorf(j->err, j->errlen, "%s: offset %zu: file ends inside the key", j->path, start);
        unsigned char c = j->s[j->pos];
        uint32_t cp = 0;
        if (c == '"') { j->pos++; break; }
        if (c < 0x20) return errorf(j->err, j->errlen, "%s: offset %zu: control byte 0x%02x inside a key", j->path, j->pos, c);
        if (c == '\\') {
            if (++j->pos >= j->n) return errorf(j->err, j->errlen, "%s: offset %zu: file ends inside the key", j->path, start);
            unsigned char e = j->s[j->pos++];
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (bpe_json_hex4(j, &cp) != 0) return -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair: \uD8xx\uDCxx
                    uint32_t low = 0;
                    if (j->n - j->pos < 2 || j->s[j->pos] != '\\' || j->s[j->pos + 1] != 'u')
                        return errorf(j->err, j->errlen, "%s: offset %zu: high surrogate \\u%04X without a low one", j->path,
                                      j->pos, cp);
                    j->pos += 2;
                    if (bpe_json_hex4(j, &low) != 0) return -1;
                    if (low < 0xDC00 || low > 0xDFFF)
                        return errorf(j->err, j->errlen, "%s: offset %zu: \\u%04X is not a low surrogate", j->path,
                                      j->pos - 6, low);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return errorf(j->err, j->errlen, "%s: offset %zu: lone low surrogate \\u%04X", j->path, j->pos - 6, cp);
                }
                break;
            default:
                return errorf(j->err, j->errlen, "%s: offset %zu: bad escape '\\%c' in a key", j->path, j->pos - 2,
                              e >= 0x20 && e < 0x7f ? e : '?');
            }
        } else {
            int clen = utf8_decode(j->s + j->pos, j->n - j->pos, &cp);
            if (clen == 0) return errorf(j->err, j->errlen, "%s: offset %zu: invalid UTF-8 in a key", j->path, j->pos);
            j->pos += (size_t)clen;
        }
        if (cp >= 324 || byte_of_char[cp] < 0)
            return errorf(j->err, j->errlen, "%s: offset %zu: key has U+%04X, which is not in GPT-2's byte alphabet",
                          j->path, start, cp);
        if (*len == BPE_MAX_TOKEN_BYTES)
            return errorf(j->err, j->errlen, "%s: offset %zu: key longer than %d bytes", j->path, start, BPE_MAX_TOKEN_BYTES);
        out[(*len)++] = (unsigned char)byte_of_char[cp];
    }
    if (*len == 0) return errorf(j->err, j->errlen, "%s: offset %zu: empty key", j->path, start);
    return 0;
}

static inline int bpe_json_id(BpeJson *j, long *id) {
    bpe_json_skip_space(j);
    size_t start = j->pos;
    long v = 0;
    while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') {
        if (v > 100000000) return errorf(j->err, j->errlen, "%s: offset %zu: id too large", j->path, start);
        v = v * 10 + (j->s[j->pos++] - '0');
    }
    if (j->pos == start || (j->pos < j->n && (j->s[j->pos] == '.' || j->s[j->pos] == 'e' || j->s[j->pos] == 'E'))) {
        char shown[64];
        size_t avail = j->n - start < 12 ? j->n - start : 12;
        return errorf(j->err, j->errlen, "%s: offset %zu: expected a non-negative integer id, got '%s'", j->path, start,
                      tok_show(j->s + start, avail, shown, sizeof(shown)));
    }
    *id = v;
    return 0;
}

// encoder.json's keys in file order, before they are placed by id
typedef struct {
    unsigned char *bytes;  // every key's raw bytes, back to back
    uint32_t *off, *len;   // key k is bytes[off[k] .. off[k] + len[k])
    int32_t *id;
    size_t count, cap, used;
} BpeKeys;

static inline void bpe_keys_free(BpeKeys *keys) {
    free(keys->bytes);
    free(keys->off);
    free(keys->len);
    free(keys->id);
    memset(keys, 0, sizeof(*keys));
}

// bpe_keys_grow: room for twice as many keys; on failure keys stays valid for bpe_keys_free
static inline int bpe_keys_grow(BpeKeys *keys) {
    size_t cap = 2 * keys->cap;
    uint32_t *off = (uint32_t *)realloc(keys->off, cap * sizeof(uint32_t));
    if (off != NULL) keys->off = off;
    uint32_t *len = (uint32_t *)realloc(keys->len, cap * sizeof(uint32_t));
    if (len != NULL) keys->len = len;
    int32_t *id = (int32_t *)realloc(keys->id, cap * sizeof(int32_t));
    if (id != NULL) keys->id = id;
    if (off == NULL || len == NULL || id == NULL) return -1;
    keys->cap = cap;
    return 0;
}

// bpe_json_read_keys: the whole object's "key": id pairs into keys, in file
// order; keys->bytes must hold as many bytes as the file (no key's raw bytes
// are longer than its spelling)
static inline int bpe_json_read_keys(BpeJson *j, const int byte_of_char[324], BpeKeys *keys) {
    if (bpe_json_expect(j, '{', "to open the object") != 0) return -1;
    bpe_json_skip_space(j);
    if (j->pos < j->n && j->s[j->pos] == '}')
        return errorf(j->err, j->errlen, "%s: offset %zu: the object is empty", j->path, j->pos);
    for (;;) {
        if (keys->count == keys->cap && bpe_keys_grow(keys) != 0)
            return errorf(j->err, j->errlen, "%s: out of memory", j->path);
        unsigned char key[BPE_MAX_TOKEN_BYTES];
        uint32_t len;
        long id = 0;
        if (bpe_json_key(j, byte_of_char, key, &len) != 0) return -1;
        if (bpe_json_expect(j, ':', "after a key") != 0) return -1;
        if (bpe_json_id(j, &id) != 0) return -1;
        memcpy(keys->bytes + keys->used, key, len);
        keys->off[keys->count] = (uint32_t)keys->used;
        keys->len[keys->count] = len;
        keys->id[keys->count] = (int32_t)id;
        keys->used += len;
        keys->count++;
        bpe_json_skip_space(j);
        if (j->pos < j->n && j->s[j->pos] == ',') { j->pos++; continue; }
        if (bpe_json_expect(j, '}', "or ',' after an id") != 0) return -1;
        break;
    }
    bpe_json_skip_space(j);
    if (j->pos != j->n)
        return errorf(j->err, j->errlen, "%s: offset %zu: unexpected data after the object", j->path, j->pos);
    return 0;
}

// bpe_place_keys: token i of b is the key whose id is i (fills vocab_size,
// token_bytes, token_offset); the ids must be exactly 0..count-1
static inline int bpe_place_keys(Bpe *b, const BpeKeys *keys, const char *path, char *err, size_t errlen) {
    int rc = -1;
    size_t count = keys->count;
    uint32_t off = 0;
    b->vocab_size = (int)count;
    b->token_bytes = (unsigned char *)malloc(keys->used + 1);
    b->token_offset = (uint32_t *)malloc((count + 1) * sizeof(uint32_t));
    uint32_t *key_of_id = (uint32_t *)malloc(count * sizeof(uint32_t));
    if (b->token_bytes == NULL || b->token_offset == NULL || key_of_id == NULL) {
        errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (size_t i = 0; i < count; i++) key_of_id[i] = UINT32_MAX;
    for (size_t k = 0; k < count; k++) {
        char shown[64];
        int32_t id = keys->id[k];
        if ((size_t)id >= count) {
            errorf(err, errlen, "%s: key '%s' has id %d, but with %zu keys ids must be 0..%zu", path,
                   tok_show(keys->bytes + keys->off[k], keys->len[k], shown, sizeof(shown)), (int)id, count, count - 1);
            goto done;
        }
        if (key_of_id[id] != UINT32_MAX) {
            char shown_first[64];
            size_t first = key_of_id[id];
            errorf(err, errlen, "%s: id %d is used twice, by keys '%s' and '%s'", path, (int)id,
                   tok_show(keys->bytes + keys->off[first], keys->len[first], shown_first, sizeof(shown_first)),
                   tok_show(keys->bytes + keys->off[k], keys->len[k], shown, sizeof(shown)));
            goto done;
        }
        key_of_id[id] = (uint32_t)k;
    }
    for (size_t i = 0; i < count; i++) {
        size_t k = key_of_id[i];
        b->token_offset[i] = off;
        memcpy(b->token_bytes + off, keys->bytes + keys->off[k], keys->len[k]);
        off += keys->len[k];
    }
    b->token_offset[count] = off;
    rc = 0;
done:
    free(key_of_id);
    return rc;
}

// bpe_index_names: names maps each token's bytes to its id (load factor <=
// 1/2); two keys with the same bytes are an error
static inline int bpe_index_names(BpeNames *names, const Bpe *b, const char *path, char *err, size_t errlen) {
    size_t count = (size_t)b->vocab_size;
    uint32_t slots = 2;
    while (slots < 2 * count) slots *= 2;
    names->slots = (BpeNameSlot *)malloc(slots * sizeof(BpeNameSlot));
    names->mask = slots - 1;
    if (names->slots == NULL) return errorf(err, errlen, "%s: out of memory", path);
    for (uint32_t s = 0; s < slots; s++) names->slots[s].id = -1;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *name = b->token_bytes + b->token_offset[i];
        uint32_t len = b->token_offset[i + 1] - b->token_offset[i], slot;
        uint64_t hash = tok_hash_bytes(name, len);
        if (bpe_names_find(names, b, name, len, hash, &slot) >= 0) {
            char shown[64];
            return errorf(err, errlen, "%s: key '%s' appears twice", path, tok_show(name, len, shown, sizeof(shown)));
        }
        names->slots[slot].hash = hash;
        names->slots[slot].off = b->token_offset[i];
        names->slots[slot].len = len;
        names->slots[slot].id = (int32_t)i;
    }
    return 0;
}

// bpe_find_special_tokens: byte_token (every single byte must be a token)
// and eot (-1 when "<|endoftext|>" is not one)
static inline int bpe_find_special_tokens(Bpe *b, const BpeNames *names, const char *path, char *err, size_t errlen) {
    for (int byte = 0; byte < 256; byte++) {
        unsigned char c = (unsigned char)byte;
        b->byte_token[byte] = bpe_names_find(names, b, &c, 1, tok_hash_bytes(&c, 1), NULL);
        if (b->byte_token[byte] < 0)
            return errorf(err, errlen, "%s: no key for the single byte 0x%02x; byte-level BPE needs all 256", path, byte);
    }
    const unsigned char *eot_text = (const unsigned char *)BPE_EOT_TEXT;
    uint32_t eot_len = (uint32_t)strlen(BPE_EOT_TEXT);
    b->eot = bpe_names_find(names, b, eot_text, eot_len, tok_hash_bytes(eot_text, eot_len), NULL);
    return 0;
}

// bpe_read_encoder: fills token_bytes/token_offset/vocab_size/eot/byte_token
// and names (bytes -> id)
static inline int bpe_read_encoder(Bpe *b, BpeNames *names, const char *path, const int byte_of_char[324], char *err,
                                   size_t errlen) {
    unsigned char *data;
    size_t size;
    if (tok_read_file(path, BPE_MAX_FILE_BYTES, &data, &size, err, errlen) != 0) return -1;
    int rc = -1;
    BpeJson j = {data, size, 0, path, err, errlen};
    BpeKeys keys;
    memset(&keys, 0, sizeof(keys));
    keys.bytes = (unsigned char *)malloc(size + 1);
    keys.cap = 1024;
    keys.off = (uint32_t *)malloc(keys.cap * sizeof(uint32_t));
    keys.len = (uint32_t *)malloc(keys.cap * sizeof(uint32_t));
    keys.id = (int32_t *)malloc(keys.cap * sizeof(int32_t));
    if (keys.bytes == NULL || keys.off == NULL || keys.len == NULL || keys.id == NULL) {
        errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (bpe_json_read_keys(&j, byte_of_char, &keys) != 0) goto done;
    if (bpe_place_keys(b, &keys, path, err, errlen) != 0) goto done;
    if (bpe_index_names(names, b, path, err, errlen) != 0) goto done;
    if (bpe_find_special_tokens(b, names, path, err, errlen) != 0) goto done;
    rc = 0;
done:
    free(data);
    bpe_keys_free(&keys);
    return rc;
}

// bpe_symbol_id: a vocab.bpe symbol (bytes_to_unicode spelling) -> its id
static inline int32_t bpe_symbol_id(const Bpe *b, const BpeNames *names, const int byte_of_char[324],
                                    const unsigned char *s, size_t n, unsigned char *raw, uint32_t *raw_len) {
    *raw_len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int clen = utf8_decode(s + i, n - i, &cp);
        if (clen == 0 || cp >= 324 || byte_of_char[cp] < 0 || *raw_len == BPE_MAX_TOKEN_BYTES) return -2;
        raw[(*raw_len)++] = (unsigned char)byte_of_char[cp];
        i += (size_t)clen;
    }
    return bpe_names_find(names, b, raw, *raw_len, tok_hash_bytes(raw, *raw_len), NULL);
}

// bpe_parse_merge: one merge line s[0..n) ("a b", line number line) into the
// ids of its two parts and of what they make (negative until known)
static inline int bpe_parse_merge(const Bpe *b, const BpeNames *names, const int byte_of_char[324], const char *path,
                                  int line, const unsigned char *s, size_t n, int32_t *a, int32_t *c, int32_t *merged,
                                  char *err, size_t errlen) {
    char shown[64];
    *a = *c = *merged = -1;
    const unsigned char *space = (const unsigned char *)memchr(s, ' ', n);
    if (n == 0 || space == NULL || space == s || space == s + n - 1 || memchr(space + 1, ' ', (size_t)(s + n - space - 1)) != NULL)
        return errorf(err, errlen, "%s: line %d: expected two symbols separated by one space, got '%s'", path, line,
                      tok_show(s, n, shown, sizeof(shown)));
    unsigned char raw_a[BPE_MAX_TOKEN_BYTES], raw_b[BPE_MAX_TOKEN_BYTES], both[2 * BPE_MAX_TOKEN_BYTES];
    uint32_t len_a, len_b;
    *a = bpe_symbol_id(b, names, byte_of_char, s, (size_t)(space - s), raw_a, &len_a);
    *c = bpe_symbol_id(b, names, byte_of_char, space + 1, (size_t)(s + n - space - 1), raw_b, &len_b);
    if (*a < 0 || *c < 0) {
        const unsigned char *bad = *a < 0 ? s : space + 1;
        size_t bad_len = *a < 0 ? (size_t)(space - s) : (size_t)(s + n - space - 1);
        return errorf(err, errlen, "%s: line %d: symbol '%s' is %s", path, line, tok_show(bad, bad_len, shown, sizeof(shown)),
                      (*a < 0 ? *a : *c) == -2 ? "not in GPT-2's byte alphabet" : "not a key of the encoder");
    }
    memcpy(both, raw_a, len_a);
    memcpy(both + len_a, raw_b, len_b);
    *merged = len_a + len_b > BPE_MAX_TOKEN_BYTES ? -1
              : bpe_names_find(names, b, both, len_a + len_b, tok_hash_bytes(both, len_a + len_b), NULL);
    if (*merged < 0)
        return errorf(err, errlen, "%s: line %d: merge result of '%s' is not a key of the encoder", path, line,
                      tok_show(s, n, shown, sizeof(shown)));
    return 0;
}

// What bpe_read_merges records for the checks after the last line. Merge r
// (its rank) joins part_a[r] and part_b[r] and is on line merge_line[r];
// made_at[id] is the last merge that makes token id (-1: none), on line
// made_line[id].
typedef struct {
    int32_t *part_a, *part_b, *merge_line;
    int32_t *made_at, *made_line;
} BpeMergeLog;

static inline void bpe_merge_log_free(BpeMergeLog *log) {
    free(log->part_a);
    free(log->part_b);
    free(log->merge_line);
    free(log->made_at);
    free(log->made_line);
    memset(log, 0, sizeof(*log));
}

// bpe_check_merges: after the last of the lines merges: every merge's parts
// are made by earlier merges (the heap merger equals encoder.py's only then),
// and every token but the bytes and EOT is made by some merge, which catches a
// cut-short file
static inline int bpe_check_merges(const Bpe *b, const BpeMergeLog *log, int merges, int lines, const char *path,
                                   char *err, size_t errlen) {
    char shown[64];
    int len;
    for (int r = 0; r < merges; r++) {
        int32_t parts[2] = {log->part_a[r], log->part_b[r]};
        for (int k = 0; k < 2; k++) {
            if (log->made_at[parts[k]] < r) continue;
            const unsigned char *name = bpe_token_bytes(b, parts[k], &len);
            return errorf(err, errlen, "%s: line %d: uses '%s', which line %d makes later; parts must be made first", path,
                          log->merge_line[r], tok_show(name, (size_t)len, shown, sizeof(shown)), log->made_line[parts[k]]);
        }
    }
    for (int id = 0; id < b->vocab_size; id++) {
        if (log->made_at[id] >= 0 || id == b->eot || b->token_offset[id + 1] - b->token_offset[id] == 1) continue;
        const unsigned char *name = bpe_token_bytes(b, id, &len);
        return errorf(err, errlen, "%s: token '%s' (id %d) is made by no merge in the %d lines read (truncated file?)", path,
                      tok_show(name, (size_t)len, shown, sizeof(shown)), id, lines);
    }
    return 0;
}

// bpe_read_merges: fills merges/merge_mask/merge_count from vocab.bpe, whose
// merges are in rank order, one per line after the "#version" line
static inline int bpe_read_merges(Bpe *b, const BpeNames *names, const char *path, const int byte_of_char[324], char *err,
                                  size_t errlen) {
    unsigned char *data;
    size_t size;
    if (tok_read_file(path, BPE_MAX_FILE_BYTES, &data, &size, err, errlen) != 0) return -1;
    int rc = -1;
    int V = b->vocab_size;
    size_t pos = 0;
    int line = 0, rank = 0;
    uint32_t slots = 2;
    while (slots < 2 * (uint32_t)V) slots *= 2;  // there can't be more merges than tokens
    b->merges = (BpeMerge *)malloc(slots * sizeof(BpeMerge));
    b->merge_mask = slots - 1;
    BpeMergeLog log;
    log.part_a = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    log.part_b = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    log.merge_line = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    log.made_at = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    log.made_line = (int32_t *)malloc((size_t)V * sizeof(int32_t));
    if (b->merges == NULL || log.part_a == NULL || log.part_b == NULL || log.merge_line == NULL || log.made_at == NULL ||
        log.made_line == NULL) {
        errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int i = 0; i < V; i++) log.made_at[i] = -1;
    for (uint32_t s = 0; s < slots; s++) b->merges[s].merged = -1;
    while (pos < size) {
        size_t end = pos;
        while (end < size && data[end] != '\n') end++;
        size_t next = end < size ? end + 1 : end;
        if (end > pos && data[end - 1] == '\r') end--;
        line++;
        const unsigned char *s = data + pos;
        size_t n = end - pos;
        char shown[64];
        pos = next;
        if (line == 1) {
            if (n < 8 || memcmp(s, "#version", 8) != 0) {
                errorf(err, errlen, "%s: line 1: expected a '#version' header, got '%s'", path, tok_show(s, n, shown, sizeof(shown)));
                goto done;
            }
            continue;
        }
        int32_t a, c, merged;
        if (bpe_parse_merge(b, names, byte_of_char, path, line, s, n, &a, &c, &merged, err, errlen) != 0) goto done;
        if (rank >= V) {
            errorf(err, errlen, "%s: line %d: more merges than the %d tokens of the encoder", path, line, V);
            goto done;
        }
        uint64_t pair = ((uint64_t)(uint32_t)a << 32) | (uint32_t)c;
        uint32_t slot = bpe_pair_slot(pair, b->merge_mask);
        while (b->merges[slot].merged >= 0 && b->merges[slot].pair != pair) slot = (slot + 1) & b->merge_mask;
        if (b->merges[slot].merged >= 0) {
            errorf(err, errlen, "%s: line %d: merge '%s' repeats line %d", path, line, tok_show(s, n, shown, sizeof(shown)),
                   log.merge_line[b->merges[slot].rank]);
            goto done;
        }
        b->merges[slot].pair = pair;
        b->merges[slot].rank = rank;
        b->merges[slot].merged = merged;
        log.part_a[rank] = a;
        log.part_b[rank] = c;
        log.merge_line[rank] = line;
        log.made_at[merged] = rank;
        log.made_line[merged] = line;
        rank++;
    }
    if (line == 0) {
        errorf(err, errlen, "%s: empty file, expected a '#version' line and merges", path);
        goto done;
    }
    b->merge_count = rank;
    if (bpe_check_merges(b, &log, rank, line, path, err, errlen) != 0) goto done;
    rc = 0;
done:
    free(data);
    bpe_merge_log_free(&log);
    return rc;
}


// bpe_find_files: where GPT-2's encoder.json and vocab.bpe are: in
// $LLM3D_DATA/gpt2, else ../shared/data/gpt2. 0 with both paths written, -1
// when neither place has both files.
static inline int bpe_find_files(char *encoder, char *vocab, size_t len) {
    const char *env = getenv("LLM3D_DATA");
    const char *dirs[2] = {env != NULL && env[0] != '\0' ? env : NULL, "../shared/data"};
    for (int k = 0; k < 2; k++) {
        if (dirs[k] == NULL) continue;
        snprintf(encoder, len, "%s/gpt2/encoder.json", dirs[k]);
        snprintf(vocab, len, "%s/gpt2/vocab.bpe", dirs[k]);
        if (access(encoder, R_OK) == 0 && access(vocab, R_OK) == 0) return 0;
    }
    return -1;
}
// bpe_load_files: the encoder from GPT-2's encoder.json and vocab.bpe; 0
// ok, -1 with err set and, where failed is not NULL, *failed the file that
// did not load (0 encoder.json, 1 vocab.bpe; 2 neither: out of memory), so
// that a caller can name the flag that gave it
static inline int bpe_load_files(Bpe *b, const char *encoder_json, const char *vocab_bpe, int *failed, char *err,
                                 size_t errlen) {
    memset(b, 0, sizeof(*b));
    b->eot = -1;
    int byte_of_char[324];
    bpe_byte_map(byte_of_char);
    BpeNames names = {NULL, 0};
    int rc = bpe_read_encoder(b, &names, encoder_json, byte_of_char, err, errlen), which = 0;
    if (rc == 0) {
        which = 1;
        rc = bpe_read_merges(b, &names, vocab_bpe, byte_of_char, err, errlen);
    }
    free(names.slots);
    if (rc == 0) {
        b->cache = (BpeCacheSlot *)calloc(BPE_CACHE_SLOTS, sizeof(BpeCacheSlot));
        b->cache_text = (unsigned char *)malloc(BPE_CACHE_TEXT_BYTES);
        b->cache_ids = (int32_t *)malloc(BPE_CACHE_IDS * sizeof(int32_t));
        if (b->cache == NULL || b->cache_text == NULL || b->cache_ids == NULL) {
            which = 2;
            rc = errorf(err, errlen, "bpe_load: out of memory");
        }
    }
    if (rc != 0) bpe_free(b);
    if (rc != 0 && failed != NULL) *failed = which;
    return rc;
}

// bpe_load: the same, where the caller need not know which file failed
static inline int bpe_load(Bpe *b, const char *encoder_json, const char *vocab_bpe, char *err, size_t errlen) {
    return bpe_load_files(b, encoder_json, vocab_bpe, NULL, err, errlen);
}

// A growing array of ids, the output of bpe_encode.
typedef struct {
    int *ids;
    size_t n, cap;
} BpeOut;

static inline int bpe_out_reserve(BpeOut *o, size_t more) {
    if (o->n + more <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 256;
    while (cap < o->n + more) cap *= 2;
    int *bigger = (int *)realloc(o->ids, cap * sizeof(int));
    if (bigger == NULL) return -1;
    o->ids = bigger;
    o->cap = cap;
    return 0;
}

static inline void bpe_heap_push(BpeCandidate *heap, size_t *n, BpeCandidate c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        const BpeCandidate *p = &heap[parent];
        if (p->rank < c.rank || (p->rank == c.rank && p->left < c.left)) break;
        heap[i] = *p;
        i = parent;
    }
    heap[i] = c;
}

static inline BpeCandidate bpe_heap_pop(BpeCandidate *heap, size_t *n) {
    BpeCandidate top = heap[0], last = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *n) break;
        if (child + 1 < *n && (heap[child + 1].rank < heap[child].rank ||
                               (heap[child + 1].rank == heap[child].rank && heap[child + 1].left < heap[child].left)))
            child++;
        if (last.rank < heap[child].rank || (last.rank == heap[child].rank && last.left < heap[child].left)) break;
        heap[i] = heap[child];
        i = child;
    }
    heap[i] = last;
    return top;
}

static inline void bpe_push_candidate(const Bpe *b, BpeCandidate *heap, size_t *n, int32_t left) {
    int32_t right = b->sym[left].next;
    if (right < 0) return;
    const BpeMerge *m = bpe_find_merge(b, b->sym[left].id, b->sym[right].id);
    if (m == NULL) return;
    BpeCandidate c = {m->rank, left};
    bpe_heap_push(heap, n, c);
}

// bpe_merge_piece: BPE on one piece's bytes, ids appended to out. Scratch
// memory is 36 bytes per byte of the longest piece seen (one symbol, and up
// to three heap entries: the first pairs and two per merge).
static inline int bpe_merge_piece(Bpe *b, const unsigned char *s, size_t n, BpeOut *out) {
    if (n > (size_t)INT32_MAX / 4) return -1;
    if (n > b->scratch_cap) {
        size_t cap = n < 256 ? 256 : n;
        BpeSymbol *sym = (BpeSymbol *)realloc(b->sym, cap * sizeof(BpeSymbol));
        if (sym == NULL) return -1;
        b->sym = sym;
        BpeCandidate *heap = (BpeCandidate *)realloc(b->heap, 3 * cap * sizeof(BpeCandidate));
        if (heap == NULL) return -1;
        b->heap = heap;
        b->scratch_cap = cap;
    }
    BpeSymbol *sym = b->sym;
    for (size_t i = 0; i < n; i++) {
        sym[i].id = b->byte_token[s[i]];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) bpe_push_candidate(b, b->heap, &heap_n, (int32_t)i);
    while (heap_n > 0) {
        BpeCandidate c = bpe_heap_pop(b->heap, &heap_n);
        BpeSymbol *left = &sym[c.left];
        if (left->id < 0 || left->next < 0) continue;  // stale: merged away, or its right neighbour was
        BpeSymbol *right = &sym[left->next];
        // a rank names one pair, so the same rank means the same pair is still here
        const BpeMerge *m = bpe_find_merge(b, left->id, right->id);
        if (m == NULL || m->rank != c.rank) continue;
        left->id = m->merged;
        left->next = right->next;
        if (right->next >= 0) sym[right->next].prev = c.left;
        right->id = -1;
        if (left->prev >= 0) bpe_push_candidate(b, b->heap, &heap_n, left->prev);
        bpe_push_candidate(b, b->heap, &heap_n, c.left);
    }
    size_t count = 0;
    for (int32_t i = 0; i >= 0; i = sym[i].next) count++;
    if (bpe_out_reserve(out, count) != 0) return -1;
    for (int32_t i = 0; i >= 0; i = sym[i].next) out->ids[out->n++] = sym[i].id;
    return 0;
}

// bpe_encode_piece: one pre-token, through the cache
static inline int bpe_encode_piece(Bpe *b, const unsigned char *s, size_t n, BpeOut *out) {
    if (n == 1) {
        if (bpe_out_reserve(out, 1) != 0) return -1;
        out->ids[out->n++] = b->byte_token[s[0]];
        return 0;
    }
    if (n > BPE_CACHE_MAX_PIECE) return bpe_merge_piece(b, s, n, out);
    uint64_t hash = tok_hash_bytes(s, n);
    uint32_t slot = (uint32_t)hash & (BPE_CACHE_SLOTS - 1);
    for (;; slot = (slot + 1) & (BPE_CACHE_SLOTS - 1)) {
        const BpeCacheSlot *e = &b->cache[slot];
        if (e->text_len == 0) break;
        if (e->hash == hash && e->text_len == n && memcmp(b->cache_text + e->text_off, s, n) == 0) {
            if (bpe_out_reserve(out, e->n_ids) != 0) return -1;
            memcpy(out->ids + out->n, b->cache_ids + e->ids_off, e->n_ids * sizeof(int));
            out->n += e->n_ids;
            return 0;
        }
    }
    size_t first = out->n;
    if (bpe_merge_piece(b, s, n, out) != 0) return -1;
    size_t n_ids = out->n - first;
    if (b->cache_used >= BPE_CACHE_SLOTS / 2 || b->cache_text_used + n > BPE_CACHE_TEXT_BYTES ||
        b->cache_ids_used + n_ids > BPE_CACHE_IDS) {
        memset(b->cache, 0, BPE_CACHE_SLOTS * sizeof(BpeCacheSlot));  // full: start over
        b->cache_used = b->cache_text_used = b->cache_ids_used = 0;
        slot = (uint32_t)hash & (BPE_CACHE_SLOTS - 1);
    }
    b->cache[slot].hash = hash;
    b->cache[slot].text_off = b->cache_text_used;
    b->cache[slot].ids_off = b->cache_ids_used;
    b->cache[slot].text_len = (uint16_t)n;
    b->cache[slot].n_ids = (uint16_t)n_ids;
    memcpy(b->cache_text + b->cache_text_used, s, n);
    memcpy(b->cache_ids + b->cache_ids_used, out->ids + first, n_ids * sizeof(int));
    b->cache_used++;
    b->cache_text_used += (uint32_t)n;
    b->cache_ids_used += (uint32_t)n_ids;
    return 0;
}

static inline int bpe_encode_ordinary(Bpe *b, const unsigned char *s, size_t n, BpeOut *out) {
    for (size_t i = 0; i < n;) {
        size_t end = bpe_pretoken_end(s, n, i);
        if (bpe_encode_piece(b, s + i, end - i, out) != 0) return -1;
        i = end;
    }
    return 0;
}

// bpe_encode: text -> ids in a malloc'd array (*ids, *n; the caller frees).
// allow_special: "<|endoftext|>" -> the EOT id (plain text if the vocab has
// no EOT). 0 ok, -1 if out of memory.
static inline int bpe_encode(Bpe *b, const char *text, size_t len, int allow_special, int **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    BpeOut out = {NULL, 0, 0};
    if (bpe_out_reserve(&out, len / 3 + 16) != 0) return -1;
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0, eot_len = strlen(BPE_EOT_TEXT);
    if (allow_special && b->eot >= 0) {
        for (size_t i = 0; i + eot_len <= len; i++) {
            if (s[i] != '<' || memcmp(s + i, BPE_EOT_TEXT, eot_len) != 0) continue;
            if (bpe_encode_ordinary(b, s + start, i - start, &out) != 0 || bpe_out_reserve(&out, 1) != 0) goto fail;
            out.ids[out.n++] = b->eot;
            start = i + eot_len;
            i = start - 1;
        }
    }
    if (bpe_encode_ordinary(b, s + start, len - start, &out) != 0) goto fail;
    *ids = out.ids;
    *n = out.n;
    return 0;
fail:
    free(out.ids);
    return -1;
}

// bpe_write_tokenizer_bin: llm.c's tokenizer .bin for this vocabulary (EOT as
// in encoder.json; a vocab without "<|endoftext|>" can't be written)
static inline int bpe_write_tokenizer_bin(const Bpe *b, const char *path, char *err, size_t errlen) {
    if (b->eot < 0) return errorf(err, errlen, "%s: the encoder has no \"%s\" token for the header's EOT", path, BPE_EOT_TEXT);
    return tok_write_bin(path, b->vocab_size, b->eot, b->token_bytes, b->token_offset, err, errlen);
}

#endif
