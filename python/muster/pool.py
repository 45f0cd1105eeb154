"""``muster.Pool`` and ``muster.WorkerInterface``: the distributed_computing pool on muster.

    class Worker(muster.WorkerInterface):
        def __init__(self, init_data):        # once per worker process per pool
            self.model = load(init_data)
        def run(self, x, scale=1):            # once per job
            return self.model(x) * scale
        def handle_update(self, params):      # between jobs, in order
            self.model.update(params)

    with muster.Pool(Worker, init_data, url=URL, token=TOKEN, queue="pool") as p:
        print(p.map([1, 2, 3]))
        p.update_workers(new_params)
        for r in p.imap_unordered([{"args": [4], "kwargs": {"scale": 2}}]):
            ...

A pool is a session on the head over ``queue``: jobs are the session's tasks, results
come back through its result stream, ``update_workers`` posts updates that name the
session.  The workers are ``python3 -m muster.worker`` processes, normally run by node
agents (``muster node --queue pool -- /usr/bin/python3 -m muster.worker``).  See
docs/python.md, "Pools".
"""
import logging
import re
import sys
import threading
import time

from . import errors
from .client import Client
from .pool_why import failing_jobs_note
from .pool_args import (MAX_REQUIRES, _class_paths, _class_pickle, _main_script, _pickled,
                        _pool_order, _refuse_in_worker_load, _requires, _too_large,
                        _warn_settings_kept)
from .worker import MARK, NO_SHARED_FILES, WORKER_CLASS_BLOB, decode_result, unpack_call

SUBMIT_BATCH = 1000
RETRY_PAUSE_S = 1.0  # between tries while the head does not answer (as the C pool's)
IDLE_HINT_S = 3.0    # a call without a result this long says so when no worker serves its queue
# A head that is down or restarting: no reply came, or it answered 503 while stopping.
_HEAD_DOWN = (errors.NetworkError, errors.Unavailable)
# One WARNING when the pool starts waiting for a head that does not answer, one INFO when
# it answers again; nothing per try.  Unconfigured, logging's lastResort handler prints
# the warning on stderr (docs/python.md says how to silence it).
log = logging.getLogger("muster.pool")
# What answers at a pool's URL (its client's ``server``), in the words of the CLI's lines
# (src/cli/conn.c, cli_server_at): None while no reply said.
_SERVER_NAMES = {"head": "the head", "node": "the node agent",
                 None: "the muster head or node agent"}


class WorkerInterface:
    """What a pool's worker class implements (all three may be overridden).

    ``__init__(init_data)`` runs once per worker process per pool (heavy preparation
    goes here); ``run(*args, **kwargs)`` once per job, its return value is the job's
    result; ``handle_update(*args, **kwargs)`` for each ``Pool.update_workers``, between
    jobs, in the order they were sent (its return value is ignored).
    ``shared_files``, set before each ``run``: the shared data the job requires
    (``requires=`` of the Pool or of the call) as local read-only files by blob name,
    ``self.shared_files["weights"].path`` (a muster.worker.SharedFiles; empty when the
    job requires nothing).
    """

    shared_files = NO_SHARED_FILES

    def __init__(self, init_data=None):
        self.init_data = init_data

    def run(self, *args, **kwargs):
        raise NotImplementedError("the worker class must implement run()")

    def handle_update(self, *args, **kwargs):
        pass


class TaskError(errors.MusterError):
    """A job that failed for good (its worker raised on every attempt, or it went dead):
    ``index`` is its position in the input, ``error`` the worker's traceback or the head's
    reason, ``state`` ``failed`` or ``dead``."""

    def __init__(self, index, state, error):
        super().__init__("job %d %s: %s" % (index, _FAILED_HOW.get(state, state), error),
                         code="task_failed", status=0)
        self.index = index
        self.state = state
        self.error = error


# What a job's final state means, in TaskError's message (docs/api.md, "States").
_FAILED_HOW = {"dead": "is dead (it failed on every attempt the queue's max_attempts allows, "
                       "or its worker was lost that often); its last error",
               "failed": "failed permanently (its worker said no attempt could succeed)"}


class IndexCollision(errors.InvalidState):
    """A batch of the pool's jobs refused by the head (``409 invalid_state``) because one of
    the session indexes the pool numbered them with was already in use: another producer
    put tasks into the pool's session with explicit indexes.  Nothing of the batch was
    stored.  ``session``; ``first`` and ``last``: the refused batch's indexes; ``index``:
    the first of them in use; ``stored``: how many jobs of the same call were stored before
    the batch (they run, but the call reads nothing of them).

    The pool sends a batch again only when no reply came (or the head was stopping), and
    the head answers such a batch, already stored with the same payloads at the same
    indexes, as a repeat: so an index in use is never one of the pool's own earlier tries,
    it is always someone else's task."""

    def __init__(self, message, session, first, last, index, stored=0, status=409):
        super().__init__(message, code="invalid_state", status=status)
        self.session = session
        self.first = first
        self.last = last
        self.index = index
        self.stored = stored

    @classmethod
    def from_refusal(cls, err, session, first, last, stored):
        """The error for the head's refusal ``err`` (an InvalidState) of the batch of
        indexes ``first``..``last``, ``stored`` jobs of the call having been stored before;
        None when ``err`` is not about an index in use (the head names the index)."""
        m = re.search(r"index: (\d+) is already in use", err.message)
        if m is None:
            return None
        index = int(m.group(1))
        batch = "index %d" % first if first == last else "indexes %d-%d" % (first, last)
        text = ("session %s: the pool's jobs at %s were refused, none of them stored: index %d "
                "is already in use in the session, by a task that another producer put there "
                "(a pool numbers its jobs itself, from 0). Submit to a pool's session only "
                "through the pool: give any other producer a session of its own"
                % (session, batch, index))
        if stored:
            text += ("; the %d jobs of this call before index %d were stored and run, but "
                     "their results are not read" % (stored, first))
        return cls(text, session, first, last, index, stored=stored, status=err.status)


class _Results:
    """The iterator of imap and imap_unordered.  As multiprocessing's, a job that failed for
    good raises its TaskError from ``next()``, and calling ``next()`` again goes on with the
    results after it (a generator that raised would be over: the rest of the call's results
    lost to the caller).  Any other error (TimeoutError, a head that never came back) ends
    it."""

    def __init__(self, gen, hint):
        self._gen = gen
        self._hint = hint   # the call's _IdleHint, stopped once the call is over

    def __iter__(self):
        return self

    def __next__(self):
        try:
            item = next(self._gen)
        except BaseException:
            self._hint.stop()
            raise
        if isinstance(item, TaskError):
            raise item
        return item

    def close(self):
        self._hint.stop()
        self._gen.close()

    def __del__(self):
        self._hint.stop()


class _IdleHint:
    """Says once per call, as `muster map` does, what a call that gets no result is waiting
    for: IDLE_HINT_S after the call (its jobs submitted), with no result yet, a WARNING on muster.pool
    when no worker serves the pool's queue (and that the pool created the queue, when it
    did: a mistyped name makes a new, empty queue, and a call on it would wait in silence).
    A timer thread says it, so that the call's reads still wait as long as the head lets
    them (the Client gives each thread its own connection)."""

    def __init__(self, pool):
        self.pool = pool
        self.got = False
        self.timer = threading.Timer(IDLE_HINT_S, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self):
        if self.got or self.pool._closed:
            return
        note = self.pool._no_worker_note()
        if note and not self.got:
            log.warning("muster.Pool: session %s: no result %.0f s after the call began%s",
                        self.pool.session, IDLE_HINT_S, note)

    def check(self, got):
        """After a read: ``got`` whether it brought a result of the call."""
        if got and not self.got:
            self.got = True
            self.timer.cancel()

    def stop(self):
        """The call is over (or abandoned): nothing more to say."""
        self.got = True
        self.timer.cancel()


def _heartbeat(client, session, stop, period):
    """The pool's heartbeat thread: keeps ``session`` open until ``stop`` is set.  It holds
    no reference to the pool, so that a pool nobody holds any more is collected (and its
    ``__del__`` closes it) instead of being kept, heart-beating, by its own thread."""
    while not stop.wait(period):
        try:
            client.session_heartbeat(session)
        except errors.SessionNotFound:
            return
        except errors.MusterError:
            pass


class Pool:
    """A pool of workers of ``queue`` running ``worker_class``.

    ``init_data`` goes to the class's constructor: ``{"args": [...], "kwargs": {...}}``
    (either key optional) is unpacked, any other value is passed as the one argument.
    ``url`` / ``token`` default as :class:`muster.Client`'s; ``client`` may be given
    instead.  distributed_computing's order, ``Pool(worker_class, init_data, password,
    server_address[, server_port])``, is read as such (:func:`_pool_order`).  The queue is
    created (with ``queue_settings``) when it does not exist.
    ``timeout_ms`` is the session's heartbeat timeout (a thread heart-beats every third);
    a head that is down or restarting is waited for as long (see :meth:`_retrying`).
    ``use_shared``: ship the pickled class as shared data (default: when the head has
    the shared-data API), else inside the session's init data.  ``requires``: the levels
    of shared data every job requires (see :func:`_requires`; a call's ``requires`` adds
    to them), made local files on the worker before the job runs (the instance's
    ``shared_files``).
    """

    def __init__(self, worker_class, init_data=None, url=None, token=None, queue="pool",
                 client=None, timeout_ms=60000, queue_settings=None, use_shared=None, data_dir=None,
                 requires=None):
        _refuse_in_worker_load()
        self._own_client = client is None   # its connections close with the pool
        if client is None:
            url, token, queue = _pool_order(url, token, queue)
        self.client = client or Client(url, token, data_dir)
        self.queue = queue
        self.worker_class = worker_class
        self._lock = threading.Lock()
        self._next_index = 0
        self._first_ids = {}  # a call's first session index -> its first task's id (pool_why)
        self._completion_cursor = 0
        self._closed = False
        self._keep_session = False  # set when the pool gave up on a head that did not answer
        self.timeout_ms = timeout_ms
        class_pickle = _class_pickle(worker_class)
        main = _main_script(worker_class)
        self._requires = _requires(requires, "muster.Pool")
        init = _pickled(unpack_call(init_data), "muster.Pool: init_data")
        self._created_queue = False   # a mistyped name makes a new queue: the idle hint says so
        try:
            _warn_settings_kept(queue, self.client.queue(queue), queue_settings)
        except errors.QueueNotFound:
            self.client.put_queue(queue, **(queue_settings or {}))
            self._created_queue = True
        if use_shared is None:
            use_shared = self.client.shared.available()
        self.use_shared = bool(use_shared)
        spec = {MARK: 1, "init": init, "main": main,
                "paths": _class_paths(worker_class), "python": sys.version.split()[0]}
        if self.use_shared:
            spec["worker_class"] = {"shared": WORKER_CLASS_BLOB}
        else:
            import base64
            spec["worker_class"] = {"pickle": base64.b64encode(class_pickle).decode("ascii")}
        s = self.client.create_session(queue, cleanup_on_exit=True, timeout_ms=timeout_ms, init_data=spec)
        self.session = s["id"]
        try:
            if self.use_shared:
                self.client.shared.set(self.session, WORKER_CLASS_BLOB, class_pickle)
        except BaseException:
            self._close_session()
            raise
        self._stop = threading.Event()
        period = timeout_ms / 3000.0
        # A heartbeat that takes longer than the period is given up: the next one follows,
        # and close() waits for one in flight at most that long.
        self._hb_client = Client(self.client.url, self.client.token, timeout=max(1.0, period))
        self._hb = threading.Thread(target=_heartbeat, name="muster.Pool heartbeat " + self.session,
                                    args=(self._hb_client, self.session, self._stop, period),
                                    daemon=True)
        self._hb.start()

    # ---- lifetime --------------------------------------------------------------------

    def _close_session(self):
        try:
            self.client.close_session(self.session)
        except errors.SessionNotFound:
            pass

    def close(self):
        """Closes the pool: its session on the head closes, unfinished jobs are cancelled,
        its updates and shared data are deleted; the workers drop its instance.  A head
        that is down or restarting is waited for as the pool's other calls wait for it
        (:meth:`_retrying`, up to ``timeout_ms``; a close whose reply was lost and that
        finds the session closed when sent again has closed it); then it raises
        NetworkError (or Unavailable) naming the session, which stays open, and close()
        may be called again once the head is back.  After the pool gave up on a head that
        did not answer, the session is left open instead (its results can still be read;
        the head ends it ``timeout_ms`` after its last call)."""
        self._close(retry=True)

    terminate = close

    def _close(self, retry):
        """close(), with the close of the session tried once when not ``retry`` (leaving a
        ``with`` block on an exception, the garbage collector): neither waits for a head
        that is down, and a failed try is not made again (the head ends the session)."""
        if not self._closed:
            self._closed = True
            self._stop.set()
            if self._hb is not threading.current_thread():   # (a collection may run there)
                # Bounded: at interpreter exit a daemon thread may be stopped for good.
                self._hb.join(self._hb_client.timeout + 1.0)
            self._hb_client.close()
            self._close_due = not self._keep_session
        try:
            if not self._close_due:
                return
            if not retry:
                self._close_due = False
                self._close_session()
                return
            self._retrying("closing the session", lambda left: self._close_session(),
                           self._gave_up_closing)
            self._close_due = False
        finally:
            if self._own_client:   # no socket left open (a later call opens a new one)
                self.client.close()

    def _gave_up_closing(self, err, waited):
        away, name = self._server_away(err)
        text = ("session %s: %s did not answer for %.0f s (tried again every "
                "second for up to the session's timeout_ms, %d ms; last error: %s), so the "
                "pool could not close its session: it is left open and its jobs run on. "
                "Call close() again once %s is back (or run `muster session close %s "
                "--url %s`); else the head closes the session, cancelling its unfinished "
                "jobs, once it goes %d ms without a client"
                % (self.session, away, waited, self.timeout_ms, err, name, self.session,
                   self.client.url, self.timeout_ms))
        out = type(err)(text, code=err.code, status=err.status)
        out.session, out.order, out.cursor = self.session, None, None
        return out

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
            return
        # The exception in flight says what went wrong: a failure to close (the head is
        # down, say) must not replace it, nor wait for the head to come back: the close
        # is tried once, and the session then ends with its timeout_ms.
        try:
            self._close(retry=False)
        except errors.MusterError as e:
            if hasattr(exc, "add_note"):
                exc.add_note("muster.Pool: closing the pool failed too (%s); the head ends "
                             "session %s %d ms after its last heartbeat"
                             % (e, self.session, self.timeout_ms))

    def __del__(self):
        try:
            if not self._closed:
                self._close(retry=False)
        except Exception:
            pass

    # ---- jobs ------------------------------------------------------------------------

    def _task_requires(self, requires, where):
        """The ``requires`` of the call's tasks (the wire's form, None for none): the
        pool's levels, a blob the call names taking the call's level, and the call's."""
        levels = {}
        for whose, given in (("muster.Pool", self._requires), (where, _requires(requires, where))):
            seen = {}
            for scope, name, level in given:  # (name, level) and (SESSION, name, level) meet here
                blob = (scope or self.session, name)
                if blob in seen:
                    raise ValueError("%s: requires: %r of the pool's session is required twice "
                                     "(levels %d and %d); a task requires one level of a blob"
                                     % (whose, name, seen[blob], level))
                seen[blob] = levels[blob] = level
        if len(levels) > MAX_REQUIRES:
            raise ValueError("%s: requires: with the pool's, its tasks would require %d "
                             "levels; a task may require at most %d"
                             % (where, len(levels), MAX_REQUIRES))
        return [{"scope": scope, "name": name, "level": level}
                for (scope, name), level in levels.items()] or None

    def _submit(self, data, deadline=None, timeout=None, requires=None, where="muster.Pool"):
        """Submits ``data`` as the pool's next jobs, each requiring ``requires`` besides
        the pool's levels: (first session index, count).  With ``deadline`` (``timeout``
        seconds after the call began) a head that is down is waited for until then at
        most (TimeoutError)."""
        self._check_open(where)
        need = self._task_requires(requires, where)
        payloads = [{MARK: 1, "session": self.session,
                     "call": _pickled(unpack_call(item), "%s: input %d" % (where, i))}
                    for i, item in enumerate(data)]
        with self._lock:
            first = self._next_index
            self._next_index += len(payloads)
        for at in range(0, len(payloads), SUBMIT_BATCH):
            chunk = payloads[at:at + SUBMIT_BATCH]
            tasks = [{"payload": p, "index": first + at + i} for i, p in enumerate(chunk)]
            if need:
                for task in tasks:
                    task["requires"] = need
            what = "submitting jobs at session indexes %d-%d" % (tasks[0]["index"],
                                                                 tasks[-1]["index"])
            try:
                # Sent again while the head does not answer: a try that was stored but
                # whose reply was lost is answered as a repeat and stores nothing twice.
                stored = self._retrying(
                    what, lambda left: self.client.session_put(self.session, tasks),
                    lambda e, waited: self._gave_up_submitting(e, waited, first, at, len(chunk)),
                    deadline, lambda *outage: self._timed_out_submitting(
                        timeout, outage, first, at, len(chunk)))
                if at == 0 and stored:
                    self._note_first_id(first, stored[0]["id"])
            except errors.PayloadTooLarge as e:
                raise _too_large(e, where, at) from None
            except errors.InvalidState as e:
                # An index in use is another producer's task, never this batch stored by
                # an earlier try (that is a repeat): say so (the head stored none of the
                # batch) rather than wait at the indexes that stay without a task.
                collision = IndexCollision.from_refusal(e, self.session, tasks[0]["index"],
                                                        tasks[-1]["index"], at)
                if collision is None:
                    raise
                raise collision from None
        return first, len(payloads)

    def _note_first_id(self, first, task_id):
        """Remembers the id of the first task of the call at session index ``first``: its
        timeout looks at its jobs' errors from there (the tasks of one put have consecutive
        ids).  The newest 64 calls are kept."""
        with self._lock:
            self._first_ids[first] = task_id
            while len(self._first_ids) > 64:
                del self._first_ids[next(iter(self._first_ids))]

    def _check_open(self, where):
        """Raises ValueError, as multiprocessing's Pool does, when the pool was closed: a
        closed pool's session is gone (or, when it gave up on the head, no longer its)."""
        if self._closed:
            raise ValueError("%s: the pool is closed (by close(), terminate() or the end of its "
                             "with block; session %s): make a new muster.Pool"
                             % (where, self.session))

    def _retrying(self, what, call, give_up, deadline=None, timed_out=None):
        """``call(left)``'s value, ``left`` being the seconds to ``deadline`` (None without
        one).  While it fails because the head is down or restarting (NetworkError,
        Unavailable) it is called again at once, then every RETRY_PAUSE_S, until
        ``timeout_ms`` has passed since the first failure: as long as the session outlives
        a silent client, while the heartbeat thread keeps it open.  Then the pool keeps
        its session (close() leaves it open, so its results can be read) and raises
        ``give_up(last error, seconds waited)``.  ``deadline`` (a time.monotonic()) is
        never slept past, and once it has passed a failed try is not made again: the call
        raises ``timed_out(seconds the head has been unreachable, the last error)``.  Any
        other error raises at once.  The pool logs one WARNING (``what`` failed) when it
        starts trying again and one INFO when the head answers again, nothing per try.
        Both name what answers at the URL, as the CLI does: the head, the node agent, or
        the head behind the node agent when the agent answered that it cannot reach it."""
        failing_since = last_err = None
        while True:
            now = time.monotonic()
            # The first try is made even past the deadline: what is ready is returned
            # (the caller raises when nothing was, _past_deadline).
            if deadline is not None and now >= deadline and failing_since is not None:
                raise timed_out(now - failing_since, last_err)
            try:
                value = call(None if deadline is None else deadline - now)
            except _HEAD_DOWN as e:
                now, last_err = time.monotonic(), e
                if failing_since is None:
                    failing_since = now
                    self._log_unreachable(what, e, deadline)
                    continue
                left = self.timeout_ms / 1000.0 - (now - failing_since)
                if left <= 0:
                    self._keep_session = True
                    raise give_up(e, now - failing_since) from e
                if deadline is not None:
                    left = min(left, deadline - now)
                time.sleep(max(0.0, min(RETRY_PAUSE_S, left)))
                continue
            if failing_since is not None:
                log.info("muster.Pool: session %s: %s answers again after %.1f s; "
                         "carrying on (%s)", self.session, self._server_at(),
                         time.monotonic() - failing_since, what)
            return value

    def _server_at(self):
        """What answers at the pool's URL, in the CLI's words: "the head at URL", "the node
        agent at URL", or "the muster head or node agent at URL" while no reply said."""
        return "%s at %s" % (_SERVER_NAMES[self.client.server], self.client.url)

    def _server_away(self, err):
        """What did not answer when a call failed with ``err``, in the CLI's words, and its
        short name ("once NAME is back"): the head behind a node agent that answered
        Unavailable (it cannot reach the head), else as :meth:`_server_at`."""
        if self.client.server == "node" and isinstance(err, errors.Unavailable):
            return "the head behind the node agent at %s" % self.client.url, "the head"
        name = _SERVER_NAMES[self.client.server] if self.client.server else "the server"
        return self._server_at(), name

    def _log_unreachable(self, what, err, deadline):
        """The one WARNING of an outage: what failed, and for how long it is tried again."""
        limit, why = self.timeout_ms / 1000.0, "the session's timeout_ms"
        if deadline is not None and deadline - time.monotonic() < limit:
            limit, why = max(0.0, deadline - time.monotonic()), "the call's timeout"
        log.warning("muster.Pool: session %s: %s failed (%s): %s is unreachable or "
                    "restarting; trying again every %g s for up to %.1f s (%s)",
                    self.session, what, err, self._server_away(err)[0], RETRY_PAUSE_S, limit,
                    why)

    def _read_rest(self, via, order, cursor, first, last):
        """How to read results ``first``..``last`` from ``cursor`` with the client ``via``."""
        return ("read the rest (session indexes %d-%d) with %s.iter_results(%r, order=%r, "
                "cursor=%d), the value of a result r in state done being "
                "muster.worker.decode_result(r[\"result\"])"
                % (first, last, via, self.session, order, cursor))

    def _gave_up(self, err, waited, happened, rest=None):
        """The error for a head that did not answer for ``waited`` seconds: ``err``'s class
        (NetworkError or Unavailable) with a message naming the session, saying what
        ``happened`` to the call and, with ``rest`` = (order, cursor, first, last), how to
        read its results at session indexes ``first``..``last``, which it did not, from
        ``cursor`` once the head is back.  ``session``, ``order`` and ``cursor`` are set on
        it (the last two None without ``rest``)."""
        away, name = self._server_away(err)
        text = ("session %s: %s did not answer for %.0f s (tried again every "
                "second for up to the session's timeout_ms, %d ms; last error: %s), so the "
                "pool gave up: %s. The session is left open (closing the pool does not close "
                "it): its jobs run on, and the head keeps their results until the session "
                "goes %d ms without a client" % (self.session, away, waited,
                                                 self.timeout_ms, err, happened, self.timeout_ms))
        order = cursor = None
        if rest is not None:
            order, cursor = rest[0], rest[1]
            text += "; once %s is back, " % name + self._read_rest(
                "muster.Client(%r, TOKEN)" % self.client.url, *rest)
        out = type(err)(text, code=err.code, status=err.status)
        out.session, out.order, out.cursor = self.session, order, cursor
        return out

    def _timed_out(self, timeout, outage, summary, happened, rest=None):
        """The TimeoutError of a call whose ``timeout`` (seconds) passed: it names the
        session, gives the ``summary``, says whether the server had been unreachable
        (``outage``: (for how many seconds, the last error); None when it answered), what
        ``happened`` to the call and, with ``rest`` as for :meth:`_gave_up`, how to read
        what it did not.  The pool and its session stay usable; ``session``, ``order`` and
        ``cursor`` are set on it."""
        text = "session %s: %s after %.1f s (the call's timeout)" % (self.session, summary,
                                                                     timeout)
        back = ""
        if outage is None:
            text += self._no_worker_note()
        else:
            away, name = self._server_away(outage[1])
            text += ("; %s has been unreachable for the last %.1f s (without "
                     "a timeout the call waits for it up to the session's timeout_ms, %d ms)"
                     % (away, outage[0], self.timeout_ms))
            back = "once %s is back, " % name
        text += ": %s. The session is still open and its jobs run on" % happened
        order = cursor = None
        if rest is not None:
            order, cursor = rest[0], rest[1]
            text += (": %s%s, before the pool is closed (closing deletes them)"
                     % (back, self._read_rest("pool.client", *rest)))
        out = TimeoutError(text)
        out.session, out.order, out.cursor = self.session, order, cursor
        return out

    def _submitted(self, first, at, count, failed):
        """What became of a call whose batch at ``at`` (``count`` jobs) ``failed`` (how),
        and the results the call will not read (a ``rest`` for the errors, or None)."""
        happened = ("submitting this call's jobs at session indexes %d-%d %s, so the call "
                    "returns nothing and its jobs after them were not submitted"
                    % (first + at, first + at + count - 1, failed))
        if not at:
            return happened, None
        happened += ("; its jobs before them, at session indexes %d-%d, were stored and run"
                     % (first, first + at - 1))
        return happened, ("submission", first, first, first + at - 1)

    def _gave_up_submitting(self, err, waited, first, at, count):
        return self._gave_up(err, waited, *self._submitted(first, at, count, "failed"))

    def _timed_out_submitting(self, timeout, outage, first, at, count):
        happened, rest = self._submitted(first, at, count, "did not succeed in time (a try "
                                         "whose reply was lost may have stored them)")
        return self._timed_out(timeout, outage, "this call's jobs were not all submitted",
                               happened, rest)

    def _unread(self, order, cursor, first, n, read):
        happened = "%d of this call's %d results were read" % (read, n)
        # In submission order the cursor is the first index not read; in completion order
        # a sequence number, and what follows it are the results not read yet.
        lo = cursor if order == "submission" else first
        return happened, (order, cursor, lo, first + n - 1)

    def _gave_up_reading(self, err, waited, order, cursor, first, n, read):
        return self._gave_up(err, waited, *self._unread(order, cursor, first, n, read))

    def _timed_out_reading(self, timeout, outage, order, cursor, first, n, read):
        happened, rest = self._unread(order, cursor, first, n, read)
        if outage is None:  # the head answers: what its jobs keep failing with, if anything
            with self._lock:
                first_id = self._first_ids.get(first)
            happened += failing_jobs_note(self.client, self.queue, self.session, first_id,
                                          first, n)
        return self._timed_out(timeout, outage, "this call's results were not all in",
                               happened, rest)

    @staticmethod
    def _value(r, first):
        """A result's value, or the TaskError of a job that failed for good (_Results raises
        it: the generator that yields it goes on)."""
        if r["state"] != "done":
            return TaskError(r["index"] - first, r["state"], r.get("error"))
        return decode_result(r["result"])

    @staticmethod
    def _past_deadline(deadline):
        """Whether a call's ``deadline`` (a time.monotonic(), or None) has passed: a read
        past it that brought nothing new ends the call (TimeoutError)."""
        return deadline is not None and time.monotonic() >= deadline

    def _read(self, order, cursor, max, quick, left):
        """One read of the session's results: at once when ``quick``, else a long-poll as
        long as the head lets one wait (its max_wait_ms) or to the deadline ``left`` s
        away, whichever is sooner (Client._poll_results, which also paces a head that
        lets none wait)."""
        return self.client._poll_results(self.session, order, cursor, max, quick, None, left)

    def imap(self, data, timeout=None, requires=None):
        """Results in input order, each as soon as it and those before it are ready.
        The inputs are submitted at once.  A job that failed for good raises TaskError from
        ``next()``, and the next ``next()`` goes on after it (as multiprocessing's).
        ``timeout`` (seconds) bounds the whole call, from now to its last result (not each
        result, as multiprocessing's ``next(timeout)``): TimeoutError once it has passed.
        ``requires``: levels of shared data this call's jobs require besides the pool's
        (a blob the pool names too takes the call's level), as for ``Pool(requires=)``."""
        return self._imap(data, timeout, requires, "muster.Pool.imap")

    def _imap(self, data, timeout, requires, where):
        deadline = None if timeout is None else time.monotonic() + timeout
        first, n = self._submit(list(data), deadline, timeout, requires, where)
        hint = _IdleHint(self)
        return _Results(self._ordered(first, n, deadline, timeout, hint), hint)

    def _ordered(self, first, n, deadline, timeout, hint):
        cursor, end = first, first + n
        quick = True  # the first read, and one after a stalled reply, does not wait
        while cursor < end:
            # A read the head did not answer is sent again from the same cursor: every
            # result before it was yielded, none after it was.
            reply = self._retrying(
                "reading results",
                lambda left: self._read("submission", cursor, min(1000, end - cursor), quick, left),
                lambda e, waited: self._gave_up_reading(e, waited, "submission", cursor, first,
                                                        n, cursor - first),
                deadline, lambda *outage: self._timed_out_reading(
                    timeout, outage, "submission", cursor, first, n, cursor - first))
            before = cursor
            for r in reply["results"]:
                if r["index"] != cursor or cursor >= end:
                    break
                cursor += 1
                yield self._value(r, first)
            hint.check(cursor > before)
            if cursor == before and self._past_deadline(deadline):
                raise self._timed_out_reading(timeout, None, "submission", cursor, first, n,
                                              cursor - first)
            # A gap in the inputs' indexes (another producer took them, say) once every
            # task of the session has its result: say so rather than wait for ever.
            quick = errors.results_stalled(reply)
            if quick and not reply["results"]:
                raise errors.IndexGap.from_reply(self.session, reply, "imap")

    def imap_unordered(self, data, timeout=None, requires=None):
        """Results in completion order (each exactly once); ``timeout`` and ``requires``
        as for imap."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first, n = self._submit(list(data), deadline, timeout, requires,
                                "muster.Pool.imap_unordered")
        with self._lock:
            cursor = self._completion_cursor
        hint = _IdleHint(self)
        return _Results(self._unordered(first, n, cursor, deadline, timeout, hint), hint)

    def _unordered(self, first, n, cursor, deadline, timeout, hint):
        seen = set()
        while len(seen) < n:
            # Read again from the same cursor while the head does not answer (as _ordered).
            reply = self._retrying(
                "reading results",
                lambda left: self._read("completion", cursor, 1000, False, left),
                lambda e, waited: self._gave_up_reading(e, waited, "completion", cursor, first,
                                                        n, len(seen)),
                deadline, lambda *outage: self._timed_out_reading(
                    timeout, outage, "completion", cursor, first, n, len(seen)))
            cursor = reply["cursor"]
            with self._lock:
                self._completion_cursor = max(self._completion_cursor, cursor)
            before = len(seen)
            for r in reply["results"]:
                i = r["index"] - first
                if 0 <= i < n and i not in seen:
                    seen.add(i)
                    yield self._value(r, first)
            hint.check(len(seen) > before)
            if len(seen) == before and len(seen) < n and self._past_deadline(deadline):
                raise self._timed_out_reading(timeout, None, "completion", cursor, first, n,
                                              len(seen))

    def map(self, data, timeout=None, requires=None):
        """All results, in input order (like multiprocessing.Pool.map).  Each item is the
        one argument of ``run``, or ``{"args": [...], "kwargs": {...}}``.  ``timeout``
        (seconds) bounds the whole call, the jobs' submission included: TimeoutError once
        it has passed, its message naming the session, saying whether the head was
        unreachable and how to read the rest.  ``requires`` as for imap."""
        return list(self._imap(data, timeout, requires, "muster.Pool.map"))

    # ---- updates and counts -----------------------------------------------------------

    def update_workers(self, data):
        """Sends an update to every worker of the pool: each calls ``handle_update`` with it
        once it finishes its current job (or before its next one), in the order sent, and
        every job submitted afterwards runs after it.  ``{"args", "kwargs"}`` is unpacked.
        Returns the update's sequence number."""
        self._check_open("muster.Pool.update_workers")
        call = _pickled(unpack_call(data), "muster.Pool.update_workers: data")
        reply = self.client.post_update(self.queue, {MARK: 1, "call": call}, session=self.session)
        return reply["seq"]

    def _no_worker_note(self):
        """"; no worker serves queue 'Q'..." when none does (what a call that waits for its
        results most likely waits for), else "" (also when the count cannot be had)."""
        try:
            if self._workers():
                return ""
        except errors.MusterError:
            return ""
        text = ("; no worker serves queue %r: the jobs wait in it for one (start workers with "
                "`muster node --queue %s -- /usr/bin/python3 -m muster.worker`, or `python3 -m "
                "muster.worker --queue %s`)" % (self.queue, self.queue, self.queue))
        if self._created_queue:
            text += ("; queue %r did not exist before this pool, which created it: if the name "
                     "is mistyped, close the pool and see `muster queue ls`" % self.queue)
        return text

    def _workers(self):
        return [w for w in self.client.workers()
                if w.get("state") == "active" and self.queue in (w.get("queues") or [])]

    def get_workers_count(self):
        """Active worker processes serving the pool's queue (not machines)."""
        return len(self._workers())

    def get_nodes_count(self):
        """Machines that run an active worker of the pool's queue: the distinct nodes
        (agents) of those workers, a worker without a node counting as a machine of its
        own; a node whose workers all serve other queues does not count (the same as C's
        muster_pool_nodes_count)."""
        nodes = set()
        for w in self._workers():
            nodes.add(("node", w["node"]) if w.get("node") else ("worker", w["id"]))
        return len(nodes)

    def __repr__(self):
        return "<muster.Pool %s on %s, session %s>" % (self.worker_class.__name__, self.queue, self.session)
