/*
 * misplaced.c — options given to the wrong one of `muster head`, `muster node`
 * and `muster worker`.
 *
 * The three run the same kind of thing at different levels (the head keeps
 * the state, a node agent joins it and supervises workers, a worker leases
 * tasks), and their options are easily taken for one another's:
 * `muster head --join URL` is someone who wants a node.  "unknown option"
 * would leave them to guess, so such an option is refused with the command
 * that takes it and what to run instead.  The same goes for the options of the
 * GPU worker pool muster replaces (docs/coming-from.md), whose users type
 * `--password` where muster takes a token, and `muster node --head` for its
 * `start_node --head`.  The table is only read when an option is not the
 * command's own, so it never shadows one.
 */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  const char *given_to; /* the command it was given to: "head", "node", "worker" */
  const char *option;   /* its name without the dashes */
  const char *why;      /* the rest of the sentence after "--OPTION " */
} cli_misplaced_t;

static const char head_state_text[] =
    "is an option of `muster head`, not of `muster node`: the head keeps the state and "
    "serves the API, and a node agent joins it (--join URL); give it to the head's command line";

static const char node_worker_text[] =
    "is an option of `muster worker`, not of `muster node`: the agent starts its workers "
    "itself and gives them their head, node and cache; for them it takes --queue, "
    "--concurrency, --nickname, --json-result, --permanent-exit, --plugin and --init-data";

static const char worker_node_text[] =
    "is an option of `muster node`, not of `muster worker`: `muster node --join URL --queue Q "
    "-- CMD` starts one worker per GPU (or --workers N) and supervises them, while one "
    "`muster worker` runs where it is started and finds its head with --url";

static const char password_text[] =
    "is not an option of muster: the head's token takes the place of a pool's password "
    "(`muster head --token SECRET`, 8 to 255 characters), and a node joins with "
    "`muster node --join http://HEAD:7370 --token SECRET`";

/* The pool's port and address, given short (-p, -a) or long (--port, --address). */
static const char node_pool_port_text[] =
    "(a pool's port) is not an option of muster: a node agent joins its head with --join "
    "http://HEAD:7370 (the head's port in the URL) and serves its own API on --listen "
    "ADDR:PORT (127.0.0.1:7371 by default)";

static const char node_pool_address_text[] =
    "(a pool's address) is not an option of muster: the head's address goes in the URL of "
    "--join http://ADDRESS:7370";

static const char head_pool_port_text[] =
    "(a pool's port) is not an option of muster: a head listens with --listen ADDR:PORT "
    "(0.0.0.0:7370 for other machines)";

static const char head_pool_address_text[] =
    "(a pool's address) is not an option of muster: a head listens with --listen ADDR:PORT";

static const cli_misplaced_t cli_misplaced[] = {
    {"head", "join",
     "is an option of `muster node`, not of `muster head`: a head is what nodes join; on "
     "another machine run `muster node --join URL [--queue Q -- CMD]` (`muster head` runs a "
     "local node agent beside itself already)"},
    {"head", "url",
     "names the head to the commands that talk to one, not to `muster head`: a head listens "
     "with --listen ADDR:PORT, and a node agent joins it with `muster node --join URL`"},
    {"head", "password", password_text},
    {"node", "password", password_text},
    {"node", "head",
     "is not an option of `muster node`: a head is a command of its own, `muster head "
     "--listen 0.0.0.0:7370 --token SECRET`, which runs a node agent for its machine too; "
     "other machines join it with `muster node --join http://HEAD:7370 --token SECRET`"},
    {"node", "server-only",
     "is an option of `muster head` (a head without its local node agent); `muster node` runs "
     "no head, only an agent that joins one: leave it out"},
    {"node", "sync", head_state_text},
    {"node", "sync-leases", head_state_text},
    {"node", "worker-timeout-ms", head_state_text},
    {"node", "node-timeout-ms", head_state_text},
    {"node", "max-wait-ms", head_state_text},
    {"node", "sweep-ms", head_state_text},
    {"node", "max-body", head_state_text},
    {"node", "max-payload", head_state_text},
    {"node", "max-blob-bytes", head_state_text},
    {"node", "max-shared-ttl-ms", head_state_text},
    {"node", "shared-keep-levels", head_state_text},
    {"node", "dashboard-token", head_state_text},
    {"node", "metrics-public", head_state_text},
    {"node", "distcompute", head_state_text},
    {"node", "log-level", head_state_text},
    {"node", "max-tasks", node_worker_text},
    {"node", "timeout-ms", node_worker_text},
    {"node", "node", node_worker_text},
    {"node", "cache-url", node_worker_text},
    {"worker", "join", worker_node_text},
    {"worker", "gpus", worker_node_text},
    {"worker", "min-gpu-memory", worker_node_text},
    {"worker", "workers", worker_node_text},
    {"worker", "name", worker_node_text},
    {"worker", "listen", worker_node_text},
    {"worker", "lock-file", worker_node_text},
    {"worker", "cache-dir", worker_node_text},
    {"worker", "cache-bytes", worker_node_text},
    {"worker", "state-dir", worker_node_text},
    /* The pool's options (`start_node -p PORT -a ADDRESS -r PASSWORD`), short and
     * long: muster's are long, so a one-dash row never matches a long option. */
    {"node", "-p", node_pool_port_text},
    {"node", "port", node_pool_port_text},
    {"node", "-a", node_pool_address_text},
    {"node", "address", node_pool_address_text},
    {"node", "-r",
     "(a pool's password) is not an option of muster: a node joins with the "
     "head's token, --join http://HEAD:7370 --token SECRET"},
    {"head", "-p", head_pool_port_text},
    {"head", "port", head_pool_port_text},
    {"head", "-a", head_pool_address_text},
    {"head", "address", head_pool_address_text},
    {"head", "-r",
     "(a pool's password) is not an option of muster: the head's token takes its "
     "place (--token SECRET, 8 to 255 characters)"},
    {NULL, NULL, NULL},
};

int cli_misplaced_option(const cli_cmd_t *cmd, const char *name, size_t len) {
  for (const cli_misplaced_t *m = cli_misplaced; m->given_to; m++)
    if (strcmp(m->given_to, cmd->name) == 0 && strlen(m->option) == len &&
        strncmp(m->option, name, len) == 0)
      return cli_usage_error(cmd, "--%s %s", m->option, m->why);
  return CLI_OK;
}

int cli_misplaced_short(const cli_cmd_t *cmd, const char *word) {
  for (const cli_misplaced_t *m = cli_misplaced; m->given_to; m++)
    if (m->option[0] == '-' && strcmp(m->given_to, cmd->name) == 0 && strcmp(m->option, word) == 0)
      return cli_usage_error(cmd, "%s %s", m->option, m->why);
  return CLI_OK;
}
