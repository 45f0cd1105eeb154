/*
 * error.c — the one error table, turned into lookups.
 *
 * The table itself is MUSTER_ERRNO_MAP in include/muster.h so that server,
 * library and tests agree on codes, wire strings, statuses and messages.
 */
#include "muster.h"

#include <string.h>

typedef struct {
  const char *name;
  int status;
  const char *message;
} err_row_t;

static const err_row_t err_rows[MUSTER_ERR_COUNT] = {
#define ERR_ROW(code, str, status, msg) [MUSTER_##code] = {str, status, msg},
    MUSTER_ERRNO_MAP(ERR_ROW)
#undef ERR_ROW
};

static const err_row_t *err_row(muster_err_t err) {
  if ((unsigned)err >= MUSTER_ERR_COUNT)
    return &err_rows[MUSTER_INTERNAL];
  return &err_rows[err];
}

const char *muster_strerror(muster_err_t err) {
  return err_row(err)->message;
}

const char *muster_err_name(muster_err_t err) {
  return err_row(err)->name;
}

int muster_err_http_status(muster_err_t err) {
  return err_row(err)->status;
}

muster_err_t muster_err_from_name(const char *name) {
  if (name == NULL)
    return MUSTER_PROTOCOL;
  for (int i = 0; i < MUSTER_ERR_COUNT; i++)
    if (strcmp(err_rows[i].name, name) == 0)
      return (muster_err_t)i;
  return MUSTER_PROTOCOL;
}
