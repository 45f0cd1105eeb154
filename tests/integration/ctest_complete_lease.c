/*
 * ctest_complete_lease.c — muster_complete_lease(): complete and lease the
 * next tasks in one request (docs/api.md, POST /v1/leases/complete).
 *
 * First the argument checks, against a client of a port where nothing
 * listens: each bad argument must give MUSTER_INVALID with a message (a
 * request sent would give MUSTER_NETWORK instead) and reset the outputs.
 * Then replies it must refuse, from a fake server (a thread), and the call
 * against a real head: leases and updates come back, a worker's lease is its
 * own, and a refused request completes nothing.  Set
 * MUSTER_TEST_URL and MUSTER_TEST_TOKEN to run against a head you started
 * yourself.  Ends with "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#define TOKEN "ctest-token-0123456789"
#define QUEUE "cl-work"

/* Poisons the outputs so that a check can see the call reset them. */
#define POISON(l, n, u)                                                                            \
  do {                                                                                             \
    (l) = (muster_lease_t *)&poison;                                                               \
    (n) = 99;                                                                                      \
    (u) = (char *)&poison;                                                                         \
  } while (0)

static int poison;

/* Checks that `err` is MUSTER_INVALID with a message naming `word`, and that
 * the outputs were reset. */
static void check_refused(muster_client_t *c, muster_err_t err, const char *word, muster_lease_t *l,
                          size_t n, char *u, int line) {
  check_err(err, MUSTER_INVALID, word, line, muster_client_message(c));
  check(contains(muster_client_message(c), word), "the message names the argument", line);
  check(l == NULL && n == 0 && u == NULL, "the outputs are reset", line);
}

static void test_arguments(void) {
  muster_client_t *c = NULL;
  CHECK_OK(NULL, muster_client_new("http://127.0.0.1:1", TOKEN, &c));
  muster_ack_t ack;
  muster_ack_init(&ack, 7, 1042);
  muster_lease_t *l;
  size_t n;
  char *u;
  muster_err_t err;
  POISON(l, n, u);
  CHECK(muster_complete_lease(NULL, &ack, 1, "q", 0, 1, 0, &l, &n, &u) == MUSTER_INVALID);
  CHECK(l == NULL && n == 0 && u == NULL);
  POISON(l, n, u);
  err = muster_complete_lease(c, NULL, 1, "q", 0, 1, 0, &l, &n, &u);
  check_refused(c, err, "acks", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 0, "q", 0, 1, 0, &l, &n, &u);
  check_refused(c, err, "muster_lease", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, NULL, 0, 1, 0, &l, &n, &u);
  check_refused(c, err, "queue", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "\xff\xfe", 0, 1, 0, &l, &n, &u);
  check_refused(c, err, "UTF-8", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 0, 0, &l, &n, &u);
  check_refused(c, err, "max", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 1001, 0, &l, &n, &u);
  check_refused(c, err, "max", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", -3, 1, 0, &l, &n, &u);
  check_refused(c, err, "worker", l, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 1, 5, &l, &n, NULL);
  check_refused(c, err, "updates", l, n, NULL, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 1, 0, NULL, &n, &u);
  check_refused(c, err, "leases", NULL, n, u, __LINE__);
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 1, 0, &l, NULL, &u);
  check_refused(c, err, "leases", l, 0, u, __LINE__);
  ack.result = "{not json";
  POISON(l, n, u);
  err = muster_complete_lease(c, &ack, 1, "q", 0, 1, 0, &l, &n, &u);
  check_refused(c, err, "result", l, n, u, __LINE__);
  /* Good arguments reach the network (and find nothing there); updates may be
   * NULL when none are asked for. */
  ack.result = "[1]";
  POISON(l, n, u);
  CHECK_ERR(c, muster_complete_lease(c, &ack, 1, "q", 3, 1000, -1, &l, &n, NULL), MUSTER_NETWORK);
  CHECK(l == NULL && n == 0);
  muster_client_free(c);
}

/* ---- a fake server that answers one fixed reply to one connection ------------------ */

typedef struct {
  int fd;
  const char *body;
} fake_t;

static void *fake_main(void *arg) {
  fake_t *fake = arg;
  int conn = accept(fake->fd, NULL, NULL);
  if (conn >= 0) {
    char buf[8192], reply[1024];
    ssize_t n = read(conn, buf, sizeof buf); /* the request: small, one read suffices */
    (void)n;
    int len = snprintf(reply, sizeof reply,
                       "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       strlen(fake->body), fake->body);
    ssize_t w = write(conn, reply, (size_t)len);
    (void)w;
    close(conn);
  }
  return NULL;
}

/* Calls muster_complete_lease against a fake server replying `body`, with
 * `updates_after` (and a place for updates when it is >= 0); *updates gets
 * what the call returned there (muster_free). */
static muster_err_t against_fake(const char *body, int64_t updates_after, size_t *nleases,
                                 char **updates) {
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  fake_t fake = {.fd = socket(AF_INET, SOCK_STREAM, 0), .body = body};
  pthread_t thread;
  char url[64];
  if (fake.fd < 0 || bind(fake.fd, (struct sockaddr *)&addr, sizeof addr) != 0 ||
      listen(fake.fd, 1) != 0 || getsockname(fake.fd, (struct sockaddr *)&addr, &len) != 0 ||
      pthread_create(&thread, NULL, fake_main, &fake) != 0)
    return MUSTER_ERR_COUNT;
  snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(addr.sin_port));
  muster_client_t *c = NULL;
  muster_client_new(url, TOKEN, &c);
  muster_ack_t ack;
  muster_ack_init(&ack, 7, 1042);
  muster_lease_t *l = (muster_lease_t *)&poison;
  *updates = (char *)&poison;
  muster_err_t err = muster_complete_lease(c, &ack, 1, "q", 0, 1, updates_after, &l, nleases,
                                           updates_after >= 0 ? updates : NULL);
  if (updates_after < 0)
    *updates = NULL;
  check(err != MUSTER_OK ? l == NULL : l != NULL, "leases set only on success", __LINE__);
  muster_leases_free(l, *nleases);
  muster_client_free(c);
  pthread_join(thread, NULL);
  close(fake.fd);
  return err;
}

/* Replies that break the contract are MUSTER_PROTOCOL, with nothing returned
 * (and nothing leaked: the sanitizer build checks). */
static void test_bad_replies(void) {
  size_t n = 9;
  char *u = NULL;
  CHECK(against_fake("{\"completed\":[],\"leases\":\"x\"}", -1, &n, &u) == MUSTER_PROTOCOL);
  CHECK(n == 0 && u == NULL);
  CHECK(against_fake("{\"completed\":[],\"leases\":[{\"task\":1}],\"updates\":[],"
                     "\"updates_last\":4}",
                     0, &n, &u) == MUSTER_PROTOCOL);
  CHECK(n == 0 && u == NULL);
  CHECK(against_fake("{\"completed\":[],\"leases\":[{\"task\":1,\"token\":2,\"payload\":3}]}", 0,
                     &n, &u) == MUSTER_PROTOCOL); /* updates asked for, none came */
  CHECK(n == 0 && u == NULL);
  CHECK(against_fake("{\"completed\":[],\"leases\":[{\"task\":1,\"token\":2,\"payload\":3}],"
                     "\"updates\":[{\"seq\":4,\"data\":null}],\"updates_last\":4}",
                     3, &n, &u) == MUSTER_OK);
  CHECK(n == 1 && contains(u, "\"last\":4") && contains(u, "\"seq\":4"));
  muster_free(u);
}

/* ---- against a real head ------------------------------------------------------------ */

/* Puts `count` tasks {"n": i} into QUEUE. */
static void put_tasks(muster_client_t *c, int count) {
  for (int i = 0; i < count; i++) {
    char payload[32];
    snprintf(payload, sizeof payload, "{\"n\":%d}", i);
    muster_task_spec_t spec;
    muster_task_spec_init(&spec);
    spec.payload = payload;
    CHECK_OK(c, muster_put(c, QUEUE, &spec, 1, NULL));
  }
}

/* Non-zero when task `id`'s JSON contains `text`. */
static int task_has(muster_client_t *c, int64_t id, const char *text) {
  char *json = NULL;
  int has = muster_task_get(c, id, &json) == MUSTER_OK && contains(json, text);
  muster_free(json);
  return has;
}

/* Leases and updates come back; each call completes what it names. */
static void test_leases_and_updates(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, QUEUE, NULL, NULL));
  put_tasks(c, 3);
  int64_t seq = 0;
  CHECK_OK(c, muster_update_post(c, QUEUE, "{\"model\":1}", NULL, &seq));
  CHECK_OK(c, muster_update_post(c, QUEUE, "\"two\"", NULL, &seq));
  CHECK(seq == 2);
  muster_lease_t *first = NULL, *l = NULL;
  size_t nfirst = 0, n = 0;
  char *u = NULL;
  CHECK_OK(c, muster_lease(c, QUEUE, 0, 1, 0, &first, &nfirst));
  CHECK(nfirst == 1);
  if (nfirst != 1)
    return;
  muster_ack_t ack;
  muster_ack_init(&ack, first[0].task, first[0].token);
  ack.result = "{\"ok\":1}";
  CHECK_OK(c, muster_complete_lease(c, &ack, 1, QUEUE, 0, 2, 0, &l, &n, &u));
  CHECK(task_has(c, first[0].task, "\"state\":\"done\""));
  CHECK(task_has(c, first[0].task, "\"result\":{\"ok\":1}"));
  CHECK(n == 2 && l[0].task == first[0].task + 1 && l[1].task == first[0].task + 2);
  CHECK(n == 2 && strcmp(l[0].payload, "{\"n\":1}") == 0 && l[0].token > 0 && l[0].attempt == 1);
  CHECK(contains(u, "\"seq\":1") && contains(u, "\"data\":{\"model\":1}"));
  CHECK(contains(u, "\"seq\":2") && contains(u, "\"data\":\"two\"") && contains(u, "\"last\":2"));
  muster_free(u);
  muster_leases_free(first, nfirst);
  if (n != 2) {
    muster_leases_free(l, n);
    return;
  }
  /* Both at once, updates after 2: only the third; nothing left to lease. */
  CHECK_OK(c, muster_update_post(c, QUEUE, "3", NULL, &seq));
  muster_ack_t pair[2];
  muster_ack_init(&pair[0], l[0].task, l[0].token);
  muster_ack_init(&pair[1], l[1].task, l[1].token);
  muster_lease_t *none = NULL;
  size_t nnone = 5;
  CHECK_OK(c, muster_complete_lease(c, pair, 2, QUEUE, 0, 5, 2, &none, &nnone, &u));
  CHECK(none != NULL && nnone == 0);
  CHECK(contains(u, "\"seq\":3") && !contains(u, "\"seq\":2") && contains(u, "\"last\":3"));
  CHECK(task_has(c, l[0].task, "\"state\":\"done\"") && task_has(c, l[1].task, "\"done\""));
  muster_free(u);
  muster_leases_free(none, nnone);
  muster_leases_free(l, n);
}

/* A worker's lease is its own; a refused request completes nothing. */
static void test_worker_and_all_or_nothing(muster_client_t *c) {
  put_tasks(c, 2);
  int64_t worker = 0;
  CHECK_OK(c, muster_worker_register(c, NULL, &worker, NULL));
  muster_lease_t *l = NULL, *next = NULL;
  size_t n = 0, nnext = 0;
  char *u = (char *)&poison;
  CHECK_OK(c, muster_lease(c, QUEUE, worker, 1, 0, &l, &n));
  CHECK(n == 1);
  if (n != 1)
    return;
  muster_ack_t ack;
  muster_ack_init(&ack, l[0].task, l[0].token + 1000); /* stale */
  CHECK_ERR(c, muster_complete_lease(c, &ack, 1, QUEUE, worker, 1, -1, &next, &nnext, &u),
            MUSTER_LEASE_LOST);
  CHECK(next == NULL && nnext == 0 && u == NULL);
  ack.token = l[0].token;
  CHECK_ERR(c, muster_complete_lease(c, &ack, 1, "cl-nope", worker, 1, -1, &next, &nnext, NULL),
            MUSTER_QUEUE_NOT_FOUND);
  CHECK_ERR(c, muster_complete_lease(c, &ack, 1, QUEUE, 999999, 1, -1, &next, &nnext, NULL),
            MUSTER_WORKER_NOT_FOUND);
  CHECK(task_has(c, l[0].task, "\"state\":\"leased\"") && task_has(c, l[0].task + 1, "\"queued\""));
  /* The same ack, well addressed: completed, and the next task is the worker's. */
  CHECK_OK(c, muster_complete_lease(c, &ack, 1, QUEUE, worker, 1, -1, &next, &nnext, NULL));
  CHECK(task_has(c, l[0].task, "\"state\":\"done\""));
  CHECK(nnext == 1 && next[0].task == l[0].task + 1);
  char want[64];
  snprintf(want, sizeof want, "\"worker\":%lld", (long long)worker);
  CHECK(nnext == 1 && task_has(c, next[0].task, want));
  muster_leases_free(next, nnext);
  muster_leases_free(l, n);
  CHECK_OK(c, muster_worker_bye(c, worker));
}

int main(int argc, char **argv) {
  test_arguments();
  test_bad_replies();
  if (!ctest_use_test_url(TOKEN) &&
      ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-XXXXXX", TOKEN, NULL) != 0)
    return ctest_head_failed();
  muster_client_t *client = connect_head(head_token);
  test_leases_and_updates(client);
  test_worker_and_all_or_nothing(client);
  muster_queue_delete(client, QUEUE);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
