/*
 * update.c — broadcast updates per queue.
 *
 * An update is (queue, seq, data, session).  `update_seqs` keeps the highest
 * number of each queue, so numbers never repeat after deletions and a worker's
 * `updates_after` stays meaningful for the queue's whole life.  Workers get
 * updates piggy-backed on their lease replies; a post marks the queue ready so
 * that parked long-poll leases asking for updates wake up.
 */
#include "update.h"
#include "jv.h"
#include "jw.h"
#include "log.h"
#include "queue.h"
#include "reply_budget.h"
#include "session.h"
#include "task.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t update_last(store_t *st, const char *queue) {
  sqlite3_stmt *s = store_stmt(st, "SELECT last FROM update_seqs WHERE queue = ?1");
  if (s == NULL)
    return 0;
  store_bind_text(s, 1, queue);
  int64_t last = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  return last;
}

/* Hands out the next sequence number of `queue`; 0 on store failure.  A
 * queue's first number is 1, or above the floor of a restore: the head the
 * backup was taken from may have numbered updates of a queue the backup
 * did not have (store_restore.c). */
static int64_t update_next_seq(store_t *st, const char *queue, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO update_seqs(queue, last)"
                                   " VALUES(?1, " STORE_ID_FLOOR_SQL " + 1)"
                                   " ON CONFLICT(queue) DO UPDATE SET last = last + 1"
                                   " RETURNING last");
  if (s == NULL) {
    store_fail(st, f, "update numbering");
    return 0;
  }
  store_bind_text(s, 1, queue);
  int64_t seq = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  store_reset(s);
  if (seq == 0)
    store_fail(st, f, "update numbering");
  return seq;
}

/* Checks the update's session: open, of this queue; counts as its heartbeat. */
static muster_err_t update_check_session(store_t *st, const char *queue, const char *session,
                                         fail_t *f) {
  char owner[NAME_MAX_LEN + 1];
  if (session_touch(st, session, owner, f))
    return f->code;
  if (strcmp(owner, queue) != 0)
    return fail_set(f, MUSTER_INVALID,
                    "session: '%s' belongs to queue '%s', not '%s'; post its updates there",
                    session, owner, queue);
  return MUSTER_OK;
}

json_t *update_post(store_t *st, const char *queue, const json_t *body, size_t max_payload,
                    fail_t *f) {
  static const char *const allowed[] = {"data", "session", NULL};
  const char *session;
  queue_t q;
  if (jv_only(body, "", allowed, f) ||
      jv_str(body, "session", "", NULL, TASK_MAX_SESSION, &session, f))
    return NULL;
  const json_t *data = json_object_get(body, "data");
  if (data == NULL) {
    fail_set(f, MUSTER_INVALID, "data: missing (any JSON value)");
    return NULL;
  }
  if (queue_load(st, queue, &q, f) || (session && update_check_session(st, queue, session, f)))
    return NULL;
  char *text = jv_encode(data);
  json_t *out = NULL;
  int64_t seq;
  if (text == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
  } else if (jv_payload_fits(text, max_payload, "", "data", f) == MUSTER_OK &&
             (seq = update_next_seq(st, queue, f)) > 0) {
    sqlite3_stmt *s = store_stmt(st, "INSERT INTO updates(queue, seq, data, session, created_ms)"
                                     " VALUES(?1, ?2, ?3, ?4, ?5)");
    if (s == NULL) {
      store_fail(st, f, "update insert");
    } else {
      store_bind_text(s, 1, queue);
      sqlite3_bind_int64(s, 2, seq);
      store_bind_text(s, 3, text);
      store_bind_text(s, 4, session);
      sqlite3_bind_int64(s, 5, now_ms());
      if (store_step_done(st, s, f) == MUSTER_OK) {
        out = json_pack("{s:s, s:I}", "queue", queue, "seq", (json_int_t)seq);
        store_notify_ready(st, queue); /* wakes long-poll leases that want updates */
      }
    }
  }
  free(text);
  return out;
}

/* Appends the update of row `s` (seq, data, session, created_ms) to `out`,
 * after a comma unless it is the first: {"seq", "data", "session",
 * "created_ms"}, the bytes jw_dump wrote for that object built as a tree,
 * written as text around the stored data (jv_add_stored). */
static void update_write(jw_buf_t *out, sqlite3_stmt *s, bool first) {
  if (!first)
    JW_ADD_LITERAL(out, ",");
  JW_ADD_LITERAL(out, "{\"seq\":");
  jw_add_int(out, sqlite3_column_int64(s, 0));
  JW_ADD_LITERAL(out, ",\"data\":");
  const char *data = (const char *)sqlite3_column_text(s, 1); /* before its length */
  jv_add_stored(out, data, data ? (size_t)sqlite3_column_bytes(s, 1) : 0);
  JW_ADD_LITERAL(out, ",\"session\":");
  const char *session = (const char *)sqlite3_column_text(s, 2); /* an id the head made */
  if (session)
    jw_add_string(out, session, strlen(session));
  else
    JW_ADD_LITERAL(out, "null");
  JW_ADD_LITERAL(out, ",\"created_ms\":");
  jw_add_int(out, sqlite3_column_int64(s, 3));
  JW_ADD_LITERAL(out, "}");
}

/* What update_collect read: how many updates, whether the budget of one
 * reply cut them short, and the last seq (`after` when none). */
typedef struct {
  size_t count;
  bool cut;
  int64_t last;
} update_read_t;

/* Appends the updates of `queue` with seq > after to `list` (the elements of
 * a JSON array), at most `max`, fewer when their data would pass the budget
 * of one reply (reply_budget.h: rd->cut set then).  False on store failure. */
static bool update_collect(store_t *st, const char *queue, int64_t after, int64_t max,
                           jw_buf_t *list, update_read_t *rd) {
  sqlite3_stmt *s = store_stmt(st, "SELECT seq, data, session, created_ms FROM updates"
                                   " WHERE queue = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, after);
  sqlite3_bind_int64(s, 3, max);
  *rd = (update_read_t){.last = after};
  size_t bytes = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    size_t size = (size_t)sqlite3_column_bytes(s, 1);
    if (!reply_budget_fits(rd->count, bytes, size)) {
      rd->cut = true;
      rc = SQLITE_DONE;
      break;
    }
    bytes += size;
    rd->last = sqlite3_column_int64(s, 0);
    update_write(list, s, rd->count++ == 0);
  }
  store_reset(s);
  return rc == SQLITE_DONE;
}

muster_err_t update_list_text(store_t *st, const char *queue, int64_t after, int64_t max,
                              jw_buf_t *out, fail_t *f) {
  queue_t q;
  update_read_t rd;
  if (queue_load(st, queue, &q, f))
    return f->code;
  JW_ADD_LITERAL(out, "{\"updates\":[");
  if (!update_collect(st, queue, after, max, out, &rd))
    return store_fail(st, f, "update list");
  JW_ADD_LITERAL(out, "],\"last\":");
  jw_add_int(out, update_last(st, queue));
  JW_ADD_LITERAL(out, "}");
  return out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

/* The "updates_last" of a lease that read `rd` from `after` on: a full
 * page, or one cut by the budget, may leave more behind, so the worker
 * continues from the last one it got.  Otherwise it has seen everything up
 * to the queue's highest number, including numbers whose updates were
 * deleted. */
static int64_t update_lease_last(store_t *st, const char *queue, int64_t after,
                                 const update_read_t *rd) {
  if (rd->count >= UPDATE_MAX_BATCH || rd->cut)
    return rd->last;
  int64_t highest = update_last(st, queue);
  return highest > after ? highest : after;
}

muster_err_t update_attach_text(store_t *st, const char *queue, int64_t after, jw_buf_t *out,
                                size_t *count, fail_t *f) {
  update_read_t rd;
  JW_ADD_LITERAL(out, ",\"updates\":[");
  if (!update_collect(st, queue, after, UPDATE_MAX_BATCH, out, &rd))
    return store_fail(st, f, "updates for a lease");
  JW_ADD_LITERAL(out, "],\"updates_last\":");
  jw_add_int(out, update_lease_last(st, queue, after, &rd));
  *count = rd.count;
  return out->failed ? fail_set(f, MUSTER_NOMEM, "out of memory") : MUSTER_OK;
}

static muster_err_t update_delete(store_t *st, sqlite3_stmt *s, const char *key, fail_t *f) {
  if (s == NULL)
    return store_fail(st, f, "update delete");
  store_bind_text(s, 1, key);
  return store_step_done(st, s, f);
}

muster_err_t update_delete_session(store_t *st, const char *session, fail_t *f) {
  return update_delete(st, store_stmt(st, "DELETE FROM updates WHERE session = ?1"), session, f);
}

muster_err_t update_delete_queue(store_t *st, const char *queue, fail_t *f) {
  return update_delete(st, store_stmt(st, "DELETE FROM updates WHERE queue = ?1"), queue, f);
}
