/*
 * h1_lend.c — replies held back for a WAL flush, and written by the thread
 * that ran it (h1.h, "replies held back for a flush").
 *
 * With --sync full a group's replies may leave only once its flush ended.
 * They used to be built and written on the loop after the flush thread woke
 * it; under load those writes (each wakes a client: a cross-CPU wake-up on
 * a virtual machine) were a quarter of the loop's time, and each reply
 * waited for the loop's wake-up too.  Now the loop builds the replies before
 * the flush, lends their connections, and the flush thread writes them the
 * moment fdatasync returns, while the loop goes on reading and executing the
 * next group.
 *
 * What the thread touches: the slots (filled before the hand-off, read-only
 * for the loop until the return) and, through their iovecs, the reply
 * buffers of requests that nothing frees or changes while their connection
 * is lent: conn_write returns at once for a lent connection (it alone
 * advances the queue or shuts the socket down), and the reap passes a lent
 * connection over (h1_conn_kill only marks it).  The hand-offs are the flush
 * thread's mutex one way and its pipe the other (syncer.c).
 */
#include "h1_internal.h"

#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void h1_lend_begin(h1_server_t *s) {
  h1_lend_t *l = &s->lend;
  if (l->out) /* one at a time: a second would wait for the first anyway */
    abort();
  l->lending = true;
  h1_cork(s);
}

void h1_lend_add(h1_req_t *q) {
  h1_lend_t *l = &q->srv->lend;
  h1_conn_t *c = q->conn;
  if (!l->lending || c == NULL)
    return;
  q->lent = true;
  if (c->in_lend)
    return;
  c->in_lend = c->lent = true;
  c->lend_slot = -1;
  c->lend_next = l->conns;
  l->conns = c;
}

/* Room for `n` slots; false when memory ran out (the loop writes them all). */
static bool lend_room(h1_lend_t *l, size_t n) {
  if (n <= l->cap)
    return true;
  size_t cap = l->cap ? l->cap : 16;
  while (cap < n)
    cap *= 2;
  h1_lend_slot_t *grown = realloc(l->slots, cap * sizeof *grown);
  if (grown == NULL)
    return false;
  l->slots = grown;
  l->cap = cap;
  return true;
}

h1_lend_t *h1_lend_end(h1_server_t *s) {
  h1_lend_t *l = &s->lend;
  l->lending = false;
  l->nslots = 0;
  size_t n = 0;
  for (h1_conn_t *c = l->conns; c; c = c->lend_next)
    n++;
  /* A connection writing already (its socket was full) or dying keeps its
   * order of things on the loop: it gets no slot. */
  if (n > 0 && lend_room(l, n)) {
    for (h1_conn_t *c = l->conns; c; c = c->lend_next) {
      if (c->dead || c->writing || c->lingering)
        continue;
      h1_lend_slot_t *slot = &l->slots[l->nslots];
      slot->niov = h1_conn_gather(c, slot->iov);
      if (slot->niov == 0)
        continue;
      slot->fd = c->fd;
      slot->wrote = 0;
      slot->err = 0;
      atomic_init(&slot->done, false);
      c->lend_slot = (int)l->nslots++;
    }
  }
  l->out = n > 0;
  h1_uncork(s); /* writes none of the lent connections */
  return l->out ? l : NULL;
}

void h1_lend_write(h1_lend_t *l) {
  for (size_t i = 0; i < l->nslots; i++) {
    h1_lend_slot_t *slot = &l->slots[i];
    ssize_t n;
    do
      n = writev(slot->fd, slot->iov, slot->niov);
    while (n < 0 && errno == EINTR);
    if (n >= 0)
      slot->wrote = n;
    else if (errno != EAGAIN && errno != EWOULDBLOCK)
      slot->err = errno;
    atomic_store_explicit(&slot->done, true, memory_order_release);
  }
}

/* Answers `q` anew: nothing of its first answer was written. */
static void lend_answer_again(h1_req_t *q, int status, const char *body) {
  free(q->rbody);
  q->rbody = NULL;
  free(q->extra);
  q->extra = NULL;
  q->extra_len = 0;
  if (q->file_fd >= 0)
    close(q->file_fd);
  q->file_fd = -1;
  q->file_off = q->file_len = 0;
  q->done = false;
  char *copy = strdup(body);
  h1_respond(q, status, "application/json", copy, copy ? strlen(copy) : 0, copy != NULL);
}

/* Clears the lent marks of the connection's requests; with `status`, they
 * are answered anew. */
static void lend_unmark(h1_conn_t *c, int status, const char *body) {
  c->lent = false;
  for (h1_req_t *q = c->first; q; q = q->next)
    if (q->lent) {
      q->lent = false;
      if (status != 0)
        lend_answer_again(q, status, body);
    }
}

/* Accounts what the writer wrote to `c` (its slot is taken); false when the
 * connection is done for: it failed, or it closes now. */
static bool lend_account(h1_conn_t *c, const h1_lend_slot_t *slot) {
  c->lend_slot = -1;
  if (slot->err != 0) {
    h1_conn_kill(c);
    return false;
  }
  if (slot->wrote > 0) {
    c->last_ms = h1_now_ms();
    if (!h1_conn_advance(c, (size_t)slot->wrote)) {
      h1_conn_linger(c);
      return false;
    }
  }
  return true;
}

bool h1_lend_reclaim(h1_conn_t *c) {
  h1_lend_t *l = &c->srv->lend;
  if (!l->out || c->lend_slot < 0)
    return false;
  const h1_lend_slot_t *slot = &l->slots[c->lend_slot];
  if (!atomic_load_explicit(&slot->done, memory_order_acquire))
    return false;
  lend_unmark(c, 0, NULL);
  return lend_account(c, slot) && !c->dead;
}

/* Takes the connection off the lend's list; a connection killed meanwhile
 * goes to the reap.  True when it lives. */
static bool lend_leave(h1_conn_t *c) {
  c->in_lend = false;
  if (c->reap_lent) {
    c->reap_lent = false;
    c->dead_next = c->srv->dead;
    c->srv->dead = c;
    event_active(c->srv->reap_ev, EV_TIMEOUT, 0);
  }
  return !c->dead;
}

void h1_lend_return(h1_lend_t *l, int status, const char *body) {
  h1_server_t *s = l->srv;
  h1_conn_t *c = l->conns;
  l->conns = NULL;
  h1_cork(s);
  while (c) {
    h1_conn_t *next = c->lend_next;
    if (c->lent)
      lend_unmark(c, status, body);
    bool account = c->lend_slot >= 0;
    if (lend_leave(c) && (!account || lend_account(c, &l->slots[c->lend_slot])))
      h1_conn_dirty(c); /* the rest goes out at the uncork */
    c->lend_slot = -1;
    c = next;
  }
  l->out = false;
  l->nslots = 0;
  h1_uncork(s);
}

void h1_lend_forget(h1_server_t *s) {
  h1_lend_t *l = &s->lend;
  for (h1_conn_t *c = l->conns; c; c = c->lend_next) {
    lend_unmark(c, 0, NULL);
    lend_leave(c);
    c->lend_slot = -1;
  }
  l->conns = NULL;
  l->out = l->lending = false;
  l->nslots = 0;
}
