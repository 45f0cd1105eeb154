/*
 * crash_report.c — the crash reports of the agent's workers, kept until the
 * head has answered them.
 *
 * When a worker dies by a signal the agent did not send, the supervisor
 * queues its worker id (any thread: crash_report_queue) and the background
 * thread sends `DELETE /v1/workers/{id}?crashed=true`, which ends the worker
 * and lapses its leases at once ("worker crashed").  A worker that died
 * before it told the agent its id (between the head's answer to its
 * registration and its line on the report pipe, or before it registered at
 * all) is named by the instance the agent gave it to register with:
 * `DELETE /v1/workers/instance/I?crashed=true` ends the worker that
 * instance registered, if one did ("id": null when none: nothing to end).
 * So does a report by id that finds the id gone on the head (crash_send_one:
 * the worker may have registered anew, and died before it told that id).
 * A report is done once the head answered it, whatever it said (200, or
 * worker_not_found: it had ended the worker already, by a timeout).  One
 * that got no answer from the head (the network, a timeout, a 5xx: the head
 * is down, restarting or cut off) stays at the front of the queue: without
 * it the head would count the dead worker active, its tasks waiting under
 * its leases, for a whole worker timeout.  The queue is then held until the
 * background thread's next registration or heartbeat call (crash_retry), so
 * a head that is away costs one failed report per tick, never a busy loop;
 * the reports go in the order the workers died.  At the stop the queue gets
 * one last try and what the head does not answer is dropped with a line:
 * the head's worker timeout ends those workers.
 *
 * Why not tell the head, when the agent registers again, which workers are
 * alive, so that it ends the others?  The agent learns a worker's id only
 * after the head answered the worker's registration, so such a list can miss
 * a live worker, whose lease the head would then take away and run again;
 * and every worker that died under the agent is in this queue until the
 * head has heard of it.
 *
 * The queue is a ring of CRASH_QUEUE_MAX reports under the agent's lock; a
 * report that finds it full pushes the oldest out (a report that old is the
 * likeliest to be moot: the head's worker timeout may have ended its worker).
 * No report is lost unsaid, nor said once per report (a node whose hundreds
 * of workers died at once would flood its log): the first one dropped is
 * said at once, and how many were, once the queue empties or at the stop.
 * The head's worker timeout ends their workers (a node's heartbeat does not
 * keep its workers alive on the head).
 */
#include "node/agent.h"
#include "core/knob.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* The report `i` places after the oldest in the ring. */
static crash_report_t *crash_at(crash_queue_t *q, size_t i) {
  return &q->items[(q->first + i) % q->capacity];
}

/* The capacity MUSTER_TEST_CRASH_QUEUE_MAX asks for: for tests only, so that
 * a test overflows the queue with a few workers (test_node.py,
 * CrashQueueOverflowTest).  A value that is not 1 to CRASH_QUEUE_MAX is said
 * and ignored. */
static size_t crash_test_capacity(const node_agent_t *a) {
  const char *text = getenv("MUSTER_TEST_CRASH_QUEUE_MAX");
  if (text == NULL || text[0] == '\0')
    return CRASH_QUEUE_MAX;
  long long n;
  if (!knob_int(text, 1, CRASH_QUEUE_MAX, &n)) {
    agent_log(a,
              "MUSTER_TEST_CRASH_QUEUE_MAX=%.20s is not 1 to %d; the crash-report queue keeps %d",
              text, CRASH_QUEUE_MAX, CRASH_QUEUE_MAX);
    return CRASH_QUEUE_MAX;
  }
  agent_log(a,
            "MUSTER_TEST_CRASH_QUEUE_MAX=%lld: the crash-report queue keeps %lld (for tests only)",
            n, n);
  return (size_t)n;
}

void crash_queue_init(node_agent_t *a) {
  a->crashes.capacity = crash_test_capacity(a);
}

/* Names the worker of report `r` for the log: "worker 7" (its worker id),
 * or for one that died before it told its id, the agent's worker and the
 * instance that names it on the head (after the id it had before, when the
 * head had ended that one: crash_send_one). */
static void crash_label(const crash_report_t *r, char *buf, size_t size) {
  if (r->worker_id > 0)
    snprintf(buf, size, "worker %lld", (long long)r->worker_id);
  else if (r->gone_id > 0)
    snprintf(buf, size, "worker %lld, or the worker its instance %s registered since (pid %d)",
             (long long)r->gone_id, r->instance, r->pid);
  else
    snprintf(buf, size, "worker %d (pid %d, instance %s, which died before it told its worker id)",
             r->slot + 1, r->pid, r->instance);
}

/* Counts report `r` as dropped (lock held); true for the first since the
 * queue was last empty, which is said at once. */
static bool crash_count_drop(crash_queue_t *q, const crash_report_t *r) {
  if (q->dropped++ == 0)
    q->first_dropped = *r;
  q->last_dropped = *r;
  return q->dropped == 1;
}

/* Logs that report `dropped`, the oldest, left a full queue: the first of
 * an outage (crash_count_drop). */
static void crash_log_overflow(const node_agent_t *a, size_t capacity,
                               const crash_report_t *dropped) {
  char who[160];
  crash_label(dropped, who, sizeof who);
  agent_log(a,
            "crash reports: %zu wait for the head, the most kept; dropping the oldest, of %s, and "
            "the oldest again for each one more (how many is said once the head has the rest): "
            "the head's worker timeout (--worker-timeout-ms) ends their workers instead",
            capacity, who);
}

/* Says how many reports were dropped since the queue was last empty, if any,
 * and starts the count again (lock held). */
static void crash_log_dropped(node_agent_t *a) {
  crash_queue_t *q = &a->crashes;
  if (q->dropped == 0)
    return;
  char first[160], last[160], which[360];
  crash_label(&q->first_dropped, first, sizeof first);
  crash_label(&q->last_dropped, last, sizeof last);
  if (q->dropped == 1)
    snprintf(which, sizeof which, "of %s", first);
  else
    snprintf(which, sizeof which, "the first of %s, the last of %s", first, last);
  agent_log(a,
            "crash reports: %zu dropped unsent while the head did not answer (%s; %zu are kept "
            "at most): the head's worker timeout (--worker-timeout-ms) ends th%s worker%s",
            q->dropped, which, q->capacity, q->dropped == 1 ? "at" : "ose",
            q->dropped == 1 ? "" : "s");
  q->dropped = 0;
}

void crash_report_queue(node_agent_t *a, const node_worker_t *w) {
  crash_report_t report = {
      .worker_id = w->worker_id, .slot = w->slot, .pid = (int)w->pid, .died_ms = agent_now_ms()};
  snprintf(report.instance, sizeof report.instance, "%s", w->instance);
  crash_report_t dropped;
  bool say = false;
  pthread_mutex_lock(&a->lock);
  crash_queue_t *q = &a->crashes;
  if (q->count == q->capacity) {
    dropped = *crash_at(q, 0);
    say = crash_count_drop(q, &dropped);
    q->first = (q->first + 1) % q->capacity;
    q->count--;
  }
  *crash_at(q, q->count++) = report;
  size_t capacity = q->capacity;
  pthread_cond_signal(&a->wake);
  pthread_mutex_unlock(&a->lock);
  if (say)
    crash_log_overflow(a, capacity, &dropped);
}

bool crash_pending(const node_agent_t *a) {
  return a->crashes.count > 0 && !a->crashes.held;
}

/* Whether `err` is no answer of the head's: it was not reached, did not
 * answer in time, or failed on its side (5xx: stopping, starting, its store). */
static bool crash_unanswered(muster_err_t err) {
  int status = muster_err_http_status(err);
  return status == 0 || status >= 500;
}

/* Reads the head's reply to a crash report: the worker it ended (0: none, a
 * report by instance that found no active worker) and the leases that
 * lapsed (-1: unknown). */
static void crash_read_reply(const char *reply, long long *id, long long *released) {
  json_t *root = reply ? json_loads(reply, 0, NULL) : NULL;
  json_t *ended = json_object_get(root, "id"), *lapsed = json_object_get(root, "released");
  *id = json_is_integer(ended) ? (long long)json_integer_value(ended) : 0;
  *released = json_is_integer(lapsed) ? (long long)json_integer_value(lapsed) : -1;
  json_decref(root);
}

/* " (N leases lapsed)" into `buf`, or "" when the reply did not say. */
static void crash_lapsed(long long released, char *buf, size_t size) {
  buf[0] = '\0';
  if (released >= 0)
    snprintf(buf, size, " (%lld lease%s lapsed)", released, released == 1 ? "" : "s");
}

/* Says how the head took the report of worker `id` by its id, which had to
 * wait (`when` says how long): it ended it, or had already (`gone`). */
static void crash_log_by_id(const node_agent_t *a, long long id, bool gone, const char *when,
                            long long released) {
  char lapsed[48];
  crash_lapsed(released, lapsed, sizeof lapsed);
  if (gone)
    agent_log(a, "reported the crash of worker %lld%s: the head had ended it already (a timeout)",
              id, when);
  else
    agent_log(a, "reported the crash of worker %lld%s: the head ended it%s", id, when, lapsed);
}

/* Says how the head took the report of worker `r` by its instance, which
 * ended worker `id` (0: none was active); said always, as no other line
 * says what became of that worker on the head.  `when` says how long the
 * report waited, "" when it did not. */
static void crash_log_by_instance(const node_agent_t *a, const crash_report_t *r, const char *when,
                                  long long id, long long released) {
  char lapsed[48];
  crash_lapsed(released, lapsed, sizeof lapsed);
  if (r->gone_id > 0) /* it ended one: crash_log_answer */
    agent_log(a,
              "reported the crash of worker %lld%s: the head had ended that id already, but the "
              "worker had registered again, as worker %lld, and died before it told that id; "
              "the head ended worker %lld by its instance %s%s",
              (long long)r->gone_id, when, id, id, r->instance, lapsed);
  else if (id > 0)
    agent_log(a,
              "reported the crash of worker %d (pid %d), which died before it told its worker "
              "id, by its instance %s%s: the head ended worker %lld, which it had registered%s",
              r->slot + 1, r->pid, r->instance, when, id, lapsed);
  else
    agent_log(a,
              "reported the crash of worker %d (pid %d), which died before it told its worker "
              "id, by its instance %s%s: the head has no active worker of that instance, so "
              "nothing to end (it died before its registration reached the head, or the head "
              "had ended it already)",
              r->slot + 1, r->pid, r->instance, when);
}

/* Says how the head took report `r` (just answered with `err`), when there
 * is something to say: every refusal, every report by instance that ended a
 * worker or was one from the start, and every answer to a report that had
 * to wait (`q->failing`: a report failed since the queue was last empty). */
static void crash_log_answer(node_agent_t *a, const crash_report_t *r, muster_err_t err,
                             const char *reply, muster_client_t *client) {
  if (err != MUSTER_OK && err != MUSTER_WORKER_NOT_FOUND) {
    char who[160];
    crash_label(r, who, sizeof who);
    agent_log(a, "reporting the crash of %s: %s: %s (not sent again: the head refused it)", who,
              muster_err_name(err), muster_client_message(client));
    return;
  }
  char when[96] = "";
  if (a->crashes.failing)
    snprintf(when, sizeof when, " after %d tr%s, %.1f s after it died", r->tries,
             r->tries == 1 ? "y" : "ies", (double)(agent_now_ms() - r->died_ms) / 1000);
  long long id, released;
  crash_read_reply(reply, &id, &released);
  bool gone_only = r->gone_id > 0 && id == 0; /* by id, then by instance: nothing more */
  if (r->worker_id == 0 && !gone_only)
    crash_log_by_instance(a, r, when, id, released);
  else if (a->crashes.failing)
    crash_log_by_id(a, gone_only ? (long long)r->gone_id : (long long)r->worker_id,
                    gone_only || err == MUSTER_WORKER_NOT_FOUND, when, released);
}

/* Sends report `r` once (lock not held): by id, or by instance when there is
 * none; the head's reply in *reply (muster_free). */
static muster_err_t crash_request(muster_client_t *client, const crash_report_t *r, char **reply) {
  char path[160];
  if (r->worker_id > 0)
    snprintf(path, sizeof path, "/v1/workers/%lld?crashed=true", (long long)r->worker_id);
  else /* an instance is letters, digits, '.', '_' and '-': nothing to escape */
    snprintf(path, sizeof path, "/v1/workers/instance/%s?crashed=true", r->instance);
  *reply = NULL;
  return muster_request(client, "DELETE", path, NULL, reply);
}

/*
 * Sends report `r` (lock not held); true when the head answered it, false
 * with the error in *err and its message in the client.  A head that had
 * ended the worker of that id already (its timeout, or its node's) may have
 * heard from it since: a worker the head forgot registers anew, under
 * another id, and may have died before it told the agent that one.  So the
 * report goes on by the worker's instance, which names the new one if there
 * is one (and names it at once should the report be sent again); a head that
 * refuses that (one older than the call) leaves the answer as it was.
 */
static bool crash_send_one(node_agent_t *a, muster_client_t *client, crash_report_t *r,
                           muster_err_t *err) {
  char *reply = NULL;
  r->tries++;
  *err = crash_request(client, r, &reply);
  if (*err == MUSTER_WORKER_NOT_FOUND && r->worker_id > 0 && r->instance[0] != '\0') {
    r->gone_id = r->worker_id;
    r->worker_id = 0;
    muster_free(reply);
    *err = crash_request(client, r, &reply);
    if (!crash_unanswered(*err) && *err != MUSTER_OK)
      *err = MUSTER_WORKER_NOT_FOUND; /* refused: as the head answered the id */
  }
  bool answered = !crash_unanswered(*err);
  if (answered)
    crash_log_answer(a, r, *err, reply, client);
  muster_free(reply);
  return answered;
}

/* Says that report `r` got no answer (`err`) and is kept: the first such
 * failure since the queue was last empty. */
static void crash_log_kept(const node_agent_t *a, const crash_report_t *r, muster_err_t err,
                           muster_client_t *client) {
  char who[160];
  crash_label(r, who, sizeof who);
  agent_log(a,
            "reporting the crash of %s: %s: %s; the report is kept and sent again at each "
            "heartbeat (or registration try) until the head answers it (until then the head "
            "counts the worker active and holds its leases)",
            who, muster_err_name(err), muster_client_message(client));
}

/* Puts `r` back in front, where it was; false when the queue filled up
 * meanwhile (then `r`, the oldest, is the one to drop). */
static bool crash_requeue(crash_queue_t *q, const crash_report_t *r) {
  if (q->count == q->capacity)
    return false;
  q->first = (q->first + q->capacity - 1) % q->capacity;
  q->count++;
  *crash_at(q, 0) = *r;
  return true;
}

/* Sends the reports in order until the queue is empty or one gets no answer
 * (lock held on entry and exit; it is let go during each request).  `last`:
 * the stop's try, which also sends a held queue and leaves the failure to
 * its caller to say.  True when all were sent. */
static bool crash_send_all(node_agent_t *a, muster_client_t *client, bool last) {
  crash_queue_t *q = &a->crashes;
  while (q->count > 0 && (last || (!q->held && !a->bg_stop))) {
    crash_report_t r = *crash_at(q, 0); /* taken out: a full queue cannot push it out */
    q->first = (q->first + 1) % q->capacity;
    q->count--;
    pthread_mutex_unlock(&a->lock);
    muster_err_t err;
    bool answered = crash_send_one(a, client, &r, &err);
    pthread_mutex_lock(&a->lock);
    if (answered)
      continue;
    if (!crash_requeue(q, &r) && crash_count_drop(q, &r))
      crash_log_overflow(a, q->capacity, &r);
    if (!q->failing && !last) /* the first failure, once */
      crash_log_kept(a, &r, err, client);
    q->failing = true;
    q->held = true;
    return false;
  }
  if (q->count == 0) {
    q->failing = false;
    crash_log_dropped(a);
  }
  return q->count == 0;
}

void crash_send(node_agent_t *a, muster_client_t *client) {
  crash_send_all(a, client, false);
}

void crash_retry(node_agent_t *a) {
  a->crashes.held = false;
}

void crash_send_last(node_agent_t *a, muster_client_t *client) {
  crash_queue_t *q = &a->crashes;
  if (q->count == 0 || crash_send_all(a, client, true))
    return;
  crash_log_dropped(a);
  size_t more = q->count - 1;
  char others[64] = "";
  if (more > 0)
    snprintf(others, sizeof others, " (and %zu more)", more);
  char who[160];
  crash_label(crash_at(q, 0), who, sizeof who);
  agent_log(a,
            "stopping with the crash report of %s%s not sent: the head did not answer (%s); its "
            "worker timeout (--worker-timeout-ms, 60 s by default) ends %s and returns %s leases",
            who, others, muster_client_message(client), more > 0 ? "those workers" : "the worker",
            more > 0 ? "their" : "its");
  q->count = 0;
}
