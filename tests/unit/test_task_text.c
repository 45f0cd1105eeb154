/*
 * test_task_text.c — the replies that carry stored JSON text, written as
 * text around it (task_text.c, update.c, jv_add_stored), against the trees
 * they were built as before: the stored text decoded with jv_decode, the
 * object packed key by key, jw_dump of the whole.  A task and a page of
 * tasks (brief too), a requeue, a list of updates and those a lease carries,
 * a session's init_data and a page of session results (both orders, at a
 * gap, cut by the reply budget) must be, byte for byte, what the tree gave,
 * for payloads with escapes, \u0000, UTF-8 beyond the BMP, shortest reals,
 * extreme integers and nesting at the request parser's limit, stored by
 * both ways a put takes (the tree and the scanner), and for rows in every
 * state.  Rows changed behind the head's back still make valid JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "server/jscan.h"
#include "server/jv.h"
#include "server/jw.h"
#include "server/lease.h"
#include "server/lease_retry.h"
#include "server/log.h"
#include "server/reply_budget.h"
#include "server/session.h"
#include "server/task.h"
#include "server/task_internal.h"
#include "server/update.h"
#include "store_fixture.h"
#include "session_fixture.h"

/* Nesting of the deepest payload: a put body holds it in three containers,
 * and jansson reads 2048 levels, the innermost scalar counted. */
#define DEEPEST 2044

/* Payloads as a client sends them (the tree path stores them rewritten). */
static const char *const tricky[] = {
    "\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"",
    "\"nul \\u0000 ctl \\u001F\\b\\f\\n\\r\\t \\\"q\\\" \\\\ end\"",
    "{\"k\\n\":[1,-0.5,1e300,5e-324,-0.0,9223372036854775807,-9223372036854775808],"
    "\"\":{},\"a\\u0001\":[]}",
    "{\"z\": [1E2, 0.10000000000000001], \"e\": \"\\u00e9\\ud83d\\ude00\\/\"}",
    "[[], {}, null, true, false, \"\", 0]",
};
#define TRICKY_N (sizeof tricky / sizeof tricky[0])

/* `depth` arrays around "deep" (caller frees). */
static char *deep_text(int depth) {
  char *text = malloc((size_t)depth * 2 + 8);
  assert_non_null(text);
  memset(text, '[', (size_t)depth);
  memcpy(text + depth, "\"deep\"", 6);
  memset(text + depth + 6, ']', (size_t)depth);
  text[2 * depth + 6] = '\0';
  return text;
}

/* Puts one task of body `body` (text), by the scanner when `scanned` (it
 * must take the body) and by the tree otherwise; returns its id. */
static int64_t put_body(const char *body, bool scanned) {
  fail_t f = {0};
  json_t *out;
  if (scanned) {
    jscan_body_t b;
    assert_true(jscan_body(&task_put_shape, body, strlen(body), 1 << 20, &b));
    out = task_put_scanned(st, "q", &b, &f);
    jscan_body_free(&b);
  } else {
    json_t *tree = json_loads(body, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, NULL);
    assert_non_null(tree);
    out = task_put(st, "q", tree, 1 << 20, &f);
    json_decref(tree);
  }
  if (out == NULL)
    fail_msg("put %.80s: %s", body, f.message);
  json_t *reply = tree_of(out);
  int64_t id = jint(json_array_get(json_object_get(reply, "tasks"), 0), "id");
  json_decref(reply);
  return id;
}

/* Puts payload `payload` with `fields` after it (", \"key\": ..." or ""). */
static int64_t put_payload(const char *payload, const char *fields, bool scanned) {
  size_t size = strlen(payload) + strlen(fields) + 64;
  char *body = malloc(size);
  assert_non_null(body);
  snprintf(body, size,
           scanned ? "{\"tasks\":[{\"payload\":%s%s}]}" : "{\"tasks\": [{\"payload\": %s%s}]}",
           payload, fields);
  int64_t id = put_body(body, scanned);
  free(body);
  return id;
}

static json_t *old_int_or_null(sqlite3_stmt *s, int col) {
  return sqlite3_column_type(s, col) == SQLITE_NULL ? json_null()
                                                    : json_integer(sqlite3_column_int64(s, col));
}

static json_t *old_text_or_null(sqlite3_stmt *s, int col) {
  const unsigned char *t = sqlite3_column_text(s, col);
  return t ? json_string((const char *)t) : json_null();
}

/* The task object of the row `s` is on as task.c built it before it wrote
 * it as text (its task_from_row, as it was). */
static json_t *old_task_tree(sqlite3_stmt *s, bool brief) {
  int state = sqlite3_column_int(s, 2);
  json_t *lease = json_null();
  if (state == TASK_LEASED)
    lease = json_pack("{s:o, s:I}", "worker", old_int_or_null(s, 16), "deadline_ms",
                      (json_int_t)sqlite3_column_int64(s, 17));
  json_t *result = brief || sqlite3_column_type(s, 6) == SQLITE_NULL
                       ? json_null()
                       : jv_decode((const char *)sqlite3_column_text(s, 6));
  json_t *payload = brief ? json_null() : jv_decode((const char *)sqlite3_column_text(s, 5));
  json_t *task = json_pack(
      "{s:I, s:s, s:s, s:I, s:o, s:o, s:o, s:I, s:I, s:o, s:o, s:o, s:o, s:I, s:I, "
      "s:I, s:o}",
      "id", (json_int_t)sqlite3_column_int64(s, 0), "queue",
      (const char *)sqlite3_column_text(s, 1), "state", task_state_name(state), "priority",
      (json_int_t)sqlite3_column_int64(s, 3), "payload", payload, "result", result, "error",
      old_text_or_null(s, 7), "attempts", (json_int_t)sqlite3_column_int64(s, 8), "flags",
      (json_int_t)sqlite3_column_int64(s, 9), "key", old_text_or_null(s, 10), "session",
      old_text_or_null(s, 11), "index", old_int_or_null(s, 12), "parent", old_int_or_null(s, 13),
      "run_at_ms", (json_int_t)sqlite3_column_int64(s, 4), "created_ms",
      (json_int_t)sqlite3_column_int64(s, 14), "updated_ms",
      (json_int_t)sqlite3_column_int64(s, 15), "lease", lease);
  if (task && brief) {
    json_object_del(task, "payload");
    json_object_del(task, "result");
  }
  if (task && sqlite3_column_type(s, 18) != SQLITE_NULL)
    json_object_set_new(task, "requires", jv_decode((const char *)sqlite3_column_text(s, 18)));
  return task;
}

/* The old tree of every task of queue "q", by id: the "tasks" of a page. */
static json_t *old_tasks(bool brief) {
  sqlite3_stmt *s = store_stmt(st, "SELECT " TASK_COLUMNS " FROM tasks WHERE queue = 'q'"
                                   " ORDER BY id");
  assert_non_null(s);
  json_t *tasks = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    assert_int_equal(json_array_append_new(tasks, old_task_tree(s, brief)), 0);
  store_reset(s);
  return tasks;
}

/* The text in `got` (freed) is jw_dump of `want` (not consumed). */
static void same_bytes(jw_buf_t *got, const json_t *want) {
  size_t want_len;
  char *want_text = jw_dump(want, &want_len);
  assert_non_null(want_text);
  assert_false(got->failed);
  if (got->len != want_len || memcmp(got->buf, want_text, want_len) != 0)
    fail_msg("written as text:\n%.*s\nas the tree:\n%.600s", (int)(got->len < 600 ? got->len : 600),
             got->buf, want_text);
  jw_buf_free(got);
  free(want_text);
}

/* jw_dump of `got` (a reply, consumed) is jw_dump of `want` (consumed). */
static void same_text(json_t *got, json_t *want) {
  assert_non_null(got);
  assert_non_null(want);
  size_t got_len, want_len;
  char *got_text = jw_dump(got, &got_len), *want_text = jw_dump(want, &want_len);
  assert_non_null(got_text);
  assert_non_null(want_text);
  if (got_len != want_len || memcmp(got_text, want_text, got_len) != 0)
    fail_msg("written as text:\n%.600s\nas the tree:\n%.600s", got_text, want_text);
  free(got_text);
  free(want_text);
  json_decref(got);
  json_decref(want);
}

/* Every task of "q" alone (task_get) and as a page, brief and not. */
static void tasks_as_tree(size_t n) {
  fail_t f = {0};
  json_t *all = old_tasks(false);
  assert_int_equal(json_array_size(all), n);
  for (size_t i = 0; i < n; i++) {
    int64_t id = jint(json_array_get(all, i), "id");
    same_text(task_get(st, id, &f), json_incref(json_array_get(all, i)));
  }
  same_text(task_list(st, "q", -1, 0, 1000, &f), json_pack("{s:o, s:n}", "tasks", all, "next"));
  same_text(task_list_as(st, "q", -1, 0, 1000, true, &f),
            json_pack("{s:o, s:n}", "tasks", old_tasks(true), "next"));
  /* A page cut by its limit: "next" the last id. */
  json_t *two = old_tasks(false);
  while (json_array_size(two) > 2)
    json_array_remove(two, 2);
  int64_t last = jint(json_array_get(two, 1), "id");
  same_text(task_list(st, "q", -1, 0, 2, &f),
            json_pack("{s:o, s:I}", "tasks", two, "next", (json_int_t)last));
}

/* Leases the first `max` queued tasks of "q" (lease objects: caller frees). */
static json_t *lease_some(int64_t max) {
  queue_t q;
  fail_t f = {0};
  assert_int_equal(queue_load(st, "q", &q, &f), MUSTER_OK);
  json_t *leases = lease_acquire(st, &q, 0, max, &f);
  assert_non_null(leases);
  json_t *tree = reply_tree(leases);
  json_decref(leases);
  return tree;
}

/* Applies `op` to lease `l` with `extra` fields (", \"result\": ..."). */
static void apply_one(lease_op_t op, const json_t *l, const char *extra) {
  size_t size = strlen(extra) + 128;
  char *text = malloc(size);
  assert_non_null(text);
  snprintf(text, size, "{\"leases\": [{\"task\": %lld, \"token\": %lld%s}]}",
           (long long)jint(l, "task"), (long long)jint(l, "token"), extra);
  json_t *body = json_loads(text, JSON_ALLOW_NUL, NULL);
  assert_non_null(body);
  fail_t f = {0};
  json_t *out = lease_apply(st, op, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("%s: %s", text, f.message);
  json_decref(out);
  json_decref(body);
  free(text);
}

/* Puts the tricky payloads into "q" both ways, `deep` by the tree, and one
 * task with every optional field; returns how many tasks it put. */
static size_t put_tricky(const char *deep) {
  size_t n = 0;
  /* The scanner takes what is canonical already (not the deepest: it
   * declines nesting past JCANON_MAX_DEPTH), the tree everything. */
  for (int scanned = 0; scanned < 2; scanned++) {
    for (size_t i = 0; i < TRICKY_N; i++) {
      if (scanned && !jscan_canonical(tricky[i], strlen(tricky[i])))
        continue;
      put_payload(tricky[i], scanned ? "" : ", \"priority\": -3", scanned);
      n++;
    }
  }
  put_payload(deep, "", false);
  n++;
  /* The tree path's other fields: key, session, index, requires. */
  put_payload(tricky[0],
              ", \"key\": \"k\\u00e9\\n\", \"session\": \"s\\\"1\", \"index\": 7,"
              " \"requires\": [{\"scope\": \"g\", \"name\": \"m\", \"level\": 2}]",
              false);
  return n + 1;
}

static void test_tasks_as_tree(void **unused) {
  make_queue("q", "{\"max_attempts\": 1}");
  char *deep = deep_text(DEEPEST);
  size_t n = put_tricky(deep);
  tasks_as_tree(n);
  /* Leased (a lease object), done with results, failed with an error. */
  json_t *leases = lease_some(4);
  apply_one(LEASE_COMPLETE, json_array_get(leases, 0), ", \"result\": \"\\u0000\\ud83d\\ude00\"");
  char *result = malloc(strlen(deep) + 16);
  assert_non_null(result);
  sprintf(result, ", \"result\": %s", deep);
  apply_one(LEASE_COMPLETE, json_array_get(leases, 1), result);
  apply_one(LEASE_FAIL, json_array_get(leases, 2),
            ", \"error\": \"it said \\\"no\\\"\\n\\u00fcbel\", \"permanent\": true");
  tasks_as_tree(n);
  /* Requeued: the reply is the task. */
  fail_t f = {0};
  int64_t failed = jint(json_array_get(leases, 2), "task");
  json_t *requeued = task_requeue(st, failed, &f);
  sqlite3_stmt *s = store_stmt(st, "SELECT " TASK_COLUMNS " FROM tasks WHERE id = ?1");
  sqlite3_bind_int64(s, 1, failed);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  same_text(requeued, old_task_tree(s, false));
  store_reset(s);
  json_decref(leases);
  free(result);
  free(deep);
}

/* The updates of "q" after `after` as update.c built them as trees before. */
static json_t *old_updates_after(int64_t after) {
  sqlite3_stmt *s = store_stmt(st, "SELECT seq, data, session, created_ms FROM updates"
                                   " WHERE queue = 'q' AND seq > ?1 ORDER BY seq");
  assert_non_null(s);
  sqlite3_bind_int64(s, 1, after);
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW) {
    const unsigned char *session = sqlite3_column_text(s, 2);
    json_array_append_new(
        list, json_pack("{s:I, s:o, s:o, s:I}", "seq", (json_int_t)sqlite3_column_int64(s, 0),
                        "data", jv_decode((const char *)sqlite3_column_text(s, 1)), "session",
                        session ? json_string((const char *)session) : json_null(), "created_ms",
                        (json_int_t)sqlite3_column_int64(s, 3)));
  }
  store_reset(s);
  return list;
}

static json_t *old_updates(void) {
  return old_updates_after(0);
}

/* Posts update `data` (text) to "q", of session `session` unless NULL. */
static void post_update(const char *data, const char *session) {
  size_t size = strlen(data) + 128;
  char *text = malloc(size);
  assert_non_null(text);
  if (session)
    snprintf(text, size, "{\"data\": %s, \"session\": \"%s\"}", data, session);
  else
    snprintf(text, size, "{\"data\": %s}", data);
  json_t *body = json_loads(text, JSON_ALLOW_NUL, NULL);
  assert_non_null(body);
  fail_t f = {0};
  json_t *out = update_post(st, "q", body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("update %.80s: %s", text, f.message);
  json_decref(out);
  json_decref(body);
  free(text);
}

static void test_updates_as_tree(void **unused) {
  make_queue("q", "{}");
  json_t *body = parse("{\"queue\": \"q\"}");
  json_t *made = session_create(st, body, 1 << 20, &(fail_t){0});
  assert_non_null(made);
  json_decref(body);
  char *deep = deep_text(DEEPEST + 2); /* {"data": ...} holds it in one container */
  for (size_t i = 0; i < TRICKY_N; i++)
    post_update(tricky[i], i % 2 ? json_string_value(json_object_get(made, "id")) : NULL);
  post_update(deep, NULL);
  fail_t f = {0};
  jw_buf_t listed = {0}, reply = {0};
  json_t *want =
      json_pack("{s:o, s:I}", "updates", old_updates(), "last", (json_int_t)TRICKY_N + 1);
  assert_int_equal(update_list_text(st, "q", 0, 100, &listed, &f), MUSTER_OK);
  same_bytes(&listed, want);
  json_decref(want);
  want = json_pack("{s:[]}", "leases");
  size_t count = 0;
  JW_ADD_LITERAL(&reply, "{\"leases\":[]");
  assert_int_equal(update_attach_text(st, "q", 0, &reply, &count, &f), MUSTER_OK);
  JW_ADD_LITERAL(&reply, "}");
  assert_int_equal(count, TRICKY_N + 1);
  json_object_set_new(want, "updates", old_updates());
  json_object_set_new(want, "updates_last", json_integer((json_int_t)TRICKY_N + 1));
  same_bytes(&reply, want);
  json_decref(want);
  json_decref(made);
  free(deep);
}

static void test_init_data_as_tree(void **unused) {
  make_queue("q", "{}");
  char *deep = deep_text(DEEPEST + 2);
  for (size_t i = 0; i <= TRICKY_N; i++) {
    const char *data = i < TRICKY_N ? tricky[i] : deep;
    char *text = malloc(strlen(data) + 64);
    assert_non_null(text);
    sprintf(text, "{\"queue\": \"q\", \"init_data\": %s}", data);
    json_t *body = json_loads(text, JSON_ALLOW_NUL, NULL);
    assert_non_null(body);
    fail_t f = {0};
    json_t *made = session_create(st, body, 1 << 20, &f);
    assert_non_null(made);
    json_t *got = session_get(st, json_string_value(json_object_get(made, "id")), &f);
    assert_non_null(got);
    /* The tree held jv_decode of the stored text, which is jw_dump of the
     * value sent. */
    char *stored = jw_dump(json_object_get(body, "init_data"), NULL);
    same_text(json_incref(json_object_get(got, "init_data")), jv_decode(stored));
    free(stored);
    json_decref(got);
    json_decref(made);
    json_decref(body);
    free(text);
  }
  free(deep);
}

/* ---- session results ---- */

/* One read of session results and what the tree path answered it: the
 * results are those at indexes (submission) or seqs (completion) `first`
 * to `first` + `n` - 1; "cursor" is `next`; "gap" {gap_first, gap_last},
 * or null when gap_first is -1. */
typedef struct {
  session_order_t order;
  int64_t cursor, max;
  int64_t first, n, next, gap_first, gap_last;
} results_case_t;

/* The result object of session `id` at index (submission) or seq
 * (completion) `at`, built from its rows as session_results built it as a
 * tree: the stored result decoded with jv_decode. */
static json_t *old_result(const char *id, session_order_t order, int64_t at) {
  sqlite3_stmt *s = NULL;
  const char *sql = order == SESSION_BY_SUBMISSION
                        ? "SELECT r.idx, r.task, r.state, t.result, t.error, r.seq"
                          " FROM session_results r JOIN tasks t ON t.id = r.task"
                          " WHERE r.session = ?1 AND r.idx = ?2"
                        : "SELECT r.idx, r.task, r.state, t.result, t.error, r.seq"
                          " FROM session_results r JOIN tasks t ON t.id = r.task"
                          " WHERE r.session = ?1 AND r.seq = ?2";
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(s, 2, at);
  assert_int_equal(sqlite3_step(s), SQLITE_ROW);
  int state = sqlite3_column_int(s, 2);
  bool done = state == TASK_DONE;
  json_t *result = done && sqlite3_column_type(s, 3) != SQLITE_NULL
                       ? jv_decode((const char *)sqlite3_column_text(s, 3))
                       : json_null();
  json_t *error = !done ? old_text_or_null(s, 4) : json_null();
  json_t *item =
      json_pack("{s:I, s:I, s:s, s:o, s:o, s:I}", "index", (json_int_t)sqlite3_column_int64(s, 0),
                "task", (json_int_t)sqlite3_column_int64(s, 1), "state", task_state_name(state),
                "result", result, "error", error, "seq", (json_int_t)sqlite3_column_int64(s, 5));
  sqlite3_finalize(s);
  assert_non_null(item);
  return item;
}

/* The reply to read `c` of session `id` as the tree path built it. */
static json_t *old_results(const char *id, const results_case_t *c, int64_t total, int64_t done) {
  json_t *results = json_array();
  for (int64_t i = 0; i < c->n; i++)
    assert_int_equal(json_array_append_new(results, old_result(id, c->order, c->first + i)), 0);
  json_t *gap = c->gap_first < 0 ? NULL
                                 : json_pack("{s:I, s:I}", "first", (json_int_t)c->gap_first,
                                             "last", (json_int_t)c->gap_last);
  json_t *reply = json_pack("{s:o, s:I, s:I, s:I, s:o?, s:b}", "results", results, "cursor",
                            (json_int_t)c->next, "total", (json_int_t)total, "done",
                            (json_int_t)done, "gap", gap, "sealed", 0);
  assert_non_null(reply);
  return reply;
}

/* Read `c` of session `id`, written as text, is byte for byte the tree
 * path's reply. */
static void results_as_tree(const char *id, const results_case_t *c, int64_t total, int64_t done) {
  fail_t f = {0};
  session_read_t rd;
  jw_buf_t got = {0};
  json_t *want = old_results(id, c, total, done);
  assert_int_equal(session_results_text(st, id, c->order, c->cursor, c->max, false, &rd, &got, &f),
                   MUSTER_OK);
  assert_int_equal(rd.count, (size_t)c->n);
  same_bytes(&got, want);
  json_decref(want);
}

/* Submits the payloads 0, 1, ... at indexes 0 to 7, 11 and 12 of session
 * `id` (8 to 10 a gap); returns the leases of the tasks at 0 to 11 by index
 * (the caller frees), 12 left queued. */
static json_t *results_setup(const char *id) {
  submit_body(id,
              parse("{\"tasks\": [{\"payload\": 0}, {\"payload\": 1}, {\"payload\": 2},"
                    " {\"payload\": 3}, {\"payload\": 4}, {\"payload\": 5}, {\"payload\": 6},"
                    " {\"payload\": 7}, {\"payload\": 11, \"index\": 11}, {\"payload\": 12}]}"));
  json_t *leases = lease_some(9), *by_index = json_array();
  for (int64_t index = 0; index < 12; index++)
    for (size_t i = 0; i < json_array_size(leases); i++)
      if (jint(json_array_get(leases, i), "index") == index)
        json_array_append(by_index, json_array_get(leases, i));
  json_decref(leases);
  assert_int_equal(json_array_size(by_index), 9);
  return by_index;
}

/* Completes lease `l` with result `result` (text) by the scanner. */
static void complete_scanned(const json_t *l, const char *result) {
  size_t size = strlen(result) + 128;
  char *text = malloc(size);
  assert_non_null(text);
  snprintf(text, size, "{\"leases\":[{\"task\":%lld,\"token\":%lld,\"result\":%s}]}",
           (long long)jint(l, "task"), (long long)jint(l, "token"), result);
  jscan_body_t b;
  assert_true(jscan_body(&lease_complete_shape, text, strlen(text), 1 << 20, &b));
  fail_t f = {0};
  json_t *out = lease_complete_scanned(st, &b, 1 << 20, &f);
  if (out == NULL)
    fail_msg("%s: %s", text, f.message);
  json_decref(out);
  jscan_body_free(&b);
  free(text);
}

/* Finishes the nine leased tasks out of index order: 11, then 3, 0, 1, 2
 * and 4 with the tricky results (some by the scanner), 5 with the deepest,
 * 6 failed and 7 dead with errors that need escapes. */
static void results_finish(const json_t *leases, const char *deep) {
  complete_scanned(json_array_get(leases, 8), "{\"last\":true}");
  static const size_t order[] = {3, 0, 1, 2, 4};
  for (size_t i = 0; i < TRICKY_N; i++) {
    const json_t *l = json_array_get(leases, order[i]);
    if (i % 2 && jscan_canonical(tricky[order[i]], strlen(tricky[order[i]]))) {
      complete_scanned(l, tricky[order[i]]);
      continue;
    }
    char extra[256];
    snprintf(extra, sizeof extra, ", \"result\": %s", tricky[order[i]]);
    apply_one(LEASE_COMPLETE, l, extra);
  }
  char *result = malloc(strlen(deep) + 16);
  assert_non_null(result);
  sprintf(result, ", \"result\": %s", deep);
  apply_one(LEASE_COMPLETE, json_array_get(leases, 5), result);
  free(result);
  apply_one(LEASE_FAIL, json_array_get(leases, 6),
            ", \"error\": \"it said \\\"no\\\"\\n\\u00fcbel \\u0001 \\ud83d\\ude00\","
            " \"permanent\": true");
  apply_one(LEASE_FAIL, json_array_get(leases, 7), ", \"error\": \"tab\\there \\\\ /\"");
}

/* A results page written as text is the tree path's reply, byte for byte:
 * both orders, from the start and from a cursor, a full page, one that
 * stops at a gap (and says so), an empty one past the end, and one cut by
 * the reply budget (then "cursor" is the result that did not fit). */
static void test_results_as_tree(void **unused) {
  make_queue("q", "{\"max_attempts\": 1, \"lease_ms\": 60000}");
  json_t *body = parse("{\"queue\": \"q\"}");
  json_t *made = session_create(st, body, 1 << 20, &(fail_t){0});
  assert_non_null(made);
  json_decref(body);
  const char *id = json_string_value(json_object_get(made, "id"));
  char *deep = deep_text(DEEPEST);
  json_t *leases = results_setup(id);
  results_finish(leases, deep);
  static const results_case_t cases[] = {
      {SESSION_BY_SUBMISSION, 0, 1000, 0, 8, 8, 8, 10},
      {SESSION_BY_SUBMISSION, 0, 3, 0, 3, 3, -1, -1},
      {SESSION_BY_SUBMISSION, 5, 1000, 5, 3, 8, 8, 10},
      {SESSION_BY_SUBMISSION, 8, 1000, 0, 0, 8, 8, 10},
      {SESSION_BY_SUBMISSION, 11, 1000, 11, 1, 12, -1, -1},
      {SESSION_BY_SUBMISSION, 12, 1000, 0, 0, 12, -1, -1},
      {SESSION_BY_SUBMISSION, 13, 1000, 0, 0, 13, -1, -1},
      {SESSION_BY_COMPLETION, 0, 1000, 1, 9, 9, -1, -1},
      {SESSION_BY_COMPLETION, 2, 4, 3, 4, 6, -1, -1},
      {SESSION_BY_COMPLETION, 9, 1000, 0, 0, 9, -1, -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    results_as_tree(id, &cases[i], 10, 9);
  /* A budget of one byte: the first result alone, whatever its size. */
  setenv("MUSTER_TEST_REPLY_BUDGET", "1", 1);
  reply_budget_init();
  results_as_tree(id, &(results_case_t){SESSION_BY_SUBMISSION, 0, 1000, 0, 1, 1, -1, -1}, 10, 9);
  results_as_tree(id, &(results_case_t){SESSION_BY_COMPLETION, 4, 1000, 5, 1, 5, -1, -1}, 10, 9);
  setenv("MUSTER_TEST_REPLY_BUDGET", "16777216", 1);
  reply_budget_init();
  json_decref(leases);
  json_decref(made);
  free(deep);
}

/* ---- lease replies ---- */

/* The leases of "q" (state leased), in the order they were granted, as
 * lease objects built as trees from their rows. */
static json_t *old_leases(void) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, token, payload, attempts, deadline_ms, parent,"
                                   " session, idx, requires FROM tasks"
                                   " WHERE queue = 'q' AND state = 1 ORDER BY token");
  assert_non_null(s);
  json_t *list = json_array();
  while (sqlite3_step(s) == SQLITE_ROW) {
    json_t *lease = json_pack(
        "{s:I, s:I, s:o, s:I, s:I, s:o, s:o, s:o}", "task", (json_int_t)sqlite3_column_int64(s, 0),
        "token", (json_int_t)sqlite3_column_int64(s, 1), "payload",
        jv_decode((const char *)sqlite3_column_text(s, 2)), "attempt",
        (json_int_t)sqlite3_column_int64(s, 3), "deadline_ms",
        (json_int_t)sqlite3_column_int64(s, 4), "parent", old_int_or_null(s, 5), "session",
        old_text_or_null(s, 6), "index", old_int_or_null(s, 7));
    assert_non_null(lease);
    if (sqlite3_column_type(s, 8) != SQLITE_NULL)
      json_object_set_new(lease, "requires", jv_decode((const char *)sqlite3_column_text(s, 8)));
    json_array_append_new(list, lease);
  }
  store_reset(s);
  return list;
}

/* lease_reply_text of "q" from `updates_after` (-1: none wanted) as a whole
 * reply, "{...}"; `leased` and `updates` what it must count. */
static jw_buf_t lease_reply(int64_t updates_after, size_t leased, size_t updates) {
  queue_t q;
  load_queue("q", &q);
  jw_buf_t text = {0};
  lease_reply_counts_t n;
  fail_t f = {0};
  JW_ADD_LITERAL(&text, "{");
  if (lease_reply_text(st, &q, 0, 1000, NULL, updates_after, &text, &n, &f))
    fail_msg("lease: %s", f.message);
  JW_ADD_LITERAL(&text, "}");
  assert_int_equal(n.leased, leased);
  assert_int_equal(n.updates, updates);
  return text;
}

/* A lease reply written as text is the tree the lease path built before,
 * byte for byte: {"leases"} alone, and with "updates" and "updates_last"
 * after it, for tricky payloads (with every optional field) and updates. */
static void test_lease_reply_as_tree(void **unused) {
  make_queue("q", "{}");
  char *deep = deep_text(DEEPEST);
  size_t n = put_tricky(deep);
  for (size_t i = 0; i < TRICKY_N; i++)
    post_update(tricky[i], NULL);
  jw_buf_t got = lease_reply(0, n, TRICKY_N);
  json_t *want = json_pack("{s:o, s:o, s:I}", "leases", old_leases(), "updates", old_updates(),
                           "updates_last", (json_int_t)TRICKY_N);
  same_bytes(&got, want);
  json_decref(want);
  /* Nothing left to lease: no leases, the updates after 2, or none wanted. */
  got = lease_reply(2, 0, TRICKY_N - 2);
  want = json_pack("{s:[], s:o, s:I}", "leases", "updates", old_updates_after(2), "updates_last",
                   (json_int_t)TRICKY_N);
  same_bytes(&got, want);
  json_decref(want);
  got = lease_reply(-1, 0, 0);
  want = json_pack("{s:[]}", "leases");
  same_bytes(&got, want);
  json_decref(want);
  free(deep);
}

/* Sets column `col` of task `id` behind the head's back. */
static void corrupt(int64_t id, const char *col, const char *text) {
  char sql[96];
  snprintf(sql, sizeof sql, "UPDATE tasks SET %s = ?2 WHERE id = ?1", col);
  sqlite3_stmt *s = NULL;
  assert_int_equal(sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL), SQLITE_OK);
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_text(s, 2, text, -1, SQLITE_TRANSIENT);
  assert_int_equal(sqlite3_step(s), SQLITE_DONE);
  sqlite3_finalize(s);
}

/* Stored text that is not JSON goes out as the JSON string of it, as the
 * tree had it; JSON not as jw writes it goes out as it stands (the same
 * value); what is not UTF-8 goes out as null, where the tree could not be
 * built and the task was missing from its page: the page stays JSON. */
static void test_corrupt_rows(void **unused) {
  make_queue("q", "{}");
  int64_t ids[4];
  for (int i = 0; i < 4; i++)
    ids[i] = put_payload("1", "", true);
  corrupt(ids[0], "payload", "not json {");
  corrupt(ids[1], "payload", "{\"a\": 1}\n");
  corrupt(ids[2], "payload", "\"\xc3(");
  corrupt(ids[3], "error", "bad \xff byte");
  fail_t f = {0};
  json_t *page = task_list(st, "q", -1, 0, 100, &f);
  assert_non_null(page);
  size_t len;
  char *text = jw_dump(page, &len);
  assert_non_null(text);
  assert_non_null(strstr(text, ",\"payload\":\"not json {\",\"result\":"));
  assert_non_null(strstr(text, ",\"payload\":{\"a\": 1}\n,\"result\":"));
  assert_non_null(strstr(text, ",\"payload\":null,\"result\":"));
  assert_non_null(strstr(text, ",\"error\":null,"));
  json_t *back = json_loadb(text, len, 0, NULL);
  assert_non_null(back);
  assert_int_equal(json_array_size(json_object_get(back, "tasks")), 4);
  json_decref(back);
  free(text);
  json_decref(page);
}

int main(void) {
  log_set_level(LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_tasks_as_tree, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_updates_as_tree, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_init_data_as_tree, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_results_as_tree, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_lease_reply_as_tree, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_corrupt_rows, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
