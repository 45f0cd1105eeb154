/*
 * suggest.c — the closest name to a mistyped word (suggest.h).
 *
 * Closeness is the optimal-string-alignment distance: the fewest letters
 * added, dropped or changed, or pairs of neighbours swapped, that turn one
 * into the other ("statuss" is one from "status", "--ordred" one from
 * "--ordered").  Names and words are short (command and option names, at
 * most SUGGEST_MAX_LEN bytes are compared), so the three rows of the usual
 * table fit on the stack.
 */
#include "suggest.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

/* Longer names and words are not compared: no command or option is this long. */
#define SUGGEST_MAX_LEN 64

static int min3(int a, int b, int c) {
  int m = a < b ? a : b;
  return m < c ? m : c;
}

/* The optimal-string-alignment distance between a[0, na) and b[0, nb), both
 * at most SUGGEST_MAX_LEN long. */
static int suggest_distance(const char *a, size_t na, const char *b, size_t nb) {
  int before[SUGGEST_MAX_LEN + 1], prev[SUGGEST_MAX_LEN + 1], row[SUGGEST_MAX_LEN + 1];
  for (size_t j = 0; j <= nb; j++)
    prev[j] = (int)j;
  for (size_t i = 1; i <= na; i++) {
    row[0] = (int)i;
    for (size_t j = 1; j <= nb; j++) {
      int change = a[i - 1] != b[j - 1];
      row[j] = min3(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + change);
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          before[j - 2] + 1 < row[j])
        row[j] = before[j - 2] + 1; /* two neighbours swapped */
    }
    for (size_t j = 0; j <= nb; j++) {
      before[j] = prev[j];
      prev[j] = row[j];
    }
  }
  return prev[nb];
}

void suggest_init(suggest_t *s, const char *word, size_t word_len) {
  s->word = word;
  s->word_len = word_len;
  s->best = NULL;
  s->best_len = 0;
  s->best_distance = INT_MAX;
  s->prefix_of = NULL;
  s->prefix_of_len = 0;
  s->prefixes = 0;
}

void suggest_offer(suggest_t *s, const char *name, size_t name_len) {
  if (name == NULL || name_len == 0 || name_len > SUGGEST_MAX_LEN || s->word_len > SUGGEST_MAX_LEN)
    return;
  bool again =
      s->prefix_of && s->prefix_of_len == name_len && memcmp(s->prefix_of, name, name_len) == 0;
  if (name_len > s->word_len && memcmp(name, s->word, s->word_len) == 0 && !again) {
    s->prefix_of = name;
    s->prefix_of_len = name_len;
    s->prefixes++;
  }
  int distance = suggest_distance(s->word, s->word_len, name, name_len);
  if (distance < s->best_distance) {
    s->best = name;
    s->best_len = name_len;
    s->best_distance = distance;
  }
}

const char *suggest_best(const suggest_t *s, size_t *len) {
  if (s->best_distance == 0)
    return NULL; /* the word is a name */
  if (s->word_len >= 3 && s->prefixes == 1) {
    *len = s->prefix_of_len;
    return s->prefix_of;
  }
  int allowed = (int)(s->word_len / 4) > 1 ? (int)(s->word_len / 4) : 1;
  if (s->best == NULL || s->best_distance == 0 || s->best_distance > allowed)
    return NULL;
  *len = s->best_len;
  return s->best;
}
