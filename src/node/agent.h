/*
 * agent.h — the node agent's shared state, private to src/node.
 *
 * The main thread owns the event loop, the worker processes and the
 * forwarder; the background thread (agent.c) owns `bg_client` and talks to
 * the head for the agent itself (heartbeats, crash reports).  They share only
 * the fields under `lock`.
 */
#ifndef MUSTER_NODE_AGENT_H
#define MUSTER_NODE_AGENT_H

#include "muster.h"
#include "node/node.h"
#include "server/accept_log.h"
#include "server/h1.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct node_agent node_agent_t;
struct evbuffer;
struct evhttp_connection;
struct evkeyvalq;
struct json_t;

/* A worker process's output pipe, read and tagged by the agent (worker_log.c). */
typedef struct wlog wlog_t;

/* The instance the agent gives each worker process it starts, which the
 * worker registers with (MUSTER_WORKER_INSTANCE): "AGENT-SLOT-START", the
 * agent's own instance (16 hex digits), the worker's slot from 1 (at most
 * NODE_MAX_WORKERS) and the slot's start count, 32 characters at most, as
 * `muster worker` takes (src/cli/worker.h). */
#define NODE_WORKER_INSTANCE_MAX 33

/* A worker's crash, waiting for the head to hear of it (crash_report.c). */
typedef struct {
  /* The worker's id, 0 when it died before it told the agent: then the
   * report names the instance it registers with. */
  int64_t worker_id;
  char instance[NODE_WORKER_INSTANCE_MAX];
  int64_t gone_id; /* the worker id the head had ended already, after which the report
                    * went on by instance (a worker registered anew), or 0 */
  int slot, pid;   /* which of the agent's workers it was, for the log */
  int64_t died_ms; /* monotonic time the agent saw it die */
  int tries;       /* times it was sent */
} crash_report_t;

#define CRASH_QUEUE_MAX 256 /* crash reports kept for the head, at most */

/* The crash reports not yet answered by the head, in the order the workers
 * died: a ring under the agent's lock. */
typedef struct {
  crash_report_t items[CRASH_QUEUE_MAX];
  size_t capacity;     /* reports kept at most: CRASH_QUEUE_MAX (less for a test) */
  size_t first, count; /* the oldest's place, and how many */
  /* The reports pushed out of a full queue since it was last empty, said
   * once it empties or at the stop: how many, and the first and last. */
  size_t dropped;
  crash_report_t first_dropped, last_dropped;
  /* The background thread's, under the lock too: */
  bool held;    /* the head did not answer the front one: wait for the thread's
                 * next call to the head (crash_retry) */
  bool failing; /* a report failed since the queue was last empty: each
                 * delivery is logged */
} crash_queue_t;

/* One supervised worker process (a `muster worker` run by the agent). */
typedef struct node_worker {
  node_agent_t *agent;
  int slot;              /* 0-based position among the agent's workers */
  const node_gpu_t *gpu; /* the GPU or MIG instance it owns (the agent's), NULL: a CPU worker */
  pid_t pid;             /* 0 while not running */
  int report_fd;         /* read end of the pipe the worker reports its id on, or -1 */
  struct event *report_ev;
  struct event *restart_ev;
  char report[64]; /* a partial "worker ID" line */
  size_t report_len;
  int64_t worker_id;  /* the id it registered with, 0 before it said */
  char instance[NODE_WORKER_INSTANCE_MAX]; /* the current process's instance */
  unsigned starts;                         /* processes started in this slot so far */
  int64_t started_ms; /* monotonic start time of the current process */
  int quick_deaths;   /* deaths in a row within NODE_STABLE_MS of the start */
  int signalled;      /* we sent it a stop signal: its death is no crash */
  wlog_t *log;        /* the current process's stdout and stderr, NULL when none */
} node_worker_t;

struct node_agent {
  const node_config_t *cfg;
  char name[129]; /* node name */
  char hostname[256];
  char instance[17];     /* this process's random id, sent when registering (docs/api.md) */
  char previous[129];    /* the dead agent that held the lock before (lock.c), sent as
                          * previous_instance until registered; "" none (bg thread's
                          * once it runs) */
  const char *lock_path; /* the lock file's path */
  char address[300];     /* host:port clients may use (the forwarder's), the head's
                          * (beside `muster head`), or "" (--listen none) */
  char self_exe[4096];   /* /proc/self/exe, resolved at start */
  int lock_fd;
  int cpus;
  node_gpus_t gpus;
  struct event_base *base;

  /* workers */
  node_worker_t *workers;
  int nworkers;
  int stopping;           /* 0 running; 1 graceful stop; 2 hard stop */
  char **worker_argv;     /* argv of every worker process (owned) */
  char **worker_env;      /* environment template; the per-worker variables come last (owned) */
  size_t worker_env_base; /* entries before the per-worker ones */
  wlog_t *wlogs;          /* every worker output pipe still open (worker_log.c) */

  /* the API port (port.c) */
  h1_server_t *port;           /* NULL without one (--listen none) */
  int listen_port;             /* the port bound, 0 when none */
  int port_draining;           /* 0 serving; 1 the agent stops: every request is answered 503 while
                                * the loop runs on until those answers are written (port_drain);
                                * 2 done: the loop was told to end */
  int port_stop_replies;       /* 503s of the stop not written yet */
  struct event *port_drain_ev; /* the bound on the drain (PORT_DRAIN_MS) */
  accept_log_t port_accept_log; /* what the port said of failed accepts */

  /* forwarder (forward.c, upstream.c, forward_pool.c) */
  char head_host[256];
  int head_port;
  void *up_pool;  /* the forwarder's idle connections to the head (upstream.c) */
  void *up_busy;  /* the forwarder's connections with a request in flight */
  void *fwd_pool; /* idle evhttp connections of the agent's own questions (forward_pool.c) */
  void *fwd_busy; /* those with a question in flight, or discarded (freed soon) */

  /* node cache (cache.c, cache_http.c); NULL without an API port */
  struct cache *cache;

  /* node-local iterations (iter_local.c); NULL without an API port */
  struct iter_local *iters;

  /* background thread (agent.c) */
  pthread_t bg;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int bg_stop;
  int refused;      /* the head refused our token (401/403): stop and exit 1 (under lock) */
  crash_queue_t crashes; /* the crash reports for the head (under lock) */
};

/* Milliseconds of a monotonic clock. */
int64_t agent_now_ms(void);
/* Prints "PREFIX: message" on stderr. */
void agent_log(const node_agent_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- crash_report.c: the crash reports waiting for the head ---- */

/* Sets the queue's capacity, before any worker runs: CRASH_QUEUE_MAX, or
 * for tests only a smaller MUSTER_TEST_CRASH_QUEUE_MAX. */
void crash_queue_init(node_agent_t *a);
/* Queues the crash report of worker process `w`, which just died: by its
 * worker id, or by its instance when it died before it told its id (any
 * thread; lock not held). */
void crash_report_queue(node_agent_t *a, const node_worker_t *w);
/* Whether a crash report is to be sent now (lock held). */
bool crash_pending(const node_agent_t *a);
/* Sends the queued reports in order until one gets no answer from the head,
 * which holds the queue until crash_retry (background thread, lock held; it
 * is let go during each request). */
void crash_send(node_agent_t *a, muster_client_t *client);
/* The background thread called the head again: a held queue may be sent
 * (lock held). */
void crash_retry(node_agent_t *a);
/* The agent stops: one last try of every queued report; those the head does
 * not answer are dropped with a line (background thread, lock held). */
void crash_send_last(node_agent_t *a, muster_client_t *client);

/* ---- plan.c ---- */

/* Detects and filters the GPUs and makes a->workers, one per GPU kept or the
 * CPU workers (each line of why logged); 0, -2 for a bad GPU list (--gpus or
 * CUDA_VISIBLE_DEVICES: exit status 2), or -1 out of memory. */
int plan_workers(node_agent_t *a);

/* ---- supervisor.c ---- */

/* Prepares and starts the workers the configuration asks for; 0 or -1. */
int sup_start(node_agent_t *a);
/* Reaps exited workers and schedules restarts (SIGCHLD). */
void sup_reap(node_agent_t *a);
/* Sends `sig` to every running worker and marks it as stopped by us. */
void sup_signal_all(node_agent_t *a, int sig);
/* Workers still running. */
int sup_running(const node_agent_t *a);
/* Frees the supervisor's state (the processes must be gone). */
void sup_free(node_agent_t *a);

/* ---- worker_leftovers.c ---- */

/*
 * Kills every process left in the session of dead, unreaped worker process
 * `worker_pid` (SIGKILL to each process group).  Returns how many of them
 * outlived it: not counting the processes its commands' guards end
 * themselves (a live guard's group, the guards) nor those dying already.
 */
int wleft_kill(const node_agent_t *a, pid_t worker_pid);

/* ---- worker_log.c: each line a worker writes, tagged with the worker ---- */

/* Makes the output pipe of worker `w`'s next process: 0 with the write end
 * (close-on-exec) in *write_fd, for the child's stdout and stderr; -1 (errno). */
int wlog_open(node_worker_t *w, int *write_fd);
/* The process started (w->pid set): its lines are tagged with it from now. */
void wlog_started(node_worker_t *w);
/* The process ended: writes what it left in the pipe, now, before the line
 * saying so; the pipe is read on while something it started holds it. */
void wlog_ended(node_worker_t *w);
/* The agent stops: writes what the pipes hold and frees them. */
void wlog_free_all(node_agent_t *a);

/* ---- port.c: the API port (src/server/h1.h's server) ---- */

/* Binds `listen` ("HOST:PORT") and serves the API there: the node cache, the
 * node-local iterations, and the head's by forwarding.  Returns the bound
 * port, or -1 with `err` filled. */
int port_start(node_agent_t *a, const char *listen, char *err, size_t err_size);
/* The body of client request `q`, read whole before it was routed (NULL:
 * none, or streamed to the head as it came); the port's, freed with `q` (the
 * forwarder moves its bytes out). */
struct evbuffer *port_body(h1_req_t *q);
/* `fn(arg)` once when `q` is freed (its reply written, or its client gone):
 * for what must last as long as a reply (a cached file's reader).  One per
 * request. */
void port_on_free(h1_req_t *q, void (*fn)(void *arg), void *arg);
/* True when `q` carries the agent's own token (the head's admin token);
 * false for every request when the agent has none: what the agent serves
 * itself (its cache's statistics aside) takes that token alone, anything
 * else is the head's to judge.
 * Compared in constant time (core/auth.h). */
bool port_token_is_agents(const node_agent_t *a, const h1_req_t *q);
/* Answers `q` with `body` (taken; NULL: none) as JSON, written as the head
 * writes its replies (server/jw.h); a 401 gets WWW-Authenticate. */
void port_reply_json(h1_req_t *q, int status, struct json_t *body);
/* Answers `q` with the error envelope {"error": {"code", "message"}}. */
void port_reply_error(h1_req_t *q, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Answers `q` 503 `unavailable` ("node agent NAME is stopping") with
 * `Retry-After` and `Connection: close`: what every client whose request is
 * in flight, or comes, while the agent stops gets (docs/node.md).  While the
 * agent drains, the loop runs on until the answer is written. */
void port_reply_stopping(node_agent_t *a, h1_req_t *q);
/* The agent stops and its workers are gone: from now on every request is
 * answered with port_reply_stopping, those in flight to the head are
 * cancelled (their owners told: they answer their clients so), and the loop
 * is ended once those answers are written, or after PORT_DRAIN_MS at most.
 * Without an API port it ends the loop at once.  A second call does
 * nothing. */
void port_drain(node_agent_t *a);
/* Closes the port and frees the forwarder, after the loop ended: the
 * requests still in flight to the head (none after port_drain) are
 * cancelled (their owners told first), their clients answered 503 or
 * closed. */
void port_stop(node_agent_t *a);

/* ---- forward.c: requests to the head ---- */

/* Reads the head's host and port from the configuration; 0, or -1 with `err`. */
int fwd_start(node_agent_t *a, char *err, size_t err_size);
/* The request target of `q` as the client sent it, path and query
 * (malloc'ed; NULL when out of memory). */
char *fwd_target(h1_req_t *q);
/* Forwards client request `q` (complete, its body in port_body) to the head
 * and streams the reply back (while the agent stops: answers it as
 * port_reply_stopping does). */
void fwd_forward(node_agent_t *a, h1_req_t *q);
/* Forwards client request `q`, dispatched before its body (`length` bytes,
 * -1: chunked), to the head: its head at once, its body as it arrives, with
 * backpressure both ways; a client waiting for "100 Continue" gets the
 * head's answer to it.  Holds `q` until the reply ends. */
void fwd_forward_stream(node_agent_t *a, h1_req_t *q, int64_t length);
/* Tells the owner of every request in flight to the head that the agent
 * stops (they answer their clients) and closes its connection.  The agent's
 * own questions (forward_pool.c) are cancelled too. */
void fwd_cancel_all(node_agent_t *a);
/* Frees the connections to the head, after the loop ended. */
void fwd_free(node_agent_t *a);

/* ---- forward_pool.c: evhttp connections for the agent's own questions ---- */

/* A keep-alive connection to the head from the pool. */
typedef struct fwd_conn fwd_conn_t;
/* Borrows an idle connection or makes one; NULL when out of memory. */
fwd_conn_t *fwd_conn_get(node_agent_t *a);
/* Called by fwd_pool_cancel_all for a question still in flight when the
 * agent stops: answers its client (port_reply_stopping) or closes it, and
 * frees `owner`, leaving the connection (and the request on it, whose
 * callbacks are never called) to the pool, which frees it at once. */
typedef void (*fwd_cancel_fn)(void *owner);
/* Names who to tell, should the agent stop before `c`'s request ends. */
void fwd_conn_set_owner(fwd_conn_t *c, fwd_cancel_fn cancel, void *owner);
/* Adds the head's own Host ("host:port", IPv6 in brackets) to a request to
 * it: HTTP/1.1 requires one (the head refuses a request without it), and a
 * client's Host named the agent. */
void fwd_add_host(const node_agent_t *a, struct evkeyvalq *to);
/* The same "host:port" in `buf`. */
void fwd_host(const node_agent_t *a, char *buf, size_t size);
/* Returns a connection to the pool once its request is done. */
void fwd_conn_put(node_agent_t *a, fwd_conn_t *c);
struct evhttp_connection *fwd_conn_evcon(fwd_conn_t *c);
/* Closes a connection whose byte stream is not to be trusted any more (soon,
 * outside its callbacks) instead of returning it to the pool. */
void fwd_conn_discard(node_agent_t *a, fwd_conn_t *c);
/* The stop: every question in flight is cancelled (its owner told). */
void fwd_pool_cancel_all(node_agent_t *a);
/* Frees the pool's connections, after the loop ended. */
void fwd_pool_free(node_agent_t *a);

/* ---- home_dir.c: the default home of the cache and state ---- */

/* When --cache-dir or --state-dir is not given: makes the agent's default
 * home, /var/tmp/muster-node-NAME, and checks that no other user could
 * replace what the agent keeps in it (a directory, this user's or root's,
 * writable by no one else).  0, or -1 after logging why. */
int home_dir_check(node_agent_t *a);

/* ---- cache_http.c: the node cache (docs/api.md "Node cache") ---- */

/* Opens the cache (a->cache) from the configuration; 0, or -1 after logging. */
int cache_http_start(node_agent_t *a);
/* Serves `in` when it is the cache's (GET /v1/shared/..., /v1/node/cache...):
 * returns 1 when it took the request, 0 when it is to be forwarded. */
int cache_http_handle(node_agent_t *a, h1_req_t *in);
/* True when `in`, by its method and path, may be the cache's (the port reads
 * such a body whole before cache_http_handle; any other streams on). */
bool cache_http_serves(const node_agent_t *a, const h1_req_t *in);
/* The agent stops: answers the waiting clients, cancels the fetches and
 * stops the expiry timer.  Called before port_drain, while the loop runs (so
 * that the answers are written), and again at the end, before port_stop
 * (the clients' requests must still exist), where it does nothing more. */
void cache_http_stop(node_agent_t *a);
/* After port_stop: frees the cache. */
void cache_http_free(node_agent_t *a);

#endif /* MUSTER_NODE_AGENT_H */
