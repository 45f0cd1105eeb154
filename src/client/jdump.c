/*
 * jdump.c — JSON text from jansson trees (jdump.h).
 *
 * The workload: replies re-written for a caller, request bodies the CLI and
 * the agent build, lines the CLI prints; small trees, off any hot path (the
 * hot ones are written as text by jtext and jw).  The layout follows
 * jansson's dump.c exactly, so that the bytes match it: a container's first
 * member and its closing bracket each after an indentation, members joined
 * by "," and an indentation (a newline and depth * n spaces with
 * JSON_INDENT(n), else one space unless JSON_COMPACT), an empty container
 * as "[]" or "{}".  Strings and integers are jtext's writers, which follow
 * jansson's; reals are jreal's shortest text.  Recursion follows the tree's
 * depth, which jansson's parser bounds at 2048.
 */
#include "client/jdump.h"

#include <assert.h>
#include <stdlib.h>

/* The break before a member or a closing bracket at `depth`; `between`:
 * after a ',' (where the spaced form writes one space). */
static void jdump_indent(jtext_buf_t *b, size_t flags, size_t depth, bool between) {
  static const char spaces[] = "                                ";
  size_t width = flags & JSON_MAX_INDENT;
  if (width == 0) {
    if (between && !(flags & JSON_COMPACT))
      JTEXT_ADD_LITERAL(b, " ");
    return;
  }
  JTEXT_ADD_LITERAL(b, "\n");
  for (size_t n = depth * width; n > 0;) {
    size_t run = n < sizeof spaces - 1 ? n : sizeof spaces - 1;
    jtext_add(b, spaces, run);
    n -= run;
  }
}

static bool jdump_value(jtext_buf_t *b, const json_t *v, size_t flags, size_t depth);

static bool jdump_array(jtext_buf_t *b, const json_t *v, size_t flags, size_t depth) {
  size_t n = json_array_size(v);
  JTEXT_ADD_LITERAL(b, "[");
  if (n == 0) {
    JTEXT_ADD_LITERAL(b, "]");
    return true;
  }
  jdump_indent(b, flags, depth + 1, false);
  for (size_t i = 0; i < n; i++) {
    if (!jdump_value(b, json_array_get(v, i), flags, depth + 1))
      return false;
    if (i + 1 < n) {
      JTEXT_ADD_LITERAL(b, ",");
      jdump_indent(b, flags, depth + 1, true);
    } else {
      jdump_indent(b, flags, depth, false);
    }
  }
  JTEXT_ADD_LITERAL(b, "]");
  return true;
}

static bool jdump_object(jtext_buf_t *b, const json_t *v, size_t flags, size_t depth) {
  json_t *object = (json_t *)v; /* jansson's iterator takes no const */
  void *it = json_object_iter(object);
  JTEXT_ADD_LITERAL(b, "{");
  if (it == NULL) {
    JTEXT_ADD_LITERAL(b, "}");
    return true;
  }
  jdump_indent(b, flags, depth + 1, false);
  while (it != NULL) {
    void *next = json_object_iter_next(object, it);
    if (!jtext_add_stringn(b, json_object_iter_key(it), json_object_iter_key_len(it)))
      return false; /* not UTF-8: only a key set with json_object_setn_nocheck */
    if (flags & JSON_COMPACT)
      JTEXT_ADD_LITERAL(b, ":");
    else
      JTEXT_ADD_LITERAL(b, ": ");
    if (!jdump_value(b, json_object_iter_value(it), flags, depth + 1))
      return false;
    if (next != NULL) {
      JTEXT_ADD_LITERAL(b, ",");
      jdump_indent(b, flags, depth + 1, true);
    } else {
      jdump_indent(b, flags, depth, false);
    }
    it = next;
  }
  JTEXT_ADD_LITERAL(b, "}");
  return true;
}

/* Writes `v`, a member at `depth` (0: the whole value). */
static bool jdump_value(jtext_buf_t *b, const json_t *v, size_t flags, size_t depth) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return jdump_object(b, v, flags, depth);
  case JSON_ARRAY:
    return jdump_array(b, v, flags, depth);
  case JSON_STRING:
    /* False only for a string made with json_stringn_nocheck from bad
     * UTF-8, which json_dumps refuses too. */
    return jtext_add_stringn(b, json_string_value(v), json_string_length(v));
  case JSON_INTEGER:
    jtext_add_int(b, (int64_t)json_integer_value(v));
    return true;
  case JSON_REAL:
    return jtext_add_real(b, json_real_value(v));
  case JSON_TRUE:
    JTEXT_ADD_LITERAL(b, "true");
    return true;
  case JSON_FALSE:
    JTEXT_ADD_LITERAL(b, "false");
    return true;
  case JSON_NULL:
    JTEXT_ADD_LITERAL(b, "null");
    return true;
  }
  return false;
}

bool jdump_add(jtext_buf_t *b, const json_t *v, size_t flags) {
  assert((flags & ~(size_t)JDUMP_FLAGS_KNOWN) == 0);
  return jdump_value(b, v, flags, 0);
}

char *jdump(const json_t *v, size_t flags) {
  if (v == NULL)
    return NULL;
  jtext_buf_t b = {0};
  /* Every value writes at least one byte, so b.data is set unless failed. */
  if (!jdump_add(&b, v, flags) || b.failed) {
    jtext_buf_free(&b);
    return NULL;
  }
  return b.data;
}
