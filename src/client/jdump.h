/*
 * jdump.h — JSON text from jansson trees for libmuster, the `muster`
 * command line and the node agent: the one writer they use where
 * json_dumps was used.
 *
 * The text is json_dumps' byte for byte — its escapes, its integers, its
 * separators and indentation, keys in the order jansson iterates them —
 * except for reals: json_dumps writes "%.17g", so a payload's 0.1 came back
 * to its user as 0.10000000000000001.  jdump writes a real's shortest text
 * that reads back as the same double (src/core/jreal.h), as the head's
 * jw_dump does, so both sides agree on every value's text (the canonical
 * text of src/core/jcanon.h).  Keeping every caller on jdump keeps "%.17g"
 * out of anything a user or the head reads.
 */
#ifndef MUSTER_CLIENT_JDUMP_H
#define MUSTER_CLIENT_JDUMP_H

#include <jansson.h>
#include <stddef.h>

#include "client/jtext.h"

/* Flags: JSON_COMPACT, or JSON_INDENT(n), as for json_dumps; 0 for the
 * spaced one-line form (", " and ": ").  Any value is written, as with
 * JSON_ENCODE_ANY; other jansson flags (sorted keys, ASCII only, escaped
 * slashes) are not supported and must not be passed. */
#define JDUMP_FLAGS_KNOWN (JSON_COMPACT | JSON_MAX_INDENT | JSON_ENCODE_ANY)

/* The text of `v` (malloc'ed, the caller frees it), NULL when `v` is NULL,
 * memory runs out, or the tree holds what json_dumps refuses too and a
 * jansson tree only holds when built with its unchecked calls (a string not
 * in UTF-8) or a real jansson never holds (NaN, an infinity). */
char *jdump(const json_t *v, size_t flags);

/* Appends the text of `v` to `b`.  False, with `b` partly written, when
 * `v` holds what jdump refuses; memory running out sets b->failed. */
bool jdump_add(jtext_buf_t *b, const json_t *v, size_t flags);

#endif
