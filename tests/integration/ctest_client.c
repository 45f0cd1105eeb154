/*
 * ctest_client.c — libmuster against a real head: every call of muster.h,
 * its success path and its documented errors.
 *
 * Starts `$MUSTER_BIN head --listen 127.0.0.1:0` with a temporary data dir,
 * waits for DATA_DIR/url, runs the checks and stops the head.  Set
 * MUSTER_TEST_URL and MUSTER_TEST_TOKEN to run against a head you started
 * yourself instead.  Ends with "N passed, M failed"; exits 1 when M > 0.
 * A tiny fake server (a thread) answers garbage to test MUSTER_PROTOCOL.
 */
#include "ctest_util.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#define TOKEN "ctest-token-0123456789"

/* ---- a fake server that answers one fixed reply per connection ---------------------- */

typedef struct {
  int fd;
  const char *reply;
} fake_t;

static void *fake_main(void *arg) {
  fake_t *fake = arg;
  int conn = accept(fake->fd, NULL, NULL);
  if (conn >= 0) {
    char buf[4096];
    ssize_t n = read(conn, buf, sizeof buf); /* the request: small, one read suffices */
    (void)n;
    ssize_t w = write(conn, fake->reply, strlen(fake->reply));
    (void)w;
    close(conn);
  }
  return NULL;
}

/* Serves `reply` to one connection; writes its URL to `url`. */
static int fake_start(fake_t *fake, pthread_t *thread, const char *reply, char *url, size_t size) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  fake->reply = reply;
  fake->fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fake->fd < 0 || bind(fake->fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      listen(fake->fd, 1) != 0 || getsockname(fake->fd, (struct sockaddr *)&addr, &len) != 0)
    return -1;
  snprintf(url, size, "http://127.0.0.1:%d", ntohs(addr.sin_port));
  return pthread_create(thread, NULL, fake_main, fake);
}

/* Calls muster_queue_list against a fake server replying `reply`. */
static muster_err_t against_fake(const char *reply, char *message, size_t size) {
  fake_t fake;
  pthread_t thread;
  char url[64];
  if (fake_start(&fake, &thread, reply, url, sizeof url) != 0)
    return MUSTER_ERR_COUNT;
  muster_client_t *client = NULL;
  muster_client_new(url, "x", &client);
  char *json = NULL;
  muster_err_t err = muster_queue_list(client, &json);
  snprintf(message, size, "%s", muster_client_message(client));
  muster_free(json);
  muster_client_free(client);
  pthread_join(thread, NULL);
  close(fake.fd);
  return err;
}

/* ---- the checks ------------------------------------------------------------------------ */

static void test_error_table(void) {
  CHECK(strcmp(muster_err_name(MUSTER_QUEUE_NOT_FOUND), "queue_not_found") == 0);
  CHECK(strcmp(muster_strerror(MUSTER_QUEUE_NOT_FOUND), "no such queue") == 0);
  CHECK(strcmp(muster_strerror(MUSTER_OK), "success") == 0);
  CHECK(muster_strerror((muster_err_t)9999) != NULL);
  CHECK(muster_err_from_name("lease_lost") == MUSTER_LEASE_LOST);
  CHECK(muster_err_from_name("no_such_code") == MUSTER_PROTOCOL);
  CHECK(muster_err_http_status(MUSTER_LEASE_LOST) == 409);
  CHECK(muster_err_http_status(MUSTER_NETWORK) == 0);
  for (int i = 0; i < MUSTER_ERR_COUNT; i++)
    CHECK(muster_err_from_name(muster_err_name((muster_err_t)i)) == (muster_err_t)i);
}

static void test_handle(void) {
  muster_client_t *client = (muster_client_t *)1;
  CHECK_ERR(NULL, muster_client_new(NULL, TOKEN, &client), MUSTER_INVALID);
  CHECK(client == NULL);
  CHECK_ERR(NULL, muster_client_new("", TOKEN, &client), MUSTER_INVALID);
  CHECK_ERR(NULL, muster_client_new(head_url, "bad\r\ntoken", &client), MUSTER_INVALID);
  CHECK_ERR(NULL, muster_client_new(head_url, TOKEN, NULL), MUSTER_INVALID);
  muster_client_free(NULL);
  muster_free(NULL);
  muster_leases_free(NULL, 0);
  CHECK(strcmp(muster_client_message(NULL), "") == 0);
  CHECK(muster_client_status(NULL) == 0);
  /* Health needs no token; a trailing slash in the URL is fine. */
  char url[300];
  snprintf(url, sizeof url, "%s/", head_url);
  CHECK_OK(NULL, muster_client_new(url, NULL, &client));
  CHECK_OK(client, muster_health(client));
  CHECK(muster_client_status(client) == 200);
  CHECK(strcmp(muster_client_message(client), "") == 0);
  char *reply = NULL;
  CHECK_OK(client, muster_request(client, "GET", "/v1/health", NULL, &reply));
  CHECK(contains(reply, "\"ok\""));
  muster_free(reply);
  CHECK_ERR(client, muster_queue_list(client, &reply), MUSTER_UNAUTHORIZED);
  CHECK(reply == NULL);
  CHECK(muster_client_status(client) == 401);
  muster_client_free(client);
}

/* A URL that is not http:// or https:// is refused when the handle is made,
 * in words naming it, not at the first call in libcurl's ("Unsupported
 * protocol"); muster_client_open hands those words back. */
static void check_url_refused(const char *url, int line) {
  muster_client_t *client = (muster_client_t *)1;
  char *message = NULL, want[160];
  check_err(muster_client_new(url, TOKEN, &client), MUSTER_INVALID, url, line, "");
  check(client == NULL, "no handle", line);
  check_err(muster_client_open(url, TOKEN, &client, &message), MUSTER_INVALID, url, line, message);
  snprintf(want, sizeof want, "url '%s': expected http://HOST[:PORT] or https://HOST[:PORT]", url);
  check(contains(message, want), want, line);
  muster_free(message);
}

static void test_url_schemes(void) {
  check_url_refused("ftp://127.0.0.1:7370", __LINE__);
  check_url_refused("127.0.0.1:7370", __LINE__);
  check_url_refused("localhost", __LINE__);
  check_url_refused("http://", __LINE__);
  check_url_refused("https:///v1", __LINE__);
  check_url_refused("http:/127.0.0.1:7370", __LINE__);
  muster_client_t *client = NULL;
  char *message = (char *)1;
  CHECK_ERR(NULL, muster_client_open(NULL, TOKEN, &client, &message), MUSTER_INVALID);
  CHECK(contains(message, "url: required"));
  muster_free(message);
  CHECK_ERR(NULL, muster_client_open(head_url, "a\nb", &client, &message), MUSTER_INVALID);
  CHECK(contains(message, "token: contains a line break"));
  muster_free(message);
  CHECK_ERR(NULL, muster_client_open(head_url, TOKEN, NULL, &message), MUSTER_INVALID);
  CHECK(contains(message, "out: a place for the handle is required"));
  muster_free(message);
  /* Either scheme in any case is taken; nothing is connected yet. */
  const char *good[] = {"HTTP://127.0.0.1:9", "https://127.0.0.1:9/prefix", "Https://[::1]:9"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    CHECK_OK(NULL, muster_client_open(good[i], TOKEN, &client, &message));
    CHECK(client != NULL && message == NULL);
    muster_client_free(client);
  }
}

static void test_auth_and_network(void) {
  muster_client_t *client = connect_head("wrong-token-0123");
  char *json = NULL;
  CHECK_ERR(client, muster_queue_list(client, &json), MUSTER_UNAUTHORIZED);
  CHECK(muster_client_message(client)[0] != '\0');
  CHECK(muster_client_status(client) == 401);
  muster_client_free(client);
  /* Port 1 on loopback: nothing listens there. */
  CHECK_OK(NULL, muster_client_new("http://127.0.0.1:1", TOKEN, &client));
  CHECK_ERR(client, muster_health(client), MUSTER_NETWORK);
  CHECK(muster_client_message(client)[0] != '\0');
  CHECK(muster_client_status(client) == 0);
  muster_lease_t *leases = NULL;
  size_t count = 7;
  CHECK_ERR(client, muster_lease(client, "q", 0, 1, 0, &leases, &count), MUSTER_NETWORK);
  CHECK(leases == NULL && count == 0);
  muster_client_free(client);
}

/* A pool's request timeout (muster_pool_opts_t.request_timeout_ms) bounds
 * each of its requests, so a head that stops answering fails open and
 * iter_next with MUSTER_NETWORK after about that (plus the long-poll's
 * wait), not after the 60 s default.  The bounds are loose: only a wait far
 * beyond the timeout fails them. */
static void test_pool_request_timeout(void) {
  int fds[2];
  char url[64] = "", *message = NULL;
  muster_pool_t *pool = NULL;
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, url, "ct-timeout");
  opts.request_timeout_ms = 500;
  CHECK(ctest_listener(1, fds, url, sizeof url) == 0); /* connects, never answers */
  int64_t start = now_ms();
  CHECK_ERR(NULL, muster_pool_open(&opts, &pool, &message), MUSTER_NETWORK);
  CHECK(now_ms() - start < 500 + 10000 && pool == NULL);
  CHECK(contains(message, "timed out waiting for the reply"));
  muster_free(message);
  ctest_listener_close(fds);
  opts.url = head_url;
  if (head_pid <= 0 || muster_pool_open(&opts, &pool, NULL) != MUSTER_OK)
    return; /* a head started by hand is not this program's to stop */
  const char *inputs[] = {"1"};
  muster_pool_iter_t *it = NULL;
  muster_result_t r;
  int has = 0;
  CHECK_ERR(NULL, muster_pool_imap(pool, inputs, 1, 1, &it), MUSTER_OK);
  kill(head_pid, SIGSTOP);
  start = now_ms();
  check_err(muster_pool_iter_next(it, 200, &r, &has), MUSTER_NETWORK, "iter_next, head stopped",
            __LINE__, muster_pool_message(pool));
  CHECK(now_ms() - start < 200 + 500 + 10000);
  kill(head_pid, SIGCONT);
  CHECK(contains(muster_pool_message(pool), "timed out waiting for the reply"));
  muster_pool_iter_free(it);
  muster_pool_close(pool);
}

static void test_protocol_errors(void) {
  char message[512];
  CHECK(against_fake("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                     message, sizeof message) == MUSTER_PROTOCOL);
  CHECK(message[0] != '\0');
  CHECK(against_fake("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
                     "bad",
                     message, sizeof message) == MUSTER_INTERNAL);
  CHECK(contains(message, "502"));
  const char *envelope = "{\"error\":{\"code\":\"unavailable\",\"message\":\"going down\"}}";
  char reply[256];
  snprintf(reply, sizeof reply,
           "HTTP/1.1 503 Service Unavailable\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
           strlen(envelope), envelope);
  CHECK(against_fake(reply, message, sizeof message) == MUSTER_UNAVAILABLE);
  CHECK(strcmp(message, "going down") == 0);
}

/* What muster_client_server says after one reply of a fake server, whose
 * head's lines are `headers`, reached at its URL (with `user_info`, "u@",
 * libcurl carries the call, not http1.c); the next call, refused (the fake
 * is gone), must leave it. */
static muster_server_t server_of(const char *user_info, const char *headers) {
  char reply[512], url[96];
  snprintf(reply, sizeof reply,
           "HTTP/1.1 200 OK\r\n%sContent-Length: 2\r\nConnection: close\r\n\r\n{}", headers);
  fake_t fake;
  pthread_t thread;
  if (fake_start(&fake, &thread, reply, url, sizeof url) != 0)
    return (muster_server_t)-1;
  char formed[128];
  snprintf(formed, sizeof formed, "http://%s%s", user_info, url + strlen("http://"));
  muster_client_t *client = NULL;
  muster_client_new(formed, "x", &client);
  muster_server_t before = muster_client_server(client);
  char *body = NULL;
  muster_err_t err = muster_request(client, "GET", "/v1/health", NULL, &body);
  muster_free(body);
  pthread_join(thread, NULL);
  close(fake.fd);
  muster_server_t said = muster_client_server(client);
  CHECK(before == MUSTER_SERVER_UNKNOWN && err == MUSTER_OK);
  CHECK_ERR(client, muster_request(client, "GET", "/v1/health", NULL, NULL), MUSTER_NETWORK);
  CHECK(muster_client_server(client) == said);
  muster_client_free(client);
  return said;
}

/* A reply says what answers at the URL: its Server header, or a Via naming a
 * muster node (an older agent passes the head's Server on), through either
 * transport; a request that gets no reply leaves what the last one said. */
static void test_server_kind(void) {
  static const char *const forms[] = {"", "u@"};
  for (size_t i = 0; i < 2; i++) {
    const char *f = forms[i];
    CHECK(server_of(f, "Server: muster-head\r\n") == MUSTER_SERVER_HEAD);
    CHECK(server_of(f, "Server: muster-node\r\n") == MUSTER_SERVER_NODE);
    CHECK(server_of(f, "server:  muster-node/2.0 (linux)\r\n") == MUSTER_SERVER_NODE);
    CHECK(server_of(f, "Server: muster-head\r\nVia: 1.1 n1 (muster node)\r\n") ==
          MUSTER_SERVER_NODE);
    CHECK(server_of(f, "Via: 1.1 n1 (muster node)\r\nServer: muster-head\r\n") ==
          MUSTER_SERVER_NODE);
    CHECK(server_of(f, "Server: muster-headless\r\n") == MUSTER_SERVER_UNKNOWN);
    CHECK(server_of(f, "Server: nginx\r\nVia: 1.1 proxy\r\n") == MUSTER_SERVER_UNKNOWN);
    CHECK(server_of(f, "") == MUSTER_SERVER_UNKNOWN);
  }
  CHECK(muster_client_server(NULL) == MUSTER_SERVER_UNKNOWN);
  CHECK(muster_pool_server(NULL) == MUSTER_SERVER_UNKNOWN);
  muster_client_t *client = connect_head(head_token);
  char *json = NULL;
  CHECK_OK(client, muster_queue_list(client, &json));
  CHECK(muster_client_server(client) == MUSTER_SERVER_HEAD);
  muster_free(json);
  muster_client_free(client);
}

/* A registration whose reply has no timeout_ms (an older head's) gives 0. */
static void test_register_without_timeout(void) {
  const char *body = "{\"id\":5,\"name\":\"old-5\",\"nickname\":\"anonymous\"}";
  char reply[256], url[64];
  snprintf(reply, sizeof reply,
           "HTTP/1.1 201 Created\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
           strlen(body), body);
  fake_t fake;
  pthread_t thread;
  if (fake_start(&fake, &thread, reply, url, sizeof url) != 0) {
    CHECK(!"fake server");
    return;
  }
  muster_client_t *client = NULL;
  muster_client_new(url, "x", &client);
  muster_worker_reg_t reg;
  muster_worker_reg_init(&reg);
  reg.timeout_ms = 77;
  CHECK_OK(client, muster_worker_register_full(client, NULL, &reg));
  CHECK(reg.id == 5 && reg.timeout_ms == 0 && reg.repeated == 0);
  CHECK(reg.name != NULL && strcmp(reg.name, "old-5") == 0);
  muster_worker_reg_clear(&reg);
  CHECK(reg.name == NULL);
  muster_worker_reg_clear(NULL);
  muster_client_free(client);
  pthread_join(thread, NULL);
  close(fake.fd);
}

static void test_queues(muster_client_t *c) {
  muster_queue_opts_t opts;
  muster_queue_opts_init(&opts);
  CHECK(opts.lease_ms == -1 && opts.next == NULL);
  char *json = NULL;
  CHECK_OK(c, muster_queue_put(c, "ct-last", NULL, &json));
  CHECK(muster_client_status(c) == 201);
  CHECK(contains(json, "\"name\":\"ct-last\""));
  CHECK(contains(json, "\"lease_ms\":60000"));
  muster_free(json);
  opts.lease_ms = 30000;
  opts.max_attempts = 2;
  opts.backoff_ms = 0;
  opts.backoff_max_ms = 0;
  opts.max_flags = 2;
  opts.next = "ct-last";
  CHECK_OK(c, muster_queue_put(c, "ct-first", &opts, &json));
  CHECK(contains(json, "\"next\":\"ct-last\"") && contains(json, "\"max_attempts\":2"));
  muster_free(json);
  muster_queue_opts_init(&opts);
  opts.lease_ms = 20000;
  CHECK_OK(c, muster_queue_put(c, "ct-first", &opts, NULL));
  CHECK(muster_client_status(c) == 200);
  CHECK_OK(c, muster_queue_get(c, "ct-first", &json));
  CHECK(contains(json, "\"lease_ms\":20000") && contains(json, "\"next\":\"ct-last\""));
  CHECK(contains(json, "\"counts\""));
  muster_free(json);
  CHECK_ERR(c, muster_queue_get(c, "ct-nope", &json), MUSTER_QUEUE_NOT_FOUND);
  CHECK(json == NULL);
  CHECK(muster_client_status(c) == 404);
  CHECK(contains(muster_client_message(c), "ct-nope"));
  CHECK_ERR(c, muster_queue_put(c, "bad name/x", NULL, NULL), MUSTER_NAME_INVALID);
  opts.next = "ct-nope";
  CHECK_ERR(c, muster_queue_put(c, "ct-other", &opts, NULL), MUSTER_QUEUE_NOT_FOUND);
  muster_queue_opts_init(&opts);
  opts.lease_ms = 0;
  CHECK_ERR(c, muster_queue_put(c, "ct-other", &opts, NULL), MUSTER_INVALID);
  CHECK_OK(c, muster_queue_list(c, &json));
  CHECK(contains(json, "\"ct-first\"") && contains(json, "\"ct-last\""));
  muster_free(json);
  CHECK_ERR(c, muster_queue_delete(c, "ct-last"), MUSTER_QUEUE_IN_USE);
  CHECK_ERR(c, muster_queue_delete(c, "ct-nope"), MUSTER_QUEUE_NOT_FOUND);
  CHECK_ERR(c, muster_queue_purge(c, "ct-nope", NULL), MUSTER_QUEUE_NOT_FOUND);
}

static void test_put_and_get(muster_client_t *c) {
  muster_task_spec_t specs[3];
  for (int i = 0; i < 3; i++)
    muster_task_spec_init(&specs[i]);
  CHECK(specs[0].index == -1 && specs[0].priority == 0);
  specs[0].payload = "\"plain\"";
  specs[1].payload = "{\"n\":1}";
  specs[1].priority = 5;
  specs[1].key = "ct-key";
  specs[2].payload = "[1,2]";
  specs[2].session = "s1";
  specs[2].index = 4;
  int64_t ids[3] = {0};
  CHECK_OK(c, muster_put(c, "ct-first", specs, 3, ids));
  CHECK(ids[0] > 0 && ids[1] > ids[0] && ids[2] > ids[1]);
  int64_t again = 0;
  CHECK_OK(c, muster_put(c, "ct-first", &specs[1], 1, &again));
  CHECK(again == ids[1]);
  specs[0].payload = "{not json";
  CHECK_ERR(c, muster_put(c, "ct-first", specs, 3, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "tasks[0]"));
  specs[0].payload = "\"plain\"";
  CHECK_ERR(c, muster_put(c, "ct-nope", specs, 1, NULL), MUSTER_QUEUE_NOT_FOUND);
  char *json = NULL;
  CHECK_OK(c, muster_task_get(c, ids[1], &json));
  CHECK(contains(json, "\"priority\":5") && contains(json, "\"key\":\"ct-key\""));
  CHECK(contains(json, "\"state\":\"queued\""));
  muster_free(json);
  CHECK_OK(c, muster_task_get(c, ids[2], &json));
  CHECK(contains(json, "\"session\":\"s1\"") && contains(json, "\"index\":4"));
  muster_free(json);
  CHECK_ERR(c, muster_task_get(c, 999999, &json), MUSTER_TASK_NOT_FOUND);
  CHECK(json == NULL);
  CHECK_OK(c, muster_task_list(c, "ct-first", NULL, 0, 2, &json));
  CHECK(contains(json, "\"plain\"") && !contains(json, "[1,2]"));
  CHECK(!contains(json, "\"next\":null"));
  muster_free(json);
  CHECK_OK(c, muster_task_list(c, "ct-first", "queued", ids[1], 0, &json));
  CHECK(contains(json, "[1,2]") && !contains(json, "\"plain\"") && contains(json, "\"next\":null"));
  muster_free(json);
  CHECK_OK(c, muster_task_list(c, "ct-first", "done", 0, 0, &json));
  CHECK(contains(json, "\"tasks\":[]"));
  muster_free(json);
  CHECK_ERR(c, muster_task_list(c, "ct-first", "bogus", 0, 0, &json), MUSTER_INVALID);
  CHECK_ERR(c, muster_task_list(c, "ct-nope", NULL, 0, 0, &json), MUSTER_QUEUE_NOT_FOUND);
}

/* Leases the three tasks of test_put_and_get and acknowledges them in every way. */
static void test_leases(muster_client_t *c) {
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease(c, "ct-first", 0, 10, 0, &l, &n));
  CHECK(n == 3);
  if (n != 3) {
    muster_leases_free(l, n);
    return;
  }
  /* Priority first, then put order. */
  CHECK(strcmp(l[0].payload, "{\"n\":1}") == 0 && strcmp(l[1].payload, "\"plain\"") == 0);
  CHECK(l[0].attempt == 1 && l[0].token > 0 && l[0].deadline_ms > 0 && l[0].parent == 0);
  CHECK(l[0].session == NULL && l[0].index == -1);
  CHECK(l[2].session && strcmp(l[2].session, "s1") == 0 && l[2].index == 4);
  muster_ack_t ack;
  muster_ack_init(&ack, l[0].task, l[0].token);
  CHECK(ack.lease_ms == -1 && ack.result == NULL && ack.permanent == 0);
  ack.lease_ms = 45000;
  CHECK_OK(c, muster_extend(c, &ack, 1));
  ack.result = "{\"out\":\"done\"}";
  int repeated = -1;
  CHECK_OK(c, muster_complete_repeats(c, &ack, 1, &repeated));
  CHECK(repeated == 0);                     /* completed now */
  CHECK_OK(c, muster_complete(c, &ack, 1)); /* a repeat (a retry after a lost reply) */
  CHECK_OK(c, muster_complete_repeats(c, &ack, 1, &repeated));
  CHECK(repeated == MUSTER_ACK_REPEATED); /* the same result: nothing changed */
  ack.result = "{\"out\":\"other\"}";
  CHECK_OK(c, muster_complete_repeats(c, &ack, 1, &repeated));
  CHECK(repeated == (MUSTER_ACK_REPEATED | MUSTER_ACK_RESULT_IGNORED)); /* the first one stays */
  CHECK_OK(c, muster_complete_repeats(c, &ack, 1, NULL));               /* muster_complete */
  CHECK(strcmp(muster_client_message(c), "") == 0);
  CHECK_ERR(c, muster_extend(c, &ack, 1), MUSTER_LEASE_LOST); /* completed: the lease is over */
  CHECK(muster_client_status(c) == 409);
  char *json = NULL;
  CHECK_OK(c, muster_task_get(c, l[0].task, &json));
  CHECK(contains(json, "\"state\":\"done\"") && contains(json, "\"result\":{\"out\":\"done\"}"));
  muster_free(json);
  /* A wrong token is refused and the batch changes nothing. */
  muster_ack_t pair[2];
  muster_ack_init(&pair[0], l[1].task, l[1].token);
  muster_ack_init(&pair[1], l[2].task, l[2].token + 1000);
  CHECK_ERR(c, muster_complete(c, pair, 2), MUSTER_LEASE_LOST);
  CHECK_OK(c, muster_task_get(c, l[1].task, &json));
  CHECK(contains(json, "\"state\":\"leased\""));
  muster_free(json);
  /* fail (retry), release, flag. */
  muster_ack_init(&ack, l[1].task, l[1].token);
  ack.error = "try again";
  CHECK_OK(c, muster_fail(c, &ack, 1));
  CHECK_OK(c, muster_task_get(c, l[1].task, &json));
  CHECK(contains(json, "\"state\":\"queued\"") && contains(json, "\"error\":\"try again\""));
  muster_free(json);
  muster_ack_init(&ack, l[2].task, l[2].token);
  CHECK_OK(c, muster_release(c, &ack, 1));
  /* Sent again (a lost reply) it is a repeat; a fail under that token is refused. */
  CHECK_OK(c, muster_release(c, &ack, 1));
  CHECK_ERR(c, muster_fail(c, &ack, 1), MUSTER_LEASE_LOST);
  muster_leases_free(l, n);
}

/* The completed task went on to the next stage with its parent set. */
static void test_pipeline_and_flags(muster_client_t *c) {
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease(c, "ct-last", 0, 5, 0, &l, &n));
  CHECK(n == 1);
  if (n == 1) {
    CHECK(strcmp(l[0].payload, "{\"out\":\"done\"}") == 0 && l[0].parent > 0);
    muster_ack_t ack;
    muster_ack_init(&ack, l[0].task, l[0].token);
    ack.error = "corrupt input";
    CHECK_OK(c, muster_flag(c, &ack, 1));
    char *json = NULL;
    CHECK_OK(c, muster_task_get(c, l[0].task, &json));
    CHECK(contains(json, "\"flags\":1"));
    muster_free(json);
  }
  muster_leases_free(l, n);
}

static void test_fail_permanent_and_requeue(muster_client_t *c) {
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = "\"doomed\"";
  spec.priority = 100;
  int64_t id = 0;
  CHECK_OK(c, muster_put(c, "ct-first", &spec, 1, &id));
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease(c, "ct-first", 0, 1, 0, &l, &n));
  CHECK(n == 1 && l[0].task == id);
  if (n == 1) {
    muster_ack_t ack;
    muster_ack_init(&ack, l[0].task, l[0].token);
    ack.error = "no way";
    ack.permanent = 1;
    CHECK_OK(c, muster_fail(c, &ack, 1));
  }
  muster_leases_free(l, n);
  char *json = NULL;
  CHECK_OK(c, muster_task_get(c, id, &json));
  CHECK(contains(json, "\"state\":\"failed\""));
  muster_free(json);
  CHECK_OK(c, muster_task_requeue(c, id));
  CHECK_ERR(c, muster_task_requeue(c, id), MUSTER_INVALID_STATE);
  CHECK_ERR(c, muster_task_requeue(c, 999999), MUSTER_TASK_NOT_FOUND);
  CHECK_OK(c, muster_task_get(c, id, &json));
  CHECK(contains(json, "\"state\":\"queued\"") && contains(json, "\"attempts\":0"));
  muster_free(json);
}

/* A fail, release or flag sent again under the token whose lease it ended
 * is a repeat: muster_end_leases counts it, in a batch among fresh ones too,
 * and the first call's error stands. */
static void test_repeated_ends(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "ct-ends", NULL, NULL));
  muster_task_spec_t specs[4];
  for (size_t i = 0; i < 4; i++) {
    muster_task_spec_init(&specs[i]);
    specs[i].payload = "\"end me\"";
  }
  CHECK_OK(c, muster_put(c, "ct-ends", specs, 4, NULL));
  muster_lease_t *l = NULL;
  size_t n = 0, repeats = 9;
  CHECK_OK(c, muster_lease(c, "ct-ends", 0, 4, 0, &l, &n));
  CHECK(n == 4);
  if (n != 4) {
    muster_leases_free(l, n);
    return;
  }
  muster_ack_t acks[4];
  for (size_t i = 0; i < 4; i++)
    muster_ack_init(&acks[i], l[i].task, l[i].token);
  acks[0].error = "first";
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_FAIL, acks, 1, &repeats));
  CHECK(repeats == 0);
  acks[0].error = "second";
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_FAIL, acks, 2, &repeats));
  CHECK(repeats == 1); /* acks[0] again, acks[1] fresh */
  char *json = NULL;
  CHECK_OK(c, muster_task_get(c, l[0].task, &json));
  CHECK(contains(json, "\"error\":\"first\"")); /* the first fail stands */
  muster_free(json);
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_RELEASE, &acks[2], 1, &repeats));
  CHECK(repeats == 0);
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_RELEASE, &acks[2], 1, &repeats));
  CHECK(repeats == 1);
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_FLAG, &acks[3], 1, &repeats));
  CHECK(repeats == 0);
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_FLAG, &acks[3], 1, &repeats));
  CHECK(repeats == 1);
  CHECK_OK(c, muster_end_leases(c, MUSTER_END_FLAG, &acks[3], 1, NULL)); /* muster_flag */
  repeats = 9;
  /* Ended otherwise: no repeat, and *repeats untouched. */
  CHECK_ERR(c, muster_end_leases(c, MUSTER_END_FLAG, &acks[2], 1, &repeats), MUSTER_LEASE_LOST);
  CHECK(repeats == 9);
  CHECK_ERR(c, muster_end_leases(c, (muster_end_t)0, acks, 1, &repeats), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "how: 0 is no way to end a lease"));
  muster_leases_free(l, n);
}

static void test_workers(muster_client_t *c) {
  const char *queues[] = {"ct-wq", NULL};
  muster_worker_opts_t opts;
  muster_worker_opts_init(&opts);
  CHECK(opts.timeout_ms == -1 && opts.nickname == NULL);
  opts.nickname = "alice";
  opts.queues = queues;
  opts.node = "box-1";
  opts.labels = "{\"gpu\":\"a100\"}";
  opts.timeout_ms = 30000;
  int64_t id = 0;
  char *name = NULL;
  CHECK_OK(c, muster_worker_register(c, &opts, &id, &name));
  CHECK(id > 0 && name != NULL && name[0] != '\0');
  muster_free(name);
  /* The full registration gives the timeout the head holds the worker to,
   * and says when an instance's registration sent again got its worker back. */
  muster_worker_reg_t reg, again;
  muster_worker_reg_init(&reg);
  muster_worker_reg_init(&again);
  CHECK(reg.size == sizeof reg && reg.id == 0 && reg.name == NULL && reg.timeout_ms == 0);
  opts.instance = "ct-instance-1";
  CHECK_OK(c, muster_worker_register_full(c, &opts, &reg));
  CHECK_OK(c, muster_worker_register_full(c, &opts, &again));
  CHECK(reg.id > id && reg.timeout_ms == 30000 && reg.repeated == 0 && reg.name != NULL);
  CHECK(again.id == reg.id && again.timeout_ms == 30000 && again.repeated == 1);
  CHECK(reg.name && again.name && strcmp(reg.name, again.name) == 0);
  muster_worker_reg_clear(&reg);
  muster_worker_reg_clear(&again);
  opts.instance = NULL;
  opts.timeout_ms = -1; /* the head's default */
  CHECK_OK(c, muster_worker_register_full(c, &opts, &reg));
  CHECK(reg.timeout_ms == 60000);
  muster_worker_reg_clear(&reg);
  opts.timeout_ms = 30000;
  opts.labels = "[1]"; /* refused before sending: nothing is filled */
  reg.id = 9;
  CHECK_ERR(c, muster_worker_register_full(c, &opts, &reg), MUSTER_INVALID);
  CHECK(reg.id == 0 && reg.name == NULL && reg.size == sizeof reg);
  CHECK_ERR(c, muster_worker_register_full(c, &opts, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "reg: a place for the registration is required"));
  opts.labels = "{\"gpu\":\"a100\"}";
  opts.labels = "[1]";
  CHECK_ERR(c, muster_worker_register(c, &opts, &id, NULL), MUSTER_INVALID);
  CHECK_OK(c, muster_worker_heartbeat(c, id, "42% of shard 7"));
  CHECK_OK(c, muster_worker_heartbeat(c, id, NULL));
  char path[64], *reply = NULL;
  snprintf(path, sizeof path, "/v1/workers/%lld", (long long)id);
  CHECK_OK(c, muster_request(c, "GET", path, NULL, &reply));
  CHECK(contains(reply, "42% of shard 7") && contains(reply, "\"alice\""));
  muster_free(reply);
  /* A lease for the worker counts as its; bye releases it at once. */
  CHECK_OK(c, muster_queue_put(c, "ct-wq", NULL, NULL));
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = "1";
  int64_t task = 0;
  CHECK_OK(c, muster_put(c, "ct-wq", &spec, 1, &task));
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease(c, "ct-wq", id, 1, 0, &l, &n));
  CHECK(n == 1);
  CHECK_OK(c, muster_worker_bye(c, id));
  if (n == 1) {
    muster_ack_t ack;
    muster_ack_init(&ack, l[0].task, l[0].token);
    CHECK_ERR(c, muster_complete(c, &ack, 1), MUSTER_LEASE_LOST);
  }
  muster_leases_free(l, n);
  CHECK_ERR(c, muster_worker_heartbeat(c, 999999, "x"), MUSTER_WORKER_NOT_FOUND);
  CHECK_ERR(c, muster_worker_bye(c, 999999), MUSTER_WORKER_NOT_FOUND);
  CHECK_ERR(c, muster_lease(c, "ct-wq", 999999, 1, 0, &l, &n), MUSTER_WORKER_NOT_FOUND);
}

/* Negative numbers other than the documented -1s are refused with
 * MUSTER_INVALID naming the argument and its range; they used to be taken
 * silently as the default (a worker of -3 as anonymous, a wait of -1 as
 * none, a timeout of -5 as the head's). */
static void test_negative_arguments(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "ct-neg", NULL, NULL));
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = "1";
  CHECK_OK(c, muster_put(c, "ct-neg", &spec, 1, NULL));
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_ERR(c, muster_lease(c, "ct-neg", -3, 1, 0, &l, &n), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "worker: -3, expected a worker id or 0 (anonymous)") == 0);
  CHECK_ERR(c, muster_lease(c, "ct-neg", 0, 1, -1, &l, &n), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c),
               "wait_ms: -1, expected 0 or more milliseconds (0: do not wait)") == 0);
  CHECK_OK(c, muster_lease(c, "ct-neg", 0, 1, 0, &l, &n)); /* the task was still queued */
  CHECK(n == 1);
  if (n == 1) {
    muster_ack_t ack;
    muster_ack_init(&ack, l[0].task, l[0].token);
    ack.lease_ms = -5;
    CHECK_ERR(c, muster_extend(c, &ack, 1), MUSTER_INVALID);
    CHECK(contains(muster_client_message(c), "leases[0].lease_ms: -5, expected"));
    ack.lease_ms = -1;
    CHECK_OK(c, muster_extend(c, &ack, 1));
  }
  muster_leases_free(l, n);

  muster_session_opts_t sopts;
  muster_session_opts_init(&sopts);
  sopts.queue = "ct-neg";
  sopts.timeout_ms = -5;
  char *id = NULL;
  CHECK_ERR(c, muster_session_create(c, &sopts, &id, NULL), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c),
               "timeout_ms: -5, expected a time in milliseconds, or -1 for the head's default") ==
        0);
  CHECK(id == NULL);
  sopts.timeout_ms = -1;
  CHECK_OK(c, muster_session_create(c, &sopts, &id, NULL));
  muster_results_t page;
  CHECK_ERR(c, muster_session_results(c, id, MUSTER_ORDER_SUBMISSION, 0, 0, -2, &page),
            MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "wait_ms: -2, expected 0 or more"));
  muster_results_free(&page);
  CHECK_OK(c, muster_session_close(c, id, NULL));
  muster_free(id);

  muster_worker_opts_t wopts;
  muster_worker_opts_init(&wopts);
  wopts.timeout_ms = -5;
  int64_t worker = 0;
  CHECK_ERR(c, muster_worker_register(c, &wopts, &worker, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "timeout_ms: -5, expected"));
  muster_iter_config_t cfg;
  muster_iter_config_init(&cfg);
  cfg.num_samples = 10;
  cfg.lease_ms = -5;
  CHECK_ERR(c, muster_iter_create(c, "ct-neg", &cfg, NULL, -1, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "lease_ms: -5, expected"));
  cfg.lease_ms = -1;
  cfg.replication = -2;
  CHECK_ERR(c, muster_iter_create(c, "ct-neg", &cfg, NULL, -1, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "replication: -2, expected"));
  char *json = NULL;
  CHECK_ERR(c, muster_iter_status(c, "ct-neg", &json), MUSTER_ITERATION_NOT_FOUND);
}

/* A long-poll outlives the client timeout, and a put wakes it early. */
static void test_long_poll(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "ct-poll", NULL, NULL));
  muster_client_set_timeout(c, 300);
  muster_lease_t *l = NULL;
  size_t n = 9;
  int64_t start = now_ms();
  CHECK_OK(c, muster_lease(c, "ct-poll", 0, 1, 800, &l, &n));
  int64_t took = now_ms() - start;
  CHECK(n == 0);
  CHECK(took >= 700);
  muster_leases_free(l, n);
  muster_client_set_timeout(c, 60000);
  muster_lease_t *missing = NULL;
  CHECK_ERR(c, muster_lease(c, "ct-nope", 0, 1, 0, &missing, &n), MUSTER_QUEUE_NOT_FOUND);
  CHECK_ERR(c, muster_lease(c, "ct-poll", 0, 5000, 0, &missing, &n), MUSTER_BATCH_TOO_LARGE);
}

static void test_purge_delete_and_raw(muster_client_t *c) {
  int64_t purged = -1;
  CHECK_OK(c, muster_queue_purge(c, "ct-first", &purged));
  CHECK(purged >= 1);
  CHECK_OK(c, muster_queue_purge(c, "ct-first", &purged));
  CHECK(purged == 0);
  char *reply = NULL;
  CHECK_ERR(c, muster_request(c, "GET", "/v1/nothing-here", NULL, &reply), MUSTER_NOT_FOUND);
  CHECK(reply == NULL);
  CHECK_ERR(c, muster_request(c, "POST", "/v1/queues/ct-first/tasks", "{nope", &reply),
            MUSTER_BAD_JSON);
  CHECK_OK(c, muster_request(c, "POST", "/v1/queues/ct-first/requeue", NULL, &reply));
  CHECK(contains(reply, "requeued"));
  muster_free(reply);
  CHECK_OK(c, muster_queue_delete(c, "ct-first"));
  CHECK_OK(c, muster_queue_delete(c, "ct-last"));
  CHECK_ERR(c, muster_queue_get(c, "ct-first", NULL), MUSTER_QUEUE_NOT_FOUND);
}

/* The compact text jansson writes for `text`, what the head stores (caller frees). */
static char *compact(const char *text) {
  json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  char *out = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
  json_decref(v);
  return out;
}

/* Payloads and results in the forms libmuster splices as they stand and in
 * those it hands to jansson (whitespace, reals, other escapes, a repeated
 * key), and a session name that needs escapes: each comes back from the head
 * as the compact text of its value, through put, lease, complete and the
 * combined call. */
static void test_text_forms(muster_client_t *c) {
  static const char *const forms[] = {
      "{\"a\":[1,\"b\"],\"c\":null}",
      "{\"a\": [1, 2],\n \"b\": {\"c\": \"d\"}}",
      "{\"lr\": 0.001, \"x\": 1.50}",
      "\"caf\\u00e9 \\/ \\u0041\"",
      "{\"k\":1,\"k\":2}",
      "[9223372036854775807,-0,1e3]",
  };
  enum { N = sizeof forms / sizeof forms[0] };
  CHECK_OK(c, muster_queue_put(c, "ct-forms", NULL, NULL));
  muster_task_spec_t specs[N];
  for (int i = 0; i < N; i++) {
    muster_task_spec_init(&specs[i]);
    specs[i].payload = forms[i];
    specs[i].session = "s \"q\"\n\xc3\xa9";
    specs[i].index = i;
  }
  CHECK_OK(c, muster_put(c, "ct-forms", specs, N, NULL));
  muster_lease_t *l = NULL, *next = NULL;
  size_t n = 0, nnext = 0;
  CHECK_OK(c, muster_lease(c, "ct-forms", 0, N - 1, 0, &l, &n));
  CHECK(n == N - 1);
  muster_ack_t acks[N];
  for (size_t i = 0; i < n; i++) {
    char *want = compact(forms[i]);
    CHECK(want && strcmp(l[i].payload, want) == 0);
    CHECK(l[i].session && strcmp(l[i].session, specs[i].session) == 0 && l[i].index == (int64_t)i);
    free(want);
    muster_ack_init(&acks[i], l[i].task, l[i].token);
    acks[i].result = forms[i];
  }
  CHECK_OK(c, muster_complete_lease(c, acks, n, "ct-forms", 0, 5, -1, &next, &nnext, NULL));
  CHECK(nnext == 1);
  if (nnext == 1) {
    char *want = compact(forms[N - 1]);
    CHECK(want && strcmp(next[0].payload, want) == 0 && next[0].index == N - 1);
    free(want);
  }
  for (size_t i = 0; i < n; i++) {
    char *json = NULL, *want = compact(forms[i]), needle[256];
    CHECK_OK(c, muster_task_get(c, l[i].task, &json));
    snprintf(needle, sizeof needle, "\"result\":%s", want ? want : "?");
    CHECK(json && contains(json, needle) && contains(json, "\"state\":\"done\""));
    muster_free(json);
    free(want);
  }
  muster_leases_free(l, n);
  muster_leases_free(next, nnext);
}

/* A missing argument fails with MUSTER_INVALID and a message of its own, on
 * calls that used to crash (muster_iter_ack without its arrays) or to leave
 * the previous failure's message in place, which then explained the wrong
 * call.  Each call follows a failure whose message ("... does not exist")
 * must not survive it. */
static void check_missing(muster_client_t *c, muster_err_t err, const char *call, int line) {
  char what[160];
  snprintf(what, sizeof what, "%s: MUSTER_INVALID with its own message", call);
  const char *message = muster_client_message(c);
  check(err == MUSTER_INVALID && message[0] && !contains(message, "does not exist"), what, line);
}

#define CHECK_MISSING(c, call)                                                                     \
  do {                                                                                             \
    char *json_ = NULL;                                                                            \
    muster_queue_get((c), "ct-missing-args", &json_);                                              \
    check_missing((c), (call), #call, __LINE__);                                                   \
  } while (0)

static void test_missing_arguments(muster_client_t *c) {
  char *json = NULL;
  size_t len = 0;
  int64_t token = 1;
  uint64_t block = 0;
  CHECK_MISSING(c, muster_iter_ack(c, "ct-it", 0, 0, NULL, &token, 1));
  CHECK_MISSING(c, muster_iter_ack(c, "ct-it", 0, 0, &block, NULL, 1));
  CHECK_MISSING(c, muster_iter_next(c, "ct-it", 0, 0, 1, 0, NULL));
  CHECK_MISSING(c, muster_iter_held(c, "ct-it", 0, 0, 1, 0, NULL));
  CHECK_MISSING(c, muster_shared_get(c, "ct-scope", "blob", 0, NULL, &len, NULL));
  CHECK_MISSING(c, muster_shared_list(c, "ct-scope", NULL));
  CHECK_ERR(c, muster_shared_list(c, NULL, &json), MUSTER_INVALID);
  CHECK(strcmp(muster_client_message(c), "a scope is required") == 0);
}

int main(int argc, char **argv) {
  if (!ctest_use_test_url(TOKEN) &&
      ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-XXXXXX", TOKEN, NULL) != 0)
    return ctest_head_failed();
  test_error_table();
  test_handle();
  test_url_schemes();
  test_auth_and_network();
  test_pool_request_timeout();
  test_protocol_errors();
  test_server_kind();
  test_register_without_timeout();
  muster_client_t *client = connect_head(head_token);
  test_queues(client);
  test_put_and_get(client);
  test_leases(client);
  test_pipeline_and_flags(client);
  test_fail_permanent_and_requeue(client);
  test_repeated_ends(client);
  test_workers(client);
  test_negative_arguments(client);
  test_long_poll(client);
  test_purge_delete_and_raw(client);
  test_text_forms(client);
  test_missing_arguments(client);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
