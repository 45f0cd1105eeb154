/*
 * cache_fetch.c — the node cache's fetches from the head (docs/shared-data.md
 * "Node cache"): one thread per level being fetched, the clients waiting for
 * it, and the replies that stream the level to them while it arrives.
 *
 * A fetch runs on a thread of its own with libmuster's streaming download
 * (muster_shared_get_fd: libcurl reads large pieces, writes them to the
 * entry's temporary file and checks the xxHash64 against the ETag as they
 * pass), so the event loop keeps serving hits meanwhile.  The thread touches
 * only its cfetch_t and its file and tells the loop through the cache's
 * notify pipe: more bytes are in the file, or (its last message) it ended;
 * the loop joins it, stores or drops the level (cache.c) and answers the
 * waiters.  A fetch whose temporary file was removed before it could be
 * stored (DIR/@tmp deleted under it) starts again once, into a new file, for
 * the same waiters.
 *
 * Stop: every fetch still running is told to end (no message from it any
 * more, its writes made to fail, its download cancelled: shared_cancel.h),
 * then joined, all within CFETCH_STOP_JOIN_MS; a thread that outlives that
 * is left to free its own state when it ends, which is all it touches.
 */
#include "client/shared_cancel.h"
#include "node/cache_http_internal.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define CACHE_FETCH_STALL_MS 60000  /* a fetch that moves no byte this long gives up */
#define CACHE_STREAM_STEP (1 << 20) /* a fetch tells the loop of new bytes every this many */
#define CFETCH_STOP_JOIN_MS 1000    /* the stop waits this long for the fetches it ended */

/* One fetch from the head in progress (cache_entry_t.fetch), the loop's but
 * for the fields its thread reads and writes (marked).  The thread never
 * looks at the agent or the cache: what it needs is copied here, so a thread
 * the stop could not join in time touches nothing that is freed. */
typedef struct {
  node_agent_t *a;
  cache_entry_t *entry;
  creq_t *waiters; /* clients answered when it ends */
  pthread_t thread;
  int restarted; /* it started again once (its temporary file vanished) */
  bool hold_back; /* its readers get the level once verified, not as it arrives: it ran
                   * out of room part way before (cache_room.c), and a reply not
                   * started can still be served from the head if it does again */
  /* the thread's, read-only for it: what to fetch, from where, to where */
  char scope[CACHE_NAME_MAX + 1], name[CACHE_NAME_MAX + 1];
  int64_t level;
  int64_t size; /* the level's, as the head announced it */
  char *head_url;
  char *token;             /* the first waiter's bearer token (NULL: none) */
  int fd;                  /* its own descriptor of the entry's temporary file (the stop
                            * turns it into /dev/null's, read-only, so a write fails) */
  int notify_fd;           /* the cache's notify pipe: written under `lock`, never once
                            * `cancelled` */
  shared_cancel_t *cancel; /* ends its download from the loop */
  /* set by the thread */
  _Atomic int64_t written;  /* bytes in the file so far */
  atomic_bool wake_pending; /* a progress message is in the pipe (cleared by the loop) */
  int64_t notified;         /* the thread's own: `written` when it last told the loop */
  muster_err_t err;
  muster_shared_info_t info;
  char why[600];
  /* shared, under `lock` */
  pthread_mutex_t lock;
  bool ended;     /* the thread is done (its last message sent unless `cancelled`) */
  bool cancelled; /* the stop: the thread sends no message any more */
  bool abandoned; /* the stop gave up waiting: the thread frees the fetch when it ends */
} cfetch_t;

/* ---- streaming a level while it arrives ------------------------------------------- */

/*
 * A client that reads a level's bytes while its fetch runs does not wait for
 * the end: once the first bytes are in the temporary file its reply starts
 * (200 with the level's Content-Length) and each piece the fetch thread
 * reports is queued for the socket from the file (sendfile, as a hit), so the
 * first reader of a cold level gets it about as fast as the head sends it.
 * The last byte is held back until the whole level matched its size and
 * checksum: a client never gets a complete body that was not verified.  A
 * fetch that fails after the reply started ends it short and closes the
 * connection, which every HTTP client reports as an error (curl: "transfer
 * closed with N bytes remaining"); one that fails before, as before, answers
 * 503.  Workers asking for the file's path still wait for the verified file.
 */

/* Queues bytes [from, to) of the streaming waiter's file; -1 when it could
 * not (out of descriptors or memory, or the client went away). */
static int creq_stream_piece(creq_t *r, int64_t from, int64_t to) {
  int fd = fcntl(r->stream_fd, F_DUPFD_CLOEXEC, 0); /* each piece owns a descriptor */
  if (fd < 0)
    return -1;
  return h1_respond_data_file(r->in, fd, from, to - from) ? 0 : -1; /* sendfile, as a hit */
}

/* Sends streaming waiter `r` its level's bytes below `upto` (at most its
 * size), starting its reply first when it has not started and there is a
 * byte to send.  A client that went away while it waited is left to the
 * fetch's end (its request is held until answered). */
static void creq_stream(creq_t *r, cache_entry_t *e, int64_t upto) {
  if (upto > r->size)
    upto = r->size;
  if (r->stream_fd < 0) {
    if (upto <= 0 || h1_gone(r->in))
      return;
    if ((r->stream_fd = open(e->tmp_path, O_RDONLY | O_CLOEXEC)) < 0)
      return; /* answered from the finished file instead */
    creq_add_headers(r, "miss");
    h1_respond_start(r->in, 200, "application/octet-stream", r->size);
  }
  if (upto > r->sent && !r->stream_broken) {
    if (creq_stream_piece(r, r->sent, upto) == 0)
      r->sent = upto;
    else
      r->stream_broken = 1;
  }
}

/* Ends streaming waiter `r` and frees it: with the rest of its bytes when
 * the fetch was verified (`e`, READY: counted as read until the reply is
 * done, so that the level is not evicted under it), else (NULL) short,
 * closing the connection. */
static void creq_stream_end(creq_t *r, cache_entry_t *e) {
  cache_t *c = r->a->cache;
  int ok = e != NULL;
  if (ok && !r->stream_broken) {
    creader_add(r, e);
    if (r->sent < r->size && creq_stream_piece(r, r->sent, r->size) != 0)
      ok = 0;
    else
      CACHE_COUNT(c, bytes_served, r->size);
  }
  if (!ok || r->stream_broken)
    h1_respond_abort(r->in);
  else
    h1_respond_end(r->in);
  close(r->stream_fd);
  creq_free(r);
}

/* A waiter of a fetch that failed (`why`), streaming or not. */
static void creq_fetch_failed(creq_t *r, const char *why) {
  if (r->stream_fd >= 0)
    creq_stream_end(r, NULL);
  else
    creq_error(r, 503, "unavailable", "node agent %s: %s", r->a->name, why);
}

/* ---- fetching a level from the head -------------------------------------------- */

/* Frees fetch `f` (its thread joined, or ending: cfetch_main). */
static void cfetch_free(cfetch_t *f) {
  if (f->fd >= 0)
    close(f->fd);
  shared_cancel_free(f->cancel);
  pthread_mutex_destroy(&f->lock);
  free(f->head_url);
  free(f->token);
  free(f);
}

/* What a fetch thread tells the loop through the cache's notify pipe: more
 * bytes arrived, or (the last message about a fetch) it ended. */
typedef struct {
  cfetch_t *fetch;
  int done;
} cfetch_msg_t;

/* Sends the loop a message about `f` (f->lock held), unless the stop
 * cancelled it: the pipe may be closed then, its number reused. */
static void cfetch_tell(cfetch_t *f, int done) {
  cfetch_msg_t m = {.fetch = f, .done = done};
  if (f->cancelled)
    return;
  if (write(f->notify_fd, &m, sizeof m) != (ssize_t)sizeof m)
    abort(); /* a pipe write this small is atomic; failing means the agent is broken */
}

/* libmuster's progress callback, on the fetch thread: publishes how much of
 * the file is written (its offset: the download writes it in order from 0)
 * and tells the loop at the first bytes and then every CACHE_STREAM_STEP,
 * one message at a time. */
static void cfetch_progress(void *user, int64_t done, int64_t total) {
  cfetch_t *f = user;
  (void)done; /* what arrived, some of it perhaps not written yet */
  (void)total;
  off_t at = lseek(f->fd, 0, SEEK_CUR);
  if (at <= 0)
    return;
  atomic_store_explicit(&f->written, (int64_t)at, memory_order_release);
  if ((f->notified > 0 && at - f->notified < CACHE_STREAM_STEP) ||
      atomic_exchange(&f->wake_pending, true))
    return;
  f->notified = at;
  pthread_mutex_lock(&f->lock);
  cfetch_tell(f, 0);
  pthread_mutex_unlock(&f->lock);
}

/* The download itself, on the fetch thread: f->err, f->info and f->why. */
static void cfetch_download(cfetch_t *f) {
  muster_client_t *client = NULL;
  f->err = muster_client_new(f->head_url, f->token, &client);
  if (f->err == MUSTER_OK) {
    muster_client_set_timeout(client, CACHE_FETCH_STALL_MS); /* a stalled transfer ends */
    muster_shared_opts_t opts;
    muster_shared_opts_init(&opts);
    opts.level = f->level;
    opts.progress = cfetch_progress;
    opts.user = f;
    f->err =
        shared_get_fd_cancellable(client, f->scope, f->name, f->fd, &opts, &f->info, f->cancel);
    if (f->err != MUSTER_OK)
      snprintf(f->why, sizeof f->why, "%s: %s", muster_err_name(f->err),
               muster_client_message(client));
  } else {
    snprintf(f->why, sizeof f->why, "%s", muster_err_name(f->err));
  }
  muster_client_free(client);
}

static void *cfetch_main(void *arg) {
  cfetch_t *f = arg;
  cfetch_download(f);
  pthread_mutex_lock(&f->lock);
  f->ended = true;
  cfetch_tell(f, 1);
  bool abandoned = f->abandoned;
  pthread_mutex_unlock(&f->lock);
  if (abandoned)
    cfetch_free(f); /* the stop gave up waiting for us and left it ours */
  return NULL;
}

/* Starts fetch `f`'s thread; 0 or an errno value. */
static int cfetch_spawn(cfetch_t *f) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old); /* signals are the loop's */
  int rc = pthread_create(&f->thread, NULL, cfetch_main, f);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

/* ---- a full disk ----------------------------------------------------------------- */

/* The system's reason when fetch `f` failed for want of room on the cache's
 * disk (ENOSPC, EDQUOT), else 0: its download could not write the file
 * (libmuster's MUSTER_IO, "cannot write the blob: REASON"; every other
 * failure of a download is the head's or the network's).  Only a file system
 * that cannot reserve a level's room before its fetch gets here, when the
 * disk filled up during it (cache_room.c): elsewhere a level that does not
 * fit is found before its fetch starts. */
static int cfetch_no_room(const cfetch_t *f) {
  if (f->err != MUSTER_IO)
    return 0;
  return strstr(f->why, strerror(ENOSPC)) ? ENOSPC : strstr(f->why, strerror(EDQUOT)) ? EDQUOT : 0;
}

/* A level was stored after one could not start (c->cannot_said) or did not
 * fit (c->room_short): said once, and both forgotten, so that the next
 * trouble is said at once. */
static void cfetch_storing_again(node_agent_t *a) {
  cache_t *c = a->cache;
  agent_log(a, "cache: storing levels in %s again", c->dir);
  c->cannot_said[0] = '\0';
  c->room_short = 0;
}

/* Reader `r` gets its level from the head, uncached (forwarded, counted);
 * a worker asking for the cached file's path is told to read the bytes
 * instead (`reason`).  Frees `r`. */
static void creq_uncached(creq_t *r, const char *reason) {
  if (r->kind != CREQ_BYTES) {
    creq_send_uncached(r, reason);
    return;
  }
  node_agent_t *a = r->a;
  CACHE_COUNT(a->cache, uncached, 1);
  h1_req_t *in = r->in;
  creq_free(r);
  /* Said as hit and miss are, so that a client can tell that this node's
   * cache did not keep the level (its statistics count it as "uncached"). */
  h1_add_header(in, "X-Muster-Cache", "uncached");
  fwd_forward(a, in);
}

/* The disk filled up part way through fetch `f` (`reason`, an errno value):
 * the level is remembered as not fitting (said once), its waiters whose
 * reply had not started get it from the head, the others are cut short. */
static void cfetch_out_of_room(cfetch_t *f, int reason) {
  node_agent_t *a = f->a;
  cache_t *c = a->cache;
  if (cache_room_note(c, f->scope, f->name, f->level, true))
    agent_log(a,
              "cache: no room for %s/%s level %lld (%lld bytes) in %s: %s; the disk filled up "
              "part way through its fetch (this file system cannot reserve a level's room "
              "before one; %lld bytes are free now): its readers whose reply had started got "
              "it cut short, the others get it from the head, uncached, as do its further "
              "reads, not logged, until a level leaves the cache or %d s have passed; then it "
              "is fetched again, its readers waiting for the whole level",
              f->scope, f->name, (long long)f->level, (long long)f->size, c->dir, strerror(reason),
              (long long)cache_room_free_now(c), CACHE_NO_ROOM_RETRY_MS / 1000);
  char why[600];
  snprintf(why, sizeof why, "no room for %lld bytes in %s: %s", (long long)f->size, c->dir,
           strerror(reason));
  for (creq_t *r = f->waiters, *next; r; r = next) {
    next = r->next_waiter;
    if (r->stream_fd >= 0)
      creq_stream_end(r, NULL);
    else
      creq_uncached(r, why);
  }
  f->waiters = NULL;
}

/* ---- answering a fetch's waiters ------------------------------------------------ */

/* Fetch `f` failed (f->why), its entry gone: its waiters are answered, from
 * the head when the disk had no room for the level. */
static void cfetch_failed(cfetch_t *f) {
  node_agent_t *a = f->a;
  CACHE_COUNT(a->cache, fetch_failures, 1);
  int reason = cfetch_no_room(f);
  if (reason != 0) {
    cfetch_out_of_room(f, reason);
    return;
  }
  agent_log(a, "cache: fetching %s/%s level %lld: %s", f->scope, f->name, (long long)f->level,
            f->why);
  char why[800];
  snprintf(why, sizeof why, "fetching shared data '%s' level %lld from the head failed: %s",
           f->name, (long long)f->level, f->why);
  for (creq_t *r = f->waiters, *next; r; r = next) {
    next = r->next_waiter;
    creq_fetch_failed(r, why);
  }
  f->waiters = NULL;
}

/* Fetch `f` stored its level in READY entry `e`: said when the level had not
 * fit before, or when levels were not stored for a while. */
static void cfetch_stored(cfetch_t *f, cache_entry_t *e) {
  node_agent_t *a = f->a;
  cache_t *c = a->cache;
  if (cache_room_forget(c, f->scope, f->name, f->level))
    agent_log(a, "cache: %s/%s level %lld is cached now: the disk of %s had room for it", f->scope,
              f->name, (long long)f->level, c->dir);
  if (c->room_short || c->cannot_said[0])
    cfetch_storing_again(a);
  cache_recheck_older(c, e);
}

/* The waiters of fetch `f`, ended (`stored`: in READY entry f->entry; else
 * failed, f->why says why, its entry gone), are answered; `f` is freed. */
static void cfetch_answer(cfetch_t *f, bool stored) {
  cache_t *c = f->a->cache;
  cache_entry_t *e = stored ? f->entry : NULL;
  if (!stored) {
    cfetch_failed(f);
    cfetch_free(f);
    return;
  }
  cfetch_stored(f, e);
  cache_reader_begin(c, e); /* keeps the entry while the waiters are answered */
  for (creq_t *r = f->waiters, *next; r; r = next) {
    next = r->next_waiter;
    if (r->stream_fd >= 0)
      creq_stream_end(r, e);
    else if (creq_answer(r, e, "miss") != 0)
      creq_serve(r); /* the file went away already: start over */
  }
  cache_reader_end(c, e);
  cfetch_free(f);
}

/* The streaming waiters of fetch `f` go on from its new temporary file: the
 * bytes they were sent are the same there (the level's, checked against
 * the same checksum before the last byte goes). */
static void cfetch_restream(cfetch_t *f) {
  for (creq_t *r = f->waiters; r; r = r->next_waiter) {
    if (r->stream_fd < 0)
      continue;
    int fd = open(f->entry->tmp_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      r->stream_broken = 1; /* its reply is cut at the end */
      continue;
    }
    close(r->stream_fd);
    r->stream_fd = fd;
  }
}

/* Starts fetch `f` again (its thread joined) into a new temporary file,
 * because the first one was removed before it could be stored (f->why);
 * 0, or -1 with f->why saying why not (the entry is still the caller's). */
static int cfetch_restart(cfetch_t *f) {
  node_agent_t *a = f->a;
  cache_entry_t *e = f->entry;
  agent_log(a, "cache: fetching %s/%s level %lld: %s; fetching it again", f->scope, f->name,
            (long long)f->level, f->why);
  if (cache_fetch_renew(a->cache, e, f->why, sizeof f->why) != 0)
    return -1;
  int fd = fcntl(e->tmp_fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(f->why, sizeof f->why, "cannot fetch it again: %s", strerror(errno));
    return -1;
  }
  close(f->fd);
  f->fd = fd;
  f->restarted = 1;
  f->err = MUSTER_OK;
  memset(&f->info, 0, sizeof f->info);
  atomic_store(&f->written, 0);
  atomic_store(&f->wake_pending, false);
  f->notified = 0;
  f->ended = false; /* the thread is joined: nobody else looks */
  cfetch_restream(f);
  int rc = cfetch_spawn(f);
  if (rc != 0) {
    snprintf(f->why, sizeof f->why, "cannot start a fetch: %s", strerror(rc));
    return -1;
  }
  e->fetch = f;
  CACHE_COUNT(a->cache, upstream_fetches, 1);
  return 0;
}

/* Stores the level fetch `f` got (its thread joined) in its entry: true
 * when it did; false when the fetch failed (f->why), its entry dropped.
 * *again: it started over instead (cfetch_restart), still waited for. */
static bool cfetch_store(cfetch_t *f, bool *again) {
  cache_t *c = f->a->cache;
  cache_entry_t *e = f->entry;
  *again = false;
  e->fetch = NULL;
  if (f->err == MUSTER_OK && f->info.level != e->level) {
    snprintf(f->why, sizeof f->why, "the head sent level %lld", (long long)f->info.level);
  } else if (f->err == MUSTER_OK) {
    uint64_t got = strtoull(f->info.checksum, NULL, 16);
    int rc = cache_fetch_commit(c, e, f->info.size, got, f->why, sizeof f->why);
    if (rc != CACHE_COMMIT_VANISHED)
      return rc == 0; /* a failed commit dropped the entry */
    if (!f->restarted && !c->stopping && cfetch_restart(f) == 0) {
      *again = true;
      return false;
    }
  }
  cache_fetch_abort(c, e);
  return false;
}

/* The fetch `f` ended: store the level or drop it, answer the waiters. */
static void cfetch_finish(cfetch_t *f) {
  pthread_join(f->thread, NULL);
  bool again;
  bool stored = cfetch_store(f, &again);
  if (!again)
    cfetch_answer(f, stored);
}

/* More of fetch `f` is in its file: its streaming waiters get it, less the
 * last byte (creq_stream_end sends that once the level is verified). */
static void cfetch_progressed(cfetch_t *f) {
  atomic_store(&f->wake_pending, false); /* before reading `written`: no report is lost */
  int64_t written = atomic_load_explicit(&f->written, memory_order_acquire);
  for (creq_t *r = f->waiters; r && !f->hold_back; r = r->next_waiter)
    if (r->kind == CREQ_BYTES)
      creq_stream(r, f->entry, written - 1);
}

/* The notify pipe is readable: fetches that moved on or ended (messages come
 * whole, and a fetch's last is its end). */
void cfetch_on_notify(evutil_socket_t fd, short what, void *arg) {
  cfetch_msg_t m;
  while (read(fd, &m, sizeof m) == (ssize_t)sizeof m) {
    if (m.done)
      cfetch_finish(m.fetch);
    else
      cfetch_progressed(m.fetch);
  }
}

/* A fetch of the level `r` asks for into the cache entry `e`, with `r` as
 * its first waiter and its token as the fetch's, its thread not started;
 * NULL when no descriptor was left for it (errno). */
static cfetch_t *cfetch_new(creq_t *r, cache_entry_t *e) {
  cfetch_t *f = calloc(1, sizeof *f);
  shared_cancel_t *cancel = f ? shared_cancel_new() : NULL;
  char *head_url = cancel ? strdup(r->a->cfg->head_url) : NULL;
  if (head_url == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  *f = (cfetch_t){.a = r->a,
                  .entry = e,
                  .waiters = r,
                  .level = r->level,
                  .size = r->size,
                  .head_url = head_url,
                  .fd = fcntl(e->tmp_fd, F_DUPFD_CLOEXEC, 0),
                  .notify_fd = r->a->cache->notify_wr,
                  .cancel = cancel};
  snprintf(f->scope, sizeof f->scope, "%s", r->scope);
  snprintf(f->name, sizeof f->name, "%s", r->name);
  if (r->auth && strncasecmp(r->auth, "Bearer ", 7) == 0)
    f->token = strdup(r->auth + 7);
  atomic_init(&f->written, 0);
  atomic_init(&f->wake_pending, false);
  pthread_mutex_init(&f->lock, NULL);
  r->next_waiter = NULL;
  if (f->fd >= 0)
    return f;
  int failure = errno;
  cfetch_free(f);
  errno = failure;
  return NULL;
}

/* The cache cannot keep the level `r` asks for (a directory it cannot
 * write, another agent's lock: `err`).  A reader of its bytes still gets
 * them, from the head, uncached; a worker asking for a cached file's path is
 * told to read the bytes instead.  The reason is logged when it changes,
 * not once per read. */
static void cfetch_cannot(creq_t *r, const char *err) {
  node_agent_t *a = r->a;
  cache_t *c = a->cache;
  if (strcmp(c->cannot_said, err) != 0) {
    snprintf(c->cannot_said, sizeof c->cannot_said, "%s", err);
    agent_log(a,
              "cache: %s; %s/%s level %lld served from the head, uncached (so are further "
              "levels while this lasts: counted in GET /v1/node/cache \"uncached\", not logged)",
              err, r->scope, r->name, (long long)r->level);
  }
  creq_uncached(r, err);
}

/* The disk of the cache dir has no room for the level `r` asks for (`err`,
 * from cache_room_make): it is remembered, said once, and `r` served from
 * the head, uncached, as its further reads are until room may have come
 * back (cache_room.c). */
static void cfetch_no_room_before(creq_t *r, const char *err) {
  node_agent_t *a = r->a;
  if (cache_room_note(a->cache, r->scope, r->name, r->level, false))
    agent_log(a,
              "cache: %s: %s/%s level %lld is served from the head, uncached; so are its "
              "further reads, not logged, until a level leaves the cache or %d s have passed, "
              "when the cache tries it again",
              err, r->scope, r->name, (long long)r->level, CACHE_NO_ROOM_RETRY_MS / 1000);
  creq_uncached(r, err);
}

/* True when the disk had no room for the level `r` asks for lately
 * (cache_room_refused): `r` is served from the head, uncached.  *part_way:
 * it ran out of room during a fetch before. */
static bool cfetch_refused(creq_t *r, bool *part_way) {
  cache_t *c = r->a->cache;
  if (!cache_room_refused(c, r->scope, r->name, r->level, part_way))
    return false;
  char why[600];
  snprintf(why, sizeof why, "no room in %s for its %lld bytes (said in the agent's log)", c->dir,
           (long long)r->size);
  creq_uncached(r, why);
  return true;
}

/* Starts fetching the level `r` asks for, with `r` as its first waiter; a
 * level the disk had no room for lately is served from the head instead. */
void cfetch_start(creq_t *r) {
  node_agent_t *a = r->a;
  cache_t *c = a->cache;
  char err[512];
  bool part_way, no_room;
  if (c->stopping) {
    creq_stopping(r);
    return;
  }
  if (cfetch_refused(r, &part_way))
    return;
  cache_entry_t *e = cache_fetch_begin(c, r->scope, r->name, r->level, r->checksum, r->size,
                                       &no_room, err, sizeof err);
  if (e == NULL) {
    if (no_room)
      cfetch_no_room_before(r, err);
    else
      cfetch_cannot(r, err);
    return;
  }
  creq_note_expiry(r, e);
  /* Its room is made: it is stored unless the head fails (after a level
   * that did not fit, said once one is stored: the disk may yet fill up). */
  if (c->cannot_said[0] && !c->room_short)
    cfetch_storing_again(a);
  cfetch_t *f = cfetch_new(r, e);
  if (f)
    f->hold_back = part_way;
  int rc = f ? cfetch_spawn(f) : errno;
  if (rc != 0) {
    if (f)
      cfetch_free(f);
    cache_fetch_abort(c, e);
    creq_error(r, 503, "unavailable", "node agent %s: cannot start a fetch: %s", a->name,
               strerror(rc));
    return;
  }
  e->fetch = f;
  CACHE_COUNT(c, upstream_fetches, 1);
}

/* ---- joining and stopping --------------------------------------------------------- */

void cfetch_join(cache_entry_t *e, creq_t *r) {
  cfetch_t *f = e->fetch;
  r->next_waiter = f->waiters;
  f->waiters = r;
  if (r->kind == CREQ_BYTES && !f->hold_back)
    creq_stream(r, e, atomic_load_explicit(&f->written, memory_order_acquire) - 1);
}

/* Tells the thread of fetch `f` to end (the stop): it sends no message any
 * more, its next write to the file fails (its descriptor turned into
 * /dev/null's, read-only: `devnull`), and its download is cancelled, a
 * stalled one too.  False, with nothing done, when it ended already (its
 * last message waits in the pipe, unread). */
static bool cfetch_cancel(cfetch_t *f, int devnull) {
  pthread_mutex_lock(&f->lock);
  bool running = !f->ended;
  if (running) {
    f->cancelled = true;
    if (devnull >= 0)
      dup3(devnull, f->fd, O_CLOEXEC);
  }
  pthread_mutex_unlock(&f->lock);
  if (running)
    shared_cancel_fire(f->cancel);
  return running;
}

/* Leaves the thread of cancelled fetch `f`, not joined in time, to free `f`
 * when it ends; false when it ended meanwhile (it may be joined now). */
static bool cfetch_abandon(cfetch_t *f) {
  pthread_t thread = f->thread;
  pthread_mutex_lock(&f->lock);
  bool abandoned = !f->ended;
  f->abandoned = abandoned;
  pthread_mutex_unlock(&f->lock); /* from here `f` may be freed by its thread */
  if (abandoned)
    pthread_detach(thread);
  return abandoned;
}

/* The stop answers the waiters of cancelled fetch `f` and drops its entry. */
static void cfetch_drop_waiters(node_agent_t *a, cfetch_t *f) {
  for (creq_t *r = f->waiters, *next; r; r = next) {
    next = r->next_waiter;
    if (r->stream_fd >= 0)
      creq_stream_end(r, NULL);
    else
      creq_stopping(r);
  }
  f->waiters = NULL;
  f->entry->fetch = NULL;
  cache_fetch_abort(a->cache, f->entry);
}

/* Ends fetch `f` at the stop (cfetch_cancel done): joins its thread by
 * `deadline` (CLOCK_REALTIME), answers its waiters, frees it; a thread
 * still running then is left to free it (cfetch_abandon), which is said. */
static void cfetch_stop(node_agent_t *a, cfetch_t *f, const struct timespec *deadline) {
  if (!f->cancelled) {
    cfetch_finish(f); /* it ended before the stop: stored or dropped as usual */
    return;
  }
  bool joined = pthread_timedjoin_np(f->thread, NULL, deadline) == 0;
  cfetch_drop_waiters(a, f);
  char what[400];
  snprintf(what, sizeof what, "%s/%s level %lld", f->scope, f->name, (long long)f->level);
  if (!joined && cfetch_abandon(f)) {
    agent_log(a,
              "cache: the fetch of %s did not end within %d ms of the stop; leaving its thread "
              "to end alone (it touches only its own state, which it frees)",
              what, CFETCH_STOP_JOIN_MS);
    return;
  }
  if (!joined)
    pthread_join(f->thread, NULL);
  cfetch_free(f);
}

/* The fetches in progress in cache `c` (malloc'd, *n of them). */
static cfetch_t **cfetch_all(cache_t *c, size_t *n) {
  size_t count = 0, at = 0;
  for (size_t b = 0; b < c->nbuckets; b++)
    for (cache_entry_t *e = c->buckets[b]; e; e = e->hash_next)
      count += e->state == CACHE_FETCHING && e->fetch != NULL;
  cfetch_t **all = malloc((count ? count : 1) * sizeof *all);
  if (all == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  for (size_t b = 0; b < c->nbuckets; b++)
    for (cache_entry_t *e = c->buckets[b]; e; e = e->hash_next)
      if (e->state == CACHE_FETCHING && e->fetch != NULL)
        all[at++] = e->fetch;
  *n = count;
  return all;
}

void cfetch_stop_all(node_agent_t *a) {
  size_t n;
  cfetch_t **all = cfetch_all(a->cache, &n);
  int devnull = n ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  for (size_t i = 0; i < n; i++)
    cfetch_cancel(all[i], devnull);
  if (devnull >= 0)
    close(devnull);
  struct timespec deadline; /* one for all: the stop waits CFETCH_STOP_JOIN_MS at most */
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += CFETCH_STOP_JOIN_MS / 1000;
  deadline.tv_nsec += (CFETCH_STOP_JOIN_MS % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  for (size_t i = 0; i < n; i++)
    cfetch_stop(a, all[i], &deadline);
  free(all);
}
