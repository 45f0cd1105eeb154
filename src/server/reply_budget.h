/*
 * reply_budget.h — the most bytes of stored payloads that one reply carries.
 *
 * A page of tasks, of session results or of updates, and a batch of leases,
 * hold up to 1000 items, each with a payload (a result, an update's data) of
 * up to --max-payload bytes: without a bound on their sum, one request made
 * the head build gigabytes at once (1000 payloads of 2 MiB), and a few such
 * requests could take its memory.  Such a reply stops adding items once the
 * next one's payloads would take their sum past the budget, but never before
 * its first item (a payload larger than the budget still goes, alone), and
 * says that more follow as it does when it is full (docs/api.md).  The sizes
 * are those of the stored JSON texts (sqlite3_column_bytes of the row being
 * read), known before anything is decoded or written.
 *
 * 16 MiB: sixteen payloads at the default --max-payload of 1 MiB, so a page
 * of large payloads moves enough bytes that the request it costs is lost in
 * their transfer, while a head serving many such clients at once holds a
 * sixteenth of what a reply of 256 such items would hold.
 */
#ifndef MUSTER_SERVER_REPLY_BUDGET_H
#define MUSTER_SERVER_REPLY_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

#define REPLY_BUDGET_DEFAULT ((size_t)16 << 20)

/* The budget in bytes: REPLY_BUDGET_DEFAULT, or what MUSTER_TEST_REPLY_BUDGET
 * set at reply_budget_init. */
size_t reply_budget(void);

/* Takes MUSTER_TEST_REPLY_BUDGET (bytes, 1 to REPLY_BUDGET_DEFAULT) as the
 * budget, for tests only: a small one makes a test's replies short without
 * megabytes of payloads.  A value out of that range is said and ignored.
 * Called once, before the head serves. */
void reply_budget_init(void);

/* True when an item whose payloads are `bytes` long goes into a reply that
 * holds `items` items with `used` bytes of payloads so far: always the first,
 * then while the sum stays within the budget. */
static inline bool reply_budget_fits(size_t items, size_t used, size_t bytes) {
  return items == 0 || (used <= reply_budget() && bytes <= reply_budget() - used);
}

#endif
