/*
 * names.h — rules for names that travel in URLs and keys (queues, scopes).
 */
#ifndef MUSTER_CORE_NAMES_H
#define MUSTER_CORE_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#define NAME_MAX_LEN 128

/* True when `name` is 1..NAME_MAX_LEN characters of [A-Za-z0-9._-] and
 * neither "." nor "..". */
bool name_is_valid(const char *name);

/* True when `name` is "." or "..".  Such a segment of a path is collapsed
 * by curl, browsers and most proxies (/v1/queues/.. becomes /v1/), so a
 * thing of that name could be made by a client that sends its path as it is
 * and never be reached by the others. */
bool name_is_dots(const char *name);

/* True when `name` met the rule before "." and ".." were refused: a queue or
 * an iteration that an older head made may have such a name, and is still
 * found under it (docs/api.md, "Names"). */
bool name_was_valid(const char *name);

/* What a user is told of that rule (a printf tail after "'NAME': "). */
#define NAME_RULE_TEXT                                                                             \
  "use 1 to 128 characters of letters, digits, '.', '_' and '-', other than '.' and '..'"

/* What a user is told of "." and ".." (name_is_dots). */
#define NAME_DOTS_TEXT "'.' and '..' are no names: URLs collapse them"

/* The tail for a message about `name`, which name_is_valid refused:
 * NAME_DOTS_TEXT for "." and "..", else NAME_RULE_TEXT.  A static string. */
const char *name_rule_text(const char *name);

#endif
