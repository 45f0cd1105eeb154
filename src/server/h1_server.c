/*
 * h1_server.c — the HTTP/1.1 server's life: accepting connections, listening,
 * the activity windows of the flush policy, and freeing everything (h1.c has
 * requests, replies, reading and writing; see h1.h for the contract).
 */
#include "h1_internal.h"

#include <event2/event.h>
#include <event2/listener.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- accepting ---- */

static void h1_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg) {
  h1_server_t *s = arg;
  (void)l;
  (void)sa;
  (void)len;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  h1_conn_t *c = calloc(1, sizeof *c);
  if (c == NULL) {
    close(fd);
    return;
  }
  c->srv = s;
  c->fd = fd;
  c->last_ms = h1_now_ms();
  c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, h1_conn_on_read, c);
  c->wev = event_new(s->base, fd, EV_WRITE, h1_conn_on_write, c);
  if (c->rev == NULL || c->wev == NULL || event_add(c->rev, NULL) != 0) {
    if (c->rev)
      event_free(c->rev);
    if (c->wev)
      event_free(c->wev);
    close(fd);
    free(c);
    return;
  }
  c->next = s->conns;
  if (c->next)
    c->next->prev = c;
  s->conns = c;
  s->nconns++;
  if (s->accept_failing) {
    s->accept_failing = false;
    if (s->cfg.accept_resumed)
      s->cfg.accept_resumed(s->cfg.arg);
  }
}

/* Out of descriptors (or another accept error): pause accepting for a
 * moment rather than spin on a listening socket that stays readable. */
static void h1_accept_error(struct evconnlistener *l, void *arg) {
  h1_server_t *s = arg;
  int err = EVUTIL_SOCKET_ERROR();
  evconnlistener_disable(l);
  s->accept_failing = true;
  struct timeval tv = {0, 100 * 1000};
  event_add(s->accept_ev, &tv);
  if (s->cfg.accept_failed)
    s->cfg.accept_failed(err, s->cfg.arg);
}

static void h1_accept_again(evutil_socket_t fd, short what, void *arg) {
  h1_server_t *s = arg;
  (void)fd;
  (void)what;
  if (s->listener)
    evconnlistener_enable(s->listener);
}

h1_server_t *h1_server_new(struct event_base *base, const h1_config_t *cfg) {
  h1_server_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  s->cfg = *cfg;
  if (s->cfg.head_ms <= 0)
    s->cfg.head_ms = H1_HEAD_MS_DEFAULT;
  if (s->cfg.body_ms <= 0)
    s->cfg.body_ms = H1_BODY_MS_DEFAULT;
  s->base = base;
  s->lend.srv = s;
  s->reap_ev = event_new(base, -1, 0, h1_reap, s);
  s->resume_ev = event_new(base, -1, 0, h1_resume, s);
  s->accept_ev = event_new(base, -1, 0, h1_accept_again, s);
  s->idle_ev = event_new(base, -1, EV_PERSIST, h1_idle, s);
  s->ready_ev = event_new(base, -1, 0, h1_stream_on_ready, s);
  int64_t every = cfg->idle_ms / 4 < 1000 ? cfg->idle_ms / 4 : 1000;
  struct timeval tv = {.tv_sec = every / 1000, .tv_usec = (every % 1000) * 1000 + 1000};
  if (s->reap_ev == NULL || s->resume_ev == NULL || s->accept_ev == NULL || s->idle_ev == NULL ||
      s->ready_ev == NULL || event_add(s->idle_ev, &tv) != 0) {
    h1_server_free(s);
    return NULL;
  }
  return s;
}

int h1_server_listen(h1_server_t *s, const char *host, int port, char *err, size_t errlen) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *res = NULL;
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc != 0) {
    snprintf(err, errlen, "%s", gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  snprintf(err, errlen, "no address");
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
                    bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0)) {
      snprintf(err, errlen, "%s", strerror(errno));
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return -1;
  s->listener = evconnlistener_new(s->base, h1_accept, s,
                                   LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
  if (s->listener == NULL) {
    snprintf(err, errlen, "cannot watch the listening socket");
    close(fd);
    return -1;
  }
  evconnlistener_set_error_cb(s->listener, h1_accept_error);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
    return -1;
  return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
}

size_t h1_server_connections(const h1_server_t *s) {
  return s ? s->nconns : 0;
}

/* Moves the activity windows on to the one of `now_ms`. */
static void active_shift(h1_server_t *s, int64_t now_ms) {
  int64_t w = now_ms / H1_ACTIVE_WINDOW_MS;
  if (w == s->window)
    return;
  s->active_before = w == s->window + 1 ? s->active : 0;
  s->active = 0;
  s->window = w;
}

void h1_server_note_active(h1_server_t *s, h1_conn_t *c) {
  active_shift(s, h1_now_ms());
  if (c->seen_window != s->window) {
    c->seen_window = s->window;
    s->active++;
  }
}

size_t h1_server_active(h1_server_t *s) {
  if (s == NULL)
    return 0;
  active_shift(s, h1_now_ms());
  return s->active > s->active_before ? s->active : s->active_before;
}

uint64_t h1_server_wire_errors(const h1_server_t *s) {
  return s ? s->wire_errors : 0;
}

void h1_server_free(h1_server_t *s) {
  if (s == NULL)
    return;
  if (s->listener)
    evconnlistener_free(s->listener);
  h1_lend_forget(s);
  free(s->lend.slots);
  for (h1_conn_t *c = s->conns; c; c = c->next)
    h1_conn_kill(c);
  h1_reap(-1, 0, s);
  while (s->orphans) {
    h1_req_t *q = s->orphans;
    s->orphans = q->next;
    h1_req_free(q);
  }
  if (s->reap_ev)
    event_free(s->reap_ev);
  if (s->resume_ev)
    event_free(s->resume_ev);
  if (s->accept_ev)
    event_free(s->accept_ev);
  if (s->idle_ev)
    event_free(s->idle_ev);
  if (s->ready_ev)
    event_free(s->ready_ev);
  free(s);
}
