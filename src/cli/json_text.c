/*
 * json_text.c — JSON that the user typed or piped in (payloads, results,
 * --json DATA, --init-data), parsed the one way the CLI parses it: libmuster's
 * jparse (client/jparse.h), so that every command, and the library under the
 * options it parses itself (--init-data of map and session create), says what
 * is wrong with its input in the same words: jansson's reason with the line
 * and column where it stopped.
 */
#include "cli/cli.h"
#include "client/jparse.h"

_Static_assert(CLI_JSON_WHY >= JPARSE_WHY, "cli_json_parse's `why` must hold jparse's text");

json_t *cli_json_parse(const char *text, size_t len, char *why, size_t why_size) {
  return jparse(text, len, why, why_size);
}
