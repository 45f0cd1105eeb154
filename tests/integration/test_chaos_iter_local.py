"""A node-local iteration outlives kill -9 of the node agent that holds it.

docs/node.md "Node-local iterations": the agent keeps a `cluster_sync: false` iteration
in its own store (STATE_DIR/iterations.db), each request committed on its own, so "the
state survives the agent's crash and restart (an agent started on an existing
iterations.db continues its iterations)", and no block is done twice under one token.
Two ranks read blocks through agent A and acknowledge them; rank 0 holds one block
unacknowledged and rank 1's last ack is answered just before A is killed with -9.
Checks:
- while A is down, a client of A is refused at once (nothing listens), and a client that
  asks agent B (another node) for the iteration gets a prompt 404 that says such an
  iteration is answered only by the agent that holds it, not a hang;
- A started again (same name, lock file and state dir, same port) answers for the
  iteration: every acknowledgement is kept (blocks, samples per rank), rank 1's last ack
  sent again counts once, rank 0's block is still leased to it under its token and its
  ack is taken; blocks leased from then on carry newer tokens; the two ranks finish the
  epoch, and every sample was read exactly once across the kill.
"""
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402
from test_node_takeover import start_agent  # noqa: E402

N = 103
BLOCK = 4
# How long a request may take while agent A is down: it is answered, not held.
DOWN_S = 10


class Rank:
    """One rank of the iteration `name` reading through `agent`, keeping what it read."""

    def __init__(self, agent, name, rank):
        self.agent, self.name, self.rank = agent, name, rank
        self.read, self.tokens = [], []

    def post(self, op, body):
        r = self.agent.request("POST", "/v1/iterations/%s/%s" % (self.name, op),
                               dict(body, rank=self.rank))
        assert r.status == 200, (op, r)
        return r.json

    def lease(self, max_blocks=2):
        reply = self.post("next", {"max": max_blocks, "indices": True})
        self.tokens += [b["token"] for b in reply.get("blocks", [])]
        return reply

    def ack(self, blocks):
        reply = self.post("ack", {"blocks": [{"block": b["block"], "token": b["token"]}
                                             for b in blocks]})
        for b in blocks:
            self.read += b["indices"]
        return reply

    def step(self):
        """Leases blocks and acknowledges them; the lease's state."""
        reply = self.lease()
        if reply["state"] == "blocks":
            self.ack(reply["blocks"])
        return reply["state"]


class ChaosIterLocalTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-chaos-iter-local-")
        self.head = harness.Head().start()
        self.a = self.agent("cila")
        self.b = self.agent("cilb")
        self.a.start()
        self.b.start()

    def tearDown(self):
        for agent in (self.a, self.b):
            agent.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def agent(self, name):
        return Agent(self.head, self.dir, name,
                     args=["--state-dir", os.path.join(self.dir, "state-" + name)])

    def status(self, via):
        r = via.request("GET", "/v1/iterations/loc", timeout=DOWN_S)
        self.assertEqual(r.status, 200, r)
        return r.json

    def restart_a(self):
        """Agent A again, with its name, lock file, state dir and port."""
        port = self.a.port
        again = self.agent(self.a.name)
        again.argv = lambda: [arg.replace("127.0.0.1:0", "127.0.0.1:%d" % port)
                              for arg in Agent.argv(again)]
        self.a = start_agent(again)
        self.assertEqual(self.a.port, port)

    def while_a_is_down(self):
        began = time.monotonic()
        with self.assertRaises(ConnectionRefusedError):
            self.a.request("GET", "/v1/iterations/loc", timeout=DOWN_S)
        for method, path, body in (("POST", "/v1/iterations/loc/next", {"rank": 0}),
                                   ("GET", "/v1/iterations/loc", None)):
            r = self.b.request(method, path, body, timeout=DOWN_S)
            self.assertEqual((r.status, r.error_code), (404, "iteration_not_found"), r)
            message = r.json["error"]["message"]
            self.assertIn("iteration 'loc' does not exist", message)
            self.assertIn("cluster_sync false", message)
            self.assertIn("only by the node agent", message)
        self.assertLess(time.monotonic() - began, DOWN_S)

    def test_agent_killed_and_restarted(self):
        body = {"name": "loc", "dataset": {"num_samples": N}, "block_size": BLOCK,
                "cluster_sync": False, "world_size": 2, "strategy": "dynamic",
                "shuffle": "global", "seed": 5, "lease_ms": 60000, "rank_timeout_ms": 60000}
        for rank in (0, 1):
            r = self.a.request("POST", "/v1/iterations", dict(body, rank=rank))
            self.assertIn(r.status, (200, 201), r)
            self.assertEqual((r.json["cluster_sync"], r.json["node"]), (False, self.a.name))
        ranks = [Rank(self.a, "loc", 0), Rank(self.a, "loc", 1)]
        for _ in range(3):
            for rank in ranks:
                self.assertEqual(rank.step(), "blocks")
        held = ranks[0].lease(max_blocks=1)["blocks"]
        last = ranks[1].lease(max_blocks=1)["blocks"]
        ranks[1].ack(last)
        before = self.status(self.a)
        self.a.kill()

        self.while_a_is_down()

        self.restart_a()
        for rank in ranks:
            rank.agent = self.a
        after = self.status(self.a)
        self.assertEqual(after["blocks"], before["blocks"])
        self.assertEqual([(rk["rank"], rk["samples"], rk["blocks"]) for rk in after["ranks"]],
                         [(rk["rank"], rk["samples"], rk["blocks"]) for rk in before["ranks"]])
        r = self.a.request("GET", "/v1/iterations/loc/held?rank=0")
        self.assertEqual(r.status, 200, r)
        self.assertEqual([(b["block"], b["token"]) for b in r.json["blocks"]],
                         [(b["block"], b["token"]) for b in held])
        again = ranks[1].post("ack", {"blocks": [{"block": b["block"], "token": b["token"]}
                                                 for b in last]})
        self.assertEqual((again["acked"], again.get("repeated")), (1, 1), again)
        ranks[0].ack(held)

        newest = max(ranks[0].tokens + ranks[1].tokens)
        counts = [len(rank.tokens) for rank in ranks]
        deadline = time.monotonic() + 30
        states = {}
        while set(states.values()) - {"epoch_end", "finished"} or len(states) < 2:
            self.assertLess(time.monotonic(), deadline, "the epoch did not end: %s" % states)
            for rank in ranks:
                states[rank.rank] = rank.step()
        later = [t for rank, count in zip(ranks, counts) for t in rank.tokens[count:]]
        self.assertTrue(later, "no block was leased after the restart")
        self.assertGreater(min(later), newest, "a token was handed out again")
        self.assertEqual(sorted(ranks[0].read + ranks[1].read), list(range(N)))
        self.assertTrue(self.status(self.a)["finished"])
        for agent in (self.a, self.b):
            self.assertEqual(agent.stop(), 0, agent.log())
            self.assertNotIn("Sanitizer", agent.log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
