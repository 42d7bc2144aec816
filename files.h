/*
 * files.h: opening a file so that what is opened is what was meant.
 *
 * defines:
 *   fopen_nofollow  a file of the output directory (a log, a model file being
 *                   written), never reached through a symbolic link, and
 *                   refused unless it is a regular file
 *
 * Why. A directory that another user can write in (or once could) may hold a
 * link planted where the trainer will write: following it would write, or
 * truncate, a file the trainer never meant. O_NOFOLLOW refuses a link as the
 * last part of the path; O_NONBLOCK keeps a FIFO planted there from blocking
 * the open, and fstat then refuses it.
 *
 * Errors follow errors.h: one line naming the path.
 */
#ifndef LLM3D_FILES_H
#define LLM3D_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"

// file_open_checked: open(path, flags) without blocking, then kept only when
// it is a regular file; the fd in blocking mode again, or -1 with err set
static inline int file_open_checked(const char *path, int flags, char *err, size_t errlen) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP && (flags & O_NOFOLLOW))
        return errorf(err, errlen, "%s: a symbolic link, not followed here", path);
    if (fd < 0 && errno == ENXIO)  // a FIFO opened to write that nobody reads
        return errorf(err, errlen, "%s: not a regular file", path);
    if (fd < 0) return errorf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return errorf(err, errlen, "%s: not a regular file", path);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

// fopen_nofollow: mode "r", "w" or "a" (a "b" is allowed and means nothing
// on Linux); NULL with err set when path is a link, not a regular file, or
// cannot be opened
static inline FILE *fopen_nofollow(const char *path, const char *mode, char *err, size_t errlen) {
    int flags = mode[0] == 'w' ? O_WRONLY | O_CREAT | O_TRUNC : mode[0] == 'a' ? O_WRONLY | O_CREAT | O_APPEND : O_RDONLY;
    int fd = file_open_checked(path, flags | O_NOFOLLOW, err, errlen);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, mode);
    if (f == NULL) {
        errorf(err, errlen, "%s: fdopen: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

#endif
