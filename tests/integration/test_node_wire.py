"""The node agent's port under malformed and hostile input (src/node/forward.c; evhttp is
its HTTP server, where the head has its own): each case below was found by fuzzing the
agent's port over raw sockets, and each test fails without its fix.

- A client that half-closes its connection after its request (`nc -N`, a script's
  shutdown(SHUT_WR)) gets the whole reply: a level read from the node cache (the miss
  streamed while it is fetched, the hit sent from its file) and a large forwarded reply.
  evhttp took the end of the client's input for the client gone and dropped the
  connection after the reply's headers.
- A request in another HTTP version than 1.1 or 1.0 (HTTP/0.9, HTTP/1.2) is refused 505
  in the envelope on an HTTP/1.1 status line, and the connection closes, as the head
  does; it was forwarded and applied, and answered "HTTP/0.9 201 Created".
- TRACE goes to the head, which answers 405 in the envelope (evhttp: 501 and HTML).
- A refusal the head sends before it read the whole request (413 for a body over its
  HTTP layer's limit) reaches the client; the agent answered 503 "cannot reach the head"
  when its write of the rest failed.
- A header section that never ends is cut off after 1 MiB (400): evhttp read it into
  memory for as long as the client sent.
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
import os
import resource
import shutil
import socket
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402
from test_http_wire import Closed, Wire, request  # noqa: E402

HEAD_MAX_BODY = 65536  # the head's HTTP layer then refuses bodies over 4 x 64 KiB + 64 KiB


class AgentWireCase(unittest.TestCase):
    """One head and one agent for the class; the agent is stopped cleanly at the end,
    so that the sanitizer build's exit report (leaks) fails the class."""
    head_args = []

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-node-wire-test-")
        cls.head = harness.Head(cls.head_args).start()
        cls.agent = Agent(cls.head, cls.dir, "wire",
                          args=["--cache-dir", os.path.join(cls.dir, "cache"),
                                "--state-dir", os.path.join(cls.dir, "state")]).start()
        cls.token = cls.head.token

    @classmethod
    def tearDownClass(cls):
        try:
            status = cls.agent.stop()
            log = cls.agent.log()
        finally:
            cls.agent.kill()
            cls.head.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)
        if status != 0 or "Sanitizer" in log:
            raise AssertionError("the agent exited with %s:\n%s" % (status, log))

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
                self.assertIn(version + ": this server speaks HTTP/1.1 and HTTP/1.0",
                              r.json["error"]["message"])
                self.assertTrue(r.closes(), r)
                self.assertTrue(w.closed_after())
        tasks = self.head.request("GET", "/v1/queues/vq/tasks").json["tasks"]
        self.assertEqual(tasks, [], "a request refused for its version was applied")
        with self.wire() as w:  # HTTP/1.0 is served
            w.send(request("POST", "/v1/queues/vq/tasks", self.token,
                           {"tasks": [{"payload": "1.0"}]}, version="HTTP/1.0"))
            r = w.read_reply()
            self.assertEqual((r.version, r.status), ("HTTP/1.0", 201), r)

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
        sent = 0
        with self.wire() as w:
            try:
                w.sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
                while sent < 64 << 20:
                    w.sock.sendall(b"x" * 65536)
                    sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.assertLess(sent, 64 << 20, "the agent read 64 MiB of one header section")
            try:
                r = w.read_reply()
            except ConnectionResetError:
                return  # refused and closed; what counts is that it stopped reading
            self.assertEqual(r.status, 400, r)
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
        self.assertIn("cannot accept connections: Too many open files", first[0])
        self.assertIn("ulimit -n", first[0])
        for s in self.held:
            s.close()
        self.held = []
        harness.wait_until(self.serves, what="the agent accepting again")

    def serves(self):
        try:
            return self.agent.request("GET", "/v1/health", timeout=5).status == 200
        except OSError:
            return False


if __name__ == "__main__":
    unittest.main()
