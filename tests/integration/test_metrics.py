"""GET /metrics (docs/api.md "Metrics"): valid for `promtool check metrics` (Debian's
prometheus package, installed here when missing), exact values after a known workload,
nothing counted for a batch that was refused, and who may read it.
Also GET /v1/throughput, the per-second completion series the dashboard draws.
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

READ_TOKEN = "read-only-token-42"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


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


def parse(text):
    """{(name, ((label, value), ...)): float} of every sample in the exposition."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


class MetricsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.promtool = ensure_tool("promtool", "prometheus")
        cls.head = harness.Head(["--sweep-ms", "50", "--dashboard-token", READ_TOKEN]).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def req(self, method, path, body=None, status=200, token="default"):
        r = self.head.request(method, path, body, token=token)
        self.assertEqual(r.status, status, r)
        return r

    def scrape(self, token=READ_TOKEN):
        r = self.req("GET", "/metrics", token=token)
        self.assertEqual(r.headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
        return r.raw.decode()

    def promtool_check(self, text):
        out = subprocess.run([self.promtool, "check", "metrics"], input=text, text=True,
                             capture_output=True, timeout=60)
        self.assertEqual((out.returncode, out.stdout + out.stderr), (0, ""))

    def test_empty_head_is_valid(self):
        self.promtool_check(self.scrape())

    def test_known_workload(self):
        q = "metrics-q"
        self.req("PUT", "/v1/queues/" + q, {"lease_ms": 200, "backoff_ms": 0,
                                             "backoff_max_ms": 0}, status=201)
        self.req("POST", "/v1/queues/%s/tasks" % q,
                 {"tasks": [{"payload": i} for i in range(5)]}, status=201)
        worker = self.req("POST", "/v1/workers", {"nickname": "m"}, status=201).json["id"]
        leases = self.req("POST", "/v1/queues/%s/lease" % q,
                          {"worker": worker, "max": 4}).json["leases"]
        l1, l2, l3, l4 = ({"task": x["task"], "token": x["token"]} for x in leases)
        self.req("POST", "/v1/leases/complete", {"leases": [l1, l2]})
        self.req("POST", "/v1/leases/fail", {"leases": [dict(l3, error="boom")]})
        self.req("POST", "/v1/leases/flag", {"leases": [l4]})
        # Refused as a whole (l1 is done): the valid element must not count either.
        [l5] = self.req("POST", "/v1/queues/%s/lease" % q, {"worker": worker}).json["leases"]
        l5 = {"task": l5["task"], "token": l5["token"]}
        self.req("POST", "/v1/leases/complete", {"leases": [l5, l1]}, status=409)
        # l5 is left to expire.
        harness.wait_until(
            lambda: value(parse(self.scrape()), "muster_leases_expired_total", queue=q) == 1,
            what="the lease to expire")
        text = self.scrape()
        self.promtool_check(text)
        s = parse(text)
        counters = {"leases_granted": 5, "tasks_completed": 2, "tasks_failed": 1,
                    "tasks_retried": 2, "tasks_dead": 0, "leases_expired": 1,
                    "tasks_flagged": 1}
        for name, want in counters.items():
            self.assertEqual(value(s, "muster_%s_total" % name, queue=q), want, name)
        gauges = {"queued": 3, "leased": 0, "done": 2, "failed": 0, "dead": 0, "cancelled": 0}
        for state, want in gauges.items():
            self.assertEqual(value(s, "muster_tasks", queue=q, state=state), want, state)
        self.assertGreaterEqual(value(s, "muster_workers", state="active"), 1)
        self.assertGreaterEqual(value(s, "muster_queues"), 1)
        route = {"method": "POST", "route": "/v1/leases/complete"}
        self.assertEqual(value(s, "muster_http_requests_total", code="200", **route), 1)
        self.assertEqual(value(s, "muster_http_requests_total", code="409", **route), 1)
        self.assertEqual(value(s, "muster_http_request_duration_seconds_count", **route), 2)
        self.assertEqual(value(s, "muster_http_request_duration_seconds_bucket", le="+Inf",
                               **route), 2)
        self.assertGreater(value(s, "muster_store_commit_duration_seconds_count"), 0)
        self.assertGreater(value(s, "muster_store_commit_requests_sum"), 0)
        self.assertEqual(value(s, "muster_build_info", version="0.1.0"), 1)
        # The throughput series has the two completions of this test's queue.
        tp = self.req("GET", "/v1/throughput?seconds=60", token=READ_TOKEN).json
        self.assertEqual((tp["bucket_ms"], tp["seconds"], len(tp["queues"][q])), (1000, 60, 60))
        self.assertEqual(sum(tp["queues"][q]), 2)
        self.assertGreaterEqual(sum(tp["total"]), 2)

    def test_unmatched_paths_are_counted(self):
        self.req("GET", "/no/such/path", status=404)
        s = parse(self.scrape())
        self.assertGreaterEqual(value(s, "muster_http_requests_total", method="any",
                                      route="unmatched", code="404"), 1)

    def test_who_may_read(self):
        r = self.req("GET", "/metrics", token=None, status=401)
        self.assertEqual(r.error_code, "unauthorized")
        self.req("GET", "/metrics", token="wrong-token-123", status=401)
        self.scrape(token=self.head.token)
        self.scrape(token=READ_TOKEN)
        # The read-only token reads the API and never writes.
        self.req("GET", "/v1/queues", token=READ_TOKEN)
        r = self.req("PUT", "/v1/queues/ro", {}, token=READ_TOKEN, status=403)
        self.assertEqual(r.error_code, "forbidden")
        self.req("GET", "/v1/throughput", token=None, status=401)
        self.req("GET", "/v1/throughput?seconds=0", token=READ_TOKEN, status=400)
        self.req("GET", "/v1/throughput?seconds=601", token=READ_TOKEN, status=400)

    def test_metrics_public(self):
        with harness.Head(["--metrics-public"]) as head:
            r = head.request("GET", "/metrics", token=None)
            self.assertEqual(r.status, 200, r)
            self.promtool_check(r.raw.decode())
            # Only /metrics: the API still needs a token.
            self.assertEqual(head.request("GET", "/v1/queues", token=None).status, 401)


if __name__ == "__main__":
    unittest.main(verbosity=2)
