/*
 * task.c — libmuster's task calls: batch put, get, list, requeue
 * (docs/api.md, "Tasks").
 *
 * Payloads travel as JSON text in both directions.  muster_put checks each one
 * before anything is sent, so a bad payload is refused locally with the index
 * of the element, the way the server would name it, and nothing is stored.
 * The body is written as text (jtext.h): a payload is spliced as it stands
 * when the scanner shows it canonical, and parsed and dumped by jansson
 * otherwise, which also gives the error of a bad one; the reply's ids are
 * scanned from its text, with the tree as the fallback.
 */
#include "client/client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASK_PATH_MAX 1024

void muster_task_spec_init(muster_task_spec_t *spec) {
  if (spec == NULL)
    return;
  memset(spec, 0, sizeof *spec);
  spec->index = -1;
}

/* Appends `,"key":` and `text` as a JSON string when `text` is not NULL,
 * refusing text that is not valid UTF-8 as json_string did. */
static muster_err_t task_add_text(muster_client_t *client, jtext_buf_t *b, const char *key,
                                  const char *text, size_t i) {
  if (text == NULL)
    return MUSTER_OK;
  size_t at = b->len;
  jtext_add(b, ",\"", 2);
  jtext_add(b, key, strlen(key));
  jtext_add(b, "\":", 2);
  if (jtext_add_string(b, text))
    return MUSTER_OK;
  b->len = at;
  return client_fail(client, MUSTER_INVALID, "tasks[%zu].%s: not valid UTF-8", i, key);
}

/* Appends `,"key":v` when `set`. */
static void task_add_int(jtext_buf_t *b, const char *key, int64_t v, bool set) {
  if (!set)
    return;
  jtext_add(b, ",\"", 2);
  jtext_add(b, key, strlen(key));
  jtext_add(b, "\":", 2);
  jtext_add_int(b, v);
}

/* Checks that an optional string field is valid UTF-8, as JSON requires. */
static bool task_utf8(const char *text) {
  if (text == NULL)
    return true;
  const unsigned char *p = (const unsigned char *)text, *end = p + strlen(text);
  while (p < end) {
    size_t n = jcanon_utf8_length(p, end);
    if (n == 0)
      return false;
    p += n;
  }
  return true;
}

/* Appends the wire element for `spec` (tasks[`i`]): its fields in the order
 * the old tree had them, so the bytes are the same, and then "requires" when
 * `required` (its JSON text) is not NULL.  Fails with MUSTER_INVALID naming
 * tasks[`i`] when the payload is missing or not JSON, or a key or session is
 * not UTF-8, checked in the old order. */
static muster_err_t task_add_spec(muster_client_t *client, const muster_task_spec_t *spec, size_t i,
                                  const char *required, jtext_buf_t *b) {
  if (spec->payload == NULL)
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].payload: required", i);
  if (!task_utf8(spec->key))
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].key: not valid UTF-8", i);
  if (!task_utf8(spec->session))
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].session: not valid UTF-8", i);
  JTEXT_ADD_LITERAL(b, "{\"payload\":");
  muster_err_t err = client_add_json(client, b, spec->payload, "tasks", i, "payload");
  if (err != MUSTER_OK)
    return err;
  task_add_int(b, "priority", spec->priority, spec->priority != 0);
  task_add_int(b, "delay_ms", spec->delay_ms, spec->delay_ms != 0);
  task_add_int(b, "index", spec->index, spec->index >= 0);
  if ((err = task_add_text(client, b, "key", spec->key, i)) != MUSTER_OK ||
      (err = task_add_text(client, b, "session", spec->session, i)) != MUSTER_OK)
    return err;
  if (required != NULL) {
    JTEXT_ADD_LITERAL(b, ",\"requires\":");
    jtext_add(b, required, strlen(required));
  }
  JTEXT_ADD_LITERAL(b, "}");
  return MUSTER_OK;
}

muster_err_t task_put_body(muster_client_t *client, const muster_task_spec_t *specs, size_t count,
                           jtext_buf_t *b) {
  return task_put_body_requiring(client, specs, count, NULL, b);
}

muster_err_t task_put_body_requiring(muster_client_t *client, const muster_task_spec_t *specs,
                                     size_t count, const json_t *required, jtext_buf_t *b) {
  char *text = required != NULL ? client_dump_value(required) : NULL;
  if (required != NULL && text == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  jtext_reset(b);
  JTEXT_ADD_LITERAL(b, "{\"tasks\":[");
  muster_err_t err = MUSTER_OK;
  for (size_t i = 0; err == MUSTER_OK && i < count; i++) {
    if (i > 0)
      JTEXT_ADD_LITERAL(b, ",");
    err = task_add_spec(client, &specs[i], i, text, b);
  }
  free(text);
  if (err != MUSTER_OK)
    return err;
  JTEXT_ADD_LITERAL(b, "]}");
  return b->failed ? client_fail(client, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

bool task_scan_ids(const char *text, size_t len, size_t count, int64_t *ids) {
  if (len == 0)
    return false;
  const char *p = text, *end = text + len;
  if (!CLIENT_SCAN_LIT(&p, end, "{\"tasks\":["))
    return false;
  size_t n = 0;
  while (p < end && *p != ']') {
    int64_t id;
    if (n == count || (n > 0 && *p++ != ',') || !CLIENT_SCAN_LIT(&p, end, "{\"id\":") ||
        !jtext_int(&p, end, &id) || id <= 0 || !CLIENT_SCAN_LIT(&p, end, ",\"created\":"))
      return false;
    if (!CLIENT_SCAN_LIT(&p, end, "true}") && !CLIENT_SCAN_LIT(&p, end, "false}"))
      return false;
    if (ids)
      ids[n] = id;
    n++;
  }
  return n == count && CLIENT_SCAN_LIT(&p, end, "]}") && jtext_only_space(p, end);
}

/* Copies the ids of the put reply into `ids` (count elements). */
static muster_err_t task_read_ids(muster_client_t *client, json_t *reply, size_t count,
                                  int64_t *ids) {
  json_t *tasks = json_object_get(reply, "tasks");
  if (!json_is_array(tasks) || json_array_size(tasks) != count)
    return client_fail(client, MUSTER_PROTOCOL, "put reply: expected %zu tasks", count);
  for (size_t i = 0; i < count; i++) {
    int64_t id = 0;
    if (client_get_int(json_array_get(tasks, i), "id", 0, &id) != 0 || id <= 0)
      return client_fail(client, MUSTER_PROTOCOL, "put reply: tasks[%zu].id is missing", i);
    if (ids)
      ids[i] = id;
  }
  return MUSTER_OK;
}

/* The put reply's ids: scanned from its text, or read from its tree. */
static muster_err_t task_reply_ids(muster_client_t *client, const char *path, size_t count,
                                   int64_t *ids) {
  if (task_scan_ids(client->reply.data, client->reply.len, count, ids)) {
    client_ok(client);
    return MUSTER_OK;
  }
  json_t *reply = NULL;
  muster_err_t err = client_reply_tree(client, "POST", path, &reply);
  if (err == MUSTER_OK)
    err = task_read_ids(client, reply, count, ids);
  if (err == MUSTER_OK)
    client_ok(client);
  json_decref(reply);
  return err;
}

muster_err_t muster_put(muster_client_t *client, const char *queue, const muster_task_spec_t *specs,
                        size_t count, int64_t *ids) {
  return muster_put_requiring(client, queue, specs, count, NULL, 0, ids);
}

muster_err_t muster_put_requiring(muster_client_t *client, const char *queue,
                                  const muster_task_spec_t *specs, size_t count,
                                  const muster_shared_level_t *levels, size_t nlevels,
                                  int64_t *ids) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL || (specs == NULL && count > 0))
    return client_fail(client, MUSTER_INVALID, "a queue and the task specs are required");
  char path[TASK_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/tasks", queue);
  if (err == MUSTER_OK)
    err = requires_check(client, levels, nlevels);
  if (err != MUSTER_OK)
    return err;
  json_t *required = nlevels > 0 ? requires_tree(levels, nlevels) : NULL;
  if (nlevels > 0 && required == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  err = task_put_body_requiring(client, specs, count, required, &client->body);
  json_decref(required);
  if (err == MUSTER_OK)
    err = client_call_text(client, "POST", path, client->body.data, 0);
  if (err == MUSTER_OK)
    err = task_reply_ids(client, path, count, ids);
  return err;
}

/* Runs a GET whose reply is handed back as JSON text in *json. */
static muster_err_t task_get_json(muster_client_t *client, const char *path, char **json) {
  json_t *reply = NULL;
  muster_err_t err = client_call(client, "GET", path, NULL, 0, &reply);
  if (err == MUSTER_OK && json != NULL && (*json = client_dump_value(reply)) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  json_decref(reply);
  return err;
}

muster_err_t muster_task_get(muster_client_t *client, int64_t id, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  char path[TASK_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/tasks/%lld", (long long)id);
  if (err != MUSTER_OK)
    return err;
  return task_get_json(client, path, json);
}

muster_err_t muster_task_list(muster_client_t *client, const char *queue, const char *state,
                              int64_t after, int64_t limit, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue name is required");
  char path[TASK_PATH_MAX];
  muster_err_t err;
  if (state != NULL)
    err = client_path(client, path, sizeof path, "/v1/queues/%s/tasks?state=%s&after=%lld", queue,
                      state, (long long)after);
  else
    err = client_path(client, path, sizeof path, "/v1/queues/%s/tasks?after=%lld", queue,
                      (long long)after);
  if (err != MUSTER_OK)
    return err;
  if (limit > 0) {
    size_t at = strlen(path);
    snprintf(path + at, sizeof path - at, "&limit=%lld", (long long)limit);
  }
  return task_get_json(client, path, json);
}

muster_err_t muster_task_requeue(muster_client_t *client, int64_t id) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[TASK_PATH_MAX];
  muster_err_t err =
      client_path(client, path, sizeof path, "/v1/tasks/%lld/requeue", (long long)id);
  if (err != MUSTER_OK)
    return err;
  return client_call(client, "POST", path, NULL, 0, NULL);
}
