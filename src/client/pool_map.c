/*
 * pool_map.c — muster_pool_map and muster_pool_map_partial: run a list of
 * inputs through the pool and hand back every result, in input order
 * (docs/pools.md, "map").
 *
 * Both are an ordered imap read to its end.  The caller of map holds no
 * iterator to resume with, so a read that meets a head down or restarting is
 * sent again here, from the same cursor, for up to the session's timeout.
 * When that runs out, map frees what it read; map_partial hands it back,
 * each input not read marked (its result's `state` NULL), so that the caller
 * can submit those again and keep the rest.
 */
#include "client/pool_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void muster_pool_results_free(muster_result_t *results, size_t count) {
  if (results == NULL)
    return;
  for (size_t i = 0; i < count; i++)
    muster_result_clear(&results[i]);
  free(results);
}

/* True for the failures of a head that is down or restarting, which a call
 * outlasts: no answer (MUSTER_NETWORK), or a 503 (MUSTER_UNAVAILABLE). */
static int pool_head_away(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
}

/* Fails map with `err` after a head away for `away_ms`, saying so after the
 * last read's own message. */
static muster_err_t pool_map_gave_up(muster_pool_t *pool, muster_err_t err, int64_t away_ms) {
  char last[CLIENT_MESSAGE_MAX];
  snprintf(last, sizeof last, "%s", pool->message);
  return pool_fail(pool, err,
                   "%s (sent again every second for %lld ms, the session's timeout_ms; session "
                   "%s)",
                   last, (long long)away_ms, pool->session);
}

/*
 * Reads every result of ordered iterator `it` into all[input position].  A
 * read that meets a head down or restarting is sent again every second, from
 * the same cursor (nothing lost or read twice), for up to the session's
 * timeout counted from the first failure, while the heartbeat thread keeps
 * the session open, as submitting does.  Then it fails with the last error,
 * its message saying so; what was read stays in all[].
 */
static muster_err_t pool_map_collect(muster_pool_t *pool, muster_pool_iter_t *it,
                                     muster_result_t *all) {
  int64_t away_since = -1;
  while (!muster_pool_iter_done(it)) {
    muster_result_t r;
    int has = 0;
    muster_err_t err = muster_pool_iter_next(it, -1, &r, &has);
    if (err == MUSTER_OK) {
      away_since = -1;
      if (has)
        all[r.index] = r;
      continue;
    }
    if (!pool_head_away(err))
      return err;
    int64_t now = pool_now_ms();
    if (away_since < 0)
      away_since = now;
    else if (now - away_since >= pool->timeout_ms)
      return pool_map_gave_up(pool, err, now - away_since);
    nanosleep(&(struct timespec){.tv_sec = POOL_SUBMIT_PAUSE_S}, NULL);
  }
  return MUSTER_OK;
}

/* The arguments of map: MUSTER_OK, or MUSTER_INVALID with the pool's
 * message saying which is wrong; nothing submitted either way. */
static muster_err_t pool_map_check(muster_pool_t *pool, const char *const *inputs, size_t count,
                                   muster_result_t **results) {
  pool->message[0] = '\0';
  if (results == NULL)
    return pool_fail(pool, MUSTER_INVALID, "results: a place for the results is required");
  return pool_check_inputs(pool, inputs, count);
}

/* Counts the results of all[0..count) that were not read (state NULL) and
 * gives every one its input's position, read or not. */
static size_t pool_map_unread(muster_result_t *all, size_t count) {
  size_t unread = 0;
  for (size_t i = 0; i < count; i++) {
    all[i].index = (int64_t)i;
    unread += all[i].state == NULL;
  }
  return unread;
}

muster_err_t muster_pool_map_partial(muster_pool_t *pool, const char *const *inputs, size_t count,
                                     muster_result_t **results, size_t *unread) {
  if (results)
    *results = NULL;
  if (unread)
    *unread = 0;
  if (pool == NULL)
    return MUSTER_INVALID;
  muster_err_t err = pool_map_check(pool, inputs, count, results);
  if (err != MUSTER_OK)
    return err;
  muster_result_t *all = calloc(count ? count : 1, sizeof *all);
  if (all == NULL)
    return pool_fail(pool, MUSTER_NOMEM, "out of memory");
  muster_pool_iter_t *it = NULL;
  err = pool_imap_start(pool, inputs, count, 1, &it);
  if (err == MUSTER_OK)
    err = pool_map_collect(pool, it, all);
  muster_pool_iter_free(it);
  size_t left = pool_map_unread(all, count);
  if (unread)
    *unread = left;
  *results = all;
  return err;
}

muster_err_t muster_pool_map(muster_pool_t *pool, const char *const *inputs, size_t count,
                             muster_result_t **results) {
  size_t unread = 0;
  muster_err_t err = muster_pool_map_partial(pool, inputs, count, results, &unread);
  if (err != MUSTER_OK && results != NULL) {
    muster_pool_results_free(*results, count);
    *results = NULL;
  }
  return err;
}
