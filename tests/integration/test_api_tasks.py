"""Tasks: batch put, get, list with state filter and pagination, idempotency keys,
requeue of one task, priority/FIFO order, delay_ms and max on lease (docs/api.md)."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase, MAX_ID, now_ms  # noqa: E402


class TaskTest(ApiTestCase):

    def test_put_and_get_every_field(self):
        self.create_queue()
        payload = {"url": "a.jpg", "n": [1, 2.5, None, True], "s": "\u00e9\u4e2d"}
        t0 = now_ms()
        res = self.put_tasks([{"payload": payload, "priority": 5, "delay_ms": 0,
                               "key": "img-a", "session": "s1", "index": 0}])
        t1 = now_ms()
        self.assertEqual(len(res), 1)
        self.assertEqual(set(res[0]), {"id", "created"})
        self.assertIs(res[0]["created"], True)
        t = self.get_task(res[0]["id"])
        self.assertEqual(t["id"], res[0]["id"])
        self.assertEqual(t["queue"], self.q)
        self.assertEqual(t["state"], "queued")
        self.assertEqual(t["priority"], 5)
        self.assertEqual(t["payload"], payload)
        self.assertIsNone(t["result"])
        self.assertIsNone(t["error"])
        self.assertEqual(t["attempts"], 0)
        self.assertEqual(t["flags"], 0)
        self.assertEqual(t["key"], "img-a")
        self.assertEqual(t["session"], "s1")
        self.assertEqual(t["index"], 0)
        self.assertIsNone(t["parent"])
        self.assertIsNone(t["lease"])
        self.assert_between(t["created_ms"], t0, t1, "created_ms")
        self.assert_between(t["updated_ms"], t0, t1, "updated_ms")
        self.assert_between(t["run_at_ms"], t0, t1, "run_at_ms")

    def test_put_defaults(self):
        self.create_queue()
        [tid] = self.put({"a": 1})
        t = self.get_task(tid)
        self.assertEqual((t["priority"], t["key"], t["session"], t["index"], t["parent"]),
                         (0, None, None, None, None), t)

    def test_payload_kinds(self):
        self.create_queue()
        payloads = ["just a string", "{\"not\": \"parsed\"}", 42, -1.5, [1, "two", {"3": 4}],
                    {"nested": {"deep": [[], {}]}}, True, "", "line\nbreak\ttab \u2603"]
        ids = self.put(*payloads)
        for tid, p in zip(ids, payloads):
            got = self.get_task(tid)["payload"]
            self.assertEqual(got, p)
            self.assertEqual(type(got), type(p), "payload %r came back as %r" % (p, got))
        leases = self.lease(max=len(payloads))
        self.assertEqual([x["payload"] for x in leases], payloads)

    def test_batch_ids_in_input_order(self):
        self.create_queue()
        ids = self.put(*range(50))
        self.assertEqual(len(set(ids)), 50)
        self.assertEqual(ids, sorted(ids), "ids must ascend in put order")
        more = self.put("x")
        self.assertGreater(more[0], ids[-1])
        for i, tid in enumerate(ids):
            self.assertTrue(0 < tid < MAX_ID)
        self.assertEqual([t["payload"] for t in self.list_tasks()], list(range(50)) + ["x"])
        self.assert_counts(queued=51)

    def test_get_unknown_and_bad_ids(self):
        self.expect_error("GET", "/v1/tasks/987654321", None, 404, "task_not_found")
        for bad in ("abc", "0", "-1", "1.5", "1e3", "0x10", str(MAX_ID), "99999999999999999999",
                    "%20"):
            with self.subTest(id=bad):
                self.expect_error("GET", "/v1/tasks/" + bad, None, 400, "bad_request")

    def test_removed_newest_tasks_are_told_apart_from_unknown_ids(self):
        # The tasks removed here are the head's newest, so no task left has an id as
        # high: the head must tell them from ids it never handed out by the highest id
        # it handed out, not by the highest still stored (it said "does not exist").
        self.create_queue()
        kept, purged, also_purged = self.put("kept", "purged", "also purged")
        self.assertEqual(self.lease_one()["task"], kept)
        self.assertEqual(self.expect("POST", "/v1/queues/%s/purge" % self.q), {"purged": 2})
        removed = "does not exist any more: it was removed by"
        for tid in (purged, also_purged):
            with self.subTest(task=tid):
                r = self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")
                self.assertIn("task %d %s" % (tid, removed), r.json["error"]["message"])
        never = also_purged + 1000000
        r = self.expect_error("GET", "/v1/tasks/%d" % never, None, 404, "task_not_found")
        self.assertEqual(r.json["error"]["message"], "task %d does not exist" % never)

    def test_lease_call_on_a_removed_task_says_it_was_removed(self):
        # A worker whose task went with its session (the newest task of the head)
        # is told it was removed, not that it never existed.
        self.create_queue()
        sid = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        self.expect("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": [{"payload": 1}]},
                    status=201)
        lease = self.lease_one()
        self.expect("DELETE", "/v1/sessions/" + sid)
        for kind in ("complete", "fail"):
            with self.subTest(kind=kind):
                r = self.expect_error("POST", "/v1/leases/" + kind, {"leases": [
                    {"task": lease["task"], "token": lease["token"]}]}, 404, "task_not_found")
                self.assertIn("leases[0]: task %d does not exist any more" % lease["task"],
                              r.json["error"]["message"])

    def test_list_state_filter(self):
        self.create_queue(max_attempts=1, backoff_ms=0)
        ids = self.put(*range(6))
        l1, l2, l3, l4 = self.lease(max=4)
        self.ack("complete", [{"task": l1["task"], "token": l1["token"], "result": "r"}])
        self.ack("fail", [{"task": l2["task"], "token": l2["token"], "permanent": True}])
        self.ack("fail", [{"task": l3["task"], "token": l3["token"]}])
        expect = {"queued": ids[4:], "leased": [l4["task"]], "done": [l1["task"]],
                  "failed": [l2["task"]], "dead": [l3["task"]], "cancelled": []}
        for state, want in expect.items():
            page = self.expect("GET", "/v1/queues/%s/tasks?state=%s" % (self.q, state))
            self.assertEqual([t["id"] for t in page["tasks"]], want, state)
            self.assertIsNone(page["next"])
            for t in page["tasks"]:
                self.assert_task_shape(t)
                self.assertEqual(t["state"], state)
                self.assertEqual(t, self.get_task(t["id"]))
        everything = self.expect("GET", "/v1/queues/%s/tasks" % self.q)
        self.assertEqual([t["id"] for t in everything["tasks"]], ids)
        self.assertIsNone(everything["next"])
        leased = self.expect("GET", "/v1/queues/%s/tasks?state=leased" % self.q)["tasks"][0]
        self.assertEqual(leased["lease"]["deadline_ms"], l4["deadline_ms"])

    def test_list_recent_failures(self):
        # order=recent: the newest failed (or dead) tasks by when they got there, so a
        # task requeued and dead again comes first though its id is the lowest.
        self.create_queue(max_attempts=1, backoff_ms=0)
        ids = self.put(*range(5))
        leases = self.lease(max=5)
        for i, l in enumerate(leases):
            self.ack("fail", [{"task": l["task"], "token": l["token"], "error": "e%d" % i,
                               "permanent": i == 4}])
        self.expect("POST", "/v1/tasks/%d/requeue" % ids[0])
        again = self.lease_one()
        self.ack("fail", [{"task": again["task"], "token": again["token"], "error": "again"}])
        url = "/v1/queues/%s/tasks?state=%s&order=recent" % (self.q, "%s")
        page = self.expect("GET", url % "dead")
        self.assertEqual([(t["id"], t["error"]) for t in page["tasks"]],
                         [(ids[0], "again"), (ids[3], "e3"), (ids[2], "e2"), (ids[1], "e1")])
        self.assertIsNone(page["next"])
        updated = [t["updated_ms"] for t in page["tasks"]]
        self.assertEqual(updated, sorted(updated, reverse=True))
        for t in page["tasks"]:
            self.assertEqual(t, self.get_task(t["id"]))
        page = self.expect("GET", (url % "dead") + "&limit=2&brief=true")
        self.assertEqual([t["id"] for t in page["tasks"]], [ids[0], ids[3]])
        self.assertEqual((page["next"], "payload" in page["tasks"][0]), (None, False))
        failed = self.expect("GET", url % "failed")["tasks"]
        self.assertEqual([(t["id"], t["error"]) for t in failed], [(ids[4], "e4")])
        # order=id is the default order, by ascending id.
        page = self.expect("GET", "/v1/queues/%s/tasks?state=dead&order=id" % self.q)
        self.assertEqual([t["id"] for t in page["tasks"]], ids[:4])
        for query in ("order=recent", "state=queued&order=recent", "state=done&order=recent",
                      "state=dead&order=recent&after=1", "state=dead&order=newest"):
            with self.subTest(query=query):
                self.expect_error("GET", "/v1/queues/%s/tasks?%s" % (self.q, query), None, 400,
                                  "invalid_argument")

    def test_pagination(self):
        self.create_queue()
        ids = self.put(*range(25))
        seen, after, pages = [], 0, 0
        while True:
            page = self.expect("GET", "/v1/queues/%s/tasks?limit=10&after=%d" % (self.q, after))
            pages += 1
            self.assertLessEqual(len(page["tasks"]), 10)
            seen += [t["id"] for t in page["tasks"]]
            if page["next"] is None:
                break
            self.assertEqual(len(page["tasks"]), 10, "a short page must be the last")
            after = page["next"]
            self.assertLess(pages, 10)
        self.assertEqual(pages, 3)
        self.assertEqual(seen, ids)
        # after= in the middle, and limit with a state filter.
        page = self.expect("GET", "/v1/queues/%s/tasks?after=%d&limit=3" % (self.q, ids[20]))
        self.assertEqual([t["id"] for t in page["tasks"]], ids[21:24])
        page = self.expect("GET", "/v1/queues/%s/tasks?state=queued&after=%d" % (self.q, ids[-1]))
        self.assertEqual(page, {"tasks": [], "next": None})

    def test_pagination_default_and_max_limit(self):
        self.create_queue()
        ids = self.put(*range(1000)) + self.put(1000)
        page = self.expect("GET", "/v1/queues/%s/tasks" % self.q)
        self.assertEqual([t["id"] for t in page["tasks"]], ids[:100], "default limit is 100")
        self.assertIsNotNone(page["next"])
        page = self.expect("GET", "/v1/queues/%s/tasks?limit=1000" % self.q)
        self.assertEqual(len(page["tasks"]), 1000)
        rest = self.expect("GET", "/v1/queues/%s/tasks?limit=1000&after=%d" % (self.q,
                                                                                page["next"]))
        self.assertEqual([t["id"] for t in rest["tasks"]], ids[1000:])
        self.assertIsNone(rest["next"])

    def test_list_unknown_queue_and_bad_query(self):
        self.expect_error("GET", "/v1/queues/%s/tasks" % self.qname("nope"), None, 404,
                          "queue_not_found")
        self.create_queue()
        for query in ("state=bogus", "limit=abc", "limit=0", "limit=-5",
                      "limit=1001", "after=abc", "after=-1", "limit=1.5"):
            with self.subTest(query=query):
                self.expect_error("GET", "/v1/queues/%s/tasks?%s" % (self.q, query), None, 400,
                                  "invalid_argument")

    def test_idempotency_key(self):
        self.create_queue()
        other = self.qname("other")
        self.create_queue(other)
        [first] = self.put_tasks([{"payload": {"v": 1}, "key": "k1", "priority": 1}])
        self.assertIs(first["created"], True)
        [again] = self.put_tasks([{"payload": {"v": 2}, "key": "k1", "priority": 9}])
        self.assertEqual(again, {"id": first["id"], "created": False})
        t = self.get_task(first["id"])
        self.assertEqual((t["payload"], t["priority"]), ({"v": 1}, 1), "stored nothing new")
        self.assert_counts(queued=1)
        # Within one batch, and mixed with new keys and keyless tasks.
        res = self.put_tasks([{"payload": 1, "key": "a"}, {"payload": 2, "key": "b"},
                              {"payload": 3, "key": "a"}, {"payload": 4},
                              {"payload": 5, "key": "k1"}, {"payload": 6, "key": "b"}])
        self.assertEqual([r["created"] for r in res], [True, True, False, True, False, False])
        self.assertEqual(res[2]["id"], res[0]["id"])
        self.assertEqual(res[5]["id"], res[1]["id"])
        self.assertEqual(res[4]["id"], first["id"])
        self.assertEqual(self.get_task(res[0]["id"])["payload"], 1)
        self.assertEqual(self.get_task(res[1]["id"])["payload"], 2)
        self.assert_counts(queued=4)
        self.assertEqual(sorted(t["key"] for t in self.list_tasks() if t["key"]),
                         ["a", "b", "k1"])
        # Keys are per queue.
        [o] = self.put_tasks([{"payload": 0, "key": "k1"}], name=other)
        self.assertIs(o["created"], True)
        self.assertNotEqual(o["id"], first["id"])
        # A finished task still holds its key.
        lease = self.lease_one()   # k1 has the highest priority
        self.assertEqual(lease["task"], first["id"])
        self.ack("complete", [{"task": lease["task"], "token": lease["token"]}])
        [again] = self.put_tasks([{"payload": "new", "key": "k1"}])
        self.assertEqual(again, {"id": first["id"], "created": False})
        self.assertEqual(self.get_task(first["id"])["state"], "done")
        self.assert_counts(queued=3, leased=0, done=1)

    def test_max_length_key_and_session(self):
        self.create_queue()
        [tid] = self.put("x", key="k" * 256, session="s" * 128, index=7)
        t = self.get_task(tid)
        self.assertEqual((t["key"], t["session"], t["index"]), ("k" * 256, "s" * 128, 7))

    def test_requeue_one_task(self):
        self.create_queue(max_attempts=1, backoff_ms=0)
        dead, failed, done, queued = self.put("d", "f", "c", "q")
        ld, lf, lc = self.lease(max=3)
        self.ack("fail", [{"task": dead, "token": ld["token"], "error": "e1"}])
        self.ack("fail", [{"task": failed, "token": lf["token"], "error": "e2",
                           "permanent": True}])
        self.ack("complete", [{"task": done, "token": lc["token"]}])
        for tid in (dead, failed):
            t = self.expect("POST", "/v1/tasks/%d/requeue" % tid)
            self.assert_task_shape(t)
            self.assertEqual((t["id"], t["state"], t["attempts"], t["flags"], t["lease"]),
                             (tid, "queued", 0, 0, None), t)
            self.assertEqual(self.get_task(tid)["state"], "queued")
        for tid in (done, queued):
            before = self.get_task(tid)
            self.expect_error("POST", "/v1/tasks/%d/requeue" % tid, None, 409, "invalid_state")
            self.assertEqual(self.get_task(tid), before)
        [lq] = self.lease()
        self.assertEqual(lq["task"], dead)
        self.expect_error("POST", "/v1/tasks/%d/requeue" % dead, None, 409, "invalid_state")
        self.expect_error("POST", "/v1/tasks/987654321/requeue", None, 404, "task_not_found")
        self.expect_error("POST", "/v1/tasks/abc/requeue", None, 400, "bad_request")
        self.assert_counts(queued=2, leased=1, done=1)

    # Payload texts as a client may send them, and the compact text the head
    # must store for each (jw_dump of the parsed value).  Compact bodies take
    # the head's scanner (src/server/jscan.c) when the text is already
    # canonical and the parsed tree otherwise; the stored bytes, which a lease
    # reply carries verbatim, must be the same either way.
    STORED = [
        (b'{"a": 1, "b": [1, 2]}', b'{"a":1,"b":[1,2]}'),
        (b'{"a": 1}', b'{"a":1}'),
        (b'"\\u00e9\\/"', '"\u00e9/"'.encode()),
        (b'1.50', b'1.5'),
        (b'[1E2,-0,0.1]', b'[100.0,0,0.1]'),
        # Reals as the shortest text that reads back as the same double: kept as
        # sent when sent that way, rewritten so otherwise (never as "%.17g").
        (b'{"x":0.1,"y":[1e300,2.5e-7,-0.0,5e-324]}', b'{"x":0.1,"y":[1e300,2.5e-7,-0.0,5e-324]}'),
        (b'[0.1, 1E+300, 2.50e-7, 0.10000000000000001, 4.9406564584124654e-324]',
         b'[0.1,1e300,2.5e-7,0.1,5e-324]'),
        (b'"\\u001f\\u0008"', b'"\\u001F\\b"'),
        (b'99999999999999999999', None),  # refused: too big an integer
        (b'{"b":1,"a":{"b":[]}}', b'{"b":1,"a":{"b":[]}}'),
        (b'"caf\xc3\xa9 \\u0000 \\n"', b'"caf\xc3\xa9 \\u0000 \\n"'),
        (b'{"a":1,"a":2}', None),  # refused: duplicate key
        (b'{"a":1,"b":{"c":1,"c":1}}', None),
    ]

    def test_put_raw_payloads_stored_compact(self):
        self.create_queue()
        for sent, stored in self.STORED:
            for fields in (b"", b',"priority":0'):
                body = b'{"tasks":[{"payload":' + sent + fields + b"}]}"
                r = self.call("POST", "/v1/queues/%s/tasks" % self.q, raw=body)
                if stored is None:
                    self.assertEqual((r.status, r.error_code), (400, "bad_json"), (body, r))
                    continue
                self.assertEqual(r.status, 201, (body, r))
                r = self.call("POST", "/v1/queues/%s/lease" % self.q, raw=b"{}")
                self.assertEqual(r.status, 200, r)
                self.assertIn(b'"payload":' + stored + b',"attempt":', r.raw, (body, r))
        self.assert_counts(queued=0, leased=2 * len([s for _, s in self.STORED if s]))

    def test_complete_raw_results_stored_compact(self):
        # A result becomes the next stage's payload: its stored bytes show in
        # the lease reply of the next queue.
        second = self.qname("next")
        self.create_queue(second)
        self.create_queue(next=second)
        for sent, stored in self.STORED:
            [tid] = self.put(1)
            lease = self.lease_one()
            body = (b'{"leases":[{"task":%d,"token":%d,"result":' % (tid, lease["token"]) +
                    sent + b"}]}")
            r = self.call("POST", "/v1/leases/complete", raw=body)
            if stored is None:
                self.assertEqual((r.status, r.error_code), (400, "bad_json"), (body, r))
                self.assertEqual(self.get_task(tid)["state"], "leased")
                continue
            self.assertEqual(r.status, 200, (body, r))
            r = self.call("POST", "/v1/queues/%s/lease" % second, raw=b"{}")
            self.assertEqual(r.status, 200, r)
            self.assertIn(b'"payload":' + stored + b',"attempt":', r.raw, (body, r))


class LeaseOrderTest(ApiTestCase):

    def test_priority_then_fifo(self):
        self.create_queue()
        prios = [0, 5, 0, 5, 10, -1, 0]
        ids = [e["id"] for e in self.put_tasks([{"payload": i, "priority": p}
                                                for i, p in enumerate(prios)])]
        # A later put with a higher priority goes first; equal ones keep put order.
        late = self.put_tasks([{"payload": "late", "priority": 5}])[0]["id"]
        want = [ids[4], ids[1], ids[3], late, ids[0], ids[2], ids[6], ids[5]]
        got = [x["task"] for x in self.lease(max=3)]
        got += [self.lease_one()["task"]]
        got += [x["task"] for x in self.lease(max=10)]
        self.assertEqual(got, want)
        self.assertEqual(self.lease(max=10), [])

    def test_max(self):
        self.create_queue()
        ids = self.put(*range(5))
        self.assertEqual([x["task"] for x in self.lease()], ids[:1], "max defaults to 1")
        self.assertEqual([x["task"] for x in self.lease(max=3)], ids[1:4])
        self.assertEqual([x["task"] for x in self.lease(max=10)], ids[4:])
        self.assertEqual(self.lease(max=1000), [])
        self.assert_counts(leased=5)

    def test_empty_body_lease(self):
        self.create_queue()
        r = self.call("POST", "/v1/queues/%s/lease" % self.q, None, content_type=None)
        self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
        [tid] = self.put("x")
        r = self.call("POST", "/v1/queues/%s/lease" % self.q, None, content_type=None)
        self.assertEqual(r.status, 200, r)
        self.assertEqual([x["task"] for x in r.json["leases"]], [tid])

    def test_delay_ms(self):
        self.create_queue()
        t0 = now_ms()
        delayed = self.put_tasks([{"payload": "later", "delay_ms": 700, "priority": 100}])[0]["id"]
        t1 = now_ms()
        [now_id] = self.put("now")
        t = self.get_task(delayed)
        self.assert_between(t["run_at_ms"], t0 + 700, t1 + 700, "run_at_ms")
        self.assertEqual(t["state"], "queued")
        # The delayed task outranks the other but is not ready yet.
        self.assertEqual([x["task"] for x in self.lease(max=10)], [now_id])
        self.assertEqual(self.lease(max=10), [])
        got = self.wait_lease(max=10)
        got_at = now_ms()
        self.assertEqual([x["task"] for x in got], [delayed])
        self.assertGreaterEqual(got_at, t["run_at_ms"] - 20,
                                "leased %d ms before run_at_ms" % (t["run_at_ms"] - got_at))

    def test_lease_object(self):
        self.create_queue(lease_ms=30000)
        w = self.register(nickname="lo")
        [tid] = self.put({"p": 1}, session="sess", index=3)
        t0 = now_ms()
        lease = self.lease_one(worker=w["id"])
        t1 = now_ms()
        self.assert_lease_shape(lease)
        self.assertEqual(lease["task"], tid)
        self.assertEqual(lease["payload"], {"p": 1})
        self.assertEqual(lease["attempt"], 1)
        self.assertEqual((lease["parent"], lease["session"], lease["index"]), (None, "sess", 3))
        self.assert_between(lease["deadline_ms"], t0 + 30000, t1 + 30000, "deadline_ms")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"]), ("leased", 1))
        self.assertEqual(t["lease"]["worker"], w["id"])
        self.assertEqual(t["lease"]["deadline_ms"], lease["deadline_ms"])
        # Anonymous lease: worker null.
        [tid2] = self.put(2)
        lease2 = self.lease_one()
        self.assertNotEqual(lease2["token"], lease["token"])
        self.assertEqual(self.get_task(tid2)["lease"]["worker"], None)
        self.expect_error("POST", "/v1/queues/%s/lease" % self.qname("nope"), {}, 404,
                          "queue_not_found")


if __name__ == "__main__":
    unittest.main()
