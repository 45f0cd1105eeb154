/*
 * ctest_pool_why.c — libmuster's muster_pool_iter_failing against a real
 * head, with this program as its own worker: it fails the iterator's tasks
 * with errors of its choosing, so the text is known to the letter.  Checks:
 * which tasks count (the iterator's own, unfinished, with an error: not a
 * done one, one failed for good, another iterator's or another session's),
 * the newest first, up to three distinct errors, the rest counted, each job
 * named by its input's position; "" before any failed and for an empty
 * iterator; NULL arguments refused.  Python's pool_why.py words it the same
 * (docs/pools.md).
 *
 * Starts `$MUSTER_BIN head --server-only --listen 127.0.0.1:0` on a temporary
 * data dir (MUSTER_TEST_URL and MUSTER_TEST_TOKEN: a head you started
 * yourself).  Ends with "N passed, M failed".
 */
#include "ctest_util.h"

#define TOKEN "ctest-token-0123456789"
#define QUEUE "cwhy"
#define LEASES 10 /* every task the test puts */

static muster_pool_t *open_pool(void) {
  muster_pool_opts_t opts;
  ctest_pool_opts(&opts, head_url, QUEUE);
  muster_pool_t *pool = NULL;
  CHECK(muster_pool_open(&opts, &pool, NULL) == MUSTER_OK && pool != NULL);
  return pool;
}

static muster_pool_iter_t *imap(muster_pool_t *pool, const char *const *inputs, size_t n) {
  muster_pool_iter_t *it = NULL;
  CHECK(pool != NULL && muster_pool_imap(pool, inputs, n, 1, &it) == MUSTER_OK);
  return it;
}

/* muster_pool_iter_failing's text for `it` ("?" when the call failed; muster_free). */
static char *failing(muster_pool_iter_t *it, int line) {
  char *text = NULL;
  muster_err_t err = muster_pool_iter_failing(it, &text);
  check_err(err, MUSTER_OK, "muster_pool_iter_failing", line, "");
  return text ? text : strdup("?");
}

/* Checks that `it`'s text is `want`. */
static void expect_text(muster_pool_iter_t *it, const char *want, int line) {
  char *text = failing(it, line);
  if (strcmp(text, want) != 0)
    fprintf(stderr, "  got:  %s\n  want: %s\n", text, want);
  check(strcmp(text, want) == 0, "the text is the one expected", line);
  free(text);
}

/* Ends the lease of `leases` whose session is `sid` and index `index`: a
 * complete when `error` is NULL, else a fail with it (`permanent` or not). */
static void end_one(muster_client_t *c, muster_lease_t *leases, size_t n, const char *sid,
                    int64_t index, const char *error, int permanent) {
  for (size_t i = 0; i < n; i++) {
    if (leases[i].index != index || leases[i].session == NULL || strcmp(leases[i].session, sid))
      continue;
    muster_ack_t ack;
    muster_ack_init(&ack, leases[i].task, leases[i].token);
    ack.error = error;
    ack.permanent = permanent;
    CHECK_OK(c, error ? muster_fail(c, &ack, 1) : muster_complete(c, &ack, 1));
    return;
  }
  check(0, "a lease of that session and index", __LINE__);
}

/* Leases every task of the queue (LEASES of them) into all[]; their count. */
static size_t lease_all(muster_client_t *c, muster_lease_t *all) {
  size_t got = 0;
  for (int64_t deadline = now_ms() + 20000; got < LEASES && now_ms() < deadline;) {
    muster_lease_t *leases = NULL;
    size_t n = 0;
    CHECK_OK(c, muster_lease(c, QUEUE, 0, LEASES - got, 2000, &leases, &n));
    memcpy(all + got, leases, n * sizeof *leases);
    got += n;
    free(leases); /* the strings moved into `all` */
  }
  return got;
}

/* The seven inputs of `it` (at session indexes 1..7, after one input of an
 * iterator before it) end as: position 0 done, 1 to 5 failed in that order,
 * 6 failed for good; then a later iterator's task and another session's fail. */
static void end_tasks(muster_client_t *c, const char *sid, const char *other_sid) {
  muster_lease_t *leases = calloc(LEASES, sizeof *leases);
  size_t n = leases ? lease_all(c, leases) : 0;
  CHECK(n == LEASES);
  static const char *const errors[] = {"e-a", "e-b", "e-c", "e-a", "e-d"};
  end_one(c, leases, n, sid, 1, NULL, 0);
  for (int64_t pos = 1; pos <= 5; pos++)
    end_one(c, leases, n, sid, 1 + pos, errors[pos - 1], 0);
  end_one(c, leases, n, sid, 7, "e-permanent", 1);
  end_one(c, leases, n, sid, 8, "e-later-call", 0);
  end_one(c, leases, n, other_sid, 0, "e-other-session", 0);
  muster_leases_free(leases, n);
}

static void test_failing(muster_client_t *c) {
  muster_queue_opts_t qo;
  muster_queue_opts_init(&qo);
  qo.max_attempts = 100;
  qo.backoff_ms = qo.backoff_max_ms = 600000; /* failed tasks stay queued, not leased again */
  CHECK_OK(c, muster_queue_put(c, QUEUE, &qo, NULL));
  muster_pool_t *pool = open_pool(), *other = open_pool();
  const char *inputs[] = {"0", "1", "2", "3", "4", "5", "6"};
  muster_pool_iter_t *before = imap(pool, inputs, 1), *it = imap(pool, inputs, 7);
  muster_pool_iter_t *later = imap(pool, inputs, 1), *others = imap(other, inputs, 1);
  muster_pool_iter_t *empty = imap(pool, inputs, 0);
  expect_text(it, "", __LINE__);
  if (pool && other)
    end_tasks(c, muster_pool_session(pool), muster_pool_session(other));
  expect_text(it,
              "5 of this call's unfinished jobs failed at least once and wait to be tried again, "
              "the newest first: job 5 (attempt 1): e-d; job 4 (attempt 1): e-a; job 3 (attempt "
              "1): e-c (and 2 more: 1 with these errors, 1 with others)",
              __LINE__);
  expect_text(empty, "", __LINE__);
  char *text = (char *)"unset";
  CHECK(muster_pool_iter_failing(NULL, &text) == MUSTER_INVALID && text == NULL);
  CHECK(muster_pool_iter_failing(it, NULL) == MUSTER_INVALID);
  CHECK(contains(muster_pool_message(pool), "text: a place for the text is required"));
  muster_pool_iter_t *iters[] = {before, it, later, others, empty};
  for (size_t i = 0; i < sizeof iters / sizeof iters[0]; i++)
    muster_pool_iter_free(iters[i]);
  muster_pool_close(other);
  muster_pool_close(pool);
}

int main(int argc, char **argv) {
  if (!ctest_use_test_url(TOKEN)) {
    const char *const head_args[] = {"--server-only", NULL};
    if (ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-why-XXXXXX", TOKEN, head_args) !=
        0)
      return ctest_head_failed();
  }
  muster_client_t *client = connect_head(head_token);
  test_failing(client);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
