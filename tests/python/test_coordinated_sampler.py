"""muster.torch.DistributedSampler(coordinated=True): a DataLoader per simulated rank (one
thread each) on a coordinated iteration of a real head."""
import collections
import gc
import threading
import time
import unittest

from common import HeadTestCase, harness, muster  # noqa: F401

try:
    import torch
    import torch.utils.data
    import muster.torch as mt
except ImportError:  # torch is optional
    torch = None

N = 203


def run_ranks(samplers, epoch, stop_after=None, batch_size=5):
    """Each rank (a thread) iterates its DataLoader over the epoch, or for `stop_after`
    batches; returns every rank's list of indices."""
    out = [[] for _ in samplers]
    errors = []

    def rank(i, s):
        try:
            s.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(range(N), batch_size=batch_size, sampler=s)
            for b, batch in enumerate(loader):
                out[i].extend(int(v) for v in batch)
                if stop_after is not None and b + 1 >= stop_after[i]:
                    break
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(i, s)) for i, s in enumerate(samplers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@unittest.skipIf(torch is None, "torch is not installed")
class CoordinatedSamplerTest(HeadTestCase):
    def samplers(self, world, name, **kw):
        return [mt.DistributedSampler(range(N), num_replicas=world, rank=r, seed=11, coordinated=True,
                                      client=self.c, name=name, block_size=8, **kw)
                for r in range(world)]

    def test_every_index_once_per_epoch_and_new_order(self):
        ss = self.samplers(4, "every")
        e0 = run_ranks(ss, 0)
        self.assertEqual(sorted(sum(e0, [])), list(range(N)))
        self.assertEqual(len(ss[0]), 51)
        e1 = run_ranks(ss, 1)
        self.assertEqual(sorted(sum(e1, [])), list(range(N)))
        # the order is the iteration's: the same seed gives the same epoch order
        order0 = [i for i in sum(e0, [])]
        self.assertNotEqual(sorted(order0), order0)

    def test_static_strategy_matches_the_standalone_sampler(self):
        coord = self.samplers(4, "static", strategy="round_robin")
        got = run_ranks(coord, 0)
        alone = [list(mt.DistributedSampler(range(N), num_replicas=4, rank=r, seed=11, block_size=8))
                 for r in range(4)]
        self.assertEqual(got, alone)

    def check_resume(self, new_world, name):
        ss = self.samplers(4, name)
        # every rank stops after a different number of batches (blocks of 8, batches of 5:
        # most stop mid-block)
        first = run_ranks(ss, 0, stop_after=[3, 5, 1, 7])
        consumed = sum(first, [])
        self.assertEqual(len(consumed), len(set(consumed)))
        states = [s.state_dict() for s in ss]
        self.assertEqual(states[0]["epoch"], 0)
        new = self.samplers(new_world, name)
        for s in new:
            s.load_state_dict(states)
        self.assertEqual(len({s.name for s in new}), 1)
        self.assertNotEqual(new[0].name, name)
        rest = run_ranks(new, 0)
        remaining = sum(rest, [])
        self.assertEqual(len(remaining), len(set(remaining)))
        self.assertEqual(set(remaining), set(range(N)) - set(consumed))
        # the next epoch is a full one in the new world
        nxt = run_ranks(new, 1)
        self.assertEqual(sorted(sum(nxt, [])), list(range(N)))

    def test_state_dict_round_trip_into_2_ranks(self):
        self.check_resume(2, "resume2")

    def test_state_dict_round_trip_into_8_ranks(self):
        self.check_resume(8, "resume8")

    def test_single_rank_state_resumes_twice(self):
        s = self.samplers(1, "single")[0]
        it = iter(s)
        seen = [next(it) for _ in range(20)]
        state = s.state_dict()
        seen += [next(it) for _ in range(7)]   # read after the checkpoint: not counted
        r = self.samplers(1, "single")[0]
        r.load_state_dict(state)
        it = iter(r)
        more = [next(it) for _ in range(30)]
        state2 = r.state_dict()
        r2 = self.samplers(1, "single")[0]
        r2.load_state_dict(state2)
        rest = list(r2)
        total = seen[:20] + more + rest
        self.assertEqual(sorted(total), list(range(N)))

    def test_stream_dataset_in_a_spawned_loader_worker(self):
        """A DataLoader worker started with spawn gets the dataset pickled: the coordinated
        sampler's client (per-thread connections, a lock) could not be, so the loader
        failed before its first batch.  The worker's copy connects on its own and reads as
        the rank: every index once per epoch, epoch after epoch (a new worker each)."""
        ds = mt.StreamDataset(list(range(N)), num_replicas=1, rank=0, seed=11, coordinated=True,
                              client=self.c, name="spawned", block_size=8)
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1,
                                                 multiprocessing_context="spawn")
            got = [int(x) for x in loader]
            self.assertEqual(sorted(got), list(range(N)), epoch)

    def test_a_rank_pickled_mid_epoch_reads_on_in_the_copy(self):
        """A rank that has read (its heartbeat thread running) pickles too: the copy, in
        another process or not, is the same rank at the same place, with a heartbeat
        thread of its own once it reads."""
        import pickle
        s = self.samplers(1, "copied")[0]
        it = iter(s)
        read = [next(it) for _ in range(13)]   # mid-block: block_size is 8
        copy = pickle.loads(pickle.dumps(s))
        self.assertIsNot(copy._sampler.client, s._sampler.client)
        rest = list(copy)
        self.assertEqual(sorted(read + rest), list(range(N)))

    def test_checkpoint_waits_for_a_head_that_does_not_answer(self):
        """state_dict()'s read of the checkpoint was sent once: a head restarting just then
        (here: a proxy answering 503 unavailable, as a node agent does for a head it cannot
        reach) failed the training loop, while next and ack waited for the head."""
        proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "GET" and path.endswith("/checkpoint"),
            lambda n: harness.UNAVAILABLE if n == 1 else "forward")
        self.addCleanup(proxy.close)
        s = mt.DistributedSampler(range(N), num_replicas=1, rank=0, seed=11, coordinated=True,
                                  client=muster.Client(proxy.url, self.head.token),
                                  name="ckpt-wait", block_size=8)
        it = iter(s)
        read = [next(it) for _ in range(12)]
        with self.assertLogs("muster.iteration", "INFO") as logs:
            state = s.state_dict()
        self.assertEqual(proxy.count, 2)
        self.assertIn("reading the checkpoint failed", logs.output[0])
        self.assertEqual((state["checkpoint"]["done"], state["partial"]), ([[0, 1]], {"1": 4}))
        r = self.samplers(1, "ckpt-wait")[0]
        r.load_state_dict(state)
        self.assertEqual(sorted(read + list(r)), list(range(N)))


class SlowRankTest(HeadTestCase):
    """A rank busy between two indices for longer than its lease (a slow step, a
    validation pass, saving a checkpoint): without torch, on the sampler's engine."""

    def test_a_slow_step_keeps_the_lease(self):
        """Heartbeats went only with the indices, so the rank's lease expired during the
        step and another rank read its block again (8 of 64 samples read twice)."""
        from muster.coordinated import CoordinatedRankSampler
        cfg = {"dataset": {"num_samples": 64}, "seed": 1, "shuffle": "global",
               "strategy": "dynamic", "world_size": 2, "block_size": 8, "epochs": 1,
               "tail": "keep", "lease_ms": 300, "rank_timeout_ms": 300}
        r0 = CoordinatedRankSampler(self.c, "slow-step", cfg, 0)
        r1 = CoordinatedRankSampler(self.c, "slow-step", cfg, 1)
        it0 = iter(r0)
        got0, got1 = [next(it0) for _ in range(3)], []
        t = threading.Thread(target=lambda: got1.extend(r1))
        t.start()
        time.sleep(1.5)   # the slow step itself: five leases long
        got0 += list(it0)
        t.join(30)
        counts = collections.Counter(got0 + got1)
        self.assertEqual(sorted(counts), list(range(64)))
        self.assertEqual([i for i, n in counts.items() if n > 1], [])
        status = self.c.iteration("slow-step")
        self.assertEqual([(r["expired"], r["taken_over"]) for r in status["ranks"]],
                         [(0, 0), (0, 0)])
        # The heartbeat thread ends with its sampler.
        keeper = [th for th in threading.enumerate() if th.name == "muster iteration slow-step rank 0"]
        self.assertEqual(len(keeper), 1)
        del r0, it0
        gc.collect()
        keeper[0].join(5)
        self.assertFalse(keeper[0].is_alive())


if __name__ == "__main__":
    unittest.main()
