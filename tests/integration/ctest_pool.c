/*
 * ctest_pool.c — sessions and pools of libmuster against a real head, with
 * this program as its own fake worker (it leases and completes the tasks
 * itself, so no node agent is involved).
 *
 * Starts `$MUSTER_BIN head --listen 127.0.0.1:0` (with --server-only where the
 * head has it, so no local agent competes for the tasks) on a temporary data
 * dir, runs the checks and stops the head.  Set MUSTER_TEST_URL and
 * MUSTER_TEST_TOKEN to run against a head you started yourself.  Checks:
 * ordered and unordered results, cursor resume, a gap in a session's
 * indexes, update numbering and delivery with leases, exactly-once when a
 * task is completed after its lease was lost and re-leased, close and
 * expiry.  Ends with "N passed, M failed".
 */
#include "ctest_util.h"

#include <pthread.h>

#define TOKEN "ctest-token-0123456789"

/* The pool's own calls report through muster_pool_message(); like
 * check_err_client, a function so the message is read after the call. */
static void check_pool(muster_err_t got, const char *what, int line, const muster_pool_t *pool) {
  check_err(got, MUSTER_OK, what, line, muster_pool_message(pool));
}

#define CHECK_POOL(p, call) check_pool((call), #call, __LINE__, (p))

/* ---- the head process ------------------------------------------------------------- */

/* Non-zero when `muster head --help` lists --server-only (the head would
 * otherwise start a local node agent). */
static int head_has_server_only(const char *bin) {
  char cmd[1200], line[512];
  snprintf(cmd, sizeof cmd, "'%s' head --help 2>&1", bin);
  FILE *p = popen(cmd, "r");
  int found = 0;
  while (p != NULL && fgets(line, sizeof line, p) != NULL)
    found |= strstr(line, "--server-only") != NULL;
  if (p != NULL)
    pclose(p);
  return found;
}

/* ---- helpers ------------------------------------------------------------------------- */

static muster_pool_t *open_pool(const char *queue, const char *session) {
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, queue);
  opts.session = session;
  opts.init_data = "{\"model\":\"m1\"}";
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(&opts, &pool, &message);
  if (err != MUSTER_OK)
    fprintf(stderr, "pool open on %s: %s: %s\n", queue, muster_err_name(err),
            message ? message : "");
  CHECK(err == MUSTER_OK && pool != NULL);
  muster_free(message);
  return pool;
}

/* "0", "1", ... as JSON texts (integers). */
static char **make_inputs(size_t n) {
  char **inputs = calloc(n, sizeof *inputs);
  for (size_t i = 0; i < n; i++) {
    inputs[i] = malloc(24);
    snprintf(inputs[i], 24, "%zu", i);
  }
  return inputs;
}

static void free_inputs(char **inputs, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(inputs[i]);
  free(inputs);
}

/* Completes `lease` with 2 * its (integer) payload as the result. */
static muster_err_t complete_double(muster_client_t *c, const muster_lease_t *lease) {
  char result[32];
  snprintf(result, sizeof result, "%lld", 2 * atoll(lease->payload));
  muster_ack_t ack;
  muster_ack_init(&ack, lease->task, lease->token);
  ack.result = result;
  return muster_complete(c, &ack, 1);
}

/* Leases exactly `want` tasks of `queue` (polling with a deadline); returns the count got. */
static size_t lease_n(muster_client_t *c, const char *queue, size_t want, muster_lease_t **out) {
  muster_lease_t *all = calloc(want ? want : 1, sizeof *all);
  size_t got = 0;
  for (int64_t deadline = now_ms() + 20000; got < want && now_ms() < deadline;) {
    muster_lease_t *leases = NULL;
    size_t n = 0;
    if (muster_lease(c, queue, 0, want - got > 1000 ? 1000 : want - got, 2000, &leases, &n) !=
        MUSTER_OK) {
      fprintf(stderr, "lease: %s\n", muster_client_message(c));
      break;
    }
    memcpy(all + got, leases, n * sizeof *leases);
    got += n;
    free(leases); /* the strings moved into `all` */
  }
  *out = all;
  return got;
}

/* ---- a fake worker thread ------------------------------------------------------------- */

typedef struct {
  const char *queue;
  volatile int stop;
  long completed;
  pthread_t thread;
} fake_worker_t;

static void *fake_worker_main(void *arg) {
  fake_worker_t *w = arg;
  muster_client_t *c = connect_head(head_token);
  const char *queues[] = {w->queue, NULL};
  muster_worker_opts_t opts;
  muster_worker_opts_init(&opts);
  opts.queues = queues;
  opts.nickname = "ctest-pool";
  int64_t id = 0;
  muster_worker_register(c, &opts, &id, NULL);
  while (!w->stop) {
    muster_lease_t *leases = NULL;
    size_t n = 0;
    if (muster_lease(c, w->queue, id, 64, 200, &leases, &n) != MUSTER_OK)
      break;
    for (size_t i = 0; i < n; i++)
      w->completed += complete_double(c, &leases[i]) == MUSTER_OK;
    muster_leases_free(leases, n);
  }
  muster_worker_bye(c, id);
  muster_client_free(c);
  return NULL;
}

static void fake_worker_start(fake_worker_t *w, const char *queue) {
  memset(w, 0, sizeof *w);
  w->queue = queue;
  pthread_create(&w->thread, NULL, fake_worker_main, w);
}

static void fake_worker_stop(fake_worker_t *w) {
  w->stop = 1;
  pthread_join(w->thread, NULL);
}

/* ---- the checks --------------------------------------------------------------------------- */

/* Completes the leases of `leases` whose index is in `which` (-1 ends it). */
static void complete_indexes(muster_client_t *c, muster_lease_t *leases, size_t n,
                             const int *which) {
  for (const int *w = which; *w >= 0; w++)
    for (size_t i = 0; i < n; i++)
      if (leases[i].index == *w)
        CHECK_OK(c, complete_double(c, &leases[i]));
}

/* Reads one page and checks it holds exactly indexes `want` (-1 ends it). */
static int64_t expect_page(muster_client_t *c, const char *sid, muster_order_t order,
                           int64_t cursor, size_t max, const int *want, int line) {
  muster_results_t page;
  muster_err_t err = muster_session_results(c, sid, order, cursor, max, 0, &page);
  check_err(err, MUSTER_OK, "muster_session_results", line, muster_client_message(c));
  size_t n = 0;
  while (want[n] >= 0)
    n++;
  int ok = page.count == n;
  for (size_t i = 0; ok && i < n; i++)
    ok = page.results[i].index == want[i] && page.results[i].ok &&
         atoll(page.results[i].result) == 2 * want[i];
  if (!ok)
    fprintf(stderr, "  page from cursor %lld had %zu results, wanted %zu\n", (long long)cursor,
            page.count, n);
  check(ok, "the page holds exactly the expected indexes", line);
  int64_t next = page.cursor;
  muster_results_free(&page);
  return next;
}

static void test_session_calls(muster_client_t *c) {
  muster_session_opts_t so;
  muster_session_opts_init(&so);
  CHECK(so.cleanup_on_exit == -1 && so.timeout_ms == -1 && so.queue == NULL);
  char *sid = NULL, *json = NULL;
  CHECK_ERR(c, muster_session_create(c, &so, &sid, NULL), MUSTER_INVALID);
  so.queue = "cp-nope";
  CHECK_ERR(c, muster_session_create(c, &so, &sid, NULL), MUSTER_QUEUE_NOT_FOUND);
  CHECK(sid == NULL);
  CHECK_OK(c, muster_queue_put(c, "cp-sess", NULL, NULL));
  so.queue = "cp-sess";
  so.init_data = "{\"weights\":[1,2]}";
  CHECK_OK(c, muster_session_create(c, &so, &sid, &json));
  CHECK(sid != NULL && sid[0] != '\0');
  CHECK(contains(json, "\"weights\"") && contains(json, "\"open\""));
  muster_free(json);
  CHECK_OK(c, muster_session_list(c, &json));
  CHECK(contains(json, sid));
  muster_free(json);
  CHECK_OK(c, muster_session_heartbeat(c, sid));

  muster_task_spec_t specs[10];
  int64_t ids[10], indexes[10];
  char *inputs[10];
  for (int i = 0; i < 10; i++) {
    muster_task_spec_init(&specs[i]);
    inputs[i] = malloc(8);
    snprintf(inputs[i], 8, "%d", i);
    specs[i].payload = inputs[i];
  }
  CHECK_OK(c, muster_session_put(c, sid, specs, 10, ids, indexes));
  CHECK(indexes[0] == 0 && indexes[9] == 9 && ids[0] > 0);
  specs[0].index = 3;
  CHECK_ERR(c, muster_session_put(c, sid, specs, 1, NULL, NULL), MUSTER_INVALID_STATE);
  specs[0].index = -1;
  specs[0].key = "k";
  CHECK_ERR(c, muster_session_put(c, sid, specs, 1, NULL, NULL), MUSTER_INVALID);
  CHECK_ERR(c, muster_session_put(c, "s-nope", specs + 1, 1, NULL, NULL), MUSTER_SESSION_NOT_FOUND);

  muster_lease_t *leases = NULL;
  size_t n = lease_n(c, "cp-sess", 10, &leases);
  CHECK(n == 10);
  CHECK(leases[0].session != NULL && strcmp(leases[0].session, sid) == 0);
  complete_indexes(c, leases, n, (const int[]){0, 1, 2, 3, 4, 7, -1});
  /* Submission order stops at the first unfinished index; the cursor resumes. */
  int64_t cur =
      expect_page(c, sid, MUSTER_ORDER_SUBMISSION, 0, 3, (const int[]){0, 1, 2, -1}, __LINE__);
  CHECK(cur == 3);
  cur = expect_page(c, sid, MUSTER_ORDER_SUBMISSION, cur, 0, (const int[]){3, 4, -1}, __LINE__);
  CHECK(cur == 5);
  cur = expect_page(c, sid, MUSTER_ORDER_SUBMISSION, cur, 0, (const int[]){-1}, __LINE__);
  CHECK(cur == 5);
  complete_indexes(c, leases, n, (const int[]){6, 5, -1});
  cur = expect_page(c, sid, MUSTER_ORDER_SUBMISSION, cur, 0, (const int[]){5, 6, 7, -1}, __LINE__);
  CHECK(cur == 8);
  /* Completion order: as they finished; its cursor resumes after the last one. */
  int64_t seq = expect_page(c, sid, MUSTER_ORDER_COMPLETION, 0, 0,
                            (const int[]){0, 1, 2, 3, 4, 7, 6, 5, -1}, __LINE__);
  CHECK(seq > 0);
  complete_indexes(c, leases, n, (const int[]){8, -1});
  expect_page(c, sid, MUSTER_ORDER_COMPLETION, seq, 0, (const int[]){8, -1}, __LINE__);
  /* A permanently failed task is a result too, with its error. */
  for (size_t i = 0; i < n; i++)
    if (leases[i].index == 9) {
      muster_ack_t ack;
      muster_ack_init(&ack, leases[i].task, leases[i].token);
      ack.error = "bad input";
      ack.permanent = 1;
      CHECK_OK(c, muster_fail(c, &ack, 1));
    }
  muster_results_t page;
  /* An order that is neither (a cast int) is refused, not read as submission. */
  CHECK_ERR(c, muster_session_results(c, sid, (muster_order_t)7, 8, 0, 0, &page), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "order: 7, expected MUSTER_ORDER_SUBMISSION"));
  muster_results_free(&page);
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 8, 0, 0, &page));
  CHECK(page.count == 2 && page.total == 10 && page.done == 10);
  if (page.count == 2)
    CHECK(!page.results[1].ok && page.results[1].index == 9 &&
          contains(page.results[1].error, "bad input") && page.results[1].result == NULL);
  muster_results_free(&page);
  muster_leases_free(leases, n);

  int64_t cancelled = -1;
  CHECK_OK(c, muster_session_close(c, sid, &cancelled));
  CHECK(cancelled == 0);
  CHECK_ERR(c, muster_session_get(c, sid, &json), MUSTER_SESSION_NOT_FOUND);
  CHECK_ERR(c, muster_session_heartbeat(c, sid), MUSTER_SESSION_NOT_FOUND);
  CHECK_ERR(c, muster_session_close(c, sid, NULL), MUSTER_SESSION_NOT_FOUND);
  muster_free(sid);
  for (int i = 0; i < 10; i++)
    free(inputs[i]);
}

/* Puts tasks with payload `index` at the explicit indexes of `which` (-1 ends it). */
static void put_at(muster_client_t *c, const char *sid, const int *which) {
  muster_task_spec_t specs[8];
  char payloads[8][16];
  size_t n = 0;
  for (const int *w = which; *w >= 0 && n < 8; w++, n++) {
    muster_task_spec_init(&specs[n]);
    snprintf(payloads[n], sizeof payloads[n], "%d", *w);
    specs[n].payload = payloads[n];
    specs[n].index = *w;
  }
  CHECK_OK(c, muster_session_put(c, sid, specs, n, NULL, NULL));
}

/* Explicit indexes 0 and 5 leave 1..4 without a task: a page says where it
 * stops; once 0 and 5 have their results a read at 1 fails with
 * MUSTER_INDEX_GAP (also one that asked to wait) instead of returning empty
 * pages for ever; the gap filled later is read in its place, once. */
static void test_session_gap(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "cp-gap", NULL, NULL));
  muster_session_opts_t so;
  muster_session_opts_init(&so);
  so.queue = "cp-gap";
  char *sid = NULL;
  CHECK_OK(c, muster_session_create(c, &so, &sid, NULL));
  put_at(c, sid, (const int[]){0, 5, -1});
  muster_lease_t *leases = NULL;
  size_t n = lease_n(c, "cp-gap", 2, &leases);
  CHECK(n == 2);
  complete_indexes(c, leases, n, (const int[]){0, -1});
  muster_results_t page;
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 0, 0, 0, &page));
  CHECK(page.count == 1 && page.cursor == 1 && page.gap_first == 1 && page.gap_last == 4);
  CHECK(page.done == 1 && page.total == 2);
  muster_results_free(&page);
  /* Index 5 is unfinished: the gap may still be filled, an empty page is no error. */
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 1, 0, 0, &page));
  CHECK(page.count == 0 && page.gap_first == 1 && page.gap_last == 4);
  muster_results_free(&page);
  complete_indexes(c, leases, n, (const int[]){5, -1});
  for (int64_t wait_ms = 0; wait_ms <= 300; wait_ms += 300) {
    CHECK_ERR(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 1, 0, wait_ms, &page),
              MUSTER_INDEX_GAP);
    const char *message = muster_client_message(c);
    CHECK(contains(message, sid) && contains(message, "index 1 has no task") &&
          contains(message, "indexes 1-4 were never submitted, or purged") &&
          contains(message, "read on past it (from cursor 5) or in completion order"));
    CHECK(page.count == 0 && page.cursor == 1 && page.gap_first == 1 && page.gap_last == 4);
    CHECK(page.done == 2 && page.total == 2);
    muster_results_free(&page);
  }
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_COMPLETION, 0, 0, 0, &page));
  CHECK(page.count == 2 && page.gap_first == -1);
  muster_results_free(&page);
  muster_leases_free(leases, n);
  /* Filling the gap: index 1 first (its task unfinished, no error), then the rest. */
  put_at(c, sid, (const int[]){2, -1});
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 1, 0, 0, &page));
  CHECK(page.count == 0 && page.gap_first == 1 && page.gap_last == 1);
  muster_results_free(&page);
  put_at(c, sid, (const int[]){1, 3, 4, -1});
  n = lease_n(c, "cp-gap", 4, &leases);
  CHECK(n == 4);
  complete_indexes(c, leases, n, (const int[]){4, 2, 3, 1, -1});
  int64_t cur = expect_page(c, sid, MUSTER_ORDER_SUBMISSION, 1, 0, (const int[]){1, 2, 3, 4, 5, -1},
                            __LINE__);
  CHECK(cur == 6);
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, cur, 0, 0, &page));
  CHECK(page.count == 0 && page.gap_first == -1 && page.done == 6 && page.total == 6);
  muster_results_free(&page);
  muster_leases_free(leases, n);
  CHECK_OK(c, muster_session_close(c, sid, NULL));
  muster_free(sid);
}

/* map_partial that reads every result is map, and says none is left unread:
 * inputs[0..5) are 7..11, doubled by the fake worker. */
static void check_map_partial_whole(muster_pool_t *pool, const char *const *inputs) {
  muster_result_t *results = NULL;
  size_t unread = 99;
  CHECK_POOL(pool, muster_pool_map_partial(pool, inputs, 5, &results, &unread));
  CHECK(unread == 0 && results != NULL && results[4].index == 4 && results[4].state != NULL &&
        atoll(results[4].result) == 22);
  muster_pool_results_free(results, 5);
}

static void test_pool_map(muster_client_t *c) {
  muster_pool_t *pool = NULL;
  muster_pool_opts_t opts;
  muster_pool_opts_init(&opts);
  CHECK(opts.create_queue == 1 && opts.heartbeat_ms == -1);
  CHECK(muster_pool_open(NULL, &pool, NULL) == MUSTER_INVALID && pool == NULL);
  char *message = NULL;
  CHECK(muster_pool_open(&opts, &pool, &message) == MUSTER_INVALID && message != NULL);
  muster_free(message);
  muster_pool_close(NULL);

  /* The pool creates its queue: the worker starts after it, or its first lease
   * could find no queue and the worker would end before map's tasks arrive. */
  if ((pool = open_pool("cp-map", NULL)) == NULL)
    return;
  fake_worker_t worker;
  fake_worker_start(&worker, "cp-map");
  CHECK(muster_pool_session(pool) != NULL);
  enum { N = 2500 };
  char **inputs = make_inputs(N);
  muster_result_t *results = NULL;
  CHECK_POOL(pool, muster_pool_map(pool, (const char *const *)inputs, N, &results));
  int in_order = results != NULL;
  for (size_t i = 0; in_order && i < N; i++)
    in_order = results[i].ok && results[i].index == (int64_t)i && results[i].result &&
               atoll(results[i].result) == 2 * (long long)i;
  CHECK(in_order);
  muster_pool_results_free(results, N);
  /* A second map on the same pool: its own inputs, numbered from 0 again. */
  CHECK_POOL(pool, muster_pool_map(pool, (const char *const *)inputs + 7, 5, &results));
  CHECK(results != NULL && results[4].index == 4 && atoll(results[4].result) == 22);
  muster_pool_results_free(results, 5);
  check_map_partial_whole(pool, (const char *const *)inputs + 7);
  /* imap_unordered with a live worker: every input exactly once. */
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap_unordered(pool, (const char *const *)inputs, 300, &it));
  unsigned char seen[300] = {0};
  size_t got = 0, twice = 0;
  while (it != NULL && !muster_pool_iter_done(it)) {
    muster_result_t r;
    int has = 0;
    if (muster_pool_iter_next(it, 20000, &r, &has) != MUSTER_OK || !has)
      break;
    twice += seen[r.index]++;
    got += r.ok && atoll(r.result) == 2 * r.index;
    muster_result_clear(&r);
  }
  CHECK(got == 300 && twice == 0 && muster_pool_iter_duplicates(it) == 0);
  muster_pool_iter_free(it);
  size_t workers = 0, nodes = 99;
  CHECK_POOL(pool, muster_pool_workers_count(pool, &workers));
  CHECK(workers == 1);
  if (workers != 1) {
    char *list = NULL;
    muster_worker_list(c, &list);
    fprintf(stderr, "  workers: %zu in %s\n", workers, list ? list : "?");
    muster_free(list);
  }
  /* The fake worker registered without a node: a machine of its own. */
  CHECK_POOL(pool, muster_pool_nodes_count(pool, &nodes));
  CHECK(nodes == 1);
  fake_worker_stop(&worker);
  CHECK(worker.completed == N + 5 + 5 + 300);
  muster_pool_close(pool);
  free_inputs(inputs, N);
}

/* Runs `ordered` imap of `n` inputs, completes them in reverse, checks the order seen. */
static void check_order(muster_client_t *c, muster_pool_t *pool, const char *queue, size_t n,
                        int ordered) {
  char **inputs = make_inputs(n);
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap(pool, (const char *const *)inputs, n, ordered, &it));
  muster_result_t r;
  int has = 1;
  CHECK_POOL(pool, muster_pool_iter_next(it, 0, &r, &has));
  CHECK(has == 0 && !muster_pool_iter_done(it));
  muster_lease_t *leases = NULL;
  size_t got = lease_n(c, queue, n, &leases);
  CHECK(got == n);
  for (size_t i = got; i-- > 0;)
    CHECK_OK(c, complete_double(c, &leases[i]));
  muster_leases_free(leases, got);
  int as_expected = 1;
  for (size_t k = 0; k < n; k++) {
    if (muster_pool_iter_next(it, 10000, &r, &has) != MUSTER_OK || !has) {
      as_expected = 0;
      break;
    }
    size_t want = ordered ? k : n - 1 - k;
    as_expected &= r.index == (int64_t)want && r.ok && atoll(r.result) == 2 * (long long)want;
    muster_result_clear(&r);
  }
  CHECK(as_expected);
  size_t delivered = 0, total = 0;
  muster_pool_iter_progress(it, &delivered, &total);
  CHECK(delivered == n && total == n && muster_pool_iter_done(it));
  CHECK_POOL(pool, muster_pool_iter_next(it, -1, &r, &has));
  CHECK(has == 0);
  muster_pool_iter_free(it);
  free_inputs(inputs, n);
}

static void test_pool_orders(muster_client_t *c) {
  muster_pool_t *pool = open_pool("cp-order", NULL);
  if (pool == NULL)
    return;
  check_order(c, pool, "cp-order", 20, 0);
  check_order(c, pool, "cp-order", 7, 1);
  check_order(c, pool, "cp-order", 1200, 0); /* more than one page and one submit batch */
  check_order(c, pool, "cp-order", 5, 0);    /* starts past the earlier completions */
  char *json = NULL;
  CHECK_OK(c, muster_session_get(c, muster_pool_session(pool), &json));
  CHECK(contains(json, "\"next_index\":1232") && contains(json, "\"model\""));
  muster_free(json);
  muster_pool_close(pool);
}

static void test_pool_resume(muster_client_t *c) {
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, "cp-resume");
  opts.keep_session = 1;
  muster_pool_t *pool = NULL;
  CHECK_OK(c, muster_pool_open(&opts, &pool, NULL));
  if (pool == NULL)
    return;
  char *sid = strdup(muster_pool_session(pool));
  char **inputs = make_inputs(10);
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap(pool, (const char *const *)inputs, 10, 1, &it));
  muster_lease_t *leases = NULL;
  size_t n = lease_n(c, "cp-resume", 10, &leases);
  for (size_t i = 0; i < n; i++)
    CHECK_OK(c, complete_double(c, &leases[i]));
  muster_leases_free(leases, n);
  for (int k = 0; k < 4; k++) {
    muster_result_t r;
    int has = 0;
    CHECK_POOL(pool, muster_pool_iter_next(it, 5000, &r, &has));
    CHECK(has && r.index == k);
    muster_result_clear(&r);
  }
  muster_pool_iter_free(it);
  muster_pool_close(pool); /* keep_session: the session stays open */
  /* Another client resumes from cursor 4 and attaches a pool to the session. */
  expect_page(c, sid, MUSTER_ORDER_SUBMISSION, 4, 0, (const int[]){4, 5, 6, 7, 8, 9, -1}, __LINE__);
  opts.session = sid;
  opts.keep_session = 0;
  CHECK_OK(c, muster_pool_open(&opts, &pool, NULL));
  if (pool != NULL) {
    CHECK_POOL(pool, muster_pool_imap(pool, (const char *const *)inputs, 3, 1, &it));
    n = lease_n(c, "cp-resume", 3, &leases);
    CHECK(n == 3 && leases[0].index == 10 && leases[2].index == 12);
    muster_leases_free(leases, n);
    muster_pool_iter_free(it);
    muster_pool_close(pool); /* attached, not its own: the session stays open */
  }
  CHECK_OK(c, muster_session_get(c, sid, NULL));
  int64_t cancelled = 0;
  CHECK_OK(c, muster_session_close(c, sid, &cancelled));
  CHECK(cancelled == 3);
  opts.session = "s-nope";
  CHECK_ERR(c, muster_pool_open(&opts, &pool, NULL), MUSTER_SESSION_NOT_FOUND);
  free(sid);
  free_inputs(inputs, 10);
}

/* A batch sent twice (its first reply lost) is one batch: the head answers the
 * second as a repeat.  Another producer's task at one of a pool's indexes is
 * a collision: the pool's map fails with invalid_state naming the index,
 * instead of taking the batch for stored. */
static void test_pool_collision(muster_client_t *c) {
  muster_pool_t *pool = open_pool("cp-collide", NULL);
  if (pool == NULL)
    return;
  const char *sid = muster_pool_session(pool);
  muster_task_spec_t spec[2];
  for (int i = 0; i < 2; i++) {
    muster_task_spec_init(&spec[i]);
    spec[i].payload = i ? "{\"n\":1}" : "\"other\"";
    spec[i].index = 1 + i;
  }
  CHECK_OK(c, muster_session_put(c, sid, spec, 2, NULL, NULL));
  CHECK_OK(c, muster_session_put(c, sid, spec, 2, NULL, NULL)); /* a repeat */
  char *json = NULL;
  CHECK_OK(c, muster_session_get(c, sid, &json));
  CHECK(json && contains(json, "\"total\":2"));
  muster_free(json);
  char **inputs = make_inputs(3);
  muster_pool_iter_t *it = NULL;
  CHECK(muster_pool_imap(pool, (const char *const *)inputs, 3, 1, &it) == MUSTER_INVALID_STATE);
  CHECK(it == NULL && contains(muster_pool_message(pool), "1 is already in use"));
  free_inputs(inputs, 3);
  muster_pool_close(pool);
}

/* POSTs a lease with updates_after `after`; returns the reply text (free it). */
static char *lease_with_updates(muster_client_t *c, const char *queue, int after) {
  char path[128], body[64], *reply = NULL;
  snprintf(path, sizeof path, "/v1/queues/%s/lease", queue);
  snprintf(body, sizeof body, "{\"max\":1,\"updates_after\":%d}", after);
  CHECK_OK(c, muster_request(c, "POST", path, body, &reply));
  return reply;
}

static void test_updates(muster_client_t *c) {
  muster_pool_t *a = open_pool("cp-upd", NULL), *b = open_pool("cp-upd", NULL);
  if (a == NULL || b == NULL) {
    muster_pool_close(a);
    muster_pool_close(b);
    return;
  }
  int64_t seq = 0;
  CHECK_POOL(a, muster_pool_update_workers(a, "{\"v\":1}", &seq));
  CHECK(seq == 1);
  CHECK_POOL(a, muster_pool_update_workers(a, "{\"v\":2}", &seq));
  CHECK(seq == 2);
  CHECK_POOL(b, muster_pool_update_workers(b, "\"from b\"", &seq));
  CHECK(seq == 3);
  CHECK(muster_pool_update_workers(a, "{bad json", &seq) == MUSTER_INVALID);
  CHECK_ERR(c, muster_update_post(c, "cp-nope", "1", NULL, &seq), MUSTER_QUEUE_NOT_FOUND);
  char *json = NULL;
  CHECK_OK(c, muster_update_list(c, "cp-upd", 0, 0, &json));
  CHECK(contains(json, "\"v\":1") && contains(json, "\"from b\"") && contains(json, "\"last\":3"));
  muster_free(json);
  CHECK_OK(c, muster_update_list(c, "cp-upd", 2, 0, &json));
  CHECK(!contains(json, "\"v\":1") && contains(json, "\"from b\""));
  muster_free(json);
  /* A worker gets the updates it has not seen with its lease, in order. */
  char *reply = lease_with_updates(c, "cp-upd", 0);
  const char *one = reply ? strstr(reply, "\"v\":1") : NULL;
  const char *two = reply ? strstr(reply, "\"v\":2") : NULL;
  CHECK(one != NULL && two != NULL && one < two && contains(reply, "\"updates_last\":3"));
  muster_free(reply);
  reply = lease_with_updates(c, "cp-upd", 2);
  CHECK(!contains(reply, "\"v\":1") && contains(reply, "\"from b\""));
  muster_free(reply);
  /* Closing pool a deletes its updates with its session; numbering goes on. */
  muster_pool_close(a);
  CHECK_OK(c, muster_update_list(c, "cp-upd", 0, 0, &json));
  CHECK(!contains(json, "\"v\":1") && contains(json, "\"from b\""));
  muster_free(json);
  CHECK_POOL(b, muster_pool_update_workers(b, "4", &seq));
  CHECK(seq == 4);
  muster_pool_close(b);
}

/* A task whose lease is lost and re-leased is completed by both holders; the
 * pool hands out one result per input, the second holder's. */
static void test_exactly_once(muster_client_t *c) {
  muster_queue_opts_t qo;
  muster_queue_opts_init(&qo);
  qo.lease_ms = 300;
  qo.backoff_ms = 0;
  qo.backoff_max_ms = 0;
  CHECK_OK(c, muster_queue_put(c, "cp-once", &qo, NULL));
  muster_pool_t *pool = open_pool("cp-once", NULL);
  if (pool == NULL)
    return;
  char **inputs = make_inputs(2);
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap(pool, (const char *const *)inputs, 2, 0, &it));
  muster_lease_t *first = NULL, *second = NULL;
  size_t n1 = lease_n(c, "cp-once", 2, &first);
  /* Nobody extends: the leases expire and the tasks are leased again. */
  size_t n2 = lease_n(c, "cp-once", 2, &second);
  CHECK(n1 == 2 && n2 == 2);
  if (n1 == 2 && n2 == 2) {
    CHECK(second[0].task == first[0].task && second[0].token != first[0].token);
    CHECK(second[0].attempt == 2);
    /* Input 0: the new holder completes first, then the old one (late). */
    CHECK_OK(c, complete_double(c, &second[0]));
    CHECK_ERR(c, complete_double(c, &first[0]), MUSTER_LEASE_LOST);
    /* Input 1: the old holder comes back first and is refused; the new one completes. */
    CHECK_ERR(c, complete_double(c, &first[1]), MUSTER_LEASE_LOST);
    CHECK_OK(c, complete_double(c, &second[1]));
    /* Again under the completing token (a retry after a lost reply): a repeat,
     * answered and counted once (the pool yields input 1 once below). */
    CHECK_OK(c, complete_double(c, &second[1]));
  }
  muster_leases_free(first, n1);
  muster_leases_free(second, n2);
  size_t got[2] = {0, 0};
  for (int k = 0; k < 3; k++) {
    muster_result_t r;
    int has = 0;
    CHECK_POOL(pool, muster_pool_iter_next(it, k < 2 ? 10000 : 300, &r, &has));
    if (has && r.index >= 0 && r.index < 2)
      got[r.index] += r.ok && atoll(r.result) == 2 * r.index;
    CHECK(has == (k < 2));
    muster_result_clear(&r);
  }
  CHECK(got[0] == 1 && got[1] == 1 && muster_pool_iter_duplicates(it) == 0);
  muster_pool_iter_free(it);
  /* The head's own stream names each index once as well. */
  muster_results_t page;
  CHECK_OK(c, muster_session_results(c, muster_pool_session(pool), MUSTER_ORDER_COMPLETION, 0, 0, 0,
                                     &page));
  CHECK(page.count == 2 && page.results[0].index != page.results[1].index);
  muster_results_free(&page);
  muster_pool_close(pool);
  free_inputs(inputs, 2);
}

/* close cancels unfinished work; a silent client's session expires; the
 * heartbeat thread keeps a pool's session alive. */
static void test_close_and_expiry(muster_client_t *c) {
  muster_pool_t *pool = open_pool("cp-close", NULL);
  if (pool == NULL)
    return;
  char *sid = strdup(muster_pool_session(pool));
  char **inputs = make_inputs(3);
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap(pool, (const char *const *)inputs, 3, 1, &it));
  muster_pool_iter_free(it);
  muster_pool_close(pool);
  CHECK_ERR(c, muster_session_get(c, sid, NULL), MUSTER_SESSION_NOT_FOUND);
  muster_lease_t *leases = NULL;
  size_t n = 9;
  CHECK_OK(c, muster_lease(c, "cp-close", 0, 10, 0, &leases, &n));
  CHECK(n == 0);
  muster_leases_free(leases, n);
  free(sid);

  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, "cp-close");
  opts.timeout_ms = 400;
  opts.heartbeat_ms = 0; /* silent */
  muster_pool_t *silent = NULL, *beating = NULL;
  CHECK_OK(c, muster_pool_open(&opts, &silent, NULL));
  opts.heartbeat_ms = 100;
  CHECK_OK(c, muster_pool_open(&opts, &beating, NULL));
  if (silent != NULL && beating != NULL) {
    /* Poll the list: a call naming the session would count as its heartbeat. */
    int listed = 1;
    int64_t start = now_ms();
    while (listed && now_ms() - start < 15000) {
      char *list = NULL;
      listed =
          muster_session_list(c, &list) != MUSTER_OK || contains(list, muster_pool_session(silent));
      muster_free(list);
      if (listed)
        usleep(50000); /* polling for the expiry, with a deadline */
    }
    CHECK(!listed);
    CHECK_ERR(c, muster_session_get(c, muster_pool_session(silent), NULL),
              MUSTER_SESSION_NOT_FOUND);
    /* By now the silent one's timeout passed several times over; the other lives. */
    CHECK(now_ms() - start >= 400);
    CHECK_OK(c, muster_session_get(c, muster_pool_session(beating), NULL));
  }
  muster_pool_close(silent);
  muster_pool_close(beating);
  free_inputs(inputs, 3);
}

/* MUSTER_INVALID from a pool call, muster_pool_message containing `want`. */
static void check_pool_said(const muster_pool_t *pool, muster_err_t err, const char *want,
                            int line) {
  char what[240];
  snprintf(what, sizeof what, "MUSTER_INVALID saying '%s' (got %s, said: %s)", want,
           muster_err_name(err), muster_pool_message(pool));
  check(err == MUSTER_INVALID && contains(muster_pool_message(pool), want), what, line);
}

#define CHECK_POOL_SAID(p, call, want) check_pool_said((p), (call), (want), __LINE__)

/* Opens with `opts`; MUSTER_INVALID with an open message containing `want`. */
static void check_open_said(const muster_pool_opts_t *opts, const char *want, int line) {
  muster_pool_t *pool = NULL;
  char *message = NULL, what[240];
  muster_err_t err = muster_pool_open(opts, &pool, &message);
  snprintf(what, sizeof what, "open refused saying '%s' (got %s, said: %s)", want,
           muster_err_name(err), message ? message : "");
  check(err == MUSTER_INVALID && pool == NULL && contains(message, want), what, line);
  muster_free(message);
  muster_pool_close(pool);
}

/* Missing places for an answer and negative numbers other than the
 * documented -1s are refused with a message naming the argument (they came
 * back without one, or were taken as the default), before the head is asked. */
static void test_pool_refusals(muster_client_t *c) {
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, "cp-refused");
  CHECK(opts.request_timeout_ms == 0);
  char *message = NULL;
  CHECK(muster_pool_open(&opts, NULL, &message) == MUSTER_INVALID);
  CHECK(contains(message, "out: a place for the pool is required"));
  muster_free(message);
  opts.heartbeat_ms = -5;
  check_open_said(&opts, "heartbeat_ms: -5, expected a period in milliseconds", __LINE__);
  opts.heartbeat_ms = -1;
  opts.timeout_ms = -5;
  check_open_said(&opts, "timeout_ms: -5, expected a time in milliseconds", __LINE__);
  opts.timeout_ms = -1;
  opts.request_timeout_ms = -1;
  check_open_said(&opts, "request_timeout_ms: -1, expected a time in milliseconds", __LINE__);
  opts.request_timeout_ms = 0;
  opts.url = "ftp://127.0.0.1:7370";
  check_open_said(&opts, "url 'ftp://127.0.0.1:7370': expected http://HOST[:PORT]", __LINE__);
  CHECK_ERR(c, muster_queue_get(c, "cp-refused", NULL), MUSTER_QUEUE_NOT_FOUND);

  muster_pool_t *pool = open_pool("cp-refused", NULL);
  if (pool == NULL)
    return;
  const char *inputs[] = {"1"};
  muster_result_t *results = NULL, r;
  muster_pool_iter_t *it = NULL;
  int has = 0;
  CHECK_POOL_SAID(pool, muster_pool_workers_count(pool, NULL), "count: a place for");
  CHECK_POOL_SAID(pool, muster_pool_nodes_count(pool, NULL), "count: a place for");
  CHECK_POOL_SAID(pool, muster_pool_map(pool, inputs, 1, NULL), "results: a place for");
  CHECK_POOL_SAID(pool, muster_pool_imap(pool, inputs, 1, 1, NULL), "out: a place for");
  CHECK_POOL_SAID(pool, muster_pool_imap(pool, NULL, 2, 1, &it), "inputs: required (2 of them)");
  CHECK_POOL(pool, muster_pool_imap(pool, inputs, 1, 1, &it));
  CHECK_POOL_SAID(pool, muster_pool_iter_next(it, 0, NULL, &has), "out: a place for the result");
  CHECK_POOL_SAID(pool, muster_pool_iter_next(it, 0, &r, NULL), "has: a place for the flag");
  CHECK_POOL_SAID(pool, muster_pool_iter_next(it, -2, &r, &has),
                  "wait_ms: -2, expected 0 or more milliseconds, or -1");
  results = &r; /* a refused map leaves no stale pointer behind */
  CHECK_POOL_SAID(pool, muster_pool_map(pool, NULL, 2, &results), "inputs: required (2 of them)");
  CHECK(results == NULL);
  muster_pool_iter_free(it);
  muster_pool_close(pool);
}

/* map_partial refused before anything is submitted (inputs[1200] of `count`
 * is NULL): no results to hand back, none unread. */
static void check_map_partial_refused(muster_pool_t *pool, const char **inputs, size_t count) {
  muster_result_t dummy, *results = &dummy;
  size_t unread = 99;
  CHECK_POOL_SAID(pool, muster_pool_map_partial(pool, inputs, 1, NULL, NULL),
                  "results: a place for");
  CHECK_POOL_SAID(pool, muster_pool_map_partial(pool, inputs, count, &results, &unread),
                  "inputs[1200]: NULL, expected JSON text");
  CHECK(results == NULL && unread == 0);
}

/* An input that is no JSON text (or NULL) is refused by imap and map before
 * any input is submitted, named by its place among the caller's inputs: one
 * in the second batch of 1000 used to leave the first batch running with no
 * iterator to read it, named tasks[200] for inputs[1200]. */
static void test_pool_bad_inputs(muster_client_t *c) {
  muster_pool_t *pool = open_pool("cp-bad-inputs", NULL);
  if (pool == NULL)
    return;
  enum { COUNT = 1500 };
  static char text[COUNT][8];
  const char *inputs[COUNT];
  for (size_t i = 0; i < COUNT; i++) {
    snprintf(text[i], sizeof text[i], "%zu", i);
    inputs[i] = text[i];
  }
  inputs[1200] = "{oops";
  muster_pool_iter_t *it = NULL;
  CHECK_POOL_SAID(pool, muster_pool_imap(pool, inputs, COUNT, 1, &it),
                  "inputs[1200]: not valid JSON: ");
  CHECK(it == NULL);
  inputs[1200] = NULL;
  muster_result_t *results = NULL;
  CHECK_POOL_SAID(pool, muster_pool_map(pool, inputs, COUNT, &results),
                  "inputs[1200]: NULL, expected JSON text");
  check_map_partial_refused(pool, inputs, COUNT);
  char *json = NULL;
  CHECK_OK(c, muster_session_get(c, muster_pool_session(pool), &json));
  CHECK(contains(json, "\"total\":0,") && contains(json, "\"next_index\":0,"));
  muster_free(json);
  /* Text the scan does not take as it stands (spaces, escapes) is still JSON. */
  const char *fine[] = {" [1, 2] ", "\"\\u00e9\"", "1.50"};
  CHECK_POOL(pool, muster_pool_imap(pool, fine, 3, 1, &it));
  CHECK(strcmp(muster_pool_message(pool), "") == 0);
  muster_pool_iter_free(it);
  /* A later call that succeeds says no failure, a map of nothing too. */
  CHECK_POOL_SAID(pool, muster_pool_update_workers(pool, NULL, NULL), "data: NULL, expected");
  CHECK_POOL(pool, muster_pool_map(pool, inputs, 0, &results));
  CHECK(strcmp(muster_pool_message(pool), "") == 0);
  muster_pool_results_free(results, 0);
  muster_pool_close(pool);
}

/* A pool whose tasks require shared data: every task it puts carries the
 * levels, which it copied at open (the caller's strings may change after);
 * bad levels are refused at open, before a queue or session is made. */
static void test_pool_required(muster_client_t *c) {
  muster_shared_level_t bad[] = {{"ctest", "w", 1}, {"ctest", "v", 0}};
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, "cp-required");
  opts.required = bad;
  opts.required_count = 2;
  check_open_said(&opts, "requires[1].level: 0, expected 1 or more", __LINE__);
  opts.required_count = MUSTER_MAX_REQUIRES + 1;
  check_open_said(&opts, "requires: 17 levels, at most 16 allowed", __LINE__);
  CHECK_ERR(c, muster_queue_get(c, "cp-required", NULL), MUSTER_QUEUE_NOT_FOUND);

  char scope[16] = "cp-scope";
  muster_shared_level_t levels[] = {{scope, "weights", 3}};
  opts.required = levels;
  opts.required_count = 1;
  muster_pool_t *pool = NULL;
  CHECK_OK(c, muster_pool_open(&opts, &pool, NULL));
  if (pool == NULL)
    return;
  snprintf(scope, sizeof scope, "changed");
  const char *inputs[] = {"1", "2"};
  muster_pool_iter_t *it = NULL;
  CHECK_POOL(pool, muster_pool_imap(pool, inputs, 2, 1, &it));
  muster_pool_iter_free(it);
  char *reply = NULL;
  CHECK_OK(c, muster_request(c, "POST", "/v1/queues/cp-required/lease", "{\"max\":10}", &reply));
  const char *want = "\"requires\":[{\"scope\":\"cp-scope\",\"name\":\"weights\",\"level\":3}]";
  const char *first = reply ? strstr(reply, want) : NULL;
  CHECK(first != NULL && strstr(first + 1, want) != NULL); /* both tasks */
  muster_free(reply);
  muster_pool_close(pool);
}

int main(int argc, char **argv) {
  if (!ctest_use_test_url(TOKEN)) {
    const char *bin = muster_bin(argv[0]);
    const char *const head_args[] = {head_has_server_only(bin) ? "--server-only" : NULL, NULL};
    if (ctest_head_start(bin, "/tmp/muster-ctest-pool-XXXXXX", TOKEN, head_args) != 0)
      return ctest_head_failed();
  }
  muster_client_t *client = connect_head(head_token);
  static const struct {
    const char *name;
    void (*run)(muster_client_t *);
  } tests[] = {
      {"session calls", test_session_calls},
      {"session gap", test_session_gap},
      {"pool map", test_pool_map},
      {"pool orders", test_pool_orders},
      {"pool resume", test_pool_resume},
      {"pool collision", test_pool_collision},
      {"updates", test_updates},
      {"exactly once", test_exactly_once},
      {"close and expiry", test_close_and_expiry},
      {"pool refusals", test_pool_refusals},
      {"pool bad inputs", test_pool_bad_inputs},
      {"pool required", test_pool_required},
  };
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    int64_t start = now_ms();
    int failed_before = failed;
    tests[i].run(client);
    fprintf(stderr, "%-18s %s in %lld ms\n", tests[i].name,
            failed == failed_before ? "ok" : "FAILED", (long long)(now_ms() - start));
  }
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
