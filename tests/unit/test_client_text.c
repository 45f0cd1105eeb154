/*
 * test_client_text.c — libmuster's hot calls written and read as text
 * (src/client/jtext.c, task.c, lease.c) against the jansson trees they had.
 *
 * The bodies must be byte for byte what the old tree path sent, and fail with
 * the same code and message; the reply scanners may decline any text, but
 * what they take must give the fields the tree path reads from the parsed
 * reply, and they must never take a reply the tree path refuses.  The old
 * builders are copied below as they stood in src/client before (git 5296b33^)
 * so the comparison does not depend on the code under test; their trees are
 * written with jdump, json_dumps' text but for reals, which both paths now
 * write shortest (jdump itself is held to json_dumps in test_jdump.c).  Each
 * hand-picked case also says whether the fast path must take it or decline
 * it, so a scanner that declines everything fails here too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"
#include "client/jdump.h"

enum { DECLINE, TAKE, EITHER };

/* ---- the old tree path (src/client/task.c and lease.c before the text path) ---- */

/* Adds the verb's own fields of `ack` (element `i`) to `elem`. */
typedef muster_err_t (*old_fields_fn)(muster_client_t *client, json_t *elem,
                                      const muster_ack_t *ack, size_t i);

/* Adds `key` = `text` when `text` is not NULL.  Returns 0, -1 on no memory. */
static int old_set_str(json_t *obj, const char *key, const char *text) {
  if (text == NULL)
    return 0;
  json_t *s = json_string(text);
  if (s == NULL)
    return -1;
  return json_object_set_new(obj, key, s);
}

/* Checks that an optional string field is valid UTF-8, as JSON requires. */
static muster_err_t old_check_text(muster_client_t *client, const char *text, size_t i,
                                   const char *field) {
  json_t *s = text ? json_string(text) : NULL;
  if (text != NULL && s == NULL)
    return client_fail(client, MUSTER_INVALID, "tasks[%zu].%s: not valid UTF-8", i, field);
  json_decref(s);
  return MUSTER_OK;
}

/* Builds the wire element for `spec` into *out (new reference).  Fails with
 * MUSTER_INVALID naming tasks[`i`] when the payload is missing or not JSON. */
static muster_err_t old_spec_json(muster_client_t *client, const muster_task_spec_t *spec, size_t i,
                                  json_t **out) {
  char what[64];
  snprintf(what, sizeof what, "tasks[%zu].payload", i);
  if (spec->payload == NULL)
    return client_fail(client, MUSTER_INVALID, "%s: required", what);
  if (old_check_text(client, spec->key, i, "key") != MUSTER_OK ||
      old_check_text(client, spec->session, i, "session") != MUSTER_OK)
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
    rc = old_set_str(elem, "key", spec->key);
  if (rc == 0)
    rc = old_set_str(elem, "session", spec->session);
  if (rc != 0) {
    json_decref(elem);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  *out = elem;
  return MUSTER_OK;
}

/* Builds {"tasks": [...]} for the batch into *out (new reference). */
static muster_err_t old_batch_json(muster_client_t *client, const muster_task_spec_t *specs,
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
    muster_err_t err = old_spec_json(client, &specs[i], i, &elem);
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
static muster_err_t old_read_ids(muster_client_t *client, json_t *reply, size_t count,
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
/* Sets text field `key` from `text` (skipped when NULL), refusing bad UTF-8. */
static muster_err_t old_ack_set_text(muster_client_t *client, json_t *elem, const char *key,
                                     const char *text, size_t i) {
  if (text == NULL)
    return MUSTER_OK;
  json_t *s = json_string(text);
  if (s == NULL)
    return client_fail(client, MUSTER_INVALID, "leases[%zu].%s: not valid UTF-8", i, key);
  return json_object_set_new(elem, key, s) ? MUSTER_NOMEM : MUSTER_OK;
}

static muster_err_t old_complete_fields(muster_client_t *client, json_t *elem,
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

static muster_err_t old_fail_fields(muster_client_t *client, json_t *elem, const muster_ack_t *ack,
                                    size_t i) {
  muster_err_t err = old_ack_set_text(client, elem, "error", ack->error, i);
  if (err == MUSTER_OK && json_object_set_new(elem, "permanent", json_boolean(ack->permanent)))
    err = MUSTER_NOMEM;
  return err;
}

static muster_err_t old_extend_fields(muster_client_t *client, json_t *elem,
                                      const muster_ack_t *ack, size_t i) {
  if (ack->lease_ms < 0)
    return MUSTER_OK;
  return json_object_set_new(elem, "lease_ms", json_integer((json_int_t)ack->lease_ms))
             ? MUSTER_NOMEM
             : MUSTER_OK;
}

/* A flag's reason travels in the ack's `error` field. */
static muster_err_t old_flag_fields(muster_client_t *client, json_t *elem, const muster_ack_t *ack,
                                    size_t i) {
  return old_ack_set_text(client, elem, "reason", ack->error, i);
}

/* Builds {"leases": [...]} from `acks` into *out (new reference). */
static muster_err_t old_ack_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                                 old_fields_fn fields, json_t **out) {
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

/* Adds the "lease" object {"queue", "max", "worker"?, "updates_after"?} to `body`. */
static muster_err_t old_add_lease(muster_client_t *client, json_t *body, const char *queue,
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

/* ---- helpers ----------------------------------------------------------------- */

static muster_client_t *new_client(void) {
  muster_client_t *c = NULL;
  assert_int_equal(muster_client_new("http://127.0.0.1:9", "token", &c), MUSTER_OK);
  return c;
}

/* The old body text of a tree builder's result, or NULL with the error. */
static char *old_text(muster_err_t err, json_t *body) {
  char *text = err == MUSTER_OK ? jdump(body, JSON_COMPACT) : NULL;
  json_decref(body);
  return text;
}

/* Compares a new body (err_new, b) with the old one (err_old, old, message). */
static void same_body(muster_err_t err_old, char *old, const char *old_message,
                      muster_err_t err_new, const jtext_buf_t *b, const char *new_message) {
  assert_int_equal(err_new, err_old);
  if (err_old != MUSTER_OK) {
    assert_string_equal(new_message, old_message);
    return;
  }
  assert_non_null(old);
  assert_false(b->failed);
  assert_string_equal(b->data, old); /* the bytes on the wire */
  assert_int_equal(strlen(b->data), b->len);
  json_t *a = json_loads(old, JSON_ALLOW_NUL, NULL), *n = json_loads(b->data, JSON_ALLOW_NUL, NULL);
  assert_non_null(a);
  assert_true(json_equal(a, n));
  json_decref(a);
  json_decref(n);
  free(old);
}

/* The put body of `specs` both ways. */
static void same_put(const muster_task_spec_t *specs, size_t count) {
  muster_client_t *c = new_client();
  json_t *body = NULL;
  muster_err_t err_old = old_batch_json(c, specs, count, &body);
  char *old = old_text(err_old, body);
  char old_message[CLIENT_MESSAGE_MAX];
  snprintf(old_message, sizeof old_message, "%s", muster_client_message(c));
  client_ok(c);
  jtext_buf_t b = {0};
  muster_err_t err_new = task_put_body(c, specs, count, &b);
  same_body(err_old, old, old_message, err_new, &b, muster_client_message(c));
  jtext_buf_free(&b);
  muster_client_free(c);
}

/* One put of `payload`; `expect` says whether jtext_add_json must take it. */
static void put_payload(const char *payload, int expect) {
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = payload;
  same_put(&spec, 1);
  if (expect != EITHER) {
    jtext_buf_t b = {0};
    assert_int_equal(jtext_add_json(&b, payload, strlen(payload)), expect == TAKE);
    jtext_buf_free(&b);
  }
}

/* The ack body of `verb` both ways. */
static void same_acks(const char *verb, const muster_ack_t *acks, size_t count) {
  static const struct {
    const char *verb;
    old_fields_fn fields;
  } verbs[] = {{"complete", old_complete_fields},
               {"fail", old_fail_fields},
               {"extend", old_extend_fields},
               {"release", NULL},
               {"flag", old_flag_fields}};
  size_t v = 0;
  while (strcmp(verbs[v].verb, verb) != 0)
    v++;
  muster_client_t *c = new_client();
  json_t *body = NULL;
  muster_err_t err_old = old_ack_body(c, acks, count, verbs[v].fields, &body);
  char *old = old_text(err_old, body);
  char old_message[CLIENT_MESSAGE_MAX];
  snprintf(old_message, sizeof old_message, "%s", muster_client_message(c));
  client_ok(c);
  jtext_buf_t b = {0};
  muster_err_t err_new = lease_ack_body(c, verb, acks, count, &b);
  same_body(err_old, old, old_message, err_new, &b, muster_client_message(c));
  jtext_buf_free(&b);
  muster_client_free(c);
}

/* muster_complete_lease's body both ways. */
static void same_next(const muster_ack_t *acks, size_t count, const char *queue, int64_t worker,
                      size_t max, int64_t updates_after) {
  muster_client_t *c = new_client();
  json_t *body = NULL;
  muster_err_t err_old = old_ack_body(c, acks, count, old_complete_fields, &body);
  if (err_old == MUSTER_OK)
    err_old = old_add_lease(c, body, queue, worker, max, updates_after);
  char *old = old_text(err_old, body);
  char old_message[CLIENT_MESSAGE_MAX];
  snprintf(old_message, sizeof old_message, "%s", muster_client_message(c));
  client_ok(c);
  jtext_buf_t b = {0};
  muster_err_t err_new = lease_next_body(c, acks, count, queue, worker, max, updates_after, &b);
  same_body(err_old, old, old_message, err_new, &b, muster_client_message(c));
  jtext_buf_free(&b);
  muster_client_free(c);
}

/* ---- random JSON texts ----------------------------------------------------------- */

static unsigned rng = 2463534242u;

static unsigned next_random(void) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}

static void add(jtext_buf_t *b, const char *text) {
  jtext_add(b, text, strlen(text));
}

/* Whitespace, now and then. */
static void maybe_space(jtext_buf_t *b) {
  static const char *const spaces[] = {" ", "\n", "\t", "\r\n  "};
  if (next_random() % 6 == 0)
    add(b, spaces[next_random() % 4]);
}

static void random_string(jtext_buf_t *b, bool key) {
  static const char *const pieces[] = {"a",
                                       "key",
                                       "caf\xc3\xa9",
                                       "\xe2\x82\xac",
                                       "\xf0\x9f\x98\x80",
                                       "\\n",
                                       "\\t",
                                       "\\\"",
                                       "\\\\",
                                       "\\/",
                                       "\\u00e9",
                                       "\\u000A",
                                       "\\u000a",
                                       "\\u001F",
                                       "\\u0000",
                                       "\\ud83d\\ude00",
                                       "\\b",
                                       "\\f",
                                       "\\r",
                                       "/",
                                       "\x7f",
                                       "\\u0041",
                                       "\\u00E9",
                                       "x y"};
  add(b, "\"");
  int n = (int)(next_random() % (key ? 2 : 4));
  for (int i = 0; i < n; i++)
    add(b, pieces[next_random() % (sizeof pieces / sizeof pieces[0])]);
  add(b, "\"");
}

static void random_value(jtext_buf_t *b, int depth) {
  static const char *const scalars[] = {"0",
                                        "-0",
                                        "1",
                                        "-1",
                                        "42",
                                        "9223372036854775807",
                                        "-9223372036854775808",
                                        "9223372036854775808",
                                        "-9223372036854775809",
                                        "123456789012345678901234",
                                        "1.5",
                                        "1.50",
                                        "-0.0",
                                        "1e3",
                                        "1E+3",
                                        "2.5e-3",
                                        "1e400",
                                        "0.1",
                                        "true",
                                        "false",
                                        "null"};
  unsigned kind = depth > 5 ? next_random() % 3 : next_random() % 5;
  if (kind == 0) {
    add(b, scalars[next_random() % (sizeof scalars / sizeof scalars[0])]);
  } else if (kind == 1 || kind == 2) {
    random_string(b, false);
  } else if (kind == 3) {
    add(b, "[");
    int n = (int)(next_random() % 4);
    for (int i = 0; i < n; i++) {
      if (i)
        add(b, ",");
      maybe_space(b);
      random_value(b, depth + 1);
      maybe_space(b);
    }
    add(b, "]");
  } else {
    add(b, "{");
    int n = (int)(next_random() % 4);
    for (int i = 0; i < n; i++) {
      if (i)
        add(b, ",");
      maybe_space(b);
      random_string(b, true); /* short keys: duplicates happen */
      maybe_space(b);
      add(b, ":");
      maybe_space(b);
      random_value(b, depth + 1);
    }
    add(b, "}");
  }
}

/* Changes a few bytes of `text` (`len`) in place. */
static void mutate(char *text, size_t len) {
  static const char alphabet[] = "{}[]:,\"\\ 0129-.eEanultrsfxu\x01\x80\xc3\xa9\xff";
  for (unsigned k = 0, n = 1 + next_random() % 3; k < n && len > 0; k++)
    text[next_random() % len] = alphabet[next_random() % (sizeof alphabet - 1)];
}

/* ---- put bodies ------------------------------------------------------------------- */

static void test_put_payloads(void **state) {
  (void)state;
  static const struct {
    const char *payload;
    int expect;
  } cases[] = {
      {"1", TAKE},
      {"{\"a\":1}", TAKE},
      {"{\"a\": 1, \"b\": [1, 2, {\"c\" : null}]}", TAKE}, /* compacted */
      {"  \"x y\"\n", TAKE},
      {"\"caf\xc3\xa9 \xf0\x9f\x98\x80\"", TAKE},
      {"\"a\\nb\\t\\\"\\\\\\b\\f\\r\"", TAKE},
      {"\"\\u001F\\u0000\\u0001\"", TAKE},
      {"[]", TAKE},
      {"{}", TAKE},
      {"[ ]", TAKE},
      {"-9223372036854775808", TAKE},
      {"9223372036854775807", TAKE},
      {"[true,false,null,\"\x7f\"]", TAKE},
      {"{\"a\":{\"a\":1},\"b\":{\"a\":2}}", TAKE}, /* the same key in two objects */
      /* Reals in their shortest text. */
      {"1.5", TAKE},
      {"{\"x\": 0.1, \"y\": [1e300, 2.5e-7, -0.0, 1.0]}", TAKE},
      {"1.50", DECLINE},
      {"1e3", DECLINE},
      {"1E300", DECLINE},
      {"0.10000000000000001", DECLINE},
      {"1e400", DECLINE}, /* jansson: real number overflow */
      {"-0", DECLINE},
      {"9223372036854775808", DECLINE}, /* jansson: too big integer */
      {"-9223372036854775809", DECLINE},
      {"\"\\u00e9\"", DECLINE},
      {"\"\\u00E9\"", DECLINE},
      {"\"\\/\"", DECLINE},
      {"\"\\u000a\"", DECLINE},
      {"\"\\u000A\"", DECLINE},
      {"\"\\u001f\"", DECLINE},
      {"\"\\u0041\"", DECLINE},
      {"\"\\ud83d\\ude00\"", DECLINE},
      {"{\"a\":1,\"a\":2}", DECLINE},
      {"{\"a\":1,\"b\":2,\"a\":3}", DECLINE},
      {"{\"\\u0000\":1}", DECLINE}, /* jansson: NUL byte in object key */
      {"", DECLINE},
      {" ", DECLINE},
      {"{", DECLINE},
      {"[1,]", DECLINE},
      {"[1 2]", DECLINE},
      {"\"\xff\"", DECLINE},
      {"\"\xc0\xaf\"", DECLINE},
      {"\"\xed\xa0\x80\"", DECLINE},
      {"\"\\ud800\"", DECLINE},
      {"\"\\udc00\"", DECLINE},
      {"\"\\x\"", DECLINE},
      {"\"\x01\"", DECLINE},
      {"01", DECLINE},
      {"1 2", DECLINE},
      {"nul", DECLINE},
      {"truex", DECLINE},
      {"{\"a\" 1}", DECLINE},
      {"{a:1}", DECLINE},
      {"'a'", DECLINE},
      {"+1", DECLINE},
      {".5", DECLINE},
      {"1.", DECLINE},
      {"[1]x", DECLINE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    put_payload(cases[i].payload, cases[i].expect);
  /* Nesting: 64 levels are taken, 65 go to jansson, 2049 are its error. */
  for (size_t depth = 63; depth <= 2049; depth += depth < 66 ? 1 : 2049 - 66) {
    char *text = malloc(2 * depth + 2);
    memset(text, '[', depth);
    text[depth] = '1';
    memset(text + depth + 1, ']', depth);
    text[2 * depth + 1] = '\0';
    put_payload(text, depth <= JTEXT_MAX_DEPTH ? TAKE : DECLINE);
    free(text);
  }
}

static void test_put_fields(void **state) {
  (void)state;
  muster_task_spec_t specs[4];
  for (int i = 0; i < 4; i++) {
    muster_task_spec_init(&specs[i]);
    specs[i].payload = "{\"n\": 1}";
  }
  same_put(specs, 0);
  same_put(specs, 4);
  specs[0].priority = -5;
  specs[1].delay_ms = 1500;
  specs[2].index = 0;
  specs[3].index = 7;
  specs[3].priority = INT64_MAX;
  specs[0].key = "k\"\\\n\x01\x1f/\xc3\xa9";
  specs[2].session = "s\tes\xe2\x82\xac";
  same_put(specs, 4);
  specs[1].payload = NULL; /* required */
  same_put(specs, 4);
  specs[1].payload = "1.5";
  specs[2].key = "bad\xff"; /* the key's error comes before the payload's */
  specs[2].payload = "{";
  same_put(specs, 4);
  specs[2].key = NULL;
  specs[2].session = "\xc3"; /* cut short */
  same_put(specs, 4);
  specs[2].session = NULL;
  same_put(specs, 4); /* tasks[2].payload: not valid JSON */
  specs[2].payload = "[1]";
  specs[3].payload = "\"\\ud800\"";
  same_put(specs, 4);
}

/* Random payloads, some made invalid: the same body or error either way;
 * and what jdump writes, the fast path takes as it stands. */
static void test_put_random(void **state) {
  (void)state;
  jtext_buf_t text = {0};
  for (int round = 0; round < 6000; round++) {
    jtext_reset(&text);
    random_value(&text, 0);
    if (round % 3 == 2)
      mutate(text.data, text.len);
    put_payload(text.data, EITHER);
    json_t *v = json_loads(text.data, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (v == NULL)
      continue;
    char *dumped = jdump(v, JSON_COMPACT);
    jtext_buf_t b = {0};
    assert_true(jtext_add_json(&b, dumped, strlen(dumped)));
    assert_string_equal(b.data, dumped);
    jtext_buf_free(&b);
    free(dumped);
    json_decref(v);
  }
  jtext_buf_free(&text);
}

/* ---- acknowledgement bodies ------------------------------------------------------------ */

static void test_acks(void **state) {
  (void)state;
  static const char *const verbs[] = {"complete", "fail", "extend", "release", "flag"};
  muster_ack_t acks[4];
  for (int i = 0; i < 4; i++)
    muster_ack_init(&acks[i], 100 + i, 9000 + i);
  for (int v = 0; v < 5; v++) {
    same_acks(verbs[v], acks, 0);
    same_acks(verbs[v], acks, 4);
  }
  acks[0].result = "{\"ok\": true, \"score\": 0.5}";
  acks[1].result = "[1,2,3]";
  acks[2].error = "disk \"full\"\n\xc3\xa9";
  acks[2].permanent = 2;
  acks[3].lease_ms = 0;
  acks[1].lease_ms = 120000;
  acks[3].task = INT64_MAX;
  for (int v = 0; v < 5; v++)
    same_acks(verbs[v], acks, 4);
  acks[1].result = "[1,2,"; /* leases[1].result: not valid JSON */
  acks[0].error = "\xff";   /* leases[0].error / reason: not valid UTF-8 */
  for (int v = 0; v < 5; v++)
    same_acks(verbs[v], acks, 4);
  jtext_buf_t text = {0};
  for (int round = 0; round < 3000; round++) {
    jtext_reset(&text);
    random_value(&text, 0);
    if (round % 3 == 2)
      mutate(text.data, text.len);
    muster_ack_init(&acks[0], 1, 2);
    acks[0].result = text.data;
    acks[0].error = text.data; /* any bytes as an error text */
    same_acks("complete", acks, 1);
    same_acks("fail", acks, 1);
  }
  jtext_buf_free(&text);
}

static void test_next(void **state) {
  (void)state;
  muster_ack_t acks[2];
  muster_ack_init(&acks[0], 1, 2);
  muster_ack_init(&acks[1], 3, 4);
  acks[1].result = "{\"x\": [1, \"y\"]}";
  same_next(acks, 2, "q", 0, 1, -1);
  same_next(acks, 2, "caf\xc3\xa9", 7, 1000, 0);
  same_next(acks, 1, "q", 3, 64, 12345);
  same_next(acks, 2, "q\xff", 3, 64, 12345); /* queue: not valid UTF-8 */
  acks[0].result = "nope";                   /* the results' error comes first */
  same_next(acks, 2, "q\xff", 3, 64, 12345);
}

/* ---- lease replies ------------------------------------------------------------------ */

/* Checks what lease_scan_reply makes of `len` bytes of `text` against the
 * tree path; `expect` says whether it must take the text. */
static void same_lease_reply_len(const char *text, size_t len, bool want_updates, int expect) {
  muster_lease_t *got = NULL;
  size_t n = 0;
  char *updates = NULL;
  bool took = lease_scan_reply(text, len, &got, &n, want_updates ? &updates : NULL);
  if (expect != EITHER && took != (expect == TAKE))
    fprintf(stderr, "lease reply %s: %.*s\n", took ? "taken" : "declined", (int)len, text);
  if (expect != EITHER)
    assert_int_equal(took, expect == TAKE);
  if (!took)
    return;
  json_t *tree = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
  assert_non_null(tree); /* never a reply the tree path refuses */
  muster_client_t *c = new_client();
  muster_lease_t *want = NULL;
  size_t count = 0;
  char *want_updates_text = NULL;
  assert_int_equal(
      lease_read_tree(c, tree, &want, &count, want_updates ? &want_updates_text : NULL), MUSTER_OK);
  assert_int_equal(n, count);
  assert_non_null(got); /* an array even for no leases, as the tree path gives */
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(got[i].task, want[i].task);
    assert_int_equal(got[i].token, want[i].token);
    assert_int_equal(got[i].attempt, want[i].attempt);
    assert_int_equal(got[i].deadline_ms, want[i].deadline_ms);
    assert_int_equal(got[i].parent, want[i].parent);
    assert_int_equal(got[i].index, want[i].index);
    assert_string_equal(got[i].payload, want[i].payload);
    if (want[i].session == NULL)
      assert_null(got[i].session);
    else
      assert_string_equal(got[i].session, want[i].session);
  }
  if (want_updates)
    assert_string_equal(updates, want_updates_text);
  muster_leases_free(got, n);
  muster_leases_free(want, count);
  free(updates);
  free(want_updates_text);
  json_decref(tree);
  muster_client_free(c);
}

static void same_lease_reply(const char *text, bool want_updates, int expect) {
  same_lease_reply_len(text, strlen(text), want_updates, expect);
}

#define LEASE_A                                                                                    \
  "{\"task\":1,\"token\":2,\"payload\":\"xx\",\"attempt\":1,\"deadline_ms\":1795333021373,"        \
  "\"parent\":null,\"session\":null,\"index\":null}"
#define LEASE_B                                                                                    \
  "{\"task\":9223372036854775807,\"token\":5,\"payload\":{\"a\":[1,\"\\u0000\\n\"],\"b\":{}},"     \
  "\"attempt\":3,\"deadline_ms\":-1,\"parent\":4,\"session\":\"s caf\xc3\xa9\","                   \
  "\"index\":0,\"requires\":[\"level-1\"]}"

/* A reply in lease_write's form with `payload` and `session` (JSON texts). */
static void lease_reply_with(jtext_buf_t *b, const char *payload, const char *session) {
  jtext_reset(b);
  add(b, "{\"leases\":[" LEASE_A ",{\"task\":7,\"token\":8,\"payload\":");
  add(b, payload);
  add(b, ",\"attempt\":2,\"deadline_ms\":10,\"parent\":null,\"session\":");
  add(b, session);
  add(b, ",\"index\":5}]}\n");
}

static void test_lease_reply(void **state) {
  (void)state;
  static const struct {
    const char *text;
    bool updates;
    int expect;
  } cases[] = {
      {"{\"leases\":[]}", false, TAKE},
      {"{\"leases\":[]}\n", false, TAKE},
      {"{\"leases\":[" LEASE_A "]}\n", false, TAKE},
      {"{\"leases\":[" LEASE_A "," LEASE_B "," LEASE_A "]}\n", false, TAKE},
      {"{\"completed\":[{\"task\":1,\"next_task\":null}],\"leases\":[" LEASE_B "],"
       "\"updates\":[{\"id\":3,\"data\":{\"k\":\"v\"}}],\"updates_last\":9}\n",
       true, TAKE},
      {"{\"completed\":[{\"task\":1,\"next_task\":2}],\"leases\":[],\"updates\":[],"
       "\"updates_last\":0}",
       true, TAKE},
      {"{\"completed\":[{\"task\":1,\"next_task\":2}],\"leases\":[" LEASE_A "]}", false, TAKE},
      {"{\"leases\":[" LEASE_A "],\"updates\":[],\"updates_last\":0}", false, EITHER},
      /* what the tree path reads too, but the scanner does not follow */
      {"{\"leases\":[" LEASE_A "],\"updates\":[ ],\"updates_last\":0}", true, DECLINE},
      {"{\"leases\":[" LEASE_A "],\"updates\":[{\"x\":1.50}],\"updates_last\":0}", true, DECLINE},
      {"{\"leases\":[" LEASE_A "],\"updates\":[{\"x\":1.5}],\"updates_last\":0}", true, TAKE},
      {"{\"leases\": [" LEASE_A "]}", false, DECLINE},
      {" {\"leases\":[]}", false, DECLINE},
      {"{\"leases\":[{\"token\":2,\"task\":1,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":\"a\\\"b\",\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":\"\\u00e9\",\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":null,\"extra\":1}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":1.5}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":null,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":0,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":\"x\",\"session\":null,\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":2,\"payload\":1,\"attempt\":1,\"deadline_ms\":1,"
       "\"parent\":null,\"session\":null,\"index\":null,\"requires\":1.50}]}",
       false, DECLINE},
      {"{\"leases\":[{\"task\":1,\"token\":99999999999999999999,\"payload\":1,\"attempt\":1,"
       "\"deadline_ms\":1,\"parent\":null,\"session\":null,\"index\":null}]}",
       false, DECLINE},
      {"{\"leases\":{}}", false, DECLINE},
      {"{\"leases\":[],\"leases\":[" LEASE_A "]}", false, DECLINE},
      {"{\"le\\u0061ses\":[" LEASE_A "],\"leases\":[]}", false, DECLINE},
      {"{\"other\":1.50,\"leases\":[]}", false, DECLINE},
      {"{\"leases\":[]}x", false, DECLINE},
      {"[{\"leases\":[]}]", false, DECLINE},
      {"{\"leases\":[]", false, DECLINE},
      {"{}", false, DECLINE},
      {"", false, DECLINE},
      {"{\"leases\":[]}", true, DECLINE}, /* no updates: the tree path's error */
      {"{\"leases\":[],\"updates\":{},\"updates_last\":1}", true, DECLINE},
      {"{\"leases\":[],\"updates\":[],\"updates_last\":1.0}", true, DECLINE},
      {"{\"leases\":[],\"updates\":[],\"updates\":[1],\"updates_last\":1}", true, DECLINE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    same_lease_reply(cases[i].text, cases[i].updates, cases[i].expect);

  /* Payloads: canonical ones copied, others through jansson one by one, and
   * a reply the tree path refuses is refused whole. */
  static const struct {
    const char *payload;
    int expect;
  } payloads[] = {
      {"{\"a\":1.5}", TAKE},
      {"{\"a\":0.10000000000000001}", TAKE}, /* stored by an older head: written 0.1 */
      {"{\"a\": 1}", TAKE},
      {"\"\\u00e9\\/\"", TAKE},
      {"[1e3,-0,1.50]", TAKE},
      {"{\"a\":1,\"a\":2}", TAKE},
      {"1e400", DECLINE},
      {"99999999999999999999", DECLINE},
      {"{\"\\u0000\":1}", DECLINE},
      {"[1,]", DECLINE},
  };
  jtext_buf_t b = {0};
  for (size_t i = 0; i < sizeof payloads / sizeof payloads[0]; i++) {
    lease_reply_with(&b, payloads[i].payload, "\"s\"");
    same_lease_reply(b.data, false, payloads[i].expect);
  }
  lease_reply_with(&b, "1", "\"caf\xc3\xa9\"");
  same_lease_reply(b.data, false, TAKE);

  /* Every prefix of a canonical reply. */
  const char *whole = "{\"completed\":[],\"leases\":[" LEASE_A "," LEASE_B
                      "],\"updates\":[{\"id\":1}],\"updates_last\":1}\n";
  for (size_t len = 0; len <= strlen(whole); len++) {
    same_lease_reply_len(whole, len, true, len + 1 >= strlen(whole) ? TAKE : DECLINE);
    same_lease_reply_len(whole, len, false, EITHER);
  }

  /* Random payloads: jdump's text taken as it stands. */
  jtext_buf_t text = {0};
  for (int round = 0; round < 4000; round++) {
    jtext_reset(&text);
    random_value(&text, 0);
    if (round % 2) {
      lease_reply_with(&b, text.data, "null");
      same_lease_reply(b.data, false, EITHER);
    }
    json_t *v = json_loads(text.data, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (v == NULL)
      continue;
    char *dumped = jdump(v, JSON_COMPACT);
    lease_reply_with(&b, dumped, "\"x\"");
    same_lease_reply(b.data, false, TAKE);
    free(dumped);
    json_decref(v);
  }
  jtext_buf_free(&text);

  /* Random bytes changed in canonical replies. */
  char buf[1024];
  for (int round = 0; round < 20000; round++) {
    size_t len = strlen(whole);
    memcpy(buf, whole, len);
    mutate(buf, len);
    same_lease_reply_len(buf, len, round % 2, EITHER);
  }
  jtext_buf_free(&b);
}

/* ---- put replies and replies only checked ------------------------------------------- */

static void same_ids_len(const char *text, size_t len, size_t count, int expect) {
  int64_t got[4] = {0}, want[4] = {0};
  bool took = task_scan_ids(text, len, count, got);
  if (expect != EITHER)
    assert_int_equal(took, expect == TAKE);
  if (!took)
    return;
  json_t *tree = json_loadb(text, len, JSON_ALLOW_NUL, NULL);
  assert_non_null(tree);
  muster_client_t *c = new_client();
  assert_int_equal(old_read_ids(c, tree, count, want), MUSTER_OK);
  assert_memory_equal(got, want, sizeof got);
  json_decref(tree);
  muster_client_free(c);
}

static void same_ids(const char *text, size_t count, int expect) {
  same_ids_len(text, strlen(text), count, expect);
}

static void test_put_reply(void **state) {
  (void)state;
  const char *three = "{\"tasks\":[{\"id\":1,\"created\":true},{\"id\":22,\"created\":false},"
                      "{\"id\":9223372036854775807,\"created\":true}]}\n";
  same_ids(three, 3, TAKE);
  same_ids("{\"tasks\":[]}", 0, TAKE);
  same_ids(three, 2, DECLINE);
  same_ids(three, 4, DECLINE);
  same_ids("{\"tasks\":[{\"id\":0,\"created\":true}]}", 1, DECLINE);
  same_ids("{\"tasks\":[{\"id\":1,\"created\":1}]}", 1, DECLINE);
  same_ids("{\"tasks\":[{\"id\":1}]}", 1, DECLINE);
  same_ids("{\"tasks\":[{\"id\":1,\"created\":true,\"x\":1}]}", 1, DECLINE);
  same_ids("{\"tasks\": [{\"id\":1,\"created\":true}]}", 1, DECLINE);
  same_ids("{\"tasks\":[{\"id\":1,\"created\":true}]}x", 1, DECLINE);
  same_ids("", 0, DECLINE);
  char buf[256];
  for (int round = 0; round < 20000; round++) {
    size_t len = strlen(three);
    memcpy(buf, three, len);
    mutate(buf, len);
    same_ids_len(buf, len, 3, EITHER);
  }
}

/* client_reply_check answers as parsing the reply into a tree does. */
static void same_check(const char *text, size_t len) {
  muster_client_t *c = new_client();
  assert_true(client_buf_append(&c->reply, text, len));
  json_error_t jerr;
  json_t *tree = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
  muster_err_t err = client_reply_check(c, "POST", "/p");
  if (tree != NULL) {
    assert_int_equal(err, MUSTER_OK);
    assert_string_equal(muster_client_message(c), "");
  } else {
    char want[CLIENT_MESSAGE_MAX];
    snprintf(want, sizeof want, "POST /p: unreadable reply: %s", jerr.text);
    assert_int_equal(err, MUSTER_PROTOCOL);
    assert_string_equal(muster_client_message(c), want);
  }
  json_decref(tree);
  muster_client_free(c);
}

static void test_reply_check(void **state) {
  (void)state;
  static const char *const texts[] = {
      "{\"completed\":[{\"task\":1,\"next_task\":null}]}\n",
      "{\"released\":3}",
      "[]",
      "5",
      "\"x\"",
      "",
      "{\"a\":1.5}",
      "{\"a\":99999999999999999999}",
      "{\"a\":1,\"a\":2}",
      "{\"\\u0000\":1}",
      " {}",
      "{}x",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    same_check(texts[i], strlen(texts[i]));
  const char *seed =
      "{\"completed\":[{\"task\":1,\"next_task\":null},{\"task\":2,\"next_task\":7}]}\n";
  char buf[128];
  for (int round = 0; round < 10000; round++) {
    size_t len = strlen(seed);
    memcpy(buf, seed, len);
    mutate(buf, len);
    same_check(buf, len);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_payloads), cmocka_unit_test(test_put_fields),
      cmocka_unit_test(test_put_random),   cmocka_unit_test(test_acks),
      cmocka_unit_test(test_next),         cmocka_unit_test(test_lease_reply),
      cmocka_unit_test(test_put_reply),    cmocka_unit_test(test_reply_check),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
