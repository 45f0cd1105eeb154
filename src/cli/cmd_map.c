/*
 * cmd_map.c — `muster map`: run every stdin line through the workers of a
 * queue and print the results (docs/pools.md).
 *
 * It is a thin shell over the pool API: read all inputs first (a bad line
 * stops the command before anything is submitted), open a pool (a session),
 * submit, then print results in input order (--ordered) or as they finish.
 * A failed input prints an empty line, so output line i still belongs to
 * input i with --ordered, and its error goes to stderr; the exit status is 1
 * when any input failed.  The progress bar is drawn on stderr only when stderr
 * is a terminal, so pipes and logs see results and errors alone.  SIGINT and
 * SIGTERM close the pool, cancelling the unfinished tasks, before exiting.
 *
 * A head that stops answering (killed, restarting) does not end map: reading
 * is retried every second for up to the session's timeout while the pool's
 * thread keeps heart-beating, and the iterator carries on where it was, so no
 * result is lost or printed twice.  Past that, map keeps the session open and
 * prints the `muster session results` command that reads the rest.
 */
#include "cli/cli.h"
#include "client/jdump.h"

#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAP_POLL_MS 1000      /* longest wait between checks for a signal */
#define MAP_RETRY_MS 1000     /* pause between reads while the head does not answer */
#define MAP_IDLE_HINT_MS 3000 /* no result this long: say so if no worker serves the queue */

const cli_opt_t cmd_map_opts[] = {
    {"queue", "Q", "queue whose workers run the inputs (created when missing; required)"},
    {"ordered", NULL, "print results in input order (default: as they finish)"},
    {"json", NULL, "parse each input line as JSON instead of sending it as a string"},
    {"with-index", NULL, "prefix each result with its input's number (0-based) and a tab"},
    {"json-output", NULL, "print every result as one line of JSON (a string result quoted)"},
    {"init-data", "JSON", "the session's init_data, handed to the workers"},
    {"timeout-ms", "MS",
     "close the session (cancelling what is left) when map is silent this long; map also waits "
     "this long for a head that stops answering (default 60000)"},
    {"quiet", NULL, "no progress bar, even on a terminal"},
    {"requires", "SCOPE/NAME@N", CLI_REQUIRES_HELP},
    {NULL, NULL, NULL},
};

const char cmd_map_details[] =
    "Reads one input per stdin line (empty lines are skipped), runs each as a\n"
    "task of queue Q in a new session, and prints one result per line: a string\n"
    "result as its text, any other result as compact JSON (with --json-output\n"
    "every result as JSON, a string quoted).  A failed input prints an empty\n"
    "line (null with --json-output) and its error on stderr; the exit status\n"
    "is then 1.  No input at all (an empty stdin) fails too, exit status 1,\n"
    "with nothing submitted.\n"
    "Every input's result is printed exactly once, also when a node was lost\n"
    "and its tasks ran again elsewhere.  When stderr is a terminal a progress\n"
    "bar shows done/total, the rate and the time left.  Interrupting map closes\n"
    "the session, which cancels the inputs not yet run.  With no result after\n"
    "3 s and no worker serving Q, one line on stderr says so (and a second\n"
    "one when map created Q: a mistyped name makes a new queue); map waits on.\n"
    "When the head stops answering (it was killed or restarts), map retries\n"
    "every second for up to the session's timeout and carries on where it was;\n"
    "if it gives up it exits 1 and prints the session id and the `muster\n"
    "session results` command that fetches the rest.\n\n"
    "examples:\n"
    "  seq 1000 | muster map --queue square --ordered\n"
    "  muster map --queue resize --with-index < urls.txt\n";

static volatile sig_atomic_t map_stop;
static int map_queue_is_new; /* --queue did not exist: the pool created it */

static void map_on_signal(int sig) {
  map_stop = sig;
}

/* ---- inputs ------------------------------------------------------------------- */

void cli_inputs_free(cli_inputs_t *in) {
  for (size_t i = 0; i < in->count; i++)
    free(in->texts[i]);
  free(in->texts);
  memset(in, 0, sizeof *in);
}

/* Appends one raw line as JSON text: parsed when `as_json`, else as a string. */
static int inputs_add(cli_inputs_t *in, const char *raw, size_t len, int as_json, long lineno) {
  char why[CLI_JSON_WHY];
  json_t *value = as_json ? cli_json_parse(raw, len, why, sizeof why) : json_stringn(raw, len);
  if (value == NULL) {
    fprintf(stderr, "muster: invalid_argument: stdin line %ld: %s%s\n", lineno,
            as_json ? "not valid JSON: " : "not valid UTF-8 text", as_json ? why : "");
    return CLI_FAIL;
  }
  char *text = jdump(value, JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(value);
  if (text != NULL && in->count == in->cap) {
    size_t cap = in->cap ? in->cap * 2 : 256;
    char **grown = realloc(in->texts, cap * sizeof *grown);
    if (grown == NULL) {
      free(text);
      text = NULL;
    } else {
      in->texts = grown;
      in->cap = cap;
    }
  }
  if (text == NULL) {
    fprintf(stderr, "muster: out of memory\n");
    return CLI_FAIL;
  }
  in->texts[in->count++] = text;
  return CLI_OK;
}

int cli_read_inputs(FILE *from, int as_json, cli_inputs_t *in) {
  memset(in, 0, sizeof *in);
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int rc = CLI_OK;
  for (long lineno = 1; rc == CLI_OK && (len = getline(&line, &cap, from)) >= 0; lineno++) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      len--;
    if (len > 0)
      rc = inputs_add(in, line, (size_t)len, as_json, lineno);
  }
  free(line);
  if (rc != CLI_OK)
    cli_inputs_free(in);
  return rc;
}

void cli_print_result_value(const char *json, FILE *out) {
  json_t *value = json ? json_loads(json, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL) : NULL;
  if (json_is_string(value))
    fwrite(json_string_value(value), 1, json_string_length(value), out);
  else if (json != NULL && !json_is_null(value))
    fputs(json, out);
  json_decref(value);
}

/* ---- running --------------------------------------------------------------------- */

/* Prints one result; returns 1 when it was a failure. */
static int map_print(const cli_args_t *args, cli_bar_t *bar, const muster_result_t *r) {
  if (cli_flag(args, "with-index"))
    printf("%lld\t", (long long)r->index);
  if (cli_flag(args, "json-output"))
    fputs(r->ok ? r->result : "null", stdout);
  else if (r->ok)
    cli_print_result_value(r->result, stdout);
  putchar('\n');
  fflush(stdout);
  if (r->ok)
    return 0;
  cli_bar_clear(bar);
  fprintf(stderr, "muster: input %lld %s: %s\n", (long long)r->index,
          r->state ? r->state : "failed", r->error ? r->error : "no error text");
  return 1;
}

/* Non-zero for a failure that says the head is down or restarting, which map
 * outlasts: MUSTER_NETWORK (no answer) and MUSTER_UNAVAILABLE (503). */
static int map_transient(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
}

/* Sleeps `ms`, cut short by SIGINT/SIGTERM (the handler is installed without
 * SA_RESTART, so nanosleep returns early and the caller sees map_stop). */
static void map_nap(int64_t ms) {
  struct timespec pause = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
  if (!map_stop)
    nanosleep(&pause, NULL);
}

/* Says how to fetch the results map could not wait for: the session is kept
 * (not closed, which would cancel them), and the stream is read from where
 * the iterator stopped, in map's order, as bare values when map printed those. */
static void map_give_up(const cli_args_t *args, muster_pool_t *pool, muster_pool_iter_t *it,
                        muster_err_t err, int64_t waited_ms) {
  size_t done = 0, total = 0;
  muster_pool_iter_progress(it, &done, &total);
  muster_pool_keep_session(pool);
  const char *sid = muster_pool_session(pool);
  int plain = !cli_flag(args, "with-index") && !cli_flag(args, "json-output");
  char away[1200];
  cli_server_away(muster_pool_server(pool), err, away, sizeof away);
  fprintf(stderr,
          "muster: gave up after %lld s without an answer from %s: %s\n"
          "muster: %zu of %zu results were printed. Session %s is left open: its tasks run on\n"
          "  and the head keeps their results until the session goes %lld ms without a client.\n"
          "  Once the head is back, fetch the rest with:\n"
          "  muster session results %s --url %s%s --cursor %lld --follow%s\n",
          (long long)(waited_ms / 1000), away, muster_pool_message(pool), done, total, sid,
          (long long)muster_pool_timeout_ms(pool), sid, cli_url(args),
          cli_flag(args, "ordered") ? "" : " --order completion",
          (long long)muster_pool_iter_cursor(it), plain ? " --values" : "");
}

/*
 * Waits out one failed read of the results.  A transient failure is retried
 * every MAP_RETRY_MS for up to the session's timeout, counted from the first
 * failure in a row (*failing_since_ms, 0 when the last read worked); the pool's
 * heartbeat thread keeps beating meanwhile, and the iterator resumes where it
 * was.  Returns 1 to try again, 0 to stop (the message is printed).
 */
static int map_retry(const cli_args_t *args, cli_bar_t *bar, muster_pool_t *pool,
                     muster_pool_iter_t *it, muster_err_t err, int64_t *failing_since_ms) {
  int64_t now = cli_now_ms(), limit_ms = muster_pool_timeout_ms(pool);
  cli_bar_clear(bar);
  if (!map_transient(err)) {
    fprintf(stderr, "muster: %s: %s (session %s)\n", muster_err_name(err),
            muster_pool_message(pool), muster_pool_session(pool));
    return 0;
  }
  if (*failing_since_ms == 0) {
    *failing_since_ms = now;
    fprintf(stderr, "muster: %s: %s (retrying every second for up to %lld s; session %s)\n",
            muster_err_name(err), muster_pool_message(pool), (long long)(limit_ms / 1000),
            muster_pool_session(pool));
  } else if (now - *failing_since_ms >= limit_ms) {
    map_give_up(args, pool, it, err, now - *failing_since_ms);
    return 0;
  }
  map_nap(MAP_RETRY_MS);
  return 1;
}

/* Once, when no result came for MAP_IDLE_HINT_MS since map started: says that
 * no worker serves the queue, if none does, since map would otherwise wait
 * in silence for ever (a queue map created, a node agent started without
 * --queue).  *hinted is set after the first look. */
static void map_hint_idle(const cli_args_t *args, const cli_bar_t *bar, muster_pool_t *pool,
                          int64_t started_ms, int *hinted) {
  size_t workers = 0;
  if (*hinted || cli_now_ms() - started_ms < MAP_IDLE_HINT_MS)
    return;
  *hinted = 1;
  if (muster_pool_workers_count(pool, &workers) != MUSTER_OK || workers > 0)
    return;
  const char *queue = cli_opt(args, "queue");
  cli_bar_clear(bar);
  fprintf(stderr,
          "muster: no worker serves queue '%s' yet: the inputs wait for one; start one with "
          "`muster worker --queue %s -- CMD`, or a node agent with --queue %s\n",
          queue, queue, queue);
  if (map_queue_is_new)
    fprintf(stderr,
            "muster: queue '%s' did not exist before this map, which created it: if the name "
            "is mistyped, stop map (Ctrl-C) and see `muster queue ls`\n",
            queue);
}

/* Notes in map_queue_is_new whether --queue is missing on the head, which the
 * pool then creates: a mistyped name that no worker will ever serve is told
 * apart from a queue whose workers are late.  A failed look says nothing (the
 * pool's open reports the head's errors). */
static void map_look_at_queue(const muster_pool_opts_t *opts) {
  muster_client_t *client = NULL;
  if (muster_client_new(opts->url, opts->token, &client) == MUSTER_OK)
    map_queue_is_new = muster_queue_get(client, opts->queue, NULL) == MUSTER_QUEUE_NOT_FOUND;
  muster_client_free(client);
}

/* Prints every result of `it` as it comes; returns CLI_OK, or CLI_FAIL. */
static int map_drain(const cli_args_t *args, muster_pool_t *pool, muster_pool_iter_t *it) {
  cli_bar_t bar = {.enabled = isatty(2) && !cli_flag(args, "quiet"), .started_ms = cli_now_ms()};
  size_t done = 0, total = 0, failures = 0;
  int64_t failing_since_ms = 0;
  int rc = CLI_OK, hinted = 0;
  while (!muster_pool_iter_done(it) && !map_stop) {
    muster_result_t r;
    int has = 0;
    muster_err_t err = muster_pool_iter_next(it, MAP_POLL_MS, &r, &has);
    if (err != MUSTER_OK) {
      if (map_retry(args, &bar, pool, it, err, &failing_since_ms))
        continue;
      rc = CLI_FAIL;
      break;
    }
    if (failing_since_ms != 0) {
      char at[1200];
      cli_bar_clear(&bar);
      fprintf(stderr, "muster: %s answers again; carrying on\n",
              cli_server_at(muster_pool_server(pool), at, sizeof at));
      failing_since_ms = 0;
    }
    if (has) {
      failures += (size_t)map_print(args, &bar, &r);
      muster_result_clear(&r);
    }
    muster_pool_iter_progress(it, &done, &total);
    if (done == 0)
      map_hint_idle(args, &bar, pool, bar.started_ms, &hinted);
    cli_bar_draw(&bar, done, total, 1, NULL, muster_pool_iter_done(it));
  }
  if (bar.enabled)
    fputc('\n', stderr);
  if (map_stop) {
    fprintf(stderr, "muster: interrupted after %zu of %zu results; the rest are cancelled\n", done,
            total);
    return CLI_FAIL;
  }
  if (failures > 0)
    fprintf(stderr, "muster: %zu of %zu inputs failed\n", failures, total);
  return failures > 0 ? CLI_FAIL : rc;
}

/* Fills the pool options of `map` from the command line. */
static int map_pool_opts(const cli_args_t *args, muster_pool_opts_t *opts) {
  muster_pool_opts_init(opts);
  opts->url = cli_url(args);
  opts->token = cli_token(args);
  opts->queue = cli_opt(args, "queue");
  opts->init_data = cli_opt(args, "init-data");
  return cli_opt_int(args, "timeout-ms", -1, 1, &opts->timeout_ms);
}

/* No input was read (an empty stdin, or only empty lines): says so and fails
 * before a queue or session is made, since exiting 0 with nothing said would
 * read as work done (`muster put` and `muster session put` do the same).
 * Returns CLI_FAIL. */
static int map_say_none(const cli_args_t *args) {
  fprintf(stderr,
          "muster: invalid_argument: no inputs were read from standard input; nothing was run "
          "on queue '%s'\n",
          cli_opt(args, "queue"));
  return CLI_FAIL;
}

/* The newest levels that --requires left open, asked of the head before the
 * pool opens (it opens a session and may make the queue). */
static int map_resolve(const cli_args_t *args, cli_requires_t *req) {
  int left_open = 0;
  for (size_t i = 0; i < req->count; i++)
    left_open |= req->levels[i].level == 0;
  if (!left_open)
    return CLI_OK;
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK)
    rc = cli_requires_resolve(client, req);
  muster_client_free(client);
  return rc;
}

/* Opens the pool of `opts`, submits the inputs and prints their results. */
static int map_run(const cli_args_t *args, const muster_pool_opts_t *opts, const cli_inputs_t *in) {
  muster_pool_t *pool = NULL;
  char *message = NULL;
  muster_err_t err = muster_pool_open(opts, &pool, &message);
  if (err != MUSTER_OK) {
    cli_error_message(err, message);
    muster_free(message);
    return CLI_FAIL;
  }
  struct sigaction sa = {.sa_handler = map_on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  muster_pool_iter_t *it = NULL;
  int rc;
  err = muster_pool_imap(pool, (const char *const *)in->texts, in->count, cli_flag(args, "ordered"),
                         &it);
  if (err != MUSTER_OK)
    rc = cli_error_message(err, muster_pool_message(pool));
  else
    rc = map_drain(args, pool, it);
  muster_pool_iter_free(it);
  muster_pool_close(pool);
  return rc;
}

int cmd_map(cli_args_t *args) {
  if (cli_opt(args, "queue") == NULL)
    return cli_usage_error(args->cmd, "'map' needs --queue Q");
  muster_pool_opts_t opts;
  cli_requires_t req;
  int rc = map_pool_opts(args, &opts);
  if (rc == CLI_OK)
    rc = cli_requires_parse(args, NULL, &req);
  cli_inputs_t in;
  if (rc != CLI_OK || (rc = cli_read_inputs(stdin, cli_flag(args, "json"), &in)) != CLI_OK)
    return rc;
  if (in.count == 0)
    return map_say_none(args);
  rc = map_resolve(args, &req);
  opts.required = req.levels;
  opts.required_count = req.count;
  if (rc == CLI_OK) {
    map_look_at_queue(&opts);
    rc = map_run(args, &opts, &in);
  }
  cli_inputs_free(&in);
  return rc;
}
