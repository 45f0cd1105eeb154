"""Online backups (POST /v1/backup, `muster backup`) and restoring one by starting a head
on it (docs/operations.md, "Backup and restore").

A backup taken while clients keep putting, leasing and completing tasks, the head then
killed -9 and a new head started on the backup: every task whose put was acknowledged
before the backup request was sent is there, in the state it was acknowledged to or a
later one; the queue counts agree with the task rows and with what the backup said it
holds; shared data levels read back with their bytes, the iteration's checkpoint and
the session are as they were, a lease held at backup time expires and requeues, and
the original data dir still serves after a restart.  The copy's pages are few per step
(MUSTER_BACKUP_STEP_PAGES) so that it spans many of the writers' commits.

With every fsync held by strace: the answer waits for the backup's files to be synced,
a second backup meanwhile is refused 409, and a blob level deleted then (its file swept
in the data dir) is still in the backup.  A backups dir on another file system (a tmpfs,
when one can be mounted) gets copies of the blob files, and one too small is refused
with nothing left behind.  Bad input: names, a name that exists, no token, the read-only
token, a data dir where no backups dir can be made.
"""
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

WRITERS = 4
PREFILL = 3000
STEP_PAGES = "1"
RANK = {"queued": 0, "leased": 1, "done": 2}
READ_TOKEN = "read-only-token-42"
HOLD_S = 0.5
# fsync's system call number, as /proc/PID/task/TID/syscall shows a thread in it.
FSYNC = {"x86_64": 74, "aarch64": 82}


def put(head, queue, payloads, conn=None):
    r = head.request("POST", "/v1/queues/%s/tasks" % queue,
                     {"tasks": [{"payload": p} for p in payloads]}, conn=conn)
    assert r.status == 201, r
    return [t["id"] for t in r.json["tasks"]]


def all_tasks(head, queue):
    """Every task of `queue`: id -> state."""
    states, after = {}, 0
    while True:
        r = head.request("GET", "/v1/queues/%s/tasks?after=%d&limit=1000&brief=true"
                         % (queue, after))
        assert r.status == 200, r
        for t in r.json["tasks"]:
            states[t["id"]] = t["state"]
        if len(r.json["tasks"]) < 1000:
            return states
        after = r.json["tasks"][-1]["id"]


class Writers:
    """WRITERS threads, each on its own connection, putting a task, leasing one and
    completing it, over and over; every acknowledgement is recorded with the time its
    reply arrived: (time, task id, state it acknowledged)."""

    def __init__(self, head, queue):
        self.head, self.queue = head, queue
        self.acks = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors = []
        self.threads = [threading.Thread(target=self.run) for _ in range(WRITERS)]
        for t in self.threads:
            t.start()

    def ack(self, task, state):
        with self.lock:
            self.acks.append((time.monotonic(), task, state))

    def cycle(self, conn, n):
        (task,) = put(self.head, self.queue, ["w%d" % n], conn=conn)
        self.ack(task, "queued")
        r = self.head.request("POST", "/v1/queues/%s/lease" % self.queue, {"max": 1}, conn=conn)
        assert r.status == 200, r
        for lease in r.json["leases"]:
            self.ack(lease["task"], "leased")
            r = self.head.request("POST", "/v1/leases/complete", {"leases": [
                {"task": lease["task"], "token": lease["token"], "result": "ok"}]}, conn=conn)
            assert r.status == 200, r
            self.ack(lease["task"], "done")

    def run(self):
        conn = self.head.connection()
        n = 0
        try:
            while not self.stop.is_set():
                self.cycle(conn, n)
                n += 1
        except Exception as e:  # noqa: BLE001 - reported by join()
            self.errors.append(e)
        finally:
            conn.close()

    def count(self):
        with self.lock:
            return len(self.acks)

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors

    def acknowledged_before(self, moment):
        """task id -> the furthest state acknowledged before `moment`."""
        best = {}
        with self.lock:
            for at, task, state in self.acks:
                if at < moment and RANK[state] > RANK.get(best.get(task), -1):
                    best[task] = state
        return best


class BackupCase(unittest.TestCase):
    def setUp(self):
        self.heads = []

    def tearDown(self):
        for h in reversed(self.heads):
            h.cleanup()

    def start(self, *args, **kw):
        h = harness.Head(list(args), **kw)
        self.heads.append(h)
        return h.start()

    def backup(self, head, name=None, token="default"):
        return head.request("POST", "/v1/backup", {} if name is None else {"name": name},
                            token=token)


class RestoreTest(BackupCase):
    def prepare(self, h):
        """Queues, tasks, shared data, a session and an iteration to back up; what the
        test compares after the restore."""
        self.assertEqual(h.request("PUT", "/v1/queues/work", {"lease_ms": 120000}).status, 201)
        self.assertEqual(h.request("PUT", "/v1/queues/short", {"lease_ms": 1000}).status, 201)
        for i in range(0, PREFILL, 1000):
            put(h, "work", ["pre%d" % n for n in range(i, i + 1000)])
        levels = [b"level one " * 1000, b"level two " * 2000]
        for level, blob in enumerate(levels, 1):
            r = h.request("PUT", "/v1/shared/global/params?level=%d" % level, raw=blob,
                          content_type="application/octet-stream")
            self.assertEqual(r.status, 201, r)
        (short,) = put(h, "short", ["held"])
        lease = h.request("POST", "/v1/queues/short/lease", {"max": 1}).json["leases"][0]
        session = h.request("POST", "/v1/sessions", {"queue": "work"}).json
        r = h.request("POST", "/v1/sessions/%s/tasks" % session["id"],
                      {"tasks": [{"payload": i} for i in range(5)]})
        self.assertEqual(r.status, 201, r)
        r = h.request("POST", "/v1/iterations", {"name": "it", "dataset": {"num_samples": 1000},
                                                 "world_size": 2, "block_size": 10})
        self.assertEqual(r.status, 201, r)
        blocks = h.request("POST", "/v1/iterations/it/next", {"rank": 0, "max": 3}).json["blocks"]
        r = h.request("POST", "/v1/iterations/it/ack", {"rank": 0, "blocks": [
            {"block": b["block"], "token": b["token"]} for b in blocks[:2]]})
        self.assertEqual(r.status, 200, r)
        checkpoint = h.request("GET", "/v1/iterations/it/checkpoint").json
        return {"levels": levels, "short": (short, lease["token"]), "session": session["id"],
                "checkpoint": checkpoint}

    def check_restored(self, b, before, acked, reply):
        """The head `b`, started on the backup, holds what the backup says it holds."""
        states = all_tasks(b, "work")
        lost = [t for t in acked if t not in states]
        self.assertEqual(lost, [], "tasks acknowledged before the backup are missing")
        behind = {t: (s, states[t]) for t, s in acked.items() if RANK[states[t]] < RANK[s]}
        self.assertEqual(behind, {}, "tasks restored in a state before the acknowledged one")
        counts = b.request("GET", "/v1/queues/work").json["counts"]
        self.assertEqual(counts, dict(collections.Counter(states.values()),
                                      **{s: 0 for s in counts if s not in states.values()}))
        holds = reply["holds"]
        total = sum(counts.values()) + 1  # and the short queue's one task
        self.assertEqual(holds["tasks"]["total"], total, holds)
        self.assertEqual(holds["tasks"]["done"], counts["done"], holds)
        self.assertEqual((holds["queues"], holds["sessions"], holds["iterations"],
                          holds["shared_levels"]), (2, 1, 1, 2), holds)
        for level, blob in enumerate(before["levels"], 1):
            r = b.request("GET", "/v1/shared/global/params?level=%d" % level)
            self.assertEqual((r.status, r.raw), (200, blob), "level %d" % level)
        r = b.request("GET", "/v1/iterations/it/checkpoint")
        self.assertEqual(r.json, before["checkpoint"])
        r = b.request("GET", "/v1/sessions/" + before["session"])
        self.assertEqual((r.status, r.json["state"], r.json["counts"]["total"]), (200, "open", 5))

    def check_lease_requeues(self, b, before):
        """The lease held at backup time is held after the restore, then expires."""
        task, token = before["short"]
        r = b.request("GET", "/v1/tasks/%d" % task)
        self.assertIn(r.json["state"], ("leased", "queued"), r)
        harness.wait_until(lambda: b.request("GET", "/v1/tasks/%d" % task).json["state"]
                           == "queued", timeout=30, what="the restored lease to expire")
        r = b.request("POST", "/v1/leases/complete",
                      {"leases": [{"task": task, "token": token}]})
        self.assertEqual(r.error_code, "lease_lost", r)

    def test_backup_under_load_then_restore(self):
        h = self.start(env={"MUSTER_BACKUP_STEP_PAGES": STEP_PAGES})
        before = self.prepare(h)
        writers = Writers(h, "work")
        harness.wait_until(lambda: writers.count() > 200, timeout=60, what="writes")
        sent, before_count = time.monotonic(), writers.count()
        reply = self.backup(h, "live")
        answered = writers.count()
        harness.wait_until(lambda: writers.count() > answered + 100, timeout=60,
                           what="writes after the backup")
        writers.join()
        self.assertEqual(reply.status, 201, reply)
        self.assertGreater(answered, before_count, "no write was acknowledged during the copy")
        r = reply.json
        self.assertEqual(r["name"], "live")
        self.assertEqual(r["path"], os.path.realpath(os.path.join(h.data_dir, "backups", "live")))
        self.assertEqual(sorted(os.listdir(r["path"])), ["muster.db", "shared", "token"])
        self.assertEqual(r["shared_files"], {"linked": 2, "copied": 0})
        self.assertEqual(r["bytes"], r["database_bytes"] + r["shared_bytes"])
        self.assertEqual(r["shared_bytes"], sum(map(len, before["levels"])))
        self.assertIn("state of " + r["time"], h.log())
        for name in os.listdir(os.path.join(r["path"], "shared")):  # links, not copies
            self.assertEqual(os.stat(os.path.join(r["path"], "shared", name)).st_ino,
                             os.stat(os.path.join(h.data_dir, "shared", name)).st_ino)
        acked = writers.acknowledged_before(sent)
        self.assertGreater(len(acked), 100)
        h.kill()

        b = self.start(data_dir=r["path"], token=None)  # the token comes from the backup
        b.token = h.token
        self.check_restored(b, before, acked, r)
        self.check_lease_requeues(b, before)
        self.assertEqual(b.stop(), 0, b.log())

        h.start()  # the original data dir, after its kill -9
        ids = put(h, "work", ["after"])
        self.assertEqual(h.request("GET", "/v1/tasks/%d" % ids[0]).json["state"], "queued")
        self.assertEqual(h.request("GET", "/v1/shared/global/params").status, 200)
        self.assertEqual(h.stop(), 0, h.log())

    def test_cli(self):
        h = self.start()
        env = harness.cli_env(h)
        run = lambda *a: subprocess.run([harness.MUSTER_BIN, "backup"] + list(a), env=env,
                                        capture_output=True, text=True, timeout=120)
        p = run("--name", "by-cli")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, os.path.realpath(
            os.path.join(h.data_dir, "backups", "by-cli")) + "\n")
        p = run("--name", "by-cli")
        self.assertEqual(p.returncode, 1, p)
        self.assertIn("muster: invalid_state: backup 'by-cli' exists already", p.stderr)
        p = run("--name", "bad/name")
        self.assertEqual(p.returncode, 1, p)
        self.assertIn("name_invalid", p.stderr)
        p = run("--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn('"holds"', p.stdout)


class TokensAfterRestoreTest(BackupCase):
    def lease_all(self, h, queue, count):
        r = h.request("POST", "/v1/queues/%s/lease" % queue, {"max": count})
        self.assertEqual(r.status, 200, r)
        return [(x["task"], x["token"]) for x in r.json["leases"]]

    def test_a_restored_head_never_hands_out_a_token_again(self):
        """The tasks are in the backup; the original head goes on leasing them after it
        (more than the 4096 tokens its floor reserves at a time), then dies holding a
        lease of each; a head started on the backup leases the same tasks again, and its
        tokens must all be above the original's, or a worker of the original holding
        (task, token) could complete the new lease of that task."""
        h = self.start()
        self.assertEqual(h.request("PUT", "/v1/queues/q", {"lease_ms": 600000}).status, 201)
        put(h, "q", ["p%d" % i for i in range(1000)])
        self.assertEqual(self.backup(h, "early").status, 201)
        for _ in range(5):  # 5000 tokens, each lease given back
            held = self.lease_all(h, "q", 1000)
            r = h.request("POST", "/v1/leases/release",
                          {"leases": [{"task": t, "token": k} for t, k in held]})
            self.assertEqual(r.status, 200, r)
        stale = self.lease_all(h, "q", 1000)  # held by the original's workers at its death
        highest = max(k for _, k in stale)
        h.kill()

        b = self.start(data_dir=os.path.join(h.data_dir, "backups", "early"), token=None)
        b.token = h.token
        fresh = self.lease_all(b, "q", 1000)
        self.assertEqual(sorted(t for t, _ in fresh), sorted(t for t, _ in stale))
        self.assertGreater(min(k for _, k in fresh), highest,
                           "a token the original handed out is handed out again")
        r = b.request("POST", "/v1/leases/complete",
                      {"leases": [{"task": t, "token": k} for t, k in stale[:50]]})
        self.assertEqual(r.error_code, "lease_lost", r)
        self.assertEqual(b.request("GET", "/v1/queues/q").json["counts"]["leased"], 1000)


class BadInputTest(BackupCase):
    def test_refusals(self):
        h = self.start("--dashboard-token", READ_TOKEN)
        for body, code, word in (
                ({"name": "a/b"}, "name_invalid", "backup name 'a/b' is invalid"),
                ({"name": ".."}, "name_invalid", "not starting with '.'"),
                ({"name": ".hidden"}, "name_invalid", "not starting with '.'"),
                ({"name": ""}, "name_invalid", "invalid"),
                ({"name": "x" * 129}, "name_invalid", "invalid"),
                ({"name": 7}, "invalid_argument", "name"),
                ({"nmae": "x"}, "invalid_argument", "nmae")):
            r = h.request("POST", "/v1/backup", body)
            self.assertEqual((r.status, r.error_code), (400, code), (body, r))
            self.assertIn(word, r.json["error"]["message"])
        self.assertEqual(self.backup(h, token=None).status, 401)
        r = self.backup(h, "ro", token=READ_TOKEN)
        self.assertEqual((r.status, r.error_code), (403, "forbidden"), r)
        self.assertFalse(os.path.exists(os.path.join(h.data_dir, "backups")))
        self.assertEqual(self.backup(h, "dup").status, 201)
        r = self.backup(h, "dup")
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertIn("backup 'dup' exists already", r.json["error"]["message"])
        # Without a name: the UTC time.
        r = self.backup(h)
        self.assertEqual(r.status, 201, r)
        self.assertRegex(r.json["name"], r"^\d{8}T\d{6}Z$")
        self.assertEqual(h.stop(), 0, h.log())  # and nothing leaked (the ASan build)

    def test_no_room_for_a_backups_dir(self):
        h = self.start()
        with open(os.path.join(h.data_dir, "backups"), "w") as f:
            f.write("in the way\n")
        r = self.backup(h, "x")
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertIn("cannot create %s/backups/.x.partial: Not a directory" % h.data_dir,
                      r.json["error"]["message"])
        self.assertEqual(h.request("PUT", "/v1/queues/still", {}).status, 201)
        self.assertEqual(h.stop(), 0, h.log())


class HeldFsyncTest(BackupCase):
    """The head under strace, every fsync held HOLD_S (the backup's thread alone
    fsyncs while the test runs): the backup's answer waits for its files' fsyncs, and
    the backup runs long enough to be seen running."""

    def setUp(self):
        super().setUp()
        self.strace = shutil.which("strace")
        self.number = FSYNC.get(os.uname().machine)
        if self.strace is None or self.number is None:
            self.skipTest("needs strace and fsync's system call number on this machine")
        self.asan_options = os.environ.get("ASAN_OPTIONS")  # no LeakSanitizer under a tracer
        os.environ["ASAN_OPTIONS"] = (self.asan_options + ":" if self.asan_options else "") + \
            "detect_leaks=0"

    def tearDown(self):
        for h in self.heads:  # under strace the head is strace's child: kill it too
            if h.prefix and h.proc and h.proc.poll() is None:
                for pid in self.children(h):
                    os.kill(pid, signal.SIGKILL)
        super().tearDown()
        if self.asan_options is None:
            os.environ.pop("ASAN_OPTIONS", None)
        else:
            os.environ["ASAN_OPTIONS"] = self.asan_options

    @staticmethod
    def children(h):
        with open("/proc/%d/task/%d/children" % (h.proc.pid, h.proc.pid)) as f:
            return [int(pid) for pid in f.read().split()]

    def in_fsync(self, pid):
        """True when a thread of `pid` other than the main one is in fsync."""
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/syscall" % (pid, tid)) as f:
                    if int(tid) != pid and f.read().split(" ", 1)[0] == str(self.number):
                        return True
            except OSError:
                pass
        return False

    def start_held(self, *args):
        """A head whose fsyncs are held; (head, its pid, the trace's path)."""
        h = harness.Head(list(args))
        trace = os.path.join(h.data_dir, "strace.txt")
        h.prefix = [self.strace, "-f", "-qq", "-y", "-o", trace, "-e", "trace=fsync",
                    "-e", "inject=fsync:delay_exit=%d" % int(HOLD_S * 1e6)]
        self.heads.append(h)
        h.start(timeout=60)
        (pid,) = self.children(h)
        return h, pid, trace

    def held_backup(self, h, pid, name, blob):
        """Uploads `blob`, starts backup `name` on a thread of its own and returns once
        the backup's thread is held in an fsync: (thread, its result, the blob's file)."""
        r = h.request("PUT", "/v1/shared/global/gone", raw=blob,
                      content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        (blob_file,) = [n for n in os.listdir(os.path.join(h.data_dir, "shared"))
                        if n.endswith(".blob")]
        result = {}

        def take():  # on a connection of its own: the test sends more meanwhile
            conn = h.connection(timeout=120)
            t0 = time.monotonic()
            result["reply"] = h.request("POST", "/v1/backup", {"name": name}, conn=conn)
            result["took"] = time.monotonic() - t0
            conn.close()
        t = threading.Thread(target=take)
        t.start()
        harness.wait_until(lambda: self.in_fsync(pid), timeout=30, what="the backup's fsync")
        return t, result, blob_file

    def test_a_stop_while_the_files_are_synced(self):
        h, pid, _ = self.start_held()
        t, result, _ = self.held_backup(h, pid, "stopped", b"x" * 5000)
        os.kill(pid, signal.SIGTERM)
        t.join(120)
        self.assertEqual(h.proc.wait(60), 0, h.log())
        # Made whole before the stop, or given up and removed: never half a backup.
        reply = result["reply"]
        path = os.path.join(h.data_dir, "backups", "stopped")
        if reply.status == 201:
            self.assertEqual(sorted(os.listdir(path)), ["muster.db", "shared", "token"])
        else:
            self.assertEqual((reply.status, reply.error_code), (503, "unavailable"), reply)
            self.assertIn("the head is shutting down", reply.json["error"]["message"])
            self.assertFalse(os.path.exists(path))

    def test_answer_waits_for_the_fsyncs_and_one_runs_at_a_time(self):
        h, pid, trace = self.start_held("--sweep-ms", "20")
        blob = b"kept by the backup " * 100
        t, first, blob_file = self.held_backup(h, pid, "held", blob)
        # Its copy is complete (its thread syncs it): a second one is refused ...
        r = self.backup(h, "second")
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertIn("a backup is already running: 'held'", r.json["error"]["message"])
        self.assertFalse(os.path.exists(os.path.join(h.data_dir, "backups", "second")))
        # ... and a level deleted now stays in the data dir until the backup has it.
        self.assertEqual(h.request("DELETE", "/v1/shared/global/gone").status, 200)
        t.join(120)
        reply = first["reply"]
        self.assertEqual(reply.status, 201, reply)
        self.assertGreaterEqual(first["took"], HOLD_S, "answered before its files were synced")
        path = reply.json["path"]
        with open(trace, errors="replace") as f:
            synced = f.read()
        # Made (and synced) under .held.partial, then given its name, and the name synced.
        made = os.path.join(os.path.dirname(path), ".held.partial")
        for name in ("muster.db", "token", "shared", "shared/" + blob_file, ""):
            self.assertRegex(synced, r"fsync\(\d+<%s>\)" % re.escape(
                os.path.join(made, name).rstrip("/")), "no fsync of " + (name or "the backup dir"))
        self.assertRegex(synced, r"fsync\(\d+<%s>\)" % re.escape(os.path.dirname(path)),
                         "no fsync of the backups dir")
        with open(os.path.join(path, "shared", blob_file), "rb") as f:
            self.assertEqual(f.read(), blob)
        harness.wait_until(lambda: not os.path.exists(
            os.path.join(h.data_dir, "shared", blob_file)), timeout=30,
            what="the sweep to remove the deleted level's file")
        self.assertEqual(self.backup(h, "after").status, 201)


def mount_tmpfs(path, size):
    """Mounts a tmpfs of `size` at `path`; False when this machine does not let us."""
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                          capture_output=True).returncode == 0


class OtherFileSystemTest(BackupCase):
    """DATA_DIR/backups is a tmpfs: another file system, as a backup disk would be."""

    def mount(self, h, size):
        mnt = os.path.join(h.data_dir, "backups")
        os.mkdir(mnt)
        if not mount_tmpfs(mnt, size):
            self.skipTest("cannot mount a tmpfs here (needs root)")

        def unmount():  # after tearDown: the heads are gone, their dirs partly removed
            subprocess.run(["umount", mnt], check=False)
            shutil.rmtree(h.data_dir, ignore_errors=True)
        self.addCleanup(unmount)
        return mnt

    def test_blob_files_are_copied(self):
        h = self.start()
        self.mount(h, "64m")
        blob = os.urandom(300000)
        r = h.request("PUT", "/v1/shared/global/w", raw=blob,
                      content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        r = self.backup(h, "disk2")
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["shared_files"], {"linked": 0, "copied": 1})
        b = self.start(data_dir=r.json["path"])
        r = b.request("GET", "/v1/shared/global/w")
        self.assertEqual((r.status, r.raw), (200, blob))

    def test_a_full_disk_leaves_nothing(self):
        h = self.start()
        mnt = self.mount(h, "256k")
        self.assertEqual(h.request("PUT", "/v1/queues/q", {}).status, 201)
        for i in range(4):
            put(h, "q", ["x" * 1000] * 500)
        r = self.backup(h, "big")
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertIn("backup 'big' failed and was removed: copying the database into "
                      "%s/.big.partial/muster.db: the disk holding it is full" % mnt,
                      r.json["error"]["message"])
        self.assertEqual(os.listdir(mnt), [])
        self.assertEqual(h.request("GET", "/v1/queues/q").json["counts"]["queued"], 2000)
        put(h, "q", ["after"])
        self.assertEqual(h.stop(), 0, h.log())


if __name__ == "__main__":
    unittest.main()
