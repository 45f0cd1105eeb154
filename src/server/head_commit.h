/*
 * head_commit.h — the head's group commit and durable replies
 * (head_commit.c), as head.c wires them into its loop and store.
 */
#ifndef MUSTER_SERVER_HEAD_COMMIT_H
#define MUSTER_SERVER_HEAD_COMMIT_H

#include "server.h"

#include <event2/util.h>

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

#endif
