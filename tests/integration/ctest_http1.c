/*
 * ctest_http1.c — libmuster's own HTTP/1.1 transport (src/client/http1.c)
 * against a scripted server on a thread: the request it writes, every way a
 * reply may be framed (Content-Length, chunks with extensions and trailers,
 * the end of the connection, an interim 100), a kept-alive connection that
 * the server closed while idle (sent again on a new one), a reply that comes
 * before the whole body was sent (413, then a reset), and the failures
 * that must become clear errors rather than hangs or wrong bodies: a server
 * that never answers, one that is not HTTP, one that hangs up mid-reply (not
 * sent again), two Content-Lengths, and nothing listening.
 */
#include "ctest_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#define TOKEN "ctest-http1-token-0123456789"

typedef struct server server_t;
typedef void (*script_fn)(server_t *s);

struct server {
  int listen_fd, port, accepts;
  int closed; /* connections the script has closed (script_close_when_idle) */
  script_fn script;
  char first[4096]; /* the first request read, as received */
  pthread_t thread;
};

/* Accepts the next connection; -1 when none comes within 10 s (the client
 * failed instead: the script ends, and the checks say why). */
static int srv_accept(server_t *s) {
  struct pollfd p = {.fd = s->listen_fd, .events = POLLIN};
  if (poll(&p, 1, 10000) != 1)
    return -1;
  int fd = accept(s->listen_fd, NULL, NULL);
  if (fd >= 0)
    s->accepts++;
  return fd;
}

/* Reads one request (headers, then a Content-Length body) into `out`; its
 * length, or 0 when the client closed first. */
static size_t srv_read_request(int fd, char *out, size_t size) {
  size_t len = 0;
  for (;;) {
    out[len] = '\0';
    char *end = strstr(out, "\r\n\r\n");
    if (end != NULL) {
      const char *cl = strstr(out, "Content-Length: ");
      size_t body = cl && cl < end ? (size_t)atol(cl + 16) : 0;
      if (len >= (size_t)(end + 4 - out) + body)
        return len;
    }
    ssize_t n = recv(fd, out + len, size - 1 - len, 0);
    if (n <= 0)
      return 0;
    len += (size_t)n;
  }
}

/* Sends `text` in pieces of `piece` bytes (separate writes, so that the
 * client may see them arrive apart). */
static void srv_send(int fd, const char *text, size_t piece) {
  size_t len = strlen(text);
  for (size_t at = 0; at < len; at += piece)
    if (send(fd, text + at, len - at < piece ? len - at : piece, MSG_NOSIGNAL) < 0)
      return;
}

static void *srv_main(void *arg) {
  server_t *s = arg;
  s->script(s);
  return NULL;
}

static void srv_start(server_t *s, script_fn script) {
  memset(s, 0, sizeof *s);
  s->script = script;
  s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (s->listen_fd < 0 || bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(s->listen_fd, 8) != 0 || getsockname(s->listen_fd, (struct sockaddr *)&a, &alen)) {
    perror("ctest_http1: listen");
    exit(1);
  }
  s->port = ntohs(a.sin_port);
  pthread_create(&s->thread, NULL, srv_main, s);
}

static void srv_join(server_t *s) {
  pthread_join(s->thread, NULL);
  close(s->listen_fd);
}

static muster_client_t *client_for(const server_t *s, const char *prefix) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, prefix);
  muster_client_t *c = NULL;
  if (muster_client_new(url, TOKEN, &c) != MUSTER_OK) {
    fprintf(stderr, "ctest_http1: muster_client_new failed\n");
    exit(1);
  }
  return c;
}

/* ---- scripts ------------------------------------------------------------------- */

/* A chunked reply, then a Content-Length one on the same connection. */
static void script_chunked_then_length(server_t *s) {
  int fd = srv_accept(s);
  char second[4096];
  if (fd < 0 || srv_read_request(fd, s->first, sizeof s->first) == 0)
    return;
  srv_send(fd,
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n",
           9);
  if (srv_read_request(fd, second, sizeof second) > 0)
    srv_send(fd, "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 64);
  close(fd);
}

/* Answers, then closes the idle connection without saying so (but counts it
 * in s->closed); the next request must come on a new connection. */
static void script_close_when_idle(server_t *s) {
  char req[4096];
  for (int i = 0; i < 2; i++) {
    int fd = srv_accept(s);
    if (fd < 0)
      return;
    if (srv_read_request(fd, i == 0 ? s->first : req, sizeof req) > 0)
      srv_send(fd,
               i == 0 ? "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
                      : "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond",
               64);
    close(fd);
    __atomic_store_n(&s->closed, i + 1, __ATOMIC_SEQ_CST);
  }
}

/* Answers the first request, then reads the second (a POST) and closes
 * without answering: a head that did the work and died before its reply. */
static void script_die_after_second(server_t *s) {
  char req[4096];
  int fd = srv_accept(s);
  if (fd < 0)
    return;
  if (srv_read_request(fd, s->first, sizeof s->first) > 0)
    srv_send(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst", 64);
  srv_read_request(fd, req, sizeof req);
  close(fd);
}

/* An interim 100, then an HTTP/1.0 reply whose body ends with the connection. */
static void script_continue_then_close(server_t *s) {
  int fd = srv_accept(s);
  if (fd >= 0 && srv_read_request(fd, s->first, sizeof s->first) > 0)
    srv_send(fd, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil the end", 7);
  close(fd);
}

/* Reads the request and never answers; returns when the client gives up. */
static void script_silent(server_t *s) {
  int fd = srv_accept(s);
  char rest[256];
  if (fd >= 0 && srv_read_request(fd, s->first, sizeof s->first) > 0)
    while (recv(fd, rest, sizeof rest, 0) > 0)
      ;
  close(fd);
}

/* Reads only the request's headers, refuses the body at once and closes
 * (with the body unread, the kernel resets the connection). */
static void script_refuse_early(server_t *s) {
  int fd = srv_accept(s);
  size_t len = 0;
  while (fd >= 0 && len < sizeof s->first - 1 && !strstr(s->first, "\r\n\r\n")) {
    ssize_t n = recv(fd, s->first + len, 1, 0);
    if (n <= 0)
      break;
    s->first[++len] = '\0';
  }
  srv_send(fd,
           "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 55\r\n\r\n"
           "{\"error\":{\"code\":\"body_too_large\",\"message\":\"too big\"}}",
           4096);
  close(fd);
}

static const char *reply_text; /* what script_reply sends, then closes */

static void script_reply(server_t *s) {
  int fd = srv_accept(s);
  if (fd >= 0 && srv_read_request(fd, s->first, sizeof s->first) > 0)
    srv_send(fd, reply_text, 64);
  close(fd);
}

/* Sends a request that must succeed with reply body `want`. */
static void expect_reply(muster_client_t *c, const char *method, const char *path, const char *body,
                         const char *want, int line) {
  char *reply = NULL;
  check_err_client(muster_request(c, method, path, body, &reply), MUSTER_OK, path, line, c);
  check(reply && strcmp(reply, want) == 0, want, line);
  muster_free(reply);
}

#define EXPECT_REPLY(c, method, path, body, want)                                                  \
  expect_reply((c), (method), (path), (body), (want), __LINE__)

/* ---- tests ---------------------------------------------------------------------- */

static void test_request_and_chunked_reply(void) {
  server_t s;
  srv_start(&s, script_chunked_then_length);
  muster_client_t *c = client_for(&s, "/prefix");
  EXPECT_REPLY(c, "POST", "/v1/things", "{\"a\":1}", "hello, world");
  CHECK(muster_client_status(c) == 200);
  EXPECT_REPLY(c, "GET", "/v1/health", NULL, "ok");
  muster_client_free(c);
  srv_join(&s);
  /* The request as written: the base URL's path first, one Host, the token,
   * the body's length, the body. */
  const char *line = "POST /prefix/v1/things HTTP/1.1\r\n";
  CHECK(strncmp(s.first, line, strlen(line)) == 0);
  CHECK(contains(s.first, "\r\nAuthorization: Bearer " TOKEN "\r\n"));
  CHECK(contains(s.first, "\r\nHost: 127.0.0.1:"));
  CHECK(contains(s.first, "\r\nContent-Type: application/json\r\n"));
  CHECK(contains(s.first, "\r\nContent-Length: 7\r\n\r\n{\"a\":1}"));
  CHECK(s.accepts == 1); /* both requests on one connection */
}

static void test_idle_close_is_retried(void) {
  server_t s;
  srv_start(&s, script_close_when_idle);
  muster_client_t *c = client_for(&s, "");
  EXPECT_REPLY(c, "GET", "/one", NULL, "first");
  EXPECT_REPLY(c, "GET", "/two", NULL, "second");
  muster_client_free(c);
  srv_join(&s);
  CHECK(s.accepts == 2);
  CHECK(!contains(s.first, "Content-Length")); /* a GET without a body has none */
}

/* A POST whose connection closes without a reply may have been done: it is
 * not sent again (a batch of tasks would be put twice), and the error says
 * no reply came. */
static void test_post_not_sent_twice(void) {
  server_t s;
  srv_start(&s, script_die_after_second);
  muster_client_t *c = client_for(&s, "");
  muster_client_set_timeout(c, 2000); /* a resent POST would wait for a reply that never comes */
  EXPECT_REPLY(c, "GET", "/one", NULL, "first");
  CHECK_ERR(c, muster_request(c, "POST", "/v1/queues/q/tasks", "{}", NULL), MUSTER_NETWORK);
  CHECK(contains(muster_client_message(c), "without replying"));
  srv_join(&s); /* closes the listener: a resend would have found it open */
  CHECK(s.accepts == 1);
  muster_client_free(c);
}

/* A connection idle past HTTP1_IDLE_CHECK_MS that the server closed is
 * found closed before anything is sent on it, so a POST goes out once, on a
 * new connection. */
static void test_idle_closed_connection_replaced(void) {
  server_t s;
  srv_start(&s, script_close_when_idle);
  muster_client_t *c = client_for(&s, "");
  EXPECT_REPLY(c, "GET", "/one", NULL, "first");
  int64_t replied = now_ms();
  while (__atomic_load_n(&s.closed, __ATOMIC_SEQ_CST) < 1)
    usleep(1000);
  /* The idle time itself is what is tested: the client looks at a connection
   * only once it has been idle for 100 ms. */
  while (now_ms() - replied < 150)
    usleep(5000);
  EXPECT_REPLY(c, "POST", "/v1/x", "{}", "second");
  muster_client_free(c);
  srv_join(&s);
  CHECK(s.accepts == 2);
}

static void test_interim_and_close_framing(void) {
  server_t s;
  srv_start(&s, script_continue_then_close);
  muster_client_t *c = client_for(&s, "");
  EXPECT_REPLY(c, "PUT", "/v1/x", NULL, "until the end");
  muster_client_free(c);
  srv_join(&s);
  CHECK(contains(s.first, "\r\nContent-Length: 0\r\n")); /* PUT sends an empty body */
}

static void test_timeout(void) {
  server_t s;
  srv_start(&s, script_silent);
  muster_client_t *c = client_for(&s, "");
  muster_client_set_timeout(c, 200);
  int64_t start = now_ms();
  CHECK_ERR(c, muster_request(c, "GET", "/v1/health", NULL, NULL), MUSTER_NETWORK);
  CHECK(now_ms() - start >= 190);
  CHECK(contains(muster_client_message(c), "timed out"));
  muster_client_free(c); /* closes the connection: the script returns */
  srv_join(&s);
  CHECK(s.accepts == 1);
}

static void expect_failure(const char *reply, muster_err_t want, const char *message_part) {
  server_t s;
  reply_text = reply;
  srv_start(&s, script_reply);
  muster_client_t *c = client_for(&s, "");
  char *body = NULL;
  CHECK_ERR(c, muster_request(c, "GET", "/v1/x", NULL, &body), want);
  CHECK(body == NULL);
  if (!contains(muster_client_message(c), message_part)) {
    fprintf(stderr, "  message: %s\n  wanted: %s\n", muster_client_message(c), message_part);
    CHECK(!"the message explains the failure");
  }
  muster_client_free(c);
  srv_join(&s);
  CHECK(s.accepts == 1); /* a failure after reply bytes came is not sent again */
}

static void test_bad_replies(void) {
  expect_failure("SPAM\r\n\r\n", MUSTER_NETWORK, "not an HTTP/1.x reply");
  expect_failure("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
                 MUSTER_NETWORK, "not an HTTP/1.x reply");
  expect_failure("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", MUSTER_NETWORK,
                 "in the middle of its reply");
  expect_failure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", MUSTER_NETWORK,
                 "malformed chunked reply");
  /* An error reply: its envelope's code and message reach the caller. */
  expect_failure("HTTP/1.1 404 Not Found\r\nContent-Length: 47\r\n\r\n"
                 "{\"error\":{\"code\":\"not_found\",\"message\":\"nope\"}}",
                 MUSTER_NOT_FOUND, "nope");
}

/* A reply that comes while the body is still being sent is the answer, not
 * the broken pipe that writing the rest of the body then meets. */
static void test_early_reply(void) {
  server_t s;
  srv_start(&s, script_refuse_early);
  muster_client_t *c = client_for(&s, "");
  size_t n = 32u << 20;
  char *body = malloc(n + 1);
  memset(body, ' ', n);
  body[0] = '{';
  body[n - 1] = '}';
  body[n] = '\0';
  CHECK_ERR(c, muster_request(c, "POST", "/v1/x", body, NULL), MUSTER_BODY_TOO_LARGE);
  CHECK(contains(muster_client_message(c), "too big"));
  CHECK(muster_client_status(c) == 413);
  free(body);
  muster_client_free(c);
  srv_join(&s);
}

static void test_nothing_listening(void) {
  /* A port that was free a moment ago. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  bind(fd, (struct sockaddr *)&a, sizeof a);
  getsockname(fd, (struct sockaddr *)&a, &alen);
  close(fd);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(a.sin_port));
  muster_client_t *c = NULL;
  CHECK(muster_client_new(url, TOKEN, &c) == MUSTER_OK);
  CHECK_ERR(c, muster_health(c), MUSTER_NETWORK);
  CHECK(contains(muster_client_message(c), "could not connect to 127.0.0.1 port"));
  CHECK(contains(muster_client_message(c), "refused"));
  /* Shared data and https:// go through libcurl, which said "Failed to connect
   * ... after 0 ms: Couldn't connect to server": the same failure reads the same. */
  char want[96];
  snprintf(want, sizeof want, "could not connect to 127.0.0.1 port %d: Connection refused",
           ntohs(a.sin_port));
  void *data = NULL;
  size_t len = 0;
  CHECK_ERR(c, muster_shared_get(c, "s", "n", 0, &data, &len, NULL), MUSTER_NETWORK);
  CHECK(contains(muster_client_message(c), want));
  muster_client_free(c);
  snprintf(url, sizeof url, "https://127.0.0.1:%d", ntohs(a.sin_port));
  CHECK(muster_client_new(url, TOKEN, &c) == MUSTER_OK);
  CHECK_ERR(c, muster_health(c), MUSTER_NETWORK);
  CHECK(contains(muster_client_message(c), want));
  muster_client_free(c);
}

int main(void) {
  test_request_and_chunked_reply();
  test_idle_close_is_retried();
  test_post_not_sent_twice();
  test_idle_closed_connection_replaced();
  test_interim_and_close_framing();
  test_timeout();
  test_bad_replies();
  test_early_reply();
  test_nothing_listening();
  return ctest_report();
}
