/*
 * cache_lock.c — one agent at a time in a cache directory.
 *
 * The cache is not made to be shared: an agent counts only the levels in its
 * own index against its --cache-bytes (a second agent's files would push the
 * directory past the limit unseen), evicts by its own reads, and at its start
 * removes every temporary file in DIR/@tmp, which are another running agent's
 * fetches in progress.  So an agent holds flock on DIR/@agent.lock (a name no
 * scope can have: '@' is not allowed in one) from the moment it uses the
 * directory: at its start when the directory is there already, else when it
 * first creates it.  A second agent is refused, naming the first: at its
 * start it does not start; once running, it serves its reads from the head,
 * uncached (cache_fetch.c logs why, once).
 *
 * The lock file can go while it is held (`rm -rf` of the cache dir, which the
 * cache otherwise survives: files made again when next needed); each claim
 * checks that the file in the directory is still the one held, and takes a
 * new one when it is not, so that a second agent cannot slip in then.
 */
#include "node/cache.h"
#include "node/node.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_LOCK_NAME "@agent.lock"

/* True while the lock file in the directory is the one `c` holds. */
static bool cache_lock_current(const cache_t *c, const char *path) {
  struct stat held, there;
  return c->lock_fd >= 0 && fstat(c->lock_fd, &held) == 0 && stat(path, &there) == 0 &&
         held.st_dev == there.st_dev && held.st_ino == there.st_ino;
}

int cache_claim(cache_t *c, char *err, size_t err_size) {
  char path[sizeof c->dir + sizeof CACHE_LOCK_NAME + 1], holder[200];
  snprintf(path, sizeof path, "%s/" CACHE_LOCK_NAME, c->dir);
  if (cache_lock_current(c, path))
    return 0;
  if (cache_make_dir(c, NULL) != 0) {
    snprintf(err, err_size, "cannot create the cache directory %s: %s", c->dir, strerror(errno));
    return -1;
  }
  int fd = node_dir_lock_take(path, holder, sizeof holder);
  if (fd == NODE_LOCK_BUSY) {
    snprintf(err, err_size,
             "the cache dir %s is in use by another node agent (%s): two agents cannot share "
             "one (each counts only its own files against --cache-bytes, and removes the "
             "other's fetches in progress as it starts); give each its own --cache-dir (the "
             "default, /var/tmp/muster-node-NAME/cache, is one per node name)",
             c->dir, holder);
    return CACHE_CLAIM_BUSY;
  }
  if (fd < 0) {
    snprintf(err, err_size, "cannot open the cache dir's lock %s: %s", path, strerror(errno));
    return -1;
  }
  if (c->lock_fd >= 0)
    close(c->lock_fd); /* its file was removed: the new one is the lock now */
  c->lock_fd = fd;
  if (!node_dir_lock_note(fd, c->owner))
    fprintf(stderr, "muster node: cannot write who holds %s (it is held all the same)\n", path);
  return 0;
}

void cache_unclaim(cache_t *c) {
  if (c->lock_fd >= 0)
    close(c->lock_fd);
  c->lock_fd = -1;
}
