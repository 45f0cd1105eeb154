/*
 * auth.h — bearer tokens compared, and what a refused token is told.
 *
 * The head checks a request's token in its routes (server/http.c); a node
 * agent checks it for what it answers itself (node/port.c, the node-local
 * iterations), and its cache refuses it for the head when the head's own
 * words cannot be had (node/cache_http.c: the head's answer to a HEAD has no
 * body).  All compare and say the same things through these functions.
 * Pure code: no I/O.
 */
#ifndef MUSTER_CORE_AUTH_H
#define MUSTER_CORE_AUTH_H

#include <stdbool.h>

/*
 * True when token `given` is `want`.  Compared in constant time: every byte
 * of `want` is looked at whatever `given` holds, so that how long the answer
 * takes tells nothing of how much of `want` a guess got right.
 */
bool auth_token_equal(const char *given, const char *want);

/*
 * True when `authorization`, a request's Authorization header (NULL: none),
 * is "Bearer TOKEN" (the scheme in any case) with TOKEN equal to `want`
 * (auth_token_equal).
 */
bool auth_bearer_is(const char *authorization, const char *want);

/*
 * The message of a 401 for a request whose Authorization header is
 * `authorization` (NULL: none sent): no token sent, a header that is not
 * "Bearer TOKEN", or a token the head does not know.  A static sentence.
 */
const char *auth_refusal(const char *authorization);

#endif
