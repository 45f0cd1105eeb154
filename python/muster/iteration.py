"""Deterministic partitioning and shuffling, computed locally (version 1).

A pure-Python port of src/core/perm.c, dataset.c, partition.c and stream.c:
the same configuration gives exactly the indices the C code gives (the
definitions are in docs/iterations.md, "Version 1, exactly"; the tests pin the
C unit tests' golden values).  Nothing here talks to a server.

    ds = Dataset(1000)                          # or Dataset(shards=[...], labels=[...])
    plan = Plan(ds, shuffle="global", seed=42, world_size=8, epochs=10)
    s = Stream(plan, rank=3)
    for epoch in range(10):
        s.set_epoch(epoch)
        for index in s:
            ...
    pos = s.get_pos(); s.set_pos(pos)          # resume exactly; pos.encode() -> 40 bytes
"""
import bisect
import operator
import struct

from ._xxh3 import hash64, xxh3_64

PERM_ALGORITHM_VERSION = 1
PART_ALGORITHM_VERSION = 1
PERM_ROUNDS = 6
STREAM_POS_VERSION = 1
STREAM_POS_BYTES = 40

MAX_SAMPLES = 1 << 48
MAX_SHARDS = 1 << 32
MAX_CLASSES = 1 << 20
MAX_WORLD_SIZE = 65536
DEFAULT_BLOCK_SIZE = 256
DEFAULT_SHUFFLE_BLOCK_SIZE = 1024

SHUFFLES = ("none", "global", "shard")
STRATEGIES = ("round_robin", "contiguous", "hash", "range", "stratified", "dynamic")
TAILS = ("keep", "pad", "drop")
# The partition strategies of tenflowers (docs/coming-from.md), by the name a
# refusal of theirs suggests: their names are not muster's, and Adaptive's
# counterpart has another name altogether.
TENFLOWERS_STRATEGIES = {"roundrobin": "round_robin", "contiguous": "contiguous",
                         "hashbased": "hash", "rangebased": "range", "stratified": "stratified",
                         "adaptive": "dynamic"}
POSITIONAL = ("round_robin", "contiguous", "dynamic")

SALT_SHARD_ORDER = 0x6f2d647261687301
SALT_WINDOW = 0x776f646e69770102
SALT_FINGERPRINT = 0x746e697270726603
_M64 = 0xFFFFFFFFFFFFFFFF
_FP_CHUNK = 256

# The head's words (src/server/iter.c) for a dataset without samples, which it refuses
# to make an iteration of; a standalone plan refuses one the same way, as the C
# standalone loader does.
NO_SAMPLES = ("dataset: it has no samples (num_samples 0, or shards that hold none); an "
              "iteration needs at least one, as an empty one would be finished at once with "
              "nothing for any rank")


class Perm:
    """The keyed bijection over [0, n) of perm.h (Feistel network, cycle walking)."""

    __slots__ = ("n", "seed", "epoch", "half_bits", "half_mask", "keys")

    def __init__(self, n, seed, epoch):
        self.n = n
        self.seed = seed & _M64
        self.epoch = epoch & _M64
        bits = (n - 1).bit_length() if n > 1 else 0
        half = max(1, (bits + 1) // 2)
        self.half_bits = half
        self.half_mask = (1 << half) - 1
        self.keys = tuple(xxh3_64(struct.pack("<QQQ", n & _M64, self.epoch, i), self.seed)
                          for i in range(PERM_ROUNDS))

    def _encrypt(self, x):
        k, mask = self.half_bits, self.half_mask
        left, right = x >> k, x & mask
        for key in self.keys:
            left, right = right, left ^ (hash64(right, key) & mask)
        return (left << k) | right

    def _decrypt(self, y):
        k, mask = self.half_bits, self.half_mask
        left, right = y >> k, y & mask
        for key in reversed(self.keys):
            left, right = right ^ (hash64(left, key) & mask), left
        return (left << k) | right

    def __call__(self, position):
        if not 0 <= position < self.n:
            raise IndexError("position %d outside [0, %d)" % (position, self.n))
        if self.n <= 1:
            return position
        y = self._encrypt(position)
        while y >= self.n:
            y = self._encrypt(y)
        return y

    apply = __call__

    def inverse(self, index):
        if not 0 <= index < self.n:
            raise IndexError("index %d outside [0, %d)" % (index, self.n))
        if self.n <= 1:
            return index
        x = self._decrypt(index)
        while x >= self.n:
            x = self._decrypt(x)
        return x


SEED_MAX = 2 ** 63 - 1  # the head reads JSON integers as signed 64-bit numbers


def _seed(name, value):
    """``value`` as a seed, or ValueError: the head takes 0 to 2^63-1, and a plan computed
    here must be one the head could run; wrapping a negative or larger one would silently
    give another seed's order."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or not 0 <= number <= SEED_MAX:
        raise ValueError("%s: an integer from 0 to 2^63-1, not %.60r (a 64-bit seed such as "
                         "torch.initial_seed() can be taken modulo 2**63)" % (name, value))
    return number


class Dataset:
    """N samples, optionally in shards (counts) and with a class label per sample."""

    def __init__(self, num_samples=None, shards=None, labels=None):
        if shards is None:
            if num_samples is None:
                raise ValueError("give num_samples or shards")
            shards = [num_samples]
            self.implicit = True
        else:
            shards = [int(c) for c in shards]
            self.implicit = False
            if not shards or len(shards) > MAX_SHARDS or any(c < 0 for c in shards):
                raise ValueError("shards: 1 to 2^32 non-negative counts")
            if num_samples is not None and num_samples != sum(shards):
                raise ValueError("num_samples differs from the sum of the shard counts")
        self.shard_counts = shards
        self.shard_starts = [0]
        for c in shards:
            self.shard_starts.append(self.shard_starts[-1] + c)
        self.num_samples = self.shard_starts[-1]
        if self.num_samples > MAX_SAMPLES or self.num_samples < 0:
            raise ValueError("num_samples: 0 to 2^48, not %d" % self.num_samples)
        self.labels = None
        if labels is not None:
            self._set_labels(labels)
        self.fingerprint = self._fingerprint()

    def _set_labels(self, labels):
        labels = [int(v) for v in labels]
        if len(labels) != self.num_samples or any(not 0 <= v < MAX_CLASSES for v in labels):
            raise ValueError("labels: one per sample, each below 2^20")
        self.labels = labels
        self.num_classes = max(labels) + 1 if labels else 0
        counts = [0] * self.num_classes
        ordinals = []
        for v in labels:
            ordinals.append(counts[v])
            counts[v] += 1
        self.class_ordinals = ordinals
        self.class_starts = [0]
        for c in counts:
            self.class_starts.append(self.class_starts[-1] + c)

    def _fingerprint(self):
        head = struct.pack("<QQQ", self.num_samples, len(self.shard_counts), self.labels is not None)
        fp = xxh3_64(head, 0)
        fp = _fp_chain(fp, self.shard_counts)
        if self.labels is not None:
            fp = _fp_chain(fp, self.labels)
        return fp

    @property
    def num_shards(self):
        return len(self.shard_counts)

    def shard_of(self, sample):
        return bisect.bisect_right(self.shard_starts, sample, 0, len(self.shard_counts)) - 1

    def shape(self):
        """The shape as the iteration API writes it (docs/api.md, Iterations)."""
        d = {"num_samples": self.num_samples}
        if not self.implicit:
            d["shards"] = list(self.shard_counts)
        if self.labels is not None:
            d["labels"] = list(self.labels)
        return d


def _fp_chain(fp, values):
    for i in range(0, len(values), _FP_CHUNK):
        chunk = values[i:i + _FP_CHUNK]
        fp = xxh3_64(struct.pack("<%dQ" % len(chunk), *chunk), fp)
    return fp


def _shuffle_refusal(shuffle):
    """Why Plan refuses ``shuffle``: a bool (PyTorch's and tenflowers' habit) is told
    which mode it likely meant."""
    text = "shuffle: one of %s, not %.60r" % (", ".join(SHUFFLES), shuffle)
    if isinstance(shuffle, bool):
        text += " (write shuffle=%r: a seed alone does not shuffle)" % ("global" if shuffle else "none")
    return text


def _strategy_refusal(strategy):
    """Why Plan refuses ``strategy``, naming muster's counterpart of a tenflowers name
    (RoundRobin, HashBased, Adaptive, ...) when it is one."""
    text = "strategy: one of %s, not %.60r" % (", ".join(STRATEGIES), strategy)
    key = "".join(c for c in str(strategy).lower() if c.isalnum())
    meant = TENFLOWERS_STRATEGIES.get(key)
    if meant == "dynamic":
        text += (" (tenflowers' Adaptive is strategy='dynamic' of a coordinated iteration, "
                 "muster.CoordinatedStream: any rank leases the next block; a standalone "
                 "stream deals dynamic's blocks round robin)")
    elif meant:
        text += " (did you mean %r?)" % meant
    return text


class Plan:
    """A validated configuration for one dataset (part_plan_t)."""

    def __init__(self, dataset, seed=0, shuffle="none", shuffle_block_size=DEFAULT_SHUFFLE_BLOCK_SIZE,
                 strategy="round_robin", world_size=1, block_size=DEFAULT_BLOCK_SIZE, epochs=1,
                 tail="keep", num_partitions=0, hash_seed=0, ranges=None, version=PART_ALGORITHM_VERSION):
        if not isinstance(dataset, Dataset):
            dataset = Dataset(int(dataset))
        if dataset.num_samples == 0:
            raise ValueError(NO_SAMPLES)
        if version != PART_ALGORITHM_VERSION:
            raise ValueError("version: only %d is known" % PART_ALGORITHM_VERSION)
        if shuffle not in SHUFFLES:
            raise ValueError(_shuffle_refusal(shuffle))
        if strategy not in STRATEGIES:
            raise ValueError(_strategy_refusal(strategy))
        if tail not in TAILS:
            raise ValueError("tail: one of %s" % ", ".join(TAILS))
        if not 1 <= world_size <= MAX_WORLD_SIZE:
            raise ValueError("world_size: 1 to 65536")
        if not 1 <= block_size <= MAX_SAMPLES:
            raise ValueError("block_size: 1 to 2^48")
        if shuffle == "shard" and not 1 <= shuffle_block_size <= MAX_SAMPLES:
            raise ValueError("shuffle_block_size: 1 to 2^48")
        if epochs < 0:
            raise ValueError("epochs: >= 0 (0 is unbounded)")
        if strategy == "range" and ranges is None:
            raise ValueError("ranges: the range strategy needs world_size pairs [begin, end)")
        if strategy == "stratified" and dataset.labels is None:
            raise ValueError("strategy: stratified needs a class label per sample, and the dataset "
                             "has none: Dataset(N, labels=[...]), one label per sample (the "
                             "number of classes follows from them)")
        self.dataset = dataset
        self.n = dataset.num_samples
        self.seed = _seed("seed", seed)
        self.shuffle = shuffle
        self.shuffle_block_size = shuffle_block_size
        self.strategy = strategy
        self.world_size = world_size
        self.block_size = block_size
        self.epochs = epochs
        self.tail = tail
        self.hash_seed = _seed("hash_seed", hash_seed)
        self.num_partitions = 0 if strategy != "hash" else (num_partitions or world_size)
        self.ranges = None
        self.positional = strategy in POSITIONAL
        if strategy == "range":
            self._build_ranges(ranges)
        self.owned = self._count_owned()
        self.owned_min = min(self.owned)
        self.owned_max = max(self.owned)
        self.fingerprint = self._fingerprint()

    def config(self):
        """The configuration as a dict (the iteration API's field names)."""
        d = {"version": PART_ALGORITHM_VERSION, "seed": self.seed, "shuffle": self.shuffle,
             "shuffle_block_size": self.shuffle_block_size, "strategy": self.strategy,
             "world_size": self.world_size, "block_size": self.block_size, "epochs": self.epochs,
             "tail": self.tail}
        if self.strategy == "hash":
            d["num_partitions"] = self.num_partitions
            d["hash_seed"] = self.hash_seed
        if self.ranges is not None:
            d["ranges"] = [list(r) for r in self.ranges]
        return d

    def with_world_size(self, world_size):
        cfg = self.config()
        cfg["world_size"] = world_size
        cfg.pop("version")
        if self.strategy == "hash" and self.num_partitions == self.world_size:
            cfg["num_partitions"] = 0
        return Plan(self.dataset, **cfg)

    def _build_ranges(self, ranges):
        ranges = [(int(b), int(e)) for b, e in ranges]
        if len(ranges) != self.world_size:
            raise ValueError("ranges: world_size (%d) pairs" % self.world_size)
        lookup = []
        for r, (b, e) in enumerate(ranges):
            if e < b:
                raise ValueError("ranges[%d]: end before begin" % r)
            if e > b:
                lookup.append((b, e, r))
        lookup.sort()
        covered = 0
        for b, e, _ in lookup:
            if b != covered:
                raise ValueError("ranges: must tile [0, N) with no gap or overlap")
            covered = e
        if covered != self.n:
            raise ValueError("ranges: must tile [0, N) with no gap or overlap")
        self.ranges = ranges
        self._range_begins = [b for b, _, _ in lookup]
        self._range_ranks = [r for _, _, r in lookup]

    def _count_owned(self):
        n, w, s = self.n, self.world_size, self.strategy
        if s == "hash":
            owned = [0] * w
            for sample in range(n):
                owned[self.sample_owner(sample)] += 1
            return owned
        if s == "range":
            return [e - b for b, e in self.ranges]
        if s == "dynamic":
            bs = self.block_size
            blocks = n // bs + (n % bs != 0)
            out = []
            for r in range(w):
                count = (blocks // w + (r < blocks % w)) * bs
                if blocks > 0 and (blocks - 1) % w == r:
                    count -= blocks * bs - n
                out.append(count)
            return out
        return [n // w + (r < n % w) for r in range(w)]

    def _fingerprint(self):
        fields = (PART_ALGORITHM_VERSION, PERM_ALGORITHM_VERSION, self.dataset.fingerprint, self.seed,
                  SHUFFLES.index(self.shuffle), self.shuffle_block_size, STRATEGIES.index(self.strategy),
                  self.world_size, self.block_size, TAILS.index(self.tail), self.num_partitions,
                  self.hash_seed)
        fp = SALT_FINGERPRINT
        for f in fields:
            fp = hash64(f & _M64, fp)
        if self.ranges is not None:
            for b, e in self.ranges:
                fp = hash64(b, fp)
                fp = hash64(e, fp)
        return fp

    # ---- ownership ----------------------------------------------------------------

    def position_owner(self, position):
        n, w = self.n, self.world_size
        if self.strategy == "contiguous":
            q, rem = divmod(n, w)
            boundary = rem * (q + 1)
            if position < boundary:
                return position // (q + 1)
            return rem + (position - boundary) // q
        if self.strategy == "dynamic":
            return (position // self.block_size) % w
        return position % w

    def sample_owner(self, sample):
        if self.strategy == "hash":
            return (hash64(sample, self.hash_seed) % self.num_partitions) % self.world_size
        if self.strategy == "range":
            i = bisect.bisect_right(self._range_begins, sample) - 1
            return self._range_ranks[i]
        ds = self.dataset
        cls = ds.labels[sample]
        return (ds.class_starts[cls] + ds.class_ordinals[sample]) % self.world_size

    def rank_position(self, rank, k):
        if self.strategy == "contiguous":
            q, rem = divmod(self.n, self.world_size)
            return rank * q + min(rank, rem) + k
        if self.strategy == "dynamic":
            bs = self.block_size
            block = rank + (k // bs) * self.world_size
            return block * bs + k % bs
        return rank + k * self.world_size

    def pad_position(self, rank, k):
        return (rank + (k % self.n) * self.world_size) % self.n

    def rank_owned(self, rank):
        return self.owned[rank]

    def rank_len(self, rank):
        if self.tail == "pad":
            return self.owned_max
        if self.tail == "drop":
            return self.owned_min
        return self.owned[rank]

    def rank_blocks(self, rank):
        length = self.rank_len(rank)
        return length // self.block_size + (length % self.block_size != 0)

    def num_blocks(self):
        return self.n // self.block_size + (self.n % self.block_size != 0)

    def epoch(self, epoch):
        """The order of epoch ``epoch`` (an :class:`Epoch`)."""
        if self.epochs and epoch >= self.epochs:
            which = ("1 epoch (epoch 0)" if self.epochs == 1
                     else "%d epochs (0 to %d)" % (self.epochs, self.epochs - 1))
            raise ValueError("epoch %d: the plan has %s; give Plan(..., epochs=N) for more, or "
                             "epochs=0 for no last epoch" % (epoch, which))
        return Epoch(self, epoch)


class Epoch:
    """One epoch's order: ``epoch[position]`` is the sample at that position."""

    def __init__(self, plan, epoch):
        self.plan = plan
        self.number = epoch
        if plan.shuffle == "global":
            self._perm = Perm(plan.n, plan.seed, epoch)
        elif plan.shuffle == "shard":
            ds = plan.dataset
            order = Perm(ds.num_shards, hash64(SALT_SHARD_ORDER, plan.seed), epoch)
            self._slot_shard = [order(j) for j in range(ds.num_shards)]
            starts = [0]
            for s in self._slot_shard:
                starts.append(starts[-1] + ds.shard_counts[s])
            self._slot_starts = starts
            self._window_seed = hash64(SALT_WINDOW, plan.seed)
            self._window_cache = {}

    def __len__(self):
        return self.plan.n

    def __getitem__(self, position):
        if not 0 <= position < self.plan.n:
            raise IndexError(position)
        shuffle = self.plan.shuffle
        if shuffle == "global":
            return self._perm(position)
        if shuffle == "shard":
            return self._shard_index(position)
        return position

    def _shard_index(self, position):
        slot = bisect.bisect_right(self._slot_starts, position, 0, len(self._slot_shard)) - 1
        shard = self._slot_shard[slot]
        ds = self.plan.dataset
        offset = position - self._slot_starts[slot]
        wsize = self.plan.shuffle_block_size
        window = offset // wsize
        wstart = window * wsize
        key = (shard, window)
        within = self._window_cache.get(key)
        if within is None:
            left = ds.shard_counts[shard] - wstart
            within = Perm(min(left, wsize), self._window_seed, hash64(window, hash64(shard, self.number)))
            if len(self._window_cache) > 64:
                self._window_cache.clear()
            self._window_cache[key] = within
        return ds.shard_starts[shard] + wstart + within(offset - wstart)

    def owner_at(self, position):
        if self.plan.positional:
            return self.plan.position_owner(position)
        return self.plan.sample_owner(self[position])


# Why a standalone position is refused by another configuration, and where to go for
# another world size (a position is one rank's place in one plan's list).
ANOTHER_CONFIGURATION = (
    "another dataset, seed, shuffle, strategy, world size or block size. A standalone "
    "position resumes only the plan and rank that saved it; to resume on another number "
    "of ranks, save muster.torch.DistributedSampler's state_dict() (standalone, elastic) or "
    "read through a coordinated iteration (muster.CoordinatedStream), whose states load "
    "into any world size")


class StreamPos:
    """A stream's position: (fingerprint, rank, epoch, emitted, cursor)."""

    __slots__ = ("fingerprint", "rank", "epoch", "emitted", "cursor")

    def __init__(self, fingerprint, rank, epoch, emitted, cursor):
        self.fingerprint, self.rank, self.epoch = fingerprint, rank, epoch
        self.emitted, self.cursor = emitted, cursor

    def encode(self):
        """The 40 stable bytes of stream_pos_encode."""
        return struct.pack("<IIQQQQ", STREAM_POS_VERSION, self.rank, self.fingerprint, self.epoch,
                           self.emitted, self.cursor)

    @classmethod
    def decode(cls, data):
        if len(data) != STREAM_POS_BYTES:
            raise ValueError("a stream position is %d bytes" % STREAM_POS_BYTES)
        version, rank, fp, epoch, emitted, cursor = struct.unpack("<IIQQQQ", bytes(data))
        if version != STREAM_POS_VERSION:
            raise ValueError("stream position version %d is not known" % version)
        return cls(fp, rank, epoch, emitted, cursor)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __eq__(self, other):
        return isinstance(other, StreamPos) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "StreamPos(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class Stream:
    """Rank ``rank``'s standalone index stream (stream.h), starting at epoch 0."""

    def __init__(self, plan, rank):
        if not 0 <= rank < plan.world_size:
            raise ValueError("rank %d: world_size is %d" % (rank, plan.world_size))
        self.plan = plan
        self.rank = rank
        self.owned = plan.rank_owned(rank)
        self.len = plan.rank_len(rank)
        self._ep = plan.epoch(0)
        self.emitted = 0
        self.cursor = 0

    @property
    def epoch(self):
        return self._ep.number

    def __len__(self):
        return self.len

    def remaining(self):
        return self.len - self.emitted

    def block(self):
        return self.emitted // self.plan.block_size

    def _scan_next_owned(self):
        plan, ep, rank = self.plan, self._ep, self.rank
        while True:
            sample = ep[self.cursor]
            self.cursor += 1
            if plan.sample_owner(sample) == rank:
                return sample

    def next(self):
        """The next index of this epoch, or None at its end."""
        if self.emitted >= self.len:
            return None
        k = self.emitted
        self.emitted += 1
        if k >= self.owned:
            return self._ep[self.plan.pad_position(self.rank, k)]
        if self.plan.positional:
            return self._ep[self.plan.rank_position(self.rank, k)]
        return self._scan_next_owned()

    def __iter__(self):
        while True:
            index = self.next()
            if index is None:
                return
            yield index

    def take(self, count):
        out = []
        while len(out) < count:
            index = self.next()
            if index is None:
                break
            out.append(index)
        return out

    def _switch_epoch(self, epoch):
        if self._ep.number != epoch:
            self._ep = self.plan.epoch(epoch)

    def set_epoch(self, epoch):
        self._switch_epoch(epoch)
        self.emitted = 0
        self.cursor = 0

    def next_epoch(self):
        self.set_epoch(self._ep.number + 1)

    def seek(self, item):
        if not 0 <= item <= self.len:
            raise ValueError("item %d outside [0, %d]" % (item, self.len))
        self.emitted = 0
        self.cursor = 0
        if self.plan.positional:
            self.emitted = item
            return
        for _ in range(min(item, self.owned)):
            self._scan_next_owned()
        self.emitted = item

    def get_pos(self):
        return StreamPos(self.plan.fingerprint, self.rank, self._ep.number, self.emitted,
                         0 if self.plan.positional else self.cursor)

    def set_pos(self, pos):
        """Resumes at ``pos``: a StreamPos, its 40 bytes, or a loader's checkpoint (a dict,
        see muster.loader)."""
        if isinstance(pos, (bytes, bytearray)):
            pos = StreamPos.decode(pos)
        elif isinstance(pos, dict):
            from .loader import checkpoint_position
            pos = checkpoint_position(pos, self.plan, self.rank)
        elif not isinstance(pos, StreamPos):
            raise TypeError("pos: expected a StreamPos, its 40 bytes or a loader checkpoint (a "
                            "dict), got %s: set_epoch(E) starts an epoch, seek(I) goes to an "
                            "item" % type(pos).__name__)
        if pos.fingerprint != self.plan.fingerprint:
            raise ValueError("the position belongs to another configuration or rank: "
                             "fingerprint %016x there, %016x here: %s"
                             % (pos.fingerprint, self.plan.fingerprint, ANOTHER_CONFIGURATION))
        if pos.rank != self.rank:
            raise ValueError("the position belongs to another configuration or rank: rank %d's "
                             "position, and this stream is rank %d (a position resumes the "
                             "rank that saved it)" % (pos.rank, self.rank))
        if pos.emitted > self.len or pos.cursor > self.plan.n:
            raise ValueError("the position belongs to another configuration, rank or epoch "
                             "length: item %d, cursor %d, outside this rank's epoch (%d items "
                             "of %d samples)" % (pos.emitted, pos.cursor, self.len, self.plan.n))
        if not self.plan.positional and pos.emitted < self.owned and pos.cursor == self.plan.n:
            raise ValueError("the position has owned samples left but nothing left to scan")
        self._switch_epoch(pos.epoch)
        self.emitted = pos.emitted
        self.cursor = 0 if self.plan.positional else pos.cursor

    def loader(self, load=None, **options):
        """A :class:`muster.loader.Loader` of this stream from its position on: ``load(index)``
        of each index, with ``prefetch``, ``threads``, statistics and automatic checkpoints
        (``checkpoint_every``, ``on_checkpoint``, ``checkpoint_path``)."""
        from .loader import Loader
        return Loader(self, load, **options)
