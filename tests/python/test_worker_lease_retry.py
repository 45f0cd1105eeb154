"""The standalone Python worker (serve_queue) sends a lease request again under the same
key when its reply was lost after the head committed it (docs/api.md, "Retrying a
lease"): the task that reply carried comes back with its token and runs at once, instead
of staying leased to a worker that did not know of it until its lease ran out.  The
queue's lease is ten minutes, so a stranded task would still be leased when the test gives
up.  The client here does the request, then raises as a broken connection would: the head
committed, the worker heard nothing."""
import shutil
import tempfile
import threading
import unittest

from common import HeadTestCase, muster

import muster.worker  # noqa: E402 (serve_queue)
import pool_workers

LONG_LEASE_MS = 600000


class LossyClient(muster.Client):
    """A Client whose first request matching ``lose(method, path, body)`` reaches the
    head and then fails with a NetworkError; ``lost`` holds what the head replied."""

    def __init__(self, *args, lose=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lose, self.lost, self.keys = lose, [], []

    def request(self, method, path, body=None, query=None, wait_ms=0, **kwargs):
        reply = super().request(method, path, body, query, wait_ms, **kwargs)
        asks = path.endswith("/lease") or "lease" in (body if isinstance(body, dict) else ())
        if asks:   # the keys of the lease requests (plain, or with a completion)
            self.keys.append(body.get("request") or body.get("lease", {}).get("request"))
        if not self.lost and self.lose(method, path, body) and reply.get("leases"):
            self.lost.append((reply, self.keys[-1]))
            raise muster.NetworkError("the test lost the reply of %s %s" % (method, path))
        return reply


class WorkerLeaseRetryTest(HeadTestCase):

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q, lease_ms=LONG_LEASE_MS)
        self.work = tempfile.mkdtemp(prefix="muster-lease-retry-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.lines = []

    def serve(self, client):
        stop = threading.Event()
        t = threading.Thread(target=muster.worker.serve_queue, args=(client, self.q),
                             kwargs={"wait_ms": 200, "stop": stop, "log": self.lines.append},
                             daemon=True)

        def end():
            stop.set()
            t.join(30)
        t.start()
        self.addCleanup(end)

    def run_three(self, lose):
        """Maps three inputs with a worker whose client loses one reply; returns the
        results, the lost reply and the client."""
        client = LossyClient(self.head.url, self.head.token, lose=lose)
        self.addCleanup(client.close)
        pool = muster.Pool(pool_workers.Echo, {"k": 2, "dir": self.work}, client=self.c,
                           queue=self.q)
        self.addCleanup(pool.close)
        self.serve(client)
        try:
            got = [r["y"] for r in pool.map([1, 2, 3], timeout=30)]
        except TimeoutError:
            self.fail("no three results within 30 s: tasks %s; the worker said %s"
                      % (self.tasks(), self.lines))
        return got, client

    def tasks(self):
        return self.c.request("GET", "/v1/queues/%s/tasks" % self.q)["tasks"]

    def check(self, got, client):
        self.assertEqual(got, [2, 4, 6])
        [(lost, key)] = client.lost
        [lease] = lost["leases"]
        tasks = {t["id"]: t for t in self.tasks()}
        self.assertEqual(tasks[lease["task"]]["state"], "done")
        self.assertEqual([t["attempts"] for t in tasks.values()], [1, 1, 1])
        # Every lease request had its key, and the lost one's went again with the next.
        self.assertNotIn(None, client.keys, "a lease request went without its key")
        at = client.keys.index(key)
        self.assertEqual(client.keys[at + 1], key, client.keys)
        self.assertEqual(len(set(client.keys)), len(client.keys) - 1, client.keys)

    def test_a_lease_whose_reply_was_lost(self):
        got, client = self.run_three(lambda method, path, body: path.endswith("/lease"))
        self.check(got, client)

    def test_a_complete_and_lease_whose_reply_was_lost(self):
        got, client = self.run_three(
            lambda method, path, body: path == "/v1/leases/complete" and "lease" in body)
        self.check(got, client)


if __name__ == "__main__":
    unittest.main()
