"""The HTTP client of a muster head (docs/api.md is the contract).

``Client`` keeps one keep-alive ``http.client`` connection per thread and
reuses it for every call; a connection the server closed while idle is
reopened once, transparently.  Every method maps to one endpoint and returns
the reply's JSON (dicts and lists); failures raise :mod:`muster.errors`.
"""
import http.client
import json
import operator
import os
import select
import socket
import sys
import threading
import time
import urllib.parse

from . import _continue, drain, errors
from .resolve import (  # noqa: F401 (muster.client's names as before)
    DEFAULT_DATA_DIR, DEFAULT_URL, _resolve_url_from, data_dir_default, no_head_advice,
    resolve_token, resolve_url, token_looked, url_problem)
from .shared import Shared  # noqa: F401 (client.shared; muster.client.Shared as before)

# A connection idle this long is looked at before reuse: no server closes one sooner
# (the head waits two minutes), and under load connections are reused at once.
IDLE_CHECK_S = 0.1
# The head's default --max-wait-ms: the longest long-poll of a head whose GET /v1/health
# does not say (an older head, or a server that answers health without it).
DEFAULT_MAX_WAIT_MS = 30000
# A long-poll that came back empty sooner than this (a head that lets no request wait, or
# one that is stopping) is followed by a pause to this long, as `muster session results
# --follow` paces itself: a loop that reads again at once would be a busy one.
MIN_POLL_S = 1.0
# How long backup() waits beyond the client's timeout: a day, "however long the copy
# takes" (a store of a million tasks takes a quarter of a second).
BACKUP_WAIT_MS = 24 * 3600 * 1000
_UNSET = object()


def poll_pause_s(asked, wait_ms=None, left=None):
    """How long to pause after a long-poll begun at ``asked`` (a time.monotonic()) came
    back empty: until MIN_POLL_S after it began, or the ``wait_ms`` asked for when shorter
    (the caller's choice), or ``left`` s after it began when sooner (a deadline).  A head
    that lets no request wait (``--max-wait-ms 0``), or one that is stopping, answers at
    once; reading again at once would be a busy loop (`muster session results --follow`
    paces itself the same way)."""
    span = MIN_POLL_S if wait_ms is None else min(MIN_POLL_S, wait_ms / 1000.0)
    if left is not None:
        span = min(span, left)
    return asked + span - time.monotonic()

def _sealed_if(reply, until_sealed):
    """Whether a results reply whose tasks all have their results is the end of the
    stream: always, unless ``until_sealed`` asks for a sealed session too.  A head that
    does not say (older than this client) cannot tell: ProtocolError rather than wait for
    ever."""
    if not until_sealed:
        return True
    if "sealed" not in reply:
        raise errors.ProtocolError("the head's results reply does not say whether the session "
                                   "is sealed (a head older than this client): "
                                   "until_sealed cannot be honoured")
    return bool(reply["sealed"])


def _product_is(value, product):
    """True when header ``value`` starts with the product token ``product``, alone or with a
    version or a comment after it ("muster-head", "muster-head/1 (linux)")."""
    value = (value or "").lstrip(" \t")
    return value.startswith(product) and value[len(product):len(product) + 1] in ("", "/", " ",
                                                                                 "\t")


def server_of(server, via):
    """What sent a reply with the headers ``server`` and ``via`` (None when absent):
    ``"node"`` for a node agent (its own ``Server: muster-node``, or its ``Via`` on a reply
    it passed on), ``"head"`` for ``Server: muster-head``, else None."""
    if _product_is(server, "muster-node") or "(muster node" in (via or ""):
        return "node"
    return "head" if _product_is(server, "muster-head") else None


def _q(part):
    return urllib.parse.quote(str(part), safe="")


def _id(what, value):
    """``value`` as the integer id of a task or worker: an int, or its decimal text (as
    the CLI prints it).  Anything else raises TypeError saying what was wanted."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError("%s id: expected an integer (the id the head returned), got %.60r (%s)"
                    % (what, value, type(value).__name__))


def _drop_none(d):
    return {k: v for k, v in d.items() if v is not None}


_DEPTH_ADVICE = ("Python's json module reads and writes as deep as the recursion limit allows "
                 "(sys.getrecursionlimit() is %d here; the head takes JSON nested up to 2048 "
                 "levels): raise it with sys.setrecursionlimit, e.g. to 5000")


def _json_encode(body, method, path):
    """``body`` as compact JSON bytes; a body nested too deep for Python's json module is
    a ValueError that says so (not a bare RecursionError from inside the encoder)."""
    try:
        return json.dumps(body, separators=(",", ":")).encode()
    except RecursionError:
        raise ValueError("%s %s: the body nests too deep to send: %s"
                         % (method, path, _DEPTH_ADVICE % sys.getrecursionlimit())) from None


def _json_decode(raw, method, path, status):
    """The reply ``raw`` read as JSON (None when empty); ValueError when it is not JSON, and
    a ProtocolError when it nests deeper than Python's json module can read: the head took
    it (a task's payload, a result), and raising the recursion limit reads it."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except RecursionError:
        raise errors.ProtocolError("%s %s: the reply nests too deep to read: %s"
                                   % (method, path, _DEPTH_ADVICE % sys.getrecursionlimit()),
                                   status=status) from None


def _with_query(path, query):
    """``path`` with ``query`` (a dict; None values left out, booleans as true/false)."""
    query = _drop_none(query or {})
    if not query:
        return path
    return path + "?" + urllib.parse.urlencode(
        {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in query.items()})


class Lease(dict):
    """A leased task (the Lease object of docs/api.md) with its calls bound to the client.

    Keys: ``task``, ``token``, ``payload``, ``attempt``, ``deadline_ms``, ``parent``,
    ``session``, ``index``; the same are attributes (``lease.payload``).
    """

    def __init__(self, client, obj):
        super().__init__(obj)
        self._client = client

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def complete(self, result=None):
        return self._client.complete(self["task"], self["token"], result)

    def complete_and_lease(self, queue, result=None, worker=None, max=1, updates_after=None,
                           request=None):
        """Completes this lease and leases the next tasks of ``queue`` in one request
        (``Client.complete_and_lease``); returns their LeaseList."""
        item = {"task": self["task"], "token": self["token"]}
        if result is not None:
            item["result"] = result
        return self._client.complete_and_lease([item], queue, worker=worker, max=max,
                                               updates_after=updates_after, request=request)

    def fail(self, error=None, permanent=False):
        return self._client.fail(self["task"], self["token"], error, permanent)

    def extend(self, lease_ms=None):
        reply = self._client.extend(self["task"], self["token"], lease_ms)
        self["deadline_ms"] = reply["deadline_ms"]
        return reply

    def release(self):
        return self._client.release(self["task"], self["token"])

    def flag(self, reason=None):
        return self._client.flag(self["task"], self["token"], reason)


class LeaseList(list):
    """The leases of one lease call; ``updates`` and ``updates_last`` when asked for, and
    ``completed`` when the leases came with completions (``complete_and_lease``)."""

    updates = ()
    updates_last = None
    completed = ()


class Client:
    """A client of one head (or node).

    ``url`` and ``token`` default as the CLI's do: $MUSTER_URL / $MUSTER_TOKEN, then the
    files ``url`` and ``token`` in the head's data dir (``data_dir``, $MUSTER_DATA_DIR,
    ``./muster-data``).  ``timeout`` (seconds) bounds each request; long-polls add their
    wait.  A Client may be shared between threads: each thread gets its own connection.
    It may be pickled (for a process started with spawn): the copy connects on its own.
    """

    def __init__(self, url=None, token=None, data_dir=None, timeout=60.0):
        url, source = _resolve_url_from(url, data_dir)
        problem = url_problem(url)
        if problem:  # the CLI's check and words: "127.0.0.1:7370" or ".../v1" name no head
            raise ValueError("%s '%s' is not a head's URL (http://HOST:PORT): %s"
                             % (source, url, problem))
        self.url = url.rstrip("/")
        self.token = resolve_token(token, data_dir)
        # Where the URL came from, and where no token was found: the advice of a
        # NetworkError that reached no head, and of a 401 to a client without a token.
        self._url_source = source
        self._token_looked = None if self.token else token_looked(data_dir)
        self.timeout = timeout
        parsed = urllib.parse.urlsplit(self.url)
        self._scheme = parsed.scheme.lower()
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._prefix = parsed.path.rstrip("/")
        self._no_connections()
        self.shared = Shared(self)
        # The head's max_wait_ms, asked on the first long-poll and again after a connection
        # to the head was lost (it may have restarted with another --max-wait-ms).
        self._max_wait_ms = None
        self._server = None   # what answers at the URL, as a reply said (the server property)

    def __repr__(self):
        return "muster.Client(%r)" % self.url

    # Connections are per process and per thread: a pickled client (sent to a process
    # started with spawn, such as a DataLoader worker's) carries where the head is, its
    # token and settings, and opens connections of its own; it never shares a socket.
    _PER_PROCESS = ("_local", "_all", "_all_lock", "_pid", "shared")

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self._PER_PROCESS}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._no_connections()
        self.shared = Shared(self)

    # ---- transport ----------------------------------------------------------------

    def _no_connections(self):
        """Starts this process's set of connections, empty (each thread adds its own)."""
        self._local = threading.local()
        self._all = []
        self._all_lock = threading.Lock()   # a new one: another thread may hold the old one
        self._pid = os.getpid()   # the process whose connections _all holds

    def _connection(self, timeout):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=timeout)
            self._local.conn = conn
            self._local.used = False
            with self._all_lock:
                self._all.append(conn)
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def _forget_inherited(self):
        """Forgets the connections of the process this one was forked from (the workers of
        a DataLoader or of multiprocessing, say): their sockets are the parent's too, and
        processes talking on one connection read each other's replies."""
        if self._pid == os.getpid():
            return
        conns = self._all   # read without _all_lock: another thread may have held it at the fork
        self._no_connections()
        for c in conns:
            c.close()   # this process's copies of the descriptors; the parent's stay open

    def _drop_connection(self, lost=False):
        """Closes this thread's connection.  ``lost``: it failed or the server closed it,
        so the head may have restarted meanwhile: its max_wait_ms is asked again."""
        if lost:
            self._max_wait_ms = None
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            with self._all_lock:
                if conn in self._all:
                    self._all.remove(conn)
        self._local.conn = None

    def close(self):
        """Closes every connection of this client (they reopen on the next call)."""
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local.conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def request(self, method, path, body=None, query=None, wait_ms=0, token=_UNSET,
                content_type="application/json"):
        """Sends one request and returns the parsed JSON reply; raises MusterError on failure.

        ``path`` is under the server root ("/v1/queues"); ``query`` a dict (None values
        are left out); ``body`` any JSON value, or bytes sent as they are with
        ``content_type``.  Used by every other method.
        """
        path = _with_query(path, query)
        headers = {}
        tok = self.token if token is _UNSET else token
        if tok:
            headers["Authorization"] = "Bearer " + tok
        data = None
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        elif body is not None:
            data = _json_encode(body, method, path)
        elif method in ("POST", "PUT"):
            data = b""
        if data is not None and content_type:
            headers["Content-Type"] = content_type
        resp, raw = self._exchange(method, path, data, headers, wait_ms)
        try:
            reply = _json_decode(raw, method, path, resp.status)
        except ValueError:
            reply = None
            if 200 <= resp.status < 300 and raw:
                raise errors.ProtocolError("%s %s: the reply is not JSON" % (method, path),
                                           status=resp.status)
        if 200 <= resp.status < 300:
            return reply
        raise self._refusal(resp.status, reply, method, path, tok)

    def request_raw(self, method, path, body=None, query=None, headers=None,
                    content_type="application/octet-stream", token=_UNSET):
        """Like :meth:`request` for raw bytes: sends ``body`` (bytes) as it is and returns
        ``(status, headers, body_bytes)`` of a 2xx/3xx reply; errors raise MusterError."""
        resp, raw = self._send_raw(method, path, body, query, headers, content_type, token)
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw

    def _send_raw(self, method, path, body=None, query=None, headers=None,
                  content_type="application/octet-stream", token=_UNSET, stream=False):
        """request_raw's exchange: ``(response, body bytes)`` of a 2xx/3xx reply; errors
        raise MusterError.  ``body``: bytes or str, or a callable that gives each attempt's
        body as an iterable of bytes (a streamed upload: its Content-Length in
        ``headers``, else it is sent chunked).  With ``stream`` a 2xx reply's body is left
        unread (None): the caller reads it from the response to its end and calls
        :meth:`_reply_read`, or :meth:`_drop_connection` when it cannot."""
        hdrs = dict(headers or {})
        tok = self.token if token is _UNSET else token
        if tok:
            hdrs["Authorization"] = "Bearer " + tok
        data = None
        if body is not None:
            if callable(body):
                data = body
            else:
                data = body.encode() if isinstance(body, str) else bytes(body)
            if content_type:
                hdrs["Content-Type"] = content_type
        elif method in ("POST", "PUT"):
            data = b""
        path = _with_query(path, query)
        resp, raw = self._exchange(method, path, data, hdrs, 0, stream)
        if resp.status < 400:
            return resp, raw
        try:
            reply = _json_decode(raw, method, path, resp.status)
        except ValueError:
            reply = None
        raise self._refusal(resp.status, reply, method, path, tok)

    def _refusal(self, status, reply, method, path, token_sent):
        """The error for a refusal.  A 401 to a request sent without a token says where this
        client looked for one (the head's own message speaks of HTTP headers)."""
        err = errors.from_reply(status, reply, (self.url, method, path))
        looked = getattr(self, "_token_looked", None)
        if isinstance(err, errors.Unauthorized) and not token_sent and looked:
            err = errors.Unauthorized(
                "the head needs a token, and no token was given: %s; pass token=, set "
                "MUSTER_TOKEN, or point data_dir= (or MUSTER_DATA_DIR) at the head's data dir, "
                "which holds the file 'token'" % looked, code=err.code, status=err.status)
        return err

    def _drop_if_closed(self):
        """Drops this thread's connection when it has been idle for IDLE_CHECK_S or more
        and the server closed it meanwhile (a peek), so that nothing is sent on it."""
        conn = getattr(self._local, "conn", None)
        sock = conn.sock if conn is not None else None
        if sock is None or time.monotonic() - getattr(self._local, "idle_since", 0) < IDLE_CHECK_S:
            return
        try:
            # Readable while no reply is owed: the end of the stream, or bytes nobody
            # asked for, which would be read as the next reply.  Either way a new one.
            closed = bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            closed = True
        if closed:
            self._drop_connection(lost=True)

    def _exchange(self, method, path, data, headers, wait_ms, stream=False):
        """One HTTP exchange on this thread's connection: (response, raw body).  A POST
        is sent once: when its connection closes without a reply the server may have
        done it (and died before replying), so it is not sent again; other methods are
        sent again once on a new connection when a reused one turns out closed.
        ``data`` may be a callable giving each attempt's body; with ``stream`` a 2xx
        reply's body is left unread (``_send_raw`` says what the caller then owes)."""
        timeout = self.timeout + (wait_ms or 0) / 1000.0
        self._forget_inherited()
        self._drop_if_closed()
        for attempt in (1, 2):
            conn = self._connection(timeout)
            reused = self._local.used
            body = data() if callable(data) else data
            try:
                resp = self._send(conn, method, self._prefix + path, body, headers)
                raw = None if stream and 200 <= resp.status < 300 else resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    http.client.CannotSendRequest, http.client.BadStatusLine) as e:
                self._drop_connection(lost=True)
                # A keep-alive connection the server closed while idle: retry once on a
                # fresh one.  A POST may have been done (the server died before its
                # reply), so it is not sent again: the caller hears no reply came.
                if attempt == 1 and reused and method != "POST":
                    continue
                raise errors.NetworkError("%s %s (%s): %s" % (method, path, self.url,
                                                              e or type(e).__name__)) from e
            except (OSError, socket.timeout, http.client.HTTPException) as e:
                unsent = conn.sock is None   # no connection was made: nothing reached a head
                self._drop_connection(lost=True)
                advice = ("; " + no_head_advice(getattr(self, "_url_source", "url"),
                                                self.server) if unsent else "")
                raise errors.NetworkError("%s %s (%s): %s%s" % (method, path, self.url, e,
                                                                advice)) from e
            except BaseException:
                # Interrupted mid-exchange (Ctrl-C, an exception from a signal handler, a
                # streamed body's source that failed): this connection still owes the
                # reply, or the rest of it, or the server the rest of the body, which the
                # next call would read as its own.  It cannot be used again.
                self._drop_connection()
                raise
            self._note_server(resp)
            if raw is not None:
                self._reply_read(resp)
            return resp, raw
        raise AssertionError("unreachable")

    @staticmethod
    def _send(conn, method, url, body, headers):
        """Sends one request on ``conn``: its response, the body unread.  An upload whose
        ``headers`` ask for ``100 Continue`` sends its body only once the server agreed to
        take it (muster._continue): one the head refuses is not sent at all."""
        if body is not None and _continue.expects_continue(headers):
            return _continue.request(conn, method, url, body, headers)
        conn.request(method, url, body=body, headers=headers)
        return conn.getresponse()

    @property
    def server(self):
        """What answers at this client's URL, as its replies said (their ``Server`` header,
        or a ``Via`` naming a muster node on a reply an agent passed on): ``"head"``, ``"node"``
        (a node agent, which answers for the head), or None while no reply said (none yet,
        or from an older muster).  A reply that does not say leaves what an earlier one
        said."""
        return getattr(self, "_server", None)

    def _note_server(self, resp):
        """Notes what sent ``resp``, as libmuster's muster_client_server reads it."""
        said = server_of(resp.getheader("Server"), resp.getheader("Via"))
        if said is not None:
            self._server = said

    def _reply_read(self, resp):
        """The reply ``resp`` was read to its end: its connection may carry the next
        request, unless the server said it closes it, or the reply ends it (a refusal
        that came before the body was sent: muster._continue)."""
        self._local.used = True
        self._local.idle_since = time.monotonic()
        if resp.will_close or resp.getheader("Connection", "").lower() == "close":
            self._drop_connection()

    # ---- health ----------------------------------------------------------------------

    def health(self):
        """GET /v1/health (no token needed): {"status", "version", "uptime_ms", "max_wait_ms"}."""
        return self.request("GET", "/v1/health", token=None)

    def max_wait_ms(self):
        """The longest the head lets a long-poll wait (its ``--max-wait-ms``, which GET
        /v1/health says), asked once per client and kept until a connection to the head is
        lost or found closed by it (a restarted head may have another; asking on every
        long-poll would cost a round trip each).  A head that answers health
        without it (an older one) is taken to have the default, 30000.  A head that does
        not answer (NetworkError, Unavailable, ServerError) raises, and is asked again next
        time; one that answers as no head does (ProtocolError, NotFound) gets the default."""
        if self._max_wait_ms is None:
            try:
                health = self.health()
            except (errors.NetworkError, errors.Unavailable, errors.ServerError):
                raise   # no answer now: asked again next time
            except errors.MusterError:
                health = None   # it answered, but not as a head does: it will not say
            cap = health.get("max_wait_ms") if isinstance(health, dict) else None
            ok = isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0
            self._max_wait_ms = cap if ok else DEFAULT_MAX_WAIT_MS
        return self._max_wait_ms

    def long_poll_ms(self, wait_ms=None, left=None):
        """A long-poll's wait in ms: ``wait_ms``, or as long as the head lets one wait
        when None, and never longer than that (the head cuts a longer wait to its
        ``max_wait_ms``: asking more would only make the request's timeout notice a head
        that went silent later); nor, with ``left``, than ``left`` seconds (at least 1 ms)."""
        # A head that restarted while this thread's connection was idle closed it: found
        # here (the peek the request would make), the wait is chosen by the new head's cap.
        self._forget_inherited()
        self._drop_if_closed()
        cap = self.max_wait_ms()
        wait = cap if wait_ms is None else min(int(wait_ms), cap)
        if left is not None:
            wait = min(wait, max(1, int(left * 1000)))
        return max(0, wait)

    # ---- backups ---------------------------------------------------------------------

    def backup(self, name=None):
        """Has the head write a consistent copy of its state, while it serves, into
        DATA_DIR/backups/NAME on its own machine (``POST /v1/backup``, admin token):
        ``name`` (1 to 128 characters of [A-Za-z0-9._-]), else the UTC time.  Returns the
        reply: {"name", "path", "bytes", "time", "time_ms", "duration_ms", "holds", ...}.
        A name in use, or a backup already running, raises InvalidState.  It waits however
        long the copy takes, as `muster backup` does, not the client's ``timeout``: a head
        that has started a backup finishes it whether or not its caller still listens."""
        return self.request("POST", "/v1/backup", _drop_none({"name": name}),
                            wait_ms=BACKUP_WAIT_MS)

    # ---- queues ----------------------------------------------------------------------

    def queues(self):
        """Every queue, ordered by name."""
        return self.request("GET", "/v1/queues")["queues"]

    def queue(self, name, ready=False):
        """The queue.  With ``ready=True`` its ``counts`` also has ``ready``: the queued
        tasks a lease would take now (not those waiting out a delay or a backoff).  The
        head counts them on request only, in a pass over the queued tasks, so it is off
        by default (docs/api.md, ``GET /v1/queues/{queue}?ready=true``)."""
        return self.request("GET", "/v1/queues/" + _q(name),
                            query={"ready": True} if ready else None)

    def put_queue(self, name, **settings):
        """Creates the queue or changes the settings given (lease_ms, max_attempts,
        backoff_ms, backoff_max_ms, next, max_flags, keep_done_ms).  Settings left out
        keep their values; ``next=None`` (it removes the next stage) and
        ``keep_done_ms=None`` (done tasks are kept for ever again) are sent only when
        passed.  ``keep_done_ms``: the head removes each done task that long after its
        completion (docs/api.md, "Retention of done tasks")."""
        return self.request("PUT", "/v1/queues/" + _q(name), settings)

    create_queue = put_queue
    update_queue = put_queue

    def delete_queue(self, name):
        return self.request("DELETE", "/v1/queues/" + _q(name))

    def purge_queue(self, name):
        return self.request("POST", "/v1/queues/" + _q(name) + "/purge")["purged"]

    def requeue_queue(self, name):
        return self.request("POST", "/v1/queues/" + _q(name) + "/requeue")["requeued"]

    def wait_drained(self, queue, pipeline=False, timeout=None):
        """Blocks until ``queue`` has no task queued (delayed ones included) or leased;
        with ``pipeline=True``, until every queue after it along ``next`` (up to a loop)
        has none either, all seen empty in one answer of the head.  It looks every 0.5 s;
        a head that stops answering after the first look is waited for.  Returns a
        :class:`muster.drain.Drained`: ``{name: counts}`` of those queues, whose
        ``failed`` maps each queue where tasks ended failed or dead since the call to
        how many (what `muster queue wait` exits 1 for; no exception is raised for it).
        ``timeout`` (seconds, None: none) passing raises TimeoutError saying what is
        left; an unknown ``queue`` raises QueueNotFound."""
        return drain.wait_drained(self, queue, pipeline, timeout)

    # ---- tasks -----------------------------------------------------------------------

    def put(self, queue, payload, priority=None, delay_ms=None, key=None, session=None, index=None):
        """Puts one task and returns its id (the existing task's id when ``key`` repeats)."""
        task = _drop_none({"payload": payload, "priority": priority, "delay_ms": delay_ms,
                           "key": key, "session": session, "index": index})
        task["payload"] = payload
        return self.put_many(queue, [task])[0]["id"]

    def put_many(self, queue, tasks):
        """Batch put (at most 1000): ``tasks`` are dicts with ``payload`` and the optional
        fields of docs/api.md.  Returns [{"id", "created"}, ...] in input order."""
        return self.request("POST", "/v1/queues/%s/tasks" % _q(queue), {"tasks": list(tasks)})["tasks"]

    def put_payloads(self, queue, payloads):
        """Puts one task per payload; returns their ids."""
        return [t["id"] for t in self.put_many(queue, [{"payload": p} for p in payloads])]

    def tasks(self, queue, state=None, after=None, limit=None, brief=False):
        """One page: {"tasks": [...], "next": after-for-the-next-page or None}.  ``brief``:
        each task without its payload and result (a page then costs nothing per byte)."""
        return self.request("GET", "/v1/queues/%s/tasks" % _q(queue),
                            query={"state": state, "after": after, "limit": limit,
                                   "brief": "true" if brief else None})

    def iter_tasks(self, queue, state=None, page=1000):
        """Every task of the queue (optionally in one state), page by page."""
        after = None
        while True:
            reply = self.tasks(queue, state=state, after=after, limit=page)
            for t in reply["tasks"]:
                yield t
            after = reply.get("next")
            if after is None:
                return

    def task(self, task_id):
        return self.request("GET", "/v1/tasks/%d" % _id("task", task_id))

    def requeue_task(self, task_id):
        return self.request("POST", "/v1/tasks/%d/requeue" % _id("task", task_id))

    # ---- leases ----------------------------------------------------------------------

    def lease(self, queue, worker=None, max=1, wait_ms=0, updates_after=None, request=None):
        """Leases up to ``max`` tasks, waiting up to ``wait_ms`` for one.  Returns a
        LeaseList of Lease (empty when none came); with ``updates_after`` it also
        carries ``.updates`` and ``.updates_last``.  A ``wait_ms`` longer than the head's
        ``max_wait_ms`` is cut to it (:meth:`long_poll_ms`).  ``request``: a key of the
        caller's (1 to 128 characters of [A-Za-z0-9._-], not ``.`` or ``..``; needs
        ``worker``), sent again unchanged when the call is sent again after an error: the
        head then answers with the leases the first call made, if its reply was lost,
        instead of new ones (docs/api.md, "Retrying a lease"); a new request takes a new
        key.  Number them ``PREFIX-N``, a prefix per thread: the head keeps the last key of
        each prefix."""
        return self._lease(queue, worker, max, self.long_poll_ms(wait_ms) if wait_ms else 0,
                           updates_after, request)

    def _lease(self, queue, worker, max, wait_ms, updates_after, request=None):
        """``lease`` with ``wait_ms`` cut already (:meth:`long_poll_ms`, which a caller
        that chose the wait itself does not pay for twice: it peeks at the connection)."""
        body = _drop_none({"worker": worker, "max": max, "wait_ms": wait_ms or None,
                           "updates_after": updates_after, "request": request})
        reply = self.request("POST", "/v1/queues/%s/lease" % _q(queue), body, wait_ms=wait_ms)
        return self._lease_list(reply)

    def _lease_list(self, reply):
        out = LeaseList(Lease(self, obj) for obj in reply["leases"])
        if "updates" in reply:
            out.updates = reply["updates"]
            out.updates_last = reply.get("updates_last")
        return out

    def lease_one(self, queue, worker=None, wait_ms=0):
        """One Lease, or None when none came within ``wait_ms``."""
        got = self.lease(queue, worker=worker, max=1, wait_ms=wait_ms)
        return got[0] if got else None

    def _leases(self, action, items):
        return self.request("POST", "/v1/leases/" + action, {"leases": list(items)})

    def complete_and_lease(self, items, queue, worker=None, max=1, updates_after=None,
                           request=None):
        """Completes a batch (items as for ``complete_many``) and, in the same request and
        transaction, leases up to ``max`` tasks of ``queue``: a worker's steady state in one
        round trip instead of two.  It never waits.  Returns a LeaseList (empty when no
        task was ready) whose ``completed`` is the "completed" list and which, with
        ``updates_after``, carries ``.updates`` and ``.updates_last`` as ``lease`` does.
        All or nothing: when a completion or the lease is refused, nothing is completed or
        leased and the error is raised.  ``request``: the lease's key, as for ``lease``
        (the same key may go with the plain ``lease`` that follows a call that failed)."""
        lease = _drop_none({"queue": queue, "max": max, "worker": worker,
                            "updates_after": updates_after, "request": request})
        reply = self.request("POST", "/v1/leases/complete", {"leases": list(items), "lease": lease})
        out = self._lease_list(reply)
        out.completed = reply["completed"]
        return out

    def complete(self, task, token, result=None):
        """Completes one lease; returns {"task", "next_task"}.  A completion sent again
        under the token that completed the task (a retry after a lost reply) succeeds and
        changes nothing: the dict then has ``"repeated": True``, and ``"result_ignored":
        True`` when ``result`` differs from the stored one, which stays."""
        item = {"task": task, "token": token}
        if result is not None:
            item["result"] = result
        return self._leases("complete", [item])["completed"][0]

    def complete_many(self, items):
        """Batch: items are {"task", "token", "result"?}; returns the "completed" list
        (each element as ``complete`` returns it, repeats marked)."""
        return self._leases("complete", items)["completed"]

    def fail(self, task, token, error=None, permanent=False):
        """Fails one lease; returns {"task", "state", "run_at_ms"} (a fail sent again after
        its reply was lost gets the first answer, with ``"repeated": True``: one attempt
        counted, and this call's ``error`` and ``permanent`` ignored)."""
        item = _drop_none({"task": task, "token": token, "error": error})
        if permanent:
            item["permanent"] = True
        return self._leases("fail", [item])["failed"][0]

    def fail_many(self, items):
        return self._leases("fail", items)["failed"]

    def extend(self, task, token, lease_ms=None):
        """Extends one lease; returns {"task", "deadline_ms"}."""
        return self._leases("extend", [_drop_none({"task": task, "token": token,
                                                    "lease_ms": lease_ms})])["extended"][0]

    def extend_many(self, items):
        return self._leases("extend", items)["extended"]

    def release(self, task, token):
        """Gives one lease back (the attempt does not count); returns how many were released
        (a release sent again after its reply was lost counts: the head answers it as a
        repeat, and the task was released by the first)."""
        return self.release_many([{"task": task, "token": token}])

    def release_many(self, items):
        return self._leases("release", items)["released"]

    def flag(self, task, token, reason=None):
        """Flags one leased task's input as invalid; returns {"task", "state", "reopened"}
        (a flag sent again after its reply was lost gets the first answer, with
        ``"repeated": True``: the head counted one flag)."""
        return self._leases("flag", [_drop_none({"task": task, "token": token,
                                                  "reason": reason})])["flagged"][0]

    def flag_many(self, items):
        return self._leases("flag", items)["flagged"]

    # ---- workers ---------------------------------------------------------------------

    def register_worker(self, nickname=None, queues=None, node=None, labels=None, timeout_ms=None,
                        instance=None):
        """Registers a worker: {"id", "name", "nickname", "timeout_ms"}.  ``instance``: this
        process's id; sent again with it after a lost reply, the registration gets the
        worker the first one made (with ``"repeated": True``), not a second one."""
        return self.request("POST", "/v1/workers", _drop_none({
            "nickname": nickname, "queues": queues, "node": node, "labels": labels,
            "timeout_ms": timeout_ms, "instance": instance}))

    def workers(self):
        return self.request("GET", "/v1/workers")["workers"]

    def worker(self, worker_id):
        return self.request("GET", "/v1/workers/%d" % _id("worker", worker_id))

    def heartbeat(self, worker_id, progress=None):
        """Worker heartbeat with an optional progress string: {"id", "state"}."""
        return self.request("POST", "/v1/workers/%d/heartbeat" % _id("worker", worker_id),
                            _drop_none({"progress": progress}))

    def bye(self, worker_id, crashed=False):
        """The worker leaves (its leases are released); ``crashed=True`` makes them
        lapse as on a timeout instead (the agent reports a dead worker process)."""
        return self.request("DELETE", "/v1/workers/%d" % _id("worker", worker_id),
                            query={"crashed": True} if crashed else None)

    delete_worker = bye

    def leaderboard(self):
        return self.request("GET", "/v1/leaderboard")["leaderboard"]

    # ---- nodes -----------------------------------------------------------------------

    def register_node(self, name, hostname=None, address=None, cpus=None, gpus=None, labels=None,
                      timeout_ms=None):
        return self.request("POST", "/v1/nodes", _drop_none({
            "name": name, "hostname": hostname, "address": address, "cpus": cpus, "gpus": gpus,
            "labels": labels, "timeout_ms": timeout_ms}))

    def node_heartbeat(self, name):
        return self.request("POST", "/v1/nodes/%s/heartbeat" % _q(name), {})

    def delete_node(self, name):
        return self.request("DELETE", "/v1/nodes/" + _q(name))

    def nodes(self):
        return self.request("GET", "/v1/nodes")["nodes"]

    def node(self, name):
        return self.request("GET", "/v1/nodes/" + _q(name))

    # ---- sessions --------------------------------------------------------------------

    def create_session(self, queue, cleanup_on_exit=None, timeout_ms=None, init_data=_UNSET):
        body = _drop_none({"queue": queue, "cleanup_on_exit": cleanup_on_exit, "timeout_ms": timeout_ms})
        if init_data is not _UNSET:
            body["init_data"] = init_data
        return self.request("POST", "/v1/sessions", body)

    def sessions(self):
        return self.request("GET", "/v1/sessions")["sessions"]

    def session(self, session_id):
        return self.request("GET", "/v1/sessions/" + _q(session_id))

    def session_heartbeat(self, session_id):
        return self.request("POST", "/v1/sessions/%s/heartbeat" % _q(session_id), {})

    def session_put(self, session_id, tasks, seal=False):
        """Submits tasks ({"payload", "index"?, "priority"?}) under the session:
        [{"id", "index"}, ...].  ``seal=True`` seals the session with them, in the same
        request (:meth:`seal_session`)."""
        body = {"tasks": list(tasks)}
        if seal:
            body["seal"] = True
        return self.request("POST", "/v1/sessions/%s/tasks" % _q(session_id), body)["tasks"]

    def seal_session(self, session_id):
        """Seals the session: it takes no more tasks (a put raises ``InvalidState``), and
        ``iter_results(..., until_sealed=True)`` ends once every task has its result.
        Sealing again is no error.  Returns the session, with ``"sealed": True`` and
        ``"already_sealed"`` (whether it was sealed before).  A head older than sealing
        raises :class:`muster.NotFound` saying so (an unknown session is
        :class:`muster.SessionNotFound`)."""
        path = "/v1/sessions/%s/seal" % _q(session_id)
        try:
            return self.request("POST", path, {})
        except errors.NotFound as e:
            if e.code != "not_found":
                raise
            # The route is missing: the head's own "no endpoint" does not say why.
            raise errors.NotFound(
                "the head at %s has no endpoint POST %s: it is older than this client and "
                "cannot seal sessions; upgrade the head (docs/operations.md, \"Versions side "
                "by side\")" % (self.url, path), e.code, e.status) from None

    def results(self, session_id, order=None, cursor=None, max=None, wait_ms=0):
        """One read of the session's result stream: {"results", "cursor", "total", "done",
        "gap"}.  A ``wait_ms`` longer than the head's ``max_wait_ms`` is cut to it."""
        return self._results(session_id, order, cursor, max,
                             self.long_poll_ms(wait_ms) if wait_ms else 0)

    def _results(self, session_id, order, cursor, max, wait_ms):
        """``results`` with ``wait_ms`` cut already (:meth:`long_poll_ms`)."""
        return self.request("GET", "/v1/sessions/%s/results" % _q(session_id),
                            query={"order": order, "cursor": cursor, "max": max,
                                   "wait_ms": wait_ms or None}, wait_ms=wait_ms)

    def _poll_results(self, session_id, order, cursor, max=1000, quick=False, wait_ms=None,
                      left=None, until_sealed=False):
        """A read of the result stream: at once when ``quick``, else one that waits for
        results (:meth:`long_poll_ms` of ``wait_ms`` and ``left``), paced by
        :func:`poll_pause_s` while results are still to come (with ``until_sealed``, also
        while the session is not sealed): a head that lets no read wait is not asked again
        and again."""
        if quick:
            return self._results(session_id, order, cursor, max, 0)
        asked = time.monotonic()
        reply = self._results(session_id, order, cursor, max, self.long_poll_ms(wait_ms, left))
        more = reply["done"] < reply["total"] or (until_sealed and not reply.get("sealed"))
        if not reply["results"] and more:
            pause = poll_pause_s(asked, wait_ms, left)
            if pause > 0:
                time.sleep(pause)
        return reply

    def iter_results(self, session_id, order="submission", cursor=0, wait_ms=None,
                     until_sealed=False):
        """Yields the session's results (the dicts of ``results``) from ``cursor`` in
        ``order`` as they come, in long-polls of ``wait_ms`` (by default as long as the head
        lets one wait, its ``max_wait_ms``; never longer), until every task submitted so
        far has its result and all of them were read; with ``until_sealed``, only once the
        session is sealed as well (:meth:`seal_session`), so that a producer may put in
        several steps.  In submission order a gap (indexes that no task has) while every
        task has its result raises :class:`muster.IndexGap` instead of waiting for ever;
        reading again from its ``cursor`` resumes."""
        quick = True  # a stream at its end or stalled at a gap says so at once
        while True:
            reply = self._poll_results(session_id, order, cursor, 1000, quick, wait_ms,
                                       until_sealed=until_sealed)
            for r in reply["results"]:
                yield r
            cursor = reply["cursor"]
            finished = reply["done"] >= reply["total"] and _sealed_if(reply, until_sealed)
            stalled = errors.results_stalled(reply)
            if stalled:
                if not reply["results"]:
                    raise errors.IndexGap.from_reply(session_id, reply)
            elif finished and len(reply["results"]) < 1000:
                return
            # Every task has its result: the rest is there (or the gap was filled), no wait.
            quick = finished or stalled

    def close_session(self, session_id):
        return self.request("DELETE", "/v1/sessions/" + _q(session_id))

    # ---- updates ---------------------------------------------------------------------

    def post_update(self, queue, data, session=None):
        """Broadcasts ``data`` to the queue's workers: {"queue", "seq"}."""
        body = {"data": data}
        if session is not None:
            body["session"] = session
        return self.request("POST", "/v1/queues/%s/updates" % _q(queue), body)

    def updates(self, queue, after=None, max=None):
        """{"updates": [...], "last": N}."""
        return self.request("GET", "/v1/queues/%s/updates" % _q(queue),
                            query={"after": after, "max": max})

    # ---- iterations (the head's coordinated iterations; see src/server/iter.h) ------

    def create_iteration(self, config):
        """Creates or joins a coordinated iteration (the body of POST /v1/iterations)."""
        return self.request("POST", "/v1/iterations", config)

    def iterations(self):
        return self.request("GET", "/v1/iterations")

    def iteration(self, name):
        return self.request("GET", "/v1/iterations/" + _q(name))

    def delete_iteration(self, name):
        return self.request("DELETE", "/v1/iterations/" + _q(name))

    def iteration_checkpoint(self, name):
        """The iteration's checkpoint (GET /v1/iterations/{name}/checkpoint): pass it as
        ``checkpoint`` to create_iteration to resume, with the same or another world size."""
        return self.request("GET", "/v1/iterations/%s/checkpoint" % _q(name))

    def iteration_next(self, name, body):
        return self.request("POST", "/v1/iterations/%s/next" % _q(name), body,
                            wait_ms=(body or {}).get("wait_ms", 0))

    def iteration_held(self, name, rank, cursor=None, max=None, indices=None):
        """The blocks ``rank`` holds in the current epoch (GET /v1/iterations/{name}/held):
        {"rank", "epoch", "finished", "total", "blocks", "next"}, ``next`` the ``cursor`` of
        the following page or None.  Leases nothing, extends no lease and does not count as
        the rank's heartbeat (``iteration_next`` with ``held`` does all three)."""
        return self.request("GET", "/v1/iterations/%s/held" % _q(name),
                            query={"rank": rank, "cursor": cursor, "max": max,
                                   "indices": indices})

    def iteration_ack(self, name, body):
        return self.request("POST", "/v1/iterations/%s/ack" % _q(name), body)

    def iteration_heartbeat(self, name, body):
        return self.request("POST", "/v1/iterations/%s/heartbeat" % _q(name), body)
