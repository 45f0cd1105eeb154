/*
 * waiter.c — parked long-poll leases.
 *
 * A lease that finds nothing ready, and may wait, is parked here with a timer.
 * When a put, release or retry makes tasks ready in a queue (store hook), the
 * queue is marked; before the turn commits, waiter_serve leases to that
 * queue's waiters in arrival order, so the wake-up shares the put's commit.
 * Waiters are few (one per idle worker), so a list is enough.
 */
#include "waiter.h"
#include "lease.h"
#include "lease_retry.h"
#include "log.h"
#include "queue.h"
#include "update.h"
#include "worker.h"

#include <errno.h>
#include <event2/event.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct waiter {
  waiter_t *next, *prev;
  head_t *head;
  h1_req_t *req;
  struct event *timer;
  char queue[NAME_MAX_LEN + 1];
  int64_t worker, max;
  int64_t updates_after; /* -1: the lease wants no updates */
  char request[NAME_MAX_LEN + 1]; /* the request's key (lease_retry.h); "" for none */
};

static void waiter_unlink(head_t *h, waiter_t *w) {
  if (w->prev)
    w->prev->next = w->next;
  else
    h->waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  event_free(w->timer);
  free(w);
}

/* Answers a waiter with no lease (time is up, or the head stops) and frees it;
 * one that asked for updates gets those that are there. */
static void waiter_answer_empty(head_t *h, waiter_t *w) {
  jw_buf_t text = {0};
  size_t count = 0, at;
  fail_t f = {0};
  JW_ADD_LITERAL(&text, "{\"leases\":[]");
  at = text.len;
  if (w->updates_after >= 0 &&
      update_attach_text(h->st, w->queue, w->updates_after, &text, &count, &f)) {
    text.len = at; /* none, from where it asked */
    JW_ADD_LITERAL(&text, ",\"updates\":[],\"updates_last\":");
    jw_add_int(&text, w->updates_after);
  }
  JW_ADD_LITERAL(&text, "}");
  http_enqueue_text(h, w->req, 200, &text, false);
  waiter_unlink(h, w);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg) {
  waiter_t *w = arg;
  waiter_answer_empty(w->head, w);
}

void waiter_park(http_req_t *r, const char *queue, int64_t worker, int64_t max,
                 int64_t updates_after, const char *request, int64_t wait_ms) {
  head_t *h = r->head;
  waiter_t *w = calloc(1, sizeof *w);
  if (w == NULL) {
    http_reply_json(r, 200, json_pack("{s:[]}", "leases"));
    return;
  }
  *w = (waiter_t){
      .head = h, .req = r->req, .worker = worker, .max = max, .updates_after = updates_after};
  snprintf(w->queue, sizeof w->queue, "%s", queue);
  snprintf(w->request, sizeof w->request, "%s", request ? request : "");
  w->timer = evtimer_new(h->base, waiter_timeout, w);
  struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
  evtimer_add(w->timer, &tv);
  /* Append: the oldest waiter is served first. */
  waiter_t **tail = &h->waiters, *prev = NULL;
  while (*tail) {
    prev = *tail;
    tail = &(*tail)->next;
  }
  w->prev = prev;
  *tail = w;
  r->parked = true;
}

void waiter_mark_ready(head_t *h, const char *queue) {
  bool waited = false;
  for (waiter_t *w = h->waiters; w && !waited; w = w->next)
    waited = strcmp(w->queue, queue) == 0;
  if (!waited)
    return;
  for (size_t i = 0; i < h->ndirty; i++)
    if (strcmp(h->dirty[i], queue) == 0)
      return;
  if (h->ndirty == h->dirty_cap) {
    size_t cap = h->dirty_cap ? h->dirty_cap * 2 : 8;
    void *grown = realloc(h->dirty, cap * sizeof *h->dirty);
    if (grown == NULL)
      return;
    h->dirty = grown;
    h->dirty_cap = cap;
  }
  snprintf(h->dirty[h->ndirty++], NAME_MAX_LEN + 1, "%s", queue);
}

void waiter_mark_all(head_t *h) {
  for (waiter_t *w = h->waiters; w; w = w->next)
    waiter_mark_ready(h, w->queue);
}

/* Answers a waiter with the failure of its lease, and forgets it. */
static void waiter_fail(head_t *h, waiter_t *w, const fail_t *f) {
  json_t *err = json_pack("{s:{s:s, s:s}}", "error", "code", muster_err_name(f->code), "message",
                          fail_message(f));
  int status = muster_err_http_status(f->code);
  http_enqueue(h, w->req, status ? status : 500, err);
  waiter_unlink(h, w);
}

/* Leases for waiter `w` in the open request transaction, writing the reply
 * into `text` (lease_reply_text): MUSTER_OK with *n counting what it holds,
 * or the failure with *f set. */
static muster_err_t waiter_lease(head_t *h, const waiter_t *w, jw_buf_t *text,
                                 lease_reply_counts_t *n, fail_t *f) {
  queue_t q;
  lease_retry_t retry = {.request = w->request[0] ? w->request : NULL};
  *n = (lease_reply_counts_t){0};
  if (queue_load(h->st, w->queue, &q, f) ||
      (w->worker != 0 && lease_retry_check(h->st, w->worker, &retry, f)))
    return f->code;
  JW_ADD_LITERAL(text, "{");
  if (lease_reply_text(h->st, &q, w->worker, w->max, &retry, w->updates_after, text, n, f))
    return f->code;
  JW_ADD_LITERAL(text, "}");
  return MUSTER_OK;
}

/* Tries to lease for one waiter; returns false when the queue has no ready
 * task (and no update the waiter wants). */
static bool waiter_try(head_t *h, waiter_t *w) {
  if (h1_gone(w->req)) {
    /* Nobody would receive a lease: drop the connection and its request. */
    h1_drop(w->req);
    waiter_unlink(h, w);
    return true;
  }
  fail_t f = {0};
  if (store_request_begin(h->st, &f))
    return false;
  lease_reply_counts_t n;
  jw_buf_t text = {0};
  muster_err_t err = waiter_lease(h, w, &text, &n, &f);
  store_request_end(h->st, err == MUSTER_OK);
  if (err || (n.leased == 0 && n.updates == 0)) {
    jw_buf_free(&text);
    if (err == MUSTER_OK)
      return false;
    waiter_fail(h, w, &f);
    return true;
  }
  /* Leases of tasks on disk need no flush of their own; a waiter woken by a
   * put of this turn gets tasks that are not, and waits like the put, as does
   * one that brings updates (head_lease_on_disk). */
  http_enqueue_text(h, w->req, 200, &text,
                    n.leased > 0 && n.updates == 0 && head_lease_on_disk(h, n.max_task));
  waiter_unlink(h, w);
  return true;
}

void waiter_serve(head_t *h) {
  /* Serving may mark queues again (a lease that sends a task dead does not,
   * but be safe): take the list, then serve. */
  while (h->ndirty > 0) {
    char queue[NAME_MAX_LEN + 1];
    snprintf(queue, sizeof queue, "%s", h->dirty[--h->ndirty]);
    /* Once one waiter found no task, later ones find none either; those
     * that want updates may still be answered with updates alone. */
    bool tasks_left = true;
    waiter_t *w = h->waiters;
    while (w) {
      waiter_t *next = w->next;
      if (strcmp(w->queue, queue) == 0 && (tasks_left || w->updates_after >= 0) &&
          !waiter_try(h, w))
        tasks_left = false;
      w = next;
    }
  }
}

size_t waiter_count(const head_t *h) {
  size_t n = 0;
  for (const waiter_t *w = h->waiters; w; w = w->next)
    n++;
  return n;
}

void waiter_release_all(head_t *h) {
  while (h->waiters)
    waiter_answer_empty(h, h->waiters);
}
