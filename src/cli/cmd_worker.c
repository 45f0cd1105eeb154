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
/* The beat interval while the head's timeout is not known (its read failed,
 * or a registration anew may have got another): short enough for any
 * timeout a head is likely to be given, and the read is tried at each beat. */
#define WORKER_UNREAD_BEAT_MS 250L

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

/* Registers with the worker's settings into *reg (set up by the caller). */
static muster_err_t worker_register(worker_t *w, muster_client_t *client,
                                    muster_worker_reg_t *reg) {
  const char *queues[] = {w->queue, NULL};
  muster_worker_opts_t opts;
  muster_worker_opts_init(&opts);
  opts.nickname = w->nickname;
  opts.node = w->node;
  opts.queues = queues;
  opts.timeout_ms = w->timeout_ms;
  opts.instance = w->instance;
  return muster_worker_register_full(client, &opts, reg);
}

/*
 * Takes the registration `reg`, sent at `sent_ms`, as the worker's (w->lock
 * held; its name is taken): the beat interval becomes a third of the timeout
 * it answered.  A head that did not answer one (an older head) has it read
 * with GET /v1/workers/ID (worker_read_timeout), beating every
 * WORKER_UNREAD_BEAT_MS until then.
 */
static void worker_take_registration(worker_t *w, muster_worker_reg_t *reg, int64_t sent_ms) {
  muster_free(w->name);
  w->name = reg->name;
  reg->name = NULL;
  w->id = reg->id;
  w->heard_sent_ms = sent_ms;
  w->head_timeout_ms = reg->timeout_ms;
  w->timeout_unread = reg->timeout_ms <= 0;
  w->heartbeat_ms = reg->timeout_ms <= 0       ? WORKER_UNREAD_BEAT_MS
                    : reg->timeout_ms / 3 > 50 ? (long)(reg->timeout_ms / 3)
                                               : 50;
}

/* Tells the node agent that started us (if any) our worker id, so it can
 * report our crash: one line "worker ID" on its pipe. */
static void worker_tell_agent(worker_t *w, int64_t id) {
  if (w->agent_fd < 0)
    return;
  char line[48];
  int len = snprintf(line, sizeof line, "worker %lld\n", (long long)id);
  if (write(w->agent_fd, line, (size_t)len) != len)
    fprintf(stderr, "muster worker: cannot tell the node agent our id: %s\n", strerror(errno));
}

/*
 * Why the head has no worker `old_id`, from its worker_not_found message
 * `said`, into `buf`.  A worker it holds as gone ("is gone (": it said bye or
 * timed out) timed out when no beat reached the head for its timeout; one
 * whose last beat got there within it cannot have, so it was removed: a
 * goodbye sent for it, or its node left or timed out.  One the head does not
 * know at all ("does not exist") was never in its store.
 */
static void worker_forgotten_why(worker_t *w, int64_t old_id, const char *said, char *buf,
                                 size_t size) {
  pthread_mutex_lock(&w->lock);
  double timeout_s = (double)w->head_timeout_ms / 1000;
  double silent_s = (double)(worker_now_ms() - w->heard_sent_ms) / 1000;
  pthread_mutex_unlock(&w->lock);
  long long id = (long long)old_id;
  if (strstr(said, " is gone (") == NULL && strstr(said, " does not exist") != NULL)
    snprintf(buf, size,
             "the head does not know worker %lld (it lost its data, was restored from an older "
             "backup, or is another head at this URL)",
             id);
  else if (strstr(said, " is gone (") == NULL)
    snprintf(buf, size, "the head no longer has worker %lld (%.200s)", id, said);
  else if (timeout_s <= 0)
    snprintf(buf, size, "the head holds worker %lld as gone (timed out or removed)", id);
  else if (silent_s < timeout_s)
    snprintf(buf, size,
             "worker %lld was removed on the head, not timed out (its last heartbeat got there "
             "%.1f s ago, within its %.1f s timeout): a goodbye was sent for it, or its node "
             "left or timed out",
             id, silent_s, timeout_s);
  else
    snprintf(buf, size,
             "the head timed out worker %lld (no heartbeat got there for %.1f s, past its %.1f s "
             "timeout)",
             id, silent_s, timeout_s);
}

/* The tasks the worker runs now (they hold leases of its old id). */
static int worker_running(worker_t *w) {
  int running = 0;
  for (int i = 0; i < w->concurrency; i++)
    running += atomic_load(&w->slots[i].task) != 0;
  return running;
}

muster_err_t worker_reregister(worker_t *w, muster_client_t *client, int64_t old_id) {
  muster_err_t err = MUSTER_OK;
  pthread_mutex_lock(&w->reg_lock);
  if (worker_id(w) == old_id) {
    char why[600];
    worker_forgotten_why(w, old_id, muster_client_message(client), why, sizeof why);
    muster_worker_reg_t reg;
    muster_worker_reg_init(&reg);
    int64_t sent = worker_now_ms();
    err = worker_register(w, client, &reg);
    if (err == MUSTER_OK) {
      int running = worker_running(w);
      fprintf(stderr, "muster worker: %s; registered again as %s (id %lld)", why, reg.name,
              (long long)reg.id);
      if (running == 1)
        fprintf(stderr, "; the task it was running lost its lease (its result will not be stored)");
      else if (running > 1)
        fprintf(stderr,
                "; the %d tasks it was running lost their leases (their results will not be "
                "stored)",
                running);
      fputc('\n', stderr);
      int64_t id = reg.id;
      pthread_mutex_lock(&w->lock);
      worker_take_registration(w, &reg, sent);
      pthread_mutex_unlock(&w->lock);
      worker_tell_agent(w, id);
    }
  }
  pthread_mutex_unlock(&w->reg_lock);
  return err;
}

/*
 * For a head that did not answer the worker's timeout at registration (an
 * older head; w->timeout_unread): reads it with GET /v1/workers/ID and sets
 * the beat interval to a third of it.  When the read fails (the head away or
 * restarting right then), the interval stays WORKER_UNREAD_BEAT_MS and the
 * next beat reads again: falling back to the default minute's third, as it
 * once did, left a head with a shorter timeout timing the worker out again
 * and again, each time returning its leases.
 */
static void worker_read_timeout(worker_t *w, muster_client_t *client) {
  pthread_mutex_lock(&w->lock);
  int unread = w->timeout_unread;
  int64_t id = w->id;
  pthread_mutex_unlock(&w->lock);
  if (!unread)
    return;
  char path[64], *reply = NULL;
  snprintf(path, sizeof path, "/v1/workers/%lld", (long long)id);
  json_int_t timeout = 0;
  if (muster_request(client, "GET", path, NULL, &reply) == MUSTER_OK) {
    json_t *obj = json_loads(reply, JSON_ALLOW_NUL, NULL);
    timeout = json_integer_value(json_object_get(obj, "timeout_ms"));
    json_decref(obj);
  }
  muster_free(reply);
  if (timeout <= 0)
    return;
  pthread_mutex_lock(&w->lock);
  if (w->id == id) { /* not registered anew meanwhile */
    w->heartbeat_ms = timeout / 3 > 50 ? (long)(timeout / 3) : 50;
    w->head_timeout_ms = (int64_t)timeout;
    w->timeout_unread = 0;
  }
  pthread_mutex_unlock(&w->lock);
}

/* ---- heartbeat -------------------------------------------------------------- */

/* "idle", "running task 12" or "running tasks 12, 15" (w->lock held). */
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
  if (running == 0)
    snprintf(buf, size, "idle");
  else
    snprintf(buf, size, "running task%s %s", running > 1 ? "s" : "", tasks);
}

/* Re-reads the queue's lease length (it may have been reconfigured). */
static void worker_refresh_lease_ms(worker_t *w, muster_client_t *client) {
  char *json = NULL;
  if (muster_queue_get(client, w->queue, &json) != MUSTER_OK)
    return;
  json_t *queue = json_loads(json, JSON_ALLOW_NUL, NULL);
  json_int_t lease_ms = json_integer_value(json_object_get(queue, "lease_ms"));
  if (lease_ms > 0)
    atomic_store(&w->lease_ms, (int64_t)lease_ms);
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

/* Reads --concurrency, --max-tasks and --timeout-ms; CLI_OK, or the usage
 * error of the first that is refused. */
static int worker_read_limits(cli_args_t *args, worker_t *w) {
  int64_t concurrency = 1;
  int rc = cli_opt_int(args, "concurrency", 1, 1, &concurrency);
  if (rc == CLI_OK && concurrency > CLI_MAX_CONCURRENCY)
    rc = cli_usage_error(args->cmd, "--concurrency: at most %d", CLI_MAX_CONCURRENCY);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max-tasks", 0, 0, &w->max_tasks);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "timeout-ms", -1, 1, &w->timeout_ms);
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
  worker_make_instance(w);
  w->queue = cli_opt(args, "queue");
  if (w->queue == NULL)
    return cli_usage_error(args->cmd, "'worker' needs --queue Q");
  int rc = worker_read_limits(args, w);
  worker_read_options(args, w);
  const char *problem = w->cache_url ? url_head_problem(w->cache_url) : NULL;
  if (rc == CLI_OK && problem != NULL)
    rc = cli_usage_error(args->cmd, "%s '%s': %s",
                         cli_opt(args, "cache-url") ? "--cache-url" : "MUSTER_CACHE_URL",
                         w->cache_url, problem);
  if (rc == CLI_OK)
    rc = worker_check_runner(args, w);
  worker_take_agent_fd(w);
  return rc;
}

/* A step of joining: the queue check or the registration. */
typedef muster_err_t (*worker_step_t)(worker_t *w, muster_client_t *client);

static muster_err_t worker_check_queue(worker_t *w, muster_client_t *client) {
  return muster_queue_get(client, w->queue, NULL);
}

static muster_err_t worker_register_first(worker_t *w, muster_client_t *client) {
  muster_worker_reg_t reg;
  muster_worker_reg_init(&reg);
  int64_t sent = worker_now_ms();
  muster_err_t err = worker_register(w, client, &reg);
  if (err == MUSTER_OK)
    worker_take_registration(w, &reg, sent); /* no other thread runs yet */
  return err;
}

/* The head is not there yet, or is starting or stopping: wait for it. */
static bool worker_head_away(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
}

/*
 * Runs `step` until the head gives an answer to act on.  A head that cannot be
 * reached (not started yet, restarting) is waited for, and so, under a node
 * agent, is a queue that does not exist yet (nodes often start before the pool
 * creates its queue); each wait prints one line, not one per try.  A stop
 * signal ends the wait and sets *stopped.
 */
static muster_err_t worker_await(worker_t *w, muster_client_t *client, worker_step_t step,
                                 bool *stopped) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  bool said_head = false, said_queue = false;
  muster_err_t err;
  char hint[4400];
  while (worker_head_away(err = step(w, client)) ||
         (err == MUSTER_QUEUE_NOT_FOUND && w->agent_fd >= 0)) {
    if (worker_head_away(err) && !said_head)
      fprintf(stderr,
              "muster worker: waiting for the head at %s (%s: %.300s); trying every second "
              "(%s)\n",
              w->url, muster_err_name(err), muster_client_message(client),
              cli_url_hint(hint, sizeof hint));
    else if (err == MUSTER_QUEUE_NOT_FOUND && !said_queue)
      fprintf(stderr, "muster worker: waiting for queue %s to be created\n", w->queue);
    said_head = said_head || worker_head_away(err);
    said_queue = said_queue || err == MUSTER_QUEUE_NOT_FOUND;
    struct timespec pause = {1, 0};
    if (sigtimedwait(&stop, NULL, &pause) > 0) {
      *stopped = true;
      return err;
    }
  }
  if (said_head && err == MUSTER_OK)
    fprintf(stderr, "muster worker: the head at %s answers\n", w->url);
  return err;
}

/* Says why joining failed, as `muster worker` (cli_error would say `muster`),
 * with what to do about it. */
static int worker_join_error(worker_t *w, muster_client_t *client, muster_err_t err) {
  const char *message = muster_client_message(client);
  fprintf(stderr, "muster worker: %s: %s\n", muster_err_name(err),
          message && message[0] ? message : muster_strerror(err));
  if (err == MUSTER_QUEUE_NOT_FOUND)
    fprintf(stderr,
            "muster worker: create it with `muster queue create %s` (or see `muster "
            "queue ls` for the queues there are)\n",
            w->queue);
  else if (err == MUSTER_UNAUTHORIZED)
    fprintf(stderr, "muster worker: pass the head's token with --token or MUSTER_TOKEN (the "
                    "head keeps it in its data dir's token file)\n");
  return CLI_FAIL;
}

/* A worker told to stop before it joined: nothing to do, no error
 * (worker_join). */
#define WORKER_STOPPED (-1)

/* Checks the queue, registers, and picks the heartbeat interval; CLI_OK,
 * WORKER_STOPPED, or CLI_FAIL after saying why. */
static int worker_join(worker_t *w, muster_client_t *client) {
  bool stopped = false;
  muster_err_t err = worker_await(w, client, worker_check_queue, &stopped);
  if (err == MUSTER_OK) {
    worker_refresh_lease_ms(w, client);
    if (atomic_load(&w->lease_ms) <= 0)
      atomic_store(&w->lease_ms, 60000);
    err = worker_await(w, client, worker_register_first, &stopped);
  }
  if (stopped) {
    if (err == MUSTER_QUEUE_NOT_FOUND)
      fprintf(stderr, "muster worker: stopped while waiting for queue %s; nothing was leased\n",
              w->queue);
    else
      fprintf(stderr,
              "muster worker: stopped while waiting for the head at %s; nothing was "
              "leased\n",
              w->url);
    return WORKER_STOPPED;
  }
  if (err != MUSTER_OK)
    return worker_join_error(w, client, err);
  worker_tell_agent(w, w->id);
  worker_read_timeout(w, client); /* an older head's: the registration did not say it */
  fprintf(stderr, "muster worker: %s (id %lld) on queue %s, %d slot%s, running %s%s\n", w->name,
          (long long)w->id, w->queue, w->concurrency, w->concurrency > 1 ? "s" : "",
          w->plugin_path ? "plugin " : "", w->plugin_path ? w->plugin_path : w->cmd[0]);
  return CLI_OK;
}

/* Creates one handle per slot and one for the heartbeat. */
static int worker_make_clients(worker_t *w) {
  if (muster_client_new(w->url, w->token, &w->hb_client) != MUSTER_OK)
    return -1;
  for (int i = 0; i < w->concurrency; i++) {
    w->slots[i].worker = w;
    w->slots[i].index = i;
    if (muster_client_new(w->url, w->token, &w->slots[i].client) != MUSTER_OK)
      return -1;
  }
  return 0;
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

/* Starts the threads, waits for the slots, stops the heartbeat. */
static void worker_run(worker_t *w, const sigset_t *signals) {
  pthread_t heartbeat;
  int hb_started = pthread_create(&heartbeat, NULL, worker_heartbeat_main, w) == 0;
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
  pthread_mutex_lock(&w->lock);
  w->hb_stop = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  if (hb_started)
    pthread_join(heartbeat, NULL);
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
      worker_updates_open(&w) != 0 || (rc = worker_join(&w, client)) != CLI_OK ||
      worker_make_clients(&w)) {
    if (rc == CLI_OK && w.slots == NULL)
      fprintf(stderr, "muster worker: out of memory\n");
    if (w.id > 0)
      muster_worker_bye(client, w.id);
    worker_destroy(&w);
    muster_client_free(client);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == WORKER_STOPPED ? CLI_OK : plugin_refused ? CLI_USAGE : CLI_FAIL;
  }
  worker_run(&w, &signals);
  worker_leave(&w, client);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  rc = atomic_load(&w.fatal) ? CLI_FAIL : CLI_OK;
  worker_destroy(&w);
  muster_client_free(client);
  return rc;
}
