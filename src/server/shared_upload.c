/*
 * shared_upload.c — the connection input tap and streamed uploads (see
 * shared_upload.h for why they exist).
 *
 * Per connection a shared_conn_t runs a small state machine over the bytes
 * the socket delivers, before evhttp reads them:
 *
 *   HEAD     collecting a request head; once complete it goes to evhttp
 *            (verbatim, or rewritten for an upload) and the body is framed
 *   PASS     a body evhttp reads (Content-Length or chunked): passed as is
 *   THROUGH  a head the tap cannot parse: everything passes, evhttp decides
 *   AWAIT    an upload head went to evhttp; until its handler decides, the
 *            bytes behind it are held
 *   UPLOAD   the accepted upload's body: into the temp file
 *   DISCARD  a refused or failed upload's body: read and dropped
 *   HOLD     the upload's body is over; bytes behind it are held until the
 *            reply went out (evhttp must not read a request while it writes)
 *   DROP     everything is dropped; the connection closes after the reply
 *
 * The tap is an evbuffer callback on the socket bufferevent's input, invoked
 * right after each read and before evhttp's read callback.  The bufferevent's
 * read low-watermark is 1, so a read whose bytes the tap took away does not
 * wake evhttp.  The tap's state lives as long as the connection: evhttp's
 * close callback frees it; a connection that closes before sending a byte is
 * found by shared_tap_sweep (the tap keeps a reference on its bufferevent
 * until the first byte).
 */
#include "shared_upload.h"
#include "log.h"
#include "store.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#define TAP_MAX_HEAD (64 * 1024)     /* evhttp's header limit (http_start) */
#define TAP_READ_MAX (256 * 1024)    /* bytes per socket read while uploading */
#define UPLOAD_SYNC_WINDOW (8 << 20) /* writeback is started every 8 MiB */

typedef enum {
  TAP_HEAD,
  TAP_PASS,
  TAP_THROUGH,
  TAP_AWAIT,
  TAP_UPLOAD,
  TAP_DISCARD,
  TAP_HOLD,
  TAP_DROP
} tap_state_t;
typedef enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER } chunk_state_t;

/* Where a body ends: Content-Length bytes, or chunked framing. */
typedef struct {
  bool chunked;
  int64_t left; /* bytes left of the body (length) or of the chunk (chunked) */
  chunk_state_t cs;
  size_t line_len; /* chunked: bytes of the framing line read so far */
  char line[64];   /* its start: a chunk size is short */
} frame_t;

typedef struct shared_upload shared_upload_t;

struct shared_conn {
  struct shared_conn *next, *prev;
  head_t *head;
  struct bufferevent *bev;
  struct evbuffer_cb_entry *tap;
  bool registered; /* evhttp's close callback frees this (else the sweep) */
  bool in_tap;     /* the tap is changing the input itself */
  tap_state_t state;
  frame_t frame;
  struct evbuffer *head_buf; /* HEAD: the head so far */
  size_t head_scan;          /* HEAD: where to look for its end next */
  struct evbuffer *held;     /* AWAIT, HOLD: bytes kept from evhttp */
  struct evbuffer *raw, *out, *tail; /* scratch of tap_cb and tap_head, empty between calls */
  bool expect;               /* the upload head asked for "100 Continue" */
  frame_t pending;           /* the upload head's body framing */
  bool replied;              /* the upload request's reply went out */
  shared_upload_t *upload;   /* the accepted upload, until it replied */
};

struct shared_upload {
  shared_conn_t *conn; /* NULL once the connection went away */
  head_t *head;
  struct evhttp_request *req; /* parked; NULL once its reply is queued */
  struct event *finish_ev;
  shared_put_t put;
  int fd;
  char tmp_path[PATH_MAX + 64];
  char file[SHARED_FILE_LEN + 1];
  XXH64_state_t *hash;
  int64_t size, synced;
  fail_t fail; /* set when the upload failed */
};

/* ---- small helpers ---- */

static void conn_unlink(shared_conn_t *c) {
  head_t *h = c->head;
  if (c->prev)
    c->prev->next = c->next;
  else
    h->shared_conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
}

static void frame_init(frame_t *fr, bool chunked, int64_t length) {
  *fr = (frame_t){.chunked = chunked, .left = chunked ? 0 : length, .cs = CH_SIZE};
}

static bool frame_empty(const frame_t *fr) {
  return !fr->chunked && fr->left == 0;
}

/* The tap state of the connection `req` arrived on, or NULL. */
static shared_conn_t *conn_of(head_t *h, struct evhttp_request *req) {
  struct evhttp_connection *evcon = evhttp_request_get_connection(req);
  struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
  for (shared_conn_t *c = h->shared_conns; c && bev; c = c->next)
    if (c->bev == bev)
      return c;
  return NULL;
}

/* ---- the upload's file ---- */

static bool upload_write(shared_upload_t *up, const char *data, size_t len) {
  XXH64_update(up->hash, data, len);
  while (len > 0) {
    ssize_t n = write(up->fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      fail_set(&up->fail, MUSTER_STORE, "cannot write the upload to %s: %s", up->tmp_path,
               n < 0 ? strerror(errno) : "short write");
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

/* Removes the temp file and frees the upload (not its request). */
static void upload_free(shared_upload_t *up) {
  if (up->fd >= 0)
    close(up->fd);
  if (up->tmp_path[0])
    unlink(up->tmp_path);
  if (up->conn)
    up->conn->upload = NULL;
  event_free(up->finish_ev);
  XXH64_freeState(up->hash);
  free(up);
}

/* ---- the tap's state machine ---- */

static void tap_feed(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out);
static void upload_body_done(shared_conn_t *c);

/* Hands `n` bytes of `raw` to the body's sink for the state. */
static void body_sink(shared_conn_t *c, struct evbuffer *raw, size_t n, bool data,
                      struct evbuffer *out) {
  if (c->state == TAP_PASS) {
    evbuffer_remove_buffer(raw, out, n);
    return;
  }
  if (c->state == TAP_UPLOAD && data && c->upload && c->upload->fail.code == MUSTER_OK) {
    shared_upload_t *up = c->upload;
    int64_t limit = (int64_t)c->head->cfg.max_blob_bytes;
    if (up->size + (int64_t)n > limit) {
      fail_set(&up->fail, MUSTER_BODY_TOO_LARGE,
               "the upload is over %" PRId64 " bytes; the "
               "head's --max-blob-bytes is %" PRId64,
               limit, limit);
    } else {
      size_t done = 0;
      while (done < n) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(raw, -1, NULL, &v, 1) < 1)
          break;
        size_t len = v.iov_len < n - done ? v.iov_len : n - done;
        if (!upload_write(up, v.iov_base, len))
          break;
        evbuffer_drain(raw, len);
        done += len;
      }
      n -= done;
    }
    if (up->fail.code != MUSTER_OK) {
      c->state = TAP_DISCARD; /* the rest of the body is dropped */
      event_active(up->finish_ev, EV_TIMEOUT, 0);
    }
  }
  evbuffer_drain(raw, n);
}

/* Reads a chunked framing line (size, chunk end, trailer); true when a whole
 * line was taken, with its start (CR and LF removed) in c->frame.line. */
static bool frame_line(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out, bool *bad) {
  frame_t *fr = &c->frame;
  struct evbuffer_ptr eol = evbuffer_search(raw, "\n", 1, NULL);
  size_t take = eol.pos >= 0 ? (size_t)eol.pos + 1 : evbuffer_get_length(raw);
  char part[64];
  size_t copy = take < sizeof part ? take : sizeof part;
  evbuffer_copyout(raw, part, copy);
  for (size_t i = 0; i < copy && fr->line_len < sizeof fr->line - 1; i++)
    fr->line[fr->line_len++] = part[i];
  body_sink(c, raw, take, false, out);
  if (eol.pos < 0) {
    *bad = fr->line_len >= sizeof fr->line - 1; /* a size line is never that long */
    return false;
  }
  fr->line[fr->line_len] = '\0';
  fr->line[strcspn(fr->line, "\r\n")] = '\0';
  fr->line_len = 0;
  return true;
}

/* Advances through a chunked body; true when it ended. */
static bool body_chunked(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out, bool *bad) {
  frame_t *fr = &c->frame;
  while (evbuffer_get_length(raw) > 0) {
    if (fr->cs == CH_DATA) {
      size_t n = evbuffer_get_length(raw);
      if ((int64_t)n > fr->left)
        n = (size_t)fr->left;
      body_sink(c, raw, n, true, out);
      if ((fr->left -= (int64_t)n) == 0)
        fr->cs = CH_DATA_END;
      continue;
    }
    if (!frame_line(c, raw, out, bad))
      return false;
    if (fr->cs == CH_SIZE) {
      char *end;
      long long size = strtoll(fr->line, &end, 16);
      if (end == fr->line || size < 0 || (*end != '\0' && *end != ';' && *end != ' ')) {
        *bad = true;
        return false;
      }
      fr->left = size;
      fr->cs = size > 0 ? CH_DATA : CH_TRAILER;
    } else if (fr->cs == CH_DATA_END) {
      if (fr->line[0] != '\0') {
        *bad = true;
        return false;
      }
      fr->cs = CH_SIZE;
    } else if (fr->line[0] == '\0') { /* CH_TRAILER: an empty line ends the body */
      return true;
    }
  }
  return false;
}

/* Feeds body bytes to the state's sink; moves on when the body ended. */
static void tap_body(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out) {
  bool done = false, bad = false;
  if (c->frame.chunked) {
    done = body_chunked(c, raw, out, &bad);
  } else {
    size_t n = evbuffer_get_length(raw);
    if ((int64_t)n > c->frame.left)
      n = (size_t)c->frame.left;
    body_sink(c, raw, n, true, out);
    c->frame.left -= (int64_t)n;
    done = c->frame.left == 0;
  }
  if (bad) {
    /* The framing is broken: where the next request starts is unknown. */
    if (c->state == TAP_PASS) {
      c->state = TAP_THROUGH; /* evhttp fails the request itself */
      return;
    }
    if (c->upload && c->upload->fail.code == MUSTER_OK) {
      fail_set(&c->upload->fail, MUSTER_BAD_REQUEST, "the chunked body is malformed");
      event_active(c->upload->finish_ev, EV_TIMEOUT, 0);
    }
    c->state = TAP_DROP;
    return;
  }
  if (!done)
    return;
  if (c->state == TAP_PASS)
    c->state = TAP_HEAD;
  else if (c->state == TAP_UPLOAD)
    upload_body_done(c);
  else if (c->state == TAP_DISCARD)
    c->state = c->replied ? TAP_HEAD : TAP_HOLD;
}

/* The value of the first header `name` in head lines [lines, end), trimmed
 * into `out`; false when absent. */
static bool head_header(const char *lines, const char *end, const char *name, char *out,
                        size_t size) {
  size_t nlen = strlen(name);
  for (const char *p = lines; p < end;) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    if ((size_t)(eol - p) > nlen && strncasecmp(p, name, nlen) == 0 && p[nlen] == ':') {
      const char *v = p + nlen + 1, *ve = eol;
      while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
      snprintf(out, size, "%.*s", (int)(ve - v), v);
      return true;
    }
    p = eol + 1;
  }
  return false;
}

/* True for header lines an upload head loses on its way to evhttp. */
static bool head_line_dropped(const char *p, size_t len) {
  static const char *const names[] = {"Content-Length:", "Transfer-Encoding:", "Expect:", NULL};
  for (int i = 0; names[i]; i++)
    if (len >= strlen(names[i]) && strncasecmp(p, names[i], strlen(names[i])) == 0)
      return true;
  return false;
}

/* Writes the upload head `head` (len bytes, ending in an empty line) to
 * `out` without its body headers and with "Content-Length: 0". */
static void head_rewrite(const char *head, size_t len, struct evbuffer *out) {
  const char *end = head + len;
  bool first = true;
  for (const char *p = head; p < end;) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((eol ? eol + 1 : end) - p);
    bool blank = n <= 2 && (p[0] == '\n' || p[0] == '\r');
    if (blank)
      evbuffer_add_printf(out, "Content-Length: 0\r\n");
    if (first || blank || !head_line_dropped(p, n))
      evbuffer_add(out, p, n);
    first = false;
    p += n;
  }
}

/* Copies the request line's first `size` - 1 bytes of a word, up to a space. */
static const char *head_word(const char *p, const char *end, char *out, size_t size) {
  while (p < end && *p == ' ')
    p++;
  size_t n = 0;
  for (; p < end && *p != ' ' && *p != '\r' && *p != '\n'; p++)
    if (n + 1 < size)
      out[n++] = *p;
  out[n] = '\0';
  return p;
}

/* The method and (the start of) the target of the request line ending at
 * `eol`; false when either is missing.  Every request comes through here:
 * no sscanf. */
static bool head_request_line(const char *p, const char *eol, char *method, size_t msize,
                              char *target, size_t tsize) {
  p = head_word(p, eol, method, msize);
  head_word(p, eol, target, tsize);
  return method[0] != '\0' && target[0] != '\0';
}

/* A complete head of `len` bytes is at the front of c->head_buf: decides its
 * body framing, hands it to evhttp and sets the next state. */
static void head_done(shared_conn_t *c, size_t len, struct evbuffer *out) {
  const char *head = (const char *)evbuffer_pullup(c->head_buf, (ev_ssize_t)len);
  const char *line_end = memchr(head, '\n', len), *end = head + len;
  char method[16] = "", target[16] = "", te[64], cl[32], expect[64];
  if (line_end == NULL || !head_request_line(head, line_end, method, sizeof method, target,
                                             sizeof target)) {
    evbuffer_remove_buffer(c->head_buf, out, len);
    c->state = TAP_THROUGH;
    return;
  }
  bool bodyless = strcmp(method, "HEAD") == 0 || strcmp(method, "TRACE") == 0;
  bool chunked = !bodyless && head_header(line_end + 1, end, "Transfer-Encoding", te, sizeof te) &&
                 strcasecmp(te, "chunked") == 0;
  int64_t length = 0;
  if (!bodyless && !chunked && head_header(line_end + 1, end, "Content-Length", cl, sizeof cl)) {
    char *cl_end;
    long long v = strtoll(cl, &cl_end, 10);
    if (cl[0] == '\0' || *cl_end != '\0' || v < 0) {
      evbuffer_remove_buffer(c->head_buf, out, len);
      c->state = TAP_THROUGH; /* evhttp refuses it */
      return;
    }
    length = v;
  }
  bool upload = strcmp(method, "PUT") == 0 && strncmp(target, "/v1/shared/", 11) == 0;
  if (upload) {
    /* Read Expect before the drain: it frees the bytes `head` points into. */
    c->expect = head_header(line_end + 1, end, "Expect", expect, sizeof expect) &&
                strcasecmp(expect, "100-continue") == 0;
    head_rewrite(head, len, out);
    evbuffer_drain(c->head_buf, len);
    frame_init(&c->pending, chunked, length);
    c->replied = false;
    c->state = TAP_AWAIT;
    return;
  }
  evbuffer_remove_buffer(c->head_buf, out, len);
  frame_init(&c->frame, chunked, length);
  c->state = chunked || length > 0 ? TAP_PASS : TAP_HEAD;
}

/* Collects head bytes; hands a complete head on. */
static void tap_head(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out) {
  evbuffer_add_buffer(c->head_buf, raw);
  size_t len = evbuffer_get_length(c->head_buf);
  const char *p = (const char *)evbuffer_pullup(c->head_buf, -1);
  for (size_t i = c->head_scan; i < len; i++) {
    if (p[i] != '\n')
      continue;
    size_t next = i + 1 < len && p[i + 1] == '\r' ? i + 2 : i + 1;
    if (next < len && p[next] == '\n') {
      /* The head is the first next + 1 bytes; what follows is fed again. */
      struct evbuffer *tail = c->tail;
      evbuffer_add_buffer(tail, c->head_buf);
      evbuffer_remove_buffer(tail, c->head_buf, next + 1);
      evbuffer_prepend_buffer(raw, tail);
      c->head_scan = 0;
      head_done(c, next + 1, out);
      return;
    }
    if (next >= len)
      break; /* the line after is not here yet: look again from i */
  }
  c->head_scan = len > 3 ? len - 3 : 0;
  if (len > TAP_MAX_HEAD) {
    evbuffer_add_buffer(out, c->head_buf);
    c->state = TAP_THROUGH;
  }
}

static void tap_feed(shared_conn_t *c, struct evbuffer *raw, struct evbuffer *out) {
  while (evbuffer_get_length(raw) > 0) {
    switch (c->state) {
    case TAP_THROUGH:
      evbuffer_add_buffer(out, raw);
      return;
    case TAP_AWAIT:
    case TAP_HOLD:
      evbuffer_add_buffer(c->held, raw);
      return;
    case TAP_DROP:
      evbuffer_drain(raw, evbuffer_get_length(raw));
      return;
    case TAP_HEAD:
      tap_head(c, raw, out);
      break;
    case TAP_PASS:
    case TAP_UPLOAD:
    case TAP_DISCARD:
      tap_body(c, raw, out);
      break;
    }
  }
}

/* Runs the held bytes through the machine again (a decision was made or a
 * reply went out); what evhttp may read goes in front of its input. */
static void tap_release(shared_conn_t *c) {
  struct evbuffer *raw = c->held, *out = evbuffer_new();
  c->held = evbuffer_new();
  tap_feed(c, raw, out);
  evbuffer_free(raw);
  if (evbuffer_get_length(out) > 0) {
    c->in_tap = true;
    evbuffer_prepend_buffer(bufferevent_get_input(c->bev), out);
    c->in_tap = false;
  }
  evbuffer_free(out);
}

/* ---- connection life ---- */

static void conn_free(shared_conn_t *c) {
  shared_upload_t *up = c->upload;
  if (up) {
    up->conn = NULL;
    /* A parked request that evhttp let go (the client left) is ours to free;
     * one still on the connection is freed by evhttp with it. */
    if (up->req && evhttp_request_get_connection(up->req) == NULL)
      evhttp_request_free(up->req);
    up->req = NULL;
    upload_free(up);
  }
  evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->tap);
  if (!c->registered)
    bufferevent_decref(c->bev);
  conn_unlink(c);
  evbuffer_free(c->head_buf);
  evbuffer_free(c->held);
  evbuffer_free(c->raw);
  evbuffer_free(c->out);
  evbuffer_free(c->tail);
  free(c);
}

static void conn_closed(struct evhttp_connection *evcon, void *arg) {
  conn_free(arg);
}

/* The input callback: new bytes were read into `input`. */
static void tap_cb(struct evbuffer *input, const struct evbuffer_cb_info *info, void *arg) {
  shared_conn_t *c = arg;
  if (c->in_tap || info->n_added == 0)
    return;
  if (!c->registered) {
    void *evcon = NULL;
    bufferevent_getcb(c->bev, NULL, NULL, NULL, &evcon);
    if (evcon == NULL)
      return;
    evhttp_connection_set_closecb(evcon, conn_closed, c);
    c->registered = true;
    bufferevent_decref(c->bev);
  }
  if (c->state == TAP_THROUGH)
    return;
  c->in_tap = true;
  /* The bytes evhttp has not read yet stay in front; the new ones are fed. */
  size_t approved = evbuffer_get_length(input) - info->n_added;
  struct evbuffer *raw = c->raw, *out = c->out;
  evbuffer_remove_buffer(input, out, approved);
  evbuffer_add_buffer(raw, input);
  tap_feed(c, raw, out); /* consumes all of raw */
  evbuffer_add_buffer(input, out);
  c->in_tap = false;
}

struct bufferevent *shared_tap_bevcb(struct event_base *base, void *arg) {
  head_t *h = arg;
  struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  shared_conn_t *c = calloc(1, sizeof *c);
  if (bev == NULL || c == NULL)
    goto fail;
  *c = (shared_conn_t){.head = h, .bev = bev, .head_buf = evbuffer_new(), .held = evbuffer_new(),
                       .raw = evbuffer_new(), .out = evbuffer_new(), .tail = evbuffer_new()};
  if (c->head_buf == NULL || c->held == NULL || c->raw == NULL || c->out == NULL ||
      c->tail == NULL ||
      (c->tap = evbuffer_add_cb(bufferevent_get_input(bev), tap_cb, c)) == NULL)
    goto fail;
  /* A read whose bytes the tap kept must not wake evhttp. */
  bufferevent_setwatermark(bev, EV_READ, 1, 0);
  bufferevent_incref(bev); /* kept until the first byte; see shared_tap_sweep */
  c->next = h->shared_conns;
  if (c->next)
    c->next->prev = c;
  h->shared_conns = c;
  return bev;
fail:
  if (c) {
    struct evbuffer *bufs[] = {c->head_buf, c->held, c->raw, c->out, c->tail};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
      if (bufs[i])
        evbuffer_free(bufs[i]); /* evbuffer_free does not take NULL */
  }
  free(c);
  return bev; /* evhttp still gets a plain bufferevent (or fails itself) */
}

void shared_tap_sweep(head_t *h) {
  for (shared_conn_t *c = h->shared_conns, *next; c; c = next) {
    next = c->next;
    if (c->registered)
      continue;
    void (*readcb)(struct bufferevent *, void *) = NULL;
    void *evcon = NULL;
    bufferevent_getcb(c->bev, &readcb, NULL, NULL, &evcon);
    if (readcb == NULL) /* evhttp freed the connection: only our reference is left */
      conn_free(c);
  }
}

/* ---- refusing and accepting uploads ---- */

/* evhttp wrote the reply of the upload request: what was held may go on. */
static void tap_reply_sent(struct evhttp_request *req, void *arg) {
  shared_conn_t *c = arg;
  c->replied = true;
  if (c->state == TAP_HOLD)
    c->state = TAP_HEAD;
  tap_release(c);
}

void shared_tap_dispatched(http_req_t *r) {
  if (evhttp_request_get_command(r->req) != EVHTTP_REQ_PUT)
    return;
  const char *uri = evhttp_request_get_uri(r->req);
  if (uri == NULL || strncmp(uri, "/v1/shared/", 11) != 0)
    return;
  shared_conn_t *c = conn_of(r->head, r->req);
  if (c == NULL || c->state != TAP_AWAIT)
    return; /* not streamed, or accepted */
  evhttp_request_set_on_complete_cb(r->req, tap_reply_sent, c);
  if (c->expect) {
    /* The client waits for "100 Continue" and may never send the body. */
    evhttp_add_header(evhttp_request_get_output_headers(r->req), "Connection", "close");
    c->state = TAP_DROP;
    evbuffer_drain(c->held, evbuffer_get_length(c->held));
    return;
  }
  c->frame = c->pending;
  c->state = frame_empty(&c->frame) ? TAP_HOLD : TAP_DISCARD;
  tap_release(c);
}

bool shared_upload_pending(http_req_t *r, int64_t *length) {
  shared_conn_t *c = conn_of(r->head, r->req);
  if (c == NULL || c->state != TAP_AWAIT)
    return false;
  *length = c->pending.chunked ? -1 : c->pending.left;
  return true;
}

/* Opens a fresh temp file for `up`. */
static muster_err_t upload_open(shared_upload_t *up, const char *data_dir, fail_t *f) {
  uint64_t id;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    return fail_set(f, MUSTER_INTERNAL, "no random file name could be made");
  snprintf(up->file, sizeof up->file, "%016" PRIx64 ".blob", id);
  snprintf(up->tmp_path, sizeof up->tmp_path, "%s/shared/tmp/%016" PRIx64 ".part", data_dir, id);
  up->fd = open(up->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (up->fd < 0) {
    fail_set(f, MUSTER_STORE, "cannot create %s: %s", up->tmp_path, strerror(errno));
    up->tmp_path[0] = '\0';
    return MUSTER_STORE;
  }
  return MUSTER_OK;
}

static void upload_finish(evutil_socket_t fd, short what, void *arg);

/* Says "100 Continue" straight on the socket: evhttp has nothing queued on
 * it (it is handling this request), and its own writer must not run now. */
static void send_continue(shared_conn_t *c) {
  static const char line[] = "HTTP/1.1 100 Continue\r\n\r\n";
  if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
    return; /* cannot happen; the client sends anyway after its timeout */
  ssize_t n = send(bufferevent_getfd(c->bev), line, sizeof line - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != (ssize_t)sizeof line - 1)
    log_msg(LOG_DEBUG, "shared upload: could not send 100 Continue");
}

muster_err_t shared_upload_accept(http_req_t *r, const shared_put_t *put, fail_t *f) {
  head_t *h = r->head;
  shared_conn_t *c = conn_of(h, r->req);
  if (c == NULL || c->state != TAP_AWAIT)
    return fail_set(f, MUSTER_BAD_REQUEST,
                    "the body of this PUT could not be streamed; send it "
                    "with Content-Length or chunked, on an HTTP/1.1 connection");
  if (!c->pending.chunked && c->pending.left > (int64_t)h->cfg.max_blob_bytes)
    return fail_set(f, MUSTER_BODY_TOO_LARGE,
                    "the body is %" PRId64 " bytes; the head's "
                    "--max-blob-bytes is %zu",
                    c->pending.left, h->cfg.max_blob_bytes);
  shared_upload_t *up = calloc(1, sizeof *up);
  if (up == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  *up = (shared_upload_t){
      .conn = c, .head = h, .req = r->req, .put = *put, .fd = -1, .hash = XXH64_createState()};
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
  c->upload = up;
  c->frame = c->pending;
  c->state = TAP_UPLOAD;
  r->parked = true;
  evhttp_request_set_on_complete_cb(r->req, tap_reply_sent, c);
  if (c->expect)
    send_continue(c);
  bufferevent_set_max_single_read(c->bev, TAP_READ_MAX);
  bufferevent_enable(c->bev, EV_READ); /* evhttp stopped reading to handle the request */
  if (frame_empty(&c->frame))
    upload_body_done(c);
  else
    tap_release(c);
  return MUSTER_OK;
}

/* The upload's body is complete: stop reading and finish outside the tap. */
static void upload_body_done(shared_conn_t *c) {
  c->state = TAP_HOLD;
  bufferevent_disable(c->bev, EV_READ);
  if (c->upload)
    event_active(c->upload->finish_ev, EV_TIMEOUT, 0);
}

/* Makes the temp file durable under its final name. */
static muster_err_t upload_persist(shared_upload_t *up, fail_t *f) {
  char final[PATH_MAX + 64], dir[PATH_MAX + 16];
  shared_file_path(up->head->cfg.data_dir, up->file, final, sizeof final);
  snprintf(dir, sizeof dir, "%s/shared", up->head->cfg.data_dir);
  if (fsync(up->fd) != 0 || close(up->fd) != 0) {
    up->fd = -1;
    return fail_set(f, MUSTER_STORE, "cannot write %s: %s", up->tmp_path, strerror(errno));
  }
  up->fd = -1;
  if (rename(up->tmp_path, final) != 0)
    return fail_set(f, MUSTER_STORE, "cannot rename %s: %s", up->tmp_path, strerror(errno));
  up->tmp_path[0] = '\0';
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool synced = dfd >= 0 && fsync(dfd) == 0;
  if (dfd >= 0)
    close(dfd);
  if (!synced) {
    unlink(final);
    return fail_set(f, MUSTER_STORE, "cannot sync %s: %s", dir, strerror(errno));
  }
  return MUSTER_OK;
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
  bool ok =
      shared_check_scope_writable(st, lv->scope, f) == MUSTER_OK &&
      shared_commit(st, lv, (int64_t)up->head->cfg.shared_keep_levels, now_ms(), f) == MUSTER_OK;
  store_request_end(st, ok);
  if (!ok)
    return NULL;
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
    evhttp_add_header(evhttp_request_get_output_headers(up->req), "ETag", etag);
    log_msg(LOG_INFO, "shared data '%s' in scope '%s': level %lld, %lld bytes", lv.name, lv.scope,
            (long long)lv.level, (long long)lv.size);
    http_enqueue(up->head, up->req, 201, reply);
  } else {
    http_enqueue_fail(up->head, up->req, &f);
  }
  up->req = NULL;
  upload_free(up);
}

void shared_upload_abort_all(head_t *h) {
  for (shared_conn_t *c = h->shared_conns; c; c = c->next) {
    shared_upload_t *up = c->upload;
    if (up == NULL || up->req == NULL)
      continue;
    fail_t f;
    fail_set(&f, MUSTER_UNAVAILABLE, "the head is shutting down; upload again when it is back");
    http_enqueue_fail(h, up->req, &f);
    up->req = NULL;
    c->state = TAP_DROP;
    upload_free(up);
  }
}
