"""Any-node access: the agent's port forwards the API to the head, preserving status
codes, error bodies, headers that matter and auth; long-polls and large bodies pass;
a head that cannot be reached is a 503 `unavailable`.

On the wire (StreamTest, FakeHeadTest; the port is the head's own server, h1, since
evhttp served it): requests pipelined on one connection are answered in order and take
effect in order; a HEAD gets the GET's length and no body; bodies of 24 MiB (by
length) and 8 MiB (chunked) reach the head intact, and a 24 MiB reply the client; a
client waiting for `100 Continue` gets it; a client that reads slowly holds little of
the agent's memory (reading from the head pauses: evhttp buffered the whole reply); the
head's reply goes on to the client as the head sends it, and one that breaks off
mid-body (by length or chunked) closes the client's connection without a whole body;
headers a request or a reply names in its Connection are not passed on; a client that
reads nothing of a 64 MiB reply stops the head's writes after a few MiB, the agent
holding 256 KiB of it, and then reads every byte in order.
"""
import hashlib
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import (Agent, SharedAgentCase, loopback, stopped_reading,  # noqa: E402
                          tcp_queues)
from test_http_wire import Wire, chunked, request  # noqa: E402
from test_reply_bytes import asan_small_quarantine  # noqa: E402

MIB = 1 << 20
LONG_MIB = 64  # the fake head's long reply (GET /long), in MiB


class ForwardTest(SharedAgentCase):
    dir_prefix = "muster-fwd-test-"
    agent_name = "fwd"

    def test_health_without_token(self):
        r = self.agent.request("GET", "/v1/health", token=None)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["status"], "ok")
        self.assertIn("muster node", r.headers.get("Via", ""))

    def test_every_reply_says_what_sent_it(self):
        # The head's replies say "muster-head"; the agent passes them on with its own
        # Server in the head's place (one header, not two), so a client (the CLI's words:
        # "the node agent at URL") can tell an agent's URL from a head's.
        def servers(port, path):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request("GET", path, headers={"Authorization": "Bearer " + self.head.token})
                r = conn.getresponse()
                r.read()
                return r.msg.get_all("Server"), r.msg.get_all("Via"), r.status
            finally:
                conn.close()
        self.assertEqual(servers(self.head.port, "/v1/queues"), (["muster-head"], None, 200))
        self.assertEqual(servers(self.head.port, "/v1/nope")[0], ["muster-head"])
        for path, status in (("/v1/queues", 200), ("/v1/nope", 404)):
            got, via, code = servers(self.agent.port, path)
            self.assertEqual((got, code), (["muster-node"], status), path)
            self.assertIn("(muster node)", via[0])

    def test_auth_is_the_heads(self):
        r = self.agent.request("GET", "/v1/queues", token=None)
        self.assertEqual(r.status, 401, r)
        self.assertEqual(r.error_code, "unauthorized")
        self.assertIn("Bearer", r.headers.get("WWW-Authenticate", ""))
        r = self.agent.request("GET", "/v1/queues", token="wrong-token-123")
        self.assertEqual(r.status, 401, r)
        r = self.agent.request("GET", "/v1/queues")
        self.assertEqual(r.status, 200, r)

    def test_status_codes_and_error_bodies(self):
        r = self.agent.request("PUT", "/v1/queues/fq", {"lease_ms": 5000})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.headers.get("Content-Type"), "application/json")
        r = self.agent.request("PUT", "/v1/queues/fq", {"lease_ms": 6000})
        self.assertEqual(r.status, 200, r)
        r = self.agent.request("GET", "/v1/queues/nope")
        self.assertEqual((r.status, r.error_code), (404, "queue_not_found"), r)
        direct = self.head.request("GET", "/v1/queues/nope")
        self.assertEqual(r.json, direct.json)
        r = self.agent.request("POST", "/v1/queues/fq/tasks", raw=b"{not json")
        self.assertEqual((r.status, r.error_code), (400, "bad_json"), r)
        r = self.agent.request("POST", "/v1/queues/fq/tasks", raw=b"x", content_type="text/plain")
        self.assertEqual(r.status, 415, r)
        r = self.agent.request("GET", "/v1/no/such/endpoint")
        self.assertEqual(r.status, 404, r)
        r = self.agent.request("DELETE", "/v1/queues/fq")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["deleted"], "fq")

    def test_large_bodies_both_ways(self):
        self.assertIn(self.agent.request("PUT", "/v1/queues/big", {}).status, (200, 201))
        payload = "x" * 700000
        r = self.agent.request("POST", "/v1/queues/big/tasks", {"tasks": [{"payload": payload}]})
        self.assertEqual(r.status, 201, r)
        tid = r.json["tasks"][0]["id"]
        r = self.agent.request("GET", "/v1/tasks/%d" % tid)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json["payload"], payload)
        r = self.agent.request("POST", "/v1/queues/big/tasks",
                               {"tasks": [{"payload": "y" * 1100000}]})
        self.assertEqual((r.status, r.error_code), (413, "payload_too_large"), r)

    def test_long_poll_through_the_agent(self):
        self.assertIn(self.agent.request("PUT", "/v1/queues/lp", {}).status, (200, 201))
        got = {}

        def lease():
            got["reply"] = self.agent.request("POST", "/v1/queues/lp/lease", {"wait_ms": 15000})

        t = threading.Thread(target=lease)
        t.start()
        # Put once the lease is parked on the head (it shows as a waiting request there).
        harness.wait_until(lambda: t.is_alive(), what="lease started")
        r = self.head.request("POST", "/v1/queues/lp/tasks", {"tasks": [{"payload": "wake"}]})
        self.assertEqual(r.status, 201)
        t.join(20)
        self.assertFalse(t.is_alive())
        leases = got["reply"].json["leases"]
        if not leases:  # the put raced ahead of the parked lease: lease again
            leases = self.agent.request("POST", "/v1/queues/lp/lease", {}).json["leases"]
        self.assertEqual([l["payload"] for l in leases], ["wake"])

    def test_many_requests_reuse_connections(self):
        for i in range(50):
            r = self.agent.request("GET", "/v1/health")
            self.assertEqual(r.status, 200)


def vm_rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))


class StreamTest(SharedAgentCase):
    """Requests and replies on the agent's port, over raw sockets."""
    dir_prefix = "muster-fwd-test-"
    agent_name = "stream"

    def wire(self, **kw):
        return Wire(self.agent.port, **kw)

    def test_pipelined_requests_are_answered_in_order(self):
        put = {"tasks": [{"payload": "first"}, {"payload": "second"}]}
        with self.wire() as w:
            w.send(request("PUT", "/v1/queues/pipe", self.token, {}) +
                   request("POST", "/v1/queues/pipe/tasks", self.token, put) +
                   request("POST", "/v1/queues/pipe/lease", self.token, {"max": 1}) +
                   request("GET", "/v1/queues/pipe", self.token) +
                   request("POST", "/v1/queues/pipe/lease", self.token,
                           {"wait_ms": 300, "max": 5}) +
                   request("GET", "/v1/health"))
            replies = [w.read_reply() for _ in range(6)]
        self.assertEqual([r.status for r in replies], [201, 201, 200, 200, 200, 200], replies)
        self.assertEqual([l["payload"] for l in replies[2].json["leases"]], ["first"])
        self.assertEqual(replies[3].json["counts"]["leased"], 1, replies[3])
        self.assertEqual([l["payload"] for l in replies[4].json["leases"]], ["second"])
        self.assertEqual(replies[5].json["status"], "ok")

    def test_a_head_request_gets_the_length_and_no_body(self):
        with self.wire() as w:
            w.send(request("HEAD", "/v1/health") + request("GET", "/v1/health"))
            head = w.read_reply("HEAD")
            get = w.read_reply()
        self.assertEqual((head.status, head.body), (200, b""), head)
        self.assertEqual(head.header("Content-Length"), str(len(get.body)), (head, get))
        self.assertEqual(get.json["status"], "ok", get)

    def put_blob(self, name, data, framing):
        path = "/v1/shared/fwd/%s" % name
        if framing == "chunked":
            raw = request("PUT", path, self.token, chunked(data, 65536),
                          headers=["Transfer-Encoding: chunked"],
                          ctype="application/octet-stream")
        else:
            raw = request("PUT", path, self.token, data, ctype="application/octet-stream")
        with self.wire(timeout=120) as w:
            w.send(raw)
            return w.read_reply()

    def test_big_bodies_are_forwarded_intact(self):
        for name, size, framing in (("by-length", 24 << 20, "length"),
                                    ("chunked", 8 << 20, "chunked")):
            with self.subTest(framing):
                data = os.urandom(size)
                r = self.put_blob(name, data, framing)
                self.assertEqual(r.status, 201, r)
                back = self.head.request("GET", "/v1/shared/fwd/" + name)
                self.assertEqual(back.status, 200, back.headers)
                self.assertEqual(hashlib.sha256(back.raw).hexdigest(),
                                 hashlib.sha256(data).hexdigest())
        # The reply's way: ?level=01 is not the node cache's, so the head answers it.
        with self.wire(timeout=120) as w:
            w.send(request("GET", "/v1/shared/fwd/by-length?level=01", self.token))
            r = w.read_reply()
        self.assertEqual((r.status, len(r.body)), (200, 24 << 20), r.headers)
        self.assertIn("(muster node)", r.header("Via"))

    def test_a_client_waiting_for_100_continue(self):
        body = json.dumps({"tasks": [{"payload": "continued"}]}).encode()
        self.assertIn(self.head.request("PUT", "/v1/queues/cont", {}).status, (200, 201))
        with self.wire() as w:
            data = request("POST", "/v1/queues/cont/tasks", self.token, body,
                           headers=["Expect: 100-continue"])
            w.send(data[:-len(body)])
            r = w.read_reply(interim=True)
            self.assertEqual(r.status, 100, r)
            w.send(body)
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)

    def test_a_slow_reader_holds_little_of_the_agent(self):
        # While its client reads nothing, the agent stops reading the head once
        # H1_STREAM_HIGH (256 KiB) of the reply waits for the client (forward.c,
        # fwd_on_body: h1_respond_full, up_read): its socket to the head leaves its epoll
        # set with the head's bytes waiting in it (stopped_reading), and only then is its
        # memory looked at.  Without the pause that never happens, however loaded the
        # machine: the agent reads the whole 64 MiB, and the wait ends when its memory
        # grew past the bound instead.
        size = 64 << 20
        r = self.head.request("PUT", "/v1/shared/fwd/slow", raw=os.urandom(size),
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        pid = self.agent.proc.pid
        before = vm_rss_kib(pid)
        rss, seen = [before], []

        def stopped_or_grown():
            # A pause seen once is the proof: the agent may read on a moment later, as
            # the kernel's buffers on the way to the client take a little more.
            seen.append(stopped_reading(pid, remote_port=self.head.port))
            rss.append(vm_rss_kib(pid))
            return seen[-1] or rss[-1] - before >= 24 << 10

        with self.wire(timeout=120, rcvbuf=65536) as w:
            w.send(request("GET", "/v1/shared/fwd/slow?level=01", self.token))
            harness.wait_until(stopped_or_grown, timeout=120,
                               what="the agent to stop reading the head (or to grow)")
            self.assertTrue(seen[-1],
                            "the agent read the head on while its client read nothing "
                            "(it grew by %d KiB)" % (max(rss) - before))
            most = max(rss + [vm_rss_kib(pid)])
            r = w.read_reply()
        self.assertEqual((r.status, len(r.body)), (200, size), r.headers)
        self.assertLess(most - before, 24 << 10,
                        "the agent grew by %d KiB while its client read nothing"
                        % (most - before))


def chunks_so_far(body):
    """The data of a chunked body that may be cut anywhere (the agent passes a reply
    on in pieces of its own sizes, whose hex may hold a 'c')."""
    data = b""
    while b"\r\n" in body:
        line, _, body = body.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        data += body[:size]
        body = body[size + 2:]
    return data


def long_piece(i):
    """MiB `i` of the long reply: a pattern of its own, so that a byte lost, repeated or
    moved shows in the MiB it lands in."""
    return hashlib.sha256(b"%d" % i).digest() * (MIB // 32)


class LongReply:
    """The fake head's long reply (GET /long): LONG_MIB MiB by length, written on a
    non-blocking socket with a small send buffer, so that the head's own kernel buffer
    holds little of it.  `sent` counts the bytes the socket took; `blocked_since` is
    when the head last found its socket full with bytes left to send (None while it
    sends); `ports` are the connection's, the head's and the agent's, once the request
    came."""

    def __init__(self):
        self.sent = 0
        self.blocked_since = None
        self.ports = None
        self.error = None
        self.done = threading.Event()
        self.head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: %d\r\n\r\n" % (LONG_MIB * MIB))
        self.total = len(self.head) + LONG_MIB * MIB

    def send(self, conn):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        conn.setblocking(False)
        self.ports = (conn.getsockname()[1], conn.getpeername()[1])
        pending, i = memoryview(self.head), 0
        try:
            while pending or i < LONG_MIB:
                if not pending:
                    pending, i = memoryview(long_piece(i)), i + 1
                try:
                    n = conn.send(pending)
                except BlockingIOError:
                    if self.blocked_since is None:
                        self.blocked_since = time.monotonic()
                    select.select([], [conn], [], 1.0)
                    continue
                self.blocked_since = None
                self.sent += n
                pending = pending[n:]
        except OSError as e:  # the agent went away
            self.error = e
        finally:
            conn.setblocking(True)
            self.done.set()

    def blocked_for(self):
        """Seconds the head has found its socket full, with bytes left to send."""
        since = self.blocked_since
        return 0.0 if since is None else time.monotonic() - since


class FakeHead:
    """A stand-in head on a free port that answers GET /cut/length, /cut/chunked, /slow,
    /echo, /hop and /long as the test needs (a reply that breaks off, one sent in two
    parts, one with hop-by-hop headers, one that names a hop-by-hop header in its
    Connection, a long one: LongReply; `heads` keeps the request heads it got) and 503
    to anything else (the agent's registration, which it retries)."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.token = "fake-head-token"
        self.go_on = threading.Event()
        self.heads = []
        self.long = LongReply()
        self.stopped = False
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while not self.stopped:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                piece = conn.recv(65536)
                if not piece:
                    return
                data += piece
            self.heads.append(data.split(b"\r\n\r\n")[0])
            path = data.split(b" ")[1]
            if path == b"/echo":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Reply: yes\r\n"
                             b"Keep-Alive: timeout=5\r\nContent-Length: 4\r\n\r\necho")
            elif path == b"/hop":
                conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: keep-alive ,x-HOP\t\r\n"
                             b"X-Hop: 1\r\nX-Keep: 1\r\nContent-Length: 3\r\n\r\nhop")
            elif path == b"/cut/length":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: 100000\r\n\r\n" + b"c" * 50000)
            elif path == b"/cut/chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"1000\r\n" + b"c" * 4096 + b"\r\n")
            elif path == b"/slow":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: 10\r\n\r\nfirst")
                self.go_on.wait(30)
                conn.sendall(b"later")
            elif path == b"/long":
                self.long.send(conn)
            else:
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                             b"application/json\r\nContent-Length: 2\r\nConnection: close"
                             b"\r\n\r\n{}")
            try:
                conn.shutdown(socket.SHUT_WR)
                conn.recv(1)  # until the agent closes its side
            except OSError:  # the agent went away first (killed at a test's end)
                pass

    def stop(self):
        self.stopped = True
        self.go_on.set()
        self.listener.close()


class FakeHeadTest(unittest.TestCase):
    """The head's reply as the client sees it through the agent, from a head that
    breaks off or pauses mid-body."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        self.head = FakeHead()
        self.agent = Agent(self.head, self.dir, "fake",
                           args=["--cache-dir", os.path.join(self.dir, "cache")],
                           env=asan_small_quarantine()).start()

    def tearDown(self):
        self.agent.kill()
        self.head.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_a_reply_broken_mid_body_closes_the_connection(self):
        for path, got, framing in (("/cut/length", 50000, b"Content-Length: 100000\r\n"),
                                   ("/cut/chunked", 4096, b"Transfer-Encoding: chunked\r\n")):
            with self.subTest(path), Wire(self.agent.port) as w:
                w.send(request("GET", path))
                sent = w._until_eof()  # the connection ends
                head, _, body = sent.partition(b"\r\n\r\n")
                self.assertTrue(head.startswith(b"HTTP/1.1 200 OK\r\n"), head)
                self.assertIn(framing, head + b"\r\n")
                # What the head sent, and no end of the body: a client sees it cut.
                data = chunks_so_far(body) if b"chunked" in framing else body
                self.assertEqual(data.count(b"c"), got, body[-40:])
                self.assertFalse(body.endswith(b"0\r\n\r\n"), body[-40:])

    def test_headers_both_ways(self):
        with Wire(self.agent.port) as w:
            w.send(request("GET", "/echo", headers=[
                "X-Forwarded-For: 10.0.0.9", "X-Custom: kept", "Proxy-Connection: x",
                "TE: trailers", "Keep-Alive: 300"]))
            r = w.read_reply()
        self.assertEqual((r.status, r.body, r.header("X-Reply")), (200, b"echo", "yes"), r)
        self.assertIn("1.1 fake (muster node)", r.header("Via"))
        self.assertIsNone(r.header("Keep-Alive"), r)
        self.assertEqual(len(r.header_all("Date")), 1, r)
        got = [h for h in self.head.heads if h.startswith(b"GET /echo ")][0].decode()
        lines = got.split("\r\n")
        self.assertIn("X-Forwarded-For: 10.0.0.9, 127.0.0.1", lines)
        self.assertIn("X-Custom: kept", lines)
        self.assertIn("Host: 127.0.0.1:%d" % self.head.port, lines)
        for hop in ("Proxy-Connection", "TE", "Keep-Alive"):
            self.assertFalse([l for l in lines if l.lower().startswith(hop.lower() + ":")],
                             got)

    def test_headers_named_in_connection_are_dropped_both_ways(self):
        with Wire(self.agent.port) as w:
            w.send(request("GET", "/hop", headers=[
                "Connection: X-Hop", "X-Hop: 1", "X-Keep: 1",
                "Connection:  x-other ,\tX-ALSO", "X-Other: 1", "X-Also: 1"]))
            r = w.read_reply()
        self.assertEqual((r.status, r.body), (200, b"hop"), r)
        # The reply named X-Hop in its Connection (in another case, after a space).
        self.assertEqual(r.header("X-Keep"), "1", r)
        self.assertIsNone(r.header("X-Hop"), r)
        got = [h for h in self.head.heads if h.startswith(b"GET /hop ")][0].decode()
        names = [l.split(":")[0].lower() for l in got.split("\r\n")[1:]]
        self.assertIn("x-keep", names, got)
        for hop in ("x-hop", "x-other", "x-also", "connection"):
            self.assertNotIn(hop, names, got)

    def test_a_reply_streams_as_the_head_sends_it(self):
        with Wire(self.agent.port) as w:
            w.send(request("GET", "/slow"))
            head = w.read_head()
            self.assertEqual((head.status, head.header("Content-Length")), (200, "10"), head)
            self.assertEqual(w._exact(5), b"first")  # before the head sends the rest
            self.head.go_on.set()
            self.assertEqual(w._exact(5), b"later")
            w.send(request("GET", "/v1/health"))  # the connection goes on
            self.assertEqual(w.read_reply().status, 503)

    def agent_holds(self, w):
        """Bytes of the long reply in the agent's own memory: what the head sent, less
        what the kernel holds on the two connections (the head's to the agent, the
        agent's to the client), which the client has not read.  Exact while nothing
        moves, give or take the difference between the two replies' heads."""
        queues = tcp_queues()
        (head, agent), client = self.head.long.ports, w.sock.getsockname()[1]
        pairs = ((head, agent), (agent, head), (self.agent.port, client),
                 (client, self.agent.port))
        kernel = sum(sum(queues.get((loopback(local), loopback(remote)), (0, 0)))
                     for local, remote in pairs)  # a connection closed holds nothing
        return self.head.long.sent - kernel

    def test_a_long_reply_goes_as_fast_as_the_client_reads(self):
        # The agent passes the head's reply on only as fast as its client reads it:
        # while the client reads nothing, the agent stops reading the head, so the
        # head's writes block and the agent holds a few hundred KiB of the reply
        # (forward.c, fwd_on_body: h1_respond_full, up_read).  Without the pause the
        # agent reads all 64 MiB into its memory and the head's writes never block.
        pid = self.agent.proc.pid
        before = vm_rss_kib(pid)
        with Wire(self.agent.port, timeout=120, rcvbuf=65536) as w:
            w.send(request("GET", "/long"))
            reply = self.head.long
            # A deadline for something that must not happen: the head, once blocked,
            # writing again while the client reads nothing.  With the pause it never
            # does (nothing reads the agent's socket to the head until the client
            # reads); without it the agent reads on at once and the head sends all of
            # the reply, so the wait ends at `done`.  2 s is room for a loaded
            # machine's scheduling: a broken agent that slept through it would pass,
            # a working one never fails for it.
            harness.wait_until(lambda: reply.blocked_for() >= 2.0 or reply.done.is_set(),
                               timeout=120, what="the head's writes blocking")
            self.assertFalse(reply.done.is_set(),
                             "the head sent all %d MiB (%s) while the client read nothing"
                             % (LONG_MIB, reply.error or "no error"))
            held = self.agent_holds(w)
            grew = vm_rss_kib(pid) - before
            # The agent's part: up to H1_STREAM_HIGH (256 KiB) waiting for the client,
            # a last piece and the last read of the head (256 KiB at most).
            self.assertLess(held, 2 * MIB, "the agent holds %d KiB of the reply (%d KiB "
                            "sent by the head)" % (held >> 10, reply.sent >> 10))
            self.assertLess(grew, 16 << 10, "the agent grew by %d KiB" % grew)
            r = w.read_head()
            self.assertEqual((r.status, r.header("Content-Length")),
                             (200, str(LONG_MIB * MIB)), r)
            for i in range(LONG_MIB):
                if w._exact(MIB) != long_piece(i):
                    self.fail("MiB %d of the reply is not the head's" % i)
            self.assertTrue(reply.done.wait(60), "the head's reply did not end")
        self.assertEqual((reply.sent, reply.error), (reply.total, None))


class StopWithHeartbeatUnansweredTest(unittest.TestCase):
    """An agent stopped while its heartbeat waits on a head that does not answer."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        # A node timeout of 900 ms: a heartbeat every 300 ms.
        self.head = harness.Head(["--node-timeout-ms", "900"]).start()
        self.agent = Agent(self.head, self.dir, "beating").start()

    def tearDown(self):
        self.agent.kill()
        os.kill(self.head.proc.pid, signal.SIGCONT)
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def unread_by_head(self):
        """Bytes sent to the head on its accepted connections that it has not read:
        the rx_queue of its established sockets (state 01) in /proc/net/tcp."""
        port = "%04X" % urllib.parse.urlparse(self.head.url).port
        with open("/proc/net/tcp") as f:
            return sum(int(fields[4].split(":")[1], 16) for fields in
                       (line.split() for line in f.readlines()[1:])
                       if fields[1].endswith(":" + port) and fields[3] == "01")

    def test_stop_does_not_wait_out_the_heartbeat(self):
        # The stop joins the thread that sends heartbeats.  With libmuster's default
        # request timeout (60 s) a heartbeat to a head that stopped answering held the
        # agent's exit for a minute; the agent's own 5 s bound (and its goodbye's 3 s)
        # end it well within the 15 s given here.  Registered first (Agent.registered):
        # before that, what waits unread at the head is the registration, not a heartbeat.
        harness.wait_until(self.agent.registered,
                           what=lambda: "the agent registered:\n" + self.agent.log())
        os.kill(self.head.proc.pid, signal.SIGSTOP)
        # A call the head read just before it stopped holds the next one back for the
        # agent's 5 s request timeout: wait past that.
        harness.wait_until(lambda: self.unread_by_head() > 0, timeout=20,
                           what="a heartbeat sent")
        self.assertEqual(self.agent.stop(timeout=15), 0, self.agent.log())


class StopWhileForwardingTest(unittest.TestCase):
    """An agent stopped (SIGTERM) with a forwarded long-poll parked at the head."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        self.head = harness.Head().start()
        self.agent = Agent(self.head, self.dir, "stopping",
                           args=["--cache-dir", os.path.join(self.dir, "cache")]).start()

    def tearDown(self):
        self.agent.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def lease_waiters(self):
        text = self.head.request("GET", "/metrics").raw.decode()
        return int(re.search(r"^muster_lease_waiters (\d+)$", text, re.M).group(1))

    def assert_stop_reply(self, got):
        """The client waiting when the agent stopped got the stop's 503 (which clients
        retry), not a connection closed under its request."""
        self.assertNotIn("error", got, self.agent.log())
        r = got["reply"]
        self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
        self.assertIn("is stopping", r.json["error"]["message"])
        self.assertEqual(r.headers.get("Retry-After"), "1", r.headers)
        self.assertEqual(r.headers.get("Connection"), "close", r.headers)

    def test_stop_with_a_long_poll_in_flight_exits_cleanly(self):
        # The forwarded request and its connection to the head were never freed: a
        # leak at exit, which the sanitizer build's leak check turns into exit
        # status 1 (the whole suite runs under it).  And its client had its
        # connection closed (the 503 the agent queued was never written: the loop
        # had ended) instead of an answer it knows to retry.
        self.assertIn(self.agent.request("PUT", "/v1/queues/parked", {}).status, (200, 201))
        got = {}

        def lease():
            try:
                got["reply"] = self.agent.request("POST", "/v1/queues/parked/lease",
                                                  {"wait_ms": 60000}, timeout=30)
            except (OSError, http.client.HTTPException) as e:  # the agent closed it
                got["error"] = e

        t = threading.Thread(target=lease)
        t.start()
        harness.wait_until(lambda: self.lease_waiters() == 1, what="the lease parked at the head")
        self.assertEqual(self.agent.stop(), 0, self.agent.log())
        t.join(10)  # the agent's end closes the client's connection, if nothing else
        self.assertFalse(t.is_alive(), "the client still waits for the stopped agent")
        self.assert_stop_reply(got)
        self.assertNotIn("LeakSanitizer", self.agent.log())
        # The head's long-poll went with the agent's connection to it.
        harness.wait_until(lambda: self.lease_waiters() == 0, what="the head's waiter gone")

    def head_backlog(self):
        """Connections to the head that it has not accepted: the rx_queue of its
        listening socket (state 0A) in /proc/net/tcp."""
        port = "%04X" % urllib.parse.urlparse(self.head.url).port
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1].endswith(":" + port) and fields[3] == "0A":
                    return int(fields[4].split(":")[1], 16)
        return 0

    def test_stop_with_a_cache_question_in_flight_exits_cleanly(self):
        # The node cache's HEAD to the head (is the level there?) was never freed,
        # nor the client's request waiting on it: a leak at exit, as above.
        r = self.head.request("PUT", "/v1/shared/s/blob", raw=b"x" * 1000,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        os.kill(self.head.proc.pid, signal.SIGSTOP)  # it accepts no connection meanwhile
        try:
            self.stop_with_a_read_waiting()
        finally:
            os.kill(self.head.proc.pid, signal.SIGCONT)

    def stop_with_a_read_waiting(self):
        got = {}

        def read():
            try:
                got["reply"] = self.agent.request("GET", "/v1/shared/s/blob", timeout=30)
            except (OSError, http.client.HTTPException) as e:
                got["error"] = e

        t = threading.Thread(target=read)
        t.start()
        # The agent's first connection to the head of its own: the HEAD waits on it.
        harness.wait_until(lambda: self.head_backlog() >= 1, what="the agent's HEAD sent")
        self.assertEqual(self.agent.stop(), 0, self.agent.log())
        t.join(10)
        self.assertFalse(t.is_alive(), "the client still waits for the stopped agent")
        self.assert_stop_reply(got)
        self.assertNotIn("LeakSanitizer", self.agent.log())


class UnreachableHeadTest(unittest.TestCase):
    def test_head_down_is_503(self):
        d = tempfile.mkdtemp(prefix="muster-fwd-test-")
        head = harness.Head().start()
        agent = Agent(head, d, "orphan").start()
        try:
            head.stop()
            r = agent.request("GET", "/v1/queues")
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            self.assertIn("cannot reach the head", r.json["error"]["message"])
            self.assertEqual(r.headers.get("Server"), "muster-node")  # the agent's own reply
        finally:
            agent.kill()
            head.cleanup()
            shutil.rmtree(d, ignore_errors=True)

    def test_a_cached_level_needs_the_head_too_and_says_so(self):
        # A level in the agent's cache is served only once the head said that the token may
        # read it and that it still exists, so with the head down the read is refused: the
        # message says that the cache does not help and that the read is to be retried (the
        # agent does not retry itself), in the headers too, for a HEAD's sake.
        d = tempfile.mkdtemp(prefix="muster-fwd-test-")
        head = harness.Head().start()
        agent = Agent(head, d, "orphan", args=["--cache-dir", os.path.join(d, "cache")]).start()
        try:
            r = head.request("PUT", "/v1/shared/models/w", raw=b"bytes",
                             content_type="application/octet-stream")
            self.assertEqual(r.status, 201, r)
            r = agent.request("GET", "/v1/shared/models/w")
            self.assertEqual((r.status, r.raw, r.headers.get("X-Muster-Cache")),
                             (200, b"bytes", "miss"))
            head.stop()
            r = agent.request("GET", "/v1/shared/models/w")
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            message = r.json["error"]["message"]
            self.assertEqual(message,
                             "node agent orphan cannot reach the head at 127.0.0.1:%d: a read "
                             "of shared data needs the head even when the agent has the level "
                             "cached (the head checks the token and that the level still "
                             "exists, and names the newest); the agent does not retry by "
                             "itself: retry the read once the head is back" % head.port)
            self.assertEqual((r.headers.get("X-Muster-Error-Code"),
                              r.headers.get("X-Muster-Error")), ("unavailable", message))
            r = agent.request("GET", "/v1/node/cache")
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            self.assertIn("which checks the token of every request, the cache's statistics "
                          "included; retry once the head is back", r.json["error"]["message"])
            # A HEAD (forwarded to the head) gets the agent's refusal in its headers.
            r = agent.request("HEAD", "/v1/shared/models/w")
            self.assertEqual((r.status, r.raw, r.headers.get("X-Muster-Error-Code")),
                             (503, b"", "unavailable"))
            self.assertIn("cannot reach the head", r.headers.get("X-Muster-Error"))
        finally:
            agent.kill()
            head.cleanup()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
