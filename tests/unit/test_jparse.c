/*
 * test_jparse.c — JSON a person wrote, parsed by libmuster's jparse
 * (src/client/jparse.c), and the library's messages built on it.
 *
 * A bad value must be told with jansson's reason and where it stopped, by the
 * library as by the command line: `muster session create --init-data '{bad'`
 * said only "string or '}' expected near 'bad'", with no place.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "client/jparse.h"
#include "muster.h"

/* jparse of `text` must fail saying `want`. */
static void refused(const char *text, const char *want) {
  char why[JPARSE_WHY];
  json_t *value = jparse(text, strlen(text), why, sizeof why);
  assert_null(value);
  assert_string_equal(why, want);
}

static void test_values_and_places(void **state) {
  (void)state;
  char why[JPARSE_WHY];
  json_t *v = jparse("\"a\\u0000b\"", 10, why, sizeof why);
  assert_non_null(v); /* any value at the top level, NUL in strings */
  assert_int_equal(json_string_length(v), 3);
  json_decref(v);
  refused("{bad", "string or '}' expected near 'bad' (at column 4)");
  refused("{\"a\":\n bad", "invalid token near 'bad' (at line 2, column 4)");
  char small[16];
  assert_null(jparse("{bad", 4, small, sizeof small));
  assert_int_equal(strlen(small), sizeof small - 1); /* cut to fit */
}

/* The library's own parse of a caller's JSON names the field and the place;
 * the request is refused before anything is sent (nothing listens on port 9). */
static void test_library_says_where(void **state) {
  (void)state;
  muster_client_t *c = NULL;
  assert_int_equal(muster_client_new("http://127.0.0.1:9", "token", &c), MUSTER_OK);
  muster_session_opts_t opts;
  muster_session_opts_init(&opts);
  opts.queue = "q";
  opts.init_data = "{\"model\": \"a\",\n \"size\": 3,,}";
  char *id = NULL, *json = NULL;
  assert_int_equal(muster_session_create(c, &opts, &id, &json), MUSTER_INVALID);
  assert_string_equal(muster_client_message(c),
                      "init_data: not valid JSON: string or '}' expected near ',' "
                      "(at line 2, column 12)");
  opts.init_data = "{bad";
  assert_int_equal(muster_session_create(c, &opts, &id, &json), MUSTER_INVALID);
  assert_string_equal(muster_client_message(c),
                      "init_data: not valid JSON: string or '}' expected near 'bad' "
                      "(at column 4)");
  muster_client_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_values_and_places),
      cmocka_unit_test(test_library_says_where),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
