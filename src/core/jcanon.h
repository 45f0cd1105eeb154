/*
 * jcanon.h — canonical JSON text: the one scanner that tells whether a
 * value's text is, byte for byte, what the head's jw_dump and libmuster's
 * jdump write for the value jansson (JSON_REJECT_DUPLICATES |
 * JSON_ALLOW_NUL) reads from it: jansson's json_dumps(JSON_COMPACT |
 * JSON_ENCODE_ANY) text, but with reals written shortest (core/jreal.h).
 *
 * The head (src/server/jscan.c) keeps such text as it stands instead of
 * parsing a request body into a tree; libmuster (src/client/jtext.c) splices
 * a caller's value into a body and reads the head's replies with it.  Both
 * used to carry a copy of these rules; this is the only one now.
 *
 * Canonical means, value by value: strings in valid UTF-8 as jansson accepts
 * it whose only escapes are \" \\ \b \f \n \r \t and \u00XX (upper-case hex)
 * for the other control characters, and no NUL in a key; integers without a
 * plus sign, leading zeros or "-0", within int64 (jansson refuses larger
 * ones); reals only in jreal_format's text for the double they read as
 * ("0.1", "1e300"; not "0.10" or "1E300"); objects without duplicate keys.
 * Canonical text is one-to-one with its value, so two keys are duplicates
 * exactly when their bytes are equal.  Nesting is limited to
 * JCANON_MAX_DEPTH containers, far inside jansson's 2048, and the keys of the
 * objects open at once to JCANON_MAX_KEYS: beyond the depth the scan stops,
 * beyond the keys the value counts as not canonical, which costs the callers
 * only their slow path.
 *
 * Two options shape a scan.  Without JCANON_FOLLOW the scan stops at the
 * first token that is not canonical (the head declines the body at once);
 * with it, the scan follows any valid JSON text to its end and clears
 * `canonical` (the client delimits a reply's odd value and hands it to
 * jansson alone).  Without JCANON_SPACE whitespace between tokens is not
 * canonical; with it, it is allowed and sets `spaced` (a caller's
 * "{\"a\": 1}" is spliced compactly).  No I/O, no allocation, no globals.
 */
#ifndef MUSTER_CORE_JCANON_H
#define MUSTER_CORE_JCANON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define JCANON_MAX_DEPTH 64 /* containers inside a scanned value; deeper stops the scan */
#define JCANON_MAX_KEYS 256 /* keys of the objects open at once; more: not canonical */

enum {
  JCANON_FOLLOW = 1 << 0, /* follow valid JSON past what is not canonical */
  JCANON_SPACE = 1 << 1,  /* whitespace between tokens stays canonical */
};

/* A scan in progress.  Large (the keys): keep it on the stack of one call. */
typedef struct {
  const unsigned char *p, *end; /* the next byte; the end of the text */
  unsigned flags;               /* JCANON_FOLLOW, JCANON_SPACE */
  bool canonical;               /* nothing seen so far is other than canonical */
  bool spaced;                  /* whitespace stood between some tokens */
  struct {
    const unsigned char *at; /* the key with its quotes */
    size_t len;
  } keys[JCANON_MAX_KEYS];
  size_t nkeys; /* keys of the objects open now */
} jcanon_scan_t;

/* Starts a scan of [p, end) with `flags`: canonical, not spaced. */
void jcanon_init(jcanon_scan_t *s, const char *p, const char *end, unsigned flags);

/* Scans one value at s->p (no leading whitespace; none after it is read)
 * and moves s->p past it.  False when there is no value to follow there: a
 * syntax error, deeper than JCANON_MAX_DEPTH, or, without JCANON_FOLLOW,
 * anything not canonical.  With JCANON_FOLLOW a true return may leave
 * s->canonical false; the text is then valid JSON by its form, though
 * jansson may still refuse it (an integer beyond 64 bits, a huge real). */
bool jcanon_value(jcanon_scan_t *s);

/* Length of the UTF-8 sequence at `p` (before `end`) as jansson accepts it,
 * 1 for ASCII: 0 when it is not one (a stray continuation byte, an overlong
 * form, a surrogate, above U+10FFFF, cut short). */
size_t jcanon_utf8_length(const unsigned char *p, const unsigned char *end);

/* The JSON string at *pp (a quote), before `end`: true with *pp past its
 * closing quote when it is valid as jansson reads it (UTF-8, no raw control
 * characters, known escapes, surrogate escapes paired); *canonical is then
 * cleared when an escape is not the one json_dumps writes (`key`: a NUL is
 * never canonical in an object's key), and left alone otherwise.  False,
 * with *pp unmoved, on a syntax error. */
bool jcanon_string(const unsigned char **pp, const unsigned char *end, bool key, bool *canonical);

/* The canonical integer at *pp (before `end`) into *out, with *pp moved past
 * it; false, nothing moved, when there is none there (a real, "-0", a
 * leading zero, beyond int64). */
bool jcanon_int(const unsigned char **pp, const unsigned char *end, int64_t *out);

/* Any JSON number at *pp by its form (RFC 8259), *pp moved past what was
 * read; false when the form is broken.  Nothing about its range. */
bool jcanon_number(const unsigned char **pp, const unsigned char *end);

/* JSON whitespace. */
static inline bool jcanon_is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Consumes byte `c` when it is next. */
static inline bool jcanon_byte(jcanon_scan_t *s, unsigned char c) {
  if (s->p == s->end || *s->p != c)
    return false;
  s->p++;
  return true;
}

/* Consumes the `n` bytes of `word` when they are next. */
static inline bool jcanon_word(jcanon_scan_t *s, const char *word, size_t n) {
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
    return false;
  s->p += n;
  return true;
}

#endif
