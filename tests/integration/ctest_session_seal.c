/*
 * ctest_session_seal.c — libmuster's sealed sessions against a real head:
 * muster_session_seal (and sealing again), a put refused once sealed, and
 * muster_session_results_sealed saying whether the session was sealed
 * with each page, which muster_session_results reads the same as before.
 *
 * Starts `$MUSTER_BIN head --server-only --listen 127.0.0.1:0` on a
 * temporary data dir (MUSTER_TEST_URL and MUSTER_TEST_TOKEN: a head you
 * started yourself); this program completes the session's task itself.
 * Ends with "N passed, M failed".
 */
#include "ctest_util.h"

#define TOKEN "ctest-token-0123456789"

/* Puts one task of payload `payload` into session `sid`; the client's error. */
static muster_err_t put_one(muster_client_t *c, const char *sid, const char *payload) {
  muster_task_spec_t spec;
  muster_task_spec_init(&spec);
  spec.payload = payload;
  return muster_session_put(c, sid, &spec, 1, NULL, NULL);
}

/* Leases the one task of `queue` and completes it with its payload. */
static void complete_one(muster_client_t *c, const char *queue) {
  muster_lease_t *leases = NULL;
  size_t n = 0;
  CHECK_OK(c, muster_lease(c, queue, 0, 1, 2000, &leases, &n));
  CHECK(n == 1);
  if (n == 1) {
    muster_ack_t ack;
    muster_ack_init(&ack, leases[0].task, leases[0].token);
    ack.result = leases[0].payload;
    CHECK_OK(c, muster_complete(c, &ack, 1));
  }
  muster_leases_free(leases, n);
}

/* Reads session `sid` from `cursor`; the page's count and *sealed. */
static size_t read_page(muster_client_t *c, const char *sid, int64_t cursor, int *sealed) {
  muster_results_t page;
  CHECK_OK(c, muster_session_results_sealed(c, sid, MUSTER_ORDER_SUBMISSION, cursor, 0, 0, &page,
                                            sealed));
  size_t count = page.count;
  muster_results_free(&page);
  return count;
}

static void test_seal(muster_client_t *c) {
  CHECK_OK(c, muster_queue_put(c, "seal", NULL, NULL));
  muster_session_opts_t so;
  muster_session_opts_init(&so);
  so.queue = "seal";
  char *sid = NULL;
  CHECK_OK(c, muster_session_create(c, &so, &sid, NULL));
  CHECK_OK(c, put_one(c, sid, "7"));
  int sealed = 9, already = 9;
  CHECK(read_page(c, sid, 0, &sealed) == 0 && sealed == 0);
  CHECK_OK(c, muster_session_seal(c, sid, &already));
  CHECK(already == 0);
  CHECK_OK(c, muster_session_seal(c, sid, &already));
  CHECK(already == 1);
  CHECK_ERR(c, put_one(c, sid, "8"), MUSTER_INVALID_STATE);
  CHECK(contains(muster_client_message(c), sid) &&
        contains(muster_client_message(c), "was sealed") &&
        contains(muster_client_message(c), "put these tasks into a new session"));
  complete_one(c, "seal");
  CHECK(read_page(c, sid, 0, &sealed) == 1 && sealed == 1);
  CHECK(read_page(c, sid, 1, NULL) == 0); /* sealed may be NULL */
  muster_results_t page;
  CHECK_OK(c, muster_session_results(c, sid, MUSTER_ORDER_SUBMISSION, 0, 0, 0, &page));
  CHECK(page.count == 1 && page.done == 1 && page.total == 1);
  muster_results_free(&page);
  CHECK_ERR(c, muster_session_seal(c, "s-0123456789abcdef", &already), MUSTER_SESSION_NOT_FOUND);
  CHECK(already == 0);
  CHECK_ERR(c, muster_session_seal(c, "", NULL), MUSTER_INVALID);
  muster_free(sid);
}

int main(int argc, char **argv) {
  if (!ctest_use_test_url(TOKEN)) {
    const char *const head_args[] = {"--server-only", NULL};
    if (ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-seal-XXXXXX", TOKEN, head_args) !=
        0)
      return ctest_head_failed();
  }
  muster_client_t *client = connect_head(head_token);
  test_seal(client);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
