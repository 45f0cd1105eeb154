/*
 * shared_upload.c — streamed blob uploads (see shared_upload.h for why they
 * exist).
 *
 * The HTTP server dispatches `PUT /v1/shared/...` after its head
 * (shared_upload_streams); the route's handler checks the request and, when
 * it accepts, takes the body as a stream (h1_body_stream).  Each piece is
 * hashed and written to a temp file as it arrives; when the body is over, the
 * finish event makes the file durable under its final name and commits the
 * level, and only then is the reply queued.  A body that fails (too large, a
 * write error, broken framing) is answered at once, its rest read and dropped
 * by the server; an upload whose client goes away leaves nothing.
 */
#include "shared_upload.h"
#include "log.h"
#include "store.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>

#define UPLOAD_SYNC_WINDOW (8 << 20) /* writeback is started every 8 MiB */

struct shared_upload {
  shared_upload_t *next, *prev; /* the head's uploads in progress */
  head_t *head;
  h1_req_t *req; /* parked; NULL once its reply is queued */
  struct event *finish_ev;
  shared_put_t put;
  int fd;
  char tmp_path[PATH_MAX + 64];
  char file[SHARED_FILE_LEN + 1];
  XXH64_state_t *hash;
  int64_t size, synced;
  fail_t fail; /* set when the upload failed */
};

bool shared_upload_streams(const h1_req_t *req) {
  return strcmp(h1_method(req), "PUT") == 0 && strncmp(h1_path(req), "/v1/shared/", 11) == 0;
}

/* ---- the upload's file ---- */

/*
 * The upload's file could not be made (`what`: "create", "write", "sync",
 * "rename") for errno `err`: *f says why and what to do, and so does the
 * head's log, as this is the head's trouble, not the client's.  A full disk
 * is said as the store says it (store.c), in words the operator acts on.
 */
static muster_err_t upload_failed(const shared_upload_t *up, fail_t *f, const char *what,
                                  const char *path, int err) {
  if (fail_errno_is_fds(err))
    fail_set(f, MUSTER_UNAVAILABLE,
             "shared data '%s' in scope '%s': cannot %s %s: " FAIL_FDS_TEXT
             ": nothing of this upload was stored; retry",
             up->put.name, up->put.scope, what, path);
  else if (err == ENOSPC || err == EDQUOT)
    fail_set(f, MUSTER_STORE,
             "shared data '%s' in scope '%s': cannot %s %s: the disk holding it is %s: nothing "
             "of this upload was stored; free space there and retry (the head goes on by itself)",
             up->put.name, up->put.scope, what, path, err == ENOSPC ? "full" : "over its quota");
  else
    fail_set(f, MUSTER_STORE, "shared data '%s' in scope '%s': cannot %s %s: %s", up->put.name,
             up->put.scope, what, path, strerror(err));
  log_msg(LOG_ERROR, "%s", fail_message(f));
  return f->code;
}

static bool upload_write(shared_upload_t *up, const char *data, size_t len) {
  XXH64_update(up->hash, data, len);
  while (len > 0) {
    errno = 0;
    ssize_t n = write(up->fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) { /* a write of nothing: the disk filled up */
      upload_failed(up, &up->fail, "write", up->tmp_path, n < 0 && errno ? errno : ENOSPC);
      return false;
    }
    data += n;
    len -= (size_t)n;
    up->size += n;
  }
  /* Start writeback every window and wait for the one before, so the final
   * fsync has little left to do and dirty pages stay bounded. */
  while (up->size - up->synced >= 2 * UPLOAD_SYNC_WINDOW) {
    sync_file_range(up->fd, up->synced, UPLOAD_SYNC_WINDOW,
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER);
    sync_file_range(up->fd, up->synced + UPLOAD_SYNC_WINDOW, UPLOAD_SYNC_WINDOW,
                    SYNC_FILE_RANGE_WRITE);
    up->synced += UPLOAD_SYNC_WINDOW;
  }
  return true;
}

/* Removes the temp file, takes the upload off the head's list and frees it
 * (not its request). */
/* Closes and removes the upload's temp file, if it has one. */
static void upload_discard(shared_upload_t *up) {
  if (up->fd >= 0)
    close(up->fd);
  up->fd = -1;
  if (up->tmp_path[0])
    unlink(up->tmp_path);
  up->tmp_path[0] = '\0';
}

static void upload_free(shared_upload_t *up) {
  upload_discard(up);
  if (up->prev)
    up->prev->next = up->next;
  else if (up->head->uploads == up)
    up->head->uploads = up->next;
  if (up->next)
    up->next->prev = up->prev;
  if (up->finish_ev)
    event_free(up->finish_ev);
  XXH64_freeState(up->hash);
  free(up);
}

/* ---- the body's sink ---- */

/* A piece of the body: hashed and written, unless the upload is over its
 * limit or a write failed (then it is answered at once). */
static bool upload_data(void *arg, const char *data, size_t len) {
  shared_upload_t *up = arg;
  int64_t limit = (int64_t)up->head->cfg.max_blob_bytes;
  if (up->size + (int64_t)len > limit)
    fail_set(&up->fail, MUSTER_BODY_TOO_LARGE,
             "the upload is over %" PRId64 " bytes; the head's --max-blob-bytes is %" PRId64, limit,
             limit);
  else
    upload_write(up, data, len);
  if (up->fail.code == MUSTER_OK)
    return true;
  event_active(up->finish_ev, EV_TIMEOUT, 0);
  return false;
}

/* The body is over: finished outside the server's read, or dropped with a
 * client that went away. */
static void upload_end(void *arg, h1_body_end_t how) {
  shared_upload_t *up = arg;
  if (how == H1_BODY_GONE) {
    h1_drop(up->req);
    upload_free(up);
    return;
  }
  if (how == H1_BODY_BAD)
    fail_set(&up->fail, MUSTER_BAD_REQUEST, "the chunked body is malformed");
  event_active(up->finish_ev, EV_TIMEOUT, 0);
}

/* ---- accepting ---- */

bool shared_upload_pending(http_req_t *r, int64_t *length) {
  return h1_body_pending(r->req, length);
}

/* Opens a fresh temp file for `up`. */
static muster_err_t upload_open(shared_upload_t *up, const char *data_dir, fail_t *f) {
  uint64_t id;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    return fail_set(f, MUSTER_INTERNAL, "no random file name could be made");
  snprintf(up->file, sizeof up->file, "%016" PRIx64 ".blob", id);
  snprintf(up->tmp_path, sizeof up->tmp_path, "%s/shared/tmp/%016" PRIx64 ".part", data_dir, id);
  up->fd = open(up->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); /* shared.c */
  if (up->fd < 0) {
    upload_failed(up, f, "create", up->tmp_path, errno);
    up->tmp_path[0] = '\0';
    return f->code;
  }
  return MUSTER_OK;
}

static void upload_finish(evutil_socket_t fd, short what, void *arg);

muster_err_t shared_upload_accept(http_req_t *r, const shared_put_t *put, fail_t *f) {
  head_t *h = r->head;
  int64_t length;
  if (!h1_body_pending(r->req, &length))
    return fail_set(f, MUSTER_BAD_REQUEST,
                    "the body of this PUT could not be streamed; send it "
                    "with Content-Length or chunked, on an HTTP/1.1 connection");
  if (length > (int64_t)h->cfg.max_blob_bytes)
    return fail_set(f, MUSTER_BODY_TOO_LARGE,
                    "the body is %" PRId64 " bytes; the head's --max-blob-bytes is %zu", length,
                    h->cfg.max_blob_bytes);
  shared_upload_t *up = calloc(1, sizeof *up);
  if (up == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  *up = (shared_upload_t){
      .head = h, .req = r->req, .put = *put, .fd = -1, .hash = XXH64_createState()};
  up->finish_ev = event_new(h->base, -1, 0, upload_finish, up);
  if (up->hash == NULL || up->finish_ev == NULL) {
    upload_free(up);
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  XXH64_reset(up->hash, 0);
  if (upload_open(up, h->cfg.data_dir, f)) {
    upload_free(up);
    return f->code;
  }
  up->next = h->uploads;
  if (up->next)
    up->next->prev = up;
  h->uploads = up;
  r->parked = true;
  h1_body_stream(r->req, upload_data, upload_end, up);
  return MUSTER_OK;
}

/* ---- finishing ---- */

/* Makes the temp file durable under its final name. */
static muster_err_t upload_persist(shared_upload_t *up, fail_t *f) {
  char final[PATH_MAX + 64], dir[PATH_MAX + 16];
  shared_file_path(up->head->cfg.data_dir, up->file, final, sizeof final);
  snprintf(dir, sizeof dir, "%s/shared", up->head->cfg.data_dir);
  if (fsync(up->fd) != 0 || close(up->fd) != 0) {
    up->fd = -1;
    return upload_failed(up, f, "write", up->tmp_path, errno);
  }
  up->fd = -1;
  if (rename(up->tmp_path, final) != 0)
    return upload_failed(up, f, "rename", up->tmp_path, errno);
  up->tmp_path[0] = '\0';
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool synced = dfd >= 0 && fsync(dfd) == 0;
  if (dfd >= 0)
    close(dfd);
  if (!synced) {
    int err = errno;
    unlink(final);
    return upload_failed(up, f, "sync", dir, err);
  }
  return MUSTER_OK;
}

/* A level refused at the commit was accepted before the body (shared_h_put
 * checked it): the blob changed while the body came.  When another upload
 * made a level meanwhile, the refusal says so, lest the loser of two
 * uploads of one level read "expected 3, got 2" as its own mistake.  (A blob
 * that expired or was deleted meanwhile says so itself: "a new blob starts
 * at level 1".) */
static void upload_note_race(const shared_upload_t *up, fail_t *f) {
  if (f->code != MUSTER_VERSION_MISMATCH || strstr(f->message, "a new blob starts") != NULL)
    return;
  size_t len = strlen(f->message);
  snprintf(f->message + len, sizeof f->message - len,
           " (another upload of '%s' was committed while this one's body was sent, and the "
           "first to finish wins: nothing of this upload was stored)",
           up->put.name);
}

/* Commits the level in the turn's transaction; the reply waits for it. */
static json_t *upload_commit(shared_upload_t *up, shared_level_t *lv, fail_t *f) {
  store_t *st = up->head->st;
  *lv = (shared_level_t){.level = up->put.level, .size = up->size, .ttl_ms = up->put.ttl_ms};
  snprintf(lv->scope, sizeof lv->scope, "%s", up->put.scope);
  snprintf(lv->name, sizeof lv->name, "%s", up->put.name);
  snprintf(lv->file, sizeof lv->file, "%s", up->file);
  snprintf(lv->checksum, sizeof lv->checksum, "%016" PRIx64, (uint64_t)XXH64_digest(up->hash));
  if (store_request_begin(st, f))
    return NULL;
  bool ok = shared_check_scope_writable(st, lv->scope, f) == MUSTER_OK &&
            shared_commit(st, lv, (int64_t)up->head->cfg.shared_keep_levels,
                          up->head->cfg.max_shared_ttl_ms, now_ms(), f) == MUSTER_OK;
  store_request_end(st, ok);
  if (!ok) {
    upload_note_race(up, f);
    return NULL;
  }
  return json_pack("{s:s, s:s, s:I, s:I, s:s, s:I, s:b, s:I}", "scope", lv->scope, "name", lv->name,
                   "level", (json_int_t)lv->level, "size", (json_int_t)lv->size, "checksum",
                   lv->checksum, "ttl_ms", (json_int_t)lv->ttl_ms, "ttl_clamped",
                   up->put.ttl_clamped, "expires_ms", (json_int_t)lv->expires_ms);
}

static void upload_finish(evutil_socket_t fd, short what, void *arg) {
  shared_upload_t *up = arg;
  fail_t f = up->fail;
  shared_level_t lv;
  json_t *reply = NULL;
  if (f.code == MUSTER_OK && upload_persist(up, &f) == MUSTER_OK) {
    reply = upload_commit(up, &lv, &f);
    if (reply == NULL) {
      char final[PATH_MAX + 64];
      shared_file_path(up->head->cfg.data_dir, up->file, final, sizeof final);
      unlink(final);
    }
  }
  if (reply) {
    char etag[SHARED_CHECKSUM_LEN + 3];
    snprintf(etag, sizeof etag, "\"%s\"", lv.checksum);
    h1_add_header(up->req, "ETag", etag);
    log_msg(LOG_INFO, "shared data '%s' in scope '%s': level %lld, %lld bytes", lv.name, lv.scope,
            (long long)lv.level, (long long)lv.size);
    http_enqueue(up->head, up->req, 201, reply);
  } else {
    /* Its file goes before the client hears: a retry after a full disk
     * finds the room the failed upload took. */
    upload_discard(up);
    http_enqueue_fail(up->head, up->req, &f);
  }
  up->req = NULL;
  upload_free(up);
}

void shared_upload_abort_all(head_t *h) {
  while (h->uploads) {
    shared_upload_t *up = h->uploads;
    h1_body_detach(up->req);
    fail_t f;
    fail_set(&f, MUSTER_UNAVAILABLE, "the head is shutting down; upload again when it is back");
    http_enqueue_fail(h, up->req, &f);
    up->req = NULL;
    upload_free(up);
  }
}
