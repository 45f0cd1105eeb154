/*
 * reaper.c — the head's background removal of tasks, one chunk of at most
 * QUEUE_CHUNK tasks per loop turn, between the requests (queue_reap.c and
 * session_close.c have the SQL and say why).
 *
 * One timer does all of it, in this order of priority:
 *   1. the trash: tasks of deleted queues, a chunk every turn until none is
 *      left; the DELETE requests waiting for them are answered then.  The
 *      trash is in the store, so a head that stopped (or was killed) during
 *      a deletion finishes it after its restart;
 *   2. purges of more than a chunk, a chunk every turn, each answered when
 *      done.  A purge lives in memory: a stop leaves it partly done, every
 *      chunk committed and counted;
 *   2'. what sessions closed with more than a chunk of tasks left behind
 *      (session_close.c), a chunk every turn, nobody waiting: their close was
 *      answered already.  Recorded in the store like the trash, so a head
 *      killed meanwhile resumes it.  These three take turns, a chunk each:
 *      a small purge is not held up by the deletion of millions;
 *   3. the retention: passes over the queues that have a keep_done_ms (one
 *      pass per queue at most every keep_done_ms / 10, between 1 s and
 *      60 s), a chunk every turn while the head is idle, else one every
 *      REAPER_BUSY_MS (REAPER_BEHIND_MS while chunks come out full), so
 *      that it keeps up with a steady stream of completions without taking
 *      the loop from the requests.
 * Each chunk is a request of the turn's transaction (its savepoint), so it
 * commits with the turn's other requests and a failed one is rolled back
 * alone.
 *
 * Beside the tasks, once every tenth of the time they are kept (a minute),
 * it forgets the worker instances reported ended longer than
 * worker_ended_keep_ms() ago (worker_ended.c): a bounded table, so one
 * statement, and none at all when an indexed read finds nothing that old.
 * Once every sixtieth of the time they are kept (a minute), and at every
 * tick while chunks come out full, it deletes a chunk of the DistCompute
 * workers that went an hour ago without doing anything (compat_bounds.c).
 */
#include "reaper.h"
#include "compat_bounds.h"
#include "h1.h"
#include "log.h"
#include "queue.h"
#include "queue_reap.h"
#include "session.h"
#include "worker_ended.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REAPER_BUSY_MS 50   /* between retention chunks while clients are active */
#define REAPER_BEHIND_MS 10 /* the same when the last chunk was full: it falls behind */
#define REAPER_LIST_MS 1000 /* the queues with a retention are read this often */
#define REAPER_PASS_MIN_MS 1000
#define REAPER_PASS_MAX_MS 60000

/* A parked request: a deletion waiting for its trash, or a purge under way. */
typedef struct reaper_job {
  struct reaper_job *next;
  h1_req_t *req;
  bool purge;
  char queue[NAME_MAX_LEN + 1];
  int64_t horizon;  /* purge: the highest task id it deletes */
  int64_t count;    /* purge: tasks purged so far; deletion: the queue's tasks */
  int64_t sessions; /* deletion: sessions closed */
} reaper_job_t;

/* The retention of one queue and its pass. */
typedef struct {
  queue_retention_t queue;
  int64_t cursor;       /* the last task id the pass under way examined; 0: none under way */
  int64_t next_pass_ms; /* when the next pass may start */
} reaper_pass_t;

struct reaper {
  head_t *head;
  struct event *timer;
  reaper_job_t *jobs;    /* oldest first */
  reaper_pass_t *passes; /* ordered by queue name */
  size_t npasses;
  int64_t listed_ms;   /* when `passes` was read from the store; 0: never */
  int64_t last_reaped; /* tasks the last retention chunk removed */
  unsigned turn;       /* which of reaper_chunks goes first this turn */
  bool hold_sessions;  /* MUSTER_TEST_HOLD_LEFTOVERS: closed sessions' tasks are left in place */
  /* When the ended worker instances are looked at next (0: at the first tick). */
  int64_t ended_next_ms;
  /* When idle DistCompute workers are looked for next, and where the pass
   * under way is (compat_bounds.c). */
  int64_t idle_next_ms;
  compat_idle_cursor_t idle_cursor;
};

static void reaper_schedule(reaper_t *rp, int64_t delay_ms) {
  struct timeval tv = {.tv_sec = delay_ms / 1000, .tv_usec = (delay_ms % 1000) * 1000};
  evtimer_add(rp->timer, &tv);
}

/* Runs `step` as a request of the turn's transaction; false when it failed
 * (rolled back alone, logged, *f filled). */
typedef muster_err_t (*reaper_step_fn)(reaper_t *rp, void *arg, fail_t *f);

static bool reaper_run(reaper_t *rp, reaper_step_fn step, void *arg, fail_t *f) {
  store_t *st = rp->head->st;
  if (store_request_begin(st, f))
    return false;
  bool ok = step(rp, arg, f) == MUSTER_OK;
  store_request_end(st, ok);
  if (!ok)
    log_msg(LOG_WARN, "background removal of tasks: %s (tried again later)", fail_message(f));
  return ok;
}

/* Answers parked request `req` with `body` (stolen) after the commit, or
 * drops it when its client has gone. */
static void reaper_answer(head_t *h, h1_req_t *req, int status, json_t *body) {
  if (h1_gone(req)) {
    json_decref(body);
    h1_drop(req);
    return;
  }
  http_enqueue(h, req, status, body);
}

static json_t *reaper_delete_body(const reaper_job_t *job) {
  return json_pack("{s:s, s:I, s:I}", "deleted", job->queue, "tasks", (json_int_t)job->count,
                   "sessions_closed", (json_int_t)job->sessions);
}

/* Takes `job` out of the list and frees it. */
static void reaper_unlink(reaper_t *rp, reaper_job_t *job) {
  for (reaper_job_t **p = &rp->jobs; *p; p = &(*p)->next)
    if (*p == job) {
      *p = job->next;
      break;
    }
  free(job);
}

/* ---- 1. the trash ---- */

static muster_err_t reaper_trash_step(reaper_t *rp, void *arg, fail_t *f) {
  const char *queue = arg;
  int64_t deleted = 0;
  bool finished = false;
  if (queue_trash_step(rp->head->st, queue, QUEUE_CHUNK, &deleted, &finished, f))
    return f->code;
  if (!finished)
    return MUSTER_OK;
  log_msg(LOG_INFO, "queue '%s': the last of its tasks were deleted", queue);
  for (reaper_job_t *job = rp->jobs, *next; job; job = next) {
    next = job->next;
    if (!job->purge && strcmp(job->queue, queue) == 0) {
      reaper_answer(rp->head, job->req, 200, reaper_delete_body(job));
      reaper_unlink(rp, job);
    }
  }
  return MUSTER_OK;
}

/* One chunk of the trash; false when it is empty (or could not be read). */
static bool reaper_trash(reaper_t *rp) {
  char queue[NAME_MAX_LEN + 1];
  fail_t f = {0};
  if (queue_trash_first(rp->head->st, queue, &f) || queue[0] == '\0')
    return false;
  return reaper_run(rp, reaper_trash_step, queue, &f);
}

/* ---- 2. purges ---- */

static muster_err_t reaper_purge_step(reaper_t *rp, void *arg, fail_t *f) {
  reaper_job_t *job = arg;
  int64_t purged = 0;
  bool finished = false;
  muster_err_t err =
      queue_purge_chunk(rp->head->st, job->queue, job->horizon, QUEUE_CHUNK, &purged, &finished, f);
  if (err == MUSTER_QUEUE_NOT_FOUND) { /* deleted meanwhile, with the rest of its tasks */
    err = MUSTER_OK;
    finished = true;
  }
  if (err)
    return err;
  job->count += purged;
  if (finished) {
    reaper_answer(rp->head, job->req, 200, json_pack("{s:I}", "purged", (json_int_t)job->count));
    reaper_unlink(rp, job);
  }
  return MUSTER_OK;
}

/* One chunk of the oldest purge; false when none is under way. */
static bool reaper_purge(reaper_t *rp) {
  reaper_job_t *job = rp->jobs;
  while (job && !job->purge)
    job = job->next;
  if (job == NULL)
    return false;
  fail_t f = {0};
  if (!reaper_run(rp, reaper_purge_step, job, &f)) { /* refused: say so, stop trying */
    fail_t said;
    fail_set(&said, f.code, "the purge stopped after %lld tasks: %s", (long long)job->count,
             fail_message(&f));
    if (!h1_gone(job->req))
      http_enqueue_fail(rp->head, job->req, &said);
    else
      h1_drop(job->req);
    reaper_unlink(rp, job);
  }
  return true;
}

/* ---- 2'. closed sessions ---- */

static muster_err_t reaper_session_step(reaper_t *rp, void *arg, fail_t *f) {
  int64_t deleted = 0;
  bool finished = false;
  return session_trash_step(rp->head->st, arg, QUEUE_CHUNK, &deleted, &finished, f);
}

/* One chunk of what a closed session left; false when none did (or the
 * store could not be read). */
static bool reaper_sessions(reaper_t *rp) {
  char id[SESSION_ID_LEN + 1];
  fail_t f = {0};
  if (rp->hold_sessions)
    return false;
  if (session_trash_first(rp->head->st, id, &f) || id[0] == '\0')
    return false;
  return reaper_run(rp, reaper_session_step, id, &f);
}

/* ---- 3. retention ---- */

/* The time between two passes over a queue that keeps done tasks for
 * `keep_ms`: done tasks stay at most that much longer than asked. */
static int64_t reaper_pass_interval(int64_t keep_ms) {
  int64_t ms = keep_ms / 10;
  return ms < REAPER_PASS_MIN_MS   ? REAPER_PASS_MIN_MS
         : ms > REAPER_PASS_MAX_MS ? REAPER_PASS_MAX_MS
                                   : ms;
}

/* Reads the queues with a retention again, keeping the passes of those that
 * still have one (both lists are ordered by name). */
static void reaper_relist(reaper_t *rp, int64_t now) {
  queue_retention_t *list = NULL;
  size_t n = 0;
  fail_t f = {0};
  if (queue_retention_list(rp->head->st, &list, &n, &f))
    return; /* the old list serves until the next try */
  reaper_pass_t *passes = calloc(n ? n : 1, sizeof *passes);
  if (passes == NULL) {
    free(list);
    return;
  }
  size_t old = 0;
  for (size_t i = 0; i < n; i++) {
    passes[i].queue = list[i];
    while (old < rp->npasses && strcmp(rp->passes[old].queue.name, list[i].name) < 0)
      old++;
    if (old < rp->npasses && strcmp(rp->passes[old].queue.name, list[i].name) == 0) {
      passes[i].cursor = rp->passes[old].cursor;
      passes[i].next_pass_ms = rp->passes[old].next_pass_ms;
    }
  }
  free(list);
  free(rp->passes);
  rp->passes = passes;
  rp->npasses = n;
  rp->listed_ms = now;
}

/* The pass to run a chunk of now (one under way first), or NULL; *wait_ms
 * gets the time until the next one is due. */
static reaper_pass_t *reaper_due(reaper_t *rp, int64_t now, int64_t *wait_ms) {
  reaper_pass_t *due = NULL;
  *wait_ms = REAPER_LIST_MS;
  for (size_t i = 0; i < rp->npasses; i++) {
    reaper_pass_t *p = &rp->passes[i];
    if (p->cursor > 0)
      return p;
    if (p->next_pass_ms <= now && due == NULL)
      due = p;
    else if (p->next_pass_ms - now < *wait_ms)
      *wait_ms = p->next_pass_ms - now;
  }
  return due;
}

static muster_err_t reaper_reap_step(reaper_t *rp, void *arg, fail_t *f) {
  reaper_pass_t *p = arg;
  int64_t now = now_ms(), reaped = 0;
  bool pass_done = false;
  if (queue_reap_chunk(rp->head->st, p->queue.name, now, QUEUE_CHUNK, &p->cursor, &reaped,
                       &pass_done, f))
    return f->code;
  rp->last_reaped = reaped;
  if (pass_done) {
    p->cursor = 0;
    p->next_pass_ms = now + reaper_pass_interval(p->queue.keep_done_ms);
  }
  return MUSTER_OK;
}

/* One chunk of retention when one is due; returns the delay until the next. */
static int64_t reaper_retain(reaper_t *rp) {
  int64_t now = now_ms(), wait_ms;
  if (rp->listed_ms == 0 || now - rp->listed_ms >= REAPER_LIST_MS)
    reaper_relist(rp, now);
  reaper_pass_t *p = reaper_due(rp, now, &wait_ms);
  if (p == NULL)
    return wait_ms;
  fail_t f = {0};
  rp->last_reaped = 0;
  if (!reaper_run(rp, reaper_reap_step, p, &f)) {
    p->cursor = 0; /* start over, later */
    p->next_pass_ms = now + reaper_pass_interval(p->queue.keep_done_ms);
  }
  /* Busy, a full chunk means completions outpace a chunk per REAPER_BUSY_MS
   * (20000 tasks/s): go faster, so that the store does not grow. */
  if (h1_server_active(rp->head->http) == 0)
    return 0;
  return rp->last_reaped >= QUEUE_CHUNK ? REAPER_BEHIND_MS : REAPER_BUSY_MS;
}

/* ---- ended worker instances ---- */

/* Forgets the worker instances reported ended too long ago to matter, when
 * a tenth of the time they are kept passed since the last look: a minute,
 * unless MUSTER_TEST_ENDED_KEEP_MS made it shorter (the timer of an idle
 * head ticks at least once a second).  So a row outlives the time it is read
 * by a tenth of it, plus a tick.  Between the chunks it is one comparison of times; a
 * failure is said and tried again at the next look. */
static void reaper_forget_ended(reaper_t *rp, int64_t now) {
  store_t *st = rp->head->st;
  if (now < rp->ended_next_ms)
    return;
  int64_t keep_ms = worker_ended_keep_ms();
  rp->ended_next_ms = now + keep_ms / 10;
  if (!worker_ended_any_due(st, now))
    return;
  fail_t f = {0};
  int64_t forgotten = 0;
  if (store_request_begin(st, &f) == MUSTER_OK) {
    bool ok = worker_ended_prune(st, now, &forgotten, &f) == MUSTER_OK;
    store_request_end(st, ok);
  }
  if (f.code)
    log_msg(LOG_WARN, "forgetting ended worker instances: %s (tried again later)",
            fail_message(&f));
  else
    log_msg(LOG_DEBUG, "forgot %lld worker instances reported ended over %.1f s ago",
            (long long)forgotten, (double)keep_ms / 1000);
}

/* ---- idle DistCompute workers ---- */

#define REAPER_IDLE_CHUNK 256

/* Deletes a chunk of the DistCompute workers that went compat_idle_keep_ms()
 * ago without doing anything, once every sixtieth of that time (a minute),
 * or at every tick while chunks come out full.  True when a chunk came out
 * full: more may be due. */
static bool reaper_forget_idle(reaper_t *rp, int64_t now) {
  store_t *st = rp->head->st;
  if (now < rp->idle_next_ms)
    return false;
  fail_t f = {0};
  int examined = 0;
  int64_t deleted = 0;
  if (store_request_begin(st, &f) == MUSTER_OK) {
    bool ok = compat_delete_idle(st, now, REAPER_IDLE_CHUNK, &rp->idle_cursor, &examined, &deleted,
                                 &f) == MUSTER_OK;
    store_request_end(st, ok);
  }
  if (f.code)
    log_msg(LOG_WARN, "deleting idle DistCompute workers: %s (tried again later)",
            fail_message(&f));
  else if (deleted)
    log_msg(LOG_DEBUG, "deleted %lld DistCompute workers that went without doing anything",
            (long long)deleted);
  bool more = f.code == MUSTER_OK && examined == REAPER_IDLE_CHUNK;
  if (!more) { /* the pass is done (or failed): the next starts over */
    rp->idle_cursor = (compat_idle_cursor_t){0, 0};
    rp->idle_next_ms = now + compat_idle_keep_ms() / 60;
  }
  return more;
}

/* ---- the timer ---- */

/* The chunked work that goes before the retention, in turns: each true
 * when it ran a chunk. */
static bool (*const reaper_chunks[])(reaper_t *rp) = {reaper_trash, reaper_purge, reaper_sessions};
#define REAPER_CHUNK_KINDS (sizeof reaper_chunks / sizeof reaper_chunks[0])

static void reaper_tick(evutil_socket_t fd, short what, void *arg) {
  reaper_t *rp = arg;
  if (rp->head->stopping)
    return;
  reaper_forget_ended(rp, now_ms());
  bool idle_left = reaper_forget_idle(rp, now_ms());
  rp->turn = (rp->turn + 1) % REAPER_CHUNK_KINDS;
  for (size_t i = 0; i < REAPER_CHUNK_KINDS; i++)
    if (reaper_chunks[(rp->turn + i) % REAPER_CHUNK_KINDS](rp)) {
      reaper_schedule(rp, 0); /* more may be left: the next chunk next turn */
      return;
    }
  int64_t delay_ms = reaper_retain(rp);
  reaper_schedule(rp, idle_left ? 0 : delay_ms);
}

/* Whether MUSTER_TEST_HOLD_LEFTOVERS=1 is set: for tests only
 * (docs/design-notes.md, "Stepping over what closed sessions left"), what
 * closed sessions left then stays for as long as the head runs, so that a
 * test sees a head in the middle of that deletion for as long as it needs,
 * without racing its chunks.  Another value is said and ignored. */
static bool reaper_hold_sessions(void) {
  const char *hold = getenv("MUSTER_TEST_HOLD_LEFTOVERS");
  if (hold == NULL || hold[0] == '\0' || strcmp(hold, "0") == 0)
    return false;
  if (strcmp(hold, "1") == 0) {
    log_msg(LOG_WARN, "MUSTER_TEST_HOLD_LEFTOVERS=1: the tasks closed sessions left are not"
                      " deleted (for tests only)");
    return true;
  }
  log_msg(LOG_WARN,
          "MUSTER_TEST_HOLD_LEFTOVERS=%s is not 1 or 0; the tasks closed sessions left"
          " are deleted as usual",
          hold);
  return false;
}

reaper_t *reaper_new(head_t *h) {
  reaper_t *rp = calloc(1, sizeof *rp);
  if (rp == NULL)
    return NULL;
  rp->head = h;
  rp->hold_sessions = reaper_hold_sessions();
  rp->timer = evtimer_new(h->base, reaper_tick, rp);
  if (rp->timer == NULL) {
    free(rp);
    return NULL;
  }
  reaper_schedule(rp, 0);
  return rp;
}

void reaper_free(reaper_t *rp) {
  if (rp == NULL)
    return;
  while (rp->jobs) {
    reaper_job_t *job = rp->jobs;
    rp->jobs = job->next;
    free(job);
  }
  event_free(rp->timer);
  free(rp->passes);
  free(rp);
}

void reaper_wake(head_t *h) {
  if (h->reaper && !h->stopping)
    reaper_schedule(h->reaper, 0);
}

/* Appends a job for parked request `r` and runs the timer at the next turn. */
static reaper_job_t *reaper_park(http_req_t *r, const char *queue) {
  reaper_t *rp = r->head->reaper;
  reaper_job_t *job = rp ? calloc(1, sizeof *job) : NULL;
  if (job == NULL)
    return NULL;
  job->req = r->req;
  snprintf(job->queue, sizeof job->queue, "%s", queue);
  reaper_job_t **tail = &rp->jobs;
  while (*tail)
    tail = &(*tail)->next;
  *tail = job;
  r->parked = true;
  reaper_schedule(rp, 0);
  return job;
}

void reaper_park_delete(http_req_t *r, const char *queue, int64_t tasks, int64_t sessions) {
  reaper_job_t *job = reaper_park(r, queue);
  if (job == NULL) { /* answered now: the deletion goes on all the same */
    http_reply_json(r, 200,
                    json_pack("{s:s, s:I, s:I}", "deleted", queue, "tasks", (json_int_t)tasks,
                              "sessions_closed", (json_int_t)sessions));
    return;
  }
  job->count = tasks;
  job->sessions = sessions;
}

void reaper_park_purge(http_req_t *r, const char *queue, int64_t horizon, int64_t purged) {
  reaper_job_t *job = reaper_park(r, queue);
  if (job == NULL) {
    fail_t f;
    fail_set(&f, MUSTER_NOMEM, "out of memory after purging %lld tasks", (long long)purged);
    http_reply_fail(r, &f);
    return;
  }
  job->purge = true;
  job->horizon = horizon;
  job->count = purged;
}

void reaper_release_all(head_t *h) {
  reaper_t *rp = h->reaper;
  if (rp == NULL)
    return;
  evtimer_del(rp->timer);
  while (rp->jobs) {
    reaper_job_t *job = rp->jobs;
    if (!job->purge) {
      reaper_answer(h, job->req, 200, reaper_delete_body(job));
    } else {
      fail_t f;
      fail_set(&f, MUSTER_UNAVAILABLE,
               "the head is stopping: %lld queued tasks of '%s' were purged and the rest were "
               "not; purge again once it is back",
               (long long)job->count, job->queue);
      reaper_answer(h, job->req, 503,
                    json_pack("{s:{s:s, s:s}}", "error", "code", muster_err_name(f.code), "message",
                              fail_message(&f)));
    }
    reaper_unlink(rp, job);
  }
}
