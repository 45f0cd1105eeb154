/*
 * accept_log.c — what a server says of failed accepts (accept_log.h).
 */
#include "accept_log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

bool accept_log_failed(accept_log_t *log, int err, int64_t now_ms, char *line, size_t size) {
  log->pauses++;
  if (log->said_ms != 0 && now_ms - log->said_ms < ACCEPT_LOG_SAY_MS)
    return false;
  char since[80] = "said once a minute at most";
  if (log->said_ms != 0)
    snprintf(since, sizeof since, "%u pauses since this was last said", log->pauses);
  bool fds = err == EMFILE || err == ENFILE;
  snprintf(line, size,
           "cannot accept connections: %s%s; the connections open are served, new ones wait; "
           "trying again every 100 ms (%s)",
           strerror(err),
           fds ? " (every descriptor is in use: clients hold connections open, or the limit, "
                 "ulimit -n, is low)"
               : "",
           since);
  log->said_ms = now_ms;
  log->pauses = 0;
  log->said = true;
  return true;
}

bool accept_log_resumed(accept_log_t *log, char *line, size_t size) {
  if (!log->said)
    return false;
  snprintf(line, size,
           "accepting connections again (%u pauses of 100 ms since the last failure said)",
           log->pauses);
  log->said = false;
  return true;
}
