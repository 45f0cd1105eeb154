"""libmuster's muster_pool_map outlasting its head: kill -9 mid-map, restart, and map
carries on, as `muster map` and the Python pool do (docs/pools.md, "Exactly once").

The C twin of test_cli_map_restart.py, through driver_pool_map (a C program calling
muster_pool_map).  The head listens on a fixed port so a restart on the same data dir is
reachable at the same URL.  One `muster worker` squares numbers; inputs above GATED wait
for a gate file, so map is mid-run (GATED results in, the rest held back) when the head is
killed.  Checks: map returns every result once, in input order, across a kill -9 and a
restart (it used to fail at once with `network`, every result read so far lost with the
iterator it had freed); and when the head does not come back within the session's
timeout, map fails with `network`, saying how long it tried and naming the session;
muster_pool_map_partial then hands back the results it read, marking the others, which
the driver maps again once the head is back (only those: every result comes once).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
DRIVER = os.path.join(os.path.dirname(MUSTER), "driver_pool_map")
QUEUE = "cq"
INPUTS = 300
GATED = 100  # inputs 1..GATED run at once; the others wait for the gate file


class CPoolMapRestartTest(harness.RestartableHeadCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="muster-cpool-restart-")
        self.gate = os.path.join(self.tmp, "gate")
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        subprocess.run([MUSTER, "queue", "create", QUEUE], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        square = ('read x; if [ "$x" -gt %d ]; then while [ ! -e %s ]; do sleep 0.02; done; fi;'
                  ' echo $((x * x))' % (GATED, self.gate))
        self.worker_log = open(os.path.join(self.tmp, "worker.log"), "wb")
        self.worker = subprocess.Popen(
            [MUSTER, "worker", "--queue", QUEUE, "--concurrency", "2", "--json-result", "--",
             "sh", "-c", square],
            env=env, stdout=self.worker_log, stderr=subprocess.STDOUT)

    def tearDown(self):
        open(self.gate, "w").close()  # lets the worker's held commands end
        self.worker.terminate()
        self.worker.wait(timeout=30)
        self.worker_log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def start_driver(self, url, timeout_ms, *extra):
        """Starts the driver's map through `url`; returns it and its session."""
        proc = subprocess.Popen([DRIVER, url, self.head.token, QUEUE, str(INPUTS),
                                 str(timeout_ms)] + list(extra), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        first = proc.stdout.readline()
        if not first.startswith("session s-"):  # the open failed: the driver said why
            self.fail(first + proc.communicate(timeout=60)[0])
        return proc, first.split()[1]

    def start_map(self, timeout_ms):
        """Starts the driver's map; returns it once GATED results are in the session."""
        proc, session = self.start_driver(self.head.url, timeout_ms)

        def gated_done():
            counts = self.head.request("GET", "/v1/sessions/" + session).json["counts"]
            return counts["done"] >= GATED
        harness.wait_until(gated_done, timeout=60, what="the ungated inputs' results")
        return proc, session

    def test_map_survives_head_kill_and_restart(self):
        proc, _ = self.start_map(60000)
        self.head.kill()
        self.head.start()
        open(self.gate, "w").close()
        out = proc.communicate(timeout=120)[0]
        self.assertEqual(proc.returncode, 0, out[-2000:])
        self.assertEqual(out.splitlines(),
                         ["result %d" % (i * i) for i in range(1, INPUTS + 1)], out[-2000:])

    def test_map_gives_up_after_the_session_timeout(self):
        proc, session = self.start_map(2000)
        self.head.kill()
        out = proc.communicate(timeout=60)[0]
        self.assertEqual(proc.returncode, 1, out)
        self.assertTrue(out.startswith("error network "), out)
        self.assertIn("the session's timeout_ms; session %s)" % session, out)
        self.assertIn("sent again every second for ", out)

    def test_map_partial_keeps_what_it_read(self):
        # Through a proxy, which shows where the driver reads: once it asks for index
        # GATED (input GATED + 1, held back by the gate), it has read every result
        # before it, so the head is killed with exactly GATED results read.
        self.proxy = harness.RequestProxy(self.head, lambda method, path: False, None)
        self.proxy.server.handle_error = lambda request, address: None  # the head killed
        proc, _ = self.start_driver(self.proxy.url, 2000, "partial")
        reading_gated = "/results?order=submission&cursor=%d&" % GATED
        harness.wait_until(lambda: any(reading_gated in t for t in self.proxy.targets),
                           timeout=60, what="the driver to read past the ungated results")
        self.head.kill()
        said, kept = proc.stdout.readline(), proc.stdout.readline()
        self.assertTrue(said.startswith("error network "), said + kept)
        self.assertIn("sent again every second for ", said)
        self.assertEqual(kept, "kept %d unread %d\n" % (GATED, INPUTS - GATED))
        self.head.start()
        open(self.gate, "w").close()
        out = proc.communicate("again\n", timeout=120)[0]
        self.assertEqual(proc.returncode, 0, out[-2000:])
        self.assertEqual(out.splitlines(),
                         ["result %d" % (i * i) for i in range(1, INPUTS + 1)], out[-2000:])


if __name__ == "__main__":
    unittest.main()
