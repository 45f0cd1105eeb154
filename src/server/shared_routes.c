/*
 * shared_routes.c — handlers of /v1/shared: they check names, query and
 * headers, call shared.c (metadata) or shared_upload.c (the body of a PUT),
 * and format the reply.  Blob bytes never pass through memory here: a GET
 * answers with the level's file, a PUT hands its body to the upload.
 */
#include "shared_routes.h"
#include "log.h"
#include "shared.h"
#include "shared_upload.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST(r) ((r)->head->st)
#define SHARED_TYPE "application/octet-stream"

/* Parses optional integer query `key` in [min, max] (`dflt` when absent). */
static muster_err_t query_int(http_req_t *r, const char *key, int64_t dflt, int64_t min,
                              int64_t max, int64_t *out, fail_t *f) {
  return query_int_read(http_query(r, key), key, dflt, min, max, out, f);
}

static const char *header_in(http_req_t *r, const char *name) {
  return h1_header(r->req, name);
}

static void header_out(http_req_t *r, const char *name, const char *value) {
  h1_add_header(r->req, name, value);
}

/* Checks the PUT's query and headers and fills *put. */
static muster_err_t put_parse(http_req_t *r, shared_put_t *put, fail_t *f) {
  const char *scope = r->params[0], *name = r->params[1];
  const char *type = header_in(r, "Content-Type");
  int64_t max_ttl = r->head->cfg.max_shared_ttl_ms, ttl;
  if (shared_check_names(scope, name, f) ||
      query_int(r, "level", 0, 1, INT64_MAX, &put->level, f) ||
      query_int(r, "ttl_ms", 0, 1, INT64_MAX, &ttl, f))
    return f->code;
  if (type && strncasecmp(type, SHARED_TYPE, strlen(SHARED_TYPE)) != 0)
    return fail_set(f, MUSTER_UNSUPPORTED_MEDIA,
                    "Content-Type is '%.100s'; send the bytes as " SHARED_TYPE, type);
  snprintf(put->scope, sizeof put->scope, "%s", scope);
  snprintf(put->name, sizeof put->name, "%s", name);
  put->ttl_clamped = ttl > max_ttl;
  put->ttl_ms = put->ttl_clamped ? max_ttl : ttl; /* 0: not given (shared_commit) */
  return MUSTER_OK;
}

void shared_h_put(http_req_t *r) {
  fail_t f = {0};
  shared_put_t put = {0};
  int64_t creates;
  if (put_parse(r, &put, &f) || shared_check_scope_writable(ST(r), put.scope, &f) ||
      shared_check_level(ST(r), put.scope, put.name, put.level, now_ms(), &creates, &f) ||
      shared_upload_accept(r, &put, &f))
    http_reply_fail(r, &f);
  /* Accepted: the request is parked; the upload replies when the body is in. */
}

/* True when If-None-Match lists `etag` (quoted) or "*". */
static bool etag_matches(const char *header, const char *etag) {
  if (header == NULL)
    return false;
  char copy[1024];
  snprintf(copy, sizeof copy, "%s", header);
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ' || *tok == '\t')
      tok++;
    if (strncmp(tok, "W/", 2) == 0)
      tok += 2;
    size_t len = strcspn(tok, " \t");
    if ((len == 1 && tok[0] == '*') || (len == strlen(etag) && strncmp(tok, etag, len) == 0))
      return true;
  }
  return false;
}

/* The file of level `lv` could not be opened (errno `err`, -1: it has the
 * wrong size): *f says why.  Out of descriptors is the head's passing
 * trouble, retried (503); a file that is gone is the store's, said in the
 * log too. */
static void shared_open_failed(const http_req_t *r, const shared_level_t *lv, int err, fail_t *f) {
  if (fail_errno_is_fds(err)) {
    fail_set(f, MUSTER_UNAVAILABLE,
             "level %lld of '%s' in scope '%s' cannot be opened now: " FAIL_FDS_TEXT "; retry",
             (long long)lv->level, lv->name, lv->scope);
    return;
  }
  fail_set(f, MUSTER_INTERNAL,
           "level %lld of '%s' in scope '%s' is missing from %s/shared (%s); set it again",
           (long long)lv->level, lv->name, lv->scope, r->head->cfg.data_dir,
           err >= 0 ? strerror(err) : "wrong size");
  log_msg(LOG_ERROR, "%s", f->message);
}

void shared_h_get(http_req_t *r) {
  fail_t f = {0};
  int64_t level;
  shared_level_t lv;
  if (shared_check_names(r->params[0], r->params[1], &f) ||
      query_int(r, "level", 0, 1, INT64_MAX, &level, &f) ||
      shared_find(ST(r), r->params[0], r->params[1], level, now_ms(), &lv, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  char path[PATH_MAX + 64], etag[SHARED_CHECKSUM_LEN + 3], text[32];
  shared_file_path(r->head->cfg.data_dir, lv.file, path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size != lv.size) {
    shared_open_failed(r, &lv, fd < 0 ? errno : -1, &f);
    if (fd >= 0)
      close(fd);
    http_reply_fail(r, &f);
    return;
  }
  snprintf(etag, sizeof etag, "\"%s\"", lv.checksum);
  header_out(r, "ETag", etag);
  snprintf(text, sizeof text, "%lld", (long long)lv.level);
  header_out(r, "X-Muster-Level", text);
  snprintf(text, sizeof text, "%lld", (long long)lv.expires_ms);
  header_out(r, "X-Muster-Expires-Ms", text);
  if (etag_matches(header_in(r, "If-None-Match"), etag)) {
    close(fd);
    http_reply_raw(r, 304, SHARED_TYPE, "", 0);
    return;
  }
  http_reply_file(r, 200, SHARED_TYPE, fd, lv.size);
}

void shared_h_list(http_req_t *r) {
  fail_t f = {0};
  json_t *list = NULL;
  if (shared_check_names(r->params[0], NULL, &f) == MUSTER_OK)
    list = shared_list(ST(r), r->params[0], now_ms(), &f);
  if (list)
    http_reply_json(r, 200, list);
  else
    http_reply_fail(r, &f);
}

void shared_h_delete(http_req_t *r) {
  fail_t f = {0};
  json_t *out = NULL;
  if (shared_check_names(r->params[0], r->params[1], &f) == MUSTER_OK) {
    /* The session's client calling: a heartbeat, when the session is open. */
    fail_t ignored = {0};
    if (shared_scope_is_session(r->params[0]))
      shared_check_scope_writable(ST(r), r->params[0], &ignored);
    out = shared_delete(ST(r), r->params[0], r->params[1], &f);
  }
  if (out)
    http_reply_json(r, 200, out);
  else
    http_reply_fail(r, &f);
}
