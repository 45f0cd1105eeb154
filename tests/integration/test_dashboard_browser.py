"""The dashboard in a real browser: headless Chromium driven through chromedriver's W3C
WebDriver HTTP API (standard library only).  Debian's chromium and chromium-driver are
installed here when missing.

A head runs a two-stage pipeline with live `muster worker` processes.  The test checks
that the page shows the login field (and no data) without a token, refuses a wrong one,
renders the queues, workers and leaderboard with the numbers the API gives, refreshes
when more work completes, shows a worker's page and the DistCompute views of a pipeline,
and saves a screenshot: into the build dir always, and into docs/screenshots/ when
MUSTER_UPDATE_DOCS=1 (how docs/dashboard.md's picture is made).
"""
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

READ_TOKEN = "dashboard-read-token"
SRC_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ensure_tool(tool, package):
    """The path of `tool`, installing Debian's `package` first when it is missing."""
    path = shutil.which(tool)
    if path is None:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        subprocess.run(sudo + ["apt-get", "update", "-qq"], env=env, check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                               package], env=env, check=True, stdout=subprocess.DEVNULL)
        path = shutil.which(tool)
    if path is None:
        raise RuntimeError("%s is not available even after installing %s" % (tool, package))
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebDriverError(Exception):
    pass


class Browser:
    """A headless Chromium session through chromedriver (W3C WebDriver over HTTP)."""

    ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

    def __init__(self, width=1280, height=1150):
        chromium = ensure_tool("chromium", "chromium")
        driver = ensure_tool("chromedriver", "chromium-driver")
        self.profile = tempfile.mkdtemp(prefix="muster-chromium-")
        port = free_port()
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


class DashboardBrowserTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--sweep-ms", "50", "--dashboard-token", READ_TOKEN,
                                 "--distcompute", "laion=dc_scrape,dc_filter"]).start()
        cls.workers = []
        cls.browser = None
        try:
            cls.browser = Browser()
        except Exception:
            cls.head.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        for proc in cls.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in cls.workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if cls.browser:
            cls.browser.quit()
        cls.head.cleanup()

    # ---- helpers ----

    def api(self, method, path, body=None, status=200):
        r = self.head.request(method, path, body)
        self.assertEqual(r.status, status, r)
        return r.json

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

        # Without a token: the login field, and no data at all.
        b.get(self.head.url + "/")
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
        self.save_screenshot("dashboard.png")

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
