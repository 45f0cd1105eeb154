/*
 * http.h — the route layer between evhttp and the handlers.
 *
 * A request (h1.h) is matched against the route table (method, path pattern,
 * handler, auth, body limit); authentication, method, size, content type and
 * JSON parsing are checked once here, before any handler runs.  Handlers see
 * an http_req_t: path parameters, query, parsed body; they answer with
 * http_reply_json or http_reply_fail, or park the request (long-poll).
 *
 * Replies are not sent when a handler answers: they wait in the head's
 * pending list until the turn's transaction commits (group commit).
 */
#ifndef MUSTER_SERVER_HTTP_H
#define MUSTER_SERVER_HTTP_H

#include <jansson.h>
#include <stdbool.h>

#include "fail.h"
#include "h1.h"
#include "jw.h"
#include "server.h"

#define HTTP_MAX_PARAMS 2
#define HTTP_MAX_QUERY 16 /* query parameters kept; more are refused */

typedef struct {
  head_t *head;
  h1_req_t *req;
  char *params[HTTP_MAX_PARAMS]; /* decoded `{}` segments of the path */
  char *query_text;              /* the decoded query, keys and values NUL-separated; owned */
  const char *query_key[HTTP_MAX_QUERY], *query_value[HTTP_MAX_QUERY];
  size_t query_count;
  json_t *body;          /* parsed body; {} when empty; NULL on an HTTP_BODY_TEXT
                            route until http_body parses it */
  const char *body_text; /* HTTP_BODY_TEXT routes: the body's bytes (NULL when empty),
                            valid while the request is handled */
  size_t body_len;
  int status;           /* set by a reply; 0 while none */
  json_t *reply;        /* reply body, owned */
  bool parked;          /* a waiter owns req now */
  const char *raw_type; /* set by http_reply_raw: Content-Type of `raw`; NULL: JSON */
  char *raw;            /* reply body as text, owned; sent instead of `reply`: not JSON,
                           or JSON written whole (http_reply_text) */
  size_t raw_len;
  bool raw_file; /* set by http_reply_file: the body is file `raw_fd` */
  int raw_fd;    /* owned while raw_file */
  int64_t raw_file_len;
  bool keep;     /* keep the request's writes even when it answers an error */
  bool no_flush; /* the reply needs its commit, not a WAL flush
                    (head_lease_on_disk) */
} http_req_t;

typedef void (*http_handler_fn)(http_req_t *r);

/*
 * Who may call a route.  The head knows two tokens: the admin token (--token)
 * and an optional read-only token (--dashboard-token).  HTTP_PUBLIC and
 * HTTP_TOKEN keep the values of the old `needs_token` flag (false, true), so
 * a row written as `{..., true, 0}` still means "needs a token".
 */
typedef enum {
  HTTP_PUBLIC = 0, /* no token */
  HTTP_TOKEN = 1,  /* GET and HEAD: the read-only or admin token; other methods: admin */
  HTTP_READ = 2,   /* the read-only or the admin token, whatever the method */
  HTTP_ADMIN = 3,  /* the admin token only */
} http_role_t;

/* Route flags. */
enum {
  /* The handler reads the body's text (r->body_text, jscan.h) and parses it
   * with http_body only when it must: the route layer checks the body's size
   * and type but builds no tree. */
  HTTP_BODY_TEXT = 1,
  /* The path's first `{}` is a queue name: one that no queue may have is
   * refused with name_invalid before the body is read or the queue looked
   * up, as a bad shared scope is, so no route answers it queue_not_found. */
  HTTP_QUEUE_NAME = 2,
  /* The route takes no fields in its body (a purge, a requeue, a DELETE): a
   * body object with any is refused with invalid_argument naming the first,
   * as every other route refuses a field it does not know, so that a field
   * sent in the belief that it narrows the call (a requeue's "state") never
   * passes silently.  No body, or {}, is taken. */
  HTTP_NO_FIELDS = 4,
};

typedef struct {
  const char *method;  /* "GET", "POST", "PUT", "DELETE" */
  const char *pattern; /* "/v1/queues/{}/tasks": `{}` matches one segment */
  http_handler_fn handler;
  http_role_t role;  /* who may call it; `true` in older rows means HTTP_TOKEN */
  size_t body_limit; /* 0: the head's --max-body */
  unsigned flags;    /* HTTP_BODY_TEXT, HTTP_QUEUE_NAME, HTTP_NO_FIELDS or 0 */
} http_route_t;

/* The route table (routes.c); ends with a NULL method. */
extern const http_route_t http_routes[];

/* Starts the HTTP server on h->base and binds; returns the bound port or -1 (logged). */
int http_start(head_t *h);
void http_stop(head_t *h);

/* The request's body parsed, as the route layer parses every other route's
 * body (on an HTTP_BODY_TEXT route, at the first call): a JSON object, {}
 * when the body is empty.  NULL with the 400 reply set when the body is not
 * a JSON object.  Borrowed: it lives as long as the request. */
const json_t *http_body(http_req_t *r);

/* Answers with `status` and `body` (stolen). */
void http_reply_json(http_req_t *r, int status, json_t *body);
/* Answers with `status` and the JSON text `text` holds, whose buffer it
 * takes (*text is zeroed): a reply written as text whole (a page of tasks
 * or of updates) goes out as it is, not copied into a tree's raw node and
 * out again.  500 out of memory when writing the text failed. */
void http_reply_text(http_req_t *r, int status, jw_buf_t *text);
/* Answers with `len` bytes of `data` (copied) as `type` ("text/plain;
 * charset=utf-8"), not JSON; like every reply it waits for the commit. */
void http_reply_raw(http_req_t *r, int status, const char *type, const void *data, size_t len);
/* Answers with the first `len` bytes of open file `fd` (the reply owns it
 * from now on, also on failure) as `type`; sent after the commit, from the
 * file (sendfile), never read into memory.  A HEAD request gets the headers
 * and Content-Length only. */
void http_reply_file(http_req_t *r, int status, const char *type, int fd, int64_t len);
/* The strongest role the request's bearer token grants: HTTP_ADMIN for the
 * admin token, HTTP_READ for the read-only one, HTTP_PUBLIC for none. */
http_role_t http_token_role(const http_req_t *r);
/* True when the request carries an Authorization header, valid or not: a
 * refusal then says the token is wrong rather than missing. */
bool http_token_sent(const http_req_t *r);
/* Answers with the error envelope of *f. */
void http_reply_fail(http_req_t *r, const fail_t *f);

/* Queues a reply to go out after the next commit, or sends it at once when no
 * transaction is open.  Takes ownership of `body`. */
void http_enqueue(head_t *h, h1_req_t *req, int status, json_t *body);
/* http_enqueue of JSON text written whole (as http_reply_text takes it):
 * takes the buffer of `text` (*text is zeroed); 500 out of memory when
 * writing the text failed.  `no_flush`: the reply needs its commit but no
 * WAL flush of its own (a lease of tasks already on disk:
 * head_lease_on_disk). */
void http_enqueue_text(head_t *h, h1_req_t *req, int status, jw_buf_t *text, bool no_flush);
/* http_enqueue with the error envelope of *f. */
void http_enqueue_fail(head_t *h, h1_req_t *req, const fail_t *f);
/* Sends the pending replies; when `commit_failed`, answers each with 500. */
void http_flush(head_t *h, const fail_t *commit_failed);

/* Takes the pending replies out, leaving the pending list empty. */
reply_list_t http_take_pending(head_t *h);
/* True when a pending reply needs its commit but no flush (no_flush). */
bool http_pending_unflushed(const head_t *h);
/* The number of replies in `list`, and the bytes of their bodies (files not
 * counted). */
size_t http_list_length(const reply_list_t *list);
size_t http_list_bytes(const reply_list_t *list);
/* Moves the replies of `list` that need no flush (http_enqueue_text's
 * no_flush, a request's) out of it, in order, and returns them. */
reply_list_t http_list_take_unflushed(reply_list_t *list);
/* Moves every reply of `more` to the end of `into`. */
void http_list_concat(reply_list_t *into, reply_list_t *more);
/* Sends (and empties) a list; when `failed`, answers each with 500 store_error. */
void http_flush_list(head_t *h, reply_list_t *list, const fail_t *failed);
/* Builds the replies of `list` held back from the wire (h1_lend_begin); the
 * list stays, for http_lend_finish.  Returns the lend, NULL when no reply
 * went to a connection (their clients were gone). */
h1_lend_t *http_lend_list(head_t *h, reply_list_t *list);
/* The lent list's flush ended: gives the connections back (h1_lend_return),
 * answering each reply with 500 store_error when `failed`, counts the
 * replies and empties the list; `lend` may be NULL. */
void http_lend_finish(reply_list_t *list, h1_lend_t *lend, const fail_t *failed);

/* Parses a positive id from a path parameter; 0 when it is not one. */
int64_t http_param_id(const char *text);
/* The query value for `key`, or NULL. */
const char *http_query(http_req_t *r, const char *key);

#endif
