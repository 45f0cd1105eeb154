/*
 * backup_files.h — the files of a backup besides its database: the blob
 * files of shared data, linked (or copied) beside it, the token, and the
 * fsyncs that make the whole directory durable (backup_files.c).
 *
 * backup.c copies the database on the loop; the rest, which may wait on the
 * disk for long (a copy of gigabytes of blobs onto another disk, an fsync of
 * the new database file), runs on a helper thread through backup_seal, which
 * touches nothing of the head's but the files named here.
 */
#ifndef MUSTER_SERVER_BACKUP_FILES_H
#define MUSTER_SERVER_BACKUP_FILES_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fail.h"
#include "shared.h"

/* A blob file's name in DATA_DIR/shared ("<16 hex digits>.blob"). */
typedef char backup_file_name_t[SHARED_FILE_LEN + 1];

/* What the seal of one backup works on, and what it found. */
typedef struct {
  /* In: */
  char data_dir[PATH_MAX];   /* the head's data dir: its shared/ holds the blob files */
  char dir[PATH_MAX];        /* the backup's directory, muster.db in it already: made as
                                DATA_DIR/backups/.NAME.partial, renamed to final_dir (and
                                dir set to it) once whole */
  char final_dir[PATH_MAX];  /* DATA_DIR/backups/NAME */
  backup_file_name_t *files; /* the blob files the copy's levels name; owned (free) */
  size_t nfiles;
  char token[256];    /* the admin token, for DIR/token */
  atomic_bool cancel; /* set by the loop: the head stops; the seal gives up soon */
  /* Out: */
  int64_t database_bytes; /* DIR/muster.db */
  int64_t shared_bytes;   /* the blob files, linked or copied */
  size_t linked, copied;  /* blob files hard-linked, and copied (another file system) */
  fail_t fail;            /* what failed, when backup_seal did not return MUSTER_OK */
} backup_seal_t;

/* Records in *f that `what` ("open", "create", ...) `path` failed with
 * errno `err`: MUSTER_STORE with the system's reason ("the disk holding it is
 * full" first for ENOSPC and EDQUOT), or, out of file
 * descriptors (fail_errno_is_fds), MUSTER_UNAVAILABLE saying to send the
 * backup again.  Returns the code. */
muster_err_t backup_errno_fail(fail_t *f, const char *what, const char *path, int err);

/* Makes the backup in s->dir whole and durable: hard-links each blob file
 * into DIR/shared (copying it when no link can be made there: the backup is
 * on another file system), writes DIR/token (0600), fsyncs the database,
 * every file and DIR, renames DIR to s->final_dir (s->dir then names it: a
 * backup under its own name is always whole) and fsyncs the directories
 * above, up to the data dir.
 * MUSTER_OK, or MUSTER_STORE with s->fail saying which file and why (or
 * MUSTER_UNAVAILABLE once s->cancel is set, or out of file descriptors:
 * backup_errno_fail); the caller then removes the backup.  Safe on a helper thread: it logs nothing
 * and uses no state of the head's. */
muster_err_t backup_seal(backup_seal_t *s);

/* The name of a backup's directory while it is made, .NAME.partial, into
 * out[NAME_MAX_LEN + 16]; NULL when `entry` (a name in DATA_DIR/backups) is
 * not one, else the backup's name into `name` (NAME_MAX_LEN + 1). */
#define BACKUP_PARTIAL_SUFFIX ".partial"
const char *backup_partial_name(const char *entry, char *name, size_t size);

/* Removes directory `dir` and everything in it, without following links
 * (a blob file's link goes, its name in the data dir stays); an empty one
 * without taking a file descriptor (a backup that failed for want of them
 * leaves its directory empty when its database could not be created).  0, or the
 * errno of the first removal that failed (the others are still tried). */
int backup_remove(const char *dir);

#endif
