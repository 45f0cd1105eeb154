#!/usr/bin/python3
"""Full disks.  A head whose disk fills up: writes are refused saying the disk is
full, nothing acknowledged is lost, and the head goes on by itself once there is room.
A node agent whose cache dir has no room for a level: the reader still gets its bytes
(from the head, uncached), and cached levels nobody reads make room for new ones.

The data dir or cache dir is on a small tmpfs the test mounts (and unmounts): needs
root (CAP_SYS_ADMIN) for mount; without it the test says so and skips.
"""
import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
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

    def read(self, name):
        r = self.agent.request("GET", "/v1/shared/sc/" + name)
        self.assertEqual(r.status, 200, r)
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
        big = os.urandom(4 << 20)  # four times the cache dir's disk
        self.put("big", big)
        self.assertEqual(self.read("big"), big)
        self.assertEqual(self.stats()["uncached"], 1)
        self.assertEqual(self.cached(), [])
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])  # nothing left behind
        with open(self.agent.log_path, errors="replace") as f:
            self.assertIn("cache: no room for 4194304 bytes in %s: No space left on device; "
                          "sc/big level 1 served from the head, uncached" % self.mnt, f.read())

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


class NodeCacheNoReserveTest(unittest.TestCase):
    """A cache dir on a file system that cannot reserve a level's room before its fetch
    (ext2: fallocate is not supported), so that a level too large for the disk runs out
    of room part way through its fetch.  Each such fetch was logged, one line per read,
    and nothing said when levels were stored again.  Now the full disk is said once, then
    at most every 10 s with a count, and its end once, in the words of the reserve path."""

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
        self.agent = Agent(self.head, self.dir, "noreserve", args=["--cache-dir", self.mnt])
        self.addCleanup(self.agent.kill)
        self.agent.start()

    def put(self, name, data):
        r = self.head.request("PUT", "/v1/shared/sc/%s" % name, raw=data, content_type=OCTET)
        self.assertEqual(r.status, 201, r)

    def read(self, name):
        """The body of a read, or None when it failed (503, or a body cut short)."""
        try:
            r = self.agent.request("GET", "/v1/shared/sc/" + name)
        except (http.client.IncompleteRead, ConnectionError):
            return None
        self.assertIn(r.status, (200, 503), r)
        return r.raw if r.status == 200 else None

    def test_a_fetch_out_of_room_part_way_is_said_once_and_its_end_too(self):
        big, small = os.urandom(4 << 20), os.urandom(100_000)  # big: twice the disk
        self.put("big", big)
        for name in ("one", "two", "three"):
            self.put(name, small)
        full = ("muster node: cache: no room for sc/big level 1 (4194304 bytes) in %s: No space "
                "left on device; the disk filled up part way through its fetch (this file "
                "system cannot reserve a level's room before one), and its readers got an "
                "error" % self.mnt)
        first = full + ("; fetches that run out of room are logged at most every 10 s while "
                        "this lasts, and the cache says when it stores levels again\n")
        again = "muster node: cache: storing levels in %s again\n" % self.mnt
        for _ in range(3):
            self.assertIsNone(self.read("big"))
        log = self.log()
        self.assertEqual((log.count(first), log.count(full)), (1, 1), log)
        self.assertEqual(self.stats()["fetch_failures"], 3)
        self.assertEqual(os.listdir(os.path.join(self.mnt, "@tmp")), [])  # its room given back

        # A level stored ends it, said once.
        self.assertEqual(self.read("one"), small)
        self.assertEqual(self.read("two"), small)
        log = self.log()
        self.assertEqual(log.count(again), 1, log)
        self.assertLess(log.index(first), log.index(again))

        # Full again: said at once; while it lasts, again after 10 s with the count.
        self.assertIsNone(self.read("big"))
        self.assertEqual(self.log().count(first), 2, self.log())
        counted = re.compile(re.escape(full) + r"; (\d+) more fetch(es)? ran out of room since "
                             r"the last such line\n")

        def repeated():
            self.assertIsNone(self.read("big"))
            return counted.search(self.log())
        line = harness.wait_until(repeated, timeout=30, interval=0.5,
                                  what=lambda: "the full disk said again:\n" + self.log())
        self.assertGreaterEqual(int(line.group(1)), 1)
        log = self.log()
        self.assertEqual(log.count(full), 3, log)  # each failed read was one fetch, not a line
        self.assertEqual(self.read("three"), small)
        self.assertEqual(self.log().count(again), 2, self.log())

    def log(self):
        with open(self.agent.log_path, errors="replace") as f:
            return f.read()  # all of it: Agent.log() has the end alone

    def stats(self):
        r = self.agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json


if __name__ == "__main__":
    skip_unless_mount()
    unittest.main(verbosity=2)
