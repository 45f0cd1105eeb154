/*
 * session_internal.h — what session.c, session_results.c and
 * session_close.c share: the session row as the store has it, and loading
 * it.
 */
#ifndef MUSTER_SERVER_SESSION_INTERNAL_H
#define MUSTER_SERVER_SESSION_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/names.h"
#include "session.h"
#include "store.h"

typedef struct {
  char id[SESSION_ID_LEN + 1];
  char queue[NAME_MAX_LEN + 1];
  int state;
  bool cleanup_on_exit;
  bool sealed; /* no task will be put any more (session_seal) */
  int64_t timeout_ms, created_ms, last_seen_ms;
  int64_t next_index; /* index of the next task submitted without one */
  int64_t last_seq;   /* results so far; the seq of the latest */
  int64_t total, done, failed;
  char closed_why[128];
} session_t;

/* Loads session `id` (open or closed) into *ss; *init_data (may be NULL)
 * receives its init data, a raw node of its stored text (jw.h; new
 * reference).  MUSTER_SESSION_NOT_FOUND when unknown. */
muster_err_t session_load(store_t *st, const char *id, session_t *ss, json_t **init_data,
                          fail_t *f);
/* Loads open session `id` into *ss; *init_data (may be NULL) receives its
 * init data (a raw node, new reference).  When `touch`, records the call as
 * the client's heartbeat.  MUSTER_SESSION_NOT_FOUND when unknown or closed
 * (the message says why it was closed). */
muster_err_t session_load_open(store_t *st, const char *id, session_t *ss, json_t **init_data,
                               bool touch, fail_t *f);

#endif
