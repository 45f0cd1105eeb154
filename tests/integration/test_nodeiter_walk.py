"""A user's walk through node-local iterations next to the head's (docs/node.md,
"Node-local iterations"; docs/iterations.md, "`cluster_sync`"): where an iteration
lives must be plain from every answer, and one name must never reach two iterations
for a client of one agent.

- HEAD of a node-local iteration (its status, checkpoint) is answered by its agent,
  as GET is, not sent on to the head, which knows no such name (404).
- A create with cluster_sync true of a name an agent holds is refused naming that
  agent, not only "another cluster_sync".
- An agent refuses to make a node-local iteration of a name the head holds: it would
  hide the head's iteration from the agent's clients (their next calls would read the
  node-local one).
- An omitted cluster_sync while the head is down is refused saying how to create the
  iteration on the node regardless; an explicit false is created.
- The CLI: `iter status` says that an iteration is node-local and on which agent;
  `iter restore` takes --cluster-sync and the lease settings, so a node-local
  checkpoint can be restored as node-local.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402


def create(via, name, **fields):
    body = {"name": name, "dataset": {"num_samples": 40}, "block_size": 10}
    body.update(fields)
    return via.request("POST", "/v1/iterations", body)


def wait_active(head, count):
    def active():
        r = head.request("GET", "/v1/nodes")
        return r.status == 200 and sum(n["state"] == "active" for n in r.json["nodes"]) == count
    harness.wait_until(active, timeout=20, what="%d active nodes" % count)


class TwoNodesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-nodeiter-walk-")
        cls.head = harness.Head().start()
        cls.a = Agent(cls.head, cls.dir, "wna").start()
        cls.b = Agent(cls.head, cls.dir, "wnb").start()
        wait_active(cls.head, 2)

    @classmethod
    def tearDownClass(cls):
        for agent in (cls.a, cls.b):
            agent.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def cli(self, url, *args):
        env = harness.cli_env(self.head)
        env["MUSTER_URL"] = url
        return subprocess.run([harness.MUSTER_BIN] + list(args), capture_output=True, text=True,
                              env=env, timeout=60)

    def test_iter_ls_says_where_each_lives(self):
        self.assertEqual(create(self.b, "lsloc", cluster_sync=False).status, 201)
        self.assertEqual(create(self.head, "lshead", world_size=2, rank=0).status, 201)

        def rows(url):
            p = self.cli(url, "iter", "ls")
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = p.stdout.splitlines()
            self.assertEqual(lines[0].split(), ["NAME", "WHERE", "STRATEGY", "WORLD", "EPOCH",
                                                "DONE", "LEASED", "STATE"])
            return {line.split()[0]: line.split()[1:] for line in lines[1:]}
        through_b = rows(self.b.url)
        self.assertEqual(through_b["lsloc"][:2], ["node", "wnb"])
        self.assertEqual(through_b["lshead"][0], "head")
        self.assertEqual(through_b["lshead"][2], "2")    # WORLD
        self.assertEqual(through_b["lshead"][-1], "running")
        at_head = rows(self.head.url)
        self.assertIn("lshead", at_head)
        self.assertNotIn("lsloc", at_head)               # the head never hears of it
        p = self.cli(self.b.url, "iter", "ls", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        names = [it["name"] for it in json.loads(p.stdout)["iterations"]]
        self.assertIn("lsloc", names)

    def test_head_request_of_a_local_iteration(self):
        self.assertEqual(create(self.a, "hl", cluster_sync=False).status, 201)
        for path in ("/v1/iterations/hl", "/v1/iterations/hl/checkpoint"):
            got = self.a.request("GET", path)
            self.assertEqual(got.status, 200, got)
            r = self.a.request("HEAD", path)
            self.assertEqual((r.status, r.raw), (200, b""), path)
            self.assertEqual(int(r.headers["Content-Length"]), len(got.raw), path)
        # The head has no such iteration: a HEAD there is 404, as its GET.
        self.assertEqual(self.head.request("HEAD", "/v1/iterations/hl").status, 404)

    def test_true_for_a_local_name_says_where_it_lives(self):
        self.assertEqual(create(self.a, "lv", cluster_sync=False).status, 201)
        for fields in ({}, {"world_size": 2}):  # the same configuration, or another
            r = create(self.a, "lv", cluster_sync=True, **fields)
            self.assertEqual(r.status, 409, r)
            self.assertEqual(r.error_code, "invalid_state")
            self.assertIn("iteration 'lv' lives on this node agent, wna (cluster_sync false)",
                          r.json["error"]["message"])
        self.assertEqual(self.head.request("GET", "/v1/iterations/lv").status, 404)
        self.assertEqual(self.a.request("GET", "/v1/iterations/lv").json["node"], "wna")
        # Joined as it is, it answers as before.
        self.assertEqual(create(self.a, "lv", cluster_sync=False).status, 200)

    def test_a_local_iteration_never_hides_the_heads(self):
        r = create(self.head, "shared", world_size=2, rank=0)
        self.assertEqual(r.status, 201, r)
        r = create(self.a, "shared", cluster_sync=False, world_size=2)
        self.assertEqual(r.status, 409, r)
        self.assertEqual(r.error_code, "invalid_state")
        self.assertIn("iteration 'shared' exists on the head (cluster_sync true); a node-local "
                      "one of that name on node agent wna would hide it",
                      r.json["error"]["message"])
        # Nothing was made on the node: a rank there still reaches the head's iteration.
        st = self.a.request("GET", "/v1/iterations/shared")
        self.assertEqual((st.status, st.json["node"], st.json["cluster_sync"]), (200, None, True))
        nxt = self.a.request("POST", "/v1/iterations/shared/next", {"rank": 1})
        self.assertEqual((nxt.status, nxt.json["state"]), (200, "blocks"), nxt)
        names = [i["name"] for i in self.a.request("GET", "/v1/iterations").json["iterations"]]
        self.assertEqual(names.count("shared"), 1, names)
        # A name the head does not hold is made on the node as before.
        r = create(self.a, "nodeonly", cluster_sync=False)
        self.assertEqual((r.status, r.json["node"]), (201, "wna"), r)

    def test_cli_status_and_restore_of_a_local_iteration(self):
        self.assertEqual(create(self.b, "ckl", cluster_sync=False, world_size=2).status, 201)
        p = self.cli(self.b.url, "iter", "status", "ckl")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.startswith("ckl (node-local, on node agent wnb): round_robin"),
                        p.stdout)
        self.assertEqual(create(self.head, "ckh").status, 201)
        p = self.cli(self.head.url, "iter", "status", "ckh")
        self.assertTrue(p.stdout.startswith("ckh: round_robin"), p.stdout)
        p = self.cli(self.b.url, "iter", "checkpoint", "ckl")
        self.assertEqual(p.returncode, 0, p.stderr)
        ck = os.path.join(self.dir, "ckl.json")
        with open(ck, "w") as f:
            f.write(p.stdout)
        p = self.cli(self.b.url, "iter", "restore", "ckl2", ck, "--cluster-sync", "false",
                     "--lease-ms", "5000", "--rank-timeout-ms", "7000", "--replication", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        self.assertEqual((got["node"], got["cluster_sync"], got["lease_ms"],
                          got["rank_timeout_ms"], got["replication"]),
                         ("wnb", False, 5000, 7000, 2))
        self.assertEqual(self.head.request("GET", "/v1/iterations/ckl2").status, 404)
        # Omitted, two active nodes: on the head, as for a create.
        p = self.cli(self.b.url, "iter", "restore", "ckl3", ck)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["node"], None)
        p = self.cli(self.b.url, "iter", "restore", "ckl4", ck, "--cluster-sync", "maybe")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--cluster-sync: expected true or false", p.stderr)


class HeadDownTest(unittest.TestCase):
    def test_omitted_cluster_sync_while_the_head_is_down(self):
        work = tempfile.mkdtemp(prefix="muster-nodeiter-walk-down-")
        head = harness.Head().start()
        agent = Agent(head, work, "wnd").start()
        try:
            wait_active(head, 1)
            head.kill()
            r = create(agent, "om")
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            self.assertIn("node agent wnd cannot reach the head, which decides an omitted "
                          "cluster_sync", r.json["error"]["message"])
            self.assertIn("send cluster_sync false to create the iteration on this node",
                          r.json["error"]["message"])
            # Given, false needs no head: the name check waits for none.
            r = create(agent, "om", cluster_sync=False)
            self.assertEqual((r.status, r.json["node"]), (201, "wnd"), r)
        finally:
            agent.kill()
            head.cleanup()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
