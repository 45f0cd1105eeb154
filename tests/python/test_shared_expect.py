"""client.shared's uploads over 64 KiB ask for "100 Continue" (``Expect: 100-continue``)
before their body: one the head refuses (a level conflict, a bad token, a body over its
limit) is refused before a byte of the body goes; one it takes goes once the 100 came;
a server that ignores Expect gets the body after a bounded wait (docs/python.md,
"Shared data")."""
import io
import json
import os
import pathlib
import select
import shutil
import socket
import sys
import tempfile
import threading
import unittest
from unittest import mock

from common import ROOT, HeadTestCase, harness, muster
from muster import _continue
from test_client import ScriptedServer

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import node_harness  # noqa: E402

MIB = 1 << 20
SCOPE = "pytest-expect"
HEAD_BYTES = 4096   # more than any request head the client sends


class CountingProxy:
    """A TCP relay to 127.0.0.1:``port`` that logs what each side sent, in the order
    it was sent: ``log`` holds ("up" (client to server) or "down", bytes), each piece
    logged before it is passed on, so a reply logged before a piece of the body came
    before it.  ``reset()`` empties the log."""

    def __init__(self, port):
        self.port, self.log, self.lock = port, [], threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return   # closed
            server = socket.create_connection(("127.0.0.1", self.port))
            for source, sink, direction in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(source, sink, direction),
                                 daemon=True).start()

    def _pump(self, source, sink, direction):
        try:
            while True:
                piece = source.recv(1 << 16)
                if not piece:
                    break
                with self.lock:
                    self.log.append((direction, piece))
                sink.sendall(piece)
        except OSError:
            pass
        for s in (sink, source):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        source.close()

    def sent_up(self):
        with self.lock:
            return sum(len(piece) for direction, piece in self.log if direction == "up")

    def up_before_continue(self):
        """The bytes the client sent before the first "100 Continue" came to it (None:
        none came)."""
        with self.lock:
            up = 0
            for direction, piece in self.log:
                if direction == "down" and b" 100 Continue\r\n" in piece:
                    return up
                if direction == "up":
                    up += len(piece)
        return None

    def reset(self):
        with self.lock:
            self.log = []

    def close(self):
        self.listener.close()


class ExpectTest(HeadTestCase):
    head_args = ("--sweep-ms", "50", "--max-blob-bytes", str(4 * MIB))

    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="muster-expect-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.proxy = CountingProxy(self.head.port)
        self.addCleanup(self.proxy.close)
        self.via = muster.Client(self.proxy.url, self.head.token)
        self.addCleanup(self.via.close)

    def file(self, name, size):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        return pathlib.Path(path)

    def assert_refused_unsent(self, error, call):
        """``call()`` raises ``error`` and the client sent no more than a request head."""
        self.proxy.reset()
        with self.assertRaises(error) as cm:
            call()
        self.assertLess(self.proxy.sent_up(), HEAD_BYTES, "the body was sent")
        return cm.exception

    def test_a_refused_upload_sends_no_body(self):
        name = self.qname()
        self.via.shared.set(SCOPE, name, self.file("first", 2 * MIB))
        big = self.file("big", 3 * MIB)
        e = self.assert_refused_unsent(muster.VersionMismatch,
                                       lambda: self.via.shared.set(SCOPE, name, big))
        self.assertIn("exists at level 1; update it with level=2", str(e))
        e = self.assert_refused_unsent(muster.VersionMismatch, lambda: self.via.shared.update(
            SCOPE, name, big.read_bytes(), level=3))   # bytes too
        self.assertIn("expected 2, got 3", str(e))
        wrong = muster.Client(self.proxy.url, "not-the-token")
        self.addCleanup(wrong.close)
        self.assert_refused_unsent(muster.Unauthorized,
                                   lambda: wrong.shared.update(SCOPE, name, big, level=2))
        e = self.assert_refused_unsent(muster.BodyTooLarge, lambda: self.via.shared.update(
            SCOPE, name, self.file("huge", 5 * MIB), level=2))
        self.assertIn("--max-blob-bytes", str(e))
        # The connection a refusal ended is not used again: the next upload works.
        self.assertEqual(self.via.shared.update(SCOPE, name, big, level=2)["size"], 3 * MIB)
        self.assertEqual(self.c.shared.get(SCOPE, name), big.read_bytes())

    def test_an_upload_the_head_takes_goes_after_its_100_continue(self):
        """The body waits for the 100 (never longer: the wait is made 120 s here, and the
        upload ends long before), from a path, bytes and a pipe (chunked)."""
        name = self.qname()
        data = os.urandom(MIB + 7)
        read_end, write_end = os.pipe()
        feeder = threading.Thread(target=self.feed, args=(write_end, data), daemon=True)
        pipe = open(read_end, "rb")
        self.addCleanup(pipe.close)
        uploads = [lambda: self.via.shared.set(SCOPE, name, self.file("src", 2 * MIB)),
                   lambda: self.via.shared.update(SCOPE, name, data, level=2),
                   lambda: self.via.shared.update(SCOPE, name, pipe, level=3)]
        feeder.start()
        with mock.patch.object(_continue, "CONTINUE_WAIT_S", 120.0):
            for level, upload in enumerate(uploads, start=1):
                self.proxy.reset()
                done = []
                t = threading.Thread(target=lambda: done.append(upload()))
                t.start()
                harness.wait_until(lambda: not t.is_alive(), timeout=30,
                                   what="upload %d to end (its 100 Continue unseen?)" % level)
                self.assertEqual(done[0]["level"], level)
                self.assertLess(self.proxy.up_before_continue(), HEAD_BYTES)
                self.assertGreater(self.proxy.sent_up(), MIB)
        feeder.join()
        self.assertEqual(self.c.shared.get(SCOPE, name), data)

    @staticmethod
    def feed(fd, data):
        with open(fd, "wb") as f:
            f.write(data)

    def test_a_small_upload_does_not_wait(self):
        self.proxy.reset()
        self.via.shared.set(SCOPE, self.qname(), b"x" * (64 * 1024))
        self.assertIsNone(self.proxy.up_before_continue())
        self.assertGreater(self.proxy.sent_up(), 64 * 1024)

    def test_through_a_node_agent(self):
        """The agent relays Expect (docs/node.md, "Any-node access"): the head's 100
        reaches the client before the body goes, and a refusal the head sends first
        reaches it before any of the body, as the head's error.  (Older agents answered
        the 100 themselves and read the body whole first; docs/python.md said so after
        that had changed.)"""
        agent = node_harness.Agent(self.head, self.dir, "pytest-expect", args=[
            "--cache-dir", os.path.join(self.dir, "cache")]).start()
        self.addCleanup(agent.kill)
        proxy = CountingProxy(int(agent.url.rsplit(":", 1)[1]))
        self.addCleanup(proxy.close)
        c = muster.Client(proxy.url, self.head.token)
        self.addCleanup(c.close)
        name, src = self.qname(), self.file("src", 2 * MIB)
        with mock.patch.object(_continue, "CONTINUE_WAIT_S", 120.0):
            self.assertEqual(c.shared.set(SCOPE, name, src)["level"], 1)
        self.assertLess(proxy.up_before_continue(), HEAD_BYTES)
        proxy.reset()
        with self.assertRaises(muster.VersionMismatch):
            c.shared.set(SCOPE, name, src)
        self.assertLess(proxy.sent_up(), HEAD_BYTES, "the refused body was sent to the agent")
        self.assertEqual(c.shared.update(SCOPE, name, src, level=2)["level"], 2)


class ServersThatIgnoreExpect(unittest.TestCase):
    def test_a_server_that_never_answers_100_gets_the_body_after_the_wait(self):
        data = os.urandom(200 * 1024)
        srv = ScriptedServer([json.dumps({"level": 1}).encode()])
        c = muster.Client(srv.url, "token-123456", timeout=10)
        with mock.patch.object(_continue, "CONTINUE_WAIT_S", 0.2):
            self.assertEqual(c.shared.set(SCOPE, "ignored", io.BytesIO(data)), {"level": 1})
        self.assertEqual(srv.bodies, [data])
        self.assertIn(b"\r\nExpect: 100-continue", srv.heads[0])
        c.close()

    def test_a_refusal_that_keeps_the_connection_open_is_not_reused(self):
        """A server that refuses before the body and keeps the connection: the next
        request goes on a new one (on the old one the server would take it for the
        body it still waits for)."""
        listener = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(listener.close)
        seen = {"accepts": 0, "on_the_refused": b""}

        def serve():
            refused, _ = listener.accept()
            seen["accepts"] += 1
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += refused.recv(65536)
            body = b'{"error": {"code": "forbidden", "message": "no"}}'
            refused.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            # Until the client connects again: what came on the refused connection
            # meanwhile (nothing, or its end; or the next request, sent on it).
            again = select.select([listener], [], [], 10)[0]
            refused.setblocking(False)
            try:
                seen["on_the_refused"] = refused.recv(65536)
            except BlockingIOError:
                pass
            refused.close()
            if not again:
                return
            second, _ = listener.accept()
            seen["accepts"] += 1
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += second.recv(65536)
            second.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 12\r\n\r\n{\"blobs\":[]}")
            second.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        c = muster.Client("http://127.0.0.1:%d" % listener.getsockname()[1], "t", timeout=10)
        with self.assertRaises(muster.Forbidden):
            c.shared.set(SCOPE, "refused", b"y" * (100 * 1024))
        self.assertEqual(c.shared.list(SCOPE), [])
        t.join(10)
        self.assertEqual(seen, {"accepts": 2, "on_the_refused": b""})
        c.close()

    def test_unsent_or_bad_interim_replies(self):
        """A connection closed before any reply, and a reply that is no HTTP, raise
        NetworkError; an interim reply other than 100 is skipped."""
        for answer, error in ((b"", "closed the connection"),
                              (b"SSH-2.0-OpenSSH\r\n", "SSH-2.0"),
                              (b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n",
                               None)):
            with self.subTest(answer=answer):
                srv = OneAnswer(answer)
                c = muster.Client(srv.url, "t", timeout=10)
                if error is None:
                    self.assertEqual(c.shared.set(SCOPE, "x", b"z" * 70000), {"level": 1})
                    self.assertEqual(srv.body_bytes, 70000)
                else:
                    with self.assertRaisesRegex(muster.NetworkError, error):
                        c.shared.set(SCOPE, "x", b"z" * 70000)
                c.close()
                srv.close()


class OneAnswer:
    """A server that answers a request's head with ``answer`` (closing the connection
    when it is empty), then reads the body and replies 201 with {"level": 1}."""

    def __init__(self, answer):
        self.answer, self.body_bytes = answer, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(65536)
            if not self.answer:
                return
            conn.sendall(self.answer)
            if not self.answer.endswith(b"100 Continue\r\n\r\n"):
                return
            length = int(buf.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            got = len(buf.partition(b"\r\n\r\n")[2])
            while got < length:
                piece = conn.recv(65536)
                if not piece:
                    return
                got += len(piece)
            self.body_bytes = got
            conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 12\r\n\r\n{\"level\": 1}")

    def close(self):
        self.listener.close()


if __name__ == "__main__":
    unittest.main()
