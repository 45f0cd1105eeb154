/*
 * jints.c — JSON integers and arrays of them read straight from text
 * (jints.h).
 *
 * The workload: arrays of thousands of sample indices below 2^48, written
 * compactly by the head ("[812,13,...]").  The hot path takes an element
 * that starts with a non-zero digit and has at most 19 digits (so it cannot
 * overflow 64 bits) with one multiply-add per digit and no other test;
 * everything else — a zero, a sign, 20 digits or more, a fraction or an
 * exponent, a value that is no number — goes through jints_slow, which
 * classifies the token by its JSON form (jcanon_number, the project's one
 * number grammar) before it says what was wrong.  The form check comes
 * first, so that "-1.5" is a real and "01" broken JSON, not a negative or
 * a small number.
 */
#include "core/jints.h"

#include "core/jcanon.h"

#include <stdbool.h>

/* Digits of the largest magnitude that never overflows uint64_t: 10^19 - 1. */
#define JINTS_SAFE_DIGITS 19

const char *jints_strerror(jints_err_t err) {
  switch (err) {
  case JINTS_OK:
    return "no error";
  case JINTS_SYNTAX:
    return "not valid JSON (a broken or cut-off number or array)";
  case JINTS_NOT_INT:
    return "not an integer";
  case JINTS_NEGATIVE:
    return "a negative number";
  case JINTS_TOO_LARGE:
    return "a number too large";
  case JINTS_NOT_ARRAY:
    return "not an array";
  case JINTS_COUNT:
    return "the wrong number of elements";
  }
  return "unknown error";
}

static inline bool jints_is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}

/* True when the byte after a number's digits would continue it as a real. */
static inline bool jints_continues(const unsigned char *p, const unsigned char *end) {
  return p < end && (*p == '.' || *p == 'e' || *p == 'E' || jints_is_digit(*p));
}

/* Classifies what stands at p when it is not a number: another JSON value
 * (by its first byte), or broken text. */
static jints_err_t jints_not_number(const unsigned char *p, const unsigned char *end) {
  if (p == end)
    return JINTS_SYNTAX;
  switch (*p) {
  case '"':
  case '[':
  case '{':
  case 't':
  case 'f':
  case 'n':
    return JINTS_NOT_INT;
  default:
    return JINTS_SYNTAX;
  }
}

/* The token at p, which the fast path did not take: its magnitude into
 * *mag (UINT64_MAX and *overflow set when it is beyond) and *negative its
 * sign, with *after past it; or the error when it is no integer. */
static jints_err_t jints_slow(const unsigned char *p, const unsigned char *end, uint64_t *mag,
                              bool *overflow, bool *negative, const unsigned char **after) {
  const unsigned char *q = p;
  if (p == end || (*p != '-' && !jints_is_digit(*p)) || !jcanon_number(&q, end))
    return jints_not_number(p, end);
  if (q < end && jints_is_digit(*q))
    return JINTS_SYNTAX; /* "01": jcanon_number stops after the leading zero */
  *negative = *p == '-';
  const unsigned char *digits = p + *negative;
  uint64_t v = 0;
  *overflow = false;
  for (const unsigned char *d = digits; d < q; d++) {
    if (!jints_is_digit(*d))
      return JINTS_NOT_INT; /* a fraction or an exponent */
    unsigned digit = (unsigned)(*d - '0');
    if (v > (UINT64_MAX - digit) / 10)
      *overflow = true;
    v = *overflow ? UINT64_MAX : v * 10 + digit;
  }
  *mag = v;
  *after = q;
  return JINTS_OK;
}

jints_err_t jints_u64(const char **pp, const char *end, uint64_t max, uint64_t *out) {
  const unsigned char *p = (const unsigned char *)*pp, *e = (const unsigned char *)end;
  if (p < e && *p >= '1' && *p <= '9') {
    const unsigned char *start = p, *stop = e - p > JINTS_SAFE_DIGITS ? p + JINTS_SAFE_DIGITS : e;
    uint64_t v = 0;
    while (p < stop && jints_is_digit(*p))
      v = v * 10 + (unsigned)(*p++ - '0');
    if (!jints_continues(p, e)) {
      if (v > max)
        return JINTS_TOO_LARGE;
      *out = v;
      *pp = (const char *)p;
      return JINTS_OK;
    }
    p = start; /* 20 digits or more, or a real */
  }
  uint64_t mag;
  bool overflow, negative;
  const unsigned char *after;
  jints_err_t err = jints_slow(p, e, &mag, &overflow, &negative, &after);
  if (err)
    return err;
  if (negative && mag != 0)
    return JINTS_NEGATIVE;
  if (overflow || mag > max)
    return JINTS_TOO_LARGE;
  *out = mag;
  *pp = (const char *)after;
  return JINTS_OK;
}

jints_err_t jints_i64(const char **pp, const char *end, int64_t *out) {
  const unsigned char *after;
  uint64_t mag;
  bool overflow, negative;
  jints_err_t err = jints_slow((const unsigned char *)*pp, (const unsigned char *)end, &mag,
                               &overflow, &negative, &after);
  if (err)
    return err;
  if (overflow || mag > (negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
    return JINTS_TOO_LARGE;
  /* Through unsigned, so that -2^63 needs no special case. */
  *out = negative ? (int64_t)(0 - mag) : (int64_t)mag;
  *pp = (const char *)after;
  return JINTS_OK;
}

/* Skips JSON whitespace; one comparison when there is none (every
 * whitespace byte is at most ' ', and no token starts with one). */
static inline const char *jints_space(const char *p, const char *end) {
  while (p < end && (unsigned char)*p <= ' ' && jcanon_is_space((unsigned char)*p))
    p++;
  return p;
}

/* What stands where an array was expected: another JSON value, or broken text. */
static inline jints_err_t jints_not_array(const char *p, const char *end) {
  return p < end && (*p == '{' || *p == '"' || *p == '-' || jints_is_digit((unsigned char)*p) ||
                     *p == 't' || *p == 'f' || *p == 'n')
             ? JINTS_NOT_ARRAY
             : JINTS_SYNTAX;
}

/* The elements of an array that is not empty, from its first element through
 * its ']': at most `count` into out[], *pp past the ']' or where reading
 * stopped, *at how many were read (count + 1 when there are more). */
static inline jints_err_t jints_elements(const char **pp, const char *end, uint64_t max,
                                         uint64_t *out, size_t count, size_t *at) {
  const char *p = *pp;
  size_t n = 0;
  jints_err_t err;
  for (;;) {
    p = jints_space(p, end);
    if (n == count) { /* one too many: stop before writing past out[] */
      if (p < end && *p != ']') {
        err = JINTS_COUNT;
        n++;
      } else {
        err = JINTS_SYNTAX; /* "[1,]", "[1," */
      }
      break;
    }
    if ((err = jints_u64(&p, end, max, &out[n])) != JINTS_OK)
      break;
    n++;
    p = jints_space(p, end);
    if (p < end && *p == ',') {
      p++;
      continue;
    }
    if (p < end && *p == ']') {
      p++;
      break;
    }
    err = JINTS_SYNTAX; /* another byte, or the text ends */
    break;
  }
  *pp = p;
  *at = n;
  return err;
}

jints_err_t jints_array_u64(const char **pp, const char *end, uint64_t max, uint64_t *out,
                            size_t count, size_t *at) {
  const char *p = *pp;
  size_t n = 0, ignored;
  jints_err_t err = JINTS_OK;
  if (at == NULL)
    at = &ignored;
  if (p == end || *p != '[') {
    *at = 0; /* *pp stays */
    return jints_not_array(p, end);
  }
  p = jints_space(p + 1, end);
  if (p < end && *p == ']')
    p++;
  else
    err = jints_elements(&p, end, max, out, count, &n);
  if (err == JINTS_OK && n != count)
    err = JINTS_COUNT;
  *at = n;
  *pp = p;
  return err;
}
