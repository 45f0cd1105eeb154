"""Long-polls of the Python client against heads with another ``--max-wait-ms``: the
client asks the head once (GET /v1/health's ``max_wait_ms``; again once a restarted head
closed its connection) and waits as long as it
lets one wait, never longer: ``iter_results``, the Pool's reads of results and the
standalone worker's leases; ``lease``/``results`` cut a longer ``wait_ms`` to it; and a
head that lets no request wait is asked once a second at most, not in a busy loop.
This test is its own worker: it leases and completes the tasks itself."""
import threading
import time
import unittest

from common import HeadTestCase, harness, muster

import muster.worker  # noqa: E402 (encode_result, serve_queue)
import pool_workers


class SpyClient(muster.Client):
    """A Client that notes what each long-poll asked for: ``reads`` and ``leases`` are
    lists of (time.monotonic(), wait_ms sent or None), ``health_asks`` counts GET
    /v1/health, ``cuts`` the waits chosen (long_poll_ms), ``waiting`` is set when a
    request that waits is sent, and ``enough`` once ``want`` results reads (or ``want``
    leases) were sent."""

    def __init__(self, *args, want=3, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads, self.leases, self.health_asks, self.cuts = [], [], 0, 0
        self.waiting, self.enough, self.want = threading.Event(), threading.Event(), want

    def request(self, method, path, body=None, query=None, wait_ms=0, **kwargs):
        if path == "/v1/health":
            self.health_asks += 1
        elif path.endswith("/results"):
            self.reads.append((time.monotonic(), (query or {}).get("wait_ms")))
            if len(self.reads) >= self.want:
                self.enough.set()
        elif path.endswith("/lease"):
            self.leases.append((time.monotonic(), (body or {}).get("wait_ms")))
            if len(self.leases) >= self.want:
                self.enough.set()
        if wait_ms:
            self.waiting.set()
        return super().request(method, path, body, query, wait_ms, **kwargs)

    def long_poll_ms(self, wait_ms=None, left=None):
        self.cuts += 1
        return super().long_poll_ms(wait_ms, left)


class LongPollCase(HeadTestCase):
    """A queue, a session of it, and a SpyClient of the head."""

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q)
        self.spy = SpyClient(self.head.url, self.head.token)
        self.addCleanup(self.spy.close)

    def session_with_one_task(self):
        sid = self.c.create_session(self.q, cleanup_on_exit=False)["id"]
        self.addCleanup(self.c.close_session, sid)
        self.c.session_put(sid, [{"payload": 1}])
        return sid

    def in_thread(self, fn):
        """Runs fn() in a thread; returns a function that joins it and gives its value."""
        out = {}

        def run():
            try:
                out["value"] = fn()
            except BaseException as e:  # raised by the joiner
                out["error"] = e
        t = threading.Thread(target=run)
        t.start()

        def join():
            t.join(60)
            self.assertFalse(t.is_alive(), "the call did not end")
            if "error" in out:
                raise out["error"]
            return out["value"]
        return join

    def complete_the_task(self, result=10):
        [lease] = self.c.lease(self.q)
        lease.complete(result)


class LongerMaxWaitTest(LongPollCase):
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "60000")

    def test_iter_results_waits_as_long_as_the_head_lets_it(self):
        for _ in range(2):
            sid = self.session_with_one_task()
            self.spy.waiting.clear()
            join = self.in_thread(lambda: list(self.spy.iter_results(sid)))
            self.assertTrue(self.spy.waiting.wait(30))
            self.complete_the_task()
            self.assertEqual([r["result"] for r in join()], [10])
        waits = [w for _, w in self.spy.reads if w]
        self.assertTrue(waits)
        self.assertEqual(set(waits), {60000})   # not a fixed 20 s
        self.assertEqual(self.spy.health_asks, 1)   # asked once per client
        self.assertEqual(self.spy.max_wait_ms(), 60000)

    def test_a_longer_wait_is_cut_to_the_heads(self):
        self.c.put(self.q, 1)
        self.spy.lease(self.q, wait_ms=600000)[0].complete()   # ready: leased at once
        sid = self.session_with_one_task()
        self.complete_the_task()
        self.assertEqual(len(self.spy.results(sid, wait_ms=600000)["results"]), 1)   # at once
        self.assertEqual([w for _, w in self.spy.leases], [60000])
        self.assertEqual([w for _, w in self.spy.reads], [60000])
        self.assertEqual(self.spy.long_poll_ms(600000), 60000)
        self.assertEqual(self.spy.long_poll_ms(None, left=2.5), 2500)

    def test_pool_reads_wait_as_long_as_the_head_lets_them(self):
        pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, queue=self.q, client=self.spy)
        self.addCleanup(pool.close)
        join = self.in_thread(lambda: pool.map([7]))
        self.assertTrue(self.spy.waiting.wait(30))
        [lease] = self.c.lease(self.q)
        lease.complete(muster.worker.encode_result(70))
        self.assertEqual(join(), [70])
        self.assertEqual({w for _, w in self.spy.reads if w}, {60000})

    def test_the_worker_leases_as_long_as_the_head_lets_it(self):
        stop = threading.Event()
        join = self.in_thread(lambda: muster.worker.serve_queue(
            self.spy, self.q, stop=stop, log=lambda text: None))
        self.assertTrue(self.spy.waiting.wait(30))
        stop.set()
        self.c.put(self.q, 1)   # wakes the parked lease; the stopping worker releases it
        self.assertEqual(join(), 0)
        self.assertEqual([w for _, w in self.spy.leases], [60000])


class ShorterMaxWaitTest(LongPollCase):
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "300")

    def test_iter_results_asks_no_longer_than_the_head_lets_it(self):
        sid = self.session_with_one_task()
        join = self.in_thread(lambda: list(self.spy.iter_results(sid, wait_ms=20000)))
        self.assertTrue(self.spy.enough.wait(30))
        self.complete_the_task()
        self.assertEqual(len(join()), 1)
        self.assertEqual({w for _, w in self.spy.reads if w}, {300})

    def test_each_long_poll_chooses_its_wait_once(self):
        """The worker's leases and the reads of iter_results (a Pool's too): one
        long_poll_ms per long-poll (it peeks at the connection; lease() and results()
        chose the wait a second time)."""
        stop = threading.Event()
        join = self.in_thread(lambda: muster.worker.serve_queue(
            self.spy, self.q, stop=stop, log=lambda text: None))
        self.assertTrue(self.spy.enough.wait(30))
        stop.set()
        self.assertEqual(join(), 0)
        self.assertEqual(self.spy.cuts, len(self.spy.leases))
        self.spy.cuts, self.spy.reads = 0, []
        self.spy.enough.clear()
        sid = self.session_with_one_task()
        join = self.in_thread(lambda: list(self.spy.iter_results(sid)))
        self.assertTrue(self.spy.enough.wait(30))
        self.complete_the_task()
        self.assertEqual(len(join()), 1)
        waits = [w for _, w in self.spy.reads if w]
        self.assertTrue(waits)
        self.assertEqual(self.spy.cuts, len(waits))


class NoWaitHeadTest(LongPollCase):
    """``--max-wait-ms 0``: the head answers every long-poll at once; the client asks
    again once a second at most (each paced read starts no sooner than 1 s after the one
    before it)."""
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "0")

    def assert_paced(self, times):
        # The first read does not wait; those after it are the long-polls.
        gaps = [b - a for a, b in zip(times[1:], times[2:])]
        self.assertTrue(gaps)
        self.assertGreaterEqual(min(gaps), 0.9, gaps)

    def test_iter_results_is_paced(self):
        sid = self.session_with_one_task()
        join = self.in_thread(lambda: list(self.spy.iter_results(sid)))
        self.assertTrue(self.spy.enough.wait(30))
        self.complete_the_task()
        self.assertEqual(len(join()), 1)
        self.assert_paced([t for t, _ in self.spy.reads][:3])

    def test_pool_reads_are_paced(self):
        pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, queue=self.q, client=self.spy)
        self.addCleanup(pool.close)
        join = self.in_thread(lambda: pool.map([7], timeout=60))
        self.assertTrue(self.spy.enough.wait(30))
        [lease] = self.c.lease(self.q)
        lease.complete(muster.worker.encode_result(70))
        self.assertEqual(join(), [70])
        self.assert_paced([t for t, _ in self.spy.reads][:3])

    def test_the_worker_is_paced(self):
        stop = threading.Event()
        join = self.in_thread(lambda: muster.worker.serve_queue(
            self.spy, self.q, stop=stop, log=lambda text: None))
        self.assertTrue(self.spy.enough.wait(30))
        stop.set()
        self.assertEqual(join(), 0)
        times = [t for t, _ in self.spy.leases][:3]
        self.assertEqual(len(times), 3)
        self.assertGreaterEqual(min(b - a for a, b in zip(times, times[1:])), 0.9)


class RestartedHeadTest(unittest.TestCase):
    """The head restarts at the same URL with another ``--max-wait-ms``: the client, which
    found its connection closed, asks the new head's cap before its next long-poll, and
    asks no more after that."""

    def start_head(self, max_wait_ms):
        self.head.args[-1] = str(max_wait_ms)
        self.head.start()

    def setUp(self):
        port = harness.free_port()
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % port, "--max-wait-ms", "400"])
        self.addCleanup(self.head.cleanup)
        self.start_head(400)
        self.spy = SpyClient(self.head.url, self.head.token)
        self.addCleanup(self.spy.close)
        # Tasks are put by another client: a put of the spy's own would find its closed
        # connection before the lease does, which is what the lease must find by itself.
        self.other = muster.Client(self.head.url, self.head.token)
        self.addCleanup(self.other.close)
        self.q = "restarted"
        self.spy.put_queue(self.q)

    def lease_one(self):
        """Leases a task put just before (so at once, whatever the wait) and completes it."""
        self.other.put(self.q, 1)
        self.spy.lease(self.q, wait_ms=600000)[0].complete()

    def test_the_next_long_poll_asks_the_new_heads_cap(self):
        self.lease_one()
        self.assertEqual(self.head.stop(), 0, self.head.log())
        self.start_head(700)
        self.lease_one()
        self.lease_one()
        self.assertEqual([w for _, w in self.spy.leases], [400, 700, 700])
        self.assertEqual(self.spy.health_asks, 2)   # once per head, not per long-poll


if __name__ == "__main__":
    unittest.main()
