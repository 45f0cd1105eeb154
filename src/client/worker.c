/*
 * worker.c — libmuster's worker calls: register, heartbeat, bye
 * (docs/api.md, "Workers").
 *
 * A registered worker names itself in leases so that its leases end with its
 * `bye` or its heartbeat timeout; the heartbeat also carries a progress string
 * for the dashboard.
 */
#include "client/client_internal.h"

#include <stdlib.h>
#include <string.h>

#define WORKER_PATH_MAX 128

/* The end of muster_worker_opts_t's first version, the fields it was first
 * published with: instance came later and may be missing. */
#define WORKER_OPTS_FIRST_END OPTS_END(muster_worker_opts_t, timeout_ms)

void muster_worker_opts_init_sized(muster_worker_opts_t *opts, size_t size) {
  const muster_worker_opts_t defaults = {.size = sizeof defaults, .timeout_ms = -1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* Sets string field `key` when `text` is not NULL; -1 on bad UTF-8 or no memory. */
static int worker_set_text(json_t *body, const char *key, const char *text) {
  if (text == NULL)
    return 0;
  json_t *s = json_string(text);
  return s ? json_object_set_new(body, key, s) : -1;
}

/* Adds "queues": [...] from the NULL-terminated list `queues`. */
static int worker_set_queues(json_t *body, const char *const *queues) {
  if (queues == NULL)
    return 0;
  json_t *list = json_array();
  if (list == NULL || json_object_set_new(body, "queues", list) != 0)
    return -1;
  for (size_t i = 0; queues[i] != NULL; i++) {
    json_t *s = json_string(queues[i]);
    if (s == NULL || json_array_append_new(list, s) != 0)
      return -1;
  }
  return 0;
}

/* Builds the registration body from `opts` (taken in full) into *out. */
static muster_err_t worker_body(muster_client_t *client, const muster_worker_opts_t *opts,
                                json_t **out) {
  json_t *body = json_object();
  if (body == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  json_t *labels = NULL;
  if (client_check_min(client, "timeout_ms", opts->timeout_ms, -1,
                       "a time in milliseconds, or -1 for the head's default") != MUSTER_OK)
    goto fail;
  if (opts->labels != NULL && (labels = client_parse_value(client, opts->labels, "labels")) == NULL)
    goto fail;
  if (labels != NULL && !json_is_object(labels)) {
    json_decref(labels);
    client_fail(client, MUSTER_INVALID, "labels: expected a JSON object");
    goto fail;
  }
  if ((labels && json_object_set_new(body, "labels", labels) != 0) ||
      worker_set_text(body, "nickname", opts->nickname) != 0 ||
      worker_set_text(body, "node", opts->node) != 0 || worker_set_queues(body, opts->queues) ||
      worker_set_text(body, "instance", opts->instance) != 0 ||
      (opts->timeout_ms >= 0 &&
       json_object_set_new(body, "timeout_ms", json_integer((json_int_t)opts->timeout_ms)))) {
    client_fail(client, MUSTER_INVALID, "worker options: a text is not valid UTF-8");
    goto fail;
  }
  *out = body;
  return MUSTER_OK;
fail:
  json_decref(body);
  return MUSTER_INVALID;
}

muster_err_t muster_worker_register(muster_client_t *client, const muster_worker_opts_t *opts,
                                    int64_t *id, char **name) {
  if (name)
    *name = NULL;
  if (client == NULL || id == NULL)
    return client ? client_fail(client, MUSTER_INVALID, "a place for the id is required")
                  : MUSTER_INVALID;
  json_t *body = NULL, *reply = NULL;
  muster_worker_opts_t taken; /* the caller's options over this library's defaults */
  muster_worker_opts_init(&taken);
  muster_err_t err = MUSTER_OK;
  if (opts != NULL)
    err = client_opts_take(client, &taken, sizeof taken, opts, WORKER_OPTS_FIRST_END, "opts",
                           "muster_worker_opts_init");
  if (err == MUSTER_OK)
    err = worker_body(client, &taken, &body);
  if (err != MUSTER_OK)
    return err;
  err = client_call(client, "POST", "/v1/workers", body, 0, &reply);
  json_decref(body);
  int64_t got = 0;
  if (err == MUSTER_OK && (client_get_int(reply, "id", 0, &got) != 0 || got <= 0))
    err = client_fail(client, MUSTER_PROTOCOL, "register reply has no worker id");
  const char *display = json_string_value(json_object_get(reply, "name"));
  if (err == MUSTER_OK && name != NULL && (*name = strdup(display ? display : "")) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  if (err == MUSTER_OK)
    *id = got;
  json_decref(reply);
  return err;
}

muster_err_t muster_worker_heartbeat(muster_client_t *client, int64_t id, const char *progress) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[WORKER_PATH_MAX];
  muster_err_t err =
      client_path(client, path, sizeof path, "/v1/workers/%lld/heartbeat", (long long)id);
  if (err != MUSTER_OK)
    return err;
  json_t *body = json_object();
  if (body == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  if (worker_set_text(body, "progress", progress) != 0) {
    json_decref(body);
    return client_fail(client, MUSTER_INVALID, "progress: not valid UTF-8");
  }
  err = client_call(client, "POST", path, body, 0, NULL);
  json_decref(body);
  return err;
}

muster_err_t muster_worker_bye(muster_client_t *client, int64_t id) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[WORKER_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/workers/%lld", (long long)id);
  if (err != MUSTER_OK)
    return err;
  return client_call(client, "DELETE", path, NULL, 0, NULL);
}
