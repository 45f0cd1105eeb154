/*
 * backup.h — online backups of a running head (POST /v1/backup, backup.c).
 *
 * A backup is a new directory DATA_DIR/backups/NAME that a head can be
 * started on (`muster head --data-dir DATA_DIR/backups/NAME`): muster.db, a
 * consistent copy of the store made while the head serves; shared/, the blob
 * files that copy's levels name; token, the admin token.  One runs at a
 * time.  See docs/operations.md.
 */
#ifndef MUSTER_SERVER_BACKUP_H
#define MUSTER_SERVER_BACKUP_H

#include <stdbool.h>

#include "http.h"
#include "server.h"

/* Database pages copied per step, unless MUSTER_BACKUP_STEP_PAGES (1 to
 * 1000000) says otherwise: the longest a step holds the loop is the copy of
 * this many pages of 4 KiB (docs/design-notes.md, "Online backups"). */
#define BACKUP_STEP_PAGES 64

/* POST /v1/backup {"name"?}: starts a backup and parks the request until it
 * is made (201 with what it holds) or failed (removed, with why). */
void backup_h_create(http_req_t *r);

/* Copies the next pages of the backup under way, if one is and no
 * transaction is open (SQLite copies nothing inside one): the head calls it
 * after each commit (head_commit), the backup's own timer when the head is
 * idle. */
void backup_pump(head_t *h);

/* True while a backup links or copies blob files: the sweep must not unlink
 * any (shared_files_sweep), so that each file the copy names is there. */
bool backup_holds_files(const head_t *h);

/* Removes the backups a head stopped while making (kill -9, a power loss)
 * left in DATA_DIR/backups, as .NAME.partial directories, and says so: a
 * backup under its own name is always whole.  At the head's start. */
void backup_remove_unfinished(const char *data_dir);

/* The head stops: a backup still copying its database is given up and
 * removed (its request answered 503); one whose files are being synced is
 * waited for and answered.  Accepts a head with no backup under way. */
void backup_stop(head_t *h);

#endif
