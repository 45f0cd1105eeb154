"""Auth: every endpoint but GET /v1/health needs `Authorization: Bearer TOKEN`; a
missing or wrong token gets 401 unauthorized and changes nothing; a head started
without --token writes a random admin token to DATA_DIR/token (mode 0600), and what else
it keeps in its data dir is its own user's alone too."""
import os
import shutil
import stat
import sys
import tempfile
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


class DataDirModeTest(unittest.TestCase):
    """The store, its WAL, the blobs and the backups hold every client's data: a local
    user other than the head's could read them all (muster.db 0644 in a 0755 data dir)
    while the token beside them was 0600.  The head now makes its data dir 0700 and its
    files 0600, whatever the umask, also in a data dir made for it 0755 (as systemd's
    StateDirectory= makes one)."""

    def setUp(self):
        self.parent = tempfile.mkdtemp(prefix="muster-mode-")
        os.chmod(self.parent, 0o755)
        self.umask = os.umask(0o022)  # the usual one, inherited by the head

    def tearDown(self):
        os.umask(self.umask)
        shutil.rmtree(self.parent, ignore_errors=True)

    def mode(self, *parts):
        return stat.S_IMODE(os.stat(os.path.join(*parts)).st_mode)

    def fill(self, head):
        """Writes a blob and a backup; returns the backup's path."""
        r = head.request("PUT", "/v1/shared/sc/blob", raw=b"secret bytes",
                         content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        r = head.request("POST", "/v1/backup", {"name": "b1"})
        self.assertEqual(r.status, 201, r)
        return r.json["path"]

    def check_private(self, data_dir, backup):
        files = ["muster.db", "muster.db-wal", "token"]
        files += [os.path.join("shared", f) for f in os.listdir(os.path.join(data_dir, "shared"))
                  if f != "tmp"]
        self.assertGreater(len(files), 3, "no blob file in shared/")
        for f in files:
            self.assertEqual(self.mode(data_dir, f), 0o600, f)
        for d in ("shared", "shared/tmp", "backups", backup, os.path.join(backup, "shared")):
            self.assertEqual(self.mode(data_dir, d), 0o700, d)
        self.assertEqual(self.mode(backup, "muster.db"), 0o600)
        blobs = os.listdir(os.path.join(backup, "shared"))
        self.assertEqual(len(blobs), 1, blobs)
        self.assertEqual(self.mode(backup, "shared", blobs[0]), 0o600)

    def test_a_new_data_dir_is_private(self):
        data_dir = os.path.join(self.parent, "data")  # the head makes it
        head = harness.Head(data_dir=data_dir)
        head.log_path = os.path.join(self.parent, "head.log")
        try:
            head.start()
            self.assertEqual(self.mode(data_dir), 0o700)
            self.check_private(data_dir, self.fill(head))
        finally:
            head.cleanup()

    def test_files_are_private_in_an_open_data_dir(self):
        data_dir = os.path.join(self.parent, "state")
        os.mkdir(data_dir, 0o755)
        head = harness.Head(data_dir=data_dir)
        try:
            head.start()
            self.check_private(data_dir, self.fill(head))
            self.assertEqual(self.mode(data_dir), 0o755)  # the operator's to choose
        finally:
            head.cleanup()


if __name__ == "__main__":
    unittest.main()
