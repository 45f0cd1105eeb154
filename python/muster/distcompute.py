"""The DistCompute client's interface (``distcompute_client``) on muster's own API.

A DistCompute tracker has stages ``a`` to ``e``; in muster a stage is a queue,
and a pipeline is a chain of queues linked by ``next``.  The pipeline is named
by its first queue: stage ``a`` is that queue, stage ``b`` its ``next``, stage
``c`` the ``next`` of that, and so on::

    client = muster.init("http://head:7370", stage="b", pipeline="scrape",
                         nickname="Cluster 2 on AWS")

``pipeline`` defaults to $MUSTER_PIPELINE.  A ``stage`` that is not a single
letter names the queue directly (``stage="download"``).  A completed job's data
becomes a task of the next stage; ``flag_invalid_data`` counts towards the
queue's ``max_flags``, after which the previous stage's job is re-opened.
"""
import os
import sys
import threading

from . import errors
from .client import Client

STAGES = "abcde"


def resolve_stage(client, stage, pipeline=None):
    """The queue name of ``stage`` ("a".."e" along ``pipeline``'s next links, or a queue name)."""
    stage = str(stage)
    if len(stage) == 1 and stage.lower() in STAGES:
        pipeline = pipeline or os.environ.get("MUSTER_PIPELINE")
        if not pipeline:
            raise errors.InvalidArgument(
                "stage %r: name the pipeline (its first queue) with pipeline= or $MUSTER_PIPELINE" % stage)
        queue = pipeline
        for step in range(STAGES.index(stage.lower())):
            nxt = client.queue(queue).get("next")
            if not nxt:
                raise errors.InvalidArgument(
                    "stage %r: pipeline %r has only %d stage(s)" % (stage, pipeline, step + 1))
            queue = nxt
        client.queue(queue)  # raises QueueNotFound for a pipeline that does not exist
        return queue
    client.queue(stage)
    return stage


class WorkerClient:
    """A worker at one stage; see :func:`init`."""

    def __init__(self, url=None, stage="a", nickname="anonymous", verbose=True, pipeline=None,
                 token=None, project=None, keepalive=True, client=None):
        self.client = client or Client(url, token)
        self.verbose = verbose
        self.nickname = nickname
        self.stage = stage
        self.stage_name = resolve_stage(self.client, stage, pipeline)
        self.project = project or pipeline or os.environ.get("MUSTER_PIPELINE") or self.stage_name
        reg = self.client.register_worker(nickname=nickname, queues=[self.stage_name],
                                          labels={"stage": str(stage), "project": self.project})
        self.worker_id = reg["id"]
        self.display_name = reg["name"]
        self.timeout_ms = reg.get("timeout_ms") or 60000
        self.job = None
        self.job_id = None
        self._lease = None
        self._lock = threading.Lock()
        self._alive = True
        self._stop = threading.Event()
        self._thread = None
        if keepalive:
            self._thread = threading.Thread(target=self._keepalive, name="muster-keepalive", daemon=True)
            self._thread.start()
        self._say("connected as %s (worker %d) at stage %s, queue %r" % (
            self.display_name, self.worker_id, stage, self.stage_name))

    # The project name under DistCompute's other spelling.
    @property
    def project_name(self):
        return self.project

    def _say(self, text):
        if self.verbose:
            print("[muster %s] %s" % (self.display_name if hasattr(self, "display_name") else "-", text),
                  file=sys.stderr, flush=True)

    def _keepalive(self):
        # Heart-beats the worker and extends the current lease, a third of the
        # worker timeout apart, so a long job neither times out nor loses its lease.
        period = max(0.05, self.timeout_ms / 3000.0)
        while not self._stop.wait(period):
            try:
                self.client.heartbeat(self.worker_id)
                with self._lock:
                    lease = self._lease
                if lease is not None:
                    self.client.extend(lease["task"], lease["token"])
            except errors.WorkerNotFound:
                self._alive = False
                return
            except errors.MusterError:
                continue

    def job_count(self):
        """Open (queued) jobs at this client's stage."""
        return self.client.queue(self.stage_name)["counts"]["queued"]

    def new_job(self, wait_ms=0):
        """Leases the next job into ``job`` / ``job_id``; raises ZeroJobError when none is open
        (after waiting up to ``wait_ms``).  An unfinished previous job is released first."""
        with self._lock:
            previous, self._lease = self._lease, None
        if previous is not None:
            try:
                previous.release()
            except errors.LeaseLost:
                pass
        try:
            lease = self.client.lease_one(self.stage_name, worker=self.worker_id, wait_ms=wait_ms)
        except errors.WorkerNotFound:
            self._alive = False
            raise
        if lease is None:
            self.job = None
            self.job_id = None
            raise errors.ZeroJobError("no open job at stage %s (queue %r)" % (self.stage, self.stage_name))
        with self._lock:
            self._lease = lease
        self.job = lease["payload"]
        self.job_id = lease["task"]
        self._say("job %d" % self.job_id)

    def _current(self, what):
        with self._lock:
            lease = self._lease
        if lease is None:
            raise errors.InvalidState("%s: no current job (call new_job first)" % what,
                                      code="invalid_state", status=0)
        return lease

    def _finish(self):
        with self._lock:
            self._lease = None
        self.job = None
        self.job_id = None

    def complete_job(self, data=None):
        """Marks the job done; ``data`` becomes the next stage's job."""
        lease = self._current("complete_job")
        try:
            reply = lease.complete(data)
        finally:
            self._finish()
        self._say("job %d done%s" % (reply["task"], " -> job %d of the next stage" % reply["next_task"]
                                     if reply.get("next_task") else ""))
        return reply

    def flag_invalid_data(self, reason="invalid data"):
        """Reports the job's input as invalid and drops the job."""
        lease = self._current("flag_invalid_data")
        try:
            reply = lease.flag(reason)
        finally:
            self._finish()
        self._say("job %d flagged invalid" % reply["task"])
        return reply

    def fail_job(self, error=None, permanent=False):
        """Fails the job (retried after a backoff unless ``permanent``)."""
        lease = self._current("fail_job")
        try:
            return lease.fail(error, permanent)
        finally:
            self._finish()

    def log(self, progress):
        """Sends a progress string (shown on the dashboard) and extends the job's lease."""
        try:
            self.client.heartbeat(self.worker_id, str(progress))
        except errors.WorkerNotFound:
            self._alive = False
            raise
        with self._lock:
            lease = self._lease
        if lease is not None:
            lease.extend()

    def is_alive(self):
        """True while the worker is registered and has not timed out."""
        if not self._alive:
            return False
        try:
            self._alive = self.client.worker(self.worker_id)["state"] == "active"
        except errors.WorkerNotFound:
            self._alive = False
        return self._alive

    def bye(self):
        """Leaves: the current job, if any, goes back to the queue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.client.bye(self.worker_id)
        except errors.WorkerNotFound:
            pass
        self._alive = False
        self._finish()
        self._say("bye")
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._alive:
            self.bye()


def init(url=None, stage="a", nickname="anonymous", verbose=True, pipeline=None, token=None, **kw):
    """DistCompute's ``init``: a :class:`WorkerClient` at ``stage`` of ``pipeline``."""
    return WorkerClient(url, stage=stage, nickname=nickname, verbose=verbose, pipeline=pipeline,
                        token=token, **kw)
