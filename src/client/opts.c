/*
 * opts.c — the sized option structs of muster.h ("option structs"): how an
 * init writes a caller's struct and how a call takes one in.
 *
 * Every option struct starts with `size_t size`, the struct's size in the
 * caller's program.  The init writes the defaults within that size only (a
 * program built against an older header has a shorter struct), and a call
 * reads at most that many bytes over its own defaults (the fields an older
 * header did not have keep them).  Both work on bytes, so that one pair of
 * functions serves every struct; the structs' own files hold the defaults
 * and the end of each struct's first version.
 */
#include "client/client_internal.h"

#include <stdio.h>
#include <string.h>

void opts_init_sized(void *opts, size_t size, const void *defaults, size_t full) {
  if (opts == NULL || size < sizeof size)
    return; /* too short to say its own size: a call will refuse it */
  memcpy(opts, defaults, size < full ? size : full);
  memcpy(opts, &size, sizeof size);
}

const char *opts_take(void *local, size_t full, const void *opts, size_t first_end,
                      const char *what, const char *init, char *why, size_t why_size) {
  size_t size;
  memcpy(&size, opts, sizeof size); /* every version of every struct starts with it */
  if (size == 0) {
    snprintf(why, why_size,
             "%s: its size is 0, so it was not set up (a struct zeroed with {0} or memset "
             "is not): call %s on it before setting its fields",
             what, init);
    return why;
  }
  if (size < first_end) {
    snprintf(why, why_size,
             "%s: its size is %zu, less than its first version's %zu bytes, so it was not "
             "set up by %s: call that on it before setting its fields",
             what, size, first_end, init);
    return why;
  }
  memcpy(local, opts, size < full ? size : full);
  memcpy(local, &full, sizeof full); /* a whole struct of this library's now */
  return NULL;
}

muster_err_t client_opts_take(muster_client_t *client, void *local, size_t full, const void *opts,
                              size_t first_end, const char *what, const char *init) {
  char why[CLIENT_MESSAGE_MAX];
  if (opts_take(local, full, opts, first_end, what, init, why, sizeof why) == NULL)
    return MUSTER_OK;
  return client_fail(client, MUSTER_INVALID, "%s", why);
}
