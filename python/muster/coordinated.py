"""One rank of a *coordinated* iteration on the head: CoordinatedRankSampler, the engine of
``muster.torch.DistributedSampler(coordinated=True)`` (docs/iterations.md, "Coordinated
iterations"; docs/python.md, "Coordinated sampler") and of ``muster.CoordinatedStream``
(coordinated_stream.py), its public face for code without PyTorch.

The rank leases one block at a time (``POST /v1/iterations/{name}/next`` with its
indices), yields the block's indices, and acknowledges the block when the caller asks
for the index after its last one (or at ``state_dict``).  Every epoch, the union of the
acknowledged blocks of all ranks is every sample exactly once, whatever ranks die or
come back (the head's leases and fencing tokens).

``state_dict()`` is the head's checkpoint (the acknowledged blocks of the current epoch)
plus the blocks this rank has partly read (``partial``: block -> items consumed), so a
resume is exact mid-block too.  ``load_state_dict(state)`` (or a list of every rank's
states, gathered with ``torch.distributed.all_gather_object`` or any other all-gather)
makes this rank join a *new* iteration created from that checkpoint with the current
world size: the head deals the blocks not acknowledged to the new ranks (its elastic
rules), and the rank skips the items of partly read blocks that the states name.

``state_dict(consumed=N)`` is for a caller that reads ahead of what it has used (a
DataLoader whose workers prefetch): only the first N items the rank handed out in the
epoch (since the last load) count as read.  The rank keeps a log of the blocks it handed
out (block, the items handed out, whether its ack was taken), and the state names the
blocks acknowledged to the head whose items were not all used (``reopened``, their used
items in ``partial``): they leave the checkpoint's ``done``, so a resume serves their
unused items again.  The head's accounting is left as it is: acks still go when a block
is read to its end (docs/design-notes.md, "Prefetching and the coordinated sampler").

``give_back(consumed=N)`` is for such a caller that leaves its loop mid-epoch and starts
another: the items handed out after the first N go out again first in the next
iteration, from the log (coordinated_log.py), which keeps each block's indices for it;
the head is not told (docs/design-notes.md, "A loop left and started again").  A newer
iteration, a give_back, a set_epoch or a load ends the iterations begun before.
"""
import hashlib
import json
import logging
import os
import threading
import time
import weakref

from . import errors
from .coordinated_log import HandedLog
from .iteration import Dataset

STATE_VERSION = 1
NAME_MAX = 128
HEAD_WAIT_S = 600.0   # how long a rank waits for a head that does not answer, by default
RETRY_PAUSE_S = 1.0   # between tries meanwhile
# A head that is down or restarting: no reply came, or it answered 503 while stopping.
_HEAD_DOWN = (errors.NetworkError, errors.Unavailable)
# One WARNING when a rank starts waiting for the head, one INFO when it answers again.
log = logging.getLogger("muster.iteration")


def _check_run(run):
    """ValueError unless ``run`` is None or a string of 1 to 200 characters."""
    if run is not None and (not isinstance(run, str) or not 0 < len(run) <= 200):
        raise ValueError("run=%.60r: expected a string of 1 to 200 characters that every rank "
                         "of this run gives and another run does not (a job id, such as "
                         "SLURM_JOB_ID), or None" % (run,))


def _resumed_name(base, checkpoint, partial, world_size, run=None):
    """The name of the iteration a resume of ``checkpoint`` (and its partly read blocks)
    into ``world_size`` ranks creates: the same on every rank of the new world.  The
    world size is part of it, so that the same states resumed again into another world
    size (a resumed run that failed, started on other GPUs) make an iteration of their
    own rather than meeting the first resume's, which the head would refuse as another
    configuration under a name the caller never chose.  So is ``run`` when given (the
    ranks' shared identity of this run): the same states resumed by another run read
    from the states again rather than from where an earlier resume's ranks left off."""
    key = [checkpoint, partial, world_size] + ([run] if run is not None else [])
    digest = hashlib.sha1(json.dumps(key, sort_keys=True,
                                     separators=(",", ":")).encode()).hexdigest()[:12]
    return "%s.r%s" % (base[:NAME_MAX - 14], digest)


# Keys of a sampler's configuration that a resume may change (or that are no part of
# the plan): everything else must equal the checkpoint's.
_RESUMABLE_KEYS = ("world_size", "epochs", "lease_ms", "rank_timeout_ms", "replication",
                   "slow_ratio", "cluster_sync")


def _dataset_shape(dataset):
    """(shard counts, labels) of a dataset object of a configuration (uris aside)."""
    dataset = dataset or {}
    if "num_samples" in dataset:
        counts = [int(dataset["num_samples"])]
    else:
        counts = [int(s.get("count", 0)) for s in dataset.get("shards") or ()]
    labels = dataset.get("labels")
    return counts, (list(labels) if labels is not None else None)


def _config_mismatch(mine, theirs):
    """The first field of this sampler's configuration ``mine`` that differs from a
    checkpoint's ``theirs``, as a message, or None."""
    if _dataset_shape(mine.get("dataset")) != _dataset_shape(theirs.get("dataset")):
        return "dataset: %s there, %s here" % (json.dumps(theirs.get("dataset"))[:200],
                                               json.dumps(mine.get("dataset"))[:200])
    for key in sorted(mine):
        if key in _RESUMABLE_KEYS or key == "dataset" or key not in theirs:
            continue
        if mine[key] != theirs[key]:
            return "%s: %r there, %r here" % (key, theirs[key], mine[key])
    return None


def _dataset_object(dataset):
    """The API's dataset object (docs/api.md, ``POST /v1/iterations``) of a number of
    samples or a :class:`muster.iteration.Dataset` (shard counts, labels)."""
    if not isinstance(dataset, Dataset):
        return {"num_samples": int(dataset)}
    out = ({"num_samples": dataset.num_samples} if dataset.implicit
           else {"shards": [{"count": int(c)} for c in dataset.shard_counts]})
    if dataset.labels is not None:
        out["labels"] = list(dataset.labels)
    return out


# What a state that cannot be loaded is called, and where the state it may be goes
# instead, for each kind of rank that loads one (CoordinatedRankSampler's ``kind``).
_STATE_WORDS = {
    "sampler": "a standalone sampler's state loads into a sampler without coordinated=True",
    "stream": "a standalone stream's position loads with muster.iteration.Stream.set_pos",
}


def _states_to_load(state, kind):
    """``state`` (one rank's state_dict(), or a list of every rank's) as a list of at
    least one state, or ValueError saying why it is none."""
    states = list(state) if isinstance(state, (list, tuple)) else [state]
    if not states:
        raise ValueError("no %s state to load (an empty list): give one rank's state_dict() "
                         "or the list of every rank's" % kind)
    for s in states:
        if not isinstance(s, dict):
            raise ValueError("not a %s state (a dict of state_dict()): %.100r" % (kind, s))
        if s.get("mode") != "coordinated":
            raise ValueError("not a coordinated %s state (mode %r): %s"
                             % (kind, s.get("mode"), _STATE_WORDS[kind]))
        if s.get("version") != STATE_VERSION or not isinstance(s.get("checkpoint"), dict):
            raise ValueError("coordinated %s state: version %r is not known, or it has no "
                             "checkpoint" % (kind, s.get("version")))
        acked = s.get("acked", [])
        if not isinstance(acked, list) or not all(
                isinstance(r, list) and len(r) == 2 and all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r)
                and r[0] < r[1] for r in acked):
            raise ValueError("coordinated %s state: acked is %.100r, expected a list of "
                             "[begin, end) block ranges" % (kind, acked))
        reopened = s.get("reopened", [])
        if not isinstance(reopened, list) or not all(
                isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in reopened):
            raise ValueError("coordinated %s state: reopened is %.100r, expected a list of "
                             "block numbers" % (kind, reopened))
    return states


def _merged_position(states):
    """(checkpoint, partial) that the states of every rank (or one rank's) resume from:
    the latest epoch they name, its done blocks, less every block a rank ``reopened``,
    and the items of each block not done that some rank read.  A rank that reopened
    blocks saved them in its own epoch; the states of a later one (ranks that used all
    they were handed) say that epoch is complete on the head.

    The done blocks are those every state's checkpoint names (done before the first
    state was taken: each rank's own state accounts for what it had acknowledged by then)
    and those a rank's state names as its own (``acked``).  A block done in a later
    state's checkpoint only is one that another rank acknowledged after its own state
    was taken — its loader workers read on meanwhile, their items not trained on — and is
    read again.  States without ``acked`` (an older muster's) take the union of the
    checkpoints, as before."""
    reopening = [s for s in states if s.get("reopened")]
    if reopening:
        epoch = min(s["checkpoint"]["epoch"] for s in reopening)
    else:
        epoch = max(s["checkpoint"]["epoch"] for s in states)
    same = [s for s in states if s["checkpoint"]["epoch"] == epoch]
    base = max((s["checkpoint"] for s in same), key=_done_count)
    if any(s["checkpoint"]["epoch"] > epoch for s in states):
        done = [[0, int(base["blocks"])]]
    elif all("acked" in s for s in same):
        done = _ranges_union([_ranges_common([s["checkpoint"].get("done") or () for s in same])]
                             + [s["acked"] for s in same])
    else:
        done = _ranges_union(s["checkpoint"].get("done") or () for s in same)
    done = _ranges_minus(done, [int(b) for s in same for b in s.get("reopened") or ()])
    partial = {}
    for s in same:
        for block, pos in (s.get("partial") or {}).items():
            block = int(block)
            if not _in_ranges(block, done):
                partial[block] = max(partial.get(block, 0), int(pos))
    return dict(base, done=done), partial


def _keep_alive(ref, stop, period):
    """A rank's heartbeat thread: while the rank holds a block, it heart-beats every
    ``period`` seconds in which the rank made no call, so that a caller busy between two
    indices (a slow step, a validation pass, saving a checkpoint) keeps its lease and
    stays alive: its block is not taken over and read twice.  It holds the sampler by
    ``ref`` (a weak reference) and ends with it, or when ``stop`` is set."""
    while not stop.wait(period):
        sampler = ref()
        if sampler is None:
            return
        if sampler._held is not None or sampler._unacked:
            sampler._keepalive()
        del sampler


def _done_count(checkpoint):
    return sum(e - b for b, e in checkpoint.get("done") or ())


def _finished(checkpoint):
    """Whether a checkpoint is of a finished iteration (every epoch complete: it names no
    blocks)."""
    return checkpoint.get("blocks") == 0


def _ranges_union(range_lists):
    """The union of lists of [begin, end) ranges, as sorted ranges apart from each other
    (the head refuses touching ones)."""
    out = []
    for b, e in sorted((int(b), int(e)) for ranges in range_lists for b, e in ranges):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def _ranges_common(range_lists):
    """The blocks in every one of the lists of sorted, apart [begin, end) ranges."""
    common = None
    for ranges in range_lists:
        ranges = [[int(b), int(e)] for b, e in ranges]
        if common is None:
            common = ranges
            continue
        out, i, j = [], 0, 0
        while i < len(common) and j < len(ranges):
            b, e = max(common[i][0], ranges[j][0]), min(common[i][1], ranges[j][1])
            if b < e:
                out.append([b, e])
            if common[i][1] < ranges[j][1]:
                i += 1
            else:
                j += 1
        common = out
    return common or []


def _ranges_of(blocks):
    """Block numbers as sorted, apart [begin, end) ranges."""
    out = []
    for block in sorted(blocks):
        if out and block == out[-1][1]:
            out[-1][1] += 1
        else:
            out.append([block, block + 1])
    return out


def _ranges_minus(ranges, blocks):
    """Sorted, apart ``ranges`` without the block numbers ``blocks``."""
    blocks = sorted(set(blocks))
    out, i = [], 0
    for b, e in ranges:
        at = b
        while i < len(blocks) and blocks[i] < e:
            block = blocks[i]
            i += 1
            if block < at:
                continue
            if block > at:
                out.append([at, block])
            at = block + 1
        if at < e:
            out.append([at, e])
    return out


def _in_ranges(block, ranges):
    return any(b <= block < e for b, e in ranges)


_SHAPE_KEYS = ("version", "name", "config", "world_size", "fingerprint", "blocks")


class CoordinatedRankSampler:
    """Rank ``rank`` of the iteration ``name`` (created or joined with ``config``: the body
    of ``POST /v1/iterations`` without name and rank).  ``wait``: when the rank has nothing
    to read but the epoch is not over (other ranks hold its last blocks), poll until it is
    (True, the default: what a rank of a real job must do, since blocks of a failed rank
    may come to it) or end the rank's epoch at once (False).  ``kind`` names what the
    rank is to its user in the messages of a state it cannot load: "sampler"
    (muster.torch) or "stream" (CoordinatedStream)."""

    def __init__(self, client, name, config, rank, wait=True, head_wait_s=HEAD_WAIT_S,
                 kind="sampler"):
        self.client = client
        self.kind = kind
        self.base_name = name
        self.name = name
        self.config = dict(config)
        self.rank = rank
        self.world_size = int(self.config["world_size"])
        self.wait = wait
        self.head_wait_s = head_wait_s
        self.epoch = 0
        self.emitted = 0                   # items yielded in the current epoch by this rank
        self.status = None                 # the create/join reply
        self._created = False
        self._checkpoint = None            # the checkpoint to start from (after load_state_dict)
        self._skip = {}                    # block -> items already consumed (resumed epoch)
        self._skip_epoch = None
        self._held = None                  # the block being read: dict + "pos" (+ "handed")
        self._unacked = []                 # blocks fully read, not acknowledged yet
        self._log = HandedLog()            # what the rank handed out in the epoch, since a load
        self._iteration = 0                # the latest iteration's number: older ones end
        self._acked = {}                   # epoch -> blocks this rank acknowledged (since a load)
        self._shape = None                 # the plan's checkpoint keys (_SHAPE_KEYS), once seen
        # Held while the rank's state changes: a loader's feeder thread may read while the
        # training loop saves (muster.torch.StreamDataset with loader workers).
        self._lock = threading.RLock()
        self._last_call = 0.0
        self._lease_ms = int(self.config.get("lease_ms") or 30000)
        # A heartbeat this often keeps both the leases and the rank alive.
        self._beat_ms = min(self._lease_ms, int(self.config.get("rank_timeout_ms") or 30000)) / 3
        self._keeper = None                # (pid, stop event) of the heartbeat thread

    def __getstate__(self):
        """A copy for another process (a DataLoader worker started with spawn): the same
        rank of the same iteration, at the same place, whose client connects on its own
        and which starts its own heartbeat thread when it reads (the thread is this
        process's).  The copy reads as this rank, as a forked copy does: let only one of
        them read (muster.torch.StreamDataset reads in the process that made it and feeds
        its loader workers, muster.feed)."""
        state = dict(self.__dict__)
        state["_keeper"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ---- the iteration ---------------------------------------------------------------

    def ensure(self):
        if self._created:
            return self.status
        if self._checkpoint is not None:
            body = {"name": self.name, "checkpoint": self._checkpoint, "world_size": self.world_size,
                    "rank": self.rank}
            for key in ("epochs", "lease_ms", "rank_timeout_ms", "replication", "slow_ratio"):
                if key in self.config:
                    body[key] = self.config[key]
        else:
            body = dict(self.config, name=self.name, rank=self.rank)
        # Sent again after a lost reply, a create joins what it created (as any rank would).
        def create(body):
            return self._retrying("creating or joining the iteration",
                                  lambda retry: self.client.create_iteration(body))
        try:
            self.status = create(body)
        except errors.InvalidArgument:
            if self._checkpoint is None:
                raise
            # this head takes only world_size and epochs besides a checkpoint
            body = {k: body[k] for k in ("name", "checkpoint", "world_size", "rank") if k in body}
            self.status = create(body)
        if self._checkpoint is not None:
            self._warn_resumed_again()
        self._created = True
        self._last_call = time.monotonic()
        return self.status

    def _warn_resumed_again(self):
        """Logs a WARNING when this rank joins a resume of its states in which it has read
        already: the same states were loaded before (a resumed run that stopped and is
        started again from them), and the iteration goes on where that run's ranks left
        it, not from the states: what they read then is not read again."""
        ranks = (self.status or {}).get("ranks") or ()
        done = [r.get("samples", 0) for r in ranks if r.get("rank") == self.rank]
        if done and done[0]:
            log.warning("iteration %s, rank %d: these states were resumed before and this rank "
                        "read %d samples since; the resume goes on from there, not from the "
                        "states, so those samples are not read again (to read from the states "
                        "again, give each run its own load_state_dict(states, run=JOB_ID), or "
                        "remove this one first: muster iter rm %s)", self.name, self.rank,
                        done[0], self.name)

    def set_epoch(self, epoch):
        with self._lock:
            if epoch != self.epoch:
                self.epoch = epoch
                self.emitted = 0
                self._forget_handed()

    def _forget_handed(self):
        """Starts the log of handed out blocks afresh (a new epoch, or a load), and ends
        the iterations begun before."""
        self._log = HandedLog()
        self._iteration += 1
        if self._held is not None:
            self._held.pop("handed", None)

    def _retrying(self, what, call):
        """``call(retry)``'s value, ``retry`` False on the first try.  While the head does
        not answer (down or restarting: its state is on disk, the rank's leases keep their
        deadlines) the call is made again at once, then every RETRY_PAUSE_S for up to
        ``head_wait_s``, then the last error is raised.  Safe to resend: an ack is answered
        as a repeat, and a next is resent with ``held`` (the blocks a lost reply leased
        come again)."""
        failing_since = None
        while True:
            try:
                value = call(failing_since is not None)
            except _HEAD_DOWN as e:
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("muster: iteration %s, rank %d: %s failed (%s): the head at %s "
                                "is unreachable or restarting; trying again every %g s for up "
                                "to %g s", self.name, self.rank, what, e, self.client.url,
                                RETRY_PAUSE_S, self.head_wait_s)
                    continue  # at once: a connection lost once (a lost reply) is common
                if now - failing_since >= self.head_wait_s:
                    raise
                time.sleep(min(RETRY_PAUSE_S, max(0.0, failing_since + self.head_wait_s - now)))
                continue
            if failing_since is not None:
                log.info("muster: iteration %s, rank %d: the head at %s answers again after "
                         "%.1f s; carrying on (%s)", self.name, self.rank, self.client.url,
                         time.monotonic() - failing_since, what)
            return value

    def _ack(self, blocks, epoch):
        if not blocks:
            return
        body = {"rank": self.rank, "epoch": epoch,
                "blocks": [{"block": b["block"], "token": b["token"]} for b in blocks]}
        try:
            self._retrying("acknowledging blocks",
                           lambda retry: self.client.iteration_ack(self.name, body))
        except errors.LeaseLost:
            # A lease expired (this rank stalled past lease_ms): ack the others one by one;
            # the lost ones were handed to another rank, which reads them again (and what
            # of them this rank gives back, give_back, is not handed out here again).
            if len(blocks) > 1:
                for b in blocks:
                    self._ack([b], epoch)
            elif "handed" in blocks[0]:
                blocks[0]["handed"].lost = True
        else:
            mine = self._acked.setdefault(epoch, set())
            for b in blocks:
                mine.add(b["block"])
                if "handed" in b:
                    b["handed"].acked = True
            for old in [e for e in self._acked if e < epoch - 1]:
                del self._acked[old]
        self._last_call = time.monotonic()

    def _flush(self):
        blocks, self._unacked = self._unacked, []
        by_epoch = {}
        for b in blocks:
            by_epoch.setdefault(b["epoch"], []).append(b)
        for epoch, bs in sorted(by_epoch.items()):
            self._ack(bs, epoch)

    def _keepalive(self):
        if (time.monotonic() - self._last_call) * 1000 > self._beat_ms:
            try:
                self.client.iteration_heartbeat(self.name, {"rank": self.rank})
            except errors.MusterError:
                pass
            self._last_call = time.monotonic()

    def _start_keeper(self):
        """Starts the heartbeat thread (_keep_alive) of this process, once."""
        if self._keeper is not None and self._keeper[0] == os.getpid():
            return
        stop = threading.Event()
        self._keeper = (os.getpid(), stop)
        threading.Thread(target=_keep_alive, args=(weakref.ref(self), stop, self._beat_ms / 1000.0),
                         name="muster iteration %s rank %d" % (self.name, self.rank),
                         daemon=True).start()

    def __iter__(self):
        """The epoch's indices: each taken under the rank's lock, which a wait for other
        ranks lets go of (_pause), so another thread's state_dict is never held up long.
        An iteration begun later (or a give_back, set_epoch, load) ends this one: it
        yields nothing more, so that a loop left behind cannot take what the new one
        reads."""
        indices = iteration = None
        while True:
            with self._lock:
                if iteration is None:
                    self._iteration += 1
                    iteration = self._iteration
                    indices = self._indices(iteration)
                index = next(indices, None) if iteration == self._iteration else None
            if index is None:
                return
            yield index

    def _pause(self, seconds):
        """Sleeps with the rank's lock let go (the caller, _indices, holds it once)."""
        self._lock.release()
        try:
            time.sleep(seconds)
        finally:
            self._lock.acquire()

    def _hand_out(self, b, first):
        """Starts handing out block ``b`` at item ``first``: it becomes the held block,
        logged."""
        b["handed"] = self._log.add(b["block"], first, b["indices"])
        self._held = b

    def _indices(self, iteration):
        self.ensure()
        self._start_keeper()
        epoch = self.epoch
        self.emitted = 0
        # What a loop left behind had handed out and not used (give_back) goes out first.
        for index in self._log.given_back():
            self.emitted += 1
            self._keepalive()
            yield index
        held = self._held
        if held is not None and held["epoch"] == epoch:
            # an iteration that stopped mid-block: that block first
            if "handed" not in held:
                self._hand_out(held, held.get("pos", 0))
            handed = held["handed"]
            for k in range(held.get("pos", 0), len(held["indices"])):
                held["pos"] = handed.end = handed.upto = k + 1
                self.emitted += 1
                yield held["indices"][k]
            self._unacked.append(held)
        self._held = None
        while True:
            self._flush()
            # Every block this rank knows of is acknowledged by now (_flush): a retry may
            # ask for the blocks it holds, which are those a lost reply leased.
            body = {"rank": self.rank, "epoch": epoch, "max": 1, "indices": True}
            reply = self._retrying("leasing a block", lambda retry: self.client.iteration_next(
                self.name, dict(body, held=True) if retry else body))
            self._last_call = time.monotonic()
            state = reply["state"]
            if state == "blocks":
                self._see_shape(epoch)
                for b in reply["blocks"]:
                    b["epoch"] = epoch
                    indices = b["indices"]
                    start = self._skip.pop(b["block"], 0) if epoch == self._skip_epoch else 0
                    self._hand_out(b, start)
                    handed = b["handed"]
                    for k in range(start, len(indices)):
                        b["pos"] = handed.end = handed.upto = k + 1
                        self.emitted += 1
                        self._keepalive()
                        yield indices[k]
                    self._held = None
                    self._unacked.append(b)
            elif state == "wait":
                if not self.wait:
                    return
                self._pause(max(1, reply.get("retry_ms") or 50) / 1000.0)   # the head's pacing
                if iteration != self._iteration:
                    return   # a newer iteration began, or a give_back, while this one waited
            else:   # epoch_end, finished
                return

    def __len__(self):
        n = self.status_num_samples()
        if self.config.get("tail") == "drop":
            return n // self.world_size
        return -(-n // self.world_size)

    def status_num_samples(self):
        ds = self.config.get("dataset") or {}
        if "num_samples" in ds:
            return int(ds["num_samples"])
        return sum(int(s.get("count", 0)) for s in ds.get("shards") or ())

    # ---- the position ---------------------------------------------------------------------

    def state_dict(self, consumed=None):
        """Acknowledges the blocks read to their end and returns the head's checkpoint with
        this rank's partly read blocks (plain JSON types).  ``consumed``: how many of the
        items handed out in this epoch (since the last load) were used; None: all.  Blocks
        acknowledged past that point are ``reopened``: out of the checkpoint's done
        blocks, their used items in ``partial``, and the state is of the rank's epoch even
        when the head has completed it meanwhile."""
        with self._lock:
            used = self._log.used_count(consumed)
            self.ensure()
            held = self._held
            if held is not None and held.get("pos", 0) >= len(held["indices"]):
                self._unacked.append(held)
                self._held = held = None
            self._flush()
            # Waited for as next and ack are: a loop that checkpoints every step meets a head
            # that restarts here as often as anywhere.
            ck = self._retrying("reading the checkpoint",
                                lambda retry: self.client.iteration_checkpoint(self.name))
            self._note_shape(ck)
            read = self._log.blocks_read(used)
            reopened = sorted(block for block, (count, size, acked) in read.items()
                              if acked and count < size)
            if ck["epoch"] > self.epoch:
                # The head completed this rank's epoch: the state stays of that epoch (every
                # block done, less the reopened ones), so that a merge with the states of
                # ranks that saved theirs before it ended reads what they read on after.
                try:
                    ck = self._epoch_complete(ck)
                except RuntimeError:
                    if reopened:
                        raise
            partial = {}
            if self._skip_epoch == ck["epoch"]:
                partial.update({str(k): v for k, v in self._skip.items()})
            if (held is not None and "handed" not in held and held["epoch"] == ck["epoch"]
                    and held.get("pos", 0) > 0):
                partial[str(held["block"])] = held["pos"]
            if ck["epoch"] == self.epoch:
                for block, (count, size, acked) in read.items():
                    if count > 0 and (count < size or not acked):
                        partial[str(block)] = count
            self._log.drop_used(used)
            state = {"version": STATE_VERSION, "mode": "coordinated", "name": self.base_name,
                     "rank": self.rank, "world_size": self.world_size, "epoch": ck["epoch"],
                     "emitted": self.emitted, "checkpoint": ck, "partial": partial,
                     "acked": _ranges_of(self._acked.get(ck["epoch"], ()))}
            if reopened:
                state["checkpoint"] = dict(ck, done=_ranges_minus(ck.get("done") or (), reopened))
                state["reopened"] = reopened
            return state

    def give_back(self, consumed):
        """Takes back what this rank handed out in the epoch beyond its first ``consumed``
        items (counted as state_dict counts them: since the epoch's first iteration or
        the last load, over every loop): the next iteration of the epoch hands those out
        again first, in their order, then reads on.  For a loop left behind (a break, an
        exception) whose caller had read ahead of what it used: a DataLoader's
        prefetched batches.  The loop's iterator ends (it yields nothing more).  The
        head is not told: the blocks acknowledged stay done, and a checkpoint counts the
        items given back as not used until they are handed out again and counted."""
        with self._lock:
            used = self._log.used_count(consumed, required=True)
            held = self._held
            entry = held.get("handed") if held is not None else None
            self._log.give_back(used, entry)
            if entry is not None:
                held["pos"] = entry.end
            self._iteration += 1

    def _resumed_epoch(self, epoch):
        return self._checkpoint is not None and epoch == self._checkpoint["epoch"]

    def _note_shape(self, ck):
        """Keeps the plan's keys of a checkpoint of an epoch on the plan (not a resumed
        epoch on the checkpoint's plan, not a finished iteration's)."""
        if not _finished(ck) and not self._resumed_epoch(ck["epoch"]):
            self._shape = {k: ck[k] for k in _SHAPE_KEYS if k in ck}

    def _see_shape(self, epoch):
        """In the last epoch of a bounded iteration, reads the plan's keys once while this
        rank holds a block (the epoch cannot end meanwhile): once it is finished the head's
        checkpoint names no blocks, and a state of that epoch (_epoch_complete) needs them."""
        epochs = int(self.config.get("epochs") or 0)
        if self._shape is None and epochs and epoch == epochs - 1 \
                and not self._resumed_epoch(epoch):
            self._note_shape(self._retrying("reading the checkpoint", lambda retry:
                                            self.client.iteration_checkpoint(self.name)))

    def _epoch_complete(self, ck):
        """The checkpoint of this rank's epoch, complete on the head (``ck`` is of a later
        one): every block done."""
        if self._resumed_epoch(self.epoch):
            shape = {k: self._checkpoint[k] for k in _SHAPE_KEYS if k in self._checkpoint}
        elif not _finished(ck):
            shape = {k: ck[k] for k in _SHAPE_KEYS if k in ck}
        else:
            shape = self._shape
        if shape is None:
            raise RuntimeError("iteration %s, rank %d: epoch %d is complete on the head, whose "
                               "checkpoint no longer names its blocks; the blocks this rank "
                               "handed out but did not use cannot be saved"
                               % (self.name, self.rank, self.epoch))
        return dict(shape, epoch=self.epoch, done=[[0, shape["blocks"]]])

    def load_state_dict(self, state, run=None):
        """Resume from ``state`` (one rank's state, or a list of every rank's: then each
        rank's partly read block is skipped exactly).  Every rank must load the same
        state(s), and the same ``run`` (None, or a string naming this run: a job id): the
        new iteration's name is derived from them."""
        _check_run(run)
        states = _states_to_load(state, self.kind)
        ck, partial = _merged_position(states)
        # The head resumes the checkpoint's configuration whatever this sampler's: a state
        # of another dataset or seed would silently read that one's indices.
        mismatch = _config_mismatch(self.config, ck.get("config") or {})
        for s in states:
            mismatch = mismatch or _config_mismatch(s["checkpoint"].get("config") or {},
                                                    ck.get("config") or {})
        if mismatch:
            raise ValueError("the %s state belongs to another dataset or configuration "
                             "(%s)" % (self.kind, mismatch))
        with self._lock:
            self._checkpoint = ck
            self._skip = partial
            self._skip_epoch = ck["epoch"]
            self.name = _resumed_name(self.base_name, ck, sorted(partial.items()),
                                      self.world_size, run)
            self._created = False
            self._held = None
            self._unacked = []
            self.epoch = ck["epoch"]
            self.emitted = 0
            self._acked = {}
            self._forget_handed()

    def close(self):
        """Acknowledges what was read to its end (the iteration stays on the head) and
        stops the heartbeat thread."""
        if self._keeper is not None:
            self._keeper[1].set()
            self._keeper = None
        if self._created:
            with self._lock:
                self._flush()
