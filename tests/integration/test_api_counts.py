"""A queue's counts per state (GET /v1/queues/{queue}, /metrics) against a recount of its
tasks through the listing, after every kind of transition the API offers.

The head keeps the counts apart from the tasks (src/server/counts.c), so a path that
changes tasks without counting would show here as a difference; and since listing by
state no longer has an index of its own (queued, leased, done and failed-like states
each read through another), the listing of each state is checked against the listing
of all tasks too.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, STATES  # noqa: E402

SAMPLE = re.compile(r'^muster_tasks\{queue="([^"]*)",state="([a-z]+)"\} (\d+)$', re.M)


class CountsTest(ApiTestCase):

    # ---- the check -------------------------------------------------------------

    def check(self, step, *names):
        """The counts of each queue equal the states of its listed tasks, /metrics says
        the same, and the listing of each state is that of all tasks filtered."""
        metrics = self.expect_text("/metrics")
        for name in names or (self.q,):
            tasks = self.list_tasks(name)
            recount = {s: 0 for s in STATES}
            for t in tasks:
                recount[t["state"]] += 1
            got = self.counts(name)
            self.assertEqual({s: got.get(s) for s in STATES}, recount,
                             "after %s: counts of %s" % (step, name))
            shown = {s: int(n) for q, s, n in SAMPLE.findall(metrics) if q == name}
            self.assertEqual(shown, recount, "after %s: /metrics for %s" % (step, name))
            for s in STATES:
                listed = [t["id"] for t in self.list_tasks(name, state=s)]
                self.assertEqual(listed, [t["id"] for t in tasks if t["state"] == s],
                                 "after %s: listing %s tasks of %s" % (step, s, name))
        return recount

    def expect_text(self, path):
        r = self.call("GET", path)
        self.assertEqual(r.status, 200, r)
        return r.raw.decode()

    def leased(self, n, name=None, **body):
        leases = self.lease(name, max=n, **body)
        self.assertEqual(len(leases), n, leases)
        return leases

    @staticmethod
    def item(lease, **extra):
        return dict(extra, task=lease["task"], token=lease["token"])

    # ---- transitions -----------------------------------------------------------

    def test_task_transitions(self):
        self.create_queue(max_attempts=2, backoff_ms=0, backoff_max_ms=0, max_flags=2)
        self.check("create")
        self.put(1)
        self.check("put one")
        self.put_tasks([{"payload": 2}, {"payload": 3, "key": "k"}, {"payload": 4},
                        {"payload": 5}, {"payload": 6}, {"payload": 7}])
        self.put_tasks([{"payload": 8, "key": "k"}])
        self.assert_counts(queued=7)
        self.check("put batch, and a key again")

        ls = self.leased(6)
        self.check("lease")
        self.ack("extend", [self.item(ls[0], lease_ms=60000)])
        self.check("extend")
        self.ack("complete", [self.item(ls[0], result="r")])
        self.check("complete")
        self.ack("fail", [self.item(ls[1], permanent=True)])
        self.check("fail permanently")
        self.ack("fail", [self.item(ls[2], error="again")])
        self.check("fail with a retry")
        self.ack("release", [self.item(ls[3])])
        self.check("release")
        self.ack("flag", [self.item(ls[4], reason="odd")])
        self.check("flag below max_flags")
        self.expect_error("POST", "/v1/leases/complete",
                          {"leases": [self.item(ls[5]), self.item(ls[1])]}, 409, "lease_lost")
        self.assert_counts(queued=4, leased=1, done=1, failed=1)
        self.check("a batch refused half-way")

        self.ack("complete", [self.item(ls[5])])
        self.check("complete after the refusal")

        # Out of attempts (the task failed once), flagged to max_flags (the task
        # flagged once), and lease expiry (the other two).
        # Long enough that no lease expires between the checks before the wait for
        # expiry (each reads /metrics, then the listings: a slow, sanitized build
        # once saw two leases expire in between).
        self.expect("PUT", "/v1/queues/" + self.q, {"lease_ms": 1500})
        ls2 = self.leased(4)
        by_task = {lease["task"]: lease for lease in ls2}
        self.assertEqual(sorted(by_task), [ls[2]["task"], ls[3]["task"], ls[4]["task"],
                                           ls[5]["task"] + 1])
        self.ack("fail", [self.item(by_task[ls[2]["task"]])])
        self.check("fail out of attempts")
        self.ack("flag", [self.item(by_task[ls[4]["task"]])])
        self.check("flag at max_flags, no parent")
        harness.wait_until(lambda: self.counts()["leased"] == 0, what="the leases expiring")
        self.check("lease expiry")
        self.assert_counts(queued=2, done=2, failed=1, dead=2)

        dead = [t["id"] for t in self.list_tasks(state="dead")]
        self.assertEqual(len(dead), 2, dead)
        self.expect("POST", "/v1/tasks/%d/requeue" % dead[0])
        self.check("requeue a task")
        self.expect("POST", "/v1/queues/%s/requeue" % self.q)
        self.check("requeue the queue")
        self.assert_counts(queued=5, done=2)
        self.expect("POST", "/v1/queues/%s/purge" % self.q)
        self.check("purge")
        self.assert_counts(done=2)

    def test_pipeline_flag_reopens_parent(self):
        nxt = self.qname("b")
        self.create_queue(nxt, max_flags=1)
        self.create_queue(next=nxt)
        self.put("in")
        self.ack("complete", [self.item(self.lease_one(), result="out")])
        self.check("complete into the next stage", self.q, nxt)
        self.ack("flag", [self.item(self.lease_one(nxt))])
        self.check("flag: cancelled, parent re-opened", self.q, nxt)
        self.assert_counts(queued=1)
        self.assert_counts(nxt, cancelled=1)

    def test_complete_and_lease(self):
        self.create_queue()
        self.put(1, 2, 3)
        first = self.lease_one()
        r = self.expect("POST", "/v1/leases/complete",
                        {"leases": [self.item(first)], "lease": {"queue": self.q, "max": 2}})
        self.assertEqual(len(r["leases"]), 2, r)
        self.check("complete and lease in one request")
        self.assert_counts(leased=2, done=1)

    def test_workers(self):
        self.create_queue(backoff_ms=0, backoff_max_ms=0)
        self.put(*range(6))
        leaving = self.register(nickname="leaving")
        self.leased(2, worker=leaving["id"])
        self.check("leases of a worker")
        self.expect("DELETE", "/v1/workers/%d" % leaving["id"])
        self.check("worker bye")
        self.assert_counts(queued=6)
        silent = self.register(nickname="silent", timeout_ms=200)
        self.leased(3, worker=silent["id"])
        harness.wait_until(lambda: self.counts()["leased"] == 0, what="the worker timing out")
        self.check("worker timeout")

    def test_sessions(self):
        nxt = self.qname("b")
        self.create_queue(nxt)
        self.create_queue(next=nxt)
        s = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)
        self.expect("POST", "/v1/sessions/%s/tasks" % s["id"],
                    {"tasks": [{"payload": i} for i in range(5)]}, status=201)
        self.put("outside")
        self.check("session submit", self.q, nxt)
        ls = self.leased(3)
        self.ack("complete", [self.item(ls[0], result=0)])
        self.ack("fail", [self.item(ls[1], permanent=True)])
        self.check("session tasks finish", self.q, nxt)
        r = self.expect("DELETE", "/v1/sessions/" + s["id"])
        self.assertEqual((r["cancelled"], r["deleted"]), (4, 6), r)
        self.check("session close", self.q, nxt)
        self.assert_counts(queued=1)
        self.assert_counts(nxt)

        s = self.expect("POST", "/v1/sessions", {"queue": self.q, "timeout_ms": 200},
                        status=201)
        self.expect("POST", "/v1/sessions/%s/tasks" % s["id"],
                    {"tasks": [{"payload": i} for i in range(3)]}, status=201)
        harness.wait_until(lambda: self.counts()["queued"] == 1, what="the session expiring")
        self.check("session expiry")

    def test_queue_delete(self):
        other = self.qname("other")
        self.create_queue(other)
        self.create_queue()
        self.put(1, 2, 3)
        self.put(4, name=other)
        self.ack("complete", [self.item(self.lease_one())])
        self.expect("DELETE", "/v1/queues/" + self.q)
        self.check("another queue deleted", other)
        self.create_queue()
        self.check("the queue made again")
        self.assert_counts()


if __name__ == "__main__":
    unittest.main()
