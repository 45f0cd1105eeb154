/*
 * conn.c — how a CLI command finds its head and reports failures.
 *
 * The URL and token come from the command line, then the environment, then
 * the head's data dir (a head writes DATA_DIR/url once it listens and
 * DATA_DIR/token on first start), so running `muster` next to a head needs no
 * configuration at all.  Errors are printed the one way the CLI prints them:
 * "muster: CODE: MESSAGE" on stderr.
 */
#include "cli/cli.h"
#include "client/jdump.h"
#include "core/url.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define CLI_DEFAULT_URL "http://127.0.0.1:7370"
#define CLI_DEFAULT_DATA_DIR "muster-data"

static char cli_url_buf[1024];
static char cli_token_buf[1024];
static int cli_token_from_nowhere;  /* no token was found anywhere */
static char cli_token_looked[4400]; /* then: the file looked at, and why it gave none */
static char cli_url_origin[4200];   /* where cli_url's URL came from, for advice */
static const char *cli_url_used = CLI_DEFAULT_URL; /* the URL cli_url gave */
static muster_server_t cli_server_seen;            /* what answered there (cli_note_server) */

/* The data dir and, in *from (may be NULL), the option that named it. */
static const char *cli_data_dir_from(const cli_args_t *args, const char **from) {
  const char *dir = cli_opt(args, "data-dir"), *source = "--data-dir";
  if (dir == NULL || dir[0] == '\0')
    dir = getenv("MUSTER_DATA_DIR"), source = "MUSTER_DATA_DIR";
  if (dir == NULL || dir[0] == '\0')
    dir = CLI_DEFAULT_DATA_DIR, source = "the default data dir";
  if (from)
    *from = source;
  return dir;
}

static const char *cli_data_dir(const cli_args_t *args) {
  return cli_data_dir_from(args, NULL);
}

/* DATA_DIR/`name` into `path`, with "./" before a relative one, as messages show it. */
static void cli_data_path(const cli_args_t *args, const char *name, char *path, size_t size) {
  const char *dir = cli_data_dir(args);
  snprintf(path, size, "%s%s/%s", dir[0] == '/' ? "" : "./", dir, name);
}

/* Reads the first line of DATA_DIR/`name` into `buf`, trimmed; 0 when found.
 * Otherwise -1, with *problem (may be NULL) set to why it gave none: strerror's
 * text, or "it is empty". */
static int cli_read_data_file(const cli_args_t *args, const char *name, char *buf, size_t size,
                              const char **problem) {
  char path[4200];
  cli_data_path(args, name, path, sizeof path);
  FILE *f = fopen(path, "r");
  char *line = f ? fgets(buf, (int)size, f) : NULL;
  const char *why = f && !ferror(f) ? "it is empty" : strerror(errno);
  if (f)
    fclose(f);
  size_t n = line ? strlen(buf) : 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
    buf[--n] = '\0';
  if (problem)
    *problem = why;
  return n > 0 ? 0 : -1;
}

/* The URL a command uses and, in `from` (may be NULL), where it came from. */
static const char *cli_url_from(const cli_args_t *args, char *from, size_t size) {
  const char *url = cli_opt(args, "url"), *source = "--url";
  if (url == NULL || url[0] == '\0')
    url = getenv("MUSTER_URL"), source = "MUSTER_URL";
  if (url == NULL || url[0] == '\0') {
    if (cli_read_data_file(args, "url", cli_url_buf, sizeof cli_url_buf, NULL) == 0) {
      url = cli_url_buf;
      if (from)
        cli_data_path(args, "url", from, size);
      return url;
    }
    url = CLI_DEFAULT_URL, source = "the default URL";
  }
  if (from)
    snprintf(from, size, "%s", source);
  return url;
}

const char *cli_url(const cli_args_t *args) {
  return cli_url_used = cli_url_from(args, cli_url_origin, sizeof cli_url_origin);
}

/* Non-zero when `name` is set to a non-empty value by option or environment. */
static int cli_named(const char *value) {
  return value != NULL && value[0] != '\0';
}

/*
 * A data dir the user named (--data-dir, MUSTER_DATA_DIR) is where the URL
 * comes from when neither --url nor MUSTER_URL gives one.  If it holds no url
 * file, the default URL would be used without a word, and that may be another
 * head than the one meant: so this is refused, as a wrong option is.  The
 * default data dir is only a guess, and without a url file the default URL
 * stays the guess.  CLI_OK, or CLI_USAGE after saying so.
 */
static int cli_check_data_dir_url(const cli_args_t *args) {
  const char *from, *problem;
  if (cli_named(cli_opt(args, "url")) || cli_named(getenv("MUSTER_URL")))
    return CLI_OK;
  const char *dir = cli_data_dir_from(args, &from);
  if (strcmp(from, "--data-dir") != 0 && strcmp(from, "MUSTER_DATA_DIR") != 0)
    return CLI_OK;
  char line[1024], path[4200];
  if (cli_read_data_file(args, "url", line, sizeof line, &problem) == 0)
    return CLI_OK;
  cli_data_path(args, "url", path, sizeof path);
  return cli_usage_error(args->cmd,
                         "%s '%s' has no url file (%s: %s), which a head writes while it "
                         "runs: start the head with this data dir, name the data dir of a "
                         "running head, or pass --url (or set MUSTER_URL)",
                         from, dir, path, problem);
}

/* True when the data dir that --data-dir or MUSTER_DATA_DIR names holds a
 * head's store but no url file (its head is not running), and neither --url
 * nor MUSTER_URL is given: the URL is the one the head will write there. */
static bool cli_head_not_started(const cli_args_t *args) {
  const char *from;
  if (cli_named(cli_opt(args, "url")) || cli_named(getenv("MUSTER_URL")))
    return false;
  cli_data_dir_from(args, &from);
  if (strcmp(from, "--data-dir") != 0 && strcmp(from, "MUSTER_DATA_DIR") != 0)
    return false;
  char path[4200], line[1024];
  cli_data_path(args, "muster.db", path, sizeof path);
  return access(path, F_OK) == 0 && cli_read_data_file(args, "url", line, sizeof line, NULL) != 0;
}

int cli_await_head_start(const cli_args_t *args, const char *prog) {
  if (!cli_head_not_started(args))
    return CLI_OK;
  const char *dir = cli_data_dir(args);
  fprintf(stderr,
          "%s: waiting for the head of data dir %s to start (it writes %s/url when it "
          "listens); looking every second\n",
          prog, dir, dir);
  sigset_t stop, old;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, &old);
  int rc = CLI_OK;
  while (rc == CLI_OK && cli_head_not_started(args)) {
    struct timespec pause = {1, 0};
    if (sigtimedwait(&stop, NULL, &pause) > 0) {
      fprintf(stderr,
              "%s: stopped while waiting for the head of data dir %s; nothing was "
              "leased\n",
              prog, dir);
      rc = -1;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int cli_check_url(const cli_args_t *args) {
  int rc = cli_check_data_dir_url(args);
  if (rc != CLI_OK)
    return rc;
  char from[4200];
  const char *url = cli_url_from(args, from, sizeof from);
  const char *problem = url_head_problem(url);
  if (problem == NULL)
    return CLI_OK;
  return cli_usage_error(args->cmd, "%s '%s' is not a head's URL (http://HOST:PORT): %s", from, url,
                         problem);
}

const char *cli_token(const cli_args_t *args) {
  const char *token = cli_opt(args, "token");
  if (token == NULL || token[0] == '\0')
    token = getenv("MUSTER_TOKEN");
  if (token != NULL && token[0] != '\0')
    return token;
  const char *problem, *from;
  if (cli_read_data_file(args, "token", cli_token_buf, sizeof cli_token_buf, &problem) == 0)
    return cli_token_buf;
  char path[4200];
  cli_data_path(args, "token", path, sizeof path);
  cli_data_dir_from(args, &from);
  snprintf(cli_token_looked, sizeof cli_token_looked, "%s (%s, from %s)", path, problem, from);
  cli_token_from_nowhere = 1;
  return NULL;
}

int cli_connect(const cli_args_t *args, muster_client_t **out) {
  const char *url = cli_url(args);
  char *message = NULL;
  muster_err_t err = muster_client_open(url, cli_token(args), out, &message);
  if (err != MUSTER_OK) {
    fprintf(stderr, "muster: %s: cannot use server '%s' with that token: %s\n",
            muster_err_name(err), url, message ? message : muster_strerror(err));
    muster_free(message);
    return CLI_FAIL;
  }
  return CLI_OK;
}

void cli_catch_stop_signals(sigset_t *set, void (*handler)(int)) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  sigprocmask(SIG_BLOCK, set, NULL);
  struct sigaction sa = {.sa_handler = handler};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int cli_with_client(cli_args_t *args, int (*body)(cli_args_t *, muster_client_t *)) {
  muster_client_t *client = NULL;
  int rc = cli_connect(args, &client);
  if (rc == CLI_OK)
    rc = body(args, client);
  muster_client_free(client);
  return rc;
}

int cli_error(const muster_client_t *client, muster_err_t err) {
  return cli_error_of_one(client, err, NULL);
}

int cli_error_of_one(const muster_client_t *client, muster_err_t err, const char *element) {
  cli_note_server(muster_client_server(client));
  const char *message = muster_client_message(client);
  size_t len = element ? strlen(element) : 0;
  if (message && len && strncmp(message, element, len) == 0 && message[len] == '.')
    message += len + 1; /* "leases[0].lease_ms: ..." -> "lease_ms: ..." */
  else if (message && len && strncmp(message, element, len) == 0 &&
           strncmp(message + len, ": ", 2) == 0)
    message += len + 2; /* "leases[0]: task 7 does not exist" -> "task 7 does not exist" */
  return cli_error_message(err, message);
}

/* True when the user gave cli_url's URL (--url or MUSTER_URL). */
static bool cli_url_given(void) {
  return strcmp(cli_url_origin, "--url") == 0 || strcmp(cli_url_origin, "MUSTER_URL") == 0;
}

/* True when cli_url's URL was read from a data dir's url file. */
static bool cli_url_from_file(void) {
  size_t len = strlen(cli_url_origin);
  return len > 4 && strcmp(cli_url_origin + len - 4, "/url") == 0;
}

const char *cli_url_hint(char *buf, size_t size) {
  if (cli_url_given())
    snprintf(buf, size, "is %s right?", cli_url_origin);
  else if (cli_url_from_file())
    snprintf(buf, size, "the URL is from %s, which a head killed with -9 leaves behind",
             cli_url_origin);
  else
    snprintf(buf, size, "no URL was given: pass --url or set MUSTER_URL for another head");
  return buf;
}

void cli_note_server(muster_server_t server) {
  if (server != MUSTER_SERVER_UNKNOWN)
    cli_server_seen = server;
}

/* What answers at cli_url's URL, as far as the command knows: what a reply
 * said (cli_note_server), else a head when the URL is from a data dir's url
 * file (a head writes it), else unknown. */
static muster_server_t cli_server_known(void) {
  if (cli_server_seen != MUSTER_SERVER_UNKNOWN)
    return cli_server_seen;
  return cli_url_from_file() ? MUSTER_SERVER_HEAD : MUSTER_SERVER_UNKNOWN;
}

const char *cli_server_at(muster_server_t server, char *buf, size_t size) {
  if (server == MUSTER_SERVER_UNKNOWN)
    server = cli_server_known();
  snprintf(buf, size, "%s at %s",
           server == MUSTER_SERVER_HEAD   ? "the head"
           : server == MUSTER_SERVER_NODE ? "the node agent"
                                          : "the muster head or node agent",
           cli_url_used);
  return buf;
}

const char *cli_server_away(muster_server_t server, muster_err_t err, char *buf, size_t size) {
  if (server == MUSTER_SERVER_UNKNOWN)
    server = cli_server_known();
  if (server == MUSTER_SERVER_NODE && err == MUSTER_UNAVAILABLE)
    snprintf(buf, size, "the head behind the node agent at %s", cli_url_used);
  else
    cli_server_at(server, buf, size);
  return buf;
}

/*
 * The advice after a request that could not connect, by where its URL came
 * from: a URL the user gave is theirs to check, and a url file of a data dir
 * outlives a head that was killed (a head removes it only when it stops).
 * No reply says what was to answer there, so unless an earlier one did (or
 * the URL is from a head's url file), the question names both.  The default
 * URL is tried only when ./muster-data holds no url file: a head not started
 * yet, or a command run away from the head's dir.
 */
static void cli_say_no_head(void) {
  muster_server_t server = cli_server_known();
  const char *who = server == MUSTER_SERVER_HEAD   ? "the head"
                    : server == MUSTER_SERVER_NODE ? "the node agent"
                                                   : "a muster head or node agent";
  if (cli_url_given())
    fprintf(stderr,
            "muster: is %s running there? The URL is the one %s gives: start %s, or give the "
            "URL of a running one\n",
            who, cli_url_origin, server == MUSTER_SERVER_HEAD ? "the head" : "it");
  else if (cli_url_from_file())
    fprintf(stderr,
            "muster: is %s running there? The URL was read from %s, which a head writes "
            "when it listens and leaves behind when it is killed: start that head again, or "
            "pass --url (or set MUSTER_URL)\n",
            who, cli_url_origin);
  else
    fprintf(stderr,
            "muster: is %s running there? No URL was given and ./muster-data has no url file, "
            "so the default URL was tried: start a head (muster head), pass --url (or set "
            "MUSTER_URL), or name a running head's data dir with --data-dir (or "
            "MUSTER_DATA_DIR)\n",
            who);
}

/* After a request that was sent and got no reply: what may have stopped. */
static void cli_say_no_reply(void) {
  char at[1200];
  cli_server_at(MUSTER_SERVER_UNKNOWN, at, sizeof at);
  fprintf(stderr,
          "muster: the request was sent, but no reply came back: %s%s may have stopped or "
          "restarted; check what the head did before repeating it\n",
          at, cli_server_known() == MUSTER_SERVER_NODE ? ", or the head behind it," : "");
}

/* After "queue 'NAME' does not exist": how to make it, as `muster worker`
 * says it.  A message that names no queue gets nothing. */
static void cli_say_create_queue(const char *message) {
  const char *name = strstr(message, "queue '");
  if (name == NULL)
    return;
  name += strlen("queue '");
  int len = (int)strcspn(name, "'");
  if (len == 0 || name[len] != '\'')
    return;
  fprintf(stderr,
          "muster: create it with `muster queue create %.*s` (or see `muster queue ls` for the "
          "queues there are)\n",
          len, name);
}

int cli_error_message(muster_err_t err, const char *message) {
  if (message == NULL || message[0] == '\0')
    message = muster_strerror(err);
  /* The head's advice for a 401 without a token speaks of HTTP headers; the
   * CLI's user needs to know where the CLI looked instead. */
  if (err == MUSTER_UNAUTHORIZED && cli_token_from_nowhere)
    fprintf(stderr,
            "muster: %s: the head needs a token, and no token was given: not by --token, not "
            "by MUSTER_TOKEN, and not in %s\n"
            "muster: pass --token, set MUSTER_TOKEN, or point --data-dir (or MUSTER_DATA_DIR) "
            "at the head's data dir, which holds the file 'token'\n",
            muster_err_name(err), cli_token_looked);
  else
    fprintf(stderr, "muster: %s: %s\n", muster_err_name(err), message);
  if (err == MUSTER_NETWORK && strstr(message, "https://") &&
      strstr(message, "wrong version number"))
    fprintf(stderr, "muster: the server answered TLS with plain data: a muster head serves plain "
                    "HTTP unless a TLS proxy is in front of it; use an http:// URL\n");
  else if (err == MUSTER_NETWORK && cli_message_unsent(message))
    cli_say_no_head();
  else if (err == MUSTER_NETWORK)
    cli_say_no_reply();
  else if (err == MUSTER_QUEUE_NOT_FOUND)
    cli_say_create_queue(message);
  return CLI_FAIL;
}

int cli_request_unsent(const muster_client_t *client) {
  return cli_message_unsent(muster_client_message(client));
}

int cli_message_unsent(const char *message) {
  /* libmuster's own words, then curl's (https://).  A request sent on a
   * reused connection whose retry could not connect names both: it was sent. */
  static const char *const before_sending[] = {"could not connect", "could not resolve",
                                               "failed to connect", "couldn't connect",
                                               "couldn't resolve",  NULL};
  if (message == NULL || strstr(message, "sending it again failed"))
    return 0;
  for (int i = 0; before_sending[i]; i++)
    if (strcasestr(message, before_sending[i]))
      return 1;
  return 0;
}

/* "payload 3 (of 5)" or "payloads 3 to 5 (of 5)": items [at, at + n) of
 * `total`, counted from 1, into `buf`. */
static const char *cli_batch_items(const char *noun, size_t at, size_t n, size_t total, char *buf,
                                   size_t size) {
  if (n == 1)
    snprintf(buf, size, "%s %zu (of %zu)", noun, at + 1, total);
  else
    snprintf(buf, size, "%ss %zu to %zu (of %zu)", noun, at + 1, at + n, total);
  return buf;
}

void cli_say_batch_unsent(const char *noun, const char *printed, size_t at, size_t n,
                          size_t total) {
  char items[128];
  cli_batch_items(noun, at, n, total, items, sizeof items);
  const char *were = n == 1 ? "was" : "were";
  if (at == 0) {
    fprintf(stderr, "muster: %s %s not sent; nothing was stored\n", items, were);
    return;
  }
  fprintf(stderr,
          "muster: %s %s not sent, and the %zu before %s are stored (their %s are printed "
          "above): send again from %s %zu\n",
          items, were, at, n == 1 ? "it" : "them", printed, noun, at + 1);
}

void cli_say_batch_unanswered(const char *noun, const char *printed, const char *check, size_t at,
                              size_t n, size_t total) {
  char items[128], before[160] = "", then[80] = "nothing is left to send", otherwise[80];
  cli_batch_items(noun, at, n, total, items, sizeof items);
  if (at > 0)
    snprintf(before, sizeof before, "; the %zu before %s are stored (their %s are printed above)",
             at, n == 1 ? "it" : "them", printed);
  if (at + n < total)
    snprintf(then, sizeof then, "resume from %s %zu", noun, at + n + 1);
  if (at == 0 && at + n == total)
    snprintf(otherwise, sizeof otherwise, "send %s again", n == 1 ? "it" : "them");
  else
    snprintf(otherwise, sizeof otherwise, "%sfrom %s %zu", at + n < total ? "" : "resume ", noun,
             at + 1);
  int numbered = at > 0 || at + n < total; /* a "resume from N" was said */
  fprintf(stderr,
          "muster: %s may or may not be stored (%s sent, but no reply came)%s\n"
          "muster: before sending again, see whether %s %s: if it is, %s, else %s%s%s%s\n",
          items, n == 1 ? "it was" : "they were", before, n == 1 ? "it is" : "the batch is", check,
          then, otherwise, numbered ? " (" : "", numbered ? noun : "",
          numbered ? " N is the Nth non-empty input line)" : "");
}

void cli_print_pretty(const char *text) {
  json_t *value = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  char *pretty = value ? jdump(value, JSON_INDENT(2) | JSON_ENCODE_ANY) : NULL;
  puts(pretty ? pretty : text);
  free(pretty);
  json_decref(value);
}

int cli_escape(const char *name, char *out, size_t size) {
  static const char hex[] = "0123456789ABCDEF";
  size_t at = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                *p == '-' || *p == '_' || *p == '.';
    if (at + (plain ? 1 : 3) >= size)
      return -1;
    if (plain) {
      out[at++] = (char)*p;
    } else {
      out[at++] = '%';
      out[at++] = hex[*p >> 4];
      out[at++] = hex[*p & 15];
    }
  }
  out[at] = '\0';
  return 0;
}
