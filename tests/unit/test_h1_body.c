/*
 * test_h1_body.c — unit tests of the request-body controls a proxy needs
 * (h1.h, "streamed bodies"; the node agent's forwarder uses them), on a real
 * server and a loopback client: a relayed body's "100 Continue" goes only
 * when the sink says (h1_body_relay, h1_body_continue); a refused one never
 * goes, the refusal closes the connection (h1_body_refuse); a paused body
 * is not read until resumed (h1_body_pause, h1_body_resume), then whole; a
 * body refused while it flows is dropped up to a bound and the connection
 * kept (h1_body_drop), closed past the bound.
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
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/h1.h"

typedef struct {
  struct event_base *base;
  h1_server_t *srv;
  int client;
  h1_req_t *q;      /* the request dispatched */
  bool relay;       /* the dispatch relays (else streams) the body */
  bool pause_first; /* the sink pauses at its first piece */
  size_t body_len;  /* bytes the sink got */
  int ends;
  h1_body_end_t how;
  char in[4096]; /* what the client read */
  size_t in_len;
  bool eof;
} env_t;

static bool on_data(void *arg, const char *data, size_t len) {
  env_t *e = arg;
  (void)data;
  if (e->body_len == 0 && e->pause_first)
    h1_body_pause(e->q);
  e->body_len += len;
  return true;
}

static void on_end(void *arg, h1_body_end_t how) {
  env_t *e = arg;
  e->ends++;
  e->how = how;
}

static void on_dispatch(h1_req_t *q, void *arg) {
  env_t *e = arg;
  e->q = q;
  if (e->relay)
    h1_body_relay(q, on_data, on_end, e);
  else
    h1_body_stream(q, on_data, on_end, e);
  h1_hold(q);
}

static bool on_streams(const h1_req_t *q, void *arg) {
  (void)arg;
  return h1_length(q) != 0;
}

static int setup(void **state) {
  env_t *e = calloc(1, sizeof *e);
  e->base = event_base_new();
  h1_config_t cfg = {.dispatch = on_dispatch,
                     .streams = on_streams,
                     .arg = e,
                     .max_head = 8192,
                     .max_body = 1 << 20,
                     .idle_ms = 60000};
  e->srv = h1_server_new(e->base, &cfg);
  char err[128];
  int port = h1_server_listen(e->srv, "127.0.0.1", 0, err, sizeof err);
  assert_true(port > 0);
  e->client = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(e->client, (struct sockaddr *)&sa, sizeof sa), 0);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  env_t *e = *state;
  close(e->client);
  h1_server_free(e->srv);
  event_base_free(e->base);
  free(e);
  return 0;
}

/* Runs the loop and reads what the client can, for a few idle turns. */
static void pump(env_t *e) {
  for (int idle = 0; idle < 10 && !e->eof;) {
    for (int i = 0; i < 4; i++)
      event_base_loop(e->base, EVLOOP_NONBLOCK);
    ssize_t n = recv(e->client, e->in + e->in_len, sizeof e->in - 1 - e->in_len, MSG_DONTWAIT);
    if (n > 0) {
      e->in_len += (size_t)n;
      e->in[e->in_len] = '\0';
      idle = 0;
    } else if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      e->eof = true;
    } else {
      struct pollfd p = {.fd = e->client, .events = POLLIN};
      poll(&p, 1, 5);
      idle++;
    }
  }
}

static void send_text(env_t *e, const char *text) {
  assert_int_equal(write(e->client, text, strlen(text)), (ssize_t)strlen(text));
}

static const char expect_head[] = "PUT /u HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                                  "Expect: 100-continue\r\n\r\n";

static void test_a_relayed_continue_waits_for_the_sink(void **state) {
  env_t *e = *state;
  e->relay = true;
  send_text(e, expect_head);
  pump(e);
  assert_non_null(e->q);
  assert_int_equal(e->in_len, 0); /* no 100 of h1's own */
  h1_body_continue(e->q);
  pump(e);
  assert_string_equal(e->in, "HTTP/1.1 100 Continue\r\n\r\n");
  send_text(e, "hello");
  pump(e);
  assert_int_equal(e->body_len, 5);
  assert_int_equal(e->ends, 1);
  assert_int_equal(e->how, H1_BODY_DONE);
  h1_respond(e->q, 201, NULL, NULL, 0, false);
  pump(e);
  assert_non_null(strstr(e->in, "HTTP/1.1 201"));
  assert_false(e->eof);
}

static void test_a_refused_body_is_never_asked_for(void **state) {
  env_t *e = *state;
  e->relay = true;
  send_text(e, expect_head);
  pump(e);
  h1_body_refuse(e->q);
  h1_respond(e->q, 401, NULL, NULL, 0, false);
  send_text(e, "hello"); /* a client that sends on anyway: dropped */
  pump(e);
  assert_int_equal(strncmp(e->in, "HTTP/1.1 401", 12), 0); /* no 100 before it */
  assert_non_null(strstr(e->in, "Connection: close\r\n"));
  assert_true(e->eof);
  assert_int_equal(e->body_len, 0);
  assert_int_equal(e->ends, 0); /* the sink was detached */
}

static void test_a_paused_body_waits_for_its_resume(void **state) {
  env_t *e = *state;
  e->pause_first = true;
  send_text(e, "PUT /u HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nfirst");
  pump(e);
  assert_int_equal(e->body_len, 5);
  send_text(e, "later");
  pump(e);
  assert_int_equal(e->body_len, 5); /* not read while paused */
  assert_int_equal(e->ends, 0);
  h1_body_resume(e->q);
  pump(e);
  assert_int_equal(e->body_len, 10);
  assert_int_equal(e->ends, 1);
  assert_int_equal(e->how, H1_BODY_DONE);
  h1_respond(e->q, 201, NULL, NULL, 0, false);
  pump(e);
  assert_non_null(strstr(e->in, "HTTP/1.1 201"));
}

static void test_a_dropped_body_keeps_the_connection(void **state) {
  env_t *e = *state;
  send_text(e, "PUT /u HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nfirst");
  pump(e);
  h1_req_t *q = e->q;
  assert_int_equal(e->body_len, 5);
  h1_body_drop(q, 100);
  h1_respond(q, 401, NULL, NULL, 0, false);
  send_text(e, "later"); /* the rest of the body: dropped */
  send_text(e, "GET /next HTTP/1.1\r\nHost: t\r\n\r\n");
  pump(e);
  assert_ptr_not_equal(e->q, q); /* the next request was read */
  h1_respond(e->q, 200, NULL, NULL, 0, false);
  pump(e);
  assert_int_equal(strncmp(e->in, "HTTP/1.1 401", 12), 0);
  assert_null(strstr(e->in, "Connection: close"));
  assert_non_null(strstr(e->in, "HTTP/1.1 200"));
  assert_false(e->eof);
  assert_int_equal(e->body_len, 5);
  assert_int_equal(e->ends, 0); /* the sink was detached */
}

static void test_a_body_longer_than_the_drop_closes(void **state) {
  env_t *e = *state;
  send_text(e, "PUT /u HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\nfirst");
  pump(e);
  h1_body_drop(e->q, 100); /* 995 bytes left */
  h1_respond(e->q, 401, NULL, NULL, 0, false);
  pump(e);
  assert_non_null(strstr(e->in, "Connection: close\r\n"));
  assert_true(e->eof);
}

static void test_a_chunked_body_past_the_drop_closes(void **state) {
  env_t *e = *state;
  send_text(e, "PUT /u HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
  pump(e);
  h1_body_drop(e->q, 8);
  h1_respond(e->q, 401, NULL, NULL, 0, false);
  pump(e);
  assert_false(e->eof); /* 8 bytes may come */
  send_text(e, "5\r\nabcde\r\n");
  pump(e);
  assert_false(e->eof);
  send_text(e, "5\r\nfghij\r\n"); /* 10 dropped: past the bound */
  pump(e);
  assert_int_equal(strncmp(e->in, "HTTP/1.1 401", 12), 0);
  assert_true(e->eof);
  assert_int_equal(e->body_len, 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_a_relayed_continue_waits_for_the_sink, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_refused_body_is_never_asked_for, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_paused_body_waits_for_its_resume, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_dropped_body_keeps_the_connection, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_body_longer_than_the_drop_closes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_chunked_body_past_the_drop_closes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
