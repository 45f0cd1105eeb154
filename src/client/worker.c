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

/* The end of muster_worker_reg_t's first version: all it was published with. */
#define WORKER_REG_FIRST_END OPTS_END(muster_worker_reg_t, repeated)

void muster_worker_reg_init_sized(muster_worker_reg_t *reg, size_t size) {
  const muster_worker_reg_t defaults = {.size = sizeof defaults};
  opts_init_sized(reg, size, &defaults, sizeof defaults);
}

void muster_worker_reg_clear(muster_worker_reg_t *reg) {
  if (reg == NULL)
    return;
  muster_free(reg->name);
  reg->name = NULL;
}

/* Builds the registration body from the caller's `opts` (NULL: all
 * defaults), taken over this library's defaults, into *body. */
static muster_err_t worker_request(muster_client_t *client, const muster_worker_opts_t *opts,
                                   json_t **body) {
  muster_worker_opts_t taken;
  muster_worker_opts_init(&taken);
  muster_err_t err = MUSTER_OK;
  if (opts != NULL)
    err = client_opts_take(client, &taken, sizeof taken, opts, WORKER_OPTS_FIRST_END, "opts",
                           "muster_worker_opts_init");
  return err == MUSTER_OK ? worker_body(client, &taken, body) : err;
}

/*
 * Reads the registration's reply into *got (this library's whole struct):
 * the id (required), the name (copied: the caller's), the timeout (0 when the
 * reply has none, as an older head's) and whether it was a repeat.
 */
static muster_err_t worker_read_reply(muster_client_t *client, json_t *reply,
                                      muster_worker_reg_t *got) {
  int64_t id = 0, timeout_ms = 0;
  if (client_get_int(reply, "id", 0, &id) != 0 || id <= 0)
    return client_fail(client, MUSTER_PROTOCOL, "register reply has no worker id");
  if (client_get_int(reply, "timeout_ms", 0, &timeout_ms) != 0 || timeout_ms < 0)
    timeout_ms = 0; /* not a timeout: as if the head had not said */
  const char *display = json_string_value(json_object_get(reply, "name"));
  if ((got->name = strdup(display ? display : "")) == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  got->id = id;
  got->timeout_ms = timeout_ms;
  got->repeated = json_is_true(json_object_get(reply, "repeated"));
  return MUSTER_OK;
}

muster_err_t muster_worker_register_full(muster_client_t *client, const muster_worker_opts_t *opts,
                                         muster_worker_reg_t *reg) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (reg == NULL)
    return client_fail(client, MUSTER_INVALID, "reg: a place for the registration is required");
  size_t size;
  memcpy(&size, reg, sizeof size);
  /* What the library writes, in a whole struct of its own with the caller's
   * size kept; opts_take refuses a `reg` not set up, as it does options. */
  muster_worker_reg_t got;
  if (client_opts_take(client, &got, sizeof got, reg, WORKER_REG_FIRST_END, "reg",
                       "muster_worker_reg_init") != MUSTER_OK)
    return MUSTER_INVALID;
  got = (muster_worker_reg_t){.size = size};
  json_t *body = NULL, *reply = NULL;
  muster_err_t err = worker_request(client, opts, &body);
  if (err == MUSTER_OK) {
    err = client_call(client, "POST", "/v1/workers", body, 0, &reply);
    json_decref(body);
  }
  if (err == MUSTER_OK)
    err = worker_read_reply(client, reply, &got);
  json_decref(reply);
  if (err != MUSTER_OK)
    got = (muster_worker_reg_t){.size = size};
  memcpy(reg, &got, size < sizeof got ? size : sizeof got);
  return err;
}

muster_err_t muster_worker_register(muster_client_t *client, const muster_worker_opts_t *opts,
                                    int64_t *id, char **name) {
  if (name)
    *name = NULL;
  if (client == NULL || id == NULL)
    return client ? client_fail(client, MUSTER_INVALID, "a place for the id is required")
                  : MUSTER_INVALID;
  muster_worker_reg_t reg;
  muster_worker_reg_init(&reg);
  muster_err_t err = muster_worker_register_full(client, opts, &reg);
  if (err != MUSTER_OK)
    return err;
  *id = reg.id;
  if (name != NULL)
    *name = reg.name;
  else
    muster_worker_reg_clear(&reg);
  return MUSTER_OK;
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
