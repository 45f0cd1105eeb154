/*
 * cmd_queue_wait.c — `muster queue wait Q [--pipeline]`: block until queue Q
 * (with --pipeline, also every queue after it along `next`) has no task
 * queued or leased, for a script that put work in and waits for it to be
 * done (docs/cli.md "queue").
 *
 * Each look is one GET /v1/queues, every queue with its counts.  The head
 * answers it in one piece from one state (a single thread owns the store,
 * and a handler runs to its end), and a completion creates its next-stage
 * task in the same transaction that marks it done (lease_ops.c), as a flag
 * re-opens the parent one stage back in the flag's.  So no answer shows a
 * task between two stages, and a chain that is empty in one answer is
 * empty: one look is the whole check.  Looking at the queues one request
 * each could miss a task: stage b read empty, then a's task completes into
 * b, then a read empty.
 *
 * "Since the start" is measured against the first look: its failed + dead
 * and done + reaped of every queue there is (a queue made later starts from
 * nothing), so that tasks that failed before the wait are not its failures.
 * Looks come every WAIT_POLL_MS.  A head that stops answering after the
 * first look is waited for, as `session results --follow` does; SIGINT and
 * SIGTERM end the wait at once, from their handler, with a line written
 * beforehand (they are blocked but while the command waits on the head or
 * pauses, so the line is never half-updated).
 */
#include "cli/cli.h"

#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_POLL_MS 500        /* between two looks at the queues */
#define WAIT_LINE_MS 5000       /* no terminal: at most one progress line this often */
#define WAIT_RETRY_FIRST_MS 200 /* first pause before asking a silent head again */
#define WAIT_RETRY_MAX_MS 2000  /* the pause doubles up to this */
#define WAIT_REQUEST_MS 60000   /* the longest one look may take (libmuster's default) */
#define WAIT_MAX_MS (3650LL * 86400 * 1000) /* the longest --timeout-ms: ten years */
#define WAIT_TEXT 1024                      /* the room of each text a look is summed up in */

const cli_opt_t cmd_queue_wait_opts[] = {
    {"pipeline", NULL, "also wait for every queue after Q along `next` (up to a loop)"},
    {"timeout-ms", "MS", "give up after MS, exit status 1, saying what is left (default: never)"},
    {"quiet", NULL, "no progress on stderr (failures and the timeout are still said)"},
    {NULL, NULL, NULL},
};

const char cmd_queue_wait_details[] =
    "Blocks until queue Q has no task queued (delayed ones and retries waiting\n"
    "out their backoff included) or leased; with --pipeline, until every queue\n"
    "after Q along `next` has none either, all of them seen empty at once.  It\n"
    "looks every 0.5 s.  Progress goes to stderr: a bar redrawn in place on a\n"
    "terminal, else a line at most every 5 s when something changed.\n"
    "Exit status 0: drained, and no task of those queues ended failed or dead\n"
    "since the wait started.  1: drained, but some did (a line says how many and\n"
    "the `muster tasks dead` command that lists them); --timeout-ms passed (a\n"
    "line says what is left); Q does not exist; or SIGINT or SIGTERM ended it.\n"
    "A head that stops answering (killed, restarting) is waited for: one line\n"
    "says so, it is asked again every 2 s at most, and one line says when it\n"
    "answers again.\n\n"
    "examples:\n"
    "  muster queue wait resize\n"
    "  ls *.jpg | muster put --queue resize && muster queue wait resize --pipeline\n"
    "  muster queue wait resize --pipeline --timeout-ms 3600000 --quiet\n";

/* What one look found, summed over the queues waited for. */
typedef struct {
  int found;                  /* Q is there */
  size_t length;              /* queues waited for: Q and, with --pipeline, those after it */
  int64_t queued, leased;     /* the tasks left */
  int64_t done;               /* done (and reaped) since the start */
  int64_t ended_badly;        /* failed or dead since the start */
  char after[WAIT_TEXT];      /* the queues after Q, "b, c" ("" for none) */
  char left[WAIT_TEXT];       /* "a: 2 queued, 1 leased; b: 3 queued" (those with tasks left) */
  char short_left[WAIT_TEXT]; /* "a 3, b 3", for the bar */
  char bad[WAIT_TEXT];        /* "2 in a, 1 in c" */
  char listing[WAIT_TEXT];    /* "`muster tasks dead --queue a`, `... --queue c`" */
} wait_look_t;

typedef struct {
  const char *queue; /* Q (argv) */
  int pipeline, quiet;
  int64_t timeout_ms;              /* --timeout-ms; 0: none */
  int64_t started_ms, deadline_ms; /* deadline 0: no --timeout-ms */
  json_t *start;                   /* {name: [failed + dead, done + reaped]} of the first look */
  wait_look_t look;                /* the last look */
  int64_t looked_ms;               /* when it came */
  int unreadable;                  /* an answer could not be read (said already) */
  cli_bar_t bar;
  int64_t retry_ms;         /* the next pause while the head does not answer; 0: it answers */
  int64_t line_ms;          /* no terminal: when the last progress line was printed */
  char said[4 * WAIT_TEXT]; /* that line */
} wait_t;

/* ---- stop signals ------------------------------------------------------------------------ */

/* What the handler writes: composed while the signals are blocked. */
static char wait_stop_line[3 * WAIT_TEXT];
static size_t wait_stop_len;
static sigset_t wait_stop_signals;

/* Writes the stop line and exits 1.  Async-signal-safe. */
static void wait_on_signal(int sig) {
  (void)sig;
  ssize_t written = write(STDERR_FILENO, wait_stop_line, wait_stop_len);
  (void)written; /* nothing is left to do about a stderr that takes nothing */
  _exit(CLI_FAIL);
}

/* Installs the handler, and blocks the signals until wait_open. */
static void wait_catch_signals(void) {
  cli_catch_stop_signals(&wait_stop_signals, wait_on_signal);
}

/* Lets the stop signals in (`open` non-zero) for a request or a pause, or
 * blocks them again after it. */
static void wait_open(int open) {
  sigprocmask(open ? SIG_UNBLOCK : SIG_BLOCK, &wait_stop_signals, NULL);
}

/* ---- texts --------------------------------------------------------------------------------- */

/* Appends printf-formatted text to `buf` (of WAIT_TEXT bytes); one that does
 * not fit ends the text with "...", and later ones add nothing. */
static void __attribute__((format(printf, 2, 3))) wait_add(char *buf, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used >= WAIT_TEXT - 4)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + used, WAIT_TEXT - used, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= WAIT_TEXT - used)
    memcpy(buf + WAIT_TEXT - 4, "...", 4);
}

/* "queue a" or "queue a and the queues after it (b, c)", into `buf`. */
static const char *wait_what(const wait_t *w, char *buf, size_t size) {
  if (w->look.after[0])
    snprintf(buf, size, "queue %s and the queues after it (%s)", w->queue, w->look.after);
  else
    snprintf(buf, size, "queue %s", w->queue);
  return buf;
}

/* The line the stop signals print, from the last look (none yet: before it). */
static void wait_compose_stop(const wait_t *w) {
  char what[2 * WAIT_TEXT];
  const wait_look_t *l = &w->look;
  const char *fresh = w->bar.shown ? "\n" : "";
  int n;
  if (w->looked_ms == 0)
    n = snprintf(wait_stop_line, sizeof wait_stop_line,
                 "%smuster: stopped by a signal before the first look at queue %s\n", fresh,
                 w->queue);
  else
    n = snprintf(wait_stop_line, sizeof wait_stop_line,
                 "%smuster: stopped by a signal while waiting for %s to drain; %lld tasks were "
                 "left at the last look (%s)\n",
                 fresh, wait_what(w, what, sizeof what), (long long)(l->queued + l->leased),
                 l->left);
  wait_stop_len = n < 0 ? 0 : n < (int)sizeof wait_stop_line ? (size_t)n : sizeof wait_stop_line;
}

/* ---- looking -------------------------------------------------------------------------------- */

/* The count of `state` in queue object `queue`. */
static int64_t wait_count(const json_t *queue, const char *state) {
  return (int64_t)json_integer_value(json_object_get(json_object_get(queue, "counts"), state));
}

/* The queue named `name` in array `queues`, or NULL. */
static json_t *wait_find(json_t *queues, const char *name) {
  size_t i;
  json_t *queue;
  json_array_foreach(queues, i, queue) {
    const char *its = json_string_value(json_object_get(queue, "name"));
    if (its && strcmp(its, name) == 0)
      return queue;
  }
  return NULL;
}

/* Records {name: [failed + dead, done + reaped]} of every queue in w->start. */
static void wait_mark_start(wait_t *w, json_t *queues) {
  w->start = json_object();
  size_t i;
  json_t *q;
  json_array_foreach(queues, i, q) {
    const char *name = json_string_value(json_object_get(q, "name"));
    json_int_t bad = wait_count(q, "failed") + wait_count(q, "dead");
    json_int_t done = wait_count(q, "done") + json_integer_value(json_object_get(q, "reaped"));
    if (name)
      json_object_set_new(w->start, name, json_pack("[I, I]", bad, done));
  }
}

/* Adds queue `q` (named `name`) to the look: its tasks left, and what it did
 * since the start (never below nothing: a requeue takes failures back). */
static void wait_add_queue(const wait_t *w, wait_look_t *l, const json_t *q, const char *name) {
  json_t *start = json_object_get(w->start, name);
  int64_t queued = wait_count(q, "queued"), leased = wait_count(q, "leased");
  int64_t bad = wait_count(q, "failed") + wait_count(q, "dead") -
                (int64_t)json_integer_value(json_array_get(start, 0));
  int64_t done = wait_count(q, "done") + (int64_t)json_integer_value(json_object_get(q, "reaped")) -
                 (int64_t)json_integer_value(json_array_get(start, 1));
  l->queued += queued;
  l->leased += leased;
  l->done += done > 0 ? done : 0;
  if (l->length > 0)
    wait_add(l->after, "%s%s", l->length > 1 ? ", " : "", name);
  l->length++;
  if (queued + leased > 0) {
    wait_add(l->left, "%s%s: %lld queued, %lld leased", l->left[0] ? "; " : "", name,
             (long long)queued, (long long)leased);
    wait_add(l->short_left, "%s%s %lld", l->short_left[0] ? ", " : "left: ", name,
             (long long)(queued + leased));
  }
  if (bad > 0) {
    l->ended_badly += bad;
    wait_add(l->bad, "%s%lld in %s", l->bad[0] ? ", " : "", (long long)bad, name);
    wait_add(l->listing, "%s`muster tasks dead --queue %s`", l->listing[0] ? ", " : "", name);
  }
}

/* Sums up the queues waited for out of `queues` (GET /v1/queues's array)
 * into w->look: Q, then with --pipeline each `next` in turn, up to one that
 * was met already (a loop) or that the answer lacks. */
static void wait_sum(wait_t *w, json_t *queues) {
  wait_look_t *l = &w->look;
  memset(l, 0, sizeof *l);
  json_t *seen = json_object(), *q = wait_find(queues, w->queue);
  l->found = q != NULL;
  while (q != NULL) {
    const char *name = json_string_value(json_object_get(q, "name"));
    json_object_set_new(seen, name, json_true());
    wait_add_queue(w, l, q, name);
    const char *next = json_string_value(json_object_get(q, "next"));
    q = w->pipeline && next && !json_object_get(seen, next) ? wait_find(queues, next) : NULL;
  }
  json_decref(seen);
}

/* One look: GET /v1/queues, with the stop signals let in, and no longer than
 * what is left of --timeout-ms (but a few seconds, so that a busy head may
 * answer).  Sums it up into w->look; MUSTER_PROTOCOL, said here (the
 * handle's message is of the request, which worked), for an answer that
 * cannot be read. */
static muster_err_t wait_look(muster_client_t *client, wait_t *w) {
  int64_t limit = WAIT_REQUEST_MS;
  if (w->deadline_ms && w->deadline_ms - cli_now_ms() < limit)
    limit = w->deadline_ms - cli_now_ms() > 2000 ? w->deadline_ms - cli_now_ms() : 2000;
  muster_client_set_timeout(client, (long)limit);
  char *reply = NULL;
  wait_open(1);
  muster_err_t err = muster_queue_list(client, &reply);
  wait_open(0);
  json_t *root = err == MUSTER_OK ? json_loads(reply, JSON_ALLOW_NUL, NULL) : NULL;
  json_t *queues = json_object_get(root, "queues");
  if (err == MUSTER_OK && !json_is_array(queues)) {
    cli_bar_clear(&w->bar);
    fprintf(stderr, "muster: protocol: the queue list could not be read\n");
    w->unreadable = 1;
    err = MUSTER_PROTOCOL;
  }
  if (err == MUSTER_OK) {
    if (w->start == NULL)
      wait_mark_start(w, queues);
    wait_sum(w, queues);
    w->looked_ms = cli_now_ms();
    wait_compose_stop(w);
  }
  json_decref(root);
  muster_free(reply);
  return err;
}

/* ---- saying ------------------------------------------------------------------------------ */

/* The progress: the bar on a terminal, else a line when what is left changed
 * and the last line is WAIT_LINE_MS old (the first look's always). */
static void wait_progress(wait_t *w) {
  const wait_look_t *l = &w->look;
  int64_t left = l->queued + l->leased, now = cli_now_ms();
  if (w->quiet)
    return;
  if (w->bar.enabled) {
    cli_bar_draw(&w->bar, (size_t)l->done, (size_t)(l->done + left), !w->pipeline, l->short_left,
                 0);
    wait_compose_stop(w); /* the bar may be on the screen now */
    return;
  }
  char what[2 * WAIT_TEXT], line[sizeof w->said];
  snprintf(line, sizeof line, "muster: waiting for %s: %lld left (%s), %lld done since the start\n",
           wait_what(w, what, sizeof what), (long long)left, l->left, (long long)l->done);
  if ((w->line_ms != 0 && now - w->line_ms < WAIT_LINE_MS) || strcmp(w->said, line) == 0)
    return;
  fputs(line, stderr);
  snprintf(w->said, sizeof w->said, "%s", line);
  w->line_ms = now;
}

/* Drained: says so (unless --quiet), or what ended failed or dead, which
 * fails.  Returns the exit status. */
static int wait_drained(wait_t *w) {
  const wait_look_t *l = &w->look;
  char what[2 * WAIT_TEXT];
  cli_bar_draw(&w->bar, (size_t)l->done, (size_t)l->done, !w->pipeline, NULL, 1);
  if (w->bar.shown)
    fputc('\n', stderr);
  wait_what(w, what, sizeof what);
  if (l->ended_badly > 0) {
    fprintf(stderr,
            "muster: %s drained, but %lld task%s ended failed or dead since the start (%s); "
            "see %s\n",
            what, (long long)l->ended_badly, l->ended_badly == 1 ? "" : "s", l->bad, l->listing);
    return CLI_FAIL;
  }
  if (!w->quiet)
    fprintf(stderr, "muster: %s drained: %lld task%s done since the start\n", what,
            (long long)l->done, l->done == 1 ? "" : "s");
  return CLI_OK;
}

/* --timeout-ms passed: says what was left at the last look.  CLI_FAIL. */
static int wait_timed_out(const wait_t *w) {
  const wait_look_t *l = &w->look;
  char what[2 * WAIT_TEXT], when[96] = "";
  int64_t now = cli_now_ms();
  cli_bar_clear(&w->bar);
  if (w->retry_ms != 0) /* the head is away: what it said last */
    snprintf(when, sizeof when, ", at its last answer %lld s ago",
             (long long)((now - w->looked_ms) / 1000));
  fprintf(stderr, "muster: --timeout-ms %lld passed waiting for %s to drain: %lld left (%s)%s\n",
          (long long)w->timeout_ms, wait_what(w, what, sizeof what),
          (long long)(l->queued + l->leased), l->left, when);
  return CLI_FAIL;
}

/* ---- waiting --------------------------------------------------------------------------------- */

/* Pauses `ms`, or to the deadline when sooner; a stop signal ends the
 * command meanwhile. */
static void wait_pause(const wait_t *w, int64_t ms) {
  if (w->deadline_ms && w->deadline_ms - cli_now_ms() < ms)
    ms = w->deadline_ms - cli_now_ms();
  if (ms <= 0)
    return;
  struct timespec pause = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
  wait_open(1);
  nanosleep(&pause, NULL);
  wait_open(0);
}

/*
 * After a look failed: one that says the head is away (no answer, 503), after
 * a first look that worked (so the URL is right and Q exists), is waited
 * out, said once per streak of failures, with pauses from WAIT_RETRY_FIRST_MS
 * doubling up to WAIT_RETRY_MAX_MS.  Returns 1 to look again, 0 to stop.
 */
static int wait_retry(const muster_client_t *client, wait_t *w, muster_err_t err) {
  if (w->looked_ms == 0 || (err != MUSTER_NETWORK && err != MUSTER_UNAVAILABLE))
    return 0;
  if (w->retry_ms == 0) {
    const char *message = muster_client_message(client);
    char away[1200], what[2 * WAIT_TEXT];
    cli_bar_clear(&w->bar);
    fprintf(stderr, "muster: %s: %s\n", muster_err_name(err),
            message && message[0] ? message : muster_strerror(err));
    fprintf(stderr,
            "muster: %s is unreachable or restarting; still waiting for %s to drain, trying "
            "again every %d s at most (Ctrl-C stops)\n",
            cli_server_away(muster_client_server(client), err, away, sizeof away),
            wait_what(w, what, sizeof what), WAIT_RETRY_MAX_MS / 1000);
    w->retry_ms = WAIT_RETRY_FIRST_MS;
  }
  wait_pause(w, w->retry_ms);
  w->retry_ms = w->retry_ms * 2 < WAIT_RETRY_MAX_MS ? w->retry_ms * 2 : WAIT_RETRY_MAX_MS;
  return 1;
}

/* A look after a streak of failures worked: says so. */
static void wait_back(const muster_client_t *client, wait_t *w) {
  char at[1200];
  cli_bar_clear(&w->bar);
  fprintf(stderr, "muster: %s answers again; waiting on\n",
          cli_server_at(muster_client_server(client), at, sizeof at));
  w->retry_ms = 0;
}

/* Q is not there (any more): queue_not_found, and where the queues are. */
static int wait_not_found(const wait_t *w) {
  cli_bar_clear(&w->bar);
  fprintf(stderr, "muster: %s: queue '%s' does not exist\n",
          muster_err_name(MUSTER_QUEUE_NOT_FOUND), w->queue);
  fprintf(stderr, "muster: see `muster queue ls` for the queues there are\n");
  return CLI_FAIL;
}

/* Looks until drained, --timeout-ms, or a failure; returns the exit status. */
static int wait_loop(muster_client_t *client, wait_t *w) {
  for (;;) {
    muster_err_t err = wait_look(client, w);
    int timed_out = w->deadline_ms && cli_now_ms() >= w->deadline_ms;
    if (err != MUSTER_OK && timed_out && w->looked_ms != 0)
      return wait_timed_out(w);
    if (err != MUSTER_OK && wait_retry(client, w, err))
      continue;
    if (w->unreadable)
      return CLI_FAIL; /* said by wait_look */
    if (err != MUSTER_OK) {
      cli_bar_clear(&w->bar);
      return cli_error(client, err);
    }
    if (w->retry_ms != 0)
      wait_back(client, w);
    if (!w->look.found)
      return wait_not_found(w);
    if (w->look.queued + w->look.leased == 0)
      return wait_drained(w);
    if (timed_out)
      return wait_timed_out(w);
    wait_progress(w);
    wait_pause(w, WAIT_POLL_MS);
  }
}

int cmd_queue_wait(cli_args_t *args) {
  wait_t w = {.queue = args->pos[0],
              .pipeline = cli_flag(args, "pipeline"),
              .quiet = cli_flag(args, "quiet"),
              .started_ms = cli_now_ms()};
  muster_client_t *client = NULL;
  int rc = cli_opt_int_range(args, "timeout-ms", 0, 1, WAIT_MAX_MS, &w.timeout_ms);
  if (rc != CLI_OK || (rc = cli_connect(args, &client)) != CLI_OK)
    return rc;
  w.deadline_ms = w.timeout_ms ? w.started_ms + w.timeout_ms : 0;
  w.bar = (cli_bar_t){.enabled = isatty(STDERR_FILENO) && !w.quiet, .started_ms = w.started_ms};
  wait_compose_stop(&w);
  wait_catch_signals();
  rc = wait_loop(client, &w);
  json_decref(w.start);
  muster_client_free(client);
  return rc;
}
