/*
 * reply_budget.c — the most bytes of stored payloads that one reply carries
 * (reply_budget.h).  One value for the whole process, set before the head
 * serves and only read after.
 */
#include "reply_budget.h"
#include "core/knob.h"
#include "log.h"

#include <stdlib.h>

static size_t reply_budget_bytes = REPLY_BUDGET_DEFAULT;

size_t reply_budget(void) {
  return reply_budget_bytes;
}

void reply_budget_init(void) {
  const char *text = getenv("MUSTER_TEST_REPLY_BUDGET");
  if (text == NULL || text[0] == '\0')
    return;
  long long n;
  if (!knob_int(text, 1, (long long)REPLY_BUDGET_DEFAULT, &n)) {
    log_msg(LOG_WARN,
            "MUSTER_TEST_REPLY_BUDGET=%.20s is not 1 to %zu; a reply carries up to %zu bytes of "
            "payloads",
            text, REPLY_BUDGET_DEFAULT, REPLY_BUDGET_DEFAULT);
    return;
  }
  reply_budget_bytes = (size_t)n;
  log_msg(LOG_WARN,
          "MUSTER_TEST_REPLY_BUDGET=%zu: a reply carries up to %zu bytes of payloads "
          "(for tests only)",
          reply_budget_bytes, reply_budget_bytes);
}
