"""The dashboard in a real browser: headless Chromium driven through chromedriver's W3C
WebDriver HTTP API (standard library only).  Debian's chromium and chromium-driver are
installed here when missing.

A head runs a two-stage pipeline with live `muster worker` processes.  The test checks
that the page shows the login field (and no data) without a token, refuses a wrong one,
renders the queues, workers and leaderboard with the numbers the API gives, refreshes
when more work completes, shows a worker's page and the DistCompute views of a pipeline.
Then a node agent joins (with two GPUs of a fake nvidia-smi and a worker per GPU), two
sessions and an iteration with three ranks are made, and the page must show the node
(GPUs, CPUs, its workers, and its own page), the sessions' counts, the iteration's
blocks and each rank's health and throughput, and shared data (or, on a head that
does not serve it yet, say so).  Screenshots go into the build dir always, and into
docs/screenshots/ when MUSTER_UPDATE_DOCS=1 (how docs/dashboard.md's pictures are made).
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

READ_TOKEN = "dashboard-read-token"
SRC_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# A fake nvidia-smi with two GPUs, as in test_node.py.
FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,uuid,name,memory.total,memory.free*)
    echo "0, GPU-aaaa0000-0000-0000-0000-000000000000, Fake GPU Alpha, 16160, 15000"
    echo "1, GPU-bbbb0000-0000-0000-0000-000000000000, Fake GPU Beta, 8080, 7000" ;;
  -L)
    echo "GPU 0: Fake GPU Alpha (UUID: GPU-aaaa)"
    echo "GPU 1: Fake GPU Beta (UUID: GPU-bbbb)" ;;
  *) exit 1 ;;
esac
"""



class WebDriverError(Exception):
    pass


class Browser:
    """A headless Chromium session through chromedriver (W3C WebDriver over HTTP)."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, width=1280, height=1150):
        chromium = harness.ensure_tool("chromium", "chromium")
        driver = harness.ensure_tool("chromedriver", "chromium-driver")
        self.profile = tempfile.mkdtemp(prefix="muster-chromium-")
        port = harness.free_port()
        self.base = "http://127.0.0.1:%d" % port
        self.log = open(os.path.join(self.profile, "chromedriver.log"), "wb")
        self.proc = subprocess.Popen([driver, "--port=%d" % port], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        harness.wait_until(self._ready, timeout=30, what="chromedriver to listen")
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--user-data-dir=" + os.path.join(self.profile, "user-data"),
                "--window-size=%d,%d" % (width, height)]
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}}}}
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _ready(self):
        try:
            with urllib.request.urlopen(self.base + "/status", timeout=2) as r:
                return json.load(r)["value"]["ready"]
        except (OSError, ValueError, KeyError):
            return False

    def _call(self, method, path, body=None):
        data = json.dumps(body if body is not None else {}).encode() if method == "POST" else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.load(r)["value"]
        except urllib.error.HTTPError as e:
            raise WebDriverError("%s %s: %s" % (method, path, e.read().decode()[:500])) from None

    def _s(self, path):
        return "/session/%s%s" % (self.session, path)

    def get(self, url):
        self._call("POST", self._s("/url"), {"url": url})

    def js(self, script, *args):
        return self._call("POST", self._s("/execute/sync"), {"script": script, "args": list(args)})

    def find(self, css):
        return self._call("POST", self._s("/element"),
                          {"using": "css selector", "value": css})[self.ELEMENT]

    def click(self, css):
        self._call("POST", self._s("/element/%s/click" % self.find(css)))

    def type(self, css, text):
        self._call("POST", self._s("/element/%s/value" % self.find(css)), {"text": text})

    def text(self, css):
        """The text of the first element matching `css`, or None when there is none."""
        return self.js("const e = document.querySelector(arguments[0]);"
                       "return e ? e.textContent : null;", css)

    def visible(self, css):
        return self.js("const e = document.querySelector(arguments[0]);"
                       "return !!e && !e.closest('[hidden]');", css)

    def screenshot(self, path):
        png = base64.b64decode(self._call("GET", self._s("/screenshot")))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(png)
        return png

    def quit(self):
        try:
            self._call("DELETE", self._s(""))
        except (WebDriverError, OSError):
            pass
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


class DashboardCase(unittest.TestCase):
    """A head started with HEAD_ARGS and a read token, and one browser, for a class of
    dashboard tests; `api` calls the head with the admin token, `open` a page with the
    read token."""

    READ_TOKEN = "dashboard-read-token"
    HEAD_ARGS = []

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--dashboard-token", cls.READ_TOKEN] + cls.HEAD_ARGS).start()
        cls.browser = None
        try:
            cls.browser = Browser()
        except Exception:
            cls.head.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.browser:
            cls.browser.quit()
        cls.head.cleanup()

    def api(self, method, path, body=None, status=200):
        r = self.head.request(method, path, body)
        self.assertEqual(r.status, status, r)
        return r.json

    def open(self, path):
        """Opens `path` logged in with the read token, after its first refresh."""
        b = self.browser
        b.get(self.head.url + "/dashboard/style.css")
        b.js("localStorage.setItem('muster.token', arguments[0]);", self.READ_TOKEN)
        b.get(self.head.url + path)
        harness.wait_until(lambda: b.js("return document.body.dataset.refreshes || null;"),
                           what="the page's first refresh of " + path)


class DashboardBrowserTest(DashboardCase):
    READ_TOKEN = READ_TOKEN
    HEAD_ARGS = ["--sweep-ms", "50", "--distcompute", "laion=dc_scrape,dc_filter"]

    @classmethod
    def setUpClass(cls):
        cls.workers = []
        cls.agents = []
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        for agent in cls.agents:
            try:
                agent.stop()
            except RuntimeError:
                agent.kill()
        for proc in cls.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in cls.workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        super().tearDownClass()

    # ---- helpers ----

    def start_worker(self, queue, nickname, *cmd):
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        log = open(os.path.join(self.head.data_dir, "worker-%s.log" % nickname), "ab")
        proc = subprocess.Popen([harness.MUSTER_BIN, "worker", "--queue", queue, "--nickname",
                                 nickname, "--"] + list(cmd), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        self.workers.append(proc)

    def put(self, queue, payloads):
        self.api("POST", "/v1/queues/%s/tasks" % queue,
                 {"tasks": [{"payload": p} for p in payloads]}, status=201)

    def counts(self, queue):
        return self.api("GET", "/v1/queues/" + queue)["counts"]

    def dom_int(self, css):
        text = self.browser.text(css)
        return None if text is None else int(text.replace(",", ""))

    def wait_dom(self, css, want, what, timeout=20):
        harness.wait_until(lambda: self.browser.text(css) == want, timeout=timeout,
                           interval=0.1, what="%s (%s shows %r, want %r)" % (
                               what, css, self.browser.text(css), want))

    def login(self, token):
        b = self.browser
        harness.wait_until(lambda: b.visible("#token"), what="the login field")
        b.type("#token", token)
        b.click("#login-button")

    def save_screenshot(self, name):
        build = os.environ.get("MUSTER_BUILD_DIR") or tempfile.gettempdir()
        png = self.browser.screenshot(os.path.join(build, "screenshots", name))
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        if os.environ.get("MUSTER_UPDATE_DOCS") == "1":
            self.browser.screenshot(os.path.join(SRC_DIR, "docs", "screenshots", name))

    # ---- the test: one story, in order ----

    def test_dashboard(self):
        b = self.browser
        self.api("PUT", "/v1/queues/upload", {}, status=201)
        self.api("PUT", "/v1/queues/resize", {"next": "upload"}, status=201)
        self.start_worker("resize", "alice", "tr", "a-z", "A-Z")
        self.start_worker("resize", "bob", "tr", "a-z", "A-Z")
        self.start_worker("upload", "carol", "rev")
        self.put("resize", ["image-%02d.jpg" % i for i in range(6)])
        harness.wait_until(lambda: self.counts("upload")["done"] == 6, timeout=60,
                           what="the first six tasks through both stages")

        # Without a token: the login field, and no data at all.  (?shared=models: the
        # global scope whose shared data the page lists; sessions are listed anyway.)
        b.get(self.head.url + "/?shared=models")
        harness.wait_until(lambda: b.visible("#login"), what="the login field")
        self.assertFalse(b.visible("#app"))
        self.assertIsNone(b.text("#queues-table"))
        self.assertNotIn("resize", b.js("return document.body.innerText;"))

        # A wrong token is refused and the login field stays.
        self.login("not-the-token")
        harness.wait_until(lambda: b.visible("#login-error"), what="the refusal")
        self.assertIn("refused", b.text("#login-error"))
        self.assertFalse(b.visible("#app"))

        # The read-only token shows the dashboard.
        self.login(READ_TOKEN)
        harness.wait_until(lambda: b.visible("#queues-table"), what="the queues table")
        for queue in ("resize", "upload"):
            counts = self.counts(queue)
            for field in ("queued", "leased", "done", "failed", "dead"):
                self.wait_dom('#queues-table tr[data-queue="%s"] td[data-field="%s"]' %
                              (queue, field), str(counts[field]), queue + " " + field)
        workers = [w for w in self.api("GET", "/v1/workers")["workers"] if w["state"] == "active"]
        self.assertEqual(sorted(w["nickname"] for w in workers), ["alice", "bob", "carol"])
        for w in workers:
            row = '#workers-table tr[data-worker="%s"]' % w["name"]
            self.assertEqual(b.text(row + ' td[data-field="nickname"]'), w["nickname"])
            self.wait_dom(row + ' td[data-field="completed"]', str(
                self.api("GET", "/v1/workers/%d" % w["id"])["completed"]), w["name"])
        board = self.api("GET", "/v1/leaderboard")["leaderboard"]
        self.assertEqual(sum(e["completed"] for e in board), 12)
        for e in board:
            self.wait_dom('#leaderboard-table tr[data-nickname="%s"] td[data-field="completed"]'
                          % e["nickname"], str(e["completed"]), "leaderboard " + e["nickname"])
        self.assertEqual(b.text('#leaderboard-table tr[data-nickname="carol"] td[data-field="completed"]'), "6")
        self.assertTrue(b.js("return !!document.querySelector('canvas#chart');"))

        # More work completes: the page follows without a reload.
        self.put("resize", ["image-%02d.jpg" % i for i in range(6, 10)])
        self.wait_dom('#queues-table tr[data-queue="upload"] td[data-field="done"]', "10",
                      "the page to refresh", timeout=60)
        self.wait_dom('#leaderboard-table tr[data-nickname="carol"] td[data-field="completed"]',
                      "10", "carol's total")
        harness.wait_until(lambda: b.text('#queues-table tr[data-queue="upload"] td[data-field="eta"]') == "done",
                           what="the ETA to say done")
        rate = float(b.text('#queues-table tr[data-queue="upload"] td[data-field="rate"]'))
        self.assertGreater(rate, 0)

        self.check_cluster()
        b.js("window.scrollTo(0, 0);")
        self.save_screenshot("dashboard.png")
        b.js("document.getElementById('nodes').scrollIntoView();")
        self.save_screenshot("dashboard-cluster.png")
        b.js("window.scrollTo(0, 0);")
        self.check_node_page()

        # A worker's page.
        carol = [w for w in workers if w["nickname"] == "carol"][0]
        b.click('#workers-table tr[data-worker="%s"] a' % carol["name"])
        harness.wait_until(lambda: b.visible("#worker-fields"), what="the worker page")
        self.wait_dom('#worker-fields dd[data-field="nickname"]', "carol", "the worker's nickname")
        self.wait_dom('#worker-fields dd[data-field="completed"]', "10", "the worker's count")
        self.assertEqual(b.text('#worker-fields dd[data-field="queues"]'), "upload")
        self.save_screenshot("dashboard-worker.png")
        b.click("#back")
        harness.wait_until(lambda: b.visible("#queues-table"), what="back to the dashboard")

        self.check_distcompute_views()

        # Logging out forgets the token, also across a reload.
        b.get(self.head.url + "/")
        harness.wait_until(lambda: b.visible("#logout"), what="the logout button")
        b.click("#logout")
        harness.wait_until(lambda: b.visible("#login"), what="the login field again")
        b.get(self.head.url + "/")
        harness.wait_until(lambda: b.visible("#login"), what="the login field after a reload")
        self.assertFalse(b.visible("#app"))

    # ---- nodes, sessions, iterations, shared data ----

    def check_cluster(self):
        b = self.browser
        self.start_cluster()
        # The node: address, state, GPUs with memory, CPUs, its active workers.
        node = self.api("GET", "/v1/nodes/gpu-box-1")
        row = '#nodes-table tr[data-node="gpu-box-1"]'
        self.wait_dom(row + ' td[data-field="workers"]', "2", "the node's workers")
        self.assertEqual(node["address"], self.agent.url[len("http://"):])
        self.assertEqual(b.text(row + ' td[data-field="address"]'), node["address"])
        self.assertEqual(b.text(row + ' td[data-field="state"]'), "active")
        self.assertEqual(b.text(row + ' td[data-field="cpus"]'), "{:,}".format(node["cpus"]))
        gpus = b.js("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);",
                    row + ' td[data-field="gpus"] .gpu')
        self.assertEqual(gpus, ["GPU 0 Fake GPU Alpha · 15.8 GiB (14.6 GiB free)",
                                "GPU 1 Fake GPU Beta · 7.9 GiB (6.8 GiB free)"])
        names = sorted(w["name"] for w in self.api("GET", "/v1/workers")["workers"]
                       if w["node"] == "gpu-box-1" and w["state"] == "active")
        self.assertEqual(len(names), 2)
        self.assertEqual(sorted(b.js(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);",
            row + ' td[data-field="worker-names"] a')), names)
        self.assertIn("1 active, 0 gone", b.text("#nodes-summary"))

        # Sessions: counts, progress and cleanup_on_exit.
        for sid, want in self.sessions.items():
            row = '#sessions-table tr[data-session="%s"]' % sid
            s = self.api("GET", "/v1/sessions/" + sid)
            self.assertEqual({k: s["counts"][k] for k in want["counts"]}, want["counts"])
            for field in ("done", "failed", "total"):
                self.wait_dom(row + ' td[data-field="%s"]' % field, str(s["counts"][field]),
                              "session " + field)
            self.assertEqual(b.text(row + ' td[data-field="queue"]'), "pool")
            self.assertEqual(b.text(row + ' td[data-field="percent"]'), want["percent"])
            self.assertEqual(b.text(row + ' td[data-field="cleanup"]'), want["cleanup"])
            self.assertEqual(b.text(row + ' td[data-field="sealed"]'), want["sealed"])

        # The iteration: epoch, blocks, and each rank's health and throughput.
        it = self.api("GET", "/v1/iterations/train")
        self.assertEqual(it["blocks"], {"total": 10, "done": 3, "leased": 3, "pending": 0})
        row = '#iterations-table tr[data-iteration="train"]'
        self.wait_dom(row + ' [data-field="done"]', "3", "the iteration's blocks done")
        self.assertEqual(b.text(row + ' [data-field="total"]'), "10")
        self.assertEqual(b.text(row + ' td[data-field="leased"]'), "3")
        self.assertEqual(b.text(row + ' [data-field="epoch"]'), "0")
        self.assertEqual(b.text(row + ' td[data-field="strategy"]'), "dynamic")
        self.assertEqual(b.text(row + ' [data-health="active"]'), "2 active")
        self.assertEqual(b.text(row + ' [data-health="unknown"]'), "1 unknown")
        for r in it["ranks"]:
            rank = '.ranks-table[data-iteration="train"] tr[data-rank="%d"]' % r["rank"]
            self.assertEqual(b.text(rank + ' [data-field="health"]'), r["health"])
            for field in ("samples", "blocks", "leases", "expired"):
                self.assertEqual(b.text(rank + ' td[data-field="%s"]' % field), str(r[field]))
            shown = float(b.text(rank + ' td[data-field="throughput"]').replace(",", ""))
            self.assertAlmostEqual(shown, r["throughput"], delta=0.051 if shown < 100 else 0.51)
        self.assertEqual([r["health"] for r in it["ranks"]], ["active", "active", "unknown"])

        # Shared data, or a note that this head does not serve it.
        if self.shared is None:
            harness.wait_until(lambda: b.visible("#shared-unavailable"), what="the shared note")
        else:
            for (scope, name), (level, levels, size) in self.shared.items():
                row = '#shared-table tr[data-scope="%s"][data-blob="%s"]' % (scope, name)
                self.wait_dom(row + ' td[data-field="level"]', str(level), "blob " + name)
                self.assertEqual(b.text(row + ' td[data-field="levels"]'), levels)
                self.assertEqual(b.text(row + ' td[data-field="size"]'), size)
                self.assertRegex(b.text(row + ' td[data-field="expires"]'), r"^in \d")

    def start_cluster(self):
        """A node agent with two fake GPUs, two sessions, an iteration, shared data."""
        self.api("PUT", "/v1/queues/gpu-jobs", {}, status=201)
        bin_dir = os.path.join(self.head.data_dir, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        with open(os.path.join(bin_dir, "nvidia-smi"), "w") as f:
            f.write(FAKE_SMI)
        os.chmod(os.path.join(bin_dir, "nvidia-smi"), 0o755)
        self.agent = node_harness.Agent(
            self.head, self.head.data_dir, "gpu-box-1", args=["--queue", "gpu-jobs"],
            cmd=["rev"], env={"PATH": bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin")})
        self.agents.append(self.agent)
        self.agent.start()
        def registered():  # the agent listens before it has registered
            r = self.head.request("GET", "/v1/nodes/gpu-box-1")
            return r.status == 200 and r.json["workers"] == 2
        harness.wait_until(registered, timeout=30,
                           what=lambda: "the agent's two workers:\n" + self.agent.log())

        # Two sessions on a queue without workers: one with 2 done and 1 failed of 5.
        self.api("PUT", "/v1/queues/pool", {}, status=201)
        kept = self.api("POST", "/v1/sessions", {"queue": "pool", "cleanup_on_exit": False},
                        status=201)["id"]
        idle = self.api("POST", "/v1/sessions", {"queue": "pool", "timeout_ms": 600000},
                        status=201)["id"]
        self.api("POST", "/v1/sessions/%s/tasks" % kept,
                 {"tasks": [{"payload": "job-%d" % i} for i in range(5)]}, status=201)
        client = self.api("POST", "/v1/workers", {"nickname": "pool-client"}, status=201)["id"]
        leases = self.api("POST", "/v1/queues/pool/lease", {"worker": client, "max": 3})["leases"]
        l1, l2, l3 = ({"task": x["task"], "token": x["token"]} for x in leases)
        self.api("POST", "/v1/leases/complete", {"leases": [l1, l2]})
        self.api("POST", "/v1/leases/fail", {"leases": [dict(l3, error="bad input",
                                                                 permanent=True)]})
        self.api("DELETE", "/v1/workers/%d" % client)
        self.api("POST", "/v1/sessions/%s/seal" % kept, {})   # no more tasks will come
        self.sessions = {
            kept: {"counts": {"total": 5, "done": 2, "failed": 1}, "percent": "60%",
                   "cleanup": "no", "sealed": "sealed"},
            idle: {"counts": {"total": 0, "done": 0, "failed": 0}, "percent": "—",
                   "cleanup": "yes", "sealed": ""},
        }

        # An iteration of 100 samples in blocks of 10 over 3 ranks: rank 0 acknowledges
        # 3 blocks and holds 1, rank 1 holds 2, rank 2 never shows up.
        self.api("POST", "/v1/iterations", {
            "name": "train", "dataset": {"num_samples": 100}, "strategy": "dynamic",
            "world_size": 3, "block_size": 10, "epochs": 2, "lease_ms": 600000,
            "rank_timeout_ms": 600000}, status=201)
        blocks = self.api("POST", "/v1/iterations/train/next", {"rank": 0, "max": 3})["blocks"]
        self.api("POST", "/v1/iterations/train/ack", {"rank": 0, "blocks": [
            {"block": x["block"], "token": x["token"]} for x in blocks]})
        self.api("POST", "/v1/iterations/train/next", {"rank": 0, "max": 1})
        self.api("POST", "/v1/iterations/train/next", {"rank": 1, "max": 2})

        # Shared data, when this head serves it: two levels of a global blob and one
        # blob in the kept session's scope.
        probe = self.head.request("GET", "/v1/shared/models")
        if probe.status == 404 and probe.error_code == "not_found":
            self.shared = None
            return

        def put_blob(scope, name, level, size):
            r = self.head.request("PUT", "/v1/shared/%s/%s?level=%d" % (scope, name, level),
                                  raw=b"x" * size, content_type="application/octet-stream")
            self.assertEqual(r.status, 201, r)

        put_blob("models", "weights", 1, 1000)
        put_blob("models", "weights", 2, 3 * 1024 * 1024)
        put_blob(kept, "params", 1, 512)
        # Scope "tables" is not in the URL: the page finds it in the `requires` of a
        # task that a worker holds.
        put_blob("tables", "vocab", 1, 2048)
        self.api("POST", "/v1/queues/pool/tasks", {"tasks": [{
            "payload": "needs-vocab", "priority": 9,
            "requires": [{"scope": "tables", "name": "vocab", "level": 1}]}]}, status=201)
        holder = self.api("POST", "/v1/workers", {"nickname": "holder"}, status=201)["id"]
        [lease] = self.api("POST", "/v1/queues/pool/lease", {"worker": holder})["leases"]
        self.assertEqual(lease["payload"], "needs-vocab")
        self.shared = {("models", "weights"): (2, "1, 2", "3.0 MiB"),
                       (kept, "params"): (1, "1", "512 B"),
                       ("tables", "vocab"): (1, "1", "2.0 KiB")}

    def check_node_page(self):
        b = self.browser
        b.click('#nodes-table tr[data-node="gpu-box-1"] td a')
        harness.wait_until(lambda: b.visible("#node-fields"), what="the node page")
        self.wait_dom('#node-fields dd[data-field="workers"]', "2", "the node page's workers")
        self.assertEqual(b.text('#node-fields dd[data-field="state"]'), "active")
        self.assertEqual(b.js("return document.querySelectorAll('#node-gpus tbody tr').length;"), 2)
        self.assertEqual(b.text('#node-gpus tr[data-gpu="1"] td[data-field="memory"]'), "7.9 GiB")
        rows = b.js("return [...document.querySelectorAll('#node-workers-table tbody tr')]"
                    ".map(r => r.dataset.worker);")
        self.assertEqual(len(rows), 2)
        self.assertFalse(b.visible("#queues-table"))
        self.save_screenshot("dashboard-node.png")
        b.click("#back")
        harness.wait_until(lambda: b.visible("#nodes-table"), what="back to the dashboard")

    def check_distcompute_views(self):
        b = self.browser
        base = self.head.url + "/compat/distcompute/laion"
        with urllib.request.urlopen(base + "/api/new?nickname=LAION&stage=a") as r:
            worker = json.load(r)
        self.put("dc_scrape", ["shard-1", "shard-2"])

        def post(endpoint, body):
            req = urllib.request.Request(base + endpoint, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req) as r:
                return r.read().decode()

        post("/api/newJob", {"token": worker["token"]})
        post("/api/updateProgress", {"token": worker["token"], "progress": "37 / 100 (37%)"})
        # The pipeline's page: its stages only, in order.
        b.get(base + "/")
        harness.wait_until(lambda: b.visible("#queues-table"), what="the pipeline page")
        rows = b.js("return [...document.querySelectorAll('#queues-table tbody tr')]"
                    ".map(r => r.dataset.queue);")
        self.assertEqual(rows, ["dc_scrape", "dc_filter"])
        self.wait_dom('#queues-table tr[data-queue="dc_scrape"] td[data-field="leased"]', "1",
                      "the held job")
        self.assertIn("laion", b.text("#scope"))
        row = '#workers-table tr[data-worker="%s"]' % worker["display_name"]
        self.wait_dom(row + ' td[data-field="progress"]', "37 / 100 (37%)", "its progress")
        self.assertEqual(b.js("return document.querySelectorAll('#workers-table tbody tr[data-worker]').length;"), 1)
        # Its leaderboard and its worker page, at the client's own URLs.
        b.get(base + "/leaderboard")
        harness.wait_until(lambda: b.visible("#leaderboard-table"), what="the leaderboard page")
        self.assertIsNotNone(b.text('#leaderboard-table tr[data-nickname="LAION"]'))
        self.assertIsNone(b.text('#leaderboard-table tr[data-nickname="carol"]'))
        self.assertFalse(b.visible("#queues-table"))
        b.get(base + "/worker/dc_scrape/" + urllib.parse.quote(worker["display_name"]))
        harness.wait_until(lambda: b.visible("#worker-fields"), what="the DistCompute worker page")
        self.wait_dom('#worker-fields dd[data-field="progress"]', "37 / 100 (37%)",
                      "the worker page's progress")
        self.assertIn("shard-1", b.text("#worker pre"))
        self.save_screenshot("dashboard-distcompute.png")


if __name__ == "__main__":
    unittest.main(verbosity=2)
