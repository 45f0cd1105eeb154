/*
 * test_h1_lend.c — unit tests of replies held back for a flush (h1_lend.c),
 * on a real server and a loopback client: a lent connection gets nothing
 * until the writer writes or the lend returns; the writer's bytes are
 * accounted once (the client reads each reply once, in order, and the
 * connection goes on); a reply given after the writer is done with the
 * connection goes out at once, one given before waits; a failed flush
 * answers the lent replies anew and nothing of their first answer leaves; a
 * connection that dies while lent is freed only after the return.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/h1.h"

#define MAX_REQS 8

typedef struct {
  struct event_base *base;
  h1_server_t *srv;
  int port;
  int client;
  h1_req_t *reqs[MAX_REQS];
  int nreqs;
} env_t;

static void on_dispatch(h1_req_t *q, void *arg) {
  env_t *e = arg;
  assert_true(e->nreqs < MAX_REQS);
  e->reqs[e->nreqs++] = q;
}

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  e->base = event_base_new();
  h1_config_t cfg = {
      .dispatch = on_dispatch, .arg = e, .max_head = 8192, .max_body = 1 << 20, .idle_ms = 60000};
  e->srv = h1_server_new(e->base, &cfg);
  assert_non_null(e->srv);
  char err[128];
  e->port = h1_server_listen(e->srv, "127.0.0.1", 0, err, sizeof err);
  assert_true(e->port > 0);
  e->client = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)e->port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(e->client, (struct sockaddr *)&sa, sizeof sa), 0);
  int one = 1;
  setsockopt(e->client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  if (e->client >= 0)
    close(e->client);
  h1_server_free(e->srv);
  event_base_free(e->base);
  free(e);
  return 0;
}

/* Sends `n` requests in one write (pipelined) and runs the loop until the
 * server dispatched them all. */
static void send_requests(env_t *e, int n) {
  char buf[1024];
  size_t len = 0;
  for (int i = 0; i < n; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len,
                            "POST /r%d HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", i);
  assert_int_equal(write(e->client, buf, len), (ssize_t)len);
  int want = e->nreqs + n;
  for (int turns = 0; e->nreqs < want; turns++) {
    assert_true(turns < 100);
    event_base_loop(e->base, EVLOOP_ONCE);
  }
}

/* Runs what the loop has ready without waiting. */
static void run_ready(env_t *e) {
  for (int i = 0; i < 4; i++)
    event_base_loop(e->base, EVLOOP_NONBLOCK);
}

/* True when the client can read nothing now. */
static bool client_has_nothing(env_t *e) {
  char c;
  ssize_t n = recv(e->client, &c, 1, MSG_DONTWAIT | MSG_PEEK);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Reads one whole reply (status line, headers, Content-Length bytes of body)
 * into `out`; returns its status. */
static int read_reply(env_t *e, char *out, size_t cap) {
  size_t len = 0;
  for (;;) {
    out[len] = '\0';
    char *end = strstr(out, "\r\n\r\n");
    if (end) {
      const char *cl = strstr(out, "Content-Length: ");
      size_t body = cl && cl < end ? strtoul(cl + 16, NULL, 10) : 0;
      size_t whole = (size_t)(end + 4 - out) + body;
      if (len >= whole) {
        assert_int_equal(len, whole); /* one reply at a time: read no further */
        return atoi(out + 9);
      }
    }
    struct pollfd p = {.fd = e->client, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 5000), 1);
    ssize_t n = recv(e->client, out + len, 1, 0); /* byte by byte: stop at the reply's end */
    assert_true(n == 1);
    len++;
    assert_true(len < cap);
  }
}

/* Answers request `i` with `body` as text/plain. */
static void respond(env_t *e, int i, int status, const char *body) {
  h1_respond(e->reqs[i], status, "text/plain", strdup(body), strlen(body), false);
}

/* Reads the next reply: it has `status` and the body `body`. */
static void expect_reply(env_t *e, int status, const char *body) {
  char buf[512], want[128];
  assert_int_equal(read_reply(e, buf, sizeof buf), status);
  snprintf(want, sizeof want, "\r\n\r\n%s", body);
  assert_non_null(strstr(buf, want));
}

static void test_nothing_leaves_until_the_return(void **state) {
  env_t *e = *state;
  send_requests(e, 1);
  h1_lend_begin(e->srv);
  respond(e, 0, 200, "held");
  h1_lend_t *l = h1_lend_end(e->srv);
  assert_non_null(l);
  run_ready(e);
  assert_true(client_has_nothing(e));
  h1_lend_return(l, 0, NULL);
  expect_reply(e, 200, "held");
  /* The connection goes on as before. */
  send_requests(e, 1);
  respond(e, 1, 201, "next");
  expect_reply(e, 201, "next");
  assert_true(client_has_nothing(e));
}

static void test_the_writer_sends_them_once(void **state) {
  env_t *e = *state;
  send_requests(e, 2);
  h1_lend_begin(e->srv);
  respond(e, 0, 200, "one");
  respond(e, 1, 200, "two");
  h1_lend_t *l = h1_lend_end(e->srv);
  h1_lend_write(l); /* the flush thread's part, here on the test's thread */
  expect_reply(e, 200, "one");
  expect_reply(e, 200, "two");
  h1_lend_return(l, 0, NULL);
  run_ready(e);
  assert_true(client_has_nothing(e)); /* written once, not again at the return */
  send_requests(e, 1);
  respond(e, 2, 200, "three");
  expect_reply(e, 200, "three");
}

static void test_a_later_reply_waits_for_the_writer(void **state) {
  env_t *e = *state;
  send_requests(e, 3);
  h1_lend_begin(e->srv);
  respond(e, 0, 200, "lent");
  h1_lend_t *l = h1_lend_end(e->srv);
  /* Before the writer is done with the connection: the reply waits. */
  respond(e, 1, 200, "early");
  run_ready(e);
  assert_true(client_has_nothing(e));
  h1_lend_write(l); /* writes what was gathered: the lent reply only */
  expect_reply(e, 200, "lent");
  assert_true(client_has_nothing(e));
  /* After it: the connection is taken back at once, before the return. */
  respond(e, 2, 200, "late");
  expect_reply(e, 200, "early");
  expect_reply(e, 200, "late");
  h1_lend_return(l, 0, NULL);
  run_ready(e);
  assert_true(client_has_nothing(e));
}

static void test_a_failed_flush_answers_anew(void **state) {
  env_t *e = *state;
  send_requests(e, 2);
  h1_lend_begin(e->srv);
  h1_add_header(e->reqs[0], "Location", "/v1/tasks/1");
  h1_respond(e->reqs[0], 201, "application/json", strdup("{\"ok\":1}"), 8, true);
  h1_lend_t *l = h1_lend_end(e->srv);
  /* A reply given meanwhile, outside the lend, is not answered anew. */
  respond(e, 1, 200, "read");
  h1_lend_return(l, 500, "{\"error\":\"lost\"}");
  char buf[512];
  assert_int_equal(read_reply(e, buf, sizeof buf), 500);
  assert_non_null(strstr(buf, "\r\n\r\n{\"error\":\"lost\"}\n"));
  assert_null(strstr(buf, "Location"));
  assert_null(strstr(buf, "ok"));
  expect_reply(e, 200, "read");
}

static void test_a_connection_dying_while_lent(void **state) {
  env_t *e = *state;
  send_requests(e, 1);
  assert_int_equal(h1_server_connections(e->srv), 1);
  h1_lend_begin(e->srv);
  respond(e, 0, 200, "gone");
  h1_lend_t *l = h1_lend_end(e->srv);
  /* The client resets the connection: the server's read fails and kills it. */
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(e->client, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(e->client);
  e->client = -1;
  for (int turns = 0; turns < 10; turns++)
    event_base_loop(e->base, EVLOOP_NONBLOCK);
  /* Dead but kept: the writer may still use its descriptor. */
  assert_int_equal(h1_server_connections(e->srv), 1);
  h1_lend_write(l);
  h1_lend_return(l, 0, NULL);
  run_ready(e);
  assert_int_equal(h1_server_connections(e->srv), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* as the head: a write to a reset connection fails instead */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_nothing_leaves_until_the_return, setup, teardown),
      cmocka_unit_test_setup_teardown(test_the_writer_sends_them_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_later_reply_waits_for_the_writer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_flush_answers_anew, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_connection_dying_while_lent, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
