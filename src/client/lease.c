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
 * whose reply is read like a lease's.  lease_send and lease_next_send send
 * the two from a muster_lease_opts_t, which the calls with a request key
 * (lease_key.c) take from the caller and the calls without fill from their
 * arguments (lease_internal.h).
 *
 * Bodies are written as text (jtext.h), a result spliced as it stands when
 * it is canonical.  A lease reply is read from the text the head writes
 * (src/server/lease.c, lease_write: the fields in one order, compact), each
 * payload copied as it stands; any other form of reply is parsed into a tree
 * and read as before, so both readers give the same leases.
 */
#include "client/lease_internal.h"
#include "core/limits.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASE_PATH_MAX 1024
/* The accepted range of a `worker` argument, as messages name it. */
#define LEASE_WORKER_RANGE "a worker id or 0 (anonymous)"

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

muster_err_t lease_read_tree(muster_client_t *client, json_t *reply, muster_lease_t **leases,
                             size_t *count, char **updates) {
  muster_err_t err = lease_read_all(client, reply, leases, count);
  if (err == MUSTER_OK && updates != NULL &&
      (err = next_read_updates(client, reply, updates)) != MUSTER_OK) {
    muster_leases_free(*leases, *count);
    *leases = NULL;
    *count = 0;
  }
  return err;
}

/* ---- the lease reply read from its text ------------------------------------ */

/* A copy of `n` bytes at `text` with a NUL; NULL when memory ran out. */
static char *lease_copy(const char *text, size_t n) {
  char *copy = malloc(n + 1);
  if (copy) {
    memcpy(copy, text, n);
    copy[n] = '\0';
  }
  return copy;
}

/* An integer, or null for `dflt`, at *pp. */
static bool lease_scan_int_or_null(const char **pp, const char *end, int64_t dflt, int64_t *out) {
  if (CLIENT_SCAN_LIT(pp, end, "null")) {
    *out = dflt;
    return true;
  }
  return jtext_int(pp, end, out);
}

/* The payload at *pp into *out (malloc): its text when canonical, otherwise
 * the value alone parsed and dumped, as the tree path dumps it.  False when
 * it is not a value jansson reads, or memory ran out. */
static bool lease_scan_payload(const char **pp, const char *end, char **out) {
  jtext_info_t info;
  const char *start = *pp, *stop = jtext_scan(start, end, &info);
  if (stop == NULL)
    return false;
  if (info.canonical && !info.spaced) {
    *out = lease_copy(start, (size_t)(stop - start));
  } else {
    json_t *value =
        json_loadb(start, (size_t)(stop - start), JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    *out = value ? client_dump_value(value) : NULL;
    json_decref(value);
  }
  *pp = stop;
  return *out != NULL;
}

/* The session at *pp: null, or a string without escapes (copied). */
static bool lease_scan_session(const char **pp, const char *end, char **out) {
  if (CLIENT_SCAN_LIT(pp, end, "null"))
    return true;
  jtext_info_t info;
  const char *start = *pp, *stop;
  if (start == end || *start != '"' || (stop = jtext_scan(start, end, &info)) == NULL ||
      memchr(start, '\\', (size_t)(stop - start)) != NULL)
    return false;
  *pp = stop;
  return (*out = lease_copy(start + 1, (size_t)(stop - start - 2))) != NULL;
}

/* One lease object at *pp, in lease_write's form, into `out` (zeroed; what
 * it allocated stays there on failure, for muster_leases_free). */
static bool lease_scan_one(const char **pp, const char *end, muster_lease_t *out) {
  const char *p = *pp;
  if (!CLIENT_SCAN_LIT(&p, end, "{\"task\":") || !jtext_int(&p, end, &out->task) ||
      out->task <= 0 || !CLIENT_SCAN_LIT(&p, end, ",\"token\":") ||
      !jtext_int(&p, end, &out->token) || !CLIENT_SCAN_LIT(&p, end, ",\"payload\":") ||
      !lease_scan_payload(&p, end, &out->payload) || !CLIENT_SCAN_LIT(&p, end, ",\"attempt\":") ||
      !jtext_int(&p, end, &out->attempt) || !CLIENT_SCAN_LIT(&p, end, ",\"deadline_ms\":") ||
      !jtext_int(&p, end, &out->deadline_ms) || !CLIENT_SCAN_LIT(&p, end, ",\"parent\":") ||
      !lease_scan_int_or_null(&p, end, 0, &out->parent) ||
      !CLIENT_SCAN_LIT(&p, end, ",\"session\":") || !lease_scan_session(&p, end, &out->session) ||
      !CLIENT_SCAN_LIT(&p, end, ",\"index\":") || !lease_scan_int_or_null(&p, end, -1, &out->index))
    return false;
  if (CLIENT_SCAN_LIT(&p, end, ",\"requires\":")) { /* not part of muster_lease_t */
    jtext_info_t info;
    if ((p = jtext_scan(p, end, &info)) == NULL || !info.canonical)
      return false;
  }
  *pp = p;
  return CLIENT_SCAN_LIT(pp, end, "}");
}

/* The leases' array after its '[' at *pp into a new array (at least one
 * element allocated, as the tree path does) of *count leases. */
static bool lease_scan_list(const char **pp, const char *end, muster_lease_t **leases,
                            size_t *count) {
  muster_lease_t *list = NULL;
  size_t n = 0, cap = 0;
  bool ok = true;
  if (!CLIENT_SCAN_LIT(pp, end, "]")) {
    do {
      if (n == cap) {
        muster_lease_t *grown = realloc(list, (cap = cap ? cap * 2 : 16) * sizeof *grown);
        if (grown == NULL) {
          ok = false;
          break;
        }
        list = grown;
      }
      list[n] = (muster_lease_t){0};
      ok = lease_scan_one(pp, end, &list[n]);
      n++;
    } while (ok && CLIENT_SCAN_LIT(pp, end, ","));
    ok = ok && CLIENT_SCAN_LIT(pp, end, "]");
  }
  if (ok && list == NULL)
    ok = (list = calloc(1, sizeof *list)) != NULL;
  if (!ok) {
    muster_leases_free(list, n);
    return false;
  }
  *leases = list;
  *count = n;
  return true;
}

/* A top-level key the scanner does not read, and its value: both canonical,
 * and the key none of those it reads (a repeated one would take the tree's
 * last value). */
static bool lease_scan_other(const char **pp, const char *end) {
  jtext_info_t info;
  const char *key = *pp, *p = jtext_scan(key, end, &info);
  if (p == NULL || *key != '"' || !info.canonical || p == end || *p++ != ':')
    return false;
  size_t n = (size_t)(p - key);
  if ((n == 9 && memcmp(key, "\"leases\":", 9) == 0) ||
      (n == 10 && memcmp(key, "\"updates\":", 10) == 0) ||
      (n == 15 && memcmp(key, "\"updates_last\":", 15) == 0))
    return false;
  if ((p = jtext_scan(p, end, &info)) == NULL || !info.canonical)
    return false;
  *pp = p;
  return true;
}

/* {"updates":LIST,"last":LAST} for muster_complete_lease. */
static char *lease_updates_text(const char *list, size_t len, int64_t last) {
  jtext_buf_t b = {0};
  JTEXT_ADD_LITERAL(&b, "{\"updates\":");
  jtext_add(&b, list, len);
  JTEXT_ADD_LITERAL(&b, ",\"last\":");
  jtext_add_int(&b, last);
  JTEXT_ADD_LITERAL(&b, "}");
  if (b.failed)
    jtext_buf_free(&b);
  return b.data;
}

bool lease_scan_reply(const char *text, size_t len, muster_lease_t **leases, size_t *count,
                      char **updates) {
  if (len == 0 || text[0] != '{')
    return false;
  const char *p = text + 1, *end = text + len, *list = NULL, *list_end = NULL;
  muster_lease_t *got = NULL;
  size_t n = 0;
  int64_t last = 0;
  bool ok = true, have_last = false;
  do {
    if (got == NULL && CLIENT_SCAN_LIT(&p, end, "\"leases\":[")) {
      ok = lease_scan_list(&p, end, &got, &n);
    } else if (updates && list == NULL && CLIENT_SCAN_LIT(&p, end, "\"updates\":[")) {
      jtext_info_t info;
      list = p - 1;
      ok = (list_end = jtext_scan(list, end, &info)) != NULL && info.canonical && !info.spaced;
      p = list_end;
    } else if (updates && !have_last && CLIENT_SCAN_LIT(&p, end, "\"updates_last\":")) {
      ok = have_last = jtext_int(&p, end, &last);
    } else {
      ok = lease_scan_other(&p, end);
    }
  } while (ok && CLIENT_SCAN_LIT(&p, end, ","));
  ok = ok && got != NULL && CLIENT_SCAN_LIT(&p, end, "}") && jtext_only_space(p, end) &&
       (!updates || (list && have_last));
  if (ok && updates)
    ok = (*updates = lease_updates_text(list, (size_t)(list_end - list), last)) != NULL;
  if (!ok) {
    muster_leases_free(got, n);
    return false;
  }
  *leases = got;
  *count = n;
  return true;
}

/* Reads the leases (and updates, when `updates` is not NULL) of the last
 * reply: scanned from its text, or read from its tree. */
static muster_err_t lease_read_reply(muster_client_t *client, const char *path,
                                     muster_lease_t **leases, size_t *count, char **updates) {
  if (lease_scan_reply(client->reply.data, client->reply.len, leases, count, updates)) {
    client_ok(client);
    return MUSTER_OK;
  }
  json_t *reply = NULL;
  muster_err_t err = client_reply_tree(client, "POST", path, &reply);
  if (err == MUSTER_OK) {
    client_ok(client);
    err = lease_read_tree(client, reply, leases, count, updates);
  }
  json_decref(reply);
  return err;
}

/* Appends ",\"request\":KEY" when `key` is not NULL (checked: plain ASCII). */
static void lease_add_key(jtext_buf_t *b, const char *key) {
  if (key == NULL)
    return;
  JTEXT_ADD_LITERAL(b, ",\"request\":");
  jtext_add_string(b, key);
}

/* Writes the body of the plain lease request `o` into `b`, emptied first:
 * {"max", "worker"?, "wait_ms"?, "request"?}. */
static void lease_body(jtext_buf_t *b, const muster_lease_opts_t *o) {
  jtext_reset(b);
  JTEXT_ADD_LITERAL(b, "{\"max\":");
  jtext_add_int(b, (int64_t)o->max);
  if (o->worker > 0) {
    JTEXT_ADD_LITERAL(b, ",\"worker\":");
    jtext_add_int(b, o->worker);
  }
  if (o->wait_ms > 0) {
    JTEXT_ADD_LITERAL(b, ",\"wait_ms\":");
    jtext_add_int(b, o->wait_ms);
  }
  lease_add_key(b, o->request);
  JTEXT_ADD_LITERAL(b, "}");
}

muster_err_t lease_send(muster_client_t *client, const muster_lease_opts_t *o,
                        muster_lease_t **leases, size_t *count) {
  char path[LEASE_PATH_MAX];
  muster_err_t err = client_check_min(client, "worker", o->worker, 0, LEASE_WORKER_RANGE);
  if (err == MUSTER_OK)
    err = client_check_min(client, "wait_ms", o->wait_ms, 0,
                           "0 or more milliseconds (0: do not wait)");
  if (err == MUSTER_OK)
    err = lease_key_check(client, o->request, o->worker);
  if (err == MUSTER_OK)
    err = client_path(client, path, sizeof path, "/v1/queues/%s/lease", o->queue);
  if (err != MUSTER_OK)
    return err;
  lease_body(&client->body, o);
  if (client->body.failed)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  err = client_call_text(client, "POST", path, client->body.data,
                         (long)(o->wait_ms > 0 ? o->wait_ms : 0));
  if (err == MUSTER_OK)
    err = lease_read_reply(client, path, leases, count, NULL);
  return err;
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
  muster_lease_opts_t o;
  muster_lease_opts_init(&o);
  o.queue = queue;
  o.worker = worker;
  o.max = max;
  o.wait_ms = wait_ms;
  return lease_send(client, &o, leases, count);
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

/* Appends the verb's own fields of `ack` (element `i`) to `b`.  Returns
 * MUSTER_OK, or MUSTER_INVALID / MUSTER_NOMEM with the message set. */
typedef muster_err_t (*ack_fields_fn)(muster_client_t *client, jtext_buf_t *b,
                                      const muster_ack_t *ack, size_t i);

/* Appends text field `key` from `text` (skipped when NULL), refusing bad UTF-8. */
static muster_err_t ack_set_text(muster_client_t *client, jtext_buf_t *b, const char *key,
                                 const char *text, size_t i) {
  if (text == NULL)
    return MUSTER_OK;
  size_t at = b->len;
  JTEXT_ADD_LITERAL(b, ",\"");
  jtext_add(b, key, strlen(key));
  JTEXT_ADD_LITERAL(b, "\":");
  if (jtext_add_string(b, text))
    return MUSTER_OK;
  b->len = at;
  return client_fail(client, MUSTER_INVALID, "leases[%zu].%s: not valid UTF-8", i, key);
}

static muster_err_t ack_complete_fields(muster_client_t *client, jtext_buf_t *b,
                                        const muster_ack_t *ack, size_t i) {
  if (ack->result == NULL)
    return MUSTER_OK;
  JTEXT_ADD_LITERAL(b, ",\"result\":");
  return client_add_json(client, b, ack->result, "leases", i, "result");
}

static muster_err_t ack_fail_fields(muster_client_t *client, jtext_buf_t *b,
                                    const muster_ack_t *ack, size_t i) {
  muster_err_t err = ack_set_text(client, b, "error", ack->error, i);
  if (err == MUSTER_OK) {
    if (ack->permanent)
      JTEXT_ADD_LITERAL(b, ",\"permanent\":true");
    else
      JTEXT_ADD_LITERAL(b, ",\"permanent\":false");
  }
  return err;
}

static muster_err_t ack_extend_fields(muster_client_t *client, jtext_buf_t *b,
                                      const muster_ack_t *ack, size_t i) {
  if (ack->lease_ms < -1) {
    char what[48];
    snprintf(what, sizeof what, "leases[%zu].lease_ms", i);
    return client_check_min(client, what, ack->lease_ms, -1,
                            "a time in milliseconds, or -1 for the queue's");
  }
  if (ack->lease_ms >= 0) {
    JTEXT_ADD_LITERAL(b, ",\"lease_ms\":");
    jtext_add_int(b, ack->lease_ms);
  }
  return MUSTER_OK;
}

/* A flag's reason travels in the ack's `error` field. */
static muster_err_t ack_flag_fields(muster_client_t *client, jtext_buf_t *b,
                                    const muster_ack_t *ack, size_t i) {
  return ack_set_text(client, b, "reason", ack->error, i);
}

/* Writes {"leases":[...] (the object left open) from `acks` into `b`,
 * emptied first: the fields in the order the old tree had them. */
static muster_err_t ack_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             ack_fields_fn fields, jtext_buf_t *b) {
  jtext_reset(b);
  JTEXT_ADD_LITERAL(b, "{\"leases\":[");
  for (size_t i = 0; i < count; i++) {
    if (i > 0)
      JTEXT_ADD_LITERAL(b, ",");
    JTEXT_ADD_LITERAL(b, "{\"task\":");
    jtext_add_int(b, acks[i].task);
    JTEXT_ADD_LITERAL(b, ",\"token\":");
    jtext_add_int(b, acks[i].token);
    muster_err_t err = fields ? fields(client, b, &acks[i], i) : MUSTER_OK;
    if (err != MUSTER_OK)
      return err;
    JTEXT_ADD_LITERAL(b, "}");
  }
  JTEXT_ADD_LITERAL(b, "]");
  return b->failed ? client_fail(client, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* The fields of each verb's elements. */
static const struct {
  const char *verb;
  ack_fields_fn fields;
} ack_verbs[] = {
    {"complete", ack_complete_fields}, {"fail", ack_fail_fields},
    {"extend", ack_extend_fields},     {"release", NULL},
    {"flag", ack_flag_fields},
};

muster_err_t lease_ack_body(muster_client_t *client, const char *verb, const muster_ack_t *acks,
                            size_t count, jtext_buf_t *b) {
  size_t v = 0;
  while (strcmp(ack_verbs[v].verb, verb) != 0) /* the verb is one of the table's */
    v++;
  muster_err_t err = ack_body(client, acks, count, ack_verbs[v].fields, b);
  if (err == MUSTER_OK)
    JTEXT_ADD_LITERAL(b, "}");
  return b->failed ? client_fail(client, MUSTER_NOMEM, "out of memory") : err;
}

/* Sends one acknowledgement batch to POST /v1/leases/`verb`; the reply is
 * left in client->reply, unchecked. */
static muster_err_t ack_post(muster_client_t *client, const char *verb, const muster_ack_t *acks,
                             size_t count) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (acks == NULL && count > 0)
    return client_fail(client, MUSTER_INVALID, "acks are required");
  char path[64];
  snprintf(path, sizeof path, "/v1/leases/%s", verb);
  muster_err_t err = lease_ack_body(client, verb, acks, count, &client->body);
  if (err == MUSTER_OK)
    err = client_call_text(client, "POST", path, client->body.data, 0);
  return err;
}

/* ack_post, the reply only checked, not read. */
static muster_err_t ack_send(muster_client_t *client, const char *verb, const muster_ack_t *acks,
                             size_t count) {
  char path[64];
  snprintf(path, sizeof path, "/v1/leases/%s", verb);
  muster_err_t err = ack_post(client, verb, acks, count);
  return err == MUSTER_OK ? client_reply_check(client, "POST", path) : err;
}

muster_err_t muster_complete(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "complete", acks, count);
}

/* Reads the "repeated" and "result_ignored" marks of the `count` elements of
 * the completion reply just received into repeated[0..count) (docs/api.md,
 * "Retrying a completion"); MUSTER_PROTOCOL for a reply of another shape. */
static muster_err_t ack_read_repeats(muster_client_t *client, size_t count, int *repeated) {
  static const char path[] = "/v1/leases/complete";
  json_t *reply = NULL;
  muster_err_t err = client_reply_tree(client, "POST", path, &reply);
  if (err != MUSTER_OK)
    return err;
  json_t *completed = json_object_get(reply, "completed");
  if (!json_is_array(completed) || json_array_size(completed) != count) {
    json_decref(reply);
    return client_fail(client, MUSTER_PROTOCOL,
                       "POST %s: the reply has no \"completed\" list of %zu", path, count);
  }
  for (size_t i = 0; i < count; i++) {
    const json_t *element = json_array_get(completed, i);
    repeated[i] = 0;
    if (json_is_true(json_object_get(element, "repeated")))
      repeated[i] |= MUSTER_ACK_REPEATED;
    if (json_is_true(json_object_get(element, "result_ignored")))
      repeated[i] |= MUSTER_ACK_RESULT_IGNORED;
  }
  json_decref(reply);
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_complete_repeats(muster_client_t *client, const muster_ack_t *acks,
                                     size_t count, int *repeated) {
  if (repeated == NULL)
    return muster_complete(client, acks, count);
  muster_err_t err = ack_post(client, "complete", acks, count);
  return err == MUSTER_OK ? ack_read_repeats(client, count, repeated) : err;
}

/* The verb of each way muster_end_leases ends leases, and the key of its
 * reply's elements (none for a release, whose reply is a count). */
static const struct {
  const char *verb, *key;
} end_verbs[] = {
    [MUSTER_END_FAIL] = {"fail", "failed"},
    [MUSTER_END_RELEASE] = {"release", NULL},
    [MUSTER_END_FLAG] = {"flag", "flagged"},
};

/* The repeats a fail's or flag's reply `reply` marks: its `count` elements
 * under `key` with "repeated": true; false for a reply of another shape. */
static bool end_marked(const json_t *reply, const char *key, size_t count, size_t *repeats) {
  const json_t *list = json_object_get(reply, key);
  if (!json_is_array(list) || json_array_size(list) != count)
    return false;
  *repeats = 0;
  for (size_t i = 0; i < count; i++)
    *repeats += json_is_true(json_object_get(json_array_get(list, i), "repeated"));
  return true;
}

/* The repeats a release's reply `reply` counts: its "repeated" (present only
 * when above 0), at most `count`; false for a reply of another shape. */
static bool end_counted(const json_t *reply, size_t count, size_t *repeats) {
  const json_t *n = json_object_get(reply, "repeated");
  if (n != NULL &&
      (!json_is_integer(n) || json_integer_value(n) < 0 || (size_t)json_integer_value(n) > count))
    return false;
  *repeats = n ? (size_t)json_integer_value(n) : 0;
  return true;
}

/* Reads into *repeats how many of the `count` acks the reply to the fail,
 * release or flag just received answered as repeats (docs/api.md,
 * "Retrying a fail, release or flag"); MUSTER_PROTOCOL for a reply of
 * another shape. */
static muster_err_t end_read_repeats(muster_client_t *client, muster_end_t how, size_t count,
                                     size_t *repeats) {
  char path[64];
  snprintf(path, sizeof path, "/v1/leases/%s", end_verbs[how].verb);
  json_t *reply = NULL;
  muster_err_t err = client_reply_tree(client, "POST", path, &reply);
  if (err != MUSTER_OK)
    return err;
  const char *key = end_verbs[how].key;
  bool read = key ? end_marked(reply, key, count, repeats) : end_counted(reply, count, repeats);
  json_decref(reply);
  if (!read)
    return key ? client_fail(client, MUSTER_PROTOCOL,
                             "POST %s: the reply has no \"%s\" list of %zu", path, key, count)
               : client_fail(client, MUSTER_PROTOCOL,
                             "POST %s: the reply's \"repeated\" is no count from 0 to %zu", path,
                             count);
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_end_leases(muster_client_t *client, muster_end_t how, const muster_ack_t *acks,
                               size_t count, size_t *repeats) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (how < MUSTER_END_FAIL || how > MUSTER_END_FLAG)
    return client_fail(client, MUSTER_INVALID,
                       "how: %d is no way to end a lease (MUSTER_END_FAIL, MUSTER_END_RELEASE or"
                       " MUSTER_END_FLAG)",
                       (int)how);
  const char *verb = end_verbs[how].verb;
  if (repeats == NULL)
    return ack_send(client, verb, acks, count);
  muster_err_t err = ack_post(client, verb, acks, count);
  return err == MUSTER_OK ? end_read_repeats(client, how, count, repeats) : err;
}

muster_err_t muster_fail(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "fail", acks, count);
}

muster_err_t muster_extend(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "extend", acks, count);
}

muster_err_t muster_release(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "release", acks, count);
}

muster_err_t muster_flag(muster_client_t *client, const muster_ack_t *acks, size_t count) {
  return ack_send(client, "flag", acks, count);
}

/* ---- complete and lease the next tasks ------------------------------------ */

/* Checks muster_complete_lease's arguments (the lease's in `o`); MUSTER_OK
 * or MUSTER_INVALID with the message set. */
static muster_err_t next_check(muster_client_t *client, const muster_ack_t *acks, size_t count,
                               const muster_lease_opts_t *o, int64_t updates_after,
                               muster_lease_t **leases, size_t *nleases, char **updates) {
  if (acks == NULL || count == 0)
    return client_fail(client, MUSTER_INVALID,
                       "acks are required (with nothing to complete, lease with muster_lease)");
  if (o->queue == NULL)
    return client_fail(client, MUSTER_INVALID, "a queue to lease from is required");
  if (leases == NULL || nleases == NULL)
    return client_fail(client, MUSTER_INVALID, "places for the leases are required");
  if (o->max == 0 || o->max > TASK_MAX_BATCH)
    return client_fail(client, MUSTER_INVALID, "max: %zu, expected 1 to %d", o->max,
                       TASK_MAX_BATCH);
  if (o->worker < 0)
    return client_check_min(client, "worker", o->worker, 0, LEASE_WORKER_RANGE);
  if (updates_after >= 0 && updates == NULL)
    return client_fail(client, MUSTER_INVALID,
                       "updates_after %lld asks for updates: a place for them is required",
                       (long long)updates_after);
  return lease_key_check(client, o->request, o->worker);
}

/* Appends the "lease" object {"queue", "max", "worker"?, "updates_after"?,
 * "request"?} and closes the body. */
static muster_err_t next_add_lease(muster_client_t *client, jtext_buf_t *b,
                                   const muster_lease_opts_t *o, int64_t updates_after) {
  JTEXT_ADD_LITERAL(b, ",\"lease\":{\"queue\":");
  if (!jtext_add_string(b, o->queue))
    return client_fail(client, MUSTER_INVALID, "queue: not valid UTF-8");
  JTEXT_ADD_LITERAL(b, ",\"max\":");
  jtext_add_int(b, (int64_t)o->max);
  if (o->worker > 0) {
    JTEXT_ADD_LITERAL(b, ",\"worker\":");
    jtext_add_int(b, o->worker);
  }
  if (updates_after >= 0) {
    JTEXT_ADD_LITERAL(b, ",\"updates_after\":");
    jtext_add_int(b, updates_after);
  }
  lease_add_key(b, o->request);
  JTEXT_ADD_LITERAL(b, "}}");
  return b->failed ? client_fail(client, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* Writes the combined call's body for `acks` and the lease `o` into `b`. */
static muster_err_t next_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                              const muster_lease_opts_t *o, int64_t updates_after, jtext_buf_t *b) {
  muster_err_t err = ack_body(client, acks, count, ack_complete_fields, b);
  if (err == MUSTER_OK)
    err = next_add_lease(client, b, o, updates_after);
  return err;
}

/* muster_complete_lease's arguments as the lease options they are. */
static muster_lease_opts_t next_opts(const char *queue, int64_t worker, size_t max) {
  muster_lease_opts_t o;
  muster_lease_opts_init(&o);
  o.queue = queue;
  o.worker = worker;
  o.max = max;
  return o;
}

muster_err_t lease_next_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             const char *queue, int64_t worker, size_t max, int64_t updates_after,
                             jtext_buf_t *b) {
  muster_lease_opts_t o = next_opts(queue, worker, max);
  return next_body(client, acks, count, &o, updates_after, b);
}

muster_err_t lease_next_send(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             const muster_lease_opts_t *o, int64_t updates_after,
                             muster_lease_t **leases, size_t *nleases, char **updates) {
  static const char path[] = "/v1/leases/complete";
  muster_err_t err = next_check(client, acks, count, o, updates_after, leases, nleases, updates);
  if (err == MUSTER_OK)
    err = next_body(client, acks, count, o, updates_after, &client->body);
  if (err == MUSTER_OK)
    err = client_call_text(client, "POST", path, client->body.data, 0);
  if (err == MUSTER_OK)
    err = lease_read_reply(client, path, leases, nleases, updates_after >= 0 ? updates : NULL);
  return err;
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
  muster_lease_opts_t o = next_opts(queue, worker, max);
  return lease_next_send(client, acks, count, &o, updates_after, leases, nleases, updates);
}
