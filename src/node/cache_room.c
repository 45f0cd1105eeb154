/*
 * cache_room.c — the room on the cache dir's disk (docs/shared-data.md "A
 * full disk"): made before each fetch, and the levels it could not be made
 * for.
 *
 * A level's room is found before its fetch starts, while its readers can
 * still be served from the head instead: a reply under way cannot be.  Most
 * file systems reserve the blocks (fallocate with FALLOC_FL_KEEP_SIZE); one
 * that cannot (ext2, for one) is asked how many blocks are free (fstatvfs)
 * and must have the level's size, room for its own blocks (indirect blocks,
 * CACHE_ROOM_FS_SHARE of the size and CACHE_ROOM_FS_BLOCKS blocks: more than
 * ext2 takes with 1 KiB blocks) and what the fetches in progress have still
 * to write.  While the disk is short, cached levels nobody reads go, oldest
 * first, as far as their bytes can make the room: a level bigger than all
 * that could be had evicts nothing, or every read of it would empty the
 * cache for nothing.
 *
 * A level that does not fit (found before its fetch, or, on a file system
 * that cannot reserve, when the disk filled up during it) is remembered, so
 * that its reads go straight to the head, it is said once, and the disk is
 * not tried on every read.  It is tried again once room may have come back:
 * a level left the cache (evicted, expired, removed) or a fetch was given up
 * since, or CACHE_NO_ROOM_RETRY_MS passed (room made outside the cache).
 * Remembering is cheap and bounded (CACHE_NO_ROOM_MAX levels, the oldest
 * going first); a level forgotten early is only tried, and said, again.
 */
#include "node/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define CACHE_ROOM_FS_SHARE 128 /* the file system's own blocks: 1/128 of the level */
#define CACHE_ROOM_FS_BLOCKS 16 /* and this many blocks more */

/* ---- measuring -------------------------------------------------------------- */

/* Bytes free to the agent on the disk of open file `fd`, -1 when it cannot
 * be told; *block (may be NULL): the file system's block size. */
static int64_t cache_room_free(int fd, int64_t *block) {
  struct statvfs vfs;
  if (fstatvfs(fd, &vfs) != 0)
    return -1;
  if (block)
    *block = (int64_t)vfs.f_bsize;
  return (int64_t)vfs.f_bavail * (int64_t)vfs.f_frsize;
}

int64_t cache_room_free_now(const cache_t *c) {
  int fd = open(c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int64_t free_bytes = fd >= 0 ? cache_room_free(fd, NULL) : -1;
  if (fd >= 0)
    close(fd);
  return free_bytes;
}

/* Bytes of the cached levels nobody is reading: what eviction could free. */
static int64_t cache_room_evictable(const cache_t *c) {
  int64_t bytes = 0;
  for (const cache_entry_t *e = c->lru_head; e; e = e->lru_next)
    if (e->readers == 0)
      bytes += e->size;
  return bytes;
}

/* Bytes the fetches in progress have still to write, on a file system that
 * did not reserve them: each one's size less the blocks its file has. */
static int64_t cache_room_unwritten(const cache_t *c) {
  int64_t bytes = 0;
  for (size_t b = 0; b < c->nbuckets; b++)
    for (const cache_entry_t *e = c->buckets[b]; e; e = e->hash_next) {
      struct stat st;
      if (e->state != CACHE_FETCHING || e->tmp_fd < 0 || fstat(e->tmp_fd, &st) != 0)
        continue;
      int64_t has = (int64_t)st.st_blocks * 512;
      bytes += e->size > has ? e->size - has : 0;
    }
  return bytes;
}

/* Evicts the least recently used level nobody is reading; false when none. */
static bool cache_room_evict_one(cache_t *c) {
  cache_entry_t *e = c->lru_tail;
  while (e && e->readers > 0)
    e = e->lru_prev;
  if (e == NULL)
    return false;
  CACHE_COUNT(c, evictions, 1);
  cache_drop(c, e);
  return true;
}

/* ---- making room ------------------------------------------------------------ */

/* Fills `err` with why a level of `size` bytes has no room: `need` bytes on
 * a disk with `free_bytes` free, `evictable` more in levels nobody reads. */
static int cache_room_short(const cache_t *c, int64_t size, int64_t need, int64_t free_bytes,
                            int64_t evictable, const char *more, char *err, size_t err_size) {
  char needs[200] = "";
  if (need != size)
    snprintf(needs, sizeof needs,
             "%lld for the level, the rest for the file system's own blocks (it cannot "
             "reserve them before the fetch); ",
             (long long)size);
  snprintf(err, err_size,
           "no room for %lld bytes in %s (%sits disk has %lld bytes free%s, and the cached "
           "levels nobody is reading hold %lld bytes more)",
           (long long)need, c->dir, needs, (long long)free_bytes, more, (long long)evictable);
  return CACHE_NO_ROOM;
}

/* cache_room_make on a file system that cannot reserve blocks: the disk's
 * free bytes, less what the fetches in progress will write, must hold the
 * level and the file system's blocks for it. */
static int cache_room_measure(cache_t *c, int fd, int64_t size, char *err, size_t err_size) {
  int64_t unwritten = cache_room_unwritten(c), block = 0;
  for (;;) {
    int64_t free_bytes = cache_room_free(fd, &block);
    if (free_bytes < 0)
      return 0; /* cannot be told: the fetch finds out */
    int64_t need = size + size / CACHE_ROOM_FS_SHARE + CACHE_ROOM_FS_BLOCKS * block;
    int64_t evictable = cache_room_evictable(c);
    if (free_bytes - unwritten >= need)
      return 0;
    if (free_bytes - unwritten + evictable < need || !cache_room_evict_one(c)) {
      char more[120] = "";
      if (unwritten > 0)
        snprintf(more, sizeof more, ", %lld of them to be written by fetches in progress",
                 (long long)unwritten);
      return cache_room_short(c, size, need, free_bytes, evictable, more, err, err_size);
    }
  }
}

int cache_room_make(cache_t *c, int fd, int64_t size, char *err, size_t err_size) {
  while (size > 0 && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)size) != 0) {
    int failure = errno;
    if (failure == EINTR)
      continue;
    if (failure == EOPNOTSUPP || failure == ENOSYS)
      return cache_room_measure(c, fd, size, err, err_size);
    if (failure != ENOSPC && failure != EDQUOT) {
      snprintf(err, err_size, "cannot reserve %lld bytes in %s: %s", (long long)size, c->dir,
               strerror(failure));
      return -1;
    }
    /* A quota is not in the free bytes: evicting may help whatever they say. */
    int64_t free_bytes = cache_room_free(fd, NULL), evictable = cache_room_evictable(c);
    bool hopeless = failure == ENOSPC && free_bytes >= 0 && free_bytes + evictable < size;
    if (hopeless || !cache_room_evict_one(c))
      return cache_room_short(c, size, size, free_bytes, evictable,
                              failure == EDQUOT ? ", but the disk quota is exceeded" : "", err,
                              err_size);
  }
  return 0;
}

/* ---- levels that did not fit ------------------------------------------------ */

static int64_t cache_room_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The remembered level (scope, name, level), or NULL. */
static cache_no_room_t *cache_room_find(cache_t *c, const char *scope, const char *name,
                                        int64_t level) {
  for (size_t i = 0; i < CACHE_NO_ROOM_MAX; i++) {
    cache_no_room_t *m = &c->no_room[i];
    if (m->level == level && strcmp(m->name, name) == 0 && strcmp(m->scope, scope) == 0)
      return m;
  }
  return NULL;
}

bool cache_room_refused(cache_t *c, const char *scope, const char *name, int64_t level,
                        bool *part_way) {
  const cache_no_room_t *m = cache_room_find(c, scope, name, level);
  if (part_way)
    *part_way = m && m->part_way;
  return m && m->room_freed == c->room_freed &&
         cache_room_now_ms() - m->noted_ms < CACHE_NO_ROOM_RETRY_MS;
}

/* A slot for a level to remember: a free one, else the oldest noted. */
static cache_no_room_t *cache_room_slot(cache_t *c) {
  cache_no_room_t *oldest = &c->no_room[0];
  for (size_t i = 0; i < CACHE_NO_ROOM_MAX; i++) {
    if (c->no_room[i].level == 0)
      return &c->no_room[i];
    if (c->no_room[i].noted_ms < oldest->noted_ms)
      oldest = &c->no_room[i];
  }
  return oldest;
}

bool cache_room_note(cache_t *c, const char *scope, const char *name, int64_t level,
                     bool part_way) {
  cache_no_room_t *m = cache_room_find(c, scope, name, level);
  bool first = m == NULL;
  if (first) {
    m = cache_room_slot(c);
    memset(m, 0, sizeof *m);
    snprintf(m->scope, sizeof m->scope, "%s", scope);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->level = level;
  }
  m->noted_ms = cache_room_now_ms();
  m->room_freed = c->room_freed;
  m->part_way = m->part_way || part_way;
  c->room_short = 1;
  return first;
}

bool cache_room_forget(cache_t *c, const char *scope, const char *name, int64_t level) {
  cache_no_room_t *m = cache_room_find(c, scope, name, level);
  if (m)
    memset(m, 0, sizeof *m);
  return m != NULL;
}
