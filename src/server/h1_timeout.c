/*
 * h1_timeout.c — the read deadlines of the head's HTTP/1.1 server (see
 * docs/design-notes.md, "The head's own HTTP/1.1 server"), and its idle
 * close (h1_idle).
 *
 * The idle timeout alone lets a client hold a connection and its buffers for
 * as long as it trickles bytes (slowloris).  Two deadlines bound reading a
 * request, both answered 408 in the JSON envelope, then a lingering close:
 *
 *   head  the request line and headers must be whole head_ms after the
 *         head's first byte; trickling does not extend it
 *   body  a body being read (whole, streamed or dropped) may go body_ms
 *         without a byte; each read extends it, so a slow but steady upload
 *         goes through
 *
 * Neither runs while the server owes the connection something: a request it
 * holds (a long-poll, a commit's reply), reading paused, or a "100 Continue"
 * not sent yet.  A keep-alive connection with nothing started is left to the
 * idle timeout; blank lines between requests start nothing.
 *
 * The cost stays off the hot path: a connection gets its timer the first
 * time a read ends with a request incomplete, and it is armed only when the
 * deadline of the moment comes before the one it is armed for.  A request
 * whose head and body come in one read touches no timer; a trickled head
 * arms it once; a long body only moves read_ms on (a store per read), and
 * the timer, firing before the deadline that moved, re-arms itself for it.
 * A timer that fires with nothing left to wait for does nothing.
 */
#include "h1_internal.h"

#include <event2/event.h>
#include <stdio.h>

typedef enum { WAIT_NONE, WAIT_HEAD, WAIT_BODY } h1_wait_t;

/* True when the unparsed input holds more than blank lines: a request head
 * has started.  It stops at the first such byte. */
static bool head_started(const h1_conn_t *c) {
  for (size_t i = c->in_off; i < c->in_len; i++)
    if (c->in[i] != '\r' && c->in[i] != '\n')
      return true;
  return false;
}

/* What the connection waits for from its client now. */
static h1_wait_t conn_waiting(const h1_conn_t *c) {
  if (c->dead || c->lingering || c->read_eof)
    return WAIT_NONE;
  switch (c->state) {
  case ST_HEAD:
    return head_started(c) ? WAIT_HEAD : WAIT_NONE;
  case ST_BODY:
  case ST_STREAM:
  case ST_DISCARD:
    return WAIT_BODY;
  default: /* ST_IGNORE: an error reply is queued or it lingers */
    return WAIT_NONE;
  }
}

/* True when the client may be waiting for the server, not the other way
 * round: reading is paused, a request of the connection is held (for a head:
 * what follows it waits, HTTP/1.1 answers in order), or the client was not
 * told to send its body yet ("100 Continue", or one a relay gives later). */
static bool conn_owes(const h1_conn_t *c, h1_wait_t w) {
  if (c->paused)
    return true;
  if (w == WAIT_BODY)
    return c->last != NULL && (c->last->continue_pending || c->last->continue_deferred);
  for (const h1_req_t *q = c->first; q; q = q->next)
    if (q->held)
      return true;
  return false;
}

/* The deadline of wait `w`; a head seen for the first time starts its clock.
 * While the server owes the connection something, the wait has not begun: it
 * is looked at again a whole limit later, and starts when nothing is owed. */
static int64_t conn_due(h1_conn_t *c, h1_wait_t w, int64_t now) {
  const h1_config_t *cfg = &c->srv->cfg;
  if (conn_owes(c, w)) {
    if (w == WAIT_HEAD)
      c->head_since_ms = 0;
    else
      c->read_ms = now;
    return now + (w == WAIT_HEAD ? cfg->head_ms : cfg->body_ms);
  }
  if (w == WAIT_BODY)
    return c->read_ms + cfg->body_ms;
  if (c->head_since_ms == 0)
    c->head_since_ms = now;
  return c->head_since_ms + cfg->head_ms;
}

static void conn_on_deadline(evutil_socket_t fd, short what, void *arg);

/* Arms the timer for `due` unless it fires by then already (it re-checks).
 * Without memory for a timer, the idle timeout still bounds the connection. */
static void conn_arm(h1_conn_t *c, int64_t due, int64_t now) {
  if (c->deadline_ms != 0 && c->deadline_ms <= due)
    return;
  if (c->deadline_ev == NULL) {
    c->deadline_ev = evtimer_new(c->srv->base, conn_on_deadline, c);
    if (c->deadline_ev == NULL)
      return;
  }
  int64_t in_ms = due > now ? due - now : 1;
  struct timeval tv = {.tv_sec = in_ms / 1000, .tv_usec = (in_ms % 1000) * 1000};
  if (evtimer_add(c->deadline_ev, &tv) == 0)
    c->deadline_ms = due;
}

void h1_conn_watch(h1_conn_t *c) {
  h1_wait_t w = conn_waiting(c);
  if (w == WAIT_NONE)
    return;
  int64_t now = h1_now_ms();
  conn_arm(c, conn_due(c, w, now), now);
}

/* A streamed body (STREAM, DISCARD) stalled.  Its request was dispatched
 * after its head: while the handler still holds it, it becomes an orphan (its
 * sink hears H1_BODY_GONE, as when the client goes away) and the server
 * answers 408 in its place.  Answered already, it has its reply: the
 * connection only closes after it. */
static void stream_timeout(h1_conn_t *c, const char *msg) {
  h1_req_t *q = c->last;
  if (q != NULL && q->held) {
    h1_queue_pop_last(c);
    if (c->holding == q)
      c->holding = NULL;
    h1_req_orphan(q);
    if (!c->dead)
      h1_conn_fail(c, 408, MUSTER_BAD_REQUEST, msg);
    return;
  }
  c->srv->wire_errors++;
  if (q != NULL)
    q->close = true;
  c->state = ST_IGNORE;
  h1_conn_dirty(c); /* lingers once what is queued is written */
}

/* The deadline of wait `w` passed: 408, and the connection closes. */
static void conn_timeout(h1_conn_t *c, h1_wait_t w) {
  const h1_config_t *cfg = &c->srv->cfg;
  char msg[160];
  if (w == WAIT_HEAD) {
    snprintf(msg, sizeof msg, "the request head did not arrive whole within %lld ms",
             (long long)cfg->head_ms);
    h1_conn_fail(c, 408, MUSTER_BAD_REQUEST, msg);
    return;
  }
  snprintf(msg, sizeof msg, "no byte of the request body arrived for %lld ms",
           (long long)cfg->body_ms);
  if (c->state != ST_BODY) {
    stream_timeout(c, msg);
    return;
  }
  h1_req_free(h1_queue_pop_last(c)); /* read, not dispatched */
  h1_conn_fail(c, 408, MUSTER_BAD_REQUEST, msg);
}

/* The timer fired: the connection timed out, or its deadline moved on (a
 * body that progressed, a head that completed and another that began, a wait
 * that has not begun while the server owes) and the timer re-arms for it. */
static void conn_on_deadline(evutil_socket_t fd, short what, void *arg) {
  h1_conn_t *c = arg;
  (void)fd;
  (void)what;
  c->deadline_ms = 0;
  h1_wait_t w = conn_waiting(c);
  if (w == WAIT_NONE)
    return;
  int64_t now = h1_now_ms();
  int64_t due = conn_due(c, w, now);
  if (due > now) {
    conn_arm(c, due, now);
    return;
  }
  h1_server_t *s = c->srv;
  h1_cork(s);
  conn_timeout(c, w);
  h1_uncork(s);
}

/* ---- the idle close ---- */

/* True when a handler holds one of the connection's requests: it is waiting
 * for the server, not idle (but for a streamed reply that waits for its
 * client to read). */
static bool conn_busy(const h1_conn_t *c) {
  for (const h1_req_t *q = c->first; q; q = q->next)
    if (q->held && !h1_stream_waits_for_client(q))
      return true;
  return false;
}

/* Closes connections that made no progress for idle_ms while the server owed
 * them nothing. */
void h1_idle(evutil_socket_t fd, short what, void *arg) {
  h1_server_t *s = arg;
  (void)fd;
  (void)what;
  int64_t now = h1_now_ms();
  for (h1_conn_t *c = s->conns; c; c = c->next)
    if (!c->dead && ((c->lingering && now > c->linger_ms) ||
                     (now - c->last_ms > s->cfg.idle_ms && !conn_busy(c))))
      h1_conn_kill(c);
}
