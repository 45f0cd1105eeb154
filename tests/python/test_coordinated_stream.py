"""muster.CoordinatedStream: one rank of a coordinated iteration without PyTorch
(docs/python.md, "Coordinated iterations without PyTorch") on a real head, the ranks
threads of this process.  Nothing here imports torch; test_it_needs_no_torch runs a rank
in a process where torch cannot be imported."""
import collections
import json
import os
import subprocess
import sys
import threading
import unittest

from common import ROOT, HeadTestCase, muster
from muster.iteration import Dataset, Plan, Stream

N = 101
BLOCK = 8


def read_epoch(streams):
    """Every stream (a rank, in a thread of its own) reads its current epoch to the end;
    returns each rank's indices."""
    out = [[] for _ in streams]
    failures = []

    def rank(r):
        try:
            out[r].extend(streams[r])
        except BaseException as e:  # reported below
            failures.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        if t.is_alive():
            raise AssertionError("a rank did not end its epoch in 120 s")
    if failures:
        raise failures[0]
    return out


def read_some(streams, counts):
    """Rank r reads its first counts[r] indices (one rank after the other: each has blocks
    left to lease, so none waits); returns each rank's indices."""
    out = []
    for stream, count in zip(streams, counts):
        it = iter(stream)
        out.append([next(it) for _ in range(count)])
    return out


def once_each(test, lists, expected):
    """Asserts that `lists` together hold each index of `expected` exactly once."""
    counts = collections.Counter(i for part in lists for i in part)
    test.assertEqual([i for i, n in counts.items() if n > 1], [], "indices read twice")
    test.assertEqual(sorted(counts), sorted(expected))


class ReadAhead:
    """A rank's loop that keeps `ahead` indices read ahead of the one it uses (a prefetching
    pipeline): `use(n)` uses n more (fewer at the epoch's end), starting a loop over the
    stream when none runs; `leave()` leaves the loop, its queue dropped, and gives back
    what it read ahead."""

    def __init__(self, stream, ahead):
        self.stream, self.ahead = stream, ahead
        self.used, self.queue, self.it = [], collections.deque(), None

    def use(self, count):
        for _ in range(count):
            if self.it is None:
                self.it = iter(self.stream)
            while len(self.queue) <= self.ahead:
                index = next(self.it, None)
                if index is None:
                    break
                self.queue.append(index)
            if not self.queue:
                return
            self.used.append(self.queue.popleft())

    def leave(self):
        self.it = None
        self.queue.clear()
        self.stream.give_back(consumed=len(self.used))


class CoordinatedStreamTest(HeadTestCase):
    def streams(self, world, name, **options):
        options.setdefault("shuffle", "global")
        options.setdefault("seed", 11)
        options.setdefault("block_size", BLOCK)
        return [muster.CoordinatedStream(name, N, r, world, client=self.c, **options)
                for r in range(world)]

    def test_two_ranks_read_each_index_once_per_epoch(self):
        a, b = self.streams(2, "two-ranks")
        with a, b:
            first = read_epoch([a, b])
            once_each(self, first, range(N))
            self.assertEqual(list(a), [])   # the epoch is over: nothing more until set_epoch
            for s in (a, b):
                s.set_epoch(1)
            second = read_epoch([a, b])
            once_each(self, second, range(N))
            self.assertEqual((a.epoch, a.name, a.rank, a.world_size), (1, "two-ranks", 0, 2))
        self.assertEqual(self.c.iteration("two-ranks")["epoch"], 2)
        with self.assertRaisesRegex(ValueError, "iteration 'two-ranks', rank 1, is closed"):
            iter(b)
        b.close()   # twice: nothing

    def test_a_static_strategy_reads_what_the_standalone_stream_reads(self):
        # the configuration reaches the head as muster.iteration.Plan takes it
        dataset = Dataset(shards=[40, 0, 61])
        ranks = [muster.CoordinatedStream("static", dataset, r, 3, client=self.c, seed=7,
                                          shuffle="global", strategy="round_robin", tail="pad",
                                          block_size=BLOCK)
                 for r in range(3)]
        plan = Plan(dataset, seed=7, shuffle="global", strategy="round_robin", world_size=3,
                    block_size=BLOCK, tail="pad")
        self.assertEqual(read_epoch(ranks), [list(Stream(plan, r)) for r in range(3)])
        for s in ranks:
            s.close()

    def check_elastic_resume(self, name, new_world, **options):
        """Three ranks read part of epoch 0, each stopping mid-block, save their states
        (through JSON) and stop; `new_world` ranks load every state and read the rest:
        each index not read before once, none read before, then a whole epoch 1."""
        old = self.streams(3, name, **options)
        before = read_some(old, [5, 13, 21])   # blocks of 8: every rank stops mid-block
        once_each(self, before, sum(before, []))
        states = json.loads(json.dumps([s.state_dict() for s in old]))
        self.assertTrue(all(s["partial"] for s in states), states)
        for s in old:
            s.close()
        new = self.streams(new_world, name, **options)
        for s in new:
            s.load_state_dict(states)
        self.assertEqual(len({s.name for s in new}), 1)
        self.assertNotEqual(new[0].name, name)
        self.assertEqual([s.epoch for s in new], [0] * new_world)
        rest = read_epoch(new)
        once_each(self, rest, set(range(N)) - set(sum(before, [])))
        for s in new:
            s.set_epoch(1)
        once_each(self, read_epoch(new), range(N))
        for s in new:
            s.close()

    def test_elastic_resume_into_fewer_ranks(self):
        self.check_elastic_resume("fewer", 2)

    def test_elastic_resume_into_more_ranks(self):
        self.check_elastic_resume("more", 5)

    def test_elastic_resume_of_a_static_strategy(self):
        self.check_elastic_resume("static-resume", 4, strategy="contiguous")

    def check_read_ahead_resume(self, name, new_world, used, ahead):
        """Three ranks read `ahead` indices past the `used` ones they use (a prefetching
        pipeline: the blocks read to their end are acknowledged), save their states with
        consumed= (through JSON) and stop; `new_world` ranks load every state: each index
        not used before once, none used before."""
        old = self.streams(3, name)
        taken = read_some(old, [u + a for u, a in zip(used, ahead)])
        before = [t[:u] for t, u in zip(taken, used)]
        states = json.loads(json.dumps([s.state_dict(consumed=u) for s, u in zip(old, used)]))
        self.assertTrue(any(s.get("reopened") for s in states), states)
        for s in old:
            s.close()
        new = self.streams(new_world, name)
        for s in new:
            s.load_state_dict(states)
        once_each(self, read_epoch(new), set(range(N)) - set(sum(before, [])))
        for s in new:
            s.close()

    def test_consumed_resumes_what_was_read_ahead_and_not_used(self):
        """consumed= was the torch standalone sampler's only: the indices a prefetching
        pipeline had taken but not used were lost with the blocks acknowledged under it."""
        self.check_read_ahead_resume("ahead-fewer", 2, used=[5, 13, 3], ahead=[12, 9, 20])
        self.check_read_ahead_resume("ahead-more", 5, used=[0, 16, 9], ahead=[17, 3, 8])

    def test_a_loop_broken_off_and_started_again_loses_nothing(self):
        """Rank 0 reads ahead of what it uses (a queue of 6 indices), leaves its loop after
        14 and starts a new one in the same epoch.  The 6 it had read ahead were handed
        out (their blocks acknowledged) and never used: lost for the epoch, as nothing
        could say they were not used.  give_back says it: the new loop yields them first."""
        a, b = self.streams(2, "broken-off")
        with a, b:
            reader = ReadAhead(a, 6)
            reader.use(14)
            ahead = list(reader.queue)
            reader.leave()
            rest = read_epoch([a, b])
            once_each(self, [reader.used + rest[0], rest[1]], range(N))
            self.assertEqual(rest[0][:6], ahead)   # first in the new loop, in their order

    def check_left_loops_resume(self, name, new_world):
        """Three ranks read ahead (6, 3 and 10 indices): rank 0 leaves its loop and starts
        again, stopping among the indices it gave back; rank 1 does it twice, the second
        time past them; rank 2 reads on.  Every rank's state with consumed= (through
        JSON), loaded by `new_world` ranks: each index not used before once."""
        old = self.streams(3, name)
        readers = [ReadAhead(s, ahead) for s, ahead in zip(old, (6, 3, 10))]
        readers[0].use(9)
        readers[0].leave()
        readers[0].use(4)
        readers[1].use(5)
        readers[1].leave()
        readers[1].use(7)
        readers[1].leave()
        readers[1].use(12)
        readers[2].use(11)
        states = json.loads(json.dumps([s.state_dict(consumed=len(r.used))
                                        for s, r in zip(old, readers)]))
        self.assertTrue(any(s.get("reopened") for s in states), states)
        for s in old:
            s.close()
        new = self.streams(new_world, name)
        for s in new:
            s.load_state_dict(states)
        once_each(self, [r.used for r in readers] + read_epoch(new), range(N))
        for s in new:
            s.close()

    def test_loops_left_then_a_checkpoint_resume_exactly(self):
        self.check_left_loops_resume("left-fewer", 2)
        self.check_left_loops_resume("left-more", 4)

    def test_bad_give_back_is_refused(self):
        s = self.streams(1, "give-back-bad")[0]
        reader = ReadAhead(s, 3)
        reader.use(9)   # 12 handed out
        for bad, error, message in (
                (-1, ValueError, r"^consumed: an integer >= 0, not -1"),
                (None, TypeError, r"^consumed: an integer >= 0, not None"),
                ("3", TypeError, r"^consumed: an integer >= 0, not '3'"),
                (13, ValueError, r"^consumed=13: expected the items trained on since this "
                                 r"epoch's iteration began .* from 0 to 12 ")):
            with self.subTest(consumed=bad):
                with self.assertRaisesRegex(error, message):
                    s.give_back(bad)
        s.state_dict(consumed=9)   # block 0 used to its end: forgotten
        with self.assertRaisesRegex(ValueError, r"^consumed=5: .* an integer from 8 \(what an "
                                                r"earlier state_dict or give_back of this epoch "
                                                r"counted as used\) to 12 "):
            s.give_back(5)
        # What was refused changed nothing: the loop goes on after its 12th index.
        reader.use(N)
        once_each(self, [reader.used], range(N))
        s.close()
        with self.assertRaisesRegex(ValueError, r"^give_back: the stream .* is closed"):
            s.give_back(0)

    def test_bad_consumed_is_refused(self):
        s = self.streams(1, "consumed")[0]
        it = iter(s)
        for _ in range(10):
            next(it)
        for bad, error, message in (
                (-1, ValueError, r"^consumed: an integer >= 0, not -1"),
                ("3", TypeError, r"^consumed: an integer >= 0, not '3'"),
                (1.0, TypeError, r"^consumed: an integer >= 0, not 1.0"),
                (11, ValueError, r"^consumed=11: expected the items trained on since this "
                                 r"epoch's iteration began .* from 0 to 10 ")):
            with self.subTest(consumed=bad):
                with self.assertRaisesRegex(error, message):
                    s.state_dict(consumed=bad)
        self.assertEqual(s.state_dict(consumed=10)["partial"], {"1": 2})
        s.close()

    def test_bad_arguments_say_what_the_argument_takes(self):
        good = {"name": "bad", "dataset": 10, "rank": 0, "world_size": 2, "client": self.c}
        cases = [
            ({"name": ""}, ValueError, r"^name: the iteration's name, 1 to 128 characters"),
            ({"name": "a/b"}, ValueError, r"^name: .* not 'a/b'"),
            ({"name": ".."}, ValueError,
             r"^name: .* not '\.\.' \('\.' and '\.\.' are no names: URLs collapse them\)$"),
            ({"name": 7}, TypeError, r"^name: "),
            ({"dataset": "10"}, TypeError,
             r"^dataset: a number of samples \(an integer\) or a muster.iteration.Dataset"),
            ({"dataset": 0}, ValueError, r"^dataset: it has no samples"),
            ({"dataset": Dataset(shards=[0, 0])}, ValueError, r"^dataset: it has no samples"),
            ({"dataset": -3}, ValueError, r"^dataset: an integer from 1 to 2\^48, not -3"),
            ({"world_size": 0}, ValueError, r"^world_size: an integer from 1 to 65536, not 0"),
            ({"world_size": "2"}, TypeError, r"^world_size: an integer from 1 to 65536, not '2'"),
            ({"rank": 2}, ValueError, r"^rank: an integer from 0 to 1 \(world_size is 2\), not 2"),
            ({"rank": None}, TypeError, r"^rank: an integer from 0 to 1"),
            ({"shuffle": True}, ValueError, r"^shuffle: one of none, global, shard, not True"),
            ({"strategy": "fastest"}, ValueError, r"^strategy: one of round_robin, .*dynamic, "
                                                  r"not 'fastest'"),
            ({"seed": -1}, ValueError, r"^seed: an integer from 0 to 2\^63-1, not -1"),
            ({"block_size": 0}, ValueError, r"^block_size: an integer from 1 to 2\^48, not 0"),
            ({"block_size": 2.5}, TypeError, r"^block_size: an integer from 1 to 2\^48, not 2.5"),
            ({"epochs": -1}, ValueError, r"^epochs: an integer >= 0 \(0: unbounded\), not -1"),
            ({"tail": "pad"}, ValueError, r"^tail: a dynamic iteration takes only keep"),
            ({"tail": "cut", "strategy": "round_robin"}, ValueError,
             r"^tail: one of keep, pad, drop"),
            ({"strategy": "range"}, ValueError, r"^ranges: the range strategy needs"),
            ({"strategy": "range", "ranges": [[0, 10]]}, ValueError,
             r"^ranges: 2 pairs \[begin, end\), one per rank"),
            ({"strategy": "range", "ranges": 5}, TypeError, r"^ranges: 2 pairs"),
            ({"strategy": "stratified"}, ValueError,
             r"^dataset: the stratified strategy needs a label per sample"),
            ({"strategy": "hash", "hash_seed": 2 ** 64}, ValueError, r"^hash_seed: an integer"),
            ({"shuffle": "shard", "shuffle_block_size": 0}, ValueError,
             r"^shuffle_block_size: an integer from 1"),
            ({"lease_ms": 0}, ValueError, r"^lease_ms: an integer from 1 to 604800000, not 0"),
            ({"replication": 3}, ValueError, r"^replication: an integer from 1 to 2, not 3"),
            ({"slow_ratio": 2}, ValueError, r"^slow_ratio: a number from 0 to 1, not 2"),
            ({"cluster_sync": "yes"}, TypeError, r"^cluster_sync: True or False, not 'yes'"),
            ({"wait": None}, TypeError, r"^wait: True or False, not None"),
            ({"head_wait_s": -1}, ValueError, r"^head_wait_s: seconds, a number >= 0, not -1"),
            ({"client": self.c.url}, TypeError, r"^client: a muster.Client, not 'http"),
            ({"url": self.c.url}, ValueError, r"^url, token: give the head as client= or as url="),
            ({"client": None, "url": "127.0.0.1:7370"}, ValueError, r"is not a head's URL"),
        ]
        for change, error, message in cases:
            with self.subTest(change=change):
                with self.assertRaisesRegex(error, message):
                    muster.CoordinatedStream(**dict(good, **change))
        self.assertEqual([i["name"] for i in self.c.iterations()["iterations"]
                          if i["name"].startswith("bad")], [])

    def test_bad_epochs_and_states_are_refused(self):
        s = self.streams(1, "states")[0]
        with self.assertRaisesRegex(ValueError, r"^epoch: an integer >= 0, not -1"):
            s.set_epoch(-1)
        it = iter(s)
        next(it)
        saved = s.state_dict()
        for state, message in (
                ("garbage", r"^not a stream state \(a dict of state_dict\(\)\): 'garbage'"),
                ([], r"^no stream state to load \(an empty list\)"),
                ({"version": 1, "fingerprint": 1},
                 r"^not a coordinated stream state \(mode None\): a standalone stream's "
                 r"position loads with muster.iteration.Stream.set_pos"),
                (dict(saved, version=9), r"^coordinated stream state: version 9 is not known")):
            with self.subTest(state=state):
                with self.assertRaisesRegex(ValueError, message):
                    s.load_state_dict(state)
        other = muster.CoordinatedStream("states", N, 0, 3, client=self.c, seed=12,
                                         shuffle="global", block_size=BLOCK)
        with self.assertRaisesRegex(ValueError, r"^the stream state belongs to another dataset "
                                                r"or configuration \(seed: 11 there, 12 here\)"):
            other.load_state_dict(saved)
        other.close()
        s.close()
        with self.assertRaisesRegex(ValueError, r"^state_dict: the stream .* is closed"):
            s.state_dict()

    def test_it_needs_no_torch(self):
        """A process where `import torch` fails reads an epoch (url= and token= rather than a
        client: the stream makes its own and closes it)."""
        script = (
            "import sys\n"
            "class NoTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ImportError('torch cannot be imported here')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import muster\n"
            "with muster.CoordinatedStream('no-torch', 30, 0, 1, url=sys.argv[1],\n"
            "                              token=sys.argv[2], block_size=4) as stream:\n"
            "    got = list(stream)\n"
            "print(sorted(got) == list(range(30)), 'torch' in sys.modules,\n"
            "      'CoordinatedStream' in muster.__all__)\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        r = subprocess.run([sys.executable, "-c", script, self.head.url, self.head.token],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual((r.returncode, r.stdout), (0, "True False True\n"), r.stderr)


if __name__ == "__main__":
    unittest.main()
