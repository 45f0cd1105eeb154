"""The dashboard's server side without a browser (docs/dashboard.md, docs/api.md): the
embedded files are served without a token and with a strict Content-Security-Policy, the
page holds no data, the read-only token reads every GET of the API and changes nothing,
the DistCompute pages exist only for exposed pipelines, and `muster head` checks its
dashboard options.  Also `muster put --file` and `--json FILE`, which seed such a head.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

READ_TOKEN = "read-only-token-77"
WEB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "web")


class DashboardApiTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--dashboard-token", READ_TOKEN,
                                 "--distcompute", "proj=pa,pb"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def get(self, path, token=None, method="GET"):
        return self.head.request(method, path, token=token)

    def test_page_and_files_need_no_token(self):
        r = self.get("/")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers["Content-Type"], "text/html; charset=utf-8")
        csp = r.headers["Content-Security-Policy"]
        for rule in ("default-src 'none'", "script-src 'self'", "connect-src 'self'",
                     "frame-ancestors 'none'"):
            self.assertIn(rule, csp)
        self.assertEqual(r.headers["X-Content-Type-Options"], "nosniff")
        page = r.raw.decode()
        self.assertIn('<script src="/dashboard/common.js"', page)
        self.assertIn('id="login"', page)
        self.assertNotIn("<script>", page)  # no inline code: the CSP forbids it
        for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"),
                           ("index.html", "text/html")):
            r = self.get("/dashboard/" + name)
            self.assertEqual(r.status, 200, r)
            self.assertTrue(r.headers["Content-Type"].startswith(kind), r.headers)
        self.assertEqual(self.get("/dashboard/nope.js").status, 404)
        self.assertEqual(self.get("/dashboard/../token").status, 404)
        head = self.get("/", method="HEAD")
        self.assertEqual((head.status, head.raw), (200, b""))

    def test_page_loads_every_script_of_web(self):
        # The page's scripts are plain files that share one global: index.html must
        # name every web/*.js (a file left out would be dead code, or break a later
        # file that uses it), common.js first and app.js, which starts the page, last;
        # and the head must serve each one, embedded, as JavaScript (with nosniff, a
        # script of another type would not run).
        page = self.get("/").raw.decode()
        named = re.findall(r'<script src="/dashboard/([^"]+)" defer></script>', page)
        self.assertEqual(len(re.findall(r"<script", page)), len(named), page)
        on_disk = sorted(f for f in os.listdir(WEB_DIR) if f.endswith(".js"))
        self.assertEqual(sorted(named), on_disk)
        self.assertEqual((named[0], named[-1]), ("common.js", "app.js"), named)
        for name in named:
            r = self.get("/dashboard/" + name)
            self.assertEqual(r.status, 200, (name, r))
            self.assertEqual(r.headers["Content-Type"], "text/javascript; charset=utf-8", name)
            self.assertEqual(r.headers["X-Content-Type-Options"], "nosniff", name)
            with open(os.path.join(WEB_DIR, name), "rb") as f:
                self.assertEqual(r.raw, f.read(), name)

    def test_page_holds_no_data(self):
        self.head.request("PUT", "/v1/queues/secret-queue-name", {})
        for path in ("/", "/dashboard/app.js", "/dashboard/common.js",
                     "/compat/distcompute/proj/"):
            self.assertNotIn(b"secret-queue-name", self.get(path).raw)

    def test_read_only_token(self):
        for path in ("/v1/queues", "/v1/workers", "/v1/leaderboard", "/v1/throughput",
                     "/v1/distcompute", "/v1/queues/pa", "/v1/queues/pa/tasks", "/metrics"):
            r = self.get(path, token=READ_TOKEN)
            self.assertEqual(r.status, 200, (path, r))
            self.assertEqual(self.get(path).status, 401, path)
        writes = (("PUT", "/v1/queues/ro", {}), ("DELETE", "/v1/queues/pa", None),
                  ("POST", "/v1/queues/pa/tasks", {"tasks": [{"payload": 1}]}),
                  ("POST", "/v1/queues/pa/lease", {}), ("POST", "/v1/workers", {}),
                  ("POST", "/v1/leases/complete", {"leases": [{"task": 1, "token": 1}]}))
        for method, path, body in writes:
            r = self.head.request(method, path, body, token=READ_TOKEN)
            self.assertEqual((r.status, r.error_code), (403, "forbidden"), (method, path, r))
            self.assertIn("read-only", r.json["error"]["message"])
        self.assertEqual(self.head.request("GET", "/v1/queues/ro").status, 404)
        self.assertEqual(self.head.request("GET", "/v1/queues/pa").json["counts"]["queued"], 0)
        # The admin token still does everything.
        self.assertEqual(self.head.request("PUT", "/v1/queues/admin-made", {}).status, 201)

    def test_distcompute_pages(self):
        for path in ("/compat/distcompute/proj", "/compat/distcompute/proj/",
                     "/compat/distcompute/proj/leaderboard",
                     "/compat/distcompute/proj/worker/pa/brisk-otter-1"):
            r = self.get(path)
            self.assertEqual(r.status, 200, (path, r))
            self.assertIn(b'id="login"', r.raw)
        for path in ("/compat/distcompute/other/", "/compat/distcompute/other/leaderboard",
                     "/compat/distcompute/proj/nothing-here"):
            self.assertEqual(self.get(path).status, 404, path)
        # The head created the pipeline's queues, chained.
        self.assertEqual(self.head.request("GET", "/v1/queues/pa").json["next"], "pb")

    def test_brief_listing_leaves_out_payloads(self):
        # The dashboard lists the leased tasks of every busy queue at each refresh; it
        # wants their ids and holders, not payloads that may be a megabyte each.
        self.assertEqual(self.head.request("PUT", "/v1/queues/briefq", {}).status, 201)
        r = self.head.request("POST", "/v1/queues/briefq/tasks",
                              {"tasks": [{"payload": {"big": "z" * 100000}}, {"payload": "two"}]})
        self.assertEqual(r.status, 201, r)
        r = self.head.request("POST", "/v1/workers", {"nickname": "briefw"})
        worker = r.json["id"]
        r = self.head.request("POST", "/v1/queues/briefq/lease", {"worker": worker, "max": 1})
        lease = r.json["leases"][0]
        r = self.head.request("POST", "/v1/leases/complete", {"leases": [
            {"task": lease["task"], "token": lease["token"], "result": "x" * 50000}]})
        self.assertEqual(r.status, 200, r)
        self.head.request("POST", "/v1/queues/briefq/lease", {"worker": worker, "max": 1})
        full = self.get("/v1/queues/briefq/tasks", token=READ_TOKEN).json["tasks"]
        r = self.get("/v1/queues/briefq/tasks?brief=true", token=READ_TOKEN)
        self.assertEqual(r.status, 200, r)
        self.assertLess(len(r.raw), 2000)
        for task, whole in zip(r.json["tasks"], full):
            self.assertNotIn("payload", task)
            self.assertNotIn("result", task)
            self.assertEqual(task, {k: v for k, v in whole.items() if k not in ("payload", "result")})
        self.assertEqual(r.json["tasks"][1]["lease"]["worker"], worker)
        leased = self.get("/v1/queues/briefq/tasks?state=leased&brief=true", token=READ_TOKEN)
        self.assertEqual([t["id"] for t in leased.json["tasks"]], [full[1]["id"]])
        self.assertEqual(self.get("/v1/queues/briefq/tasks?brief=false", token=READ_TOKEN).json["tasks"], full)
        r = self.get("/v1/queues/briefq/tasks?brief=yes", token=READ_TOKEN)
        self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), r)
        self.assertIn("brief", r.json["error"]["message"])

    def test_head_checks_its_options(self):
        bad = (["--dashboard-token", "short"], ["--dashboard-token", harness.TOKEN],
               ["--distcompute", "nameonly"], ["--distcompute", "p=a,a"],
               ["--distcompute", "p=a,b,c,d,e,f"], ["--distcompute", "p=bad name"],
               ["--distcompute", "p=a,"])
        for args in bad:
            with tempfile.TemporaryDirectory() as tmp:
                out = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                      "--data-dir", tmp, "--token", harness.TOKEN] + args,
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(out.returncode, 2, (args, out.stderr))
                self.assertIn("muster head", out.stderr)

    def test_pipeline_conflicting_with_a_queue_refuses_to_start(self):
        with tempfile.TemporaryDirectory() as tmp:
            with harness.Head([], data_dir=tmp) as head:
                head.request("PUT", "/v1/queues/other", {})
                head.request("PUT", "/v1/queues/sa", {"next": "other"})
                head.request("PUT", "/v1/queues/sb", {})
            out = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                  "--data-dir", tmp, "--distcompute", "p=sa,sb"],
                                 capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertIn("'sa' has next stage 'other', not 'sb'", out.stderr)

    def test_put_file(self):
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        self.head.request("PUT", "/v1/queues/seeded", {})

        def put(*args, stdin=None):
            return subprocess.run([harness.MUSTER_BIN, "put", "--queue", "seeded"] + list(args),
                                  env=env, input=stdin, capture_output=True, text=True,
                                  timeout=60)

        with tempfile.TemporaryDirectory() as tmp:
            lines, array, jsonl = (os.path.join(tmp, n) for n in ("a.txt", "b.json", "c.jsonl"))
            with open(lines, "w") as f:
                f.write("one\n\n two \r\nthree")
            with open(array, "w") as f:
                json.dump([{"n": 1}, "s", [2]], f)
            with open(jsonl, "w") as f:
                f.write('{"n": 3}\n\n[4]\n')
            out = put("--file", lines)
            self.assertEqual((out.returncode, len(out.stdout.split())), (0, 3), out.stderr)
            out = put("--json", array)
            self.assertEqual((out.returncode, len(out.stdout.split())), (0, 3), out.stderr)
            out = put("--json", "--file", jsonl)
            self.assertEqual((out.returncode, len(out.stdout.split())), (0, 2), out.stderr)
            out = put("--file", "-", stdin="from stdin\n")
            self.assertEqual(out.returncode, 0, out.stderr)
            tasks = self.head.request("GET", "/v1/queues/seeded/tasks").json["tasks"]
            self.assertEqual([t["payload"] for t in tasks],
                             ["one", " two ", "three", {"n": 1}, "s", [2], {"n": 3}, [4],
                              "from stdin"])
            # Mistakes store nothing.
            out = put("--file", os.path.join(tmp, "missing.txt"))
            self.assertEqual(out.returncode, 1)
            self.assertIn("cannot open", out.stderr)
            out = put("--file", lines, "extra")
            self.assertEqual(out.returncode, 2)
            with open(jsonl, "w") as f:
                f.write('{"n": 5}\nnot json\n')
            out = put("--json", "--file", jsonl)
            self.assertEqual(out.returncode, 1)
            self.assertIn("line 2", out.stderr)
            out = put("--json", "not-a-file-and-not-json")
            self.assertEqual(out.returncode, 1)
        self.assertEqual(len(self.head.request("GET", "/v1/queues/seeded/tasks").json["tasks"]), 9)


if __name__ == "__main__":
    unittest.main(verbosity=2)
