/*
 * head_commit.h — the head's group commit and durable replies
 * (head_commit.c), as head.c wires them into its loop and store.
 */
#ifndef MUSTER_SERVER_HEAD_COMMIT_H
#define MUSTER_SERVER_HEAD_COMMIT_H

#include "server.h"

#include <event2/util.h>

/* How much later than its period a sweep may run (head.c, head_note_stall),
 * and how long a flush of the WAL on the helper thread may take
 * (head_flush_stalled), before the head counts the time as a stall: far more
 * than a busy loop turn or a flush takes. */
#define HEAD_STALL_MS 1000

/* The store's hooks: a transaction opened (the commit runs at the end of
 * the turn), a queue got ready tasks, a session got results. */
void head_on_tx(void *arg);
void head_on_ready(void *arg, const char *queue);
void head_on_session(void *arg, const char *session);
/* The commit event's callback (head_t *arg): serves woken waiters, commits
 * the turn's transaction and releases its replies when they may leave. */
void head_commit(evutil_socket_t fd, short what, void *arg);
/* With --sync full: starts the WAL flush thread (or falls back to SQLite's
 * own flush at each commit), and flushes what opening the store wrote. */
void head_start_syncer(head_t *h, const char *db_path);
/* At shutdown: stops the flush thread, flushes and answers what it held. */
void head_drain_syncs(head_t *h);
/* True while the helper thread's flush in flight has run for more than
 * HEAD_STALL_MS (a disk that stalls): the loop goes on, but no reply that
 * waits for a flush can leave, so the sweep counts nobody's silence
 * meanwhile (head.c, head_sweep); its end gives every timeout afresh
 * (head_commit.c, head_note_flush_stall).  Costs one clock read, per sweep. */
bool head_flush_stalled(const head_t *h);

#endif
