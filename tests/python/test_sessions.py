"""A session's results read by the Python client: ``Client.iter_results`` to the end of
the stream, and at a gap of indexes without a task (``muster.IndexGap`` once every task
has its result, instead of waiting for ever) and of a sealed session (``until_sealed``);
``Pool.imap`` at such a gap, and a pool
whose indexes another producer of its session took (``muster.IndexCollision``).  This
test is its own worker: it leases and completes the tasks itself."""
import threading
import time
import unittest

from common import HeadTestCase, harness, muster

import muster.pool  # noqa: E402 (the Pool's batch size, patched below)
import muster.worker  # noqa: E402 (encode_result)
import pool_workers


class SessionCase(HeadTestCase):
    """A session (no cleanup) on a queue of the test's own; the test is its worker."""

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


class IterResultsTest(SessionCase):

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
        # What to do, in Python's words: the keywords as they are written, and the cursor
        # past the gap.
        self.assertTrue(str(gap).endswith("; submit tasks at indexes 1-2, or read on past it "
                                          "(cursor=3) or in completion order "
                                          "(order=\"completion\")"), str(gap))
        self.assertLess(took, 5.0)  # not one 20 s long-poll
        got, gap, took = self.read(cursor=2, wait_ms=20000)
        self.assertEqual((got, gap.first, gap.last), ([], 2, 2))
        self.assertIn("index 2 has no task (it was never submitted, or purged)", str(gap))
        self.assertIn("submit a task at index 2, or read on past it (cursor=3)", str(gap))
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


class SealTest(SessionCase):
    """A sealed session (Client.seal_session, session_put(seal=True)): later puts raise
    InvalidState, and iter_results(until_sealed=True) follows a producer across the pause
    between two puts, ending once the session is sealed and every result was read."""

    def follow(self):
        """iter_results(until_sealed=True) in a thread; (the thread, the indexes read,
        the error raised or None in a list)."""
        got, failure = [], []

        def run():
            try:
                for r in self.c.iter_results(self.sid, until_sealed=True):
                    got.append(r["index"])
            except Exception as e:  # reported by the test
                failure.append(e)
        reader = threading.Thread(target=run, daemon=True)
        reader.start()
        return reader, got, failure

    def wait_read(self, reader, got, n):
        """Waits until `n` indexes were read, or the reader ended (which fails)."""
        harness.wait_until(lambda: len(got) >= n or not reader.is_alive(), timeout=30,
                           what="%d results read" % n)
        self.assertTrue(reader.is_alive(), "iter_results ended after %r" % got)
        self.assertEqual(len(got), n, got)

    def test_until_sealed_follows_across_puts(self):
        reader, got, failure = self.follow()
        self.c.session_put(self.sid, [{"payload": 0}, {"payload": 1}])
        self.run_all(2)
        self.wait_read(reader, got, 2)
        self.c.session_put(self.sid, [{"payload": 2}])
        self.run_all(1)
        self.wait_read(reader, got, 3)
        s = self.c.seal_session(self.sid)
        self.assertEqual((s["sealed"], s["already_sealed"], s["counts"]["total"]), (True, False, 3))
        reader.join(30)
        self.assertFalse(reader.is_alive(), "iter_results did not end at the seal")
        self.assertEqual((got, failure), ([0, 1, 2], []))
        self.assertTrue(self.c.seal_session(self.sid)["already_sealed"])
        self.assertTrue(self.c.session(self.sid)["sealed"])
        # Without until_sealed the stream ends once every task put has its result, as before.
        self.assertEqual([r["index"] for r in self.c.iter_results(self.sid)], [0, 1, 2])

    def test_put_with_seal_and_after_it(self):
        reader, got, failure = self.follow()
        self.c.session_put(self.sid, [{"payload": 0}], seal=True)
        self.assertTrue(self.c.results(self.sid)["sealed"])
        self.run_all(1)
        reader.join(30)
        self.assertFalse(reader.is_alive(), "iter_results did not end")
        self.assertEqual((got, failure), ([0], []))
        with self.assertRaises(muster.InvalidState) as cm:
            self.c.session_put(self.sid, [{"payload": 1}])
        self.assertIn("session %s was sealed" % self.sid, str(cm.exception))
        self.assertIn("put these tasks into a new session", str(cm.exception))
        self.assertEqual(self.c.session(self.sid)["counts"]["total"], 1)

    def test_seal_unknown_session(self):
        with self.assertRaises(muster.SessionNotFound):
            self.c.seal_session("s-0123456789abcdef")

    def test_seal_on_an_older_head(self):
        # A head older than sealing has no seal route and answers its bare not_found
        # (played by a proxy): the error says the head is older, not just "no endpoint".
        path = "/v1/sessions/%s/seal" % self.sid
        proxy = harness.RequestProxy(
            self.head, lambda method, p: p == path,
            lambda n: (404, {"error": {"code": "not_found",
                                       "message": "no endpoint at %s; see docs/api.md" % path}}))
        self.addCleanup(proxy.close)
        client = muster.Client(proxy.url, self.head.token)
        self.addCleanup(client.close)
        with self.assertRaises(muster.NotFound) as cm:
            client.seal_session(self.sid)
        self.assertNotIsInstance(cm.exception, muster.SessionNotFound)
        self.assertEqual(str(cm.exception),
                         "not_found: the head at %s has no endpoint POST %s: it is older than "
                         "this client and cannot seal sessions; upgrade the head "
                         "(docs/operations.md, \"Versions side by side\")" % (proxy.url, path))
        self.assertIs(self.c.session(self.sid)["sealed"], False)

    def test_an_older_head_cannot_say(self):
        # A reply without "sealed" (a head older than the client): until_sealed cannot
        # tell the end, and says so rather than wait for ever.
        self.c.session_put(self.sid, [{"payload": 0}])
        self.run_all(1)
        results = self.c._results

        def without_sealed(*args):
            reply = results(*args)
            reply.pop("sealed")
            return reply
        self.c._results = without_sealed
        try:
            with self.assertRaises(muster.ProtocolError) as cm:
                list(self.c.iter_results(self.sid, until_sealed=True))
        finally:
            del self.c._results
        self.assertIn("until_sealed cannot be honoured", str(cm.exception))


class PoolCollisionTest(HeadTestCase):
    """Another producer of a pool's session that uses indexes the pool numbers its own jobs
    with: the head refuses the pool's batch, and the pool raises IndexCollision at once,
    naming the session and the indexes (it used to take the refusal for a batch stored by
    an earlier try, so its inputs stayed without tasks and map waited, or raised IndexGap).
    No worker runs: the tasks stay queued, which is all these checks need."""

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q)
        self.pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, url=self.head.url,
                                token=self.head.token, queue=self.q)

    def tearDown(self):
        self.pool.close()
        super().tearDown()

    def map_collides(self, inputs):
        """Runs pool.map(inputs) and returns the IndexCollision it raised (at once)."""
        t0 = time.monotonic()
        with self.assertRaises(muster.IndexCollision) as cm:
            self.pool.map(inputs, timeout=5)
        self.assertLess(time.monotonic() - t0, 3.0)
        e = cm.exception
        self.assertIsInstance(e, muster.InvalidState)
        self.assertEqual((e.code, e.status, e.session), ("invalid_state", 409, self.pool.session))
        self.assertIn("session %s" % self.pool.session, str(e))
        self.assertIn("give any other producer a session of its own", str(e))
        return e

    def session_total(self):
        return self.c.session(self.pool.session)["counts"]["total"]

    def test_explicit_index_of_another_producer(self):
        self.c.session_put(self.pool.session, [{"payload": "other", "index": 1}])
        e = self.map_collides([10, 11, 12])
        self.assertEqual((e.first, e.last, e.index, e.stored), (0, 2, 1, 0))
        self.assertIn("jobs at indexes 0-2 were refused, none of them stored: index 1 is "
                      "already in use", str(e))
        self.assertEqual(self.session_total(), 1)  # the other producer's task alone

    def test_automatic_index_of_another_producer(self):
        # A task put without an index takes the session's next index, 0 here: the same
        # index the pool gives its first job.
        self.c.session_put(self.pool.session, [{"payload": "other"}])
        e = self.map_collides([10])
        self.assertEqual((e.first, e.last, e.index), (0, 0, 0))
        self.assertIn("jobs at index 0 were refused", str(e))

    def test_collision_in_a_later_batch(self):
        # Batches of two: indexes 0-1 are stored, 2-3 refused (3 is taken), 4 never sent.
        self.c.session_put(self.pool.session, [{"payload": "other", "index": 3}])
        saved = muster.pool.SUBMIT_BATCH
        muster.pool.SUBMIT_BATCH = 2
        try:
            e = self.map_collides([10, 11, 12, 13, 14])
        finally:
            muster.pool.SUBMIT_BATCH = saved
        self.assertEqual((e.first, e.last, e.index, e.stored), (2, 3, 3, 2))
        self.assertIn("the 2 jobs of this call before index 2 were stored", str(e))
        self.assertEqual(self.session_total(), 3)

    def test_the_pool_goes_on_past_the_collision(self):
        # The refused indexes are not numbered again: the next call's jobs are at 3-4.
        self.c.session_put(self.pool.session, [{"payload": "other", "index": 1}])
        self.map_collides([10, 11, 12])
        first, n = self.pool._submit([20, 21])
        self.assertEqual((first, n, self.session_total()), (3, 2, 3))

    def test_other_refusals_are_not_collisions(self):
        # An invalid_state that does not name an index in use is raised as it came.
        other = muster.InvalidState("the session is closing", status=409)
        self.assertIsNone(muster.IndexCollision.from_refusal(other, "s-1", 0, 2, 0))


class PoolGapTest(HeadTestCase):

    def test_imap_at_a_gap_raises(self):
        """A purge of the pool's queue removes its queued jobs 1 and 2 while job 0 has its
        result: indexes 1-2 have no task and every task has its result, so imap yields the
        first result and then raises IndexGap rather than wait for ever."""
        q = self.qname()
        self.c.put_queue(q)
        pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, url=self.head.url,
                           token=self.head.token, queue=q)
        try:
            it = pool.imap([10, 11, 12], timeout=15)
            [lease] = self.c.lease(q)
            self.assertEqual(lease.index, 0)
            lease.complete(muster.worker.encode_result(100))
            self.c.purge_queue(q)
            t0 = time.monotonic()
            got = []
            with self.assertRaises(muster.IndexGap) as cm:
                for r in it:
                    got.append(r)
            self.assertLess(time.monotonic() - t0, 5.0)
            self.assertEqual(got, [100])
            self.assertEqual((cm.exception.first, cm.exception.last, cm.exception.session),
                             (1, 2, pool.session))
            # imap takes no cursor: the advice names the client's reader, which does.
            self.assertTrue(str(cm.exception).endswith(
                "submit tasks at indexes 1-2, or read the rest with Client.iter_results(%r, "
                "cursor=3) or with order=\"completion\"" % pool.session), str(cm.exception))
        finally:
            pool.close()


if __name__ == "__main__":
    unittest.main()
