/*
 * syncer.h — fdatasync of the store's write-ahead log on a helper thread.
 *
 * With `--sync full` the head commits with SQLite's synchronous=NORMAL (the
 * commit writes the WAL but does not flush it) and, for a group of several
 * requests, asks the syncer to flush the WAL file; the group's replies are
 * sent when it ends, by the helper thread itself (its `then`: h1.h, "replies
 * held back for a flush").  Meanwhile the event loop keeps reading and
 * executing requests into the next group, which commits when the flush ends
 * (or at once, with its flush queued behind: head.c, head_commit_behind):
 * the disk's latency no longer stalls the loop (head.c, "durable replies").
 */
#ifndef MUSTER_SERVER_SYNCER_H
#define MUSTER_SERVER_SYNCER_H

#include <stdbool.h>
#include <stdint.h>

struct event_base;
typedef struct syncer syncer_t;

/* Called on the loop thread when a flush ends; `err` is 0 or an errno. */
typedef void (*syncer_done_fn)(void *arg, int err);

/* Starts the helper thread flushing `fd` (borrowed; it must outlive the
 * syncer).  Returns NULL when the thread or its pipe cannot be made. */
syncer_t *syncer_start(struct event_base *base, int fd, syncer_done_fn done, void *arg);
/* Runs on the helper thread right after a flush that succeeded, before the
 * loop hears of it (head.c: the flushed group's replies are written there). */
typedef void (*syncer_then_fn)(void *arg);

/* Starts a flush, then `then(then_arg)` when it succeeded (NULL: nothing).
 *
 * A second flush: while one runs, one more may be requested (a loop that
 * committed more meanwhile); the thread starts it the moment the first ends,
 * without waiting for the loop to hear of the first (head.c, "a flush queued
 * behind").  Never more than two outstanding, and never while a request
 * waits untaken (syncer_waiting). */
void syncer_request(syncer_t *s, syncer_then_fn then, void *then_arg);
bool syncer_busy(const syncer_t *s);
/* Flushes requested whose end the loop has not heard of (0, 1 or 2). */
unsigned syncer_outstanding(const syncer_t *s);
/* True while the last request waits for the thread to take it: its fdatasync
 * has not begun, so it covers every write made before this call. */
bool syncer_waiting(syncer_t *s);
/* When the thread took the last request to flush it (CLOCK_MONOTONIC, µs, as
 * metrics_now_us); 0 while that request waits untaken. */
int64_t syncer_taken_us(syncer_t *s);
/* How many of the outstanding flushes, oldest first, have already succeeded
 * though the loop has not heard of them yet: what they cover is on disk. */
unsigned syncer_flushed(syncer_t *s);
/* Waits for the outstanding flushes, stops the thread and frees; accepts
 * NULL.  The done callback is not called for a flush that ends here: their
 * results (0 or an errno) are put in results[], oldest first, instead, and
 * their number returned (0, 1 or 2).  Each flush is answered by its own: the
 * first may have made its writes durable though the second failed. */
unsigned syncer_stop(syncer_t *s, int results[2]);
/* For tests only (MUSTER_TEST_FLUSH_HOLD_FILE: head_commit.c): each flush
 * waits, before its fdatasync, for as long as the file `path` exists (or
 * until syncer_stop), as a disk that stalls would hold it, and the log says
 * so once per flush held.  Call before the first request; `path` is copied.
 * Without it the thread tests one pointer per flush. */
void syncer_hold_while(syncer_t *s, const char *path);

#endif
