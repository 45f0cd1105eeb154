/*
 * worker_beat.c — muster_worker_beat_t: a worker's heartbeat sent by a
 * thread of its own (docs/client.md, "Writing a worker in C").
 *
 * The head counts a worker alive by its heartbeats alone: leasing,
 * completing and failing name the worker or its leases but do not count
 * (docs/api.md, "Workers"), so a program whose one thread runs a task for
 * longer than the worker's timeout would be declared gone midway.  This
 * thread beats every period with a handle of its own (handles are not
 * thread-safe), while the caller's thread leases and runs.  Each beat waits
 * at most one period for its reply: a later one is as good as none, and so
 * stopping never waits longer than that.
 */
#include "client/beat.h"
#include "client/client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct muster_worker_beat {
  muster_client_t *client; /* the thread's own handle */
  int64_t id;              /* the worker */
  beat_t beat;
  pthread_mutex_t mu;               /* guards what follows: the caller's thread writes progress
                                       and reads the outcome while the thread beats */
  char *progress;                   /* sent with every beat; NULL: none (the head keeps the last) */
  muster_err_t last;                /* the last beat's code; MUSTER_OK before the first */
  char message[CLIENT_MESSAGE_MAX]; /* its message */
};

#define WORKER_BEAT_PATH_MAX 128

/* One beat, its outcome kept for muster_worker_beat_last.  The progress is
 * copied first so that the caller may change it while the beat is sent. */
static void worker_beat_once(void *arg) {
  muster_worker_beat_t *b = arg;
  pthread_mutex_lock(&b->mu);
  char *progress = b->progress ? strdup(b->progress) : NULL; /* no memory: none sent */
  pthread_mutex_unlock(&b->mu);
  muster_err_t err = muster_worker_heartbeat(b->client, b->id, progress);
  free(progress);
  pthread_mutex_lock(&b->mu);
  b->last = err;
  snprintf(b->message, sizeof b->message, "%s", muster_client_message(b->client));
  pthread_mutex_unlock(&b->mu);
}

/* The timeout the head holds worker `id` to, by GET /v1/workers/ID on
 * `client`, into *timeout_ms. */
static muster_err_t worker_beat_timeout(muster_client_t *client, int64_t id, int64_t *timeout_ms) {
  char path[WORKER_BEAT_PATH_MAX];
  json_t *reply = NULL;
  muster_err_t err = client_path(client, path, sizeof path, "/v1/workers/%lld", (long long)id);
  if (err == MUSTER_OK)
    err = client_call(client, "GET", path, NULL, 0, &reply);
  if (err == MUSTER_OK &&
      (client_get_int(reply, "timeout_ms", 0, timeout_ms) != 0 || *timeout_ms <= 0))
    err = client_fail(client, MUSTER_PROTOCOL, "GET %s: the reply has no timeout_ms", path);
  json_decref(reply);
  return err;
}

/*
 * What start does on the caller's `client` before there is a thread: checks
 * the arguments, sends a first heartbeat (so that a worker that is gone is
 * told now, in the head's words, and one registered a while ago is not
 * declared gone before the first period ends), and turns a `period_ms` of
 * -1 into a third of the worker's timeout.
 */
static muster_err_t worker_beat_prepare(muster_client_t *client, int64_t id, int64_t *period_ms,
                                        muster_worker_beat_t **out) {
  if (out == NULL)
    return client_fail(client, MUSTER_INVALID, "out: a place for the heartbeat is required");
  if (id <= 0)
    return client_fail(client, MUSTER_INVALID,
                       "id: %lld, expected a registered worker's id (1 or more)", (long long)id);
  if (*period_ms == 0 || *period_ms < -1)
    return client_fail(client, MUSTER_INVALID,
                       "period_ms: %lld, expected 1 or more milliseconds, or -1 for a third of "
                       "the worker's timeout",
                       (long long)*period_ms);
  muster_err_t err = muster_worker_heartbeat(client, id, NULL);
  int64_t timeout_ms = 0;
  if (err == MUSTER_OK && *period_ms < 0 &&
      (err = worker_beat_timeout(client, id, &timeout_ms)) == MUSTER_OK)
    *period_ms = timeout_ms / 3 > 0 ? timeout_ms / 3 : 1;
  return err;
}

/* The thread's own handle on the URL and token of `client`; each request
 * waits at most `period_ms`, or the caller's timeout when it is shorter. */
static muster_err_t worker_beat_client(muster_client_t *client, int64_t period_ms,
                                       muster_client_t **out) {
  char *why = NULL;
  muster_err_t err = muster_client_open(client->base_url, client->token, out, &why);
  if (err != MUSTER_OK)
    client_fail(client, err, "%s", why ? why : muster_strerror(err));
  else
    muster_client_set_timeout(*out, client->timeout_ms > 0 && client->timeout_ms < period_ms
                                        ? client->timeout_ms
                                        : (long)period_ms);
  muster_free(why);
  return err;
}

muster_err_t muster_worker_beat_start(muster_client_t *client, int64_t id, int64_t period_ms,
                                      muster_worker_beat_t **out) {
  if (out)
    *out = NULL;
  if (client == NULL)
    return MUSTER_INVALID;
  muster_err_t err = worker_beat_prepare(client, id, &period_ms, out);
  if (err != MUSTER_OK)
    return err;
  muster_worker_beat_t *b = calloc(1, sizeof *b);
  if (b == NULL)
    return client_fail(client, MUSTER_NOMEM, "out of memory");
  b->id = id;
  pthread_mutex_init(&b->mu, NULL);
  err = worker_beat_client(client, period_ms, &b->client);
  if (err == MUSTER_OK && beat_start(&b->beat, period_ms, worker_beat_once, b) != MUSTER_OK)
    err = client_fail(client, MUSTER_NOMEM, "cannot start the heartbeat thread");
  if (err != MUSTER_OK) {
    muster_worker_beat_stop(b);
    return err;
  }
  client_ok(client);
  *out = b;
  return MUSTER_OK;
}

muster_err_t muster_worker_beat_progress(muster_worker_beat_t *beat, const char *progress) {
  if (beat == NULL)
    return MUSTER_INVALID;
  char *copy = NULL;
  if (progress != NULL) {
    json_t *checked = json_string(progress); /* what the heartbeat's body will need */
    if (checked == NULL)
      return MUSTER_INVALID;
    json_decref(checked);
    if ((copy = strdup(progress)) == NULL)
      return MUSTER_NOMEM;
  }
  pthread_mutex_lock(&beat->mu);
  free(beat->progress);
  beat->progress = copy;
  pthread_mutex_unlock(&beat->mu);
  return MUSTER_OK;
}

muster_err_t muster_worker_beat_last(muster_worker_beat_t *beat, char *message, size_t size) {
  if (beat == NULL) {
    if (message != NULL && size > 0)
      message[0] = '\0';
    return MUSTER_INVALID;
  }
  pthread_mutex_lock(&beat->mu);
  muster_err_t last = beat->last;
  if (message != NULL && size > 0)
    snprintf(message, size, "%s", beat->message);
  pthread_mutex_unlock(&beat->mu);
  return last;
}

void muster_worker_beat_stop(muster_worker_beat_t *beat) {
  if (beat == NULL)
    return;
  beat_stop(&beat->beat);
  muster_client_free(beat->client);
  pthread_mutex_destroy(&beat->mu);
  free(beat->progress);
  free(beat);
}
