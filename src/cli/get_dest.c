/*
 * get_dest.c — the FILE of `muster shared get`, replaced whole or left as it
 * was (see get_dest.h for why).  The CLI is one thread, so reading the umask
 * (set and set back) races with nobody.
 */
#include "cli/get_dest.h"
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEST_SUFFIX ".part"

/* The file that writing `path` writes, its symbolic links followed as open()
 * follows them (malloc'd), or NULL with errno.  Nothing there: `path` itself.
 * A dangling link's target is created empty, as open() would create it, and
 * *created says so (a failed download removes it again). */
static char *dest_target(const char *path, bool *created) {
  char *real = realpath(path, NULL);
  if (real != NULL || errno != ENOENT)
    return real;
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return errno == ENOENT ? strdup(path) : NULL;
  if (!S_ISLNK(sb.st_mode))
    return NULL; /* errno is realpath's ENOENT */
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0)
    return NULL;
  close(fd);
  *created = true;
  return realpath(path, NULL);
}

/* ".BASE.XXXXXX.part" in the directory of `target` (malloc'd), for mkostemps. */
static char *dest_tmp_template(const char *target) {
  char *dir_copy = strdup(target), *base_copy = strdup(target), *out = NULL;
  if (dir_copy && base_copy) {
    const char *dir = dirname(dir_copy), *base = basename(base_copy);
    size_t size = strlen(dir) + strlen(base) + sizeof "/..XXXXXX" DEST_SUFFIX;
    out = malloc(size);
    if (out)
      snprintf(out, size, "%s/.%s.XXXXXX" DEST_SUFFIX, dir, base);
  }
  free(dir_copy);
  free(base_copy);
  return out;
}

/* The temporary file beside d->target, with the permission bits of the file
 * it replaces (`old`), or 0666 less the umask for a new one (as open() gives);
 * -1 with errno when it cannot be made (nothing is left then). */
static int dest_open_tmp(get_dest_t *d, const struct stat *old) {
  char *tmp = dest_tmp_template(d->target);
  if (tmp == NULL) {
    errno = ENOMEM;
    return -1;
  }
  d->fd = mkostemps(tmp, (int)strlen(DEST_SUFFIX), O_CLOEXEC);
  if (d->fd < 0) {
    int err = errno;
    free(tmp);
    errno = err;
    return -1;
  }
  d->tmp = tmp;
  mode_t mask = umask(022);
  umask(mask);
  return fchmod(d->fd, old ? old->st_mode & 0777 : 0666 & ~mask);
}

/* Says why the destination cannot be had (errno), drops what was made, and
 * returns CLI_FAIL. */
static int dest_refuse(get_dest_t *d, bool beside) {
  int err = errno;
  if (beside)
    fprintf(stderr, "muster: cannot create a file beside %s to download into: %s\n", d->path,
            strerror(err));
  else
    fprintf(stderr, "muster: cannot open %s: %s\n", d->path, strerror(err));
  get_dest_discard(d);
  return CLI_FAIL;
}

int get_dest_open(get_dest_t *d, const char *path) {
  *d = (get_dest_t){.fd = -1, .path = path};
  struct stat sb;
  d->target = dest_target(path, &d->created);
  if (d->target == NULL)
    return dest_refuse(d, false);
  bool exists = stat(d->target, &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) {
    errno = EISDIR;
    return dest_refuse(d, false);
  }
  if (exists && (S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) || S_ISFIFO(sb.st_mode))) {
    d->fd = open(d->target, O_WRONLY | O_CLOEXEC); /* written into, never replaced */
    return d->fd >= 0 ? CLI_OK : dest_refuse(d, false);
  }
  if (dest_open_tmp(d, exists && !d->created ? &sb : NULL) != 0)
    return dest_refuse(d, true);
  return CLI_OK;
}

int get_dest_commit(get_dest_t *d) {
  int rc = CLI_OK;
  if (close(d->fd) != 0) {
    fprintf(stderr, "muster: cannot write %s: %s\n", d->tmp ? d->tmp : d->path, strerror(errno));
    rc = CLI_FAIL;
  }
  d->fd = -1;
  if (rc == CLI_OK && d->tmp && rename(d->tmp, d->target) != 0) {
    fprintf(stderr, "muster: cannot put the download in place of %s: %s\n", d->path,
            strerror(errno));
    rc = CLI_FAIL;
  }
  if (rc == CLI_OK) {
    free(d->tmp); /* renamed: nothing to remove */
    d->tmp = NULL;
    d->created = false;
  }
  get_dest_discard(d);
  return rc;
}

void get_dest_discard(get_dest_t *d) {
  if (d->fd >= 0)
    close(d->fd);
  if (d->tmp)
    unlink(d->tmp);
  if (d->created && d->target)
    unlink(d->target);
  free(d->tmp);
  free(d->target);
  *d = (get_dest_t){.fd = -1, .path = d->path};
}
