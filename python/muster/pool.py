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
import os
import re
import sys
import threading
import time

from . import errors
from .client import Client
from .worker import MARK, WORKER_CLASS_BLOB, decode_result, dumps, unpack_call

SUBMIT_BATCH = 1000
POLL_MS = 20000


class WorkerInterface:
    """What a pool's worker class implements (all three may be overridden).

    ``__init__(init_data)`` runs once per worker process per pool (heavy preparation
    goes here); ``run(*args, **kwargs)`` once per job, its return value is the job's
    result; ``handle_update(*args, **kwargs)`` for each ``Pool.update_workers``, between
    jobs, in the order they were sent (its return value is ignored).
    """

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
        super().__init__("job %d %s: %s" % (index, state, error), code="task_failed", status=0)
        self.index = index
        self.state = state
        self.error = error


class IndexCollision(errors.InvalidState):
    """A batch of the pool's jobs refused by the head (``409 invalid_state``) because one of
    the session indexes the pool numbered them with was already in use: another producer
    put tasks into the pool's session with explicit indexes.  Nothing of the batch was
    stored.  ``session``; ``first`` and ``last``: the refused batch's indexes; ``index``:
    the first of them in use; ``stored``: how many jobs of the same call were stored before
    the batch (they run, but the call reads nothing of them).

    The pool sends each batch once (the client never sends a POST again), so an index in
    use is never one of the pool's own earlier tries: it is always someone else's task."""

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


def _class_paths(cls):
    """Directories a worker may need on sys.path to import ``cls`` (when they exist there)."""
    paths = []
    mod = sys.modules.get(cls.__module__)
    f = getattr(mod, "__file__", None)
    if f:
        d = os.path.dirname(os.path.abspath(f))
        for _ in range(cls.__module__.count(".")):
            d = os.path.dirname(d)
        paths.append(d)
    paths.append(os.getcwd())
    return paths


class Pool:
    """A pool of workers of ``queue`` running ``worker_class``.

    ``init_data`` goes to the class's constructor: ``{"args": [...], "kwargs": {...}}``
    (either key optional) is unpacked, any other value is passed as the one argument.
    ``url`` / ``token`` default as :class:`muster.Client`'s; ``client`` may be given
    instead.  The queue is created (with ``queue_settings``) when it does not exist.
    ``timeout_ms`` is the session's heartbeat timeout (a thread heart-beats every third).
    ``use_shared``: ship the pickled class as shared data (default: when the head has
    the shared-data API), else inside the session's init data.
    """

    def __init__(self, worker_class, init_data=None, url=None, token=None, queue="pool",
                 client=None, timeout_ms=60000, queue_settings=None, use_shared=None, data_dir=None):
        self.client = client or Client(url, token, data_dir)
        self.queue = queue
        self.worker_class = worker_class
        self._lock = threading.Lock()
        self._next_index = 0
        self._completion_cursor = 0
        self._closed = False
        try:
            self.client.queue(queue)
        except errors.QueueNotFound:
            self.client.put_queue(queue, **(queue_settings or {}))
        main = None
        if worker_class.__module__ == "__main__":
            main = getattr(sys.modules["__main__"], "__file__", None)
            main = os.path.abspath(main) if main else None
        if use_shared is None:
            use_shared = self.client.shared.available()
        self.use_shared = bool(use_shared)
        import pickle
        class_pickle = pickle.dumps(worker_class, protocol=4)
        spec = {MARK: 1, "init": dumps(unpack_call(init_data)), "main": main,
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
        self._hb_client = Client(self.client.url, self.client.token)
        self._hb = threading.Thread(target=self._heartbeat, args=(timeout_ms / 3000.0,), daemon=True)
        self._hb.start()

    # ---- lifetime --------------------------------------------------------------------

    def _heartbeat(self, period):
        while not self._stop.wait(period):
            try:
                self._hb_client.session_heartbeat(self.session)
            except errors.SessionNotFound:
                return
            except errors.MusterError:
                pass

    def _close_session(self):
        try:
            self.client.close_session(self.session)
        except errors.SessionNotFound:
            pass

    def close(self):
        """Closes the pool: its session on the head closes, unfinished jobs are cancelled,
        its updates and shared data are deleted; the workers drop its instance."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._close_session()
        self._hb_client.close()

    terminate = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:
            pass

    # ---- jobs ------------------------------------------------------------------------

    def _submit(self, data):
        if self._closed:
            raise ValueError("the pool is closed")
        payloads = [{MARK: 1, "session": self.session, "call": dumps(unpack_call(item))} for item in data]
        with self._lock:
            first = self._next_index
            self._next_index += len(payloads)
        for at in range(0, len(payloads), SUBMIT_BATCH):
            chunk = payloads[at:at + SUBMIT_BATCH]
            tasks = [{"payload": p, "index": first + at + i} for i, p in enumerate(chunk)]
            try:
                self.client.session_put(self.session, tasks)
            except errors.InvalidState as e:
                # The batch was sent once, so an index in use is another producer's task,
                # never this batch stored by an earlier try: say so (the head stored none
                # of the batch) rather than wait at the indexes that stay without a task.
                collision = IndexCollision.from_refusal(e, self.session, tasks[0]["index"],
                                                        tasks[-1]["index"], at)
                if collision is None:
                    raise
                raise collision from None
        return first, len(payloads)

    @staticmethod
    def _value(r, first):
        if r["state"] != "done":
            raise TaskError(r["index"] - first, r["state"], r.get("error"))
        return decode_result(r["result"])

    def _deadline(self, timeout):
        return None if timeout is None else time.monotonic() + timeout

    def _wait_ms(self, deadline):
        if deadline is None:
            return POLL_MS
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the pool's results did not come within the timeout")
        return max(1, min(POLL_MS, int(left * 1000)))

    def imap(self, data, timeout=None):
        """Results in input order, each as soon as it and those before it are ready.
        The inputs are submitted at once.  A job that failed for good raises TaskError."""
        first, n = self._submit(list(data))
        return self._ordered(first, n, self._deadline(timeout))

    def _ordered(self, first, n, deadline):
        cursor, end = first, first + n
        quick = True  # the first read, and one after a stalled reply, does not wait
        while cursor < end:
            reply = self.client.results(self.session, order="submission", cursor=cursor,
                                        max=min(1000, end - cursor),
                                        wait_ms=0 if quick else self._wait_ms(deadline))
            for r in reply["results"]:
                if r["index"] != cursor or cursor >= end:
                    break
                cursor += 1
                yield self._value(r, first)
            # A gap in the inputs' indexes (another producer took them, say) once every
            # task of the session has its result: say so rather than wait for ever.
            quick = errors.results_stalled(reply)
            if quick and not reply["results"]:
                raise errors.IndexGap.from_reply(self.session, reply)

    def imap_unordered(self, data, timeout=None):
        """Results in completion order (each exactly once)."""
        first, n = self._submit(list(data))
        with self._lock:
            cursor = self._completion_cursor
        return self._unordered(first, n, cursor, self._deadline(timeout))

    def _unordered(self, first, n, cursor, deadline):
        seen = set()
        while len(seen) < n:
            reply = self.client.results(self.session, order="completion", cursor=cursor,
                                        max=1000, wait_ms=self._wait_ms(deadline))
            cursor = reply["cursor"]
            with self._lock:
                self._completion_cursor = max(self._completion_cursor, cursor)
            for r in reply["results"]:
                i = r["index"] - first
                if 0 <= i < n and i not in seen:
                    seen.add(i)
                    yield self._value(r, first)

    def map(self, data, timeout=None):
        """All results, in input order (like multiprocessing.Pool.map).  Each item is the
        one argument of ``run``, or ``{"args": [...], "kwargs": {...}}``."""
        return list(self.imap(data, timeout=timeout))

    # ---- updates and counts -----------------------------------------------------------

    def update_workers(self, data):
        """Sends an update to every worker of the pool: each calls ``handle_update`` with it
        once it finishes its current job (or before its next one), in the order sent, and
        every job submitted afterwards runs after it.  ``{"args", "kwargs"}`` is unpacked.
        Returns the update's sequence number."""
        reply = self.client.post_update(self.queue, {MARK: 1, "call": dumps(unpack_call(data))},
                                        session=self.session)
        return reply["seq"]

    def _workers(self):
        return [w for w in self.client.workers()
                if w.get("state") == "active" and self.queue in (w.get("queues") or [])]

    def get_workers_count(self):
        """Active worker processes serving the pool's queue (not machines)."""
        return len(self._workers())

    def get_nodes_count(self):
        """Machines (node agents) with an active worker of the pool's queue; a worker
        without a node counts as its own machine."""
        nodes = set()
        for w in self._workers():
            nodes.add(("node", w["node"]) if w.get("node") else ("worker", w["id"]))
        return len(nodes)

    def __repr__(self):
        return "<muster.Pool %s on %s, session %s>" % (self.worker_class.__name__, self.queue, self.session)
