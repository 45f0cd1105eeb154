"""The DistCompute client's interface (``distcompute_client``) on muster's own API.

A DistCompute tracker has stages ``a`` to ``e``; in muster a stage is a queue,
and a pipeline is a chain of queues linked by ``next``.  The pipeline is named
by its first queue: stage ``a`` is that queue, stage ``b`` its ``next``, stage
``c`` the ``next`` of that, and so on::

    client = muster.init("http://head:7370", stage="b", pipeline="scrape",
                         nickname="Cluster 2 on AWS")

``pipeline`` defaults to $MUSTER_PIPELINE; the name a head exposes a pipeline
under to DistCompute clients (``--distcompute NAME=...``) names it too.  A ``stage`` that is not a single
letter names the queue directly (``stage="download"``).  A completed job's data
becomes a task of the next stage; ``flag_invalid_data`` counts towards the
queue's ``max_flags``, after which the previous stage's job is re-opened.

A job is one task per stage, each the ``parent`` of the next.  ``job_id`` is
the job's number, 1, 2, 3... per pipeline, the same at every stage, as
DistCompute's tracker keeps it (to name a job's files).  The head keeps it
(``POST /v1/distcompute/jobs``, one request per job) and gives the tracker
routes' workers of the same pipeline the same numbers.  ``task_id`` is the
task of the stage at hand.
"""
import os
import sys
import threading
import time

from . import errors
from .client import Client

STAGES = "abcde"

# A call the head does not answer (it is down or restarting) is sent again, as
# distcompute_client sends its requests again; the pause doubles from the first to
# the last, the tracker client's 15 s.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 15.0
# How long bye() waits for a head that does not answer: a worker that leaves must not
# hang its program's exit; the head times it out and requeues its job without the bye.
BYE_WAIT_S = 30.0


COMPAT_PREFIX = "/compat/distcompute/"


def _exposed(client):
    """The pipelines the head exposes to DistCompute clients (``GET /v1/distcompute``):
    none from a head that has none, or is too old to say, or cannot be asked."""
    try:
        return client.request("GET", "/v1/distcompute").get("pipelines") or []
    except errors.MusterError:
        return []


def _pipelines_hint(client):
    """This head's pipelines, for a message: the first queues of its chains of queues
    and the names it exposes to DistCompute clients; "" when it has none or cannot say."""
    try:
        queues = client.queues()
    except errors.MusterError:
        queues = []
    later = {q.get("next") for q in queues}
    firsts = [q["name"] for q in queues if q.get("next") and q["name"] not in later]
    exposed = ["%s (its first queue %s)" % (p["name"], p["stages"][0]["queue"])
               for p in _exposed(client) if p.get("stages")]
    parts = []
    if firsts:
        parts.append("this head's pipelines: " + ", ".join(firsts[:10]))
    if exposed:
        parts.append("exposed to DistCompute clients as " + ", ".join(exposed[:10]))
    return " (%s)" % "; ".join(parts) if parts else ""


def resolve_pipeline(client, pipeline):
    """``(first queue, project)`` of ``pipeline``: a queue's name (the pipeline it starts;
    project None), or the name the head exposes it under to DistCompute clients
    (``muster head --distcompute NAME=Q1,...``: its first queue, and its project), so
    that ``muster.init`` and unchanged DistCompute workers name a pipeline alike.
    Raises QueueNotFound, saying which pipelines the head has, for neither."""
    try:
        client.queue(pipeline)
        return pipeline, None
    except errors.QueueNotFound as e:
        missing = e
    for exposed in _exposed(client):
        if exposed.get("name") == pipeline and exposed.get("stages"):
            return exposed["stages"][0]["queue"], exposed.get("project") or pipeline
    raise errors.QueueNotFound(
        "pipeline %r: no queue has that name, and the head exposes no DistCompute pipeline "
        "by it; a pipeline is named by its first queue%s" % (pipeline, _pipelines_hint(client)),
        code=missing.code, status=missing.status)


def _compat_url_refusal(url):
    """Why ``muster.init`` cannot talk to ``url``, a head's DistCompute compatibility
    address (which the unchanged distcompute_client takes), or None for another URL."""
    at = url.find(COMPAT_PREFIX)
    if at < 0:
        return None
    name = url[at + len(COMPAT_PREFIX):].strip("/").split("/")[0]
    return ("url %r is the DistCompute compatibility address of pipeline %r, which the "
            "unchanged distcompute_client talks to; muster.init talks to the head's own API "
            "with its token: muster.init(%r, stage=..., pipeline=%r)" % (
                url, name, url[:at], name))


def _stage_list(client, first):
    """"a: Q1, b: Q2, ..." of the pipeline whose first queue is ``first``."""
    stages = [first]
    while len(stages) < len(STAGES):
        nxt = client.queue(stages[-1]).get("next")
        if not nxt:
            break
        stages.append(nxt)
    return ", ".join("%s: %s" % (STAGES[i], q) for i, q in enumerate(stages))


def _no_pipeline(client, stage):
    """The InvalidArgument of a stage letter given without a pipeline; a head that cannot
    be asked (not a muster head, a wrong token) raises that instead, the cause."""
    client.queues()
    return errors.InvalidArgument(
        "stage %r: name the pipeline (its first queue) with pipeline= or $MUSTER_PIPELINE%s"
        % (stage, _pipelines_hint(client)))


def resolve_stage(client, stage, pipeline=None, named=None):
    """The queue name of ``stage`` ("a".."e" along ``pipeline``'s next links, or a queue name).
    ``named`` is the pipeline as the caller named it (for messages; ``pipeline`` by default)."""
    stage = str(stage)
    pipeline = pipeline or os.environ.get("MUSTER_PIPELINE")
    named = named or pipeline
    if not stage:
        raise errors.InvalidArgument("stage '': give a stage letter, %s to %s, or a queue's name"
                                     % (STAGES[0], STAGES[-1]))
    if len(stage) == 1 and stage.lower() in STAGES:
        if not pipeline:
            raise _no_pipeline(client, stage)
        queue = pipeline
        for step in range(STAGES.index(stage.lower())):
            nxt = client.queue(queue).get("next")
            if not nxt:
                raise errors.InvalidArgument(
                    "stage %r: pipeline %r has only %d stage(s) (%s)"
                    % (stage, named, step + 1, _stage_list(client, pipeline)))
            queue = nxt
        client.queue(queue)  # raises QueueNotFound for a pipeline that does not exist
        return queue
    try:
        client.queue(stage)
    except errors.QueueNotFound as e:
        if len(stage) == 1:
            # "f": a stage letter past DistCompute's five, more likely than a queue named so.
            raise errors.QueueNotFound(
                "stage %r: the stages are %s (along the pipeline's next links), or a queue's "
                "name, and no queue is named %r" % (stage, STAGES[0] + " to " + STAGES[-1],
                                                    stage),
                code=e.code, status=e.status) from None
        if not pipeline:
            raise
        raise errors.QueueNotFound(
            "stage %r: no queue has that name; pipeline %r has the stages %s (give a letter, "
            "or a queue's name as it is written)" % (stage, named, _stage_list(client, pipeline)),
            code=e.code, status=e.status) from None
    if pipeline:
        _check_stage_of(client, stage, pipeline)
    return stage


def _check_stage_of(client, queue, pipeline):
    """Raises InvalidArgument unless ``queue`` is one of ``pipeline``'s stages: job numbers
    are counted per pipeline, and the head refuses a task outside it."""
    stages = [pipeline]
    while len(stages) < len(STAGES) and stages[-1] != queue:
        nxt = client.queue(stages[-1]).get("next")
        if not nxt:
            break
        stages.append(nxt)
    if stages[-1] != queue:
        raise errors.InvalidArgument(
            "stage %r is not a stage of pipeline %r (its stages: %s); give the pipeline's "
            "first queue as pipeline= (or $MUSTER_PIPELINE), or none" % (
                queue, pipeline, ", ".join(stages)))


class WorkerClient:
    """A worker at one stage; see :func:`init`."""

    def __init__(self, url=None, stage="a", nickname="anonymous", verbose=True, pipeline=None,
                 token=None, project=None, keepalive=True, client=None, retry=True):
        self.client = client or Client(url, token)
        refusal = _compat_url_refusal(self.client.url)
        if refusal:
            raise ValueError(refusal)
        self.verbose = verbose
        self.nickname = nickname
        self.stage = stage
        pipeline = pipeline or os.environ.get("MUSTER_PIPELINE")
        first, exposed_project = resolve_pipeline(self.client, pipeline) if pipeline else (None, None)
        self.stage_name = resolve_stage(self.client, stage, first, pipeline)
        # The pipeline whose jobs are numbered (_job_number), named by its first
        # queue; without one, the stage's queue counts its own jobs.
        self._pipeline = first or self.stage_name
        self.project = project or exposed_project or pipeline or self.stage_name
        reg = self.client.register_worker(nickname=nickname, queues=[self.stage_name],
                                          labels={"stage": str(stage), "project": self.project})
        self.worker_id = reg["id"]
        self.display_name = reg["name"]
        self.timeout_ms = reg.get("timeout_ms") or 60000
        self.job = None
        self.job_id = None
        self.task_id = None
        self.retry = retry
        self._lease = None
        self._ended = None      # (what, job_id) of the job that ended last, for messages
        self._requests = 0      # lease request keys: dc-1, dc-2, ...
        self._lock = threading.Lock()
        self._alive = True
        self._stop = threading.Event()
        self._thread = None
        if keepalive:
            self._thread = threading.Thread(target=self._keepalive, name="muster-keepalive", daemon=True)
            self._thread.start()
        self._say("connected as %s (worker %d) at stage %s, queue %r; watch it at %s/#/worker/%d"
                  % (self.display_name, self.worker_id, stage, self.stage_name, self.client.url,
                     self.worker_id))

    # The project name under DistCompute's other spelling.
    @property
    def project_name(self):
        return self.project

    def _say(self, text):
        if self.verbose:
            print("[muster %s] %s" % (self.display_name if hasattr(self, "display_name") else "-", text),
                  file=sys.stderr, flush=True)

    def _call(self, what, fn, *args, until=None, **kw):
        """``fn(*args, **kw)``, sent again while the head does not answer (NetworkError,
        Unavailable: it is down or restarting), as distcompute_client sends its requests
        again, unless ``retry`` is off, or until ``until`` (a time.monotonic() deadline:
        then the last error is raised).  Every call sent here may be sent twice: the head
        answers a repeated completion, fail, flag, release or keyed lease as the first."""
        pause = RETRY_FIRST_S
        while True:
            try:
                return fn(*args, **kw)
            except (errors.NetworkError, errors.Unavailable) as e:
                if not self.retry or (until is not None and time.monotonic() + pause > until):
                    raise
                self._say("%s: %s; trying again in %.2g s" % (what, e, pause))
                time.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)

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
        """Open jobs at this client's stage: the queued tasks a lease would take now.

        Jobs waiting out a delay or a retry's backoff are queued but not open yet; with
        them counted, ``new_job`` raised ZeroJobError right after a positive count.  The
        head counts them on request only (``?ready=true``), reading at most 1000 queued
        tasks: exact up to 1000 queued; beyond, those not read count as open, and a count
        whose 1000 first tasks all wait is 0 (docs/api.md).  So a positive count means a
        job now, unless other workers take the jobs first (ZeroJobError, as with the
        tracker).
        """
        counts = self._call("job_count", self.client.queue, self.stage_name, ready=True)["counts"]
        if "ready" not in counts:
            raise errors.ProtocolError(
                "job_count: the head at %s does not count ready tasks (counts.ready); "
                "upgrade it" % self.client.url)
        return counts["ready"]

    def _job_number(self, lease):
        """The job's number in the pipeline, from the head: one request, whatever the stage
        (the head finds the number up the job's chain of tasks and keeps it)."""
        return self._call("new_job", self.client.request, "POST", "/v1/distcompute/jobs",
                          {"pipeline": self._pipeline, "task": lease["task"]})["number"]

    def new_job(self, wait_ms=0):
        """Leases the next job into ``job`` / ``job_id`` / ``task_id``; raises ZeroJobError
        when none is open (after waiting up to ``wait_ms``).  An unfinished previous job is
        released first.  It does not wait by default, as the tracker's did not: a worker
        that would rather not poll ``job_count`` gives ``wait_ms``."""
        with self._lock:
            previous, self._lease = self._lease, None
        if previous is not None:
            try:
                self._call("new_job", previous.release)
            except errors.LeaseLost:
                pass
        self._requests += 1
        try:
            # Keyed, so that a lease whose reply was lost is given again when sent again.
            got = self._call("new_job", self.client.lease, self.stage_name, worker=self.worker_id,
                             max=1, wait_ms=wait_ms, request="dc-%d" % self._requests)
        except errors.WorkerNotFound:
            self._alive = False
            raise
        self.job = self.job_id = self.task_id = self._ended = None
        lease = got[0] if got else None
        if lease is None:
            raise errors.ZeroJobError("no open job at stage %s (queue %r)" % (self.stage, self.stage_name))
        with self._lock:
            self._lease = lease   # held (and released by the next new_job) should the number fail
        self.job_id = self._job_number(lease)
        self.job = lease["payload"]
        self.task_id = lease["task"]
        self._say("job %d (task %d)" % (self.job_id, self.task_id))

    def _current(self, what):
        with self._lock:
            lease = self._lease
        if lease is None:
            raise errors.InvalidState("%s: %s" % (what, self._why_no_job()),
                                      code="invalid_state", status=0)
        return lease

    def _why_no_job(self):
        """Why this worker holds no job now, for a call that needs one."""
        if self._ended is None:
            return "no current job (call new_job first)"
        return "no current job: job %s %s (call new_job for the next)" % self._ended[::-1]

    def _finish(self, ended=None):
        """Forgets the current job; ``ended`` says how it ended ("was completed", ...)."""
        with self._lock:
            self._lease = None
        self._ended = (ended, self.job_id) if ended and self.job_id is not None else None
        self.job = None
        self.job_id = None
        self.task_id = None

    def complete_job(self, data=None):
        """Marks the job done; ``data`` becomes the next stage's job."""
        lease, job_id = self._current("complete_job"), self.job_id
        try:
            reply = self._call("complete_job", lease.complete, data)
        finally:
            self._finish("was completed")
        self._say("job %d done (task %d)%s" % (job_id, reply["task"], " -> task %d of the next stage"
                                               % reply["next_task"] if reply.get("next_task") else ""))
        return reply

    def flag_invalid_data(self, reason="invalid data"):
        """Reports the job's input as invalid and drops the job."""
        lease, job_id = self._current("flag_invalid_data"), self.job_id
        try:
            reply = self._call("flag_invalid_data", lease.flag, reason)
        finally:
            self._finish("was flagged invalid")
        self._say("job %d flagged invalid (task %d)" % (job_id, reply["task"]))
        return reply

    def fail_job(self, error=None, permanent=False):
        """Fails the job (retried after a backoff unless ``permanent``)."""
        lease = self._current("fail_job")
        try:
            return self._call("fail_job", lease.fail, error, permanent)
        finally:
            self._finish("failed")

    def log(self, progress):
        """Sends a progress string (shown on the dashboard) and extends the job's lease."""
        try:
            self._call("log", self.client.heartbeat, self.worker_id, str(progress))
        except errors.WorkerNotFound:
            self._alive = False
            raise
        with self._lock:
            lease = self._lease
        if lease is not None:
            self._call("log", lease.extend)

    def is_alive(self):
        """True while the worker is registered and has not timed out."""
        if not self._alive:
            return False
        try:
            self._alive = self._call("is_alive", self.client.worker,
                                     self.worker_id)["state"] == "active"
        except errors.WorkerNotFound:
            self._alive = False
        return self._alive

    def bye(self):
        """Leaves: the current job, if any, goes back to the queue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._call("bye", self.client.bye, self.worker_id,
                       until=time.monotonic() + BYE_WAIT_S)
        except errors.WorkerNotFound:
            pass
        except (errors.NetworkError, errors.Unavailable) as e:
            self._say("bye: the head did not answer (%s); it times this worker out and gives "
                      "its job to another" % e)
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
    """DistCompute's ``init``: a :class:`WorkerClient` at ``stage`` of ``pipeline``.

    Other keywords: ``project``, ``keepalive`` (True: a thread heart-beats the worker and
    extends its job) and ``retry`` (True: once registered, a call the head does not answer,
    as while it restarts, is sent again until it does, as distcompute_client does; False
    raises NetworkError or Unavailable at once).  ``init`` itself raises at once when no
    head answers, so that a wrong URL is told and not waited on."""
    return WorkerClient(url, stage=stage, nickname=nickname, verbose=verbose, pipeline=pipeline,
                        token=token, **kw)
