"""Retention of done tasks (a queue's keep_done_ms, docs/api.md): the head removes done
tasks that long after their completion, in the background, and nothing else.

The head has no test clock: retentions here are short (1-2 s) and every wait is a poll
with a deadline.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase, OwnHeadTestCase, STATES, harness, now_ms  # noqa: E402

KEEP_MS = 1500


class RetentionTest(ApiTestCase):

    def complete(self, leases, result="r"):
        items = [{"task": l["task"], "token": l["token"], "result": result} for l in leases]
        return self.ack("complete", items)

    def task_status(self, tid):
        return self.call("GET", "/v1/tasks/%d" % tid).status

    def recount(self):
        """The counts as a listing of every task reads them: the kept counts must agree."""
        by_state = {s: 0 for s in STATES}
        for t in self.list_tasks():
            by_state[t["state"]] += 1
        self.assertEqual({s: self.counts()[s] for s in STATES}, by_state)
        return by_state

    def reaped_metric(self):
        text = self.call("GET", "/metrics").raw.decode()
        line = 'muster_tasks_reaped_total{queue="%s"} ' % self.q
        for row in text.splitlines():
            if row.startswith(line):
                return int(row[len(line):])
        return 0

    def test_done_tasks_removed_after_their_completion_and_nothing_else(self):
        self.create_queue(keep_done_ms=KEEP_MS, max_attempts=1, backoff_ms=0, backoff_max_ms=0)
        worker = self.register(nickname="keeper-" + self.q[-20:])["id"]
        # All created now; four completed at once (A), two later (B), the rest never.
        ids = self.put(*range(10))
        leases = self.lease(max=10, worker=worker)
        a, b = leases[:4], leases[4:6]
        self.complete(a)
        done_a = max(self.get_task(l["task"])["updated_ms"] for l in a)
        self.ack("fail", [{"task": leases[6]["task"], "token": leases[6]["token"],
                           "permanent": True}])
        self.ack("fail", [{"task": leases[7]["task"], "token": leases[7]["token"]}])  # dead
        # leases[8] stays leased; ids[9] was leased too: release it back to queued.
        self.ack("release", [{"task": leases[9]["task"], "token": leases[9]["token"]}])
        self.assert_counts(queued=1, leased=3, done=4, failed=1, dead=1)  # B still leased

        # B completes about 1 s after A: when A is due, B is not.
        completed_b = []

        def a_gone():
            if not completed_b and now_ms() >= done_a + 1000:
                self.complete(b)
                completed_b.append(max(self.get_task(l["task"])["updated_ms"] for l in b))
            return completed_b and all(self.task_status(l["task"]) == 404 for l in a)
        harness.wait_until(a_gone, timeout=15, interval=0.05, what="the first done tasks to go")
        gone_at = now_ms()
        self.assertGreaterEqual(gone_at, done_a + KEEP_MS - 50, "removed before their time")
        self.assertLess(gone_at, completed_b[0] + KEEP_MS, "B must still be young")
        for l in b:
            self.assertEqual(self.get_task(l["task"])["state"], "done")
        self.assertEqual(self.recount(), dict.fromkeys(STATES, 0) | {
            "queued": 1, "leased": 1, "done": 2, "failed": 1, "dead": 1})

        harness.wait_until(lambda: self.counts()["done"] == 0, timeout=15, interval=0.05,
                           what="the later done tasks to go")
        self.assertGreaterEqual(now_ms(), completed_b[0] + KEEP_MS - 50)
        self.assertEqual(self.recount(), dict.fromkeys(STATES, 0) | {
            "queued": 1, "leased": 1, "failed": 1, "dead": 1})
        kept = {t["id"]: t["state"] for t in self.list_tasks()}
        self.assertEqual(kept, {leases[6]["task"]: "failed", leases[7]["task"]: "dead",
                                leases[8]["task"]: "leased", leases[9]["task"]: "queued"})
        self.assertEqual(set(kept) | {l["task"] for l in a + b}, set(ids))
        self.assertEqual(self.get_queue()["reaped"], 6)
        self.assertEqual(self.reaped_metric(), 6)

        r = self.expect_error("GET", "/v1/tasks/%d" % a[0]["task"], None, 404, "task_not_found")
        self.assertIn("keep_done_ms", r.json["error"]["message"])
        # The leaderboard counts the worker's completions, not the tasks still kept.
        board = {e["nickname"]: e for e in self.expect("GET", "/v1/leaderboard")["leaderboard"]}
        self.assertEqual(board["keeper-" + self.q[-20:]]["completed"], 6)

    def test_tasks_of_an_open_session_stay_until_it_closes(self):
        self.create_queue(keep_done_ms=0)
        sid = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        self.expect("POST", "/v1/sessions/%s/tasks" % sid,
                    {"tasks": [{"payload": "in session"}]}, status=201)
        plain = self.put("plain")[0]
        leases = self.lease(max=2)
        self.assertEqual(len(leases), 2)
        self.complete(leases, result="ok")
        other = self.qname("o")
        self.create_queue(other)
        self.put("newer", name=other)  # the newest task stays while it is (see below)
        harness.wait_until(lambda: self.task_status(plain) == 404, timeout=15, interval=0.05,
                           what="the done task outside the session to go")
        self.assert_counts(done=1)
        results = self.expect("GET", "/v1/sessions/%s/results" % sid)
        self.assertEqual([(r["index"], r["state"], r["result"]) for r in results["results"]],
                         [(0, "done", "ok")])
        self.expect("DELETE", "/v1/sessions/" + sid)
        self.assert_counts()

    def test_a_removed_tasks_id_is_never_given_again(self):
        # SQLite would give a new task the highest id + 1: with the task of the highest
        # id removed, the next put would get its id, and a client holding the old id
        # would read another task.  The head hands ids out itself.
        self.create_queue(keep_done_ms=0)
        older, newest = self.put("older", "newest")
        leases = self.lease(max=2)
        self.assertEqual(len(leases), 2)
        self.complete(leases, result="r")
        harness.wait_until(lambda: self.task_status(newest) == 404, timeout=15, interval=0.05,
                           what="the newest done task to go")
        self.assertEqual(self.task_status(older), 404)
        later = self.put("later")[0]
        self.assertGreater(later, newest)
        self.assertEqual(self.task_status(newest), 404)
        self.assertEqual(self.call("GET", "/v1/tasks/%d" % later).json["payload"], "later")

    def test_flag_whose_parent_was_removed_goes_dead(self):
        second = self.qname("b")
        self.create_queue(second, max_flags=1)
        self.create_queue(next=second, keep_done_ms=0)
        parent = self.put("input")[0]
        self.complete(self.lease(), result="output")
        harness.wait_until(lambda: self.task_status(parent) == 404, timeout=15, interval=0.05,
                           what="the first stage's done task to go")
        child = self.lease_one(second)
        self.assertEqual(child["parent"], parent)
        flagged = self.ack("flag", [{"task": child["task"], "token": child["token"],
                                     "reason": "bad input"}])["flagged"][0]
        # Nothing to roll back to: dead, as at a first stage, not cancelled.
        self.assertEqual((flagged["state"], flagged["reopened"]), ("dead", None))
        self.assert_counts(second, dead=1)
        self.assert_counts()

    def test_setting_validated_shown_and_kept(self):
        q = self.create_queue()
        self.assertIsNone(q["keep_done_ms"])
        self.assertEqual(q["reaped"], 0)
        for bad in (-1, "1s", 1.5, True, {}, 10 ** 15):
            r = self.expect_error("PUT", "/v1/queues/" + self.q, {"keep_done_ms": bad}, 400,
                                  "invalid_argument")
            self.assertIn("keep_done_ms", r.json["error"]["message"])
        self.assertIsNone(self.get_queue()["keep_done_ms"])
        self.assertEqual(self.expect("PUT", "/v1/queues/" + self.q,
                                     {"keep_done_ms": 86400000})["keep_done_ms"], 86400000)
        q = self.expect("PUT", "/v1/queues/" + self.q, {"lease_ms": 5000})
        self.assertEqual(q["keep_done_ms"], 86400000, "an update not naming it keeps it")
        self.assertIsNone(self.expect("PUT", "/v1/queues/" + self.q,
                                      {"keep_done_ms": None})["keep_done_ms"])
        self.assertEqual(self.expect("PUT", "/v1/queues/" + self.q,
                                     {"keep_done_ms": 0})["keep_done_ms"], 0)

    def test_cli_option(self):
        env = harness.cli_env(self.head)

        def cli(*args):
            return subprocess.run([harness.MUSTER_BIN, "queue", "create", self.q] + list(args),
                                  capture_output=True, text=True, env=env, timeout=60)
        for bad, why in (("abc", "expected an integer"), ("-5", "at least 0"),
                         ("1e3", "expected an integer"), ("999999999999999", "at most")):
            r = cli("--keep-done-ms", bad)
            self.assertEqual(r.returncode, 2, r)
            self.assertIn("--keep-done-ms", r.stderr)
            self.assertIn(why, r.stderr)
        self.assertEqual(self.call("GET", "/v1/queues/" + self.q).status, 404)
        r = cli("--keep-done-ms", "60000")
        self.assertEqual(r.returncode, 0, r)
        self.assertEqual(self.get_queue()["keep_done_ms"], 60000)
        r = cli("--keep-done-ms", "")
        self.assertEqual(r.returncode, 0, r)
        self.assertIsNone(self.get_queue()["keep_done_ms"])


class RetentionRestartTest(OwnHeadTestCase):

    def test_setting_and_removal_survive_a_restart(self):
        self.create_queue(keep_done_ms=KEEP_MS)
        ids = self.put(1, 2, 3)
        leases = self.lease(max=2)
        self.ack("complete", [{"task": l["task"], "token": l["token"]} for l in leases])
        self.head.stop()
        self.head.start()
        self.assertEqual(self.get_queue()["keep_done_ms"], KEEP_MS)
        harness.wait_until(lambda: self.counts()["done"] == 0, timeout=15, interval=0.05,
                           what="the done tasks to go after the restart")
        self.assert_counts(queued=1)
        self.assertEqual([t["id"] for t in self.list_tasks()], [ids[2]])
        self.assertEqual(self.get_queue()["reaped"], 2)


if __name__ == "__main__":
    unittest.main()
