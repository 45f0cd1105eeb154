/*
 * update.h — broadcast updates: numbered messages to every worker of a queue,
 * delivered in order with leases (or read directly).
 *
 * Sequence numbers are per queue and never repeat, not even after updates are
 * deleted (when their session closes, or their queue is deleted): the highest
 * number handed out is kept apart from the updates themselves.
 */
#ifndef MUSTER_SERVER_UPDATE_H
#define MUSTER_SERVER_UPDATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "jw.h"
#include "store.h"

#define UPDATE_MAX_BATCH 1000

/* Posts the update of body {"data", "session"} to `queue` (which must exist).
 * `data` is limited to `max_payload` bytes encoded; a `session` must be open
 * and belong to the queue.  Wakes the queue's long-poll leases.  Returns
 * {"queue", "seq"} or NULL with *f filled. */
json_t *update_post(store_t *st, const char *queue, const json_t *body, size_t max_payload,
                    fail_t *f);
/* Writes {"updates": [...], "last"} into `out` (empty; the caller frees it,
 * also on failure): updates of `queue` with seq > after, ascending, at most
 * `max`, fewer when their data would pass the budget of one reply
 * (reply_budget.h; one always goes), as the reply's text, written around
 * each update's stored data, which is never decoded.  MUSTER_OK, or the
 * failure with *f filled. */
muster_err_t update_list_text(store_t *st, const char *queue, int64_t after, int64_t max,
                              jw_buf_t *out, fail_t *f);
/* The highest sequence number handed out in `queue`; 0 when none. */
int64_t update_last(store_t *st, const char *queue);
/* Appends `,"updates":[...],"updates_last":N` to `out`, the text of a lease
 * reply after its leases: the updates with seq > after, ascending, at most
 * UPDATE_MAX_BATCH, and within the budget of one reply as update_list_text;
 * updates_last is the queue's highest number, or the last one included when
 * more remain.  *count gets the number of updates written.  MUSTER_OK, or
 * the failure with *f filled and `out` holding part of the text. */
muster_err_t update_attach_text(store_t *st, const char *queue, int64_t after, jw_buf_t *out,
                                size_t *count, fail_t *f);
/* Deletes the updates of `session` (it closed). */
muster_err_t update_delete_session(store_t *st, const char *session, fail_t *f);
/* Deletes the updates of `queue` (it is being deleted); its numbering goes on. */
muster_err_t update_delete_queue(store_t *st, const char *queue, fail_t *f);

#endif
