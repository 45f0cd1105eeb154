"""The node cache (docs/api.md "Node cache", docs/shared-data.md "Node cache") against the
real head: concurrent readers of a cold level cause one upstream fetch; hits, misses and
the other statistics; a corrupted cache file is found by its checksum and fetched again;
least-recently-used eviction under --cache-bytes that never takes a level being read;
and a 1 GiB level uploaded to the head and read through the cache by 8 readers, with the
resident memory of the head and of the agent measured from /proc and bounded."""
import http.client
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402

OCTET = "application/octet-stream"
MIB = 1 << 20


def vm_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(key + " not in /proc/%d/status" % pid)


def put(head, scope, name, data, level=None, ttl_ms=None):
    params = [] if level is None else ["level=%d" % level]
    params += [] if ttl_ms is None else ["ttl_ms=%d" % ttl_ms]
    query = "?" + "&".join(params) if params else ""
    r = head.request("PUT", "/v1/shared/%s/%s%s" % (scope, name, query), raw=data,
                     content_type=OCTET)
    assert r.status == 201, r
    return r.json


class NodeCacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-cache-test-")
        cls.head = harness.Head().start()
        cls.agents = []

    @classmethod
    def tearDownClass(cls):
        for a in cls.agents:
            a.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def agent(self, name, limit=None):
        args = ["--cache-dir", os.path.join(self.dir, "cache-" + name)]
        if limit is not None:
            args += ["--cache-bytes", str(limit)]
        a = Agent(self.head, self.dir, name, args=args)
        self.agents.append(a)
        return a.start()

    def stats(self, agent):
        r = agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json

    def get(self, agent, scope, name, level=None):
        query = "" if level is None else "?level=%d" % level
        return agent.request("GET", "/v1/shared/%s/%s%s" % (scope, name, query))

    def test_concurrent_cold_readers_one_upstream_fetch(self):
        a = self.agent("cold")
        data = os.urandom(8 * MIB)
        info = put(self.head, "models", "cold", data)
        start = threading.Barrier(8)
        replies = [None] * 8

        def read(i):
            start.wait()
            replies[i] = self.get(a, "models", "cold")
        threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in replies:
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.raw, data)
            self.assertEqual(r.headers["ETag"], '"%s"' % info["checksum"])
            self.assertEqual(r.headers["X-Muster-Level"], "1")
        s = self.stats(a)
        print("\n8 cold readers: %s" % s)
        self.assertEqual(s["upstream_fetches"], 1, s)
        self.assertEqual(s["hits"] + s["misses"], 8, s)
        self.assertGreaterEqual(s["misses"], 1, s)
        self.assertEqual(s["misses"] - 1, s["coalesced"], s)
        self.assertEqual(s["bytes_served"], 8 * len(data), s)
        self.assertEqual((s["entries"], s["bytes_cached"]), (1, len(data)), s)

    def test_hits_misses_levels_and_errors(self):
        a = self.agent("stats", limit=64 * MIB)
        v1, v2 = b"level one " * 1000, b"level two " * 2000
        put(self.head, "tables", "t", v1)
        self.assertEqual(self.stats(a)["limit_bytes"], 64 * MIB)
        r = self.get(a, "tables", "t")
        self.assertEqual((r.status, r.raw, r.headers["X-Muster-Cache"]), (200, v1, "miss"), r)
        for _ in range(2):
            r = self.get(a, "tables", "t", level=1)
            self.assertEqual((r.status, r.raw, r.headers["X-Muster-Cache"]), (200, v1, "hit"))
        s = self.stats(a)
        self.assertEqual((s["hits"], s["misses"], s["upstream_fetches"]), (2, 1, 1), s)
        self.assertEqual((s["bytes_served"], s["entries"], s["bytes_cached"]),
                         (3 * len(v1), 1, len(v1)), s)
        # A new level: "newest" follows the head, the old level is still served.
        put(self.head, "tables", "t", v2, level=2)
        r = self.get(a, "tables", "t")
        self.assertEqual((r.status, r.raw, r.headers["X-Muster-Level"]), (200, v2, "2"), r)
        r = self.get(a, "tables", "t", level=1)
        self.assertEqual((r.raw, r.headers["X-Muster-Cache"]), (v1, "hit"))
        r = a.request("GET", "/v1/shared/tables/t", headers={"If-None-Match": r.headers["ETag"]})
        self.assertEqual(r.status, 200)  # the newest level's ETag is another one
        r = a.request("GET", "/v1/shared/tables/t?level=1",
                      headers={"If-None-Match": self.get(a, "tables", "t", 1).headers["ETag"]})
        self.assertEqual((r.status, r.raw), (304, b""))
        s = self.stats(a)
        self.assertEqual((s["upstream_fetches"], s["entries"]), (2, 2), s)
        # The head stays the authority: tokens, missing levels, deleted blobs.
        r = a.request("GET", "/v1/shared/tables/t", token=None)
        self.assertEqual((r.status, r.error_code), (401, "unauthorized"), r)
        self.assertTrue(r.json["error"]["message"].startswith("no token sent: send "), r)
        r = self.get(a, "tables", "t", level=7)
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        r = self.get(a, "tables", "nope")
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        r = a.request("HEAD", "/v1/shared/tables/t")
        self.assertEqual((r.status, r.headers["Content-Length"]), (200, str(len(v2))), r)
        r = a.request("GET", "/v1/node/cache/tables/t?level=1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json["level"], r.json["size"]), (1, len(v1)))
        with open(r.json["path"], "rb") as f:
            self.assertEqual(f.read(), v1)
        self.assertEqual(os.stat(r.json["path"]).st_mode & 0o777, 0o444)
        r = a.request("GET", "/v1/node/cache", token=None)
        self.assertEqual((r.status, r.error_code), (401, "unauthorized"), r)
        self.assertTrue(r.json["error"]["message"].startswith("no token sent: send "), r)
        r = a.request("GET", "/v1/node/cache", token="wrong-token")
        self.assertIn("the token sent is not valid for this head", r.json["error"]["message"])
        self.assertEqual(self.head.request("DELETE", "/v1/shared/tables/t").status, 200)
        r = self.get(a, "tables", "t", level=1)
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        s = self.stats(a)  # a 304 and the answers the head gave itself are not counted
        self.assertEqual((s["hits"], s["misses"], s["bytes_served"]),
                         (6, 2, 5 * len(v1) + 2 * len(v2)), s)

    def test_corrupt_file_is_detected_and_fetched_again(self):
        a = self.agent("corrupt")
        data = os.urandom(3 * MIB)
        put(self.head, "models", "c", data)
        self.assertEqual(self.get(a, "models", "c").raw, data)
        path = a.request("GET", "/v1/node/cache/models/c").json["path"]
        before = os.stat(path)
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:  # flip bytes in the middle, keep the size
            f.seek(MIB)
            f.write(bytes(b ^ 0xFF for b in data[MIB:MIB + 16]))
        # A write gives the file a new mtime; set one that differs even when the
        # write fell into the same clock tick as the agent's rename.
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))
        r = self.get(a, "models", "c")
        self.assertEqual((r.status, r.raw == data, r.headers["X-Muster-Cache"]),
                         (200, True, "miss"))
        s = self.stats(a)
        self.assertEqual((s["verify_failures"], s["upstream_fetches"]), (1, 2), s)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), data)
        r = self.get(a, "models", "c")
        self.assertEqual((r.raw == data, r.headers["X-Muster-Cache"]), (True, "hit"))

    def test_lru_eviction_under_the_limit(self):
        a = self.agent("lru", limit=3 * MIB)
        blobs = {n: os.urandom(MIB) for n in "abcd"}
        for n, d in blobs.items():
            put(self.head, "lru", n, d)
        for n in "abc":
            self.assertEqual(self.get(a, "lru", n).raw, blobs[n])
        self.assertEqual(self.get(a, "lru", "a").headers["X-Muster-Cache"], "hit")  # a: recent
        self.assertEqual(self.get(a, "lru", "d").raw, blobs["d"])  # evicts b, the oldest
        s = self.stats(a)
        self.assertEqual((s["evictions"], s["entries"], s["bytes_cached"]), (1, 3, 3 * MIB), s)
        for n, how in (("a", "hit"), ("c", "hit"), ("d", "hit"), ("b", "miss")):
            r = self.get(a, "lru", n)
            self.assertEqual((r.raw == blobs[n], r.headers["X-Muster-Cache"]), (True, how), n)
        s = self.stats(a)
        self.assertEqual((s["evictions"], s["upstream_fetches"]), (2, 5), s)
        self.assertLessEqual(s["bytes_cached"], s["limit_bytes"])
        files = os.listdir(os.path.join(self.dir, "cache-lru", "lru"))
        self.assertEqual(len(files), 3, files)

    def test_a_level_being_read_is_not_evicted(self):
        a = self.agent("busy", limit=40 * MIB)
        big, other = os.urandom(32 * MIB), os.urandom(16 * MIB)
        put(self.head, "busy", "big", big)
        put(self.head, "busy", "other", other)
        self.assertEqual(self.get(a, "busy", "big").raw, big)
        big_path = a.request("GET", "/v1/node/cache/busy/big").json["path"]
        # A reader that stops after the headers: a small receive buffer keeps most
        # of the level unsent, so the agent's reply holds the file.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.connect(("127.0.0.1", a.port))
        sock.sendall(b"GET /v1/shared/busy/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + self.head.token.encode() + b"\r\n\r\n")
        f = sock.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += f.read(1)
        self.assertIn(b"200 OK", head)
        self.assertIn(b"X-Muster-Cache: hit", head)
        # `other` needs room, and big, the least recently used, would be the one to
        # go; being read, it stays, and `other` (not being read once sent) goes.
        self.assertEqual(self.get(a, "busy", "other").raw, other)
        s = self.stats(a)
        self.assertEqual((s["evictions"], s["entries"], s["bytes_cached"]), (1, 1, len(big)), s)
        self.assertTrue(os.path.exists(big_path))
        got = f.read(len(big))
        sock.close()
        self.assertEqual(got, big)
        r = a.request("GET", "/v1/node/cache/busy/big")
        self.assertEqual((r.json["cache"], r.json["path"]), ("hit", big_path))
        r = self.get(a, "busy", "other")
        self.assertEqual(r.headers.get("X-Muster-Cache"), "miss", r)
        s = self.stats(a)
        self.assertEqual((s["evictions"], s["entries"], s["bytes_cached"]), (2, 1, len(other)), s)

    def test_a_removed_cache_dir_is_noticed(self):
        # The agent went on counting the files of a cache dir removed while it ran
        # (rm -rf) until each was read or evicted, and eviction started early for
        # bytes nobody stored.
        a = self.agent("removed", limit=3 * MIB)
        blobs = {n: os.urandom(MIB) for n in "abcd"}
        for n, d in blobs.items():
            put(self.head, "gone", n, d)
        for n in "ab":
            self.assertEqual(self.get(a, "gone", n).raw, blobs[n])
        self.assertEqual(self.stats(a)["entries"], 2)
        shutil.rmtree(os.path.join(self.dir, "cache-removed"))
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"]), (0, 0), s)
        self.assertEqual(s["vanished"], 2, s)
        self.assertIn("2 cached levels (%d bytes) no longer on disk" % (2 * MIB), a.log())
        # Three levels fit the limit: none is evicted for the bytes that went, and a
        # level asked for again is fetched again.
        for n in "cda":
            r = self.get(a, "gone", n)
            self.assertEqual((r.raw == blobs[n], r.headers["X-Muster-Cache"]), (True, "miss"), n)
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"], s["evictions"], s["upstream_fetches"]),
                         (3, 3 * MIB, 0, 5), s)
        self.assertEqual(len(os.listdir(os.path.join(self.dir, "cache-removed", "gone"))), 3)

    def test_a_level_the_head_no_longer_has_leaves_the_disk(self):
        # A deleted or expired level stayed on the node's disk until LRU eviction
        # (10 GiB by default), even after the head had answered 404 for it.
        a = self.agent("deleted")
        put(self.head, "del", "x", b"x" * 1000)
        put(self.head, "del", "x", b"y" * 2000, level=2)
        put(self.head, "del", "keep", b"k" * 100)
        for level in (1, 2):
            self.assertEqual(self.get(a, "del", "x", level).status, 200)
        self.assertEqual(self.get(a, "del", "keep").status, 200)
        scope_dir = os.path.join(self.dir, "cache-deleted", "del")
        self.assertEqual(len(os.listdir(scope_dir)), 3)
        self.assertEqual(self.head.request("DELETE", "/v1/shared/del/x").status, 200)
        r = self.get(a, "del", "x", level=2)  # one level: that one goes
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        self.assertEqual(len(os.listdir(scope_dir)), 2)
        r = self.get(a, "del", "x")  # the newest: no level of it is left, all go
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        self.assertEqual([f.split("@")[0] for f in os.listdir(scope_dir)], ["keep"])
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"], s["expired"]), (1, 100, 2), s)

    def test_an_expired_level_leaves_the_disk_unread(self):
        # Nobody reads the level once it expired: the agent asks the head itself when
        # the expiry the head gave has passed, and removes the file.
        a = self.agent("ttl")
        put(self.head, "ttl", "short", b"s" * 5000, ttl_ms=1500)
        put(self.head, "ttl", "long", b"l" * 700)
        self.assertEqual(self.get(a, "ttl", "short").status, 200)
        self.assertEqual(self.get(a, "ttl", "long").status, 200)
        scope_dir = os.path.join(self.dir, "cache-ttl", "ttl")
        self.assertEqual(len(os.listdir(scope_dir)), 2)
        harness.wait_until(lambda: len(os.listdir(scope_dir)) == 1, timeout=15,
                           what=lambda: "the expired level's file removed:\n" + a.log())
        self.assertEqual(os.listdir(scope_dir)[0].split("@")[0], "long")
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"], s["expired"]), (1, 700, 1), s)
        r = self.head.request("GET", "/v1/shared/ttl/short")
        self.assertEqual(r.status, 404, r)  # expired at the head too, as the agent was told


    def test_levels_the_head_stopped_keeping_leave_the_disk(self):
        # The head keeps the newest 2 levels of a blob: level 1 went when level 3 came,
        # but the node kept its copy until the expiry it had noted (the blob's ttl,
        # here 10 minutes) or a read of it.
        a = self.agent("kept")
        put(self.head, "kept", "w", b"1" * 100, ttl_ms=600000)
        self.assertEqual(self.get(a, "kept", "w").status, 200)
        put(self.head, "kept", "w", b"2" * 200, level=2)
        self.assertEqual(self.get(a, "kept", "w").status, 200)
        scope_dir = os.path.join(self.dir, "cache-kept", "kept")
        self.assertEqual(len(os.listdir(scope_dir)), 2)
        put(self.head, "kept", "w", b"3" * 300, level=3)
        r = self.get(a, "kept", "w")
        self.assertEqual((r.status, r.raw), (200, b"3" * 300), r)
        harness.wait_until(lambda: self.stats(a)["expired"] == 1,
                           what=lambda: "level 1 removed:\n" + a.log())
        self.assertEqual(sorted(f.split("@")[1][:1] for f in os.listdir(scope_dir)),
                         ["2", "3"])
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"]), (2, 500), s)
        r = self.get(a, "kept", "w", level=2)  # still kept at the head: still a hit
        self.assertEqual((r.status, r.headers["X-Muster-Cache"]), (200, "hit"), r)


class LargeBlobTest(unittest.TestCase):
    """Item 5: 1 GiB through the head and a node cache, 8 readers, memory from /proc."""

    SIZE = 1 << 30
    READERS = 8

    def setUp(self):
        # Under the sanitizers, freed memory waits in ASan's quarantine (256 MiB by
        # default) before reuse, which would show as resident memory that the plain
        # build reuses at once: keep the quarantine small for these processes.
        self.asan_options = os.environ.get("ASAN_OPTIONS")
        os.environ["ASAN_OPTIONS"] = (self.asan_options + ":" if self.asan_options else "") + \
            "quarantine_size_mb=16"
        self.dir = tempfile.mkdtemp(prefix="muster-cache-big-")
        self.head = harness.Head().start()
        self.agent = Agent(self.head, self.dir, "big",
                           args=["--cache-dir", os.path.join(self.dir, "cache")]).start()

    def tearDown(self):
        self.agent.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.asan_options is None:
            os.environ.pop("ASAN_OPTIONS", None)
        else:
            os.environ["ASAN_OPTIONS"] = self.asan_options

    @staticmethod
    def block(pattern, i):
        """Block i of the blob: the pattern with its index in the first 8 bytes."""
        return struct.pack("<Q", i) + pattern[8:]

    def make_file(self, pattern):
        path = os.path.join(self.dir, "blob.bin")
        with open(path, "wb") as f:
            for i in range(self.SIZE // MIB):
                f.write(self.block(pattern, i))
        return path

    def upload(self, path):
        conn = self.head.connection(timeout=300)
        try:
            conn.putrequest("PUT", "/v1/shared/big/weights")
            conn.putheader("Authorization", "Bearer " + self.head.token)
            conn.putheader("Content-Type", OCTET)
            conn.putheader("Content-Length", str(self.SIZE))
            conn.endheaders()
            with open(path, "rb") as f:
                while True:
                    chunk = f.read(4 * MIB)
                    if not chunk:
                        break
                    conn.send(chunk)
            r = conn.getresponse()
            body = r.read()
            self.assertEqual(r.status, 201, body)
        finally:
            conn.close()

    def read_all(self, pattern, results, i, start):
        """One reader: checks every 1 MiB block as it arrives (1 MiB held at a time)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.agent.port, timeout=300)
        try:
            start.wait()
            conn.request("GET", "/v1/shared/big/weights",
                         headers={"Authorization": "Bearer " + self.head.token})
            r = conn.getresponse()
            buf = bytearray(MIB)
            view = memoryview(buf)
            n, bad, block = 0, 0, 0
            while True:
                got = 0
                while got < MIB:
                    k = r.readinto(view[got:])
                    if not k:
                        break
                    got += k
                if got == 0:
                    break
                if got != MIB or buf[8:] != pattern[8:] or buf[:8] != struct.pack("<Q", block):
                    bad += 1
                n += got
                block += 1
            results[i] = (r.status, n, bad)
        finally:
            conn.close()

    def test_one_gib_through_the_cache(self):
        pattern = os.urandom(MIB)
        t0 = time.monotonic()
        path = self.make_file(pattern)
        t1 = time.monotonic()
        self.upload(path)
        os.unlink(path)  # the head and the cache hold their copies
        t2 = time.monotonic()
        head_pid, agent_pid = self.head.proc.pid, self.agent.proc.pid
        results, start = [None] * self.READERS, threading.Barrier(self.READERS)
        threads = [threading.Thread(target=self.read_all, args=(pattern, results, i, start))
                   for i in range(self.READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t3 = time.monotonic()
        self.assertEqual(results, [(200, self.SIZE, 0)] * self.READERS)
        s = self.agent.request("GET", "/v1/node/cache").json
        self.assertEqual(s["upstream_fetches"], 1, s)
        head_hwm, head_rss = vm_kib(head_pid, "VmHWM"), vm_kib(head_pid, "VmRSS")
        agent_hwm, agent_rss = vm_kib(agent_pid, "VmHWM"), vm_kib(agent_pid, "VmRSS")
        print("\n1 GiB blob, %d readers through the node cache: file written in %.1f s, "
              "uploaded in %.1f s, read in %.1f s (%.0f MiB/s over all readers, one upstream "
              "fetch)\n  head  VmHWM %d KiB (peak resident), VmRSS %d KiB\n"
              "  agent VmHWM %d KiB (peak resident), VmRSS %d KiB"
              % (self.READERS, t1 - t0, t2 - t1, t3 - t2,
                 self.READERS * self.SIZE / MIB / (t3 - t2), head_hwm, head_rss, agent_hwm,
                 agent_rss))
        # "Far below the blob": each process peaked under an eighth of it (128 MiB),
        # sanitizer builds included.
        self.assertLess(head_hwm, (self.SIZE >> 10) // 8)
        self.assertLess(agent_hwm, (self.SIZE >> 10) // 8)


if __name__ == "__main__":
    unittest.main()
