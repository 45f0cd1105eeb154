"""Pipelines (a queue's `next`) and invalid-data flags rolling a task back one stage
(docs/api.md: queue `next`, `POST /v1/leases/complete`, `POST /v1/leases/flag`)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase  # noqa: E402


def item(lease, **extra):
    return dict({"task": lease["task"], "token": lease["token"]}, **extra)


class PipelineTest(ApiTestCase):

    def three_stages(self, **settings):
        a, b, c = self.qname("a"), self.qname("b"), self.qname("c")
        self.create_queue(c, **settings)
        self.create_queue(b, next=c, **settings)
        self.create_queue(a, next=b, **settings)
        return a, b, c

    def test_three_stages(self):
        a, b, c = self.three_stages()
        [t1] = self.put({"n": 1}, name=a, session="s1", index=4, priority=7)
        [other] = self.put({"n": 100}, name=a)   # no session: carries nulls
        # Stage a.
        la, lo = self.lease(a, max=2)
        self.assertEqual(la["task"], t1)
        r = self.ack("complete", [item(la, result={"n": 2}), item(lo, result="plain")])
        [ca, co] = r["completed"]
        self.assertEqual(ca["task"], t1)
        t2 = ca["next_task"]
        self.assertIsInstance(t2, int)
        self.assertIsInstance(co["next_task"], int)
        self.assertNotEqual(t2, co["next_task"])
        task2 = self.get_task(t2)
        self.assertEqual((task2["queue"], task2["state"], task2["payload"], task2["parent"],
                          task2["session"], task2["index"], task2["attempts"], task2["result"],
                          task2["priority"]),
                         (b, "queued", {"n": 2}, t1, "s1", 4, 0, None, 7))
        o2 = self.get_task(co["next_task"])
        self.assertEqual((o2["queue"], o2["payload"], o2["parent"], o2["session"], o2["index"],
                          o2["priority"]), (b, "plain", other, None, None, 0))
        self.assertEqual(self.get_task(t1)["result"], {"n": 2})
        # Stage b: the lease carries parent, session and index.
        lb = [x for x in self.lease(b, max=2) if x["task"] == t2][0]
        self.assertEqual((lb["payload"], lb["parent"], lb["session"], lb["index"]),
                         ({"n": 2}, t1, "s1", 4))
        r = self.ack("complete", [item(lb, result={"n": 3})])
        t3 = r["completed"][0]["next_task"]
        task3 = self.get_task(t3)
        self.assertEqual((task3["queue"], task3["payload"], task3["parent"], task3["session"],
                          task3["index"]), (c, {"n": 3}, t2, "s1", 4))
        # Stage c, the last: no next task.
        lc = self.lease_one(c)
        self.assertEqual((lc["task"], lc["parent"], lc["session"], lc["index"]),
                         (t3, t2, "s1", 4))
        r = self.ack("complete", [item(lc, result={"n": 4})])
        self.assertEqual(r, {"completed": [{"task": t3, "next_task": None}]})
        self.assertEqual(self.get_task(t3)["result"], {"n": 4})
        self.assert_counts(a, done=2)
        self.assert_counts(b, done=1, leased=1)
        self.assert_counts(c, done=1)

    def test_complete_without_result_into_next_stage(self):
        a, b, _ = self.three_stages()
        [tid] = self.put("x", name=a)
        r = self.ack("complete", [item(self.lease_one(a))])
        nxt = self.get_task(r["completed"][0]["next_task"])
        self.assertEqual((nxt["queue"], nxt["payload"], nxt["parent"]), (b, None, tid))

    def test_failed_task_does_not_advance(self):
        a, b, _ = self.three_stages(backoff_ms=0)
        self.put("x", name=a)
        r = self.ack("fail", [item(self.lease_one(a), permanent=True)])
        self.assertEqual(r["failed"][0]["state"], "failed")
        self.assert_counts(b)


class FlagRollbackTest(ApiTestCase):

    def test_flag_at_stage_two_reopens_parent(self):
        a, b = self.qname("a"), self.qname("b")
        self.create_queue(b, max_flags=2, backoff_ms=0)
        self.create_queue(a, next=b, max_flags=5, backoff_ms=0)
        [pa] = self.put({"img": 1}, name=a, session="s", index=2)
        la = self.lease_one(a)
        nb = self.ack("complete", [item(la, result={"emb": 1})])["completed"][0]["next_task"]
        # First flag: back to queued in b.
        lb = self.wait_lease(b)[0]
        self.assertEqual(lb["task"], nb)
        r = self.ack("flag", [item(lb, reason="corrupt")])
        self.assertEqual(r, {"flagged": [{"task": nb, "state": "queued", "reopened": None}]})
        self.assertEqual(self.get_task(pa)["state"], "done")
        # Second flag reaches max_flags: the parent is re-opened, this task cancelled.
        lb = self.wait_lease(b)[0]
        self.assertEqual(lb["task"], nb)
        r = self.ack("flag", [item(lb, reason="corrupt again")])
        self.assertEqual(r, {"flagged": [{"task": nb, "state": "cancelled", "reopened": pa}]})
        child = self.get_task(nb)
        self.assertEqual((child["state"], child["lease"]), ("cancelled", None))
        parent = self.get_task(pa)
        self.assertEqual((parent["state"], parent["result"], parent["flags"], parent["attempts"],
                          parent["lease"]), ("queued", None, 0, 0, None), parent)
        self.assert_counts(a, queued=1)
        self.assert_counts(b, cancelled=1)
        self.assertEqual(self.lease(b), [])
        # The parent runs again and produces a fresh stage-b task.
        la2 = self.wait_lease(a)[0]
        self.assertEqual((la2["task"], la2["attempt"], la2["session"], la2["index"]),
                         (pa, 1, "s", 2))
        nb2 = self.ack("complete", [item(la2, result={"emb": 2})])["completed"][0]["next_task"]
        self.assertNotEqual(nb2, nb)
        fresh = self.get_task(nb2)
        self.assertEqual((fresh["state"], fresh["payload"], fresh["flags"], fresh["parent"]),
                         ("queued", {"emb": 2}, 0, pa))
        self.assert_counts(b, queued=1, cancelled=1)
        # The cancelled task's old token is dead.
        self.expect_error("POST", "/v1/leases/complete", {"leases": [item(lb)]}, 409,
                          "lease_lost")

    def test_flag_at_stage_three_reopens_stage_two(self):
        a, b, c = self.qname("a"), self.qname("b"), self.qname("c")
        self.create_queue(c, max_flags=1, backoff_ms=0)
        self.create_queue(b, next=c, backoff_ms=0)
        self.create_queue(a, next=b, backoff_ms=0)
        [ta] = self.put(1, name=a)
        tb = self.ack("complete", [item(self.lease_one(a), result=2)])["completed"][0]["next_task"]
        tc = self.ack("complete", [item(self.lease_one(b), result=3)])["completed"][0]["next_task"]
        r = self.ack("flag", [item(self.lease_one(c))])
        self.assertEqual(r, {"flagged": [{"task": tc, "state": "cancelled", "reopened": tb}]})
        self.assertEqual(self.get_task(tb)["state"], "queued")
        self.assertEqual(self.get_task(ta)["state"], "done", "only one stage back")
        self.assert_counts(a, done=1)
        self.assert_counts(b, queued=1)
        self.assert_counts(c, cancelled=1)

    def test_flag_at_stage_one_is_dead(self):
        a, b = self.qname("a"), self.qname("b")
        self.create_queue(b)
        self.create_queue(a, next=b, max_flags=2, backoff_ms=0)
        [ta] = self.put("x", name=a)
        r = self.ack("flag", [item(self.lease_one(a))])
        self.assertEqual(r["flagged"][0]["state"], "queued")
        r = self.ack("flag", [item(self.wait_lease(a)[0])])
        self.assertEqual(r, {"flagged": [{"task": ta, "state": "dead", "reopened": None}]})
        t = self.get_task(ta)
        self.assertEqual((t["state"], t["flags"]), ("dead", 2))
        self.assertEqual([x["id"] for x in self.list_tasks(a, state="dead")], [ta])
        self.assert_counts(a, dead=1)
        self.assert_counts(b)
        # Requeued, its flags are reset.
        t = self.expect("POST", "/v1/tasks/%d/requeue" % ta)
        self.assertEqual((t["state"], t["flags"], t["attempts"]), ("queued", 0, 0))

    def test_flag_batch_reopens_each_parent(self):
        a, b = self.qname("a"), self.qname("b")
        self.create_queue(b, max_flags=1)
        self.create_queue(a, next=b)
        parents = self.put(1, 2, name=a)
        done = self.ack("complete", [item(x) for x in self.lease(a, max=2)])["completed"]
        children = [d["next_task"] for d in done]
        leases = self.lease(b, max=2)
        r = self.ack("flag", [item(x) for x in leases])
        self.assertEqual(r["flagged"], [
            {"task": children[0], "state": "cancelled", "reopened": parents[0]},
            {"task": children[1], "state": "cancelled", "reopened": parents[1]}])
        self.assert_counts(a, queued=2)
        self.assert_counts(b, cancelled=2)


if __name__ == "__main__":
    unittest.main()
