/*
 * queue.c — libmuster's queue calls: create/configure, inspect, list, purge,
 * delete (docs/api.md, "Queues").
 *
 * Queue objects are handed back as the server's JSON text; the library does not
 * model them as structs, so new fields reach callers without a new release.
 */
#include "client/client_internal.h"

#include <stdlib.h>
#include <string.h>

#define QUEUE_PATH_MAX 1024

/* The end of muster_queue_opts_t's first version, the fields it was first
 * published with: keep_done_ms came later and may be missing. */
#define QUEUE_OPTS_FIRST_END OPTS_END(muster_queue_opts_t, next)

void muster_queue_opts_init_sized(muster_queue_opts_t *opts, size_t size) {
  const muster_queue_opts_t defaults = {.size = sizeof defaults,
                                        .lease_ms = -1,
                                        .max_attempts = -1,
                                        .backoff_ms = -1,
                                        .backoff_max_ms = -1,
                                        .max_flags = -1,
                                        .next = NULL,
                                        .keep_done_ms = -1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* Adds `key` = `value` to `body` unless the value is -1 ("leave it"). */
static int queue_set_int(json_t *body, const char *key, int64_t value) {
  if (value == -1)
    return 0;
  return json_object_set_new(body, key, json_integer((json_int_t)value));
}

/* The PUT body for `opts` (taken in full): only the settings the caller
 * named.  New reference. */
static json_t *queue_opts_body(const muster_queue_opts_t *opts) {
  json_t *body = json_object();
  if (body == NULL)
    return body;
  int rc = queue_set_int(body, "lease_ms", opts->lease_ms);
  rc |= queue_set_int(body, "max_attempts", opts->max_attempts);
  rc |= queue_set_int(body, "backoff_ms", opts->backoff_ms);
  rc |= queue_set_int(body, "backoff_max_ms", opts->backoff_max_ms);
  rc |= queue_set_int(body, "max_flags", opts->max_flags);
  if (opts->next != NULL)
    rc |= json_object_set_new(body, "next", opts->next[0] ? json_string(opts->next) : json_null());
  if (opts->keep_done_ms == MUSTER_KEEP_DONE_FOREVER)
    rc |= json_object_set_new(body, "keep_done_ms", json_null());
  else
    rc |= queue_set_int(body, "keep_done_ms", opts->keep_done_ms);
  if (rc != 0) {
    json_decref(body);
    return NULL;
  }
  return body;
}

/* Stores the reply `value` as text in *json when the caller asked for it. */
static muster_err_t queue_hand_back(muster_client_t *client, json_t *value, char **json) {
  if (json == NULL)
    return MUSTER_OK;
  *json = client_dump_value(value);
  if (*json == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

/* Runs a call whose whole reply is handed back as JSON text (or dropped). */
static muster_err_t queue_call_json(muster_client_t *client, const char *method, const char *path,
                                    json_t *body, char **json) {
  json_t *reply = NULL;
  muster_err_t err = client_call(client, method, path, body, 0, json ? &reply : NULL);
  if (err == MUSTER_OK)
    err = queue_hand_back(client, reply, json);
  json_decref(reply);
  return err;
}

muster_err_t muster_queue_put(muster_client_t *client, const char *name,
                              const muster_queue_opts_t *opts, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue name is required");
  char path[QUEUE_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s", name);
  if (err != MUSTER_OK)
    return err;
  muster_queue_opts_t taken; /* the caller's options over this library's defaults */
  muster_queue_opts_init(&taken);
  if (opts != NULL &&
      (err = client_opts_take(client, &taken, sizeof taken, opts, QUEUE_OPTS_FIRST_END, "opts",
                              "muster_queue_opts_init")) != MUSTER_OK)
    return err;
  json_t *body = queue_opts_body(&taken);
  if (body == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  err = queue_call_json(client, "PUT", path, body, json);
  json_decref(body);
  return err;
}

muster_err_t muster_queue_get(muster_client_t *client, const char *name, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue name is required");
  char path[QUEUE_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s", name);
  if (err != MUSTER_OK)
    return err;
  return queue_call_json(client, "GET", path, NULL, json);
}

muster_err_t muster_queue_list(muster_client_t *client, char **json) {
  if (json)
    *json = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  return queue_call_json(client, "GET", "/v1/queues", NULL, json);
}

muster_err_t muster_queue_purge(muster_client_t *client, const char *name, int64_t *purged) {
  if (purged)
    *purged = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue name is required");
  char path[QUEUE_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/purge", name);
  if (err != MUSTER_OK)
    return err;
  json_t *reply = NULL;
  err = client_call(client, "POST", path, NULL, 0, &reply);
  if (err == MUSTER_OK) {
    int64_t count = 0;
    if (client_get_int(reply, "purged", 0, &count) != 0)
      err = client_fail(client, MUSTER_PROTOCOL, "purge reply: 'purged' is not an integer");
    else if (purged)
      *purged = count;
  }
  json_decref(reply);
  return err;
}

muster_err_t muster_queue_delete(muster_client_t *client, const char *name) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue name is required");
  char path[QUEUE_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s", name);
  if (err != MUSTER_OK)
    return err;
  return client_call(client, "DELETE", path, NULL, 0, NULL);
}
