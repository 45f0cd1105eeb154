/*
 * jparse.c — JSON text a person wrote, parsed with jansson; on failure its
 * reason and place in one short line (see jparse.h).
 */
#include "client/jparse.h"

#include <stdio.h>

json_t *jparse(const char *text, size_t len, char *why, size_t why_size) {
  json_error_t jerr;
  json_t *value = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
  /* One-line texts (an argument, a line of stdin) are told by column alone:
   * "line 1" of "stdin line 7" would read as a contradiction. */
  if (value == NULL && jerr.line <= 1)
    snprintf(why, why_size, "%s (at column %d)", jerr.text, jerr.column);
  else if (value == NULL)
    snprintf(why, why_size, "%s (at line %d, column %d)", jerr.text, jerr.line, jerr.column);
  return value;
}
