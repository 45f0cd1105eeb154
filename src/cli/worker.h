/*
 * worker.h — the state `muster worker` shares between its threads.
 *
 * Threads: the main thread (setup, signals, goodbye), one heartbeat thread,
 * and N slot threads that each lease and run one task at a time.  Every thread
 * has its own libmuster handle, since a handle is not thread-safe.  Settings
 * are written before the threads start and only read afterwards; what changes
 * is atomic or guarded by `lock`.
 */
#ifndef MUSTER_CLI_WORKER_H
#define MUSTER_CLI_WORKER_H

#include "cli/cli.h"
#include "cli/run.h"
#include "muster.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define WORKER_POLL_MS 2000    /* long-poll per lease request; bounds the stop delay when idle */
#define WORKER_MAX_REQUIRES 16 /* shared-data levels one task may require (the head's limit) */

typedef struct worker worker_t;

typedef struct {
  worker_t *worker;
  int index;
  pthread_t thread;
  muster_client_t *client;
  _Atomic int64_t task; /* the task being run, 0 when idle (read by the heartbeat) */
  run_proc_t *proc;     /* the running command, under worker->lock; NULL when none */
  int lease_failing;    /* the last lease request failed (log a streak once) */
  /* Monotonic ms until which the slot's lease surely holds: when the request that
   * granted or last extended it was sent, plus the queue's lease time (the head
   * counts from when it got the request, later).  Bounds the retries of a result
   * while the head cannot be reached; the heartbeat thread moves it for plugins. */
  _Atomic int64_t lease_until;
  muster_lease_t *next;        /* leased with the last completion, not yet run (its ticket taken) */
  /* Lease requests (plain or combined) the head answered so far: the key of the
   * next one is INSTANCE-sSLOT-N (worker_update.c), sent unchanged until one is
   * answered, so a retry after a lost reply gets what the lost reply carried. */
  int64_t lease_answered;
  struct json_t *requires;     /* the leased task's "requires" list, or NULL (owned) */
  struct worker_shared **held; /* the levels it holds while its task runs (worker_shared.c) */
  size_t nheld;
  int failed_as; /* what the head made of the task the slot failed last (SLOT_FAILED_*) */
} worker_slot_t;

struct worker {
  /* settings, fixed once the threads start */
  const char *queue;
  const char *url;
  const char *token;
  const char *nickname;
  const char *node;
  /* This process's id for its registrations (a registration sent again finds
   * its worker): its node agent's choice (MUSTER_WORKER_INSTANCE), else
   * random; 32 characters at most (NODE_WORKER_INSTANCE_MAX, src/node). */
  char instance[33];
  char **cmd;        /* NULL-terminated argv of the command */
  int concurrency;
  int json_result;              /* parse stdout as JSON */
  int permanent_exit;           /* --permanent-exit: the command's exit status that fails its
                                 * task for good (1..255, not 127); 0: none */
  int64_t max_tasks;            /* 0: no limit */
  int64_t timeout_ms;           /* heartbeat timeout asked for at registration; -1: the head's */
  long heartbeat_ms;            /* interval of the periodic heartbeat (w->lock) */
  int timeout_unread;           /* the head's timeout for this id is not read yet (w->lock) */
  int64_t head_timeout_ms;      /* the head's timeout for this id, 0 while unread (w->lock) */
  int64_t heard_sent_ms;        /* monotonic ms at which the last request the head took as
                                 * this id's sign of life (its registration, a heartbeat that
                                 * worked) was sent (w->lock) */
  muster_client_t *hb_client;   /* the heartbeat thread's handle */
  pthread_t hb_thread;          /* the heartbeat thread, running when hb_started */
  int hb_started;               /* main thread's: hb_thread runs (worker_heartbeat_start) */
  atomic_int awaiting_queue;    /* registered, waiting for the queue to be created */
  int64_t hb_failing_since;     /* heartbeat thread's: monotonic ms of the first failed beat of
                                 * the streak now, 0 when the last beat worked */
  muster_err_t hb_said;         /* heartbeat thread's: the streak's last error said (or OK) */
  muster_client_t *main_client; /* the main thread's handle (goodbye, hard stop) */
  int agent_fd;                 /* a node agent's report pipe (MUSTER_AGENT_FD), or -1 */

  /* a plugin worker (worker_plugin.c): one slot, every plugin call on its thread */
  const char *plugin_path; /* --plugin, or NULL for a command worker */
  const char *init_data;   /* --init-data JSON text, or NULL */
  void *plugin_lib;        /* dlopen handle */
  const muster_plugin_t *plugin;
  void *plugin_state;                        /* what init returned */
  int plugin_ready;                          /* init succeeded: fini is owed */
  _Atomic int64_t plugin_task, plugin_token; /* the task the plugin runs (0: none), for extending */
  int64_t plugin_extended_ms; /* when the heartbeat thread last extended it (its own) */

  /* updates (worker_update.c), under upd_lock */
  pthread_mutex_t upd_lock;
  int64_t updates_seq;             /* the highest update applied */
  int updates_unsupported;         /* the head refused updates_after: lease without it */
  int requests_unsupported;        /* the head refused a lease request's key: send none */
  atomic_int combined_unsupported; /* the head refused complete-and-lease: complete alone */
  char updates_path[256];          /* command workers: the JSON-lines file, "" when none */
  int updates_fd;                  /* open for appending, or -1 */

  /* shared data tasks require (worker_shared.c), under shared_lock */
  pthread_mutex_t shared_lock;
  const char *cache_url;         /* --cache-url / MUSTER_CACHE_URL: the node cache; NULL: --url */
  muster_client_t *cache_client; /* a handle for it, made on first use */
  struct worker_shared *shared;  /* the levels held as local files */
  char link_dir[700]; /* where levels are linked: in the node cache's links dir ("": none yet) */
  char download_dir[700]; /* where levels are downloaded: under TMPDIR ("": none yet) */

  pthread_mutex_t lock; /* guards id, name, slots[].proc, hb_stop; wakes the heartbeat */
  pthread_cond_t wake;
  pthread_mutex_t reg_lock; /* one re-registration at a time */
  int64_t id;               /* the worker id now (re-registration changes it) */
  char *name;               /* its display name (muster_free) */
  int hb_stop;              /* tells the heartbeat thread to finish */
  int spawning;             /* slots between starting a command and publishing it (lock) */
  int killing;              /* SIGHUP: commands are killed and none may start (lock) */

  atomic_int stopping;      /* take no new tasks */
  atomic_int signals;       /* stop signals received: one during a wait ends the wait */
  atomic_int abandon;       /* second signal: running commands were terminated */
  atomic_int fatal;         /* a slot hit an error retrying cannot fix */
  _Atomic int64_t lease_ms; /* the queue's lease length, refreshed by the heartbeat */
  _Atomic int64_t max_attempts; /* the queue's max_attempts, read with lease_ms; 0: unread */
  _Atomic int64_t tickets;  /* tasks claimed so far, for --max-tasks */
  atomic_long completed, failed;
  atomic_int live_slots;
  worker_slot_t *slots;
};

/* The exit status muster's guard (run_guard.c) ends with when it cannot run
 * or wait for the command, and a shell's for a command it cannot find: not
 * the task's word, so --permanent-exit may not be it. */
#define WORKER_GUARD_EXIT 127
/* --permanent-exit takes 1 to this: 126 and above mean what a shell says of a
 * command it could not run (126, 127) or that a signal killed (128 + n). */
#define PERMANENT_EXIT_MAX 125

/*
 * Reads --permanent-exit of `muster worker` or `muster node` (which checks it
 * before it starts any worker) into *status, 0 when it is not given.  CLI_OK,
 * or the usage error of a value that is not 1 to 255, or is 127.
 */
int worker_read_permanent_exit(cli_args_t *args, int *status);

/* The thread function of a slot (`arg` is its worker_slot_t). */
void *worker_slot_main(void *arg);

/* The current worker id. */
int64_t worker_id(worker_t *w);

/*
 * Registers the worker again after the head answered worker_not_found for
 * `old_id` on `client` (whose message is that answer), saying why the head
 * had no such worker: it timed out, was removed, or was never known there.
 * Only the first caller for a given old id registers; the others find the
 * new id.  Returns MUSTER_OK or the registration's error.
 */
muster_err_t worker_reregister(worker_t *w, muster_client_t *client, int64_t old_id);

/* A worker told to stop before it joined: nothing to do, no error (worker_join). */
#define WORKER_STOPPED (-1)

/*
 * Joins: registers the worker (waiting for a head that is not up yet), makes
 * its handles, starts the heartbeat and, under a node agent, waits for its
 * queue to be created (worker_join.c).  CLI_OK; WORKER_STOPPED when a stop
 * signal came while it waited; CLI_FAIL after saying why.  The heartbeat may
 * run on any return (worker_heartbeat_stop), and w->id is the registration's
 * when it is above 0 (the caller says goodbye).
 */
int worker_join(worker_t *w, muster_client_t *client);

/* Starts the heartbeat thread (cmd_worker.c); 0, or -1 when it could not be. */
int worker_heartbeat_start(worker_t *w);
/* Stops the heartbeat thread and waits for it; nothing when it does not run. */
void worker_heartbeat_stop(worker_t *w);
/* Re-reads the queue's lease length into w->lease_ms, and its max_attempts
 * into w->max_attempts (either may have been reconfigured); a failed read
 * leaves them. */
void worker_refresh_lease_ms(worker_t *w, muster_client_t *client);
/* For a head that did not answer the timeout at registration (an older one):
 * reads it and sets the beat interval (worker_join.c). */
void worker_read_timeout(worker_t *w, muster_client_t *client);

/* Milliseconds of a monotonic clock. */
int64_t worker_now_ms(void);

/* Sleeps up to `ms`, returning early once the worker is stopping. */
void worker_nap(worker_t *w, long ms);

/* ---- worker_slot.c: reporting (used by plugin runs too) ---- */

/* Fails the task with `error` (permanently when `permanent`), counted and logged. */
void worker_slot_fail(worker_slot_t *slot, const muster_lease_t *lease, const char *error,
                      int permanent);
/* Completes the task with JSON text `result` (NULL: null); a refused result fails it. */
void worker_slot_complete(worker_slot_t *slot, const muster_lease_t *lease, const char *result);

/* ---- worker_update.c: leases with updates ---- */

/* Creates the updates file of a command worker and exports MUSTER_UPDATES_FILE
 * (call before the threads start); 0 or -1 after printing why. */
int worker_updates_open(worker_t *w);
/* Closes and removes the updates file. */
void worker_updates_close(worker_t *w);
/* The highest update applied so far. */
int64_t worker_updates_seq(worker_t *w);
/*
 * Leases up to one task like muster_lease(), asking for the updates the worker
 * has not seen and applying them, in order, before returning (plugins:
 * handle_update; commands: appended to the updates file).
 */
muster_err_t worker_lease(worker_slot_t *slot, int64_t wait_ms, muster_lease_t **leases,
                          size_t *count);
/*
 * Completes `ack` and leases up to one next task in the same request
 * (POST /v1/leases/complete with a "lease" object), with the updates the
 * worker has not seen applied like worker_lease's.  The request is all or
 * nothing: on an error nothing was completed or leased (unless the reply was
 * lost on the way).  MUSTER_INVALID also when the ack's result is not JSON
 * text (nothing is sent then).
 */
muster_err_t worker_complete_lease(worker_slot_t *slot, const muster_ack_t *ack,
                                   muster_lease_t **leases, size_t *count);

/* ---- worker_plugin.c ---- */

/*
 * Loads the plugin at `path` as a worker does: dlopen (every symbol bound
 * now), its muster_plugin() entry point, an ABI this runner knows, and init
 * and run.  Returns the dlopen handle (the caller dlcloses it) with *plugin
 * set, or NULL with *plugin NULL and `why` filled with a line that names the
 * path ("cannot load plugin PATH: ...", "plugin PATH: ...").  Runs the
 * plugin's constructors and its muster_plugin() in the calling process.
 */
void *worker_plugin_open(const char *path, const muster_plugin_t **plugin, char *why, size_t size);
/*
 * Loads the plugin at `path` as worker_plugin_open does, in a child process
 * and within a time limit (30 s, MUSTER_PLUGIN_CHECK_TIMEOUT_MS), for a start
 * that refuses a plugin no worker could load (plugin_check.c).  0, or -1 with
 * `why` filled with a line naming the plugin.  `prog` ("muster node") starts
 * the warning about a bad MUSTER_PLUGIN_CHECK_TIMEOUT_MS.
 */
int worker_plugin_check(const char *prog, const char *path, char *why, size_t size);
/* Loads --plugin and checks its ABI; 0 or -1 after printing why. */
int worker_plugin_load(worker_t *w);
/* Calls the plugin's init (on the slot thread); 0 or -1 after printing why. */
int worker_plugin_init(worker_t *w);
/* Runs one leased task through the plugin and reports the outcome. */
void worker_plugin_run(worker_slot_t *slot, const muster_lease_t *lease);
/* Hands one update to the plugin. */
void worker_plugin_update(worker_t *w, int64_t seq, const char *data, const char *session);
/* Calls fini and unloads the plugin (accepts a worker without one). */
void worker_plugin_unload(worker_t *w);
/* The heartbeat thread's part: extends the plugin's lease when due. */
void worker_plugin_keep_lease(worker_t *w, muster_client_t *client);

/* ---- worker_shared.c: shared data a task requires ---- */

/*
 * Makes each level of slot->requires a local file (through the node cache,
 * once per worker and level) and holds it for the slot's task.  Returns 0, or
 * -1 with the reason in `why` (nothing held then).
 */
int worker_shared_acquire(worker_slot_t *slot, char *why, size_t size);
/* Lets go of what the slot's task held (the files stay for later tasks). */
void worker_shared_release(worker_slot_t *slot);
/* The command's variables for the held levels: MUSTER_SHARED_<NAME>=PATH and
 * MUSTER_REQUIRES=JSON, NULL-terminated (worker_shared_env_free); NULL: no memory. */
char **worker_shared_env(worker_slot_t *slot);
void worker_shared_env_free(char **vars);
/* Fills out[0 .. slot->nheld) for a plugin (valid while the task runs). */
void worker_shared_plugin(worker_slot_t *slot, muster_plugin_shared_t *out);
/* Lets go of the kept levels no task uses whose node-cache file is gone (the
 * cache evicted it, or the head said it expired or was deleted), so that its
 * disk is given back rather than held by the worker's link until it exits.
 * Skipped while a level is being fetched (never waits for shared_lock). */
void worker_shared_prune(worker_t *w);
/* Removes the worker's files of shared data (also from the SIGHUP path). */
void worker_shared_cleanup(worker_t *w);
/* Cleans up and frees the shared-data state. */
void worker_shared_free(worker_t *w);

#endif
