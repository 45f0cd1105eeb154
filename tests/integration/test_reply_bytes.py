"""How many bytes of replies one client can make the head hold.  Each test fails
without its fix.

- A client that pipelines requests and never reads their replies made the head hold
  every reply of the 64 requests a connection may have in flight, until the idle
  timeout: 64 MB per connection for replies of 1 MB.  Now a connection whose unread
  replies pass 4 MiB is not read on until its client reads them; it stays open, and
  every reply comes, whole and in order, once the client reads.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_abuse_head import rss_bytes, stop_checked  # noqa: E402
from test_api_shared import sanitized  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402


class UnreadRepliesTest(unittest.TestCase):
    """Replies of 1 MB pipelined on a few connections whose clients do not read."""

    CONNS = 4
    REQUESTS = 100  # per connection: more than the 64 a connection may have in flight
    TASKS = 8
    PAD = 1000000

    @classmethod
    def setUpClass(cls):
        env = {}
        if sanitized():
            # ASan keeps freed memory in quarantine (256 MiB by default), which would
            # count here as memory held: a small one keeps the figure the head's.
            options = os.environ.get("ASAN_OPTIONS")
            env["ASAN_OPTIONS"] = (options + ":" if options else "") + "quarantine_size_mb=4"
        cls.head = harness.Head(env=env).start()
        r = cls.head.request("PUT", "/v1/queues/big", body={})
        assert r.status == 201, r
        payloads = [{"n": i, "pad": chr(ord("a") + i) * cls.PAD} for i in range(cls.TASKS)]
        cls.ids = []
        for p in payloads:  # one a request: a body of 8 MB would pass --max-body
            r = cls.head.request("POST", "/v1/queues/big/tasks", body={"tasks": [{"payload": p}]})
            assert r.status == 201, r
            cls.ids.append(r.json["tasks"][0]["id"])

    @classmethod
    def tearDownClass(cls):
        stop_checked(cls.head)

    def get(self, task):
        return request("GET", "/v1/tasks/%d" % task, self.head.token)

    def probe(self):
        """A request answered on a fresh connection: the head went through its loop after
        what was sent before (and handled what it was going to of it)."""
        with Wire(self.head.port) as w:
            w.send(self.get(self.ids[0]))
            self.assertEqual(w.read_reply().status, 200)

    def check_reply(self, w, i):
        r = w.read_reply()
        self.assertEqual(r.status, 200, r)
        task = json.loads(r.body)
        n = i % self.TASKS
        self.assertEqual(task["id"], self.ids[n], "reply %d out of order" % i)
        self.assertEqual(task["payload"], {"n": n, "pad": chr(ord("a") + n) * self.PAD})

    def test_a_client_that_does_not_read_holds_up_its_own_requests(self):
        pid = self.head.proc.pid
        self.probe()  # the allocator has seen a reply of this size
        before = rss_bytes(pid)
        conns = [Wire(self.head.port) for _ in range(self.CONNS)]
        try:
            for w in conns:
                w.send(b"".join(self.get(self.ids[i % self.TASKS]) for i in range(self.REQUESTS)))
            self.probe()
            self.probe()
            grown = max(rss_bytes(pid) for _ in range(20)) - before
            # Unbounded, each connection made the head hold 64 replies: 256 MB.  Now
            # each holds about 4 MiB and a reply (and what its socket took).
            self.assertLess(grown, 64 << 20, "the head grew %d MiB" % (grown >> 20))
            for w in conns:  # everything comes, whole and in order, once it is read
                for i in range(self.REQUESTS):
                    self.check_reply(w, i)
            self.probe()
        finally:
            for w in conns:
                w.close()


if __name__ == "__main__":
    unittest.main()
