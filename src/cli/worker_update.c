/*
 * worker_update.c — leasing with broadcast updates (docs/api.md "Updates with
 * leases", docs/node.md "Update delivery").
 *
 * Every lease request carries `updates_after`: the highest update sequence
 * number this worker has applied.  The reply brings the newer updates and
 * `updates_last`; they are applied in order before the leased task runs (and
 * when more than one reply's worth is pending, the rest is fetched with
 * GET /v1/queues/Q/updates first), so a task never runs ahead of an update
 * posted before it was leased.  An idle worker's long-poll also wakes when an
 * update is posted, so updates arrive between tasks even when there are none.
 *
 * A plugin gets each update through handle_update.  A command worker appends
 * each update as one JSON line {"seq", "data", "session"} to a file of its own
 * (MUSTER_UPDATES_FILE, created empty at start and removed at exit); each
 * command also sees MUSTER_UPDATE_SEQ, the last sequence number written before
 * it started, so it reads the file up to that line.  Lines are written with one
 * write() each under upd_lock, in sequence order.
 *
 * A completion that leases the next task in the same request (the combined
 * call, worker_complete_lease) brings updates in the same way, so a worker in
 * its steady state gets them without a request of its own.
 *
 * A head that refuses `updates_after` (one older than the update API) gets
 * leases without it, after one warning.
 *
 * Every lease request also carries a key, `request` (docs/api.md, "Retrying
 * a lease"): the slot's, the same until the head answers one of its lease
 * requests.  A request sent again after a network error (the head restarted
 * between its commit and its reply, say) then gets the task its lost reply
 * carried, with the same token, rather than leaving it leased to nobody who
 * knows until its deadline.  The plain lease that follows a failed combined
 * call sends that call's key, so a completion whose reply was lost does not
 * strand the task it leased either.  A head older than the key refuses it:
 * leases go without it then, after one warning.
 */
#include "cli/cli.h"
#include "cli/worker.h"
#include "client/jdump.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define UPDATES_PAGE 1000

int worker_updates_open(worker_t *w) {
  w->updates_fd = -1;
  w->updates_path[0] = '\0';
  if (w->plugin_path != NULL)
    return 0;
  const char *dir = getenv("TMPDIR");
  snprintf(w->updates_path, sizeof w->updates_path, "%s/muster-updates-XXXXXX",
           dir && dir[0] && strlen(dir) < 200 ? dir : "/tmp");
  w->updates_fd = mkostemp(w->updates_path, O_APPEND | O_CLOEXEC);
  if (w->updates_fd < 0) {
    fprintf(stderr, "muster worker: cannot create the updates file %s: %s\n", w->updates_path,
            strerror(errno));
    w->updates_path[0] = '\0';
    return -1;
  }
  setenv("MUSTER_UPDATES_FILE", w->updates_path, 1);
  return 0;
}

void worker_updates_close(worker_t *w) {
  if (w->updates_fd >= 0)
    close(w->updates_fd);
  w->updates_fd = -1;
  if (w->updates_path[0])
    unlink(w->updates_path);
  w->updates_path[0] = '\0';
}

int64_t worker_updates_seq(worker_t *w) {
  pthread_mutex_lock(&w->upd_lock);
  int64_t seq = w->updates_seq;
  pthread_mutex_unlock(&w->upd_lock);
  return seq;
}

/* Applies one update (upd_lock held). */
static void update_apply(worker_t *w, int64_t seq, json_t *data, json_t *session) {
  if (w->plugin != NULL) {
    char *text = jdump(data ? data : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
    worker_plugin_update(w, seq, text ? text : "null",
                         json_is_string(session) ? json_string_value(session) : NULL);
    free(text);
  } else if (w->updates_fd >= 0) {
    json_t *line = json_pack("{s:I, s:O, s:O}", "seq", (json_int_t)seq, "data",
                             data ? data : json_null(), "session", session ? session : json_null());
    char *text = line ? jdump(line, JSON_COMPACT) : NULL;
    json_decref(line);
    if (text) {
      size_t len = strlen(text);
      text[len] = '\n'; /* one write per line: the NUL becomes the newline */
      if (write(w->updates_fd, text, len + 1) != (ssize_t)(len + 1))
        fprintf(stderr, "muster worker: cannot write update %lld to %s: %s\n", (long long)seq,
                w->updates_path, strerror(errno));
      free(text);
    }
  }
  w->updates_seq = seq;
}

/* Applies the updates of a list in order, skipping ones already applied
 * (another slot may have got them first); upd_lock held. */
static void update_apply_list(worker_t *w, json_t *list) {
  size_t i;
  json_t *u;
  json_array_foreach(list, i, u) {
    json_int_t seq = json_integer_value(json_object_get(u, "seq"));
    if (seq > w->updates_seq)
      update_apply(w, seq, json_object_get(u, "data"), json_object_get(u, "session"));
  }
}

/* Fetches and applies updates up to `last` (upd_lock held); stops on an error. */
static void update_catch_up(worker_slot_t *slot, int64_t last) {
  worker_t *w = slot->worker;
  char queue[400];
  if (cli_escape(w->queue, queue, sizeof queue) != 0)
    return;
  while (w->updates_seq < last) {
    char path[512], *reply = NULL;
    snprintf(path, sizeof path, "/v1/queues/%s/updates?after=%lld&max=%d", queue,
             (long long)w->updates_seq, UPDATES_PAGE);
    int64_t before = w->updates_seq;
    if (muster_request(slot->client, "GET", path, NULL, &reply) == MUSTER_OK) {
      json_t *obj = json_loads(reply, JSON_ALLOW_NUL, NULL);
      update_apply_list(w, json_object_get(obj, "updates"));
      json_decref(obj);
    }
    muster_free(reply);
    if (w->updates_seq == before)
      break; /* nothing more to get now: the next lease asks again */
  }
}

/* Fills `out` from a wire lease; 0, or -1 when malformed or out of memory. */
static int update_read_lease(json_t *obj, muster_lease_t *out) {
  json_t *payload = json_object_get(obj, "payload"), *session = json_object_get(obj, "session");
  json_t *parent = json_object_get(obj, "parent"), *index = json_object_get(obj, "index");
  out->task = json_integer_value(json_object_get(obj, "task"));
  out->token = json_integer_value(json_object_get(obj, "token"));
  out->attempt = json_integer_value(json_object_get(obj, "attempt"));
  out->deadline_ms = json_integer_value(json_object_get(obj, "deadline_ms"));
  out->parent = json_is_integer(parent) ? json_integer_value(parent) : 0;
  out->index = json_is_integer(index) ? json_integer_value(index) : -1;
  if (out->task <= 0 || payload == NULL)
    return -1;
  out->payload = jdump(payload, JSON_COMPACT | JSON_ENCODE_ANY);
  if (json_is_string(session))
    out->session = strdup(json_string_value(session));
  return out->payload == NULL || (json_is_string(session) && out->session == NULL) ? -1 : 0;
}

/* Adds "worker", "updates_after" and "request" (unless the head refused
 * them) to the lease request `body` of `slot`: a plain lease's body or the
 * combined call's "lease" object.  0, or -1 when out of memory. */
static int update_lease_fields(worker_slot_t *slot, json_t *body) {
  worker_t *w = slot->worker;
  int64_t id = worker_id(w);
  int rc = 0;
  if (id > 0)
    rc = json_object_set_new(body, "worker", json_integer((json_int_t)id));
  pthread_mutex_lock(&w->upd_lock);
  if (rc == 0 && !w->updates_unsupported)
    rc = json_object_set_new(body, "updates_after", json_integer((json_int_t)w->updates_seq));
  int keyed = id > 0 && !w->requests_unsupported;
  pthread_mutex_unlock(&w->upd_lock);
  char key[64];
  snprintf(key, sizeof key, "%s-s%d-%lld", w->instance, slot->index + 1,
           (long long)slot->lease_answered);
  if (rc == 0 && keyed)
    rc = json_object_set_new(body, "request", json_string(key));
  return rc;
}

/* The lease request's body. */
static char *update_lease_body(worker_slot_t *slot, int64_t wait_ms) {
  json_t *body = json_pack("{s:i, s:I}", "max", 1, "wait_ms", (json_int_t)wait_ms);
  char *text = body && update_lease_fields(slot, body) == 0 ? jdump(body, JSON_COMPACT) : NULL;
  json_decref(body);
  return text;
}

/* True when the head refused lease request field `field` as unknown (the
 * message `client` holds starts with it: "request: unknown field ..."), a
 * head older than it: the worker stops sending it, after one warning. */
static bool update_refused(worker_t *w, muster_client_t *client, const char *field,
                           int *unsupported, const char *what) {
  const char *message = muster_client_message(client);
  size_t len = strlen(field);
  if (strncmp(message, field, len) != 0 || message[len] != ':')
    return false;
  pthread_mutex_lock(&w->upd_lock);
  if (!*unsupported)
    fprintf(stderr, "muster worker: the head %s (%s); leasing without\n", what, message);
  *unsupported = 1;
  pthread_mutex_unlock(&w->upd_lock);
  return true;
}

/* Reads the reply's leases into a new array (muster_leases_free). */
static muster_err_t update_read_leases(json_t *reply, muster_lease_t **leases, size_t *count) {
  json_t *list = json_object_get(reply, "leases");
  if (!json_is_array(list))
    return MUSTER_PROTOCOL;
  size_t n = json_array_size(list);
  muster_lease_t *out = calloc(n ? n : 1, sizeof *out);
  if (out == NULL)
    return MUSTER_NOMEM;
  for (size_t i = 0; i < n; i++)
    if (update_read_lease(json_array_get(list, i), &out[i]) != 0) {
      muster_leases_free(out, n);
      return MUSTER_PROTOCOL;
    }
  *leases = out;
  *count = n;
  return MUSTER_OK;
}

/*
 * Takes a lease reply (the text `reply`, consumed): applies its updates in
 * order (fetching the rest when more are pending), reads its leases into a new
 * array and keeps what the leased task requires in slot->requires.  Shared by
 * the plain lease and the combined complete-and-lease call, whose replies
 * carry the same "leases", "updates" and "updates_last".
 */
static muster_err_t update_take_reply(worker_slot_t *slot, char *reply, muster_lease_t **leases,
                                      size_t *count) {
  worker_t *w = slot->worker;
  json_t *obj = json_loads(reply, JSON_ALLOW_NUL, NULL);
  muster_free(reply);
  if (obj == NULL)
    return MUSTER_PROTOCOL;
  json_t *updates = json_object_get(obj, "updates");
  json_int_t last = json_integer_value(json_object_get(obj, "updates_last"));
  pthread_mutex_lock(&w->upd_lock);
  update_apply_list(w, updates);
  if (last > w->updates_seq)
    update_catch_up(slot, last);
  pthread_mutex_unlock(&w->upd_lock);
  muster_err_t err = update_read_leases(obj, leases, count);
  /* What the leased task requires (one lease at most per slot): kept for
   * worker_shared_acquire, which fetches it before the task runs. */
  json_decref(slot->requires);
  json_t *requires = json_object_get(json_array_get(json_object_get(obj, "leases"), 0), "requires");
  slot->requires = err == MUSTER_OK && json_array_size(requires) > 0 ? json_incref(requires) : NULL;
  json_decref(obj);
  if (err == MUSTER_OK)
    slot->lease_answered++; /* the next lease request is a new one: a new key */
  return err;
}

muster_err_t worker_lease(worker_slot_t *slot, int64_t wait_ms, muster_lease_t **leases,
                          size_t *count) {
  worker_t *w = slot->worker;
  *leases = NULL;
  *count = 0;
  char queue[400], path[512];
  if (cli_escape(w->queue, queue, sizeof queue) != 0)
    return MUSTER_INVALID;
  snprintf(path, sizeof path, "/v1/queues/%s/lease", queue);
  char *body = update_lease_body(slot, wait_ms), *reply = NULL;
  if (body == NULL)
    return MUSTER_NOMEM;
  muster_err_t err = muster_request(slot->client, "POST", path, body, &reply);
  free(body);
  /* Nothing leased when refused: the next call goes without the field.  The
   * key first: an older head's refusal of it lists updates_after as known. */
  if (err == MUSTER_INVALID &&
      (update_refused(w, slot->client, "request", &w->requests_unsupported,
                      "does not take lease request keys") ||
       update_refused(w, slot->client, "updates_after", &w->updates_unsupported,
                      "does not deliver updates")))
    return MUSTER_OK;
  if (err != MUSTER_OK)
    return err;
  return update_take_reply(slot, reply, leases, count);
}

/* The combined call's body: {"leases": [ack], "lease": {"queue", "max": 1,
 * "worker", "updates_after"}}, with `result` (borrowed) as the ack's result.
 * NULL when out of memory. */
static char *update_complete_body(worker_slot_t *slot, const muster_ack_t *ack, json_t *result) {
  json_t *next = json_pack("{s:s, s:i}", "queue", slot->worker->queue, "max", 1);
  json_t *body =
      next ? json_pack("{s:[{s:I, s:I, s:O}], s:O}", "leases", "task", (json_int_t)ack->task,
                       "token", (json_int_t)ack->token, "result", result, "lease", next)
           : NULL;
  json_t *lease = json_object_get(body, "lease");
  char *text = lease && update_lease_fields(slot, lease) == 0 ? jdump(body, JSON_COMPACT) : NULL;
  json_decref(next);
  json_decref(body);
  return text;
}

muster_err_t worker_complete_lease(worker_slot_t *slot, const muster_ack_t *ack,
                                   muster_lease_t **leases, size_t *count) {
  *leases = NULL;
  *count = 0;
  json_t *result =
      ack->result ? json_loads(ack->result, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL) : json_null();
  if (result == NULL)
    return MUSTER_INVALID; /* the plain completion explains it */
  char *body = update_complete_body(slot, ack, result), *reply = NULL;
  if (body == NULL) {
    json_decref(result);
    return MUSTER_NOMEM;
  }
  muster_err_t err = muster_request(slot->client, "POST", "/v1/leases/complete", body, &reply);
  free(body);
  /* All or nothing: refused for the key, it completed nothing; once more without. */
  if (err == MUSTER_INVALID &&
      update_refused(slot->worker, slot->client, "lease.request",
                     &slot->worker->requests_unsupported, "does not take lease request keys") &&
      (body = update_complete_body(slot, ack, result)) != NULL) {
    err = muster_request(slot->client, "POST", "/v1/leases/complete", body, &reply);
    free(body);
  }
  json_decref(result);
  if (err != MUSTER_OK)
    return err;
  return update_take_reply(slot, reply, leases, count);
}
