/*
 * compat.c — the DistCompute tracker protocol on top of queues, leases and
 * workers.
 *
 * Mapping.  A pipeline NAME=Q1..Qn serves stage letters a..(a+n-1).
 * `GET api/new` registers a muster worker (nickname, queues [Qi], labels
 * {"distcompute": NAME, "stage": letter}) and a random token kept in
 * compat_workers.  `newJob` leases one task of Qi for that worker; the lease
 * lasts the worker's heartbeat timeout and every later call of the worker
 * (progress, validate, complete...) heart-beats and extends it, so a job is
 * held exactly as long as its worker is alive: when the worker goes silent,
 * the head's worker timeout returns the task to its queue.  `completeJob`
 * completes the lease (the queue's `next` carries the data to the following
 * stage), `flagInvalidData` flags it (max_flags flags re-open the parent one
 * stage back), `bye` is a muster goodbye.  A job's `number` is given when the
 * job is first leased, counting from 1 per pipeline, and stays with the job
 * through every stage (compat_jobs.c; numbered by the first queue, so that
 * the Python client's workers number the same jobs alike).
 *
 * Data.  Tracker jobs are strings; lists and dicts travel as "<!json!>" +
 * JSON.  A muster payload that is a JSON string goes out as that string, any
 * other payload as "<!json!>" + its JSON; a completed job's data that starts
 * with "<!json!>" and parses is stored as that JSON value, other data as a
 * string.  So tasks put with `muster put --json` and workers of either kind
 * interoperate.
 *
 * Replies follow the tracker: JSON for api/new and newJob, plain text for
 * the rest and for every error (400 bad request, 403 no job, 404 unknown or
 * timed-out worker).
 */
#include "compat.h"
#include "compat_bounds.h"
#include "compat_jobs.h"
#include "jv.h"
#include "lease.h"
#include "log.h"
#include "queue.h"
#include "task.h"
#include "worker.h"
#include "core/names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define COMPAT_PREFIX "/compat/distcompute/"
#define COMPAT_JSON_MARK "<!json!>"
#define COMPAT_TEXT "text/plain; charset=utf-8"
#define COMPAT_TOKEN_BYTES 16

/* The tracker's words for a token without a live worker come first (clients
 * and people grep for them); what follows says which case it is. */
static const char msg_worker_gone[] =
    "The server could not find this worker. Did the worker time out?";

typedef struct {
  char name[NAME_MAX_LEN + 1];
  char queues[COMPAT_MAX_STAGES][NAME_MAX_LEN + 1];
  int nstages;
} pipeline_t;

static pipeline_t pipelines[COMPAT_MAX_PIPELINES];
static int npipelines;

/* A registered DistCompute worker, as compat_workers and workers have it. */
typedef struct {
  const pipeline_t *pipe;
  int stage;          /* 0 for 'a' */
  int64_t worker;     /* muster worker id */
  int64_t timeout_ms; /* its heartbeat timeout */
  bool active;
  char name[NAME_MAX_LEN + 1]; /* its display name */
} dc_worker_t;

/* ---- configuration ---- */

static bool compat_parse_queues(pipeline_t *p, const char *list) {
  const char *at = list;
  while (*at) {
    size_t len = strcspn(at, ",");
    if (p->nstages == COMPAT_MAX_STAGES || len == 0 || len > NAME_MAX_LEN)
      return false;
    snprintf(p->queues[p->nstages], sizeof p->queues[0], "%.*s", (int)len, at);
    if (!name_is_valid(p->queues[p->nstages]))
      return false;
    for (int i = 0; i < p->nstages; i++)
      if (strcmp(p->queues[i], p->queues[p->nstages]) == 0)
        return false;
    p->nstages++;
    at += len;
    if (*at == ',' && *++at == '\0')
      return false;
  }
  return p->nstages > 0;
}

bool compat_add_pipeline(const char *spec) {
  const char *eq = strchr(spec, '=');
  pipeline_t p = {0};
  if (npipelines == COMPAT_MAX_PIPELINES) {
    fprintf(stderr, "muster head: at most %d --distcompute pipelines\n", COMPAT_MAX_PIPELINES);
    return false;
  }
  if (eq == NULL || eq == spec || (size_t)(eq - spec) > NAME_MAX_LEN) {
    fprintf(stderr, "muster head: --distcompute takes NAME=QUEUE_A,QUEUE_B,...\n");
    return false;
  }
  snprintf(p.name, sizeof p.name, "%.*s", (int)(eq - spec), spec);
  if (!name_is_valid(p.name) || compat_pipeline_exists(p.name) ||
      !compat_parse_queues(&p, eq + 1)) {
    fprintf(stderr,
            "muster head: --distcompute %s: give a new pipeline name and 1 to %d different "
            "queue names, comma-separated\n",
            spec, COMPAT_MAX_STAGES);
    return false;
  }
  pipelines[npipelines++] = p;
  return true;
}

static const pipeline_t *compat_find(const char *name) {
  for (int i = 0; name && i < npipelines; i++)
    if (strcmp(pipelines[i].name, name) == 0)
      return &pipelines[i];
  return NULL;
}

bool compat_pipeline_exists(const char *name) {
  return compat_find(name) != NULL;
}

/* Makes queue `name` exist with `next` ("" for none allowed to stay as is). */
static muster_err_t compat_setup_queue(store_t *st, const char *pipe, const char *name,
                                       const char *next, fail_t *f) {
  queue_t q;
  muster_err_t err = queue_load(st, name, &q, f);
  if (err && err != MUSTER_QUEUE_NOT_FOUND)
    return err;
  bool missing = err == MUSTER_QUEUE_NOT_FOUND;
  if (!missing && (next[0] == '\0' || strcmp(q.next, next) == 0))
    return MUSTER_OK;
  if (!missing && q.next[0] != '\0')
    return fail_set(f, MUSTER_INVALID,
                    "pipeline '%s': queue '%s' has next stage '%s', not '%s'; change it with "
                    "`muster queue create %s --next %s` or name the queues in their order",
                    pipe, name, q.next, next, name, next);
  json_t *body = next[0] ? json_pack("{s:s}", "next", next) : json_object();
  bool created = false;
  *f = (fail_t){0};
  err = queue_put(st, name, body, &created, f);
  json_decref(body);
  if (err == MUSTER_OK)
    log_msg(LOG_INFO, "distcompute %s: %s queue '%s'%s%s", pipe, created ? "created" : "linked",
            name, next[0] ? " -> " : "", next);
  return err;
}

/* The queues of every pipeline, linked, and the numbers of their old names
 * adopted: all in one transaction, so that a refused link changes nothing. */
static muster_err_t compat_setup_pipelines(store_t *st, fail_t *f) {
  sqlite3 *db = store_db(st);
  if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
    return store_fail(st, f, "distcompute setup");
  muster_err_t err = MUSTER_OK;
  for (int p = 0; p < npipelines && !err; p++) {
    const pipeline_t *pipe = &pipelines[p];
    for (int i = pipe->nstages - 1; i >= 0 && !err; i--)
      err = compat_setup_queue(st, pipe->name, pipe->queues[i],
                               i + 1 < pipe->nstages ? pipe->queues[i + 1] : "", f);
    if (!err)
      err = compat_jobs_adopt(st, pipe->name, pipe->queues[0], f);
  }
  if (err || sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return err ? err : store_fail(st, f, "distcompute setup");
  }
  return MUSTER_OK;
}

muster_err_t compat_setup(store_t *st, fail_t *f) {
  if (npipelines > 0 && compat_setup_pipelines(st, f))
    return f->code;
  /* Also without pipelines, since the Python client numbers jobs through
   * the API.  Outside the transaction: it writes nothing but this
   * connection's temporary triggers, so a head without pipelines opens
   * none. */
  return compat_jobs_watch(st, f);
}

json_t *compat_pipelines_json(void) {
  json_t *list = json_array();
  for (int p = 0; p < npipelines; p++) {
    json_t *stages = json_array();
    for (int i = 0; i < pipelines[p].nstages; i++)
      json_array_append_new(stages, json_pack("{s:s#, s:s}", "stage", &"abcde"[i], (size_t)1,
                                              "queue", pipelines[p].queues[i]));
    char prefix[sizeof COMPAT_PREFIX + NAME_MAX_LEN];
    snprintf(prefix, sizeof prefix, COMPAT_PREFIX "%s", pipelines[p].name);
    json_array_append_new(list,
                          json_pack("{s:s, s:s, s:s, s:o}", "name", pipelines[p].name, "project",
                                    pipelines[p].name, "prefix", prefix, "stages", stages));
  }
  return json_pack("{s:o}", "pipelines", list);
}

/* ---- replies ---- */

static void compat_text(http_req_t *r, int status, const char *text) {
  http_reply_raw(r, status, COMPAT_TEXT, text, strlen(text));
}

/* Answers a muster failure as the tracker would: its status, plain text. */
static void compat_fail(http_req_t *r, const fail_t *f) {
  int status = muster_err_http_status(f->code);
  compat_text(r, status ? status : 500, fail_message(f));
}

/* The pipeline of the path, or NULL after a 404 that names the one asked for
 * (when it is a name) and says how many there are, but not their names: the
 * routes are public, and an operator may count on a name not being guessed. */
static const pipeline_t *compat_pipeline(http_req_t *r) {
  const pipeline_t *pipe = compat_find(r->params[0]);
  if (pipe != NULL)
    return pipe;
  char asked[NAME_MAX_LEN + 3] = "of that name", msg[512];
  if (name_is_valid(r->params[0]))
    snprintf(asked, sizeof asked, "'%s'", r->params[0]);
  if (npipelines == 0)
    snprintf(msg, sizeof msg,
             "No DistCompute pipeline %s is exposed by this head: it exposes none (start it "
             "with `muster head --distcompute NAME=QUEUE_A,QUEUE_B,...`).",
             asked);
  else
    snprintf(msg, sizeof msg,
             "No DistCompute pipeline %s is exposed by this head (it exposes %d: the names "
             "given to `muster head --distcompute NAME=...`, which GET /v1/distcompute lists "
             "with the head's token). A client's URL is http://HEAD:PORT" COMPAT_PREFIX "NAME.",
             asked, npipelines);
  compat_text(r, 404, msg);
  return NULL;
}

/* The stage index of query parameter "stage" (a..e), or -1 after a 400. */
static int compat_stage(http_req_t *r, const pipeline_t *pipe) {
  const char *letter = http_query(r, "stage");
  char msg[160];
  if (letter == NULL || strlen(letter) != 1 || letter[0] < 'a' || letter[0] > 'e') {
    snprintf(msg, sizeof msg, "Invalid worker stage: '%.20s'. Choose from 'a'/'b'/'c'/'d'/'e'.",
             letter ? letter : "");
    compat_text(r, 400, msg);
    return -1;
  }
  if (letter[0] - 'a' >= pipe->nstages) {
    snprintf(msg, sizeof msg, "The worker stage '%c' is disabled.", letter[0]);
    compat_text(r, 400, msg);
    return -1;
  }
  return letter[0] - 'a';
}

/* The body's string field `key`, or NULL after a 400. */
static const char *compat_field(http_req_t *r, const char *key) {
  const json_t *value = json_object_get(r->body, key);
  if (!json_is_string(value)) {
    char msg[96];
    snprintf(msg, sizeof msg, "'%s' must be a string.", key);
    compat_text(r, 400, msg);
    return NULL;
  }
  return json_string_value(value);
}

/* ---- workers ---- */

/* Loads the worker of `token` in `pipe`.  MUSTER_WORKER_NOT_FOUND when the
 * token is unknown; w->active is false when the worker is gone. */
static muster_err_t compat_worker_load(store_t *st, const pipeline_t *pipe, const char *token,
                                       dc_worker_t *w, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT c.stage, c.worker, w.timeout_ms, w.state, w.name"
                                   " FROM compat_workers c JOIN workers w ON w.id = c.worker"
                                   " WHERE c.token = ?1 AND c.pipeline = ?2");
  if (s == NULL)
    return store_fail(st, f, "distcompute worker");
  store_bind_text(s, 1, token);
  store_bind_text(s, 2, pipe->name);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    *w = (dc_worker_t){.pipe = pipe,
                       .stage = sqlite3_column_int(s, 0),
                       .worker = sqlite3_column_int64(s, 1),
                       .timeout_ms = sqlite3_column_int64(s, 2),
                       .active = sqlite3_column_int(s, 3) == WORKER_ACTIVE};
  if (rc == SQLITE_ROW)
    snprintf(w->name, sizeof w->name, "%s", (const char *)sqlite3_column_text(s, 4));
  store_reset(s);
  if (rc == SQLITE_ROW && w->stage >= 0 && w->stage < pipe->nstages)
    return MUSTER_OK;
  if (rc == SQLITE_ROW)
    return fail_set(f, MUSTER_WORKER_NOT_FOUND,
                    "%s (Worker '%s' serves stage '%c', which pipeline '%s' no longer has: "
                    "register again with api/new.)",
                    msg_worker_gone, w->name, 'a' + w->stage, pipe->name);
  if (rc == SQLITE_DONE)
    return fail_set(f, MUSTER_WORKER_NOT_FOUND,
                    "%s (No worker of pipeline '%s' has this token: it is not one this head "
                    "gave out, but another pipeline's or head's, or from before the head's data "
                    "was replaced. Register with api/new.)",
                    msg_worker_gone, pipe->name);
  return store_fail(st, f, "distcompute worker");
}

/* Loads the active worker of the body's token into *w; false after a 400 or 404 reply. */
static bool compat_worker(http_req_t *r, const pipeline_t *pipe, dc_worker_t *w) {
  const char *token = compat_field(r, "token");
  if (token == NULL)
    return false;
  fail_t f = {0};
  if (compat_worker_load(r->head->st, pipe, token, w, &f)) {
    compat_fail(r, &f);
    return false;
  }
  if (!w->active) {
    char msg[512];
    snprintf(msg, sizeof msg,
             "%s (Worker '%s' is gone: it said bye, or was silent longer than its timeout of "
             "%lld ms. Register again with api/new.)",
             msg_worker_gone, w->name, (long long)w->timeout_ms);
    compat_text(r, 404, msg);
    return false;
  }
  return true;
}

/* The worker's current lease (task and fencing token); false when it has none.
 * A scan of tasks_leased (all leases; it carries the worker, so only the
 * worker's own rows are read), as lease_end_worker's. */
static bool compat_current(store_t *st, const dc_worker_t *w, int64_t *task, int64_t *token) {
  sqlite3_stmt *s = store_stmt(st, "SELECT id, token FROM tasks INDEXED BY tasks_leased"
                                   " WHERE state = 1 AND worker = ?1 ORDER BY id LIMIT 1");
  if (s == NULL)
    return false;
  sqlite3_bind_int64(s, 1, w->worker);
  bool found = sqlite3_step(s) == SQLITE_ROW;
  if (found) {
    *task = sqlite3_column_int64(s, 0);
    *token = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
  return found;
}

/* Applies a lease operation to the worker's current lease; `extra` (stolen,
 * may be NULL) adds fields to the element.  Returns the reply object (new
 * reference) or NULL with *f filled. */
static json_t *compat_lease_op(http_req_t *r, const dc_worker_t *w, lease_op_t op, json_t *extra,
                               int64_t task, int64_t token, fail_t *f) {
  json_t *elem = json_pack("{s:I, s:I}", "task", (json_int_t)task, "token", (json_int_t)token);
  if (extra)
    json_object_update(elem, extra);
  json_decref(extra);
  json_t *body = json_pack("{s:[o]}", "leases", elem);
  json_t *out = lease_apply(r->head->st, op, body, r->head->cfg.max_payload, f);
  json_decref(body);
  return out;
}

/* Every call of a live worker is a heartbeat (with `progress` when not NULL)
 * and extends its job to the worker's own timeout.  The writes stay even when
 * the call then answers an error (no job), so a polling worker stays alive. */
static muster_err_t compat_touch(http_req_t *r, const dc_worker_t *w, const char *progress,
                                 fail_t *f) {
  json_t *hb = progress ? json_pack("{s:s}", "progress", progress) : json_object();
  json_t *out = worker_heartbeat(r->head->st, w->worker, hb, f);
  json_decref(hb);
  if (out == NULL)
    return f->code;
  json_decref(out);
  int64_t task, token;
  if (compat_current(r->head->st, w, &task, &token)) {
    out =
        compat_lease_op(r, w, LEASE_EXTEND,
                        json_pack("{s:I}", "lease_ms", (json_int_t)w->timeout_ms), task, token, f);
    if (out == NULL)
      return f->code;
    json_decref(out);
  }
  r->keep = true;
  return MUSTER_OK;
}

/* ---- jobs ---- */

/* The tracker's form of a payload: strings as they are, the rest as
 * "<!json!>" + JSON.  Caller frees. */
static char *compat_encode_data(const json_t *payload) {
  if (json_is_string(payload))
    return strndup(json_string_value(payload), json_string_length(payload));
  char *text = jv_encode(payload);
  char *data = NULL;
  if (text && asprintf(&data, COMPAT_JSON_MARK "%s", text) < 0)
    data = NULL;
  free(text);
  return data;
}

/* The muster form of a completed job's data (new reference). */
static json_t *compat_decode_data(const json_t *data) {
  const char *text = json_string_value(data);
  size_t len = json_string_length(data), mark = strlen(COMPAT_JSON_MARK);
  if (len >= mark && strncmp(text, COMPAT_JSON_MARK, mark) == 0) {
    json_t *value = json_loadb(text + mark, len - mark, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (value)
      return value;
  }
  return json_incref((json_t *)data);
}

/* ---- handlers ---- */

/* 32 hex digits from the kernel's random source; false when it failed. */
static bool compat_make_token(char *out, size_t size) {
  unsigned char raw[COMPAT_TOKEN_BYTES];
  if (size < 2 * sizeof raw + 1 || getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return false;
  for (size_t i = 0; i < sizeof raw; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return true;
}

static muster_err_t compat_save_worker(store_t *st, const char *token, const pipeline_t *pipe,
                                       int stage, int64_t worker, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO compat_workers(token, pipeline, stage, worker,"
                                   " created_ms) VALUES(?1, ?2, ?3, ?4, ?5)");
  if (s == NULL)
    return store_fail(st, f, "distcompute worker");
  store_bind_text(s, 1, token);
  store_bind_text(s, 2, pipe->name);
  sqlite3_bind_int(s, 3, stage);
  sqlite3_bind_int64(s, 4, worker);
  sqlite3_bind_int64(s, 5, now_ms());
  return store_step_done(st, s, f);
}

/* When each pipeline's refusal at its cap was last logged (ms). */
static int64_t compat_full_logged_ms[COMPAT_MAX_PIPELINES];

/* True after refusing api/new when `pipe` has its cap of active workers
 * (--distcompute-max-workers; compat_bounds.c says why there is one), or
 * after a 500 when they could not be counted.  503, not 429: the cap is the
 * pipeline's, shared by every client, and no client is asking too often; a
 * slot frees when any worker says bye or times out, so a later try may
 * pass.  Logged once a minute at most: a loop of refusals must not flood
 * the log either. */
static bool compat_full(http_req_t *r, const pipeline_t *pipe) {
  int64_t active = 0, cap = r->head->cfg.distcompute_max_workers, now = now_ms();
  fail_t f = {0};
  if (compat_active_count(r->head->st, pipe->name, &active, &f)) {
    compat_fail(r, &f);
    return true;
  }
  if (active < cap)
    return false;
  char msg[320];
  snprintf(msg, sizeof msg,
           "Pipeline '%s' has %lld active workers, its cap (muster head "
           "--distcompute-max-workers %lld): no new worker until one says bye or times out.",
           pipe->name, (long long)active, (long long)cap);
  int64_t *logged = &compat_full_logged_ms[pipe - pipelines];
  if (*logged == 0 || now - *logged >= 60000) {
    *logged = now;
    log_msg(LOG_WARN, "distcompute api/new refused (logged once a minute at most): %s", msg);
  }
  compat_text(r, 503, msg);
  return true;
}

void compat_h_new(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  int stage = pipe ? compat_stage(r, pipe) : -1;
  if (stage < 0 || compat_full(r, pipe))
    return;
  const char *nickname = http_query(r, "nickname");
  char letter[2] = {(char)('a' + stage), '\0'}, token[2 * COMPAT_TOKEN_BYTES + 1];
  json_t *body = json_pack(
      "{s:s, s:[s], s:{s:s, s:s}}", "nickname", nickname && nickname[0] ? nickname : "anonymous",
      "queues", pipe->queues[stage], "labels", "distcompute", pipe->name, "stage", letter);
  fail_t f = {0};
  json_t *worker = worker_register(r->head->st, body, r->head->cfg.worker_timeout_ms, &f);
  json_decref(body);
  if (worker == NULL) {
    compat_fail(r, &f);
    return;
  }
  int64_t id = json_integer_value(json_object_get(worker, "id"));
  if (!compat_make_token(token, sizeof token))
    fail_set(&f, MUSTER_INTERNAL, "no random token could be made");
  if (f.code == MUSTER_OK && compat_save_worker(r->head->st, token, pipe, stage, id, &f) == 0)
    http_reply_json(r, 200,
                    json_pack("{s:s, s:O, s:s, s:s}", "token", token, "display_name",
                              json_object_get(worker, "name"), "project", pipe->name, "stage_name",
                              pipe->queues[stage]));
  else
    compat_fail(r, &f);
  json_decref(worker);
}

/* Leases one task of the worker's stage and answers {"data", "number"}. */
static void compat_give_job(http_req_t *r, const dc_worker_t *w) {
  fail_t f = {0};
  queue_t q;
  if (queue_load(r->head->st, w->pipe->queues[w->stage], &q, &f)) {
    compat_fail(r, &f);
    return;
  }
  q.lease_ms = w->timeout_ms; /* the job lives as long as its worker */
  json_t *leases = lease_acquire(r->head->st, &q, w->worker, 1, &f);
  json_t *lease = json_array_get(leases, 0);
  char *data = NULL;
  int64_t number = 0;
  if (lease) {
    data = compat_encode_data(json_object_get(lease, "payload"));
    number = compat_job_number(r->head->st, w->pipe->queues[0],
                               json_integer_value(json_object_get(lease, "task")), &f);
  }
  if (leases == NULL || (lease && (data == NULL || number == 0)))
    compat_fail(r, &f);
  else if (lease == NULL)
    compat_text(r, 403,
                "Either there are no new jobs available, or there was an error whilst "
                "finding a job. Keep retrying, as jobs are dynamically created.");
  else
    http_reply_json(r, 200, json_pack("{s:s, s:I}", "data", data, "number", (json_int_t)number));
  free(data);
  json_decref(leases);
}

void compat_h_new_job(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  dc_worker_t w;
  if (pipe == NULL || !compat_worker(r, pipe, &w))
    return;
  fail_t f = {0};
  int64_t task, token;
  /* Like the tracker: a job still held is given back before a new one. */
  if (compat_current(r->head->st, &w, &task, &token)) {
    json_t *out = compat_lease_op(r, &w, LEASE_RELEASE, NULL, task, token, &f);
    if (out == NULL) {
      compat_fail(r, &f);
      return;
    }
    json_decref(out);
  }
  if (compat_touch(r, &w, "Received new job", &f))
    compat_fail(r, &f);
  else
    compat_give_job(r, &w);
}

void compat_h_job_count(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  int stage = pipe ? compat_stage(r, pipe) : -1;
  if (stage < 0)
    return;
  /* The tasks a newJob would get now, as counts.ready of the queue. */
  fail_t f = {0};
  int64_t count = 0;
  if (queue_count_ready(r->head->st, pipe->queues[stage], &count, &f)) {
    compat_fail(r, &f);
    return;
  }
  char text[32];
  snprintf(text, sizeof text, "%lld", (long long)count);
  compat_text(r, 200, text);
}

void compat_h_update_progress(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  dc_worker_t w;
  const char *progress;
  if (pipe == NULL || !compat_worker(r, pipe, &w) ||
      (progress = compat_field(r, "progress")) == NULL)
    return;
  fail_t f = {0};
  if (compat_touch(r, &w, progress, &f))
    compat_fail(r, &f);
  else
    compat_text(r, 200, "200 OK");
}

/* The worker's current job gets `op` (with `extra`, stolen, as the element's
 * other fields), then its progress becomes `progress`.  Without a job: 403
 * with `no_job`, as the tracker answers. */
static void compat_job_op(http_req_t *r, const dc_worker_t *w, lease_op_t op, json_t *extra,
                          const char *no_job, const char *progress) {
  fail_t f = {0};
  int64_t task, token;
  if (!compat_current(r->head->st, w, &task, &token)) {
    json_decref(extra);
    if (compat_touch(r, w, NULL, &f) == MUSTER_OK)
      compat_text(r, 403, no_job);
    else
      compat_fail(r, &f);
    return;
  }
  json_t *out = compat_lease_op(r, w, op, extra, task, token, &f);
  if (out == NULL || compat_touch(r, w, progress, &f))
    compat_fail(r, &f);
  else
    compat_text(r, 200, "200 OK");
  json_decref(out);
}

void compat_h_complete_job(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  dc_worker_t w;
  if (pipe == NULL || !compat_worker(r, pipe, &w) || compat_field(r, "data") == NULL)
    return;
  json_t *result = compat_decode_data(json_object_get(r->body, "data"));
  compat_job_op(r, &w, LEASE_COMPLETE, json_pack("{s:o}", "result", result),
                "You do not have an open job.", "Completed Job");
}

void compat_h_flag_invalid(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  dc_worker_t w;
  if (pipe == NULL || !compat_worker(r, pipe, &w))
    return;
  compat_job_op(r, &w, LEASE_FLAG, json_pack("{s:s}", "reason", "flagged by a DistCompute worker"),
                "This worker is not currently working on a job.", "Flagged invalid data");
}

void compat_h_bye(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  dc_worker_t w;
  if (pipe == NULL || !compat_worker(r, pipe, &w))
    return;
  fail_t f = {0};
  json_t *out = worker_bye(r->head->st, w.worker, &f);
  if (out == NULL)
    compat_fail(r, &f);
  else
    compat_text(r, 200, "200 OK");
  json_decref(out);
}

void compat_h_validate_worker(http_req_t *r) {
  const pipeline_t *pipe = compat_pipeline(r);
  const char *token = pipe ? compat_field(r, "token") : NULL;
  if (token == NULL)
    return;
  fail_t f = {0};
  dc_worker_t w;
  muster_err_t err = compat_worker_load(r->head->st, pipe, token, &w, &f);
  if (err && err != MUSTER_WORKER_NOT_FOUND) {
    compat_fail(r, &f);
    return;
  }
  bool alive = err == MUSTER_OK && w.active;
  if (alive && compat_touch(r, &w, NULL, &f))
    compat_fail(r, &f);
  else
    compat_text(r, 200, alive ? "True" : "False");
}

void compat_h_pipelines(http_req_t *r) {
  http_reply_json(r, 200, compat_pipelines_json());
}

/* The tracker's endpoints, as its client calls them under the URL it is given. */
static const char *const compat_api_names[] = {
    "new", "newJob",         "jobCount", "updateProgress", "completeJob", "flagInvalidData",
    "bye", "validateWorker", NULL};

/* Says once a minute at most, in the head's log, that a DistCompute client
 * calls the head's root: its client shows every failure as a timeout, so the
 * operator reads the cause here.  Event-loop thread only. */
static void compat_log_root_call(http_req_t *r) {
  static int64_t said_ms;
  int64_t now = now_ms();
  if (said_ms && now - said_ms < 60 * 1000)
    return;
  said_ms = now;
  char peer[64] = "a client";
  if (!h1_peer(r->req, peer, sizeof peer))
    snprintf(peer, sizeof peer, "a client");
  log_msg(LOG_WARN,
          "%s called %.200s, a DistCompute endpoint, at the head's root URL: a DistCompute "
          "client's URL is http://HEAD:PORT" COMPAT_PREFIX "NAME, NAME a pipeline given to "
          "--distcompute (this head exposes %d; docs/dashboard.md) (said once a minute at most)",
          peer, h1_path(r->req), npipelines);
}

/* GET or POST /api/{}: a DistCompute client given the head's root URL, not a
 * pipeline's.  The reply says which URL it needs, as plain text as the
 * tracker's replies are; an /api/ path that the tracker lacks gets a JSON
 * 404 that says which names this route answers. */
void compat_h_root_api(http_req_t *r) {
  bool known = false;
  for (int i = 0; compat_api_names[i] && !known; i++)
    known = strcmp(r->params[0], compat_api_names[i]) == 0;
  if (!known) {
    fail_t f = {0};
    fail_set(&f, MUSTER_NOT_FOUND,
             "/api/%.100s is not a DistCompute tracker endpoint: the head answers /api/NAME "
             "only for the tracker's (new, newJob, jobCount, updateProgress, completeJob, "
             "flagInvalidData, bye, validateWorker), to tell a client the URL it needs; "
             "muster's own API is under /v1/ (docs/api.md)",
             r->params[0]);
    http_reply_fail(r, &f);
    return;
  }
  compat_log_root_call(r);
  char msg[512];
  snprintf(msg, sizeof msg,
           "This is a muster head's root URL, not a DistCompute pipeline's. A DistCompute "
           "client's URL is http://HEAD:PORT" COMPAT_PREFIX "NAME, where NAME is a pipeline "
           "given to `muster head --distcompute NAME=QUEUE_A,QUEUE_B,...` (this head exposes "
           "%d).",
           npipelines);
  compat_text(r, 404, msg);
}
