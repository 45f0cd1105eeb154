"""The examples of examples/python, run as their users run them."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

from common import ROOT, HeadTestCase

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import node_harness  # noqa: E402

EXAMPLES = os.path.join(ROOT, "examples", "python")
PY = "/usr/bin/python3"

try:
    import torch  # noqa: F401
except ImportError:
    torch = None


def env():
    return dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))


def run(args, timeout=60):
    p = subprocess.run([PY] + args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s" % (args, p.returncode, p.stdout.decode(errors="replace")))
    return p.stdout.decode()


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.01)


class ExamplesTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        self.work = tempfile.mkdtemp(prefix="muster-examples-")
        self.addCleanup(shutil.rmtree, self.work, True)

    def test_pipeline_worker(self):
        ex = os.path.join(EXAMPLES, "pipeline_worker.py")
        common = ["--url", self.head.url, "--token", self.head.token]
        run([ex] + common + ["--setup", "--seed", "6"])
        for stage in "abc":
            out = run([ex] + common + ["--stage", stage, "--max-jobs", "6"])
            self.assertIn("6 jobs", out)
        done = list(self.c.iter_tasks("filter", state="done"))
        self.assertEqual(sorted(t["result"]["page"] for t in done), list(range(6)))
        self.assertEqual([t["result"]["keep"] for t in sorted(done, key=lambda t: t["result"]["page"])],
                         [True, False] * 3)

    def test_pool_update(self):
        queue = "pool-example"
        self.c.put_queue(queue)
        agent = node_harness.Agent(self.head, self.work, name="examples-node",
                                   args=["--queue", queue, "--workers", "2"],
                                   cmd=[PY, "-m", "muster.worker"],
                                   env={"PYTHONPATH": os.path.join(ROOT, "python"), "TMPDIR": self.work})
        agent.start()
        self.addCleanup(agent.stop)
        wait_until(lambda: len([w for w in self.c.workers() if w["state"] == "active"
                                and queue in w["queues"]]) == 2, what="2 workers")
        t0 = time.monotonic()
        out = run([os.path.join(EXAMPLES, "pool_update.py"), "--url", self.head.url, "--token",
                   self.head.token, "--queue", queue])
        print("pool_update took", time.monotonic() - t0)
        self.assertIn("workers: 2 on 1 node(s)", out)
        self.assertIn("best: (42, 0)", out)

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_training_killed_mid_epoch_resumes_exactly(self):
        self.kill_and_resume([])

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_training_coordinated_killed_mid_epoch_resumes_exactly(self):
        self.kill_and_resume(["--url", self.head.url, "--token", self.head.token, "--name", "train-kill"])

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_training_coordinated_with_loader_workers_killed_resumes_exactly(self):
        """DataLoader workers take indices ahead of the step, and the blocks they fill are
        acknowledged before the model trains on them: the sampler's state without
        consumed= lost those samples at a kill."""
        self.kill_and_resume(["--url", self.head.url, "--token", self.head.token, "--name",
                              "train-workers", "--workers", "2"])

    def kill_and_resume(self, extra):
        n, epochs = 128, 2
        d = os.path.join(self.work, "run")
        args = [os.path.join(EXAMPLES, "train_resume.py"), "--dir", d, "--samples", str(n),
                "--epochs", str(epochs), "--batch", "4"] + extra
        progress = os.path.join(d, "progress.json")

        def read_progress():
            try:
                with open(progress) as f:
                    return json.load(f)
            except (OSError, ValueError):
                return None

        p = subprocess.Popen([PY] + args + ["--step-delay", "0.05"], env=env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # kill it early in the first epoch (32 steps an epoch here)
            wait_until(lambda: (read_progress() or {}).get("step", 0) >= 4 or p.poll() is not None,
                       timeout=60, what="training progress")
            os.kill(p.pid, signal.SIGKILL)
        finally:
            p.wait()
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        self.assertEqual(p.returncode, -signal.SIGKILL, err)
        at_kill = read_progress()
        self.assertLess(at_kill["in_epoch"], n)   # mid-epoch
        self.assertFalse(os.path.exists(os.path.join(d, "done.json")))
        out = run(args, timeout=120)
        self.assertIn("resumed at step", out)
        with open(os.path.join(d, "done.json")) as f:
            done = json.load(f)
        self.assertEqual(done["step"], epochs * n // 4)
        for epoch in range(epochs):
            seen = done["seen"][str(epoch)]
            self.assertEqual(len(seen), n, "epoch %d: a sample repeated or skipped" % epoch)
            self.assertEqual(sorted(seen), list(range(n)))


if __name__ == "__main__":
    unittest.main()
