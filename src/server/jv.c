/*
 * jv.c — JSON field validation for request bodies, and the stored JSON
 * texts (payloads, results, update data) as replies carry them.
 */
#include "jv.h"
#include "jw.h"
#include "core/names.h"
#include "core/suggest.h"

#include <stdio.h>
#include <string.h>

static const char *dot(const char *ctx) {
  return ctx[0] ? "." : "";
}

muster_err_t jv_int(const json_t *obj, const char *key, const char *ctx, int64_t dflt, int64_t min,
                    int64_t max, int64_t *out, fail_t *f) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL || json_is_null(v)) {
    *out = dflt;
    return MUSTER_OK;
  }
  if (!json_is_integer(v))
    return fail_set(f, MUSTER_INVALID, "%s%s%s: expected an integer", ctx, dot(ctx), key);
  json_int_t n = json_integer_value(v);
  char range[64];
  if (n < min || n > max)
    return fail_set(f, MUSTER_INVALID, "%s%s%s: %lld is out of range; it must be %s", ctx, dot(ctx),
                    key, (long long)n, fail_range(range, sizeof range, n, min, max));
  *out = n;
  return MUSTER_OK;
}

muster_err_t jv_str(const json_t *obj, const char *key, const char *ctx, const char *dflt,
                    size_t max_len, const char **out, fail_t *f) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL || json_is_null(v)) {
    *out = dflt;
    return MUSTER_OK;
  }
  if (!json_is_string(v))
    return fail_set(f, MUSTER_INVALID, "%s%s%s: expected a string", ctx, dot(ctx), key);
  size_t len = json_string_length(v);
  if (len > max_len)
    return fail_set(f, MUSTER_INVALID, "%s%s%s: longer than %zu bytes", ctx, dot(ctx), key,
                    max_len);
  if (strlen(json_string_value(v)) != len)
    return fail_set(f, MUSTER_INVALID, "%s%s%s: contains a NUL character", ctx, dot(ctx), key);
  *out = json_string_value(v);
  return MUSTER_OK;
}

muster_err_t jv_name(const json_t *obj, const char *key, const char *ctx, const char **out,
                     fail_t *f) {
  if (jv_str(obj, key, ctx, NULL, NAME_MAX_LEN * 4, out, f) || *out == NULL || name_is_valid(*out))
    return f->code;
  return fail_set(f, MUSTER_INVALID, "%s%s%s: '%.140s' is invalid: %s", ctx, dot(ctx), key, *out,
                  name_rule_text(*out));
}

muster_err_t jv_bool(const json_t *obj, const char *key, const char *ctx, bool dflt, bool *out,
                     fail_t *f) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL || json_is_null(v)) {
    *out = dflt;
    return MUSTER_OK;
  }
  if (!json_is_boolean(v))
    return fail_set(f, MUSTER_INVALID, "%s%s%s: expected true or false", ctx, dot(ctx), key);
  *out = json_is_true(v);
  return MUSTER_OK;
}

/* Appends the names of a NULL-terminated list to buf (at `*used`), comma
 * separated, while they fit whole; the rest become ", ...". */
static void list_names(char *buf, size_t size, size_t *used, const char *const *names) {
  for (const char *const *n = names; n && *n; n++) {
    const char *sep = *used ? ", " : "";
    size_t need = strlen(sep) + strlen(*n);
    if (*used + need + sizeof ", ..." > size) {
      snprintf(buf + *used, size - *used, "%s", ", ...");
      *used += strlen(buf + *used);
      return;
    }
    *used += (size_t)snprintf(buf + *used, size - *used, "%s%s", sep, *n);
  }
}

static void offer_names(suggest_t *s, const char *const *names) {
  for (const char *const *n = names; n && *n; n++)
    suggest_offer(s, *n, strlen(*n));
}

muster_err_t jv_fail_unknown(fail_t *f, const char *ctx, const char *key,
                             const char *const *allowed, const char *const *more) {
  suggest_t s;
  suggest_init(&s, key, strlen(key));
  offer_names(&s, allowed);
  offer_names(&s, more);
  size_t best_len;
  const char *best = suggest_best(&s, &best_len);
  char guess[96] = "", names[320] = "";
  if (best)
    snprintf(guess, sizeof guess, " (did you mean '%.*s'?)", (int)best_len, best);
  size_t used = 0;
  list_names(names, sizeof names, &used, allowed);
  list_names(names, sizeof names, &used, more);
  return fail_set(f, MUSTER_INVALID, "%s%s%.100s: unknown field%s; known fields: %s", ctx, dot(ctx),
                  key, guess, names);
}

muster_err_t jv_only(const json_t *obj, const char *ctx, const char *const *allowed, fail_t *f) {
  const char *key;
  const json_t *value;
  json_object_foreach((json_t *)obj, key, value) {
    bool known = false;
    for (const char *const *a = allowed; *a && !known; a++)
      known = strcmp(*a, key) == 0;
    if (!known)
      return jv_fail_unknown(f, ctx, key, allowed, NULL);
  }
  return MUSTER_OK;
}

muster_err_t jv_batch(const json_t *obj, const char *key, size_t max, json_t **out, fail_t *f) {
  json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return fail_set(f, MUSTER_INVALID, "%s: missing (expected an array)", key);
  if (!json_is_array(v))
    return fail_set(f, MUSTER_INVALID, "%s: expected an array", key);
  size_t n = json_array_size(v);
  if (n == 0)
    return fail_set(f, MUSTER_INVALID, "%s: empty (expected 1 to %zu elements)", key, max);
  if (n > max)
    return fail_set(f, MUSTER_BATCH_TOO_LARGE, "%s: %zu elements, at most %zu allowed", key, n,
                    max);
  for (size_t i = 0; i < n; i++)
    if (!json_is_object(json_array_get(v, i)))
      return fail_set(f, MUSTER_INVALID, "%s[%zu]: expected an object", key, i);
  *out = v;
  return MUSTER_OK;
}

char *jv_encode(const json_t *value) {
  return jw_dump(value, NULL);
}

muster_err_t jv_payload_fits(const char *text, size_t max, const char *ctx, const char *key,
                             fail_t *f) {
  size_t len = text ? strlen(text) : 0;
  if (len <= max)
    return MUSTER_OK;
  return fail_set(f, MUSTER_PAYLOAD_TOO_LARGE,
                  "%s%s%s: %zu bytes as JSON text, at most %zu allowed (a string counts with "
                  "its quotes and escapes; the head's --max-payload sets the limit)",
                  ctx, ctx[0] ? "." : "", key, len, max);
}

json_t *jv_decode(const char *text) {
  if (text == NULL)
    return json_null();
  json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  return v ? v : json_string(text);
}

bool jv_add_stored(jw_buf_t *out, const char *text, size_t len) {
  if (text == NULL) {
    JW_ADD_LITERAL(out, "null");
    return true;
  }
  if (jw_valid(text, len)) {
    jw_add_text(out, text, len);
    return true;
  }
  /* jw_valid takes all jansson reads; should they ever differ on some
   * text, jv_decode reads it as the tree path did. */
  json_t *decoded = jv_decode(text); /* else a JSON string of the text; NULL: not UTF-8 */
  if (decoded)
    jw_add_value(out, decoded);
  else
    JW_ADD_LITERAL(out, "null");
  json_decref(decoded);
  return decoded != NULL;
}

json_t *jv_stored(const char *text, size_t len) {
  jw_buf_t b = {0};
  jv_add_stored(&b, text, len);
  json_t *raw = b.failed ? NULL : jw_raw(b.buf, b.len);
  jw_buf_free(&b);
  return raw;
}
