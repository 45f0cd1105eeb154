/*
 * cache.h — the node agent's shared-data cache (docs/api.md "Node cache",
 * docs/shared-data.md "Node cache"), private to src/node.
 *
 * Two halves.  cache.c is the store: an index of cached levels keyed by
 * (scope, name, level), one file per level under the cache directory, a
 * least-recently-used list, the size limit, checksum verification and the
 * statistics; it knows nothing of HTTP.  cache_http.c answers the agent's
 * GET /v1/shared/{scope}/{name} from the store, fetches misses from the head
 * (one upstream request per level however many clients wait for it) and
 * serves GET /v1/node/cache.  Both run on the agent's event-loop thread (a
 * fetch's bytes are written by a thread of its own, which touches nothing
 * here), so nothing here takes a lock.
 *
 * Files: DIR/SCOPE/NAME@LEVEL@CHECKSUM (the checksum as 16 hex digits), written
 * as DIR/@tmp/fetch-XXXXXX and renamed into place once complete and verified,
 * mode 0444.  DIR/@links/ holds directories the agent's workers hard-link the
 * levels they use into (same file system, no copy).  DIR/@agent.lock is
 * held by the one agent using the directory (cache_lock.c).  Names and scopes
 * are [A-Za-z0-9._-]{1,128}, so they need no escaping and '@' never occurs in
 * them: the cache's own names start with one, so that no scope shares them
 * (cache_dirs.c, which also says what becomes of an older agent's DIR/tmp and
 * DIR/links).
 */
#ifndef MUSTER_NODE_CACHE_H
#define MUSTER_NODE_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CACHE_NAME_MAX 128                              /* scope and name length limit */
#define CACHE_TMP_DIR "@tmp"     /* DIR/@tmp: fetches in progress, emptied at the start */
#define CACHE_LINKS_DIR "@links" /* DIR/@links: the workers' link directories, PID-XXXXXX */
#define CACHE_DEFAULT_BYTES (10LL * 1024 * 1024 * 1024) /* --cache-bytes default: 10 GiB */

typedef enum { CACHE_FETCHING, CACHE_READY } cache_state_t;

typedef struct cache_entry {
  char scope[CACHE_NAME_MAX + 1];
  char name[CACHE_NAME_MAX + 1];
  int64_t level;
  uint64_t checksum; /* xxHash64 of the bytes: the head's ETag */
  int64_t size;      /* bytes */
  cache_state_t state;
  int readers;  /* replies sending this file now: never evicted while > 0 */
  int doomed;   /* out of the index (evicted, stale or corrupt); freed when readers reach 0 */
  int verified; /* the file's checksum was checked since this agent started */
  ino_t ino;    /* the file as last verified: a change of these means it was written to */
  int64_t mtime_ns;
  /* Wall-clock ms (the head's clock: its X-Muster-Expires-Ms, as last heard)
   * from which cache_expire.c asks the head whether the level still exists,
   * so that an expired level's file goes then, not at eviction; 0: not known
   * (never asked).  Moved on when the head says the level lives. */
  int64_t expires_ms;
  struct cache_entry *hash_next;           /* index chain */
  struct cache_entry *lru_prev, *lru_next; /* READY entries, most recently used first */
  /* CACHE_FETCHING: the download in progress (written by a fetch thread) */
  int tmp_fd;
  char tmp_path[512];
  void *fetch; /* cache_http.c's state of the fetch (waiters, thread) */
} cache_entry_t;

typedef struct {
  int64_t hits;             /* GETs answered from a cached file */
  int64_t misses;           /* GETs that had to wait for a fetch from the head */
  int64_t coalesced;        /* of the misses, those that joined a fetch already running */
  int64_t bytes_served;     /* body bytes sent from cached files */
  int64_t evictions;        /* levels removed to stay under the size limit */
  int64_t upstream_fetches; /* GETs sent to the head */
  int64_t fetch_failures;   /* fetches that failed (network, status, size or checksum) */
  int64_t verify_failures;  /* cached files found corrupt by their checksum (then re-fetched) */
  int64_t uncached;         /* GETs the cache could not keep a level for (no room): forwarded */
  int64_t expired;          /* levels removed because the head no longer has them (expired,
                             * deleted), before eviction would have taken them */
  int64_t vanished;         /* levels forgotten because their files were gone from disk */
} cache_stats_t;

/* Adds `n` to a counter of c->stats.  The counters are written on the agent's
 * loop thread and read by its heartbeat thread, hence relaxed atomics. */
#define CACHE_COUNT(c, field, n) __atomic_fetch_add(&(c)->stats.field, (n), __ATOMIC_RELAXED)

/* A level the disk of the cache dir had no room for (cache_room.c). */
typedef struct {
  char scope[CACHE_NAME_MAX + 1];
  char name[CACHE_NAME_MAX + 1];
  int64_t level;      /* 0: a free slot */
  int64_t noted_ms;   /* when it was last refused (monotonic) */
  int64_t room_freed; /* cache_t.room_freed then */
  bool part_way;      /* it ran out of room during its fetch, not before */
} cache_no_room_t;

#define CACHE_NO_ROOM_MAX 32 /* levels remembered as too big for the disk */

typedef struct cache {
  char dir[400];
  char owner[130]; /* the node's name, written into the lock (cache_lock.c) */
  int lock_fd;     /* DIR/@agent.lock, held once the directory is used; -1 before */
  int64_t limit_bytes;
  int64_t bytes_cached;     /* sizes of the READY entries in the index */
  int64_t bytes_fetching;   /* sizes of the fetches in progress (room is made for them) */
  int64_t entries;          /* READY entries in the index */
  int stopping;             /* the agent is shutting down: no eviction, no new fetch */
  int64_t readers_total;    /* replies sending a cached file now, over all entries */
  int free_pending;         /* cache_free came while replies were still sending */
  int notify_rd, notify_wr; /* finished fetches (cache_http.c), -1 when none */
  struct event *notify_ev;
  int64_t missing_scan_ms; /* cache_make_room's last look for removed files (monotonic) */
  struct event *expire_ev; /* cache_expire.c: the timer that finds levels past their expiry */
  void *expire_check;      /* cache_expire.c: the one question to the head in flight, or NULL */
  cache_entry_t **buckets;
  size_t nbuckets;
  cache_entry_t *lru_head, *lru_tail;
  cache_stats_t stats;
  /* Why the last fetch could not start (a directory that cannot be written,
   * another agent's lock; a disk without room is cache_room.c's), logged
   * once: a broken cache dir would otherwise add a line per read.  Emptied,
   * with a line saying so, when a fetch starts again. */
  char cannot_said[512];
  /* Levels the disk of the cache dir had no room for (cache_room.c), whose
   * reads go to the head uncached until room may have come back. */
  cache_no_room_t no_room[CACHE_NO_ROOM_MAX];
  /* Levels that left the cache and fetches given up (cache_drop,
   * cache_fetch_abort): each may have given room back on the disk. */
  int64_t room_freed;
  /* A level was refused for want of room since one was last stored: the
   * next level stored is said ("storing levels in DIR again"). */
  int room_short;
} cache_t;

/* A copy of the counters, safe from any thread while the cache lives. */
void cache_stats_snapshot(const cache_t *c, cache_stats_t *out);

/*
 * Opens the cache at `dir` with `limit_bytes` for node `owner`.  The
 * directory is created on first use, not here; one that is there already is
 * claimed (cache_claim: another running agent's is refused; one where no lock
 * can be made is opened all the same, to serve uncached), then the levels
 * a previous agent left in it are taken over (verified by checksum on first
 * use) and stale temporary files removed.  Returns the cache (cache_free), or
 * NULL with `err` filled.
 */
cache_t *cache_open(const char *dir, int64_t limit_bytes, const char *owner, char *err,
                    size_t err_size);
/*
 * Makes sure this agent holds the directory's lock (cache_lock.c), creating
 * the directory (and taking the lock) when it is not there.  0; or, with
 * `err` filled, CACHE_CLAIM_BUSY (another running agent holds it: named, with
 * what to do) or -1 (the directory or its lock file cannot be made: a
 * read-only or full disk, whose reads are then served uncached).
 */
#define CACHE_CLAIM_BUSY (-2)
int cache_claim(cache_t *c, char *err, size_t err_size);
/* Lets the directory's lock go (the cache is being freed). */
void cache_unclaim(cache_t *c);
/* mkdir -p of DIR/`sub` (`sub` NULL: DIR itself); 0, or -1 with errno. */
int cache_make_dir(const cache_t *c, const char *sub);
/* Frees the cache and its entries (files stay on disk); accepts NULL.  While
 * replies still hold files (readers), what they use is freed by the last
 * cache_reader_end instead. */
void cache_free(cache_t *c);

/* The entry of (scope, name, level) in the index, READY or FETCHING, or NULL. */
cache_entry_t *cache_find(cache_t *c, const char *scope, const char *name, int64_t level);

/*
 * Adds a FETCHING entry and opens its temporary file, first evicting
 * least-recently-used levels (none being read) to make room for `size`
 * under the limit and on the disk (cache_room_make).  Returns the entry, or
 * NULL with `err` filled: *no_room true when the disk has no room for the
 * level (`err` says the sizes), false for any other reason (a directory that
 * cannot be written, another agent's lock).
 */
cache_entry_t *cache_fetch_begin(cache_t *c, const char *scope, const char *name, int64_t level,
                                 uint64_t checksum, int64_t size, bool *no_room, char *err,
                                 size_t err_size);
/* cache_fetch_commit's answer when the temporary file was removed before it
 * could be stored (DIR/@tmp deleted under the fetch, by a cleaner of temporary
 * files or a person): the bytes are in no file anyone can rename. */
#define CACHE_COMMIT_VANISHED 1

/*
 * Completes a fetch whose bytes were written to e->tmp_fd and found to be
 * `got_size` bytes with xxHash64 `got_checksum`: checks them against what the
 * head announced, renames the file into place and makes the entry READY (most
 * recently used).  Returns 0; or -1 with `err` filled, in which case the entry
 * is dropped (cache_fetch_abort was done); or CACHE_COMMIT_VANISHED with `err`
 * filled, the entry left FETCHING as it was, for the caller to fetch again
 * (cache_fetch_renew) or give up (cache_fetch_abort).
 */
int cache_fetch_commit(cache_t *c, cache_entry_t *e, int64_t got_size, uint64_t got_checksum,
                       char *err, size_t err_size);
/*
 * Gives FETCHING entry `e` a new, empty temporary file (e->tmp_fd and
 * e->tmp_path), DIR/@tmp made again when it is gone, for its fetch to start
 * over; the old file's descriptor is closed.  Returns 0, or -1 with `err`
 * filled (the entry is left without a file: cache_fetch_abort it).
 */
int cache_fetch_renew(cache_t *c, cache_entry_t *e, char *err, size_t err_size);
/* Gives a fetch up: removes the temporary file and drops the entry. */
void cache_fetch_abort(cache_t *c, cache_entry_t *e);

/*
 * Opens a READY entry's file for reading and marks it used.  When the file
 * changed since it was last verified (inode, size or modification time) or was
 * never verified by this agent, its checksum is checked first; a corrupt file
 * is counted, dropped and -1 returned (the caller fetches it again).  Returns
 * the descriptor (close-on-exec; the caller owns it) or -1.
 */
int cache_open_file(cache_t *c, cache_entry_t *e);
/* The path of a READY entry's file (static storage until the next call). */
const char *cache_file_path(const cache_t *c, const cache_entry_t *e);

/* A reply starts / finishes sending the entry's file (eviction waits for 0). */
void cache_reader_begin(cache_t *c, cache_entry_t *e);
void cache_reader_end(cache_t *c, cache_entry_t *e);

/* Removes an entry from the index and its file from disk (stale or corrupt). */
void cache_drop(cache_t *c, cache_entry_t *e);

/* Evicts least-recently-used levels not being read until the cached bytes plus
 * `extra` fit the limit (or nothing more can go).  Levels whose files are
 * gone (cache_forget_missing) are forgotten first, they hold no room; that
 * look costs a stat(2) per level, and a full cache (its usual state under
 * LRU) makes room at every miss, so it is taken at most every
 * CACHE_MISSING_SCAN_MS. */
void cache_make_room(cache_t *c, int64_t extra);

/*
 * Forgets the READY levels whose files are no longer on disk (removed behind
 * the agent's back: one file, a scope's directory, the whole cache dir), so
 * that bytes_cached and entries say what the directory holds and eviction
 * does not start early for bytes nobody stores; such a level is fetched
 * again when asked for.  One stat(2) per cached level.  Returns how many were
 * forgotten (counted in stats.vanished, and said on stderr).
 */
int64_t cache_forget_missing(cache_t *c);

/*
 * The head says (scope, name) level `level` does not exist (expired, deleted,
 * or re-created without it); level 0: no level of it exists.  Removes those
 * READY levels and their files, counted in stats.expired; a level being sent
 * keeps its open file until the reply ends.  Returns how many went.
 */
int64_t cache_drop_gone(cache_t *c, const char *scope, const char *name, int64_t level);

/*
 * Newer level `e` of its blob was just stored: the head, which keeps only its
 * newest levels, may have deleted the older ones we hold.  Makes those READY
 * levels due for the expiry check at once (expires_ms 1), so the head is
 * asked about each (cache_expire.c): gone, it goes; kept, its expiry is noted
 * again.  Returns how many were made due.
 */
int64_t cache_recheck_older(cache_t *c, const cache_entry_t *e);

/* A READY level whose expires_ms is due at wall-clock `now_ms` (the least
 * recently used first), or NULL. */
cache_entry_t *cache_next_due(cache_t *c, int64_t now_ms);

/* ---- cache_room.c ---- */

#define CACHE_NO_ROOM 1              /* cache_room_make's answer: the disk has no room */
#define CACHE_NO_ROOM_RETRY_MS 60000 /* a level refused for want of room is tried again */

/*
 * Makes room on the cache dir's disk for a level of `size` bytes whose
 * temporary file is `fd`, before its fetch: reserves its blocks (fallocate,
 * the file's size unchanged) or, on a file system that cannot, checks that
 * the disk has them free (its size, the file system's own blocks, and what
 * the fetches in progress have still to write).  While the disk is short,
 * cached levels nobody reads go, least recently used first, but only when
 * their bytes would make enough room: a level that cannot fit evicts
 * nothing.  Returns 0; CACHE_NO_ROOM with `err` saying the sizes ("no room
 * for N bytes in DIR (...)"); or -1 with `err` filled (another failure).
 */
int cache_room_make(cache_t *c, int fd, int64_t size, char *err, size_t err_size);

/* True when the level is remembered as too big for the disk and not due to
 * be tried again (a level left the cache since, or CACHE_NO_ROOM_RETRY_MS
 * passed): its reads go to the head uncached.  *part_way (may be NULL): it
 * ran out of room during a fetch; set whether or not it is due. */
bool cache_room_refused(cache_t *c, const char *scope, const char *name, int64_t level,
                        bool *part_way);
/* Remembers that the level did not fit (`part_way`: during its fetch); true
 * when it was not remembered already, for the caller to say it once.  The
 * oldest remembered level makes way when all CACHE_NO_ROOM_MAX are taken. */
bool cache_room_note(cache_t *c, const char *scope, const char *name, int64_t level, bool part_way);
/* Forgets the level (it was stored); true when it was remembered. */
bool cache_room_forget(cache_t *c, const char *scope, const char *name, int64_t level);
/* The bytes free on the cache dir's disk, or -1 when it cannot be told. */
int64_t cache_room_free_now(const cache_t *c);

/* ---- cache_dirs.c ---- */

/* Removes what worker process `pid` linked into DIR/@links (it has ended). */
void cache_forget_worker(cache_t *c, pid_t pid);

/* The directory workers link cached files into: DIR/@links (created). */
int cache_links_dir(cache_t *c, char *buf, size_t size);

/*
 * At the start: removes what a previous agent left in the cache's own
 * directories (DIR/@tmp emptied, the DIR/@links directories of workers no
 * longer running), and in an older agent's DIR/tmp and DIR/links (its fetch
 * files, its workers' directories), then takes over the cached levels of
 * every scope's directory (cache_adopt).  Follows no symbolic link in DIR.
 */
void cache_take_over(cache_t *c);

/* Adds DIR/`scope`/`file` (`size` bytes) as a READY level, verified on first
 * use, when `file` is a level's name (NAME@LEVEL@CHECKSUM); else nothing. */
void cache_adopt(cache_t *c, const char *scope, const char *file, int64_t size);

/* Non-zero when `s` is a valid scope or name: 1 to 128 of [A-Za-z0-9._-]. */
int cache_valid_name(const char *s, size_t len);

#endif /* MUSTER_NODE_CACHE_H */
