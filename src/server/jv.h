/*
 * jv.h — validation of JSON request fields with messages that name the field.
 *
 * Every getter takes the object, the key, and a context prefix ("tasks[3]" or
 * "") used to name the field in errors: "tasks[3].priority: expected an
 * integer".  A missing or null field yields the default.  All return MUSTER_OK
 * or MUSTER_INVALID with *f filled.
 */
#ifndef MUSTER_SERVER_JV_H
#define MUSTER_SERVER_JV_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "fail.h"
#include "jw.h"

/* Ids (tasks, tokens, workers) are positive integers below 2^53, so that
 * every JSON implementation holds them exactly. */
#define JV_ID_MAX ((1LL << 53) - 1)

muster_err_t jv_int(const json_t *obj, const char *key, const char *ctx, int64_t dflt, int64_t min,
                    int64_t max, int64_t *out, fail_t *f);
/* *out points into the object (valid while it lives) or is `dflt`. */
muster_err_t jv_str(const json_t *obj, const char *key, const char *ctx, const char *dflt,
                    size_t max_len, const char **out, fail_t *f);
muster_err_t jv_bool(const json_t *obj, const char *key, const char *ctx, bool dflt, bool *out,
                     fail_t *f);
/* An optional string that must be a name (core/names.h: 1 to NAME_MAX_LEN of
 * [A-Za-z0-9._-], not "." or ".."), such as a process's instance id; *out
 * NULL when absent. */
muster_err_t jv_name(const json_t *obj, const char *key, const char *ctx, const char **out,
                     fail_t *f);
/* Refuses keys not in the NULL-terminated `allowed` list (jv_fail_unknown). */
muster_err_t jv_only(const json_t *obj, const char *ctx, const char *const *allowed, fail_t *f);
/* Fails for `key`, a field the body may not have: the message names it, the
 * accepted field it likely meant (core/suggest.h), and the accepted fields
 * (`allowed`, then `more`: NULL-terminated lists; `more` may be NULL). */
muster_err_t jv_fail_unknown(fail_t *f, const char *ctx, const char *key,
                             const char *const *allowed, const char *const *more);
/* The array at `key` with 1..max elements; MUSTER_BATCH_TOO_LARGE above max. */
muster_err_t jv_batch(const json_t *obj, const char *key, size_t max, json_t **out, fail_t *f);

/* Encodes any JSON value compactly (strings too); caller frees.  NULL on OOM. */
char *jv_encode(const json_t *value);
/* MUSTER_OK when `text`, a value as jv_encode wrote it, is at most `max`
 * bytes (the head's --max-payload); else MUSTER_PAYLOAD_TOO_LARGE, the message
 * naming `ctx`.`key` (`key` alone when ctx is "") and saying that the bytes
 * are the JSON text's, which a string exceeds by its quotes and escapes: a
 * payload of exactly `max` characters is refused, and its sender must hear
 * why the figure is not the one it counted. */
muster_err_t jv_payload_fits(const char *text, size_t max, const char *ctx, const char *key,
                             fail_t *f);
/* Decodes text stored by jv_encode; never NULL: bad text becomes a JSON string. */
json_t *jv_decode(const char *text);

/* Appends stored JSON text `text` (`len` bytes; NULL reads as null) to `out`
 * as a reply carries it, without decoding it: verbatim when it is one JSON
 * value (jw_valid), as every text the head stores is (jw_dump wrote it, or
 * jscan proved it is what jw_dump writes, so the bytes are those jw_dump of
 * jv_decode's tree gives); otherwise as jv_decode reads it, a JSON string of
 * the text.  Returns false, having written null, when the text is not UTF-8
 * either, which a tree could not hold (only a row changed behind the head's
 * back is either). */
bool jv_add_stored(jw_buf_t *out, const char *text, size_t len);
/* The value of stored JSON text `text` (`len` bytes; NULL: null) for a reply
 * tree: a raw node (jw.h) of what jv_add_stored writes (new reference), NULL
 * when memory ran out. */
json_t *jv_stored(const char *text, size_t len);

#endif
