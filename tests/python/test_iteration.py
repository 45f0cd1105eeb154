"""The pure-Python iteration algorithms reproduce the C ones exactly (version 1).

The literals are the golden values of tests/unit/test_perm.c, test_partition.c and
test_stream.c; where libxxhash / libmuster can be loaded, random inputs are also
compared with the C functions themselves."""
import ctypes
import ctypes.util
import os
import random
import struct
import unittest

from common import HeadTestCase, muster  # noqa: F401  (puts python/ on sys.path)
from muster import _xxh3
from muster.iteration import STRATEGIES, Dataset, Perm, Plan, Stream, StreamPos


def golden_labels():
    return [0 if i % 5 == 0 else (1 if i % 3 == 0 else 2) for i in range(20)]


class TestGolden(unittest.TestCase):
    def test_hash(self):
        self.assertEqual(_xxh3.hash64(0, 0), 14374147212387527897)
        self.assertEqual(_xxh3.hash64(1, 0), 3439722301264460078)
        self.assertEqual(_xxh3.hash64(12345, 42), 3734905879192895420)

    def test_perm(self):
        cases = [(10, 42, 0, 0, [4, 6, 1, 7, 9, 2, 8, 5, 3, 0]),
                 (10, 42, 1, 0, [4, 3, 0, 9, 8, 5, 2, 7, 6, 1]),
                 (10, 43, 0, 0, [1, 6, 9, 8, 4, 5, 0, 7, 3, 2]),
                 (1000, 7, 3, 0, [742, 784, 99, 148, 382, 60, 911, 893, 792, 460, 836, 936, 739, 982,
                                  237, 702]),
                 (1 << 40, 1, 2, 0, [715652777505, 441163834241, 1031226529142, 585570165288,
                                     352870669926, 52433609017, 319758824671, 542796526249]),
                 (2 ** 64 - 1, 9, 9, 123456789, [18098207184541433963, 3952020134473758945,
                                                 17782229481283090937, 15550356725365036340])]
        for n, seed, epoch, first, expected in cases:
            p = Perm(n, seed, epoch)
            self.assertEqual([p(first + i) for i in range(len(expected))], expected)
            self.assertEqual([p.inverse(v) for v in expected], [first + i for i in range(len(expected))])

    def test_bijection(self):
        for n in (1, 2, 3, 17, 1000, 4099):
            p = Perm(n, 5, 1)
            self.assertEqual(sorted(p(i) for i in range(n)), list(range(n)))

    def test_fingerprints(self):
        self.assertEqual(Dataset(10).fingerprint, 0xcd9022313b548c37)
        self.assertEqual(Dataset(shards=[4, 3, 3]).fingerprint, Dataset(shards=[4, 3, 3]).fingerprint)
        self.assertNotEqual(Dataset(shards=[4, 3, 3]).fingerprint, Dataset(shards=[3, 4, 3]).fingerprint)
        plan = Plan(Dataset(20, labels=golden_labels()), seed=42, shuffle="global", world_size=3)
        self.assertEqual(plan.fingerprint, 0xdaf7edcde0d9e669)
        self.assertEqual(Plan(Dataset(20, labels=golden_labels()), seed=42, shuffle="global", world_size=3,
                              epochs=90).fingerprint, plan.fingerprint)

    def test_orders(self):
        plan = Plan(20, seed=42, shuffle="global", epochs=0)
        self.assertEqual([plan.epoch(0)[i] for i in range(20)],
                         [4, 2, 18, 1, 16, 9, 14, 3, 19, 8, 10, 11, 0, 13, 15, 5, 7, 6, 12, 17])
        self.assertEqual([plan.epoch(1)[i] for i in range(20)],
                         [8, 5, 2, 14, 0, 4, 6, 3, 16, 19, 13, 1, 9, 17, 15, 10, 12, 18, 11, 7])
        plan = Plan(Dataset(shards=[5, 0, 7, 3, 5]), seed=42, shuffle="shard", shuffle_block_size=4, epochs=0)
        self.assertEqual([plan.epoch(0)[i] for i in range(20)],
                         [5, 8, 7, 6, 9, 10, 11, 3, 0, 2, 1, 4, 12, 14, 13, 16, 17, 15, 18, 19])
        self.assertEqual([plan.epoch(1)[i] for i in range(20)],
                         [8, 6, 5, 7, 9, 11, 10, 1, 3, 2, 0, 4, 16, 17, 15, 18, 19, 14, 12, 13])

    def test_strategies(self):
        ds = Dataset(20, labels=golden_labels())
        expected = {
            ("round_robin", "keep"): [[4, 1, 14, 8, 0, 5, 12], [2, 16, 3, 10, 13, 7, 17], [18, 9, 19, 11, 15, 6]],
            ("round_robin", "pad"): [[4, 1, 14, 8, 0, 5, 12], [2, 16, 3, 10, 13, 7, 17],
                                     [18, 9, 19, 11, 15, 6, 4]],
            ("round_robin", "drop"): [[4, 1, 14, 8, 0, 5], [2, 16, 3, 10, 13, 7], [18, 9, 19, 11, 15, 6]],
            ("contiguous", "keep"): [[4, 2, 18, 1, 16, 9, 14], [3, 19, 8, 10, 11, 0, 13], [15, 5, 7, 6, 12, 17]],
            ("hash", "keep"): [[18, 9, 3, 19, 8, 13, 5, 17], [2, 1, 16, 14, 10, 11, 0, 15], [4, 7, 6, 12]],
            ("hash", "pad"): [[18, 9, 3, 19, 8, 13, 5, 17], [2, 1, 16, 14, 10, 11, 0, 15],
                              [4, 7, 6, 12, 15, 6, 4, 1]],
            ("range", "keep"): [[18, 16, 14, 19, 13, 15, 12, 17], [4, 2, 1, 3, 0], [9, 8, 10, 11, 5, 7, 6]],
            ("stratified", "keep"): [[1, 9, 0, 13, 15, 7, 17], [2, 14, 3, 19, 8, 5, 12], [4, 18, 16, 10, 11, 6]],
            ("dynamic", "keep"): [[4, 2, 18, 8, 10, 11, 12, 17], [1, 16, 9, 0, 13, 15], [14, 3, 19, 5, 7, 6]],
        }
        for (strategy, tail), ranks in expected.items():
            kw = {"num_partitions": 8, "hash_seed": 7}
            if strategy == "range":
                kw["ranges"] = [(12, 20), (0, 5), (5, 12)]
            if strategy == "dynamic":
                kw["block_size"] = 3
            plan = Plan(ds, seed=42, shuffle="global", world_size=3, strategy=strategy, tail=tail, **kw)
            self.assertEqual([list(Stream(plan, r)) for r in range(3)], ranks, (strategy, tail))

    def test_doc_examples(self):
        ds = Dataset(10, labels=[0, 1, 0, 0, 1, 0, 0, 2, 0, 1])
        plan = Plan(ds, world_size=3, strategy="hash", num_partitions=4, hash_seed=1)
        self.assertEqual([list(Stream(plan, r)) for r in range(3)], [[0, 2, 4, 7, 8], [1, 3, 6], [5, 9]])
        plan = Plan(ds, world_size=3, seed=42, shuffle="global", strategy="stratified")
        self.assertEqual([list(Stream(plan, r)) for r in range(3)], [[1, 7, 5, 0], [4, 6, 2], [9, 8, 3]])
        plan = Plan(Dataset(shards=[4, 3, 3]), world_size=3, seed=42, shuffle="shard", shuffle_block_size=2,
                    strategy="contiguous")
        self.assertEqual([list(Stream(plan, r)) for r in range(3)], [[5, 4, 6, 0], [1, 2, 3], [7, 8, 9]])

    def test_shard_streams(self):
        plan = Plan(Dataset(shards=[5, 0, 7, 3, 5]), seed=42, shuffle="shard", shuffle_block_size=4,
                    strategy="contiguous", world_size=2, epochs=2)
        s0, s1 = Stream(plan, 0), Stream(plan, 1)
        self.assertEqual(list(s0), [5, 8, 7, 6, 9, 10, 11, 3, 0, 2])
        s1.set_epoch(1)
        self.assertEqual(list(s1), [0, 4, 16, 17, 15, 18, 19, 14, 12, 13])
        with self.assertRaises(ValueError) as cm:
            s1.set_epoch(2)
        self.assertEqual(str(cm.exception), "epoch 2: the plan has 2 epochs (0 to 1); give "
                         "Plan(..., epochs=N) for more, or epochs=0 for no last epoch")
        with self.assertRaises(ValueError) as cm:
            Plan(10).epoch(1)
        self.assertTrue(str(cm.exception).startswith("epoch 1: the plan has 1 epoch (epoch 0); "))

    def test_positions_resume_exactly(self):
        ds = Dataset(shards=[30, 0, 17, 53], labels=[i % 7 for i in range(100)])
        for strategy in STRATEGIES:
            kw = {"ranges": [(0, 40), (40, 41), (41, 100)]} if strategy == "range" else {}
            plan = Plan(ds, seed=3, shuffle="global", world_size=3, strategy=strategy, tail="pad",
                        block_size=4, epochs=0, **kw)
            for rank in range(3):
                s = Stream(plan, rank)
                s.set_epoch(2)
                head = s.take(11)
                pos = s.get_pos()
                rest = list(s)
                t = Stream(plan, rank)
                t.set_pos(StreamPos.decode(pos.encode()))
                self.assertEqual(list(t), rest, strategy)
                u = Stream(plan, rank)
                u.set_epoch(2)
                u.seek(11)
                self.assertEqual(list(u), rest)
                self.assertEqual(len(head) + len(rest), len(s))
            with self.assertRaises(ValueError):
                Stream(plan, 1).set_pos(Stream(plan, 0).get_pos())

    def test_invalid_configurations(self):
        for kw in ({"world_size": 0}, {"shuffle": "random"}, {"strategy": "stratified"},
                   {"strategy": "range", "world_size": 2, "ranges": [(0, 4), (5, 10)]},
                   {"block_size": 0}, {"version": 2}):
            with self.assertRaises(ValueError, msg=kw):
                Plan(10, **kw)

    def test_a_tenflowers_users_settings_are_told_muster_s(self):
        """A user coming from tenflowers (docs/coming-from.md) writes its names: the
        refusal names muster's counterpart.  Before, 'RoundRobin' and 'Adaptive' got
        the bare list of strategies, shuffle=True the list of modes, a stratified plan
        without labels 'stratified needs labels', and next_epoch after the last epoch
        (tenflowers' reset() has no last) did not say that epochs=0 has none."""
        def refusal(**kw):
            with self.assertRaises(ValueError, msg=kw) as cm:
                Plan(10, world_size=2, **kw)
            return str(cm.exception)
        for given, meant in (("RoundRobin", "round_robin"), ("round-robin", "round_robin"),
                             ("HashBased", "hash"), ("RangeBased", "range"),
                             ("Contiguous", "contiguous"), ("Stratified", "stratified")):
            self.assertEqual(refusal(strategy=given),
                             "strategy: one of round_robin, contiguous, hash, range, stratified, "
                             "dynamic, not %r (did you mean %r?)" % (given, meant))
        self.assertRegex(refusal(strategy="Adaptive"),
                         r"not 'Adaptive' \(tenflowers' Adaptive is strategy='dynamic' of a "
                         r"coordinated iteration, muster.CoordinatedStream")
        self.assertEqual(refusal(strategy="fastest"), "strategy: one of round_robin, contiguous, "
                         "hash, range, stratified, dynamic, not 'fastest'")
        self.assertEqual(refusal(shuffle=True), "shuffle: one of none, global, shard, not True "
                         "(write shuffle='global': a seed alone does not shuffle)")
        self.assertEqual(refusal(shuffle=False), "shuffle: one of none, global, shard, not False "
                         "(write shuffle='none': a seed alone does not shuffle)")
        self.assertEqual(refusal(shuffle="random"), "shuffle: one of none, global, shard, not "
                         "'random'")
        self.assertRegex(refusal(strategy="stratified"),
                         r"^strategy: stratified needs a class label per sample, and the dataset "
                         r"has none: Dataset\(N, labels=\[\.\.\.\]\)")
        stream = Stream(Plan(10, world_size=2), 0)
        with self.assertRaises(ValueError) as cm:
            stream.next_epoch()
        self.assertEqual(str(cm.exception), "epoch 1: the plan has 1 epoch (epoch 0); give "
                         "Plan(..., epochs=N) for more, or epochs=0 for no last epoch")
        unbounded = Stream(Plan(10, world_size=2, epochs=0), 0)
        for epoch in range(1, 4):
            unbounded.next_epoch()
            self.assertEqual(unbounded.epoch, epoch)

    def test_seeds_outside_the_heads_range_are_refused(self):
        """Seeds were taken modulo 2^64: seed 2^64 gave seed 0's order, -1 that of 2^64-1,
        and a float raised a TypeError about '&'.  The head takes 0 to 2^63-1 (its JSON
        integers are signed): a standalone plan takes the same, so that a seed it runs
        with is one a coordinated iteration accepts too."""
        for key in ("seed", "hash_seed"):
            for bad in (-1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 1.5, "7", True, None):
                with self.assertRaises(ValueError) as cm:
                    Plan(10, shuffle="global", strategy="hash", **{key: bad})
                self.assertEqual(str(cm.exception),
                                 "%s: an integer from 0 to 2^63-1, not %r (a 64-bit seed such "
                                 "as torch.initial_seed() can be taken modulo 2**63)" % (key, bad))
        self.assertEqual(Plan(10, seed=2 ** 63 - 1).seed, 2 ** 63 - 1)
        with self.assertRaises(ValueError) as cm:
            Dataset(-3)
        self.assertEqual(str(cm.exception), "num_samples: 0 to 2^48, not -3")


class TestEmptyDataset(HeadTestCase):
    """A dataset without samples: the head refuses an iteration of one, and a standalone
    plan (the iteration computed without a head) refuses it in the same words; it gave
    every rank an empty stream, epoch after epoch."""

    def test_refused_standalone_as_by_the_head(self):
        with self.assertRaises(muster.InvalidArgument) as by_head:
            self.c.create_iteration({"name": "empty", "dataset": {"num_samples": 0}})
        for dataset in (0, Dataset(0), Dataset(shards=[0, 0])):
            with self.assertRaises(ValueError) as here:
                Plan(dataset, world_size=2)
            self.assertEqual(str(here.exception), by_head.exception.message, dataset)
        self.assertEqual(list(Stream(Plan(Dataset(shards=[0, 1]), world_size=2), 1)), [])


def _load(names):
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class TestAgainstC(unittest.TestCase):
    """Random inputs against the C code itself, where it can be loaded."""

    def test_xxh3_against_libxxhash(self):
        lib = _load(["libxxhash.so.0", ctypes.util.find_library("xxhash")])
        if lib is None:
            self.skipTest("libxxhash is not installed")
        f = lib.XXH3_64bits_withSeed
        f.restype = ctypes.c_uint64
        f.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
        rng = random.Random(8)
        for n in list(range(0, 300)) + [511, 1024, 2048, 2049, 4096]:
            data = bytes(rng.getrandbits(8) for _ in range(n))
            seed = rng.choice([0, rng.getrandbits(64)])
            self.assertEqual(_xxh3.xxh3_64(data, seed), f(data, n, seed), n)
        for _ in range(2000):
            v, seed = rng.getrandbits(64), rng.getrandbits(64)
            self.assertEqual(_xxh3.hash64(v, seed), f(struct.pack("<Q", v), 8, seed))

    def test_perm_against_libmuster(self):
        build = os.environ.get("MUSTER_BUILD_DIR")
        lib = _load([os.path.join(build, "libmuster.so")] if build else [])
        if lib is None or not hasattr(lib, "perm_init"):
            self.skipTest("libmuster.so with the core symbols is not built here")

        class PermT(ctypes.Structure):
            _fields_ = [("n", ctypes.c_uint64), ("seed", ctypes.c_uint64), ("epoch", ctypes.c_uint64),
                        ("half_bits", ctypes.c_uint), ("half_mask", ctypes.c_uint64),
                        ("round_keys", ctypes.c_uint64 * 6)]
        lib.perm_apply.restype = ctypes.c_uint64
        lib.perm_apply.argtypes = [ctypes.POINTER(PermT), ctypes.c_uint64]
        lib.perm_init.argtypes = [ctypes.POINTER(PermT), ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        rng = random.Random(9)
        for _ in range(200):
            n = rng.choice([rng.randrange(1, 100), rng.randrange(1, 1 << 20), rng.getrandbits(48) + 1])
            seed, epoch = rng.getrandbits(64), rng.randrange(100)
            c = PermT()
            lib.perm_init(ctypes.byref(c), n, seed, epoch)
            p = Perm(n, seed, epoch)
            for _ in range(5):
                x = rng.randrange(n)
                self.assertEqual(p(x), lib.perm_apply(ctypes.byref(c), x))


class TestCheckpointOfAHead(HeadTestCase):
    """Client.iteration_checkpoint reads GET /v1/iterations/{name}/checkpoint (it sent POST,
    which the head refuses with method_not_allowed), and its checkpoint restores."""

    def test_checkpoint_round_trip(self):
        config = {"name": "ckpt", "dataset": {"num_samples": 40}, "seed": 3, "world_size": 2,
                  "block_size": 4, "epochs": 2}
        self.c.create_iteration(config)
        got = self.c.iteration_next("ckpt", {"rank": 0, "max": 2})
        block = got["blocks"][0]
        self.c.iteration_ack("ckpt", {"rank": 0, "blocks": [{"block": block["block"],
                                                             "token": block["token"]}]})
        ck = self.c.iteration_checkpoint("ckpt")
        self.assertEqual(ck, self.c.request("GET", "/v1/iterations/ckpt/checkpoint"))
        self.assertEqual((ck["version"], ck["name"], ck["epoch"], ck["world_size"]),
                         (1, "ckpt", 0, 2))
        self.assertEqual(ck["config"]["seed"], 3)
        self.assertEqual(ck["done"], [[block["block"], block["block"] + 1]])
        self.c.delete_iteration("ckpt")
        restored = self.c.create_iteration({"name": "ckpt2", "checkpoint": ck, "world_size": 3})
        self.assertEqual(restored["name"], "ckpt2")
        with self.assertRaises(muster.errors.IterationNotFound):
            self.c.iteration_checkpoint("ckpt")



class TestHeldOfAHead(HeadTestCase):
    """Client.iteration_held lists the blocks a rank holds (GET /v1/iterations/{name}/held)
    and leases nothing: a next afterwards gets the block after them."""

    def test_held_lists_and_leases_nothing(self):
        self.c.create_iteration({"name": "held", "dataset": {"num_samples": 40},
                                 "strategy": "dynamic", "world_size": 2, "block_size": 4})
        got = self.c.iteration_next("held", {"rank": 0, "max": 3, "indices": True})
        listed = self.c.iteration_held("held", 0, indices=True)
        self.assertEqual(listed["blocks"], got["blocks"])
        self.assertEqual((listed["total"], listed["next"], listed["finished"]), (3, None, False))
        page = self.c.iteration_held("held", 0, cursor=1, max=1)
        self.assertEqual([b["block"] for b in page["blocks"]], [1])
        self.assertEqual(page["next"], 2)
        self.assertEqual(self.c.iteration_held("held", 1)["blocks"], [])
        later = self.c.iteration_next("held", {"rank": 1, "max": 1})
        self.assertEqual(later["blocks"][0]["block"], 3)
        with self.assertRaises(muster.errors.InvalidArgument) as e:
            self.c.iteration_held("held", 2)
        self.assertIn("query rank: 2 is not below world_size (2)", str(e.exception))
        with self.assertRaises(muster.errors.IterationNotFound):
            self.c.iteration_held("no-such", 0)

if __name__ == "__main__":
    unittest.main()
