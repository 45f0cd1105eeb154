"""muster.loader.Loader: a standalone stream's samples with prefetch threads, statistics
and automatic checkpoints (docs/python.md, "Iterations computed locally").  No head:
everything is computed here; where libmuster.so can be loaded, its loader restores the
checkpoints written here and the other way round."""
import ctypes
import errno
import gc
import json
import os
import stat
import tempfile
import threading
import time
import unittest
import weakref
from unittest import mock

import common
from common import harness, muster  # noqa: F401  (puts python/ on sys.path)
from muster import loader as loader_module
from muster.iteration import STRATEGIES, Dataset, Plan, Stream
from muster.loader import Loader, read_checkpoint

LABELS = [i % 7 for i in range(100)]


def plan_of(strategy, world_size=3, epochs=3):
    kw = {"ranges": [(0, 40), (40, 41), (41, 100)]} if strategy == "range" else {}
    return Plan(Dataset(shards=[30, 0, 17, 53], labels=LABELS), seed=3, shuffle="global",
                world_size=world_size, strategy=strategy, tail="pad", block_size=4,
                epochs=epochs, **kw)


def stream_order(plan, rank, epoch, skip=0):
    s = Stream(plan, rank)
    s.set_epoch(epoch)
    return s.take(len(s))[skip:]


def jittery(index):
    """A load that finishes out of order: a sample's time depends on its index."""
    time.sleep((index * 7 % 5) / 20000.0)
    return ("sample", index)


class LoaderTestCase(unittest.TestCase):
    """A loader that waits for an item that never comes would stall the whole suite
    until ctest's timeout: here a test that hangs ends the run in 60 s, with every
    thread's traceback."""

    def setUp(self):
        common.arm_watchdog(60)
        self.addCleanup(common.arm_watchdog)


def loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("muster loader")]


class TestOrder(LoaderTestCase):
    def test_prefetch_on_and_off_give_the_stream_order_over_epochs(self):
        for strategy in STRATEGIES:
            plan = plan_of(strategy)
            for rank in (0, 2):
                expected = [[("sample", i) for i in stream_order(plan, rank, e)] for e in range(3)]
                for prefetch, threads in ((0, 1), (1, 1), (5, 1), (6, 4)):
                    with self.subTest(strategy=strategy, rank=rank, prefetch=prefetch,
                                      threads=threads):
                        with Stream(plan, rank).loader(jittery, prefetch=prefetch,
                                                       threads=threads) as loader:
                            got = []
                            for epoch in range(3):
                                loader.set_epoch(epoch)
                                got.append(list(loader))
                                self.assertEqual(loader.next(), None)   # the end stays
                        self.assertEqual(got, expected)

    def test_without_load_the_indices_and_the_stream_stays(self):
        plan = plan_of("hash")
        stream = Stream(plan, 1)
        stream.take(4)
        before = stream.get_pos()
        with stream.loader(prefetch=3) as loader:
            self.assertEqual(loader.take(5), stream_order(plan, 1, 0, skip=4)[:5])
            self.assertEqual(loader.remaining(), len(stream) - 9)
        self.assertEqual(stream.get_pos(), before)

    def test_the_position_counts_taken_samples_not_prefetched_ones(self):
        for strategy in ("round_robin", "stratified"):
            plan = plan_of(strategy)
            with Stream(plan, 2).loader(jittery, prefetch=8, threads=3) as loader:
                loader.set_epoch(1)
                head = loader.take(7)
                harness.wait_until(lambda: loader.stats()["buffered"] == 8,
                                   what="the buffer to fill")
                pos = loader.get_pos()
                record = loader.checkpoint()
                rest = list(loader)
            plain = Stream(plan, 2)
            plain.set_epoch(1)
            plain.take(7)
            self.assertEqual(pos, plain.get_pos(), strategy)
            self.assertEqual(head + rest, [("sample", i) for i in stream_order(plan, 2, 1)])
            self.assertEqual(rest, [("sample", i) for i in list(plain)])
            # the checkpoint resumes a new loader, and a plain stream, exactly there
            for resumed in (Stream(plan, 2).loader(jittery, prefetch=4, threads=2),
                            Stream(plan, 2).loader(jittery)):
                with resumed:
                    resumed.set_pos(record)
                    self.assertEqual(list(resumed), rest)
            s = Stream(plan, 2)
            s.set_pos(record)
            self.assertEqual([("sample", i) for i in s], rest)


class TestFailures(LoaderTestCase):
    def test_a_load_exception_comes_at_its_item_and_the_next_call_loads_it_again(self):
        plan = plan_of("contiguous")
        order = stream_order(plan, 0, 0)
        bad = order[7]
        for prefetch, threads in ((0, 1), (6, 1), (6, 3)):
            with self.subTest(prefetch=prefetch, threads=threads):
                failures = []

                def load(index):
                    if index == bad and not failures:
                        failures.append(index)
                        raise KeyError("sample %d is unreadable" % index)
                    return jittery(index)

                with Stream(plan, 0).loader(load, prefetch=prefetch, threads=threads) as loader:
                    got = [loader.next() for _ in range(7)]
                    with self.assertRaises(KeyError) as cm:
                        loader.next()
                    self.assertEqual(cm.exception.args, ("sample %d is unreadable" % bad,))
                    self.assertEqual(loader.get_pos().emitted, 7)
                    got += list(loader)
                    self.assertEqual(loader.stats()["samples_loaded"], len(order))
                self.assertEqual(got, [("sample", i) for i in order])

    def test_threads_are_gone_after_close_and_when_nobody_holds_the_loader(self):
        self.assertEqual(loader_threads(), [])
        loader = Stream(plan_of("round_robin"), 0).loader(jittery, prefetch=4, threads=3)
        self.assertEqual(len(loader_threads()), 3)
        loader.take(2)
        loader.close()
        self.assertEqual(loader_threads(), [])
        loader.close()   # twice does nothing
        with self.assertRaises(ValueError) as cm:
            loader.next()
        self.assertEqual(str(cm.exception), "the loader is closed")
        with Stream(plan_of("round_robin"), 0).loader(prefetch=2, threads=2) as loader:
            loader.take(3)
            self.assertEqual(len(loader_threads()), 2)
        self.assertEqual(loader_threads(), [])
        with Stream(plan_of("round_robin"), 0).loader(jittery, prefetch=0) as loader:
            self.assertEqual(loader_threads(), [])   # prefetch 0: no thread
        Stream(plan_of("round_robin"), 0).loader(prefetch=4, threads=2).take(1)
        gc.collect()
        harness.wait_until(lambda: not loader_threads(), what="the threads of a lost loader")

    def test_the_threads_of_a_loader_whose_load_holds_it_stop_when_it_is_lost(self):
        # The threads held `load`: a bound method of an object that holds its loader
        # (self.loader = stream.loader(self.read)) kept the object, and so the loader,
        # alive from the threads, which then never stopped.
        class Trainer:
            def __init__(self, plan):
                self.loader = Stream(plan, 0).loader(self.read, prefetch=4, threads=2)

            def read(self, index):
                return ("read", index)

        trainer = Trainer(plan_of("round_robin"))
        self.assertEqual(trainer.loader.take(2), [("read", i) for i in
                                                  stream_order(plan_of("round_robin"), 0, 0)[:2]])
        self.assertEqual(len(loader_threads()), 2)
        gone = threading.Event()
        weakref.finalize(trainer, gone.set)
        del trainer
        gc.collect()
        harness.wait_until(lambda: gone.is_set() and not loader_threads(),
                           what="the trainer collected and its loader's threads gone")
        # A load nobody else holds (a bound method of a temporary) lives as long as its
        # loader does.
        with Stream(plan_of("round_robin"), 0).loader(Trainer.__new__(Trainer).read,
                                                     prefetch=2, threads=2) as loader:
            gc.collect()
            self.assertEqual(loader.take(100), [("read", i) for i in
                                                stream_order(plan_of("round_robin"), 0, 0)])

    def test_bad_arguments_name_the_argument(self):
        stream = Stream(plan_of("round_robin"), 0)
        cases = [({"checkpoint_every": 0, "on_checkpoint": print}, "checkpoint_every=0: "),
                 ({"checkpoint_every": -5, "on_checkpoint": print}, "checkpoint_every=-5: "),
                 ({"checkpoint_every": True, "on_checkpoint": print}, "checkpoint_every=True: "),
                 ({"checkpoint_every": "10", "on_checkpoint": print}, "checkpoint_every='10': "),
                 ({"checkpoint_every": 10}, "checkpoint_every=10: give on_checkpoint="),
                 ({"prefetch": -1}, "prefetch=-1: "),
                 ({"prefetch": 2.5}, "prefetch=2.5: "),
                 ({"threads": 0, "prefetch": 4}, "threads=0: "),
                 ({"threads": 3, "prefetch": 2}, "threads=3 with prefetch=2: "),
                 ({"threads": 2}, "threads=2 with prefetch=0: "),
                 ({"load": 5}, "load=5: "),
                 ({"on_checkpoint": "x"}, "on_checkpoint='x': "),
                 ({"checkpoint_path": "/nonexistent-dir/pos.json"},
                  "checkpoint_path='/nonexistent-dir/pos.json': its directory /nonexistent-dir "
                  "does not exist")]
        for kwargs, start in cases:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(ValueError) as cm:
                    Loader(stream, **kwargs)
                self.assertTrue(str(cm.exception).startswith(start), str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            Loader([1, 2, 3])
        self.assertTrue(str(cm.exception).startswith("stream=[1, 2, 3]: "), str(cm.exception))
        self.assertEqual(loader_threads(), [])

    def test_positions_of_another_rank_or_configuration_are_refused_in_place(self):
        plan = plan_of("hash")
        other = Stream(plan, 1).loader()
        other.take(3)
        with Stream(plan, 0).loader(prefetch=3) as loader:
            loader.take(2)
            for pos in (other.checkpoint(), other.get_pos(),
                        Stream(plan_of("hash", world_size=2), 0).loader().checkpoint()):
                with self.assertRaises(ValueError) as cm:
                    loader.set_pos(pos)
                self.assertRegex(str(cm.exception), "another configuration(,| or) rank")
            with self.assertRaises(ValueError) as cm:
                loader.set_epoch(3)
            self.assertTrue(str(cm.exception).startswith("epoch 3: the plan has 3 epochs (0 to 2); "))
            self.assertEqual(loader.take(100), stream_order(plan, 0, 0, skip=2))

    def test_a_number_is_no_position(self):
        # loader.set_pos(2) started epoch 2 from its first sample without a word (the
        # loader's set_epoch went through the same code), where the caller likely meant
        # the sample at 2; a stream's set_pos raised an AttributeError about 'fingerprint'.
        plan = plan_of("hash")
        with Stream(plan, 0).loader(prefetch=2) as loader:
            loader.take(3)
            for thing in (2, True, 2.0, "0" * 80, None):
                for target in (loader, Stream(plan, 0)):
                    with self.assertRaises(TypeError) as cm:
                        target.set_pos(thing)
                    self.assertIn("pos: expected a StreamPos, its 40 bytes or a loader "
                                  "checkpoint (a dict), got %s" % type(thing).__name__,
                                  str(cm.exception))
                    self.assertIn("set_epoch", str(cm.exception))
            self.assertEqual((loader.epoch, loader.get_pos().emitted), (0, 3))
            self.assertEqual(loader.take(100), stream_order(plan, 0, 0, skip=3))


class TestStatistics(LoaderTestCase):
    def test_a_slow_consumer_hits_every_time(self):
        plan = plan_of("round_robin")
        length = len(Stream(plan, 0))
        with Stream(plan, 0).loader(jittery, prefetch=3, threads=2) as loader:
            for left in range(length, -1, -1):   # samples left, then the end
                harness.wait_until(lambda: loader.stats()["buffered"] == min(3, left + 1),
                                   what="the buffer to fill")
                loader.next()
            loader.checkpoint()
            loader.checkpoint()
            stats = loader.stats()
        self.assertEqual((stats["samples_loaded"], stats["prefetch_hits"],
                          stats["prefetch_misses"], stats["buffer_peak"], stats["checkpoints"],
                          stats["buffered"], stats["epoch"]), (length, length + 1, 0, 3, 2, 0, 0))

    def test_a_fast_consumer_misses(self):
        plan = plan_of("round_robin")
        order = stream_order(plan, 0, 0)
        holder = []

        def load(index):
            # each load waits until the caller asked for its sample: every sample a miss
            asked = order.index(index) + 1
            harness.wait_until(lambda: holder and sum(holder[0].stats()[k] for k in (
                "prefetch_hits", "prefetch_misses")) >= asked,
                               interval=0.001, what="the request of sample %d" % index)
            time.sleep(0.002)
            return index

        with Stream(plan, 0).loader(load, prefetch=4, threads=2) as loader:
            holder.append(loader)
            self.assertEqual(list(loader), order)
            stats = loader.stats()
        self.assertEqual(stats["samples_loaded"], len(order))
        # the end of the epoch is produced without a load: it may be there in time
        self.assertIn((stats["prefetch_hits"], stats["prefetch_misses"]),
                      ((0, len(order) + 1), (1, len(order))))
        self.assertGreaterEqual(stats["avg_load_time_us"], 2000)
        self.assertGreater(stats["utilization"], 0)

    def test_without_prefetch_every_request_misses(self):
        with Stream(plan_of("range"), 2).loader() as loader:
            items = list(loader) + [loader.next()]
            stats = loader.stats()
        self.assertEqual(items[-1], None)
        self.assertEqual((stats["prefetch_hits"], stats["prefetch_misses"], stats["buffer_peak"],
                          stats["avg_load_time_us"]), (0, len(items), 0, 0.0))


class TestAutomaticCheckpoints(LoaderTestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "stream.json")

    def tearDown(self):
        self.dir.cleanup()

    def test_every_n_samples_a_file_that_resumes(self):
        plan = plan_of("stratified")
        records = []

        def seen(record):
            with open(self.path, encoding="utf-8") as f:   # written before the call
                self.assertEqual(json.load(f), record)
            records.append(record)

        started = int(time.time() * 1000)
        with Stream(plan, 1).loader(jittery, prefetch=5, threads=2, checkpoint_every=10,
                                    on_checkpoint=seen, checkpoint_path=self.path) as loader:
            length = len(loader)
            first = list(loader)                   # 34 samples: checkpoints at 10, 20, 30
            loader.next_epoch()
            second = [loader.next() for _ in range(15)]   # 49 samples: at 40
            # a crash here: the last checkpoint stands after 40 samples
        ended = int(time.time() * 1000)
        self.assertEqual(length, 34)
        self.assertEqual([(r["epoch"], r["consumed"], r["checkpoints"]) for r in records],
                         [(0, 10, 1), (0, 20, 2), (0, 30, 3), (1, 6, 4)])
        for r in records:
            self.assertTrue(started <= r["time_ms"] <= ended, r)
            self.assertEqual((r["mode"], r["rank"], r["fingerprint"]),
                             ("standalone", 1, "%016x" % plan.fingerprint))
        self.assertEqual(os.listdir(self.dir.name), ["stream.json"])   # no temporary left
        self.assertEqual(first, [("sample", i) for i in stream_order(plan, 1, 0)])
        self.assertEqual(second, [("sample", i) for i in stream_order(plan, 1, 1)[:15]])
        with Stream(plan, 1).loader(jittery, prefetch=5, threads=2) as resumed:
            resumed.set_pos(read_checkpoint(self.path))
            self.assertEqual(list(resumed),
                             [("sample", i) for i in stream_order(plan, 1, 1, skip=6)])

    def test_at_call_boundaries_after_each_multiple(self):
        records = []
        with Stream(plan_of("round_robin"), 0).loader(prefetch=4, checkpoint_every=10,
                                                      on_checkpoint=records.append) as loader:
            while loader.take(4):
                pass
        # batches of 4 of 34 samples: the first call after 10, 20 and 30 samples
        self.assertEqual([r["consumed"] for r in records], [12, 20, 32])

    def test_a_failed_write_leaves_the_last_file_and_counts_nothing(self):
        plan = plan_of("round_robin")
        with Stream(plan, 0).loader(prefetch=3, checkpoint_every=5,
                                    checkpoint_path=self.path) as loader:
            got = loader.take(5) + [loader.next() for _ in range(5)]   # a checkpoint at 5
            with open(self.path, encoding="utf-8") as f:
                before = f.read()
            with mock.patch.object(loader_module.os, "fsync", side_effect=OSError(28, "full")):
                with self.assertRaises(OSError):
                    loader.next()                                       # the one at 10
            with open(self.path, encoding="utf-8") as f:
                self.assertEqual(f.read(), before)
            self.assertEqual(json.loads(before)["consumed"], 5)
            self.assertEqual(os.listdir(self.dir.name), ["stream.json"])
            self.assertEqual((loader.stats()["checkpoints"], loader.get_pos().emitted), (1, 10))
            got += list(loader)                                         # written now
            self.assertEqual(read_checkpoint(self.path)["consumed"], 30)
        self.assertEqual(got, stream_order(plan, 0, 0))

    def test_the_file_is_the_one_open_would_write_with_its_mode(self):
        """A checkpoint file gets the mode open() gives: 0666 less the umask when new, its
        own permission bits when replaced; a symbolic link is written through."""
        plan = plan_of("round_robin")
        old_umask = os.umask(0o022)
        try:
            with Stream(plan, 0).loader(checkpoint_every=1, checkpoint_path=self.path) as loader:
                loader.take(2)
                loader.take(2)   # the first checkpoint, at 2
                self.assertEqual(oct(os.stat(self.path).st_mode & 0o7777), oct(0o644))
                os.chmod(self.path, 0o660)
                loader.take(2)
                self.assertEqual(oct(os.stat(self.path).st_mode & 0o7777), oct(0o660))
        finally:
            os.umask(old_umask)
        os.mkdir(os.path.join(self.dir.name, "real"))
        link = os.path.join(self.dir.name, "link.json")
        os.symlink(os.path.join("real", "pos.json"), link)   # dangling: created
        with Stream(plan, 0).loader(checkpoint_every=1, checkpoint_path=link) as loader:
            loader.take(3)
            loader.take(1)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(read_checkpoint(os.path.join(self.dir.name, "real", "pos.json"))
                         ["consumed"], 3)
        self.assertEqual(sorted(os.listdir(self.dir.name)), ["link.json", "real", "stream.json"])
        self.assertEqual(os.listdir(os.path.join(self.dir.name, "real")), ["pos.json"])

    def test_a_path_that_cannot_be_written_is_refused_when_the_loader_is_made(self):
        """checkpoint_path is checked as the write will see it (links followed): a
        ValueError at once, not an OSError at the first checkpoint, and nothing read."""
        d = self.dir.name
        open(os.path.join(d, "plain"), "w").close()
        os.mkdir(os.path.join(d, "real"))
        links = {"into-missing": os.path.join("missing", "pos.json"),
                 "into-file": os.path.join("plain", "pos.json"),
                 "to-dir": "real", "loop": "loop"}
        for name, to in links.items():
            os.symlink(to, os.path.join(d, name))
        cases = [
            ("missing/pos.json", "its directory %s/missing does not exist" % d),
            ("missing/deeper/pos.json", "its directory %s/missing/deeper does not exist" % d),
            ("plain/pos.json", "its directory %s/plain is not a directory" % d),
            ("real", "a directory, not a file"),
            ("real/", "a directory, not a file"),
            ("into-missing", "a symbolic link to %s/missing/pos.json, whose directory "
                             "%s/missing does not exist" % (d, d)),
            ("into-file", "a symbolic link to %s/plain/pos.json, whose directory %s/plain "
                          "is not a directory" % (d, d)),
            ("to-dir", "a symbolic link to %s/real, a directory, not a file" % d),
            ("loop", os.strerror(errno.ELOOP))]
        loaded = []
        for name, why in cases:
            path = os.path.join(d, name)
            with self.subTest(path=name):
                with self.assertRaises(ValueError) as cm:
                    Stream(plan_of("round_robin"), 0).loader(
                        loaded.append, prefetch=4, threads=2, checkpoint_every=1,
                        checkpoint_path=path)
                self.assertEqual(str(cm.exception), "checkpoint_path=%r: %s" % (path, why))
        self.assertEqual((loaded, loader_threads()), ([], []))
        self.assertEqual(sorted(os.listdir(d)), sorted(["plain", "real"] + list(links)))
        self.assertEqual(os.listdir(os.path.join(d, "real")), [])
        # A new file in a directory that exists, through a link or not, is fine.
        for path in (os.path.join(d, "real", "pos.json"), os.path.join(d, "to-dir", "p.json")):
            with Stream(plan_of("round_robin"), 0).loader(checkpoint_every=1,
                                                          checkpoint_path=path) as loader:
                loader.take(2)
                loader.take(1)
            self.assertEqual(read_checkpoint(path)["consumed"], 2)

    def test_a_fifo_is_written_into(self):
        """A device or a FIFO as checkpoint_path is written into, not replaced by a file."""
        fifo = os.path.join(self.dir.name, "fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # the writer's open need not wait
        self.addCleanup(os.close, reader)
        with Stream(plan_of("round_robin"), 0).loader(checkpoint_every=1,
                                                      checkpoint_path=fifo) as loader:
            loader.take(1)
            loader.take(1)   # the checkpoint at 1
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        first = os.read(reader, 65536).split(b"\n")[0]
        self.assertEqual(json.loads(first)["consumed"], 1)

    def test_a_reader_never_finds_a_partial_file(self):
        plan = plan_of("round_robin", epochs=0)
        reads, bad, stop = [0], [], threading.Event()

        def reader():
            while not stop.is_set():
                try:
                    record = read_checkpoint(self.path)
                    Stream(plan, 0).set_pos(record)
                    reads[0] += 1
                except FileNotFoundError:
                    pass
                except ValueError as e:   # a partial or empty file
                    bad.append(str(e))

        with Stream(plan, 0).loader(checkpoint_every=1, checkpoint_path=self.path) as loader:
            loader.next()
            loader.next()                                  # the first file
            watcher = threading.Thread(target=reader)
            watcher.start()
            try:
                for epoch in range(10):
                    loader.set_epoch(epoch)
                    for _ in loader:
                        pass
                harness.wait_until(lambda: reads[0] > 20, what="reads of the file")
            finally:
                stop.set()
                watcher.join()
        self.assertEqual(bad, [])

    def test_read_checkpoint_refuses_what_is_not_one(self):
        for text in ("", "{\"mode\": \"stand", "[1, 2]", "{\"mode\": \"coordinated\"}"):
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(text)
            with self.assertRaises(ValueError) as cm:
                read_checkpoint(self.path)
            self.assertIn("not a standalone loader checkpoint", str(cm.exception))
            # Text that is not JSON says where the parser stopped.
            self.assertEqual("not valid JSON" in str(cm.exception), text in ("", "{\"mode\": \"stand"),
                             str(cm.exception))
        with open(self.path, "w", encoding="utf-8") as f:
            f.write('{"mode":\n "standalone",\n bad}')
        with self.assertRaises(ValueError) as cm:
            read_checkpoint(self.path)
        self.assertEqual(str(cm.exception), "%s: not a standalone loader checkpoint: not valid "
                         "JSON: Expecting property name enclosed in double quotes (at line 3, "
                         "column 2)" % self.path)
        plan = plan_of("round_robin")
        record = Stream(plan, 0).loader().checkpoint()
        for key, value, words in (("version", 2, "version 2 is not known"),
                                  ("position", "abc", "is not 40 bytes in hex"),
                                  ("consumed", 3, "differs from its epoch 0 and consumed 3"),
                                  ("fingerprint", "0" * 16, "another configuration or rank")):
            with self.assertRaises(ValueError) as cm:
                Stream(plan, 0).set_pos(dict(record, **{key: value}))
            self.assertIn(words, str(cm.exception))


def _libmuster():
    build = os.environ.get("MUSTER_BUILD_DIR")
    try:
        lib = ctypes.CDLL(os.path.join(build, "libmuster.so")) if build else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "muster_loader_open") else None


class IterConfig(ctypes.Structure):
    """muster_iter_config_t (include/muster.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("num_samples", ctypes.c_uint64),
                ("num_shards", ctypes.c_size_t), ("shard_counts", ctypes.POINTER(ctypes.c_uint64)),
                ("shard_uris", ctypes.c_void_p), ("labels", ctypes.POINTER(ctypes.c_uint32)),
                ("seed", ctypes.c_uint64), ("shuffle", ctypes.c_char_p),
                ("shuffle_block_size", ctypes.c_uint64), ("strategy", ctypes.c_char_p),
                ("world_size", ctypes.c_uint32), ("block_size", ctypes.c_uint64),
                ("epochs", ctypes.c_uint64), ("tail", ctypes.c_char_p),
                ("num_partitions", ctypes.c_uint32), ("hash_seed", ctypes.c_uint64),
                ("ranges", ctypes.POINTER(ctypes.c_uint64)), ("lease_ms", ctypes.c_int64),
                ("rank_timeout_ms", ctypes.c_int64), ("replication", ctypes.c_int64),
                ("cluster_sync", ctypes.c_int)]


class LoaderOpts(ctypes.Structure):
    """muster_loader_opts_t (include/muster.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("config", ctypes.POINTER(IterConfig)),
                ("rank", ctypes.c_uint32), ("url", ctypes.c_char_p), ("token", ctypes.c_char_p),
                ("name", ctypes.c_char_p), ("checkpoint", ctypes.c_char_p),
                ("prefetch", ctypes.c_size_t), ("blocks_per_request", ctypes.c_size_t),
                ("load", ctypes.c_void_p), ("free_sample", ctypes.c_void_p),
                ("user", ctypes.c_void_p), ("head_wait_ms", ctypes.c_int64)]


class TestAgainstTheCLoader(LoaderTestCase):
    """A checkpoint written here restores libmuster's standalone loader, and one of its
    get_checkpoint restores a loader here, both at the same sample."""

    def setUp(self):
        super().setUp()
        self.lib = _libmuster()
        if self.lib is None:
            self.skipTest("libmuster.so is not built here (or is a sanitizer build)")
        lib = self.lib
        lib.muster_loader_open.argtypes = [ctypes.POINTER(LoaderOpts), ctypes.c_void_p,
                                           ctypes.c_void_p]
        lib.muster_loader_next.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.muster_loader_restore.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.muster_loader_get_checkpoint.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.muster_loader_close.argtypes = [ctypes.c_void_p]
        lib.muster_free.argtypes = [ctypes.c_void_p]
        lib.muster_loader_message.restype = ctypes.c_char_p
        lib.muster_loader_message.argtypes = [ctypes.c_void_p]

    def open_c(self, rank):
        cfg = IterConfig()
        self.lib.muster_iter_config_init_sized(ctypes.byref(cfg),
                                               ctypes.c_size_t(ctypes.sizeof(cfg)))
        cfg.num_samples, cfg.seed, cfg.shuffle = 100, 3, b"global"
        cfg.strategy, cfg.world_size, cfg.tail, cfg.epochs = b"hash", 3, b"pad", 3
        opts = LoaderOpts()
        self.lib.muster_loader_opts_init_sized(ctypes.byref(opts),
                                               ctypes.c_size_t(ctypes.sizeof(opts)))
        self._keep = cfg
        opts.config, opts.rank, opts.prefetch = ctypes.pointer(cfg), rank, 4
        handle = ctypes.c_void_p()
        self.assertEqual(self.lib.muster_loader_open(ctypes.byref(opts), ctypes.byref(handle),
                                                     None), 0)
        self.addCleanup(self.lib.muster_loader_close, handle)
        return handle

    def c_rest(self, handle):
        out, index, has = [], ctypes.c_uint64(), ctypes.c_int()
        while True:
            self.assertEqual(self.lib.muster_loader_next(handle, ctypes.byref(index), None,
                                                         ctypes.byref(has)), 0)
            if not has.value:
                return out
            out.append(index.value)

    def test_checkpoints_go_both_ways(self):
        plan = Plan(100, seed=3, shuffle="global", strategy="hash", world_size=3, tail="pad",
                    epochs=3)
        handle = self.open_c(1)
        with Stream(plan, 1).loader(prefetch=4, threads=2) as loader:
            loader.set_epoch(1)
            loader.take(9)
            record = loader.checkpoint()
            rest = list(loader)
        text = json.dumps(record).encode()
        self.assertEqual(self.lib.muster_loader_restore(handle, text), 0,
                         self.lib.muster_loader_message(handle))
        self.assertEqual(self.c_rest(handle), rest)
        # and the C loader's own checkpoint (no position: found by seeking) resumes here
        self.assertEqual(self.lib.muster_loader_restore(handle, text), 0)
        index, has = ctypes.c_uint64(), ctypes.c_int()
        for _ in range(4):
            self.lib.muster_loader_next(handle, ctypes.byref(index), None, ctypes.byref(has))
        written = ctypes.c_void_p()
        self.assertEqual(self.lib.muster_loader_get_checkpoint(handle, ctypes.byref(written)), 0)
        c_record = json.loads(ctypes.string_at(written).decode())
        self.lib.muster_free(written)
        self.assertNotIn("position", c_record)
        with Stream(plan, 1).loader(prefetch=2) as loader:
            loader.set_pos(c_record)
            self.assertEqual(list(loader), rest[4:])


if __name__ == "__main__":
    unittest.main()
