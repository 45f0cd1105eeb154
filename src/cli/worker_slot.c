/*
 * worker_slot.c — one slot of `muster worker`: lease a task, run the command,
 * report the outcome, repeat.
 *
 * In the steady state a completion leases the slot's next task in the same
 * request (worker_complete_lease), so a worker makes one round trip per task;
 * the plain long-poll lease is used when there was nothing to complete (the
 * first task, after a failure, or when the queue ran dry), and a completion
 * leases nothing while the worker stops or has used up --max-tasks.
 *
 * A slot holds at most one lease.  While the command runs, the slot extends
 * the lease at half the queue's lease time, so a task that runs longer than
 * one lease keeps it; if the head says the lease is lost anyway (it expired
 * during a network outage, say), the command is killed and its result dropped,
 * since another worker owns the task now.  Transient failures (network, a
 * restarting head) are retried; errors that retrying cannot fix (unknown
 * queue, bad token) stop the whole worker.
 */
#include "cli/cli.h"
#include "cli/worker.h"
#include "client/jdump.h"

#include <ctype.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SLOT_ERROR_MAX (RUN_TAIL_MAX * 4 + 64) /* room for a tail with '?'-replaced bytes */
#define SLOT_NOTE_MAX 160                      /* the line --permanent-exit puts above the tail */
#define SLOT_PAUSE_FIRST_MS 200L      /* the first pause before an acknowledgement is sent again */
#define SLOT_PAUSE_MAX_MS 1000L       /* pauses double up to this while the head is away */
#define SLOT_STOPPING_RETRY_MS 10000L /* a stopping worker retries this long (a quick restart) */

/* Claims one of --max-tasks; 0 when all are claimed. */
static int slot_take_ticket(worker_t *w) {
  if (w->max_tasks <= 0)
    return 1;
  int64_t t = atomic_load(&w->tickets);
  while (t < w->max_tasks)
    if (atomic_compare_exchange_weak(&w->tickets, &t, t + 1))
      return 1;
  return 0;
}

static void slot_return_ticket(worker_t *w) {
  if (w->max_tasks > 0)
    atomic_fetch_sub(&w->tickets, 1);
}

/* Errors that go away by themselves: retry after a pause. */
static int slot_transient(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE || err == MUSTER_INTERNAL ||
         err == MUSTER_STORE || err == MUSTER_PROTOCOL || err == MUSTER_NOMEM;
}

/*
 * Leases one task into *lease.  Returns 1 with a lease, 0 without one (try
 * again), -1 when the worker must stop on an error, -2 when a stopping worker
 * ends here cleanly.
 */
static int slot_lease(worker_slot_t *slot, muster_lease_t **lease) {
  worker_t *w = slot->worker;
  size_t count = 0;
  int64_t id = worker_id(w), sent = worker_now_ms();
  /* After a failure the first lease does not wait: it ends the streak as soon
   * as the head answers.  A long-poll would say so only when its wait ran out,
   * and a head gone again meanwhile (back for less than that wait) made two
   * outages one streak, the second without its lines. */
  int64_t wait_ms = slot->lease_failing ? 0 : WORKER_POLL_MS;
  muster_err_t err = worker_lease(slot, wait_ms, lease, &count);
  if (err == MUSTER_OK && count > 0)
    atomic_store(&slot->lease_until, sent + atomic_load(&w->lease_ms));
  if (err == MUSTER_OK && slot->lease_failing) {
    fprintf(stderr, "muster worker: slot %d: leasing again\n", slot->index + 1);
    slot->lease_failing = 0;
  }
  if (err == MUSTER_OK && count > 0)
    return 1;
  if (err == MUSTER_OK) {
    muster_leases_free(*lease, count);
    *lease = NULL;
    return 0;
  }
  /* A stopping worker takes no new task: a lease cut short (the head stops
   * too and answers its long-poll 503) is no news then, nor is a worker the
   * head forgot because the hard stop said goodbye (registering again would
   * lease anew what the goodbye just gave back). */
  if (atomic_load(&w->stopping) && (slot_transient(err) || err == MUSTER_WORKER_NOT_FOUND))
    return -2; /* not an error: a Ctrl-C as the head stops must not make exit status 1 */
  if (err == MUSTER_WORKER_NOT_FOUND && (err = worker_reregister(w, slot->client, id)) == MUSTER_OK)
    return 0;
  if (!slot->lease_failing || !slot_transient(err))
    fprintf(stderr, "muster worker: slot %d: lease from %s: %s: %s%s\n", slot->index + 1, w->queue,
            muster_err_name(err), muster_client_message(slot->client),
            slot_transient(err) ? " (retrying every second)" : "");
  if (!slot_transient(err))
    return -1;
  slot->lease_failing = 1;
  worker_nap(w, 1000);
  return 0;
}

/* Sleeps up to `ms`, returning early when a stop signal comes after the
 * worker had received `seen` of them. */
static void slot_pause(worker_t *w, long ms, int seen) {
  int64_t until = worker_now_ms() + ms;
  while (atomic_load(&w->signals) == seen && worker_now_ms() < until) {
    struct timespec step = {0, 20 * 1000000L};
    nanosleep(&step, NULL);
  }
}

/* While an acknowledgement waits for the head, extends the lease once half of
 * it has passed since it was granted or last extended: a head that answers
 * again but cannot store the acknowledgement yet keeps the task ours. */
static void slot_wait_extend(worker_slot_t *slot, const muster_ack_t *ack) {
  int64_t lease_ms = atomic_load(&slot->worker->lease_ms);
  int64_t sent = worker_now_ms();
  if (sent < atomic_load(&slot->lease_until) - lease_ms / 2)
    return;
  muster_ack_t extend;
  muster_ack_init(&extend, ack->task, ack->token);
  if (muster_extend(slot->client, &extend, 1) == MUSTER_OK)
    atomic_store(&slot->lease_until, sent + lease_ms);
}

/* Says once that the acknowledgement `what` waits for the head. */
static void slot_say_waiting(worker_slot_t *slot, const muster_ack_t *ack, const char *what,
                             muster_err_t err, int64_t until) {
  int64_t left_s = (until - worker_now_ms() + 999) / 1000;
  fprintf(stderr,
          "muster worker: task %lld: cannot %s yet (%s: %.300s); retrying for up to %lld s, "
          "while its lease lasts (a stop signal gives up)\n",
          (long long)ack->task, what, muster_err_name(err), muster_client_message(slot->client),
          (long long)(left_s > 0 ? left_s : 0));
}

/* What the head made of a task the slot failed (slot->failed_as), as the
 * fail's reply says it. */
enum {
  SLOT_FAILED_UNKNOWN = 0, /* not read: the fail failed, or the reply did not say */
  SLOT_FAILED_RETRIED,     /* "queued": it runs again after its backoff */
  SLOT_FAILED_DEAD,        /* "dead": its attempts are used up */
  SLOT_FAILED_FOR_GOOD,    /* "failed": failed permanently, on the worker's word */
};

/* Sends one acknowledgement of the slot's lease, as slot_ack retries it. */
typedef muster_err_t (*slot_send_fn)(worker_slot_t *slot, const muster_ack_t *ack);

static muster_err_t slot_send_complete(worker_slot_t *slot, const muster_ack_t *ack) {
  return muster_complete(slot->client, ack, 1);
}

static muster_err_t slot_send_release(worker_slot_t *slot, const muster_ack_t *ack) {
  return muster_release(slot->client, ack, 1);
}

/* Reads what the fail's reply `reply` says became of its one task. */
static int slot_failed_as(const char *reply) {
  json_t *root = json_loads(reply ? reply : "", JSON_ALLOW_NUL, NULL);
  const char *state = json_string_value(
      json_object_get(json_array_get(json_object_get(root, "failed"), 0), "state"));
  int as = !state                         ? SLOT_FAILED_UNKNOWN
           : strcmp(state, "queued") == 0 ? SLOT_FAILED_RETRIED
           : strcmp(state, "dead") == 0   ? SLOT_FAILED_DEAD
           : strcmp(state, "failed") == 0 ? SLOT_FAILED_FOR_GOOD
                                          : SLOT_FAILED_UNKNOWN;
  json_decref(root);
  return as;
}

/*
 * Fails the task as muster_fail does (POST /v1/leases/fail, the same body),
 * reading from the reply what became of it into slot->failed_as: muster_fail
 * keeps the reply to itself, and the worker's line says whether the task runs
 * again.  An error jansson cannot send (not UTF-8; run_error_text makes none)
 * goes through muster_fail, which says why, the outcome left unknown.
 */
static muster_err_t slot_send_fail(worker_slot_t *slot, const muster_ack_t *ack) {
  slot->failed_as = SLOT_FAILED_UNKNOWN;
  json_t *lease = json_pack("{s:I, s:I, s:b}", "task", (json_int_t)ack->task, "token",
                            (json_int_t)ack->token, "permanent", ack->permanent);
  if (lease && ack->error && json_object_set_new(lease, "error", json_string(ack->error)) != 0) {
    json_decref(lease); /* json_string refused the text: not UTF-8 */
    lease = NULL;
  }
  json_t *body = lease ? json_pack("{s:[O]}", "leases", lease) : NULL;
  char *text = body ? jdump(body, JSON_COMPACT) : NULL;
  json_decref(body);
  json_decref(lease);
  if (text == NULL)
    return muster_fail(slot->client, ack, 1);
  char *reply = NULL;
  muster_err_t err = muster_request(slot->client, "POST", "/v1/leases/fail", text, &reply);
  free(text);
  if (err == MUSTER_OK)
    slot->failed_as = slot_failed_as(reply);
  muster_free(reply);
  return err;
}

/*
 * Sends one acknowledgement of the slot's lease (`what` names it for the log:
 * "store its result").  A transient failure (the head restarting, the network)
 * is retried, pausing 200 ms and doubling up to 1 s, for as long as the lease
 * surely holds (slot->lease_until): the head keeps a lease through its own
 * restart, so a result that finished during an outage is stored once the head
 * is back rather than run again after the lease expires.  A worker that is
 * stopping retries for SLOT_STOPPING_RETRY_MS at most, and a stop signal that
 * comes during the wait ends it at once.  Returns the last call's error;
 * *gave_up says why a transient one was given up (NULL otherwise).
 */
static muster_err_t slot_ack(worker_slot_t *slot, const muster_ack_t *ack, const char *what,
                             slot_send_fn call, const char **gave_up) {
  worker_t *w = slot->worker;
  int seen = atomic_load(&w->signals);
  int64_t started = worker_now_ms(), until = atomic_load(&slot->lease_until);
  long pause = SLOT_PAUSE_FIRST_MS;
  *gave_up = NULL;
  for (int tries = 1;; tries++) {
    muster_err_t err = call(slot, ack);
    if (atomic_load(&w->stopping) && until > started + SLOT_STOPPING_RETRY_MS)
      until = started + SLOT_STOPPING_RETRY_MS; /* a stopping worker is not held up long */
    if (tries > 1 && (err == MUSTER_OK || !slot_transient(err)))
      fprintf(stderr, "muster worker: task %lld: reached the head again after %.1f s\n",
              (long long)ack->task, (double)(worker_now_ms() - started) / 1000);
    if (err == MUSTER_OK || !slot_transient(err))
      return err;
    int64_t left = until - worker_now_ms();
    if (left <= 0 || atomic_load(&w->signals) != seen) {
      *gave_up = atomic_load(&w->signals) != seen ? "the worker was told to stop"
                 : atomic_load(&w->stopping)      ? "the worker is stopping"
                                                  : "its lease ran out while retrying";
      return err;
    }
    if (tries == 1)
      slot_say_waiting(slot, ack, what, err, until);
    slot_pause(w, pause < left ? pause : (long)left, seen); /* the last try at the deadline */
    pause = pause * 2 < SLOT_PAUSE_MAX_MS ? pause * 2 : SLOT_PAUSE_MAX_MS;
    slot_wait_extend(slot, ack);
  }
}

/* Prints that acknowledging task `task` failed with `err`: `what` ("result
 * not stored"), the head's message and, for a transient error given up, why. */
static void slot_say_unacked(worker_slot_t *slot, int64_t task, const char *what, muster_err_t err,
                             const char *gave_up) {
  fprintf(stderr, "muster worker: task %lld: %s: %s: %.300s%s%s%s\n", (long long)task, what,
          muster_err_name(err), muster_client_message(slot->client), gave_up ? " (gave up: " : "",
          gave_up ? gave_up : "",
          gave_up ? "; the head re-queues the task when its lease expires)" : "");
}

/* The line of a task's error that says the most, [*line, *line + return):
 * the last one that is not blank.  A command's stderr ends with what went
 * wrong (a Python traceback's exception, a tool's last complaint), and its
 * first lines are often the least telling ("Traceback (most recent call
 * last):").  *more is set when other lines come before it. */
static int slot_error_last_line(const char *error, const char **line, bool *more) {
  size_t end = strlen(error);
  while (end > 0 && isspace((unsigned char)error[end - 1]))
    end--;
  size_t start = end;
  while (start > 0 && error[start - 1] != '\n')
    start--;
  *line = error + start;
  *more = false;
  for (size_t i = 0; i < start; i++)
    *more |= !isspace((unsigned char)error[i]);
  return (int)(end - start);
}

/* What became of the task the slot just failed and what comes next, from
 * the fail's reply, into `buf`: "; it will be retried (attempt 2 of 3)"; ""
 * when the reply was not read.  The attempt count is the lease's, the limit
 * the queue's as last read (left out when unread or passed: it was raised). */
static const char *slot_fail_outcome(const worker_slot_t *slot, const muster_lease_t *lease,
                                     char *buf, size_t size) {
  const worker_t *w = slot->worker;
  long long next = (long long)lease->attempt + 1, max = (long long)atomic_load(&w->max_attempts);
  buf[0] = '\0';
  if (slot->failed_as == SLOT_FAILED_RETRIED && max >= next)
    snprintf(buf, size, "; it will be retried (attempt %lld of %lld)", next, max);
  else if (slot->failed_as == SLOT_FAILED_RETRIED)
    snprintf(buf, size, "; it will be retried (attempt %lld)", next);
  else if (slot->failed_as == SLOT_FAILED_DEAD)
    snprintf(buf, size,
             "; it is dead after %lld attempt%s: 'muster tasks dead --queue %.200s' lists it",
             next - 1, next == 2 ? "" : "s", w->queue);
  else if (slot->failed_as == SLOT_FAILED_FOR_GOOD)
    snprintf(buf, size,
             "; it failed permanently and will not be retried: 'muster tasks dead --queue %.200s' "
             "lists it",
             w->queue);
  return buf;
}

/* Says that the slot's task failed with `error`, in one line: `how` the
 * command ended ("exit status 3"; NULL when the error says it, or no command
 * ran), a multi-line error by its last line and where the whole of it is,
 * and what the head made of the task (slot_fail_outcome). */
static void slot_say_failed(const worker_slot_t *slot, const muster_lease_t *lease,
                            const char *error, const char *how) {
  const char *line;
  bool more;
  char outcome[400], ended[80] = "";
  long long task = (long long)lease->task;
  int len = slot_error_last_line(error, &line, &more);
  slot_fail_outcome(slot, lease, outcome, sizeof outcome);
  if (how)
    snprintf(ended, sizeof ended, " (%s)", how);
  if (!more) {
    fprintf(stderr, "muster worker: task %lld failed%s: %.200s%s\n", task, ended, error, outcome);
    return;
  }
  fprintf(stderr,
          "muster worker: task %lld failed%s: %.*s (the last line of its error; 'muster tasks "
          "show %lld' has all of it)%s\n",
          task, ended, len < 200 ? len : 200, line, task, outcome);
}

/* Fails the task with `error` (for good when `permanent`), counted, and says
 * so (slot_say_failed, with `how` the command ended) once the head said what
 * became of it. */
static void slot_fail_as(worker_slot_t *slot, const muster_lease_t *lease, const char *error,
                         int permanent, const char *how) {
  muster_ack_t ack;
  muster_ack_init(&ack, lease->task, lease->token);
  ack.error = error;
  ack.permanent = permanent;
  const char *gave_up;
  muster_err_t err = slot_ack(slot, &ack, "report its failure", slot_send_fail, &gave_up);
  atomic_fetch_add(&slot->worker->failed, 1);
  if (err != MUSTER_OK)
    slot->failed_as = SLOT_FAILED_UNKNOWN;
  slot_say_failed(slot, lease, error, how);
  if (err != MUSTER_OK)
    slot_say_unacked(slot, lease->task, "could not report the failure", err, gave_up);
}

void worker_slot_fail(worker_slot_t *slot, const muster_lease_t *lease, const char *error,
                      int permanent) {
  slot_fail_as(slot, lease, error, permanent, NULL);
}

/* Fails the task with `error` (retried per the queue's settings). */
static void slot_fail(worker_slot_t *slot, const muster_lease_t *lease, const char *error) {
  worker_slot_fail(slot, lease, error, 0);
}

/* Turns the command's stdout into the result's JSON text (free), or NULL
 * with the reason in `why`. */
static char *slot_result(worker_slot_t *slot, run_proc_t *proc, char *why, size_t size) {
  size_t len = proc->out_len;
  const char *out = proc->out ? proc->out : "";
  if (len > 0 && out[len - 1] == '\n')
    len--; /* one trailing newline is how commands end their output, not data */
  if (proc->out_overflow) {
    snprintf(why, size, "stdout is larger than %u bytes", RUN_OUT_MAX);
    return NULL;
  }
  char reason[CLI_JSON_WHY];
  json_t *value;
  if (slot->worker->json_result)
    value = len == 0 ? json_null() : cli_json_parse(out, len, reason, sizeof reason);
  else
    value = json_stringn(out, len);
  if (value == NULL) {
    if (slot->worker->json_result)
      snprintf(why, size, "stdout is not valid JSON: %.200s", reason);
    else
      snprintf(why, size, "stdout is not valid UTF-8 text");
    return NULL;
  }
  char *text = jdump(value, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(value);
  if (text == NULL)
    snprintf(why, size, "out of memory");
  return text;
}

/* Completes the task with the command's output. */
static void slot_complete(worker_slot_t *slot, const muster_lease_t *lease, run_proc_t *proc) {
  char why[256];
  char *result = slot_result(slot, proc, why, sizeof why);
  if (result == NULL) {
    slot_fail(slot, lease, why);
    return;
  }
  worker_slot_complete(slot, lease, result);
  free(result);
}

/*
 * Completes `ack` and, when the slot will go on, leases its next task in the
 * same request into slot->next (with a ticket of --max-tasks taken for it).
 * When the combined call fails, the completion is sent alone, with the plain
 * call's retries: the combined call is all or nothing, so it completed nothing
 * (unless its reply was lost: then the plain completion is answered as a
 * repeat, and the slot's next lease request, which sends the combined call's
 * key again, gets the task that call leased: worker_update.c).  A head that
 * refuses the combined call but accepts the plain one is not asked again.
 */
static muster_err_t slot_complete_next(worker_slot_t *slot, const muster_ack_t *ack,
                                       const char **gave_up) {
  worker_t *w = slot->worker;
  *gave_up = NULL;
  if (atomic_load(&w->stopping) || atomic_load(&w->combined_unsupported) || !slot_take_ticket(w))
    return slot_ack(slot, ack, "store its result", slot_send_complete, gave_up);
  size_t count = 0;
  muster_lease_t *next = NULL;
  int64_t sent = worker_now_ms();
  muster_err_t err = worker_complete_lease(slot, ack, &next, &count);
  if (err == MUSTER_OK && count > 0) {
    slot->next = next;
    atomic_store(&slot->lease_until, sent + atomic_load(&w->lease_ms));
    return MUSTER_OK;
  }
  muster_leases_free(next, count);
  slot_return_ticket(w);
  if (err == MUSTER_OK)
    return MUSTER_OK; /* completed; nothing was ready: the next lease long-polls */
  muster_err_t plain = slot_ack(slot, ack, "store its result", slot_send_complete, gave_up);
  if (plain == MUSTER_OK && err == MUSTER_INVALID && !atomic_exchange(&w->combined_unsupported, 1))
    fprintf(stderr, "muster worker: the head refused complete-and-lease (%s); completing alone\n",
            muster_err_name(err));
  return plain;
}

void worker_slot_complete(worker_slot_t *slot, const muster_lease_t *lease, const char *result) {
  char why[256];
  muster_ack_t ack;
  muster_ack_init(&ack, lease->task, lease->token);
  ack.result = result;
  const char *gave_up;
  muster_err_t err = slot_complete_next(slot, &ack, &gave_up);
  if (err == MUSTER_OK) {
    atomic_fetch_add(&slot->worker->completed, 1);
  } else if (err == MUSTER_PAYLOAD_TOO_LARGE || err == MUSTER_BODY_TOO_LARGE) {
    snprintf(why, sizeof why, "result refused: %.200s", muster_client_message(slot->client));
    slot_fail(slot, lease, why);
  } else {
    slot_say_unacked(slot, lease->task, "result not stored", err, gave_up);
  }
}

/* Gives the task back without counting the attempt. */
static void slot_release(worker_slot_t *slot, const muster_lease_t *lease) {
  muster_ack_t ack;
  muster_ack_init(&ack, lease->task, lease->token);
  const char *gave_up;
  slot_ack(slot, &ack, "release it", slot_send_release, &gave_up);
}

/*
 * Extends the lease while the command runs.  Returns 0, or -1 when the lease
 * is gone (the command is then killed: its result would be refused).
 */
static int slot_extend(worker_slot_t *slot, const muster_lease_t *lease, run_proc_t *proc) {
  muster_ack_t ack;
  muster_ack_init(&ack, lease->task, lease->token);
  int64_t sent = worker_now_ms();
  muster_err_t err = muster_extend(slot->client, &ack, 1);
  if (err == MUSTER_OK)
    atomic_store(&slot->lease_until, sent + atomic_load(&slot->worker->lease_ms));
  if (err == MUSTER_OK || slot_transient(err))
    return 0;
  fprintf(stderr, "muster worker: task %lld: lease lost (%s: %s); stopping its command\n",
          (long long)lease->task, muster_err_name(err), muster_client_message(slot->client));
  run_signal(proc, SIGKILL);
  return -1;
}

/* Runs the started command to its end, extending the lease as it goes.
 * Returns 0, or -1 when the lease was lost on the way. */
static int slot_supervise(worker_slot_t *slot, const muster_lease_t *lease, run_proc_t *proc) {
  int lost = 0;
  for (;;) {
    int64_t every = atomic_load(&slot->worker->lease_ms) / 2;
    if (run_pump(proc, (long)(every > 0 ? every : 1)) == 1)
      return lost ? -1 : 0;
    if (!lost && slot_extend(slot, lease, proc) != 0)
      lost = 1;
  }
}

/* The child's environment: ours plus the task's MUSTER_* variables and
 * `shared` (the required shared data's; may be NULL).  MUSTER_WORKER_PID
 * names this worker process: the command's parent is its guard (run_guard.c),
 * a new process for every task. */
static char **slot_env(worker_slot_t *slot, const muster_lease_t *lease, char vars[6][160],
                       char **shared) {
  size_t n = 0, nshared = 0;
  while (environ[n])
    n++;
  while (shared && shared[nshared])
    nshared++;
  char **env = calloc(n + nshared + 7, sizeof *env);
  if (env == NULL)
    return NULL;
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "MUSTER_TASK_ID=", 15) && strncmp(environ[i], "MUSTER_ATTEMPT=", 15) &&
        strncmp(environ[i], "MUSTER_QUEUE=", 13) && strncmp(environ[i], "MUSTER_WORKER_ID=", 17) &&
        strncmp(environ[i], "MUSTER_UPDATE_SEQ=", 18) &&
        strncmp(environ[i], "MUSTER_WORKER_PID=", 18) &&
        strncmp(environ[i], "MUSTER_REQUIRES=", 16) && strncmp(environ[i], "MUSTER_SHARED_", 14))
      env[at++] = environ[i];
  for (size_t i = 0; i < nshared; i++)
    env[at++] = shared[i];
  snprintf(vars[0], 160, "MUSTER_TASK_ID=%lld", (long long)lease->task);
  snprintf(vars[1], 160, "MUSTER_ATTEMPT=%lld", (long long)lease->attempt);
  snprintf(vars[2], 160, "MUSTER_QUEUE=%.140s", slot->worker->queue);
  snprintf(vars[3], 160, "MUSTER_WORKER_ID=%lld", (long long)worker_id(slot->worker));
  snprintf(vars[4], 160, "MUSTER_UPDATE_SEQ=%lld", (long long)worker_updates_seq(slot->worker));
  snprintf(vars[5], 160, "MUSTER_WORKER_PID=%lld", (long long)getpid());
  for (int i = 0; i < 6; i++)
    env[at++] = vars[i];
  return env;
}

/* Before starting a command: false once SIGHUP's hard stop began (no command
 * may start then); else the slot counts as spawning until slot_set_proc. */
static bool slot_spawn_begin(worker_slot_t *slot) {
  worker_t *w = slot->worker;
  pthread_mutex_lock(&w->lock);
  bool ok = !w->killing;
  if (ok)
    w->spawning++;
  pthread_mutex_unlock(&w->lock);
  return ok;
}

/* Publishes (or clears, with NULL) the running command for the main thread.
 * Publishing ends the slot's spawning (`spawned`); a command published after
 * the hard stop killed the others is killed here, so that none outlives the
 * worker (the hard stop waits for the spawning slots before it exits), and one
 * published after a second stop signal terminated the others is terminated
 * too (worker_wait sets `abandon` before it takes the lock to signal them). */
static void slot_set_proc(worker_slot_t *slot, run_proc_t *proc, int64_t task, bool spawned) {
  worker_t *w = slot->worker;
  pthread_mutex_lock(&w->lock);
  slot->proc = proc;
  atomic_store(&slot->task, task);
  if (spawned) {
    w->spawning--;
    if (w->killing) {
      if (proc)
        run_signal(proc, SIGKILL);
      pthread_cond_broadcast(&w->wake);
    } else if (proc && atomic_load(&w->abandon)) {
      run_signal(proc, SIGTERM);
    }
  }
  pthread_mutex_unlock(&w->lock);
}

/* True once SIGHUP's hard stop began (the node agent died): it kills the
 * running commands and says goodbye, which gives their leases back. */
static bool slot_hard_stopping(worker_t *w) {
  pthread_mutex_lock(&w->lock);
  bool killing = w->killing;
  pthread_mutex_unlock(&w->lock);
  return killing;
}

/*
 * The error of a command that ended badly, into `error`: its stderr tail, or
 * how it ended (`how`) when it said nothing.  Returns 1 when it exited with
 * the worker's --permanent-exit status, the task to fail for good: a line
 * above the tail says so, since the tail (a program's complaint) need not,
 * and a user reading the task should not take it for one retried and dead.
 */
static int slot_exit_error(const worker_slot_t *slot, const run_proc_t *proc, const char *how,
                           char *error, size_t size) {
  char tail[SLOT_ERROR_MAX], note[SLOT_NOTE_MAX];
  int status = slot->worker->permanent_exit;
  run_error_text(proc, tail, sizeof tail);
  if (status == 0 || !WIFEXITED(proc->status) || WEXITSTATUS(proc->status) != status) {
    snprintf(error, size, "%s", tail);
    return 0;
  }
  snprintf(note, sizeof note,
           "exit status %d is this worker's permanent-failure status (--permanent-exit %d): "
           "the task is not retried",
           status, status);
  if (strcmp(tail, how) == 0) /* stderr said nothing: the note is the whole error */
    snprintf(error, size, "%s", note);
  else
    snprintf(error, size, "%s\n%s", note, tail);
  return 1;
}

/*
 * Decides what the ended command means for the task.  A command that the hard
 * stop killed is not the task's fault and is not reported: failing it would
 * charge an attempt, and the goodbye that follows ends the lease anyway (a
 * report after it is refused lease_lost, one line of noise per running task).
 */
static void slot_report(worker_slot_t *slot, const muster_lease_t *lease, run_proc_t *proc) {
  int ok = WIFEXITED(proc->status) && WEXITSTATUS(proc->status) == 0;
  if (!ok && slot_hard_stopping(slot->worker)) {
    ; /* killed by the hard stop (see above) */
  } else if (ok) {
    slot_complete(slot, lease, proc);
  } else if (atomic_load(&slot->worker->abandon)) {
    slot_release(slot, lease); /* we interrupted it: not the task's fault */
  } else {
    char error[SLOT_ERROR_MAX + SLOT_NOTE_MAX], how[64];
    run_status_text(proc, how, sizeof how);
    int permanent = slot_exit_error(slot, proc, how, error, sizeof error);
    /* How it ended goes in the line, unless the error says it alone (no stderr). */
    bool said = strcmp(error, how) == 0 || (permanent && strchr(error, '\n') == NULL);
    slot_fail_as(slot, lease, error, permanent, said ? NULL : how);
  }
}

/*
 * The command could not be started (it was removed or lost its execute bit
 * since the worker checked it at start, or the worker cannot fork).  That is
 * the worker's fault, not the task's: the task is released, which charges no
 * attempt, and the worker stops with an error rather than fail task after
 * task until the queue is dead.
 */
static void slot_cannot_run(worker_slot_t *slot, const muster_lease_t *lease, const char *why) {
  worker_t *w = slot->worker;
  slot_release(slot, lease);
  if (!atomic_exchange(&w->fatal, 1))
    fprintf(stderr, "muster worker: slot %d: %s; task %lld released, stopping the worker\n",
            slot->index + 1, why, (long long)lease->task);
  atomic_store(&w->stopping, 1);
}

/* Runs one leased task from start to report. */
static void slot_run_task(worker_slot_t *slot, const muster_lease_t *lease) {
  json_t *payload = json_loads(lease->payload, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  const char *input = lease->payload;
  size_t input_len = strlen(lease->payload);
  if (json_is_string(payload)) { /* a string reaches the command as its raw text */
    input = json_string_value(payload);
    input_len = json_string_length(payload);
  }
  char vars[6][160], why[512];
  char **shared = slot->nheld > 0 ? worker_shared_env(slot) : NULL;
  char **env = slot->nheld > 0 && shared == NULL ? NULL : slot_env(slot, lease, vars, shared);
  run_proc_t proc;
  if (env == NULL) {
    slot_fail(slot, lease, "the worker ran out of memory");
  } else if (!slot_spawn_begin(slot)) {
    ; /* the worker is being killed: its goodbye gives the lease back */
  } else if (run_start(&proc, slot->worker->cmd, env, input, input_len, why, sizeof why) != 0) {
    slot_set_proc(slot, NULL, 0, true);
    slot_cannot_run(slot, lease, why);
  } else {
    slot_set_proc(slot, &proc, lease->task, true);
    int lost = slot_supervise(slot, lease, &proc);
    slot_set_proc(slot, NULL, 0, false);
    if (!lost)
      slot_report(slot, lease, &proc);
    run_finish(&proc);
  }
  free(env);
  worker_shared_env_free(shared);
  json_decref(payload);
}

/*
 * The slot's next lease: the one its last completion brought (its ticket is
 * taken), else one leased now.  Returns 1 with *lease, 0 without one (try
 * again), -1 when the worker must stop on an error, -2 when it ends cleanly
 * (--max-tasks used up, or stopping; see slot_lease).
 */
static int slot_next(worker_slot_t *slot, muster_lease_t **lease) {
  *lease = slot->next;
  slot->next = NULL;
  if (*lease != NULL)
    return 1;
  if (!slot_take_ticket(slot->worker))
    return -2;
  int got = slot_lease(slot, lease);
  if (got != 1)
    slot_return_ticket(slot->worker);
  return got;
}

void *worker_slot_main(void *arg) {
  worker_slot_t *slot = arg;
  worker_t *w = slot->worker;
  if (w->plugin && worker_plugin_init(w) != 0) { /* on this thread, like every plugin call */
    atomic_store(&w->fatal, 1);
    atomic_store(&w->stopping, 1);
  }
  for (;;) {
    muster_lease_t *lease = NULL;
    int got = atomic_load(&w->stopping) && slot->next == NULL ? -2 : slot_next(slot, &lease);
    if (got == -2)
      break;
    if (got < 0) {
      atomic_store(&w->fatal, 1);
      atomic_store(&w->stopping, 1);
    }
    if (got == 1 && atomic_load(&w->stopping)) {
      slot_release(slot, lease); /* leased as the stop came: give it back at once */
      slot_return_ticket(w);
    } else if (got == 1) {
      char why[800];
      if (slot->requires && worker_shared_acquire(slot, why, sizeof why) != 0)
        worker_slot_fail(slot, lease, why, 0); /* retried: the level may come, the cache return */
      else if (w->plugin)
        worker_plugin_run(slot, lease);
      else
        slot_run_task(slot, lease);
      worker_shared_release(slot);
    }
    muster_leases_free(lease, got == 1 ? 1 : 0);
  }
  worker_plugin_unload(w);
  atomic_fetch_sub(&w->live_slots, 1);
  return NULL;
}
