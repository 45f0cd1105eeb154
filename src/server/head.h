/*
 * head.h — entry point of `muster head`, the head daemon.
 */
#ifndef MUSTER_SERVER_HEAD_H
#define MUSTER_SERVER_HEAD_H

#include "server.h"

/* Parses the `muster head` options in argv (argv[0] is "head"), runs the head
 * until SIGINT or SIGTERM, and returns the process exit status. */
int head_main(int argc, char **argv);

/* Prints `muster head --help` to stdout. */
void head_usage(void);

/* Fills *cfg from argv (head_options.c); *token_arg gets --token's value
 * when given.  Returns -1 to go on, else the exit status (0 after --help, 2
 * with one line on stderr for a refused option). */
int head_parse(int argc, char **argv, head_config_t *cfg, const char **token_arg);

#endif
