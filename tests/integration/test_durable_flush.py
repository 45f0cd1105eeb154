"""--sync full: no reply leaves the head before the writes it follows are on disk.

The head commits with SQLite's synchronous=NORMAL and flushes the write-ahead log
itself: on the loop for a lone request, on a helper thread while the loop gathers
the next group under load (docs/design-notes.md, "Durable replies").  A power loss
cannot be staged in a test, so the head runs under strace with every fdatasync held
for FLUSH_S seconds after it returns: a write's reply must take at least that long
(it waits for its flush), concurrent writes must share flushes (the helper thread's
groups), and reads must flush nothing.  With the flush made to fail (EIO), the write
it covered is answered 500 and the head stops with a non-zero status, also when that
flush was in flight as the head stopped.

The helper thread writes the replies of the groups it flushes when they are large
(MUSTER_LEND_MIN_BYTES; the tests that check it set 0), the loop the others.

A lease of tasks already on disk is answered at its commit without a flush of its
own (a power loss could forget only the lease), also while another group's flush is
in flight; one that hands out a task whose put is not on disk yet waits for that flush,
and so does one that brings a broadcast update whose post is in flight;
--sync-leases flushes every lease.

A write that arrives while a flush is in flight (with a few clients; every time
with MUSTER_FLUSH_QUEUE=2) commits at once and its flush is queued behind, for the
helper thread to run the moment the first one ends: its reply still waits for that
flush, and a lease of the task it put waits for it too.
"""
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

CLIENTS = 8
PUTS_EACH = 3
READS = 50
FLUSH_S = 0.3
# The hold of the test whose client must act within one held flush: long enough
# that a loaded machine's scheduling delays stay well inside it.
HOLD_S = 1.5

# "PID fdatasync(FD</path>) = 0" and "PID fdatasync(FD</path> <unfinished ...>";
# strace -y prints an fd as N</path>.
FLUSH = re.compile(r"^(\d+) +fdatasync\(\d+<([^>]*)>")
# "PID writev(FD<TCP:[...]>, ...": a reply written to a client's socket.
REPLY_WRITE = re.compile(r"^(\d+) +writev\(\d+<(?:TCP|TCPv6|socket):")


# fdatasync's system call number, as /proc/PID/task/TID/syscall shows a thread in it.
FDATASYNC = {"x86_64": 75, "aarch64": 83}


def in_syscall(pid, number):
    """True when a thread of process `pid` is in system call `number`."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/syscall" % (pid, tid)) as f:
                if f.read().split(" ", 1)[0] == str(number):
                    return True
        except OSError:
            pass
    return False


def held_in_injected_error(pid):
    """True when a thread of process `pid` other than the main one is held by strace
    in a system call whose error it injected (strace skips the call itself, so
    /proc shows the thread stopped, in system call -1)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        if int(tid) == pid:
            continue
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open("/proc/%d/task/%s/syscall" % (pid, tid)) as f:
                call = f.read().split(" ", 1)[0]
        except OSError:
            continue
        if state == "t" and call == "-1":
            return True
    return False


def health_held_back(head, wait_s=0.25):
    """True when GET /v1/health gets no reply within `wait_s` (the head holds
    every reply while a transaction is open); False when it is answered."""
    conn = head.connection(timeout=wait_s)
    try:
        head.request("GET", "/v1/health", conn=conn)
        return False
    except (socket.timeout, TimeoutError):
        return True
    finally:
        conn.close()


def wal_flushes(path):
    """(pid, flushed file) of every fdatasync the head began, in order."""
    with open(path, errors="replace") as f:
        return [(int(m.group(1)), m.group(2)) for m in map(FLUSH.match, f) if m]


def reply_writers(path):
    """The pids (threads) that wrote replies to sockets, in the trace at `path`."""
    with open(path, errors="replace") as f:
        return {int(m.group(1)) for m in map(REPLY_WRITE.match, f) if m}


def metric(head, name):
    """The sum of a metric's samples over its labels, from /metrics."""
    text = head.request("GET", "/metrics").raw.decode()
    return sum(float(m.group(1)) for m in
               re.finditer(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), text, re.M))


def flushes(head):
    return metric(head, "muster_store_flush_duration_seconds_count")


def put(head, queue, payloads, conn=None):
    r = head.request("POST", "/v1/queues/%s/tasks" % queue,
                     {"tasks": [{"payload": p} for p in payloads]}, conn=conn)
    assert r.status == 201, r
    return [t["id"] for t in r.json["tasks"]]


def lease(head, queue, body, conn=None):
    r = head.request("POST", "/v1/queues/%s/lease" % queue, body, conn=conn)
    assert r.status == 200, r
    return r.json["leases"]


class DurableFlushTest(unittest.TestCase):
    def setUp(self):
        strace = shutil.which("strace")
        self.assertIsNotNone(strace, "strace is missing: run scripts/install-deps")
        # LeakSanitizer cannot run under a tracer: leave leak checks to the other tests.
        self.asan_options = os.environ.get("ASAN_OPTIONS")
        os.environ["ASAN_OPTIONS"] = (self.asan_options + ":" if self.asan_options else "") + \
            "detect_leaks=0"
        self.strace = strace
        self.head = harness.Head(["--sync", "full"])
        self.trace = os.path.join(self.head.data_dir, "strace.txt")

    def tearDown(self):
        # Under strace the head is strace's child: a SIGKILL of strace (the harness's
        # cleanup) detaches it and it would run on after a failed test.  Kill it too.
        traced = self.traced_heads()
        self.head.cleanup()
        for pid in traced:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.asan_options is None:
            os.environ.pop("ASAN_OPTIONS", None)
        else:
            os.environ["ASAN_OPTIONS"] = self.asan_options

    def traced_heads(self):
        """The pids of the processes strace runs (none when the head is not traced)."""
        h = self.head
        if not h.prefix or h.proc is None or h.proc.poll() is not None:
            return []
        try:
            with open("/proc/%d/task/%d/children" % (h.proc.pid, h.proc.pid)) as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def stop_head(self):
        # SIGTERM goes to the head itself (strace's child); strace exits with its status.
        h = self.head
        with open("/proc/%d/task/%d/children" % (h.proc.pid, h.proc.pid)) as f:
            head_pid = int(f.read().split()[0])
        os.kill(head_pid, signal.SIGTERM)
        self.assertEqual(h.proc.wait(60), 0, h.log())

    def concurrent_writes(self, write, clients=CLIENTS):
        """`clients` clients at once call write(conn, n, i) PUTS_EACH times each; it
        returns when its write was sent and the write's reply.  Checks that every
        write succeeded and that none was answered before FLUSH_S (each waits for
        a held flush)."""
        h = self.head
        failures, early = [], []

        def client(n):
            conn = h.connection()
            try:
                for i in range(PUTS_EACH):
                    t0, r = write(conn, n, i)
                    if r.status not in (200, 201):
                        failures.append(r)
                    if time.monotonic() - t0 < FLUSH_S:
                        early.append((n, i))
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(failures, [])
        self.assertEqual(early, [], "writes acknowledged before their flush ended")

    def start_traced(self, *strace_args):
        self.head.prefix = [self.strace, "-f", "-qq", "-y", "-o", self.trace] + list(strace_args)
        self.head.start()

    def start_holding_flushes(self, **env):
        """Starts the head with every flush on the helper thread, each fdatasync held
        HOLD_S; `env` is more of the head's environment.  fdatasync's system call
        number (to see a flush in flight), or the test is skipped."""
        number = FDATASYNC.get(os.uname().machine)
        if number is None:
            self.skipTest("fdatasync's system call number on %s is not known here" %
                          os.uname().machine)
        self.head.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        self.head.env.update(env)
        self.start_traced("-e", "trace=fdatasync",
                          "-e", "inject=fdatasync:delay_exit=%d" % int(HOLD_S * 1e6))
        return number

    def test_replies_wait_for_the_flush(self):
        h = self.head
        # The helper thread writes the replies of every group it flushes, however small.
        h.env["MUSTER_LEND_MIN_BYTES"] = "0"
        self.start_traced("-e", "trace=fdatasync,writev",
                          "-e", "inject=fdatasync:delay_exit=%d" % int(FLUSH_S * 1e6))
        q = "flush"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        # One write at a time: each reply waits for its own flush.
        for i in range(3):
            t0 = time.monotonic()
            r = h.request("POST", "/v1/queues/%s/tasks" % q, {"tasks": [{"payload": i}]})
            self.assertEqual(r.status, 201, r)
            self.assertGreaterEqual(time.monotonic() - t0, FLUSH_S,
                                    "a write was acknowledged before its flush ended")
        started = len(wal_flushes(self.trace))
        # Eight writers at once: groups form while a flush is in flight, and each
        # reply still waits for the flush that covers it.
        self.concurrent_writes(lambda conn, n, i: (time.monotonic(), h.request(
            "POST", "/v1/queues/%s/tasks" % q, {"tasks": [{"payload": {"c": n, "i": i}}]},
            conn=conn)))
        for _ in range(READS):
            self.assertEqual(h.request("GET", "/v1/queues/" + q).status, 200)
        counts = h.request("GET", "/v1/queues/" + q).json["counts"]
        self.assertEqual(counts["queued"], 3 + CLIENTS * PUTS_EACH)
        # /metrics tells the two kinds of flush apart.
        metrics = h.request("GET", "/metrics").raw.decode()
        for on in ("loop", "thread"):
            m = re.search(r'^muster_store_flush_duration_seconds_count\{on="%s"\} (\d+)$' % on,
                          metrics, re.M)
            self.assertTrue(m and int(m.group(1)) > 0, "no %s flush in /metrics" % on)
        self.stop_head()

        flushes = wal_flushes(self.trace)
        main_pid = flushes[0][0]
        wal = [pid for pid, path in flushes[started:] if path.endswith("muster.db-wal")]
        writes = CLIENTS * PUTS_EACH
        # Shared flushes: fewer than one per write (and reads add none).
        self.assertLess(len(wal), writes, "concurrent writes did not share flushes")
        self.assertTrue(any(pid != main_pid for pid in wal), "no flush ran on the helper thread")
        # The helper thread also sends the replies of the groups it flushed, the
        # moment their flush ends (and never before: `early` above).
        helpers = {pid for pid in wal if pid != main_pid}
        self.assertTrue(reply_writers(self.trace) & helpers,
                        "no reply was written by the helper thread")

    def fail_a_flush(self):
        """Makes a flush fail and checks the head's answer and exit; returns the pid
        of the head's main thread and the pid of the failed flush."""
        h = self.head
        # Made once untraced, the store opens again without SQLite flushing anything:
        # the head's own flush at start is the WAL's first fdatasync; SQLite may flush
        # the WAL header once at the first commit; every fdatasync from the fourth on
        # fails (strace -P: only calls on the WAL file count).  So one of the first
        # writes is the first to meet a failing flush, and it must be the head's own.
        env = dict(h.env)
        h.env.clear()
        h.start()
        self.assertEqual(h.stop(), 0, h.log())
        h.env.update(env)
        self.start_traced("-P", os.path.join(h.data_dir, "muster.db-wal"),
                          "-e", "trace=fdatasync", "-e", "inject=fdatasync:error=EIO:when=4+")
        for i in range(4):
            r = h.request("PUT", "/v1/queues/q%d" % i, {})
            if r.status != 201:
                break
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertIn("flushing the write-ahead log failed", r.json["error"]["message"])
        self.assertEqual(h.proc.wait(30), 1, "the head went on after a failed flush")
        self.assertIn("acknowledged writes could not be made durable", h.log())
        flushed = wal_flushes(self.trace)
        self.assertGreaterEqual(len(flushed), 4, flushed)
        return flushed[0][0], flushed[3][0]

    def test_a_failed_flush_stops_the_head(self):
        main, failed = self.fail_a_flush()
        self.assertEqual(failed, main, "a lone request's flush did not run on the loop")

    def test_a_failed_flush_on_the_helper_thread_stops_the_head(self):
        # Every flush on the helper thread, which writes the replies: those it holds,
        # built before the flush, are answered anew with the error.
        self.head.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        self.head.env["MUSTER_LEND_MIN_BYTES"] = "0"
        main, failed = self.fail_a_flush()
        self.assertNotEqual(failed, main, "the failing flush did not run on the helper thread")

    def test_a_lease_after_a_reply_from_the_helper_thread_needs_no_flush(self):
        # Every flush on the helper thread, which sends the flushed group's replies
        # before the loop hears that the flush ended; strace holds every writev for
        # HOLD_S after it (the bytes are out already).  A client that got its put's
        # reply and asks for the task at once must not wait for the loop to learn
        # what the reply told it: the task is on disk, the lease goes out at its
        # commit.
        h = self.head
        h.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        h.env["MUSTER_LEND_MIN_BYTES"] = "0"
        self.start_traced("-e", "trace=writev",
                          "-e", "inject=writev:delay_exit=%d" % int(HOLD_S * 1e6))
        q = "told"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        self.assertEqual(len(put(h, q, ["floor", "told"])), 2)
        # The first lease after a start raises the token floor (a write of its own).
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)
        conn = h.connection()
        try:
            put(h, q, ["fresh"], conn=conn)
        finally:
            conn.close()
        sent = time.monotonic()
        leases = lease(h, q, {"max": 2})
        self.assertLess(time.monotonic() - sent, HOLD_S,
                        "the lease waited for the loop to hear of the flush")
        self.assertEqual([l["payload"] for l in leases], ["told", "fresh"])
        self.stop_head()

    def test_a_flush_failing_at_shutdown_fails_its_group(self):
        # A small group's flush on the helper thread fails while the head stops: its
        # reply is answered 500 and the head exits 1, even though the flush the stop
        # runs afterwards on the loop succeeds (a failed fdatasync proves nothing
        # later; the same descriptor would not report the error twice).
        h = self.head
        h.start()
        self.assertEqual(h.stop(), 0, h.log())
        saved = os.path.join(self.tmp_copy(), "data")
        shutil.copytree(h.data_dir, saved)
        h.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        wal = os.path.join(h.data_dir, "muster.db-wal")
        # strace counts `when` per thread.  A first run counts the main thread's
        # flushes before the stop (m): the helper thread's flush number m + 2 is made
        # to fail, so that the main thread's m + 1st, the stop's, succeeds.
        self.start_traced("-P", wal, "-e", "trace=fdatasync")
        for i in range(8):
            self.assertEqual(h.request("PUT", "/v1/queues/q%d" % i, {}).status, 201)
        self.stop_head()
        with open(self.trace, errors="replace") as f:
            before_stop = f.read().split("SIGTERM", 1)[0]
        flushed = [(int(x.group(1)), x.group(2))
                   for x in map(FLUSH.match, before_stop.splitlines()) if x]
        main = flushed[0][0]
        m = sum(1 for pid, _ in flushed if pid == main)
        self.assertLessEqual(m + 2, 8, flushed)
        self.assertEqual(sum(1 for pid, _ in flushed if pid != main), 8, flushed)
        # The second run, on the same files, holds the failing flush HOLD_S.
        shutil.rmtree(h.data_dir)
        shutil.copytree(saved, h.data_dir)
        self.start_traced("-P", wal, "-e", "trace=fdatasync", "-e",
                          "inject=fdatasync:error=EIO:delay_exit=%d:when=%d" %
                          (int(HOLD_S * 1e6), m + 2))
        head_pid = self.traced_heads()[0]
        for i in range(m + 1):
            self.assertEqual(h.request("PUT", "/v1/queues/q%d" % i, {}).status, 201)
        got = {}
        client = threading.Thread(
            target=lambda: got.update(r=h.request("PUT", "/v1/queues/last", {})))
        client.start()
        harness.wait_until(lambda: held_in_injected_error(head_pid), timeout=20,
                           what="the last put's flush to be held")
        os.kill(head_pid, signal.SIGTERM)
        client.join(60)
        r = got["r"]
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertIn("flushing the write-ahead log failed", r.json["error"]["message"])
        self.assertEqual(h.proc.wait(30), 1, "the head stopped cleanly over a failed flush")

    def tmp_copy(self):
        d = tempfile.mkdtemp(prefix="muster-flush-copy-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_the_next_group_waits_for_a_poll(self):
        # Every flush on the helper thread, held HOLD_S.  A worker's completion is being
        # flushed when another worker leases a task on disk (answered at its commit,
        # during that flush) and sends its completion: after a flush during which such
        # a lease went out, the group gathered meanwhile commits one poll of the sockets
        # later, however few clients are active, and its completion still waits for a
        # flush of its own.  The steps are ordered by the test, not by the machine's
        # pace: with eight workers racing (the test below), a loaded machine could
        # answer each round of them in one turn, when no flush is in flight, and no
        # lease would go out during one.
        h = self.head
        number = self.start_holding_flushes(MUSTER_GATHER_MIN_ACTIVE="0",
                                            MUSTER_LEND_FEW_BELOW="0", MUSTER_FLUSH_QUEUE="0")
        q = "gather"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["first", "second"])
        [first] = lease(h, q, {"max": 1})  # raises the token floor
        head_pid = self.traced_heads()[0]
        done = {}

        def complete(name, held):
            conn = h.connection()
            try:
                done[name, "sent"] = time.monotonic()
                done[name] = h.request("POST", "/v1/leases/complete", {"leases": [
                    {"task": held["task"], "token": held["token"], "result": name}]}, conn=conn)
                done[name, "took"] = time.monotonic() - done[name, "sent"]
            finally:
                conn.close()

        unflushed = metric(h, "muster_store_unflushed_replies_total")
        gathered = metric(h, "muster_store_gathered_commits_total")
        writers = [threading.Thread(target=complete, args=("first", first))]
        writers[0].start()
        harness.wait_until(lambda: in_syscall(head_pid, number), timeout=20,
                           what="the first completion's flush to be in flight")
        [second] = lease(h, q, {"max": 1})
        self.assertNotIn("first", done, "the lease waited for the flush in flight")
        writers.append(threading.Thread(target=complete, args=("second", second)))
        writers[1].start()
        for w in writers:
            w.join(60)
            self.assertFalse(w.is_alive())
        for name in ("first", "second"):
            self.assertEqual(done[name].status, 200, done[name])
            self.assertGreaterEqual(done[name, "took"], HOLD_S,
                                    "the %s completion was answered before its flush" % name)
        self.assertEqual(metric(h, "muster_store_unflushed_replies_total"), unflushed + 1)
        self.assertEqual(metric(h, "muster_store_gathered_commits_total"), gathered + 1,
                         "the completion gathered during the flush did not wait for a poll")
        self.assertEqual(h.request("GET", "/v1/queues/" + q).json["counts"]["done"], 2)
        self.stop_head()

    def test_workers_that_lease_and_complete_lose_nothing(self):
        # Every flush on the helper thread, the next group waiting for a poll whenever
        # leases went out during a flush; eight workers lease a task on disk (answered
        # at its commit, during another worker's flush, or with no flush in flight) and
        # complete it.  Each completion waits for the flush that covers it, flushes are
        # shared, and none is lost.  Whether a given flush sees a lease go out depends
        # on the machine's pace: the gathered commit itself is the test above's.
        h = self.head
        h.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        h.env["MUSTER_GATHER_MIN_ACTIVE"] = "0"
        h.env["MUSTER_LEND_FEW_BELOW"] = "0"
        h.env["MUSTER_FLUSH_QUEUE"] = "0"
        self.start_traced("-e", "trace=fdatasync",
                          "-e", "inject=fdatasync:delay_exit=%d" % int(FLUSH_S * 1e6))
        q = "workers"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, list(range(CLIENTS * PUTS_EACH)))

        def work(conn, n, i):
            got = lease(h, q, {"max": 1}, conn=conn)
            assert len(got) == 1, got
            t0 = time.monotonic()
            return t0, h.request("POST", "/v1/leases/complete",
                                 {"leases": [{"task": got[0]["task"], "token": got[0]["token"],
                                              "result": [n, i]}]}, conn=conn)

        self.concurrent_writes(work)
        self.assertGreater(metric(h, "muster_store_unflushed_replies_total"), 0)
        self.stop_head()
        wal = [path for _, path in wal_flushes(self.trace) if path.endswith("muster.db-wal")]
        self.assertLess(len(wal), CLIENTS * PUTS_EACH, "concurrent writes did not share flushes")
        # What was acknowledged is in the store the head left.
        h.prefix = []
        for knob in ("MUSTER_GATHER_MIN_ACTIVE", "MUSTER_LEND_FEW_BELOW", "MUSTER_FLUSH_QUEUE"):
            h.env.pop(knob)
        h.start()
        self.assertEqual(h.request("GET", "/v1/queues/" + q).json["counts"]["done"],
                         CLIENTS * PUTS_EACH)

    def test_small_replies_are_written_by_the_loop(self):
        # Every flush on the helper thread, but replies under MUSTER_LEND_MIN_BYTES
        # (4096 by default) are written by the loop when it hears the flush ended.
        h = self.head
        h.env["MUSTER_FLUSH_THREAD_MIN"] = "1"
        self.start_traced("-e", "trace=fdatasync,writev")
        q = "small"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        for i in range(3):
            put(h, q, [i])
        self.stop_head()
        flushes = wal_flushes(self.trace)
        main_pid = flushes[0][0]
        helpers = {pid for pid, path in flushes if pid != main_pid and path.endswith("-wal")}
        self.assertTrue(helpers, "no flush ran on the helper thread")
        writers = reply_writers(self.trace)
        self.assertEqual(writers, {main_pid}, "a small reply was written by the helper thread")

    def test_a_few_clients_replies_are_written_by_the_helper_thread(self):
        # With two to four clients active (MUSTER_LEND_FEW_BELOW, 5 by default) every
        # group with writes is flushed on the helper thread, which also writes its
        # replies however small they are; a lone client's are flushed and written by
        # the loop.  Each reply still waits for its flush, and none is lost.
        h = self.head
        self.start_traced("-e", "trace=fdatasync,writev",
                          "-e", "inject=fdatasync:delay_exit=%d" % int(FLUSH_S * 1e6))
        q = "few"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)

        def write(conn, n, i):
            t0 = time.monotonic()
            return t0, h.request("POST", "/v1/queues/%s/tasks" % q,
                                 {"tasks": [{"payload": [n, i]}]}, conn=conn)

        self.concurrent_writes(write, clients=3)
        self.stop_head()
        flushes = wal_flushes(self.trace)
        main_pid = flushes[0][0]  # the queue's creation, alone: flushed on the loop
        writers = reply_writers(self.trace)
        self.assertIn(main_pid, writers)
        self.assertTrue(writers - {main_pid}, "no reply was written by the helper thread")
        h.prefix = []
        h.start()
        self.assertEqual(h.request("GET", "/v1/queues/" + q).json["counts"]["queued"],
                         3 * PUTS_EACH)

    def test_a_lease_of_tasks_on_disk_needs_no_flush(self):
        h = self.head
        h.start()
        q = "lazy"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["a", "b", "c"])
        # A start's tokens begin above the clock (store.c, store_token_clock), so its
        # first commit (the queue's creation here) raised the token floor on disk, and
        # a lease of tasks on disk is answered at its commit, without a flush.
        f0 = flushes(h)
        unflushed = metric(h, "muster_store_unflushed_replies_total")
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)
        leases = lease(h, q, {"max": 2})
        self.assertEqual(len(leases), 2)
        self.assertEqual(flushes(h), f0, "a lease of tasks on disk waited for a flush")
        self.assertEqual(metric(h, "muster_store_unflushed_replies_total"), unflushed + 2)
        # Whatever could see the lease waits for it to be on disk: a read flushes now.
        self.assertEqual(h.request("GET", "/v1/queues/" + q).json["counts"]["leased"], 3)
        self.assertEqual(flushes(h), f0 + 1, "a read saw a lease that was not on disk")
        # A lease that hands out tokens past the floor on disk raises it (4096 at a
        # time), and that write is flushed like any other.
        many = "many"
        self.assertEqual(h.request("PUT", "/v1/queues/" + many, {}).status, 201)
        for i in range(0, 5000, 1000):
            put(h, many, ["m%d" % n for n in range(i, i + 1000)])
        f1 = flushes(h)
        for _ in range(5):
            self.assertEqual(len(lease(h, many, {"max": 1000})), 1000)
        self.assertEqual(flushes(h), f1 + 1, "the lease that raised the token floor was not "
                         "flushed")
        # The lease was committed before its reply: it survives kill -9 of the head,
        # and its holder completes with the token it was given.
        h.kill()
        h.start()
        for l in leases:
            task = h.request("GET", "/v1/tasks/%d" % l["task"]).json
            self.assertEqual(task["state"], "leased", task)
        r = h.request("POST", "/v1/leases/complete",
                      {"leases": [{"task": l["task"], "token": l["token"], "result": 1}
                                  for l in leases]})
        self.assertEqual(r.status, 200, r)

    def test_a_lease_of_a_task_not_on_disk_waits_for_its_flush(self):
        # Every flush on the helper thread, so that the loop could send replies
        # while the put's flush is in flight: none of the leases may go.
        h = self.head
        os.environ["MUSTER_FLUSH_THREAD_MIN"] = "1"
        try:
            self.start_traced("-e", "trace=fdatasync",
                              "-e", "inject=fdatasync:delay_exit=%d" % int(FLUSH_S * 1e6))
        finally:
            del os.environ["MUSTER_FLUSH_THREAD_MIN"]
        q = "woken"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["first"])
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)  # raises the token floor
        got = {}

        def poll(n):
            conn = h.connection()
            try:
                got[n] = lease(h, q, {"max": 1, "wait_ms": 60000}, conn=conn)
            finally:
                got[n, "at"] = time.monotonic()
                conn.close()

        pollers = [threading.Thread(target=poll, args=(n,)) for n in range(4)]
        for p in pollers:
            p.start()
        harness.wait_until(lambda: metric(h, "muster_lease_waiters") == 4, timeout=20,
                           what="the long-poll leases to be parked")
        # The put wakes the waiters in the put's own group: its tasks are not on
        # disk until that group's flush ends, and no reply may leave before.
        sent = time.monotonic()
        tids = put(h, q, ["w0", "w1", "w2", "w3"])
        self.assertGreaterEqual(time.monotonic() - sent, FLUSH_S)
        for p in pollers:
            p.join(60)
            self.assertFalse(p.is_alive())
        self.assertEqual(sorted(got[n][0]["task"] for n in range(4)), sorted(tids))
        for n in range(4):
            self.assertGreaterEqual(got[n, "at"] - sent, FLUSH_S,
                                    "a task was leased before its put was on disk")
        self.stop_head()

    def test_a_lease_during_a_flush_is_answered_before_it_ends(self):
        # Every flush on the helper thread, held HOLD_S: a lease of tasks on disk
        # that arrives while a put's flush is in flight commits at once and is
        # answered then, not when the flush ends; a put that arrives meanwhile is
        # committed too (with the lease or at the flush's end) but waits for a
        # flush of its own.
        h = self.head
        number = self.start_holding_flushes()
        q = "midflush"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["a", "b", "c"])
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)  # raises the token floor
        head_pid = self.traced_heads()[0]
        done = {}

        def write(name):
            conn = h.connection()
            try:
                done[name, "sent"] = time.monotonic()
                done[name] = put(h, q, [name], conn=conn)
                done[name, "took"] = time.monotonic() - done[name, "sent"]
            finally:
                conn.close()

        first = threading.Thread(target=write, args=("first",))
        first.start()
        # The put's flush is in flight when a thread of the head is in fdatasync
        # (held there by strace); every request before it was answered already.
        harness.wait_until(lambda: in_syscall(head_pid, number), timeout=20,
                           what="the put's flush to be in flight")
        second = threading.Thread(target=write, args=("second",))
        second.start()
        harness.wait_until(lambda: ("second", "sent") in done, what="the second put to be sent")
        # Once the head has handled the second put, the transaction it opened stays
        # open for the flush's end, and every reply waits for a commit: a health
        # check is then held back.  Waiting for that (or, on a loaded machine, for a
        # health check that is merely slow) makes the lease come in a later turn
        # than the put, which must wake the commit itself.
        harness.wait_until(lambda: health_held_back(h), timeout=20,
                           what="the second put to open the transaction")
        leases = lease(h, q, {"max": 1})
        answered = time.monotonic()
        self.assertEqual([l["payload"] for l in leases], ["b"])
        # The flush in flight began after the first put was sent and lasts HOLD_S.
        self.assertLess(answered - done["first", "sent"], HOLD_S,
                        "the lease waited for the flush in flight")
        first.join(60)
        second.join(60)
        self.assertGreaterEqual(done["first", "took"], HOLD_S)
        self.assertGreaterEqual(done["second", "took"], HOLD_S,
                                "a put that came during a flush was answered by it")
        counts = h.request("GET", "/v1/queues/" + q).json["counts"]
        self.assertEqual((counts["queued"], counts["leased"]), (3, 2))
        self.stop_head()

    def test_a_lease_that_brings_an_update_waits_for_its_flush(self):
        # A lease of tasks on disk that also brings a broadcast update (updates_after)
        # hands out data: if it left at its commit while the update's flush is in
        # flight, a power loss would forget an update a worker has applied, and the
        # head would number the next one the same (the worker, past that number,
        # would never get it).  So it waits for the flush, as the post's reply does.
        h = self.head
        number = self.start_holding_flushes()
        q = "told"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["a", "b"])
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)  # raises the token floor
        head_pid = self.traced_heads()[0]
        done = {}

        def post():
            conn = h.connection()
            try:
                done["sent"] = time.monotonic()
                done["post"] = h.request("POST", "/v1/queues/%s/updates" % q,
                                         {"data": {"level": 2}}, conn=conn)
            finally:
                conn.close()

        poster = threading.Thread(target=post)
        poster.start()
        harness.wait_until(lambda: in_syscall(head_pid, number), timeout=20,
                           what="the update's flush to be in flight")
        r = h.request("POST", "/v1/queues/%s/lease" % q, {"max": 1, "updates_after": 0})
        answered = time.monotonic()
        poster.join(60)
        self.assertEqual(done["post"].status, 201, done["post"])
        self.assertEqual(r.status, 200, r)
        self.assertEqual([l["payload"] for l in r.json["leases"]], ["b"])
        self.assertEqual([u["seq"] for u in r.json["updates"]], [1])
        # The flush in flight began after the post was sent and lasts HOLD_S.
        self.assertGreaterEqual(answered - done["sent"], HOLD_S,
                                "a lease brought update 1 before its post was on disk")
        self.stop_head()

    def test_a_write_during_a_flush_is_flushed_right_behind_it(self):
        # Every flush on the helper thread, each held HOLD_S, and every write that
        # comes during one queued behind it (MUSTER_FLUSH_QUEUE=2, as a few clients'
        # are): a put that comes while a completion's flush is in flight commits at
        # once (the WAL grows then, not when that flush ends); its reply waits for
        # its own flush, and so does a lease of its task, asked for once the put is
        # committed (the flush in flight covers no new task: only the queued one
        # holds the put back).  After a restart everything is there.
        h = self.head
        number = self.start_holding_flushes(MUSTER_FLUSH_QUEUE="2")
        q = "behind"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["floor", "done"])
        self.assertEqual(len(lease(h, q, {"max": 1})), 1)  # raises the token floor
        held = lease(h, q, {"max": 1})[0]
        head_pid = self.traced_heads()[0]
        wal = os.path.join(h.data_dir, "muster.db-wal")
        done = {}

        def send(name, path, body):
            conn = h.connection()
            try:
                done[name, "sent"] = time.monotonic()
                done[name] = h.request("POST", path, body, conn=conn)
                done[name, "took"] = time.monotonic() - done[name, "sent"]
            finally:
                conn.close()

        complete = threading.Thread(target=send, args=(
            "complete", "/v1/leases/complete",
            {"leases": [{"task": held["task"], "token": held["token"], "result": 1}]}))
        complete.start()
        harness.wait_until(lambda: in_syscall(head_pid, number), timeout=20,
                           what="the completion's flush to be in flight")
        size = os.path.getsize(wal)
        second = threading.Thread(target=send, args=(
            "put", "/v1/queues/%s/tasks" % q, {"tasks": [{"payload": "second"}]}))
        second.start()
        # Committed at once: its frames reach the WAL during the flush in flight.
        harness.wait_until(lambda: os.path.getsize(wal) > size, timeout=20,
                           what="the put to be committed")
        sent = time.monotonic()
        self.assertLess(sent - done["put", "sent"], HOLD_S / 2,
                        "the put was committed only when the flush in flight ended")
        leases = lease(h, q, {"max": 1})
        took = time.monotonic() - sent
        self.assertEqual([l["payload"] for l in leases], ["second"])
        self.assertGreaterEqual(took, HOLD_S * 0.9,
                                "a task was leased before its put's queued flush ended")
        complete.join(60)
        second.join(60)
        self.assertEqual((done["complete"].status, done["put"].status), (200, 201))
        self.assertGreaterEqual(done["complete", "took"], HOLD_S)
        self.assertGreaterEqual(done["put", "took"], HOLD_S,
                                "a put that came during a flush was answered by it")
        self.stop_head()
        h.prefix = []
        h.start()
        counts = h.request("GET", "/v1/queues/" + q).json["counts"]
        self.assertEqual((counts["queued"], counts["leased"], counts["done"]), (0, 2, 1))

    def test_a_bad_flush_knob_is_said_at_start(self):
        # The flush policy's environment knobs (and the WAL writes') are read when the
        # head starts: a bad value is said in the log then, and the default kept.
        h = self.head
        h.env["MUSTER_FLUSH_QUEUE"] = "7"
        h.env["MUSTER_LEND_FEW_BELOW"] = "few"
        h.env["MUSTER_WAL_COALESCE"] = "off"
        h.start()
        log = h.log()
        self.assertIn("MUSTER_WAL_COALESCE=off is not 0 to 1; the default 1 is kept", log)
        self.assertIn("MUSTER_FLUSH_QUEUE=7 is not 0 to 2; the default 1 is kept", log)
        self.assertIn("MUSTER_LEND_FEW_BELOW=few is not 0 to 1000000; the default 5 is kept",
                      log)
        q = "knobs"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        self.assertEqual(len(put(h, q, ["a"])), 1)

    def test_sync_leases_flushes_every_lease(self):
        self.head.cleanup()
        self.head = h = harness.Head(["--sync", "full", "--sync-leases"])
        h.start()
        q = "strict"
        self.assertEqual(h.request("PUT", "/v1/queues/" + q, {}).status, 201)
        put(h, q, ["a", "b", "c"])
        for _ in range(3):
            f0 = flushes(h)
            self.assertEqual(len(lease(h, q, {"max": 1})), 1)
            self.assertEqual(flushes(h), f0 + 1, "--sync-leases: a lease was not flushed")
        self.assertEqual(metric(h, "muster_store_unflushed_replies_total"), 0)


if __name__ == "__main__":
    unittest.main()
