/*
 * get_dest.h — the FILE that `muster shared get` writes, all or nothing.
 *
 * The bytes go to a temporary file beside the file FILE names (the same
 * directory, so the same file system; a symbolic link followed, as open()
 * follows it), which replaces that file only once the download is complete
 * and verified.  A failed download removes the temporary file and leaves FILE
 * as it was: absent, or its old content.  Truncating FILE first, as the CLI
 * did, lost a file that was there whenever the download failed (a level that
 * expired, a head that restarted).  A device or a FIFO (/dev/null), which no
 * file may replace, is written into as the bytes come, and never removed.
 * python/muster/_replace.py does the same for the Python client's get_to.
 */
#ifndef MUSTER_CLI_GET_DEST_H
#define MUSTER_CLI_GET_DEST_H

#include <stdbool.h>

typedef struct {
  int fd;           /* where the bytes go; -1 when closed */
  const char *path; /* FILE as the user gave it, for messages (not owned) */
  char *target;     /* the file replaced (links followed); owned */
  char *tmp;        /* the temporary file beside it; NULL when written into; owned */
  bool created;     /* target made here (through a dangling link): removed on failure */
} get_dest_t;

/* Opens the destination for `path`; CLI_OK, or CLI_FAIL once the reason was
 * printed (nothing is left behind then). */
int get_dest_open(get_dest_t *d, const char *path);
/* Puts the bytes in place (renames the temporary file over the target) and
 * frees `d`; CLI_OK, or CLI_FAIL once the reason was printed (the target is
 * then as it was). */
int get_dest_commit(get_dest_t *d);
/* Drops what was written (the temporary file; a target made here) and frees
 * `d`.  A device or a FIFO keeps what it was given. */
void get_dest_discard(get_dest_t *d);

#endif
