"""A node agent under an operator's mistakes and failures (docs/node.md).

- Two agents given one --cache-dir: each counted only its own files against
  --cache-bytes, and each removed the other's fetches in progress as it started (it
  empties DIR/tmp).  The first to use the dir holds it (DIR/@agent.lock); the other is
  refused, naming it: it does not start on a dir that is held, and one that was given
  the dir before the first made it serves its reads from the head, uncached.
"""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402


class SharedCacheDirTest(unittest.TestCase):
    def setUp(self):
        # Each process is cleaned up however far setUp gets (addCleanup runs then too).
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-cache-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.cache = os.path.join(self.dir, "cache")
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.data = os.urandom(100000)
        r = self.head.request("PUT", "/v1/shared/sc/w", raw=self.data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)

    def agent(self, name, **start):
        agent = Agent(self.head, self.dir, name, args=["--cache-dir", self.cache])
        self.addCleanup(agent.kill)
        return agent.start(**start)

    def refusal(self, holder):
        return ("the cache dir %s is in use by another node agent (pid %d, node %s): two agents "
                "cannot share one (each counts only its own files against --cache-bytes, and "
                "removes the other's fetches in progress as it starts); give each its own "
                "--cache-dir (the default, /var/tmp/muster-node-NAME/cache, is one per node "
                "name)" % (self.cache, holder.proc.pid, holder.name))

    def read(self, agent):
        r = agent.request("GET", "/v1/shared/sc/w")
        self.assertEqual((r.status, r.raw == self.data), (200, True), r)
        return r.headers.get("X-Muster-Cache")

    def test_a_cache_dir_serves_one_agent(self):
        # Both start before the dir exists; the first to store a level holds it.
        first, second = self.agent("fw-first"), self.agent("fw-second")
        self.assertFalse(os.path.exists(self.cache))
        self.assertEqual(self.read(first), "miss")
        self.assertEqual(self.read(second), None)  # forwarded: from the head, uncached
        self.assertEqual(self.read(second), None)
        harness.wait_until(lambda: self.refusal(first) in second.log(),
                           what=lambda: "the refusal in the second agent's log:\n" +
                           second.log())
        self.assertEqual(second.log().count(self.refusal(first)), 1, second.log())  # once
        stats = second.request("GET", "/v1/node/cache").json
        self.assertEqual((stats["uncached"], stats["entries"]), (2, 0), stats)
        self.assertEqual(self.read(first), "hit")

        # An agent started on the held dir, which exists now, does not start.
        third = self.agent("fw-third", wait_listen=False)
        self.assertEqual(third.proc.wait(timeout=20), 1, third.log())
        self.assertIn("muster node: " + self.refusal(first), third.log())

        # Once the first has stopped, another agent takes the dir and its levels on.
        first.stop_checked()
        after = self.agent("fw-after")
        self.assertEqual(self.read(after), "hit")

    def test_the_lock_removed_with_the_dir_is_taken_again(self):
        first = self.agent("fw-first")
        self.assertEqual(self.read(first), "miss")
        shutil.rmtree(self.cache)  # everything, the lock file too
        self.assertEqual(self.read(first), "miss")  # stored again, the dir claimed again
        second = self.agent("fw-second", wait_listen=False)
        self.assertEqual(second.proc.wait(timeout=20), 1, second.log())
        self.assertIn(self.refusal(first), second.log())


if __name__ == "__main__":
    unittest.main()
