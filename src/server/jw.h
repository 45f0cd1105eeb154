/*
 * jw.h — compact JSON text from jansson values (the head's replies and stored
 * payloads): the text json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) gives,
 * written several times faster.
 */
#ifndef MUSTER_SERVER_JW_H
#define MUSTER_SERVER_JW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Encodes any JSON value; caller frees.  *len (may be NULL) gets the length
 * without the terminating NUL.  NULL when `v` is NULL or memory runs out. */
char *jw_dump(const json_t *v, size_t *len);

#endif
