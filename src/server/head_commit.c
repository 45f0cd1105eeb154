/*
 * head_commit.c — the head's group commit and durable replies: one commit
 * per loop turn, and with --sync full the WAL flushes (on the loop, or on the
 * helper thread of syncer.c, with a second flush queued behind), the replies
 * each flush releases, and the leases that need none.
 */
#include "head_commit.h"
#include "core/knob.h"
#include "backup.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "routes_pool.h"
#include "server.h"
#include "session.h"
#include "store.h"
#include "syncer.h"
#include "waiter.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void head_on_tx(void *arg) {
  head_t *h = arg;
  h->tx_started_us = metrics_now_us();
  event_active(h->commit_ev, EV_TIMEOUT, 0);
}

void head_wake_commit(head_t *h) {
  if (h->commit_ev)
    event_active(h->commit_ev, EV_TIMEOUT, 0); /* once per turn however often */
}

void head_on_ready(void *arg, const char *queue) {
  waiter_mark_ready(arg, queue);
}

void head_on_session(void *arg, const char *session) {
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
 * (head_lease_on_disk), bringing no broadcast updates (those are data).  A power loss can then
 * forget only the lease, which returns its task to the queue as an expiry would; nothing a client
 * was told is lost.  Such replies go out at their commit (as beanstalkd's reserve is not logged),
 * and a group of nothing else is not flushed at all: its writes reach the disk with the next flush,
 * which every later reply that could see them waits for (flushed_changes stays behind).
 * --sync-leases turns this off.
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
  long long v = 0;
  bool valid = knob_int(text, lo, hi, &v);
  if (text && !valid)
    log_msg(LOG_WARN, "%s=%s is not %lld to %lld; the default %lld is kept", name, text, lo, hi,
            fallback);
  *cache = valid ? v : fallback;
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

/* At least two clients but fewer than head_lend_few_below are active. */
static bool head_few_active(const head_t *h) {
  size_t active = h1_server_active(h->http);
  return active >= 2 && active < head_lend_few_below();
}

/* With a few clients (head_lend_few_below), a group with writes that comes in
 * while a flush runs commits at once and its flush is queued behind the one
 * in flight (head_commit_behind), unless MUSTER_FLUSH_QUEUE says otherwise:
 * 0 never, 2 whatever the number of clients. */
#define HEAD_FLUSH_QUEUE 1

static long long head_flush_queue_mode(void) {
  static long long mode = -1;
  return head_env_knob(&mode, "MUSTER_FLUSH_QUEUE", 0, 2, HEAD_FLUSH_QUEUE);
}

static bool head_flush_queue(const head_t *h) {
  long long m = head_flush_queue_mode();
  return m == 2 || (m == 1 && head_few_active(h));
}

static size_t head_thread_flush_min(void) {
  static long long min = -1;
  return (size_t)head_env_knob(&min, "MUSTER_FLUSH_THREAD_MIN", 1, 1000000, HEAD_THREAD_FLUSH_MIN);
}

bool head_lease_on_disk(const head_t *h, int64_t max_task) {
  if (h->syncer == NULL || h->cfg.sync_leases || max_task <= 0)
    return false;
  /* A new task's id is above every id in the table, so the tasks not on disk
   * yet are exactly those from the lowest id inserted since a flush began. */
  int64_t low = store_new_tasks(h->st);
  if (h->unflushed_tasks < low)
    low = h->unflushed_tasks;
  /* The flushes outstanding may have ended on their thread, which has sent
   * their replies already (their clients may be asking for the next task). */
  unsigned flushed = syncer_flushed(h->syncer);
  if (flushed < 1 && h->flushing_tasks < low)
    low = h->flushing_tasks;
  if (flushed < 2 && h->queued_flush && h->queued_tasks < low)
    low = h->queued_tasks;
  int64_t floor = flushed >= 2   ? h->queued_token_floor
                  : flushed == 1 ? h->flushing_token_floor
                                 : h->durable_token_floor;
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
  head_send_flushed(h, group, lent, &f);
  /* What was committed during the failed flush would be covered only by a
   * later one, whose success would prove nothing: it fails with the group
   * (the flush queued behind fails on its thread too). */
  http_flush_list(h, &h->committed, &f);
  http_flush_list(h, &h->queued, &f);
  if (h->sync_failed)
    return; /* said and done at the first failure */
  log_msg(LOG_ERROR, "%s; stopping: acknowledged writes could not be made durable", f.message);
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

/* The flush queued behind the one that just ended is the one in flight
 * now: its thread took it at that end. */
static void head_flush_next(head_t *h) {
  h->syncing = h->queued;
  h->queued = (reply_list_t){NULL, NULL};
  h->syncing_lent = false;
  h->flushing_tasks = h->queued_tasks;
  h->flushing_token_floor = h->queued_token_floor;
  h->queued_tasks = INT64_MAX;
  h->queued_flush = false;
  /* Its flush began when the thread took it, before the loop heard of the
   * one before (or it is about to begin: still untaken). */
  int64_t taken = h->syncer ? syncer_taken_us(h->syncer) : 0; /* none: stopping */
  h->flush_started_us = taken > 0 ? taken : metrics_now_us();
}

bool head_flush_stalled(const head_t *h) {
  return h->syncer != NULL && syncer_busy(h->syncer) &&
         metrics_now_us() - h->flush_started_us > (int64_t)HEAD_STALL_MS * 1000;
}

/*
 * A flush that the disk held for more than HEAD_STALL_MS ended (a network
 * disk's hiccup).  The loop read and executed requests meanwhile, but none
 * waiting for a flush was answered: a node or worker that registered then
 * has its registration committed and does not know it, and cannot beat.  As
 * after a stall of the loop (head.c, head_note_stall), the sweep ended
 * nobody for silence while it lasted (head_flush_stalled), and every
 * timeout counts from its end; task leases keep their deadlines.
 */
static void head_note_flush_stall(head_t *h, int64_t held_us) {
  store_note_stall(h->st, now_ms());
  log_msg(LOG_WARN,
          "the disk held a flush of the write-ahead log for %.1f s (a slow or stalled disk, or "
          "the network under it): no reply could leave meanwhile, so workers, nodes and "
          "sessions get their whole timeout from now before they count as gone, as after a "
          "restart",
          (double)held_us / 1e6);
}

/* The helper thread's flush ended (on the loop thread). */
static void head_synced(void *arg, int err) {
  head_t *h = arg;
  int64_t took_us = metrics_now_us() - h->flush_started_us;
  metrics_flush(true, err == 0, took_us);
  if (err == 0 && took_us > (int64_t)HEAD_STALL_MS * 1000)
    head_note_flush_stall(h, took_us);
  bool lent;
  reply_list_t group = head_take_syncing(h, &lent);
  head_flushed(h, &group, lent, err);
  size_t answered = h->answered_in_flush;
  h->answered_in_flush = 0;
  bool queued = h->queued_flush;
  if (queued)
    head_flush_next(h);
  if (!store_in_tx(h->st) && h->committed.head == NULL)
    return;
  if (queued) {
    head_commit(-1, 0, h); /* what came meanwhile goes behind the queued one */
    return;
  }
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

/* Holds a committed group for the flush queued behind the one in flight:
 * requests that flush, or joins it while its thread has not taken it (the
 * commit, made before, is then covered by its fdatasync).  False when it
 * began already: the group waits in `committed` for the flush after. */
static bool head_queue_flush(head_t *h, reply_list_t *group, int64_t changes) {
  bool join = h->queued_flush;
  if (join && !syncer_waiting(h->syncer))
    return false;
  http_list_concat(&h->queued, group);
  if (!join || h->unflushed_tasks < h->queued_tasks)
    h->queued_tasks = h->unflushed_tasks;
  h->unflushed_tasks = INT64_MAX;
  h->queued_token_floor = store_token_floor(h->st);
  h->flushed_changes = changes;
  if (!join) {
    h->queued_flush = true;
    syncer_request(h->syncer, NULL, NULL);
  }
  return true;
}

/* A flush queued behind (few clients, head_flush_queue): a group with
 * writes that comes in while a flush runs commits at once, and its flush is
 * queued behind, for the thread to start the moment the one in flight ends.
 * Otherwise that fdatasync would wait for the loop to hear of the first
 * one's end, commit and wake the thread: two cross-CPU wake-ups and a commit
 * between two flushes, half of a flush cycle with a few clients (docs/
 * performance.md, "Twelfth round").  Its replies are written by the loop when
 * it hears of its end.  False when the group is left to the ordinary path:
 * more clients, or the flush in flight not begun yet, or two outstanding
 * already and the second begun. */
static bool head_commit_behind(head_t *h) {
  if (!head_flush_queue(h))
    return false;
  if (h->queued_flush ? !syncer_waiting(h->syncer) : syncer_waiting(h->syncer))
    return false;
  reply_list_t group = h->committed;
  h->committed = (reply_list_t){NULL, NULL};
  if (head_commit_group(h, &group)) {
    h->answered_in_flush += head_send_unflushed(h, &group);
    int64_t changes = store_changes(h->st);
    /* Reads that saw nothing newer wait for the flushes outstanding. */
    if (group.head == NULL ||
        (changes != h->flushed_changes && head_queue_flush(h, &group, changes)))
      return true;
  }
  http_list_concat(&h->committed, &group);
  return true;
}

/* The turn's commit while a flush runs.  The transaction gathers the
 * requests that arrive, to commit when the flush ends (head_synced), unless
 * the group's flush is queued behind (head_commit_behind) or the turn
 * granted a lease that may go out at its commit (head_lease_on_disk): it
 * commits now, the lease is answered, and the rest of the group waits in
 * `committed` for the next flush. */
static void head_commit_in_flush(head_t *h) {
  if (head_commit_behind(h) || !http_pending_unflushed(h))
    return;
  reply_list_t group = {NULL, NULL};
  if (head_commit_group(h, &group)) {
    h->answered_in_flush += head_send_unflushed(h, &group);
    http_list_concat(&h->committed, &group);
  }
}

/* Flushes a committed group with writes: on the helper thread, or on the
 * loop for a small group of a lone client (head_thread_flush_min). */
static void head_flush_group(head_t *h, reply_list_t *group) {
  head_flush_begin(h);
  size_t active = h1_server_active(h->http);
  bool few = head_few_active(h);
  if (few || http_list_length(group) >= head_thread_flush_min() ||
      (metrics_now_us() - h->tx_started_us >= head_thread_flush_us() && active >= 2)) {
    /* Large replies, and every group of a few clients, are built now and
     * written by the thread when the flush ends: the loop spends no time
     * writing them (head_lend_min_bytes, head_lend_few_below). */
    h->syncing = *group;
    *group = (reply_list_t){NULL, NULL};
    h->syncing_lent = few || http_list_bytes(&h->syncing) >= head_lend_min_bytes();
    h->lend = h->syncing_lent ? http_lend_list(h, &h->syncing) : NULL;
    h->flush_started_us = metrics_now_us();
    syncer_request(h->syncer, h->lend ? head_write_lent : NULL, h->lend);
    return;
  }
  head_flushed(h, group, false, head_flush_here(h));
}

/* Runs after every other event of the turn that opened the transaction:
 * serve woken waiters, commit once, then release the replies: at once with
 * --sync normal, once the WAL is flushed with --sync full (while a flush
 * runs: head_commit_in_flush).  A worker that completes a task and leases the
 * next in two requests gets its lease during a flush, and its next request
 * can join the group that flush's end commits instead of the one after. */
static void head_commit_turn(head_t *h) {
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
  if (h->syncer != NULL && syncer_busy(h->syncer)) {
    head_commit_in_flush(h);
    return;
  }
  reply_list_t group = h->committed;
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
  head_flush_group(h, &group);
}

void head_commit(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  head_commit_turn(h);
  /* Between two transactions: the next pages of a backup under way (with
   * the group's flush, when it went to the helper thread). */
  backup_pump(h);
}

/* Stops the flush thread (shutdown): commits what is open, flushes on the
 * loop thread, sends every held reply, and leaves later commits to SQLite's
 * own flush (synchronous=FULL). */
void head_drain_syncs(head_t *h) {
  if (h->syncer == NULL)
    return;
  int results[2];
  unsigned count = syncer_stop(h->syncer, results); /* the flushes in flight finish first */
  h->syncer = NULL;
  bool lent;
  reply_list_t group = head_take_syncing(h, &lent);
  /* The group of a flush in flight is answered by that flush's result: a
   * later flush through the same descriptor would not report its error.
   * The queued one's is the newer result: it may have failed where the one
   * before it made its group durable (and after a failure the thread
   * answers it with that failure, without flushing). */
  if (group.head)
    head_flushed(h, &group, lent, results[0]);
  if (h->queued_flush) {
    head_flush_next(h);
    group = head_take_syncing(h, &lent);
    head_flushed(h, &group, false, results[count > 1 ? 1 : 0]);
  }
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

/* For tests only: MUSTER_TEST_FLUSH_HOLD_FILE=PATH (absolute) holds each flush
 * of the helper thread, before its fdatasync, while PATH exists, as a disk
 * that stalls would (syncer_hold_while): a test holds exactly the flush that
 * covers a registration, for as long as it chooses (design-notes, "A flush
 * the disk holds is a stall").  Flushes on the loop are not held (those stall
 * the loop: head_note_stall); MUSTER_FLUSH_THREAD_MIN=1 sends every group to
 * the thread.  Read once, here; unset, it costs a test of one pointer per flush. */
static void head_flush_hold_knob(head_t *h) {
  const char *path = getenv("MUSTER_TEST_FLUSH_HOLD_FILE");
  if (path == NULL || path[0] == '\0')
    return;
  if (path[0] != '/') {
    log_msg(LOG_WARN,
            "MUSTER_TEST_FLUSH_HOLD_FILE=%.200s is not an absolute path; no flush is held", path);
    return;
  }
  syncer_hold_while(h->syncer, path);
  log_msg(LOG_WARN,
          "MUSTER_TEST_FLUSH_HOLD_FILE=%s: each flush of the write-ahead log on the helper thread "
          "waits while that file exists (for tests only)",
          path);
}

/* With --sync full, the store commits without flushing and a helper thread
 * flushes the WAL (syncer.h); falls back to SQLite's own synchronous=FULL
 * when the WAL file or the thread cannot be had. */
void head_start_syncer(head_t *h, const char *db_path) {
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
  } else {
    /* The flush policy's knobs, read now so that a bad one is said at start. */
    head_thread_flush_us();
    head_lend_min_bytes();
    head_gather_min_active();
    head_lend_few_below();
    head_thread_flush_min();
    head_flush_queue_mode();
    head_flush_hold_knob(h);
  }
  /* What opening the store wrote (migrations, setup) and the directory
   * entries of its files must be durable before the first reply. */
  if (h->wal_fd >= 0)
    fdatasync(h->wal_fd);
  h->flushed_changes = store_changes(h->st);
  h->unflushed_tasks = h->flushing_tasks = h->queued_tasks = INT64_MAX;
  h->durable_token_floor = h->flushing_token_floor = store_token_floor(h->st);
  int dir = open(h->cfg.data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
}
