/*
 * test_session_close.c — closing a session with more tasks than one chunk
 * (session_close.c): the close deletes one chunk and leaves the rest to the
 * reaper's turns (session_trash_step), none of them leasable, counted as
 * ready or readable meanwhile; the expiry and a queue's deletion close
 * sessions within one chunk too; the counts stay exact.  Against an
 * in-memory store: no HTTP, no processes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/counts.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/queue.h"
#include "server/queue_reap.h"
#include "server/session.h"
#include "server/task.h"
#include "sql_helpers.h"
#include "store_fixture.h"
#include "session_fixture.h"

/* The statement that deletes a chunk of a session's tasks (session_close.c). */
#define CHUNK_SQL "INDEXED BY tasks_by_session WHERE session = ?1 AND id <= ?2 LIMIT ?3"

/* The count of rows of `table` whose `column` is `value`. */
static int64_t rows(const char *table, const char *column, const char *value) {
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE %s = '%s'", table, column, value);
  return query_int(store_db(st), sql);
}

static int64_t session_tasks(const char *id) {
  return rows("tasks", "session", id);
}

/* The kept counts of `queue` equal a count of its tasks, state by state,
 * but those that a closed session left to the background deletion: they
 * are out of the counts from the close's reply on. */
static void assert_counts_exact(const char *queue) {
  int64_t kept[TASK_STATE_COUNT];
  fail_t f = {0};
  assert_int_equal(counts_read(st, queue, kept, &f), MUSTER_OK);
  for (int state = 0; state < TASK_STATE_COUNT; state++) {
    char sql[320];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM tasks AS t WHERE queue = '%s' AND state = %d AND NOT EXISTS"
             " (SELECT 1 FROM session_trash AS c WHERE c.session = t.session"
             " AND t.id <= c.horizon)",
             queue, state);
    int64_t there = query_int(store_db(st), sql);
    if (kept[state] != there)
      fail_msg("queue %s, state %s: counted %lld, there are %lld", queue, task_state_name(state),
               (long long)kept[state], (long long)there);
  }
}

/* Fails lease `l` for good: its task becomes failed. */
static void fail_for_good(const json_t *l) {
  json_t *body =
      json_pack("{s:[{s:I, s:I, s:s, s:b}]}", "leases", "task", (json_int_t)jint(l, "task"),
                "token", (json_int_t)jint(l, "token"), "error", "no", "permanent", 1);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_FAIL, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("fail: %s", f.message);
  json_decref(out);
  json_decref(body);
}

/* Runs reaper turns (session_trash_step) until session `id` is finished;
 * returns how many, each checked to delete at most a chunk. */
static int reaper_turns(const char *id) {
  int turns = 0;
  for (bool finished = false; !finished; turns++) {
    int64_t deleted = -1;
    fail_t f = {0};
    assert_true(turns < 100);
    assert_int_equal(session_trash_step(st, id, QUEUE_CHUNK, &deleted, &finished, &f), MUSTER_OK);
    assert_true(deleted >= 0 && deleted <= QUEUE_CHUNK);
  }
  return turns;
}

/* A session of 3.5 chunks, three tasks leased, one completed and one failed
 * then requeued (the session's counters still count it failed), between a
 * plain task put before it and one put after it. */
static void test_big_close_goes_in_chunks(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  int64_t before = put_one("q", 0);
  char id[SESSION_ID_LEN + 1], sid[SESSION_ID_LEN + 1];
  open_session("q", 60000, id);
  const int64_t n = 3 * QUEUE_CHUNK + QUEUE_CHUNK / 2;
  submit_many(id, n);
  int64_t after = put_one("q", 0);
  json_t *leases = fixture_lease("q", 5); /* `before` and four of the session's */
  json_t *first = json_array();
  json_array_append(first, json_array_get(leases, 1));
  complete_all(first);
  json_decref(first);
  fail_for_good(json_array_get(leases, 4));
  fail_t f = {0};
  json_t *requeued = tree_of(task_requeue(st, jint(json_array_get(leases, 4), "task"), &f));
  assert_non_null(requeued);
  json_decref(requeued);
  int64_t leased = jint(json_array_get(leases, 3), "task");
  json_decref(leases);

  /* The close deletes one chunk: one run of the chunk's statement. */
  int chunk_runs = stmt_runs(CHUNK_SQL);
  json_t *r = session_close(st, id, "by its client", &f);
  assert_non_null(r);
  assert_int_equal(stmt_runs(CHUNK_SQL) - chunk_runs, 1);
  assert_int_equal(session_tasks(id), n - QUEUE_CHUNK);
  /* Its counts are exact: every task but the completed one was unfinished,
   * the requeued one included. */
  assert_int_equal(jint(r, "cancelled"), n - 1);
  assert_int_equal(jint(r, "deleted"), n);
  /* The queue's counts hold none of the session's tasks any more: only
   * `before` (leased) and `after` (queued). */
  int64_t kept[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "q", kept, &f), MUSTER_OK);
  assert_int_equal(kept[TASK_QUEUED], 1);
  assert_int_equal(kept[TASK_LEASED], 1);
  assert_int_equal(kept[TASK_DONE] + kept[TASK_FAILED] + kept[TASK_DEAD], 0);
  json_decref(r);
  assert_int_equal(rows("session_trash", "session", id), 1);
  assert_true(store_sessions_closing(st));
  assert_null(session_get(st, id, &f));
  assert_int_equal(f.code, MUSTER_SESSION_NOT_FOUND);

  /* None of what is left is leased, and a lease still takes others in
   * lease order: those of higher priority, then the one put after the
   * session's 2500 tasks left, which it steps over; the ready count counts
   * it before and nothing after. */
  int64_t high = put_one("q", 10), mid = put_one("q", 5), ready = -1;
  assert_int_equal(queue_count_ready(st, "q", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 3);
  leases = fixture_lease("q", 50);
  assert_int_equal(json_array_size(leases), 3);
  assert_int_equal(jint(json_array_get(leases, 0), "task"), high);
  assert_int_equal(jint(json_array_get(leases, 1), "task"), mid);
  assert_int_equal(jint(json_array_get(leases, 2), "task"), after);
  json_decref(leases);
  assert_int_equal(queue_count_ready(st, "q", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 0);
  /* A task left behind reads as removed. */
  int64_t left = query_int(store_db(st), "SELECT max(id) FROM tasks WHERE session IS NOT NULL");
  f = (fail_t){0};
  assert_null(tree_of(task_get(st, left, &f)));
  assert_int_equal(f.code, MUSTER_TASK_NOT_FOUND);
  assert_non_null(strstr(f.message, "does not exist any more"));
  /* The leased task went with the close (it was in the first chunk, and
   * the leased ones go in any case). */
  assert_null(tree_of(task_get(st, leased, &f)));
  assert_counts_exact("q");

  /* The reaper's turns delete the rest, a chunk each, then the results. */
  char trashed[SESSION_ID_LEN + 1];
  assert_int_equal(session_trash_first(st, trashed, &f), MUSTER_OK);
  assert_string_equal(trashed, id);
  assert_int_equal(reaper_turns(id), 3);
  assert_int_equal(session_tasks(id), 0);
  assert_int_equal(rows("session_results", "session", id), 0);
  assert_int_equal(rows("session_trash", "session", id), 0);
  assert_counts_exact("q");
  leases = fixture_lease("q", 50);
  assert_int_equal(json_array_size(leases), 0);
  json_decref(leases);
  assert_true(before < after);

  /* Only outside a transaction does an empty trash clear the flag. */
  assert_int_equal(session_trash_first(st, trashed, &f), MUSTER_OK);
  assert_string_equal(trashed, "");
  assert_true(store_sessions_closing(st));
  store_request_end(st, true);
  assert_int_equal(store_commit(st, &f), MUSTER_OK);
  assert_int_equal(session_trash_first(st, trashed, &f), MUSTER_OK);
  assert_false(store_sessions_closing(st));
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  /* A small session still goes whole, with counted numbers. */
  open_session("q", 60000, sid);
  submit_many(sid, 3);
  r = session_close(st, sid, "by its client", &f);
  assert_non_null(r);
  assert_int_equal(jint(r, "cancelled"), 3);
  assert_int_equal(jint(r, "deleted"), 3);
  json_decref(r);
  assert_false(store_sessions_closing(st));
}

/* Sessions expiring together share one chunk. */
static void test_expiry_shares_a_chunk(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char a[SESSION_ID_LEN + 1], b[SESSION_ID_LEN + 1];
  open_session("q", 100, a);
  open_session("q", 100, b);
  submit_many(a, QUEUE_CHUNK + 10);
  submit_many(b, QUEUE_CHUNK + 10);
  assert_int_equal(session_expire_due(st, now_ms() + 10000, NULL, NULL), 2);
  assert_int_equal(session_tasks(a) + session_tasks(b), QUEUE_CHUNK + 20);
  json_t *leases = fixture_lease("q", 10);
  assert_int_equal(json_array_size(leases), 0);
  json_decref(leases);
  reaper_turns(a);
  reaper_turns(b);
  assert_int_equal(session_tasks(a) + session_tasks(b), 0);
  assert_counts_exact("q");
}

/* A closed session's row is kept for SESSION_KEEP_CLOSED_MS, to say why a
 * late call is refused, and then forgotten by the expiry sweep; one whose
 * tasks the reaper is still deleting stays until they are gone. */
static void test_closed_sessions_are_forgotten(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char small[SESSION_ID_LEN + 1], big[SESSION_ID_LEN + 1], open[SESSION_ID_LEN + 1];
  open_session("q", 60000, small);
  open_session("q", 60000, big);
  open_session("q", 3 * SESSION_KEEP_CLOSED_MS, open);
  submit_many(small, 3);
  submit_many(big, QUEUE_CHUNK + 10);
  fail_t f = {0};
  json_decref(session_close(st, small, "by its client", &f));
  json_decref(session_close(st, big, "by its client", &f));
  int64_t later = now_ms() + SESSION_KEEP_CLOSED_MS;
  assert_false(session_any_due(st, later - 60000)); /* a day not yet over: kept */
  assert_int_equal(session_expire_due(st, later - 60000, NULL, NULL), 0);
  assert_int_equal(rows("sessions", "id", small), 1);
  assert_true(session_any_due(st, later + 1000));
  assert_int_equal(session_expire_due(st, later + 1000, NULL, NULL), 0);
  assert_int_equal(rows("sessions", "id", small), 0);
  assert_int_equal(rows("sessions", "id", big), 1); /* its tasks are still being deleted */
  assert_int_equal(rows("sessions", "id", open), 1);
  reaper_turns(big);
  assert_int_equal(session_expire_due(st, later + 1000, NULL, NULL), 0);
  assert_int_equal(rows("sessions", "id", big), 0);
  assert_int_equal(rows("sessions", "id", open), 1);
  assert_false(session_any_due(st, later + 1000));
}

/* A queue deleted in chunks closes its session within one chunk too, also
 * for the session's tasks in the next stage. */
static void test_queue_delete_closes_within_a_chunk(void **unused) {
  (void)unused;
  make_queue("b", "{}");
  make_queue("a", "{\"next\": \"b\"}");
  char id[SESSION_ID_LEN + 1];
  open_session("a", 60000, id);
  const int64_t n = QUEUE_CHUNK + QUEUE_CHUNK / 2;
  submit_many(id, 2 * n);
  for (int64_t done = 0; done < n; done += TASK_MAX_BATCH) { /* n children in b */
    json_t *leases = fixture_lease("a", n - done < TASK_MAX_BATCH ? n - done : TASK_MAX_BATCH);
    complete_all(leases);
    json_decref(leases);
  }
  assert_int_equal(rows("tasks", "queue", "b"), n);
  int64_t tasks = 0, sessions = 0;
  bool pending = false;
  fail_t f = {0};
  assert_int_equal(queue_delete(st, "a", &tasks, &sessions, &pending, &f), MUSTER_OK);
  assert_true(pending);
  assert_int_equal(sessions, 1);
  assert_int_equal(session_tasks(id), 3 * n - QUEUE_CHUNK);
  json_t *leases = fixture_lease("b", 10);
  assert_int_equal(json_array_size(leases), 0);
  json_decref(leases);
  reaper_turns(id);
  assert_int_equal(session_tasks(id), 0);
  assert_counts_exact("b");
  for (bool finished = false; !finished;) { /* the queue's own trash */
    int64_t deleted = 0;
    assert_int_equal(queue_trash_step(st, "a", QUEUE_CHUNK, &deleted, &finished, &f), MUSTER_OK);
  }
  assert_int_equal(rows("tasks", "queue", "a"), 0);
}

/* What a big close leaves behind is out of the counts, and the writers that
 * take a queue's tasks in bulk keep it so: a requeue leaves a failed one
 * failed, a purge deletes queued ones without counting them, a deletion of
 * the queue goes to the trash, whose chunks take them. */
static void test_bulk_writers_skip_what_is_left(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  char id[SESSION_ID_LEN + 1];
  open_session("q", 60000, id);
  submit_many(id, 2 * QUEUE_CHUNK);
  int64_t last = query_int(store_db(st), "SELECT max(id) FROM tasks");
  char sql[96];
  snprintf(sql, sizeof sql, "UPDATE tasks SET state = 3 WHERE id = %lld", (long long)last);
  assert_int_equal(sqlite3_exec(store_db(st), sql, NULL, NULL, NULL), SQLITE_OK);
  fail_t f = {0};
  assert_int_equal(counts_move(st, "q", TASK_QUEUED, TASK_FAILED, 1, &f), MUSTER_OK);
  json_t *r = session_close(st, id, "by its client", &f);
  assert_non_null(r);
  json_decref(r);
  put_one("q", 0);
  assert_counts_exact("q");

  int64_t n = -1;
  assert_int_equal(queue_requeue(st, "q", &n, &f), MUSTER_OK);
  assert_int_equal(n, 0);
  assert_counts_exact("q");
  assert_int_equal(queue_purge(st, "q", &n, &f), MUSTER_OK);
  assert_int_equal(n, 1); /* the plain one */
  assert_counts_exact("q");
  int64_t tasks = -1, sessions = -1;
  bool pending = false;
  assert_int_equal(queue_delete(st, "q", &tasks, &sessions, &pending, &f), MUSTER_OK);
  assert_int_equal(tasks, 0);
  assert_true(pending); /* its failed task left behind goes in a chunk */
}

/* Puts `n` tasks carrying session `id` into `queue` with a plain put (which
 * may name any session), 1000 a request. */
static void put_in_session(const char *queue, const char *id, int64_t n) {
  for (int64_t first = 0; first < n; first += TASK_MAX_BATCH) {
    json_t *tasks = json_array();
    for (int64_t i = first; i < n && i < first + TASK_MAX_BATCH; i++)
      json_array_append_new(tasks,
                            json_pack("{s:I, s:s}", "payload", (json_int_t)i, "session", id));
    json_t *body = json_pack("{s:o}", "tasks", tasks);
    fail_t f = {0};
    json_t *out = task_put(st, queue, body, 1 << 20, &f);
    if (out == NULL)
      fail_msg("put: %s", f.message);
    json_decref(out);
    json_decref(body);
  }
}

/* The tasks a closed session left in a queue that then goes to the trash
 * (or that was there already when the session closed) are out of its counts
 * already: the trash's chunks delete them without counting them again, and
 * the counts stay exact between chunks until the last drops them.  Session
 * `a` streams from q and is closed before the deletion, `c` from q too and
 * closed by it; `b` streams from o and has tasks in q put by a plain put,
 * and closes while q is in the trash. */
static void test_trash_chunks_skip_what_is_left(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  make_queue("o", "{}");
  char a[SESSION_ID_LEN + 1], b[SESSION_ID_LEN + 1], c[SESSION_ID_LEN + 1];
  open_session("q", 60000, a);
  open_session("o", 60000, b);
  open_session("q", 60000, c);
  for (int i = 0; i < 5; i++)
    put_one("q", 10); /* ahead of the sessions' in lease order */
  submit_many(a, 2 * QUEUE_CHUNK);
  put_in_session("q", b, 2 * QUEUE_CHUNK);
  submit_many(c, QUEUE_CHUNK + QUEUE_CHUNK / 2);
  json_t *leases = fixture_lease("q", 8); /* the five plain ones and three of a's */
  json_t *done = json_array();
  for (size_t i = 3; i < 8; i++)
    json_array_append(done, json_array_get(leases, i));
  complete_all(done); /* two plain ones and a's three */
  json_decref(done);
  json_decref(leases);
  fail_t f = {0};
  json_t *r = session_close(st, a, "by its client", &f);
  assert_non_null(r);
  json_decref(r);
  assert_counts_exact("q");

  int64_t tasks = 0, sessions = 0;
  bool pending = false;
  assert_int_equal(queue_delete(st, "q", &tasks, &sessions, &pending, &f), MUSTER_OK);
  assert_true(pending);
  assert_int_equal(sessions, 1); /* c */
  assert_counts_exact("q");
  r = session_close(st, b, "by its client", &f); /* its tasks in the trash are left too */
  assert_non_null(r);
  assert_int_equal(jint(r, "deleted"), 2 * QUEUE_CHUNK);
  json_decref(r);
  assert_counts_exact("q");

  int chunks = 0;
  for (bool finished = false; !finished; chunks++) {
    int64_t deleted = 0;
    assert_true(chunks < 10);
    assert_int_equal(queue_trash_step(st, "q", QUEUE_CHUNK, &deleted, &finished, &f), MUSTER_OK);
    if (!finished)
      assert_counts_exact("q");
  }
  assert_true(chunks >= 3);
  assert_int_equal(rows("tasks", "queue", "q"), 0);
  assert_int_equal(rows("queue_counts", "queue", "q"), 0);
  /* A queue of that name starts from nothing; the sessions' deletions
   * find their tasks in q gone and move no counts. */
  make_queue("q", "{}");
  reaper_turns(a);
  reaper_turns(b);
  reaper_turns(c);
  assert_counts_exact("q");
  int64_t kept[TASK_STATE_COUNT];
  assert_int_equal(counts_read(st, "q", kept, &f), MUSTER_OK);
  for (int state = 0; state < TASK_STATE_COUNT; state++)
    assert_int_equal(kept[state], 0);
}

/* Above QUEUE_READY_SCAN queued tasks the ready count takes those beyond
 * the tasks it looks at from the kept counts: with a closed session's tasks
 * among those looked at, it still counts the others exactly. */
static void test_ready_count_past_what_is_left(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  for (int i = 0; i < 5; i++)
    put_one("q", 10); /* ahead of the session's in lease order */
  char id[SESSION_ID_LEN + 1];
  open_session("q", 60000, id);
  submit_many(id, QUEUE_CHUNK + QUEUE_READY_SCAN);
  fail_t f = {0};
  json_t *r = session_close(st, id, "by its client", &f);
  assert_non_null(r);
  json_decref(r);
  for (int i = 0; i < 3; i++)
    put_one("q", 0); /* behind them, beyond what the count looks at */
  int64_t ready = -1;
  assert_int_equal(queue_count_ready(st, "q", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 8);

  /* With none ahead, the count steps over the session's tasks to the three
   * behind them, as a lease does, long before the chunks go past them. */
  make_queue("behind", "{}");
  open_session("behind", 60000, id);
  submit_many(id, QUEUE_CHUNK + 3 * QUEUE_READY_SCAN + 10);
  r = session_close(st, id, "by its client", &f);
  assert_non_null(r);
  json_decref(r);
  for (int i = 0; i < 3; i++)
    put_one("behind", 0);
  assert_int_equal(queue_count_ready(st, "behind", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 3);
  json_t *leases = fixture_lease("behind", 3);
  assert_int_equal(json_array_size(leases), 3);
  json_decref(leases);
  assert_int_equal(queue_count_ready(st, "behind", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 0);
  reaper_turns(id);
  assert_int_equal(queue_count_ready(st, "behind", &ready, &f), MUSTER_OK);
  assert_int_equal(ready, 0);
}

#define LIST_MAX 8

/* The tasks of `queue` in `state` (-1: all) that pages of 10 list, into
 * ids[LIST_MAX] (*n); returns the number of pages. */
static int list_all(const char *queue, int state, int64_t *ids, size_t *n) {
  int pages = 0;
  *n = 0;
  for (int64_t after = 0; after >= 0; pages++) {
    fail_t f = {0};
    json_t *page = tree_of(task_list_as(st, queue, state, after, 10, true, &f));
    assert_non_null(page);
    const json_t *tasks = json_object_get(page, "tasks");
    for (size_t i = 0; i < json_array_size(tasks); i++) {
      assert_true(*n < LIST_MAX);
      ids[(*n)++] = jint(json_array_get(tasks, i), "id");
    }
    const json_t *next = json_object_get(page, "next");
    after = json_is_integer(next) ? json_integer_value(next) : -1;
    json_decref(page);
  }
  return pages;
}

/* Listings skip what a closed session left: a listing of all states a
 * bounded number of them per page (10000, task.c), a page past that many
 * ending early with a `next`; a queued listing steps over them, its pages
 * full whatever was left before them (leftover.h). */
static void test_listings_skip_what_is_left(void **unused) {
  (void)unused;
  make_queue("q", "{}");
  int64_t before = put_one("q", 0);
  char id[SESSION_ID_LEN + 1];
  open_session("q", 60000, id);
  submit_many(id, QUEUE_CHUNK + 10000 + 5);
  fail_t f = {0};
  json_t *r = session_close(st, id, "by its client", &f);
  assert_non_null(r);
  json_decref(r);
  int64_t after = put_one("q", 0), ids[LIST_MAX];
  size_t n = 0;
  assert_int_equal(list_all("q", -1, ids, &n), 2);
  assert_int_equal(n, 2);
  assert_int_equal(ids[0], before);
  assert_int_equal(ids[1], after);
  assert_int_equal(list_all("q", TASK_QUEUED, ids, &n), 1);
  assert_int_equal(n, 2);
  assert_int_equal(ids[0], before);
  assert_int_equal(ids[1], after);
}

/* Fills queue `name` with `done` done tasks, then (when `left` is 0 or
 * more) a session of QUEUE_CHUNK + `left` tasks, closed (`left` of them
 * left to the background deletion), then queued tasks of the priorities in
 * prio[0..n), whose ids go to ids[]. */
static void fill_behind_done(const char *name, int64_t done, int64_t left, const int64_t *prio,
                             size_t n, int64_t *ids) {
  make_queue(name, "{}");
  int64_t first = put_one(name, 0);
  for (int64_t i = 1; i < done; i++)
    put_one(name, 0);
  char sql[160];
  snprintf(sql, sizeof sql, "UPDATE tasks SET state = 2 WHERE queue = '%s' AND id >= %lld", name,
           (long long)first);
  exec_sql(store_db(st), sql);
  fail_t f = {0};
  assert_int_equal(counts_move(st, name, TASK_QUEUED, TASK_DONE, done, &f), MUSTER_OK);
  char id[SESSION_ID_LEN + 1];
  if (left >= 0) {
    open_session(name, 60000, id);
    submit_many(id, QUEUE_CHUNK + left);
    json_t *r = session_close(st, id, "by its client", &f);
    assert_non_null(r);
    json_decref(r);
  }
  for (size_t i = 0; i < n; i++)
    ids[i] = put_one(name, prio[i]);
}

#define QUEUED_MAX 24
/* The listing statement that reads tasks_ready a priority at a time (task.c). */
#define BY_PRIORITY_SQL "t.priority = p.v"
/* The one that reads a stretch of it between what closed sessions left. */
#define WALKED_SQL "SELECT id FROM tasks INDEXED BY tasks_ready"

/* The work of listing the queued tasks of `queue` in pages of 2 (and that
 * they are want[0..n), in id order; n up to QUEUED_MAX). */
static int64_t list_queued_work(const char *queue, const int64_t *want, size_t n) {
  int64_t ids[QUEUED_MAX], before = stmt_steps();
  size_t got = 0;
  for (int64_t after = 0; after >= 0;) {
    fail_t f = {0};
    json_t *page = tree_of(task_list_as(st, queue, TASK_QUEUED, after, 2, true, &f));
    assert_non_null(page);
    const json_t *tasks = json_object_get(page, "tasks");
    for (size_t i = 0; i < json_array_size(tasks); i++) {
      assert_true(got < QUEUED_MAX);
      ids[got++] = jint(json_array_get(tasks, i), "id");
    }
    const json_t *next = json_object_get(page, "next");
    after = json_is_integer(next) ? json_integer_value(next) : -1;
    json_decref(page);
  }
  assert_int_equal(got, n);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(ids[i], want[i]);
  return stmt_steps() - before;
}

/* The work of listing the queued tasks of two queues filled alike but for
 * 10 or 20000 done tasks first; fails when the second's is above twice the
 * first's. */
static void assert_listing_past_done(const char *few, const char *many, int64_t left,
                                     const int64_t *prio, size_t n) {
  int64_t ids_few[QUEUED_MAX], ids_many[QUEUED_MAX];
  fill_behind_done(few, 10, left, prio, n, ids_few);
  fill_behind_done(many, 20000, left, prio, n, ids_many);
  int64_t work_few = list_queued_work(few, ids_few, n);
  int64_t work_many = list_queued_work(many, ids_many, n);
  if (work_many > 2 * work_few)
    fail_msg("listing %zu queued tasks behind 20000 done ones took %lld steps, behind 10 %lld", n,
             (long long)work_many, (long long)work_few);
}

/* A queued listing of a sparse queue reads tasks_ready a priority at a
 * time, in id order: its work does not grow with the queue's done tasks,
 * which come first in id order.  A queue holding what a closed session
 * left is walked past it, whatever the number of distinct priorities (24
 * here, past what the other form seeks one by one), also without reading
 * the done tasks. */
static void test_queued_listing_past_done_tasks(void **unused) {
  (void)unused;
  const int64_t prio[] = {0, 7, 3, 7, 0};
  int runs = stmt_runs(BY_PRIORITY_SQL);
  assert_listing_past_done("few", "many", -1, prio, 5);
  assert_true(stmt_runs(BY_PRIORITY_SQL) > runs);
  int64_t spread[QUEUED_MAX];
  for (size_t i = 0; i < QUEUED_MAX; i++)
    spread[i] = (int64_t)(i * 7 % QUEUED_MAX) - 10; /* distinct, negative ones too */
  runs = stmt_runs(BY_PRIORITY_SQL);
  int walked = stmt_runs(WALKED_SQL);
  assert_listing_past_done("left_few", "left_many", 20, spread, QUEUED_MAX);
  assert_int_equal(stmt_runs(BY_PRIORITY_SQL), runs);
  assert_true(stmt_runs(WALKED_SQL) > walked);
}

/* A store whose sessions were closed before a close took its leftovers out
 * of the counts (schema version 18): the migration takes them out, those up
 * to each session's horizon only. */
static void test_migration_takes_left_tasks_out(void **unused) {
  (void)unused;
  char dir[] = "/tmp/muster-test-session-close.XXXXXX", path[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = 18}, &f);
  assert_non_null(st);
  sqlite3 *db = store_db(st);
  /* Session s: ids 1 to 3 queued, 4 and 5 done, all left behind (horizon 5);
   * 6 plain, 7 of s but put after its close; all of them in the counts. */
  exec_sql(db, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 7)"
               " INSERT INTO tasks(id, queue, state, priority, run_at_ms, payload, created_ms,"
               " updated_ms, session, idx) SELECT i, 'q', CASE WHEN i IN (4, 5) THEN 2 ELSE 0"
               " END, 0, 0, 'null', 0, 0, CASE WHEN i = 6 THEN NULL ELSE 's' END, i FROM n");
  exec_sql(db, "INSERT INTO queue_counts(queue, state, n) VALUES('q', 0, 5), ('q', 2, 2),"
               " ('other', 0, 4)");
  exec_sql(db, "INSERT INTO session_trash(session, horizon, closed_ms) VALUES('s', 5, 0)");
  store_close(st);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  db = store_db(st);
  assert_int_equal(query_int(db, "SELECT n FROM queue_counts WHERE queue = 'q' AND state = 0"), 2);
  assert_int_equal(query_int(db, "SELECT n FROM queue_counts WHERE queue = 'q' AND state = 2"), 0);
  assert_int_equal(query_int(db, "SELECT n FROM queue_counts WHERE queue = 'other'"), 4);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK); /* as fixture_close expects */
  fixture_close();
  fixture_remove_store_files(dir, path);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_big_close_goes_in_chunks, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_expiry_shares_a_chunk, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_closed_sessions_are_forgotten, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_queue_delete_closes_within_a_chunk, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_bulk_writers_skip_what_is_left, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_trash_chunks_skip_what_is_left, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_ready_count_past_what_is_left, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_listings_skip_what_is_left, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_queued_listing_past_done_tasks, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test(test_migration_takes_left_tasks_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
