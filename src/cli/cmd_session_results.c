/*
 * cmd_session_results.c — `muster session results` (docs/cli.md "session",
 * docs/pools.md "The CLI"): a session's results stream from a cursor, printing
 * the cursor to resume from on stderr.
 *
 * `--follow` outlasts a head that stops answering (killed, restarting), as map
 * does: results are durable on the head and the cursor only moves past what
 * was printed, so reading again from it once the head answers prints nothing
 * twice and skips nothing.  It ends once every task put so far has its
 * result; with --until-sealed only once the session is sealed too (`session
 * seal`, `session put --seal`), so a producer that puts in several steps is
 * followed across the pauses between them.  Each read waits as long as the
 * head lets a long-poll wait (its --max-wait-ms, from GET /v1/health), so an
 * idle follow costs one request per such wait; SIGINT or SIGTERM ends it at
 * once with the cursor to resume from.
 */
#include "cli/cli.h"
#include "client/jdump.h"

#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The wait of a --follow read when the head does not say its cap (an older
 * head): its default --max-wait-ms. */
#define SESSION_FOLLOW_WAIT_MS 30000
/* Empty --follow reads come at most this often: a head that lets no read
 * wait (--max-wait-ms 0) answers at once, and is not asked in a busy loop. */
#define SESSION_FOLLOW_MIN_MS 1000
#define SESSION_RETRY_FIRST_MS 200 /* first pause before reading again from a silent head */
#define SESSION_RETRY_MAX_MS 2000  /* the pause doubles up to this */

const cli_opt_t cmd_session_results_opts[] = {
    {"order", "ORDER", "submission (by index, the default) or completion (as they finished)"},
    {"cursor", "C", "where to start: an index (submission) or a sequence number (completion)"},
    {"max", "N", "print at most N results (default: all that are ready)"},
    {"wait-ms", "MS", "wait up to MS for a first result when none is ready (default 0)"},
    {"follow", NULL, "wait until every task has its result (outlasting a head restart)"},
    {"until-sealed", NULL,
     "with --follow: end only once the session is sealed and every task has its result"},
    {"values", NULL, "print only the result values, one per line, like map"},
    {NULL, NULL, NULL},
};

const char cmd_session_results_details[] =
    "Prints one JSON object per result and line: {\"index\", \"task\", \"state\",\n"
    "\"result\", \"error\", \"seq\"}, and on stderr the cursor to pass next time\n"
    "(\"cursor: C\"), so a reader can stop and resume without losing or repeating\n"
    "a result.  In submission order, a gap (indexes without a task, left by tasks\n"
    "put with explicit indexes) stops the stream; once every task of the session\n"
    "has its result nothing can come past it, and the command exits 1 (index_gap)\n"
    "saying which indexes have no task and which options read on, instead of\n"
    "waiting for ever.\n"
    "With --follow, a session with no task yet is waited on until tasks are put\n"
    "and have their results (it may be started before `session put`); it ends\n"
    "once every task submitted so far has its result.\n"
    "With --follow --until-sealed it ends only once the session is sealed as well\n"
    "(`muster session seal`, `session put --seal`) and every result was printed: a\n"
    "producer may put tasks in several steps and pause between them.  Caught up\n"
    "with an unsealed session, it says once on stderr that it waits for more tasks\n"
    "or the seal.\n"
    "With --follow, a head that stops answering (it was killed or restarts) is\n"
    "waited for: one line says so, reads are tried again every 2 s at most, and\n"
    "one line says when it answers again; the stream goes on from the cursor,\n"
    "nothing printed twice or skipped.  Each read waits as long as the head lets\n"
    "one wait (its --max-wait-ms).  SIGINT or SIGTERM ends --follow at once, with\n"
    "the cursor on stderr and exit status 1.\n\n"
    "examples:\n"
    "  muster session results s-5f2c9a1e7b3d4c60 --follow --values\n"
    "  muster session results s-5f2c9a1e7b3d4c60 --follow --until-sealed --values\n"
    "  muster session results s-5f2c9a1e7b3d4c60 --order completion --cursor 311\n";

/* ---- results ------------------------------------------------------------------------------ */

typedef struct {
  muster_order_t order;
  int64_t cursor;
  int64_t left; /* results still to print; -1: no limit */
  int64_t wait_ms;
  int64_t follow_wait_ms; /* how long a --follow read waits; 0: not asked of the head yet */
  int follow, values;
  int until_sealed; /* --until-sealed: caught up, --follow ends only on a sealed session */
  int read_any;     /* a page came: the session exists, and --follow may wait for the head */
  int said_empty;   /* --follow said that the session has no task yet */
  int said_waiting; /* --until-sealed said that it waits for more tasks or the seal */
  int sealed;       /* the last page's "sealed": 1, 0, or -1 when the head did not say */
  const char *id;   /* the session's id (argv) */
  int64_t retry_ms; /* the next pause while the head does not answer; 0: it answers */
  int64_t gap_last; /* after index_gap: the last index of the gap the stream stopped at */
} session_read_t;

/*
 * SIGINT and SIGTERM end --follow at once, from their handler: libmuster
 * goes on waiting through a signal, so a read parked for the head's whole
 * --max-wait-ms could not be cut short otherwise.  They are blocked but while
 * the command waits (a read under way, a pause), so they never land in the
 * middle of a page: what was printed is flushed, and session_stop_cursor,
 * written only while they are blocked, is the cursor to resume from.
 */
static int64_t session_stop_cursor;
static sigset_t session_stop_signals;

/* Writes `value` in decimal at `at`; returns the end.  Async-signal-safe. */
static char *session_put_int(char *at, int64_t value) {
  char digits[24];
  int n = 0;
  uint64_t v = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
  do
    digits[n++] = (char)('0' + v % 10);
  while ((v /= 10) != 0);
  if (value < 0)
    *at++ = '-';
  while (n > 0)
    *at++ = digits[--n];
  return at;
}

/* Appends NUL-terminated `text` at `at`; returns the end.  Async-signal-safe. */
static char *session_put_text(char *at, const char *text) {
  while (*text)
    *at++ = *text++;
  return at;
}

/* Says on stderr the cursor to resume from and that a signal stopped the
 * command, and exits 1. */
static void session_on_signal(int sig) {
  (void)sig;
  char line[160], *at = line;
  at = session_put_int(session_put_text(at, "cursor: "), session_stop_cursor);
  at = session_put_text(at, "\nmuster: stopped by a signal; read on with --cursor ");
  at = session_put_text(session_put_int(at, session_stop_cursor), "\n");
  ssize_t written = write(STDERR_FILENO, line, (size_t)(at - line));
  (void)written; /* nothing is left to do about a stderr that takes nothing */
  _exit(CLI_FAIL);
}

/* Installs the stop signals' handler and blocks them until session_waits. */
static void session_catch_stop_signals(void) {
  cli_catch_stop_signals(&session_stop_signals, session_on_signal);
}

/* With --follow, lets the stop signals in (`waiting` non-zero) for a wait
 * that starts at `cursor`, or blocks them again after it. */
static void session_waits(const session_read_t *rd, int waiting) {
  if (!rd->follow)
    return;
  if (waiting)
    session_stop_cursor = rd->cursor;
  sigprocmask(waiting ? SIG_UNBLOCK : SIG_BLOCK, &session_stop_signals, NULL);
}

static int64_t session_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Pauses `ms` milliseconds; a stop signal ends the command meanwhile. */
static void session_pause(const session_read_t *rd, int64_t ms) {
  struct timespec pause = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
  session_waits(rd, 1);
  nanosleep(&pause, NULL);
  session_waits(rd, 0);
}

const char *const cli_result_orders[] = {
    [MUSTER_ORDER_SUBMISSION] = "submission",
    [MUSTER_ORDER_COMPLETION] = "completion",
    NULL,
};

static int session_read_opts(const cli_args_t *args, session_read_t *rd) {
  const char *order = cli_opt(args, "order");
  rd->order = MUSTER_ORDER_SUBMISSION;
  for (int i = 0; order != NULL && cli_result_orders[i]; i++)
    if (strcmp(order, cli_result_orders[i]) == 0)
      rd->order = (muster_order_t)i;
  if (order != NULL && strcmp(order, cli_result_orders[rd->order]) != 0)
    return cli_usage_error(args->cmd, "--order: expected submission or completion, got '%s'",
                           order);
  rd->follow = cli_flag(args, "follow");
  rd->until_sealed = cli_flag(args, "until-sealed");
  if (rd->until_sealed && !rd->follow)
    return cli_usage_error(args->cmd, "--until-sealed goes with --follow (it says when a follow "
                                      "ends); without --follow the command prints what is ready");
  rd->values = cli_flag(args, "values");
  int rc = cli_opt_int(args, "cursor", 0, 0, &rd->cursor);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "max", -1, 1, &rd->left);
  if (rc == CLI_OK)
    rc = cli_opt_int(args, "wait-ms", 0, 0, &rd->wait_ms);
  return rc;
}

/* Prints one result as a JSON line, or its value alone with --values. */
static void session_print_result(const session_read_t *rd, const muster_result_t *r) {
  if (rd->values) {
    if (r->ok)
      cli_print_result_value(r->result, stdout);
    putchar('\n');
    return;
  }
  json_t *result = r->result ? json_loads(r->result, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL) : NULL;
  json_t *obj =
      json_pack("{s:I, s:I, s:s, s:o, s:s?, s:I}", "index", (json_int_t)r->index, "task",
                (json_int_t)r->task, "state", r->state ? r->state : "", "result",
                result ? result : json_null(), "error", r->error, "seq", (json_int_t)r->seq);
  char *line = obj ? jdump(obj, JSON_COMPACT) : NULL;
  if (line)
    puts(line);
  free(line);
  json_decref(obj);
}

/* Non-zero for a failure that says the head is down or restarting, which
 * --follow outlasts: MUSTER_NETWORK (no answer) and MUSTER_UNAVAILABLE (503). */
static int session_transient(muster_err_t err) {
  return err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE;
}

/*
 * With --follow, after the first page came (so the URL and session are
 * right): waits out a failed read that says the head is away, saying so once
 * per streak of failures, and pausing SESSION_RETRY_FIRST_MS, doubling up to
 * SESSION_RETRY_MAX_MS.  The cursor stays where the last page left it.
 * Returns 1 to read again, 0 to stop with `err`.
 */
static int session_retry(const cli_args_t *args, const muster_client_t *client, session_read_t *rd,
                         muster_err_t err) {
  if (!rd->follow || !rd->read_any || !session_transient(err))
    return 0;
  if (rd->retry_ms == 0) {
    const char *message = muster_client_message(client);
    char away[1200];
    fprintf(stderr, "muster: %s: %s\n", muster_err_name(err),
            message && message[0] ? message : muster_strerror(err));
    fprintf(stderr,
            "muster: %s is unreachable or restarting; still following session %s from "
            "cursor %lld, trying again every %d s at most (Ctrl-C stops, printing the cursor "
            "to resume from)\n",
            cli_server_away(muster_client_server(client), err, away, sizeof away), args->pos[0],
            (long long)rd->cursor, SESSION_RETRY_MAX_MS / 1000);
    rd->retry_ms = SESSION_RETRY_FIRST_MS;
  }
  session_pause(rd, rd->retry_ms);
  rd->retry_ms = rd->retry_ms * 2 < SESSION_RETRY_MAX_MS ? rd->retry_ms * 2 : SESSION_RETRY_MAX_MS;
  return 1;
}

/*
 * How long a --follow read waits: as long as the head lets one wait, which
 * GET /v1/health says (max_wait_ms), asked once; the head's default when it
 * does not say (an older head) or the ask failed (asked again next time).  A
 * longer wait would be cut to it by the head, and only delay noticing a head
 * that vanished without closing the connection.
 */
static int64_t session_follow_wait(muster_client_t *client, session_read_t *rd) {
  if (rd->follow_wait_ms > 0)
    return rd->follow_wait_ms;
  char *reply = NULL;
  session_waits(rd, 1);
  muster_err_t err = muster_request(client, "GET", "/v1/health", NULL, &reply);
  session_waits(rd, 0);
  json_t *health = err == MUSTER_OK ? json_loads(reply, JSON_ALLOW_NUL, NULL) : NULL;
  json_t *cap = json_object_get(health, "max_wait_ms");
  int64_t wait = json_is_integer(cap) && json_integer_value(cap) >= 0
                     ? (int64_t)json_integer_value(cap)
                     : SESSION_FOLLOW_WAIT_MS;
  if (err == MUSTER_OK) /* 0 is "not asked": a cap of 0 is kept as 1 ms, which the head cuts */
    rd->follow_wait_ms = wait > 0 ? wait : 1;
  json_decref(health);
  muster_free(reply);
  return wait;
}

/* With --follow, says once that a session without tasks is waited on, and
 * with --until-sealed once that one caught up (every task put so far has its
 * result, all printed: fewer than `max` came, no gap) is waited on until more
 * are put or it is sealed; not when the stream `ends` here. */
static void session_say_waiting(session_read_t *rd, const muster_results_t *page, size_t max,
                                int ends) {
  int caught_up = page->done >= page->total && page->gap_first < 0 && page->count < max;
  if (rd->follow && page->total == 0 && !ends && !rd->said_empty) {
    fprintf(stderr,
            "muster: session %s has no tasks yet; waiting for tasks to be put and for their "
            "results (Ctrl-C stops)\n",
            rd->id);
    rd->said_empty = 1;
  } else if (rd->until_sealed && caught_up && page->total > 0 && rd->sealed == 0 && !ends &&
             !rd->said_waiting) {
    fprintf(stderr,
            "muster: session %s: every task put so far (%lld) has its result; it is not "
            "sealed, so waiting for more tasks or the seal (`muster session seal %s`; Ctrl-C "
            "stops)\n",
            rd->id, (long long)page->total, rd->id);
    rd->said_waiting = 1;
  } else if (rd->until_sealed && rd->sealed < 0 && !rd->said_waiting) {
    fprintf(stderr,
            "muster: the head does not say whether session %s is sealed (it is older than "
            "this muster); --until-sealed cannot be honoured, so the follow ends once every "
            "task put so far has its result, with exit status 1\n",
            rd->id);
    rd->said_waiting = 1;
  }
}

/* Prints a page's results and moves the cursor past them; returns 1 when
 * the stream is read to its end (or to the --max limit) and reading stops.
 * A session without tasks is not finished: the head cannot tell whether
 * more will be put (a session takes tasks until it is closed or sealed), and
 * one just created gets its tasks after it (`session put`), so --follow
 * waits for them, saying so once, rather than end before the first.  With
 * --until-sealed the end is a sealed session with every result, tasks or
 * none: until then each caught-up read waits (the head answers it when a
 * result comes or the seal does). */
static int session_take_page(session_read_t *rd, const muster_results_t *page, size_t max,
                             int *quick) {
  int caught_up = page->done >= page->total, at_gap = page->gap_first >= 0;
  int by_seal = rd->until_sealed && rd->sealed >= 0; /* an older head does not say */
  int finished = caught_up && (by_seal ? rd->sealed == 1 : page->total > 0);
  int stalled = caught_up && page->total > 0 && at_gap; /* the next read fails: index_gap */
  int at_end = finished && !at_gap && page->count < max, empty = page->count == 0;
  for (size_t i = 0; i < page->count; i++)
    session_print_result(rd, &page->results[i]);
  fflush(stdout);
  if (page->count > 0 || page->cursor > rd->cursor)
    rd->cursor = page->cursor;
  if (rd->left > 0)
    rd->left -= (int64_t)page->count;
  session_say_waiting(rd, page, max, at_end || stalled);
  *quick = finished || stalled;
  return !stalled && (at_end || (!rd->follow && empty));
}

/*
 * Reads pages until the limit, the end of what is ready, or (--follow) the
 * end or a signal.  Once every task has its result no read waits: the rest
 * is there.  A page that stops at a gap (indexes without a task) then is
 * followed by one more read, which the library fails with index_gap unless
 * the gap was filled meanwhile; so is an empty first read at such a gap.
 */
static muster_err_t session_read_all(const cli_args_t *args, muster_client_t *client,
                                     session_read_t *rd) {
  int quick = rd->follow; /* --follow's first read does not wait: a stalled stream says so */
  for (int first = 1; rd->left != 0; first = 0) {
    size_t max = rd->left > 0 && rd->left < 1000 ? (size_t)rd->left : 1000;
    int64_t wait = quick        ? 0
                   : rd->follow ? session_follow_wait(client, rd)
                   : first      ? rd->wait_ms
                                : 0;
    muster_results_t page;
    int64_t asked_ms = session_now_ms();
    session_waits(rd, 1);
    muster_err_t err = muster_session_results_sealed(client, args->pos[0], rd->order, rd->cursor,
                                                     max, wait, &page, &rd->sealed);
    session_waits(rd, 0);
    if (err != MUSTER_OK) {
      rd->gap_last = page.gap_last;
      muster_results_free(&page);
      if (session_retry(args, client, rd, err))
        continue;
      return err;
    }
    if (rd->retry_ms != 0) {
      char at[1200];
      fprintf(stderr, "muster: %s answers again; following on from cursor %lld\n",
              cli_server_at(muster_client_server(client), at, sizeof at), (long long)rd->cursor);
    }
    rd->retry_ms = 0;
    rd->read_any = 1;
    int stop = session_take_page(rd, &page, max, &quick);
    size_t count = page.count;
    muster_results_free(&page);
    if (stop)
      return MUSTER_OK;
    int64_t took_ms = session_now_ms() - asked_ms;
    if (rd->follow && !quick && count == 0 && took_ms < SESSION_FOLLOW_MIN_MS)
      session_pause(rd, SESSION_FOLLOW_MIN_MS - took_ms);
  }
  return MUSTER_OK;
}

static int session_results(cli_args_t *args, muster_client_t *client) {
  session_read_t rd = {.id = args->pos[0]};
  int rc = session_read_opts(args, &rd);
  if (rc != CLI_OK)
    return rc;
  if (rd.follow)
    session_catch_stop_signals(); /* a signal says the cursor and exits (session_on_signal) */
  muster_err_t err = session_read_all(args, client, &rd);
  /* The cursor to resume from, unless the first read was refused (an unknown
   * session, a bad cursor): there is nothing to resume then.  A gap or a lost
   * connection leaves a stream to resume. */
  if (rd.read_any || err == MUSTER_NETWORK || err == MUSTER_UNAVAILABLE || err == MUSTER_INDEX_GAP)
    fprintf(stderr, "cursor: %lld\n", (long long)rd.cursor);
  if (err != MUSTER_OK)
    rc = cli_session_error(client, err);
  /* The library's words for a gap suit any caller ("from cursor N", "in
   * completion order"); here they are options. */
  if (err == MUSTER_INDEX_GAP)
    fprintf(stderr, "muster: to read on, pass --cursor %lld (past the gap) or --order completion\n",
            (long long)rd.gap_last + 1);
  /* A script that waits for the seal must not take an older head's end of
   * the tasks put so far for it: the stream may go on. */
  if (err == MUSTER_OK && rd.follow && rd.until_sealed && rd.sealed < 0 && rd.read_any) {
    fprintf(stderr,
            "muster: ended without knowing whether session %s was sealed "
            "(--until-sealed needs a newer head)\n",
            rd.id);
    rc = CLI_FAIL;
  }
  return rc;
}

int cmd_session_results(cli_args_t *args) {
  return cli_with_client(args, session_results);
}
