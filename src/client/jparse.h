/*
 * jparse.h — JSON text that a person wrote (a payload, an --init-data, a line
 * of stdin), parsed the one way libmuster and the `muster` command line parse
 * it: any value at the top level, NUL bytes allowed in strings, and on failure
 * jansson's reason with the place where it stopped.  One function for both,
 * so a bad value is told in the same words whichever of them reads it.
 */
#ifndef MUSTER_CLIENT_JPARSE_H
#define MUSTER_CLIENT_JPARSE_H

#include <jansson.h>
#include <stddef.h>

/* The longest text jparse puts in `why` (jansson's reason, its place). */
#define JPARSE_WHY 256

/*
 * Parses `len` bytes of `text` as one JSON value of any type.  Returns it (a
 * new reference the caller owns), or NULL with `why` (of `why_size` bytes,
 * truncated to fit) set to the reason and where it was found: "string or '}'
 * expected near 'bad' (at column 4)", or "(at line 2, column 4)" for a text
 * of several lines.
 */
json_t *jparse(const char *text, size_t len, char *why, size_t why_size);

#endif
