/*
 * shared.h — shared data: versioned blobs (scope, name, level) -> bytes with a
 * time to live (docs/shared-data.md, docs/api.md "Shared data").
 *
 * This module owns the metadata (tables shared_blobs, shared_levels,
 * shared_trash) and the rules: levels count up by exactly one, the newest
 * `keep` levels are kept, a blob expires `ttl_ms` after its last update, an
 * s- scope belongs to an open session and goes with it.  The bytes live in
 * files under DATA_DIR/shared, written by shared_upload.c; this module only
 * names them.  A file is never unlinked inside a transaction: deleting a
 * level moves its file name to shared_trash, and shared_files_sweep unlinks
 * the names that a committed transaction put there, so a rolled-back delete
 * still finds its bytes and a crash leaves at most files to sweep later.
 */
#ifndef MUSTER_SERVER_SHARED_H
#define MUSTER_SERVER_SHARED_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/names.h"
#include "store.h"

#define SHARED_DEFAULT_TTL_MS 600000        /* --max-shared-ttl-ms */
#define SHARED_DEFAULT_KEEP_LEVELS 2        /* --shared-keep-levels */
#define SHARED_DEFAULT_MAX_BLOB (4LL << 30) /* --max-blob-bytes */
#define SHARED_MAX_REQUIRES 16              /* entries of a task's `requires` */
#define SHARED_FILE_LEN 21                  /* "<16 hex digits>.blob" */
#define SHARED_CHECKSUM_LEN 16              /* xxHash64 as hex digits */
/* How long, and for how many names, the head remembers that a blob expired
 * after the sweep deleted it (table shared_expired), to explain a later read. */
#define SHARED_EXPIRED_KEEP_MS (24LL * 3600 * 1000)
#define SHARED_EXPIRED_MAX 10000

/* One stored level of a blob, and the blob's state around it. */
typedef struct {
  char scope[NAME_MAX_LEN + 1];
  char name[NAME_MAX_LEN + 1];
  int64_t level;                          /* this level */
  int64_t newest;                         /* the blob's newest level */
  int64_t size;                           /* bytes */
  char checksum[SHARED_CHECKSUM_LEN + 1]; /* xxHash64, 16 lowercase hex digits */
  char file[SHARED_FILE_LEN + 1];         /* file name in DATA_DIR/shared */
  int64_t ttl_ms, expires_ms;             /* the blob's ttl and expiry (ms since the epoch) */
} shared_level_t;

/* True when `scope` names a session ("s-..."): its blobs go with the session. */
bool shared_scope_is_session(const char *scope);
/* Checks scope and name against the name rules; MUSTER_NAME_INVALID with a
 * message naming which one otherwise. */
muster_err_t shared_check_names(const char *scope, const char *name, fail_t *f);
/* For a write to `scope`: an s- scope must be an open session, and the call
 * counts as its client's heartbeat (MUSTER_SESSION_NOT_FOUND otherwise). */
muster_err_t shared_check_scope_writable(store_t *st, const char *scope, fail_t *f);

/*
 * Checks that a PUT asking for `level` (0: not given) may create a level of
 * (scope, name) now, and sets *creates to the level it would create.  An
 * expired blob counts as absent.  MUSTER_VERSION_MISMATCH with the message of
 * docs/api.md otherwise (saying so when the blob expired).  Run it when the
 * upload starts (to refuse early) and again in shared_commit (the
 * authoritative check).
 */
muster_err_t shared_check_level(store_t *st, const char *scope, const char *name, int64_t level,
                                int64_t now, int64_t *creates, fail_t *f);

/*
 * Records level lv->level of (lv->scope, lv->name), whose bytes are in file
 * lv->file (already durable), with ttl lv->ttl_ms from `now` (0: an update
 * keeps the blob's ttl, a new blob gets `max_ttl`; either at most
 * `max_ttl`, which may have been lowered since); deletes levels
 * older than the newest `keep` and an expired previous incarnation.  Fills
 * lv->newest and lv->expires_ms.  MUSTER_VERSION_MISMATCH when the level is not
 * the next one any more (another upload won); the caller then deletes the file.
 */
muster_err_t shared_commit(store_t *st, shared_level_t *lv, int64_t keep, int64_t max_ttl,
                           int64_t now, fail_t *f);

/* Finds level `level` (0: the newest) of (scope, name) for reading.
 * MUSTER_SHARED_NOT_FOUND with a message that says whether the blob is
 * missing, expired, or lacks that level (never made, or deleted). */
muster_err_t shared_find(store_t *st, const char *scope, const char *name, int64_t level,
                         int64_t now, shared_level_t *out, fail_t *f);
/* {"scope", "blobs": [{"name", "level", "levels", "size", "checksum",
 * "ttl_ms", "expires_ms"}]} of the unexpired blobs of `scope`, by name. */
json_t *shared_list(store_t *st, const char *scope, int64_t now, fail_t *f);
/* Deletes every level of (scope, name): {"scope", "name", "levels"}, or NULL
 * with MUSTER_SHARED_NOT_FOUND. */
json_t *shared_delete(store_t *st, const char *scope, const char *name, fail_t *f);
/* Deletes every blob of `scope` (a closing session); *count (may be NULL)
 * gets how many blobs went. */
muster_err_t shared_delete_scope(store_t *st, const char *scope, int64_t *count, fail_t *f);

/* True when some blob's ttl ran out at `now`. */
bool shared_any_due(store_t *st, int64_t now);
/* Deletes blobs whose ttl ran out, remembering each name's ttl and expiry
 * (bounded: SHARED_EXPIRED_KEEP_MS, SHARED_EXPIRED_MAX) so that reads and
 * updates can still say it expired; returns how many, -1 on store failure. */
int64_t shared_expire_due(store_t *st, int64_t now);

/* The message of a not-found blob in `scope`: "shared data not found for
 * session s-...: 'NAME'" (the words of the tool whose users know them, and
 * the name: a session holds several) or "shared data not found: 'NAME' in
 * scope 'SCOPE'". */
void shared_not_found_message(const char *scope, const char *name, char *out, size_t size);

/* ---- files ---- */

/* Makes DATA_DIR/shared and DATA_DIR/shared/tmp, removes interrupted uploads
 * and files no level names (left by a crash between rename and commit).
 * Returns MUSTER_OK or MUSTER_STORE with *f filled.  Runs before the loop. */
muster_err_t shared_files_init(store_t *st, const char *data_dir, fail_t *f);
/* Unlinks the files that committed deletions put in shared_trash.  Does
 * nothing while a transaction is open (its deletions may still roll back). */
void shared_files_sweep(store_t *st, const char *data_dir);
/* DATA_DIR/shared/<file> into `out`. */
void shared_file_path(const char *data_dir, const char *file, char *out, size_t size);

/* ---- tasks that require shared data ---- */

/* Parses the optional "requires" of task object `elem` (`ctx` names it in
 * errors, "tasks[3]"): up to SHARED_MAX_REQUIRES {"scope", "name", "level"}.
 * *text receives its compact JSON (free()) or NULL when absent or empty. */
muster_err_t shared_requires_parse(const json_t *elem, const char *ctx, char **text, fail_t *f);
/* Stores `text` (from shared_requires_parse; NULL: nothing) as task `task`'s
 * requirements. */
muster_err_t shared_requires_set(store_t *st, int64_t task, const char *text, fail_t *f);

#endif
