/*
 * iter_internal.h — what iter.c, iter_config.c, iter_layout.c, iter_lease.c
 * and iter_status.c share: the parsed configuration (spec), the stored row,
 * the in-memory plan cache and the block layout of an epoch.
 *
 * Units.  The head leases *blocks*.  In an epoch every block has a number g
 * in [0, units).  For `dynamic`, block g is epoch positions [gB, (g+1)B) and
 * anyone may lease it.  For the static strategies block g is block j of plan
 * rank q's stream, g = prefix[q] + j, and it sits in q's *lane*.  A lane is
 * the sequence of blocks a rank leases in order: lane q of a static plan is
 * q's own blocks; `dynamic` has one lane.  After an elastic resume with
 * another world size (static strategies), the resumed epoch keeps the old
 * plan's blocks but deals them to the new ranks: lane r holds the blocks
 * g = r, r + W, r + 2W, ... (a "dealt" layout).  Blocks already done by the
 * checkpoint (`legacy done` ranges) are skipped.
 */
#ifndef MUSTER_SERVER_ITER_INTERNAL_H
#define MUSTER_SERVER_ITER_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/dataset.h"
#include "core/names.h"
#include "core/partition.h"
#include "core/stream.h"
#include "fail.h"
#include "jw.h"
#include "store.h"

/* A validated configuration: the dataset shape and the partition config. */
typedef struct {
  dataset_t *ds;        /* owned */
  part_config_t cfg;    /* cfg.ranges points at `ranges` */
  part_range_t *ranges; /* owned; range strategy only */
  json_t *canon;        /* canonical configuration object (owned) */
} iter_spec_t;

/* Parses the configuration fields of `obj` (others are the caller's to
 * check).  On success fills *spec (free with iter_spec_free). */
muster_err_t iter_spec_parse(const json_t *obj, iter_spec_t *spec, fail_t *f);
void iter_spec_free(iter_spec_t *spec);
/* The configuration keys iter_spec_parse reads (NULL-terminated). */
extern const char *const iter_config_keys[];
/* Canonical text of a configuration object (sorted keys, compact); caller frees. */
char *iter_canon_text(const json_t *canon);

/* Settings that are not part of the index order. */
typedef struct {
  int64_t lease_ms;
  int64_t rank_timeout_ms;
  int64_t replication;
  double slow_ratio;
  bool cluster_sync;
} iter_settings_t;

/* Rank states as stored. */
enum { ITER_RANK_UNKNOWN = 0, ITER_RANK_ALIVE = 1, ITER_RANK_FAILED = 2 };
/* Block states as stored.  FINAL is a done block of a completed epoch that
 * the acknowledgement which completed it named (iter_lease.c answers that
 * one's retry as it was answered); the current epoch has none. */
enum { ITER_BLOCK_PENDING = 0, ITER_BLOCK_LEASED = 1, ITER_BLOCK_DONE = 2, ITER_BLOCK_FINAL = 3 };

/* An iterations row. */
typedef struct {
  int64_t id;
  char name[NAME_MAX_LEN + 1];
  char *config; /* canonical configuration text (owned) */
  char *origin; /* canonical checkpoint position it was created from, or NULL (owned) */
  iter_settings_t set;
  int64_t epoch;       /* current epoch */
  int64_t done_blocks; /* blocks of the current epoch done */
  bool finished;
  int64_t resume_epoch; /* epoch laid out by the checkpoint's plan, or -1 */
  int64_t resume_world; /* that plan's world size */
  char *resume_done;    /* its done ranges as JSON text (owned), or NULL */
  int64_t created_ms;
} iter_row_t;

muster_err_t iter_row_load(store_t *st, const char *name, iter_row_t *row, fail_t *f);
void iter_row_free(iter_row_t *row);
/* Writes the row's progress (epoch, done blocks, finished, resume) back. */
muster_err_t iter_row_save(store_t *st, const iter_row_t *row, fail_t *f);
/* Marks `rank` alive now and pushes its heartbeat deadline. */
muster_err_t iter_rank_touch(store_t *st, const iter_row_t *row, int64_t rank, fail_t *f);
/* The iteration object (status), with per-rank health when `with_ranks`. */
json_t *iter_to_json(store_t *st, iter_row_t *row, bool with_ranks, fail_t *f);

/* Cached plans of one iteration, rebuilt from its configuration text. */
typedef struct iter_plans {
  int64_t id;
  uint64_t text_hash; /* of config + resume text: a changed row misses */
  iter_spec_t spec;   /* the iteration's configuration */
  part_plan_t *plan;  /* world size W */
  uint64_t *prefix;   /* static: W + 1 prefix sums of rank blocks */
  part_plan_t *plan0; /* resume: the checkpoint's plan (world W0), or NULL */
  uint64_t *prefix0;
  part_range_t *done0; /* resume: legacy done ranges, sorted */
  size_t ndone0;
  uint64_t done0_units; /* blocks they cover */
  part_epoch_t *ep;     /* dynamic indices: a cached epoch order (of plan_of_ep) */
  const part_plan_t *ep_plan;
  stream_t **streams; /* static indices: a stream per plan rank (of streams_plan) */
  const part_plan_t *streams_plan;
  uint64_t last_used;
} iter_plans_t;

/* The plans of `row` from the cache (built when missing).  Borrowed: valid
 * until the next call. */
muster_err_t iter_plans_get(const iter_row_t *row, iter_plans_t **out, fail_t *f);
/* Forgets a deleted iteration. */
void iter_plans_forget(int64_t id);

/* The block layout of the current epoch of an iteration. */
typedef struct {
  const part_plan_t *plan; /* the plan the blocks come from */
  const uint64_t *prefix;  /* its prefix sums (static) */
  bool dynamic;
  bool dealt;     /* static blocks of an old plan dealt to W ranks */
  uint32_t world; /* ranks of the iteration */
  uint32_t lanes;
  uint64_t units;           /* blocks in the epoch */
  const part_range_t *done; /* legacy done ranges, or NULL */
  size_t ndone;
  uint64_t done_units;
} iter_layout_t;

void iter_layout_of(const iter_row_t *row, iter_plans_t *plans, iter_layout_t *lay);
/* Units of a plan as a layout without legacy ranges would count them. */
uint64_t iter_plan_units(const part_plan_t *plan, const uint64_t *prefix);
/* W + 1 prefix sums of part_rank_blocks (NULL for dynamic or no memory). */
uint64_t *iter_plan_prefix(const part_plan_t *plan);
uint64_t iter_lane_blocks(const iter_layout_t *lay, uint32_t lane);
uint64_t iter_lane_unit(const iter_layout_t *lay, uint32_t lane, uint64_t k);
/* The first k' >= k of the lane whose block is not legacy done. */
uint64_t iter_lane_skip(const iter_layout_t *lay, uint32_t lane, uint64_t k);
/* Block g's samples: items [begin, end) of plan rank *plan_rank's stream, or
 * epoch positions [begin, end) with *plan_rank -1 (dynamic). */
void iter_unit_desc(const iter_layout_t *lay, uint64_t g, int64_t *plan_rank, uint64_t *begin,
                    uint64_t *end);
/* Appends the sample indices of block g of `epoch` to `out` as a JSON array
 * ("[812,13,...]", the text jw_dump writes for an array of those integers):
 * a reply of 2^20 indices is never a tree of 2^20 json_t.  On failure
 * (MUSTER_NOMEM, MUSTER_INTERNAL) `out` holds a partial array; the caller
 * drops the reply. */
muster_err_t iter_unit_indices(iter_plans_t *plans, const iter_layout_t *lay, uint64_t epoch,
                               uint64_t g, jw_buf_t *out, fail_t *f);

/* A leased block as a reply lists it. */
typedef struct {
  uint64_t block;      /* g, the block's number in the epoch */
  int64_t token;       /* its lease's fencing token */
  int64_t deadline_ms; /* when the lease ends */
  bool takeover;       /* leased from another rank's lane */
} iter_block_t;

/* Appends block `b` of `epoch` to `out` as the object a `next` reply lists
 * (docs/api.md): {"block", "token", "deadline_ms", "rank", "begin", "end",
 * "takeover"[, "indices"]}, the bytes jw_dump writes for it built as a tree;
 * `indices` adds its sample indices (iter_unit_indices).  MUSTER_OK, or as
 * iter_unit_indices fails, or MUSTER_NOMEM; the caller drops the reply. */
muster_err_t iter_block_write(iter_plans_t *plans, const iter_layout_t *lay, uint64_t epoch,
                              const iter_block_t *b, bool indices, jw_buf_t *out, fail_t *f);

/* Parses a sorted list of disjoint [a, b) ranges within [0, units) from JSON. */
muster_err_t iter_ranges_parse(const json_t *list, uint64_t units, const char *ctx,
                               part_range_t **out, size_t *n, uint64_t *covered, fail_t *f);

/* Moves to the next epoch when the current one is complete. */
muster_err_t iter_settle(store_t *st, iter_row_t *row, fail_t *f);

/* The node whose agent keeps this process's iterations ("" on the head;
 * iter_set_node). */
const char *iter_node_name(void);

/* Writes a plan fingerprint as the 16 hex digits checkpoints carry. */
void iter_fingerprint_hex(uint64_t fp, char out[17]);

#endif
