/*
 * jtext.c — JSON text written and checked without trees (jtext.h).
 *
 * The workload: payloads and results that callers mostly produce with a JSON
 * serialiser (compact, or with a space after ':' and ','), and replies the
 * head writes with jw_dump, which are canonical already.  The scanner reads
 * each byte once, recursing per container up to JTEXT_MAX_DEPTH, and
 * allocates nothing; it follows every valid JSON text within that depth, so
 * that a reply's non-canonical value (a real in a payload) can still be
 * delimited and handed to jansson alone.  The rules for canonical text are
 * those of the head's src/server/jscan.c, copied rather than shared so that
 * libmuster does not depend on the server's sources.
 */
#include "client/jtext.h"

#include <stdlib.h>
#include <string.h>

/* ---- the buffer ---------------------------------------------------------- */

static bool jtext_reserve(jtext_buf_t *b, size_t more) {
  if (b->failed)
    return false;
  if (b->len + more + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->len + more + 1)
    cap *= 2;
  char *grown = realloc(b->data, cap);
  if (grown == NULL) {
    b->failed = true;
    return false;
  }
  b->data = grown;
  b->cap = cap;
  return true;
}

void jtext_reset(jtext_buf_t *b) {
  b->len = 0;
  b->failed = false;
  if (b->data)
    b->data[0] = '\0';
}

void jtext_buf_free(jtext_buf_t *b) {
  free(b->data);
  *b = (jtext_buf_t){0};
}

void jtext_add(jtext_buf_t *b, const char *text, size_t n) {
  if (!jtext_reserve(b, n))
    return;
  memcpy(b->data + b->len, text, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void jtext_add_int(jtext_buf_t *b, int64_t v) {
  char digits[24], *end = digits + sizeof digits, *p = end;
  /* Through unsigned so that the most negative value needs no special case. */
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    *--p = '-';
  jtext_add(b, p, (size_t)(end - p));
}

size_t jtext_utf8_length(const unsigned char *p, const unsigned char *end) {
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

/* The escape json_dumps writes for control character or quote `c`, into
 * seq (7 bytes); returns its length. */
static size_t jtext_escape_of(unsigned char c, char *seq) {
  static const char hex[] = "0123456789ABCDEF";
  seq[0] = '\\';
  switch (c) {
  case '"':
    seq[1] = '"';
    return 2;
  case '\\':
    seq[1] = '\\';
    return 2;
  case '\b':
    seq[1] = 'b';
    return 2;
  case '\f':
    seq[1] = 'f';
    return 2;
  case '\n':
    seq[1] = 'n';
    return 2;
  case '\r':
    seq[1] = 'r';
    return 2;
  case '\t':
    seq[1] = 't';
    return 2;
  default:
    break;
  }
  memcpy(seq + 1, "u00", 3);
  seq[4] = hex[c >> 4];
  seq[5] = hex[c & 15];
  return 6;
}

bool jtext_add_string(jtext_buf_t *b, const char *s) {
  size_t at = b->len, n = strlen(s);
  const unsigned char *p = (const unsigned char *)s, *end = p + n, *run = p;
  JTEXT_ADD_LITERAL(b, "\"");
  while (p < end) {
    unsigned char c = *p;
    if (c >= 0x80) {
      size_t len = jtext_utf8_length(p, end);
      if (len == 0) {
        b->len = at;
        if (b->data)
          b->data[at] = '\0';
        return false;
      }
      p += len;
    } else if (c < 0x20 || c == '"' || c == '\\') {
      char seq[8];
      jtext_add(b, (const char *)run, (size_t)(p - run));
      jtext_add(b, seq, jtext_escape_of(c, seq));
      run = ++p;
    } else {
      p++;
    }
  }
  jtext_add(b, (const char *)run, (size_t)(p - run));
  JTEXT_ADD_LITERAL(b, "\"");
  return true;
}

/* ---- the scanner --------------------------------------------------------- */

typedef struct {
  const unsigned char *p, *end;
  jtext_info_t *info;
  struct {
    const unsigned char *at; /* the key with its quotes */
    size_t len;
  } keys[JTEXT_MAX_KEYS];
  size_t nkeys;
} jtext_scan_t;

static bool jtext_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void jtext_skip_space(jtext_scan_t *s) {
  if (s->p < s->end && jtext_space(*s->p)) {
    s->info->spaced = true;
    do
      s->p++;
    while (s->p < s->end && jtext_space(*s->p));
  }
}

/* Consumes byte `c` when it is next. */
static bool jtext_byte(jtext_scan_t *s, unsigned char c) {
  if (s->p == s->end || *s->p != c)
    return false;
  s->p++;
  return true;
}

/* The four hex digits at p as a number, -1 when they are not. */
static long jtext_hex4(const unsigned char *p, const unsigned char *end) {
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
static bool jtext_u_canonical(const unsigned char *p, long unit, bool key) {
  if (unit >= 0x20 || unit == '\b' || unit == '\f' || unit == '\n' || unit == '\r' ||
      unit == '\t' || (unit == 0 && key))
    return false;
  return p[2] == '0' && p[3] == '0' && !(p[5] >= 'a' && p[5] <= 'f');
}

/* The escape at *pp (a backslash), moving *pp past it; surrogates must come
 * in pairs, as jansson wants them.  False on a syntax error. */
static bool jtext_escape(jtext_scan_t *s, const unsigned char **pp, bool key) {
  const unsigned char *p = *pp, *end = s->end;
  if (end - p < 2)
    return false;
  switch (p[1]) {
  case '"':
  case '\\':
  case 'b':
  case 'f':
  case 'n':
  case 'r':
  case 't':
    *pp = p + 2;
    return true;
  case '/': /* json_dumps writes a plain '/' */
    s->info->canonical = false;
    *pp = p + 2;
    return true;
  case 'u':
    break;
  default:
    return false;
  }
  long unit = jtext_hex4(p + 2, end);
  if (unit < 0 || (unit >= 0xDC00 && unit <= 0xDFFF))
    return false;
  if (!jtext_u_canonical(p, unit, key))
    s->info->canonical = false;
  p += 6;
  if (unit >= 0xD800 && unit <= 0xDBFF) {
    if (end - p < 2 || p[0] != '\\' || p[1] != 'u')
      return false;
    long low = jtext_hex4(p + 2, end);
    if (low < 0xDC00 || low > 0xDFFF)
      return false;
    p += 6;
  }
  *pp = p;
  return true;
}

/* The string at s->p (a quote); `key`: an object's key. */
static bool jtext_string(jtext_scan_t *s, bool key) {
  const unsigned char *p = s->p + 1, *end = s->end;
  while (p < end) {
    unsigned char c = *p;
    if (c == '"') {
      s->p = p + 1;
      return true;
    }
    if (c == '\\') {
      if (!jtext_escape(s, &p, key))
        return false;
    } else if (c < 0x80) {
      if (c < 0x20)
        return false;
      p++;
    } else {
      size_t n = jtext_utf8_length(p, end);
      if (n == 0)
        return false;
      p += n;
    }
  }
  return false;
}

bool jtext_int(const char **pp, const char *end_text, int64_t *out) {
  const unsigned char *p = (const unsigned char *)*pp, *end = (const unsigned char *)end_text;
  bool negative = p < end && *p == '-';
  if (negative)
    p++;
  if (p == end || *p < '0' || *p > '9')
    return false;
  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
  if (*p == '0') {
    if (negative)
      return false; /* "-0": json_dumps writes 0 */
    p++;
  } else {
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
      unsigned digit = (unsigned)(*p - '0');
      if (v > (limit - digit) / 10)
        return false; /* beyond int64: jansson's error */
      v = v * 10 + digit;
    }
  }
  if (p < end && (*p == '.' || *p == 'e' || *p == 'E' || (*p >= '0' && *p <= '9')))
    return false; /* a real, or a leading zero */
  *out = negative ? (v > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)v) : (int64_t)v;
  *pp = (const char *)p;
  return true;
}

static bool jtext_digits(jtext_scan_t *s) {
  const unsigned char *start = s->p;
  while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
    s->p++;
  return s->p > start;
}

/* A number: canonical when it is an integer jtext_int reads. */
static bool jtext_number(jtext_scan_t *s) {
  const char *q = (const char *)s->p;
  int64_t ignored;
  if (jtext_int(&q, (const char *)s->end, &ignored)) {
    s->p = (const unsigned char *)q;
    return true;
  }
  s->info->canonical = false;
  jtext_byte(s, '-');
  if (!jtext_byte(s, '0') && !jtext_digits(s))
    return false;
  if (jtext_byte(s, '.') && !jtext_digits(s))
    return false;
  if (jtext_byte(s, 'e') || jtext_byte(s, 'E')) {
    if (!jtext_byte(s, '+'))
      jtext_byte(s, '-');
    if (!jtext_digits(s))
      return false;
  }
  return true;
}

static bool jtext_word(jtext_scan_t *s, const char *word, size_t n) {
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
    return false;
  s->p += n;
  return true;
}

/* Records key `at` (`len` bytes) of the object whose keys start at `first`.
 * A repeated key (jansson keeps the last value) or too many keys to compare
 * make the value not canonical. */
static void jtext_new_key(jtext_scan_t *s, size_t first, const unsigned char *at, size_t len) {
  for (size_t i = first; i < s->nkeys; i++)
    if (s->keys[i].len == len && memcmp(s->keys[i].at, at, len) == 0) {
      s->info->canonical = false;
      return;
    }
  if (s->nkeys == JTEXT_MAX_KEYS) {
    s->info->canonical = false;
    return;
  }
  s->keys[s->nkeys].at = at;
  s->keys[s->nkeys++].len = len;
}

static bool jtext_value(jtext_scan_t *s, int depth);

static bool jtext_object(jtext_scan_t *s, int depth) {
  s->p++;
  jtext_skip_space(s);
  if (jtext_byte(s, '}'))
    return true;
  size_t first = s->nkeys;
  for (;;) {
    const unsigned char *key = s->p;
    if (s->p == s->end || *s->p != '"' || !jtext_string(s, true))
      return false;
    jtext_new_key(s, first, key, (size_t)(s->p - key));
    jtext_skip_space(s);
    if (!jtext_byte(s, ':'))
      return false;
    jtext_skip_space(s);
    if (!jtext_value(s, depth))
      return false;
    jtext_skip_space(s);
    if (!jtext_byte(s, ','))
      break;
    jtext_skip_space(s);
  }
  s->nkeys = first;
  return jtext_byte(s, '}');
}

static bool jtext_array(jtext_scan_t *s, int depth) {
  s->p++;
  jtext_skip_space(s);
  if (jtext_byte(s, ']'))
    return true;
  for (;;) {
    if (!jtext_value(s, depth))
      return false;
    jtext_skip_space(s);
    if (!jtext_byte(s, ','))
      break;
    jtext_skip_space(s);
  }
  return jtext_byte(s, ']');
}

/* One value at s->p inside `depth` containers. */
static bool jtext_value(jtext_scan_t *s, int depth) {
  if (s->p == s->end)
    return false;
  switch (*s->p) {
  case '{':
    return depth < JTEXT_MAX_DEPTH && jtext_object(s, depth + 1);
  case '[':
    return depth < JTEXT_MAX_DEPTH && jtext_array(s, depth + 1);
  case '"':
    return jtext_string(s, false);
  case 't':
    return jtext_word(s, "true", 4);
  case 'f':
    return jtext_word(s, "false", 5);
  case 'n':
    return jtext_word(s, "null", 4);
  default:
    return jtext_number(s);
  }
}

const char *jtext_scan(const char *p, const char *end, jtext_info_t *info) {
  jtext_scan_t s;
  s.p = (const unsigned char *)p;
  s.end = (const unsigned char *)end;
  s.info = info;
  s.nkeys = 0;
  *info = (jtext_info_t){.canonical = true};
  return jtext_value(&s, 0) ? (const char *)s.p : NULL;
}

bool jtext_only_space(const char *p, const char *end) {
  while (p < end && jtext_space((unsigned char)*p))
    p++;
  return p == end;
}

/* ---- splicing a value ------------------------------------------------------ */

/* Appends the valid JSON text [p, end) without the whitespace between its
 * tokens. */
static void jtext_add_compact(jtext_buf_t *b, const char *p, const char *end) {
  if (!jtext_reserve(b, (size_t)(end - p)))
    return;
  char *out = b->data + b->len;
  bool in_string = false;
  for (; p < end; p++) {
    char c = *p;
    if (in_string) {
      *out++ = c;
      if (c == '\\')
        *out++ = *++p; /* the escaped byte; a \u's digits follow as plain bytes */
      else if (c == '"')
        in_string = false;
    } else if (!jtext_space((unsigned char)c)) {
      *out++ = c;
      in_string = c == '"';
    }
  }
  b->len = (size_t)(out - b->data);
  b->data[b->len] = '\0';
}

bool jtext_add_json(jtext_buf_t *b, const char *text, size_t len) {
  const char *p = text, *end = text + len;
  while (p < end && jtext_space((unsigned char)*p))
    p++;
  jtext_info_t info;
  const char *value_end = jtext_scan(p, end, &info);
  if (value_end == NULL || !info.canonical)
    return false;
  if (!jtext_only_space(value_end, end))
    return false;
  if (info.spaced)
    jtext_add_compact(b, p, value_end);
  else
    jtext_add(b, p, (size_t)(value_end - p));
  return true;
}
