/*
 * test_suggest.c — unit tests of the name a mistyped word likely meant
 * (core/suggest.c), which `muster` says after an unknown command,
 * subcommand or option: a slip of the fingers is found, an abbreviation
 * that starts one name is found, and a word far from every name (or one
 * that starts several) gets no guess.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/suggest.h"

static const char *const options[] = {"queue", "priority", "delay-ms", "key",
                                      "json",  "file",     "requires", "url",
                                      "token", "data-dir", "help",     NULL};

/* The guess for `word` among `names` ("" when there is none). */
static const char *guess(const char *word, const char *const *names) {
  static char out[64];
  suggest_t s;
  suggest_init(&s, word, strlen(word));
  for (int i = 0; names[i]; i++)
    suggest_offer(&s, names[i], strlen(names[i]));
  size_t len = 0;
  const char *best = suggest_best(&s, &len);
  snprintf(out, sizeof out, "%.*s", best ? (int)len : 0, best ? best : "");
  return out;
}

static void test_a_slip_is_found(void **state) {
  (void)state;
  assert_string_equal(guess("queu", options), "queue");   /* a letter dropped */
  assert_string_equal(guess("queuee", options), "queue"); /* one added */
  assert_string_equal(guess("jsno", options), "json");    /* neighbours swapped */
  assert_string_equal(guess("tokne", options), "token");
  assert_string_equal(guess("data-dri", options), "data-dir");
  assert_string_equal(guess("hepl", options), "help");
}

static void test_an_abbreviation_that_starts_one_name(void **state) {
  (void)state;
  assert_string_equal(guess("prio", options), "priority");
  assert_string_equal(guess("req", options), "requires");
  assert_string_equal(guess("de", options), ""); /* under 3 letters: no prefix guess */
  static const char *const two[] = {"num-samples", "num-partitions", NULL};
  assert_string_equal(guess("num", two), ""); /* starts both: no guess */
  static const char *const same[] = {"session", "session", "session", "shared", NULL};
  assert_string_equal(guess("ses", same), "session"); /* one name offered per subcommand */
}

static void test_far_words_get_no_guess(void **state) {
  (void)state;
  assert_string_equal(guess("x", options), "");
  assert_string_equal(guess("color", options), "");
  assert_string_equal(guess("queue", options), ""); /* a name itself: nothing to correct */
  /* Longer words allow more edits: one per four letters. */
  static const char *const long_name[] = {"max-shared-ttl-ms", NULL};
  assert_string_equal(guess("max-shard-tl-ms", long_name), "max-shared-ttl-ms");
  assert_string_equal(guess("mx-shrd-tl-m", long_name), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_slip_is_found),
      cmocka_unit_test(test_an_abbreviation_that_starts_one_name),
      cmocka_unit_test(test_far_words_get_no_guess),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
