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
  } else if (strlen(text) > max_payload) {
    fail_set(f, MUSTER_PAYLOAD_TOO_LARGE, "data: %zu bytes, at most %zu allowed", strlen(text),
             max_payload);
  } else if ((seq = update_next_seq(st, queue, f)) > 0) {
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

/* Appends updates of `queue` with seq > after to `list`, at most `max`, and
 * fewer when their data would pass the budget of one reply (reply_budget.h:
 * *cut set then); returns the last seq appended (after when none), -1 on
 * store failure. */
static int64_t update_collect(store_t *st, const char *queue, int64_t after, int64_t max,
                              json_t *list, bool *cut) {
  sqlite3_stmt *s = store_stmt(st, "SELECT seq, data, session, created_ms FROM updates"
                                   " WHERE queue = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3");
  if (s == NULL)
    return -1;
  store_bind_text(s, 1, queue);
  sqlite3_bind_int64(s, 2, after);
  sqlite3_bind_int64(s, 3, max);
  int64_t last = after;
  size_t bytes = 0;
  int rc;
  *cut = false;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    size_t size = (size_t)sqlite3_column_bytes(s, 1);
    if (!reply_budget_fits(json_array_size(list), bytes, size)) {
      *cut = true;
      rc = SQLITE_DONE;
      break;
    }
    bytes += size;
    const unsigned char *session = sqlite3_column_text(s, 2);
    last = sqlite3_column_int64(s, 0);
    json_array_append_new(list,
                          json_pack("{s:I, s:o, s:o, s:I}", "seq", (json_int_t)last, "data",
                                    jv_decode((const char *)sqlite3_column_text(s, 1)), "session",
                                    session ? json_string((const char *)session) : json_null(),
                                    "created_ms", (json_int_t)sqlite3_column_int64(s, 3)));
  }
  store_reset(s);
  return rc == SQLITE_DONE ? last : -1;
}

json_t *update_list(store_t *st, const char *queue, int64_t after, int64_t max, fail_t *f) {
  queue_t q;
  if (queue_load(st, queue, &q, f))
    return NULL;
  json_t *list = json_array();
  bool cut;
  if (update_collect(st, queue, after, max, list, &cut) < 0) {
    json_decref(list);
    store_fail(st, f, "update list");
    return NULL;
  }
  return json_pack("{s:o, s:I}", "updates", list, "last", (json_int_t)update_last(st, queue));
}

muster_err_t update_attach(store_t *st, const char *queue, int64_t after, json_t *reply,
                           size_t *count, fail_t *f) {
  json_t *list = json_array();
  bool cut;
  int64_t last = update_collect(st, queue, after, UPDATE_MAX_BATCH, list, &cut);
  if (last < 0) {
    json_decref(list);
    return store_fail(st, f, "updates for a lease");
  }
  *count = json_array_size(list);
  /* A full page, or one cut by the budget, may leave more behind: the worker
   * continues from the last one it got.  Otherwise it has seen everything up
   * to the queue's highest number, including numbers whose updates were
   * deleted. */
  if (*count < UPDATE_MAX_BATCH && !cut) {
    int64_t highest = update_last(st, queue);
    last = highest > after ? highest : after;
  }
  json_object_set_new(reply, "updates", list);
  json_object_set_new(reply, "updates_last", json_integer(last));
  return MUSTER_OK;
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
