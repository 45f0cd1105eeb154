"""Queues: create, update, get, list with counts, purge, requeue, delete (docs/api.md)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import (ApiTestCase, QUEUE_KEYS, STATES, harness,  # noqa: E402
                             is_int, now_ms)

DEFAULTS = {"lease_ms": 60000, "max_attempts": 5, "backoff_ms": 1000,
            "backoff_max_ms": 60000, "next": None, "max_flags": 5}


class QueueTest(ApiTestCase):

    def assert_queue(self, q, name, settings, t0=None, t1=None):
        missing = QUEUE_KEYS - set(q)
        self.assertFalse(missing, "queue lacks %s: %r" % (sorted(missing), q))
        self.assertEqual(q["name"], name)
        for k, v in settings.items():
            self.assertEqual(q[k], v, "field %s of %r" % (k, q))
        self.assertTrue(is_int(q["created_ms"]), q)
        if t0 is not None:
            self.assert_between(q["created_ms"], t0, t1, "created_ms")
        self.assertEqual(set(q["counts"]) >= set(STATES), True, q)

    def test_create_with_defaults(self):
        t0 = now_ms()
        q = self.expect("PUT", "/v1/queues/" + self.q, {}, status=201)
        t1 = now_ms()
        self.assert_queue(q, self.q, DEFAULTS, t0, t1)
        self.assertEqual(q["counts"], {s: 0 for s in STATES})
        self.assertEqual(self.get_queue(), q)

    def test_create_with_empty_body(self):
        # "An empty body counts as {}" — also without a content type.
        r = self.call("PUT", "/v1/queues/" + self.q, None, content_type=None)
        self.assertEqual(r.status, 201, r)
        self.assert_queue(r.json, self.q, DEFAULTS)

    def test_create_with_settings(self):
        self.create_queue(self.qname("next"))
        settings = {"lease_ms": 1234, "max_attempts": 2, "backoff_ms": 10,
                    "backoff_max_ms": 20, "next": self.qname("next"), "max_flags": 3}
        q = self.expect("PUT", "/v1/queues/" + self.q, settings, status=201)
        self.assert_queue(q, self.q, settings)
        self.assertEqual(self.get_queue(), q)

    def test_update_keeps_unnamed_settings(self):
        created = self.create_queue(lease_ms=5000, max_attempts=7)
        q = self.expect("PUT", "/v1/queues/" + self.q, {"lease_ms": 9000}, status=200)
        self.assert_queue(q, self.q, dict(DEFAULTS, lease_ms=9000, max_attempts=7))
        self.assertEqual(q["created_ms"], created["created_ms"])
        q = self.expect("PUT", "/v1/queues/" + self.q,
                        {"backoff_ms": 5, "backoff_max_ms": 50, "max_flags": 1}, status=200)
        self.assert_queue(q, self.q, dict(DEFAULTS, lease_ms=9000, max_attempts=7,
                                          backoff_ms=5, backoff_max_ms=50, max_flags=1))
        # An empty update changes nothing and still answers 200.
        same = self.expect("PUT", "/v1/queues/" + self.q, {}, status=200)
        self.assertEqual(same, q)
        self.assertEqual(self.get_queue(), q)

    def test_update_keeps_tasks(self):
        self.create_queue()
        ids = self.put(1, 2, 3)
        self.expect("PUT", "/v1/queues/" + self.q, {"lease_ms": 2000}, status=200)
        self.assertEqual([t["id"] for t in self.list_tasks()], ids)
        self.assert_counts(queued=3)

    def test_next_set_and_removed(self):
        nxt = self.qname("b")
        self.create_queue(nxt)
        self.create_queue()
        q = self.expect("PUT", "/v1/queues/" + self.q, {"next": nxt}, status=200)
        self.assertEqual(q["next"], nxt)
        self.assertEqual(self.get_queue()["next"], nxt)
        q = self.expect("PUT", "/v1/queues/" + self.q, {"lease_ms": 100}, status=200)
        self.assertEqual(q["next"], nxt, "an update not naming next must keep it")
        q = self.expect("PUT", "/v1/queues/" + self.q, {"next": None}, status=200)
        self.assertIsNone(q["next"])
        self.assertIsNone(self.get_queue()["next"])

    def test_next_must_exist_and_not_be_self(self):
        # Creating with a missing next: refused, the queue is not created.
        self.expect_error("PUT", "/v1/queues/" + self.q, {"next": self.qname("missing")},
                          404, "queue_not_found")
        self.expect_error("GET", "/v1/queues/" + self.q, None, 404, "queue_not_found")
        # Naming itself: refused on create and on update.
        self.expect_error("PUT", "/v1/queues/" + self.q, {"next": self.q},
                          400, "invalid_argument")
        self.expect_error("GET", "/v1/queues/" + self.q, None, 404, "queue_not_found")
        before = self.create_queue(lease_ms=4321)
        self.expect_error("PUT", "/v1/queues/" + self.q, {"next": self.q, "lease_ms": 1},
                          400, "invalid_argument")
        self.expect_error("PUT", "/v1/queues/" + self.q,
                          {"next": self.qname("missing"), "lease_ms": 1},
                          404, "queue_not_found")
        self.assertEqual(self.get_queue(), before, "a refused update changed the queue")

    def test_get_unknown(self):
        self.expect_error("GET", "/v1/queues/" + self.qname("nope"), None, 404,
                          "queue_not_found")

    def test_list_ordered_by_name_with_counts(self):
        names = [self.qname(s) for s in ("zeta", "alpha", "mid")]
        for n in names:
            self.create_queue(n)
        self.put(1, 2, 3, name=names[0])
        self.put(1, name=names[1])
        [lease] = self.lease(names[0])
        self.ack("complete", [{"task": lease["task"], "token": lease["token"]}])
        self.lease(names[0])
        body = self.expect("GET", "/v1/queues")
        listed = body["queues"]
        all_names = [q["name"] for q in listed]
        self.assertEqual(all_names, sorted(all_names), "queues not ordered by name")
        mine = {q["name"]: q for q in listed if q["name"] in names}
        self.assertEqual(set(mine), set(names))
        for n in names:
            self.assertEqual(set(mine[n]) >= QUEUE_KEYS, True, mine[n])
            self.assertEqual(mine[n], self.get_queue(n))
        zero = {s: 0 for s in STATES}
        self.assertEqual(mine[names[0]]["counts"], dict(zero, queued=1, leased=1, done=1))
        self.assertEqual(mine[names[1]]["counts"], dict(zero, queued=1))
        self.assertEqual(mine[names[2]]["counts"], zero)

    def test_get_with_ready_count(self):
        # counts.ready: the queued tasks a lease would take now, without those waiting out
        # a delay or a retry backoff; only when asked for (it costs a pass over them).
        self.create_queue()
        leased_id, = self.put("leased")
        later, = self.put("later", delay_ms=3600000)
        soon, = self.put("soon", delay_ms=300)
        self.put("ready")
        self.assertEqual(self.lease_one()["task"], leased_id)
        path = "/v1/queues/%s?ready=true" % self.q
        self.assertNotIn("ready", self.counts(), "counts.ready is opt-in")
        self.assertNotIn("ready", self.expect("GET", "/v1/queues/%s?ready=false" % self.q)["counts"])
        got = self.expect("GET", path)
        self.assertEqual((got["counts"]["queued"], got["counts"]["leased"]), (3, 1))
        self.assertIn(got["counts"]["ready"], (1, 2))  # 2 once "soon" is due
        self.assertEqual(dict(got, counts=None), dict(self.get_queue(), counts=None))
        # The delayed task counts once its run time has come; the other one does not.
        harness.wait_until(lambda: self.expect("GET", path)["counts"]["ready"] == 2,
                           what="the task put with delay_ms=300 to count as ready")
        self.assertLessEqual(self.get_task(soon)["run_at_ms"], now_ms())
        self.assertGreater(self.get_task(later)["run_at_ms"], now_ms())
        self.expect_error("GET", "/v1/queues/%s?ready=yes" % self.q, None, 400,
                          "invalid_argument")
        self.expect_error("GET", "/v1/queues/%s?ready=true" % self.qname("nope"), None, 404,
                          "queue_not_found")

    def test_purge(self):
        self.create_queue(max_attempts=1, backoff_ms=0)
        ids = self.put(*range(6))
        a, b, c = self.lease(max=3)
        self.ack("complete", [{"task": a["task"], "token": a["token"], "result": 1}])
        self.ack("fail", [{"task": b["task"], "token": b["token"], "error": "x"}])  # dead
        self.assert_counts(queued=3, leased=1, done=1, dead=1)
        r = self.expect("POST", "/v1/queues/%s/purge" % self.q)
        self.assertEqual(r, {"purged": 3})
        self.assert_counts(leased=1, done=1, dead=1)
        left = sorted(t["id"] for t in self.list_tasks())
        self.assertEqual(left, sorted([a["task"], b["task"], c["task"]]))
        for tid in ids[3:]:
            self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")
        # The leased one is untouched: its holder can still complete it.
        self.ack("complete", [{"task": c["task"], "token": c["token"]}])
        self.assertEqual(self.expect("POST", "/v1/queues/%s/purge" % self.q), {"purged": 0})
        self.expect_error("POST", "/v1/queues/%s/purge" % self.qname("nope"), None, 404,
                          "queue_not_found")

    def test_requeue_dead_and_failed(self):
        self.create_queue(max_attempts=1, backoff_ms=0)
        ids = self.put("a", "b", "c", "d")
        la, lb, lc = self.lease(max=3)
        self.ack("fail", [{"task": la["task"], "token": la["token"], "error": "boom",
                           "permanent": True}])
        self.ack("fail", [{"task": lb["task"], "token": lb["token"], "error": "again"}])
        self.ack("complete", [{"task": lc["task"], "token": lc["token"]}])
        self.assertEqual(self.get_task(la["task"])["state"], "failed")
        self.assertEqual(self.get_task(lb["task"])["state"], "dead")
        self.assertEqual([t["id"] for t in self.list_tasks(state="dead")], [lb["task"]])
        self.assertEqual([t["id"] for t in self.list_tasks(state="failed")], [la["task"]])
        self.assert_counts(queued=1, done=1, failed=1, dead=1)
        r = self.expect("POST", "/v1/queues/%s/requeue" % self.q)
        self.assertEqual(r, {"requeued": 2})
        self.assert_counts(queued=3, done=1)
        for tid in (la["task"], lb["task"]):
            t = self.get_task(tid)
            self.assertEqual((t["state"], t["attempts"], t["flags"], t["lease"]),
                             ("queued", 0, 0, None), t)
        # They are leasable again at once, in put order.
        again = self.lease(max=10)
        self.assertEqual([x["task"] for x in again], [ids[0], ids[1], ids[3]])
        self.assertEqual([x["attempt"] for x in again], [1, 1, 1])
        self.assertEqual(self.expect("POST", "/v1/queues/%s/requeue" % self.q),
                         {"requeued": 0})
        self.expect_error("POST", "/v1/queues/%s/requeue" % self.qname("nope"), None, 404,
                          "queue_not_found")

    def test_delete(self):
        self.create_queue()
        ids = self.put(1, 2, 3, 4)
        self.lease()
        r = self.expect("DELETE", "/v1/queues/" + self.q)
        self.assertEqual(r, {"deleted": self.q, "tasks": 4, "sessions_closed": 0})
        self.expect_error("GET", "/v1/queues/" + self.q, None, 404, "queue_not_found")
        self.assertNotIn(self.q, [q["name"] for q in self.expect("GET", "/v1/queues")["queues"]])
        for tid in ids:
            self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")
        self.expect_error("DELETE", "/v1/queues/" + self.q, None, 404, "queue_not_found")
        # Re-created, it starts empty.
        q = self.create_queue()
        self.assertEqual(q["counts"], {s: 0 for s in STATES})
        self.assertEqual(self.list_tasks(), [])

    def test_delete_in_use(self):
        stage2 = self.qname("stage2")
        self.create_queue(stage2)
        self.create_queue(next=stage2)
        self.put(1, name=stage2)
        r = self.expect_error("DELETE", "/v1/queues/" + stage2, None, 409, "queue_in_use")
        self.assertIn(self.q, r.json["error"]["message"], "the message names the user")
        self.assertEqual(self.counts(stage2)["queued"], 1)
        self.expect("PUT", "/v1/queues/" + self.q, {"next": None})
        self.assertEqual(self.expect("DELETE", "/v1/queues/" + stage2),
                         {"deleted": stage2, "tasks": 1, "sessions_closed": 0})
        # Deleting the first stage of a pipeline is fine.
        self.create_queue(stage2)
        self.expect("PUT", "/v1/queues/" + self.q, {"next": stage2})
        self.assertEqual(self.expect("DELETE", "/v1/queues/" + self.q),
                         {"deleted": self.q, "tasks": 0, "sessions_closed": 0})


if __name__ == "__main__":
    unittest.main()
