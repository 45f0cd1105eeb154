"""``python3 -m muster.worker``: runs the worker classes of :class:`muster.Pool`.

Two ways to run it:

- **Under a node agent** (the usual one)::

      muster node --join URL --token T --queue pool -- /usr/bin/python3 -m muster.worker

  The agent's ``muster worker`` runs the command once per task (payload on stdin, result
  on stdout).  The first run starts a *resident* Python process for that worker (one per
  ``muster worker`` process, hence one per GPU or CPU slot) and every run hands its task
  to it over a Unix socket, so the worker class is unpickled and instantiated once per
  session (once per worker per pool), keeps its state between tasks and applies the
  pool's updates (``MUSTER_UPDATES_FILE``) in order between tasks.  The resident process
  exits with its ``muster worker``; it also exits when the per-task process that handed it
  the running task dies (the agent hard-stopped it or the lease was lost), and the next
  task starts a fresh one.  A new session whose code changed since the resident
  imported it (a module of the user's edited: worker_code.py) runs in a new resident,
  while the old one finishes the sessions it has open (worker_resident._hand_over).

- **Standalone**: ``python3 -m muster.worker --queue pool [--url URL] [--token T]
  [--cache-url URL]`` registers a worker, leases the queue's tasks itself (with
  ``updates_after``), applies updates in order before each task, runs it, and completes
  it with the pickled result or fails it with the traceback.  A completion leases the next task (and brings the
  updates) in the same request, so a busy worker makes one round trip per task.

Shared data a task requires is a local file before it runs: under an agent ``muster
worker`` makes it (``MUSTER_REQUIRES``), a standalone worker through its node cache
(``--cache-url``, ``MUSTER_CACHE_URL``) or from the head (worker_shared.py); the instance
finds the files in its ``shared_files`` (:class:`SharedFiles`).  The pool's class is read
through the node cache too when there is one.

Task payloads, session init data and updates are those :class:`muster.pool.Pool` makes
(``"muster.pool": 1``); anything else is failed permanently: standalone through the API,
under ``muster worker --permanent-exit N`` by exiting N (MUSTER_PERMANENT_EXIT); without
that option it exits 1, and the task is retried as any failure.
"""
import base64
import collections
import collections.abc
import io
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types

from . import _main_load
from .shared_files import SharedFile, SharedFiles  # noqa: F401 (muster.worker.SharedFile)
from .worker_code import CodeChanged, CodeFiles
from .worker_reg import DEFAULT_TIMEOUT_MS, LeaseKeys, Registration

MARK = "muster.pool"
WORKER_CLASS_BLOB = "worker_class"
MAX_INSTANCES = 4          # sessions whose instances a worker keeps at once
ERROR_TAIL = 16000         # characters of a traceback sent as a task's error


# ---- pickles in JSON -------------------------------------------------------------------

def dumps(obj):
    """base64 text of the pickle of ``obj`` (protocol 4: Python >= 3.4 reads it)."""
    return base64.b64encode(pickle.dumps(obj, protocol=4)).decode("ascii")


_main_modules = {}   # path -> (the file's identity when loaded, module)


def _file_identity(path):
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _main_module(path):
    """The Pool owner's main script loaded as module ``__mp_main__`` (like multiprocessing's
    spawn: its ``if __name__ == "__main__":`` block does not run).  A worker outlives the
    pools it serves, so the script is loaded again when it changed since it was loaded (it
    was edited between two runs): a pool then gets the code its owner ran, not that of an
    earlier run.  A session keeps the module its class came from (Runner.instance)."""
    identity = _file_identity(path)
    got = _main_modules.get(path)
    if got is not None and got[0] == identity:
        return got[1]
    mod = types.ModuleType("__mp_main__")
    mod.__file__ = path
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    # A muster.Pool opened while the script runs is the script's own, run again
    # because it is not under `if __name__ == "__main__":`: Pool refuses it, saying so
    # (pool_args._refuse_in_worker_load).
    _main_load.script = path
    previous = sys.modules.get("__mp_main__")
    sys.modules["__mp_main__"] = mod   # what the script's own pickles look up meanwhile
    try:
        exec(code, mod.__dict__)
    except BaseException:
        if previous is not None:
            sys.modules["__mp_main__"] = previous
        raise
    finally:
        _main_load.script = None
    _main_modules[path] = (identity, mod)
    return mod


def _use_main(mod):
    """Makes ``mod`` (a session's loaded main script, or None) the ``__mp_main__`` that
    pickle finds: a result of a class defined in the script is pickled by the name
    ``__mp_main__.X``, and pickle checks that the name leads to that very class, which it
    does not when another pool's script (or an earlier version) holds the name."""
    if mod is not None:
        sys.modules["__mp_main__"] = mod


class _Unpickler(pickle.Unpickler):
    """Finds ``__main__.X`` in the Pool owner's main script (``main``: its path, or the
    module it was loaded as), when given.  Without one (the Pool owner reading results), a
    worker's ``__mp_main__.X`` is the owner's ``__main__.X``, as multiprocessing has it."""

    def __init__(self, data, main=None):
        super().__init__(io.BytesIO(data))
        self._main = main

    def find_class(self, module, name):
        if module in ("__main__", "__mp_main__") and self._main:
            obj = self._main
            if not isinstance(obj, types.ModuleType):
                obj = _main_module(obj)
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj
        if module == "__mp_main__" and "__mp_main__" not in sys.modules:
            module = "__main__"
        return super().find_class(module, name)


def loads(text, main=None):
    return _Unpickler(base64.b64decode(text), main).load()


def unpack_call(value):
    """(args, kwargs) of one map item or update: ``{"args": [...], "kwargs": {...}}`` (the
    DistCompute form, either key optional) is unpacked, anything else is one argument."""
    if isinstance(value, dict) and value and set(value) <= {"args", "kwargs"}:
        return tuple(value.get("args") or ()), dict(value.get("kwargs") or {})
    return (value,), {}


def encode_result(value):
    """The JSON text a worker returns: ``{"pickle": BASE64}``."""
    return json.dumps({"pickle": dumps(value)}, separators=(",", ":"))


def decode_result(result, main=None):
    """A task's stored result (the object, or the text a command printed) -> the value."""
    if isinstance(result, str):
        result = json.loads(result)
    if not isinstance(result, dict) or "pickle" not in result:
        raise ValueError("not a muster.Pool result: %r" % (result,))
    return loads(result["pickle"], main)


class PermanentError(Exception):
    """A task no worker can run (not a Pool task, or its session is gone)."""


NO_SHARED_FILES = SharedFiles()


# ---- the runner: instances per session, updates in order -----------------------------

class Runner:
    """Keeps one worker-class instance per session and applies updates in sequence order."""

    def __init__(self, client, log=None, cache_url=None):
        self.client = client
        self.log = log or (lambda text: sys.stderr.write(text + "\n"))
        self.cache_url = cache_url   # the node cache the class is read through, if any
        self._cache_client = None
        self.instances = collections.OrderedDict()   # session -> (instance, spec)
        self.backlog = []                             # pool updates of sessions not instantiated yet
        self.seq = 0                                  # last update seen
        self.tasks = 0
        self.code = CodeFiles()                       # the user's modules imported, as they were
        self._asked_at = None                         # when open_sessions last asked the head

    # updates ----------------------------------------------------------------------------

    def apply_updates(self, updates):
        for u in sorted(updates or (), key=lambda u: u["seq"]):
            if u["seq"] <= self.seq:
                continue
            self.seq = u["seq"]
            data, session = u.get("data"), u.get("session")
            if not (isinstance(data, dict) and data.get(MARK) and session):
                continue
            if session in self.instances:
                self._handle_update(session, data)
            elif not self.code.stale:   # a process on changed code takes no new session
                self.backlog.append((session, data))

    def _handle_update(self, session, data):
        instance, spec = self.instances[session]
        _use_main(spec.get("main_module"))
        try:
            args, kwargs = loads(data["call"], spec.get("main_module"))
            instance.handle_update(*args, **kwargs)
        except Exception:
            self.log("muster.worker: handle_update of session %s raised:\n%s"
                     % (session, traceback.format_exc()))

    # instances --------------------------------------------------------------------------

    def _spec(self, session):
        from .errors import SessionNotFound
        try:
            spec = self.client.session(session).get("init_data")
        except SessionNotFound:
            raise PermanentError("session %s is closed" % session)
        if not (isinstance(spec, dict) and spec.get(MARK)):
            raise PermanentError("session %s is not a muster.Pool session" % session)
        return spec

    def instance(self, session):
        """The session's (instance, spec), made on its first task.  Raises CodeChanged
        for a new session when a module file this process imported changed since: its
        class must not run on the old code (worker_code.py)."""
        got = self.instances.get(session)
        if got is not None:
            self.instances.move_to_end(session)
            return got
        if self.code.changed():
            raise CodeChanged(self.code.stale, session)
        spec = self._spec(session)
        try:
            instance = self._new_instance(session, spec)
        finally:
            self.code.note()   # what loading the class imported, even when it failed
        while len(self.instances) >= MAX_INSTANCES:
            self.instances.popitem(last=False)
        self.instances[session] = (instance, spec)
        pending = [d for s, d in self.backlog if s == session]
        self.backlog = [(s, d) for s, d in self.backlog if s != session]
        for data in pending:
            self._handle_update(session, data)
        return instance, spec

    def _new_instance(self, session, spec):
        """Loads the class of ``spec`` (the session's init data) and instantiates it."""
        for path in spec.get("paths") or ():
            if path and os.path.isdir(path) and path not in sys.path:
                sys.path.append(path)
        main = spec.get("main")
        if main and not os.path.isfile(main):
            main = None
        spec["main"] = main
        main = spec["main_module"] = _main_module(main) if main else None
        _use_main(main)
        wc = spec["worker_class"]
        if "shared" in wc:
            blob = self._shared_reader().shared.get(session, wc["shared"])
            cls = _Unpickler(blob, main).load()
        else:
            cls = loads(wc["pickle"], main)
        args, kwargs = loads(spec["init"], main)
        return cls(*args, **kwargs)

    def _shared_reader(self):
        """The client that reads the pool's shared data (its class): one of the node
        cache when the worker has one (MUSTER_CACHE_URL: one fetch from the head for all
        the node's workers), else the head's."""
        if not self.cache_url:
            return self.client
        if self._cache_client is None:
            from .client import Client
            self._cache_client = Client(self.cache_url, self.client.token)
        return self._cache_client

    # tasks ------------------------------------------------------------------------------

    def run_payload(self, payload, session=None, requires=None):
        """Runs one Pool task; returns the result's JSON text.  ``requires``: the local
        files of the shared data the task requires (MUSTER_REQUIRES's list), the
        instance's ``shared_files`` while it runs.  Raises PermanentError for a task that
        is not the Pool's, and whatever the worker's ``run`` raises."""
        if isinstance(payload, str):
            try:
                payload = json.loads(payload)
            except ValueError:
                raise PermanentError("the payload is not a muster.Pool task")
        if not (isinstance(payload, dict) and payload.get(MARK) and "call" in payload):
            raise PermanentError("the payload is not a muster.Pool task")
        session = payload.get("session") or session
        instance, spec = self.instance(session)
        _use_main(spec.get("main_module"))
        args, kwargs = loads(payload["call"], spec.get("main_module"))
        self.tasks += 1
        instance.shared_files = SharedFiles(requires) if requires else NO_SHARED_FILES
        try:
            return encode_result(instance.run(*args, **kwargs))
        finally:
            self.code.note()   # what the job imported (a module imported lazily)

    def open_sessions(self, every_s=1.0):
        """The sessions this worker has instances of that the head still has; those it
        no longer has (their pool closed) are dropped.  The head is asked again only
        ``every_s`` after the last time (a process on changed code asks it as other
        sessions' tasks pass by); meanwhile the answer is the sessions kept."""
        from .errors import MusterError, SessionNotFound
        now = time.monotonic()
        if self._asked_at is not None and now - self._asked_at < every_s:
            return list(self.instances)
        self._asked_at = now
        for session in list(self.instances):
            try:
                self.client.session(session)
            except SessionNotFound:
                del self.instances[session]
            except MusterError:
                pass   # the head is away: the session may well be open
        return list(self.instances)


def _error_text():
    text = traceback.format_exc()
    return text if len(text) <= ERROR_TAIL else "...\n" + text[-ERROR_TAIL:]


# ---- standalone: lease the queue ourselves --------------------------------------------

REPORT_SLACK_MS = 10000   # past a lease's deadline, an outcome is still sent this long


def _report(lease, outcome, queue, worker, last, go_on, log=None, keys=None):
    """Reports a task's outcome.  A completion, when the worker goes on, also leases the
    next task in the same request (one round trip per task); its LeaseList is returned
    (None when nothing was leased with it).  The combined call is all or nothing, so when
    it fails the completion is sent alone (a lost lease excepted: that one is final), and
    sent again while the head does not answer (_send_outcome); the lease request that
    follows sends the combined call's key (``keys``, a LeaseKeys) again, so a task the
    call leased before its reply was lost comes back.  Never raises a MusterError: an
    outcome that cannot be reported is the head's to run again."""
    from .errors import LeaseLost, MusterError, NotFound
    log = log or (lambda text: sys.stderr.write(text + "\n"))
    keys = keys or LeaseKeys()
    try:
        if outcome[0] == "complete" and go_on:
            try:
                got = lease.complete_and_lease(queue, json.loads(outcome[1]), worker=worker,
                                               updates_after=last, request=keys.current())
                keys.done()
                return got
            except LeaseLost:
                raise
            except MusterError as e:
                if keys.refused(e):   # a head older than the keys: once more without
                    return _report(lease, outcome, queue, worker, last, go_on, log, keys)
                # e.g. the head forgot the worker: complete alone, re-register on lease
        _send_outcome(lease, outcome, log)
    except (LeaseLost, NotFound):
        pass   # taken elsewhere, or its session closed: the result is not wanted
    except MusterError as e:
        log("muster.worker: the %s of task %s was refused: %s" % (outcome[0], lease["task"], e))
    return None


def _send_outcome(lease, outcome, log):
    """Completes or fails ``lease`` alone.  While the head does not answer (it is down or
    restarting) the outcome is sent again every second until the lease's deadline (and a
    little slack for the clocks): a repeat of what the head did before its reply was lost
    is answered as a repeat, and past the deadline the task is another worker's."""
    from .errors import NetworkError, Unavailable
    said = False
    while True:
        try:
            if outcome[0] == "complete":
                lease.complete(json.loads(outcome[1]))
            else:
                lease.fail(outcome[1], permanent=outcome[2])
            if said:
                log("muster.worker: the head answers again: task %s reported" % lease["task"])
            return
        except (NetworkError, Unavailable) as e:
            if time.time() * 1000 > lease["deadline_ms"] + REPORT_SLACK_MS:
                log("muster.worker: the head did not answer before the lease of task %s ended "
                    "(%s): its %s is dropped, and the head runs the task again"
                    % (lease["task"], e, outcome[0]))
                return
            if not said:
                log("muster.worker: reporting task %s: %s; trying again every second until "
                    "its lease ends" % (lease["task"], e))
                said = True
            time.sleep(1.0)


def _lease_trouble(err, queue):
    """What the worker says when a lease failed with ``err`` (it tries again each second)."""
    from .errors import QueueNotFound
    if isinstance(err, QueueNotFound):
        return ("muster.worker: waiting for queue %s to be created (a muster.Pool on it "
                "creates it)" % queue)
    return "muster.worker: lease: %s; trying again every second" % err


def _run_lease(runner, files, lease):
    """Runs one leased task, the levels of shared data it requires made local files first
    (``files``, a worker_shared.LevelFiles): its outcome, ("complete", result) or ("fail",
    error, permanent).  A level that cannot be had fails it, to be retried.  CodeChanged
    (a new session, on code that changed since this process imported it) releases the
    lease, the attempt not counted, and is raised: the worker starts itself again."""
    from .errors import MusterError
    from .worker_shared import LevelUnavailable
    try:
        requires = files.acquire(lease["requires"]) if lease.get("requires") else None
        return ("complete", runner.run_payload(lease.payload, lease.get("session"), requires),
                False)
    except LevelUnavailable as e:
        return ("fail", str(e), False)
    except CodeChanged:
        try:
            lease.release()
        except MusterError:
            pass   # the lease ends at its deadline instead
        raise
    except PermanentError as e:
        return ("fail", str(e), True)
    finally:
        files.release()


def serve_queue(client, queue, nickname=None, max_tasks=0, wait_ms=None, stop=None, busy=None,
                log=None, cache_url=None):
    """Registers a worker and runs the queue's Pool tasks until ``stop`` is set (SIGTERM /
    SIGINT when run as a program) or ``max_tasks`` are done.  In the steady state a
    completion leases the next task in the same request (``Client.complete_and_lease``);
    the long-poll lease is used when there was nothing to complete or nothing came; it waits
    ``wait_ms``, by default as long as the head lets one wait (its max_wait_ms), and an
    empty one that came back sooner is paced (``poll_pause_s``).
    ``log(text)`` is where it reports (stderr by default): a lease that fails is said once,
    not at each try, until it succeeds or fails otherwise.  ``cache_url``: the node cache
    that the shared data of the tasks (and the pool's class) is read through; its files
    are removed when it returns (worker_shared.py)."""
    from .client import poll_pause_s
    from .errors import MusterError, WorkerNotFound
    from .worker_shared import LevelFiles
    stop = stop or threading.Event()
    busy = busy if busy is not None else {}
    runner = Runner(client, log, cache_url)
    files = LevelFiles(client, cache_url)
    said = None   # the trouble with leasing last reported, while it lasts
    keys = LeaseKeys()
    me = Registration(client, queue, nickname, runner.log)
    me.register()
    current = {"lease": None}
    lock = threading.Lock()

    def keepalive():
        while not stop.wait(me.beat_s):
            files.prune()   # the levels whose node cache file went
            try:
                with lock:
                    lease = current["lease"]
                me.beat("running" if lease is not None else "idle", lease is not None)
                timeout_ms = me.timeout_ms or DEFAULT_TIMEOUT_MS
                if lease is not None and lease["deadline_ms"] - time.time() * 1000 < timeout_ms / 2:
                    lease.extend()
            except MusterError:
                pass

    threading.Thread(target=keepalive, daemon=True).start()
    last, done = 0, 0
    pending = None   # what the last completion leased (complete_and_lease), not yet run
    try:
        while not stop.is_set() and not (max_tasks and done >= max_tasks):
            if pending is not None:
                leases, pending = pending, None
            else:
                try:
                    asked, asked_id = time.monotonic(), me.id
                    # The wait cut once (long_poll_ms): lease() would cut it again.
                    leases = client._lease(queue, asked_id, 1, client.long_poll_ms(wait_ms),
                                           last, keys.current())
                    keys.done()
                except WorkerNotFound as e:
                    try:
                        me.again(asked_id, e)
                    except MusterError as e:   # the head went away meanwhile
                        text = _lease_trouble(e, queue)
                        if text != said:
                            runner.log(text)
                            said = text
                        stop.wait(1.0)
                    continue
                except MusterError as e:
                    if keys.refused(e):
                        continue   # a head older than the keys: lease without
                    text = _lease_trouble(e, queue)
                    if text != said:
                        runner.log(text)
                        said = text
                    stop.wait(1.0)
                    continue
                if said is not None:
                    runner.log("muster.worker: leasing from queue %s again" % queue)
                    said = None
                if not leases and not leases.updates:   # a head that lets none wait
                    stop.wait(max(0.0, poll_pause_s(asked, wait_ms)))
            busy["task"] = True
            if stop.is_set():
                for lease in leases:
                    try:
                        lease.release()
                    except MusterError:
                        pass   # the lease ends at its deadline instead
                break
            runner.apply_updates(leases.updates)
            if leases.updates_last is not None:
                last = max(last, leases.updates_last)
            for lease in leases:
                with lock:
                    current["lease"] = lease
                try:
                    outcome = _run_lease(runner, files, lease)
                except BaseException as e:   # noqa: B902 - the task's failure, whatever it is
                    if isinstance(e, CodeChanged) or (
                            isinstance(e, (KeyboardInterrupt, SystemExit)) and stop.is_set()):
                        raise
                    outcome = ("fail", _error_text(), False)
                with lock:
                    current["lease"] = None
                done += 1
                go_on = not stop.is_set() and not (max_tasks and done >= max_tasks)
                pending = _report(lease, outcome, queue, me.id, last, go_on, runner.log, keys)
            busy["task"] = False
    finally:
        busy["task"] = True
        stop.set()
        for lease in pending or ():   # leased with the last completion as the stop came
            try:
                lease.release()
            except MusterError:
                pass
        try:
            client.bye(me.id)
        except MusterError:
            pass
        files.cleanup()
    return done


def _permanent_exit():
    """The exit status that makes ``muster worker`` fail the task for good: its
    ``--permanent-exit N``, which it passes as MUSTER_PERMANENT_EXIT (1 to 125).  None
    without it (or with a value the worker would not have set): a failure then exits 1,
    and the task is retried as any other, as before the option."""
    text = os.environ.get("MUSTER_PERMANENT_EXIT", "")
    ok = text.isascii() and text.isdigit() and 0 < int(text) < 126   # not "²", not " 3"
    return int(text) if ok else None


# What `python3 -m muster.worker --help` says first: the module's docstring is
# reStructuredText for the reader of the source, which a terminal shows as markup.
HELP = ("Runs the worker classes of muster.Pool: under a node agent (muster node --queue Q -- "
        "/usr/bin/python3 -m muster.worker) once per task, or standalone with --queue, "
        "leasing the queue's tasks itself (docs/python.md, \"Pools\").")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv and os.environ.get("MUSTER_TASK_ID"):
        from .worker_resident import run_one_task
        return run_one_task()   # the common case under an agent: no argparse needed
    import argparse
    ap = argparse.ArgumentParser(prog="python3 -m muster.worker", description=HELP)
    ap.add_argument("--queue", metavar="Q", help="standalone: lease queue Q's tasks")
    ap.add_argument("--url", help="the head's URL (default: MUSTER_URL, else the url file "
                    "of MUSTER_DATA_DIR or ./muster-data)")
    ap.add_argument("--token", help="the head's token (default: MUSTER_TOKEN, else the data "
                    "dir's token file)")
    ap.add_argument("--nickname", metavar="NAME", help="the worker's name on the leaderboard")
    ap.add_argument("--max-tasks", metavar="N", type=int, default=0,
                    help="exit after N tasks (default 0: run until SIGINT or SIGTERM)")
    ap.add_argument("--cache-url", metavar="URL",
                    default=os.environ.get("MUSTER_CACHE_URL") or None, help="read shared data through this node cache (default: MUSTER_CACHE_URL)")
    ap.add_argument("--resident", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--parent", help=argparse.SUPPRESS)
    ap.add_argument("--generation", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from .worker_resident import run_one_task, serve_resident
    if args.resident is not None:
        pid, start = args.parent.split(":", 1)
        serve_resident(args.resident, int(pid), start, args.generation)
        return 0
    if args.queue is None and os.environ.get("MUSTER_TASK_ID"):
        return run_one_task()
    from .client import Client, url_problem
    from .errors import MusterError
    queue = args.queue or os.environ.get("MUSTER_QUEUE")
    if not queue:
        ap.error("--queue is required outside `muster worker`")
    try:
        client = Client(args.url, args.token)
    except ValueError as e:   # a URL that names no head, a data dir without one
        ap.error(str(e))
    if args.url:
        client._url_source = "--url"   # its advice names the option, not Client's url=
    if args.cache_url and url_problem(args.cache_url):
        ap.error("--cache-url (or MUSTER_CACHE_URL) '%s' is not a node agent's URL "
                 "(http://HOST:PORT): %s" % (args.cache_url, url_problem(args.cache_url)))
    stop = threading.Event()
    busy = {"task": False}

    def on_signal(*_):
        stop.set()
        if not busy["task"]:
            raise _Stopped()   # interrupts an idle long-poll; a running task finishes first

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        serve_queue(client, queue, args.nickname, args.max_tasks, stop=stop, busy=busy,
                    cache_url=args.cache_url)
    except _Stopped:
        pass
    except CodeChanged as e:
        _start_again(e, argv)
    except MusterError as e:   # the registration: no head there, a wrong token
        sys.stderr.write("python3 -m muster.worker: could not register a worker with the head "
                         "at %s: %s\n" % (client.url, e))
        return 1
    return 0


class _Stopped(BaseException):
    pass


def _start_again(changed, argv):
    """A standalone worker is one process, which cannot hold two versions of a module:
    when a new session's class would run on code that changed since the worker imported
    it, the worker (having released that task and said goodbye) runs itself again (exec:
    the same pid and arguments, a new worker id), so that the session runs the code as it
    is now.  Sessions still open on the old code go on, instantiated again, on the new
    code: under a node agent each version has a process of its own (_hand_over)."""
    sys.stderr.write("muster.worker: %s changed since this worker imported it: it starts "
                     "again to run session %s on the code as it is now\n"
                     % (changed.path, changed.session))
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "muster.worker"] + list(argv))


if __name__ == "__main__":
    sys.exit(main())
