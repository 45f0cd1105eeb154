"""Listing the blocks a rank holds without leasing any (docs/api.md, "GET
/v1/iterations/{name}/held"; `muster iter held`): the list is what `next` leased, under
the same tokens and deadlines; it leases nothing (a later next gets the blocks it did not
take), extends no lease and does not mark the rank alive (a stuck rank listed over and
over still loses its blocks); pages by cursor; indices and takeovers as `next` gives
them; the read-only token may list; bad input is refused with what was wrong.
Node-local iterations are listed by their agent: tests/integration/test_iter_local.py.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_iter_api import create, lease, status  # noqa: E402

READ_TOKEN = "read-only-token-held-5"


def held(head, name, query, token="default"):
    return head.request("GET", "/v1/iterations/%s/held?%s" % (name, query), token=token)


def listed(head, name, rank, extra=""):
    r = held(head, name, "rank=%d%s" % (rank, extra))
    assert r.status == 200, r
    return r.json


def blocks_of(reply):
    """(block, token, deadline_ms) of each block of a next or held reply."""
    return [(b["block"], b["token"], b["deadline_ms"]) for b in reply["blocks"]]


class IterHeldTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(args=["--sweep-ms", "20", "--dashboard-token",
                                      READ_TOKEN]).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def test_lists_what_next_leased_and_leases_nothing(self):
        h = self.head
        r = create(h, "ls", dataset={"num_samples": 40}, block_size=4, strategy="dynamic",
                   world_size=2, rank_timeout_ms=60000)
        self.assertEqual(r.status, 201, r)
        got = lease(h, "ls", 0, 0, 3)
        seen_before = {r["rank"]: r["last_seen_ms"] for r in status(h, "ls")["ranks"]}
        one = listed(h, "ls", 0)
        self.assertEqual(blocks_of(one), blocks_of(got))  # same tokens, deadlines not extended
        self.assertEqual((one["rank"], one["epoch"], one["finished"], one["total"], one["next"]),
                         (0, 0, False, 3, None))
        self.assertEqual(one["blocks"][0]["begin"], got["blocks"][0]["begin"])
        self.assertNotIn("indices", one["blocks"][0])
        # Listed again: nothing changed, and a rank that holds nothing lists nothing.
        self.assertEqual(listed(h, "ls", 0), one)
        nothing = listed(h, "ls", 1)
        self.assertEqual((nothing["blocks"], nothing["total"]), ([], 0))
        st = status(h, "ls")
        self.assertEqual(st["blocks"]["leased"], 3)
        # Not a heartbeat: neither rank was marked seen by the listings.
        self.assertEqual({r["rank"]: r["last_seen_ms"] for r in st["ranks"]}, seen_before)
        self.assertEqual(st["ranks"][1]["health"], "unknown")
        # A later next gets the blocks the listings did not take.
        nxt = lease(h, "ls", 1, 0, 2)
        self.assertEqual([b["block"] for b in nxt["blocks"]], [3, 4])
        self.assertEqual(blocks_of(listed(h, "ls", 1)), blocks_of(nxt))

    def test_listing_does_not_keep_a_stuck_rank_alive(self):
        """Rank 0 leases and falls silent; listing its blocks again and again neither
        extends its leases nor keeps it alive: its blocks go back, it is failed, and rank
        1 takes them over."""
        h = self.head
        r = create(h, "stuck", dataset={"num_samples": 8}, block_size=4, strategy="dynamic",
                   world_size=2, lease_ms=300, rank_timeout_ms=300)
        self.assertEqual(r.status, 201, r)
        mine = lease(h, "stuck", 0, 0, 2)["blocks"]
        self.assertEqual(len(mine), 2)
        harness.wait_until(lambda: listed(h, "stuck", 0)["total"] == 0, timeout=10,
                           what="rank 0's leases to expire while its blocks are listed")
        self.assertEqual(status(h, "stuck")["ranks"][0]["health"], "failed")
        taken = lease(h, "stuck", 1, 0, 2)["blocks"]
        self.assertEqual(sorted(b["block"] for b in taken), [b["block"] for b in mine])

    def test_pages_indices_and_takeovers(self):
        h = self.head
        r = create(h, "pg", dataset={"num_samples": 30}, block_size=3, shuffle="global",
                   seed=5, world_size=2, replication=2, lease_ms=60000, rank_timeout_ms=1500)
        self.assertEqual(r.status, 201, r)
        got = lease(h, "pg", 0, 0, 5)  # with indices
        pages, cursor = [], 0
        while cursor is not None:
            page = listed(h, "pg", 0, "&max=2&indices=true&cursor=%d" % cursor)
            self.assertEqual(page["total"], 5)
            pages.append(page["blocks"])
            cursor = page["next"]
        self.assertEqual([len(p) for p in pages], [2, 2, 1])
        self.assertEqual(sum(pages, []), got["blocks"])  # indices and all, as next gave them
        self.assertEqual(listed(h, "pg", 0, "&cursor=3")["blocks"], [
            {k: v for k, v in b.items() if k != "indices"} for b in got["blocks"][3:]])
        # Rank 0 falls silent (listing is no heartbeat); its replica, rank 1, takes its
        # blocks over: listed as takeovers, as `next` with "held" marks them.
        harness.wait_until(lambda: status(h, "pg")["ranks"][0]["health"] == "failed",
                           timeout=10, what="rank 0 to fail")
        theirs = lease(h, "pg", 1, 0, 10)["blocks"]
        taken = [b for b in theirs if b["takeover"]]
        self.assertEqual(sorted(b["block"] for b in taken), [b["block"] for b in got["blocks"]])
        self.assertEqual([b["takeover"] for b in listed(h, "pg", 1)["blocks"]],
                         [b["takeover"] for b in sorted(theirs, key=lambda b: b["block"])])

    def test_finished_iteration_lists_none(self):
        h = self.head
        self.assertEqual(create(h, "fin", dataset={"num_samples": 4}, block_size=4).status, 201)
        got = lease(h, "fin", 0, 0, 1)["blocks"]
        r = h.request("POST", "/v1/iterations/fin/ack",
                      {"rank": 0, "blocks": [{"block": b["block"], "token": b["token"]}
                                             for b in got]})
        self.assertTrue(r.json["finished"], r)
        one = listed(h, "fin", 0)
        self.assertEqual((one["finished"], one["blocks"], one["total"]), (True, [], 0))

    def test_read_only_token_may_list(self):
        h = self.head
        self.assertEqual(create(h, "ro", dataset={"num_samples": 8}, block_size=4).status, 201)
        lease(h, "ro", 0, 0, 1)
        r = held(h, "ro", "rank=0", token=READ_TOKEN)
        self.assertEqual((r.status, r.json["total"]), (200, 1), r)
        r = h.request("POST", "/v1/iterations/ro/next", {"rank": 0}, token=READ_TOKEN)
        self.assertEqual(r.error_code, "forbidden", r)

    def test_bad_input(self):
        h = self.head
        self.assertEqual(create(h, "bad", dataset={"num_samples": 8}, block_size=4,
                                world_size=2).status, 201)
        for query, code, message in (
                ("", "invalid_argument", "query rank: missing; name the rank whose blocks to "
                 "list (?rank=R)"),
                ("rank=2", "invalid_argument", "query rank: 2 is not below world_size (2)"),
                ("rank=-1", "invalid_argument", "query rank: '-1' is out of range; it must be "
                 "from 0 to 65535"),
                ("rank=one", "invalid_argument", "query rank: 'one' is not an integer"),
                ("rank=0&max=0", "invalid_argument", "query max: '0' is out of range; it must "
                 "be from 1 to 1000"),
                ("rank=0&max=1001", "invalid_argument", "query max: '1001' is out of range"),
                ("rank=0&cursor=x", "invalid_argument", "query cursor: 'x' is not an integer"),
                ("rank=0&indices=1", "invalid_argument", "query indices: '1' is not true or "
                 "false")):
            r = held(h, "bad", query)
            self.assertEqual((r.status, r.error_code), (400, code), (query, r))
            self.assertTrue(r.json["error"]["message"].startswith(message), (query, r))
        r = held(h, "nosuch", "rank=0")
        self.assertEqual((r.status, r.error_code), (404, "iteration_not_found"), r)
        self.assertIn("'nosuch'", r.json["error"]["message"])
        # More indices than a reply may hold: refused when asked for, fitted by default.
        self.assertEqual(create(h, "big", dataset={"num_samples": 1 << 21},
                                block_size=1 << 19).status, 201)
        r = held(h, "big", "rank=0&max=3&indices=true")
        self.assertEqual(r.error_code, "batch_too_large", r)
        self.assertIn("query max: 3 blocks of 524288 samples", r.json["error"]["message"])
        self.assertEqual(held(h, "big", "rank=0&indices=true").status, 200)
        self.assertEqual(held(h, "big", "rank=0&max=3").status, 200)
        # Nothing of that was a rank's call.
        self.assertEqual([r["health"] for r in status(h, "bad")["ranks"]], ["unknown"] * 2)


class IterHeldCliTest(unittest.TestCase):
    def run_cli(self, head, *args):
        return subprocess.run([harness.MUSTER_BIN] + list(args), env=harness.cli_env(head),
                              capture_output=True, text=True, timeout=60)

    def test_cli_held(self):
        with harness.Head() as h:
            p = self.run_cli(h, "iter", "create", "c", "--num-samples", "12", "--block-size",
                             "2", "--strategy", "dynamic", "--world-size", "2")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(self.run_cli(h, "iter", "held", "c", "--rank", "0").stdout, "")
            p = self.run_cli(h, "iter", "next", "c", "--rank", "0", "--max", "2")
            self.assertEqual(p.returncode, 0, p.stderr)
            leased = p.stdout
            p = self.run_cli(h, "iter", "held", "c", "--rank", "0", "--indices")
            self.assertEqual((p.returncode, p.stderr), (0, ""))
            self.assertEqual(p.stdout, leased)  # the lines next printed, indices and all
            p = self.run_cli(h, "iter", "held", "c", "--rank", "0")
            self.assertEqual(p.stdout, "".join(
                line.split(',"indices"')[0] + "}\n" for line in leased.splitlines()))
            # It leased nothing: rank 1's next gets the block after rank 0's.
            p = self.run_cli(h, "iter", "next", "c", "--rank", "1")
            self.assertIn('"block":2,', p.stdout)
            for args, code, want in (
                    (["c"], 2, "muster: 'iter held' needs --rank R\n"),
                    (["c", "--rank", "x"], 2, "muster: --rank"),
                    (["c", "--rank", "2"], 1, "muster: invalid_argument: query rank: 2 is not "
                     "below world_size (2)\n"),
                    (["nosuch", "--rank", "0"], 1, "muster: iteration_not_found: iteration "
                     "'nosuch' does not exist (not on the head; one created with cluster_sync "
                     "false is answered only by the node agent that holds it: send its "
                     "requests to that agent)\n")):
                p = self.run_cli(h, "iter", "held", *args)
                self.assertEqual((p.returncode, p.stdout), (code, ""), (args, p.stderr))
                self.assertTrue(p.stderr.startswith(want), (args, p.stderr))


if __name__ == "__main__":
    unittest.main(verbosity=2)
