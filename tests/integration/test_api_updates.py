"""Broadcast updates: per-queue numbering, reading, delivery with leases in order
(also to a worker that starts late), long-poll leases woken by an update, and
session-scoped updates deleted with their session (docs/api.md, "Updates")."""
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, now_ms  # noqa: E402


def hold(seconds):
    """Lets time pass (to show that something did NOT happen meanwhile)."""
    end = time.monotonic() + seconds
    harness.wait_until(lambda: time.monotonic() >= end, timeout=seconds + 5, what="time")


class Poller(threading.Thread):
    """One lease request on its own connection."""

    def __init__(self, head, queue, body):
        super().__init__(daemon=True)
        self.head, self.queue, self.body = head, queue, body
        self.reply = self.error = None
        self.finished_at = None

    def run(self):
        conn = self.head.connection(timeout=60)
        try:
            self.reply = self.head.request("POST", "/v1/queues/%s/lease" % self.queue, self.body,
                                           conn=conn)
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            self.finished_at = time.monotonic()
            conn.close()


class UpdateCase(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--max-payload", "4096")

    def post(self, data, name=None, **extra):
        body = dict(extra, data=data)
        r = self.expect("POST", "/v1/queues/%s/updates" % (name or self.q), body, status=201)
        self.assertEqual(set(r), {"queue", "seq"}, r)
        self.assertEqual(r["queue"], name or self.q)
        return r["seq"]

    def read(self, query="", name=None):
        r = self.expect("GET", "/v1/queues/%s/updates%s" % (name or self.q, query))
        self.assertEqual(set(r), {"updates", "last"}, r)
        for u in r["updates"]:
            self.assertEqual(set(u), {"seq", "data", "session", "created_ms"}, u)
        return r

    def lease_reply(self, **body):
        return self.expect("POST", "/v1/queues/%s/lease" % self.q, body)


class UpdateTest(UpdateCase):

    def test_numbering_and_reading(self):
        self.create_queue()
        other = self.create_queue(self.qname("other"))["name"]
        self.assertEqual(self.read(), {"updates": [], "last": 0})
        t0 = now_ms()
        seqs = [self.post(d) for d in ({"lr": 0.1}, "text", [1, 2], None)]
        t1 = now_ms()
        self.assertEqual(seqs, [1, 2, 3, 4])
        self.assertEqual(self.post("first", name=other), 1, "numbers are per queue")
        r = self.read()
        self.assertEqual([(u["seq"], u["data"], u["session"]) for u in r["updates"]],
                         [(1, {"lr": 0.1}, None), (2, "text", None), (3, [1, 2], None),
                          (4, None, None)])
        self.assertEqual(r["last"], 4)
        for u in r["updates"]:
            self.assert_between(u["created_ms"], t0, t1, "created_ms")
        self.assertEqual([u["seq"] for u in self.read("?after=2")["updates"]], [3, 4])
        r = self.read("?after=1&max=2")
        self.assertEqual(([u["seq"] for u in r["updates"]], r["last"]), ([2, 3], 4))
        self.assertEqual(self.read("?after=4"), {"updates": [], "last": 4})
        self.assertEqual(self.read("?after=99")["updates"], [])

    def test_errors(self):
        self.create_queue()
        path = "/v1/queues/%s/updates" % self.q
        self.expect_error("POST", "/v1/queues/no-such-queue/updates", {"data": 1}, 404,
                          "queue_not_found")
        self.expect_error("GET", "/v1/queues/no-such-queue/updates", None, 404, "queue_not_found")
        for body in ({}, {"session": None}, {"data": 1, "extra": 2}, {"data": 1, "session": 5}):
            self.expect_error("POST", path, body, 400, "invalid_argument")
        self.expect_error("POST", path, {"data": 1, "session": "s-0000000000000000"}, 404,
                          "session_not_found")
        self.expect_error("POST", path, {"data": "x" * 5000}, 413, "payload_too_large")
        for query in ("after=-1", "after=x", "max=0", "max=1001", "max=y"):
            self.expect_error("GET", path + "?" + query, None, 400, "invalid_argument")
        for body in ({"updates_after": -1}, {"updates_after": "0"}, {"updates_after": 1.5}):
            self.expect_error("POST", "/v1/queues/%s/lease" % self.q, body, 400,
                              "invalid_argument")
        # A session of another queue.
        other = self.create_queue(self.qname("other"))["name"]
        sid = self.expect("POST", "/v1/sessions", {"queue": other}, status=201)["id"]
        r = self.expect_error("POST", path, {"data": 1, "session": sid}, 400, "invalid_argument")
        self.assertIn(other, r.json["error"]["message"])
        self.assertEqual(self.read(), {"updates": [], "last": 0}, "nothing was stored")
        for method in ("PUT", "DELETE"):
            self.expect_error(method, path, None, 405, "method_not_allowed")

    def test_delivery_with_leases(self):
        self.create_queue()
        self.put(*range(4))
        # Without updates_after the reply has no update fields.
        r = self.lease_reply()
        self.assertEqual(set(r), {"leases"})
        self.post({"v": 1})
        self.post({"v": 2})
        r = self.lease_reply(updates_after=0)
        self.assertEqual(set(r), {"leases", "updates", "updates_last"})
        self.assertEqual(len(r["leases"]), 1)
        self.assertEqual([(u["seq"], u["data"]) for u in r["updates"]],
                         [(1, {"v": 1}), (2, {"v": 2})])
        self.assertEqual(r["updates_last"], 2)
        # The worker sends updates_last back: nothing new.
        r = self.lease_reply(updates_after=2)
        self.assertEqual((len(r["leases"]), r["updates"], r["updates_last"]), (1, [], 2))
        self.post({"v": 3})
        r = self.lease_reply(updates_after=2)
        self.assertEqual(([u["seq"] for u in r["updates"]], r["updates_last"]), ([3], 3))
        # Updates arrive even when no task is ready.
        self.lease_reply()
        self.assertEqual(self.lease_reply()["leases"], [])
        self.post({"v": 4})
        r = self.lease_reply(updates_after=3)
        self.assertEqual((r["leases"], [u["seq"] for u in r["updates"]], r["updates_last"]),
                         ([], [4], 4))

    def test_late_worker_gets_all(self):
        self.create_queue()
        for i in range(5):
            self.post({"step": i})
        self.put("task")
        w = self.register(queues=[self.q])
        r = self.lease_reply(worker=w["id"], updates_after=0)
        self.assertEqual([u["data"]["step"] for u in r["updates"]], list(range(5)))
        self.assertEqual([u["seq"] for u in r["updates"]], [1, 2, 3, 4, 5])
        self.assertEqual((len(r["leases"]), r["updates_last"]), (1, 5))

    def test_session_updates_deleted_on_close(self):
        self.create_queue()
        sid = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        self.post("global")
        self.assertEqual(self.post("scoped", session=sid), 2)
        r = self.read()
        self.assertEqual([(u["data"], u["session"]) for u in r["updates"]],
                         [("global", None), ("scoped", sid)])
        self.assertEqual(self.expect("GET", "/v1/sessions/" + sid)["updates"], 2)
        self.expect("DELETE", "/v1/sessions/" + sid)
        r = self.read()
        self.assertEqual(([u["data"] for u in r["updates"]], r["last"]), (["global"], 2))
        # Numbers never repeat; a worker past 2 sees no gap problem.
        self.assertEqual(self.post("after"), 3)
        self.put("t")
        r = self.lease_reply(updates_after=0)
        self.assertEqual(([u["seq"] for u in r["updates"]], r["updates_last"]), ([1, 3], 3))

    def test_queue_delete_removes_updates(self):
        self.create_queue()
        self.post(1)
        self.post(2)
        self.expect("DELETE", "/v1/queues/" + self.q)
        self.create_queue()
        r = self.read()
        self.assertEqual(r, {"updates": [], "last": 2}, "numbering goes on after a re-create")
        self.assertEqual(self.post(3), 3)


class UpdateLongPollTest(UpdateCase):
    # A long sweep: the waiter must be woken by the post itself.
    head_args = ("--sweep-ms", "10000", "--max-wait-ms", "30000")

    def poller(self, body):
        p = Poller(self.head, self.q, body)
        p.start()
        return p

    def finished(self, p, timeout=10):
        p.join(timeout)
        self.assertFalse(p.is_alive(), "long-poll did not return")
        self.assertIsNone(p.error, p.error)
        self.assertEqual(p.reply.status, 200, p.reply)
        return p.reply.json

    def test_woken_by_update(self):
        self.create_queue()
        wants = self.poller({"wait_ms": 20000, "updates_after": 0})
        plain = self.poller({"wait_ms": 20000})
        hold(0.3)
        self.assertTrue(wants.is_alive() and plain.is_alive())
        posted_at = time.monotonic()
        self.post({"lr": 0.5})
        r = self.finished(wants)
        self.assertLess(wants.finished_at - posted_at, 2.0)
        self.assertEqual((r["leases"], [u["data"] for u in r["updates"]], r["updates_last"]),
                         ([], [{"lr": 0.5}], 1))
        # A lease that wants no updates keeps waiting for a task.
        hold(0.3)
        self.assertTrue(plain.is_alive(), "woken by an update it did not ask for")
        [tid] = self.put("work")
        r = self.finished(plain)
        self.assertEqual(([x["task"] for x in r["leases"]], set(r)), ([tid], {"leases"}))

    def test_waiter_behind_a_plain_one_is_woken(self):
        """An update wakes a waiter that wants it even when an older waiter wants none."""
        self.create_queue()
        plain = self.poller({"wait_ms": 20000})
        hold(0.2)
        wants = self.poller({"wait_ms": 20000, "updates_after": 0})
        hold(0.2)
        self.post("u")
        r = self.finished(wants)
        self.assertEqual([u["seq"] for u in r["updates"]], [1])
        self.assertTrue(plain.is_alive())
        self.put("release the plain waiter")
        self.finished(plain)

    def test_woken_by_task_with_updates(self):
        self.create_queue()
        self.post("old")
        p = self.poller({"wait_ms": 20000, "updates_after": 1})
        hold(0.3)
        self.assertTrue(p.is_alive(), "no news: it waits")
        [tid] = self.put("work")
        r = self.finished(p)
        self.assertEqual(([x["task"] for x in r["leases"]], r["updates"], r["updates_last"]),
                         ([tid], [], 1))

    def test_timeout_reply(self):
        self.create_queue()
        self.post("a")
        r = self.lease_reply(wait_ms=200, updates_after=1)
        self.assertEqual(r, {"leases": [], "updates": [], "updates_last": 1})

    def assert_text(self, reply, keys):
        """`reply` is compact JSON, its fields `keys` in this order."""
        self.assertEqual(reply.status, 200, reply)
        text = reply.raw.rstrip(b"\n")
        self.assertEqual([k for k, _ in json.loads(text, object_pairs_hook=lambda p: p)], keys,
                         text[:300])
        compact = json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)
        self.assertEqual(text, compact.encode())

    def complete_and_lease(self, lease, result, next_lease):
        """The combined call as compact text; `result` is JSON text."""
        body = '{"leases":[{"task":%d,"token":%d,"result":%s}],"lease":%s}' % (
            lease["task"], lease["token"], result, json.dumps(next_lease))
        return self.call("POST", "/v1/leases/complete", raw=body.encode())

    def test_lease_replies_as_text(self):
        """Every lease reply is written whole as text (docs/design-notes.md, "Stored JSON
        text spliced into replies"): compact, its fields in the order they always had,
        answered at once, after completions (the scanner's body and the tree's), woken
        by an update or a task, or at its timeout."""
        self.create_queue()
        self.post({"lr": 0.5, "s": "\u00e9\n"})
        self.put("a", "b", "c")
        r = self.call("POST", "/v1/queues/%s/lease" % self.q, {"max": 1, "updates_after": 0})
        self.assert_text(r, ["leases", "updates", "updates_last"])
        wants = {"queue": self.q, "max": 1, "updates_after": 0}
        r = self.complete_and_lease(r.json["leases"][0], '"ok"', wants)
        self.assert_text(r, ["completed", "leases", "updates", "updates_last"])
        self.assertEqual(len(r.json["leases"]), 1, r)
        # 1E2 is not canonical: the body takes the tree path.
        r = self.complete_and_lease(r.json["leases"][0], "1E2", {"queue": self.q, "max": 5})
        self.assert_text(r, ["completed", "leases"])
        self.assertEqual(len(r.json["leases"]), 1, r)
        p = self.poller({"wait_ms": 20000, "updates_after": 1})
        hold(0.3)
        self.post("news")
        self.finished(p)
        self.assert_text(p.reply, ["leases", "updates", "updates_last"])
        p = self.poller({"wait_ms": 20000})
        hold(0.3)
        self.put("d")
        self.finished(p)
        self.assert_text(p.reply, ["leases"])
        r = self.call("POST", "/v1/queues/%s/lease" % self.q, {"wait_ms": 200, "updates_after": 2})
        self.assert_text(r, ["leases", "updates", "updates_last"])
        self.assertEqual(r.json, {"leases": [], "updates": [], "updates_last": 2})


if __name__ == "__main__":
    unittest.main()
