/*
 * worker_ended.c — the instances reported ended (table ended_instances,
 * schema version 22).
 *
 * A node agent whose worker process died before it told the agent its
 * worker id reports it by the instance it gave the process to register
 * with (DELETE /v1/workers/instance/I?crashed=true, worker.c).  The
 * process's registration may still be on its way then: forwarded by the
 * agent on another connection, or waiting in the head's socket buffer.
 * Landing after the report, it made a worker that the head counted active
 * (in the worker list, a pool's counts, the dashboard) until its timeout,
 * though its process was dead.  So every report by instance is remembered,
 * whether it ended an active worker or found none: a registration sent
 * again whose first copy the report ended is as late as one that never got
 * there, and a report sent again (its reply lost) must leave the state the
 * first one left.  A registration with a remembered instance is refused
 * (worker_ended_check) and makes no worker.  Instances are one per process
 * (the agent numbers each start of each slot), so the refusal can only meet
 * the process that was reported ended: a dead one, whose registration
 * nobody reads, or one alive against the reporter's word, which learns it
 * (muster worker stops, saying the head's words) instead of working
 * unsupervised.
 *
 * Rows are kept WORKER_ENDED_KEEP_MS, ten minutes (for tests,
 * MUSTER_TEST_ENDED_KEEP_MS: worker_ended_init): a registration is on its
 * way for the time of a forward (milliseconds; seconds under load), and a
 * head whose loop stalls reads the report and the registration behind it
 * after the stall alike.  An older row is not read (the check asks for
 * younger ones), and the reaper deletes it (reaper.c).  At most
 * WORKER_ENDED_MAX rows (about a megabyte): a cluster reporting more
 * than that in ten minutes (17 a second) keeps them for less time, the
 * oldest going first.  Only reports by instance write here and only
 * registrations with an instance read it: leases, heartbeats and reports
 * by id never touch the table.
 */
#include "worker_ended.h"
#include "core/knob.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>

/* Set once, before the head serves (worker_ended_init), read after. */
static int64_t worker_ended_keep = WORKER_ENDED_KEEP_MS;

int64_t worker_ended_keep_ms(void) {
  return worker_ended_keep;
}

void worker_ended_init(void) {
  const char *text = getenv("MUSTER_TEST_ENDED_KEEP_MS");
  if (text == NULL || text[0] == '\0')
    return;
  long long ms;
  if (!knob_int(text, 1, WORKER_ENDED_KEEP_MS, &ms)) {
    log_msg(LOG_WARN,
            "MUSTER_TEST_ENDED_KEEP_MS=%.20s is not 1 to %lld; instances reported ended are "
            "remembered %lld ms",
            text, WORKER_ENDED_KEEP_MS, WORKER_ENDED_KEEP_MS);
    return;
  }
  worker_ended_keep = ms;
  log_msg(LOG_WARN,
          "MUSTER_TEST_ENDED_KEEP_MS=%lld: instances reported ended are remembered %lld ms "
          "(for tests only)",
          ms, ms);
}

/* Forgets the rows beyond the newest WORKER_ENDED_MAX, the oldest first.
 * Counts them at every report (the index ended_instances_by_time, at most
 * WORKER_ENDED_MAX entries): reports by instance are rare. */
static muster_err_t worker_ended_bound(store_t *st, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT count(*) FROM ended_instances");
  if (s == NULL)
    return store_fail(st, f, "ended worker instances");
  int64_t rows = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
  store_reset(s);
  if (rows < 0)
    return store_fail(st, f, "ended worker instances");
  if (rows <= WORKER_ENDED_MAX)
    return MUSTER_OK;
  s = store_stmt(st, "DELETE FROM ended_instances WHERE instance IN (SELECT instance"
                     " FROM ended_instances ORDER BY ended_ms LIMIT ?1)");
  if (s == NULL)
    return store_fail(st, f, "ended worker instances");
  sqlite3_bind_int64(s, 1, rows - WORKER_ENDED_MAX);
  return store_step_done(st, s, f);
}

muster_err_t worker_ended_record(store_t *st, const char *instance, bool crashed, int64_t now,
                                 fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT OR REPLACE INTO ended_instances(instance, ended_ms,"
                                   " crashed) VALUES(?1, ?2, ?3)");
  if (s == NULL)
    return store_fail(st, f, "ended worker instance");
  store_bind_text(s, 1, instance);
  sqlite3_bind_int64(s, 2, now);
  sqlite3_bind_int(s, 3, crashed);
  if (store_step_done(st, s, f))
    return f->code;
  return worker_ended_bound(st, f);
}

/* The refusal of a registration with `instance`, reported ended (`crashed`
 * or by a goodbye) `ago_ms` before it came. */
static muster_err_t worker_ended_refuse(const char *instance, bool crashed, int64_t ago_ms,
                                        fail_t *f) {
  double ago_s = (double)(ago_ms > 0 ? ago_ms : 0) / 1000;
  log_msg(LOG_INFO,
          "worker registration with instance %s refused: it was reported %s %.1f s before (the "
          "registration came after the report of its process's end)",
          instance, crashed ? "crashed" : "gone", ago_s);
  return fail_set(f, MUSTER_INVALID_STATE,
                  "instance '%s' was reported %s %.1f s ago (DELETE "
                  "/v1/workers/instance/%s%s): no worker is registered under an instance "
                  "reported ended; a live process registers with an instance of its own",
                  instance, crashed ? "crashed" : "gone", ago_s, instance,
                  crashed ? "?crashed=true" : "");
}

muster_err_t worker_ended_check(store_t *st, const char *instance, int64_t now, fail_t *f) {
  if (instance == NULL)
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, "SELECT ended_ms, crashed FROM ended_instances"
                                   " WHERE instance = ?1 AND ended_ms > ?2");
  if (s == NULL)
    return store_fail(st, f, "worker register");
  store_bind_text(s, 1, instance);
  sqlite3_bind_int64(s, 2, now - worker_ended_keep);
  int rc = sqlite3_step(s);
  int64_t ended_ms = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  bool crashed = rc == SQLITE_ROW && sqlite3_column_int(s, 1) != 0;
  store_reset(s);
  if (rc == SQLITE_ROW)
    return worker_ended_refuse(instance, crashed, now - ended_ms, f);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, "worker register");
}

bool worker_ended_any_due(store_t *st, int64_t now) {
  return store_due(st, "SELECT 1 FROM ended_instances WHERE ended_ms <= ?1 LIMIT 1",
                   now - worker_ended_keep);
}

muster_err_t worker_ended_prune(store_t *st, int64_t now, int64_t *forgotten, fail_t *f) {
  *forgotten = 0;
  sqlite3_stmt *s = store_stmt(st, "DELETE FROM ended_instances WHERE ended_ms <= ?1");
  if (s == NULL)
    return store_fail(st, f, "ended worker instances");
  sqlite3_bind_int64(s, 1, now - worker_ended_keep);
  if (store_step_done(st, s, f))
    return f->code;
  *forgotten = sqlite3_changes64(store_db(st));
  return MUSTER_OK;
}
