"""Nodes (and workers) started before the pool that creates their queue: a Pool opened
after them counts the workers that are up at once.

distributed_computing's usual order is to start the nodes first and then open the Pool in
the script, which creates the queue.  The workers of `muster node` waited for the queue
before they registered, so `get_workers_count()` was 0 right after the Pool opened, and
the workers counted about a second later.  They now register first and wait for the
queue registered, heart-beating.

The tests wait (with a deadline) only for the workers to come up: for each to say that it
waits for the queue, which a worker says once it is registered.  The counts right after
the Pool opens are read once, without waiting."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from common import ROOT, HeadTestCase, harness, muster

sys.path.append(os.path.join(ROOT, "tests", "integration"))   # after tests/python: its test_* names win
import node_harness  # noqa: E402

import pool_workers  # noqa: E402

WORKER_TIMEOUT_MS = 1500


def waiting_lines(log, queue):
    return log.count("waiting for queue %s to be created" % queue)


class NodesFirstTest(HeadTestCase):
    # A short worker timeout: a worker that did not beat while it waited for its queue
    # would be timed out within the test.
    head_args = ("--sweep-ms", "50", "--worker-timeout-ms", str(WORKER_TIMEOUT_MS))

    def setUp(self):
        super().setUp()
        self.work = tempfile.mkdtemp(prefix="muster-nodes-first-")
        self.addCleanup(shutil.rmtree, self.work, True)

    def start_agent(self, queue, workers):
        env = {"PYTHONPATH": os.path.join(ROOT, "python"), "TMPDIR": self.work}
        agent = node_harness.Agent(self.head, self.work, name="first-" + queue[-20:],
                                   args=["--queue", queue, "--workers", str(workers)],
                                   cmd=["/usr/bin/python3", "-m", "muster.worker"], env=env)
        self.addCleanup(agent.stop)
        agent.start()
        harness.wait_until(lambda: waiting_lines(agent.log(), queue) == workers, timeout=30,
                           what=lambda: "%d workers waiting for queue %s:\n%s"
                           % (workers, queue, agent.log()))
        return agent

    def queue_workers(self, queue):
        return [w for w in self.c.workers() if queue in (w.get("queues") or [])]

    def test_a_pool_opened_after_its_node_counts_its_workers_at_once(self):
        q = self.qname()
        agent = self.start_agent(q, 2)
        with muster.Pool(pool_workers.Echo, {"k": 2, "dir": self.work}, client=self.c,
                         queue=q) as pool:
            self.assertEqual(pool.get_workers_count(), 2, agent.log())
            self.assertEqual(pool.get_nodes_count(), 1, agent.log())
            self.assertEqual([r["y"] for r in pool.map(range(4))], [0, 2, 4, 6])
        self.assertEqual(agent.log().count("registered again"), 0, agent.log())

    def test_a_waiting_worker_beats_and_says_what_it_waits_for(self):
        """While it waits for its queue the worker is active, heart-beating past its
        timeout under the id it registered with, its progress saying what it waits for."""
        q = self.qname()
        agent = self.start_agent(q, 1)
        workers = self.queue_workers(q)
        self.assertEqual(len(workers), 1, agent.log())
        first = workers[0]
        self.assertEqual(first["state"], "active")
        self.assertEqual(first["timeout_ms"], WORKER_TIMEOUT_MS)

        def beaten_past_two_timeouts_or_gone():
            w = self.c.worker(first["id"])
            gone = w["state"] != "active"
            beaten = w["last_seen_ms"] - first["created_ms"] > 2 * WORKER_TIMEOUT_MS
            return w if gone or beaten else None
        w = harness.wait_until(beaten_past_two_timeouts_or_gone, timeout=30,
                               what=lambda: "beats past two timeouts:\n" + agent.log())
        self.assertEqual(w["state"], "active", agent.log())
        self.assertEqual(w["progress"], "waiting for queue %s to be created" % q)
        self.assertEqual([x["id"] for x in self.queue_workers(q)], [first["id"]])
        self.c.put_queue(q)
        harness.wait_until(lambda: self.c.worker(first["id"])["progress"] == "idle", timeout=30,
                           what=lambda: "the worker idle on its queue:\n" + agent.log())

    def test_a_standalone_python_worker_counts_before_its_queue_exists(self):
        """``python3 -m muster.worker --queue Q`` registers before it leases, and so
        before it finds out that its queue does not exist yet."""
        q = self.qname()
        log_path = os.path.join(self.work, "worker.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["/usr/bin/python3", "-m", "muster.worker", "--queue", q, "--url",
                 self.head.url, "--token", self.head.token],
                env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
                stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(harness.stop_process, proc)

        def log():
            with open(log_path, errors="replace") as f:
                return f.read()
        harness.wait_until(lambda: waiting_lines(log(), q) == 1, timeout=30,
                           what=lambda: "the worker to wait for its queue:\n" + log())
        with muster.Pool(pool_workers.Echo, {"k": 3, "dir": self.work}, client=self.c,
                         queue=q) as pool:
            self.assertEqual(pool.get_workers_count(), 1, log())
            self.assertEqual([r["y"] for r in pool.map(range(3))], [0, 3, 6])

    def test_a_muster_worker_alone_still_refuses_a_missing_queue_registering_nothing(self):
        """Without a node agent a missing queue is the user's mistake, said at once: the
        worker checks it before it registers, so no worker is left on the head."""
        q = self.qname()
        r = subprocess.run([harness.MUSTER_BIN, "worker", "--url", self.head.url, "--token",
                            self.head.token, "--queue", q, "--", "cat"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        err = r.stderr.decode()
        self.assertEqual(r.returncode, 1, err)
        self.assertIn("create it with `muster queue create %s`" % q, err)
        self.assertEqual(self.queue_workers(q), [])   # active or gone


if __name__ == "__main__":
    unittest.main()
