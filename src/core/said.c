/*
 * said.c — an error said in a reply's headers (said.h).
 */
#include "core/said.h"

#include <string.h>

bool said_in_headers(const char *method, const char *path) {
  if (method == NULL || path == NULL)
    return false;
  return strcmp(method, "HEAD") == 0 ||
         (strcmp(method, "GET") == 0 && strncmp(path, "/v1/shared/", 11) == 0);
}

void said_header_value(const char *message, char *out, size_t size) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)message; *p && n + 1 < size; p++)
    out[n++] = *p < 0x20 || *p == 0x7f ? ' ' : (char)*p;
  /* Cut short: no half of a character at the end (its continuation bytes
   * are 10xxxxxx; a lead byte whose character did not fit goes too). */
  if (message[n] != '\0') {
    while (n > 0 && ((unsigned char)out[n - 1] & 0xc0) == 0x80)
      n--;
    if (n > 0 && ((unsigned char)out[n - 1] & 0x80))
      n--;
  }
  out[n] = '\0';
}
