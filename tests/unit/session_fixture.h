/*
 * session_fixture.h — helpers of the unit tests of closed sessions and what
 * they leave (test_session_close.c, test_leftover.c).  Included after
 * store_fixture.h, whose store `st` they use.
 */
#ifndef MUSTER_TESTS_SESSION_FIXTURE_H
#define MUSTER_TESTS_SESSION_FIXTURE_H

#include "server/lease.h"
#include "server/session.h"
#include "server/task.h"

/* Opens a session on `queue` with heartbeat timeout `timeout_ms`; its id
 * into `id` (SESSION_ID_LEN + 1 bytes). */
static inline void open_session(const char *queue, int64_t timeout_ms, char *id) {
  json_t *body = json_pack("{s:s, s:I}", "queue", queue, "timeout_ms", (json_int_t)timeout_ms);
  fail_t f = {0};
  json_t *s = session_create(st, body, 1 << 20, &f);
  assert_non_null(s);
  snprintf(id, SESSION_ID_LEN + 1, "%s", json_string_value(json_object_get(s, "id")));
  json_decref(s);
  json_decref(body);
}

/* Submits request `body` (which it consumes) to session `id`. */
static inline void submit_body(const char *id, json_t *body) {
  fail_t f = {0};
  json_t *out = session_submit(st, id, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("submit: %s", f.message);
  json_decref(out);
  json_decref(body);
}

/* Submits `n` tasks of `priority` to session `id` in one request. */
static inline void submit(const char *id, int64_t n, int64_t priority) {
  json_t *tasks = json_array();
  for (int64_t i = 0; i < n; i++)
    json_array_append_new(
        tasks, json_pack("{s:I, s:I}", "payload", (json_int_t)i, "priority", (json_int_t)priority));
  submit_body(id, json_pack("{s:o}", "tasks", tasks));
}

/* Submits `n` tasks to session `id`, TASK_MAX_BATCH a request. */
static inline void submit_many(const char *id, int64_t n) {
  for (; n > 0; n -= TASK_MAX_BATCH)
    submit(id, n < TASK_MAX_BATCH ? n : TASK_MAX_BATCH, 0);
}

/* Puts one plain task of `priority` into `queue`; returns its id. */
static inline int64_t put_one(const char *queue, int64_t priority) {
  json_t *body =
      json_pack("{s:[{s:s, s:I}]}", "tasks", "payload", "plain", "priority", (json_int_t)priority);
  fail_t f = {0};
  json_t *out = task_put(st, queue, body, 1 << 20, &f);
  assert_non_null(out);
  json_t *tree = reply_tree(out);
  int64_t id = jint(json_array_get(json_object_get(tree, "tasks"), 0), "id");
  json_decref(tree);
  json_decref(out);
  json_decref(body);
  return id;
}

/* Completes every lease of `leases`. */
static inline void complete_all(const json_t *leases) {
  json_t *items = json_array();
  for (size_t i = 0; i < json_array_size(leases); i++) {
    const json_t *l = json_array_get(leases, i);
    json_array_append_new(items, json_pack("{s:I, s:I, s:s}", "task", (json_int_t)jint(l, "task"),
                                           "token", (json_int_t)jint(l, "token"), "result", "r"));
  }
  json_t *body = json_pack("{s:o}", "leases", items);
  fail_t f = {0};
  json_t *out = lease_apply(st, LEASE_COMPLETE, body, 1 << 20, &f);
  if (out == NULL)
    fail_msg("complete: %s", f.message);
  json_decref(out);
  json_decref(body);
}

#endif
