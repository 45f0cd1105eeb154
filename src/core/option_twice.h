/*
 * option_twice.h — what a command line says of an option given twice
 * (option_twice.c): the `muster` commands' parser (src/cli/args.c) and
 * `muster head`'s own (src/server/head_options.c) keep the last value, so
 * that a wrapper may put its defaults before the user's options, and say
 * so in the same words.
 */
#ifndef MUSTER_CORE_OPTION_TWICE_H
#define MUSTER_CORE_OPTION_TWICE_H

#include <stdbool.h>

/*
 * The words for option --`name`, given `before` and now `value`, which
 * replaces it: "option '--queue' was given twice, 'a' and then 'b': using
 * 'b' (it takes one value)".  A `secret` option's values (a token) are left
 * out, as a log must not hold them: "option '--token' was given twice, with
 * two different values: using the last (it takes one value)".  A new string
 * (the caller frees it), or NULL when there is nothing to say (`before` is
 * NULL: the first value; or the same value again) or no memory for it.
 */
char *option_twice_text(const char *name, const char *before, const char *value, bool secret);

#endif
