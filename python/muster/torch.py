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
                 **options):
        env_rank, env_world = dist_rank_world()
        if num_replicas is None:
            num_replicas = env_world
        if rank is None:
            rank = env_rank if num_replicas == env_world else 0
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
        self.plan = make_plan(shape, num_replicas, shuffle=shuffle, seed=seed, drop_last=drop_last, **options)
        self._sampler = RankSampler(self.plan, rank)
        self.epoch = 0

    @property
    def num_samples(self):
        """Items per rank per (full) epoch, as in DistributedSampler."""
        return self.plan.rank_len(self.rank)

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
        return s.epoch_len() - (s.emitted if s._pending else 0)

    def state_dict(self, consumed=None):
        """The position (plain ints): save it with the model checkpoint.  With a DataLoader
        whose workers prefetch, pass ``consumed`` = samples of this epoch trained on."""
        return self._sampler.state_dict(consumed)

    def load_state_dict(self, state):
        """Restores a position saved by any rank, with this or another world size; the next
        iteration continues the saved epoch where it stopped."""
        self._sampler.load_state_dict(state)
        self.epoch = self._sampler.epoch


Sampler = DistributedSampler


class StreamDataset(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` reading ``dataset[i]`` for this rank's indices, split among the
    DataLoader's workers (worker w of K takes every K-th index).  ``sampler`` is the
    DistributedSampler that orders it (set_epoch, state_dict and load_state_dict go there)."""

    def __init__(self, dataset, sampler=None, **sampler_options):
        self.dataset = dataset
        self.sampler = sampler or DistributedSampler(dataset, **sampler_options)

    def set_epoch(self, epoch):
        self.sampler.set_epoch(epoch)

    def state_dict(self, consumed=None):
        return self.sampler.state_dict(consumed)

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state)

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        for i, index in enumerate(self.sampler):
            if i % workers == me:
                yield self.dataset[index]
