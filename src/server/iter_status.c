/*
 * iter_status.c — what an iteration reports: its status (blocks per state,
 * per-rank health against the mean rate), the list of iterations, and the
 * checkpoint (the done blocks as merged ranges of the layout's units), which
 * iter.c's create takes back to resume.
 */
#include "iter.h"
#include "iter_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- status ------------------------------------------------------------------- */

/* Counts the current epoch's block rows by state. */
static void count_blocks(store_t *st, const iter_row_t *row, int64_t counts[3]) {
  sqlite3_stmt *s = store_stmt(st, "SELECT state, count(*) FROM iter_blocks WHERE iter = ?1"
                                   " AND epoch = ?2 GROUP BY state");
  counts[0] = counts[1] = counts[2] = 0;
  if (s == NULL)
    return;
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, row->epoch);
  while (sqlite3_step(s) == SQLITE_ROW) {
    int state = sqlite3_column_int(s, 0);
    if (state >= 0 && state < 3)
      counts[state] = sqlite3_column_int64(s, 1);
  }
  store_reset(s);
}

typedef struct {
  int64_t rank, state, last_seen, first, samples, blocks, taken, expired, leases;
  double throughput; /* samples per second */
} rank_info_t;

/* Loads every rank's row with its current lease count; caller frees.
 * INDEXED BY: the planner would count each rank's leases over every block
 * row of the current and the last epoch. */
static rank_info_t *load_ranks(store_t *st, int64_t id, size_t *n) {
  sqlite3_stmt *s = store_stmt(
      st, "SELECT r.rank, r.state, r.last_seen_ms, coalesce(r.first_ms, 0), r.samples, r.blocks,"
          " r.taken_over, r.expired, (SELECT count(*) FROM iter_blocks b INDEXED BY"
          " iter_blocks_by_rank WHERE b.iter = r.iter AND b.rank = r.rank AND b.state = 1)"
          " FROM iter_ranks r WHERE r.iter = ?1 ORDER BY r.rank");
  *n = 0;
  size_t cap = 16;
  rank_info_t *ranks = malloc(cap * sizeof *ranks);
  if (s == NULL || ranks == NULL) {
    free(ranks);
    return NULL;
  }
  sqlite3_bind_int64(s, 1, id);
  while (sqlite3_step(s) == SQLITE_ROW) {
    if (*n == cap) {
      rank_info_t *grown = realloc(ranks, (cap *= 2) * sizeof *ranks);
      if (grown == NULL)
        break;
      ranks = grown;
    }
    rank_info_t *r = &ranks[(*n)++];
    int64_t *fields[] = {&r->rank,   &r->state, &r->last_seen, &r->first, &r->samples,
                         &r->blocks, &r->taken, &r->expired,   &r->leases};
    for (int c = 0; c < 9; c++)
      *fields[c] = sqlite3_column_int64(s, c);
    int64_t span = r->last_seen - r->first;
    r->throughput =
        r->first > 0 && r->samples > 0 ? r->samples * 1000.0 / (span > 0 ? span : 1) : 0.0;
  }
  store_reset(s);
  return ranks;
}

/* Health: unknown (never seen), failed (silent or let a lease expire),
 * active (holds blocks), slow (active below slow_ratio x the mean
 * throughput of ranks that have done work), idle (alive, holds nothing). */
static const char *rank_health(const rank_info_t *r, double mean, double slow_ratio) {
  if (r->state == ITER_RANK_UNKNOWN)
    return "unknown";
  if (r->state == ITER_RANK_FAILED)
    return "failed";
  if (r->leases == 0)
    return "idle";
  if (mean > 0 && r->samples > 0 && r->throughput < slow_ratio * mean)
    return "slow";
  return "active";
}

static json_t *ranks_json(store_t *st, const iter_row_t *row) {
  size_t n;
  rank_info_t *ranks = load_ranks(st, row->id, &n);
  json_t *list = json_array();
  double sum = 0;
  size_t working = 0;
  for (size_t i = 0; i < n; i++)
    if (ranks[i].state == ITER_RANK_ALIVE && ranks[i].samples > 0) {
      sum += ranks[i].throughput;
      working++;
    }
  double mean = working ? sum / (double)working : 0;
  for (size_t i = 0; i < n; i++) {
    const rank_info_t *r = &ranks[i];
    json_array_append_new(
        list, json_pack("{s:I, s:s, s:I, s:I, s:f, s:I, s:I, s:I, s:o}", "rank",
                        (json_int_t)r->rank, "health", rank_health(r, mean, row->set.slow_ratio),
                        "samples", (json_int_t)r->samples, "blocks", (json_int_t)r->blocks,
                        "throughput", r->throughput, "leases", (json_int_t)r->leases, "taken_over",
                        (json_int_t)r->taken, "expired", (json_int_t)r->expired, "last_seen_ms",
                        r->last_seen ? json_integer((json_int_t)r->last_seen) : json_null()));
  }
  free(ranks);
  return list;
}

/* The configuration for show: labels replaced by their count. */
static json_t *config_json(const char *text, bool with_labels) {
  json_t *config = json_loads(text, 0, NULL);
  json_t *ds = json_object_get(config, "dataset");
  json_t *labels = json_object_get(ds, "labels");
  if (labels && !with_labels)
    json_object_set_new(ds, "labels", json_integer((json_int_t)json_array_size(labels)));
  return config ? config : json_object();
}

json_t *iter_to_json(store_t *st, iter_row_t *row, bool with_ranks, fail_t *f) {
  iter_plans_t *p;
  iter_layout_t lay;
  if (iter_plans_get(row, &p, f))
    return NULL;
  iter_layout_of(row, p, &lay);
  int64_t counts[3];
  count_blocks(st, row, counts);
  char fp[17];
  iter_fingerprint_hex(part_plan_fingerprint(p->plan), fp);
  json_t *out = json_pack(
      "{s:s, s:o, s:s, s:b, s:I, s:I, s:I, s:f, s:I, s:b, s:{s:I, s:I, s:I, s:I}, s:I}", "name",
      row->name, "config", config_json(row->config, false), "fingerprint", fp, "cluster_sync",
      row->set.cluster_sync, "lease_ms", (json_int_t)row->set.lease_ms, "rank_timeout_ms",
      (json_int_t)row->set.rank_timeout_ms, "replication", (json_int_t)row->set.replication,
      "slow_ratio", row->set.slow_ratio, "epoch", (json_int_t)row->epoch, "finished", row->finished,
      "blocks", "total", (json_int_t)(row->finished ? 0 : lay.units), "done",
      (json_int_t)(row->finished ? 0 : row->done_blocks), "leased", (json_int_t)counts[1],
      "pending", (json_int_t)counts[0], "created_ms", (json_int_t)row->created_ms);
  json_object_set_new(out, "resumed",
                      row->resume_epoch >= 0 && row->resume_epoch == row->epoch
                          ? json_pack("{s:I, s:I}", "epoch", (json_int_t)row->resume_epoch,
                                      "world_size", (json_int_t)row->resume_world)
                          : json_null());
  json_object_set_new(out, "node",
                      !row->set.cluster_sync && iter_node_name()[0] ? json_string(iter_node_name())
                                                                    : json_null());
  if (with_ranks)
    json_object_set_new(out, "ranks", ranks_json(st, row));
  return out;
}

json_t *iter_get(store_t *st, const char *name, fail_t *f) {
  iter_row_t row;
  json_t *out = iter_row_load(st, name, &row, f) ? NULL : iter_to_json(st, &row, true, f);
  iter_row_free(&row);
  return out;
}

json_t *iter_list(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT name FROM iterations ORDER BY name");
  if (s == NULL) {
    store_fail(st, f, "iteration list");
    return NULL;
  }
  json_t *names = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(names, json_string((const char *)sqlite3_column_text(s, 0)));
  store_reset(s);
  json_t *list = json_array();
  size_t i;
  json_t *name;
  json_array_foreach(names, i, name) {
    iter_row_t row;
    json_t *one = iter_row_load(st, json_string_value(name), &row, f)
                      ? NULL
                      : iter_to_json(st, &row, false, f);
    iter_row_free(&row);
    if (one == NULL) {
      json_decref(list);
      list = NULL;
      break;
    }
    json_array_append_new(list, one);
  }
  json_decref(names);
  return list ? json_pack("{s:o}", "iterations", list) : NULL;
}

/* ---- checkpoint ---------------------------------------------------------------- */

/* Appends [a, b) to `ranges`, merging with the last range when they touch. */
static void ranges_push(json_t *ranges, uint64_t a, uint64_t b) {
  size_t n = json_array_size(ranges);
  json_t *last = n ? json_array_get(ranges, n - 1) : NULL;
  if (last && (uint64_t)json_integer_value(json_array_get(last, 1)) == a) {
    json_array_set_new(last, 1, json_integer((json_int_t)b));
    return;
  }
  json_array_append_new(ranges, json_pack("[I, I]", (json_int_t)a, (json_int_t)b));
}

/* The done blocks of the current epoch as sorted ranges: the legacy ones of a
 * resumed epoch merged with the rows acknowledged since. */
static json_t *done_ranges(store_t *st, const iter_row_t *row, const iter_layout_t *lay) {
  sqlite3_stmt *s = store_stmt(st, "SELECT block FROM iter_blocks WHERE iter = ?1 AND epoch = ?2"
                                   " AND state = 2 ORDER BY block");
  json_t *ranges = json_array();
  if (s == NULL)
    return ranges;
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, row->epoch);
  size_t legacy = 0;
  bool more = sqlite3_step(s) == SQLITE_ROW;
  while (more || legacy < lay->ndone) {
    uint64_t g = more ? (uint64_t)sqlite3_column_int64(s, 0) : UINT64_MAX;
    if (legacy < lay->ndone && lay->done[legacy].begin < g) {
      ranges_push(ranges, lay->done[legacy].begin, lay->done[legacy].end);
      legacy++;
    } else {
      ranges_push(ranges, g, g + 1);
      more = sqlite3_step(s) == SQLITE_ROW;
    }
  }
  store_reset(s);
  return ranges;
}

json_t *iter_checkpoint(store_t *st, const char *name, fail_t *f) {
  iter_row_t row;
  iter_plans_t *p;
  iter_layout_t lay;
  json_t *out = NULL;
  if (iter_row_load(st, name, &row, f) || iter_plans_get(&row, &p, f))
    goto done;
  iter_layout_of(&row, p, &lay);
  char fp[17];
  iter_fingerprint_hex(part_plan_fingerprint(lay.plan), fp);
  out = json_pack("{s:i, s:s, s:o, s:I, s:I, s:s, s:I, s:o}", "version", 1, "name", row.name,
                  "config", config_json(row.config, true), "epoch", (json_int_t)row.epoch,
                  "world_size", (json_int_t)part_plan_config(lay.plan)->world_size, "fingerprint",
                  fp, "blocks", (json_int_t)(row.finished ? 0 : lay.units), "done",
                  row.finished ? json_array() : done_ranges(st, &row, &lay));
done:
  iter_row_free(&row);
  return out;
}
