/*
 * cache_http_internal.h — what the node cache's two halves share: the
 * requests it answers (cache_http.c: routing, the HEAD to the head, replies
 * from cached files) and the fetches from the head with the replies that
 * stream a level while it arrives (cache_fetch.c).  Both run on the agent's
 * event-loop thread; only a fetch's own thread runs elsewhere.
 */
#ifndef MUSTER_NODE_CACHE_HTTP_INTERNAL_H
#define MUSTER_NODE_CACHE_HTTP_INTERNAL_H

#include "node/agent.h"
#include "node/cache.h"

#include <stdint.h>

typedef enum { CREQ_BYTES, CREQ_PATH, CREQ_STATS } creq_kind_t;

/* One client request the cache handles. */
typedef struct creq {
  node_agent_t *a;
  h1_req_t *in; /* the client's request, held until it is answered */
  creq_kind_t kind;
  char scope[CACHE_NAME_MAX + 1], name[CACHE_NAME_MAX + 1];
  int64_t level; /* asked for, 0: the newest; after the HEAD: the level served */
  int refused;   /* the HEAD's status while the head is asked why it refused */
  uint64_t checksum;
  int64_t size;
  char expires[32]; /* the head's X-Muster-Expires-Ms */
  char *auth;       /* the client's Authorization header (copy) or NULL */
  fwd_conn_t *conn; /* the HEAD's connection while it runs */
  struct creq *next_waiter;
  /* CREQ_BYTES waiting for a fetch: its reply started before the fetch ended
   * (cache_http.c "Streaming") */
  int stream_fd;     /* the fetch's temporary file, read-only; -1: not streaming */
  int64_t sent;      /* bytes of it handed to the reply */
  int stream_broken; /* a piece could not be queued: the reply is cut at the end */
} creq_t;

/* A reply sending a cached file: its entry counts it as a reader (never
 * evicted meanwhile) until the reply is freed (port_on_free). */
typedef struct {
  cache_t *cache;
  cache_entry_t *entry;
} creader_t;

/* ---- cache_http.c ---- */

/* Counts a reader of entry `e` until `r`'s reply is freed. */
void creader_add(creq_t *r, cache_entry_t *e);

/* Frees `r` (its reply must have been sent). */
void creq_free(creq_t *r);
/* Answers `r` with the error envelope and frees it. */
void creq_error(creq_t *r, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Answers `r` as the stopping agent answers everyone (port_reply_stopping)
 * and frees it. */
void creq_stopping(creq_t *r);
/* Adds the headers every shared-data answer carries (X-Muster-Cache: `how`). */
void creq_add_headers(creq_t *r, const char *how);
/* Answers `r` from READY entry `e` and frees it: 0, or -1 when the file
 * turned out corrupt or gone (dropped; `r` is untouched). */
int creq_answer(creq_t *r, cache_entry_t *e, const char *how);
/* Answers a worker's path request `r` that the cache cannot keep a file for
 * (`reason`): 200 with "path": null and "cache": "uncached", so the worker
 * reads the level's bytes instead; frees `r`. */
void creq_send_uncached(creq_t *r, const char *reason);
/* Answers `r` (level, checksum and size known) from the cache, fetching the
 * level first when it is not there. */
void creq_serve(creq_t *r);
/* The checksum in the head's ETag ("\"16 hex digits\"", perhaps W/); 0 or -1. */
int creq_parse_etag(const char *etag, uint64_t *checksum);
/* Notes on `e` when the head said its level expires (r->expires), so that
 * the file goes then (cache_expire.c) rather than at eviction. */
void creq_note_expiry(const creq_t *r, cache_entry_t *e);

/* ---- cache_fetch.c ---- */

/* Starts fetching the level `r` asks for, with `r` as its first waiter. */
void cfetch_start(creq_t *r);
/* Adds `r` to the fetch running for FETCHING entry `e` (a reader of bytes
 * gets what has arrived at once). */
void cfetch_join(cache_entry_t *e, creq_t *r);
/* The cache's notify pipe is readable (an event callback; `arg`: the agent). */
void cfetch_on_notify(evutil_socket_t fd, short what, void *arg);
/* The agent stops: every fetch still running is told to end and joined
 * (CFETCH_STOP_JOIN_MS at most, for all), its waiters answered and its
 * entry dropped; one that ended before is stored as usual. */
void cfetch_stop_all(node_agent_t *a);

/* ---- cache_expire.c ---- */

/* Reads the head's X-Muster-Expires-Ms header value `text` (NULL: absent):
 * 1 with *ms set for a wall-clock time in ms, 0 when absent, -1 when it is
 * not a plain positive decimal number, after logging it (the caller treats
 * it as absent: an expiry guessed from a broken header would drop a level
 * early, or keep it for ever).  One reader for the HEAD before a fetch and
 * for the expiry check, so the two cannot disagree. */
int cexpire_parse(node_agent_t *a, const char *text, int64_t *ms);

/* Starts the timer that asks the head about cached levels past their expiry;
 * 0, or -1 after logging. */
int cexpire_start(node_agent_t *a);
/* The agent stops: frees the timer, so that no further question is asked.
 * The question in flight, registered with the forwarder (fwd_conn_set_owner),
 * ends with its reply or is cancelled by the forwarder's stop, so this and
 * port_drain / port_stop may come in either order. */
void cexpire_stop(node_agent_t *a);

#endif /* MUSTER_NODE_CACHE_HTTP_INTERNAL_H */
