/*
 * knob.c — an integer setting's text read whole (knob.h).
 */
#include "knob.h"

#include <errno.h>
#include <stdlib.h>

bool knob_int(const char *text, long long lo, long long hi, long long *out) {
  if (text == NULL || text[0] < '0' || text[0] > '9') /* strtoll would take space and signs */
    return false;
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (*end != '\0' || errno != 0 || v < lo || v > hi)
    return false;
  *out = v;
  return true;
}
