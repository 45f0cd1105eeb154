/*
 * test_h1_stream.c — unit tests of streamed replies (h1_stream.c), on a real
 * server and a loopback client: a body given piece by piece after its
 * headers (by length, chunked, from a file) arrives whole and each piece as
 * soon as it is given; a whole reply to a request pipelined behind a
 * streamed one waits for the stream's end (request order); a HEAD gets the
 * headers and the length only; a body cut short closes the connection
 * without completing it (a reset where it would end with the connection);
 * the producer is told to stop while the client does not read, and told to
 * go on once it did or went away; the free hook runs once per request.
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
#define IN_CAP (4 << 20)

typedef struct {
  struct event_base *base;
  h1_server_t *srv;
  int port;
  int client;
  h1_req_t *reqs[MAX_REQS];
  int nreqs;
  char *in; /* what the client read */
  size_t in_len;
  bool eof, reset;
  int readies, frees;
} env_t;

static void on_dispatch(h1_req_t *q, void *arg) {
  env_t *e = arg;
  assert_true(e->nreqs < MAX_REQS);
  e->reqs[e->nreqs++] = q;
}

static void connect_client(env_t *e, int rcvbuf) {
  e->client = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0)
    setsockopt(e->client, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)e->port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(e->client, (struct sockaddr *)&sa, sizeof sa), 0);
  int one = 1;
  setsockopt(e->client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
  e->in = malloc(IN_CAP);
  connect_client(e, 0);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  if (e->client >= 0)
    close(e->client);
  h1_server_free(e->srv);
  event_base_free(e->base);
  free(e->in);
  free(e);
  return 0;
}

/* Runs what the loop has ready without waiting. */
static void run_ready(env_t *e) {
  for (int i = 0; i < 4; i++)
    event_base_loop(e->base, EVLOOP_NONBLOCK);
}

/* Sends `text` and runs the loop until the server dispatched `n` more. */
static void send_text(env_t *e, const char *text, int n) {
  assert_int_equal(write(e->client, text, strlen(text)), (ssize_t)strlen(text));
  int want = e->nreqs + n;
  for (int turns = 0; e->nreqs < want; turns++) {
    assert_true(turns < 100);
    event_base_loop(e->base, EVLOOP_ONCE);
  }
}

static void send_gets(env_t *e, int n) {
  for (int i = 0; i < n; i++)
    send_text(e, "GET /s HTTP/1.1\r\nHost: t\r\n\r\n", 1);
}

/* Reads what the client can now (the loop run in between) until `want`
 * bytes in all were read, or the connection ended, or (want 0) nothing more
 * came for a moment. */
static void pump(env_t *e, size_t want) {
  for (int idle = 0; idle < 20 && !e->eof && (want == 0 || e->in_len < want);) {
    run_ready(e);
    ssize_t n = recv(e->client, e->in + e->in_len, IN_CAP - 1 - e->in_len, MSG_DONTWAIT);
    if (n > 0) {
      e->in_len += (size_t)n;
      e->in[e->in_len] = '\0';
      idle = 0;
    } else if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      e->eof = true;
      e->reset = n < 0;
    } else {
      struct pollfd p = {.fd = e->client, .events = POLLIN};
      poll(&p, 1, 10);
      idle++;
    }
  }
}

/* True when the client holds `text` somewhere in what it read. */
static bool got(env_t *e, const char *text) {
  return memmem(e->in, e->in_len, text, strlen(text)) != NULL;
}

static void test_a_body_by_length_arrives_as_given(void **state) {
  env_t *e = *state;
  send_gets(e, 1);
  h1_req_t *q = e->reqs[0];
  h1_add_header(q, "X-Via", "test");
  h1_respond_start(q, 200, "text/plain", 10);
  pump(e, 0);
  assert_true(got(e, "HTTP/1.1 200 OK\r\n"));
  assert_true(got(e, "Content-Length: 10\r\n"));
  assert_true(got(e, "X-Via: test\r\n\r\n"));
  assert_false(got(e, "Transfer-Encoding"));
  assert_true(h1_respond_data(q, "hello", 5));
  pump(e, 0);
  assert_true(got(e, "\r\n\r\nhello")); /* each piece goes as it is given */
  assert_true(h1_respond_data(q, "world", 5));
  h1_respond_end(q);
  pump(e, 0);
  assert_true(got(e, "\r\n\r\nhelloworld"));
  assert_false(e->eof); /* the connection goes on */
  send_gets(e, 1);
  h1_respond(e->reqs[1], 200, "text/plain", strdup("next"), 4, false);
  pump(e, 0);
  assert_true(got(e, "helloworldHTTP/1.1 200 OK"));
}

static void test_chunked_and_request_order(void **state) {
  env_t *e = *state;
  send_gets(e, 2);
  h1_respond_start(e->reqs[0], 200, NULL, -1);
  /* The second request's whole reply waits for the stream's end. */
  h1_respond(e->reqs[1], 404, "text/plain", strdup("after"), 5, false);
  assert_true(h1_respond_data(e->reqs[0], "abc", 3));
  pump(e, 0);
  assert_true(got(e, "Transfer-Encoding: chunked\r\n"));
  assert_false(got(e, "Content-Type"));
  assert_true(got(e, "\r\n\r\n3\r\nabc\r\n"));
  assert_false(got(e, "404"));
  assert_true(h1_respond_data(e->reqs[0], "0123456789abcdefX", 17));
  h1_respond_end(e->reqs[0]);
  pump(e, 0);
  assert_true(got(e, "3\r\nabc\r\n11\r\n0123456789abcdefX\r\n0\r\n\r\nHTTP/1.1 404 Not Found"));
  assert_true(got(e, "\r\n\r\nafter"));
}

static void test_a_body_from_a_file(void **state) {
  env_t *e = *state;
  char path[] = "/tmp/muster-h1-stream-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  assert_int_equal(write(fd, "0123456789", 10), 10);
  send_gets(e, 1);
  h1_respond_start(e->reqs[0], 200, "application/octet-stream", 7);
  assert_true(h1_respond_data_file(e->reqs[0], dup(fd), 2, 4));
  assert_true(h1_respond_data(e->reqs[0], "!", 1));
  assert_true(h1_respond_data_file(e->reqs[0], dup(fd), 8, 2));
  h1_respond_end(e->reqs[0]);
  pump(e, 0);
  assert_true(got(e, "\r\n\r\n2345!89"));
  assert_false(e->eof);
  close(fd);
}

static void test_a_head_gets_the_length_only(void **state) {
  env_t *e = *state;
  send_text(e, "HEAD /s HTTP/1.1\r\nHost: t\r\n\r\n", 1);
  h1_respond_start(e->reqs[0], 200, "application/json", 1234);
  assert_true(h1_respond_data(e->reqs[0], "ignored", 7));
  h1_respond_end(e->reqs[0]);
  send_gets(e, 1);
  h1_respond(e->reqs[1], 200, "text/plain", strdup("b"), 1, false);
  pump(e, 0);
  assert_true(got(e, "Content-Length: 1234\r\n"));
  assert_false(got(e, "ignored"));
  assert_true(got(e, "\r\n\r\nHTTP/1.1 200 OK")); /* the next reply right after the headers */
}

static void test_a_cut_body_closes_the_connection(void **state) {
  env_t *e = *state;
  send_gets(e, 2); /* the second is never answered: its connection closes */
  h1_respond_start(e->reqs[0], 200, "text/plain", 100);
  assert_true(h1_respond_data(e->reqs[0], "part", 4));
  h1_respond_abort(e->reqs[0]);
  h1_respond(e->reqs[1], 200, "text/plain", strdup("late"), 4, false);
  pump(e, 0);
  assert_true(e->eof);
  assert_true(got(e, "\r\n\r\npart"));
  assert_false(got(e, "late"));
  /* Past its length a body breaks; ended short of it, it is cut too. */
  for (int i = 2; i < 4; i++) {
    close(e->client);
    connect_client(e, 0);
    e->in_len = 0;
    e->eof = false;
    send_gets(e, 1);
    h1_respond_start(e->reqs[i], 200, "text/plain", 3);
    if (i == 2) {
      assert_false(h1_respond_data(e->reqs[i], "four", 4));
      assert_false(h1_respond_data(e->reqs[i], "ab", 2)); /* broken: nothing more goes */
    } else {
      assert_true(h1_respond_data(e->reqs[i], "ab", 2));
    }
    h1_respond_end(e->reqs[i]);
    pump(e, 0);
    assert_true(e->eof);
    assert_true(got(e, "Content-Length: 3\r\n"));
    assert_false(got(e, "four"));
    assert_true(i == 2 ? !got(e, "ab") : got(e, "\r\n\r\nab"));
  }
}

static void test_a_body_to_the_close_is_reset_when_cut(void **state) {
  env_t *e = *state;
  send_text(e, "GET /s HTTP/1.0\r\n\r\n", 1);
  h1_respond_start(e->reqs[0], 200, "text/plain", -1);
  assert_true(h1_respond_data(e->reqs[0], "whole", 5));
  h1_respond_end(e->reqs[0]);
  pump(e, 0);
  assert_true(got(e, "Connection: close\r\n"));
  assert_false(got(e, "chunked"));
  assert_true(got(e, "\r\n\r\nwhole"));
  assert_true(e->eof);
  assert_false(e->reset); /* ended: the connection's end is the body's */
  close(e->client);
  connect_client(e, 0);
  e->in_len = 0;
  e->eof = false;
  send_text(e, "GET /s HTTP/1.0\r\n\r\n", 1);
  h1_respond_start(e->reqs[1], 200, "text/plain", -1);
  assert_true(h1_respond_data(e->reqs[1], "cut", 3));
  pump(e, 0);
  h1_respond_abort(e->reqs[1]);
  pump(e, 0);
  assert_true(e->eof);
  assert_true(e->reset); /* cut: no end of stream that would read as the body's end */
}

static void on_ready(void *arg) {
  env_t *e = arg;
  e->readies++;
}

static void on_free(void *arg) {
  env_t *e = arg;
  e->frees++;
}

static void test_backpressure(void **state) {
  env_t *e = *state;
  close(e->client);
  connect_client(e, 4096); /* a small window: the server's socket fills soon */
  send_gets(e, 1);
  h1_req_t *q = e->reqs[0];
  h1_on_free(q, on_free, e);
  h1_respond_start(q, 200, "application/octet-stream", -1);
  static char block[16384];
  memset(block, 'x', sizeof block);
  int pieces = 0;
  while (!h1_respond_full(q)) {
    assert_true(h1_respond_data(q, block, sizeof block));
    run_ready(e);
    assert_true(++pieces < 1000);
  }
  h1_respond_wait(q, on_ready, e);
  run_ready(e);
  assert_int_equal(e->readies, 0); /* nobody read: the producer waits */
  pump(e, 0);                      /* the client reads all there is */
  assert_int_equal(e->readies, 1);
  assert_false(h1_respond_full(q));
  /* The client goes away: a producer waiting is told, and its data refused. */
  assert_true(h1_respond_data(q, block, sizeof block));
  while (!h1_respond_full(q))
    assert_true(h1_respond_data(q, block, sizeof block));
  h1_respond_wait(q, on_ready, e);
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  setsockopt(e->client, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(e->client);
  e->client = -1;
  for (int turns = 0; turns < 50 && e->readies < 2; turns++)
    event_base_loop(e->base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
  assert_int_equal(e->readies, 2);
  assert_false(h1_respond_data(q, block, sizeof block));
  assert_false(h1_respond_full(q));
  assert_int_equal(e->frees, 0);
  h1_respond_end(q); /* frees the orphan */
  assert_int_equal(e->frees, 1);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* a write to a reset connection fails instead */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_body_by_length_arrives_as_given, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chunked_and_request_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_body_from_a_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_head_gets_the_length_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_cut_body_closes_the_connection, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_body_to_the_close_is_reset_when_cut, setup, teardown),
      cmocka_unit_test_setup_teardown(test_backpressure, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
