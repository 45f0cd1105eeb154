/*
 * pool_internal.h — what the files of muster_pool_t share (pool.c: open,
 * close, submitting and iterating; pool_map.c: map, whole or partial;
 * pool_why.c: muster_pool_iter_failing).
 */
#ifndef MUSTER_CLIENT_POOL_INTERNAL_H
#define MUSTER_CLIENT_POOL_INTERNAL_H

#include "client/beat.h"
#include "client/client_internal.h"

#include <stdint.h>

#define POOL_POLL_MS 20000    /* longest single long-poll; the head caps it too */
#define POOL_MIN_POLL_MS 1000 /* an empty read is repeated no sooner than this */
#define POOL_SUBMIT_PAUSE_S 1 /* between submit attempts to a head that is down */
#define POOL_DEFAULT_TIMEOUT_MS 60000

struct muster_pool {
  muster_client_t *client; /* the caller's thread */
  char *queue;
  char *session;
  int own_session; /* created by this pool: closed at close unless keep_session */
  int keep_session;
  int64_t timeout_ms;       /* the session's heartbeat timeout, as the head reported it */
  int64_t next_index;       /* session index the next input gets */
  int64_t completion_floor; /* highest completion cursor seen by any iterator */
  char message[CLIENT_MESSAGE_MAX];
  muster_client_t *hb_client;      /* the heartbeat thread's own handle */
  beat_t hb;                       /* the heartbeat thread (zeroed: none) */
  int64_t request_timeout_ms;      /* each request's (long-polls add their wait); 0: the client's */
  muster_shared_level_t *required; /* what every task requires (the caller's, copied) */
  size_t required_count;
};

struct muster_pool_iter {
  muster_pool_t *pool;
  int ordered;
  int64_t first;         /* session index of input 0 */
  int64_t first_id;      /* task id of input 0 (a put's tasks get consecutive ids); 0: unknown */
  size_t total;          /* inputs */
  size_t delivered;      /* results handed to the caller */
  size_t duplicates;     /* repeats dropped */
  int64_t cursor;        /* ordered: next index wanted; unordered: completion cursor */
  unsigned char *seen;   /* bitmap over [0, total): delivered positions */
  muster_results_t page; /* the last page read */
  size_t page_at;        /* next result of `page` to look at */
  int stalled;           /* the last page stopped at a gap while every task had its result */
};

/* Writes the printf-style explanation into the pool's message; returns `err`. */
muster_err_t pool_fail(muster_pool_t *pool, muster_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copies the client's message of a failed call onto the pool (clears it on
 * MUSTER_OK); returns `err`. */
muster_err_t pool_from_client(muster_pool_t *pool, muster_err_t err);

/* Milliseconds on the monotonic clock. */
int64_t pool_now_ms(void);

/*
 * The checks muster_pool_imap makes before it submits anything: `inputs`
 * given when `count` > 0, and every input JSON text.  MUSTER_OK, or
 * MUSTER_INVALID with the pool's message naming the first input refused by
 * its place among the caller's inputs ("inputs[7]: not valid JSON: ...").
 */
muster_err_t pool_check_inputs(muster_pool_t *pool, const char *const *inputs, size_t count);

/* Submits the checked `inputs` and makes their iterator (muster_pool_imap
 * after its checks).  On failure *out is NULL: nothing was submitted, or
 * only some batches (those tasks stay in the session). */
muster_err_t pool_imap_start(muster_pool_t *pool, const char *const *inputs, size_t count,
                             int ordered, muster_pool_iter_t **out);

#endif
