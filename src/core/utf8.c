/*
 * utf8.c — utf8_scrub (utf8.h).
 */
#include "core/utf8.h"

#include <stddef.h>

/* The length of the well-formed UTF-8 sequence at `s`, or 0 when the bytes
 * there are not one (a stray continuation byte, a lead byte without its
 * continuations, an overlong form, a surrogate, a code point past U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s) {
  unsigned char c = s[0];
  size_t len;
  unsigned long cp;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07;
  } else {
    return 0; /* a continuation byte, C0/C1 (always overlong) or F5..FF */
  }
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) /* the terminating NUL stops here too */
      return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

char *utf8_scrub(char *text) {
  unsigned char *s = (unsigned char *)text;
  while (*s) {
    size_t len = utf8_sequence(s);
    if (len == 0)
      *s++ = '?';
    else
      s += len;
  }
  return text;
}
