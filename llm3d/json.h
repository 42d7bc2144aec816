/*
 * json.h: a small reader of JSON text held in memory, for the JSON-lines
 * files the tools read (prepare_data's documents, plot_log's run logs,
 * export_hf's test reading back a safetensors header).
 *
 * defines: JsonReader (a cursor over a span of bytes), JsonBuf (a growing
 * byte buffer for decoded strings), and the calls that read one value at a
 * time: json_string, json_number, json_skip_value, json_object_next,
 * json_array_next, json_at_end.
 *
 * The caller walks the document: json_object_next() steps from member to
 * member and hands over each key, the caller reads the value it wants and
 * skips the rest with json_skip_value(). Nothing is allocated but the
 * JsonBuf the caller owns.
 *
 * Strings are decoded to UTF-8: the escapes \" \\ \/ \b \f \n \r \t and
 * \uXXXX, where a high surrogate followed by a low one is one code point (a
 * pair), and a surrogate without its partner becomes U+FFFD, the replacement
 * character (what tiktoken does with such a Python string). Other bytes are
 * copied as they are; a raw control character (below 0x20) in a string is
 * an error, as in the JSON grammar. Numbers follow the JSON grammar exactly.
 *
 * Errors: every call returns -1 on the first error and leaves in j->err one
 * phrase saying what was wrong, and in j->err_pos the byte offset into the
 * span where it was found; the caller adds the file and line.
 */
#ifndef LLM3D_JSON_H
#define LLM3D_JSON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 256  // nesting deeper than this is refused, not recursed into

typedef struct {
    const unsigned char *s;
    size_t n, pos;
    char err[160];
    size_t err_pos;
} JsonReader;

typedef struct {
    char *bytes;
    size_t len, cap;
} JsonBuf;

static inline void json_init(JsonReader *j, const void *text, size_t n) {
    j->s = (const unsigned char *)text;
    j->n = n;
    j->pos = 0;
    j->err[0] = '\0';
    j->err_pos = 0;
}

static inline __attribute__((format(printf, 2, 3))) int json_fail(JsonReader *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err, sizeof(j->err), fmt, ap);
    va_end(ap);
    j->err_pos = j->pos;
    return -1;
}

static inline void json_buf_free(JsonBuf *b) {
    free(b->bytes);
    b->bytes = NULL;
    b->len = b->cap = 0;
}

static inline int json_buf_add(JsonBuf *b, const void *bytes, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *bigger = (char *)realloc(b->bytes, cap);
        if (bigger == NULL) return -1;
        b->bytes = bigger;
        b->cap = cap;
    }
    memcpy(b->bytes + b->len, bytes, n);
    b->len += n;
    b->bytes[b->len] = '\0';  // so a decoded key can be compared with strcmp
    return 0;
}

static inline void json_skip_space(JsonReader *j) {
    while (j->pos < j->n && (j->s[j->pos] == ' ' || j->s[j->pos] == '\t' || j->s[j->pos] == '\n' || j->s[j->pos] == '\r'))
        j->pos++;
}

// json_peek: the next byte after white space, or -1 at the end
static inline int json_peek(JsonReader *j) {
    json_skip_space(j);
    return j->pos < j->n ? j->s[j->pos] : -1;
}

static inline const char *json_show_byte(int c, char out[16]) {
    if (c < 0) snprintf(out, 16, "the end");
    else if (c >= 0x20 && c < 0x7f) snprintf(out, 16, "'%c'", c);
    else snprintf(out, 16, "byte 0x%02x", c);
    return out;
}

static inline int json_expect(JsonReader *j, char c) {
    int got = json_peek(j);
    if (got == c) { j->pos++; return 0; }
    char shown[16];
    return json_fail(j, "expected '%c', found %s", c, json_show_byte(got, shown));
}

// json_at_end: nothing but white space is left
static inline int json_at_end(JsonReader *j) {
    int c = json_peek(j);
    if (c < 0) return 0;
    char shown[16];
    return json_fail(j, "%s after the value", json_show_byte(c, shown));
}

static inline int json_hex4(JsonReader *j, uint32_t *v) {
    *v = 0;
    if (j->pos + 4 > j->n) return json_fail(j, "\\u needs four hex digits");
    for (int k = 0; k < 4; k++) {
        int c = j->s[j->pos + k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return json_fail(j, "\\u needs four hex digits");
        *v = *v << 4 | (uint32_t)d;
    }
    j->pos += 4;
    return 0;
}

static inline int json_put_code_point(JsonBuf *out, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (unsigned char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (unsigned char)(0xC0 | cp >> 6); u[1] = (unsigned char)(0x80 | (cp & 0x3F)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12); u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F)); n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | cp >> 18); u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (unsigned char)(0x80 | (cp & 0x3F)); n = 4;
    }
    return json_buf_add(out, u, n);
}

// json_unicode_escape: the code point of "\uXXXX" (the "\u" already read),
// taking a low surrogate's "\uXXXX" too when a high one asks for it
static inline int json_unicode_escape(JsonReader *j, uint32_t *cp) {
    if (json_hex4(j, cp) != 0) return -1;
    if (*cp >= 0xDC00 && *cp <= 0xDFFF) { *cp = 0xFFFD; return 0; }  // a low surrogate alone
    if (*cp < 0xD800 || *cp > 0xDBFF) return 0;
    uint32_t low;
    if (j->pos + 6 <= j->n && j->s[j->pos] == '\\' && j->s[j->pos + 1] == 'u') {
        size_t at = j->pos;
        j->pos += 2;
        if (json_hex4(j, &low) != 0) return -1;
        if (low >= 0xDC00 && low <= 0xDFFF) {
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (low - 0xDC00);
            return 0;
        }
        j->pos = at;  // not a low surrogate: it is read as its own escape next
    }
    *cp = 0xFFFD;  // a high surrogate alone
    return 0;
}

// json_string: a string value decoded into out (emptied first); out NULL skips it
static inline int json_string(JsonReader *j, JsonBuf *out) {
    if (json_expect(j, '"') != 0) return -1;
    if (out != NULL) out->len = 0;
    for (;;) {
        size_t run = j->pos;  // a run of plain bytes is copied in one go
        while (j->pos < j->n && j->s[j->pos] != '"' && j->s[j->pos] != '\\' && j->s[j->pos] >= 0x20) j->pos++;
        if (out != NULL && j->pos > run && json_buf_add(out, j->s + run, j->pos - run) != 0)
            return json_fail(j, "out of memory for a string");
        if (j->pos >= j->n) return json_fail(j, "string not closed");
        unsigned char c = j->s[j->pos];
        if (c == '"') { j->pos++; break; }
        if (c < 0x20) return json_fail(j, "raw control character 0x%02x in a string (it must be escaped)", c);
        if (j->pos + 1 >= j->n) return json_fail(j, "string not closed");
        unsigned char e = j->s[j->pos + 1];
        j->pos += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        uint32_t cp = 0;
        if (e != 0 && simple != NULL) {
            cp = (uint32_t)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
        } else if (e == 'u') {
            if (json_unicode_escape(j, &cp) != 0) return -1;
        } else {
            j->pos -= 2;
            if (e >= 0x20 && e < 0x7f) return json_fail(j, "unknown escape '\\%c'", e);
            return json_fail(j, "unknown escape: a backslash, then byte 0x%02x", e);
        }
        if (out != NULL && json_put_code_point(out, cp) != 0) return json_fail(j, "out of memory for a string");
    }
    return 0;
}

static inline int json_digits(JsonReader *j) {
    size_t start = j->pos;
    while (j->pos < j->n && j->s[j->pos] >= '0' && j->s[j->pos] <= '9') j->pos++;
    return j->pos > start;
}

// json_number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, into *v (v may be NULL)
static inline int json_number(JsonReader *j, double *v) {
    if (v != NULL) *v = 0;
    json_skip_space(j);
    size_t start = j->pos;
    if (j->pos < j->n && j->s[j->pos] == '-') j->pos++;
    if (j->pos < j->n && j->s[j->pos] == '0') j->pos++;
    else if (!json_digits(j)) return json_fail(j, "expected a value");
    if (j->pos < j->n && j->s[j->pos] == '.') {
        j->pos++;
        if (!json_digits(j)) return json_fail(j, "a number needs digits after '.'");
    }
    if (j->pos < j->n && (j->s[j->pos] == 'e' || j->s[j->pos] == 'E')) {
        j->pos++;
        if (j->pos < j->n && (j->s[j->pos] == '+' || j->s[j->pos] == '-')) j->pos++;
        if (!json_digits(j)) return json_fail(j, "a number needs digits in its exponent");
    }
    if (v != NULL) {
        char digits[64];
        size_t len = j->pos - start;
        if (len >= sizeof(digits)) len = sizeof(digits) - 1;  // a longer one has no more precision to give
        memcpy(digits, j->s + start, len);
        digits[len] = '\0';
        *v = strtod(digits, NULL);
    }
    return 0;
}

static inline int json_literal(JsonReader *j, const char *word) {
    size_t n = strlen(word);
    if (j->pos + n > j->n || memcmp(j->s + j->pos, word, n) != 0) return json_fail(j, "expected a value");
    j->pos += n;
    return 0;
}

// json_object_next: steps to the next member of an object. *index counts the
// members read (0 before the first: the '{' is read then). Returns 1 with the
// member's key in key and the ':' read, so its value comes next; 0 at the
// closing '}'; -1 on an error.
static inline int json_object_next(JsonReader *j, int *index, JsonBuf *key) {
    if (*index == 0 && json_expect(j, '{') != 0) return -1;
    int c = json_peek(j);
    if (c == '}') { j->pos++; return 0; }
    if (*index > 0) {
        if (c != ',') return json_fail(j, "expected ',' or '}' in an object");
        j->pos++;
    }
    if (json_peek(j) != '"') return json_fail(j, "expected a string key in an object");
    if (json_string(j, key) != 0 || json_expect(j, ':') != 0) return -1;
    (*index)++;
    return 1;
}

// json_array_next: as json_object_next for an array: 1 when a value comes
// next, 0 at the closing ']', -1 on an error
static inline int json_array_next(JsonReader *j, int *index) {
    if (*index == 0 && json_expect(j, '[') != 0) return -1;
    int c = json_peek(j);
    if (c == ']') { j->pos++; return 0; }
    if (*index > 0) {
        if (c != ',') return json_fail(j, "expected ',' or ']' in an array");
        j->pos++;
    }
    (*index)++;
    return 1;
}

static inline int json_skip_nested(JsonReader *j, int depth);

// json_skip_value: reads past one value of any kind, checking its grammar
static inline int json_skip_value(JsonReader *j) { return json_skip_nested(j, 0); }

static inline int json_skip_nested(JsonReader *j, int depth) {
    if (depth > JSON_MAX_DEPTH) return json_fail(j, "nested deeper than %d", JSON_MAX_DEPTH);
    int c = json_peek(j), index = 0, more;
    switch (c) {
    case '"': return json_string(j, NULL);
    case '{':
        while ((more = json_object_next(j, &index, NULL)) == 1) {
            if (json_skip_nested(j, depth + 1) != 0) return -1;
        }
        return more;
    case '[':
        while ((more = json_array_next(j, &index)) == 1) {
            if (json_skip_nested(j, depth + 1) != 0) return -1;
        }
        return more;
    case 't': return json_literal(j, "true");
    case 'f': return json_literal(j, "false");
    case 'n': return json_literal(j, "null");
    default: return json_number(j, NULL);
    }
}

#endif
