/*
 * suggest.h — the name a mistyped word most likely meant (suggest.c):
 * `muster queues ls`, `muster queue create q --nxt r` and `muster head
 * --lisen ...` are told the command or option they were probably after
 * (`did you mean 'queue'?`), not only that the word is unknown.
 *
 * A caller offers every name the word could have meant, one at a time, and
 * asks for the closest at the end: the names live in different tables (the
 * CLI's commands and options, getopt's `struct option`), so this module
 * owns none of them.  Pure code: no I/O, no allocation.
 */
#ifndef MUSTER_CORE_SUGGEST_H
#define MUSTER_CORE_SUGGEST_H

#include <stddef.h>

/* The search for the name closest to `word` (the first `word_len` bytes). */
typedef struct {
  const char *word;
  size_t word_len;
  const char *best;      /* the closest name offered so far, or NULL */
  size_t best_len;       /* its length */
  int best_distance;     /* its edit distance to the word */
  const char *prefix_of; /* the last name offered that starts with the word */
  size_t prefix_of_len;  /* its length */
  int prefixes;          /* how many names offered start with the word */
} suggest_t;

/* Starts a search for the name closest to word[0, word_len). */
void suggest_init(suggest_t *s, const char *word, size_t word_len);

/*
 * Offers name[0, name_len) (not copied: it must outlive the search).  It
 * becomes the best when it is closer than every name offered before; a tie
 * keeps the earlier, so a table's order decides between equals.
 */
void suggest_offer(suggest_t *s, const char *name, size_t name_len);

/*
 * The name the word likely meant, with its length in *len: the one name
 * offered that starts with it, when the word has 3 letters or more and
 * starts exactly one (`--prio` for `--priority`; a name offered again at
 * once, as a group is by each of its subcommands, counts once); else the
 * closest name, when it is close enough to be a slip of the fingers: at most
 * one edit (a letter added, dropped, changed, or two neighbours swapped) per
 * four letters of the word, and at least one for any word.  NULL otherwise,
 * and for a word that is itself one of the names.
 */
const char *suggest_best(const suggest_t *s, size_t *len);

#endif
