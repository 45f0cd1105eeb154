"""muster: the Python client of a muster head (standard library only).

    import muster
    c = muster.Client()                       # MUSTER_URL / MUSTER_TOKEN / ./muster-data
    c.put_queue("resize")
    c.put("resize", {"url": "a.jpg"})
    lease = c.lease_one("resize", wait_ms=5000)
    lease.complete({"ok": True})

See docs/python.md.  ``muster.CoordinatedStream`` is one rank of a coordinated iteration
without PyTorch; ``muster.torch`` (PyTorch sampler) is imported on demand.
"""
from .errors import (BadRequest, BatchTooLarge, BodyTooLarge, Conflict, Forbidden, IndexGap,
                     InvalidArgument, InvalidState, IterationNotFound, LeaseLost, MethodNotAllowed,
                     MusterError,
                     NameInvalid, NetworkError, NodeNotFound, NotFound, PayloadTooLarge, ProtocolError,
                     QueueInUse, QueueNotFound, ServerError, SessionNotFound, SharedNotFound, StoreError,
                     TaskNotFound,
                     TooLarge, Unauthorized, Unavailable, UnsupportedMediaType, VersionMismatch,
                     WorkerNotFound, ZeroJobError)

# The rest is imported on first use (PEP 562), so that `python3 -m muster.worker`, which
# a node agent runs once per task, does not pay for http.client and friends.
_LAZY = {
    "client": ("Client", "Lease", "LeaseList", "resolve_token", "resolve_url"),
    "coordinated_stream": ("CoordinatedStream",),
    "distcompute": ("WorkerClient", "init"),
    "pool": ("IndexCollision", "Pool", "TaskError", "WorkerInterface"),
    "shared": ("Shared",),
    "process": ("Process", "find_binary", "is_head_running", "is_node_running", "start_head",
                "start_node", "start_server"),
}
_WHERE = {name: mod for mod, names in _LAZY.items() for name in names}


def __getattr__(name):
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError("module 'muster' has no attribute %r" % name)
    import importlib
    value = getattr(importlib.import_module("." + mod, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__version__ = "0.1.0"

__all__ = [
    "Client", "Shared", "Lease", "LeaseList", "Pool", "WorkerInterface", "TaskError", "IndexCollision", "WorkerClient", "init", "resolve_url", "resolve_token",
    "CoordinatedStream",
    "Process", "start_head", "start_server", "start_node", "is_head_running", "is_node_running",
    "find_binary",
    "MusterError", "BadRequest", "InvalidArgument", "NameInvalid", "Unauthorized", "Forbidden",
    "NotFound", "QueueNotFound", "TaskNotFound", "WorkerNotFound", "NodeNotFound", "SessionNotFound",
    "IterationNotFound", "SharedNotFound", "MethodNotAllowed", "Conflict", "LeaseLost", "InvalidState", "QueueInUse",
    "VersionMismatch", "TooLarge", "BodyTooLarge", "BatchTooLarge", "PayloadTooLarge",
    "UnsupportedMediaType", "ServerError", "StoreError", "Unavailable", "NetworkError",
    "ProtocolError", "ZeroJobError", "IndexGap",
]
