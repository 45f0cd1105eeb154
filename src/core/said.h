/*
 * said.h — an error said in a reply's headers as well as in its body.
 *
 * A reply to a HEAD has no body, so the error envelope of a refused HEAD is
 * lost on the way: a client that asks a blob's newest level with a HEAD (the
 * CLI's `--requires SCOPE/NAME`, libmuster's muster_shared_stat) could only
 * tell the status, not whether the blob expired, was deleted, never
 * uploaded, or its session closed.  So the head and every node agent also put
 * the error's code and message in two headers of such replies (docs/api.md,
 * "Errors"), and of the error replies of shared-data reads, which a client
 * may read the headers alone of too.  The wire names live here, once, for the
 * head, the agent and libmuster.  Pure code: no I/O, no allocation.
 */
#ifndef MUSTER_CORE_SAID_H
#define MUSTER_CORE_SAID_H

#include <stdbool.h>
#include <stddef.h>

#define SAID_CODE_HEADER "X-Muster-Error-Code" /* the error's wire code: shared_not_found */
#define SAID_MESSAGE_HEADER "X-Muster-Error"   /* its message, as the body says it */

/* True when an error reply to `method` on `path` (its query not included,
 * or included: only the start is looked at) carries the two headers: a HEAD,
 * or a GET of shared data (/v1/shared/...). */
bool said_in_headers(const char *method, const char *path);

/* Copies `message` into `out` (`size` bytes, > 0) as a header value: each
 * control character (a line break would end the header) becomes a space,
 * and a message too long is cut at a UTF-8 character's start.  Other bytes
 * pass as they are (the body's message is UTF-8; so is the header's). */
void said_header_value(const char *message, char *out, size_t size);

#endif /* MUSTER_CORE_SAID_H */
