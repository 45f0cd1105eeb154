/*
 * store.c — SQLite connection, the running of the numbered migrations
 * (store_schema.c holds them), group commit and the prepared-statement
 * cache.
 *
 * The workload is many small writes from one thread: WAL mode with one
 * long-lived connection, statements prepared once and reused, and one commit
 * (one fsync with synchronous=FULL) per event-loop turn however many requests
 * the turn handled.  Schema changes are migrations numbered by their index in
 * `store_migrations` (store_schema.c); PRAGMA user_version records how many
 * ran.
 */
#include "store.h"
#include "counts.h"
#include "leftover.h"
#include "log.h"
#include "metrics.h"
#include "store_restore.h"
#include "store_schema.h"
#include "walvfs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define STORE_STMT_CACHE 256
#define STORE_TOKEN_BLOCK 4096 /* tokens reserved per write of their floor */
#define STORE_ROOM_MIN_BYTES (1 << 20) /* free on the disk for "room again" (store_note_room) */

typedef struct {
  const char *sql; /* the literal's address is the key */
  sqlite3_stmt *stmt;
} stmt_slot_t;

/* The pairs muster_map() looks up, sorted by key. */
typedef struct {
  const store_pair_t *pairs;
  size_t n;
} store_map_t;

struct store {
  sqlite3 *db;
  bool in_tx;            /* the turn's transaction is open */
  int64_t last_token;    /* highest fencing token handed out */
  int64_t token_floor;   /* committed in meta: no token up to it is ever reused */
  int64_t opened_ms;     /* when this process opened the file (the token clock) */
  int64_t heard_since_ms; /* opened_ms, or the end of the last stall (store_heard_since_ms) */
  int64_t new_tasks;     /* lowest task id inserted since store_take_new_tasks */
  int64_t last_task;     /* highest task id handed out (store_task_ids) */
  int64_t task_floor;    /* committed in meta: no task id up to it is ever reused */
  bool tasks_deleted;    /* the open transaction deleted tasks */
  bool sessions_closing; /* session_trash may hold rows (store_sessions_closing) */
  store_tx_fn on_tx;
  store_ready_fn on_ready;
  store_session_fn on_session;
  void *hook_arg;
  store_map_t map;           /* what muster_map() reads (store_map_set) */
  struct counts_log *counts; /* count changes of the open transaction (counts.c) */
  struct leftover_set *leftovers; /* runs of what closed sessions left (leftover.c) */
  size_t nstmts;
  stmt_slot_t stmts[STORE_STMT_CACHE];
  uint64_t full_seen;     /* walvfs's count of writes the disk had no room for, last looked at */
  int64_t full_logged_ms; /* when a full disk was last logged; 0: never */
  uint64_t full_unlogged; /* failures for a full disk since, not logged */
  uint64_t full_refused;  /* requests refused for a full disk since it last took a write */
  int64_t full_changes;   /* sqlite3_total_changes64 at the last such refusal */
  char owner[96];         /* store_opts_t.owner: "the head" unless told */
  bool owner_says_room;   /* store_opts_t.owner_says_room */
};

#define MIGRATION_COUNT store_migration_count

/* True when the failure SQLite just reported came from a full disk: SQLite
 * says so itself (SQLITE_FULL), or a WAL write failed for want of room, which
 * walvfs reports to SQLite as an I/O error (walvfs.c says why). */
static bool store_disk_full(store_t *st) {
  walvfs_stats_t w;
  walvfs_stats(&w);
  bool full = w.full != st->full_seen || (sqlite3_extended_errcode(st->db) & 0xff) == SQLITE_FULL;
  st->full_seen = w.full;
  return full;
}

/* A write failed for want of room: the request is refused with the reason
 * and what to do; logged at most every 10 s under load (with the count). */
static muster_err_t store_fail_full(store_t *st, fail_t *f, const char *what) {
  const char *file = sqlite3_db_filename(st->db, "main");
  int64_t now = now_ms();
  if (st->full_logged_ms == 0 || now - st->full_logged_ms >= 10000) {
    char since[80] = "";
    if (st->full_unlogged > 0)
      snprintf(since, sizeof since, " (and %llu more time%s since the last such line)",
               (unsigned long long)st->full_unlogged, st->full_unlogged == 1 ? "" : "s");
    log_msg(LOG_ERROR,
            "store: %s: the disk holding %s is full%s; requests that write are "
            "refused until there is room",
            what, file ? file : "the store", since);
    st->full_logged_ms = now;
    st->full_unlogged = 0;
  } else {
    st->full_unlogged++;
  }
  st->full_refused++;
  st->full_changes = sqlite3_total_changes64(st->db);
  return fail_set(f, MUSTER_STORE,
                  "store: %s: the disk holding %s is full: nothing of this "
                  "request was applied; free space there and retry (%s goes on by itself)",
                  what, file ? file : "the store", st->owner);
}

/* Free bytes this process may write on the disk holding `file` (root may use
 * the blocks kept for it), or -1 when the disk cannot be asked. */
static int64_t store_free_bytes(const char *file) {
  struct statvfs vfs;
  if (file == NULL || statvfs(file, &vfs) != 0)
    return -1;
  uint64_t blocks = geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail;
  return (int64_t)(blocks * vfs.f_frsize);
}

/* After a commit: when writes were refused for a full disk and this commit
 * wrote rows, and the disk has STORE_ROOM_MIN_BYTES free, it has room again:
 * said once, with the count refused.  A small write can go through on a disk
 * still full, into the space the write-ahead log already has; counted as room,
 * the next batch's refusal followed it by milliseconds, said at once (the
 * line's 10 s limit starts again with room). */
static void store_note_room(store_t *st) {
  if (st->full_refused == 0 || st->owner_says_room ||
      sqlite3_total_changes64(st->db) == st->full_changes)
    return;
  const char *file = sqlite3_db_filename(st->db, "main");
  int64_t free_bytes = store_free_bytes(file);
  if (free_bytes >= 0 && free_bytes < STORE_ROOM_MIN_BYTES)
    return;
  log_msg(LOG_INFO,
          "store: the disk holding %s has room again: requests that write are taken again "
          "(%llu refused while it was full)",
          file ? file : "the store", (unsigned long long)st->full_refused);
  st->full_refused = st->full_unlogged = 0;
  st->full_logged_ms = 0;
}

muster_err_t store_fail(store_t *st, fail_t *f, const char *what) {
  if (st && st->db && store_disk_full(st))
    return store_fail_full(st, f, what);
  const char *msg = st && st->db ? sqlite3_errmsg(st->db) : "no database";
  log_msg(LOG_ERROR, "store: %s: %s", what, msg);
  return fail_set(f, MUSTER_STORE, "store: %s: %s", what, msg);
}

static muster_err_t store_exec(store_t *st, const char *sql, fail_t *f) {
  char *err = NULL;
  if (sqlite3_exec(st->db, sql, NULL, NULL, &err) != SQLITE_OK) {
    fail_set(f, MUSTER_STORE, "store: %s", err ? err : "exec failed");
    log_msg(LOG_ERROR, "%s (in: %.80s%s)", f->message, sql, strlen(sql) > 80 ? "..." : "");
    sqlite3_free(err);
    return MUSTER_STORE;
  }
  return MUSTER_OK;
}

static int store_user_version(store_t *st) {
  sqlite3_stmt *s = NULL;
  int version = -1;
  if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    version = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  return version;
}

/* Runs the migrations the file has not seen yet, each in its own transaction,
 * up to schema version `upto` (0: all of them).  A file a newer muster
 * migrated is refused untouched.  Whoever meets that refusal has most often
 * just gone back to an older binary on purpose (a rollback), so the message
 * says the two ways out rather than only "upgrade". */
static muster_err_t store_migrate(store_t *st, int upto, fail_t *f) {
  int target = upto > 0 && upto < MIGRATION_COUNT ? upto : MIGRATION_COUNT;
  int version = store_user_version(st);
  if (version < 0)
    return store_fail(st, f, "reading the schema version");
  if (version > MIGRATION_COUNT)
    return fail_set(f, MUSTER_STORE,
                    "the data file has schema version %d, newer than this muster's (%d): a "
                    "newer muster migrated it, and this one cannot read it (it was left as it "
                    "was). Run the newer muster on it, or, to go back to this version, restore "
                    "the backup taken before the upgrade (docs/operations.md, \"Upgrading\")",
                    version, MIGRATION_COUNT);
  for (int v = version; v < target; v++) {
    char bump[64];
    snprintf(bump, sizeof bump, "PRAGMA user_version = %d;", v + 1);
    if (store_exec(st, "BEGIN IMMEDIATE", f) || store_exec(st, store_migrations[v], f) ||
        store_exec(st, bump, f) || store_exec(st, "COMMIT", f)) {
      sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
      return f->code;
    }
  }
  /* One line, not one per migration: a new store runs them all. */
  if (version == 0 && target > 0)
    log_msg(LOG_INFO, "store: created a new store at schema version %d", target);
  else if (version < target)
    log_msg(LOG_INFO, "store: migrated the schema from version %d to %d", version, target);
  return MUSTER_OK;
}

/* The highest value handed out before this process: the larger of `sql`'s
 * first column (a max over tasks) and meta's floor `key`. */
static int64_t store_load_highest(store_t *st, const char *column, const char *key) {
  char sql[160];
  snprintf(sql, sizeof sql,
           "SELECT max(coalesce((SELECT max(%s) FROM tasks), 0),"
           " coalesce((SELECT v FROM meta WHERE k = '%s'), 0))",
           column, key);
  sqlite3_stmt *s = NULL;
  int64_t highest = 0;
  if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
    highest = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return highest;
}

/* True when `sql` returns a row; false also when it does not compile (a
 * table that a store migrated only so far, for tests, does not have). */
static bool store_any_row(store_t *st, const char *sql) {
  sqlite3_stmt *s = NULL;
  bool row =
      sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW;
  sqlite3_finalize(s);
  return row;
}

/* Before SQLite's first use: no global memory statistics, which would take a
 * process-wide mutex and update counters on every allocation SQLite makes. */
static void store_configure_sqlite(void) {
  sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/* The pair of the store's map with the first argument's key, or NULL. */
static const store_pair_t *store_map_find(sqlite3_context *ctx, sqlite3_value **argv) {
  const store_map_t *map = sqlite3_user_data(ctx);
  if (sqlite3_value_type(argv[0]) != SQLITE_INTEGER)
    return NULL;
  int64_t key = sqlite3_value_int64(argv[0]);
  size_t lo = 0, hi = map->n; /* a binary search: a batch's rows are few */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (map->pairs[mid].key < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < map->n && map->pairs[lo].key == key ? &map->pairs[lo] : NULL;
}

/* muster_map(KEY): the value of KEY's pair in the store's map, or NULL
 * (store_map_set). */
static void store_map_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  (void)argc;
  const store_pair_t *pair = store_map_find(ctx, argv);
  if (pair)
    sqlite3_result_int64(ctx, pair->value);
  else
    sqlite3_result_null(ctx);
}

/* muster_map_text(KEY): the text of KEY's pair, or NULL.  Static: the text
 * outlives the statement's step (store_map_set). */
static void store_map_text_fn(sqlite3_context *ctx, int argc, sqlite3_value **argv) {
  (void)argc;
  const store_pair_t *pair = store_map_find(ctx, argv);
  if (pair && pair->text)
    sqlite3_result_text64(ctx, pair->text, pair->text_len, SQLITE_STATIC, SQLITE_UTF8);
  else
    sqlite3_result_null(ctx);
}

static int store_pair_cmp(const void *a, const void *b) {
  int64_t x = ((const store_pair_t *)a)->key, y = ((const store_pair_t *)b)->key;
  return (x > y) - (x < y);
}

void store_pairs_sort(store_pair_t *pairs, size_t n) {
  for (size_t i = 1; i < n; i++)
    if (pairs[i].key < pairs[i - 1].key) {
      qsort(pairs, n, sizeof *pairs, store_pair_cmp);
      return;
    }
}

void store_map_set(store_t *st, const store_pair_t *pairs, size_t n) {
  st->map = (store_map_t){.pairs = n ? pairs : NULL, .n = n};
}

/* The VFS the store opens its file with: "muster-wal", which writes a
 * commit's WAL frames with one call (walvfs.c), unless the environment sets
 * MUSTER_WAL_COALESCE=0 (a way back to SQLite's own VFS, to compare or to
 * rule it out); NULL, SQLite's default, also when it cannot be registered.
 * Another value than 0 or 1 is said and taken for 1, the default. */
static const char *store_vfs(void) {
  const char *coalesce = getenv("MUSTER_WAL_COALESCE");
  if (coalesce && strcmp(coalesce, "0") == 0)
    return NULL;
  if (coalesce && strcmp(coalesce, "1") != 0)
    log_msg(LOG_WARN, "MUSTER_WAL_COALESCE=%.40s is not 0 to 1; the default 1 is kept", coalesce);
  return walvfs_register();
}

/* Sets the connection's pragmas; non-zero (the failure) when one failed. */
static muster_err_t store_pragmas(store_t *st, bool sync_full, fail_t *f) {
  /* The head is the file's only user (it holds a flock on the data dir for
   * its life, and nothing else opens muster.db), so the connection keeps its
   * lock: no fcntl lock calls per transaction, and, set before the first WAL
   * access, no shared-memory wal-index (it lives in heap memory). */
  const char *pragmas = sync_full ? "PRAGMA locking_mode=EXCLUSIVE;"
                                    " PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                  : "PRAGMA locking_mode=EXCLUSIVE;"
                                    " PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;";
  /* An 8 MiB page cache, not more: the hot pages (the ends of the task table
   * and its indexes) fit many times over, and SQLite 3.40 walks the whole
   * cache's hash table at a commit after a b-tree split (pcache1 truncation,
   * design-notes "A small page cache"), so a larger cache costs CPU at every
   * such commit: 64 MiB cost 1.08-1.24x the head's CPU per task batched.
   * Cold pages come back from the kernel's page cache. */
  if (store_exec(st, pragmas, f))
    return f->code;
  return store_exec(st,
                    "PRAGMA foreign_keys=OFF; PRAGMA temp_store=MEMORY;"
                    "PRAGMA cache_size=-8192; PRAGMA wal_autocheckpoint=4000;",
                    f);
}

/* Defines muster's SQL functions, once: (re)defining a function expires
 * every prepared statement. Direct only: no trigger or view may call them. */
static bool store_define_functions(store_t *st, fail_t *f) {
  if (sqlite3_create_function_v2(st->db, "muster_map", 1, SQLITE_UTF8 | SQLITE_DIRECTONLY, &st->map,
                                 store_map_fn, NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_create_function_v2(st->db, "muster_map_text", 1, SQLITE_UTF8 | SQLITE_DIRECTONLY,
                                 &st->map, store_map_text_fn, NULL, NULL, NULL) != SQLITE_OK) {
    store_fail(st, f, "muster_map");
    return false;
  }
  return true;
}

/*
 * The lowest fencing token a store opened at `opened_ms` hands out.  A head
 * started on a copy of its data (a backup, DATA_DIR/backups/NAME; a file
 * system or VM snapshot) knows only the tokens the copy does: the original
 * may have handed out higher ones after the copy was taken, to workers that
 * still hold them.  Were a token handed out again, such a worker's complete
 * or fail could be taken for the new lease of a task with the same id.
 * Starting above the clock's milliseconds times STORE_TOKEN_CLOCK_SCALE puts
 * every token of a later start above those of any earlier one, as long as
 * no head hands out more than that many tokens a millisecond (a million a
 * second; the heaviest batched load measured is well under a fifth of it)
 * and the clock does not go back; the store's own floor still holds if it
 * does.  The tokens stay below 2^53 (until the year 2248), so that a
 * JavaScript client keeps them exact.  A store that is a backup's copy
 * raises its other id counters to the same floor as it opens, once
 * (store_restore.c): unlike tokens, users read those, so a plain start
 * leaves them consecutive.
 */
#define STORE_TOKEN_CLOCK_SCALE 1024
static int64_t store_token_clock(int64_t opened_ms) {
  return opened_ms > 0 ? opened_ms * STORE_TOKEN_CLOCK_SCALE : 0;
}

int store_create_private(const char *path) {
  if (path[0] == '\0' || strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0)
    return 0; /* no file of that name: SQLite's own (the unit tests' in-memory stores) */
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    return errno;
  close(fd);
  return 0;
}

store_t *store_open(const store_opts_t *opts, fail_t *f) {
  static pthread_once_t configured = PTHREAD_ONCE_INIT;
  pthread_once(&configured, store_configure_sqlite);
  store_t *st = calloc(1, sizeof *st);
  if (st == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  st->opened_ms = now_ms();
  st->heard_since_ms = st->opened_ms;
  snprintf(st->owner, sizeof st->owner, "%s", opts->owner ? opts->owner : "the head");
  st->owner_says_room = opts->owner_says_room;
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  (void)store_create_private(opts->path); /* a failure is SQLite's to report, in its words */
  if (sqlite3_open_v2(opts->path, &st->db, flags, store_vfs()) != SQLITE_OK) {
    store_fail(st, f, opts->path);
    store_close(st);
    return NULL;
  }
  sqlite3_extended_result_codes(st->db, 1);
  if (!store_define_functions(st, f)) {
    store_close(st);
    return NULL;
  }
  if (store_pragmas(st, opts->sync_full, f) || store_migrate(st, opts->schema_version, f) ||
      store_restore_ids(st->db, store_token_clock(st->opened_ms), f)) {
    store_close(st);
    return NULL;
  }
  st->last_token = st->token_floor = store_load_highest(st, "token", "last_token");
  if (st->last_token < store_token_clock(st->opened_ms))
    st->last_token = store_token_clock(st->opened_ms);
  st->last_task = st->task_floor = store_load_highest(st, "id", "last_task");
  st->new_tasks = INT64_MAX;
  st->sessions_closing = store_any_row(st, "SELECT 1 FROM session_trash LIMIT 1");
  return st;
}

struct counts_log **store_counts_log(store_t *st) {
  return &st->counts;
}

struct leftover_set **store_leftovers(store_t *st) {
  return &st->leftovers;
}

void store_close(store_t *st) {
  if (st == NULL)
    return;
  counts_log_free(st);
  leftover_free(st);
  if (st->in_tx && st->db)
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
  for (size_t i = 0; i < st->nstmts; i++)
    sqlite3_finalize(st->stmts[i].stmt);
  sqlite3_close(st->db);
  free(st);
}

void store_set_sync_full(store_t *st, bool full) {
  fail_t ignored = {0};
  store_exec(st, full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", &ignored);
}

int64_t store_changes(store_t *st) {
  return sqlite3_total_changes64(st->db);
}

void store_set_hooks(store_t *st, store_tx_fn on_tx, store_ready_fn on_ready, void *arg) {
  st->on_tx = on_tx;
  st->on_ready = on_ready;
  st->hook_arg = arg;
}

void store_set_session_hook(store_t *st, store_session_fn on_session) {
  st->on_session = on_session;
}

sqlite3 *store_db(store_t *st) {
  return st->db;
}

bool store_in_tx(const store_t *st) {
  return st->in_tx;
}

/* Runs one of the transaction-control statements through the cache: they
 * run on every request, so parsing them each time would show. */
static muster_err_t store_control(store_t *st, const char *sql, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, sql);
  int rc = sqlite3_step(s);
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? MUSTER_OK : store_fail(st, f, sql);
}

muster_err_t store_request_begin(store_t *st, fail_t *f) {
  if (!st->in_tx) {
    if (store_control(st, "BEGIN IMMEDIATE", f))
      return f->code;
    st->in_tx = true;
    if (st->on_tx)
      st->on_tx(st->hook_arg);
  }
  counts_log_mark(st);
  return store_control(st, "SAVEPOINT req", f);
}

void store_request_end(store_t *st, bool ok) {
  fail_t ignored = {0};
  if (!ok) {
    store_control(st, "ROLLBACK TO req", &ignored);
    counts_log_undo(st); /* the count changes go with the rows they counted */
  }
  store_control(st, "RELEASE req", &ignored);
  metrics_request_end(ok);
}

/* Sets meta's `key` to `v` in the open transaction. */
static muster_err_t store_write_floor(store_t *st, const char *sql, int64_t v, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "meta floor");
  sqlite3_bind_int64(s, 1, v);
  return store_step_done(st, s, f);
}

/* Raises meta's floors before a commit (see store_commit); *token_floor gets
 * the token floor that the commit makes durable. */
static muster_err_t store_write_floors(store_t *st, int64_t *token_floor, fail_t *f) {
  /* Tokens must never repeat, even after the tasks that carried the highest
   * ones are deleted, so meta holds a floor above every token handed out.  It
   * is raised a block of STORE_TOKEN_BLOCK at a time: most commits (every one
   * without a lease, and all but one in STORE_TOKEN_BLOCK with) write no meta
   * page at all.  A restart starts above the floor, skipping the unused rest. */
  *token_floor = st->token_floor;
  if (st->last_token > st->token_floor) {
    *token_floor = st->last_token + STORE_TOKEN_BLOCK;
    if (store_write_floor(st,
                          "INSERT INTO meta(k, v) VALUES('last_token', ?1)"
                          " ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                          *token_floor, f))
      return f->code;
  }
  /* Task ids never repeat either (a client holding an old id must not read
   * another task), yet only a transaction that deleted tasks can remove the
   * highest id, which a restart would otherwise start after: that one writes
   * the exact floor, so ids stay consecutive and puts write no meta page. */
  if (st->tasks_deleted && st->last_task > st->task_floor &&
      store_write_floor(st,
                        "INSERT INTO meta(k, v) VALUES('last_task', ?1)"
                        " ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                        st->last_task, f))
    return f->code;
  return MUSTER_OK;
}

muster_err_t store_commit(store_t *st, fail_t *f) {
  if (!st->in_tx)
    return MUSTER_OK;
  st->in_tx = false;
  int64_t token_floor = st->token_floor;
  bool ok =
      store_write_floors(st, &token_floor, f) == MUSTER_OK && counts_log_write(st, f) == MUSTER_OK;
  bool deleted = st->tasks_deleted;
  st->tasks_deleted = false;
  int64_t start_us = metrics_now_us();
  if (!ok || store_control(st, "COMMIT", f) != MUSTER_OK) {
    sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    counts_log_forget(st);
    metrics_commit(false, metrics_now_us() - start_us);
    return MUSTER_STORE;
  }
  metrics_commit(true, metrics_now_us() - start_us);
  store_note_room(st);
  st->token_floor = token_floor;
  if (deleted)
    st->task_floor = st->last_task;
  return MUSTER_OK;
}

sqlite3_stmt *store_stmt(store_t *st, const char *sql) {
  for (size_t i = 0; i < st->nstmts; i++)
    if (st->stmts[i].sql == sql)
      return st->stmts[i].stmt;
  sqlite3_stmt *stmt = NULL;
  if (sqlite3_prepare_v3(st->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, NULL) != SQLITE_OK) {
    log_msg(LOG_ERROR, "store: cannot prepare %.120s: %s", sql, sqlite3_errmsg(st->db));
    return NULL;
  }
  if (st->nstmts < STORE_STMT_CACHE)
    st->stmts[st->nstmts++] = (stmt_slot_t){sql, stmt};
  else
    log_msg(LOG_WARN, "store: statement cache full; raise STORE_STMT_CACHE");
  return stmt;
}

void store_reset(sqlite3_stmt *stmt) {
  sqlite3_reset(stmt);
  sqlite3_clear_bindings(stmt);
}

muster_err_t store_step_done(store_t *st, sqlite3_stmt *stmt, fail_t *f) {
  int rc = sqlite3_step(stmt);
  store_reset(stmt);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW)
    return store_fail(st, f, "write");
  return MUSTER_OK;
}

bool store_due(store_t *st, const char *sql, int64_t now) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return true;
  sqlite3_bind_int64(s, 1, now);
  if (sqlite3_bind_parameter_count(s) >= 2)
    sqlite3_bind_int64(s, 2, st->heard_since_ms);
  bool due = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return due;
}

int64_t store_next_token(store_t *st) {
  return ++st->last_token;
}

int64_t store_last_token(const store_t *st) {
  return st->last_token;
}

int64_t store_token_floor(const store_t *st) {
  return st->token_floor;
}

int64_t store_heard_since_ms(const store_t *st) {
  return st->heard_since_ms;
}

void store_note_stall(store_t *st, int64_t now) {
  if (now > st->heard_since_ms)
    st->heard_since_ms = now;
}

int64_t store_task_ids(store_t *st, int64_t n) {
  int64_t first = st->last_task + 1;
  st->last_task += n;
  if (first < st->new_tasks)
    st->new_tasks = first;
  return first;
}

int64_t store_last_task(const store_t *st) {
  return st->last_task;
}

void store_note_tasks_deleted(store_t *st) {
  st->tasks_deleted = true;
}

bool store_sessions_closing(const store_t *st) {
  return st->sessions_closing;
}

void store_set_sessions_closing(store_t *st, bool closing) {
  st->sessions_closing = closing;
}

int64_t store_new_tasks(const store_t *st) {
  return st->new_tasks;
}

int64_t store_take_new_tasks(store_t *st) {
  int64_t low = st->new_tasks;
  st->new_tasks = INT64_MAX;
  return low;
}

void store_notify_ready(store_t *st, const char *queue) {
  if (st->on_ready)
    st->on_ready(st->hook_arg, queue);
}

void store_notify_session(store_t *st, const char *session) {
  if (st->on_session)
    st->on_session(st->hook_arg, session);
}

void store_bind_text(sqlite3_stmt *stmt, int idx, const char *text) {
  if (text)
    sqlite3_bind_text(stmt, idx, text, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(stmt, idx);
}

char *store_column_dup(sqlite3_stmt *stmt, int col) {
  const unsigned char *text = sqlite3_column_text(stmt, col);
  return text ? strdup((const char *)text) : NULL;
}
