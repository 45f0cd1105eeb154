/*
 * loader.c — the libmuster loader: a rank's samples, standalone (computed
 * from the configuration, no head) or coordinated (blocks leased from an
 * iteration on the head, acknowledged as they are finished).
 *
 * Threads.  With `prefetch` > 0 a producer thread fills a bounded ring of
 * items (index, sample from the user's load callback, the block it belongs
 * to) and the caller's thread takes them out; with 0 everything happens on
 * the caller's thread.  The producer waits for room when the ring is full and
 * is woken when the caller has taken it down to half (not at each item: a
 * wake-up costs more than many items); a standalone producer waits for that
 * without a deadline, a coordinated one wakes to heart-beat.  It times its
 * work in its own counters and adds them to the shared ones when it next
 * holds the mutex, so producing an item takes no lock.  Each thread uses its
 * own muster_client_t (a handle is single-threaded): the producer leases,
 * acknowledges and heart-beats; the caller's handle serves checkpoints and
 * the final acks at close.  One mutex guards the ring, the ack queue and the
 * counters; one condition variable (broadcast) wakes whoever waits on any of
 * them.  A coordinated loader's requests to the head (leases, acks,
 * heartbeats, retries while the head does not answer) are in loader_coord.c.
 */
#include "client/loader_internal.h"
#include "client/jdump.h"
#include "client/jparse.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

muster_err_t loader_fail(muster_loader_t *l, muster_err_t err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->message, sizeof l->message, fmt, ap);
  va_end(ap);
  return err;
}

/* The end of muster_loader_opts_t's first version, the fields it was first
 * published with: head_wait_ms came later and may be missing. */
#define LOADER_OPTS_FIRST_END OPTS_END(muster_loader_opts_t, user)

void muster_loader_opts_init_sized(muster_loader_opts_t *opts, size_t size) {
  const muster_loader_opts_t defaults = {.size = sizeof defaults,
                                         .blocks_per_request = LOADER_DEFAULT_BLOCKS,
                                         .head_wait_ms = LOADER_HEAD_WAIT_MS};
  opts_init_sized(opts, size, &defaults, sizeof defaults);
}

/* ---- producing ----------------------------------------------------------------- */

/* Calls the load callback for it->index, timing it (producer's counters). */
static int load_item(muster_loader_t *l, item_t *it) {
  it->sample = NULL;
  if (l->load == NULL)
    return 0;
  int64_t t0 = mono_us();
  int rc = l->load(l->user, it->index, &it->sample);
  l->p_load_us += mono_us() - t0;
  l->p_loads++;
  return rc;
}

/* Adds the producer's timings to the shared counters (under mu). */
static void publish_timings(muster_loader_t *l) {
  l->busy_us += l->p_busy_us;
  l->load_us += l->p_load_us;
  l->loads += l->p_loads;
  l->p_busy_us = l->p_load_us = 0;
  l->p_loads = 0;
}

/* Produces up to `want` items into items[] (without mu), timed as one run in
 * the producer's counters; *made counts them.  A coordinated run ends early
 * where the blocks leased so far end: what it made goes out before the next
 * lease request waits on the head.  Returns 1 when the run is complete (all
 * `want` made, or the leased blocks used up), else what stopped it (0 or -1,
 * see loader_coord_produce). */
static int produce(muster_loader_t *l, item_t *items, size_t want, size_t *made) {
  int64_t t0 = mono_us();
  int rc = 1;
  size_t n = 0;
  for (; n < want; n++) {
    if (n > 0 && l->coordinated && l->staged_block >= l->staged.count)
      break;
    item_t *it = &items[n];
    memset(it, 0, sizeof *it);
    if (l->coordinated)
      rc = loader_coord_produce(l, it);
    else
      rc = stream_next(l->stream, &it->index) ? 1 : 0;
    if (rc == 1 && load_item(l, it) != 0) {
      pthread_mutex_lock(&l->mu);
      l->perr = MUSTER_INVALID;
      snprintf(l->pmsg, sizeof l->pmsg, "the load callback failed for sample %" PRIu64, it->index);
      pthread_mutex_unlock(&l->mu);
      rc = -1;
    }
    if (rc != 1)
      break;
  }
  l->p_busy_us += mono_us() - t0;
  *made = n;
  return rc;
}

/* Waits on the condition (under mu): a coordinated producer for up to the
 * heartbeat interval, a standalone one (nothing to keep alive) until woken. */
static void wait_heartbeat(muster_loader_t *l) {
  if (!l->coordinated) {
    pthread_cond_wait(&l->cv, &l->mu);
    return;
  }
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = ts.tv_nsec + l->heartbeat_ms * 1000000;
  ts.tv_sec += ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  pthread_cond_timedwait(&l->cv, &l->mu, &ts);
}

static void ring_push(muster_loader_t *l, const item_t *it) {
  size_t at = l->head + l->count;
  l->ring[at < l->cap ? at : at - l->cap] = *it;
  l->count++;
  if (l->count > l->stats.buffer_peak)
    l->stats.buffer_peak = l->count;
}

/* Items produced per lock round trip without a load callback: computing an
 * index, or taking the next of a leased block, is cheap, so one handoff per
 * item would dominate (a coordinated run also ends with the leased blocks).
 * With a callback items go one by one, so that each is visible as soon as it
 * is loaded. */
#define LOADER_PRODUCE_BATCH 1024

/* Produces what fits in the ring (a batch; one item at a time while the
 * caller loads) outside the lock, then publishes it; called and returns with
 * l->mu held. */
static void produce_round(muster_loader_t *l, item_t *batch) {
  size_t room = l->cap - l->count, n = 0;
  size_t want = l->load ? 1 : LOADER_PRODUCE_BATCH;
  if (want > room)
    want = room;
  pthread_mutex_unlock(&l->mu);
  int rc = produce(l, batch, want, &n);
  if (rc <= 0)
    batch[n++] = (item_t){.end = true};
  pthread_mutex_lock(&l->mu);
  publish_timings(l);
  bool was_empty = l->count == 0;
  for (size_t i = 0; i < n; i++)
    ring_push(l, &batch[i]);
  l->pdone = rc <= 0;
  if (was_empty)
    pthread_cond_broadcast(&l->cv);
}

static void *producer_main(void *arg) {
  muster_loader_t *l = arg;
  item_t batch[LOADER_PRODUCE_BATCH];
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    if (l->pdone && l->epoch != l->pepoch) { /* the caller moved to the next epoch */
      l->pepoch = l->epoch;
      l->pdone = false;
    }
    /* Acks to send first, unless sending them failed (perr): then the
     * producer only ends its stream, and close sends them again. */
    if (l->pdone || l->count == l->cap || (l->nack > 0 && l->perr == MUSTER_OK)) {
      if (l->nack == 0 || l->perr != MUSTER_OK) {
        l->pwaiting = !l->pdone && l->count == l->cap;
        wait_heartbeat(l);
        l->pwaiting = false;
      }
      pthread_mutex_unlock(&l->mu);
      loader_keep_alive(l);
      pthread_mutex_lock(&l->mu);
      continue;
    }
    produce_round(l, batch);
  }
  publish_timings(l);
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ---- thread control ---------------------------------------------------------- */

static void free_item(muster_loader_t *l, item_t *it) {
  if (it->sample && l->free_sample)
    l->free_sample(l->user, it->sample);
  it->sample = NULL;
}

/* Stops the producer and empties the ring. */
static void thread_stop(muster_loader_t *l) {
  if (l->thread_running) {
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->thread_running = false;
  }
  for (; l->count > 0; l->count--, l->head = (l->head + 1) % l->cap)
    free_item(l, &l->ring[l->head]);
  l->head = 0;
  l->stop = false;
  l->pdone = false;
}

static muster_err_t thread_start(muster_loader_t *l) {
  l->pepoch = l->epoch;
  l->perr = MUSTER_OK;
  if (!l->threaded)
    return MUSTER_OK;
  if (pthread_create(&l->thread, NULL, producer_main, l) != 0)
    return loader_fail(l, MUSTER_NOMEM, "cannot start the prefetch thread");
  l->thread_running = true;
  return MUSTER_OK;
}

/* ---- open and close -------------------------------------------------------------- */

/* The standalone part of open: the rank's stream, computed from the plan. */
static muster_err_t loader_standalone_open(muster_loader_t *l, const muster_loader_opts_t *opts) {
  /* The head refuses to create an iteration without samples (it would be
   * finished at birth); standalone, the same mistake is refused here, in the
   * head's words.  Only standalone: a coordinated loader may still join an
   * empty iteration an earlier head stored, and the head decides that. */
  if (dataset_num_samples(l->ds) == 0)
    return loader_fail(l, MUSTER_INVALID,
                       "dataset: it has no samples (num_samples 0, or shard_counts that hold "
                       "none); a loader needs at least one, as an empty dataset would end "
                       "every epoch at once with nothing for any rank");
  if (opts->checkpoint)
    return loader_fail(l, MUSTER_INVALID,
                       "a standalone loader restores with "
                       "muster_loader_restore after open");
  if (stream_create(l->plan, l->rank, &l->stream) != MUSTER_OK)
    return loader_fail(l, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

/* Takes the caller's options `caller` into *opts and its configuration into
 * *config (both holding the defaults), pointing opts->config at it, so that
 * open reads neither past the caller's structs nor a field they lack. */
static muster_err_t loader_take_opts(muster_loader_t *l, const muster_loader_opts_t *caller,
                                     muster_loader_opts_t *opts, muster_iter_config_t *config) {
  if (opts_take(opts, sizeof *opts, caller, LOADER_OPTS_FIRST_END, "opts",
                "muster_loader_opts_init", l->message, sizeof l->message) != NULL)
    return MUSTER_INVALID;
  if (opts->config == NULL)
    return loader_fail(l, MUSTER_INVALID, "opts.config is required");
  if (opts_take(config, sizeof *config, opts->config, ITER_CONFIG_FIRST_END, "opts.config",
                "muster_iter_config_init", l->message, sizeof l->message) != NULL)
    return MUSTER_INVALID;
  opts->config = config;
  return MUSTER_OK;
}

static muster_err_t loader_init(muster_loader_t *l, const muster_loader_opts_t *caller) {
  muster_loader_opts_t taken;
  muster_iter_config_t config;
  muster_loader_opts_init(&taken);
  muster_iter_config_init(&config);
  muster_err_t err = loader_take_opts(l, caller, &taken, &config);
  if (err != MUSTER_OK)
    return err;
  const muster_loader_opts_t *opts = &taken;
  err = iter_config_plan(opts->config, &l->ds, &l->plan, l->message, sizeof l->message);
  if (err != MUSTER_OK)
    return err;
  if (opts->rank >= part_plan_config(l->plan)->world_size)
    return loader_fail(l, MUSTER_INVALID, "rank %u is not below world_size %u", opts->rank,
                       part_plan_config(l->plan)->world_size);
  l->rank = opts->rank;
  l->load = opts->load;
  l->free_sample = opts->free_sample;
  l->user = opts->user;
  l->threaded = opts->prefetch > 0;
  l->cap = opts->prefetch > 0 ? opts->prefetch : 1;
  if ((l->ring = calloc(l->cap, sizeof *l->ring)) == NULL)
    return loader_fail(l, MUSTER_NOMEM, "out of memory");
  l->coordinated = opts->url != NULL;
  return l->coordinated ? loader_coord_open(l, opts) : loader_standalone_open(l, opts);
}

muster_err_t muster_loader_open(const muster_loader_opts_t *opts, muster_loader_t **out,
                                char **message) {
  const char *why = out == NULL    ? "out: a place for the loader is required"
                    : opts == NULL ? "opts: the loader's options are required"
                                   : NULL;
  if (message)
    *message = why ? strdup(why) : NULL;
  if (out)
    *out = NULL;
  if (why)
    return MUSTER_INVALID;
  muster_loader_t *l = calloc(1, sizeof *l);
  if (l == NULL)
    return MUSTER_NOMEM;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  l->opened_us = mono_us();
  muster_err_t err = loader_init(l, opts);
  if (err == MUSTER_OK)
    err = thread_start(l);
  if (err != MUSTER_OK) {
    if (message)
      *message = strdup(l->message[0] ? l->message : muster_strerror(err));
    muster_loader_close(l);
    return err;
  }
  *out = l;
  return MUSTER_OK;
}

void muster_loader_close(muster_loader_t *l) {
  if (l == NULL)
    return;
  thread_stop(l);
  if (l->coordinated && l->cclient) {
    loader_finish_block(l);
    loader_ack_flush(l, l->cclient);
  }
  muster_iter_next_free(&l->staged);
  stream_destroy(l->stream);
  part_plan_destroy(l->plan);
  dataset_destroy(l->ds);
  muster_client_free(l->pclient);
  muster_client_free(l->cclient);
  free(l->ring);
  free(l->ack_blocks);
  free(l->ack_tokens);
  free(l->known);
  free(l->name);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

/* ---- taking items -------------------------------------------------------------- */

/* The next item from the ring (threaded) or produced here (not); under mu. */
static muster_err_t take(muster_loader_t *l, item_t *it) {
  if (!l->threaded) {
    l->stats.prefetch_misses++;
    pthread_mutex_unlock(&l->mu);
    if (l->coordinated && mono_us() - l->last_call_us >= l->heartbeat_ms * 1000)
      loader_keep_alive(l);
    size_t made;
    int rc = produce(l, it, 1, &made);
    pthread_mutex_lock(&l->mu);
    publish_timings(l);
    if (rc <= 0)
      *it = (item_t){.end = true};
    return MUSTER_OK;
  }
  if (l->count > 0)
    l->stats.prefetch_hits++;
  else
    l->stats.prefetch_misses++;
  while (l->count == 0)
    pthread_cond_wait(&l->cv, &l->mu);
  *it = l->ring[l->head];
  l->head = l->head + 1 == l->cap ? 0 : l->head + 1;
  l->count--;
  if (l->pwaiting && l->count <= l->cap / 2) { /* room for a run of items */
    l->pwaiting = false;
    pthread_cond_broadcast(&l->cv);
  }
  return MUSTER_OK;
}

/* muster_loader_next with mu held (take() may wait on, or drop, it). */
static muster_err_t next_locked(muster_loader_t *l, uint64_t *index, void **sample, int *has) {
  *has = 0;
  if (sample)
    *sample = NULL;
  loader_finish_block(l);
  if (l->at_end) /* a failure stays: read as the end of the epoch, it would hide the rest */
    return l->perr == MUSTER_OK ? MUSTER_OK : loader_fail(l, l->perr, "%s", l->pmsg);
  item_t it;
  take(l, &it);
  if (it.end) {
    l->at_end = true;
    if (l->perr != MUSTER_OK)
      snprintf(l->message, sizeof l->message, "%s", l->pmsg);
    return l->perr;
  }
  *index = it.index;
  if (sample)
    *sample = it.sample;
  else
    free_item(l, &it);
  *has = 1;
  l->consumed++;
  l->stats.samples_loaded++;
  if (it.last && it.token) {
    l->has_finish = true;
    l->finish_block = it.block;
    l->finish_token = it.token;
  }
  return MUSTER_OK;
}

muster_err_t muster_loader_next(muster_loader_t *l, uint64_t *index, void **sample, int *has) {
  if (l == NULL)
    return MUSTER_INVALID;
  l->message[0] = '\0'; /* "" unless this call fails (a failure that stays is said again) */
  if (index == NULL)
    return loader_fail(l, MUSTER_INVALID, "index: a place for the sample's index is required");
  if (has == NULL)
    return loader_fail(l, MUSTER_INVALID,
                       "has: a place for the flag saying whether a sample came is required");
  pthread_mutex_lock(&l->mu);
  muster_err_t err = next_locked(l, index, sample, has);
  pthread_mutex_unlock(&l->mu);
  return err;
}

/* One lock for the whole batch: with a prefetch thread, taking items one
 * lock at a time would cost more than computing them. */
muster_err_t muster_loader_next_batch(muster_loader_t *l, uint64_t *indices, void **samples,
                                      size_t max, size_t *got) {
  if (l == NULL)
    return MUSTER_INVALID;
  l->message[0] = '\0';
  if (got == NULL)
    return loader_fail(l, MUSTER_INVALID, "got: a place for the number of samples is required");
  *got = 0;
  if (indices == NULL)
    return loader_fail(l, MUSTER_INVALID, "indices: a place for up to %zu indices is required",
                       max);
  muster_err_t err = MUSTER_OK;
  pthread_mutex_lock(&l->mu);
  while (*got < max) {
    int has;
    err = next_locked(l, &indices[*got], samples ? &samples[*got] : NULL, &has);
    if (err != MUSTER_OK || !has)
      break;
    (*got)++;
  }
  pthread_mutex_unlock(&l->mu);
  return err;
}

uint64_t muster_loader_len(const muster_loader_t *l) {
  return l ? part_rank_len(l->plan, l->rank) : 0;
}

int muster_loader_is_empty(const muster_loader_t *l) {
  return muster_loader_len(l) == 0;
}

const char *muster_loader_message(const muster_loader_t *l) {
  return l ? l->message : "";
}

void muster_loader_stats(muster_loader_t *l, muster_loader_stats_t *stats) {
  if (l == NULL || stats == NULL)
    return;
  pthread_mutex_lock(&l->mu);
  *stats = l->stats;
  stats->avg_load_time_us = l->loads ? (double)l->load_us / (double)l->loads : 0.0;
  int64_t alive = mono_us() - l->opened_us;
  stats->utilization = alive > 0 ? (double)l->busy_us / (double)alive : 0.0;
  stats->epoch = l->epoch;
  pthread_mutex_unlock(&l->mu);
}

/* ---- epochs and checkpoints ------------------------------------------------------ */

/* After a reset or restore that failed: the stream back at the caller's
 * position (l->epoch, l->consumed), so that the items the stopped thread had
 * prefetched are produced again rather than lost. */
static void stream_back_to_caller(muster_loader_t *l) {
  if (stream_set_epoch(l->stream, l->epoch) == MUSTER_OK)
    (void)stream_seek(l->stream, l->consumed);
}

/* MUSTER_OK, or the failure next reported (a load callback's, a head's), which
 * reset refuses to pass over: the rest of the failed epoch was never read. */
static muster_err_t reset_after_failure(muster_loader_t *l) {
  pthread_mutex_lock(&l->mu);
  muster_err_t err = l->at_end ? l->perr : MUSTER_OK;
  if (err != MUSTER_OK)
    loader_fail(l, err,
                "the epoch did not end, the loader failed (%.300s): restore a checkpoint "
                "(standalone) or open the loader again to go on",
                l->pmsg);
  pthread_mutex_unlock(&l->mu);
  return err;
}

static muster_err_t reset_coordinated(muster_loader_t *l) {
  pthread_mutex_lock(&l->mu);
  muster_err_t err = MUSTER_OK;
  if (l->finished)
    err = loader_fail(l, MUSTER_INVALID, "every epoch of the iteration is complete");
  else if (!l->at_end)
    err = loader_fail(l, MUSTER_INVALID,
                      "the epoch has not ended: a coordinated loader "
                      "moves on when the whole epoch is done");
  else {
    l->epoch++;
    l->at_end = false;
    l->consumed = 0;
    pthread_cond_broadcast(&l->cv);
  }
  if (err == MUSTER_OK && !l->threaded)
    l->pepoch = l->epoch;
  pthread_mutex_unlock(&l->mu);
  return err;
}

muster_err_t muster_loader_reset(muster_loader_t *l) {
  if (l == NULL)
    return MUSTER_INVALID;
  l->message[0] = '\0';
  muster_err_t err = reset_after_failure(l);
  if (err != MUSTER_OK)
    return err;
  if (l->coordinated)
    return reset_coordinated(l);
  thread_stop(l);
  err = stream_next_epoch(l->stream);
  if (err == MUSTER_OK) {
    l->epoch = stream_epoch(l->stream);
    l->at_end = false;
    l->consumed = 0;
  } else {
    stream_back_to_caller(l);
    loader_fail(l, err, "every epoch is done (epochs = %" PRIu64 ")",
                part_plan_config(l->plan)->epochs);
  }
  muster_err_t started = thread_start(l);
  return err != MUSTER_OK ? err : started;
}

/* Standalone: this rank's position as JSON text. */
static char *standalone_checkpoint(muster_loader_t *l) {
  char fp[17];
  snprintf(fp, sizeof fp, "%016" PRIx64, part_plan_fingerprint(l->plan));
  json_t *obj = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I}", "version", LOADER_CHECKPOINT_VERSION,
                          "mode", "standalone", "fingerprint", fp, "rank", (json_int_t)l->rank,
                          "epoch", (json_int_t)l->epoch, "consumed", (json_int_t)l->consumed);
  char *text = jdump(obj, JSON_COMPACT);
  json_decref(obj);
  return text;
}

muster_err_t muster_loader_get_checkpoint(muster_loader_t *l, char **text) {
  if (l == NULL)
    return MUSTER_INVALID;
  l->message[0] = '\0';
  if (text == NULL)
    return loader_fail(l, MUSTER_INVALID, "text: a place for the checkpoint is required");
  *text = NULL;
  if (!l->coordinated) {
    pthread_mutex_lock(&l->mu);
    *text = standalone_checkpoint(l);
    l->stats.checkpoints++;
    pthread_mutex_unlock(&l->mu);
    return *text ? MUSTER_OK : loader_fail(l, MUSTER_NOMEM, "out of memory");
  }
  return loader_coord_checkpoint(l, text);
}

/* MUSTER_OK when a standalone checkpoint's fingerprint `fp` and `rank` are this
 * loader's; else MUSTER_INVALID with a message saying which differs.  The fingerprint
 * covers the world size, so a checkpoint taken on another number of ranks lands here:
 * the message says where a resume on another number of ranks lives, since a standalone
 * position is one rank's place in one plan's list and cannot be dealt anew. */
static muster_err_t checkpoint_mismatch(muster_loader_t *l, const char *fp, int64_t rank) {
  char want[17];
  snprintf(want, sizeof want, "%016" PRIx64, part_plan_fingerprint(l->plan));
  if (strcmp(fp, want) != 0)
    return loader_fail(l, MUSTER_INVALID,
                       "the checkpoint is of another configuration (fingerprint %.16s there, %s "
                       "here): another dataset, seed, shuffle, strategy, world size or block "
                       "size. A standalone checkpoint resumes only the configuration and rank "
                       "that saved it; on another number of ranks, read through a coordinated "
                       "iteration and open with opts.checkpoint set to its checkpoint "
                       "(docs/iterations.md, \"Elastic resume\")",
                       fp, want);
  if (rank != (int64_t)l->rank)
    return loader_fail(l, MUSTER_INVALID,
                       "the checkpoint is rank %" PRId64 "'s, and this loader is rank %" PRIu32
                       ": a checkpoint resumes the rank that saved it",
                       rank, l->rank);
  return MUSTER_OK;
}

/* Reads the standalone checkpoint `text` into *epoch and *consumed, checked
 * against this loader's configuration and rank; MUSTER_INVALID with the
 * loader's message saying why not: a text that is not JSON (where the parser
 * stopped, in the words every JSON refusal of the library uses), JSON that is
 * not a standalone checkpoint, or the checkpoint of another configuration or
 * rank (checkpoint_mismatch). */
static muster_err_t checkpoint_read(muster_loader_t *l, const char *text, int64_t *epoch,
                                    int64_t *consumed) {
  char why[JPARSE_WHY];
  json_t *obj = jparse(text, strlen(text), why, sizeof why);
  if (obj == NULL)
    return loader_fail(l, MUSTER_INVALID, "text: not valid JSON: %s", why);
  const char *mode = json_string_value(json_object_get(obj, "mode"));
  const char *fp = json_string_value(json_object_get(obj, "fingerprint"));
  int64_t rank = -1;
  bool ok = mode && strcmp(mode, "standalone") == 0 && fp &&
            !client_get_int(obj, "rank", -1, &rank) && !client_get_int(obj, "epoch", -1, epoch) &&
            !client_get_int(obj, "consumed", -1, consumed) && *epoch >= 0 && *consumed >= 0;
  muster_err_t err =
      ok ? checkpoint_mismatch(l, fp, rank)
         : loader_fail(l, MUSTER_INVALID,
                       "text: not a standalone loader checkpoint: expected the JSON object "
                       "muster_loader_get_checkpoint gives, {\"mode\": \"standalone\", "
                       "\"fingerprint\", \"rank\", \"epoch\", \"consumed\"}");
  json_decref(obj); /* fp pointed into it */
  return err;
}

muster_err_t muster_loader_restore(muster_loader_t *l, const char *text) {
  if (l == NULL)
    return MUSTER_INVALID;
  l->message[0] = '\0';
  if (text == NULL)
    return loader_fail(l, MUSTER_INVALID, "text: the checkpoint to restore is required");
  if (l->coordinated)
    return loader_fail(l, MUSTER_INVALID,
                       "a coordinated loader restores when it opens: pass "
                       "the checkpoint in opts.checkpoint (and a new name)");
  int64_t epoch = -1, consumed = -1;
  muster_err_t read = checkpoint_read(l, text, &epoch, &consumed);
  if (read != MUSTER_OK)
    return read;
  thread_stop(l);
  muster_err_t err = stream_set_epoch(l->stream, (uint64_t)epoch);
  if (err == MUSTER_OK)
    err = stream_seek(l->stream, (uint64_t)consumed);
  if (err == MUSTER_OK) {
    l->epoch = (uint64_t)epoch;
    l->consumed = (uint64_t)consumed;
    l->at_end = false;
  } else {
    stream_back_to_caller(l);
    loader_fail(l, err, "the checkpoint's position is outside this configuration");
  }
  muster_err_t started = thread_start(l);
  return err != MUSTER_OK ? err : started;
}
