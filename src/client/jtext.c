/*
 * jtext.c — JSON text written and checked without trees (jtext.h).
 *
 * The workload: payloads and results that callers mostly produce with a JSON
 * serialiser (compact, or with a space after ':' and ','), and replies the
 * head writes with jw_dump, which are canonical already (reals in them too:
 * both sides write a real's shortest round-trip text, src/core/jreal.h).  The
 * scanner reads each byte once, recursing per container up to
 * JTEXT_MAX_DEPTH, and allocates nothing; it follows every valid JSON text
 * within that depth, so that a reply's non-canonical value (a real stored as
 * "%.17g" by an older head) can still be delimited and handed to jansson
 * alone.  The rules for canonical text and
 * the scanner are src/core/jcanon.c, the head's own (src/server/jscan.c runs
 * it strictly); here it runs with JTEXT_FLAGS.
 */
#include "client/jtext.h"
#include "client/client_internal.h"

#include "core/jcanon.h"
#include "core/jreal.h"

#include <stdlib.h>
#include <string.h>

/* ---- the buffer ---------------------------------------------------------- */

static bool jtext_reserve(jtext_buf_t *b, size_t more) {
  if (!b->failed && !client_grow(&b->data, &b->cap, b->len + more + 1))
    b->failed = true;
  return !b->failed;
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

bool jtext_add_real(jtext_buf_t *b, double v) {
  char text[JREAL_MAX];
  size_t n = jreal_format(v, text);
  if (n == 0)
    return false;
  jtext_add(b, text, n);
  return true;
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
  return jtext_add_stringn(b, s, strlen(s));
}

bool jtext_add_stringn(jtext_buf_t *b, const char *s, size_t n) {
  size_t at = b->len;
  const unsigned char *p = (const unsigned char *)s, *end = p + n, *run = p;
  JTEXT_ADD_LITERAL(b, "\"");
  while (p < end) {
    unsigned char c = *p;
    if (c >= 0x80) {
      size_t len = jcanon_utf8_length(p, end);
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

/* The client follows every valid JSON text, so that a reply's odd value can
 * still be delimited, and lets a caller's whitespace stand between tokens. */
#define JTEXT_FLAGS (JCANON_FOLLOW | JCANON_SPACE)

bool jtext_int(const char **pp, const char *end, int64_t *out) {
  const unsigned char *p = (const unsigned char *)*pp;
  if (!jcanon_int(&p, (const unsigned char *)end, out))
    return false;
  *pp = (const char *)p;
  return true;
}

const char *jtext_scan(const char *p, const char *end, jtext_info_t *info) {
  jcanon_scan_t s;
  jcanon_init(&s, p, end, JTEXT_FLAGS);
  bool found = jcanon_value(&s);
  *info = (jtext_info_t){.canonical = s.canonical, .spaced = s.spaced};
  return found ? (const char *)s.p : NULL;
}

bool jtext_only_space(const char *p, const char *end) {
  while (p < end && jcanon_is_space((unsigned char)*p))
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
    } else if (!jcanon_is_space((unsigned char)c)) {
      *out++ = c;
      in_string = c == '"';
    }
  }
  b->len = (size_t)(out - b->data);
  b->data[b->len] = '\0';
}

bool jtext_add_json(jtext_buf_t *b, const char *text, size_t len) {
  const char *p = text, *end = text + len;
  while (p < end && jcanon_is_space((unsigned char)*p))
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
