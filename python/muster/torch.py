"""PyTorch integration: a drop-in ``DistributedSampler`` backed by a muster iteration.

    from muster.torch import DistributedSampler
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
            torch.save({"model": ..., "sampler": sampler.state_dict()}, path)
    # later, with any world size:
    sampler.load_state_dict(ckpt["sampler"])   # the next iteration resumes mid-epoch

The indices are muster's standalone stream (version 1: the same as the C library's
and the head's for the same configuration), computed locally: no server needed.
Ranks come from ``torch.distributed`` when initialised, else from $RANK / $WORLD_SIZE.
Importing this module needs torch.
"""
import os

import torch
import torch.utils.data

from .iteration import Dataset
from .sampling import RankSampler, make_plan


def dist_rank_world():
    """(rank, world_size) from torch.distributed when initialised, else $RANK/$WORLD_SIZE, else (0, 1)."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class DistributedSampler(torch.utils.data.Sampler):
    """``torch.utils.data.DistributedSampler``'s interface on a muster stream.

    ``dataset``: anything with ``len()``, an int, or a :class:`muster.iteration.Dataset`
    (shards, labels).  ``num_replicas``, ``rank``, ``shuffle``, ``seed``, ``drop_last``
    as in PyTorch (``drop_last=False`` pads every rank to the same length by wrapping
    around, ``True`` drops the tail).  ``strategy`` and the other iteration options
    (``block_size``, ``num_partitions``, ``hash_seed``, ``ranges``) pass through.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False,
                 coordinated=False, client=None, name=None, wait=True, **options):
        env_rank, env_world = dist_rank_world()
        if num_replicas is None:
            num_replicas = env_world
        if rank is None:
            rank = env_rank if num_replicas == env_world else 0
        if num_replicas < 1:
            raise ValueError("num_replicas is %d: a sampler needs at least one rank" % num_replicas)
        if not 0 <= rank < num_replicas:
            raise ValueError("Invalid rank %d, rank should be in the interval [0, %d]" % (rank, num_replicas - 1))
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        if isinstance(dataset, (int, Dataset)):
            shape = dataset
        else:
            shape = len(dataset)
        self.coordinated = bool(coordinated)
        if self.coordinated:
            self.plan = None
            self._sampler = _coordinated(shape, num_replicas, rank, shuffle, seed, drop_last, client, name,
                                         wait, options)
            self.epoch = 0
            return
        self.plan = make_plan(shape, num_replicas, shuffle=shuffle, seed=seed, drop_last=drop_last, **options)
        self._sampler = RankSampler(self.plan, rank)
        self.epoch = 0

    @property
    def num_samples(self):
        """Items per rank per (full) epoch, as in DistributedSampler (coordinated: the
        static share; with ``dynamic`` faster ranks read more)."""
        if self.coordinated:
            return len(self._sampler)
        return self.plan.rank_len(self.rank)

    @property
    def name(self):
        """Coordinated: the iteration's name on the head (a resumed one has its own)."""
        return self._sampler.name if self.coordinated else None

    @property
    def total_size(self):
        return self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._sampler.set_epoch(epoch)

    def __iter__(self):
        self._sampler.set_epoch(self.epoch)
        return iter(self._sampler)

    def __len__(self):
        """The items the next iteration yields: num_samples, or the rest after a restore."""
        s = self._sampler
        if self.coordinated:
            return len(s)
        return s.epoch_len() - (s.emitted if s._pending else 0)

    def state_dict(self, consumed=None):
        """The position (plain ints): save it with the model checkpoint.  With a DataLoader
        whose workers prefetch, pass ``consumed`` = samples this rank trained on since the
        loader began this epoch (after a restore: since the restore; ``step * batch_size``
        of the loop over the loader).
        Coordinated: the head's checkpoint plus this rank's partly read blocks; with
        ``consumed``, also the blocks acknowledged whose items were handed out but not
        trained on (``reopened``), which a resume serves again."""
        return self._sampler.state_dict(consumed)

    def give_back(self, consumed):
        """Coordinated: after leaving a loop over a DataLoader of this sampler (a ``break``,
        an exception) whose workers had taken indices ahead of the step: ``consumed`` =
        the samples this rank trained on in the epoch (after a restore: since the
        restore), every loop counted, as for ``state_dict``.  The indices handed out
        after those come first, in their order, in the next loop of the epoch."""
        if not self.coordinated:
            raise ValueError("give_back: a standalone sampler (coordinated=False) takes "
                             "nothing back: a new loop over it begins the epoch again; to go "
                             "on from a loop left after N samples, call "
                             "load_state_dict(state_dict(consumed=N)) before the new loop")
        self._sampler.give_back(consumed)

    def load_state_dict(self, state, run=None):
        """Restores a position saved by any rank, with this or another world size; the next
        iteration continues the saved epoch where it stopped.  Coordinated: ``state`` may
        be the list of every rank's states (exact mid-block); every rank loads the same,
        with the same ``run`` (a job id: another run's resume of the same states reads
        from them again).  Standalone, ``run`` must be None: nothing is kept on a head."""
        if self.coordinated:
            self._sampler.load_state_dict(state, run)
        elif run is not None:
            raise ValueError("run=%.60r: a standalone sampler (coordinated=False) resumes "
                             "from the state alone, every time; run= names a coordinated "
                             "resume on the head" % (run,))
        else:
            self._sampler.load_state_dict(state)
        self.epoch = self._sampler.epoch


Sampler = DistributedSampler

_COORD_SETTINGS = ("lease_ms", "rank_timeout_ms", "replication", "slow_ratio", "cluster_sync")


def _coordinated(shape, world, rank, shuffle, seed, drop_last, client, name, wait, options):
    from .client import Client
    from .coordinated import HEAD_WAIT_S, CoordinatedRankSampler, _dataset_object
    if not name:
        raise ValueError("a coordinated sampler needs name= (the iteration's name on the head)")
    dataset = _dataset_object(shape)
    options = dict(options)
    head_wait_s = options.pop("head_wait_s", HEAD_WAIT_S)
    strategy = options.pop("strategy", "dynamic")
    tail = "keep" if strategy == "dynamic" else ("drop" if drop_last else "pad")
    config = {"dataset": dataset, "seed": seed, "shuffle": "global" if shuffle else "none",
              "strategy": strategy, "world_size": world, "block_size": options.pop("block_size", 16),
              "epochs": options.pop("epochs", 0), "tail": options.pop("tail", tail)}
    config.update(options)
    return CoordinatedRankSampler(client or Client(), name, config, rank, wait=wait,
                                  head_wait_s=head_wait_s)


class StreamDataset(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` reading ``dataset[i]`` for this rank's indices, split among the
    DataLoader's workers in runs of ``batch_size`` (worker w of K takes runs w, w + K, ...).
    The DataLoader takes a batch from each worker in turn, so with its ``batch_size`` given
    here the batches come in the sampler's order, and any number of batches trained is a
    prefix of it: ``state_dict(consumed=...)`` is then exact at every batch (with runs of
    one item and K workers, only at every K-th batch).  ``sampler`` is the
    DistributedSampler that orders it (set_epoch, state_dict and load_state_dict go there).

    A standalone sampler is iterated by every worker's copy (each computes the same order).
    A coordinated one is iterated only in the process that made the dataset: the workers
    take their runs from it by position (muster.feed), so the rank leases as one and its
    state there counts what the loader delivered."""

    def __init__(self, dataset, sampler=None, batch_size=1, **sampler_options):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size is %r: the DataLoader's batch_size, an integer >= 1 "
                             "(1 when the DataLoader does not batch)" % (batch_size,))
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler if sampler is not None else DistributedSampler(dataset,
                                                                              **sampler_options)
        self._feed = None
        self._feed_at = None      # (address, key) of the feed, for loader workers
        self._passes = 0          # iterations of this copy (a persistent worker's: one a pass)
        if getattr(self.sampler, "coordinated", False):
            from .feed import IndexFeed
            self._feed = IndexFeed(self.sampler, self)
            self._feed_at = (self._feed.address, self._feed.key)

    def __getstate__(self):
        """A loader worker's copy (spawn): the feed's address and key, not the feed."""
        state = dict(self.__dict__)
        state["_feed"] = None
        return state

    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)

    def state_dict(self, consumed=None):
        return self.sampler.state_dict(consumed)

    def give_back(self, consumed):
        """The sampler's give_back, after leaving a loop over a DataLoader of this
        dataset: ``consumed`` = the samples this rank trained on in the epoch (every loop
        counted).  The loader workers' runs of the left loop get nothing more."""
        self.sampler.give_back(consumed)
        if self._feed is not None:
            self._feed.end_pass()

    def load_state_dict(self, state, run=None):
        """The sampler's load_state_dict (``run``: a coordinated sampler's, above)."""
        if run is None:
            self.sampler.load_state_dict(state)
        else:
            self.sampler.load_state_dict(state, run=run)
        if self._feed is not None:
            self._feed.end_pass()   # a loop of the position loaded over is over

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is not None and self._feed_at is not None:
            return self._fed(info)
        return self._split(*((info.num_workers, info.id) if info is not None else (1, 0)))

    def _split(self, workers, me):
        for i, index in enumerate(self.sampler):
            if (i // self.batch_size) % workers == me:
                yield self.dataset[index]

    def _fed(self, info):
        """A loader worker's items of a coordinated sampler, from the feed."""
        from .feed import take
        self._passes += 1
        pass_key = (info.seed - info.id, self._passes)   # the same in every worker of a pass
        size = self.batch_size
        for run in take(*self._feed_at, pass_key, info.id * size, info.num_workers * size, size):
            for index in run:
                yield self.dataset[index]
