"""Client.wait_drained(queue, pipeline=False, timeout=None), as `muster queue wait`.

The call runs in a thread while the test leases and completes tasks; that it has looked
again after a change is read off the head's count of GET /v1/queues (GET /metrics):
two more requests mean it read one answer after the change and asked again, so a call
still running then did not take the change for the end.  No pause stands in for that.
"""
import re
import threading
import unittest

from common import HeadTestCase, harness, muster

QUEUES_GETS = re.compile(
    r'^muster_http_requests_total\{method="GET",route="/v1/queues",code="200"\} (\d+)$', re.M)


def queue_gets(client):
    """The head's count of GET /v1/queues answered 200."""
    found = QUEUES_GETS.search(client.request_raw("GET", "/metrics")[2].decode())
    return int(found.group(1)) if found else 0


class Waiting:
    """wait_drained(*args, **kw) of `client` in a thread: .result or .error once done."""

    def __init__(self, client, *args, **kw):
        self.result = self.error = None
        # A daemon: a test that fails while it waits must not hold the process.
        self.thread = threading.Thread(target=self._run, args=(client, args, kw), daemon=True)
        self.thread.start()

    def _run(self, client, args, kw):
        try:
            self.result = client.wait_drained(*args, **kw)
        except Exception as e:  # noqa: BLE001 (handed to the test)
            self.error = e

    def join(self):
        self.thread.join(60)
        if self.error:
            raise self.error
        return self.result


class WaitDrainedTest(HeadTestCase):

    def pipeline(self, *names, **settings):
        for i, name in reversed(list(enumerate(names))):
            nxt = {"next": names[i + 1]} if i + 1 < len(names) else {}
            self.c.put_queue(name, **nxt, **settings)

    def complete_one(self, queue, result="r"):
        lease = self.c.lease_one(queue)
        self.c.complete(lease["task"], lease["token"], result)

    def queue_gets(self):
        return queue_gets(self.c)

    def looked_again(self, waiting):
        seen = self.queue_gets()
        harness.wait_until(lambda: self.queue_gets() >= seen + 2 or not waiting.thread.is_alive(),
                           what="two more looks at the queues")

    def test_an_empty_queue_at_once(self):
        q = self.qname()
        self.c.put_queue(q)
        drained = self.c.wait_drained(q)
        self.assertEqual(list(drained), [q])
        self.assertEqual(drained[q]["queued"], 0)
        self.assertEqual(drained.failed, {})

    def test_pipeline_waits_for_the_child_of_a_completion(self):
        a, b = self.qname("a"), self.qname("b")
        self.pipeline(a, b)
        self.c.put(a, "x")
        waiting = Waiting(self.c.__class__(self.head.url, self.head.token), a, pipeline=True)
        self.looked_again(waiting)
        self.complete_one(a)
        self.assertEqual(self.c.wait_drained(a)[a]["done"], 1)  # a alone is drained
        self.looked_again(waiting)
        self.assertTrue(waiting.thread.is_alive(), waiting.error)
        self.complete_one(b)
        drained = waiting.join()
        self.assertEqual(list(drained), [a, b])
        self.assertEqual((drained[a]["done"], drained[b]["done"]), (1, 1))
        self.assertEqual(drained.failed, {})

    def test_failures_since_the_call(self):
        q = self.qname()
        self.c.put_queue(q, max_attempts=1)
        self.c.put(q, "before")
        lease = self.c.lease_one(q)
        self.c.fail(lease["task"], lease["token"], "old")  # dead before the call
        self.c.put(q, "x")
        waiting = Waiting(self.c.__class__(self.head.url, self.head.token), q)
        self.looked_again(waiting)
        lease = self.c.lease_one(q)
        self.c.fail(lease["task"], lease["token"], "new", permanent=True)
        drained = waiting.join()
        self.assertEqual(drained.failed, {q: 1})
        self.assertEqual((drained[q]["dead"], drained[q]["failed"]), (1, 1))

    def test_timeout_says_what_is_left(self):
        q = self.qname()
        self.c.put_queue(q)
        self.c.put(q, "a")
        self.c.put(q, "later", delay_ms=3600000)  # a delayed task counts
        with self.assertRaises(TimeoutError) as caught:
            self.c.wait_drained(q, timeout=0.3)
        self.assertEqual(str(caught.exception), "queue '%s' did not drain in 0.3 s: 2 left "
                                                "(%s: 2 queued, 0 leased)" % (q, q))

    def test_refusals(self):
        with self.assertRaises(muster.QueueNotFound):
            self.c.wait_drained(self.qname("nope"))
        q = self.qname()
        self.c.put_queue(q)  # drained: only the timeout is wrong
        for bad in (0, -1, "5"):
            with self.assertRaises((ValueError, TypeError)):
                self.c.wait_drained(q, timeout=bad)

    def test_a_loop_of_next_ends_the_chain(self):
        a, b = self.qname("a"), self.qname("b")
        self.c.put_queue(a)
        self.c.put_queue(b, next=a)
        self.c.put_queue(a, next=b)
        self.assertEqual(list(self.c.wait_drained(a, pipeline=True)), [a, b])


class WaitDrainedRestartTest(unittest.TestCase):
    """A head killed and started again at the same URL while wait_drained waits."""

    def setUp(self):
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()]).start()
        self.addCleanup(self.head.cleanup)
        self.c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(self.c.close)

    def test_the_head_restarts_meanwhile(self):
        self.c.put_queue("rs")
        self.c.put("rs", "one")
        waiter = muster.Client(self.head.url, self.head.token)
        self.addCleanup(waiter.close)
        failed = []
        looks = waiter.queues

        def queues():  # the waiter's looks, its failures noted
            try:
                return looks()
            except muster.MusterError as e:
                failed.append(e)
                raise
        waiter.queues = queues
        waiting = Waiting(waiter, "rs")
        harness.wait_until(lambda: queue_gets(self.c) >= 1, what="a first look")
        self.head.kill()
        harness.wait_until(lambda: failed, what="a look that fails")
        self.head.start()
        lease = self.c.lease_one("rs")
        self.c.complete(lease["task"], lease["token"], "done")
        self.assertEqual(waiting.join()["rs"]["done"], 1)
        self.assertIsInstance(failed[0], muster.NetworkError)


if __name__ == "__main__":
    unittest.main()
