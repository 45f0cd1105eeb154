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
 * them.
 *
 * Acks.  A block is finished when the caller asks for the item after its
 * last one: having asked again means it is done with the previous sample.
 * Finished blocks go to the ack queue; the producer sends the queue before
 * every lease request (so an epoch can end: the head ends it only when every
 * block is done) and whenever it waits.
 *
 * The head's silence.  A lease request or an ack the head does not answer
 * (down, restarting, or the reply lost on the way) is sent again, at once and
 * then after growing pauses, for up to head_wait_ms; the head's state is on
 * disk and the rank's leases keep their deadlines.  An ack sent again is
 * answered as a repeat.  A lease request is sent again with `held`: the
 * blocks a lost reply leased come back (without them the epoch would wait
 * for ever on blocks the rank's heartbeats keep alive), together with those
 * the loader already has (leased, not yet acknowledged: the `known` list),
 * which are skipped.
 */
#include "client/client_internal.h"
#include "client/iter_internal.h"
#include "client/jdump.h"
#include "core/stream.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOADER_MSG 512
#define LOADER_DEFAULT_BLOCKS 2
#define LOADER_CHECKPOINT_VERSION 1
#define LOADER_HEAD_WAIT_MS 600000
#define LOADER_RETRY_FIRST_MS 100 /* pauses between tries double up to ... */
#define LOADER_RETRY_MAX_MS 1000
#define LOADER_MAX_BATCH 1000           /* blocks per next: the head's limit */
#define LOADER_MAX_INDICES (1u << 20)   /* indices per next reply: the head's limit */

typedef struct {
  uint64_t index;
  void *sample;
  uint64_t block; /* coordinated: the block's number; 0 standalone */
  int64_t token;  /* coordinated: its lease token; 0 standalone */
  bool last;      /* the last item of its block */
  bool end;       /* the end-of-epoch marker */
} item_t;

struct muster_loader {
  /* set at open */
  uint32_t rank;
  bool coordinated, threaded;
  dataset_t *ds;
  part_plan_t *plan;
  stream_t *stream;          /* standalone: the producer's position */
  muster_client_t *pclient;  /* producer's handle (coordinated) */
  muster_client_t *cclient;  /* caller's handle (coordinated) */
  char *name;
  size_t per_request;
  int64_t heartbeat_ms;      /* between heartbeats while the producer waits */
  int64_t head_wait_ms;      /* how long a request the head does not answer is retried */
  uint32_t block_size;
  muster_load_fn load;
  muster_sample_free_fn free_sample;
  void *user;
  int64_t opened_us;
  pthread_t thread;
  bool thread_running;

  /* the producer's own state */
  muster_iter_next_t staged; /* leased blocks being pushed */
  /* its timings since they were last added to the shared counters */
  int64_t p_busy_us, p_load_us;
  uint64_t p_loads;
  size_t staged_block, staged_pos;
  uint64_t pepoch;           /* the epoch the producer works on */
  bool pdone;                /* it pushed the end marker of pepoch */
  int64_t last_call_us;      /* last request that counted as a heartbeat */

  /* shared, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  item_t *ring;
  size_t cap, head, count;
  bool pwaiting;             /* the producer waits for room (woken at half) */
  bool stop;
  uint64_t epoch;            /* the caller's epoch */
  bool finished;             /* coordinated: every epoch is complete */
  uint64_t *ack_blocks;
  int64_t *ack_tokens;
  size_t nack, ack_cap;
  uint64_t ack_epoch;
  int acks_in_flight;
  uint64_t *known;           /* blocks of known_epoch leased and not acknowledged */
  size_t nknown, known_cap;
  uint64_t known_epoch;
  muster_err_t perr;         /* the producer's failure, reported by next */
  char pmsg[LOADER_MSG];
  muster_loader_stats_t stats;
  int64_t load_us, busy_us;
  uint64_t loads;

  /* the caller's own state */
  bool has_finish;
  uint64_t finish_block;
  int64_t finish_token;
  bool at_end;
  uint64_t consumed;
  char message[LOADER_MSG];
};

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static muster_err_t loader_fail(muster_loader_t *l, muster_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static muster_err_t loader_fail(muster_loader_t *l, muster_err_t err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->message, sizeof l->message, fmt, ap);
  va_end(ap);
  return err;
}

void muster_loader_opts_init(muster_loader_opts_t *opts) {
  if (opts == NULL)
    return;
  memset(opts, 0, sizeof *opts);
  opts->blocks_per_request = LOADER_DEFAULT_BLOCKS;
  opts->head_wait_ms = LOADER_HEAD_WAIT_MS;
}

/* ---- the head's silence ---------------------------------------------------------- */

typedef struct {
  int64_t since_us; /* the first failure; 0 before */
  int64_t pause_ms; /* before the next try */
} retry_t;

/* Waits up to `ms` unless the loader is stopping; false when it is. */
static bool retry_pause(muster_loader_t *l, int64_t ms) {
  int64_t until = mono_us() + ms * 1000;
  pthread_mutex_lock(&l->mu);
  while (!l->stop && mono_us() < until) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + (until - mono_us()) * 1000;
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
  }
  bool stopping = l->stop;
  pthread_mutex_unlock(&l->mu);
  return !stopping;
}

/*
 * After a call failed with `err`: whether to send it again.  Only when the
 * head did not answer (MUSTER_NETWORK: no reply came; MUSTER_UNAVAILABLE: a
 * node agent or proxy in front of it says it is unreachable), for up to
 * head_wait_ms from the first failure, and not while the loader stops.  The
 * first retry goes at once (a reply lost once is common), later ones after
 * pauses growing to a second.
 */
static bool retry_again(muster_loader_t *l, retry_t *r, muster_err_t err) {
  if ((err != MUSTER_NETWORK && err != MUSTER_UNAVAILABLE) || l->head_wait_ms <= 0)
    return false;
  int64_t now = mono_us();
  if (r->since_us == 0) {
    r->since_us = now;
    r->pause_ms = LOADER_RETRY_FIRST_MS;
  } else {
    int64_t left_ms = l->head_wait_ms - (now - r->since_us) / 1000;
    if (left_ms <= 0 || !retry_pause(l, r->pause_ms < left_ms ? r->pause_ms : left_ms))
      return false;
    r->pause_ms = r->pause_ms * 2 < LOADER_RETRY_MAX_MS ? r->pause_ms * 2 : LOADER_RETRY_MAX_MS;
  }
  pthread_mutex_lock(&l->mu);
  l->stats.head_retries++;
  bool stopping = l->stop;
  pthread_mutex_unlock(&l->mu);
  return !stopping;
}

/* Once retries gave up: `err`, the handle's message saying for how long the
 * head was tried. */
static muster_err_t retry_gave_up(const retry_t *r, muster_client_t *client, muster_err_t err) {
  if (r->since_us == 0)
    return err;
  char first[CLIENT_MESSAGE_MAX];
  snprintf(first, sizeof first, "%s", muster_client_message(client));
  return client_fail(client, err, "%.400s (tried for %.1f s: opts.head_wait_ms)", first,
                     (double)(mono_us() - r->since_us) / 1e6);
}

/* Makes `call` until it succeeds or retry_again says to stop; the handle
 * keeps the last failure's message. */
static muster_err_t call_retrying(muster_loader_t *l, muster_client_t *client,
                                  muster_err_t (*call)(muster_loader_t *, const retry_t *, void *),
                                  void *arg) {
  retry_t r = {0};
  for (;;) {
    muster_err_t err = call(l, &r, arg);
    if (err == MUSTER_OK)
      return err;
    if (!retry_again(l, &r, err))
      return retry_gave_up(&r, client, err);
  }
}

/* ---- blocks leased and not acknowledged (under mu) ----------------------------------- */

static bool known_add(muster_loader_t *l, uint64_t epoch, uint64_t block) {
  if (l->nknown > 0 && l->known_epoch != epoch)
    l->nknown = 0; /* the old epoch's are all acknowledged or lost */
  l->known_epoch = epoch;
  if (l->nknown == l->known_cap) {
    size_t cap = l->known_cap ? l->known_cap * 2 : 16;
    uint64_t *k = realloc(l->known, cap * sizeof *k);
    if (k == NULL)
      return false;
    l->known = k;
    l->known_cap = cap;
  }
  l->known[l->nknown++] = block;
  return true;
}

static bool known_has(const muster_loader_t *l, uint64_t epoch, uint64_t block) {
  for (size_t i = 0; l->known_epoch == epoch && i < l->nknown; i++)
    if (l->known[i] == block)
      return true;
  return false;
}

static void known_drop(muster_loader_t *l, uint64_t epoch, uint64_t block) {
  for (size_t i = 0; l->known_epoch == epoch && i < l->nknown; i++)
    if (l->known[i] == block) {
      l->known[i] = l->known[--l->nknown];
      return;
    }
}

/* ---- the ack queue (under mu) ------------------------------------------------ */

static bool ack_push(muster_loader_t *l, uint64_t block, int64_t token) {
  if (l->nack == l->ack_cap) {
    size_t cap = l->ack_cap ? l->ack_cap * 2 : 16;
    uint64_t *b = realloc(l->ack_blocks, cap * sizeof *b);
    if (b)
      l->ack_blocks = b;
    int64_t *t = b ? realloc(l->ack_tokens, cap * sizeof *t) : NULL;
    if (t == NULL)
      return false;
    l->ack_tokens = t;
    l->ack_cap = cap;
  }
  l->ack_blocks[l->nack] = block;
  l->ack_tokens[l->nack++] = token;
  l->ack_epoch = l->epoch;
  return true;
}

typedef struct {
  muster_client_t *client;
  uint64_t epoch;
  const uint64_t *blocks;
  const int64_t *tokens;
  size_t n;
} ack_call_t;

/* One ack request (a call_retrying call: a repeat is answered as the first
 * was). */
static muster_err_t ack_call(muster_loader_t *l, const retry_t *r, void *arg) {
  (void)r;
  ack_call_t *a = arg;
  return muster_iter_ack(a->client, l->name, l->rank, a->epoch, a->blocks, a->tokens, a->n);
}

static muster_err_t ack_send(muster_loader_t *l, muster_client_t *client, uint64_t epoch,
                             const uint64_t *blocks, const int64_t *tokens, size_t n) {
  ack_call_t a = {client, epoch, blocks, tokens, n};
  return call_retrying(l, client, ack_call, &a);
}

/*
 * Sends the queued acks on `client` (called without mu).  A lost lease
 * (the block expired and went to another rank) is counted, not fatal: the
 * head keeps the block's one acknowledgement for the rank that holds it.
 * Returns MUSTER_OK or the transport's failure.
 */
static muster_err_t ack_flush(muster_loader_t *l, muster_client_t *client) {
  pthread_mutex_lock(&l->mu);
  size_t n = l->nack;
  uint64_t *blocks = l->ack_blocks, epoch = l->ack_epoch;
  int64_t *tokens = l->ack_tokens;
  if (n > 0) {
    l->ack_blocks = NULL;
    l->ack_tokens = NULL;
    l->nack = l->ack_cap = 0;
    l->acks_in_flight++;
  }
  pthread_mutex_unlock(&l->mu);
  if (n == 0)
    return MUSTER_OK;
  muster_err_t err = ack_send(l, client, epoch, blocks, tokens, n);
  size_t acked = err == MUSTER_OK ? n : 0;
  if (err == MUSTER_LEASE_LOST && n > 1) /* find the good ones: one by one */
    for (size_t i = 0; i < n; i++)
      if (ack_send(l, client, epoch, &blocks[i], &tokens[i], 1) == MUSTER_OK)
        acked++;
  pthread_mutex_lock(&l->mu);
  l->stats.blocks_acked += acked;
  if (err == MUSTER_OK || err == MUSTER_LEASE_LOST)
    for (size_t i = 0; i < n; i++)
      known_drop(l, epoch, blocks[i]);
  l->acks_in_flight--;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  free(blocks);
  free(tokens);
  return err == MUSTER_LEASE_LOST ? MUSTER_OK : err;
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

/* Waits up to `ms` on the condition (woken early by stop or acks). */
static void pause_ms(muster_loader_t *l, int64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  int64_t ns = ts.tv_nsec + ms * 1000000;
  ts.tv_sec += ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  pthread_mutex_lock(&l->mu);
  if (!l->stop && l->nack == 0)
    pthread_cond_timedwait(&l->cv, &l->mu, &ts);
  pthread_mutex_unlock(&l->mu);
}

/* Records the producer's failure (from the handle's message). */
static int producer_fail(muster_loader_t *l, muster_err_t err) {
  pthread_mutex_lock(&l->mu);
  l->perr = err;
  snprintf(l->pmsg, sizeof l->pmsg, "%s", muster_client_message(l->pclient));
  pthread_mutex_unlock(&l->mu);
  return -1;
}

/* Drops from l->staged the blocks the loader has already (a reply to a
 * `held` next lists them first) and records the others as known. */
static muster_err_t staged_keep_new(muster_loader_t *l, bool held) {
  muster_iter_next_t *st = &l->staged;
  size_t kept = 0;
  bool ok = true;
  pthread_mutex_lock(&l->mu);
  for (size_t i = 0; i < st->count; i++) {
    if (held && known_has(l, l->pepoch, st->blocks[i].block)) {
      free(st->blocks[i].indices);
      continue;
    }
    ok = ok && known_add(l, l->pepoch, st->blocks[i].block);
    st->blocks[kept++] = st->blocks[i];
  }
  st->count = kept;
  pthread_mutex_unlock(&l->mu);
  return ok ? MUSTER_OK : client_fail(l->pclient, MUSTER_NOMEM, "out of memory");
}

/* One lease request into l->staged (a call_retrying call): a retry goes with
 * `held` and room for the blocks the loader has (see the top of the file). */
static muster_err_t next_call(muster_loader_t *l, const retry_t *r, void *arg) {
  (void)arg;
  size_t max = l->per_request;
  int flags = MUSTER_ITER_INDICES;
  if (r->since_us != 0) {
    flags |= MUSTER_ITER_HELD;
    pthread_mutex_lock(&l->mu);
    max += l->nknown;
    pthread_mutex_unlock(&l->mu);
    size_t cap = LOADER_MAX_INDICES / l->block_size;
    cap = cap < LOADER_MAX_BATCH ? cap : LOADER_MAX_BATCH;
    max = max < cap ? max : cap;
  }
  muster_err_t err =
      muster_iter_next(l->pclient, l->name, l->rank, l->pepoch, max, flags, &l->staged);
  return err == MUSTER_OK ? staged_keep_new(l, r->since_us != 0) : err;
}

/* Coordinated: the next item of the staged blocks, leasing more when they
 * are used up.  1: an item; 0: the epoch (or the iteration) ended; -1: failed. */
static int produce_coordinated(muster_loader_t *l, item_t *it) {
  for (;;) {
    if (l->staged_block < l->staged.count) {
      muster_iter_block_t *b = &l->staged.blocks[l->staged_block];
      uint64_t n = b->end - b->begin;
      *it = (item_t){.index = b->indices[l->staged_pos], .block = b->block, .token = b->token,
                     .last = l->staged_pos + 1 == n};
      if (++l->staged_pos == n) {
        l->staged_block++;
        l->staged_pos = 0;
      }
      return 1;
    }
    muster_iter_next_free(&l->staged);
    l->staged_block = l->staged_pos = 0;
    muster_err_t err = ack_flush(l, l->pclient);
    if (err == MUSTER_OK)
      err = call_retrying(l, l->pclient, next_call, NULL);
    if (err != MUSTER_OK)
      return producer_fail(l, err);
    l->last_call_us = mono_us();
    for (size_t i = 0; i < l->staged.count; i++)
      if (l->staged.blocks[i].takeover)
        l->stats.blocks_taken_over++;
    if (l->staged.state == MUSTER_ITER_WAIT)
      pause_ms(l, l->staged.retry_ms > 0 ? l->staged.retry_ms : 50);
    else if (l->staged.state == MUSTER_ITER_EPOCH_END || l->staged.state == MUSTER_ITER_FINISHED) {
      pthread_mutex_lock(&l->mu);
      l->finished = l->staged.state == MUSTER_ITER_FINISHED;
      pthread_mutex_unlock(&l->mu);
      return 0;
    }
    pthread_mutex_lock(&l->mu);
    bool stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    if (stop)
      return 0;
  }
}

/* Produces up to `want` items into items[] (without mu), timed as one run in
 * the producer's counters; *made counts them.  A coordinated run ends early
 * where the blocks leased so far end: what it made goes out before the next
 * lease request waits on the head.  Returns 1 when the run is complete (all
 * `want` made, or the leased blocks used up), else what stopped it (0 or -1,
 * see produce_coordinated). */
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
      rc = produce_coordinated(l, it);
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

/* Heart-beats when the producer has been quiet for a while (without mu). */
static void keep_alive(muster_loader_t *l) {
  if (!l->coordinated)
    return;
  ack_flush(l, l->pclient);
  if (mono_us() - l->last_call_us >= l->heartbeat_ms * 1000) {
    muster_iter_heartbeat(l->pclient, l->name, l->rank);
    l->last_call_us = mono_us();
  }
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

static void *producer_main(void *arg) {
  muster_loader_t *l = arg;
  item_t batch[LOADER_PRODUCE_BATCH];
  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    if (l->pdone && l->epoch != l->pepoch) { /* the caller moved to the next epoch */
      l->pepoch = l->epoch;
      l->pdone = false;
    }
    if (l->pdone || l->count == l->cap || l->nack > 0) {
      if (l->nack == 0) {
        l->pwaiting = !l->pdone && l->count == l->cap;
        wait_heartbeat(l);
        l->pwaiting = false;
      }
      pthread_mutex_unlock(&l->mu);
      keep_alive(l);
      pthread_mutex_lock(&l->mu);
      continue;
    }
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

static muster_err_t open_coordinated(muster_loader_t *l, const muster_loader_opts_t *opts) {
  if (opts->name == NULL)
    return loader_fail(l, MUSTER_INVALID, "a coordinated loader needs opts.name");
  if ((l->name = strdup(opts->name)) == NULL ||
      muster_client_new(opts->url, opts->token, &l->pclient) != MUSTER_OK ||
      muster_client_new(opts->url, opts->token, &l->cclient) != MUSTER_OK)
    return loader_fail(l, MUSTER_INVALID, "cannot create a client for %s", opts->url);
  char *json = NULL;
  muster_err_t err = muster_iter_create(l->cclient, l->name, opts->config, opts->checkpoint,
                                        l->rank, &json);
  if (err != MUSTER_OK)
    return loader_fail(l, err, "%s", muster_client_message(l->cclient));
  json_t *obj = json_loads(json, 0, NULL);
  int64_t epoch = 0, lease_ms = 30000;
  client_get_int(obj, "epoch", 0, &epoch);
  client_get_int(obj, "lease_ms", 30000, &lease_ms);
  l->finished = json_is_true(json_object_get(obj, "finished"));
  json_decref(obj);
  muster_free(json);
  l->epoch = (uint64_t)epoch;
  l->heartbeat_ms = lease_ms / 3 > 0 ? lease_ms / 3 : 1;
  l->head_wait_ms = opts->head_wait_ms;
  l->block_size = part_plan_config(l->plan)->block_size;
  l->per_request = opts->blocks_per_request ? opts->blocks_per_request : LOADER_DEFAULT_BLOCKS;
  l->last_call_us = mono_us();
  return MUSTER_OK;
}

static muster_err_t loader_init(muster_loader_t *l, const muster_loader_opts_t *opts) {
  if (opts->config == NULL)
    return loader_fail(l, MUSTER_INVALID, "opts.config is required");
  muster_err_t err = iter_config_plan(opts->config, &l->ds, &l->plan, l->message,
                                      sizeof l->message);
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
  if (l->coordinated)
    return open_coordinated(l, opts);
  if (opts->checkpoint)
    return loader_fail(l, MUSTER_INVALID, "a standalone loader restores with "
                                          "muster_loader_restore after open");
  if (stream_create(l->plan, l->rank, &l->stream) != MUSTER_OK)
    return loader_fail(l, MUSTER_NOMEM, "out of memory");
  return MUSTER_OK;
}

muster_err_t muster_loader_open(const muster_loader_opts_t *opts, muster_loader_t **out,
                                char **message) {
  if (message)
    *message = NULL;
  if (out == NULL || opts == NULL)
    return MUSTER_INVALID;
  *out = NULL;
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

/* Queues the ack of the block whose last item the caller took (under mu). */
static void finish_block(muster_loader_t *l) {
  if (l->has_finish && ack_push(l, l->finish_block, l->finish_token))
    pthread_cond_broadcast(&l->cv);
  l->has_finish = false;
}

void muster_loader_close(muster_loader_t *l) {
  if (l == NULL)
    return;
  thread_stop(l);
  if (l->coordinated && l->cclient) {
    finish_block(l);
    ack_flush(l, l->cclient);
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
      keep_alive(l);
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
  finish_block(l);
  if (l->at_end)
    return MUSTER_OK;
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
  if (l == NULL || index == NULL || has == NULL)
    return MUSTER_INVALID;
  pthread_mutex_lock(&l->mu);
  muster_err_t err = next_locked(l, index, sample, has);
  pthread_mutex_unlock(&l->mu);
  return err;
}

/* One lock for the whole batch: with a prefetch thread, taking items one
 * lock at a time would cost more than computing them. */
muster_err_t muster_loader_next_batch(muster_loader_t *l, uint64_t *indices, void **samples,
                                      size_t max, size_t *got) {
  if (l == NULL || indices == NULL || got == NULL)
    return MUSTER_INVALID;
  *got = 0;
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

muster_err_t muster_loader_reset(muster_loader_t *l) {
  if (l == NULL)
    return MUSTER_INVALID;
  if (l->coordinated) {
    pthread_mutex_lock(&l->mu);
    muster_err_t err = MUSTER_OK;
    if (l->finished)
      err = loader_fail(l, MUSTER_INVALID, "every epoch of the iteration is complete");
    else if (!l->at_end)
      err = loader_fail(l, MUSTER_INVALID, "the epoch has not ended: a coordinated loader "
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
  thread_stop(l);
  muster_err_t err = stream_next_epoch(l->stream);
  if (err == MUSTER_OK) {
    l->epoch = stream_epoch(l->stream);
    l->at_end = false;
    l->consumed = 0;
  } else {
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

/* The iteration's checkpoint into *(char **)arg (a call_retrying call). */
static muster_err_t checkpoint_call(muster_loader_t *l, const retry_t *r, void *arg) {
  (void)r;
  return muster_iter_checkpoint(l->cclient, l->name, arg);
}

muster_err_t muster_loader_get_checkpoint(muster_loader_t *l, char **text) {
  if (l == NULL || text == NULL)
    return MUSTER_INVALID;
  *text = NULL;
  if (!l->coordinated) {
    pthread_mutex_lock(&l->mu);
    *text = standalone_checkpoint(l);
    l->stats.checkpoints++;
    pthread_mutex_unlock(&l->mu);
    return *text ? MUSTER_OK : loader_fail(l, MUSTER_NOMEM, "out of memory");
  }
  /* Every sample taken so far counts: finish the current block and make sure
   * each finished block's ack reached the head before asking for the state. */
  pthread_mutex_lock(&l->mu);
  finish_block(l);
  pthread_mutex_unlock(&l->mu);
  muster_err_t err = ack_flush(l, l->cclient);
  pthread_mutex_lock(&l->mu);
  while (l->acks_in_flight > 0)
    pthread_cond_wait(&l->cv, &l->mu);
  pthread_mutex_unlock(&l->mu);
  if (err == MUSTER_OK)
    err = call_retrying(l, l->cclient, checkpoint_call, text);
  if (err != MUSTER_OK)
    return loader_fail(l, err, "%s", muster_client_message(l->cclient));
  pthread_mutex_lock(&l->mu);
  l->stats.checkpoints++;
  pthread_mutex_unlock(&l->mu);
  return MUSTER_OK;
}

muster_err_t muster_loader_restore(muster_loader_t *l, const char *text) {
  if (l == NULL || text == NULL)
    return MUSTER_INVALID;
  if (l->coordinated)
    return loader_fail(l, MUSTER_INVALID, "a coordinated loader restores when it opens: pass "
                                          "the checkpoint in opts.checkpoint (and a new name)");
  json_t *obj = json_loads(text, 0, NULL);
  const char *mode = json_string_value(json_object_get(obj, "mode"));
  const char *fp = json_string_value(json_object_get(obj, "fingerprint"));
  int64_t rank = -1, epoch = -1, consumed = -1;
  char want[17];
  snprintf(want, sizeof want, "%016" PRIx64, part_plan_fingerprint(l->plan));
  bool ok = obj && mode && strcmp(mode, "standalone") == 0 && fp &&
            !client_get_int(obj, "rank", -1, &rank) && !client_get_int(obj, "epoch", -1, &epoch) &&
            !client_get_int(obj, "consumed", -1, &consumed) && epoch >= 0 && consumed >= 0;
  bool same = ok && strcmp(fp, want) == 0 && rank == l->rank;
  json_decref(obj); /* fp pointed into it */
  if (!ok)
    return loader_fail(l, MUSTER_INVALID, "not a standalone loader checkpoint");
  if (!same)
    return loader_fail(l, MUSTER_INVALID, "the checkpoint is of another configuration or rank");
  thread_stop(l);
  muster_err_t err = stream_set_epoch(l->stream, (uint64_t)epoch);
  if (err == MUSTER_OK)
    err = stream_seek(l->stream, (uint64_t)consumed);
  if (err == MUSTER_OK) {
    l->epoch = (uint64_t)epoch;
    l->consumed = (uint64_t)consumed;
    l->at_end = false;
  } else {
    loader_fail(l, err, "the checkpoint's position is outside this configuration");
  }
  muster_err_t started = thread_start(l);
  return err != MUSTER_OK ? err : started;
}
