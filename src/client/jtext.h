/*
 * jtext.h — libmuster's JSON text without trees: request bodies written as
 * text, and the values of request fields and replies checked in one pass.
 *
 * The old path parsed a caller's payload into a jansson tree to refuse bad
 * JSON locally, built a tree for the body and dumped it; replies were parsed
 * into trees and each payload dumped back.  Here a value is spliced as it
 * stands when a scan shows that, without its whitespace, it is exactly the
 * text jdump (client/jdump.h: json_dumps' text, reals shortest) would write
 * for what json_loads reads from it ("canonical": the head's rules,
 * src/core/jcanon.h, shared with it): reals in their shortest round-trip
 * text, integers within int64 without "-0", strings in valid UTF-8 with the
 * escapes jansson writes (\" \\ \b \f \n \r \t and \u00XX in upper-case hex),
 * no duplicate keys and no NUL in a key, at most JTEXT_MAX_DEPTH levels.
 * For such text the bytes written are the tree path's bytes.  Anything else
 * is the caller's to hand to jansson and jdump, so accepted inputs and error
 * messages do not change: the scan never produces an error of its own.
 */
#ifndef MUSTER_CLIENT_JTEXT_H
#define MUSTER_CLIENT_JTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/jcanon.h"

/* The scanner's limits, the head's (src/core/jcanon.h). */
#define JTEXT_MAX_DEPTH JCANON_MAX_DEPTH /* containers inside a scanned value; deeper declines */
#define JTEXT_MAX_KEYS JCANON_MAX_KEYS   /* keys of the objects open at once; more: not canonical */

/* JSON text under construction, kept NUL-terminated.  Zero-initialise;
 * jtext_buf_free releases it.  After a failed allocation every later write is
 * dropped and `failed` stays set, so a writer checks once at the end. */
typedef struct {
  char *data;      /* malloc'ed; NULL until something is written */
  size_t len, cap; /* bytes written (without the NUL), bytes allocated */
  bool failed;     /* memory ran out */
} jtext_buf_t;

/* Empties `b` for reuse, keeping its memory. */
void jtext_reset(jtext_buf_t *b);
/* Frees the text and zeroes *b; accepts a zeroed buffer. */
void jtext_buf_free(jtext_buf_t *b);
/* Appends `n` bytes verbatim. */
void jtext_add(jtext_buf_t *b, const char *text, size_t n);
#define JTEXT_ADD_LITERAL(b, lit) jtext_add((b), "" lit, sizeof(lit) - 1)
/* Appends `v` as json_dumps writes an integer. */
void jtext_add_int(jtext_buf_t *b, int64_t v);
/* Appends NUL-terminated `s` as a JSON string escaped as json_dumps escapes
 * it.  False, with nothing appended, when `s` is not valid UTF-8 (json_string
 * refuses it). */
bool jtext_add_string(jtext_buf_t *b, const char *s);
/* The same for the `n` bytes at `s`, which may hold a NUL (written as
 * \u0000, as jansson writes it in a string made with json_stringn). */
bool jtext_add_stringn(jtext_buf_t *b, const char *s, size_t n);
/* Appends real `v` in its shortest round-trip text (core/jreal.h).  False,
 * with nothing appended, when `v` is NaN or infinite (not JSON). */
bool jtext_add_real(jtext_buf_t *b, double v);
/* Appends the JSON value in `len` bytes of `text` (whitespace around and
 * between its tokens allowed) compactly, when it is canonical.  False, with
 * nothing appended, otherwise: the caller parses it with jansson. */
bool jtext_add_json(jtext_buf_t *b, const char *text, size_t len);

/* What jtext_scan found in one value. */
typedef struct {
  bool canonical; /* without its whitespace, the value is json_dumps' text for it */
  bool spaced;    /* whitespace stands between some of its tokens */
} jtext_info_t;

/* Scans the JSON value that starts at `p` (no leading whitespace) and ends
 * before `end`.  Returns the end of the value, or NULL when there is none to
 * follow (a syntax error, or deeper than JTEXT_MAX_DEPTH).  A value returned
 * with info->canonical false is valid JSON text by its form, but jansson may
 * still refuse it (an integer beyond 64 bits, a real beyond a double). */
const char *jtext_scan(const char *p, const char *end, jtext_info_t *info);

/* True when nothing but JSON whitespace lies in [p, end) (the head ends its
 * replies with a newline). */
bool jtext_only_space(const char *p, const char *end);

/* Reads the canonical integer at *pp (before `end`) into *out and moves *pp
 * past it; false when there is none there (a real, "-0", beyond int64). */
bool jtext_int(const char **pp, const char *end, int64_t *out);

#endif
