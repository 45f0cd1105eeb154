"""examples/python/elastic_resume.py as its docstring runs it: 4 rank processes killed
with SIGKILL part-way through the epoch, then 3 ranks (which divide neither the
dataset nor 4) started again in the same directory: what the first run trained on
before its last complete set of states and what the second run trained on are each
sample of the epoch exactly once."""
import collections
import glob
import os
import signal
import subprocess
import sys

from common import ROOT, HeadTestCase, harness

EXAMPLE = os.path.join(ROOT, "examples", "python", "elastic_resume.py")
SAMPLES = 1000


class ElasticExampleTest(HeadTestCase):
    def ranks(self, directory, world, delay):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), WORLD_SIZE=str(world),
                   MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        return [subprocess.Popen([sys.executable, EXAMPLE, "--dir", directory, "--samples",
                                  str(SAMPLES), "--step-delay", str(delay)],
                                 env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
                for r in range(world)]

    def lines(self, path):
        with open(path) as f:
            return [int(x) for x in f.read().split()]

    def test_killed_on_4_ranks_resumed_on_3(self):
        directory = os.path.join(self.head.data_dir, "elastic-run")
        first = self.ranks(directory, 4, 0.01)
        try:
            def far_enough():
                files = glob.glob(directory + "/states-*/rank-*.json")
                return len([f for f in files if "states-30" in f]) == 4
            harness.wait_until(far_enough, timeout=60, what="4 ranks saved states at step 30")
        finally:
            for p in first:
                p.send_signal(signal.SIGKILL)
                p.communicate()
        steps = sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(directory + "/states-*"))
        complete = [s for s in steps
                    if len(glob.glob(directory + "/states-%d/rank-*.json" % s)) == 4]
        step = complete[-1]
        before = sum((self.lines(p)[:step] for p in glob.glob(directory + "/trained-0.*")), [])
        second = self.ranks(directory, 3, 0)
        for p in second:
            out = p.communicate(timeout=120)[0].decode()
            self.assertEqual(p.returncode, 0, out)
        after = sum((self.lines(p) for p in glob.glob(directory + "/trained-%d.*" % step)), [])
        self.assertEqual(len(glob.glob(directory + "/trained-%d.*" % step)), 3)
        counts = collections.Counter(before + after)
        self.assertEqual([i for i, n in counts.items() if n > 1], [], "trained on twice")
        self.assertEqual(sorted(counts), list(range(SAMPLES)), "never trained on")


if __name__ == "__main__":
    import unittest
    unittest.main()
