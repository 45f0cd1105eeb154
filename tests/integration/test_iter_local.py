"""Node-local iterations (`cluster_sync: false`, docs/node.md, docs/iterations.md):
the agent a client talks to keeps the iteration's state, so each sample is consumed
once per node; a lease that expires on a node is taken over on that node; the head
never sees such an iteration; `cluster_sync: true` through an agent lives on the head
and is shared cluster-wide; an omitted `cluster_sync` is `true` on a multi-node
cluster and `false` on one node (through an agent), and `true` on the head; the blocks a
rank holds are listed by the agent that holds the iteration.
"""
import collections
import os
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402

N = 103


def create(via, name, **fields):
    body = {"name": name, "dataset": {"num_samples": N}, "block_size": 4}
    body.update(fields)
    return via.request("POST", "/v1/iterations", body)


def lease(via, name, rank, max_blocks=2):
    r = via.request("POST", "/v1/iterations/%s/next" % name,
                    {"rank": rank, "max": max_blocks, "indices": True})
    assert r.status == 200, r
    return r.json


def ack(via, name, rank, blocks):
    return via.request("POST", "/v1/iterations/%s/ack" % name,
                       {"rank": rank, "blocks": [{"block": b["block"], "token": b["token"]}
                                                 for b in blocks]})


def drain(name, ranks):
    """ranks: [(rank, endpoint)]; they take turns until the epoch ends.  rank -> indices."""
    got = collections.defaultdict(list)
    active = list(ranks)
    deadline = time.monotonic() + 60
    while active:
        assert time.monotonic() < deadline, "the epoch did not end"
        for rank, via in list(active):
            reply = lease(via, name, rank)
            if reply["state"] in ("epoch_end", "finished"):
                active.remove((rank, via))
                continue
            if reply["state"] == "wait":
                time.sleep(0.01)
                continue
            r = ack(via, name, rank, reply["blocks"])
            assert r.status == 200, r
            for b in reply["blocks"]:
                got[rank].extend(b["indices"])
    return got


def everything(got):
    return sorted(i for indices in got.values() for i in indices)


class IterLocalTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-iter-local-test-")
        cls.head = harness.Head().start()
        cls.a = Agent(cls.head, cls.dir, "ila",
                      args=["--state-dir", os.path.join(cls.dir, "state-a")]).start()
        cls.b = Agent(cls.head, cls.dir, "ilb",
                      args=["--state-dir", os.path.join(cls.dir, "state-b")]).start()
        cls.wait_nodes(2)

    @classmethod
    def tearDownClass(cls):
        for agent in (cls.a, cls.b):
            agent.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def wait_nodes(cls, count):
        def active():
            r = cls.head.request("GET", "/v1/nodes")
            return r.status == 200 and sum(n["state"] == "active" for n in r.json["nodes"]) == count
        harness.wait_until(active, timeout=20, what="%d active nodes" % count)

    def test_each_sample_once_per_node(self):
        for agent in (self.a, self.b):
            r = create(agent, "perno", cluster_sync=False, world_size=2, strategy="dynamic",
                       shuffle="global", seed=3, rank=0)
            self.assertEqual(r.status, 201, r)
            self.assertFalse(r.json["cluster_sync"])
            self.assertEqual(r.json["node"], agent.name)
            r = create(agent, "perno", cluster_sync=False, world_size=2, strategy="dynamic",
                       shuffle="global", seed=3, rank=1)
            self.assertEqual(r.status, 200, r)  # the second rank joins, on the same node
        # The head never saw it.
        self.assertEqual(self.head.request("GET", "/v1/iterations/perno").error_code,
                         "iteration_not_found")
        names = [i["name"] for i in self.head.request("GET", "/v1/iterations").json["iterations"]]
        self.assertNotIn("perno", names)
        # Each node's ranks consume every sample exactly once.
        for agent in (self.a, self.b):
            got = drain("perno", [(0, agent), (1, agent)])
            self.assertEqual(everything(got), list(range(N)), agent.name)
            st = agent.request("GET", "/v1/iterations/perno")
            self.assertEqual(st.status, 200, st)
            self.assertEqual((st.json["cluster_sync"], st.json["node"]), (False, agent.name))
            self.assertTrue(st.json["finished"])
            self.assertEqual(sum(rk["samples"] for rk in st.json["ranks"]), N)
            listed = agent.request("GET", "/v1/iterations")
            self.assertEqual(listed.status, 200, listed)
            self.assertIn("perno", [i["name"] for i in listed.json["iterations"]])
            cp = agent.request("GET", "/v1/iterations/perno/checkpoint")
            self.assertEqual(cp.status, 200, cp)
            self.assertEqual(cp.json["name"], "perno")
        # A node-local iteration answers only with the token.
        self.assertEqual(self.a.request("GET", "/v1/iterations/perno", token=None).status, 401)
        self.assertEqual(self.a.request("POST", "/v1/iterations/perno/next", {"rank": 0},
                                        token="wrong").error_code, "unauthorized")
        # cluster_sync true for a name this node holds: the setting differs.
        r = create(self.a, "perno", cluster_sync=True, world_size=2, strategy="dynamic",
                   shuffle="global", seed=3)
        self.assertEqual(r.error_code, "invalid_state", r)
        self.assertIn("cluster_sync", r.json["error"]["message"])
        # A DELETE takes no fields, on the agent as on the head: one is refused, and
        # the iteration stays.
        r = self.a.request("DELETE", "/v1/iterations/perno", {"force": True})
        self.assertEqual(r.error_code, "invalid_argument", r)
        self.assertIn("force: unknown field", r.json["error"]["message"])
        self.assertEqual(self.a.request("GET", "/v1/iterations/perno").status, 200)
        # Delete on one node; the other keeps its own.
        r = self.a.request("DELETE", "/v1/iterations/perno")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.a.request("GET", "/v1/iterations/perno").error_code,
                         "iteration_not_found")
        self.assertEqual(self.b.request("GET", "/v1/iterations/perno").status, 200)

    def test_expired_lease_taken_over_on_the_node(self):
        r = create(self.a, "expire", cluster_sync=False, world_size=2, strategy="dynamic",
                   lease_ms=300, rank_timeout_ms=60000)
        self.assertEqual(r.status, 201, r)
        held = lease(self.a, "expire", 0, max_blocks=1)
        self.assertEqual(held["state"], "blocks")
        lost = held["blocks"][0]
        # The agent's sweep (every 100 ms) expires the lease once its 300 ms are up.
        def rank0_expired():
            st = self.a.request("GET", "/v1/iterations/expire").json
            rank0 = [rk for rk in st["ranks"] if rk["rank"] == 0][0]
            return rank0["expired"] > 0 and (st, rank0)
        st, rank0 = harness.wait_until(rank0_expired, timeout=30,
                                       what="the agent's sweep to expire rank 0's lease")
        self.assertEqual((rank0["health"], rank0["expired"]), ("failed", 1), st)
        got = drain("expire", [(1, self.a)])
        self.assertEqual(everything(got), list(range(N)))
        st = self.a.request("GET", "/v1/iterations/expire").json
        rank1 = [rk for rk in st["ranks"] if rk["rank"] == 1][0]
        self.assertGreaterEqual(rank1["taken_over"], 1, st)
        # The stale holder's ack is fenced off.
        r = ack(self.a, "expire", 0, [lost])
        self.assertEqual(r.error_code, "lease_lost", r)
        self.assertEqual(self.head.request("GET", "/v1/iterations/expire").status, 404)

    def test_cluster_sync_true_is_shared(self):
        r = create(self.a, "shared", cluster_sync=True, world_size=2, strategy="dynamic")
        self.assertEqual(r.status, 201, r)
        self.assertTrue(r.json["cluster_sync"])
        self.assertIsNone(r.json["node"])
        self.assertEqual(create(self.b, "shared", cluster_sync=True, world_size=2,
                                strategy="dynamic").status, 200)
        st = self.head.request("GET", "/v1/iterations/shared")
        self.assertEqual(st.status, 200, st)
        # One rank on each node: together they read each sample once.
        got = drain("shared", [(0, self.a), (1, self.b)])
        self.assertEqual(everything(got), list(range(N)))
        self.assertTrue(got[0] and got[1], got)

    def test_held_listed_by_the_node(self):
        """GET .../held of a node-local iteration is answered by its agent, as the head
        answers it: the blocks next leased, nothing leased by the listing, the same
        refusals; another node and the head do not know the name; a cluster-wide
        iteration's listing goes through an agent to the head."""
        r = create(self.a, "heldloc", cluster_sync=False, world_size=2, strategy="dynamic",
                   rank_timeout_ms=60000)
        self.assertEqual(r.status, 201, r)
        got = lease(self.a, "heldloc", 0)
        r = self.a.request("GET", "/v1/iterations/heldloc/held?rank=0&indices=true")
        self.assertEqual(r.status, 200, r)
        self.assertIn("muster node iterations", r.headers.get("Via", ""))
        self.assertEqual(r.json["blocks"], got["blocks"])
        self.assertEqual((r.json["total"], r.json["next"]), (2, None))
        self.assertEqual(lease(self.a, "heldloc", 1, max_blocks=1)["blocks"][0]["block"], 2)
        for query, code, message in (
                ("rank=2", "invalid_argument", "query rank: 2 is not below world_size (2)"),
                ("", "invalid_argument", "query rank: missing"),
                ("rank=0&max=x", "invalid_argument", "query max: 'x' is not an integer"),
                ("rank", "bad_request", "a query parameter has no value")):
            r = self.a.request("GET", "/v1/iterations/heldloc/held?" + query)
            self.assertEqual(r.error_code, code, (query, r))
            self.assertTrue(r.json["error"]["message"].startswith(message), (query, r))
        self.assertEqual(self.a.request("GET", "/v1/iterations/heldloc/held?rank=0",
                                        token="wrong").error_code, "unauthorized")
        for other in (self.b, self.head):
            r = other.request("GET", "/v1/iterations/heldloc/held?rank=0")
            self.assertEqual(r.error_code, "iteration_not_found", r)
        r = create(self.a, "heldhead", cluster_sync=True, world_size=2, strategy="dynamic")
        self.assertEqual(r.status, 201, r)
        got = lease(self.b, "heldhead", 1)
        r = self.a.request("GET", "/v1/iterations/heldhead/held?rank=1&indices=true")
        self.assertEqual((r.status, r.json["blocks"]), (200, got["blocks"]), r)

    def test_head_refuses_false(self):
        r = create(self.head, "onhead", cluster_sync=False)
        self.assertEqual(r.status, 400, r)
        self.assertIn("node agent", r.json["error"]["message"])
        r = create(self.head, "onhead")  # omitted on the head: true
        self.assertEqual(r.status, 201, r)
        self.assertEqual((r.json["cluster_sync"], r.json["node"]), (True, None))

    def test_zz_default_rule(self):
        # Two active nodes: an omitted cluster_sync is true (state on the head).
        r = create(self.a, "dflt2")
        self.assertEqual(r.status, 201, r)
        self.assertTrue(r.json["cluster_sync"])
        self.assertEqual(self.head.request("GET", "/v1/iterations/dflt2").status, 200)
        # One node left: false, on the agent the client talks to.
        self.assertEqual(self.b.stop(), 0)
        self.wait_nodes(1)
        r = create(self.a, "dflt1", world_size=1)
        self.assertEqual(r.status, 201, r)
        self.assertEqual((r.json["cluster_sync"], r.json["node"]), (False, "ila"))
        self.assertEqual(self.head.request("GET", "/v1/iterations/dflt1").status, 404)
        self.assertEqual(create(self.a, "dflt1", world_size=1).status, 200)  # joins, locally
        got = drain("dflt1", [(0, self.a)])
        self.assertEqual(everything(got), list(range(N)))
        # A restarted agent continues its iterations from its state dir.
        self.assertEqual(self.a.stop(), 0)
        os.unlink(self.a.lock)  # its text names the old process's port until the new one runs
        self.a.start()
        st = self.a.request("GET", "/v1/iterations/dflt1")
        self.assertEqual(st.status, 200, st)
        self.assertTrue(st.json["finished"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
