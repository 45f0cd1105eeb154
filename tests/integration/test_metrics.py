"""GET /metrics (docs/api.md "Metrics"): valid for `promtool check metrics` (Debian's
prometheus package, installed here when missing), exact values after a known workload,
nothing counted for a batch that was refused, and who may read it.  The families of
nodes (with their GPUs and workers), sessions, iterations and shared data after a known
workload of each.  Also GET /v1/throughput, the per-second completion series the
dashboard draws.
"""
import os
import re
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

READ_TOKEN = "read-only-token-42"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')



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
        cls.promtool = harness.ensure_tool("promtool", "prometheus")
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
        # Refused as a whole (l3's lease ended with its fail): the valid element must not
        # count either.
        [l5] = self.req("POST", "/v1/queues/%s/lease" % q, {"worker": worker}).json["leases"]
        l5 = {"task": l5["task"], "token": l5["token"]}
        self.req("POST", "/v1/leases/complete", {"leases": [l5, l3]}, status=409)
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
        # The test heads run --sync full: their writes were flushed on the loop.
        self.assertGreater(value(s, "muster_store_flush_duration_seconds_count", on="loop"), 0)
        self.assertEqual(value(s, "muster_store_flush_failures_total"), 0)
        # SQLite writes a WAL frame in two pieces; a commit's frames reach the file at once.
        self.assertLess(value(s, "muster_store_wal_writes_total", by="file"),
                        value(s, "muster_store_wal_writes_total", by="sqlite") / 2)
        self.assertEqual(value(s, "muster_store_wal_write_failures_total"), 0)
        self.assertEqual(value(s, "muster_build_info", version="0.1.0"), 1)
        # The throughput series has the two completions of this test's queue.
        tp = self.req("GET", "/v1/throughput?seconds=60", token=READ_TOKEN).json
        self.assertEqual((tp["bucket_ms"], tp["seconds"], len(tp["queues"][q])), (1000, 60, 60))
        self.assertEqual(sum(tp["queues"][q]), 2)
        self.assertGreaterEqual(sum(tp["total"]), 2)

    def test_nodes(self):
        gpus = [{"index": 0, "name": "A", "memory_total_mb": 16160, "memory_free_mb": 15000},
                {"index": 1, "name": "B", "memory_total_mb": 8080, "memory_free_mb": 7000}]
        self.req("POST", "/v1/nodes", {"name": "m-gpu", "cpus": 32, "gpus": gpus}, status=201)
        self.req("POST", "/v1/nodes", {"name": "m-cpu", "cpus": 4}, status=201)
        self.req("POST", "/v1/nodes", {"name": "m-left", "cpus": 2}, status=201)
        workers = [self.req("POST", "/v1/workers", {"nickname": "m", "node": "m-gpu"},
                            status=201).json["id"] for _ in range(3)]
        self.req("POST", "/v1/workers", {"nickname": "m", "node": "m-cpu"}, status=201)
        self.req("DELETE", "/v1/workers/%d" % workers[0])
        self.req("DELETE", "/v1/nodes/m-left")
        text = self.scrape()
        self.promtool_check(text)
        s = parse(text)
        nodes = self.req("GET", "/v1/nodes").json["nodes"]
        for state in ("active", "gone"):
            self.assertEqual(value(s, "muster_nodes", state=state),
                             sum(1 for n in nodes if n["state"] == state), state)
        self.assertGreaterEqual(value(s, "muster_nodes", state="gone"), 1)
        want = {"m-gpu": (1, 2, 32, 2), "m-cpu": (1, 1, 4, 0), "m-left": (0, 0, 2, 0)}
        for node, (up, workers_now, cpus, ngpus) in want.items():
            self.assertEqual(value(s, "muster_node_up", node=node), up, node)
            self.assertEqual(value(s, "muster_node_workers", node=node), workers_now, node)
            self.assertEqual(value(s, "muster_node_cpus", node=node), cpus, node)
            self.assertEqual(value(s, "muster_node_gpus", node=node), ngpus, node)
        self.assertEqual(value(s, "muster_node_gpu_memory_bytes", node="m-gpu", gpu="1"),
                         8080 * 1024 * 1024)
        self.assertEqual(value(s, "muster_node_gpu_memory_free_bytes", node="m-gpu", gpu="0"),
                         15000 * 1024 * 1024)
        self.assertIsNone(value(s, "muster_node_gpu_memory_bytes", node="m-cpu", gpu="0"))

    def test_sessions(self):
        q = "metrics-pool"
        self.req("PUT", "/v1/queues/" + q, {}, status=201)
        kept = self.req("POST", "/v1/sessions", {"queue": q, "cleanup_on_exit": False},
                        status=201).json["id"]
        closed = self.req("POST", "/v1/sessions", {"queue": q}, status=201).json["id"]
        self.req("POST", "/v1/sessions/%s/tasks" % kept,
                 {"tasks": [{"payload": i} for i in range(5)]}, status=201)
        self.req("POST", "/v1/sessions/%s/tasks" % closed, {"tasks": [{"payload": 9}]},
                 status=201)
        self.req("DELETE", "/v1/sessions/" + closed)
        worker = self.req("POST", "/v1/workers", {"nickname": "m"}, status=201).json["id"]
        leases = self.req("POST", "/v1/queues/%s/lease" % q,
                          {"worker": worker, "max": 3}).json["leases"]
        l1, l2, l3 = ({"task": x["task"], "token": x["token"]} for x in leases)
        self.req("POST", "/v1/leases/complete", {"leases": [l1, l2]})
        self.req("POST", "/v1/leases/fail", {"leases": [dict(l3, error="no", permanent=True)]})
        text = self.scrape()
        self.promtool_check(text)
        s = parse(text)
        self.assertEqual(value(s, "muster_sessions", queue=q), 1)
        for state, want in {"done": 2, "failed": 1, "pending": 2}.items():
            self.assertEqual(value(s, "muster_session_tasks", queue=q, state=state), want, state)

    def test_iterations(self):
        name = "metrics-train"
        # 100 samples in blocks of 10 for 3 ranks; rank 2 never shows up.
        self.req("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 100}, "strategy": "dynamic",
            "world_size": 3, "block_size": 10, "epochs": 2, "lease_ms": 600000,
            "rank_timeout_ms": 600000}, status=201)
        nxt = "/v1/iterations/%s/next" % name
        blocks = self.req("POST", nxt, {"rank": 0, "max": 3}).json["blocks"]
        self.req("POST", "/v1/iterations/%s/ack" % name, {"rank": 0, "blocks": [
            {"block": b["block"], "token": b["token"]} for b in blocks]})
        self.req("POST", nxt, {"rank": 0, "max": 1})   # held by rank 0
        self.req("POST", nxt, {"rank": 1, "max": 2})   # held by rank 1
        text = self.scrape()
        self.promtool_check(text)
        s = parse(text)
        it = self.req("GET", "/v1/iterations/" + name).json
        self.assertEqual(it["blocks"], {"total": 10, "done": 3, "leased": 3, "pending": 0})
        for state, want in {"done": 3, "leased": 3, "pending": 0}.items():
            self.assertEqual(value(s, "muster_iteration_blocks", iteration=name, state=state),
                             want, state)
        self.assertEqual(value(s, "muster_iteration_epoch_blocks", iteration=name), 10)
        self.assertEqual(value(s, "muster_iteration_epoch", iteration=name), 0)
        self.assertEqual(value(s, "muster_iteration_finished", iteration=name), 0)
        self.assertEqual(value(s, "muster_iteration_blocks_acked_total", iteration=name), 3)
        self.assertEqual(value(s, "muster_iteration_samples_total", iteration=name), 30)
        self.assertEqual(value(s, "muster_iteration_leases_expired_total", iteration=name), 0)
        health = {}
        for r in it["ranks"]:
            health[r["health"]] = health.get(r["health"], 0) + 1
        self.assertEqual(health, {"active": 2, "unknown": 1})
        for h in ("unknown", "active", "slow", "idle", "failed"):
            self.assertEqual(value(s, "muster_iteration_ranks", iteration=name, health=h),
                             health.get(h, 0), h)
        self.assertGreaterEqual(value(s, "muster_iterations"), 1)

    def test_iteration_lease_expires(self):
        name = "metrics-expiring"
        self.req("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 40}, "strategy": "dynamic",
            "world_size": 2, "block_size": 10, "lease_ms": 100,
            "rank_timeout_ms": 600000}, status=201)
        self.req("POST", "/v1/iterations/%s/next" % name, {"rank": 1, "max": 1})
        harness.wait_until(
            lambda: value(parse(self.scrape()), "muster_iteration_leases_expired_total",
                          iteration=name) == 1, what="the block lease to expire")
        s = parse(self.scrape())
        for state, want in {"done": 0, "leased": 0, "pending": 1}.items():
            self.assertEqual(value(s, "muster_iteration_blocks", iteration=name, state=state),
                             want, state)
        self.assertEqual(value(s, "muster_iteration_ranks", iteration=name, health="failed"), 1)
        self.assertEqual(value(s, "muster_iteration_ranks", iteration=name, health="unknown"), 1)
        # Another rank leases the returned block.
        self.req("POST", "/v1/iterations/%s/next" % name, {"rank": 0, "max": 1})
        s = parse(self.scrape())
        self.assertEqual(value(s, "muster_iteration_blocks", iteration=name, state="leased"), 1)
        self.assertEqual(value(s, "muster_iteration_blocks", iteration=name, state="pending"), 0)

    def test_shared(self):
        probe = self.head.request("GET", "/v1/shared/metrics-models")
        if probe.status == 404 and probe.error_code == "not_found":
            self.assertNotIn("muster_shared_blobs", self.scrape())
            self.skipTest("this head does not serve shared data (GET /v1/shared/{scope})")
        self.req("PUT", "/v1/queues/metrics-shared", {}, status=201)
        sid = self.req("POST", "/v1/sessions", {"queue": "metrics-shared"}, status=201).json["id"]

        def put(scope, name, level, size):
            r = self.head.request("PUT", "/v1/shared/%s/%s?level=%d" % (scope, name, level),
                                  raw=b"x" * size, content_type="application/octet-stream")
            self.assertEqual(r.status, 201, r)

        put("metrics-models", "weights", 1, 100)
        put("metrics-models", "weights", 2, 300)
        put("metrics-models", "vocab", 1, 50)
        put(sid, "params", 1, 7)
        text = self.scrape()
        self.promtool_check(text)
        s = parse(text)
        listed = self.req("GET", "/v1/shared/metrics-models").json["blobs"]
        levels = sum(len(b["levels"]) for b in listed)
        self.assertEqual(value(s, "muster_shared_blobs", scope="metrics-models"), 2)
        self.assertEqual(value(s, "muster_shared_levels", scope="metrics-models"), levels)
        self.assertEqual(value(s, "muster_shared_bytes", scope="metrics-models"),
                         {3: 450, 2: 350}[levels])
        self.assertEqual(value(s, "muster_shared_blobs", scope="s-*"), 1)
        self.assertEqual(value(s, "muster_shared_bytes", scope="s-*"), 7)
        # A closed session's blobs go with it.
        self.req("DELETE", "/v1/sessions/" + sid)
        s = parse(self.scrape())
        self.assertIn(value(s, "muster_shared_blobs", scope="s-*"), (None, 0))

    def test_late_replies_counted_with_their_status(self):
        """A request answered after its turn (a streamed upload, a long-poll lease) is
        counted once, with the status its reply went out with."""
        def requests(s, method, route):
            return {code: v for (name, labels), v in s.items()
                    for labels in [dict(labels)]
                    if name == "muster_http_requests_total" and labels["method"] == method
                    and labels["route"] == route for code in [labels["code"]]}

        def delta(before, after):
            return {code: n - before.get(code, 0) for code, n in after.items()
                    if n != before.get(code, 0)}

        put_route = ("PUT", "/v1/shared/{}/{}")
        lease_route = ("POST", "/v1/queues/{}/lease")
        s = parse(self.scrape())
        puts, leases = requests(s, *put_route), requests(s, *lease_route)
        # The upload's body is streamed to a file, its reply sent when the level commits.
        r = self.head.request("PUT", "/v1/shared/metrics-late/blob?level=1", raw=b"y" * 4096,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        # A long-poll whose worker is deleted while it waits ends in 404 once a task comes.
        q = "metrics-late"
        self.req("PUT", "/v1/queues/" + q, {}, status=201)
        worker = self.req("POST", "/v1/workers", {"nickname": "late"}, status=201).json["id"]
        waited = {}

        def long_poll():
            conn = self.head.connection()
            try:
                waited["reply"] = self.head.request(
                    "POST", "/v1/queues/%s/lease" % q, {"worker": worker, "wait_ms": 20000},
                    conn=conn)
            finally:
                conn.close()

        poller = threading.Thread(target=long_poll)
        poller.start()
        try:
            harness.wait_until(lambda: value(parse(self.scrape()), "muster_lease_waiters") == 1,
                               what="the lease to park")
            self.req("DELETE", "/v1/workers/%d" % worker)
            self.req("POST", "/v1/queues/%s/tasks" % q, {"tasks": [{"payload": 1}]}, status=201)
        finally:
            poller.join(30)
        self.assertEqual(waited["reply"].status, 404, waited["reply"])
        s = parse(self.scrape())
        self.assertEqual(delta(puts, requests(s, *put_route)), {"201": 1})
        self.assertEqual(delta(leases, requests(s, *lease_route)), {"404": 1})

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
