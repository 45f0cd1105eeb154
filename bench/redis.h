/*
 * redis.h — a minimal blocking RESP client of redis-server, for benchmarks.
 *
 * It speaks just enough RESP2 to run the reliable-queue pattern (LPUSH to the
 * queue, BLMOVE from it to a processing list, LREM from the processing list
 * once done) and a few setup commands.  Like beanstalk.h it pipelines:
 * redis_queue appends a command (as a RESP array of bulk strings) to the write
 * buffer, redis_flush sends what is queued, and replies are read back in
 * order with redis_read.  One connection is one TCP socket with TCP_NODELAY;
 * not thread-safe.  Header-only because every bench/ source file is its own
 * executable (see bench_util.h); it reuses beanstalk.h's buffered socket,
 * which is protocol-neutral below the line level.
 *
 * Every function returns 0 on success and -1 on failure, with the reason in
 * conn->error; a connection that failed once should be closed.
 */
#ifndef MUSTER_BENCH_REDIS_H
#define MUSTER_BENCH_REDIS_H

#include "beanstalk.h"

#include <stdlib.h>
#include <string.h>

typedef beanstalk_conn_t redis_conn_t;

/* A reply as redis_read returns it.  Bulk and simple strings point into the
 * connection's read buffer and stay valid until the next read. */
typedef struct {
  char type;       /* '+', '-', ':', '$' or '*' (RESP type byte) */
  int64_t integer; /* ':' value, '$' length (-1 for nil), '*' element count */
  const char *str; /* '+', '-' text or '$' bytes; NULL for a nil bulk */
  size_t len;      /* bytes at str */
} redis_reply_t;

static inline int redis_connect(redis_conn_t *conn, const char *host, int port) {
  return beanstalk_connect(conn, host, port);
}

static inline void redis_close(redis_conn_t *conn) {
  beanstalk_close(conn);
}

/* Queues one command of `argc` arguments (lengths in lens; NULL lens means
 * NUL-terminated strings). */
static inline int redis_queue(redis_conn_t *conn, int argc, const char *const *argv,
                              const size_t *lens) {
  size_t need = 16;
  for (int i = 0; i < argc; i++)
    need += 32 + (lens ? lens[i] : strlen(argv[i]));
  if (beanstalk_reserve_out(conn, need) != 0)
    return -1;
  conn->out_len += (size_t)sprintf(conn->out + conn->out_len, "*%d\r\n", argc);
  for (int i = 0; i < argc; i++) {
    size_t len = lens ? lens[i] : strlen(argv[i]);
    conn->out_len += (size_t)sprintf(conn->out + conn->out_len, "$%zu\r\n", len);
    memcpy(conn->out + conn->out_len, argv[i], len);
    conn->out_len += len;
    memcpy(conn->out + conn->out_len, "\r\n", 2);
    conn->out_len += 2;
  }
  return 0;
}

static inline int redis_flush(redis_conn_t *conn) {
  return beanstalk_flush(conn);
}

/*
 * Reads one reply.  Arrays are read flat: an array reply gives its count, and
 * its elements are the next `count` replies.  An error reply ('-') is
 * returned as a reply, not a failure; redis_expect turns it into one.
 */
static inline int redis_read(redis_conn_t *conn, redis_reply_t *reply) {
  char *line;
  if (beanstalk_read_line(conn, &line) != 0)
    return -1;
  memset(reply, 0, sizeof *reply);
  reply->type = line[0];
  switch (line[0]) {
  case '+':
  case '-':
    reply->str = line + 1;
    reply->len = strlen(line + 1);
    return 0;
  case ':':
  case '*':
    reply->integer = strtoll(line + 1, NULL, 10);
    return 0;
  case '$':
    reply->integer = strtoll(line + 1, NULL, 10);
    if (reply->integer < 0)
      return 0;
    reply->len = (size_t)reply->integer;
    while (conn->in_len - conn->in_pos < reply->len + 2)
      if (beanstalk_fill(conn) != 0)
        return -1;
    reply->str = conn->in + conn->in_pos;
    conn->in_pos += reply->len + 2;
    return 0;
  default:
    return beanstalk_fail(conn, "unexpected RESP reply: %.80s", line);
  }
}

/* Reads one reply and checks its type byte; an error reply is a failure. */
static inline int redis_expect(redis_conn_t *conn, char type, redis_reply_t *reply) {
  redis_reply_t local;
  if (!reply)
    reply = &local;
  if (redis_read(conn, reply) != 0)
    return -1;
  if (reply->type == '-')
    return beanstalk_fail(conn, "redis: %.*s", (int)reply->len, reply->str);
  if (reply->type != type)
    return beanstalk_fail(conn, "redis: expected a '%c' reply, got '%c'", type, reply->type);
  return 0;
}

/* Sends one command of NUL-terminated arguments and reads its reply of `type`. */
static inline int redis_call(redis_conn_t *conn, char type, int argc, const char *const *argv) {
  if (redis_queue(conn, argc, argv, NULL) != 0 || redis_flush(conn) != 0)
    return -1;
  return redis_expect(conn, type, NULL);
}

#endif /* MUSTER_BENCH_REDIS_H */
