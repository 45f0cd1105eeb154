/*
 * loader_coord.c — a coordinated loader's side of the head: blocks leased,
 * acknowledged, heart-beaten, and what happens while the head does not
 * answer.  The threads, the ring and standalone loaders are in loader.c.
 *
 * Acks.  A block is finished when the caller asks for the item after its
 * last one: having asked again means it is done with the previous sample.
 * Finished blocks go to the ack queue; the producer sends the queue before
 * every lease request (so an epoch can end: the head ends it only when every
 * block is done) and whenever it waits.
 *
 * The head's silence.  The open's create-or-join, a lease request, an ack or
 * a checkpoint the head does not answer (down, restarting, or the reply lost
 * on the way) is sent again, at once and then after growing pauses, for up to
 * head_wait_ms; the head's state is on disk and the rank's leases keep their
 * deadlines.  A create sent again joins what it created; an ack sent again is
 * answered as a repeat.  A lease request is sent again with `held`: the
 * blocks a lost reply leased come back (without them the epoch would wait
 * for ever on blocks the rank's heartbeats keep alive), together with those
 * the loader already has (leased, not yet acknowledged: the `known` list),
 * which are skipped.
 */
#include "client/loader_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the head's silence ---------------------------------------------------------- */

typedef struct {
  int64_t since_us; /* the first failure; 0 before */
  int64_t pause_ms; /* before the next try */
} retry_t;

/* Waits up to `ms` unless the loader is stopping; false when it is. */
static bool retry_pause(muster_loader_t *l, int64_t ms) {
  int64_t until = mono_us() + ms * 1000;
  pthread_mutex_lock(&l->mu);
  for (int64_t left_us; !l->stop && (left_us = until - mono_us()) > 0;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ns = ts.tv_nsec + left_us * 1000;
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

bool loader_ack_push(muster_loader_t *l, uint64_t block, int64_t token) {
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

/* Puts back acks that were not sent (under mu): the producer gave up on a
 * silent head (and stops: loader_ack_flush sets perr), or stopped waiting
 * for it at close; close sends them again.  A queue of another epoch's acks
 * keeps its own (one epoch per request). */
static void ack_requeue(muster_loader_t *l, uint64_t epoch, const uint64_t *blocks,
                        const int64_t *tokens, size_t n) {
  if (l->nack > 0 && l->ack_epoch != epoch)
    return;
  for (size_t i = 0; i < n && loader_ack_push(l, blocks[i], tokens[i]); i++)
    l->ack_epoch = epoch;
}

/*
 * Sends the queued acks on `client` (called without mu).  A lost lease
 * (the block expired and went to another rank) is counted, not fatal: the
 * head keeps the block's one acknowledgement for the rank that holds it.
 * Returns MUSTER_OK or the transport's failure.
 */
muster_err_t loader_ack_flush(muster_loader_t *l, muster_client_t *client) {
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
  else
    ack_requeue(l, epoch, blocks, tokens, n);
  if (err != MUSTER_OK && err != MUSTER_LEASE_LOST && client == l->pclient &&
      l->perr == MUSTER_OK) { /* the producer is done: next reports it */
    l->perr = err;
    snprintf(l->pmsg, sizeof l->pmsg, "%s", muster_client_message(client));
  }
  l->acks_in_flight--;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  free(blocks);
  free(tokens);
  return err == MUSTER_LEASE_LOST ? MUSTER_OK : err;
}

/* Queues the ack of the block whose last item the caller took (under mu). */
void loader_finish_block(muster_loader_t *l) {
  if (l->has_finish && loader_ack_push(l, l->finish_block, l->finish_token))
    pthread_cond_broadcast(&l->cv);
  l->has_finish = false;
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
    size_t cap = ITER_MAX_INDICES / l->block_size;
    cap = cap < ITER_MAX_BATCH ? cap : ITER_MAX_BATCH;
    max = max < cap ? max : cap;
  }
  muster_err_t err =
      muster_iter_next(l->pclient, l->name, l->rank, l->pepoch, max, flags, &l->staged);
  return err == MUSTER_OK ? staged_keep_new(l, r->since_us != 0) : err;
}

/* Coordinated: the next item of the staged blocks, leasing more when they
 * are used up.  1: an item; 0: the epoch (or the iteration) ended; -1: failed. */
/* Takes the next index of the staged blocks; false when they are used up. */
static bool staged_take(muster_loader_t *l, item_t *it) {
  if (l->staged_block >= l->staged.count)
    return false;
  muster_iter_block_t *b = &l->staged.blocks[l->staged_block];
  uint64_t n = b->end - b->begin;
  *it = (item_t){.index = b->indices[l->staged_pos],
                 .block = b->block,
                 .token = b->token,
                 .last = l->staged_pos + 1 == n};
  if (++l->staged_pos == n) {
    l->staged_block++;
    l->staged_pos = 0;
  }
  return true;
}

/* After a `next`: counts the blocks taken over, waits as the head asked;
 * false when the stream ends (the epoch or the iteration did, or stop). */
static bool staged_settle(muster_loader_t *l) {
  for (size_t i = 0; i < l->staged.count; i++)
    if (l->staged.blocks[i].takeover)
      l->stats.blocks_taken_over++;
  if (l->staged.state == MUSTER_ITER_WAIT) {
    pause_ms(l, l->staged.retry_ms > 0 ? l->staged.retry_ms : 50);
  } else if (l->staged.state == MUSTER_ITER_EPOCH_END || l->staged.state == MUSTER_ITER_FINISHED) {
    pthread_mutex_lock(&l->mu);
    l->finished = l->staged.state == MUSTER_ITER_FINISHED;
    pthread_mutex_unlock(&l->mu);
    return false;
  }
  pthread_mutex_lock(&l->mu);
  bool stop = l->stop;
  pthread_mutex_unlock(&l->mu);
  return !stop;
}

int loader_coord_produce(muster_loader_t *l, item_t *it) {
  for (;;) {
    if (staged_take(l, it))
      return 1;
    muster_iter_next_free(&l->staged);
    l->staged_block = l->staged_pos = 0;
    pthread_mutex_lock(&l->mu);
    bool failed = l->perr != MUSTER_OK; /* an ack the head never took (keep_alive) */
    pthread_mutex_unlock(&l->mu);
    if (failed)
      return -1;
    muster_err_t err = loader_ack_flush(l, l->pclient);
    if (err == MUSTER_OK)
      err = call_retrying(l, l->pclient, next_call, NULL);
    if (err != MUSTER_OK)
      return producer_fail(l, err);
    l->last_call_us = mono_us();
    if (!staged_settle(l))
      return 0;
  }
}

/* Heart-beats when the producer has been quiet for a while (without mu). */
void loader_keep_alive(muster_loader_t *l) {
  pthread_mutex_lock(&l->mu);
  bool failed = l->perr != MUSTER_OK;
  pthread_mutex_unlock(&l->mu);
  if (!l->coordinated || failed)
    return;
  loader_ack_flush(l, l->pclient);
  if (mono_us() - l->last_call_us >= l->heartbeat_ms * 1000) {
    muster_iter_heartbeat(l->pclient, l->name, l->rank);
    l->last_call_us = mono_us();
  }
}

typedef struct {
  const muster_loader_opts_t *opts;
  char *json; /* the reply */
} open_call_t;

/* Creates or joins the iteration (a call_retrying call: sent again, it joins
 * what the lost reply's request created, as any other rank would). */
static muster_err_t open_call(muster_loader_t *l, const retry_t *r, void *arg) {
  (void)r;
  open_call_t *o = arg;
  return muster_iter_create(l->cclient, l->name, o->opts->config, o->opts->checkpoint, l->rank,
                            &o->json);
}

muster_err_t loader_coord_open(muster_loader_t *l, const muster_loader_opts_t *opts) {
  if (opts->name == NULL)
    return loader_fail(l, MUSTER_INVALID, "a coordinated loader needs opts.name");
  if ((l->name = strdup(opts->name)) == NULL)
    return loader_fail(l, MUSTER_NOMEM, "out of memory");
  char *why = NULL;
  muster_err_t err = muster_client_open(opts->url, opts->token, &l->pclient, &why);
  if (err == MUSTER_OK)
    err = muster_client_open(opts->url, opts->token, &l->cclient, &why);
  if (err != MUSTER_OK) {
    loader_fail(l, err, "%s", why ? why : muster_strerror(err));
    muster_free(why);
    return err;
  }
  l->head_wait_ms = opts->head_wait_ms;
  open_call_t o = {.opts = opts};
  err = call_retrying(l, l->cclient, open_call, &o);
  char *json = o.json;
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
  l->block_size = part_plan_config(l->plan)->block_size;
  l->per_request = opts->blocks_per_request ? opts->blocks_per_request : LOADER_DEFAULT_BLOCKS;
  l->last_call_us = mono_us();
  return MUSTER_OK;
}

/* The iteration's checkpoint into *(char **)arg (a call_retrying call). */
static muster_err_t checkpoint_call(muster_loader_t *l, const retry_t *r, void *arg) {
  (void)r;
  return muster_iter_checkpoint(l->cclient, l->name, arg);
}

muster_err_t loader_coord_checkpoint(muster_loader_t *l, char **text) {
  /* Every sample taken so far counts: finish the current block and make sure
   * each finished block's ack reached the head before asking for the state. */
  pthread_mutex_lock(&l->mu);
  loader_finish_block(l);
  pthread_mutex_unlock(&l->mu);
  muster_err_t err = loader_ack_flush(l, l->cclient);
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
