/*
 * url.h — whether a URL names a muster head.
 *
 * Every program that is given a head's address (the CLI's --url, the node
 * agent's --join) checks it the same way before any request, so that a URL
 * ending in /v1 or without a scheme is refused with its reason instead of
 * failing later as a 404 or a request to the wrong host.  Pure code: no I/O.
 */
#ifndef MUSTER_CORE_URL_H
#define MUSTER_CORE_URL_H

/*
 * NULL when `url` names a head: http:// or https://, a host, an optional
 * port, and no path but an optional '/' or a proxy's prefix that does not end
 * in /v1, and no query or fragment.  Otherwise a static sentence saying what
 * is wrong with it ("it must start with http:// or https://").
 */
const char *url_head_problem(const char *url);

#endif
