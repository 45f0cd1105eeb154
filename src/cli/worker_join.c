/*
 * worker_join.c — how `muster worker` joins its head: the registration (the
 * first, and again when the head no longer has the worker), the wait for a
 * head that is not up yet, and, under a node agent, the wait for a queue that
 * does not exist yet.
 *
 * The worker registers before it waits for its queue: nodes usually start
 * before the pool that creates the queue, and a worker registered on the
 * queue counts among its workers (GET /v1/workers lists it with the queue)
 * from then on, so a pool opened after its nodes sees the workers that are up
 * at once.  The head takes a registration for a queue it does not have yet;
 * the heartbeat keeps the worker alive while it waits.
 */
#include "cli/cli.h"
#include "cli/worker.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The beat interval while the head's timeout is not known (its read failed,
 * or a registration anew may have got another): short enough for any
 * timeout a head is likely to be given, and the read is tried at each beat. */
#define WORKER_UNREAD_BEAT_MS 250L

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

/* Whether SIGINT, SIGTERM or SIGHUP waits (blocked: worker_wait takes it). */
static bool worker_stop_pending(void) {
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  return sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1 ||
         sigismember(&pending, SIGHUP) == 1;
}

/*
 * For tests only (test_worker_instance.py): with MUSTER_TEST_HOLD_REGISTERED
 * set to a path, a worker that has registered as worker `id` (the first time,
 * or anew) says so and then waits, before it tells its node agent the id,
 * until that path exists or a stop signal comes (left pending for
 * worker_wait: the SIGHUP of its agent's death ends the worker as ever).  A
 * test kills it there: the one moment where only the instance its agent gave
 * it names it on the head.
 */
static void worker_test_hold(const worker_t *w, int64_t id) {
  const char *path = getenv("MUSTER_TEST_HOLD_REGISTERED");
  if (path == NULL || path[0] == '\0')
    return;
  fprintf(stderr,
          "muster worker: MUSTER_TEST_HOLD_REGISTERED: registered as worker %lld (instance %s); "
          "waiting for %s to exist before telling the node agent (for tests only)\n",
          (long long)id, w->instance, path);
  while (access(path, F_OK) != 0 && !worker_stop_pending()) {
    struct timespec step = {0, 20 * 1000000L};
    nanosleep(&step, NULL);
  }
}

/* The head's own words for why worker `id` went, from `said` ("worker 3
 * is gone (its node timed out); ..."), into `buf`; false when it gave none (an
 * older head, or a worker gone before the head kept why: "it said bye or
 * timed out"). */
static bool worker_gone_said(long long id, const char *said, char *buf, size_t size) {
  const char *at = strstr(said, " is gone (");
  if (at == NULL || strncmp(at + 10, "it said bye or timed out)", 25) == 0)
    return false;
  at += 10;
  const char *end = strchr(at, ')');
  snprintf(buf, size, "the head holds worker %lld as gone: %.*s", id, end ? (int)(end - at) : 200,
           at);
  return true;
}

/*
 * Why the head has no worker `old_id`, from its worker_not_found message
 * `said`, into `buf`: the head's own reason when it says one (a time-out
 * with the worker's own figures).  Else, a
 * worker it holds as gone ("is gone (": it said bye or timed out) timed out
 * when no beat reached the head for its timeout; one whose last beat got
 * there within it cannot have, so it was removed: a goodbye sent for it, or
 * its node left or timed out.  One the head does not know at all ("does not
 * exist") was never in its store.
 */
static void worker_forgotten_why(worker_t *w, int64_t old_id, const char *said, char *buf,
                                 size_t size) {
  pthread_mutex_lock(&w->lock);
  double timeout_s = (double)w->head_timeout_ms / 1000;
  double silent_s = (double)(worker_now_ms() - w->heard_sent_ms) / 1000;
  pthread_mutex_unlock(&w->lock);
  long long id = (long long)old_id;
  const char *told = strstr(said, " is gone (");
  bool timed_out = told != NULL && strncmp(told + 10, "it timed out", 12) == 0;
  if (!timed_out && worker_gone_said(id, said, buf, size))
    return;
  if (strstr(said, " is gone (") == NULL && strstr(said, " does not exist") != NULL)
    snprintf(buf, size,
             "the head does not know worker %lld (it lost its data, was restored from an older "
             "backup, or is another head at this URL)",
             id);
  else if (strstr(said, " is gone (") == NULL)
    snprintf(buf, size, "the head no longer has worker %lld (%.200s)", id, said);
  else if (timeout_s <= 0)
    snprintf(buf, size, "the head holds worker %lld as gone (timed out or removed)", id);
  else if (silent_s < timeout_s && !timed_out)
    snprintf(buf, size,
             "worker %lld was removed on the head, not timed out (its last heartbeat got there "
             "%.1f s ago, within its %.1f s timeout): a goodbye was sent for it, or its node "
             "left or timed out",
             id, silent_s, timeout_s);
  else if (silent_s < timeout_s) /* the head says so, though the last beat left since */
    snprintf(buf, size, "the head timed out worker %lld (past its %.1f s timeout)", id, timeout_s);
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
      worker_test_hold(w, id);
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
void worker_read_timeout(worker_t *w, muster_client_t *client) {
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

/* Says, once, that the worker (registered) waits for its queue, which its
 * heartbeat's progress says too while it waits. */
static void worker_say_awaiting_queue(worker_t *w) {
  atomic_store(&w->awaiting_queue, 1);
  pthread_mutex_lock(&w->lock); /* the heartbeat may register the worker anew */
  fprintf(stderr, "muster worker: registered as %s (id %lld); waiting for queue %s to be created\n",
          w->name, (long long)w->id, w->queue);
  pthread_mutex_unlock(&w->lock);
}

/*
 * Runs `step` until the head gives an answer to act on.  A head that cannot be
 * reached (not started yet, restarting) is waited for, and so, under a node
 * agent, is a queue that does not exist yet (nodes often start before the pool
 * creates its queue; the worker is registered by then); each wait prints one
 * line, not one per try.  A stop signal ends the wait and sets *stopped.
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
    /* A node agent's worker has the URL of the agent's --join, not its own. */
    if (w->agent_fd >= 0)
      snprintf(hint, sizeof hint, "the URL is the node agent's --join");
    if (worker_head_away(err) && !said_head)
      fprintf(stderr,
              "muster worker: waiting for the head at %s (%s: %.300s); trying every second "
              "(%s)\n",
              w->url, muster_err_name(err), muster_client_message(client),
              w->agent_fd >= 0 ? hint : cli_url_hint(hint, sizeof hint));
    else if (err == MUSTER_QUEUE_NOT_FOUND && !said_queue)
      worker_say_awaiting_queue(w);
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

/* Says that the worker was stopped while it waited (for the queue after
 * `err` queue_not_found, else for the head); returns WORKER_STOPPED. */
static int worker_stopped_early(const worker_t *w, muster_err_t err) {
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

/* Registered: tells the agent, reads an older head's timeout, makes the
 * handles and starts the heartbeat; 0, or -1 after saying why not. */
static int worker_start_beating(worker_t *w, muster_client_t *client) {
  worker_test_hold(w, w->id);
  worker_tell_agent(w, w->id);
  worker_read_timeout(w, client);    /* an older head's: the registration did not say it */
  atomic_store(&w->lease_ms, 60000); /* until the queue is read (it may not exist yet) */
  if (worker_make_clients(w) != 0 || worker_heartbeat_start(w) != 0) {
    fprintf(stderr, "muster worker: cannot start the heartbeat: out of memory or threads\n");
    return -1;
  }
  return 0;
}

/*
 * A worker alone checks its queue before it registers: a queue that does not
 * exist is then its user's mistake, said at once (worker_join_error), and
 * leaves no worker on the head.  Under a node agent the worker registers
 * first and then waits for the queue (see the top of this file).
 */
int worker_join(worker_t *w, muster_client_t *client) {
  bool stopped = false;
  muster_err_t err = MUSTER_OK;
  if (w->agent_fd < 0)
    err = worker_await(w, client, worker_check_queue, &stopped);
  if (err == MUSTER_OK && !stopped)
    err = worker_await(w, client, worker_register_first, &stopped);
  if (err == MUSTER_OK && !stopped && worker_start_beating(w, client) != 0)
    return CLI_FAIL;
  if (err == MUSTER_OK && !stopped && w->agent_fd >= 0)
    err = worker_await(w, client, worker_check_queue, &stopped);
  atomic_store(&w->awaiting_queue, 0);
  if (stopped)
    return worker_stopped_early(w, err);
  if (err != MUSTER_OK)
    return worker_join_error(w, client, err);
  worker_refresh_lease_ms(w, client);
  pthread_mutex_lock(&w->lock); /* the heartbeat may have registered the worker anew */
  fprintf(stderr, "muster worker: %s (id %lld) on queue %s, %d slot%s, running %s%s\n", w->name,
          (long long)w->id, w->queue, w->concurrency, w->concurrency > 1 ? "s" : "",
          w->plugin_path ? "plugin " : "", w->plugin_path ? w->plugin_path : w->cmd[0]);
  pthread_mutex_unlock(&w->lock);
  return CLI_OK;
}
