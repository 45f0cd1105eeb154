"""The registration of a standalone ``python3 -m muster.worker`` (worker.serve_queue): its
id, name and heartbeat timeout, when the head last took a sign of life from it, and
registering again, saying why, when the head no longer has the worker.

The head answers ``worker_not_found`` in two words: ``worker N is gone (WHY)`` for a
worker it had, WHY its reason (``its node timed out``), and ``worker N does not exist``
for one it never had.  Where WHY is ``it said bye or timed out`` (an older head, or a
worker gone before the head kept why), the worker tells the two apart itself, as
``muster worker`` does (src/cli/worker_join.c): one whose last heartbeat reached the
head within its timeout cannot have timed out, so it was removed (a goodbye sent for
it, or its node left or timed out)."""
import os
import threading
import time

from .errors import WorkerNotFound

DEFAULT_TIMEOUT_MS = 60000   # the head's default, for a head whose reply does not say


def forgotten_why(worker_id, said, silent_s, timeout_s):
    """Why the head has no worker ``worker_id``, from its worker_not_found message
    ``said``, ``silent_s`` seconds after the last request the head took as the worker's
    sign of life was sent, the head holding it to a ``timeout_s`` timeout (None: not
    known, an older head's registration did not say)."""
    gone = " is gone (" in said
    told = said.split(" is gone (", 1)[1].split(")", 1)[0] if gone else ""
    timed_out = told.startswith("it timed out")   # said with this worker's own figures
    if told and told != "it said bye or timed out" and not timed_out:   # the head's reason
        return "the head holds worker %d as gone: %s" % (worker_id, told)
    if not gone and " does not exist" in said:
        return ("the head does not know worker %d (it lost its data, was restored from an "
                "older backup, or is another head at this URL)" % worker_id)
    if not gone:
        return "the head no longer has worker %d (%s)" % (worker_id, said)
    if timeout_s is None:
        return "the head holds worker %d as gone (timed out or removed)" % worker_id
    if silent_s < timeout_s and not timed_out:
        return ("worker %d was removed on the head, not timed out (its last heartbeat got "
                "there %.1f s ago, within its %.1f s timeout): a goodbye was sent for it, or "
                "its node left or timed out" % (worker_id, silent_s, timeout_s))
    if silent_s < timeout_s:   # the head says so, though the last beat left since
        return "the head timed out worker %d (past its %.1f s timeout)" % (worker_id, timeout_s)
    return ("the head timed out worker %d (no heartbeat got there for %.1f s, past its %.1f s "
            "timeout)" % (worker_id, silent_s, timeout_s))


class Registration:
    """A worker registered on ``queue`` through ``client``; ``log(text)`` says what
    happens to it.  Shared by the worker's loop and its heartbeat thread."""

    def __init__(self, client, queue, nickname, log):
        self.client = client
        self.queue = queue
        self.nickname = nickname or "python"
        self.log = log
        self.lock = threading.Lock()   # one registration at a time; guards what follows
        self.id = None
        self.name = None
        self.timeout_ms = None   # the head's for this id; None when its reply did not say
        self.heard = None        # time.monotonic() at which the last sign of life was sent

    @property
    def beat_s(self):
        """The heartbeat interval: a third of the timeout."""
        return max(0.05, (self.timeout_ms or DEFAULT_TIMEOUT_MS) / 3000.0)

    def register(self):
        """Registers (a MusterError when the head refuses or cannot be reached)."""
        sent = time.monotonic()
        w = self.client.register_worker(nickname=self.nickname, queues=[self.queue],
                                        node=os.environ.get("MUSTER_NODE"))
        self.id, self.name = w["id"], w.get("name")
        self.timeout_ms = w.get("timeout_ms") or None
        self.heard = sent

    def beat(self, progress, running):
        """One heartbeat with ``progress``; a worker the head no longer has is registered
        again (:meth:`again`; ``running``: a task runs now).  Raises MusterError."""
        worker_id, sent = self.id, time.monotonic()
        try:
            self.client.heartbeat(worker_id, progress=progress)
        except WorkerNotFound as e:
            self.again(worker_id, e, running)
            return
        with self.lock:
            if self.id == worker_id:   # not registered anew meanwhile
                self.heard = sent

    def again(self, old_id, err, running=False):
        """Registers again after the head answered ``err`` (WorkerNotFound) for ``old_id``,
        and says why it had no such worker, as whom the worker is registered now and, with
        a task ``running``, that the task lost its lease.  Only the first caller for an old
        id registers; the others find the new one.  Raises the registration's MusterError."""
        with self.lock:
            if self.id != old_id:
                return
            timeout_s = self.timeout_ms / 1000.0 if self.timeout_ms else None
            why = forgotten_why(old_id, err.message or "", time.monotonic() - self.heard,
                                timeout_s)
            self.register()
            text = "muster.worker: %s; registered again as %s (id %d)" % (why, self.name,
                                                                          self.id)
            if running:
                text += "; the task it was running lost its lease (its result will not be stored)"
            self.log(text)


class LeaseKeys:
    """The key of a standalone worker's next lease request (docs/api.md, "Retrying a
    lease"): the same until the head answers one of its lease requests, plain or combined
    with a completion, so a request sent again after an error (the head restarted between
    its commit and its reply, a connection broke) gets the task the lost reply carried,
    with its token, instead of leaving it leased to nobody who knows until its deadline.
    A head older than the keys refuses them: the worker leases without from then on."""

    def __init__(self):
        self.prefix = os.urandom(8).hex()
        self.answered = 0
        self.unsupported = False

    def current(self):
        """The key to send (None once the head refused keys)."""
        return None if self.unsupported else "%s-%d" % (self.prefix, self.answered)

    def done(self):
        """A lease request was answered: the next one is a new request."""
        self.answered += 1

    def refused(self, err):
        """True (and no key sent from then on) when ``err`` is the refusal of the key by a
        head that does not know it: "request: unknown field ..." (or "lease.request")."""
        from .errors import InvalidArgument
        said = getattr(err, "message", "") or ""
        if (self.unsupported or not isinstance(err, InvalidArgument) or
                said.split(":", 1)[0] not in ("request", "lease.request")):
            return False
        self.unsupported = True
        return True
