/*
 * h1_internal.h — what the parts of the head's HTTP/1.1 server share: h1.c
 * (requests, replies, connections, reading and writing), h1_parse.c (request
 * heads, body framing, the parse loop), h1_timeout.c (read deadlines, the
 * idle close), h1_lend.c (replies held back for a flush), h1_stream.c
 * (streamed bodies and replies) and h1_server.c (accepting, listening, the
 * server's life).
 * Not for use outside them.
 */
#ifndef MUSTER_SERVER_H1_INTERNAL_H
#define MUSTER_SERVER_H1_INTERNAL_H

#include "h1.h"
#include "muster.h"

#include <event2/util.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#define H1_READ_SIZE (64 * 1024)    /* bytes asked of one read */
#define H1_STREAM_READ (256 * 1024) /* the same while a body streams */
#define H1_MAX_INFLIGHT 64          /* requests queued before reading pauses */
/* Bytes of replies in memory that a connection's client has not read yet
 * (h1_conn_t.out_bytes) at which reading its next requests pauses, until
 * they are below half of it.  Linux grows a socket's send buffer up to 4 MiB
 * (net.ipv4.tcp_wmem): a client that reads as it goes keeps the head's queue
 * near empty and never meets this; one that pipelines and does not read makes
 * the head hold this much, plus one reply, instead of 64 replies. */
#define H1_OUT_HIGH (4u << 20)
#define H1_MAX_LINE 1024            /* a chunk-size or trailer line */
#define H1_MAX_IOV 64               /* iovecs per writev */
#define H1_SEGS 5                   /* status+headers, extra headers, CRLF, body, newline */

typedef struct h1_conn h1_conn_t;

typedef enum { ST_HEAD, ST_BODY, ST_STREAM, ST_DISCARD, ST_IGNORE } h1_conn_state_t;
typedef enum { CH_SIZE, CH_DATA, CH_DATA_END, CH_TRAILER } h1_chunk_state_t;

/* Where a body ends. */
typedef struct {
  bool chunked;
  int64_t left; /* bytes left of the body (length) or of the chunk (chunked) */
  h1_chunk_state_t cs;
  int64_t drop_left; /* h1_body_drop: body bytes still to drop before the connection
                      * closes instead; -1: no bound */
} h1_frame_t;

typedef struct {
  const char *name, *value;
} h1_hdr_t;

/* A piece of a streamed reply's body (h1_stream.c): bytes [off, end) of
 * `bytes` (fd -1), or of file `fd` (owned), sent with sendfile. */
typedef struct h1_piece h1_piece_t;
struct h1_piece {
  h1_piece_t *next;
  int fd;
  int64_t off, end;
  char bytes[];
};

/* A streamed reply's body (h1_respond_start). */
typedef struct {
  h1_piece_t *first, *last; /* queued, in order; the first perhaps partly written */
  size_t queued;            /* bytes of the pieces not written yet */
  int64_t left;             /* bytes of the announced length still to come; -1: none */
  bool chunked;             /* each piece goes as a chunk, the end as the last one */
  bool no_body;             /* a HEAD's, or a status without one: pieces are dropped */
  bool ended;               /* h1_respond_end or _abort: no piece comes any more */
  bool cut;                 /* the body broke: the connection closes after it */
  void (*ready)(void *arg); /* h1_respond_wait's callback, NULL: none */
  void *ready_arg;
  bool ready_listed; /* on the server's ready list, its event pending */
  h1_req_t *ready_next;
} h1_stream_t;

struct h1_req {
  h1_req_t *next; /* the connection's queue, or the server's orphans */
  h1_server_t *srv;
  h1_conn_t *conn; /* NULL once orphaned */
  const char *method, *path, *query;
  h1_hdr_t *hdrs;
  size_t nhdrs;
  char *body; /* NUL-terminated; in the block, or malloc'ed when body_owned */
  size_t body_len, body_cap;
  bool body_owned;
  int64_t length; /* announced Content-Length; -1 chunked */
  bool http10, keep_alive, expect_continue, is_head;
  bool held;               /* dispatched, not answered or dropped yet */
  bool done;               /* the reply is built */
  bool close;              /* the connection closes after this reply */
  bool continue_pending;   /* "100 Continue" goes out when this request comes first */
  bool continue_deferred;  /* the client waits for "100 Continue", which the sink gives
                            * later (h1_body_relay, h1_body_continue) */
  bool streamed;           /* dispatched before its body */
  bool lent;               /* answered while lending (h1_lend_begin), not returned yet */
  size_t out_left;         /* bytes of its reply in memory not written yet (h1_expect_reply,
                            * then its status line, headers and body; not a file's, not a
                            * streamed body's): counted in its connection's out_bytes */
  h1_body_data_fn on_data; /* the sink of a streamed body, while attached */
  h1_body_end_fn on_end;
  void *sink;
  const void *note;           /* the dispatcher's (h1_set_note) */
  void (*on_free)(void *arg); /* h1_on_free's */
  void *free_arg;
  /* the reply */
  h1_stream_t *stream; /* a streamed reply's body (h1_stream.c), NULL: a whole reply */
  char *extra; /* handler headers, "Name: value\r\n"..., malloc'ed */
  size_t extra_len;
  char *rbody;
  int file_fd;
  int64_t file_off, file_len;
  struct iovec seg[H1_SEGS];
  int nseg, segi; /* segments, and the first not wholly written */
  char line[320]; /* status line and the standard headers */
  char head[];    /* the request head, split in place */
};

struct h1_conn {
  h1_server_t *srv;
  h1_conn_t *next, *prev; /* the server's connections */
  h1_conn_t *dirty_next;  /* the server's list of connections to write */
  h1_conn_t *dead_next;   /* the server's list of connections to free */
  h1_conn_t *resume_next; /* the server's list of connections to parse again */
  h1_conn_t *lend_next;   /* the lend's connections (h1_lend.c) */
  int fd;
  struct event *rev, *wev;
  char *in;
  size_t in_off, in_len, in_cap, head_scan;
  h1_conn_state_t state;
  h1_frame_t frame;
  h1_req_t *first, *last; /* the queue, in request order */
  h1_req_t *holding;      /* a parked request (h1_hold): the next waits for its answer */
  size_t nq;
  size_t out_bytes; /* the out_left of its requests: from H1_OUT_HIGH on, no further
                     * request is read (h1_parse.c) */
  size_t cont_off; /* bytes of "100 Continue" written for the first request */
  int64_t last_ms; /* the last read or write progress */
  /* Read deadlines (h1_timeout.c).  read_ms: the last read that brought
   * bytes (or the moment "100 Continue" went out); head_since_ms: when the
   * head being read was first seen, 0 when none is; deadline_ms: when the
   * timer is armed to fire, 0 when it is not; the timer is made when first
   * needed. */
  int64_t read_ms, head_since_ms, deadline_ms;
  struct event *deadline_ev;
  int64_t seen_window; /* the last activity window it sent a request in */
  int64_t linger_ms;   /* lingering: closed when the client has not by then */
  bool read_eof, dead, dirty, writing, paused, lingering, resuming;
  bool body_paused; /* paused by a streamed body's sink (h1_body_pause): only
                     * h1_body_resume (or h1_body_refuse) reads on */
  bool reset; /* closed with a reset, not a lingering close: a body that ends
               * with the connection was cut (h1_respond_abort) */
  /* Lending (h1_lend.c).  in_lend: on the lend's list, not freed until
   * h1_lend_return (reap_lent: it died meanwhile and the reap passed it
   * over); lent: the loop writes nothing to it, until the return or until
   * the writer is done with its slot (h1_lend_reclaim); lend_slot: its slot
   * in the lend, -1: none or taken back. */
  bool in_lend, lent, reap_lent;
  int lend_slot;
};

/* What one connection's writer is to write (h1_lend.c). */
typedef struct {
  int fd, niov;
  ssize_t wrote;    /* bytes written, 0: none (not tried, or the socket was full) */
  int err;          /* the write's errno when it failed, else 0 */
  atomic_bool done; /* the writer is done with the slot (release; then `wrote`, `err`) */
  struct iovec iov[H1_MAX_IOV];
} h1_lend_slot_t;

struct h1_lend {
  h1_server_t *srv;
  h1_conn_t *conns;      /* the connections lent */
  h1_lend_slot_t *slots; /* the writes of those ready for one (grown, kept) */
  size_t nslots, cap;
  bool lending; /* between h1_lend_begin and h1_lend_end */
  bool out;     /* between h1_lend_end and h1_lend_return */
};

struct h1_server {
  h1_config_t cfg;
  struct event_base *base;
  struct evconnlistener *listener;
  struct event *reap_ev, *idle_ev, *resume_ev, *accept_ev, *ready_ev;
  h1_conn_t *conns, *dirty, *dead, *resume;
  h1_req_t *orphans;
  h1_req_t *ready; /* streamed replies whose h1_respond_wait callback is due */
  size_t nconns;
  bool accept_failing;  /* accept() failed, and none succeeded since */
  uint64_t wire_errors; /* requests refused by the server itself */
  /* Connections that sent a request in the current and the previous window
   * of H1_ACTIVE_WINDOW_MS (h1_server_active). */
  int64_t window;
  size_t active, active_before;
  int corked;
  h1_lend_t lend; /* replies held back for a flush (h1_lend.c) */
  time_t date_sec;
  char fixed[128]; /* the headers every reply carries: Date, and Server when named */
};

#define H1_ACTIVE_WINDOW_MS 10

/* The monotonic clock in milliseconds (coarse: a few ms). */
static inline int64_t h1_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Counts the connection as active in the current window. */
void h1_server_note_active(h1_server_t *s, h1_conn_t *c);

/* Frees a request that nobody holds. */
void h1_req_free(h1_req_t *q);
/* Builds the status line and headers of the reply into q->seg[0..2]:
 * Content-Type `type` (NULL: none), Content-Length `len` (-1: chunked, or
 * none when the body ends with the connection or there is none). */
void h1_req_head(h1_req_t *q, int status, const char *type, int64_t len);
/* The request is answered: a connection it held up may go on. */
void h1_req_release(h1_req_t *q);
/* Frees an orphan that was answered or dropped: nobody reads its reply. */
void h1_orphan_done(h1_req_t *q);
/* Makes `q`, held and already off its connection's queue, an orphan: its
 * answer only frees it; a streamed body's sink hears H1_BODY_GONE. */
void h1_req_orphan(h1_req_t *q);
/* Tells a streamed body's sink (if any) that the body ended HOW; detached
 * first, so that it hears it once. */
void h1_body_end(h1_req_t *q, h1_body_end_t how);
/* Takes the last request off the queue (the caller owns it then). */
h1_req_t *h1_queue_pop_last(h1_conn_t *c);
/* Queues an error reply of the server's own in the JSON envelope (no handler
 * saw the request), counted as a wire error; the input is ignored from now
 * on and the connection closes once the reply is written (h1_parse.c). */
void h1_conn_fail(h1_conn_t *c, int status, muster_err_t code, const char *message);
/* Counts `bytes` of q's reply in memory against its connection's out_bytes,
 * in place of what was counted for it before. */
void h1_req_count_out(h1_req_t *q, size_t bytes);
/* True when the connection's queue and its unsent replies are small enough
 * again for reading to go on (after a pause of h1_parse.c). */
bool h1_conn_may_read(const h1_conn_t *c);
/* Marks the connection dead; the reap event frees it later in the turn. */
void h1_conn_kill(h1_conn_t *c);
/* Marks the connection to be written: now, or at the uncork. */
void h1_conn_dirty(h1_conn_t *c);
/* Collects the iovecs of the replies ready at the front of the queue (at
 * most H1_MAX_IOV); returns how many. */
int h1_conn_gather(h1_conn_t *c, struct iovec *iov);
/* Accounts `n` bytes written; false when the connection is to close now
 * (h1_conn_linger). */
bool h1_conn_advance(h1_conn_t *c, size_t n);
/* The last reply is out and the connection is to close (politely). */
void h1_conn_linger(h1_conn_t *c);
/* Marks the request lent when the server is lending (h1_lend.c). */
void h1_lend_add(h1_req_t *q);
/* The server's event callbacks (h1.c; the idle check in h1_timeout.c),
 * which h1_server.c registers: a connection readable or writable; the reap
 * of dead connections, the resume of paused ones, the idle check. */
void h1_conn_on_read(evutil_socket_t fd, short what, void *arg);
void h1_conn_on_write(evutil_socket_t fd, short what, void *arg);
void h1_reap(evutil_socket_t fd, short what, void *arg);
void h1_resume(evutil_socket_t fd, short what, void *arg);
void h1_idle(evutil_socket_t fd, short what, void *arg);
/* Gives every lent connection back to the loop as it is (shutdown). */
void h1_lend_forget(h1_server_t *s);
/* Takes a lent connection back early, when the writer is done with it: true
 * when the loop may write it now (what the writer wrote is accounted). */
bool h1_lend_reclaim(h1_conn_t *c);
/* ---- streamed replies (h1_stream.c) ---- */

/* Collects the iovecs of the body pieces in memory at the front of q's
 * stream, at most `room`; returns how many. */
int h1_stream_gather(h1_req_t *q, struct iovec *iov, int room);
/* Accounts up to *n written bytes against q's pieces in memory (*n less
 * what it took); true when the reply is complete: ended and all written. */
bool h1_stream_advance(h1_req_t *q, size_t *n);
/* True when q's streamed body ended and all of it was written. */
bool h1_stream_over(const h1_req_t *q);
/* True when the front piece of q's stream is a file's, for sendfile. */
bool h1_stream_file_next(const h1_req_t *q);
/* Sends the front file piece of the first request of `c`; false on a socket
 * error (*blocked when the socket is full). */
bool h1_stream_sendfile(h1_conn_t *c, bool *blocked);
/* True when the streamed reply waits on its client (bytes queued, the socket
 * full), not on its producer: the idle timeout applies. */
bool h1_stream_waits_for_client(const h1_req_t *q);
/* The client of streamed request `q` went away: its producer is told. */
void h1_stream_orphaned(h1_req_t *q);
/* Frees q's stream (its pieces, its place on the ready list). */
void h1_stream_free(h1_req_t *q);
/* The server's event: runs the due h1_respond_wait callbacks. */
void h1_stream_on_ready(evutil_socket_t fd, short what, void *arg);

/* Stops reading the connection until conn_resume (h1.c) lets it go on. */
void h1_conn_pause(h1_conn_t *c);
/* Parses and dispatches what the input holds, until it needs more bytes
 * (h1_parse.c). */
void h1_conn_parse(h1_conn_t *c);
/* Arms the connection's read deadline when it waits for the rest of a
 * request (after a read or a resume; h1_timeout.c).  Costs no timer call
 * when nothing is incomplete or the timer fires soon enough already. */
void h1_conn_watch(h1_conn_t *c);

static inline bool h1_frame_empty(const h1_frame_t *fr) {
  return !fr->chunked && fr->left == 0;
}

#endif
