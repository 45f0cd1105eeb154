/*
 * reply_budget.c — the most bytes of stored payloads that one reply carries
 * (reply_budget.h).  One value for the whole process, set before the head
 * serves and only read after.
 */
#include "reply_budget.h"
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
  char *end;
  unsigned long long n = strtoull(text, &end, 10);
  if (*end != '\0' || text[0] == '-' || n < 1 || n > REPLY_BUDGET_DEFAULT) {
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
