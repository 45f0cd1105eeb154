"""The shared data a task of a standalone ``python3 -m muster.worker`` requires, made local
files before the task runs (docs/shared-data.md "Workers"; the twin of
src/cli/worker_shared.c, which does the same for ``muster worker``).

Under a node agent the ``muster worker`` runner fetches the levels itself and hands them
over in ``MUSTER_REQUIRES``; a standalone worker leases its tasks and does it here, the
same way:

1. It asks the node cache (``--cache-url``, else ``MUSTER_CACHE_URL``, else the head's URL,
   which answers ``not_found``) with ``GET /v1/node/cache/{scope}/{name}?level=N``; the
   agent fetches the level once for all its workers and answers with its file's path.
2. It hard-links that file into a directory of its own in the cache's ``links/``
   directory (``PID-XXXXXXXX``: the agent removes those of dead workers when it starts),
   so the cache may evict its name for the file without pulling it from under a task.
3. Without a node cache, where the cache keeps no file of the level, or where a link is
   not possible (another machine, another file system), it downloads the level into
   ``$TMPDIR/PID-XXXXXXXX`` (:func:`_download_level`), checked against its checksum.

Each level is kept between tasks (fetched once per worker); it goes when a task requires
a newer level of its blob, when the cache's file it links is gone (``prune``, at each of
the worker's heartbeats), and with everything else when the worker exits (``cleanup``).  A level that cannot
be had raises :class:`LevelUnavailable`, whose message is the task's error:
``required shared data SCOPE/NAME level N: CODE: MESSAGE``, as the C runner's.
"""
import os
import shutil
import tempfile
import threading

from . import errors
from .client import Client, _q

LINK_TRIES = 3   # the cache may evict a level between its answer and our link


class LevelUnavailable(Exception):
    """A level a task requires that could not be made a local file; the message says
    which and why (the task fails with it, and is retried per its queue's settings)."""


def _download_level(client, scope, name, level, path):
    """Downloads level ``level`` of (``scope``, ``name``) through ``client`` (the node
    cache's port, or the head) into the new read-only file ``path``, streamed and checked
    against the level's checksum (its ETag) by ``client.shared.get_to``; returns (size,
    checksum).  Raises MusterError (a ProtocolError when the bytes do not match) or
    OSError, leaving no file behind."""
    info = client.shared.get_to(scope, name, path, level=level)
    os.chmod(path, 0o444)
    return info["size"], info["etag"]


def _own_dir(current, parent):
    """``current`` when that directory is still there, else a new one in ``parent``
    named after this process (``PID-XXXXXXXX``)."""
    if current is not None and os.path.isdir(current):
        return current
    return tempfile.mkdtemp(prefix="%d-" % os.getpid(), dir=parent)


class LevelFiles:
    """The levels a worker holds as local files, keyed by (scope, name, level).

    ``client`` is the worker's client of the head (its token is used for the cache too);
    ``cache_url`` the node cache's URL, or None.  ``acquire`` runs in the thread that runs
    the tasks, ``prune`` in the heartbeat's: a lock guards the held levels, and a prune
    that finds it taken (a fetch, perhaps long) is skipped, not waited for."""

    def __init__(self, client, cache_url=None):
        self._own_source = bool(cache_url)   # closed by cleanup; the head's client is not
        self.source = Client(cache_url, client.token) if cache_url else client
        self.held = {}            # (scope, name, level) -> entry (see _get)
        self.link_dir = None      # ours inside the node cache's links/ directory
        self.download_dir = None  # ours under TMPDIR
        self.in_use = set()       # the keys of the running task's levels (acquire to release)
        self._lock = threading.Lock()

    def acquire(self, requires):
        """The local files of the levels ``requires`` (a lease's list of ``{"scope",
        "name", "level"}``), fetched where not held yet: a list of ``{"scope", "name",
        "level", "path", "size", "checksum"}`` in its order (MUSTER_REQUIRES's form).
        Older levels of the same blobs are dropped.  The levels stay in use, never pruned,
        until ``release``.  Raises LevelUnavailable."""
        with self._lock:
            out = self._acquire(requires)
            self.in_use = {(e["scope"], e["name"], e["level"]) for e in out}
            return out

    def release(self):
        """The running task ended: its levels may be pruned (they stay held)."""
        with self._lock:
            self.in_use = set()

    def _acquire(self, requires):
        out = []
        for req in requires:
            scope, name, level = (req.get("scope"), req.get("name"), req.get("level")) \
                if isinstance(req, dict) else (None, None, None)
            if not (isinstance(scope, str) and isinstance(name, str) and isinstance(level, int)):
                raise LevelUnavailable("required shared data %s/%s level %s: malformed entry in "
                                       "the lease" % (scope or "?", name or "?", level))
            try:
                entry = self._get(scope, name, level)
            except errors.MusterError as e:
                raise LevelUnavailable("required shared data %s/%s level %d: %s: %s"
                                       % (scope, name, level, e.code, e.message)) from None
            except OSError as e:
                raise LevelUnavailable("required shared data %s/%s level %d: internal: cannot "
                                       "store it: %s" % (scope, name, level, e)) from None
            out.append({k: entry[k] for k in ("scope", "name", "level", "path", "size",
                                               "checksum")})
        self._drop_older({(e["scope"], e["name"], e["level"]) for e in out})
        return out

    def prune(self):
        """Drops the linked levels whose file in the node cache is gone (expired, deleted
        at the head, or evicted) and that no running task uses, so that their disk goes
        back to the node.  Nothing while a level is being fetched (perhaps for long)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            for key, entry in list(self.held.items()):
                if (key not in self.in_use and entry["cache_path"]
                        and not os.path.exists(entry["cache_path"])):
                    self._forget(key)
        finally:
            self._lock.release()

    def cleanup(self):
        """Removes every file and directory of this worker's (when it exits)."""
        with self._lock:
            for d in (self.link_dir, self.download_dir):
                if d is not None:
                    shutil.rmtree(d, ignore_errors=True)
            self.held.clear()
            self.link_dir = self.download_dir = None
        if self._own_source:
            self.source.close()

    # ---- one level -----------------------------------------------------------------

    def _get(self, scope, name, level):
        """The held entry of the level, fetched first when not held or when its file is
        gone (someone removed the cache dir, ours in it with it)."""
        key = (scope, name, level)
        entry = self.held.get(key)
        if entry is not None and os.path.exists(entry["path"]):
            return entry
        entry = {"scope": scope, "name": name, "level": level}
        if not self._link(entry):
            self._download(entry)
        self.held[key] = entry
        return entry

    def _link(self, entry):
        """Links the node cache's file of the level into our directory: True; False when
        the URL is no node cache, the cache keeps no file of it, or linking cannot work
        here (then it is downloaded).  Other errors raise MusterError."""
        path = "/v1/node/cache/%s/%s" % (_q(entry["scope"]), _q(entry["name"]))
        for _ in range(LINK_TRIES):
            try:
                reply = self.source.request("GET", path, query={"level": entry["level"]})
            except errors.NotFound as e:
                if e.code == "not_found":   # a head: no node cache there
                    return False
                raise
            cache_path, links = reply.get("path"), reply.get("links_dir")
            if not cache_path or not links or not os.path.isdir(links):
                return False   # uncached, or a cache on another machine
            self.link_dir = _own_dir(self.link_dir, links)
            entry["path"] = os.path.join(self.link_dir, "%s@%s@%d" % (
                entry["scope"], entry["name"], entry["level"]))
            try:
                os.unlink(entry["path"])   # a leftover of a level dropped and needed again
            except FileNotFoundError:
                pass
            try:
                os.link(cache_path, entry["path"])
            except FileNotFoundError:
                continue   # evicted since it answered: ask again
            except OSError:
                return False   # another file system, or links not allowed
            entry.update(size=reply.get("size"), checksum=reply.get("checksum"),
                         cache_path=cache_path)
            return True
        raise errors.Unavailable("the node cache evicted it %d times before it could be "
                                 "linked" % LINK_TRIES)

    def _download(self, entry):
        self.download_dir = _own_dir(self.download_dir, tempfile.gettempdir())
        entry["path"] = os.path.join(self.download_dir, "%s@%s@%d" % (
            entry["scope"], entry["name"], entry["level"]))
        entry["size"], entry["checksum"] = _download_level(
            self.source, entry["scope"], entry["name"], entry["level"], entry["path"])
        entry["cache_path"] = None

    def _drop_older(self, keep):
        """Drops the held levels of the blobs of ``keep`` other than those in it."""
        blobs = {(scope, name) for scope, name, _ in keep}
        for key in list(self.held):
            if key[:2] in blobs and key not in keep:
                self._forget(key)

    def _forget(self, key):
        entry = self.held.pop(key)
        try:
            os.unlink(entry["path"])
        except OSError:
            pass
