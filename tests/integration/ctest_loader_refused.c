/*
 * ctest_loader_refused.c — a standalone libmuster loader (no head) given the
 * checkpoint of another world size or rank, as a user moving a job to another
 * number of GPUs does.  A standalone checkpoint is one rank's place in one
 * plan's list, so it is refused; the message says which of the two differs
 * (a world size shows as another configuration, its fingerprint covering the
 * world size) and, for another configuration, where a resume on another
 * number of ranks lives.  The refused loader is where it was: its own first
 * sample comes next.  The same world size and rank resume exactly.
 *
 * Ends with "N passed, M failed"; exits 1 when M > 0.
 */
#include "ctest_util.h"

#define SAMPLES 30

static muster_loader_t *open_rank(muster_iter_config_t *cfg, uint32_t world, uint32_t rank) {
  muster_iter_config_init(cfg);
  cfg->num_samples = SAMPLES;
  cfg->shuffle = "global";
  cfg->seed = 5;
  cfg->world_size = world;
  cfg->block_size = 2;
  muster_loader_opts_t opts;
  muster_loader_opts_init(&opts);
  opts.config = cfg;
  opts.rank = rank;
  muster_loader_t *l = NULL;
  CHECK_OK(NULL, muster_loader_open(&opts, &l, NULL));
  return l;
}

/* The next index of `l` (UINT64_MAX at the end of the epoch). */
static uint64_t next_index(muster_loader_t *l) {
  uint64_t index = UINT64_MAX;
  void *sample = NULL;
  int has = 0;
  CHECK_OK(NULL, muster_loader_next(l, &index, &sample, &has));
  return has ? index : UINT64_MAX;
}

/* Rank 1 of 4 reads 5 samples; returns its checkpoint and, in after[0], the
 * sample that follows them. */
static char *checkpoint_after_five(uint64_t *after) {
  muster_iter_config_t cfg;
  muster_loader_t *l = open_rank(&cfg, 4, 1);
  for (int i = 0; i < 5; i++)
    next_index(l);
  char *text = NULL;
  CHECK_OK(NULL, muster_loader_get_checkpoint(l, &text));
  *after = next_index(l);
  muster_loader_close(l);
  return text;
}

/* Another world size, and another rank: refused saying which, loader unmoved. */
static void test_refused_with_the_reason(const char *ck, uint32_t world, uint32_t rank,
                                         const char *why, const char *where) {
  muster_iter_config_t cfg, fresh_cfg;
  muster_loader_t *l = open_rank(&cfg, world, rank);
  muster_loader_t *fresh = open_rank(&fresh_cfg, world, rank);
  CHECK_ERR(NULL, muster_loader_restore(l, ck), MUSTER_INVALID);
  CHECK(contains(muster_loader_message(l), why));
  CHECK(contains(muster_loader_message(l), where));
  CHECK(next_index(l) == next_index(fresh));
  muster_loader_close(fresh);
  muster_loader_close(l);
}

static void test_same_world_and_rank_resume(const char *ck, uint64_t after) {
  muster_iter_config_t cfg;
  muster_loader_t *l = open_rank(&cfg, 4, 1);
  CHECK_OK(NULL, muster_loader_restore(l, ck));
  CHECK(next_index(l) == after);
  muster_loader_close(l);
}

int main(void) {
  uint64_t after = 0;
  char *ck = checkpoint_after_five(&after);
  CHECK(ck != NULL && after != UINT64_MAX);
  test_refused_with_the_reason(ck, 3, 1, "world size", "opts.checkpoint");
  test_refused_with_the_reason(ck, 2, 0, "another configuration", "Elastic resume");
  test_refused_with_the_reason(ck, 4, 2, "the checkpoint is rank 1's, and this loader is rank 2",
                               "resumes the rank that saved it");
  test_same_world_and_rank_resume(ck, after);
  muster_free(ck);
  return ctest_report();
}
