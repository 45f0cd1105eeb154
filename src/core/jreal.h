/*
 * jreal.h — the text of a JSON real: the shortest that reads back as the
 * same double, in the form jansson writes reals.
 *
 * jansson writes a real with "%.17g", so 0.1 comes back as
 * 0.10000000000000001: true to the double, but not the text anyone wrote.
 * The head's writer (src/server/jw.c) and libmuster's (src/client/jdump.c)
 * write reals through here instead, so a real a user sends comes back as
 * they wrote it whenever they wrote it shortest, and any other text of it
 * comes back shortest; the double read back is always the one sent.
 *
 * The form is jansson's, which readers of our text already know: a '.' or
 * an exponent always (1.0, never 1, which would read back as an integer),
 * the exponent without '+' or leading zeros (1e300, 2.5e-7), '.' as the
 * decimal point whatever the locale.  NaN and the infinities are not JSON;
 * jansson never holds them (json_real refuses them) and nothing here
 * writes them.  No I/O, no allocation.
 */
#ifndef MUSTER_CORE_JREAL_H
#define MUSTER_CORE_JREAL_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes jreal_format may write, its NUL included: the longest text is 24
 * bytes ("-2.2250738585072014e-308"). */
#define JREAL_MAX 32

/* Writes the shortest text among "%.15g", "%.16g" and "%.17g" of `v` that
 * strtod reads back as `v` (for a subnormal, whose precision is less, the
 * shortest of "%.1g" to "%.17g"), in jansson's form, NUL-terminated into
 * `out` (JREAL_MAX bytes).  Returns its length; 0, with `out` empty, when
 * `v` is NaN or infinite. */
size_t jreal_format(double v, char *out);

/* True when the `len` bytes at `text` are exactly what jreal_format writes
 * for the double strtod reads from them: a real whose text our writers keep
 * as it stands.  False for every other number text ("0.10", "1E5", "1",
 * "1e400"). */
bool jreal_canonical(const char *text, size_t len);

#endif
