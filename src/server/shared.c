/*
 * shared.c — the metadata of shared blobs: levels, expiry, deletion, and the
 * files they name (see shared.h for the design).
 *
 * shared_blobs has one row per (scope, name): its newest level and its ttl.
 * shared_levels has one row per kept level: size, checksum, file.  A blob
 * whose expires_ms has passed is treated as absent everywhere before the
 * sweep deletes it, so no reader ever sees an expired blob.  The workload is
 * small: a few blobs per scope, levels added minutes apart; every statement
 * goes through a primary key.
 */
#include "shared.h"
#include "jv.h"
#include "log.h"
#include "session.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool shared_scope_is_session(const char *scope) {
  return strncmp(scope, "s-", 2) == 0;
}

void shared_not_found_message(const char *scope, const char *name, char *out, size_t size) {
  if (shared_scope_is_session(scope))
    snprintf(out, size, "shared data not found for session %s: '%s'", scope, name);
  else
    snprintf(out, size, "shared data not found: '%s' in scope '%s'", name, scope);
}

/* "." and ".." are no names (core/names.h): they are also refused because
 * every node agent keeps a blob in its cache as the file SCOPE/NAME@LEVEL@SUM,
 * where these would be the cache or its parent, and refuses them (cache.c),
 * so a blob of such a name could never be read through a node.  Checked
 * first, so that the message says both. */
muster_err_t shared_check_names(const char *scope, const char *name, fail_t *f) {
  const char *dots = name_is_dots(scope) ? scope : name_is_dots(name) ? name : NULL;
  if (dots)
    return fail_set(f, MUSTER_NAME_INVALID,
                    "%s '%s' is invalid: " NAME_DOTS_TEXT " (and a node's cache could not keep "
                    "such a blob)",
                    dots == scope ? "scope" : "name", dots);
  if (!name_is_valid(scope))
    return fail_set(f, MUSTER_NAME_INVALID,
                    "scope '%.140s': a session id (s-...) or 1 to 128 characters of letters, "
                    "digits, '.', '_' and '-'",
                    scope);
  if (name && !name_is_valid(name))
    return fail_set(f, MUSTER_NAME_INVALID, "name '%.140s' is invalid: " NAME_RULE_TEXT, name);
  return MUSTER_OK;
}

muster_err_t shared_check_scope_writable(store_t *st, const char *scope, fail_t *f) {
  if (!shared_scope_is_session(scope))
    return MUSTER_OK;
  return session_touch(st, scope, NULL, f);
}

/* ---- reading a blob's row ---- */

typedef struct {
  bool exists;
  int64_t level, ttl_ms, expires_ms;
} blob_row_t;

static muster_err_t blob_load(store_t *st, const char *scope, const char *name, blob_row_t *b,
                              fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT level, ttl_ms, expires_ms FROM shared_blobs"
                                   " WHERE scope = ?1 AND name = ?2");
  if (s == NULL)
    return store_fail(st, f, "shared lookup");
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  int rc = sqlite3_step(s);
  *b = (blob_row_t){.exists = rc == SQLITE_ROW};
  if (b->exists) {
    b->level = sqlite3_column_int64(s, 0);
    b->ttl_ms = sqlite3_column_int64(s, 1);
    b->expires_ms = sqlite3_column_int64(s, 2);
  }
  store_reset(s);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return store_fail(st, f, "shared lookup");
  return MUSTER_OK;
}

/* ---- expired blobs: what the sweep keeps to explain them ---- */

/* Fills *ttl_ms when (scope, name) expired: not swept yet (`b`), or swept
 * less than SHARED_EXPIRED_KEEP_MS ago and not written since.  False when it
 * did not expire (or too long ago to tell). */
static bool blob_expired(store_t *st, const char *scope, const char *name, const blob_row_t *b,
                         int64_t now, int64_t *ttl_ms) {
  if (b->exists) {
    *ttl_ms = b->ttl_ms;
    return b->expires_ms <= now;
  }
  sqlite3_stmt *s = store_stmt(st, "SELECT ttl_ms FROM shared_expired"
                                   " WHERE scope = ?1 AND name = ?2 AND expired_ms >= ?3");
  if (s == NULL)
    return false; /* only the message is poorer */
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  sqlite3_bind_int64(s, 3, now - SHARED_EXPIRED_KEEP_MS);
  bool found = sqlite3_step(s) == SQLITE_ROW;
  if (found)
    *ttl_ms = sqlite3_column_int64(s, 0);
  store_reset(s);
  return found;
}

/* " ('NAME' expired: it was not updated within its ttl_ms of TTL)", the
 * explanation docs/shared-data.md lists. */
static void expired_note(const char *name, int64_t ttl_ms, char *out, size_t size) {
  snprintf(out, size, " ('%s' expired: it was not updated within its ttl_ms of %lld)", name,
           (long long)ttl_ms);
}

/* " (WHY)" into `note`: why (scope, name), found without a row `b` or with
 * an expired one, cannot be read: it expired (docs/shared-data.md lists the
 * words), its session was closed (its shared data went with it) or never
 * was, or it was never set or was deleted (the head keeps no trace of a
 * deleted blob, so it cannot tell those two apart). */
static void absent_note(store_t *st, const char *scope, const char *name, const blob_row_t *b,
                        int64_t now, char *note, size_t size) {
  int64_t ttl_ms;
  char session[300] = "";
  if (blob_expired(st, scope, name, b, now, &ttl_ms)) {
    expired_note(name, ttl_ms, note, size);
    return;
  }
  if (shared_scope_is_session(scope))
    session_gone_why(st, scope, session, sizeof session);
  if (session[0])
    snprintf(note, size, " (%s)", session);
  else
    snprintf(note, size, " ('%s' was never set, or was deleted)", name);
}

/* Runs `sql` with ?1 scope, ?2 name (may be NULL), ?3 `n`. */
static muster_err_t shared_exec(store_t *st, const char *sql, const char *scope, const char *name,
                                int64_t n, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, sql);
  if (s == NULL)
    return store_fail(st, f, "shared write");
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  sqlite3_bind_int64(s, 3, n);
  return store_step_done(st, s, f);
}

/* Deletes levels <= `upto` of (scope, name), their files to the trash. */
static muster_err_t levels_drop(store_t *st, const char *scope, const char *name, int64_t upto,
                                fail_t *f) {
  if (shared_exec(st,
                  "INSERT OR IGNORE INTO shared_trash(file) SELECT file FROM shared_levels"
                  " WHERE scope = ?1 AND name = ?2 AND level <= ?3",
                  scope, name, upto, f) ||
      shared_exec(st, "DELETE FROM shared_levels WHERE scope = ?1 AND name = ?2 AND level <= ?3",
                  scope, name, upto, f))
    return f->code;
  return MUSTER_OK;
}

/* Deletes the whole blob; *levels (may be NULL) gets how many levels it had. */
static muster_err_t blob_drop(store_t *st, const char *scope, const char *name, int64_t *levels,
                              fail_t *f) {
  if (levels_drop(st, scope, name, INT64_MAX, f))
    return f->code;
  if (levels)
    *levels = sqlite3_changes64(store_db(st));
  return shared_exec(st, "DELETE FROM shared_blobs WHERE scope = ?1 AND name = ?2", scope, name, 0,
                     f);
}

muster_err_t shared_check_level(store_t *st, const char *scope, const char *name, int64_t level,
                                int64_t now, int64_t *creates, fail_t *f) {
  blob_row_t b = {0};
  if (blob_load(st, scope, name, &b, f))
    return f->code;
  int64_t current = b.exists && b.expires_ms > now ? b.level : 0;
  if (level <= 1 && current > 0)
    return fail_set(f, MUSTER_VERSION_MISMATCH,
                    "shared data '%s' exists at level %lld; update it "
                    "with level=%lld",
                    name, (long long)current, (long long)current + 1);
  int64_t ttl_ms;
  if (level > 1 && current == 0 && blob_expired(st, scope, name, &b, now, &ttl_ms))
    return fail_set(f, MUSTER_VERSION_MISMATCH,
                    "update level mismatch: expected 1, got %lld ('%s' expired: it was not "
                    "updated within its ttl_ms of %lld; a new blob starts at level 1)",
                    (long long)level, name, (long long)ttl_ms);
  /* No level at all: an update of a blob never set (or deleted) says so, and
   * that a set starts it, rather than only which level it expected. */
  if (level > 1 && current == 0)
    return fail_set(f, MUSTER_VERSION_MISMATCH,
                    "update level mismatch: expected 1, got %lld ('%s' has no level in scope "
                    "'%s': it was never set, or was deleted; a new blob starts at level 1)",
                    (long long)level, name, scope);
  if (level > 1 && level != current + 1)
    return fail_set(f, MUSTER_VERSION_MISMATCH, "update level mismatch: expected %lld, got %lld",
                    (long long)current + 1, (long long)level);
  *creates = level > 1 ? level : 1;
  return MUSTER_OK;
}

/* Clears the way for level `creates` of the blob `b` (as loaded): an expired
 * blob, or any blob a level 1 starts again, is dropped whole, and a new blob
 * forgets that an earlier one under its name expired. */
static muster_err_t blob_make_way(store_t *st, const shared_level_t *lv, const blob_row_t *b,
                                  int64_t creates, int64_t now, fail_t *f) {
  /* An expired blob that the sweep has not reached yet is replaced whole. */
  if (b->exists && (b->expires_ms <= now || creates == 1) &&
      blob_drop(st, lv->scope, lv->name, NULL, f))
    return f->code;
  /* Written again: an earlier expiry no longer explains anything. */
  if (creates == 1 && shared_exec(st, "DELETE FROM shared_expired WHERE scope = ?1 AND name = ?2",
                                  lv->scope, lv->name, 0, f))
    return f->code;
  return MUSTER_OK;
}

/* Records level lv->level of the blob: its size, checksum and file. */
static muster_err_t level_insert(store_t *st, const shared_level_t *lv, int64_t now, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT INTO shared_levels(scope, name, level, size, checksum,"
                                   " file, created_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  if (s == NULL)
    return store_fail(st, f, "shared commit");
  store_bind_text(s, 1, lv->scope);
  store_bind_text(s, 2, lv->name);
  sqlite3_bind_int64(s, 3, lv->level);
  sqlite3_bind_int64(s, 4, lv->size);
  store_bind_text(s, 5, lv->checksum);
  store_bind_text(s, 6, lv->file);
  sqlite3_bind_int64(s, 7, now);
  return store_step_done(st, s, f);
}

/* Creates the blob's row, or moves it to lv->level with the new ttl and expiry. */
static muster_err_t blob_upsert(store_t *st, const shared_level_t *lv, int64_t now, fail_t *f) {
  sqlite3_stmt *s =
      store_stmt(st, "INSERT INTO shared_blobs(scope, name, level, ttl_ms, expires_ms, created_ms,"
                     " updated_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?6)"
                     " ON CONFLICT(scope, name) DO UPDATE SET level = excluded.level,"
                     " ttl_ms = excluded.ttl_ms, expires_ms = excluded.expires_ms,"
                     " updated_ms = excluded.updated_ms");
  if (s == NULL)
    return store_fail(st, f, "shared commit");
  store_bind_text(s, 1, lv->scope);
  store_bind_text(s, 2, lv->name);
  sqlite3_bind_int64(s, 3, lv->level);
  sqlite3_bind_int64(s, 4, lv->ttl_ms);
  sqlite3_bind_int64(s, 5, lv->expires_ms);
  sqlite3_bind_int64(s, 6, now);
  return store_step_done(st, s, f);
}

muster_err_t shared_commit(store_t *st, shared_level_t *lv, int64_t keep, int64_t max_ttl,
                           int64_t now, fail_t *f) {
  int64_t creates = 0;
  blob_row_t b = {0};
  if (shared_check_level(st, lv->scope, lv->name, lv->level, now, &creates, f) ||
      blob_load(st, lv->scope, lv->name, &b, f) || blob_make_way(st, lv, &b, creates, now, f))
    return f->code;
  /* An update without a ttl keeps the one the blob was given (a level > 1
   * is checked to follow an unexpired blob, so `b` is it). */
  if (lv->ttl_ms <= 0)
    lv->ttl_ms = creates > 1 && b.ttl_ms > 0 && b.ttl_ms < max_ttl ? b.ttl_ms : max_ttl;
  lv->level = lv->newest = creates;
  lv->expires_ms = now + lv->ttl_ms;
  if (level_insert(st, lv, now, f) || blob_upsert(st, lv, now, f))
    return f->code;
  return creates > keep ? levels_drop(st, lv->scope, lv->name, creates - keep, f) : MUSTER_OK;
}

/* Fills *out from level `level` of the blob; false when that level is gone. */
static bool level_load(store_t *st, const char *scope, const char *name, int64_t level,
                       shared_level_t *out) {
  sqlite3_stmt *s = store_stmt(st, "SELECT size, checksum, file FROM shared_levels"
                                   " WHERE scope = ?1 AND name = ?2 AND level = ?3");
  if (s == NULL)
    return false;
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  sqlite3_bind_int64(s, 3, level);
  bool found = sqlite3_step(s) == SQLITE_ROW;
  if (found) {
    out->level = level;
    out->size = sqlite3_column_int64(s, 0);
    snprintf(out->checksum, sizeof out->checksum, "%s", (const char *)sqlite3_column_text(s, 1));
    snprintf(out->file, sizeof out->file, "%s", (const char *)sqlite3_column_text(s, 2));
  }
  store_reset(s);
  return found;
}

muster_err_t shared_find(store_t *st, const char *scope, const char *name, int64_t level,
                         int64_t now, shared_level_t *out, fail_t *f) {
  blob_row_t b;
  if (blob_load(st, scope, name, &b, f))
    return f->code;
  char missing[400], note[400] = "";
  shared_not_found_message(scope, name, missing, sizeof missing);
  if (!b.exists || b.expires_ms <= now) {
    absent_note(st, scope, name, &b, now, note, sizeof note);
    return fail_set(f, MUSTER_SHARED_NOT_FOUND, "%s%s", missing, note);
  }
  *out = (shared_level_t){.newest = b.level, .ttl_ms = b.ttl_ms, .expires_ms = b.expires_ms};
  snprintf(out->scope, sizeof out->scope, "%s", scope);
  snprintf(out->name, sizeof out->name, "%s", name);
  int64_t want = level > 0 ? level : b.level;
  if (level_load(st, scope, name, want, out))
    return MUSTER_OK;
  if (want > b.level)
    return fail_set(f, MUSTER_SHARED_NOT_FOUND,
                    "%s (level %lld of '%s' was never made; the newest "
                    "is %lld)",
                    missing, (long long)want, name, (long long)b.level);
  return fail_set(f, MUSTER_SHARED_NOT_FOUND,
                  "%s (level %lld of '%s' was deleted: the head keeps "
                  "the newest levels only; the newest is %lld)",
                  missing, (long long)want, name, (long long)b.level);
}

/* The kept levels of a blob, ascending. */
static json_t *levels_of(store_t *st, const char *scope, const char *name) {
  sqlite3_stmt *s = store_stmt(st, "SELECT level FROM shared_levels WHERE scope = ?1 AND name = ?2"
                                   " ORDER BY level");
  json_t *levels = json_array();
  if (s == NULL)
    return levels;
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(levels, json_integer(sqlite3_column_int64(s, 0)));
  store_reset(s);
  return levels;
}

json_t *shared_list(store_t *st, const char *scope, int64_t now, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "SELECT b.name, b.level, b.ttl_ms, b.expires_ms, l.size,"
                                   " l.checksum FROM shared_blobs b JOIN shared_levels l"
                                   " ON l.scope = b.scope AND l.name = b.name AND l.level = b.level"
                                   " WHERE b.scope = ?1 AND b.expires_ms > ?2 ORDER BY b.name");
  if (s == NULL) {
    store_fail(st, f, "shared list");
    return NULL;
  }
  store_bind_text(s, 1, scope);
  sqlite3_bind_int64(s, 2, now);
  /* Rows are copied first: levels_of runs another statement. */
  json_t *blobs = json_array();
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(blobs, json_pack("{s:s, s:I, s:I, s:I, s:I, s:s}", "name",
                                           (const char *)sqlite3_column_text(s, 0), "level",
                                           (json_int_t)sqlite3_column_int64(s, 1), "ttl_ms",
                                           (json_int_t)sqlite3_column_int64(s, 2), "expires_ms",
                                           (json_int_t)sqlite3_column_int64(s, 3), "size",
                                           (json_int_t)sqlite3_column_int64(s, 4), "checksum",
                                           (const char *)sqlite3_column_text(s, 5)));
  store_reset(s);
  size_t i;
  json_t *blob;
  json_array_foreach(blobs, i, blob) {
    const char *name = json_string_value(json_object_get(blob, "name"));
    json_object_set_new(blob, "levels", levels_of(st, scope, name));
  }
  return json_pack("{s:s, s:o}", "scope", scope, "blobs", blobs);
}

json_t *shared_delete(store_t *st, const char *scope, const char *name, fail_t *f) {
  blob_row_t b;
  int64_t levels = 0;
  if (blob_load(st, scope, name, &b, f))
    return NULL;
  if (!b.exists) {
    char missing[400], note[400] = "";
    shared_not_found_message(scope, name, missing, sizeof missing);
    absent_note(st, scope, name, &b, now_ms(), note, sizeof note);
    fail_set(f, MUSTER_SHARED_NOT_FOUND, "%s%s", missing, note);
    return NULL;
  }
  if (blob_drop(st, scope, name, &levels, f))
    return NULL;
  return json_pack("{s:s, s:s, s:I}", "scope", scope, "name", name, "levels", (json_int_t)levels);
}

muster_err_t shared_delete_scope(store_t *st, const char *scope, int64_t *count, fail_t *f) {
  if (shared_exec(st,
                  "INSERT OR IGNORE INTO shared_trash(file) SELECT file FROM shared_levels"
                  " WHERE scope = ?1",
                  scope, NULL, 0, f) ||
      shared_exec(st, "DELETE FROM shared_levels WHERE scope = ?1", scope, NULL, 0, f) ||
      shared_exec(st, "DELETE FROM shared_blobs WHERE scope = ?1", scope, NULL, 0, f))
    return f->code;
  if (count)
    *count = sqlite3_changes64(store_db(st));
  /* The scope is gone (a closed session): nothing of it is left to explain. */
  return shared_exec(st, "DELETE FROM shared_expired WHERE scope = ?1", scope, NULL, 0, f);
}

bool shared_any_due(store_t *st, int64_t now) {
  return store_due(st, "SELECT 1 FROM shared_blobs WHERE expires_ms <= ?1 LIMIT 1", now);
}

/* Remembers that (scope, name) expired at `expired_ms` with `ttl_ms`. */
static muster_err_t expired_record(store_t *st, const char *scope, const char *name, int64_t ttl_ms,
                                   int64_t expired_ms, fail_t *f) {
  sqlite3_stmt *s = store_stmt(st, "INSERT OR REPLACE INTO shared_expired(scope, name, ttl_ms,"
                                   " expired_ms) VALUES(?1, ?2, ?3, ?4)");
  if (s == NULL)
    return store_fail(st, f, "shared expiry");
  store_bind_text(s, 1, scope);
  store_bind_text(s, 2, name);
  sqlite3_bind_int64(s, 3, ttl_ms);
  sqlite3_bind_int64(s, 4, expired_ms);
  return store_step_done(st, s, f);
}

/* Keeps shared_expired bounded: rows older than SHARED_EXPIRED_KEEP_MS go,
 * then all but the newest SHARED_EXPIRED_MAX.  Runs only after the sweep added
 * rows, so an idle head does no work for it. */
static muster_err_t expired_prune(store_t *st, int64_t now, fail_t *f) {
  return shared_exec(st, "DELETE FROM shared_expired WHERE expired_ms < ?3", "", NULL,
                     now - SHARED_EXPIRED_KEEP_MS, f) ||
                 shared_exec(st,
                             "DELETE FROM shared_expired WHERE expired_ms < (SELECT expired_ms"
                             " FROM shared_expired ORDER BY expired_ms DESC LIMIT 1 OFFSET ?3)",
                             "", NULL, SHARED_EXPIRED_MAX - 1, f)
             ? f->code
             : MUSTER_OK;
}

int64_t shared_expire_due(store_t *st, int64_t now) {
  sqlite3_stmt *s = store_stmt(st, "SELECT scope, name, ttl_ms, expires_ms FROM shared_blobs"
                                   " WHERE expires_ms <= ?1 LIMIT 64");
  if (s == NULL)
    return -1;
  char scopes[64][NAME_MAX_LEN + 1], names[64][NAME_MAX_LEN + 1];
  int64_t ttls[64], expired[64];
  size_t n = 0;
  sqlite3_bind_int64(s, 1, now);
  while (n < 64 && sqlite3_step(s) == SQLITE_ROW) {
    snprintf(scopes[n], sizeof scopes[n], "%s", (const char *)sqlite3_column_text(s, 0));
    snprintf(names[n], sizeof names[n], "%s", (const char *)sqlite3_column_text(s, 1));
    ttls[n] = sqlite3_column_int64(s, 2);
    expired[n] = sqlite3_column_int64(s, 3);
    n++;
  }
  store_reset(s);
  fail_t f = {0};
  for (size_t i = 0; i < n; i++) {
    if (blob_drop(st, scopes[i], names[i], NULL, &f) ||
        expired_record(st, scopes[i], names[i], ttls[i], expired[i], &f))
      return -1;
    log_msg(LOG_INFO, "shared data '%s' in scope '%s' expired", names[i], scopes[i]);
  }
  if (n > 0 && expired_prune(st, now, &f))
    return -1;
  return (int64_t)n;
}

/* ---- files ---- */

void shared_file_path(const char *data_dir, const char *file, char *out, size_t size) {
  if (snprintf(out, size, "%s/shared/%s", data_dir, file) >= (int)size)
    out[0] = '\0'; /* cannot happen: data dirs are limited to PATH_MAX - 32 */
}

/* True when some level names `file`. */
static bool file_is_named(store_t *st, const char *file) {
  sqlite3_stmt *s = store_stmt(st, "SELECT 1 FROM shared_levels WHERE file = ?1 LIMIT 1");
  if (s == NULL)
    return true; /* keep it when unsure */
  store_bind_text(s, 1, file);
  bool named = sqlite3_step(s) == SQLITE_ROW;
  store_reset(s);
  return named;
}

/* Removes every regular file of `dir` for which `keep` (may be NULL) is false. */
static void files_prune(store_t *st, const char *dir, bool (*keep)(store_t *, const char *)) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN)
      continue;
    if (e->d_name[0] == '.' || (keep && keep(st, e->d_name)))
      continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0)
      log_msg(LOG_INFO, "shared data: removed %s/%s (no level names it)", dir, e->d_name);
  }
  closedir(d);
}

muster_err_t shared_files_init(store_t *st, const char *data_dir, fail_t *f) {
  char dir[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(dir, sizeof dir, "%s/shared", data_dir);
  snprintf(tmp, sizeof tmp, "%s/tmp", dir);
  /* The owner's alone, as the store (store_create_private): the blobs are
   * read through the API, never from these files by another user. */
  if ((mkdir(dir, 0700) != 0 && errno != EEXIST) || (mkdir(tmp, 0700) != 0 && errno != EEXIST))
    return fail_set(f, MUSTER_STORE, "cannot create %s: %s", tmp, strerror(errno));
  files_prune(st, tmp, NULL);
  files_prune(st, dir, file_is_named);
  return MUSTER_OK;
}

void shared_files_sweep(store_t *st, const char *data_dir) {
  if (store_in_tx(st))
    return;
  sqlite3_stmt *s = store_stmt(st, "SELECT file FROM shared_trash LIMIT 256");
  if (s == NULL)
    return;
  char files[256][SHARED_FILE_LEN + 1];
  size_t n = 0;
  while (n < 256 && sqlite3_step(s) == SQLITE_ROW)
    snprintf(files[n++], SHARED_FILE_LEN + 1, "%s", (const char *)sqlite3_column_text(s, 0));
  store_reset(s);
  if (n == 0)
    return;
  fail_t f = {0};
  if (store_request_begin(st, &f))
    return;
  bool ok = true;
  for (size_t i = 0; i < n && ok; i++) {
    char path[PATH_MAX + 64];
    shared_file_path(data_dir, files[i], path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
      log_msg(LOG_WARN, "shared data: cannot remove %s: %s", path, strerror(errno));
    s = store_stmt(st, "DELETE FROM shared_trash WHERE file = ?1");
    ok = s != NULL;
    if (ok) {
      store_bind_text(s, 1, files[i]);
      ok = store_step_done(st, s, &f) == MUSTER_OK;
    }
  }
  store_request_end(st, ok);
}

/* ---- tasks that require shared data ---- */

/* MUSTER_INVALID when `out`, the entries checked so far, already requires
 * blob scope/name: a task requires one level of each blob (a worker gives a
 * blob one file, MUSTER_SHARED_<NAME>, so a second level would be ambiguous). */
static muster_err_t requires_twice(const json_t *out, const char *at, const char *scope,
                                   const char *name, fail_t *f) {
  size_t j;
  const json_t *e;
  json_array_foreach(out, j, e) {
    if (strcmp(json_string_value(json_object_get(e, "scope")), scope) == 0 &&
        strcmp(json_string_value(json_object_get(e, "name")), name) == 0)
      return fail_set(f, MUSTER_INVALID,
                      "%s: %s/%s is required already (requires[%zu], level %lld): a task "
                      "requires one level of each blob",
                      at, scope, name, j,
                      (long long)json_integer_value(json_object_get(e, "level")));
  }
  return MUSTER_OK;
}

/* Checks entry `i` and appends it to `out` with its keys in one order (scope,
 * name, level), so that equal lists have equal text whatever order a client
 * wrote: a session put sent again compares the text (submit_is_repeat). */
static muster_err_t requires_one(const json_t *req, const char *ctx, size_t i, json_t *out,
                                 fail_t *f) {
  static const char *const allowed[] = {"scope", "name", "level", NULL};
  char at[64];
  const char *scope, *name;
  int64_t level;
  snprintf(at, sizeof at, "%s.requires[%zu]", ctx, i);
  if (!json_is_object(req))
    return fail_set(f, MUSTER_INVALID, "%s: expected {\"scope\", \"name\", \"level\"}", at);
  if (jv_only(req, at, allowed, f) || jv_str(req, "scope", at, NULL, 4 * NAME_MAX_LEN, &scope, f) ||
      jv_str(req, "name", at, NULL, 4 * NAME_MAX_LEN, &name, f) ||
      jv_int(req, "level", at, 0, 1, INT64_MAX, &level, f))
    return f->code;
  if (scope == NULL || name == NULL || level == 0)
    return fail_set(f, MUSTER_INVALID, "%s: scope, name and level are all required", at);
  if (shared_check_names(scope, name, f)) {
    char why[sizeof f->message];
    snprintf(why, sizeof why, "%s", f->message);
    return fail_set(f, MUSTER_NAME_INVALID, "%s: %s", at, why);
  }
  if (requires_twice(out, at, scope, name, f))
    return f->code;
  json_t *entry = json_pack("{s:s, s:s, s:I}", "scope", scope, "name", name, "level",
                            (json_int_t)level); /* NULL, with nothing left over, on failure */
  if (entry == NULL || json_array_append_new(out, entry))
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

muster_err_t shared_requires_parse(const json_t *elem, const char *ctx, char **text, fail_t *f) {
  *text = NULL;
  const json_t *reqs = json_object_get(elem, "requires");
  if (reqs == NULL || json_is_null(reqs))
    return MUSTER_OK;
  if (!json_is_array(reqs))
    return fail_set(f, MUSTER_INVALID, "%s.requires: expected an array", ctx);
  if (json_array_size(reqs) > SHARED_MAX_REQUIRES)
    return fail_set(f, MUSTER_INVALID, "%s.requires: %zu entries, at most %d allowed", ctx,
                    json_array_size(reqs), SHARED_MAX_REQUIRES);
  if (json_array_size(reqs) == 0)
    return MUSTER_OK;
  json_t *canonical = json_array();
  if (canonical == NULL)
    return fail_set(f, MUSTER_NOMEM, "out of memory");
  size_t i;
  const json_t *req;
  json_array_foreach(reqs, i, req) {
    if (requires_one(req, ctx, i, canonical, f)) {
      json_decref(canonical);
      return f->code;
    }
  }
  *text = jv_encode(canonical);
  json_decref(canonical);
  return *text ? MUSTER_OK : fail_set(f, MUSTER_NOMEM, "out of memory");
}

muster_err_t shared_requires_set(store_t *st, int64_t task, const char *text, fail_t *f) {
  if (text == NULL)
    return MUSTER_OK;
  sqlite3_stmt *s = store_stmt(st, "UPDATE tasks SET requires = ?2 WHERE id = ?1");
  if (s == NULL)
    return store_fail(st, f, "task requires");
  sqlite3_bind_int64(s, 1, task);
  store_bind_text(s, 2, text);
  return store_step_done(st, s, f);
}
