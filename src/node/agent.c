/*
 * agent.c — `muster node --join URL`: the node agent's life.
 *
 * Start: take the machine's lock (one agent per machine), detect GPUs, decide
 * the workers (one per GPU, else --workers CPU workers), open the API port,
 * then run the event loop.  A background thread registers the node (retrying
 * until the head answers), heart-beats at a third of the node's timeout,
 * registers again when the head forgot the node, and sends crash reports
 * (kept until the head answers them: crash_report.c); it tells the loop
 * through a pipe once the node is registered, and only then are the workers
 * started (they register with `"node": NAME`).
 *
 * Stop: SIGINT/SIGTERM stop the workers gracefully (SIGTERM: they finish their
 * running tasks; a second signal passes a second SIGTERM on, which makes them
 * terminate their commands); once they are gone the API port answers 503 to
 * what still waits or comes until those answers are written (port_drain), then
 * the loop ends and the node says goodbye (DELETE /v1/nodes/NAME).
 * SIGHUP (which the agent receives when `muster head`, its parent, dies) is a
 * hard stop: SIGHUP to the workers, which kill their commands and leave at once.
 * `kill -9` of the agent needs no code here: the kernel sends each worker its
 * PR_SET_PDEATHSIG (SIGHUP), and the head's node timeout does the rest — or,
 * sooner, the next agent started with the same lock file: it finds the dead
 * one's instance in the file and registers with it as previous_instance, and
 * the head hands the node over at once (lock.c, docs/node.md).
 */
#include "node/agent.h"
#include "core/deadline.h"
#include "core/names.h"
#include "core/streak.h"
#include "node/cache.h"
#include "node/iter_local.h"
#include "client/jdump.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/http.h>
#include <event2/util.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define AGENT_RETRY_MS 1000
/* An agent the head never took that cannot reach it says, once, after this
 * long, what to check: its first line said only why the first try failed. */
#define AGENT_UNREACHED_SAY_MS 10000
#define AGENT_HARD_STOP_MS 5000 /* SIGKILL workers that ignore a hard stop this long */
#define AGENT_DEFAULT_TIMEOUT_MS 15000
/* Each request of the background thread (registration, heartbeat, crash
 * report) gives up after this long.  The stop joins that thread, so with
 * libmuster's default (60 s) a heartbeat sent to a head that stopped
 * answering (a SIGSTOP, a hung machine) held the agent's exit for up to a
 * minute; a beat later than this is no better than the next one. */
#define AGENT_BG_REQUEST_MS 5000
#define AGENT_BG_STOP_REQUEST_MS 3000 /* the same for the stop's last crash reports and goodbye */

int64_t agent_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void agent_log(const node_agent_t *a, const char *fmt, ...) {
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", a->cfg->log_prefix ? a->cfg->log_prefix : "muster node", line);
}

/*
 * Writes who holds the lock into its file: pid and instance from the start
 * (the next agent reads the instance back: lock.c), the predecessor's
 * instance while this agent is not registered (an agent started after a crash
 * of this one before that must still name the agent the head knows), and,
 * once the API port is open (`full`), name, head and address for people,
 * and, once the head took the registration, `registered` ("yes", or "no
 * (...)" where the head has no node API and the agent runs unregistered),
 * for whoever waits for the agent to join (muster.start_node); NULL before.
 */
static void agent_describe_lock(const node_agent_t *a, int full, const char *registered) {
  char info[1600], previous[160] = "", joined[80] = "";
  if (a->previous[0])
    snprintf(previous, sizeof previous, "previous_instance %s\n", a->previous);
  if (registered)
    snprintf(joined, sizeof joined, "registered %s\n", registered);
  if (!full)
    snprintf(info, sizeof info, "pid %d\ninstance %s\n%s", (int)getpid(), a->instance, previous);
  else
    snprintf(info, sizeof info, "pid %d\ninstance %s\n%sname %s\nhead %s\nlisten %s%s\n%s",
             (int)getpid(), a->instance, previous, a->name, a->cfg->head_url,
             a->listen_port > 0 ? "http://" : "none", a->listen_port > 0 ? a->address : "", joined);
  node_lock_describe(a->lock_fd, info);
}

/* Writes a lock file that names no instance of this agent, only the one it
 * inherited (`inherited`, "" for none: lock.c reads it back as the agent to
 * take over from), and why this one stops. */
static void agent_unclaim_lock(const node_agent_t *a, const char *inherited, const char *why) {
  char info[320], previous[160] = "";
  if (inherited[0])
    snprintf(previous, sizeof previous, "previous_instance %s\n", inherited);
  snprintf(info, sizeof info, "pid %d\n%sstopping: %s\n", (int)getpid(), previous, why);
  node_lock_describe(a->lock_fd, info);
}

/* After a goodbye the head accepted, the lock file names no instance: the
 * next agent has nothing to take over (the node left, its workers with it)
 * and starts without saying it took over from this one. */
static void agent_forget_instance(const node_agent_t *a) {
  agent_unclaim_lock(a, "", "its node left the head");
}

/* ---- the background thread: registration, heartbeats, crash reports ---- */

typedef struct {
  node_agent_t *a;
  muster_client_t *client;
  int notify_fd;     /* write end of the "registered" pipe */
  int registered;    /* 1 registered, 0 not yet, -1 the head has no node API */
  int failing;       /* the last call failed */
  streak_t reasons;  /* the reasons of the failure streak logged (each one once) */
  int64_t away_ms;   /* when the head stopped answering (network, 503): a monotonic time,
                      * 0 while it answers */
  int said_unreached; /* the agent_bg_unreached line was logged */
  int registrations; /* registrations the head accepted (more than one: re-registered) */
  int64_t beat_ms;   /* heartbeat interval */
  int64_t next_ms;   /* when the next registration or heartbeat is due */
  /* The last registration that failed (MUSTER_OK: none did): said at the
   * stop of an agent the head never took (agent_say_stopped). */
  muster_err_t register_err;
  char register_why[700];
} agent_bg_t;

/* The node's registration body (json). */
static json_t *agent_node_json(const node_agent_t *a) {
  json_t *gpus = json_array();
  for (int i = 0; i < a->gpus.count; i++) {
    const node_gpu_t *g = &a->gpus.gpus[i];
    json_t *gpu = json_pack("{s:i, s:s}", "index", g->index, "name", g->name);
    if (gpu && g->mig >= 0)
      json_object_set_new(gpu, "mig", json_integer(g->mig));
    if (gpu && g->memory_total_mb >= 0)
      json_object_set_new(gpu, "memory_total_mb", json_integer(g->memory_total_mb));
    if (gpu && g->memory_free_mb >= 0)
      json_object_set_new(gpu, "memory_free_mb", json_integer(g->memory_free_mb));
    json_array_append_new(gpus, gpu);
  }
  json_t *node = json_pack("{s:s, s:s, s:i, s:o, s:s}", "name", a->name, "hostname", a->hostname,
                           "cpus", a->cpus, "gpus", gpus, "instance", a->instance);
  if (node && a->address[0]) /* none: the head lists the node without one */
    json_object_set_new(node, "address", json_string(a->address));
  if (node && a->previous[0]) /* proven gone by our lock: the head need not wait for it */
    json_object_set_new(node, "previous_instance", json_string(a->previous));
  return node;
}

/* POST /v1/nodes; sets the heartbeat interval from the node's timeout. */
static muster_err_t agent_register(agent_bg_t *bg) {
  json_t *body = agent_node_json(bg->a);
  char *text = body ? jdump(body, JSON_COMPACT) : NULL, *reply = NULL;
  json_decref(body);
  if (text == NULL)
    return MUSTER_NOMEM;
  muster_err_t err = muster_request(bg->client, "POST", "/v1/nodes", text, &reply);
  free(text);
  if (err == MUSTER_OK) {
    json_t *node = json_loads(reply, 0, NULL);
    json_int_t timeout = json_integer_value(json_object_get(node, "timeout_ms"));
    bg->beat_ms = (timeout > 0 ? timeout : AGENT_DEFAULT_TIMEOUT_MS) / 3;
    if (bg->beat_ms < 50)
      bg->beat_ms = 50;
    json_decref(node);
  }
  muster_free(reply);
  return err;
}

/* The node path "/v1/nodes/NAME" + `suffix`. */
static void agent_node_path(const node_agent_t *a, const char *suffix, char *buf, size_t size) {
  snprintf(buf, size, "/v1/nodes/%s%s", a->name, suffix); /* names are [A-Za-z0-9._-] */
}

/* The heartbeat's body: the agent's instance (the head refuses a heartbeat
 * of a node another agent registered since) and the cache's counters, so
 * that the head's /metrics shows every node's hits and misses. */
static void agent_heartbeat_body(const node_agent_t *a, char *buf, size_t size) {
  if (a->cache == NULL) {
    snprintf(buf, size, "{\"instance\": \"%s\"}", a->instance);
    return;
  }
  cache_stats_t s;
  cache_stats_snapshot(a->cache, &s);
  snprintf(buf, size,
           "{\"instance\": \"%s\", \"cache\": {\"hits\": %lld, \"misses\": %lld,"
           " \"coalesced\": %lld, \"bytes_served\": %lld, \"evictions\": %lld,"
           " \"upstream_fetches\": %lld, \"fetch_failures\": %lld, \"verify_failures\": %lld}}",
           a->instance, (long long)s.hits, (long long)s.misses, (long long)s.coalesced,
           (long long)s.bytes_served, (long long)s.evictions, (long long)s.upstream_fetches,
           (long long)s.fetch_failures, (long long)s.verify_failures);
}

/*
 * The head refused the agent's token.  Retrying cannot help (the token is
 * wrong, or was revoked), so the agent stops: the loop is told through the
 * registration pipe, stops the workers like SIGTERM does, and the agent exits
 * 1.  No goodbye is sent: it would be refused too.
 */
static void agent_bg_refused(agent_bg_t *bg, muster_err_t err) {
  node_agent_t *a = bg->a;
  /* The head's 401 says where the right token is (src/core/auth.c); its 403
   * that the read-only token was sent. */
  agent_log(a, "%s: %s: %s; stopping (%s)", bg->registered == 0 ? "register" : "heartbeat",
            muster_err_name(err), muster_client_message(bg->client),
            err == MUSTER_UNAUTHORIZED
                ? "the agent's token comes from --token or MUSTER_TOKEN"
                : "check the token: --token, MUSTER_TOKEN, or the 'token' file in the "
                  "head's data dir");
  bg->registered = -1;
  bg->next_ms = INT64_MAX;
  pthread_mutex_lock(&a->lock);
  a->refused = 1;
  pthread_mutex_unlock(&a->lock);
  char one = 1;
  if (write(bg->notify_fd, &one, 1) < 0)
    agent_log(a, "cannot wake the event loop: %s", strerror(errno));
}

/* An agent that never reached its head, `AGENT_UNREACHED_SAY_MS` into its
 * retries: the likely causes, once (the retries stay quiet otherwise). */
static void agent_bg_unreached(agent_bg_t *bg, int64_t now) {
  if (bg->said_unreached || now - bg->away_ms < AGENT_UNREACHED_SAY_MS)
    return;
  bg->said_unreached = 1;
  agent_log(bg->a,
            "register: the head at %s has not been reached in %.0f s: is `muster head` "
            "running there, and is --join right (the URL the head printed as it started)? "
            "Still retrying every %d s",
            bg->a->cfg->head_url, (double)(now - bg->away_ms) / 1000, AGENT_RETRY_MS / 1000);
}

/*
 * Notes whether the head answered the call `what` ("register", "heartbeat"):
 * the first call it does not answer (network, 503: down or restarting) starts
 * an outage, and the first answer after one, whatever it says, ends it with
 * one line, "heartbeat: reached the head again after 4.4 s", as the workers
 * say it for their results.  A failed call is said when its reason is new in
 * the streak (agent_bg_failed), and retried quietly: every second to
 * register, at the heartbeat interval after that.
 */
static void agent_bg_reached(agent_bg_t *bg, const char *what, muster_err_t err) {
  int unanswered = err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
  int64_t now = agent_now_ms();
  if (bg->away_ms > 0 && !unanswered) {
    agent_log(bg->a, "%s: reached the head%s after %.1f s", what,
              bg->registrations > 0 ? " again" : "", (double)(now - bg->away_ms) / 1000);
    bg->away_ms = 0;
  } else if (bg->away_ms == 0 && unanswered) {
    bg->away_ms = now > 0 ? now : 1; /* 0 would mean no outage */
  } else if (err == MUSTER_NETWORK && bg->registrations == 0) {
    agent_bg_unreached(bg, now);
  }
}

/* Registers the node; once the head took it (or has no node API), tells the
 * loop, and drops the predecessor's instance: from now on the head knows this
 * agent's, and the lock file names this one alone. */
static muster_err_t agent_bg_register(agent_bg_t *bg) {
  node_agent_t *a = bg->a;
  muster_err_t err = agent_register(bg);
  if (err == MUSTER_INVALID && a->previous[0] &&
      strstr(muster_client_message(bg->client), "previous_instance")) {
    agent_log(a,
              "register: %s; registering without it (an older head: it waits for the node "
              "timeout instead)",
              muster_client_message(bg->client));
    a->previous[0] = '\0';
    err = agent_register(bg);
  }
  agent_bg_reached(bg, "register", err);
  if (err != MUSTER_OK && err != MUSTER_NOT_FOUND) {
    bg->register_err = err;
    snprintf(bg->register_why, sizeof bg->register_why, "%s: %s", muster_err_name(err),
             muster_client_message(bg->client));
    return err;
  }
  if (err == MUSTER_NOT_FOUND)
    agent_log(a, "the head at %s has no node API (%s); running without registering the node",
              a->cfg->head_url, muster_client_message(bg->client));
  bg->registered = err == MUSTER_OK ? 1 : -1;
  if (err == MUSTER_OK && (bg->failing || bg->registrations > 0))
    agent_log(a, "registered with the head%s", bg->registrations > 0 ? " again" : "");
  bg->registrations += err == MUSTER_OK;
  bg->failing = 0;
  a->previous[0] = '\0';
  agent_describe_lock(a, 1, err == MUSTER_OK ? "yes" : "no (the head has no node API)");
  char one = 1;
  if (write(bg->notify_fd, &one, 1) < 0)
    agent_log(a, "cannot wake the event loop: %s", strerror(errno));
  return err;
}

/* Logs a failed registration or heartbeat when its reason (the call, the
 * error and its message) is new in this streak of failures: a head that
 * first refuses connections and then answers 503 shows both, while the
 * retries of one reason stay quiet (streak.h). */
static void agent_bg_failed(agent_bg_t *bg, muster_err_t err) {
  const char *what = bg->registered == 0 ? "register" : "heartbeat";
  const char *message = muster_client_message(bg->client);
  char reason[600];
  snprintf(reason, sizeof reason, "%s %s %s", what, muster_err_name(err), message);
  streak_say_t say = streak_note(&bg->reasons, reason);
  if (say != STREAK_SEEN)
    agent_log(bg->a, "%s: %s: %s (retrying%s)", what, muster_err_name(err), message,
              say == STREAK_LAST ? "; further reasons of this failure streak are not logged" : "");
}

/*
 * Why the head refused the node's heartbeat, in the log's words.  A node it
 * holds as gone timed out there (the head says "is gone"); one it does not
 * know at all was never in its store: it lost its data, was restored from a
 * backup older than the node, or is another head at this URL.
 */
static const char *agent_forgotten_why(agent_bg_t *bg, muster_err_t err) {
  const char *said = muster_client_message(bg->client);
  if (err != MUSTER_NODE_NOT_FOUND)
    return said;
  if (strstr(said, " is gone (") != NULL)
    return "the head forgot this node (it timed out)";
  return "the head does not know this node (it lost its data, was restored from a backup, or is "
         "another head at this URL)";
}

/* Registers (when not yet) or heart-beats; decides when to call again. */
static void agent_bg_tick(agent_bg_t *bg) {
  node_agent_t *a = bg->a;
  muster_err_t err;
  if (bg->registered == 0) {
    err = agent_bg_register(bg);
  } else if (bg->registered == 1) {
    char path[200], body[512] = "{}";
    agent_node_path(a, "/heartbeat", path, sizeof path);
    agent_heartbeat_body(a, body, sizeof body);
    err = muster_request(bg->client, "POST", path, body, NULL);
    agent_bg_reached(bg, "heartbeat", err);
    if (err == MUSTER_NODE_NOT_FOUND || err == MUSTER_INVALID_STATE) {
      agent_log(a, "%s; registering again", agent_forgotten_why(bg, err));
      bg->registered = 0;
      bg->next_ms = agent_now_ms();
      return;
    }
  } else {
    err = MUSTER_OK;
  }
  if (err == MUSTER_UNAUTHORIZED || err == MUSTER_FORBIDDEN) {
    agent_bg_refused(bg, err);
    return;
  }
  if (err != MUSTER_OK)
    agent_bg_failed(bg, err);
  else
    streak_end(&bg->reasons);
  bg->failing = err != MUSTER_OK;
  int64_t wait = err != MUSTER_OK && bg->registered == 0 ? AGENT_RETRY_MS : bg->beat_ms;
  bg->next_ms = agent_now_ms() + (wait > 0 ? wait : AGENT_RETRY_MS);
}

static void *agent_bg_main(void *arg) {
  agent_bg_t *bg = arg;
  node_agent_t *a = bg->a;
  pthread_mutex_lock(&a->lock);
  while (!a->bg_stop) {
    crash_send(a, bg->client);
    if (agent_now_ms() >= bg->next_ms) {
      pthread_mutex_unlock(&a->lock);
      agent_bg_tick(bg);
      pthread_mutex_lock(&a->lock);
      crash_retry(a); /* a report the head did not answer goes again after each call */
      continue;
    }
    struct timespec until = deadline_in_ms(bg->next_ms - agent_now_ms());
    if (!crash_pending(a) && !a->bg_stop)
      pthread_cond_timedwait(&a->wake, &a->lock, &until);
  }
  /* The stop's calls wait less: a head that stopped answering holds the exit. */
  muster_client_set_timeout(bg->client, AGENT_BG_STOP_REQUEST_MS);
  crash_send_last(a, bg->client);
  pthread_mutex_unlock(&a->lock);
  if (bg->registered == 1) { /* goodbye: the node and its workers leave at once */
    char path[200];
    agent_node_path(a, "", path, sizeof path);
    muster_err_t err = muster_request(bg->client, "DELETE", path, NULL, NULL);
    /* The agent of `muster head` stops before its head (which passes the
     * stop signal on and waits), unless the head died (SIGHUP) or was told a
     * third time: a head that is stopping or gone is no news there. */
    int head_stops = a->cfg->beside_head && (err == MUSTER_UNAVAILABLE || err == MUSTER_NETWORK);
    if (err != MUSTER_OK && err != MUSTER_NODE_NOT_FOUND && !head_stops)
      agent_log(a, "leaving: %s: %s", muster_err_name(err), muster_client_message(bg->client));
    if (err == MUSTER_OK || err == MUSTER_NODE_NOT_FOUND)
      agent_forget_instance(a);
  }
  return NULL;
}

/* ---- the event loop ---- */

typedef struct {
  node_agent_t *a;
  agent_bg_t *bg;
  int signals;           /* stop signals received */
  int started;           /* workers were started */
  struct event *hard_ev; /* SIGKILL timer of a hard stop */
  bool hup_said;         /* a SIGHUP was said (a dying head may send two) */
} agent_loop_t;

/* Once the workers are gone the agent stops serving, while the loop still
 * runs so that its answers reach the clients: the node cache answers its
 * waiters, then the forwarder answers every request 503 and ends the loop
 * when those answers are written (port_drain). */
static void agent_finish_if_done(agent_loop_t *l) {
  node_agent_t *a = l->a;
  if (a->stopping && sup_running(a) == 0 && !a->port_draining) {
    a->port_draining = 1; /* the cache's answers below are waited for too */
    cache_http_stop(a);
    port_drain(a);
  }
}

static void agent_on_hard_timeout(evutil_socket_t fd, short what, void *arg) {
  agent_loop_t *l = arg;
  agent_log(l->a, "workers did not stop within %d ms; killing them", AGENT_HARD_STOP_MS);
  for (int i = 0; i < l->a->nworkers; i++)
    if (l->a->workers[i].pid > 0)
      killpg(l->a->workers[i].pid, SIGKILL);
}

#define AGENT_PF_EXITING 0x4 /* the kernel's task flag of a thread in exit (proc(5) stat) */

/* Whether the head the local agent runs beside is gone or going: no longer
 * its parent, or its main thread exiting or exited.  The kernel sends the
 * parent-death signal when the thread that forked the agent exits, and as a
 * killed head's threads exit one by one, the first comes while the agent is
 * still the head's child, its main thread in exit (PF_EXITING, then a
 * zombie). */
static bool agent_head_dying(const node_agent_t *a) {
  if (getppid() != a->cfg->head_pid)
    return true;
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)a->cfg->head_pid);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f)
    fclose(f);
  text[n] = '\0';
  const char *end = strrchr(text, ')'); /* "PID (COMM) STATE PPID ...": COMM may hold ')' */
  char state = 0;
  unsigned flags = 0;
  if (end == NULL || sscanf(end + 1, " %c %*d %*d %*d %*d %*d %u", &state, &flags) != 2)
    return true; /* no such process any more */
  return state == 'Z' || state == 'X' || (flags & AGENT_PF_EXITING) != 0;
}

/* Says a SIGHUP once.  The local agent of `muster head` gets one when its head
 * dies without stopping it (PR_SET_PDEATHSIG), e.g. by kill -9, and a second as
 * the head's last thread goes: that is said as the head's end, not as a bare
 * signal the user never sent. */
static void agent_say_hangup(agent_loop_t *l) {
  node_agent_t *a = l->a;
  if (l->hup_said)
    return;
  l->hup_said = true;
  if (a->cfg->beside_head && agent_head_dying(a))
    agent_log(a,
              "the head (pid %d) exited without stopping its local node: stopping the "
              "workers now",
              (int)a->cfg->head_pid);
  else
    agent_log(a, "got SIGHUP: stopping the workers now");
}

static void agent_on_signal(evutil_socket_t sig, short what, void *arg) {
  agent_loop_t *l = arg;
  node_agent_t *a = l->a;
  if (sig == SIGCHLD) {
    sup_reap(a);
    agent_finish_if_done(l);
    return;
  }
  if (sig == SIGHUP) {
    agent_say_hangup(l);
    a->stopping = 2;
    sup_signal_all(a, SIGHUP);
    struct timeval tv = {AGENT_HARD_STOP_MS / 1000, 0};
    if (l->hard_ev == NULL)
      l->hard_ev = evtimer_new(a->base, agent_on_hard_timeout, l);
    if (l->hard_ev)
      evtimer_add(l->hard_ev, &tv);
  } else if (++l->signals == 1) {
    agent_log(a,
              "got signal %d: stopping the workers after their running tasks "
              "(signal again to stop them now)",
              (int)sig);
    a->stopping = a->stopping ? a->stopping : 1;
    sup_signal_all(a, SIGTERM);
  } else {
    agent_log(a, "got signal %d again: terminating the workers' tasks", (int)sig);
    sup_signal_all(a, SIGTERM);
  }
  agent_finish_if_done(l);
}

/* The background thread registered the node: start the workers once. */
static void agent_on_registered(evutil_socket_t fd, short what, void *arg) {
  agent_loop_t *l = arg;
  node_agent_t *a = l->a;
  char buf[16];
  while (read(fd, buf, sizeof buf) > 0)
    ;
  pthread_mutex_lock(&a->lock);
  int refused = a->refused;
  pthread_mutex_unlock(&a->lock);
  if (refused) { /* the head refused our token (agent_bg_refused said so) */
    a->stopping = a->stopping ? a->stopping : 1;
    sup_signal_all(a, SIGTERM);
    agent_finish_if_done(l);
    return;
  }
  if (l->started || a->stopping)
    return;
  l->started = 1;
  if (sup_start(a) != 0)
    agent_log(a, "cannot start the workers");
  else if (a->nworkers > 0)
    agent_log(a, "started %d worker%s on queue %s", a->nworkers, a->nworkers > 1 ? "s" : "",
              a->cfg->queue);
}

/* ---- setup ---- */

/* The name, hostname, CPU count and path of this binary; 0, -2 for a bad
 * node name (the caller's mistake: exit status 2), or -1. */
static int agent_identity(node_agent_t *a) {
  if (gethostname(a->hostname, sizeof a->hostname - 1) != 0)
    snprintf(a->hostname, sizeof a->hostname, "localhost");
  const char *name = a->cfg->name ? a->cfg->name : a->hostname;
  size_t len = strlen(name);
  if (!name_is_valid(name)) {
    agent_log(a, "node name '%s': %s (--name)", name, name_rule_text(name));
    return -2;
  }
  memcpy(a->name, name, len + 1); /* len <= 128 < sizeof a->name */
  /* Tells the head this process from another agent under the same name. */
  unsigned char rnd[(sizeof a->instance - 1) / 2];
  evutil_secure_rng_get_bytes(rnd, sizeof rnd);
  for (size_t i = 0; i < sizeof rnd; i++)
    snprintf(a->instance + 2 * i, 3, "%02x", rnd[i]);
  ssize_t n = readlink("/proc/self/exe", a->self_exe, sizeof a->self_exe - 1);
  if (n <= 0) {
    agent_log(a, "cannot find this program's path: %s", strerror(errno));
    return -1;
  }
  a->self_exe[n] = '\0';
  cpu_set_t set;
  a->cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return 0;
}

/* The local address this machine uses to reach the head (for a wildcard listen). */
static void agent_outgoing_ip(const node_agent_t *a, char *buf, size_t size) {
  snprintf(buf, size, "127.0.0.1");
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *res = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", a->head_port > 0 ? a->head_port : 80);
  if (getaddrinfo(a->head_host, port, &hints, &res) != 0 || res == NULL)
    return;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
    getnameinfo((struct sockaddr *)&ss, len, buf, (socklen_t)size, NULL, 0, NI_NUMERICHOST);
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
}

/* Opens the API port (unless --listen none) and fills a->address.  Without
 * a port the agent has no address of its own and registers none (the head
 * never calls its agents; the address is for people and clients) — except
 * the agent beside `muster head`, for which the head's port serves the API
 * on that machine (docs/node.md). */
static int agent_listen(node_agent_t *a) {
  const char *listen = a->cfg->listen ? a->cfg->listen : "127.0.0.1:7371";
  if (strcmp(listen, "none") == 0 && !a->cfg->beside_head) {
    a->address[0] = '\0';
    return 0;
  }
  if (strcmp(listen, "none") == 0) {
    struct evhttp_uri *uri = evhttp_uri_parse(a->cfg->head_url);
    const char *host = uri ? evhttp_uri_get_host(uri) : NULL;
    int port = uri ? evhttp_uri_get_port(uri) : -1;
    snprintf(a->address, sizeof a->address, "%s:%d", host ? host : "", port > 0 ? port : 80);
    if (uri)
      evhttp_uri_free(uri);
    return 0;
  }
  char err[512];
  int port = port_start(a, listen, err, sizeof err);
  if (port < 0) {
    agent_log(a, "%s", err);
    return -1;
  }
  if (home_dir_check(a) != 0 || cache_http_start(a) != 0 || iter_local_start(a) != 0)
    return -1;
  char host[256];
  snprintf(host, sizeof host, "%.*s", (int)(strrchr(listen, ':') - listen), listen);
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 || strcmp(host, "::") == 0 ||
      host[0] == '\0')
    agent_outgoing_ip(a, host, sizeof host);
  snprintf(a->address, sizeof a->address, "%s:%d", host, port);
  return 0;
}

/* Prints the banner, then writes who we are into the lock file (whoever
 * waits for the file's `listen` line finds the banner printed). */
static void agent_announce(node_agent_t *a) {
  char took[400] = "";
  if (a->previous[0])
    snprintf(took, sizeof took,
             "; taking over from instance %s, the agent that held lock %s before (gone)",
             a->previous, a->lock_path);
  agent_log(a, "node %s (pid %d) joining %s; %s%s; %d worker%s%s", a->name, (int)getpid(),
            a->cfg->head_url, a->listen_port > 0 ? "API on http://" : "no API port",
            a->listen_port > 0 ? a->address : "", a->nworkers, a->nworkers == 1 ? "" : "s", took);
  agent_describe_lock(a, 1, NULL);
}

/* Runs the loop with the background thread beside it. */
static int agent_run(node_agent_t *a, agent_bg_t *bg, int notify[2]) {
  agent_loop_t loop = {.a = a, .bg = bg};
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  struct event *events[5] = {0};
  int ok = 1;
  for (int i = 0; i < 4 && ok; i++)
    ok = (events[i] = evsignal_new(a->base, sigs[i], agent_on_signal, &loop)) != NULL &&
         event_add(events[i], NULL) == 0;
  if (ok)
    ok = (events[4] = event_new(a->base, notify[0], EV_READ | EV_PERSIST, agent_on_registered,
                                &loop)) != NULL &&
         event_add(events[4], NULL) == 0;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old); /* the thread takes no signal */
  ok = ok && pthread_create(&a->bg, NULL, agent_bg_main, bg) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (ok) {
    event_base_dispatch(a->base);
    pthread_mutex_lock(&a->lock);
    a->bg_stop = 1;
    pthread_cond_signal(&a->wake);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->bg, NULL);
  }
  for (int i = 0; i < 5; i++)
    if (events[i])
      event_free(events[i]);
  if (loop.hard_ev)
    event_free(loop.hard_ev);
  return ok ? 0 : 1;
}

/* Takes the machine's lock (one agent per machine) and reads from it the
 * instance of the agent that held it before, if any; -1 after saying why not
 * (another agent holds it, or the file cannot be used). */
static int agent_take_lock(node_agent_t *a) {
  const char *lock_path = a->cfg->lock_path ? a->cfg->lock_path : getenv("MUSTER_NODE_LOCK");
  char err[1024];
  a->lock_path = lock_path && lock_path[0] ? lock_path : NODE_DEFAULT_LOCK;
  a->lock_fd = node_lock_take(a->lock_path, err, sizeof err);
  if (a->lock_fd == NODE_LOCK_BUSY && a->cfg->lock_busy_ok) /* the head goes on */
    agent_log(a,
              "%s; the head runs on without a local node agent, so no worker of its own: to run "
              "one beside that agent, start the head with a --lock-file PATH and a --name NAME of "
              "its own; --server-only runs the head alone",
              err);
  else if (a->lock_fd == NODE_LOCK_BUSY)
    agent_log(a,
              "%s; stop it first: one agent per machine (to try several on one machine, give "
              "each its own --lock-file PATH, --name NAME and --listen ADDR:PORT)",
              err);
  else if (a->lock_fd < 0)
    agent_log(a, "%s", err);
  if (a->lock_fd < 0)
    return -1;
  node_lock_previous(a->lock_fd, a->previous, sizeof a->previous);
  agent_describe_lock(a, 0, NULL);
  return 0;
}

/* The lock and condition the loop and the background thread share; the
 * condition's timed waits (heartbeats) run on the monotonic clock, which a
 * change of the wall clock does not move. */
static void agent_sync_init(node_agent_t *a) {
  pthread_mutex_init(&a->lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&a->wake, &attr);
  pthread_condattr_destroy(&attr);
}

/*
 * The stop's last line, once the loop and the background thread ended: the
 * node stopped; or, when the head never took its registration, that it did
 * not start, and why.  Returns the exit status: 1 when the head refused the
 * registration (another running agent holds the node's name, say: a mistake
 * to fix, as a refused token is), 0 otherwise (stopped while the head did not
 * answer, or before the first try).
 */
static int agent_say_stopped(const node_agent_t *a, const agent_bg_t *bg) {
  if (bg->registrations > 0 || bg->registered != 0) {
    agent_log(a, "node %s stopped", a->name);
    return 0;
  }
  if (bg->register_err == MUSTER_OK) {
    agent_log(a, "node %s stopped before it registered with the head; no worker was started",
              a->name);
    return 0;
  }
  int status = muster_err_http_status(bg->register_err);
  bool refused = status >= 400 && status < 500;
  agent_log(a, "node %s did not start: the head %s its registration (%s); no worker was started",
            a->name, refused ? "refused" : "did not take", bg->register_why);
  return refused ? 1 : 0;
}

/* Plans the workers, opens the API port and the client, then runs the agent
 * until it stops; returns the exit status (2: a bad GPU list).  What it set
 * up is left for agent_release, also when a step fails. */
static int agent_serve(node_agent_t *a, agent_bg_t *bg, int notify[2]) {
  const node_config_t *cfg = a->cfg;
  int rc = 0;
  a->base = event_base_new();
  if (a->base && (rc = plan_workers(a)) == 0 && agent_listen(a) == 0 &&
      pipe2(notify, O_CLOEXEC | O_NONBLOCK) == 0 &&
      muster_client_new(cfg->head_url, cfg->token, &bg->client) == MUSTER_OK) {
    bg->notify_fd = notify[1];
    muster_client_set_timeout(bg->client, AGENT_BG_REQUEST_MS);
    agent_announce(a);
    int status = agent_run(a, bg, notify);
    if (a->refused)
      status = 1;
    if (status == 0)
      status = agent_say_stopped(a, bg);
    return status;
  }
  /* Nothing was sent to the head: the file names what this agent found
   * there, and the next agent takes over from that one, if any, and never
   * from this one, which the head never knew. */
  agent_unclaim_lock(a, a->previous, "it failed to start, before registering");
  return rc == -2 ? 2 : 1;
}

/* Stops and frees everything agent_serve may have set up (each stop and free
 * takes what was never started), then gives the lock back. */
static void agent_release(node_agent_t *a, agent_bg_t *bg, int notify[2]) {
  cache_http_stop(a);
  port_stop(a);
  iter_local_stop(a);
  cache_http_free(a);
  sup_free(a);
  muster_client_free(bg->client);
  for (int i = 0; i < 2; i++)
    if (notify[i] >= 0)
      close(notify[i]);
  if (a->base)
    event_base_free(a->base);
  pthread_cond_destroy(&a->wake);
  pthread_mutex_destroy(&a->lock);
  close(a->lock_fd);
}

int node_agent_main(const node_config_t *cfg) {
  node_agent_t a;
  memset(&a, 0, sizeof a);
  a.cfg = cfg;
  a.lock_fd = -1;
  int rc = agent_identity(&a);
  if (rc != 0)
    return rc == -2 ? 2 : 1;
  if (agent_take_lock(&a) != 0)
    return cfg->lock_busy_ok ? 0 : 1;
  signal(SIGPIPE, SIG_IGN);
  agent_sync_init(&a);
  crash_queue_init(&a);
  int notify[2] = {-1, -1};
  agent_bg_t bg = {.a = &a};
  int status = agent_serve(&a, &bg, notify);
  agent_release(&a, &bg, notify);
  return status;
}
