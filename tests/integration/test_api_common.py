"""Shared helpers for the API tests, plus the tests of the conventions every endpoint
follows (health, error envelope, keep-alive, unknown paths, wrong methods).

The other test_api_*.py files import ApiTestCase from here.  Each test class starts
one head (setUpClass) and each test works in its own queues, named after the test,
so tests do not see each other's tasks.
"""
import json
import os
import re
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# Clock slack when comparing the head's instants with ours (same machine, same clock).
SLACK_MS = 150
MAX_ID = 2 ** 53

STATES = ("queued", "leased", "done", "failed", "dead", "cancelled")
QUEUE_KEYS = {"name", "lease_ms", "max_attempts", "backoff_ms", "backoff_max_ms", "next",
              "max_flags", "created_ms", "counts"}
TASK_KEYS = {"id", "queue", "state", "priority", "payload", "result", "error", "attempts",
             "flags", "key", "session", "index", "parent", "run_at_ms", "created_ms",
             "updated_ms", "lease"}
LEASE_KEYS = {"task", "token", "payload", "attempt", "deadline_ms", "parent", "session",
              "index"}
WORKER_KEYS = {"id", "name", "nickname", "node", "queues", "labels", "state", "progress",
               "last_seen_ms", "created_ms", "timeout_ms", "completed", "failed", "flagged",
               "gone_reason", "gone_at_ms", "leases"}


def now_ms():
    return int(time.time() * 1000)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class ApiTestCase(unittest.TestCase):
    """Base class: one head per test class, helpers that check status and envelope."""

    head_args = ("--sweep-ms", "50")
    head = None
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(list(cls.head_args)).start()

    @classmethod
    def tearDownClass(cls):
        if cls.head is not None:
            cls.head.cleanup()

    def setUp(self):
        if self.head.proc.poll() is not None:
            self.fail("head exited with %s:\n%s" % (self.head.proc.returncode, self.head.log()))
        self.q = self.qname()

    def tearDown(self):
        if self.head.proc.poll() is not None:
            print("\n--- head exited (%s); log tail:\n%s" % (self.head.proc.returncode,
                                                              self.head.log()), file=sys.stderr)

    # ---- naming ---------------------------------------------------------------

    def qname(self, suffix=""):
        """A queue name unique to this test (valid: letters, digits, '.', '_', '-')."""
        base = type(self).__name__ + "." + self._testMethodName.replace("test_", "", 1)
        return (base + ("-" + suffix if suffix else ""))[:128]

    # ---- raw calls ------------------------------------------------------------

    def call(self, method, path, body=None, **kw):
        return self.head.request(method, path, body, **kw)

    def expect(self, method, path, body=None, status=200, **kw):
        """Sends a request, asserts the status, returns the parsed JSON body."""
        r = self.call(method, path, body, **kw)
        self.assertEqual(r.status, status, "%s %s %s -> %r" % (
            method, path, json.dumps(body)[:300] if body is not None else "", r))
        self.assertIsNotNone(r.json, "%s %s: reply is not JSON: %r" % (method, path, r))
        return r.json

    def expect_error(self, method, path, body, status, code, **kw):
        """Sends a request, asserts the error status, code and envelope; returns the Reply."""
        r = self.call(method, path, body, **kw)
        what = "%s %s %s" % (method, path,
                             json.dumps(body)[:200] if body is not None else
                             repr((kw.get("raw") or b"")[:200]))
        self.assertEqual((r.status, r.error_code), (status, code), "%s -> %r" % (what, r))
        self.assert_envelope(r, code)
        return r

    def assert_envelope(self, r, code):
        self.assertIsInstance(r.json, dict, r)
        self.assertIsInstance(r.json.get("error"), dict, r)
        self.assertEqual(r.json["error"].get("code"), code, r)
        msg = r.json["error"].get("message")
        self.assertIsInstance(msg, str, r)
        self.assertTrue(msg, "empty error message: %r" % r)
        ctype = r.headers.get("Content-Type") or r.headers.get("content-type") or ""
        self.assertIn("application/json", ctype, "error reply content type: %r" % r.headers)

    # ---- domain helpers -------------------------------------------------------

    def create_queue(self, name=None, **settings):
        name = name or self.q
        q = self.expect("PUT", "/v1/queues/" + name, settings, status=201)
        self.assertEqual(q["name"], name)
        return q

    def get_queue(self, name=None):
        return self.expect("GET", "/v1/queues/" + (name or self.q))

    def counts(self, name=None):
        return self.get_queue(name)["counts"]

    def assert_counts(self, name=None, **expected):
        want = {s: expected.get(s, 0) for s in STATES}
        got = self.counts(name)
        self.assertEqual({s: got.get(s) for s in STATES}, want,
                         "counts of %s" % (name or self.q))

    def put_tasks(self, tasks, name=None):
        """Batch put of task dicts; returns the list of {"id", "created"}."""
        body = self.expect("POST", "/v1/queues/%s/tasks" % (name or self.q),
                           {"tasks": tasks}, status=201)
        self.assertEqual(len(body["tasks"]), len(tasks), body)
        return body["tasks"]

    def put(self, *payloads, name=None, **common):
        """Puts one task per payload (common fields added to each); returns ids."""
        res = self.put_tasks([dict(common, payload=p) for p in payloads], name=name)
        for e in res:
            self.assertIs(e["created"], True, res)
        return [e["id"] for e in res]

    def lease(self, name=None, **body):
        r = self.expect("POST", "/v1/queues/%s/lease" % (name or self.q), body)
        self.assertIsInstance(r.get("leases"), list, r)
        return r["leases"]

    def lease_one(self, name=None, **body):
        leases = self.lease(name, **body)
        self.assertEqual(len(leases), 1, leases)
        return leases[0]

    def wait_lease(self, name=None, timeout=10.0, **body):
        """Polls lease until it returns something (for tasks waiting out a backoff)."""
        got = []

        def attempt():
            got[:] = self.lease(name, **body)
            return got
        harness.wait_until(attempt, timeout=timeout, what="a lease from " + (name or self.q))
        return got

    def ack(self, kind, items, status=200):
        return self.expect("POST", "/v1/leases/" + kind, {"leases": items}, status=status)

    def get_task(self, tid):
        t = self.expect("GET", "/v1/tasks/%d" % tid)
        self.assert_task_shape(t)
        return t

    def list_tasks(self, name=None, state=None):
        """Every task of a queue (optionally in one state), following the cursor."""
        out, after = [], 0
        for _ in range(10000):
            path = "/v1/queues/%s/tasks?limit=1000&after=%d" % (name or self.q, after)
            if state:
                path += "&state=" + state
            page = self.expect("GET", path)
            out += page["tasks"]
            if page["next"] is None:
                return out
            # A page may be empty with a next: it read past tasks a closed session left
            # to the background deletion (docs/api.md); the cursor must still move on.
            self.assertGreater(page["next"], after, "a next that does not move on: %r" % page)
            after = page["next"]
        self.fail("pagination does not end")

    def snapshot(self, name=None):
        """The queue object and all its tasks, to check that a refused call changed nothing."""
        return self.get_queue(name), self.list_tasks(name)

    def wait_state(self, tid, state, timeout=10.0):
        return harness.wait_until(
            lambda: (lambda t: t if t["state"] == state else None)(self.get_task(tid)),
            timeout=timeout, what="task %d to become %s" % (tid, state))

    def register(self, **body):
        return self.expect("POST", "/v1/workers", body, status=201)

    # ---- shape checks ---------------------------------------------------------

    def assert_task_shape(self, t):
        self.assertIsInstance(t, dict)
        missing = TASK_KEYS - set(t)
        self.assertFalse(missing, "task lacks %s: %r" % (sorted(missing), t))
        self.assertNotIn("token", t, "a task object must never show the fencing token")
        if t["lease"] is not None:
            self.assertNotIn("token", t["lease"], "a task object must never show the token")
            self.assertEqual(set(t["lease"]) >= {"worker", "deadline_ms"}, True, t)
        self.assertIn(t["state"], STATES, t)
        for k in ("id", "priority", "attempts", "flags", "run_at_ms", "created_ms",
                  "updated_ms"):
            self.assertTrue(is_int(t[k]), "%s: %r" % (k, t))
        self.assertTrue(0 < t["id"] < MAX_ID, t)

    def assert_lease_shape(self, lease):
        missing = LEASE_KEYS - set(lease)
        self.assertFalse(missing, "lease lacks %s: %r" % (sorted(missing), lease))
        for k in ("task", "token", "attempt", "deadline_ms"):
            self.assertTrue(is_int(lease[k]), "%s: %r" % (k, lease))
        self.assertTrue(0 < lease["token"] < MAX_ID, lease)

    def assert_between(self, value, lo, hi, what):
        self.assertTrue(is_int(value), "%s is not an integer: %r" % (what, value))
        self.assertTrue(lo - SLACK_MS <= value <= hi + SLACK_MS,
                        "%s = %d, expected within [%d, %d] (slack %d ms)"
                        % (what, value, lo, hi, SLACK_MS))


class OwnHeadTestCase(ApiTestCase):
    """An ApiTestCase whose every test has a head of its own (its own data dir), for
    tests that stop, kill or restart it; `extra_args()` adds to `head_args`."""

    @classmethod
    def setUpClass(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        pass

    def extra_args(self):
        return []

    def setUp(self):
        self.head = harness.Head(list(self.head_args) + self.extra_args())
        self.head.start()
        self.q = self.qname()

    def tearDown(self):
        self.head.cleanup()


class ConventionTest(ApiTestCase):
    """Conventions shared by every endpoint."""

    def test_health_without_token(self):
        for token in (None, "default"):
            r = self.call("GET", "/v1/health", token=token)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json["status"], "ok", r)
            self.assertEqual(r.json["version"], "0.1.0", r)
            self.assertTrue(is_int(r.json["uptime_ms"]) and r.json["uptime_ms"] >= 0, r)
            # The default --max-wait-ms: what a client that waits for as long as it
            # takes asks for per request (MaxWaitTest checks another value).
            self.assertEqual(r.json["max_wait_ms"], 30000, r)
            self.assertEqual(set(r.json), {"status", "version", "schema", "uptime_ms",
                                           "max_wait_ms"}, r)
            # The data dir's schema, as the head's log said when it made the store.
            made = re.search(r"created a new store at schema version (\d+)", self.head.log())
            self.assertEqual(r.json["schema"], int(made.group(1)), self.head.log())
        # Uptime grows with time.
        first = self.call("GET", "/v1/health", token=None).json["uptime_ms"]
        later = harness.wait_until(
            lambda: (lambda u: u if u > first else None)(
                self.call("GET", "/v1/health", token=None).json["uptime_ms"]),
            what="uptime to grow")
        self.assertGreater(later, first)

    def test_keep_alive(self):
        conn = self.head.connection()
        try:
            for _ in range(5):
                r = self.head.request("GET", "/v1/queues", conn=conn)
                self.assertEqual(r.status, 200, r)
            # An error reply keeps the connection usable too.
            r = self.head.request("GET", "/v1/queues/no-such-queue-here", conn=conn)
            self.assertEqual(r.status, 404, r)
            r = self.head.request("GET", "/v1/health", conn=conn)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json["status"], "ok")
        finally:
            conn.close()

    def test_head_replies_keep_the_connection(self):
        # A HEAD reply carries the length of the body it leaves out; were the body sent,
        # the next reply on the connection would be read from the middle of it.
        conn = self.head.connection()
        try:
            for path, status in (("/v1/queues/no-such-queue-here", 404), ("/v1/health", 200),
                                 ("/v1/queues", 200)):
                r = self.head.request("HEAD", path, conn=conn)
                self.assertEqual((r.status, r.raw), (status, b""), path)
                self.assertGreater(int(r.headers["Content-Length"]), 0, path)
                r = self.head.request("GET", "/v1/health", conn=conn)
                self.assertEqual((r.status, r.json["status"]), (200, "ok"), path)
        finally:
            conn.close()

    def test_json_content_type_on_replies(self):
        self.create_queue()
        r = self.call("GET", "/v1/queues/" + self.q)
        ctype = r.headers.get("Content-Type") or r.headers.get("content-type") or ""
        self.assertIn("application/json", ctype, r.headers)

    def test_unknown_paths_are_not_found(self):
        self.create_queue()
        before = self.snapshot()
        for method, path in [("GET", "/v1/nope"), ("GET", "/v2/health"),
                             ("POST", "/v1/nope"), ("GET", "/v1/queues/%s/nope" % self.q),
                             ("POST", "/v1/leases/nope"), ("GET", "/v1/tasks/1/nope"),
                             ("GET", "/v1"), ("DELETE", "/v1/nope/x/y")]:
            self.expect_error(method, path, None, 404, "not_found")
        self.assertEqual(self.snapshot(), before)

    def test_wrong_method(self):
        self.create_queue()
        [tid] = self.put({"x": 1})
        w = self.register(nickname="m")
        before = self.snapshot()
        cases = [
            ("POST", "/v1/health"), ("POST", "/v1/queues"), ("DELETE", "/v1/queues"),
            ("POST", "/v1/queues/" + self.q), ("PATCH", "/v1/queues/" + self.q),
            ("PUT", "/v1/queues/%s/tasks" % self.q), ("DELETE", "/v1/queues/%s/tasks" % self.q),
            ("GET", "/v1/queues/%s/lease" % self.q), ("GET", "/v1/queues/%s/purge" % self.q),
            ("GET", "/v1/queues/%s/requeue" % self.q),
            ("GET", "/v1/leases/complete"), ("GET", "/v1/leases/fail"),
            ("PUT", "/v1/leases/extend"), ("DELETE", "/v1/leases/release"),
            ("GET", "/v1/leases/flag"),
            ("PUT", "/v1/tasks/%d" % tid), ("POST", "/v1/tasks/%d" % tid),
            ("GET", "/v1/tasks/%d/requeue" % tid),
            ("DELETE", "/v1/workers"), ("PUT", "/v1/workers/%d" % w["id"]),
            ("GET", "/v1/workers/%d/heartbeat" % w["id"]), ("POST", "/v1/leaderboard"),
        ]
        for method, path in cases:
            self.expect_error(method, path, None, 405, "method_not_allowed")
        self.assertEqual(self.snapshot(), before)
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w["id"])["state"], "active")


if __name__ == "__main__":
    unittest.main()
