/*
 * shared_cancel.c — ending a shared-data download from another thread
 * (shared_cancel.h).
 *
 * libcurl opens and closes the transfer's sockets through the cancel
 * (CURLOPT_OPENSOCKETFUNCTION, CURLOPT_CLOSESOCKETFUNCTION), so the cancel
 * knows which descriptors are the transfer's while they are: a firing
 * shuts them down under the same lock a close takes, and never touches a
 * descriptor number that was closed and perhaps reused meanwhile.  A
 * shutdown(2) wakes the poll libcurl waits in, which then reads the end of
 * the stream and gives up on a transfer cut short.
 */
#include "client/client_internal.h"
#include "client/shared_cancel.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define SHARED_CANCEL_SOCKETS 4 /* sockets a transfer may have open at once (happy eyeballs) */

struct shared_cancel {
  pthread_mutex_t lock; /* orders a firing with the opening and closing of sockets */
  bool fired;
  /* the transfer's open sockets; CURL_SOCKET_BAD: a free slot (a socket
   * beyond these is ended by the progress callback's check alone) */
  curl_socket_t sockets[SHARED_CANCEL_SOCKETS];
};

shared_cancel_t *shared_cancel_new(void) {
  shared_cancel_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  pthread_mutex_init(&c->lock, NULL);
  for (int i = 0; i < SHARED_CANCEL_SOCKETS; i++)
    c->sockets[i] = CURL_SOCKET_BAD;
  return c;
}

void shared_cancel_free(shared_cancel_t *c) {
  if (c == NULL)
    return;
  pthread_mutex_destroy(&c->lock);
  free(c);
}

void shared_cancel_fire(shared_cancel_t *c) {
  pthread_mutex_lock(&c->lock);
  c->fired = true;
  for (int i = 0; i < SHARED_CANCEL_SOCKETS; i++)
    if (c->sockets[i] != CURL_SOCKET_BAD)
      shutdown(c->sockets[i], SHUT_RDWR);
  pthread_mutex_unlock(&c->lock);
}

bool shared_cancel_fired(shared_cancel_t *c) {
  pthread_mutex_lock(&c->lock);
  bool fired = c->fired;
  pthread_mutex_unlock(&c->lock);
  return fired;
}

/* libcurl's socket opener: none once fired (the transfer fails to connect). */
static curl_socket_t shared_cancel_open(void *arg, curlsocktype purpose,
                                        struct curl_sockaddr *address) {
  shared_cancel_t *c = arg;
  (void)purpose;
  curl_socket_t s = CURL_SOCKET_BAD;
  pthread_mutex_lock(&c->lock);
  if (!c->fired)
    s = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  for (int i = 0; s != CURL_SOCKET_BAD && i < SHARED_CANCEL_SOCKETS; i++)
    if (c->sockets[i] == CURL_SOCKET_BAD) {
      c->sockets[i] = s;
      break;
    }
  pthread_mutex_unlock(&c->lock);
  return s;
}

/* libcurl's socket closer: forgets the socket, then closes it, under the lock. */
static int shared_cancel_close(void *arg, curl_socket_t s) {
  shared_cancel_t *c = arg;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < SHARED_CANCEL_SOCKETS; i++)
    if (c->sockets[i] == s)
      c->sockets[i] = CURL_SOCKET_BAD;
  int rc = close(s);
  pthread_mutex_unlock(&c->lock);
  return rc;
}

void shared_cancel_setopt(CURL *curl, shared_cancel_t *c) {
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, shared_cancel_open);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, c);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETFUNCTION, shared_cancel_close);
  curl_easy_setopt(curl, CURLOPT_CLOSESOCKETDATA, c);
}
