/*
 * walvfs.c — the default VFS, except that a write-ahead log's frames are
 * held in memory and written with one call per commit.
 *
 * How SQLite writes the WAL (wal.c, walFrames; so in 3.40 as in 3.50):
 * the file starts with a 32-byte header, written at offset 0 whenever the
 * log (re)starts; then come frames of a 24-byte header and one page, frame k
 * (from 0) at 32 + k * (24 + page size).  A transaction appends its pages as
 * frames, each with two xWrite calls, header then page; its last frame is the
 * commit frame, the only one whose header holds a non-zero "database size
 * after commit" (bytes 4..7, big-endian).  The default VFS turns each xWrite
 * into one pwrite: a commit of n pages costs 2n system calls.
 *
 * This VFS holds such appends — the file header, a frame header at or past
 * the furthest byte written since the log (re)started, the page right behind
 * a held frame header — in one contiguous buffer, and writes the buffer with
 * one call (or one per 128 KiB) as soon as the page behind a commit frame's
 * header is in it.
 * That write happens inside the xWrite SQLite makes for that page, before
 * its commit returns, so when COMMIT returns the frames are in the page
 * cache exactly as with the default VFS: the head's fdatasync of the WAL
 * through its own descriptor (head.c) makes them durable as before, SQLite's
 * own xSync (synchronous=FULL) first writes what is held, and a crash leaves
 * the same file for recovery.
 *
 * Everything else SQLite writes to the WAL is written at once, after what is
 * held, so writes reach the file in SQLite's order: a page a big transaction
 * had spilled and now overwrites in place, the frame headers it then
 * rewrites with new checksums (the commit frame's among them, after its
 * page: held, it would miss the commit), the rest of a page SQLite split at
 * a sync point when it pads a commit to a sector boundary.  Reads, syncs,
 * truncation, size, file controls, memory maps and close write what is held
 * first, so nothing can see the file without it.
 *
 * A failed write of held frames is returned to SQLite by the call that
 * triggered it as SQLITE_IOERR_WRITE, so a commit whose frames did not reach
 * the file fails.  The held bytes are dropped: they are frames no commit
 * covers, of the transaction in progress or of one rolled back (a commit's
 * frames are written before it returns), and SQLite answers an I/O error
 * inside a transaction by rolling the whole transaction back (vdbeaux.c,
 * sqlite3VdbeHalt), which forgets those frames too.  SQLITE_FULL, which the
 * default VFS gives a full disk, could roll back only the statement and go
 * on counting on them, so it is not passed on for held bytes.  Dropping
 * rather than writing them later also keeps a commit SQLite rolled back
 * from reaching the file whole, where recovery after a crash would find it
 * valid.
 *
 * Every other file (the database, temporary files) passes straight through,
 * as does every method not named above.  One connection uses a file at a
 * time (SQLite's rule); the counters are shared between threads.
 */
#include "walvfs.h"

#include <assert.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define WAL_HEADER_BYTES 32       /* the file header, at offset 0 */
#define WAL_FRAME_HEADER_BYTES 24 /* before each page */
/* Bytes held at most: the most the unix VFS writes with one call (os_unix.c,
 * seekAndWriteFd, asserts nBuf == (nBuf & 0x1ffff) and masks it so: a bigger
 * write would lose its top bits).  SQLite itself never writes more than a
 * page of 64 KiB at once; a commit of more than about 31 pages of 4 KiB is
 * written in that many pieces. */
#define WALVFS_HOLD_MAX 0x1ffff
#define WALVFS_IO_VERSION 3 /* the newest sqlite3_io_methods this file knows */

typedef struct {
  sqlite3_file base;          /* what SQLite sees; first, so the pointers convert */
  sqlite3_io_methods methods; /* this file's methods: iVersion as the real file's */
  sqlite3_file *real;         /* the default VFS's file, in the same allocation */
  bool wal;                   /* a WAL (SQLITE_OPEN_WAL): appends are held */
  unsigned char *held;        /* WALVFS_HOLD_MAX bytes once needed; from held_offset on */
  size_t held_len;            /* bytes held; 0: none */
  sqlite3_int64 held_offset;  /* file offset of held[0] */
  sqlite3_int64 log_end;      /* end of the furthest write since the log (re)started; -1: none */
  sqlite3_int64 page_due;     /* offset of the page behind a held frame header; -1: none */
  bool commit_due;            /* that frame header is a commit frame's */
} walvfs_file_t;

/* The real file starts here, aligned for anything it holds. */
#define WALVFS_REAL_OFFSET ((sizeof(walvfs_file_t) + 15) & ~(size_t)15)

static _Atomic uint64_t stat_sqlite_writes;
static _Atomic uint64_t stat_file_writes;
static _Atomic uint64_t stat_passed;
static _Atomic uint64_t stat_failed;
static _Atomic uint64_t stat_full;

static void stat_add(_Atomic uint64_t *counter) {
  atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
}

/* ---- holding and writing ---- */

/* One write to the real file; a write the disk had no room for (the default
 * VFS's SQLITE_FULL) is counted, so that the store can say why it failed
 * when SQLite reports it as an I/O error (see the top of the file). */
static int walvfs_real_write(walvfs_file_t *f, const void *data, int amt, sqlite3_int64 offset) {
  int rc = f->real->pMethods->xWrite(f->real, data, amt, offset);
  if (rc == SQLITE_FULL)
    stat_add(&stat_full);
  return rc;
}

/* Writes what is held with one call to the real file.  Returns SQLITE_OK,
 * or SQLITE_IOERR_WRITE when the write failed or fell short; what was held
 * is dropped either way (see the top of the file for why that is safe). */
static int walvfs_flush(walvfs_file_t *f) {
  if (f->held_len == 0)
    return SQLITE_OK;
  assert(f->held_len <= WALVFS_HOLD_MAX);
  stat_add(&stat_file_writes);
  int rc = walvfs_real_write(f, f->held, (int)f->held_len, f->held_offset);
  f->held_len = 0;
  if (rc != SQLITE_OK) {
    stat_add(&stat_failed);
    return SQLITE_IOERR_WRITE;
  }
  return SQLITE_OK;
}

/* Allocates the buffer on first use; false when memory is short (the
 * caller writes directly instead). */
static bool walvfs_reserve(walvfs_file_t *f) {
  if (f->held == NULL)
    f->held = malloc(WALVFS_HOLD_MAX);
  return f->held != NULL;
}

static void walvfs_note_end(walvfs_file_t *f, sqlite3_int64 end) {
  if (end > f->log_end)
    f->log_end = end;
}

/* Writes at once, after what is held (SQLite's order is kept). */
static int walvfs_pass(walvfs_file_t *f, const void *data, int amt, sqlite3_int64 offset) {
  stat_add(&stat_passed);
  f->page_due = -1; /* a frame cut short or rewritten: no page is due */
  int rc = walvfs_flush(f);
  if (rc != SQLITE_OK)
    return rc;
  stat_add(&stat_file_writes);
  rc = walvfs_real_write(f, data, amt, offset);
  if (rc == SQLITE_OK)
    walvfs_note_end(f, offset + amt);
  return rc;
}

/* Appends a write to what is held (writing what is held first when the
 * write does not continue it or would overflow the bound), then writes
 * everything if `complete` (the write completes a commit frame). */
static int walvfs_hold(walvfs_file_t *f, const void *data, int amt, sqlite3_int64 offset,
                       bool complete) {
  size_t len = (size_t)amt;
  bool continues =
      offset == f->held_offset + (sqlite3_int64)f->held_len && f->held_len + len <= WALVFS_HOLD_MAX;
  int rc = continues ? SQLITE_OK : walvfs_flush(f);
  if (rc != SQLITE_OK)
    return rc;
  if (len > WALVFS_HOLD_MAX || !walvfs_reserve(f)) {
    /* Too big to hold, or no memory to hold it: written as it comes. */
    rc = walvfs_flush(f);
    if (rc != SQLITE_OK)
      return rc;
    stat_add(&stat_file_writes);
    rc = walvfs_real_write(f, data, amt, offset);
    if (rc != SQLITE_OK)
      return rc;
  } else {
    if (f->held_len == 0)
      f->held_offset = offset;
    memcpy(f->held + f->held_len, data, len);
    f->held_len += len;
  }
  walvfs_note_end(f, offset + amt);
  return complete ? walvfs_flush(f) : SQLITE_OK;
}

/* ---- the WAL file's methods that differ ---- */

/* Sorts each write SQLite makes into the file header, a frame header or the
 * page behind one (held), or anything else (written at once). */
static int walvfs_write(sqlite3_file *file, const void *data, int amt, sqlite3_int64 offset) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  if (!f->wal)
    return walvfs_real_write(f, data, amt, offset);
  stat_add(&stat_sqlite_writes);
  const unsigned char *bytes = data;
  if (offset == 0 && amt == WAL_HEADER_BYTES) {
    /* The log (re)starts: frames follow from offset 32 on, over the old ones. */
    f->page_due = -1;
    int rc = walvfs_hold(f, data, amt, offset, false);
    if (rc == SQLITE_OK)
      f->log_end = WAL_HEADER_BYTES;
    return rc;
  }
  if (amt == WAL_FRAME_HEADER_BYTES && offset >= f->log_end) {
    /* A frame appended (below log_end: a header rewritten, written at once). */
    int rc = walvfs_hold(f, data, amt, offset, false);
    f->page_due = rc == SQLITE_OK ? offset + amt : -1;
    f->commit_due = (bytes[4] | bytes[5] | bytes[6] | bytes[7]) != 0;
    return rc;
  }
  if (offset == f->page_due) {
    /* The frame's page: the whole frame is held, the commit's written. */
    f->page_due = -1;
    return walvfs_hold(f, data, amt, offset, f->commit_due);
  }
  return walvfs_pass(f, data, amt, offset);
}

static int walvfs_read(sqlite3_file *file, void *data, int amt, sqlite3_int64 offset) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xRead(f->real, data, amt, offset);
}

static int walvfs_truncate(sqlite3_file *file, sqlite3_int64 size) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  if (rc != SQLITE_OK)
    return rc;
  if (f->log_end > size)
    f->log_end = size;
  f->page_due = -1;
  return f->real->pMethods->xTruncate(f->real, size);
}

static int walvfs_sync(sqlite3_file *file, int flags) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xSync(f->real, flags);
}

static int walvfs_file_size(sqlite3_file *file, sqlite3_int64 *size) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

static int walvfs_file_control(sqlite3_file *file, int op, void *arg) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xFileControl(f->real, op, arg);
}

static int walvfs_fetch(sqlite3_file *file, sqlite3_int64 offset, int amt, void **pp) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  *pp = NULL;
  int rc = walvfs_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xFetch(f->real, offset, amt, pp);
}

/* Writes what is held, closes the real file whatever happens, and returns
 * the first error.  What is held here can only be frames no commit covers
 * (every commit writes its frames before it returns; SQLite closes the log
 * with the connection, after rolling back what is open), so a failed write
 * loses nothing committed; SQLite mostly ignores what closing a log returns,
 * and the failure is counted all the same. */
static int walvfs_close(sqlite3_file *file) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  int rc = walvfs_flush(f);
  int closed = f->real->pMethods->xClose(f->real);
  free(f->held);
  f->held = NULL;
  f->held_len = 0;
  return rc != SQLITE_OK ? rc : closed;
}

/* ---- methods passed to the real file ---- */

#define REAL(file) (((walvfs_file_t *)(file))->real)

static int walvfs_lock(sqlite3_file *file, int level) {
  return REAL(file)->pMethods->xLock(REAL(file), level);
}

static int walvfs_unlock(sqlite3_file *file, int level) {
  return REAL(file)->pMethods->xUnlock(REAL(file), level);
}

static int walvfs_check_reserved(sqlite3_file *file, int *out) {
  return REAL(file)->pMethods->xCheckReservedLock(REAL(file), out);
}

static int walvfs_sector_size(sqlite3_file *file) {
  return REAL(file)->pMethods->xSectorSize(REAL(file));
}

static int walvfs_device_characteristics(sqlite3_file *file) {
  return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file));
}

static int walvfs_shm_map(sqlite3_file *file, int region, int size, int extend,
                          void volatile **pp) {
  return REAL(file)->pMethods->xShmMap(REAL(file), region, size, extend, pp);
}

static int walvfs_shm_lock(sqlite3_file *file, int offset, int n, int flags) {
  return REAL(file)->pMethods->xShmLock(REAL(file), offset, n, flags);
}

static void walvfs_shm_barrier(sqlite3_file *file) {
  REAL(file)->pMethods->xShmBarrier(REAL(file));
}

static int walvfs_shm_unmap(sqlite3_file *file, int delete_flag) {
  return REAL(file)->pMethods->xShmUnmap(REAL(file), delete_flag);
}

static int walvfs_unfetch(sqlite3_file *file, sqlite3_int64 offset, void *p) {
  return REAL(file)->pMethods->xUnfetch(REAL(file), offset, p);
}

/* Copied into each file, which gets its real file's iVersion: SQLite then
 * calls none of the methods the real file lacks. */
static const sqlite3_io_methods walvfs_methods = {
    .iVersion = WALVFS_IO_VERSION,
    .xClose = walvfs_close,
    .xRead = walvfs_read,
    .xWrite = walvfs_write,
    .xTruncate = walvfs_truncate,
    .xSync = walvfs_sync,
    .xFileSize = walvfs_file_size,
    .xLock = walvfs_lock,
    .xUnlock = walvfs_unlock,
    .xCheckReservedLock = walvfs_check_reserved,
    .xFileControl = walvfs_file_control,
    .xSectorSize = walvfs_sector_size,
    .xDeviceCharacteristics = walvfs_device_characteristics,
    .xShmMap = walvfs_shm_map,
    .xShmLock = walvfs_shm_lock,
    .xShmBarrier = walvfs_shm_barrier,
    .xShmUnmap = walvfs_shm_unmap,
    .xFetch = walvfs_fetch,
    .xUnfetch = walvfs_unfetch,
};

/* ---- the VFS ---- */

#define REAL_VFS(vfs) ((sqlite3_vfs *)(vfs)->pAppData)

/* Opens the file with the default VFS inside our own file object.  On
 * failure the object has no methods (SQLite will not close it) and the real
 * file, if its open left it needing a close, is closed here. */
static int walvfs_open(sqlite3_vfs *vfs, sqlite3_filename name, sqlite3_file *file, int flags,
                       int *out_flags) {
  walvfs_file_t *f = (walvfs_file_t *)file;
  memset(f, 0, sizeof *f);
  f->real = (sqlite3_file *)((char *)file + WALVFS_REAL_OFFSET);
  int rc = REAL_VFS(vfs)->xOpen(REAL_VFS(vfs), name, f->real, flags, out_flags);
  if (rc != SQLITE_OK) {
    if (f->real->pMethods)
      f->real->pMethods->xClose(f->real);
    file->pMethods = NULL;
    return rc;
  }
  f->methods = walvfs_methods;
  int version = f->real->pMethods->iVersion;
  f->methods.iVersion = version < WALVFS_IO_VERSION ? version : WALVFS_IO_VERSION;
  f->wal = (flags & SQLITE_OPEN_WAL) != 0;
  f->log_end = -1;
  f->page_due = -1;
  file->pMethods = &f->methods;
  return SQLITE_OK;
}

static int walvfs_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
  return REAL_VFS(vfs)->xDelete(REAL_VFS(vfs), name, sync_dir);
}

static int walvfs_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
  return REAL_VFS(vfs)->xAccess(REAL_VFS(vfs), name, flags, out);
}

static int walvfs_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out) {
  return REAL_VFS(vfs)->xFullPathname(REAL_VFS(vfs), name, n, out);
}

static void *walvfs_dl_open(sqlite3_vfs *vfs, const char *name) {
  return REAL_VFS(vfs)->xDlOpen(REAL_VFS(vfs), name);
}

static void walvfs_dl_error(sqlite3_vfs *vfs, int n, char *out) {
  REAL_VFS(vfs)->xDlError(REAL_VFS(vfs), n, out);
}

static void (*walvfs_dl_sym(sqlite3_vfs *vfs, void *lib, const char *symbol))(void) {
  return REAL_VFS(vfs)->xDlSym(REAL_VFS(vfs), lib, symbol);
}

static void walvfs_dl_close(sqlite3_vfs *vfs, void *lib) {
  REAL_VFS(vfs)->xDlClose(REAL_VFS(vfs), lib);
}

static int walvfs_randomness(sqlite3_vfs *vfs, int n, char *out) {
  return REAL_VFS(vfs)->xRandomness(REAL_VFS(vfs), n, out);
}

static int walvfs_sleep(sqlite3_vfs *vfs, int microseconds) {
  return REAL_VFS(vfs)->xSleep(REAL_VFS(vfs), microseconds);
}

static int walvfs_current_time(sqlite3_vfs *vfs, double *out) {
  return REAL_VFS(vfs)->xCurrentTime(REAL_VFS(vfs), out);
}

static int walvfs_get_last_error(sqlite3_vfs *vfs, int n, char *out) {
  return REAL_VFS(vfs)->xGetLastError(REAL_VFS(vfs), n, out);
}

static int walvfs_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
  return REAL_VFS(vfs)->xCurrentTimeInt64(REAL_VFS(vfs), out);
}

static int walvfs_set_system_call(sqlite3_vfs *vfs, const char *name, sqlite3_syscall_ptr call) {
  return REAL_VFS(vfs)->xSetSystemCall(REAL_VFS(vfs), name, call);
}

static sqlite3_syscall_ptr walvfs_get_system_call(sqlite3_vfs *vfs, const char *name) {
  return REAL_VFS(vfs)->xGetSystemCall(REAL_VFS(vfs), name);
}

static const char *walvfs_next_system_call(sqlite3_vfs *vfs, const char *name) {
  return REAL_VFS(vfs)->xNextSystemCall(REAL_VFS(vfs), name);
}

static sqlite3_vfs walvfs_vfs = {
    .zName = WALVFS_NAME,
    .xOpen = walvfs_open,
    .xDelete = walvfs_delete,
    .xAccess = walvfs_access,
    .xFullPathname = walvfs_full_pathname,
    .xDlOpen = walvfs_dl_open,
    .xDlError = walvfs_dl_error,
    .xDlSym = walvfs_dl_sym,
    .xDlClose = walvfs_dl_close,
    .xRandomness = walvfs_randomness,
    .xSleep = walvfs_sleep,
    .xCurrentTime = walvfs_current_time,
    .xGetLastError = walvfs_get_last_error,
    .xCurrentTimeInt64 = walvfs_current_time_int64,
    .xSetSystemCall = walvfs_set_system_call,
    .xGetSystemCall = walvfs_get_system_call,
    .xNextSystemCall = walvfs_next_system_call,
};

static const char *registered_name;

/* Fills in what depends on the default VFS (its version: SQLite calls no
 * method it lacks; its file size plus ours) and registers. */
static void walvfs_register_once(void) {
  sqlite3_vfs *real = sqlite3_vfs_find(NULL);
  if (real == NULL)
    return;
  walvfs_vfs.iVersion = real->iVersion < 3 ? real->iVersion : 3;
  walvfs_vfs.szOsFile = (int)(WALVFS_REAL_OFFSET + (size_t)real->szOsFile);
  walvfs_vfs.mxPathname = real->mxPathname;
  walvfs_vfs.pAppData = real;
  if (sqlite3_vfs_register(&walvfs_vfs, 0) == SQLITE_OK)
    registered_name = WALVFS_NAME;
}

const char *walvfs_register(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, walvfs_register_once);
  return registered_name;
}

void walvfs_stats(walvfs_stats_t *out) {
  out->sqlite_writes = atomic_load_explicit(&stat_sqlite_writes, memory_order_relaxed);
  out->file_writes = atomic_load_explicit(&stat_file_writes, memory_order_relaxed);
  out->passed = atomic_load_explicit(&stat_passed, memory_order_relaxed);
  out->failed = atomic_load_explicit(&stat_failed, memory_order_relaxed);
  out->full = atomic_load_explicit(&stat_full, memory_order_relaxed);
}
