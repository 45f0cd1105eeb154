/*
 * ctest_worker_beat.c — muster_worker_beat_t, a worker's heartbeat from a
 * thread of its own (docs/client.md, "Writing a worker in C"), against a real
 * head: the arguments refused before anything is sent, a worker that is gone
 * refused at start in the head's words, the progress its beats carry, and
 * muster_worker_beat_last telling once the head has declared the worker gone.
 * examples/c/worker.c, run by test_c_worker_example.py, shows a worker kept
 * alive by it through tasks longer than its timeout.
 *
 * Starts `$MUSTER_BIN head --server-only --listen 127.0.0.1:0` on a
 * temporary data dir (MUSTER_TEST_URL and MUSTER_TEST_TOKEN: a head you
 * started yourself).  Ends with "N passed, M failed".
 */
#include "ctest_util.h"

#define TOKEN "ctest-token-0123456789"

/* Registers a worker with heartbeat timeout `timeout_ms`; its id. */
static int64_t register_worker(muster_client_t *c, int64_t timeout_ms) {
  muster_worker_opts_t opts;
  muster_worker_opts_init(&opts);
  opts.timeout_ms = timeout_ms;
  int64_t id = 0;
  CHECK_OK(c, muster_worker_register(c, &opts, &id, NULL));
  return id;
}

/* Non-zero once worker `id`'s object on the head contains `text`, within 10 s. */
static int worker_says(muster_client_t *c, int64_t id, const char *text) {
  char path[64], *json = NULL;
  snprintf(path, sizeof path, "/v1/workers/%lld", (long long)id);
  for (int64_t until = now_ms() + 10000; now_ms() < until;) {
    int found = muster_request(c, "GET", path, NULL, &json) == MUSTER_OK && contains(json, text);
    muster_free(json);
    if (found)
      return 1;
    struct timespec pause = {.tv_nsec = 20 * 1000000L};
    nanosleep(&pause, NULL);
  }
  return 0;
}

static void test_refused(muster_client_t *c) {
  muster_worker_beat_t *beat = (muster_worker_beat_t *)c;
  int64_t id = register_worker(c, 60000);
  CHECK(muster_worker_beat_start(NULL, id, -1, &beat) == MUSTER_INVALID && beat == NULL);
  CHECK_ERR(c, muster_worker_beat_start(c, id, -1, NULL), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "out: a place for the heartbeat"));
  CHECK_ERR(c, muster_worker_beat_start(c, 0, -1, &beat), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "id: 0, expected a registered worker's id"));
  CHECK_ERR(c, muster_worker_beat_start(c, id, 0, &beat), MUSTER_INVALID);
  CHECK_ERR(c, muster_worker_beat_start(c, id, -2, &beat), MUSTER_INVALID);
  CHECK(contains(muster_client_message(c), "period_ms: -2, expected 1 or more milliseconds"));
  CHECK_OK(c, muster_worker_bye(c, id));
  CHECK_ERR(c, muster_worker_beat_start(c, id, -1, &beat), MUSTER_WORKER_NOT_FOUND);
  CHECK(beat == NULL && contains(muster_client_message(c), "is gone"));
  CHECK(muster_worker_beat_progress(NULL, "x") == MUSTER_INVALID);
  CHECK(muster_worker_beat_last(NULL, NULL, 0) == MUSTER_INVALID);
  muster_worker_beat_stop(NULL);
}

/* A beat every 50 ms carries the progress; once the worker said goodbye
 * behind its back, the beats say it is gone. */
static void test_beats(muster_client_t *c) {
  int64_t id = register_worker(c, 60000);
  muster_worker_beat_t *beat = NULL;
  CHECK_OK(c, muster_worker_beat_start(c, id, 50, &beat));
  if (beat == NULL)
    return;
  CHECK(strcmp(muster_client_message(c), "") == 0);
  char message[256];
  CHECK(muster_worker_beat_last(beat, message, sizeof message) == MUSTER_OK);
  CHECK(muster_worker_beat_progress(beat, "\xff not UTF-8") == MUSTER_INVALID);
  CHECK(muster_worker_beat_progress(beat, "task 17") == MUSTER_OK);
  CHECK(worker_says(c, id, "\"progress\":\"task 17\""));
  CHECK_OK(c, muster_worker_bye(c, id));
  muster_err_t last = MUSTER_OK;
  for (int64_t until = now_ms() + 10000; last == MUSTER_OK && now_ms() < until;) {
    last = muster_worker_beat_last(beat, message, sizeof message);
    struct timespec pause = {.tv_nsec = 20 * 1000000L};
    nanosleep(&pause, NULL);
  }
  CHECK(last == MUSTER_WORKER_NOT_FOUND && contains(message, "is gone"));
  muster_worker_beat_stop(beat);
}

/* A period of -1 is a third of the worker's timeout: a worker whose timeout
 * is 600 ms stays active over five of them, beaten by the thread alone. */
static void test_third_of_the_timeout(muster_client_t *c) {
  int64_t id = register_worker(c, 600);
  muster_worker_beat_t *beat = NULL;
  CHECK_OK(c, muster_worker_beat_start(c, id, -1, &beat));
  for (int64_t until = now_ms() + 3000; now_ms() < until;) {
    struct timespec pause = {.tv_nsec = 100 * 1000000L};
    nanosleep(&pause, NULL);
  }
  CHECK(muster_worker_beat_last(beat, NULL, 0) == MUSTER_OK);
  CHECK(worker_says(c, id, "\"state\":\"active\""));
  muster_worker_beat_stop(beat);
  CHECK_OK(c, muster_worker_bye(c, id));
}

int main(int argc, char **argv) {
  if (!ctest_use_test_url(TOKEN)) {
    const char *const head_args[] = {"--server-only", NULL};
    if (ctest_head_start(muster_bin(argv[0]), "/tmp/muster-ctest-beat-XXXXXX", TOKEN, head_args) !=
        0)
      return ctest_head_failed();
  }
  muster_client_t *client = connect_head(head_token);
  test_refused(client);
  test_beats(client);
  test_third_of_the_timeout(client);
  muster_client_free(client);
  ctest_head_stop();
  return ctest_report();
}
