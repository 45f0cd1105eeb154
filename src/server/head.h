/*
 * head.h — entry point of `muster head`, the head daemon.
 */
#ifndef MUSTER_SERVER_HEAD_H
#define MUSTER_SERVER_HEAD_H

#include "server.h"

/* The local node agent that `muster head` forked (src/cli/cmd_node.c). */
typedef struct {
  pid_t pid;   /* its process */
  int exit_fd; /* read end of a pipe whose write end the agent alone holds:
                * end of file once it has exited */
} head_agent_t;

/* Parses the `muster head` options in argv (argv[0] is "head"), runs the head
 * until SIGINT or SIGTERM, and returns the process exit status.  With a local
 * `agent` (else NULL) a stop signal goes to the agent first, and the head
 * serves its workers' last results before it stops too. */
int head_main(int argc, char **argv, const head_agent_t *agent);

/* Prints `muster head --help` to stdout. */
void head_usage(void);

/* Fills *cfg from argv (head_options.c); *token_arg gets --token's value
 * when given.  Returns -1 to go on, else the exit status (0 after --help, 2
 * with one line on stderr for a refused option). */
int head_parse(int argc, char **argv, head_config_t *cfg, const char **token_arg);

/* For `muster completion`: the name of the head's i-th long option ("help"
 * among them), with *valued set when it takes a value; NULL past the last. */
const char *head_option_at(size_t i, bool *valued);
/* The words the value of head option `name` may be, NULL-terminated ("full",
 * "normal" for "sync"), or NULL for an option whose value is not one of a
 * list.  Static storage. */
const char *const *head_option_words(const char *name);

/* Of the head's long option name[0, len): 1 when it takes a value, 0 when it
 * takes none, -1 when the head has no such option (a prefix is none). */
int head_option_arity(const char *name, size_t len);

/* " (did you mean '--listen'?)" into buf (and returned) when the unknown long
 * option `word` ("--lisen", maybe with "=VALUE") is likely one of the head's
 * or of `also` (NULL-terminated, or NULL: `muster head`'s local agent's
 * options); else "". */
const char *head_likely_option(const char *word, const char *const *also, char *buf, size_t size);

/* True when `token` cannot be a bearer token (8 to `max` visible ASCII
 * characters); `why` then says which rule it breaks, without the token. */
bool head_token_problem(const char *token, size_t max, char *why, size_t size);

#endif
