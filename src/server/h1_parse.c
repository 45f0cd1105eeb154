/*
 * h1_parse.c — the reading half of the head's HTTP/1.1 server: request heads
 * parsed in place, body framing (Content-Length, chunked), the admission of
 * requests that wait for "100 Continue", and the parse loop that dispatches
 * every complete request of a read.  Errors found here are answered by the
 * server itself in the JSON envelope, and the connection closes after them.
 */
#include "h1_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "muster.h"

/* ---- errors found on the wire ---- */

/* Appends `q` to the connection's queue. */
static void queue_push(h1_conn_t *c, h1_req_t *q) {
  if (c->last)
    c->last->next = q;
  else
    c->first = q;
  c->last = q;
  c->nq++;
}

h1_req_t *h1_queue_pop_last(h1_conn_t *c) {
  h1_req_t *q = c->last, *prev = NULL;
  for (h1_req_t *r = c->first; r != q; r = r->next)
    prev = r;
  if (prev)
    prev->next = NULL;
  else
    c->first = NULL;
  c->last = prev;
  c->nq--;
  return q;
}

/* Removes and frees the last request, read but not dispatched yet. */
static void queue_drop_last(h1_conn_t *c) {
  h1_req_free(h1_queue_pop_last(c));
}

void h1_conn_fail(h1_conn_t *c, int status, muster_err_t code, const char *message) {
  c->srv->wire_errors++;
  h1_req_t *q = calloc(1, sizeof *q);
  char *body = malloc(512);
  c->state = ST_IGNORE;
  if (q == NULL || body == NULL) {
    free(q);
    free(body);
    h1_conn_kill(c);
    return;
  }
  q->srv = c->srv;
  q->conn = c;
  q->file_fd = -1;
  q->close = true;
  int n = snprintf(body, 512, "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}",
                   muster_err_name(code), message);
  queue_push(c, q);
  h1_respond(q, status, "application/json", body, (size_t)n, true);
}

/* ---- parsing ---- */

static bool is_token_char(unsigned char ch) {
  return ch > 32 && ch < 127 && strchr("()<>@,;:\\\"/[]?={}", ch) == NULL;
}

/* True when the bytes of a request head received so far cannot begin a
 * request line (a method of token characters up to 16 long, then a space):
 * a TLS handshake sent to this plain-HTTP server, say, which would otherwise
 * wait for a line end until the head's deadline.  Empty lines before the
 * request line are allowed (RFC 9112, 2.2). */
static bool head_start_bad(const h1_conn_t *c) {
  const char *p = c->in + c->in_off, *end = c->in + c->in_len;
  while (p < end && (*p == '\r' || *p == '\n'))
    p++;
  for (size_t n = 0; p < end && *p != ' '; p++, n++)
    if (n >= 16 || !is_token_char((unsigned char)*p))
      return true;
  return false;
}

/* Where the head starting at in+off ends (the byte after its empty line), or
 * 0 when it is not complete yet. */
static size_t head_end(h1_conn_t *c) {
  const char *p = c->in + c->in_off;
  size_t len = c->in_len - c->in_off;
  for (size_t i = c->head_scan; i < len; i++) {
    const char *nl = memchr(p + i, '\n', len - i);
    if (nl == NULL)
      break;
    i = (size_t)(nl - p);
    if (i + 1 < len && p[i + 1] == '\n')
      return i + 2;
    if (i + 2 < len && p[i + 1] == '\r' && p[i + 2] == '\n')
      return i + 3;
    if (i + 2 >= len) {
      c->head_scan = i; /* the next line's start is not here yet */
      return 0;
    }
  }
  c->head_scan = len;
  return 0;
}

/* Cuts the line starting at *p (ending in LF, CR LF) in place; returns it, or
 * NULL at the end. */
static char *next_line(char **p, char *end) {
  if (*p >= end)
    return NULL;
  char *line = *p, *nl = memchr(line, '\n', (size_t)(end - line));
  if (nl == NULL)
    nl = end;
  *p = nl + 1;
  if (nl > line && nl[-1] == '\r')
    nl--;
  *nl = '\0';
  return line;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t')
    s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
    s[--n] = '\0';
  return s;
}

bool h1_list_has(const char *value, const char *token) {
  size_t tlen = strlen(token);
  for (const char *p = value; *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',')
      p++;
    size_t n = strcspn(p, ",");
    size_t m = n;
    while (m > 0 && (p[m - 1] == ' ' || p[m - 1] == '\t'))
      m--;
    if (m == tlen && strncasecmp(p, token, tlen) == 0)
      return true;
    p += n;
  }
  return false;
}

/* Takes the request target: the path (of an absolute form too) and the
 * query, without a fragment; false with the failure queued. */
static bool parse_target(h1_conn_t *c, h1_req_t *q, char *target) {
  if (strncasecmp(target, "http://", 7) == 0) { /* absolute form: the path starts after the host */
    target = strchr(target + 7, '/');
    if (target == NULL)
      target = (char *)"/";
  }
  if (target[0] != '/') {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request target must be a path starting with '/'");
    return false;
  }
  for (const char *t = target; *t; t++)
    if ((unsigned char)*t <= 32 || *t == 127) {
      h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request target holds a control character");
      return false;
    }
  char *hash = strchr(target, '#');
  if (hash)
    *hash = '\0';
  char *query = strchr(target, '?');
  if (query)
    *query++ = '\0';
  q->path = target;
  q->query = query;
  return true;
}

/* The request line: method, target (path and query) and version. */
static bool parse_request_line(h1_conn_t *c, h1_req_t *q, char *line) {
  char *sp1 = strchr(line, ' ');
  char *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (sp1 == NULL || sp2 == NULL || strchr(sp2 + 1, ' ') != NULL) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request line must be 'METHOD /path HTTP/1.1'");
    return false;
  }
  *sp1 = *sp2 = '\0';
  char *target = sp1 + 1, *version = sp2 + 1;
  bool token = sp1 > line && sp1 - line <= 16;
  for (const char *m = line; token && *m; m++)
    token = is_token_char((unsigned char)*m);
  if (!token || *target == '\0') {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request line must be 'METHOD /path HTTP/1.1'");
    return false;
  }
  if (strncmp(version, "HTTP/", 5) != 0) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request line must end in HTTP/1.1 or HTTP/1.0");
    return false;
  }
  if (strcmp(version + 5, "1.1") != 0 && strcmp(version + 5, "1.0") != 0) {
    h1_conn_fail(c, 505, MUSTER_BAD_REQUEST, "this server speaks HTTP/1.1 and HTTP/1.0");
    return false;
  }
  q->http10 = version[7] == '0';
  q->method = line;
  q->is_head = strcmp(line, "HEAD") == 0;
  return parse_target(c, q, target);
}

/* One header line into q's table; false with the failure queued. */
static bool parse_header(h1_conn_t *c, h1_req_t *q, char *line) {
  if (line[0] == ' ' || line[0] == '\t') {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "folded header lines are not accepted");
    return false;
  }
  char *colon = strchr(line, ':');
  bool token = colon != NULL && colon > line;
  for (const char *n = line; token && n < colon; n++)
    token = is_token_char((unsigned char)*n);
  if (!token) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "a header line must be 'Name: value'");
    return false;
  }
  *colon = '\0';
  q->hdrs[q->nhdrs++] = (h1_hdr_t){line, trim(colon + 1)};
  return true;
}

/* Takes one Content-Length header: one decimal number, the same in each
 * copy; false with the failure queued. */
static bool framing_length(h1_conn_t *c, h1_req_t *q, const char *value, bool *has_length) {
  char *end;
  errno = 0;
  long long v = strtoll(value, &end, 10);
  if (value[0] < '0' || value[0] > '9' || *end != '\0' || errno != 0 ||
      (*has_length && v != q->length)) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "Content-Length must be one decimal number");
    return false;
  }
  q->length = v;
  *has_length = true;
  return true;
}

/* Checks the framing the headers chose (TE is the Transfer-Encoding, or
 * NULL) and that an HTTP/1.1 request names its Host. */
static bool framing_check(h1_conn_t *c, h1_req_t *q, const char *te, bool has_length) {
  if (te != NULL) {
    if (has_length) {
      h1_conn_fail(c, 400, MUSTER_BAD_REQUEST,
                   "send Content-Length or Transfer-Encoding, not both");
      return false;
    }
    if (strcasecmp(te, "chunked") != 0) {
      h1_conn_fail(c, 501, MUSTER_BAD_REQUEST, "the only Transfer-Encoding taken is chunked");
      return false;
    }
    q->length = -1;
  }
  if (!q->http10 && h1_header(q, "Host") == NULL) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "an HTTP/1.1 request needs a Host header");
    return false;
  }
  if (q->http10 && q->length < 0) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "HTTP/1.0 has no chunked bodies");
    return false;
  }
  return true;
}

/* Reads the body framing and connection headers; false with the failure queued. */
static bool parse_framing(h1_conn_t *c, h1_req_t *q) {
  q->length = 0;
  q->keep_alive = !q->http10;
  bool has_length = false;
  const char *te = NULL;
  for (size_t i = 0; i < q->nhdrs; i++) {
    const char *name = q->hdrs[i].name, *value = q->hdrs[i].value;
    if (strcasecmp(name, "Content-Length") == 0) {
      if (!framing_length(c, q, value, &has_length))
        return false;
    } else if (strcasecmp(name, "Transfer-Encoding") == 0) {
      te = value;
    } else if (strcasecmp(name, "Connection") == 0) {
      if (h1_list_has(value, "close"))
        q->keep_alive = false;
      else if (h1_list_has(value, "keep-alive"))
        q->keep_alive = true;
    } else if (strcasecmp(name, "Expect") == 0) {
      q->expect_continue = strcasecmp(value, "100-continue") == 0;
    }
  }
  if (!framing_check(c, q, te, has_length))
    return false;
  q->close = !q->keep_alive;
  return true;
}

/* True when the `len` bytes of a head hold no NUL and no CR but before a
 * line's LF.  RFC 9110 (5.5) has a server refuse either in a header value or
 * blank it: kept, a NUL would cut the value short here unseen (a token sent
 * as "TOKEN\0junk" read as TOKEN), where a proxy in front of the head may
 * read the line whole. */
static bool head_bytes_clean(const char *p, size_t len) {
  if (memchr(p, '\0', len) != NULL)
    return false;
  for (const char *cr = p; (cr = memchr(cr, '\r', (size_t)(p + len - cr))) != NULL; cr++)
    if (cr + 1 == p + len || cr[1] != '\n')
      return false;
  return true;
}

/* Parses the complete head of `len` bytes at the input's front into a new
 * request at the end of the queue; NULL with an error reply queued instead.
 * One allocation holds the request, its header table and its head. */
static h1_req_t *parse_head(h1_conn_t *c, size_t len) {
  const char *src = c->in + c->in_off;
  size_t lines = 0;
  for (const char *p = src; (p = memchr(p, '\n', (size_t)(src + len - p))) != NULL; p++)
    lines++;
  size_t table = (offsetof(h1_req_t, head) + len + 1 + sizeof(void *) - 1) & ~(sizeof(void *) - 1);
  h1_req_t *q = malloc(table + lines * sizeof(h1_hdr_t));
  if (q == NULL) {
    h1_conn_kill(c);
    return NULL;
  }
  memset(q, 0, offsetof(h1_req_t, line));
  q->srv = c->srv;
  q->conn = c;
  q->file_fd = -1;
  q->hdrs = (h1_hdr_t *)((char *)q + table);
  memcpy(q->head, src, len);
  q->head[len] = '\0';
  char *p = q->head, *end = q->head + len, *line = next_line(&p, end);
  while (line && line[0] == '\0') /* empty lines before a request are allowed */
    line = next_line(&p, end);
  bool ok = line != NULL && parse_request_line(c, q, line);
  while (ok && (line = next_line(&p, end)) != NULL && line[0] != '\0')
    ok = parse_header(c, q, line);
  if (!ok || !parse_framing(c, q)) {
    free(q);
    return NULL;
  }
  h1_server_t *s = c->srv;
  q->streamed = s->cfg.streams && s->cfg.streams(q, s->cfg.arg);
  if (!q->streamed && q->length > 0 && (uint64_t)q->length > s->cfg.max_body) {
    char msg[160];
    snprintf(msg, sizeof msg, "the body is %lld bytes; the head takes at most %zu",
             (long long)q->length, s->cfg.max_body);
    free(q);
    h1_conn_fail(c, 413, MUSTER_BODY_TOO_LARGE, msg);
    return NULL;
  }
  queue_push(c, q);
  return q;
}

/* ---- bodies ---- */

typedef enum { FR_MORE, FR_OK, FR_END, FR_BAD } frame_rc_t;

static void frame_init(h1_frame_t *fr, int64_t length) {
  *fr = (h1_frame_t){
      .chunked = length < 0, .left = length < 0 ? 0 : length, .cs = CH_SIZE, .drop_left = -1};
}

/* A chunk-size line's value (extensions after ';' ignored); -1 when bad. */
static int64_t chunk_size(const char *p, size_t n) {
  int64_t v = 0;
  size_t i = 0;
  for (; i < n && i < 15; i++) {
    char ch = p[i];
    int d = ch >= '0' && ch <= '9'   ? ch - '0'
            : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
            : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                     : -1;
    if (d < 0)
      break;
    v = v * 16 + d;
  }
  if (i == 0)
    return -1;
  for (; i < n; i++)
    if (p[i] == ';')
      return v;
    else if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
      return -1;
  return v;
}

/* Advances the body's framing over p[0..n): *used bytes are consumed, and of
 * them [*data, *data + *dlen) are the body's own. */
static frame_rc_t frame_step(h1_frame_t *fr, const char *p, size_t n, size_t *used,
                             const char **data, size_t *dlen) {
  *used = *dlen = 0;
  *data = p;
  if (!fr->chunked || fr->cs == CH_DATA) {
    size_t take = (int64_t)n < fr->left ? n : (size_t)fr->left;
    *used = *dlen = take;
    fr->left -= (int64_t)take;
    if (fr->left > 0)
      return take > 0 ? FR_OK : FR_MORE;
    if (!fr->chunked)
      return FR_END;
    fr->cs = CH_DATA_END;
    return FR_OK;
  }
  const char *nl = memchr(p, '\n', n);
  if (nl == NULL)
    return n > H1_MAX_LINE ? FR_BAD : FR_MORE;
  size_t line = (size_t)(nl - p);
  *used = line + 1;
  if (line > 0 && p[line - 1] == '\r')
    line--;
  switch (fr->cs) {
  case CH_SIZE: {
    int64_t size = chunk_size(p, line);
    if (size < 0)
      return FR_BAD;
    fr->left = size;
    fr->cs = size > 0 ? CH_DATA : CH_TRAILER;
    return FR_OK;
  }
  case CH_DATA_END:
    if (line != 0)
      return FR_BAD;
    fr->cs = CH_SIZE;
    return FR_OK;
  default: /* CH_TRAILER: fields are skipped; an empty line ends the body */
    return line == 0 ? FR_END : FR_OK;
  }
}

static void req_dispatch(h1_req_t *q) {
  h1_server_t *s = q->srv;
  h1_server_note_active(s, q->conn);
  q->held = true;
  s->cfg.dispatch(q, s->cfg.arg);
}

/* BODY with a length: once the whole body is in the input, dispatches the
 * request with its body read in place (valid during the dispatch only). */
static bool body_length(h1_conn_t *c) {
  h1_req_t *q = c->last;
  size_t have = c->in_len - c->in_off;
  if ((int64_t)have < q->length)
    return false;
  q->body = c->in + c->in_off;
  q->body_len = (size_t)q->length;
  c->state = ST_HEAD;
  if (q->continue_pending && (c->first != q || c->cont_off == 0))
    q->continue_pending = false; /* the body came without it */
  req_dispatch(q);
  c->in_off += (size_t)q->length;
  q->body = NULL; /* corked: the request outlives the dispatch at least until the uncork */
  q->body_len = 0;
  return true;
}

/* Appends decoded chunk data to the body of q; false when over max_body. */
static bool body_append(h1_conn_t *c, h1_req_t *q, const char *data, size_t n) {
  if (q->body_len + n > c->srv->cfg.max_body)
    return false;
  if (q->body_len + n + 1 > q->body_cap) {
    size_t cap = q->body_cap ? q->body_cap * 2 : 4096;
    while (cap < q->body_len + n + 1)
      cap *= 2;
    char *grown = realloc(q->body_owned ? q->body : NULL, cap);
    if (grown == NULL)
      return false;
    q->body = grown;
    q->body_cap = cap;
    q->body_owned = true;
  }
  memcpy(q->body + q->body_len, data, n);
  q->body_len += n;
  q->body[q->body_len] = '\0';
  return true;
}

/* The framing of the input is malformed: a read body is refused, a streamed
 * one ends bad and the connection closes after what it owes. */
static void body_frame_bad(h1_conn_t *c, h1_req_t *q) {
  if (c->state == ST_BODY) {
    queue_drop_last(c);
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the chunked body is malformed");
    return;
  }
  if (q && !q->done)
    q->close = true;
  h1_body_end(q, H1_BODY_BAD);
  c->state = ST_IGNORE;
}

/* A dropped body (h1_body_drop) passed its bound: the connection closes
 * after the reply, which was answered already, and what still comes of the
 * body is ignored. */
static void body_drop_over(h1_conn_t *c, h1_req_t *q) {
  if (q != NULL)
    q->close = true;
  c->state = ST_IGNORE;
  h1_conn_dirty(c); /* lingers once what is queued is written */
}

/* Refuses a request head (request line and headers) over the limit, naming it. */
static void head_too_big(h1_conn_t *c) {
  char msg[160];
  snprintf(msg, sizeof msg, "the request line and headers are over %zu bytes, the head's limit",
           c->srv->cfg.max_head);
  h1_conn_fail(c, 431, MUSTER_BAD_REQUEST, msg);
}

/* Hands DLEN bytes of body to the request: kept (BODY) or given to its sink
 * (STREAM); false when the connection failed. */
static bool body_frame_data(h1_conn_t *c, h1_req_t *q, const char *data, size_t dlen) {
  if (c->state == ST_BODY) {
    if (!body_append(c, q, data, dlen)) {
      queue_drop_last(c);
      char msg[160];
      snprintf(msg, sizeof msg, "the chunked body is over %zu bytes, the most the head takes",
               c->srv->cfg.max_body);
      h1_conn_fail(c, 413, MUSTER_BODY_TOO_LARGE, msg);
      return false;
    }
  } else if (q && q->on_data && !q->on_data(q->sink, data, dlen)) {
    h1_body_detach(q); /* the rest is dropped; the sink answers */
  } else if (c->frame.drop_left >= 0 && (c->frame.drop_left -= (int64_t)dlen) < 0) {
    body_drop_over(c, q);
    return false;
  }
  return true;
}

/* The body ended: a read body is dispatched (and freed once its handler is
 * done with it), a streamed one's sink is told. */
static void body_frame_end(h1_conn_t *c, h1_req_t *q) {
  bool read = c->state == ST_BODY;
  c->state = ST_HEAD;
  if (!read) {
    h1_body_end(q, H1_BODY_DONE);
    return;
  }
  if (q->continue_pending && (c->first != q || c->cont_off == 0))
    q->continue_pending = false;
  req_dispatch(q);
  if (q->body_owned) {
    free(q->body);
    q->body = NULL;
    q->body_len = q->body_cap = 0;
    q->body_owned = false;
  }
}

/* Runs the framing over the input for BODY (chunked), STREAM and DISCARD;
 * false when it needs more bytes. */
static bool body_frame(h1_conn_t *c) {
  h1_req_t *q = c->last;
  for (;;) {
    size_t used, dlen;
    const char *data;
    frame_rc_t rc =
        frame_step(&c->frame, c->in + c->in_off, c->in_len - c->in_off, &used, &data, &dlen);
    if (rc == FR_MORE)
      return false;
    if (rc == FR_BAD) {
      body_frame_bad(c, q);
      return false;
    }
    if (dlen > 0 && !body_frame_data(c, q, data, dlen))
      return false;
    c->in_off += used;
    if (rc == FR_END) {
      body_frame_end(c, q);
      return true;
    }
  }
}

/* A head whose route streams its body: dispatched at once; its body is
 * discarded unless the handler gave it a sink. */
static void head_done_streamed(h1_conn_t *c, h1_req_t *q, bool body) {
  frame_init(&c->frame, body ? q->length : 0);
  c->state = ST_DISCARD; /* until a sink takes the body */
  if (q->expect_continue && body)
    q->close = true; /* refused, the client may wait for "100 Continue" forever */
  req_dispatch(q);
  if (c->dead)
    return;
  if (q->on_data || c->state == ST_STREAM) {
    q->close = !q->keep_alive;
  } else if (q->expect_continue && body) {
    c->state = ST_IGNORE;
  } else if (h1_frame_empty(&c->frame)) {
    c->state = ST_HEAD;
  }
}

/* Asks for the admission of `q`, read whole before its dispatch, whose body
 * is not all here yet (`expect`: its client waits for "100 Continue"), so
 * that a request refused anyway (a wrong token, no such endpoint, a body
 * over the route's limit) is refused before its body is kept: a client
 * waiting for "100 Continue" never sends it, and the connection closes after
 * the reply; any other has what it sends of its body read and dropped, up to
 * max_body, and the connection goes on.  Without this, anyone could make the
 * head hold max_body bytes per connection without a token.  True when the
 * request goes on. */
static bool head_admit(h1_conn_t *c, h1_req_t *q, bool expect) {
  h1_server_t *s = c->srv;
  if (s->cfg.admit == NULL)
    return true;
  q->close = expect || q->close;
  q->held = true;
  if (s->cfg.admit(q, s->cfg.arg)) {
    q->held = false;
    q->close = !q->keep_alive;
    return true;
  }
  /* Answered (or being answered). */
  if (expect) {
    c->state = ST_IGNORE; /* closes after the reply */
  } else {
    c->state = ST_DISCARD;
    c->frame.drop_left = (int64_t)s->cfg.max_body;
  }
  return false;
}

/* A head is complete: decides how its body is read, and dispatches when it
 * is read whole already or streams. */
static void head_done(h1_conn_t *c, h1_req_t *q) {
  bool body = q->length != 0;
  if (q->streamed) {
    head_done_streamed(c, q, body);
    return;
  }
  if (!body) {
    req_dispatch(q);
    return;
  }
  frame_init(&c->frame, q->length);
  c->state = ST_BODY;
  int64_t have = (int64_t)(c->in_len - c->in_off);
  if (q->length > 0 && have >= q->length)
    return; /* all here: dispatched as it is */
  /* A client that sent body bytes already does not wait for the 100. */
  bool expect = q->expect_continue && have < (q->length < 0 ? 1 : q->length);
  if (head_admit(c, q, expect) && expect) {
    q->continue_pending = true;
    h1_conn_dirty(c);
  }
}

/* No whole head is in the input yet: fails the connection when what is
 * there can never become one. */
static void head_incomplete(h1_conn_t *c) {
  if (c->in_off < c->in_len && (unsigned char)c->in[c->in_off] == 0x16)
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST,
                 "this server speaks plain HTTP, not TLS: use an http:// URL");
  else if (head_start_bad(c))
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST, "the request line must be 'METHOD /path HTTP/1.1'");
  else if (c->in_len - c->in_off > c->srv->cfg.max_head)
    head_too_big(c);
}

/* Reads the next request's head (state HEAD); false when it needs more bytes
 * or must not read on. */
static bool head_next(h1_conn_t *c) {
  if (c->last && c->last->close) {
    c->state = ST_IGNORE; /* nothing after "Connection: close" is answered */
    return true;
  }
  if (c->in_off == c->in_len || c->holding)
    return false;
  if (c->nq >= H1_MAX_INFLIGHT || c->out_bytes >= H1_OUT_HIGH) {
    h1_conn_pause(c); /* resumed when replies went out (h1_conn_may_read) */
    return false;
  }
  size_t len = head_end(c);
  if (len == 0) {
    head_incomplete(c);
    return false;
  }
  if (len > c->srv->cfg.max_head) {
    head_too_big(c);
    return false;
  }
  if (!head_bytes_clean(c->in + c->in_off, len)) {
    h1_conn_fail(c, 400, MUSTER_BAD_REQUEST,
                 "the request line or a header holds a NUL byte or a CR not followed by LF");
    return false;
  }
  h1_req_t *q = parse_head(c, len);
  c->in_off += len;
  c->head_scan = 0;
  c->head_since_ms = 0; /* the head's deadline is met (h1_timeout.c) */
  if (q != NULL)
    head_done(c, q);
  return true;
}

/* Parses and dispatches what the input holds, until it needs more bytes. */
void h1_conn_parse(h1_conn_t *c) {
  while (!c->dead) {
    switch (c->state) {
    case ST_IGNORE:
      c->in_off = c->in_len;
      return;
    case ST_BODY:
      if (c->frame.chunked ? !body_frame(c) : !body_length(c))
        return;
      break;
    case ST_STREAM:
    case ST_DISCARD:
      if (!body_frame(c))
        return;
      break;
    case ST_HEAD:
      if (!head_next(c))
        return;
      break;
    }
  }
}
