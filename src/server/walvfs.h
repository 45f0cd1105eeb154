/*
 * walvfs.h — "muster-wal", a SQLite VFS that writes each commit's
 * write-ahead-log frames with one system call instead of two per page.
 *
 * It wraps the default (unix) VFS.  Only files SQLite opens as a WAL are
 * changed: their frames are held in memory while SQLite appends them and are
 * written, as one contiguous range, by the write that completes a commit
 * frame (or earlier, before anything could observe the file).  When COMMIT
 * returns the file holds what it would hold with the default VFS, so flushes
 * and crash recovery are unchanged (walvfs.c, docs/design-notes.md).
 */
#ifndef MUSTER_SERVER_WALVFS_H
#define MUSTER_SERVER_WALVFS_H

#include <stdint.h>

#define WALVFS_NAME "muster-wal"

/* Counters over every WAL file opened through the VFS in this process. */
typedef struct {
  uint64_t sqlite_writes; /* xWrite calls SQLite made on WAL files */
  uint64_t file_writes;   /* writes issued to WAL files: one system call each */
  uint64_t passed;        /* of sqlite_writes, those written at once, not held */
  uint64_t failed;        /* writes of held frames that failed (reported to SQLite) */
  uint64_t full;          /* writes to any file of the VFS that failed for want of room */
} walvfs_stats_t;

/* Registers the VFS (as not the default) on first call; later calls, from
 * any thread, return the first one's result.  Returns WALVFS_NAME, for
 * sqlite3_open_v2, or NULL when SQLite has no default VFS to wrap or
 * registration failed: open with the default VFS then. */
const char *walvfs_register(void);

/* Copies the counters into *out (each read atomically, not all at once). */
void walvfs_stats(walvfs_stats_t *out);

#endif
