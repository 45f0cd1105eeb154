/*
 * session.c — libmuster's session, update, node and worker-list calls
 * (docs/api.md, "Sessions", "Updates", "Nodes", "Workers").
 *
 * These are thin: build the body, call, read the reply.  The one with some
 * shape of its own is muster_session_results, which turns a page of the
 * results stream into muster_result_t values whose results stay JSON text,
 * the way payloads and results travel everywhere else in the library.
 * pool.c builds map and imap_unordered on top of these calls.
 */
#include "client/client_internal.h"
#include "core/limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SESSION_PATH_MAX 1024

/* The end of muster_session_opts_t's first version, the fields it was first
 * published with (all it has so far). */
#define SESSION_OPTS_FIRST_END OPTS_END(muster_session_opts_t, init_data)

void muster_session_opts_init_sized(muster_session_opts_t *opts, size_t size) {
  const muster_session_opts_t defaults = {
      .size = sizeof defaults, .cleanup_on_exit = -1, .timeout_ms = -1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* Builds the create body from `opts` into *out (new reference). */
static muster_err_t session_body(muster_client_t *client, const muster_session_opts_t *opts,
                                 json_t **out) {
  if (opts == NULL || opts->queue == NULL)
    return client_fail(client, MUSTER_INVALID, "queue: required");
  if (opts->timeout_ms < -1)
    return client_check_min(client, "timeout_ms", opts->timeout_ms, -1,
                            "a time in milliseconds, or -1 for the head's default");
  json_t *queue = json_string(opts->queue);
  if (queue == NULL)
    return client_fail(client, MUSTER_INVALID, "queue: not valid UTF-8");
  json_t *body = json_object();
  if (body == NULL || json_object_set_new(body, "queue", queue) != 0) {
    json_decref(body);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  int rc = 0;
  if (opts->cleanup_on_exit >= 0)
    rc |= json_object_set_new(body, "cleanup_on_exit", json_boolean(opts->cleanup_on_exit));
  if (opts->timeout_ms >= 0)
    rc |= json_object_set_new(body, "timeout_ms", json_integer((json_int_t)opts->timeout_ms));
  if (opts->init_data != NULL) {
    json_t *init = client_parse_value(client, opts->init_data, "init_data");
    if (init == NULL) {
      json_decref(body);
      return MUSTER_INVALID;
    }
    rc |= json_object_set_new(body, "init_data", init);
  }
  if (rc != 0) {
    json_decref(body);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  *out = body;
  return MUSTER_OK;
}

/* Copies the text of `reply` (or of its field `id`) for the caller.  Returns
 * MUSTER_OK, or MUSTER_NOMEM / MUSTER_PROTOCOL with the message set. */
static muster_err_t session_take(muster_client_t *client, json_t *reply, char **id, char **json) {
  const char *sid = json_string_value(json_object_get(reply, "id"));
  if (id != NULL && sid == NULL)
    return client_fail(client, MUSTER_PROTOCOL, "the session reply has no id");
  if (id != NULL && (*id = strdup(sid)) == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  if (json != NULL && (*json = client_dump_value(reply)) == NULL) {
    if (id != NULL) {
      free(*id);
      *id = NULL;
    }
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  return MUSTER_OK;
}

muster_err_t muster_session_create(muster_client_t *client, const muster_session_opts_t *opts,
                                   char **id, char **json) {
  if (id)
    *id = NULL;
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  json_t *body = NULL, *reply = NULL;
  muster_session_opts_t taken; /* the caller's options over this library's defaults */
  muster_session_opts_init(&taken);
  muster_err_t err = MUSTER_OK;
  if (opts != NULL)
    err = client_opts_take(client, &taken, sizeof taken, opts, SESSION_OPTS_FIRST_END, "opts",
                           "muster_session_opts_init");
  if (err == MUSTER_OK)
    err = session_body(client, opts ? &taken : NULL, &body);
  if (err != MUSTER_OK)
    return err;
  err = client_call(client, "POST", "/v1/sessions", body, 0, &reply);
  json_decref(body);
  if (err == MUSTER_OK)
    err = session_take(client, reply, id, json);
  json_decref(reply);
  return err;
}

/* GETs `path` and hands its reply to the caller as text. */
static muster_err_t session_get_text(muster_client_t *client, const char *path, char **json) {
  json_t *reply = NULL;
  muster_err_t err = client_call(client, "GET", path, NULL, 0, &reply);
  if (err == MUSTER_OK && json != NULL)
    err = session_take(client, reply, NULL, json);
  json_decref(reply);
  return err;
}

/* Formats "/v1/sessions/{id}{suffix}" into `path`; refuses a missing id. */
static muster_err_t session_path(muster_client_t *client, char *path, size_t size, const char *id,
                                 const char *suffix) {
  if (id == NULL || id[0] == '\0')
    return client_fail(client, MUSTER_INVALID, "a session id is required");
  char fmt[64];
  snprintf(fmt, sizeof fmt, "/v1/sessions/%%s%s", suffix);
  return client_path(client, path, size, fmt, id);
}

muster_err_t muster_session_get(muster_client_t *client, const char *id, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SESSION_PATH_MAX];
  muster_err_t err = session_path(client, path, sizeof path, id, "");
  return err == MUSTER_OK ? session_get_text(client, path, json) : err;
}

muster_err_t muster_session_list(muster_client_t *client, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  return session_get_text(client, "/v1/sessions", json);
}

muster_err_t muster_session_heartbeat(muster_client_t *client, const char *id) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SESSION_PATH_MAX];
  muster_err_t err = session_path(client, path, sizeof path, id, "/heartbeat");
  return err == MUSTER_OK ? client_call(client, "POST", path, NULL, 0, NULL) : err;
}

muster_err_t muster_session_seal(muster_client_t *client, const char *id, int *already) {
  if (already)
    *already = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SESSION_PATH_MAX];
  json_t *reply = NULL;
  muster_err_t err = session_path(client, path, sizeof path, id, "/seal");
  if (err == MUSTER_OK)
    err = client_call(client, "POST", path, NULL, 0, &reply);
  /* A plain not_found (an unknown session is session_not_found) is a head
   * without the route: its own "no endpoint" does not say why. */
  if (err == MUSTER_NOT_FOUND)
    client_fail(client, err,
                "the head at %s has no endpoint POST %s: it is older than this client and "
                "cannot seal sessions; upgrade the head (docs/operations.md, \"Versions side "
                "by side\")",
                client->base_url, path);
  if (err == MUSTER_OK && already != NULL)
    *already = json_is_true(json_object_get(reply, "already_sealed"));
  json_decref(reply);
  return err;
}

muster_err_t muster_session_close(muster_client_t *client, const char *id, int64_t *cancelled) {
  if (cancelled)
    *cancelled = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SESSION_PATH_MAX];
  muster_err_t err = session_path(client, path, sizeof path, id, "");
  json_t *reply = NULL;
  if (err == MUSTER_OK)
    err = client_call(client, "DELETE", path, NULL, 0, &reply);
  int64_t n = 0;
  if (err == MUSTER_OK && cancelled != NULL && client_get_int(reply, "cancelled", 0, &n) == 0)
    *cancelled = n;
  json_decref(reply);
  return err;
}

/* ---- submitting -------------------------------------------------------------- */

/* The wire element of session task `spec` (element `i`) into *out, with
 * `required` (NULL: none) as its "requires". */
static muster_err_t session_task_json(muster_client_t *client, const muster_task_spec_t *spec,
                                      size_t i, json_t *required, json_t **out) {
  if (spec->key != NULL || spec->session != NULL || spec->delay_ms != 0)
    return client_fail(client, MUSTER_INVALID,
                       "tasks[%zu]: a session task takes no key, session or delay", i);
  if (spec->payload == NULL)
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].payload: required", i);
  char what[64];
  snprintf(what, sizeof what, "tasks[%zu].payload", i);
  json_t *payload = client_parse_value(client, spec->payload, what);
  if (payload == NULL)
    return MUSTER_INVALID;
  json_t *elem = json_object();
  int rc = elem ? json_object_set_new(elem, "payload", payload) : (json_decref(payload), -1);
  if (rc == 0 && spec->priority != 0)
    rc = json_object_set_new(elem, "priority", json_integer((json_int_t)spec->priority));
  if (rc == 0 && spec->index >= 0)
    rc = json_object_set_new(elem, "index", json_integer((json_int_t)spec->index));
  if (rc == 0 && required != NULL)
    rc = json_object_set(elem, "requires", required);
  if (rc != 0) {
    json_decref(elem);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  *out = elem;
  return MUSTER_OK;
}

/* Builds {"tasks": [...]} from `specs`, each requiring `required` (NULL:
 * nothing), into *out (new reference). */
static muster_err_t session_put_body(muster_client_t *client, const muster_task_spec_t *specs,
                                     size_t count, json_t *required, json_t **out) {
  json_t *list = json_array();
  json_t *body = json_object();
  muster_err_t err = MUSTER_OK;
  if (list == NULL || body == NULL || json_object_set(body, "tasks", list) != 0)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; err == MUSTER_OK && i < count; i++) {
    json_t *elem = NULL;
    err = session_task_json(client, &specs[i], i, required, &elem);
    if (err == MUSTER_OK && json_array_append_new(list, elem) != 0)
      err = client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  json_decref(list);
  if (err != MUSTER_OK) {
    json_decref(body);
    return err;
  }
  *out = body;
  return MUSTER_OK;
}

/* Reads {"tasks": [{"id", "index"}, ...]} into `ids` / `indexes` (each may be NULL). */
static muster_err_t session_put_reply(muster_client_t *client, json_t *reply, size_t count,
                                      int64_t *ids, int64_t *indexes) {
  json_t *list = json_object_get(reply, "tasks");
  if (!json_is_array(list) || json_array_size(list) != count)
    return client_fail(client, MUSTER_PROTOCOL, "put reply: expected %zu tasks", count);
  for (size_t i = 0; i < count; i++) {
    json_t *elem = json_array_get(list, i);
    int64_t id = 0, index = -1;
    if (client_get_int(elem, "id", 0, &id) || client_get_int(elem, "index", -1, &index) || id <= 0)
      return client_fail(client, MUSTER_PROTOCOL, "put reply: tasks[%zu] is malformed", i);
    if (ids)
      ids[i] = id;
    if (indexes)
      indexes[i] = index;
  }
  return MUSTER_OK;
}

muster_err_t muster_session_put(muster_client_t *client, const char *id,
                                const muster_task_spec_t *specs, size_t count, int64_t *ids,
                                int64_t *indexes) {
  return muster_session_put_requiring(client, id, specs, count, NULL, 0, ids, indexes);
}

muster_err_t muster_session_put_requiring(muster_client_t *client, const char *id,
                                          const muster_task_spec_t *specs, size_t count,
                                          const muster_shared_level_t *levels, size_t nlevels,
                                          int64_t *ids, int64_t *indexes) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (specs == NULL && count > 0)
    return client_fail(client, MUSTER_INVALID, "tasks are required");
  if (count > TASK_MAX_BATCH)
    return client_fail(client, MUSTER_BATCH_TOO_LARGE, "at most %d tasks per request",
                       TASK_MAX_BATCH);
  char path[SESSION_PATH_MAX];
  muster_err_t err = session_path(client, path, sizeof path, id, "/tasks");
  if (err == MUSTER_OK)
    err = requires_check(client, levels, nlevels);
  json_t *required = NULL, *body = NULL, *reply = NULL;
  if (err == MUSTER_OK && nlevels > 0 && (required = requires_tree(levels, nlevels)) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  if (err == MUSTER_OK)
    err = session_put_body(client, specs, count, required, &body);
  if (err == MUSTER_OK)
    err = client_call(client, "POST", path, body, 0, &reply);
  if (err == MUSTER_OK)
    err = session_put_reply(client, reply, count, ids, indexes);
  json_decref(required);
  json_decref(body);
  json_decref(reply);
  return err;
}

/* ---- the results stream ---------------------------------------------------------- */

void muster_result_clear(muster_result_t *result) {
  if (result == NULL)
    return;
  free(result->state);
  free(result->result);
  free(result->error);
  result->state = result->result = result->error = NULL;
}

void muster_results_free(muster_results_t *results) {
  if (results == NULL)
    return;
  for (size_t i = 0; results->results != NULL && i < results->count; i++)
    muster_result_clear(&results->results[i]);
  free(results->results);
  memset(results, 0, sizeof *results);
  results->gap_first = results->gap_last = -1;
}

/* Fills `out` from wire result `obj`.  Returns 0, -1 when malformed, -2 on no memory. */
static int session_read_result(const json_t *obj, muster_result_t *out) {
  const char *state = json_string_value(json_object_get(obj, "state"));
  json_t *result = json_object_get(obj, "result");
  json_t *error = json_object_get(obj, "error");
  if (client_get_int(obj, "index", -1, &out->index) || client_get_int(obj, "task", 0, &out->task) ||
      client_get_int(obj, "seq", 0, &out->seq) || out->index < 0 || state == NULL ||
      (error != NULL && !json_is_null(error) && !json_is_string(error)))
    return -1;
  out->ok = strcmp(state, "done") == 0;
  if ((out->state = strdup(state)) == NULL)
    return -2;
  if (out->ok && (out->result = client_dump_value(result ? result : json_null())) == NULL)
    return -2;
  if (json_is_string(error) && (out->error = strdup(json_string_value(error))) == NULL)
    return -2;
  return 0;
}

/* Reads the reply's "gap" into *out: null (or absent, from an older head)
 * is none.  Returns 0, or -1 when malformed. */
static int session_read_gap(const json_t *reply, muster_results_t *out) {
  json_t *gap = json_object_get(reply, "gap");
  out->gap_first = out->gap_last = -1;
  if (gap == NULL || json_is_null(gap))
    return 0;
  if (!json_is_object(gap) || client_get_int(gap, "first", -1, &out->gap_first) ||
      client_get_int(gap, "last", -1, &out->gap_last) || out->gap_first < 0 ||
      out->gap_last < out->gap_first)
    return -1;
  return 0;
}

/* Turns a results reply into *out, and its "sealed" into *sealed (may be
 * NULL): -1 when absent (an older head). */
static muster_err_t session_read_results(muster_client_t *client, json_t *reply,
                                         muster_results_t *out, int *sealed) {
  json_t *list = json_object_get(reply, "results"), *seal = json_object_get(reply, "sealed");
  if (sealed != NULL)
    *sealed = json_is_boolean(seal) ? json_is_true(seal) : -1;
  if (!json_is_array(list) || (seal != NULL && !json_is_boolean(seal)) ||
      client_get_int(reply, "cursor", 0, &out->cursor) ||
      client_get_int(reply, "total", 0, &out->total) ||
      client_get_int(reply, "done", 0, &out->done) || session_read_gap(reply, out))
    return client_fail(client, MUSTER_PROTOCOL, "the results reply is malformed");
  size_t n = json_array_size(list);
  out->results = calloc(n ? n : 1, sizeof *out->results);
  if (out->results == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    out->count = i + 1;
    int rc = session_read_result(json_array_get(list, i), &out->results[i]);
    if (rc == -2)
      return client_fail(client, MUSTER_NOMEM, "out of memory");
    if (rc != 0)
      return client_fail(client, MUSTER_PROTOCOL, "the results reply: results[%zu] is malformed",
                         i);
  }
  return MUSTER_OK;
}

/* MUSTER_INDEX_GAP when page `out` of session `id` read nothing and stops at
 * a gap while every task of the session has its result, so that no result
 * can come at its cursor (muster.h); MUSTER_OK otherwise. */
static muster_err_t session_check_gap(muster_client_t *client, const char *id,
                                      const muster_results_t *out) {
  if (out->count > 0 || out->gap_first < 0 || out->done < out->total)
    return MUSTER_OK;
  long long first = (long long)out->gap_first, last = (long long)out->gap_last;
  char never[64], submit[64];
  if (last > first) {
    snprintf(never, sizeof never, "indexes %lld-%lld were", first, last);
    snprintf(submit, sizeof submit, "tasks at indexes %lld-%lld", first, last);
  } else {
    snprintf(never, sizeof never, "it was");
    snprintf(submit, sizeof submit, "a task at index %lld", first);
  }
  return client_fail(
      client, MUSTER_INDEX_GAP,
      "session %s: index %lld has no task (%s never submitted, or purged) and every task"
      " submitted (%lld) has its result, so the results in submission order"
      " cannot go past it; submit %s, or read on past it (from cursor %lld) or in"
      " completion order",
      id, first, never, (long long)out->total, submit, last + 1);
}

/* The path of a results read with its query into `path` (SESSION_PATH_MAX
 * bytes). */
static muster_err_t session_results_path(muster_client_t *client, const char *id,
                                         muster_order_t order, int64_t cursor, size_t max,
                                         int64_t wait_ms, char *path) {
  if (order != MUSTER_ORDER_SUBMISSION && order != MUSTER_ORDER_COMPLETION)
    return client_fail(client, MUSTER_INVALID,
                       "order: %d, expected MUSTER_ORDER_SUBMISSION (0) or "
                       "MUSTER_ORDER_COMPLETION (1)",
                       (int)order);
  char query[160];
  muster_err_t err =
      client_check_min(client, "wait_ms", wait_ms, 0, "0 or more milliseconds (0: do not wait)");
  if (err == MUSTER_OK)
    err = session_path(client, path, SESSION_PATH_MAX, id, "/results");
  if (err != MUSTER_OK)
    return err;
  int n =
      snprintf(query, sizeof query, "?order=%s&cursor=%lld",
               order == MUSTER_ORDER_COMPLETION ? "completion" : "submission", (long long)cursor);
  if (max > 0)
    n += snprintf(query + n, sizeof query - (size_t)n, "&max=%zu", max);
  if (wait_ms > 0)
    snprintf(query + n, sizeof query - (size_t)n, "&wait_ms=%lld", (long long)wait_ms);
  if (strlen(path) + strlen(query) >= SESSION_PATH_MAX)
    return client_fail(client, MUSTER_NAME_INVALID, "the session id is too long");
  strcat(path, query);
  return MUSTER_OK;
}

muster_err_t muster_session_results(muster_client_t *client, const char *id, muster_order_t order,
                                    int64_t cursor, size_t max, int64_t wait_ms,
                                    muster_results_t *out) {
  return muster_session_results_sealed(client, id, order, cursor, max, wait_ms, out, NULL);
}

muster_err_t muster_session_results_sealed(muster_client_t *client, const char *id,
                                           muster_order_t order, int64_t cursor, size_t max,
                                           int64_t wait_ms, muster_results_t *out, int *sealed) {
  if (sealed)
    *sealed = -1;
  if (out) {
    memset(out, 0, sizeof *out);
    out->gap_first = out->gap_last = -1;
  }
  if (client == NULL)
    return MUSTER_INVALID;
  if (out == NULL)
    return client_fail(client, MUSTER_INVALID, "a place for the results is required");
  char path[SESSION_PATH_MAX];
  muster_err_t err = session_results_path(client, id, order, cursor, max, wait_ms, path);
  if (err != MUSTER_OK)
    return err;
  json_t *reply = NULL;
  err = client_call(client, "GET", path, NULL, wait_ms > 0 ? (long)wait_ms : 0, &reply);
  if (err == MUSTER_OK)
    err = session_read_results(client, reply, out, sealed);
  if (err == MUSTER_OK)
    err = session_check_gap(client, id, out);
  json_decref(reply);
  return err;
}

/* ---- updates, nodes, workers --------------------------------------------------------- */

muster_err_t muster_update_post(muster_client_t *client, const char *queue, const char *data,
                                const char *session, int64_t *seq) {
  if (seq)
    *seq = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL || data == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue and the update's data are required");
  char path[SESSION_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/updates", queue);
  if (err != MUSTER_OK)
    return err;
  json_t *value = client_parse_value(client, data, "data");
  if (value == NULL)
    return MUSTER_INVALID;
  json_t *body = json_object();
  json_t *sid = session ? json_string(session) : NULL;
  if (body == NULL || json_object_set_new(body, "data", value) != 0 ||
      (session != NULL && (sid == NULL || json_object_set_new(body, "session", sid) != 0))) {
    json_decref(body);
    return client_fail(client, MUSTER_INVALID, "session: not valid UTF-8, or out of memory");
  }
  json_t *reply = NULL;
  err = client_call(client, "POST", path, body, 0, &reply);
  json_decref(body);
  int64_t got = 0;
  if (err == MUSTER_OK && (client_get_int(reply, "seq", 0, &got) != 0 || got <= 0))
    err = client_fail(client, MUSTER_PROTOCOL, "the update reply has no seq");
  if (err == MUSTER_OK && seq != NULL)
    *seq = got;
  json_decref(reply);
  return err;
}

muster_err_t muster_update_list(muster_client_t *client, const char *queue, int64_t after,
                                size_t max, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue is required");
  char path[SESSION_PATH_MAX], query[96];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/updates", queue);
  if (err != MUSTER_OK)
    return err;
  snprintf(query, sizeof query, "?after=%lld&max=%zu", (long long)after, max ? max : 100);
  if (strlen(path) + strlen(query) >= sizeof path)
    return client_fail(client, MUSTER_NAME_INVALID, "the queue name is too long");
  strcat(path, query);
  return session_get_text(client, path, json);
}

muster_err_t muster_node_list(muster_client_t *client, char **json) {
  if (json)
    *json = NULL;
  return client ? session_get_text(client, "/v1/nodes", json) : MUSTER_INVALID;
}

muster_err_t muster_worker_list(muster_client_t *client, char **json) {
  if (json)
    *json = NULL;
  return client ? session_get_text(client, "/v1/workers", json) : MUSTER_INVALID;
}
