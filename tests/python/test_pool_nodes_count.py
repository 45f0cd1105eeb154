"""A pool's nodes count, in Python and in C, on one setup: the machines that run an active
worker of the pool's queue.

Python's ``Pool.get_nodes_count()`` counted those (a worker without a node as a machine of
its own), while C's ``muster_pool_nodes_count`` counted every active node of the head, so
a node whose workers serve another queue counted in C and a standalone worker did not.
The C count is read by tests/integration/driver_pool_counts.c, attached to the Python
pool's session."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from common import ROOT, HeadTestCase, harness, muster

sys.path.append(os.path.join(ROOT, "tests", "integration"))   # after tests/python: its test_* names win
import node_harness  # noqa: E402

import pool_workers  # noqa: E402

DRIVER = os.path.join(os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(harness.MUSTER_BIN),
                      "driver_pool_counts")


class NodesCountTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        self.work = tempfile.mkdtemp(prefix="muster-nodes-count-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.procs = []

    def start_agent(self, name, queue, workers):
        agent = node_harness.Agent(self.head, self.work, name=name,
                                   args=["--queue", queue, "--workers", str(workers)],
                                   cmd=["cat"])
        self.addCleanup(agent.stop)
        agent.start()
        self.procs.append(agent)
        return agent

    def start_standalone_worker(self, queue):
        log_path = os.path.join(self.work, "worker-%d.log" % len(self.procs))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([harness.MUSTER_BIN, "worker", "--url", self.head.url,
                                     "--token", self.head.token, "--queue", queue, "--", "cat"],
                                    stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(harness.stop_process, proc)
        self.procs.append(proc)

    def logs(self):
        return "\n".join(p.log() for p in self.procs if isinstance(p, node_harness.Agent))

    def active_workers(self, queue):
        return [w for w in self.c.workers()
                if w["state"] == "active" and queue in (w.get("queues") or [])]

    def wait_workers(self, queue, n):
        harness.wait_until(lambda: len(self.active_workers(queue)) == n, timeout=30,
                           what=lambda: "%d workers on %s:\n%s" % (n, queue, self.logs()))

    def c_counts(self, pool):
        r = subprocess.run([DRIVER, self.head.url, self.head.token, pool.queue, pool.session],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        out = r.stdout.decode()
        self.assertEqual(r.returncode, 0, out + r.stderr.decode())
        words = out.split()
        self.assertEqual(words[0::2], ["workers", "nodes"], out)
        return int(words[1]), int(words[3])

    def test_machines_with_a_worker_of_the_queue_in_python_and_c(self):
        q, other = self.qname(), self.qname("other")
        with muster.Pool(pool_workers.Echo, {"k": 1, "dir": self.work}, client=self.c,
                         queue=q) as pool:
            self.start_agent("serving", q, 2)
            self.start_agent("elsewhere", other, 1)
            self.wait_workers(q, 2)
            self.wait_workers(other, 1)
            self.assertEqual(len([n for n in self.c.nodes() if n["state"] == "active"]), 2)
            # Two nodes are up; one of them runs the pool's workers.
            self.assertEqual((pool.get_workers_count(), pool.get_nodes_count()), (2, 1))
            self.assertEqual(self.c_counts(pool), (2, 1))

            # A worker started without an agent is a machine of its own.
            self.start_standalone_worker(q)
            self.wait_workers(q, 3)
            self.assertEqual([w["node"] for w in self.active_workers(q)].count(None), 1)
            self.assertEqual((pool.get_workers_count(), pool.get_nodes_count()), (3, 2))
            self.assertEqual(self.c_counts(pool), (3, 2))

            # A worker that names no queue serves none in either count (C counted it as
            # one that may lease from any queue).
            self.c.request("POST", "/v1/workers", {"nickname": "queueless"})
            self.assertEqual((pool.get_workers_count(), pool.get_nodes_count()), (3, 2))
            self.assertEqual(self.c_counts(pool), (3, 2))


if __name__ == "__main__":
    unittest.main()
