/*
 * knob.h — the reading of an integer setting from the environment
 * (MUSTER_BACKUP_STEP_PAGES, MUSTER_FLUSH_THREAD_US, the MUSTER_TEST_* ones
 * of the head and the agent): one rule for all of them, so that a value one
 * of them refuses is refused by every other.  The caller reads the variable
 * and says what it does with a refused value; this only reads the text.
 */
#ifndef MUSTER_CORE_KNOB_H
#define MUSTER_CORE_KNOB_H

#include <stdbool.h>

/*
 * Reads `text` as a whole decimal integer from `lo` to `hi` (0 <= lo <= hi):
 * digits alone, no sign, space or other base, so that a mistyped value
 * (" 7", "+7", "7ms", "0x10", one too large for a long long) is refused,
 * not read in part.  True with *out set; false, *out untouched, for NULL,
 * "" or anything else.
 */
bool knob_int(const char *text, long long lo, long long hi, long long *out);

#endif
