/*
 * jcanon.c — canonical JSON text (jcanon.h).
 *
 * The workload: the head's request bodies and libmuster's payloads and
 * replies, nearly all of them canonical text from a compact serialiser.  The
 * scanner reads each byte once, recursing per container up to
 * JCANON_MAX_DEPTH, and allocates nothing.  Its hot loop, the bytes of a
 * string, tests no option: the options only matter where the text is not
 * canonical (jcanon_decline) or where whitespace stands (jcanon_skip_space),
 * so the head's strict scan costs what its own copy did.
 *
 * A token that is not canonical goes through jcanon_decline, which records it
 * and says whether to go on: that one decision is all that separates the
 * head's scan (stop) from the client's (follow).
 */
#include "core/jcanon.h"
#include "core/jreal.h"

/* The string loop is the hot loop of every scan; it is written once and
 * inlined into both of its callers (GCC and Clang, which build muster). */
#define JCANON_INLINE inline __attribute__((always_inline))

void jcanon_init(jcanon_scan_t *s, const char *p, const char *end, unsigned flags) {
  /* Field by field: the keys need no zeroing, and they are 4 KiB. */
  s->p = (const unsigned char *)p;
  s->end = (const unsigned char *)end;
  s->flags = flags;
  s->canonical = true;
  s->spaced = false;
  s->nkeys = 0;
}

/* Records that the text is not canonical; true when the scan goes on. */
static bool jcanon_decline(jcanon_scan_t *s) {
  s->canonical = false;
  return (s->flags & JCANON_FOLLOW) != 0;
}

/* Whitespace is looked for only where a token was due and is not there (or,
 * before a value or a key, where a byte no token starts with stands): in
 * canonical text, the common case, it costs the head's strict scan nothing.
 * Every place between two tokens is covered by one of the three helpers
 * below, so that a spaced value always sets `spaced`. */

/* Skips the whitespace at s->p.  True when there was some and the scan goes
 * on; false, nothing moved, when there was none or it stops the scan. */
static bool jcanon_skip_space(jcanon_scan_t *s) {
  if (s->p == s->end || !jcanon_is_space(*s->p))
    return false;
  s->spaced = true;
  if (!(s->flags & JCANON_SPACE) && !jcanon_decline(s))
    return false;
  do
    s->p++;
  while (s->p < s->end && jcanon_is_space(*s->p));
  return true;
}

/* Consumes byte `c` when it is next, after the whitespace the scan allows. */
static inline bool jcanon_next(jcanon_scan_t *s, unsigned char c) {
  if (jcanon_byte(s, c))
    return true;
  return s->p < s->end && *s->p <= ' ' && jcanon_skip_space(s) && jcanon_byte(s, c);
}

/* Skips the whitespace the scan allows before a value or a key.  Every JSON
 * whitespace byte is at most ' ' and no token starts with one, so a single
 * comparison settles canonical text.  Whitespace that stops the scan is left
 * where it is, and the value or key then fails on it. */
static inline void jcanon_space_before(jcanon_scan_t *s) {
  if (s->p < s->end && *s->p <= ' ')
    jcanon_skip_space(s);
}

size_t jcanon_utf8_length(const unsigned char *p, const unsigned char *end) {
  unsigned c = p[0], cp;
  size_t n;
  if (c < 0x80)
    return 1;
  if (c < 0xC2 || c >= 0xF5)
    return 0;
  n = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  cp = c & (0x7F >> n); /* the payload bits of the lead byte */
  if ((size_t)(end - p) < n)
    return 0;
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xC0) != 0x80)
      return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return n;
}

/* The four hex digits at p as a number, -1 when they are not. */
static long jcanon_hex4(const unsigned char *p, const unsigned char *end) {
  if (end - p < 4)
    return -1;
  long v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char c = p[i];
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
    if (digit < 0)
      return -1;
    v = v * 16 + digit;
  }
  return v;
}

/* True when the \uXXXX escape at p, of code unit `unit`, is the one
 * json_dumps writes: a control character without a short form, upper-case
 * hex, and no NUL in a key (jansson refuses one there). */
static bool jcanon_u_canonical(const unsigned char *p, long unit, bool key) {
  if (unit >= 0x20 || unit == '\b' || unit == '\f' || unit == '\n' || unit == '\r' ||
      unit == '\t' || (unit == 0 && key))
    return false;
  return p[2] == '0' && p[3] == '0' && !(p[5] >= 'a' && p[5] <= 'f');
}

/* The escape at p (a backslash): the byte after it, or NULL on a syntax
 * error.  Surrogates must come in pairs, as jansson wants them. */
static const unsigned char *jcanon_escape(const unsigned char *p, const unsigned char *end,
                                          bool key, bool *canonical) {
  if (end - p < 2)
    return NULL;
  switch (p[1]) {
  case '"':
  case '\\':
  case 'b':
  case 'f':
  case 'n':
  case 'r':
  case 't':
    return p + 2;
  case '/': /* json_dumps writes a plain '/' */
    *canonical = false;
    return p + 2;
  case 'u':
    break;
  default:
    return NULL;
  }
  long unit = jcanon_hex4(p + 2, end);
  if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF))
    return NULL;
  if (!jcanon_u_canonical(p, unit, key))
    *canonical = false;
  p += 6;
  if (unit >= 0xD800 && unit <= 0xDBFF) {
    if (end - p < 2 || p[0] != '\\' || p[1] != 'u')
      return NULL;
    long low = jcanon_hex4(p + 2, end);
    if (low < 0xDC00 || low > 0xDFFF)
      return NULL;
    p += 6;
  }
  return p;
}

/* The string at p (a quote): the byte after its closing quote, or NULL on a
 * syntax error.  Inlined, so that `canonical` stays in a register. */
static JCANON_INLINE const unsigned char *
jcanon_string_at(const unsigned char *p, const unsigned char *end, bool key, bool *canonical) {
  p++;
  while (p < end) {
    unsigned char c = *p;
    if (c == '"')
      return p + 1;
    if (c == '\\') {
      if ((p = jcanon_escape(p, end, key, canonical)) == NULL)
        return NULL;
    } else if (c < 0x80) {
      if (c < 0x20)
        return NULL;
      p++;
    } else {
      size_t n = jcanon_utf8_length(p, end);
      if (n == 0)
        return NULL;
      p += n;
    }
  }
  return NULL;
}

bool jcanon_string(const unsigned char **pp, const unsigned char *end, bool key, bool *canonical) {
  const unsigned char *after = jcanon_string_at(*pp, end, key, canonical);
  if (after == NULL)
    return false;
  *pp = after;
  return true;
}

/* The canonical integer at p into *out: the byte after it, or NULL. */
static inline const unsigned char *jcanon_int_at(const unsigned char *p, const unsigned char *end,
                                                 int64_t *out) {
  bool negative = p < end && *p == '-';
  if (negative)
    p++;
  if (p == end || *p < '0' || *p > '9')
    return NULL;
  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
  if (*p == '0') {
    if (negative)
      return NULL; /* "-0": json_dumps writes 0 */
    p++;
  } else {
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
      unsigned digit = (unsigned)(*p - '0');
      if (v > (limit - digit) / 10)
        return NULL; /* beyond int64: jansson's error */
      v = v * 10 + digit;
    }
  }
  if (p < end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9')))
    return NULL; /* a real, or a leading zero */
  *out = negative ? (v > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)v) : (int64_t)v;
  return p;
}

bool jcanon_int(const unsigned char **pp, const unsigned char *end, int64_t *out) {
  const unsigned char *after = jcanon_int_at(*pp, end, out);
  if (after == NULL)
    return false;
  *pp = after;
  return true;
}

/* One or more digits at *pp. */
static bool jcanon_digits(const unsigned char **pp, const unsigned char *end) {
  const unsigned char *start = *pp;
  while (*pp < end && **pp >= '0' && **pp <= '9')
    (*pp)++;
  return *pp > start;
}

bool jcanon_number(const unsigned char **pp, const unsigned char *end) {
  if (*pp < end && **pp == '-')
    (*pp)++;
  if (*pp < end && **pp == '0')
    (*pp)++;
  else if (!jcanon_digits(pp, end))
    return false;
  if (*pp < end && **pp == '.') {
    (*pp)++;
    if (!jcanon_digits(pp, end))
      return false;
  }
  if (*pp < end && (**pp == 'e' || **pp == 'E')) {
    (*pp)++;
    if (*pp < end && (**pp == '+' || **pp == '-'))
      (*pp)++;
    if (!jcanon_digits(pp, end))
      return false;
  }
  return true;
}

/* ---- the value scanner ---------------------------------------------------- */

/* A string token at s->p; `key`: an object's key. */
static bool jcanon_string_token(jcanon_scan_t *s, bool key) {
  bool canonical = true;
  const unsigned char *after;
  if (s->p == s->end || *s->p != '"' ||
      (after = jcanon_string_at(s->p, s->end, key, &canonical)) == NULL)
    return false;
  s->p = after;
  return canonical || jcanon_decline(s);
}

/* A number token: canonical when it is an integer jcanon_int reads, or a
 * real in the text our writers give the double jansson reads from it
 * (jreal_canonical: its shortest round-trip text).  Integers, the common
 * case, never reach the real's strtod. */
static bool jcanon_number_token(jcanon_scan_t *s) {
  int64_t ignored;
  const unsigned char *after = jcanon_int_at(s->p, s->end, &ignored);
  if (after != NULL) {
    s->p = after;
    return true;
  }
  const unsigned char *start = s->p;
  if (!jcanon_number(&s->p, s->end))
    return false;
  return jreal_canonical((const char *)start, (size_t)(s->p - start)) || jcanon_decline(s);
}

/* Records key `at` (`len` bytes) of the object whose keys start at `first`.
 * A repeated key (jansson refuses it, or keeps the last value) or too many
 * keys to compare make the value not canonical. */
static bool jcanon_new_key(jcanon_scan_t *s, size_t first, const unsigned char *at, size_t len) {
  for (size_t i = first; i < s->nkeys; i++)
    if (s->keys[i].len == len && memcmp(s->keys[i].at, at, len) == 0)
      return jcanon_decline(s);
  if (s->nkeys == JCANON_MAX_KEYS)
    return jcanon_decline(s);
  s->keys[s->nkeys].at = at;
  s->keys[s->nkeys++].len = len;
  return true;
}

static bool jcanon_value_in(jcanon_scan_t *s, int depth);

static bool jcanon_object(jcanon_scan_t *s, int depth) {
  s->p++;
  if (jcanon_next(s, '}'))
    return true;
  size_t first = s->nkeys;
  do {
    jcanon_space_before(s);
    const unsigned char *key = s->p;
    if (!jcanon_string_token(s, true) || !jcanon_new_key(s, first, key, (size_t)(s->p - key)) ||
        !jcanon_next(s, ':'))
      return false;
    jcanon_space_before(s);
    if (!jcanon_value_in(s, depth))
      return false;
  } while (jcanon_next(s, ','));
  s->nkeys = first;
  return jcanon_byte(s, '}');
}

static bool jcanon_array(jcanon_scan_t *s, int depth) {
  s->p++;
  if (jcanon_next(s, ']'))
    return true;
  do {
    jcanon_space_before(s);
    if (!jcanon_value_in(s, depth))
      return false;
  } while (jcanon_next(s, ','));
  return jcanon_byte(s, ']');
}

/* One value at s->p inside `depth` containers. */
static bool jcanon_value_in(jcanon_scan_t *s, int depth) {
  if (s->p == s->end)
    return false;
  switch (*s->p) {
  case '{':
    return depth < JCANON_MAX_DEPTH && jcanon_object(s, depth + 1);
  case '[':
    return depth < JCANON_MAX_DEPTH && jcanon_array(s, depth + 1);
  case '"':
    return jcanon_string_token(s, false);
  case 't':
    return jcanon_word(s, "true", 4);
  case 'f':
    return jcanon_word(s, "false", 5);
  case 'n':
    return jcanon_word(s, "null", 4);
  default:
    return jcanon_number_token(s);
  }
}

bool jcanon_value(jcanon_scan_t *s) {
  return jcanon_value_in(s, 0);
}
