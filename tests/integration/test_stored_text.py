"""Stored JSON text goes back out as it was stored: payloads, results, update data and
session init_data with tricky content (escapes, \\u0000, characters beyond the BMP,
shortest reals, extreme integers, nesting at the put's limit) come back byte for byte
through every reply that carries them — a task, a page of tasks, a requeue, a lease,
updates read or leased, a session and the session list, a session's results — since the
head splices the stored text into those replies rather than decoding it
(src/server/task_text.c, jv_add_stored; docs/design-notes.md, "Stored JSON text spliced
into replies").
What no reply could carry is refused where it comes in."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase  # noqa: E402

# The deepest values below take more than Python's default recursion limit to parse.
sys.setrecursionlimit(20000)

# A put body holds its payload in three containers ({"tasks": [{"payload": ...}]}), and
# jansson reads at most 2048 levels, the innermost scalar counted: 2044 arrays around a
# scalar is the deepest payload a put takes (DeepLimitTest shows the next is refused).
PUT_DEPTH = 2044
DEEP = b"[" * PUT_DEPTH + b'"deep"' + b"]" * PUT_DEPTH

# (text sent, text the head stores and every reply carries).  Compact text in the form
# the head writes is stored as sent; the last ones are rewritten into that form.
TRICKY = [
    ('"caf\u00e9 \u4e2d \U0001F600"'.encode(), '"caf\u00e9 \u4e2d \U0001F600"'.encode()),
    (b'"nul \\u0000 ctl \\u001F\\b\\f\\n\\r\\t \\"q\\" \\\\ end"',
     b'"nul \\u0000 ctl \\u001F\\b\\f\\n\\r\\t \\"q\\" \\\\ end"'),
    (b'{"k\\n":[1,-0.5,1e300,5e-324,-0.0,9223372036854775807,-9223372036854775808],'
     b'"":{},"a\\u0001":[]}',
     b'{"k\\n":[1,-0.5,1e300,5e-324,-0.0,9223372036854775807,-9223372036854775808],'
     b'"":{},"a\\u0001":[]}'),
    (DEEP, DEEP),
    (b'{"z": [1E2, 0.10000000000000001], "e": "\\u00e9\\ud83d\\ude00\\/"}',
     '{"z":[100.0,0.1],"e":"\u00e9\U0001F600/"}'.encode()),
]

# Values no reply could carry (numbers beyond int64 or a double, a lone surrogate, a NUL
# in a key, which jansson cannot hold): refused at every way in, so never stored.
REFUSED = [b"1e400", b"-1e400", b"99999999999999999999", b'"\\ud800"', b'{"a\\u0000":1}']


class StoredTextTest(ApiTestCase):

    def raw(self, method, path, body, status):
        r = self.call(method, path, raw=body)
        self.assertEqual(r.status, status, (body[:200], r))
        return r

    def assert_carries(self, reply, before, stored, after):
        """`reply` holds `stored` verbatim between the keys it sits between."""
        self.assertIn(before + stored + after, reply.raw,
                      "%r not carried verbatim in %r" % (stored[:80], reply.raw[:300]))

    def put_each(self, queue=None):
        ids = []
        for sent, _ in TRICKY:
            r = self.raw("POST", "/v1/queues/%s/tasks" % (queue or self.q),
                         b'{"tasks":[{"payload":' + sent + b"}]}", 201)
            ids.append(r.json["tasks"][0]["id"])
        return ids

    def lease_all(self, queue=None):
        r = self.raw("POST", "/v1/queues/%s/lease" % (queue or self.q),
                     ('{"max":%d}' % len(TRICKY)).encode(), 200)
        self.assertEqual(len(r.json["leases"]), len(TRICKY), r)
        return r

    def test_task_page_requeue_and_lease(self):
        self.create_queue(max_attempts=1)
        ids = self.put_each()
        for tid, (_, stored) in zip(ids, TRICKY):
            with self.subTest(stored=stored[:40]):
                got = self.call("GET", "/v1/tasks/%d" % tid)
                self.assert_carries(got, b'"payload":', stored, b',"result":null,')
                self.assertEqual(got.json["payload"], json.loads(stored))
        page = self.call("GET", "/v1/queues/%s/tasks?limit=1000" % self.q)
        self.assertEqual(page.status, 200, page)
        self.assertEqual([t["id"] for t in page.json["tasks"]], ids)
        for _, stored in TRICKY:
            self.assert_carries(page, b'"payload":', stored, b',"result":null,')
        brief = self.call("GET", "/v1/queues/%s/tasks?limit=1000&brief=true" % self.q)
        self.assertEqual([set(t) & {"payload", "result"} for t in brief.json["tasks"]],
                         [set()] * len(ids), brief)
        leases = self.lease_all()
        for _, stored in TRICKY:
            self.assert_carries(leases, b'"payload":', stored, b',"attempt":')
        # Failed for good (max_attempts 1), then requeued: the reply is the task.
        self.ack("fail", [{"task": x["task"], "token": x["token"], "error": "\u00e9\n\"q\""}
                          for x in leases.json["leases"]])
        for tid, (_, stored) in zip(ids, TRICKY):
            got = self.call("GET", "/v1/tasks/%d" % tid)
            self.assert_carries(got, b'"result":null,"error":', '"\u00e9\\n\\"q\\""'.encode(),
                                b',"attempts":1,')
            requeued = self.call("POST", "/v1/tasks/%d/requeue" % tid)
            self.assertEqual(requeued.status, 200, requeued)
            self.assert_carries(requeued, b'"payload":', stored, b',"result":null,')

    def test_results_in_task_and_page(self):
        self.create_queue()
        ids = self.put(*range(len(TRICKY)))
        leases = {x["task"]: x["token"] for x in self.lease_all().json["leases"]}
        for tid, (sent, _) in zip(ids, TRICKY):
            body = (b'{"leases":[{"task":%d,"token":%d,"result":' % (tid, leases[tid]) + sent +
                    b"}]}")
            self.raw("POST", "/v1/leases/complete", body, 200)
        page = self.call("GET", "/v1/queues/%s/tasks?state=done" % self.q)
        for tid, (i, (_, stored)) in zip(ids, enumerate(TRICKY)):
            after = b',"error":null,'
            self.assert_carries(page, b'"payload":%d,"result":' % i, stored, after)
            got = self.call("GET", "/v1/tasks/%d" % tid)
            self.assert_carries(got, b'"payload":%d,"result":' % i, stored, after)
            self.assertEqual(got.json["result"], json.loads(stored))

    def test_updates_read_and_leased(self):
        self.create_queue()
        for sent, _ in TRICKY:
            self.raw("POST", "/v1/queues/%s/updates" % self.q, b'{"data":' + sent + b"}", 201)
        listed = self.call("GET", "/v1/queues/%s/updates" % self.q)
        self.assertEqual(listed.json["last"], len(TRICKY), listed)
        self.put("x")
        leased = self.raw("POST", "/v1/queues/%s/lease" % self.q, b'{"updates_after":0}', 200)
        self.assertEqual(len(leased.json["updates"]), len(TRICKY), leased)
        for seq, (_, stored) in enumerate(TRICKY, 1):
            for reply in (listed, leased):
                self.assert_carries(reply, b'{"seq":%d,"data":' % seq, stored,
                                    b',"session":null,')
            self.assertEqual(listed.json["updates"][seq - 1]["data"], json.loads(stored))

    def test_session_init_data_and_results(self):
        self.create_queue()
        sessions = []
        for sent, stored in TRICKY:
            body = b'{"queue":"%s","init_data":' % self.q.encode() + sent + b"}"
            sid = self.raw("POST", "/v1/sessions", body, 201).json["id"]
            sessions.append(sid)
            got = self.call("GET", "/v1/sessions/" + sid)
            self.assert_carries(got, b'"init_data":', stored, b',"created_ms":')
            self.assertEqual(got.json["init_data"], json.loads(stored))
        listed = self.call("GET", "/v1/sessions")
        for _, stored in TRICKY:
            self.assert_carries(listed, b'"init_data":', stored, b',"created_ms":')
        sid = sessions[0]
        self.expect("POST", "/v1/sessions/%s/tasks" % sid,
                    {"tasks": [{"payload": i} for i in range(len(TRICKY))]}, status=201)
        leases = self.lease_all().json["leases"]
        for x in leases:
            sent = TRICKY[x["index"]][0]
            body = (b'{"leases":[{"task":%d,"token":%d,"result":' % (x["task"], x["token"]) +
                    sent + b"}]}")
            self.raw("POST", "/v1/leases/complete", body, 200)
        results = self.call("GET", "/v1/sessions/%s/results?max=100" % sid)
        self.assertEqual(len(results.json["results"]), len(TRICKY), results)
        for _, stored in TRICKY:
            self.assert_carries(results, b'"state":"done","result":', stored, b',"error":null,')

    def test_what_no_reply_could_carry_is_refused(self):
        self.create_queue()
        [tid] = self.put("x")
        lease = self.lease_one()
        for bad in REFUSED:
            with self.subTest(bad=bad):
                self.raw("POST", "/v1/queues/%s/tasks" % self.q,
                         b'{"tasks":[{"payload":' + bad + b"}]}", 400)
                self.raw("POST", "/v1/queues/%s/updates" % self.q, b'{"data":' + bad + b"}", 400)
                self.raw("POST", "/v1/sessions",
                         b'{"queue":"%s","init_data":' % self.q.encode() + bad + b"}", 400)
                r = self.raw("POST", "/v1/leases/complete",
                             b'{"leases":[{"task":%d,"token":%d,"result":' %
                             (tid, lease["token"]) + bad + b"}]}", 400)
                self.assertEqual(r.error_code, "bad_json", r)
        self.assertEqual(self.get_task(tid)["state"], "leased")
        self.assertEqual(self.call("GET", "/v1/queues/%s/updates" % self.q).json["last"], 0)
        self.assert_counts(leased=1)


class DeepLimitTest(ApiTestCase):

    def test_one_level_deeper_than_the_put_limit_is_refused(self):
        self.create_queue()
        deeper = b"[" * (PUT_DEPTH + 1) + b'"deep"' + b"]" * (PUT_DEPTH + 1)
        r = self.call("POST", "/v1/queues/%s/tasks" % self.q,
                      raw=b'{"tasks":[{"payload":' + deeper + b"}]}")
        self.assertEqual((r.status, r.error_code), (400, "bad_json"), r)
        self.assert_counts()


if __name__ == "__main__":
    unittest.main()
