/*
 * manifest.h: sealed lists of the files of a directory, and writing a file
 * atomically.
 *
 * defines:
 *   Manifest, ManifestEntry   the parsed list: name, size and SHA-256 of each file
 *   manifest_add_file, manifest_add_file_at
 *                             hash a file (by path, or in a directory fd) and add it
 *   manifest_add_entry        add a file hashed elsewhere (a sealed file's one read)
 *   manifest_write, manifest_write_at
 *                             the canonical text, sealed, written atomically
 *   manifest_read             read, check the tag, parse
 *   manifest_verify_file      is this file the one the manifest lists?
 *   write_file_atomic, write_file_atomic_at
 *                             readers see the old file or the whole new one
 *   sha256_file, sha256_fd, path_join
 *                             what those need
 *
 * A manifest is a text file listing the files of a directory (a checkpoint,
 * a set of data shards), written last and atomically. Lines end in "\n" only:
 *     llm3d-manifest 1
 *     files N
 *     NAME SIZE SHA256          (N lines, sorted by NAME bytewise, no duplicates)
 *     tag TAG
 * NAME is 1..255 bytes of [A-Za-z0-9._+-], not starting with '.' (a plain file
 * in that directory: no paths); SIZE is decimal bytes without leading zeros;
 * SHA256 and TAG are 64 lowercase hex digits; TAG = HMAC-SHA256(key, every byte
 * before the "tag " line). Fields are separated by one space. The parser
 * accepts only this canonical form, so a manifest has exactly one spelling.
 * Checkpoints are sealed with the job key; data shards made by prepare_data are
 * sealed with the all-zero key (pass NULL), which detects corruption but not
 * forgery: anyone can compute that tag.
 *
 * Checkpoints (checkpoint.h) and data shards (prepare_data.c, dataloader.h)
 * use it. Errors follow errors.h: one line naming the file, line and field.
 */
#ifndef LLM3D_MANIFEST_H
#define LLM3D_MANIFEST_H

#include "secure.h"  // first: it asks for _GNU_SOURCE; sha256, hmac_sha256, to_hex, hex_decode, KEY_BYTES

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/errors.h"
#include "llm3d/files.h"  // read_all, write_all

// ----------------------------------------------------------------------------
// atomic writes, hashing, manifests

#define MANIFEST_MAX_BYTES (16u << 20)
#define MANIFEST_MAGIC_LINE "llm3d-manifest 1"

typedef struct { char name[256]; uint64_t size; uint8_t sha[32]; } ManifestEntry;
typedef struct { int n; ManifestEntry *e; } Manifest;  // e sorted by name

static inline int path_join(char *out, size_t outlen, const char *dir, const char *name, char *err, size_t errlen) {
    int n = snprintf(out, outlen, "%s/%s", dir != NULL && dir[0] != '\0' ? dir : ".", name);
    if (n < 0 || (size_t)n >= outlen) return errorf(err, errlen, "path %s/%s: too long", dir, name);
    return 0;
}

// write_file_atomic_at: write_file_atomic in the directory open at dfd (dir:
// its name in messages), every step relative to dfd: what it writes lands
// in that directory, whatever its path names by then, and never through a
// link (the temporary is made O_EXCL | O_NOFOLLOW)
static inline int write_file_atomic_at(int dfd, const char *dir, const char *name, const void *data, size_t n,
                                       char *err, size_t errlen) {
    if (name == NULL || name[0] == '\0' || strchr(name, '/') != NULL)
        return errorf(err, errlen, "write_file_atomic: name '%s' must be a plain file name", name ? name : "");
    const char *d = dir != NULL && dir[0] != '\0' ? dir : ".";
    char path[4096], tmp[4096], tmpname[512];
    int tn = snprintf(tmpname, sizeof(tmpname), ".%s.tmp.%ld", name, (long)getpid());
    if (tn < 0 || (size_t)tn >= sizeof(tmpname)) return errorf(err, errlen, "%s/%s: name too long", d, name);
    if (path_join(path, sizeof(path), d, name, err, errlen) != 0) return -1;
    if (path_join(tmp, sizeof(tmp), d, tmpname, err, errlen) != 0) return -1;
    unlinkat(dfd, tmpname, 0);  // a leftover from a crashed run with the same pid
    int fd = openat(dfd, tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return errorf(err, errlen, "%s: create: %s", tmp, strerror(errno));
    int e = 0;
    if (write_all(fd, data, n) != 0) e = errno;
    if (e == 0 && fsync(fd) != 0) e = errno;
    if (close(fd) != 0 && e == 0) e = errno;
    if (e != 0) {
        unlinkat(dfd, tmpname, 0);
        return errorf(err, errlen, "%s: write: %s", tmp, strerror(e));
    }
    if (renameat(dfd, tmpname, dfd, name) != 0) {
        e = errno;
        unlinkat(dfd, tmpname, 0);
        return errorf(err, errlen, "%s: rename to %s: %s", tmp, path, strerror(e));
    }
    if (fsync(dfd) != 0) return errorf(err, errlen, "%s: fsync directory: %s", d, strerror(errno));
    return 0;
}

// write_file_atomic: readers see the old file or the whole new one, never a
// part, even across a crash: temporary name, fsync, rename, fsync the directory
static inline int write_file_atomic(const char *dir, const char *name, const void *data, size_t n,
                                    char *err, size_t errlen) {
    const char *d = dir != NULL && dir[0] != '\0' ? dir : ".";
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return errorf(err, errlen, "%s: open directory: %s", d, strerror(errno));
    int rc = write_file_atomic_at(dfd, d, name, data, n, err, errlen);
    close(dfd);
    return rc;
}

// sha256_fd: hash the regular file open at fd (path: its name in messages);
// *size gets the bytes hashed. Closes fd.
static inline int sha256_fd(int fd, const char *path, uint8_t out[32], uint64_t *size, char *err, size_t errlen) {
    int rc = -1;
    uint8_t *buf = NULL;
    uint64_t total = 0;
    Sha256 s;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        errorf(err, errlen, "%s: not a regular file", path);
        goto done;
    }
    buf = (uint8_t *)malloc(1 << 20);
    if (buf == NULL) {
        errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    sha256_init(&s);
    for (;;) {
        ssize_t r = read(fd, buf, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            errorf(err, errlen, "%s: read: %s", path, strerror(errno));
            goto done;
        }
        if (r == 0) break;
        sha256_update(&s, buf, (size_t)r);
        total += (uint64_t)r;
    }
    sha256_final(&s, out);
    *size = total;
    rc = 0;
done:
    free(buf);
    close(fd);
    return rc;
}

// sha256_file: hash a regular file; *size gets the bytes hashed
static inline int sha256_file(const char *path, uint8_t out[32], uint64_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    return sha256_fd(fd, path, out, size, err, errlen);
}

static inline int manifest_name_ok(const char *name, size_t n) {
    if (n == 0 || n > 255 || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-' || c == '+';
        if (!ok) return 0;
    }
    return 1;
}

// manifest_find: the entry for name, or NULL (binary search: entries are sorted)
static inline const ManifestEntry *manifest_find(const Manifest *m, const char *name) {
    int lo = 0, hi = m->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(m->e[mid].name, name);
        if (c == 0) return &m->e[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

static inline void manifest_free(Manifest *m) {
    free(m->e);
    m->e = NULL;
    m->n = 0;
}

// manifest_add_entry: a file already hashed (name, size, SHA-256), inserted
// in name order
static inline int manifest_add_entry(Manifest *m, const char *name, uint64_t size, const uint8_t sha[32], char *err,
                                     size_t errlen) {
    if (!manifest_name_ok(name, strlen(name)))
        return errorf(err, errlen, "manifest: file name '%s' must be 1..255 of [A-Za-z0-9._+-], not starting with '.'", name);
    if (manifest_find(m, name) != NULL) return errorf(err, errlen, "manifest: file name '%s' is listed twice", name);
    ManifestEntry entry;
    memset(&entry, 0, sizeof(entry));
    strcpy(entry.name, name);  // length checked above
    entry.size = size;
    memcpy(entry.sha, sha, 32);
    ManifestEntry *grown = (ManifestEntry *)realloc(m->e, (size_t)(m->n + 1) * sizeof(ManifestEntry));
    if (grown == NULL) return errorf(err, errlen, "manifest: out of memory adding %s", name);
    m->e = grown;
    int at = m->n;
    while (at > 0 && strcmp(m->e[at - 1].name, name) > 0) at--;
    memmove(&m->e[at + 1], &m->e[at], (size_t)(m->n - at) * sizeof(ManifestEntry));
    m->e[at] = entry;
    m->n++;
    return 0;
}

// manifest_add_file: hash dir/name and insert it in name order
static inline int manifest_add_file(Manifest *m, const char *dir, const char *name, char *err, size_t errlen) {
    if (!manifest_name_ok(name, strlen(name)))
        return errorf(err, errlen, "manifest: file name '%s' must be 1..255 of [A-Za-z0-9._+-], not starting with '.'", name);
    if (manifest_find(m, name) != NULL) return errorf(err, errlen, "manifest: file name '%s' is listed twice", name);
    char path[4096];
    uint8_t sha[32];
    uint64_t size = 0;
    if (path_join(path, sizeof(path), dir, name, err, errlen) != 0) return -1;
    if (sha256_file(path, sha, &size, err, errlen) != 0) return -1;
    return manifest_add_entry(m, name, size, sha, err, errlen);
}

// manifest_add_file_at: manifest_add_file for the file `name` of the
// directory open at dfd (dir: its name in messages), never through a link
static inline int manifest_add_file_at(Manifest *m, int dfd, const char *dir, const char *name, char *err,
                                       size_t errlen) {
    char path[4096];
    uint8_t sha[32];
    uint64_t size = 0;
    if (path_join(path, sizeof(path), dir, name, err, errlen) != 0) return -1;
    int fd = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    if (sha256_fd(fd, path, sha, &size, err, errlen) != 0) return -1;
    return manifest_add_entry(m, name, size, sha, err, errlen);
}

// manifest_format: the canonical text, tag line included; *text is malloc'd
static inline int manifest_format(const Manifest *m, const uint8_t key[32], char **text, size_t *len,
                                  char *err, size_t errlen) {
    static const uint8_t zero_key[32] = {0};
    if (key == NULL) key = zero_key;
    size_t cap = 64 + (size_t)m->n * (256 + 1 + 20 + 1 + 64 + 1) + 4 + 64 + 1 + 1;
    char *out = (char *)malloc(cap);
    if (out == NULL) return errorf(err, errlen, "manifest: out of memory for %d entries", m->n);
    size_t n = (size_t)snprintf(out, cap, "%s\nfiles %d\n", MANIFEST_MAGIC_LINE, m->n);
    for (int i = 0; i < m->n; i++) {
        const ManifestEntry *e = &m->e[i];
        size_t name_len = strnlen(e->name, sizeof(e->name));
        if (!manifest_name_ok(e->name, name_len) || (i > 0 && strcmp(m->e[i - 1].name, e->name) >= 0)) {
            free(out);
            return errorf(err, errlen, "manifest: entry %d name '%.255s' is invalid, repeated or out of order",
                          i, e->name);
        }
        char hex[65];
        to_hex(e->sha, 32, hex);
        n += (size_t)snprintf(out + n, cap - n, "%s %" PRIu64 " %s\n", e->name, e->size, hex);
    }
    uint8_t tag[32];
    hmac_sha256(key, KEY_BYTES, out, n, tag);
    char hex[65];
    to_hex(tag, 32, hex);
    n += (size_t)snprintf(out + n, cap - n, "tag %s\n", hex);
    *text = out;
    *len = n;
    return 0;
}

// manifest_write_at: manifest_write into the directory open at dfd (dir:
// its name in messages)
static inline int manifest_write_at(const Manifest *m, int dfd, const char *dir, const char *manifest_name,
                                    const uint8_t key[32], char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    if (manifest_format(m, key, &text, &len, err, errlen) != 0) return -1;
    int rc = write_file_atomic_at(dfd, dir, manifest_name, text, len, err, errlen);
    free(text);
    return rc;
}

static inline int manifest_write(const Manifest *m, const char *dir, const char *manifest_name, const uint8_t key[32],
                                 char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    if (manifest_format(m, key, &text, &len, err, errlen) != 0) return -1;
    int rc = write_file_atomic(dir, manifest_name, text, len, err, errlen);
    free(text);
    return rc;
}

// manifest_number: a decimal u64 without leading zeros
static inline int manifest_number(const char *s, size_t n, uint64_t *out) {
    if (n == 0 || n > 20 || (n > 1 && s[0] == '0')) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        uint64_t digit = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - digit) / 10) return -1;
        v = v * 10 + digit;
    }
    *out = v;
    return 0;
}

// manifest_check_tag: the last line must be "tag " and the HMAC of every
// byte before it; *body_len gets the length of those bytes
static inline int manifest_check_tag(const char *text, size_t len, const uint8_t key[32], size_t *body_len,
                                     char *err, size_t errlen) {
    const size_t tag_line = 4 + 64 + 1;  // "tag " + 64 hex + "\n"
    if (len < tag_line || text[len - 1] != '\n' || memcmp(text + len - tag_line, "tag ", 4) != 0 ||
        (len > tag_line && text[len - tag_line - 1] != '\n'))
        return errorf(err, errlen, "last line is not 'tag <64 hex>' (truncated?)");
    uint8_t tag[32];
    if (hex_decode(text + len - tag_line + 4, 32, tag, 1) != 0)
        return errorf(err, errlen, "last line: tag is not 64 lowercase hex digits");
    *body_len = len - tag_line;
    uint8_t want[32];
    hmac_sha256(key, KEY_BYTES, text, *body_len, want);
    if (!tag_equal(want, 32, tag, 32))
        return errorf(err, errlen, "tag does not match the contents: the manifest was changed, or sealed with another key");
    return 0;
}

// manifest_parse_entry: the entry line p[0..nl) ("NAME SIZE SHA256", line
// number line) into e; prev is the entry before it, or NULL for the first
static inline int manifest_parse_entry(const char *p, const char *nl, int line, const ManifestEntry *prev,
                                       ManifestEntry *e, char *err, size_t errlen) {
    char shown[72];
    const char *sp1 = (const char *)memchr(p, ' ', (size_t)(nl - p));
    const char *sp2 = sp1 != NULL ? (const char *)memchr(sp1 + 1, ' ', (size_t)(nl - sp1 - 1)) : NULL;
    if (sp2 == NULL) return errorf(err, errlen, "line %d: expected 'NAME SIZE SHA256'", line);
    size_t name_len = (size_t)(sp1 - p);
    if (!manifest_name_ok(p, name_len)) {
        printable(p, name_len, shown, sizeof(shown));
        return errorf(err, errlen, "line %d: name '%s' must be 1..255 of [A-Za-z0-9._+-], not starting with '.'", line, shown);
    }
    memcpy(e->name, p, name_len);
    e->name[name_len] = '\0';
    if (prev != NULL && strcmp(prev->name, e->name) >= 0)
        return errorf(err, errlen, "line %d: name '%s' repeated or out of order", line, e->name);
    if (manifest_number(sp1 + 1, (size_t)(sp2 - sp1 - 1), &e->size) != 0) {
        printable(sp1 + 1, (size_t)(sp2 - sp1 - 1), shown, sizeof(shown));
        return errorf(err, errlen, "line %d: size '%s' is not a decimal without leading zeros", line, shown);
    }
    if (nl - sp2 - 1 != 64 || hex_decode(sp2 + 1, 32, e->sha, 1) != 0)
        return errorf(err, errlen, "line %d: sha256 is not 64 lowercase hex digits", line);
    return 0;
}

// manifest_parse: the tag is checked before anything else is believed; then
// the canonical form line by line. Errors name the line and the field.
static inline int manifest_parse(Manifest *m, const char *text, size_t len, const uint8_t key[32],
                                 char *err, size_t errlen) {
    static const uint8_t zero_key[32] = {0};
    if (key == NULL) key = zero_key;
    m->n = 0;
    m->e = NULL;
    if (len == 0) return errorf(err, errlen, "empty manifest");
    if (len > MANIFEST_MAX_BYTES) return errorf(err, errlen, "manifest of %zu bytes is over the %u limit", len, MANIFEST_MAX_BYTES);
    size_t body_len = 0;
    if (manifest_check_tag(text, len, key, &body_len, err, errlen) != 0) return -1;

    const char *p = text, *end = text + body_len;
    const char *nl = (const char *)memchr(p, '\n', (size_t)(end - p));
    size_t magic_len = strlen(MANIFEST_MAGIC_LINE);
    if (nl == NULL || (size_t)(nl - p) != magic_len || memcmp(p, MANIFEST_MAGIC_LINE, magic_len) != 0)
        return errorf(err, errlen, "line 1: expected '%s'", MANIFEST_MAGIC_LINE);
    p = nl + 1;
    nl = (const char *)memchr(p, '\n', (size_t)(end - p));
    uint64_t count;
    if (nl == NULL || nl - p < 6 || memcmp(p, "files ", 6) != 0 || manifest_number(p + 6, (size_t)(nl - p - 6), &count) != 0)
        return errorf(err, errlen, "line 2: expected 'files N'");
    p = nl + 1;
    // every entry line is at least "a 0 <64 hex>\n": bound the count by the bytes left
    const size_t min_entry = 1 + 1 + 1 + 1 + 64 + 1;
    if (count > (uint64_t)(end - p) / min_entry)
        return errorf(err, errlen, "line 2: files %" PRIu64 " does not fit in %zu bytes", count, (size_t)(end - p));
    if (count > 0) {
        m->e = (ManifestEntry *)calloc((size_t)count, sizeof(ManifestEntry));
        if (m->e == NULL) return errorf(err, errlen, "line 2: out of memory for %" PRIu64 " files", count);
    }
    for (uint64_t i = 0; i < count; i++) {
        int line = 3 + (int)i;
        nl = (const char *)memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) {
            errorf(err, errlen, "line %d: missing (files %" PRIu64 ")", line, count);
            goto fail;
        }
        if (manifest_parse_entry(p, nl, line, i > 0 ? &m->e[i - 1] : NULL, &m->e[i], err, errlen) != 0) goto fail;
        m->n = (int)(i + 1);
        p = nl + 1;
    }
    if (p != end) {
        errorf(err, errlen, "line %d: more lines than files %" PRIu64, 3 + (int)count, count);
        goto fail;
    }
    return 0;
fail:
    manifest_free(m);
    return -1;
}

static inline int manifest_read(Manifest *m, const char *dir, const char *manifest_name, const uint8_t key[32],
                                char *err, size_t errlen) {
    m->n = 0;
    m->e = NULL;
    char path[4096];
    if (path_join(path, sizeof(path), dir, manifest_name, err, errlen) != 0) return -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    int rc = -1;
    char *text = NULL;
    size_t cap, n = 0;
    char why[512];
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        errorf(err, errlen, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)st.st_size > MANIFEST_MAX_BYTES) {
        errorf(err, errlen, "%s: %lld bytes, over the manifest limit of %u", path, (long long)st.st_size,
               MANIFEST_MAX_BYTES);
        goto done;
    }
    cap = (size_t)st.st_size + 1;  // +1 sees a file that grew under us
    text = (char *)malloc(cap);
    if (text == NULL) {
        errorf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (read_all(fd, text, cap, &n) != 0) {
        errorf(err, errlen, "%s: read: %s", path, strerror(errno));
        goto done;
    }
    if (n == cap) {
        errorf(err, errlen, "%s: read: file changed size while read", path);
        goto done;
    }
    if (manifest_parse(m, text, n, key, why, sizeof(why)) != 0) {
        errorf(err, errlen, "%s: %s", path, why);
        goto done;
    }
    rc = 0;
done:
    free(text);
    close(fd);
    return rc;
}

static inline int manifest_verify_file(const Manifest *m, const char *dir, const char *name, char *err, size_t errlen) {
    char path[4096];
    if (path_join(path, sizeof(path), dir, name, err, errlen) != 0) return -1;
    const ManifestEntry *e = manifest_find(m, name);
    if (e == NULL) return errorf(err, errlen, "%s: not listed in the manifest", path);
    struct stat st;
    if (stat(path, &st) != 0) return errorf(err, errlen, "%s: %s", path, strerror(errno));
    if ((uint64_t)st.st_size != e->size)  // cheap, and saves hashing a file that is surely wrong
        return errorf(err, errlen, "%s: size %lld, the manifest says %" PRIu64, path, (long long)st.st_size, e->size);
    uint8_t sha[32];
    uint64_t size = 0;
    if (sha256_file(path, sha, &size, err, errlen) != 0) return -1;
    if (size != e->size)
        return errorf(err, errlen, "%s: size %" PRIu64 ", the manifest says %" PRIu64, path, size, e->size);
    if (memcmp(sha, e->sha, 32) != 0) {
        char got[65], want[65];
        to_hex(sha, 32, got);
        to_hex(e->sha, 32, want);
        return errorf(err, errlen, "%s: sha256 %.16s... differs from the manifest's %.16s...: the file changed",
                      path, got, want);
    }
    return 0;
}

#endif
