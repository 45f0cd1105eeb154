/*
 * loader_internal.h — the loader's state, shared by loader.c (threads, the
 * ring, standalone loaders) and loader_coord.c (leases, acks and the head's
 * silence of a coordinated loader).  Not a public interface.
 */
#ifndef MUSTER_LOADER_INTERNAL_H
#define MUSTER_LOADER_INTERNAL_H

#include "client/client_internal.h"
#include "client/iter_internal.h"
#include "core/stream.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define LOADER_MSG 512
#define LOADER_DEFAULT_BLOCKS 2
#define LOADER_CHECKPOINT_VERSION 1
#define LOADER_HEAD_WAIT_MS 600000
#define LOADER_RETRY_FIRST_MS 100 /* pauses between tries double up to ... */
#define LOADER_RETRY_MAX_MS 1000

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
  stream_t *stream;         /* standalone: the producer's position */
  muster_client_t *pclient; /* producer's handle (coordinated) */
  muster_client_t *cclient; /* caller's handle (coordinated) */
  char *name;
  size_t per_request;
  int64_t heartbeat_ms; /* between heartbeats while the producer waits */
  int64_t head_wait_ms; /* how long a request the head does not answer is retried */
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
  uint64_t pepoch;      /* the epoch the producer works on */
  bool pdone;           /* it pushed the end marker of pepoch */
  int64_t last_call_us; /* last request that counted as a heartbeat */

  /* shared, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  item_t *ring;
  size_t cap, head, count;
  bool pwaiting; /* the producer waits for room (woken at half) */
  bool stop;
  uint64_t epoch; /* the caller's epoch */
  bool finished;  /* coordinated: every epoch is complete */
  uint64_t *ack_blocks;
  int64_t *ack_tokens;
  size_t nack, ack_cap;
  uint64_t ack_epoch;
  int acks_in_flight;
  uint64_t *known; /* blocks of known_epoch leased and not acknowledged */
  size_t nknown, known_cap;
  uint64_t known_epoch;
  muster_err_t perr; /* the producer's failure, reported by next */
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

static inline int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Sets the loader's message; returns err. */
muster_err_t loader_fail(muster_loader_t *l, muster_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* loader_coord.c */
muster_err_t loader_coord_open(muster_loader_t *l, const muster_loader_opts_t *opts);
/* The next item of the leased blocks, leasing more when they are used up
 * (producer, without mu).  1: an item; 0: the epoch (or the iteration)
 * ended; -1: failed (perr and pmsg set). */
int loader_coord_produce(muster_loader_t *l, item_t *it);
/* Sends finished blocks' acks and heart-beats when due (without mu). */
void loader_keep_alive(muster_loader_t *l);
/* Queues the ack of the block whose last item the caller took (under mu). */
void loader_finish_block(muster_loader_t *l);
/* Sends the queued acks on `client` (without mu). */
muster_err_t loader_ack_flush(muster_loader_t *l, muster_client_t *client);
/* The iteration's checkpoint, every finished block acknowledged first. */
muster_err_t loader_coord_checkpoint(muster_loader_t *l, char **text);

#endif
