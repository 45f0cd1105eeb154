/*
 * iter_reply.c — a coordinated iteration's `next` reply, and the `held`
 * listing of a rank's blocks, read from their text (iter_internal.h; the
 * replies are docs/api.md, "POST /v1/iterations/{name}/next" and "GET
 * /v1/iterations/{name}/held").
 *
 * The reply is small but for its blocks' "indices", up to 2^20 integers;
 * read through a jansson tree, they cost a json_t and a strtoll each, most
 * of the loader's time on the call.  Here the reply is walked once as text:
 * its members and the blocks' members by name, in any order, with the
 * whitespace JSON allows anywhere; the indices go straight into the block's
 * array (core/jints.h), every other integer through the same reader, and
 * members this reader does not know are skipped after a check of their
 * form (core/jcanon.h).  There is no tree to fall back to, so every path
 * here is strict: anything that is not a well-formed reply of this shape —
 * a broken or cut-off array, a negative index or one no dataset can have
 * (2^48 and above), a real or a string where an integer is due, a block
 * whose indices do not match its [begin, end), a member named twice — is an
 * error that names the place, and no index is ever guessed.
 *
 * Members are matched by their decoded names, so an escaped name
 * ("\u0069ndices") is the name it spells, as for any JSON reader.  Where
 * this reader and jansson differ: a known member named twice is refused
 * (jansson keeps the last; RFC 8259 leaves duplicates undefined, and the
 * head never writes them), and a skipped member's value is checked for its
 * form only, within JCANON_MAX_DEPTH levels (an integer beyond 64 bits
 * there, which jansson refuses, passes).
 */
#include "client/iter_internal.h"

#include "core/jcanon.h"
#include "core/jints.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest member or state name compared; longer ones are other names. */
#define RD_NAME_MAX 15

/* The largest sample index a reply may hold: datasets have at most
 * DATASET_MAX_SAMPLES samples. */
#define RD_MAX_INDEX (DATASET_MAX_SAMPLES - 1)

/* A read in progress. */
typedef struct {
  const char *text, *p, *end; /* the reply, the next byte, the end */
  muster_err_t code;          /* MUSTER_PROTOCOL or MUSTER_NOMEM once failed */
  char *why;                  /* the explanation, `why_size` bytes */
  size_t why_size;
} rd_t;

/* Records a protocol error at the current byte; returns false. */
__attribute__((format(printf, 2, 3))) static bool rd_fail(rd_t *r, const char *fmt, ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  r->code = MUSTER_PROTOCOL;
  snprintf(r->why, r->why_size, "%s (byte %zu of %zu)", what, (size_t)(r->p - r->text),
           (size_t)(r->end - r->text));
  return false;
}

static bool rd_nomem(rd_t *r) {
  r->code = MUSTER_NOMEM;
  snprintf(r->why, r->why_size, "out of memory");
  return false;
}

static void rd_space(rd_t *r) {
  while (r->p < r->end && jcanon_is_space((unsigned char)*r->p))
    r->p++;
}

/* Consumes `c` after whitespace when it is next. */
static bool rd_byte(rd_t *r, char c) {
  rd_space(r);
  if (r->p == r->end || *r->p != c)
    return false;
  r->p++;
  return true;
}

/* The value of hex digit `c`, -1 when it is not one. */
static int rd_hex(unsigned char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* Decodes the checked string [s, end) (without its quotes) into `name` when
 * it spells at most RD_NAME_MAX ASCII characters other than NUL; otherwise
 * `name` is "", which matches nothing this reader knows. */
static void rd_decode(const unsigned char *s, const unsigned char *end,
                      char name[RD_NAME_MAX + 1]) {
  static const char simple[] = "\"\"\\\\//b\bf\fn\nr\rt\t"; /* escape letter, byte */
  size_t n = 0;
  while (s < end) {
    unsigned c = *s++;
    if (c == '\\') {
      unsigned letter = *s++;
      const char *hit = NULL;
      for (size_t i = 0; i + 1 < sizeof simple && hit == NULL; i += 2)
        if ((unsigned char)simple[i] == letter)
          hit = &simple[i + 1];
      if (hit) {
        c = (unsigned char)*hit;
      } else { /* \uXXXX: jcanon_string checked its four digits */
        c = (unsigned)(rd_hex(s[0]) << 12 | rd_hex(s[1]) << 8 | rd_hex(s[2]) << 4 | rd_hex(s[3]));
        s += 4;
      }
    }
    if (c == 0 || c >= 0x80 || n == RD_NAME_MAX) {
      name[0] = '\0';
      return;
    }
    name[n++] = (char)c;
  }
  name[n] = '\0';
}

/* Reads the string at r->p (a name, or the value `what` names) into `name`
 * (rd_decode). */
static bool rd_name(rd_t *r, const char *what, char name[RD_NAME_MAX + 1]) {
  const unsigned char *start = (const unsigned char *)r->p, *p = start;
  bool canonical = true; /* not asked for: any escape JSON allows is read */
  if (p == (const unsigned char *)r->end || *p != '"')
    return rd_fail(r, "%s: expected a string", what);
  if (!jcanon_string(&p, (const unsigned char *)r->end, false, &canonical))
    return rd_fail(r, "%s: a broken string", what);
  rd_decode(start + 1, p - 1, name);
  r->p = (const char *)p;
  return true;
}

/* Steps to the next item of the object or array (`open` '{' or '[', `close`
 * its end) at r->p: `*first` the first call, which reads `open`.  1 at the
 * item (after spaces), 0 past `close`, -1 on an error (`what`, `kind` name
 * the container). */
static int rd_step(rd_t *r, bool *first, char open, char close, const char *kind,
                   const char *what) {
  if (*first) {
    *first = false;
    if (!rd_byte(r, open)) {
      rd_fail(r, "%s: expected an %s", what, kind);
      return -1;
    }
    if (rd_byte(r, close))
      return 0;
  } else if (!rd_byte(r, ',')) {
    if (rd_byte(r, close))
      return 0;
    rd_fail(r, "%s: expected ',' or '%c'", what, close);
    return -1;
  }
  rd_space(r);
  return 1;
}

/* Steps to the next member of the object at r->p, as rd_step: at 1, `name`
 * is the member's and r->p is at its value. */
static int rd_member(rd_t *r, bool *first, const char *what, char name[RD_NAME_MAX + 1]) {
  int step = rd_step(r, first, '{', '}', "object", what);
  if (step <= 0)
    return step;
  if (!rd_name(r, what, name))
    return -1;
  if (!rd_byte(r, ':')) {
    rd_fail(r, "%s: expected ':'", what);
    return -1;
  }
  rd_space(r);
  return 1;
}

/* Steps to the next element of the array at r->p, as rd_step. */
static int rd_element(rd_t *r, bool *first, const char *what) {
  return rd_step(r, first, '[', ']', "array", what);
}

/* Skips the value at r->p after checking its form. */
static bool rd_skip(rd_t *r, const char *what) {
  jcanon_scan_t s;
  jcanon_init(&s, r->p, r->end, JCANON_FOLLOW | JCANON_SPACE);
  if (!jcanon_value(&s))
    return rd_fail(r, "%s: not a JSON value", what);
  r->p = (const char *)s.p;
  return true;
}

/* The integer at r->p (member `name` of `what`, or top-level when `what` is
 * NULL) into *v; null gives `dflt`. */
static bool rd_int(rd_t *r, const char *what, const char *name, int64_t dflt, int64_t *v) {
  if (r->end - r->p >= 4 && memcmp(r->p, "null", 4) == 0) {
    r->p += 4;
    *v = dflt;
    return true;
  }
  jints_err_t err = jints_i64(&r->p, r->end, v);
  return err == JINTS_OK ||
         rd_fail(r, "%s%s%s: %s", what ? what : "", what ? "." : "", name, jints_strerror(err));
}

/* Marks member `bit` of `*seen` read; false (an error) the second time. */
static bool rd_once(rd_t *r, unsigned *seen, unsigned bit, const char *what, const char *name) {
  if (*seen & bit)
    return rd_fail(r, "%s: \"%s\" twice", what, name);
  *seen |= bit;
  return true;
}

/* The integer members of a block, in muster_iter_block_t's order; absent
 * or null they are -1. */
static const char *const rd_block_ints[] = {"block", "token", "deadline_ms",
                                            "rank",  "begin", "end"};
enum {
  RD_BLOCK_INTS = 6,
  RD_BEGIN_END = 1u << 4 | 1u << 5, /* the bits of "begin" and "end" in `seen` */
  RD_TAKEOVER = 1u << RD_BLOCK_INTS,
  RD_INDICES = 1u << (RD_BLOCK_INTS + 1),
};

/* Takes the block's [begin, end) from v[] when it is one. */
static bool rd_range(rd_t *r, const char *what, const int64_t v[RD_BLOCK_INTS],
                     muster_iter_block_t *b) {
  if (v[4] < 0 || v[5] < v[4])
    return rd_fail(r, "%s: needs 0 <= \"begin\" <= \"end\"", what);
  b->begin = (uint64_t)v[4];
  b->end = (uint64_t)v[5];
  return true;
}

/* Reads the indices at `at` (the "indices" member's value) of block `b`,
 * whose [begin, end) is known, leaving r->p past them. */
static bool rd_indices(rd_t *r, const char *at, const char *what, muster_iter_block_t *b) {
  uint64_t count = b->end - b->begin;
  r->p = at;
  /* Each index takes two bytes at least (a digit and a comma): a count the
   * text cannot hold is refused before anything is allocated for it. */
  if (count > (uint64_t)(r->end - r->p) / 2 + 1)
    return rd_fail(r, "%s.indices: [begin, end) = [%llu, %llu) is more than the reply holds", what,
                   (unsigned long long)b->begin, (unsigned long long)b->end);
  if ((b->indices = malloc((size_t)(count ? count : 1) * sizeof *b->indices)) == NULL)
    return rd_nomem(r);
  size_t where = 0;
  jints_err_t err = jints_array_u64(&r->p, r->end, RD_MAX_INDEX, b->indices, (size_t)count, &where);
  switch (err) {
  case JINTS_OK:
    return true;
  case JINTS_COUNT:
    return rd_fail(r, "%s.indices: %s%zu indices for [begin, end) = [%llu, %llu)", what,
                   where > count ? "more than " : "", where > count ? (size_t)count : where,
                   (unsigned long long)b->begin, (unsigned long long)b->end);
  case JINTS_NOT_ARRAY:
    return rd_fail(r, "%s.indices: not an array", what);
  case JINTS_TOO_LARGE:
    return rd_fail(r, "%s.indices[%zu]: above the largest sample index (%llu)", what, where,
                   (unsigned long long)RD_MAX_INDEX);
  default:
    return rd_fail(r, "%s.indices[%zu]: %s", what, where, jints_strerror(err));
  }
}

/* What rd_block has read of one block so far. */
typedef struct {
  int64_t v[RD_BLOCK_INTS]; /* the integer members, -1 until read */
  unsigned seen;            /* the members read: bit k for rd_block_ints[k], RD_TAKEOVER, ... */
  const char *indices_at;   /* indices left for later: they came before "begin" or "end" */
} rd_block_t;

/* Reads the value of member `name` of block `what` at r->p.  The indices
 * are read where they stand when "begin" and "end" came before them (the
 * head's order), else left for rd_block. */
static bool rd_block_member(rd_t *r, const char *what, const char *name, rd_block_t *s,
                            muster_iter_block_t *b) {
  for (int k = 0; k < RD_BLOCK_INTS; k++)
    if (strcmp(name, rd_block_ints[k]) == 0)
      return rd_once(r, &s->seen, 1u << k, what, name) && rd_int(r, what, name, -1, &s->v[k]);
  if (strcmp(name, "takeover") == 0) {
    b->takeover = r->end - r->p >= 4 && memcmp(r->p, "true", 4) == 0; /* as json_is_true */
    return rd_once(r, &s->seen, RD_TAKEOVER, what, name) && rd_skip(r, what);
  }
  if (strcmp(name, "indices") != 0)
    return rd_skip(r, what);
  if (!rd_once(r, &s->seen, RD_INDICES, what, name))
    return false;
  if ((s->seen & RD_BEGIN_END) == RD_BEGIN_END)
    return rd_range(r, what, s->v, b) && rd_indices(r, r->p, what, b);
  s->indices_at = r->p;
  return rd_skip(r, what);
}

/* Reads block object `i` at r->p into *b (zeroed). */
static bool rd_block(rd_t *r, size_t i, bool want_indices, muster_iter_block_t *b) {
  char what[40], name[RD_NAME_MAX + 1];
  snprintf(what, sizeof what, "blocks[%zu]", i);
  rd_block_t s = {.v = {-1, -1, -1, -1, -1, -1}};
  bool first = true;
  int more;
  while ((more = rd_member(r, &first, what, name)) == 1)
    if (!rd_block_member(r, what, name, &s, b))
      return false;
  if (more < 0 || !rd_range(r, what, s.v, b))
    return false;
  if (s.v[0] < 0 || s.v[1] <= 0)
    return rd_fail(r, "%s: needs \"block\" >= 0 and \"token\" > 0", what);
  b->block = (uint64_t)s.v[0];
  b->token = s.v[1];
  b->deadline_ms = s.v[2];
  b->plan_rank = s.v[3];
  if (s.indices_at) {
    const char *after = r->p;
    if (!rd_indices(r, s.indices_at, what, b))
      return false;
    r->p = after;
  }
  if (want_indices && !(s.seen & RD_INDICES))
    return rd_fail(r, "%s: no \"indices\", which were asked for", what);
  return true;
}

/* Reads the "blocks" array at r->p into *blocks / *count (of a `next` or a
 * `held` reply: the caller frees them, also on failure). */
static bool rd_blocks(rd_t *r, bool want_indices, muster_iter_block_t **blocks, size_t *count) {
  size_t cap = 4;
  if ((*blocks = calloc(cap, sizeof **blocks)) == NULL)
    return rd_nomem(r);
  bool first = true;
  int more;
  while ((more = rd_element(r, &first, "blocks")) == 1) {
    if (*count == cap) {
      muster_iter_block_t *grown = realloc(*blocks, 2 * cap * sizeof *grown);
      if (grown == NULL)
        return rd_nomem(r);
      *blocks = grown;
      cap *= 2;
    }
    muster_iter_block_t *b = &(*blocks)[(*count)++]; /* counted: freed on failure */
    memset(b, 0, sizeof *b);
    if (!rd_block(r, *count - 1, want_indices, b))
      return false;
  }
  return more == 0;
}

/* Reads the "state" string at r->p. */
static bool rd_state(rd_t *r, muster_iter_state_t *state) {
  static const char *const states[] = {"blocks", "wait", "epoch_end", "finished"};
  char name[RD_NAME_MAX + 1];
  if (!rd_name(r, "state", name))
    return false;
  for (int i = 0; i < 4; i++)
    if (strcmp(name, states[i]) == 0) {
      *state = (muster_iter_state_t)i;
      return true;
    }
  return rd_fail(r, "state: not one of blocks, wait, epoch_end, finished");
}

muster_err_t iter_next_read(const char *text, size_t len, bool want_indices,
                            muster_iter_next_t *out, char *why, size_t why_size) {
  rd_t r = {.text = text ? text : "", .why = why, .why_size = why_size};
  r.p = r.text;
  r.end = r.text + (text ? len : 0);
  enum { STATE = 1, EPOCH = 2, RETRY = 4, BLOCKS = 8 };
  unsigned seen = 0;
  int64_t epoch = 0, retry = 50;
  char name[RD_NAME_MAX + 1];
  bool first = true, ok = true;
  int more = -1;
  memset(out, 0, sizeof *out);
  out->state = MUSTER_ITER_WAIT;
  while (ok && (more = rd_member(&r, &first, "reply", name)) == 1) {
    if (strcmp(name, "state") == 0)
      ok = rd_once(&r, &seen, STATE, "reply", name) && rd_state(&r, &out->state);
    else if (strcmp(name, "epoch") == 0)
      ok = rd_once(&r, &seen, EPOCH, "reply", name) && rd_int(&r, NULL, name, 0, &epoch);
    else if (strcmp(name, "retry_ms") == 0)
      ok = rd_once(&r, &seen, RETRY, "reply", name) && rd_int(&r, NULL, name, 50, &retry);
    else if (strcmp(name, "blocks") == 0)
      ok = rd_once(&r, &seen, BLOCKS, "reply", name) &&
           rd_blocks(&r, want_indices, &out->blocks, &out->count);
    else
      ok = rd_skip(&r, "reply");
  }
  if (ok && more == 0) {
    rd_space(&r);
    if (r.p != r.end)
      ok = rd_fail(&r, "text after the reply");
    else if (!(seen & STATE) || !(seen & BLOCKS))
      ok = rd_fail(&r, "no \"%s\"", seen & STATE ? "blocks" : "state");
  }
  if (!ok || more < 0) {
    muster_iter_next_free(out);
    return r.code ? r.code : MUSTER_PROTOCOL;
  }
  out->epoch = (uint64_t)epoch;
  out->retry_ms = retry;
  return MUSTER_OK;
}

/* Reads the boolean at r->p (member `name` of the reply) into *v. */
static bool rd_bool(rd_t *r, const char *name, int *v) {
  for (int truth = 0; truth < 2; truth++) {
    const char *word = truth ? "true" : "false";
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) >= n && memcmp(r->p, word, n) == 0) {
      r->p += n;
      *v = truth;
      return true;
    }
  }
  return rd_fail(r, "%s: expected true or false", name);
}

/* The members of a `held` reply, as bits of rd_once's `seen`. */
enum { HELD_EPOCH = 1, HELD_FINISHED = 2, HELD_TOTAL = 4, HELD_NEXT = 8, HELD_BLOCKS = 16 };

/* Reads the integer member `name` (`bit`) of a `held` reply into *v: at
 * least 0, or null (-1) where `nullable`. */
static bool rd_held_int(rd_t *r, const char *name, unsigned bit, bool nullable, unsigned *seen,
                        int64_t *v) {
  if (!rd_once(r, seen, bit, "reply", name) || !rd_int(r, NULL, name, -1, v))
    return false;
  if (*v < 0 && !(nullable && *v == -1))
    return rd_fail(r, "%s: expected an integer >= 0%s", name, nullable ? " or null" : "");
  return true;
}

/* Reads member `name` of a `held` reply at r->p into *out; `seen` as
 * rd_once keeps it. */
static bool rd_held_member(rd_t *r, const char *name, bool want_indices, unsigned *seen,
                           muster_iter_held_t *out) {
  int64_t v;
  if (strcmp(name, "finished") == 0)
    return rd_once(r, seen, HELD_FINISHED, "reply", name) && rd_bool(r, name, &out->finished);
  if (strcmp(name, "blocks") == 0)
    return rd_once(r, seen, HELD_BLOCKS, "reply", name) &&
           rd_blocks(r, want_indices, &out->blocks, &out->count);
  if (strcmp(name, "epoch") == 0) {
    if (!rd_held_int(r, name, HELD_EPOCH, false, seen, &v))
      return false;
    out->epoch = (uint64_t)v;
  } else if (strcmp(name, "total") == 0) {
    if (!rd_held_int(r, name, HELD_TOTAL, false, seen, &v))
      return false;
    out->total = (uint64_t)v;
  } else if (strcmp(name, "next") == 0) {
    if (!rd_held_int(r, name, HELD_NEXT, true, seen, &v))
      return false;
    out->next = v;
  } else {
    return rd_skip(r, "reply");
  }
  return true;
}

muster_err_t iter_held_read(const char *text, size_t len, bool want_indices,
                            muster_iter_held_t *out, char *why, size_t why_size) {
  rd_t r = {.text = text ? text : "", .why = why, .why_size = why_size};
  r.p = r.text;
  r.end = r.text + (text ? len : 0);
  unsigned seen = 0;
  char name[RD_NAME_MAX + 1];
  bool first = true, ok = true;
  int more = -1;
  memset(out, 0, sizeof *out);
  out->next = -1;
  while (ok && (more = rd_member(&r, &first, "reply", name)) == 1)
    ok = rd_held_member(&r, name, want_indices, &seen, out);
  if (ok && more == 0) {
    rd_space(&r);
    if (r.p != r.end)
      ok = rd_fail(&r, "text after the reply");
    else if (!(seen & HELD_EPOCH) || !(seen & HELD_BLOCKS))
      ok = rd_fail(&r, "no \"%s\"", seen & HELD_EPOCH ? "blocks" : "epoch");
  }
  if (!ok || more < 0) {
    muster_iter_held_free(out);
    return r.code ? r.code : MUSTER_PROTOCOL;
  }
  for (size_t i = 0; i < out->count; i++)
    out->blocks[i].epoch = out->epoch;
  return MUSTER_OK;
}
