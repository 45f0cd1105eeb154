/*
 * ctest_lease_key.c — lease requests with a key (muster_lease_with,
 * muster_complete_lease_with, muster_lease_key; docs/client.md, "Retrying a
 * lease"): a request sent again with its key gets back the leases its first
 * try made, the same tasks and tokens, and leases nothing more; a new key
 * leases anew.
 *
 * First the checks, against a client of a port where nothing listens: each
 * bad argument must give MUSTER_INVALID with a message that says what is
 * wrong (a request sent would give MUSTER_NETWORK instead), and good
 * arguments must reach the network.  Then the calls against a real head,
 * whose queue counts show that a repeat leased nothing: a repeat that the
 * library sent without its key would lease the next task.  Set
 * MUSTER_TEST_URL and MUSTER_TEST_TOKEN to run against a head you started
 * yourself.  Ends with "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#define TOKEN "ctest-token-0123456789"
#define QUEUE "lk-work"
#define INSTANCE "ctest-lease-key"
#define LONG_LEASE_MS 600000 /* no lease of the test expires: a stray lease shows as leased */

static int poison;

/* Checks that `err` is MUSTER_INVALID with a message containing `words`, and
 * that the leases were reset. */
static void check_refused(muster_client_t *c, muster_err_t err, const char *words,
                          const muster_lease_t *l, size_t n, int line) {
  check_err(err, MUSTER_INVALID, words, line, muster_client_message(c));
  if (!contains(muster_client_message(c), words))
    fprintf(stderr, "  message: %s\n", muster_client_message(c));
  check(contains(muster_client_message(c), words), "the message says what is wrong", line);
  check(l == NULL && n == 0, "the leases are reset", line);
}

/* muster_lease_with(c, o) with poisoned outputs, checked as check_refused. */
static void lease_refused(muster_client_t *c, const muster_lease_opts_t *o, const char *words,
                          int line) {
  muster_lease_t *l = (muster_lease_t *)&poison;
  size_t n = 99;
  muster_err_t err = muster_lease_with(c, o, &l, &n);
  check_refused(c, err, words, l, n, line);
}

/* muster_complete_lease_with(c, one ack, o) with poisoned outputs, checked
 * as check_refused. */
static void next_refused(muster_client_t *c, const muster_lease_opts_t *o, const char *words,
                         int line) {
  muster_ack_t ack;
  muster_ack_init(&ack, 7, 1042);
  muster_lease_t *l = (muster_lease_t *)&poison;
  size_t n = 99;
  char *u = (char *)&poison;
  muster_err_t err = muster_complete_lease_with(c, &ack, 1, o, -1, &l, &n, &u);
  check_refused(c, err, words, l, n, line);
  check(u == NULL, "the updates are reset", line);
}

/* Each bad key is refused by both calls, in words that say what is wrong. */
static void test_bad_keys(muster_client_t *c) {
  char too_long[MUSTER_LEASE_KEY_MAX + 2];
  memset(too_long, 'k', sizeof too_long - 1);
  too_long[sizeof too_long - 1] = '\0';
  static const struct {
    const char *key, *words;
  } bad[] = {
      {"a b", "'a b' has ' ' at position 2"},
      {"k/1", "'k/1' has '/' at position 2"},
      {"k\xc3\xa9", "byte 0xc3 at position 2"},
      {"k\n", "byte 0x0a at position 2"},
      {"", "the key is empty"},
      {NULL, "the key is 129 characters long"},
  };
  muster_lease_opts_t o;
  muster_lease_opts_init(&o);
  o.queue = "q";
  o.worker = 3;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    o.request = bad[i].key ? bad[i].key : too_long;
    lease_refused(c, &o, bad[i].words, __LINE__);
    lease_refused(c, &o, "use 1 to 128 characters of letters, digits, '.', '_' and '-'", __LINE__);
    next_refused(c, &o, bad[i].words, __LINE__);
  }
  /* "." and ".." have a name's characters and are no names. */
  static const char *const dots[] = {".", ".."};
  for (size_t i = 0; i < sizeof dots / sizeof dots[0]; i++) {
    o.request = dots[i];
    lease_refused(c, &o, "'.' and '..' are no names: URLs collapse them", __LINE__);
    next_refused(c, &o, "'.' and '..' are no names", __LINE__);
  }
  /* The longest key is good (it reaches the network), and one without a worker is not. */
  too_long[MUSTER_LEASE_KEY_MAX] = '\0';
  o.request = too_long;
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_ERR(c, muster_lease_with(c, &o, &l, &n), MUSTER_NETWORK);
  o.worker = 0;
  lease_refused(c, &o, "opts.request: a key needs opts.worker", __LINE__);
  next_refused(c, &o, "opts.request: a key needs opts.worker", __LINE__);
}

/* Options not set up, missing or out of range are refused; good ones reach
 * the network. */
static void test_bad_options(muster_client_t *c) {
  muster_lease_opts_t zeroed = {0};
  zeroed.queue = "q";
  lease_refused(c, &zeroed, "call muster_lease_opts_init", __LINE__);
  next_refused(c, &zeroed, "call muster_lease_opts_init", __LINE__);
  muster_lease_opts_t o;
  muster_lease_opts_init(&o);
  CHECK(o.size == sizeof o && o.queue == NULL && o.worker == 0 && o.max == 1 && o.wait_ms == 0 &&
        o.request == NULL);
  o.size = sizeof o.size; /* set up by nobody: shorter than the first version */
  lease_refused(c, &o, "not set up by muster_lease_opts_init", __LINE__);
  muster_lease_opts_init(&o);
  lease_refused(c, NULL, "opts: the lease's options are required", __LINE__);
  next_refused(c, NULL, "opts: the lease's options are required", __LINE__);
  lease_refused(c, &o, "opts.queue", __LINE__);
  next_refused(c, &o, "queue", __LINE__);
  o.queue = "q";
  o.worker = -2;
  lease_refused(c, &o, "worker", __LINE__);
  next_refused(c, &o, "worker", __LINE__);
  o.worker = 3;
  o.wait_ms = -1;
  lease_refused(c, &o, "wait_ms", __LINE__);
  o.max = 0;
  next_refused(c, &o, "max", __LINE__);
  o.max = 1;
  o.request = "k-1";
  muster_lease_t *l = (muster_lease_t *)&poison;
  size_t n = 99;
  CHECK(muster_lease_with(NULL, &o, &l, &n) == MUSTER_INVALID && l == NULL && n == 0);
  CHECK_ERR(c, muster_lease_with(c, &o, NULL, &n), MUSTER_INVALID);
  /* Good options reach the network; the combined call does not read wait_ms. */
  muster_ack_t ack;
  muster_ack_init(&ack, 7, 1042);
  CHECK_ERR(c, muster_complete_lease_with(c, &ack, 1, &o, -1, &l, &n, NULL), MUSTER_NETWORK);
  o.wait_ms = 10;
  CHECK_ERR(c, muster_lease_with(c, &o, &l, &n), MUSTER_NETWORK);
}

/* muster_lease_key: INSTANCE-N, or refused with an empty key. */
static void test_key_helper(void) {
  char key[MUSTER_LEASE_KEY_MAX + 1], instance[MUSTER_LEASE_KEY_MAX + 1];
  CHECK(muster_lease_key(key, sizeof key, "a1b2", 0) == MUSTER_OK && strcmp(key, "a1b2-0") == 0);
  CHECK(muster_lease_key(key, sizeof key, "w.3_x", UINT64_MAX) == MUSTER_OK &&
        strcmp(key, "w.3_x-18446744073709551615") == 0);
  CHECK(muster_lease_key(key, 7, "a1b2", 12) == MUSTER_INVALID && key[0] == '\0'); /* "a1b2-12" */
  CHECK(muster_lease_key(key, 8, "a1b2", 12) == MUSTER_OK && strcmp(key, "a1b2-12") == 0);
  CHECK(muster_lease_key(key, sizeof key, "a b", 1) == MUSTER_INVALID && key[0] == '\0');
  CHECK(muster_lease_key(key, sizeof key, "", 1) == MUSTER_INVALID);
  CHECK(muster_lease_key(key, sizeof key, NULL, 1) == MUSTER_INVALID);
  CHECK(muster_lease_key(NULL, 8, "a", 1) == MUSTER_INVALID);
  memset(instance, 'i', MUSTER_LEASE_KEY_MAX - 2);
  instance[MUSTER_LEASE_KEY_MAX - 2] = '\0'; /* with "-9", the longest key */
  CHECK(muster_lease_key(key, sizeof key, instance, 9) == MUSTER_OK &&
        strlen(key) == MUSTER_LEASE_KEY_MAX);
  CHECK(muster_lease_key(key, sizeof key, instance, 10) == MUSTER_INVALID && key[0] == '\0');
}

static void test_arguments(void) {
  muster_client_t *c = NULL;
  CHECK_OK(NULL, muster_client_new("http://127.0.0.1:1", TOKEN, &c));
  test_bad_keys(c);
  test_bad_options(c);
  muster_client_free(c);
  test_key_helper();
}

/* ---- against a real head ------------------------------------------------------------ */

/* Puts `count` tasks into QUEUE; their ids into ids[] (may be NULL). */
static void put_tasks(muster_client_t *c, size_t count, int64_t *ids) {
  for (size_t i = 0; i < count; i++) {
    muster_task_spec_t spec;
    muster_task_spec_init(&spec);
    spec.payload = "{\"n\":1}";
    int64_t id = 0;
    CHECK_OK(c, muster_put(c, QUEUE, &spec, 1, &id));
    if (ids)
      ids[i] = id;
  }
}

/* Non-zero when QUEUE's counts have `leased` leased and `queued` queued tasks. */
static int counts_are(muster_client_t *c, int leased, int queued) {
  char want_leased[32], want_queued[32], *json = NULL;
  snprintf(want_leased, sizeof want_leased, "\"leased\":%d", leased);
  snprintf(want_queued, sizeof want_queued, "\"queued\":%d", queued);
  int same = muster_queue_get(c, QUEUE, &json) == MUSTER_OK && contains(json, want_leased) &&
             contains(json, want_queued);
  if (!same)
    fprintf(stderr, "  queue: %s\n", json ? json : muster_client_message(c));
  muster_free(json);
  return same;
}

/* Non-zero when `a` and `b` are the same leases: tasks, tokens, attempts. */
static int same_leases(const muster_lease_t *a, size_t na, const muster_lease_t *b, size_t nb) {
  if (na != nb)
    return 0;
  for (size_t i = 0; i < na; i++)
    if (a[i].task != b[i].task || a[i].token != b[i].token || a[i].attempt != b[i].attempt)
      return 0;
  return 1;
}

/* Completes `l`'s tasks, so that the next test starts with none leased. */
static void complete_all(muster_client_t *c, const muster_lease_t *l, size_t n) {
  for (size_t i = 0; i < n; i++) {
    muster_ack_t ack;
    muster_ack_init(&ack, l[i].task, l[i].token);
    CHECK_OK(c, muster_complete(c, &ack, 1));
  }
}

/* Sets `o` up for a lease of QUEUE by `worker` with `key`. */
static void keyed_opts(muster_lease_opts_t *o, int64_t worker, const char *key) {
  muster_lease_opts_init(o);
  o->queue = QUEUE;
  o->worker = worker;
  o->request = key;
}

/* The same key from another worker is another request: it leases task
 * `next`, given back at once (the worker's bye). */
static void test_other_worker(muster_client_t *c, const char *key, int64_t next) {
  int64_t stranger = 0;
  CHECK_OK(c, muster_worker_register(c, NULL, &stranger, NULL));
  muster_lease_opts_t o;
  keyed_opts(&o, stranger, key);
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease_with(c, &o, &l, &n));
  CHECK(n == 1 && l[0].task == next);
  CHECK(counts_are(c, 3, 0));
  muster_leases_free(l, n);
  CHECK_OK(c, muster_worker_bye(c, stranger)); /* its lease back to queued */
  CHECK(counts_are(c, 2, 1));
}

/* A plain lease sent again with its key gets the same leases, at once and
 * whatever its max; a new key leases anew. */
static void test_lease_again(muster_client_t *c, int64_t worker) {
  int64_t ids[3];
  put_tasks(c, 3, ids);
  char key[MUSTER_LEASE_KEY_MAX + 1];
  uint64_t answered = 0;
  CHECK(muster_lease_key(key, sizeof key, INSTANCE, answered) == MUSTER_OK);
  muster_lease_opts_t o;
  keyed_opts(&o, worker, key);
  o.max = 2;
  muster_lease_t *first = NULL, *again = NULL, *next = NULL;
  size_t nfirst = 0, nagain = 0, nnext = 0;
  CHECK_OK(c, muster_lease_with(c, &o, &first, &nfirst));
  CHECK(nfirst == 2 && first[0].task == ids[0] && first[1].task == ids[1]);
  /* Its reply lost, sent again: the same leases, and the third task still queued. */
  o.max = 5;
  o.wait_ms = 20000;
  int64_t asked_ms = now_ms();
  CHECK_OK(c, muster_lease_with(c, &o, &again, &nagain));
  CHECK(now_ms() - asked_ms < 10000); /* not waited out: it has its leases */
  CHECK(same_leases(first, nfirst, again, nagain));
  CHECK(nagain == 2 && again[0].deadline_ms >= first[0].deadline_ms);
  CHECK(counts_are(c, 2, 1));
  test_other_worker(c, key, ids[2]);
  /* Answered: a new key leases anew. */
  CHECK(muster_lease_key(key, sizeof key, INSTANCE, ++answered) == MUSTER_OK);
  CHECK_OK(c, muster_lease_with(c, &o, &next, &nnext));
  CHECK(nnext == 1 && next[0].task == ids[2]);
  CHECK(counts_are(c, 3, 0));
  complete_all(c, first, nfirst);
  complete_all(c, next, nnext);
  CHECK(counts_are(c, 0, 0));
  muster_leases_free(next, nnext);
  muster_leases_free(again, nagain);
  muster_leases_free(first, nfirst);
}

/* With a new key in `o`, the combined call completing `held` (one lease)
 * leases task `next`; that one is completed too. */
static void test_complete_lease_anew(muster_client_t *c, const muster_lease_opts_t *o,
                                     const muster_lease_t *held, int64_t next) {
  muster_ack_t ack;
  muster_ack_init(&ack, held->task, held->token);
  muster_lease_t *l = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_complete_lease_with(c, &ack, 1, o, -1, &l, &n, NULL));
  CHECK(n == 1 && l[0].task == next);
  CHECK(counts_are(c, 1, 0));
  complete_all(c, l, n);
  muster_leases_free(l, n);
}

/* The combined call sent again with its key: its completion a repeat and the
 * same lease; a plain lease with that key the same; a new key leases anew. */
static void test_complete_lease_again(muster_client_t *c, int64_t worker) {
  int64_t ids[3];
  put_tasks(c, 3, ids);
  muster_lease_t *held = NULL, *first = NULL, *again = NULL, *plain = NULL;
  size_t nheld = 0, nfirst = 0, nagain = 0, nplain = 0;
  CHECK_OK(c, muster_lease(c, QUEUE, worker, 1, 0, &held, &nheld));
  CHECK(nheld == 1 && held[0].task == ids[0]);
  char key[MUSTER_LEASE_KEY_MAX + 1];
  CHECK(muster_lease_key(key, sizeof key, INSTANCE, 100) == MUSTER_OK);
  muster_lease_opts_t o;
  keyed_opts(&o, worker, key);
  o.wait_ms = 20000; /* not read: the head would refuse a wait in the combined call */
  muster_ack_t ack;
  muster_ack_init(&ack, nheld == 1 ? held[0].task : 0, nheld == 1 ? held[0].token : 0);
  char *updates = NULL;
  CHECK_OK(c, muster_complete_lease_with(c, &ack, 1, &o, 0, &first, &nfirst, &updates));
  CHECK(nfirst == 1 && first[0].task == ids[1] && contains(updates, "\"last\":"));
  muster_free(updates);
  /* Sent again: the completion a repeat, the same lease, the third task queued. */
  CHECK_OK(c, muster_complete_lease_with(c, &ack, 1, &o, -1, &again, &nagain, NULL));
  CHECK(same_leases(first, nfirst, again, nagain) && counts_are(c, 1, 1));
  /* Or completed alone, then the key with a plain lease: the same again. */
  int repeated = 0;
  CHECK_OK(c, muster_complete_repeats(c, &ack, 1, &repeated));
  CHECK(repeated == MUSTER_ACK_REPEATED);
  CHECK_OK(c, muster_lease_with(c, &o, &plain, &nplain));
  CHECK(same_leases(first, nfirst, plain, nplain) && counts_are(c, 1, 1));
  CHECK(muster_lease_key(key, sizeof key, INSTANCE, 101) == MUSTER_OK);
  if (nfirst == 1)
    test_complete_lease_anew(c, &o, &first[0], ids[2]);
  muster_leases_free(plain, nplain);
  muster_leases_free(again, nagain);
  muster_leases_free(first, nfirst);
  muster_leases_free(held, nheld);
}

int main(int argc, char **argv) {
  test_arguments();
  if (!ctest_use_test_url(TOKEN) &&
      ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-XXXXXX", TOKEN, NULL) != 0)
    return ctest_head_failed();
  muster_client_t *client = connect_head(head_token);
  muster_queue_opts_t q;
  muster_queue_opts_init(&q);
  q.lease_ms = LONG_LEASE_MS;
  CHECK_OK(client, muster_queue_put(client, QUEUE, &q, NULL));
  int64_t worker = 0;
  CHECK_OK(client, muster_worker_register(client, NULL, &worker, NULL));
  test_lease_again(client, worker);
  test_complete_lease_again(client, worker);
  CHECK(counts_are(client, 0, 0));
  CHECK_OK(client, muster_worker_bye(client, worker));
  muster_queue_delete(client, QUEUE);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
