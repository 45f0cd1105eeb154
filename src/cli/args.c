/*
 * args.c — the command-line parser shared by every `muster` command.
 *
 * Options are long only (`--queue Q` or `--queue=Q`), may appear anywhere
 * before a `--`, and everything after `--` is positional (the worker's command,
 * or payloads that start with a dash); a `--` is never an option's value.  A
 * word starting with one dash is an unknown option unless it looks like a
 * negative number, so `muster put --json -5` puts the number -5.  Parsing
 * happens once, against the command's table row, before the command runs;
 * commands only read checked values.
 */
#include "cli/cli.h"
#include "core/option_twice.h"
#include "core/suggest.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

const cli_opt_t cli_client_opts[] = {
    {"url", "URL",
     "head URL (env MUSTER_URL, else DATA_DIR/url, else http://127.0.0.1:7370 when no data dir "
     "was named)"},
    {"token", "TOKEN", "bearer token (env MUSTER_TOKEN, else read from DATA_DIR/token)"},
    {"data-dir", "DIR",
     "the head's data dir, for its token and URL (env MUSTER_DATA_DIR, "
     "default ./muster-data)"},
    {NULL, NULL, NULL},
};

/* Options that may be given more than once, each value kept (cli_opt_values
 * reads them).  Any other option keeps its last value, as wrappers that add
 * their own to defaults (`muster node --listen ... "$@"`) expect, and a second,
 * different value is said on stderr: `--queue a --queue b` serves b alone. */
static const char *const cli_repeating[] = {"requires", NULL};

static bool cli_opt_repeats(const cli_opt_t *opt) {
  for (int i = 0; cli_repeating[i] != NULL; i++)
    if (strcmp(opt->name, cli_repeating[i]) == 0)
      return true;
  return false;
}

static int cli_count_opts(const cli_opt_t *opts) {
  int n = 0;
  while (opts && opts[n].name)
    n++;
  return n;
}

/* The option at index `i` of `cmd`: its own ones first, then the client ones. */
static const cli_opt_t *cli_opt_at(const cli_cmd_t *cmd, int i) {
  int own = cli_count_opts(cmd->opts);
  if (i < own)
    return &cmd->opts[i];
  if (cmd->client && i - own < cli_count_opts(cli_client_opts))
    return &cli_client_opts[i - own];
  return NULL;
}

/* The index of option `name` (`len` bytes) in `cmd`, or -1. */
static int cli_find_opt(const cli_cmd_t *cmd, const char *name, size_t len) {
  const cli_opt_t *opt;
  for (int i = 0; (opt = cli_opt_at(cmd, i)) != NULL; i++)
    if (strlen(opt->name) == len && strncmp(opt->name, name, len) == 0)
      return i;
  return -1;
}

void cli_print_item(FILE *out, const char *left, const char *help, int width) {
  int room = CLI_HELP_COLUMNS - 3 - width; /* "  " LEFT " " before the text */
  if (room < 20) /* a very wide column: overlong lines rather than one word each */
    room = 20;
  if ((int)strlen(left) > width) { /* alone on its line, as the head's own help does */
    fprintf(out, "  %s\n", left);
    left = "";
  }
  const char *at = help;
  do {
    size_t len = strlen(at);
    if ((int)len > room) { /* break at the last space that fits, else the first one after */
      const char *cut = at + room;
      while (cut > at && *cut != ' ')
        cut--;
      if (cut == at)
        cut = strchr(at + room, ' ');
      len = cut ? (size_t)(cut - at) : len;
    }
    fprintf(out, "  %-*s %.*s\n", width, left, (int)len, at);
    left = "";
    at += len;
    while (*at == ' ')
      at++;
  } while (*at != '\0');
}

/* "--name METAVAR" of `opt` into `buf`. */
static const char *cli_opt_left(const cli_opt_t *opt, char *buf, size_t size) {
  snprintf(buf, size, "--%s%s%s", opt->name, opt->metavar ? " " : "",
           opt->metavar ? opt->metavar : "");
  return buf;
}

/* The width of the widest "--name METAVAR" of `opts`, at least `width`. */
static int cli_opts_width(const cli_opt_t *opts, int width) {
  char left[64];
  for (int i = 0; opts && opts[i].name; i++) {
    int len = (int)strlen(cli_opt_left(&opts[i], left, sizeof left));
    width = len > width ? len : width;
  }
  return width;
}

static void cli_print_opts(const cli_opt_t *opts, int width, FILE *out) {
  char left[64];
  for (int i = 0; opts && opts[i].name; i++)
    cli_print_item(out, cli_opt_left(&opts[i], left, sizeof left), opts[i].help, width);
}

/* One column for the descriptions of every section of a command's help: the
 * widest option and a space more, so that the longest one does not run into
 * its description. */
void cli_usage(const cli_cmd_t *cmd, FILE *out) {
  int width = cli_opts_width(cmd->opts, CLI_HELP_MIN_WIDTH - 1);
  if (cmd->client)
    width = cli_opts_width(cli_client_opts, width);
  width++;
  fprintf(out, "usage: muster %s%s%s\n\n%s\n", cmd->name, cmd->synopsis[0] ? " " : "",
          cmd->synopsis, cmd->summary);
  int own = cmd->opts && cmd->opts[0].name;
  if (own || !cmd->client) /* --help is under "options:" unless under the client ones */
    fprintf(out, "\noptions:\n");
  cli_print_opts(cmd->opts, width, out);
  if (cmd->client) {
    fprintf(out, "\nclient options:\n");
    cli_print_opts(cli_client_opts, width, out);
  }
  cli_print_item(out, "-h, --help", "show this help and exit", width);
  if (cmd->details)
    fprintf(out, "\n%s", cmd->details);
}

int cli_usage_error(const cli_cmd_t *cmd, const char *fmt, ...) {
  va_list ap;
  fputs("muster: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'muster %s%s--help' for more information.\n", cmd ? cmd->name : "",
          cmd ? " " : "");
  return CLI_USAGE;
}

/* A word that starts with '-' but is a number, not an option: "-5", "-.5". */
static int cli_is_negative_number(const char *word) {
  return word[0] == '-' && (isdigit((unsigned char)word[1]) || word[1] == '.');
}

/* Says on stderr that option `opt`, given `before` already, now takes
 * `value` instead, when the two differ (option_twice.h); a token's values
 * are left out. */
static void cli_say_twice(const cli_opt_t *opt, const char *before, const char *value) {
  char *said = option_twice_text(opt->name, before, value, strcmp(opt->name, "token") == 0);
  if (said)
    fprintf(stderr, "muster: %s\n", said);
  free(said);
}

/* Says that option --`word` (`len` bytes) is not one of `cmd`'s, and which
 * of its options (or --help) it likely meant: `--nxt` for `--next`.
 * Returns CLI_USAGE. */
static int cli_unknown_long(const cli_cmd_t *cmd, const char *word, size_t len) {
  suggest_t likely;
  suggest_init(&likely, word, len);
  const cli_opt_t *opt;
  for (int i = 0; (opt = cli_opt_at(cmd, i)) != NULL; i++)
    suggest_offer(&likely, opt->name, strlen(opt->name));
  suggest_offer(&likely, "help", 4);
  size_t meant_len;
  const char *meant = suggest_best(&likely, &meant_len);
  if (meant)
    return cli_usage_error(cmd, "unknown option '--%.*s' for '%s' (did you mean '--%.*s'?)",
                           (int)len, word, cmd->name, (int)meant_len, meant);
  return cli_usage_error(cmd, "unknown option '--%.*s' for '%s'", (int)len, word, cmd->name);
}

/* Handles the option word argv[*i]; may consume the next word as its value. */
static int cli_take_opt(const cli_cmd_t *cmd, int argc, char **argv, int *i, cli_args_t *args) {
  const char *word = argv[*i] + 2;
  const char *eq = strchr(word, '=');
  size_t len = eq ? (size_t)(eq - word) : strlen(word);
  int idx = cli_find_opt(cmd, word, len);
  if (idx < 0 && cli_misplaced_option(cmd, word, len) != CLI_OK)
    return CLI_USAGE; /* another command's option, said as such */
  if (idx < 0)
    return cli_unknown_long(cmd, word, len);
  const cli_opt_t *opt = cli_opt_at(cmd, idx);
  if (opt->metavar == NULL) {
    if (eq)
      return cli_usage_error(cmd, "option '--%s' takes no value", opt->name);
    args->values[idx] = "";
    return CLI_OK;
  }
  /* A following "--" is the end of the options, not a value: `--gpus -- cat`
   * forgot the list (a value that is "--" is given as `--error=--`). */
  const char *before = args->values[idx], *value;
  if (eq)
    value = eq + 1;
  else if (*i + 1 < argc && strcmp(argv[*i + 1], "--") != 0)
    value = argv[++*i];
  else
    return cli_usage_error(cmd, "option '--%s' needs a value (%s)", opt->name, opt->metavar);
  if (!cli_opt_repeats(opt))
    cli_say_twice(opt, before, value);
  args->values[idx] = value;
  if (args->ngiven == CLI_MAX_VALUES)
    return cli_usage_error(cmd, "too many options: at most %d values may be given", CLI_MAX_VALUES);
  args->given[args->ngiven] = args->values[idx];
  args->given_opt[args->ngiven++] = idx;
  return CLI_OK;
}

/* A word with one dash that is no number: options are long, and an argument
 * that starts with a dash (a payload, the worker's command) goes after "--"
 * when the command takes arguments at all.  Returns CLI_USAGE. */
static int cli_unknown_short(const cli_cmd_t *cmd, const char *word) {
  if (cli_misplaced_short(cmd, word) != CLI_OK)
    return CLI_USAGE;
  if (cmd->max_pos == 0)
    return cli_usage_error(cmd, "unknown option '%s' for '%s' (options start with --)", word,
                           cmd->name);
  return cli_usage_error(cmd,
                         "unknown option '%s' for '%s' (options start with --); an argument "
                         "that starts with a dash goes after --, which ends the options",
                         word, cmd->name);
}

/*
 * The next required positional argument the synopsis `*at` names ("DATA" of
 * "--queue Q [options] DATA"), as [return, return + *len), moving *at past
 * it; NULL when none is left.  Optional parts ([...], (...)), an option with
 * its value (--queue Q), and what comes from stdin (< INPUTS) name none; a
 * repeated one ("BLOCK:TOKEN...") loses its dots.
 */
static const char *cli_synopsis_pos(const char **at, int *len) {
  int depth = 0, after_option = 0, after_stdin = 0;
  for (const char *word = *at; *word;) {
    word += strspn(word, " ");
    int n = (int)strcspn(word, " ");
    int plain =
        depth == 0 && !after_option && !after_stdin && n > 0 && isupper((unsigned char)*word);
    after_option = depth == 0 && strncmp(word, "--", 2) == 0;
    after_stdin = depth == 0 && n == 1 && *word == '<';
    for (int i = 0; i < n; i++)
      depth += (word[i] == '[' || word[i] == '(') - (word[i] == ']' || word[i] == ')');
    *at = word + n;
    if (plain) {
      *len = n;
      while (*len > 0 && word[*len - 1] == '.')
        --*len;
      return word;
    }
    word += n;
  }
  return NULL;
}

/* Says which required positional arguments of `cmd` are missing when `given`
 * came: "DATA is missing", "TASK and TOKEN are missing", into `buf`; "" when
 * the synopsis names none past `given`. */
static const char *cli_missing_pos(const cli_cmd_t *cmd, int given, char *buf, size_t size) {
  const char *names[8], *at = cmd->synopsis;
  int lens[8], count = 0, len;
  for (const char *name; count < 8 && (name = cli_synopsis_pos(&at, &len)) != NULL; given--)
    if (given <= 0) {
      names[count] = name;
      lens[count++] = len;
    }
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < count && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%.*s",
                             i == 0           ? ""
                             : i + 1 == count ? " and "
                                              : ", ",
                             lens[i], names[i]);
  if (count > 0 && used < size)
    snprintf(buf + used, size - used, count == 1 ? " is missing" : " are missing");
  return buf;
}

/* Checks the number of positional arguments against the command's bounds.
 * Too few are said with the usage line and which ones are missing. */
static int cli_check_pos(const cli_cmd_t *cmd, const cli_args_t *args) {
  char missing[256];
  if (args->npos < cmd->min_pos && cli_missing_pos(cmd, args->npos, missing, sizeof missing)[0])
    return cli_usage_error(cmd, "'%s' needs %s: %s", cmd->name, cmd->synopsis, missing);
  if (args->npos < cmd->min_pos)
    return cli_usage_error(cmd, "'%s' needs %s", cmd->name,
                           cmd->synopsis[0] ? cmd->synopsis : "more arguments");
  if (cmd->max_pos >= 0 && args->npos > cmd->max_pos)
    return cli_usage_error(cmd, "unexpected argument '%s' for '%s'", args->pos[cmd->max_pos],
                           cmd->name);
  return CLI_OK;
}

int cli_parse(const cli_cmd_t *cmd, int argc, char **argv, char **pos, cli_args_t *args) {
  memset(args, 0, sizeof *args);
  args->cmd = cmd;
  args->pos = pos;
  for (int i = 0; i < argc; i++) {
    const char *word = argv[i];
    if (strcmp(word, "--") == 0) {
      args->dashdash = 1;
      args->npos_before_dashdash = args->npos;
      while (++i < argc)
        pos[args->npos++] = argv[i];
      break;
    }
    if (strcmp(word, "-h") == 0 || strcmp(word, "--help") == 0) {
      cli_usage(cmd, stdout);
      return -1;
    }
    if (strncmp(word, "--", 2) == 0) {
      int rc = cli_take_opt(cmd, argc, argv, &i, args);
      if (rc != CLI_OK)
        return rc;
    } else if (word[0] == '-' && word[1] != '\0' && !cli_is_negative_number(word)) {
      return cli_unknown_short(cmd, word);
    } else {
      pos[args->npos++] = argv[i];
    }
  }
  if (!args->dashdash)
    args->npos_before_dashdash = args->npos;
  return cli_check_pos(cmd, args);
}

const char *cli_opt(const cli_args_t *args, const char *name) {
  int idx = cli_find_opt(args->cmd, name, strlen(name));
  return idx < 0 ? NULL : args->values[idx];
}

int cli_opt_values(const cli_args_t *args, const char *name, const char **out, int max) {
  int idx = cli_find_opt(args->cmd, name, strlen(name)), count = 0;
  for (int i = 0; idx >= 0 && i < args->ngiven; i++) {
    if (args->given_opt[i] != idx)
      continue;
    if (count < max)
      out[count] = args->given[i];
    count++;
  }
  return count;
}

int cli_flag(const cli_args_t *args, const char *name) {
  return cli_opt(args, name) != NULL;
}

/* Parses `text` as an integer from `min` to `max` for `what` of `cmd` into
 * *out.  CLI_OK, or CLI_USAGE after the error: not an integer, or one out of
 * the range, said with the range (strtoll's ERANGE is an integer too, only one
 * too large for any option, so it gets the range as well). */
static int cli_parse_int_range(const cli_cmd_t *cmd, const char *text, const char *what,
                               int64_t min, int64_t max, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long value = strtoll(text, &end, 10);
  if (text[0] == '\0' || *end != '\0')
    return cli_usage_error(cmd, "%s: expected an integer, got '%s'", what, text);
  if (errno == ERANGE)
    return cli_usage_error(cmd, "%s: %s is out of range: it must be from %lld to %lld", what, text,
                           (long long)min, (long long)max);
  if (value < min)
    return cli_usage_error(cmd, "%s: must be at least %lld, got %lld", what, (long long)min, value);
  /* Said here in the option's words: the head would name its JSON field
   * ("tasks[0].priority") and the command would fail with status 1. */
  if (value > max)
    return cli_usage_error(cmd, "%s: must be at most %lld, got %lld", what, (long long)max, value);
  *out = (int64_t)value;
  return CLI_OK;
}

int cli_parse_int(const cli_cmd_t *cmd, const char *text, const char *what, int64_t min,
                  int64_t *out) {
  return cli_parse_int_range(cmd, text, what, min, INT64_MAX, out);
}

int cli_opt_int(const cli_args_t *args, const char *name, int64_t fallback, int64_t min,
                int64_t *out) {
  return cli_opt_int_range(args, name, fallback, min, INT64_MAX, out);
}

int cli_opt_int_range(const cli_args_t *args, const char *name, int64_t fallback, int64_t min,
                      int64_t max, int64_t *out) {
  const char *text = cli_opt(args, name);
  if (text == NULL) {
    *out = fallback;
    return CLI_OK;
  }
  char what[64];
  snprintf(what, sizeof what, "--%s", name);
  return cli_parse_int_range(args->cmd, text, what, min, max, out);
}
