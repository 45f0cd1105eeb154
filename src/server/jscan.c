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
 * parses; the rules and the value scanner are src/core/jcanon.c, shared with
 * libmuster, which this file runs strictly (JSCAN_FLAGS: no whitespace, the
 * first token that is not canonical declines).  Nesting is limited to
 * JCANON_MAX_DEPTH, far inside jansson's 2048, and the keys of the open
 * objects to JCANON_MAX_KEYS; beyond either the scan declines, which only
 * costs the tree path.  What is left here is the bodies' shape: the keys,
 * the integer fields and their ranges, the slices kept.
 */
#include "jscan.h"

#include <stdlib.h>
#include <string.h>

#include "core/jcanon.h"

/* The head declines at the first token that is not canonical and allows no
 * whitespace: what jw_dump writes has none. */
#define JSCAN_FLAGS 0

bool jscan_canonical(const char *text, size_t len) {
  if (text == NULL)
    return false;
  jcanon_scan_t s;
  jcanon_init(&s, text, text + len, JSCAN_FLAGS);
  return jcanon_value(&s) && s.p == s.end;
}

/* ---- bodies ---- */

/* Consumes `"name":` when it is next. */
static bool jscan_key(jcanon_scan_t *s, const char *name) {
  size_t n = strlen(name);
  if ((size_t)(s->end - s->p) < n + 3 || s->p[0] != '"' || memcmp(s->p + 1, name, n) != 0 ||
      s->p[n + 1] != '"' || s->p[n + 2] != ':')
    return false;
  s->p += n + 3;
  return true;
}

/* The value of integer field `field` of element `e`: null leaves the default. */
static bool jscan_int_field(jcanon_scan_t *s, const jscan_int_t *field, jscan_elem_t *e, int i,
                            unsigned *set) {
  if (jcanon_word(s, "null", 4))
    return true;
  int64_t v;
  if (!jcanon_int(&s->p, s->end, &v) || v < field->min || v > field->max)
    return false;
  e->ints[i] = v;
  *set |= 1u << i;
  return true;
}

/* The kept text of element `e`: copied, with a NUL, into the body's texts. */
static bool jscan_text_field(jcanon_scan_t *s, jscan_elem_t *e, size_t max_text,
                             jscan_body_t *out) {
  const unsigned char *start = s->p;
  if (!jcanon_value(s))
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
static bool jscan_elem(jcanon_scan_t *s, const jscan_shape_t *shape, size_t max_text,
                       jscan_elem_t *e, jscan_body_t *out) {
  unsigned seen = 0, set = 0; /* bit i: ints[i] seen, given; bit JSCAN_MAX_INTS: the text */
  const unsigned text_bit = 1u << JSCAN_MAX_INTS;
  *e = (jscan_elem_t){.text_at = SIZE_MAX};
  if (!jcanon_byte(s, '{'))
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
  } while (jcanon_byte(s, ','));
  for (int i = 0; shape->ints[i].name; i++) {
    if (set & (1u << i))
      continue;
    if (shape->ints[i].required)
      return false;
    e->ints[i] = shape->ints[i].dflt;
  }
  return jcanon_byte(s, '}') && (!shape->text_required || (seen & text_bit));
}

/* The elements' array: 1 to shape->max_elems objects. */
static bool jscan_elems(jcanon_scan_t *s, const jscan_shape_t *shape, size_t max_text,
                        jscan_body_t *out) {
  if (!jcanon_byte(s, '['))
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
  } while (jcanon_byte(s, ','));
  return jcanon_byte(s, ']');
}

/* The top-level object: the elements' key and the extra key, each at most once. */
static bool jscan_top(jcanon_scan_t *s, const jscan_shape_t *shape, size_t max_text,
                      jscan_body_t *out) {
  bool have_elems = false;
  if (!jcanon_byte(s, '{'))
    return false;
  do {
    if (jscan_key(s, shape->array)) {
      if (have_elems || !jscan_elems(s, shape, max_text, out))
        return false;
      have_elems = true;
    } else if (shape->extra && jscan_key(s, shape->extra)) {
      const unsigned char *start = s->p;
      if (out->extra || !jcanon_value(s))
        return false;
      out->extra = (const char *)start;
      out->extra_len = (size_t)(s->p - start);
    } else {
      return false;
    }
  } while (jcanon_byte(s, ','));
  return jcanon_byte(s, '}') && s->p == s->end && have_elems;
}

bool jscan_body(const jscan_shape_t *shape, const char *text, size_t len, size_t max_text,
                jscan_body_t *out) {
  *out = (jscan_body_t){0};
  if (text == NULL)
    return false;
  jcanon_scan_t s;
  jcanon_init(&s, text, text + len, JSCAN_FLAGS);
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
