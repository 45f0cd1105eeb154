"""The elastic rank sampler (muster.sampling) and the PyTorch DistributedSampler on it."""
import io
import unittest

from common import muster  # (it puts python/ on sys.path)
from muster.sampling import RankSampler, make_plan

try:
    import torch
    import torch.utils.data
    import muster.torch as mt
except ImportError:  # torch is optional: the torch tests skip
    torch = None


def ranks(n, world, seed=0, drop_last=False, shuffle=True):
    plan = make_plan(n, world, seed=seed, drop_last=drop_last, shuffle=shuffle)
    return [RankSampler(plan, r) for r in range(world)]


def run_epoch(samplers, epoch):
    out = []
    for s in samplers:
        s.set_epoch(epoch)
        out.append(list(s))
    return out


class TestRankSampler(unittest.TestCase):
    def test_every_index_once_per_epoch_on_4_ranks(self):
        for n in (100, 1000, 4):
            got = run_epoch(ranks(n, 4, seed=7), 0)
            self.assertEqual(sorted(sum(got, [])), list(range(n)))
            self.assertEqual({len(g) for g in got}, {n // 4})

    def test_uneven_pad_and_drop(self):
        got = run_epoch(ranks(103, 4, seed=1), 0)
        flat = sum(got, [])
        self.assertEqual(set(flat), set(range(103)))
        self.assertEqual(len(flat), 104)  # one padded index, as DistributedSampler pads
        got = run_epoch(ranks(103, 4, seed=1, drop_last=True), 0)
        flat = sum(got, [])
        self.assertEqual(len(flat), 100)
        self.assertEqual(len(set(flat)), 100)

    def test_new_order_every_epoch_same_for_same_seed(self):
        a, b, c = ranks(500, 4, seed=3), ranks(500, 4, seed=3), ranks(500, 4, seed=4)
        e0, e1 = run_epoch(a, 0), run_epoch(a, 1)
        self.assertNotEqual(e0, e1)
        self.assertEqual(sorted(sum(e1, [])), list(range(500)))
        self.assertEqual(run_epoch(b, 1), e1)
        self.assertEqual(run_epoch(b, 0), e0)
        self.assertNotEqual(run_epoch(c, 0), e0)

    def mid_epoch(self, n, world, epoch, taken, seed=5, drop_last=False):
        """Every rank reads `taken` items; returns (their states then, consumed, the rests)."""
        samplers = ranks(n, world, seed=seed, drop_last=drop_last)
        consumed, rest, states = set(), [], []
        for s in samplers:
            s.set_epoch(epoch)
            it = iter(s)
            consumed.update(next(it) for _ in range(taken))
            states.append(s.state_dict())
            rest.append(list(it))
        return states, consumed, rest

    def test_state_dict_round_trip_same_world(self):
        states, consumed, rest = self.mid_epoch(1000, 4, epoch=3, taken=37)
        state = states[2]
        self.assertEqual((state["epoch"], state["emitted"], state["world_size"]), (3, 37, 4))
        restored = ranks(1000, 4, seed=5)
        for s in restored:
            s.load_state_dict(dict(state))
        self.assertEqual([len(s) - s.emitted for s in restored], [len(r) for r in rest])
        self.assertEqual([list(s) for s in restored], rest)
        # The following epoch starts from its beginning.
        for s in restored:
            s.set_epoch(4)
        self.assertEqual(sorted(sum([list(s) for s in restored], [])), list(range(1000)))

    def test_state_dict_into_2_and_8_ranks(self):
        n = 1000
        for new_world in (2, 8, 3, 1):
            states, consumed, _ = self.mid_epoch(n, 4, epoch=1, taken=41)
            state = states[0]
            remaining = set(range(n)) - consumed
            restored = ranks(n, new_world, seed=5)
            for s in restored:
                s.load_state_dict(state)
            got = [list(s) for s in restored]
            flat = sum(got, [])
            self.assertEqual(set(flat), remaining, new_world)
            self.assertEqual(len({len(g) for g in got}), 1)  # equal lengths, for DDP
            self.assertEqual(len(flat), -(-len(remaining) // new_world) * new_world)  # pad only
            self.assertFalse(set(flat[:len(remaining)]) & consumed)

    def test_drop_last_elastic_never_repeats(self):
        states, consumed, _ = self.mid_epoch(1003, 4, epoch=0, taken=10, drop_last=True)
        state = states[0]
        restored = ranks(1003, 8, seed=5, drop_last=True)
        for s in restored:
            s.load_state_dict(state)
        flat = sum([list(s) for s in restored], [])
        self.assertEqual(len(flat), len(set(flat)))
        self.assertFalse(set(flat) & consumed)

    def test_chained_elastic_resumes(self):
        n = 600
        states, consumed, _ = self.mid_epoch(n, 4, epoch=2, taken=20)
        state = states[0]
        second = ranks(n, 2, seed=5)
        for s in second:
            s.load_state_dict(state)
            it = iter(s)
            consumed.update(next(it) for _ in range(30))
        state2 = second[1].state_dict()
        self.assertIn("deal", state2)
        third = ranks(n, 8, seed=5)
        for s in third:
            s.load_state_dict(state2)
        flat = sum([list(s) for s in third], [])
        self.assertEqual(set(flat), set(range(n)) - consumed)
        self.assertEqual(len(flat), 464)  # 600 - 80 - 60 = 460 left, padded to 8 * 58
        # ... and back into 4 ranks of the same epoch from the second stage as well.
        again = ranks(n, 2, seed=5)
        for s in again:
            s.load_state_dict(state2)
        self.assertEqual(set(sum([list(s) for s in again], [])), set(range(n)) - consumed)

    def test_consumed_overrides_prefetch(self):
        samplers = ranks(100, 2, seed=1)
        s = samplers[0]
        it = iter(s)
        seen = [next(it) for _ in range(20)]  # a prefetching loader read 20 ...
        state = s.state_dict(consumed=12)     # ... the model trained on 12
        t = ranks(100, 2, seed=1)[0]
        t.load_state_dict(state)
        self.assertEqual(list(t)[:8], seen[12:20])

    def test_consumed_counts_from_the_restore_in_any_world(self):
        """A prefetching loader hands out more than was trained on; the loop knows its own
        count, since the loader began the epoch (after a restore: since the restore).
        `consumed` counted from the epoch's start instead, so that count repeated items
        after a resume in the same world, and the epoch's count (which a loop cannot know
        across another world size's resume) skipped items after an elastic one."""
        n, prefetch = 120, 8
        for worlds in ((2, 2, 2), (2, 3, 1), (4, 4, 2, 2)):   # no padding
            trained, state = [], None
            for leg, world in enumerate(worlds):
                last = leg == len(worlds) - 1
                for r, s in enumerate(ranks(n, world, seed=1)):
                    if state is not None:
                        s.load_state_dict(state)
                    s.set_epoch(0)
                    it = iter(s)
                    steps = len(s) - s.emitted if last else 5 + leg
                    trained += [next(it) for _ in range(steps)]
                    handed = steps + sum(1 for _ in zip(range(prefetch), it))
                    if r == 0:
                        new_state = s.state_dict(consumed=steps)
                        self.assertLessEqual(new_state["emitted"], s.emitted)
                        self.assertEqual(s.emitted - new_state["emitted"], handed - steps)
                state = new_state
            self.assertEqual(sorted(trained), list(range(n)), worlds)

    def test_consumed_must_be_a_count_of_what_was_handed_out(self):
        s = ranks(100, 2, seed=1)[0]
        it = iter(s)
        for _ in range(10):
            next(it)
        self.assertEqual(s.state_dict(consumed=10)["emitted"], 10)
        for bad in (11, -1, 2.5, "3", True):
            with self.assertRaises(ValueError) as cm:
                s.state_dict(consumed=bad)
            self.assertIn("consumed=%r: expected the items trained on since this epoch's "
                          "iteration began" % (bad,), str(cm.exception))
        # A restored sampler that loader workers iterate in their copies (StreamDataset)
        # takes a count up to the epoch's rest, from the restored position.
        t = ranks(100, 2, seed=1)[0]
        t.load_state_dict(s.state_dict(consumed=4))
        self.assertEqual(t.state_dict(consumed=46)["emitted"], 50)
        with self.assertRaises(ValueError):
            t.state_dict(consumed=47)

    def test_state_of_another_configuration_is_refused(self):
        state = ranks(100, 2, seed=1)[0].state_dict()
        for other in (ranks(100, 2, seed=2)[0], ranks(101, 2, seed=1)[0],
                      ranks(100, 2, seed=1, drop_last=True)[0]):
            with self.assertRaises(ValueError):
                other.load_state_dict(state)


@unittest.skipIf(torch is None, "torch is not installed (apt-get install python3-torch)")
class TestTorchSampler(unittest.TestCase):
    def test_matches_torch_without_shuffle(self):
        data = list(range(23))
        for drop_last in (False, True):
            for rank in range(4):
                ours = mt.DistributedSampler(data, num_replicas=4, rank=rank, shuffle=False, drop_last=drop_last)
                theirs = torch.utils.data.DistributedSampler(data, num_replicas=4, rank=rank, shuffle=False,
                                                             drop_last=drop_last)
                self.assertEqual(list(ours), list(theirs))
                self.assertEqual((len(ours), ours.num_samples, ours.total_size),
                                 (len(theirs), theirs.num_samples, theirs.total_size))

    def test_a_standalone_sampler_takes_no_run(self):
        sampler = mt.DistributedSampler(list(range(20)), num_replicas=2, rank=0, seed=3)
        it = iter(sampler)
        first = [next(it) for _ in range(4)]
        state = sampler.state_dict()
        with self.assertRaisesRegex(ValueError, "standalone sampler.*run= names a coordinated"):
            sampler.load_state_dict(state, run="job-2")
        sampler.load_state_dict(state, run=None)
        again = mt.DistributedSampler(list(range(20)), num_replicas=2, rank=0, seed=3)
        self.assertEqual(list(sampler), list(again)[4:], "after the refusal the state loads")
        self.assertEqual(len(first), 4)

    def test_dataloader_4_ranks_every_index_once(self):
        data = torch.arange(200)
        seen = {0: [], 1: []}
        for epoch in (0, 1):
            for rank in range(4):
                sampler = mt.DistributedSampler(data, num_replicas=4, rank=rank, seed=11)
                sampler.set_epoch(epoch)
                loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
                for batch in loader:
                    seen[epoch].extend(batch.tolist())
            self.assertEqual(sorted(seen[epoch]), list(range(200)))
        self.assertNotEqual(seen[0], seen[1])

    def test_checkpoint_round_trip_mid_epoch(self):
        data = torch.arange(96)
        trained, checkpoint = [], None
        for rank in range(4):
            sampler = mt.DistributedSampler(data, num_replicas=4, rank=rank, seed=2)
            sampler.set_epoch(5)
            loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
            for step, batch in enumerate(loader):
                trained.extend(batch.tolist())
                if step == 2:
                    if rank == 0:
                        buf = io.BytesIO()
                        torch.save({"sampler": sampler.state_dict()}, buf)
                        checkpoint = buf.getvalue()
                    break
        for world in (4, 2, 8):
            state = torch.load(io.BytesIO(checkpoint))["sampler"]
            rest = []
            for rank in range(world):
                sampler = mt.DistributedSampler(data, num_replicas=world, rank=rank, seed=2)
                sampler.load_state_dict(state)
                self.assertEqual(sampler.epoch, 5)
                loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
                self.assertEqual(len(sampler), (96 - 48) // world)
                for batch in loader:
                    rest.extend(batch.tolist())
            self.assertEqual(sorted(trained + rest), list(range(96)), world)

    def test_ranks_from_environment(self):
        import os
        saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
        try:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = "2", "3"
            s = mt.DistributedSampler(list(range(30)))
            self.assertEqual((s.rank, s.num_replicas), (2, 3))
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v

    def test_stream_dataset_with_workers(self):
        data = list(range(40))
        ds = mt.StreamDataset(data, num_replicas=2, rank=1, seed=4)
        got = sorted(int(x) for x in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        self.assertEqual(got, sorted(mt.DistributedSampler(data, num_replicas=2, rank=1, seed=4)))

    def test_stream_dataset_with_workers_resumes_at_any_batch(self):
        """Workers took every K-th item, so the loader's batches were not a prefix of the
        sampler's order: a checkpoint after an odd number of batches with two workers
        skipped two items and repeated two.  With the loader's batch_size, workers take
        turns by batches and any number of batches is a prefix."""
        data, b = list(range(48)), 4
        for stop_after in (1, 2, 3, 5):
            ds = mt.StreamDataset(data, batch_size=b, num_replicas=1, rank=0, seed=3)
            ds.set_epoch(0)
            trained = []
            for step, batch in enumerate(torch.utils.data.DataLoader(ds, batch_size=b, num_workers=2)):
                trained += batch.tolist()
                if step + 1 == stop_after:
                    state = ds.state_dict(consumed=len(trained))
                    break
            self.assertEqual(trained, list(mt.DistributedSampler(data, 1, 0, seed=3))[:len(trained)])
            again = mt.StreamDataset(data, batch_size=b, num_replicas=1, rank=0, seed=3)
            again.load_state_dict(state)
            rest = [x for batch in torch.utils.data.DataLoader(again, batch_size=b, num_workers=2)
                    for x in batch.tolist()]
            self.assertEqual(sorted(trained + rest), data, stop_after)
        with self.assertRaises(ValueError):
            muster.torch.StreamDataset(data, batch_size=0)


if __name__ == "__main__":
    unittest.main()
