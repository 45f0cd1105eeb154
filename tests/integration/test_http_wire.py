"""HTTP/1.1 wire conformance of the head: raw-socket tests of its HTTP/1.1 server
(src/server/h1.c; docs/api.md, "Conventions" and "Errors"; RFC 9110 / RFC 9112).
Written against evhttp, the head's server before h1.c, and kept loose where evhttp's
behaviour was harmless; OwnServerTest holds the cases evhttp got wrong.

Every test reads replies with the parser below (status line, headers, then a body
framed by Content-Length, chunked coding or the end of the connection), so that what it
asserts is what went over the socket.  Socket timeouts are failure guards only.

Pinned (held for evhttp and hold for the own server):

- Keep-alive: 50 sequential requests on one connection, each with the right body.
  `Connection: close` gets the reply (with `Connection: close`) and then the close, and
  a request pipelined behind it is not run.  HTTP/1.0 without keep-alive: the reply,
  then the close.  HTTP/1.0 with `Connection: keep-alive`: evhttp keeps the connection
  (replies `Connection: keep-alive` with a Content-Length); closing after the reply is
  accepted too.
- Pipelining: requests written in one send() are all answered, in request order, with
  the bodies of a serial run (a lease behind two puts leases those tasks in put order);
  errors (404, 405, 400 bad_json, 400 invalid_argument of an all-or-nothing batch, 413
  body_too_large) in the middle of a batch do not disturb the requests around them;
  100 pipelined puts get 100 replies with rising ids; acknowledged pipelined puts survive
  kill -9; a long-poll with a put pipelined behind it (lease empty after its wait, or
  holding that put's task: both accepted, the queue's counts must agree); JSON puts and
  streamed uploads (by length and chunked) mixed in one send(); 50 connections with a
  request each, read back in any order.
- Request bodies: a body sent byte by byte (also two pipelined requests) or in small
  pieces; a chunked JSON body (also upper-case hex, framing in 5-byte sends, a trailer);
  a POST without a body is `{}`; a body over the route's limit gets 413 body_too_large
  in the envelope and the connection stays usable (evhttp) or closes after `Connection:
  close` (both accepted); a `Content-Length` above the HTTP layer's limit (4 x
  --max-body + 64 KiB) gets 413 and the close before the body is sent (docs/api.md), a
  chunked body once it passes that limit; wrong Content-Type 415; invalid JSON 400
  bad_json; after each the connection is usable.
- Malformed input (after each: the connection closes, the head serves a fresh
  connection, and no task was written):
  garbage request line, no HTTP version, a header line without a colon, a negative or
  non-numeric Content-Length, both Content-Length and Transfer-Encoding: 400;
  a header section over 64 KiB (one long line, or many): 400 or 431 (evhttp: 400);
  HTTP/2.0 on the request line: 400 or 505 (evhttp: 400); a Content-Length beyond
  2^63: 400 or 413 (evhttp: 413); a malformed chunk size: 400 or 413 (evhttp: 413);
  an unknown method (FROBNICATE, a 300-byte name, lowercase `get`, TRACE): 400, 405 or
  501 (evhttp: 501 and close); the connection then closes or stays usable.
  Unknown Transfer-Encoding and a whitespace in a header name: the head stays up and
  writes nothing (statuses differ, see OwnServerTest).  Two different Content-Lengths: the
  head stays up (evhttp runs the request with the first length; see OwnServerTest).
  A request target without a leading `/`, `*` with GET, absolute form, obs-fold and bare
  LF line ends: only correct outcomes or evhttp's harmless one are accepted.
- HEAD: the GET's headers with its Content-Length and no body, on 200 and 404, for JSON
  and for a shared blob; the connection stays usable.
- Routing: 404 not_found / 405 method_not_allowed in the envelope; %2D in a queue name
  decodes (create and get, %2d too), %20 decodes (404 naming the decoded name, or 400
  name_invalid); query parameters (limit, state, after, a percent-encoded value) work and
  bad values are 400 invalid_argument.
- Auth: no token, a wrong token or another scheme: 401 unauthorized with
  `WWW-Authenticate: Bearer realm="muster"`; the connection stays usable.
- Expect: 100-continue: a JSON POST whose client waits gets `100 Continue` and then
  its reply; sent with its body at once, the 100 is optional; a GET with it gets no 100;
  an unknown expectation gets 417 (evhttp: HTML, close) or is served.  A streamed upload
  gets 100 and then 201 and the connection goes on; refused (no token, bad name) it gets
  the final status without a 100, `Connection: close`, and the close; nothing is stored.
- Client disconnects: half a body (length or chunked) then a half-close (a 4xx or the
  close) or a close writes nothing; a parked long-poll whose
  client closes is dropped (muster_lease_waiters goes back to 0) and a put afterwards
  goes to the next client's lease; 200 connections opened and closed without a byte,
  and 200 held open at once, leave the head serving and its descriptors back at the
  count before.
- Large replies: an 8 MiB blob and a ~3 MB task list read slowly through a small
  receive buffer arrive complete.
- Read deadlines (ReadTimeoutTest, its own head with 300 ms limits from
  MUSTER_HTTP_HEAD_TIMEOUT_MS / MUSTER_HTTP_BODY_TIMEOUT_MS): a head trickled a byte
  every 50 ms gets 408 in the envelope and the close at its limit from its first byte
  (counted in muster_http_wire_errors_total); heads trickled within the limit are
  served, one after another on one connection; a body (length, chunked, streamed
  upload) that stalls gets 408 and writes nothing; a body sent slowly but steadily is
  served; a parked long-poll (with a head pipelined behind it) and an idle keep-alive
  connection (after a stray blank line) are not cut.  Each ends by showing the
  deadline live on its connection, so none passes without it.  A bad setting is
  refused with a warning.
- Framing: every JSON reply (200, 201, 400, 401, 404, 405, 413, 415) has
  `Content-Type: application/json`, exactly one Content-Length equal to the body, no
  Transfer-Encoding; a 304 has no body (the next pipelined reply parses right after
  it).  The head has no 204 replies.

OwnServerTest (evhttp's behaviour, and what the own server does instead):

- Refusals by evhttp itself (bad request line, bad headers, bad Content-Length, bad
  chunk, unknown method, HTTP layer's 413) answer an HTML page, not the JSON envelope.
- A header section over 64 KiB: evhttp 400; must be 431.
- A malformed chunk size: evhttp 413 (HTML, close); must be 400.
- `Transfer-Encoding: gzip`: evhttp ignores it, runs the request without a body and
  reads the body as the next request; must be 501 and close.
- Two different Content-Lengths: evhttp uses the first (a put whose first length is
  right is run: 201, the task is written) and reads the rest as the next request; must
  be 400 and close.
- `Content-Length: +2`: evhttp reads it as 2; must be 400 and close.
- A chunk extension (`A;name=value`): evhttp answers 413 (HTML) and closes; must be
  ignored (RFC 9112 7.1.1).
- A percent-encoded query key (`?st%61te=queued`): evhttp decodes values only, and the
  undecoded key is ignored as unknown; must decode keys too.
- A request target without a leading `/` (`GET v1/health`): evhttp serves the path;
  must be 400.
- HTTP/1.1 without Host: evhttp serves it; must be 400.
- A space inside a header name: evhttp accepts the line; must be 400.
- CONNECT (any target): evhttp sends nothing and holds the connection open (until its
  timeout); must answer (400/405/501).
- An absolute-form target (`GET http://host/v1/health`): evhttp serves it and then
  closes the connection, without `Connection: close` in the reply; must keep it.
- Uploads (`PUT /v1/shared/...`, framed by the upload tap in shared_upload.c):
  `Transfer-Encoding: gzip` stores an empty blob (201, size 0) and runs the body as the
  next request; two Content-Lengths (0, then N) likewise (the first wins); both
  Content-Length and chunked: read as chunked, 201, connection kept.  Must be 501 /
  400 with nothing stored and the close / 400 or 201 followed by the close.
- A JSON POST with `Expect: 100-continue` that will be refused (Content-Length over
  the route's limit, no token, unknown path): evhttp sends `100 Continue` first and
  refuses after the body; must refuse at once, without the 100, and close (as uploads
  do).
"""
import json
import os
import re
import select
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

GUARD_S = 10.0  # a reply that takes longer than this is a failure, not a wait
MAX_BODY = 65536  # the head's --max-body here, so that 413s are cheap
HTTP_LAYER_LIMIT = MAX_BODY * 4 + 65536  # docs/api.md, body_too_large
JSON = "application/json"
OCTET = "application/octet-stream"


# ---- a raw HTTP/1.1 reply reader ---------------------------------------------------

class Closed(Exception):
    """The server closed the connection before a whole reply arrived."""

    def __init__(self, partial=b""):
        super().__init__("connection closed after %d bytes of a reply: %r"
                         % (len(partial), bytes(partial[:200])))
        self.partial = bytes(partial)


class Reply:
    """One parsed reply.  `headers` keeps every header line in order."""

    def __init__(self, version, status, reason, headers):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = b""

    def header(self, name):
        """The last value of header `name` (case-insensitive), or None."""
        values = self.header_all(name)
        return values[-1] if values else None

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    @property
    def json(self):
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    @property
    def error_code(self):
        j = self.json
        if isinstance(j, dict) and isinstance(j.get("error"), dict):
            return j["error"].get("code")
        return None

    def closes(self):
        return "close" in (self.header("Connection") or "").lower()

    def __repr__(self):
        return "Reply(%s %d %r, %r, body %r)" % (self.version, self.status, self.reason,
                                                 self.headers, self.body[:300])


class Wire:
    """One client connection and its receive buffer."""

    def __init__(self, port, timeout=GUARD_S, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            # Before connect, so that the window is small from the start.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.buf = bytearray()
        self.eof = False

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        """Sends all of `data`; a server that closed early (after its reply) is not an
        error here: the reply is what the test looks at."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def send_pieces(self, data, size):
        """Sends `data` in pieces of `size` bytes, each its own send() with Nagle off, so
        that the server sees it arrive in many reads."""
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(data), size):
            self.sock.sendall(data[i:i + size])

    def _fill(self, bufsize=65536):
        if self.eof:
            raise Closed(self.buf)
        try:
            chunk = self.sock.recv(bufsize)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.eof = True
            raise Closed(self.buf)
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            if len(self.buf) > 1 << 20:
                raise AssertionError("a reply line longer than 1 MiB")
            self._fill()

    def _exact(self, n, bufsize=65536, pace=None):
        while len(self.buf) < n:
            self._fill(bufsize)
            if pace:
                pace()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _until_eof(self):
        try:
            while True:
                self._fill()
        except Closed:
            pass
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def read_head(self):
        line = self._line()
        parts = line.rstrip(b"\r\n").split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() \
                or len(parts[1]) != 3 or not line.endswith(b"\r\n"):
            raise AssertionError("not a status line: %r (then %r)" % (line, bytes(self.buf[:200])))
        r = Reply(parts[0].decode(), int(parts[1]),
                  parts[2].decode("latin-1") if len(parts) > 2 else "", [])
        while True:
            line = self._line()
            if line == b"\r\n":
                return r
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep or not name or name != name.strip() or not line.endswith(b"\r\n"):
                raise AssertionError("malformed reply header line %r" % line)
            r.headers.append((name, value.strip()))

    def read_reply(self, method="GET", interim=False, bufsize=65536, pace=None):
        """The next reply, its body framed as RFC 9112 section 6.3 says.  Interim (1xx)
        replies are skipped unless `interim`, which returns the first reply of any kind."""
        while True:
            r = self.read_head()
            if not (100 <= r.status < 200) or interim:
                break
        if method == "HEAD" or 100 <= r.status < 200 or r.status in (204, 304):
            return r
        te = r.header("Transfer-Encoding")
        lengths = r.header_all("Content-Length")
        if te is not None:
            if te.lower() != "chunked":
                raise AssertionError("reply Transfer-Encoding %r" % te)
            r.body = self._chunked(bufsize)
        elif lengths:
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                raise AssertionError("reply Content-Length %r" % lengths)
            r.body = self._exact(int(lengths[0]), bufsize, pace)
        else:
            r.body = self._until_eof()
        return r

    def _chunked(self, bufsize):
        body = b""
        while True:
            size = int(self._line().split(b";")[0].strip(), 16)
            if size == 0:
                while self._line() != b"\r\n":
                    pass
                return body
            body += self._exact(size, bufsize)
            if self._line() != b"\r\n":
                raise AssertionError("a reply chunk not followed by CRLF")

    def outcome(self, method="GET"):
        """The next reply, or "closed" when the connection ends before a byte of one."""
        try:
            return self.read_reply(method)
        except Closed as e:
            if e.partial:
                raise AssertionError("the connection ended inside a reply: %r" % e.partial[:300])
            return "closed"

    def closed_after(self):
        """Waits for the server to close, asserting it sends nothing more; a connection
        left open fails on the guard timeout."""
        rest = self._until_eof()
        if rest:
            raise AssertionError("bytes after the reply: %r" % rest[:300])
        return True


def request(method, path, token=None, body=None, headers=(), version="HTTP/1.1",
            ctype=JSON, host=True):
    """The bytes of one request.  `body` is bytes, a JSON-able value, or None (no body).
    A Content-Length is added for a body unless `headers` frame it themselves."""
    if body is not None and not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
    lines = ["%s %s %s" % (method, path, version)]
    if host:
        lines.append("Host: 127.0.0.1")
    if token:
        lines.append("Authorization: Bearer " + token)
    if body is not None:
        if ctype:
            lines.append("Content-Type: " + ctype)
        if not any(h.lower().startswith(("content-length:", "transfer-encoding:"))
                   for h in headers):
            lines.append("Content-Length: %d" % len(body))
    lines += list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + bytes(body or b"")


def chunked(data, size):
    """`data` in chunked coding, `size` bytes a chunk."""
    out = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
                   for i in range(0, len(data), size))
    return out + b"0\r\n\r\n"


# ---- the head and the checks every test uses ----------------------------------------

HEAD = None


def setUpModule():
    global HEAD
    HEAD = harness.Head(["--sweep-ms", "50", "--max-body", str(MAX_BODY)]).start()


def tearDownModule():
    # A clean stop, not kill -9: under the sanitizers the head's exit then reports what
    # the connections above leaked or broke, and a non-zero status fails the run.
    if HEAD is not None:
        HEAD.stop_checked()


class WireCase(unittest.TestCase):
    maxDiff = 4000

    def setUp(self):
        self.head = HEAD
        self.token = HEAD.token
        if HEAD.proc.poll() is not None:
            self.fail("head exited with %s:\n%s" % (HEAD.proc.returncode, HEAD.log()))
        self.q = (type(self).__name__ + "." + self._testMethodName.replace("test_", "", 1))[:120]

    def tearDown(self):
        if HEAD.proc.poll() is not None:
            print("\n--- head exited (%s); log tail:\n%s" % (HEAD.proc.returncode, HEAD.log()),
                  file=sys.stderr)

    def wire(self, **kw):
        return Wire(self.head.port, **kw)

    def req(self, method, path, body=None, token="default", **kw):
        return request(method, path, self.token if token == "default" else token, body, **kw)

    def call(self, method, path, body=None, **kw):
        """One request on a fresh connection; returns the Reply."""
        with self.wire() as w:
            w.send(self.req(method, path, body, **kw))
            return w.read_reply(method)

    def expect(self, method, path, body=None, status=200, **kw):
        r = self.call(method, path, body, **kw)
        self.assertEqual(r.status, status, r)
        self.assert_json_framing(r)
        return r.json

    def create_queue(self, name=None):
        self.expect("PUT", "/v1/queues/" + (name or self.q), {}, status=201)

    def put_body(self, *payloads):
        return {"tasks": [{"payload": p} for p in payloads]}

    def counts(self, name=None):
        return self.expect("GET", "/v1/queues/" + (name or self.q))["counts"]

    def tasks(self, name=None):
        page = self.expect("GET", "/v1/queues/%s/tasks?limit=1000" % (name or self.q))
        return page["tasks"]

    def assert_no_tasks(self, name=None):
        self.assertEqual(self.tasks(name), [], "a refused request wrote a task")

    def assert_serves(self):
        """The head is up and answers a fresh connection."""
        self.assertIsNone(self.head.proc.poll(), "the head exited:\n" + self.head.log())
        r = self.call("GET", "/v1/health", token=None)
        self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)

    def assert_json_framing(self, r):
        """A JSON reply: Content-Type application/json, one Content-Length that is the
        body's length, no Transfer-Encoding, and a body that parses."""
        self.assertTrue((r.header("Content-Type") or "").startswith(JSON), r)
        lengths = r.header_all("Content-Length")
        self.assertEqual(lengths, [str(len(r.body))], r)
        self.assertIsNone(r.header("Transfer-Encoding"), r)
        self.assertIsNotNone(r.json, r)

    def assert_envelope(self, r, status, code):
        self.assertEqual((r.status, r.error_code), (status, code), r)
        self.assert_json_framing(r)
        msg = r.json["error"].get("message")
        self.assertTrue(isinstance(msg, str) and msg, r)

    def assert_usable(self, w):
        """The connection `w` still serves a request."""
        w.send(self.req("GET", "/v1/health", token=None))
        r = w.read_reply()
        self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)

    def assert_usable_or_closed(self, w, r):
        """After reply `r`: a reply that says `Connection: close` is followed by the close;
        any other leaves the connection usable."""
        if r.closes():
            self.assertTrue(w.closed_after())
        else:
            self.assert_usable(w)

    def refused(self, data, statuses, close=True, method="GET"):
        """Sends `data` on a fresh connection; asserts a reply with a status in `statuses`,
        then the close (`close`) or usable-or-closed; the head serves afterwards."""
        with self.wire() as w:
            w.send(data)
            r = w.outcome(method)
            self.assertNotEqual(r, "closed", "closed without a reply to %r" % data[:120])
            self.assertIn(r.status, statuses, "%r -> %r" % (data[:120], r))
            if close:
                self.assertTrue(w.closed_after(), r)
            else:
                self.assert_usable_or_closed(w, r)
        self.assert_serves()
        return r

    def waiters(self):
        body = self.call("GET", "/metrics").body
        return int(re.search(rb"^muster_lease_waiters (\d+)$", body, re.M).group(1))

    def head_fds(self):
        return len(os.listdir("/proc/%d/fd" % self.head.proc.pid))


# ---- 1. keep-alive ------------------------------------------------------------------

class KeepAliveTest(WireCase):
    def test_fifty_requests_on_one_connection(self):
        self.create_queue()
        puts = 0
        with self.wire() as w:
            for i in range(50):
                if i % 2 == 0:
                    w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(i)))
                    r = w.read_reply()
                    self.assertEqual(r.status, 201, r)
                    self.assertIs(r.json["tasks"][0]["created"], True, r)
                    puts += 1
                else:
                    w.send(self.req("GET", "/v1/queues/" + self.q))
                    r = w.read_reply()
                    self.assertEqual((r.status, r.json["counts"]["queued"]), (200, puts), r)
                self.assertFalse(r.closes(), r)
                self.assertEqual(r.version, "HTTP/1.1", r)
        self.assertEqual(self.counts()["queued"], 25)

    def test_connection_close_is_honoured(self):
        self.create_queue()
        with self.wire() as w:
            # The put pipelined behind the closing request must not run.
            w.send(self.req("GET", "/v1/health", token=None, headers=["Connection: close"]) +
                   self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body("behind")))
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            self.assertTrue(r.closes(), r)
            self.assertTrue(w.closed_after())
        self.assert_no_tasks()

    def test_http10_without_keep_alive_closes(self):
        self.create_queue()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body("h10"),
                            version="HTTP/1.0", host=False))
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assertIs(r.json["tasks"][0]["created"], True, r)
            lengths = r.header_all("Content-Length")
            self.assertIn(lengths, ([], [str(len(r.body))]), r)  # evhttp: none
            self.assertTrue(w.closed_after())
        self.assertEqual(self.counts()["queued"], 1)

    def test_http10_with_keep_alive(self):
        # evhttp keeps the connection: "Connection: keep-alive" and a Content-Length.
        # A server may also close it (then without claiming keep-alive).
        ka = "Connection: keep-alive"
        with self.wire() as w:
            w.send(self.req("GET", "/v1/health", version="HTTP/1.0", host=False, headers=[ka]))
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            if (r.header("Connection") or "").lower() == "keep-alive":
                self.assertEqual(r.header_all("Content-Length"), [str(len(r.body))], r)
                for _ in range(3):
                    w.send(self.req("GET", "/v1/queues", version="HTTP/1.0", host=False,
                                    headers=[ka]))
                    r = w.read_reply()
                    self.assertEqual(r.status, 200, r)
                    self.assertIsInstance(r.json["queues"], list, r)
            else:
                self.assertTrue(w.closed_after())


# ---- 2. pipelining ------------------------------------------------------------------

class PipelineTest(WireCase):
    def test_mixed_batch_in_one_send(self):
        self.create_queue()
        path = "/v1/queues/" + self.q
        batch = [self.req("GET", path),
                 self.req("POST", path + "/tasks", self.put_body("a")),
                 self.req("POST", path + "/tasks", self.put_body("b", "c")),
                 self.req("GET", "/v1/queues"),
                 self.req("POST", path + "/lease", {"max": 10}),
                 self.req("GET", path),
                 self.req("GET", "/v1/health", token=None)]
        with self.wire() as w:
            w.send(b"".join(batch))
            rs = [w.read_reply() for _ in batch]
            self.assertEqual([r.status for r in rs], [200, 201, 201, 200, 200, 200, 200], rs)
            self.assertEqual(rs[0].json["counts"]["queued"], 0)
            ids = [t["id"] for t in rs[1].json["tasks"] + rs[2].json["tasks"]]
            self.assertEqual(ids, sorted(ids))
            self.assertIn(self.q, [q["name"] for q in rs[3].json["queues"]])
            leases = rs[4].json["leases"]
            self.assertEqual([(l["task"], l["payload"]) for l in leases],
                             list(zip(ids, ["a", "b", "c"])))
            self.assertEqual((rs[5].json["counts"]["queued"], rs[5].json["counts"]["leased"]),
                             (0, 3))
            self.assertEqual(rs[6].json["status"], "ok")
            for r in rs:
                self.assert_json_framing(r)
            self.assert_usable(w)

    def test_errors_in_the_middle(self):
        self.create_queue()
        path = "/v1/queues/" + self.q
        batch = [(self.req("POST", path + "/tasks", self.put_body("x")), 201, None),
                 (self.req("GET", "/v1/nope"), 404, "not_found"),
                 (self.req("GET", "/v1/queues/%s-absent" % self.q), 404, "queue_not_found"),
                 (self.req("POST", path + "/tasks", b'{"tasks": ['), 400, "bad_json"),
                 (self.req("POST", path + "/tasks", self.put_body("z" * (MAX_BODY + 10))),
                  413, "body_too_large"),
                 (self.req("DELETE", "/v1/health"), 405, "method_not_allowed"),
                 # All-or-nothing: the good first element of a refused batch is not kept.
                 (self.req("POST", path + "/tasks", {"tasks": [
                     {"payload": "w"}, {"payload": "v", "priority": "high"}]}),
                  400, "invalid_argument"),
                 (self.req("POST", path + "/tasks", self.put_body("y")), 201, None),
                 (self.req("POST", path + "/lease", {"max": 10}), 200, None)]
        with self.wire() as w:
            w.send(b"".join(b for b, _, _ in batch))
            for data, status, code in batch:
                r = w.read_reply()
                if code:
                    self.assert_envelope(r, status, code)
                else:
                    self.assertEqual(r.status, status, r)
                    self.assert_json_framing(r)
            self.assertEqual([l["payload"] for l in r.json["leases"]], ["x", "y"], r)
            self.assert_usable(w)

    def store_counts(self):
        """(commits, WAL flushes) so far, from /metrics."""
        body = self.call("GET", "/metrics").body.decode()
        def total(name):
            return sum(int(float(v)) for v in re.findall(
                r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), body, re.M))
        return (total("muster_store_commit_duration_seconds_count"),
                total("muster_store_flush_duration_seconds_count"))

    def test_pipelined_puts_share_a_commit(self):
        # Every complete request of a read is handled in the same turn: 50 puts written
        # in one send() are committed (and flushed, --sync full) together, not one by one
        # as a server that reads the next request only after answering the last would.
        self.create_queue()
        n = 50
        data = b"".join(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(i))
                        for i in range(n))
        commits, flushes = self.store_counts()
        with self.wire() as w:
            w.send(data)
            for _ in range(n):
                self.assertEqual(w.read_reply().status, 201)
        commits_after, flushes_after = self.store_counts()
        # The first /metrics read's own commit is counted too; a send of this size may
        # arrive in two or three reads.
        self.assertLessEqual(commits_after - commits, 5, "pipelined puts committed one by one")
        self.assertLessEqual(flushes_after - flushes, 5, "pipelined puts flushed one by one")
        self.assertGreaterEqual(flushes_after - flushes, 1, "the puts were never flushed")
        self.assertEqual(len(self.tasks()), n)

    def test_hundred_puts_in_one_send(self):
        self.create_queue()
        n = 100
        data = b"".join(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(i))
                        for i in range(n))
        with self.wire() as w:
            w.send(data)
            ids = []
            for _ in range(n):
                r = w.read_reply()
                self.assertEqual(r.status, 201, r)
                ids.append(r.json["tasks"][0]["id"])
        self.assertEqual(ids, sorted(set(ids)), "replies out of request order")
        got = self.tasks()
        self.assertEqual([(t["id"], t["payload"]) for t in got], list(zip(ids, range(n))))

    def test_long_poll_with_a_put_behind_it(self):
        # evhttp runs one request of a connection at a time: the lease waits out its
        # wait_ms, then the put runs.  A server that runs the put meanwhile may hand its
        # task to the lease.  Either way the replies keep request order and agree.
        self.create_queue()
        path = "/v1/queues/" + self.q
        with self.wire() as w:
            w.send(self.req("POST", path + "/lease", {"wait_ms": 300}) +
                   self.req("POST", path + "/tasks", self.put_body("late")) +
                   self.req("GET", path))
            lease, put, queue = w.read_reply(), w.read_reply(), w.read_reply()
        self.assertEqual((lease.status, put.status, queue.status), (200, 201, 200))
        tid = put.json["tasks"][0]["id"]
        leased = [(l["task"], l["payload"]) for l in lease.json["leases"]]
        self.assertIn(leased, ([], [(tid, "late")]), lease)
        counts = queue.json["counts"]
        self.assertEqual((counts["queued"], counts["leased"]),
                         (0, 1) if leased else (1, 0), queue)

    def test_many_connections_at_once(self):
        # Each connection gets its own reply, whatever order the head serves them in.
        self.create_queue()
        conns = [self.wire() for _ in range(50)]
        try:
            for i, w in enumerate(conns):
                w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(i)))
            ids = {}
            for i, w in enumerate(conns):
                r = w.read_reply()
                self.assertEqual(r.status, 201, r)
                ids[r.json["tasks"][0]["id"]] = i
            for i, w in enumerate(reversed(conns)):
                w.send(self.req("GET", "/v1/tasks/%d" % sorted(ids)[i]))
            for i, w in enumerate(reversed(conns)):
                r = w.read_reply()
                self.assertEqual(r.json["id"], sorted(ids)[i], r)
        finally:
            for w in conns:
                w.close()
        got = {t["id"]: t["payload"] for t in self.tasks()}
        self.assertEqual(got, ids)

    def test_pipelined_behind_an_upload(self):
        # Streamed uploads take another path through the head (shared_upload.c); the
        # requests around one in the same send() must not notice.
        self.create_queue()
        blob = b"0123456789" * 3000
        path = "/v1/shared/%s/pipe" % self.q
        puts = "/v1/queues/%s/tasks" % self.q
        with self.wire() as w:
            w.send(self.req("POST", puts, self.put_body("before")) +
                   self.req("PUT", path, blob, ctype=OCTET) +
                   self.req("POST", puts, self.put_body("after")) +
                   self.req("PUT", path + "?level=2", chunked(blob[::-1], 4000), ctype=None,
                            headers=["Transfer-Encoding: chunked"]) +
                   self.req("GET", path + "?level=1") +
                   self.req("HEAD", path) + self.req("GET", "/v1/health", token=None))
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["size"]), (201, len(blob)), r)
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["level"]), (201, 2), r)
            r = w.read_reply()
            self.assertEqual((r.status, r.body), (200, blob))
            r = w.read_reply("HEAD")
            self.assertEqual((r.status, r.header("Content-Length")), (200, str(len(blob))), r)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
        self.assertEqual([t["payload"] for t in self.tasks()], ["before", "after"])


class PipelineDurabilityTest(unittest.TestCase):
    """Replies to pipelined writes mean what they mean alone: on disk (its own head,
    killed with -9)."""

    def test_acknowledged_pipelined_puts_survive_kill(self):
        head = harness.Head(["--sweep-ms", "50"]).start()
        try:
            q = "durable"
            with Wire(head.port) as w:
                w.send(request("PUT", "/v1/queues/" + q, head.token, {}))
                self.assertEqual(w.read_reply().status, 201)
                w.send(b"".join(request("POST", "/v1/queues/%s/tasks" % q, head.token,
                                        {"tasks": [{"payload": i}]}) for i in range(60)))
                acked = [w.read_reply().json["tasks"][0]["id"] for _ in range(60)]
            head.kill()
            head.start()
            with Wire(head.port) as w:
                w.send(request("GET", "/v1/queues/%s/tasks?limit=1000" % q, head.token))
                r = w.read_reply()
            self.assertEqual([(t["id"], t["payload"]) for t in r.json["tasks"]],
                             list(zip(acked, range(60))))
        finally:
            head.cleanup()


# ---- 3. request bodies --------------------------------------------------------------

class BodyTest(WireCase):
    def test_byte_by_byte(self):
        self.create_queue()
        with self.wire() as w:
            w.send_pieces(self.req("POST", "/v1/queues/%s/tasks" % self.q,
                                   self.put_body({"k": "byte"})), 1)
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            # Two pipelined requests, byte by byte: the second's head follows the first's
            # body within the same stream of one-byte reads.
            w.send_pieces(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(2)) +
                          self.req("GET", "/v1/queues/" + self.q), 1)
            self.assertEqual(w.read_reply().status, 201)
            self.assertEqual(w.read_reply().json["counts"]["queued"], 2)
            self.assert_usable(w)
        self.assertEqual([t["payload"] for t in self.tasks()], [{"k": "byte"}, 2])

    def test_body_in_small_pieces(self):
        self.create_queue()
        payloads = ["%d-" % i + "p" * 1500 for i in range(30)]
        data = self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(*payloads))
        self.assertGreater(len(data), 45000)
        with self.wire() as w:
            w.send_pieces(data, 97)
            r = w.read_reply()
            self.assertEqual((r.status, len(r.json["tasks"])), (201, 30), r)
        self.assertEqual([t["payload"] for t in self.tasks()], payloads)

    def test_chunked_json_body(self):
        self.create_queue()
        body = json.dumps(self.put_body("chunky", {"n": 1})).encode()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, chunked(body, 7),
                            headers=["Transfer-Encoding: chunked"]))
            r = w.read_reply()
            self.assertEqual((r.status, len(r.json["tasks"])), (201, 2), r)
            self.assert_json_framing(r)
            # Chunk sizes arriving in pieces, upper-case hex and a trailer.
            body = json.dumps(self.put_body("ext")).encode()
            framed = (b"A\r\n" + body[:10] + b"\r\n" +
                      b"%X\r\n" % (len(body) - 10) + body[10:] + b"\r\n" +
                      b"0\r\nX-Trailer: yes\r\n\r\n")
            w.send_pieces(self.req("POST", "/v1/queues/%s/tasks" % self.q, framed,
                                   headers=["Transfer-Encoding: chunked"]), 5)
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assert_usable(w)
        self.assertEqual([t["payload"] for t in self.tasks()], ["chunky", {"n": 1}, "ext"])

    def test_no_body_counts_as_empty_object(self):
        self.create_queue()
        with self.wire() as w:
            # No Content-Length, no Transfer-Encoding: no body (RFC 9112 6.3).
            w.send(b"POST /v1/queues/%s/lease HTTP/1.1\r\nHost: x\r\n"
                   b"Authorization: Bearer %s\r\n\r\n" % (self.q.encode(), self.token.encode()))
            r = w.read_reply()
            self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
            w.send(self.req("POST", "/v1/queues/%s/lease" % self.q, b"", ctype=None))
            r = w.read_reply()
            self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
            self.assert_usable(w)

    def test_body_over_the_route_limit(self):
        self.create_queue()
        big = self.put_body("x" * (MAX_BODY + 100))
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, big))
            r = w.read_reply()
            self.assert_envelope(r, 413, "body_too_large")
            # evhttp read the body and keeps the connection; a server that refuses
            # before reading must close, and say so.
            self.assert_usable_or_closed(w, r)
        with self.wire() as w:
            big = json.dumps(big).encode()
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, chunked(big, 8192),
                            headers=["Transfer-Encoding: chunked"]))
            r = w.read_reply()
            self.assert_envelope(r, 413, "body_too_large")
            self.assert_usable_or_closed(w, r)
        self.assert_no_tasks()

    def test_length_over_the_http_layer_limit(self):
        # Refused on its Content-Length alone: the client sends no body and still gets
        # the reply, then the close (docs/api.md, body_too_large).
        self.create_queue()
        head = self.req("POST", "/v1/queues/%s/tasks" % self.q, None,
                        headers=["Content-Type: application/json",
                                 "Content-Length: %d" % (HTTP_LAYER_LIMIT + 1)])
        r = self.refused(head, (413,))
        self.assertTrue(r.closes(), r)
        # A chunked body has no length up front: refused once it passes the limit.
        head = self.req("POST", "/v1/queues/%s/tasks" % self.q, None,
                        headers=["Content-Type: application/json", "Transfer-Encoding: chunked"])
        r = self.refused(head + b"%x\r\n%s\r\n" % (HTTP_LAYER_LIMIT + 1,
                                                   b" " * (HTTP_LAYER_LIMIT + 1)), (413,))
        self.assertTrue(r.closes(), r)
        self.assertIn("over %d bytes" % HTTP_LAYER_LIMIT, r.json["error"]["message"], r)
        self.assert_no_tasks()

    def test_wrong_content_type_and_bad_json(self):
        self.create_queue()
        body = json.dumps(self.put_body(1)).encode()
        with self.wire() as w:
            for ctype in ("text/plain", "application/x-www-form-urlencoded", OCTET):
                w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, body, ctype=ctype))
                self.assert_envelope(w.read_reply(), 415, "unsupported_media_type")
            for bad in (b'{"tasks": [', b"\xff\xfe", b"[1, 2]", b'{"a":1}{"b":2}'):
                w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, bad))
                self.assert_envelope(w.read_reply(), 400, "bad_json")
            self.assert_usable(w)
        self.assert_no_tasks()


# ---- 4. malformed input -------------------------------------------------------------

class MalformedTest(WireCase):
    """Each case on a fresh connection; the head must stay up and write nothing."""

    def setUp(self):
        super().setUp()
        self.create_queue()
        self.put_path = "/v1/queues/%s/tasks" % self.q
        self.body = json.dumps(self.put_body("smuggled")).encode()

    def tearDown(self):
        if HEAD.proc.poll() is None:
            self.assert_no_tasks()
        super().tearDown()

    def test_garbage_request_line(self):
        self.refused(b"\x01\x02garbage\r\n\r\n", (400,))
        self.refused(b"GET\r\n\r\n", (400,))
        self.refused(b"\r\n\r\n\r\n" + b"x" * 100 + b"\r\n\r\n", (400,))

    def test_no_line_end_needed_to_refuse(self):
        # A start no request line can have is refused at once, without waiting for a
        # line end until the head's deadline (30 s, three times GUARD_S): a TLS
        # handshake sent to this plain-HTTP server, a method that is not a token.
        r = self.refused(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", (400,))
        self.assertIn("plain HTTP, not TLS", r.json["error"]["message"])
        self.refused(b"G{T /v1/health", (400,))
        self.refused(b"\r\nABCDEFGHIJKLMNOPQRSTUVWXYZ", (400,))

    def test_missing_http_version(self):
        self.refused(b"GET /v1/health\r\nHost: x\r\n\r\n", (400,))
        self.refused(b"POST %s\r\nHost: x\r\n\r\n" % self.put_path.encode(), (400,))

    def test_http_version_not_supported(self):
        self.refused(b"GET /v1/health HTTP/2.0\r\nHost: x\r\n\r\n", (400, 505))
        self.refused(b"GET /v1/health HTTP/x.y\r\nHost: x\r\n\r\n", (400, 505))

    def test_header_line_without_colon(self):
        self.refused(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", (400,))
        self.refused(self.req("POST", self.put_path, self.body, headers=["Bogus line"]), (400,))

    def test_header_section_over_64k(self):
        # One long line, and many short ones (431 is right, 400 is evhttp's).
        long_line = self.refused(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " +
                                 b"a" * 70000 + b"\r\n\r\n", (400, 431))
        lines = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(700))
        many = self.refused(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n",
                            (400, 431))
        for r in (long_line, many):  # the limit is named, not only "over the limit"
            self.assertEqual(r.json["error"]["message"],
                             "the request line and headers are over 65536 bytes, the "
                             "head's limit", r)
        # Just under the limit is served.
        r = self.call("GET", "/v1/health", headers=["X-Big: " + "a" * 60000])
        self.assertEqual(r.status, 200, r)

    def test_bad_content_length(self):
        for value in ("-5", "abc", "1x", "0x10", ""):
            with self.subTest(content_length=value):
                self.refused(self.req("POST", self.put_path, self.body,
                                      headers=["Content-Length: " + value]), (400,))
        self.refused(self.req("POST", self.put_path, self.body,
                              headers=["Content-Length: 99999999999999999999"]), (400, 413))

    def test_content_length_and_transfer_encoding(self):
        self.refused(self.req("POST", self.put_path, chunked(self.body, 10),
                              headers=["Content-Length: %d" % len(self.body),
                                       "Transfer-Encoding: chunked"]), (400,))

    def test_malformed_chunk_size(self):
        for framed in (b"zz\r\n" + self.body + b"\r\n0\r\n\r\n",
                       b"-5\r\n" + self.body + b"\r\n0\r\n\r\n",
                       b"ffffffffffffffffffff\r\n" + self.body + b"\r\n0\r\n\r\n"):
            with self.subTest(framed=framed[:24]):
                self.refused(self.req("POST", self.put_path, framed,
                                      headers=["Transfer-Encoding: chunked"]), (400, 413))

    def test_unknown_transfer_encoding_writes_nothing(self):
        # evhttp ignores "gzip" and runs the put without a body (400, tasks missing); the
        # own server must answer 501 and close (OwnServerTest).  Either way: no task.
        with self.wire() as w:
            w.send(self.req("POST", self.put_path, self.body + b"\r\n\r\n",
                            headers=["Transfer-Encoding: gzip"]))
            r = w.outcome()
            self.assertNotEqual(r, "closed")
            self.assertIn(r.status, (400, 501), r)
        self.assert_serves()

    def test_two_content_lengths(self):
        # evhttp takes the first and runs the put (OwnServerTest wants 400): the head only
        # has to survive here, and the test's own task is removed again.
        for first, second in ((2, 3), (len(self.body), 2)):
            with self.wire() as w:
                w.send(self.req("POST", self.put_path, self.body,
                                headers=["Content-Length: %d" % first,
                                         "Content-Length: %d" % second]))
                r = w.outcome()
                self.assertNotEqual(r, "closed")
                self.assertIn(r.status, (201, 400), r)
            self.assert_serves()
        self.expect("POST", self.put_path.replace("/tasks", "/purge"))

    def test_unknown_methods(self):
        for line in (b"FROBNICATE /v1/health HTTP/1.1", b"X" * 300 + b" /v1/health HTTP/1.1",
                     b"get /v1/health HTTP/1.1", b"TRACE /v1/health HTTP/1.1"):
            with self.subTest(line=line[:40]):
                self.refused(line + b"\r\nHost: x\r\n\r\n", (400, 405, 501), close=False)
        # With a body: evhttp answers 501 and closes; a 405 that read the body may keep
        # the connection.
        self.refused(self.req("FROBNICATE", self.put_path, self.body), (400, 405, 501),
                     close=False)

    def test_whitespace_in_header_name_writes_nothing(self):
        # evhttp accepts "Bad Name: 1"; the own server must refuse it (OwnServerTest).
        r = self.call("POST", self.put_path, b"{}", headers=["Bad Name: 1"])
        self.assertIn(r.status, (400,), r)  # evhttp: the put's own 400 (tasks missing)
        self.assert_serves()

    def test_request_target_forms(self):
        # Origin form without the leading '/': evhttp serves it; 400 is right.
        r = self.call("GET", "v1/health", token=None)
        self.assertIn(r.status, (200, 400), r)
        # "*" is for OPTIONS only.
        r = self.call("GET", "*", token=None)
        self.assertIn(r.status, (400, 404), r)
        if r.status == 404:
            self.assert_envelope(r, 404, "not_found")
        # Absolute form must be accepted (RFC 9112 3.2.2).
        with self.wire() as w:
            w.send(self.req("GET", "http://127.0.0.1:%d/v1/health" % self.head.port))
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
        self.assert_serves()

    def test_lenient_line_forms(self):
        # obs-fold and bare LF: RFC 9112 lets a server accept (evhttp) or refuse them.
        r = self.refused(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
                         (200, 400), close=False)
        r = self.refused(b"GET /v1/health HTTP/1.1\nHost: x\n\n", (200, 400), close=False)
        if r.status == 200:
            self.assertEqual(r.json["status"], "ok", r)


# ---- 5. HEAD ------------------------------------------------------------------------

class HeadRequestTest(WireCase):
    def test_head_matches_get(self):
        self.create_queue()
        path = "/v1/queues/" + self.q
        with self.wire() as w:
            for p, status in ((path, 200), (path + "-absent", 404), ("/v1/nope", 404)):
                w.send(self.req("GET", p) + self.req("HEAD", p) + self.req("GET", p))
                got = w.read_reply()
                head = w.read_reply("HEAD")
                again = w.read_reply()
                self.assertEqual((got.status, head.status, again.status), (status,) * 3, p)
                self.assertEqual(head.header("Content-Length"), str(len(got.body)), head)
                self.assertEqual(head.header("Content-Type"), got.header("Content-Type"), head)
                self.assertEqual(again.body, got.body)
            self.assert_usable(w)
            self.assertEqual(w.buf, b"")

    def test_head_of_a_blob(self):
        blob = bytes(range(256)) * 40
        path = "/v1/shared/%s/b" % self.q
        r = self.call("PUT", path, blob, ctype=OCTET)
        self.assertEqual(r.status, 201, r)
        with self.wire() as w:
            w.send(self.req("HEAD", path) + self.req("GET", path))
            head = w.read_reply("HEAD")
            got = w.read_reply()
            self.assertEqual((head.status, got.status, got.body), (200, 200, blob))
            for name in ("Content-Length", "Content-Type", "ETag", "X-Muster-Level"):
                self.assertEqual(head.header(name), got.header(name), name)
            self.assertEqual(head.header("Content-Length"), str(len(blob)))
            self.assert_usable(w)


# ---- 6. routing, methods, paths and queries -----------------------------------------

class RoutingTest(WireCase):
    def test_unknown_path_and_wrong_method(self):
        # A 405 names the methods the path does take in Allow (RFC 9110, 15.5.6);
        # GET routes answer HEAD too, so HEAD is listed with them.
        queue = "/v1/queues/" + self.q
        with self.wire() as w:
            for method, path, status, code, allow in (
                    ("GET", "/v1/nope", 404, "not_found", None),
                    ("POST", "/v2/health", 404, "not_found", None),
                    ("GET", "/", 200, None, None),
                    ("POST", "/v1/health", 405, "method_not_allowed", {"GET", "HEAD"}),
                    ("DELETE", "/v1/health", 405, "method_not_allowed", {"GET", "HEAD"}),
                    ("DELETE", "/v1/queues", 405, "method_not_allowed", {"GET", "HEAD"}),
                    ("PATCH", "/v1/queues", 405, "method_not_allowed", {"GET", "HEAD"}),
                    ("OPTIONS", "/v1/queues", 405, "method_not_allowed", {"GET", "HEAD"}),
                    ("POST", queue, 405, "method_not_allowed",
                     {"GET", "HEAD", "PUT", "DELETE"}),
                    ("POST", "/v1/shared/models/weights", 405, "method_not_allowed",
                     {"GET", "HEAD", "PUT", "DELETE"})):
                w.send(self.req(method, path))
                r = w.read_reply()
                if code:
                    self.assert_envelope(r, status, code)
                else:
                    self.assertEqual(r.status, status, r)
                if allow is None:
                    self.assertEqual(r.header_all("Allow"), [], r)
                else:
                    self.assertEqual(len(r.header_all("Allow")), 1, r)
                    listed = [m.strip() for m in r.header("Allow").split(",")]
                    self.assertEqual(sorted(listed), sorted(allow), r)
            self.assert_usable(w)

    def test_percent_encoded_segments(self):
        name = self.q + "-x"
        encoded = self.q + "%2Dx"
        r = self.expect("PUT", "/v1/queues/" + encoded, {}, status=201)
        self.assertEqual(r["name"], name)
        self.assertEqual(self.expect("GET", "/v1/queues/" + name)["name"], name)
        self.assertEqual(self.expect("GET", "/v1/queues/" + encoded.replace("%2D", "%2d"))
                         ["name"], name)
        r = self.call("GET", "/v1/queues/" + self.q + "%20x")
        self.assert_envelope(r, 400, "name_invalid")  # decoded, then checked
        self.assertIn(self.q + " x", r.json["error"]["message"], r)

    def test_query_parameters(self):
        self.create_queue()
        r = self.expect("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(*range(5)),
                        status=201)
        ids = [t["id"] for t in r["tasks"]]
        self.expect("POST", "/v1/queues/%s/lease" % self.q, {"max": 2})
        base = "/v1/queues/%s/tasks" % self.q
        page = self.expect("GET", base + "?limit=2")
        self.assertEqual(([t["id"] for t in page["tasks"]], page["next"]), (ids[:2], ids[1]))
        page = self.expect("GET", base + "?limit=2&after=%d" % ids[1])
        self.assertEqual([t["id"] for t in page["tasks"]], ids[2:4])
        page = self.expect("GET", base + "?state=leased")
        self.assertEqual(([t["id"] for t in page["tasks"]], page["next"]), (ids[:2], None))
        page = self.expect("GET", base + "?state=queued&limit=%32")  # %32 is "2"
        self.assertEqual([t["id"] for t in page["tasks"]], ids[2:4])
        for query in ("?limit=0", "?limit=1001", "?limit=abc", "?state=bogus", "?after=-1"):
            with self.subTest(query=query):
                self.assert_envelope(self.call("GET", base + query), 400, "invalid_argument")


# ---- 7. auth ------------------------------------------------------------------------

class AuthTest(WireCase):
    def test_unauthorized(self):
        with self.wire() as w:
            for auth in (None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer"):
                w.send(request("GET", "/v1/queues", None,
                               headers=["Authorization: " + auth] if auth else []))
                r = w.read_reply()
                self.assert_envelope(r, 401, "unauthorized")
                self.assertEqual(r.header_all("WWW-Authenticate"), ['Bearer realm="muster"'], r)
            self.assert_usable(w)


# ---- 8. Expect: 100-continue ---------------------------------------------------------

class ExpectTest(WireCase):
    def test_json_post_waiting_for_continue(self):
        self.create_queue()
        body = json.dumps(self.put_body("cont")).encode()
        head = self.req("POST", "/v1/queues/%s/tasks" % self.q, None,
                        headers=["Content-Type: application/json",
                                 "Content-Length: %d" % len(body), "Expect: 100-continue"])
        with self.wire() as w:
            w.send(head)
            r = w.read_reply(interim=True)
            self.assertEqual(r.status, 100, r)
            self.assertEqual(r.headers, [], r)
            w.send(body)
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assert_usable(w)
        self.assertEqual([t["payload"] for t in self.tasks()], ["cont"])

    def test_json_post_sent_at_once(self):
        self.create_queue()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body("once"),
                            headers=["Expect: 100-continue"]))
            r = w.read_reply(interim=True)
            if r.status == 100:  # optional when the body is already there (RFC 9110 10.1.1)
                r = w.read_reply(interim=True)
            self.assertEqual(r.status, 201, r)
            self.assert_usable(w)
        self.assertEqual(len(self.tasks()), 1)

    def test_unknown_expectation(self):
        # RFC 9110 10.1.1: 417 (evhttp: HTML, then the close), or the request served.
        self.create_queue()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, self.put_body("odd"),
                            headers=["Expect: something-else"]))
            r = w.read_reply(interim=True)
            self.assertIn(r.status, (201, 417), r)
            self.assert_usable_or_closed(w, r)
        self.assertEqual(len(self.tasks()), 1 if r.status == 201 else 0)

    def test_get_with_expect(self):
        with self.wire() as w:
            w.send(self.req("GET", "/v1/health", headers=["Expect: 100-continue"]))
            r = w.read_reply(interim=True)  # no body to wait for: no 100
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            self.assert_usable(w)

    def test_upload_accepted(self):
        blob = b"u" * 200000
        path = "/v1/shared/%s/up" % self.q
        head = self.req("PUT", path, None, headers=["Content-Type: " + OCTET,
                                                    "Content-Length: %d" % len(blob),
                                                    "Expect: 100-continue"])
        with self.wire() as w:
            w.send(head)
            r = w.read_reply(interim=True)
            self.assertEqual((r.status, r.headers), (100, []), r)
            w.send(blob)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["size"]), (201, len(blob)), r)
            self.assert_json_framing(r)
            self.assertFalse(r.closes(), r)
            w.send(self.req("GET", path))
            r = w.read_reply()
            self.assertEqual((r.status, r.body), (200, blob))

    def test_upload_refused_before_the_body(self):
        for name, token, status, code in (("ok", None, 401, "unauthorized"),
                                          ("bad%20name", self.token, 400, "name_invalid")):
            with self.subTest(name=name), self.wire() as w:
                w.send(request("PUT", "/v1/shared/%s/%s" % (self.q, name), token, None,
                               headers=["Content-Type: " + OCTET, "Content-Length: 1000000",
                                        "Expect: 100-continue"]))
                r = w.read_reply(interim=True)  # no 100 first
                self.assert_envelope(r, status, code)
                self.assertTrue(r.closes(), r)
                self.assertTrue(w.closed_after())
        r = self.call("GET", "/v1/shared/" + self.q)
        self.assertEqual((r.status, r.json["blobs"]), (200, []), r)


# ---- 9. client disconnects ----------------------------------------------------------

class DisconnectTest(WireCase):
    def test_half_a_body_then_close(self):
        self.create_queue()
        body = json.dumps(self.put_body("half")).encode()
        for data in (self.req("POST", "/v1/queues/%s/tasks" % self.q, body)[:-5],
                     self.req("POST", "/v1/queues/%s/tasks" % self.q,
                              chunked(body, 8)[:-10], headers=["Transfer-Encoding: chunked"]),
                     self.req("POST", "/v1/queues/%s/tasks" % self.q, body)[:30]):
            with self.wire() as w:
                w.send(data)
                w.sock.shutdown(socket.SHUT_WR)
                # The server may answer (400) or just close; it must not run the put.
                r = w.outcome()
                if r != "closed":
                    self.assertEqual(r.status // 100, 4, r)
            # And gone at once, without waiting for anything.
            w = self.wire()
            w.send(data)
            w.close()
        self.assert_serves()
        self.assert_no_tasks()

    def test_gone_long_poll_does_not_swallow_a_task(self):
        self.create_queue()
        self.assertEqual(self.waiters(), 0)
        gone = self.wire()
        gone.send(self.req("POST", "/v1/queues/%s/lease" % self.q, {"wait_ms": 20000}))
        harness.wait_until(lambda: self.waiters() == 1, what="the long-poll parked")
        gone.close()
        harness.wait_until(lambda: self.waiters() == 0, what="the closed long-poll dropped")
        r = self.expect("POST", "/v1/queues/%s/tasks" % self.q, self.put_body("kept"),
                        status=201)
        tid = r["tasks"][0]["id"]
        got = self.expect("POST", "/v1/queues/%s/lease" % self.q, {})["leases"]
        self.assertEqual([(l["task"], l["payload"]) for l in got], [(tid, "kept")])

    def test_parked_long_poll_then_put_on_its_connection_order(self):
        # A long-poll pipelined before another request: the replies keep request order.
        self.create_queue()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/lease" % self.q, {"wait_ms": 200}) +
                   self.req("GET", "/v1/health", token=None))
            r = w.read_reply()
            self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)

    def test_many_silent_connections(self):
        self.assert_serves()
        before = self.head_fds()
        for _ in range(200):
            socket.create_connection(("127.0.0.1", self.head.port), timeout=GUARD_S).close()
        self.assert_serves()
        held = [socket.create_connection(("127.0.0.1", self.head.port), timeout=GUARD_S)
                for _ in range(200)]
        try:
            self.assert_serves()
        finally:
            for s in held:
                s.close()
        self.assert_serves()
        harness.wait_until(lambda: self.head_fds() <= before,
                           what="the head's descriptors back to %d" % before)


# ---- 10. large replies --------------------------------------------------------------

class ServerMetricsTest(WireCase):
    """/metrics counts the server's connections and its refusals on the wire."""

    def metric(self, name):
        body = self.call("GET", "/metrics").body.decode()
        return int(re.search(r"^%s (\d+)$" % name, body, re.M).group(1))

    def test_connections_gauge(self):
        base = self.metric("muster_http_connections")
        held = [self.wire() for _ in range(5)]
        try:
            for w in held:  # each is accepted once it has served a request
                w.send(self.req("GET", "/v1/health", token=None))
                self.assertEqual(w.read_reply().status, 200)
            # The /metrics request's own connection is open while it is counted.
            self.assertEqual(self.metric("muster_http_connections"), base + 5)
        finally:
            for w in held:
                w.close()
        harness.wait_until(lambda: self.metric("muster_http_connections") == base,
                           what="closed connections leave the gauge")

    def test_wire_errors_counted(self):
        before = self.metric("muster_http_wire_errors_total")
        for bad in (b"GARBAGE\r\n\r\n", b"GET /v1/health HTTP/1.1\r\nNoColon\r\n\r\n"):
            self.refused(bad, (400,))
        self.assertEqual(self.metric("muster_http_wire_errors_total"), before + 2)
        self.call("GET", "/v1/nope")  # routed: a 404 is not a wire error
        self.assertEqual(self.metric("muster_http_wire_errors_total"), before + 2)


class LargeReplyTest(WireCase):
    def slow_pace(self):
        n = [0]

        def pace():
            n[0] += 1
            if n[0] % 64 == 0:
                time.sleep(0.002)  # pacing the reader, not waiting for the server
        return pace

    def test_large_blob_read_slowly(self):
        blob = os.urandom(1 << 20) * 8
        path = "/v1/shared/%s/big" % self.q
        r = self.call("PUT", path, blob, ctype=OCTET)
        self.assertEqual(r.status, 201, r)
        with self.wire(rcvbuf=8192) as w:
            w.send(self.req("GET", path) + self.req("GET", "/v1/health", token=None))
            r = w.read_reply(bufsize=4096, pace=self.slow_pace())
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.header("Content-Length"), str(len(blob)))
            self.assertTrue(r.body == blob, "the blob arrived changed")
            r = w.read_reply()
            self.assertEqual(r.json["status"], "ok", r)

    def test_large_task_list_read_slowly(self):
        self.create_queue()
        per_put = 20
        batch = [self.req("POST", "/v1/queues/%s/tasks" % self.q,
                          self.put_body(*["%d-%s" % (i * per_put + j, "t" * 3000)
                                          for j in range(per_put)]))
                 for i in range(1000 // per_put)]
        with self.wire() as w:
            w.send(b"".join(batch))
            for _ in batch:
                self.assertEqual(w.read_reply().status, 201)
        with self.wire(rcvbuf=8192) as w:
            w.send(self.req("GET", "/v1/queues/%s/tasks?limit=1000" % self.q))
            r = w.read_reply(bufsize=4096, pace=self.slow_pace())
            self.assertGreater(len(r.body), 3000000)
            self.assert_json_framing(r)
            self.assertEqual([t["payload"].split("-")[0] for t in r.json["tasks"]],
                             [str(i) for i in range(1000)])
            self.assert_usable(w)


# ---- 11. framing --------------------------------------------------------------------

class FramingTest(WireCase):
    def test_json_replies_are_framed(self):
        self.create_queue()
        path = "/v1/queues/" + self.q
        cases = [self.req("GET", "/v1/health", token=None), self.req("GET", path),
                 self.req("POST", path + "/tasks", self.put_body(1)),
                 self.req("POST", path + "/tasks", b"[", ctype=JSON),
                 self.req("GET", "/v1/queues", token=None),
                 self.req("GET", "/v1/nope"), self.req("POST", "/v1/health"),
                 self.req("POST", path + "/tasks", self.put_body("x" * MAX_BODY)),
                 self.req("POST", path + "/tasks", b"{}", ctype="text/plain"),
                 self.req("DELETE", path + "-absent"), self.req("GET", "/metrics", token=None)]
        with self.wire() as w:
            w.send(b"".join(cases))
            statuses = []
            for _ in cases:
                r = w.read_reply()
                statuses.append(r.status)
                self.assert_json_framing(r)
            self.assertEqual(statuses, [200, 200, 201, 400, 401, 404, 405, 413, 415, 404, 401])

    def test_not_modified_has_no_body(self):
        path = "/v1/shared/%s/etag" % self.q
        r = self.call("PUT", path, b"etag me", ctype=OCTET)
        self.assertEqual(r.status, 201, r)
        etag = r.header("ETag")
        with self.wire() as w:
            w.send(self.req("GET", path, headers=["If-None-Match: " + etag]) +
                   self.req("GET", path, headers=["If-None-Match: *"]) +
                   self.req("GET", path, headers=['If-None-Match: "other"']) +
                   self.req("GET", "/v1/health", token=None))
            for status in (304, 304):
                r = w.read_reply()
                self.assertEqual((r.status, r.header("ETag")), (status, etag), r)
                self.assertIn(r.header("Content-Length"), (None, "7"), r)
            r = w.read_reply()
            self.assertEqual((r.status, r.body), (200, b"etag me"), r)
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            self.assertEqual(w.buf, b"")


# ---- what the own server must do where evhttp does not ------------------------------

def own(what):
    """Marks a case evhttp failed (`what` says how); the own server passes it."""
    def mark(test):
        test.evhttp_did = what
        return test
    return mark


class FuzzTest(WireCase):
    """Seeded random streams: valid requests cut at random points, pipelined, mixed
    with garbage, and connections closed mid-request.  Whatever arrives, the head must
    answer what it can, never write a task it did not acknowledge, and stay up (under
    the sanitizers, with no memory error)."""

    SEED = 20261122

    def stream(self, rng, put_path):
        pieces = []
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            if kind < 0.35:
                pieces.append(self.req("POST", put_path, {"tasks": [{"payload": "fuzz"}]}))
            elif kind < 0.5:
                pieces.append(self.req("GET", "/v1/queues"))
            elif kind < 0.6:
                body = b'{"tasks":[{"payload":"chunk"}]}'
                cut = rng.randint(1, len(body) - 1)
                pieces.append(request("POST", put_path, self.token, None,
                                      headers=["Content-Type: application/json",
                                               "Transfer-Encoding: chunked"]) +
                              b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
                                  cut, body[:cut], len(body) - cut, body[cut:]))
            elif kind < 0.75:
                junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
                pieces.append(junk + b"\r\n\r\n")
            else:
                good = self.req("POST", put_path, {"tasks": [{"payload": "cut"}]})
                pieces.append(good[:rng.randint(0, len(good) - 1)])
                break  # what follows a cut request is its body, as far as the head knows
        return b"".join(pieces)

    def test_random_streams(self):
        import random
        rng = random.Random(self.SEED)
        self.create_queue()
        put_path = "/v1/queues/%s/tasks" % self.q
        acknowledged = 0
        for i in range(150):
            data = self.stream(rng, put_path)
            with self.wire(timeout=5) as w:
                if rng.random() < 0.5:
                    w.send(data)
                else:
                    w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    for j in range(0, len(data), rng.randint(1, 40)):
                        w.send(data[j:j + 40])
                if rng.random() < 0.3:
                    continue  # closed without reading anything
                w.sock.shutdown(socket.SHUT_WR)
                while True:  # read replies until the head closes
                    try:
                        r = w.read_reply()
                    except (Closed, socket.timeout, ConnectionResetError):
                        break
                    if r.status == 201:
                        acknowledged += 1
        self.assert_serves()
        # Every acknowledged put is there; a put whose reply was not read may be too.
        self.assertGreaterEqual(len(self.tasks()), acknowledged)
        self.assertGreater(acknowledged, 20, "the fuzz streams should hold good requests")


class OwnServerTest(WireCase):
    """The correct behaviour where evhttp's differed."""

    def refused_envelope(self, data, status, code):
        with self.wire() as w:
            w.send(data)
            r = w.read_reply()
            self.assert_envelope(r, status, code)
            self.assertTrue(r.closes(), r)
            self.assertTrue(w.closed_after())
        self.assert_serves()

    @own("refuses malformed requests with an HTML page (text/html); the own server must "
         "answer the JSON envelope, then close")
    def test_protocol_refusals_in_the_envelope(self):
        self.create_queue()
        put = "/v1/queues/%s/tasks" % self.q
        body = json.dumps(self.put_body("x")).encode()
        for data, status, code in (
                (b"\x01\x02garbage\r\n\r\n", 400, "bad_request"),
                (b"GET /v1/health\r\n\r\n", 400, "bad_request"),
                (b"GET /v1/health HTTP/1.1\r\nNoColon\r\n\r\n", 400, "bad_request"),
                (self.req("POST", put, body, headers=["Content-Length: -5"]), 400, "bad_request"),
                (self.req("POST", put, body, headers=["Content-Length: abc"]), 400,
                 "bad_request"),
                (self.req("POST", put, chunked(body, 9), headers=[
                    "Content-Length: 9", "Transfer-Encoding: chunked"]), 400, "bad_request"),
                (self.req("POST", put, b"zz\r\n" + body + b"\r\n0\r\n\r\n",
                          headers=["Transfer-Encoding: chunked"]), 400, "bad_request"),
                (self.req("POST", put, None, headers=[
                    "Content-Type: application/json",
                    "Content-Length: %d" % (HTTP_LAYER_LIMIT + 1)]), 413, "body_too_large")):
            with self.subTest(data=data[:60]):
                self.refused_envelope(data, status, code)
        self.assert_no_tasks()

    @own("answers 400 to a header section over 64 KiB; the own server must answer 431")
    def test_header_section_too_large_is_431(self):
        with self.wire() as w:
            w.send(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
            r = w.read_reply()
            self.assertEqual(r.status, 431, r)
            self.assertTrue(w.closed_after())

    @own("answers 413 (HTML) to a malformed chunk size; the own server must answer 400")
    def test_bad_chunk_size_is_400(self):
        self.create_queue()
        self.refused_envelope(self.req("POST", "/v1/queues/%s/tasks" % self.q,
                                       b"zz\r\n{}\r\n0\r\n\r\n",
                                       headers=["Transfer-Encoding: chunked"]),
                              400, "bad_request")

    @own("ignores 'Transfer-Encoding: gzip', runs the request without a body and reads the "
         "body as the next request; the own server must answer 501 and close")
    def test_unknown_transfer_encoding_is_501(self):
        self.create_queue()
        body = json.dumps(self.put_body("smuggled")).encode()
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, body,
                            headers=["Transfer-Encoding: gzip"]))
            r = w.read_reply()
            self.assertEqual(r.status, 501, r)
            self.assert_json_framing(r)
            self.assertTrue(w.closed_after())
        self.assert_no_tasks()

    @own("takes the first of two different Content-Lengths (a put with the first one "
         "right is run: 201) and reads what is left as the next request; the own server "
         "must answer 400 and close (RFC 9112 6.3)")
    def test_conflicting_content_lengths_are_400(self):
        self.create_queue()
        body = json.dumps(self.put_body("smuggled")).encode()
        for first, second in ((2, 3), (len(body), 2)):
            self.refused_envelope(self.req("POST", "/v1/queues/%s/tasks" % self.q, body,
                                           headers=["Content-Length: %d" % first,
                                                    "Content-Length: %d" % second]),
                                  400, "bad_request")
        self.assert_no_tasks()

    @own("reads 'Content-Length: +2' as 2; the own server must answer 400 and close "
         "(Content-Length is 1*DIGIT)")
    def test_signed_content_length_is_400(self):
        self.create_queue()
        self.refused_envelope(self.req("POST", "/v1/queues/%s/tasks" % self.q, b"{}",
                                       headers=["Content-Length: +2"]), 400, "bad_request")

    @own("refuses a chunk extension ('A;name=value') with 413 (HTML) and closes; the own "
         "server must ignore it (RFC 9112 7.1.1)")
    def test_chunk_extension_is_ignored(self):
        self.create_queue()
        body = json.dumps(self.put_body("ext")).encode()
        framed = (b"A;name=value\r\n" + body[:10] + b"\r\n" +
                  b"%x;x\r\n" % (len(body) - 10) + body[10:] + b"\r\n0;last\r\n\r\n")
        with self.wire() as w:
            w.send(self.req("POST", "/v1/queues/%s/tasks" % self.q, framed,
                            headers=["Transfer-Encoding: chunked"]))
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)
            self.assert_usable(w)

    @own("decodes percent-encoded query values but not keys ('?st%61te=queued' is an "
         "unknown key, silently ignored); the own server must decode keys too")
    def test_query_keys_decode(self):
        self.create_queue()
        self.expect("POST", "/v1/queues/%s/tasks" % self.q, self.put_body(1, 2), status=201)
        self.expect("POST", "/v1/queues/%s/lease" % self.q, {})
        page = self.expect("GET", "/v1/queues/%s/tasks?st%%61te=queued" % self.q)
        self.assertEqual([t["payload"] for t in page["tasks"]], [2])

    @own("serves 'GET v1/health' as if it were '/v1/health'; the own server must answer 400")
    def test_target_without_slash_is_400(self):
        self.refused_envelope(b"GET v1/health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request")

    @own("serves an HTTP/1.1 request without Host; the own server must answer 400 "
         "(RFC 9112 3.2)")
    def test_missing_host_is_400(self):
        self.refused_envelope(b"GET /v1/health HTTP/1.1\r\n\r\n", 400, "bad_request")

    @own("accepts a header name with a space ('Bad Name: 1'); the own server must answer 400")
    def test_space_in_header_name_is_400(self):
        self.refused_envelope(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
                              400, "bad_request")

    @own("sends nothing to CONNECT and holds the connection open until its timeout; the own "
         "server must answer (400, 405 or 501)")
    def test_connect_is_answered(self):
        for target in (b"127.0.0.1:80", b"/v1/health"):
            with self.wire(timeout=3) as w:
                w.send(b"CONNECT " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                r = w.read_reply()
                self.assertIn(r.status, (400, 405, 501), r)
                self.assert_json_framing(r)

    @own("serves an absolute-form target and then closes the connection; the own server "
         "must keep it")
    def test_absolute_form_keeps_the_connection(self):
        with self.wire() as w:
            w.send(self.req("GET", "http://127.0.0.1:%d/v1/health" % self.head.port))
            r = w.read_reply()
            self.assertEqual(r.status, 200, r)
            self.assertFalse(r.closes(), r)
            self.assert_usable(w)

    @own("sends '100 Continue' to every JSON POST that asks, before the route's checks: "
         "also with a Content-Length over the route's limit, without a token, or to an "
         "unknown path (the refusal comes once the body came); the own server must refuse "
         "these at once, without the 100, and close")
    def test_expect_refused_before_the_body(self):
        self.create_queue()
        path = "/v1/queues/%s/tasks" % self.q
        for p, token, length, status, code in (
                (path, self.token, MAX_BODY + 1, 413, "body_too_large"),
                (path, None, 30, 401, "unauthorized"),
                ("/v1/nope", self.token, 30, 404, "not_found")):
            with self.subTest(status=status), self.wire() as w:
                w.send(request("POST", p, token, None,
                               headers=["Content-Type: application/json",
                                        "Content-Length: %d" % length,
                                        "Expect: 100-continue"]))
                r = w.read_reply(interim=True)
                self.assert_envelope(r, status, code)
                self.assertTrue(r.closes(), r)
                self.assertTrue(w.closed_after())

    def blobs(self):
        return [b["name"] for b in self.expect("GET", "/v1/shared/" + self.q)["blobs"]]

    @own("the upload tap (shared_upload.c) ignores 'Transfer-Encoding: gzip' on a PUT "
         "/v1/shared/...: it stores an empty blob (201, size 0) and runs the body as the "
         "next request on the connection; the own server must answer 501, store nothing, "
         "and close")
    def test_upload_with_unknown_transfer_encoding_is_501(self):
        smuggled = self.req("GET", "/v1/health", token=None)
        with self.wire() as w:
            w.send(self.req("PUT", "/v1/shared/%s/gz" % self.q, smuggled, ctype=OCTET,
                            headers=["Transfer-Encoding: gzip"]))
            r = w.read_reply()
            self.assertEqual(r.status, 501, r)
            self.assert_json_framing(r)
            self.assertTrue(w.closed_after())
        self.assertEqual(self.blobs(), [])

    @own("the upload tap takes the first of two Content-Lengths ('0', then '36'): it stores "
         "an empty blob (201) and runs the body as the next request; the own server must "
         "answer 400, store nothing, and close")
    def test_upload_with_conflicting_lengths_is_400(self):
        smuggled = self.req("GET", "/v1/health", token=None)
        self.refused_envelope(self.req("PUT", "/v1/shared/%s/two" % self.q, smuggled,
                                       ctype=OCTET, headers=[
                                           "Content-Length: 0",
                                           "Content-Length: %d" % len(smuggled)]),
                              400, "bad_request")
        self.assertEqual(self.blobs(), [])

    @own("the upload tap reads an upload with both Content-Length and 'Transfer-Encoding: "
         "chunked' as chunked (201) and keeps the connection; RFC 9112 6.1 wants 400, or "
         "the chunked body and then the close")
    def test_upload_with_length_and_chunked(self):
        with self.wire() as w:
            w.send(self.req("PUT", "/v1/shared/%s/both" % self.q, chunked(b"hello", 2),
                            ctype=OCTET, headers=["Content-Length: 5",
                                                  "Transfer-Encoding: chunked"]))
            r = w.read_reply()
            if r.status == 201:
                self.assertEqual(r.json["size"], 5, r)
                self.assertTrue(r.closes(), r)
            else:
                self.assert_envelope(r, 400, "bad_request")
            self.assertTrue(w.closed_after())


# ---- 12. read deadlines (slowloris) -------------------------------------------------

HEAD_MS = 300  # the head's MUSTER_HTTP_HEAD_TIMEOUT_MS in ReadTimeoutTest
BODY_MS = 300  # its MUSTER_HTTP_BODY_TIMEOUT_MS
LATE_S = 2.0  # how late a 408 may come after its deadline (a loaded machine, sanitizers)
PACE_S = 0.05  # a trickle's pace: well below both limits


class ReadTimeoutTest(WireCase):
    """A request must be read within its deadlines: the head whole HEAD_MS after its
    first byte, the body without a gap of BODY_MS.  Sleeps here pace what the client
    sends (the thing tested); the test waits for replies and closes, not for time."""

    @classmethod
    def setUpClass(cls):
        cls.slow = harness.Head(["--sweep-ms", "50", "--max-body", str(MAX_BODY)],
                                env={"MUSTER_HTTP_HEAD_TIMEOUT_MS": str(HEAD_MS),
                                     "MUSTER_HTTP_BODY_TIMEOUT_MS": str(BODY_MS)}).start()

    @classmethod
    def tearDownClass(cls):
        cls.slow.stop_checked()

    def setUp(self):
        super().setUp()
        self.head = self.slow
        self.token = self.slow.token
        if self.slow.proc.poll() is not None:
            self.fail("head exited with %s:\n%s" % (self.slow.proc.returncode, self.slow.log()))

    def metric(self, name):
        body = self.call("GET", "/metrics").body.decode()
        return int(re.search(r"^%s (\d+)$" % name, body, re.M).group(1))

    def trickle(self, w, data, pace=PACE_S):
        """Sends `data` a byte at a time, `pace` seconds apart, until the server answers
        (the socket turns readable) or all of it went; returns the bytes sent."""
        w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            try:
                w.sock.sendall(data[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return i
            readable, _, _ = select.select([w.sock], [], [], pace)
            if readable:
                return i + 1
        return len(data)

    def send_paced(self, w, pieces, gap_s):
        """Sends each of `pieces`, `gap_s` seconds after the one before."""
        w.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(gap_s)
            w.sock.sendall(piece)

    def assert_timed_out(self, w, since, limit_ms, what, early_s=0.05):
        """The next reply on `w`, whose wait began at `since` (time.monotonic()), is the
        408 envelope naming `what`, then the close; it came at the limit (`early_s` for
        a coarse clock, or a `since` taken late), not much after."""
        r = w.read_reply()
        elapsed = time.monotonic() - since
        self.assert_envelope(r, 408, "bad_request")
        self.assertEqual(r.reason, "Request Timeout", r)
        self.assertIn(what, r.json["error"]["message"], r)
        self.assertTrue(r.closes(), r)
        self.assertTrue(w.closed_after())
        self.assertGreaterEqual(elapsed, limit_ms / 1000 - early_s, r)
        self.assertLess(elapsed, limit_ms / 1000 + LATE_S, r)

    def assert_cut(self, w):
        """The head deadline is live on `w`: a head begun and left there gets its 408."""
        since = time.monotonic()
        w.send(b"GET /v1/health HTTP/1.1\r\nHo")
        self.assert_timed_out(w, since, HEAD_MS, "request head")

    def blobs(self):
        return [b["name"] for b in self.expect("GET", "/v1/shared/" + self.q)["blobs"]]

    def test_head_trickled_past_the_limit(self):
        before = self.metric("muster_http_wire_errors_total")
        data = self.req("GET", "/v1/health", token=None, headers=["X-Pad: " + "p" * 80])
        self.assertGreater(len(data) * PACE_S, 10 * HEAD_MS / 1000)  # each byte in time
        with self.wire() as w:
            since = time.monotonic()
            sent = self.trickle(w, data)
            self.assertLess(sent, len(data) // 2, "the head was not cut")
            self.assert_timed_out(w, since, HEAD_MS, "request head")
        self.assertEqual(self.metric("muster_http_wire_errors_total"), before + 1)
        self.assert_serves()

    def test_heads_trickled_within_the_limit(self):
        data = self.req("GET", "/v1/health", token=None)
        quarter = len(data) // 4
        pieces = [data[:quarter], data[quarter:2 * quarter], data[2 * quarter:3 * quarter],
                  data[3 * quarter:]]
        with self.wire() as w:
            start = time.monotonic()
            for _ in range(5):  # each head has its own deadline, from its first byte
                self.send_paced(w, pieces, HEAD_MS / 1000 / 10)
                r = w.read_reply()
                self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            self.assertGreater(time.monotonic() - start, HEAD_MS / 1000)
            self.assert_cut(w)

    def test_body_that_stalls(self):
        self.create_queue()
        body = json.dumps(self.put_body("stalled")).encode()
        path = "/v1/queues/%s/tasks" % self.q
        blob = b"b" * 100000
        for name, data in (
                ("length", self.req("POST", path, body)[:-5]),
                ("chunked", self.req("POST", path, chunked(body, 8),
                                     headers=["Transfer-Encoding: chunked"])[:-10]),
                ("upload", self.req("PUT", "/v1/shared/%s/stalled" % self.q, blob,
                                    ctype=OCTET)[:-len(blob) // 2]),
                ("upload, chunked", self.req("PUT", "/v1/shared/%s/stalled" % self.q,
                                             chunked(blob, 4096), ctype=OCTET,
                                             headers=["Transfer-Encoding: chunked"])[:-5000])):
            with self.subTest(body=name), self.wire() as w:
                since = time.monotonic()
                w.send(data)
                self.assert_timed_out(w, since, BODY_MS, "request body")
        self.assert_serves()
        self.assert_no_tasks()
        self.assertEqual(self.blobs(), [])

    def test_body_slow_but_steady(self):
        self.create_queue()
        body = json.dumps(self.put_body(*["steady %d" % i for i in range(40)])).encode()
        blob = bytes(range(256)) * 64
        for name, data in (("length", self.req("POST", "/v1/queues/%s/tasks" % self.q, body)),
                           ("upload", self.req("PUT", "/v1/shared/%s/steady" % self.q, blob,
                                               ctype=OCTET))):
            with self.subTest(body=name), self.wire() as w:
                head_end = data.index(b"\r\n\r\n") + 4
                step = (len(data) - head_end) // 8 + 1
                pieces = [data[:head_end]] + [data[i:i + step]
                                              for i in range(head_end, len(data), step)]
                start = time.monotonic()
                self.send_paced(w, pieces, BODY_MS / 1000 / 3)
                r = w.read_reply()
                self.assertEqual(r.status, 201, r)
                self.assertGreater(time.monotonic() - start, 2 * max(HEAD_MS, BODY_MS) / 1000)
                self.assert_cut(w)
        self.assertEqual(len(self.tasks()), 40)
        self.assertEqual(self.blobs(), ["steady"])

    def test_long_poll_is_not_cut(self):
        self.create_queue()
        wait_ms = 4 * max(HEAD_MS, BODY_MS)
        lease = self.req("POST", "/v1/queues/%s/lease" % self.q, {"wait_ms": wait_ms})
        for behind in (b"", b"GET /v1/health HTTP/1.1\r\nHo"):
            with self.subTest(behind=behind), self.wire() as w:
                start = time.monotonic()
                w.send(lease + behind)
                r = w.read_reply()
                self.assertEqual((r.status, r.json), (200, {"leases": []}), r)
                self.assertGreaterEqual(time.monotonic() - start, wait_ms / 1000 - 0.05)
                if behind:
                    # The head waiting behind the long-poll: its deadline runs from the
                    # lease's answer (a moment before the client read it).
                    self.assert_timed_out(w, time.monotonic(), HEAD_MS, "request head",
                                          early_s=HEAD_MS / 1000 / 2)
                else:
                    self.assert_cut(w)

    def test_idle_keep_alive_is_not_cut(self):
        with self.wire() as w:
            # A stray blank line after a request starts no head.
            w.send(self.req("GET", "/v1/health", token=None) + b"\r\n")
            r = w.read_reply()
            self.assertEqual((r.status, r.json["status"]), (200, "ok"), r)
            time.sleep(3 * max(HEAD_MS, BODY_MS) / 1000)  # idle: the thing tested
            self.assert_usable(w)
            self.assert_cut(w)

    def test_bad_setting_is_refused(self):
        head = harness.Head(env={"MUSTER_HTTP_HEAD_TIMEOUT_MS": "soon"}).start()
        try:
            with Wire(head.port) as w:
                w.send(request("GET", "/v1/health"))
                self.assertEqual(w.read_reply().status, 200)
            self.assertIn("MUSTER_HTTP_HEAD_TIMEOUT_MS=soon is not", head.log())
        finally:
            head.cleanup()


if __name__ == "__main__":
    unittest.main()
