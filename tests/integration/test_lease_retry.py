"""A lease request sent again under its key after its reply was lost gets the leases the
first one made, with the same tokens, instead of new ones (docs/api.md, "Retrying a
lease"): for the plain lease, the long-poll, the combined complete-and-lease call, and
across a restart of the head.  A new key, or none, leases anew; a key is checked.  The
head keeps a record per stream of a worker's keys (the key without its trailing "-N"),
so slots leasing under one worker id each have their retry answered; the records go
with the worker.  The workers that send keys (`muster worker`, the Python worker) are
tested in test_lease_retry_workers.py.  A worker keeps the records of 4096 streams, a
new one beyond them dropping the oldest: over HTTP with the real bound here
(LeaseRetryBoundTest), and in tests/unit/test_lease_retry.c (test_bound)."""
import json
import os
import sqlite3
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, OwnHeadTestCase, now_ms  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402

LONG_LEASE_MS = 600000   # a lease the tests never see expire: a leak would show as "leased"
# The most streams a worker has a record for: LEASE_RETRY_MAX_STREAMS
# (src/server/lease_retry.h), "at most 4096 records" in docs/api.md.
MAX_STREAMS = 4096
# Requests written at once on LeaseRetryBoundTest's connection before their replies are
# read: enough that a round trip is rare, few enough that neither side's socket buffer
# fills while the other is still writing.
PIPELINED = 256


def held(leases):
    return [(x["task"], x["token"]) for x in leases]


class LeaseRetryTest(ApiTestCase):

    def setUp(self):
        super().setUp()
        self.create_queue(lease_ms=LONG_LEASE_MS)
        self.w = self.register()["id"]

    def keyed(self, request, max=1, **body):
        return self.lease(worker=self.w, max=max, request=request, **body)

    def test_repeat_gets_the_same_leases(self):
        ids = self.put("a", "b", "c")
        first = self.keyed("k-1", max=2)
        self.assertEqual([x["task"] for x in first], ids[:2])
        again = self.keyed("k-1", max=2)
        self.assertEqual(held(again), held(first))
        for a, b in zip(first, again):
            self.assertEqual((b["payload"], b["attempt"]), (a["payload"], a["attempt"]))
            self.assertGreaterEqual(b["deadline_ms"], a["deadline_ms"])
            self.assert_lease_shape(b)
        # Nothing was leased twice: one attempt each, two leased, one queued.
        self.assertEqual([self.get_task(t)["attempts"] for t in ids[:2]], [1, 1])
        self.assert_counts(leased=2, queued=1)
        # Its max does not matter: it is the same request.
        self.assertEqual(held(self.keyed("k-1", max=5)), held(first))
        # A new key leases anew, and so does a request without one.
        self.assertEqual([x["task"] for x in self.keyed("k-2", max=2)], ids[2:])
        self.assertEqual(self.lease(worker=self.w), [])

    def test_only_the_last_key_and_the_leases_still_held(self):
        ids = self.put("a", "b", "c", "d")
        first = self.keyed("k-1", max=2)
        # One of them completed (a client that knew its token): only the other comes back.
        self.ack("complete", [{"task": first[0]["task"], "token": first[0]["token"]}])
        self.assertEqual(held(self.keyed("k-1")), held(first[1:]))
        # Once that one is gone too, the key leases anew, and is recorded again.
        self.ack("release", [{"task": first[1]["task"], "token": first[1]["token"]}])
        second = self.keyed("k-1")
        self.assertEqual([x["task"] for x in second], [ids[1]])
        self.assertNotEqual(second[0]["token"], first[1]["token"])
        self.assertEqual(held(self.keyed("k-1")), held(second))
        # A later key replaces it: the earlier one leases anew.
        third = self.keyed("k-2")
        self.assertEqual([x["task"] for x in third], [ids[2]])
        self.assertEqual([x["task"] for x in self.keyed("k-1")], [ids[3]])

    def test_a_request_that_leased_nothing_leases_anew(self):
        self.assertEqual(self.keyed("k-1"), [])
        [tid] = self.put("a")
        self.assertEqual([x["task"] for x in self.keyed("k-1")], [tid])

    def test_other_workers_and_queues_are_apart(self):
        ids = self.put("a", "b")
        first = self.keyed("k-1")
        other = self.register()["id"]
        # The same key from another worker is its own request.
        self.assertEqual([x["task"] for x in self.lease(worker=other, request="k-1")], ids[1:])
        self.assertEqual(held(self.keyed("k-1")), held(first))
        # The same key on another queue does not answer this queue's leases.
        q2 = self.qname("other")
        self.create_queue(q2, lease_ms=LONG_LEASE_MS)
        self.assertEqual(self.lease(q2, worker=self.w, request="k-1"), [])

    def test_long_poll_served_later_repeats(self):
        """A keyed long-poll that waited, then was served, records its key too."""
        import threading
        got = {}

        def poll():
            conn = self.head.connection()
            try:
                got["leases"] = self.head.request(
                    "POST", "/v1/queues/%s/lease" % self.q,
                    {"worker": self.w, "request": "k-wait", "wait_ms": 10000},
                    conn=conn).json["leases"]
            finally:
                conn.close()
        t = threading.Thread(target=poll)
        t.start()
        harness.wait_until(lambda: "\nmuster_lease_waiters 1\n" in self.head.request(
            "GET", "/metrics").raw.decode(), timeout=10, what="the long-poll to park")
        [tid] = self.put("a")
        t.join(15)
        self.assertEqual([x["task"] for x in got["leases"]], [tid])
        self.assertEqual(held(self.keyed("k-wait", wait_ms=1000)), held(got["leases"]))

    def test_combined_call_repeats(self):
        ids = self.put("a", "b", "c")
        [lease] = self.keyed("k-0")
        body = {"leases": [{"task": lease["task"], "token": lease["token"], "result": 1}],
                "lease": {"queue": self.q, "worker": self.w, "max": 1, "request": "k-1"}}
        first = self.expect("POST", "/v1/leases/complete", body)
        self.assertEqual([x["task"] for x in first["leases"]], [ids[1]])
        again = self.expect("POST", "/v1/leases/complete", body)
        self.assertEqual(again["completed"], [dict(first["completed"][0], repeated=True)])
        self.assertEqual(held(again["leases"]), held(first["leases"]))
        # The worker may send the same key with a plain lease (it completed alone).
        self.assertEqual(held(self.keyed("k-1")), held(first["leases"]))
        self.assert_counts(done=1, leased=1, queued=1)

    def test_slots_of_one_worker_each_retry(self):
        """Two slots of one worker lease with keys of their own streams, A then B; A's
        request sent again gets A's leases, B's gets B's: nothing is leased twice."""
        ids = self.put("a", "b", "c", "d")
        a = self.keyed("inst-s1-0")
        b = self.keyed("inst-s2-0", max=2)
        self.assertEqual([x["task"] for x in a + b], ids[:3])
        # A bad key between them is refused and changes no record.
        self.expect_error("POST", "/v1/queues/%s/lease" % self.q,
                          {"worker": self.w, "request": "inst s1-0"}, 400, "invalid_argument")
        self.assertEqual(held(self.keyed("inst-s1-0")), held(a))
        self.assertEqual(held(self.keyed("inst-s2-0", max=2)), held(b))
        self.assertEqual([self.get_task(t)["attempts"] for t in ids], [1, 1, 1, 0])
        self.assert_counts(leased=3, queued=1)
        # A slot's next key replaces its own record only.
        self.assertEqual([x["task"] for x in self.keyed("inst-s1-1")], ids[3:])
        self.assertEqual(held(self.keyed("inst-s2-0", max=2)), held(b))
        self.assertEqual(self.keyed("inst-s1-0"), [])   # no longer slot 1's key: anew

    def test_bad_keys(self):
        path = "/v1/queues/%s/lease" % self.q
        for key, words in (("", "is invalid"), ("a b", "is invalid"), ("x" * 129, "is invalid"),
                           (7, "expected a string")):
            r = self.expect_error("POST", path, {"worker": self.w, "request": key}, 400,
                                  "invalid_argument")
            self.assertIn("request", r.json["error"]["message"])
            self.assertIn(words, r.json["error"]["message"])
        # A key names a worker's request: without a worker it is refused.
        r = self.expect_error("POST", path, {"request": "k-1"}, 400, "invalid_argument")
        self.assertIn('request: needs "worker"', r.json["error"]["message"])
        r = self.expect_error("POST", path, {"worker": 99999, "request": "k-1"}, 404,
                              "worker_not_found")
        [tid] = self.put("a")
        [lease] = self.lease(worker=self.w)
        body = {"leases": [{"task": lease["task"], "token": lease["token"]}],
                "lease": {"queue": self.q, "request": "k-1"}}
        r = self.expect_error("POST", "/v1/leases/complete", body, 400, "invalid_argument")
        self.assertIn('lease.request: needs "worker"', r.json["error"]["message"])
        body["lease"] = {"queue": self.q, "worker": self.w, "request": "a/b"}
        r = self.expect_error("POST", "/v1/leases/complete", body, 400, "invalid_argument")
        self.assertIn("lease.request: 'a/b' is invalid", r.json["error"]["message"])
        self.assertEqual(self.get_task(tid)["state"], "leased", "a refused call changed it")


class LeaseRetryBoundTest(ApiTestCase):
    """A worker keeps the records of MAX_STREAMS streams (docs/api.md, "Retrying a
    lease"): a request that records a new stream beyond them drops the record written
    longest ago, whose retry then leases anew; the other records, and other workers',
    stay.  A dropped record loses no lease: its tasks stay leased under their tokens.
    Thousands of requests, pipelined on one keep-alive connection (a few seconds)."""

    def keyed_leases(self, worker, keys):
        """Sends one keyed lease of max 1 per key of `keys`, for `worker`, pipelined on one
        connection; returns each request's leases as held() pairs, in order."""
        path = "/v1/queues/%s/lease" % self.q
        out = []
        with Wire(self.head.port) as w:
            for at in range(0, len(keys), PIPELINED):
                batch = keys[at:at + PIPELINED]
                w.send(b"".join(request("POST", path, self.head.token,
                                        {"worker": worker, "max": 1, "request": key})
                                for key in batch))
                for key in batch:
                    r = w.read_reply("POST")
                    self.assertEqual(r.status, 200, "lease with key %s: %r" % (key, r))
                    out.append(held(json.loads(r.body)["leases"]))
        return out

    def complete_all(self, pairs):
        for at in range(0, len(pairs), 1000):
            done = self.ack("complete", [{"task": t, "token": k} for t, k in pairs[at:at + 1000]])
            self.assertEqual(len(done["completed"]), len(pairs[at:at + 1000]), done)

    def test_the_oldest_stream_beyond_the_bound_goes(self):
        self.create_queue(lease_ms=LONG_LEASE_MS)
        for at in range(0, MAX_STREAMS + 3, 1000):
            self.put(*range(at, min(at + 1000, MAX_STREAMS + 3)))
        w, other = self.register()["id"], self.register()["id"]
        # Another worker's record, older than all of w's: w's bound is w's alone.
        theirs = held(self.lease(worker=other, request="other-1"))
        keys = ["s%d-1" % i for i in range(MAX_STREAMS)]
        first = self.keyed_leases(w, keys)
        self.assertEqual([len(x) for x in first], [1] * MAX_STREAMS)
        self.assertEqual(len({x[0][0] for x in first} | {theirs[0][0]}), MAX_STREAMS + 1)
        self.assert_counts(leased=MAX_STREAMS + 1, queued=2)
        # At the bound, no record went: the oldest's retry (s0's, the first a lower bound
        # would drop) and the newest's are answered with their leases.
        self.assertEqual(self.keyed_leases(w, keys[:2] + keys[-1:]), first[:2] + first[-1:])
        self.assert_counts(leased=MAX_STREAMS + 1, queued=2)
        # One more stream leases, and drops the oldest record of w's: s0's alone.
        [newest] = self.keyed_leases(w, ["s%d-1" % MAX_STREAMS])
        self.assertEqual(len(newest), 1, newest)
        self.assertEqual(held(self.lease(worker=other, request="other-1")), theirs)
        self.assertEqual(self.keyed_leases(w, keys[1:3] + keys[-1:] + ["s%d-1" % MAX_STREAMS]),
                         first[1:3] + first[-1:] + [newest])
        self.assert_counts(leased=MAX_STREAMS + 2, queued=1)
        # s0's retry finds no record: it leases anew, the last queued task.
        [again] = self.keyed_leases(w, keys[:1])
        self.assertEqual(len(again), 1, again)
        self.assertNotIn(again[0][0], {x[0][0] for x in first + [newest, theirs]})
        # Nothing was lost with the record: s0's first task is leased under its token
        # still, and every lease completes.
        t = self.get_task(first[0][0][0])
        self.assertEqual((t["state"], t["attempts"]), ("leased", 1))
        self.complete_all([x[0] for x in first + [newest, again, theirs]])
        self.assert_counts(done=MAX_STREAMS + 3)


class LeaseRetryRestartTest(OwnHeadTestCase):

    def test_repeat_after_the_head_was_killed(self):
        """The record is durable with the leases: a head killed after the lease's commit
        answers the retry with them when it is back."""
        self.create_queue(lease_ms=LONG_LEASE_MS)
        w = self.register()["id"]
        ids = self.put("a", "b")
        first = self.lease(worker=w, request="k-1")
        self.put("c")   # its reply waits for a flush, which covers the lease's commit
        self.head.kill()
        self.head.start()
        again = self.lease(worker=w, request="k-1")
        self.assertEqual(held(again), held(first))
        self.assertGreaterEqual(again[0]["deadline_ms"], now_ms() + LONG_LEASE_MS - 60000)
        self.assertEqual([x["task"] for x in self.lease(worker=w, request="k-2")], [ids[1]])

    def test_every_slots_record_survives_a_restart(self):
        self.create_queue(lease_ms=LONG_LEASE_MS)
        w = self.register()["id"]
        self.put("a", "b", "c")
        a = self.lease(worker=w, request="inst-s1-4")
        b = self.lease(worker=w, request="inst-s2-9")
        self.put("d")   # its reply waits for a flush, which covers the leases' commits
        self.head.kill()
        self.head.start()
        self.assertEqual(held(self.lease(worker=w, request="inst-s1-4")), held(a))
        self.assertEqual(held(self.lease(worker=w, request="inst-s2-9")), held(b))
        self.assert_counts(leased=2, queued=2)

    def test_records_go_with_the_worker(self):
        """A worker's records go when it ends (here by its goodbye and by its timeout),
        those of a worker still active stay: read from the store once the head stopped
        (it holds the file exclusively while it runs)."""
        self.create_queue(lease_ms=LONG_LEASE_MS)
        bye, silent, stays = (self.register()["id"], self.register(timeout_ms=1000)["id"],
                              self.register()["id"])
        self.put(*"abcdef")
        for w in (bye, silent, stays):
            self.lease(worker=w, request="s1-0")
            self.lease(worker=w, request="s2-0")
        self.expect("DELETE", "/v1/workers/%d" % bye)
        harness.wait_until(lambda: self.expect("GET", "/v1/workers/%d" % silent)["state"]
                           == "gone", timeout=10, what="the silent worker to time out")
        self.assertEqual(self.head.stop(), 0, self.head.log())
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.head.data_dir, "muster.db"),
                             uri=True)
        try:
            self.assertEqual(sorted(db.execute("SELECT worker, stream FROM lease_requests")),
                             [(stays, "s1"), (stays, "s2")])
        finally:
            db.close()


if __name__ == "__main__":
    unittest.main()
