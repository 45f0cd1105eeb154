"""A queue's counts per state (GET /v1/queues/{queue}, /metrics) against a recount of its
tasks through the listing, after every kind of transition the API offers.

The head keeps the counts apart from the tasks (src/server/counts.c), so a path that
changes tasks without counting would show here as a difference; and since listing by
state no longer has an index of its own (queued, leased, done and failed-like states
each read through another), the listing of each state is checked against the listing
of all tasks too.  A session closed with more tasks than one chunk leaves them to the
head's background deletion, out of the counts from the close on: the counts and the
ready count are checked at every step of that deletion, across restarts too.
"""
import os
import re
import sqlite3
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, OwnHeadTestCase, STATES  # noqa: E402

SAMPLE = re.compile(r'^muster_tasks\{queue="([^"]*)",state="([a-z]+)"\} (\d+)$', re.M)


class CountChecks:
    """The checks of the test classes below (mixed into an ApiTestCase)."""

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


class CountsTest(CountChecks, ApiTestCase):

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


class LeftoverCountsTest(CountChecks, OwnHeadTestCase):
    """A session of more tasks than one chunk (1000, QUEUE_CHUNK) closed in a queue it
    shares with another session's tasks and plain ones: its close deletes a chunk and
    leaves the rest, queued, done and failed, to the head's background deletion (a chunk
    per loop turn), out of the queue's counts from the reply on.  The counts and
    `ready` (GET /v1/queues/{queue}?ready=true), and the queue's entry in GET /v1/queues,
    are exact at every step of that deletion, and after a stop or a kill -9 in the middle
    of it (docs/api.md, DELETE /v1/sessions/{id})."""

    BIG = 20000  # 20 chunks: 19 left to the background deletion

    def fill(self):
        """Queue q: a big session B (its last ten tasks ahead of its others in lease
        order: two done, one failed, three leased at its close, four queued; the rest
        queued), an open session O (three queued, one leased, one done) ahead of B's,
        plain tasks ahead of both (three ready, one delayed) and behind them (two).
        Returns B's id and the counts q has once B is closed: O's and the plain ones."""
        self.create_queue()
        big = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        other = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        for first in range(0, self.BIG, 1000):
            self.expect("POST", "/v1/sessions/%s/tasks" % big,
                        {"tasks": [{"payload": i, "priority": 1 if i >= self.BIG - 10 else 0}
                                   for i in range(first, first + 1000)]}, status=201)
        of_big = self.leased(6)
        self.assertEqual({x["index"] for x in of_big}, set(range(self.BIG - 10, self.BIG - 4)))
        self.ack("complete", [self.item(x, result="r") for x in of_big[:2]])
        self.ack("fail", [self.item(of_big[2], permanent=True)])
        self.expect("POST", "/v1/sessions/%s/tasks" % other,
                    {"tasks": [{"payload": i, "priority": 5} for i in range(5)]}, status=201)
        ls = self.leased(2)
        self.assertEqual({x["session"] for x in ls}, {other})
        self.ack("complete", [self.item(ls[0], result="r")])
        self.put("ahead", "ahead", "ahead", priority=10)
        self.put("delayed", priority=10, delay_ms=600000)
        self.put("behind", "behind")
        self.assert_counts(queued=self.BIG - 6 + 3 + 4 + 2, leased=4, done=3, failed=1)
        r = self.expect("DELETE", "/v1/sessions/" + big)
        self.assertEqual(r, {"id": big, "cancelled": self.BIG - 3, "deleted": self.BIG})
        # Its leases went with it: their holder's completion finds nothing to count.
        self.expect_error("POST", "/v1/leases/complete", {"leases": [self.item(of_big[3])]},
                          404, "task_not_found")
        return big, dict(queued=3 + 4 + 2, leased=1, done=1)

    def assert_exact(self, want, step):
        """The counts of q are `want` in its object and in the list of queues, and its
        ready count leaves out only the delayed task."""
        want = dict({s: 0 for s in STATES}, **want)
        q = self.expect("GET", "/v1/queues/%s?ready=true" % self.q)
        self.assertEqual(q["counts"], dict(want, ready=want["queued"] - 1), step)
        listed = [x for x in self.expect("GET", "/v1/queues")["queues"] if x["name"] == self.q]
        self.assertEqual([x["counts"] for x in listed], [want], step)

    def deleted(self, sid):
        """Whether the head logged that the last of session `sid`'s tasks went."""
        with open(self.head.log_path, errors="replace") as f:
            return "session %s: the last of its" % sid in f.read()

    def exact_until_deleted(self, sid, want, step):
        """Checks the counts at every poll until the background deletion has ended."""
        def poll():
            done = self.deleted(sid)
            self.assert_exact(want, step)
            return done
        harness.wait_until(poll, timeout=60, what="the closed session's tasks to be deleted")

    def ends_with_exact_leases(self, want):
        """After the deletion: the listings and /metrics agree with the counts, and a
        lease takes as many tasks as `ready` said, in lease order past where B's were."""
        self.assertEqual(self.check("the background deletion"), dict(
            {s: 0 for s in STATES}, **want))
        leases = self.lease(max=100)
        self.assertEqual([x["payload"] for x in leases],
                         ["ahead"] * 3 + [2, 3, 4] + ["behind"] * 2)
        self.assert_counts(queued=1, leased=9, done=1)

    def store_counts(self):
        """The store's counts of q and a recount of its tasks but those a closed session
        left to the background deletion, and whether such a session is left: read from
        the store of a head that must not run."""
        db = sqlite3.connect(os.path.join(self.head.data_dir, "muster.db"))
        try:
            kept = {STATES[s]: n for s, n in db.execute(
                "SELECT state, n FROM queue_counts WHERE queue = ? AND n != 0", (self.q,))}
            there = {STATES[s]: n for s, n in db.execute(
                "SELECT state, count(*) FROM tasks AS t WHERE queue = ? AND NOT EXISTS"
                " (SELECT 1 FROM session_trash AS c WHERE c.session = t.session"
                " AND t.id <= c.horizon) GROUP BY state", (self.q,))}
            closing = db.execute("SELECT count(*) FROM session_trash").fetchone()[0]
            return kept, there, closing
        finally:
            db.close()

    def test_exact_while_deleted_in_the_background(self):
        big, want = self.fill()
        self.exact_until_deleted(big, want, "the close")
        self.ends_with_exact_leases(want)

    def restart_during_the_deletion(self, end):
        """Closes B, ends the head by `end` (stop or kill) before the background
        deletion has ended, checks the store, starts it again and follows the rest."""
        big, want = self.fill()
        if end == "stop":
            self.assertEqual(self.head.stop(), 0)
        else:
            self.head.kill()
        kept, there, closing = self.store_counts()
        self.assertEqual(closing, 1, "the deletion ended before the " + end)
        self.assertEqual((kept, there), (want, want), "the store after the " + end)
        self.head.start()
        self.exact_until_deleted(big, want, "a restart after a " + end)
        self.ends_with_exact_leases(want)

    def test_exact_after_a_stop_during_the_deletion(self):
        self.restart_during_the_deletion("stop")

    def test_exact_after_a_kill9_during_the_deletion(self):
        self.restart_during_the_deletion("kill")

if __name__ == "__main__":
    unittest.main()
