/*
 * jscan.h — the hot request bodies read from their text, without a tree.
 *
 * A put ({"tasks": [{"payload": P, ...}]}) and a completion ({"leases":
 * [{"task", "token", "result": R}]}) carry JSON values the head stores as
 * text.  The tree path parses the body with jansson and writes each value
 * back with jw_dump; jscan reads the body's text once and keeps each value's
 * slice as it stands, but only when that slice is, byte for byte, what
 * jw_dump of the parsed value would write (canonical: compact, the escapes jw
 * writes, integers as jw writes them, no reals, no duplicate keys).  Every
 * other body — whitespace, other fields, other escapes, anything invalid —
 * is declined, and the caller parses it as before: the fast path changes no
 * stored byte and no error message, because it never produces an error.
 *
 * A shape says which body to expect: the top-level array's key, the
 * elements' integer fields (with their ranges: a value out of range is the
 * tree path's error, so it declines) and the one field kept as text.
 */
#ifndef MUSTER_SERVER_JSCAN_H
#define MUSTER_SERVER_JSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jw.h"

#define JSCAN_MAX_INTS 3

/* One integer field of an element; absent or null gives `dflt`. */
typedef struct {
  const char *name; /* NULL ends a shape's list */
  int64_t min, max; /* a value outside declines */
  int64_t dflt;
  bool required; /* absent or null declines */
} jscan_int_t;

typedef struct {
  const char *array;                    /* the top-level key of the elements: "tasks" */
  size_t max_elems;                     /* more declines, as does an empty array */
  const char *text;                     /* the field kept as text: "payload" */
  bool text_required;                   /* absent declines */
  jscan_int_t ints[JSCAN_MAX_INTS + 1]; /* ends with a NULL name */
  const char *extra; /* a second top-level key whose value is kept as a slice, or NULL */
} jscan_shape_t;

typedef struct {
  int64_t ints[JSCAN_MAX_INTS]; /* the shape's integer fields in its order, defaults filled */
  const char *text; /* canonical JSON text, NUL-terminated, in the body's `texts`; NULL: absent */
  size_t text_len;
  size_t text_at; /* where `text` starts in `texts` (while scanning) */
} jscan_elem_t;

/* A scanned body.  Owns `elems` and `texts`; `extra` points into the text
 * that was scanned. */
typedef struct {
  jscan_elem_t *elems;
  size_t count, cap;
  jw_buf_t texts;    /* every element's text, each followed by a NUL */
  const char *extra; /* the canonical text of the shape's extra key; NULL when absent */
  size_t extra_len;
} jscan_body_t;

/* Scans `len` bytes of `text` (NULL: declined) as a body of `shape` whose
 * texts are at most `max_text` bytes each.  True with *out filled (free it
 * with jscan_body_free) when the body has the shape and every kept slice is
 * canonical; false when the caller must take the tree path (*out is then
 * empty; nothing to free, though freeing is harmless).  Allocates only the
 * element array and the texts' copy. */
bool jscan_body(const jscan_shape_t *shape, const char *text, size_t len, size_t max_text,
                jscan_body_t *out);
/* Frees what jscan_body kept and zeroes *b; accepts a zeroed body. */
void jscan_body_free(jscan_body_t *b);

/* True when `len` bytes of `text` are one JSON value exactly as jw_dump
 * writes the value jansson (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL) reads
 * from them, within jscan's limits on nesting and keys; false otherwise,
 * including for some canonical text beyond those limits. */
bool jscan_canonical(const char *text, size_t len);

#endif
