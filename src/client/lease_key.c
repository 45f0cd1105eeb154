/*
 * lease_key.c — lease requests with a key: muster_lease_opts_t, the calls
 * that take it (muster_lease_with, muster_complete_lease_with) and the key's
 * check and form (docs/api.md, "Retrying a lease"; docs/client.md, the same).
 *
 * A key makes a lease request sent again after its reply was lost get back
 * the leases its first try made.  The head keeps it on the worker's row, so
 * it needs a worker; its characters are a name's (core/names.h).  The library
 * checks both before anything is sent, saying which rule a key breaks, so a
 * refusal by the head itself ("request: unknown field", a head older than
 * keys) is told apart from a mistake of the caller's by its first word: the
 * library's messages name the field as "opts.request".
 */
#include "client/lease_internal.h"
#include "core/names.h"

#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The characters of a key, as of a name (name_is_valid, which also refuses
 * "." and ".."). */
#define KEY_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

_Static_assert(MUSTER_LEASE_KEY_MAX == NAME_MAX_LEN, "a key is as long as a name may be");

/* The end of muster_lease_opts_t's first version: all it was published with. */
#define LEASE_OPTS_FIRST_END OPTS_END(muster_lease_opts_t, request)

void muster_lease_opts_init_sized(muster_lease_opts_t *opts, size_t size) {
  const muster_lease_opts_t defaults = {.size = sizeof defaults, .max = 1};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* True when every byte of `text` is printable ASCII (a message may show it). */
static bool key_printable(const char *text) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    if (*p < 0x20 || *p > 0x7e)
      return false;
  return true;
}

/* MUSTER_INVALID for `key`, whose byte at `at` is not one of KEY_CHARS:
 * the key and the character shown when printable, else the byte's value. */
static muster_err_t key_bad_char(muster_client_t *client, const char *key, size_t at) {
  unsigned char bad = (unsigned char)key[at];
  if (key_printable(key))
    return client_fail(client, MUSTER_INVALID,
                       "opts.request: '%s' has '%c' at position %zu: " NAME_RULE_TEXT, key, bad,
                       at + 1);
  return client_fail(client, MUSTER_INVALID,
                     "opts.request: the key has byte 0x%02x at position %zu: " NAME_RULE_TEXT, bad,
                     at + 1);
}

muster_err_t lease_key_check(muster_client_t *client, const char *key, int64_t worker) {
  if (key == NULL)
    return MUSTER_OK;
  size_t len = strlen(key), good = strspn(key, KEY_CHARS);
  if (len == 0)
    return client_fail(client, MUSTER_INVALID,
                       "opts.request: the key is empty (NULL sends none): " NAME_RULE_TEXT);
  if (len > MUSTER_LEASE_KEY_MAX)
    return client_fail(client, MUSTER_INVALID,
                       "opts.request: the key is %zu characters long: " NAME_RULE_TEXT, len);
  if (good < len)
    return key_bad_char(client, key, good);
  if (name_is_dots(key))
    return client_fail(client, MUSTER_INVALID, "opts.request: '%s': " NAME_DOTS_TEXT, key);
  if (worker <= 0)
    return client_fail(client, MUSTER_INVALID,
                       "opts.request: a key needs opts.worker, a registered worker's id: the "
                       "head keeps a request's key with the worker that sent it");
  return MUSTER_OK;
}

muster_err_t muster_lease_key(char *key, size_t size, const char *instance, uint64_t n) {
  if (key == NULL)
    return MUSTER_INVALID;
  if (size > 0)
    key[0] = '\0';
  size_t len = instance ? strlen(instance) : 0;
  if (len == 0 || strspn(instance, KEY_CHARS) != len)
    return MUSTER_INVALID;
  char made[MUSTER_LEASE_KEY_MAX + 32];
  int written = snprintf(made, sizeof made, "%s-%" PRIu64, instance, n);
  if (written < 0 || (size_t)written > MUSTER_LEASE_KEY_MAX || (size_t)written >= size)
    return MUSTER_INVALID;
  memcpy(key, made, (size_t)written + 1);
  return MUSTER_OK;
}

/* Takes the caller's `opts` over this library's defaults into *taken:
 * MUSTER_OK, or MUSTER_INVALID (message set) for NULL or one not set up. */
static muster_err_t lease_opts_take(muster_client_t *client, const muster_lease_opts_t *opts,
                                    muster_lease_opts_t *taken) {
  if (opts == NULL)
    return client_fail(client, MUSTER_INVALID,
                       "opts: the lease's options are required (muster_lease_opts_init, then "
                       "set its queue)");
  muster_lease_opts_init(taken);
  return client_opts_take(client, taken, sizeof *taken, opts, LEASE_OPTS_FIRST_END, "opts",
                          "muster_lease_opts_init");
}

/* The start of both calls: clears the caller's places for the leases (either
 * may be NULL) and takes `opts` into *taken. */
static muster_err_t lease_call_start(muster_client_t *client, const muster_lease_opts_t *opts,
                                     muster_lease_opts_t *taken, muster_lease_t **leases,
                                     size_t *count) {
  if (leases)
    *leases = NULL;
  if (count)
    *count = 0;
  if (client == NULL)
    return MUSTER_INVALID;
  return lease_opts_take(client, opts, taken);
}

muster_err_t muster_lease_with(muster_client_t *client, const muster_lease_opts_t *opts,
                               muster_lease_t **leases, size_t *count) {
  muster_lease_opts_t taken;
  muster_err_t err = lease_call_start(client, opts, &taken, leases, count);
  if (err != MUSTER_OK)
    return err;
  if (taken.queue == NULL)
    return client_fail(client, MUSTER_INVALID, "opts.queue: the queue to lease from is required");
  if (leases == NULL || count == NULL)
    return client_fail(client, MUSTER_INVALID, "places for the leases are required");
  return lease_send(client, &taken, leases, count);
}

muster_err_t muster_complete_lease_with(muster_client_t *client, const muster_ack_t *acks,
                                        size_t count, const muster_lease_opts_t *opts,
                                        int64_t updates_after, muster_lease_t **leases,
                                        size_t *nleases, char **updates) {
  if (updates)
    *updates = NULL;
  muster_lease_opts_t taken;
  muster_err_t err = lease_call_start(client, opts, &taken, leases, nleases);
  if (err != MUSTER_OK)
    return err;
  return lease_next_send(client, acks, count, &taken, updates_after, leases, nleases, updates);
}
