"""Bad input of every kind: each is answered with the documented status and code, the
error envelope, and changes nothing (docs/api.md, "Errors" and "Batches are
all-or-nothing")."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase  # noqa: E402

KINDS = ("complete", "fail", "extend", "release", "flag")


class BadInputCase(ApiTestCase):
    """Each test starts with a queue holding one queued and one leased task."""

    def setUp(self):
        super().setUp()
        self.create_queue()
        self.ids = self.put("a", "b")
        self.leased = self.lease_one()
        self.worker = self.register(nickname="bad-input")
        self.before = self.state()

    def state(self):
        return (self.expect("GET", "/v1/queues")["queues"], self.list_tasks(),
                self.expect("GET", "/v1/workers")["workers"])

    def assert_unchanged(self, what=""):
        self.assertEqual(self.state(), self.before, "a refused request changed state " + what)

    def refused(self, method, path, body, status, code, names=(), **kw):
        """Asserts the error reply and that nothing changed; a failure is recorded as a
        subtest so that the remaining cases still run (and the baseline moves on)."""
        what = "%s %s %s" % (method, path, json.dumps(body)[:120] if body is not None
                             else kw.get("raw", b"")[:60])
        with self.subTest(request=what):
            try:
                r = self.expect_error(method, path, body, status, code, **kw)
                for n in names:
                    # "tasks[1].priority": the element and the field are both named.
                    for part in n.split("."):
                        self.assertIn(part, r.json["error"]["message"],
                                      "the message must name %r" % n)
            finally:
                now = self.state()
                changed, self.before = now != self.before, now
            self.assertFalse(changed, "a refused request changed state: " + what)

    def good_lease_item(self, **extra):
        return dict({"task": self.leased["task"], "token": self.leased["token"]}, **extra)

    def write_endpoints(self):
        w = self.worker["id"]
        return [("POST", "/v1/queues/%s/tasks" % self.q), ("PUT", "/v1/queues/" + self.q),
                ("PUT", "/v1/queues/" + self.qname("new")),
                ("POST", "/v1/queues/%s/lease" % self.q)] + \
               [("POST", "/v1/leases/" + k) for k in KINDS] + \
               [("POST", "/v1/workers"), ("POST", "/v1/workers/%d/heartbeat" % w)]


class BadInputTest(BadInputCase):
    head_args = ("--sweep-ms", "50", "--max-payload", "2048")

    def test_malformed_json(self):
        for method, path in self.write_endpoints():
            for raw in (b'{"tasks": [', b"{bad}", b"{'a': 1}", b'{"a": 1} trailing',
                        b"\xff\xfe{", b'{"a": }'):
                self.refused(method, path, None, 400, "bad_json", raw=raw)

    def test_integer_past_int64_says_the_range(self):
        # jansson's own words ("too big integer") say nothing of what would do.
        self.refused("PUT", "/v1/queues/" + self.q, None, 400, "bad_json",
                     names=("too big integer", "line 1, column", "at most 2^63-1"),
                     raw=b'{"lease_ms": 9223372036854775808}')
        self.refused("POST", "/v1/iterations", None, 400, "bad_json", names=("at most 2^63-1",),
                     raw=b'{"name": "x", "dataset": {"num_samples": 10},'
                         b' "seed": 18446744073709551615}')

    def test_body_not_an_object(self):
        for method, path in self.write_endpoints():
            for raw in (b"[]", b'[{"payload": 1}]', b'"str"', b"42", b"null", b"true"):
                self.refused(method, path, None, 400, "bad_json", raw=raw)

    def test_put_wrong_types_and_values(self):
        path = "/v1/queues/%s/tasks" % self.q
        ok = {"payload": {"fine": True}}
        for tasks in ({}, "x", None, 5):
            self.refused("POST", path, {"tasks": tasks}, 400, "invalid_argument", ["tasks"])
        self.refused("POST", path, {}, 400, "invalid_argument", ["tasks"])
        bad_elements = [
            (1, "tasks[1]"), ("x", "tasks[1]"), ([], "tasks[1]"),
            ({"priority": 1}, "tasks[1].payload"),
            ({"payload": 1, "priority": "high"}, "tasks[1].priority"),
            ({"payload": 1, "priority": 1.5}, "tasks[1].priority"),
            ({"payload": 1, "priority": True}, "tasks[1].priority"),
            ({"payload": 1, "delay_ms": -1}, "tasks[1].delay_ms"),
            ({"payload": 1, "delay_ms": "5"}, "tasks[1].delay_ms"),
            ({"payload": 1, "delay_ms": 2.5}, "tasks[1].delay_ms"),
            ({"payload": 1, "key": 5}, "tasks[1].key"),
            ({"payload": 1, "key": "k" * 257}, "tasks[1].key"),
            ({"payload": 1, "key": "\u00e9" * 129}, "tasks[1].key"),   # 258 bytes
            ({"payload": 1, "session": 7}, "tasks[1].session"),
            ({"payload": 1, "session": "s" * 129}, "tasks[1].session"),
            ({"payload": 1, "index": -1}, "tasks[1].index"),
            ({"payload": 1, "index": "0"}, "tasks[1].index"),
            ({"payload": 1, "index": 1.5}, "tasks[1].index"),
        ]
        for element, name in bad_elements:
            self.refused("POST", path, {"tasks": [ok, element, ok]}, 400, "invalid_argument",
                         [name])

    def test_unknown_fields(self):
        # The brief for these tests (issue 3) lists unknown fields as bad input.
        self.refused("POST", "/v1/queues/%s/tasks" % self.q,
                     {"tasks": [{"payload": 1, "priorty": 5}]}, 400, "invalid_argument",
                     ["priorty"])
        self.refused("PUT", "/v1/queues/" + self.q, {"lease_msec": 5}, 400, "invalid_argument",
                     ["lease_msec"])
        self.refused("PUT", "/v1/queues/" + self.qname("new"), {"lease_msec": 5}, 400,
                     "invalid_argument", ["lease_msec"])
        self.refused("POST", "/v1/queues/%s/lease" % self.q, {"maxx": 2}, 400,
                     "invalid_argument", ["maxx"])
        self.refused("POST", "/v1/leases/complete", {"leases": [self.good_lease_item(resutl=1)]},
                     400, "invalid_argument", ["resutl"])
        self.refused("POST", "/v1/workers", {"nick": "x"}, 400, "invalid_argument", ["nick"])

    def test_unknown_field_says_what_was_meant_and_what_is_known(self):
        # A slip of the fingers is told the field it likely meant; every refusal lists
        # the fields the object takes, so no one opens the docs (or the source) to learn
        # them.  Nested objects and the iteration's two key lists alike.
        for method, path, body, message in (
                ("POST", "/v1/queues/%s/tasks" % self.q,
                 {"tasks": [{"payload": 1, "priorty": 5}]},
                 "tasks[0].priorty: unknown field (did you mean 'priority'?); known fields: "
                 "payload, priority, delay_ms, key, session, index, requires"),
                ("POST", "/v1/workers", {"nick": "x"},
                 "nick: unknown field (did you mean 'nickname'?); known fields: nickname, "
                 "queues, node, labels, timeout_ms, instance"),
                ("POST", "/v1/queues/%s/lease" % self.q, {"zzzz": 2},
                 "zzzz: unknown field; known fields: worker, max, wait_ms, updates_after, request")):
            with self.subTest(path=path):
                r = self.expect_error(method, path, body, 400, "invalid_argument")
                self.assertEqual(r.json["error"]["message"], message)
        self.assert_unchanged()
        r = self.expect_error("POST", "/v1/iterations",
                              {"name": self.q, "dataset": {"num_samples": 4}, "seeed": 1},
                              400, "invalid_argument")
        message = r.json["error"]["message"]
        self.assertTrue(message.startswith("seeed: unknown field (did you mean 'seed'?); "
                                           "known fields: name, "), message)
        for key in ("rank_timeout_ms", "shuffle", "world_size", "block_size"):
            self.assertIn(key, message)
        self.expect_error("GET", "/v1/iterations/" + self.q, None, 404, "iteration_not_found")

    def test_endpoints_without_fields_refuse_any(self):
        # Purges, requeues and deletions take no fields: one sent in the belief that it
        # narrows the call ("state": "dead" to a requeue) is refused, not ignored.
        self.ack("fail", [self.good_lease_item(permanent=True)])
        self.before = self.state()
        for method, path, field in (
                ("POST", "/v1/queues/%s/requeue" % self.q, "state"),
                ("POST", "/v1/tasks/%d/requeue" % self.leased["task"], "attempts"),
                ("POST", "/v1/queues/%s/purge" % self.q, "state"),
                ("DELETE", "/v1/queues/" + self.q, "force"),
                ("DELETE", "/v1/workers/%d" % self.worker["id"], "crashed")):
            self.refused(method, path, {field: "x"}, 400, "invalid_argument",
                         ["%s: unknown field" % field])
        sid = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        self.expect("POST", "/v1/nodes", {"name": self.q}, status=201)
        self.expect("POST", "/v1/iterations", {"name": self.q, "dataset": {"num_samples": 4}},
                    status=201)
        self.expect("PUT", "/v1/shared/%s/blob" % self.q, raw=b"bytes", status=201,
                    content_type="application/octet-stream")
        # What each deletion would change, read back after its refusal.
        for path, still_there in (
                ("/v1/sessions/" + sid, lambda r: r.status == 200),
                ("/v1/nodes/" + self.q, lambda r: r.json["state"] == "active"),
                ("/v1/iterations/" + self.q, lambda r: r.status == 200),
                ("/v1/shared/%s/blob" % self.q, lambda r: r.raw == b"bytes")):
            with self.subTest(path=path):
                r = self.expect_error("DELETE", path, {"all": True}, 400, "invalid_argument")
                self.assertIn("all: unknown field", r.json["error"]["message"])
                r = self.call("GET", path)
                self.assertTrue(still_there(r), "a refused DELETE changed %s: %r" % (path, r))
                self.expect("DELETE", path, {})  # no field: taken
        self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")

    def test_queue_settings_out_of_range(self):
        new = self.qname("new")
        bad = [{"lease_ms": 0}, {"lease_ms": -1}, {"lease_ms": 7 * 86400000 + 1},
               {"lease_ms": "60"}, {"lease_ms": 1.5}, {"lease_ms": True}, {"lease_ms": None},
               {"max_attempts": 0}, {"max_attempts": -1}, {"max_attempts": "5"},
               {"backoff_ms": -1}, {"backoff_ms": "x"},
               {"backoff_ms": 100, "backoff_max_ms": 50}, {"backoff_max_ms": -1},
               {"max_flags": 0}, {"max_flags": -3}, {"max_flags": []},
               {"next": 5}, {"next": ["a"]}, {"next": {}}]
        for settings in bad:
            names = list(settings) if len(settings) == 1 else []
            self.refused("PUT", "/v1/queues/" + new, settings, 400, "invalid_argument", names)
            self.refused("PUT", "/v1/queues/" + self.q, settings, 400, "invalid_argument", names)
        # The existing queue's backoff_ms is 1000: a smaller cap is refused on update.
        self.refused("PUT", "/v1/queues/" + self.q, {"backoff_max_ms": 500}, 400,
                     "invalid_argument", ["backoff_max_ms"])
        # The limits themselves are fine.
        edge = self.qname("edge")
        q = self.create_queue(edge, lease_ms=7 * 86400000, max_attempts=1, backoff_ms=0,
                              backoff_max_ms=0, max_flags=1)
        self.assertEqual((q["lease_ms"], q["max_attempts"], q["backoff_ms"],
                          q["backoff_max_ms"], q["max_flags"]), (7 * 86400000, 1, 0, 0, 1))
        self.expect("PUT", "/v1/queues/" + edge, {"lease_ms": 1})

    def test_lease_body(self):
        path = "/v1/queues/%s/lease" % self.q
        for body, field in (({"max": 0}, "max"), ({"max": -1}, "max"), ({"max": "2"}, "max"),
                            ({"max": 1.5}, "max"), ({"wait_ms": -1}, "wait_ms"),
                            ({"wait_ms": "x"}, "wait_ms"), ({"worker": "x"}, "worker"),
                            ({"worker": 1.5}, "worker")):
            self.refused("POST", path, body, 400, "invalid_argument", [field])
        self.refused("POST", path, {"max": 1001}, 413, "batch_too_large")

    def test_range_messages_state_the_real_limits(self):
        # A refused number is answered with the limits a user can meet: "from 1 to
        # 1000", or "at least 1" where there is no upper one; never INT64_MAX.  A
        # query parameter says the same whether its text is no integer or out of range.
        tasks = "/v1/queues/%s/tasks" % self.q
        lease = "/v1/queues/%s/lease" % self.q
        for method, path, body, status, code, want in (
                ("POST", lease, {"max": 0}, 400, "invalid_argument",
                 "max: 0 is out of range; it must be from 1 to 1000"),
                ("POST", lease, {"max": 1001}, 413, "batch_too_large",
                 "max: 1001 is out of range; it must be from 1 to 1000"),
                ("POST", lease, {"wait_ms": -1}, 400, "invalid_argument",
                 "wait_ms: -1 is out of range; it must be at least 0"),
                ("POST", lease, {"worker": 0}, 400, "invalid_argument",
                 "worker: 0 is out of range; it must be at least 1"),
                ("GET", tasks + "?limit=0", None, 400, "invalid_argument",
                 "query limit: '0' is out of range; it must be from 1 to 1000"),
                ("GET", tasks + "?limit=abc", None, 400, "invalid_argument",
                 "query limit: 'abc' is not an integer; it must be from 1 to 1000"),
                ("GET", tasks + "?after=-1", None, 400, "invalid_argument",
                 "query after: '-1' is out of range; it must be at least 0"),
                ("GET", "/v1/shared/models/w?level=0", None, 400, "invalid_argument",
                 "query level: '0' is out of range; it must be at least 1"),
                ("GET", "/v1/throughput?seconds=0", None, 400, "invalid_argument",
                 "query seconds: '0' is out of range; it must be from 1 to 600")):
            with self.subTest(path=path, body=body):
                r = self.expect_error(method, path, body, status, code)
                self.assertEqual(r.json["error"]["message"], want)

    def test_lease_calls_wrong_types(self):
        good = self.good_lease_item()
        for kind in KINDS:
            path = "/v1/leases/" + kind
            for leases in ({}, "x", None, 7):
                self.refused("POST", path, {"leases": leases}, 400, "invalid_argument",
                             ["leases"])
            self.refused("POST", path, {}, 400, "invalid_argument", ["leases"])
            for element, name in ((1, "leases[1]"),
                                  ({"task": self.ids[1]}, "leases[1].token"),
                                  ({"token": 5}, "leases[1].task"),
                                  ({"task": self.ids[1], "token": "5"}, "leases[1].token"),
                                  ({"task": str(self.ids[1]), "token": 5}, "leases[1].task"),
                                  ({"task": 0, "token": 5}, "leases[1].task"),
                                  ({"task": -4, "token": 5}, "leases[1].task"),
                                  ({"task": 2 ** 53, "token": 5}, "leases[1].task"),
                                  ({"task": self.ids[1], "token": 1.5}, "leases[1].token")):
                self.refused("POST", path, {"leases": [good, element]}, 400,
                             "invalid_argument", [name])
        for kind, extra, name in (("extend", {"lease_ms": 0}, "lease_ms"),
                                  ("extend", {"lease_ms": -5}, "lease_ms"),
                                  ("extend", {"lease_ms": "x"}, "lease_ms"),
                                  ("fail", {"permanent": "yes"}, "permanent"),
                                  ("fail", {"error": 5}, "error"),
                                  ("flag", {"reason": 5}, "reason")):
            self.refused("POST", "/v1/leases/" + kind,
                         {"leases": [self.good_lease_item(**extra)]}, 400, "invalid_argument",
                         ["leases[0]." + name])

    def test_batch_too_large(self):
        self.refused("POST", "/v1/queues/%s/tasks" % self.q,
                     {"tasks": [{"payload": i} for i in range(1001)]}, 413, "batch_too_large")
        many = [self.good_lease_item() for _ in range(1001)]
        for kind in KINDS:
            self.refused("POST", "/v1/leases/" + kind, {"leases": many}, 413, "batch_too_large")
        # Exactly 1000 is fine.
        self.put_tasks([{"payload": i} for i in range(1000)])
        self.assertEqual(self.counts()["queued"], 1001)

    def test_payload_too_large(self):
        path = "/v1/queues/%s/tasks" % self.q
        for payload in ("x" * 2100, {"a": "y" * 2045}, ["z" * 700] * 3):
            self.refused("POST", path, {"tasks": [{"payload": 1}, {"payload": payload}]},
                         413, "payload_too_large")
        self.refused("POST", "/v1/leases/complete",
                     {"leases": [self.good_lease_item(result="r" * 3000)]}, 413,
                     "payload_too_large")
        # Under the limit is fine.
        [tid] = self.put("x" * 2000)
        self.assertEqual(self.get_task(tid)["payload"], "x" * 2000)
        self.ack("complete", [self.good_lease_item(result="r" * 2000)])
        self.assertEqual(self.get_task(self.leased["task"])["result"], "r" * 2000)

    def test_unknown_queue(self):
        nope = self.qname("nope")
        for method, path, body in (
                ("GET", "/v1/queues/" + nope, None),
                ("DELETE", "/v1/queues/" + nope, None),
                ("POST", "/v1/queues/%s/purge" % nope, None),
                ("POST", "/v1/queues/%s/requeue" % nope, None),
                ("POST", "/v1/queues/%s/tasks" % nope, {"tasks": [{"payload": 1}]}),
                ("GET", "/v1/queues/%s/tasks" % nope, None),
                ("POST", "/v1/queues/%s/lease" % nope, {"max": 1}),
                ("PUT", "/v1/queues/" + self.q, {"next": nope})):
            self.refused(method, path, body, 404, "queue_not_found")

    def test_invalid_queue_name_on_every_queue_route(self):
        # A name no queue may have is name_invalid, as when creating it, on every
        # route that names a queue, and before its body is read (an empty or bad body
        # would otherwise be answered first).
        for name in ("a%20b", "q" * 129, "a$b"):
            for method, path, body in (
                    ("GET", "/v1/queues/%s", None),
                    ("DELETE", "/v1/queues/%s", None),
                    ("POST", "/v1/queues/%s/purge", None),
                    ("POST", "/v1/queues/%s/requeue", None),
                    ("POST", "/v1/queues/%s/tasks", {"tasks": [{"payload": 1}]}),
                    ("POST", "/v1/queues/%s/tasks", {"bogus": 1}),
                    ("GET", "/v1/queues/%s/tasks", None),
                    ("POST", "/v1/queues/%s/lease", {"max": 1}),
                    ("POST", "/v1/queues/%s/lease", {"bogus": 1}),
                    ("PUT", "/v1/queues/%s", {"bogus": 1}),
                    ("POST", "/v1/queues/%s/updates", {"payload": 1}),
                    ("GET", "/v1/queues/%s/updates", None)):
                self.refused(method, path % name, body, 400, "name_invalid")
        r = self.expect_error("POST", "/v1/queues/a%20b/tasks", {"tasks": [{"payload": 1}]},
                              400, "name_invalid")
        self.assertIn("'a b' is invalid: use 1 to 128 characters", r.json["error"]["message"])
        # A name in a body is checked by the same rule.
        self.refused("POST", "/v1/sessions", {"queue": "a b"}, 400, "name_invalid")

    def test_unknown_task(self):
        self.refused("GET", "/v1/tasks/987654321", None, 404, "task_not_found")
        self.refused("POST", "/v1/tasks/987654321/requeue", None, 404, "task_not_found")
        for kind in KINDS:
            self.refused("POST", "/v1/leases/" + kind,
                         {"leases": [{"task": 987654321, "token": 1}]}, 404, "task_not_found")

    def test_bad_ids_in_paths(self):
        for bad in ("abc", "0", "-1", "1.5", "1e3", "0x1f", "99999999999999999999999", "1abc"):
            self.refused("GET", "/v1/tasks/" + bad, None, 400, "bad_request")
            self.refused("POST", "/v1/tasks/%s/requeue" % bad, None, 400, "bad_request")
            self.refused("GET", "/v1/workers/" + bad, None, 400, "bad_request")
            self.refused("POST", "/v1/workers/%s/heartbeat" % bad, {}, 400, "bad_request")
            self.refused("DELETE", "/v1/workers/" + bad, None, 400, "bad_request")

    def test_invalid_queue_names(self):
        for name in ("q" * 129, "a%20b", "a$b", "%C3%BC", "a*b", "a:b", "a+b",
                     "a%00b", "a%25b", "a%22b", "a'b"):
            self.refused("PUT", "/v1/queues/" + name, {}, 400, "name_invalid")
        self.refused("PUT", "/v1/queues/", {}, 400, "name_invalid")
        # The longest name and every allowed character are fine.
        self.create_queue("Q" * 128)
        self.create_queue("AZaz09._-" + self.q[:100])

    def test_bytes_that_are_not_utf8_are_quoted(self):
        # A message that quotes a client's bytes which are no UTF-8 (a %FF in a name,
        # a field name cut inside a character by the message's "%.100s") could not be
        # made a JSON string: the reply was the bare body {}.  They read '?'.
        r = self.expect_error("GET", "/v1/queues/%FF", None, 400, "name_invalid")
        self.assertIn("queue name '?' is invalid", r.json["error"]["message"])
        r = self.expect_error("GET", "/v1/shared/%FFs/blob", None, 400, "name_invalid")
        self.assertIn("scope '?s'", r.json["error"]["message"])
        field = "a" + "\u00e9" * 60  # "%.100s" ends inside its 51st character
        self.refused("POST", "/v1/queues/%s/purge" % self.q, {field: 1}, 400, "invalid_argument",
                     [field[:50] + "?: unknown field"])
        self.refused("POST", "/v1/queues/%s/lease" % self.q, {field: 1}, 400, "invalid_argument")

    def test_wrong_content_type(self):
        body = json.dumps({"tasks": [{"payload": 1}]}).encode()
        for ctype in ("text/plain", "application/x-www-form-urlencoded",
                      "application/octet-stream", "multipart/form-data; boundary=x"):
            self.refused("POST", "/v1/queues/%s/tasks" % self.q, None, 415,
                         "unsupported_media_type", raw=body, content_type=ctype)
            self.refused("PUT", "/v1/queues/" + self.qname("new"), None, 415,
                         "unsupported_media_type", raw=b"{}", content_type=ctype)
            self.refused("POST", "/v1/leases/complete", None, 415, "unsupported_media_type",
                         raw=json.dumps({"leases": [self.good_lease_item()]}).encode(),
                         content_type=ctype)
        # application/json with parameters is JSON.
        r = self.call("POST", "/v1/queues/%s/tasks" % self.q, None, raw=body,
                      content_type="application/json; charset=utf-8")
        self.assertEqual(r.status, 201, r)

    def test_worker_register_and_heartbeat_types(self):
        for body, field in (({"nickname": 5}, "nickname"), ({"queues": "q"}, "queues"),
                            ({"queues": [1]}, "queues"), ({"node": 5}, "node"),
                            ({"labels": "x"}, "labels"), ({"labels": [1]}, "labels"),
                            ({"timeout_ms": 0}, "timeout_ms"), ({"timeout_ms": -1}, "timeout_ms"),
                            ({"timeout_ms": "x"}, "timeout_ms")):
            self.refused("POST", "/v1/workers", body, 400, "invalid_argument", [field])
        self.refused("POST", "/v1/workers", {"queues": ["ok", "a b"]}, 400, "invalid_argument",
                         ["queues[1]: 'a b' is invalid: use 1 to 128 characters"])
        self.refused("POST", "/v1/workers/%d/heartbeat" % self.worker["id"], {"progress": 5},
                     400, "invalid_argument", ["progress"])


class BodyLimitTest(BadInputCase):
    head_args = ("--sweep-ms", "50", "--max-body", "1024")

    def test_body_too_large(self):
        big = {"tasks": [{"payload": "x" * 1500}]}
        self.refused("POST", "/v1/queues/%s/tasks" % self.q, big, 413, "body_too_large")
        self.refused("POST", "/v1/queues/%s/tasks" % self.q,
                     {"tasks": [{"payload": i} for i in range(300)]}, 413, "body_too_large")
        self.refused("PUT", "/v1/queues/" + self.qname("new"), {"next": None, "pad": "p" * 2000},
                     413, "body_too_large")
        self.refused("POST", "/v1/leases/complete",
                     {"leases": [self.good_lease_item(result="r" * 2000)]}, 413,
                     "body_too_large")
        self.refused("POST", "/v1/workers", {"labels": {"pad": "p" * 2000}}, 413,
                     "body_too_large")
        # Under the limit is fine, on a fresh connection and on the same one.
        self.put("x" * 900)
        self.put("y")
        self.assertEqual(self.counts()["queued"], 3)


class DefaultLimitsTest(BadInputCase):
    head_args = ("--sweep-ms", "50")

    def test_default_payload_and_body_limits(self):
        mib = 1024 * 1024
        self.refused("POST", "/v1/queues/%s/tasks" % self.q,
                     {"tasks": [{"payload": "x" * (mib + 16)}]}, 413, "payload_too_large")
        self.refused("POST", "/v1/queues/%s/tasks" % self.q,
                     {"tasks": [{"payload": "x" * (mib // 2)} for _ in range(17)]}, 413,
                     "body_too_large")
        [tid] = self.put("x" * (mib - 1024))
        self.assertEqual(len(self.get_task(tid)["payload"]), mib - 1024)


if __name__ == "__main__":
    unittest.main()
