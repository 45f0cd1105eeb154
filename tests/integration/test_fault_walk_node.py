"""What a node agent says when the head no longer holds its node (docs/node.md, "When
the head goes away").

The agent said "the head forgot this node (it timed out)" for every `node_not_found`,
also when the head at its URL had never had the node: a head started on an empty data
dir (the wrong --data-dir after a restart), one restored from an older backup, another
head at that address.  It now tells the two apart by the head's answer ("is gone" for a
node that timed out, "does not exist" for one it never had), and registers again in
both cases.
"""
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402

NEW_HEAD = ("the head does not know this node (it lost its data, was restored from a backup, "
            "or is another head at this URL); registering again")
TIMED_OUT = "the head forgot this node (it timed out); registering again"


class ForgottenNodeTest(unittest.TestCase):
    def setUp(self):
        # Each process is cleaned up however far setUp gets (addCleanup runs then too).
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-node-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.listen = ["--listen", "127.0.0.1:%d" % harness.free_port(),
                       "--node-timeout-ms", "1000"]
        self.heads = [self.head()]
        self.agent = Agent(self.heads[0], self.dir, "fw-node")
        self.addCleanup(self.agent.kill)
        self.agent.start()
        # The agent's own word that it has the head's answer (its lock file's `registered
        # yes`), not only the head's node: a head killed between its commit and that
        # answer leaves the agent registering still, and no heartbeat of it ever meets
        # the other head's node_not_found.
        harness.wait_until(lambda: self.node_state(self.heads[0]) == "active" and
                           self.agent.registered(), timeout=20,
                           what=lambda: "the agent to register:\n" + self.agent.log())

    def head(self):
        head = harness.Head(self.listen)
        self.addCleanup(head.cleanup)
        return head.start()

    def wait_log(self, text, count=1):
        harness.wait_until(lambda: self.agent.log().count(text) >= count, timeout=20,
                           what=lambda: "%r in the agent's log:\n%s" % (text, self.agent.log()))

    def node_state(self, head):
        r = head.request("GET", "/v1/nodes/fw-node")
        return r.json["state"] if r.status == 200 else r.error_code

    def test_another_head_at_the_url(self):
        self.heads[0].kill()
        other = self.head()  # a fresh data dir, the same URL and token
        self.wait_log(NEW_HEAD)
        self.wait_log("registered with the head again")
        self.assertEqual(self.node_state(other), "active")
        self.assertNotIn(TIMED_OUT, self.agent.log())

    def test_a_node_that_timed_out(self):
        head = self.heads[0]
        self.agent.proc.send_signal(signal.SIGSTOP)
        try:
            harness.wait_until(lambda: self.node_state(head) == "gone", timeout=20,
                               what="the stopped agent's node to time out")
        finally:
            self.agent.proc.send_signal(signal.SIGCONT)
        self.wait_log(TIMED_OUT)
        self.wait_log("registered with the head again")
        self.assertEqual(self.node_state(head), "active")
        self.assertNotIn(NEW_HEAD, self.agent.log())


if __name__ == "__main__":
    unittest.main()
