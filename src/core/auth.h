/*
 * auth.h — what a refused token is told.
 *
 * The head refuses a request's token in its routes (server/http.c); a node
 * agent's cache refuses it for the head when the head's own words cannot be
 * had (node/cache_http.c: the head's answer to a HEAD has no body).  Both say
 * the same thing through this one function.  Pure code: no I/O.
 */
#ifndef MUSTER_CORE_AUTH_H
#define MUSTER_CORE_AUTH_H

/*
 * The message of a 401 for a request whose Authorization header is
 * `authorization` (NULL: none sent): no token sent, a header that is not
 * "Bearer TOKEN", or a token the head does not know.  A static sentence.
 */
const char *auth_refusal(const char *authorization);

#endif
