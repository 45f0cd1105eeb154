"""A coordinated rank's log of what it handed out in the epoch (coordinated.py): the
blocks, in the order their items left the rank, with the items of each handed out, so
that ``state_dict(consumed=N)`` can tell the first N items from the rest and
``give_back(consumed=N)`` can hand the rest out again (docs/design-notes.md,
"Prefetching and the coordinated sampler", "A loop left and started again").

Each block's items are handed out in order from ``first`` (0, or where a resume found
it partly read), so what of a block was used is always its first items: of the items
handed out, a count N cuts the log in two, used before, not used after, and each
block's unused items are a run at its end.  A give-back moves that cut back: the
entries keep the items they had handed out (``upto``) and hand out again those between
the cut (``end``) and ``upto``, first and in the same order, so that the log's order
stays the order in which the items reached the caller."""
import operator
from array import array


class Handed:
    """One block as the rank handed its items out: items [first, end) of its ``size`` are
    out and not given back, [end, upto) were given back and wait to go out again;
    ``acked``: the head took this rank's ack of the block; ``lost``: the head refused it
    (the lease expired: another rank reads the block, so its given back items are not
    handed out here again)."""
    __slots__ = ("block", "first", "end", "upto", "size", "acked", "lost", "indices")

    def __init__(self, block, first, indices):
        self.block = block
        self.first = self.end = self.upto = first
        self.size = len(indices)
        self.acked = self.lost = False
        self.indices = array("q", indices)   # 8 bytes an index, while the entry is logged


class HandedLog:
    """The entries (:class:`Handed`) of the epoch since the last load, in order, after
    ``before`` items that an earlier count declared used (their entries forgotten)."""

    def __init__(self):
        self.entries = []
        self.before = 0

    def add(self, block, first, indices):
        entry = Handed(block, first, indices)
        self.entries.append(entry)
        return entry

    def count(self):
        """The items handed out (and not given back) in the epoch."""
        return self.before + sum(h.end - h.first for h in self.entries)

    def used_count(self, consumed, required=False):
        """``consumed`` checked against what was handed out (all of it when None and not
        ``required``), or ValueError naming it."""
        handed = self.count()
        if consumed is None and not required:
            return handed
        try:
            count = None if isinstance(consumed, bool) else operator.index(consumed)
        except TypeError:
            count = None
        if count is None or not self.before <= count <= handed:
            low = ("%d (what an earlier state_dict or give_back of this epoch counted as "
                   "used)" % self.before if self.before else "0")
            raise ValueError(
                "consumed=%r: expected the items trained on since this epoch's iteration "
                "began (after a restore: since the restore), an integer from %s to %d (the "
                "items this rank handed out since then)" % (consumed, low, handed))
        return count

    def blocks_read(self, used):
        """block -> [items used, size, acknowledged by this rank] of the blocks handed out,
        the first ``used`` items counting as used."""
        left = used - self.before
        out = {}
        for h in self.entries:
            take = min(h.end - h.first, left)
            left -= take
            seen = out.get(h.block)
            if seen is None:
                out[h.block] = [h.first + take, h.size, h.acked]
            else:   # leased again after its lease was lost: the most read, any ack
                seen[0] = max(seen[0], h.first + take)
                seen[2] = seen[2] or h.acked
        return out

    def drop_used(self, used):
        """Forgets the leading blocks used to their end and acknowledged: no later count
        can cut them otherwise (a later ``consumed`` may not be lower)."""
        left = used - self.before
        keep = 0
        for h in self.entries:
            n = h.end - h.first
            if not (h.acked and h.end == h.size and n <= left):
                break
            left -= n
            self.before += n
            keep += 1
        del self.entries[:keep]

    def give_back(self, used, held):
        """Moves the cut back to ``used`` items: each entry keeps its first used items and
        gives back the rest, to go out again (given_back) unless its lease was lost.
        ``held`` (the entry of the block the rank reads, or None) gives back its items to
        the block's own position instead, which the caller sets to its ``end``."""
        left = used - self.before
        for h in self.entries:
            take = min(h.end - h.first, left)
            left -= take
            h.end = h.first + take
            if h is held or h.lost:
                h.upto = h.end
        self.drop_used(used)

    def given_back(self):
        """The items given back and not out yet, in the log's order, each marked as out
        again as it is yielded."""
        for h in list(self.entries):
            while h.end < h.upto:
                h.end += 1
                yield h.indices[h.end - 1]
