/*
 * streak.c — the reasons of a failure streak said already (streak.h).
 */
#include "core/streak.h"

#include <ctype.h>
#include <stddef.h>
#include <xxhash.h>

/* The hash of `reason` with every run of digits taken as one '#': numbers
 * that change from try to try (a time, a count) make no new reason. */
static uint64_t streak_hash(const char *reason) {
  char text[512];
  size_t n = 0;
  for (const char *p = reason; *p && n < sizeof text; p++) {
    if (isdigit((unsigned char)*p) && n > 0 && text[n - 1] == '#')
      continue;
    text[n++] = isdigit((unsigned char)*p) ? '#' : *p;
  }
  return XXH3_64bits(text, n);
}

streak_say_t streak_note(streak_t *s, const char *reason) {
  uint64_t hash = streak_hash(reason);
  for (int i = 0; i < s->count; i++)
    if (s->said[i] == hash)
      return STREAK_SEEN;
  if (s->count == STREAK_REASONS)
    return STREAK_SEEN;
  s->said[s->count++] = hash;
  return s->count == STREAK_REASONS ? STREAK_LAST : STREAK_NEW;
}

void streak_end(streak_t *s) {
  s->count = 0;
}
