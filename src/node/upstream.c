/*
 * upstream.c — the node agent's HTTP/1.1 client to the head (upstream.h).
 *
 * Why not evhttp's client, which the agent used before: it sends a request
 * only whole (its body in one buffer, so an upload through the agent cost
 * its size in memory and went whole before the head could refuse it), it
 * cannot relay "Expect: 100-continue", and it sends only the methods it
 * knows.  This client writes whatever the owner queues, as it comes, and
 * hands the reply over as it is read (docs/design-notes.md, "The node
 * agent's client to the head").
 *
 * A connection is a libevent bufferevent on a socket to the head.  The
 * request's bytes go into its output buffer (the owner watches how much
 * waits: up_unsent, up_notify_drained); the reply is parsed out of its input
 * buffer: a status line and headers (interim 1xx replies skipped, a 100 told
 * to the owner), then a body by Content-Length, chunked, or to the close, or
 * none (a HEAD, 204, 304).  Reading pauses when the owner says so (up_read),
 * and what was read already waits in the input buffer meanwhile.
 *
 * When the head answers before it took the whole request (a refusal, then a
 * close) the write fails: the reply is read on all the same, so the owner
 * gets the head's answer rather than an error of its own.
 *
 * A connection with a request in flight is on the agent's busy list (so that
 * the stop reaches it, up_cancel_all); an idle one is in the pool, its read
 * armed, so that the head closing it (its idle timeout) frees it at once.  A
 * reply that is complete, on a connection both sides keep alive, after a
 * request sent whole, puts its connection back in the pool; anything else
 * closes it.  Callbacks may end the request (up_abort) while the reply is
 * being parsed: the connection is freed once the parse returns (`in_parse`,
 * `dead`).
 */
#include "node/upstream.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define UP_TIMEOUT_S 3600       /* no progress either way for this long: failed */
#define UP_MAX_HEAD (64 * 1024) /* a reply's status line and headers, at most */
#define UP_MAX_HEADERS 200      /* header lines of a reply, at most */
#define UP_IO_MAX (256 * 1024)  /* bytes one read or write of the socket moves */
#define UP_MAX_LINE 1024        /* a chunk-size line, at most */

typedef enum {
  UP_STATUS,     /* the status line */
  UP_HEADERS,    /* header lines, up to the empty one */
  UP_LENGTH,     /* a body of `left` bytes */
  UP_CHUNK_SIZE, /* a chunk-size line */
  UP_CHUNK_DATA, /* `left` bytes of a chunk */
  UP_CHUNK_END,  /* the CRLF after a chunk's data */
  UP_TRAILER,    /* trailer lines, up to the empty one */
  UP_TO_CLOSE,   /* a body that ends with the connection */
} up_state_t;

struct up_conn {
  node_agent_t *agent;
  struct bufferevent *bev;
  struct event *later;    /* deferred work: a failed open's end, a parse after up_read */
  up_conn_t *next, *prev; /* the agent's pool (idle) or busy list */
  bool pooled;            /* on the pool, else on the busy list */
  const up_handlers_t *h; /* the owner's; NULL: idle, or the request ended */
  void *arg;
  const char *fail_why; /* a failure to tell from `later` */
  bool head;            /* the request is a HEAD */
  bool sent;            /* the request is whole (up_sent) */
  bool reading;         /* the owner reads the reply (up_read) */
  bool connected, eof, write_failed, keep_alive;
  bool in_parse, dead;  /* a parse runs; free the connection when it returns */
  bool opening;         /* inside the connect call: a failure is told later */
  size_t drained_below; /* on_drained when fewer bytes wait; 0: not asked */
  up_state_t state;
  int64_t left;
  int status;
  size_t head_bytes; /* of the reply's head read so far */
  char *lines[UP_MAX_HEADERS];
  up_header_t headers[UP_MAX_HEADERS];
  size_t nheaders;
};

/* ---- lists ---- */

static up_conn_t **up_list(up_conn_t *c) {
  return (up_conn_t **)(c->pooled ? &c->agent->up_pool : &c->agent->up_busy);
}

static void up_list_add(up_conn_t *c, bool pooled) {
  c->pooled = pooled;
  up_conn_t **list = up_list(c);
  c->prev = NULL;
  c->next = *list;
  if (c->next)
    c->next->prev = c;
  *list = c;
}

static void up_list_remove(up_conn_t *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    *up_list(c) = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->next = c->prev = NULL;
}

/* ---- a connection's life ---- */

static void up_headers_clear(up_conn_t *c) {
  for (size_t i = 0; i < c->nheaders; i++)
    free(c->lines[i]);
  c->nheaders = 0;
  c->head_bytes = 0;
}

/* Out of line on purpose: inlined into up_parse, its free() made GCC's
 * -Wuse-after-free (-O2) flag the parse's reads of `c` after a step, which
 * cannot see that a close during the parse only marks `c` dead (in_parse)
 * and leaves the free to the parse's end. */
__attribute__((noinline)) static void up_free(up_conn_t *c) {
  up_list_remove(c);
  up_headers_clear(c);
  bufferevent_free(c->bev);
  event_free(c->later);
  free(c);
}

/* Frees `c` now, or once the parse running on it returns. */
static void up_close(up_conn_t *c) {
  c->h = NULL;
  if (c->in_parse)
    c->dead = true;
  else
    up_free(c);
}

/* Back to the pool, or closed when its byte stream cannot carry another
 * request. */
static void up_release(up_conn_t *c) {
  bool reusable = c->keep_alive && c->sent && !c->eof && !c->write_failed &&
                  evbuffer_get_length(bufferevent_get_input(c->bev)) == 0 && up_unsent(c) == 0;
  if (!reusable) {
    up_close(c);
    return;
  }
  up_list_remove(c);
  up_list_add(c, true);
  c->drained_below = 0;
  bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
  bufferevent_enable(c->bev, EV_READ); /* to see the head close it */
}

/* A failure the owner hears from its own event, not inside its call. */
static void up_fail_later(up_conn_t *c, const char *why) {
  c->fail_why = why;
  event_active(c->later, EV_TIMEOUT, 0);
}

/* The request ended: the owner hears it, then the connection is released
 * (complete) or closed (failed). */
static void up_finish(up_conn_t *c, const char *error) {
  const up_handlers_t *h = c->h;
  void *arg = c->arg;
  if (h == NULL)
    return;
  c->h = NULL;
  c->arg = NULL;
  h->on_end(arg, error);
  if (error == NULL)
    up_release(c);
  else
    up_close(c);
}

/* ---- the reply's head ---- */

static const char *up_header(const up_conn_t *c, const char *name) {
  for (size_t i = 0; i < c->nheaders; i++)
    if (strcasecmp(c->headers[i].name, name) == 0)
      return c->headers[i].value;
  return NULL;
}

/* The reply's framing from its headers into `r`; false when it is bad. */
static bool up_framing(up_conn_t *c, up_reply_t *r) {
  const char *te = up_header(c, "Transfer-Encoding");
  const char *length = up_header(c, "Content-Length");
  const char *connection = up_header(c, "Connection");
  if (connection && h1_list_has(connection, "close"))
    c->keep_alive = false;
  r->length = -1;
  if (length != NULL) {
    char *end = NULL;
    errno = 0;
    long long n = strtoll(length, &end, 10);
    if (length[0] < '0' || length[0] > '9' || *end != '\0' || errno != 0)
      return false;
    r->length = n;
  }
  r->no_body = c->head || c->status == 204 || c->status == 304;
  if (r->no_body) {
    c->state = UP_STATUS;
  } else if (te != NULL && h1_list_has(te, "chunked")) {
    c->state = UP_CHUNK_SIZE;
    r->length = -1;
  } else if (te == NULL && length != NULL) {
    c->state = UP_LENGTH;
    c->left = r->length;
  } else {
    c->state = UP_TO_CLOSE;
    c->keep_alive = false;
  }
  return true;
}

/* The head's empty line came: an interim reply is skipped (its 100 told),
 * a final one goes to the owner and its body follows. */
static void up_head_done(up_conn_t *c) {
  if (c->status < 200) {
    up_headers_clear(c);
    c->state = UP_STATUS;
    if (c->status == 100 && c->h->on_continue)
      c->h->on_continue(c->arg);
    return;
  }
  up_reply_t r = {.status = c->status, .headers = c->headers, .nheaders = c->nheaders};
  if (!up_framing(c, &r)) {
    up_finish(c, "invalid reply headers");
    return;
  }
  c->h->on_reply(c->arg, &r);
  up_headers_clear(c);
  if (c->h != NULL && (r.no_body || (c->state == UP_LENGTH && c->left == 0)))
    up_finish(c, NULL);
}

/* The status line "HTTP/1.x NNN reason"; false when it is not one. */
static bool up_status_line(up_conn_t *c, const char *line) {
  if (strncmp(line, "HTTP/1.", 7) != 0 || (line[7] != '0' && line[7] != '1') || line[8] != ' ')
    return false;
  const char *s = line + 9;
  if (s[0] < '1' || s[0] > '5' || s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' ||
      (s[3] != ' ' && s[3] != '\0'))
    return false;
  c->status = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
  c->keep_alive = line[7] == '1';
  return true;
}

/* One header line (NUL-terminated, owned) into the table; false when bad. */
static bool up_header_line(up_conn_t *c, char *line) {
  char *colon = strchr(line, ':');
  if (colon == NULL || colon == line || c->nheaders == UP_MAX_HEADERS) {
    free(line);
    return false;
  }
  *colon = '\0';
  char *value = colon + 1;
  value += strspn(value, " \t");
  size_t n = strlen(value);
  while (n > 0 && (value[n - 1] == ' ' || value[n - 1] == '\t'))
    value[--n] = '\0';
  c->lines[c->nheaders] = line;
  c->headers[c->nheaders++] = (up_header_t){line, value};
  return true;
}

/* One line of the reply's head; false when it needs more bytes or ended
 * the request. */
static bool up_step_head(up_conn_t *c, struct evbuffer *in) {
  size_t len;
  char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
  if (line == NULL) {
    if (c->head_bytes + evbuffer_get_length(in) > UP_MAX_HEAD)
      up_finish(c, "invalid reply headers");
    return false;
  }
  c->head_bytes += len + 2;
  if (c->state == UP_STATUS) {
    bool ok = up_status_line(c, line);
    free(line);
    c->state = UP_HEADERS;
    if (!ok)
      up_finish(c, "invalid reply headers");
    return ok;
  }
  if (len == 0) {
    free(line);
    up_head_done(c);
    return true;
  }
  if (c->head_bytes > UP_MAX_HEAD || !up_header_line(c, line)) {
    up_finish(c, "invalid reply headers");
    return false;
  }
  return true;
}

/* ---- the reply's body ---- */

/* Hands up to `most` bytes of the input to the owner, while it reads;
 * returns how many. */
static size_t up_deliver(up_conn_t *c, struct evbuffer *in, size_t most) {
  size_t took = 0;
  struct evbuffer_iovec v;
  while (took < most && c->h != NULL && c->reading && evbuffer_peek(in, -1, NULL, &v, 1) >= 1) {
    size_t n = v.iov_len < most - took ? v.iov_len : most - took;
    if (n == 0)
      break;
    c->h->on_body(c->arg, v.iov_base, n);
    evbuffer_drain(in, n);
    took += n;
  }
  return took;
}

/* A chunk-size line's value (extensions ignored); -1 when bad. */
static int64_t up_chunk_size(const char *line) {
  char *end = NULL;
  errno = 0;
  long long n = strtoll(line, &end, 16);
  if (end == line || errno != 0 || n < 0 || line[0] == '-' || line[0] == '+' ||
      (*end != '\0' && *end != ';' && *end != ' ' && *end != '\t'))
    return -1;
  return n;
}

/* One of the chunked body's lines (a size, a chunk's end, a trailer). */
static bool up_step_chunk_line(up_conn_t *c, struct evbuffer *in) {
  size_t len;
  char *line = evbuffer_readln(in, &len, EVBUFFER_EOL_CRLF);
  if (line == NULL) {
    if (evbuffer_get_length(in) > UP_MAX_LINE)
      up_finish(c, "invalid chunked reply");
    return false;
  }
  int64_t size = c->state == UP_CHUNK_SIZE ? up_chunk_size(line) : 0;
  bool bad = size < 0 || (c->state == UP_CHUNK_END && len != 0);
  free(line);
  if (bad) {
    up_finish(c, "invalid chunked reply");
    return false;
  }
  if (c->state == UP_CHUNK_SIZE) {
    c->state = size > 0 ? UP_CHUNK_DATA : UP_TRAILER;
    c->left = size;
  } else if (c->state == UP_CHUNK_END) {
    c->state = UP_CHUNK_SIZE;
  } else if (len == 0) { /* the trailer's end */
    up_finish(c, NULL);
  }
  return true;
}

/* Body bytes by length (of the body or a chunk), or to the close. */
static bool up_step_data(up_conn_t *c, struct evbuffer *in) {
  size_t have = evbuffer_get_length(in);
  if (have == 0 || !c->reading)
    return false;
  if (c->state == UP_TO_CLOSE)
    return up_deliver(c, in, have) > 0;
  size_t took = up_deliver(c, in, (uint64_t)c->left < have ? (size_t)c->left : have);
  c->left -= (int64_t)took;
  if (c->left > 0 || c->h == NULL)
    return took > 0;
  if (c->state == UP_LENGTH)
    up_finish(c, NULL);
  else
    c->state = UP_CHUNK_END;
  return true;
}

/* One step of the reply's parse; false when it needs more bytes, reading
 * paused, or the request ended. */
static bool up_step(up_conn_t *c, struct evbuffer *in) {
  switch (c->state) {
  case UP_STATUS:
  case UP_HEADERS:
    return up_step_head(c, in);
  case UP_CHUNK_SIZE:
  case UP_CHUNK_END:
  case UP_TRAILER:
    return up_step_chunk_line(c, in);
  default:
    return up_step_data(c, in);
  }
}

/* The head closed its side: a body to the close is complete; otherwise the
 * reply is cut (but for what waits while the owner does not read). */
static void up_at_eof(up_conn_t *c, struct evbuffer *in) {
  size_t have = evbuffer_get_length(in);
  if (have > 0 && !c->reading)
    return; /* read on at up_read */
  if (c->state == UP_TO_CLOSE && have == 0)
    up_finish(c, NULL);
  else
    up_finish(c, "connection refused or closed");
}

/* Parses what the input holds, as far as it goes. */
static void up_parse(up_conn_t *c) {
  struct evbuffer *in = bufferevent_get_input(c->bev);
  c->in_parse = true;
  while (c->h != NULL && up_step(c, in))
    ;
  if (c->h != NULL && c->eof)
    up_at_eof(c, in);
  c->in_parse = false;
  if (c->dead)
    up_free(c);
}

/* ---- events ---- */

static void up_on_read(struct bufferevent *bev, void *arg) {
  up_conn_t *c = arg;
  (void)bev;
  if (c->h == NULL) { /* bytes on an idle connection: nothing can follow them */
    up_close(c);
    return;
  }
  up_parse(c);
}

static void up_on_write(struct bufferevent *bev, void *arg) {
  up_conn_t *c = arg;
  (void)bev;
  if (c->h == NULL || c->drained_below == 0 || up_unsent(c) >= c->drained_below)
    return;
  c->drained_below = 0;
  bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
  c->h->on_drained(c->arg);
}

/* What went wrong, in the words the client reads after "cannot reach the
 * head at HOST:PORT: ". */
static const char *up_event_text(const up_conn_t *c, short what) {
  if (!c->connected)
    return "could not connect to it";
  if (what & BEV_EVENT_TIMEOUT)
    return "timed out";
  return "connection error";
}

static void up_on_event(struct bufferevent *bev, short what, void *arg) {
  up_conn_t *c = arg;
  (void)bev;
  if (what & BEV_EVENT_CONNECTED) {
    c->connected = true;
    return;
  }
  if (c->opening) { /* a failure inside the connect call: up_new returns first */
    up_fail_later(c, up_event_text(c, what));
    return;
  }
  if (c->h == NULL) { /* idle: the head closed it, or it failed */
    up_close(c);
    return;
  }
  if ((what & BEV_EVENT_ERROR) && (what & BEV_EVENT_WRITING) && c->connected) {
    /* The head answered early and closed: its answer may be in flight. */
    c->write_failed = true;
    evbuffer_drain(bufferevent_get_output(c->bev), up_unsent(c));
    return;
  }
  if (what & BEV_EVENT_EOF) {
    c->eof = true;
    up_parse(c);
    return;
  }
  up_finish(c, up_event_text(c, what));
}

static void up_on_later(evutil_socket_t fd, short what, void *arg) {
  up_conn_t *c = arg;
  (void)fd;
  (void)what;
  if (c->fail_why != NULL)
    up_finish(c, c->fail_why);
  else if (c->h != NULL)
    up_parse(c);
}

/* ---- opening ---- */

/* True when pooled connection `c` was closed by the head (not seen yet). */
static bool up_stale(const up_conn_t *c) {
  char byte;
  evutil_socket_t fd = bufferevent_getfd(c->bev);
  ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK); /* closed, or bytes unasked */
}

/* A new connection to the head, its connect begun; NULL when out of memory. */
static up_conn_t *up_new(node_agent_t *a) {
  up_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->agent = a;
  c->bev = bufferevent_socket_new(a->base, -1, BEV_OPT_CLOSE_ON_FREE);
  c->later = event_new(a->base, -1, 0, up_on_later, c);
  if (c->bev == NULL || c->later == NULL) {
    if (c->bev)
      bufferevent_free(c->bev);
    if (c->later)
      event_free(c->later);
    free(c);
    return NULL;
  }
  const struct timeval limit = {UP_TIMEOUT_S, 0};
  bufferevent_setcb(c->bev, up_on_read, up_on_write, up_on_event, c);
  bufferevent_set_timeouts(c->bev, &limit, &limit);
  bufferevent_set_max_single_read(c->bev, UP_IO_MAX);
  bufferevent_set_max_single_write(c->bev, UP_IO_MAX);
  bufferevent_enable(c->bev, EV_READ | EV_WRITE);
  up_list_add(c, false);
  /* The head's name is looked up (blocking, as evhttp's client did). */
  c->opening = true;
  if (bufferevent_socket_connect_hostname(c->bev, NULL, AF_UNSPEC, a->head_host, a->head_port) != 0)
    up_fail_later(c, "could not connect to it");
  c->opening = false;
  return c;
}

/* An idle connection from the pool (stale ones freed), or NULL. */
static up_conn_t *up_pool_take(node_agent_t *a) {
  up_conn_t *c;
  while ((c = a->up_pool) != NULL) {
    if (!up_stale(c)) {
      up_list_remove(c);
      up_list_add(c, false);
      return c;
    }
    up_free(c);
  }
  return NULL;
}

up_conn_t *up_open(node_agent_t *a, const up_handlers_t *h, void *arg, bool head) {
  up_conn_t *c = up_pool_take(a);
  if (c == NULL && (c = up_new(a)) == NULL)
    return NULL;
  c->h = h;
  c->arg = arg;
  c->head = head;
  c->sent = c->eof = c->write_failed = false;
  c->reading = true;
  c->state = UP_STATUS;
  c->drained_below = 0;
  return c;
}

/* ---- the request ---- */

void up_send(up_conn_t *c, const void *data, size_t len) {
  if (!c->write_failed && evbuffer_add(bufferevent_get_output(c->bev), data, len) != 0)
    up_fail_later(c, "out of memory");
}

void up_send_buffer(up_conn_t *c, struct evbuffer *buf) {
  if (c->write_failed)
    evbuffer_drain(buf, evbuffer_get_length(buf));
  else if (evbuffer_add_buffer(bufferevent_get_output(c->bev), buf) != 0)
    up_fail_later(c, "out of memory");
}

void up_sent(up_conn_t *c) {
  c->sent = true;
}

size_t up_unsent(const up_conn_t *c) {
  return evbuffer_get_length(bufferevent_get_output(c->bev));
}

void up_notify_drained(up_conn_t *c, size_t below) {
  c->drained_below = below;
  bufferevent_setwatermark(c->bev, EV_WRITE, below - 1, 0);
}

void up_read(up_conn_t *c, bool on) {
  c->reading = on;
  if (!on) {
    bufferevent_disable(c->bev, EV_READ);
    return;
  }
  bufferevent_enable(c->bev, EV_READ);
  if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0 || c->eof)
    event_active(c->later, EV_TIMEOUT, 0);
}

void up_abort(up_conn_t *c) {
  up_close(c);
}

/* ---- the agent's stop ---- */

void up_cancel_all(node_agent_t *a) {
  for (up_conn_t *c = a->up_busy, *next; c; c = next) {
    next = c->next; /* an owner's answer touches no other connection */
    const up_handlers_t *h = c->h;
    void *arg = c->arg;
    if (h == NULL || c->in_parse)
      continue;
    up_free(c);
    h->on_stop(arg);
  }
}

static void up_free_list(up_conn_t *c) {
  for (up_conn_t *next; c; c = next) {
    next = c->next;
    up_headers_clear(c);
    bufferevent_free(c->bev);
    event_free(c->later);
    free(c);
  }
}

void up_free_all(node_agent_t *a) {
  up_free_list(a->up_busy);
  a->up_busy = NULL;
  up_free_list(a->up_pool);
  a->up_pool = NULL;
}
