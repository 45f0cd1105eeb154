"""The node agent's port under malformed and hostile input (src/node/port.c, on the head's
own HTTP/1.1 server, src/server/h1.c, since evhttp served it): each case below was found
by fuzzing the agent's port over raw sockets, or is what evhttp did differently from the
head, and each test fails without its fix.

- What evhttp refused itself was answered with an HTML page (400, 413, 417, 501) or
  nothing (CONNECT): a malformed request line or header line, no version, a bad or
  doubled length, a broken chunk, an unknown method or Transfer-Encoding, HTTP/2.0.
  Each is answered in the JSON envelope now, as on the head, and the connection closes.
  An unknown method is forwarded, and the head answers 405 in the envelope (the agent
  answered 501 itself while evhttp's client, which sends only the methods it knows,
  carried its requests).
- A request line and headers over 64 KiB (the head's limit) get 431 in the envelope
  at once (evhttp read up to 1 MiB and answered 400 with HTML).
- Read deadlines, as on the head (TimeoutTest, an agent with 300 ms limits from
  MUSTER_HTTP_HEAD_TIMEOUT_MS / MUSTER_HTTP_BODY_TIMEOUT_MS and a 1 s idle time from
  MUSTER_HTTP_IDLE_TIMEOUT_MS): a head trickled past its limit and a body that stalls
  get 408 in the envelope, an idle connection is closed after the idle time (evhttp:
  an hour for all three); a forwarded long-poll longer than the idle time is not cut,
  nor a body sent slowly but steadily; a bad setting is refused with a warning.

- A client that half-closes its connection after its request (`nc -N`, a script's
  shutdown(SHUT_WR)) gets the whole reply: a level read from the node cache (the miss
  streamed while it is fetched, the hit sent from its file) and a large forwarded reply.
  evhttp took the end of the client's input for the client gone and dropped the
  connection after the reply's headers.
- A request in another HTTP version than 1.1 or 1.0 (HTTP/0.9, HTTP/1.2) is refused 505
  in the envelope on an HTTP/1.1 status line, and the connection closes, as the head
  does; it was forwarded and applied, and answered "HTTP/0.9 201 Created".  HTTP/1.0 is
  served, on an HTTP/1.1 status line as the head answers it.
- TRACE goes to the head, which answers 405 in the envelope (evhttp: 501 and HTML).
- A refusal the head sends before it read the whole request (413 for a body over its
  HTTP layer's limit) reaches the client; the agent answered 503 "cannot reach the head"
  when its write of the rest failed.
- A header section that never ends is refused once past 64 KiB (431 in the envelope):
  evhttp read it into memory for as long as the client sent.
- The agent's own answer to a HEAD (503: the head cannot be reached) has no body; evhttp
  wrote it after headers without a length, and the next reply on the connection could
  not be read.  The message says the agent could not connect ("request failed" before).
- Out of descriptors, the port pauses accepting and says so once; libevent retried
  accept() at once, spinning, and logged a line each time (megabytes a second), and the
  port accepts again once descriptors are free.
- A query byte that is no UTF-8 (held?rank=%FF) reads '?' in the message, as on the
  head, instead of the parameter being reported missing; a field name cut inside a
  character by a message's length limit still gets the error envelope (see also
  test_api_badinput test_bytes_that_are_not_utf8_are_quoted).
"""
import json
import os
import resource
import select
import shutil
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent, SharedAgentCase  # noqa: E402
from test_http_wire import Closed, Wire, request  # noqa: E402

HEAD_MAX_BODY = 65536  # the head's HTTP layer then refuses bodies over 4 x 64 KiB + 64 KiB


class AgentWireCase(SharedAgentCase):
    """One head and one agent for the class (SharedAgentCase)."""
    dir_prefix = "muster-node-wire-test-"
    agent_name = "wire"

    def wire(self, **kw):
        return Wire(self.agent.port, **kw)

    def assert_envelope(self, r, status, code):
        """`r`: a raw reply (test_http_wire.Reply) or the harness's."""
        self.assertEqual((r.status, r.error_code), (status, code), r)
        ctype = r.header("Content-Type") if hasattr(r, "header") else r.headers["Content-Type"]
        self.assertEqual(ctype, "application/json", r)
        self.assertIsInstance(r.json["error"]["message"], str, r)


class HalfCloseTest(AgentWireCase):
    def read_half_closed(self, path):
        """GET `path` through the agent, the client's side shut once the request is
        sent; the reply as it arrived."""
        with self.wire() as w:
            w.send(request("GET", path, self.token, headers=["Connection: close"]))
            w.sock.shutdown(socket.SHUT_WR)
            try:
                return w.read_reply()
            except Closed as e:
                self.fail("GET %s: the agent closed the connection inside its reply: %s"
                          % (path, e))

    def test_half_closed_client_gets_the_whole_reply(self):
        data = os.urandom(600000)
        r = self.head.request("PUT", "/v1/shared/hc/blob", raw=data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        for how in ("miss", "hit"):  # streamed while fetched, then sent from the file
            r = self.read_half_closed("/v1/shared/hc/blob")
            self.assertEqual((r.status, r.header("X-Muster-Cache")), (200, how), r)
            self.assertEqual(len(r.body), len(data), how)
            self.assertTrue(r.body == data, how)
        self.assertIn(self.head.request("PUT", "/v1/queues/hcq", {}).status, (200, 201))
        payload = "p" * 900000
        r = self.head.request("POST", "/v1/queues/hcq/tasks", {"tasks": [{"payload": payload}]})
        self.assertEqual(r.status, 201, r)
        r = self.read_half_closed("/v1/tasks/%d" % r.json["tasks"][0]["id"])
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["payload"], payload)


class RefusalsTest(AgentWireCase):
    head_args = ["--max-body", str(HEAD_MAX_BODY)]
    def test_versions_other_than_http_1_x_are_refused(self):
        self.assertIn(self.head.request("PUT", "/v1/queues/vq", {}).status, (200, 201))
        for version in ("HTTP/0.9", "HTTP/1.2"):
            with self.subTest(version=version), self.wire() as w:
                w.send(request("POST", "/v1/queues/vq/tasks", self.token,
                               {"tasks": [{"payload": version}]}, version=version))
                r = w.read_reply()
                self.assertEqual(r.version, "HTTP/1.1", r)
                self.assert_envelope(r, 505, "bad_request")
                self.assertIn("this server speaks HTTP/1.1 and HTTP/1.0",
                              r.json["error"]["message"])
                self.assertTrue(r.closes(), r)
                self.assertTrue(w.closed_after())
        tasks = self.head.request("GET", "/v1/queues/vq/tasks").json["tasks"]
        self.assertEqual(tasks, [], "a request refused for its version was applied")
        with self.wire() as w:  # HTTP/1.0 is served
            w.send(request("POST", "/v1/queues/vq/tasks", self.token,
                           {"tasks": [{"payload": "1.0"}]}, version="HTTP/1.0"))
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assertTrue(r.closes(), r)

    def test_trace_is_answered_by_the_head(self):
        with self.wire() as w:
            w.send(request("TRACE", "/v1/queues", self.token))
            r = w.read_reply()
            self.assert_envelope(r, 405, "method_not_allowed")
            self.assertIn("TRACE is not allowed on this endpoint", r.json["error"]["message"])
            self.assertEqual(r.header("Allow"), "GET, HEAD", r)

    def test_the_heads_early_refusal_reaches_the_client(self):
        # The head answers a body over its HTTP layer's limit before reading it, and
        # closes; the agent, still writing that body, must pass the answer on.
        body = b'{"tasks": [{"payload": "' + b"x" * (32 << 20) + b'"}]}'
        with self.wire(timeout=60) as w:
            w.send(request("POST", "/v1/queues/vq/tasks", self.token, body))
            r = w.read_reply()
        self.assert_envelope(r, 413, "body_too_large")
        self.assertIn("the head takes at most", r.json["error"]["message"])

    def test_an_endless_header_section_is_cut_off(self):
        # Refused once past the head's limit (64 KiB), answered while the client still
        # sends: the reply is readable before 1 MiB went.
        sent = 0
        with self.wire() as w:
            w.sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            while sent < 1 << 20 and not select.select([w.sock], [], [], 0.05)[0]:
                w.send(b"x" * 16384)
                sent += 16384
            self.assertLess(sent, 1 << 20, "no answer to a header section of 1 MiB")
            r = w.read_reply()
            self.assert_envelope(r, 431, "bad_request")
            self.assertIn("over 65536 bytes", r.json["error"]["message"])
            self.assertTrue(r.closes(), r)


class EnvelopeTest(AgentWireCase):
    """What evhttp refused with an HTML page (or not at all) is answered in the JSON
    envelope, as on the head, and nothing is forwarded."""

    def refused(self, data, status, code, closes=True):
        with self.wire() as w:
            w.send(data)
            r = w.read_reply()
            self.assert_envelope(r, status, code)
            if closes:
                self.assertTrue(r.closes(), r)
                self.assertTrue(w.closed_after())
        return r

    def test_malformed_requests(self):
        self.assertIn(self.head.request("PUT", "/v1/queues/mq", {}).status, (200, 201))
        put = request("POST", "/v1/queues/mq/tasks", self.token, {"tasks": [{"payload": 1}]})
        head, body = put.split(b"\r\n\r\n", 1)
        cases = [
            ("garbage line", b"garbage\r\n\r\n", 400),
            ("no version", b"GET /v1/health\r\n\r\n", 400),
            ("no colon", b"GET /v1/health HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400),
            ("space in a name", b"GET /v1/health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
             400),
            ("no Host", b"GET /v1/health HTTP/1.1\r\n\r\n", 400),
            ("negative length", head.replace(b"Content-Length: ", b"Content-Length: -")
             + b"\r\n\r\n" + body, 400),
            ("two lengths", head + b"\r\nContent-Length: 3\r\n\r\n" + body, 400),
            ("length and chunked", head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + body,
             400),
            ("gzip", head.replace(b"Content-Length: %d" % len(body),
                                  b"Transfer-Encoding: gzip") + b"\r\n\r\n" + body, 501),
            ("HTTP/2.0", b"GET /v1/health HTTP/2.0\r\nHost: x\r\n\r\n", 505),
            ("CONNECT", b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            ("TLS", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
        ]
        for name, data, status in cases:
            with self.subTest(name):
                self.refused(data, status, "bad_request")
        chunked = head.replace(b"Content-Length: %d" % len(body), b"Transfer-Encoding: chunked")
        with self.subTest("bad chunk size"):
            r = self.refused(chunked + b"\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n", 400,
                             "bad_request")
            self.assertIn("chunked body is malformed", r.json["error"]["message"])
        tasks = self.head.request("GET", "/v1/queues/mq/tasks").json["tasks"]
        self.assertEqual(tasks, [], "a refused request was forwarded")

    def test_an_unknown_method_is_the_heads_to_answer(self):
        # evhttp's client sent only the methods it knew: the agent answered another 501
        # itself.  Its own client sends any: the head answers 405, as to a client of its own.
        r = self.refused(request("FROBNICATE", "/v1/queues", self.token), 405,
                         "method_not_allowed", closes=False)
        self.assertIn("FROBNICATE is not allowed on this endpoint", r.json["error"]["message"])
        self.assertIn("muster node", r.header("Via"))

    def test_a_body_the_agent_reads_whole_has_the_heads_default_limit(self):
        # The requests the agent serves itself (its cache, iterations) are read whole
        # before they are routed: up to 8 MiB, the head's default --max-body (it read up
        # to 1 GiB, which any client could make it hold, token or not).  The refusal
        # comes before the body, by its length, and as a chunked body passes the limit.
        big = (8 << 20) + 1
        r = self.refused(request("POST", "/v1/iterations", self.token,
                                 headers=["Content-Length: %d" % big]), 413, "body_too_large")
        self.assertIn("the body is %d bytes; node agent" % big, r.json["error"]["message"])
        self.assertIn("reads at most 8388608 of a request for its cache or an iteration "
                      "(send a bigger one to the head)", r.json["error"]["message"])
        chunk = b"x" * (1 << 20)
        with self.wire(timeout=60) as w:
            w.send(request("POST", "/v1/iterations", self.token,
                           headers=["Transfer-Encoding: chunked"]))
            try:
                for _ in range(9):
                    w.send(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            except OSError:
                pass  # refused and closed while the client still sent: read the reply
            r = w.read_reply()
        self.assert_envelope(r, 413, "body_too_large")
        self.assertIn("the chunked body is over 8388608 bytes", r.json["error"]["message"])
        # Under the limit, a request is read whole and served: its JSON is parsed (an
        # unknown field, 4 MiB long, is named).
        r = self.agent.request("POST", "/v1/iterations",
                               {"name": "whole", "dataset": {"num_samples": 8},
                                "cluster_sync": False, "pad": "x" * (4 << 20)})
        self.assert_envelope(r, 400, "invalid_argument")
        self.assertIn("pad", r.json["error"]["message"])

    def test_a_body_over_the_heads_limit_is_refused_before_it_is_sent(self):
        # Expect: 100-continue and a length over the head's --max-blob-bytes (4 GiB): the
        # head's 413, relayed at once, without a 100.
        with self.wire() as w:
            w.send(b"PUT /v1/shared/big/blob HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                   b"Authorization: Bearer %s\r\nExpect: 100-continue\r\n\r\n"
                   % ((5 << 30), self.token.encode()))
            r = w.read_reply(interim=True)
            self.assert_envelope(r, 413, "body_too_large")
            self.assertTrue(r.closes(), r)


class QueryTest(AgentWireCase):
    def test_bytes_that_are_not_utf8(self):
        r = self.agent.request("POST", "/v1/iterations",
                               {"name": "u8", "dataset": {"num_samples": 40}, "world_size": 2,
                                "cluster_sync": False})
        self.assertEqual(r.status, 201, r)
        r = self.agent.request("GET", "/v1/iterations/u8/held?rank=%FF")
        self.assert_envelope(r, 400, "invalid_argument")
        self.assertIn("query rank: '?' is not an integer", r.json["error"]["message"])
        # "%.100s: unknown field" cuts this name inside its 51st character.
        field = "a" + "\u00e9" * 60
        r = self.agent.request("DELETE", "/v1/iterations/u8", {field: 1})
        self.assert_envelope(r, 400, "invalid_argument")
        self.assertIn(field[:50] + "?: unknown field", r.json["error"]["message"])
        self.assertEqual(self.agent.request("GET", "/v1/iterations/u8").status, 200)

    def test_a_path_that_is_not_utf8_is_quoted(self):
        # Forwarded: the head's 404 quoted the raw byte, and answered the bare body {}.
        with Wire(self.agent.port) as w:
            w.send(b"GET /v1/no/\xd8such HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   + self.token.encode() + b"\r\n\r\n")
            r = w.read_reply()
        self.assert_envelope(r, 404, "not_found")
        self.assertIn("no endpoint at /v1/no/?such", r.json["error"]["message"])


class HeadDownTest(AgentWireCase):
    def test_the_agents_answer_to_a_head_request_has_no_body(self):
        # The agent's own answers (here: the head cannot be reached) wrote their JSON
        # body after a HEAD's headers, which say no length: the client read it as the
        # start of the next reply on the connection.
        port = self.head.port
        self.head.stop()
        with self.wire() as w:
            w.send(request("HEAD", "/v1/queues", self.token) +
                   request("GET", "/v1/queues", self.token))
            r = w.read_reply("HEAD")
            self.assertEqual((r.status, r.body), (503, b""), r)
            r = w.read_reply()
        self.assert_envelope(r, 503, "unavailable")
        self.assertIn("cannot reach the head at 127.0.0.1:%d: could not connect to it" % port,
                      r.json["error"]["message"])


HEAD_MS = 300  # the agent's MUSTER_HTTP_HEAD_TIMEOUT_MS in TimeoutTest
BODY_MS = 300  # its MUSTER_HTTP_BODY_TIMEOUT_MS
IDLE_MS = 1000  # its MUSTER_HTTP_IDLE_TIMEOUT_MS
LATE_S = 2.0  # how late a timeout may come after its limit (a loaded machine, sanitizers)
PACE_S = 0.05  # a trickle's pace: well below every limit


class TimeoutTest(SharedAgentCase):
    """The agent's port times requests out as the head's does (docs/design-notes.md,
    "Read deadlines"), with limits short enough to test.  Sleeps here pace what the
    client sends (the thing tested); the test waits for replies and closes."""

    dir_prefix = "muster-node-wire-test-"
    agent_name = "slow"

    @classmethod
    def agent_env(cls):
        return {"MUSTER_HTTP_HEAD_TIMEOUT_MS": str(HEAD_MS),
                "MUSTER_HTTP_BODY_TIMEOUT_MS": str(BODY_MS),
                "MUSTER_HTTP_IDLE_TIMEOUT_MS": str(IDLE_MS)}

    def wire(self):
        w = Wire(self.agent.port)
        w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return w

    def trickle(self, w, data):
        """Sends `data` a byte every PACE_S until the agent answers or all of it went;
        returns the bytes sent."""
        for i in range(len(data)):
            w.send(data[i:i + 1])
            if select.select([w.sock], [], [], PACE_S)[0]:
                return i + 1
        return len(data)

    def assert_timed_out(self, w, since, limit_ms, what):
        r = w.read_reply()
        elapsed = time.monotonic() - since
        self.assertEqual((r.status, r.error_code), (408, "bad_request"), r)
        self.assertEqual(r.header("Content-Type"), "application/json", r)
        self.assertIn(what, r.json["error"]["message"], r)
        self.assertTrue(r.closes(), r)
        self.assertTrue(w.closed_after())
        self.assertGreaterEqual(elapsed, limit_ms / 1000 - 0.05, r)
        self.assertLess(elapsed, limit_ms / 1000 + LATE_S, r)

    def assert_usable(self, w):
        w.send(request("GET", "/v1/health"))
        r = w.read_reply()
        self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)

    def test_a_head_trickled_past_its_limit(self):
        data = request("GET", "/v1/health", headers=["X-Pad: " + "p" * 80])
        self.assertGreater(len(data) * PACE_S, 10 * HEAD_MS / 1000)  # each byte in time
        with self.wire() as w:
            since = time.monotonic()
            self.assertLess(self.trickle(w, data), len(data) // 2, "the head was not cut")
            self.assert_timed_out(w, since, HEAD_MS, "request head")

    def test_a_body_that_stalls(self):
        self.assertIn(self.head.request("PUT", "/v1/queues/stall", {}).status, (200, 201))
        body = b'{"tasks": [{"payload": "stalled"}]}'
        whole = request("POST", "/v1/queues/stall/tasks", self.token, body)
        for name, data in (("length", whole[:-5]),
                           ("chunked", request("POST", "/v1/queues/stall/tasks", self.token,
                                               b"%x\r\n%s\r\n" % (len(body), body),
                                               headers=["Transfer-Encoding: chunked"]))):
            with self.subTest(body=name), self.wire() as w:
                since = time.monotonic()
                w.send(data)
                self.assert_timed_out(w, since, BODY_MS, "request body")
        tasks = self.head.request("GET", "/v1/queues/stall/tasks").json["tasks"]
        self.assertEqual(tasks, [], "a body that stalled was forwarded")

    def test_a_body_slow_but_steady(self):
        self.assertIn(self.head.request("PUT", "/v1/queues/steady", {}).status, (200, 201))
        body = json.dumps({"tasks": [{"payload": "p%d" % i} for i in range(40)]}).encode()
        data = request("POST", "/v1/queues/steady/tasks", self.token, body)
        start = data.index(b"\r\n\r\n") + 4
        step = (len(data) - start) // 8 + 1
        with self.wire() as w:
            began = time.monotonic()
            w.send(data[:start])
            for i in range(start, len(data), step):
                time.sleep(BODY_MS / 1000 / 3)
                w.send(data[i:i + step])
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assertGreater(time.monotonic() - began, 2 * BODY_MS / 1000)
            self.assert_usable(w)

    def test_an_idle_connection_is_closed(self):
        with self.wire() as w:
            self.assert_usable(w)
            since = time.monotonic()
            self.assertTrue(w.closed_after(), "the agent wrote on an idle connection")
            elapsed = time.monotonic() - since
        self.assertGreaterEqual(elapsed, IDLE_MS / 1000 - 0.3)
        self.assertLess(elapsed, IDLE_MS / 1000 + LATE_S)

    def test_a_forwarded_long_poll_is_not_cut(self):
        self.assertIn(self.head.request("PUT", "/v1/queues/lp", {}).status, (200, 201))
        wait_ms = 3 * IDLE_MS
        with self.wire() as w:
            start = time.monotonic()
            w.send(request("POST", "/v1/queues/lp/lease", self.token, {"wait_ms": wait_ms}))
            w.sock.settimeout(wait_ms / 1000 + 10)
            r = w.read_reply()
            self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
            self.assertGreaterEqual(time.monotonic() - start, wait_ms / 1000 - 0.05)
            self.assert_usable(w)
            # ... and the idle time is live on this connection.
            self.assertTrue(w.closed_after())

    def test_bad_setting_is_refused(self):
        d = tempfile.mkdtemp(prefix="muster-node-wire-test-")
        agent = Agent(self.head, d, "badenv", env={"MUSTER_HTTP_IDLE_TIMEOUT_MS": "soon"})
        try:
            agent.start()
            self.assertEqual(agent.request("GET", "/v1/health").status, 200)
            self.assertIn("MUSTER_HTTP_IDLE_TIMEOUT_MS=soon is not 1 to 3600000 ms",
                          agent.log())
        finally:
            agent.kill()
            shutil.rmtree(d, ignore_errors=True)


class DescriptorsTest(unittest.TestCase):
    """An agent whose descriptors run out: its own head and agent, the agent's limit
    lowered (RLIMIT_NOFILE) while it runs."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-node-wire-test-")
        self.head = harness.Head().start()
        self.agent = Agent(self.head, self.dir, "fds",
                           args=["--cache-dir", os.path.join(self.dir, "cache"),
                                 "--state-dir", os.path.join(self.dir, "state")]).start()
        self.held = []

    def tearDown(self):
        for s in self.held:
            s.close()
        self.agent.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def accept_lines(self):
        return [l for l in self.agent.log().splitlines() if "accept" in l]

    def test_out_of_descriptors_the_port_pauses(self):
        pid = self.agent.proc.pid
        open_now = len(os.listdir("/proc/%d/fd" % pid))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now + 5, open_now + 5))
        for _ in range(30):  # the kernel takes them into the listen backlog
            self.held.append(socket.create_connection(("127.0.0.1", self.agent.port), timeout=5))
        harness.wait_until(lambda: self.accept_lines(), what="the agent out of descriptors")
        first = self.accept_lines()
        time.sleep(1)  # a window to count the lines in, not a wait for an event
        lines = self.accept_lines()
        self.assertLessEqual(len(lines), 2, "accept errors logged %d times in 1 s: %s"
                             % (len(lines), lines[:3]))
        self.assertIn("API port: cannot accept connections: Too many open files", first[0])
        self.assertIn("ulimit -n", first[0])
        for s in self.held:
            s.close()
        self.held = []
        harness.wait_until(self.serves, what="the agent accepting again")
        # It says so, once: the log shows how long the trouble lasted.
        again = lambda: [l for l in self.accept_lines() if "accepting connections again" in l]
        harness.wait_until(again, what="the agent saying it accepts again")
        self.assertIn("API port: accepting connections again (", again()[0])
        self.assertEqual(len(again()), 1, again())

    def serves(self):
        try:
            return self.agent.request("GET", "/v1/health", timeout=5).status == 200
        except OSError:
            return False


if __name__ == "__main__":
    unittest.main()
