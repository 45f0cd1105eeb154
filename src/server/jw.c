/*
 * jw.c — compact JSON text from jansson values, for replies and stored payloads.
 *
 * jansson's json_dumps walks the value through a callback per token and
 * decodes every string character by character as UTF-8; on the head's hot
 * path (every reply, every payload stored) that was a tenth of the CPU.  This
 * writer produces the same text as json_dumps(v, JSON_COMPACT |
 * JSON_ENCODE_ANY) — the same escapes, the same integers — into one growing
 * buffer, copying runs of plain bytes at once.  Reals alone differ: jansson
 * writes "%.17g" (0.10000000000000001), jw the shortest text that reads back
 * as the same double (0.1, src/core/jreal.h), as libmuster writes them.
 * jansson strings are valid UTF-8 already (it checks them when they are
 * made), so bytes at or above 0x80 pass through as they are, as json_dumps
 * writes them.
 * tests/unit/test_jw.c compares the two on many values.
 *
 * Raw nodes (see jw.h) carry text that is JSON already; jw_valid checks such
 * text when it comes from a place the head does not fully trust (the store).
 */
#include "jw.h"

#include "core/jcanon.h"
#include "core/jreal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first element of every raw node: an immortal null of our own, as
 * jansson's null, true and false are immortal (json_incref and json_decref
 * leave a refcount of (size_t)-1 alone).  No parsed value is this pointer. */
static json_t jw_mark = {.type = JSON_NULL, .refcount = (size_t)-1};

bool jw_grow(jw_buf_t *b, size_t more) {
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

static void jw_char(jw_buf_t *b, char c) {
  if (jw_reserve(b, 1))
    b->buf[b->len++] = c;
}

/* Bytes a JSON string must escape: '"', '\\' and the control characters. */
static bool jw_escaped(unsigned char c) {
  return c < 0x20 || c == '"' || c == '\\';
}

void jw_add_string(jw_buf_t *b, const char *s, size_t n) {
  jw_char(b, '"');
  size_t run = 0; /* start of the bytes not yet copied */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!jw_escaped(c))
      continue;
    jw_add_text(b, s + run, i - run);
    run = i + 1;
    switch (c) {
    case '"':
      jw_add_text(b, "\\\"", 2);
      break;
    case '\\':
      jw_add_text(b, "\\\\", 2);
      break;
    case '\b':
      jw_add_text(b, "\\b", 2);
      break;
    case '\f':
      jw_add_text(b, "\\f", 2);
      break;
    case '\n':
      jw_add_text(b, "\\n", 2);
      break;
    case '\r':
      jw_add_text(b, "\\r", 2);
      break;
    case '\t':
      jw_add_text(b, "\\t", 2);
      break;
    default: {
      char seq[8];
      snprintf(seq, sizeof seq, "\\u%04X", (unsigned)c);
      jw_add_text(b, seq, 6);
    }
    }
  }
  jw_add_text(b, s + run, n - run);
  jw_char(b, '"');
}

void jw_add_int(jw_buf_t *b, int64_t v) {
  /* Two digits per division: ids, tokens and times (13 digits) are written
   * several times per task of a batch. */
  static const char pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233"
                              "34353637383940414243444546474849505152535455565758596061626364656667"
                              "6869707172737475767778798081828384858687888990919293949596979899";
  char digits[24], *end = digits + sizeof digits, *p = end;
  /* Through unsigned so that the most negative value needs no special case. */
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  while (u >= 100) {
    unsigned pair = (unsigned)(u % 100) * 2;
    u /= 100;
    *--p = pairs[pair + 1];
    *--p = pairs[pair];
  }
  if (u >= 10) {
    *--p = pairs[u * 2 + 1];
    *--p = pairs[u * 2];
  } else {
    *--p = (char)('0' + u);
  }
  if (v < 0)
    *--p = '-';
  jw_add_text(b, p, (size_t)(end - p));
}

/* The shortest text that reads back as `v`, in jansson's form (jreal.h):
 * 0.1, not jansson's 0.10000000000000001.  A tree cannot hold NaN or an
 * infinity (json_real refuses them), so the refusal below is never seen
 * through jansson; it keeps such a value out of the text all the same. */
static void jw_real(jw_buf_t *b, double v) {
  char text[JREAL_MAX];
  size_t n = jreal_format(v, text);
  if (n == 0) {
    b->failed = true;
    return;
  }
  jw_add_text(b, text, n);
}

static void jw_add_object(jw_buf_t *b, const json_t *v) {
  jw_char(b, '{');
  bool first = true;
  for (void *it = json_object_iter((json_t *)v); it; it = json_object_iter_next((json_t *)v, it)) {
    if (!first)
      jw_char(b, ',');
    first = false;
    jw_add_string(b, json_object_iter_key(it), json_object_iter_key_len(it));
    jw_char(b, ':');
    jw_add_value(b, json_object_iter_value(it));
  }
  jw_char(b, '}');
}

static void jw_add_array(jw_buf_t *b, const json_t *v) {
  size_t n = json_array_size(v);
  if (n == 2 && json_array_get(v, 0) == &jw_mark) { /* a raw node: its text as it is */
    const json_t *text = json_array_get(v, 1);
    jw_add_text(b, json_string_value(text), json_string_length(text));
    return;
  }
  jw_char(b, '[');
  for (size_t i = 0; i < n; i++) {
    if (i)
      jw_char(b, ',');
    jw_add_value(b, json_array_get(v, i));
  }
  jw_char(b, ']');
}

void jw_add_value(jw_buf_t *b, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    jw_add_object(b, v);
    break;
  case JSON_ARRAY:
    jw_add_array(b, v);
    break;
  case JSON_STRING:
    jw_add_string(b, json_string_value(v), json_string_length(v));
    break;
  case JSON_INTEGER:
    jw_add_int(b, json_integer_value(v));
    break;
  case JSON_REAL:
    jw_real(b, json_real_value(v));
    break;
  case JSON_TRUE:
    jw_add_text(b, "true", 4);
    break;
  case JSON_FALSE:
    jw_add_text(b, "false", 5);
    break;
  case JSON_NULL:
    jw_add_text(b, "null", 4);
    break;
  }
}

char *jw_dump(const json_t *v, size_t *len) {
  jw_buf_t b = {0};
  if (v == NULL)
    return NULL;
  jw_add_value(&b, v);
  if (!jw_reserve(&b, 0)) {
    free(b.buf);
    return NULL;
  }
  b.buf[b.len] = '\0';
  if (len)
    *len = b.len;
  return b.buf;
}

void jw_buf_free(jw_buf_t *b) {
  free(b->buf);
  *b = (jw_buf_t){0};
}

/* ---- raw nodes ---- */

json_t *jw_raw(const char *text, size_t len) {
  json_t *raw = json_array();
  if (raw == NULL || json_array_append_new(raw, &jw_mark) != 0 ||
      json_array_append_new(raw, json_stringn_nocheck(text, len)) != 0) {
    json_decref(raw);
    return NULL;
  }
  return raw;
}

json_t *jw_object_raw(const char *key, const jw_buf_t *b) {
  json_t *raw = b->failed ? NULL : jw_raw(b->buf, b->len);
  json_t *object = raw ? json_object() : NULL;
  /* json_object_set_new takes `raw` also when it fails. */
  if (object && json_object_set_new(object, key, raw) == 0)
    return object;
  if (object == NULL)
    json_decref(raw);
  json_decref(object);
  return NULL;
}

bool jw_is_raw(const json_t *v) {
  return json_is_array(v) && json_array_size(v) == 2 && json_array_get(v, 0) == &jw_mark &&
         json_is_string(json_array_get(v, 1));
}

const char *jw_raw_text(const json_t *v, size_t *len) {
  if (!jw_is_raw(v))
    return NULL;
  const json_t *text = json_array_get(v, 1);
  if (len)
    *len = json_string_length(text);
  return json_string_value(text);
}

/* ---- checking text before it is spliced ----
 *
 * An iterative scanner: the enclosing containers are a stack of bytes, so
 * deep text costs no recursion.  It allocates nothing and reads each byte
 * once; for the short payloads of the hot path it is a small fraction of
 * what json_loads cost (a tree, a lexer buffer, a string per value). */

#define JW_MAX_DEPTH 2048 /* as jansson's JSON_PARSER_MAX_DEPTH */

typedef struct {
  const unsigned char *p, *end;
} jw_scan_t;

static void jw_skip_space(jw_scan_t *s) {
  while (s->p < s->end && jcanon_is_space(*s->p))
    s->p++;
}

/* The string starting at s->p (a quote): any string jansson reads, canonical
 * or not (jcanon_string's rules, shared with the canonical scanners). */
static bool jw_scan_string(jw_scan_t *s) {
  bool canonical = true; /* not asked for: jw_valid takes every escape jansson reads */
  return jcanon_string(&s->p, s->end, false, &canonical);
}

static bool jw_scan_word(jw_scan_t *s, const char *word, size_t n) {
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
    return false;
  s->p += n;
  return true;
}

/* A value other than an object or an array. */
static bool jw_scan_scalar(jw_scan_t *s) {
  switch (*s->p) {
  case '"':
    return jw_scan_string(s);
  case 't':
    return jw_scan_word(s, "true", 4);
  case 'f':
    return jw_scan_word(s, "false", 5);
  case 'n':
    return jw_scan_word(s, "null", 4);
  default:
    return jcanon_number(&s->p, s->end);
  }
}

/* An object's key and its colon. */
static bool jw_scan_key(jw_scan_t *s) {
  jw_skip_space(s);
  if (s->p == s->end || *s->p != '"' || !jw_scan_string(s))
    return false;
  jw_skip_space(s);
  if (s->p == s->end || *s->p != ':')
    return false;
  s->p++;
  return true;
}

static unsigned char jw_closer(unsigned char opener) {
  return opener == '{' ? '}' : ']';
}

/* jw_valid's pass: the scanner, and the containers open around it. */
typedef struct {
  jw_scan_t s;
  unsigned char open[JW_MAX_DEPTH]; /* '{' or '[' of each enclosing container */
  size_t depth;
} jw_nest_t;

/* Where a value is expected: reads a scalar, or opens a container and reads
 * its first key, or its end when it is empty.  Returns 1 when a value is
 * expected next (a container was opened), 0 after a whole value, -1 when the
 * text is not JSON. */
static int jw_valid_value(jw_nest_t *v) {
  if (v->s.p == v->s.end)
    return -1;
  unsigned char c = *v->s.p;
  if (v->depth == JW_MAX_DEPTH) /* jansson counts every value, scalars too */
    return -1;
  if (c != '{' && c != '[')
    return jw_scan_scalar(&v->s) ? 0 : -1;
  v->open[v->depth++] = c;
  v->s.p++;
  jw_skip_space(&v->s);
  if (v->s.p < v->s.end && *v->s.p == jw_closer(c)) { /* empty */
    v->s.p++;
    v->depth--;
    return 0;
  }
  return c == '{' && !jw_scan_key(&v->s) ? -1 : 1;
}

/* After a value in a container: reads a comma (and in an object the next
 * key) or the container's closer.  Returns 1 when a value is expected next,
 * 0 after the closer, -1 when the text is not JSON. */
static int jw_valid_after(jw_nest_t *v) {
  if (v->s.p == v->s.end)
    return -1;
  unsigned char c = *v->s.p++;
  if (c == ',')
    return v->open[v->depth - 1] == '{' && !jw_scan_key(&v->s) ? -1 : 1;
  if (c != jw_closer(v->open[v->depth - 1]))
    return -1;
  v->depth--;
  return 0;
}

bool jw_valid(const char *text, size_t len) {
  jw_nest_t v; /* not cleared: open[] is read only below depth */
  v.s = (jw_scan_t){(const unsigned char *)text, (const unsigned char *)text + len};
  v.depth = 0;
  int want_value = 1; /* 0: after a value */
  for (;;) {
    jw_skip_space(&v.s);
    if (!want_value && v.depth == 0)
      return v.s.p == v.s.end;
    want_value = want_value ? jw_valid_value(&v) : jw_valid_after(&v);
    if (want_value < 0)
      return false;
  }
}
