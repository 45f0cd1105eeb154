/*
 * reaper.h — the head's background removal of tasks, a chunk at a time
 * between the requests (reaper.c): the tasks of deleted queues, big purges,
 * the tasks of big closed sessions, and done tasks past their queue's
 * retention (queue_reap.h and session.h do the SQL); and, once a minute,
 * the worker instances reported ended too long ago (worker_ended.h).
 */
#ifndef MUSTER_SERVER_REAPER_H
#define MUSTER_SERVER_REAPER_H

#include <stdint.h>

#include "http.h"
#include "server.h"

typedef struct reaper reaper_t;

/* The reaper of head `h`, whose loop and store are ready; its first chunk
 * runs at the loop's next turn (the trash of a head that stopped during a
 * deletion, or of closed sessions, is emptied first).  NULL when out of memory. */
reaper_t *reaper_new(head_t *h);
/* Frees it (parked requests must have been answered: reaper_release_all);
 * accepts NULL. */
void reaper_free(reaper_t *rp);

/* Runs the reaper at the loop's next turn instead of its next planned one:
 * the store holds work for it that no parked request brought (a session
 * closed with more tasks than a chunk).  Accepts a head without a reaper. */
void reaper_wake(head_t *h);
/* Parks DELETE request `r`, whose queue went to the trash with `tasks` tasks
 * and `sessions` sessions closed, until the trash of `queue` is empty; then
 * it is answered {"deleted", "tasks", "sessions_closed"}. */
void reaper_park_delete(http_req_t *r, const char *queue, int64_t tasks, int64_t sessions);
/* Parks purge request `r`, which purged `purged` tasks of `queue` and left
 * more queued at or below task id `horizon`; the purge goes on a chunk per
 * loop turn and is answered {"purged"} when none is left. */
void reaper_park_purge(http_req_t *r, const char *queue, int64_t horizon, int64_t purged);
/* The head stops: every parked request is answered now (a deletion as done,
 * since it finishes at the next start; a purge with 503, saying how far it
 * got), and no chunk runs any more. */
void reaper_release_all(head_t *h);

#endif
