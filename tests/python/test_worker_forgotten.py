"""The standalone Python worker says why the head no longer had it when it registers
again, as ``muster worker`` does (test_worker_head_restart.py, ForgottenWorkerTest): it
timed out (no heartbeat got there for its timeout), it was removed (its last heartbeat
got there within the timeout: a goodbye sent for it, or its node left or timed out), or
the head never knew it (another head, on an empty data dir, at the URL).  It registered
again without a word."""
import os
import shutil
import tempfile
import threading
import unittest

from common import harness, muster

import pool_workers  # noqa: E402
from muster import worker as mw
from muster import worker_reg

TIMEOUT_MS = 1500


class ForgottenWorkerTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head(["--worker-timeout-ms", str(TIMEOUT_MS), "--sweep-ms", "50"])
        self.head.start()
        self.addCleanup(self.head.cleanup)
        self.c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(self.c.close)
        self.c.put_queue("fq")
        self.lines = []

    def serve(self, client):
        """Runs serve_queue on queue fq with ``client`` until the test ends; its lines go
        to self.lines."""
        stop = threading.Event()
        t = threading.Thread(target=mw.serve_queue, args=(client, "fq"),
                             kwargs={"wait_ms": 100, "stop": stop, "log": self.lines.append},
                             daemon=True)

        def end():
            stop.set()
            t.join(30)
        t.start()
        self.addCleanup(end)

    def active(self, head=None):
        reply = (head or self.head).request("GET", "/v1/workers").json["workers"]
        return [w["id"] for w in reply if w["state"] == "active"]

    def said(self, start):
        return harness.wait_until(
            lambda: [x for x in list(self.lines) if x.startswith(start)], timeout=30,
            what=lambda: "the worker to say %r:\n%s" % (start, "\n".join(self.lines)))[0]

    def test_removed(self):
        self.serve(muster.Client(self.head.url, self.head.token))
        harness.wait_until(lambda: self.active() == [1], timeout=30, what="worker 1")
        self.c.bye(1)
        line = self.said("muster.worker: the head holds worker 1 as gone")
        self.assertRegex(line, r"^muster\.worker: the head holds worker 1 as gone: a goodbye "
                         r"was sent for it; registered again as \S+ \(id 2\)$")
        self.assertEqual(self.active(), [2])   # its loop and its heartbeat registered once
        self.assertEqual(len(self.lines), 1, self.lines)

    def test_timed_out_with_a_task_running(self):
        work = tempfile.mkdtemp(prefix="muster-forgotten-")
        self.addCleanup(shutil.rmtree, work, True)
        client = muster.Client(self.head.url, self.head.token)
        silent = threading.Event()
        real_heartbeat = client.heartbeat

        def heartbeat(*args, **kwargs):   # the worker's beats do not get through
            if silent.is_set():
                raise muster.NetworkError("the test keeps this heartbeat from the head")
            return real_heartbeat(*args, **kwargs)
        client.heartbeat = heartbeat
        pool = muster.Pool(pool_workers.Echo, {"k": 1, "dir": work}, client=self.c, queue="fq")
        self.addCleanup(pool.close)
        self.serve(client)
        self.addCleanup(lambda: open(os.path.join(work, "release"), "w").close())
        pool.imap_unordered([{"args": [1], "kwargs": {"mode": "block"}}])
        harness.wait_until(lambda: [f for f in os.listdir(work) if f.startswith("started-")],
                           timeout=30, what="the task to run")
        silent.set()
        harness.wait_until(lambda: self.c.worker(1)["state"] == "gone", timeout=30,
                           what="the head to time worker 1 out")
        silent.clear()
        line = self.said("muster.worker: the head timed out worker 1")
        self.assertRegex(line, r"^muster\.worker: the head timed out worker 1 \(no heartbeat "
                         r"got there for \d+\.\d s, past its 1\.5 s timeout\); registered "
                         r"again as \S+ \(id 2\); the task it was running lost its lease "
                         r"\(its result will not be stored\)$")

    def test_never_known(self):
        # The worker talks to the head through a proxy, which then forwards to another
        # head (another data dir, the same token) that has no worker at all.
        proxy = harness.RequestProxy(self.head, lambda method, path: False, None)
        self.addCleanup(proxy.close)
        other = harness.Head(["--worker-timeout-ms", str(TIMEOUT_MS)]).start()
        self.addCleanup(other.cleanup)
        self.assertEqual(other.request("PUT", "/v1/queues/fq", {}).status, 201)
        self.serve(muster.Client(proxy.url, self.head.token))
        harness.wait_until(lambda: self.active() == [1], timeout=30, what="worker 1")
        proxy.head = other
        line = self.said("muster.worker: the head does not know worker 1")
        self.assertEqual(line, "muster.worker: the head does not know worker 1 (it lost its "
                         "data, was restored from an older backup, or is another head at this "
                         "URL); registered again as %s (id 1)"
                         % other.request("GET", "/v1/workers/1").json["name"])


class ForgottenWhyTest(unittest.TestCase):
    def test_the_cases_the_worker_cannot_tell(self):
        why = worker_reg.forgotten_why
        # An older head's registration did not say the timeout: gone is all it knows.
        self.assertEqual(why(3, "worker 3 is gone (it said bye or timed out)", 9.0, None),
                         "the head holds worker 3 as gone (timed out or removed)")
        # An older head (or a worker gone before the head kept why): told apart here.
        old = "worker 3 is gone (it said bye or timed out)"
        self.assertTrue(why(3, old, 9.0, 60.0).startswith("worker 3 was removed on the head, "
                                                          "not timed out"))
        self.assertTrue(why(3, old, 90.0, 60.0).startswith("the head timed out worker 3 (no "
                                                           "heartbeat got there for 90.0 s"))
        # The head's own reason is said as it is; a time-out with the worker's figures.
        self.assertEqual(why(3, "worker 3 is gone (its node timed out); register again", 9.0,
                             60.0), "the head holds worker 3 as gone: its node timed out")
        timed_out = "worker 3 is gone (it timed out: no sign of life ...); register again"
        self.assertEqual(why(3, timed_out, 90.0, 60.0), "the head timed out worker 3 (no "
                         "heartbeat got there for 90.0 s, past its 60.0 s timeout)")
        self.assertEqual(why(3, timed_out, 9.0, 60.0),
                         "the head timed out worker 3 (past its 60.0 s timeout)")
        # A message of neither form is quoted.
        self.assertEqual(why(3, "no such worker", 1.0, 60.0),
                         "the head no longer has worker 3 (no such worker)")


if __name__ == "__main__":
    unittest.main()
