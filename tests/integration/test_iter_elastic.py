"""Elastic resume of coordinated iterations at awkward points (docs/iterations.md,
"Elastic resume"; docs/python.md, "Coordinated sampler"): a checkpoint with nothing
acknowledged yet but blocks partly read, resumed into another world size, keeps the
checkpoint's block numbers, so the samplers' partly read blocks skip the right items and
the ranks together read every sample of the epoch exactly once."""
import os
import sys
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402
from muster.coordinated import CoordinatedRankSampler  # noqa: E402
from muster.iteration import Plan, Stream  # noqa: E402
from muster.sampling import RankSampler, make_plan  # noqa: E402

N = 7
CONFIG = {"dataset": {"num_samples": N}, "seed": 5, "shuffle": "global", "strategy": "contiguous",
          "world_size": 6, "block_size": 3, "epochs": 1, "tail": "pad"}


def old_stream(rank):
    plan = Plan(N, seed=5, shuffle="global", strategy="contiguous", world_size=6,
                block_size=3, epochs=1, tail="pad")
    return list(Stream(plan, rank))


class ElasticResumeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head().start()
        cls.client = muster.Client(cls.head.url, cls.head.token)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.head.cleanup()

    def name(self):
        return "el-" + uuid.uuid4().hex[:8]

    def test_resume_with_nothing_done_keeps_the_checkpoints_blocks(self):
        # No block acknowledged: the resumed epoch still deals the checkpoint's blocks
        # (old block g to new rank g mod 5), as with blocks done.
        name = self.name()
        self.client.create_iteration(dict(CONFIG, name=name))
        ck = self.client.iteration_checkpoint(name)
        self.assertEqual(ck["done"], [])
        body = {"name": name + "-r", "checkpoint": ck, "world_size": 5}
        st = self.client.create_iteration(body)
        self.assertEqual(st["resumed"], {"epoch": 0, "world_size": 6})
        reply = self.client.iteration_next(name + "-r", {"rank": 0, "max": 10, "indices": True})
        got = {b["block"]: b["indices"] for b in reply["blocks"]}
        # 6 old ranks of one block each: new rank 0 gets old blocks 0 and 5
        self.assertEqual(got, {0: old_stream(0), 5: old_stream(5)})

    def test_sampler_resume_mid_block_with_nothing_acknowledged(self):
        # Two ranks read the first item of their block (nobody finished one), every
        # rank's state is gathered, and 5 ranks resume: the union is the epoch, once
        # each (pad items aside: the old plan's 12 items of 7 samples).
        name = self.name()
        old = [CoordinatedRankSampler(self.client, name, CONFIG, r, wait=False) for r in range(6)]
        its = [iter(s) for s in old]
        read = [next(its[0]), next(its[3])]
        states = [s.state_dict() for s in old]
        new = [CoordinatedRankSampler(self.client, name, dict(CONFIG, world_size=5), r, wait=False)
               for r in range(5)]
        for s in new:
            s.load_state_dict(states)
        for s in new:
            read.extend(s)
        expected = sum((old_stream(r) for r in range(6)), [])
        self.assertEqual(sorted(read), sorted(expected))

    def test_sampler_refuses_a_state_of_another_configuration(self):
        # The head resumes the checkpoint's own configuration: loaded into a sampler of
        # another dataset or seed, it would read the wrong indices without a word.
        name = self.name()
        first = CoordinatedRankSampler(self.client, name, CONFIG, 0, wait=False)
        next(iter(first))
        state = first.state_dict()
        for change, field in (({"dataset": {"num_samples": N + 1}}, "dataset"), ({"seed": 6}, "seed"),
                              ({"strategy": "round_robin"}, "strategy")):
            other = CoordinatedRankSampler(self.client, name, dict(CONFIG, world_size=3, **change),
                                           0, wait=False)
            with self.assertRaisesRegex(ValueError, "another dataset or configuration .%s" % field):
                other.load_state_dict(state)
        # another world size and more epochs are what a resume may change
        ok = CoordinatedRankSampler(self.client, name, dict(CONFIG, world_size=3, epochs=2), 0,
                                    wait=False)
        ok.load_state_dict(state)
        with self.assertRaisesRegex(ValueError, "not a coordinated sampler state"):
            ok.load_state_dict({"version": 1, "fingerprint": 1, "world_size": 6})

    def test_standalone_sampler_refuses_bad_states(self):
        sampler = RankSampler(make_plan(10, 2), 0)
        good = sampler.state_dict()
        for state, message in (("garbage", "not a sampler state"),
                               (dict(good, emitted=-3), "emitted is -3"),
                               ({k: v for k, v in good.items() if k != "world_size"}, "world_size"),
                               ({"version": 1, "mode": "coordinated"}, "coordinated=True")):
            with self.assertRaisesRegex(ValueError, message):
                RankSampler(make_plan(10, 3), 0).load_state_dict(state)


if __name__ == "__main__":
    unittest.main()
