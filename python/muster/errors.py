"""Typed exceptions carrying the server's error code (the table of include/muster.h).

Every failure of a call is a :class:`MusterError` with ``.code`` (the stable wire
string, e.g. ``"lease_lost"``), ``.status`` (the HTTP status, 0 when no reply
arrived) and ``.message`` (the server's explanation).  Catch the subclass you
can handle::

    try:
        client.complete(task, token, result)
    except muster.LeaseLost:
        pass            # the lease expired and the task went to someone else
"""


class MusterError(Exception):
    """Base class: ``code``, ``status`` and ``message`` as the server sent them."""

    default_code = "internal"

    def __init__(self, message="", code=None, status=0):
        self.code = code or self.default_code
        self.status = status
        self.message = message
        super().__init__("%s: %s" % (self.code, message) if message else self.code)


class BadRequest(MusterError):
    """400: the request is malformed (``bad_request``, ``bad_json``)."""
    default_code = "bad_request"


class InvalidArgument(BadRequest):
    """400 ``invalid_argument``: a field is missing or has a wrong type or value."""
    default_code = "invalid_argument"


class NameInvalid(InvalidArgument):
    """400 ``name_invalid``: names are 1 to 128 characters of [A-Za-z0-9._-], other than
    ``.`` and ``..`` (URLs collapse them)."""
    default_code = "name_invalid"


class Unauthorized(MusterError):
    """401: no token, or a wrong one."""
    default_code = "unauthorized"


class Forbidden(MusterError):
    """403: this token may not do that."""
    default_code = "forbidden"


class NotFound(MusterError):
    """404: no such endpoint, or no such object (see the subclasses)."""
    default_code = "not_found"


class QueueNotFound(NotFound):
    default_code = "queue_not_found"


class TaskNotFound(NotFound):
    default_code = "task_not_found"


class WorkerNotFound(NotFound):
    """The worker does not exist or timed out: register again."""
    default_code = "worker_not_found"


class NodeNotFound(NotFound):
    default_code = "node_not_found"


class SessionNotFound(NotFound):
    """The session does not exist or was closed."""
    default_code = "session_not_found"


class IterationNotFound(NotFound):
    default_code = "iteration_not_found"


class SharedNotFound(NotFound):
    """No shared blob of that scope, name and level, or it expired."""
    default_code = "shared_not_found"


class MethodNotAllowed(MusterError):
    default_code = "method_not_allowed"


class Conflict(MusterError):
    """409: the object is not in a state that allows the call (see the subclasses)."""
    default_code = "invalid_state"


class LeaseLost(Conflict):
    """409 ``lease_lost``: the lease expired, was released or went to another worker."""
    default_code = "lease_lost"


class InvalidState(Conflict):
    default_code = "invalid_state"


class QueueInUse(Conflict):
    """409 ``queue_in_use``: another queue names this one as its next stage."""
    default_code = "queue_in_use"


class VersionMismatch(Conflict):
    """409 ``version_mismatch``: a shared-data update level was skipped or repeated."""
    default_code = "version_mismatch"


class TooLarge(MusterError):
    """413: a body, batch or payload above the server's limits."""
    default_code = "body_too_large"


class BodyTooLarge(TooLarge):
    default_code = "body_too_large"


class BatchTooLarge(TooLarge):
    default_code = "batch_too_large"


class PayloadTooLarge(TooLarge):
    default_code = "payload_too_large"


class UnsupportedMediaType(MusterError):
    default_code = "unsupported_media_type"


class ServerError(MusterError):
    """500: the server's fault (``internal``, ``store_error``); nothing was applied."""
    default_code = "internal"


class StoreError(ServerError):
    default_code = "store_error"


class Unavailable(MusterError):
    """503: the head is shutting down."""
    default_code = "unavailable"


class NetworkError(MusterError, ConnectionError):
    """No reply arrived: the server could not be reached or closed the connection."""
    default_code = "network"


class ProtocolError(MusterError):
    """The reply could not be understood."""
    default_code = "protocol"


class IndexGap(MusterError):
    """A reader of a session's results in submission order is at a gap: indexes from
    ``first`` to ``last`` have no task, yet every task submitted (``total``) has its result,
    so no result can come at ``cursor`` (== ``first``) unless tasks are submitted there.
    Raised by the clients' results iterators (never sent by a head: the reply's ``gap``
    says it); the iterator stops, and reading again from ``cursor`` resumes."""
    default_code = "index_gap"

    def __init__(self, message="", code=None, status=0, session=None, first=None, last=None,
                 total=None):
        super().__init__(message, code=code, status=status)
        self.session = session
        self.first = self.cursor = first
        self.last = last
        self.total = total

    @classmethod
    def from_reply(cls, session, reply, reader="iter_results"):
        """The error for a stalled results reply (see :func:`results_stalled`); ``reader``
        names what raised it, for the advice: ``"iter_results"`` (read on with its own
        keywords) or ``"imap"`` (a pool's, which has none: read on with a client)."""
        first, last, total = reply["gap"]["first"], reply["gap"]["last"], reply["total"]
        if last > first:
            never = "indexes %d-%d were" % (first, last)
            submit = "tasks at indexes %d-%d" % (first, last)
        else:
            never, submit = "it was", "a task at index %d" % first
        if reader == "imap":
            read_on = ("read the rest with Client.iter_results(%r, cursor=%d) or with "
                       "order=\"completion\"" % (session, last + 1))
        else:
            read_on = ("read on past it (cursor=%d) or in completion order "
                       "(order=\"completion\")" % (last + 1))
        return cls("session %s: index %d has no task (%s never submitted, or purged) and every task "
                   "submitted (%d) has its result, so the results in submission order cannot go "
                   "past it; submit %s, or %s" % (session, first, never, total, submit, read_on),
                   session=session, first=first, last=last, total=total)


def results_stalled(reply):
    """True when a results reply (``GET /v1/sessions/{id}/results``) stops at a gap of
    indexes without a task while every task submitted has its result: nothing can come at
    its cursor until tasks are submitted there (docs/api.md, "gap")."""
    return bool(reply.get("gap")) and reply["done"] >= reply["total"]


class ZeroJobError(MusterError):
    """``new_job()`` found no open job at the client's stage (DistCompute interface)."""
    default_code = "zero_jobs"


_BY_CODE = {
    "bad_request": BadRequest,
    "bad_json": BadRequest,
    "invalid_argument": InvalidArgument,
    "name_invalid": NameInvalid,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "queue_not_found": QueueNotFound,
    "task_not_found": TaskNotFound,
    "worker_not_found": WorkerNotFound,
    "node_not_found": NodeNotFound,
    "session_not_found": SessionNotFound,
    "iteration_not_found": IterationNotFound,
    "shared_not_found": SharedNotFound,
    "method_not_allowed": MethodNotAllowed,
    "lease_lost": LeaseLost,
    "invalid_state": InvalidState,
    "queue_in_use": QueueInUse,
    "version_mismatch": VersionMismatch,
    "body_too_large": BodyTooLarge,
    "batch_too_large": BatchTooLarge,
    "payload_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "internal": ServerError,
    "store_error": StoreError,
    "unavailable": Unavailable,
    "network": NetworkError,
    "protocol": ProtocolError,
    "index_gap": IndexGap,
}

_BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
              405: MethodNotAllowed, 409: Conflict, 413: TooLarge, 415: UnsupportedMediaType,
              503: Unavailable}


def error_class(code, status=0):
    """The exception class for a wire code; by status for a code this client does not know."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else MusterError)
    return cls


def from_reply(status, body, request=None):
    """The exception for a non-2xx reply (``body``: the parsed JSON, or None; ``request``:
    ``(url, method, path)``, named when the reply has no muster error envelope)."""
    code, message = None, ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
        message = body["error"].get("message") or ""
    if not code:
        code = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 409: "invalid_state", 413: "body_too_large",
                415: "unsupported_media_type", 503: "unavailable"}.get(status, "internal")
        if not message and request:
            message = ("the server at %s answered HTTP %d to %s %s without a muster error "
                       "body: it is likely not a muster head; check the URL and its path"
                       % (request[0], status, request[1], request[2]))
        message = message or "HTTP %d without a muster error body" % status
    return error_class(code, status)(message, code=code, status=status)
