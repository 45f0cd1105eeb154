"""A rank's indices handed to a DataLoader's worker processes by position: the feed of
``muster.torch.StreamDataset`` over a coordinated sampler (docs/python.md, "Coordinated
sampler").

A coordinated rank leases blocks from the head; were each loader worker to iterate its
own copy of the sampler, each would lease as the rank, and the training process, which
saves the rank's state, would know none of what they read.  So the training process
keeps the only reading copy: an :class:`IndexFeed` there iterates it and answers the
workers over a local socket (``multiprocessing.connection``, an AF_UNIX path with a
random key, which a spawned worker finds in the pickled dataset as a forked one does in
its copy).  A worker asks for the items at positions [begin, begin + count) of the
loader's pass; the feed reads the sampler as far as the request needs and keeps what it
read for the other workers' later requests (at most what the loader prefetches).  The
items come out in the sampler's order, so the rank's log of what it handed out is the
order in which the loader delivers them, and ``state_dict(consumed=N)`` is exact.

A *pass* is one ``iter(loader)``: its workers name it by the loader's base seed (drawn
per iterator) and how many times their copy was iterated (a persistent worker's copy
is iterated once per epoch).  A new pass starts a new iteration of the sampler, which
goes on where the last one stopped; requests of an older pass get nothing.  A pass left
mid-epoch (a ``break`` in the training loop) had its workers take runs ahead of the
batches the loop trained on: :meth:`IndexFeed.end_pass` ends it after the sampler took
them back (``StreamDataset.give_back``); a new pass of the same epoch that finds the last
one neither ended nor given back logs a warning, since what its workers had taken is
lost for the epoch.
"""
import logging
import os
import socket
import threading
import weakref
from multiprocessing.connection import Client, Listener

_RETIRED_KEEP = 64   # older passes remembered, so that their late requests get nothing
log = logging.getLogger("muster.iteration")


class FeedError(RuntimeError):
    """The sampler failed in the training process while feeding a loader worker."""


class IndexFeed:
    """Serves ``iter(sampler)`` by position to loader workers; ``address`` and ``key`` are
    what a worker needs (see :func:`take`).  Closed with :meth:`close`, or when
    ``owner`` (the dataset) is collected."""

    def __init__(self, sampler, owner):
        self.key = os.urandom(32)
        self._listener = Listener(family="AF_UNIX", authkey=self.key)
        self.address = self._listener.address
        self._sampler = sampler
        self._lock = threading.Lock()     # the pass and its items; held while reading
        self._pass = None
        self._pass_epoch = None           # the sampler's epoch when the pass began
        self._retired = []
        self._indices = None              # the pass's iterator of the sampler
        self._read = 0                    # items read in this pass
        self._kept = {}                   # position -> index, read and not yet taken
        self._ended = False
        self._closed = False
        threading.Thread(target=self._accept, name="muster loader feed", daemon=True).start()
        weakref.finalize(owner, IndexFeed.close, self)

    def _accept(self):
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception:   # a peer gone or without the key (close's wake-up call)
                continue
            if self._closed:
                conn.close()
                break
            threading.Thread(target=self._serve, args=(conn,), name="muster loader feed worker",
                             daemon=True).start()
        self._listener.close()

    def _serve(self, conn):
        with conn:
            while True:
                try:
                    pass_key, begin, count = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply = self.items(pass_key, begin, count)
                except Exception as e:   # sent to the worker, which raises it in the loader
                    reply = FeedError("the coordinated sampler failed in the training process "
                                      "(%s: %s)" % (type(e).__name__, e))
                try:
                    conn.send(reply)
                except OSError:
                    return

    def items(self, pass_key, begin, count):
        """The indices at positions [begin, begin + count) of pass ``pass_key``: fewer at
        the end of the sampler's epoch, none for a pass that a newer one replaced."""
        with self._lock:
            if pass_key != self._pass:
                if pass_key in self._retired:
                    return []
                self._start(pass_key)
            while self._read < begin + count and not self._ended:
                index = next(self._indices, None)
                if index is None:
                    self._ended = True
                else:
                    self._kept[self._read] = index
                    self._read += 1
            return [self._kept.pop(p) for p in range(begin, min(begin + count, self._read))
                    if p in self._kept]

    def _start(self, pass_key):
        epoch = getattr(self._sampler, "epoch", None)
        if self._pass is not None and self._read and not self._ended and epoch == self._pass_epoch:
            log.warning("muster: iteration %s, rank %s: a new loop over the loader began in "
                        "epoch %s while the last one had not read the epoch to its end: "
                        "what the last loop's workers had taken beyond the batches the "
                        "training loop got is lost for the epoch; call give_back(consumed=the "
                        "samples trained on in the epoch) on the StreamDataset between the "
                        "two loops to have it read again first",
                        getattr(self._sampler, "name", "?"), getattr(self._sampler, "rank", "?"),
                        epoch)
        self._retire()
        self._pass = pass_key
        self._pass_epoch = epoch
        self._indices = iter(self._sampler)

    def _retire(self):
        """Ends the current pass: its later requests get nothing."""
        if self._pass is not None:
            self._retired = (self._retired + [self._pass])[-_RETIRED_KEEP:]
        self._pass = None
        self._indices = None
        self._read = 0
        self._kept = {}
        self._ended = False

    def end_pass(self):
        """Ends the current pass, whose loop was left and whose unused items the sampler
        took back (give_back): the next pass starts a new iteration, which hands them out
        first, and the left pass's late requests get nothing."""
        with self._lock:
            self._retire()

    def close(self):
        """Stops accepting workers: the accept thread, woken by a connection that sends
        nothing, closes the listener and ends."""
        if self._closed:
            return
        self._closed = True
        try:
            with socket.socket(socket.AF_UNIX) as wake:
                wake.connect(self.address)
        except OSError:
            pass


def take(address, key, pass_key, first, step, count):
    """A loader worker's runs of a pass: the indices at positions [first, first + count),
    then [first + step, first + step + count), ... from the feed at ``address``, one run
    (a list) at a time, until a run comes back short.  A failure of the sampler in the
    training process raises :class:`FeedError` here."""
    with Client(address, family="AF_UNIX", authkey=key) as conn:
        begin = first
        while True:
            conn.send((pass_key, begin, count))
            run = conn.recv()
            if isinstance(run, BaseException):
                raise run
            if run:
                yield run
            if len(run) < count:
                return
            begin += step
