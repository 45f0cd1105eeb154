/*
 * streak.h — which reasons of a failure streak were said already.
 *
 * A process that retries a call (the node agent's heartbeat) logs a streak
 * of failures without a line per try: the first failure of each distinct
 * reason is said, its repeats are not, and after STREAK_REASONS distinct
 * reasons nothing more is, so that a head failing in ever new ways cannot
 * flood the log.  Pure code: the caller logs.
 */
#ifndef MUSTER_CORE_STREAK_H
#define MUSTER_CORE_STREAK_H

#include <stdint.h>

#define STREAK_REASONS 8 /* distinct reasons said per streak, at most */

typedef struct {
  uint64_t said[STREAK_REASONS]; /* hashes of the reasons said in this streak */
  int count;                     /* how many of said[] are in use */
} streak_t;

typedef enum {
  STREAK_SEEN = 0, /* said already in this streak (or past the limit): say nothing */
  STREAK_NEW,      /* a reason not said yet: say it */
  STREAK_LAST,     /* a new reason and the last one said: say it, and that later
                      new reasons will not be */
} streak_say_t;

/* Notes a failure whose reason is `reason` (e.g. "heartbeat unavailable the
 * head is shutting down"); says whether to log it.  Runs of digits do not
 * tell reasons apart, so "timed out after 2001 ms" and "after 2003 ms" are
 * one reason.  A zeroed streak_t is an empty streak. */
streak_say_t streak_note(streak_t *s, const char *reason);
/* Ends the streak (the call worked): every reason may be said again. */
void streak_end(streak_t *s);

#endif
