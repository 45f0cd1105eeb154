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
#include <sys/types.h>

#include "core/names.h"
#include "store.h"

struct event_base;
struct event;
typedef struct h1_server h1_server_t;
typedef struct h1_lend h1_lend_t;
typedef struct reply reply_t;
typedef struct waiter waiter_t;
typedef struct results_waiter results_waiter_t;
typedef struct shared_upload shared_upload_t;
typedef struct syncer syncer_t;
typedef struct reaper reaper_t;
typedef struct backup backup_t;

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
  bool sync_leases;          /* with sync_full, flush leases of tasks on disk too */
  int64_t worker_timeout_ms; /* default heartbeat timeout of workers */
  int64_t node_timeout_ms;   /* default heartbeat timeout of nodes */
  int64_t max_wait_ms;       /* cap of a lease's long-poll */
  int64_t sweep_ms;          /* how often expiries and timeouts are checked */
  size_t max_body;           /* request body limit, bytes */
  size_t max_payload;        /* payload/result limit, bytes */
  int64_t max_shared_ttl_ms; /* default and cap of a shared blob's ttl_ms */
  size_t shared_keep_levels; /* newest levels of a shared blob kept (>= 1) */
  size_t max_blob_bytes;     /* shared blob size limit, bytes */
  int64_t distcompute_max_workers; /* active DistCompute workers per pipeline, at most */
} head_config_t;

typedef struct head {
  head_config_t cfg;
  struct event_base *base;
  h1_server_t *http; /* the HTTP/1.1 server (h1.h) */
  store_t *st;
  struct event *commit_ev;              /* runs once per loop turn that opened a transaction */
  struct event *sweep_ev;               /* periodic expiry of leases and workers */
  reply_t *pending_head, *pending_tail; /* replies waiting for the commit */
  syncer_t *syncer;                     /* flushes the WAL off the loop (--sync full), or NULL */
  int wal_fd;                           /* the WAL file the syncer flushes, or -1 */
  reply_list_t syncing;                 /* committed, waiting for the WAL flush in flight */
  bool syncing_lent;                    /* its replies are built and their connections lent: */
  h1_lend_t *lend;          /* the flush thread writes them (h1.h); NULL: no client left */
  reply_list_t committed;   /* committed during that flush, waiting for the next one */
  int64_t flushed_changes;  /* store_changes() covered by the last flush begun */
  int64_t flush_started_us; /* the thread's flush in flight began (metrics, stalls) */
  size_t answered_in_flush; /* leases answered at their commit during that flush */
  int64_t tx_started_us;    /* when the turn's transaction opened (head_commit's flush policy) */
  /* What is not on disk yet (head_lease_on_disk): the lowest task id
   * committed since the last flush began, and the lowest one the flush in
   * flight covers (INT64_MAX: none); the token floor the last ended flush
   * made durable, and the one the flush in flight will. */
  int64_t unflushed_tasks, flushing_tasks;
  int64_t durable_token_floor, flushing_token_floor;
  /* A second flush queued behind that one (head.c, "a flush queued behind"):
   * the replies it holds (the loop writes them), the lowest task id and the
   * token floor it covers. */
  bool queued_flush;
  reply_list_t queued;
  int64_t queued_tasks, queued_token_floor;
  bool sync_failed;                  /* a WAL flush failed: the head stops */
  waiter_t *waiters;                 /* parked long-poll leases, oldest first */
  results_waiter_t *results_waiters; /* parked long-poll reads of session results */
  shared_upload_t *uploads;          /* streamed uploads in progress (shared_upload.c) */
  reaper_t *reaper;                  /* tasks removed in the background (reaper.c) */
  backup_t *backup;                  /* the backup under way (backup.c), or NULL */
  char (*dirty)[NAME_MAX_LEN + 1];   /* queues that may serve waiters */
  size_t ndirty, dirty_cap;
  int64_t started_ms;
  int64_t last_sweep_ms; /* when the sweep last ran, or the loop began (head_note_stall) */
  bool stopping;
  pid_t agent_pid;        /* the local node agent (head_agent_t), 0 when none or gone */
  struct event *agent_ev; /* reads its exit pipe */
  int signals;            /* stop signals received */
  uint64_t requests;      /* requests handled */
  uint64_t commits;       /* transactions committed */
} head_t;

/* Runs the commit at the end of this turn (head_commit): for a reply that may
 * leave at its commit (a lease of tasks on disk) queued in a turn that did not
 * open the transaction, which a flush in flight keeps open. */
void head_wake_commit(head_t *h);

/* True when a lease whose highest task id is `max_task`, granted in the open
 * transaction, may be answered once committed, without waiting for a WAL
 * flush: every leased task and the token floor above its token are already
 * on disk, so a power loss can only forget the lease itself (its task is then
 * leased again and the holder's token refused, as after an expiry).  False
 * with --sync normal (nothing waits for a flush) and with --sync-leases.
 * A lease reply that also brings broadcast updates must not use it: an
 * update is data, and one posted in a group whose flush has not ended would
 * be applied by a worker and then forgotten by a power loss, its number given
 * to the next update (which that worker would never get).
 * See head_commit.c, "durable replies". */
bool head_lease_on_disk(const head_t *h, int64_t max_task);

#endif
