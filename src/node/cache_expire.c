/*
 * cache_expire.c — gives back the disk of cached levels the head no longer
 * has (docs/shared-data.md "Node cache", "Expiry").
 *
 * A shared blob lives ttl_ms after its last update; then the head answers 404
 * for it and its sweep removes the head's files.  The node cache would keep
 * its copies until least-recently-used eviction, which under the 10 GiB
 * default may be never on a quiet node.  So each cached level remembers when
 * the head last said it expires (X-Muster-Expires-Ms of the HEAD before a
 * read, cache_entry_t.expires_ms), and once that time has passed on this
 * machine's clock the agent asks the head, with a HEAD of the level and its
 * own token:
 *
 *   404        the level expired or was deleted: its file goes (cache_drop_gone);
 *   200        it lives (an update refreshed the blob's ttl): the new expiry is
 *              noted, or, when that is past already by our clock (the head's
 *              clock is behind ours), the head is asked again a little later;
 *              another ETag means the level was made again with other bytes,
 *              so ours are stale and go too;
 *   otherwise  (no answer, 5xx, a refused token) asked again later.
 *
 * One question is in flight at a time and the levels due are asked about one
 * after the other, so a session's hundred levels expiring at once cost the
 * head a hundred small HEADs in a row, not at once.  A timer looks for levels
 * due every second.  Levels a restarted agent takes over from the directory
 * have no known expiry and are due at once; so are the older levels of a
 * blob when a newer one is stored (cache_recheck_older), since the head keeps
 * only its newest levels.  A client's read that the head
 * answers 404 removes the level without waiting (cache_http.c).  Everything
 * runs on the agent's event-loop thread.
 */
#include "node/cache_http_internal.h"

#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CEXPIRE_TICK_MS 1000   /* how often the timer looks for levels due */
#define CEXPIRE_RETRY_MS 10000 /* when to ask again after no answer, or a clock behind ours */

/* The question in flight (cache_t.expire_check): which level, as it was when
 * asked; the entry itself may be dropped or fetched anew meanwhile. */
typedef struct {
  node_agent_t *a;
  fwd_conn_t *conn;
  char scope[CACHE_NAME_MAX + 1], name[CACHE_NAME_MAX + 1];
  int64_t level;
  uint64_t checksum;
} cexpire_check_t;

/* Milliseconds of the wall clock: the head's expiry times are on its own. */
static int64_t cexpire_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cexpire_parse(node_agent_t *a, const char *text, int64_t *ms) {
  if (text == NULL)
    return 0;
  size_t digits = strspn(text, "0123456789");
  /* 18 digits cannot overflow int64_t; ms since 1970 have 13 for millennia. */
  if (digits == 0 || digits > 18 || text[digits] != '\0' || strtoll(text, NULL, 10) <= 0) {
    agent_log(a, "the head sent a malformed X-Muster-Expires-Ms (\"%.40s\"); taken as no expiry",
              text);
    return -1;
  }
  *ms = strtoll(text, NULL, 10);
  return 1;
}

/* Applies the head's answer (`status`, 0: none; `out` its reply) to the
 * level `chk` asked about, if it is still the one cached. */
static void cexpire_apply(const cexpire_check_t *chk, int status, struct evhttp_request *out) {
  cache_t *c = chk->a->cache;
  cache_entry_t *e = cache_find(c, chk->scope, chk->name, chk->level);
  if (e == NULL || e->state != CACHE_READY || e->checksum != chk->checksum)
    return; /* dropped or fetched anew meanwhile: nothing to do */
  int64_t now = cexpire_wall_ms();
  struct evkeyvalq *h = status == 200 ? evhttp_request_get_input_headers(out) : NULL;
  uint64_t etag = 0;
  if (status == 404 ||
      (h && creq_parse_etag(evhttp_find_header(h, "ETag"), &etag) == 0 && etag != e->checksum)) {
    cache_drop_gone(c, chk->scope, chk->name, chk->level);
    return;
  }
  if (h == NULL) {
    e->expires_ms = now + CEXPIRE_RETRY_MS;
    return;
  }
  int64_t at = 0;
  int named = cexpire_parse(chk->a, evhttp_find_header(h, "X-Muster-Expires-Ms"), &at);
  /* A head that names no expiry is not asked again until a read names one. */
  e->expires_ms = named <= 0 ? 0 : at > now ? at : now + CEXPIRE_RETRY_MS;
}

static void cexpire_on_reply(struct evhttp_request *out, void *arg) {
  cexpire_check_t *chk = arg;
  node_agent_t *a = chk->a;
  int status = out ? evhttp_request_get_response_code(out) : 0;
  if (status == 200)
    fwd_conn_put(a, chk->conn);
  else /* an error answer to a HEAD may carry a body: not reused */
    fwd_conn_discard(a, chk->conn);
  a->cache->expire_check = NULL;
  cexpire_apply(chk, status, out);
  free(chk);
  /* The next level due is asked about from the loop, not from here: this
   * may run inside evhttp_make_request when the connection fails at once.
   * A stopped cache (its timer gone) asks no more. */
  if (a->cache->expire_ev != NULL)
    event_active(a->cache->expire_ev, EV_TIMEOUT, 0);
}

/* The forwarder's word that the agent stops with the question in flight
 * (fwd_cancel_fn): it frees the connection and the request, whose reply
 * will never come; the question goes.  The cache may be stopped, or freed
 * already: the forwarder and the cache may stop in either order. */
static void cexpire_on_stop(void *owner) {
  cexpire_check_t *chk = owner;
  cache_t *c = chk->a->cache;
  if (c != NULL && c->expire_check == chk)
    c->expire_check = NULL;
  free(chk);
}

/* Asks the head whether READY entry `e` still exists; -1 when the question
 * could not be sent (out of memory). */
static int cexpire_ask(node_agent_t *a, const cache_entry_t *e) {
  cexpire_check_t *chk = calloc(1, sizeof *chk);
  fwd_conn_t *conn = chk ? fwd_conn_get(a) : NULL;
  struct evhttp_request *out = conn ? evhttp_request_new(cexpire_on_reply, chk) : NULL;
  if (out == NULL) {
    if (conn)
      fwd_conn_put(a, conn);
    free(chk);
    return -1;
  }
  *chk = (cexpire_check_t){.a = a, .conn = conn, .level = e->level, .checksum = e->checksum};
  snprintf(chk->scope, sizeof chk->scope, "%s", e->scope);
  snprintf(chk->name, sizeof chk->name, "%s", e->name);
  struct evkeyvalq *h = evhttp_request_get_output_headers(out);
  char value[600];
  if (a->cfg->token) {
    snprintf(value, sizeof value, "Bearer %s", a->cfg->token);
    evhttp_add_header(h, "Authorization", value);
  }
  fwd_add_host(a, h);
  snprintf(value, sizeof value, "/v1/shared/%s/%s?level=%lld", e->scope, e->name,
           (long long)e->level);
  a->cache->expire_check = chk;
  fwd_conn_set_owner(conn, cexpire_on_stop, chk);
  /* On failure evhttp_make_request has already called cexpire_on_reply (NULL). */
  evhttp_make_request(fwd_conn_evcon(conn), out, EVHTTP_REQ_HEAD, value);
  return 0;
}

/* The timer, or the end of the last question: asks about the next level due. */
static void cexpire_on_tick(evutil_socket_t fd, short what, void *arg) {
  node_agent_t *a = arg;
  cache_t *c = a->cache;
  (void)fd;
  (void)what;
  if (c->stopping || c->expire_check != NULL)
    return;
  int64_t now = cexpire_wall_ms();
  cache_entry_t *e = cache_next_due(c, now);
  if (e != NULL && cexpire_ask(a, e) != 0)
    e->expires_ms = now + CEXPIRE_RETRY_MS;
}

int cexpire_start(node_agent_t *a) {
  cache_t *c = a->cache;
  struct timeval tick = {CEXPIRE_TICK_MS / 1000, (CEXPIRE_TICK_MS % 1000) * 1000};
  c->expire_ev = event_new(a->base, -1, EV_PERSIST, cexpire_on_tick, a);
  if (c->expire_ev == NULL || event_add(c->expire_ev, &tick) != 0) {
    agent_log(a, "cannot set up the node cache's expiry timer: out of memory");
    return -1;
  }
  return 0;
}

void cexpire_stop(node_agent_t *a) {
  cache_t *c = a->cache;
  /* A question in flight is left alone: its reply, should the loop still
   * run, applies it as usual; else the forwarder's stop cancels it
   * (cexpire_on_stop), whichever of the two stops comes first. */
  if (c->expire_ev)
    event_free(c->expire_ev);
  c->expire_ev = NULL;
}
