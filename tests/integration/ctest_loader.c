/*
 * ctest_loader.c — a standalone libmuster loader (no head) after something
 * went wrong: a reset or a restore that is refused, a load callback that
 * fails.  Each check runs without and with a prefetch thread, since the
 * thread's buffer is what a failed reset or restore used to drop.
 *
 * A refused reset (after the last epoch) or restore (a position outside the
 * configuration) leaves the loader where the caller was: the rest of the
 * epoch comes next, as a loader that was never asked would give it.  A load
 * callback's failure is reported by next until the caller restores a
 * checkpoint, and reset refuses to pass over it; the checkpoint taken after
 * the failure resumes at the sample that failed.  A strategy without what it
 * needs (range: ranges, stratified: labels) is refused saying so, as are a
 * size, shard count, label or ranges out of range, a missing argument, and a
 * coordinated loader's URL that is not http(s)://.
 *
 * Ends with "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#include <inttypes.h>

#define SAMPLES 40
#define RANKS 3

static void config(muster_iter_config_t *cfg, uint64_t epochs) {
  muster_iter_config_init(cfg);
  cfg->num_samples = SAMPLES;
  cfg->shuffle = "global";
  cfg->seed = 11;
  cfg->world_size = RANKS;
  cfg->block_size = 2;
  cfg->epochs = epochs;
}

/* A load callback that fails for sample `fail_index` while `failing` is set. */
typedef struct {
  uint64_t fail_index;
  int failing;
} load_state_t;

static int load_sample(void *user, uint64_t index, void **sample) {
  load_state_t *state = user;
  if (state->failing && index == state->fail_index)
    return 1;
  *sample = NULL; /* nothing to hand over: the index is the sample */
  return 0;
}

static muster_loader_t *open_loader(const muster_iter_config_t *cfg, size_t prefetch,
                                    load_state_t *state) {
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = cfg;
  opts.rank = 1;
  opts.prefetch = prefetch;
  if (state) {
    opts.load = load_sample;
    opts.user = state;
  }
  return ctest_loader_open(&opts);
}

/* The rank's indices of the first epoch, from a loader nothing happened to. */
static size_t reference(const muster_iter_config_t *cfg, uint64_t *out) {
  muster_loader_t *l = open_loader(cfg, 0, NULL);
  size_t n = l ? ctest_loader_drain(l, out, SAMPLES) : 0;
  muster_loader_close(l);
  return n;
}

/* The rest of the epoch after a refused reset (the last epoch) is what it was. */
static void test_refused_reset_keeps_the_epoch(size_t prefetch) {
  muster_iter_config_t cfg;
  config(&cfg, 1);
  uint64_t want[SAMPLES] = {0}, got[SAMPLES], first;
  size_t n = reference(&cfg, want);
  muster_loader_t *l = open_loader(&cfg, prefetch, NULL);
  CHECK(l != NULL && n > 3);
  if (l == NULL)
    return;
  CHECK(ctest_loader_drain(l, &first, 1) == 1 && first == want[0]);
  CHECK_ERR(NULL, muster_loader_reset(l), MUSTER_INVALID);
  CHECK(contains(muster_loader_message(l), "every epoch is done"));
  size_t rest = ctest_loader_drain(l, got, SAMPLES);
  CHECK(rest == n - 1 && memcmp(got, want + 1, rest * sizeof *got) == 0);
  muster_loader_close(l);
}

/* A restore refused for its position leaves the loader where it was. */
static void test_refused_restore_keeps_the_position(size_t prefetch) {
  muster_iter_config_t cfg;
  config(&cfg, 2);
  uint64_t want[SAMPLES] = {0}, got[SAMPLES];
  size_t n = reference(&cfg, want);
  muster_loader_t *l = open_loader(&cfg, prefetch, NULL);
  CHECK(l != NULL && n > 3);
  if (l == NULL)
    return;
  CHECK(ctest_loader_drain(l, got, 2) == 2);
  char *ck = NULL, bad[512];
  CHECK_ERR(NULL, muster_loader_get_checkpoint(l, &ck), MUSTER_OK);
  char *consumed = ck ? strstr(ck, "\"consumed\":") : NULL;
  CHECK(consumed != NULL);
  if (consumed == NULL) {
    muster_free(ck);
    muster_loader_close(l);
    return;
  }
  snprintf(bad, sizeof bad, "%.*s\"consumed\":999999}", (int)(consumed - ck), ck);
  CHECK_ERR(NULL, muster_loader_restore(l, bad), MUSTER_INVALID);
  CHECK(contains(muster_loader_message(l), "outside this configuration"));
  size_t rest = ctest_loader_drain(l, got, SAMPLES);
  CHECK(rest == n - 2 && memcmp(got, want + 2, rest * sizeof *got) == 0);
  muster_free(ck);
  muster_loader_close(l);
}

/* A failing load: next keeps failing, reset refuses, a restore of the
 * checkpoint taken then resumes at the sample that failed. */
static void test_load_failure_stays(size_t prefetch) {
  muster_iter_config_t cfg;
  config(&cfg, 2);
  uint64_t want[SAMPLES] = {0}, got[SAMPLES], index;
  size_t n = reference(&cfg, want);
  load_state_t state = {.fail_index = want[3], .failing = 1};
  muster_loader_t *l = open_loader(&cfg, prefetch, &state);
  CHECK(l != NULL && n > 3);
  if (l == NULL)
    return;
  CHECK(ctest_loader_drain(l, got, SAMPLES) == 3);
  int has = 1;
  for (int call = 0; call < 2; call++) {
    CHECK_ERR(NULL, muster_loader_next(l, &index, NULL, &has), MUSTER_INVALID);
    CHECK(has == 0 && contains(muster_loader_message(l), "load callback failed"));
  }
  CHECK_ERR(NULL, muster_loader_reset(l), MUSTER_INVALID);
  CHECK(contains(muster_loader_message(l), "load callback failed"));
  char *ck = NULL;
  CHECK_ERR(NULL, muster_loader_get_checkpoint(l, &ck), MUSTER_OK);
  state.failing = 0;
  CHECK_ERR(NULL, muster_loader_restore(l, ck), MUSTER_OK);
  CHECK(strcmp(muster_loader_message(l), "") == 0); /* the failure is over */
  size_t rest = ctest_loader_drain(l, got, SAMPLES);
  CHECK(rest == n - 3 && memcmp(got, want + 3, rest * sizeof *got) == 0);
  CHECK_ERR(NULL, muster_loader_reset(l), MUSTER_OK); /* the epoch ended: on to the next */
  muster_free(ck);
  muster_loader_close(l);
}

/* Opens with `cfg`; MUSTER_INVALID with a message containing `want`. */
static void check_refused(const muster_iter_config_t *cfg, const char *want, int line) {
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = cfg;
  muster_loader_t *l = NULL;
  char *message = NULL, what[200];
  muster_err_t err = muster_loader_open(&opts, &l, &message);
  snprintf(what, sizeof what, "refused, saying '%s' (said: %s)", want, message ? message : "");
  check(err == MUSTER_INVALID && l == NULL && contains(message, want), what, line);
  muster_free(message);
  muster_loader_close(l);
}

/* A strategy without what it needs (or with what only another takes) is
 * refused with the head's words, not "the configuration is invalid". */
static void test_strategy_inputs(void) {
  muster_iter_config_t cfg;
  config(&cfg, 1);
  const uint64_t ranges[2 * RANKS] = {0, 10, 10, 20, 20, SAMPLES};
  cfg.strategy = "range";
  check_refused(&cfg, "ranges: the range strategy needs world_size (3) pairs", __LINE__);
  cfg.strategy = "stratified";
  check_refused(&cfg, "stratified needs a class label per sample", __LINE__);
  cfg.strategy = "round_robin";
  cfg.ranges = ranges;
  check_refused(&cfg, "only the range strategy takes ranges", __LINE__);
  cfg.strategy = "range";
  muster_loader_t *l = open_loader(&cfg, 0, NULL);
  CHECK(l != NULL && muster_loader_len(l) == 10);
  muster_loader_close(l);
}

/* Sizes, shards, labels and ranges the core refuses are refused with the
 * head's words for the same field (test_iter_api and test_api_badinput have
 * the head's), not "dataset: invalid shape or labels" or "the configuration
 * is invalid". */
static void test_out_of_range(void) {
  muster_iter_config_t cfg;
  config(&cfg, 1);
  cfg.num_samples = (UINT64_C(1) << 48) + 1;
  check_refused(&cfg,
                "dataset.num_samples: 281474976710657 is out of range; it must be from "
                "0 to 281474976710656",
                __LINE__);
  config(&cfg, 1);
  const uint64_t counts[2] = {UINT64_C(1) << 48, 1};
  cfg.num_shards = 2;
  cfg.shard_counts = counts;
  check_refused(&cfg, "dataset.shards: more than 2^48 samples in all", __LINE__);
  cfg.shard_counts = NULL;
  check_refused(&cfg, "dataset.shards: num_shards is 2, and shard_counts is NULL", __LINE__);
  config(&cfg, 1);
  uint32_t labels[SAMPLES] = {0};
  labels[7] = 1u << 20;
  cfg.labels = labels;
  cfg.strategy = "stratified";
  check_refused(&cfg, "dataset.labels[7]: expected an integer in [0, 1048576)", __LINE__);
  config(&cfg, 1);
  cfg.world_size = 65537;
  check_refused(&cfg, "world_size: 65537 is out of range; it must be from 1 to 65536", __LINE__);
  config(&cfg, 1);
  cfg.block_size = (UINT64_C(1) << 48) + 1;
  check_refused(&cfg, "block_size: 281474976710657 is out of range", __LINE__);
  config(&cfg, 1);
  cfg.shuffle_block_size = 0;
  check_refused(&cfg, "shuffle_block_size: 0 is out of range; it must be from 1 to", __LINE__);
  config(&cfg, 1);
  cfg.strategy = "range";
  const uint64_t gap[2 * RANKS] = {0, 10, 11, 20, 20, SAMPLES};
  cfg.ranges = gap;
  check_refused(&cfg, "ranges: the non-empty ranges must tile [0, N) exactly", __LINE__);
  const uint64_t backwards[2 * RANKS] = {0, 10, 20, 10, 20, SAMPLES};
  cfg.ranges = backwards;
  check_refused(&cfg, "ranges[1]: expected [begin, end) with 0 <= begin <= end", __LINE__);
}

/* MUSTER_INVALID from a loader call, with muster_loader_message containing
 * `want` (it used to be left empty for a missing argument). */
static void check_said(muster_loader_t *l, muster_err_t err, const char *want, int line) {
  char what[200];
  snprintf(what, sizeof what, "MUSTER_INVALID saying '%s' (got %s, said: %s)", want,
           muster_err_name(err), muster_loader_message(l));
  check(err == MUSTER_INVALID && contains(muster_loader_message(l), want), what, line);
}

#define CHECK_SAID(l, call, want) check_said((l), (call), (want), __LINE__)

/* A NULL where a call writes its answer is refused with a message naming the
 * argument, kept where the loader keeps its messages; and the opens say why. */
static void test_missing_places(void) {
  muster_iter_config_t cfg;
  config(&cfg, 1);
  muster_loader_t *l = open_loader(&cfg, 0, NULL);
  uint64_t index = 0;
  int has = 0;
  size_t got = 0;
  CHECK_SAID(l, muster_loader_next(l, NULL, NULL, &has), "index: a place for");
  CHECK_SAID(l, muster_loader_next(l, &index, NULL, NULL), "has: a place for");
  CHECK_SAID(l, muster_loader_next_batch(l, NULL, NULL, 4, &got), "indices: a place for up to 4");
  CHECK_SAID(l, muster_loader_next_batch(l, &index, NULL, 1, NULL), "got: a place for");
  CHECK_SAID(l, muster_loader_get_checkpoint(l, NULL), "text: a place for the checkpoint");
  CHECK_SAID(l, muster_loader_restore(l, NULL), "text: the checkpoint to restore");
  CHECK_OK(NULL, muster_loader_next(l, &index, NULL, &has)); /* nothing was taken */
  CHECK(has == 1);
  CHECK(strcmp(muster_loader_message(l), "") == 0); /* "" after a success, as a client's */
  muster_loader_close(l);

  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = &cfg;
  char *message = NULL;
  CHECK_ERR(NULL, muster_loader_open(&opts, NULL, &message), MUSTER_INVALID);
  CHECK(contains(message, "out: a place for the loader is required"));
  muster_free(message);
  CHECK_ERR(NULL, muster_loader_open(NULL, &l, &message), MUSTER_INVALID);
  CHECK(l == NULL && contains(message, "opts: the loader's options are required"));
  muster_free(message);
  /* A coordinated loader's URL is checked as muster_client_new checks it. */
  opts.url = "ftp://127.0.0.1:7370";
  opts.name = "ct-loader";
  opts.head_wait_ms = 0;
  CHECK_ERR(NULL, muster_loader_open(&opts, &l, &message), MUSTER_INVALID);
  CHECK(contains(message, "url 'ftp://127.0.0.1:7370': expected http://HOST[:PORT]"));
  muster_free(message);
}

/* A restore of a text that is not JSON says so, and where the parser stopped,
 * as every JSON refusal of the library does; JSON that is not a standalone
 * checkpoint is told apart from it.  Either leaves the loader where it was. */
static void test_restore_says_what_is_wrong(void) {
  muster_iter_config_t cfg;
  config(&cfg, 2);
  uint64_t want[SAMPLES] = {0}, got[SAMPLES];
  size_t n = reference(&cfg, want);
  muster_loader_t *l = open_loader(&cfg, 0, NULL);
  CHECK(l != NULL && n > 1);
  if (l == NULL)
    return;
  CHECK(ctest_loader_drain(l, got, 1) == 1);
  CHECK_SAID(l, muster_loader_restore(l, "not json"), "text: not valid JSON: ");
  CHECK(contains(muster_loader_message(l), "(at column ") &&
        !contains(muster_loader_message(l), "not a standalone loader checkpoint"));
  CHECK_SAID(l, muster_loader_restore(l, "{\"mode\": \"stand"), "text: not valid JSON: ");
  CHECK_SAID(l, muster_loader_restore(l, ""), "text: not valid JSON: ");
  CHECK_SAID(l, muster_loader_restore(l, "[1, 2]"), "text: not a standalone loader checkpoint");
  CHECK_SAID(l, muster_loader_restore(l, "{\"mode\": \"coordinated\"}"),
             "text: not a standalone loader checkpoint");
  size_t rest = ctest_loader_drain(l, got, SAMPLES);
  CHECK(rest == n - 1 && memcmp(got, want + 1, rest * sizeof *got) == 0);
  muster_loader_close(l);
}

int main(void) {
  for (size_t prefetch = 0; prefetch <= 4; prefetch += 4) {
    test_refused_reset_keeps_the_epoch(prefetch);
    test_refused_restore_keeps_the_position(prefetch);
    test_load_failure_stays(prefetch);
  }
  test_strategy_inputs();
  test_out_of_range();
  test_missing_places();
  test_restore_says_what_is_wrong();
  return ctest_report();
}
