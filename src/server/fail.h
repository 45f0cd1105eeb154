/*
 * fail.h — an error code with a specific message, filled by domain code and
 * turned into the JSON error envelope by the route layer.
 */
#ifndef MUSTER_SERVER_FAIL_H
#define MUSTER_SERVER_FAIL_H

#include "muster.h"

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

#endif
