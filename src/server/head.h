/*
 * head.h — entry point of `muster head`, the head daemon.
 */
#ifndef MUSTER_SERVER_HEAD_H
#define MUSTER_SERVER_HEAD_H

/* Parses the `muster head` options in argv (argv[0] is "head"), runs the head
 * until SIGINT or SIGTERM, and returns the process exit status. */
int head_main(int argc, char **argv);

/* Prints `muster head --help` to stdout. */
void head_usage(void);

#endif
