"""`muster queue wait Q [--pipeline] [--timeout-ms MS] [--quiet]` (docs/cli.md "queue").

A head per test (on a port of its own, so that one test can restart it at the same URL).
The command runs as a background process whose stderr goes to a file, read while it
runs: its first progress line says it has looked once.  What a test waits on is a
condition (harness.wait_until), never a pause: that the waiter has looked again after
a change is read off the head's own count of GET /v1/queues (GET /metrics), two more
requests meaning that it answered one look after the change and asked again.

Checked: a three-stage pipeline served by workers drains (exit 0, every task done at
the end); tasks that die while it waits fail it (exit 1) with a line naming how many,
where, and `muster tasks dead --queue Q`, tasks that died before it not counted; a
queue no one serves times out (exit 1) with what is left, delayed tasks counted; a
head killed and started again is waited for (exit 0 after); an unknown queue; bad
--timeout-ms values (exit 2); --pipeline waits for the task that a completion makes in
the next stage, and without it the command does not; a loop of `next` ends the chain;
SIGINT and SIGTERM end it with exit 1 and a line; --quiet; the bar on a terminal.
"""
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
QUEUES_GETS = re.compile(
    r'^muster_http_requests_total\{method="GET",route="/v1/queues",code="200"\} (\d+)$', re.M)


def read_file(path):
    with open(path, errors="replace") as f:
        return f.read()


class QueueWaitTest(harness.RestartableHeadCase, harness.CliChecks):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="muster-queue-wait-")
        self.procs = []

    def tearDown(self):
        for proc in self.procs:
            harness.stop_process(proc)
        super().tearDown()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def muster(self, *args):
        return subprocess.run([MUSTER] + list(args), capture_output=True, text=True,
                              env=harness.cli_env(self.head), timeout=60)

    def start(self, *args, name="wait"):
        """Runs `muster ARGS` in the background, its stderr into a file; returns the
        Popen, whose .err() reads that file."""
        path = os.path.join(self.tmp, "%s-%d.err" % (name, len(self.procs)))
        with open(path, "wb") as err:
            proc = subprocess.Popen([MUSTER] + list(args), env=harness.cli_env(self.head),
                                    stdout=subprocess.DEVNULL, stderr=err)
        proc.err = lambda: read_file(path)
        self.procs.append(proc)
        return proc

    def finish(self, proc, timeout=60):
        proc.wait(timeout)
        return proc.returncode, proc.err()

    def pipeline(self, *names, **settings):
        """Creates queues NAMES, each the `next` of the one before."""
        for i, name in reversed(list(enumerate(names))):
            args = ["queue", "create", name]
            if i + 1 < len(names):
                args += ["--next", names[i + 1]]
            for key, value in settings.items():
                args += ["--" + key.replace("_", "-"), str(value)]
            self.ok(*args)

    def counts(self, queue):
        return self.head.request("GET", "/v1/queues/" + queue).json["counts"]

    def queue_gets(self):
        return int(QUEUES_GETS.search(self.head.request("GET", "/metrics").raw.decode()).group(1))

    def looked_again(self, proc):
        """Waits until `proc` has looked at the queues after now and asked once more."""
        seen = self.queue_gets()
        harness.wait_until(lambda: self.queue_gets() >= seen + 2 or proc.poll() is not None,
                           what="two more looks at the queues")

    def lease_and_complete(self, queue):
        lease = self.head.request("POST", "/v1/queues/%s/lease" % queue, {}).json["leases"][0]
        r = self.head.request("POST", "/v1/leases/complete",
                              {"leases": [{"task": lease["task"], "token": lease["token"],
                                           "result": lease["payload"]}]})
        self.assertEqual(r.status, 200, r.raw)

    # ---- draining ----

    def test_a_pipeline_of_three_stages_drains_with_workers(self):
        self.pipeline("wa", "wb", "wc")
        self.ok("put", "--queue", "wa", *["t%d" % i for i in range(20)])
        waiter = self.start("queue", "wait", "wa", "--pipeline")
        # Its first look is the start it counts from: before any worker.
        harness.wait_until(lambda: "muster: waiting for" in waiter.err(), what="a first look")
        for queue in ("wa", "wb", "wc"):
            self.start("worker", "--queue", queue, "--", "tr", "a-z", "A-Z", name=queue)
        rc, err = self.finish(waiter)
        self.assertEqual(rc, 0, err)
        for queue in ("wa", "wb", "wc"):  # all of it, when the waiter said so
            self.assertEqual(self.counts(queue)["done"], 20, queue)
        self.assertIn("muster: queue wa and the queues after it (wb, wc) drained: 60 tasks done "
                      "since the start\n", err)
        self.assertIn("muster: waiting for queue wa and the queues after it (wb, wc): ", err)

    def test_tasks_that_die_meanwhile_fail_it_with_the_line(self):
        self.ok("queue", "create", "dies", "--max-attempts", "1")
        self.ok("put", "--queue", "dies", "before")  # dead before the wait: not counted
        self.start("worker", "--queue", "dies", "--max-tasks", "1", "--", "false").wait(60)
        self.assertEqual(self.counts("dies")["dead"], 1)
        self.ok("put", "--queue", "dies", "x", "y", "ok")
        waiter = self.start("queue", "wait", "dies")
        harness.wait_until(lambda: "muster: waiting for" in waiter.err(), what="a first look")
        self.start("worker", "--queue", "dies", "--", "sh", "-c", 'read p; [ "$p" = ok ]',
                   name="worker")
        rc, err = self.finish(waiter)
        self.assertEqual(rc, 1, err)
        self.assertIn("muster: queue dies drained, but 2 tasks ended failed or dead since the "
                      "start (2 in dies); see `muster tasks dead --queue dies`\n", err)

    def test_a_queue_no_one_serves_times_out_with_what_is_left(self):
        self.ok("queue", "create", "idle")
        self.ok("put", "--queue", "idle", "a", "b")
        self.ok("put", "--queue", "idle", "--delay-ms", "3600000", "later")  # counts too
        started = time.monotonic()
        err = self.fails(1, "queue", "wait", "idle", "--timeout-ms", "700")
        self.assertGreaterEqual(time.monotonic() - started, 0.7)
        self.assertIn("muster: --timeout-ms 700 passed waiting for queue idle to drain: 3 left "
                      "(idle: 3 queued, 0 leased)\n", err)
        # --quiet leaves out the progress, not the timeout.
        err = self.fails(1, "queue", "wait", "idle", "--timeout-ms", "1", "--quiet")
        self.assertEqual(err.count("\n"), 1, err)
        self.assertIn("--timeout-ms 1 passed", err)

    def test_a_head_restarted_while_it_waits(self):
        self.ok("queue", "create", "rs")
        self.ok("put", "--queue", "rs", "one")
        waiter = self.start("queue", "wait", "rs")
        harness.wait_until(lambda: "muster: waiting for" in waiter.err(), what="a first look")
        self.head.kill()
        harness.wait_until(lambda: "is unreachable or restarting" in waiter.err(),
                           what=lambda: "the waiter to notice: " + waiter.err())
        self.head.start()
        self.lease_and_complete("rs")
        rc, err = self.finish(waiter)
        self.assertEqual(rc, 0, err)
        self.assertIn("muster: the head at %s is unreachable or restarting; still waiting for "
                      "queue rs to drain" % self.head.url, err)
        self.assertIn("muster: the head at %s answers again; waiting on\n" % self.head.url, err)
        self.assertIn("muster: queue rs drained: 1 task done since the start\n", err)

    # ---- the chain ----

    def test_pipeline_waits_for_the_child_its_parent_made(self):
        self.pipeline("pa", "pb", "pc")
        self.ok("put", "--queue", "pa", "x")
        waiter = self.start("queue", "wait", "pa", "--pipeline")
        harness.wait_until(lambda: "muster: waiting for" in waiter.err(), what="a first look")
        for stage, following in (("pa", "pb"), ("pb", "pc")):
            self.lease_and_complete(stage)
            self.assertEqual(self.counts(following)["queued"], 1)
            # Stage `stage` is empty now, its child waits in `following`; without
            # --pipeline the command is done, with it the waiter looked and waits on.
            self.ok("queue", "wait", stage)
            self.looked_again(waiter)
            self.assertIsNone(waiter.poll(), waiter.err())
        self.lease_and_complete("pc")
        rc, err = self.finish(waiter)
        self.assertEqual(rc, 0, err)
        self.assertIn("drained: 3 tasks done since the start", err)

    def test_a_loop_of_next_ends_the_chain(self):
        self.ok("queue", "create", "la")
        self.ok("queue", "create", "lb", "--next", "la")
        self.ok("queue", "create", "la", "--next", "lb")
        err = self.ok_err("queue", "wait", "la", "--pipeline")
        self.assertIn("muster: queue la and the queues after it (lb) drained", err)

    def ok_err(self, *args):
        r = self.muster(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stderr

    # ---- refusals, signals, output ----

    def test_an_unknown_queue(self):
        err = self.fails(1, "queue", "wait", "nope")
        self.assertEqual(err, "muster: queue_not_found: queue 'nope' does not exist\n"
                              "muster: see `muster queue ls` for the queues there are\n")

    def test_bad_timeout_values(self):
        self.ok("queue", "create", "tq")
        for value, says in (("0", "must be at least 1, got 0"), ("-5", "must be at least 1"),
                            ("abc", "expected an integer, got 'abc'"), ("", "expected an integer"),
                            ("1.5", "expected an integer"),
                            ("315360000001", "must be at most 315360000000")):
            err = self.fails(2, "queue", "wait", "tq", "--timeout-ms", value)
            self.assertIn("muster: --timeout-ms: " + says, err)
        self.fails(2, "queue", "wait")
        self.fails(2, "queue", "wait", "tq", "other")

    def test_a_stop_signal_ends_it(self):
        self.ok("queue", "create", "sig")
        self.ok("put", "--queue", "sig", "a")
        for sig in (signal.SIGINT, signal.SIGTERM):
            waiter = self.start("queue", "wait", "sig")
            harness.wait_until(lambda: "muster: waiting for" in waiter.err(), what="a first look")
            waiter.send_signal(sig)
            rc, err = self.finish(waiter)
            self.assertEqual(rc, 1, err)
            self.assertIn("muster: stopped by a signal while waiting for queue sig to drain; 1 "
                          "tasks were left at the last look (sig: 1 queued, 0 leased)\n", err)

    def test_quiet_says_nothing_when_drained(self):
        self.ok("queue", "create", "qq")
        self.assertEqual(self.ok_err("queue", "wait", "qq", "--quiet"), "")
        self.assertEqual(self.ok_err("queue", "wait", "qq"),
                         "muster: queue qq drained: 0 tasks done since the start\n")

    def test_the_bar_on_a_terminal(self):
        self.ok("queue", "create", "tty")
        self.ok("put", "--queue", "tty", "a", "b")
        master, slave = os.openpty()
        proc = subprocess.Popen([MUSTER, "queue", "wait", "tty"], env=harness.cli_env(self.head),
                                stdout=subprocess.DEVNULL, stderr=slave)
        self.procs.append(proc)
        os.close(slave)
        chunks = []

        def drain():  # the terminal must be read while the command writes to it
            while True:
                ready, _, _ = select.select([master], [], [], 30)
                try:
                    data = os.read(master, 4096) if ready else b""
                except OSError:
                    data = b""
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain)
        reader.start()
        harness.wait_until(lambda: b"left: tty 2" in b"".join(chunks), what="the bar")
        self.lease_and_complete("tty")
        self.lease_and_complete("tty")
        proc.wait(60)
        reader.join(timeout=30)
        os.close(master)
        bar = b"".join(chunks).decode(errors="replace")
        self.assertEqual(proc.returncode, 0, bar)
        self.assertIn("\r[------------------------------] 0/2   0%", bar)
        self.assertIn("\r[##############################] 2/2 100%", bar)
        self.assertIn("\x1b[K", bar)
        self.assertIn("muster: queue tty drained: 2 tasks done since the start", bar)
        self.assertNotIn("muster: waiting for", bar)  # the lines are for logs


if __name__ == "__main__":
    unittest.main()
