"""Bounds on anonymous DistCompute clients (docs/dashboard.md "DistCompute compatibility",
compat_bounds.c): a cap on a pipeline's active workers (--distcompute-max-workers), and the
deletion of DistCompute workers that went without doing anything, which leaves the
leaderboard as it was."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from test_distcompute import DCClient, TrackerError  # noqa: E402


class CapTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head(["--distcompute", "cap=cap_a", "--distcompute-max-workers",
                                  "2"]).start()
        self.addCleanup(self.head.cleanup)
        self.url = self.head.url + "/compat/distcompute/cap"

    def refused(self):
        with self.assertRaises(TrackerError) as cm:
            DCClient(self.url, "a")
        return cm.exception

    def test_cap_refuses_one_more_and_a_bye_frees_a_slot(self):
        first, _second = DCClient(self.url, "a"), DCClient(self.url, "a")
        e = self.refused()
        self.assertEqual(e.status, 503)
        self.assertIn("--distcompute-max-workers 2", e.text)
        self.assertIn("'cap' has 2 active workers", e.text)
        self.refused()
        # Logged once a minute at most: two refusals, one line.
        self.assertEqual(self.head.log().count("distcompute api/new refused"), 1)
        first.bye()
        DCClient(self.url, "a")  # the slot the bye freed
        self.assertEqual(self.refused().status, 503)

    def test_bad_values_are_refused(self):
        for value in ("0", "-1", "ten", ""):
            with self.subTest(value=value), tempfile.TemporaryDirectory() as d:
                p = subprocess.run([harness.MUSTER_BIN, "head", "--data-dir", d,
                                    "--distcompute-max-workers", value],
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn("invalid value '%s' for --distcompute-max-workers: expected a "
                              "whole number of workers, from 1" % value, p.stderr)


class IdleDeletionTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head(["--distcompute", "idle=idle_a"],
                                 env={"MUSTER_TEST_DC_IDLE_KEEP_MS": "300"}).start()
        self.addCleanup(self.head.cleanup)
        self.url = self.head.url + "/compat/distcompute/idle"

    def get(self, path):
        r = self.head.request("GET", path)
        self.assertEqual(r.status, 200, r)
        return r.json

    def names(self):
        return {w["name"] for w in self.get("/v1/workers")["workers"]}

    def test_idle_gone_workers_go_and_the_board_stays(self):
        r = self.head.request("POST", "/v1/queues/idle_a/tasks", {"tasks": [{"payload": "x"}]})
        self.assertEqual(r.status, 201, r)
        worked = DCClient(self.url, "a", nickname="alice")
        worked.new_job()
        worked.complete_job("done")
        worked.bye()
        idle_alice = DCClient(self.url, "a", nickname="alice")
        idle_bob = DCClient(self.url, "a", nickname="bob")
        here = DCClient(self.url, "a", nickname="carol")  # active: kept
        idle_alice.bye()
        idle_bob.bye()
        # A muster worker that did nothing either: its owner had the token; kept.
        r = self.head.request("POST", "/v1/workers", {"nickname": "dave", "queues": ["idle_a"]})
        self.assertEqual(r.status, 201, r)
        plain = r.json
        self.assertEqual(self.head.request("DELETE", "/v1/workers/%d" % plain["id"]).status, 200)
        board = self.get("/v1/leaderboard")
        harness.wait_until(lambda: not {idle_alice.display_name, idle_bob.display_name}
                           & self.names(), what=lambda: "deletion: " + self.head.log()[-2000:])
        self.assertTrue({worked.display_name, here.display_name, plain["name"]} <= self.names())
        self.assertEqual(self.get("/v1/leaderboard"), board)
        alice = [e for e in board["leaderboard"] if e["nickname"] == "alice"][0]
        self.assertEqual((alice["completed"], alice["workers"]), (1, 1))
        self.assertNotIn("bob", [e["nickname"] for e in board["leaderboard"]])
        # A deleted worker's token is one the head never gave.
        with self.assertRaises(TrackerError) as cm:
            idle_bob.log("x")
        self.assertEqual(cm.exception.status, 404)
        self.assertIn("No worker of pipeline 'idle' has this token", cm.exception.text)


if __name__ == "__main__":
    unittest.main()
