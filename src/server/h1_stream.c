/*
 * h1_stream.c — streamed bodies of the HTTP/1.1 server, both ways (see h1.h):
 * a request body handed to the handler's sink as it arrives, and a reply
 * whose body is given piece by piece after its headers (a proxy passing on a
 * reply as it comes, src/node/forward.c).
 *
 * A streamed reply is a list of pieces behind the request's status line and
 * headers: bytes in memory (copied, with their chunk framing when the body
 * is chunked) or a range of a file, sent with sendfile.  The connection's
 * writer takes them as it takes a whole reply's segments (h1.c: gather,
 * advance, sendfile); a streamed reply ends its connection's gather, so the
 * replies after it wait for its end, in request order.  Nothing here runs on
 * the head's hot path: a whole reply costs one test of `stream`.
 *
 * Backpressure is the producer's: h1_respond_full says when enough waits for
 * the client, and h1_respond_wait's callback, run from an event of its own
 * (never inside the writer, which may be inside the producer's own call),
 * when the client has read most of it or went away.
 */
#include "h1_internal.h"

#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <unistd.h>

#define H1_STREAM_LOW (H1_STREAM_HIGH / 4) /* h1_respond_wait's callback below this */

/* ---- streamed request bodies ---- */

static void body_unpause(h1_conn_t *c);

bool h1_body_pending(const h1_req_t *q, int64_t *length) {
  h1_conn_t *c = q->conn;
  if (c == NULL || !q->streamed || q->on_data != NULL || c->last != q || c->state != ST_DISCARD)
    return false;
  *length = c->frame.chunked ? -1 : c->frame.left;
  return true;
}

/* Gives the body of `q` to the sink; a client waiting for "100 Continue" gets
 * it now (`continue_now`) or at h1_body_continue. */
static void body_attach(h1_req_t *q, h1_body_data_fn data, h1_body_end_fn end, void *arg,
                        bool continue_now) {
  h1_conn_t *c = q->conn;
  int64_t length;
  if (!h1_body_pending(q, &length))
    return;
  if (h1_frame_empty(&c->frame)) {
    end(arg, H1_BODY_DONE);
    return;
  }
  q->on_data = data;
  q->on_end = end;
  q->sink = arg;
  c->state = ST_STREAM;
  if (q->expect_continue && !continue_now) {
    q->continue_deferred = true;
  } else if (q->expect_continue) {
    q->continue_pending = true;
    h1_conn_dirty(c);
  }
}

void h1_body_stream(h1_req_t *q, h1_body_data_fn data, h1_body_end_fn end, void *arg) {
  body_attach(q, data, end, arg, true);
}

void h1_body_relay(h1_req_t *q, h1_body_data_fn data, h1_body_end_fn end, void *arg) {
  body_attach(q, data, end, arg, false);
}

void h1_body_continue(h1_req_t *q) {
  if (!q->continue_deferred)
    return;
  q->continue_deferred = false;
  if (q->conn == NULL)
    return;
  q->continue_pending = true;
  h1_conn_dirty(q->conn);
}

/* Reads the connection of a sink's paused body again. */
static void body_unpause(h1_conn_t *c) {
  if (!c->body_paused)
    return;
  c->body_paused = false;
  c->paused = false;
  if (!c->dead && !c->read_eof && !c->lingering)
    event_add(c->rev, NULL);
}

void h1_body_pause(h1_req_t *q) {
  h1_conn_t *c = q->conn;
  if (c == NULL || c->dead || q->on_data == NULL || c->last != q)
    return;
  c->body_paused = true;
  h1_conn_pause(c);
}

void h1_body_resume(h1_req_t *q) {
  h1_conn_t *c = q->conn;
  if (c == NULL || !c->body_paused)
    return;
  body_unpause(c);
  h1_conn_watch(c);
}

void h1_body_refuse(h1_req_t *q) {
  h1_conn_t *c = q->conn;
  h1_body_detach(q);
  q->continue_deferred = false;
  if (c == NULL)
    return;
  q->close = true;
  if (q->continue_pending && c->first == q && c->cont_off == 0)
    q->continue_pending = false; /* not begun: it never goes */
  if (c->last == q && (c->state == ST_STREAM || c->state == ST_DISCARD))
    c->state = ST_IGNORE; /* what still comes is dropped until the close */
  body_unpause(c);
}

void h1_body_drop(h1_req_t *q, int64_t most) {
  h1_conn_t *c = q->conn;
  bool asked = q->continue_deferred ||
               (q->continue_pending && (c == NULL || c->first != q || c->cont_off == 0));
  if (c == NULL || asked || (!c->frame.chunked && c->frame.left > most)) {
    h1_body_refuse(q); /* not sent (a 100 that never went), or too much to drop */
    return;
  }
  h1_body_detach(q);
  if (c->last == q && c->state == ST_STREAM) {
    c->state = ST_DISCARD;
    c->frame.drop_left = most;
  }
  body_unpause(c);
}

void h1_body_detach(h1_req_t *q) {
  q->on_data = NULL;
  q->on_end = NULL;
  q->sink = NULL;
}

void h1_body_end(h1_req_t *q, h1_body_end_t how) {
  if (q && q->conn && how == H1_BODY_DONE)
    body_unpause(q->conn); /* the body is over: nothing is left to hold back */
  if (q && q->on_end) {
    h1_body_end_fn end = q->on_end;
    void *sink = q->sink;
    h1_body_detach(q);
    end(sink, how);
  }
}

/* ---- the ready callbacks ---- */

/* Takes `q` off the server's ready list. */
static void ready_unlist(h1_req_t *q) {
  h1_stream_t *st = q->stream;
  if (!st->ready_listed)
    return;
  for (h1_req_t **p = &q->srv->ready; *p; p = &(*p)->stream->ready_next)
    if (*p == q) {
      *p = st->ready_next;
      break;
    }
  st->ready_listed = false;
}

/* Schedules q's h1_respond_wait callback, if it has one. */
static void ready_schedule(h1_req_t *q) {
  h1_stream_t *st = q->stream;
  h1_server_t *s = q->srv;
  if (st->ready == NULL || st->ready_listed)
    return;
  st->ready_listed = true;
  st->ready_next = s->ready;
  s->ready = q;
  event_active(s->ready_ev, EV_TIMEOUT, 0);
}

void h1_stream_on_ready(evutil_socket_t fd, short what, void *arg) {
  h1_server_t *s = arg;
  (void)fd;
  (void)what;
  while (s->ready) {
    h1_req_t *q = s->ready;
    h1_stream_t *st = q->stream;
    s->ready = st->ready_next;
    st->ready_listed = false;
    void (*ready)(void *) = st->ready;
    st->ready = NULL;
    ready(st->ready_arg); /* may end the reply and free `q` */
  }
}

/* True when nobody will read more of q's reply. */
static bool stream_unread(const h1_req_t *q) {
  return q->conn == NULL || q->conn->dead;
}

void h1_stream_orphaned(h1_req_t *q) {
  ready_schedule(q);
}

void h1_stream_free(h1_req_t *q) {
  h1_stream_t *st = q->stream;
  ready_unlist(q);
  for (h1_piece_t *p = st->first, *next; p; p = next) {
    next = p->next;
    if (p->fd >= 0)
      close(p->fd);
    free(p);
  }
  free(st);
  q->stream = NULL;
}

/* ---- giving the body ---- */

void h1_respond_start(h1_req_t *q, int status, const char *type, int64_t length) {
  if (q->conn == NULL || q->stream != NULL)
    return; /* an orphan: its pieces are dropped and its end frees it */
  h1_stream_t *st = calloc(1, sizeof *st);
  if (st == NULL) {
    h1_conn_kill(q->conn); /* its end finds no stream; the reap frees it */
    return;
  }
  st->no_body = q->is_head || status == 204 || status == 304 || status < 200;
  st->chunked = !st->no_body && length < 0 && !q->http10;
  st->left = st->no_body ? -1 : length;
  if (!st->no_body && length < 0 && q->http10)
    q->close = true; /* the body ends with the connection */
  q->stream = st;
  h1_req_head(q, status, type, length);
  h1_req_count_out(q, 0); /* its body has a bound of its own (H1_STREAM_HIGH) */
  q->done = true;
  h1_conn_dirty(q->conn);
}

/* Appends piece `p` (its bytes not yet counted) to q's stream. */
static void stream_push(h1_stream_t *st, h1_piece_t *p) {
  p->next = NULL;
  if (st->last)
    st->last->next = p;
  else
    st->first = p;
  st->last = p;
  st->queued += (size_t)(p->end - p->off);
}

/* A piece holding `len` bytes of `data` (NULL: none, nothing copied) between
 * `before` and `after`; NULL when out of memory. */
static h1_piece_t *piece_bytes(const char *before, const void *data, size_t len,
                               const char *after) {
  size_t nb = strlen(before), na = strlen(after);
  h1_piece_t *p = malloc(sizeof *p + nb + len + na);
  if (p == NULL)
    return NULL;
  memcpy(p->bytes, before, nb);
  if (len)
    memcpy(p->bytes + nb, data, len);
  memcpy(p->bytes + nb + len, after, na);
  p->fd = -1;
  p->off = 0;
  p->end = (int64_t)(nb + len + na);
  return p;
}

/* Checks that `len` more bytes may go into q's body: false (the body broken)
 * when nobody reads it, it ended or they pass its length; *skip when they
 * are to be dropped (a reply without a body, or no bytes). */
static bool stream_admit(h1_req_t *q, int64_t len, bool *skip) {
  h1_stream_t *st = q->stream;
  *skip = true;
  if (st == NULL || st->ended || st->cut || stream_unread(q))
    return false;
  if (st->no_body || len == 0)
    return true;
  if (st->left >= 0 && len > st->left) {
    st->cut = true;
    return false;
  }
  *skip = false;
  return true;
}

bool h1_respond_data(h1_req_t *q, const void *data, size_t len) {
  bool skip;
  if (!stream_admit(q, (int64_t)len, &skip))
    return false;
  if (skip)
    return true;
  h1_stream_t *st = q->stream;
  char size[24] = "";
  if (st->chunked)
    snprintf(size, sizeof size, "%zx\r\n", len);
  h1_piece_t *p = piece_bytes(size, data, len, st->chunked ? "\r\n" : "");
  if (p == NULL) {
    st->cut = true;
    return false;
  }
  stream_push(st, p);
  if (st->left >= 0)
    st->left -= (int64_t)len;
  h1_conn_dirty(q->conn);
  return true;
}

bool h1_respond_data_file(h1_req_t *q, int fd, int64_t off, int64_t len) {
  bool skip;
  bool ok = stream_admit(q, len, &skip);
  if (!ok || skip) {
    close(fd);
    return ok;
  }
  h1_stream_t *st = q->stream;
  char size[24];
  snprintf(size, sizeof size, "%" PRIx64 "\r\n", (uint64_t)len);
  h1_piece_t *head = st->chunked ? piece_bytes(size, NULL, 0, "") : NULL;
  h1_piece_t *file = malloc(sizeof *file);
  h1_piece_t *tail = st->chunked ? piece_bytes("\r\n", NULL, 0, "") : NULL;
  if (file == NULL || (st->chunked && (head == NULL || tail == NULL))) {
    free(head);
    free(file);
    free(tail);
    close(fd);
    st->cut = true;
    return false;
  }
  *file = (h1_piece_t){.fd = fd, .off = off, .end = off + len};
  if (head)
    stream_push(st, head);
  stream_push(st, file);
  if (tail)
    stream_push(st, tail);
  if (st->left >= 0)
    st->left -= len;
  h1_conn_dirty(q->conn);
  return true;
}

bool h1_respond_full(const h1_req_t *q) {
  return q->stream != NULL && !stream_unread(q) && q->stream->queued >= H1_STREAM_HIGH;
}

void h1_respond_wait(h1_req_t *q, void (*ready)(void *arg), void *arg) {
  h1_stream_t *st = q->stream;
  if (st == NULL || st->ended)
    return;
  ready_unlist(q);
  st->ready = ready;
  st->ready_arg = arg;
  if (ready && (st->queued < H1_STREAM_LOW || stream_unread(q)))
    ready_schedule(q);
}

/* Ends q's reply: whole, or (`cut`) broken, closing its connection once what
 * was queued is written. */
static void stream_finish(h1_req_t *q, bool cut) {
  h1_stream_t *st = q->stream;
  h1_req_release(q);
  if (q->conn == NULL) {
    h1_orphan_done(q);
    return;
  }
  if (st == NULL || st->ended)
    return; /* its start failed: its connection was killed, the reap frees it */
  ready_unlist(q);
  st->ready = NULL;
  st->ended = true;
  cut = cut || st->cut || (!st->no_body && st->left > 0);
  h1_piece_t *last = !cut && st->chunked ? piece_bytes("0\r\n\r\n", NULL, 0, "") : NULL;
  if (last)
    stream_push(st, last);
  else if (!cut && st->chunked)
    cut = true; /* out of memory for the last chunk */
  if (cut) {
    st->cut = true;
    q->close = true;
    if (!st->no_body && !st->chunked && st->left < 0)
      q->conn->reset = true; /* its end of stream would read as the body's end */
  }
  h1_conn_dirty(q->conn);
}

void h1_respond_end(h1_req_t *q) {
  stream_finish(q, false);
}

void h1_respond_abort(h1_req_t *q) {
  stream_finish(q, true);
}

/* ---- writing the body (h1.c's writer) ---- */

int h1_stream_gather(h1_req_t *q, struct iovec *iov, int room) {
  int n = 0;
  for (h1_piece_t *p = q->stream->first; p && p->fd < 0 && n < room; p = p->next)
    iov[n++] = (struct iovec){p->bytes + p->off, (size_t)(p->end - p->off)};
  return n;
}

/* Frees the front piece of `st`, written whole. */
static void stream_pop(h1_stream_t *st) {
  h1_piece_t *p = st->first;
  st->first = p->next;
  if (st->first == NULL)
    st->last = NULL;
  if (p->fd >= 0)
    close(p->fd);
  free(p);
}

bool h1_stream_advance(h1_req_t *q, size_t *n) {
  h1_stream_t *st = q->stream;
  while (st->first && st->first->fd < 0 && *n > 0) {
    h1_piece_t *p = st->first;
    size_t take = (int64_t)*n < p->end - p->off ? *n : (size_t)(p->end - p->off);
    p->off += (int64_t)take;
    st->queued -= take;
    *n -= take;
    if (p->off == p->end)
      stream_pop(st);
  }
  if (st->queued < H1_STREAM_LOW)
    ready_schedule(q);
  return st->ended && st->first == NULL;
}

bool h1_stream_over(const h1_req_t *q) {
  return q->stream->ended && q->stream->first == NULL;
}

bool h1_stream_file_next(const h1_req_t *q) {
  return q->stream->first != NULL && q->stream->first->fd >= 0;
}

bool h1_stream_sendfile(h1_conn_t *c, bool *blocked) {
  h1_stream_t *st = c->first->stream;
  h1_piece_t *p = st->first;
  while (p->off < p->end) {
    off_t off = (off_t)p->off;
    size_t want = (size_t)(p->end - p->off);
    ssize_t n = sendfile(c->fd, p->fd, &off, want > (1u << 30) ? (1u << 30) : want);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *blocked = true;
      return true;
    }
    if (n <= 0)
      return false; /* an error, or the file is shorter than its piece */
    p->off += n;
    st->queued -= (size_t)n;
    c->last_ms = h1_now_ms();
  }
  stream_pop(st);
  return true;
}

bool h1_stream_waits_for_client(const h1_req_t *q) {
  return q->stream != NULL && q->stream->queued > 0 && q->conn != NULL && q->conn->writing;
}
