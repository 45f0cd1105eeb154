"""The head under a hostile or careless client: what a walk of its network surface found
that test_http_wire.py, test_api_badinput.py and test_api_auth.py did not cover.  Each
test fails without its fix.

- A request refused whatever its body holds (no token, a wrong one, the read-only token
  on a write, no such endpoint, a body over the route's limit) is answered as soon as
  its line and headers are in, and its body is read and dropped as it comes, not kept:
  the head waited for the whole body first, holding up to four times --max-body plus
  64 KiB (32 MiB by default) in memory per connection, for anyone who could reach its
  port, token or not (100 such connections took 1.8 GB).  The connection goes on after
  a body with a length; a chunked one that passes that size closes it.
- A NUL byte or a CR not followed by LF in the request line or a header is refused 400
  (RFC 9110, 5.5): a NUL cut the header's value short unseen, so that
  `Authorization: Bearer TOKEN<NUL>junk` was taken as TOKEN.
- A real past a double's range (1e999) is refused bad_json saying that range; the
  message said "integers are at most 2^63-1", which is true and no help.
- Out of descriptors, the head says so in its log once (it said nothing: clients hung
  in the listen backlog with no word anywhere), serves the connections it has, and says
  when it accepts again; a shared-data read or upload that cannot open its file then
  answers 503 unavailable, to be retried (the read answered 500 "level 1 of 'a' is
  missing from DIR/shared (Too many open files); set it again", the upload 500), and so
  does a backup (it answered 500 store_error "cannot create .../muster.db: unable to
  open database file").
- Shared data scopes and names "." and ".." are refused (name_invalid): every node
  agent refuses them for its cache, whose files are SCOPE/NAME@..., so such a blob was
  stored by the head and could never be read through a node.
- "." and ".." are no names anywhere (queues, iterations, nodes, instances, a worker's
  queues, lease keys): curl and browsers collapse /v1/queues/.. to /v1/, so a queue made
  by a client that sends its path as it is could never be reached by the others.  A
  queue or iteration an older head made under such a name is still found under it.
"""
import os
import resource
import select
import socket
import sqlite3
import sys
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402

READ_TOKEN = "read-only-token-0123"
MAX_BODY = 8 << 20  # the head's default --max-body
LAYER_LIMIT = 4 * MAX_BODY + 65536  # what its HTTP layer reads of a body at most
REPLY_WAIT_S = 5  # a reply that is due comes within this


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


class HeadCase(unittest.TestCase):
    head_args = []

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--dashboard-token", READ_TOKEN] + cls.head_args).start()
        cls.token = cls.head.token
        r = cls.head.request("PUT", "/v1/queues/abuse", body={})
        assert r.status in (200, 201), r

    @classmethod
    def tearDownClass(cls):
        cls.head.stop_checked()

    def wire(self):
        return Wire(self.head.port)

    def reply_within(self, w, seconds=REPLY_WAIT_S):
        """The next reply, which must start arriving within `seconds`."""
        if not w.buf:
            ready, _, _ = select.select([w.sock], [], [], seconds)
            self.assertTrue(ready, "no reply within %d s" % seconds)
        return w.read_reply()

    def assert_usable(self, w):
        w.send(request("GET", "/v1/health"))
        r = w.read_reply()
        self.assertEqual(r.status, 200, r)


class RefusedBodyTest(HeadCase):
    def post_head(self, path, length, token=None, chunked=False):
        framing = "Transfer-Encoding: chunked" if chunked else "Content-Length: %d" % length
        return request("POST", path, token, None,
                       headers=["Content-Type: application/json", framing])

    def test_refused_before_the_body_and_the_connection_goes_on(self):
        length = 4 << 20
        tasks = "/v1/queues/abuse/tasks"
        cases = [(None, tasks, 401, "unauthorized"),
                 ("wrong-token-0123456789", tasks, 401, "unauthorized"),
                 (READ_TOKEN, tasks, 403, "forbidden"),
                 (self.token, "/v1/nothing/here", 404, "not_found"),
                 (self.token, "/v1/queues/a%2Fb/tasks", 400, "name_invalid"),
                 (self.token, tasks, 413, "body_too_large")]  # over --max-body
        for token, path, status, code in cases:
            with self.subTest(path=path, token=token), self.wire() as w:
                size = MAX_BODY + 4096 if status == 413 else length
                w.send(self.post_head(path, size, token) + b" " * 1000)
                # Answered while most of the body is still to come: the head did not
                # wait for it (it waited, to hold it all, then answered).
                r = self.reply_within(w)
                self.assertEqual((r.status, r.error_code), (status, code), r)
                self.assertFalse(r.closes(), r)
                w.send(b" " * (size - 1000))
                self.assert_usable(w)

    def test_a_right_token_still_waits_for_its_body(self):
        body = b'{"tasks": [{"payload": "late"}]}'
        with self.wire() as w:
            w.send(self.post_head("/v1/queues/abuse/tasks", len(body), self.token) + body[:5])
            ready, _, _ = select.select([w.sock], [], [], 0.3)
            if ready:
                self.fail("answered before its body: %r" % w.sock.recv(300))
            w.send(body[5:])
            r = w.read_reply()
            self.assertEqual(r.status, 201, r)

    def test_refused_bodies_are_not_kept(self):
        pid = self.head.proc.pid
        before = rss_bytes(pid)
        conns, sent = [], 24 << 20
        try:
            for _ in range(8):
                w = self.wire()
                conns.append(w)
                w.send(self.post_head("/v1/queues/abuse/tasks", LAYER_LIMIT - 65536))
                w.send(b" " * sent)
            for w in conns:  # each was refused, all of its bytes read
                r = self.reply_within(w)
                self.assertEqual(r.status, 401, r)
            grown = rss_bytes(pid) - before
            # Kept, the 8 bodies would be 192 MiB.
            self.assertLess(grown, 48 << 20, "the head grew %d MiB" % (grown >> 20))
        finally:
            for w in conns:
                w.close()

    def test_a_chunked_body_past_the_limit_closes(self):
        with self.wire() as w:
            w.send(self.post_head("/v1/queues/abuse/tasks", 0, chunked=True))
            r = self.reply_within(w)
            self.assertEqual(r.status, 401, r)
            piece = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
            closed = False
            try:
                for _ in range(LAYER_LIMIT // (1 << 20) + 2):
                    w.sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if not closed:
                self.assertTrue(w.closed_after())


class HeaderBytesTest(HeadCase):
    def refused(self, data):
        with self.wire() as w:
            w.send(data)
            r = w.read_reply()
            self.assertEqual((r.status, r.error_code), (400, "bad_request"), r)
            self.assertIn("NUL byte or a CR", r.json["error"]["message"], r)
            self.assertTrue(w.closed_after())

    def test_nul_and_bare_cr_are_refused(self):
        auth = ("Authorization: Bearer %s" % self.token).encode()
        base = b"GET /v1/queues HTTP/1.1\r\nHost: x\r\n"
        self.refused(base + auth + b"\x00junk\r\n\r\n")  # read as the token before
        self.refused(base + auth + b"\r\nX-A: a\x00b\r\n\r\n")
        self.refused(base + auth + b"\r\nX-A: a\rb\r\n\r\n")
        self.refused(b"GET /v1/queues HTTP/1.1\rHost: x\r\n" + auth + b"\r\n\r\n")
        with self.wire() as w:  # a clean head, bare LF lines included, goes through
            w.send(base.replace(b"\r\n", b"\n") + auth + b"\n\n")
            self.assertEqual(w.read_reply().status, 200)


class NumbersTest(HeadCase):
    def test_a_real_past_a_double_says_its_range(self):
        for raw, says, not_says in ((b'{"tasks": [{"payload": 1e999}]}', "1.8e308", "2^63-1"),
                                    (b'{"tasks": [{"payload": -1E+400}]}', "1.8e308", "2^63-1"),
                                    (b'{"tasks": [{"priority": 9223372036854775808}]}',
                                     "2^63-1", "1.8e308")):
            r = self.head.request("POST", "/v1/queues/abuse/tasks", raw=raw)
            self.assertEqual((r.status, r.error_code), (400, "bad_json"), r)
            message = r.json["error"]["message"]
            self.assertIn(says, message, r)
            self.assertNotIn(not_says, message, r)


class DescriptorLimitTest(unittest.TestCase):
    """A head started with a soft limit of open files below its hard one (1024 is a
    service's usual soft limit) raises it to the hard one: a descriptor per client
    connection, and the head waits with epoll, not select."""

    def test_soft_limit_raised_to_the_hard_one(self):
        h = harness.Head(prefix=("prlimit", "--nofile=256:4096")).start()
        self.addCleanup(h.stop_checked)
        self.assertEqual(resource.prlimit(h.proc.pid, resource.RLIMIT_NOFILE), (4096, 4096))
        self.assertIn("open files: raised the soft limit from 256 to 4096 (hard limit 4096), "
                      "one per client connection", h.log())


class DescriptorsTest(unittest.TestCase):
    """A head whose descriptors run out: its limit (RLIMIT_NOFILE) lowered while it
    runs, then every one taken by connections that stay open."""

    def setUp(self):
        self.head = harness.Head().start()
        self.held = []

    def tearDown(self):
        for s in self.held:
            s.close()
        self.head.stop_checked()

    def accept_lines(self):
        return [l for l in self.head.log().splitlines() if "accept" in l]

    def test_out_of_descriptors(self):
        h = self.head
        self.assertEqual(h.request("PUT", "/v1/queues/q", body={}).status, 201)
        r = h.request("PUT", "/v1/shared/s/a?level=1", raw=b"abc",
                      content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        old = h.connection(timeout=10)
        old.connect()
        pid = h.proc.pid
        open_now = len(os.listdir("/proc/%d/fd" % pid))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_now + 5, open_now + 5))
        for _ in range(30):  # the kernel takes them into the listen backlog
            self.held.append(socket.create_connection(("127.0.0.1", h.port), timeout=5))
        harness.wait_until(lambda: self.accept_lines(), what="the head out of descriptors")
        first = self.accept_lines()
        self.assertIn("cannot accept connections: Too many open files", first[0])
        self.assertIn("ulimit -n", first[0])
        # The connection it has is served; what needs a descriptor says to retry.
        r = h.request("POST", "/v1/queues/q/tasks", body={"tasks": [{"payload": 1}]}, conn=old)
        self.assertEqual(r.status, 201, r)
        r = h.request("GET", "/v1/shared/s/a", conn=old)
        self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
        self.assertIn("out of file descriptors", r.json["error"]["message"], r)
        r = h.request("PUT", "/v1/shared/s/b?level=1", raw=b"abc", conn=old,
                      content_type="application/octet-stream")
        self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
        r = h.request("POST", "/v1/backup", body={"name": "nightly"}, conn=old)
        self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
        self.assertIn("out of file descriptors", r.json["error"]["message"], r)
        self.assertIn("send the backup again", r.json["error"]["message"], r)
        self.assertEqual(os.listdir(os.path.join(h.data_dir, "backups")), [])
        time.sleep(1)  # a window to count the lines in, not a wait for an event
        lines = self.accept_lines()
        self.assertEqual(len(lines), 1, "accept errors logged %d times: %s" % (len(lines), lines))
        for s in self.held:
            s.close()
        self.held = []
        harness.wait_until(self.serves, what="the head accepting again")
        harness.wait_until(lambda: "accepting connections again" in self.head.log(),
                           what="the head saying it accepts again")
        r = h.request("GET", "/v1/shared/s/a", conn=old)
        self.assertEqual((r.status, r.raw), (200, b"abc"), r)
        r = h.request("POST", "/v1/backup", body={"name": "nightly"}, conn=old)
        self.assertEqual(r.status, 201, r)
        old.close()

    def serves(self):
        try:
            c = self.head.connection(timeout=5)
            try:
                c.request("GET", "/v1/health")
                return c.getresponse().status == 200
            finally:
                c.close()
        except OSError:
            return False


class SharedNamesTest(HeadCase):
    def test_dot_names_are_refused(self):
        for scope, name in (("s", ".."), ("s", "."), ("..", "x"), (".", "x"),
                            ("s", "%2e%2e"), ("%2E", "x")):
            path = "/v1/shared/%s/%s" % (scope, name)
            with self.subTest(path=path):
                for method, raw in (("PUT", b"bytes"), ("GET", None), ("DELETE", None)):
                    r = self.head.request(method, path + ("?level=1" if raw else ""), raw=raw,
                                          content_type="application/octet-stream" if raw
                                          else None)
                    self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
                    message = r.json["error"]["message"]
                    self.assertIn("is invalid: '.' and '..' are no names: URLs collapse them (and "
                                  "a node's cache could not keep such a blob)", message, r)
        r = self.head.request("GET", "/v1/shared/..")
        self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
        r = self.head.request("POST", "/v1/queues/abuse/tasks", body={"tasks": [
            {"payload": 1, "requires": [{"scope": "models", "name": "..", "level": 1}]}]})
        self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
        self.assertIn("tasks[0].requires[0]", r.json["error"]["message"], r)
        # Dots inside a name are names like any other.
        r = self.head.request("PUT", "/v1/shared/s.1/w..x?level=1", raw=b"ok",
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)


DOTS_WHY = "'.' and '..' are no names: URLs collapse them"


class DotNamesTest(HeadCase):
    def refused(self, method, path, body=None, code="name_invalid", says=DOTS_WHY):
        r = self.head.request(method, path, body=body)
        self.assertEqual((r.status, r.error_code), (400, code), r)
        self.assertIn(says, r.json["error"]["message"], r)
        return r

    def test_dots_name_nothing_new(self):
        for dots in (".", "..", "%2e", "%2E%2e"):
            with self.subTest(name=dots):
                q = "/v1/queues/" + dots
                self.refused("PUT", q, {})
                for method, path, body in (("GET", q, None), ("DELETE", q, None),
                                           ("POST", q + "/tasks", {"tasks": [{"payload": 1}]}),
                                           ("POST", q + "/lease", {})):
                    self.refused(method, path, body, says="queue name '%s' is invalid: %s" % (
                        urllib.parse.unquote(dots), DOTS_WHY))
                self.refused("DELETE", "/v1/workers/instance/" + dots, code="invalid_argument")
        for dots in (".", ".."):
            with self.subTest(name=dots):
                self.refused("PUT", "/v1/queues/abuse", {"next": dots}, says="next: ")
                self.refused("POST", "/v1/iterations",
                             {"name": dots, "dataset": {"num_samples": 10}},
                             says="iteration name '%s' is invalid: %s" % (dots, DOTS_WHY))
                self.refused("POST", "/v1/nodes", {"name": dots})
                self.refused("POST", "/v1/workers", {"instance": dots}, code="invalid_argument")
                self.refused("POST", "/v1/workers", {"queues": ["abuse", dots]},
                             code="invalid_argument", says="queues[1]: ")
        r = self.head.request("POST", "/v1/workers", body={"queues": ["abuse"]})
        self.assertEqual(r.status, 201, r)
        self.refused("POST", "/v1/queues/abuse/lease", {"worker": r.json["id"], "request": ".."},
                     code="invalid_argument", says="request: '..' is invalid: " + DOTS_WHY)
        # Nothing was made; dots within a name, or three, are names like any other.
        names = [q["name"] for q in self.head.request("GET", "/v1/queues").json["queues"]]
        self.assertNotIn("..", names)
        self.assertNotIn(".", names)
        for name in ("...", "a..b", ".hidden", "x."):
            self.assertEqual(self.head.request("PUT", "/v1/queues/" + name, body={}).status, 201)
            self.assertEqual(self.head.request("DELETE", "/v1/queues/" + name).status, 200)


class StoredDotNamesTest(unittest.TestCase):
    """A queue and an iteration that a head before the rule was made under "." or ".."
    (made here by renaming stored ones while the head is down)."""

    def setUp(self):
        self.head = harness.Head().start()

    def tearDown(self):
        self.head.stop_checked()

    def test_an_older_heads_dots_names_still_work(self):
        h = self.head
        for name in ("old-a", "old-b"):
            self.assertEqual(h.request("PUT", "/v1/queues/" + name, body={}).status, 201)
        it = {"name": "old-it", "dataset": {"num_samples": 10}, "world_size": 2, "rank": 0}
        self.assertEqual(h.request("POST", "/v1/iterations", body=it).status, 201)
        self.assertEqual(h.stop(), 0)
        db = sqlite3.connect(os.path.join(h.data_dir, "muster.db"))
        with db:
            db.execute("UPDATE queues SET name = '..' WHERE name = 'old-a'")
            db.execute("UPDATE queues SET name = '.' WHERE name = 'old-b'")
            db.execute("UPDATE iterations SET name = '..' WHERE name = 'old-it'")
        db.close()
        h.start()
        names = [q["name"] for q in h.request("GET", "/v1/queues").json["queues"]]
        self.assertEqual(sorted(names), [".", ".."])
        # Sent as it is or percent-encoded, the name finds its queue and does all a name does.
        r = h.request("POST", "/v1/queues/../tasks", body={"tasks": [{"payload": 7}]})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(h.request("PUT", "/v1/queues/%2E%2E", body={"max_attempts": 2}).status,
                         200)
        r = h.request("POST", "/v1/queues/../lease", body={})
        self.assertEqual(r.status, 200, r)
        self.assertEqual([l["payload"] for l in r.json["leases"]], [7])
        self.assertEqual(h.request("PUT", "/v1/queues/.", body={"next": ".."}).status, 200)
        self.assertEqual(h.request("GET", "/v1/queues/.").json["next"], "..")
        it["rank"] = 1  # the other rank joins the iteration
        r = h.request("POST", "/v1/iterations", body=it | {"name": ".."})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(h.request("GET", "/v1/iterations/..").status, 200)
        self.assertEqual(h.request("DELETE", "/v1/iterations/..").status, 200)
        # Deleted, it is gone for good: no new one of that name is made.
        self.assertEqual(h.request("PUT", "/v1/queues/.", body={"next": None}).status, 200)
        for name in (".", ".."):
            self.assertEqual(h.request("DELETE", "/v1/queues/" + name).status, 200)
            r = h.request("PUT", "/v1/queues/" + name, body={})
            self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
            self.assertIn(DOTS_WHY, r.json["error"]["message"], r)
        r = h.request("POST", "/v1/iterations", body=it | {"name": ".."})
        self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
        self.assertEqual(h.request("GET", "/v1/queues").json["queues"], [])


if __name__ == "__main__":
    unittest.main()
