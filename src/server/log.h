/*
 * log.h — the head's log: one line per event with UTC time and level on stderr.
 */
#ifndef MUSTER_SERVER_LOG_H
#define MUSTER_SERVER_LOG_H

#include <stdint.h>

typedef enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR } log_level_t;

/* Lines below `level` are dropped.  Default LOG_INFO. */
void log_set_level(log_level_t level);
/* The names of the levels in log_level_t's order, NULL-terminated: what
 * --log-level takes (and what `muster completion` offers for it). */
extern const char *const log_level_words[];
/* Parses "debug", "info", "warn", "error"; returns -1 for anything else. */
int log_level_parse(const char *name);
void log_msg(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Milliseconds since the Unix epoch (wall clock, for timestamps and deadlines). */
int64_t now_ms(void);
/* "2025-01-31T23:59:59.123Z" for `ms` since the epoch (UTC), as log lines
 * begin, into out[32]. */
void log_format_time(int64_t ms, char out[32]);

#endif
