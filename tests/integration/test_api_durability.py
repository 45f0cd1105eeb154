"""Durability: acknowledged state survives a clean restart (SIGTERM/SIGINT, exit code 0)
and `kill -9` (docs/api.md: "Acknowledged means on disk")."""
import os
import re
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import OwnHeadTestCase, now_ms  # noqa: E402

WORKER_STABLE = ("id", "name", "nickname", "node", "queues", "labels", "progress",
                 "created_ms", "timeout_ms", "completed", "failed", "flagged")


def item(lease, **extra):
    return dict({"task": lease["task"], "token": lease["token"]}, **extra)


class DurabilityTest(OwnHeadTestCase):
    """Each test has its own head, which it stops or kills and restarts on the same dir."""

    def build_state(self):
        """Queues, tasks in every state, a pipeline step, a worker with counters, a live
        lease; returns the lease still held and every token handed out."""
        a, b = self.qname("a"), self.qname("b")
        self.create_queue(b, lease_ms=600000, max_flags=2)
        self.create_queue(a, next=b, lease_ms=600000, max_attempts=1, backoff_ms=0,
                          backoff_max_ms=10)
        w = self.register(nickname="durable", queues=[a], node="n1", labels={"k": "v"})
        self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "halfway"})
        self.put_tasks([{"payload": {"i": i}, "key": "k%d" % i, "session": "s", "index": i,
                         "priority": i % 3} for i in range(8)], name=a)
        self.put_tasks([{"payload": "delayed", "delay_ms": 3600000}], name=a)
        leases = self.lease(a, worker=w["id"], max=5)
        tokens = {x["token"] for x in leases}
        self.ack("complete", [item(leases[0], result={"r": 0}), item(leases[1], result="r1")])
        self.ack("fail", [item(leases[2], error="perm", permanent=True)])
        self.ack("fail", [item(leases[3], error="dead now")])
        held = leases[4]
        lb = self.lease_one(b)
        tokens.add(lb["token"])
        self.ack("flag", [item(lb, reason="bad")])
        return held, tokens

    def capture(self):
        queues = self.expect("GET", "/v1/queues")["queues"]
        tasks = {q["name"]: self.list_tasks(q["name"]) for q in queues}
        workers = [{k: w[k] for k in WORKER_STABLE}
                   for w in self.expect("GET", "/v1/workers")["workers"]]
        board = self.expect("GET", "/v1/leaderboard")["leaderboard"]
        return queues, tasks, workers, board

    def check_after_restart(self, before, held, tokens):
        self.assertEqual(self.capture(), before, "state differs after restart")
        a = self.qname("a")
        # The lease held across the restart still completes with its token.
        r = self.ack("complete", [item(held, result="after restart")])
        self.assertEqual(r["completed"][0]["task"], held["task"])
        self.assertEqual(self.get_task(held["task"])["result"], "after restart")
        # Ids and tokens are never reused.
        all_ids = [t["id"] for ts in before[1].values() for t in ts]
        [new_id] = self.put("new", name=a)
        self.assertGreater(new_id, max(all_ids))
        fresh = self.lease(a, max=10)
        self.assertTrue(fresh)
        for x in fresh:
            self.assertNotIn(x["token"], tokens, "a fencing token was reused after restart")
        # Idempotency keys survive.
        [again] = self.put_tasks([{"payload": "dup", "key": "k0"}], name=a)
        self.assertIs(again["created"], False)

    def test_clean_restart_sigterm(self):
        held, tokens = self.build_state()
        before = self.capture()
        t0 = time.monotonic()
        self.assertEqual(self.head.stop(), 0, "exit code after SIGTERM\n" + self.head.log())
        self.assertLess(time.monotonic() - t0, 10)
        self.head.start()
        self.check_after_restart(before, held, tokens)

    def test_clean_restart_sigint(self):
        self.create_queue()
        ids = self.put(1, 2, 3)
        self.head.signal(signal.SIGINT)
        self.assertEqual(self.head.proc.wait(20), 0, "exit code after SIGINT")
        self.head.start()
        self.assertEqual([t["id"] for t in self.list_tasks()], ids)

    def test_kill9(self):
        held, tokens = self.build_state()
        before = self.capture()
        self.head.kill()
        self.head.start()
        self.check_after_restart(before, held, tokens)

    def test_repeated_kills(self):
        self.create_queue()
        ids = []
        for i in range(3):
            ids += self.put(*range(i * 10, i * 10 + 10))
            self.head.kill()
            self.head.start()
            self.assertEqual([t["id"] for t in self.list_tasks()], ids)
        self.assertEqual([t["payload"] for t in self.list_tasks()], list(range(30)))

    def test_tokens_rise_after_their_tasks_are_deleted(self):
        # The highest tokens were carried by tasks that no longer exist: the head
        # must still never hand out a token at or below them, across kills.
        gone, kept = self.qname("gone"), self.qname("kept")
        self.create_queue(kept)
        self.put("k", name=kept)
        highest = 0
        for _ in range(3):
            self.create_queue(gone)
            self.put(*range(5), name=gone)
            highest = max([highest] + [x["token"] for x in self.lease(gone, max=5)])
            self.expect("DELETE", "/v1/queues/%s?force=true" % gone)
            self.head.kill()
            self.head.start()
        lease = self.lease_one(kept)
        self.assertGreater(lease["token"], highest, "a token at or below one already handed out")

    def test_lease_expiring_while_down(self):
        self.create_queue(lease_ms=300, backoff_ms=0)
        [tid] = self.put("x")
        lease = self.lease_one()
        self.head.kill()
        harness.wait_until(lambda: now_ms() > lease["deadline_ms"] + 100, what="the deadline")
        self.head.start()
        t = self.wait_state(tid, "queued")
        self.assertEqual(t["attempts"], 1)
        self.expect_error("POST", "/v1/leases/complete", {"leases": [item(lease)]}, 409,
                          "lease_lost")
        self.assertEqual(self.lease_one()["attempt"], 2)

    def test_silence_is_counted_from_the_start(self):
        # Nobody can be heard while no head runs: a worker, a node and a session whose
        # timeouts all pass while the head is down are still there after it starts, and
        # each is ended once its timeout has passed since the start without a word.  A
        # lease that expired meanwhile ends at the start: its task queued again shows
        # that the sweep has run since.
        self.create_queue(lease_ms=300, backoff_ms=0)
        [tid] = self.put("x")
        self.lease_one()
        w = self.register(timeout_ms=2000)
        self.expect("POST", "/v1/nodes", {"name": "quiet", "timeout_ms": 2000}, status=201)
        sess = self.expect("POST", "/v1/sessions", {"queue": self.q, "timeout_ms": 2000},
                           status=201)
        killed = now_ms()
        self.head.kill()
        harness.wait_until(lambda: now_ms() > killed + 2500, timeout=10, what="the timeouts")
        self.head.start()
        self.wait_state(tid, "queued")
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w["id"])["state"], "active")
        self.assertEqual(self.expect("GET", "/v1/nodes/quiet")["state"], "active")
        self.assertEqual(self.expect("GET", "/v1/sessions/" + sess["id"])["state"], "open")
        # Liveness still works: silent since the start, each is ended after its timeout.
        harness.wait_until(lambda: self.expect("GET", "/v1/workers/%d" % w["id"])["state"]
                           == "gone", timeout=10, what="the worker timed out")
        harness.wait_until(lambda: self.expect("GET", "/v1/nodes/quiet")["state"]
                           == "gone", timeout=10, what="the node timed out")
        harness.wait_until(lambda: (lambda r: r.status == 404 or r.json["state"] != "open")(
            self.head.request("GET", "/v1/sessions/" + sess["id"])),
            timeout=10, what="the session closed")

    def test_sigterm_during_long_poll(self):
        self.create_queue()
        result = {}

        def poll():
            conn = self.head.connection(timeout=60)
            try:
                result["reply"] = self.head.request("POST", "/v1/queues/%s/lease" % self.q,
                                                    {"wait_ms": 30000}, conn=conn)
            except Exception as e:
                result["error"] = e
            finally:
                conn.close()
        th = threading.Thread(target=poll, daemon=True)
        th.start()
        # Parked at the head (its gauge), not merely sent 0.3 s ago: a lease the head
        # had not taken yet when the stop came would not test the stop's wait for it.
        harness.wait_until(lambda: re.search(rb"^muster_lease_waiters 1$", self.head.request(
            "GET", "/metrics").raw, re.M), what="the long-poll parked at the head")
        t0 = time.monotonic()
        self.assertEqual(self.head.stop(), 0)
        self.assertLess(time.monotonic() - t0, 5.0, "shutdown waited for the long-poll")
        th.join(10)
        self.assertFalse(th.is_alive())
        reply = result.get("reply")
        if reply is not None:   # an answer, if any, is [] or 503 unavailable
            self.assertIn((reply.status, reply.error_code), ((200, None), (503, "unavailable")),
                          reply)
            if reply.status == 200:
                self.assertEqual(reply.json, {"leases": []})


class SyncNormalTest(DurabilityTest):
    """--sync normal skips the fsync, but a killed process still loses nothing."""

    def extra_args(self):
        return ["--sync", "normal"]

    # The main checks are enough here; None is not collected as a test.
    test_clean_restart_sigint = None
    test_lease_expiring_while_down = None
    test_sigterm_during_long_poll = None


if __name__ == "__main__":
    unittest.main()
