/*
 * pool.c — muster_pool_t: open, close, imap and imap_unordered over the
 * workers of a queue (docs/pools.md), built on a session (session.c); map is
 * an ordered imap read to its end (pool_map.c).
 *
 * A pool owns one session.  Each imap gives its inputs consecutive session
 * indexes, chosen by the pool and sent explicitly, so a batch that is retried
 * after a lost reply cannot be stored twice (the head refuses an index in use).
 * Results come from the session's results stream: in submission order from
 * the iterator's first index, or in completion order from the highest
 * completion cursor the pool has seen so far (a task submitted after that
 * cursor was observed can only finish after it).
 *
 * Exactly once: the head names every index once in the stream, even when its
 * task ran twice; the iterator keeps a bitmap of the positions it delivered
 * and drops any repeat, so even a misbehaving stream or a replayed page
 * cannot hand the caller a result twice.  An iterator's state (cursor, bitmap,
 * buffered page) survives a failed call, so after a network error the caller
 * simply calls muster_pool_iter_next again.
 *
 * The heartbeat thread (beat.c) has its own client handle (handles are not
 * thread-safe) and only ever calls POST /v1/sessions/{id}/heartbeat, so the
 * session outlives a caller who is slow to consume results.
 */
#include "client/pool_internal.h"
#include "client/jparse.h"
#include "client/jtext.h"
#include "core/limits.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- messages and small helpers ---------------------------------------------------- */

muster_err_t pool_fail(muster_pool_t *pool, muster_err_t err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(pool->message, sizeof pool->message, fmt, ap);
  va_end(ap);
  return err;
}

muster_err_t pool_from_client(muster_pool_t *pool, muster_err_t err) {
  if (err != MUSTER_OK)
    pool_fail(pool, err, "%s", muster_client_message(pool->client));
  else
    pool->message[0] = '\0';
  return err;
}

const char *muster_pool_message(const muster_pool_t *pool) {
  return pool ? pool->message : "";
}

muster_server_t muster_pool_server(const muster_pool_t *pool) {
  return pool ? muster_client_server(pool->client) : MUSTER_SERVER_UNKNOWN;
}

const char *muster_pool_session(const muster_pool_t *pool) {
  return pool ? pool->session : NULL;
}

int64_t muster_pool_timeout_ms(const muster_pool_t *pool) {
  return pool ? pool->timeout_ms : 0;
}

void muster_pool_keep_session(muster_pool_t *pool) {
  if (pool != NULL)
    pool->keep_session = 1;
}

int64_t pool_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The end of muster_pool_opts_t's first version, the fields it was first
 * published with: request_timeout_ms came later and may be missing. */
#define POOL_OPTS_FIRST_END OPTS_END(muster_pool_opts_t, keep_session)

void muster_pool_opts_init_sized(muster_pool_opts_t *opts, size_t size) {
  const muster_pool_opts_t defaults = {.size = sizeof defaults,
                                       .create_queue = 1,
                                       .cleanup_on_exit = -1,
                                       .timeout_ms = -1,
                                       .heartbeat_ms = -1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* ---- the heartbeat thread ------------------------------------------------------------- */

/* One beat of the session.  Failures are not fatal here: the caller's own
 * calls fail visibly if the session is gone. */
static void pool_heartbeat(void *arg) {
  muster_pool_t *pool = arg;
  muster_session_heartbeat(pool->hb_client, pool->session);
}

/* A client of `url` for the pool, with the pool's request timeout. */
static muster_err_t pool_client_new(muster_pool_t *pool, const char *url, const char *token,
                                    muster_client_t **out) {
  char *why = NULL;
  muster_err_t err = muster_client_open(url, token, out, &why);
  if (err != MUSTER_OK)
    pool_fail(pool, err, "%s", why ? why : muster_strerror(err));
  else if (pool->request_timeout_ms > 0)
    muster_client_set_timeout(*out, (long)pool->request_timeout_ms);
  muster_free(why);
  return err;
}

/* Starts the heartbeat thread, every `period_ms`, with its own handle on `url`. */
static muster_err_t pool_heartbeat_start(muster_pool_t *pool, const char *url, const char *token,
                                         int64_t period_ms) {
  muster_err_t err = pool_client_new(pool, url, token, &pool->hb_client);
  if (err != MUSTER_OK)
    return err;
  if (beat_start(&pool->hb, period_ms, pool_heartbeat, pool) != MUSTER_OK)
    return pool_fail(pool, MUSTER_NOMEM, "cannot start the heartbeat thread");
  return MUSTER_OK;
}

/* ---- open and close ------------------------------------------------------------------------ */

/* Makes sure the pool's queue exists, creating it with default settings. */
static muster_err_t pool_ensure_queue(muster_pool_t *pool, int create) {
  muster_err_t err = muster_queue_get(pool->client, pool->queue, NULL);
  if (err == MUSTER_QUEUE_NOT_FOUND && create)
    err = muster_queue_put(pool->client, pool->queue, NULL, NULL);
  return pool_from_client(pool, err);
}

/* Reads the session's next_index and timeout from its object `json`. */
static void pool_read_session(muster_pool_t *pool, const char *json, int64_t *timeout_ms) {
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  int64_t next = 0;
  if (client_get_int(root, "next_index", 0, &next) == 0 && next > pool->next_index)
    pool->next_index = next;
  client_get_int(root, "timeout_ms", POOL_DEFAULT_TIMEOUT_MS, timeout_ms);
  json_decref(root);
}

/* Creates the session, or attaches to opts->session. */
static muster_err_t pool_start_session(muster_pool_t *pool, const muster_pool_opts_t *opts,
                                       int64_t *timeout_ms) {
  char *json = NULL;
  muster_err_t err;
  if (opts->session != NULL) {
    pool->session = strdup(opts->session);
    if (pool->session == NULL)
      return pool_fail(pool, MUSTER_NOMEM, "out of memory");
    err = muster_session_get(pool->client, pool->session, &json);
  } else {
    muster_session_opts_t so;
    muster_session_opts_init(&so);
    so.queue = pool->queue;
    so.cleanup_on_exit = opts->cleanup_on_exit;
    so.timeout_ms = opts->timeout_ms;
    so.init_data = opts->init_data;
    err = muster_session_create(pool->client, &so, &pool->session, &json);
    pool->own_session = err == MUSTER_OK;
  }
  if (err == MUSTER_OK)
    pool_read_session(pool, json, timeout_ms);
  muster_free(json);
  return pool_from_client(pool, err);
}

/* Hands the failure of an open to the caller and frees the half-made pool. */
static muster_err_t pool_open_failed(muster_pool_t *pool, muster_err_t err, char **message) {
  if (message != NULL)
    *message = strdup(pool->message[0] ? pool->message : muster_strerror(err));
  muster_pool_close(pool);
  return err;
}

/* Takes the caller's options `caller` into *opts (which holds the defaults)
 * and says why they cannot open a pool (written into `why`, `size` bytes), or
 * NULL when nothing is wrong with them before the head is asked.  Negative
 * numbers other than the documented -1s are refused here rather than taken
 * for a default, and before the queue or the session is made. */
static const char *pool_opts_problem(muster_pool_opts_t *opts, const muster_pool_opts_t *caller,
                                     char *why, size_t size) {
  const char *problem = caller == NULL ? NULL
                                       : opts_take(opts, sizeof *opts, caller, POOL_OPTS_FIRST_END,
                                                   "opts", "muster_pool_opts_init", why, size);
  if (problem != NULL)
    return problem;
  if (caller == NULL || opts->url == NULL || opts->queue == NULL) {
    snprintf(why, size, "a url and a queue are required");
    return why;
  }
  problem = client_min_problem(why, size, "timeout_ms", opts->timeout_ms, -1,
                               "a time in milliseconds, or -1 for the head's default");
  if (problem == NULL)
    problem = client_min_problem(why, size, "heartbeat_ms", opts->heartbeat_ms, -1,
                                 "a period in milliseconds, 0 for no heartbeat thread, or -1 "
                                 "for timeout_ms / 4");
  if (problem == NULL)
    problem = client_min_problem(why, size, "request_timeout_ms", opts->request_timeout_ms, 0,
                                 "a time in milliseconds, or 0 for the default (60000)");
  if (problem == NULL &&
      requires_problem(opts->required, opts->required_count, why, size) != MUSTER_OK)
    problem = why;
  return problem;
}

/* The part of open that talks to the head: queue, session, heartbeat thread. */
static muster_err_t pool_start(muster_pool_t *pool, const muster_pool_opts_t *opts) {
  muster_err_t err = pool_client_new(pool, opts->url, opts->token, &pool->client);
  if (err != MUSTER_OK)
    return err;
  if ((pool->queue = strdup(opts->queue)) == NULL)
    return pool_fail(pool, MUSTER_NOMEM, "out of memory");
  int64_t timeout_ms = POOL_DEFAULT_TIMEOUT_MS;
  if ((err = pool_ensure_queue(pool, opts->create_queue)) != MUSTER_OK ||
      (err = pool_start_session(pool, opts, &timeout_ms)) != MUSTER_OK)
    return err;
  pool->timeout_ms = timeout_ms;
  int64_t period_ms = opts->heartbeat_ms >= 0 ? opts->heartbeat_ms : timeout_ms / 4;
  if (period_ms > 0)
    err = pool_heartbeat_start(pool, opts->url, opts->token, period_ms);
  return err;
}

muster_err_t muster_pool_open(const muster_pool_opts_t *caller, muster_pool_t **out,
                              char **message) {
  char problem[CLIENT_MESSAGE_MAX];
  muster_pool_opts_t opts; /* the caller's options over this library's defaults */
  muster_pool_opts_init(&opts);
  const char *why = out ? pool_opts_problem(&opts, caller, problem, sizeof problem)
                        : "out: a place for the pool is required";
  if (message)
    *message = why ? strdup(why) : NULL;
  if (out)
    *out = NULL;
  if (why)
    return MUSTER_INVALID;
  muster_pool_t *pool = calloc(1, sizeof *pool);
  if (pool == NULL)
    return MUSTER_NOMEM;
  pool->keep_session = opts.keep_session;
  pool->request_timeout_ms = opts.request_timeout_ms;
  pool->required_count = opts.required_count;
  pool->required = requires_copy(opts.required, opts.required_count);
  muster_err_t err = pool->required == NULL ? pool_fail(pool, MUSTER_NOMEM, "out of memory")
                                            : pool_start(pool, &opts);
  if (err != MUSTER_OK)
    return pool_open_failed(pool, err, message);
  *out = pool;
  return MUSTER_OK;
}

void muster_pool_close(muster_pool_t *pool) {
  if (pool == NULL)
    return;
  beat_stop(&pool->hb);
  if (pool->own_session && !pool->keep_session)
    muster_session_close(pool->client, pool->session, NULL);
  muster_client_free(pool->hb_client);
  muster_client_free(pool->client);
  free(pool->queue);
  free(pool->session);
  requires_free(pool->required, pool->required_count);
  free(pool);
}

/* ---- submitting ------------------------------------------------------------------------------ */

/* Puts inputs[0..count) at session indexes first, first+1, ...  A head that is
 * down or restarting (a reply lost on the network, or unavailable) is tried
 * again at once and then every second, for up to the session's timeout, while
 * the heartbeat thread keeps the session open.  The indexes are explicit: a
 * retry of a batch that did land is answered as a repeat by the head (the
 * same payloads at the same indexes), while invalid_state ("index in use")
 * means another producer of the session took an index.  *first_id (when not
 * NULL) gets the id of the batch's first task, for muster_pool_iter_failing. */
static muster_err_t pool_submit_batch(muster_pool_t *pool, const char *const *inputs, size_t count,
                                      int64_t first, int64_t *first_id) {
  muster_task_spec_t *specs = calloc(count ? count : 1, sizeof *specs);
  int64_t *ids = first_id ? calloc(count ? count : 1, sizeof *ids) : NULL;
  if (specs == NULL || (first_id && ids == NULL)) {
    free(specs);
    return pool_fail(pool, MUSTER_NOMEM, "out of memory");
  }
  for (size_t i = 0; i < count; i++) {
    muster_task_spec_init(&specs[i]);
    specs[i].payload = inputs[i];
    specs[i].index = first + (int64_t)i;
  }
  muster_err_t err;
  int64_t give_up = pool_now_ms() + (pool->timeout_ms > 0 ? pool->timeout_ms : 0);
  for (int attempt = 0;; attempt++) {
    err = muster_session_put_requiring(pool->client, pool->session, specs, count, pool->required,
                                       pool->required_count, ids, NULL);
    if (err != MUSTER_NETWORK && err != MUSTER_UNAVAILABLE)
      break;
    if (attempt > 0 && pool_now_ms() >= give_up)
      break;
    if (attempt > 0)
      nanosleep(&(struct timespec){.tv_sec = POOL_SUBMIT_PAUSE_S}, NULL);
  }
  if (err == MUSTER_OK && ids != NULL && count > 0)
    *first_id = ids[0];
  free(ids);
  free(specs);
  return pool_from_client(pool, err);
}

/* Checked before any input is submitted: a bad input found in the second
 * batch of 1000 would otherwise leave the first batch running with no
 * iterator to read it, and be named by its place in that batch (tasks[200]
 * for inputs[1200]). */
muster_err_t pool_check_inputs(muster_pool_t *pool, const char *const *inputs, size_t count) {
  if (inputs == NULL && count > 0)
    return pool_fail(pool, MUSTER_INVALID, "inputs: required (%zu of them)", count);
  for (size_t i = 0; i < count; i++) {
    if (inputs[i] == NULL)
      return pool_fail(pool, MUSTER_INVALID,
                       "inputs[%zu]: NULL, expected JSON text (a string input is \"\\\"...\\\"\")",
                       i);
    const char *p = inputs[i], *end = p + strlen(p);
    while (p < end && jcanon_is_space((unsigned char)*p))
      p++;
    jtext_info_t info;
    const char *value_end = jtext_scan(p, end, &info);
    if (value_end != NULL && info.canonical && jtext_only_space(value_end, end))
      continue; /* the scan's word is enough: no tree built */
    char why[JPARSE_WHY];
    json_t *value = jparse(inputs[i], strlen(inputs[i]), why, sizeof why);
    if (value == NULL)
      return pool_fail(pool, MUSTER_INVALID, "inputs[%zu]: not valid JSON: %s", i, why);
    json_decref(value);
  }
  return MUSTER_OK;
}

muster_err_t pool_imap_start(muster_pool_t *pool, const char *const *inputs, size_t count,
                             int ordered, muster_pool_iter_t **out) {
  *out = NULL;
  muster_pool_iter_t *it = calloc(1, sizeof *it);
  if (it == NULL || (it->seen = calloc(count / 8 + 1, 1)) == NULL) {
    free(it);
    return pool_fail(pool, MUSTER_NOMEM, "out of memory");
  }
  it->pool = pool;
  it->ordered = ordered != 0;
  it->total = count;
  it->first = pool->next_index;
  it->cursor = it->ordered ? it->first : pool->completion_floor;
  /* The indexes are the iterator's even if a batch fails half-way: never reuse them. */
  pool->next_index += (int64_t)count;
  for (size_t at = 0; at < count; at += TASK_MAX_BATCH) {
    size_t n = count - at < TASK_MAX_BATCH ? count - at : TASK_MAX_BATCH;
    muster_err_t err = pool_submit_batch(pool, inputs + at, n, it->first + (int64_t)at,
                                         at == 0 ? &it->first_id : NULL);
    if (err != MUSTER_OK) {
      muster_pool_iter_free(it);
      return err;
    }
  }
  *out = it;
  return MUSTER_OK;
}

muster_err_t muster_pool_imap(muster_pool_t *pool, const char *const *inputs, size_t count,
                              int ordered, muster_pool_iter_t **out) {
  if (out)
    *out = NULL;
  if (pool == NULL)
    return MUSTER_INVALID;
  pool->message[0] = '\0';
  if (out == NULL)
    return pool_fail(pool, MUSTER_INVALID, "out: a place for the iterator is required");
  muster_err_t checked = pool_check_inputs(pool, inputs, count);
  if (checked != MUSTER_OK)
    return checked;
  return pool_imap_start(pool, inputs, count, ordered, out);
}

muster_err_t muster_pool_imap_unordered(muster_pool_t *pool, const char *const *inputs,
                                        size_t count, muster_pool_iter_t **out) {
  return muster_pool_imap(pool, inputs, count, 0, out);
}

/* ---- iterating ------------------------------------------------------------------------------- */

void muster_pool_iter_free(muster_pool_iter_t *it) {
  if (it == NULL)
    return;
  muster_results_free(&it->page);
  free(it->seen);
  free(it);
}

int muster_pool_iter_done(const muster_pool_iter_t *it) {
  return it == NULL || it->delivered == it->total;
}

void muster_pool_iter_progress(const muster_pool_iter_t *it, size_t *delivered, size_t *total) {
  if (delivered)
    *delivered = it ? it->delivered : 0;
  if (total)
    *total = it ? it->total : 0;
}

size_t muster_pool_iter_duplicates(const muster_pool_iter_t *it) {
  return it ? it->duplicates : 0;
}

int64_t muster_pool_iter_cursor(const muster_pool_iter_t *it) {
  return it ? it->cursor : 0;
}

/* Takes the next result of the buffered page that is this iterator's and not
 * yet delivered; returns 1 with *out moved out of the page, 0 when the page is
 * used up. */
static int pool_iter_take(muster_pool_iter_t *it, muster_result_t *out) {
  while (it->page_at < it->page.count) {
    muster_result_t *r = &it->page.results[it->page_at++];
    int64_t pos = r->index - it->first;
    if (pos < 0 || (uint64_t)pos >= it->total) {
      muster_result_clear(r); /* another iterator's input */
      continue;
    }
    unsigned char bit = (unsigned char)(1u << (pos % 8));
    if (it->seen[pos / 8] & bit) {
      it->duplicates++;
      muster_result_clear(r);
      continue;
    }
    it->seen[pos / 8] |= bit;
    it->delivered++;
    *out = *r;
    out->index = pos;
    memset(r, 0, sizeof *r);
    return 1;
  }
  return 0;
}

/* Reads the next page of the stream, waiting up to `wait_ms`: not at all
 * after a page that stopped at a gap of a stream whose every task has its
 * result, as nothing can come there; muster_session_results then fails with
 * MUSTER_INDEX_GAP, unless the gap was filled meanwhile. */
static muster_err_t pool_iter_fetch(muster_pool_iter_t *it, int64_t wait_ms) {
  muster_pool_t *pool = it->pool;
  if (it->stalled)
    wait_ms = 0;
  muster_results_free(&it->page);
  it->page_at = 0;
  size_t max = TASK_MAX_BATCH;
  if (it->ordered) {
    int64_t left = it->first + (int64_t)it->total - it->cursor;
    max = left > 0 && left < TASK_MAX_BATCH ? (size_t)left : TASK_MAX_BATCH;
  }
  muster_err_t err = muster_session_results(
      pool->client, pool->session, it->ordered ? MUSTER_ORDER_SUBMISSION : MUSTER_ORDER_COMPLETION,
      it->cursor, max, wait_ms, &it->page);
  if (err != MUSTER_OK) {
    muster_results_free(&it->page);
    return pool_from_client(pool, err);
  }
  it->stalled = it->page.gap_first >= 0 && it->page.done >= it->page.total;
  if (it->page.count > 0 || it->page.cursor > it->cursor)
    it->cursor = it->page.cursor;
  if (!it->ordered && it->cursor > pool->completion_floor)
    pool->completion_floor = it->cursor;
  return MUSTER_OK;
}

/*
 * After a read that asked to wait `asked` ms from `started` and came back
 * empty: when it came back within POOL_MIN_POLL_MS (a head whose
 * --max-wait-ms is 0 or small answers at once), waits out the rest of that
 * second, or of `asked` if shorter, so that the head is asked at most once
 * a second rather than in a busy loop, as `muster session results --follow`
 * and the Python client do.
 */
static void pool_iter_pace(int64_t started, int64_t asked) {
  int64_t until = started + (asked < POOL_MIN_POLL_MS ? asked : POOL_MIN_POLL_MS);
  int64_t rest = until - pool_now_ms();
  if (rest <= 0)
    return;
  struct timespec ts = {.tv_sec = rest / 1000, .tv_nsec = (long)(rest % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

muster_err_t muster_pool_iter_next(muster_pool_iter_t *it, int64_t wait_ms, muster_result_t *out,
                                   int *has) {
  if (out)
    memset(out, 0, sizeof *out);
  if (has)
    *has = 0;
  if (it == NULL)
    return MUSTER_INVALID;
  it->pool->message[0] = '\0';
  if (out == NULL)
    return pool_fail(it->pool, MUSTER_INVALID, "out: a place for the result is required");
  if (has == NULL)
    return pool_fail(it->pool, MUSTER_INVALID,
                     "has: a place for the flag saying whether a result came is required");
  if (wait_ms < -1)
    return pool_fail(it->pool, MUSTER_INVALID,
                     "wait_ms: %lld, expected 0 or more milliseconds, or -1 to wait until a "
                     "result comes",
                     (long long)wait_ms);
  int64_t deadline = wait_ms >= 0 ? pool_now_ms() + wait_ms : 0;
  for (int polled = 0;; polled = 1) {
    if (pool_iter_take(it, out)) {
      *has = 1;
      return MUSTER_OK;
    }
    if (it->delivered == it->total)
      return MUSTER_OK;
    int64_t left = wait_ms >= 0 ? deadline - pool_now_ms() : POOL_POLL_MS;
    if (polled && left <= 0)
      return MUSTER_OK;
    int64_t asked = left <= 0 ? 0 : left < POOL_POLL_MS ? left : POOL_POLL_MS;
    int64_t started = pool_now_ms(), cursor = it->cursor;
    muster_err_t err = pool_iter_fetch(it, asked);
    if (err != MUSTER_OK)
      return err;
    if (it->page.count == 0 && it->cursor == cursor)
      pool_iter_pace(started, asked);
  }
}

/* ---- updates and counts -------------------------------------------------------------------- */

muster_err_t muster_pool_update_workers(muster_pool_t *pool, const char *data, int64_t *seq) {
  if (seq)
    *seq = 0;
  if (pool == NULL)
    return MUSTER_INVALID;
  if (data == NULL)
    return pool_fail(pool, MUSTER_INVALID, "data: NULL, expected the update as JSON text");
  return pool_from_client(pool,
                          muster_update_post(pool->client, pool->queue, data, pool->session, seq));
}

/* Non-zero when worker object `w` is active and its `queues` name `queue`, as
 * Python's Pool and `muster workers --queue` count (docs/pools.md). */
static int pool_worker_serves(const json_t *w, const char *queue) {
  const char *state = json_string_value(json_object_get(w, "state"));
  if (state == NULL || strcmp(state, "active") != 0)
    return 0;
  json_t *queues = json_object_get(w, "queues");
  size_t i;
  json_t *q;
  json_array_foreach(queues, i, q) {
    if (json_is_string(q) && strcmp(json_string_value(q), queue) == 0)
      return 1;
  }
  return 0;
}

/* Counts the elements of list `key` in the reply text `json` that `pred` accepts. */
static muster_err_t pool_count(muster_pool_t *pool, const char *json, const char *key,
                               int (*pred)(const json_t *, const char *), size_t *count) {
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_t *list = json_object_get(root, key);
  muster_err_t err = MUSTER_OK;
  *count = 0;
  if (!json_is_array(list)) {
    err = pool_fail(pool, MUSTER_PROTOCOL, "the reply has no '%s' list", key);
  } else {
    size_t i;
    json_t *elem;
    json_array_foreach(list, i, elem) {
      *count += (size_t)pred(elem, pool->queue);
    }
  }
  json_decref(root);
  return err;
}

muster_err_t muster_pool_workers_count(muster_pool_t *pool, size_t *count) {
  if (pool == NULL)
    return MUSTER_INVALID;
  if (count == NULL)
    return pool_fail(pool, MUSTER_INVALID, "count: a place for the number of workers is required");
  char *json = NULL;
  muster_err_t err = pool_from_client(pool, muster_worker_list(pool->client, &json));
  if (err == MUSTER_OK)
    err = pool_count(pool, json, "workers", pool_worker_serves, count);
  muster_free(json);
  return err;
}

/* Counts the machines among the workers of reply text `json` that serve the
 * pool's queue: the distinct nodes they name, plus one for each worker that
 * names no node (a worker started without an agent is a machine of its own).
 * Nodes without such a worker, e.g. whose workers serve other queues, do not
 * count; the same rule as Python's Pool.get_nodes_count(). */
static muster_err_t pool_count_machines(muster_pool_t *pool, const char *json, size_t *count) {
  json_t *root = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_t *list = json_object_get(root, "workers");
  json_t *nodes_seen = json_object();
  muster_err_t err = MUSTER_OK;
  *count = 0;
  if (!json_is_array(list)) {
    err = pool_fail(pool, MUSTER_PROTOCOL, "the reply has no 'workers' list");
  } else {
    size_t i;
    json_t *w;
    json_array_foreach(list, i, w) {
      if (!pool_worker_serves(w, pool->queue))
        continue;
      const char *node = json_string_value(json_object_get(w, "node"));
      if (node == NULL || node[0] == '\0')
        (*count)++;
      else if (json_object_get(nodes_seen, node) == NULL)
        *count += json_object_set_new(nodes_seen, node, json_true()) == 0;
    }
  }
  json_decref(nodes_seen);
  json_decref(root);
  return err;
}

muster_err_t muster_pool_nodes_count(muster_pool_t *pool, size_t *count) {
  if (pool == NULL)
    return MUSTER_INVALID;
  if (count == NULL)
    return pool_fail(pool, MUSTER_INVALID, "count: a place for the number of nodes is required");
  char *json = NULL;
  muster_err_t err = pool_from_client(pool, muster_worker_list(pool->client, &json));
  if (err == MUSTER_OK)
    err = pool_count_machines(pool, json, count);
  muster_free(json);
  return err;
}
