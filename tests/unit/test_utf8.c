/*
 * test_utf8.c — utf8_scrub (src/core/utf8.c): well-formed text is left as it
 * is, every byte of a malformed sequence becomes '?', and what comes out is
 * always text jansson takes as a JSON string (which error envelopes need).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/utf8.h"

static void assert_scrubs_to(const char *in, const char *want) {
  char buf[64];
  strcpy(buf, in);
  assert_string_equal(utf8_scrub(buf), want);
}

static void test_well_formed_text_is_kept(void **state) {
  (void)state;
  assert_scrubs_to("", "");
  assert_scrubs_to("queue 'q' does not exist", "queue 'q' does not exist");
  assert_scrubs_to("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80",
                   "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  assert_scrubs_to("\xEF\xBF\xBF \xF4\x8F\xBF\xBF",
                   "\xEF\xBF\xBF \xF4\x8F\xBF\xBF"); /* U+FFFF, U+10FFFF */
}

static void test_malformed_bytes_become_question_marks(void **state) {
  (void)state;
  assert_scrubs_to("name '\xFF' is bad", "name '?' is bad");
  assert_scrubs_to("\x80\xBF", "??");           /* continuation bytes alone */
  assert_scrubs_to("cut \xC3", "cut ?");        /* a sequence cut by the end */
  assert_scrubs_to("cut \xE2\x82", "cut ??");   /* each byte of it */
  assert_scrubs_to("\xC0\xAF", "??");           /* overlong '/' */
  assert_scrubs_to("\xE0\x80\xAF", "???");      /* overlong, three bytes */
  assert_scrubs_to("\xED\xA0\x80", "???");      /* a surrogate */
  assert_scrubs_to("\xF4\x90\x80\x80", "????"); /* past U+10FFFF */
  assert_scrubs_to("\xC3(", "?(");              /* a lead byte without its continuation */
  assert_scrubs_to("a\xF8\x88\x80\x80\x80z", "a?????z");
}

/* Every string of up to three bytes from a set that covers each class of
 * byte, scrubbed, is one jansson takes; those it took before are unchanged. */
static void test_output_is_always_a_json_string(void **state) {
  (void)state;
  static const unsigned char bytes[] = {'a',  0x7F, 0x80, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2,
                                        0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
  size_t n = sizeof bytes;
  for (size_t i = 0; i < n * n * n; i++) {
    char text[4] = {(char)bytes[i % n], (char)bytes[i / n % n], (char)bytes[i / n / n], 0};
    char copy[4];
    memcpy(copy, text, sizeof text);
    json_t *before = json_string(text);
    json_t *after = json_string(utf8_scrub(copy));
    assert_non_null(after);
    if (before)
      assert_memory_equal(copy, text, sizeof text);
    json_decref(before);
    json_decref(after);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_well_formed_text_is_kept),
      cmocka_unit_test(test_malformed_bytes_become_question_marks),
      cmocka_unit_test(test_output_is_always_a_json_string),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
