/*
 * server.h — the head's process-wide state, shared by the HTTP layer, the
 * handlers and the timers.  One instance per `muster head`, owned by the
 * event-loop thread.
 */
#ifndef MUSTER_SERVER_SERVER_H
#define MUSTER_SERVER_SERVER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/names.h"
#include "store.h"

struct event_base;
struct evhttp;
struct event;
struct evhttp_request;
typedef struct reply reply_t;
typedef struct waiter waiter_t;
typedef struct results_waiter results_waiter_t;
typedef struct shared_conn shared_conn_t;
typedef struct syncer syncer_t;

/* A list of replies: pending a commit, or committed and pending a WAL flush. */
typedef struct {
  reply_t *head, *tail;
} reply_list_t;

typedef struct {
  char listen_host[256];     /* address to bind ("127.0.0.1", "::1", "0.0.0.0") */
  int listen_port;           /* 0: any free port */
  char data_dir[PATH_MAX];   /* holds muster.db, token, url, head.lock */
  char token[256];           /* admin bearer token */
  char read_token[256];      /* read-only bearer token (--dashboard-token); "" for none */
  bool metrics_public;       /* GET /metrics needs no token (--metrics-public) */
  bool sync_full;            /* fsync at every commit */
  int64_t worker_timeout_ms; /* default heartbeat timeout of workers */
  int64_t node_timeout_ms;   /* default heartbeat timeout of nodes */
  int64_t max_wait_ms;       /* cap of a lease's long-poll */
  int64_t sweep_ms;          /* how often expiries and timeouts are checked */
  size_t max_body;           /* request body limit, bytes */
  size_t max_payload;        /* payload/result limit, bytes */
  int64_t max_shared_ttl_ms; /* default and cap of a shared blob's ttl_ms */
  size_t shared_keep_levels; /* newest levels of a shared blob kept (>= 1) */
  size_t max_blob_bytes;     /* shared blob size limit, bytes */
} head_config_t;

typedef struct head {
  head_config_t cfg;
  struct event_base *base;
  struct evhttp *http;
  store_t *st;
  struct event *commit_ev; /* runs once per loop turn that opened a transaction */
  struct event *sweep_ev;  /* periodic expiry of leases and workers */
  reply_t *pending_head, *pending_tail; /* replies waiting for the commit */
  syncer_t *syncer;        /* flushes the WAL off the loop (--sync full), or NULL */
  int wal_fd;              /* the WAL file the syncer flushes, or -1 */
  reply_list_t syncing;    /* committed, waiting for the WAL flush in flight */
  int64_t flushed_changes; /* store_changes() covered by the last flush begun */
  int64_t flush_started_us; /* when the thread's flush in flight began (metrics) */
  bool sync_failed;        /* a WAL flush failed: the head stops */
  waiter_t *waiters;       /* parked long-poll leases, oldest first */
  results_waiter_t *results_waiters; /* parked long-poll reads of session results */
  shared_conn_t *shared_conns; /* the upload tap's per-connection state (shared_upload.c) */
  char (*dirty)[NAME_MAX_LEN + 1]; /* queues that may serve waiters */
  size_t ndirty, dirty_cap;
  int64_t started_ms;
  bool stopping;
  uint64_t requests;       /* requests handled */
  uint64_t commits;        /* transactions committed */
} head_t;

#endif
