"""`muster worker` riding out a head that goes away and comes back.

The head listens on a fixed port (picked free at the start), so a restart on the same
data dir answers at the same URL.  Checks:
- a result that finished while the head was down (longer than the few seconds the
  worker once retried for) is stored when the head is back, well within the lease,
  and the command ran once;
- a worker started before its head waits for it (one line, not one per try), then
  runs tasks; a stop signal while it waits exits 0;
- an unknown queue stops the worker with `muster worker:` and how to create it;
- a hard stop (SIGHUP, as when the node agent dies) kills the running command without
  failing its task or logging a refused failure report;
- a worker that could not read its heartbeat timeout after registering (the head went
  away in between) reads it again and beats often enough for it meanwhile.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN

# Notes a run (one line per start, in DIR/runs), then waits for DIR/gate, echoes its
# input and notes its end (DIR/ended-TASK): the test holds the command until the head is
# down.
GATED = ('echo "$MUSTER_TASK_ID" >> "$1/runs"; while [ ! -e "$1/gate" ]; do sleep 0.02; done;'
         ' cat; : > "$1/ended-$MUSTER_TASK_ID"')


class WorkerHeadRestartTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-worker-restart-")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()])
        self.head.start()
        self.url = self.head.url
        self.procs = []

    def tearDown(self):
        open(os.path.join(self.tmp, "gate"), "w").close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.log.close()
        self.head.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self):
        return dict(os.environ, MUSTER_URL=self.url, MUSTER_TOKEN=self.head.token)

    def muster(self, *args):
        return subprocess.run([MUSTER] + list(args), env=self.env(), capture_output=True,
                              text=True, timeout=60)

    def ok(self, *args):
        r = self.muster(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def worker(self, queue, *cmd, opts=()):
        log = open(os.path.join(self.tmp, "worker-%d.log" % len(self.procs)), "w+")
        proc = subprocess.Popen([MUSTER, "worker", "--queue", queue] + list(opts) + ["--"]
                                + list(cmd), env=self.env(), stdout=subprocess.DEVNULL,
                                stderr=log)
        proc.log = log
        self.procs.append(proc)
        return proc

    def log_of(self, proc):
        with open(proc.log.name) as f:
            return f.read()

    def tasks(self, queue):
        reply = self.head.request("GET", "/v1/queues/%s/tasks?limit=100" % queue)
        self.assertEqual(reply.status, 200, reply)
        return reply.json["tasks"]

    def runs(self):
        path = os.path.join(self.tmp, "runs")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return f.read().split()

    def test_result_waits_for_the_head_to_come_back(self):
        self.ok("queue", "create", "rq", "--lease-ms", "60000")
        self.ok("put", "--queue", "rq", "one")
        w = self.worker("rq", "sh", "-c", GATED, "sh", self.tmp)
        harness.wait_until(lambda: self.runs(), timeout=30, what="the command to start")
        killed = time.monotonic()
        self.head.kill()
        open(os.path.join(self.tmp, "gate"), "w").close()  # the command ends, head down
        (tid,) = self.runs()
        harness.wait_until(lambda: os.path.exists(os.path.join(self.tmp, "ended-" + tid)),
                           timeout=30, what="the command to end")
        # The outage itself: longer than the ~3 s the worker once retried a result for.
        time.sleep(max(0.0, 5.0 - (time.monotonic() - killed)))
        self.head.start()

        def done():
            (task,) = self.tasks("rq")
            return task["state"] == "done" and task
        task = harness.wait_until(done, timeout=15,
                                  what=lambda: "the result to be stored:\n" + self.log_of(w))
        self.assertLess(time.monotonic() - killed, 20)  # far below the 60 s lease
        self.assertEqual(task["result"], "one")
        self.assertEqual(task["attempts"], 1, task)
        self.assertEqual(self.runs(), [str(task["id"])])  # it ran once
        # The worker says so once the head's answer reached it, which may come after the
        # head stored the result and the test saw it (a run of the suite four tests at a
        # time, beside two builds, read the log in between).
        harness.wait_until(lambda: "reached the head again" in self.log_of(w),
                           what=lambda: "the worker to say the head is back:\n" +
                           self.log_of(w))
        log = self.log_of(w)
        self.assertEqual(log.count("cannot store its result yet"), 1, log)
        self.assertNotIn("result not stored", log)

    def test_stop_signal_gives_up_waiting_for_a_result(self):
        self.ok("queue", "create", "sq", "--lease-ms", "60000")
        self.ok("put", "--queue", "sq", "one")
        w = self.worker("sq", "sh", "-c", GATED, "sh", self.tmp)
        harness.wait_until(lambda: self.runs(), timeout=30, what="the command to start")
        self.head.kill()
        open(os.path.join(self.tmp, "gate"), "w").close()
        harness.wait_until(lambda: "cannot store its result yet" in self.log_of(w), timeout=30,
                           what="the worker to wait for the head")
        stopped = time.monotonic()
        w.send_signal(signal.SIGINT)
        w.wait(timeout=10)
        self.assertLess(time.monotonic() - stopped, 5)
        log = self.log_of(w)
        self.assertIn("result not stored", log)
        self.assertIn("gave up: the worker was told to stop", log)

    def test_worker_started_before_its_head(self):
        self.ok("queue", "create", "wq")
        self.head.kill()
        w = self.worker("wq", "tr", "a-z", "A-Z", opts=["--max-tasks", "1"])
        harness.wait_until(lambda: "waiting for the head at " + self.url in self.log_of(w),
                           timeout=30, what=lambda: "the worker to wait:\n" + self.log_of(w))
        self.head.start()
        self.ok("put", "--queue", "wq", "hello")
        w.wait(timeout=60)
        log = self.log_of(w)
        self.assertEqual(w.returncode, 0, log)
        self.assertEqual(log.count("waiting for the head"), 1, log)
        # Where the URL came from (it said "is --url / MUSTER_URL right?" whatever the case).
        self.assertIn("trying every second (is MUSTER_URL right?)\n", log)
        self.assertIn("the head at %s answers" % self.url, log)
        (task,) = self.tasks("wq")
        self.assertEqual((task["state"], task["result"]), ("done", "HELLO"))

    def test_worker_started_by_data_dir_before_its_head(self):
        # Named only by its data dir, whose head stopped cleanly (no url file there): the
        # worker once refused to start (exit 2, "has no url file"); it waits for the head
        # to write its URL, then works, reading URL and token from the data dir.
        self.ok("queue", "create", "dq")
        self.head.stop()
        self.assertFalse(os.path.exists(os.path.join(self.head.data_dir, "url")))
        log = open(os.path.join(self.tmp, "worker-dd.log"), "w+")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        w = subprocess.Popen([MUSTER, "worker", "--queue", "dq", "--max-tasks", "1", "--",
                              "tr", "a-z", "A-Z"], env=dict(env, MUSTER_DATA_DIR=self.head.data_dir),
                             stdout=subprocess.DEVNULL, stderr=log)
        w.log = log
        self.procs.append(w)
        waiting = "muster worker: waiting for the head of data dir %s to start" % self.head.data_dir
        harness.wait_until(lambda: waiting in self.log_of(w), timeout=30,
                           what=lambda: "the worker to wait:\n" + self.log_of(w))
        self.assertIsNone(w.poll(), self.log_of(w))
        self.head.start()
        self.ok("put", "--queue", "dq", "hello")
        w.wait(timeout=60)
        text = self.log_of(w)
        self.assertEqual(w.returncode, 0, text)
        self.assertEqual(text.count("waiting for the head"), 1, text)
        (task,) = self.tasks("dq")
        self.assertEqual((task["state"], task["result"]), ("done", "HELLO"))

    def test_waiting_for_a_killed_head_names_its_url_file(self):
        # A head killed with -9 leaves DATA_DIR/url behind: the worker that read the URL
        # there says so, rather than asking whether --url or MUSTER_URL is right.
        self.head.kill()
        self.assertTrue(os.path.exists(os.path.join(self.head.data_dir, "url")))
        log = open(os.path.join(self.tmp, "worker-killed.log"), "w+")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        w = subprocess.Popen([MUSTER, "worker", "--queue", "kq", "--", "cat"],
                             env=dict(env, MUSTER_DATA_DIR=self.head.data_dir),
                             stdout=subprocess.DEVNULL, stderr=log)
        w.log = log
        self.procs.append(w)
        said = ("trying every second (the URL is from %s/url, which a head killed with -9 "
                "leaves behind)\n" % self.head.data_dir)
        harness.wait_until(lambda: said in self.log_of(w), timeout=30,
                           what=lambda: "the worker to wait:\n" + self.log_of(w))
        w.send_signal(signal.SIGINT)
        self.assertEqual(w.wait(timeout=10), 0, self.log_of(w))

    def test_stop_signal_while_waiting_for_the_head(self):
        self.head.kill()
        w = self.worker("wq", "cat")
        harness.wait_until(lambda: "waiting for the head" in self.log_of(w), timeout=30,
                           what="the worker to wait")
        w.send_signal(signal.SIGINT)
        w.wait(timeout=10)
        log = self.log_of(w)
        self.assertEqual(w.returncode, 0, log)
        self.assertIn("stopped while waiting for the head at %s; nothing was leased" % self.url,
                      log)

    def test_unknown_queue_says_how_to_create_it(self):
        r = self.muster("worker", "--queue", "nosuchq", "--", "cat")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertTrue(r.stderr.startswith("muster worker: queue_not_found: "), r.stderr)
        self.assertIn("create it with `muster queue create nosuchq`", r.stderr)

    def test_hard_stop_does_not_fail_the_running_tasks(self):
        self.ok("queue", "create", "hq")
        self.ok("put", "--queue", "hq", *["t%d" % i for i in range(8)])
        w = self.worker("hq", "sh", "-c", GATED, "sh", self.tmp, opts=["--concurrency", "8"])
        harness.wait_until(lambda: len(self.runs()) == 8, timeout=30,
                           what="the commands to start")
        w.send_signal(signal.SIGHUP)
        w.wait(timeout=10)
        log = self.log_of(w)
        self.assertIn("got SIGHUP", log)
        self.assertNotIn("failed", log)
        self.assertNotIn("could not report", log)
        for task in self.tasks("hq"):
            self.assertEqual(task["state"], "queued", task)
            self.assertIsNone(task.get("error"), task)


def hide_timeout(pieces):
    """A registration's reply as an older head gave it, without "timeout_ms" (renamed in
    place: the length the proxy sent first stays right)."""
    yield b"".join(pieces).replace(b'"timeout_ms"', b'"timeout_xx"')


class UnreadTimeoutTest(unittest.TestCase):
    """A head that does not answer the timeout at registration (an older head) has it read
    with GET /v1/workers/ID, and the worker beats every third of it.  When that read
    failed (the head killed or restarting right after the registration), it beat every
    20 s, a third of the default minute, for good: a head with a shorter timeout (here
    1.5 s) timed it out again and again, its leases returned each time, and it registered
    anew at every lease."""

    def setUp(self):
        self.head = harness.Head(["--worker-timeout-ms", "1500"]).start()
        self.addCleanup(self.head.cleanup)
        self.reads = 0

        def decide(n):
            method, path, _ = self.proxy.requests[n - 1]
            if method == "POST":
                return hide_timeout
            self.reads += 1
            return harness.UNAVAILABLE if self.reads == 1 else "forward"
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: (method, path) == ("POST", "/v1/workers") or
            method == "GET" and re.fullmatch(r"/v1/workers/\d+", path) is not None, decide)
        self.addCleanup(self.proxy.close)

    def test_a_timeout_not_read_is_read_again(self):
        h = self.head
        self.assertEqual(h.request("PUT", "/v1/queues/tq", {}).status, 201)
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen([MUSTER, "worker", "--queue", "tq", "--url", self.proxy.url,
                                     "--token", h.token, "--", "cat"],
                                    stdout=subprocess.DEVNULL, stderr=log)
            try:
                harness.wait_until(lambda: self.reads >= 1, timeout=30,
                                   what="the worker to read its timeout")
                # Its beats reach the head at its timeout's pace: the worker's last_seen_ms
                # moves on several times within a few of its 1.5 s.
                seen = set()

                def beats():
                    r = h.request("GET", "/v1/workers/1")
                    self.assertEqual(r.status, 200, r)
                    seen.add(r.json["last_seen_ms"])
                    return len(seen) >= 5
                harness.wait_until(beats, timeout=15, what=lambda: "heartbeats of worker 1, "
                                   "%d seen:\n%s" % (len(seen), h.log()))
                self.assertEqual(h.request("GET", "/v1/workers/1").json["state"], "active")
                self.assertGreaterEqual(self.reads, 2, "the timeout was not read again")
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            log.seek(0)  # the worker has exited: nothing writes to the file any more
            text = log.read()
        self.assertEqual(proc.returncode, 0, text)
        self.assertNotIn("the head forgot worker", text)
        self.assertNotIn("timed out", h.log())


class RegistrationTimeoutTest(unittest.TestCase):
    """The worker takes its heartbeat timeout from the registration's reply: it needs no
    GET /v1/workers/ID (refused here, always) and beats every third of the head's 4.5 s
    from the start.  It once read the timeout with that second request, and beat every
    quarter second until the read worked."""

    def setUp(self):
        self.head = harness.Head(["--worker-timeout-ms", "4500"]).start()
        self.addCleanup(self.head.cleanup)
        self.reads, self.beats = 0, []

        def decide(n):
            method, path, _ = self.proxy.requests[n - 1]
            if method == "GET":
                self.reads += 1
                return harness.UNAVAILABLE
            self.beats.append(time.monotonic())
            return "forward"
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: re.fullmatch(r"/v1/workers/\d+(/heartbeat)?", path)
            is not None, decide)
        self.addCleanup(self.proxy.close)

    def test_the_timeout_comes_with_the_registration(self):
        h = self.head
        self.assertEqual(h.request("PUT", "/v1/queues/rq", {}).status, 201)
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen([MUSTER, "worker", "--queue", "rq", "--url", self.proxy.url,
                                     "--token", h.token, "--", "cat"],
                                    stdout=subprocess.DEVNULL, stderr=log)
            try:
                harness.wait_until(lambda: len(self.beats) >= 4, timeout=30,
                                   what=lambda: "four heartbeats, %d came" % len(self.beats))
                self.assertEqual(h.request("GET", "/v1/workers/1").json["state"], "active")
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            log.seek(0)
            text = log.read()
        self.assertEqual(proc.returncode, 0, text)
        self.assertEqual(self.reads, 0, "the worker read its timeout with a second request")
        # The first beat goes out at once (its progress is new); the others come every
        # 1.5 s (a third of 4.5 s), never at the quarter second of an unknown timeout.
        gaps = [b - a for a, b in zip(self.beats[1:], self.beats[2:])]
        self.assertTrue(all(gap >= 1.0 for gap in gaps), gaps)


class ForgottenWorkerTest(unittest.TestCase):
    """A worker the head answers worker_not_found says why, and registers again: it timed
    out (no beat got through for its timeout), it was removed (its last beat got there
    within the timeout: a goodbye sent for it), or the head never knew it (another head,
    on an empty data dir, at the URL).  It once said "the head forgot worker N" for all
    three, which sent whoever read it after a timeout that never happened."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-worker-forgotten-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.head = harness.Head(["--worker-timeout-ms", "1500"]).start()
        self.addCleanup(self.head.cleanup)
        self.assertEqual(self.head.request("PUT", "/v1/queues/fq", {}).status, 201)

    def worker(self, url, *cmd):
        log = open(os.path.join(self.tmp, "worker.log"), "w+")
        proc = subprocess.Popen([MUSTER, "worker", "--queue", "fq", "--url", url, "--token",
                                 self.head.token, "--"] + list(cmd),
                                stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(log.close)
        self.addCleanup(harness.stop_process, proc)
        self.log_path = log.name
        harness.wait_until(lambda: "(id 1) on queue fq" in self.log(), timeout=30,
                           what=lambda: "the worker to register:\n" + self.log())
        return proc

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def said(self, start):
        line = harness.wait_until(
            lambda: [x for x in self.log().splitlines() if x.startswith(start)], timeout=30,
            what=lambda: "the worker to say %r:\n%s" % (start, self.log()))[0]
        return line

    def test_removed(self):
        self.worker(self.head.url, "cat")
        self.assertEqual(self.head.request("DELETE", "/v1/workers/1").status, 200)
        # The head says why; an older head's "said bye or timed out" is told apart by
        # the worker (ForgottenWhyTest in tests/python).
        line = self.said("muster worker: the head holds worker 1 as gone")
        self.assertRegex(line, r"^muster worker: the head holds worker 1 as gone: a goodbye was "
                         r"sent for it; registered again as \S+ \(id 2\)$")

    def test_timed_out_with_a_task_running(self):
        self.head.request("POST", "/v1/queues/fq/tasks", {"tasks": [{"payload": "x"}]})
        w = self.worker(self.head.url, "sh", "-c",
                        'touch "$1/ran"; while [ ! -e "$1/gate" ]; do sleep 0.02; done',
                        "sh", self.tmp)
        self.addCleanup(lambda: open(os.path.join(self.tmp, "gate"), "w").close())
        harness.wait_until(lambda: os.path.exists(os.path.join(self.tmp, "ran")), timeout=30,
                           what="the task to run")
        w.send_signal(signal.SIGSTOP)  # silent: the head times it out
        try:
            harness.wait_until(
                lambda: self.head.request("GET", "/v1/workers/1").json["state"] == "gone",
                timeout=30, what="the head to time worker 1 out")
        finally:
            w.send_signal(signal.SIGCONT)
        line = self.said("muster worker: the head timed out worker 1")
        self.assertRegex(line, r"^muster worker: the head timed out worker 1 \(no heartbeat got "
                         r"there for \d+\.\d s, past its 1\.5 s timeout\); registered again as "
                         r"\S+ \(id 2\); the task it was running lost its lease \(its result "
                         r"will not be stored\)$")

    def test_never_known(self):
        # The worker talks to the head through a proxy, which then forwards to another
        # head (another data dir, the same token) that has no worker at all.
        proxy = harness.RequestProxy(self.head, lambda method, path: False, None)
        self.addCleanup(proxy.close)
        other = harness.Head(["--worker-timeout-ms", "1500"]).start()
        self.addCleanup(other.cleanup)
        self.assertEqual(other.request("PUT", "/v1/queues/fq", {}).status, 201)
        self.worker(proxy.url, "cat")
        proxy.head = other
        line = self.said("muster worker: the head does not know worker 1")
        self.assertEqual(line, "muster worker: the head does not know worker 1 (it lost its data, "
                         "was restored from an older backup, or is another head at this URL); "
                         "registered again as %s (id 1)"
                         % other.request("GET", "/v1/workers/1").json["name"])


if __name__ == "__main__":
    unittest.main()
