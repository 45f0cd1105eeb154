"""`muster map` outlasting its head: kill -9 mid-map, restart, and map carries on.

The head listens on a fixed port (picked free at the start) so a restart on the same
data dir is reachable at the same URL.  One `muster worker` squares numbers; inputs
above GATED wait until the test creates a gate file, so map is mid-run (GATED results
printed, the rest held back) when the head is killed, whatever the machine's speed.
Checks: map exits 0 and prints every result exactly once and in input order, saying
it retried; and when the head does not come back within the session's timeout, map
exits 1 naming the session and the `muster session results` command that reads the
rest from where it stopped.  A proxy that answers map's first submissions 503 (a head
stopping) checks that submitting is tried again too.  The same runs through a node
agent (map given the agent's URL), whose words name the agent: it answers again, and
the head behind it is what map gave up on.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
QUEUE = "sq"
INPUTS = 300
GATED = 100  # inputs 1..GATED run at once; the others wait for the gate file


class MapHeadRestartTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-map-restart-")
        self.gate = os.path.join(self.tmp, "gate")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()])
        self.head.start()
        self.env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        subprocess.run([MUSTER, "queue", "create", QUEUE], env=self.env, check=True,
                       stdout=subprocess.DEVNULL)
        square = ('read x; if [ "$x" -gt %d ]; then while [ ! -e %s ]; do sleep 0.02; done; fi;'
                  ' echo $((x * x))' % (GATED, self.gate))
        self.worker_log = open(os.path.join(self.tmp, "worker.log"), "wb")
        self.worker = subprocess.Popen(
            [MUSTER, "worker", "--queue", QUEUE, "--concurrency", "2", "--", "sh", "-c", square],
            env=self.env, stdout=self.worker_log, stderr=subprocess.STDOUT)
        self.lines = []
        self.back = "muster: the head at %s answers again; carrying on\n" % self.head.url
        self.away = "without an answer from the head at %s: " % self.head.url

    def tearDown(self):
        open(self.gate, "w").close()  # lets the worker's held commands end
        self.worker.terminate()
        self.worker.wait(timeout=30)
        self.worker_log.close()
        self.head.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_map(self, *extra):
        """Starts map on INPUTS inputs; a thread collects its stdout lines."""
        proc = subprocess.Popen([MUSTER, "map", "--queue", QUEUE, "--ordered"] + list(extra),
                                env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        proc.stdin.write("".join("%d\n" % i for i in range(1, INPUTS + 1)))
        proc.stdin.close()

        def read():
            for line in proc.stdout:
                self.lines.append(line.rstrip("\n"))

        self.reader = threading.Thread(target=read)
        self.reader.start()
        harness.wait_until(lambda: len(self.lines) >= GATED or proc.poll() is not None,
                           timeout=60, what="map to print the ungated results")
        if proc.poll() is not None:
            self.fail("map ended early: %s" % proc.stderr.read())
        self.assertEqual(len(self.lines), GATED)
        return proc

    def finish_map(self, proc):
        stderr = proc.stderr.read()
        proc.wait(timeout=120)
        self.reader.join(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        return stderr

    def test_map_survives_head_kill_and_restart(self):
        proc = self.start_map("--timeout-ms", "60000")
        self.head.kill()
        self.head.start()
        open(self.gate, "w").close()
        stderr = self.finish_map(proc)
        self.assertEqual(proc.returncode, 0, stderr)
        self.assertEqual(self.lines, [str(i * i) for i in range(1, INPUTS + 1)], stderr)
        self.assertIn("retrying every second", stderr)
        self.assertIn(self.back, stderr)

    def test_map_gives_up_naming_the_session(self):
        proc = self.start_map("--timeout-ms", "2000")
        url = self.env["MUSTER_URL"]
        self.head.kill()
        stderr = self.finish_map(proc)
        self.assertEqual(proc.returncode, 1, stderr)
        self.assertEqual(len(self.lines), GATED)
        self.assertIn("retrying every second for up to 2 s; session s-", stderr)
        session = stderr.split("session s-", 1)[1].split(")", 1)[0]
        self.assertIn(self.away, stderr)
        self.assertIn("%d of %d results were printed" % (GATED, INPUTS), stderr)
        self.assertIn("muster session results s-%s --url %s --cursor %d --follow --values"
                      % (session, url, GATED), stderr)


class MapThroughAgentTest(MapHeadRestartTest):
    """The tests above with map talking to a node agent, which forwards to the head: the
    worker still talks to the head.  Map said "the head answers again" when the agent
    did, and gave up "without an answer from the head" when the agent answered all
    along (unavailable: it cannot reach the head)."""

    def setUp(self):
        super().setUp()
        self.agent = node_harness.Agent(self.head, self.tmp, "map", args=[
            "--cache-dir", os.path.join(self.tmp, "cache"),
            "--state-dir", os.path.join(self.tmp, "state")]).start()
        self.env = dict(self.env, MUSTER_URL=self.agent.url)
        self.back = "muster: the node agent at %s answers again; carrying on\n" % self.agent.url
        self.away = ("without an answer from the head behind the node agent at %s: node agent "
                     "map cannot reach the head" % self.agent.url)

    def tearDown(self):
        self.agent.kill()
        super().tearDown()


class MapSubmitRetryTest(unittest.TestCase):
    def test_submissions_outlast_an_unavailable_head(self):
        # The first two submissions meet a head that answers 503 (stopping, as in a
        # restart): map tries again, a second later the third is forwarded, and every
        # result arrives once, in order.
        head = harness.Head().start()
        self.addCleanup(head.cleanup)
        unavailable = {"error": {"code": "unavailable", "message": "the head is shutting down"}}
        proxy = harness.SubmissionProxy(head, lambda n: (503, unavailable) if n <= 2 else "forward")
        self.addCleanup(proxy.close)
        env = dict(os.environ, MUSTER_URL=proxy.url, MUSTER_TOKEN=head.token)
        subprocess.run([MUSTER, "queue", "create", QUEUE], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        worker = subprocess.Popen([MUSTER, "worker", "--queue", QUEUE, "--", "sh", "-c",
                                   "read x; echo $((x * x))"], env=dict(env, MUSTER_URL=head.url),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: (worker.terminate(), worker.wait(30)))
        r = subprocess.run([MUSTER, "map", "--queue", QUEUE, "--ordered"], env=env,
                           input="".join("%d\n" % i for i in range(1, 21)), text=True,
                           capture_output=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), [str(i * i) for i in range(1, 21)], r.stderr)
        self.assertEqual(proxy.submissions, 3, r.stderr)


if __name__ == "__main__":
    unittest.main()
