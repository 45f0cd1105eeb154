/*
 * completion.c — `muster completion bash|zsh`: a shell completion script
 * printed from the very tables the command line is parsed with.
 *
 * The script is data the binary prints at run time and one fixed function
 * that reads it.  The data: the command words (main.c's table), each
 * command's options with the client ones (args.c), `muster head`'s own
 * (head_options.c) and its local agent's (cmd_node.c), and the words the
 * value of an option may be, taken from the lists its parser checks against
 * (--order, --state, --sync, ...).  A command or an option added to a table is
 * therefore completed with no edit here, and a script matches the binary that
 * printed it.  Nothing is asked of a head: queue names, ids and the like are
 * not completed.  zsh runs the same script through its bashcompinit.
 */
#include "cli/cli.h"
#include "core/partition.h"
#include "server/head.h"

#include <stdbool.h>
#include <string.h>

/* The shells `muster completion` prints a script for. */
static const char *const completion_shells[] = {"bash", "zsh", NULL};

/* The words the value of an option may be: a list (NULL-terminated when
 * `count` is 0), or a function naming each of `count` enum values. */
typedef struct {
  const char *const *list;
  const char *(*name)(unsigned value);
  unsigned count;
} completion_words_t;

static const char *shuffle_name(unsigned value) {
  return part_shuffle_name((part_shuffle_t)value);
}

static const char *strategy_name(unsigned value) {
  return part_strategy_name((part_strategy_t)value);
}

static const char *tail_name(unsigned value) {
  return part_tail_name((part_tail_t)value);
}

/* Options of the client commands whose values are one of a list, each the
 * list its parser checks (or core's names, which the head checks).  Keyed by
 * option name: every command taking --state takes a task state. */
static const struct {
  const char *option;
  completion_words_t words;
} completion_cli_words[] = {
    {"order", {cli_result_orders, NULL, 0}},
    {"cluster-sync", {cli_bool_words, NULL, 0}},
    {"state", {cli_task_states, NULL, CLI_TASK_STATES}},
    {"shuffle", {NULL, shuffle_name, PART_SHUFFLE_COUNT}},
    {"strategy", {NULL, strategy_name, PART_STRATEGY_COUNT}},
    {"tail", {NULL, tail_name, PART_TAIL_COUNT}},
};

/* Word `i` of `words`, or NULL past the last. */
static const char *completion_word(const completion_words_t *words, unsigned i) {
  if (words->count > 0 && i >= words->count)
    return NULL;
  return words->list ? words->list[i] : words->name(i);
}

/* The words of client option --`name`, or NULL. */
static const completion_words_t *completion_cli_words_of(const char *name) {
  for (size_t i = 0; i < sizeof completion_cli_words / sizeof completion_cli_words[0]; i++)
    if (strcmp(completion_cli_words[i].option, name) == 0)
      return &completion_cli_words[i].words;
  return NULL;
}

/* Whether `word` may go into the script as it is: the script is read by the
 * shell, so a name with a quote, a space or a `$` is left out rather than
 * escaped (no table has one). */
static bool completion_safe(const char *word) {
  return word[0] != '\0' && strspn(word, "abcdefghijklmnopqrstuvwxyz0123456789_.-") == strlen(word);
}

static bool completion_ends_with(const char *name, const char *suffix) {
  size_t len = strlen(name), slen = strlen(suffix);
  return len >= slen && strcmp(name + len - slen, suffix) == 0;
}

/* The mark after an option's name in the script's lists, which says what its
 * value is: none for a flag, "=" any value (nothing is offered), "=w" one of
 * _muster_words, "=f" a file (metavar FILE or PATH, or a name ending in
 * -file), "=d" a directory (metavar DIR, or a name ending in -dir, as the
 * head's --data-dir, which has no metavar). */
static const char *completion_mark(const char *name, const char *metavar, bool has_words) {
  if (metavar == NULL)
    return "";
  if (has_words)
    return "=w";
  if (strcmp(metavar, "DIR") == 0 || completion_ends_with(name, "-dir"))
    return "=d";
  if (strcmp(metavar, "FILE") == 0 || strcmp(metavar, "PATH") == 0 ||
      completion_ends_with(name, "-file"))
    return "=f";
  return "=";
}

/* One option as the script sees it. */
typedef struct {
  const char *name;                /* without the dashes */
  const char *metavar;             /* NULL: a flag */
  const completion_words_t *words; /* the words of its value, or NULL */
} completion_opt_t;

/* What is done with each option of a command: printing its name in the list
 * of options, or the words of its value. */
typedef void (*completion_each_fn)(FILE *out, const cli_cmd_t *cmd, const completion_opt_t *opt);

/* `muster head`'s options: the head's own (head_options.c; --help is added
 * by the caller) and its local agent's (cmd_node.c). */
static void completion_each_head_option(FILE *out, const cli_cmd_t *cmd, completion_each_fn each) {
  const char *name;
  bool valued;
  for (size_t i = 0; (name = head_option_at(i, &valued)) != NULL; i++) {
    const char *const *list = head_option_words(name);
    completion_words_t words = {list, NULL, 0};
    if (strcmp(name, "help") != 0)
      each(out, cmd, &(completion_opt_t){name, valued ? "VALUE" : NULL, list ? &words : NULL});
  }
  const char *metavar;
  for (size_t i = 0; (name = cli_head_agent_option(i, &metavar)) != NULL; i++)
    each(out, cmd, &(completion_opt_t){name, metavar, completion_cli_words_of(name)});
}

/* Calls `each` for every option `cmd` takes: its own, the client ones of a
 * client command, and --help.  A NULL `cmd` is the words before a command:
 * the client options, --help and --version. */
static void completion_each_option(FILE *out, const cli_cmd_t *cmd, completion_each_fn each) {
  each(out, cmd, &(completion_opt_t){"help", NULL, NULL});
  if (cmd == NULL)
    each(out, cmd, &(completion_opt_t){"version", NULL, NULL});
  if (cmd != NULL && strcmp(cmd->name, "head") == 0) {
    completion_each_head_option(out, cmd, each);
    return;
  }
  for (int i = 0; cmd && cmd->opts && cmd->opts[i].name; i++)
    each(out, cmd,
         &(completion_opt_t){cmd->opts[i].name, cmd->opts[i].metavar,
                             completion_cli_words_of(cmd->opts[i].name)});
  for (int i = 0; (cmd == NULL || cmd->client) && cli_client_opts[i].name; i++)
    each(out, cmd,
         &(completion_opt_t){cli_client_opts[i].name, cli_client_opts[i].metavar,
                             completion_cli_words_of(cli_client_opts[i].name)});
}

/* Prints " --name=MARK" of `opt` (the first one without the space). */
static void completion_print_option(FILE *out, const cli_cmd_t *cmd, const completion_opt_t *opt) {
  if (!completion_safe(opt->name))
    return;
  fprintf(out, "%s--%s%s", strcmp(opt->name, "help") == 0 ? "" : " ", opt->name,
          completion_mark(opt->name, opt->metavar, opt->words != NULL));
}

/* Prints the case arm of _muster_words for `opt` of `cmd`, when its value
 * is one of a list. */
static void completion_print_words(FILE *out, const cli_cmd_t *cmd, const completion_opt_t *opt) {
  if (opt->words == NULL || opt->metavar == NULL || !completion_safe(opt->name))
    return;
  fprintf(out, "  \"%s --%s\") echo \"", cmd->name, opt->name);
  const char *word;
  for (unsigned i = 0; (word = completion_word(opt->words, i)) != NULL; i++)
    if (completion_safe(word))
      fprintf(out, "%s%s", i > 0 ? " " : "", word);
  fprintf(out, "\" ;;\n");
}

/* Whether a row before cmds[i] has the same first word ("queue" of "queue
 * create" and "queue ls"): a group is offered once. */
static bool completion_seen(const cli_cmd_t *cmds, size_t i) {
  size_t len = strcspn(cmds[i].name, " ");
  for (size_t k = 0; k < i; k++)
    if (strcspn(cmds[k].name, " ") == len && strncmp(cmds[k].name, cmds[i].name, len) == 0)
      return true;
  return false;
}

/* Prints _muster_commands, the first words: each command, each group once. */
static void completion_print_commands(FILE *out, const cli_cmd_t *cmds, size_t n) {
  fprintf(out, "_muster_commands=\"");
  for (size_t i = 0; i < n; i++)
    if (!completion_seen(cmds, i))
      fprintf(out, "%s%.*s", i > 0 ? " " : "", (int)strcspn(cmds[i].name, " "), cmds[i].name);
  fprintf(out, "\"\n\n");
}

/* Prints _muster_subcommands GROUP: the second words of each group. */
static void completion_print_groups(FILE *out, const cli_cmd_t *cmds, size_t n) {
  fprintf(out, "# _muster_subcommands GROUP: its subcommands; fails for a word that is no group.\n"
               "_muster_subcommands() {\n  case $1 in\n");
  for (size_t i = 0; i < n; i++) {
    size_t len = strcspn(cmds[i].name, " ");
    if (cmds[i].name[len] != ' ' || completion_seen(cmds, i))
      continue; /* a command of one word, or a group printed already */
    fprintf(out, "  %.*s) echo \"", (int)len, cmds[i].name);
    for (size_t k = i; k < n; k++)
      if (strncmp(cmds[k].name, cmds[i].name, len + 1) == 0) /* "queue " */
        fprintf(out, "%s%s", k > i ? " " : "", cmds[k].name + len + 1);
    fprintf(out, "\" ;;\n");
  }
  fprintf(out, "  *) return 1 ;;\n  esac\n}\n\n");
}

/* Prints _muster_options COMMAND, every option with its mark. */
static void completion_print_options(FILE *out, const cli_cmd_t *cmds, size_t n) {
  fprintf(out, "# _muster_options COMMAND: its options (\"\": those before a command), each\n"
               "# marked by what its value is: none a flag, '=' any value, '=w' one of\n"
               "# _muster_words, '=f' a file, '=d' a directory.\n"
               "_muster_options() {\n  case $1 in\n  \"\") echo \"");
  completion_each_option(out, NULL, completion_print_option);
  fprintf(out, "\" ;;\n");
  for (size_t i = 0; i < n; i++) {
    fprintf(out, "  \"%s\") echo \"", cmds[i].name);
    completion_each_option(out, &cmds[i], completion_print_option);
    fprintf(out, "\" ;;\n");
  }
  fprintf(out, "  esac\n}\n\n"
               "# _muster_words COMMAND OPTION: the words the value of OPTION may be.\n"
               "_muster_words() {\n  case \"$1 $2\" in\n");
  for (size_t i = 0; i < n; i++)
    completion_each_option(out, &cmds[i], completion_print_words);
  fprintf(out, "  esac\n}\n\n");
}

/* What the arguments of `cmd` are, where they can be completed with no head:
 * "f" files (a FILE in its synopsis), "c" a command to run after `--`, then
 * its files (a CMD in its synopsis, and `muster head`'s local agent), "h"
 * command words (`help`), "s" shell names (`completion`); "" nothing. */
static const char *completion_arguments(const cli_cmd_t *cmd) {
  if (strcmp(cmd->name, "help") == 0)
    return "h";
  if (strcmp(cmd->name, "completion") == 0)
    return "s";
  if (strstr(cmd->synopsis, "CMD") || strcmp(cmd->name, "head") == 0)
    return "c";
  return strstr(cmd->synopsis, "FILE") ? "f" : "";
}

/* Prints _muster_arguments COMMAND and _muster_shells. */
static void completion_print_arguments(FILE *out, const cli_cmd_t *cmds, size_t n) {
  fprintf(out, "# _muster_arguments COMMAND: what its arguments are: f files, c a command\n"
               "# after --, h command words, s shells; nothing: not completed.\n"
               "_muster_arguments() {\n  case $1 in\n");
  for (size_t i = 0; i < n; i++)
    if (completion_arguments(&cmds[i])[0] != '\0')
      fprintf(out, "  \"%s\") echo %s ;;\n", cmds[i].name, completion_arguments(&cmds[i]));
  fprintf(out, "  esac\n}\n\n_muster_shells=\"");
  for (int i = 0; completion_shells[i]; i++)
    fprintf(out, "%s%s", i > 0 ? " " : "", completion_shells[i]);
  fprintf(out, "\"\n\n");
}

/* The fixed part of the script: the functions that read the data printed
 * above, and the line that hands `muster` to them.  Written for bash and run
 * as it is by zsh's bashcompinit (which emulates sh while it runs it, and
 * keeps --option=VALUE one word, which bash splits at the '='). */
static const char completion_body[] =
    "# _muster_kind COMMAND OPTION: prints the mark of OPTION (see _muster_options);\n"
    "# fails for a flag and for an option COMMAND does not take.\n"
    "_muster_kind() {\n"
    "  local opt\n"
    "  for opt in $(_muster_options \"$1\"); do\n"
    "    case $opt in \"$2=\"*) echo \"${opt#*=}\"; return 0 ;; esac\n"
    "  done\n"
    "  return 1\n"
    "}\n"
    "\n"
    "# _muster_names COMMAND: its options without their marks.\n"
    "_muster_names() {\n"
    "  local opt\n"
    "  for opt in $(_muster_options \"$1\"); do echo \"${opt%%=*}\"; done\n"
    "}\n"
    "\n"
    "# _muster_reply WORDS WORD: COMPREPLY gets the words of WORDS that start with WORD.\n"
    "_muster_reply() {\n"
    "  COMPREPLY=($(compgen -W \"$1\" -- \"$2\"))\n"
    "}\n"
    "\n"
    "# _muster_files -f|-d WORD: COMPREPLY gets the files (directories) starting with WORD.\n"
    "_muster_files() {\n"
    "  type compopt >/dev/null 2>&1 && compopt -o filenames 2>/dev/null\n"
    "  local IFS=$'\\n'\n"
    "  COMPREPLY=($(compgen \"$1\" -- \"$2\"))\n"
    "}\n"
    "\n"
    "# _muster_value COMMAND OPTION WORD: completes WORD as a value of OPTION; fails\n"
    "# when OPTION is a flag or not one of COMMAND's.\n"
    "_muster_value() {\n"
    "  local kind\n"
    "  kind=$(_muster_kind \"$1\" \"$2\") || return 1\n"
    "  case $kind in\n"
    "  w) _muster_reply \"$(_muster_words \"$1\" \"$2\")\" \"$3\" ;;\n"
    "  f) _muster_files -f \"$3\" ;;\n"
    "  d) _muster_files -d \"$3\" ;;\n"
    "  *) COMPREPLY=() ;;\n"
    "  esac\n"
    "}\n"
    "\n"
    "# _muster_argument COMMAND WORD COUNT FIRST DASHDASH: completes WORD as an\n"
    "# argument of COMMAND, after COUNT others (FIRST the first of them) and the\n"
    "# `--` at index DASHDASH of COMP_WORDS (-1: none).\n"
    "_muster_argument() {\n"
    "  case $(_muster_arguments \"$1\") in\n"
    "  f) _muster_files -f \"$2\" ;;\n"
    "  h) if (($3 == 0)); then\n"
    "       _muster_reply \"$_muster_commands\" \"$2\"\n"
    "     elif (($3 == 1)); then\n"
    "       _muster_reply \"$(_muster_subcommands \"$4\")\" \"$2\"\n"
    "     fi ;;\n"
    "  s) (($3 == 0)) && _muster_reply \"$_muster_shells\" \"$2\" ;;\n"
    "  c) if (($5 >= 0 && COMP_CWORD == $5 + 1)); then\n"
    "       COMPREPLY=($(compgen -c -- \"$2\"))\n"
    "     elif (($5 >= 0)); then\n"
    "       _muster_files -f \"$2\"\n"
    "     fi ;;\n"
    "  esac\n"
    "  return 0\n"
    "}\n"
    "\n"
    "# Completes COMP_WORDS[COMP_CWORD] of a `muster` command line: finds the\n"
    "# command (after any client options), then completes the command word, an\n"
    "# option, an option's value (also as --option=VALUE) or an argument.\n"
    "_muster() {\n"
    "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
    "  local cmd=\"\" group=\"\" first=\"\" word i nargs=0 dashdash=-1\n"
    "  COMPREPLY=()\n"
    "  for ((i = 1; i < COMP_CWORD; i++)); do\n"
    "    word=${COMP_WORDS[i]}\n"
    "    if ((dashdash >= 0)); then\n"
    "      continue\n"
    "    elif [[ $word == -- && -n $cmd ]]; then\n"
    "      dashdash=$i\n"
    "    elif [[ $word == -* ]]; then\n"
    "      if [[ ${COMP_WORDS[i+1]} == = ]]; then\n"
    "        ((i += 2))\n"
    "      elif _muster_kind \"$cmd\" \"$word\" >/dev/null; then\n"
    "        ((i += 1))\n"
    "      fi\n"
    "    elif [[ -n $group ]]; then\n"
    "      cmd=\"$group $word\" group=\"\"\n"
    "    elif [[ -z $cmd ]] && _muster_subcommands \"$word\" >/dev/null; then\n"
    "      group=$word\n"
    "    elif [[ -z $cmd ]]; then\n"
    "      cmd=$word\n"
    "    else\n"
    "      [[ -z $first ]] && first=$word\n"
    "      nargs=$((nargs + 1))\n"
    "    fi\n"
    "  done\n"
    "  if [[ $cur == = ]]; then\n"
    "    cur=\"\"\n"
    "  elif [[ $prev == = ]]; then\n"
    "    prev=${COMP_WORDS[COMP_CWORD-2]}\n"
    "  fi\n"
    "  case $prev in\n"
    "  \"<\" | \">\" | \">>\") _muster_files -f \"$cur\"; return 0 ;;\n"
    "  esac\n"
    "  if ((dashdash < 0)) && [[ $prev == -* ]] && _muster_value \"$cmd\" \"$prev\" \"$cur\"; "
    "then\n"
    "    return 0\n"
    "  fi\n"
    "  if ((dashdash < 0)) && [[ $cur == --*=* ]] && _muster_value \"$cmd\" \"${cur%%=*}\" "
    "\"${cur#*=}\"; then\n"
    "    COMPREPLY=(\"${COMPREPLY[@]/#/${cur%%=*}=}\") # zsh keeps --option=VALUE one word\n"
    "  elif [[ -n $group ]]; then\n"
    "    _muster_reply \"$(_muster_subcommands \"$group\")\" \"$cur\"\n"
    "  elif ((dashdash < 0)) && [[ $cur == -* ]]; then\n"
    "    _muster_reply \"$(_muster_names \"$cmd\")\" \"$cur\"\n"
    "  elif [[ -z $cmd ]]; then\n"
    "    _muster_reply \"$_muster_commands\" \"$cur\"\n"
    "  else\n"
    "    _muster_argument \"$cmd\" \"$cur\" \"$nargs\" \"$first\" \"$dashdash\"\n"
    "  fi\n"
    "  return 0\n"
    "}\n"
    "\n"
    "complete -F _muster muster\n";

/* What zsh runs before the bash script: its completion system, and the
 * bashcompinit that gives it bash's `complete` and `compgen`. */
static const char completion_zsh_preamble[] =
    "# zsh completion for muster: the bash script below, run by zsh's bashcompinit.\n"
    "(( ${+functions[compdef]} )) || { autoload -U +X compinit && compinit; }\n"
    "autoload -U +X bashcompinit && bashcompinit\n\n";

const char cli_completion_details[] =
    "Prints a script that completes muster's commands, their options and the\n"
    "values that need no head (--order, --state, --sync, file names).  It is\n"
    "made from the binary's own tables, so it matches the binary that printed it.\n"
    "SHELL: bash or zsh (zsh runs bash's script through its bashcompinit).\n\n"
    "bash, for yourself: add to ~/.bashrc\n"
    "  source <(muster completion bash)\n"
    "bash, for every user (`cmake --install` puts it there, under its prefix):\n"
    "  muster completion bash > /usr/share/bash-completion/completions/muster\n"
    "zsh: add to ~/.zshrc\n"
    "  source <(muster completion zsh)\n";

/* Prints the whole script for bash. */
static void completion_print_bash(FILE *out) {
  size_t n;
  const cli_cmd_t *cmds = cli_commands(&n);
  fprintf(out,
          "# bash completion for muster %s, printed by `muster completion bash` from the\n"
          "# binary's own tables of commands and options.  See `muster completion --help`.\n\n",
          MUSTER_VERSION);
  completion_print_commands(out, cmds, n);
  completion_print_groups(out, cmds, n);
  completion_print_options(out, cmds, n);
  completion_print_arguments(out, cmds, n);
  fputs(completion_body, out);
}

int cmd_completion(cli_args_t *args) {
  const char *shell = args->pos[0];
  int known = 0;
  for (int i = 0; completion_shells[i]; i++)
    known |= strcmp(shell, completion_shells[i]) == 0;
  if (!known) {
    char names[64] = ""; /* "bash or zsh" */
    for (int i = 0; completion_shells[i]; i++) {
      size_t at = strlen(names);
      snprintf(names + at, sizeof names - at, "%s%s",
               i == 0                     ? ""
               : completion_shells[i + 1] ? ", "
                                          : " or ",
               completion_shells[i]);
    }
    return cli_usage_error(args->cmd, "unknown shell '%s': expected %s", shell, names);
  }
  if (strcmp(shell, "zsh") == 0)
    fputs(completion_zsh_preamble, stdout);
  completion_print_bash(stdout);
  return CLI_OK;
}
