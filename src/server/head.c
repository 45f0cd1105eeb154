/*
 * head.c — `muster head`: options, data dir, the event loop (its group
 * commit is head_commit.c), the sweep timer and clean shutdown.
 *
 * The data dir holds muster.db (the store), token (the admin token, 0600),
 * url (where the head listens, written once it does), head.lock (held
 * with flock for the head's life, so two heads never share one store),
 * shared/ (shared.h) and backups/ (backup.h).
 */
#include "head.h"
#include "backup.h"
#include "head_commit.h"
#include "compat.h"
#include "compat_bounds.h"
#include "http.h"
#include "iter.h"
#include "lease.h"
#include "log.h"
#include "node.h"
#include "reaper.h"
#include "reply_budget.h"
#include "routes_pool.h"
#include "server.h"
#include "leftover.h"
#include "session.h"
#include "shared.h"
#include "shared_upload.h"
#include "store.h"
#include "waiter.h"
#include "worker.h"
#include "worker_ended.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The most open files the head asks for (head_raise_nofile). */
#define HEAD_NOFILE_MAX ((rlim_t)1 << 20)

static volatile sig_atomic_t head_signalled;

/* Takes the data dir's lock; refuses when another head holds it. */
static int head_lock(const head_config_t *cfg) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/head.lock", cfg->data_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_msg(LOG_ERROR, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = "";
    ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    log_msg(LOG_ERROR,
            "another head (pid %s) is using data dir %s; stop it or pick another "
            "--data-dir",
            pid[0] ? pid : "?", cfg->data_dir);
    close(fd);
    return -1;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
    log_msg(LOG_WARN, "cannot write pid to %s", path);
  return fd;
}

/* Writes `text` to DATA_DIR/name atomically (temp file + rename): 0, or the
 * errno of what failed, the temp file removed (a full disk keeps the file
 * as it was). */
static int head_write_file(const head_config_t *cfg, const char *name, const char *text,
                           mode_t mode) {
  char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
  snprintf(path, sizeof path, "%s/%s", cfg->data_dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    return errno;
  size_t len = strlen(text);
  errno = 0;
  int err = 0;
  if (write(fd, text, len) != (ssize_t)len)
    err = errno ? errno : ENOSPC; /* a short write: the disk filled up */
  else if (fsync(fd) != 0)
    err = errno;
  close(fd);
  if (err == 0 && rename(tmp, path) != 0)
    err = errno;
  if (err != 0)
    unlink(tmp);
  return err;
}

/* Loads DATA_DIR/token, or generates and saves a new random one. */
static bool head_token(head_config_t *cfg, bool *generated) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/token", cfg->data_dir);
  *generated = false;
  FILE *fp = fopen(path, "r");
  if (fp) {
    char line[1024], why[160];
    bool ok = fgets(line, sizeof line, fp) != NULL;
    fclose(fp);
    line[ok ? strcspn(line, "\r\n") : 0] = '\0';
    if (head_token_problem(line, sizeof cfg->token - 1, why, sizeof why)) {
      log_msg(LOG_ERROR,
              "the token in %s %s: correct it, or remove the file and a new one is "
              "generated",
              path, why);
      return false;
    }
    memcpy(cfg->token, line, strlen(line) + 1); /* fits: checked above */
    return true;
  }
  unsigned char raw[24];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
    return false;
  for (size_t i = 0; i < sizeof raw; i++)
    snprintf(cfg->token + 2 * i, 3, "%02x", raw[i]);
  *generated = true;
  char line[sizeof cfg->token + 1];
  snprintf(line, sizeof line, "%s\n", cfg->token);
  int err = head_write_file(cfg, "token", line, 0600);
  if (err == 0)
    return true;
  log_msg(LOG_ERROR, "cannot create %s: %s", path, strerror(err));
  return false;
}

/*
 * A sweep far later than its period means the process did not run (it was
 * stopped, starved, the machine paused, a disk stalled the loop) or the wall
 * clock jumped ahead.  The heartbeats of that time wait unread in the
 * sockets, and this sweep runs before they are read: counting the gap as
 * their silence would end every worker, node and session at once, with the
 * tasks they were running, though none had stopped.  So their timeouts count
 * from now, as after a restart (store_note_stall); task leases keep their
 * deadlines, as across a restart (an iteration's, kept alive by its ranks'
 * calls, follow the ranks: iter_any_due).  A disk that holds a flush of the
 * WAL on the helper thread does not stall the loop: head_flush_stalled.
 */
static void head_note_stall(head_t *h, int64_t now) {
  int64_t last = h->last_sweep_ms;
  h->last_sweep_ms = now;
  int64_t late = now - last - h->cfg.sweep_ms;
  if (late < HEAD_STALL_MS + h->cfg.sweep_ms)
    return;
  store_note_stall(h->st, now);
  log_msg(LOG_WARN,
          "the head did not run for %.1f s (its process was stopped or starved, the "
          "machine paused, or the clock jumped ahead): nobody could reach it meanwhile, so "
          "workers, nodes and sessions get their whole timeout from now before they count "
          "as gone, as after a restart",
          (double)(now - last) / 1000.0);
}

static void head_sweep(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  fail_t f = {0};
  int64_t now = now_ms();
  head_note_stall(h, now);
  /* While the disk holds a flush, its replies and those gathered behind it
   * cannot leave: a node that registered meanwhile cannot know it and beat.
   * Their silence counts from now, so the due-checks below find none silent
   * (their "?2 + timeout_ms <= ?1"), with no check on the requests' path. */
  if (head_flush_stalled(h))
    store_note_stall(h->st, now);
  waiter_mark_all(h);
  if (!backup_holds_files(h)) /* a backup links the files its copy names */
    shared_files_sweep(h->st, h->cfg.data_dir);
  /* Most sweeps find nothing due: check with two indexed reads before
   * opening a transaction. */
  if (!lease_any_due(h->st, now) && !worker_any_due(h->st, now) && !iter_any_due(h->st, now) &&
      !node_any_due(h->st, now) && !session_any_due(h->st, now) && !shared_any_due(h->st, now)) {
    if (h->ndirty > 0 && !store_in_tx(h->st) && store_request_begin(h->st, &f) == MUSTER_OK)
      store_request_end(h->st, true); /* opens the turn so waiter_serve runs */
    return;
  }
  if (store_request_begin(h->st, &f))
    return;
  bool ok = lease_expire_due(h->st, now, 1000) >= 0 && worker_expire_due(h->st, now) >= 0 &&
            iter_expire_due(h->st, now) >= 0 && node_expire_due(h->st, now) >= 0 &&
            session_expire_due(h->st, now, results_waiters_busy, h) >= 0 &&
            shared_expire_due(h->st, now) >= 0;
  store_request_end(h->st, ok);
  if (store_sessions_closing(h->st)) /* an expired session left tasks to delete */
    reaper_wake(h);
}

/* Stops the head: parked long-polls are answered, what is committed is
 * flushed, and the loop ends after a short grace. */
static void head_stop(head_t *h) {
  h->stopping = true;
  head_signalled = 1;
  waiter_release_all(h);
  results_waiters_release_all(h);
  reaper_release_all(h);
  shared_upload_abort_all(h);
  backup_stop(h);
  if (store_in_tx(h->st))
    head_commit(-1, 0, h);
  head_drain_syncs(h);
  /* The answers to parked long-polls are queued on their connections; a few
   * more turns of the loop write what the sockets did not take at once. */
  struct timeval grace = {.tv_sec = 0, .tv_usec = 100 * 1000};
  event_base_loopexit(h->base, &grace);
}

/* A stop signal.  With a local node agent alive the first two go to it (its
 * workers finish their running tasks, then stop them): the head serves their
 * last results and goodbyes, and stops once the agent has gone
 * (head_on_agent_exit).  A third signal, or one without an agent, stops the
 * head at once. */
static void head_on_signal(evutil_socket_t sig, short what, void *arg) {
  head_t *h = arg;
  const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  if (h->agent_pid > 0 && ++h->signals <= 2 && kill(h->agent_pid, (int)sig) == 0) {
    if (h->signals == 1)
      log_msg(LOG_INFO,
              "received %s; stopping the local node first: its workers finish their "
              "running tasks (signal again to stop them now)",
              name);
    else
      log_msg(LOG_INFO,
              "received %s again; the local node stops its workers now (signal a third "
              "time to stop the head at once)",
              name);
    return;
  }
  log_msg(LOG_INFO, "received %s; shutting down", name);
  head_stop(h);
}

/* The local node agent exited (its pipe's end of file): after a stop signal
 * the head follows it. */
static void head_on_agent_exit(evutil_socket_t fd, short what, void *arg) {
  head_t *h = arg;
  char buf[64];
  ssize_t n = read(fd, buf, sizeof buf);
  if (n > 0 || (n < 0 && errno == EINTR))
    return;
  event_del(h->agent_ev);
  h->agent_pid = 0;
  if (h->signals > 0 && !h->stopping) {
    log_msg(LOG_INFO, "the local node stopped; shutting down");
    head_stop(h);
  }
}

/* The loop's base.  With epoll's change list, an event turned off and on
 * again within one loop turn costs no system call.  The HTTP server (h1.c)
 * keeps a connection's read event armed anyway and arms its write event only
 * when a socket is full, so this matters little now; it is kept for the
 * timers and the syncer's pipe.  (The change list is unsafe only with dup'ed
 * descriptors, which the head never registers.) */
static struct event_base *head_event_base(void) {
  struct event_config *cfg = event_config_new();
  if (cfg == NULL)
    return event_base_new();
  event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
  struct event_base *base = event_base_new_with_config(cfg);
  event_config_free(cfg);
  return base;
}

/* Prints `word` as one shell word: as it is when every character is safe,
 * else in single quotes (a quote inside becomes '\''). */
static void head_print_shell_word(const char *word) {
  if (word[0] && strspn(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                              "0123456789_./-:@%+=,") == strlen(word)) {
    fputs(word, stdout);
    return;
  }
  putchar('\'');
  for (const char *c = word; *c; c++)
    if (*c == '\'')
      fputs("'\\''", stdout);
    else
      putchar(*c);
  putchar('\'');
}

/*
 * Prints the banner's hint for the CLI, which reads the URL and token from
 * ./muster-data unless told another data dir: a head started with another
 * --data-dir names it, so the command works where the head was started (and
 * anywhere on this machine when the dir is absolute).
 */
static void head_print_cli_hint(const char *dir) {
  const char *plain = strncmp(dir, "./", 2) == 0 ? dir + 2 : dir;
  size_t len = strlen(plain);
  while (len > 1 && plain[len - 1] == '/')
    len--;
  if (len == strlen("muster-data") && strncmp(plain, "muster-data", len) == 0) {
    printf("  or:        muster status   (run here: it reads the URL and token in %s)\n", dir);
    return;
  }
  printf("  or:        muster status --data-dir ");
  head_print_shell_word(dir);
  printf("   (%sit reads the URL and token there)\n", dir[0] == '/' ? "" : "run here: ");
}

/*
 * Writes DATA_DIR/url, where the CLI finds the head.  When it cannot (a full
 * disk), a url file that a killed head left is removed unless it names this
 * very URL: the CLI would send its requests to an address no head of this
 * data dir answers, or another program's.  Either way the log says how to
 * reach this head.
 */
static void head_write_url(const head_config_t *cfg, const char *url) {
  char line[320], old[320] = "", path[PATH_MAX + 16];
  snprintf(line, sizeof line, "%s\n", url);
  int err = head_write_file(cfg, "url", line, 0644);
  if (err == 0)
    return;
  snprintf(path, sizeof path, "%s/url", cfg->data_dir);
  FILE *fp = fopen(path, "r");
  if (fp != NULL) {
    if (fgets(old, sizeof old, fp) == NULL)
      old[0] = '\0';
    fclose(fp);
  }
  if (strcmp(old, line) == 0)
    return; /* the file a head before left says the same: the CLI finds this one */
  unlink(path);
  log_msg(LOG_WARN,
          "cannot write %s: %s; the CLI does not find this head through its data dir, so "
          "give it --url %s (or MUSTER_URL)",
          path, strerror(err), url);
}

static void head_banner(const head_t *h, int port, bool generated) {
  const char *host = h->cfg.listen_host;
  bool v6 = strchr(host, ':') != NULL;
  char url[300];
  snprintf(url, sizeof url, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
  head_write_url(&h->cfg, url);
  printf("muster head %s listening on %s\n"
         "  data dir:  %s (SQLite, sync=%s)\n"
         "  token:     %s%s\n"
         "  dashboard: %s/   (sign in with %s)\n"
         "  try:       curl -H ",
         MUSTER_VERSION, url, h->cfg.data_dir, h->cfg.sync_full ? "full" : "normal", h->cfg.token,
         generated ? " (new; saved in the data dir's 'token' file)" : "", url,
         h->cfg.read_token[0] ? "the --dashboard-token, or the token above" : "the token above");
  char header[sizeof h->cfg.token + 32];
  snprintf(header, sizeof header, "Authorization: Bearer %s", h->cfg.token);
  head_print_shell_word(header); /* a token may hold a quote */
  printf(" %s/v1/queues\n", url);
  head_print_cli_hint(h->cfg.data_dir);
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0) {
    char name[256] = "HOST";
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
      snprintf(name, sizeof name, "HOST");
    printf("  others:    http://%s:%d (this machine's name or address; for --url and "
           "muster node --join)\n",
           name, port);
  }
  fflush(stdout);
}

/* Watches the head's local node agent, when it has one, for its exit. */
static void head_watch_agent(head_t *h, const head_agent_t *agent) {
  if (agent == NULL || agent->pid <= 0 || agent->exit_fd < 0)
    return;
  h->agent_ev = event_new(h->base, agent->exit_fd, EV_READ | EV_PERSIST, head_on_agent_exit, h);
  if (h->agent_ev != NULL && event_add(h->agent_ev, NULL) == 0)
    h->agent_pid = agent->pid;
}

/* Runs the head already listening on `port` until a signal stops it. */
static int head_run(head_t *h, bool generated, int port, const head_agent_t *agent) {
  head_watch_agent(h, agent);
  struct event *sigint = evsignal_new(h->base, SIGINT, head_on_signal, h);
  struct event *sigterm = evsignal_new(h->base, SIGTERM, head_on_signal, h);
  h->commit_ev = event_new(h->base, -1, 0, head_commit, h);
  h->sweep_ev = event_new(h->base, -1, EV_PERSIST, head_sweep, h);
  h->reaper = reaper_new(h);
  reply_budget_init();
  worker_ended_init();
  compat_bounds_init();
  struct timeval sweep = {.tv_sec = h->cfg.sweep_ms / 1000,
                          .tv_usec = (h->cfg.sweep_ms % 1000) * 1000};
  int status = 1;
  if (sigint && sigterm && h->commit_ev && h->sweep_ev && h->reaper &&
      event_add(sigint, NULL) == 0 && event_add(sigterm, NULL) == 0 &&
      event_add(h->sweep_ev, &sweep) == 0) {
    head_banner(h, port, generated);
    log_msg(LOG_INFO, "listening on port %d", port);
    h->last_sweep_ms = now_ms(); /* the sweep's period starts here */
    event_base_dispatch(h->base);
    status = 0;
  }
  backup_stop(h); /* after a failed flush, which ends the loop without head_stop */
  if (store_in_tx(h->st))
    head_commit(-1, 0, h);
  head_drain_syncs(h);
  http_stop(h);
  if (h->sync_failed)
    status = 1;
  event_free(sigint);
  event_free(sigterm);
  if (h->agent_ev)
    event_free(h->agent_ev);
  event_free(h->commit_ev);
  event_free(h->sweep_ev);
  reaper_release_all(h); /* none is left after head_stop; a failed start has none */
  reaper_free(h->reaper);
  h->reaper = NULL;
  return status;
}

/* Locks the data dir and settles the token (--token, the token file, or a
 * new one: *generated).  The lock's fd, or -1 having said why. */
static int head_take_dir(head_config_t *cfg, const char *token_arg, bool *generated) {
  int lock = head_lock(cfg); /* says why when it fails */
  if (lock < 0)
    return -1; /* nothing of the data dir is touched: another head may be using it */
  if (token_arg) {
    /* Saved too, so that the CLI run next to the data dir finds it. */
    snprintf(cfg->token, sizeof cfg->token, "%s", token_arg);
    char line[sizeof cfg->token + 1];
    snprintf(line, sizeof line, "%s\n", token_arg);
    int err = head_write_file(cfg, "token", line, 0600);
    if (err != 0)
      log_msg(LOG_WARN,
              "cannot write %s/token: %s; the CLI reads the token there when it is given none, "
              "so give it --token (or MUSTER_TOKEN) for this head",
              cfg->data_dir, strerror(err));
  } else if (!head_token(cfg, generated)) { /* a bad token file said why */
    close(lock);
    return -1;
  }
  return lock;
}

/* Opens the store in the locked data dir and serves until stopped: the exit
 * status. */
static int head_serve(head_t *h, bool generated, int port, const head_agent_t *agent) {
  char db_path[PATH_MAX + 16];
  snprintf(db_path, sizeof db_path, "%s/muster.db", h->cfg.data_dir);
  fail_t f = {0};
  /* synchronous=NORMAL: with --sync full the WAL is flushed by the syncer. */
  h->st = store_open(&(store_opts_t){.path = db_path, .sync_full = false}, &f);
  if (h->st == NULL) {
    log_msg(LOG_ERROR, "cannot open the store %s: %s", db_path, fail_message(&f));
  } else if (compat_setup(h->st, &f) != MUSTER_OK) {
    log_msg(LOG_ERROR, "--distcompute: %s", fail_message(&f));
  } else if (shared_files_init(h->st, h->cfg.data_dir, &f) != MUSTER_OK) {
    log_msg(LOG_ERROR, "shared data: %s", fail_message(&f));
  } else {
    /* What sessions closed before left to the background deletion: the
     * leases step over it from the first (leftover.h).  A failure only
     * leaves it to the first lease. */
    if (leftover_load(h->st, &f) != MUSTER_OK)
      log_msg(LOG_WARN, "closed sessions' tasks: %s", fail_message(&f));
    backup_remove_unfinished(h->cfg.data_dir);
    signal(SIGPIPE, SIG_IGN);
    store_set_hooks(h->st, head_on_tx, head_on_ready, h);
    store_set_session_hook(h->st, head_on_session);
    head_start_syncer(h, db_path);
    h->started_ms = now_ms();
    int status = head_run(h, generated, port, agent);
    if (status == 0)
      log_msg(LOG_INFO, "stopped cleanly after %llu requests and %llu commits",
              (unsigned long long)h->requests, (unsigned long long)h->commits);
    return status;
  }
  return 1;
}

/* What `muster head` runs with unless told otherwise (docs/cli.md). */
static const head_config_t head_defaults = {.listen_host = "127.0.0.1",
                                            .listen_port = 7370,
                                            .data_dir = "./muster-data",
                                            .sync_full = true,
                                            .worker_timeout_ms = WORKER_DEFAULT_TIMEOUT_MS,
                                            .node_timeout_ms = NODE_DEFAULT_TIMEOUT_MS,
                                            .max_wait_ms = 30000,
                                            .sweep_ms = 200,
                                            .max_body = 8u << 20,
                                            .max_payload = 1u << 20,
                                            .max_shared_ttl_ms = SHARED_DEFAULT_TTL_MS,
                                            .shared_keep_levels = SHARED_DEFAULT_KEEP_LEVELS,
                                            .max_blob_bytes = (size_t)SHARED_DEFAULT_MAX_BLOB,
                                            .distcompute_max_workers = COMPAT_DEFAULT_MAX_WORKERS};

/* Raises the soft limit of open files to the hard one (at most
 * HEAD_NOFILE_MAX): every client connection holds a descriptor, and the soft
 * limit a service starts with (1024 under systemd) is for programs that use
 * select(2); the head waits with epoll.  Its local agent was started before,
 * so the workers' commands keep the limit they were given. */
static void head_raise_nofile(void) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max ||
      lim.rlim_cur >= HEAD_NOFILE_MAX)
    return;
  rlim_t was = lim.rlim_cur;
  lim.rlim_cur = lim.rlim_max < HEAD_NOFILE_MAX ? lim.rlim_max : HEAD_NOFILE_MAX;
  if (setrlimit(RLIMIT_NOFILE, &lim) == 0)
    log_msg(LOG_INFO,
            "open files: raised the soft limit from %llu to %llu (hard limit %llu), one per "
            "client connection",
            (unsigned long long)was, (unsigned long long)lim.rlim_cur,
            (unsigned long long)lim.rlim_max);
}

int head_main(int argc, char **argv, const head_agent_t *agent) {
  head_t h = {.cfg = head_defaults, .wal_fd = -1};
  const char *token_arg = NULL;
  int status = head_parse(argc, argv, &h.cfg, &token_arg);
  if (status >= 0)
    return status;
  head_raise_nofile();
  /* Listen first: a port in use fails before the data dir, a token and a
   * store are made.  Nothing is accepted before the event loop runs. */
  h.base = head_event_base();
  int port = h.base ? http_start(&h) : -1;
  /* 0700: the store, the blobs and the backups hold every client's data,
   * for the head's user alone (the token file is 0600 for the same reason). */
  if (port < 0 || (mkdir(h.cfg.data_dir, 0700) != 0 && errno != EEXIST)) {
    if (port >= 0)
      log_msg(LOG_ERROR, "cannot create data dir %s: %s", h.cfg.data_dir, strerror(errno));
    http_stop(&h);
    if (h.base)
      event_base_free(h.base);
    return 1;
  }
  bool generated = false;
  int lock = head_take_dir(&h.cfg, token_arg, &generated);
  status = lock >= 0 ? head_serve(&h, generated, port, agent) : 1;
  http_stop(&h); /* when head_run did not (a failure before it) */
  store_close(h.st);
  if (h.wal_fd >= 0)
    close(h.wal_fd);
  event_base_free(h.base);
  free(h.dirty);
  if (lock >= 0) { /* the url file is this head's only when it held the lock */
    char url_path[PATH_MAX + 16];
    snprintf(url_path, sizeof url_path, "%s/url", h.cfg.data_dir);
    unlink(url_path);
    close(lock);
  }
  return status;
}
