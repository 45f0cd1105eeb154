/*
 * head_options.c — `muster head`'s command line: its help, and the options
 * read into the head's configuration with one line per refused word.
 */
#include "head.h"
#include "compat.h"
#include "core/option_twice.h"
#include "core/suggest.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_TOKEN_MIN 8 /* characters of --token and --dashboard-token: not guessable */

bool head_token_problem(const char *token, size_t max, char *why, size_t size) {
  size_t len = strlen(token);
  if (len < HEAD_TOKEN_MIN || len > max) {
    snprintf(why, size, "must be %d to %zu characters long (this one has %zu)", HEAD_TOKEN_MIN, max,
             len);
    return true;
  }
  /* A bearer token travels in an HTTP header: visible ASCII, no space. */
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)token[i];
    if (c <= ' ' || c >= 0x7f) {
      snprintf(why, size,
               "must be visible ASCII characters without spaces, as an HTTP header "
               "carries it (character %zu is %s)",
               i + 1,
               c == ' '               ? "a space"
               : c < ' ' || c == 0x7f ? "a control character"
                                      : "not ASCII");
      return true;
    }
  }
  return false;
}

static const char head_usage_text[] =
    "usage: muster head [options]\n"
    "\n"
    "Runs the head: the HTTP API, the durable store and the schedulers.\n"
    "\n"
    "options:\n"
    "  --listen ADDR:PORT        address to listen on (default 127.0.0.1:7370;\n"
    "                            port 0 picks a free port, written to\n"
    "                            DATA_DIR/url)\n"
    "  --data-dir DIR            where the store, token and url live (default\n"
    "                            ./muster-data)\n"
    "  --token TOKEN             admin bearer token, 8 to 255 visible ASCII\n"
    "                            characters, no spaces (default: generated once\n"
    "                            into DATA_DIR/token)\n"
    "  --sync full|normal        full: fsync at every commit (default); normal:\n"
    "                            faster, a power loss may drop the last commits\n"
    "  --sync-leases             with --sync full, flush leases too: by default a\n"
    "                            lease of tasks already on disk is answered at its\n"
    "                            commit, and a power loss may forget it (its task\n"
    "                            is leased again)\n"
    "  --worker-timeout-ms MS    default worker heartbeat timeout (default 60000)\n"
    "  --node-timeout-ms MS      default node heartbeat timeout (default 15000); a\n"
    "                            silent node's workers are gone and their tasks\n"
    "                            rescheduled\n"
    "  --max-wait-ms MS          the longest a long-poll (a lease, a read of\n"
    "                            results) waits (default 30000)\n"
    "  --sweep-ms MS             how often expired leases and silent workers are\n"
    "                            checked (default 200)\n"
    "  --max-body BYTES          request body limit (default 8388608)\n"
    "  --max-payload BYTES       payload and result limit (default 1048576)\n"
    "  --max-blob-bytes BYTES    shared data: largest blob (default 4294967296)\n"
    "  --max-shared-ttl-ms MS    shared data: default and largest ttl_ms; larger ones\n"
    "                            are clamped (default 600000)\n"
    "  --shared-keep-levels N    shared data: newest levels kept per blob (default 2)\n"
    "  --dashboard-token TOKEN   a read-only token for the dashboard and other\n"
    "                            readers (as --token's): it may GET the API and\n"
    "                            /metrics, never change anything\n"
    "  --metrics-public          serve GET /metrics without a token\n"
    "  --distcompute NAME=Q1,Q2,...\n"
    "                            expose queues Q1..Q5 (stages a..e) to DistCompute\n"
    "                            clients at /compat/distcompute/NAME (repeatable)\n"
    "  --distcompute-max-workers N\n"
    "                            active DistCompute workers per pipeline, at most:\n"
    "                            api/new beyond is refused with 503 (default 10000)\n"
    "  --log-level LEVEL         debug, info, warn or error (default info)\n"
    "  -h, --help                show this help\n";

void head_usage(void) {
  fputs(head_usage_text, stdout);
}

/* Parses "HOST:PORT" or "[V6]:PORT" into the config. */
static bool head_parse_listen(const char *arg, head_config_t *cfg) {
  const char *colon = strrchr(arg, ':');
  if (colon == NULL || colon == arg)
    return false;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535)
    return false;
  const char *host = arg;
  size_t len = (size_t)(colon - arg);
  if (host[0] == '[' && len >= 2 && host[len - 1] == ']') {
    host++;
    len -= 2;
  }
  if (len == 0 || len >= sizeof cfg->listen_host)
    return false;
  memcpy(cfg->listen_host, host, len);
  cfg->listen_host[len] = '\0';
  cfg->listen_port = (int)port;
  return true;
}

static bool parse_size(const char *arg, int64_t min, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(arg, &end, 10);
  if (*arg == '\0' || *end != '\0' || errno == ERANGE || v < min)
    return false; /* ERANGE: too large for any option, not clamped to the largest */
  *out = v;
  return true;
}

/* The options of `muster head`; head_set_option switches on their `val`. */
static const struct option head_options[] = {
    {"listen", required_argument, 0, 'l'},
    {"data-dir", required_argument, 0, 'd'},
    {"token", required_argument, 0, 't'},
    {"sync", required_argument, 0, 's'},
    {"worker-timeout-ms", required_argument, 0, 'w'},
    {"max-wait-ms", required_argument, 0, 'W'},
    {"sweep-ms", required_argument, 0, 'S'},
    {"max-body", required_argument, 0, 'b'},
    {"max-payload", required_argument, 0, 'p'},
    {"log-level", required_argument, 0, 'L'},
    {"help", no_argument, 0, 'h'},
    {"dashboard-token", required_argument, 0, 'D'},
    {"metrics-public", no_argument, 0, 'M'},
    {"distcompute", required_argument, 0, 'C'},
    {"node-timeout-ms", required_argument, 0, 'N'},
    {"max-blob-bytes", required_argument, 0, 'B'},
    {"max-shared-ttl-ms", required_argument, 0, 'T'},
    {"shared-keep-levels", required_argument, 0, 'K'},
    {"sync-leases", no_argument, 0, 'Y'},
    {"distcompute-max-workers", required_argument, 0, 'm'},
    {0, 0, 0, 0},
};

/* What --sync takes, in this order: index 0 fsyncs at every commit. */
static const char *const head_sync_words[] = {"full", "normal", NULL};

const char *head_option_at(size_t i, bool *valued) {
  if (i >= sizeof head_options / sizeof head_options[0] - 1)
    return NULL;
  *valued = head_options[i].has_arg == required_argument;
  return head_options[i].name;
}

const char *const *head_option_words(const char *name) {
  if (strcmp(name, "sync") == 0)
    return head_sync_words;
  if (strcmp(name, "log-level") == 0)
    return log_level_words;
  return NULL;
}

int head_option_arity(const char *name, size_t len) {
  for (int i = 0; head_options[i].name; i++)
    if (strlen(head_options[i].name) == len && strncmp(head_options[i].name, name, len) == 0)
      return head_options[i].has_arg == required_argument;
  return -1;
}

const char *head_likely_option(const char *word, const char *const *also, char *buf, size_t size) {
  buf[0] = '\0';
  if (strncmp(word, "--", 2) != 0)
    return buf;
  suggest_t likely;
  suggest_init(&likely, word + 2, strcspn(word + 2, "="));
  for (int i = 0; head_options[i].name; i++)
    suggest_offer(&likely, head_options[i].name, strlen(head_options[i].name));
  for (int i = 0; also && also[i]; i++)
    suggest_offer(&likely, also[i], strlen(also[i]));
  size_t len;
  const char *meant = suggest_best(&likely, &len);
  if (meant)
    snprintf(buf, size, " (did you mean '--%.*s'?)", (int)len, meant);
  return buf;
}

/* Reports the option word getopt_long refused (`c` is its ':' for a missing
 * value, '?' otherwise) in one line; returns the exit status 2. */
static int head_parse_refuse(int c, const char *word) {
  char shown[64];
  if (optopt > 0 && optopt < 128 && word[0] == '-' && word[1] != '-')
    snprintf(shown, sizeof shown, "-%c", optopt); /* a short option, maybe in a cluster */
  else
    snprintf(shown, sizeof shown, "%.*s", (int)strcspn(word, "="), word);
  bool long_known = c == '?' && optopt != 0 && word[1] == '-'; /* --help=3 */
  char likely[96] = "";
  if (c == '?' && !long_known)
    head_likely_option(word, NULL, likely, sizeof likely);
  fprintf(stderr, "muster head: %s '%s'%s%s; see 'muster head --help'\n",
          c == ':'     ? "missing value for option"
          : long_known ? "option"
                       : "unrecognized option",
          shown, long_known ? " takes no value" : "", likely);
  return 2;
}

/* Stores the value of the numeric option `c` (a size, a count or a duration)
 * in the config; false when it is no integer or below the option's minimum. */
static bool head_set_number(int c, head_config_t *cfg) {
  int64_t n = 0;
  bool ok;
  switch (c) {
  case 'w':
    return parse_size(optarg, 100, &cfg->worker_timeout_ms);
  case 'W':
    return parse_size(optarg, 0, &cfg->max_wait_ms);
  case 'S':
    return parse_size(optarg, 10, &cfg->sweep_ms);
  case 'N':
    return parse_size(optarg, 100, &cfg->node_timeout_ms);
  case 'T':
    return parse_size(optarg, 1, &cfg->max_shared_ttl_ms);
  case 'm':
    return parse_size(optarg, 1, &cfg->distcompute_max_workers);
  case 'b':
    ok = parse_size(optarg, 1024, &n);
    cfg->max_body = (size_t)n;
    return ok;
  case 'p':
    ok = parse_size(optarg, 64, &n);
    cfg->max_payload = (size_t)n;
    return ok;
  case 'B':
    ok = parse_size(optarg, 1, &n);
    cfg->max_blob_bytes = (size_t)n;
    return ok;
  case 'K':
    ok = parse_size(optarg, 1, &n);
    cfg->shared_keep_levels = (size_t)n;
    return ok;
  default:
    return false;
  }
}

/* Stores the value of option `c` (any of head_options but --help) in the
 * config; false when it is refused, with the rule a token breaks in `why`. */
static bool head_set_option(int c, head_config_t *cfg, const char **token_arg, char *why,
                            size_t size) {
  bool ok;
  switch (c) {
  case 'l':
    return head_parse_listen(optarg, cfg);
  case 'd':
    ok = strlen(optarg) < sizeof cfg->data_dir - 32;
    snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", optarg);
    return ok;
  case 't':
    *token_arg = optarg;
    return !head_token_problem(optarg, sizeof cfg->token - 1, why, size);
  case 's':
    ok = strcmp(optarg, head_sync_words[0]) == 0 || strcmp(optarg, head_sync_words[1]) == 0;
    cfg->sync_full = strcmp(optarg, head_sync_words[0]) == 0;
    return ok;
  case 'Y':
    cfg->sync_leases = true;
    return true;
  case 'L':
    ok = log_level_parse(optarg) >= 0;
    if (ok)
      log_set_level((log_level_t)log_level_parse(optarg));
    return ok;
  case 'D':
    ok = !head_token_problem(optarg, sizeof cfg->read_token - 1, why, size);
    snprintf(cfg->read_token, sizeof cfg->read_token, "%s", optarg);
    return ok;
  case 'M':
    cfg->metrics_public = true;
    return true;
  case 'C':
    return compat_add_pipeline(optarg);
  default:
    return head_set_number(c, cfg);
  }
}

/* What option `c` takes, said after a value it refused, so that the line
 * alone tells what to write: the numbers' smallest values are in no help. */
static const struct {
  int c;
  const char *expected;
} head_expected[] = {
    {'l', "ADDR:PORT, such as 127.0.0.1:7370 (0.0.0.0:7370: every interface; port 0 picks a "
          "free one)"},
    {'d', "a path shorter than 4064 bytes"},
    {'s', "full or normal"},
    {'L', "debug, info, warn or error"},
    {'w', "a whole number of milliseconds, from 100 to 9223372036854775807"},
    {'W', "a whole number of milliseconds, from 0 to 9223372036854775807"},
    {'S', "a whole number of milliseconds, from 10 to 9223372036854775807"},
    {'N', "a whole number of milliseconds, from 100 to 9223372036854775807"},
    {'T', "a whole number of milliseconds, from 1 to 9223372036854775807"},
    {'b', "a whole number of bytes, from 1024 to 9223372036854775807"},
    {'p', "a whole number of bytes, from 64 to 9223372036854775807"},
    {'B', "a whole number of bytes, from 1 to 9223372036854775807"},
    {'K', "a whole number of levels, from 1 to 9223372036854775807"},
    {'m', "a whole number of workers, from 1 to 9223372036854775807"},
};

/* Reports the refused value of option `c` (--`name`) in one line; returns the
 * exit status 2.  --distcompute has said why already (compat_add_pipeline). */
static int head_parse_invalid(int c, const char *name, const char *why) {
  if (c == 't' || c == 'D') { /* a secret: give the rule, not the value */
    fprintf(stderr, "muster head: --%s %s; see 'muster head --help'\n", name, why);
    return 2;
  }
  if (c == 'C')
    return 2;
  const char *expected = "another value";
  for (size_t i = 0; i < sizeof head_expected / sizeof head_expected[0]; i++)
    if (head_expected[i].c == c)
      expected = head_expected[i].expected;
  fprintf(stderr,
          "muster head: invalid value '%s' for --%s: expected %s; see 'muster head --help'\n",
          optarg, name, expected);
  return 2;
}

#define HEAD_OPTION_COUNT (sizeof head_options / sizeof head_options[0])

/* Says on stderr, as the other commands do (args.c), that option `which`,
 * given before with value given[which], now takes optarg instead, when the
 * two differ; remembers optarg.  The last value is the one used, so that a
 * wrapper may put its own defaults before the user's options.  Flags and
 * --distcompute (each value adds a pipeline) have nothing to say; a token's
 * values are left out. */
static void head_note_value(int c, int which, const char *given[HEAD_OPTION_COUNT]) {
  if (optarg == NULL || c == 'C')
    return;
  const char *name = head_options[which].name;
  char *said = option_twice_text(name, given[which], optarg, c == 't' || c == 'D');
  if (said)
    fprintf(stderr, "muster head: %s\n", said);
  free(said);
  given[which] = optarg;
}

/* True when argv word `word` names option `which` in part only ("--listen"
 * whole is fine, "--lis" or "--lis=..." is not): getopt_long takes a
 * prefix that starts one name alone, the other commands take names whole,
 * and a prefix in a script would change meaning once an option is added. */
static bool head_abbreviated(const char *word, int which) {
  if (word == NULL || strncmp(word, "--", 2) != 0)
    return false;
  return strcspn(word + 2, "=") != strlen(head_options[which].name);
}

int head_parse(int argc, char **argv, head_config_t *cfg, const char **token_arg) {
  int c, which = 0;
  char why[160];
  const char *given[HEAD_OPTION_COUNT] = {0};
  optind = 1;
  opterr = 0; /* getopt's own two-line message is replaced by one line below */
  /* "+": no permuting, so that argv[at] is the word just parsed. */
  for (int at = optind; (c = getopt_long(argc, argv, "+:h", head_options, &which)) != -1;
       at = optind) {
    if (c != '?' && c != ':' && head_abbreviated(argv[at], which)) {
      optopt = 0; /* an unknown name, not a known one given a value */
      return head_parse_refuse('?', argv[at]);
    }
    if (c == 'h') {
      head_usage();
      return 0;
    }
    if (c == '?' || c == ':') /* getopt_long's answers for an unknown word, a missing value */
      return head_parse_refuse(c, argv[optind - 1]);
    if (!head_set_option(c, cfg, token_arg, why, sizeof why))
      return head_parse_invalid(c, head_options[which].name, why);
    head_note_value(c, which, given);
  }
  if (optind < argc && strstr(argv[optind], "://") != NULL) {
    fprintf(stderr,
            "muster head: unexpected argument '%s': a head joins nothing, it listens "
            "(--listen ADDR:PORT); to join the head at that URL from this machine, run "
            "`muster node --join %s`\n",
            argv[optind], argv[optind]);
    return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "muster head: unexpected argument '%s'; see 'muster head --help'\n",
            argv[optind]);
    return 2;
  }
  if (cfg->read_token[0] && *token_arg && strcmp(cfg->read_token, *token_arg) == 0) {
    fprintf(stderr, "muster head: --dashboard-token must differ from --token\n");
    return 2;
  }
  return -1;
}
