"""Resuming a data stream where it stopped on another number of ranks, as a user does it
when a run fails more than once (docs/python.md, "Coordinated iterations without
PyTorch" and "Elastic resume (standalone, version 1)"):

- the same saved states resumed into 2 ranks, that run stopping part-way, then resumed
  again into 3 ranks (which divide neither the dataset nor the old world size): the
  second resume reads every sample not read before the states exactly once, as the
  first would have;
- resumed again into the same world size, the resume goes on where the first one's
  ranks left it (its name is a function of the states and the world size), and each
  rank that had read in it says so with a WARNING rather than silently reading less;
- the standalone engine (muster.sampling.RankSampler, the torch-free heart of
  muster.torch.DistributedSampler) resumed from 4 ranks into 3, with pad and drop
  tails: exactly once (plus the documented padding), the same order on every resume;
- a standalone position (muster.iteration.Stream, the C loader's checkpoint) refused by
  another rank or world size says which, and where elastic resume lives."""
import collections
import json
import logging
import unittest

from common import HeadTestCase, muster
from muster.iteration import Plan, Stream
from muster.sampling import RankSampler

N = 203
BLOCK = 8


def read_all(streams):
    """Reads the ranks' current epoch to its end, round robin one index at a time (no rank
    waits on another: with `wait=False` a rank ends its epoch when nothing is left)."""
    its = [iter(s) for s in streams]
    out = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for r in sorted(live):
            index = next(its[r], None)
            if index is None:
                live.discard(r)
            else:
                out[r].append(index)
    return out


def read_some(streams, count):
    """Each rank reads `count` indices; returns what each read."""
    out = []
    for s in streams:
        it = iter(s)
        out.append([next(it) for _ in range(count)])
    return out


class CoordinatedResumeAgainTest(HeadTestCase):
    def streams(self, name, world):
        return [muster.CoordinatedStream(name, N, r, world, client=self.c, shuffle="global",
                                         seed=9, block_size=BLOCK, epochs=1, wait=False)
                for r in range(world)]

    def saved_states(self, name):
        """4 ranks read 13 indices each (mid-block), save their states through JSON and
        stop; returns (states, the indices read before them)."""
        old = self.streams(name, 4)
        before = sum(read_some(old, 13), [])
        states = json.loads(json.dumps([s.state_dict() for s in old]))
        for s in old:
            s.close()
        return states, before

    def resume(self, name, world, states, run=None):
        new = self.streams(name, world)
        for s in new:
            s.load_state_dict(states, run=run)
        return new

    def failed_resume(self, name, world, states, run=None):
        """A resume of `states` into `world` ranks that reads 30 indices on each rank and
        stops (a run that fails before it saves states of its own); returns its name."""
        first = self.resume(name, world, states, run=run)
        read_some(first, 30)
        for s in first:
            s.close()
        return first[0].name

    def assert_once(self, lists, expected):
        counts = collections.Counter(i for part in lists for i in part)
        self.assertEqual([i for i, n in counts.items() if n > 1], [], "indices read twice")
        self.assertEqual(sorted(counts), sorted(expected))

    def test_the_same_states_resumed_again_into_another_world_size(self):
        name = self.qname()
        states, before = self.saved_states(name)
        first = self.failed_resume(name, 2, states)
        second = self.resume(name, 3, states)        # started again on 3 GPUs
        self.assertNotEqual(second[0].name, first)
        self.assert_once(read_all(second), set(range(N)) - set(before))
        for s in second:
            s.close()

    def test_a_first_resume_says_nothing(self):
        name = self.qname()
        states, before = self.saved_states(name)
        new = self.resume(name, 3, states)
        with self.assertNoLogs("muster.iteration", logging.WARNING):
            rest = read_all(new)
        self.assert_once(rest, set(range(N)) - set(before))
        for s in new:
            s.close()

    def test_resumed_again_into_the_same_world_size_warns(self):
        name = self.qname()
        states, _ = self.saved_states(name)
        first = self.failed_resume(name, 2, states)
        second = self.resume(name, 2, states)
        self.assertEqual(second[0].name, first)
        with self.assertLogs("muster.iteration", logging.WARNING) as logs:
            iter(second[0]).__next__()
        self.assertIn("resumed before and this rank read", logs.output[0])
        self.assertIn("muster iter rm " + second[0].name, logs.output[0])
        for s in second:
            s.close()

    def test_another_run_reads_from_the_states_again(self):
        """A run named with run= reads from the states whatever an earlier run that loaded
        them read; the ranks of one run meet in one iteration."""
        name = self.qname()
        states, before = self.saved_states(name)
        first = self.failed_resume(name, 2, states, run="job-1")
        second = self.resume(name, 2, states, run="job-2")
        self.assertEqual(len({s.name for s in second}), 1, "the ranks of one run part")
        self.assertNotEqual(second[0].name, first)
        with self.assertNoLogs("muster.iteration", logging.WARNING):
            rest = read_all(second)
        self.assert_once(rest, set(range(N)) - set(before))
        for s in second:
            s.close()

    def test_a_bad_run_is_refused_and_nothing_changes(self):
        name = self.qname()
        states, _ = self.saved_states(name)
        stream = self.streams(name, 1)[0]
        for run in ("", 7, "x" * 201, b"job"):
            with self.assertRaisesRegex(ValueError, r"run=.*expected a string of 1 to 200"):
                stream.load_state_dict(states, run=run)
        self.assertEqual(stream.name, name, "a refused load changed the stream")
        stream.close()


class StandaloneResumeTest(unittest.TestCase):
    def check(self, n, tail, new_world):
        """4 ranks consume 37 items each of a global shuffle; the state of one (lock step)
        resumes into `new_world` ranks twice: the same order both times, and with the
        items before, every sample once (pad: the documented repeats; drop: n mod 4 of
        the epoch stay dropped)."""
        plan = Plan(n, seed=7, shuffle="global", world_size=4, tail=tail, epochs=2)
        old = [RankSampler(plan, r) for r in range(4)]
        before = []
        for s in old:
            it = iter(s)
            before += [next(it) for _ in range(37)]
        state = old[0].state_dict(consumed=37)
        runs = []
        for _ in range(2):
            new_plan = plan.with_world_size(new_world)
            new = [RankSampler(new_plan, r) for r in range(new_world)]
            for s in new:
                s.load_state_dict(state)
            runs.append([list(s) for s in new])
        self.assertEqual(runs[0], runs[1])
        lens = {len(r) for r in runs[0]}
        self.assertEqual(len(lens), 1, "the new ranks' lengths differ")
        counts = collections.Counter(before + sum(runs[0], []))
        rest = n - 4 * 37
        if tail == "drop":
            kept = n - n % 4
            self.assertEqual(len(counts), kept - (kept - 4 * 37) % new_world)
            self.assertEqual(max(counts.values()), 1)
        else:
            self.assertEqual(sorted(counts), list(range(n)))
            self.assertEqual(sum(counts.values()) - n, -rest % new_world)

    def test_into_3_ranks_with_pad(self):
        self.check(1001, "pad", 3)

    def test_into_3_ranks_with_drop(self):
        self.check(1001, "drop", 3)

    def test_into_2_ranks_with_pad(self):
        self.check(1001, "pad", 2)


class StandalonePositionTest(unittest.TestCase):
    def position(self):
        s = Stream(Plan(100, seed=1, shuffle="global", world_size=4), 1)
        s.take(5)
        return s.get_pos()

    def test_another_world_size_is_named_with_where_elastic_resume_lives(self):
        s = Stream(Plan(100, seed=1, shuffle="global", world_size=3), 1)
        with self.assertRaises(ValueError) as cm:
            s.set_pos(self.position())
        text = str(cm.exception)
        self.assertIn("another configuration or rank: fingerprint", text)
        self.assertIn("world size", text)
        self.assertIn("DistributedSampler", text)

    def test_another_rank_is_named(self):
        s = Stream(Plan(100, seed=1, shuffle="global", world_size=4), 2)
        with self.assertRaises(ValueError) as cm:
            s.set_pos(self.position())
        self.assertIn("another configuration or rank: rank 1's position, and this stream is rank 2",
                      str(cm.exception))

    def test_a_loader_checkpoint_of_another_rank_is_named(self):
        s = Stream(Plan(100, seed=1, shuffle="global", world_size=4), 1)
        ck = s.loader().checkpoint()
        other = Stream(Plan(100, seed=1, shuffle="global", world_size=4), 3)
        with self.assertRaises(ValueError) as cm:
            other.set_pos(ck)
        self.assertIn("another configuration or rank", str(cm.exception))
        self.assertIn("rank 1's checkpoint, and this is rank 3", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
