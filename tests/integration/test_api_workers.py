"""Workers: register, get, list, heartbeat with progress, counters, leaderboard,
timeout and bye (docs/api.md, "Workers")."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, WORKER_KEYS, is_int, now_ms  # noqa: E402


def item(lease, **extra):
    return dict({"task": lease["task"], "token": lease["token"]}, **extra)


class WorkerTest(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--worker-timeout-ms", "60000")

    def get_worker(self, wid):
        w = self.expect("GET", "/v1/workers/%d" % wid)
        missing = WORKER_KEYS - set(w)
        self.assertFalse(missing, "worker lacks %s: %r" % (sorted(missing), w))
        return w

    def test_register_and_get(self):
        self.create_queue()
        t0 = now_ms()
        r = self.register(nickname="alice", queues=[self.q], node="gpu-box-1",
                          labels={"gpu": "a100", "n": 2}, timeout_ms=45000)
        t1 = now_ms()
        self.assertEqual(set(r), {"id", "name", "nickname", "timeout_ms"})
        self.assertTrue(is_int(r["id"]) and r["id"] > 0, r)
        self.assertIsInstance(r["name"], str)
        self.assertTrue(r["name"], r)
        self.assertEqual((r["nickname"], r["timeout_ms"]), ("alice", 45000))
        w = self.get_worker(r["id"])
        self.assertEqual((w["id"], w["name"], w["nickname"], w["node"], w["queues"], w["labels"],
                          w["state"], w["timeout_ms"], w["completed"], w["failed"], w["flagged"],
                          w["leases"]),
                         (r["id"], r["name"], "alice", "gpu-box-1", [self.q],
                          {"gpu": "a100", "n": 2}, "active", 45000, 0, 0, 0, 0))
        self.assert_between(w["created_ms"], t0, t1, "created_ms")
        self.assert_between(w["last_seen_ms"], t0, t1, "last_seen_ms")
        # Defaults: the head's --worker-timeout-ms, the leaderboard's "anonymous", and
        # null for what was not given.
        r2 = self.register()
        self.assertEqual((r2["timeout_ms"], r2["nickname"]), (60000, "anonymous"))
        self.assertNotEqual(r2["id"], r["id"])
        w2 = self.get_worker(r2["id"])
        self.assertEqual((w2["state"], w2["nickname"], w2["node"], w2["queues"], w2["labels"],
                          w2["progress"]), ("active", "anonymous", None, None, None, None))

    def test_list(self):
        ids = [self.register(nickname="lister-%d" % i)["id"] for i in range(3)]
        workers = self.expect("GET", "/v1/workers")["workers"]
        mine = {w["id"]: w for w in workers if w["id"] in ids}
        self.assertEqual(set(mine), set(ids))
        for wid in ids:
            self.assertEqual(set(mine[wid]) >= WORKER_KEYS, True, mine[wid])
            self.assertEqual(mine[wid]["state"], "active")
            self.assertEqual(mine[wid], self.get_worker(wid))

    def test_heartbeat_and_progress(self):
        w = self.register(nickname="hb")
        before = self.get_worker(w["id"])
        harness.wait_until(lambda: now_ms() > before["last_seen_ms"] + 20, what="time")
        r = self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "42% of 7"})
        self.assertEqual(r, {"id": w["id"], "state": "active"})
        after = self.get_worker(w["id"])
        self.assertEqual(after["progress"], "42% of 7")
        self.assertGreater(after["last_seen_ms"], before["last_seen_ms"])
        # Without progress (no body, empty object): the last progress stays.
        r = self.call("POST", "/v1/workers/%d/heartbeat" % w["id"], None, content_type=None)
        self.assertEqual((r.status, r.json), (200, {"id": w["id"], "state": "active"}), r)
        self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {})
        self.assertEqual(self.get_worker(w["id"])["progress"], "42% of 7")
        self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "done"})
        self.assertEqual(self.get_worker(w["id"])["progress"], "done")

    def test_unknown_worker(self):
        self.create_queue()
        self.put("x")
        for method, path, body in (("GET", "/v1/workers/987654", None),
                                   ("POST", "/v1/workers/987654/heartbeat", {}),
                                   ("DELETE", "/v1/workers/987654", None),
                                   ("POST", "/v1/queues/%s/lease" % self.q, {"worker": 987654})):
            self.expect_error(method, path, body, 404, "worker_not_found")
        self.assert_counts(queued=1)
        for path in ("/v1/workers/abc", "/v1/workers/0", "/v1/workers/-2"):
            self.expect_error("GET", path, None, 400, "bad_request")

    def test_counters_and_leases(self):
        self.create_queue(backoff_ms=0)
        w = self.register(nickname="counter")
        self.put(*range(6))
        leases = self.lease(worker=w["id"], max=5)
        self.assertEqual(self.get_worker(w["id"])["leases"], 5)
        # The listing counts every worker's leases in one pass (worker.c): the same.
        listed = {x["id"]: x for x in self.expect("GET", "/v1/workers")["workers"]}
        self.assertEqual(listed[w["id"]]["leases"], 5)
        for x in leases:
            self.assertEqual(self.get_task(x["task"])["lease"]["worker"], w["id"])
        self.ack("complete", [item(leases[0], result=1), item(leases[1], result=2)])
        self.ack("fail", [item(leases[2], error="e", permanent=True)])
        self.ack("flag", [item(leases[3])])
        got = self.get_worker(w["id"])
        self.assertEqual((got["completed"], got["failed"], got["flagged"], got["leases"]),
                         (2, 1, 1, 1))
        # An anonymous lease counts for nobody.
        anon = self.lease()
        self.ack("complete", [item(anon[0])])
        got = self.get_worker(w["id"])
        self.assertEqual((got["completed"], got["leases"]), (2, 1))

    def test_counters_of_a_mixed_batch(self):
        # A batch of completions is tallied per worker and written once per run of
        # one worker's leases (lease_ops.c): runs of two workers and anonymous
        # leases, interleaved, must each land on their own counter.
        self.create_queue()
        a, b = self.register(nickname="a"), self.register(nickname="b")
        self.put(*range(7))
        la = self.lease(worker=a["id"], max=3)
        lb = self.lease(worker=b["id"], max=2)
        anon = self.lease(max=2)
        batch = [la[0], la[1], lb[0], anon[0], la[2], lb[1], anon[1]]
        self.ack("complete", [item(x, result=i) for i, x in enumerate(batch)])
        self.assertEqual(self.get_worker(a["id"])["completed"], 3)
        self.assertEqual(self.get_worker(b["id"])["completed"], 2)
        # A refused batch counts nothing: its earlier completions are rolled back.
        self.put(8, 9)
        lc = self.lease(worker=a["id"], max=2)
        stale = dict(item(lc[1]), token=lc[1]["token"] + 10**6)
        self.expect_error("POST", "/v1/leases/complete", {"leases": [item(lc[0]), stale]},
                          409, "lease_lost")
        self.assertEqual(self.get_worker(a["id"])["completed"], 3)
        self.ack("complete", [item(x) for x in lc])
        self.assertEqual(self.get_worker(a["id"])["completed"], 5)

    def test_leaderboard(self):
        self.create_queue()
        nick_a, nick_b = self.qname("alice"), self.qname("bob")
        wa1, wa2 = self.register(nickname=nick_a), self.register(nickname=nick_a)
        wb = self.register(nickname=nick_b)
        self.put(*range(8))
        plan = [(wa1, 2, "complete"), (wa2, 1, "complete"), (wb, 4, "complete"),
                (wa1, 1, "fail")]
        for w, n, kind in plan:
            leases = self.lease(worker=w["id"], max=n)
            self.assertEqual(len(leases), n)
            extra = {"permanent": True} if kind == "fail" else {}
            self.ack(kind, [item(x, **extra) for x in leases])
        board = self.expect("GET", "/v1/leaderboard")["leaderboard"]
        totals = [e["completed"] for e in board]
        self.assertEqual(totals, sorted(totals, reverse=True), "not ordered by completed")
        mine = {e["nickname"]: e for e in board if e["nickname"] in (nick_a, nick_b)}
        self.assertEqual(mine[nick_a], {"nickname": nick_a, "completed": 3, "failed": 1,
                                        "flagged": 0, "workers": 2})
        self.assertEqual(mine[nick_b], {"nickname": nick_b, "completed": 4, "failed": 0,
                                        "flagged": 0, "workers": 1})
        names = [e["nickname"] for e in board]
        self.assertLess(names.index(nick_b), names.index(nick_a))

    def test_bye_releases_at_once(self):
        self.create_queue(backoff_ms=60000)
        w = self.register(nickname="leaver")
        ids = self.put("a", "b", "c")
        leases = self.lease(worker=w["id"], max=2)
        r = self.expect("DELETE", "/v1/workers/%d" % w["id"])
        self.assertEqual(r, {"id": w["id"], "released": 2})
        for x in leases:
            t = self.get_task(x["task"])
            self.assertEqual((t["state"], t["attempts"], t["lease"]), ("queued", 0, None), t)
        self.assertEqual(self.get_worker(w["id"])["state"], "gone")
        self.assert_counts(queued=3)
        # Released without backoff: leasable again at once.
        self.assertEqual([x["task"] for x in self.lease(max=3)], ids)
        for x in leases:
            self.expect_error("POST", "/v1/leases/complete", {"leases": [item(x)]}, 409,
                              "lease_lost")
        self.expect_error("POST", "/v1/workers/%d/heartbeat" % w["id"], {}, 404,
                          "worker_not_found")
        self.expect_error("POST", "/v1/queues/%s/lease" % self.q, {"worker": w["id"]}, 404,
                          "worker_not_found")
        self.expect_error("DELETE", "/v1/workers/%d" % w["id"], None, 404, "worker_not_found")

    def test_registration_sent_again_finds_its_worker(self):
        # A registration whose reply was lost is sent again with the same instance: the
        # head answers with the worker the first one made, and makes no second one.
        before = len(self.expect("GET", "/v1/workers")["workers"])
        w = self.register(nickname="again", instance="0123abcd.proc-7", timeout_ms=45000)
        r = self.expect("POST", "/v1/workers", {"nickname": "again", "instance": "0123abcd.proc-7",
                                                "timeout_ms": 45000}, status=200)
        self.assertEqual(r, dict(w, repeated=True))
        self.assertEqual(len(self.expect("GET", "/v1/workers")["workers"]), before + 1)
        # Another instance is another worker; once the first has gone, its instance
        # registers a new one.
        other = self.register(nickname="again", instance="another-one")
        self.assertNotEqual(other["id"], w["id"])
        self.expect("DELETE", "/v1/workers/%d" % w["id"])
        anew = self.register(nickname="again", instance="0123abcd.proc-7")
        self.assertNotIn(anew["id"], (w["id"], other["id"]))
        for bad in ("", "has space", "x" * 129, 7):
            with self.subTest(instance=bad):
                r = self.expect_error("POST", "/v1/workers", {"instance": bad}, 400,
                                      "invalid_argument")
                self.assertIn("instance", r.json["error"]["message"])

    def test_bye_without_leases(self):
        w = self.register()
        self.assertEqual(self.expect("DELETE", "/v1/workers/%d" % w["id"]),
                         {"id": w["id"], "released": 0})

    def test_progress_after_leaving(self):
        # A goodbye clears the worker's progress (it describes nothing now); a crash
        # reported by its node keeps it: what the worker was doing when it died.
        left, crashed = self.register(), self.register()
        for w in (left, crashed):
            self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "task 83"})
        self.expect("DELETE", "/v1/workers/%d" % left["id"])
        self.expect("DELETE", "/v1/workers/%d?crashed=true" % crashed["id"])
        self.assertEqual([(x["state"], x["progress"]) for x in (self.get_worker(left["id"]),
                                                                self.get_worker(crashed["id"]))],
                         [("gone", None), ("gone", "task 83")])


class WorkerTimeoutTest(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--worker-timeout-ms", "500")

    def test_default_timeout_from_flag(self):
        self.assertEqual(self.register()["timeout_ms"], 500)

    def test_timeout_releases_leases(self):
        self.create_queue(backoff_ms=0, lease_ms=600000)
        w = self.register(nickname="sleepy")
        keeper = self.register(nickname="keeper", timeout_ms=60000)
        ids = self.put("a", "b", "c")
        mine = self.lease(worker=w["id"], max=2)
        kept = self.lease_one(worker=keeper["id"])
        # It stops heart-beating: marked gone, its leases return (counted as an attempt).
        harness.wait_until(lambda: self.get_task(ids[0])["state"] == "queued"
                           and self.get_task(ids[1])["state"] == "queued",
                           timeout=10, what="the timed-out worker's leases to return")
        gone = self.expect("GET", "/v1/workers/%d" % w["id"])
        self.assertEqual(gone["state"], "gone")
        self.assertGreaterEqual(now_ms(), gone["last_seen_ms"] + 500 - 20)
        for tid in ids[:2]:
            t = self.get_task(tid)
            self.assertEqual((t["attempts"], t["lease"]), (1, None), t)
        self.expect_error("POST", "/v1/workers/%d/heartbeat" % w["id"], {}, 404,
                          "worker_not_found")
        self.expect_error("POST", "/v1/queues/%s/lease" % self.q, {"worker": w["id"]}, 404,
                          "worker_not_found")
        for x in mine:
            self.expect_error("POST", "/v1/leases/complete", {"leases": [item(x)]}, 409,
                              "lease_lost")
        # The worker with a longer timeout is untouched.
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % keeper["id"])["state"], "active")
        self.assertEqual(self.get_task(kept["task"])["state"], "leased")
        again = self.lease(max=2)
        self.assertEqual([(x["task"], x["attempt"]) for x in again], [(ids[0], 2), (ids[1], 2)])

    def test_heartbeats_keep_a_worker_alive(self):
        self.create_queue(lease_ms=600000)
        w = self.register()
        [tid] = self.put("a")
        self.lease_one(worker=w["id"])
        end = now_ms() + 1500
        while now_ms() < end:
            self.expect("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "busy"})
            t0 = now_ms()
            harness.wait_until(lambda: now_ms() >= t0 + 100, what="100 ms")
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w["id"])["state"], "active")
        self.assertEqual(self.get_task(tid)["state"], "leased")


if __name__ == "__main__":
    unittest.main()
