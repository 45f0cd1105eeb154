/*
 * store.h — the head's durable state: one SQLite file in WAL mode.
 *
 * The event-loop thread owns the connection; nothing here is thread-safe.
 * Writes are grouped: the first request of a loop turn opens a transaction
 * (store_request_begin), every request runs inside its own savepoint so that a
 * failing request leaves nothing behind, and the route layer commits once per
 * turn (store_commit) before any reply of that turn is sent.
 */
#ifndef MUSTER_SERVER_STORE_H
#define MUSTER_SERVER_STORE_H

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#include "fail.h"

typedef struct store store_t;

/* Called when tasks may have become ready in `queue` (after put, release, retry). */
typedef void (*store_ready_fn)(void *arg, const char *queue);
/* Called when a transaction opens, so the owner can schedule its commit. */
typedef void (*store_tx_fn)(void *arg);
/* Called when a task of session `session` finished or the session closed. */
typedef void (*store_session_fn)(void *arg, const char *session);

typedef struct {
  const char *path;   /* database file */
  bool sync_full;     /* fsync at every commit (synchronous=FULL) or not (NORMAL) */
  int schema_version; /* migrate only this far (tests of migrations); 0: the newest */
  const char *owner;  /* who serves from it, as errors name it ("node agent n1"); NULL: the head */
  bool owner_says_room; /* the owner logs a full disk's end in its own words (iter_local.c);
                         * else the store does, at the commit that writes again */
} store_opts_t;

/* Opens (creating if needed) and migrates the database.  On failure returns NULL
 * and fills *f.  The caller owns the result; free with store_close. */
store_t *store_open(const store_opts_t *opts, fail_t *f);

/* Creates the SQLite file `path` empty (an empty file is an empty database)
 * with mode 0600 when there is none, and returns 0, or the errno of what
 * failed.  SQLite itself would create it 0644 less the umask, and the WAL
 * and shared-memory files it makes beside it take the database's mode: every
 * payload, result and lease token readable by any local user wherever the
 * directory lets them in (a data dir systemd's StateDirectory= made is 0755).
 * A file that exists keeps its mode: the operator's choice.  ":memory:",
 * "" and "file:" URIs are left to SQLite. */
int store_create_private(const char *path);
/* Rolls back any open transaction and closes; accepts NULL. */
void store_close(store_t *st);

/* Switches SQLite's own flush at commit on (synchronous=FULL) or off (NORMAL). */
void store_set_sync_full(store_t *st, bool full);

/* Rows inserted, updated or deleted since the store was opened. */
int64_t store_changes(store_t *st);

void store_set_hooks(store_t *st, store_tx_fn on_tx, store_ready_fn on_ready, void *arg);
/* Sets the session hook; it gets the `arg` of store_set_hooks. */
void store_set_session_hook(store_t *st, store_session_fn on_session);

/* Opens the turn's transaction if none is open, then a savepoint for one
 * request.  Returns MUSTER_OK or MUSTER_STORE (with *f filled). */
muster_err_t store_request_begin(store_t *st, fail_t *f);
/* Ends the request's savepoint: kept when ok, rolled back otherwise. */
void store_request_end(store_t *st, bool ok);
/* Commits the turn's transaction; no-op when none is open.  On failure the
 * transaction is rolled back and MUSTER_STORE is returned. */
muster_err_t store_commit(store_t *st, fail_t *f);
bool store_in_tx(const store_t *st);
/* Where counts.c keeps the open transaction's count changes (counts.h). */
struct counts_log **store_counts_log(store_t *st);
/* Where leftover.c keeps the runs of what closed sessions left (leftover.h). */
struct leftover_set **store_leftovers(store_t *st);

/* A cached prepared statement for `sql`, which must be a string literal (the
 * cache is keyed by its address).  Reset it with store_reset after use.
 * Returns NULL (and logs) only if the SQL does not compile: a programming error. */
sqlite3_stmt *store_stmt(store_t *st, const char *sql);
void store_reset(sqlite3_stmt *stmt);
/* Runs a statement with no result rows; returns MUSTER_OK or MUSTER_STORE. */
muster_err_t store_step_done(store_t *st, sqlite3_stmt *stmt, fail_t *f);
/* For the sweep's checks before it opens a transaction: true when query
 * `sql`, with ?1 bound to `now` and ?2 (when it has one) to
 * store_heard_since_ms, returns a row; true also when it cannot be prepared, so
 * that the sweep runs and says what failed. */
bool store_due(store_t *st, const char *sql, int64_t now);
/* SQL: the row (a worker, node or session) has been silent for its
 * timeout_ms at ?1 (now), the head's downtime and stalls not counted: its
 * timeout runs from ?2 (store_heard_since_ms) at the earliest.  For a sweep's store_due check
 * and its expiry query alike, so that the two agree. */
#define STORE_SILENT_SQL " last_seen_ms + timeout_ms <= ?1 AND ?2 + timeout_ms <= ?1"
/* Reports a SQLite failure as MUSTER_STORE with the engine's message. */
muster_err_t store_fail(store_t *st, fail_t *f, const char *what);
sqlite3 *store_db(store_t *st);

/* The next fencing token: strictly increasing for the life of the file. */
int64_t store_next_token(store_t *st);
/* The highest fencing token handed out so far. */
int64_t store_last_token(const store_t *st);
/* The committed token floor: no token up to it is handed out again, even
 * after a restart, once the commit that wrote it is on disk. */
int64_t store_token_floor(const store_t *st);

/* The row of meta that marks a backup's copy of the store: backup.c writes
 * it into the copy once the copy is complete, never into a live store; its
 * value is when the copy was taken.  A store that opens with it is a
 * restore, whose id counters jump (store_restore.c); the mark goes then. */
#define STORE_BACKUP_MARK "backup_taken_ms"
/* The row of meta holding the floor of the last restore (0 before any):
 * counters that begin after it (a worker's id, a queue's first update
 * number, a pipeline's first job number) begin above it, as the lost head
 * may have begun them already.  STORE_ID_FLOOR_SQL reads it in SQL. */
#define STORE_ID_FLOOR_KEY "id_floor"
#define STORE_ID_FLOOR_SQL "coalesce((SELECT v FROM meta WHERE k = '" STORE_ID_FLOOR_KEY "'), 0)"

/* Since when this process has been able to hear from workers, nodes and
 * sessions: when it opened the store, or the end of its last stall
 * (store_note_stall).  They cannot be heard from while no head runs, nor
 * while the head's process does not run, so their silence is counted from
 * here at the earliest: a head down, or stopped, longer than their timeout
 * does not declare them gone as it starts or resumes (the sweeps' "?2 +
 * timeout_ms <= ?1"). */
int64_t store_heard_since_ms(const store_t *st);
/* The process did not run until `now` (it was stopped, starved, the machine
 * paused, or the wall clock jumped ahead): the heartbeats sent meanwhile
 * wait unread, so silence is counted from `now` on, as after a restart. */
void store_note_stall(store_t *st, int64_t now);

/* Hands out `n` consecutive task ids for inserts in the open transaction
 * and returns the first (task.c).  Ids grow by one and are never handed out
 * twice, not even after the tasks that had the highest ones were deleted
 * (see store_note_tasks_deleted), a transaction was rolled back (its ids
 * are skipped) or the store is a backup's copy (they jump at its first
 * opening: store_restore.c). */
int64_t store_task_ids(store_t *st, int64_t n);
/* The highest task id handed out, 0 before the first. */
int64_t store_last_task(const store_t *st);
/* Records that the open transaction deleted tasks: its commit writes the
 * floor that keeps a restart from handing their ids out again.  Every
 * DELETE FROM tasks calls it. */
void store_note_tasks_deleted(store_t *st);
/* Whether the table session_trash may hold rows: sessions closed with more
 * tasks than one chunk, whose tasks the head deletes in the background and
 * which leases, ready counts and task reads must skip meanwhile
 * (session_close.c).  While it is false those skip the check altogether.
 * It is true from the store's opening when a row is there, set when a close
 * inserts one, and cleared only by session_trash_first when no transaction
 * is open and the table is empty: a rolled-back deletion of the last row
 * can then never leave it false with a row there. */
bool store_sessions_closing(const store_t *st);
void store_set_sessions_closing(store_t *st, bool closing);
/* The lowest task id inserted since the last store_take_new_tasks, or
 * INT64_MAX when none was.  Every task inserted since has an id at least this
 * high (a new task's id is above every id in the table). */
int64_t store_new_tasks(const store_t *st);
/* store_new_tasks, then forgets those inserts: the head takes them at each
 * commit to know which tasks are not yet on disk (head.c, "durable replies"). */
int64_t store_take_new_tasks(store_t *st);
/* Tells the owner that `queue` may have ready tasks. */
void store_notify_ready(store_t *st, const char *queue);
/* Tells the owner that `session` has a new result or closed. */
void store_notify_session(store_t *st, const char *session);

/* A key and what muster_map() and muster_map_text() give for it
 * (store_map_set). */
typedef struct {
  int64_t key;
  int64_t value;    /* muster_map(key) */
  const char *text; /* muster_map_text(key): `text_len` bytes; NULL gives SQL NULL */
  size_t text_len;
} store_pair_t;

/* Sets what the SQL functions muster_map(KEY) and muster_map_text(KEY)
 * return while the next statement runs: the value or text of the pair with
 * that key, NULL for a key that has none.  `pairs` (`n` of them, sorted by
 * key, keys distinct) and their texts are borrowed and must outlive the
 * statement's steps; n = 0 clears the map.  It gives a batch statement a
 * per-row value that a bound parameter cannot (lease.c: each task's token;
 * lease_complete_batch.c: each completion's result). */
void store_map_set(store_t *st, const store_pair_t *pairs, size_t n);
/* Sorts `n` pairs by key for store_map_set; pairs already in order (a
 * batch usually is: ids ascending) are left as they are, unsorted. */
void store_pairs_sort(store_pair_t *pairs, size_t n);

/* Binds a NUL-terminated string or NULL (as SQL NULL). */
void store_bind_text(sqlite3_stmt *stmt, int idx, const char *text);
/* Column text copied into a fresh string, or NULL for SQL NULL (caller frees). */
char *store_column_dup(sqlite3_stmt *stmt, int col);

#endif
