/*
 * beanstalk.h — a minimal blocking client of beanstalkd's text protocol, for benchmarks.
 *
 * It speaks just enough of doc/protocol.txt (use, watch, ignore, put,
 * reserve-with-timeout, delete) to run a put → reserve → delete cycle, and it
 * pipelines: commands are queued into a write buffer, sent together by
 * beanstalk_flush, and their replies are read back in order.  One connection
 * is one TCP socket with TCP_NODELAY; it is not thread-safe.  Header-only
 * because every bench/ source file is its own executable (see bench_util.h).
 *
 * Every function returns 0 on success and -1 on failure, with the reason in
 * conn->error; a connection that failed once should be closed.
 */
#ifndef MUSTER_BENCH_BEANSTALK_H
#define MUSTER_BENCH_BEANSTALK_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Wire strings, defined once.  Replies end in CRLF, which the reader strips. */
#define BEANSTALK_INSERTED "INSERTED "
#define BEANSTALK_RESERVED "RESERVED "
#define BEANSTALK_DELETED "DELETED"
#define BEANSTALK_USING "USING "
#define BEANSTALK_WATCHING "WATCHING "

typedef struct {
  int fd;          /* the socket, -1 when closed */
  char *in;        /* read buffer; bytes [in_pos, in_len) are received but unparsed */
  size_t in_pos;   /* first unparsed byte of in */
  size_t in_len;   /* bytes held in in */
  size_t in_cap;   /* capacity of in */
  char *out;       /* queued commands not yet sent */
  size_t out_len;  /* bytes queued in out */
  size_t out_cap;  /* capacity of out */
  char error[256]; /* why the last call failed */
} beanstalk_conn_t;

__attribute__((format(printf, 2, 3))) static inline int beanstalk_fail(beanstalk_conn_t *conn,
                                                                       const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(conn->error, sizeof conn->error, fmt, ap);
  va_end(ap);
  return -1;
}

/* Connects to host:port (an IPv4 address).  On failure the connection is left closed. */
static inline int beanstalk_connect(beanstalk_conn_t *conn, const char *host, int port) {
  memset(conn, 0, sizeof *conn);
  conn->fd = -1;
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
    return beanstalk_fail(conn, "not an IPv4 address: %s", host);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return beanstalk_fail(conn, "socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int saved = errno;
    close(fd);
    return beanstalk_fail(conn, "connect %s:%d: %s", host, port, strerror(saved));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  conn->fd = fd;
  return 0;
}

/* Closes the socket and frees the buffers; accepts a closed connection. */
static inline void beanstalk_close(beanstalk_conn_t *conn) {
  if (conn->fd >= 0)
    close(conn->fd);
  free(conn->in);
  free(conn->out);
  memset(conn, 0, sizeof *conn);
  conn->fd = -1;
}

/* Makes room for `extra` more bytes in the write buffer. */
static inline int beanstalk_reserve_out(beanstalk_conn_t *conn, size_t extra) {
  if (conn->out_len + extra <= conn->out_cap)
    return 0;
  size_t cap = conn->out_cap ? conn->out_cap : 4096;
  while (cap < conn->out_len + extra)
    cap *= 2;
  char *grown = realloc(conn->out, cap);
  if (!grown)
    return beanstalk_fail(conn, "out of memory");
  conn->out = grown;
  conn->out_cap = cap;
  return 0;
}

/* Queues one command line; the CRLF is added here. */
__attribute__((format(printf, 2, 3))) static inline int beanstalk_queue_cmd(beanstalk_conn_t *conn,
                                                                            const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(line, sizeof line - 2, fmt, ap);
  va_end(ap);
  if (len < 0 || (size_t)len >= sizeof line - 2)
    return beanstalk_fail(conn, "command too long");
  memcpy(line + len, "\r\n", 2);
  if (beanstalk_reserve_out(conn, (size_t)len + 2) != 0)
    return -1;
  memcpy(conn->out + conn->out_len, line, (size_t)len + 2);
  conn->out_len += (size_t)len + 2;
  return 0;
}

/* Queues `put PRI DELAY TTR BYTES` followed by the job body. */
static inline int beanstalk_queue_put(beanstalk_conn_t *conn, uint32_t priority, int delay_s,
                                      int ttr_s, const void *body, size_t body_len) {
  if (beanstalk_queue_cmd(conn, "put %u %d %d %zu", priority, delay_s, ttr_s, body_len) != 0 ||
      beanstalk_reserve_out(conn, body_len + 2) != 0)
    return -1;
  memcpy(conn->out + conn->out_len, body, body_len);
  memcpy(conn->out + conn->out_len + body_len, "\r\n", 2);
  conn->out_len += body_len + 2;
  return 0;
}

/* Sends every queued command. */
static inline int beanstalk_flush(beanstalk_conn_t *conn) {
  size_t sent = 0;
  while (sent < conn->out_len) {
    ssize_t n = send(conn->fd, conn->out + sent, conn->out_len - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return beanstalk_fail(conn, "send: %s", n < 0 ? strerror(errno) : "closed");
    sent += (size_t)n;
  }
  conn->out_len = 0;
  return 0;
}

/* Reads more bytes into the read buffer, compacting what was parsed. */
static inline int beanstalk_fill(beanstalk_conn_t *conn) {
  if (conn->in_pos > 0) {
    memmove(conn->in, conn->in + conn->in_pos, conn->in_len - conn->in_pos);
    conn->in_len -= conn->in_pos;
    conn->in_pos = 0;
  }
  if (conn->in_len == conn->in_cap) {
    size_t cap = conn->in_cap ? conn->in_cap * 2 : 16384;
    char *grown = realloc(conn->in, cap);
    if (!grown)
      return beanstalk_fail(conn, "out of memory");
    conn->in = grown;
    conn->in_cap = cap;
  }
  for (;;) {
    ssize_t n = recv(conn->fd, conn->in + conn->in_len, conn->in_cap - conn->in_len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return beanstalk_fail(conn, "recv: %s", n < 0 ? strerror(errno) : "server closed");
    conn->in_len += (size_t)n;
    return 0;
  }
}

/*
 * Reads one reply line.  On success *line points into the read buffer (valid
 * until the next read), NUL-terminated with the CRLF removed.
 */
static inline int beanstalk_read_line(beanstalk_conn_t *conn, char **line) {
  for (;;) {
    char *start = conn->in + conn->in_pos;
    size_t avail = conn->in_len - conn->in_pos;
    char *lf = avail ? memchr(start, '\n', avail) : NULL;
    if (lf && lf > start && lf[-1] == '\r') {
      lf[-1] = '\0';
      conn->in_pos += (size_t)(lf - start) + 1;
      *line = start;
      return 0;
    }
    if (beanstalk_fill(conn) != 0)
      return -1;
  }
}

/* Skips `len` body bytes and their CRLF. */
static inline int beanstalk_skip(beanstalk_conn_t *conn, size_t len) {
  while (conn->in_len - conn->in_pos < len + 2)
    if (beanstalk_fill(conn) != 0)
      return -1;
  conn->in_pos += len + 2;
  return 0;
}

/* Reads a reply that must start with `prefix` (USING, WATCHING, DELETED). */
static inline int beanstalk_expect(beanstalk_conn_t *conn, const char *prefix) {
  char *line;
  if (beanstalk_read_line(conn, &line) != 0)
    return -1;
  if (strncmp(line, prefix, strlen(prefix)) != 0)
    return beanstalk_fail(conn, "expected %s, got '%.200s'", prefix, line);
  return 0;
}

/* Reads the reply to a put: INSERTED id. */
static inline int beanstalk_read_inserted(beanstalk_conn_t *conn, uint64_t *id) {
  char *line;
  if (beanstalk_read_line(conn, &line) != 0)
    return -1;
  if (strncmp(line, BEANSTALK_INSERTED, strlen(BEANSTALK_INSERTED)) != 0)
    return beanstalk_fail(conn, "put: got '%.200s'", line);
  *id = strtoull(line + strlen(BEANSTALK_INSERTED), NULL, 10);
  return 0;
}

/* Reads the reply to a reserve: RESERVED id bytes, then the body, which is skipped.
 * TIMED_OUT or anything else is a failure. */
static inline int beanstalk_read_reserved(beanstalk_conn_t *conn, uint64_t *id) {
  char *line;
  if (beanstalk_read_line(conn, &line) != 0)
    return -1;
  unsigned long long job = 0;
  size_t body_len = 0;
  if (sscanf(line, BEANSTALK_RESERVED "%llu %zu", &job, &body_len) != 2)
    return beanstalk_fail(conn, "reserve: got '%.200s'", line);
  *id = job;
  return beanstalk_skip(conn, body_len);
}

/* Selects `tube` for put and watches only it for reserve; one round trip. */
static inline int beanstalk_use_tube(beanstalk_conn_t *conn, const char *tube) {
  if (beanstalk_queue_cmd(conn, "use %s", tube) != 0 ||
      beanstalk_queue_cmd(conn, "watch %s", tube) != 0 ||
      beanstalk_queue_cmd(conn, "ignore default") != 0 || beanstalk_flush(conn) != 0)
    return -1;
  if (beanstalk_expect(conn, BEANSTALK_USING) != 0 ||
      beanstalk_expect(conn, BEANSTALK_WATCHING) != 0 ||
      beanstalk_expect(conn, BEANSTALK_WATCHING) != 0)
    return -1;
  return 0;
}

#endif /* MUSTER_BENCH_BEANSTALK_H */
