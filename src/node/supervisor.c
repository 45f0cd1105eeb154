/*
 * supervisor.c — the agent's worker processes: start, watch, restart.
 *
 * Each worker is the `muster worker` runner of this very binary, started with
 * fork + execve from the main thread (the thread that lives as long as the
 * agent: PR_SET_PDEATHSIG fires when the *thread* that forked exits).  Between
 * fork and exec the child calls only async-signal-safe functions: it starts a
 * session of its own (so a terminal's Ctrl-C reaches the agent alone, which
 * then stops the workers in order), asks for SIGHUP when the agent dies (the
 * runner answers SIGHUP by killing its commands and leaving at once: no
 * orphans after `kill -9` of the agent), closes every descriptor but its
 * stdio and the report pipe, and resets the signals the agent handles.  Its
 * stdout and stderr are a pipe the agent reads, writing each line tagged
 * with the worker (worker_log.c).
 *
 * The session is also how the agent finds what a worker leaves behind when it
 * dies without cleaning up (`kill -9` of the worker, a crash, the OOM killer).
 * Each command's guard (run_guard.c) kills the command's process group as the
 * worker dies; what left that group (setpgid, a background process of a
 * command that has exited) still stays in the worker's session, which nothing
 * else can join, so before the dead worker is reaped (its pid, and so the
 * session id, cannot be reused while it is a zombie) every process of that
 * session is killed (worker_leftovers.c), and those that escaped the guards
 * are logged.  A command's result would be refused anyway: the crash report
 * makes its lease lapse.
 *
 * A worker tells the agent its worker id through the report pipe (fd 3,
 * MUSTER_AGENT_FD) each time it registers.  When a worker dies by a signal we
 * did not send, the agent reports the crash (`DELETE /v1/workers/{id}?crashed=
 * true`), so its leases lapse at once and the attempt counts: a task that
 * kills every worker it runs on goes dead after max_attempts instead of
 * looping.  The head answers a registration before the worker can write its
 * id down the pipe, so a worker may die registered with no id told; the
 * agent therefore chooses the instance each worker process registers with
 * (MUSTER_WORKER_INSTANCE: the agent's instance, the slot and the slot's
 * start count, never the same twice), and reports such a crash by that
 * instance (`DELETE /v1/workers/instance/I?crashed=true`, crash_report.c).
 * Restarts back off from NODE_BACKOFF_MIN_MS, doubling per quick death, up
 * to NODE_BACKOFF_MAX_MS; a worker that lived NODE_STABLE_MS counts as
 * healthy again.
 */
#include "node/agent.h"
#include "node/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define NODE_BACKOFF_MIN_MS 250
#define NODE_BACKOFF_MAX_MS 30000
#define NODE_STABLE_MS 10000
#define NODE_REPORT_FD 3
#define NODE_FD_SPARE 10  /* the child's pipes wait above this while it sets 1, 2 and 3 */
#define SUP_WORKER_VARS 6 /* per-worker environment entries */
#define SUP_VAR_MAX 128   /* one of them: CUDA_VISIBLE_DEVICES=MIG-<uuid> is the longest */

/* Variables the agent sets for its workers; inherited values are dropped. */
static const char *const sup_own_vars[] = {"MUSTER_TOKEN=",
                                           "MUSTER_AGENT_FD=",
                                           "MUSTER_NODE=",
                                           "MUSTER_GPU=",
                                           "MUSTER_URL=",
                                           "MUSTER_WORKER_SLOT=",
                                           "CUDA_VISIBLE_DEVICES=",
                                           "CUDA_DEVICE_ORDER=",
                                           "MUSTER_CACHE_URL=",
                                           "MUSTER_WORKER_INSTANCE=",
                                           NULL};

static int sup_is_own_var(const char *entry) {
  for (int i = 0; sup_own_vars[i]; i++)
    if (strncmp(entry, sup_own_vars[i], strlen(sup_own_vars[i])) == 0)
      return 1;
  return 0;
}

static char *sup_strdup(const char *s) {
  char *copy = strdup(s);
  if (copy == NULL) {
    fprintf(stderr, "muster node: out of memory\n");
    abort(); /* the daemon's one allocation policy (STYLE.md 6) */
  }
  return copy;
}

/* argv of every worker: `muster worker --url HEAD --queue Q --node NAME ...`. */
static void sup_build_argv(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  size_t ncmd = 0;
  while (cfg->cmd && cfg->cmd[ncmd])
    ncmd++;
  char **argv = calloc(24 + ncmd, sizeof *argv);
  if (argv == NULL)
    abort();
  size_t n = 0;
  char concurrency[32], permanent_exit[16];
  snprintf(concurrency, sizeof concurrency, "%lld", (long long)cfg->concurrency);
  snprintf(permanent_exit, sizeof permanent_exit, "%d", cfg->permanent_exit);
  const char *fixed[] = {a->self_exe, "worker",   "--url",  cfg->head_url,
                         "--queue",   cfg->queue, "--node", a->name};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
    argv[n++] = sup_strdup(fixed[i]);
  const char *pairs[][2] = {{"--nickname", cfg->nickname},
                            {"--plugin", cfg->plugin},
                            {"--init-data", cfg->init_data},
                            {"--concurrency", cfg->concurrency > 1 ? concurrency : NULL},
                            {"--permanent-exit", cfg->permanent_exit > 0 ? permanent_exit : NULL}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    if (pairs[i][1]) {
      argv[n++] = sup_strdup(pairs[i][0]);
      argv[n++] = sup_strdup(pairs[i][1]);
    }
  if (cfg->json_result)
    argv[n++] = sup_strdup("--json-result");
  if (ncmd > 0) {
    argv[n++] = sup_strdup("--");
    for (size_t i = 0; i < ncmd; i++)
      argv[n++] = sup_strdup(cfg->cmd[i]);
  }
  a->worker_argv = argv;
}

/* The environment template: ours minus the agent's variables, plus the
 * shared ones; SUP_WORKER_VARS free places at the end for each worker's own. */
static void sup_build_env(node_agent_t *a) {
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 5 + SUP_WORKER_VARS + 1, sizeof *env);
  if (env == NULL)
    abort();
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    if (!sup_is_own_var(environ[i]))
      env[at++] = sup_strdup(environ[i]);
  char var[600];
  snprintf(var, sizeof var, "MUSTER_AGENT_FD=%d", NODE_REPORT_FD);
  env[at++] = sup_strdup(var);
  snprintf(var, sizeof var, "MUSTER_NODE=%s", a->name);
  env[at++] = sup_strdup(var);
  if (a->cfg->token) {
    snprintf(var, sizeof var, "MUSTER_TOKEN=%s", a->cfg->token);
    env[at++] = sup_strdup(var);
  }
  if (a->cache != NULL) { /* workers read shared data through this agent's cache */
    snprintf(var, sizeof var, "MUSTER_CACHE_URL=http://%s", a->address);
    env[at++] = sup_strdup(var);
  }
  a->worker_env = env;
  a->worker_env_base = at;
}

/* Names the process about to start in slot `w` for its registrations: unique
 * per process this agent starts, and the agent's instance tells it from
 * every other agent's (NODE_WORKER_INSTANCE_MAX). */
static void sup_new_instance(node_worker_t *w) {
  w->starts++;
  snprintf(w->instance, sizeof w->instance, "%s-%d-%u", w->agent->instance, w->slot + 1, w->starts);
}

/* Fills the per-worker environment entries into `vars` and the template. */
static void sup_worker_env(node_agent_t *a, const node_worker_t *w, char vars[][SUP_VAR_MAX]) {
  size_t at = a->worker_env_base, k = 0;
  snprintf(vars[k++], SUP_VAR_MAX, "MUSTER_WORKER_SLOT=%d", w->slot);
  snprintf(vars[k++], SUP_VAR_MAX, "MUSTER_WORKER_INSTANCE=%s", w->instance);
  if (w->gpu != NULL) { /* an instance has no index: CUDA knows it by its UUID alone */
    char label[24];
    gpu_label(w->gpu, label);
    snprintf(vars[k++], SUP_VAR_MAX, "CUDA_VISIBLE_DEVICES=%s",
             w->gpu->mig >= 0 ? w->gpu->uuid : label);
    snprintf(vars[k++], SUP_VAR_MAX, "CUDA_DEVICE_ORDER=PCI_BUS_ID");
    snprintf(vars[k++], SUP_VAR_MAX, "MUSTER_GPU=%s", label);
  }
  for (size_t i = 0; i < k; i++)
    a->worker_env[at++] = vars[i];
  a->worker_env[at] = NULL;
}

/* In the child, between fork and exec: async-signal-safe calls only.  The
 * pipes are first copied above NODE_FD_SPARE, so that no dup2 below
 * overwrites one of them (an agent started with stdio closed gets pipes on
 * 1 or 2); close_range then closes the copies. */
static void sup_child(const node_agent_t *a, pid_t agent_pid, int report_fd, int out_fd) {
  setsid();
  prctl(PR_SET_PDEATHSIG, SIGHUP);
  if (getppid() != agent_pid)
    _exit(1); /* the agent died before prctl took effect */
  int report = fcntl(report_fd, F_DUPFD, NODE_FD_SPARE),
      out = fcntl(out_fd, F_DUPFD, NODE_FD_SPARE);
  if (report < 0 || out < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(out, STDERR_FILENO) < 0 ||
      dup2(report, NODE_REPORT_FD) < 0)
    _exit(1);
  close_range(NODE_REPORT_FD + 1, ~0U, 0);
  const int handled[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
    signal(handled[i], SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(a->self_exe, a->worker_argv, a->worker_env);
  _exit(127);
}

/* Reads what the worker reported: lines "worker ID". */
static void sup_read_report(node_worker_t *w) {
  for (;;) {
    ssize_t n = read(w->report_fd, w->report + w->report_len, sizeof w->report - 1 - w->report_len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        event_free(w->report_ev);
        w->report_ev = NULL;
        close(w->report_fd);
        w->report_fd = -1;
      }
      return;
    }
    w->report_len += (size_t)n;
    w->report[w->report_len] = '\0';
    char *nl;
    while ((nl = strchr(w->report, '\n')) != NULL) {
      long long id = 0;
      if (sscanf(w->report, "worker %lld", &id) == 1 && id > 0)
        w->worker_id = id;
      size_t used = (size_t)(nl + 1 - w->report);
      memmove(w->report, nl + 1, w->report_len - used + 1);
      w->report_len -= used;
    }
    if (w->report_len + 1 >= sizeof w->report)
      w->report_len = 0; /* a line too long to be ours */
  }
}

static void sup_on_report(evutil_socket_t fd, short what, void *arg) {
  sup_read_report(arg);
}

/* Records a started worker process: its pid, and the pipe its reports come
 * on (`report_fd`, read end). */
static void sup_started(node_worker_t *w, pid_t pid, int report_fd) {
  w->pid = pid;
  wlog_started(w);
  w->signalled = 0;
  w->worker_id = 0;
  w->report_len = 0;
  w->report_fd = report_fd;
  w->report_ev = event_new(w->agent->base, report_fd, EV_READ | EV_PERSIST, sup_on_report, w);
  if (w->report_ev)
    event_add(w->report_ev, NULL);
  w->started_ms = agent_now_ms();
}

/* Starts worker `w`'s process; 0 or -1 (it is then retried like a crash). */
static int sup_spawn(node_worker_t *w) {
  node_agent_t *a = w->agent;
  int fds[2], out_fd = -1;
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    agent_log(a, "worker %d: cannot create a pipe: %s", w->slot + 1, strerror(errno));
    return -1;
  }
  if (wlog_open(w, &out_fd) != 0) {
    agent_log(a, "worker %d: cannot create a pipe for its output: %s", w->slot + 1,
              strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  char vars[SUP_WORKER_VARS][SUP_VAR_MAX];
  sup_new_instance(w);
  sup_worker_env(a, w, vars);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old); /* no libevent handler may run in the child */
  pid_t agent_pid = getpid();
  pid_t pid = fork();
  if (pid == 0)
    sup_child(a, agent_pid, fds[1], out_fd);
  int fork_errno = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close(fds[1]);
  close(out_fd); /* the worker's end: its end of file is the worker's (and its children's) */
  if (pid < 0) {
    close(fds[0]);
    wlog_ended(w);
    agent_log(a, "worker %d: cannot fork: %s", w->slot + 1, strerror(fork_errno));
    return -1;
  }
  sup_started(w, pid, fds[0]);
  return 0;
}

static void sup_schedule(node_worker_t *w);

static void sup_on_restart(evutil_socket_t fd, short what, void *arg) {
  node_worker_t *w = arg;
  if (w->agent->stopping || w->pid != 0)
    return;
  if (sup_spawn(w) != 0)
    sup_schedule(w);
}

/* Schedules a restart after the backoff of `w`'s quick deaths. */
static void sup_schedule(node_worker_t *w) {
  int64_t now = agent_now_ms();
  if (now - w->started_ms < NODE_STABLE_MS)
    w->quick_deaths++;
  else
    w->quick_deaths = 1;
  int shift = w->quick_deaths > 8 ? 8 : w->quick_deaths - 1;
  long delay = (long)NODE_BACKOFF_MIN_MS << shift;
  if (delay > NODE_BACKOFF_MAX_MS)
    delay = NODE_BACKOFF_MAX_MS;
  struct timeval tv = {.tv_sec = delay / 1000, .tv_usec = (delay % 1000) * 1000};
  agent_log(w->agent, "worker %d: restarting in %ld ms", w->slot + 1, delay);
  event_add(w->restart_ev, &tv);
}

/* Describes a wait status: "exit status 1", "killed by signal 11". */
static void sup_describe(int status, char *buf, size_t size) {
  if (WIFSIGNALED(status))
    snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, size, "exit status %d", WEXITSTATUS(status));
}

/* Handles the end of worker `w`'s process. */
static void sup_ended(node_worker_t *w, int status) {
  node_agent_t *a = w->agent;
  if (w->report_fd >= 0)
    sup_read_report(w); /* its last words are in the pipe already */
  if (w->report_ev) {
    event_free(w->report_ev);
    w->report_ev = NULL;
  }
  if (w->report_fd >= 0)
    close(w->report_fd);
  w->report_fd = -1;
  char how[128];
  sup_describe(status, how, sizeof how);
  int crashed = WIFSIGNALED(status) && !w->signalled;
  if (crashed) /* by its id, or by its instance when it died before it told the id */
    crash_report_queue(a, w);
  char id[48] = ""; /* none when it ended before registering */
  if (w->worker_id > 0)
    snprintf(id, sizeof id, ", worker id %lld", (long long)w->worker_id);
  if (!a->stopping || crashed || (WIFEXITED(status) && WEXITSTATUS(status) != 0))
    agent_log(a, "worker %d (pid %d%s%s) %s: %s", w->slot + 1, (int)w->pid, id,
              w->gpu ? ", a GPU worker" : "", crashed ? "crashed" : "ended", how);
  w->pid = 0;
  w->worker_id = 0;
  if (!a->stopping)
    sup_schedule(w);
}

void sup_reap(node_agent_t *a) {
  for (;;) {
    /* Look first, reap after: the zombie keeps the session id unused while
     * its leftovers are found. */
    siginfo_t info = {0};
    if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0)
      return;
    pid_t pid = info.si_pid;
    node_worker_t *w = NULL;
    for (int i = 0; i < a->nworkers && w == NULL; i++)
      if (a->workers[i].pid == pid)
        w = &a->workers[i];
    int left = w ? wleft_kill(a, pid) : 0;
    int status;
    if (waitpid(pid, &status, 0) != pid)
      return;
    if (w == NULL)
      continue;
    wlog_ended(w); /* its last lines come before the lines about its end */
    if (left > 0)
      agent_log(a, "worker %d (pid %d) died with commands still running; killed %d process%s",
                w->slot + 1, (int)pid, left, left > 1 ? "es" : "");
    sup_ended(w, status);
    if (a->cache) /* the files it linked from the node cache, should it have died */
      cache_forget_worker(a->cache, pid);
  }
}

int sup_start(node_agent_t *a) {
  const node_config_t *cfg = a->cfg;
  if (cfg->queue == NULL || a->nworkers == 0)
    return 0;
  sup_build_argv(a);
  sup_build_env(a);
  for (int i = 0; i < a->nworkers; i++) {
    node_worker_t *w = &a->workers[i];
    w->restart_ev = event_new(a->base, -1, 0, sup_on_restart, w);
    if (w->restart_ev == NULL)
      return -1;
    w->started_ms = agent_now_ms();
    if (sup_spawn(w) != 0)
      sup_schedule(w);
  }
  return 0;
}

void sup_signal_all(node_agent_t *a, int sig) {
  for (int i = 0; i < a->nworkers; i++) {
    node_worker_t *w = &a->workers[i];
    if (w->restart_ev)
      event_del(w->restart_ev);
    if (w->pid > 0) {
      w->signalled = 1;
      kill(w->pid, sig);
    }
  }
}

int sup_running(const node_agent_t *a) {
  int running = 0;
  for (int i = 0; i < a->nworkers; i++)
    running += a->workers[i].pid > 0;
  return running;
}

void sup_free(node_agent_t *a) {
  wlog_free_all(a);
  for (int i = 0; a->workers && i < a->nworkers; i++) {
    node_worker_t *w = &a->workers[i];
    if (w->report_ev)
      event_free(w->report_ev);
    if (w->restart_ev)
      event_free(w->restart_ev);
    if (w->report_fd >= 0)
      close(w->report_fd);
  }
  free(a->workers);
  a->workers = NULL;
  for (size_t i = 0; a->worker_argv && a->worker_argv[i]; i++)
    free(a->worker_argv[i]);
  free(a->worker_argv);
  for (size_t i = 0; a->worker_env && i < a->worker_env_base; i++)
    free(a->worker_env[i]);
  free(a->worker_env);
  a->worker_argv = a->worker_env = NULL;
}
