/*
 * cmd_worker.c — `muster worker`: registration, the heartbeat thread, signal
 * handling and the goodbye.  The per-task work lives in worker_slot.c.
 *
 * SIGINT and SIGTERM are blocked in every thread and taken by the main thread
 * with sigtimedwait(), so no code runs in a signal handler.  The first signal
 * stops the slots from leasing (an idle slot notices within one long-poll,
 * WORKER_POLL_MS) and lets running commands finish; a second one terminates
 * the running commands, whose tasks are then released rather than failed.
 *
 * The heartbeat thread beats every third of the worker's timeout and, at most
 * once a second, whenever the progress string changes ("running task 12"), so
 * the dashboard follows the worker closely without a request per task.
 */
#include "cli/cli.h"
#include "cli/worker.h"
#include "core/deadline.h"
#include "core/names.h"
#include "core/url.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define WORKER_PROGRESS_TICK_MS 1000L

int64_t worker_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void worker_nap(worker_t *w, long ms) {
  int64_t until = worker_now_ms() + ms;
  while (!atomic_load(&w->stopping) && worker_now_ms() < until) {
    struct timespec step = {0, 20 * 1000000L};
    nanosleep(&step, NULL);
  }
}

int64_t worker_id(worker_t *w) {
  pthread_mutex_lock(&w->lock);
  int64_t id = w->id;
  pthread_mutex_unlock(&w->lock);
  return id;
}

/* ---- heartbeat -------------------------------------------------------------- */

/* "idle", "running task 12", "running tasks 12, 15", or "waiting for queue Q to
 * be created" while the worker waits for it (w->lock held). */
static void worker_progress(worker_t *w, char *buf, size_t size) {
  char tasks[200];
  size_t at = 0;
  int running = 0;
  tasks[0] = '\0';
  for (int i = 0; i < w->concurrency; i++) {
    int64_t task = atomic_load(&w->slots[i].task);
    if (task == 0 || at + 24 >= sizeof tasks)
      continue;
    at += (size_t)snprintf(tasks + at, sizeof tasks - at, "%s%lld", running ? ", " : "",
                           (long long)task);
    running++;
  }
  if (running == 0 && atomic_load(&w->awaiting_queue))
    snprintf(buf, size, "waiting for queue %s to be created", w->queue);
  else if (running == 0)
    snprintf(buf, size, "idle");
  else
    snprintf(buf, size, "running task%s %s", running > 1 ? "s" : "", tasks);
}

void worker_refresh_lease_ms(worker_t *w, muster_client_t *client) {
  char *json = NULL;
  if (muster_queue_get(client, w->queue, &json) != MUSTER_OK)
    return;
  json_t *queue = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_int_t lease_ms = json_integer_value(json_object_get(queue, "lease_ms"));
  json_int_t max_attempts = json_integer_value(json_object_get(queue, "max_attempts"));
  if (lease_ms > 0)
    atomic_store(&w->lease_ms, (int64_t)lease_ms);
  if (max_attempts > 0)
    atomic_store(&w->max_attempts, (int64_t)max_attempts);
  json_decref(queue);
  muster_free(json);
}

/*
 * One heartbeat with `progress`; re-registers if the head forgot us.  In a
 * streak of failed beats (the head away or restarting) an error is said when
 * it differs from the last one said, so a long outage adds no line per beat;
 * the first beat that works after the streak says so once, with the time
 * since its first failure, as the agent and the slots say it for theirs.
 */
static void worker_beat(worker_t *w, const char *progress) {
  muster_client_t *client = w->hb_client;
  int64_t id = worker_id(w), sent = worker_now_ms();
  muster_err_t err = muster_worker_heartbeat(client, id, progress);
  if (err == MUSTER_WORKER_NOT_FOUND && (err = worker_reregister(w, client, id)) == MUSTER_OK) {
    id = worker_id(w);
    sent = worker_now_ms();
    err = muster_worker_heartbeat(client, id, progress);
  }
  int64_t now = worker_now_ms();
  if (err == MUSTER_OK) {
    pthread_mutex_lock(&w->lock);
    if (w->id == id) /* not registered anew meanwhile */
      w->heard_sent_ms = sent;
    pthread_mutex_unlock(&w->lock);
    if (w->hb_failing_since > 0)
      fprintf(stderr, "muster worker: heartbeat: reached the head again after %.1f s\n",
              (double)(now - w->hb_failing_since) / 1000);
    w->hb_failing_since = 0;
    w->hb_said = MUSTER_OK;
    return;
  }
  if (w->hb_failing_since == 0)
    w->hb_failing_since = now > 0 ? now : 1; /* 0 would mean no streak */
  if (err != w->hb_said)
    fprintf(stderr, "muster worker: heartbeat: %s: %s (retrying)\n", muster_err_name(err),
            muster_client_message(client));
  w->hb_said = err;
}

/* How long the heartbeat thread waits between two looks (w->lock held). */
static long worker_tick_ms(const worker_t *w) {
  return w->heartbeat_ms < WORKER_PROGRESS_TICK_MS ? w->heartbeat_ms : WORKER_PROGRESS_TICK_MS;
}

static void *worker_heartbeat_main(void *arg) {
  worker_t *w = arg;
  char last[256] = "", progress[256];
  int64_t last_sent = worker_now_ms();
  pthread_mutex_lock(&w->lock);
  while (!w->hb_stop) {
    long tick = worker_tick_ms(w);
    if (w->plugin) { /* a plugin's lease is extended from here, at half the lease time */
      long quarter = (long)(atomic_load(&w->lease_ms) / 4);
      tick = quarter > 10 && quarter < tick ? quarter : tick;
      pthread_mutex_unlock(&w->lock);
      worker_plugin_keep_lease(w, w->hb_client);
      pthread_mutex_lock(&w->lock);
      if (w->hb_stop)
        break;
    }
    pthread_mutex_unlock(&w->lock);
    worker_shared_prune(w); /* kept levels its node cache let go of: their disk goes too */
    pthread_mutex_lock(&w->lock);
    if (w->hb_stop)
      break;
    struct timespec until = deadline_in_ms(tick);
    pthread_cond_timedwait(&w->wake, &w->lock, &until);
    if (w->hb_stop)
      break;
    worker_progress(w, progress, sizeof progress);
    int64_t now = worker_now_ms();
    int due = now - last_sent >= w->heartbeat_ms;
    if (!due && strcmp(progress, last) == 0)
      continue;
    pthread_mutex_unlock(&w->lock);
    worker_beat(w, progress);
    if (due)
      worker_refresh_lease_ms(w, w->hb_client);
    worker_read_timeout(w, w->hb_client);
    pthread_mutex_lock(&w->lock);
    snprintf(last, sizeof last, "%s", progress);
    last_sent = now;
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

int worker_heartbeat_start(worker_t *w) {
  w->hb_started = pthread_create(&w->hb_thread, NULL, worker_heartbeat_main, w) == 0;
  return w->hb_started ? 0 : -1;
}

void worker_heartbeat_stop(worker_t *w) {
  if (!w->hb_started)
    return;
  pthread_mutex_lock(&w->lock);
  w->hb_stop = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->hb_thread, NULL);
  w->hb_started = 0;
}

/* ---- setup ---------------------------------------------------------------------- */

/* Takes the node agent's report pipe from MUSTER_AGENT_FD, keeping it from
 * the commands (close-on-exec, and out of their environment). */
static void worker_take_agent_fd(worker_t *w) {
  const char *text = getenv("MUSTER_AGENT_FD");
  char *end = NULL;
  long fd = text ? strtol(text, &end, 10) : -1;
  w->agent_fd = -1;
  if (text && end && *end == '\0' && fd > 2 && fcntl((int)fd, F_SETFD, FD_CLOEXEC) == 0)
    w->agent_fd = (int)fd;
  unsetenv("MUSTER_AGENT_FD");
  /* Under an agent stdout is a pipe it reads line by line (docs/node.md): a
   * plugin's printf goes out at each newline rather than when a buffer fills. */
  if (w->agent_fd >= 0)
    setvbuf(stdout, NULL, _IOLBF, 0);
}

/* A random id for this process's registrations (a clock-and-pid one if the
 * kernel has no randomness to give: it only has to differ from others'). */
static void worker_make_instance(worker_t *w) {
  unsigned char rnd[(sizeof w->instance - 1) / 2];
  if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(w->instance, sizeof w->instance, "%lx-%lx-%x", (unsigned long)now.tv_sec,
             (unsigned long)now.tv_nsec, (unsigned)getpid());
    return;
  }
  for (size_t i = 0; i < sizeof rnd; i++)
    snprintf(w->instance + 2 * i, 3, "%02x", rnd[i]);
}

/*
 * The id this process registers with: the one its node agent chose
 * (MUSTER_WORKER_INSTANCE), so that the agent can name the worker to the
 * head should it die before it told the agent its worker id (docs/node.md),
 * else a random one (a worker started by hand).  The variable is taken out
 * of the commands' environment, as the report pipe is.  CLI_OK, or the usage
 * error of a value that cannot be an instance.
 */
static int worker_take_instance(cli_args_t *args, worker_t *w) {
  const char *given = getenv("MUSTER_WORKER_INSTANCE");
  if (given == NULL || given[0] == '\0') {
    worker_make_instance(w);
  } else if (strlen(given) < sizeof w->instance && name_is_valid(given)) {
    snprintf(w->instance, sizeof w->instance, "%s", given);
  } else {
    return cli_usage_error(args->cmd,
                           "MUSTER_WORKER_INSTANCE '%.140s': use 1 to %zu characters of letters, "
                           "digits, '.', '_' and '-', other than '.' and '..' (a node agent sets "
                           "it for the workers it starts; unset, a worker makes a random one)",
                           given, sizeof w->instance - 1);
  }
  unsetenv("MUSTER_WORKER_INSTANCE");
  return CLI_OK;
}

int worker_read_permanent_exit(cli_args_t *args, int *status) {
  int64_t value = 0;
  int rc = cli_opt_int_range(args, "permanent-exit", 0, 1, 255, &value);
  if (rc == CLI_OK && value >= PERMANENT_EXIT_MAX + 1)
    rc = cli_usage_error(args->cmd,
                         "--permanent-exit: %lld is not a status a command chooses: a shell "
                         "exits 126 or 127 for a command it cannot run or find (the worker's "
                         "guard exits %d so too), and 128 + n for one killed by signal n (an "
                         "out-of-memory kill would fail its task for good); choose one from 1 "
                         "to %d",
                         (long long)value, WORKER_GUARD_EXIT, PERMANENT_EXIT_MAX);
  *status = rc == CLI_OK ? (int)value : 0;
  return rc;
}

/*
 * Tells the commands the permanent-failure status in MUSTER_PERMANENT_EXIT
 * (call before the threads start, as setenv is not thread-safe), so that a
 * program such as muster.worker can exit with it; without --permanent-exit
 * the variable is taken out, since an inherited one (the worker started from
 * another's command) is not this worker's and its status would be retried.
 */
static void worker_export_permanent_exit(const worker_t *w) {
  char text[16];
  snprintf(text, sizeof text, "%d", w->permanent_exit);
  if (w->permanent_exit > 0)
    setenv("MUSTER_PERMANENT_EXIT", text, 1);
  else
    unsetenv("MUSTER_PERMANENT_EXIT");
}

/* Reads --concurrency, --max-tasks, --timeout-ms and --permanent-exit;
 * CLI_OK, or the usage error of the first that is refused. */
static int worker_read_limits(cli_args_t *args, worker_t *w) {
  int64_t concurrency = 1;
  int rc = cli_opt_int(args, "concurrency", 1, 1, &concurrency);
  if (rc == CLI_OK && concurrency > CLI_MAX_CONCURRENCY)
    rc = cli_usage_error(args->cmd, "--concurrency: at most %d", CLI_MAX_CONCURRENCY);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max-tasks", 0, 0, &w->max_tasks);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "timeout-ms", -1, 1, &w->timeout_ms);
  if (rc == CLI_OK)
    rc = worker_read_permanent_exit(args, &w->permanent_exit);
  w->concurrency = (int)concurrency;
  return rc;
}

/* Reads the options that need no check here: names, the head, the command or
 * plugin, and the node cache's URL (--cache-url, else MUSTER_CACHE_URL). */
static void worker_read_options(cli_args_t *args, worker_t *w) {
  w->nickname = cli_opt(args, "nickname");
  w->node = cli_opt(args, "node");
  w->json_result = cli_flag(args, "json-result");
  w->cmd = args->pos; /* NULL-terminated: main() allocates one spare, zeroed entry */
  w->url = cli_url(args);
  w->token = cli_token(args);
  w->plugin_path = cli_opt(args, "plugin");
  w->init_data = cli_opt(args, "init-data");
  w->cache_url =
      cli_opt(args, "cache-url") ? cli_opt(args, "cache-url") : getenv("MUSTER_CACHE_URL");
  if (w->cache_url && w->cache_url[0] == '\0')
    w->cache_url = NULL;
}

/* Checks that the worker has one way to run its tasks (a command it can find,
 * or a plugin without --concurrency) and that --init-data is JSON text;
 * CLI_OK, or CLI_USAGE after saying what is wrong. */
static int worker_check_runner(cli_args_t *args, worker_t *w) {
  if (args->npos == 0 && w->plugin_path == NULL)
    return cli_usage_error(args->cmd, "'worker' needs a command after -- or --plugin PATH");
  if (args->npos > 0 && w->plugin_path != NULL)
    return cli_usage_error(args->cmd, "give either a command or --plugin, not both");
  if (w->plugin_path != NULL && w->concurrency > 1)
    return cli_usage_error(args->cmd, "a plugin worker runs one task at a time (no --concurrency)");
  if (w->plugin_path != NULL && w->permanent_exit > 0)
    return cli_usage_error(args->cmd, "--permanent-exit is for a command's exit status; a plugin "
                                      "fails a task for good with out->permanent");
  char why[800];
  if (w->plugin_path == NULL && run_resolve(w->cmd[0], why, sizeof why) != 0) {
    /* Checked before joining: a worker that cannot run its command would fail
     * every task it leased and so turn the whole queue dead. */
    fprintf(stderr, "muster worker: %s; nothing was leased\n", why);
    return CLI_USAGE;
  }
  int rc = CLI_OK;
  if (w->init_data != NULL) {
    json_t *value = cli_json_parse(w->init_data, strlen(w->init_data), why, sizeof why);
    if (value == NULL)
      rc = cli_usage_error(args->cmd, "--init-data: not valid JSON: %s", why);
    json_decref(value);
  }
  return rc;
}

/* Reads the options into the worker's settings. */
static int worker_configure(cli_args_t *args, worker_t *w) {
  w->queue = cli_opt(args, "queue");
  if (w->queue == NULL)
    return cli_usage_error(args->cmd, "'worker' needs --queue Q");
  int rc = worker_take_instance(args, w);
  if (rc == CLI_OK)
    rc = worker_read_limits(args, w);
  worker_read_options(args, w);
  const char *problem = w->cache_url ? url_head_problem(w->cache_url) : NULL;
  if (rc == CLI_OK && problem != NULL)
    rc = cli_usage_error(args->cmd, "%s '%s': %s",
                         cli_opt(args, "cache-url") ? "--cache-url" : "MUSTER_CACHE_URL",
                         w->cache_url, problem);
  if (rc == CLI_OK)
    rc = worker_check_runner(args, w);
  if (rc == CLI_OK)
    worker_export_permanent_exit(w);
  worker_take_agent_fd(w);
  return rc;
}

/* ---- running ---------------------------------------------------------------------- */

/*
 * SIGHUP: the node agent that started us died (PR_SET_PDEATHSIG), or the
 * terminal hung up.  Kill the running commands' process groups, say goodbye
 * (the head releases our leases) and leave at once, without waiting for a
 * plugin call that may never return.
 */
static void worker_hard_stop(worker_t *w) {
  fprintf(stderr, "muster worker: got SIGHUP: killing running commands and exiting\n");
  atomic_store(&w->stopping, 1); /* no slot leases (or registers again) from now on */
  pthread_mutex_lock(&w->lock);
  w->killing = 1; /* no command starts from now on */
  for (int i = 0; i < w->concurrency; i++)
    if (w->slots[i].proc)
      run_signal(w->slots[i].proc, SIGKILL);
  /* A slot that was starting a command kills it when it publishes it: wait
   * for those, or the command would outlive us (bounded: a slot only takes
   * the lock to publish). */
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += 2;
  while (w->spawning > 0 && pthread_cond_timedwait(&w->wake, &w->lock, &until) == 0)
    ;
  pthread_mutex_unlock(&w->lock);
  worker_updates_close(w);
  worker_shared_cleanup(w);
  muster_client_set_timeout(w->main_client, 2000);
  muster_worker_bye(w->main_client, worker_id(w));
  _exit(1);
}

/* Waits for the slots to finish, handling SIGINT/SIGTERM/SIGHUP meanwhile. */
static void worker_wait(worker_t *w, const sigset_t *signals) {
  int received = 0;
  while (atomic_load(&w->live_slots) > 0) {
    struct timespec step = {0, 50 * 1000000L};
    int sig = sigtimedwait(signals, NULL, &step);
    if (sig <= 0)
      continue;
    if (sig == SIGHUP)
      worker_hard_stop(w);
    atomic_fetch_add(&w->signals, 1);
    atomic_store(&w->stopping, 1);
    if (++received == 1) {
      fprintf(stderr,
              "muster worker: got signal %d: finishing running tasks, then exiting "
              "(signal again to stop them)\n",
              sig);
      continue;
    }
    atomic_store(&w->abandon, 1);
    fprintf(stderr, "muster worker: got signal %d again: terminating running commands\n", sig);
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->concurrency; i++)
      if (w->slots[i].proc)
        run_signal(w->slots[i].proc, SIGTERM);
    pthread_mutex_unlock(&w->lock);
  }
}

/* Starts the slots and waits for them (the heartbeat runs since the join). */
static void worker_run(worker_t *w, const sigset_t *signals) {
  int started = 0;
  atomic_store(&w->live_slots, w->concurrency);
  for (; started < w->concurrency; started++)
    if (pthread_create(&w->slots[started].thread, NULL, worker_slot_main, &w->slots[started]))
      break;
  if (started < w->concurrency) {
    fprintf(stderr, "muster worker: could not start slot %d of %d\n", started + 1, w->concurrency);
    atomic_fetch_sub(&w->live_slots, w->concurrency - started);
    atomic_store(&w->stopping, 1);
    atomic_store(&w->fatal, 1);
  }
  worker_wait(w, signals);
  for (int i = 0; i < started; i++)
    pthread_join(w->slots[i].thread, NULL);
}

static void worker_init_sync(worker_t *w) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&w->wake, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&w->lock, NULL);
  pthread_mutex_init(&w->reg_lock, NULL);
  pthread_mutex_init(&w->upd_lock, NULL);
  pthread_mutex_init(&w->shared_lock, NULL);
  w->updates_fd = -1;
}

static void worker_destroy(worker_t *w) {
  for (int i = 0; w->slots && i < w->concurrency; i++) {
    muster_client_free(w->slots[i].client);
    json_decref(w->slots[i].requires);
  }
  free(w->slots);
  worker_shared_free(w);
  muster_client_free(w->hb_client);
  muster_free(w->name);
  worker_updates_close(w);
  worker_plugin_unload(w); /* fini ran on the slot thread; this only covers a failed start */
  if (w->agent_fd >= 0)
    close(w->agent_fd);
  pthread_cond_destroy(&w->wake);
  pthread_mutex_destroy(&w->lock);
  pthread_mutex_destroy(&w->reg_lock);
  pthread_mutex_destroy(&w->upd_lock);
  pthread_mutex_destroy(&w->shared_lock);
}

/* Says goodbye and prints what the worker did.  A head that is shutting
 * down too (Ctrl-C on `muster head` with its local node and workers) has no
 * use for the goodbye: that refusal is not printed. */
static void worker_leave(worker_t *w, muster_client_t *client) {
  muster_err_t err = muster_worker_bye(client, worker_id(w));
  if (err != MUSTER_OK && err != MUSTER_WORKER_NOT_FOUND && err != MUSTER_UNAVAILABLE)
    fprintf(stderr, "muster worker: bye: %s: %s\n", muster_err_name(err),
            muster_client_message(client));
  fprintf(stderr, "muster worker: %s stopped: %ld completed, %ld failed\n", w->name,
          atomic_load(&w->completed), atomic_load(&w->failed));
}

int cmd_worker(cli_args_t *args) {
  worker_t w;
  memset(&w, 0, sizeof w);
  int rc = worker_configure(args, &w);
  muster_client_t *client = NULL;
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  /* Signals are blocked from here on (the threads inherit the mask) and taken
   * by worker_wait(), so one that comes while we register is not lost: it
   * waits, and then stops the worker the usual way. */
  sigset_t signals, old;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  signal(SIGPIPE, SIG_IGN);
  pthread_sigmask(SIG_BLOCK, &signals, &old);
  worker_init_sync(&w);
  w.main_client = client;
  w.slots = calloc((size_t)w.concurrency, sizeof *w.slots);
  int plugin_refused = 0; /* as a command that cannot run: exit 2, before joining */
  if (w.slots == NULL || (w.plugin_path && (plugin_refused = worker_plugin_load(&w) != 0)) ||
      worker_updates_open(&w) != 0 || (rc = worker_join(&w, client)) != CLI_OK) {
    if (rc == CLI_OK && w.slots == NULL)
      fprintf(stderr, "muster worker: out of memory\n");
    worker_heartbeat_stop(&w); /* a worker stopped while it waited for its queue */
    if (w.id > 0)
      muster_worker_bye(client, w.id);
    worker_destroy(&w);
    muster_client_free(client);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == WORKER_STOPPED ? CLI_OK : plugin_refused ? CLI_USAGE : CLI_FAIL;
  }
  worker_run(&w, &signals);
  worker_heartbeat_stop(&w);
  worker_leave(&w, client);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  rc = atomic_load(&w.fatal) ? CLI_FAIL : CLI_OK;
  worker_destroy(&w);
  muster_client_free(client);
  return rc;
}
