"""A fail, release or flag sent again under the token whose lease it ended (a retry after its
reply was lost, as around a restart of the head) is answered as a repeat: the first
reply's shape marked as a repeat, nothing changed and nothing counted twice, also across
a restart.  Any other token stays lease_lost, and a lease granted since keeps the task
(docs/api.md, "Retrying a fail, release or flag")."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import OwnHeadTestCase  # noqa: E402

SAMPLE = re.compile(r'^muster_(tasks_failed|tasks_retried|tasks_dead)_total\{queue="([^"]*)"\} '
                    r'(\S+)$')


def item(lease, **extra):
    return dict({"task": lease["task"], "token": lease["token"]}, **extra)


class ReportRetryTest(OwnHeadTestCase):
    """Each test has its own head: one of them restarts it."""

    def ack(self, kind, items):
        return self.expect("POST", "/v1/leases/" + kind, {"leases": items})

    def failure_metrics(self):
        """{name: value} of the queue's fail, retry and dead counters above 0."""
        text = self.expect_text("GET", "/metrics")
        return {m.group(1): float(m.group(3)) for m in map(SAMPLE.match, text.splitlines())
                if m and m.group(2) == self.q and float(m.group(3)) > 0}

    def expect_text(self, method, path):
        r = self.call(method, path)
        self.assertEqual(r.status, 200, r)
        return r.raw.decode()

    def worker_failed(self, w):
        return self.expect("GET", "/v1/workers/%d" % w["id"])["failed"]

    def worker_flagged(self, w):
        return self.expect("GET", "/v1/workers/%d" % w["id"])["flagged"]

    def state(self, tid):
        """What a repeat must leave as it was: the task and its queue's counts."""
        t = self.get_task(tid)
        return t, self.counts()

    def test_fail_repeated(self):
        self.create_queue(backoff_ms=60000, max_attempts=3)
        w = self.register(nickname=self.qname("nick"))
        [tid] = self.put("a")
        lease = self.lease_one(worker=w["id"])
        [first] = self.ack("fail", [item(lease, error="boom")])["failed"]
        self.assertEqual((first["task"], first["state"]), (tid, "queued"))
        before, metrics = self.state(tid), self.failure_metrics()
        self.assertEqual(metrics, {"tasks_failed": 1, "tasks_retried": 1})
        # Sent again, as a worker retries it; its error or permanence does not matter.
        for extra in ({"error": "boom"}, {"error": "other", "permanent": True}, {}):
            again = self.ack("fail", [item(lease, **extra)])
            self.assertEqual(again, {"failed": [dict(first, repeated=True)]})
        self.assertEqual(self.state(tid), before)
        t = before[0]
        self.assertEqual((t["state"], t["attempts"], t["error"]), ("queued", 1, "boom"))
        self.assertEqual(self.failure_metrics(), metrics, "a repeat counted")
        self.assertEqual(self.worker_failed(w), 1)
        self.assert_counts(queued=1)

    def test_permanent_and_dead_fail_repeated(self):
        self.create_queue(max_attempts=1)
        ta, tb = self.put("a", "b")
        la, lb = self.lease(max=2)
        first = self.ack("fail", [item(la, permanent=True), item(lb, error="last")])["failed"]
        self.assertEqual([(e["task"], e["state"]) for e in first],
                         [(ta, "failed"), (tb, "dead")])
        before = self.state(ta), self.state(tb), self.failure_metrics()
        again = self.ack("fail", [item(la), item(lb)])
        self.assertEqual(again, {"failed": [dict(e, repeated=True) for e in first]})
        self.assertEqual((self.state(ta), self.state(tb), self.failure_metrics()), before)

    def test_release_repeated(self):
        self.create_queue(backoff_ms=60000)
        ta, tb = self.put("a", "b")
        la, lb = self.lease(max=2)
        self.assertEqual(self.ack("release", [item(la)]), {"released": 1})
        before = self.get_task(ta)
        self.assertEqual((before["state"], before["attempts"]), ("queued", 0))
        self.assertEqual(self.ack("release", [item(la)]), {"released": 1, "repeated": 1})
        # A repeat beside a fresh release: both count as released, one as a repeat.
        self.assertEqual(self.ack("release", [item(la), item(lb)]),
                         {"released": 2, "repeated": 1})
        self.assertEqual(self.get_task(ta), before)
        self.assertEqual(self.get_task(tb)["attempts"], 0)
        self.assert_counts(queued=2)

    def test_flag_repeated(self):
        """A flag that sent the task back to queued, then one that made it dead: each is
        answered again as it was, and no second flag is counted."""
        self.create_queue(backoff_ms=0, max_flags=2)
        w = self.register(nickname=self.qname("nick"))
        [tid] = self.put("a")
        first = self.lease_one(worker=w["id"])
        [flagged] = self.ack("flag", [item(first, reason="corrupt")])["flagged"]
        self.assertEqual(flagged, {"task": tid, "state": "queued", "reopened": None})
        before = self.state(tid)
        # Sent again, as a worker retries it; its reason does not matter.
        for extra in ({"reason": "corrupt"}, {"reason": "other"}, {}):
            self.assertEqual(self.ack("flag", [item(first, **extra)]),
                             {"flagged": [dict(flagged, repeated=True)]})
        self.assertEqual(self.state(tid), before)
        self.assertEqual((before[0]["flags"], before[0]["attempts"]), (1, 0))
        self.assertEqual(self.worker_flagged(w), 1)
        # The second flag reaches max_flags: dead, and its repeat says so.
        second = self.lease_one(worker=w["id"])
        [dead] = self.ack("flag", [item(second)])["flagged"]
        self.assertEqual(dead["state"], "dead")
        before = self.state(tid)
        self.assertEqual(self.ack("flag", [item(second)]),
                         {"flagged": [dict(dead, repeated=True)]})
        self.assertEqual(self.state(tid), before)
        self.assertEqual(before[0]["flags"], 2)
        self.assertEqual(self.worker_flagged(w), 2)
        self.assert_counts(dead=1)
        # The first flag's lease is no longer the task's last to end: refused.
        r = self.expect_error("POST", "/v1/leases/flag", {"leases": [item(first)]}, 409,
                              "lease_lost")
        self.assertIn("token %d is not its last lease" % first["token"],
                      r.json["error"]["message"])

    def test_flag_that_reopened_a_parent_repeated(self):
        """A flag that cancelled a stage-two task and re-opened its parent, sent again after
        the parent was leased anew: the same answer, and the parent's new lease untouched."""
        a, b = self.qname("a"), self.qname("b")
        self.create_queue(b, max_flags=1)
        self.create_queue(a, next=b)
        [parent] = self.put("p", name=a)
        child = self.ack("complete", [item(self.lease_one(a), result=1)])["completed"]
        child = child[0]["next_task"]
        lc = self.lease_one(b)
        first = self.ack("flag", [item(lc, reason="bad")])
        self.assertEqual(first, {"flagged": [{"task": child, "state": "cancelled",
                                              "reopened": parent}]})
        again = self.lease_one(a)
        self.assertEqual(again["task"], parent)
        before = self.get_task(child), self.get_task(parent), self.counts(a), self.counts(b)
        self.assertEqual(self.ack("flag", [item(lc, reason="bad")]),
                         {"flagged": [dict(first["flagged"][0], repeated=True)]})
        self.assertEqual((self.get_task(child), self.get_task(parent), self.counts(a),
                          self.counts(b)), before)
        self.assertEqual(before[1]["state"], "leased")
        self.ack("complete", [item(again, result=2)])
        self.assertEqual(self.get_task(parent)["result"], 2)

    def test_repeat_after_a_restart(self):
        self.create_queue(backoff_ms=60000, lease_ms=600000)
        w = self.register(nickname=self.qname("nick"))
        tf, tr, tg = self.put("f", "r", "g")
        lf, lr, lg = self.lease(max=3, worker=w["id"])
        [first] = self.ack("fail", [item(lf, error="boom")])["failed"]
        self.ack("release", [item(lr)])
        [flagged] = self.ack("flag", [item(lg)])["flagged"]
        before = self.state(tf), self.state(tr), self.state(tg)
        # The head goes down right after committing; the worker sends its reports again.
        self.assertEqual(self.head.stop(), 0, self.head.log())
        self.head.start()
        self.assertEqual(self.ack("fail", [item(lf, error="boom")]),
                         {"failed": [dict(first, repeated=True)]})
        self.assertEqual(self.ack("release", [item(lr)]), {"released": 1, "repeated": 1})
        self.assertEqual(self.ack("flag", [item(lg)]),
                         {"flagged": [dict(flagged, repeated=True)]})
        self.assertEqual((self.state(tf), self.state(tr), self.state(tg)), before)
        self.assertEqual(self.failure_metrics(), {}, "a repeat counted after the restart")
        self.assertEqual((self.worker_failed(w), self.worker_flagged(w)), (1, 1))
        # Killed, not stopped: the same.
        self.head.kill()
        self.head.start()
        self.assertEqual(self.ack("fail", [item(lf)]), {"failed": [dict(first, repeated=True)]})
        self.assertEqual((self.state(tf), self.state(tr), self.state(tg)), before)

    def test_repeat_after_the_task_was_leased_again(self):
        """The retry arrives after another worker leased the task: the new lease is
        untouched, and the old fail is still answered as a repeat."""
        self.create_queue(backoff_ms=0)
        [tid] = self.put("a")
        old = self.lease_one()
        [first] = self.ack("fail", [item(old, error="boom")])["failed"]
        new = self.lease_one()
        self.assertEqual((new["task"], new["attempt"]), (tid, 2))
        before = self.state(tid)
        self.assertEqual(self.ack("fail", [item(old, error="boom")]),
                         {"failed": [dict(first, repeated=True)]})
        self.assertEqual(self.state(tid), before)
        self.assertEqual(before[0]["state"], "leased")
        # A release under the old token is not what ended it: refused, and it says so.
        r = self.expect_error("POST", "/v1/leases/release", {"leases": [item(old)]}, 409,
                              "lease_lost")
        self.assertIn("already ended (a fail under this token ended it), and the task was "
                      "leased again since (it is leased now)", r.json["error"]["message"])
        # The new holder still holds it.
        self.ack("complete", [item(new, result="second")])
        self.assertEqual(self.get_task(tid)["result"], "second")

    def test_stale_token_after_a_later_end(self):
        """Only the last lease to end is answered as a repeat: once the lease granted after
        a fail ends too, a fail under the older token is lease_lost again."""
        self.create_queue(backoff_ms=0, max_attempts=10)
        [tid] = self.put("a")
        old = self.lease_one()
        self.ack("fail", [item(old, error="first")])
        new = self.lease_one()
        self.ack("fail", [item(new, error="second")])
        before = self.state(tid)
        r = self.expect_error("POST", "/v1/leases/fail", {"leases": [item(old)]}, 409,
                              "lease_lost")
        self.assertIn("token %d is not its last lease" % old["token"],
                      r.json["error"]["message"])
        self.assertEqual(self.state(tid), before)
        self.assertEqual(before[0]["attempts"], 2)
        # The newer one is the repeat.
        self.assertEqual(self.ack("fail", [item(new)])["failed"][0]["repeated"], True)

    def test_stale_token_after_a_later_completion(self):
        """A completion ends a lease too: after the next holder completed the task, a fail
        under the older token is lease_lost, and the result stays."""
        self.create_queue(backoff_ms=0)
        [tid] = self.put("a")
        old = self.lease_one()
        self.ack("fail", [item(old, error="first")])
        new = self.lease_one()
        self.ack("complete", [item(new, result="done")])
        before = self.state(tid)
        r = self.expect_error("POST", "/v1/leases/fail", {"leases": [item(old)]}, 409,
                              "lease_lost")
        self.assertIn("already ended (a fail under this token ended it), and the task was "
                      "leased again since (it is done now)", r.json["error"]["message"])
        self.assertEqual(self.state(tid), before)

    def test_other_calls_under_a_failed_token(self):
        """A fail's token is refused to everything else; a release's to a fail, a flag's to
        everything but a flag."""
        self.create_queue(backoff_ms=60000)
        tf, tr, tg = self.put("f", "r", "g")
        lf, lr, lg = self.lease(max=3)
        self.ack("fail", [item(lf)])
        self.ack("release", [item(lr)])
        self.ack("flag", [item(lg)])
        before = self.state(tf), self.state(tr), self.state(tg)
        for kind in ("complete", "extend", "release", "flag"):
            r = self.expect_error("POST", "/v1/leases/" + kind, {"leases": [item(lf)]}, 409,
                                  "lease_lost")
            self.assertIn("the lease of task %d under token %d already ended (the task is "
                          "queued now): a fail under this token ended it"
                          % (tf, lf["token"]), r.json["error"]["message"])
        for kind in ("complete", "fail", "extend", "flag"):
            r = self.expect_error("POST", "/v1/leases/" + kind, {"leases": [item(lr)]}, 409,
                                  "lease_lost")
            self.assertIn("a release under this token ended it", r.json["error"]["message"])
        for kind in ("complete", "fail", "extend", "release"):
            r = self.expect_error("POST", "/v1/leases/" + kind, {"leases": [item(lg)]}, 409,
                                  "lease_lost")
            self.assertIn("an invalid-data flag under this token ended it",
                          r.json["error"]["message"])
        self.assertEqual((self.state(tf), self.state(tr), self.state(tg)), before)

    def test_expired_token_is_refused(self):
        """A lease that expired was not ended by a fail: a fail under its token is refused
        and charges nothing."""
        self.create_queue(lease_ms=200, backoff_ms=60000)
        [tid] = self.put("a")
        lease = self.lease_one()
        self.wait_state(tid, "queued")
        before = self.state(tid)
        r = self.expect_error("POST", "/v1/leases/fail", {"leases": [item(lease)]}, 409,
                              "lease_lost")
        self.assertIn("it expired, or its worker timed out, crashed or said goodbye",
                      r.json["error"]["message"])
        self.assertEqual(self.state(tid), before)

    def test_batch_with_a_repeat_and_a_stale_token_changes_nothing(self):
        self.create_queue(backoff_ms=60000)
        ta, tb = self.put("a", "b")
        la, lb = self.lease(max=2)
        self.ack("fail", [item(la)])
        before = self.state(ta), self.state(tb)
        stale = dict(item(lb), token=lb["token"] + 7777777)
        r = self.expect_error("POST", "/v1/leases/fail", {"leases": [item(la), stale]}, 409,
                              "lease_lost")
        self.assertIn("leases[1]", r.json["error"]["message"])
        self.assertEqual((self.state(ta), self.state(tb)), before)


if __name__ == "__main__":
    unittest.main(verbosity=2)
