#!/usr/bin/python3
"""Full disks.  A head whose disk fills up: writes are refused saying the disk is
full, nothing acknowledged is lost, and the head goes on by itself once there is room.
A node agent whose cache dir has no room for a level: the reader still gets its bytes
(from the head, uncached), and cached levels nobody reads make room for new ones.

The data dir or cache dir is on a small tmpfs the test mounts (and unmounts): needs
root (CAP_SYS_ADMIN) for mount; without it the test says so and skips.
"""
import errno
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import types
import unittest

import harness
from harness import Head
from node_harness import Agent

PAYLOAD = "x" * 2000
BATCH = 50
OCTET = "application/octet-stream"


def log(message):
    print(message, file=sys.stderr, flush=True)


def try_mount(path, size):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                          stderr=subprocess.PIPE, text=True)


def skip_unless_mount():
    """Exits 0 with a clear message when a tmpfs cannot be mounted here."""
    if os.geteuid() != 0:
        log("SKIP: test_disk_full needs root (CAP_SYS_ADMIN) to mount a small tmpfs")
        sys.exit(0)
    probe = tempfile.mkdtemp(prefix="muster-test-mount-")
    proc = try_mount(probe, "1m")
    if proc.returncode == 0:
        subprocess.run(["umount", probe], check=True)
    os.rmdir(probe)
    if proc.returncode != 0:
        log("SKIP: cannot mount a tmpfs here: " + proc.stderr.strip())
        sys.exit(0)


class DiskFullTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-full-")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        proc = try_mount(self.mnt, "4m")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.head = Head(data_dir=os.path.join(self.mnt, "data"))
        os.mkdir(self.head.data_dir)
        self.head.log_path = os.path.join(self.dir, "head.log")  # off the full disk
        self.head.start()

    def tearDown(self):
        self.head.stop()
        subprocess.run(["umount", self.mnt], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def put(self):
        tasks = [{"payload": PAYLOAD} for _ in range(BATCH)]
        return self.head.request("POST", "/v1/queues/q/tasks", {"tasks": tasks})

    def queued(self):
        r = self.head.request("GET", "/v1/queues/q")
        self.assertEqual(r.status, 200, r)
        return r.json["counts"]["queued"]

    def metric(self, name):
        r = self.head.request("GET", "/metrics")
        self.assertEqual(r.status, 200, r)
        for line in r.raw.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        self.fail("no metric %s in /metrics" % name)

    def test_full_disk_refuses_writes_and_loses_nothing(self):
        self.assertEqual(self.head.request("PUT", "/v1/queues/q", {}).status, 201)
        acknowledged = 0
        for _ in range(200):  # 4 MiB hold about 2 000 tasks of 2 KB: full long before 10 000
            r = self.put()
            if r.status != 201:
                break
            acknowledged += BATCH
        else:
            self.fail("4 MiB never filled up")
        self.assertGreater(acknowledged, 0)
        self.assertEqual(r.status, 500, r)
        self.assertEqual(r.error_code, "store_error", r)
        message = r.json["error"]["message"]
        self.assertIn("is full: nothing of this request was applied; free space there and retry",
                      message)
        self.assertIn(os.path.join(self.head.data_dir, "muster.db"), message)
        self.assertGreaterEqual(self.metric("muster_store_disk_full_total"), 1)
        self.assertIn("is full", self.head.log())

        # Reads go on, and the refused batch left nothing behind.
        self.assertEqual(self.queued(), acknowledged)

        # Reads alone do not count as room again.
        self.assertNotIn("has room again", self.head.log())
        # Nor does a small write that fits into the space the log already has, on a disk
        # still full: said as room, the next batch's refusal followed it at once.
        for _ in range(3):
            r = self.head.request("PUT", "/v1/queues/q", {"lease_ms": 30000})
            self.assertEqual(r.status, 200, r)
            self.assertEqual(self.put().status, 500)
        self.assertNotIn("has room again", self.head.log())
        self.assertEqual(self.head.log().count("is full"), 1, self.head.log())

        # Room again: the same head takes writes without a restart, and says so once.
        subprocess.run(["mount", "-o", "remount,size=64m", self.mnt], check=True)
        r = self.put()
        self.assertEqual(r.status, 201, r)
        acknowledged += BATCH
        self.assertEqual(self.queued(), acknowledged)
        self.assertRegex(self.head.log(), r"INFO  store: the disk holding %s has room again: "
                         r"requests that write are taken again \(\d+ refused while it was "
                         r"full\)" % re.escape(os.path.join(self.head.data_dir, "muster.db")))
        self.assertEqual(self.put().status, 201)
        acknowledged += BATCH
        self.assertEqual(self.head.log().count("has room again"), 1)

        # Everything acknowledged survives a kill -9.
        self.head.kill()
        self.head.start()
        self.assertEqual(self.queued(), acknowledged)
        r = self.head.request("POST", "/v1/queues/q/lease", {"max": 3})
        self.assertEqual(r.status, 200, r)
        self.assertEqual([t["payload"] for t in r.json["leases"]], [PAYLOAD] * 3)


class NodeCacheDiskFullTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-cachefull-")
        self.mnt = os.path.join(self.dir, "cache")
        os.mkdir(self.mnt)
        proc = try_mount(self.mnt, "1m")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.head = Head().start()
        self.agent = Agent(self.head, self.dir, "full", args=["--cache-dir", self.mnt]).start()

    def tearDown(self):
        self.agent.kill()
        self.head.cleanup()
        subprocess.run(["umount", self.mnt], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def put(self, name, data):
        r = self.head.request("PUT", "/v1/shared/sc/%s" % name, raw=data, content_type=OCTET)
        self.assertEqual(r.status, 201, r)

    def read(self, name, cache=None):
        """The bytes of sc/NAME read through the agent; `cache`: the X-Muster-Cache the
        reply must carry (hit, miss, uncached), when given."""
        r = self.agent.request("GET", "/v1/shared/sc/" + name)
        self.assertEqual(r.status, 200, r)
        if cache is not None:
            self.assertEqual(r.headers.get("X-Muster-Cache"), cache, r.headers)
        return r.raw

    def stats(self):
        r = self.agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json

    def cached(self):
        names = []
        for scope in os.listdir(self.mnt):  # and the cache's own: @tmp, @links, @agent.lock
            if not scope.startswith("@"):
                names += os.listdir(os.path.join(self.mnt, scope))
        return sorted(n.split("@")[0] for n in names)

    def test_level_bigger_than_the_disk_is_served_uncached(self):
        small, big = os.urandom(300_000), os.urandom(4 << 20)  # big: four times the disk
        self.put("small", small)
        self.put("big", big)
        self.assertEqual(self.read("small", cache="miss"), small)
        for _ in range(3):  # the reply says that the cache did not keep it
            self.assertEqual(self.read("big", cache="uncached"), big)
        stats = self.stats()
        self.assertEqual((stats["uncached"], stats["upstream_fetches"]), (3, 1), stats)
        # It could never fit: the level nobody reads stays (every read of big evicted it).
        self.assertEqual((self.cached(), stats["evictions"]), (["small"], 0), stats)
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])  # nothing left behind
        with open(self.agent.log_path, errors="replace") as f:
            log = f.read()
        line = re.compile(
            r"muster node: cache: no room for 4194304 bytes in %s \(its disk has (\d+) bytes "
            r"free, and the cached levels nobody is reading hold 300000 bytes more\): sc/big "
            r"level 1 is served from the head, uncached; so are its further reads, not logged, "
            r"until a level leaves the cache or 60 s have passed, when the cache tries it "
            r"again\n" % re.escape(self.mnt))
        said = line.findall(log)
        self.assertEqual(len(said), 1, log)  # once for the level, not once per read
        self.assertLess(int(said[0]), 1 << 20)
        self.assertEqual(self.read("small", cache="hit"), small)
        self.assertEqual(self.stats()["hits"], 1)

    def test_unread_levels_make_room_on_a_full_disk(self):
        # Far under --cache-bytes (10 GiB by default), so only the disk's room evicts.
        one, two = os.urandom(600_000), os.urandom(600_000)
        self.put("one", one)
        self.put("two", two)
        self.assertEqual(self.read("one"), one)
        self.assertEqual(self.cached(), ["one"])
        self.assertEqual(self.read("two"), two)
        self.assertEqual(self.cached(), ["two"])
        stats = self.stats()
        self.assertEqual((stats["evictions"], stats["uncached"]), (1, 0))
        self.assertEqual(self.read("two"), two)
        self.assertEqual(self.stats()["hits"], 1)


def fill_disk(directory):
    """Writes DIRECTORY/filler until its disk is full; returns the file's path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return path


def held_half_way(size, gate):
    """A RequestProxy body: the first half of a level of `size` bytes, then the rest once
    `gate` is set."""
    def body(pieces):
        sent = 0
        for piece in pieces:
            if sent >= size // 2:
                assert gate.wait(60), "the test never opened the gate"
            yield piece
            sent += len(piece)
    return body


class NodeCacheNoReserveTest(unittest.TestCase):
    """A cache dir on a file system that cannot reserve a level's room before its fetch
    (ext2: fallocate is not supported).  A level bigger than the room left ran out of it
    part way through its fetch, every time: every reader got "503 ... cannot write the
    blob: No space left on device" or a body cut short.  Now the agent asks the file
    system how much is free before the fetch and serves such a level from the head,
    uncached, said once; one that runs out of room part way all the same (the disk
    filled up meanwhile) is not fetched again on every read, and when it is, its readers
    wait for the whole level, so that they can still be served from the head."""

    SIZE = 1 << 20  # half the disk: it fits until the test fills the disk

    def setUp(self):
        if shutil.which("mkfs.ext2") is None:
            self.skipTest("mkfs.ext2 (e2fsprogs) is not installed")
        self.dir = tempfile.mkdtemp(prefix="muster-test-cache-noreserve-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        image, self.mnt = os.path.join(self.dir, "ext2.img"), os.path.join(self.dir, "cache")
        os.mkdir(self.mnt)
        with open(image, "wb") as f:
            f.truncate(2 << 20)
        subprocess.run(["mkfs.ext2", "-q", "-F", "-m", "0", image], check=True)
        proc = subprocess.run(["mount", "-o", "loop", image, self.mnt], stderr=subprocess.PIPE,
                              text=True)
        if proc.returncode != 0:
            self.skipTest("cannot mount an ext2 image here: " + proc.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", self.mnt], check=False)
        self.head = Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.gates = []

    def start_agent(self, held=()):
        """The agent, its head behind a proxy that holds the n-th GET of sc/w half way for
        each n in `held` (until the gate this returns with it is set)."""
        gates = {n: threading.Event() for n in held}
        for gate in gates.values():
            self.addCleanup(gate.set)
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "GET" and path == "/v1/shared/sc/w",
            lambda n: held_half_way(self.SIZE, gates[n]) if n in gates else "forward")
        self.addCleanup(self.proxy.close)
        head = types.SimpleNamespace(url=self.proxy.url, token=self.head.token)
        self.agent = Agent(head, self.dir, "noreserve", args=["--cache-dir", self.mnt])
        self.addCleanup(self.agent.kill)
        self.agent.start()
        return [gates[n] for n in held]

    def put(self, name, data):
        r = self.head.request("PUT", "/v1/shared/sc/%s" % name, raw=data, content_type=OCTET)
        self.assertEqual(r.status, 201, r)

    def read(self, name, cache=None):
        """The bytes of sc/NAME read through the agent; `cache`: the X-Muster-Cache the
        reply must carry (hit, miss, uncached), when given."""
        r = self.agent.request("GET", "/v1/shared/sc/" + name)
        self.assertEqual(r.status, 200, r)
        if cache is not None:
            self.assertEqual(r.headers.get("X-Muster-Cache"), cache, r.headers)
        return r.raw

    def open_read(self, name):
        """A GET of sc/NAME through the agent, its status line and headers read."""
        conn = http.client.HTTPConnection("127.0.0.1", self.agent.port, timeout=60)
        self.addCleanup(conn.close)
        conn.request("GET", "/v1/shared/sc/" + name,
                     headers={"Authorization": "Bearer " + self.head.token})
        return conn.getresponse()

    def fetched_half(self):
        """Waits until the fetch of sc/w has half the level in its temporary file."""
        tmp = os.path.join(self.mnt, "@tmp")
        harness.wait_until(
            lambda: any(os.path.getsize(os.path.join(tmp, n)) >= self.SIZE // 2
                        for n in os.listdir(tmp)),
            what=lambda: "half of sc/w fetched: %s" % os.listdir(tmp))

    def cached(self):
        names = []
        for scope in os.listdir(self.mnt):  # and the cache's own: @tmp, @links, @agent.lock
            if not scope.startswith("@") and scope not in ("lost+found", "filler"):
                names += os.listdir(os.path.join(self.mnt, scope))
        return sorted(n.split("@")[0] for n in names)

    def leave_the_cache(self, name):
        """Deletes cached level sc/NAME on the head; the agent's next read of it drops it."""
        self.assertEqual(self.head.request("DELETE", "/v1/shared/sc/" + name).status, 200)
        self.assertEqual(self.agent.request("GET", "/v1/shared/sc/" + name).status, 404)
        self.assertNotIn(name, self.cached())

    def log(self):
        with open(self.agent.log_path, errors="replace") as f:
            return f.read()  # all of it: Agent.log() has the end alone

    def stats(self):
        r = self.agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json

    def test_a_level_bigger_than_the_room_left_is_served_from_the_head(self):
        self.start_agent()
        big, small = os.urandom(4 << 20), os.urandom(100_000)  # big: twice the disk
        self.put("big", big)
        self.put("small", small)
        self.assertEqual(self.read("small", cache="miss"), small)
        for _ in range(3):  # the reply says that the cache did not keep it
            self.assertEqual(self.read("big", cache="uncached"), big)  # whole, every time
        stats = self.stats()
        self.assertEqual((stats["uncached"], stats["fetch_failures"], stats["upstream_fetches"],
                          stats["evictions"]), (3, 0, 1, 0), stats)
        self.assertEqual(self.cached(), ["small"])
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])  # nothing half-written
        line = re.compile(
            r"muster node: cache: no room for (\d+) bytes in %s \(4194304 for the level, the "
            r"rest for the file system's own blocks \(it cannot reserve them before the "
            r"fetch\); its disk has (\d+) bytes free, and the cached levels nobody is "
            r"reading hold 100000 bytes more\): sc/big level 1 is served from the head, "
            r"uncached; so are its further reads, not logged, until a level leaves the cache "
            r"or 60 s have passed, when the cache tries it again\n" % re.escape(self.mnt))
        log = self.log()
        said = line.findall(log)
        self.assertEqual(len(said), 1, log)
        need, free = int(said[0][0]), int(said[0][1])
        self.assertGreater(need, 4 << 20)
        self.assertLess(free, 2 << 20)
        self.assertNotIn("cannot write the blob", log)
        self.assertEqual(self.read("small"), small)
        self.assertEqual(self.stats()["hits"], 1)

    def test_a_fetch_out_of_room_part_way_is_not_tried_on_every_read(self):
        [gate] = self.start_agent(held=[1])
        data, other = os.urandom(self.SIZE), os.urandom(50_000)
        self.put("w", data)
        self.put("other", other)
        self.assertEqual(self.read("other"), other)
        first = self.open_read("w")  # its reply starts with the first bytes: streamed
        self.assertEqual((first.status, first.getheader("X-Muster-Cache")), (200, "miss"))
        self.fetched_half()
        filler = fill_disk(self.mnt)  # something else fills the disk during the fetch
        gate.set()
        with self.assertRaises(http.client.IncompleteRead) as cut:
            first.read()  # its reply was under way: cut short, never a whole wrong body
        self.assertEqual(cut.exception.partial, data[:len(cut.exception.partial)])
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])
        self.assertNotIn("w", self.cached())

        # The next reads get it from the head, whole, and do not fetch it again.
        for _ in range(2):
            self.assertEqual(self.read("w"), data)
        os.unlink(filler)
        self.assertEqual(self.read("w"), data)  # room again, but nothing the cache saw
        stats = self.stats()
        self.assertEqual((stats["upstream_fetches"], stats["fetch_failures"], stats["uncached"]),
                         (2, 1, 3), stats)
        said = ("muster node: cache: no room for sc/w level 1 (1048576 bytes) in %s: No space "
                "left on device; the disk filled up part way through its fetch (this file "
                "system cannot reserve a level's room before one; " % self.mnt)
        log = self.log()
        self.assertEqual(log.count(said), 1, log)
        self.assertIn("its readers whose reply had started got it cut short, the others get "
                      "it from the head, uncached, as do its further reads, not logged, until a "
                      "level leaves the cache or 60 s have passed; then it is fetched again, "
                      "its readers waiting for the whole level\n", log)

        # A level leaves the cache: room may be back, and the level is fetched again.
        self.leave_the_cache("other")
        r = self.open_read("w")
        self.assertEqual((r.status, r.getheader("X-Muster-Cache")), (200, "miss"))
        self.assertEqual(r.read(), data)
        self.assertEqual(self.cached(), ["w"])
        self.assertEqual(self.stats()["upstream_fetches"], 3)
        log = self.log()
        self.assertIn("muster node: cache: sc/w level 1 is cached now: the disk of %s had room "
                      "for it\n" % self.mnt, log)
        self.assertEqual(log.count("muster node: cache: storing levels in %s again\n" % self.mnt),
                         1, log)

    def test_a_level_fetched_again_after_running_out_of_room_is_not_streamed(self):
        gates = self.start_agent(held=[1, 3])
        data, other = os.urandom(self.SIZE), os.urandom(50_000)
        self.put("w", data)
        self.put("other", other)
        self.assertEqual(self.read("other"), other)
        first = self.open_read("w")
        self.fetched_half()
        filler = fill_disk(self.mnt)
        gates[0].set()
        with self.assertRaises(http.client.IncompleteRead):
            first.read()
        self.assertEqual(self.read("w"), data)  # from the head (the proxy's second GET)
        os.unlink(filler)
        self.leave_the_cache("other")

        # Fetched again (the third GET), held half way, and the disk fills up again: its
        # reader was not sent a byte of it, so the head sends it the whole level.
        got = {}
        reader = threading.Thread(target=lambda: got.update(r=self.open_read("w")))
        reader.start()
        self.fetched_half()
        self.assertNotIn("r", got)  # no reply yet: it waits for the whole level
        filler = fill_disk(self.mnt)
        gates[1].set()
        reader.join(60)
        self.assertEqual((got["r"].status, got["r"].read()), (200, data))
        stats = self.stats()
        self.assertEqual((stats["upstream_fetches"], stats["fetch_failures"], stats["uncached"]),
                         (3, 2, 2), stats)
        self.assertEqual(self.log().count("the disk filled up part way through its fetch"), 1)
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])
        self.assertEqual(self.cached(), [])


if __name__ == "__main__":
    skip_unless_mount()
    unittest.main(verbosity=2)
