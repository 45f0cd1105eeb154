/*
 * shared.c — libmuster's shared-data calls (docs/api.md "Shared data").
 *
 * Blob bytes travel raw, so these calls do not go through client_call (JSON
 * bodies on the handle's easy handle): each transfer uses its own libcurl
 * easy handle with its own headers, a read callback that streams the upload
 * from memory or a file descriptor, and a write callback that streams the
 * download to memory or a file descriptor while hashing it (xxHash64) to
 * check it against the ETag.  Error replies are JSON and are read into the
 * handle's reply buffer, so muster_client_message() explains them as usual.
 */
#include "client/client_internal.h"
#include "core/said.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <xxhash.h>

#define SHARED_PATH_MAX 1024

/* libcurl's receive buffer: each piece is one write(2) to the file and one
 * hash update, and its default (16 KiB) made a 256 MiB level 16 384 of each. */
#define SHARED_RECV_BUFFER (512L * 1024)

/* One transfer's state, shared by the libcurl callbacks. */
typedef struct {
  muster_client_t *client;
  /* upload source: memory (data, len) or fd */
  const char *data;
  size_t len, off;
  int in_fd;
  /* download sink: memory (buf) or fd */
  int out_fd;
  client_buf_t buf;
  long status;         /* reply status, once the headers are in */
  XXH64_state_t *hash; /* of the downloaded bytes */
  int64_t received;
  int write_errno;
  char etag[32], level[32], expires[32], length[32];
  char error_code[64], error_message[1024]; /* core/said.h: a HEAD's refusal */
  unsigned said; /* what the reply's headers say of its sender (client_header_said) */
  muster_progress_fn progress;
  void *user;
  shared_cancel_t *cancel; /* ends the transfer from another thread (NULL: none) */
} xfer_t;

/* The end of muster_shared_opts_t's first version, the fields it was first
 * published with (all it has so far). */
#define SHARED_OPTS_FIRST_END OPTS_END(muster_shared_opts_t, user)

void muster_shared_opts_init_sized(muster_shared_opts_t *opts, size_t size) {
  const muster_shared_opts_t defaults = {.size = sizeof defaults, .ttl_ms = -1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* Takes the caller's `opts` (NULL: the defaults) into *taken. */
static muster_err_t shared_opts_take(muster_client_t *client, const muster_shared_opts_t *opts,
                                     muster_shared_opts_t *taken) {
  muster_shared_opts_init(taken);
  if (opts == NULL)
    return MUSTER_OK;
  return client_opts_take(client, taken, sizeof *taken, opts, SHARED_OPTS_FIRST_END, "opts",
                          "muster_shared_opts_init");
}

/* The Authorization header line of the handle, or NULL. */
static const char *shared_auth(const muster_client_t *client) {
  for (const struct curl_slist *h = client->headers; h; h = h->next)
    if (strncmp(h->data, "Authorization:", 14) == 0)
      return h->data;
  return NULL;
}

static size_t shared_read(char *out, size_t size, size_t nmemb, void *arg) {
  xfer_t *x = arg;
  size_t want = size * nmemb;
  if (x->in_fd >= 0) {
    for (;;) {
      ssize_t n = read(x->in_fd, out, want);
      if (n >= 0)
        return (size_t)n;
      if (errno != EINTR) {
        x->write_errno = errno;
        return CURL_READFUNC_ABORT;
      }
    }
  }
  size_t n = x->len - x->off < want ? x->len - x->off : want;
  memcpy(out, x->data + x->off, n);
  x->off += n;
  return n;
}

/* Copies header `name`'s value into `out` when `line` is that header; the
 * quotes around it go too when `quoted` (an ETag), not from a message. */
static void shared_header_text(const char *line, size_t len, const char *name, bool quoted,
                               char *out, size_t size) {
  size_t nlen = strlen(name);
  if (len <= nlen || strncasecmp(line, name, nlen) != 0 || line[nlen] != ':')
    return;
  const char *v = line + nlen + 1, *end = line + len;
  while (v < end && (*v == ' ' || (quoted && *v == '"')))
    v++;
  while (end > v &&
         (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || (quoted && end[-1] == '"')))
    end--;
  snprintf(out, size, "%.*s", (int)(end - v), v);
}

static void shared_header_value(const char *line, size_t len, const char *name, char *out,
                                size_t size) {
  shared_header_text(line, len, name, true, out, size);
}

static size_t shared_header(char *line, size_t size, size_t nmemb, void *arg) {
  xfer_t *x = arg;
  size_t len = size * nmemb;
  if (len > 5 && strncmp(line, "HTTP/", 5) == 0) {
    x->status = strtol(strchr(line, ' ') ? strchr(line, ' ') + 1 : "0", NULL, 10);
    x->etag[0] = x->level[0] = x->expires[0] = x->length[0] = '\0';
    x->error_code[0] = x->error_message[0] = '\0';
    x->said = 0;
  } else {
    x->said |= client_header_said(line, len);
  }
  shared_header_value(line, len, "Content-Length", x->length, sizeof x->length);
  shared_header_value(line, len, "ETag", x->etag, sizeof x->etag);
  shared_header_value(line, len, "X-Muster-Level", x->level, sizeof x->level);
  shared_header_value(line, len, "X-Muster-Expires-Ms", x->expires, sizeof x->expires);
  shared_header_text(line, len, SAID_CODE_HEADER, false, x->error_code, sizeof x->error_code);
  shared_header_text(line, len, SAID_MESSAGE_HEADER, false, x->error_message,
                     sizeof x->error_message);
  return len;
}

/* Bytes of a 200 go to the sink (hashed); anything else is an error body. */
static size_t shared_write(char *data, size_t size, size_t nmemb, void *arg) {
  xfer_t *x = arg;
  size_t len = size * nmemb;
  if (x->status != 200 || (x->out_fd < 0 && x->hash == NULL)) {
    return client_buf_append(&x->client->reply, data, len) ? len : 0;
  }
  XXH64_update(x->hash, data, len);
  x->received += (int64_t)len;
  if (x->out_fd < 0) {
    return client_buf_append(&x->buf, data, len) ? len : 0;
  }
  for (size_t done = 0; done < len;) {
    ssize_t n = write(x->out_fd, data + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      x->write_errno = n < 0 ? errno : EIO;
      return 0;
    }
    done += (size_t)n;
  }
  return len;
}

/* libcurl's progress callback: the caller's, and the cancel's check (non-zero
 * ends the transfer). */
static int shared_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                           curl_off_t ulnow) {
  xfer_t *x = arg;
  if (x->progress) {
    if (ultotal > 0 || ulnow > 0)
      x->progress(x->user, (int64_t)ulnow, ultotal > 0 ? (int64_t)ultotal : -1);
    else
      x->progress(x->user, (int64_t)dlnow, dltotal > 0 ? (int64_t)dltotal : -1);
  }
  return x->cancel && shared_cancel_fired(x->cancel);
}

/* Turns the error reply in the handle's buffer into a code and message. */
static muster_err_t shared_reply_error(muster_client_t *client) {
  client_buf_t *b = &client->reply;
  json_t *root = json_loadb(b->data ? b->data : "", b->len, JSON_ALLOW_NUL, NULL);
  json_t *error = json_object_get(root, "error");
  const char *code = json_string_value(json_object_get(error, "code"));
  const char *message = json_string_value(json_object_get(error, "message"));
  muster_err_t err = code ? muster_err_from_name(code) : MUSTER_PROTOCOL;
  if (err == MUSTER_OK || err == MUSTER_PROTOCOL)
    err = client->status == 404   ? MUSTER_NOT_FOUND
          : client->status >= 500 ? MUSTER_INTERNAL
                                  : MUSTER_PROTOCOL;
  if (message != NULL)
    client_fail(client, err, "%s", message);
  else
    client_fail(client, err,
                "the server at %s answered HTTP %d without a muster error body: it is likely "
                "not a muster head; check the URL and its path",
                client->base_url, client->status);
  json_decref(root);
  return err;
}

/* Sets up `curl` for one transfer of `x` (an upload of `upload_len` bytes
 * when `upload`, else a `method` call that reads a blob or an error). */
static void shared_setopt(CURL *curl, muster_client_t *client, const char *method, xfer_t *x,
                          int upload, int64_t upload_len) {
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, client->curl_error);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "libmuster/" MUSTER_VERSION);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, shared_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, shared_write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, SHARED_RECV_BUFFER);
  /* A head or node that cannot be reached fails within the handle's timeout,
   * as the JSON calls do, rather than after libcurl's own 300 s; without a
   * timeout (muster_client_set_timeout 0) libcurl's stays. */
  if (client->timeout_ms > 0)
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, client->timeout_ms);
  /* Blobs may take long: no overall limit, but give up on a stalled transfer. */
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   client->timeout_ms > 0 ? (client->timeout_ms + 999) / 1000 : 0L);
  if (x->cancel)
    shared_cancel_setopt(curl, x->cancel);
  if (x->progress || x->cancel) {
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, shared_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  }
  if (upload) {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, shared_read);
    curl_easy_setopt(curl, CURLOPT_READDATA, x);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)upload_len);
  } else if (strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L); /* the headers alone: no body follows */
  } else if (strcmp(method, "GET") != 0) {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  }
}

/* What a finished transfer (`rc`, client->status) comes to. */
static muster_err_t shared_outcome(muster_client_t *client, CURLcode rc, const xfer_t *x,
                                   const char *method, const char *path) {
  if (rc != CURLE_OK && x->cancel && shared_cancel_fired(x->cancel))
    return client_fail(client, MUSTER_NETWORK, "%s %s%s: cancelled", method, client->base_url,
                       path);
  /* The caller's file failed (a full disk, a bad descriptor): MUSTER_IO,
   * not a bad argument, nor the server's trouble. */
  if (rc == CURLE_WRITE_ERROR && x->write_errno)
    return client_fail(client, MUSTER_IO, "cannot write the blob: %s", strerror(x->write_errno));
  if ((rc == CURLE_ABORTED_BY_CALLBACK || rc == CURLE_READ_ERROR) && x->write_errno)
    return client_fail(client, MUSTER_IO, "cannot read the blob: %s", strerror(x->write_errno));
  if (rc == CURLE_WRITE_ERROR)
    return client_fail(client, MUSTER_NOMEM, "out of memory while reading the blob");
  if (rc != CURLE_OK)
    return client_fail(client, MUSTER_NETWORK, "%s %s%s: %s", method, client->base_url, path,
                       client->curl_error[0] ? client->curl_error : curl_easy_strerror(rc));
  if (client->status < 200 || client->status > 299)
    return shared_reply_error(client);
  return MUSTER_OK;
}

/* Runs one transfer of `method` on `path` (query included); fills
 * client->status and the reply buffer (error or PUT reply). */
static muster_err_t shared_perform(muster_client_t *client, const char *method, const char *path,
                                   xfer_t *x, int upload, int64_t upload_len) {
  CURL *curl = curl_easy_init();
  struct curl_slist *headers = NULL;
  const char *auth = shared_auth(client);
  char *url = malloc(strlen(client->base_url) + strlen(path) + 1);
  if (curl == NULL || url == NULL) {
    curl_easy_cleanup(curl);
    free(url);
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  }
  sprintf(url, "%s%s", client->base_url, path);
  headers = curl_slist_append(headers, "Accept: application/octet-stream, application/json");
  if (upload)
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
  if (auth)
    headers = curl_slist_append(headers, auth);
  client->status = 0;
  client->reply.len = 0;
  if (client->reply.data)
    client->reply.data[0] = '\0';
  client->curl_error[0] = '\0';
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  shared_setopt(curl, client, method, x, upload, upload_len);
  CURLcode rc = curl_easy_perform(curl);
  client_curl_reword(client, curl, rc, url);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  client->status = (int)status;
  if (x->status != 0) /* a reply came, if only its head: muster_client_server says who sent it */
    client->server = client_server_of(x->said);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  free(url);
  return shared_outcome(client, rc, x, method, path);
}

/* "/v1/shared/SCOPE/NAME" with an optional "?level=L&ttl_ms=T". */
static muster_err_t shared_path(muster_client_t *client, char *out, const char *scope,
                                const char *name, int64_t level, int64_t ttl_ms) {
  if (scope == NULL || (name == NULL && level >= 0))
    return client_fail(client, MUSTER_INVALID,
                       level >= 0 ? "scope and name are required" : "a scope is required");
  muster_err_t err =
      name ? client_path(client, out, SHARED_PATH_MAX, "/v1/shared/%s/%s", scope, name)
           : client_path(client, out, SHARED_PATH_MAX, "/v1/shared/%s", scope);
  if (err != MUSTER_OK)
    return err;
  size_t at = strlen(out);
  char sep = '?';
  if (level > 0) {
    at += (size_t)snprintf(out + at, SHARED_PATH_MAX - at, "%clevel=%" PRId64, sep, level);
    sep = '&';
  }
  if (ttl_ms >= 0)
    snprintf(out + at, SHARED_PATH_MAX - at, "%cttl_ms=%" PRId64, sep, ttl_ms);
  return MUSTER_OK;
}

/* Fills *info from the JSON reply of a PUT. */
static muster_err_t shared_put_info(muster_client_t *client, muster_shared_info_t *info) {
  json_t *root =
      json_loadb(client->reply.data ? client->reply.data : "", client->reply.len, 0, NULL);
  json_t *level = json_object_get(root, "level");
  if (!json_is_integer(level)) {
    json_decref(root);
    return client_fail(client, MUSTER_PROTOCOL, "the head's reply to the upload has no level");
  }
  if (info) {
    memset(info, 0, sizeof *info);
    info->level = json_integer_value(level);
    client_get_int(root, "size", 0, &info->size);
    client_get_int(root, "ttl_ms", 0, &info->ttl_ms);
    client_get_int(root, "expires_ms", 0, &info->expires_ms);
    info->ttl_clamped = json_is_true(json_object_get(root, "ttl_clamped"));
    const char *sum = json_string_value(json_object_get(root, "checksum"));
    snprintf(info->checksum, sizeof info->checksum, "%s", sum ? sum : "");
  }
  json_decref(root);
  client_ok(client);
  return MUSTER_OK;
}

/* Refuses negative numbers of an upload other than the documented -1s. */
static muster_err_t shared_put_check(muster_client_t *client, int64_t len,
                                     const muster_shared_opts_t *opts) {
  muster_err_t err = client_check_min(client, "level", opts->level, 0,
                                      "the level to create, 1 or more (0: level 1, a set)");
  if (err == MUSTER_OK)
    err = client_check_min(client, "ttl_ms", opts->ttl_ms, -1,
                           "a time in milliseconds, or -1 for the head's maximum");
  if (err == MUSTER_OK)
    err = client_check_min(client, "len", len, -1,
                           "0 or more bytes, or -1 to read to the end of the file");
  return err;
}

static muster_err_t shared_put(muster_client_t *client, const char *scope, const char *name,
                               xfer_t *x, int64_t len, const muster_shared_opts_t *opts,
                               muster_shared_info_t *info) {
  char path[SHARED_PATH_MAX];
  muster_err_t err = shared_put_check(client, len, opts);
  if (err == MUSTER_OK)
    err = shared_path(client, path, scope, name, opts->level, opts->ttl_ms);
  if (err == MUSTER_OK)
    err = shared_perform(client, "PUT", path, x, 1, len);
  return err == MUSTER_OK ? shared_put_info(client, info) : err;
}

muster_err_t muster_shared_set(muster_client_t *client, const char *scope, const char *name,
                               const void *data, size_t len, int64_t ttl_ms,
                               muster_shared_info_t *info) {
  return muster_shared_update(client, scope, name, 0, data, len, ttl_ms, info);
}

muster_err_t muster_shared_update(muster_client_t *client, const char *scope, const char *name,
                                  int64_t level, const void *data, size_t len, int64_t ttl_ms,
                                  muster_shared_info_t *info) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (data == NULL && len > 0)
    return client_fail(client, MUSTER_INVALID, "data is NULL");
  muster_shared_opts_t opts;
  muster_shared_opts_init(&opts);
  opts.level = level;
  opts.ttl_ms = ttl_ms;
  xfer_t x = {.client = client, .data = data, .len = len, .in_fd = -1, .out_fd = -1};
  return shared_put(client, scope, name, &x, (int64_t)len, &opts, info);
}

muster_err_t muster_shared_put_fd(muster_client_t *client, const char *scope, const char *name,
                                  int fd, int64_t len, const muster_shared_opts_t *caller,
                                  muster_shared_info_t *info) {
  if (client == NULL)
    return MUSTER_INVALID;
  muster_shared_opts_t opts;
  if (shared_opts_take(client, caller, &opts) != MUSTER_OK)
    return MUSTER_INVALID;
  if (fd < 0)
    return client_fail(client, MUSTER_INVALID, "fd: not a file descriptor");
  xfer_t x = {
      .client = client, .in_fd = fd, .out_fd = -1, .progress = opts.progress, .user = opts.user};
  return shared_put(client, scope, name, &x, len, &opts, info);
}

/* The path of level `level` of (scope, name) into `out`
 * (SHARED_PATH_MAX bytes), 0 meaning the newest; a negative level is
 * refused (MUSTER_INVALID) before the path is made. */
static muster_err_t shared_level_path(muster_client_t *client, char *out, const char *scope,
                                      const char *name, int64_t level) {
  muster_err_t err = client_check_min(client, "level", level, 0, "1 or more, or 0 for the newest");
  return err == MUSTER_OK ? shared_path(client, out, scope, name, level, -1) : err;
}

/* Runs a GET into x's sink; checks the bytes against the ETag; fills *info. */
static muster_err_t shared_fetch(muster_client_t *client, const char *scope, const char *name,
                                 int64_t level, xfer_t *x, muster_shared_info_t *info) {
  char path[SHARED_PATH_MAX];
  muster_err_t err = shared_level_path(client, path, scope, name, level);
  if (err != MUSTER_OK)
    return err;
  x->hash = XXH64_createState();
  if (x->hash == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  XXH64_reset(x->hash, 0);
  err = shared_perform(client, "GET", path, x, 0, 0);
  char sum[17];
  snprintf(sum, sizeof sum, "%016" PRIx64, (uint64_t)XXH64_digest(x->hash));
  XXH64_freeState(x->hash);
  x->hash = NULL;
  if (err != MUSTER_OK)
    return err;
  if (x->etag[0] && strcmp(sum, x->etag) != 0)
    return client_fail(client, MUSTER_PROTOCOL,
                       "the bytes of '%s' do not match their checksum "
                       "(got %s, the head says %s); read them again",
                       name, sum, x->etag);
  if (info) {
    memset(info, 0, sizeof *info);
    info->level = strtoll(x->level, NULL, 10);
    info->size = x->received;
    info->expires_ms = strtoll(x->expires, NULL, 10);
    snprintf(info->checksum, sizeof info->checksum, "%s", sum);
  }
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_shared_get(muster_client_t *client, const char *scope, const char *name,
                               int64_t level, void **data, size_t *len,
                               muster_shared_info_t *info) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (data == NULL)
    return client_fail(client, MUSTER_INVALID, "a place for the bytes is required");
  *data = NULL;
  if (len)
    *len = 0;
  xfer_t x = {.client = client, .in_fd = -1, .out_fd = -1};
  muster_err_t err = shared_fetch(client, scope, name, level, &x, info);
  if (err != MUSTER_OK) {
    free(x.buf.data);
    return err;
  }
  if (x.buf.data == NULL && (x.buf.data = calloc(1, 1)) == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  *data = x.buf.data;
  if (len)
    *len = x.buf.len;
  return MUSTER_OK;
}

muster_err_t muster_shared_get_fd(muster_client_t *client, const char *scope, const char *name,
                                  int fd, const muster_shared_opts_t *opts,
                                  muster_shared_info_t *info) {
  return shared_get_fd_cancellable(client, scope, name, fd, opts, info, NULL);
}

muster_err_t shared_get_fd_cancellable(muster_client_t *client, const char *scope, const char *name,
                                       int fd, const muster_shared_opts_t *caller,
                                       muster_shared_info_t *info, shared_cancel_t *cancel) {
  if (client == NULL)
    return MUSTER_INVALID;
  muster_shared_opts_t opts;
  if (shared_opts_take(client, caller, &opts) != MUSTER_OK)
    return MUSTER_INVALID;
  if (fd < 0)
    return client_fail(client, MUSTER_INVALID, "fd: not a file descriptor");
  xfer_t x = {.client = client,
              .in_fd = -1,
              .out_fd = fd,
              .progress = opts.progress,
              .user = opts.user,
              .cancel = cancel};
  return shared_fetch(client, scope, name, opts.level, &x, info);
}

/* The failure of a HEAD whose reply came without a body (a HEAD's never has
 * one): the code and message the head or node agent said in its headers
 * (core/said.h: why a blob is missing, expired or its session closed), or,
 * from a server that says none (an older head), the code its status stands
 * for, said in the library's words. */
static muster_err_t shared_stat_error(muster_client_t *client, const xfer_t *x, const char *scope,
                                      const char *name, int64_t level) {
  int status = client->status;
  muster_err_t said = x->error_code[0] ? muster_err_from_name(x->error_code) : MUSTER_PROTOCOL;
  if (said != MUSTER_OK && said != MUSTER_PROTOCOL && x->error_message[0])
    return client_fail(client, said, "%s", x->error_message);
  if (status == 404 && level > 0)
    return client_fail(client, MUSTER_SHARED_NOT_FOUND,
                       "shared data not found: level %lld of '%s' in scope '%s'", (long long)level,
                       name, scope);
  if (status == 404)
    return client_fail(client, MUSTER_SHARED_NOT_FOUND,
                       "shared data not found: '%s' in scope '%s' has no level now", name, scope);
  muster_err_t err = MUSTER_PROTOCOL;
  for (int code = 1; code < MUSTER_ERR_COUNT && err == MUSTER_PROTOCOL; code++)
    if (muster_err_http_status((muster_err_t)code) == status)
      err = (muster_err_t)code; /* the first code of that status: the most general one */
  return client_fail(client, err, "%s (HEAD /v1/shared/%s/%s answered HTTP %d)",
                     muster_strerror(err), scope, name, status);
}

muster_err_t muster_shared_stat(muster_client_t *client, const char *scope, const char *name,
                                int64_t level, muster_shared_info_t *info) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SHARED_PATH_MAX];
  muster_err_t err = shared_level_path(client, path, scope, name, level);
  if (err != MUSTER_OK)
    return err;
  xfer_t x = {.client = client, .in_fd = -1, .out_fd = -1};
  err = shared_perform(client, "HEAD", path, &x, 0, 0);
  if (err != MUSTER_OK && client->status >= 400 && client->reply.len == 0)
    err = shared_stat_error(client, &x, scope, name, level);
  if (err != MUSTER_OK)
    return err;
  if (strtoll(x.level, NULL, 10) < 1)
    return client_fail(client, MUSTER_PROTOCOL,
                       "the reply to HEAD %s/%s names no level (no X-Muster-Level): is the URL a "
                       "muster head's?",
                       scope, name);
  if (info) {
    memset(info, 0, sizeof *info);
    info->level = strtoll(x.level, NULL, 10);
    info->size = strtoll(x.length, NULL, 10);
    info->expires_ms = strtoll(x.expires, NULL, 10);
    snprintf(info->checksum, sizeof info->checksum, "%.16s", x.etag);
  }
  client_ok(client);
  return MUSTER_OK;
}

muster_err_t muster_shared_delete(muster_client_t *client, const char *scope, const char *name,
                                  int64_t *levels) {
  if (client == NULL)
    return MUSTER_INVALID;
  char path[SHARED_PATH_MAX];
  json_t *reply = NULL;
  muster_err_t err = shared_path(client, path, scope, name, 0, -1);
  if (err == MUSTER_OK)
    err = client_call(client, "DELETE", path, NULL, 0, &reply);
  if (err == MUSTER_OK && levels)
    client_get_int(reply, "levels", 0, levels);
  json_decref(reply);
  return err;
}

muster_err_t muster_shared_list(muster_client_t *client, const char *scope, char **json) {
  if (client == NULL)
    return MUSTER_INVALID;
  if (json == NULL)
    return client_fail(client, MUSTER_INVALID, "a place for the reply is required");
  *json = NULL;
  char path[SHARED_PATH_MAX];
  json_t *reply = NULL;
  muster_err_t err = shared_path(client, path, scope, NULL, -1, -1);
  if (err == MUSTER_OK)
    err = client_call(client, "GET", path, NULL, 0, &reply);
  if (err == MUSTER_OK && (*json = client_dump_value(reply)) == NULL)
    err = client_fail(client, MUSTER_NOMEM, "out of memory");
  json_decref(reply);
  return err;
}
