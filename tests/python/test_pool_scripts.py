"""Pools whose worker class is defined in the script that runs them (``__main__``), served
one after the other by the same long-lived worker, as a node agent's workers serve every
pool of their queue: the worker loads each script as ``__mp_main__``.

Found by walk-chaos: a worker that had served one script kept its first ``__mp_main__``,
so (1) a script edited and run again got the old code's results, (2) a second script
whose jobs return an instance of a class it defines had every job die ("Can't pickle
<class '__mp_main__.R'>: it's not the same object"), and (3) the pool's owner could not
read such a result even from a fresh worker (``No module named '__mp_main__'``)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from common import ROOT, HeadTestCase, harness

SCRIPT = '''import os
import sys
import time

import muster


class R:
    def __init__(self, v):
        self.v = v


class W(muster.WorkerInterface):
    def run(self, x):
        return %s


if __name__ == "__main__":
    with muster.Pool(W, url=sys.argv[1], token=sys.argv[2], queue=sys.argv[3]) as p:
        out = p.map([1, 2], timeout=60)
        print([r.v if isinstance(r, R) else r for r in out], flush=True)
        if len(sys.argv) > 4:   # a second call once told to: another pool ran meanwhile
            open(sys.argv[4] + ".first", "w").close()
            while not os.path.exists(sys.argv[4] + ".go"):
                time.sleep(0.02)
            print([r.v for r in p.map([3], timeout=60)])
'''


class PoolScriptsTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q, max_attempts=1)
        self.dir = tempfile.mkdtemp(prefix="muster-pool-scripts-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        log = open(os.path.join(self.dir, "worker.log"), "wb")
        self.addCleanup(log.close)
        worker = subprocess.Popen(
            [sys.executable, "-m", "muster.worker", "--queue", self.q, "--url",
             self.head.url, "--token", self.head.token], env=self.env,
            stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(harness.stop_process, worker)
        harness.wait_until(lambda: len(self.c.workers()) >= 1, what="the worker")

    def start_script(self, name, result, *more):
        """Writes script `name` whose jobs return `result` (Python text of x) and starts it
        (`more`: its further arguments); returns the process, its output piped."""
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(SCRIPT % result)
        proc = subprocess.Popen([sys.executable, path, self.head.url, self.head.token, self.q]
                                + list(more), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        self.addCleanup(harness.stop_process, proc)
        return proc

    def run_script(self, name, result):
        """start_script to its end: what it printed (the results, or the error)."""
        return self.start_script(name, result).communicate(timeout=120)[0].decode()

    def test_one_worker_serves_edited_and_other_scripts(self):
        self.assertEqual(self.run_script("a.py", '"v1"').strip(), "['v1', 'v1']")
        # The same script edited (its size changes too): the new code runs.
        self.assertEqual(self.run_script("a.py", '"v2-edited"').strip(),
                         "['v2-edited', 'v2-edited']")
        # Another script returning an instance of its own class: pickled by the worker,
        # read by the owner.
        self.assertEqual(self.run_script("b.py", "R(x * 10)").strip(), "[10, 20]")
        # And the first script's class again, after the second's.
        self.assertEqual(self.run_script("a.py", "R(x + 100)").strip(), "[101, 102]")

    def test_one_worker_between_two_open_pools(self):
        """Pool b has an instance on the worker when pool c's runs; b's next job then
        runs with c's script loaded last, and its result is still b's class."""
        mark = os.path.join(self.dir, "b")
        b = self.start_script("b.py", "R(x * 10)", mark)
        harness.wait_until(lambda: os.path.exists(mark + ".first") or b.poll() is not None,
                           timeout=60, what="pool b's first call")
        self.assertEqual(self.run_script("c.py", "R(x + 1)").strip(), "[2, 3]")
        open(mark + ".go", "w").close()
        self.assertEqual(b.communicate(timeout=120)[0].decode().split("\n")[:2],
                         ["[10, 20]", "[30]"])


if __name__ == "__main__":
    unittest.main()
