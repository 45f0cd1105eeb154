/*
 * jw.c — compact JSON text from jansson values, for replies and stored payloads.
 *
 * jansson's json_dumps walks the value through a callback per token and
 * decodes every string character by character as UTF-8; on the head's hot
 * path (every reply, every payload stored) that was a tenth of the CPU.  This
 * writer produces the same text as json_dumps(v, JSON_COMPACT |
 * JSON_ENCODE_ANY) — the same escapes, the same number forms — into one
 * growing buffer, copying runs of plain bytes at once.  jansson strings are
 * valid UTF-8 already (it checks them when they are made), so bytes at or
 * above 0x80 pass through as they are, as json_dumps writes them.
 * tests/unit/test_jw.c compares the two on many values.
 */
#include "jw.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *buf;
  size_t len, cap;
  bool failed;
} jw_buf_t;

static bool jw_reserve(jw_buf_t *b, size_t more) {
  if (b->failed)
    return false;
  if (b->len + more + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more + 1)
    cap *= 2;
  char *grown = realloc(b->buf, cap);
  if (grown == NULL) {
    b->failed = true;
    return false;
  }
  b->buf = grown;
  b->cap = cap;
  return true;
}

static void jw_put(jw_buf_t *b, const char *data, size_t n) {
  if (jw_reserve(b, n)) {
    memcpy(b->buf + b->len, data, n);
    b->len += n;
  }
}

static void jw_char(jw_buf_t *b, char c) {
  if (jw_reserve(b, 1))
    b->buf[b->len++] = c;
}

/* Bytes a JSON string must escape: '"', '\\' and the control characters. */
static bool jw_escaped(unsigned char c) {
  return c < 0x20 || c == '"' || c == '\\';
}

static void jw_string(jw_buf_t *b, const char *s, size_t n) {
  jw_char(b, '"');
  size_t run = 0; /* start of the bytes not yet copied */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!jw_escaped(c))
      continue;
    jw_put(b, s + run, i - run);
    run = i + 1;
    switch (c) {
    case '"': jw_put(b, "\\\"", 2); break;
    case '\\': jw_put(b, "\\\\", 2); break;
    case '\b': jw_put(b, "\\b", 2); break;
    case '\f': jw_put(b, "\\f", 2); break;
    case '\n': jw_put(b, "\\n", 2); break;
    case '\r': jw_put(b, "\\r", 2); break;
    case '\t': jw_put(b, "\\t", 2); break;
    default: {
      char seq[8];
      snprintf(seq, sizeof seq, "\\u%04X", (unsigned)c);
      jw_put(b, seq, 6);
    }
    }
  }
  jw_put(b, s + run, n - run);
  jw_char(b, '"');
}

static void jw_integer(jw_buf_t *b, json_int_t v) {
  char digits[24], *end = digits + sizeof digits, *p = end;
  /* Through unsigned so that the most negative value needs no special case. */
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  do {
    *--p = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0)
    *--p = '-';
  jw_put(b, p, (size_t)(end - p));
}

/* As jansson: 17 significant digits, a ".0" when the text would read back as
 * an integer, and an exponent without '+' or leading zeros ("1e300"). */
static void jw_real(jw_buf_t *b, double v) {
  char text[64];
  int n = snprintf(text, sizeof text - 2, "%.17g", v);
  if (n < 0 || (size_t)n >= sizeof text - 2) {
    b->failed = true;
    return;
  }
  char *e = strchr(text, 'e');
  if (e == NULL && strchr(text, '.') == NULL) {
    text[n++] = '.';
    text[n++] = '0';
  } else if (e != NULL) {
    char *from = e + 1, *to = e + 1;
    if (*from == '+')
      from++;
    else if (*from == '-')
      *to++ = *from++;
    while (*from == '0' && from[1] != '\0')
      from++;
    memmove(to, from, strlen(from) + 1);
    n = (int)strlen(text);
  }
  jw_put(b, text, (size_t)n);
}

static void jw_value(jw_buf_t *b, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT: {
    jw_char(b, '{');
    bool first = true;
    for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it)) {
      if (!first)
        jw_char(b, ',');
      first = false;
      jw_string(b, json_object_iter_key(it), json_object_iter_key_len(it));
      jw_char(b, ':');
      jw_value(b, json_object_iter_value(it));
    }
    jw_char(b, '}');
    break;
  }
  case JSON_ARRAY: {
    jw_char(b, '[');
    for (size_t i = 0, n = json_array_size(v); i < n; i++) {
      if (i)
        jw_char(b, ',');
      jw_value(b, json_array_get(v, i));
    }
    jw_char(b, ']');
    break;
  }
  case JSON_STRING: jw_string(b, json_string_value(v), json_string_length(v)); break;
  case JSON_INTEGER: jw_integer(b, json_integer_value(v)); break;
  case JSON_REAL: jw_real(b, json_real_value(v)); break;
  case JSON_TRUE: jw_put(b, "true", 4); break;
  case JSON_FALSE: jw_put(b, "false", 5); break;
  case JSON_NULL: jw_put(b, "null", 4); break;
  }
}

char *jw_dump(const json_t *v, size_t *len) {
  jw_buf_t b = {0};
  if (v == NULL)
    return NULL;
  jw_value(&b, v);
  if (!jw_reserve(&b, 0)) {
    free(b.buf);
    return NULL;
  }
  b.buf[b.len] = '\0';
  if (len)
    *len = b.len;
  return b.buf;
}
