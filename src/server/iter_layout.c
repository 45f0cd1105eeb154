/*
 * iter_layout.c — the plan cache and the block layout of an epoch (see
 * iter_internal.h for units, lanes and the dealt layout).
 *
 * Plans are rebuilt from an iteration's stored configuration the first time
 * a request needs them and kept in a small cache, keyed by the row id and a
 * hash of the configuration and resume texts (a deleted and re-created name,
 * or a rolled-back create, never hits a stale entry).  The hash strategy's
 * plan costs one O(N) pass, which is paid once per head, not per request.
 * Everything runs on the event-loop thread.
 */
#include "iter_internal.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define ITER_CACHE_SLOTS 32

static iter_plans_t *cache[ITER_CACHE_SLOTS];
static uint64_t cache_clock;

static void plans_free(iter_plans_t *p) {
  if (p == NULL)
    return;
  if (p->streams) {
    uint32_t world = part_plan_config(p->streams_plan)->world_size;
    for (uint32_t r = 0; r < world; r++)
      stream_destroy(p->streams[r]);
    free(p->streams);
  }
  part_epoch_destroy(p->ep);
  part_plan_destroy(p->plan);
  part_plan_destroy(p->plan0);
  free(p->prefix);
  free(p->prefix0);
  free(p->done0);
  iter_spec_free(&p->spec);
  free(p);
}

void iter_plans_forget(int64_t id) {
  for (int i = 0; i < ITER_CACHE_SLOTS; i++)
    if (cache[i] && cache[i]->id == id) {
      plans_free(cache[i]);
      cache[i] = NULL;
    }
}

uint64_t *iter_plan_prefix(const part_plan_t *plan) {
  const part_config_t *cfg = part_plan_config(plan);
  if (cfg->strategy == PART_DYNAMIC)
    return NULL;
  uint64_t *prefix = calloc((size_t)cfg->world_size + 1, sizeof *prefix);
  for (uint32_t r = 0; prefix && r < cfg->world_size; r++)
    prefix[r + 1] = prefix[r] + part_rank_blocks(plan, r);
  return prefix;
}

uint64_t iter_plan_units(const part_plan_t *plan, const uint64_t *prefix) {
  if (part_plan_config(plan)->strategy == PART_DYNAMIC)
    return part_num_blocks(plan);
  return prefix[part_plan_config(plan)->world_size];
}

muster_err_t iter_ranges_parse(const json_t *list, uint64_t units, const char *ctx,
                               part_range_t **out, size_t *n, uint64_t *covered, fail_t *f) {
  size_t count = json_array_size(list);
  *out = NULL;
  *n = 0;
  *covered = 0;
  if (!json_is_array(list))
    return fail_set(f, MUSTER_INVALID, "%s: expected an array of [begin, end) pairs", ctx);
  part_range_t *ranges = calloc(count ? count : 1, sizeof *ranges);
  if (ranges == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  uint64_t last_end = 0;
  for (size_t i = 0; i < count; i++) {
    const json_t *pair = json_array_get(list, i);
    const json_t *b = json_array_get(pair, 0), *e = json_array_get(pair, 1);
    json_int_t bv = json_is_integer(b) ? json_integer_value(b) : -1;
    json_int_t ev = json_is_integer(e) ? json_integer_value(e) : -1;
    if (json_array_size(pair) != 2 || bv < 0 || ev <= bv || (uint64_t)ev > units ||
        (i > 0 && (uint64_t)bv <= last_end)) {
      free(ranges);
      return fail_set(f, MUSTER_INVALID,
                      "%s[%zu]: expected [begin, end) with begin < end <= %llu, sorted and "
                      "apart from the previous range",
                      ctx, i, (unsigned long long)units);
    }
    ranges[i] = (part_range_t){(uint64_t)bv, (uint64_t)ev};
    last_end = (uint64_t)ev;
    *covered += (uint64_t)(ev - bv);
  }
  *out = ranges;
  *n = count;
  return MUSTER_OK;
}

/* The plan of `spec` with another world size (the checkpoint's). */
static muster_err_t plan_with_world(const iter_spec_t *spec, int64_t world, part_plan_t **out) {
  part_config_t cfg = spec->cfg;
  cfg.world_size = (uint32_t)world;
  return part_plan_create(spec->ds, &cfg, out);
}

/* Builds the plans of `row`. */
static muster_err_t plans_build(const iter_row_t *row, iter_plans_t *p, fail_t *f) {
  json_t *obj = json_loads(row->config, 0, NULL);
  muster_err_t err =
      obj ? iter_spec_parse(obj, &p->spec, f)
          : fail_set(f, MUSTER_STORE, "iteration %s: unreadable configuration", row->name);
  json_decref(obj);
  if (err)
    return err;
  if (part_plan_create(p->spec.ds, &p->spec.cfg, &p->plan) != MUSTER_OK ||
      (p->spec.cfg.strategy != PART_DYNAMIC && (p->prefix = iter_plan_prefix(p->plan)) == NULL))
    return fail_set(f, MUSTER_STORE, "iteration %s: the stored configuration no longer builds",
                    row->name);
  if (row->resume_epoch < 0)
    return MUSTER_OK;
  if (plan_with_world(&p->spec, row->resume_world, &p->plan0) != MUSTER_OK ||
      (p->spec.cfg.strategy != PART_DYNAMIC && (p->prefix0 = iter_plan_prefix(p->plan0)) == NULL))
    return fail_set(f, MUSTER_STORE, "iteration %s: the checkpoint's plan does not build",
                    row->name);
  json_t *done = json_loads(row->resume_done ? row->resume_done : "[]", 0, NULL);
  err = iter_ranges_parse(done, iter_plan_units(p->plan0, p->prefix0), "resume_done", &p->done0,
                          &p->ndone0, &p->done0_units, f);
  json_decref(done);
  return err;
}

static uint64_t row_hash(const iter_row_t *row) {
  uint64_t h = XXH3_64bits_withSeed(row->config, strlen(row->config), (uint64_t)row->resume_epoch);
  if (row->resume_done)
    h = XXH3_64bits_withSeed(row->resume_done, strlen(row->resume_done), h);
  return h;
}

muster_err_t iter_plans_get(const iter_row_t *row, iter_plans_t **out, fail_t *f) {
  uint64_t hash = row_hash(row);
  int victim = 0;
  for (int i = 0; i < ITER_CACHE_SLOTS; i++) {
    iter_plans_t *p = cache[i];
    if (p && p->id == row->id && p->text_hash == hash) {
      p->last_used = ++cache_clock;
      *out = p;
      return MUSTER_OK;
    }
    if (cache[victim] != NULL && (p == NULL || p->last_used < cache[victim]->last_used))
      victim = i;
  }
  iter_plans_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  if (plans_build(row, p, f)) {
    plans_free(p);
    return f->code;
  }
  iter_plans_forget(row->id); /* an older entry of the same row */
  if (cache[victim])
    plans_free(cache[victim]);
  p->id = row->id;
  p->text_hash = hash;
  p->last_used = ++cache_clock;
  cache[victim] = p;
  *out = p;
  return MUSTER_OK;
}

void iter_layout_of(const iter_row_t *row, iter_plans_t *p, iter_layout_t *lay) {
  bool resumed = row->resume_epoch >= 0 && row->resume_epoch == row->epoch && p->plan0;
  memset(lay, 0, sizeof *lay);
  lay->plan = resumed ? p->plan0 : p->plan;
  lay->prefix = resumed ? p->prefix0 : p->prefix;
  lay->dynamic = p->spec.cfg.strategy == PART_DYNAMIC;
  lay->world = p->spec.cfg.world_size;
  lay->dealt = resumed && !lay->dynamic && (uint32_t)row->resume_world != lay->world;
  lay->lanes = lay->dynamic ? 1 : lay->world;
  lay->units = iter_plan_units(lay->plan, lay->prefix);
  if (resumed) {
    lay->done = p->done0;
    lay->ndone = p->ndone0;
    lay->done_units = p->done0_units;
  }
}

uint64_t iter_lane_blocks(const iter_layout_t *lay, uint32_t lane) {
  if (lay->dynamic)
    return lay->units;
  if (lay->dealt)
    return lay->units / lay->world + (lane < lay->units % lay->world);
  return lay->prefix[lane + 1] - lay->prefix[lane];
}

uint64_t iter_lane_unit(const iter_layout_t *lay, uint32_t lane, uint64_t k) {
  if (lay->dynamic)
    return k;
  if (lay->dealt)
    return lane + k * lay->world;
  return lay->prefix[lane] + k;
}

/* The legacy done range holding g, or NULL. */
static const part_range_t *done_range(const iter_layout_t *lay, uint64_t g) {
  size_t lo = 0, hi = lay->ndone;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (lay->done[mid].end <= g)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < lay->ndone && lay->done[lo].begin <= g ? &lay->done[lo] : NULL;
}

uint64_t iter_lane_skip(const iter_layout_t *lay, uint32_t lane, uint64_t k) {
  uint64_t count = iter_lane_blocks(lay, lane);
  while (k < count && lay->ndone > 0) {
    uint64_t g = iter_lane_unit(lay, lane, k);
    const part_range_t *r = done_range(lay, g);
    if (r == NULL)
      break;
    if (lay->dealt) /* the first k whose block lane + k*W is at or past r->end */
      k = (r->end - lane + lay->world - 1) / lay->world;
    else
      k += r->end - g;
  }
  return k;
}

void iter_unit_desc(const iter_layout_t *lay, uint64_t g, int64_t *plan_rank, uint64_t *begin,
                    uint64_t *end) {
  if (lay->dynamic) {
    *plan_rank = -1;
    part_block_positions(lay->plan, g, begin, end);
    return;
  }
  uint32_t lo = 0, hi = part_plan_config(lay->plan)->world_size; /* last q: prefix[q] <= g */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (lay->prefix[mid] <= g)
      lo = mid;
    else
      hi = mid;
  }
  while (lay->prefix[lo + 1] <= g) /* skip ranks without blocks */
    lo++;
  uint64_t j = g - lay->prefix[lo], size = part_plan_config(lay->plan)->block_size;
  uint64_t len = part_rank_len(lay->plan, lo);
  *plan_rank = lo;
  *begin = j * size;
  *end = len - *begin < size ? len : *begin + size;
}

/* The cached stream of plan rank `rank`, created on first use. */
static stream_t *plans_stream(iter_plans_t *p, const part_plan_t *plan, uint32_t rank) {
  if (p->streams_plan != plan) {
    if (p->streams) {
      for (uint32_t r = 0; r < part_plan_config(p->streams_plan)->world_size; r++)
        stream_destroy(p->streams[r]);
      free(p->streams);
    }
    p->streams = calloc(part_plan_config(plan)->world_size, sizeof *p->streams);
    p->streams_plan = p->streams ? plan : NULL;
    if (p->streams == NULL)
      return NULL;
  }
  if (p->streams[rank] == NULL && stream_create(plan, rank, &p->streams[rank]) != MUSTER_OK)
    return NULL;
  return p->streams[rank];
}

/* Appends ",index" (without the comma before the first, `pos` == `begin`). */
static inline void indices_add(jw_buf_t *out, uint64_t pos, uint64_t begin, uint64_t index) {
  if (pos != begin)
    JW_ADD_LITERAL(out, ",");
  jw_add_int(out, (int64_t)index);
}

muster_err_t iter_unit_indices(iter_plans_t *p, const iter_layout_t *lay, uint64_t epoch,
                               uint64_t g, jw_buf_t *out, fail_t *f) {
  int64_t rank;
  uint64_t begin, end;
  iter_unit_desc(lay, g, &rank, &begin, &end);
  /* Indices are below DATASET_MAX_SAMPLES (2^48): 15 digits and a comma. */
  jw_reserve(out, 2 + (size_t)(end - begin) * 16);
  JW_ADD_LITERAL(out, "[");
  if (rank < 0) {
    if (p->ep == NULL || p->ep_plan != lay->plan || part_epoch_number(p->ep) != epoch) {
      part_epoch_destroy(p->ep);
      p->ep = NULL;
      if (part_epoch_create(lay->plan, epoch, &p->ep) != MUSTER_OK)
        return fail_set(f, MUSTER_NOMEM, "out of memory");
      p->ep_plan = lay->plan;
    }
    for (uint64_t pos = begin; pos < end; pos++)
      indices_add(out, pos, begin, part_epoch_index(p->ep, pos));
    JW_ADD_LITERAL(out, "]");
    return MUSTER_OK;
  }
  stream_t *s = plans_stream(p, lay->plan, (uint32_t)rank);
  if (s == NULL || (stream_epoch(s) != epoch && stream_set_epoch(s, epoch) != MUSTER_OK))
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  /* Ranks lease their blocks in order, so the stream usually is where the
   * block begins; a seek (a scan, for sample strategies) happens otherwise. */
  if (stream_emitted(s) != begin && stream_seek(s, begin) != MUSTER_OK)
    return fail_set(f, MUSTER_INTERNAL, "block %llu: cannot seek", (unsigned long long)g);
  uint64_t index;
  for (uint64_t i = begin; i < end && stream_next(s, &index); i++)
    indices_add(out, i, begin, index);
  JW_ADD_LITERAL(out, "]");
  return MUSTER_OK;
}

muster_err_t iter_block_write(iter_plans_t *plans, const iter_layout_t *lay, uint64_t epoch,
                              const iter_block_t *b, bool indices, jw_buf_t *out, fail_t *f) {
  int64_t plan_rank;
  uint64_t begin, end;
  iter_unit_desc(lay, b->block, &plan_rank, &begin, &end);
  JW_ADD_LITERAL(out, "{\"block\":");
  jw_add_int(out, (int64_t)b->block);
  JW_ADD_LITERAL(out, ",\"token\":");
  jw_add_int(out, b->token);
  JW_ADD_LITERAL(out, ",\"deadline_ms\":");
  jw_add_int(out, b->deadline_ms);
  JW_ADD_LITERAL(out, ",\"rank\":");
  if (plan_rank >= 0)
    jw_add_int(out, plan_rank);
  else
    JW_ADD_LITERAL(out, "null");
  JW_ADD_LITERAL(out, ",\"begin\":");
  jw_add_int(out, (int64_t)begin);
  JW_ADD_LITERAL(out, ",\"end\":");
  jw_add_int(out, (int64_t)end);
  if (b->takeover)
    JW_ADD_LITERAL(out, ",\"takeover\":true");
  else
    JW_ADD_LITERAL(out, ",\"takeover\":false");
  if (indices) {
    JW_ADD_LITERAL(out, ",\"indices\":");
    if (iter_unit_indices(plans, lay, epoch, b->block, out, f))
      return f->code;
  }
  JW_ADD_LITERAL(out, "}");
  return out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}
