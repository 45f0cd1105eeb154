/*
 * client_internal.h — what the files of libmuster share and nobody else sees.
 *
 * client.c owns the handle and picks the transport: http1.c's own HTTP/1.1
 * for http:// URLs, one libcurl easy handle for the others (https://); either
 * keeps its connection alive from call to call.
 * queue.c, worker.c and the other calls build JSON bodies with jansson, call
 * client_call() and read the parsed reply.  The hot calls (put, lease,
 * complete) write their bodies as text into the handle's `body` (jtext.h),
 * send them with client_call_text() and read the reply's text, falling back
 * to the trees only for text the scanners do not follow.  Nothing here is
 * thread-safe beyond what muster.h promises: one handle, one thread at a time.
 */
#ifndef MUSTER_CLIENT_INTERNAL_H
#define MUSTER_CLIENT_INTERNAL_H

#include "muster.h"

#include "client/jtext.h"
#include "client/shared_cancel.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Longest explanation kept for muster_client_message(); longer ones are cut. */
#define CLIENT_MESSAGE_MAX 512

/* A growable byte buffer that always stays NUL-terminated once used. */
typedef struct {
  char *data;
  size_t len; /* bytes in data, not counting the terminating NUL */
  size_t cap; /* bytes allocated */
} client_buf_t;

/* libmuster's own HTTP/1.1 transport for http:// URLs (http1.c). */
typedef struct http1 http1_t;

struct muster_client {
  http1_t *http1;                   /* the transport for http:// URLs; NULL: libcurl's */
  CURL *curl;                       /* one easy handle (https://): its connection is kept alive */
  struct curl_slist *headers;       /* Authorization, Content-Type, an empty Expect */
  char *base_url;                   /* "http://host:port" without a trailing slash */
  char *token;                      /* the bearer token, or NULL: for a handle of another thread */
  long timeout_ms;                  /* per request; long-polls add their wait */
  int status;                       /* HTTP status of the last reply, 0 when none */
  muster_server_t server;           /* what sent the last reply that came (client_server_of) */
  unsigned curl_said;               /* CLIENT_SAID_* of the libcurl reply being read */
  client_buf_t reply;               /* body of the last reply */
  jtext_buf_t body;                 /* the request body of a hot call, reused */
  char message[CLIENT_MESSAGE_MAX]; /* explanation of the last failure, "" after success */
  char curl_error[CURL_ERROR_SIZE]; /* filled by libcurl on transport failures */
};

/*
 * Sends `method` `path` with an optional JSON `body` (may be NULL: no body),
 * waiting at most the handle's timeout plus `extra_wait_ms`.  On MUSTER_OK and
 * when `reply` is not NULL, *reply is the parsed reply (a new reference the
 * caller must json_decref).  On failure the handle's message explains it.
 * `body` stays the caller's.
 */
muster_err_t client_call(muster_client_t *client, const char *method, const char *path,
                         json_t *body, long extra_wait_ms, json_t **reply);

/*
 * client_call for a body already written as text (`body`, NUL-terminated; NULL:
 * none).  On MUSTER_OK the reply's text is client->reply (valid until the next
 * call on the handle), not yet checked to be JSON, and the handle's message is
 * untouched: the caller reads the reply with a scanner, or with
 * client_reply_tree, and then calls client_ok.  Non-2xx replies are reported
 * as client_call reports them.
 */
muster_err_t client_call_text(muster_client_t *client, const char *method, const char *path,
                              const char *body, long extra_wait_ms);

/* Parses the last reply into *reply (a new reference), or fails with
 * MUSTER_PROTOCOL as client_call does for an unreadable reply. */
muster_err_t client_reply_tree(muster_client_t *client, const char *method, const char *path,
                               json_t **reply);

/* Checks that the last reply is what client_call would have parsed, without
 * a tree when its text is canonical; otherwise as client_reply_tree, and the
 * tree is dropped.  Calls client_ok on success. */
muster_err_t client_reply_check(muster_client_t *client, const char *method, const char *path);

/* The transport of http1.c for `base_url` ("http://host[:port][/prefix]"), or
 * NULL when the URL is not one it takes (then libcurl carries the calls). */
http1_t *http1_new(const char *base_url, const char *token);
void http1_free(http1_t *h);

/* Sends one request and reads its reply into client->status and
 * client->reply, like client_send; `timeout_ms` 0 waits for ever. */
muster_err_t http1_send(muster_client_t *client, const char *method, const char *path,
                        const char *body, long timeout_ms);

/*
 * After libcurl's transfer of `url` on `curl` failed with `rc`: a failure to
 * connect (refused, or out of time before a connection was made) or to
 * resolve the host is put in client->curl_error in http1.c's words ("could
 * not connect to HOST port PORT: Connection refused", "...: timed out"), so that
 * one failure reads the same whichever transport carried the request (the
 * CLI's advice for a head that is not running keys on them).  Any other
 * failure keeps libcurl's words.
 */
void client_curl_reword(muster_client_t *client, CURL *curl, CURLcode rc, const char *url);

/* shared_cancel.c: `curl`'s transfer opens and closes its sockets through
 * `cancel`, which can then shut them down from another thread. */
void shared_cancel_setopt(CURL *curl, shared_cancel_t *cancel);
/* Whether `cancel` was fired (shared_cancel_fire). */
bool shared_cancel_fired(shared_cancel_t *cancel);

/* Grows the allocation *data of *cap bytes to at least `need` bytes, doubling
 * from 4 KiB; false when memory ran out, both unchanged.  The growth of every
 * buffer of libmuster (client_buf_t, jtext_buf_t). */
bool client_grow(char **data, size_t *cap, size_t need);
/* Makes room in `b` for `more` bytes and the terminating NUL (client_grow);
 * false when memory ran out, `b` unchanged. */
bool client_buf_reserve(client_buf_t *b, size_t more);
/* Appends `n` bytes and keeps `b` NUL-terminated; false when memory ran out. */
bool client_buf_append(client_buf_t *b, const char *data, size_t n);

/* What a reply's headers say sent it (client_header_said), as bits. */
#define CLIENT_SAID_HEAD 1u     /* "Server: muster-head" */
#define CLIENT_SAID_NODE 2u     /* "Server: muster-node" */
#define CLIENT_SAID_VIA_NODE 4u /* a Via naming a muster node: an agent passed it on */

/* The CLIENT_SAID_* bit of one header line of a reply (`len` bytes, its line
 * end there or not), 0 for a line that says nothing of the sender. */
unsigned client_header_said(const char *line, size_t len);
/* What sent a reply whose header lines said `said` (their bits or'ed): a
 * node agent when one says so, or passed it on (an older agent passes the
 * head's Server on as it came); else a head when it says so. */
muster_server_t client_server_of(unsigned said);

/* Records `err` with a printf-style explanation on the handle and returns `err`. */
muster_err_t client_fail(muster_client_t *client, muster_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears the handle's message (a call succeeded). */
void client_ok(muster_client_t *client);

/* MUSTER_OK when `value` >= `min`; else MUSTER_INVALID with the message
 * "WHAT: VALUE, expected ACCEPTED" (`accepted` names the range and any
 * sentinel, "0 or more, or -1 for the head's maximum"), so that a negative
 * number is refused in the library's words instead of being taken silently
 * as the default or sent to the head. */
muster_err_t client_check_min(muster_client_t *client, const char *what, int64_t value, int64_t min,
                              const char *accepted);
/* client_check_min's words for a `value` below `min`, written into `why`
 * (`size` bytes) and returned; NULL when it is in range.  For options
 * checked before there is a handle to fail (muster_pool_open's). */
const char *client_min_problem(char *why, size_t size, const char *what, int64_t value, int64_t min,
                               const char *accepted);

/* ---- sized option structs (opts.c; muster.h, "option structs") ---- */

/* The end of `field` in struct `type`: the size of a struct's first version
 * is the end of its last field then, whatever fields come after it later. */
#define OPTS_END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

/* The body of every muster_X_opts_init_sized: copies the first min(size,
 * full) bytes of `defaults` (this library's struct, `full` bytes) into the
 * caller's `opts` and sets its leading size member to `size`; writes nothing
 * when `opts` is NULL or `size` cannot hold the size member. */
void opts_init_sized(void *opts, size_t size, const void *defaults, size_t full);

/*
 * Takes the caller's option struct `opts` (not NULL) into `local`, this
 * library's struct of `full` bytes already holding the defaults: copies the
 * first min(opts->size, full) bytes, so that fields the caller's header did
 * not have keep their defaults and nothing past the caller's struct is read;
 * local's size member is then `full`.  Returns NULL; or, when opts->size is 0
 * or below `first_end` (the end of the struct's first version: OPTS_END),
 * leaves `local` untouched and returns the reason, written into `why`
 * (`why_size` bytes), naming the struct as `what` ("opts") and its init as
 * `init` ("muster_pool_opts_init").
 */
const char *opts_take(void *local, size_t full, const void *opts, size_t first_end,
                      const char *what, const char *init, char *why, size_t why_size);
/* opts_take for a call on a handle: MUSTER_OK, or MUSTER_INVALID with the
 * reason as the handle's message. */
muster_err_t client_opts_take(muster_client_t *client, void *local, size_t full, const void *opts,
                              size_t first_end, const char *what, const char *init);

/*
 * Formats a path into `out` (`size` bytes) from `fmt`, where every "%s" is
 * replaced by the next string argument percent-encoded as a path segment, so a
 * queue name like "a/b" reaches the server as one (invalid) name rather than as
 * another endpoint.  Only "%s" and "%lld" (long long) are understood.
 * Returns MUSTER_OK, or MUSTER_NAME_INVALID when the path does not fit (names
 * are at most 128 characters, so a fitting buffer only overflows for bad ones).
 */
muster_err_t client_path(muster_client_t *client, char *out, size_t size, const char *fmt, ...);

/*
 * Parses the JSON text `text` (any value, not only objects) for the request
 * field named `what`; on failure returns NULL and records MUSTER_INVALID with
 * jparse's reason and place ("init_data: not valid JSON: ... (at column 4)").
 * The caller owns the returned reference.
 */
json_t *client_parse_value(muster_client_t *client, const char *text, const char *what);

/* Duplicates the JSON value `value` as compact text (muster_free), NULL on no memory. */
char *client_dump_value(const json_t *value);

/*
 * Appends the JSON value `text` (the request field `array`[`i`].`field`) to
 * `b`: as it stands when jtext_add_json takes it, else parsed and dumped as
 * the tree path did, so that bad JSON fails here with MUSTER_INVALID and the
 * message client_parse_value gives, naming the field.
 */
muster_err_t client_add_json(muster_client_t *client, jtext_buf_t *b, const char *text,
                             const char *array, size_t i, const char *field);

/* Consumes the `len` bytes of `text` at *pp (before `end`) when they are next. */
bool client_scan_text(const char **pp, const char *end, const char *text, size_t len);
#define CLIENT_SCAN_LIT(pp, end, lit) client_scan_text((pp), (end), "" lit, sizeof(lit) - 1)

/* The bodies and reply scanners of the hot calls, for their tests. */

/* Writes put's body {"tasks":[...]} for `specs` into `b` (emptied first), with
 * the old tree's bytes; MUSTER_INVALID (message set) for a bad spec. */
muster_err_t task_put_body(muster_client_t *client, const muster_task_spec_t *specs, size_t count,
                           jtext_buf_t *b);
/* Reads the ids of a canonical put reply of `count` tasks into `ids` (may be
 * NULL); false when the text is not one (the caller parses it). */
bool task_scan_ids(const char *text, size_t len, size_t count, int64_t *ids);

/* Reads the canonical lease reply `text` into a new array *leases / *count
 * (and, with `updates` not NULL, the updates as muster_complete_lease gives
 * them); false, with nothing allocated, when the text is not one the scanner
 * follows or memory ran out: the caller parses it into a tree. */
bool lease_scan_reply(const char *text, size_t len, muster_lease_t **leases, size_t *count,
                      char **updates);
/* The tree path of the same: reads the parsed reply `reply`. */
muster_err_t lease_read_tree(muster_client_t *client, json_t *reply, muster_lease_t **leases,
                             size_t *count, char **updates);

/* Writes the body of POST /v1/leases/`verb` ("complete", "fail", "extend",
 * "release" or "flag") for `acks` into `b` (emptied first), with the old
 * tree's bytes; MUSTER_INVALID (message set) for a bad result or text. */
muster_err_t lease_ack_body(muster_client_t *client, const char *verb, const muster_ack_t *acks,
                            size_t count, jtext_buf_t *b);
/* Writes muster_complete_lease's body (a completion with a "lease" object),
 * its arguments already checked. */
muster_err_t lease_next_body(muster_client_t *client, const muster_ack_t *acks, size_t count,
                             const char *queue, int64_t worker, size_t max, int64_t updates_after,
                             jtext_buf_t *b);

/* ---- the shared data tasks require (requires.c) ---- */

/* MUSTER_OK when the `n` levels of `levels` may be sent as a task's
 * "requires"; else MUSTER_INVALID or MUSTER_NAME_INVALID, with the element
 * named in `why` ("requires[1].level: 0, expected 1 or more"). */
muster_err_t requires_problem(const muster_shared_level_t *levels, size_t n, char *why,
                              size_t size);
/* requires_problem for a call on a handle: the reason is its message. */
muster_err_t requires_check(muster_client_t *client, const muster_shared_level_t *levels, size_t n);
/* The checked `levels` as the JSON array of "requires" (new reference);
 * NULL when memory ran out. */
json_t *requires_tree(const muster_shared_level_t *levels, size_t n);
/* A copy of the checked `levels`, strings included, for requires_free; NULL
 * when memory ran out. */
muster_shared_level_t *requires_copy(const muster_shared_level_t *levels, size_t n);
void requires_free(muster_shared_level_t *levels, size_t n);

/* Writes the body of a put whose every task requires `required` (a JSON
 * array of requires_tree; NULL: none), as task_put_body does. */
muster_err_t task_put_body_requiring(muster_client_t *client, const muster_task_spec_t *specs,
                                     size_t count, const json_t *required, jtext_buf_t *b);

/* Reads integer field `key` of `obj`; *out = `fallback` when absent or null.
 * Returns 0, or -1 when the field has another type. */
int client_get_int(const json_t *obj, const char *key, int64_t fallback, int64_t *out);

#endif /* MUSTER_CLIENT_INTERNAL_H */
