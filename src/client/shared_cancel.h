/*
 * shared_cancel.h — a shared-data download that another thread can end, for
 * muster's own programs (the node agent's cache fetches, ended when the agent
 * stops); not part of libmuster's public interface (muster.h).
 *
 * A download that receives bytes ends at its next write when its sink fails,
 * but one whose server sends nothing (a stalled head) sits in poll(2) until
 * the handle's timeout.  A cancel ends either at once: the transfer's
 * connection is shut down, which wakes the poll, and a transfer that has not
 * connected yet never does.  libcurl's progress callback checks the flag too,
 * about once a second, for a connection not yet made or a name still being
 * resolved.
 */
#ifndef MUSTER_CLIENT_SHARED_CANCEL_H
#define MUSTER_CLIENT_SHARED_CANCEL_H

#include "muster.h"

/* The cancel of one download at a time (opaque, thread-safe). */
typedef struct shared_cancel shared_cancel_t;

/* A cancel not fired (shared_cancel_free), or NULL when memory ran out. */
shared_cancel_t *shared_cancel_new(void);
/* Frees `c` (no download may use it any more); accepts NULL. */
void shared_cancel_free(shared_cancel_t *c);
/* Ends the download using `c`, now or when it starts; from any thread,
 * any number of times. */
void shared_cancel_fire(shared_cancel_t *c);

/*
 * muster_shared_get_fd that `cancel` (may be NULL: none) can end from another
 * thread; a cancelled download fails with MUSTER_NETWORK and a message that
 * says it was cancelled.  `cancel` must outlive the call.
 */
muster_err_t shared_get_fd_cancellable(muster_client_t *client, const char *scope, const char *name,
                                       int fd, const muster_shared_opts_t *opts,
                                       muster_shared_info_t *info, shared_cancel_t *cancel);

#endif /* MUSTER_CLIENT_SHARED_CANCEL_H */
