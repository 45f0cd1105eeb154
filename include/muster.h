/*
 * muster.h — the one public header of libmuster, the C client of a muster head.
 *
 * A muster_client_t is an opaque handle holding one keep-alive HTTP connection
 * to a head or node (libmuster's own HTTP/1.1 for http:// URLs, libcurl for
 * https://).  A handle is NOT thread-safe: give each
 * thread its own handle (they are cheap; each owns one connection).  Different
 * handles may be used from different threads at the same time.
 *
 * Every call returns a muster_err_t.  MUSTER_OK is zero; any other value names
 * what went wrong, and muster_client_message() returns the server's (or the
 * library's) explanation of the last failure on that handle.  The library never
 * aborts and never prints.  Memory the library returns is owned by the caller
 * and released with the matching *_free function (or muster_free for strings);
 * memory the caller passes in stays the caller's.
 *
 * Field-level detail of every call lives in docs/api.md, which is the contract;
 * docs/client.md says what holds for every call and what the ABI promises, and
 * how to build against the library: installed (`cmake --install build`),
 * `cc prog.c $(pkg-config --cflags --libs muster)`.
 */
#ifndef MUSTER_H
#define MUSTER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSTER_VERSION "0.1.0"

/*
 * The error table, shared by server and clients.  Columns: enum suffix, stable
 * wire string, HTTP status (0: never sent by a server), default message.  A
 * code's number is part of the ABI (docs/client.md): new codes go at the end,
 * and a program must expect codes it does not know.
 */
#define MUSTER_ERRNO_MAP(XX)                                                                       \
  XX(OK, "ok", 200, "success")                                                                     \
  XX(BAD_REQUEST, "bad_request", 400, "the request is malformed")                                  \
  XX(BAD_JSON, "bad_json", 400, "the body is not valid JSON")                                      \
  XX(INVALID, "invalid_argument", 400, "a field is missing or has a wrong type or value")          \
  XX(NAME_INVALID, "name_invalid", 400,                                                            \
     "names are 1 to 128 characters of letters, digits, '.', '_' and '-', not '.' or '..'")        \
  XX(UNAUTHORIZED, "unauthorized", 401, "a valid bearer token is required")                        \
  XX(FORBIDDEN, "forbidden", 403, "this token may not do that")                                    \
  XX(NOT_FOUND, "not_found", 404, "no such endpoint")                                              \
  XX(QUEUE_NOT_FOUND, "queue_not_found", 404, "no such queue")                                     \
  XX(TASK_NOT_FOUND, "task_not_found", 404, "no such task")                                        \
  XX(WORKER_NOT_FOUND, "worker_not_found", 404, "no such worker, or it timed out")                 \
  XX(NODE_NOT_FOUND, "node_not_found", 404, "no such node, or it timed out")                       \
  XX(SESSION_NOT_FOUND, "session_not_found", 404, "no such session, or it was closed")             \
  XX(ITERATION_NOT_FOUND, "iteration_not_found", 404, "no such iteration")                         \
  XX(SHARED_NOT_FOUND, "shared_not_found", 404, "shared data not found")                           \
  XX(METHOD_NOT_ALLOWED, "method_not_allowed", 405, "this endpoint does not take that method")     \
  XX(LEASE_LOST, "lease_lost", 409,                                                                \
     "the lease expired or was taken over; the task is no longer yours")                           \
  XX(INVALID_STATE, "invalid_state", 409, "the task is not in a state that allows this")           \
  XX(QUEUE_IN_USE, "queue_in_use", 409, "another queue names this one as its next stage")          \
  XX(VERSION_MISMATCH, "version_mismatch", 409, "update level mismatch")                           \
  XX(BODY_TOO_LARGE, "body_too_large", 413, "the request body is larger than allowed")             \
  XX(BATCH_TOO_LARGE, "batch_too_large", 413, "the batch has more elements than allowed")          \
  XX(PAYLOAD_TOO_LARGE, "payload_too_large", 413, "a payload or result is larger than allowed")    \
  XX(UNSUPPORTED_MEDIA, "unsupported_media_type", 415, "the body must be application/json")        \
  XX(INTERNAL, "internal", 500, "internal error")                                                  \
  XX(STORE, "store_error", 500, "the store could not complete the write")                          \
  XX(UNAVAILABLE, "unavailable", 503, "the server is shutting down")                               \
  XX(NETWORK, "network", 0, "could not reach the server")                                          \
  XX(PROTOCOL, "protocol", 0, "the server's reply could not be understood")                        \
  XX(NOMEM, "out_of_memory", 0, "out of memory")                                                   \
  XX(INDEX_GAP, "index_gap", 0,                                                                    \
     "the results in submission order stop at session indexes that have no task")                  \
  XX(IO, "io_error", 0, "a local file could not be read or written")

typedef enum {
#define MUSTER_ERR_ENUM(name, str, status, msg) MUSTER_##name,
  MUSTER_ERRNO_MAP(MUSTER_ERR_ENUM)
#undef MUSTER_ERR_ENUM
      MUSTER_ERR_COUNT
} muster_err_t;

/* The default message of an error code ("no such queue"); never NULL. */
const char *muster_strerror(muster_err_t err);
/* The stable wire string of an error code ("queue_not_found"); never NULL. */
const char *muster_err_name(muster_err_t err);
/* The HTTP status a server answers with for this code; 0 for client-side codes. */
int muster_err_http_status(muster_err_t err);
/* The code whose wire string is `name`; MUSTER_PROTOCOL when none matches. */
muster_err_t muster_err_from_name(const char *name);

/* ---- client handle ---------------------------------------------------- */

typedef struct muster_client muster_client_t;

/*
 * Creates a handle for the server at `url` ("http://127.0.0.1:7370") using the
 * bearer `token` (may be NULL for /v1/health only).  Both strings are copied.
 * Returns MUSTER_OK and sets *out, or MUSTER_INVALID / MUSTER_NOMEM.  A URL
 * that is not http:// or https:// (any case) followed by a host, "ftp://..."
 * or "127.0.0.1:7370", is refused here with MUSTER_INVALID rather than at the
 * first call; so is a token with a line break.
 */
muster_err_t muster_client_new(const char *url, const char *token, muster_client_t **out);
/* muster_client_new, and on failure, when `message` is not NULL, *message
 * explains it ("url 'ftp://h': expected http://HOST[:PORT] or ..."; free
 * with muster_free); *message is NULL after success. */
muster_err_t muster_client_open(const char *url, const char *token, muster_client_t **out,
                                char **message);
/* Closes the connection and frees the handle; accepts NULL. */
void muster_client_free(muster_client_t *client);
/* Explanation of the last failed call on this handle ("" after success). */
const char *muster_client_message(const muster_client_t *client);
/* HTTP status of the last reply on this handle (0 when its last request got
 * none).  A call the library refuses before sending anything (a bad argument,
 * a payload that is not JSON) leaves it: read it only after a call that the
 * server answered. */
int muster_client_status(const muster_client_t *client);

/*
 * What answers at a handle's URL, as its replies say (their Server header, or
 * a Via naming a muster node on a reply a node agent passed on): a head, or a
 * node agent (which answers for the head: its own replies, and the head's it
 * forwards).  A program may expect values it does not know.
 */
typedef enum {
  MUSTER_SERVER_UNKNOWN = 0, /* no reply yet, or one that did not say (an older muster, a
                              * proxy answering itself, another server) */
  MUSTER_SERVER_HEAD = 1,    /* a muster head */
  MUSTER_SERVER_NODE = 2     /* a muster node agent */
} muster_server_t;
/* What sent the handle's last reply; a request that got none (refused, timed
 * out) leaves what the reply before it said. */
muster_server_t muster_client_server(const muster_client_t *client);
/* Sets the per-request timeout in milliseconds (default 60000; long-polls add their
 * wait); 0 or less: no timeout, a head that stops answering is waited for ever.  A
 * request that runs out fails with MUSTER_NETWORK ("timed out waiting for the reply").
 * Shared-data transfers (which have no overall limit) take it as their limit on
 * connecting ("could not connect to HOST port PORT: timed out") and on a transfer
 * that moves no byte for that long. */
void muster_client_set_timeout(muster_client_t *client, long timeout_ms);

/* Frees a string or array returned by the library; accepts NULL. */
void muster_free(void *ptr);

/*
 * Sends any API request: `method` ("GET", "POST", ...), `path` ("/v1/queues"),
 * an optional JSON `body`.  On success *reply (may be NULL if unwanted) is the
 * reply body as a NUL-terminated string owned by the caller (muster_free).  A
 * non-2xx reply maps its error envelope to the returned code.
 */
muster_err_t muster_request(muster_client_t *client, const char *method, const char *path,
                            const char *body, char **reply);

/* GET /v1/health; MUSTER_OK when the server answers "ok". */
muster_err_t muster_health(muster_client_t *client);

/* ---- option structs --------------------------------------------------- */

/*
 * The option structs (muster_queue_opts_t, muster_worker_opts_t,
 * muster_lease_opts_t, muster_session_opts_t, muster_pool_opts_t,
 * muster_loader_opts_t, muster_iter_config_t, muster_shared_opts_t) grow: a
 * later libmuster adds fields, always at the end.  So that a program built against an older
 * muster.h keeps working with a newer library of the same SOVERSION, each
 * struct starts with `size`, the struct's size in the caller's program:
 *
 *   - muster_X_opts_init(&opts) is a macro over muster_X_opts_init_sized(&opts,
 *     sizeof opts), so the size is the one the caller's compiler saw.  It
 *     writes the defaults, and `size`, within that many bytes and never past
 *     them.  Call it first, then set fields.
 *   - A call that reads options copies the first min(size, its own sizeof)
 *     bytes over a struct holding its defaults: a field the caller's header
 *     did not have takes its default, and nothing past the caller's struct is
 *     read.  A program built against a newer header than the library it runs
 *     with has the fields this library does not know ignored.
 *   - A struct whose size is 0, or less than its first version's (the fields
 *     it was first published with), is refused with MUSTER_INVALID; the
 *     message (muster_client_message, or the *message of muster_pool_open
 *     and muster_loader_open) names the init to call.
 *
 * Why a size of 0 (a struct set up with `= {0}` or memset) is refused rather
 * than taken for "all defaults": zero is not the defaults (several are -1, a
 * pool's create_queue is 1), and a caller who zeroed the struct and then set
 * fields (`= {0}; opts.url = ...`) meant them, so the library can neither
 * ignore those fields nor read the struct, since 0 does not say how many
 * bytes the caller has.  Either guess would be silently wrong for someone;
 * a refusal that names the fix is wrong for no one.  A NULL options pointer,
 * where a call accepts one, still means all defaults.
 *
 * The arrays a call takes (muster_task_spec_t, muster_ack_t,
 * muster_shared_level_t) and the structs the library fills (muster_lease_t,
 * muster_result_t, muster_loader_stats_t, muster_shared_info_t, ...) have no
 * size: a change to them is a change of SOVERSION.  A struct the library
 * fills that has a `size` (muster_worker_reg_t) grows as the option structs
 * do: its init sets the size, the call refuses one not set up, as above, and
 * writes only the fields within the caller's size.
 */

/* ---- queues ----------------------------------------------------------- */

/* keep_done_ms of muster_queue_opts_t: done tasks are kept for ever again. */
#define MUSTER_KEEP_DONE_FOREVER (-2)

/* Queue settings.  Fields left at the values muster_queue_opts_init() sets keep
 * the server's default (on create) or the current value (on update). */
typedef struct {
  size_t size;            /* set by muster_queue_opts_init ("option structs" above) */
  int64_t lease_ms;       /* lease time to live; -1: unchanged/default (60000) */
  int64_t max_attempts;   /* leases before a task goes dead; -1: default (5) */
  int64_t backoff_ms;     /* first retry delay, doubled per attempt; -1: default (1000) */
  int64_t backoff_max_ms; /* cap of the retry delay; -1: default (60000) */
  int64_t max_flags;      /* invalid-data flags before roll-back; -1: default (5) */
  const char *next;       /* next stage's queue; NULL: unchanged, "": none */
  int64_t keep_done_ms;   /* a done task is removed this long after its completion (>= 0);
                             -1: unchanged/default (kept for ever); MUSTER_KEEP_DONE_FOREVER:
                             kept for ever from now on */
} muster_queue_opts_t;

void muster_queue_opts_init_sized(muster_queue_opts_t *opts, size_t size);
#define muster_queue_opts_init(opts) muster_queue_opts_init_sized((opts), sizeof *(opts))
/* Creates or reconfigures queue `name` (PUT /v1/queues/{name}).  `opts` may be
 * NULL.  If `json` is not NULL it receives the queue object (muster_free). */
muster_err_t muster_queue_put(muster_client_t *client, const char *name,
                              const muster_queue_opts_t *opts, char **json);
/* The queue object with counts per state, as JSON (muster_free). */
muster_err_t muster_queue_get(muster_client_t *client, const char *name, char **json);
/* {"queues":[...]} as JSON (muster_free). */
muster_err_t muster_queue_list(muster_client_t *client, char **json);
/* Deletes queued tasks of the queue; *purged (may be NULL) gets their count. */
muster_err_t muster_queue_purge(muster_client_t *client, const char *name, int64_t *purged);
/* Deletes the queue and every task in it. */
muster_err_t muster_queue_delete(muster_client_t *client, const char *name);

/* ---- tasks ------------------------------------------------------------ */

typedef struct {
  const char *payload; /* JSON text of the payload (required); a string payload is "\"...\"" */
  int64_t priority;    /* higher leases first; default 0 */
  int64_t delay_ms;    /* not leased before now + delay_ms; default 0 */
  const char *key;     /* idempotency key or NULL */
  const char *session; /* session id or NULL */
  int64_t index;       /* index within the session; -1: none */
} muster_task_spec_t;

void muster_task_spec_init(muster_task_spec_t *spec);
/*
 * Puts `count` tasks into `queue` in one request; all or none are stored.
 * When `ids` is not NULL it must hold `count` elements and receives the task
 * ids in order (the existing id where an idempotency key repeated).
 */
muster_err_t muster_put(muster_client_t *client, const char *queue, const muster_task_spec_t *specs,
                        size_t count, int64_t *ids);

/* The most levels of shared data one task may require (docs/api.md, "Tasks
 * that require shared data"). */
#define MUSTER_MAX_REQUIRES 16

/* One level of shared data that tasks require: the worker that runs such a
 * task has the level as a local file first (docs/shared-data.md, "Workers").
 * An array element like muster_task_spec_t, so it has no size ("option
 * structs" above). */
typedef struct {
  const char *scope; /* a session id or a global name */
  const char *name;  /* the blob's name in its scope */
  int64_t level;     /* the level, 1 or more (muster_shared_stat gives the newest) */
} muster_shared_level_t;

/*
 * muster_put, where every one of the `count` tasks requires the `nlevels`
 * levels of `levels` (0 to MUSTER_MAX_REQUIRES; 0: none, as muster_put).
 * Refused before anything is sent: more than MUSTER_MAX_REQUIRES levels, a
 * NULL scope or name, a level below 1, or two levels of one blob (a task
 * requires one level of each) (MUSTER_INVALID), and a scope or name that
 * breaks the name rule (MUSTER_NAME_INVALID); the message names the element
 * ("requires[1].level: 0, expected 1 or more").  The head does
 * not check that the levels exist: a worker that leases a task before its
 * level is uploaded fails it (docs/shared-data.md).
 */
muster_err_t muster_put_requiring(muster_client_t *client, const char *queue,
                                  const muster_task_spec_t *specs, size_t count,
                                  const muster_shared_level_t *levels, size_t nlevels,
                                  int64_t *ids);
/* The task object as JSON (muster_free). */
muster_err_t muster_task_get(muster_client_t *client, int64_t id, char **json);
/* Lists tasks of `queue`, optionally in `state` (NULL: all), with id > `after`,
 * at most `limit` (0: server default).  JSON {"tasks":[...],"next":...}. */
muster_err_t muster_task_list(muster_client_t *client, const char *queue, const char *state,
                              int64_t after, int64_t limit, char **json);
/* Puts a dead or failed task back to queued with its attempts reset. */
muster_err_t muster_task_requeue(muster_client_t *client, int64_t id);

/* ---- leases ----------------------------------------------------------- */

typedef struct {
  int64_t task;        /* task id */
  int64_t token;       /* fencing token: name it in complete/fail/extend/release/flag */
  char *payload;       /* JSON text of the payload */
  int64_t attempt;     /* 1 on the first lease of the task */
  int64_t deadline_ms; /* lease deadline, ms since the epoch (server clock) */
  int64_t parent;      /* previous stage's task, or 0 */
  char *session;       /* session id or NULL */
  int64_t index;       /* index within the session, or -1 */
} muster_lease_t;

/*
 * Leases up to `max` tasks of `queue` for `worker` (0: anonymous), waiting up
 * to `wait_ms` (0: not at all) for one to arrive.  On MUSTER_OK *leases is an
 * array of *count leases (possibly 0) to free with muster_leases_free.  A
 * negative worker or wait_ms is refused with MUSTER_INVALID.  It sends no
 * request key: muster_lease_with with opts.request NULL.
 */
muster_err_t muster_lease(muster_client_t *client, const char *queue, int64_t worker, size_t max,
                          int64_t wait_ms, muster_lease_t **leases, size_t *count);
void muster_leases_free(muster_lease_t *leases, size_t count);

/* The longest lease request key, in characters (muster_lease_opts_t.request). */
#define MUSTER_LEASE_KEY_MAX 128

/*
 * A lease request, for muster_lease_with and muster_complete_lease_with: an
 * option struct ("option structs" above).  With `request` set, the request
 * sent again after an error gets back the leases its first try made, not new
 * ones (docs/api.md, "Retrying a lease"; docs/client.md, "Retrying a lease"):
 * keep the key while a call fails, take a new one once a call returns
 * MUSTER_OK.  The head records, per worker, the last keyed request that
 * leased something of each stream of keys (a key's stream: what comes before
 * its trailing "-N"), so where several threads lease for one worker each
 * numbers its keys under a prefix of its own (muster_lease_key with an
 * instance per thread) and each one's retry is covered.
 */
typedef struct {
  size_t size;         /* set by muster_lease_opts_init ("option structs" above) */
  const char *queue;   /* the queue to lease from: required */
  int64_t worker;      /* a registered worker's id, or 0 (anonymous); below 0: refused */
  size_t max;          /* lease up to this many tasks (the head takes 1 to 1000); default 1 */
  int64_t wait_ms;     /* muster_lease_with: wait up to this long for a task; default 0
                        * (not at all); below 0: refused.  muster_complete_lease_with never
                        * waits and does not read it, so one struct serves both calls */
  const char *request; /* NULL (default: no key), or this request's key: 1 to
                        * MUSTER_LEASE_KEY_MAX characters of [A-Za-z0-9._-], not "."
                        * or "..", with a worker; the same on every try of one request
                        * (muster_lease_key) */
} muster_lease_opts_t;

void muster_lease_opts_init_sized(muster_lease_opts_t *opts, size_t size);
#define muster_lease_opts_init(opts) muster_lease_opts_init_sized((opts), sizeof *(opts))

/*
 * muster_lease with its arguments in `opts` (set up by muster_lease_opts_init)
 * and the request key when opts->request is set.  On MUSTER_OK *leases is an
 * array of *count leases (possibly 0) to free with muster_leases_free; sent
 * again with the same key by the same worker on the same queue, it gives the
 * leases of that key's first try the worker still holds, the same tasks and
 * tokens with a full lease from now, whatever `max` says.  MUSTER_INVALID,
 * nothing sent and the message saying why, for: `opts` NULL or not set up, no
 * queue, a negative worker or wait_ms, a key that is empty, longer than
 * MUSTER_LEASE_KEY_MAX or has a character other than letters, digits, '.',
 * '_' and '-', a key without a worker.  A head older than keys refuses one
 * with MUSTER_INVALID and a message starting "request: unknown field": lease
 * without a key from then on.
 */
muster_err_t muster_lease_with(muster_client_t *client, const muster_lease_opts_t *opts,
                               muster_lease_t **leases, size_t *count);

/*
 * Writes the lease request key "INSTANCE-N" into `key` (`size` bytes; at
 * least MUSTER_LEASE_KEY_MAX + 1 is always enough): a key of process
 * `instance`'s request number `n`, as `muster worker` makes its keys
 * ("INSTANCE-sSLOT-N", one counter per slot).  `instance` names this process,
 * or one of its threads ("INSTANCE-t3": the head keeps the last key of each
 * prefix), unique among those that may lease as the same worker, so that no
 * two of them send the same key: the random id it registers with serves
 * (muster_worker_opts_t.instance; `muster worker` takes 32 hex digits from
 * the system's random source; up to 107 characters leave room for any `n`).
 * `n` counts the requests the head answered: the same while a call fails,
 * one more after a MUSTER_OK.  MUSTER_INVALID, `key` set to "" when `size`
 * allows, for a NULL `key`, an `instance` that is NULL, empty or has a
 * character other than letters, digits, '.', '_' and '-', or a key that
 * would be longer than MUSTER_LEASE_KEY_MAX or not fit `size`.
 */
muster_err_t muster_lease_key(char *key, size_t size, const char *instance, uint64_t n);

typedef struct {
  int64_t task, token;
  const char *result; /* complete: JSON text of the result (NULL: null) */
  const char *error;  /* fail: error text (NULL: none) */
  int permanent;      /* fail: non-zero fails the task at once, no retry */
  int64_t lease_ms;   /* extend: new lease length from now; -1: the queue's (below: refused) */
} muster_ack_t;

void muster_ack_init(muster_ack_t *ack, int64_t task, int64_t token);
/* Each call takes `count` acks in one request and is all-or-nothing: one stale
 * token refuses the whole batch with MUSTER_LEASE_LOST and changes nothing. */
muster_err_t muster_complete(muster_client_t *client, const muster_ack_t *acks, size_t count);
muster_err_t muster_fail(muster_client_t *client, const muster_ack_t *acks, size_t count);
muster_err_t muster_extend(muster_client_t *client, const muster_ack_t *acks, size_t count);
muster_err_t muster_release(muster_client_t *client, const muster_ack_t *acks, size_t count);
muster_err_t muster_flag(muster_client_t *client, const muster_ack_t *acks, size_t count);

/* What the head made of one completion (muster_complete_repeats). */
#define MUSTER_ACK_REPEATED 1       /* already completed under this token: nothing changed */
#define MUSTER_ACK_RESULT_IGNORED 2 /* with REPEATED: the stored result differs and is kept */

/*
 * muster_complete, telling which acks were repeats.  A completion sent again
 * under the token that completed the task (a retry after a lost reply) is a
 * success that changes nothing (docs/api.md, "Retrying a completion"): on
 * MUSTER_OK, repeated[i] is 0 when acks[i] completed its task now, and
 * MUSTER_ACK_REPEATED when it had been completed under that token before,
 * with MUSTER_ACK_RESULT_IGNORED added when acks[i].result differs from the
 * stored result, which stays.  `repeated` holds `count` ints and is written
 * only on MUSTER_OK; NULL makes this muster_complete.
 */
muster_err_t muster_complete_repeats(muster_client_t *client, const muster_ack_t *acks,
                                     size_t count, int *repeated);

/* How muster_end_leases ends the leases its acks name. */
typedef enum {
  MUSTER_END_FAIL = 1, /* as muster_fail */
  MUSTER_END_RELEASE,  /* as muster_release */
  MUSTER_END_FLAG,     /* as muster_flag */
} muster_end_t;

/*
 * muster_fail, muster_release or muster_flag (`how`), telling how many acks
 * were repeats.  One of these sent again under the token whose lease the
 * same call ended (a retry after a lost reply) is a success that changes
 * nothing (docs/api.md, "Retrying a fail, release or flag"): the first
 * call's error, permanent flag or reason stand.  On MUSTER_OK, *repeats is
 * how many of the `count` acks the head answered so (0: every one ended its
 * lease now).  A count, not a mark per ack, because the head counts a
 * release's repeats without naming them.  *repeats is written only on
 * MUSTER_OK; NULL makes this the plain call; a `how` not listed above is
 * MUSTER_INVALID, nothing sent.
 */
muster_err_t muster_end_leases(muster_client_t *client, muster_end_t how, const muster_ack_t *acks,
                               size_t count, size_t *repeats);

/*
 * Completes `count` acks (1 to 1000, as muster_complete) and, in the same
 * request and transaction, leases up to `max` (1 to 1000) tasks of `queue`
 * for `worker` (0: anonymous): a worker's steady state in one round trip
 * instead of two.  It never waits: *nleases is 0 when no task was ready
 * (then long-poll with muster_lease).  On MUSTER_OK *leases is an array of
 * *nleases leases to free with muster_leases_free.  It sends no request key:
 * muster_complete_lease_with with opts.request NULL.
 *
 * With `updates_after` >= 0 the reply also brings the queue's broadcast
 * updates numbered above it, and *updates (then required) gets them as JSON
 * text {"updates": [{"seq", "data", "session", "created_ms"}, ...], "last": N},
 * the form muster_update_list gives (muster_free); pass "last" as
 * `updates_after` next time.  With `updates_after` < 0 none are asked for and
 * *updates (may be NULL) is set to NULL.
 *
 * All or nothing: when a completion or the lease is refused (a stale token
 * is MUSTER_LEASE_LOST; MUSTER_QUEUE_NOT_FOUND, MUSTER_WORKER_NOT_FOUND,
 * MUSTER_INVALID) nothing is completed or leased.  Arguments out of range
 * (no acks, no queue, `max` 0 or above 1000, a negative worker, updates
 * asked for without a place for them) give MUSTER_INVALID before anything is
 * sent.
 */
muster_err_t muster_complete_lease(muster_client_t *client, const muster_ack_t *acks, size_t count,
                                   const char *queue, int64_t worker, size_t max,
                                   int64_t updates_after, muster_lease_t **leases, size_t *nleases,
                                   char **updates);

/*
 * muster_complete_lease with the lease in `opts` (set up by
 * muster_lease_opts_init; its wait_ms is not read) and its key when
 * opts->request is set.  The call sent again after an error, with the same
 * acks and key, answers its completions as repeats and its lease with the
 * leases the first try made; a program may also complete alone
 * (muster_complete_repeats) and then send the key with muster_lease_with,
 * which gets those leases the same way.  MUSTER_INVALID, nothing sent, for
 * what muster_complete_lease refuses, `opts` NULL or not set up, and a key
 * muster_lease_with refuses.  A head older than keys refuses one with a
 * message starting "lease.request: unknown field".
 */
muster_err_t muster_complete_lease_with(muster_client_t *client, const muster_ack_t *acks,
                                        size_t count, const muster_lease_opts_t *opts,
                                        int64_t updates_after, muster_lease_t **leases,
                                        size_t *nleases, char **updates);

/* ---- workers ---------------------------------------------------------- */

typedef struct {
  size_t size;               /* set by muster_worker_opts_init ("option structs" above) */
  const char *nickname;      /* leaderboard name; NULL: "anonymous" */
  const char *const *queues; /* queues it serves, NULL-terminated, or NULL */
  const char *node;          /* node id or NULL */
  const char *labels;        /* JSON object text or NULL */
  int64_t timeout_ms;        /* heartbeat timeout; -1: server default (60000); below -1: refused */
  const char *instance;      /* NULL, or this process's id (1 to 128 of [A-Za-z0-9._-], not
                              * "." or ".."): a registration sent again with it after its
                              * reply was lost gets the worker the first one made, not a
                              * second one */
} muster_worker_opts_t;

void muster_worker_opts_init_sized(muster_worker_opts_t *opts, size_t size);
#define muster_worker_opts_init(opts) muster_worker_opts_init_sized((opts), sizeof *(opts))
/* Registers a worker; *id gets its id and, if `name` is not NULL, *name its
 * generated display name (muster_free).  muster_worker_register_full also
 * gives the heartbeat timeout the head holds the worker to. */
muster_err_t muster_worker_register(muster_client_t *client, const muster_worker_opts_t *opts,
                                    int64_t *id, char **name);

/*
 * What a registration got (muster_worker_register_full).  The library fills
 * it, and it grows as the option structs do: `size`, set by
 * muster_worker_reg_init, says how many bytes of it the caller's program has,
 * and the library writes no field past them ("option structs" above).
 */
typedef struct {
  size_t size;        /* set by muster_worker_reg_init */
  int64_t id;         /* the worker's id */
  char *name;         /* its generated display name (muster_worker_reg_clear frees it) */
  int64_t timeout_ms; /* the heartbeat timeout the head holds the worker to (beat every
                       * third of it); 0 when the reply did not say (an older head):
                       * GET /v1/workers/ID has it */
  int repeated;       /* 1: the head gave back the worker an earlier registration with the
                       * same `instance` made (that reply was lost), not a new one */
} muster_worker_reg_t;

void muster_worker_reg_init_sized(muster_worker_reg_t *reg, size_t size);
#define muster_worker_reg_init(reg) muster_worker_reg_init_sized((reg), sizeof *(reg))
/* Registers a worker as muster_worker_register does and fills *reg (set up by
 * muster_worker_reg_init; its name is the caller's).  On failure reg's id is 0
 * and its name NULL.  A `reg` not set up (size 0, or less than its first
 * version's) is refused with MUSTER_INVALID before anything is sent. */
muster_err_t muster_worker_register_full(muster_client_t *client, const muster_worker_opts_t *opts,
                                         muster_worker_reg_t *reg);
/* Frees reg's name and sets it to NULL; accepts NULL. */
void muster_worker_reg_clear(muster_worker_reg_t *reg);
/* Heart-beats, with an optional progress string (NULL keeps the last one). */
muster_err_t muster_worker_heartbeat(muster_client_t *client, int64_t id, const char *progress);
/* Says goodbye: the worker's leases are released at once. */
muster_err_t muster_worker_bye(muster_client_t *client, int64_t id);

/*
 * A worker's heartbeat sent by a thread of its own (docs/client.md, "Writing
 * a worker in C").  The head counts a worker alive by its heartbeats only:
 * leasing, completing and failing do not count, so a worker that does not
 * beat is declared gone after its timeout (60 s by default), its leases
 * lapse, and its next lease is refused with MUSTER_WORKER_NOT_FOUND.
 */
typedef struct muster_worker_beat muster_worker_beat_t;
/*
 * Sends worker `id`'s heartbeat now, on `client`, and then every `period_ms`
 * from a thread with its own handle on the URL and token of `client` (-1: a
 * third of the timeout the head holds the worker to, read with GET
 * /v1/workers/ID; 0 or below -1: refused), so that the caller's thread may
 * lease and run tasks for as long as they take.  Each beat waits at most a
 * period for its reply.  MUSTER_WORKER_NOT_FOUND when the worker is gone or
 * unknown (register again); failures are explained by
 * muster_client_message(client).  Stop it with muster_worker_beat_stop.
 */
muster_err_t muster_worker_beat_start(muster_client_t *client, int64_t id, int64_t period_ms,
                                      muster_worker_beat_t **out);
/* The progress string the following beats send (copied; NULL: none, and the
 * head keeps the last one).  MUSTER_INVALID for text that is not UTF-8. */
muster_err_t muster_worker_beat_progress(muster_worker_beat_t *beat, const char *progress);
/* What the last beat got: MUSTER_OK (also before the first), or its error:
 * MUSTER_NETWORK while the head is away (the beats go on), or
 * MUSTER_WORKER_NOT_FOUND once the head declared the worker gone.
 * `message` (may be NULL; `size` bytes) gets that beat's message. */
muster_err_t muster_worker_beat_last(muster_worker_beat_t *beat, char *message, size_t size);
/* Stops the thread (waiting for a beat in flight, at most a period) and frees
 * it; accepts NULL.  It sends no goodbye: call muster_worker_bye after it. */
void muster_worker_beat_stop(muster_worker_beat_t *beat);

/* ==== iterations and the loader (docs/iterations.md, docs/api.md "Iterations") ==== */

/*
 * An iteration's configuration: the dataset's shape, how each epoch is
 * shuffled and partitioned, and (coordinated only) the lease settings.
 * muster_iter_config_init sets every field to its default; strings are the
 * wire names ("global", "dynamic", "pad").  Arrays are borrowed for the call.
 * A world_size, block_size or shuffle_block_size of 0 is refused
 * (MUSTER_INVALID), standalone as by the head.
 */
typedef struct {
  size_t size;                   /* set by muster_iter_config_init ("option structs" above) */
  uint64_t num_samples;          /* samples, when num_shards is 0 */
  size_t num_shards;             /* > 0: the dataset is shard_counts[0..num_shards) */
  const uint64_t *shard_counts;  /* samples per shard */
  const char *const *shard_uris; /* a uri per shard, or NULL */
  const uint32_t *labels;        /* a class label per sample (stratified), or NULL */
  uint64_t seed;                 /* shuffle key, below 2^63 on the wire */
  const char *shuffle;           /* "none" (default), "global", "shard" */
  uint64_t shuffle_block_size;   /* shard mode window; default 1024 */
  const char *strategy;          /* "round_robin" (default), "contiguous", "hash", "range",
                                    "stratified", "dynamic" */
  uint32_t world_size;           /* ranks; default 1 */
  uint64_t block_size;           /* samples per block; default 256 */
  uint64_t epochs;               /* default 1; 0: unbounded */
  const char *tail;              /* "keep" (default), "pad", "drop" */
  uint32_t num_partitions;       /* hash: partitions; 0: world_size */
  uint64_t hash_seed;            /* hash: seed of the sample hash */
  const uint64_t *ranges;        /* range: 2 * world_size values, begin and end per rank */
  /* coordinated only; -1: the head's default (below -1: refused, MUSTER_INVALID) */
  int64_t lease_ms;        /* block lease length (default 30000) */
  int64_t rank_timeout_ms; /* a rank silent this long is failed (default 30000) */
  int64_t replication;     /* static strategies: ranks that may take over a rank's
                              blocks, the owner included (default 1: none) */
  int cluster_sync;        /* 1: state on the head (each sample once cluster-wide);
                              0: on the node agent the client talks to (once per
                              node); -1: omitted: through an agent, 1 when the cluster
                              has more than one active node, else 0; on the head, 1 */
} muster_iter_config_t;

void muster_iter_config_init_sized(muster_iter_config_t *cfg, size_t size);
#define muster_iter_config_init(cfg) muster_iter_config_init_sized((cfg), sizeof *(cfg))

/*
 * Creates the iteration `name` on the head, or joins it when it exists with
 * the same configuration (ranks all call this).  `rank` >= 0 also registers
 * that rank as alive.  When `checkpoint` is not NULL (text from
 * muster_iter_checkpoint), the iteration starts from it, rewinding to that
 * point; `cfg` may then be NULL, or give a new world_size (elastic resume),
 * epochs, lease settings.  *json (may be NULL) receives the iteration object.
 */
muster_err_t muster_iter_create(muster_client_t *client, const char *name,
                                const muster_iter_config_t *cfg, const char *checkpoint,
                                int64_t rank, char **json);

/* A leased block: items [begin, end) of plan rank `plan_rank`'s stream, or
 * epoch positions [begin, end) for dynamic (plan_rank -1).  `indices` holds
 * the end - begin sample indices when they were asked for (else NULL). */
typedef struct {
  uint64_t epoch;
  uint64_t block; /* the block's number in its epoch */
  int64_t token;  /* fencing token: name it in muster_iter_ack */
  int64_t deadline_ms;
  int64_t plan_rank;
  uint64_t begin, end;
  int takeover;      /* non-zero: the block belonged to another rank */
  uint64_t *indices; /* end - begin indices, or NULL */
} muster_iter_block_t;

typedef enum {
  MUSTER_ITER_BLOCKS,    /* blocks were leased (possibly fewer than asked) */
  MUSTER_ITER_WAIT,      /* nothing for this rank now; ask again (after retry_ms) */
  MUSTER_ITER_EPOCH_END, /* the epoch asked for is complete */
  MUSTER_ITER_FINISHED   /* every epoch is complete */
} muster_iter_state_t;

typedef struct {
  muster_iter_state_t state;
  uint64_t epoch;   /* the iteration's current epoch */
  int64_t retry_ms; /* with WAIT: a good delay before asking again */
  muster_iter_block_t *blocks;
  size_t count;
} muster_iter_next_t;

/* Flags of muster_iter_next. */
#define MUSTER_ITER_INDICES 1 /* the blocks' sample indices too */
#define MUSTER_ITER_HELD                                                                           \
  2 /* first the blocks the rank holds (the retry of a                                             \
       next whose reply was lost; docs/api.md) */

/* Leases up to `max` blocks of epoch `epoch` for `rank`; `flags`: any of
 * MUSTER_ITER_INDICES and MUSTER_ITER_HELD (1 still means "with indices").
 * Free *out with muster_iter_next_free. */
muster_err_t muster_iter_next(muster_client_t *client, const char *name, uint32_t rank,
                              uint64_t epoch, size_t max, int flags, muster_iter_next_t *out);
void muster_iter_next_free(muster_iter_next_t *next);

/* A page of the blocks a rank holds (muster_iter_held). */
typedef struct {
  uint64_t epoch; /* the iteration's current epoch (every block's `epoch`) */
  int finished;   /* non-zero: every epoch is complete, so nothing is held */
  uint64_t total; /* the blocks the rank holds in the epoch, on every page */
  int64_t next;   /* the `cursor` of the following page; -1: this page is the last */
  muster_iter_block_t *blocks;
  size_t count;
} muster_iter_held_t;

/* Lists the blocks `rank` holds in the iteration's current epoch (leased to
 * it and not acknowledged), lowest first, numbered `cursor` or above, at most
 * `max` of them (0: as many as the head lists by default; else 1 to 1000),
 * and changes nothing: no block is leased, no lease extended, and the rank
 * is not marked alive (docs/api.md, "GET /v1/iterations/{name}/held").
 * `flags`: MUSTER_ITER_INDICES for their sample indices.  Fails with
 * MUSTER_ITERATION_NOT_FOUND, or MUSTER_INVALID for a rank not below the
 * world size (the message says which).  Free *out with muster_iter_held_free. */
muster_err_t muster_iter_held(muster_client_t *client, const char *name, uint32_t rank,
                              uint64_t cursor, size_t max, int flags, muster_iter_held_t *out);
void muster_iter_held_free(muster_iter_held_t *held);

/* Marks `count` blocks done (all or nothing); `tokens[i]` goes with `blocks[i]`
 * of epoch `epoch`.  MUSTER_LEASE_LOST when a lease was lost (nothing done). */
muster_err_t muster_iter_ack(muster_client_t *client, const char *name, uint32_t rank,
                             uint64_t epoch, const uint64_t *blocks, const int64_t *tokens,
                             size_t count);
/* Says that `rank` is alive and extends its leases. */
muster_err_t muster_iter_heartbeat(muster_client_t *client, const char *name, uint32_t rank);
/* The iteration object with per-rank health as JSON (muster_free). */
muster_err_t muster_iter_status(muster_client_t *client, const char *name, char **json);
/* The iteration's checkpoint as JSON text (muster_free): small, to store with
 * a model checkpoint and pass to muster_iter_create later. */
muster_err_t muster_iter_checkpoint(muster_client_t *client, const char *name, char **json);
muster_err_t muster_iter_delete(muster_client_t *client, const char *name);

/* ---- the loader ---- */

typedef struct muster_loader muster_loader_t;

/* Loads sample `index` into *sample (owned by the caller of muster_loader_next
 * afterwards); returns 0, or non-zero to fail the loader: muster_loader_next
 * then fails with MUSTER_INVALID ("the load callback failed for sample N")
 * at that sample, and keeps failing, until a restore.  Runs on the prefetch
 * thread when there is one. */
typedef int (*muster_load_fn)(void *user, uint64_t index, void **sample);
/* Frees a sample the loader drops (buffered at close, reset or restore). */
typedef void (*muster_sample_free_fn)(void *user, void *sample);

typedef struct {
  size_t size;                        /* set by muster_loader_opts_init ("option structs") */
  const muster_iter_config_t *config; /* required */
  uint32_t rank;
  const char *url;           /* NULL: standalone (no head); else coordinated through this head */
  const char *token;         /* bearer token of the head */
  const char *name;          /* coordinated: the iteration (created or joined) */
  const char *checkpoint;    /* coordinated: create the iteration from this checkpoint */
  size_t prefetch;           /* samples buffered ahead by a thread; 0: no thread */
  size_t blocks_per_request; /* coordinated: blocks leased per request (default 2) */
  muster_load_fn load;       /* optional */
  muster_sample_free_fn free_sample; /* optional */
  void *user;
  /* coordinated: how long a request the head does not answer (down,
   * restarting, a reply lost) is sent again before the loader fails, the
   * open's create-or-join included (muster_loader_open then waits as long);
   * default 600000 (muster_loader_opts_init), 0: fail at once */
  int64_t head_wait_ms;
} muster_loader_opts_t;

typedef struct {
  uint64_t samples_loaded;    /* samples returned by next */
  uint64_t prefetch_hits;     /* returned without waiting */
  uint64_t prefetch_misses;   /* had to wait (or load synchronously) */
  double avg_load_time_us;    /* mean time of the load callback (or index computation) */
  uint64_t checkpoints;       /* checkpoints taken */
  double utilization;         /* fraction of the loader's life the producer was busy */
  uint64_t blocks_acked;      /* coordinated: blocks acknowledged */
  uint64_t blocks_taken_over; /* coordinated: blocks leased from another rank */
  size_t buffer_peak;         /* most samples ever buffered (<= prefetch) */
  uint64_t epoch;             /* current epoch */
  uint64_t head_retries;      /* coordinated: requests sent again (head_wait_ms) */
} muster_loader_stats_t;

void muster_loader_opts_init_sized(muster_loader_opts_t *opts, size_t size);
#define muster_loader_opts_init(opts) muster_loader_opts_init_sized((opts), sizeof *(opts))
/* Opens a loader; on failure *out is NULL and, when `message` is not NULL,
 * *message explains (muster_free). */
muster_err_t muster_loader_open(const muster_loader_opts_t *opts, muster_loader_t **out,
                                char **message);
/* The next sample: *has = 1 with *index (and *sample when a load callback is
 * set; may be NULL) filled, or *has = 0 at the end of the epoch. */
muster_err_t muster_loader_next(muster_loader_t *loader, uint64_t *index, void **sample, int *has);
/* Up to `max` samples; *got < max only at the end of the epoch.  `samples` may be NULL. */
muster_err_t muster_loader_next_batch(muster_loader_t *loader, uint64_t *indices, void **samples,
                                      size_t max, size_t *got);
/* Samples this rank is assigned per epoch (coordinated: its static share). */
uint64_t muster_loader_len(const muster_loader_t *loader);
int muster_loader_is_empty(const muster_loader_t *loader);
/* Starts the next epoch.  MUSTER_INVALID after the last one, and, coordinated,
 * before the current one ended; a refused reset leaves the loader where it was
 * (the rest of the epoch comes next).  After next failed (a load callback, a
 * head that stayed away) reset refuses too, with that failure: the rest of the
 * epoch was never read.  Standalone, restore the checkpoint taken then (it
 * stands before the sample that failed); coordinated, open the loader again. */
muster_err_t muster_loader_reset(muster_loader_t *loader);
/* The loader's checkpoint as JSON text (muster_free).  Standalone: this rank's
 * position; coordinated: the iteration's (finished blocks are acked first). */
muster_err_t muster_loader_get_checkpoint(muster_loader_t *loader, char **text);
/* Standalone: resumes at a checkpoint of the same configuration and rank (a
 * refused one leaves the loader where it was; a text that is not JSON is
 * refused saying where the parser stopped: "text: not valid JSON: invalid
 * token near 'not' (at column 3)").  Coordinated loaders restore at open
 * (opts.checkpoint). */
muster_err_t muster_loader_restore(muster_loader_t *loader, const char *text);
void muster_loader_stats(muster_loader_t *loader, muster_loader_stats_t *stats);
/* Why the loader's last call failed ("" when it succeeded; a failure that
 * stays, as after a load callback failed, is said again by each next). */
const char *muster_loader_message(const muster_loader_t *loader);
/* Stops the thread, acks finished blocks, frees buffered samples; accepts NULL. */
void muster_loader_close(muster_loader_t *loader);

/* ==== end of iterations and the loader ==== */

/* ==== pools and sessions (docs/pools.md, docs/api.md "Sessions", "Updates", "Nodes") ==== */

/*
 * A session is a client's scope over one queue: its tasks carry the session id
 * and an index, and their results are read back as a stream in submission
 * order or in completion order.  A pool (below) is a session plus the
 * bookkeeping that turns the stream into `map` and `imap_unordered`.
 */
typedef struct {
  size_t size;           /* set by muster_session_opts_init ("option structs" above) */
  const char *queue;     /* required; must exist */
  int cleanup_on_exit;   /* 1: cancel and delete everything when the client stops calling;
                            0: keep the session until closed; -1: the head's default (1) */
  int64_t timeout_ms;    /* the client's heartbeat timeout; -1: the head's default (60000);
                            below -1: refused (MUSTER_INVALID) */
  const char *init_data; /* JSON text handed to workers, or NULL */
} muster_session_opts_t;

void muster_session_opts_init_sized(muster_session_opts_t *opts, size_t size);
#define muster_session_opts_init(opts) muster_session_opts_init_sized((opts), sizeof *(opts))
/* Creates a session.  *id (may be NULL) receives its id and *json (may be
 * NULL) the session object; both are the caller's (muster_free). */
muster_err_t muster_session_create(muster_client_t *client, const muster_session_opts_t *opts,
                                   char **id, char **json);
/* The session object as JSON (muster_free); MUSTER_SESSION_NOT_FOUND when it
 * is unknown or closed. */
muster_err_t muster_session_get(muster_client_t *client, const char *id, char **json);
/* {"sessions": [...]} (the open ones) as JSON (muster_free). */
muster_err_t muster_session_list(muster_client_t *client, char **json);
/* Says that the session's client is alive (every call naming it does too). */
muster_err_t muster_session_heartbeat(muster_client_t *client, const char *id);
/*
 * Submits `count` tasks (at most 1000) to session `id`, all or none.  Only
 * `payload`, `priority` and `index` of each spec are used (index -1: the
 * session's next index); a spec with a key, a delay or a session is refused
 * with MUSTER_INVALID.  `ids` and `indexes` (each NULL or `count` long)
 * receive the task ids and indexes in order.
 */
muster_err_t muster_session_put(muster_client_t *client, const char *id,
                                const muster_task_spec_t *specs, size_t count, int64_t *ids,
                                int64_t *indexes);
/* muster_session_put, where every task requires the `nlevels` levels of
 * `levels`, checked as muster_put_requiring checks them. */
muster_err_t muster_session_put_requiring(muster_client_t *client, const char *id,
                                          const muster_task_spec_t *specs, size_t count,
                                          const muster_shared_level_t *levels, size_t nlevels,
                                          int64_t *ids, int64_t *indexes);

typedef enum {
  MUSTER_ORDER_SUBMISSION, /* by index: cursor is the first index wanted */
  MUSTER_ORDER_COMPLETION  /* as they finished: cursor is a completion sequence number */
} muster_order_t;

/* One finished task of a session. */
typedef struct {
  int64_t index; /* position within the session */
  int64_t task;  /* task id */
  int ok;        /* 1: done (result holds its result); 0: failed or dead (error says why) */
  char *state;   /* "done", "failed" or "dead" */
  char *result;  /* JSON text of the result ("null" when none); NULL unless ok */
  char *error;   /* why it failed, or NULL */
  int64_t seq;   /* completion sequence number */
} muster_result_t;

/* A page of the results stream. */
typedef struct {
  muster_result_t *results;
  size_t count;
  int64_t cursor;    /* pass it as the next call's cursor */
  int64_t total;     /* tasks in the session */
  int64_t done;      /* of them finished (done, failed or dead) */
  int64_t gap_first; /* submission order: the page stops at indexes gap_first..gap_last, */
  int64_t gap_last;  /* which have no task (docs/api.md, "gap"); both -1 when it does not */
} muster_results_t;

/*
 * Reads up to `max` (0: the head's default; at most 1000) results of session
 * `id` from `cursor` in `order` (another value is refused: MUSTER_INVALID),
 * waiting up to `wait_ms` (0: not at all; a negative one is refused) when
 * none is ready (long-poll).  Free *out with
 * muster_results_free, also after a failure.
 *
 * In submission order a page may stop at a gap: indexes that no task has
 * (explicit indexes skipped them).  Another producer may still fill it, so
 * the head waits there as anywhere; but once every task of the session has
 * its result (done >= total) nothing can come at the cursor, and a call that
 * reads nothing there fails with MUSTER_INDEX_GAP instead of returning empty
 * pages for ever (after its wait_ms, unless it was already waiting when the
 * last result came): *out holds the cursor, counts and gap, and
 * muster_client_message() names the indexes.  A page that has results and
 * stops at such a gap is returned as usual (check gap_first and done); read
 * again with wait_ms 0 to fail at once, or to read the gap if it was filled.
 */
muster_err_t muster_session_results(muster_client_t *client, const char *id, muster_order_t order,
                                    int64_t cursor, size_t max, int64_t wait_ms,
                                    muster_results_t *out);
/* muster_session_results, and *sealed (may be NULL) says whether the session
 * was sealed (muster_session_seal) when the page was read: 1, 0, or -1 when
 * the head did not say (an older head).  A page read from a sealed session
 * with done >= total, no gap and fewer than `max` results is the end of the
 * stream: no task can be put any more. */
muster_err_t muster_session_results_sealed(muster_client_t *client, const char *id,
                                           muster_order_t order, int64_t cursor, size_t max,
                                           int64_t wait_ms, muster_results_t *out, int *sealed);
/* Seals session `id`: it takes no more tasks (a put is refused with
 * MUSTER_INVALID_STATE), and a reader of its results learns when it has them
 * all.  Sealing a sealed session is no error: *already (may be NULL) says it
 * was (1) or not (0).  MUSTER_SESSION_NOT_FOUND for an unknown or closed
 * session; MUSTER_NOT_FOUND from a head older than sealing (the message says
 * so). */
muster_err_t muster_session_seal(muster_client_t *client, const char *id, int *already);
void muster_results_free(muster_results_t *results);
/* Frees what one result owns (not the struct); accepts NULL. */
void muster_result_clear(muster_result_t *result);
/* Closes the session: its unfinished tasks are cancelled, its tasks, results
 * and updates deleted.  *cancelled (may be NULL) gets the cancelled count. */
muster_err_t muster_session_close(muster_client_t *client, const char *id, int64_t *cancelled);

/* Posts a broadcast update (JSON text `data`) to every worker of `queue`;
 * `session` (may be NULL) deletes it with that session.  *seq (may be NULL)
 * receives its sequence number (1, 2, 3, ... per queue). */
muster_err_t muster_update_post(muster_client_t *client, const char *queue, const char *data,
                                const char *session, int64_t *seq);
/* {"updates": [...], "last": N} with seq > `after`, at most `max` (0: default). */
muster_err_t muster_update_list(muster_client_t *client, const char *queue, int64_t after,
                                size_t max, char **json);
/* {"nodes": [...]} and {"workers": [...]} as JSON (muster_free). */
muster_err_t muster_node_list(muster_client_t *client, char **json);
muster_err_t muster_worker_list(muster_client_t *client, char **json);

/* ---- pools ---- */

/*
 * A pool runs inputs through the workers of one queue, like
 * multiprocessing.Pool: `map` returns results in input order,
 * `imap_unordered` hands them out as they finish.  It owns a session (created
 * at open, closed at close) and, unless heartbeat_ms is 0, a thread that keeps
 * the session alive while the caller is busy.  Every input's result is handed
 * to the caller exactly once, even when its task ran twice (a node was lost,
 * a lease expired): the head's stream names each index once, and the pool
 * drops any index it has already delivered.  A pool is used by one thread at
 * a time.
 */
typedef struct muster_pool muster_pool_t;
typedef struct muster_pool_iter muster_pool_iter_t;

typedef struct {
  size_t size;           /* set by muster_pool_opts_init ("option structs" above) */
  const char *url;       /* head or node URL (required) */
  const char *token;     /* bearer token */
  const char *queue;     /* the workers' queue (required) */
  const char *init_data; /* JSON text for the session's init_data, or NULL */
  const char *session;   /* attach to this open session instead of creating one */
  int create_queue;      /* non-zero (default): create the queue when it does not exist */
  int cleanup_on_exit;   /* as in muster_session_opts_t; -1: default */
  int64_t timeout_ms;    /* the session's heartbeat timeout; -1: default */
  int64_t heartbeat_ms;  /* heartbeat thread period; 0: no thread; -1: timeout / 4 */
  int keep_session;      /* non-zero: close leaves the session open (to resume later) */
  /* Added after the first version (a struct that ends before it gets the
   * default): each request's timeout in ms (the pool's handles, the
   * heartbeat thread's included, as muster_client_set_timeout); a long-poll
   * of muster_pool_iter_next or muster_pool_map adds its wait (map's are up
   * to 20 s each), so a head that stops answering fails iter_next with
   * MUSTER_NETWORK after about this plus that wait (map sends it again, as
   * said at muster_pool_map).  0: the default (60000);
   * negative: muster_pool_open refuses it (MUSTER_INVALID), as it does
   * timeout_ms and heartbeat_ms below -1. */
  int64_t request_timeout_ms;
  /* Added later too: the shared data every task of the pool requires (as
   * muster_session_put_requiring; copied at open, which refuses what that
   * call would); NULL and 0: none. */
  const muster_shared_level_t *required;
  size_t required_count;
} muster_pool_opts_t;

void muster_pool_opts_init_sized(muster_pool_opts_t *opts, size_t size);
#define muster_pool_opts_init(opts) muster_pool_opts_init_sized((opts), sizeof *(opts))
/* Opens a pool; on failure *out is NULL and, when `message` is not NULL,
 * *message explains (muster_free). */
muster_err_t muster_pool_open(const muster_pool_opts_t *opts, muster_pool_t **out, char **message);
/* The session id (owned by the pool). */
const char *muster_pool_session(const muster_pool_t *pool);
/* The session's heartbeat timeout in ms, as the head reported it at open: a
 * caller who cannot reach the head for that long has likely lost the session. */
int64_t muster_pool_timeout_ms(const muster_pool_t *pool);
/* Makes muster_pool_close leave the session open (as opts.keep_session does),
 * e.g. when giving up on an unreachable head so the results can be read later. */
void muster_pool_keep_session(muster_pool_t *pool);
/* Why the pool's last call failed ("" when it succeeded). */
const char *muster_pool_message(const muster_pool_t *pool);
/* What sent the last reply to the pool's calls, as muster_client_server says
 * it (the pool's URL may be a node agent's). */
muster_server_t muster_pool_server(const muster_pool_t *pool);

/*
 * Submits `count` inputs (JSON texts; copied) and returns an iterator over
 * their results, in input order when `ordered`, else as they finish.  The
 * inputs get consecutive session indexes; result i of the iterator (ordered)
 * belongs to inputs[i].  Every input is checked first: one that is NULL or
 * not JSON is refused with MUSTER_INVALID ("inputs[7]: not valid JSON: ..."),
 * nothing submitted.  Free the iterator with muster_pool_iter_free.
 */
muster_err_t muster_pool_imap(muster_pool_t *pool, const char *const *inputs, size_t count,
                              int ordered, muster_pool_iter_t **out);
/* muster_pool_imap(pool, inputs, count, 0, out). */
muster_err_t muster_pool_imap_unordered(muster_pool_t *pool, const char *const *inputs,
                                        size_t count, muster_pool_iter_t **out);
/*
 * The iterator's next result, waiting up to `wait_ms` (-1: until one comes;
 * below -1: refused).
 * *has = 1 and *out filled (clear it with muster_result_clear; out->index is
 * the input's position, 0-based, in the inputs of this iterator), or *has = 0
 * when every result was delivered or the wait ran out (muster_pool_iter_done
 * tells which).
 */
muster_err_t muster_pool_iter_next(muster_pool_iter_t *it, int64_t wait_ms, muster_result_t *out,
                                   int *has);
/* Non-zero when every result of the iterator was delivered. */
int muster_pool_iter_done(const muster_pool_iter_t *it);
/* Results delivered so far and the iterator's input count. */
void muster_pool_iter_progress(const muster_pool_iter_t *it, size_t *delivered, size_t *total);
/* Results the head repeated and the pool dropped (0 unless something went wrong). */
size_t muster_pool_iter_duplicates(const muster_pool_iter_t *it);
/* The results-stream cursor the iterator reads from next: a session index when
 * ordered, a completion sequence number when not.  Every result before it that
 * belongs to the iterator was delivered (or is buffered, when called between
 * two successful muster_pool_iter_next calls); after a failed call, reading
 * the stream (muster_session_results) from it resumes where the iterator was. */
int64_t muster_pool_iter_cursor(const muster_pool_iter_t *it);
/*
 * Why the iterator's results are late, for a caller whose own deadline
 * passed while muster_pool_iter_next gave nothing: jobs that fail on every
 * attempt (a shared level they require that is missing, say) give no result
 * until their attempts are spent.  Reads one page of the queue's tasks (the
 * first 100 from the iterator's first task, without payloads) and sets *text
 * (muster_free) to what its unfinished tasks that failed and wait to be tried
 * again failed with, the newest of up to three distinct errors first, in the
 * words of the TimeoutError of Python's Pool:
 *   "2 of this call's unfinished jobs failed at least once and wait to be
 *   tried again, the newest first: job 1 (attempt 5): required shared data
 *   models/w level 1: shared_not_found: ... (and 1 more with these errors)"
 * (job I: the input's position), or to "" when none has.  On failure (the
 * head did not answer: MUSTER_NETWORK, ...) *text is NULL and
 * muster_pool_message says why; the iterator is unchanged either way.
 */
muster_err_t muster_pool_iter_failing(muster_pool_iter_t *it, char **text);
void muster_pool_iter_free(muster_pool_iter_t *it);

/*
 * Runs `count` inputs (checked as muster_pool_imap checks them) and waits for
 * all results: on MUSTER_OK *results is an array of `count` results in input
 * order (free with muster_pool_results_free).  A failed input is a result
 * with ok = 0, not a failure of the call.  A read that gets no answer (a head
 * down or restarting: MUSTER_NETWORK, MUSTER_UNAVAILABLE) is sent again every
 * second, from where it was, for up to the session's timeout from the first
 * failure; then the call fails with that error, and the results read are
 * freed (muster_pool_map_partial keeps them).
 */
muster_err_t muster_pool_map(muster_pool_t *pool, const char *const *inputs, size_t count,
                             muster_result_t **results);
/*
 * muster_pool_map, which on failure still gives the results it read.  On
 * MUSTER_OK it is muster_pool_map, and *unread (may be NULL) is 0.  On a
 * failure once the inputs were checked (a head away past the session's
 * timeout, a submission that failed, the session closed meanwhile) *results
 * is still an array of `count` in input order, every element's `index` its
 * input's position: a result read has its `state` set, as map gives it; one
 * not read is zeroed but for `index` (`state` NULL), and *unread is how
 * many.  Submit those inputs again (their tasks may have run, or may still
 * run, in the session) and keep the rest; free the array with
 * muster_pool_results_free either way.  *results is NULL when nothing was
 * submitted: the arguments or an input refused (MUSTER_INVALID), or no
 * memory for the array.
 */
muster_err_t muster_pool_map_partial(muster_pool_t *pool, const char *const *inputs, size_t count,
                                     muster_result_t **results, size_t *unread);
void muster_pool_results_free(muster_result_t *results, size_t count);

/* Broadcasts `data` (JSON text) to every worker of the pool's queue, between
 * two tasks; *seq (may be NULL) gets its number.  Deleted with the session. */
muster_err_t muster_pool_update_workers(muster_pool_t *pool, const char *data, int64_t *seq);
/* Active workers serving the pool's queue (worker processes, not machines). */
muster_err_t muster_pool_workers_count(muster_pool_t *pool, size_t *count);
/* Machines running an active worker of the pool's queue: the distinct nodes
 * (agents) of the workers muster_pool_workers_count counts, a worker with no
 * node counting as a machine of its own; nodes whose workers all serve other
 * queues do not count.  The same as Python's Pool.get_nodes_count(). */
muster_err_t muster_pool_nodes_count(muster_pool_t *pool, size_t *count);
/* Stops the heartbeat thread, closes the session (unless keep_session) and
 * frees the pool; accepts NULL.  Unfinished tasks are cancelled. */
void muster_pool_close(muster_pool_t *pool);

/* ==== end of pools and sessions ==== */

/* ==== worker plugin ABI (docs/node.md "Worker plugins") ==== */

/*
 * A worker plugin is a shared object that `muster worker --plugin PATH` (and
 * `muster node --plugin PATH`, one worker per GPU) loads with dlopen() instead
 * of running a command per task.  It exports one function,
 *
 *     const muster_plugin_t *muster_plugin(void);
 *
 * returning a static descriptor whose `abi` is MUSTER_PLUGIN_ABI.  The runner
 * calls, all from the same thread (so thread-bound state such as a CUDA
 * context stays valid): init once per worker process, then handle_update for
 * each broadcast update in sequence order and run for each task, never two
 * at once (updates are applied between tasks), and fini before the worker
 * exits normally.  A plugin that crashes takes its worker process down; the
 * node agent restarts it and the task's attempt counts.  Strings passed in are
 * NUL-terminated, valid only during the call, and JSON text unless said
 * otherwise.  A runner loads plugins of ABI MUSTER_PLUGIN_ABI_MIN to
 * MUSTER_PLUGIN_ABI; fields added by a later ABI come at the end of their
 * struct, so a plugin built for an older one reads what it knows.
 */
#define MUSTER_PLUGIN_ABI 2     /* 2: tasks carry the shared data they require */
#define MUSTER_PLUGIN_ABI_MIN 1 /* the oldest ABI a runner still loads */
#define MUSTER_PLUGIN_SYMBOL "muster_plugin"

/*
 * ABI 2: one level of shared data a task requires (docs/shared-data.md
 * "Workers").  The runner fetched it through the node's cache before run():
 * `path` is a read-only local file holding exactly `size` bytes, kept by the
 * runner until a task requires another level of the same blob (so a plugin may
 * keep it mapped, or keep what it loaded from it, while `level` stays the same).
 */
typedef struct {
  const char *scope;
  const char *name;
  int64_t level;
  const char *path;     /* the level's bytes on this machine; never write to it */
  int64_t size;         /* bytes */
  const char *checksum; /* xxHash64 of the bytes, 16 hex digits (the head's ETag) */
} muster_plugin_shared_t;

typedef struct {
  int64_t id;      /* task id */
  int64_t attempt; /* 1 on the first lease of the task */
  const char *queue;
  const char *payload; /* JSON text of the payload (a string payload is "\"...\"") */
  size_t payload_len;
  const char *session; /* session id or NULL */
  int64_t index;       /* index within the session, or -1 */
  int64_t worker;      /* the worker's id */
  /* ABI 2 (a plugin that declares abi >= 2 may read these): the task's
   * "requires", each level already local; NULL and 0 when it requires none. */
  const muster_plugin_shared_t *shared;
  size_t shared_count;
} muster_plugin_task_t;

typedef struct {
  char *result;  /* run returned 0: JSON text of the result, malloc()ed by the plugin and
                    freed by the runner; NULL stores null */
  char *error;   /* run returned non-zero: malloc()ed error text (NULL: "plugin failed") */
  int permanent; /* run returned non-zero: non-zero fails the task for good, no retry */
} muster_plugin_result_t;

typedef struct {
  int64_t seq;      /* the update's number in its queue: 1, 2, 3, ... */
  const char *data; /* JSON text of the update's data */
  size_t data_len;
  const char *queue;
  const char *session; /* the session that posted it, or NULL */
} muster_plugin_update_t;

typedef struct {
  uint32_t abi;     /* MUSTER_PLUGIN_ABI */
  const char *name; /* for logs; may be NULL */
  /* Prepares the worker; `init_data` is JSON text (--init-data; "null" when not
   * given).  *state is handed to the other calls.  Non-zero: the worker exits. */
  int (*init)(const char *init_data, void **state);
  /* Runs one task: 0 completes it with result->result, non-zero fails it. */
  int (*run)(void *state, const muster_plugin_task_t *task, muster_plugin_result_t *result);
  /* Applies one update (may be NULL).  Non-zero is logged; the update counts as delivered. */
  int (*handle_update)(void *state, const muster_plugin_update_t *update);
  /* Releases what init made (may be NULL). */
  void (*fini)(void *state);
} muster_plugin_t;

typedef const muster_plugin_t *(*muster_plugin_entry_t)(void);

/* ==== end of worker plugin ABI ==== */

/* ==== shared data (docs/shared-data.md, docs/api.md "Shared data") ==== */

/*
 * Shared data are versioned blobs (scope, name, level) -> bytes with a time to
 * live, kept on the head and read by workers through their node's cache.  The
 * scope is an open session's id (the blob goes with the session) or a global
 * name.  Levels count up from 1 by exactly one: muster_shared_set creates
 * level 1, muster_shared_update creates the level it names, which must be the
 * current one + 1 (MUSTER_VERSION_MISMATCH otherwise, with the expected level
 * in the message).  A missing or expired blob is MUSTER_SHARED_NOT_FOUND.
 * Bytes travel raw; uploads and downloads through a file descriptor stream
 * and never hold the blob in memory.  Each of these calls opens its own
 * connection (the handle's keep-alive connection is left as it is).  A
 * transfer has no overall time limit (blobs may be large); it fails with
 * MUSTER_NETWORK when connecting takes longer than the handle's timeout
 * (muster_client_set_timeout, 60 s by default), or when no byte moves for
 * that long.
 */

/* What the head says about one level. */
typedef struct {
  int64_t level;      /* the level stored or read */
  int64_t size;       /* bytes */
  char checksum[17];  /* xxHash64 of the bytes, 16 hex digits (the ETag) */
  int64_t ttl_ms;     /* set/update: the ttl applied (clamped to the head's maximum) */
  int ttl_clamped;    /* set/update: non-zero when the ttl asked for was above it */
  int64_t expires_ms; /* when the blob expires unless updated (ms since the epoch) */
} muster_shared_info_t;

/* Progress of a transfer: `done` bytes of `total` (-1 when unknown). */
typedef void (*muster_progress_fn)(void *user, int64_t done, int64_t total);

typedef struct {
  size_t size;                 /* set by muster_shared_opts_init ("option structs" above) */
  int64_t level;               /* put: the level to create (0: 1, a set); get: the level
                                  to read (0: the newest); negative: refused */
  int64_t ttl_ms;              /* put: -1 (default): the head's maximum (600000 by default);
                                  below -1: refused */
  muster_progress_fn progress; /* called while bytes move (NULL: none) */
  void *user;                  /* handed to progress */
} muster_shared_opts_t;

void muster_shared_opts_init_sized(muster_shared_opts_t *opts, size_t size);
#define muster_shared_opts_init(opts) muster_shared_opts_init_sized((opts), sizeof *(opts))

/* Creates level 1 of (scope, name) from `len` bytes of `data`, with `ttl_ms`
 * (-1: the head's maximum; below -1: MUSTER_INVALID).  MUSTER_VERSION_MISMATCH
 * when the blob exists.
 * `info` (may be NULL) receives what was stored. */
muster_err_t muster_shared_set(muster_client_t *client, const char *scope, const char *name,
                               const void *data, size_t len, int64_t ttl_ms,
                               muster_shared_info_t *info);
/* Creates level `level` (the current level + 1; 0 or 1: level 1, as
 * muster_shared_set; negative: MUSTER_INVALID) and refreshes the ttl. */
muster_err_t muster_shared_update(muster_client_t *client, const char *scope, const char *name,
                                  int64_t level, const void *data, size_t len, int64_t ttl_ms,
                                  muster_shared_info_t *info);
/* Uploads from file descriptor `fd` (read from its current position): `len`
 * bytes, or until end of file when `len` is -1 (sent chunked).  `opts` may be
 * NULL (a set with the default ttl).  MUSTER_IO when `fd` cannot be read. */
muster_err_t muster_shared_put_fd(muster_client_t *client, const char *scope, const char *name,
                                  int fd, int64_t len, const muster_shared_opts_t *opts,
                                  muster_shared_info_t *info);
/* Reads level `level` (0: the newest; negative: MUSTER_INVALID) into a fresh buffer: *data
 * (muster_free; NUL-terminated for convenience, not counted in *len).  The bytes are checked
 * against the checksum (MUSTER_PROTOCOL when they differ). */
muster_err_t muster_shared_get(muster_client_t *client, const char *scope, const char *name,
                               int64_t level, void **data, size_t *len, muster_shared_info_t *info);
/* Writes the bytes of opts->level (0: the newest; `opts` may be NULL) to file
 * descriptor `fd` as they arrive; checked like muster_shared_get.  MUSTER_IO
 * when `fd` cannot be written ("cannot write the blob: No space left on
 * device"). */
muster_err_t muster_shared_get_fd(muster_client_t *client, const char *scope, const char *name,
                                  int fd, const muster_shared_opts_t *opts,
                                  muster_shared_info_t *info);
/* What the head holds of level `level` (0: the newest) without its bytes (a
 * HEAD request): info->level, size, checksum and expires_ms (the ttl fields
 * are 0).  MUSTER_SHARED_NOT_FOUND when that level is not stored now (never
 * made, expired, deleted, or a session scope that is not open), with the
 * head's message saying which: a HEAD reply has no body, so it comes in the
 * reply's X-Muster-Error header (docs/api.md, "Errors"); from an older head
 * without it, the message is the library's. */
muster_err_t muster_shared_stat(muster_client_t *client, const char *scope, const char *name,
                                int64_t level, muster_shared_info_t *info);
/* Deletes every level; *levels (may be NULL) gets how many there were. */
muster_err_t muster_shared_delete(muster_client_t *client, const char *scope, const char *name,
                                  int64_t *levels);
/* {"scope", "blobs": [{"name", "level", "levels", "size", "checksum", "ttl_ms",
 * "expires_ms"}]} as JSON (muster_free). */
muster_err_t muster_shared_list(muster_client_t *client, const char *scope, char **json);

/* ==== end of shared data ==== */

#ifdef __cplusplus
}
#endif
#endif /* MUSTER_H */
