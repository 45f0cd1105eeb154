/*
 * backup_files.c — a backup's files besides its database, on the backup's
 * helper thread (backup.h says when).
 *
 * Blob files are immutable once written (shared_upload.c renames a finished
 * file into place and nothing writes it again), so a hard link is as good a
 * copy as a copy, and costs no room and no time.  A link cannot cross file
 * systems: a backups directory on another disk (the way to survive the
 * loss of the data dir's) gets copies instead.  The files the copy names
 * stay in the data dir while this runs: the head's sweep leaves them
 * (backup_holds_files), and nothing else unlinks a committed level's file.
 */
#include "backup_files.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BACKUP_COPY_BUFFER (256 * 1024)

/* DIR/name into `out`; false (with s->fail set) when it does not fit. */
static bool backup_path(backup_seal_t *s, char *out, size_t size, const char *dir,
                        const char *name) {
  if (snprintf(out, size, "%s/%s", dir, name) < (int)size)
    return true;
  fail_set(&s->fail, MUSTER_STORE, "the path %s/%s is too long", dir, name);
  return false;
}

muster_err_t backup_errno_fail(fail_t *f, const char *what, const char *path, int err) {
  if (fail_errno_is_fds(err))
    return fail_set(f, MUSTER_UNAVAILABLE,
                    "cannot %s %s now: " FAIL_FDS_TEXT "; send the backup again", what, path);
  /* Said as the database's copy says it (backup.c), so that one phrase finds
   * every backup a full backups disk failed, in the log and in the docs. */
  if (err == ENOSPC || err == EDQUOT)
    return fail_set(f, MUSTER_STORE, "cannot %s %s: the disk holding it is full (%s)", what, path,
                    strerror(err));
  return fail_set(f, MUSTER_STORE, "cannot %s %s: %s", what, path, strerror(err));
}

/* Records that `what` `path` failed with errno `err` (backup_errno_fail). */
static muster_err_t backup_io_fail(backup_seal_t *s, const char *what, const char *path, int err) {
  return backup_errno_fail(&s->fail, what, path, err);
}

/* fsyncs file or directory `path`; *bytes (may be NULL) gets its size. */
static muster_err_t backup_sync(backup_seal_t *s, const char *path, int64_t *bytes) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0)
    return backup_io_fail(s, "open", path, errno);
  bool ok = fsync(fd) == 0 && fstat(fd, &st) == 0;
  int err = errno;
  close(fd);
  if (!ok)
    return backup_io_fail(s, "sync", path, err);
  if (bytes)
    *bytes = (int64_t)st.st_size;
  return MUSTER_OK;
}

/* Writes all of `data` (len bytes) to fd; false with errno set. */
static bool backup_write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      return false;
    }
    data += n;
    len -= (size_t)n;
  }
  return true;
}

/* Copies from fd `in` to fd `out` until the end of `in`; 0 or an errno
 * (ECANCELED when the head stops meanwhile). */
static int backup_copy_fds(backup_seal_t *s, int in, int out) {
  char *buf = malloc(BACKUP_COPY_BUFFER);
  if (buf == NULL)
    return ENOMEM;
  int err = 0;
  while (!(err = atomic_load(&s->cancel) ? ECANCELED : 0)) {
    ssize_t n = read(in, buf, BACKUP_COPY_BUFFER);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || !backup_write_all(out, buf, (size_t)n)) {
      err = n == 0 ? 0 : errno;
      break;
    }
  }
  free(buf);
  return err;
}

/* Copies blob file `from` to new file `to` and fsyncs the copy. */
static muster_err_t backup_copy_file(backup_seal_t *s, const char *from, const char *to) {
  int in = open(from, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return backup_io_fail(s, "open", from, errno);
  int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (out < 0) {
    int err = errno;
    close(in);
    return backup_io_fail(s, "create", to, err);
  }
  int err = backup_copy_fds(s, in, out);
  if (err == 0 && fsync(out) != 0)
    err = errno;
  close(in);
  if (close(out) != 0 && err == 0)
    err = errno;
  return err ? backup_io_fail(s, "write", to, err) : MUSTER_OK;
}

/* True when link(2) failed with `err` because no link can be made there
 * (another file system, or one without hard links): copy instead. */
static bool backup_link_impossible(int err) {
  return err == EXDEV || err == EPERM || err == EMLINK || err == ENOTSUP || err == EOPNOTSUPP;
}

/* Links (or copies) blob file `name` from DATA_DIR/shared into `shared`. */
static muster_err_t backup_one_file(backup_seal_t *s, const char *shared, const char *name) {
  char from_dir[PATH_MAX + 16], from[PATH_MAX + 64], to[PATH_MAX + 64];
  if (!backup_path(s, from_dir, sizeof from_dir, s->data_dir, "shared") ||
      !backup_path(s, from, sizeof from, from_dir, name) ||
      !backup_path(s, to, sizeof to, shared, name))
    return s->fail.code;
  if (link(from, to) == 0) {
    s->linked++;
  } else if (backup_link_impossible(errno)) {
    if (backup_copy_file(s, from, to))
      return s->fail.code;
    s->copied++;
  } else {
    return fail_set(&s->fail, MUSTER_STORE, "cannot link %s to %s: %s", from, to, strerror(errno));
  }
  int64_t bytes = 0;
  if (backup_sync(s, to, &bytes)) /* a link's data was durable already: cheap */
    return s->fail.code;
  s->shared_bytes += bytes;
  return MUSTER_OK;
}

/* DIR/shared with every blob file the copy names. */
static muster_err_t backup_shared_files(backup_seal_t *s, const char *shared) {
  if (mkdir(shared, 0700) != 0)
    return backup_io_fail(s, "create", shared, errno);
  for (size_t i = 0; i < s->nfiles; i++) {
    if (atomic_load(&s->cancel))
      return fail_set(&s->fail, MUSTER_UNAVAILABLE,
                      "the head is shutting down before the blob files were all copied");
    if (backup_one_file(s, shared, s->files[i]))
      return s->fail.code;
  }
  return MUSTER_OK;
}

/* DIR/token: the admin token, so that a head started on the backup without
 * --token takes the same one (clients and nodes keep theirs). */
static muster_err_t backup_token(backup_seal_t *s) {
  char path[PATH_MAX + 16];
  if (!backup_path(s, path, sizeof path, s->dir, "token"))
    return s->fail.code;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return backup_io_fail(s, "create", path, errno);
  char line[sizeof s->token + 1];
  int len = snprintf(line, sizeof line, "%s\n", s->token);
  bool ok = backup_write_all(fd, line, (size_t)len) && fsync(fd) == 0;
  int err = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  return ok ? MUSTER_OK : backup_io_fail(s, "write", path, err);
}

/* Gives the whole backup its name: renames s->dir, where it was made, to
 * s->final_dir, which then is s->dir.  A name that appeared meanwhile (made
 * by hand: the head makes one backup at a time) is not replaced. */
static muster_err_t backup_publish(backup_seal_t *s) {
  if (rename(s->dir, s->final_dir) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY)
      return fail_set(&s->fail, MUSTER_INVALID_STATE,
                      "%s was made meanwhile, by something else than this head: the backup is "
                      "not put in its place",
                      s->final_dir);
    return fail_set(&s->fail, MUSTER_STORE, "cannot rename %s to %s: %s", s->dir, s->final_dir,
                    strerror(errno));
  }
  snprintf(s->dir, sizeof s->dir, "%s", s->final_dir);
  return MUSTER_OK;
}

muster_err_t backup_seal(backup_seal_t *s) {
  char db[PATH_MAX + 16], shared[PATH_MAX + 16], backups[PATH_MAX + 16];
  s->fail = (fail_t){0};
  if (!backup_path(s, db, sizeof db, s->dir, "muster.db") ||
      !backup_path(s, shared, sizeof shared, s->dir, "shared") ||
      !backup_path(s, backups, sizeof backups, s->data_dir, "backups"))
    return s->fail.code;
  /* The directories last, from the innermost out: each fsync makes durable
   * the names made in it, and the data dir the name "backups" when this
   * was the first backup. */
  if (backup_sync(s, db, &s->database_bytes) || backup_shared_files(s, shared) || backup_token(s) ||
      backup_sync(s, shared, NULL) || backup_sync(s, s->dir, NULL) || backup_publish(s) ||
      backup_sync(s, backups, NULL) || backup_sync(s, s->data_dir, NULL))
    return s->fail.code;
  return MUSTER_OK;
}

const char *backup_partial_name(const char *entry, char *name, size_t size) {
  size_t len = strlen(entry), tail = strlen(BACKUP_PARTIAL_SUFFIX);
  if (entry[0] != '.' || len <= tail + 1 || strcmp(entry + len - tail, BACKUP_PARTIAL_SUFFIX) != 0)
    return NULL;
  snprintf(name, size, "%.*s", (int)(len - tail - 1), entry + 1);
  return name;
}

static int backup_remove_first_err; /* nftw's callback has no argument of its own */

static int backup_remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  int rc = type == FTW_DP ? rmdir(path) : unlink(path);
  if (rc != 0 && errno != ENOENT && backup_remove_first_err == 0)
    backup_remove_first_err = errno;
  return 0; /* go on: remove what can be removed */
}

int backup_remove(const char *dir) {
  if (rmdir(dir) == 0) /* empty: gone without the descriptors nftw needs (none may be left) */
    return 0;
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  pthread_mutex_lock(&lock); /* for backup_remove_first_err */
  backup_remove_first_err = 0;
  if (nftw(dir, backup_remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
    backup_remove_first_err = errno;
  int err = backup_remove_first_err;
  pthread_mutex_unlock(&lock);
  return err;
}
