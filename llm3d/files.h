/*
 * files.h: opening a file so that what is opened is what was meant, and
 * reading or writing all of a buffer.
 *
 * defines:
 *   open_regular    a file to read (data, a model, a tokenizer), refused
 *                   unless it is a regular file
 *   fopen_regular   the same, as a FILE *
 *   fopen_nofollow, fopen_nofollow_at
 *                   a file of the output directory that is kept open (the
 *                   trainer's log), never reached through a symbolic link,
 *                   and refused unless it is a regular file (or, written,
 *                   a character device such as /dev/null)
 *   file_open_checked_at
 *                   the same as an fd, any flags (the trainer's DONE file)
 *   fopen_tmp,      a file written whole and then put in place: PATH.tmp
 *   fclose_rename,  made anew (never through a link, never an old file
 *   fclose_abandon  reused), then renamed to PATH, or removed
 *   fopen_tmp_at, fclose_rename_at
 *                   the same in a directory held open (the trainer's -o)
 *   write_file      a whole file from one buffer, that way
 *   write_all       all n bytes to an fd, through short writes and EINTR
 *   read_all        up to cap bytes from an fd, until it ends
 *   pread_all       exactly n bytes at an offset (a file shorter is an error)
 *   pwrite_all      all n bytes at an offset
 *
 * Why. open() of a FIFO blocks until someone opens the other end, so a FIFO
 * given as (or matching) a data, model or tokenizer path would hang the
 * trainer in open(); a device would be read forever. Each file is opened
 * with O_NONBLOCK, which never blocks the open, then fstat decides: anything
 * but a regular file is "not a regular file", at once.
 *
 * A directory that another user can write in (or once could) may hold a
 * link planted where a program will write: following it would write, or
 * truncate, a file the program never meant. O_NOFOLLOW refuses a link as the
 * last part of the path. Files read may be links (a data directory of links
 * to shards is common); files written may not. Every file a program writes
 * whole (shards, a model, a plot, a tokenizer) goes through fopen_tmp: its
 * PATH.tmp is created with O_CREAT | O_EXCL | O_NOFOLLOW, so that neither a
 * symbolic link nor a hard link planted there (to a file another user owns)
 * is ever written through, and the rename onto PATH replaces whatever is at
 * PATH, a link included, without touching what a link points to.
 *
 * The _at forms take a directory fd and a name in it (AT_FDCWD and a path
 * for the plain forms), and the path that messages name: a directory that
 * a program holds open stays the one it checked, even when its path is
 * renamed away and a link put there (checkpoint.h's -o).
 *
 * Errors follow errors.h: one line naming the path.
 */
#ifndef LLM3D_FILES_H
#define LLM3D_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm3d/errors.h"

// file_open_checked_at: openat(dfd, name, flags) without blocking, then
// kept only when it is a regular file (or, opened only to write, a
// character device); the fd in blocking mode again, or -1 with err set
// naming path. what: the kind of file, for the message ("model file"), or "".
static inline int file_open_checked_at(int dfd, const char *name, const char *path, int flags, const char *what,
                                       char *err, size_t errlen) {
    int fd = openat(dfd, name, flags | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP && (flags & O_NOFOLLOW))
        return errorf(err, errlen, "%s: a symbolic link, not followed here", path);
    if (fd < 0 && errno == ENXIO)  // a FIFO opened to write that nobody reads
        return errorf(err, errlen, "%s: not a regular file", path);
    if (fd < 0) return errorf(err, errlen, "%s: cannot open%s%s: %s", path, what[0] ? " " : "", what, strerror(errno));
    // a character device written to (the log at /dev/null) never blocks, and
    // a write that fails there ends the run as on a full disk
    struct stat st;
    int device_ok = (flags & O_ACCMODE) == O_WRONLY;
    if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || (device_ok && S_ISCHR(st.st_mode)))) {
        close(fd);
        return errorf(err, errlen, "%s: not a regular file", path);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// file_open_checked: the same for a path
static inline int file_open_checked(const char *path, int flags, const char *what, char *err, size_t errlen) {
    return file_open_checked_at(AT_FDCWD, path, path, flags, what, err, errlen);
}

// open_regular: path opened to read; -1 with err set when it cannot be
// opened or is not a regular file (what as for file_open_checked)
static inline int open_regular(const char *path, const char *what, char *err, size_t errlen) {
    return file_open_checked(path, O_RDONLY, what, err, errlen);
}

static inline FILE *file_fdopen(int fd, const char *path, const char *mode, char *err, size_t errlen) {
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (f == NULL) {
        errorf(err, errlen, "%s: fdopen: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

static inline FILE *fopen_regular(const char *path, const char *what, char *err, size_t errlen) {
    return file_fdopen(open_regular(path, what, err, errlen), path, "rb", err, errlen);
}

// fopen_nofollow_at: name in the directory dfd (path in messages), mode
// "r", "w" or "a" (a "b" is allowed and means nothing on Linux); NULL with
// err set when it is a link, not a regular file, or cannot be opened
static inline FILE *fopen_nofollow_at(int dfd, const char *name, const char *path, const char *mode, char *err,
                                      size_t errlen) {
    int flags = mode[0] == 'w' ? O_WRONLY | O_CREAT | O_TRUNC : mode[0] == 'a' ? O_WRONLY | O_CREAT | O_APPEND : O_RDONLY;
    return file_fdopen(file_open_checked_at(dfd, name, path, flags | O_NOFOLLOW, "", err, errlen), path, mode, err,
                       errlen);
}

static inline FILE *fopen_nofollow(const char *path, const char *mode, char *err, size_t errlen) {
    return fopen_nofollow_at(AT_FDCWD, path, path, mode, err, errlen);
}

// fopen_tmp_at: NAME.tmp in the directory dfd, made anew to write what
// fclose_rename_at then puts at name: created exclusively, never through a
// link (O_CREAT | O_EXCL | O_NOFOLLOW), mode 0644 less the umask. A regular
// file of that name, left by a run cut short, gives way first (unlink
// removes a name, never what another name of the file holds); a link or
// anything else there is refused and left as it is. path is name's path,
// for messages; tmp (tmplen bytes) gets PATH.tmp. NULL with err set.
static inline FILE *fopen_tmp_at(int dfd, const char *name, const char *path, char *tmp, size_t tmplen, char *err,
                                 size_t errlen) {
    char tmp_name[4200];
    int n = snprintf(tmp, tmplen, "%s.tmp", path), m = snprintf(tmp_name, sizeof(tmp_name), "%s.tmp", name);
    if (n < 0 || (size_t)n >= tmplen || m < 0 || (size_t)m >= sizeof(tmp_name)) {
        errorf(err, errlen, "%.200s...: path too long", path);
        return NULL;
    }
    struct stat st;
    if (fstatat(dfd, tmp_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) unlinkat(dfd, tmp_name, 0);
    int fd = openat(dfd, tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && fstatat(dfd, tmp_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        errorf(err, errlen, "%s: %s, not followed here", tmp, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file");
        return NULL;
    }
    if (fd < 0) {
        errorf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return NULL;
    }
    return file_fdopen(fd, tmp, "wb", err, errlen);
}

// fopen_tmp: the same for a path
static inline FILE *fopen_tmp(const char *path, char *tmp, size_t tmplen, char *err, size_t errlen) {
    return fopen_tmp_at(AT_FDCWD, path, path, tmp, tmplen, err, errlen);
}

// fclose_abandon: f of fopen_tmp closed and its tmp removed (after an error)
static inline void fclose_abandon(FILE *f, const char *tmp) {
    if (f != NULL) fclose(f);
    unlink(tmp);
}

// fclose_rename_at: f of fopen_tmp_at (NAME.tmp in dfd, tmp its path)
// flushed, fsynced and closed, then renamed to name, which it replaces
// whatever is there (a link is replaced itself; what it points to is not
// touched). A write that failed on f (ferror) or fails now leaves nothing:
// the temporary file is removed. path: name's path, for messages. 0, or -1
// with err set.
static inline int fclose_rename_at(FILE *f, int dfd, const char *name, const char *tmp, const char *path, char *err,
                                   size_t errlen) {
    char tmp_name[4200];
    snprintf(tmp_name, sizeof(tmp_name), "%s.tmp", name);  // fopen_tmp_at checked that it fits
    int bad = ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
    int saved = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        saved = errno;
    }
    if (bad) {
        unlinkat(dfd, tmp_name, 0);
        return errorf(err, errlen, "%s: write error: %s", tmp, strerror(saved));
    }
    if (renameat(dfd, tmp_name, dfd, name) != 0) {
        saved = errno;
        unlinkat(dfd, tmp_name, 0);
        return errorf(err, errlen, "%s: cannot rename to %s: %s", tmp, path, strerror(saved));
    }
    return 0;
}

// fclose_rename: the same for f of fopen_tmp (named tmp) and path
static inline int fclose_rename(FILE *f, const char *tmp, const char *path, char *err, size_t errlen) {
    return fclose_rename_at(f, AT_FDCWD, path, tmp, path, err, errlen);
}

// write_file: the n bytes of data as the file at path, through fopen_tmp and
// fclose_rename; 0, or -1 with err set
static inline int write_file(const char *path, const void *data, size_t n, char *err, size_t errlen) {
    char tmp[4200];
    FILE *f = fopen_tmp(path, tmp, sizeof(tmp), err, errlen);
    if (f == NULL) return -1;
    fwrite(data, 1, n, f);  // a failure shows in ferror, which fclose_rename reads
    return fclose_rename(f, tmp, path, err, errlen);
}

// read_all: up to cap bytes into buf, through short reads and EINTR, until
// the fd ends; *got gets the bytes read (cap when it may hold more). 0, or -1
// with errno set by the read that failed
static inline int read_all(int fd, void *buf, size_t cap, size_t *got) {
    uint8_t *p = (uint8_t *)buf;
    *got = 0;
    while (*got < cap) {
        ssize_t r = read(fd, p + *got, cap - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        *got += (size_t)r;
    }
    return 0;
}

// write_all: 0, or -1 with errno set by the write that failed
static inline int write_all(int fd, const void *data, size_t n) {
    const uint8_t *p = (const uint8_t *)data;
    while (n > 0) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        p += r; n -= (size_t)r;
    }
    return 0;
}

// pread_all: exactly n bytes at offset, through short reads and EINTR; 0, or
// -1 with errno (EIO when the file ends first: it is shorter than its header
// said)
static inline int pread_all(int fd, void *buf, size_t n, uint64_t offset) {
    uint8_t *p = (uint8_t *)buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = EIO; return -1; }
        p += r; n -= (size_t)r; offset += (uint64_t)r;
    }
    return 0;
}

// pwrite_all: all n bytes at offset; 0, or -1 with errno
static inline int pwrite_all(int fd, const void *buf, size_t n, uint64_t offset) {
    const uint8_t *p = (const uint8_t *)buf;
    while (n > 0) {
        ssize_t r = pwrite(fd, p, n, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = EIO; return -1; }
        p += r; n -= (size_t)r; offset += (uint64_t)r;
    }
    return 0;
}

#endif
