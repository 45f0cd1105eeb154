/*
 * auth.c — what a refused token is told (auth.h).
 */
#include "core/auth.h"

#include <stddef.h>
#include <strings.h>

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
