/*
 * names.h — rules for names that travel in URLs and keys (queues, scopes).
 */
#ifndef MUSTER_CORE_NAMES_H
#define MUSTER_CORE_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#define NAME_MAX_LEN 128

/* True when `name` is 1..NAME_MAX_LEN characters of [A-Za-z0-9._-]. */
bool name_is_valid(const char *name);

/* What a user is told of that rule (a printf tail after "'NAME': "). */
#define NAME_RULE_TEXT "use 1 to 128 characters of letters, digits, '.', '_' and '-'"

#endif
