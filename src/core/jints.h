/*
 * jints.h — JSON integers and arrays of them read straight from text.
 *
 * A coordinated iteration's `next` reply lists each block's sample indices,
 * up to 2^20 of them; reading them through a jansson tree (a json_t and a
 * strtoll per index) was most of libmuster's time on that call.  These
 * readers take the digits as they stand and store them in the caller's
 * array.  They are strict: whatever RFC 8259 allows around and between the
 * tokens (whitespace) is accepted, and everything else is an error that says
 * what was wrong (jints_strerror) and where (the element); no value is ever
 * guessed, truncated or skipped.  "-0" is the integer 0, as jansson reads
 * it; 1.0 and 1e3 are reals, not integers.
 *
 * The readers allocate nothing and keep no state; they never read at or
 * past `end`, so the text needs no terminating NUL.
 */
#ifndef MUSTER_CORE_JINTS_H
#define MUSTER_CORE_JINTS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
  JINTS_OK = 0,
  JINTS_SYNTAX,    /* not valid JSON there: a broken or cut-off number or array */
  JINTS_NOT_INT,   /* a JSON value that is not an integer: 1.5, 1e3, "7", null, [] */
  JINTS_NEGATIVE,  /* an integer below zero, where only unsigned ones are allowed */
  JINTS_TOO_LARGE, /* above the caller's maximum (at most 2^64 - 1), or beyond int64 */
  JINTS_NOT_ARRAY, /* a JSON value other than an array where one was due */
  JINTS_COUNT,     /* an array with more or fewer elements than expected */
} jints_err_t;

/* A short English explanation of `err` ("a negative number"); never NULL. */
const char *jints_strerror(jints_err_t err);

/* Reads the JSON integer at *pp (no whitespace before it is skipped), at
 * most `max`, into *out and moves *pp past it.  On an error nothing is
 * stored and *pp is unmoved. */
jints_err_t jints_u64(const char **pp, const char *end, uint64_t max, uint64_t *out);

/* The same for a signed integer within int64 (-2^63 .. 2^63 - 1). */
jints_err_t jints_i64(const char **pp, const char *end, int64_t *out);

/* Reads the JSON array at *pp (a '[', no whitespace before it is skipped)
 * of exactly `count` unsigned integers, each at most `max`, into out[0 ..
 * count - 1], and moves *pp past its ']'.  Whitespace is allowed wherever
 * JSON allows it inside the array.  On an error out[] may be partly
 * written, *pp is where the reading stopped (the element at fault, for a
 * message), and *at (may be NULL) the element's number: for JINTS_COUNT the
 * number of elements there were, or `count` + 1 when there were more (the
 * reader stops at the first one too many). */
jints_err_t jints_array_u64(const char **pp, const char *end, uint64_t max, uint64_t *out,
                            size_t count, size_t *at);

#endif
