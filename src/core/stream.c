/*
 * stream.c — a rank's standalone index stream over a partition plan.
 *
 * The state is (epoch, emitted, cursor).  Item k of the epoch is, for
 * k < owned, the rank's k-th owned sample: positional strategies compute its
 * epoch position directly, sample strategies find it by scanning the epoch
 * order from `cursor`.  Items owned..len-1 exist only with the pad tail and
 * come from part_pad_position.  Nothing else is kept, which is why a position
 * is enough to resume.
 */
#include "core/stream.h"

#include <assert.h>
#include <stdlib.h>

struct stream {
  const part_plan_t *plan; /* borrowed */
  part_epoch_t *ep;        /* owned: the current epoch's order */
  uint32_t rank;
  bool positional;      /* the strategy owns positions, not samples */
  uint64_t num_samples; /* N */
  uint64_t owned;       /* samples this rank owns per epoch */
  uint64_t len;         /* items per epoch after the tail rule */
  uint64_t emitted;     /* items of this epoch yielded so far */
  uint64_t cursor;      /* sample strategies: next epoch position to scan */
};

muster_err_t stream_create(const part_plan_t *plan, uint32_t rank, stream_t **out) {
  if (plan == NULL || out == NULL || rank >= part_plan_config(plan)->world_size)
    return MUSTER_INVALID;
  stream_t *stream = calloc(1, sizeof *stream);
  if (stream == NULL)
    return MUSTER_NOMEM;
  stream->plan = plan;
  stream->rank = rank;
  stream->positional = part_strategy_is_positional(part_plan_config(plan)->strategy);
  stream->num_samples = dataset_num_samples(part_plan_dataset(plan));
  stream->owned = part_rank_owned(plan, rank);
  stream->len = part_rank_len(plan, rank);
  muster_err_t err = part_epoch_create(plan, 0, &stream->ep);
  if (err != MUSTER_OK) {
    free(stream);
    return err;
  }
  *out = stream;
  return MUSTER_OK;
}

void stream_destroy(stream_t *stream) {
  if (stream == NULL)
    return;
  part_epoch_destroy(stream->ep);
  free(stream);
}

/* Sample strategies: the next sample this rank owns at or after the cursor.
 * Precondition: emitted < owned, so one exists. */
static uint64_t scan_next_owned(stream_t *stream) {
  for (;;) {
    assert(stream->cursor < stream->num_samples);
    uint64_t sample = part_epoch_index(stream->ep, stream->cursor++);
    if (part_sample_owner(stream->plan, sample) == stream->rank)
      return sample;
  }
}

bool stream_next(stream_t *stream, uint64_t *index) {
  if (stream->emitted >= stream->len)
    return false;
  uint64_t k = stream->emitted++;
  if (k >= stream->owned)
    *index = part_epoch_index(stream->ep, part_pad_position(stream->plan, stream->rank, k));
  else if (stream->positional)
    *index = part_epoch_index(stream->ep, part_rank_position(stream->plan, stream->rank, k));
  else
    *index = scan_next_owned(stream);
  return true;
}

size_t stream_next_batch(stream_t *stream, uint64_t *indices, size_t max) {
  size_t got = 0;
  while (got < max && stream_next(stream, &indices[got]))
    got++;
  return got;
}

/* Replaces the epoch order; the stream is unchanged on failure. */
static muster_err_t switch_epoch(stream_t *stream, uint64_t epoch) {
  if (part_epoch_number(stream->ep) == epoch)
    return MUSTER_OK;
  part_epoch_t *ep = NULL;
  muster_err_t err = part_epoch_create(stream->plan, epoch, &ep);
  if (err != MUSTER_OK)
    return err;
  part_epoch_destroy(stream->ep);
  stream->ep = ep;
  return MUSTER_OK;
}

muster_err_t stream_set_epoch(stream_t *stream, uint64_t epoch) {
  muster_err_t err = switch_epoch(stream, epoch);
  if (err != MUSTER_OK)
    return err;
  stream->emitted = 0;
  stream->cursor = 0;
  return MUSTER_OK;
}

muster_err_t stream_next_epoch(stream_t *stream) {
  uint64_t epoch = part_epoch_number(stream->ep);
  if (epoch == UINT64_MAX)
    return MUSTER_INVALID;
  return stream_set_epoch(stream, epoch + 1);
}

muster_err_t stream_seek(stream_t *stream, uint64_t item) {
  if (item > stream->len)
    return MUSTER_INVALID;
  stream->emitted = 0;
  stream->cursor = 0;
  if (stream->positional) {
    stream->emitted = item;
    return MUSTER_OK;
  }
  uint64_t owned_before = item < stream->owned ? item : stream->owned;
  for (; stream->emitted < owned_before; stream->emitted++)
    (void)scan_next_owned(stream);
  stream->emitted = item;
  return MUSTER_OK;
}

uint64_t stream_epoch(const stream_t *stream) {
  return part_epoch_number(stream->ep);
}

uint32_t stream_rank(const stream_t *stream) {
  return stream->rank;
}

uint64_t stream_len(const stream_t *stream) {
  return stream->len;
}

uint64_t stream_emitted(const stream_t *stream) {
  return stream->emitted;
}

uint64_t stream_remaining(const stream_t *stream) {
  return stream->len - stream->emitted;
}

uint64_t stream_block(const stream_t *stream) {
  return stream->emitted / part_plan_config(stream->plan)->block_size;
}

void stream_get_pos(const stream_t *stream, stream_pos_t *pos) {
  pos->fingerprint = part_plan_fingerprint(stream->plan);
  pos->rank = stream->rank;
  pos->epoch = part_epoch_number(stream->ep);
  pos->emitted = stream->emitted;
  pos->cursor = stream->positional ? 0 : stream->cursor;
}

muster_err_t stream_set_pos(stream_t *stream, const stream_pos_t *pos) {
  if (pos->fingerprint != part_plan_fingerprint(stream->plan) || pos->rank != stream->rank ||
      pos->emitted > stream->len || pos->cursor > stream->num_samples)
    return MUSTER_INVALID;
  if (!stream->positional && pos->emitted < stream->owned && pos->cursor == stream->num_samples)
    return MUSTER_INVALID; /* owned samples left but nothing left to scan */
  muster_err_t err = switch_epoch(stream, pos->epoch);
  if (err != MUSTER_OK)
    return err;
  stream->emitted = pos->emitted;
  stream->cursor = stream->positional ? 0 : pos->cursor;
  return MUSTER_OK;
}

static void put_le(unsigned char *out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; i++)
    out[i] = (unsigned char)(value >> (8 * i));
}

static uint64_t get_le(const unsigned char *in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; i++)
    value |= (uint64_t)in[i] << (8 * i);
  return value;
}

void stream_pos_encode(const stream_pos_t *pos, unsigned char out[STREAM_POS_BYTES]) {
  put_le(out, STREAM_POS_VERSION, 4);
  put_le(out + 4, pos->rank, 4);
  put_le(out + 8, pos->fingerprint, 8);
  put_le(out + 16, pos->epoch, 8);
  put_le(out + 24, pos->emitted, 8);
  put_le(out + 32, pos->cursor, 8);
}

muster_err_t stream_pos_decode(const unsigned char in[STREAM_POS_BYTES], stream_pos_t *pos) {
  if (get_le(in, 4) != STREAM_POS_VERSION)
    return MUSTER_INVALID;
  pos->rank = (uint32_t)get_le(in + 4, 4);
  pos->fingerprint = get_le(in + 8, 8);
  pos->epoch = get_le(in + 16, 8);
  pos->emitted = get_le(in + 24, 8);
  pos->cursor = get_le(in + 32, 8);
  return MUSTER_OK;
}
