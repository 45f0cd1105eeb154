"""muster.Pool on a node agent with 2 CPU workers running ``python3 -m muster.worker``."""
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

from common import ROOT, HeadTestCase, harness, muster

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import node_harness  # noqa: E402

import pool_workers  # noqa: E402

QUEUE = "pool"


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def resident_pids():
    """The resident Python worker processes (they run the jobs), found via /proc."""
    out = []
    for pid in node_harness.all_pids():
        argv = cmdline(pid)
        if b"muster.worker" in argv and b"--resident" in argv:
            out.append(pid)
    return out


class PoolTest(HeadTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.work = tempfile.mkdtemp(prefix="muster-pool-test-")
        cls.client.put_queue(QUEUE, backoff_ms=50, backoff_max_ms=200, max_attempts=3)
        env = {"PYTHONPATH": os.path.join(ROOT, "python"), "TMPDIR": cls.work}
        cls.agent = node_harness.Agent(
            cls.head, cls.work, name="pytest-node",
            args=["--queue", QUEUE, "--workers", "2"],
            cmd=["/usr/bin/python3", "-m", "muster.worker"], env=env).start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.agent.stop()
            # the resident processes follow their `muster worker` out
            wait_until(lambda: not cls.own_residents(), timeout=20, what="residents to exit")
        finally:
            super().tearDownClass()
            shutil.rmtree(cls.work, ignore_errors=True)

    @classmethod
    def own_residents(cls):
        """Our resident processes: those with TMPDIR in this test's directory."""
        out = []
        for pid in resident_pids():
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if ("TMPDIR=" + cls.work).encode() in env:
                out.append(pid)
        return out

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(dir=self.work)
        self.pool = muster.Pool(pool_workers.Echo, {"k": 3, "dir": self.dir}, url=self.head.url,
                                token=self.head.token, queue=QUEUE)
        wait_until(lambda: self.pool.get_workers_count() == 2, what="2 workers\n" + self.agent.log())

    def tearDown(self):
        self.pool.close()
        super().tearDown()

    def test_map_ordered(self):
        p = self.pool
        self.assertEqual(p.get_nodes_count(), 1)
        out = p.map(range(24))
        self.assertEqual([r["x"] for r in out], list(range(24)))
        self.assertEqual([r["y"] for r in out], [3 * i for i in range(24)])
        # init once per worker per pool: every job of a process saw one instantiation
        self.assertEqual({r["inits"] for r in out}, {1})
        # the DistCompute form: args and kwargs
        self.assertEqual(p.map([{"args": [5]}, {"kwargs": {"x": 6}}])[1]["y"], 18)
        got = sorted(r["x"] for r in p.imap_unordered(range(100, 110)))
        self.assertEqual(got, list(range(100, 110)))
        with self.assertRaises(muster.TaskError) as cm:
            p.map([1, {"args": [2], "kwargs": {"mode": "raise"}}])
        self.assertEqual(cm.exception.index, 1)
        self.assertIn("ValueError: boom 2", cm.exception.error)

    def test_update_workers_between_jobs(self):
        p = self.pool
        first = p.map(range(6))
        self.assertTrue(all(r["updates"] == [] for r in first))
        p.update_workers("u1")
        # two jobs that must run at the same time, hence on both workers
        both = p.map([{"args": [i], "kwargs": {"mode": "barrier", "tag": "b1"}} for i in range(2)])
        self.assertEqual(len({r["pid"] for r in both}), 2, both)
        self.assertEqual([r["updates"] for r in both], [["u1"], ["u1"]])
        p.update_workers({"args": ["u2"], "kwargs": {"extra": 7}})
        p.update_workers("u3")
        both = p.map([{"args": [i], "kwargs": {"mode": "barrier", "tag": "b2"}} for i in range(2)])
        self.assertEqual(len({r["pid"] for r in both}), 2, both)
        for r in both:
            self.assertEqual(r["updates"], ["u1", ("u2", 7), "u3"])
            self.assertEqual(r["inits"], 1)
        later = p.map(range(10))
        self.assertTrue(all(r["updates"] == ["u1", ("u2", 7), "u3"] for r in later))

    def test_class_through_shared_data(self):
        if not self.c.shared.available():
            self.skipTest("the head does not serve shared data yet (the class goes in init_data)")
        with muster.Pool(pool_workers.Echo, {"k": 5, "dir": self.dir}, client=self.c, queue=QUEUE,
                         use_shared=True) as p:
            self.assertEqual(self.c.session(p.session)["init_data"]["worker_class"], {"shared": "worker_class"})
            self.assertEqual([r["y"] for r in p.map(range(4))], [0, 5, 10, 15])

    def test_class_through_init_data(self):
        self.assertIn("pickle", self.c.session(self.pool.session)["init_data"]["worker_class"]
                      if not self.pool.use_shared else {"pickle": 1})

    def test_worker_killed_mid_job(self):
        p = self.pool
        p.map(range(4))  # both workers have their resident process
        items = list(range(8))
        items[3] = {"args": [3], "kwargs": {"mode": "block"}}
        results = {}
        it = p.imap_unordered(items)
        done = threading.Event()

        def consume():
            try:
                for r in it:
                    results.setdefault(r["x"], []).append(r)
            finally:
                done.set()

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        started = wait_until(lambda: [f for f in os.listdir(self.dir) if f.startswith("started-")],
                             what="the blocking job to start")
        victim = int(started[0].split("-")[1])
        self.assertIn(b"--resident", cmdline(victim))
        self.assertIn(victim, resident_pids())
        os.kill(victim, signal.SIGKILL)
        # the job fails on that worker and is leased again; let it finish this time
        wait_until(lambda: len([f for f in os.listdir(self.dir) if f.startswith("started-")]) >= 2,
                   what="the job to be rescheduled\n" + self.agent.log())
        open(os.path.join(self.dir, "release"), "w").close()
        self.assertTrue(done.wait(60), "results did not come")
        t.join()
        self.assertEqual(sorted(results), list(range(8)))
        self.assertTrue(all(len(v) == 1 for v in results.values()), results)
        self.assertNotEqual(results[3][0]["pid"], victim)
        self.assertEqual(results[3][0]["y"], 9)


if __name__ == "__main__":
    unittest.main()


class StandaloneWorkerTest(HeadTestCase):
    """``python3 -m muster.worker --queue Q``: leases itself, with updates_after."""

    def start_worker(self, q, nickname):
        """Starts ``python3 -m muster.worker`` on queue `q`; returns (work dir, process,
        stop), stop() ending it with SIGTERM (it also runs at cleanup)."""
        import subprocess
        work = tempfile.mkdtemp(prefix="muster-pool-test-")
        self.addCleanup(shutil.rmtree, work, True)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        log = open(os.path.join(work, "worker.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen(["/usr/bin/python3", "-m", "muster.worker", "--queue", q,
                                 "--url", self.head.url, "--token", self.head.token,
                                 "--nickname", nickname], env=env,
                                stdout=subprocess.DEVNULL, stderr=log)

        def stop():
            harness.stop_process(proc)
        self.addCleanup(stop)
        return work, proc, stop

    def test_standalone_worker(self):
        q = "pool-standalone"
        self.c.put_queue(q, backoff_ms=50, max_attempts=2)
        work, proc, stop = self.start_worker(q, "py")
        with muster.Pool(pool_workers.Echo, {"args": [{"k": 2, "dir": work}]}, client=self.c, queue=q) as p:
            wait_until(lambda: p.get_workers_count() == 1, what="the worker")
            self.assertEqual(p.get_nodes_count(), 1)
            self.assertEqual([r["y"] for r in p.map(range(5))], [0, 2, 4, 6, 8])
            p.update_workers("a")
            p.update_workers("b")
            out = p.map(range(3))
            self.assertEqual([r["updates"] for r in out], [["a", "b"]] * 3)
            self.assertEqual({r["inits"] for r in out}, {1})
            with self.assertRaises(muster.TaskError):
                p.map([{"args": [1], "kwargs": {"mode": "raise"}}])
        stop()
        with open(os.path.join(work, "worker.log")) as f:
            self.assertEqual(proc.returncode, 0, f.read())

    def test_standalone_worker_one_request_per_task(self):
        """In its steady state the worker completes a task and leases the next in one
        request: the head sees about one lease or complete request per task, not two."""
        q = "pool-standalone-round-trip"
        self.c.put_queue(q)
        work = self.start_worker(q, "py-rt")[0]

        def requests():
            text = self.head.request("GET", "/metrics").raw.decode()
            out = {"lease": 0, "complete": 0}
            for line in text.splitlines():
                for key, route in (("lease", 'route="/v1/queues/{}/lease"'),
                                   ("complete", 'route="/v1/leases/complete"')):
                    if line.startswith("muster_http_requests_total{") and route in line:
                        out[key] += int(line.rsplit(" ", 1)[1])
            return out

        n = 20
        with muster.Pool(pool_workers.Echo, {"args": [{"k": 3, "dir": work}]}, client=self.c, queue=q) as p:
            wait_until(lambda: p.get_workers_count() == 1, what="the worker")
            p.update_workers("a")
            start = requests()
            self.assertEqual([r["y"] for r in p.map(range(2))], [0, 3])   # the worker is warm
            # The head counts a completion whose reply its flush thread sent when the
            # loop hears that the flush ended, which may be just after the reply left:
            # both warm-up completions are counted before the baseline is taken.
            def warm_counted():
                now = requests()
                return now if now["complete"] - start["complete"] >= 2 else None
            before = wait_until(warm_counted, what="the warm-up completions to be counted")
            p.update_workers("b")
            out = p.map(range(n))

            def counted():
                now = requests()
                return now if now["complete"] - before["complete"] >= n else None
            after = wait_until(counted, what="the completions to be counted")
        self.assertEqual([r["y"] for r in out], [3 * i for i in range(n)])
        self.assertEqual([r["updates"] for r in out], [["a", "b"]] * n)
        leases, completes = after["lease"] - before["lease"], after["complete"] - before["complete"]
        self.assertEqual(completes, n)
        # The long-poll that takes the first task, and one when the queue runs dry; the
        # two-call path would take n leases.
        self.assertLessEqual(leases, 3, (leases, completes))
        self.assertLess(leases + completes, 2 * n - 2)

    def test_lease_trouble_is_said_once(self):
        """A worker started before its queue exists (or while the head is down) printed
        'muster.worker: lease: ...' every second; it says it once, and once more when
        leasing works again."""
        from muster import worker as mw
        q = self.qname()
        c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(c.close)
        tries, third, lines, stop = [], threading.Event(), [], threading.Event()
        real_lease = c._lease   # serve_queue's lease, its wait chosen already

        def lease(*args, **kw):
            tries.append(1)
            if len(tries) == 3:
                third.set()
            return real_lease(*args, **kw)

        c._lease = lease
        t = threading.Thread(target=mw.serve_queue, args=(c, q),
                             kwargs={"wait_ms": 100, "stop": stop, "log": lines.append})
        t.start()
        self.assertTrue(third.wait(30))
        self.c.put_queue(q)
        wait_until(lambda: len(lines) == 2, what="leasing again")
        stop.set()
        t.join(30)
        self.assertEqual(lines, ["muster.worker: waiting for queue %s to be created (a "
                                 "muster.Pool on it creates it)" % q,
                                 "muster.worker: leasing from queue %s again" % q])

    def test_help_says_what_it_is_and_what_each_option_does(self):
        # It printed the module's docstring, ``markup`` and :class: roles included, and
        # --url, --token, --nickname and --max-tasks with no word on them.
        import subprocess
        out = subprocess.run(["/usr/bin/python3", "-m", "muster.worker", "--help"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        text = out.stdout.decode()
        self.assertEqual((out.returncode, out.stderr), (0, b""))
        self.assertNotIn("``", text)
        self.assertNotIn(":class:", text)
        self.assertIn("Runs the worker classes of muster.Pool", text)
        options = text[text.index("\noptions:\n"):]
        for option in ("--queue Q", "--url URL", "--token TOKEN", "--nickname NAME",
                       "--max-tasks N", "--cache-url URL"):
            line = next(x for x in options.splitlines() if x.strip().startswith(option))
            self.assertNotEqual(line.strip(), option, "%s has no help" % option)

    def test_a_head_that_is_not_there_is_one_line(self):
        import subprocess
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = "http://127.0.0.1:%d" % s.getsockname()[1]
        out = subprocess.run(["/usr/bin/python3", "-m", "muster.worker", "--queue", "q",
                              "--url", url, "--token", "t"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=60,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        err = out.stderr.decode()
        self.assertEqual(out.returncode, 1, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err, "python3 -m muster.worker: could not register a worker with the "
                              "head at %s: network: POST /v1/workers (%s): [Errno 111] "
                              "Connection refused; is a muster head or node agent running "
                              "there? The URL is the one --url gives: start it, or give the "
                              "URL of a running one\n" % (url, url))

    def test_a_head_restarting_while_a_task_runs(self):
        """The head is down when the worker completes its task: the worker sends the
        completion again until the head answers (it exited at once, its task's result lost
        and no worker left for the pool's other jobs, so the pool waited for ever)."""
        import subprocess
        head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()]).start()
        self.addCleanup(head.cleanup)
        work = tempfile.mkdtemp(prefix="muster-pool-test-")
        self.addCleanup(shutil.rmtree, work, True)
        c = muster.Client(head.url, head.token)
        self.addCleanup(c.close)
        q = self.qname()
        c.put_queue(q)
        log_path = os.path.join(work, "worker.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(["/usr/bin/python3", "-m", "muster.worker", "--queue", q,
                                     "--url", head.url, "--token", head.token],
                                    env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
                                    stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))

        def worker_log():
            with open(log_path, errors="replace") as f:
                return f.read()

        def worker_says(text):
            return text in worker_log() or proc.poll() is not None

        with muster.Pool(pool_workers.Echo, {"k": 2, "dir": work}, client=c, queue=q) as p:
            it = p.imap([{"args": [1], "kwargs": {"mode": "block"}}, 2, 3], timeout=60)
            wait_until(lambda: any(f.startswith("started-") for f in os.listdir(work)),
                       what="the first job to start")
            head.kill()
            open(os.path.join(work, "release"), "w").close()
            wait_until(lambda: worker_says("reporting task"), what="the worker to report")
            self.assertIsNone(proc.poll(), worker_log())
            head.start()
            self.assertEqual([r["y"] for r in it], [2, 4, 6])
        self.assertIsNone(proc.poll(), worker_log())
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)
        with open(log_path) as f:
            text = f.read()
        self.assertIn("trying again every second until its lease ends", text)
        self.assertIn("the head answers again", text)

    def test_a_refused_combined_call_completes_alone(self):
        """The combined call is all or nothing: when its lease part is refused (the head
        forgot the worker, the queue is gone) the result is still completed, alone."""
        from muster import worker as mw
        from muster import worker_reg
        calls, keys = [], []

        class FakeLease:
            def __init__(self, error):
                self.error = error

            def complete_and_lease(self, queue, result, worker=None, updates_after=None,
                                   request=None):
                calls.append(("combined", queue, result, worker, updates_after))
                keys.append(request)
                raise self.error

            def complete(self, result):
                calls.append(("complete", result))

            def fail(self, error, permanent=False):
                calls.append(("fail", error, permanent))

        for error in (muster.WorkerNotFound("gone"), muster.QueueNotFound("gone"),
                      muster.InvalidArgument("old head")):
            del calls[:]
            got = mw._report(FakeLease(error), ("complete", '{"y": 1}', False), "q", 7, 3, True)
            self.assertIsNone(got)
            self.assertEqual(calls, [("combined", "q", {"y": 1}, 7, 3), ("complete", {"y": 1})])
        # A lost lease is final; a stopping worker or a failure never leases with it.
        del calls[:]
        mw._report(FakeLease(muster.LeaseLost("taken")), ("complete", "1", False), "q", 7, 3, True)
        self.assertEqual([c[0] for c in calls], ["combined"])
        del calls[:]
        mw._report(FakeLease(None), ("complete", "1", False), "q", 7, 3, False)
        mw._report(FakeLease(None), ("fail", "boom", True), "q", 7, 3, True)
        self.assertEqual(calls, [("complete", 1), ("fail", "boom", True)])
        # A head older than lease request keys refuses the key: the combined call goes
        # once more without it, and no key is sent from then on.
        del calls[:], keys[:]
        lk = worker_reg.LeaseKeys()
        refusal = muster.InvalidArgument("lease.request: unknown field; known fields: queue")
        mw._report(FakeLease(refusal), ("complete", "1", False), "q", 7, 3, True, keys=lk)
        self.assertEqual([c[0] for c in calls], ["combined", "combined", "complete"])
        self.assertEqual((keys[0] is not None, keys[1]), (True, None))
        self.assertIsNone(lk.current())
