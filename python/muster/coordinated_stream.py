"""``muster.CoordinatedStream``: one rank of a coordinated iteration for code without
PyTorch (docs/python.md, "Coordinated iterations without PyTorch").  It checks its
arguments before anything is sent, in the words the head would use, and hands the rest
to the engine, coordinated.CoordinatedRankSampler."""
import json
import operator
import re

from .coordinated import HEAD_WAIT_S, NAME_MAX, CoordinatedRankSampler, _dataset_object
from .iteration import (DEFAULT_BLOCK_SIZE, DEFAULT_SHUFFLE_BLOCK_SIZE, MAX_SAMPLES,
                        MAX_WORLD_SIZE, NO_SAMPLES, SHUFFLES, STRATEGIES, TAILS, Dataset, _seed)

_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]{1,%d}" % NAME_MAX)  # not "." or ".."
_WEEK_MS = 7 * 24 * 3600 * 1000


def _integer(field, value, low, high=None, unit=""):
    """``value`` as an int from ``low`` to ``high`` (None: no bound), or TypeError (not an
    integer) or ValueError (out of range) whose message names ``field``."""
    shown = "2^48" if high == MAX_SAMPLES else high
    takes = ("an integer from %d to %s%s" % (low, shown, unit) if high is not None
             else "an integer >= %d%s" % (low, unit))
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None:
        raise TypeError("%s: %s, not %.60r" % (field, takes, value))
    if number < low or (high is not None and number > high):
        raise ValueError("%s: %s, not %d" % (field, takes, number))
    return number


def _choice(field, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError("%s: one of %s, not %.60r" % (field, ", ".join(choices), value))
    return value


def _dataset_of(dataset):
    """The API's dataset object of ``dataset`` (a number of samples or a Dataset), checked."""
    if isinstance(dataset, Dataset):
        if dataset.num_samples == 0:
            raise ValueError(NO_SAMPLES)
        return _dataset_object(dataset)
    try:
        count = None if isinstance(dataset, bool) else operator.index(dataset)
    except TypeError:
        count = None
    if count is None:
        raise TypeError("dataset: a number of samples (an integer) or a muster.iteration.Dataset "
                        "(shards, labels), not %.60r" % (dataset,))
    if count == 0:
        raise ValueError(NO_SAMPLES)
    return _dataset_object(_integer("dataset", count, 1, MAX_SAMPLES))


def _ranges_of(ranges, world_size):
    """``ranges`` as ``world_size`` lists [begin, end), or TypeError/ValueError (that they
    tile [0, N) the head checks, at the stream's first read)."""
    takes = "ranges: %d pairs [begin, end), one per rank" % world_size
    try:
        pairs = [[operator.index(b), operator.index(e)] for b, e in ranges]
    except (TypeError, ValueError):
        raise TypeError("%s, not %.60r" % (takes, ranges)) from None
    if len(pairs) != world_size or any(e < b or b < 0 for b, e in pairs):
        raise ValueError("%s with 0 <= begin <= end, not %.60r" % (takes, ranges))
    return pairs


def _settings_of(settings, world_size):
    """The lease and health settings that are given (not None), checked as the head does."""
    out = {}
    bounds = {"lease_ms": (1, _WEEK_MS), "rank_timeout_ms": (100, _WEEK_MS),
              "replication": (1, min(64, world_size))}
    for field, value in settings.items():
        if value is None:
            continue
        if field in bounds:
            out[field] = _integer(field, value, *bounds[field])
        elif field == "slow_ratio":
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            if not number or not 0 <= value <= 1:
                raise ValueError("slow_ratio: a number from 0 to 1, not %.60r" % (value,))
            out[field] = value
        elif field == "cluster_sync":
            if not isinstance(value, bool):
                raise TypeError("cluster_sync: True or False, not %.60r" % (value,))
            out[field] = value
    return out


def _coordinated_config(dataset, world_size, shuffle, seed, strategy, block_size, epochs, tail,
                        shuffle_block_size, num_partitions, hash_seed, ranges, settings):
    """The body of ``POST /v1/iterations`` (without name and rank) of a CoordinatedStream's
    arguments, each checked: TypeError or ValueError naming the first bad one."""
    config = {"dataset": _dataset_of(dataset),
              "world_size": _integer("world_size", world_size, 1, MAX_WORLD_SIZE),
              "shuffle": _choice("shuffle", shuffle, SHUFFLES),
              "seed": _seed("seed", seed),
              "strategy": _choice("strategy", strategy, STRATEGIES),
              "block_size": _integer("block_size", block_size, 1, MAX_SAMPLES),
              "epochs": _integer("epochs", epochs, 0, unit=" (0: unbounded)"),
              "tail": _choice("tail", tail, TAILS)}
    if shuffle == "shard":
        config["shuffle_block_size"] = _integer("shuffle_block_size", shuffle_block_size, 1,
                                                MAX_SAMPLES)
    if strategy == "dynamic" and tail != "keep":
        raise ValueError("tail: a dynamic iteration takes only keep (any rank may read any "
                         "block, so no rank has a share to pad or drop), not %r" % (tail,))
    if strategy == "hash":
        config["num_partitions"] = _integer("num_partitions", num_partitions, 0,
                                            unit=" (0: world_size)")
        config["hash_seed"] = _seed("hash_seed", hash_seed)
    if strategy == "range":
        if ranges is None:
            raise ValueError("ranges: the range strategy needs world_size pairs [begin, end)")
        config["ranges"] = _ranges_of(ranges, world_size)
    if strategy == "stratified" and "labels" not in config["dataset"]:
        raise ValueError("dataset: the stratified strategy needs a label per sample "
                         "(muster.iteration.Dataset(N, labels=[...])), not %.60r" % (dataset,))
    config.update(_settings_of(settings, config["world_size"]))
    return config


class CoordinatedStream:
    """Rank ``rank`` of the coordinated iteration ``name`` on a head, without PyTorch: the
    engine of ``muster.torch.DistributedSampler(coordinated=True)`` with the guarantees it
    has (docs/python.md, "Coordinated iterations without PyTorch").

        with muster.CoordinatedStream("train", 10000, rank=r, world_size=w,
                                      shuffle="global", seed=7) as stream:
            for epoch in range(stream.epoch, 10):
                stream.set_epoch(epoch)
                for index in stream:      # every index of the epoch once, across the ranks
                    ...
                    save(stream.state_dict())

    Every rank creates or joins the iteration with the same arguments but its own
    ``rank``.  ``dataset`` is a number of samples or a :class:`muster.iteration.Dataset`;
    the order's arguments are those of :class:`muster.iteration.Plan` (docs/iterations.md,
    "Configuration"), but ``strategy`` is ``dynamic`` (any rank leases the next block, so
    faster ranks read more) and ``epochs`` 0 (unbounded) unless given.  ``lease_ms``,
    ``rank_timeout_ms``, ``replication``, ``slow_ratio`` and ``cluster_sync`` are the
    head's (left out: its defaults).  The head is ``client`` (a :class:`muster.Client`),
    or one made from ``url`` and ``token`` (``MUSTER_URL``, ``MUSTER_TOKEN`` by default),
    closed with the stream.  ``wait`` and ``head_wait_s`` are the torch sampler's."""

    def __init__(self, name, dataset, rank, world_size, *, client=None, url=None, token=None,
                 shuffle="none", seed=0, strategy="dynamic", block_size=DEFAULT_BLOCK_SIZE,
                 epochs=0, tail="keep", shuffle_block_size=DEFAULT_SHUFFLE_BLOCK_SIZE,
                 num_partitions=0, hash_seed=0, ranges=None, lease_ms=None, rank_timeout_ms=None,
                 replication=None, slow_ratio=None, cluster_sync=None, wait=True,
                 head_wait_s=HEAD_WAIT_S):
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            error = ValueError if isinstance(name, str) else TypeError
            why = (" ('.' and '..' are no names: URLs collapse them)"
                   if name in (".", "..") else "")
            raise error("name: the iteration's name, 1 to %d characters of A-Z a-z 0-9 . _ - "
                        "other than '.' and '..', not %.60r%s" % (NAME_MAX, name, why))
        config = _coordinated_config(
            dataset, world_size, shuffle, seed, strategy, block_size, epochs, tail,
            shuffle_block_size, num_partitions, hash_seed, ranges,
            {"lease_ms": lease_ms, "rank_timeout_ms": rank_timeout_ms, "replication": replication,
             "slow_ratio": slow_ratio, "cluster_sync": cluster_sync})
        rank = _integer("rank", rank, 0, config["world_size"] - 1,
                        " (world_size is %d)" % config["world_size"])
        if not isinstance(wait, bool):
            raise TypeError("wait: True or False, not %.60r" % (wait,))
        if (isinstance(head_wait_s, bool) or not isinstance(head_wait_s, (int, float))
                or not head_wait_s >= 0):
            raise ValueError("head_wait_s: seconds, a number >= 0, not %.60r" % (head_wait_s,))
        self.client = self._client_of(client, url, token)
        self._own_client = client is None
        self._rank = CoordinatedRankSampler(self.client, name, config, rank, wait=wait,
                                            head_wait_s=head_wait_s, kind="stream")
        self._closed = False

    @staticmethod
    def _client_of(client, url, token):
        from .client import Client
        if client is None:
            return Client(url, token)
        if url is not None or token is not None:
            raise ValueError("url, token: give the head as client= or as url= and token=, "
                             "not both")
        if not isinstance(client, Client):
            raise TypeError("client: a muster.Client, not %.60r" % (client,))
        return client

    def __repr__(self):
        return "muster.CoordinatedStream(%r, rank %d of %d, epoch %d%s)" % (
            self.name, self.rank, self.world_size, self.epoch, ", closed" if self._closed else "")

    @property
    def name(self):
        """The iteration's name on the head: the ``name`` given, or after
        ``load_state_dict`` the resumed iteration's (``NAME.r`` and a hash of the states)."""
        return self._rank.name

    @property
    def rank(self):
        return self._rank.rank

    @property
    def world_size(self):
        return self._rank.world_size

    @property
    def epoch(self):
        """The epoch that iterating reads: 0, what ``set_epoch`` set, or the saved epoch
        after ``load_state_dict``."""
        return self._rank.epoch

    @property
    def config(self):
        """The iteration's configuration (the body of ``POST /v1/iterations`` without name
        and rank), a copy."""
        return json.loads(json.dumps(self._rank.config))

    def _open(self, what):
        if self._closed:
            raise ValueError("%s: the stream of iteration %r, rank %d, is closed"
                             % (what, self.name, self.rank))
        return self._rank

    def set_epoch(self, epoch):
        """The epoch the next ``for index in stream`` reads (as the torch sampler's)."""
        self._open("set_epoch")
        self._rank.set_epoch(_integer("epoch", epoch, 0))

    def __iter__(self):
        """This rank's indices of the current epoch, one block leased at a time; a block
        is acknowledged when the index after its last one is asked for.  Iterating again
        after a ``break`` goes on after the last index yielded (after ``give_back``, with
        the indices given back); after the epoch's end it yields nothing until
        ``set_epoch``.  A new iteration ends the one before."""
        return iter(self._open("iterating"))

    def state_dict(self, consumed=None):
        """The position, plain JSON types (``json.dumps`` takes it): acknowledges the blocks
        read to their end, and returns the head's checkpoint plus this rank's partly read
        block.  Gather every rank's (your framework's all-gather, a shared file) for an
        exact resume mid-block.  ``consumed``: when the caller reads ahead of what it uses
        (a prefetching pipeline), how many of the indices the stream yielded in this epoch
        (after a load: since the load) were used; the others are read again after a
        resume.  None: every index yielded counts as used."""
        rank = self._open("state_dict")
        if consumed is not None:
            _integer("consumed", consumed, 0)
        return rank.state_dict(consumed)

    def give_back(self, consumed):
        """After leaving a loop over the stream (a ``break``, an exception) whose caller had
        read ahead of what it used: of the indices the stream yielded in this epoch (after
        a load: since the load; every loop of the epoch counts, as for ``state_dict``),
        the first ``consumed`` were used, and the others come first, in their order, in
        the next loop of the epoch.  The left loop's iterator yields nothing more."""
        rank = self._open("give_back")
        _integer("consumed", consumed, 0)
        rank.give_back(consumed)

    def load_state_dict(self, state, run=None):
        """Resumes the saved epoch from ``state``: one rank's ``state_dict()`` (exact at
        block boundaries) or the list of every rank's (exact mid-block too), in this or
        another world size.  Every rank of the new world loads the same: they join a new
        iteration on the head (``name`` says which).  ``run``, a string every rank of
        this run gives (a job id), makes that iteration this run's own: the same states
        loaded by another run read from the states again.  ValueError for anything else,
        or a state of another dataset or configuration (``world_size``, ``epochs`` and
        the lease settings aside)."""
        self._open("load_state_dict").load_state_dict(state, run)

    def close(self):
        """Acknowledges the blocks read to their end and stops the heartbeat thread; the
        iteration stays on the head.  A block read partway is left to its lease: after
        ``lease_ms`` another rank (or a resume from a saved state) reads it.  A client the
        stream made is closed.  Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        try:
            self._rank.close()
        finally:
            if self._own_client:
                self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
