/*
 * syncer.h — fdatasync of the store's write-ahead log on a helper thread.
 *
 * With `--sync full` the head commits with SQLite's synchronous=NORMAL (the
 * commit writes the WAL but does not flush it) and, for a group of several
 * requests, asks the syncer to flush the WAL file; the group's replies are
 * sent when it ends.  Meanwhile the event loop keeps reading and executing
 * requests into the next group, which commits when the flush ends: the
 * disk's latency no longer stalls the loop (head.c, "durable replies").
 */
#ifndef MUSTER_SERVER_SYNCER_H
#define MUSTER_SERVER_SYNCER_H

#include <stdbool.h>

struct event_base;
typedef struct syncer syncer_t;

/* Called on the loop thread when a flush ends; `err` is 0 or an errno. */
typedef void (*syncer_done_fn)(void *arg, int err);

/* Starts the helper thread flushing `fd` (borrowed; it must outlive the
 * syncer).  Returns NULL when the thread or its pipe cannot be made. */
syncer_t *syncer_start(struct event_base *base, int fd, syncer_done_fn done, void *arg);
/* Starts a flush; the syncer must not be busy. */
void syncer_request(syncer_t *s);
bool syncer_busy(const syncer_t *s);
/* Waits for a flush in flight, stops the thread and frees; accepts NULL.
 * The done callback is not called for a flush that ends here. */
void syncer_stop(syncer_t *s);

#endif
