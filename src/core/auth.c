/*
 * auth.c — bearer tokens compared, and what a refused token is told (auth.h).
 */
#include "core/auth.h"

#include <stddef.h>
#include <string.h>
#include <strings.h>

bool auth_token_equal(const char *given, const char *want) {
  size_t glen = strlen(given), wlen = strlen(want);
  unsigned char diff = glen != wlen;
  for (size_t i = 0; i < wlen; i++)
    diff |= (unsigned char)(want[i] ^ (i < glen ? given[i] : 0));
  return diff == 0;
}

bool auth_bearer_is(const char *authorization, const char *want) {
  return authorization != NULL && strncasecmp(authorization, "Bearer ", 7) == 0 &&
         auth_token_equal(authorization + 7, want);
}

const char *auth_refusal(const char *authorization) {
  if (authorization == NULL)
    return "no token sent: send 'Authorization: Bearer TOKEN'; the admin token is in the "
           "head's data dir (file 'token')";
  if (strncasecmp(authorization, "Bearer ", 7) != 0)
    return "the Authorization header is not of the form 'Bearer TOKEN'; the admin token is in "
           "the head's data dir (file 'token')";
  return "the token sent is not valid for this head (neither its admin nor its read-only "
         "token): use the one in this head's data dir (file 'token'); a head with another data "
         "dir has another token";
}
