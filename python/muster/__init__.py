"""muster: the Python client of a muster head (standard library only).

    import muster
    c = muster.Client()                       # MUSTER_URL / MUSTER_TOKEN / ./muster-data
    c.put_queue("resize")
    c.put("resize", {"url": "a.jpg"})
    lease = c.lease_one("resize", wait_ms=5000)
    lease.complete({"ok": True})

See docs/python.md.  ``muster.torch`` (PyTorch sampler) is imported on demand.
"""
from .client import Client, Lease, LeaseList, Shared, resolve_token, resolve_url
from .distcompute import WorkerClient, init
from .errors import (BadRequest, BatchTooLarge, BodyTooLarge, Conflict, Forbidden, InvalidArgument,
                     InvalidState, IterationNotFound, LeaseLost, MethodNotAllowed, MusterError,
                     NameInvalid, NetworkError, NodeNotFound, NotFound, PayloadTooLarge, ProtocolError,
                     QueueInUse, QueueNotFound, ServerError, SessionNotFound, SharedNotFound, StoreError,
                     TaskNotFound,
                     TooLarge, Unauthorized, Unavailable, UnsupportedMediaType, VersionMismatch,
                     WorkerNotFound, ZeroJobError)
from .pool import Pool, TaskError, WorkerInterface
from .process import (Process, find_binary, is_head_running, is_node_running, start_head, start_node,
                      start_server)

__version__ = "0.1.0"

__all__ = [
    "Client", "Shared", "Lease", "LeaseList", "Pool", "WorkerInterface", "TaskError", "WorkerClient", "init", "resolve_url", "resolve_token",
    "Process", "start_head", "start_server", "start_node", "is_head_running", "is_node_running",
    "find_binary",
    "MusterError", "BadRequest", "InvalidArgument", "NameInvalid", "Unauthorized", "Forbidden",
    "NotFound", "QueueNotFound", "TaskNotFound", "WorkerNotFound", "NodeNotFound", "SessionNotFound",
    "IterationNotFound", "SharedNotFound", "MethodNotAllowed", "Conflict", "LeaseLost", "InvalidState", "QueueInUse",
    "VersionMismatch", "TooLarge", "BodyTooLarge", "BatchTooLarge", "PayloadTooLarge",
    "UnsupportedMediaType", "ServerError", "StoreError", "Unavailable", "NetworkError",
    "ProtocolError", "ZeroJobError",
]
