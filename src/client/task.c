/*
 * task.c — libmuster's task calls: batch put, get, list, requeue
 * (docs/api.md, "Tasks").
 *
 * Payloads travel as JSON text in both directions.  muster_put parses each one
 * before anything is sent, so a bad payload is refused locally with the index
 * of the element, the way the server would name it, and nothing is stored.
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

/* Adds `key` = `text` when `text` is not NULL.  Returns 0, -1 on no memory. */
static int task_set_str(json_t *obj, const char *key, const char *text) {
  if (text == NULL)
    return 0;
  json_t *s = json_string(text);
  if (s == NULL)
    return -1;
  return json_object_set_new(obj, key, s);
}

/* Checks that an optional string field is valid UTF-8, as JSON requires. */
static muster_err_t task_check_text(muster_client_t *client, const char *text, size_t i,
                                    const char *field) {
  json_t *s = text ? json_string(text) : NULL;
  if (text != NULL && s == NULL)
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].%s: not valid UTF-8", i, field);
  json_decref(s);
  return MUSTER_OK;
}

/* Builds the wire element for `spec` into *out (new reference).  Fails with
 * MUSTER_INVALID naming tasks[`i`] when the payload is missing or not JSON. */
static muster_err_t task_spec_json(muster_client_t *client, const muster_task_spec_t *spec,
                                   size_t i, json_t **out) {
  char what[64];
  snprintf(what, sizeof what, "tasks[%zu].payload", i);
  if (spec->payload == NULL)
    return client_fail(client, MUSTER_INVALID, "%s: required", what);
  if (task_check_text(client, spec->key, i, "key") != MUSTER_OK ||
      task_check_text(client, spec->session, i, "session") != MUSTER_OK)
    return MUSTER_INVALID;
  json_t *payload = client_parse_value(client, spec->payload, what);
  if (payload == NULL)
    return MUSTER_INVALID;
  json_t *elem = json_object();
  int rc = elem ? json_object_set_new(elem, "payload", payload) : (json_decref(payload), -1);
  if (rc == 0 && spec->priority != 0)
    rc = json_object_set_new(elem, "priority", json_integer((json_int_t)spec->priority));
  if (rc == 0 && spec->delay_ms != 0)
    rc = json_object_set_new(elem, "delay_ms", json_integer((json_int_t)spec->delay_ms));
  if (rc == 0 && spec->index >= 0)
    rc = json_object_set_new(elem, "index", json_integer((json_int_t)spec->index));
  if (rc == 0)
    rc = task_set_str(elem, "key", spec->key);
  if (rc == 0)
    rc = task_set_str(elem, "session", spec->session);
  if (rc != 0) {
    json_decref(elem);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  *out = elem;
  return MUSTER_OK;
}

/* Builds {"tasks": [...]} for the batch into *out (new reference). */
static muster_err_t task_batch_json(muster_client_t *client, const muster_task_spec_t *specs,
                                    size_t count, json_t **out) {
  json_t *tasks = json_array();
  json_t *body = json_object();
  if (tasks == NULL || body == NULL || json_object_set(body, "tasks", tasks) != 0) {
    json_decref(tasks);
    json_decref(body);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  json_decref(tasks); /* body holds it now */
  for (size_t i = 0; i < count; i++) {
    json_t *elem = NULL;
    muster_err_t err = task_spec_json(client, &specs[i], i, &elem);
    if (err == MUSTER_OK && json_array_append_new(tasks, elem) != 0)
      err = client_fail(client, MUSTER_NOMEM, "out of memory");
    if (err != MUSTER_OK) {
      json_decref(body);
      return err;
    }
  }
  *out = body;
  return MUSTER_OK;
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

muster_err_t muster_put(muster_client_t *client, const char *queue, const muster_task_spec_t *specs,
                        size_t count, int64_t *ids) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL || (specs == NULL && count > 0))
    return client_fail(client, MUSTER_INVALID, "a queue and the task specs are required");
  char path[TASK_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/tasks", queue);
  if (err != MUSTER_OK)
    return err;
  json_t *body = NULL, *reply = NULL;
  if ((err = task_batch_json(client, specs, count, &body)) != MUSTER_OK)
    return err;
  err = client_call(client, "POST", path, body, 0, &reply);
  json_decref(body);
  if (err == MUSTER_OK)
    err = task_read_ids(client, reply, count, ids);
  if (err == MUSTER_OK)
    client_ok(client);
  json_decref(reply);
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
