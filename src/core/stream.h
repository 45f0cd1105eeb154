/*
 * stream.h — one rank's index stream, computed from the configuration alone.
 *
 * A stream_t walks rank `rank`'s items of a part_plan_t epoch by epoch: the
 * samples it owns in epoch order, then the tail rule (pad or drop).  It needs
 * no server and no other rank: every rank of a static strategy computes its
 * own stream, and together the ranks cover every sample of each epoch exactly
 * once (tail keep) or with the documented padding.  For the dynamic strategy
 * the stream is the static view (epoch block b to rank b mod world_size); a
 * coordinated iteration hands dynamic blocks out instead.
 *
 * Memory is O(1) beyond the plan (O(shards) in shard mode, for the epoch).
 * Positional strategies (round_robin, contiguous, dynamic) yield each item in
 * O(1); sample strategies (hash, range, stratified) scan the epoch order for
 * the rank's samples, O(world_size) per item on average.
 *
 * The position (stream_pos_t: epoch, items yielded, scan cursor) is a few
 * integers; restoring it resumes exactly where the stream was.  It carries the
 * plan's fingerprint and the rank, so it cannot be restored into a stream of
 * another configuration.  A stream_t is not thread-safe; give each thread its
 * own (they share one plan).
 */
#ifndef MUSTER_CORE_STREAM_H
#define MUSTER_CORE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/partition.h"
#include "muster.h"

/* Version of the encoded position (stream_pos_encode). */
#define STREAM_POS_VERSION 1
/* Bytes of an encoded position. */
#define STREAM_POS_BYTES 40

typedef struct {
  uint64_t fingerprint; /* part_plan_fingerprint of the stream's plan */
  uint32_t rank;        /* the stream's rank */
  uint64_t epoch;       /* current epoch */
  uint64_t emitted;     /* items of this epoch already yielded, 0..len */
  uint64_t cursor;      /* sample strategies: next epoch position to scan; 0 otherwise */
} stream_pos_t;

typedef struct stream stream_t;

/*
 * Creates rank `rank`'s stream at the start of epoch 0.  `plan` is borrowed and
 * must outlive the stream.  Returns MUSTER_OK and sets *out (caller owns it:
 * stream_destroy), MUSTER_INVALID when rank >= world_size, or MUSTER_NOMEM.
 */
muster_err_t stream_create(const part_plan_t *plan, uint32_t rank, stream_t **out);
/* Frees the stream; accepts NULL. */
void stream_destroy(stream_t *stream);

/* Writes the next sample index to *index and returns true, or returns false at
 * the end of the current epoch (and stays there until the epoch changes). */
bool stream_next(stream_t *stream, uint64_t *index);
/* Up to `max` next indices of the current epoch into indices[]; returns how
 * many (fewer than max only at the end of the epoch). */
size_t stream_next_batch(stream_t *stream, uint64_t *indices, size_t max);

/*
 * Moves to the start of `epoch`.  MUSTER_OK, MUSTER_INVALID when the plan has
 * a bounded number of epochs and `epoch` is not below it (the stream is left
 * where it was), or MUSTER_NOMEM.
 */
muster_err_t stream_set_epoch(stream_t *stream, uint64_t epoch);
/* stream_set_epoch(stream, current + 1): MUSTER_INVALID when all epochs are done. */
muster_err_t stream_next_epoch(stream_t *stream);
/* Moves to item `item` (0..stream_len) of the current epoch: O(1) for
 * positional strategies, a scan of the epoch order for sample strategies.
 * MUSTER_INVALID when item > stream_len. */
muster_err_t stream_seek(stream_t *stream, uint64_t item);

uint64_t stream_epoch(const stream_t *stream);
uint32_t stream_rank(const stream_t *stream);
/* Items this rank yields per epoch (part_rank_len). */
uint64_t stream_len(const stream_t *stream);
/* Items of the current epoch already yielded. */
uint64_t stream_emitted(const stream_t *stream);
/* Items of the current epoch still to come. */
uint64_t stream_remaining(const stream_t *stream);
/* The block (of block_size items of this rank's epoch) the next item falls in. */
uint64_t stream_block(const stream_t *stream);

/* The current position; restoring it into a stream of the same plan and rank
 * resumes exactly here. */
void stream_get_pos(const stream_t *stream, stream_pos_t *pos);
/*
 * Restores a position.  MUSTER_INVALID (and the stream is unchanged) when the
 * fingerprint or rank differ from the stream's, the epoch is out of the plan's
 * range, emitted exceeds the epoch's length or cursor exceeds N; MUSTER_NOMEM.
 */
muster_err_t stream_set_pos(stream_t *stream, const stream_pos_t *pos);

/* Writes pos as STREAM_POS_BYTES bytes: le32 version, le32 rank, le64
 * fingerprint, epoch, emitted, cursor.  Stable across platforms. */
void stream_pos_encode(const stream_pos_t *pos, unsigned char out[STREAM_POS_BYTES]);
/* Reads what stream_pos_encode wrote; MUSTER_INVALID for another version. */
muster_err_t stream_pos_decode(const unsigned char in[STREAM_POS_BYTES], stream_pos_t *pos);

#endif
