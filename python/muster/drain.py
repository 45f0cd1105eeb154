"""``Client.wait_drained``: block until a queue, and with ``pipeline=True`` every queue
after it along ``next``, has no task queued or leased, as `muster queue wait` does
(docs/cli.md, "queue"; docs/python.md).

Each look is one ``GET /v1/queues``: the head answers it from one state, and a
completion creates its next-stage task in the transaction that marks it done, so a
chain seen empty in one answer is empty (looking at the stages one request each could
miss a task passed on between two reads).  "Since the start" is measured against the
first look.
"""
import time

from . import errors

POLL_S = 0.5         # between two looks, as `muster queue wait`
RETRY_FIRST_S = 0.2  # first pause before asking a head that does not answer again
RETRY_MAX_S = 2.0    # the pause doubles up to this
_HEAD_AWAY = (errors.NetworkError, errors.Unavailable)


class Drained(dict):
    """What :meth:`Client.wait_drained` returns: ``{name: counts}`` of the queues waited
    for, in chain order (``counts`` as ``GET /v1/queues`` gives them), at the look that
    found them drained.  ``failed`` maps each of those queues in which tasks ended
    failed or dead since the call began to how many (empty when none did), which
    `muster queue wait` exits 1 for: they are drained, but not all done."""

    def __init__(self, counts, failed):
        super().__init__(counts)
        self.failed = failed


def _bad(queue):
    counts = queue["counts"]
    return counts.get("failed", 0) + counts.get("dead", 0)


def _chain(queues, name, pipeline):
    """The queues waited for, in order: ``name``, then with ``pipeline`` each ``next``
    in turn, up to one met already (a loop) or missing; QueueNotFound without ``name``."""
    by_name = {q["name"]: q for q in queues}
    if name not in by_name:
        raise errors.QueueNotFound("queue '%s' does not exist (see Client.queues())" % name,
                                   status=404)
    chain = [by_name[name]]
    while pipeline and chain[-1].get("next") in by_name:
        following = by_name[chain[-1]["next"]]
        if any(q is following for q in chain):
            break
        chain.append(following)
    return chain


def _left(chain):
    """Tasks queued and leased over ``chain``, and the words for them."""
    left = sum(q["counts"]["queued"] + q["counts"]["leased"] for q in chain)
    words = "; ".join("%s: %d queued, %d leased" % (q["name"], q["counts"]["queued"],
                                                    q["counts"]["leased"])
                      for q in chain if q["counts"]["queued"] + q["counts"]["leased"])
    return left, words


class _Waiter:
    """One call of wait_drained: its deadline, the first look's counts, the last look."""

    def __init__(self, client, queue, pipeline, timeout):
        self.client, self.queue, self.pipeline, self.timeout = client, queue, pipeline, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.start = None  # {name: failed + dead} of every queue at the first look
        self.chain = None  # the last look's queues waited for

    def left_s(self):
        return None if self.deadline is None else self.deadline - time.monotonic()

    def look(self):
        """One look; the first one's failures raise, later ones' raise unless the head
        is away (NetworkError, Unavailable), which returns False."""
        try:
            queues = self.client.queues()
        except _HEAD_AWAY:
            if self.start is None:
                raise
            return False
        if self.start is None:
            self.start = {q["name"]: _bad(q) for q in queues}
        self.chain = _chain(queues, self.queue, self.pipeline)
        return True

    def result(self):
        failed = {q["name"]: _bad(q) - self.start.get(q["name"], 0) for q in self.chain}
        return Drained({q["name"]: q["counts"] for q in self.chain},
                       {name: n for name, n in failed.items() if n > 0})

    def timed_out(self):
        left, words = _left(self.chain)
        what = "queue '%s'%s" % (self.queue, " and the queues after it" if len(self.chain) > 1
                                 else "")
        return TimeoutError("%s did not drain in %g s: %d left (%s)"
                            % (what, self.timeout, left, words))

    def pause(self, seconds):
        left = self.left_s()
        time.sleep(max(0.0, seconds if left is None else min(seconds, left)))


def wait_drained(client, queue, pipeline=False, timeout=None):
    """The body of :meth:`Client.wait_drained` (its docstring says what it does)."""
    if timeout is not None and not timeout > 0:
        raise ValueError("timeout: expected a number of seconds above 0 or None, got %r"
                         % (timeout,))
    w = _Waiter(client, queue, pipeline, timeout)
    retry = 0.0
    while True:
        looked = w.look()
        left = w.left_s()
        if looked and _left(w.chain)[0] == 0:
            return w.result()
        if left is not None and left <= 0:
            raise w.timed_out()
        if looked:
            retry = 0.0
            w.pause(POLL_S)
        else:
            retry = min(retry * 2, RETRY_MAX_S) if retry else RETRY_FIRST_S
            w.pause(retry)
