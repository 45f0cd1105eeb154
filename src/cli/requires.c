/*
 * requires.c — `--requires SCOPE/NAME@N`, the shared data every task
 * of `muster put`, `muster session put` and `muster map` requires
 * (docs/shared-data.md, "Tasks that require shared data").
 *
 * `muster session put` also takes NAME@N (or NAME) alone, for a blob of the
 * session it puts into, as the Python Pool's requires=[(name, level)] means
 * one of the pool's session.  `muster put` has no session, and `muster map`
 * makes its own only once it runs (nothing could be uploaded to it before),
 * so both refuse a value without SCOPE/, saying how to write it.
 *
 * The form cannot be read two ways: scopes and names are letters, digits,
 * '.', '_' and '-' only (core/names.h), so the first '/' ends the scope and
 * an '@' starts the level.  Every value is checked before anything is read
 * from stdin or sent, so a bad one stops the command with nothing put.
 *
 * A value without @N means the newest level the head holds when the
 * command runs: one HEAD request per such value (muster_shared_stat), made
 * before the first task is sent, so the tasks carry that number and a later
 * update does not change what they read.  A blob without a level then
 * stops the command with nothing put; a number cannot be made up for it.
 */
#include "cli/cli.h"
#include "core/names.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Reads the level after '@' of `text` (`at`) into entry->level.  CLI_OK, or
 * CLI_USAGE after saying which rule it breaks. */
static int requires_level(const cli_args_t *args, const char *text, const char *at,
                          muster_shared_level_t *entry) {
  char *end = NULL;
  errno = 0;
  long long level = strtoll(at, &end, 10);
  if (at[0] < '0' || at[0] > '9' || *end != '\0' || errno == ERANGE)
    return cli_usage_error(args->cmd,
                           "--requires '%s': level '%s': expected a whole number, 1 or more "
                           "(or no @N for the newest)",
                           text, at);
  if (level < 1)
    return cli_usage_error(args->cmd, "--requires '%s': level %lld: levels count from 1", text,
                           level);
  entry->level = (int64_t)level;
  return CLI_OK;
}

/* Says that `text` names no scope where one is required: how to write it,
 * and which command takes a name alone.  Returns CLI_USAGE. */
static int requires_no_scope(const cli_args_t *args, const char *text) {
  return cli_usage_error(args->cmd,
                         "--requires '%s': expected SCOPE/NAME@N (models/weights@2), or "
                         "SCOPE/NAME for the newest level; only `muster session put` takes "
                         "NAME@N or NAME without SCOPE/, for a blob of the session it puts into",
                         text);
}

/* Splits `text` into scope, name and level (0: none given) in `entry`'s
 * storage; a text without SCOPE/ takes `session` as its scope (NULL: it
 * needs one).  CLI_OK, or CLI_USAGE after saying which rule it breaks. */
static int requires_split(const cli_args_t *args, const char *text, const char *session,
                          char *store, size_t size, muster_shared_level_t *entry) {
  const char *slash = strchr(text, '/');
  if (slash == NULL && session == NULL)
    return requires_no_scope(args, text);
  if (slash == NULL && !name_is_valid(session))
    return cli_usage_error(args->cmd,
                           "--requires '%s': without SCOPE/ the scope is the session, and '%s' "
                           "is not a session id: %s",
                           text, session, name_rule_text(session));
  if (strlen(text) >= size) /* a scope or name longer than the rule allows */
    return cli_usage_error(
        args->cmd, "--requires '%.60s...': too long: scope and name each " NAME_RULE_TEXT, text);
  snprintf(store, size, "%s", text);
  char *scope = store, *name = store; /* a name alone: the whole value */
  if (slash != NULL) {
    name = store + (slash - text) + 1;
    name[-1] = '\0';
  }
  char *at = strchr(name, '@');
  if (at != NULL)
    *at++ = '\0';
  if (slash != NULL && !name_is_valid(scope))
    return cli_usage_error(args->cmd, "--requires '%s': scope '%s': %s", text, scope,
                           name_rule_text(scope));
  if (!name_is_valid(name))
    return cli_usage_error(args->cmd, "--requires '%s': name '%s': %s", text, name,
                           name_rule_text(name));
  entry->scope = slash != NULL ? scope : session;
  entry->name = name;
  entry->level = 0;
  return at == NULL ? CLI_OK : requires_level(args, text, at, entry);
}

/* CLI_USAGE after saying so when entry `i` names the blob of an earlier one:
 * a task requires one level of each blob. */
static int requires_check_twice(const cli_args_t *args, const cli_requires_t *req, size_t i,
                                const char *const *texts) {
  for (size_t j = 0; j < i; j++)
    if (strcmp(req->levels[j].scope, req->levels[i].scope) == 0 &&
        strcmp(req->levels[j].name, req->levels[i].name) == 0)
      return cli_usage_error(args->cmd,
                             "--requires '%s': %s/%s is required already ('%s'): a task "
                             "requires one level of each blob",
                             texts[i], req->levels[i].scope, req->levels[i].name, texts[j]);
  return CLI_OK;
}

int cli_requires_parse(const cli_args_t *args, const char *session, cli_requires_t *req) {
  memset(req, 0, sizeof *req);
  const char *texts[MUSTER_MAX_REQUIRES];
  int given = cli_opt_values(args, "requires", texts, MUSTER_MAX_REQUIRES);
  if (given > MUSTER_MAX_REQUIRES)
    return cli_usage_error(args->cmd,
                           "--requires: given %d times; a task requires at most %d levels of "
                           "shared data",
                           given, MUSTER_MAX_REQUIRES);
  for (int i = 0; i < given; i++) {
    int rc = requires_split(args, texts[i], session, req->store[i], sizeof req->store[i],
                            &req->levels[i]);
    if (rc == CLI_OK)
      rc = requires_check_twice(args, req, (size_t)i, texts);
    if (rc != CLI_OK)
      return rc;
    req->count++;
  }
  return CLI_OK;
}

/* Says why the newest level of `entry` could not be had (`err`, the
 * client's message) and that nothing was put.  The reason goes through
 * cli_error_message, as every other request's failure does, for its advice
 * on a token that was not given and on a head that is not there; a HEAD
 * that got no reply changed nothing, so it is spared the advice to check
 * what a request did before sending it again. */
static void requires_say_unresolved(const muster_client_t *client, muster_err_t err,
                                    const muster_shared_level_t *entry) {
  char message[1024];
  snprintf(message, sizeof message, "--requires %s/%s: %s", entry->scope, entry->name,
           muster_client_message(client));
  if (err == MUSTER_NETWORK && !cli_message_unsent(message))
    fprintf(stderr, "muster: %s: %s\n", muster_err_name(err), message);
  else
    cli_error_message(err, message);
  if (err == MUSTER_SHARED_NOT_FOUND)
    fprintf(stderr,
            "muster: nothing was put: without @N the newest level is required, and there "
            "is none; upload one first ('muster shared put %s %s FILE')\n",
            entry->scope, entry->name);
  else
    fprintf(stderr, "muster: nothing was put: the newest level of %s/%s could not be asked\n",
            entry->scope, entry->name);
}

int cli_requires_resolve(muster_client_t *client, cli_requires_t *req) {
  for (size_t i = 0; i < req->count; i++) {
    muster_shared_level_t *entry = &req->levels[i];
    if (entry->level > 0)
      continue;
    muster_shared_info_t info;
    muster_err_t err = muster_shared_stat(client, entry->scope, entry->name, 0, &info);
    if (err != MUSTER_OK) {
      requires_say_unresolved(client, err, entry);
      return CLI_FAIL;
    }
    entry->level = info.level;
  }
  return CLI_OK;
}
