/*
 * iter_lease.c — ranks lease blocks of an iteration's current epoch,
 * acknowledge them, heart-beat, and lose them when they fall silent.
 *
 * Every lease carries a fencing token from the store's one counter (the
 * same one task leases use), so an acknowledgement from a rank that lost its
 * block (expired, taken over) is refused with lease_lost and changes
 * nothing: a block is done exactly once.  The same acknowledgement sent
 * again (its reply was lost), in the current epoch or after the epoch it
 * acknowledged in completed, as long as that is the last completed one,
 * finds its blocks done under its tokens by its rank and is answered as a
 * repeat that counts nothing (the rows of the last completed epoch are kept
 * for it, iter.c).  A rank leases, in this order:
 * returned blocks of its own lane, then fresh blocks of its lane, then —
 * static strategies with replication > 1 — the returned and fresh blocks of
 * failed ranks it replicates (ranks r - 1 ... r - (replication - 1)).
 * `dynamic` has one lane that every rank shares.
 */
#include "iter.h"
#include "iter_internal.h"
#include "jv.h"
#include "jw.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

muster_err_t iter_rank_touch(store_t *st, const iter_row_t *row, int64_t rank, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE iter_ranks SET state = 1, last_seen_ms = ?3,"
                                   " deadline_ms = ?3 + ?4, first_ms = coalesce(first_ms, ?3)"
                                   " WHERE iter = ?1 AND rank = ?2");
  if (s == NULL)
    return store_fail(st, f, "rank heartbeat");
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, rank);
  sqlite3_bind_int64(s, 3, now_ms());
  sqlite3_bind_int64(s, 4, row->set.rank_timeout_ms);
  return store_step_done(st, s, f);
}

static int rank_state(store_t *st, int64_t id, int64_t rank) {
  sqlite3_stmt *s = store_stmt(st, "SELECT state FROM iter_ranks WHERE iter = ?1 AND rank = ?2");
  int state = ITER_RANK_UNKNOWN;
  if (s == NULL)
    return state;
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, rank);
  if (sqlite3_step(s) == SQLITE_ROW)
    state = sqlite3_column_int(s, 0);
  store_reset(s);
  return state;
}

/* Adds to a rank's counters. */
static muster_err_t rank_count(store_t *st, int64_t id, int64_t rank, int64_t samples,
                               int64_t blocks, int64_t taken, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE iter_ranks SET samples = samples + ?3,"
                                   " blocks = blocks + ?4, taken_over = taken_over + ?5"
                                   " WHERE iter = ?1 AND rank = ?2");
  if (s == NULL)
    return store_fail(st, f, "rank counters");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, rank);
  sqlite3_bind_int64(s, 3, samples);
  sqlite3_bind_int64(s, 4, blocks);
  sqlite3_bind_int64(s, 5, taken);
  return store_step_done(st, s, f);
}

/* What one next request is doing. */
typedef struct {
  store_t *st;
  iter_row_t *row;
  iter_plans_t *plans;
  iter_layout_t lay;
  int64_t rank;
  int64_t max;
  bool indices;
  bool resending; /* re-sending blocks the rank holds (body.held): counted before */
  int64_t deadline;
  /* The reply's list as text, "[" and the block objects so far (jw.h): with
   * indices a reply lists up to 2^20 of them, written as text rather than
   * as a json_t each. */
  jw_buf_t blocks;
  int64_t count; /* blocks in it */
} lease_ctx_t;

/* Adds block g (now leased under `token`) to the reply (iter_block_write),
 * counting a takeover that is not a resend. */
static muster_err_t reply_block(lease_ctx_t *c, uint64_t g, int64_t token, bool takeover,
                                fail_t *f) {
  if (c->count++ > 0)
    JW_ADD_LITERAL(&c->blocks, ",");
  if (takeover && !c->resending && rank_count(c->st, c->row->id, c->rank, 0, 0, 1, f))
    return f->code;
  iter_block_t b = {.block = g, .token = token, .deadline_ms = c->deadline, .takeover = takeover};
  return iter_block_write(c->plans, &c->lay, (uint64_t)c->row->epoch, &b, c->indices, &c->blocks,
                          f);
}

/* Leases the lane's returned blocks, lowest first.  INDEXED BY: without
 * statistics the planner may walk the primary key in block order instead,
 * every row of the epoch (and of the last one) at every lease. */
static muster_err_t lease_pending(lease_ctx_t *c, uint32_t lane, bool takeover, fail_t *f) {
  sqlite3_stmt *s = store_stmt(c->st, "SELECT block FROM iter_blocks INDEXED BY"
                                      " iter_blocks_pending WHERE iter = ?1 AND lane = ?2 AND"
                                      " state = 0 ORDER BY block LIMIT ?3");
  sqlite3_stmt *u = store_stmt(c->st, "UPDATE iter_blocks SET state = 1, rank = ?3, token = ?4,"
                                      " deadline_ms = ?5 WHERE iter = ?1 AND epoch = ?6 AND"
                                      " block = ?2");
  if (s == NULL || u == NULL)
    return store_fail(c->st, f, "block lease");
  int64_t want = c->max - c->count, got = 0;
  uint64_t found[ITER_MAX_BATCH];
  sqlite3_bind_int64(s, 1, c->row->id);
  sqlite3_bind_int64(s, 2, lane);
  sqlite3_bind_int64(s, 3, want);
  while (got < want && sqlite3_step(s) == SQLITE_ROW)
    found[got++] = (uint64_t)sqlite3_column_int64(s, 0);
  store_reset(s);
  for (int64_t i = 0; i < got; i++) {
    int64_t token = store_next_token(c->st);
    sqlite3_bind_int64(u, 1, c->row->id);
    sqlite3_bind_int64(u, 2, (int64_t)found[i]);
    sqlite3_bind_int64(u, 3, c->rank);
    sqlite3_bind_int64(u, 4, token);
    sqlite3_bind_int64(u, 5, c->deadline);
    sqlite3_bind_int64(u, 6, c->row->epoch);
    if (store_step_done(c->st, u, f) ||
        reply_block(c, found[i], token, takeover || c->lay.dynamic, f))
      return f->code;
  }
  return MUSTER_OK;
}

/* Leases never-leased blocks from the lane's frontier. */
static muster_err_t lease_fresh(lease_ctx_t *c, uint32_t lane, bool takeover, fail_t *f) {
  sqlite3_stmt *s = store_stmt(c->st, "SELECT next FROM iter_lanes WHERE iter = ?1 AND lane = ?2");
  sqlite3_stmt *ins = store_stmt(c->st, "INSERT INTO iter_blocks(iter, epoch, block, lane, state,"
                                        " rank, token, deadline_ms) VALUES(?1, ?7, ?2, ?3, 1, ?4,"
                                        " ?5, ?6)");
  sqlite3_stmt *save = store_stmt(c->st, "INSERT INTO iter_lanes(iter, lane, next)"
                                         " VALUES(?1, ?2, ?3) ON CONFLICT(iter, lane)"
                                         " DO UPDATE SET next = excluded.next");
  if (s == NULL || ins == NULL || save == NULL)
    return store_fail(c->st, f, "block lease");
  uint64_t k = 0, count = iter_lane_blocks(&c->lay, lane);
  sqlite3_bind_int64(s, 1, c->row->id);
  sqlite3_bind_int64(s, 2, lane);
  if (sqlite3_step(s) == SQLITE_ROW)
    k = (uint64_t)sqlite3_column_int64(s, 0);
  store_reset(s);
  uint64_t start = k;
  while (c->count < c->max) {
    k = iter_lane_skip(&c->lay, lane, k);
    if (k >= count)
      break;
    uint64_t g = iter_lane_unit(&c->lay, lane, k++);
    int64_t token = store_next_token(c->st);
    sqlite3_bind_int64(ins, 1, c->row->id);
    sqlite3_bind_int64(ins, 2, (int64_t)g);
    sqlite3_bind_int64(ins, 3, lane);
    sqlite3_bind_int64(ins, 4, c->rank);
    sqlite3_bind_int64(ins, 5, token);
    sqlite3_bind_int64(ins, 6, c->deadline);
    sqlite3_bind_int64(ins, 7, c->row->epoch);
    if (store_step_done(c->st, ins, f) || reply_block(c, g, token, takeover, f))
      return f->code;
  }
  if (k == start)
    return MUSTER_OK;
  sqlite3_bind_int64(save, 1, c->row->id);
  sqlite3_bind_int64(save, 2, lane);
  sqlite3_bind_int64(save, 3, (int64_t)k);
  return store_step_done(c->st, save, f);
}

/* Re-sends the blocks this rank holds in the epoch, lowest first, under
 * their tokens and with their leases extended to c->deadline (body.held: the
 * retry of a next whose reply was lost, whose blocks the rank never heard
 * of; heartbeats would extend them for ever).  A block of another rank's
 * lane is marked a takeover, and was counted as one when it was leased. */
static muster_err_t lease_held(lease_ctx_t *c, fail_t *f) {
  sqlite3_stmt *s = store_stmt(c->st, "SELECT block, token, lane FROM iter_blocks INDEXED BY"
                                      " iter_blocks_by_rank WHERE iter = ?1 AND rank = ?2 AND"
                                      " state = 1 AND epoch = ?3 ORDER BY block LIMIT ?4");
  sqlite3_stmt *u = store_stmt(c->st, "UPDATE iter_blocks SET deadline_ms = ?4 WHERE iter = ?1"
                                      " AND epoch = ?2 AND block = ?3");
  if (s == NULL || u == NULL)
    return store_fail(c->st, f, "block lease");
  int64_t found[ITER_MAX_BATCH][3], n = 0;
  sqlite3_bind_int64(s, 1, c->row->id);
  sqlite3_bind_int64(s, 2, c->rank);
  sqlite3_bind_int64(s, 3, c->row->epoch);
  sqlite3_bind_int64(s, 4, c->max);
  while (n < c->max && sqlite3_step(s) == SQLITE_ROW) {
    for (int k = 0; k < 3; k++)
      found[n][k] = sqlite3_column_int64(s, k);
    n++;
  }
  store_reset(s);
  c->resending = true;
  for (int64_t i = 0; i < n; i++) {
    sqlite3_bind_int64(u, 1, c->row->id);
    sqlite3_bind_int64(u, 2, c->row->epoch);
    sqlite3_bind_int64(u, 3, found[i][0]);
    sqlite3_bind_int64(u, 4, c->deadline);
    bool takeover = !c->lay.dynamic && found[i][2] != c->rank;
    if (store_step_done(c->st, u, f) ||
        reply_block(c, (uint64_t)found[i][0], found[i][1], takeover, f))
      return f->code;
  }
  c->resending = false;
  return MUSTER_OK;
}

/* Leases up to c->max blocks from the lanes this rank may take. */
static muster_err_t lease_blocks(lease_ctx_t *c, fail_t *f) {
  if (c->lay.dynamic)
    return lease_pending(c, 0, true, f) || lease_fresh(c, 0, false, f) ? f->code : MUSTER_OK;
  uint32_t world = c->lay.world;
  for (int64_t d = 0; d < c->row->set.replication; d++) {
    uint32_t lane = (uint32_t)((c->rank + world - d) % world);
    if (c->count >= c->max)
      break;
    if (d > 0 && rank_state(c->st, c->row->id, lane) != ITER_RANK_FAILED)
      continue;
    if (lease_pending(c, lane, d > 0, f) || lease_fresh(c, lane, d > 0, f))
      return f->code;
  }
  return MUSTER_OK;
}

/* Loads the row and its plans and checks `rank` (body.rank) against them. */
static muster_err_t load_for_rank(store_t *st, const char *name, const json_t *body,
                                  iter_row_t *row, iter_plans_t **plans, int64_t *rank, fail_t *f) {
  if (jv_int(body, "rank", "", -1, 0, PART_MAX_WORLD_SIZE - 1, rank, f))
    return f->code;
  if (*rank < 0)
    return fail_set(f, MUSTER_INVALID, "rank: missing");
  if (iter_row_load(st, name, row, f) || iter_plans_get(row, plans, f))
    return f->code;
  if (*rank >= (*plans)->spec.cfg.world_size)
    return fail_set(f, MUSTER_INVALID, "rank: %lld is not below world_size (%u)", (long long)*rank,
                    (*plans)->spec.cfg.world_size);
  return iter_rank_touch(st, row, *rank, f);
}

/* The reply {"state", "epoch", "blocks"[, "retry_ms"]} (new reference);
 * `blocks` (taken; NULL: an empty list) is a raw node of the list's text
 * (jw.h), which only jw_dump writes.  NULL when memory ran out. */
static json_t *next_reply(const char *state, int64_t epoch, json_t *blocks) {
  json_t *out = json_pack("{s:s, s:I, s:o}", "state", state, "epoch", (json_int_t)epoch, "blocks",
                          blocks ? blocks : json_array());
  if (out && strcmp(state, "wait") == 0)
    json_object_set_new(out, "retry_ms", json_integer(ITER_RETRY_MS));
  return out;
}

/* Leases up to c->max blocks of the iteration's current epoch for c->rank
 * (after the blocks it holds, with HELD) and builds the reply. */
static json_t *next_blocks(lease_ctx_t *c, iter_row_t *row, bool held, fail_t *f) {
  json_t *out = NULL;
  c->row = row;
  iter_layout_of(row, c->plans, &c->lay);
  c->deadline = now_ms() + row->set.lease_ms;
  JW_ADD_LITERAL(&c->blocks, "[");
  if ((!held || lease_held(c, f) == MUSTER_OK) && lease_blocks(c, f) == MUSTER_OK) {
    JW_ADD_LITERAL(&c->blocks, "]");
    json_t *list = c->blocks.failed ? NULL : jw_raw(c->blocks.buf, c->blocks.len);
    out = list ? next_reply(c->count ? "blocks" : "wait", row->epoch, list) : NULL;
    if (out == NULL)
      fail_set(f, MUSTER_NOMEM, "out of memory");
  }
  return out;
}

json_t *iter_next(store_t *st, const char *name, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {"rank", "epoch", "max", "indices", "held", NULL};
  lease_ctx_t c = {.st = st};
  iter_row_t row = {0};
  int64_t epoch;
  bool held;
  json_t *out = NULL;
  if (jv_only(body, "", allowed, f) || jv_int(body, "max", "", 1, 1, INT64_MAX, &c.max, f) ||
      jv_bool(body, "indices", "", false, &c.indices, f) ||
      jv_bool(body, "held", "", false, &held, f) ||
      load_for_rank(st, name, body, &row, &c.plans, &c.rank, f) ||
      jv_int(body, "epoch", "", row.epoch, 0, INT64_MAX, &epoch, f))
    goto done;
  if (c.max > ITER_MAX_BATCH ||
      (c.indices && (uint64_t)c.max * c.plans->spec.cfg.block_size > ITER_MAX_INDICES)) {
    fail_set(f, MUSTER_BATCH_TOO_LARGE,
             "max: %lld blocks, at most %d allowed (and at most %u "
             "indices in one reply)",
             (long long)c.max, ITER_MAX_BATCH, ITER_MAX_INDICES);
    goto done;
  }
  if (row.finished) {
    out = next_reply("finished", row.epoch, NULL);
  } else if (epoch < row.epoch) {
    out = next_reply("epoch_end", row.epoch, NULL);
  } else if (epoch > row.epoch + 1) {
    fail_set(f, MUSTER_INVALID, "epoch: %lld is ahead of the iteration's epoch %lld",
             (long long)epoch, (long long)row.epoch);
  } else if (epoch > row.epoch) {
    out = next_reply("wait", row.epoch, NULL); /* the others are finishing the epoch */
  } else {
    out = next_blocks(&c, &row, held, f);
  }
done:
  jw_buf_free(&c.blocks);
  iter_row_free(&row);
  return out;
}

/* ---- acknowledgements --------------------------------------------------------- */

/* What became of an acknowledgement's blocks besides being done now. */
typedef struct {
  int64_t repeated;   /* acknowledged before under the same token */
  int64_t last_epoch; /* of those, blocks of the last completed epoch */
  int64_t final;      /* of those, blocks the acknowledgement that completed it named */
} ack_counts_t;

/* A block's row of one epoch, as an acknowledgement reads it. */
typedef struct {
  int state;     /* ITER_BLOCK_*, or -1: no row */
  int64_t token; /* its lease's or its acknowledgement's, 0: none */
  int64_t rank;  /* its holder's, -1: none */
} block_row_t;

/* Reads element `i` of an acknowledgement's blocks: its name ("blocks[i]")
 * into ctx (32 bytes), its block and its token. */
static muster_err_t ack_elem(const json_t *elem, size_t i, char *ctx, int64_t *block,
                             int64_t *token, fail_t *f) {
  static const char *const allowed[] = {"block", "token", NULL};
  snprintf(ctx, 32, "blocks[%zu]", i);
  if (jv_only(elem, ctx, allowed, f) || jv_int(elem, "block", ctx, -1, 0, INT64_MAX, block, f) ||
      jv_int(elem, "token", ctx, 0, 1, JV_ID_MAX, token, f))
    return f->code;
  if (*block < 0 || *token == 0)
    return fail_set(f, MUSTER_INVALID, "%s: needs \"block\" and \"token\"", ctx);
  return MUSTER_OK;
}

/* Reads the row of `block` in epoch `epoch` of iteration `id` into *out. */
static muster_err_t block_row(store_t *st, int64_t id, int64_t epoch, int64_t block,
                              block_row_t *out, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT state, coalesce(token, 0), coalesce(rank, -1)"
                                   " FROM iter_blocks WHERE iter = ?1 AND epoch = ?2 AND"
                                   " block = ?3");
  if (s == NULL)
    return store_fail(st, f, "block ack");
  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, epoch);
  sqlite3_bind_int64(s, 3, block);
  int rc = sqlite3_step(s);
  *out = (block_row_t){-1, 0, -1};
  if (rc == SQLITE_ROW)
    *out = (block_row_t){sqlite3_column_int(s, 0), sqlite3_column_int64(s, 1),
                         sqlite3_column_int64(s, 2)};
  store_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "block ack");
}

/* Whether row `r` is of a block acknowledged under `token` by `rank`.  A
 * done block keeps the token and the rank that acknowledged it (tokens are
 * never reused), so the same acknowledgement again — a retry whose reply was
 * lost — is told apart from a lease that ended, and from another rank
 * sending that token.  A row migrated from iter_final_acks (schema 15) has
 * no rank on record: any rank's retry of it is taken as the one. */
static bool acked_under(const block_row_t *r, int64_t token, int64_t rank) {
  return r->state >= ITER_BLOCK_DONE && r->token == token && (r->rank < 0 || r->rank == rank);
}

/* Whether row `r` is of a block acknowledged under `token` by a rank other
 * than `rank`: not a retry of `rank`'s, which is refused. */
static bool acked_by_other(const block_row_t *r, int64_t token, int64_t rank) {
  return r->state >= ITER_BLOCK_DONE && r->token == token && !acked_under(r, token, rank);
}

/* Marks the rows of `blocks`, the acknowledgement that just completed epoch
 * `epoch`, ITER_BLOCK_FINAL (each under its token), so that a retry of that
 * acknowledgement is answered as it was.  At most ITER_MAX_BATCH rows, once
 * per epoch. */
static muster_err_t final_mark(store_t *st, int64_t id, int64_t epoch, const json_t *blocks,
                               fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "UPDATE iter_blocks SET state = 3 WHERE iter = ?1 AND"
                                   " epoch = ?2 AND block = ?3 AND token = ?4");
  if (s == NULL)
    return store_fail(st, f, "final acknowledgement");
  for (size_t i = 0; i < json_array_size(blocks); i++) {
    const json_t *elem = json_array_get(blocks, i); /* checked by ack_elem */
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int64(s, 2, epoch);
    sqlite3_bind_int64(s, 3, json_integer_value(json_object_get(elem, "block")));
    sqlite3_bind_int64(s, 4, json_integer_value(json_object_get(elem, "token")));
    if (store_step_done(st, s, f))
      return f->code;
  }
  return MUSTER_OK;
}

/*
 * Refuses element `ctx` of an acknowledgement by `rank` of `block` under
 * `token`, the block now leased (row `now`) under another token.  Tokens
 * come from the store's one counter, so a newer one means the block was
 * leased again after `token` was handed out: if `token` was this block's,
 * its lease ended (iter_expire_due ends a lease when it expires or its rank
 * fails), and the block's indices are read under the new lease; it may also
 * be another block's token (the head keeps no history to tell, and a search
 * of the epoch's blocks on a refusal is not worth it).  An older one means
 * `token` was never this block's lease in the epoch.
 */
static muster_err_t ack_leased_again(const iter_row_t *row, const block_row_t *now, int64_t rank,
                                     int64_t block, int64_t token, const char *ctx, fail_t *f) {
  char holder[64];
  if (now->rank == rank)
    snprintf(holder, sizeof holder, "rank %lld (the rank of this ack)", (long long)rank);
  else
    snprintf(holder, sizeof holder, "rank %lld (not %lld, the rank of this ack)",
             (long long)now->rank, (long long)rank);
  if (now->token > token)
    return fail_set(f, MUSTER_LEASE_LOST,
                    "%s: block %lld of epoch %lld is leased again, to %s under a token newer "
                    "than %lld: if token %lld was this block's lease, that lease ended (it "
                    "expired or its rank failed) and the block's indices are read under the "
                    "new lease; either way, drop this ack",
                    ctx, (long long)block, (long long)row->epoch, holder, (long long)token,
                    (long long)token);
  return fail_set(f, MUSTER_LEASE_LOST,
                  "%s: block %lld of epoch %lld is leased to %s under a token older than %lld, "
                  "so token %lld was never this block's lease in this epoch: acknowledge a block "
                  "with the token its lease came with",
                  ctx, (long long)block, (long long)row->epoch, holder, (long long)token,
                  (long long)token);
}

/* Why an ack of a block waiting to be leased again is refused; `owner` is
 * whom its ranks call. */
#define ACK_PENDING_WHY(owner)                                                                     \
  "it is waiting to be leased again (its lease expired or its rank failed), and its indices "     \
  "will be read under that new lease; drop this ack (a rank keeps its leases by calling " owner  \
  " within lease_ms)"

/* What an acknowledgement by `rank` under `token` of a block whose rows of
 * the current and the last completed epoch are `now` and `last` (neither
 * acknowledged under `token` by `rank`) is told: what became of the block
 * and what to do, written into buf (`size` bytes) when it names numbers.
 * NULL when the block is leased again under another token
 * (ack_leased_again says that). */
static const char *ack_not_held_why(const block_row_t *now, const block_row_t *last, int64_t rank,
                                    int64_t token, char *buf, size_t size) {
  static const char check_rank[] = "drop this ack, and check the rank it is sent as (a token is no "
                                   "credential another rank may use)";
  if (acked_by_other(now, token, rank) || acked_by_other(last, token, rank)) {
    const block_row_t *by = acked_by_other(now, token, rank) ? now : last;
    snprintf(buf, size,
             "it was acknowledged under that token%s by rank %lld, not %lld (the rank of this "
             "ack): rank %lld held that lease and acknowledged it; %s",
             by == last ? " in the last completed epoch" : "", (long long)by->rank, (long long)rank,
             (long long)by->rank, check_rank);
  } else if (now->state < 0) {
    return "it has not been leased in this epoch, so there is no lease to acknowledge: "
           "acknowledge only the blocks a next gave this rank, each with the token it came with "
           "(check the block and the epoch)";
  } else if (now->state == ITER_BLOCK_PENDING) {
    /* A node-local iteration's ranks call the agent that holds it, not the head. */
    return iter_node_name()[0] ? ACK_PENDING_WHY("its node agent") : ACK_PENDING_WHY("the head");
  } else if (now->state == ITER_BLOCK_LEASED && now->token != token) {
    return NULL;
  } else if (now->state == ITER_BLOCK_LEASED) {
    snprintf(buf, size,
             "it is leased under that token to rank %lld, not %lld (the rank of this ack): only "
             "the rank that holds a lease acknowledges it, once it has read the block; %s",
             (long long)now->rank, (long long)rank, check_rank);
  } else if (now->token > token) {
    snprintf(buf, size,
             "it was acknowledged under another token, newer than %lld: if token %lld was "
             "this block's lease, the block was leased again after that lease ended (it "
             "expired or its rank failed) and its indices were read under the new lease; "
             "either way, drop this ack",
             (long long)token, (long long)token);
  } else {
    snprintf(buf, size,
             "it was acknowledged under another token, older than %lld, so token %lld "
             "was never this block's lease in this epoch: acknowledge a block with the "
             "token its lease came with",
             (long long)token, (long long)token);
  }
  return buf;
}

/* The acknowledgement of `block` under `token` found it not leased under
 * that token in the current epoch.  The same acknowledgement again, of this
 * epoch or of the last completed one (a client that let the epoch default
 * names the current one), is a success that counts nothing (counted in *n).
 * Anything else is refused with what the block's row tells of it. */
static muster_err_t ack_not_held(store_t *st, const iter_row_t *row, uint64_t units, int64_t rank,
                                 int64_t block, int64_t token, const char *ctx, ack_counts_t *n,
                                 fail_t *f) {
  block_row_t now, last = {-1, 0, -1};
  if (block_row(st, row->id, row->epoch, block, &now, f) ||
      (!acked_under(&now, token, rank) && row->epoch > 0 &&
       block_row(st, row->id, row->epoch - 1, block, &last, f)))
    return f->code;
  /* No row in either epoch and past the end: no such block, not one unleased. */
  if (now.state < 0 && last.state < 0 && (uint64_t)block >= units)
    return fail_set(f, MUSTER_INVALID,
                    "%s.block: %lld, and epoch %lld has %llu blocks (0 to %llu): acknowledge "
                    "only the blocks a next gave this rank, each with the token it came with",
                    ctx, (long long)block, (long long)row->epoch, (unsigned long long)units,
                    (unsigned long long)(units ? units - 1 : 0));
  if (acked_under(&now, token, rank) || acked_under(&last, token, rank)) {
    n->repeated++;
    n->last_epoch += acked_under(&last, token, rank);
    n->final += acked_under(&last, token, rank) && last.state == ITER_BLOCK_FINAL;
    return MUSTER_OK;
  }
  char text[384];
  const char *why = ack_not_held_why(&now, &last, rank, token, text, sizeof text);
  if (why == NULL)
    return ack_leased_again(row, &now, rank, block, token, ctx, f);
  return fail_set(f, MUSTER_LEASE_LOST,
                  "%s: block %lld of epoch %lld is not leased under token %lld: %s", ctx,
                  (long long)block, (long long)row->epoch, (long long)token, why);
}

/* Marks one acknowledged block done after checking its token, keeping the
 * token in its row (ack_not_held); a repeated acknowledgement is counted in
 * *n and does nothing else. */
static muster_err_t ack_one(store_t *st, iter_row_t *row, const iter_layout_t *lay, int64_t rank,
                            const json_t *elem, size_t i, ack_counts_t *n, fail_t *f) {
  char ctx[32];
  int64_t block, token;
  if (ack_elem(elem, i, ctx, &block, &token, f))
    return f->code;
  /* Only the rank that holds the lease acknowledges it: a token is no
   * credential another rank may use. */
  sqlite3_stmt *s = store_stmt(st, "UPDATE iter_blocks SET state = 2, deadline_ms = NULL"
                                   " WHERE iter = ?1 AND epoch = ?5 AND block = ?2 AND"
                                   " state = 1 AND token = ?3 AND rank = ?4");
  if (s == NULL)
    return store_fail(st, f, "block ack");
  sqlite3_bind_int64(s, 1, row->id);
  sqlite3_bind_int64(s, 2, block);
  sqlite3_bind_int64(s, 3, token);
  sqlite3_bind_int64(s, 4, rank);
  sqlite3_bind_int64(s, 5, row->epoch);
  if (store_step_done(st, s, f))
    return f->code;
  if (sqlite3_changes(store_db(st)) != 1)
    return ack_not_held(st, row, lay->units, rank, block, token, ctx, n, f);
  int64_t plan_rank;
  uint64_t begin, end;
  iter_unit_desc(lay, (uint64_t)block, &plan_rank, &begin, &end);
  row->done_blocks++;
  return rank_count(st, row->id, rank, (int64_t)(end - begin), 1, 0, f);
}

/* The reply {"acked", "epoch", "epoch_complete", "finished"[, "repeated"]}. */
static json_t *ack_reply(size_t acked, int64_t epoch, bool epoch_complete, bool finished,
                         int64_t repeated) {
  json_t *out =
      json_pack("{s:I, s:I, s:b, s:b}", "acked", (json_int_t)acked, "epoch", (json_int_t)epoch,
                "epoch_complete", epoch_complete, "finished", finished);
  if (out && repeated)
    json_object_set_new(out, "repeated", json_integer(repeated));
  return out;
}

/* The reply to a retry of an acknowledgement of the last completed epoch,
 * all `count` blocks of it repeated: what that one answered.  The one that
 * completed the epoch (every block `final`) answered with the next epoch
 * and "epoch_complete" true; any other, with the epoch it acknowledged in,
 * not complete then. */
static json_t *ack_repeat_reply(const iter_row_t *row, size_t count, bool final) {
  if (final)
    return ack_reply(count, row->epoch, true, row->finished, (int64_t)count);
  return ack_reply(count, row->epoch - 1, false, false, (int64_t)count);
}

/* What row `r` of a block in the last completed epoch tells of an
 * acknowledgement of it by `rank` under `token` that is no retry, into
 * buf (`size` bytes). */
static const char *ack_past_what(const block_row_t *r, int64_t token, int64_t rank, char *buf,
                                 size_t size) {
  if (acked_by_other(r, token, rank)) {
    snprintf(buf, size, "the block was acknowledged in it under that token by rank %lld, not %lld",
             (long long)r->rank, (long long)rank);
    return buf;
  }
  if (r->state >= ITER_BLOCK_DONE)
    return "the block was acknowledged in it under another token (by the rank that took it over)";
  return "no acknowledgement of the block in it is on record (it is no block of that epoch, or "
         "one done before the iteration was restored from a checkpoint)";
}

/* Refuses element `ctx` (`block` under `token`; `what`, what its row of the
 * last completed epoch tells) of an acknowledgement of that epoch, or of the
 * next one when the iteration is finished (a retry that let the epoch
 * default); returns NULL. */
static json_t *ack_past_refuse(const iter_row_t *row, int64_t epoch, const char *ctx, int64_t block,
                               int64_t token, const char *what, fail_t *f) {
  long long last = (long long)(row->epoch - 1);
  if (epoch == row->epoch) {
    fail_set(f, MUSTER_LEASE_LOST,
             "epoch %lld is not current (the iteration is finished); no block of it is leased",
             (long long)epoch);
    return NULL;
  }
  fail_set(f, MUSTER_LEASE_LOST,
           "%s: block %lld of epoch %lld under token %lld: epoch %lld is complete and %s; "
           "token %lld holds nothing: nothing of epoch %lld is leased any more",
           ctx, (long long)block, last, (long long)token, last, what, (long long)token, last);
  return NULL;
}

/* An acknowledgement by `rank` in epoch `epoch` that is over (or, the
 * iteration being finished, is its last).  A retry of an acknowledgement of
 * the last completed epoch (every block under the token and by the rank
 * that acknowledged it there) is answered as that one was, counting
 * nothing; anything else is refused, naming for that epoch the first
 * element that is not such a block. */
static json_t *ack_past(store_t *st, const iter_row_t *row, int64_t rank, int64_t epoch,
                        const json_t *blocks, fail_t *f) {
  size_t count = json_array_size(blocks);
  int64_t last = row->epoch - 1, block, token, final = 0;
  char ctx[32], what[128];
  block_row_t r;
  if (epoch < last) {
    fail_set(f, MUSTER_LEASE_LOST,
             "epoch %lld is complete: every block of it was acknowledged, once (if this "
             "repeats an acknowledgement whose reply was lost, it counted); nothing of it is "
             "leased any more",
             (long long)epoch);
    return NULL;
  }
  for (size_t i = 0; i < count; i++) {
    if (ack_elem(json_array_get(blocks, i), i, ctx, &block, &token, f) ||
        block_row(st, row->id, last, block, &r, f))
      return NULL;
    if (!acked_under(&r, token, rank))
      return ack_past_refuse(row, epoch, ctx, block, token,
                             ack_past_what(&r, token, rank, what, sizeof what), f);
    final += r.state == ITER_BLOCK_FINAL;
  }
  return ack_repeat_reply(row, count, final == (int64_t)count);
}

json_t *iter_ack(store_t *st, const char *name, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {"rank", "epoch", "blocks", NULL};
  iter_row_t row = {0};
  iter_plans_t *plans;
  iter_layout_t lay;
  int64_t rank, epoch;
  json_t *blocks, *out = NULL;
  if (jv_only(body, "", allowed, f) || jv_batch(body, "blocks", ITER_MAX_BATCH, &blocks, f) ||
      load_for_rank(st, name, body, &row, &plans, &rank, f) ||
      jv_int(body, "epoch", "", row.epoch, 0, INT64_MAX, &epoch, f))
    goto done;
  if (epoch < row.epoch || (row.finished && epoch == row.epoch)) {
    out = ack_past(st, &row, rank, epoch, blocks, f);
    goto done;
  }
  if (epoch > row.epoch) {
    fail_set(f, MUSTER_LEASE_LOST, "epoch %lld is not current (%s); no block of it is leased",
             (long long)epoch, row.finished ? "the iteration is finished" : "it has not begun");
    goto done;
  }
  iter_layout_of(&row, plans, &lay);
  ack_counts_t n = {0};
  size_t count = json_array_size(blocks);
  for (size_t i = 0; i < count; i++)
    if (ack_one(st, &row, &lay, rank, json_array_get(blocks, i), i, &n, f))
      goto done;
  if (iter_row_save(st, &row, f) || iter_settle(st, &row, f) ||
      (row.epoch > epoch && final_mark(st, row.id, epoch, blocks, f)))
    goto done;
  /* A retry of the last epoch's acknowledgement (the epoch left to default)
   * alone is answered as it was. */
  if (n.last_epoch == (int64_t)count)
    out = ack_repeat_reply(&row, count, n.final == (int64_t)count);
  else
    out = ack_reply(count, row.epoch, row.epoch > epoch, row.finished, n.repeated);
done:
  if (out == NULL && f->code == MUSTER_OK)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  iter_row_free(&row);
  return out;
}

json_t *iter_heartbeat(store_t *st, const char *name, const json_t *body, fail_t *f) {
  static const char *const allowed[] = {"rank", NULL};
  iter_row_t row = {0};
  iter_plans_t *plans;
  int64_t rank;
  json_t *out = NULL;
  if (jv_only(body, "", allowed, f) || load_for_rank(st, name, body, &row, &plans, &rank, f))
    goto done;
  /* INDEXED BY: the planner would take the primary key's iter prefix, every
   * row of the current and the last epoch, at every heartbeat. */
  sqlite3_stmt *s = store_stmt(st, "UPDATE iter_blocks INDEXED BY iter_blocks_by_rank SET"
                                   " deadline_ms = ?3 WHERE iter = ?1 AND rank = ?2 AND"
                                   " state = 1");
  int64_t deadline = now_ms() + row.set.lease_ms;
  if (s == NULL) {
    store_fail(st, f, "heartbeat");
    goto done;
  }
  sqlite3_bind_int64(s, 1, row.id);
  sqlite3_bind_int64(s, 2, rank);
  sqlite3_bind_int64(s, 3, deadline);
  if (store_step_done(st, s, f))
    goto done;
  out = json_pack("{s:I, s:I, s:I, s:I}", "rank", (json_int_t)rank, "leases",
                  (json_int_t)sqlite3_changes(store_db(st)), "deadline_ms", (json_int_t)deadline,
                  "epoch", (json_int_t)row.epoch);
done:
  iter_row_free(&row);
  return out;
}

/* ---- lapses ------------------------------------------------------------------- */

/*
 * A lease or a rank is due when its deadline passed and the head has heard
 * from the ranks for a whole lease_ms or rank_timeout_ms (store_heard_since_ms:
 * since its start, or since it ran again after a stall).  A rank's calls
 * extend its leases, so both are liveness deadlines, like a worker's: a
 * head that was down or stopped could not be reached meanwhile, and ending
 * the leases at its first sweep would hand every block in flight to another
 * rank, to be read twice.
 */
#define ITER_DUE_BLOCKS                                                                            \
  "SELECT b.iter, b.block, coalesce(b.rank, -1), b.epoch FROM iter_blocks b"                       \
  " JOIN iterations i ON i.id = b.iter WHERE b.state = 1 AND b.deadline_ms <= ?1"                  \
  " AND ?3 + i.lease_ms <= ?1 LIMIT ?2"
#define ITER_DUE_RANKS                                                                             \
  "SELECT r.iter, r.rank, 0, 0 FROM iter_ranks r JOIN iterations i ON i.id = r.iter"               \
  " WHERE r.state != 2 AND r.deadline_ms <= ?1 AND ?3 + i.rank_timeout_ms <= ?1 LIMIT ?2"

bool iter_any_due(store_t *st, int64_t now) {
  return store_due(st,
                   "SELECT 1 FROM iter_blocks b JOIN iterations i ON i.id = b.iter"
                   " WHERE b.state = 1 AND b.deadline_ms <= ?1 AND ?2 + i.lease_ms <= ?1 LIMIT 1",
                   now) ||
         store_due(st,
                   "SELECT 1 FROM iter_ranks r JOIN iterations i ON i.id = r.iter"
                   " WHERE r.state != 2 AND r.deadline_ms <= ?1"
                   " AND ?2 + i.rank_timeout_ms <= ?1 LIMIT 1",
                   now);
}

#define ITER_EXPIRE_LIMIT 1000

typedef struct {
  int64_t iter, a, b, c;
} due_t;

/* Collects up to ITER_EXPIRE_LIMIT (iter, a, b, c) rows of a due query. */
static size_t collect_due(store_t *st, const char *sql, int64_t now, due_t *out) {
  sqlite3_stmt *s = store_stmt(st, sql);
  size_t n = 0;
  if (s == NULL)
    return 0;
  sqlite3_bind_int64(s, 1, now);
  sqlite3_bind_int64(s, 2, ITER_EXPIRE_LIMIT);
  sqlite3_bind_int64(s, 3, store_heard_since_ms(st));
  while (n < ITER_EXPIRE_LIMIT && sqlite3_step(s) == SQLITE_ROW)
    out[n++] = (due_t){sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
                       sqlite3_column_int64(s, 2), sqlite3_column_int64(s, 3)};
  store_reset(s);
  return n;
}

/* Runs a write with up to three integer parameters (as many as the SQL
 * names); false on failure. */
static bool exec3(store_t *st, const char *sql, int64_t a, int64_t b, int64_t c) {
  sqlite3_stmt *s = store_stmt(st, sql);
  fail_t f = {0};
  if (s == NULL)
    return false;
  int64_t values[3] = {a, b, c};
  for (int i = 0; i < sqlite3_bind_parameter_count(s) && i < 3; i++)
    sqlite3_bind_int64(s, i + 1, values[i]);
  return store_step_done(st, s, &f) == MUSTER_OK;
}

int64_t iter_expire_due(store_t *st, int64_t now) {
  due_t *due = malloc(ITER_EXPIRE_LIMIT * sizeof *due);
  if (due == NULL)
    return -1;
  int64_t lapsed = 0;
  bool ok = true;
  /* A lease that expired: the block goes back to its lane, its rank is failed. */
  size_t n = collect_due(st, ITER_DUE_BLOCKS, now, due);
  for (size_t i = 0; ok && i < n; i++, lapsed++)
    ok = exec3(st,
               "UPDATE iter_blocks SET state = 0, rank = NULL, token = NULL,"
               " deadline_ms = NULL WHERE iter = ?1 AND epoch = ?2 AND block = ?3",
               due[i].iter, due[i].c, due[i].a) &&
         exec3(st,
               "UPDATE iter_ranks SET state = 2, expired = expired + 1"
               " WHERE iter = ?1 AND rank = ?2",
               due[i].iter, due[i].b, 0);
  /* A rank silent past its timeout: failed, and its leases go back. */
  n = ok ? collect_due(st, ITER_DUE_RANKS, now, due) : 0;
  for (size_t i = 0; ok && i < n; i++, lapsed++)
    ok = exec3(st, "UPDATE iter_ranks SET state = 2 WHERE iter = ?1 AND rank = ?2", due[i].iter,
               due[i].a, 0) &&
         exec3(st,
               "UPDATE iter_blocks INDEXED BY iter_blocks_by_rank SET state = 0,"
               " rank = NULL, token = NULL, deadline_ms = NULL WHERE iter = ?1 AND"
               " rank = ?2 AND state = 1",
               due[i].iter, due[i].a, 0);
  free(due);
  if (lapsed > 0)
    log_msg(LOG_DEBUG, "iterations: %lld leases or ranks lapsed", (long long)lapsed);
  return ok ? lapsed : -1;
}
