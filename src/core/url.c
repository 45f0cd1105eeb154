/*
 * url.c — whether a URL names a muster head (see url.h).
 *
 * The check is deliberately shallow: it parses the scheme and the authority
 * and looks at the path only for the one mistake people make (pasting the API
 * root, ".../v1").  Whether a head answers there is for the first request.
 */
#include "core/url.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* NULL when [port, end) is empty or ":N" with N in 1..65535. */
static const char *url_port_problem(const char *port, const char *end) {
  if (*port != ':')
    return port == end ? NULL : "it names no host";
  size_t digits = strspn(port + 1, "0123456789");
  long number = digits > 0 && digits <= 5 ? atol(port + 1) : 0;
  if (number < 1 || number > 65535 || port + 1 + digits != end)
    return "its port must be a number from 1 to 65535";
  return NULL;
}

const char *url_head_problem(const char *url) {
  const char *rest;
  if (strncasecmp(url, "http://", 7) == 0)
    rest = url + 7;
  else if (strncasecmp(url, "https://", 8) == 0)
    rest = url + 8;
  else
    return "it must start with http:// or https://";
  const char *end = rest + strcspn(rest, "/?#"); /* the authority is [rest, end) */
  const char *host = rest, *at = memchr(rest, '@', (size_t)(end - rest)), *port;
  if (at)
    host = at + 1;
  if (host[0] == '[') { /* an IPv6 literal */
    const char *close = memchr(host, ']', (size_t)(end - host));
    if (close == NULL || close == host + 1)
      return "it names no host";
    port = close + 1;
  } else {
    port = host + strcspn(host, ":/?#");
    if (port == host)
      return "it names no host";
  }
  const char *problem = url_port_problem(port, end);
  if (problem)
    return problem;
  const char *path = end;
  if (strpbrk(path, "?#"))
    return "it may not have a query or a fragment";
  size_t len = strlen(path);
  while (len > 0 && path[len - 1] == '/')
    len--;
  if (len >= 3 && strncmp(path + len - 3, "/v1", 3) == 0)
    return "it must not end in /v1: give the head's address alone (the commands add /v1/...)";
  return NULL;
}
