/*
 * jscan.c — the hot request bodies read from their text (jscan.h).
 *
 * The workload: batches of puts and completions from libmuster, which sends
 * json_dumps(JSON_COMPACT) text, so that nearly every payload and result is
 * already the text jw_dump would write for it.  The scanner proves that for
 * each kept slice while it reads the body once, left to right, allocating
 * nothing but the element array and one buffer of texts.
 *
 * Canonical means, value by value, what jw_dump writes for what jansson
 * parses: no whitespace; strings in valid UTF-8 (jw_utf8_length, jansson's
 * rules) whose only escapes are \" \\ \b \f \n \r \t and \u00XX (upper-case
 * hex) for the other control characters; integers without a plus sign,
 * leading zeros or "-0", within int64 (jansson refuses larger ones); no
 * reals at all (their text form is %.17g, not worth proving); objects
 * without duplicate keys (JSON_REJECT_DUPLICATES) and without a NUL in a
 * key.  Because canonical text is one-to-one with its value, two keys are
 * duplicates exactly when their slices are equal bytes.  Nesting is limited
 * to JSCAN_MAX_DEPTH, far inside jansson's 2048, and the keys of the open
 * objects to JSCAN_MAX_KEYS; beyond either the scan declines, which only
 * costs the tree path.
 */
#include "jscan.h"

#include <stdlib.h>
#include <string.h>

#define JSCAN_MAX_DEPTH 64 /* containers inside a kept value */
#define JSCAN_MAX_KEYS 256 /* keys of the objects open at once, for duplicates */

typedef struct {
  const unsigned char *p, *end;
  struct {
    const unsigned char *at; /* the key with its quotes */
    size_t len;
  } keys[JSCAN_MAX_KEYS];
  size_t nkeys;
} jscan_t;

/* Consumes byte `c` when it is next. */
static bool jscan_byte(jscan_t *s, unsigned char c) {
  if (s->p == s->end || *s->p != c)
    return false;
  s->p++;
  return true;
}

/* The escape at p (a backslash) when jw writes it: true with *pp past it. */
static bool jscan_escape(const unsigned char **pp, const unsigned char *end, bool key) {
  const unsigned char *p = *pp;
  if (end - p < 2)
    return false;
  switch (p[1]) {
  case '"': case '\\': case 'b': case 'f': case 'n': case 'r': case 't':
    *pp = p + 2;
    return true;
  case 'u': break;
  default: return false; /* "\/" among them: jw writes a plain '/' */
  }
  if (end - p < 6 || p[2] != '0' || p[3] != '0' || (p[4] != '0' && p[4] != '1'))
    return false;
  unsigned char h = p[5];
  int low = h >= '0' && h <= '9' ? h - '0' : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
  if (low < 0)
    return false;
  unsigned c = (unsigned)(p[4] - '0') * 16 + (unsigned)low;
  if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
    return false; /* jw writes the short form */
  if (c == 0 && key)
    return false; /* jansson refuses a NUL in a key */
  *pp = p + 6;
  return true;
}

/* The string at s->p (a quote); `key`: an object's key. */
static bool jscan_string(jscan_t *s, bool key) {
  const unsigned char *p = s->p + 1, *end = s->end;
  while (p < end) {
    unsigned char c = *p;
    if (c == '"') {
      s->p = p + 1;
      return true;
    }
    if (c == '\\') {
      if (!jscan_escape(&p, end, key))
        return false;
    } else if (c < 0x80) {
      if (c < 0x20)
        return false;
      p++;
    } else {
      size_t n = jw_utf8_length(p, end);
      if (n == 0)
        return false;
      p += n;
    }
  }
  return false;
}

/* An integer as jw writes it, into *out. */
static bool jscan_int(jscan_t *s, int64_t *out) {
  const unsigned char *p = s->p, *end = s->end;
  bool negative = p < end && *p == '-';
  if (negative)
    p++;
  if (p == end || *p < '0' || *p > '9')
    return false;
  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
  if (*p == '0') {
    if (negative)
      return false; /* "-0": jw writes 0 */
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
  s->p = p;
  return true;
}

static bool jscan_word(jscan_t *s, const char *word, size_t n) {
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
    return false;
  s->p += n;
  return true;
}

/* Records key `at` (`len` bytes) of the object whose keys start at `first`;
 * false when it repeats one of them or the keys are too many. */
static bool jscan_new_key(jscan_t *s, size_t first, const unsigned char *at, size_t len) {
  for (size_t i = first; i < s->nkeys; i++)
    if (s->keys[i].len == len && memcmp(s->keys[i].at, at, len) == 0)
      return false;
  if (s->nkeys == JSCAN_MAX_KEYS)
    return false;
  s->keys[s->nkeys].at = at;
  s->keys[s->nkeys++].len = len;
  return true;
}

static bool jscan_value(jscan_t *s, int depth);

static bool jscan_object(jscan_t *s, int depth) {
  s->p++;
  if (jscan_byte(s, '}'))
    return true;
  size_t first = s->nkeys;
  do {
    const unsigned char *key = s->p;
    if (s->p == s->end || *s->p != '"' || !jscan_string(s, true) ||
        !jscan_new_key(s, first, key, (size_t)(s->p - key)) || !jscan_byte(s, ':') ||
        !jscan_value(s, depth))
      return false;
  } while (jscan_byte(s, ','));
  s->nkeys = first;
  return jscan_byte(s, '}');
}

static bool jscan_array(jscan_t *s, int depth) {
  s->p++;
  if (jscan_byte(s, ']'))
    return true;
  do {
    if (!jscan_value(s, depth))
      return false;
  } while (jscan_byte(s, ','));
  return jscan_byte(s, ']');
}

/* One canonical value at s->p inside `depth` containers of a kept value. */
static bool jscan_value(jscan_t *s, int depth) {
  int64_t ignored;
  if (s->p == s->end)
    return false;
  switch (*s->p) {
  case '{': return depth < JSCAN_MAX_DEPTH && jscan_object(s, depth + 1);
  case '[': return depth < JSCAN_MAX_DEPTH && jscan_array(s, depth + 1);
  case '"': return jscan_string(s, false);
  case 't': return jscan_word(s, "true", 4);
  case 'f': return jscan_word(s, "false", 5);
  case 'n': return jscan_word(s, "null", 4);
  default: return jscan_int(s, &ignored);
  }
}

bool jscan_canonical(const char *text, size_t len) {
  jscan_t s;
  s.p = (const unsigned char *)text;
  s.end = s.p + len;
  s.nkeys = 0;
  return text != NULL && jscan_value(&s, 0) && s.p == s.end;
}

/* ---- bodies ---- */

/* Consumes `"name":` when it is next. */
static bool jscan_key(jscan_t *s, const char *name) {
  size_t n = strlen(name);
  if ((size_t)(s->end - s->p) < n + 3 || s->p[0] != '"' || memcmp(s->p + 1, name, n) != 0 ||
      s->p[n + 1] != '"' || s->p[n + 2] != ':')
    return false;
  s->p += n + 3;
  return true;
}

/* The value of integer field `field` of element `e`: null leaves the default. */
static bool jscan_int_field(jscan_t *s, const jscan_int_t *field, jscan_elem_t *e, int i,
                            unsigned *set) {
  if (jscan_word(s, "null", 4))
    return true;
  int64_t v;
  if (!jscan_int(s, &v) || v < field->min || v > field->max)
    return false;
  e->ints[i] = v;
  *set |= 1u << i;
  return true;
}

/* The kept text of element `e`: copied, with a NUL, into the body's texts. */
static bool jscan_text_field(jscan_t *s, jscan_elem_t *e, size_t max_text, jscan_body_t *out) {
  const unsigned char *start = s->p;
  if (!jscan_value(s, 0))
    return false;
  e->text_len = (size_t)(s->p - start);
  e->text_at = out->texts.len;
  if (e->text_len > max_text)
    return false;
  jw_add_text(&out->texts, (const char *)start, e->text_len);
  jw_add_text(&out->texts, "", 1);
  return !out->texts.failed;
}

/* One element: an object of the shape's fields, each at most once. */
static bool jscan_elem(jscan_t *s, const jscan_shape_t *shape, size_t max_text, jscan_elem_t *e,
                       jscan_body_t *out) {
  unsigned seen = 0, set = 0; /* bit i: ints[i] seen, given; bit JSCAN_MAX_INTS: the text */
  const unsigned text_bit = 1u << JSCAN_MAX_INTS;
  *e = (jscan_elem_t){.text_at = SIZE_MAX};
  if (!jscan_byte(s, '{'))
    return false;
  do {
    if (jscan_key(s, shape->text)) {
      if ((seen & text_bit) || !jscan_text_field(s, e, max_text, out))
        return false;
      seen |= text_bit;
      continue;
    }
    int i = 0;
    while (shape->ints[i].name && !jscan_key(s, shape->ints[i].name))
      i++;
    if (shape->ints[i].name == NULL || (seen & (1u << i)) ||
        !jscan_int_field(s, &shape->ints[i], e, i, &set))
      return false; /* an unknown field, a repeated one or a bad value */
    seen |= 1u << i;
  } while (jscan_byte(s, ','));
  for (int i = 0; shape->ints[i].name; i++) {
    if (set & (1u << i))
      continue;
    if (shape->ints[i].required)
      return false;
    e->ints[i] = shape->ints[i].dflt;
  }
  return jscan_byte(s, '}') && (!shape->text_required || (seen & text_bit));
}

/* The elements' array: 1 to shape->max_elems objects. */
static bool jscan_elems(jscan_t *s, const jscan_shape_t *shape, size_t max_text,
                        jscan_body_t *out) {
  if (!jscan_byte(s, '['))
    return false;
  do {
    if (out->count == shape->max_elems)
      return false;
    if (out->count == out->cap) {
      size_t cap = out->cap ? out->cap * 2 : 64;
      jscan_elem_t *grown = realloc(out->elems, cap * sizeof *grown);
      if (grown == NULL)
        return false;
      out->elems = grown;
      out->cap = cap;
    }
    if (!jscan_elem(s, shape, max_text, &out->elems[out->count], out))
      return false;
    out->count++;
  } while (jscan_byte(s, ','));
  return jscan_byte(s, ']');
}

/* The top-level object: the elements' key and the extra key, each at most once. */
static bool jscan_top(jscan_t *s, const jscan_shape_t *shape, size_t max_text, jscan_body_t *out) {
  bool have_elems = false;
  if (!jscan_byte(s, '{'))
    return false;
  do {
    if (jscan_key(s, shape->array)) {
      if (have_elems || !jscan_elems(s, shape, max_text, out))
        return false;
      have_elems = true;
    } else if (shape->extra && jscan_key(s, shape->extra)) {
      const unsigned char *start = s->p;
      if (out->extra || !jscan_value(s, 0))
        return false;
      out->extra = (const char *)start;
      out->extra_len = (size_t)(s->p - start);
    } else {
      return false;
    }
  } while (jscan_byte(s, ','));
  return jscan_byte(s, '}') && s->p == s->end && have_elems;
}

bool jscan_body(const jscan_shape_t *shape, const char *text, size_t len, size_t max_text,
                jscan_body_t *out) {
  *out = (jscan_body_t){0};
  if (text == NULL)
    return false;
  jscan_t s;
  s.p = (const unsigned char *)text;
  s.end = s.p + len;
  s.nkeys = 0;
  if (!jscan_top(&s, shape, max_text, out)) {
    jscan_body_free(out);
    return false;
  }
  for (size_t i = 0; i < out->count; i++)
    if (out->elems[i].text_at != SIZE_MAX)
      out->elems[i].text = out->texts.buf + out->elems[i].text_at;
  return true;
}

void jscan_body_free(jscan_body_t *b) {
  free(b->elems);
  jw_buf_free(&b->texts);
  *b = (jscan_body_t){0};
}
