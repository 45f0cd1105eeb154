"""A session's results read by the Python client: ``Client.iter_results`` to the end of
the stream, and at a gap of indexes without a task (``muster.IndexGap`` once every task
has its result, instead of waiting for ever); ``Pool.imap`` at such a gap.  This test is
its own worker: it leases and completes the tasks itself."""
import time
import unittest

from common import HeadTestCase, muster

import pool_workers


class IterResultsTest(HeadTestCase):

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q)
        self.sid = self.c.create_session(self.q, cleanup_on_exit=False)["id"]

    def tearDown(self):
        self.c.close_session(self.sid)
        super().tearDown()

    def run_all(self, n):
        """Leases the queue's n tasks and completes each with its payload times ten."""
        leases = self.c.lease(self.q, max=n)
        self.assertEqual(len(leases), n)
        for lease in leases:
            lease.complete(lease.payload * 10)

    def read(self, **kwargs):
        """(indexes read, the IndexGap raised or None, seconds taken)."""
        got, gap, t0 = [], None, time.monotonic()
        try:
            for r in self.c.iter_results(self.sid, **kwargs):
                got.append(r["index"])
        except muster.IndexGap as e:
            gap = e
        return got, gap, time.monotonic() - t0

    def test_reads_to_the_end(self):
        self.c.session_put(self.sid, [{"payload": i} for i in range(3)])
        self.run_all(3)
        got, gap, took = self.read()
        self.assertEqual((got, gap), ([0, 1, 2], None))
        self.assertLess(took, 5.0)  # the stream is complete: no long-poll at its end
        got, _, _ = self.read(order="completion")
        self.assertEqual(sorted(got), [0, 1, 2])
        self.assertEqual(self.read(cursor=2)[0], [2])

    def test_gap_once_every_task_has_its_result(self):
        self.c.session_put(self.sid, [{"payload": 0}, {"payload": 3, "index": 3}])
        self.run_all(2)
        got, gap, took = self.read(wait_ms=20000)
        self.assertEqual(got, [0])
        self.assertIsInstance(gap, muster.MusterError)
        self.assertEqual((gap.code, gap.session, gap.first, gap.last, gap.cursor, gap.total),
                         ("index_gap", self.sid, 1, 2, 1, 2))
        self.assertIn("index 1 has no task (indexes 1-2 were never submitted, or purged)", str(gap))
        self.assertIn("order=completion", str(gap))
        self.assertLess(took, 5.0)  # not one 20 s long-poll
        got, gap, took = self.read(cursor=2, wait_ms=20000)
        self.assertEqual((got, gap.first, gap.last), ([], 2, 2))
        self.assertIn("index 2 has no task (it was never submitted, or purged)", str(gap))
        self.assertLess(took, 5.0)
        got, gap, _ = self.read(cursor=3)
        self.assertEqual((got, gap), ([3], None))
        got, gap, _ = self.read(order="completion")
        self.assertEqual((sorted(got), gap), ([0, 3], None))
        # Filled later, the gap is read in its place, each index once.
        self.c.session_put(self.sid, [{"payload": 2, "index": 2}, {"payload": 1, "index": 1}])
        self.run_all(2)
        got, gap, _ = self.read()
        self.assertEqual((got, gap), ([0, 1, 2, 3], None))

    def test_results_reply_has_the_gap(self):
        self.c.session_put(self.sid, [{"payload": 0}, {"payload": 3, "index": 3}])
        reply = self.c.results(self.sid, cursor=1)
        self.assertEqual((reply["gap"], reply["done"], reply["total"]),
                         ({"first": 1, "last": 2}, 0, 2))
        self.assertFalse(muster.errors.results_stalled(reply))
        self.run_all(2)
        self.assertTrue(muster.errors.results_stalled(self.c.results(self.sid, cursor=1)))
        with self.assertRaises(muster.InvalidArgument):
            list(self.c.iter_results(self.sid, order="random"))


class PoolGapTest(HeadTestCase):

    def test_imap_at_a_gap_raises(self):
        """Another producer took the pool's index 1: the pool's batch is refused (as in use)
        and its indexes 0 and 2 stay without a task.  Once that task has its result, imap
        raises IndexGap rather than wait for ever."""
        q = self.qname()
        self.c.put_queue(q)
        pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, url=self.head.url,
                           token=self.head.token, queue=q)
        try:
            self.c.session_put(pool.session, [{"payload": "other", "index": 1}])
            [lease] = self.c.lease(q)
            lease.complete("theirs")
            t0 = time.monotonic()
            with self.assertRaises(muster.IndexGap) as cm:
                list(pool.imap([10, 11, 12], timeout=15))
            self.assertLess(time.monotonic() - t0, 5.0)
            self.assertEqual((cm.exception.first, cm.exception.last, cm.exception.session),
                             (0, 0, pool.session))
        finally:
            pool.close()


if __name__ == "__main__":
    unittest.main()
