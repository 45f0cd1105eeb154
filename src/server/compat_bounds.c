/*
 * compat_bounds.c — what keeps anonymous DistCompute clients from growing a
 * head's store without end.
 *
 * The tracker's client sends no token (compat.h), so anyone who reaches the
 * head may call api/new, and each call made a worker row (about a kilobyte
 * with its compat_workers row) that was never deleted: thousands a second.
 * Two bounds:
 *   - at most cfg.distcompute_max_workers ACTIVE workers per pipeline
 *     (compat.c refuses api/new beyond).  Gone workers do not count, so a
 *     worker that says bye or times out frees its slot; counted at each
 *     api/new by the index workers_active (active workers only) and a
 *     lookup of each in compat_workers_by_worker;
 *   - a worker that went without completing, failing or flagging anything
 *     is deleted COMPAT_IDLE_KEEP_MS (an hour) after it went, by the
 *     reaper (reaper.c), a chunk per look.  Such a worker is in no
 *     counter: the leaderboard counts the workers that are active or did
 *     something (worker_leaderboard), so its deletion changes nothing there.
 *     The partial index workers_idle_gone holds the gone workers with
 *     nothing done; a cursor (gone_at_ms, id) in the reaper skips the ones a
 *     pass kept (workers of other kinds: their owners authenticated), so
 *     that a pass reads each of them once.
 */
#include "compat_bounds.h"
#include "core/knob.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>

static int64_t compat_idle_keep = COMPAT_IDLE_KEEP_MS;

int64_t compat_idle_keep_ms(void) {
  return compat_idle_keep;
}

void compat_bounds_init(void) {
  const char *text = getenv("MUSTER_TEST_DC_IDLE_KEEP_MS");
  long long ms;
  if (text == NULL || text[0] == '\0')
    return;
  if (!knob_int(text, 1, COMPAT_IDLE_KEEP_MS, &ms)) {
    log_msg(LOG_WARN,
            "MUSTER_TEST_DC_IDLE_KEEP_MS=%.20s is not 1 to %lld; idle DistCompute workers are "
            "kept %lld ms after they went",
            text, COMPAT_IDLE_KEEP_MS, COMPAT_IDLE_KEEP_MS);
    return;
  }
  compat_idle_keep = ms;
  log_msg(LOG_WARN,
          "MUSTER_TEST_DC_IDLE_KEEP_MS=%lld: idle DistCompute workers are deleted %lld ms after "
          "they went (for tests only)",
          ms, ms);
}

muster_err_t compat_active_count(store_t *st, const char *pipeline, int64_t *count, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT count(*) FROM workers w INDEXED BY workers_active"
                                   " JOIN compat_workers c ON c.worker = w.id"
                                   " WHERE w.state = 0 AND c.pipeline = ?1");
  if (s == NULL)
    return store_fail(st, f, "distcompute workers");
  store_bind_text(s, 1, pipeline);
  int rc = sqlite3_step(s);
  *count = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return rc == SQLITE_ROW ? MUSTER_OK : store_fail(st, f, "distcompute workers");
}

/* Deletes worker `id` and what only it had: its DistCompute token and its
 * lease retry records (none for a DistCompute worker, whose leases have no
 * key, but a row left would name a worker that is not there). */
static muster_err_t compat_delete_worker(store_t *st, int64_t id, fail_t *f) {
  static const char *const sql[] = {"DELETE FROM compat_workers WHERE worker = ?1",
                                    "DELETE FROM lease_requests WHERE worker = ?1",
                                    "DELETE FROM workers WHERE id = ?1"};
  for (size_t i = 0; i < sizeof sql / sizeof sql[0]; i++) {
    sqlite3_stmt *s = store_stmt(st, sql[i]);
    if (s == NULL)
      return store_fail(st, f, "idle distcompute worker");
    sqlite3_bind_int64(s, 1, id);
    if (store_step_done(st, s, f))
      return f->code;
  }
  return MUSTER_OK;
}

muster_err_t compat_delete_idle(store_t *st, int64_t now, int chunk, compat_idle_cursor_t *cursor,
                                int *examined, int64_t *deleted, fail_t *f) {
  sqlite3_stmt *s = store_stmt(
      st, "SELECT w.id, w.gone_at_ms, EXISTS (SELECT 1 FROM compat_workers c WHERE c.worker = w.id)"
          " FROM workers w INDEXED BY workers_idle_gone"
          " WHERE w.state = 1 AND w.completed = 0 AND w.failed = 0 AND w.flagged = 0"
          " AND w.gone_at_ms <= ?1 AND (w.gone_at_ms, w.id) > (?2, ?3)"
          " ORDER BY w.gone_at_ms, w.id LIMIT ?4");
  if (s == NULL)
    return store_fail(st, f, "idle distcompute workers");
  int64_t ids[256];
  int n = 0, ndc = 0;
  chunk = chunk < 1 || chunk > 256 ? 256 : chunk;
  sqlite3_bind_int64(s, 1, now - compat_idle_keep);
  sqlite3_bind_int64(s, 2, cursor->gone_at_ms);
  sqlite3_bind_int64(s, 3, cursor->id);
  sqlite3_bind_int(s, 4, chunk);
  while (n < chunk && sqlite3_step(s) == SQLITE_ROW) {
    n++;
    *cursor = (compat_idle_cursor_t){sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 0)};
    if (sqlite3_column_int(s, 2))
      ids[ndc++] = cursor->id;
  }
  store_reset(s);
  *examined = n;
  for (int i = 0; i < ndc; i++)
    if (compat_delete_worker(st, ids[i], f))
      return f->code;
  *deleted += ndc;
  return MUSTER_OK;
}
