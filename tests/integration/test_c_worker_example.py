"""examples/c/worker.c, the worker of docs/client.md ("Writing a worker in C"), compiled
against the build dir as that page says and run against a head whose workers time out
after 1.5 s: it squares numbers, fails a payload it cannot read permanently, stays alive
through a task four times longer than its timeout (muster_worker_beat_start beats for it
while it works: the head counts heartbeats alone, not leases or completions), finishes
the task it runs when it gets SIGTERM, says goodbye and exits 0.

A C user's hand-written worker that leased and completed but never called
muster_worker_heartbeat was declared gone after the worker timeout (worker_not_found):
test_leasing_is_no_heartbeat pins that behaviour of the head, which the page explains.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_c_build  # noqa: E402  (its compile flags; its test class is not imported)

SOURCE = test_c_build.SOURCE
BUILD = test_c_build.BUILD
QUEUE = "squares"
TIMEOUT_MS = 1500


class CWorkerExampleTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="muster-c-worker-")
        cls.program = os.path.join(cls.tmp, "worker")
        cc = subprocess.run(
            ["cc", "-Wall", "-Wextra", "-Werror", "-std=c11", os.path.join(SOURCE, "examples", "c", "worker.c")] + test_c_build.sanitized() +
            ["-I", os.path.join(SOURCE, "include"), "-L", BUILD, "-lmuster",
             "-Wl,-rpath," + BUILD, "-o", cls.program], capture_output=True, text=True)
        if cc.returncode != 0:
            raise AssertionError("examples/c/worker.c does not compile:\n" + cc.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.head = harness.Head(["--worker-timeout-ms", str(TIMEOUT_MS)]).start()
        self.assertEqual(self.head.request("PUT", "/v1/queues/" + QUEUE, {}).status, 201)
        self.worker = None

    def tearDown(self):
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait(timeout=30)
        self.head.cleanup()

    def put(self, payload):
        reply = self.head.request("POST", "/v1/queues/%s/tasks" % QUEUE,
                                  {"tasks": [{"payload": payload}]})
        self.assertEqual(reply.status, 201, reply.json)
        return reply.json["tasks"][0]["id"]

    def task(self, task_id):
        return self.head.request("GET", "/v1/tasks/%d" % task_id).json

    def finished(self, task_id):
        task = self.task(task_id)
        return task if task["state"] in ("done", "failed", "dead") else None

    def worker_object(self, worker_id):
        return self.head.request("GET", "/v1/workers/%d" % worker_id).json

    def start_worker(self):
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        self.worker = subprocess.Popen([self.program, QUEUE], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        first = self.worker.stdout.readline()
        self.assertIn("serves %s; heartbeat timeout %d ms" % (QUEUE, TIMEOUT_MS), first,
                      first + self.worker.stderr.read() if not first else first)
        return int(first.split()[1])

    def test_worker_runs_fails_outlives_its_timeout_and_says_goodbye(self):
        worker_id = self.start_worker()
        four, oops, no_n = self.put({"n": 4}), self.put("oops"), self.put({"m": 1})
        for task_id in (four, oops, no_n):
            harness.wait_until(lambda: self.finished(task_id), timeout=30,
                               what="task %d to finish" % task_id)
        self.assertEqual(self.task(four)["state"], "done")
        self.assertEqual(self.task(four)["result"], {"square": 16})
        for task_id, payload in ((oops, '"oops"'), (no_n, '{"m":1}')):
            task = self.task(task_id)
            self.assertEqual(task["state"], "failed", task)  # permanent: no retry
            self.assertEqual(task["attempts"], 1, task)
            self.assertIn("expected {\"n\": INTEGER}", task["error"], task)

        # Four timeouts of work: the worker stays alive and its lease never lapses.
        long_task = self.put({"n": 3, "work_ms": 4 * TIMEOUT_MS})
        harness.wait_until(lambda: self.worker_object(worker_id)["progress"] ==
                           "task %d" % long_task, timeout=30, what="the progress of the task")
        harness.wait_until(lambda: self.finished(long_task), timeout=60,
                           what="the long task to finish")
        task = self.task(long_task)
        self.assertEqual((task["state"], task["attempts"], task["result"]),
                         ("done", 1, {"square": 9}), task)
        self.assertEqual(self.worker_object(worker_id)["state"], "active")

        # SIGTERM while a task runs: the task is completed, then the goodbye.
        last = self.put({"n": 5, "work_ms": 1000})
        harness.wait_until(lambda: self.task(last)["state"] == "leased", timeout=30,
                           what="the last task to be leased")
        self.worker.send_signal(signal.SIGTERM)
        out, err = self.worker.communicate(timeout=30)
        self.assertEqual(self.worker.returncode, 0, out + err)
        self.assertIn("worker %d: goodbye" % worker_id, out)
        task = self.task(last)
        self.assertEqual((task["state"], task["result"]), ("done", {"square": 25}), task)
        gone = self.worker_object(worker_id)
        self.assertEqual((gone["state"], gone["gone_reason"]), ("gone", "bye"), gone)

    def test_leasing_is_no_heartbeat(self):
        """The head keeps a worker alive by its heartbeats alone: one that leases (and
        finds nothing) again and again is declared gone after its timeout, and its next
        lease is refused worker_not_found.  What the page tells a C programmer."""
        worker_id = self.head.request("POST", "/v1/workers",
                                      {"queues": [QUEUE], "timeout_ms": 300}).json["id"]

        def lease_refused():
            reply = self.head.request("POST", "/v1/queues/%s/lease" % QUEUE,
                                      {"worker": worker_id, "max": 1})
            return reply.status == 404 and reply.error_code == "worker_not_found"
        harness.wait_until(lease_refused, timeout=30, what="the lease to be refused")
        gone = self.worker_object(worker_id)
        self.assertEqual((gone["state"], gone["gone_reason"]), ("gone", "timeout"), gone)


if __name__ == "__main__":
    unittest.main()
