"""Shared data and node caches across kill -9 of the head (docs/shared-data.md "Uploads,
downloads and memory", "Node cache"; docs/api.md "Shared data").

An acknowledged upload surviving kill -9 is test_api_shared.py's; here the head dies
during one:
- mid-body (part of the bytes in DATA_DIR/shared/tmp), and after the body, its file
  renamed into DATA_DIR/shared but the level not committed (strace, attached to the
  running head, holds it right after that rename).  After each restart no partial level is visible (the newest is the
  one before, the cut level "was never made"), the files are gone, and the same level
  uploaded again with other bytes is what everyone reads;
- with two node agents: one has the levels in its cache, one has not.  While the head is
  down both answer reads with 503 at once (the agent cannot check the token), not a
  hang.  After the restart (the last upload acknowledged just before the kill) the first
  serves them from its cache (hits, no upstream fetch), the second fetches them once;
  an upload cut by another kill is not visible through either.
"""
import http.client
import os
import shutil
import signal
import socket
import subprocess
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
# How long a read through an agent may take while the head is down: it is refused, not
# held until the head is back.
DOWN_READ_S = 10


def shared_dir(head, *sub):
    return os.path.join(head.data_dir, "shared", *sub)


def blob_files(head):
    return sorted(f for f in os.listdir(shared_dir(head)) if f.endswith(".blob"))


def tmp_bytes(head):
    """The bytes in the head's upload temp files."""
    d = shared_dir(head, "tmp")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def put(head, path, data, conn=None):
    return head.request("PUT", "/v1/shared/" + path, raw=data, content_type=OCTET, conn=conn)


class CutUpload:
    """A PUT of `size` bytes of which only `sent` go, on a raw socket held open."""

    def __init__(self, head, path, size, sent):
        self.sock = socket.create_connection(("127.0.0.1", head.port))
        self.sock.sendall(b"PUT /v1/shared/%s HTTP/1.1\r\nHost: x\r\n"
                          b"Authorization: Bearer %s\r\nContent-Type: %s\r\n"
                          b"Content-Length: %d\r\n\r\n" % (path.encode(), head.token.encode(),
                                                          OCTET.encode(), size))
        self.sock.sendall(b"c" * sent)

    def close(self):
        self.sock.close()


class SharedKillTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-chaos-shared-")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()]).start()
        self.agents, self.sockets, self.tracers = [], [], []

    def tearDown(self):
        for a in self.agents:
            a.kill()
        for s in self.sockets:
            s.close()
        self.head.cleanup()
        for tracer in self.tracers:
            if tracer.poll() is None:
                tracer.kill()
            tracer.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def hold_after_rename(self, pid):
        """strace attached to process `pid`, holding each rename it makes (for 30 s,
        after the call), once it is attached; its Popen."""
        strace = shutil.which("strace")
        self.assertIsNotNone(strace, "strace is missing: run scripts/install-deps")
        tracer = subprocess.Popen([strace, "-f", "-qq", "-o", "/dev/null", "-p", str(pid),
                                   "-e", "trace=rename,renameat,renameat2",
                                   "-e", "inject=rename,renameat,renameat2:delay_exit=30000000"])
        self.tracers.append(tracer)

        def traced():
            with open("/proc/%d/status" % pid) as f:
                return "TracerPid:\t0\n" not in f.read()
        harness.wait_until(traced, timeout=20, what="strace to attach to the head")
        return tracer

    def cut_upload(self, path, size=4 * MIB, sent=MIB):
        """kill -9 of the head once `sent` bytes of a `size`-byte upload to `path` are in
        its temp file; starts it again."""
        upload = CutUpload(self.head, path, size, sent)
        self.sockets.append(upload)
        harness.wait_until(lambda: tmp_bytes(self.head) >= sent, timeout=20,
                           what="the upload's bytes in the temp file")
        self.head.kill()
        upload.close()
        self.head.start()

    def assert_newest(self, via, path, level, data):
        """`via` (the head or an agent) serves `data` as level `level`, the newest, and
        says that level + 1 was never made."""
        r = via.request("GET", "/v1/shared/" + path)
        self.assertEqual((r.status, r.headers.get("X-Muster-Level")), (200, str(level)), r)
        self.assertTrue(r.raw == data, "level %d's bytes differ" % level)
        r = via.request("GET", "/v1/shared/%s?level=%d" % (path, level + 1))
        self.assertEqual((r.status, r.error_code), (404, "shared_not_found"), r)
        self.assertIn("level %d of '%s' was never made; the newest is %d"
                      % (level + 1, path.split("/")[1], level), r.json["error"]["message"])
        return r

    def assert_no_trace_of_the_cut(self, path, level, data):
        h = self.head
        self.assert_newest(h, path, level, data)
        (blob,) = h.request("GET", "/v1/shared/" + path.split("/")[0]).json["blobs"]
        self.assertEqual(blob["levels"][-1], level, blob)
        self.assertEqual(os.listdir(shared_dir(h, "tmp")), [], "a temp file was left")
        self.assertEqual(len(blob_files(h)), len(blob["levels"]), "a file no level names")

    def test_kill_mid_body_and_before_the_commit(self):
        h = self.head
        one, two = os.urandom(MIB), os.urandom(2 * MIB)
        self.assertEqual(put(h, "models/w", one).status, 201)
        # 1: mid-body.
        self.cut_upload("models/w?level=2")
        self.assert_no_trace_of_the_cut("models/w", 1, one)
        # 2: the body whole and its file renamed into place, the level not committed:
        # strace, attached to the running head, holds it right after that rename.
        tracer = self.hold_after_rename(h.proc.pid)
        before = blob_files(h)
        reply = {}

        def upload():
            conn = h.connection(timeout=60)
            try:
                reply["r"] = put(h, "models/w?level=2", os.urandom(2 * MIB), conn=conn)
            except (OSError, http.client.HTTPException) as e:
                reply["error"] = e
            finally:
                conn.close()
        t = threading.Thread(target=upload)
        t.start()
        harness.wait_until(lambda: len(blob_files(h)) > len(before), timeout=20,
                           what="the upload's file renamed into place")
        # SIGKILL first: strace's end then detaches a head that can run no more code
        # (the other way round, the head would go on and commit).
        os.kill(h.proc.pid, signal.SIGKILL)
        tracer.kill()
        tracer.wait(30)
        h.kill()
        t.join(30)
        self.assertNotIn("r", reply, "the upload was answered: %r" % reply.get("r"))
        h.start()
        self.assert_no_trace_of_the_cut("models/w", 1, one)
        # The level is made again, with other bytes, and read back whole.
        r = put(h, "models/w?level=2", two)
        self.assertEqual(r.status, 201, r)
        got = h.request("GET", "/v1/shared/models/w")
        self.assertEqual((got.raw == two, got.headers["ETag"]), (True, '"%s"' % r.json["checksum"]))
        self.assertEqual(h.stop(), 0, h.log())
        self.assertNotIn("Sanitizer", h.log())

    def agent(self, name):
        a = Agent(self.head, self.dir, name, args=["--cache-dir", os.path.join(self.dir, name)])
        self.agents.append(a)
        return a.start()

    def stats(self, agent):
        r = agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json

    def read(self, agent, path, data, cache):
        r = agent.request("GET", "/v1/shared/" + path)
        self.assertEqual((r.status, r.headers.get("X-Muster-Cache")), (200, cache), r)
        self.assertTrue(r.raw == data, "%s: the bytes of %s differ" % (agent.name, path))
        return r

    def test_node_caches_across_a_kill(self):
        h = self.head
        warm, cold = self.agent("warm"), self.agent("cold")
        one, two = os.urandom(MIB), os.urandom(MIB)
        self.assertEqual(put(h, "models/w", one).status, 201)
        self.read(warm, "models/w?level=1", one, "miss")
        r = put(h, "models/w?level=2", two)
        self.assertEqual(r.status, 201, r)
        etag = r.headers["ETag"]
        self.read(warm, "models/w?level=2", two, "miss")
        h.kill()  # just after the upload of level 2 was acknowledged and cached

        # Down: each read is refused at once, cached or not.
        for a in (warm, cold):
            began = time.monotonic()
            r = a.request("GET", "/v1/shared/models/w?level=2", timeout=DOWN_READ_S)
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            self.assertLess(time.monotonic() - began, DOWN_READ_S)
        h.start()

        fetched = self.stats(warm)["upstream_fetches"]
        self.assertEqual(self.read(warm, "models/w?level=2", two, "hit").headers["ETag"], etag)
        self.read(warm, "models/w?level=1", one, "hit")
        self.read(warm, "models/w", two, "hit")
        self.assertEqual(self.stats(warm)["upstream_fetches"], fetched)
        self.assertEqual(self.read(cold, "models/w", two, "miss").headers["ETag"], etag)
        self.read(cold, "models/w?level=2", two, "hit")
        self.assertEqual(self.stats(cold)["upstream_fetches"], 1)

        # An upload cut by a kill is seen by neither agent.
        self.cut_upload("models/w?level=3")
        for a in (warm, cold):
            r = self.assert_newest(a, "models/w", 2, two)
        self.assert_no_trace_of_the_cut("models/w", 2, two)
        for a in self.agents:
            self.assertEqual(a.stop(), 0, a.log())
            self.assertNotIn("Sanitizer", a.log())
        self.assertEqual(h.stop(), 0, h.log())
        self.assertNotIn("Sanitizer", h.log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
