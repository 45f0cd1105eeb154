"""The shared data a running job requires, as the worker class sees it
(``self.shared_files``): local read-only files by blob name.  Kept apart from
worker_shared.py, which makes the files, so that the per-task process of
``python3 -m muster.worker`` imports no HTTP client to hand them over."""
import collections
import collections.abc


class SharedFile(collections.namedtuple("SharedFile", "scope name level path size checksum")):
    """One level of shared data a job requires, as a local read-only file: ``scope``,
    ``name``, ``level``, ``path``, ``size`` and ``checksum`` (docs/shared-data.md,
    "Workers").  It is a path (``open(f, "rb")``, ``os.fspath(f)``)."""

    __slots__ = ()

    def __fspath__(self):
        return self.path


class SharedFiles(collections.abc.Mapping):
    """The levels the running job requires, by blob name: ``files["weights"]`` is a
    :class:`SharedFile`.  ``files["SCOPE/NAME"]`` names one whatever its scope; a name
    that required blobs of two scopes share is reachable only so (the plain name raises
    KeyError saying why), and iterating yields it as ``SCOPE/NAME``.  Empty when the job
    requires nothing."""

    def __init__(self, entries=()):
        self._files = tuple(SharedFile(e["scope"], e["name"], int(e["level"]), e["path"],
                                       e.get("size"), e.get("checksum")) for e in entries)
        names = collections.Counter(f.name for f in self._files)
        self._shared_names = {n for n, count in names.items() if count > 1}
        self._keys = {(f.name if names[f.name] == 1 else f.scope + "/" + f.name): f
                      for f in self._files}

    def __getitem__(self, key):
        found = self._keys.get(key)
        if found is not None:
            return found
        for f in self._files:
            if key == f.scope + "/" + f.name:
                return f
        if key in self._shared_names:
            raise KeyError("%r: the job requires blobs of that name in several scopes (%s); "
                           "name one as 'SCOPE/NAME'" % (key, ", ".join(
                               f.scope for f in self._files if f.name == key)))
        raise KeyError(key)

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def __repr__(self):
        return "SharedFiles(%r)" % (list(self._files),)
