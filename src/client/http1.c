/*
 * http1.c — libmuster's own HTTP/1.1 transport for plain http:// heads.
 *
 * A call is one small JSON request and one reply on a kept-alive connection.
 * Through libcurl that cost about 33 µs of the caller's CPU and five system
 * calls (three polls, a send, a receive) per request on our benchmark machine,
 * as much as the head spent serving it; a worker and the head often share a
 * machine, so the client's CPU is the head's too.  This transport writes the
 * request with one sendmsg and reads the reply with as few recvs as it takes,
 * polling only when the socket has nothing yet (docs/design-notes.md, "The
 * client's own HTTP/1.1").  libcurl stays for everything else: https:// URLs,
 * anything this parser does not take, and shared-data transfers (shared.c).
 *
 * What it understands of HTTP/1.1 is what a muster head or a plain proxy in
 * front of it sends: a status line, headers, and a body framed by
 * Content-Length, chunked transfer coding, or the end of the connection;
 * interim 1xx replies are skipped.  A connection that was idle may have been
 * closed by the server in the meantime.  One idle for HTTP1_IDLE_CHECK_MS or
 * more is looked at before it is used (a peek: a closed one is replaced
 * without sending anything); when a request on a reused connection still
 * gets no byte of reply (the write fails, or the read finds the connection
 * closed), a GET, HEAD, PUT or DELETE is sent once more on a new connection,
 * as libcurl does.  A POST is not: the server may have done it and died (or
 * restarted) before replying, and sending it again could do it twice (a
 * batch of tasks put twice); the caller hears that it was sent and no reply
 * came.
 * A server may also answer before it has read the whole body (a 413 for one
 * over its limit) and close; the reply that came is then the answer.
 */
#include "client/client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HTTP1_HOST_MAX 256
#define HTTP1_HEAD_MAX (64 * 1024)   /* status line and headers of a reply */
#define HTTP1_BODY_MAX (1024L << 20) /* a reply body larger than this is refused */
#define HTTP1_READ_CHUNK 16384
/* A connection idle this long is peeked at before reuse (one recv): under
 * load connections are reused within milliseconds and pay nothing, and no
 * server closes an idle connection sooner (the head waits two minutes). */
#define HTTP1_IDLE_CHECK_MS 100

struct http1 {
  char host[HTTP1_HOST_MAX]; /* as getaddrinfo takes it: IPv6 without brackets */
  char port[8];
  char *prefix;       /* path of the base URL ("" usually), put before every path */
  char *fixed;        /* the header lines every request carries */
  int fd;             /* -1 while not connected */
  int64_t idle_since; /* when the last reply on `fd` ended (http1_now_ms) */
  client_buf_t out;   /* the request line and headers being sent */
  client_buf_t in;    /* bytes received and not yet consumed */
};

/* ---- setup ----------------------------------------------------------------- */

/* Splits "http://host[:port][/prefix]" into `h`; false for anything else
 * (another scheme, user info, a query), which libcurl then handles. */
static bool http1_parse_url(http1_t *h, const char *url) {
  if (strncasecmp(url, "http://", 7) != 0)
    return false;
  const char *host = url + 7, *end;
  if (*host == '[') { /* an IPv6 literal */
    end = strchr(host, ']');
    if (end == NULL)
      return false;
    host++;
  } else {
    end = host + strcspn(host, ":/?#@");
  }
  size_t host_len = (size_t)(end - host);
  if (host_len == 0 || host_len >= sizeof h->host)
    return false;
  memcpy(h->host, host, host_len);
  h->host[host_len] = '\0';
  const char *rest = *end == ']' ? end + 1 : end;
  snprintf(h->port, sizeof h->port, "80");
  if (*rest == ':') {
    size_t digits = strspn(rest + 1, "0123456789");
    if (digits == 0 || digits > 5 || atoi(rest + 1) > 65535)
      return false;
    memcpy(h->port, rest + 1, digits);
    h->port[digits] = '\0';
    rest += 1 + digits;
  }
  if (*rest != '\0' && *rest != '/')
    return false; /* user info, a query or a fragment: leave it to libcurl */
  if (strpbrk(rest, "?#@ \r\n") != NULL)
    return false;
  h->prefix = strdup(rest);
  return h->prefix != NULL;
}

http1_t *http1_new(const char *base_url, const char *token) {
  http1_t *h = calloc(1, sizeof *h);
  if (h == NULL)
    return NULL;
  h->fd = -1;
  if (!http1_parse_url(h, base_url)) {
    http1_free(h);
    return NULL;
  }
  bool v6 = strchr(h->host, ':') != NULL;
  const char *auth = token && token[0] ? token : NULL;
  int n = asprintf(&h->fixed,
                   "Host: %s%s%s:%s\r\nUser-Agent: libmuster/" MUSTER_VERSION
                   "\r\nAccept: application/json\r\n%s%s%s",
                   v6 ? "[" : "", h->host, v6 ? "]" : "", h->port,
                   auth ? "Authorization: Bearer " : "", auth ? auth : "", auth ? "\r\n" : "");
  if (n < 0) {
    h->fixed = NULL;
    http1_free(h);
    return NULL;
  }
  return h;
}

void http1_free(http1_t *h) {
  if (h == NULL)
    return;
  if (h->fd >= 0)
    close(h->fd);
  free(h->prefix);
  free(h->fixed);
  free(h->out.data);
  free(h->in.data);
  free(h);
}

static void http1_disconnect(http1_t *h) {
  if (h->fd >= 0)
    close(h->fd);
  h->fd = -1;
  h->in.len = 0;
}

/* ---- time and waiting ---------------------------------------------------------- */

static int64_t http1_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Closes the connection when it has been idle long enough to be worth a look
 * and the server has closed it (or sent something unasked, which would be
 * read as the next reply). */
static void http1_drop_if_closed(http1_t *h) {
  if (h->fd < 0 || http1_now_ms() - h->idle_since < HTTP1_IDLE_CHECK_MS)
    return;
  char c;
  ssize_t n = recv(h->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    http1_disconnect(h);
}

/* Waits until `fd` is ready for `events` or `deadline` (0: none) passes;
 * 1 ready, 0 timed out, -1 error (errno). */
static int http1_wait(int fd, short events, int64_t deadline) {
  for (;;) {
    int wait_ms = -1;
    if (deadline > 0) {
      int64_t left = deadline - http1_now_ms();
      if (left <= 0)
        return 0;
      wait_ms = left > 1000000000 ? 1000000000 : (int)left;
    }
    struct pollfd p = {.fd = fd, .events = events};
    int rc = poll(&p, 1, wait_ms);
    if (rc > 0)
      return 1;
    if (rc == 0)
      return 0;
    if (errno != EINTR)
      return -1;
  }
}

/* ---- connecting ------------------------------------------------------------------ */

/* Connects to one address before `deadline`; the socket, or -1 with errno set
 * (ETIMEDOUT when the deadline passed). */
static int http1_connect_one(const struct addrinfo *ai, int64_t deadline) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0)
    return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
    return fd;
  if (errno == EINPROGRESS) {
    int ready = http1_wait(fd, POLLOUT, deadline);
    int err = 0;
    socklen_t len = sizeof err;
    if (ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
      return fd;
    errno = ready == 0 ? ETIMEDOUT : err ? err : errno;
  }
  int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

/* Opens the connection; MUSTER_OK or MUSTER_NETWORK with `why` filled. */
static muster_err_t http1_connect(http1_t *h, int64_t deadline, char *why, size_t size) {
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
  struct addrinfo *found = NULL;
  int rc = getaddrinfo(h->host, h->port, &hints, &found);
  if (rc != 0) {
    snprintf(why, size, "could not resolve host %.200s: %s", h->host,
             rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    return MUSTER_NETWORK;
  }
  int err = 0;
  for (const struct addrinfo *ai = found; ai != NULL && h->fd < 0; ai = ai->ai_next) {
    h->fd = http1_connect_one(ai, deadline);
    err = errno;
    if (err == ETIMEDOUT)
      break;
  }
  freeaddrinfo(found);
  if (h->fd < 0) {
    snprintf(why, size, "could not connect to %.200s port %s: %s", h->host, h->port,
             err == ETIMEDOUT ? "timed out" : strerror(err));
    return MUSTER_NETWORK;
  }
  h->in.len = 0;
  return MUSTER_OK;
}

/* ---- one exchange ------------------------------------------------------------------- */

/* How the body of a reply ends. */
typedef enum { BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE, BODY_NONE } body_framing_t;

typedef struct {
  int status;
  body_framing_t framing;
  int64_t length;  /* BODY_LENGTH */
  bool keep_alive; /* the connection may carry the next request */
  size_t head_len; /* bytes of status line and headers, blank line included */
  unsigned said;   /* what its headers say of its sender (CLIENT_SAID_*) */
} reply_head_t;

/* The value of header line `line` (length `n`) when its name is `name`. */
static const char *http1_header(const char *line, size_t n, const char *name, size_t *value_len) {
  size_t name_len = strlen(name);
  if (n <= name_len || line[name_len] != ':' || strncasecmp(line, name, name_len) != 0)
    return NULL;
  const char *v = line + name_len + 1, *end = line + n;
  while (v < end && (*v == ' ' || *v == '\t'))
    v++;
  while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
    end--;
  *value_len = (size_t)(end - v);
  return v;
}

static bool http1_has_token(const char *v, size_t n, const char *token) {
  size_t t = strlen(token);
  for (size_t i = 0; i + t <= n; i++)
    if (strncasecmp(v + i, token, t) == 0 && (i == 0 || v[i - 1] == ' ' || v[i - 1] == ',') &&
        (i + t == n || v[i + t] == ' ' || v[i + t] == ',' || v[i + t] == ';'))
      return true;
  return false;
}

/* The status code of status line "HTTP/1.x NNN reason" or "HTTP/1.x NNN" at `p` (a head
 * of `head_len` bytes); -1 when it is not one. */
static int http1_status(const char *p, size_t head_len) {
  if (head_len < 14 || strncmp(p, "HTTP/1.", 7) != 0 || p[7] < '0' || p[7] > '9' || p[8] != ' ' ||
      p[9] < '1' || p[9] > '9' || p[10] < '0' || p[10] > '9' || p[11] < '0' || p[11] > '9' ||
      (p[12] != ' ' && p[12] != '\r'))
    return -1;
  return (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
}

/* Takes a Content-Length value into r->length; false when it is not a number, is over
 * HTTP1_BODY_MAX, or differs from one seen before (two lengths would smuggle a reply). */
static bool http1_content_length(const char *v, size_t vlen, reply_head_t *r) {
  int64_t len = 0;
  for (size_t i = 0; i < vlen; i++) {
    if (v[i] < '0' || v[i] > '9' || len > HTTP1_BODY_MAX)
      return false;
    len = len * 10 + (v[i] - '0');
  }
  if (vlen == 0 || (r->length >= 0 && r->length != len))
    return false;
  r->length = len;
  return true;
}

/* Parses the status line and headers in h->in (complete, `head_len` bytes);
 * false when they are not HTTP/1.x. */
static bool http1_parse_head(const http1_t *h, size_t head_len, bool head_request,
                             reply_head_t *r) {
  const char *p = h->in.data, *end = p + head_len;
  int status = http1_status(p, head_len);
  if (status < 0)
    return false;
  *r = (reply_head_t){.status = status,
                      .framing = BODY_CLOSE,
                      .length = -1,
                      .keep_alive = p[7] >= '1',
                      .head_len = head_len};
  bool chunked = false;
  const char *line = (const char *)memmem(p, head_len, "\r\n", 2) + 2;
  while (line < end - 2) {
    const char *eol = memmem(line, (size_t)(end - line), "\r\n", 2);
    size_t n = (size_t)(eol - line), vlen;
    const char *v;
    if ((v = http1_header(line, n, "Content-Length", &vlen)) != NULL) {
      if (!http1_content_length(v, vlen, r))
        return false;
    } else if ((v = http1_header(line, n, "Transfer-Encoding", &vlen)) != NULL) {
      chunked = http1_has_token(v, vlen, "chunked");
    } else if ((v = http1_header(line, n, "Connection", &vlen)) != NULL) {
      if (http1_has_token(v, vlen, "close"))
        r->keep_alive = false;
      else if (http1_has_token(v, vlen, "keep-alive"))
        r->keep_alive = true;
    } else {
      r->said |= client_header_said(line, n);
    }
    line = eol + 2;
  }
  if (head_request || status == 204 || status == 304 || status < 200)
    r->framing = BODY_NONE;
  else if (chunked)
    r->framing = BODY_CHUNKED;
  else if (r->length >= 0)
    r->framing = BODY_LENGTH;
  if (r->framing == BODY_CLOSE)
    r->keep_alive = false;
  return true;
}

/* Decodes the chunked body that starts at `at` in h->in into `body`.
 * 1: complete (*used = bytes consumed from `at`), 0: more bytes needed,
 * -1: malformed.  Decodes from the start each time it is called; replies in
 * chunks are rare (a proxy's doing), so this is not worth a state machine. */
static int http1_dechunk(const http1_t *h, size_t at, client_buf_t *body, size_t *used) {
  const char *p = h->in.data + at, *end = h->in.data + h->in.len;
  body->len = 0;
  for (;;) {
    const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    if (eol == NULL)
      return (end - p) > 1024 ? -1 : 0;
    char *stop;
    unsigned long long size = strtoull(p, &stop, 16);
    if (stop == p || (stop != eol && *stop != ';' && *stop != ' ') || size > HTTP1_BODY_MAX)
      return -1;
    p = eol + 2;
    if (size == 0) { /* trailers, then a blank line */
      for (;;) {
        eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (eol == NULL)
          return 0;
        bool blank = eol == p;
        p = eol + 2;
        if (blank) {
          *used = (size_t)(p - (h->in.data + at));
          return 1;
        }
      }
    }
    if ((size_t)(end - p) < size + 2)
      return 0;
    if (p[size] != '\r' || p[size + 1] != '\n' || body->len + size > HTTP1_BODY_MAX)
      return -1;
    if (!client_buf_append(body, p, size))
      return -1;
    p += size + 2;
  }
}

/* Reads more bytes into h->in: >0 read, 0 the server closed, -1 error
 * (errno; ETIMEDOUT when the deadline passed). */
static ssize_t http1_read(http1_t *h, int64_t deadline) {
  if (!client_buf_reserve(&h->in, HTTP1_READ_CHUNK)) {
    errno = ENOMEM;
    return -1;
  }
  for (;;) {
    ssize_t n = recv(h->fd, h->in.data + h->in.len, h->in.cap - h->in.len - 1, 0);
    if (n >= 0) {
      h->in.len += (size_t)n;
      h->in.data[h->in.len] = '\0';
      return n;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return -1;
    int ready = http1_wait(h->fd, POLLIN, deadline);
    if (ready <= 0) {
      if (ready == 0)
        errno = ETIMEDOUT;
      return -1;
    }
  }
}

/* Writes the request (the header lines in h->out, then `body`). */
static int http1_write(http1_t *h, const char *body, size_t body_len, int64_t deadline) {
  struct iovec iov[2] = {{h->out.data, h->out.len}, {(void *)body, body_len}};
  int count = body_len ? 2 : 1;
  struct iovec *at = iov;
  while (count > 0) {
    struct msghdr msg = {.msg_iov = at, .msg_iovlen = (size_t)count};
    ssize_t n = sendmsg(h->fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        return -1;
      int ready = http1_wait(h->fd, POLLOUT, deadline);
      if (ready <= 0) {
        if (ready == 0)
          errno = ETIMEDOUT;
        return -1;
      }
      continue;
    }
    while (count > 0 && (size_t)n >= at->iov_len) {
      n -= (ssize_t)at->iov_len;
      at++;
      count--;
    }
    if (count > 0) {
      at->iov_base = (char *)at->iov_base + n;
      at->iov_len -= (size_t)n;
    }
  }
  return 0;
}

/* Outcome of one attempt: done, or failed before any byte of the reply came
 * (worth a retry on a new connection when the connection was reused). */
typedef enum { EXCHANGE_DONE, EXCHANGE_FAILED, EXCHANGE_NO_REPLY } exchange_t;

/* The end of the reply's head ("\r\n\r\n") in what was read, or NULL; the
 * search starts a little before `scanned`, what earlier searches covered. */
static char *http1_head_end(const http1_t *h, size_t scanned) {
  if (h->in.len < 4)
    return NULL;
  size_t from = scanned > 3 ? scanned - 3 : 0;
  return memmem(h->in.data + from, h->in.len - from, "\r\n\r\n", 4);
}

/* Reads more of a reply's head (`*any`: some of it came already): DONE when
 * bytes came, else why not. */
static exchange_t http1_read_head_more(http1_t *h, int64_t deadline, bool *any, char *why,
                                       size_t size) {
  if (h->in.len > HTTP1_HEAD_MAX) {
    snprintf(why, size, "the reply's headers are larger than %d bytes", HTTP1_HEAD_MAX);
    return EXCHANGE_FAILED;
  }
  ssize_t n = http1_read(h, deadline);
  if (n > 0) {
    *any = true;
    return EXCHANGE_DONE;
  }
  int err = n == 0 ? 0 : errno;
  bool closed = n == 0 || err == ECONNRESET;
  if (closed)
    snprintf(why, size, "the server closed the connection %s",
             *any ? "in the middle of its reply" : "without replying");
  else
    snprintf(why, size, "%s", err == ETIMEDOUT ? "timed out waiting for the reply" : strerror(err));
  return !*any && closed ? EXCHANGE_NO_REPLY : EXCHANGE_FAILED;
}

/* Reads the reply's status line and headers into *r, passing over interim
 * replies (100 Continue, say: the real one follows). */
static exchange_t http1_read_head(http1_t *h, bool head_request, int64_t deadline, reply_head_t *r,
                                  char *why, size_t size) {
  bool any = false;
  size_t scanned = 0;
  for (;;) {
    char *blank;
    while ((blank = http1_head_end(h, scanned)) == NULL) {
      scanned = h->in.len;
      exchange_t got = http1_read_head_more(h, deadline, &any, why, size);
      if (got != EXCHANGE_DONE)
        return got;
    }
    if (!http1_parse_head(h, (size_t)(blank + 4 - h->in.data), head_request, r)) {
      snprintf(why, size, "not an HTTP/1.x reply: %.60s", h->in.data);
      return EXCHANGE_FAILED;
    }
    if (r->status >= 200)
      return EXCHANGE_DONE;
    memmove(h->in.data, h->in.data + r->head_len, h->in.len - r->head_len + 1);
    h->in.len -= r->head_len;
    scanned = 0;
  }
}

/* Reads until the body framed by `r` is complete; *used: its length (a
 * chunked body is decoded into the client's reply meanwhile). */
static exchange_t http1_read_body(muster_client_t *client, const reply_head_t *r, int64_t deadline,
                                  size_t *used, char *why, size_t size) {
  http1_t *h = client->http1;
  for (*used = 0;;) {
    size_t have = h->in.len - r->head_len;
    int complete = r->framing == BODY_NONE;
    if (r->framing == BODY_LENGTH) {
      complete = have >= (size_t)r->length;
      *used = (size_t)r->length;
    } else if (r->framing == BODY_CHUNKED) {
      complete = http1_dechunk(h, r->head_len, &client->reply, used);
      if (complete < 0) {
        snprintf(why, size, "a malformed chunked reply");
        return EXCHANGE_FAILED;
      }
    }
    if (complete)
      return EXCHANGE_DONE;
    if (r->framing == BODY_CLOSE && have > (size_t)HTTP1_BODY_MAX) {
      snprintf(why, size, "the reply's body is too large");
      return EXCHANGE_FAILED;
    }
    ssize_t n = http1_read(h, deadline);
    if (n == 0 && r->framing == BODY_CLOSE) {
      *used = h->in.len - r->head_len;
      return EXCHANGE_DONE;
    }
    if (n <= 0) {
      snprintf(why, size, "%s",
               n == 0               ? "the server closed the connection in the middle of its reply"
               : errno == ETIMEDOUT ? "timed out waiting for the reply"
                                    : strerror(errno));
      return EXCHANGE_FAILED;
    }
  }
}

/* Reads one whole reply into client->reply / client->status. */
static exchange_t http1_read_reply(muster_client_t *client, bool head_request, int64_t deadline,
                                   char *why, size_t size) {
  http1_t *h = client->http1;
  reply_head_t r;
  size_t used;
  exchange_t got = http1_read_head(h, head_request, deadline, &r, why, size);
  if (got != EXCHANGE_DONE)
    return got;
  if (r.framing == BODY_LENGTH && r.length > HTTP1_BODY_MAX) {
    snprintf(why, size, "the reply's body (%lld bytes) is too large", (long long)r.length);
    return EXCHANGE_FAILED;
  }
  if ((got = http1_read_body(client, &r, deadline, &used, why, size)) != EXCHANGE_DONE)
    return got;
  if (r.framing == BODY_NONE)
    used = 0;
  if (r.framing != BODY_CHUNKED) {
    client->reply.len = 0;
    if (!client_buf_append(&client->reply, h->in.data + r.head_len, used)) {
      snprintf(why, size, "out of memory while reading the reply");
      return EXCHANGE_FAILED;
    }
  }
  client->status = r.status;
  client->server = client_server_of(r.said);
  /* Bytes past the reply would be a reply to nothing: start afresh then. */
  if (!r.keep_alive || r.head_len + used != h->in.len)
    http1_disconnect(h);
  h->in.len = 0;
  h->idle_since = http1_now_ms();
  return EXCHANGE_DONE;
}

/* Writes the request line and headers into h->out, without printf: this
 * runs per request.  False when out of memory. */
static bool http1_request_head(http1_t *h, const char *method, const char *path, bool wants_body,
                               size_t body_len) {
  char length[24];
  size_t length_len = 0;
  if (wants_body) {
    char digits[24];
    size_t d = 0, v = body_len;
    do
      digits[d++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    while (d > 0)
      length[length_len++] = digits[--d];
  }
  static const char type[] = "Content-Type: application/json\r\nContent-Length: ";
  const struct {
    const char *text;
    size_t len;
  } parts[] = {
      {method, strlen(method)},
      {" ", 1},
      {h->prefix, strlen(h->prefix)},
      {path, strlen(path)},
      {" HTTP/1.1\r\n", 11},
      {h->fixed, strlen(h->fixed)},
      {type, wants_body ? sizeof type - 1 : 0},
      {length, length_len},
      {"\r\n", wants_body ? 2 : 0},
      {"\r\n", 2},
  };
  h->out.len = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (!client_buf_append(&h->out, parts[i].text, parts[i].len))
      return false;
  return true;
}

/* One attempt on the open connection: the request in h->out and `body`
 * written, its reply read. */
static exchange_t http1_exchange(muster_client_t *client, const char *method, const char *body,
                                 size_t body_len, int64_t deadline, char *why, size_t size) {
  http1_t *h = client->http1;
  if (http1_write(h, body, body_len, deadline) == 0)
    return http1_read_reply(client, strcmp(method, "HEAD") == 0, deadline, why, size);
  int e = errno;
  snprintf(why, size, "%s", e == ETIMEDOUT ? "timed out sending the request" : strerror(e));
  if (e != EPIPE && e != ECONNRESET)
    return EXCHANGE_FAILED;
  /* A server may answer before it has read the whole body (413 for one over
   * its limit) and close: that reply, if it came, is the answer. */
  char late[400];
  return http1_read_reply(client, false, deadline, late, sizeof late) == EXCHANGE_DONE
             ? EXCHANGE_DONE
             : EXCHANGE_NO_REPLY;
}

muster_err_t http1_send(muster_client_t *client, const char *method, const char *path,
                        const char *body, long timeout_ms) {
  http1_t *h = client->http1;
  int64_t deadline = timeout_ms > 0 ? http1_now_ms() + timeout_ms : 0;
  bool wants_body = body != NULL || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0;
  size_t body_len = body ? strlen(body) : 0;
  if (!http1_request_head(h, method, path, wants_body, body_len))
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  char why[400] = "", lost[400] = "";
  http1_drop_if_closed(h);
  bool resend = strcmp(method, "POST") != 0;
  for (int attempt = 0; attempt < 2; attempt++) {
    bool reused = h->fd >= 0;
    if (!reused && http1_connect(h, deadline, why, sizeof why) != MUSTER_OK) {
      /* The retry of a request sent on a reused connection: that request may
       * have reached the server, and the message must keep saying so. */
      if (lost[0]) {
        char again[sizeof why];
        snprintf(again, sizeof again, "%s", why);
        snprintf(why, sizeof why, "%.170s; sending it again failed: %.190s", lost, again);
      }
      break;
    }
    exchange_t got = http1_exchange(client, method, body, body_len, deadline, why, sizeof why);
    if (got == EXCHANGE_DONE)
      return MUSTER_OK;
    http1_disconnect(h);
    if (got == EXCHANGE_FAILED || !reused || !resend)
      break;
    snprintf(lost, sizeof lost, "%s", why);
  }
  client->status = 0;
  client->reply.len = 0;
  if (client->reply.data)
    client->reply.data[0] = '\0';
  return client_fail(client, MUSTER_NETWORK, "%s %s%s: %s", method, client->base_url, path, why);
}
