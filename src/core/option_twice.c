/*
 * option_twice.c — the words said of an option given twice
 * (option_twice.h).  Pure: the callers print them after their own prefix
 * ("muster: ", "muster head: ").
 */
#include "option_twice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* snprintf of the words into out[size]: their length without the NUL. */
static int option_twice_format(char *out, size_t size, const char *name, const char *before,
                               const char *value, bool secret) {
  if (secret)
    return snprintf(out, size,
                    "option '--%s' was given twice, with two different values: using the last "
                    "(it takes one value)",
                    name);
  return snprintf(out, size,
                  "option '--%s' was given twice, '%s' and then '%s': using '%s' (it takes one "
                  "value)",
                  name, before, value, value);
}

char *option_twice_text(const char *name, const char *before, const char *value, bool secret) {
  if (before == NULL || value == NULL || strcmp(before, value) == 0)
    return NULL;
  int len = option_twice_format(NULL, 0, name, before, value, secret);
  char *text = len >= 0 ? malloc((size_t)len + 1) : NULL;
  if (text != NULL)
    option_twice_format(text, (size_t)len + 1, name, before, value, secret);
  return text;
}
