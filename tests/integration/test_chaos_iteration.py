"""A training job's data stream outlives its head and a resume on fewer ranks.

The iteration twin of test_chaos.py (which kills a worker, a node agent and the head
during one `muster map`).  4 ranks of a training job (chaos_rank.py: the coordinated
sampler, what DistributedSampler(coordinated=True) runs) read an epoch of 2,000
samples of a coordinated iteration in steps, gathering every rank's state as a
checkpoint every 4 steps, each found mid-block.  The head is killed with kill -9 just
before one checkpoint: every rank asked for its state waits for it (says so), and the
checkpoint is taken once the head is back on its data dir.  A few steps later the job
is killed (kill -9 of every rank) and resumed from the last checkpoint on 3 ranks.
Check: the indices read before that checkpoint and those read after the resume are
every sample of the epoch exactly once; the resumed iteration is finished; the head
leaves no sanitizer report (an ASan build's) at its clean stop.

The kill points come from a seed, printed; MUSTER_CHAOS_SEED=N repeats a run.
MUSTER_BIN names the binary (ctest sets it).
"""
import collections
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "chaos_rank.py")
sys.path.insert(0, HERE)
import harness  # noqa: E402

SEED = int(os.environ.get("MUSTER_CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
SAMPLES, BLOCK, STEP = 2000, 16, 11  # the epoch; a step reads STEP indices per rank
# (a checkpoint every 4 steps finds every rank mid-block: 44k is no multiple of 16)
CHECKPOINT_EVERY = 4  # steps


def log(*args):
    print(*args, flush=True)


def sanitizer_reports(paths):
    """The logs among `paths` that hold a sanitizer's report (an ASan build's)."""
    found = []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                if "Sanitizer" in f.read():
                    found.append(path)
        except OSError:
            pass
    return found



class Rank:
    """A chaos_rank.py process (one rank of the job); a thread reads its lines, and
    `read` holds the indices it yielded, in order."""

    def __init__(self, head, tmp, rank, world, seed):
        with open(os.path.join(tmp, "rank%d-of-%d.log" % (rank, world)), "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, RANK, head.url, head.token, "train", str(rank), str(world),
                 str(SAMPLES), str(BLOCK), str(seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self.rank, self.world = rank, world
        self.lines = queue.Queue()
        self.read = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, *words, timeout=60):
        """Reads lines (keeping the indices) up to the first starting with one of
        `words`, and returns it."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError("rank %d of %d: no %s within %d s" %
                                     (self.rank, self.world, "/".join(words), timeout))
            if line is None:
                raise AssertionError("rank %d of %d ended (status %s) waiting for %s" %
                                     (self.rank, self.world, self.proc.wait(), "/".join(words)))
            if line.startswith("i "):
                self.read.append(int(line[2:]))
            elif line.split(" ", 1)[0] in words:
                return line

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=10)
        self.proc.stdin.close()
        self.proc.stdout.close()


class ChaosIterationTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-chaos-iter-")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()])
        self.ranks = []
        self.addCleanup(self.cleanup)

    def cleanup(self):
        for r in self.ranks:
            if r.proc.poll() is None:
                r.kill()
        self.head.stop()  # not kill: a sanitizer build checks for leaks at a clean exit
        reports = sanitizer_reports([self.head.log_path])
        self.head.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertEqual(reports, [], "sanitizer reports in the head's log")

    def start_ranks(self, world, seed):
        ranks = [Rank(self.head, self.tmp, r, world, seed) for r in range(world)]
        self.ranks += ranks
        return ranks

    def test_epoch_outlives_the_head_and_a_resume_on_fewer_ranks(self):
        rng = random.Random("iteration %d" % SEED)
        log("seed %d (MUSTER_CHAOS_SEED=%d repeats this run)" % (SEED, SEED))
        head_kill = rng.choice([2, 3])  # before which checkpoint the head dies
        job_kill = CHECKPOINT_EVERY * head_kill + rng.randint(1, 6)  # after which step
        log("the head dies before checkpoint %d (step %d), the job after step %d" %
            (head_kill, CHECKPOINT_EVERY * head_kill, job_kill))
        self.head.start()
        try:
            states, before = self.first_job(rng.randrange(1 << 32), head_kill, job_kill)
            after = self.resumed_job(states)
        except Exception:
            log("---- head log (tail) ----\n" + self.head.log())
            raise
        counts = collections.Counter(before + after)
        twice = sorted(i for i, n in counts.items() if n > 1)
        missing = sorted(set(range(SAMPLES)) - set(counts))
        log("%d indices read before the last checkpoint, %d after the resume on 3 ranks" %
            (len(before), len(after)))
        self.assertEqual((twice[:10], missing[:10]), ([], []),
                         "indices read twice (first 10), never read (first 10)")
        self.assertEqual(len(before) + len(after), SAMPLES)

    def first_job(self, seed, head_kill, job_kill):
        """4 ranks read in steps, checkpointing every CHECKPOINT_EVERY steps, the head
        killed before checkpoint `head_kill`; the job is killed after step `job_kill`.
        Returns the last checkpoint (every rank's state) and the indices read before it."""
        self.seed = seed
        ranks = self.start_ranks(4, seed)
        states, consumed = None, None
        for step in range(1, job_kill + 1):
            for r in ranks:
                r.send("take %d" % STEP)
            for r in ranks:
                self.assertEqual(r.expect("took", "end"), "took", "the epoch ended early")
            if step % CHECKPOINT_EVERY or step == job_kill:
                continue
            if step == CHECKPOINT_EVERY * head_kill:
                states = self.checkpoint_across_head_restart(ranks)
            else:
                states = self.checkpoint(ranks)
            consumed = [len(r.read) for r in ranks]
            log("checkpoint after step %d: %s indices read per rank" % (step, consumed))
        log("kill -9 of the job's 4 ranks after step %d (%s indices read per rank)" %
            (job_kill, [len(r.read) for r in ranks]))
        for r in ranks:
            r.kill()
        return states, [i for r, n in zip(ranks, consumed) for i in r.read[:n]]

    def checkpoint(self, ranks):
        for r in ranks:
            r.send("state")
        return [json.loads(r.expect("state").split(" ", 1)[1]) for r in ranks]

    def checkpoint_across_head_restart(self, ranks):
        """kill -9 of the head; every rank asked for its state waits for it (says
        "retrying"); the head starts again and the states come."""
        log("kill -9 of the head (pid %d) mid-epoch, before a checkpoint" % self.head.proc.pid)
        self.head.kill()
        for r in ranks:
            r.send("state")
        for r in ranks:
            r.expect("retrying")
        self.head.start()
        log("head started again on its data dir; every rank had waited for it")
        return [json.loads(r.expect("state").split(" ", 1)[1]) for r in ranks]

    def resumed_job(self, states):
        """3 ranks load every rank's last state and read the rest of the epoch."""
        ranks = self.start_ranks(3, self.seed)
        for r in ranks:
            r.send("load " + json.dumps(states))
            r.send("rest")
        for r in ranks:
            r.expect("end")
        resumed = [it for it in self.head.request("GET", "/v1/iterations").json["iterations"]
                   if it["name"] != "train"]
        self.assertEqual(len(resumed), 1, resumed)
        self.assertTrue(resumed[0]["finished"], resumed[0])
        for r in ranks:
            r.proc.stdin.close()  # the end of its commands: the rank closes its sampler
            self.assertEqual(r.proc.wait(timeout=30), 0)
            r.reader.join(timeout=10)
            r.proc.stdout.close()
        return [i for r in ranks for i in r.read]


if __name__ == "__main__":
    unittest.main()
