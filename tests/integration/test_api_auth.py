"""Auth: every endpoint but GET /v1/health needs `Authorization: Bearer TOKEN`; a
missing or wrong token gets 401 unauthorized and changes nothing; a head started
without --token writes a random admin token to DATA_DIR/token (mode 0600)."""
import os
import stat
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase  # noqa: E402


class AuthTest(ApiTestCase):

    def setUp(self):
        super().setUp()
        self.create_queue()
        self.ids = self.put("a", "b")
        self.leased = self.lease_one()
        self.worker = self.register(nickname="auth")

    def state(self):
        return (self.expect("GET", "/v1/queues")["queues"], self.list_tasks(),
                self.expect("GET", "/v1/workers")["workers"])

    def endpoints(self):
        q, w, tid = self.q, self.worker["id"], self.ids[0]
        lease = {"leases": [{"task": self.leased["task"], "token": self.leased["token"]}]}
        return [
            ("GET", "/v1/queues", None), ("GET", "/v1/queues/" + q, None),
            ("PUT", "/v1/queues/" + q, {"lease_ms": 5}),
            ("PUT", "/v1/queues/" + self.qname("new"), {}),
            ("DELETE", "/v1/queues/" + q, None),
            ("POST", "/v1/queues/%s/purge" % q, None), ("POST", "/v1/queues/%s/requeue" % q, None),
            ("POST", "/v1/queues/%s/tasks" % q, {"tasks": [{"payload": 1}]}),
            ("GET", "/v1/queues/%s/tasks" % q, None),
            ("POST", "/v1/queues/%s/lease" % q, {"max": 10}),
            ("GET", "/v1/tasks/%d" % tid, None), ("POST", "/v1/tasks/%d/requeue" % tid, None),
            ("POST", "/v1/leases/complete", lease), ("POST", "/v1/leases/fail", lease),
            ("POST", "/v1/leases/extend", lease), ("POST", "/v1/leases/release", lease),
            ("POST", "/v1/leases/flag", lease),
            ("POST", "/v1/workers", {}), ("GET", "/v1/workers", None),
            ("GET", "/v1/workers/%d" % w, None),
            ("POST", "/v1/workers/%d/heartbeat" % w, {"progress": "x"}),
            ("DELETE", "/v1/workers/%d" % w, None), ("GET", "/v1/leaderboard", None),
        ]

    def test_missing_token(self):
        before = self.state()
        for method, path, body in self.endpoints():
            r = self.expect_error(method, path, body, 401, "unauthorized", token=None)
            self.assertTrue(r.json["error"]["message"].startswith("no token sent: send "
                                                                  "'Authorization: Bearer TOKEN'"),
                            r)
        self.assertEqual(self.state(), before)

    def test_wrong_tokens(self):
        before = self.state()
        t = harness.TOKEN
        bad_headers = [{"Authorization": "Bearer " + t + "x"},
                       {"Authorization": "Bearer " + t[:-1]},
                       {"Authorization": "Bearer " + t.upper()},
                       {"Authorization": "Bearer "},
                       {"Authorization": "Bearer"},
                       {"Authorization": t},
                       {"Authorization": "Basic " + t},
                       {"Authorization": "Bearer " + t + " " + t},
                       {"Authorization": ""}]
        for method, path, body in self.endpoints():
            for hdr in bad_headers:
                r = self.expect_error(method, path, body, 401, "unauthorized", token=None,
                                      headers=hdr)
                # A header was sent: the message says what is wrong with it, not that
                # none was sent.
                bearer = hdr["Authorization"].strip().lower().startswith("bearer ")
                self.assertIn("the token sent is not valid for this head" if bearer else
                              "the Authorization header is not of the form 'Bearer TOKEN'",
                              r.json["error"]["message"], (hdr, r))
        self.assertEqual(self.state(), before)

    def test_metrics_says_which_token_problem(self):
        r = self.expect_error("GET", "/metrics", None, 401, "unauthorized", token=None)
        self.assertIn("no token sent", r.json["error"]["message"])
        r = self.expect_error("GET", "/metrics", None, 401, "unauthorized", token="wrong")
        self.assertIn("the token sent is not valid for this head", r.json["error"]["message"])

    def test_health_needs_no_token(self):
        r = self.call("GET", "/v1/health", token=None)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["status"], "ok")

    def test_right_token_works(self):
        self.assertEqual(self.call("GET", "/v1/queues").status, 200)
        r = self.call("GET", "/v1/queues", token=None,
                      headers={"Authorization": "Bearer " + harness.TOKEN})
        self.assertEqual(r.status, 200, r)


class GeneratedTokenTest(unittest.TestCase):
    """A fresh head without --token generates one into its data dir and keeps it."""

    def test_generated_token(self):
        head = harness.Head(["--sweep-ms", "50"], token=None)
        try:
            head.start()
            path = os.path.join(head.data_dir, "token")
            self.assertTrue(os.path.exists(path), "no DATA_DIR/token")
            mode = stat.S_IMODE(os.stat(path).st_mode)
            self.assertEqual(mode, 0o600, "token file mode is %o" % mode)
            with open(path) as f:
                token = f.read().strip()
            self.assertGreaterEqual(len(token), 16, "token too short to be random: %r" % token)
            r = head.request("GET", "/v1/queues", token=token)
            self.assertEqual(r.status, 200, r)
            r = head.request("PUT", "/v1/queues/gen", {}, token=token)
            self.assertEqual(r.status, 201, r)
            for bad in (None, harness.TOKEN, token + "x"):
                r = head.request("GET", "/v1/queues", token=bad)
                self.assertEqual((r.status, r.error_code), (401, "unauthorized"), r)
            # A restart keeps the same token.
            self.assertEqual(head.stop(), 0)
            head.start()
            with open(path) as f:
                self.assertEqual(f.read().strip(), token)
            r = head.request("GET", "/v1/queues/gen", token=token)
            self.assertEqual(r.status, 200, r)
        finally:
            head.cleanup()

    def test_two_fresh_heads_get_different_tokens(self):
        tokens = []
        for _ in range(2):
            head = harness.Head(["--sweep-ms", "50"], token=None)
            try:
                head.start()
                with open(os.path.join(head.data_dir, "token")) as f:
                    tokens.append(f.read().strip())
            finally:
                head.cleanup()
        self.assertNotEqual(tokens[0], tokens[1])


if __name__ == "__main__":
    unittest.main()
