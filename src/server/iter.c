/*
 * iter.c — iterations as rows: create or join, status with per-rank health,
 * checkpoints, resume from a checkpoint (also with another world size),
 * delete, and the epoch roll-over.  Status and checkpoints are in
 * iter_status.c, leasing and acknowledging blocks in iter_lease.c, plans and
 * layouts in iter_layout.c.
 *
 * Tables (store_schema.c, migration 2): `iterations` (one row each: configuration,
 * settings, current epoch, blocks done in it, resume state), `iter_ranks`
 * (world_size rows: state, heartbeat deadline, counters), `iter_blocks`
 * (per epoch, the blocks that were ever leased: pending, leased or done) and
 * `iter_lanes` (per lane, the next never-leased block).  The lanes of an
 * epoch are deleted when it completes; its block rows stay where they are,
 * every one done with the token that acknowledged it, until the next epoch
 * completes (schema version 15), so that a retry of any acknowledgement of
 * the last completed epoch is answered as a repeat (iter_lease.c).  So the
 * state is O(blocks handed out in the current and the last epoch), never
 * O(N) beyond that, and an epoch's completion deletes the rows of the one
 * before it, as many as it deleted of its own before, and copies nothing.
 */
#include "iter.h"
#include "iter_internal.h"
#include "jv.h"
#include "log.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEEK_MS (7LL * 24 * 3600 * 1000)

/* ---- rows ------------------------------------------------------------------ */

void iter_row_free(iter_row_t *row) {
  free(row->config);
  free(row->origin);
  free(row->resume_done);
  row->config = row->origin = row->resume_done = NULL;
}

muster_err_t iter_row_load(store_t *st, const char *name, iter_row_t *row, fail_t *f) {
  memset(row, 0, sizeof *row);
  sqlite3_stmt *s = store_stmt(
      st, "SELECT id, config, origin, lease_ms, rank_timeout_ms, replication, slow_ratio,"
          " cluster_sync, epoch, done_blocks, finished, coalesce(resume_epoch, -1),"
          " coalesce(resume_world, 0), resume_done, created_ms FROM iterations WHERE name = ?1");
  if (s == NULL)
    return store_fail(st, f, "iteration lookup");
  store_bind_text(s, 1, name);
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    row->id = sqlite3_column_int64(s, 0);
    snprintf(row->name, sizeof row->name, "%s", name);
    row->config = store_column_dup(s, 1);
    row->origin = store_column_dup(s, 2);
    row->set.lease_ms = sqlite3_column_int64(s, 3);
    row->set.rank_timeout_ms = sqlite3_column_int64(s, 4);
    row->set.replication = sqlite3_column_int64(s, 5);
    row->set.slow_ratio = sqlite3_column_double(s, 6);
    row->set.cluster_sync = sqlite3_column_int(s, 7) != 0;
    row->epoch = sqlite3_column_int64(s, 8);
    row->done_blocks = sqlite3_column_int64(s, 9);
    row->finished = sqlite3_column_int(s, 10) != 0;
    row->resume_epoch = sqlite3_column_int64(s, 11);
    row->resume_world = sqlite3_column_int64(s, 12);
    row->resume_done = store_column_dup(s, 13);
    row->created_ms = sqlite3_column_int64(s, 14);
  }
  store_reset(s);
  if (rc == SQLITE_DONE)
    return fail_set(f, MUSTER_ITERATION_NOT_FOUND, "iteration '%s' does not exist", name);
  if (rc != SQLITE_ROW || row->config == NULL)
    return store_fail(st, f, "iteration lookup");
  return MUSTER_OK;
}

/* Writes the row's progress fields back. */
muster_err_t iter_row_save(store_t *st, const iter_row_t *row, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE iterations SET epoch = ?2, done_blocks = ?3,"
                                   " finished = ?4, resume_epoch = ?5, resume_done = ?6,"
                                   " updated_ms = ?7 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "iteration update");
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, row->epoch);
  sqlite3_bind_int64(s, 3, row->done_blocks);
  sqlite3_bind_int(s, 4, row->finished);
  if (row->resume_epoch >= 0)
    sqlite3_bind_int64(s, 5, row->resume_epoch);
  store_bind_text(s, 6, row->resume_done);
  sqlite3_bind_int64(s, 7, now_ms());
  return store_step_done(st, s, f);
}

/* Deletes the iteration's rows of `sql` (one parameter: the id). */
static muster_err_t delete_rows(store_t *st, const char *sql, int64_t id, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "iteration cleanup");
  sqlite3_bind_int64(s, 1, id);
  return store_step_done(st, s, f);
}

/* Epoch `epoch` completes: deletes its lanes and the block rows of the
 * epochs before it (the last completed one), keeping its own. */
static muster_err_t clear_epoch(store_t *st, int64_t id, int64_t epoch, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM iter_blocks WHERE iter = ?1 AND epoch < ?2");
  if (s == NULL)
    return store_fail(st, f, "iteration cleanup");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, epoch);
  if (store_step_done(st, s, f))
    return f->code;
  return delete_rows(st, "DELETE FROM iter_lanes WHERE iter = ?1", id, f);
}

muster_err_t iter_settle(store_t *st, iter_row_t *row, fail_t *f) {
  bool changed = false;
  for (;;) {
    iter_plans_t *p;
    iter_layout_t lay;
    if (row->finished || iter_plans_get(row, &p, f))
      break;
    iter_layout_of(row, p, &lay);
    uint64_t epochs = p->spec.cfg.epochs;
    if (lay.units == 0) { /* an empty dataset has nothing to hand out, ever */
      row->finished = true;
      changed = true;
      break;
    }
    if ((uint64_t)row->done_blocks < lay.units)
      break;
    if (clear_epoch(st, row->id, row->epoch, f))
      return f->code;
    row->epoch++;
    row->done_blocks = 0;
    if (row->resume_epoch >= 0 && row->resume_epoch < row->epoch) {
      row->resume_epoch = -1;
      free(row->resume_done);
      row->resume_done = NULL;
    }
    if (epochs != 0 && (uint64_t)row->epoch >= epochs)
      row->finished = true;
    changed = true;
    log_msg(LOG_DEBUG, "iteration %s: epoch %" PRId64 "%s", row->name, row->epoch,
            row->finished ? " (finished)" : "");
  }
  if (f->code)
    return f->code;
  return changed ? iter_row_save(st, row, f) : MUSTER_OK;
}

/* ---- settings ------------------------------------------------------------- */

/* The node whose agent keeps this process's iterations ("" on the head). */
static char iter_node[NAME_MAX_LEN + 1];

void iter_set_node(const char *name) {
  snprintf(iter_node, sizeof iter_node, "%s", name ? name : "");
}

const char *iter_node_name(void) {
  return iter_node;
}

static muster_err_t parse_settings(const json_t *body, iter_settings_t *set, fail_t *f) {
  bool sync;
  if (jv_int(body, "lease_ms", "", ITER_DEFAULT_LEASE_MS, 1, WEEK_MS, &set->lease_ms, f) ||
      jv_int(body, "rank_timeout_ms", "", ITER_DEFAULT_RANK_TIMEOUT_MS, 100, WEEK_MS,
             &set->rank_timeout_ms, f) ||
      jv_int(body, "replication", "", 1, 1, ITER_MAX_REPLICATION, &set->replication, f) ||
      jv_bool(body, "cluster_sync", "", true, &sync, f))
    return f->code;
  const json_t *ratio = json_object_get(body, "slow_ratio");
  set->slow_ratio = ITER_DEFAULT_SLOW_RATIO;
  if (ratio && !json_is_null(ratio)) {
    if (!json_is_number(ratio) || json_number_value(ratio) < 0 || json_number_value(ratio) > 1)
      return fail_set(f, MUSTER_INVALID, "slow_ratio: expected a number in [0, 1]");
    set->slow_ratio = json_number_value(ratio);
  }
  if (!sync && iter_node[0] == '\0')
    return fail_set(f, MUSTER_INVALID,
                    "cluster_sync: false keeps the iteration's state on the node agent the "
                    "client talks to, and the head is no node: create it through a node "
                    "agent's port (muster node --listen), or use cluster_sync true (state on "
                    "the head)");
  set->cluster_sync = sync;
  return MUSTER_OK;
}

/* Names the first setting that differs, or NULL. */
static const char *settings_differ(const iter_settings_t *a, const iter_settings_t *b) {
  if (a->lease_ms != b->lease_ms)
    return "lease_ms";
  if (a->rank_timeout_ms != b->rank_timeout_ms)
    return "rank_timeout_ms";
  if (a->replication != b->replication)
    return "replication";
  if (fabs(a->slow_ratio - b->slow_ratio) > 1e-12)
    return "slow_ratio";
  return a->cluster_sync != b->cluster_sync ? "cluster_sync" : NULL;
}

/* ---- create ------------------------------------------------------------------ */

/* What a create request builds before it touches the store. */
typedef struct {
  iter_spec_t spec;
  iter_settings_t set;
  char *config;  /* canonical text */
  char *origin;  /* checkpoint position text, or NULL */
  int64_t epoch; /* first epoch */
  int64_t resume_world;
  char *resume_done; /* or NULL */
  int64_t done_units;
  bool finished;
} iter_new_t;

static void new_free(iter_new_t *n) {
  iter_spec_free(&n->spec);
  free(n->config);
  free(n->origin);
  free(n->resume_done);
}

void iter_fingerprint_hex(uint64_t fp, char out[17]) {
  snprintf(out, 17, "%016" PRIx64, fp);
}

/* Validates the spec against the core and fills n->config. */
static muster_err_t new_check_plan(iter_new_t *n, fail_t *f) {
  part_plan_t *plan = NULL;
  muster_err_t err = part_plan_create(n->spec.ds, &n->spec.cfg, &plan);
  part_plan_destroy(plan);
  if (err == MUSTER_NOMEM)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  if (err != MUSTER_OK)
    return fail_set(f, MUSTER_INVALID,
                    n->spec.cfg.strategy == PART_RANGE
                        ? "ranges: the non-empty ranges must tile [0, N) "
                          "exactly (no gap, no overlap)"
                        : "the configuration is invalid");
  if (n->set.replication > n->spec.cfg.world_size)
    return fail_set(f, MUSTER_INVALID, "replication: %lld is more than world_size (%u)",
                    (long long)n->set.replication, n->spec.cfg.world_size);
  n->config = iter_canon_text(n->spec.canon);
  return n->config ? MUSTER_OK : fail_set(f, MUSTER_NOMEM, "out of memory");
}

/* Parses checkpoint.config with world_size `world` (and `epochs` when >= 0). */
static muster_err_t spec_with(const json_t *config, int64_t world, int64_t epochs,
                              iter_spec_t *spec, fail_t *f) {
  json_t *copy = json_deep_copy(config);
  if (copy == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  json_object_set_new(copy, "world_size", json_integer(world));
  if (epochs >= 0)
    json_object_set_new(copy, "epochs", json_integer(epochs));
  muster_err_t err = iter_spec_parse(copy, spec, f);
  json_decref(copy);
  if (err)
    fail_set(f, err, "checkpoint.config: %s", fail_message(f));
  return err;
}

/* Reads the checkpoint's position against its own plan (world W0). */
/* Checks a checkpoint against the plan of its own configuration (ERR: how
 * building that plan went): the fingerprint must match, the epoch be there. */
static void position_check(const json_t *ck, muster_err_t err, const part_plan_t *plan0,
                           int64_t *epoch, fail_t *f) {
  const char *fp_text = "";
  char want[17];
  if (err != MUSTER_OK) {
    fail_set(f, err, "checkpoint.config: does not build a plan");
  } else if (!jv_str(ck, "fingerprint", "checkpoint", "", 16, &fp_text, f) &&
             (iter_fingerprint_hex(part_plan_fingerprint(plan0), want),
              strcmp(want, fp_text) != 0)) {
    fail_set(f, MUSTER_INVALID,
             "checkpoint.fingerprint: '%s' does not match its configuration "
             "(%s); the checkpoint was changed or comes from another muster version",
             fp_text, want);
  } else if (!f->code && !jv_int(ck, "epoch", "checkpoint", -1, 0, INT64_MAX, epoch, f) &&
             *epoch < 0) {
    fail_set(f, MUSTER_INVALID, "checkpoint.epoch: missing");
  }
}

/* Takes a checked position: the epoch it is in and COVERED of its UNITS done
 * in a world of W0. */
static void position_take(iter_new_t *n, const json_t *ck, int64_t w0, int64_t epoch,
                          uint64_t covered, uint64_t units) {
  n->epoch = epoch;
  n->resume_world = w0;
  n->done_units = (int64_t)covered;
  if (covered == units && units > 0) { /* that epoch was complete */
    n->epoch++;
    n->done_units = 0;
  } else if (covered > 0 ||
             (n->spec.cfg.strategy != PART_DYNAMIC && (int64_t)n->spec.cfg.world_size != w0)) {
    /* Even with nothing done, a static resume into another world deals the
     * checkpoint's blocks: clients name blocks of that plan (the Python
     * sampler's partly read blocks), which the new plan numbers otherwise. */
    n->resume_done = json_dumps(json_object_get(ck, "done"), JSON_COMPACT);
  }
  json_t *origin = json_pack("{s:I, s:I, s:O}", "epoch", (json_int_t)epoch, "world_size",
                             (json_int_t)w0, "done", json_object_get(ck, "done"));
  n->origin = iter_canon_text(origin);
  json_decref(origin);
}

static muster_err_t new_from_position(iter_new_t *n, const json_t *ck, int64_t w0, fail_t *f) {
  iter_spec_t spec0;
  int64_t epoch = -1;
  if (spec_with(json_object_get(ck, "config"), w0, -1, &spec0, f))
    return f->code;
  part_plan_t *plan0 = NULL;
  uint64_t *prefix0 = NULL;
  muster_err_t err = part_plan_create(spec0.ds, &spec0.cfg, &plan0);
  if (err == MUSTER_OK && spec0.cfg.strategy != PART_DYNAMIC &&
      (prefix0 = iter_plan_prefix(plan0)) == NULL)
    err = MUSTER_NOMEM;
  position_check(ck, err, plan0, &epoch, f);
  part_range_t *ranges = NULL;
  size_t nranges = 0;
  uint64_t covered = 0, units = 0;
  if (!f->code) {
    units = iter_plan_units(plan0, prefix0);
    iter_ranges_parse(json_object_get(ck, "done"), units, "checkpoint.done", &ranges, &nranges,
                      &covered, f);
  }
  if (!f->code)
    position_take(n, ck, w0, epoch, covered, units);
  free(ranges);
  free(prefix0);
  part_plan_destroy(plan0);
  iter_spec_free(&spec0);
  return f->code;
}

/* Builds the new iteration from body.checkpoint. */
static muster_err_t new_from_checkpoint(iter_new_t *n, const json_t *body, fail_t *f) {
  static const char *const ck_keys[] = {"version",     "name",   "config", "epoch", "world_size",
                                        "fingerprint", "blocks", "done",   NULL};
  const json_t *ck = json_object_get(body, "checkpoint");
  int64_t version, w0, world, epochs;
  if (!json_is_object(ck))
    return fail_set(f, MUSTER_INVALID,
                    "checkpoint: expected the object GET "
                    "/v1/iterations/{name}/checkpoint returned");
  for (const char *const *k = iter_config_keys; *k; k++)
    if (strcmp(*k, "world_size") && strcmp(*k, "epochs") && json_object_get(body, *k))
      return fail_set(f, MUSTER_INVALID,
                      "%s: with a checkpoint only world_size and epochs may "
                      "change; the rest comes from checkpoint.config",
                      *k);
  if (jv_only(ck, "checkpoint", ck_keys, f) ||
      jv_int(ck, "version", "checkpoint", 1, 1, 1, &version, f) ||
      jv_int(ck, "world_size", "checkpoint", 0, 1, PART_MAX_WORLD_SIZE, &w0, f))
    return f->code;
  const json_t *config = json_object_get(ck, "config");
  if (!json_is_object(config) || w0 == 0)
    return fail_set(f, MUSTER_INVALID, "checkpoint: needs config and world_size");
  const json_t *cw = json_object_get(config, "world_size");
  if (jv_int(body, "world_size", "", json_is_integer(cw) ? json_integer_value(cw) : w0, 1,
             PART_MAX_WORLD_SIZE, &world, f) ||
      jv_int(body, "epochs", "", -1, 0, INT64_MAX, &epochs, f))
    return f->code;
  if (spec_with(config, world, epochs, &n->spec, f))
    return f->code;
  if (n->spec.cfg.strategy == PART_RANGE && world != w0)
    return fail_set(f, MUSTER_INVALID,
                    "world_size: a range iteration names each rank's range, "
                    "so it resumes with its own world size (%lld) only",
                    (long long)w0);
  return new_from_position(n, ck, w0, f);
}

static muster_err_t new_parse(const json_t *body, iter_new_t *n, fail_t *f) {
  memset(n, 0, sizeof *n);
  n->resume_world = 0;
  if (parse_settings(body, &n->set, f))
    return f->code;
  if (json_object_get(body, "checkpoint") ? new_from_checkpoint(n, body, f)
                                          : iter_spec_parse(body, &n->spec, f))
    return f->code;
  /* An empty dataset would be born finished: every rank gets nothing, the
   * symptom of a mistake (a wrong count, a filter that kept nothing) far more
   * often than a wish, and a silent one.  (The head still serves an empty
   * iteration stored by an earlier version: only creating one is refused.) */
  if (dataset_num_samples(n->spec.ds) == 0)
    return fail_set(f, MUSTER_INVALID,
                    "dataset: it has no samples (num_samples 0, or shards that hold none); an "
                    "iteration needs at least one, as an empty one would be finished at once "
                    "with nothing for any rank");
  if (new_check_plan(n, f))
    return f->code;
  if (n->spec.cfg.epochs != 0 && (uint64_t)n->epoch >= n->spec.cfg.epochs)
    n->finished = true;
  return MUSTER_OK;
}

/* The create body's allowed keys: configuration plus these. */
static muster_err_t check_keys(const json_t *body, fail_t *f) {
  static const char *const extra[] = {
      "name",        "rank",       "checkpoint",   "lease_ms", "rank_timeout_ms",
      "replication", "slow_ratio", "cluster_sync", NULL};
  const char *key;
  const json_t *value;
  json_object_foreach((json_t *)body, key, value) {
    bool known = false;
    for (const char *const *k = iter_config_keys; *k && !known; k++)
      known = strcmp(*k, key) == 0;
    for (const char *const *k = extra; *k && !known; k++)
      known = strcmp(*k, key) == 0;
    if (!known)
      return jv_fail_unknown(f, "", key, extra, iter_config_keys);
  }
  return MUSTER_OK;
}

static muster_err_t insert_row(store_t *st, const char *name, const iter_new_t *n, int64_t *id,
                               fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "INSERT INTO iterations(name, config, origin, fingerprint, lease_ms, rank_timeout_ms,"
          " replication, slow_ratio, cluster_sync, epoch, done_blocks, finished, resume_epoch,"
          " resume_world, resume_done, created_ms, updated_ms)"
          " VALUES(?1, ?2, ?3, '', ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?15)");
  if (s == NULL)
    return store_fail(st, f, "iteration insert");
  store_bind_text(s, 1, name);
  store_bind_text(s, 2, n->config);
  store_bind_text(s, 3, n->origin);
  sqlite3_bind_int64(s, 4, n->set.lease_ms);
  sqlite3_bind_int64(s, 5, n->set.rank_timeout_ms);
  sqlite3_bind_int64(s, 6, n->set.replication);
  sqlite3_bind_double(s, 7, n->set.slow_ratio);
  sqlite3_bind_int(s, 8, n->set.cluster_sync);
  sqlite3_bind_int64(s, 9, n->epoch);
  sqlite3_bind_int64(s, 10, n->resume_done ? n->done_units : 0);
  sqlite3_bind_int(s, 11, n->finished);
  if (n->resume_done) {
    sqlite3_bind_int64(s, 12, n->epoch);
    sqlite3_bind_int64(s, 13, n->resume_world);
    store_bind_text(s, 14, n->resume_done);
  }
  sqlite3_bind_int64(s, 15, now_ms());
  if (store_step_done(st, s, f))
    return f->code;
  *id = sqlite3_last_insert_rowid(store_db(st));
  return MUSTER_OK;
}

/* One row per rank, unknown until it shows up; silent past the timeout it
 * counts as failed, so that replicas may take its blocks over. */
static muster_err_t insert_ranks(store_t *st, int64_t id, uint32_t world, int64_t timeout_ms,
                                 fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO iter_ranks(iter, rank, state, last_seen_ms,"
                                   " deadline_ms) VALUES(?1, ?2, 0, 0, ?3)");
  if (s == NULL)
    return store_fail(st, f, "iteration ranks");
  int64_t deadline = now_ms() + timeout_ms;
  for (uint32_t r = 0; r < world; r++) {
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, r);
    sqlite3_bind_int64(s, 3, deadline);
    if (store_step_done(st, s, f))
      return f->code;
  }
  return MUSTER_OK;
}

/* Writes `v` as compact JSON into `out` (`cap` bytes), cut with "..." when
 * longer (a list of shards can be long). */
static void config_value_text(const json_t *v, char *out, size_t cap) {
  char *text = v ? jv_encode(v) : NULL; /* reals shortest, as every reply writes them */
  if (text && strlen(text) >= cap)
    snprintf(out, cap, "%.*s...", (int)(cap - 4), text);
  else
    snprintf(out, cap, "%s", text ? text : "absent");
  free(text);
}

/* Finds the first field where configuration objects `a` (stored) and `b`
 * (the request's) differ, its path from `prefix` (nested objects as
 * "dataset.num_samples"), and writes "PATH: A there, B in this request" into
 * `out`.  Returns false when they do not differ. */
static bool config_diff(const json_t *a, const json_t *b, const char *prefix, char *out,
                        size_t cap) {
  const char *key;
  const json_t *va;
  for (int pass = 0; pass < 2; pass++) { /* a's keys, then those only b has */
    json_object_foreach((json_t *)(pass ? b : a), key, va) {
      const json_t *x = pass ? json_object_get(a, key) : va, *y = json_object_get(b, key);
      if (pass && x)
        continue;
      if (x && y && json_equal(x, y))
        continue;
      char path[160], tx[96], ty[96];
      snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
      if (json_is_object(x) && json_is_object(y))
        return config_diff(x, y, path, out, cap);
      config_value_text(x, tx, sizeof tx);
      config_value_text(y, ty, sizeof ty);
      snprintf(out, cap, "%s is %s there, %s in this request", path, tx, ty);
      return true;
    }
  }
  return false;
}

/* Refuses to join iteration `row` whose configuration differs from the
 * request's `n`, naming the first field that differs. */
static muster_err_t join_refuse_config(const iter_row_t *row, const iter_new_t *n, fail_t *f) {
  json_t *a = json_loads(row->config, 0, NULL), *b = json_loads(n->config, 0, NULL);
  char diff[512] = "";
  if (!(a && b && config_diff(a, b, "", diff, sizeof diff)))
    snprintf(diff, sizeof diff, "it differs"); /* cannot happen: the texts differ */
  json_decref(a);
  json_decref(b);
  return fail_set(f, MUSTER_INVALID_STATE,
                  "iteration '%s' exists with another configuration (%s); every rank must give "
                  "the same one (or pick another name)",
                  row->name, diff);
}

/* Refuses a restore that meets iteration `row` made otherwise: created, from
 * another checkpoint, or from the same one with another configuration (a
 * world size, say), naming which. */
static muster_err_t restore_refuse(const iter_row_t *row, const iter_new_t *n, bool same_origin,
                                   fail_t *f) {
  char why[600] = "created, not restored";
  if (row->origin && !same_origin)
    snprintf(why, sizeof why, "restored from another checkpoint");
  if (row->origin && same_origin) {
    json_t *a = json_loads(row->config, 0, NULL), *b = json_loads(n->config, 0, NULL);
    char diff[512] = "it differs";
    if (a && b)
      config_diff(a, b, "", diff, sizeof diff);
    json_decref(a);
    json_decref(b);
    snprintf(why, sizeof why, "restored from the same checkpoint with another configuration: %s",
             diff);
  }
  return fail_set(f, MUSTER_INVALID_STATE,
                  "iteration '%s' exists (%s); a restore makes a new iteration: give it a name "
                  "that is free, or remove that one first (muster iter rm %s)",
                  row->name, why, row->name);
}

/* Joins the existing row when it matches what the request built. */
static json_t *join(store_t *st, iter_row_t *row, const iter_new_t *n, int64_t rank, fail_t *f) {
  const char *field = settings_differ(&row->set, &n->set);
  bool same_origin = (row->origin == NULL) == (n->origin == NULL) &&
                     (row->origin == NULL || strcmp(row->origin, n->origin) == 0);
  bool same_config = strcmp(row->config, n->config) == 0;
  if (n->origin && !(same_origin && same_config))
    /* A restore makes an iteration; only ranks restoring the same checkpoint
     * together (with the same options) meet one of the same name. */
    restore_refuse(row, n, same_origin, f);
  else if (!same_config)
    join_refuse_config(row, n, f);
  else if (!same_origin) /* a create meeting a restored one */
    fail_set(f, MUSTER_INVALID_STATE,
             "iteration '%s' exists and was restored from a checkpoint; ranks join it by "
             "restoring the same checkpoint (or pick another name)",
             row->name);
  else if (field)
    fail_set(f, MUSTER_INVALID_STATE, "iteration '%s' exists with another %s", row->name, field);
  else if (rank < 0 || !iter_rank_touch(st, row, rank, f))
    return iter_to_json(st, row, true, f);
  return NULL;
}

/* The request's iteration name, checked against the name rule; "." and ".."
 * pass, for a join of an iteration an older head made (refused before a
 * create, iter_create). */
static bool create_name(const json_t *body, const char **name, fail_t *f) {
  if (jv_str(body, "name", "", NULL, NAME_MAX_LEN + 1, name, f))
    return false;
  if (*name == NULL)
    fail_set(f, MUSTER_NAME_INVALID, "name: missing (every iteration needs a name)");
  else if (!name_was_valid(*name))
    fail_set(f, MUSTER_NAME_INVALID, "name: iteration name '%.140s' is invalid: %s", *name,
             name_rule_text(*name));
  else
    return true;
  return false;
}

/* Inserts iteration `name` with its ranks and loads it into *row; `rank` >= 0
 * is touched as joined. */
static muster_err_t create_row(store_t *st, const char *name, const iter_new_t *n, int64_t rank,
                               iter_row_t *row, fail_t *f) {
  int64_t id = 0;
  if (insert_row(st, name, n, &id, f) ||
      insert_ranks(st, id, n->spec.cfg.world_size, n->set.rank_timeout_ms, f) ||
      iter_row_load(st, name, row, f) || iter_settle(st, row, f) ||
      (rank >= 0 && iter_rank_touch(st, row, rank, f)))
    return f->code != MUSTER_OK ? f->code : MUSTER_INTERNAL;
  return MUSTER_OK;
}

json_t *iter_create(store_t *st, const json_t *body, bool *created, fail_t *f) {
  const char *name;
  int64_t rank;
  iter_new_t n;
  iter_row_t row = {0};
  json_t *out = NULL;
  *created = false;
  if (check_keys(body, f) || !create_name(body, &name, f) ||
      jv_int(body, "rank", "", -1, 0, PART_MAX_WORLD_SIZE - 1, &rank, f))
    return NULL;
  if (new_parse(body, &n, f))
    goto done;
  if (rank >= (int64_t)n.spec.cfg.world_size) {
    fail_set(f, MUSTER_INVALID, "rank: %lld is not below world_size (%u)", (long long)rank,
             n.spec.cfg.world_size);
    goto done;
  }
  if (iter_row_load(st, name, &row, f) == MUSTER_OK) {
    out = join(st, &row, &n, rank, f);
    goto done;
  }
  if (f->code != MUSTER_ITERATION_NOT_FOUND)
    goto done;
  *f = (fail_t){0};
  if (name_is_dots(name))
    fail_set(f, MUSTER_NAME_INVALID, "name: iteration name '%s' is invalid: " NAME_DOTS_TEXT, name);
  else if (create_row(st, name, &n, rank, &row, f) == MUSTER_OK) {
    *created = true;
    out = iter_to_json(st, &row, true, f);
  }
done:
  iter_row_free(&row);
  new_free(&n);
  return out;
}

/* ---- delete ------------------------------------------------------------------ */

json_t *iter_delete(store_t *st, const char *name, fail_t *f) {
  iter_row_t row;
  if (iter_row_load(st, name, &row, f))
    return NULL;
  int64_t id = row.id;
  iter_row_free(&row);
  if (delete_rows(st, "DELETE FROM iter_blocks WHERE iter = ?1", id, f) ||
      delete_rows(st, "DELETE FROM iter_lanes WHERE iter = ?1", id, f) ||
      delete_rows(st, "DELETE FROM iter_ranks WHERE iter = ?1", id, f) ||
      delete_rows(st, "DELETE FROM iterations WHERE id = ?1", id, f))
    return NULL;
  iter_plans_forget(id);
  return json_pack("{s:s}", "deleted", name);
}
