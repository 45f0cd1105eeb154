/*
 * utf8.h — making text that quotes what a client sent safe to put in JSON.
 */
#ifndef MUSTER_CORE_UTF8_H
#define MUSTER_CORE_UTF8_H

/* Replaces, in place, each byte of the NUL-terminated `text` that is not part
 * of a well-formed UTF-8 sequence with '?', and returns `text`.  Well formed
 * is what JSON strings may hold (RFC 3629: no overlong form, no surrogate,
 * nothing above U+10FFFF), so that an error message quoting a client's bytes
 * (a %FF in a name, a header cut by "%.100s" inside a character) can always be
 * sent in the error envelope; jansson refuses to build a string of anything
 * else. */
char *utf8_scrub(char *text);

#endif /* MUSTER_CORE_UTF8_H */
