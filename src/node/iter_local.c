/*
 * iter_local.c — node-local iterations on the agent's port (cluster_sync: false).
 *
 * Lavender Data's `cluster_sync: false` keeps an iteration's state on the node
 * the client talks to, so that each sample is consumed once per node (node-local
 * shard files, each node iterating its own copy).  The agent keeps such
 * iterations in a SQLite store of its own (STATE_DIR/iterations.db, the head's
 * migrations) and runs the head's iteration domain code on it (src/server/iter*.c
 * on a store_t: create or join, next, ack, heartbeat, status, checkpoint,
 * held blocks, delete, the expiry sweep); only the HTTP layer here is the agent's.
 *
 * Routing (everything else goes to the head, forward.c):
 *  - POST /v1/iterations with `cluster_sync: false` is created here.  With
 *    `cluster_sync` omitted the agent resolves Lavender's default: `true` when
 *    the head knows more than one active node (GET /v1/nodes, with the client's
 *    token), else `false`.  `true` goes to the head.  A name this agent already
 *    holds is always answered here (a join; `true` is then refused, naming
 *    this agent), so one name never lives in both places for a client of this
 *    agent; for the same reason a new local iteration is refused when the
 *    head holds its name (asked with GET /v1/iterations/NAME; a head that does
 *    not answer does not stop it).
 *  - /v1/iterations/{name}[/next|/ack|/heartbeat|/checkpoint|/held] for a
 *    name held here is answered here (HEAD as GET).
 *  - GET /v1/iterations: the head's list with this agent's iterations merged in.
 *
 * Tokens: the agent serves a request that carries its own token (--token,
 * the head's admin token), compared in constant time, or any when it has
 * none.  With another token a read (GET) is served when the head accepts
 * that token for a GET of this node (its read-only token); a write, and a
 * read the head refuses, go to the head, which answers 401 or 403 in its
 * own words, as it does for iterations it holds itself.
 *
 * Writes commit per request (synchronous=NORMAL: the state survives the
 * agent's crash; a machine crash may lose the last few acknowledgements, whose
 * blocks are then handed out again).  The store file is created with the first
 * local iteration; an agent restarted on an existing one continues its
 * iterations.  A sweep timer expires block leases and silent ranks as the
 * head's sweep does.
 */
#include "node/iter_local.h"

#include "core/names.h"
#include "core/utf8.h"
#include "server/iter.h"
#include "server/jw.h"
#include "server/log.h"
#include "server/store.h"
#include "server/walvfs.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h> /* evhttp_parse_query_str's pairs */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define IL_SWEEP_MS 100
#define IL_DB_NAME "iterations.db"
#define IL_LOCK_NAME "agent.lock"

typedef struct iter_local {
  node_agent_t *a;
  char dir[400];
  char path[420];
  store_t *st; /* NULL until the first local iteration (or an existing file) */
  int lock_fd; /* STATE_DIR/agent.lock, held (flock) once the store is open; -1 before */
  struct event *sweep;
  /* A full disk (il_note_disk): walvfs's count of writes that found no room,
   * as last seen; whether the disk is known to be full, and how many requests
   * were refused since it was found so. */
  uint64_t full_seen;
  bool full;
  int64_t full_refused;
} iter_local_t;

typedef enum {
  IL_NONE,
  IL_CREATE,
  IL_LIST,
  IL_GET,
  IL_DELETE,
  IL_NEXT,
  IL_ACK,
  IL_HEARTBEAT,
  IL_CHECKPOINT,
  IL_HELD
} il_op_t;

/* ---- replies ------------------------------------------------------------------ */

/* Sends `body` (taken) with `status`, written as the head writes its
 * replies (port_reply_json: the domain code's replies may carry raw nodes, a
 * `next` reply's blocks and indices, server/jw.h). */
static void il_send(node_agent_t *a, h1_req_t *in, int status, json_t *body) {
  char via[160];
  snprintf(via, sizeof via, "1.1 %s (muster node iterations)", a->name);
  h1_add_header(in, "Via", via);
  port_reply_json(in, status, body);
}

static void il_fail(node_agent_t *a, h1_req_t *in, const fail_t *f) {
  muster_err_t code = f->code ? f->code : MUSTER_INTERNAL;
  int status = muster_err_http_status(code);
  il_send(a, in, status ? status : 500,
          json_pack("{s:{s:s, s:s}}", "error", "code", muster_err_name(code), "message",
                    fail_message(f)));
}

/* ---- requests ----------------------------------------------------------------- */

/* Which iteration request `in` is; `name` gets the {name} segment. */
static il_op_t il_route(h1_req_t *in, char name[NAME_MAX_LEN + 1]) {
  const char *path = h1_path(in), *method = h1_method(in);
  /* HEAD is a GET whose body h1 leaves out, as the head's routes take it:
   * sent on to the head, a node-local name would read 404 there. */
  int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  int post = strcmp(method, "POST") == 0;
  static const char prefix[] = "/v1/iterations";
  name[0] = '\0';
  if (strncmp(path, prefix, sizeof prefix - 1) != 0)
    return IL_NONE;
  const char *p = path + sizeof prefix - 1;
  if (*p == '\0')
    return post ? IL_CREATE : get ? IL_LIST : IL_NONE;
  if (*p++ != '/')
    return IL_NONE;
  size_t len = strcspn(p, "/");
  if (len == 0 || len > NAME_MAX_LEN)
    return IL_NONE;
  memcpy(name, p, len);
  name[len] = '\0';
  if (!name_was_valid(name)) /* an escaped name is never one of ours */
    return IL_NONE;
  const char *rest = p + len;
  if (*rest == '\0')
    return get ? IL_GET : strcmp(method, "DELETE") == 0 ? IL_DELETE : IL_NONE;
  if (post && strcmp(rest, "/next") == 0)
    return IL_NEXT;
  if (post && strcmp(rest, "/ack") == 0)
    return IL_ACK;
  if (post && strcmp(rest, "/heartbeat") == 0)
    return IL_HEARTBEAT;
  if (get && strcmp(rest, "/checkpoint") == 0)
    return IL_CHECKPOINT;
  if (get && strcmp(rest, "/held") == 0)
    return IL_HELD;
  return IL_NONE;
}

/* The request's JSON object body ({} when empty), or NULL with *f filled. */
static json_t *il_body(h1_req_t *in, fail_t *f) {
  struct evbuffer *buf = port_body(in);
  size_t len = buf ? evbuffer_get_length(buf) : 0;
  if (len == 0)
    return json_object();
  const char *type = h1_header(in, "Content-Type");
  if (type && strncasecmp(type, "application/json", 16) != 0) {
    fail_set(f, MUSTER_UNSUPPORTED_MEDIA,
             "Content-Type is '%.100s'; send the body as application/json", type);
    return NULL;
  }
  json_error_t err;
  json_t *body = json_loadb((const char *)evbuffer_pullup(buf, -1), len,
                            JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
  if (body == NULL) {
    fail_set(f, MUSTER_BAD_JSON, "the body is not valid JSON: %s (line %d, column %d)", err.text,
             err.line, err.column);
    return NULL;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    fail_set(f, MUSTER_BAD_JSON, "the body must be a JSON object");
    return NULL;
  }
  return body;
}

/* The request's query as an object of decoded strings ({} without one), or
 * NULL with *f filled.  A key given twice keeps its first value, as the
 * head's http_query finds it.  A byte that decodes to no UTF-8 (%FF) reads
 * '?', as in the head's messages: a JSON string cannot hold it, and a value
 * dropped for it would be refused as missing rather than as what it is. */
static json_t *il_query(h1_req_t *in, fail_t *f) {
  const char *query = h1_query(in);
  struct evkeyvalq params = {0}; /* empty; evhttp_parse_query_str initializes it too */
  if (query && evhttp_parse_query_str(query, &params) != 0) {
    evhttp_clear_headers(&params);
    fail_set(f, MUSTER_BAD_REQUEST, "a query parameter has no value; write key=value");
    return NULL;
  }
  json_t *obj = json_object();
  for (struct evkeyval *kv = params.tqh_first; obj && kv; kv = kv->next.tqe_next)
    if (json_object_get(obj, utf8_scrub(kv->key)) == NULL)
      json_object_set_new(obj, kv->key, json_string(utf8_scrub(kv->value)));
  evhttp_clear_headers(&params);
  if (obj == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  return obj;
}

/* A member of the object il_query made, as an iter_query_fn. */
static const char *il_query_get(void *ctx, const char *key) {
  return json_string_value(json_object_get(ctx, key));
}

/* GET .../held: `query` is il_query's object. */
static json_t *il_held(store_t *st, const char *name, const json_t *query, fail_t *f) {
  iter_held_query_t q;
  if (iter_held_query(il_query_get, (void *)query, &q, f))
    return NULL;
  return iter_held(st, name, &q, f);
}

/* ---- the store ---------------------------------------------------------------- */

/* mkdir -p; 0 or -1 with errno. */
static int il_mkdirs(const char *dir) {
  char path[400];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return -1;
      *p = '/';
    }
  return mkdir(path, 0700) != 0 && errno != EEXIST ? -1 : 0;
}

/*
 * Takes STATE_DIR/agent.lock (flock) for the agent's life and writes who
 * holds it.  Two agents on one state dir would each run the other's
 * iterations as their own, and SQLite refuses one's writes at random
 * ("database is locked"), so the second is refused, naming the first.
 * 0, or -1 with *f filled.
 */
static int il_lock(iter_local_t *L, fail_t *f) {
  char path[sizeof L->dir + sizeof IL_LOCK_NAME + 1], holder[160];
  snprintf(path, sizeof path, "%s/" IL_LOCK_NAME, L->dir);
  int fd = node_dir_lock_take(path, holder, sizeof holder);
  if (fd == NODE_LOCK_BUSY) {
    fail_set(f, MUSTER_STORE,
             "node agent %s: its state dir %s is in use by another node agent (%s): two agents "
             "cannot share one; give each its own --state-dir (the default, "
             "/var/tmp/muster-node-NAME/state, is one per node name)",
             L->a->name, L->dir, holder);
    return -1;
  }
  if (fd < 0) {
    fail_set(f, MUSTER_STORE, "node agent %s: cannot open %s: %s", L->a->name, path,
             strerror(errno));
    return -1;
  }
  if (!node_dir_lock_note(fd, L->a->name))
    agent_log(L->a, "cannot write who holds %s (it is held all the same)", path);
  L->lock_fd = fd;
  return 0;
}

/* The store, opened (and created) on first use; NULL with *f filled. */
static store_t *il_store(iter_local_t *L, fail_t *f) {
  if (L->st)
    return L->st;
  if (il_mkdirs(L->dir) != 0) {
    fail_set(f, MUSTER_STORE, "node agent %s: cannot create its state dir %s: %s", L->a->name,
             L->dir, strerror(errno));
    return NULL;
  }
  if (L->lock_fd < 0 && il_lock(L, f) != 0)
    return NULL;
  char owner[NAME_MAX_LEN + 16];
  snprintf(owner, sizeof owner, "node agent %s", L->a->name);
  store_opts_t opts = {
      .path = L->path, .sync_full = false, .owner = owner, .owner_says_room = true};
  L->st = store_open(&opts, f);
  if (L->st)
    agent_log(L->a, "node-local iterations in %s", L->path);
  return L->st;
}

/* True when this agent holds iteration `name`. */
static int il_holds(iter_local_t *L, const char *name) {
  if (L->st == NULL)
    return 0;
  sqlite3_stmt *s = store_stmt(L->st, "SELECT 1 FROM iterations WHERE name = ?1");
  if (s == NULL)
    return 0;
  store_bind_text(s, 1, name);
  int found = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return found;
}

/* The domain call of `op` (in the open transaction): its reply, or NULL with
 * *f filled; *created for a new iteration. */
static json_t *il_call(store_t *st, il_op_t op, const char *name, const json_t *body, bool *created,
                       fail_t *f) {
  switch (op) {
  case IL_CREATE:
    return iter_create(st, body, created, f);
  case IL_GET:
    return iter_get(st, name, f);
  case IL_DELETE:
    return iter_delete(st, name, f);
  case IL_NEXT:
    return iter_next(st, name, body, f);
  case IL_ACK:
    return iter_ack(st, name, body, f);
  case IL_HEARTBEAT:
    return iter_heartbeat(st, name, body, f);
  case IL_CHECKPOINT:
    return iter_checkpoint(st, name, f);
  case IL_HELD:
    return il_held(st, name, body, f);
  default:
    fail_set(f, MUSTER_INTERNAL, "no such iteration request");
    return NULL;
  }
}

/*
 * Notes what a request (or the sweep) that just ended says of the state
 * dir's disk, and returns true when it found the disk full (the caller
 * counts the requests so refused).  A write that
 * found no room (walvfs counts them; the store's message says so where its
 * own VFS is not in use) marks the disk full: the store logs that, at most
 * every 10 s.  The first request after that whose writes were committed
 * (`committed`, with rows changed since `changes_before`) says, once, that
 * there is room again, with how many were refused meanwhile.
 */
static bool il_note_disk(iter_local_t *L, bool committed, int64_t changes_before, const fail_t *f) {
  walvfs_stats_t w;
  walvfs_stats(&w);
  bool full = w.full != L->full_seen ||
              (!committed && f->code == MUSTER_STORE && strstr(fail_message(f), " is full: "));
  L->full_seen = w.full;
  if (full) {
    L->full = true;
    return true;
  }
  if (L->full && committed && store_changes(L->st) != changes_before) {
    char refused[64] = "";
    if (L->full_refused > 0)
      snprintf(refused, sizeof refused, " (%lld refused while it was full)",
               (long long)L->full_refused);
    agent_log(L->a,
              "iterations: the disk holding %s has room again: requests that write are taken "
              "again%s",
              L->path, refused);
    L->full = false;
    L->full_refused = 0;
  }
  return false;
}

/* Runs one domain call in its own transaction and answers.  `body` is the
 * request's body, or its query for IL_HELD. */
static void il_run(iter_local_t *L, h1_req_t *in, il_op_t op, const char *name,
                   const json_t *body) {
  fail_t f = {0};
  json_t *out = NULL;
  bool created = false;
  store_t *st = il_store(L, &f);
  if (st && store_request_begin(st, &f) == MUSTER_OK) {
    int64_t changes = store_changes(st);
    out = il_call(st, op, name, body, &created, &f);
    store_request_end(st, out != NULL);
    fail_t cf = {0};
    if (store_commit(st, &cf) != MUSTER_OK && out) {
      json_decref(out);
      out = NULL;
      f = cf;
    }
    L->full_refused += il_note_disk(L, out != NULL, changes, &f);
  }
  if (out)
    il_send(L->a, in, created ? 201 : 200, out);
  else
    il_fail(L->a, in, &f);
}

/* ---- asking the head ------------------------------------------------------------ */

typedef struct il_ask il_ask_t;
/* The head's answer: status 0 when it could not be reached; `reply` parsed JSON or NULL. */
typedef void (*il_ask_fn)(il_ask_t *q, int status, json_t *reply);

struct il_ask {
  iter_local_t *L;
  h1_req_t *in;              /* the client's request */
  json_t *body;              /* its parsed body (create), or NULL */
  fwd_conn_t *conn;
  il_ask_fn done;
};

static void il_ask_on_done(struct evhttp_request *out, void *arg) {
  il_ask_t *q = arg;
  node_agent_t *a = q->L->a;
  int status = out ? evhttp_request_get_response_code(out) : 0;
  json_t *reply = NULL;
  if (status != 0) {
    struct evbuffer *buf = evhttp_request_get_input_buffer(out);
    size_t len = evbuffer_get_length(buf);
    if (len > 0)
      reply = json_loadb((const char *)evbuffer_pullup(buf, -1), len, 0, NULL);
  }
  fwd_conn_put(a, q->conn);
  q->done(q, status, reply);
  json_decref(reply);
  json_decref(q->body);
  free(q);
}

/* The forwarder's word that the agent stops with the question in flight
 * (fwd_cancel_fn): the client gets the stop's 503. */
static void il_ask_on_stop(void *owner) {
  il_ask_t *q = owner;
  port_reply_stopping(q->L->a, q->in);
  json_decref(q->body);
  free(q);
}

/* GETs `path` (NULL: the client's own path and query) from the head with the
 * client's Authorization; `done` follows.  Takes `body`.  On failure to
 * start, forwards the client's request. */
static void il_ask(iter_local_t *L, h1_req_t *in, json_t *body, const char *path, il_ask_fn done) {
  node_agent_t *a = L->a;
  il_ask_t *q = calloc(1, sizeof *q);
  fwd_conn_t *conn = q ? fwd_conn_get(a) : NULL;
  struct evhttp_request *out = conn ? evhttp_request_new(il_ask_on_done, q) : NULL;
  if (out == NULL) {
    if (conn)
      fwd_conn_put(a, conn);
    free(q);
    json_decref(body);
    fwd_forward(a, in);
    return;
  }
  *q = (il_ask_t){.L = L, .in = in, .body = body, .conn = conn, .done = done};
  fwd_conn_set_owner(conn, il_ask_on_stop, q);
  struct evkeyvalq *h = evhttp_request_get_output_headers(out);
  const char *auth = h1_header(in, "Authorization");
  if (auth)
    evhttp_add_header(h, "Authorization", auth);
  fwd_add_host(a, h);
  char *target = path ? NULL : fwd_target(in);
  /* On failure evhttp_make_request has already called il_ask_on_done (NULL). */
  evhttp_make_request(fwd_conn_evcon(conn), out, EVHTTP_REQ_GET, path ? path : target);
  free(target);
}

/* GET /v1/iterations/NAME answered, before this agent makes a node-local
 * iteration NAME: one the head holds (200) would be hidden from this agent's
 * clients by it, its ranks here reading the node-local one from their next
 * call on, so the create is refused.  Any other answer, no answer included
 * (node-local iterations go on while the head is away), creates it. */
static void il_on_head_name(il_ask_t *q, int status, json_t *reply) {
  (void)reply;
  iter_local_t *L = q->L;
  const char *name = json_string_value(json_object_get(q->body, "name"));
  if (status != 200) {
    il_run(L, q->in, IL_CREATE, NULL, q->body);
    return;
  }
  fail_t f = {0};
  fail_set(&f, MUSTER_INVALID_STATE,
           "iteration '%s' exists on the head (cluster_sync true); a node-local one of that name "
           "on node agent %s would hide it from this agent's clients (their next, ack and status "
           "would reach the node-local one): pick another name, or join the head's with "
           "cluster_sync true",
           name, L->a->name);
  il_fail(L->a, q->in, &f);
}

/* Creates (or joins) the node-local iteration of `body` (taken, its
 * cluster_sync false): a name held here is joined at once; a new one is
 * first looked up on the head (il_on_head_name). */
static void il_create_local(iter_local_t *L, h1_req_t *in, json_t *body) {
  const char *name = json_string_value(json_object_get(body, "name"));
  if (name == NULL || !name_is_valid(name) || il_holds(L, name)) {
    il_run(L, in, IL_CREATE, NULL, body); /* a join, or a name iter_create refuses */
    json_decref(body);
    return;
  }
  char path[sizeof "/v1/iterations/" + NAME_MAX_LEN];
  snprintf(path, sizeof path, "/v1/iterations/%s", name);
  il_ask(L, in, body, path, il_on_head_name);
}

/* GET /v1/nodes answered: resolve an omitted cluster_sync and create. */
static void il_on_nodes(il_ask_t *q, int status, json_t *reply) {
  iter_local_t *L = q->L;
  if (status == 0) { /* the default is the head's to decide: say how to do without it */
    fail_t f = {0};
    fail_set(&f, MUSTER_UNAVAILABLE,
             "node agent %s cannot reach the head, which decides an omitted cluster_sync (true "
             "when it knows more than one active node): send cluster_sync false to create the "
             "iteration on this node now, or retry once the head is back",
             L->a->name);
    il_fail(L->a, q->in, &f);
    return;
  }
  if (status != 200) { /* the head's own answer to the create says it best */
    fwd_forward(L->a, q->in);
    return;
  }
  size_t active = 0, i;
  json_t *node;
  json_array_foreach(json_object_get(reply, "nodes"), i, node) {
    const char *state = json_string_value(json_object_get(node, "state"));
    active += state && strcmp(state, "active") == 0;
  }
  if (active > 1) {
    fwd_forward(L->a, q->in); /* a cluster: state on the head (its default) */
    return;
  }
  json_object_set_new(q->body, "cluster_sync", json_false());
  il_create_local(L, q->in, json_incref(q->body));
}

static int il_by_name(const void *x, const void *y) {
  const char *a = json_string_value(json_object_get(*(json_t *const *)x, "name"));
  const char *b = json_string_value(json_object_get(*(json_t *const *)y, "name"));
  return strcmp(a ? a : "", b ? b : "");
}

/* GET /v1/iterations answered by the head: add ours. */
static void il_on_list(il_ask_t *q, int status, json_t *reply) {
  iter_local_t *L = q->L;
  json_t *theirs = json_object_get(reply, "iterations");
  if (status != 200 || !json_is_array(theirs)) {
    fwd_forward(L->a, q->in);
    return;
  }
  fail_t f = {0};
  json_t *ours = L->st ? iter_list(L->st, &f) : json_pack("{s:[]}", "iterations");
  if (ours == NULL) {
    il_fail(L->a, q->in, &f);
    return;
  }
  json_t *all = json_array(), *one;
  size_t i, n = 0;
  json_array_foreach(theirs, i, one) json_array_append(all, one);
  json_array_foreach(json_object_get(ours, "iterations"), i, one) json_array_append(all, one);
  n = json_array_size(all);
  json_t **items = malloc((n ? n : 1) * sizeof *items);
  if (items) {
    for (i = 0; i < n; i++)
      items[i] = json_incref(json_array_get(all, i));
    qsort(items, n, sizeof *items, il_by_name);
    json_array_clear(all);
    for (i = 0; i < n; i++)
      json_array_append_new(all, items[i]);
    free(items);
  }
  json_decref(ours);
  il_send(L->a, q->in, 200, json_pack("{s:o}", "iterations", all));
}

/* ---- the entry points ------------------------------------------------------------- */

/* A create with cluster_sync true of a name held here: this agent answers
 * every request for the name itself, so the head's iteration could not be
 * reached through it.  The domain code would only say "another cluster_sync"
 * (or first a configuration that differs), not where the name lives. */
static void il_refuse_sync_true(iter_local_t *L, h1_req_t *in, const char *name) {
  fail_t f = {0};
  fail_set(&f, MUSTER_INVALID_STATE,
           "iteration '%s' lives on this node agent, %s (cluster_sync false), which answers every "
           "request for that name itself, so a cluster_sync true one of that name cannot be "
           "reached through it: give the cluster-wide iteration another name, or remove the "
           "node-local one first (DELETE /v1/iterations/%s through this agent)",
           name, L->a->name, name);
  il_fail(L->a, in, &f);
}

static void il_create(iter_local_t *L, h1_req_t *in) {
  fail_t f = {0};
  json_t *body = il_body(in, &f);
  if (body == NULL) {
    fwd_forward(L->a, in); /* the head refuses it in its own words */
    return;
  }
  const char *name = json_string_value(json_object_get(body, "name"));
  const json_t *sync = json_object_get(body, "cluster_sync");
  int omitted = sync == NULL || json_is_null(sync);
  int held = name && name_was_valid(name) && il_holds(L, name);
  if (!held && !json_is_false(sync) && !omitted) {
    json_decref(body);
    fwd_forward(L->a, in); /* cluster_sync true (or not a boolean): the head's */
    return;
  }
  if (!port_token_is_agents(L->a, in)) {
    json_decref(body);
    fwd_forward(L->a, in); /* the head refuses it in its own words (401, 403) */
    return;
  }
  if (held && json_is_true(sync)) {
    il_refuse_sync_true(L, in, name);
    json_decref(body);
    return;
  }
  if (held || json_is_false(sync)) {
    if (omitted)
      json_object_set_new(body, "cluster_sync", json_false());
    il_create_local(L, in, body);
    return;
  }
  il_ask(L, in, body, "/v1/nodes", il_on_nodes); /* omitted: Lavender's default */
}

/* What operation `op` reads of the request: its body, its query for
 * IL_HELD, NULL for one that reads neither.  NULL with *f set when the
 * request is refused: a bad body, or a field in a DELETE's, which takes none
 * (docs/api.md, "Unknown fields are refused"), as the head refuses it. */
static json_t *il_request_body(il_op_t op, h1_req_t *in, fail_t *f) {
  if (op == IL_HELD)
    return il_query(in, f);
  if (op != IL_NEXT && op != IL_ACK && op != IL_HEARTBEAT && op != IL_DELETE)
    return NULL;
  json_t *body = il_body(in, f);
  const char *key = body && op == IL_DELETE ? json_object_iter_key(json_object_iter(body)) : NULL;
  if (key) {
    fail_set(f, MUSTER_INVALID,
             "%.100s: unknown field; this endpoint takes no body (send none, or {})", key);
    json_decref(body);
    return NULL;
  }
  return body;
}

/* Serves `op` on iteration `name`, held here, to a client whose token may. */
static void il_serve(iter_local_t *L, h1_req_t *in, il_op_t op, const char *name) {
  fail_t f = {0};
  json_t *body = il_request_body(op, in, &f);
  if (f.code) {
    il_fail(L->a, in, &f);
    return;
  }
  il_run(L, in, op, name, body);
  json_decref(body);
}

/* The head's answer to GET /v1/nodes/NAME with the client's token, asked for
 * a read with a token other than the agent's: any answer past the head's
 * token check (200; 404 before this node registered) means the token may
 * read (the head's read-only one), and the read is served here.  A refusal
 * (401), or no answer, sends the request itself to the head, whose answer
 * says what is wrong in its own words. */
static void il_on_token(il_ask_t *q, int status, json_t *reply) {
  (void)reply;
  char name[NAME_MAX_LEN + 1];
  il_op_t op = il_route(q->in, name);
  if ((status == 200 || status == 404) && il_holds(q->L, name))
    il_serve(q->L, q->in, op, name);
  else
    fwd_forward(q->L->a, q->in);
}

bool iter_local_serves(const node_agent_t *a, h1_req_t *in) {
  char name[NAME_MAX_LEN + 1];
  return a->iters != NULL && il_route(in, name) != IL_NONE;
}

int iter_local_handle(node_agent_t *a, h1_req_t *in) {
  iter_local_t *L = a->iters;
  char name[NAME_MAX_LEN + 1];
  il_op_t op = L ? il_route(in, name) : IL_NONE;
  if (op == IL_NONE)
    return 0;
  if (op == IL_CREATE) {
    il_create(L, in);
    return 1;
  }
  if (op == IL_LIST) {
    if (L->st == NULL)
      return 0;
    il_ask(L, in, NULL, NULL, il_on_list); /* the client's path and query */
    return 1;
  }
  if (!il_holds(L, name))
    return 0;
  if (port_token_is_agents(a, in)) {
    il_serve(L, in, op, name);
  } else if (op == IL_GET || op == IL_CHECKPOINT || op == IL_HELD) {
    char path[200]; /* the head judges the token, as it does for the cache's statistics */
    snprintf(path, sizeof path, "/v1/nodes/%s", a->name);
    il_ask(L, in, NULL, path, il_on_token);
  } else {
    fwd_forward(a, in); /* a write: the head refuses it, 403 for its read-only token */
  }
  return 1;
}

/* ---- life ---------------------------------------------------------------------------- */

/* Expires block leases and silent ranks, as the head's sweep does. */
static void il_on_sweep(evutil_socket_t fd, short what, void *arg) {
  iter_local_t *L = arg;
  fail_t f = {0};
  int64_t now = now_ms();
  if (L->st == NULL || !iter_any_due(L->st, now) || store_request_begin(L->st, &f))
    return;
  int64_t changes = store_changes(L->st);
  bool ok = iter_expire_due(L->st, now) >= 0;
  store_request_end(L->st, ok);
  bool committed = store_commit(L->st, &f) == MUSTER_OK;
  /* A full disk is the store's to say (once in 10 s), not every 100 ms here. */
  if (!il_note_disk(L, ok && committed, changes, &f) && !committed)
    agent_log(L->a, "iterations: sweep: %s", fail_message(&f));
}

int iter_local_start(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  iter_local_t *L = calloc(1, sizeof *L);
  if (L == NULL)
    return -1;
  L->a = a;
  L->lock_fd = -1;
  char cwd[300];
  if (cfg->state_dir && cfg->state_dir[0] != '/' && getcwd(cwd, sizeof cwd) != NULL)
    snprintf(L->dir, sizeof L->dir, "%s/%s", cwd, cfg->state_dir);
  else if (cfg->state_dir)
    snprintf(L->dir, sizeof L->dir, "%s", cfg->state_dir);
  else
    snprintf(L->dir, sizeof L->dir, "/var/tmp/muster-node-%s/state", a->name);
  snprintf(L->path, sizeof L->path, "%s/" IL_DB_NAME, L->dir);
  a->iters = L;
  iter_set_node(a->name);
  if (access(L->path, F_OK) == 0) { /* a restarted agent continues its iterations */
    fail_t f = {0};
    if (il_store(L, &f) == NULL) {
      agent_log(a, "%s", fail_message(&f));
      return -1;
    }
  }
  struct timeval tv = {0, IL_SWEEP_MS * 1000};
  L->sweep = event_new(a->base, -1, EV_PERSIST, il_on_sweep, L);
  if (L->sweep == NULL || event_add(L->sweep, &tv) != 0) {
    agent_log(a, "cannot start the iterations' sweep");
    return -1;
  }
  return 0;
}

void iter_local_stop(node_agent_t *a) {
  iter_local_t *L = a->iters;
  if (L == NULL)
    return;
  if (L->sweep)
    event_free(L->sweep);
  if (L->st) {
    fail_t f = {0};
    store_commit(L->st, &f);
    store_close(L->st);
  }
  if (L->lock_fd >= 0)
    close(L->lock_fd); /* after the store: the next agent finds it closed */
  free(L);
  a->iters = NULL;
}
