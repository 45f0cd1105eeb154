"""A rank's resumable, elastic index stream: the engine of muster.torch's sampler.

:class:`RankSampler` walks one rank's indices of a :class:`~muster.iteration.Plan`
epoch by epoch (exactly the C stream, see iteration.py) and saves its position
as a small dict.  The position assumes the ranks move in lock step, as
data-parallel training does: a checkpoint saved by one rank after it consumed
``emitted`` items of the epoch stands for every rank having consumed
``emitted`` items of its own list.

Restoring into the same world size resumes each rank at its item ``emitted``.
Restoring into another world size (elastic resume, standalone version 1):

- The *remaining list* R of the epoch is, for each rank r of the saved world
  W0 in rank order, its owned items ``k`` with ``e0 <= k < min(owned_r, len_r)``
  (pad items are filler and are not carried over; items a drop tail dropped
  stay dropped).
- The new world of W ranks deals R round robin: rank l's j-th item is
  ``R[skip + l + j*W]``; with ``drop_last`` every rank takes
  ``floor((|R| - skip) / W)`` items, otherwise ``ceil(...)``, the short ranks
  padding with ``R[skip + (l + j*W) mod (|R| - skip)]`` (DistributedSampler's rule).
- Saving again mid-way records ``skip += emitted * W`` (the dealt prefix the
  ranks consumed in lock step), so resumes chain across several world sizes.

The next epoch starts normally in the new world.  Together, the ranks of the
resumed epoch read every remaining sample exactly once (plus padding).
"""
import operator

from .iteration import Plan, Stream

STATE_VERSION = 1


class RankSampler:
    """Rank ``rank``'s indices of ``plan`` (its world size is the current one)."""

    def __init__(self, plan, rank):
        self.plan = plan
        self.rank = rank
        self.world_size = plan.world_size
        self.stream = Stream(plan, rank)
        self.epoch = 0
        self.emitted = 0        # items of this epoch yielded (or consumed, once restored)
        self._start = 0         # emitted when this epoch's iteration began (the restored position)
        self._began = False     # this epoch was iterated here (not only in loader workers' copies)
        self._deal = None       # (base_world, base_emitted, skip) while resuming elastically
        self._pending = False   # a restored position waits for the next iteration

    # ---- the epoch ------------------------------------------------------------------

    def set_epoch(self, epoch):
        if epoch != self.epoch:
            self.epoch = epoch
            self.emitted = 0
            self._start = 0
            self._began = False
            self._deal = None
            self._pending = False

    def _dealt_remaining(self):
        base_world, base_emitted, skip = self._deal
        old = self.plan.with_world_size(base_world) if base_world != self.world_size else self.plan
        total = 0
        for r in range(base_world):
            total += max(0, min(old.rank_owned(r), old.rank_len(r)) - base_emitted)
        return old, max(0, total - skip)

    def __len__(self):
        """Items the current epoch yields in all (its remaining ones once restored: len - emitted)."""
        return self.epoch_len()

    def epoch_len(self):
        if self._deal is None:
            return self.plan.rank_len(self.rank)
        _, m = self._dealt_remaining()
        if m == 0:
            return 0
        if self.plan.tail == "drop":
            return m // self.world_size
        if self.plan.tail == "pad":
            return -(-m // self.world_size)
        return m // self.world_size + (self.rank < m % self.world_size)

    def remaining(self):
        return max(0, self.epoch_len() - self.emitted)

    def __iter__(self):
        """The epoch's indices from the current position on (the start, unless restored)."""
        if not self._pending:
            self.emitted = 0
        self._pending = False
        self._start = self.emitted
        self._began = True
        if self._deal is None:
            return self._iter_plain()
        return self._iter_dealt()

    def _iter_plain(self):
        s = self.stream
        s.set_epoch(self.epoch)
        if self.emitted:
            s.seek(self.emitted)
        while True:
            index = s.next()
            if index is None:
                return
            self.emitted += 1
            yield index

    def _remaining_items(self, old):
        """The remaining list R (before skip), old rank by old rank, lazily."""
        _, base_emitted, _ = self._deal
        for r in range(old.world_size):
            end = min(old.rank_owned(r), old.rank_len(r))
            if base_emitted >= end:
                continue
            s = Stream(old, r)
            s.set_epoch(self.epoch)
            s.seek(base_emitted)
            for _ in range(end - base_emitted):
                yield s.next()

    def _iter_dealt(self):
        old, m = self._dealt_remaining()
        skip = self._deal[2]
        w, l = self.world_size, self.rank
        length = self.epoch_len()
        pads = {}   # index into R' of the pad items wanted, -> their positions in the share
        owned = m // w + (l < m % w)
        for j in range(owned, length):
            pads.setdefault((l + j * w) % m, []).append(j)
        share = [None] * length
        for i, index in enumerate(self._remaining_items(old)):
            if i < skip:
                continue
            g = i - skip
            if g % w == l:
                k = g // w
                if k < length:
                    share[k] = index
            for j in pads.get(g, ()):
                share[j] = index
        for k in range(self.emitted, length):
            self.emitted += 1
            yield share[k]

    # ---- the position -------------------------------------------------------------------

    def state_dict(self, consumed=None):
        """The position as a dict of ints and strings.  ``consumed`` (when a DataLoader's
        workers prefetch ahead) is how many of the items handed out since this epoch's
        iteration began were trained on: after a restore, counted from the restored
        position, as a training loop counts its steps (the restored position itself may
        be one of another world size's list, which the caller cannot count in)."""
        emitted = self.emitted
        if consumed is not None:
            # At most what was handed out since; a sampler iterated only in copies (the
            # loader workers of a StreamDataset) knows no more than the epoch's rest.
            limit = (self.emitted if self._began else self.epoch_len()) - self._start
            try:
                count = None if isinstance(consumed, bool) else operator.index(consumed)
            except TypeError:
                count = None
            if count is None or not 0 <= count <= limit:
                raise ValueError(
                    "consumed=%r: expected the items trained on since this epoch's iteration "
                    "began (after a restore: since the restore), an integer from 0 to %d (%s)"
                    % (consumed, limit, "the items this rank's sampler handed out since then"
                       if self._began else "the items left in the epoch"))
            emitted = self._start + count
        state = {"version": STATE_VERSION, "fingerprint": self.plan.fingerprint,
                 "num_samples": self.plan.n, "world_size": self.world_size, "rank": self.rank,
                 "epoch": self.epoch, "emitted": emitted}
        if self._deal is not None:
            state["deal"] = list(self._deal)
        return state

    def load_state_dict(self, state):
        """Restores a position saved by any rank of any world size of the same configuration."""
        if not isinstance(state, dict):
            raise ValueError("not a sampler state (a dict of state_dict()): %.100r" % (state,))
        if state.get("mode") == "coordinated":
            raise ValueError("a coordinated sampler's state: load it into a sampler with "
                             "coordinated=True")
        if state.get("version") != STATE_VERSION:
            raise ValueError("sampler state version %r is not known" % state.get("version"))
        for key in ("fingerprint", "num_samples", "world_size", "epoch", "emitted"):
            value = state.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError("sampler state: %s is %r, expected an integer >= 0"
                                 % (key, value))
        saved_world = int(state["world_size"])
        if saved_world == self.world_size:
            fingerprint = self.plan.fingerprint
        else:
            fingerprint = self.plan.with_world_size(saved_world).fingerprint
        if state["fingerprint"] != fingerprint or state["num_samples"] != self.plan.n:
            raise ValueError("the sampler state belongs to another dataset or configuration "
                             "(seed, shuffle, drop_last, strategy)")
        epoch, emitted = int(state["epoch"]), int(state["emitted"])
        deal = state.get("deal")
        if deal is None and saved_world == self.world_size:
            self._deal = None
        elif deal is None:
            self._deal = (saved_world, emitted, 0)
            emitted = 0
        elif saved_world == self.world_size:
            self._deal = tuple(int(v) for v in deal)
        else:
            self._deal = (int(deal[0]), int(deal[1]), int(deal[2]) + emitted * saved_world)
            emitted = 0
        self.epoch = epoch
        self.emitted = min(emitted, self.epoch_len())
        self._start = self.emitted
        self._began = False
        self._pending = True


def make_plan(num_samples_or_dataset, num_replicas, shuffle=True, seed=0, drop_last=False, **options):
    """The plan of a DistributedSampler-like configuration: a global shuffle (or none), round
    robin (or ``strategy=``), tail pad (or drop with ``drop_last``), unbounded epochs."""
    options.setdefault("strategy", "round_robin")
    return Plan(num_samples_or_dataset, seed=seed, shuffle="global" if shuffle else "none",
                world_size=num_replicas, tail="drop" if drop_last else "pad", epochs=0, **options)
