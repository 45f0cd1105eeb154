/*
 * fail.h — an error code with a specific message, filled by domain code and
 * turned into the JSON error envelope by the route layer.
 */
#ifndef MUSTER_SERVER_FAIL_H
#define MUSTER_SERVER_FAIL_H

#include "muster.h"

#include <errno.h>
#include <stdbool.h>

typedef struct {
  muster_err_t code; /* MUSTER_OK while nothing failed */
  char message[512]; /* specific explanation; "" means the table's default */
} fail_t;

/* Records `code` with a printf-style message in *f and returns `code`, so a
 * caller can write `return fail_set(f, MUSTER_INVALID, "...")`. */
muster_err_t fail_set(fail_t *f, muster_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The message to show: the specific one when set, else the table's. */
const char *fail_message(const fail_t *f);

/* True when errno value `err` says the head is out of file descriptors
 * (EMFILE, ENFILE).  That is the head's passing trouble, not its store's
 * nor the client's: what fails for it answers 503 unavailable, saying
 * FAIL_FDS_TEXT, to be sent again. */
static inline bool fail_errno_is_fds(int err) {
  return err == EMFILE || err == ENFILE;
}
#define FAIL_FDS_TEXT                                                                              \
  "the head is out of file descriptors (clients hold connections open, or its limit, ulimit -n, "  \
  "is low)"

/* Bounds at or above this are no limit a user meets (ids are below 2^53): a
 * range up to one is described as "at least MIN". */
#define FAIL_NO_UPPER ((1LL << 53) - 1)

/* Writes into buf (and returns it) how integers in [min, max] are described
 * in a message, for the value `value` that was refused: "from 1 to 1000",
 * "at least 1" when max is no real limit, or "at most MAX" for a value above
 * such a max (or at it: strtoll clamps what overflows to it).  Messages read
 * "...; it must be " followed by this. */
const char *fail_range(char *buf, size_t size, int64_t value, int64_t min, int64_t max);

/* Records MUSTER_INVALID for query parameter `key` whose text is not an
 * integer in [min, max]: "query limit: '0' is out of range; it must be from 1
 * to 1000" (or "is not an integer").  Returns MUSTER_INVALID. */
muster_err_t fail_query_int(fail_t *f, const char *key, const char *text, int64_t min, int64_t max);

/* Reads `text`, the value of query parameter `key` (NULL when absent: then
 * *out = dflt), as an integer in [min, max]; MUSTER_OK, or fail_query_int's
 * refusal.  The one reader of the head's integer query parameters. */
muster_err_t query_int_read(const char *text, const char *key, int64_t dflt, int64_t min,
                            int64_t max, int64_t *out, fail_t *f);

#endif
