"""Leases: complete, fail (backoff, permanent, max_attempts -> dead), extend, release,
flag; fencing tokens; lease expiry (docs/api.md, "Leases")."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, now_ms  # noqa: E402

KINDS = ("complete", "fail", "extend", "release", "flag")


def item(lease, **extra):
    return dict({"task": lease["task"], "token": lease["token"]}, **extra)


class LeaseCallTest(ApiTestCase):

    def test_complete(self):
        self.create_queue()
        ids = self.put("a", "b", "c")
        la, lb, lc = self.lease(max=3)
        t0 = now_ms()
        r = self.ack("complete", [item(la, result={"out": [1, 2]}), item(lb, result="text")])
        t1 = now_ms()
        self.assertEqual(r, {"completed": [{"task": ids[0], "next_task": None},
                                           {"task": ids[1], "next_task": None}]})
        a = self.get_task(ids[0])
        self.assertEqual((a["state"], a["result"], a["lease"], a["attempts"]),
                         ("done", {"out": [1, 2]}, None, 1))
        self.assert_between(a["updated_ms"], t0, t1, "updated_ms")
        self.assertEqual(self.get_task(ids[1])["result"], "text")
        # Without a result: null.
        self.ack("complete", [item(lc)])
        c = self.get_task(ids[2])
        self.assertEqual((c["state"], c["result"]), ("done", None))
        self.assert_counts(done=3)
        # Completing again with the same token is a repeat (RetryTest); its other
        # result is ignored: the first one stays.
        r = self.ack("complete", [item(la, result=0)])
        self.assertEqual(r, {"completed": [{"task": ids[0], "next_task": None, "repeated": True,
                                            "result_ignored": True}]})
        self.assertEqual(self.get_task(ids[0])["result"], {"out": [1, 2]})
        self.assert_counts(done=3)

    def test_complete_and_lease_next(self):
        """A "lease" object in the complete body leases the next tasks in the same request."""
        self.create_queue()
        other = self.qname("other")
        self.create_queue(other)
        ids = self.put("a", "b", "c", "d")
        [oid] = self.put("o", name=other)
        [la] = self.lease(max=1)
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(la, result=1)], "lease": {"queue": self.q, "max": 2}})
        self.assertEqual(r["completed"], [{"task": ids[0], "next_task": None}])
        self.assertEqual([l["task"] for l in r["leases"]], ids[1:3])
        lb, lc = r["leases"]
        self.assertEqual(self.get_task(ids[0])["state"], "done")
        self.assertEqual(self.get_task(ids[1])["state"], "leased")
        # Another queue, default max 1; the new tokens work like any lease's.
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(lb), item(lc)], "lease": {"queue": other}})
        self.assertEqual([l["task"] for l in r["leases"]], [oid])
        # Nothing ready: an empty list at once, the completions stand.
        [ld] = self.lease(max=1)
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(ld)], "lease": {"queue": self.q, "max": 5}})
        self.assertEqual(r, {"completed": [{"task": ids[3], "next_task": None}], "leases": []})
        self.assert_counts(done=4)

    def test_complete_and_lease_next_all_or_nothing(self):
        """A stale token or a bad "lease" object refuses the whole request: nothing completes,
        nothing is leased."""
        self.create_queue()
        ids = self.put("a", "b", "c")
        la, lb = self.lease(max=2)
        stale = dict(item(lb), token=lb["token"] + 1000)
        self.expect_error("POST", "/v1/leases/complete",
                          {"leases": [item(la), stale], "lease": {"queue": self.q}},
                          409, "lease_lost")
        for bad, status, code in (({"queue": "no-such-queue"}, 404, "queue_not_found"),
                                  ({"queue": self.q, "max": 0}, 400, "invalid_argument"),
                                  ({"queue": self.q, "max": 1001}, 400, "invalid_argument"),
                                  ({"queue": self.q, "worker": 999999}, 404, "worker_not_found"),
                                  ({"max": 1}, 400, "invalid_argument"),
                                  ({"queue": self.q, "wait_ms": 5}, 400, "invalid_argument"),
                                  ("q", 400, "invalid_argument")):
            self.expect_error("POST", "/v1/leases/complete",
                              {"leases": [item(la)], "lease": bad}, status, code)
        self.assertEqual([self.get_task(i)["state"] for i in ids], ["leased", "leased", "queued"])
        self.assert_counts(leased=2, queued=1)

    def post_update(self, data):
        return self.expect("POST", "/v1/queues/%s/updates" % self.q, {"data": data},
                           status=201)["seq"]

    def test_complete_and_lease_next_with_updates(self):
        """With "updates_after" in the "lease" object the reply carries the updates
        published since, under the keys and in the shape of a plain lease's reply."""
        self.create_queue()
        ids = self.put("a", "b", "c")
        s1, s2 = self.post_update("u1"), self.post_update({"n": 2})
        r = self.expect("POST", "/v1/queues/%s/lease" % self.q, {"updates_after": 0})
        self.assertEqual(([u["seq"] for u in r["updates"]], r["updates_last"]), ([s1, s2], s2))
        [la] = r["leases"]
        s3, s4 = self.post_update("u3"), self.post_update(None)
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(la, result=1)],
                         "lease": {"queue": self.q, "updates_after": s2}})
        self.assertEqual(set(r), {"completed", "leases", "updates", "updates_last"}, r)
        self.assertEqual(r["completed"], [{"task": ids[0], "next_task": None}])
        self.assertEqual([l["task"] for l in r["leases"]], [ids[1]])
        self.assert_lease_shape(r["leases"][0])
        # The same updates, objects and all, as the updates list and a plain lease give.
        listed = self.expect("GET", "/v1/queues/%s/updates?after=%d" % (self.q, s2))
        self.assertEqual(r["updates"], listed["updates"])
        self.assertEqual([(u["seq"], u["data"]) for u in r["updates"]], [(s3, "u3"), (s4, None)])
        self.assertEqual(r["updates_last"], s4)
        plain = self.expect("POST", "/v1/queues/%s/lease" % self.q,
                            {"updates_after": s2, "max": 1})
        self.assertEqual((plain["updates"], plain["updates_last"]),
                         (r["updates"], r["updates_last"]))
        lc = plain["leases"][0]
        # Nothing ready and nothing new: at once, empty lists and the same updates_last.
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(r["leases"][0]), item(lc)],
                         "lease": {"queue": self.q, "max": 3, "updates_after": s4}})
        self.assertEqual(r, {"completed": [{"task": ids[1], "next_task": None},
                                           {"task": ids[2], "next_task": None}],
                             "leases": [], "updates": [], "updates_last": s4})
        # Updates alone, no task: the updates still come.
        self.put("d")
        [ld] = self.lease(max=1)
        s5 = self.post_update("u5")
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(ld)], "lease": {"queue": self.q, "updates_after": s4}})
        self.assertEqual((r["leases"], [u["seq"] for u in r["updates"]], r["updates_last"]),
                         ([], [s5], s5))
        # Without updates_after: no update fields (a plain lease's reply has none either).
        self.put("e")
        [le] = self.lease(max=1)
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(le)], "lease": {"queue": self.q}})
        self.assertEqual(set(r), {"completed", "leases"}, r)
        self.assert_counts(done=5)

    def test_complete_and_lease_next_refuses_bad_lease_fields(self):
        """An unknown field, a bad updates_after or a wait in the "lease" object gets a 400
        naming the field, and the completion is not applied (all or nothing)."""
        self.create_queue()
        ids = self.put("a", "b")
        [la] = self.lease(max=1)
        self.post_update("u1")
        before = self.snapshot()
        for bad, field in (({"queue": self.q, "updates_afterr": 0}, "lease.updates_afterr"),
                           ({"queue": self.q, "updates_after": -1}, "lease.updates_after"),
                           ({"queue": self.q, "updates_after": "1"}, "lease.updates_after"),
                           ({"queue": self.q, "updates_after": 1.5}, "lease.updates_after"),
                           ({"queue": self.q, "updates_after": True}, "lease.updates_after"),
                           ({"queue": self.q, "wait_ms": 1000}, "lease.wait_ms"),
                           ({"queue": self.q, "wait_ms": 0, "updates_after": 0},
                            "lease.wait_ms")):
            r = self.expect_error("POST", "/v1/leases/complete",
                                  {"leases": [item(la, result="must not land")], "lease": bad},
                                  400, "invalid_argument")
            self.assertIn(field, r.json["error"]["message"], bad)
            self.assertEqual(self.snapshot(), before, bad)
        r = self.call("POST", "/v1/leases/complete",
                      {"leases": [item(la)], "lease": {"queue": self.q, "wait_ms": 1}})
        self.assertIn("never waits", r.json["error"]["message"])
        # The token is untouched: the same completion, well formed, goes through.
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [item(la, result="landed")],
                         "lease": {"queue": self.q, "updates_after": 0}})
        self.assertEqual(([l["task"] for l in r["leases"]], len(r["updates"])), ([ids[1]], 1))
        self.assertEqual(self.get_task(ids[0])["result"], "landed")
        self.assertEqual(self.get_task(ids[1])["state"], "leased")

    def test_fail_with_backoff(self):
        self.create_queue(backoff_ms=300, backoff_max_ms=700, max_attempts=10)
        [tid] = self.put("x")
        expected_delays = [300, 600, 700, 700]
        for attempt, delay in enumerate(expected_delays, start=1):
            lease = self.wait_lease(timeout=5)[0]
            self.assertEqual((lease["task"], lease["attempt"]), (tid, attempt))
            t0 = now_ms()
            r = self.ack("fail", [item(lease, error="err %d" % attempt)])
            t1 = now_ms()
            [f] = r["failed"]
            self.assertEqual((f["task"], f["state"]), (tid, "queued"), r)
            self.assert_between(f["run_at_ms"], t0 + delay, t1 + delay,
                                "run_at_ms after attempt %d" % attempt)
            t = self.get_task(tid)
            self.assertEqual((t["state"], t["attempts"], t["error"], t["run_at_ms"], t["lease"]),
                             ("queued", attempt, "err %d" % attempt, f["run_at_ms"], None))
            # Not leasable before run_at_ms.
            if now_ms() < f["run_at_ms"] - 50:
                self.assertEqual(self.lease(), [], "leased during backoff")
            self.assert_counts(queued=1)

    def test_fail_permanent(self):
        self.create_queue(max_attempts=5, backoff_ms=0)
        [tid] = self.put("x")
        lease = self.lease_one()
        r = self.ack("fail", [item(lease, error="bad input", permanent=True)])
        self.assertEqual(len(r["failed"]), 1)
        self.assertEqual((r["failed"][0]["task"], r["failed"][0]["state"]), (tid, "failed"))
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["error"], t["lease"]), ("failed", "bad input", None))
        self.assertEqual(self.lease(), [])
        self.assert_counts(failed=1)

    def test_fail_without_error_text(self):
        self.create_queue(backoff_ms=0)
        [tid] = self.put("x")
        r = self.ack("fail", [item(self.lease_one())])
        self.assertEqual(r["failed"][0]["state"], "queued")
        # The task still says why it is retried, in the head's words.
        self.assertEqual((self.get_task(tid)["state"], self.get_task(tid)["error"]),
                         ("queued", "failed"))
        self.ack("fail", [item(self.wait_lease()[0], permanent=True)])
        self.assertEqual((self.get_task(tid)["state"], self.get_task(tid)["error"]),
                         ("failed", "failed permanently"))

    def test_max_attempts_dead_on_fail(self):
        self.create_queue(max_attempts=2, backoff_ms=0)
        [tid] = self.put("x")
        r = self.ack("fail", [item(self.lease_one(), error="one")])
        self.assertEqual(r["failed"][0]["state"], "queued")
        lease = self.wait_lease()[0]
        self.assertEqual(lease["attempt"], 2)
        r = self.ack("fail", [item(lease, error="two")])
        self.assertEqual((r["failed"][0]["task"], r["failed"][0]["state"]), (tid, "dead"))
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"]), ("dead", 2))
        self.assertTrue(t["error"].startswith("two"), "the worker's error is kept: %r" % t)
        self.assertEqual(self.lease(), [])
        self.assertEqual([x["id"] for x in self.list_tasks(state="dead")], [tid])
        self.assert_counts(dead=1)
        # Dead letters can be requeued and leased again from attempt 1.
        self.assertEqual(self.expect("POST", "/v1/queues/%s/requeue" % self.q), {"requeued": 1})
        self.assertEqual(self.lease_one()["attempt"], 1)

    def test_lease_moves_used_up_task_to_dead(self):
        # "a task whose attempts are used up is not leased but moved to dead": reachable
        # when max_attempts is lowered below a queued task's attempts.
        self.create_queue(max_attempts=5, backoff_ms=0)
        used, fresh = self.put("used", "fresh")
        for n in (1, 2):
            lease = self.wait_lease()[0]
            self.assertEqual((lease["task"], lease["attempt"]), (used, n))
            self.ack("fail", [item(lease, error="e")])
        self.expect("PUT", "/v1/queues/" + self.q, {"max_attempts": 2})
        got = self.lease(max=10)
        self.assertEqual([(x["task"], x["attempt"]) for x in got], [(fresh, 1)])
        t = self.get_task(used)
        self.assertEqual((t["state"], t["attempts"], t["lease"]), ("dead", 2, None))
        self.assert_counts(leased=1, dead=1)

    def test_extend(self):
        self.create_queue(lease_ms=400, backoff_ms=0)
        [tid] = self.put("x")
        lease = self.lease_one()
        t0 = now_ms()
        r = self.ack("extend", [item(lease, lease_ms=5000)])
        t1 = now_ms()
        [e] = r["extended"]
        self.assertEqual(e["task"], tid)
        self.assert_between(e["deadline_ms"], t0 + 5000, t1 + 5000, "extended deadline")
        self.assertEqual(self.get_task(tid)["lease"]["deadline_ms"], e["deadline_ms"])
        # Well past the original deadline (and several sweeps), it is still ours.
        harness.wait_until(lambda: now_ms() > lease["deadline_ms"] + 300,
                           what="the original deadline to pass")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"]), ("leased", 1))
        # Without lease_ms: the queue's.
        t0 = now_ms()
        r = self.ack("extend", [item(lease)])
        t1 = now_ms()
        self.assert_between(r["extended"][0]["deadline_ms"], t0 + 400, t1 + 400,
                            "deadline with the queue's lease_ms")
        # The token still completes.
        self.ack("complete", [item(lease, result=1)])
        self.assertEqual(self.get_task(tid)["state"], "done")

    def test_release(self):
        self.create_queue(backoff_ms=60000)
        ids = self.put("a", "b")
        la, lb = self.lease(max=2)
        r = self.ack("release", [item(la), item(lb)])
        self.assertEqual(r, {"released": 2})
        for tid in ids:
            t = self.get_task(tid)
            self.assertEqual((t["state"], t["attempts"], t["lease"]), ("queued", 0, None), t)
        # Back at once (no backoff), attempt not counted.
        again = self.lease(max=2)
        self.assertEqual([x["task"] for x in again], ids)
        self.assertEqual([x["attempt"] for x in again], [1, 1])
        self.assertNotIn(again[0]["token"], (la["token"], lb["token"]))
        # The released token is dead: only a release again is answered, as a repeat
        # (test_report_retry.py), and the new lease keeps the task.
        for kind in KINDS:
            if kind != "release":
                self.expect_error("POST", "/v1/leases/" + kind, {"leases": [item(la)]}, 409,
                                  "lease_lost")
        self.assertEqual(self.ack("release", [item(la)]), {"released": 1, "repeated": 1})
        self.assertEqual(self.get_task(ids[0])["state"], "leased")

    def test_flag(self):
        self.create_queue(max_flags=3, backoff_ms=0)
        [tid] = self.put("x")
        for n in (1, 2):
            [lease] = self.wait_lease()
            self.assertEqual(lease["attempt"], 1, "a flag does not count as an attempt")
            r = self.ack("flag", [item(lease, reason="corrupt input")])
            self.assertEqual(r, {"flagged": [{"task": tid, "state": "queued", "reopened": None}]})
            t = self.get_task(tid)
            self.assertEqual((t["state"], t["flags"], t["attempts"], t["lease"]),
                             ("queued", n, 0, None), t)
        [lease] = self.wait_lease()
        r = self.ack("flag", [item(lease)])
        self.assertEqual(r, {"flagged": [{"task": tid, "state": "dead", "reopened": None}]})
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["flags"], t["error"]), ("dead", 3, "flagged invalid 3 times"))
        self.assert_counts(dead=1)

    def test_flag_once_says_once(self):
        self.create_queue(max_flags=1)
        [tid] = self.put("x")
        [lease] = self.wait_lease()
        self.ack("flag", [item(lease, reason="bad header")])
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["error"]), ("dead", "flagged invalid once: bad header"))


class FencingTest(ApiTestCase):

    def expire(self, tid, lease):
        """Waits until the lease's deadline passes and the task is queued again."""
        return self.wait_state(tid, "queued", timeout=10)

    def test_stale_token_after_expiry(self):
        self.create_queue(lease_ms=300, backoff_ms=0)
        [tid] = self.put("x")
        first = self.lease_one()
        self.expire(tid, first)
        second = self.lease_one()
        self.assertEqual((second["task"], second["attempt"]), (tid, 2))
        self.assertNotEqual(second["token"], first["token"])
        self.ack("extend", [item(second, lease_ms=60000)])
        for kind, extra in (("complete", {"result": "first"}), ("fail", {"error": "first"}),
                            ("extend", {"lease_ms": 1000}), ("release", {}),
                            ("flag", {"reason": "first"})):
            self.expect_error("POST", "/v1/leases/" + kind,
                              {"leases": [item(first, **extra)]}, 409, "lease_lost")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["flags"], t["attempts"]), ("leased", 0, 2))
        self.assertNotEqual(t["error"], "first", "a stale fail wrote its error")
        self.ack("complete", [item(second, result="second")])
        self.expect_error("POST", "/v1/leases/complete",
                          {"leases": [item(first, result="first")]}, 409, "lease_lost")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["result"]), ("done", "second"))

    def test_wrong_tokens(self):
        self.create_queue()
        self.put("a", "b")
        la, lb = self.lease(max=2)
        before = self.snapshot()
        for bad in ({"task": la["task"], "token": la["token"] + 1000003},
                    {"task": la["task"], "token": lb["token"]},
                    {"task": lb["task"], "token": la["token"]}):
            for kind in KINDS:
                self.expect_error("POST", "/v1/leases/" + kind, {"leases": [bad]}, 409,
                                  "lease_lost")
        self.assertEqual(self.snapshot(), before)

    def test_token_of_queued_task(self):
        self.create_queue()
        [tid] = self.put("a")
        self.expect_error("POST", "/v1/leases/complete",
                          {"leases": [{"task": tid, "token": 1}]}, 409, "lease_lost")
        self.assertEqual(self.get_task(tid)["state"], "queued")

    def test_batch_with_one_stale_token_changes_nothing(self):
        self.create_queue(lease_ms=60000, max_flags=1, backoff_ms=0)
        self.put("a", "b", "c")
        la, lb, lc = self.lease(max=3)
        stale = dict(item(lc), token=lc["token"] + 7777777)
        before = self.snapshot()
        for kind, extra in (("complete", {"result": 1}), ("fail", {"permanent": True}),
                            ("extend", {"lease_ms": 999999}), ("release", {}), ("flag", {})):
            body = {"leases": [item(la, **extra), item(lb, **extra), dict(stale, **extra)]}
            r = self.expect_error("POST", "/v1/leases/" + kind, body, 409, "lease_lost")
            self.assertIn("[2]", r.json["error"]["message"], "the message names the element")
            self.assertEqual(self.snapshot(), before, "%s half-applied" % kind)
        # An unknown task in a batch: task_not_found, nothing changed.
        for kind in KINDS:
            body = {"leases": [item(la), {"task": 987654321, "token": 5}]}
            self.expect_error("POST", "/v1/leases/" + kind, body, 404, "task_not_found")
            self.assertEqual(self.snapshot(), before, "%s half-applied" % kind)
        # The valid tokens still work together.
        r = self.ack("complete", [item(la), item(lb), item(lc)])
        self.assertEqual(len(r["completed"]), 3)
        self.assert_counts(done=3)

    def test_same_task_twice_in_one_batch(self):
        self.create_queue()
        [tid] = self.put("a")
        lease = self.lease_one()
        before = self.snapshot()
        r = self.call("POST", "/v1/leases/complete",
                      {"leases": [item(lease, result=1), item(lease, result=2)]})
        # The second element names a lease the first one ended: the batch is refused
        # (lease_lost) or, if accepted, the task is done exactly once.
        if r.status == 200:
            self.assertEqual(self.get_task(tid)["state"], "done")
            self.assert_counts(done=1)
        else:
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertEqual(self.snapshot(), before)


class RetryTest(ApiTestCase):
    """A completion sent again under the token that completed the task (its reply was
    lost) is a success marked "repeated" that counts nothing twice (docs/api.md,
    "Retrying a completion")."""

    def compact(self, body):
        """The body as libmuster writes it, without whitespace: the head's scanner path."""
        return json.dumps(body, separators=(",", ":")).encode()

    def test_repeated_completion_counts_once(self):
        nxt = self.qname("next")
        self.create_queue(nxt)
        self.create_queue(next=nxt)
        w = self.register(nickname=self.qname("nick"))
        ids = self.put("a", "b", "c")
        la, lb, lc = self.lease(max=3, worker=w["id"])
        # One element, as Python writes it (the tree path).
        first = self.ack("complete", [item(la, result={"k": 1})])
        [done_a] = first["completed"]
        self.assertIsNotNone(done_a["next_task"])
        again = self.ack("complete", [item(la, result={"k": 1})])
        self.assertEqual(again, {"completed": [dict(done_a, repeated=True)]})
        # A batch, as libmuster writes it (the scanner's path), sent twice.
        body = {"leases": [item(lb, result=2), item(lc)]}
        first = self.expect("POST", "/v1/leases/complete", raw=self.compact(body))
        again = self.expect("POST", "/v1/leases/complete", raw=self.compact(body))
        self.assertEqual(again["completed"], [dict(e, repeated=True) for e in first["completed"]])
        # A batch mixing a repeat and a fresh completion, and an element whose result differs.
        [did] = self.put("d")
        ld = self.lease_one(worker=w["id"])
        r = self.expect("POST", "/v1/leases/complete",
                        raw=self.compact({"leases": [item(lb, result=3), item(ld)]}))
        self.assertEqual([(e["task"], e.get("repeated"), e.get("result_ignored"))
                          for e in r["completed"]], [(ids[1], True, True), (did, None, None)])
        self.assertEqual(self.get_task(ids[1])["result"], 2, "the first result stays")
        # Counted once: the queue's counts, the next stage's tasks, the worker's counter
        # and the leaderboard.
        self.assert_counts(done=4)
        self.assert_counts(nxt, queued=4)
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w["id"])["completed"], 4)
        board = self.expect("GET", "/v1/leaderboard")["leaderboard"]
        self.assertEqual([e["completed"] for e in board if e["nickname"] == w["nickname"]], [4])

    def test_other_calls_under_a_completing_token(self):
        self.create_queue()
        [tid] = self.put("a")
        lease = self.lease_one()
        self.ack("complete", [item(lease, result=1)])
        before = self.snapshot()
        for kind in ("fail", "extend", "release", "flag"):
            r = self.expect_error("POST", "/v1/leases/" + kind, {"leases": [item(lease)]}, 409,
                                  "lease_lost")
            self.assertIn("task %d was already completed under token %d" % (tid, lease["token"]),
                          r.json["error"]["message"])
        self.assertEqual(self.snapshot(), before)

    def test_repeated_complete_and_lease_next(self):
        """The repeat of a combined call counts its completions once and leases anew: the
        tasks the lost reply carried stay leased to no one who knows until they expire."""
        self.create_queue()
        ids = self.put("a", "b", "c")
        la = self.lease_one()
        body = {"leases": [item(la, result=1)], "lease": {"queue": self.q}}
        first = self.expect("POST", "/v1/leases/complete", body)
        again = self.expect("POST", "/v1/leases/complete", body)
        self.assertEqual(first["completed"], [{"task": ids[0], "next_task": None}])
        self.assertEqual(again["completed"], [{"task": ids[0], "next_task": None,
                                               "repeated": True}])
        self.assertEqual([l["task"] for l in first["leases"]], [ids[1]])
        self.assertEqual([l["task"] for l in again["leases"]], [ids[2]])
        self.assert_counts(done=1, leased=2)

    def test_another_token_is_still_refused(self):
        self.create_queue(lease_ms=300, backoff_ms=0)
        [tid] = self.put("a")
        first = self.lease_one()
        self.wait_state(tid, "queued")
        second = self.lease_one()
        self.ack("complete", [item(second, result="second")])
        r = self.expect_error("POST", "/v1/leases/complete",
                              {"leases": [item(first, result="first")]}, 409, "lease_lost")
        self.assertIn("the lease of task %d under token %d already ended (it expired, or its "
                      "worker timed out, crashed or said goodbye), and the task was leased again "
                      "since (it is done now)" % (tid, first["token"]),
                      r.json["error"]["message"])
        self.assertEqual(self.get_task(tid)["result"], "second")
        self.assert_counts(done=1)


class ExpiryTest(ApiTestCase):

    def test_expiry_returns_task_to_queued(self):
        self.create_queue(lease_ms=300, backoff_ms=0, max_attempts=5)
        [tid] = self.put("x")
        lease = self.lease_one()
        self.assert_counts(leased=1)
        t = self.wait_state(tid, "queued")
        self.assertGreaterEqual(now_ms(), lease["deadline_ms"] - 20, "expired before deadline")
        self.assertEqual((t["attempts"], t["lease"]), (1, None))
        self.assert_counts(queued=1)
        again = self.lease_one()
        self.assertEqual((again["task"], again["attempt"]), (tid, 2))

    def test_expiry_applies_backoff(self):
        self.create_queue(lease_ms=200, backoff_ms=5000, backoff_max_ms=5000)
        [tid] = self.put("x")
        lease = self.lease_one()
        t = self.wait_state(tid, "queued")
        self.assertGreaterEqual(t["run_at_ms"], lease["deadline_ms"] + 5000 - 200,
                                "no backoff after expiry: %r" % t)
        self.assertEqual(self.lease(), [])

    def test_expiry_with_attempts_used_up_is_dead(self):
        self.create_queue(lease_ms=200, backoff_ms=0, max_attempts=1)
        [tid] = self.put("x")
        self.lease_one()
        t = self.wait_state(tid, "dead")
        self.assertEqual((t["attempts"], t["lease"]), (1, None))
        self.assertEqual(self.lease(), [])
        self.assert_counts(dead=1)

    def test_completion_before_deadline_is_not_expired(self):
        self.create_queue(lease_ms=300, backoff_ms=0)
        [tid] = self.put("x")
        lease = self.lease_one()
        self.ack("complete", [item(lease, result="ok")])
        harness.wait_until(lambda: now_ms() > lease["deadline_ms"] + 300,
                           what="the deadline to pass")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["result"], t["attempts"]), ("done", "ok", 1))


if __name__ == "__main__":
    unittest.main()
