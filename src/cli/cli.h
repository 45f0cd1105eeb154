/*
 * cli.h — what the files of the `muster` command line share.
 *
 * Every command is a row of a table (main.c): its name, synopsis, options,
 * positional-argument counts and a run function.  args.c parses argv against
 * the row once, centrally, so commands only read already-checked values;
 * conn.c turns the global client options into a libmuster handle and prints
 * errors the one way the CLI prints them.  Exit statuses: 0 success, 1 the
 * server or the network refused, 2 the command line was wrong.
 */
#ifndef MUSTER_CLI_H
#define MUSTER_CLI_H

#include "muster.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#define CLI_OK 0
#define CLI_FAIL 1  /* the request failed: server, network, or a task */
#define CLI_USAGE 2 /* the command line was wrong */

/* Help listings: lines of at most this many columns, and the narrowest
 * column of option names ("--queue Q"), so that short ones line up as before. */
#define CLI_HELP_COLUMNS 80
#define CLI_HELP_MIN_WIDTH 22

#define CLI_MAX_OPTS 24 /* options per command, global ones included */
/* Values of options one command line may give, every occurrence counted (an
 * option that may be repeated, such as --requires, is read from them). */
#define CLI_MAX_VALUES 64
/* The largest --concurrency of a command worker; `muster node` checks it too,
 * so that an agent never starts workers that refuse their own arguments. */
#define CLI_MAX_CONCURRENCY 1024

/* One --option of a command. */
typedef struct {
  const char *name;    /* long name without the dashes: "queue" for --queue */
  const char *metavar; /* "Q" for an option with a value; NULL for a flag */
  const char *help;    /* one line for --help */
} cli_opt_t;

struct cli_args;

/* One command or subcommand ("put", "queue create"). */
typedef struct cli_cmd {
  const char *name;      /* full name as typed: "queue create" */
  const char *synopsis;  /* what follows the name in the usage line */
  const char *summary;   /* one sentence for the command list */
  const char *details;   /* more help text (may be NULL), printed after the options */
  const cli_opt_t *opts; /* terminated by a row with name NULL; may be NULL */
  int client;            /* non-zero: takes --url, --token, --data-dir */
  int min_pos, max_pos;  /* positional arguments allowed; max_pos -1: any number */
  int (*run)(struct cli_args *args);
} cli_cmd_t;

/* A parsed command line. */
typedef struct cli_args {
  const cli_cmd_t *cmd;
  const char *values[CLI_MAX_OPTS]; /* by option index: its value, "" for a set flag, or NULL */
  char **pos;                       /* positional arguments (in argv) */
  int npos;
  int dashdash;             /* non-zero when "--" separated the positional arguments */
  int npos_before_dashdash; /* of them, those before "--" (npos when there was none) */
  /* Every value given, in order, with its option's index: what cli_opt_values
   * reads for an option that may be repeated (values[] keeps the last). */
  const char *given[CLI_MAX_VALUES];
  int given_opt[CLI_MAX_VALUES];
  int ngiven;
} cli_args_t;

/* ---- args.c ---- */

/* The options every client command takes (--url, --token, --data-dir). */
extern const cli_opt_t cli_client_opts[];

/*
 * Parses argv (argv[0] is the first word after the command name) against
 * `cmd` into *args.  Returns -1 after printing usage for --help (the caller
 * exits 0), CLI_USAGE after printing an error, or CLI_OK.  `pos` must have room
 * for argc pointers.
 */
int cli_parse(const cli_cmd_t *cmd, int argc, char **argv, char **pos, cli_args_t *args);
/* Prints the usage of `cmd` to `out`. */
void cli_usage(const cli_cmd_t *cmd, FILE *out);
/*
 * Prints one item of a help listing: "  LEFT" padded to `width` columns, a
 * space, then `help` wrapped at spaces to lines of CLI_HELP_COLUMNS, each
 * continuation starting in the same column.  A LEFT wider than `width` gets a
 * line of its own and the text starts on the next.
 */
void cli_print_item(FILE *out, const char *left, const char *help, int width);
/* The value of option `name` ("" for a set flag), or NULL when not given. */
const char *cli_opt(const cli_args_t *args, const char *name);
/* For an option that may be repeated (`--requires A --requires B`): its
 * values in the order given, up to `max` of them into `out`.  Returns how
 * many were given (0 when none), which may be more than `max`. */
int cli_opt_values(const cli_args_t *args, const char *name, const char **out, int max);
/* Non-zero when flag `name` was given. */
int cli_flag(const cli_args_t *args, const char *name);
/*
 * Reads integer option `name` into *out (`fallback` when absent), requiring
 * value >= `min`.  Returns CLI_OK, or CLI_USAGE after printing the error.
 */
int cli_opt_int(const cli_args_t *args, const char *name, int64_t fallback, int64_t min,
                int64_t *out);
/* The same, also requiring value <= `max`. */
int cli_opt_int_range(const cli_args_t *args, const char *name, int64_t fallback, int64_t min,
                      int64_t max, int64_t *out);
/* Parses `text` as an integer >= `min` for `what` of `cmd`; CLI_USAGE after an error. */
int cli_parse_int(const cli_cmd_t *cmd, const char *text, const char *what, int64_t min,
                  int64_t *out);
/* Prints "muster: MESSAGE" and a hint to run --help, and returns CLI_USAGE. */
int cli_usage_error(const cli_cmd_t *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- misplaced.c ---- */

/* When option --NAME (the first `len` characters of `name`) is not one of
 * `cmd`'s but one of another command that users take it for (`muster head
 * --join`), prints which command takes it and what to run instead, and
 * returns CLI_USAGE; CLI_OK without a word otherwise. */
int cli_misplaced_option(const cli_cmd_t *cmd, const char *name, size_t len);
/* The same for a one-dash word (`-p`) that another tool's users type where
 * muster takes a long option. */
int cli_misplaced_short(const cli_cmd_t *cmd, const char *word);

/* ---- json_text.c ---- */

struct json_t;
/* The longest text cli_json_parse puts in `why` (jansson's reason, its place). */
#define CLI_JSON_WHY 256 /* JPARSE_WHY of client/jparse.h */
/*
 * Parses `len` bytes of `text` as one JSON value of any type.  Returns it (a
 * new reference), or NULL with `why` set to the reason and where it was found:
 * "string or '}' expected near 'bad' (at column 4)", or "(at line 2, column 4)"
 * for a text of several lines.
 */
struct json_t *cli_json_parse(const char *text, size_t len, char *why, size_t why_size);

/* ---- conn.c ---- */

/*
 * Creates a handle for the server named by the global options (--url, env
 * MUSTER_URL, DATA_DIR/url, default) with the token (--token, env
 * MUSTER_TOKEN, DATA_DIR/token).  Returns CLI_OK with *out set, or CLI_FAIL
 * after printing why.  The caller frees the handle.
 */
int cli_connect(const cli_args_t *args, muster_client_t **out);
/* For a command that a stop signal ends at once, from `handler` (which must
 * be async-signal-safe): installs it for SIGINT and SIGTERM, fills `set` with
 * the two and blocks them; the command unblocks `set` only while it waits
 * (a request, a pause), so that a signal never lands in the middle of its
 * output (session results --follow, queue wait). */
void cli_catch_stop_signals(sigset_t *set, void (*handler)(int));
/* Runs `body` with a client cli_connect made, and frees it; its return, or
 * cli_connect's failure. */
int cli_with_client(cli_args_t *args, int (*body)(cli_args_t *, muster_client_t *));
/* The URL and token cli_connect would use (static or environment storage;
 * the token may be NULL). */
const char *cli_url(const cli_args_t *args);
/* For a line saying the head at cli_url's URL cannot be reached: a short
 * phrase on where that URL came from and what to check ("is --url right?"),
 * written into `buf`, which it returns. */
const char *cli_url_hint(char *buf, size_t size);
/* Checks that the URL cli_url gives names a head (http:// or https://, a
 * host, an optional port, no path but '/' or a proxy's prefix not ending in
 * /v1, no query).  CLI_OK, or CLI_USAGE after saying what is wrong and where
 * the URL came from. */
int cli_check_url(const cli_args_t *args);
/* For a long-running client (`muster worker`): when the data dir named by
 * --data-dir or MUSTER_DATA_DIR is a head's whose head is not running (no url
 * file), says so and waits until the head writes its url file there, as the
 * worker waits for a head that does not answer.  CLI_OK, or -1 after saying
 * that a stop signal (INT, TERM, HUP) ended the wait. */
int cli_await_head_start(const cli_args_t *args, const char *prog);
const char *cli_token(const cli_args_t *args);
/* Records what a reply said answers at cli_url's URL (muster_client_server,
 * muster_pool_server), for the words of later failures there; UNKNOWN
 * changes nothing.  cli_error does it for its handle. */
void cli_note_server(muster_server_t server);
/* "the head at URL", "the node agent at URL", or, for `server` UNKNOWN when
 * nothing was noted and the URL is not from a head's url file, "the muster
 * head or node agent at URL" (cli_url's URL), written into `buf`. */
const char *cli_server_at(muster_server_t server, char *buf, size_t size);
/* What does not answer, after a call that last heard from `server` failed
 * with `err` (MUSTER_NETWORK, MUSTER_UNAVAILABLE): "the head behind the node
 * agent at URL" when a node agent answered 503 (it cannot reach the head, or
 * passed on the head's), else as cli_server_at; written into `buf`. */
const char *cli_server_away(muster_server_t server, muster_err_t err, char *buf, size_t size);
/* Prints "muster: CODE: MESSAGE" for a failed call and returns CLI_FAIL. */
int cli_error(const muster_client_t *client, muster_err_t err);
/* The same for a call that sent one element of a batch: a message that
 * starts with `element` ("leases[0]", which names nothing the user typed)
 * loses it. */
int cli_error_of_one(const muster_client_t *client, muster_err_t err, const char *element);
/* The same for a call that gives its failure's `message` rather than a
 * handle (muster_pool_open): "muster: CODE: MESSAGE" and the advice that fits. */
int cli_error_message(muster_err_t err, const char *message);
/* After MUSTER_NETWORK: non-zero when the request never left (no connection
 * could be made), so it surely did nothing; zero when it was sent and its
 * reply was lost, so it may or may not have taken effect. */
int cli_request_unsent(const muster_client_t *client);
/* The same, read from a failure's message. */
int cli_message_unsent(const char *message);
/*
 * What a command that sends its items in batches (put, session put) says
 * after a network error on items [at, at + n) of `total`, `at` a whole number
 * of batches: `noun` names one item ("payload"), `printed` what was printed
 * of the stored ones ("ids").  Unsent: the request never left, so nothing of
 * it is stored.  Unanswered: it was sent and its reply lost, so it may be
 * stored; `check` says how to see ("in queue 'q' ('muster tasks ls --queue
 * q')"), and both ways to resume are given.
 */
void cli_say_batch_unsent(const char *noun, const char *printed, size_t at, size_t n, size_t total);
void cli_say_batch_unanswered(const char *noun, const char *printed, const char *check, size_t at,
                              size_t n, size_t total);
/* Prints JSON text `text` indented (or as is when it does not parse). */
void cli_print_pretty(const char *text);
/* Percent-encodes `name` for a path into `out` (size bytes); -1 if too long. */
int cli_escape(const char *name, char *out, size_t size);

/* ---- requires.c: --requires of the commands that put tasks ---- */

/* The levels of shared data every task of a command requires
 * (--requires SCOPE/NAME@N, repeated up to MUSTER_MAX_REQUIRES times). */
typedef struct {
  muster_shared_level_t levels[MUSTER_MAX_REQUIRES]; /* scope and name point into store */
  char store[MUSTER_MAX_REQUIRES][2 * 128 + 32];     /* each value, split in place */
  size_t count;
} cli_requires_t;

/* The help of --requires SCOPE/NAME@N, the same for every command that takes it. */
#define CLI_REQUIRES_HELP                                                                          \
  "every task requires level N of shared data SCOPE/NAME (no @N: the newest level now); "          \
  "repeatable, up to 16 times"
/* The help of `muster session put --requires [SCOPE/]NAME@N`. */
#define CLI_REQUIRES_SESSION_HELP                                                                  \
  "every task requires level N of shared data SCOPE/NAME, or NAME of this session when "           \
  "SCOPE/ is left out (no @N: the newest level now); repeatable, up to 16 times"
/* Reads every --requires of `args` into *req, asking the head nothing; a
 * value without @N gets level 0 (cli_requires_resolve).  A value without
 * SCOPE/ names a blob of `session` (`muster session put`'s; scope points to
 * it); where `session` is NULL it is refused.  CLI_OK, or CLI_USAGE after
 * saying which value breaks which rule. */
int cli_requires_parse(const cli_args_t *args, const char *session, cli_requires_t *req);
/* Replaces each level 0 of *req with the newest level the head holds now
 * (a HEAD request each).  CLI_OK, or CLI_FAIL after saying which could not
 * be had and that nothing was put. */
int cli_requires_resolve(muster_client_t *client, cli_requires_t *req);

/* ---- progress.c: the progress bar of map and queue wait ---- */

/* A progress bar on stderr.  Start it zeroed but for `enabled` (stderr is a
 * terminal and no --quiet) and `started_ms` (cli_now_ms at the start). */
typedef struct {
  int enabled;
  int shown; /* it was drawn: its line is on the screen */
  int64_t started_ms, drawn_ms;
} cli_bar_t;

/* Milliseconds of the monotonic clock. */
int64_t cli_now_ms(void);
/* Redraws the bar in place, at most every 100 ms unless `force`, as
 * "[####------] DONE/TOTAL PCT%  RATE/s", then, with `eta`, "  ETA 1m05s"
 * (the rate so far over what is left), then "  TAIL" when `tail` is neither
 * NULL nor "".  Nothing when the bar is not enabled. */
void cli_bar_draw(cli_bar_t *bar, size_t done, size_t total, int eta, const char *tail, int force);
/* Clears the bar's line, so that a message or the shell prompt starts clean. */
void cli_bar_clear(const cli_bar_t *bar);

/* ---- commands (cmd_*.c) ---- */

/* The states of a task, in the order of the API's counts and of `queue ls`. */
#define CLI_TASK_STATES 6
extern const char *const cli_task_states[CLI_TASK_STATES];

int cmd_queue_create(cli_args_t *args);
int cmd_queue_ls(cli_args_t *args);
int cmd_queue_show(cli_args_t *args);
int cmd_queue_purge(cli_args_t *args);
int cmd_queue_rm(cli_args_t *args);
int cmd_queue_requeue(cli_args_t *args);
/* `muster queue wait` (cmd_queue_wait.c). */
extern const cli_opt_t cmd_queue_wait_opts[];
extern const char cmd_queue_wait_details[];
int cmd_queue_wait(cli_args_t *args);
int cmd_status(cli_args_t *args);
/* Requeues every dead and failed task of queue `name` and prints the count. */
int cli_requeue_queue(muster_client_t *client, const char *name);

int cmd_put(cli_args_t *args);
int cmd_tasks_ls(cli_args_t *args);
int cmd_tasks_show(cli_args_t *args);
int cmd_tasks_dead(cli_args_t *args);
int cmd_tasks_requeue(cli_args_t *args);

int cmd_lease(cli_args_t *args);
int cmd_complete(cli_args_t *args);
int cmd_fail(cli_args_t *args);
int cmd_extend(cli_args_t *args);
int cmd_release(cli_args_t *args);
int cmd_flag(cli_args_t *args);

int cmd_worker(cli_args_t *args);

/* `muster backup` (cmd_backup.c). */
extern const cli_opt_t cmd_backup_opts[];
extern const char cmd_backup_details[];
int cmd_backup(cli_args_t *args);

/* The table of every command main() runs, in the order `muster --help`
 * lists them; its length in *count (main.c). */
const cli_cmd_t *cli_commands(size_t *count);

/* `muster completion SHELL` (completion.c). */
extern const char cli_completion_details[];
int cmd_completion(cli_args_t *args);

/* ---- the node agent (cmd_node.c) ---- */

extern const cli_opt_t cli_node_opts[];
extern const char cli_node_details[];
int cmd_node(cli_args_t *args);
/* `muster head`: the head, plus a local node agent unless --server-only. */
int cmd_head_main(int argc, char **argv);
/* Prints the local agent's options of `muster head --help`. */
void cli_head_agent_usage(FILE *out);
/* For `muster completion`: the name of the i-th option of `muster head`'s
 * local agent (--server-only among them), with its metavar in *metavar (as
 * `muster node` names it; NULL for a flag); NULL past the last. */
const char *cli_head_agent_option(size_t i, const char **metavar);

/* ---- pools and sessions (cmd_map.c, cmd_nodes.c, cmd_session.c) ---- */

/* Inputs read one per line, as JSON texts. */
typedef struct {
  char **texts;
  size_t count, cap;
} cli_inputs_t;

/* Reads one input per non-empty line of `from`: parsed as JSON when `as_json`,
 * else kept as a JSON string.  CLI_OK, or CLI_FAIL after printing the error. */
int cli_read_inputs(FILE *from, int as_json, cli_inputs_t *in);
void cli_inputs_free(cli_inputs_t *in);
/* Prints result JSON text `json`: a string as its text, null as nothing,
 * anything else as it is. */
void cli_print_result_value(const char *json, FILE *out);

extern const cli_opt_t cmd_map_opts[], cmd_nodes_opts[], cmd_workers_opts[], cmd_update_opts[],
    cmd_session_create_opts[], cmd_session_results_opts[], cmd_session_put_opts[];
/* What --order of `session results` takes, indexed by muster_order_t,
 * NULL-terminated (cmd_session_results.c). */
extern const char *const cli_result_orders[];
/* What a BOOL option (--cluster-sync) takes: "true", "false", NULL (cmd_iter.c). */
extern const char *const cli_bool_words[];
extern const char cmd_map_details[], cmd_session_put_details[], cmd_session_results_details[],
    cmd_session_seal_details[], cmd_update_details[];
int cmd_map(cli_args_t *args);
int cmd_nodes(cli_args_t *args);
int cmd_workers(cli_args_t *args);
int cmd_update(cli_args_t *args);
/* cli_error for a call on a session; an unknown or closed session is
 * followed, as an unknown queue is, by where the open ones are listed
 * (cmd_session.c). */
int cli_session_error(const muster_client_t *client, muster_err_t err);
int cmd_session_create(cli_args_t *args);
int cmd_session_ls(cli_args_t *args);
int cmd_session_show(cli_args_t *args);
int cmd_session_put(cli_args_t *args);
int cmd_session_seal(cli_args_t *args);
int cmd_session_results(cli_args_t *args);
int cmd_session_close(cli_args_t *args);

#endif /* MUSTER_CLI_H */
