/*
 * jw.h — compact JSON text from jansson values (the head's replies and stored
 * payloads): the text json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) gives,
 * written several times faster, except that reals are written shortest
 * (0.1 where jansson writes 0.10000000000000001; src/core/jreal.h).
 *
 * Besides whole values, jw writes text piece by piece into a jw_buf_t, and a
 * reply tree may carry text that is JSON already (a "raw node", jw_raw): the
 * lease path writes each lease object as text around the stored payload, so
 * that a payload is never parsed into a tree only to be written out again.
 *
 * A raw node is the array [MARK, "text"] where MARK is one static json_t of
 * this module, an immortal null like jansson's own singletons (refcount
 * (size_t)-1, never counted nor freed).  jw_dump writes the text of such an
 * array verbatim.  Recognition is by the pointer: a parsed request yields
 * jansson's null, never MARK, so no input can forge a raw node, and no
 * allocation or initialisation is needed (thread-safe, nothing to free).
 * jansson itself knows nothing of raw nodes: a tree holding one must be
 * written by jw_dump only (json_dumps would write the array itself), and code
 * that reads replies must not expect a tree where a raw node stands.
 */
#ifndef MUSTER_SERVER_JW_H
#define MUSTER_SERVER_JW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Encodes any JSON value; caller frees.  *len (may be NULL) gets the length
 * without the terminating NUL.  NULL when `v` is NULL or memory runs out. */
char *jw_dump(const json_t *v, size_t *len);

/* JSON text under construction.  Zero-initialise; jw_buf_free releases it.
 * After a failed allocation every later write is dropped and `failed` stays
 * set, so a writer checks once at the end. */
typedef struct {
  char *buf;       /* malloc'ed; NULL until something is written; no NUL */
  size_t len, cap; /* bytes written, bytes allocated */
  bool failed;     /* memory ran out */
} jw_buf_t;

/* jw_reserve's way when the buffer must grow (or has failed). */
bool jw_grow(jw_buf_t *b, size_t more);
/* Makes room for `more` bytes (and the NUL); false when memory ran out.
 * Inline, as jw_add_text: a lease or put reply is dozens of short pieces per
 * task, and the call (and memcpy's, for a literal of known length) showed in
 * profiles of batched cycles. */
static inline bool jw_reserve(jw_buf_t *b, size_t more) {
  if (!b->failed && b->len + more < b->cap)
    return true;
  return jw_grow(b, more);
}
/* Appends `len` bytes verbatim: JSON text, or punctuation and keys. */
static inline void jw_add_text(jw_buf_t *b, const char *text, size_t len) {
  if (jw_reserve(b, len)) {
    memcpy(b->buf + b->len, text, len);
    b->len += len;
  }
}
/* Appends a string literal verbatim. */
#define JW_ADD_LITERAL(b, lit) jw_add_text((b), "" lit, sizeof(lit) - 1)
/* Appends `len` bytes of UTF-8 as a JSON string, escaped as jw_dump escapes. */
void jw_add_string(jw_buf_t *b, const char *s, size_t len);
void jw_add_int(jw_buf_t *b, int64_t v);
/* Appends value `v` (raw nodes included) as jw_dump writes it. */
void jw_add_value(jw_buf_t *b, const json_t *v);
/* Frees the text and zeroes *b; accepts a zeroed buffer. */
void jw_buf_free(jw_buf_t *b);

/* A raw node holding a copy of `len` bytes of JSON text (new reference), or
 * NULL when memory runs out.  The text is trusted: the caller guarantees one
 * valid JSON value, compact if the reply must be compact. */
json_t *jw_raw(const char *text, size_t len);
/* {`key`: RAW} (new reference), RAW a raw node of the text in `b`; NULL when
 * memory ran out, now or while `b` was written (b->failed). */
json_t *jw_object_raw(const char *key, const jw_buf_t *b);
/* True when `v` was made by jw_raw. */
bool jw_is_raw(const json_t *v);
/* The text of raw node `v` (valid while it lives) and its length; NULL when
 * `v` is not a raw node. */
const char *jw_raw_text(const json_t *v, size_t *len);

/* True when `len` bytes of `text` are one JSON value (RFC 8259, surrounding
 * whitespace allowed) in valid UTF-8, with escapes jansson reads (surrogate
 * escapes paired) and at most 2048 levels of nesting: text that is safe to
 * splice into a reply.  Numbers are checked for form only; jansson refuses
 * integers beyond 64 bits and reals beyond a double, this does not. */
bool jw_valid(const char *text, size_t len);

#endif
