/*
 * lease.c — libmuster's lease calls: lease (with long-poll) and the five
 * fencing-token-checked acknowledgements complete, fail, extend, release and
 * flag (docs/api.md, "Leases").
 *
 * The acknowledgements share one shape, {"leases": [{"task", "token", ...}]},
 * so one function builds and sends them and a small per-verb function adds the
 * verb's own fields.  A lease's wait is added to the request timeout, so a
 * long-poll is never cut short by the client's own clock.  The combined call
 * (muster_complete_lease) is a completion body with a "lease" object added,
 * whose reply is read like a lease's.
 */
#include "client/client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASE_PATH_MAX 1024

/* ---- lease ---------------------------------------------------------------- */

/* Frees what one lease owns, not the lease itself. */
static void lease_clear(muster_lease_t *lease) {
  free(lease->payload);
  free(lease->session);
  lease->payload = NULL;
  lease->session = NULL;
}

void muster_leases_free(muster_lease_t *leases, size_t count) {
  if (leases == NULL)
    return;
  for (size_t i = 0; i < count; i++)
    lease_clear(&leases[i]);
  free(leases);
}

/* Fills `out` from one wire lease `obj`.  Returns 0, or -1 when a field is
 * missing or mistyped (MUSTER_PROTOCOL) or memory ran out (*nomem set). */
static int lease_read_one(const json_t *obj, muster_lease_t *out, int *nomem) {
  json_t *payload = json_object_get(obj, "payload");
  json_t *session = json_object_get(obj, "session");
  if (client_get_int(obj, "task", 0, &out->task) || client_get_int(obj, "token", 0, &out->token) ||
      client_get_int(obj, "attempt", 0, &out->attempt) ||
      client_get_int(obj, "deadline_ms", 0, &out->deadline_ms) ||
      client_get_int(obj, "parent", 0, &out->parent) ||
      client_get_int(obj, "index", -1, &out->index) || out->task <= 0 || payload == NULL ||
      (session != NULL && !json_is_null(session) && !json_is_string(session)))
    return -1;
  out->payload = client_dump_value(payload);
  if (json_is_string(session))
    out->session = strdup(json_string_value(session));
  if (out->payload == NULL || (json_is_string(session) && out->session == NULL)) {
    *nomem = 1;
    return -1;
  }
  return 0;
}

/* Turns the lease reply into a new array in *leases / *count. */
static muster_err_t lease_read_all(muster_client_t *client, json_t *reply, muster_lease_t **leases,
                                   size_t *count) {
  json_t *list = json_object_get(reply, "leases");
  if (!json_is_array(list))
    return client_fail(client, MUSTER_PROTOCOL, "lease reply has no 'leases' list");
  size_t n = json_array_size(list);
  muster_lease_t *out = calloc(n ? n : 1, sizeof *out);
  if (out == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) {
    int nomem = 0;
    if (lease_read_one(json_array_get(list, i), &out[i], &nomem) != 0) {
      muster_leases_free(out, i + 1);
      if (nomem)
        return client_fail(client, MUSTER_NOMEM, "out of memory");
      return client_fail(client, MUSTER_PROTOCOL, "lease reply: leases[%zu] is malformed", i);
    }
  }
  *leases = out;
  *count = n;
  return MUSTER_OK;
}

muster_err_t muster_lease(muster_client_t *client, const char *queue, int64_t worker, size_t max,
                          int64_t wait_ms, muster_lease_t **leases, size_t *count) {
  if (leases)
    *leases = NULL;
  if (count)
    *count = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  if (queue == NULL || leases == NULL || count == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue and places for the leases are required");
  char path[LEASE_PATH_MAX];
  muster_err_t err = client_path(client, path, sizeof path, "/v1/queues/%s/lease", queue);
  if (err != MUSTER_OK)
    return err;
  json_t *body = json_object();
  int rc = body ? json_object_set_new(body, "max", json_integer((json_int_t)max)) : -1;
  if (rc == 0 && worker > 0)
    rc = json_object_set_new(body, "worker", json_integer((json_int_t)worker));
  if (rc == 0 && wait_ms > 0)
    rc = json_object_set_new(body, "wait_ms", json_integer((json_int_t)wait_ms));
  if (rc != 0) {
    json_decref(body);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  json_t *reply = NULL;
  err = client_call(client, "POST", path, body, (long)(wait_ms > 0 ? wait_ms : 0), &reply);
  json_decref(body);
  if (err == MUSTER_OK)
    err = lease_read_all(client, reply, leases, count);
  json_decref(reply);
  return err;
}

/* ---- acknowledgements ---------------------------------------------------- */

void muster_ack_init(muster_ack_t *ack, int64_t task, int64_t token) {
  if (ack == NULL)
    return;
  memset(ack, 0, sizeof *ack);
  ack->task = task;
  ack->token = token;
  ack->lease_ms = -1;
}

/* Adds the verb's own fields of `ack` (element `i`) to `elem`.  Returns
 * MUSTER_OK, MUSTER_INVALID (message set) or MUSTER_NOMEM. */
typedef muster_err_t (*ack_fields_fn)(muster_client_t *client, json_t *elem,
                                      const muster_ack_t *ack, size_t i);

/* Sets text field `key` from `text` (skipped when NULL), refusing bad UTF-8. */
static muster_err_t ack_set_text(muster_client_t *client, json_t *elem, const char *key,
                                 const char *text, size_t i) {
  if (text == NULL)
    return MUSTER_OK;
  json_t *s = json_string(text);
  if (s == NULL)
    return client_fail(client, MUSTER_INVALID, "leases[%zu].%s: not valid UTF-8", i, key);
  return json_object_set_new(elem, key, s) ? MUSTER_NOMEM : MUSTER_OK;
}

static muster_err_t ack_complete_fields(muster_client_t *client, json_t *elem,
                                        const muster_ack_t *ack, size_t i) {
  if (ack->result == NULL)
    return MUSTER_OK;
  char what[64];
  snprintf(what, sizeof what, "leases[%zu].result", i);
  json_t *result = client_parse_value(client, ack->result, what);
  if (result == NULL)
    return MUSTER_INVALID;
  return json_object_set_new(elem, "result", result) ? MUSTER_NOMEM : MUSTER_OK;
}

static muster_err_t ack_fail_fields(muster_client_t *client, json_t *elem, const muster_ack_t *ack,
                                    size_t i) {
  muster_err_t err = ack_set_text(client, elem, "error", ack->error, i);
  if (err == MUSTER_OK && json_object_set_new(elem, "permanent", json_boolean(ack->permanent)))
    err = MUSTER_NOMEM;
  return err;
}

static muster_err_t ack_extend_fields(muster_client_t *client, json_t *elem,
                                      const muster_ack_t *ack, size_t i) {
  if (ack->lease_ms < 0)
    return MUSTER_OK;
  return json_object_set_new(elem, "lease_ms", json_integer((json_int_t)ack->lease_ms))
             ? MUSTER_NOMEM
             : MUSTER_OK;
}

/* A flag's reason travels in the ack's `error` field. */
static muster_err_t ack_flag_fields(muster_client_t *client, json_t *elem, const muster_ack_t *ack,
                                    size_t i) {
  return ack_set_text(client, elem, "reason", ack->error, i);
}

/* Builds {"leases": [...]} from `acks` into *out (new reference). */
static muster_err_t ack_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             ack_fields_fn fields, json_t **out) {
  json_t *list = json_array();
  json_t *body = json_object();
  muster_err_t err = MUSTER_OK;
  if (list == NULL || body == NULL || json_object_set(body, "leases", list) != 0)
    err = MUSTER_NOMEM;
  for (size_t i = 0; err == MUSTER_OK && i < count; i++) {
    json_t *elem = json_object();
    if (elem == NULL || json_array_append_new(list, elem) != 0 ||
        json_object_set_new(elem, "task", json_integer((json_int_t)acks[i].task)) ||
        json_object_set_new(elem, "token", json_integer((json_int_t)acks[i].token)))
      err = MUSTER_NOMEM;
    else if (fields)
      err = fields(client, elem, &acks[i], i);
  }
  json_decref(list);
  if (err != MUSTER_OK) {
    json_decref(body);
    return err == MUSTER_NOMEM ? client_fail(client, err, "out of memory") : err;
  }
  *out = body;
  return MUSTER_OK;
}

/* Sends one acknowledgement batch to POST /v1/leases/`verb`. */
static muster_err_t ack_send(muster_client_t *client, const char *verb, const muster_ack_t *acks,
                             size_t count, ack_fields_fn fields) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (acks == NULL && count > 0)
    return client_fail(client, MUSTER_INVALID, "acks are required");
  char path[64];
  snprintf(path, sizeof path, "/v1/leases/%s", verb);
  json_t *body = NULL;
  muster_err_t err = ack_body(client, acks, count, fields, &body);
  if (err != MUSTER_OK)
    return err;
  json_t *reply = NULL;
  err = client_call(client, "POST", path, body, 0, &reply);
  json_decref(body);
  json_decref(reply);
  return err;
}

muster_err_t muster_complete(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "complete", acks, count, ack_complete_fields);
}

muster_err_t muster_fail(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "fail", acks, count, ack_fail_fields);
}

muster_err_t muster_extend(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "extend", acks, count, ack_extend_fields);
}

muster_err_t muster_release(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "release", acks, count, NULL);
}

muster_err_t muster_flag(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "flag", acks, count, ack_flag_fields);
}

/* ---- complete and lease the next tasks ------------------------------------ */

#define LEASE_MAX_BATCH 1000 /* docs/api.md: "max" of a lease, elements of a batch */

/* Checks muster_complete_lease's arguments; MUSTER_OK or MUSTER_INVALID with
 * the message set. */
static muster_err_t next_check(muster_client_t *client, const muster_ack_t *acks, size_t count,
                               const char *queue, int64_t worker, size_t max, int64_t updates_after,
                               muster_lease_t **leases, size_t *nleases, char **updates) {
  if (acks == NULL || count == 0)
    return client_fail(client, MUSTER_INVALID,
                       "acks are required (with nothing to complete, lease with muster_lease)");
  if (queue == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue to lease from is required");
  if (leases == NULL || nleases == NULL)
    return client_fail(client, MUSTER_INVALID, "places for the leases are required");
  if (max == 0 || max > LEASE_MAX_BATCH)
    return client_fail(client, MUSTER_INVALID, "max: %zu, expected 1 to %d", max, LEASE_MAX_BATCH);
  if (worker < 0)
    return client_fail(client, MUSTER_INVALID, "worker: %lld, expected an id or 0 (anonymous)",
                       (long long)worker);
  if (updates_after >= 0 && updates == NULL)
    return client_fail(client, MUSTER_INVALID,
                       "updates_after %lld asks for updates: a place for them is required",
                       (long long)updates_after);
  return MUSTER_OK;
}

/* Adds the "lease" object {"queue", "max", "worker"?, "updates_after"?} to `body`. */
static muster_err_t next_add_lease(muster_client_t *client, json_t *body, const char *queue,
                                   int64_t worker, size_t max, int64_t updates_after) {
  json_t *name = json_string(queue);
  if (name == NULL)
    return client_fail(client, MUSTER_INVALID, "queue: not valid UTF-8");
  json_t *next = json_pack("{s:o, s:I}", "queue", name, "max", (json_int_t)max);
  int rc = next ? 0 : -1;
  if (rc == 0 && worker > 0)
    rc = json_object_set_new(next, "worker", json_integer((json_int_t)worker));
  if (rc == 0 && updates_after >= 0)
    rc = json_object_set_new(next, "updates_after", json_integer((json_int_t)updates_after));
  if (rc == 0)
    rc = json_object_set_new(body, "lease", next); /* takes `next`, also on failure */
  else
    json_decref(next);
  return rc == 0 ? MUSTER_OK : client_fail(client, MUSTER_NOMEM, "out of memory");
}

/* Reads the reply's "updates" and "updates_last" into *updates as
 * {"updates": [...], "last": N} (JSON text, muster_free). */
static muster_err_t next_read_updates(muster_client_t *client, json_t *reply, char **updates) {
  json_t *list = json_object_get(reply, "updates");
  json_t *last = json_object_get(reply, "updates_last");
  if (!json_is_array(list) || !json_is_integer(last))
    return client_fail(client, MUSTER_PROTOCOL, "complete-and-lease reply has no updates");
  json_t *out = json_pack("{s:O, s:O}", "updates", list, "last", last);
  *updates = out ? client_dump_value(out) : NULL;
  json_decref(out);
  return *updates ? MUSTER_OK : client_fail(client, MUSTER_NOMEM, "out of memory");
}

muster_err_t muster_complete_lease(muster_client_t *client, const muster_ack_t *acks, size_t count,
                                   const char *queue, int64_t worker, size_t max,
                                   int64_t updates_after, muster_lease_t **leases, size_t *nleases,
                                   char **updates) {
  if (leases)
    *leases = NULL;
  if (nleases)
    *nleases = 0;
  if (updates)
    *updates = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  muster_err_t err =
      next_check(client, acks, count, queue, worker, max, updates_after, leases, nleases, updates);
  json_t *body = NULL, *reply = NULL;
  if (err == MUSTER_OK)
    err = ack_body(client, acks, count, ack_complete_fields, &body);
  if (err == MUSTER_OK)
    err = next_add_lease(client, body, queue, worker, max, updates_after);
  if (err == MUSTER_OK)
    err = client_call(client, "POST", "/v1/leases/complete", body, 0, &reply);
  json_decref(body);
  if (err == MUSTER_OK)
    err = lease_read_all(client, reply, leases, nleases);
  if (err == MUSTER_OK && updates_after >= 0 &&
      (err = next_read_updates(client, reply, updates)) != MUSTER_OK) {
    muster_leases_free(*leases, *nleases);
    *leases = NULL;
    *nleases = 0;
  }
  json_decref(reply);
  return err;
}
