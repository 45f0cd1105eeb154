"""The user's code that a long-lived worker process imported, and whether it changed since.

A worker (a node agent's resident Python process, a standalone worker) serves one pool
after another, and Python imports a module once per process: a pool whose class comes
from ``mymodels.py`` would run the code of the first pool's ``mymodels.py`` after the
user edited it, with no error.  :class:`CodeFiles` remembers the identity (inode, size,
modification time) of each module file the process imported from the user's directories
(not the standard library, not site-packages, not muster itself, nor anything imported
before the first pool's code, as sitecustomize); the worker asks it
before it instantiates a new session's class, and :class:`CodeChanged` says that the
session must run in a process started afresh (worker.py: a new resident process, or a
standalone worker that starts itself again).

Scripts loaded as ``__mp_main__`` (a class defined in the owner's script) are not
counted: worker._main_module loads a changed script again in the same process.
"""
import os
import site
import sys
import sysconfig

_NOT_USER = ("__main__", "__mp_main__")


class CodeChanged(Exception):
    """A module file this process imported changed since: a new session's class must be
    loaded by a fresh process.  ``path``: the first such file found."""

    def __init__(self, path, session=None):
        super().__init__("%s changed since this worker imported it" % path)
        self.path = path
        self.session = session


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None   # removed (or renamed away): changed all the same
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _installed_dirs():
    """The directories whose modules are not the user's: the standard library,
    site-packages (the system's, a virtual environment's, the user's own) and the
    muster package (a muster upgrade needs the workers restarted)."""
    paths = sysconfig.get_paths()
    dirs = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    dirs += list(getattr(site, "getsitepackages", lambda: [])())
    dirs.append(getattr(site, "getusersitepackages", lambda: None)())
    dirs.append(os.path.dirname(os.path.abspath(__file__)))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


class CodeFiles:
    """The user's module files this process imported, each with its identity when first
    seen.  ``note()`` after anything that may import (an instantiation, a job);
    ``changed()`` before a new session's class is loaded."""

    def __init__(self):
        self.seen = {}          # real path -> identity when first seen
        self.stale = None       # the changed file found, once one was: it stays changed
        self._count = -1        # len(sys.modules) at the last note: nothing new to look at
        self._installed = _installed_dirs()
        self._before = set(sys.modules)   # Python's start-up and muster's own: not a pool's

    def note(self):
        if len(sys.modules) == self._count:
            return
        self._count = len(sys.modules)
        for name, mod in list(sys.modules.items()):
            path = getattr(mod, "__file__", None)
            if name in _NOT_USER or name in self._before or not isinstance(path, str):
                continue
            path = os.path.realpath(path)
            if path not in self.seen and not path.startswith(self._installed):
                self.seen[path] = _identity(path)

    def changed(self):
        """The first file seen that has changed since (None: none did).  Once one did,
        this process keeps saying so: its modules stay the old ones."""
        if self.stale is None:
            self.stale = next((p for p, ident in self.seen.items() if _identity(p) != ident),
                              None)
        return self.stale
