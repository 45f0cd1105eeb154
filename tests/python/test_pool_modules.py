"""Pools whose worker class comes from a module of the user's (``from mymodels import
Scorer``), served one after the other by the same long-lived worker, with the module
edited between two runs.

Python imports a module once per process, so a worker's resident process kept the first
run's ``mymodels`` and ran the edited code's pool on the old code: stale results, no
warning.  A new session whose code changed since the process imported it now runs in a
new resident process (an old one keeps its open sessions, which finish on the old code);
an unchanged module keeps the process.  A standalone worker starts itself again."""
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from common import ROOT, HeadTestCase, harness

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import node_harness  # noqa: E402

MODULE = '''import os

import helpers
import muster


class Scorer(muster.WorkerInterface):
    def run(self, x):
        return [%r, helpers.TAG, x, os.getpid(), helpers.TOKEN]
'''

HELPERS = '''import uuid

TAG = %r
TOKEN = uuid.uuid4().hex   # one per import: a module imported again has another
'''

SCRIPT = '''import os
import sys
import time

import muster
from mymodels import Scorer

if __name__ == "__main__":
    with muster.Pool(Scorer, url=sys.argv[1], token=sys.argv[2], queue=sys.argv[3]) as p:
        print(p.map([1, 2], timeout=60), flush=True)
        if len(sys.argv) > 4:   # a second call once told to: another pool ran meanwhile
            open(sys.argv[4] + ".first", "w").close()
            while not os.path.exists(sys.argv[4] + ".go"):
                time.sleep(0.02)
            print(p.map([3], timeout=60), flush=True)
'''

SAID = "changed since the worker's Python process"


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class ModulesCase(HeadTestCase):
    """A directory with mymodels.py, helpers.py and the owner's script run.py."""

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q, max_attempts=1)
        self.dir = tempfile.mkdtemp(prefix="muster-pool-modules-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        self.write("run.py", SCRIPT)
        self.write("helpers.py", HELPERS % "h1")

    def write(self, name, text):
        """Writes `name`; an edit is of another size, so it is seen whatever the clock."""
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def version(self, tag):
        self.write("mymodels.py", MODULE % tag)

    def start(self, *more):
        proc = subprocess.Popen([sys.executable, os.path.join(self.dir, "run.py"),
                                 self.head.url, self.head.token, self.q] + list(more),
                                env=self.env, cwd=self.dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        self.addCleanup(harness.stop_process, proc)
        return proc

    def results(self, proc):
        """The lists the script printed, one per map call."""
        out = self.output(proc)
        try:
            return [ast.literal_eval(line) for line in out.splitlines() if line]
        except (ValueError, SyntaxError):
            self.fail("the pool's script said:\n" + out)

    def output(self, proc):
        return proc.communicate(timeout=120)[0].decode()

    def run_pool(self):
        """Runs a pool of two jobs; returns (module tag, helpers tag, pid, token): each
        job's must be the same (one worker)."""
        (out,) = self.results(self.start())
        self.assertEqual([r[2] for r in out], [1, 2])
        got = {(r[0], r[1], r[3], r[4]) for r in out}
        self.assertEqual(len(got), 1, got)
        return got.pop()


class ResidentModulesTest(ModulesCase):
    """One node agent with one worker: every pool runs on its resident processes."""

    def setUp(self):
        super().setUp()
        self.work = tempfile.mkdtemp(prefix="muster-pool-modules-work-")
        self.addCleanup(shutil.rmtree, self.work, True)
        self.agent = node_harness.Agent(
            self.head, self.work, name="modules-node", args=["--queue", self.q, "--workers", "1"],
            cmd=["/usr/bin/python3", "-m", "muster.worker"],
            env={"PYTHONPATH": os.path.join(ROOT, "python"), "TMPDIR": self.work}).start()
        self.addCleanup(self.agent.stop)

    def said(self):
        return [line for line in self.agent.log().splitlines() if SAID in line]

    def test_an_edited_module_runs_in_a_new_process(self):
        self.version("v1")
        v1 = self.run_pool()
        self.assertEqual(v1[:2], ("v1", "h1"))
        self.version("v2-edited")
        v2 = self.run_pool()
        self.assertEqual(v2[:2], ("v2-edited", "h1"))
        self.assertNotEqual(v2[2], v1[2])
        # The old process had no open session left: it is gone, not kept for nothing.
        harness.wait_until(lambda: not alive(v1[2]), timeout=20, what="the old resident")
        self.assertEqual(len(self.said()), 1, self.agent.log())
        self.assertIn(os.path.join(os.path.realpath(self.dir), "mymodels.py") + " " + SAID,
                      self.said()[0])
        self.assertIn("the old one had no open session left and exited", self.said()[0])
        # A module the class's module imports counts too.
        self.write("helpers.py", HELPERS % "h2-edited")
        v3 = self.run_pool()
        self.assertEqual(v3[:2], ("v2-edited", "h2-edited"))
        self.assertNotEqual(v3[2], v2[2])
        self.assertIn("helpers.py " + SAID, self.said()[1])

    def test_a_module_that_fails_to_import_then_is_fixed(self):
        """An edit that breaks the module fails the pool's jobs with the error (in a new
        process); the fix then runs, though that process saw the module fail."""
        self.version("v1")
        v1 = self.run_pool()
        # Broken where a resident imports it, not in the owner's script.
        self.write("mymodels.py", 'import sys\nif "muster.worker_resident" in sys.modules:\n'
                   '    raise ImportError("broken on the worker")\n' + MODULE % "v2")
        out = self.output(self.start())
        self.assertIn("TaskError", out)
        self.assertIn("ImportError: broken on the worker", out)
        self.version("v3-fixed")
        v3 = self.run_pool()
        self.assertEqual(v3[:2], ("v3-fixed", "h1"))
        self.assertNotEqual(v3[2], v1[2])

    def test_an_unchanged_module_keeps_the_process(self):
        self.version("v1")
        first = self.run_pool()
        self.write("run.py", SCRIPT + "# the owner's script changed, not the module\n")
        self.assertEqual(self.run_pool(), first)   # same pid, helpers not imported again
        self.assertEqual(self.said(), [])

    def test_two_pools_open_at_once_on_two_versions(self):
        """Pool a keeps its session open while the module is edited and pool b runs: b
        gets the new code in a new process, a's next call still the old code in its own.
        Once a closed, the old process exits as b's tasks pass by it."""
        self.version("v1")
        mark = os.path.join(self.dir, "a")
        a = self.start(mark)
        harness.wait_until(lambda: os.path.exists(mark + ".first") or a.poll() is not None,
                           timeout=60, what="pool a's first call")
        self.version("v2-edited")
        b = self.run_pool()
        self.assertEqual(b[0], "v2-edited")
        self.assertIn("the old one finishes session s-", self.said()[0])
        open(mark + ".go", "w").close()
        first, second = self.results(a)
        self.assertEqual({r[0] for r in first + second}, {"v1"})
        old = first[0][3]
        self.assertEqual({r[3] for r in first + second}, {old})
        self.assertNotEqual(old, b[2])
        self.assertTrue(alive(b[2]))
        # Pool a is closed: the next task of another pool that asks the old process
        # finds it has no session left, and it exits; the new one runs on.
        harness.wait_until(lambda: self.run_pool()[2] == b[2] and not alive(old),
                           timeout=60, what="the old resident to exit")
        self.assertEqual(len(self.said()), 1, self.agent.log())


class StandaloneModulesTest(ModulesCase):
    """``python3 -m muster.worker --queue Q``: one process, which starts itself again."""

    def setUp(self):
        super().setUp()
        self.log_path = os.path.join(self.dir, "worker.log")
        log = open(self.log_path, "wb")
        self.addCleanup(log.close)
        worker = subprocess.Popen(
            [sys.executable, "-m", "muster.worker", "--queue", self.q, "--url",
             self.head.url, "--token", self.head.token], env=self.env,
            stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(harness.stop_process, worker)
        harness.wait_until(lambda: len(self.c.workers()) >= 1, what="the worker")

    def said(self):
        with open(self.log_path, errors="replace") as f:
            return [line for line in f if "changed since this worker imported it" in line]

    def test_an_edited_module_restarts_the_worker(self):
        self.version("v1")
        v1 = self.run_pool()
        self.assertEqual(self.run_pool(), v1)   # unchanged: the same import
        self.assertEqual(self.said(), [])
        self.version("v2-edited")
        v2 = self.run_pool()
        self.assertEqual(v2[:2], ("v2-edited", "h1"))
        self.assertEqual(v2[2], v1[2])   # exec: the same process, started again
        self.assertNotEqual(v2[3], v1[3])
        self.assertEqual(len(self.said()), 1)
        self.assertIn("mymodels.py", self.said()[0])


if __name__ == "__main__":
    unittest.main()
