/*
 * h1.c — the head's HTTP/1.1 server (see h1.h for its contract).
 *
 * A connection owns one input buffer (bytes [in_off, in_len) are not parsed
 * yet) and a queue of its requests in arrival order.  Each request is one
 * allocation: the struct, its header table and a copy of its head, split in
 * place into NUL-terminated strings; a body of known length that fits goes in
 * the same block.  The read event stays armed (no epoll_ctl per request); the
 * write event is armed only while a reply does not fit in the socket.
 *
 * A connection's states:
 *
 *   HEAD     waiting for a request head
 *   BODY     reading the body of the last request, to dispatch it then
 *   STREAM   a streamed body: its bytes go to the handler's sink
 *   DISCARD  a streamed body nobody took: read and dropped
 *   IGNORE   the input is over (an error reply is queued, or the client waits
 *            for "100 Continue" that will not come): bytes are dropped, the
 *            connection closes after its last reply
 *
 * Connections are never freed inside a callback that may still use them:
 * h1_conn_kill marks one dead and the reap event frees it later in the turn,
 * orphaning the requests a handler still holds.
 */
#include "h1_internal.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "muster.h"

static const char h1_continue[] = "HTTP/1.1 100 Continue\r\n\r\n";

static void conn_resume(h1_conn_t *c);
static void conn_write(h1_conn_t *c);

static const struct {
  int status;
  const char *reason;
} h1_reasons[] = {
    {100, "Continue"},
    {200, "OK"},
    {201, "Created"},
    {204, "No Content"},
    {206, "Partial Content"},
    {304, "Not Modified"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {410, "Gone"},
    {413, "Payload Too Large"},
    {415, "Unsupported Media Type"},
    {416, "Range Not Satisfiable"},
    {422, "Unprocessable Content"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {501, "Not Implemented"},
    {503, "Service Unavailable"},
    {505, "HTTP Version Not Supported"},
};

static const char *h1_reason(int status) {
  for (size_t i = 0; i < sizeof h1_reasons / sizeof h1_reasons[0]; i++)
    if (h1_reasons[i].status == status)
      return h1_reasons[i].reason;
  return status >= 500 ? "Internal Server Error" : status >= 400 ? "Bad Request" : "OK";
}

/* The header lines every reply carries, formatted once a second: Date, and
 * the Server of the config (what answers at this URL), one copy per reply. */
static const char *h1_fixed(h1_server_t *s) {
  time_t now = time(NULL);
  if (now != s->date_sec) {
    struct tm tm;
    char date[40];
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    snprintf(s->fixed, sizeof s->fixed, "Date: %s\r\n%s%.40s%s", date,
             s->cfg.server ? "Server: " : "", s->cfg.server ? s->cfg.server : "",
             s->cfg.server ? "\r\n" : "");
    s->date_sec = now;
  }
  return s->fixed;
}

/* ---- requests ---- */

void h1_req_free(h1_req_t *q) {
  if (q == NULL)
    return;
  if (q->body_owned)
    free(q->body);
  free(q->extra);
  free(q->rbody);
  if (q->file_fd >= 0)
    close(q->file_fd);
  if (q->stream)
    h1_stream_free(q);
  if (q->on_free)
    q->on_free(q->free_arg);
  free(q);
}

/* Takes `q` off the server's orphans. */
static void orphan_remove(h1_server_t *s, h1_req_t *q) {
  for (h1_req_t **p = &s->orphans; *p; p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      return;
    }
}

const char *h1_method(const h1_req_t *q) {
  return q->method;
}
const char *h1_path(const h1_req_t *q) {
  return q->path;
}
const char *h1_query(const h1_req_t *q) {
  return q->query;
}
int64_t h1_length(const h1_req_t *q) {
  return q->length;
}

const char *h1_header(const h1_req_t *q, const char *name) {
  for (size_t i = 0; i < q->nhdrs; i++)
    if (strcasecmp(q->hdrs[i].name, name) == 0)
      return q->hdrs[i].value;
  return NULL;
}

bool h1_header_at(const h1_req_t *q, size_t i, const char **name, const char **value) {
  if (i >= q->nhdrs)
    return false;
  *name = q->hdrs[i].name;
  *value = q->hdrs[i].value;
  return true;
}

bool h1_peer(const h1_req_t *q, char *buf, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sslen = sizeof ss;
  if (q->conn == NULL || q->conn->dead ||
      getpeername(q->conn->fd, (struct sockaddr *)&ss, &sslen) != 0)
    return false;
  const void *addr = ss.ss_family == AF_INET6
                         ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                         : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
  return (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) &&
         inet_ntop(ss.ss_family, addr, buf, (socklen_t)len) != NULL;
}

const char *h1_body(const h1_req_t *q, size_t *len) {
  *len = q->body ? q->body_len : 0;
  return q->body_len ? q->body : NULL;
}

bool h1_gone(const h1_req_t *q) {
  return q->conn == NULL || q->conn->dead || q->conn->read_eof;
}

void h1_add_header(h1_req_t *q, const char *name, const char *value) {
  size_t add = strlen(name) + strlen(value) + 4;
  char *grown = realloc(q->extra, q->extra_len + add + 1);
  if (grown == NULL)
    return;
  q->extra = grown;
  q->extra_len += (size_t)snprintf(q->extra + q->extra_len, add + 1, "%s: %s\r\n", name, value);
}

/* Marks `c` to be written: now, or at the uncork. */
void h1_conn_dirty(h1_conn_t *c) {
  h1_server_t *s = c->srv;
  if (c->dead)
    return;
  if (s->corked == 0) {
    conn_write(c);
    return;
  }
  if (!c->dirty) {
    c->dirty = true;
    c->dirty_next = s->dirty;
    s->dirty = c;
  }
}

void h1_orphan_done(h1_req_t *q) {
  orphan_remove(q->srv, q);
  h1_req_free(q);
}

/* The Connection header of q's reply, when it needs one. */
static const char *req_connection(const h1_req_t *q) {
  return q->close ? "Connection: close\r\n" : q->http10 ? "Connection: keep-alive\r\n" : "";
}

/* The status line and headers of a reply with no Content-Type or no
 * Content-Length (a streamed one's, h1_req_head) into q->line; its length. */
static int req_head_framed(h1_req_t *q, int status, const char *type, int64_t len, bool no_body) {
  char ctype[128] = "", framing[64] = "";
  if (type && !no_body)
    snprintf(ctype, sizeof ctype, "Content-Type: %.100s\r\n", type);
  if (!no_body && len >= 0)
    snprintf(framing, sizeof framing, "Content-Length: %lld\r\n", (long long)len);
  else if (!no_body && !q->is_head && !q->http10)
    snprintf(framing, sizeof framing, "Transfer-Encoding: chunked\r\n");
  return snprintf(q->line, sizeof q->line, "HTTP/1.1 %d %s\r\n%s%s%s%s", status, h1_reason(status),
                  ctype, framing, h1_fixed(q->srv), req_connection(q));
}

void h1_req_head(h1_req_t *q, int status, const char *type, int64_t len) {
  bool no_body = status == 204 || status == 304 || status < 200;
  const char *conn = req_connection(q);
  int n;
  if (type == NULL || len < 0)
    n = req_head_framed(q, status, type, len, no_body);
  else if (no_body)
    n = snprintf(q->line, sizeof q->line, "HTTP/1.1 %d %s\r\n%s%s", status, h1_reason(status),
                 h1_fixed(q->srv), conn);
  else
    n = snprintf(q->line, sizeof q->line,
                 "HTTP/1.1 %d %s\r\nContent-Type: %.100s\r\nContent-Length: %lld\r\n%s%s", status,
                 h1_reason(status), type, (long long)len, h1_fixed(q->srv), conn);
  if (n < 0 || (size_t)n >= sizeof q->line)
    n = snprintf(q->line, sizeof q->line,
                 "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n"
                 "Connection: close\r\n");
  q->seg[0] = (struct iovec){q->line, (size_t)n};
  q->seg[1] = (struct iovec){q->extra, q->extra_len};
  q->seg[2] = (struct iovec){(void *)"\r\n", 2};
  q->nseg = 3;
  q->segi = 0;
}

void h1_req_count_out(h1_req_t *q, size_t bytes) {
  h1_conn_t *c = q->conn;
  if (c == NULL)
    return;
  c->out_bytes = c->out_bytes - q->out_left + bytes;
  q->out_left = bytes;
}

/* Counts the reply built in q->seg (status line, headers, a body in memory). */
static void req_count_segs(h1_req_t *q) {
  size_t bytes = 0;
  for (int i = q->segi; i < q->nseg; i++)
    bytes += q->seg[i].iov_len;
  h1_req_count_out(q, bytes);
}

void h1_expect_reply(h1_req_t *q, size_t bytes) {
  if (!q->done)
    h1_req_count_out(q, bytes);
}

bool h1_conn_may_read(const h1_conn_t *c) {
  return c->nq < H1_MAX_INFLIGHT / 2 && c->out_bytes < H1_OUT_HIGH / 2;
}

void h1_req_release(h1_req_t *q) {
  q->held = false;
  h1_conn_t *c = q->conn;
  if (c == NULL || c->holding != q)
    return;
  c->holding = NULL;
  conn_resume(c);
}

void h1_hold(h1_req_t *q) {
  if (q->conn != NULL && q->held)
    q->conn->holding = q;
}

void h1_set_note(h1_req_t *q, const void *note) {
  q->note = note;
}

const void *h1_note(const h1_req_t *q) {
  return q->note;
}

void h1_respond(h1_req_t *q, int status, const char *type, char *body, size_t len, bool newline) {
  h1_req_release(q);
  if (q->conn == NULL) {
    free(body);
    h1_orphan_done(q);
    return;
  }
  bool no_body = status == 204 || status == 304 || status < 200;
  h1_req_head(q, status, type ? type : "application/json", (int64_t)len + newline);
  if (q->is_head || no_body || body == NULL) {
    free(body);
  } else {
    q->rbody = body;
    q->seg[q->nseg++] = (struct iovec){body, len};
    if (newline)
      q->seg[q->nseg++] = (struct iovec){(void *)"\n", 1};
  }
  req_count_segs(q);
  q->done = true;
  h1_lend_add(q);
  h1_conn_dirty(q->conn);
}

void h1_respond_file(h1_req_t *q, int status, const char *type, int fd, int64_t len) {
  h1_req_release(q);
  if (q->conn == NULL) {
    close(fd);
    h1_orphan_done(q);
    return;
  }
  h1_req_head(q, status, type, len);
  if (q->is_head || len <= 0) {
    close(fd);
  } else {
    q->file_fd = fd;
    q->file_len = len;
  }
  req_count_segs(q);
  q->done = true;
  h1_lend_add(q);
  h1_conn_dirty(q->conn);
}

void h1_close_after(h1_req_t *q) {
  q->close = true;
}

void h1_on_free(h1_req_t *q, void (*fn)(void *arg), void *arg) {
  q->on_free = fn;
  q->free_arg = arg;
}

void h1_drop(h1_req_t *q) {
  h1_req_release(q);
  if (q->conn == NULL)
    h1_orphan_done(q);
  else
    h1_conn_kill(q->conn); /* the reap frees the request with its connection */
}

/* ---- writing ---- */

/* Collects the iovecs of what is ready at the front of the queue, in order:
 * a pending "100 Continue", then each built reply up to one with a file
 * (sendfile follows its headers) or one not built yet. */
int h1_conn_gather(h1_conn_t *c, struct iovec *iov) {
  int n = 0;
  bool first = true;
  for (h1_req_t *q = c->first; q && n < H1_MAX_IOV - H1_SEGS; q = q->next, first = false) {
    if (q->continue_pending && first) {
      iov[n++] =
          (struct iovec){(char *)h1_continue + c->cont_off, sizeof h1_continue - 1 - c->cont_off};
      break; /* its reply is not built while the body streams */
    }
    if (!q->done)
      break;
    for (int i = q->segi; i < q->nseg; i++) {
      if (q->seg[i].iov_len > 0)
        iov[n++] = q->seg[i];
    }
    if (q->stream) {
      n += h1_stream_gather(q, iov + n, H1_MAX_IOV - n);
      break; /* what follows waits for its end */
    }
    if (q->file_fd >= 0 || q->close)
      break;
  }
  return n;
}

/* Accounts up to *n written bytes (*n less what it took) against the status
 * line, headers and body in memory of c's front reply `q`; true when those
 * are all written. */
static bool req_advance_segs(h1_conn_t *c, h1_req_t *q, size_t *n) {
  while (q->segi < q->nseg) {
    struct iovec *v = &q->seg[q->segi];
    size_t take = *n < v->iov_len ? *n : v->iov_len;
    v->iov_base = (char *)v->iov_base + take;
    v->iov_len -= take;
    *n -= take;
    size_t counted = take < q->out_left ? take : q->out_left; /* a stream's head is not */
    q->out_left -= counted;
    c->out_bytes -= counted;
    if (v->iov_len > 0)
      return false;
    q->segi++;
  }
  return true;
}

/* Accounts `n` written bytes against the front of the queue, freeing the
 * replies written whole; returns false when the connection is to close. */
bool h1_conn_advance(h1_conn_t *c, size_t n) {
  while (c->first) {
    h1_req_t *q = c->first;
    if (q->continue_pending) {
      size_t left = sizeof h1_continue - 1 - c->cont_off;
      size_t take = n < left ? n : left;
      c->cont_off += take;
      n -= take;
      if (c->cont_off < sizeof h1_continue - 1)
        return true;
      q->continue_pending = false;
      c->cont_off = 0;
      c->read_ms = h1_now_ms(); /* the body's wait starts now (h1_timeout.c) */
      return true;
    }
    if (!q->done || !req_advance_segs(c, q, &n))
      return true;
    if (q->file_fd >= 0 && q->file_off < q->file_len)
      return true; /* sendfile's turn */
    if (q->stream && !h1_stream_advance(q, &n))
      return true; /* more of its body is to come, or to be sent */
    c->first = q->next;
    if (c->first == NULL)
      c->last = NULL;
    c->nq--;
    assert(q->out_left == 0); /* every byte counted was written */
    bool close_after = q->close;
    h1_req_free(q);
    if (close_after)
      return false;
  }
  return true;
}

/* Sends the file of the front reply; false on a socket error. */
static bool conn_sendfile(h1_conn_t *c, bool *blocked) {
  h1_req_t *q = c->first;
  while (q->file_off < q->file_len) {
    off_t off = (off_t)q->file_off;
    size_t want = (size_t)(q->file_len - q->file_off);
    ssize_t n = sendfile(c->fd, q->file_fd, &off, want > (1u << 30) ? (1u << 30) : want);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *blocked = true;
      return true;
    }
    if (n <= 0)
      return false; /* an error, or the file shrank: the reply cannot be completed */
    q->file_off += n;
    c->last_ms = h1_now_ms(); /* a long download is progress, not idleness */
  }
  close(q->file_fd);
  q->file_fd = -1;
  return true;
}

/* The front reply's next part when it is no writev (its headers are out):
 * a whole reply's file, a streamed reply's file piece, or the end of a
 * streamed body all written (nothing to write: the queue moves on).  1 when
 * that part was done (or the socket is full: *blocked), 0 when a writev is
 * next, -1 on a socket error. */
static int conn_write_part(h1_conn_t *c, bool *blocked) {
  h1_req_t *q = c->first;
  if (q == NULL || !q->done || q->segi < q->nseg)
    return 0;
  if (q->file_fd >= 0)
    return conn_sendfile(c, blocked) ? 1 : -1;
  if (q->stream && h1_stream_file_next(q))
    return h1_stream_sendfile(c, blocked) ? 1 : -1;
  return q->stream && h1_stream_over(q) ? 1 : 0;
}

/* Writes what is ready at the front of the queue until the socket would
 * block (*blocked) or nothing is ready; false when the connection was killed
 * or lingers. */
static bool conn_write_out(h1_conn_t *c, bool *blocked) {
  struct iovec iov[H1_MAX_IOV];
  while (!c->dead && !*blocked) {
    size_t wrote = 0;
    int part = conn_write_part(c, blocked);
    if (part == 0) {
      int n = h1_conn_gather(c, iov);
      if (n == 0)
        break;
      ssize_t w = writev(c->fd, iov, n);
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        *blocked = true;
        break;
      }
      part = w < 0 ? -1 : 1;
      c->last_ms = h1_now_ms();
      wrote = w < 0 ? 0 : (size_t)w;
    }
    if (part < 0) {
      h1_conn_kill(c);
      return false;
    }
    if (*blocked)
      continue;
    if (!h1_conn_advance(c, wrote)) {
      h1_conn_linger(c);
      return false;
    }
  }
  return !c->dead;
}

static void conn_write(h1_conn_t *c) {
  if (c->lent && !h1_lend_reclaim(c))
    return; /* h1_lend_return writes it */
  bool blocked = false;
  if (!conn_write_out(c, &blocked))
    return;
  if (blocked != c->writing) {
    c->writing = blocked;
    if (blocked)
      event_add(c->wev, NULL);
    else
      event_del(c->wev);
  }
  if (c->first == NULL && c->read_eof) {
    h1_conn_kill(c);
    return;
  }
  if (c->first == NULL && c->state == ST_IGNORE) {
    h1_conn_linger(c);
    return;
  }
  if (c->paused && c->holding == NULL && h1_conn_may_read(c))
    conn_resume(c);
}

void h1_conn_on_write(evutil_socket_t fd, short what, void *arg) {
  h1_conn_t *c = arg;
  (void)fd;
  (void)what;
  c->writing = false; /* the event is not persistent */
  conn_write(c);
}

void h1_cork(h1_server_t *s) {
  s->corked++;
}

void h1_uncork(h1_server_t *s) {
  if (--s->corked > 0)
    return;
  while (s->dirty) {
    h1_conn_t *c = s->dirty;
    s->dirty = c->dirty_next;
    c->dirty = false;
    conn_write(c);
  }
}

/* ---- connection life ---- */

void h1_conn_pause(h1_conn_t *c) {
  c->paused = true;
  event_del(c->rev);
}

/* Marks the connection dead; the reap event frees it later in the turn. */
void h1_conn_kill(h1_conn_t *c) {
  if (c->dead)
    return;
  c->dead = true;
  event_del(c->rev);
  event_del(c->wev);
  c->dead_next = c->srv->dead;
  c->srv->dead = c;
  event_active(c->srv->reap_ev, EV_TIMEOUT, 0);
}

/* The last reply is out and the connection is to close.  Closing at once
 * while the client is still sending (a body the head refused, requests
 * pipelined after "Connection: close") would reset the connection and could
 * destroy the reply before the client read it: stop writing, read and drop
 * what still comes for a moment, and close when the client does. */
void h1_conn_linger(h1_conn_t *c) {
  if (c->dead || c->lingering)
    return;
  if (c->reset || c->read_eof || c->paused || shutdown(c->fd, SHUT_WR) != 0) {
    h1_conn_kill(c);
    return;
  }
  c->lingering = true;
  c->state = ST_IGNORE;
  c->linger_ms = h1_now_ms() + 2000;
  if (c->writing)
    event_del(c->wev);
  c->writing = false;
}

void h1_req_orphan(h1_req_t *q) {
  h1_server_t *s = q->srv;
  h1_req_count_out(q, 0); /* its connection may live on (h1_timeout.c) */
  q->conn = NULL;
  q->next = s->orphans;
  s->orphans = q;
  if (q->stream)
    h1_stream_orphaned(q);
  h1_body_end(q, H1_BODY_GONE); /* last: its sink may answer the orphan, which frees it */
}

/* Frees a dead connection: held requests become orphans (a streamed one's
 * sink hears that the body is gone), the others are freed. */
static void conn_free(h1_conn_t *c) {
  h1_server_t *s = c->srv;
  h1_req_t *q = c->first;
  c->first = c->last = NULL;
  while (q) {
    h1_req_t *next = q->next;
    if (q->held)
      h1_req_orphan(q);
    else
      h1_req_free(q);
    q = next;
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  s->nconns--;
  event_free(c->rev);
  event_free(c->wev);
  if (c->deadline_ev)
    event_free(c->deadline_ev);
  if (c->reset) { /* a reset, not an end of stream the client could take for the body's */
    struct linger now = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &now, sizeof now);
  }
  close(c->fd);
  free(c->in);
  free(c);
}

void h1_reap(evutil_socket_t fd, short what, void *arg) {
  h1_server_t *s = arg;
  (void)fd;
  (void)what;
  while (s->dead) {
    h1_conn_t *c = s->dead;
    s->dead = c->dead_next;
    if (c->in_lend) {
      c->reap_lent = true; /* h1_lend_return puts it back */
      continue;
    }
    if (c->resuming) {
      for (h1_conn_t **p = &s->resume; *p; p = &(*p)->resume_next)
        if (*p == c) {
          *p = c->resume_next;
          break;
        }
    }
    if (c->dirty) { /* still on the dirty list: take it off first */
      for (h1_conn_t **p = &s->dirty; *p; p = &(*p)->dirty_next)
        if (*p == c) {
          *p = c->dirty_next;
          break;
        }
    }
    conn_free(c);
  }
}

/* ---- reading ---- */

/* Makes room for `want` more bytes at the end of the input. */
static bool conn_room(h1_conn_t *c, size_t want) {
  if (c->in_off > 0 && c->in_cap - c->in_len < want) {
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  if (c->in_cap - c->in_len >= want)
    return true;
  size_t cap = c->in_cap ? c->in_cap : 16384;
  while (cap - c->in_len < want)
    cap *= 2;
  char *grown = realloc(c->in, cap);
  if (grown == NULL)
    return false;
  c->in = grown;
  c->in_cap = cap;
  return true;
}

/* The client is done sending: what it sent whole is answered, then the
 * connection closes; a request cut short is dropped with it. */
static void conn_read_eof(h1_conn_t *c) {
  c->read_eof = true;
  event_del(c->rev);
  if ((c->state != ST_HEAD && c->state != ST_IGNORE) || c->first == NULL)
    h1_conn_kill(c);
}

/* One read from the socket, then the parse of what it brought. */
static void conn_read(h1_conn_t *c) {
  size_t want = c->state == ST_STREAM || c->state == ST_DISCARD ? H1_STREAM_READ : H1_READ_SIZE;
  if (c->state == ST_BODY && !c->frame.chunked) {
    size_t body = (size_t)c->last->length, have = c->in_len - c->in_off;
    if (body > have && body - have > want)
      want = body - have; /* the whole body in one buffer, read as it comes */
  }
  if (!conn_room(c, want < 4096 ? 4096 : want)) {
    h1_conn_kill(c);
    return;
  }
  ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      h1_conn_kill(c);
    return;
  }
  if (n == 0) {
    conn_read_eof(c);
    return;
  }
  c->in_len += (size_t)n;
  c->read_ms = c->last_ms = h1_now_ms();
  h1_conn_parse(c);
  if (c->holding && !c->dead && c->in_len - c->in_off > c->srv->cfg.max_head)
    h1_conn_pause(c); /* enough waits behind the parked request */
  if (c->in_off == c->in_len) {
    c->in_off = c->in_len = 0;
    if (c->in_cap > (1u << 20)) { /* a large body passed: give its memory back */
      free(c->in);
      c->in = NULL;
      c->in_cap = 0;
    }
  }
  h1_conn_watch(c);
}

void h1_conn_on_read(evutil_socket_t fd, short what, void *arg) {
  h1_conn_t *c = arg;
  h1_server_t *s = c->srv;
  (void)fd;
  (void)what;
  h1_cork(s);
  conn_read(c);
  h1_uncork(s);
}

/* Schedules `c` to read and parse again (it was paused, or held up by a
 * parked request), from an event of its own: never inside the callback that
 * made it possible, which may be in the middle of a commit. */
static void conn_resume(h1_conn_t *c) {
  if (c->dead || c->resuming)
    return;
  c->resuming = true;
  c->resume_next = c->srv->resume;
  c->srv->resume = c;
  event_active(c->srv->resume_ev, EV_READ, 0);
}

void h1_resume(evutil_socket_t fd, short what, void *arg) {
  h1_server_t *s = arg;
  (void)fd;
  (void)what;
  h1_cork(s);
  while (s->resume) {
    h1_conn_t *c = s->resume;
    s->resume = c->resume_next;
    c->resuming = false;
    if (c->dead || c->holding)
      continue;
    if (c->paused && !c->body_paused && h1_conn_may_read(c)) {
      c->paused = false;
      event_add(c->rev, NULL);
    }
    if (!c->paused && c->state == ST_HEAD && c->in_off < c->in_len)
      h1_conn_parse(c);
    h1_conn_watch(c);
  }
  h1_uncork(s);
}
