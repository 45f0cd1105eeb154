/*
 * test_session.c — unit tests of sessions (indexes, results streams,
 * exactly-once, close, expiry), broadcast updates (numbering, delivery with
 * leases, deletion) and nodes (re-register, leave, timeout) against an
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

#include "server/jw.h"
#include "server/lease.h"
#include "server/log.h"
#include "server/node.h"
#include "server/queue.h"
#include "server/session.h"
#include "server/task.h"
#include "server/update.h"
#include "server/worker.h"
#include "store_fixture.h"

static int notified;         /* store_notify_session calls */
static char notified_id[64]; /* the last session notified */

static void on_session(void *arg, const char *session) {
  notified++;
  snprintf(notified_id, sizeof notified_id, "%s", session);
}

static int setup(void **state) {
  if (fixture_open() != 0)
    return -1;
  store_set_hooks(st, NULL, NULL, NULL);
  store_set_session_hook(st, on_session);
  notified = 0;
  notified_id[0] = '\0';
  return 0;
}

static void open_session(const char *queue, const char *extra, char *id) {
  char text[256];
  snprintf(text, sizeof text, "{\"queue\": \"%s\"%s}", queue, extra ? extra : "");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *s = session_create(st, body, 1 << 20, &f);
  assert_non_null(s);
  snprintf(id, SESSION_ID_LEN + 1, "%s", json_string_value(json_object_get(s, "id")));
  assert_int_equal(strlen(id), SESSION_ID_LEN);
  json_decref(s);
  json_decref(body);
}

/* Submits `tasks_json` (the array) and returns the error code; *out gets the reply. */
static muster_err_t submit(const char *id, const char *tasks_json, json_t **out) {
  char text[1024];
  snprintf(text, sizeof text, "{\"tasks\": %s}", tasks_json);
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *r = session_submit(st, id, body, 1 << 20, &f);
  json_decref(body);
  if (out)
    *out = r ? reply_tree(r) : NULL; /* "tasks" is a raw node */
  json_decref(r);
  return r ? MUSTER_OK : f.code;
}

/* session_submit_scanned of `text`, a whole body the scanner must take;
 * returns the error code, *out gets the reply as a client reads it and
 * *message the error's message. */
static muster_err_t submit_scanned(const char *id, const char *text, json_t **out, char *message,
                                   size_t size) {
  jscan_body_t body;
  assert_true(jscan_body(&session_submit_shape, text, strlen(text), 1 << 20, &body));
  fail_t f = {0};
  json_t *r = session_submit_scanned(st, id, &body, &f);
  jscan_body_free(&body);
  if (out)
    *out = r ? reply_tree(r) : NULL;
  if (message)
    snprintf(message, size, "%s", r ? "" : f.message);
  json_decref(r);
  return r ? MUSTER_OK : f.code;
}

/* A body of `n` tasks with payloads "p<first>"... and, when `indexed`,
 * indexes first, first+1, ... (a pool's batch), as compact JSON. */
static char *batch_text(int64_t first, int n, bool indexed) {
  size_t size = 32 + (size_t)n * 64, len = 0;
  char *text = malloc(size);
  assert_non_null(text);
  len += (size_t)snprintf(text + len, size - len, "{\"tasks\":[");
  for (int i = 0; i < n; i++) {
    len += (size_t)snprintf(text + len, size - len, "%s{\"payload\":\"p%lld\"", i ? "," : "",
                            (long long)(first + i));
    if (indexed)
      len += (size_t)snprintf(text + len, size - len, ",\"index\":%lld", (long long)(first + i));
    len += (size_t)snprintf(text + len, size - len, "}");
  }
  snprintf(text + len, size - len, "]}");
  return text;
}

static muster_err_t apply(lease_op_t op, const json_t *l, const char *extra) {
  char text[512];
  snprintf(text, sizeof text, "{\"leases\": [{\"task\": %lld, \"token\": %lld%s}]}",
           (long long)jint(l, "task"), (long long)jint(l, "token"), extra ? extra : "");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = lease_apply(st, op, body, 1 << 20, &f);
  json_decref(out);
  json_decref(body);
  return out ? MUSTER_OK : f.code;
}

/* The lease of `leases` at session index `index`. */
static const json_t *at_index(const json_t *leases, int64_t index) {
  for (size_t i = 0; i < json_array_size(leases); i++)
    if (jint(json_array_get(leases, i), "index") == index)
      return json_array_get(leases, i);
  fail_msg("no lease at index %lld", (long long)index);
  return NULL;
}

/* A page of session `id`'s results as the route writes it, its text into
 * `text` (the caller frees it). */
static void results_text(const char *id, session_order_t order, int64_t cursor, int64_t max,
                         bool empty_waits, session_read_t *rd, jw_buf_t *text) {
  fail_t f = {0};
  *text = (jw_buf_t){0};
  assert_int_equal(session_results_text(st, id, order, cursor, max, empty_waits, rd, text, &f),
                   MUSTER_OK);
}

/* results_text's page parsed (new reference). */
static json_t *results_of(const char *id, session_order_t order, int64_t cursor, int64_t max,
                          bool empty_waits, session_read_t *rd) {
  jw_buf_t text;
  results_text(id, order, cursor, max, empty_waits, rd, &text);
  return text_tree(&text);
}

/* Reads results; returns the indexes in order as "0,1,2" in `buf`, and the cursor. */
static int64_t read_results(const char *id, session_order_t order, int64_t cursor, int64_t max,
                            char *buf, size_t size) {
  session_read_t rd;
  json_t *r = results_of(id, order, cursor, max, false, &rd);
  json_t *list = json_object_get(r, "results");
  assert_int_equal(rd.count, json_array_size(list));
  buf[0] = '\0';
  for (size_t i = 0; i < rd.count; i++) {
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "%s%lld", i ? "," : "",
             (long long)jint(json_array_get(list, i), "index"));
  }
  int64_t next = jint(r, "cursor");
  json_decref(r);
  return next;
}

static void test_indexes(void **unused) {
  make_queue("q", "{}");
  char id[SESSION_ID_LEN + 1];
  open_session("q", NULL, id);
  json_t *r = NULL;
  assert_int_equal(submit(id,
                          "[{\"payload\": 1}, {\"payload\": 2, \"index\": 9},"
                          " {\"payload\": 3}, {\"payload\": 4, \"index\": 4}]",
                          &r),
                   MUSTER_OK);
  json_t *tasks = json_object_get(r, "tasks");
  assert_int_equal(jint(json_array_get(tasks, 0), "index"), 0);
  assert_int_equal(jint(json_array_get(tasks, 1), "index"), 9);
  assert_int_equal(jint(json_array_get(tasks, 2), "index"), 10);
  assert_int_equal(jint(json_array_get(tasks, 3), "index"), 4);
  json_decref(r);
  /* Conflicts: with an earlier task, and within one batch. */
  assert_int_equal(submit(id, "[{\"payload\": 5, \"index\": 4}]", NULL), MUSTER_INVALID_STATE);
  assert_int_equal(
      submit(id, "[{\"payload\": 5, \"index\": 20}, {\"payload\": 6, \"index\": 20}]", NULL),
      MUSTER_INVALID_STATE);
  assert_int_equal(submit(id, "[{\"payload\": 5, \"key\": \"k\"}]", NULL), MUSTER_INVALID);
  assert_int_equal(submit("s-nope", "[{\"payload\": 5}]", NULL), MUSTER_SESSION_NOT_FOUND);
  fail_t f = {0};
  json_t *s = session_get(st, id, &f);
  assert_non_null(s);
  /* The refused second batch inserted index 20 before failing; the route
   * layer's savepoint undoes it, which this test does not run.  Only the
   * counters of accepted batches count. */
  assert_int_equal(jint(json_object_get(s, "counts"), "total"), 4);
  json_decref(s);
}

/* The multi-row path of a submit (a batch without required shared data whose
 * indexes strictly increase), from a tree and from scanned text: ids, the
 * stored rows, and the same refusals as the row-by-row path, whose message
 * names the first task whose index is in use. */
static void test_submit_batches(void **unused) {
  make_queue("q", "{}");
  char id[SESSION_ID_LEN + 1], message[sizeof((fail_t){0}.message)], expected[256];
  open_session("q", NULL, id);
  /* A pool's batch, scanned: 100 tasks at indexes 0..99, inserted by chunks
   * of 64, 32 and 4 rows, its indexes checked with one range query. */
  int chunks = stmt_runs("created_ms, updated_ms) VALUES(?3 + 0, ?1, 0, ?4"),
      one_by_one = stmt_runs("created_ms, updated_ms) VALUES(?10, ?1, 0, ?2"),
      ranges = stmt_runs("AND idx BETWEEN"), lookups = stmt_runs("AND idx = ?3");
  char *text = batch_text(0, 100, true);
  json_t *r = NULL;
  assert_int_equal(submit_scanned(id, text, &r, NULL, 0), MUSTER_OK);
  free(text);
  assert_int_equal(stmt_runs("created_ms, updated_ms) VALUES(?3 + 0, ?1, 0, ?4"), chunks + 3);
  assert_int_equal(stmt_runs("created_ms, updated_ms) VALUES(?10, ?1, 0, ?2"), one_by_one);
  assert_int_equal(stmt_runs("AND idx BETWEEN"), ranges + 1);
  assert_int_equal(stmt_runs("AND idx = ?3"), lookups);
  json_t *tasks = json_object_get(r, "tasks");
  assert_int_equal(json_array_size(tasks), 100);
  int64_t first = jint(json_array_get(tasks, 0), "id");
  for (size_t i = 0; i < 100; i++) {
    assert_int_equal(jint(json_array_get(tasks, i), "id"), first + (int64_t)i);
    assert_int_equal(jint(json_array_get(tasks, i), "index"), (int64_t)i);
  }
  json_decref(r);
  fail_t f = {0};
  json_t *t = tree_of(task_get(st, first + 57, &f));
  assert_non_null(t);
  assert_string_equal(json_string_value(json_object_get(t, "payload")), "p57");
  assert_string_equal(json_string_value(json_object_get(t, "session")), id);
  assert_int_equal(jint(t, "index"), 57);
  json_decref(t);
  /* From a tree, automatic: 100..149 follow next_index. */
  text = batch_text(100, 50, false);
  char *tasks_json = strchr(text, '[');
  tasks_json[strlen(tasks_json) - 1] = '\0'; /* the array alone */
  assert_int_equal(submit(id, tasks_json, &r), MUSTER_OK);
  free(text);
  assert_int_equal(jint(json_array_get(json_object_get(r, "tasks"), 49), "index"), 149);
  json_decref(r);
  /* A consecutive run that overlaps: one range query finds it, and the
   * message names the first task whose index is in use. */
  text = batch_text(140, 20, true);
  assert_int_equal(submit_scanned(id, text, NULL, message, sizeof message), MUSTER_INVALID_STATE);
  free(text);
  snprintf(expected, sizeof expected, "tasks[0].index: 140 is already in use in session %s", id);
  assert_string_equal(message, expected);
  text = batch_text(145, 10, true);
  assert_int_equal(submit_scanned(id, text, NULL, message, sizeof message), MUSTER_INVALID_STATE);
  free(text);
  snprintf(expected, sizeof expected, "tasks[0].index: 145 is already in use in session %s", id);
  assert_string_equal(message, expected);
  /* Increasing but not consecutive around a used index: checked one by one,
   * and 300 and 302 are free although 301 is taken. */
  assert_int_equal(submit(id, "[{\"payload\": 1, \"index\": 301}]", NULL), MUSTER_OK);
  assert_int_equal(
      submit(id, "[{\"payload\": 1, \"index\": 300}, {\"payload\": 2, \"index\": 302}]", NULL),
      MUSTER_OK);
  assert_int_equal(submit_scanned(id,
                                  "{\"tasks\":[{\"payload\":1,\"index\":299},"
                                  "{\"payload\":2,\"index\":301}]}",
                                  NULL, message, sizeof message),
                   MUSTER_INVALID_STATE);
  snprintf(expected, sizeof expected, "tasks[1].index: 301 is already in use in session %s", id);
  assert_string_equal(message, expected);
  /* An automatic index after explicit ones continues past them. */
  assert_int_equal(submit_scanned(id, "{\"tasks\":[{\"payload\":1,\"index\":400},{\"payload\":2}]}",
                                  &r, NULL, 0),
                   MUSTER_OK);
  assert_int_equal(jint(json_array_get(json_object_get(r, "tasks"), 1), "index"), 401);
  json_decref(r);
  json_t *s = session_get(st, id, &f);
  assert_non_null(s);
  assert_int_equal(jint(s, "next_index"), 402);
  /* Refused batches are not counted (their rows were never inserted). */
  assert_int_equal(jint(json_object_get(s, "counts"), "total"), 100 + 50 + 1 + 2 + 2);
  json_decref(s);
  assert_null(session_submit_scanned(st, "s-nope", &(jscan_body_t){0}, &f));
  assert_int_equal(f.code, MUSTER_SESSION_NOT_FOUND);
}

static void test_streams_and_exactly_once(void **unused) {
  make_queue("q", "{\"lease_ms\": 60000}");
  char id[SESSION_ID_LEN + 1], buf[256];
  open_session("q", NULL, id);
  assert_int_equal(submit(id,
                          "[{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2},"
                          " {\"payload\": 3}]",
                          NULL),
                   MUSTER_OK);
  json_t *leases = fixture_lease("q", 4);
  assert_int_equal(json_array_size(leases), 4);
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 2), ", \"result\": \"two\""), MUSTER_OK);
  assert_int_equal(notified, 1);
  assert_string_equal(notified_id, id);
  assert_int_equal(read_results(id, SESSION_BY_SUBMISSION, 0, 100, buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 0), NULL), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, at_index(leases, 1), ", \"permanent\": true"), MUSTER_OK);
  assert_int_equal(read_results(id, SESSION_BY_SUBMISSION, 0, 100, buf, sizeof buf), 3);
  assert_string_equal(buf, "0,1,2");
  assert_int_equal(read_results(id, SESSION_BY_SUBMISSION, 1, 1, buf, sizeof buf), 2);
  assert_string_equal(buf, "1");
  assert_int_equal(read_results(id, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 3);
  assert_string_equal(buf, "2,0,1");
  assert_int_equal(read_results(id, SESSION_BY_COMPLETION, 1, 1, buf, sizeof buf), 2);
  assert_string_equal(buf, "0");
  /* Completing again under the completing token is a repeat that records
   * nothing; recording twice changes nothing either. */
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 2), NULL), MUSTER_OK);
  fail_t f = {0};
  assert_int_equal(session_record_result(st, jint(at_index(leases, 2), "task"), &f), MUSTER_OK);
  assert_int_equal(read_results(id, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 3);
  assert_int_equal(notified, 3);
  json_t *s = session_get(st, id, &f);
  json_t *counts = json_object_get(s, "counts");
  assert_int_equal(jint(counts, "total"), 4);
  assert_int_equal(jint(counts, "done"), 2);
  assert_int_equal(jint(counts, "failed"), 1);
  assert_int_equal(jint(counts, "pending"), 1);
  json_decref(s);
  json_decref(leases);
}

/* Completes the leases of `leases` at `indexes` (n of them) in one request. */
static muster_err_t complete_batch(const json_t *leases, const int64_t *indexes, size_t n) {
  char text[2048];
  size_t len = (size_t)snprintf(text, sizeof text, "{\"leases\": [");
  for (size_t i = 0; i < n; i++) {
    const json_t *l = at_index(leases, indexes[i]);
    len += (size_t)snprintf(text + len, sizeof text - len,
                            "%s{\"task\": %lld, \"token\": %lld, \"result\": %lld}", i ? ", " : "",
                            (long long)jint(l, "task"), (long long)jint(l, "token"),
                            (long long)indexes[i]);
  }
  snprintf(text + len, sizeof text - len, "]}");
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  json_decref(out);
  json_decref(body);
  return out ? MUSTER_OK : f.code;
}

/* A batch of completions records its session results in its order, with one
 * write of the session (one notification) per run of tasks of one session;
 * tasks of another session or of none in between start a new run. */
static void test_batch_results(void **unused) {
  make_queue("q", "{\"lease_ms\": 60000}");
  char a[SESSION_ID_LEN + 1], b[SESSION_ID_LEN + 1], buf[256];
  open_session("q", NULL, a);
  open_session("q", NULL, b);
  assert_int_equal(submit(a,
                          "[{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2},"
                          " {\"payload\": 3}, {\"payload\": 4}, {\"payload\": 5}]",
                          NULL),
                   MUSTER_OK);
  json_t *leases = fixture_lease("q", 6);
  assert_int_equal(notified, 0);
  int64_t first[] = {3, 1, 4};
  assert_int_equal(complete_batch(leases, first, 3), MUSTER_OK);
  assert_int_equal(notified, 1);
  assert_string_equal(notified_id, a);
  assert_int_equal(read_results(a, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 3);
  assert_string_equal(buf, "3,1,4");
  assert_int_equal(read_results(a, SESSION_BY_SUBMISSION, 0, 100, buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  /* Session b's task and a task of no session between a's. */
  assert_int_equal(submit(b, "[{\"payload\": \"b0\"}]", NULL), MUSTER_OK);
  fail_t f = {0};
  json_t *plain = parse("{\"tasks\": [{\"payload\": \"none\"}]}");
  json_decref(task_put(st, "q", plain, 1 << 20, &f));
  json_decref(plain);
  json_t *more = fixture_lease("q", 2);
  assert_int_equal(json_array_size(more), 2);
  char text[1024];
  const json_t *l0 = at_index(leases, 0), *l5 = at_index(leases, 5);
  const json_t *m0 = json_array_get(more, 0), *m1 = json_array_get(more, 1);
  snprintf(text, sizeof text,
           "{\"leases\": [{\"task\": %lld, \"token\": %lld, \"result\": 0},"
           " {\"task\": %lld, \"token\": %lld, \"result\": 1},"
           " {\"task\": %lld, \"token\": %lld, \"result\": 2},"
           " {\"task\": %lld, \"token\": %lld, \"result\": 5}]}",
           (long long)jint(l0, "task"), (long long)jint(l0, "token"), (long long)jint(m0, "task"),
           (long long)jint(m0, "token"), (long long)jint(m1, "task"), (long long)jint(m1, "token"),
           (long long)jint(l5, "task"), (long long)jint(l5, "token"));
  json_t *body = parse(text);
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  assert_non_null(out);
  json_decref(out);
  json_decref(body);
  assert_int_equal(notified, 4); /* a, then b, then a again */
  assert_int_equal(read_results(a, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 5);
  assert_string_equal(buf, "3,1,4,0,5");
  assert_int_equal(read_results(a, SESSION_BY_SUBMISSION, 0, 100, buf, sizeof buf), 2);
  assert_string_equal(buf, "0,1");
  assert_int_equal(read_results(b, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 1);
  assert_string_equal(buf, "0");
  json_t *s = session_get(st, a, &f);
  assert_int_equal(jint(json_object_get(s, "counts"), "done"), 5);
  assert_int_equal(jint(json_object_get(s, "counts"), "pending"), 1);
  json_decref(s);
  json_decref(more);
  json_decref(leases);
}

/* A read in submission order from `cursor` (at most `max`; `empty_waits` as
 * a parked reader reads) summed up in `buf`: the indexes read, the next
 * cursor, the gap and whether stalled, e.g. "0 c1 gap1-4" or "- c1 gap1-4
 * stalled". */
static const char *read_summary(const char *id, int64_t cursor, int64_t max, bool empty_waits,
                                char *buf, size_t size) {
  session_read_t rd;
  json_t *r = results_of(id, SESSION_BY_SUBMISSION, cursor, max, empty_waits, &rd);
  json_t *list = json_object_get(r, "results"), *gap = json_object_get(r, "gap");
  assert_non_null(gap); /* always there, null when there is none */
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < rd.count; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? "," : "",
                            (long long)jint(json_array_get(list, i), "index"));
  len += (size_t)snprintf(buf + len, size - len, "%s c%lld", rd.count ? "" : "-",
                          (long long)jint(r, "cursor"));
  if (json_is_object(gap))
    len += (size_t)snprintf(buf + len, size - len, " gap%lld-%lld", (long long)jint(gap, "first"),
                            (long long)jint(gap, "last"));
  snprintf(buf + len, size - len, "%s", rd.stalled ? " stalled" : "");
  json_decref(r);
  return buf;
}

/* Explicit indexes 0 and 5 leave 1..4 without a task: the submission
 * stream stops at 1 and says so; it is stalled once 0 and 5 have their
 * results.  A task submitted later into the gap narrows it and is read in
 * its place, once.  The completion stream has no gaps. */
static void test_gaps(void **unused) {
  make_queue("q", "{\"lease_ms\": 60000}");
  char id[SESSION_ID_LEN + 1], buf[128];
  open_session("q", NULL, id);
  assert_int_equal(submit(id, "[{\"payload\": 0}, {\"payload\": 5, \"index\": 5}]", NULL),
                   MUSTER_OK);
  json_t *leases = fixture_lease("q", 2);
  assert_string_equal(read_summary(id, 0, 100, false, buf, sizeof buf), "- c0");
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 0), NULL), MUSTER_OK);
  assert_string_equal(read_summary(id, 0, 100, false, buf, sizeof buf), "0 c1 gap1-4");
  /* A full page did not stop: nothing is said about what follows. */
  assert_string_equal(read_summary(id, 0, 1, false, buf, sizeof buf), "0 c1");
  assert_string_equal(read_summary(id, 1, 100, false, buf, sizeof buf), "- c1 gap1-4");
  /* A parked reader's empty read looks for no gap while 5 is unfinished. */
  assert_string_equal(read_summary(id, 1, 100, true, buf, sizeof buf), "- c1");
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 5), NULL), MUSTER_OK);
  assert_string_equal(read_summary(id, 1, 100, true, buf, sizeof buf), "- c1 gap1-4 stalled");
  assert_string_equal(read_summary(id, 0, 100, false, buf, sizeof buf), "0 c1 gap1-4 stalled");
  assert_string_equal(read_summary(id, 5, 100, false, buf, sizeof buf), "5 c6");
  assert_string_equal(read_summary(id, 6, 100, true, buf, sizeof buf), "- c6");
  /* Filling index 2: 1 is still a gap, 2 waits for its task, 3-4 are a gap. */
  assert_int_equal(submit(id, "[{\"payload\": 2, \"index\": 2}]", NULL), MUSTER_OK);
  assert_string_equal(read_summary(id, 1, 100, false, buf, sizeof buf), "- c1 gap1-1");
  assert_string_equal(read_summary(id, 2, 100, false, buf, sizeof buf), "- c2");
  json_t *more = fixture_lease("q", 1);
  assert_int_equal(apply(LEASE_COMPLETE, json_array_get(more, 0), NULL), MUSTER_OK);
  assert_string_equal(read_summary(id, 1, 100, true, buf, sizeof buf), "- c1 gap1-1 stalled");
  assert_string_equal(read_summary(id, 2, 100, false, buf, sizeof buf), "2 c3 gap3-4 stalled");
  assert_int_equal(read_results(id, SESSION_BY_COMPLETION, 0, 100, buf, sizeof buf), 3);
  assert_string_equal(buf, "0,5,2");
  session_read_t rd;
  json_t *out = results_of(id, SESSION_BY_COMPLETION, 0, 100, false, &rd);
  assert_true(json_is_null(json_object_get(out, "gap")));
  assert_false(rd.stalled);
  json_decref(out);
  json_decref(more);
  json_decref(leases);
}

static void test_dead_is_a_result(void **unused) {
  make_queue("q", "{\"max_attempts\": 1}");
  char id[SESSION_ID_LEN + 1], buf[64];
  open_session("q", NULL, id);
  assert_int_equal(submit(id, "[{\"payload\": 0}]", NULL), MUSTER_OK);
  json_t *leases = fixture_lease("q", 1);
  assert_int_equal(apply(LEASE_FAIL, json_array_get(leases, 0), ", \"error\": \"boom\""),
                   MUSTER_OK);
  assert_int_equal(read_results(id, SESSION_BY_SUBMISSION, 0, 100, buf, sizeof buf), 1);
  assert_string_equal(buf, "0");
  json_t *list = session_list(st, &(fail_t){0});
  assert_int_equal(json_array_size(json_object_get(list, "sessions")), 1);
  json_decref(list);
  json_decref(leases);
}

/* The results written as text are, byte for byte, what jw_dump writes for
 * the object built as a tree ({"index", "task", "state", "result", "error",
 * "seq"}, as before they were written as text): a result with nesting,
 * escapes and UTF-8, an error with quotes and a newline, a dead task's. */
static void test_results_text(void **unused) {
  make_queue("q", "{\"max_attempts\": 1, \"lease_ms\": 60000}");
  char id[SESSION_ID_LEN + 1];
  open_session("q", NULL, id);
  assert_int_equal(submit(id, "[{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2}]", NULL),
                   MUSTER_OK);
  json_t *leases = fixture_lease("q", 3);
  const char *result =
      ", \"result\": {\"a\": [1, -2.5e-3, true, null], \"s\": \"caf\u00e9 \\\"q\\\" \\n \\u0001\"}";
  assert_int_equal(apply(LEASE_COMPLETE, at_index(leases, 1), result), MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, at_index(leases, 0),
                         ", \"error\": \"it said \\\"no\\\"\\nand \u00fcbel\","
                         " \"permanent\": true"),
                   MUSTER_OK);
  assert_int_equal(apply(LEASE_FAIL, at_index(leases, 2), ", \"error\": \"boom\""), MUSTER_OK);
  fail_t f = {0};
  session_read_t rd;
  jw_buf_t out;
  results_text(id, SESSION_BY_COMPLETION, 0, 100, false, &rd, &out);
  assert_int_equal(rd.count, 3);
  static const char results_key[] = "{\"results\":";
  assert_memory_equal(out.buf, results_key, sizeof results_key - 1);
  const char *text = out.buf + sizeof results_key - 1; /* the array, then ",\"cursor\"" */
  /* The tree each element was built as, from what the tasks hold. */
  json_t *expected = json_array();
  static const int64_t by_seq[] = {1, 0, 2}; /* the indexes in the order they finished */
  for (int64_t seq = 1; seq <= 3; seq++) {
    int64_t index = by_seq[seq - 1];
    json_t *task = tree_of(task_get(st, jint(at_index(leases, index), "task"), &f));
    assert_non_null(task);
    const char *state = json_string_value(json_object_get(task, "state"));
    bool done = strcmp(state, "done") == 0;
    json_array_append_new(expected,
                          json_pack("{s:I, s:I, s:s, s:O, s:O, s:I}", "index", (json_int_t)index,
                                    "task", (json_int_t)jint(task, "id"), "state", state, "result",
                                    done ? json_object_get(task, "result") : json_null(), "error",
                                    done ? json_null() : json_object_get(task, "error"), "seq",
                                    (json_int_t)seq));
    json_decref(task);
  }
  size_t want_len = 0;
  char *want = jw_dump(expected, &want_len);
  assert_non_null(want);
  assert_true(out.len > sizeof results_key - 1 + want_len);
  assert_memory_equal(text, want, want_len);
  assert_memory_equal(text + want_len, ",\"cursor\":", 10);
  assert_non_null(strstr(want, "\"state\":\"dead\""));
  assert_non_null(strstr(want, "\"state\":\"failed\""));
  free(want);
  json_decref(expected);
  jw_buf_free(&out);
  json_decref(leases);
}

/* The first column of `sql`'s first row, as text ("" for NULL); `buf`. */
static const char *query_text(const char *sql, char *buf, size_t size) {
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  const char *text = (const char *)sqlite3_column_text(s, 0);
  snprintf(buf, size, "%s", text ? text : "");
  sqlite3_finalize(s);
  return buf;
}

/* Schema version 9 moves init_data out of the session row (which every
 * heartbeat and result writes) into session_data: a session made under
 * version 8 keeps its init_data after the upgrade, and a new one's row holds
 * none. */
static void test_init_data_apart(void **unused) {
  fixture_close(); /* this test opens a file of its own */
  char dir[] = "/tmp/muster-test-session.XXXXXX", path[64], buf[256];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/muster.db", dir);
  fail_t f = {0};
  st = store_open(&(store_opts_t){.path = path, .schema_version = 8}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  make_queue("q", "{}");
  /* Version 8's session: init_data in its row (as session_insert wrote it). */
  assert_int_equal(
      sqlite3_exec(store_db(st),
                   "INSERT INTO sessions(id, queue, state, cleanup_on_exit, timeout_ms,"
                   " init_data, created_ms, last_seen_ms) VALUES('s-old', 'q', 0, 1,"
                   " 60000, '{\"model\":[1,2]}', 1, 1)",
                   NULL, NULL, NULL),
      SQLITE_OK);
  assert_int_equal(fixture_close(), 0);

  st = store_open(&(store_opts_t){.path = path}, &f);
  assert_non_null(st);
  assert_int_equal(store_request_begin(st, &f), MUSTER_OK);
  json_t *old = session_get(st, "s-old", &f);
  assert_non_null(old);
  size_t len = 0;
  char *text = jw_dump(json_object_get(old, "init_data"), &len);
  assert_string_equal(text, "{\"model\":[1,2]}");
  free(text);
  json_decref(old);
  assert_string_equal(
      query_text("SELECT init_data FROM sessions WHERE id = 's-old'", buf, sizeof buf), "");
  /* A new session: its init_data in session_data, its row without it. */
  char id[SESSION_ID_LEN + 1];
  open_session("q", ", \"init_data\": {\"w\": \"big\"}", id);
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT init_data FROM session_data WHERE session = '%s'", id);
  assert_string_equal(query_text(sql, buf, sizeof buf), "{\"w\":\"big\"}");
  snprintf(sql, sizeof sql, "SELECT init_data FROM sessions WHERE id = '%s'", id);
  assert_string_equal(query_text(sql, buf, sizeof buf), "");
  json_t *list = session_list(st, &f);
  assert_int_equal(json_array_size(json_object_get(list, "sessions")), 2);
  json_decref(list);
  assert_int_equal(fixture_close(), 0);
  fixture_remove_store_files(dir, path);
  assert_int_equal(fixture_open(), 0); /* for the teardown */
}

static bool busy_yes(void *arg, const char *id) {
  return true;
}

static void test_close_and_expiry(void **unused) {
  make_queue("q", "{}");
  char id[SESSION_ID_LEN + 1], keep[SESSION_ID_LEN + 1];
  open_session("q", ", \"timeout_ms\": 100", id);
  open_session("q", ", \"timeout_ms\": 100, \"cleanup_on_exit\": false", keep);
  assert_int_equal(submit(id, "[{\"payload\": 0}, {\"payload\": 1}]", NULL), MUSTER_OK);
  json_t *body = parse("{\"data\": 1}");
  json_object_set_new(body, "session", json_string(id));
  fail_t f = {0};
  json_t *up = update_post(st, "q", body, 1 << 20, &f);
  assert_non_null(up);
  json_decref(up);
  json_decref(body);
  int64_t later = now_ms() + 10000;
  assert_true(session_any_due(st, later));
  /* A session whose reader is parked is not expired. */
  assert_int_equal(session_expire_due(st, later, busy_yes, NULL), 0);
  assert_int_equal(session_expire_due(st, later, NULL, NULL), 1);
  assert_false(session_any_due(st, later));
  assert_null(session_get(st, id, &f));
  assert_int_equal(f.code, MUSTER_SESSION_NOT_FOUND);
  assert_non_null(strstr(f.message, "did not call"));
  jw_buf_t listed = {0};
  assert_int_equal(update_list_text(st, "q", 0, 100, &listed, &f), MUSTER_OK);
  json_t *list = text_tree(&listed);
  assert_int_equal(json_array_size(json_object_get(list, "updates")), 0);
  assert_int_equal(jint(list, "last"), 1);
  json_decref(list);
  json_t *tasks = tree_of(task_list(st, "q", -1, 0, 100, &f));
  assert_int_equal(json_array_size(json_object_get(tasks, "tasks")), 0);
  json_decref(tasks);
  /* Closing twice: not found. */
  assert_null(session_close(st, id, "by its client", &f));
  assert_int_equal(f.code, MUSTER_SESSION_NOT_FOUND);
  json_t *s = session_get(st, keep, &f);
  assert_non_null(s);
  json_decref(s);
}

static void test_updates(void **unused) {
  make_queue("q", "{}");
  fail_t f = {0};
  json_t *body = parse("{\"data\": {\"n\": 1}}");
  for (int i = 1; i <= UPDATE_MAX_BATCH + 5; i++) {
    json_t *r = update_post(st, "q", body, 1 << 20, &f);
    assert_non_null(r);
    assert_int_equal(jint(r, "seq"), i);
    json_decref(r);
  }
  json_decref(body);
  assert_int_equal(update_last(st, "q"), UPDATE_MAX_BATCH + 5);
  assert_int_equal(update_last(st, "other"), 0);
  /* A long backlog is cut at 1000: the worker continues from the last one. */
  size_t count = 0;
  json_t *reply = updates_attached("q", 0, &count);
  assert_int_equal(count, UPDATE_MAX_BATCH);
  assert_int_equal(jint(reply, "updates_last"), UPDATE_MAX_BATCH);
  json_decref(reply);
  reply = updates_attached("q", UPDATE_MAX_BATCH, &count);
  assert_int_equal(count, 5);
  assert_int_equal(jint(reply, "updates_last"), UPDATE_MAX_BATCH + 5);
  json_decref(reply);
  json_t *missing = parse("{}");
  assert_null(update_post(st, "q", missing, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_INVALID);
  json_decref(missing);
  json_t *big = parse("{\"data\": \"0123456789\"}");
  assert_null(update_post(st, "q", big, 8, &f));
  assert_int_equal(f.code, MUSTER_PAYLOAD_TOO_LARGE);
  assert_null(update_post(st, "nope", big, 1 << 20, &f));
  assert_int_equal(f.code, MUSTER_QUEUE_NOT_FOUND);
  json_decref(big);
}

/* Registers a worker on `node` and returns its id. */
static int64_t worker_on(const char *node) {
  char text[128];
  snprintf(text, sizeof text, "{\"node\": \"%s\"}", node);
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *w = worker_register(st, body, 60000, &f);
  assert_non_null(w);
  int64_t id = jint(w, "id");
  json_decref(w);
  json_decref(body);
  return id;
}

static json_t *register_node(const char *text, bool *created) {
  json_t *body = parse(text);
  fail_t f = {0};
  json_t *n = node_register(st, body, 15000, created, &f);
  json_decref(body);
  return n;
}

static void test_nodes(void **unused) {
  make_queue("q", "{\"lease_ms\": 600000, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  bool created = false;
  json_t *n = register_node("{\"name\": \"box\", \"timeout_ms\": 1000, \"gpus\": [{\"index\": 0}]}",
                            &created);
  assert_non_null(n);
  assert_true(created);
  json_decref(n);
  int64_t w = worker_on("box");
  for (int i = 0; i < 2; i++) {
    json_t *body = parse("{\"tasks\": [{\"payload\": 0}]}");
    json_decref(task_put(st, "q", body, 1 << 20, &(fail_t){0}));
    json_decref(body);
  }
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  json_t *leases = lease_acquire(st, &q, w, 1, &f);
  assert_int_equal(json_array_size(leases), 1);
  int64_t task = jint(json_array_get(leases, 0), "task");
  json_decref(leases);
  /* Re-register: the old worker is gone, its lease released uncounted. */
  n = register_node("{\"name\": \"box\", \"timeout_ms\": 1000}", &created);
  assert_false(created);
  assert_int_equal(jint(n, "workers"), 0);
  json_decref(n);
  json_t *t = tree_of(task_get(st, task, &f));
  assert_string_equal(json_string_value(json_object_get(t, "state")), "queued");
  assert_int_equal(jint(t, "attempts"), 0);
  json_decref(t);
  assert_int_equal(worker_check_active(st, w, &f), MUSTER_WORKER_NOT_FOUND);
  /* Timeout: the new worker's lease lapses, counted. */
  w = worker_on("box");
  leases = lease_acquire(st, &q, w, 1, &f);
  task = jint(json_array_get(leases, 0), "task");
  json_decref(leases);
  assert_false(node_any_due(st, now_ms()));
  int64_t later = now_ms() + 5000;
  assert_true(node_any_due(st, later));
  assert_int_equal(node_expire_due(st, later), 1);
  t = tree_of(task_get(st, task, &f));
  assert_string_equal(json_string_value(json_object_get(t, "state")), "queued");
  assert_int_equal(jint(t, "attempts"), 1);
  assert_string_equal(json_string_value(json_object_get(t, "error")), "node timed out");
  json_decref(t);
  n = node_get(st, "box", &f);
  assert_string_equal(json_string_value(json_object_get(n, "state")), "gone");
  json_decref(n);
  json_t *empty = parse("{}");
  assert_null(node_heartbeat(st, "box", empty, &f));
  assert_int_equal(f.code, MUSTER_NODE_NOT_FOUND);
  assert_null(node_leave(st, "box", &f));
  assert_int_equal(f.code, MUSTER_NODE_NOT_FOUND);
  json_decref(empty);
  /* Bad names and fields. */
  assert_null(register_node("{\"name\": \"a b\"}", &created));
  assert_null(register_node("{\"name\": \"ok\", \"gpus\": [{\"name\": \"x\"}]}", &created));
  assert_null(register_node("{}", &created));
}

static void test_crashed_worker(void **unused) {
  make_queue("q", "{\"max_attempts\": 2, \"backoff_ms\": 0, \"backoff_max_ms\": 0}");
  json_t *body = parse("{\"tasks\": [{\"payload\": 0}]}");
  json_decref(task_put(st, "q", body, 1 << 20, &(fail_t){0}));
  json_decref(body);
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  int64_t task = 0;
  for (int i = 0; i < 2; i++) {
    int64_t w = worker_on("n");
    json_t *leases = lease_acquire(st, &q, w, 1, &f);
    assert_int_equal(json_array_size(leases), 1);
    task = jint(json_array_get(leases, 0), "task");
    json_decref(leases);
    json_t *r = worker_leave(st, w, true, &f);
    assert_int_equal(jint(r, "released"), 1);
    json_decref(r);
  }
  json_t *t = tree_of(task_get(st, task, &f));
  assert_string_equal(json_string_value(json_object_get(t, "state")), "dead");
  assert_string_equal(json_string_value(json_object_get(t, "error")), "worker crashed");
  json_decref(t);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_indexes, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_submit_batches, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_batch_results, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_results_text, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_init_data_apart, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_streams_and_exactly_once, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_dead_is_a_result, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_gaps, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_close_and_expiry, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_updates, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_nodes, setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_crashed_worker, setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
