/*
 * backup.c — POST /v1/backup: a consistent copy of the head's state in a
 * new directory, DATA_DIR/backups/NAME, made while the head serves.
 *
 * The store's file is the head's alone (locking_mode=EXCLUSIVE): no other
 * process can read it while the head runs, so the copy is made on the
 * head's own connection, with SQLite's online backup API, BACKUP_STEP_PAGES
 * pages per step, one step at a time between the requests.  SQLite copies
 * nothing while a write transaction is open (a step answers SQLITE_BUSY),
 * and under load the group commit keeps one open during most of a turn, so
 * a step runs right after each commit (head_commit, backup_pump), and from
 * the backup's own timer while the head is idle.  Commits made through the
 * connection while the copy runs are carried into it by SQLite (a page
 * already copied is copied again as it is written), and a rollback of pages
 * already in the WAL restarts the copy: when a step answers SQLITE_DONE the
 * copy is the committed state of that moment.
 *
 * In that same callback, with no request in between, the head reads which
 * blob files that state's levels name and what it holds, and hands the rest
 * to a helper thread (backup_files.c): link or copy the blob files, write
 * the token, fsync it all.  Meanwhile the sweep unlinks no blob file
 * (backup_holds_files), so every file the copy names is there to link.  The
 * request is answered when the thread ends: 201 with what the backup holds,
 * or the failure, the backup removed.  A failure leaves nothing: the
 * directory is removed with whatever it held.
 */
#include "backup.h"
#include "core/knob.h"
#include "backup_files.h"
#include "jv.h"
#include "log.h"
#include "metrics.h"
#include "store.h"
#include "task.h"

#include <dirent.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* How soon the timer looks again when it found a transaction open. */
#define BACKUP_RETRY_MS 10

struct backup {
  head_t *head;
  h1_req_t *req; /* the parked POST: answered when the backup is made or failed */
  char name[NAME_MAX_LEN + 1];
  backup_seal_t seal;      /* the directory, the files to link, the token; what it found */
  sqlite3 *dest;           /* DIR/muster.db, until the copy completes */
  sqlite3_backup *copy;    /* SQLite's backup into it; NULL before the first step */
  struct event *step_ev;   /* the next step, while the head is idle */
  int step_pages;          /* pages per step */
  int64_t started_us;      /* when the request came (metrics_now_us) */
  int64_t taken_ms;        /* when the copy completed: the moment the backup holds */
  int64_t steps;           /* steps run */
  int64_t longest_step_us; /* the longest of them: the most it held the loop */
  int pages;               /* the database's pages, as the last step saw them */
  json_t *holds;           /* what the copy holds, read as it completed */
  bool sealing;            /* the helper thread runs backup_seal */
  pthread_t thread;        /* that thread */
  int pipe_fds[2];         /* thread -> loop: one byte when it has ended */
  struct event *sealed_ev; /* reads it */
  muster_err_t sealed;     /* backup_seal's result (read after the join) */
};

/* ---- the request ---- */

/* The pages per step: BACKUP_STEP_PAGES or MUSTER_BACKUP_STEP_PAGES. */
static int backup_step_pages(void) {
  const char *text = getenv("MUSTER_BACKUP_STEP_PAGES");
  if (text == NULL)
    return BACKUP_STEP_PAGES;
  long long v;
  if (knob_int(text, 1, 1000000, &v))
    return (int)v;
  log_msg(LOG_WARN, "MUSTER_BACKUP_STEP_PAGES=%s is not 1 to 1000000; the default %d is kept", text,
          BACKUP_STEP_PAGES);
  return BACKUP_STEP_PAGES;
}

/* The backup's name into `out`: `given`, checked, or the UTC time
 * ("20250131T235959Z") when none was given. */
static muster_err_t backup_name(const char *given, char out[NAME_MAX_LEN + 1], fail_t *f) {
  if (given == NULL) {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(out, NAME_MAX_LEN + 1, "%Y%m%dT%H%M%SZ", &tm);
    return MUSTER_OK;
  }
  if (!name_is_valid(given) || given[0] == '.')
    return fail_set(f, MUSTER_NAME_INVALID,
                    "name: backup name '%.140s' is invalid: use 1 to 128 characters of letters, "
                    "digits, '.', '_' and '-', not starting with '.'",
                    given);
  snprintf(out, NAME_MAX_LEN + 1, "%s", given);
  return MUSTER_OK;
}

/* Refuses a backup while another runs or the head stops. */
static muster_err_t backup_check_idle(const head_t *h, fail_t *f) {
  const backup_t *b = h->backup;
  if (h->stopping)
    return fail_set(f, MUSTER_UNAVAILABLE,
                    "the head is shutting down; take the backup once it "
                    "is back");
  if (b == NULL)
    return MUSTER_OK;
  int64_t ago_ms = (metrics_now_us() - b->started_us) / 1000;
  if (b->sealing)
    return fail_set(f, MUSTER_INVALID_STATE,
                    "a backup is already running: '%s', started %lld ms ago, is syncing its "
                    "files; one runs at a time: send this one again when it has answered",
                    b->name, (long long)ago_ms);
  int left = b->copy ? sqlite3_backup_remaining(b->copy) : b->pages;
  return fail_set(f, MUSTER_INVALID_STATE,
                  "a backup is already running: '%s', started %lld ms ago, has %d of %d "
                  "database pages left to copy; one runs at a time: send this one again when "
                  "it has answered",
                  b->name, (long long)ago_ms, left, b->pages);
}

/* Creates the directory the backup is made in, DATA_DIR/backups/.NAME.partial
 * (and DATA_DIR/backups, the first time), once no backup has the name: a
 * head killed while it makes one leaves no directory under the name
 * (backup_remove_unfinished removes the rest as the next head starts). */
static muster_err_t backup_make_dir(backup_t *b, fail_t *f) {
  char parent[PATH_MAX + 16];
  struct stat st;
  snprintf(parent, sizeof parent, "%s/backups", b->seal.data_dir);
  if (mkdir(parent, 0700) != 0 && errno != EEXIST) /* a copy of the data dir: as private */
    return fail_set(f, MUSTER_STORE, "cannot create %s: %s", parent, strerror(errno));
  if (snprintf(b->seal.final_dir, sizeof b->seal.final_dir, "%s/%s", parent, b->name) >=
          (int)sizeof b->seal.final_dir ||
      snprintf(b->seal.dir, sizeof b->seal.dir, "%s/.%s" BACKUP_PARTIAL_SUFFIX, parent, b->name) >=
          (int)sizeof b->seal.dir)
    return fail_set(f, MUSTER_STORE, "the path %s/%s is too long", parent, b->name);
  if (lstat(b->seal.final_dir, &st) == 0)
    return fail_set(f, MUSTER_INVALID_STATE,
                    "backup '%s' exists already (%s): choose another name, or remove it first",
                    b->name, b->seal.final_dir);
  backup_remove(b->seal.dir); /* one a killed head left, had the next not removed it */
  if (mkdir(b->seal.dir, 0700) == 0)
    return MUSTER_OK;
  return fail_set(f, MUSTER_STORE, "cannot create %s: %s", b->seal.dir, strerror(errno));
}

void backup_remove_unfinished(const char *data_dir) {
  char parent[PATH_MAX + 16], path[PATH_MAX + NAME_MAX + 32], name[NAME_MAX_LEN + 1];
  snprintf(parent, sizeof parent, "%s/backups", data_dir);
  DIR *dir = opendir(parent);
  if (dir == NULL)
    return; /* no backup was ever made */
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (backup_partial_name(e->d_name, name, sizeof name) == NULL)
      continue;
    snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
    int err = backup_remove(path);
    if (err != 0)
      log_msg(LOG_WARN,
              "backup '%s' was left unfinished in %s by a head that stopped while "
              "making it; removing it failed (%s): remove it",
              name, path, strerror(err));
    else
      log_msg(LOG_INFO,
              "backup '%s' was left unfinished in %s by a head that stopped while "
              "making it (no backup has its name): removed it; run the backup again",
              name, path);
  }
  closedir(dir);
}

static void backup_on_timer(evutil_socket_t fd, short what, void *arg);

/* Opens DIR/muster.db for the copy.  No journal and no sync of its own:
 * the file is new, a failed backup is removed whole, and the seal fsyncs it
 * off the loop. */
static muster_err_t backup_open_dest(backup_t *b, fail_t *f) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/muster.db", b->seal.dir);
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  (void)store_create_private(path); /* the store's copy: its owner's alone, as the store */
  if (sqlite3_open_v2(path, &b->dest, flags, NULL) == SQLITE_OK &&
      sqlite3_exec(b->dest, "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;", NULL, NULL, NULL) ==
          SQLITE_OK)
    return MUSTER_OK;
  int err = b->dest ? sqlite3_system_errno(b->dest) : 0;
  if (fail_errno_is_fds(err))
    return backup_errno_fail(f, "create", path, err);
  return fail_set(f, MUSTER_STORE, "cannot create %s: %s", path,
                  b->dest ? sqlite3_errmsg(b->dest) : "out of memory");
}

static void backup_free(backup_t *b) {
  if (b == NULL)
    return;
  if (b->step_ev)
    event_free(b->step_ev);
  if (b->sealed_ev)
    event_free(b->sealed_ev);
  for (int i = 0; i < 2; i++)
    if (b->pipe_fds[i] >= 0)
      close(b->pipe_fds[i]);
  if (b->copy)
    sqlite3_backup_finish(b->copy);
  sqlite3_close(b->dest); /* accepts NULL */
  free(b->seal.files);
  json_decref(b->holds);
  free(b);
}

/* A new backup named `name`, its directory made and its database file open;
 * NULL with *f filled (and nothing left on disk) when it cannot start. */
static backup_t *backup_new(head_t *h, const char *name, fail_t *f) {
  backup_t *b = calloc(1, sizeof *b);
  if (b == NULL) {
    fail_set(f, MUSTER_NOMEM, "out of memory");
    return NULL;
  }
  *b = (backup_t){.head = h,
                  .pipe_fds = {-1, -1},
                  .step_pages = backup_step_pages(),
                  .started_us = metrics_now_us()};
  snprintf(b->name, sizeof b->name, "%s", name);
  snprintf(b->seal.data_dir, sizeof b->seal.data_dir, "%s", h->cfg.data_dir);
  snprintf(b->seal.token, sizeof b->seal.token, "%s", h->cfg.token);
  if (backup_make_dir(b, f)) {
    backup_free(b);
    return NULL;
  }
  b->step_ev = event_new(h->base, -1, 0, backup_on_timer, b);
  if (b->step_ev == NULL)
    fail_set(f, MUSTER_NOMEM, "out of memory");
  if (b->step_ev == NULL || backup_open_dest(b, f)) {
    sqlite3_close(b->dest);
    b->dest = NULL;
    backup_remove(b->seal.dir);
    backup_free(b);
    return NULL;
  }
  return b;
}

/* The next step in `delay_ms` (0: at the loop's next turn). */
static void backup_schedule_in(backup_t *b, int delay_ms) {
  struct timeval delay = {0, delay_ms * 1000};
  evtimer_add(b->step_ev, &delay);
}

static void backup_schedule(backup_t *b) {
  backup_schedule_in(b, 0);
}

/* A backup that could not start on the head's side (its directory or its
 * database file cannot be made: a read-only or full disk, no descriptors
 * left) is said in the head's log too, as one that failed later is, and its
 * answer names it: the log of a head whose nightly backup fails otherwise
 * shows nothing.  A name that exists is the caller's to fix: only answered. */
static void backup_start_failed(const char *name, fail_t *f) {
  if (f->code == MUSTER_INVALID_STATE)
    return;
  fail_t said;
  fail_set(&said, f->code, "backup '%s' could not start: %s", name, fail_message(f));
  log_msg(f->code == MUSTER_UNAVAILABLE ? LOG_WARN : LOG_ERROR, "%s", said.message);
  *f = said;
}

void backup_h_create(http_req_t *r) {
  static const char *const allowed[] = {"name", NULL};
  head_t *h = r->head;
  fail_t f = {0};
  const char *given = NULL;
  char name[NAME_MAX_LEN + 1];
  backup_t *b = NULL;
  if (jv_only(r->body, "", allowed, &f) ||
      jv_str(r->body, "name", "", NULL, 4 * NAME_MAX_LEN, &given, &f) ||
      backup_name(given, name, &f) || backup_check_idle(h, &f)) {
    http_reply_fail(r, &f);
    return;
  }
  if ((b = backup_new(h, name, &f)) == NULL) {
    backup_start_failed(name, &f);
    http_reply_fail(r, &f);
    return;
  }
  log_msg(LOG_INFO, "backup '%s': copying the store into %s, %d page%s per step", b->name,
          b->seal.dir, b->step_pages, b->step_pages == 1 ? "" : "s");
  b->req = r->req;
  r->parked = true;
  h->backup = b;
  backup_schedule(b); /* a step cannot run now: the request's transaction is open */
}

/* ---- the end ---- */

/* Ends the backup: the request was answered (or its client is gone). */
static void backup_end(backup_t *b) {
  b->head->backup = NULL;
  backup_free(b);
}

/* The backup failed (*f says why): removes what there is of it, logs and
 * answers. */
static void backup_fail(backup_t *b, const fail_t *f) {
  if (b->copy) {
    sqlite3_backup_finish(b->copy);
    b->copy = NULL;
  }
  sqlite3_close(b->dest); /* before its file goes */
  b->dest = NULL;
  int remove_err = backup_remove(b->seal.dir);
  fail_t said;
  if (remove_err)
    fail_set(&said, f->code, "backup '%s' failed: %s; removing %s failed too (%s): remove it",
             b->name, fail_message(f), b->seal.dir, strerror(remove_err));
  else
    fail_set(&said, f->code, "backup '%s' failed and was removed: %s", b->name, fail_message(f));
  log_msg(f->code == MUSTER_UNAVAILABLE ? LOG_WARN : LOG_ERROR, "%s", said.message);
  http_enqueue_fail(b->head, b->req, &said);
  backup_end(b);
}

/* The seal ended well: logs and answers 201 with what the backup holds. */
static void backup_succeed(backup_t *b) {
  const backup_seal_t *s = &b->seal;
  char path[PATH_MAX], time_text[32];
  if (realpath(s->dir, path) == NULL)
    snprintf(path, sizeof path, "%s", s->dir);
  log_format_time(b->taken_ms, time_text);
  int64_t bytes = s->database_bytes + s->shared_bytes;
  int64_t took_ms = (metrics_now_us() - b->started_us) / 1000;
  log_msg(LOG_INFO,
          "backup '%s': made in %s: %lld bytes (the database %lld; blob files: %zu linked, %zu "
          "copied); the state of %s; %lld ms, the database in %lld step%s of %d page%s (the "
          "longest %.1f ms)",
          b->name, path, (long long)bytes, (long long)s->database_bytes, s->linked, s->copied,
          time_text, (long long)took_ms, (long long)b->steps, b->steps == 1 ? "" : "s",
          b->step_pages, b->step_pages == 1 ? "" : "s", b->longest_step_us / 1000.0);
  json_t *reply = json_pack(
      "{s:s, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:O, s:{s:I, s:I}}", "name", b->name, "path", path,
      "bytes", (json_int_t)bytes, "database_bytes", (json_int_t)s->database_bytes, "shared_bytes",
      (json_int_t)s->shared_bytes, "time", time_text, "time_ms", (json_int_t)b->taken_ms,
      "duration_ms", (json_int_t)took_ms, "holds", b->holds, "shared_files", "linked",
      (json_int_t)s->linked, "copied", (json_int_t)s->copied);
  http_enqueue(b->head, b->req, 201, reply);
  backup_end(b);
}

/* ---- the seal, on a helper thread ---- */

static void *backup_seal_main(void *arg) {
  backup_t *b = arg;
  b->sealed = backup_seal(&b->seal);
  char done = 1;
  while (write(b->pipe_fds[1], &done, 1) < 0 && errno == EINTR)
    ;
  return NULL;
}

/* The thread has ended (or is about to): joins it and answers. */
static void backup_sealed(backup_t *b) {
  pthread_join(b->thread, NULL);
  b->sealing = false;
  if (b->sealed == MUSTER_OK)
    backup_succeed(b);
  else
    backup_fail(b, &b->seal.fail);
}

static void backup_on_sealed(evutil_socket_t fd, short what, void *arg) {
  char done;
  if (read(fd, &done, 1) != 1)
    return; /* a spurious wake-up: the byte comes whole or not at all */
  backup_sealed(arg);
}

/* Starts the thread that seals the backup (backup_seal). */
static muster_err_t backup_start_seal(backup_t *b, fail_t *f) {
  if (pipe2(b->pipe_fds, O_CLOEXEC) != 0)
    return backup_errno_fail(f, "make", "a pipe for the backup's thread", errno);
  b->sealed_ev = event_new(b->head->base, b->pipe_fds[0], EV_READ, backup_on_sealed, b);
  if (b->sealed_ev == NULL || event_add(b->sealed_ev, NULL) != 0)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  int err = pthread_create(&b->thread, NULL, backup_seal_main, b);
  if (err != 0)
    return fail_set(f, MUSTER_STORE, "cannot start the backup's thread: %s", strerror(err));
  b->sealing = true;
  return MUSTER_OK;
}

/* ---- the copy, on the loop ---- */

/* The blob files the store's levels name, into b->seal.files. */
static muster_err_t backup_read_files(backup_t *b, fail_t *f) {
  sqlite3 *db = store_db(b->head->st);
  sqlite3_stmt *s = NULL;
  if (sqlite3_prepare_v2(db, "SELECT file FROM shared_levels", -1, &s, NULL) != SQLITE_OK)
    return store_fail(b->head->st, f, "listing the shared data files");
  size_t cap = 0;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (b->seal.nfiles == cap) {
      cap = cap ? 2 * cap : 64;
      backup_file_name_t *more = realloc(b->seal.files, cap * sizeof *more);
      if (more == NULL)
        break;
      b->seal.files = more;
    }
    snprintf(b->seal.files[b->seal.nfiles++], sizeof(backup_file_name_t), "%s",
             (const char *)sqlite3_column_text(s, 0));
  }
  sqlite3_finalize(s);
  if (rc == SQLITE_ROW)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  return rc == SQLITE_DONE ? MUSTER_OK
                           : store_fail(b->head->st, f, "listing the shared data files");
}

/* The first column of one-row query `sql`, or -1 when it failed. */
static int64_t backup_count(store_t *st, const char *sql) {
  sqlite3_stmt *s = NULL;
  int64_t n = -1;
  if (sqlite3_prepare_v2(store_db(st), sql, -1, &s, NULL) == SQLITE_OK &&
      sqlite3_step(s) == SQLITE_ROW)
    n = sqlite3_column_int64(s, 0);
  sqlite3_finalize(s);
  return n;
}

/* {"tasks": N, "queued": N, ...}: the tasks per state, from the queue counts
 * (six rows, cheap at any size); NULL when they cannot be read. */
static json_t *backup_read_tasks(store_t *st) {
  sqlite3_stmt *s = NULL;
  json_t *tasks = json_object();
  int64_t total = 0;
  for (int i = 0; i < TASK_STATE_COUNT; i++)
    json_object_set_new(tasks, task_state_name(i), json_integer(0));
  int rc = sqlite3_prepare_v2(store_db(st), "SELECT state, sum(n) FROM queue_counts GROUP BY state",
                              -1, &s, NULL);
  while (rc == SQLITE_OK || rc == SQLITE_ROW) {
    if ((rc = sqlite3_step(s)) != SQLITE_ROW)
      break;
    int state = sqlite3_column_int(s, 0);
    int64_t n = sqlite3_column_int64(s, 1);
    total += n;
    if (state >= 0 && state < TASK_STATE_COUNT)
      json_object_set_new(tasks, task_state_name(state), json_integer(n));
  }
  sqlite3_finalize(s);
  json_object_set_new(tasks, "total", json_integer(total));
  if (rc == SQLITE_DONE)
    return tasks;
  json_decref(tasks);
  return NULL;
}

/* What the store holds now: {"queues", "tasks": {"total", "queued", ...},
 * "sessions" (open), "iterations", "shared_levels"}; NULL with *f filled. */
static json_t *backup_read_holds(store_t *st, fail_t *f) {
  int64_t queues = backup_count(st, "SELECT count(*) FROM queues");
  int64_t sessions = backup_count(st, "SELECT count(*) FROM sessions WHERE state = 0");
  int64_t iterations = backup_count(st, "SELECT count(*) FROM iterations");
  int64_t levels = backup_count(st, "SELECT count(*) FROM shared_levels");
  json_t *tasks = backup_read_tasks(st);
  if (queues < 0 || sessions < 0 || iterations < 0 || levels < 0 || tasks == NULL) {
    json_decref(tasks);
    store_fail(st, f, "counting what the backup holds");
    return NULL;
  }
  return json_pack("{s:I, s:o, s:I, s:I, s:I}", "queues", (json_int_t)queues, "tasks", tasks,
                   "sessions", (json_int_t)sessions, "iterations", (json_int_t)iterations,
                   "shared_levels", (json_int_t)levels);
}

/* Marks the copy as a backup's, taken at b->taken_ms: a head that opens it
 * knows it is a restore, and that the head it was taken from may have
 * handed out ids after that moment (store_restore.c).  The live store never
 * gets the row: it is written into the copy, once the copy is complete. */
static bool backup_mark(backup_t *b) {
  sqlite3_stmt *s = NULL;
  bool ok = sqlite3_prepare_v2(b->dest,
                               "INSERT INTO meta(k, v) VALUES('" STORE_BACKUP_MARK "', ?1)"
                               " ON CONFLICT(k) DO UPDATE SET v = excluded.v",
                               -1, &s, NULL) == SQLITE_OK;
  if (ok) {
    sqlite3_bind_int64(s, 1, b->taken_ms);
    ok = sqlite3_step(s) == SQLITE_DONE;
  }
  sqlite3_finalize(s);
  return ok;
}

/* The copy completed (the last step answered SQLITE_DONE): the state it
 * holds is the store's now, until the next request.  Reads what that state
 * names and holds, marks and closes the copy and starts the seal. */
static void backup_copied(backup_t *b) {
  fail_t f = {0};
  b->taken_ms = now_ms();
  evtimer_del(b->step_ev);
  int rc = sqlite3_backup_finish(b->copy);
  b->copy = NULL;
  if (rc != SQLITE_OK)
    fail_set(&f, MUSTER_STORE, "writing %s/muster.db: %s", b->seal.dir, sqlite3_errmsg(b->dest));
  else if (!backup_mark(b))
    fail_set(&f, MUSTER_STORE, "marking %s/muster.db as a backup: %s", b->seal.dir,
             sqlite3_errmsg(b->dest));
  else if (sqlite3_close(b->dest) != SQLITE_OK)
    fail_set(&f, MUSTER_STORE, "closing %s/muster.db: %s", b->seal.dir, sqlite3_errmsg(b->dest));
  else
    b->dest = NULL;
  if (f.code == MUSTER_OK && backup_read_files(b, &f) == MUSTER_OK &&
      (b->holds = backup_read_holds(b->head->st, &f)) != NULL &&
      backup_start_seal(b, &f) == MUSTER_OK)
    return;
  backup_fail(b, &f);
}

/* Why a step failed with `rc`, into *f: SQLite's words, and the system's
 * when it says more (a full disk). */
static void backup_step_failed(backup_t *b, int rc, fail_t *f) {
  int err = sqlite3_system_errno(b->dest);
  if ((rc & 0xff) == SQLITE_FULL || err == ENOSPC)
    fail_set(f, MUSTER_STORE, "copying the database into %s/muster.db: the disk holding it is full",
             b->seal.dir);
  else if (err != 0)
    fail_set(f, MUSTER_STORE, "copying the database into %s/muster.db: %s (%s)", b->seal.dir,
             sqlite3_errstr(rc), strerror(err));
  else
    fail_set(f, MUSTER_STORE, "copying the database into %s/muster.db: %s", b->seal.dir,
             sqlite3_errstr(rc));
}

/* Copies the next step_pages pages (no transaction may be open). */
static void backup_step(backup_t *b) {
  fail_t f = {0};
  if (b->copy == NULL) {
    b->copy = sqlite3_backup_init(b->dest, "main", store_db(b->head->st), "main");
    if (b->copy == NULL) {
      fail_set(&f, MUSTER_STORE, "cannot start copying the database: %s", sqlite3_errmsg(b->dest));
      backup_fail(b, &f);
      return;
    }
  }
  int64_t start_us = metrics_now_us();
  int rc = sqlite3_backup_step(b->copy, b->step_pages);
  int64_t took_us = metrics_now_us() - start_us;
  b->steps++;
  if (took_us > b->longest_step_us)
    b->longest_step_us = took_us;
  b->pages = sqlite3_backup_pagecount(b->copy);
  if (rc == SQLITE_DONE) {
    backup_copied(b);
  } else if (rc == SQLITE_OK || rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    backup_schedule(b);
  } else {
    backup_step_failed(b, rc, &f);
    backup_fail(b, &f);
  }
}

static void backup_on_timer(evutil_socket_t fd, short what, void *arg) {
  backup_t *b = arg;
  /* With a transaction open, the commit that closes it runs the step
   * (backup_pump); the timer only looks again, not at every turn. */
  if (store_in_tx(b->head->st))
    backup_schedule_in(b, BACKUP_RETRY_MS);
  else
    backup_pump(b->head);
}

void backup_pump(head_t *h) {
  backup_t *b = h->backup;
  /* Once the copy is complete (sealing) the timer may still be pending. */
  if (b != NULL && !b->sealing && !store_in_tx(h->st) && !h->sync_failed)
    backup_step(b);
}

bool backup_holds_files(const head_t *h) {
  return h->backup != NULL && h->backup->sealing;
}

void backup_stop(head_t *h) {
  backup_t *b = h->backup;
  if (b == NULL)
    return;
  if (b->sealing) {
    atomic_store(&b->seal.cancel, true); /* a copy of big blob files stops */
    backup_sealed(b);                    /* joins the thread */
    return;
  }
  fail_t f;
  fail_set(&f, MUSTER_UNAVAILABLE,
           "the head is shutting down before the copy was complete; take it again once the head "
           "is back");
  backup_fail(b, &f);
}
