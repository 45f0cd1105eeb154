"""What ``muster.Pool`` checks of its arguments before it sends anything, and the words it
says of them: the worker class (a class the workers can find by name), pickles of
init_data, jobs and updates, distributed_computing's argument order, ``requires``, and
``queue_settings`` given for a queue that exists.  Each mistake raises (or, for
``queue_settings``, logs) naming the argument and what to write instead.  See pool.py."""
import logging
import os
import pickle
import re
import sys

from .client import DEFAULT_URL, url_problem
from .worker import dumps

MAX_REQUIRES = 16   # levels of shared data one task may require (the head's limit)
# What pickling raises for a value it cannot pickle ("Can't pickle local object" is an
# AttributeError before Python 3.14, a PicklingError since; "cannot pickle 'lock'" a TypeError).
_UNPICKLABLE = (pickle.PicklingError, TypeError, AttributeError)
log = logging.getLogger("muster.pool")   # the pool's logger (pool.py)

def _main_script(cls):
    """The path of the script that defines ``cls`` when it is defined in ``__main__`` (the
    workers load it as ``__mp_main__``), else None.  A ``__main__`` without a script file
    (python3 -c, standard input, an interactive session, a notebook) raises ValueError:
    no worker could load the class, and every job would fail after all its attempts."""
    if cls.__module__ != "__main__":
        return None
    main = getattr(sys.modules["__main__"], "__file__", None)
    if main and os.path.isfile(main):
        return os.path.abspath(main)
    raise ValueError("muster.Pool: the worker class %s is defined in __main__ of a program "
                     "that has no script file (python3 -c, standard input, an interactive "
                     "session or a notebook), which workers cannot load: define it in a module "
                     "they can import (installed, or on their PYTHONPATH), or in a script run "
                     "as python3 SCRIPT.py (docs/python.md, \"Making the class importable\")"
                     % cls.__qualname__)


def _class_pickle(cls):
    """The pickle of the worker class ``cls``, by reference (its module and qualified name),
    made before the pool makes a queue or session: TypeError for what is no class (an
    instance, say: every job would fail, after all its attempts, on "object is not
    callable"), or for a class no worker could find by name (one defined inside a
    function)."""
    if not isinstance(cls, type):
        raise TypeError("muster.Pool: worker_class must be a class (a muster.WorkerInterface), "
                        "which each worker instantiates with init_data; got %s: pass the class "
                        "itself, not an instance" % _what(cls))
    try:
        return pickle.dumps(cls, protocol=4)
    except _UNPICKLABLE as e:
        raise TypeError("muster.Pool: the worker class %s cannot be sent to the workers (%s): a "
                        "class travels by its module and name, so define it at the top level "
                        "of a module (or of the script), not inside a function "
                        "(docs/python.md, \"Making the class importable\")"
                        % (cls.__qualname__, e)) from None


def _what(value):
    """A short description of ``value`` for an error: its type, and its repr when short."""
    text = repr(value)
    return "%s %s" % (type(value).__name__, text) if len(text) <= 80 else type(value).__name__


def _pickled(value, what):
    """``dumps(value)``, or TypeError naming ``what`` (e.g. "muster.Pool.map: input 3") when
    it cannot be pickled, instead of pickle's words alone, which name no input."""
    try:
        return dumps(value)
    except _UNPICKLABLE as e:
        raise TypeError("%s cannot be pickled (%s): jobs, init_data and updates travel to the "
                        "workers as pickles, so they hold no lambdas, functions or classes "
                        "defined inside a function, open files, locks or sockets"
                        % (what, e)) from None


def _too_large(err, where, at):
    """The head's refusal ``err`` of a batch whose first job is input ``at`` of the call,
    naming the input (the head names the task's place in the batch, ``tasks[K]``) and what
    to do with data that large; the same class, code and status."""
    m = re.match(r"tasks\[(\d+)\]\.payload: (.*)", err.message, re.S)
    if m is None:
        return err
    text = ("%s: input %d is too large once pickled: %s. Upload large data once as shared "
            "data, and have the jobs require it (requires=; docs/python.md, \"Shared data in "
            "jobs\")" % (where, at + int(m.group(1)), m.group(2)))
    if at:   # batches of SUBMIT_BATCH: those before were stored, and run
        text += ("; inputs 0-%d of the call were submitted before, and run, but the call reads "
                 "none of their results" % (at - 1))
    return type(err)(text, code=err.code, status=err.status)


def _refuse_in_worker_load():
    """Raises RuntimeError when this Pool is being opened by a worker that loads the Pool
    owner's script to find a worker class defined there (muster.worker._main_module, run
    as ``python3 -m muster.worker``; muster._main_load holds the script's path): the
    script runs again in every worker, and its code that opens the pool is not under
    ``if __name__ == "__main__":``.  Without this the nested pool talked to the head, then
    failed to pickle the class, and every job died with that unreadable PicklingError."""
    from . import _main_load
    if _main_load.script:
        raise RuntimeError("muster.Pool: a worker loads %s to find the worker class defined "
                           "there, and that runs the script's code that opens the pool again: "
                           "put that code under `if __name__ == \"__main__\":`, as "
                           "multiprocessing needs too (docs/python.md, \"Making the class "
                           "importable\")" % _main_load.script)


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


# A head's address as distributed_computing's server_address names its server: a host
# (localhost, an IPv4 address, an [IPv6] address or a dotted name), with or without a port.
_ADDRESS_RE = re.compile(r"(?:localhost|[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9A-Fa-f:.]+\]"
                         r"|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]{1,5})?")
_DEFAULT_PORT = int(DEFAULT_URL.rsplit(":", 1)[1])


def _is_address(text):
    """Whether ``text`` names a head: a URL that muster takes, or a bare address."""
    if not isinstance(text, str):
        return False
    if "://" in text:
        return url_problem(text) is None
    return _ADDRESS_RE.fullmatch(text) is not None


def _dc_url(address, port):
    """The URL of distributed_computing's ``server_address`` (and ``server_port``, None
    when not given): a bare address gets http:// and the port, muster's 7370 by default."""
    if "://" in address:
        if port is not None:
            raise ValueError("muster.Pool: the head's address %r is a URL, and a port (%r) "
                             "was given as well: put the port in the URL alone" % (address, port))
        return address
    if re.search(r":[0-9]+$", address):
        if port is not None:
            raise ValueError("muster.Pool: the head's address %r has a port, and a port (%r) "
                             "was given as well: give one of them" % (address, port))
        return "http://" + address
    return "http://%s:%d" % (address, _DEFAULT_PORT if port is None else port)


def _pool_order(url, token, queue):
    """(url, token, queue) of Pool's arguments, read in distributed_computing's order when
    they are in it: ``Pool(worker_class, init_data, password, server_address[, port])``
    puts the password where muster's Pool takes the URL.  That order is read when the third
    argument is no URL nor address and the fourth is an address (a muster token never
    is), its int fifth then being the port.  A third argument that is neither, without
    such a fourth, raises ValueError saying muster's order (not echoing it: it may be a
    password).  Anything else is muster's order, as given (the Client checks the URL)."""
    if not isinstance(url, str) or "://" in url:
        return url, token, queue
    if _is_address(token) and not _is_address(url):
        port = queue if isinstance(queue, int) and not isinstance(queue, bool) else None
        return _dc_url(token, port), url, "pool" if port is not None else queue
    if _is_address(url) or re.fullmatch(r"[A-Za-z0-9.-]+:[0-9]*", url):
        return url, token, queue   # an address without http://: the Client says so
    raise ValueError(
        "muster.Pool(worker_class, init_data, url, token, queue, ...): the third argument is "
        "the head's URL (http://HOST:PORT), and the one given is no URL nor address. "
        "distributed_computing's order, Pool(worker_class, init_data, password, "
        "server_address), is taken when the fourth argument is the head's address (HOST or "
        "HOST:PORT, HOST being localhost, an IP address or a dotted name; or a URL), and "
        "here it is %s. Name them to be sure: muster.Pool(worker_class, init_data, "
        "url=\"http://HOST:7370\", token=PASSWORD)" % (
            "not given" if token is None else "no address"))


_NAME_RE = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]{1,128}")  # not "." or ".."
_DOTS_WHY = " ('.' and '..' are no names: URLs collapse them)"
_REQUIRES_FORMS = ("{\"scope\": S, \"name\": N, \"level\": L}, (scope, name, level), or "
                   "(name, level) for a blob of the pool's own session")


def _requires_entry(entry, at):
    """(scope, name, level) of one entry of a ``requires`` argument (``at`` names it in
    errors), scope None for the pool's session.  Raises TypeError or ValueError."""
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"scope", "name", "level"}, key=str)
        if unknown:
            raise ValueError("%s: unknown key %r; an entry is %s" % (at, unknown[0],
                                                                     _REQUIRES_FORMS))
        if "name" not in entry or "level" not in entry:
            raise ValueError("%s: %r lacks %s; an entry is %s" % (
                at, entry, "a name" if "name" not in entry else "a level", _REQUIRES_FORMS))
        scope, name, level = entry.get("scope"), entry["name"], entry["level"]
    elif isinstance(entry, (tuple, list)) and len(entry) in (2, 3):
        scope, name, level = entry if len(entry) == 3 else (None,) + tuple(entry)
    else:
        raise TypeError("%s: expected %s; got %r" % (at, _REQUIRES_FORMS, entry))
    if scope is not None and not (isinstance(scope, str) and _NAME_RE.fullmatch(scope)):
        raise (ValueError if isinstance(scope, str) else TypeError)(
            "%s: scope %r is not a scope: a session id (s-...) or a global name, 1 to 128 "
            "characters of [A-Za-z0-9._-] other than '.' and '..'%s"
            % (at, scope, _DOTS_WHY if scope in (".", "..") else ""))
    if not (isinstance(name, str) and _NAME_RE.fullmatch(name)):
        raise (ValueError if isinstance(name, str) else TypeError)(
            "%s: name %r is not a blob's name: 1 to 128 characters of [A-Za-z0-9._-] other "
            "than '.' and '..'%s" % (at, name, _DOTS_WHY if name in (".", "..") else ""))
    if not isinstance(level, int) or isinstance(level, bool):
        raise TypeError("%s: level %r of %r is not an int" % (at, level, name))
    if level < 1:
        raise ValueError("%s: level %d of %r: levels count from 1" % (at, level, name))
    return scope, name, level


def _requires(value, where):
    """The shared-data levels of a ``requires`` argument (``where``: whose, in errors), as
    a list of (scope, name, level), scope None for the pool's session: checked before
    anything is sent.  None is none.  Raises TypeError or ValueError naming the argument
    and the entry: not a list, a malformed entry, a blob named twice, more than
    MAX_REQUIRES levels."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise TypeError("%s: requires must be a list of shared-data levels, each %s; got %s"
                        % (where, _REQUIRES_FORMS, type(value).__name__))
    if len(value) in (2, 3) and all(isinstance(x, (str, int)) for x in value):
        raise TypeError("%s: requires is a list of levels, and %r is one level: write "
                        "requires=[%r]" % (where, value, value))
    if len(value) > MAX_REQUIRES:
        raise ValueError("%s: requires names %d levels; a task may require at most %d"
                         % (where, len(value), MAX_REQUIRES))
    out, levels = [], {}
    for i, entry in enumerate(value):
        scope, name, level = _requires_entry(entry, "%s: requires[%d]" % (where, i))
        if (scope, name) in levels:
            raise ValueError("%s: requires[%d]: %r%s is required twice (levels %d and %d); a "
                             "task requires one level of a blob" % (
                                 where, i, name, "" if scope is None else " of scope %r" % scope,
                                 levels[(scope, name)], level))
        levels[(scope, name)] = level
        out.append((scope, name, level))
    return out


def _warn_settings_kept(name, queue, settings):
    """Logs a WARNING when ``settings`` (Pool's ``queue_settings``) differ from those of the
    queue ``name`` that exists already (``queue``, the head's record): they only set up a
    queue the pool creates, and an argument ignored without a word looks applied."""
    differ = ["%s %r (queue_settings: %r)" % (k, queue.get(k), v)
              for k, v in sorted((settings or {}).items()) if queue.get(k) != v]
    if differ:
        log.warning("muster.Pool: queue %r exists already, so queue_settings were not applied "
                    "to it (they set up a queue the pool creates); it keeps its %s. To change "
                    "them: pool.client.put_queue(%r, SETTING=VALUE, ...), which changes them "
                    "for every user of the queue", name, ", ".join(differ), name)
