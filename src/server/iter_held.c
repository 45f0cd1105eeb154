/*
 * iter_held.c — GET /v1/iterations/{name}/held?rank=R: the blocks a rank
 * holds (leased to it in the current epoch and not acknowledged), listed,
 * and nothing else done.
 *
 * `next` with "held": true sends the same blocks again, but it is the retry
 * of a lease: it extends their leases, leases more up to `max` and counts as
 * the rank's heartbeat.  This listing changes nothing — no lease, no
 * extension, no heartbeat, no counter — so an operator may look at a stuck
 * rank without keeping it alive (with the read-only token too: it is a GET),
 * and a restarted loader may see what it holds before it asks for more.
 * docs/design-notes.md, "Listing a rank's held blocks", says why it is a GET
 * of its own rather than an option of `next`.
 *
 * The query is parsed here, from a lookup the caller gives, for the head's
 * route (iter_routes.c) and the node agent's (src/node/iter_local.c) alike,
 * so that both refuse the same input in the same words.
 */
#include "iter.h"
#include "iter_internal.h"
#include "jw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Reads query parameter `key` as an integer in [min, max] into *out
 * (`dflt` when absent), or fails as the head's other query integers do. */
static muster_err_t held_int(iter_query_fn get, void *ctx, const char *key, int64_t dflt,
                             int64_t min, int64_t max, int64_t *out, fail_t *f) {
  return query_int_read(get(ctx, key), key, dflt, min, max, out, f);
}

muster_err_t iter_held_query(iter_query_fn get, void *ctx, iter_held_query_t *q, fail_t *f) {
  memset(q, 0, sizeof *q);
  if (held_int(get, ctx, "rank", -1, 0, PART_MAX_WORLD_SIZE - 1, &q->rank, f) ||
      held_int(get, ctx, "cursor", 0, 0, INT64_MAX, &q->cursor, f) ||
      held_int(get, ctx, "max", 0, 1, ITER_MAX_BATCH, &q->max, f))
    return f->code;
  if (q->rank < 0)
    return fail_set(f, MUSTER_INVALID,
                    "query rank: missing; name the rank whose blocks to list (?rank=R)");
  const char *indices = get(ctx, "indices");
  if (indices && strcmp(indices, "true") != 0 && strcmp(indices, "false") != 0)
    return fail_set(f, MUSTER_INVALID, "query indices: '%.40s' is not true or false", indices);
  q->indices = indices && strcmp(indices, "true") == 0;
  return MUSTER_OK;
}

/* The page size of `q` for blocks of `block_size` samples: its `max`, or
 * ITER_MAX_BATCH when none was given, fewer when indices are asked for so
 * that the reply holds at most ITER_MAX_INDICES of them.  -1 with *f filled
 * when a given `max` (or one block) holds more indices than that. */
static int64_t held_page(const iter_held_query_t *q, uint64_t block_size, fail_t *f) {
  int64_t max = q->max ? q->max : ITER_MAX_BATCH;
  if (!q->indices || (uint64_t)max * block_size <= ITER_MAX_INDICES)
    return max;
  if (q->max == 0 && block_size <= ITER_MAX_INDICES)
    return (int64_t)(ITER_MAX_INDICES / block_size);
  fail_set(f, MUSTER_BATCH_TOO_LARGE,
           "query max: %lld blocks of %llu samples with their indices are more than the %u "
           "indices one reply may hold; ask for fewer, or without indices",
           (long long)max, (unsigned long long)block_size, ITER_MAX_INDICES);
  return -1;
}

/* The number of blocks `rank` holds in the current epoch of `row`, or -1
 * with *f filled.  INDEXED BY: as the status's lease count (iter_status.c). */
static int64_t held_total(store_t *st, const iter_row_t *row, int64_t rank, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT count(*) FROM iter_blocks INDEXED BY"
                                   " iter_blocks_by_rank WHERE iter = ?1 AND rank = ?2 AND"
                                   " state = 1 AND epoch = ?3");
  if (s == NULL) {
    store_fail(st, f, "held blocks");
    return -1;
  }
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, rank);
  sqlite3_bind_int64(s, 3, row->epoch);
  int64_t total = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return total;
}

/* A held block's row: the block, its token, its lane, its deadline. */
typedef struct {
  int64_t block, token, lane, deadline_ms;
} held_row_t;

/* Reads up to `max` + 1 held blocks of `rank` numbered `cursor` or above,
 * lowest first, into rows[] (room for ITER_MAX_BATCH + 1); returns how many,
 * or -1 with *f filled.  The one past `max` only says where the next page
 * starts. */
static int64_t held_rows(store_t *st, const iter_row_t *row, int64_t rank, int64_t cursor,
                         int64_t max, held_row_t *rows, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT block, token, lane, deadline_ms FROM iter_blocks"
                                   " INDEXED BY iter_blocks_by_rank WHERE iter = ?1 AND"
                                   " rank = ?2 AND state = 1 AND epoch = ?3 AND block >= ?4"
                                   " ORDER BY block LIMIT ?5");
  if (s == NULL) {
    store_fail(st, f, "held blocks");
    return -1;
  }
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, rank);
  sqlite3_bind_int64(s, 3, row->epoch);
  sqlite3_bind_int64(s, 4, cursor);
  sqlite3_bind_int64(s, 5, max + 1);
  int64_t n = 0;
  while (n <= max && sqlite3_step(s) == SQLITE_ROW) {
    rows[n] = (held_row_t){sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
                           sqlite3_column_int64(s, 2), sqlite3_column_int64(s, 3)};
    n++;
  }
  store_reset(s);
  return n;
}

/* Writes the first `count` of rows[] as the reply's block list into `out`,
 * each as `next` lists it (iter_block_write); a block of another rank's
 * lane is a takeover, as `next` with "held" marks it. */
static muster_err_t held_write(iter_plans_t *plans, const iter_row_t *row, const held_row_t *rows,
                               int64_t count, int64_t rank, bool indices, jw_buf_t *out,
                               fail_t *f) {
  iter_layout_t lay;
  iter_layout_of(row, plans, &lay);
  JW_ADD_LITERAL(out, "[");
  for (int64_t i = 0; i < count; i++) {
    iter_block_t b = {.block = (uint64_t)rows[i].block,
                      .token = rows[i].token,
                      .deadline_ms = rows[i].deadline_ms,
                      .takeover = !lay.dynamic && rows[i].lane != rank};
    if (i > 0)
      JW_ADD_LITERAL(out, ",");
    if (iter_block_write(plans, &lay, (uint64_t)row->epoch, &b, indices, out, f))
      return f->code;
  }
  JW_ADD_LITERAL(out, "]");
  return out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

json_t *iter_held(store_t *st, const char *name, const iter_held_query_t *q, fail_t *f) {
  iter_row_t row = {0};
  iter_plans_t *plans;
  jw_buf_t list = {0};
  json_t *out = NULL, *blocks;
  held_row_t *rows = NULL;
  int64_t page, total, count;
  if (iter_row_load(st, name, &row, f) || iter_plans_get(&row, &plans, f))
    goto done;
  if (q->rank >= plans->spec.cfg.world_size) {
    fail_set(f, MUSTER_INVALID, "query rank: %lld is not below world_size (%u)", (long long)q->rank,
             plans->spec.cfg.world_size);
    goto done;
  }
  if ((page = held_page(q, plans->spec.cfg.block_size, f)) < 0 ||
      (total = held_total(st, &row, q->rank, f)) < 0)
    goto done;
  if ((rows = malloc((size_t)(page + 1) * sizeof *rows)) == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    goto done;
  }
  if ((count = held_rows(st, &row, q->rank, q->cursor, page, rows, f)) < 0 ||
      held_write(plans, &row, rows, count > page ? page : count, q->rank, q->indices, &list, f))
    goto done;
  if ((blocks = jw_raw(list.buf, list.len)) == NULL ||
      (out = json_pack("{s:I, s:I, s:b, s:I, s:o, s:o}", "rank", (json_int_t)q->rank, "epoch",
                       (json_int_t)row.epoch, "finished", row.finished, "total", (json_int_t)total,
                       "blocks", blocks, "next",
                       count > page ? json_integer(rows[page].block) : json_null())) == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
done:
  free(rows);
  jw_buf_free(&list);
  iter_row_free(&row);
  return out;
}
