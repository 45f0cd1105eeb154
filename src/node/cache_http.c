/*
 * cache_http.c — the node cache on the agent's port (docs/api.md "Node cache").
 *
 * GET /v1/shared/{scope}/{name}[?level=N]: the agent first asks the head with a
 * HEAD of the same path, carrying the client's Authorization.  The head stays
 * the authority: it checks the token, resolves "newest" to a level, says
 * whether the level still exists (not expired, not deleted) and gives its size
 * and checksum (ETag).  Then the bytes come from the cache: a hit is sent from
 * its file (h1_respond_file: sendfile, never the whole level in memory);
 * a miss joins the level's fetch, or starts it, so however many clients ask at
 * once the head sends the level once.  The fetch (cache_fetch.c) runs on a
 * thread of its own into a temporary file, is checked against size and
 * checksum and renamed into place (cache.c); readers of the bytes get them
 * as they arrive, less the last byte until the level is verified, workers
 * asking for the file's path get it then.  A HEAD that is not 200
 * sends the client's request on to the head unchanged (forward.c), so errors
 * read exactly as the head's (a worker's path request gets the head's error
 * from a GET of the same path).  The one round trip per read is the price of
 * never serving a level that was deleted, expired or re-created; the bytes,
 * which are what costs, cross the network once per level.
 *
 * GET /v1/node/cache/{scope}/{name}[?level=N] is the same with a JSON answer
 * naming the cached file instead of its bytes, for the agent's own workers,
 * which hard-link the file (same machine, no copy; cli/worker_shared.c).
 * GET /v1/node/cache: the statistics.  A HEAD the head answers 404 (the
 * level expired or was deleted) removes the cached files it names at once;
 * cache_expire.c asks about cached levels nobody reads once they expire.
 *
 * Everything but the fetch threads runs on the agent's event-loop thread.
 */
#include "node/cache_http_internal.h"
#include "core/auth.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- replies ------------------------------------------------------------------ */

void creq_free(creq_t *r) {
  free(r->auth);
  free(r);
}

/* Answers with the error envelope and frees the request. */
void creq_error(creq_t *r, int status, const char *code, const char *fmt, ...) {
  char message[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  port_reply_error(r->in, status, code, "%s", message);
  creq_free(r);
}

void creq_stopping(creq_t *r) {
  port_reply_stopping(r->a, r->in);
  creq_free(r);
}

/* The reader `arg` (a creader_t) ends: its reply was freed. */
static void creader_done(void *arg) {
  creader_t *rd = arg;
  cache_reader_end(rd->cache, rd->entry);
  free(rd);
}

void creader_add(creq_t *r, cache_entry_t *e) {
  creader_t *rd = calloc(1, sizeof *rd);
  if (rd == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  *rd = (creader_t){.cache = r->a->cache, .entry = e};
  cache_reader_begin(rd->cache, e);
  port_on_free(r->in, creader_done, rd);
}

/* The headers every shared-data answer carries. */
void creq_add_headers(creq_t *r, const char *how) {
  char value[64];
  snprintf(value, sizeof value, "\"%016" PRIx64 "\"", r->checksum);
  h1_add_header(r->in, "ETag", value);
  snprintf(value, sizeof value, "%" PRId64, r->level);
  h1_add_header(r->in, "X-Muster-Level", value);
  if (r->expires[0])
    h1_add_header(r->in, "X-Muster-Expires-Ms", r->expires);
  h1_add_header(r->in, "X-Muster-Cache", how);
  char via[160];
  snprintf(via, sizeof via, "1.1 %s (muster node cache)", r->a->name);
  h1_add_header(r->in, "Via", via);
}

/* Sends the level's bytes from `fd` (taken) with sendfile, its entry
 * counted as read until the reply is done, and frees the request. */
static void creq_send_file(creq_t *r, cache_entry_t *e, int fd, const char *how) {
  CACHE_COUNT(r->a->cache, bytes_served, e->size);
  creq_add_headers(r, how);
  creader_add(r, e);
  h1_respond_file(r->in, 200, "application/octet-stream", fd, e->size);
  creq_free(r);
}

/* Answers a worker's /v1/node/cache/{scope}/{name} with the file's path. */
static void creq_send_path(creq_t *r, cache_entry_t *e, const char *how) {
  char links[600], checksum[20];
  cache_t *c = r->a->cache;
  if (cache_links_dir(c, links, sizeof links) != 0)
    links[0] = '\0';
  snprintf(checksum, sizeof checksum, "%016" PRIx64, e->checksum);
  json_t *body =
      json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:s}", "scope", e->scope, "name", e->name,
                "level", (json_int_t)e->level, "size", (json_int_t)e->size, "checksum", checksum,
                "path", cache_file_path(c, e), "links_dir", links, "cache", how);
  if (body && r->expires[0])
    json_object_set_new(body, "expires_ms", json_integer(strtoll(r->expires, NULL, 10)));
  creq_add_headers(r, how);
  port_reply_json(r->in, 200, body);
  creq_free(r);
}

void creq_send_uncached(creq_t *r, const char *reason) {
  char checksum[20];
  snprintf(checksum, sizeof checksum, "%016" PRIx64, r->checksum);
  json_t *body =
      json_pack("{s:s, s:s, s:I, s:I, s:s, s:n, s:n, s:s, s:s}", "scope", r->scope, "name", r->name,
                "level", (json_int_t)r->level, "size", (json_int_t)r->size, "checksum", checksum,
                "path", "links_dir", "cache", "uncached", "reason", reason);
  if (body && r->expires[0])
    json_object_set_new(body, "expires_ms", json_integer(strtoll(r->expires, NULL, 10)));
  creq_add_headers(r, "uncached");
  port_reply_json(r->in, 200, body);
  creq_free(r);
}

/* Answers from a READY entry: 0, or -1 when its file turned out corrupt or
 * gone (it was dropped; the caller fetches again). */
int creq_answer(creq_t *r, cache_entry_t *e, const char *how) {
  int fd = cache_open_file(r->a->cache, e);
  if (fd < 0)
    return -1;
  if (r->kind == CREQ_PATH) {
    close(fd);
    creq_send_path(r, e, how);
  } else {
    creq_send_file(r, e, fd, how);
  }
  return 0;
}

/* ---- serving a level the head confirmed ------------------------------------------- */

/* Non-zero when the client's If-None-Match names the level's ETag. */
static int creq_not_modified(creq_t *r) {
  const char *inm = h1_header(r->in, "If-None-Match");
  char etag[24];
  snprintf(etag, sizeof etag, "\"%016" PRIx64 "\"", r->checksum);
  return r->kind == CREQ_BYTES && inm && (strstr(inm, etag) != NULL || strcmp(inm, "*") == 0);
}

/* Answers `r` without the cache when it needs none (the client has the
 * bytes: 304) or the cache cannot help (a worker's path to a level larger
 * than the cache); true when it did (`r` is freed). */
static bool creq_serve_without(creq_t *r) {
  cache_t *c = r->a->cache;
  if (creq_not_modified(r)) {
    creq_add_headers(r, "hit");
    h1_respond(r->in, 304, NULL, NULL, 0, false);
    creq_free(r);
    return true;
  }
  if (r->kind == CREQ_PATH && r->size > c->limit_bytes) {
    /* It would be dropped once fetched (nobody reads it through the cache),
     * before the worker could link it: the worker reads the bytes instead. */
    char reason[200];
    snprintf(reason, sizeof reason,
             "the level's %lld bytes are larger than the cache (--cache-bytes %lld)",
             (long long)r->size, (long long)c->limit_bytes);
    creq_send_uncached(r, reason);
    return true;
  }
  return false;
}

void creq_note_expiry(const creq_t *r, cache_entry_t *e) {
  if (r->expires[0] != '\0') /* well formed: creq_read_head kept no other */
    e->expires_ms = strtoll(r->expires, NULL, 10);
}

/* Answers `r` (its level, checksum and size known) from the cache. */
void creq_serve(creq_t *r) {
  cache_t *c = r->a->cache;
  if (creq_serve_without(r))
    return;
  cache_entry_t *e = cache_find(c, r->scope, r->name, r->level);
  if (e && e->checksum != r->checksum) {
    if (e->state == CACHE_FETCHING) { /* a re-created level while its old bytes arrive */
      creq_error(r, 503, "unavailable",
                 "node agent %s: shared data '%s' level %lld changed "
                 "while it was being fetched; try again",
                 r->a->name, r->name, (long long)r->level);
      return;
    }
    cache_drop(c, e); /* deleted and made again with other bytes: ours are stale */
    e = NULL;
  }
  if (e)
    creq_note_expiry(r, e);
  if (e && e->state == CACHE_READY) {
    if (creq_answer(r, e, "hit") == 0) {
      CACHE_COUNT(c, hits, 1);
      return;
    }
    e = NULL; /* corrupt or gone: dropped; fetch it again */
  }
  CACHE_COUNT(c, misses, 1);
  if (e && e->state == CACHE_FETCHING) {
    CACHE_COUNT(c, coalesced, 1);
    cfetch_join(e, r);
    return;
  }
  cfetch_start(r);
}

/* ---- the HEAD that asks the head ----------------------------------------------------- */

int creq_parse_etag(const char *etag, uint64_t *checksum) {
  char hex[17];
  if (etag == NULL)
    return -1;
  if (strncmp(etag, "W/", 2) == 0)
    etag += 2;
  if (*etag == '"')
    etag++;
  if (strspn(etag, "0123456789abcdefABCDEF") != 16)
    return -1;
  memcpy(hex, etag, 16);
  hex[16] = '\0';
  *checksum = strtoull(hex, NULL, 16);
  return 0;
}

/* Reads the level, checksum, size and expiry of the head's HEAD reply; 0 or -1. */
static int creq_read_head(creq_t *r, struct evhttp_request *out) {
  struct evkeyvalq *h = evhttp_request_get_input_headers(out);
  const char *etag = evhttp_find_header(h, "ETag");
  const char *level = evhttp_find_header(h, "X-Muster-Level");
  const char *length = evhttp_find_header(h, "Content-Length");
  const char *expires = evhttp_find_header(h, "X-Muster-Expires-Ms");
  if (level == NULL || length == NULL || creq_parse_etag(etag, &r->checksum) != 0)
    return -1;
  char *end;
  r->level = strtoll(level, &end, 10);
  if (*end != '\0' || r->level < 1)
    return -1;
  r->size = strtoll(length, &end, 10);
  if (*end != '\0' || r->size < 0)
    return -1;
  int64_t ms;
  /* Only a well-formed expiry is passed on to clients and kept. */
  snprintf(r->expires, sizeof r->expires, "%s",
           cexpire_parse(r->a, expires, &ms) > 0 ? expires : "");
  return 0;
}

/* The head's answer to a worker's path request that is not 200, as an error
 * of our own: what is said when the head's own words cannot be had. */
static void creq_path_refused(creq_t *r, int status) {
  if (status == 401)
    creq_error(r, 401, "unauthorized", "%s", auth_refusal(r->auth));
  else if (status == 403)
    creq_error(r, 403, "forbidden", "this token may not read shared data");
  else if (status == 404 && r->level > 0)
    creq_error(r, 404, "shared_not_found", "shared data not found: '%s' level %lld in scope '%s'",
               r->name, (long long)r->level, r->scope);
  else if (status == 404)
    creq_error(r, 404, "shared_not_found", "shared data not found: '%s' in scope '%s'", r->name,
               r->scope);
  else
    creq_error(r, 503, "unavailable", "node agent %s: the head answered %d", r->a->name, status);
}

/* The reply to a GET sent for the head's words on a refused HEAD starts: an
 * error (small JSON) is read on; a 200 (the level came meanwhile) would be
 * its bytes, so the request is cancelled (creq_on_refusal gets NULL). */
static int creq_on_refusal_header(struct evhttp_request *out, void *arg) {
  (void)arg;
  return evhttp_request_get_response_code(out) == 200 ? -1 : 0;
}

/* The head's own error for a worker's path request, relayed as it came:
 * it says why (expired, a level no longer kept), which a worker's task error
 * then carries. */
static void creq_on_refusal(struct evhttp_request *out, void *arg) {
  creq_t *r = arg;
  int status = out ? evhttp_request_get_response_code(out) : 0;
  struct evbuffer *body = out ? evhttp_request_get_input_buffer(out) : NULL;
  const char *type =
      out ? evhttp_find_header(evhttp_request_get_input_headers(out), "Content-Type") : NULL;
  size_t len = body ? evbuffer_get_length(body) : 0;
  char *text =
      status >= 400 && type && strncmp(type, "application/json", 16) == 0 ? malloc(len + 1) : NULL;
  if (text) {
    evbuffer_remove(body, text, len);
    if (status == 401)
      h1_add_header(r->in, "WWW-Authenticate", "Bearer realm=\"muster\"");
    h1_respond(r->in, status, "application/json", text, len, false); /* its newline is in */
    fwd_conn_put(r->a, r->conn);
    r->conn = NULL;
    creq_free(r);
    return;
  }
  fwd_conn_discard(r->a, r->conn);
  r->conn = NULL;
  creq_path_refused(r, r->refused);
}

/* The forwarder's word that the agent stops with a request to the head
 * still in flight (fwd_cancel_fn). */
static void creq_on_stop(void *owner) {
  creq_stopping(owner);
}

/* Asks the head with a GET why it refused a worker's path request with
 * `status` (a HEAD's reply has no body to say it); falls back to our words. */
static void creq_ask_why(creq_t *r, int status) {
  node_agent_t *a = r->a;
  char uri[400];
  if (r->level > 0)
    snprintf(uri, sizeof uri, "/v1/shared/%s/%s?level=%lld", r->scope, r->name,
             (long long)r->level);
  else
    snprintf(uri, sizeof uri, "/v1/shared/%s/%s", r->scope, r->name);
  r->conn = fwd_conn_get(a);
  struct evhttp_request *out = r->conn ? evhttp_request_new(creq_on_refusal, r) : NULL;
  if (out == NULL) {
    if (r->conn)
      fwd_conn_put(a, r->conn);
    r->conn = NULL;
    creq_path_refused(r, status);
    return;
  }
  r->refused = status;
  fwd_conn_set_owner(r->conn, creq_on_stop, r);
  evhttp_request_set_header_cb(out, creq_on_refusal_header);
  struct evkeyvalq *h = evhttp_request_get_output_headers(out);
  if (r->auth)
    evhttp_add_header(h, "Authorization", r->auth);
  fwd_add_host(a, h);
  evhttp_make_request(fwd_conn_evcon(r->conn), out, EVHTTP_REQ_GET, uri);
}

/* Answers GET /v1/node/cache with the statistics, the levels whose files
 * were removed behind the agent's back forgotten first (so that the bytes
 * and entries are what the directory holds), and frees `r`. */
static void creq_send_stats(creq_t *r) {
  cache_t *c = r->a->cache;
  cache_forget_missing(c);
  const cache_stats_t *s = &c->stats;
  port_reply_json(
      r->in, 200,
      json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
                " s:s}",
                "hits", s->hits, "misses", s->misses, "coalesced", s->coalesced, "bytes_served",
                s->bytes_served, "evictions", s->evictions, "bytes_cached", c->bytes_cached,
                "limit_bytes", c->limit_bytes, "entries", c->entries, "upstream_fetches",
                s->upstream_fetches, "fetch_failures", s->fetch_failures, "verify_failures",
                s->verify_failures, "uncached", s->uncached, "expired", s->expired, "vanished",
                s->vanished, "fetching_bytes", c->bytes_fetching, "dir", c->dir));
  creq_free(r);
}

/* The head did not answer the agent's question about `r`: 503, saying that
 * even a level in the cache waits for the head (which checks the token and
 * that the level is still the one asked for), and that the agent does not
 * ask again by itself, so the read is the client's to retry. */
static void creq_unreachable(creq_t *r) {
  node_agent_t *a = r->a;
  if (r->kind == CREQ_STATS) {
    creq_error(r, 503, "unavailable",
               "node agent %s cannot reach the head at %s:%d, which checks the token of every "
               "request, the cache's statistics included; retry once the head is back",
               a->name, a->head_host, a->head_port);
    return;
  }
  creq_error(r, 503, "unavailable",
             "node agent %s cannot reach the head at %s:%d: a read of shared data needs the "
             "head even when the agent has the level cached (the head checks the token and "
             "that the level still exists, and names the newest); the agent does not retry "
             "by itself: retry the read once the head is back",
             a->name, a->head_host, a->head_port);
}

static void creq_on_head(struct evhttp_request *out, void *arg) {
  creq_t *r = arg;
  node_agent_t *a = r->a;
  int status = out ? evhttp_request_get_response_code(out) : 0;
  if (status == 200) /* an error answer to a HEAD may carry a body: not reused */
    fwd_conn_put(a, r->conn);
  else
    fwd_conn_discard(a, r->conn);
  r->conn = NULL;
  if (status == 0) {
    creq_unreachable(r);
  } else if (r->kind == CREQ_STATS) {
    if (status == 401)
      creq_error(r, 401, "unauthorized", "%s", auth_refusal(r->auth));
    else
      creq_send_stats(r);
  } else if (status != 200 || creq_read_head(r, out) != 0) {
    if (status == 404) /* expired or deleted: its cached files go now, not at eviction */
      cache_drop_gone(a->cache, r->scope, r->name, r->level);
    if (r->kind == CREQ_PATH) {
      creq_ask_why(r, status);
    } else {
      h1_req_t *in = r->in; /* the head's own answer says it best */
      creq_free(r);
      fwd_forward(a, in);
    }
  } else {
    creq_serve(r);
  }
}

/* Sends the HEAD (or, for the statistics, a token check) to the head. */
static void creq_ask_head(creq_t *r) {
  node_agent_t *a = r->a;
  r->conn = fwd_conn_get(a);
  struct evhttp_request *out = r->conn ? evhttp_request_new(creq_on_head, r) : NULL;
  if (out == NULL) {
    if (r->conn)
      fwd_conn_put(a, r->conn);
    creq_error(r, 503, "unavailable", "node agent %s: out of memory", a->name);
    return;
  }
  fwd_conn_set_owner(r->conn, creq_on_stop, r);
  struct evkeyvalq *h = evhttp_request_get_output_headers(out);
  if (r->auth)
    evhttp_add_header(h, "Authorization", r->auth);
  fwd_add_host(a, h);
  char uri[400];
  if (r->kind == CREQ_STATS) /* any authenticated GET; the node's own is small */
    snprintf(uri, sizeof uri, "/v1/nodes/%s", a->name);
  else if (r->level > 0)
    snprintf(uri, sizeof uri, "/v1/shared/%s/%s?level=%lld", r->scope, r->name,
             (long long)r->level);
  else
    snprintf(uri, sizeof uri, "/v1/shared/%s/%s", r->scope, r->name);
  evhttp_make_request(fwd_conn_evcon(r->conn), out,
                      r->kind == CREQ_STATS ? EVHTTP_REQ_GET : EVHTTP_REQ_HEAD, uri);
}

/* ---- routing --------------------------------------------------------------------- */

/* Splits "SCOPE/NAME" into r; 0, or -1 when it is not exactly two valid parts. */
static int creq_read_names(creq_t *r, const char *rest) {
  const char *slash = strchr(rest, '/');
  if (slash == NULL || strchr(slash + 1, '/') != NULL)
    return -1;
  size_t scope_len = (size_t)(slash - rest), name_len = strlen(slash + 1);
  if (scope_len > CACHE_NAME_MAX || name_len > CACHE_NAME_MAX)
    return -1;
  memcpy(r->scope, rest, scope_len);
  r->scope[scope_len] = '\0';
  memcpy(r->name, slash + 1, name_len + 1);
  return cache_valid_name(r->scope, scope_len) && cache_valid_name(r->name, name_len) ? 0 : -1;
}

/* Reads `?level=N` (the only query the cache takes); 0 or -1. */
static int creq_read_query(creq_t *r, const char *query) {
  r->level = 0;
  if (query == NULL || query[0] == '\0')
    return 0;
  if (strncmp(query, "level=", 6) != 0 || strchr(query, '&') != NULL)
    return -1;
  char *end;
  errno = 0;
  long long level = strtoll(query + 6, &end, 10);
  if (query[6] < '1' || query[6] > '9' || *end != '\0' || errno || level > (1LL << 53))
    return -1;
  r->level = level;
  return 0;
}

bool cache_http_serves(const node_agent_t *a, const h1_req_t *in) {
  const char *path = h1_path(in);
  return a->cache != NULL && strcmp(h1_method(in), "GET") == 0 &&
         (strncmp(path, "/v1/shared/", 11) == 0 || strncmp(path, "/v1/node/cache/", 15) == 0 ||
          strcmp(path, "/v1/node/cache") == 0);
}

int cache_http_handle(node_agent_t *a, h1_req_t *in) {
  const char *path = h1_path(in);
  if (a->cache == NULL || strcmp(h1_method(in), "GET") != 0)
    return 0;
  creq_kind_t kind;
  const char *rest = NULL;
  if (strncmp(path, "/v1/shared/", 11) == 0) {
    kind = CREQ_BYTES;
    rest = path + 11;
  } else if (strncmp(path, "/v1/node/cache/", 15) == 0) {
    kind = CREQ_PATH;
    rest = path + 15;
  } else if (strcmp(path, "/v1/node/cache") == 0) {
    kind = CREQ_STATS;
  } else {
    return 0;
  }
  creq_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return 0;
  r->a = a;
  r->in = in;
  r->kind = kind;
  r->stream_fd = -1;
  const char *auth = h1_header(in, "Authorization");
  r->auth = auth ? strdup(auth) : NULL;
  if (kind != CREQ_STATS &&
      (creq_read_names(r, rest) != 0 || creq_read_query(r, h1_query(in)) != 0)) {
    if (kind == CREQ_BYTES) { /* not the cache's to judge: the head answers */
      creq_free(r);
      return 0;
    }
    creq_error(r, 400, "bad_request",
               "expected /v1/node/cache/SCOPE/NAME[?level=N] with names of [A-Za-z0-9._-]");
    return 1;
  }
  creq_ask_head(r);
  return 1;
}

/* ---- life ---------------------------------------------------------------------------- */

int cache_http_start(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  char dir[400], err[512], cwd[300];
  if (cfg->cache_dir && cfg->cache_dir[0] != '/' && getcwd(cwd, sizeof cwd) != NULL)
    snprintf(dir, sizeof dir, "%s/%s", cwd, cfg->cache_dir); /* the agent may chdir later */
  else if (cfg->cache_dir)
    snprintf(dir, sizeof dir, "%s", cfg->cache_dir);
  else
    snprintf(dir, sizeof dir, "/var/tmp/muster-node-%s/cache", a->name);
  a->cache = cache_open(dir, cfg->cache_bytes, a->name, err, sizeof err);
  if (a->cache == NULL) {
    agent_log(a, "%s", err);
    return -1;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0 || fcntl(fds[0], F_SETFL, O_NONBLOCK) != 0 ||
      (a->cache->notify_ev =
           event_new(a->base, fds[0], EV_READ | EV_PERSIST, cfetch_on_notify, a)) == NULL ||
      event_add(a->cache->notify_ev, NULL) != 0) {
    agent_log(a, "cannot set up the node cache: %s", strerror(errno));
    return -1;
  }
  a->cache->notify_rd = fds[0];
  a->cache->notify_wr = fds[1];
  return cexpire_start(a);
}

void cache_http_stop(node_agent_t *a) {
  cache_t *c = a->cache;
  if (c == NULL || c->stopping)
    return;
  c->stopping = 1;
  cexpire_stop(a);
  cfetch_stop_all(a);
  if (c->notify_ev)
    event_free(c->notify_ev);
  c->notify_ev = NULL;
}

void cache_http_free(node_agent_t *a) {
  cache_free(a->cache);
  a->cache = NULL;
}
