"""Node-local iterations (cluster_sync false) as an operator meets them.

- A rank whose block lease expired: the agent runs the head's iteration code, whose
  refusal told the rank to keep its leases "by calling the head", which a node-local
  iteration never hears from.  It now names the node agent there, and the head still
  for its own iterations.
- Two agents given one --state-dir (two agents on one machine, the option copied): both
  ran the same store's iterations as their own, and the second's writes failed with
  SQLite's "database is locked".  The first to open the store holds the dir; the
  other is refused, naming it, and does not start on a dir whose store is held."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402


class LapsedAckTest(unittest.TestCase):
    def setUp(self):
        # Each process is cleaned up however far setUp gets (addCleanup runs then too).
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-iter-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.agent = Agent(self.head, self.dir, "fw-iter",
                           args=["--state-dir", os.path.join(self.dir, "state")])
        self.addCleanup(self.agent.kill)
        self.agent.start()

    def lapsed_ack(self, via, cluster_sync):
        name = "lapse-%s" % str(cluster_sync).lower()
        r = via.request("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 40}, "block_size": 4, "world_size": 2,
            "strategy": "dynamic", "lease_ms": 200, "rank_timeout_ms": 60000,
            "cluster_sync": cluster_sync})
        self.assertEqual(r.status, 201, r)
        r = via.request("POST", "/v1/iterations/%s/next" % name, {"rank": 0, "max": 1})
        self.assertEqual(r.status, 200, r)
        [block] = r.json["blocks"]

        def expired():
            ranks = via.request("GET", "/v1/iterations/" + name).json["ranks"]
            return [rk for rk in ranks if rk["rank"] == 0][0]["expired"] == 1
        harness.wait_until(expired, what="the block's lease to expire")
        r = via.request("POST", "/v1/iterations/%s/ack" % name, {
            "rank": 0, "blocks": [{"block": block["block"], "token": block["token"]}]})
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        return r.json["error"]["message"]

    def test_a_node_local_iteration_names_its_agent(self):
        message = self.lapsed_ack(self.agent, False)
        self.assertIn("drop this ack (a rank keeps its leases by calling its node agent "
                      "within lease_ms)", message)
        self.assertNotIn("the head", message)

    def test_a_head_iteration_names_the_head(self):
        message = self.lapsed_ack(self.agent, True)  # forwarded to the head
        self.assertIn("drop this ack (a rank keeps its leases by calling the head within "
                      "lease_ms)", message)


class SharedStateDirTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-state-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.state = os.path.join(self.dir, "state")
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()

    def agent(self, name, **start):
        agent = Agent(self.head, self.dir, name, args=["--state-dir", self.state])
        self.addCleanup(agent.kill)
        return agent.start(**start)

    def create(self, via, name):
        return via.request("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 40}, "cluster_sync": False})

    def test_a_state_dir_serves_one_agent(self):
        first, second = self.agent("fw-first"), self.agent("fw-second")
        self.assertEqual(self.create(first, "one").status, 201)
        r = self.create(second, "two")
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertEqual(r.json["error"]["message"],
                         "node agent fw-second: its state dir %s is in use by another node agent "
                         "(pid %d, node fw-first): two agents cannot share one; give each its "
                         "own --state-dir (the default, /var/tmp/muster-node-NAME/state, is one "
                         "per node name)" % (self.state, first.proc.pid))
        self.assertEqual(second.request("GET", "/v1/iterations/one").error_code,
                         "iteration_not_found")

        # An agent started on the held dir, whose store exists, does not start.
        third = self.agent("fw-third", wait_listen=False)
        self.assertEqual(third.proc.wait(timeout=20), 1, third.log())
        self.assertIn("node agent fw-third: its state dir %s is in use by another node agent "
                      "(pid %d, node fw-first)" % (self.state, first.proc.pid), third.log())

        # Once the first has stopped, another agent takes the dir and its iterations on.
        first.stop_checked()
        after = self.agent("fw-after")
        r = after.request("GET", "/v1/iterations/one")
        self.assertEqual((r.status, r.json["node"]), (200, "fw-after"), r)


if __name__ == "__main__":
    unittest.main()
