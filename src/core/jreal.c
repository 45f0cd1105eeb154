/*
 * jreal.c — the shortest round-trip text of a JSON real (jreal.h).
 *
 * The workload: a real now and then in a payload or a result; integers and
 * strings never come here.  A real costs one snprintf and one strtod in the
 * common case: by DBL_DIG, any decimal of at most 15 significant digits
 * survives the trip to a normal double and back, so when "%.15g" reads back,
 * no shorter text does, and most reals people write (0.1, 2.5e-7) are found
 * there.  Only reals that need 16 or 17 digits try more.  Subnormals hold
 * fewer digits than DBL_DIG promises (5e-324 is "%.1g"), so for them the
 * search starts at one digit; they are rarer still.
 *
 * The C library reads and writes reals with the locale's decimal point; a
 * program that links libmuster may have set one that is ','.  As jansson
 * does, the point is swapped for '.' after printing and back before reading.
 */
#include "core/jreal.h"

#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The locale's decimal point (its first byte, as jansson takes it). */
static char jreal_point(void) {
  const char *point = localeconv()->decimal_point;
  return point != NULL && point[0] != '\0' ? point[0] : '.';
}

/* Replaces the first `from` in `text` by `to`. */
static void jreal_swap(char *text, char from, char to) {
  char *at = from == to ? NULL : strchr(text, from);
  if (at != NULL)
    *at = to;
}

/* True when "%.{digits}g" of `v` reads back as `v`; the text (in the
 * locale's form) is left in `text` (JREAL_MAX bytes). */
static bool jreal_try(double v, int digits, char *text) {
  int n = snprintf(text, JREAL_MAX, "%.*g", digits, v);
  return n > 0 && n < JREAL_MAX && strtod(text, NULL) == v;
}

/* Rewrites `text` (`n` bytes, '.' as its point) as jansson writes a real:
 * ".0" added when neither a point nor an exponent would make it read back
 * as a real, and the exponent without '+' or leading zeros.  Returns the
 * new length. */
static size_t jreal_jansson_form(char *text, size_t n) {
  char *e = strchr(text, 'e');
  if (e == NULL) {
    if (strchr(text, '.') == NULL) {
      memcpy(text + n, ".0", 3);
      n += 2;
    }
    return n;
  }
  char *to = e + 1, *from = e + 1;
  if (*from == '-')
    to = ++from;
  else if (*from == '+')
    from++;
  while (*from == '0' && from[1] != '\0')
    from++;
  memmove(to, from, strlen(from) + 1);
  return strlen(text);
}

size_t jreal_format(double v, char *out) {
  out[0] = '\0';
  if (!isfinite(v))
    return 0;
  char point = jreal_point();
  /* Zero and the subnormals start at one digit (see the top of the file). */
  int digits = fabs(v) < DBL_MIN ? 1 : DBL_DIG;
  while (digits < DBL_DECIMAL_DIG && !jreal_try(v, digits, out))
    digits++;
  if (digits == DBL_DECIMAL_DIG) /* 17 digits always read back */
    snprintf(out, JREAL_MAX, "%.*g", digits, v);
  jreal_swap(out, point, '.');
  return jreal_jansson_form(out, strlen(out));
}

bool jreal_canonical(const char *text, size_t len) {
  char local[JREAL_MAX], back[JREAL_MAX];
  if (len == 0 || len >= JREAL_MAX)
    return false; /* longer than any text jreal_format writes */
  memcpy(local, text, len);
  local[len] = '\0';
  jreal_swap(local, '.', jreal_point());
  size_t n = jreal_format(strtod(local, NULL), back);
  return n == len && memcmp(back, text, len) == 0;
}
