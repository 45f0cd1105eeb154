/*
 * accept_log.h — what a server says when it cannot accept connections, and
 * when it can again: the head's API port (http.c) and a node agent's
 * (node/port.c) say it in the same words, through these two functions.
 *
 * Out of descriptors (mostly), h1 stops accepting for 100 ms at a time and
 * tells its accept_failed each time; said each time, that would be ten lines
 * a second.  A failure is said once a minute at most, with how many pauses
 * went by unsaid, and the first connection accepted after a failure said is
 * said once, so that the log shows how long the trouble lasted.  Pure code:
 * the caller writes the line to its own log.
 */
#ifndef MUSTER_SERVER_ACCEPT_LOG_H
#define MUSTER_SERVER_ACCEPT_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A failure is said at most this often (milliseconds). */
#define ACCEPT_LOG_SAY_MS 60000

/* What one listening port said of its accepts; zeroed to start. */
typedef struct {
  int64_t said_ms; /* when a failure was last said (the caller's clock); 0: never */
  unsigned pauses; /* pauses since */
  bool said;       /* a failure was said, and no recovery since */
} accept_log_t;

/*
 * accept() failed with errno `err` at `now_ms` (h1 pauses accepting for
 * 100 ms).  True when this is to be said: `line` (of `size` bytes) then holds
 * "cannot accept connections: REASON; ...", the causes named when out of
 * descriptors.  False, `line` untouched, within ACCEPT_LOG_SAY_MS of the
 * last one said.
 */
bool accept_log_failed(accept_log_t *log, int err, int64_t now_ms, char *line, size_t size);

/*
 * A connection was accepted after a failure (h1's accept_resumed).  True
 * when a failure was said since the last recovery: `line` then holds
 * "accepting connections again (N pauses of 100 ms since the last failure
 * said)".
 */
bool accept_log_resumed(accept_log_t *log, char *line, size_t size);

#endif
