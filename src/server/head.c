/*
 * head.c — `muster head`: options, data dir, the event loop, group commit,
 * the sweep timer and clean shutdown.
 *
 * The data dir holds muster.db (the store), token (the admin token, 0600),
 * url (where the head listens, written once it does) and head.lock (held
 * with flock for the head's life, so two heads never share one store).
 */
#include "head.h"
#include "compat.h"
#include "http.h"
#include "iter.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "node.h"
#include "routes_pool.h"
#include "server.h"
#include "session.h"
#include "shared.h"
#include "shared_upload.h"
#include "store.h"
#include "syncer.h"
#include "waiter.h"
#include "worker.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static volatile sig_atomic_t head_signalled;

/* Takes the data dir's lock; refuses when another head holds it. */
static int head_lock(const head_config_t *cfg) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/head.lock", cfg->data_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_msg(LOG_ERROR, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    log_msg(LOG_ERROR,
            "another head (pid %s) is using data dir %s; stop it or pick another "
            "--data-dir",
            pid[0] ? pid : "?", cfg->data_dir);
    close(fd);
    return -1;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
    log_msg(LOG_WARN, "cannot write pid to %s", path);
  return fd;
}

/* Writes `text` to DATA_DIR/name atomically (temp file + rename). */
static bool head_write_file(const head_config_t *cfg, const char *name, const char *text,
                            mode_t mode) {
  char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/%s", cfg->data_dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    return false;
  size_t len = strlen(text);
  bool ok = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
  close(fd);
  return ok && rename(tmp, path) == 0;
}

/* Loads DATA_DIR/token, or generates and saves a new random one. */
static bool head_token(head_config_t *cfg, bool *generated) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/token", cfg->data_dir);
  *generated = false;
  FILE *fp = fopen(path, "r");
  if (fp) {
    char line[1024], why[160];
    bool ok = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    line[ok ? strcspn(line, "\r\n") : 0] = '\0';
    if (head_token_problem(line, sizeof cfg->token - 1, why, sizeof why)) {
      log_msg(LOG_ERROR,
              "the token in %s %s: correct it, or remove the file and a new one is "
              "generated",
              path, why);
      return false;
    }
    memcpy(cfg->token, line, strlen(line) + 1); /* fits: checked above */
    return true;
  }
  unsigned char raw[24];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return false;
  for (size_t i = 0; i < sizeof raw; i++)
    snprintf(cfg->token + 2 * i, 3, "%02x", raw[i]);
  *generated = true;
  char line[sizeof cfg->token + 1];
  snprintf(line, sizeof line, "%s\n", cfg->token);
  if (head_write_file(cfg, "token", line, 0600))
    return true;
  log_msg(LOG_ERROR, "cannot create %s: %s", path, strerror(errno));
  return false;
}

/* ---- group commit ---- */

static void head_on_tx(void *arg) {
  head_t *h = arg;
  h->tx_started_us = metrics_now_us();
  event_active(h->commit_ev, EV_TIMEOUT, 0);
}

void head_wake_commit(head_t *h) {
  if (h->commit_ev)
    event_active(h->commit_ev, EV_TIMEOUT, 0); /* once per turn however often */
}

static void head_on_ready(void *arg, const char *queue) {
  waiter_mark_ready(arg, queue);
}

static void head_on_session(void *arg, const char *session) {
  results_waiters_mark(arg, session);
}

/* ---- durable replies ----
 *
 * With --sync full SQLite commits without flushing (synchronous=NORMAL) and
 * the head flushes the WAL itself, so that the loop can go on while the disk
 * works: a group's replies wait in `syncing` while a helper thread runs
 * fdatasync (syncer.h); the transaction stays open meanwhile, gathering every
 * request the loop reads, and the flush's end commits that group and starts
 * the next flush.  Under load one flush covers everything that arrived during
 * the previous one.  A small group is flushed on the loop itself: waking the
 * thread and then the loop again costs two cross-CPU wake-ups (tens of
 * microseconds each on a virtual machine), more than the little work the
 * loop could overlap with the flush; measured with bench/compare, groups of
 * four and more gain from the thread, smaller ones lose.
 * Replies (reads included) never leave before the state they saw is on disk.
 *
 * One kind of reply needs its commit but no flush of its own: a lease of tasks
 * that are already on disk, with a token below a floor that is on disk too
 * (head_lease_on_disk).  A power loss can then forget only the lease, which
 * returns its task to the queue as an expiry would; nothing a client was told
 * is lost.  Such replies go out at their commit (as beanstalkd's reserve is
 * not logged), and a group of nothing else is not flushed at all: its writes
 * reach the disk with the next flush, which every later reply that could see
 * them waits for (flushed_changes stays behind).  --sync-leases turns this off.
 */

/* The smallest group whose flush goes to the helper thread, unless the
 * environment's MUSTER_FLUSH_THREAD_MIN (1 to 1000000) says otherwise: a machine
 * whose CPUs wake faster may gain from handing smaller groups over. */
#define HEAD_THREAD_FLUSH_MIN 4

/* The same for a group that took this long to handle (from its transaction's
 * opening to its commit), whatever its size, when another client sent requests
 * in the last few milliseconds (h1_server_active):
 * the next group is then likely to cost as much, and is worth handling while
 * the flush runs (a lone client waits for the flush anyway, and the hand-off
 * only adds two wake-ups).  MUSTER_FLUSH_THREAD_US overrides. */
#define HEAD_THREAD_FLUSH_US 300

/* The environment's `name` as an integer from lo (0 or more) to hi, else
 * `fallback`; read once into *cache (-1 until then), as the flush policy asks
 * at every commit. */
static long long head_env_knob(long long *cache, const char *name, long long lo, long long hi,
                               long long fallback) {
  if (*cache >= 0)
    return *cache;
  const char *text = getenv(name);
  char *end = NULL;
  long long v = text ? strtoll(text, &end, 10) : 0;
  *cache = text && *text && *end == '\0' && v >= lo && v <= hi ? v : fallback;
  return *cache;
}

static int64_t head_thread_flush_us(void) {
  static long long min_us = -1;
  return head_env_knob(&min_us, "MUSTER_FLUSH_THREAD_US", 0, 1000000000LL, HEAD_THREAD_FLUSH_US);
}

/* The fewest bytes of reply bodies in a group for the flush thread to write
 * its replies (head_commit), unless MUSTER_LEND_MIN_BYTES (0 to 1000000000)
 * says otherwise.  Small replies are written by the loop when it hears of the
 * flush: the thread's writes delay that, and at 16 connections unbatched
 * lending every group cost 0.94-0.96x the tasks/s; from this size (a lease of
 * a few dozen tasks) the loop's time saved wins (design-notes "The flush
 * thread sends the replies"). */
#define HEAD_LEND_MIN_BYTES 4096

static size_t head_lend_min_bytes(void) {
  static long long min = -1;
  return (size_t)head_env_knob(&min, "MUSTER_LEND_MIN_BYTES", 0, 1000000000LL, HEAD_LEND_MIN_BYTES);
}

/* After a flush on the helper thread whose replies the loop writes (small
 * ones, not lent), during which leases were answered at their commit, the
 * next group commits one poll of the sockets later when at least this many
 * clients are active (h1_server_active), unless MUSTER_GATHER_MIN_ACTIVE (0 to
 * 1000000; 0: whatever their number) says otherwise: the poll takes in the requests of the
 * clients those leases went to, which otherwise wait for the flush after
 * (design-notes "The next group waits for one poll of the sockets").
 * Measured with bench/compare: 1.07-1.11x the tasks/s at 16 connections
 * unbatched; at 4 the extra poll costs what it gathers (0.96-0.98x), hence
 * the threshold. */
#define HEAD_GATHER_MIN_ACTIVE 8

static size_t head_gather_min_active(void) {
  static long long min = -1;
  return (size_t)head_env_knob(&min, "MUSTER_GATHER_MIN_ACTIVE", 0, 1000000,
                               HEAD_GATHER_MIN_ACTIVE);
}

/* While at least two clients but fewer than this many are active
 * (h1_server_active), every group with writes is flushed by the helper thread,
 * which also writes its replies (lent), unless MUSTER_LEND_FEW_BELOW (0 to
 * 1000000; 0 or 1: never) says otherwise.  A few clients make small groups:
 * flushed on the loop, they left it blocked in fdatasync and then waking each
 * client with its reply, while the other CPU idled and the other clients'
 * leases (answered at their commit) waited.  Handed over, the loop keeps
 * reading and answering during the flush.  With more clients the groups
 * are large, and the loop writing their replies (which the gathering poll
 * below relies on) does better: with this threshold at 8, eight connections
 * unbatched measured 0.91-0.95x.  bench/compare, medians of 5: 1.08-1.17x
 * tasks/s at 3 and 4 connections unbatched, 1.10-1.27x in batches of 64
 * at 2 to 4 (two connections unbatched: 0.90-1.18x over three runs)
 * (docs/performance.md, item 41; design-notes "A few clients' groups are
 * flushed and answered by the helper thread"). */
#define HEAD_LEND_FEW_BELOW 5

static size_t head_lend_few_below(void) {
  static long long below = -1;
  return (size_t)head_env_knob(&below, "MUSTER_LEND_FEW_BELOW", 0, 1000000, HEAD_LEND_FEW_BELOW);
}

static size_t head_thread_flush_min(void) {
  static long long min = -1;
  return (size_t)head_env_knob(&min, "MUSTER_FLUSH_THREAD_MIN", 1, 1000000, HEAD_THREAD_FLUSH_MIN);
}

static void head_commit(evutil_socket_t fd, short what, void *arg);

bool head_lease_on_disk(const head_t *h, int64_t max_task) {
  if (h->syncer == NULL || h->cfg.sync_leases || max_task <= 0)
    return false;
  /* A new task's id is above every id in the table, so the tasks not on disk
   * yet are exactly those from the lowest id inserted since a flush began. */
  int64_t low = store_new_tasks(h->st);
  if (h->unflushed_tasks < low)
    low = h->unflushed_tasks;
  /* The flush in flight may have ended on its thread, which has sent its
   * replies already (their clients may be asking for the next task). */
  bool flushed = syncer_flushed(h->syncer);
  if (!flushed && h->flushing_tasks < low)
    low = h->flushing_tasks;
  int64_t floor = flushed ? h->flushing_token_floor : h->durable_token_floor;
  return max_task < low && store_last_token(h->st) <= floor;
}

/* A flush begins: it covers every commit so far. */
static void head_flush_begin(head_t *h) {
  h->flushing_tasks = h->unflushed_tasks;
  h->unflushed_tasks = INT64_MAX;
  h->flushing_token_floor = store_token_floor(h->st);
}

/* The flush begun last ended; what it covered is on disk unless it failed. */
static void head_flush_end(head_t *h, int err) {
  if (err != 0)
    return; /* the head stops: nothing more is granted */
  h->flushing_tasks = INT64_MAX;
  h->durable_token_floor = h->flushing_token_floor;
}

/* Sends a flushed group's replies, or (`failed`) answers them 500; `lent`:
 * they are built already, and the flush thread wrote them if it succeeded. */
static void head_send_flushed(head_t *h, reply_list_t *group, bool lent, const fail_t *failed) {
  if (!lent) {
    http_flush_list(h, group, failed);
    return;
  }
  http_lend_finish(group, h->lend, failed);
  h->lend = NULL;
}

/* Sends a flushed group's replies; after a failed flush, answers them 500 and
 * stops the head: the file's state is unknown then (the kernel may have
 * dropped the dirty pages), and going on could acknowledge lost writes. */
static void head_flushed(head_t *h, reply_list_t *group, bool lent, int err) {
  head_flush_end(h, err);
  if (err == 0) {
    head_send_flushed(h, group, lent, NULL);
    return;
  }
  fail_t f;
  fail_set(&f, MUSTER_STORE, "store: flushing the write-ahead log failed: %s", strerror(err));
  log_msg(LOG_ERROR, "%s; stopping: acknowledged writes could not be made durable", f.message);
  head_send_flushed(h, group, lent, &f);
  /* What was committed during the failed flush would be covered only by a
   * later one, whose success would prove nothing: it fails with the group. */
  http_flush_list(h, &h->committed, &f);
  h->sync_failed = true;
  h->stopping = true; /* new requests get 503 */
  /* A few more turns write the 500 replies out before the loop ends. */
  struct timeval grace = {.tv_sec = 0, .tv_usec = 100 * 1000};
  event_base_loopexit(h->base, &grace);
}

/* Flushes the WAL on the loop thread; 0 or an errno. */
static int head_flush_here(head_t *h) {
  int64_t start_us = metrics_now_us();
  int err = fdatasync(h->wal_fd) == 0 ? 0 : errno;
  metrics_flush(false, err == 0, metrics_now_us() - start_us);
  return err;
}

/* On the helper thread, right after a flush that succeeded: the group's
 * replies go out from there (h1_lend_write). */
static void head_write_lent(void *lend) {
  h1_lend_write(lend);
}

/* Takes the group of the helper thread's flush, which just ended. */
static reply_list_t head_take_syncing(head_t *h, bool *lent) {
  reply_list_t group = h->syncing;
  h->syncing = (reply_list_t){NULL, NULL};
  *lent = h->syncing_lent;
  h->syncing_lent = false;
  return group;
}

/* The helper thread's flush ended (on the loop thread). */
static void head_synced(void *arg, int err) {
  head_t *h = arg;
  metrics_flush(true, err == 0, metrics_now_us() - h->flush_started_us);
  bool lent;
  reply_list_t group = head_take_syncing(h, &lent);
  head_flushed(h, &group, lent, err);
  size_t answered = h->answered_in_flush;
  h->answered_in_flush = 0;
  if (!store_in_tx(h->st) && h->committed.head == NULL)
    return;
  if (err == 0 && !lent && answered > 0 && h1_server_active(h->http) >= head_gather_min_active()) {
    /* A zero timeout runs after the reads the next poll finds. */
    struct timeval now = {0, 0};
    if (event_add(h->commit_ev, &now) == 0) {
      metrics_gathered_commit();
      return;
    }
  }
  head_commit(-1, 0, h);
}

/* Commits the open transaction (if any) and takes what it answers: the
 * replies committed during the last flush first, then the turn's.  False
 * when the commit failed: its replies were answered 500 then. */
static bool head_commit_group(head_t *h, reply_list_t *group) {
  fail_t f = {0};
  if (store_in_tx(h->st)) {
    if (store_commit(h->st, &f) != MUSTER_OK) {
      http_flush(h, &f);
      return false;
    }
    h->commits++;
    int64_t inserted = store_take_new_tasks(h->st);
    if (inserted < h->unflushed_tasks)
      h->unflushed_tasks = inserted;
  }
  reply_list_t pending = http_take_pending(h);
  http_list_concat(group, &pending);
  return true;
}

/* Sends the replies of `group` that need no flush (leases of tasks on disk);
 * returns how many. */
static size_t head_send_unflushed(head_t *h, reply_list_t *group) {
  reply_list_t leases = http_list_take_unflushed(group);
  size_t n = http_list_length(&leases);
  if (n > 0) {
    metrics_unflushed_replies(n);
    http_flush_list(h, &leases, NULL);
  }
  return n;
}

/* Runs after every other event of the turn that opened the transaction:
 * serve woken waiters, commit once, then release the replies: at once with
 * --sync normal, once the WAL is flushed with --sync full.
 *
 * While a flush runs, the transaction gathers the requests that arrive, to
 * commit when the flush ends; but when the turn granted a lease that may go
 * out at its commit (head_lease_on_disk), it commits now: the lease is
 * answered, and the rest of the group waits in `committed` for the next
 * flush.  A worker that completes a task and leases the next in two requests
 * then gets its lease during the flush, and its next request can join the
 * group that flush's end commits instead of the one after. */
static void head_commit(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  waiter_serve(h);
  results_waiters_serve(h);
  fail_t f = {0};
  if (h->sync_failed) {
    /* Nothing more is committed; store_close rolls the transaction back. */
    fail_set(&f, MUSTER_STORE,
             "store: the write-ahead log cannot be flushed; the head is stopping");
    http_flush(h, &f);
    return;
  }
  reply_list_t group = {NULL, NULL};
  if (h->syncer != NULL && syncer_busy(h->syncer)) {
    if (!http_pending_unflushed(h))
      return; /* head_synced commits the group gathered meanwhile */
    if (head_commit_group(h, &group)) {
      h->answered_in_flush += head_send_unflushed(h, &group);
      http_list_concat(&h->committed, &group);
    }
    return;
  }
  group = h->committed;
  h->committed = (reply_list_t){NULL, NULL};
  if (!head_commit_group(h, &group) && group.head == NULL)
    return;
  /* A group that changed nothing (reads) only saw what earlier flushes made
   * durable: its replies need no flush of their own. */
  int64_t changes = h->syncer ? store_changes(h->st) : 0;
  if (h->syncer == NULL || changes == h->flushed_changes) {
    http_flush_list(h, &group, NULL);
    return;
  }
  head_send_unflushed(h, &group);
  if (group.head == NULL)
    return; /* nothing waits: the next flush carries these writes */
  h->flushed_changes = changes;
  head_flush_begin(h);
  size_t active = h1_server_active(h->http);
  bool few = active >= 2 && active < head_lend_few_below();
  if (few || http_list_length(&group) >= head_thread_flush_min() ||
      (metrics_now_us() - h->tx_started_us >= head_thread_flush_us() && active >= 2)) {
    /* Large replies, and every group of a few clients, are built now and
     * written by the thread when the flush ends: the loop spends no time
     * writing them (head_lend_min_bytes, head_lend_few_below). */
    h->syncing = group;
    h->syncing_lent = few || http_list_bytes(&group) >= head_lend_min_bytes();
    h->lend = h->syncing_lent ? http_lend_list(h, &h->syncing) : NULL;
    h->flush_started_us = metrics_now_us();
    syncer_request(h->syncer, h->lend ? head_write_lent : NULL, h->lend);
    return;
  }
  head_flushed(h, &group, false, head_flush_here(h));
}

/* Stops the flush thread (shutdown): commits what is open, flushes on the
 * loop thread, sends every held reply, and leaves later commits to SQLite's
 * own flush (synchronous=FULL). */
static void head_drain_syncs(head_t *h) {
  if (h->syncer == NULL)
    return;
  int err = syncer_stop(h->syncer); /* a flush in flight finishes first */
  h->syncer = NULL;
  bool lent;
  reply_list_t group = head_take_syncing(h, &lent);
  /* The group of a flush in flight is answered by that flush's result: a
   * later flush through the same descriptor would not report its error. */
  if (group.head)
    head_flushed(h, &group, lent, err);
  http_list_concat(&group, &h->committed);
  fail_t f = {0};
  if (!h->sync_failed && store_in_tx(h->st)) {
    if (store_commit(h->st, &f) != MUSTER_OK) {
      http_flush(h, &f);
    } else {
      h->commits++;
      reply_list_t pending = http_take_pending(h);
      http_list_concat(&group, &pending);
    }
  }
  head_flushed(h, &group, false, head_flush_here(h));
  store_set_sync_full(h->st, true); /* outside a transaction */
}

/* With --sync full, the store commits without flushing and a helper thread
 * flushes the WAL (syncer.h); falls back to SQLite's own synchronous=FULL
 * when the WAL file or the thread cannot be had. */
static void head_start_syncer(head_t *h, const char *db_path) {
  h->wal_fd = -1;
  if (!h->cfg.sync_full)
    return;
  char wal[PATH_MAX + 32];
  snprintf(wal, sizeof wal, "%s-wal", db_path);
  h->wal_fd = open(wal, O_RDONLY | O_CLOEXEC); /* fdatasync needs no write access */
  if (h->wal_fd >= 0)
    h->syncer = syncer_start(h->base, h->wal_fd, head_synced, h);
  if (h->syncer == NULL) {
    log_msg(LOG_WARN, "WAL flush thread unavailable; SQLite flushes at each commit instead");
    store_set_sync_full(h->st, true);
  }
  /* What opening the store wrote (migrations, setup) and the directory
   * entries of its files must be durable before the first reply. */
  if (h->wal_fd >= 0)
    fdatasync(h->wal_fd);
  h->flushed_changes = store_changes(h->st);
  h->unflushed_tasks = h->flushing_tasks = INT64_MAX;
  h->durable_token_floor = h->flushing_token_floor = store_token_floor(h->st);
  int dir = open(h->cfg.data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
}

static void head_sweep(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  fail_t f = {0};
  int64_t now = now_ms();
  waiter_mark_all(h);
  shared_files_sweep(h->st, h->cfg.data_dir);
  /* Most sweeps find nothing due: check with two indexed reads before
   * opening a transaction. */
  if (!lease_any_due(h->st, now) && !worker_any_due(h->st, now) && !iter_any_due(h->st, now) &&
      !node_any_due(h->st, now) && !session_any_due(h->st, now) && !shared_any_due(h->st, now)) {
    if (h->ndirty > 0 && !store_in_tx(h->st) && store_request_begin(h->st, &f) == MUSTER_OK)
      store_request_end(h->st, true); /* opens the turn so waiter_serve runs */
    return;
  }
  if (store_request_begin(h->st, &f))
    return;
  bool ok = lease_expire_due(h->st, now, 1000) >= 0 && worker_expire_due(h->st, now) >= 0 &&
            iter_expire_due(h->st, now) >= 0 && node_expire_due(h->st, now) >= 0 &&
            session_expire_due(h->st, now, results_waiters_busy, h) >= 0 &&
            shared_expire_due(h->st, now) >= 0;
  store_request_end(h->st, ok);
}

/* Stops the head: parked long-polls are answered, what is committed is
 * flushed, and the loop ends after a short grace. */
static void head_stop(head_t *h) {
  h->stopping = true;
  head_signalled = 1;
  waiter_release_all(h);
  results_waiters_release_all(h);
  shared_upload_abort_all(h);
  if (store_in_tx(h->st))
    head_commit(-1, 0, h);
  head_drain_syncs(h);
  /* The answers to parked long-polls are queued on their connections; a few
   * more turns of the loop write what the sockets did not take at once. */
  struct timeval grace = {.tv_sec = 0, .tv_usec = 100 * 1000};
  event_base_loopexit(h->base, &grace);
}

/* A stop signal.  With a local node agent alive the first two go to it (its
 * workers finish their running tasks, then stop them): the head serves their
 * last results and goodbyes, and stops once the agent has gone
 * (head_on_agent_exit).  A third signal, or one without an agent, stops the
 * head at once. */
static void head_on_signal(evutil_socket_t sig, short what, void *arg) {
  head_t *h = arg;
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (h->agent_pid > 0 && ++h->signals <= 2 && kill(h->agent_pid, (int)sig) == 0) {
    if (h->signals == 1)
      log_msg(LOG_INFO,
              "received %s; stopping the local node first: its workers finish their "
              "running tasks (signal again to stop them now)",
              name);
    else
      log_msg(LOG_INFO,
              "received %s again; the local node stops its workers now (signal a third "
              "time to stop the head at once)",
              name);
    return;
  }
  log_msg(LOG_INFO, "received %s; shutting down", name);
  head_stop(h);
}

/* The local node agent exited (its pipe's end of file): after a stop signal
 * the head follows it. */
static void head_on_agent_exit(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  char buf[64];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0 || (n < 0 && errno == EINTR))
    return;
  event_del(h->agent_ev);
  h->agent_pid = 0;
  if (h->signals > 0 && !h->stopping) {
    log_msg(LOG_INFO, "the local node stopped; shutting down");
    head_stop(h);
  }
}

/* The loop's base.  With epoll's change list, an event turned off and on
 * again within one loop turn costs no system call.  The HTTP server (h1.c)
 * keeps a connection's read event armed anyway and arms its write event only
 * when a socket is full, so this matters little now; it is kept for the
 * timers and the syncer's pipe.  (The change list is unsafe only with dup'ed
 * descriptors, which the head never registers.) */
static struct event_base *head_event_base(void) {
  struct event_config *cfg = event_config_new();
  if (cfg == NULL)
    return event_base_new();
  event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
  struct event_base *base = event_base_new_with_config(cfg);
  event_config_free(cfg);
  return base;
}

/* Prints `word` as one shell word: as it is when every character is safe,
 * else in single quotes (a quote inside becomes '\''). */
static void head_print_shell_word(const char *word) {
  if (word[0] && strspn(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                              "0123456789_./-:@%+=,") == strlen(word)) {
    fputs(word, stdout);
    return;
  }
  putchar('\'');
  for (const char *c = word; *c; c++)
    if (*c == '\'')
      fputs("'\\''", stdout);
    else
      putchar(*c);
  putchar('\'');
}

/*
 * Prints the banner's hint for the CLI, which reads the URL and token from
 * ./muster-data unless told another data dir: a head started with another
 * --data-dir names it, so the command works where the head was started (and
 * anywhere on this machine when the dir is absolute).
 */
static void head_print_cli_hint(const char *dir) {
  const char *plain = strncmp(dir, "./", 2) == 0 ? dir + 2 : dir;
  size_t len = strlen(plain);
  while (len > 1 && plain[len - 1] == '/')
    len--;
  if (len == strlen("muster-data") && strncmp(plain, "muster-data", len) == 0) {
    printf("  or:        muster status   (run here: it reads the URL and token in %s)\n", dir);
    return;
  }
  printf("  or:        muster status --data-dir ");
  head_print_shell_word(dir);
  printf("   (%sit reads the URL and token there)\n", dir[0] == '/' ? "" : "run here: ");
}

static void head_banner(const head_t *h, int port, bool generated) {
  const char *host = h->cfg.listen_host;
  bool v6 = strchr(host, ':') != NULL;
  char url[300];
  snprintf(url, sizeof url, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
  char line[320];
  snprintf(line, sizeof line, "%s\n", url);
  if (!head_write_file(&h->cfg, "url", line, 0644))
    log_msg(LOG_WARN, "cannot write %s/url", h->cfg.data_dir);
  printf("muster head %s listening on %s\n"
         "  data dir:  %s (SQLite, sync=%s)\n"
         "  token:     %s%s\n"
         "  try:       curl -H ",
         MUSTER_VERSION, url, h->cfg.data_dir, h->cfg.sync_full ? "full" : "normal", h->cfg.token,
         generated ? " (new; saved in the data dir's 'token' file)" : "");
  char header[sizeof h->cfg.token + 32];
  snprintf(header, sizeof header, "Authorization: Bearer %s", h->cfg.token);
  head_print_shell_word(header); /* a token may hold a quote */
  printf(" %s/v1/queues\n", url);
  head_print_cli_hint(h->cfg.data_dir);
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) {
    char name[256] = "HOST";
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
      snprintf(name, sizeof name, "HOST");
    printf("  others:    http://%s:%d (this machine's name or address; for --url and "
           "muster node --join)\n",
           name, port);
  }
  fflush(stdout);
}

/* Runs the head already listening on `port` until a signal stops it. */
static int head_run(head_t *h, bool generated, int port, const head_agent_t *agent) {
  if (agent != NULL && agent->pid > 0 && agent->exit_fd >= 0) {
    h->agent_ev = event_new(h->base, agent->exit_fd, EV_READ | EV_PERSIST, head_on_agent_exit, h);
    if (h->agent_ev != NULL && event_add(h->agent_ev, NULL) == 0)
      h->agent_pid = agent->pid;
  }
  struct event *sigint = evsignal_new(h->base, SIGINT, head_on_signal, h);
  struct event *sigterm = evsignal_new(h->base, SIGTERM, head_on_signal, h);
  h->commit_ev = event_new(h->base, -1, 0, head_commit, h);
  h->sweep_ev = event_new(h->base, -1, EV_PERSIST, head_sweep, h);
  struct timeval sweep = {.tv_sec = h->cfg.sweep_ms / 1000,
                          .tv_usec = (h->cfg.sweep_ms % 1000) * 1000};
  int status = 1;
  if (sigint && sigterm && h->commit_ev && h->sweep_ev && event_add(sigint, NULL) == 0 &&
      event_add(sigterm, NULL) == 0 && event_add(h->sweep_ev, &sweep) == 0) {
    head_banner(h, port, generated);
    log_msg(LOG_INFO, "listening on port %d", port);
    event_base_dispatch(h->base);
    status = 0;
  }
  if (store_in_tx(h->st))
    head_commit(-1, 0, h);
  head_drain_syncs(h);
  http_stop(h);
  if (h->sync_failed)
    status = 1;
  event_free(sigint);
  event_free(sigterm);
  if (h->agent_ev)
    event_free(h->agent_ev);
  event_free(h->commit_ev);
  event_free(h->sweep_ev);
  return status;
}

/* Locks the data dir and settles the token (--token, the token file, or a
 * new one: *generated).  The lock's fd, or -1 having said why. */
static int head_take_dir(head_config_t *cfg, const char *token_arg, bool *generated) {
  int lock = head_lock(cfg); /* says why when it fails */
  if (lock < 0)
    return -1; /* nothing of the data dir is touched: another head may be using it */
  if (token_arg) {
    /* Saved too, so that the CLI run next to the data dir finds it. */
    snprintf(cfg->token, sizeof cfg->token, "%s", token_arg);
    char line[sizeof cfg->token + 1];
    snprintf(line, sizeof line, "%s\n", token_arg);
    if (!head_write_file(cfg, "token", line, 0600))
      log_msg(LOG_WARN, "cannot write %s/token", cfg->data_dir);
  } else if (!head_token(cfg, generated)) { /* a bad token file said why */
    close(lock);
    return -1;
  }
  return lock;
}

/* Opens the store in the locked data dir and serves until stopped: the exit
 * status. */
static int head_serve(head_t *h, bool generated, int port, const head_agent_t *agent) {
  char db_path[PATH_MAX + 16];
  snprintf(db_path, sizeof db_path, "%s/muster.db", h->cfg.data_dir);
  fail_t f = {0};
  /* synchronous=NORMAL: with --sync full the WAL is flushed by the syncer. */
  h->st = store_open(&(store_opts_t){.path = db_path, .sync_full = false}, &f);
  if (h->st == NULL) {
    log_msg(LOG_ERROR, "cannot open the store %s: %s", db_path, fail_message(&f));
  } else if (compat_setup(h->st, &f) != MUSTER_OK) {
    log_msg(LOG_ERROR, "--distcompute: %s", fail_message(&f));
  } else if (shared_files_init(h->st, h->cfg.data_dir, &f) != MUSTER_OK) {
    log_msg(LOG_ERROR, "shared data: %s", fail_message(&f));
  } else {
    signal(SIGPIPE, SIG_IGN);
    store_set_hooks(h->st, head_on_tx, head_on_ready, h);
    store_set_session_hook(h->st, head_on_session);
    head_start_syncer(h, db_path);
    h->started_ms = now_ms();
    int status = head_run(h, generated, port, agent);
    if (status == 0)
      log_msg(LOG_INFO, "stopped cleanly after %llu requests and %llu commits",
              (unsigned long long)h->requests, (unsigned long long)h->commits);
    return status;
  }
  return 1;
}

/* What `muster head` runs with unless told otherwise (docs/cli.md). */
static const head_config_t head_defaults = {.listen_host = "127.0.0.1",
                                            .listen_port = 7370,
                                            .data_dir = "./muster-data",
                                            .sync_full = true,
                                            .worker_timeout_ms = WORKER_DEFAULT_TIMEOUT_MS,
                                            .node_timeout_ms = NODE_DEFAULT_TIMEOUT_MS,
                                            .max_wait_ms = 30000,
                                            .sweep_ms = 200,
                                            .max_body = 8u << 20,
                                            .max_payload = 1u << 20,
                                            .max_shared_ttl_ms = SHARED_DEFAULT_TTL_MS,
                                            .shared_keep_levels = SHARED_DEFAULT_KEEP_LEVELS,
                                            .max_blob_bytes = (size_t)SHARED_DEFAULT_MAX_BLOB};

int head_main(int argc, char **argv, const head_agent_t *agent) {
  head_t h = {.cfg = head_defaults, .wal_fd = -1};
  const char *token_arg = NULL;
  int status = head_parse(argc, argv, &h.cfg, &token_arg);
  if (status >= 0)
    return status;
  /* Listen first: a port in use fails before the data dir, a token and a
   * store are made.  Nothing is accepted before the event loop runs. */
  h.base = head_event_base();
  int port = h.base ? http_start(&h) : -1;
  if (port < 0 || (mkdir(h.cfg.data_dir, 0755) != 0 && errno != EEXIST)) {
    if (port >= 0)
      log_msg(LOG_ERROR, "cannot create data dir %s: %s", h.cfg.data_dir, strerror(errno));
    http_stop(&h);
    if (h.base)
      event_base_free(h.base);
    return 1;
  }
  bool generated = false;
  int lock = head_take_dir(&h.cfg, token_arg, &generated);
  status = lock >= 0 ? head_serve(&h, generated, port, agent) : 1;
  http_stop(&h); /* when head_run did not (a failure before it) */
  store_close(h.st);
  if (h.wal_fd >= 0)
    close(h.wal_fd);
  event_base_free(h.base);
  free(h.dirty);
  if (lock >= 0) { /* the url file is this head's only when it held the lock */
    char url_path[PATH_MAX + 16];
    snprintf(url_path, sizeof url_path, "%s/url", h.cfg.data_dir);
    unlink(url_path);
    close(lock);
  }
  return status;
}
