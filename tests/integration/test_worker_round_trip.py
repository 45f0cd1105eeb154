"""`muster worker` in its steady state: one request per task.  A completion leases the
next task in the same request (POST /v1/leases/complete with a "lease" object), so N
tasks cost about N requests of the lease and complete routes instead of 2N; broadcast
updates posted while a task runs come with that completion and reach the next task.
The requests are counted with the head's /metrics (muster_http_requests_total).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

LEASE_ROUTE = ("POST", "/v1/queues/{}/lease")
COMPLETE_ROUTE = ("POST", "/v1/leases/complete")
RELEASE_ROUTE = ("POST", "/v1/leases/release")
PLUGIN = os.path.join(node_harness.build_dir(), "libplugin_echo.so")

# The worker's command: waits for DIR/go when the payload is "wait" (after touching
# DIR/started), then prints the update sequence it was started with and the last line
# of the updates file as JSON.
REPORT = ('x=$(cat); if [ "$x" = wait ]; then touch "$1/started"; n=0; '
          'while [ ! -e "$1/go" ]; do sleep 0.01; n=$((n+1)); [ $n -gt 3000 ] && exit 9; done; fi; '
          'line=$(tail -n 1 "$MUSTER_UPDATES_FILE"); '
          'echo "{\\"seq\\": $MUSTER_UPDATE_SEQ, \\"line\\": ${line:-null}, \\"payload\\": \\"$x\\"}"')


class WorkerRoundTripTest(unittest.TestCase):
    head = None

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--sweep-ms", "50"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-roundtrip-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.q = self.id().rsplit(".", 1)[-1].replace("_", "-")
        self.api("PUT", "/v1/queues/" + self.q, {})

    def api(self, method, path, body=None):
        reply = self.head.request(method, path, body)
        self.assertLess(reply.status, 300, reply)
        return reply.json

    def requests(self):
        """{(method, route): requests so far} from /metrics, summed over status codes."""
        reply = self.head.request("GET", "/metrics")
        self.assertEqual(reply.status, 200, reply)
        out = {}
        pattern = re.compile(r'^muster_http_requests_total\{method="([^"]+)",route="([^"]+)",'
                             r'code="[^"]+"\} (\d+)$')
        for line in reply.raw.decode().splitlines():
            m = pattern.match(line)
            if m:
                key = (m.group(1), m.group(2))
                out[key] = out.get(key, 0) + int(m.group(3))
        return out

    def delta(self, before, completes):
        """The requests counted since `before`, once `completes` completions are: the
        head counts a request whose reply the flush thread sent when the loop hears
        that the flush ended, which may be just after the reply left."""
        def counted():
            after = self.requests()
            out = {k: after.get(k, 0) - before.get(k, 0)
                   for k in (LEASE_ROUTE, COMPLETE_ROUTE, RELEASE_ROUTE)}
            return out if out[COMPLETE_ROUTE] >= completes else None
        return harness.wait_until(counted, what="%d completions to be counted" % completes)

    def put(self, payloads):
        body = {"tasks": [{"payload": p} for p in payloads]}
        return [t["id"] for t in self.api("POST", "/v1/queues/%s/tasks" % self.q, body)["tasks"]]

    def post_update(self, data):
        return self.api("POST", "/v1/queues/%s/updates" % self.q, {"data": data})["seq"]

    def worker(self, args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        env.update(MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token,
                   PLUGIN_LOG=os.path.join(self.tmp, "plugin.log"))
        log = open(os.path.join(self.tmp, "worker.log"), "w+")
        self.addCleanup(log.close)
        proc = subprocess.Popen([harness.MUSTER_BIN, "worker", "--queue", self.q] + args,
                                env=env, stdout=subprocess.DEVNULL, stderr=log)

        def stop():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.addCleanup(stop)
        return proc, log

    def finish(self, proc, log):
        proc.wait(timeout=120)
        log.seek(0)
        err = log.read()
        self.assertEqual(proc.returncode, 0, err)
        return err

    def results(self, ids):
        tasks = [self.api("GET", "/v1/tasks/%d" % i) for i in ids]
        self.assertEqual([t["state"] for t in tasks], ["done"] * len(ids), tasks)
        return [t["result"] for t in tasks]

    def assert_one_request_per_task(self, counted, n):
        # The first task is leased alone; each completion but the last leases the next.
        # The two-call path would take n leases and n completions.
        self.assertEqual(counted[COMPLETE_ROUTE], n, counted)
        self.assertLessEqual(counted[LEASE_ROUTE], 2, counted)
        self.assertLess(counted[LEASE_ROUTE] + counted[COMPLETE_ROUTE], 2 * n - 2, counted)

    def test_command_worker_one_request_per_task(self):
        n = 30
        ids = self.put(["t%d" % i for i in range(n)])
        before = self.requests()
        proc, log = self.worker(["--max-tasks", str(n), "--", "cat"])
        self.assertIn("%d completed, 0 failed" % n, self.finish(proc, log))
        self.assert_one_request_per_task(self.delta(before, n), n)
        self.assertEqual(self.results(ids), ["t%d" % i for i in range(n)])

    def test_update_posted_while_a_task_runs_reaches_the_next_task(self):
        seq1 = self.post_update({"model": 1})
        ids = self.put(["wait", "after", "last"])
        proc, log = self.worker(["--max-tasks", "3", "--json-result", "--",
                                 "sh", "-c", REPORT, "sh", self.tmp])
        harness.wait_until(lambda: os.path.exists(os.path.join(self.tmp, "started")),
                           timeout=30, what="the first task to start")
        seq2 = self.post_update({"model": 2})
        before = self.requests()
        open(os.path.join(self.tmp, "go"), "w").close()
        self.assertIn("3 completed, 0 failed", self.finish(proc, log))
        counted = self.delta(before, 3)
        # No lease request after the first task: the update came with the completion.
        self.assertEqual((counted[LEASE_ROUTE], counted[COMPLETE_ROUTE]), (0, 3), counted)
        first, after, last = self.results(ids)
        self.assertEqual((first["seq"], first["line"]["data"]), (seq1, {"model": 1}))
        self.assertEqual((after["seq"], after["line"]["seq"], after["line"]["data"]),
                         (seq2, seq2, {"model": 2}))
        self.assertEqual(last["seq"], seq2)

    def test_failures_fall_back_to_a_plain_lease(self):
        # A failed task has nothing to complete: the next task is leased alone.
        self.api("PUT", "/v1/queues/" + self.q, {"max_attempts": 1})
        ids = self.put(["ok", "bad", "ok", "bad", "ok"])
        before = self.requests()
        script = 'x=$(cat); [ "$x" = bad ] && { echo broken >&2; exit 3; }; echo "$x"'
        proc, log = self.worker(["--max-tasks", "5", "--", "sh", "-c", script])
        self.assertIn("3 completed, 2 failed", self.finish(proc, log))
        counted = self.delta(before, 3)
        # Leases: the first task, and the one after each failure.
        self.assertEqual((counted[LEASE_ROUTE], counted[COMPLETE_ROUTE]), (3, 3), counted)
        states = [self.api("GET", "/v1/tasks/%d" % i) for i in ids]
        self.assertEqual([(t["state"], t["error"]) for t in states],
                         [("done", None), ("dead", "broken"), ("done", None), ("dead", "broken"),
                          ("done", None)])

    def test_a_stopping_worker_completes_without_leasing(self):
        # SIGTERM while a task runs: the task finishes and is completed alone; the next
        # task is neither leased with the completion nor released afterwards.
        ids = self.put(["wait", "next"])
        proc, log = self.worker(["--json-result", "--", "sh", "-c", REPORT, "sh", self.tmp])
        harness.wait_until(lambda: os.path.exists(os.path.join(self.tmp, "started")),
                           timeout=30, what="the first task to start")
        before = self.requests()
        proc.send_signal(signal.SIGTERM)
        harness.wait_until(lambda: "finishing running tasks" in open(log.name).read(),
                           timeout=30, what="the worker to take the signal")
        open(os.path.join(self.tmp, "go"), "w").close()
        self.assertIn("1 completed, 0 failed", self.finish(proc, log))
        counted = self.delta(before, 1)
        self.assertEqual(counted, {LEASE_ROUTE: 0, COMPLETE_ROUTE: 1, RELEASE_ROUTE: 0})
        self.assertEqual(self.results(ids[:1])[0]["payload"], "wait")
        nxt = self.api("GET", "/v1/tasks/%d" % ids[1])
        self.assertEqual((nxt["state"], nxt["attempts"]), ("queued", 0))

    @unittest.skipUnless(os.path.exists(PLUGIN), "libplugin_echo.so not built")
    def test_plugin_worker_one_request_per_task(self):
        n = 12
        seq = self.post_update("u1")
        ids = self.put(list(range(n)))
        before = self.requests()
        proc, log = self.worker(["--max-tasks", str(n), "--plugin", PLUGIN])
        self.assertIn("%d completed, 0 failed" % n, self.finish(proc, log))
        self.assert_one_request_per_task(self.delta(before, n), n)
        results = self.results(ids)
        self.assertEqual([r["payload"] for r in results], list(range(n)))
        self.assertEqual({json.dumps(r["updates"]) for r in results}, {json.dumps([seq])})


if __name__ == "__main__":
    unittest.main()
