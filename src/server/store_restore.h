/*
 * store_restore.h — a head started on a backup's copy of its store
 * (store_restore.c), for store.c.
 */
#ifndef MUSTER_SERVER_STORE_RESTORE_H
#define MUSTER_SERVER_STORE_RESTORE_H

#include <sqlite3.h>
#include <stdint.h>

#include "fail.h"

/*
 * When the store `db` carries the backup mark (STORE_BACKUP_MARK, store.h),
 * raises every id counter a client may keep to `floor` at least, records
 * `floor` as meta's id floor, clears the mark and logs one line, all in one
 * transaction; does nothing to a store without the mark.  `floor` is the
 * clock's milliseconds times 1024 (store.c), above any id the head that the
 * backup was taken from can have handed out.  MUSTER_OK, or MUSTER_STORE
 * with *f filled (nothing changed then).
 */
muster_err_t store_restore_ids(sqlite3 *db, int64_t floor, fail_t *f);

#endif
