/*
 * json_text.c — JSON that the user typed or piped in (payloads, results,
 * --json DATA, --init-data), parsed the one way the CLI parses it: any value
 * at the top level, NUL bytes allowed in strings, and on failure jansson's
 * reason with the line and column where it stopped, so that every command
 * says what is wrong with its input in the same words.
 */
#include "cli/cli.h"

#include <jansson.h>
#include <stdio.h>

json_t *cli_json_parse(const char *text, size_t len, char *why, size_t why_size) {
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
