"""A standalone stream's samples with prefetch, statistics and automatic checkpoints:
:class:`Loader`, the Python counterpart of libmuster's standalone loader
(docs/iterations.md, "The loader"; docs/python.md, "Iterations computed locally").

    stream = Stream(plan, rank)
    with stream.loader(load=read_sample, prefetch=64, threads=4, checkpoint_every=1000,
                       checkpoint_path="run/stream.json") as loader:
        for sample in loader:                 # load(index) of each index, in the stream's order
            train(sample)
        print(loader.stats())                 # samples_loaded, prefetch_hits, ...

Order.  Items are numbered in the stream's order as they are handed to the threads; a
thread computes the next index under the lock and calls ``load`` outside it, and the
caller takes item k only when item k is loaded, whatever finished first.  So what comes
out is exactly the stream's order, with or without prefetch and whatever the number of
threads; at most ``prefetch`` items are handed out ahead of the caller (loading or
loaded).  Each item carries the stream's position after it, so the loader's position is
the one after the items the caller took, never counting those loaded ahead.

Moving (``set_epoch``, ``set_pos``, and a failed ``load``) bumps a generation number and
drops what was loaded ahead; a thread still loading an item of the old generation throws
it away when it finishes, so a move never waits for a slow load.  The threads see only
the shared state (:class:`_Shared`), not the loader, and ``load`` through a weak
reference (a bound method may hold the loader), so a loader nobody holds is collected
and its threads are told to stop.

A checkpoint is the position (the stream's 40 bytes, :class:`~muster.iteration.StreamPos`)
with the fields of the C loader's standalone checkpoint (``mode``, ``fingerprint``,
``rank``, ``epoch``, ``consumed``), a wall-clock time stamp and the count of checkpoints;
written to a path, it replaces the file atomically (a temporary file in the same
directory, fsync, rename, fsync of the directory), so a reader or a crash finds the
previous checkpoint or the new one, never a part of one; the file is the one, and has
the mode, that open() would give (a symbolic link written through; muster._replace).
"""
import json
import operator
import os
import threading
import time
import weakref

from . import _replace
from .iteration import ANOTHER_CONFIGURATION, STREAM_POS_BYTES, Stream, StreamPos

# The C loader's LOADER_CHECKPOINT_VERSION: a checkpoint here holds its fields and more.
CHECKPOINT_VERSION = 1
_END = ("end",)   # the entry after an epoch's last item


def _count_arg(name, value, low, meaning):
    """``value`` as an integer >= ``low``, or ValueError naming ``name``."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < low:
        raise ValueError("%s=%.60r: %s" % (name, value, meaning))
    return number


def read_checkpoint(path):
    """The checkpoint a loader wrote to ``path`` (a dict), to give to ``set_pos`` of a
    loader or a stream; ValueError when the file holds none."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        record = json.loads(text)
    except ValueError as e:   # said as the C loader says it: where the parser stopped
        raise ValueError("%s: not a standalone loader checkpoint: not valid JSON: %s (at line "
                         "%d, column %d)" % (path, e.msg, e.lineno, e.colno)) from None
    if not isinstance(record, dict) or record.get("mode") != "standalone":
        raise ValueError("%s: not a standalone loader checkpoint (%.80r)" % (path, text))
    return record


def checkpoint_position(record, plan, rank):
    """The :class:`StreamPos` of a checkpoint ``record`` for rank ``rank`` of ``plan``, or
    ValueError.  A record without ``position`` (one the C loader's get_checkpoint wrote)
    is found by seeking to its ``consumed`` items."""
    if record.get("mode") != "standalone":
        raise ValueError("not a standalone loader checkpoint: mode %r" % (record.get("mode"),))
    if record.get("version") != CHECKPOINT_VERSION:
        raise ValueError("loader checkpoint version %r is not known (this one reads %d)"
                         % (record.get("version"), CHECKPOINT_VERSION))
    if record.get("fingerprint") != "%016x" % plan.fingerprint:
        raise ValueError("the checkpoint is of another configuration or rank: fingerprint %.20r "
                         "there, %016x here: %s" % (record.get("fingerprint"), plan.fingerprint,
                                                      ANOTHER_CONFIGURATION))
    if record.get("rank") != rank:
        raise ValueError("the checkpoint is of another configuration or rank: rank %.20r's "
                         "checkpoint, and this is rank %d" % (record.get("rank"), rank))
    encoded = record.get("position")
    if encoded is not None:
        try:
            data = bytes.fromhex(encoded)
        except (TypeError, ValueError):
            data = b""
        if len(data) != STREAM_POS_BYTES:
            raise ValueError("the checkpoint's position is not %d bytes in hex: %.100r"
                             % (STREAM_POS_BYTES, encoded))
        pos = StreamPos.decode(data)
        if (record.get("epoch"), record.get("consumed")) != (pos.epoch, pos.emitted):
            raise ValueError("the checkpoint's position (epoch %d, %d consumed) differs from its "
                             "epoch %r and consumed %r" % (pos.epoch, pos.emitted,
                                                           record.get("epoch"),
                                                           record.get("consumed")))
        return pos
    epoch, consumed = record.get("epoch"), record.get("consumed")
    for key, value in (("epoch", epoch), ("consumed", consumed)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("the checkpoint's %s is %r, expected an integer >= 0" % (key, value))
    stream = Stream(plan, rank)
    stream.set_epoch(epoch)
    stream.seek(consumed)
    return stream.get_pos()


def _fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path, text):
    """Replaces ``path`` with ``text``: a temporary file beside it, written and fsynced,
    renamed over it, and the directory fsynced (so that the rename survives a crash).  On
    failure the temporary file is removed and ``path`` is left as it was.  The file is
    the one open(path, "w") would write, with the mode it would have (muster._replace):
    a symbolic link is written through, the permission bits of the file replaced are
    kept, a new file gets 0666 less the umask, and a device or a FIFO is written into."""
    target = _replace.destination(path)
    if _replace.written_into(target):   # /dev/null, a FIFO: it cannot be replaced
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)
        return
    directory = os.path.dirname(target)
    fd, temporary = _replace.create_beside(target, ".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _fsync_directory(directory)


def _check_checkpoint_path(path):
    """ValueError naming ``path`` and why, when write_atomically could not write there:
    checked when the loader is made rather than at the first checkpoint, deep in a run.
    The file written is the one muster._replace.destination gives (symbolic links
    followed to the end, a dangling link's target created), so that file must not be a
    directory and its directory must be one.  Permissions are left to the write."""
    try:
        target = _replace.destination(path)
    except OSError as e:   # a loop of links
        raise ValueError("checkpoint_path=%r: %s" % (path, e.strerror)) from None
    link = "a symbolic link to %s, " % target if os.path.islink(path) else ""
    if os.path.isdir(target):
        raise ValueError("checkpoint_path=%r: %sa directory, not a file" % (path, link))
    directory = os.path.dirname(target)
    if os.path.isdir(directory):
        return   # a device or a FIFO there is written into (_replace.written_into)
    why = "is not a directory" if os.path.exists(directory) else "does not exist"
    raise ValueError("checkpoint_path=%r: %s%s directory %s %s"
                     % (path, link, "whose" if link else "its", directory, why))


class _LoadBox:
    """``load``, which its loader alone holds: the threads reach it through a weak
    reference, so that a load that holds its loader (a bound method of an object that
    keeps the loader) does not keep the loader alive from the threads."""

    __slots__ = ("load", "__weakref__")

    def __init__(self, load):
        self.load = load


class _Shared:
    """What the loading threads and the caller share, under ``cv``'s lock."""

    def __init__(self, stream, box, prefetch):
        self.cv = threading.Condition()
        self.stream = stream        # the producer's stream: ahead of the caller by the buffer
        self.box = None if box is None else weakref.ref(box)   # None: no load, the indices
        self.prefetch = prefetch
        self.generation = 0         # bumped by every move; older items are thrown away
        self.assigned = 0           # items of this generation handed to a thread
        self.taken = 0              # items of this generation the caller took
        self.ended = False          # the end (or a failed load) is assigned: nothing more
        self.stop = False
        self.ready = {}             # item number -> entry (see produce)
        # counters (the C loader's muster_loader_stats_t)
        self.hits = self.misses = self.samples = self.checkpoints = 0
        self.loads = 0
        self.load_s = 0.0           # in load calls
        self.busy_s = 0.0           # producing items: the index and its load
        self.buffer_peak = 0

    def assign(self):
        """(generation, item number, index or None at the end, emitted, cursor) of the
        next item; under the lock."""
        stream = self.stream
        index = stream.next()
        number = self.assigned
        self.assigned += 1
        if index is None:
            self.ended = True
        return self.generation, number, index, stream.emitted, stream.cursor

    def produce(self, index, emitted, cursor, started):
        """The entry of an item: ("item", index, sample, emitted, cursor) or ("error",
        index, exception); loads outside the lock and counts under it.  ``started``:
        when computing its index began (time.perf_counter)."""
        box = None if self.box is None else self.box()
        if self.box is None:
            entry = ("item", index, index, emitted, cursor)
            load_s = None
        elif box is None:   # the loader was collected: nobody takes this item
            entry = ("error", index, ReferenceError("the loader is gone"))
            load_s = None
        else:
            began = time.perf_counter()
            try:
                entry = ("item", index, box.load(index), emitted, cursor)
            except BaseException as exc:  # the caller gets it, at its item
                entry = ("error", index, exc)
            load_s = time.perf_counter() - began
        busy_s = time.perf_counter() - started
        with self.cv:
            self.busy_s += busy_s
            if load_s is not None:
                self.loads += 1
                self.load_s += load_s
        return entry

    def deposit(self, generation, number, entry):
        """Puts a loaded entry in the buffer unless a move made it stale; under the lock."""
        if generation != self.generation or self.stop:
            return
        if entry[0] == "error":
            self.ended = True       # nothing after a failed item is wanted
        self.ready[number] = entry
        self.buffer_peak = max(self.buffer_peak, len(self.ready))
        if number == self.taken:
            self.cv.notify_all()

    def restart(self):
        """Drops what was produced ahead (the stream was just moved); under the lock."""
        self.generation += 1
        self.assigned = self.taken = 0
        self.ended = False
        self.ready.clear()
        self.cv.notify_all()


def _load_ahead(shared):
    """A loading thread: takes the next item number while the buffer has room, loads it,
    and deposits it, until told to stop."""
    cv = shared.cv
    while True:
        with cv:
            while not shared.stop and (shared.ended or
                                       shared.assigned - shared.taken >= shared.prefetch):
                cv.wait()
            if shared.stop:
                return
            started = time.perf_counter()
            generation, number, index, emitted, cursor = shared.assign()
            if index is None:
                shared.deposit(generation, number, _END)
                continue
        entry = shared.produce(index, emitted, cursor, started)
        with cv:
            shared.deposit(generation, number, entry)


def _stop_threads(shared):
    with shared.cv:
        shared.stop = True
        shared.cv.notify_all()


class Loader:
    """Rank ``stream.rank``'s samples, from ``stream``'s position on: ``load(index)`` of
    each index in the stream's order (the index itself without ``load``), loaded up to
    ``prefetch`` ahead by ``threads`` threads (0: on the caller's thread), with the C
    loader's statistics and, every ``checkpoint_every`` samples, a checkpoint given to
    ``on_checkpoint`` and/or written atomically to ``checkpoint_path``.  ``stream`` is
    left where it was: the loader reads a copy.  One thread takes items; ``stats()`` may
    be called from any."""

    def __init__(self, stream, load=None, prefetch=0, threads=1, checkpoint_every=None,
                 on_checkpoint=None, checkpoint_path=None):
        if not isinstance(stream, Stream):
            raise ValueError("stream=%.60r: a muster.iteration.Stream" % (stream,))
        if load is not None and not callable(load):
            raise ValueError("load=%.60r: a function of a sample's index that returns the "
                             "sample (None: the loader gives the indices)" % (load,))
        prefetch = _count_arg("prefetch", prefetch, 0, "the samples loaded ahead, an integer "
                              ">= 0 (0: no thread, each sample loaded when asked for)")
        threads = _count_arg("threads", threads, 1, "the threads that load ahead, an integer "
                             ">= 1")
        if threads > max(prefetch, 1):
            raise ValueError("threads=%d with prefetch=%d: at most prefetch samples are loaded "
                             "at once, so give prefetch >= threads" % (threads, prefetch))
        self._every = None
        if checkpoint_every is not None:
            self._every = _count_arg("checkpoint_every", checkpoint_every, 1, "the samples "
                                     "between automatic checkpoints, an integer >= 1 (None: "
                                     "no automatic checkpoint)")
            if on_checkpoint is None and checkpoint_path is None:
                raise ValueError("checkpoint_every=%d: give on_checkpoint= or checkpoint_path= "
                                 "(where the checkpoints go)" % self._every)
        if on_checkpoint is not None and not callable(on_checkpoint):
            raise ValueError("on_checkpoint=%.60r: a function called with each checkpoint "
                             "(a dict)" % (on_checkpoint,))
        if checkpoint_path is not None:
            checkpoint_path = os.fspath(checkpoint_path)
            _check_checkpoint_path(checkpoint_path)
        self.plan = stream.plan
        self.rank = stream.rank
        self.prefetch = prefetch
        self.threads = threads if prefetch else 0
        self.on_checkpoint = on_checkpoint
        self.checkpoint_path = checkpoint_path
        own = Stream(stream.plan, stream.rank)
        own.set_pos(stream.get_pos())
        self._epoch, self._emitted, self._cursor = own.epoch, own.emitted, own.cursor
        self._at_end = False
        self._closed = False
        self._next_auto = self._every
        self._opened = time.monotonic()
        self._load_box = None if load is None else _LoadBox(load)
        self._shared = _Shared(own, self._load_box, prefetch)
        self._workers = [threading.Thread(target=_load_ahead, args=(self._shared,), daemon=True,
                                          name="muster loader rank %d (%d)" % (self.rank, i))
                         for i in range(self.threads)]
        for worker in self._workers:
            worker.start()
        self._finalizer = weakref.finalize(self, _stop_threads, self._shared)

    # ---- taking items ---------------------------------------------------------------

    def _take(self):
        """The next item's sample, or _END at the end of the epoch."""
        shared = self._shared
        with shared.cv:
            if self._closed:
                raise ValueError("the loader is closed")
            if self._at_end:
                return _END
            if not self.threads:
                shared.misses += 1
                started = time.perf_counter()
                generation, number, index, emitted, cursor = shared.assign()
            else:
                entry = shared.ready.pop(shared.taken, None)
                if entry is not None:
                    shared.hits += 1
                else:
                    shared.misses += 1
                    while entry is None:
                        shared.cv.wait()
                        entry = shared.ready.pop(shared.taken, None)
                shared.taken += 1
                shared.cv.notify_all()   # room for one more
        if not self.threads:
            entry = _END if index is None else shared.produce(index, emitted, cursor, started)
        return self._consume(entry)

    def _consume(self, entry):
        kind = entry[0]
        if kind == "end":
            self._at_end = True
            return _END
        if kind == "error":
            self._move(self.get_pos())   # the next call loads that item again
            raise entry[2]
        self._emitted, self._cursor = entry[3], entry[4]
        with self._shared.cv:
            self._shared.samples += 1
        return entry[2]

    def _checkpoint_if_due(self):
        """The automatic checkpoint, at the first call after every checkpoint_every
        samples: the caller came back for more, so it is done with those before."""
        if self._every is not None and self._shared.samples >= self._next_auto:
            self.checkpoint()
            self._next_auto = (self._shared.samples // self._every + 1) * self._every

    def next(self):
        """The next sample (or index) of this epoch, or None at its end (with a ``load``
        that may return None, iterate instead: the loop ends only at the end)."""
        self._checkpoint_if_due()
        item = self._take()
        return None if item is _END else item

    def take(self, count):
        """Up to ``count`` samples; fewer only at the end of the epoch."""
        self._checkpoint_if_due()
        out = []
        while len(out) < count:
            item = self._take()
            if item is _END:
                break
            out.append(item)
        return out

    def __iter__(self):
        while True:
            self._checkpoint_if_due()
            item = self._take()
            if item is _END:
                return
            yield item

    # ---- the position -------------------------------------------------------------

    @property
    def epoch(self):
        return self._epoch

    def __len__(self):
        return self.plan.rank_len(self.rank)

    def remaining(self):
        return len(self) - self._emitted

    def get_pos(self):
        """The position after the samples taken (not those loaded ahead)."""
        return StreamPos(self.plan.fingerprint, self.rank, self._epoch, self._emitted,
                         0 if self.plan.positional else self._cursor)

    def _move(self, pos=None, epoch=None):
        """Moves the producer to ``pos``, or to the start of ``epoch`` (validated by
        Stream.set_pos and set_epoch, which leave it where it was when refused), and drops
        what was loaded ahead."""
        shared = self._shared
        with shared.cv:
            if self._closed:
                raise ValueError("the loader is closed")
            stream = shared.stream
            if epoch is not None:
                stream.set_epoch(epoch)
            else:
                stream.set_pos(pos)
            self._epoch, self._emitted, self._cursor = stream.epoch, stream.emitted, stream.cursor
            self._at_end = False
            shared.restart()

    def set_pos(self, pos):
        """Resumes at ``pos``: a StreamPos, its 40 bytes, or a checkpoint (a dict, as
        ``checkpoint()`` returns and ``read_checkpoint`` reads) of this configuration and
        rank.  A refused one leaves the loader where it was."""
        self._move(pos)

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` (ValueError past the plan's last)."""
        self._move(epoch=int(epoch))

    def next_epoch(self):
        self.set_epoch(self._epoch + 1)

    def checkpoint(self):
        """Takes a checkpoint now: the position after the samples taken, with the time
        and the count of checkpoints; written to checkpoint_path and given to
        on_checkpoint when set.  Returns it (a dict).  When writing fails nothing is
        counted and the file is left as it was."""
        pos = self.get_pos()
        with self._shared.cv:
            count = self._shared.checkpoints + 1
        record = {"version": CHECKPOINT_VERSION, "mode": "standalone",
                  "fingerprint": "%016x" % pos.fingerprint, "rank": pos.rank,
                  "epoch": pos.epoch, "consumed": pos.emitted, "position": pos.encode().hex(),
                  "time_ms": int(time.time() * 1000), "checkpoints": count}
        if self.checkpoint_path is not None:
            write_atomically(self.checkpoint_path, json.dumps(record) + "\n")
        with self._shared.cv:
            self._shared.checkpoints = count
        if self.on_checkpoint is not None:
            self.on_checkpoint(record)
        return record

    # ---- statistics and the end ------------------------------------------------------

    def stats(self):
        """The counters of muster_loader_stats_t that a standalone loader has (a dict)."""
        shared = self._shared
        with shared.cv:
            alive = time.monotonic() - self._opened
            return {"samples_loaded": shared.samples, "prefetch_hits": shared.hits,
                    "prefetch_misses": shared.misses,
                    "avg_load_time_us": shared.load_s * 1e6 / shared.loads if shared.loads else 0.0,
                    "checkpoints": shared.checkpoints,
                    "utilization": shared.busy_s / (alive * max(self.threads, 1)) if alive > 0
                    else 0.0,
                    "buffer_peak": shared.buffer_peak, "buffered": len(shared.ready),
                    "epoch": self._epoch}

    def close(self):
        """Stops the loading threads (waiting for loads under way) and drops what they
        loaded ahead.  Closing twice does nothing."""
        shared = self._shared
        with shared.cv:
            self._closed = True
            shared.ready.clear()
        self._finalizer()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
