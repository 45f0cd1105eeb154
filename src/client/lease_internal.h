/*
 * lease_internal.h — what lease.c (the requests that lease, and the reply
 * readers) and lease_key.c (muster_lease_opts_t, the request key and the
 * calls that take them) share; not part of libmuster's public interface.
 *
 * Every lease request of the library goes through lease_send or
 * lease_next_send with a whole muster_lease_opts_t of this library's: the
 * calls without a key (muster_lease, muster_complete_lease) fill one with
 * their arguments, the calls with one take the caller's (opts_take).  So
 * both check and send a request the same way, and a key is checked where
 * the body is written.
 */
#ifndef MUSTER_CLIENT_LEASE_INTERNAL_H
#define MUSTER_CLIENT_LEASE_INTERNAL_H

#include "client/client_internal.h"

/* MUSTER_OK when `key` may be sent as the key of a lease request by
 * `worker`: NULL (no key), or 1 to MUSTER_LEASE_KEY_MAX characters of
 * [A-Za-z0-9._-], not "." or "..", with a worker above 0, as the head
 * checks it.  Otherwise
 * MUSTER_INVALID, the message saying which rule the key breaks. */
muster_err_t lease_key_check(muster_client_t *client, const char *key, int64_t worker);

/*
 * Sends the lease request `o` (this library's whole struct; its queue,
 * `leases` and `count` not NULL, the outputs already reset) and reads its
 * reply into *leases / *count.  The worker, wait_ms and key are checked
 * first: MUSTER_INVALID with the message set, nothing sent.
 */
muster_err_t lease_send(muster_client_t *client, const muster_lease_opts_t *o,
                        muster_lease_t **leases, size_t *count);

/*
 * Completes `acks` and leases per `o` in one request (muster_complete_lease,
 * the outputs already reset, `client` not NULL); o->wait_ms is not read.  The
 * arguments are checked first: MUSTER_INVALID with the message set, nothing
 * sent.
 */
muster_err_t lease_next_send(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             const muster_lease_opts_t *o, int64_t updates_after,
                             muster_lease_t **leases, size_t *nleases, char **updates);

#endif
