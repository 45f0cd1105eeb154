/*
 * cache.c — the node cache's store: index, files, LRU, size limit, checksums.
 *
 * Workload: few, large, immutable levels (model weights, tables) read by the
 * workers of one machine, often all at once when a level appears.  A level's
 * bytes never change once made, so a cached file is good until evicted; the
 * head stays the authority on whether a level still exists and who may read
 * it (cache_http.c asks it before every hit).  Everything runs on the agent's
 * event-loop thread.
 *
 * Integrity: a file is written to DIR/@tmp, checked against the size and the
 * xxHash64 the head announced, and only then renamed into place, so a reader
 * never sees a partial or unverified level, and a crash leaves only a stray
 * temporary file (removed at the next start).  Afterwards the file's inode,
 * size and modification time are remembered; when they differ at a hit
 * (something wrote to the file) or the file predates this agent, its checksum
 * is computed again before it is served, and a corrupt file is dropped and
 * fetched again.  Checking every hit would cost a full read of the level per
 * request, which is what the cache exists to avoid.
 *
 * Eviction: least recently used first, skipping levels being sent (their
 * readers count), so a reply never loses its file; the room is made when a
 * fetch starts, for its announced size.
 */
#include "node/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CACHE_MISSING_SCAN_MS 10000 /* cache_make_room looks for removed files this often */
#include <xxhash.h>

#define CACHE_BUCKETS 4096
#define CACHE_VERIFY_CHUNK (1 << 20) /* bytes read at a time when checking a file */

/* ---- the index ------------------------------------------------------------ */

static size_t cache_bucket(const cache_t *c, const char *scope, const char *name, int64_t level) {
  XXH64_hash_t h = XXH64(scope, strlen(scope), (XXH64_hash_t)level);
  h = XXH64(name, strlen(name), h);
  return (size_t)(h % c->nbuckets);
}

cache_entry_t *cache_find(cache_t *c, const char *scope, const char *name, int64_t level) {
  for (cache_entry_t *e = c->buckets[cache_bucket(c, scope, name, level)]; e; e = e->hash_next)
    if (e->level == level && strcmp(e->name, name) == 0 && strcmp(e->scope, scope) == 0)
      return e;
  return NULL;
}

static void cache_index_add(cache_t *c, cache_entry_t *e) {
  size_t b = cache_bucket(c, e->scope, e->name, e->level);
  e->hash_next = c->buckets[b];
  c->buckets[b] = e;
}

static void cache_index_remove(cache_t *c, cache_entry_t *e) {
  cache_entry_t **at = &c->buckets[cache_bucket(c, e->scope, e->name, e->level)];
  while (*at && *at != e)
    at = &(*at)->hash_next;
  if (*at)
    *at = e->hash_next;
  e->hash_next = NULL;
}

static void cache_lru_unlink(cache_t *c, cache_entry_t *e) {
  if (e->lru_prev)
    e->lru_prev->lru_next = e->lru_next;
  else if (c->lru_head == e)
    c->lru_head = e->lru_next;
  if (e->lru_next)
    e->lru_next->lru_prev = e->lru_prev;
  else if (c->lru_tail == e)
    c->lru_tail = e->lru_prev;
  e->lru_prev = e->lru_next = NULL;
}

static void cache_lru_push_front(cache_t *c, cache_entry_t *e) {
  e->lru_prev = NULL;
  e->lru_next = c->lru_head;
  if (c->lru_head)
    c->lru_head->lru_prev = e;
  c->lru_head = e;
  if (c->lru_tail == NULL)
    c->lru_tail = e;
}

static void cache_entry_free(cache_entry_t *e) {
  if (e->tmp_fd >= 0)
    close(e->tmp_fd);
  free(e);
}

static cache_entry_t *cache_entry_new(const char *scope, const char *name, int64_t level,
                                      uint64_t checksum, int64_t size) {
  cache_entry_t *e = calloc(1, sizeof *e);
  if (e == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  snprintf(e->scope, sizeof e->scope, "%s", scope);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->level = level;
  e->checksum = checksum;
  e->size = size;
  e->tmp_fd = -1;
  return e;
}

/* ---- paths ------------------------------------------------------------------ */

int cache_valid_name(const char *s, size_t len) {
  if (len == 0 || len > CACHE_NAME_MAX)
    return 0;
  for (size_t i = 0; i < len; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '.' || ch == '_' || ch == '-'))
      return 0;
  }
  return strcmp(s, ".") != 0 && strcmp(s, "..") != 0; /* a path component of its own */
}

static void cache_path_of(const cache_t *c, const cache_entry_t *e, char *buf, size_t size) {
  snprintf(buf, size, "%s/%s/%s@%lld@%016llx", c->dir, e->scope, e->name, (long long)e->level,
           (unsigned long long)e->checksum);
}

const char *cache_file_path(const cache_t *c, const cache_entry_t *e) {
  static char path[1024];
  cache_path_of(c, e, path, sizeof path);
  return path;
}

/* ---- verification --------------------------------------------------------- */

static int64_t cache_mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

/* Non-zero when the open file `fd` holds exactly e->size bytes hashing to e->checksum. */
static int cache_verify_fd(const cache_entry_t *e, int fd) {
  char *buf = malloc(CACHE_VERIFY_CHUNK);
  XXH64_state_t *state = XXH64_createState();
  int64_t done = 0;
  int ok = buf != NULL && state != NULL && XXH64_reset(state, 0) == XXH_OK;
  while (ok) {
    ssize_t n = pread(fd, buf, CACHE_VERIFY_CHUNK, (off_t)done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    XXH64_update(state, buf, (size_t)n);
    done += n;
  }
  ok = ok && done == e->size && XXH64_digest(state) == e->checksum;
  XXH64_freeState(state);
  free(buf);
  return ok;
}

static int64_t cache_forget_missing_after(cache_t *c, int64_t gone, int64_t bytes);

int cache_open_file(cache_t *c, cache_entry_t *e) {
  if (e->doomed)
    return -1; /* dropped while its fetch's waiters were being answered */
  char path[1024];
  cache_path_of(c, e, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    int missing = fd < 0 && (errno == ENOENT || errno == ENOTDIR);
    int64_t size = e->size;
    if (fd >= 0)
      close(fd);
    cache_drop(c, e); /* removed behind our back: fetch it again */
    if (missing)      /* the others of a directory removed with it are gone too */
      cache_forget_missing_after(c, 1, size);
    return -1;
  }
  int changed = st.st_ino != e->ino || st.st_size != e->size || cache_mtime_ns(&st) != e->mtime_ns;
  if (!e->verified || changed) {
    if (!cache_verify_fd(e, fd)) {
      fprintf(stderr,
              "muster node: cache: %s does not match its checksum %016llx; fetching it again\n",
              path, (unsigned long long)e->checksum);
      CACHE_COUNT(c, verify_failures, 1);
      close(fd);
      cache_drop(c, e);
      return -1;
    }
    e->verified = 1;
    e->ino = st.st_ino;
    e->mtime_ns = cache_mtime_ns(&st);
  }
  cache_lru_unlink(c, e);
  cache_lru_push_front(c, e);
  return fd;
}

/* ---- readers, dropping, eviction ----------------------------------------- */

void cache_reader_begin(cache_t *c, cache_entry_t *e) {
  e->readers++;
  c->readers_total++;
}

static void cache_release(cache_t *c) {
  cache_unclaim(c);
  if (c->notify_rd >= 0)
    close(c->notify_rd);
  if (c->notify_wr >= 0)
    close(c->notify_wr);
  free(c->buckets);
  free(c);
}

void cache_reader_end(cache_t *c, cache_entry_t *e) {
  c->readers_total--;
  if (--e->readers == 0 && e->doomed)
    cache_entry_free(e);
  else if (e->readers == 0 && !c->stopping)
    cache_make_room(c, 0); /* a level kept over the limit for its readers may go now */
  if (c->free_pending && c->readers_total == 0)
    cache_release(c);
}

void cache_drop(cache_t *c, cache_entry_t *e) {
  if (e->doomed)
    return;
  if (e->state == CACHE_READY) {
    char path[1024];
    cache_path_of(c, e, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
      fprintf(stderr, "muster node: cache: cannot remove %s: %s\n", path, strerror(errno));
    *strrchr(path, '/') = '\0';
    rmdir(path); /* the scope's directory, once empty (sessions come and go) */
    cache_lru_unlink(c, e);
    c->bytes_cached -= e->size;
    c->entries--;
    c->room_freed++;
  }
  cache_index_remove(c, e);
  e->doomed = 1;
  if (e->readers == 0 && e->state == CACHE_READY)
    cache_entry_free(e);
}

static int64_t cache_monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cache_make_room(cache_t *c, int64_t extra) {
  int64_t now = cache_monotonic_ms();
  if (c->bytes_cached + c->bytes_fetching + extra > c->limit_bytes &&
      (c->missing_scan_ms == 0 || now - c->missing_scan_ms >= CACHE_MISSING_SCAN_MS)) {
    c->missing_scan_ms = now;
    cache_forget_missing(c); /* a removed file's bytes must not push real levels out */
  }
  cache_entry_t *e = c->lru_tail;
  while (e && c->bytes_cached + c->bytes_fetching + extra > c->limit_bytes) {
    cache_entry_t *older = e->lru_prev;
    if (e->readers == 0) {
      CACHE_COUNT(c, evictions, 1);
      cache_drop(c, e);
    }
    e = older;
  }
}

/* cache_forget_missing, with `gone` levels of `bytes` found missing already
 * (dropped by the caller) counted and said with the rest. */
static int64_t cache_forget_missing_after(cache_t *c, int64_t gone, int64_t bytes) {
  for (cache_entry_t *e = c->lru_head, *next; e; e = next) {
    next = e->lru_next;
    char path[1024];
    struct stat st;
    cache_path_of(c, e, path, sizeof path);
    if (stat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR))
      continue; /* there, or a failure that says nothing of the file (EACCES, EIO) */
    gone++;
    bytes += e->size;
    cache_drop(c, e);
  }
  if (gone > 0) {
    CACHE_COUNT(c, vanished, gone);
    fprintf(stderr,
            "muster node: cache: %lld cached level%s (%lld bytes) no longer on disk in %s "
            "(removed while the agent ran); forgotten, fetched again when asked for\n",
            (long long)gone, gone == 1 ? "" : "s", (long long)bytes, c->dir);
  }
  return gone;
}

int64_t cache_forget_missing(cache_t *c) {
  return cache_forget_missing_after(c, 0, 0);
}

int64_t cache_drop_gone(cache_t *c, const char *scope, const char *name, int64_t level) {
  int64_t gone = 0;
  if (level > 0) {
    cache_entry_t *e = cache_find(c, scope, name, level);
    if (e && e->state == CACHE_READY) {
      cache_drop(c, e);
      gone = 1;
    }
  } else {
    for (cache_entry_t *e = c->lru_head, *next; e; e = next) {
      next = e->lru_next;
      if (strcmp(e->name, name) == 0 && strcmp(e->scope, scope) == 0) {
        cache_drop(c, e);
        gone++;
      }
    }
  }
  CACHE_COUNT(c, expired, gone);
  return gone;
}

int64_t cache_recheck_older(cache_t *c, const cache_entry_t *e) {
  int64_t due = 0;
  for (cache_entry_t *o = c->lru_head; o; o = o->lru_next)
    if (o->level < e->level && o->state == CACHE_READY && strcmp(o->name, e->name) == 0 &&
        strcmp(o->scope, e->scope) == 0) {
      o->expires_ms = 1; /* due now, whatever the head said of it before */
      due++;
    }
  return due;
}

cache_entry_t *cache_next_due(cache_t *c, int64_t now_ms) {
  for (cache_entry_t *e = c->lru_tail; e; e = e->lru_prev)
    if (e->expires_ms > 0 && e->expires_ms <= now_ms)
      return e;
  return NULL;
}

/* ---- fetching --------------------------------------------------------------- */

/* Opens a new temporary file for entry `e` in DIR/@tmp (e->tmp_fd and
 * e->tmp_path); 0, or -1 with `err` filled. */
static int cache_tmp_create(cache_t *c, cache_entry_t *e, char *err, size_t err_size) {
  snprintf(e->tmp_path, sizeof e->tmp_path, "%s/" CACHE_TMP_DIR "/fetch-XXXXXX", c->dir);
  e->tmp_fd = mkostemp(e->tmp_path, O_CLOEXEC);
  if (e->tmp_fd >= 0)
    return 0;
  snprintf(err, err_size, "cannot create a file in %s/" CACHE_TMP_DIR ": %s", c->dir,
           strerror(errno));
  e->tmp_path[0] = '\0';
  return -1;
}

/* Makes the room of entry `e`'s level for its new temporary file
 * (cache_room_make); 0, or CACHE_NO_ROOM or -1 with `err` filled and the
 * file gone. */
static int cache_tmp_reserve(cache_t *c, cache_entry_t *e, char *err, size_t err_size) {
  int rc = cache_room_make(c, e->tmp_fd, e->size, err, err_size);
  if (rc == 0)
    return 0;
  close(e->tmp_fd);
  e->tmp_fd = -1;
  unlink(e->tmp_path);
  e->tmp_path[0] = '\0';
  return rc;
}

cache_entry_t *cache_fetch_begin(cache_t *c, const char *scope, const char *name, int64_t level,
                                 uint64_t checksum, int64_t size, bool *no_room, char *err,
                                 size_t err_size) {
  *no_room = false;
  if (cache_claim(c, err, err_size) != 0)
    return NULL;
  const char *sub = cache_make_dir(c, CACHE_TMP_DIR) != 0 ? CACHE_TMP_DIR
                    : cache_make_dir(c, scope) != 0       ? scope
                                                          : NULL;
  if (sub) { /* name the directory that failed: the cache dir may well exist */
    snprintf(err, err_size, "cannot create the cache directory %s or %s/%s: %s", c->dir, c->dir,
             sub, strerror(errno));
    return NULL;
  }
  cache_entry_t *e = cache_entry_new(scope, name, level, checksum, size);
  if (cache_tmp_create(c, e, err, err_size) != 0) {
    cache_entry_free(e);
    return NULL;
  }
  cache_make_room(c, size);
  int rc = cache_tmp_reserve(c, e, err, err_size);
  if (rc != 0) {
    *no_room = rc == CACHE_NO_ROOM;
    cache_entry_free(e);
    return NULL;
  }
  e->state = CACHE_FETCHING;
  c->bytes_fetching += size;
  cache_index_add(c, e);
  return e;
}

int cache_fetch_renew(cache_t *c, cache_entry_t *e, char *err, size_t err_size) {
  if (e->tmp_fd >= 0)
    close(e->tmp_fd); /* its file is gone (CACHE_COMMIT_VANISHED): nothing to unlink */
  e->tmp_fd = -1;
  e->tmp_path[0] = '\0';
  if (cache_make_dir(c, CACHE_TMP_DIR) != 0) {
    snprintf(err, err_size, "cannot create the cache directory %s/" CACHE_TMP_DIR ": %s", c->dir,
             strerror(errno));
    return -1;
  }
  if (cache_tmp_create(c, e, err, err_size) != 0 || cache_tmp_reserve(c, e, err, err_size) != 0)
    return -1;
  return 0;
}

/* Takes a FETCHING entry out of the fetch accounting and its temp file away. */
static void cache_fetch_end(cache_t *c, cache_entry_t *e, int remove_tmp) {
  c->bytes_fetching -= e->size;
  if (e->tmp_fd >= 0)
    close(e->tmp_fd);
  e->tmp_fd = -1;
  if (remove_tmp && e->tmp_path[0])
    unlink(e->tmp_path);
  e->tmp_path[0] = '\0';
}

void cache_fetch_abort(cache_t *c, cache_entry_t *e) {
  c->room_freed++; /* its file's blocks, on a file system that reserved them */
  cache_fetch_end(c, e, 1);
  cache_index_remove(c, e);
  cache_entry_free(e);
}

/* Whether a fetch got what the head announced for entry `e`; 0, or -1 with
 * `err` filled. */
static int cache_fetch_check(const cache_entry_t *e, int64_t got_size, uint64_t got_checksum,
                             char *err, size_t err_size) {
  if (got_size != e->size) {
    snprintf(err, err_size, "got %lld bytes, the head announced %lld", (long long)got_size,
             (long long)e->size);
    return -1;
  }
  if (got_checksum != e->checksum) {
    snprintf(err, err_size, "checksum %016llx, expected %016llx", (unsigned long long)got_checksum,
             (unsigned long long)e->checksum);
    return -1;
  }
  return 0;
}

/* The verified file of FETCHING entry `e` (`st`) is in place: `e` is READY. */
static void cache_fetch_stored(cache_t *c, cache_entry_t *e, const struct stat *st) {
  cache_fetch_end(c, e, 0);
  e->state = CACHE_READY;
  e->verified = 1;
  e->ino = st->st_ino;
  e->mtime_ns = cache_mtime_ns(st);
  c->bytes_cached += e->size;
  c->entries++;
  cache_lru_push_front(c, e);
}

int cache_fetch_commit(cache_t *c, cache_entry_t *e, int64_t got_size, uint64_t got_checksum,
                       char *err, size_t err_size) {
  if (cache_fetch_check(e, got_size, got_checksum, err, err_size) != 0) {
    cache_fetch_abort(c, e);
    return -1;
  }
  char path[1024];
  cache_path_of(c, e, path, sizeof path);
  struct stat st;
  if (fchmod(e->tmp_fd, 0444) == 0 && cache_make_dir(c, e->scope) == 0 && /* see cache_drop */
      rename(e->tmp_path, path) == 0 && fstat(e->tmp_fd, &st) == 0) {
    cache_fetch_stored(c, e, &st);
    return 0;
  }
  int failure = errno;
  if (fstat(e->tmp_fd, &st) == 0 && st.st_nlink == 0) { /* no name left to rename */
    snprintf(err, err_size,
             "its temporary file %s was removed before it could be stored (was %s/" CACHE_TMP_DIR
             " deleted?)",
             e->tmp_path, c->dir);
    return CACHE_COMMIT_VANISHED;
  }
  snprintf(err, err_size, "storing %s: %s", path, strerror(failure));
  cache_fetch_abort(c, e);
  return -1;
}

/* ---- opening: take over what a previous agent left ----------------------- */

void cache_adopt(cache_t *c, const char *scope, const char *file, int64_t size) {
  char name[CACHE_NAME_MAX + 1];
  long long level = 0;
  unsigned long long checksum = 0;
  const char *at = strchr(file, '@');
  size_t len = at ? (size_t)(at - file) : 0;
  int used = 0;
  if (at == NULL || len > CACHE_NAME_MAX ||
      sscanf(at, "@%lld@%16llx%n", &level, &checksum, &used) != 2 || at[used] != '\0' ||
      level < 1 || strlen(at) != (size_t)used)
    return;
  memcpy(name, file, len);
  name[len] = '\0';
  if (!cache_valid_name(name, len) || cache_find(c, scope, name, level))
    return;
  cache_entry_t *e = cache_entry_new(scope, name, level, checksum, size);
  e->state = CACHE_READY; /* verified on first use */
  e->expires_ms = 1;      /* its expiry is not known: the head is asked soon (cache_expire.c) */
  cache_index_add(c, e);
  cache_lru_push_front(c, e);
  c->bytes_cached += size;
  c->entries++;
}

cache_t *cache_open(const char *dir, int64_t limit_bytes, const char *owner, char *err,
                    size_t err_size) {
  if (dir == NULL || dir[0] != '/' || strlen(dir) >= sizeof((cache_t *)0)->dir - 1) {
    snprintf(err, err_size, "--cache-dir '%s': need an absolute path of at most 398 characters",
             dir ? dir : "");
    return NULL;
  }
  cache_t *c = calloc(1, sizeof *c);
  if (c)
    c->buckets = calloc(CACHE_BUCKETS, sizeof *c->buckets);
  if (c == NULL || c->buckets == NULL) {
    free(c);
    snprintf(err, err_size, "out of memory");
    return NULL;
  }
  c->nbuckets = CACHE_BUCKETS;
  c->notify_rd = c->notify_wr = c->lock_fd = -1;
  snprintf(c->dir, sizeof c->dir, "%s", dir);
  snprintf(c->owner, sizeof c->owner, "%s", owner);
  size_t len = strlen(c->dir);
  while (len > 1 && c->dir[len - 1] == '/')
    c->dir[--len] = '\0';
  c->limit_bytes = limit_bytes > 0 ? limit_bytes : CACHE_DEFAULT_BYTES;
  struct stat st; /* a directory there already is claimed before it is scanned */
  if (stat(c->dir, &st) == 0 && cache_claim(c, err, err_size) == CACHE_CLAIM_BUSY) {
    cache_release(c);
    return NULL;
  }
  cache_take_over(c);
  cache_make_room(c, 0);
  return c;
}

void cache_free(cache_t *c) {
  if (c == NULL)
    return;
  c->stopping = 1;
  for (size_t b = 0; b < c->nbuckets; b++) {
    for (cache_entry_t *e = c->buckets[b], *next; e; e = next) {
      next = e->hash_next;
      if (e->state == CACHE_FETCHING)
        cache_fetch_end(c, e, 1);
      if (e->readers > 0)
        e->doomed = 1; /* its file stays; the last reader frees the entry */
      else
        cache_entry_free(e);
    }
    c->buckets[b] = NULL;
  }
  if (c->readers_total > 0)
    c->free_pending = 1;
  else
    cache_release(c);
}

void cache_stats_snapshot(const cache_t *c, cache_stats_t *out) {
  const int64_t *from = (const int64_t *)&c->stats;
  int64_t *to = (int64_t *)out;
  /* cache_stats_t is a run of int64_t counters; copy each atomically. */
  for (size_t i = 0; i < sizeof *out / sizeof(int64_t); i++)
    to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
}
