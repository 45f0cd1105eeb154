"""How many bytes of replies one client can make the head build and hold.  Each test
fails without its fix.

- A client that pipelines requests and never reads their replies made the head hold
  every reply of the 64 requests a connection may have in flight, until the idle
  timeout: 64 MB per connection for replies of 1 MB.  Now a connection whose unread
  replies pass 4 MiB is not read on until its client reads them; it stays open, and
  every reply comes, whole and in order, once the client reads.  The same holds on a
  node agent's port, for the agent and for the head behind it.
- A page of tasks, of results or of updates, and a batch of leases, put every payload
  of up to 1000 items in one reply: 2 GiB for 1000 payloads of 2 MiB.  Now a reply stops
  adding items once their payloads would pass its budget (16 MiB; one item always
  goes), and says so the way it says that more follow: a `next`, a `cursor`, an
  `updates_last` below the queue's last.  The head takes MUSTER_TEST_REPLY_BUDGET for
  a small budget here.
"""
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402
from test_abuse_head import rss_bytes  # noqa: E402
from test_api_shared import sanitized  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402


def asan_small_quarantine():
    """The environment for a process whose memory is measured: ASan keeps freed memory in
    quarantine (256 MiB by default), which would count as memory held; a small one keeps
    the figure the process's own."""
    if not sanitized():
        return {}
    options = os.environ.get("ASAN_OPTIONS")
    return {"ASAN_OPTIONS": (options + ":" if options else "") + "quarantine_size_mb=4"}


class UnreadRepliesTest(unittest.TestCase):
    """Replies of 1 MB pipelined on a few connections whose clients do not read."""

    CONNS = 4
    REQUESTS = 100  # per connection: more than the 64 a connection may have in flight
    TASKS = 8
    PAD = 1000000

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(env=asan_small_quarantine()).start()
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
        cls.head.stop_checked()

    def get(self, task):
        return request("GET", "/v1/tasks/%d" % task, self.head.token)

    def port(self):
        """The port the clients send to."""
        return self.head.port

    def pids(self):
        """The processes whose memory is measured."""
        return [self.head.proc.pid]

    def probe(self):
        """A request answered on a fresh connection: the server went through its loop
        after what was sent before (and handled what it was going to of it)."""
        with Wire(self.port()) as w:
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
        self.probe()  # the allocator has seen a reply of this size
        before = [rss_bytes(pid) for pid in self.pids()]
        conns = [Wire(self.port()) for _ in range(self.CONNS)]
        try:
            for w in conns:
                w.send(b"".join(self.get(self.ids[i % self.TASKS]) for i in range(self.REQUESTS)))
            self.probe()
            self.probe()
            for pid, was in zip(self.pids(), before):
                grown = max(rss_bytes(pid) for _ in range(20)) - was
                # Unbounded, each connection made the server hold 64 replies: 256 MB.
                # Now each holds about 4 MiB and a reply (and what its socket took).
                self.assertLess(grown, 64 << 20, "process %d grew %d MiB" % (pid, grown >> 20))
            for w in conns:  # everything comes, whole and in order, once it is read
                for i in range(self.REQUESTS):
                    self.check_reply(w, i)
            self.probe()
        finally:
            for w in conns:
                w.close()


class AgentUnreadRepliesTest(UnreadRepliesTest):
    """The same through a node agent's port, which passes the head's replies on: neither
    the agent nor the head holds what the client does not read."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dir = tempfile.mkdtemp(prefix="muster-reply-bytes-")
        try:
            cls.agent = Agent(cls.head, cls.dir, "unread", env=asan_small_quarantine()).start()
        except BaseException:
            super().tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.agent.stop_checked()
        finally:
            super().tearDownClass()
            shutil.rmtree(cls.dir, ignore_errors=True)

    def port(self):
        return self.agent.port

    def pids(self):
        return [self.agent.proc.pid, self.head.proc.pid]


BUDGET = 100000  # MUSTER_TEST_REPLY_BUDGET of these heads
SMALL, LARGE = 30000, 250000  # payloads three of which fit the budget; one past it


def text(tag, size):
    """A JSON string payload whose stored (encoded) text is `size` bytes long."""
    head = "%s-" % tag
    return head + "x" * (size - 2 - len(head))


def stored(value):
    return len(json.dumps(value, separators=(",", ":")))


class BudgetCase(unittest.TestCase):
    head_env = {"MUSTER_TEST_REPLY_BUDGET": str(BUDGET)}

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(env=cls.head_env).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.stop_checked()

    def call(self, method, path, body=None, status=200):
        r = self.head.request(method, path, body=body)
        self.assertEqual(r.status, status, r)
        return r.json

    def queue(self, name):
        self.call("PUT", "/v1/queues/" + name, {}, status=201)

    def put(self, queue, payloads):
        reply = self.call("POST", "/v1/queues/%s/tasks" % queue,
                          {"tasks": [{"payload": p} for p in payloads]}, status=201)
        return [t["id"] for t in reply["tasks"]]

    def assert_pages(self, pages, size_of):
        """Each page holds what fits the budget and no more: its items' payloads stay
        within it (or it has one item), and the item after it would have passed it."""
        self.assertGreater(len(pages), 1, "one page held everything")
        for i, page in enumerate(pages):
            self.assertTrue(page, "page %d is empty" % i)
            used = sum(size_of(item) for item in page)
            if len(page) > 1:
                self.assertLessEqual(used, BUDGET, "page %d holds %d bytes" % (i, used))
            if i + 1 < len(pages):
                self.assertGreater(used + size_of(pages[i + 1][0]), BUDGET,
                                   "page %d ended before a task that fitted" % i)


class TaskPagesTest(BudgetCase):
    def list_pages(self, query):
        pages, after = [], 0
        while True:
            reply = self.call("GET", "/v1/queues/pages/tasks?limit=1000&after=%d%s" % (after, query))
            pages.append(reply["tasks"])
            if reply["next"] is None:
                return pages
            after = reply["next"]

    def test_pages_hold_every_task_once_within_the_budget(self):
        self.queue("pages")
        sizes = [SMALL] * 7 + [LARGE] + [SMALL] * 4 + [BUDGET - 1, 1] + [SMALL] * 3
        ids = self.put("pages", [text(i, n) for i, n in enumerate(sizes)])
        # The first task's result counts as well: it goes alone.
        lease = self.call("POST", "/v1/queues/pages/lease", {"max": 1})["leases"][0]
        self.call("POST", "/v1/leases/complete", {"leases": [
            {"task": lease["task"], "token": lease["token"], "result": text("r", 90000)}]})

        def size_of(task):
            return stored(task["payload"]) + (stored(task["result"]) if task["result"] else 0)

        pages = self.list_pages("")
        self.assertEqual([t["id"] for page in pages for t in page], ids)
        self.assert_pages(pages, size_of)
        self.assertEqual([t["id"] for t in pages[0]], ids[:1])  # 30000 + 90000 bytes
        self.assertIn([ids[7]], [[t["id"] for t in page] for page in pages])  # alone

        queued = self.list_pages("&state=queued")
        self.assertEqual([t["id"] for page in queued for t in page], ids[1:])
        self.assert_pages(queued, size_of)

        brief = self.list_pages("&brief=true")  # no payloads: one page
        self.assertEqual([[t["id"] for t in page] for page in brief], [ids])


class LeaseBatchTest(BudgetCase):
    def lease(self, queue, **extra):
        return self.call("POST", "/v1/queues/%s/lease" % queue, dict({"max": 1000}, **extra))

    def test_a_batch_stops_at_the_budget_and_the_rest_stays_queued(self):
        self.queue("leases")
        sizes = [SMALL] * 10 + [LARGE] + [SMALL] * 2
        ids = self.put("leases", [text(i, n) for i, n in enumerate(sizes)])
        first = self.lease("leases")["leases"]
        self.assertEqual([lease["task"] for lease in first], ids[:3])
        counts = self.call("GET", "/v1/queues/leases")["counts"]
        self.assertEqual((counts["leased"], counts["queued"]), (3, 10), counts)
        # The combined call leases the next batch as a plain lease does.
        reply = self.call("POST", "/v1/leases/complete", {
            "leases": [{"task": lease["task"], "token": lease["token"]} for lease in first],
            "lease": {"queue": "leases", "max": 1000}})
        batches = [first, reply["leases"]]
        while True:
            leases = self.lease("leases")["leases"]
            if not leases:
                break
            batches.append(leases)
        self.assertEqual([lease["task"] for batch in batches for lease in batch], ids)
        self.assertEqual([len(batch) for batch in batches], [3, 3, 3, 1, 1, 2])
        self.assert_pages(batches, lambda lease: stored(lease["payload"]))

    def test_updates_with_a_lease_stop_at_the_budget(self):
        self.queue("leaseupdates")
        seqs = [self.call("POST", "/v1/queues/leaseupdates/updates",
                          {"data": text(i, SMALL)}, status=201)["seq"] for i in range(5)]
        reply = self.lease("leaseupdates", updates_after=0)
        self.assertEqual(reply["leases"], [])
        self.assertEqual([u["seq"] for u in reply["updates"]], seqs[:3])
        self.assertEqual(reply["updates_last"], seqs[2])  # the worker goes on from there
        reply = self.lease("leaseupdates", updates_after=seqs[2])
        self.assertEqual([u["seq"] for u in reply["updates"]], seqs[3:])
        self.assertEqual(reply["updates_last"], seqs[4])


class UpdatePagesTest(BudgetCase):
    def test_pages_hold_every_update_once(self):
        self.queue("updates")
        sizes = [SMALL] * 4 + [LARGE] + [SMALL] * 4
        seqs = [self.call("POST", "/v1/queues/updates/updates", {"data": text(i, n)},
                          status=201)["seq"] for i, n in enumerate(sizes)]
        pages, after = [], 0
        while after < seqs[-1]:
            reply = self.call("GET", "/v1/queues/updates/updates?max=1000&after=%d" % after)
            self.assertEqual(reply["last"], seqs[-1])
            pages.append(reply["updates"])
            after = reply["updates"][-1]["seq"]
        self.assertEqual([u["seq"] for page in pages for u in page], seqs)
        self.assert_pages(pages, lambda u: stored(u["data"]))


class ResultPagesTest(BudgetCase):
    def test_pages_hold_every_result_once_in_both_orders(self):
        self.queue("results")
        session = self.call("POST", "/v1/sessions", {"queue": "results"}, status=201)["id"]
        sizes = [SMALL] * 4 + [LARGE] + [SMALL] * 4
        self.call("POST", "/v1/sessions/%s/tasks" % session,
                  {"tasks": [{"payload": i} for i in range(len(sizes))]}, status=201)
        leases = self.call("POST", "/v1/queues/results/lease", {"max": 100})["leases"]
        self.assertEqual(len(leases), len(sizes))
        # Completed in reverse: the completion order differs from the submission order.
        for lease in reversed(leases):
            self.call("POST", "/v1/leases/complete", {"leases": [
                {"task": lease["task"], "token": lease["token"],
                 "result": text(lease["index"], sizes[lease["index"]])}]})
        for order, key in (("submission", "index"), ("completion", "seq")):
            with self.subTest(order=order):
                pages, cursor = [], 0
                while True:
                    reply = self.call("GET", "/v1/sessions/%s/results?order=%s&cursor=%d&max=1000"
                                      % (session, order, cursor))
                    self.assertIsNone(reply["gap"], reply["gap"])
                    if not reply["results"]:
                        break
                    pages.append(reply["results"])
                    cursor = reply["cursor"]
                got = [r[key] for page in pages for r in page]
                self.assertEqual(got, sorted(got))
                self.assertEqual(sorted(r["index"] for page in pages for r in page),
                                 list(range(len(sizes))))
                self.assert_pages(pages, lambda r: stored(r["result"]))


class LeftoversBudgetTest(BudgetCase):
    """A queue holding what a closed session left is listed and leased by walks past it
    (leftover.h): those pages and batches keep the budget too."""

    head_env = dict(BudgetCase.head_env, MUSTER_TEST_HOLD_LEFTOVERS="1")

    def test_walked_pages_and_batches(self):
        self.queue("walked")
        session = self.call("POST", "/v1/sessions", {"queue": "walked"}, status=201)["id"]
        for _ in range(2):  # more than one transaction deletes: the rest is left
            self.call("POST", "/v1/sessions/%s/tasks" % session,
                      {"tasks": [{"payload": 0}] * 600}, status=201)
        self.call("DELETE", "/v1/sessions/" + session)
        sizes = [SMALL] * 4 + [LARGE] + [SMALL] * 2
        ids = self.put("walked", [text(i, n) for i, n in enumerate(sizes)])

        pages, after = [], 0
        while True:
            reply = self.call("GET", "/v1/queues/walked/tasks?state=queued&limit=1000&after=%d"
                              % after)
            pages.append(reply["tasks"])
            if reply["next"] is None:
                break
            after = reply["next"]
        self.assertEqual([t["id"] for page in pages for t in page], ids)
        self.assert_pages(pages, lambda t: stored(t["payload"]))

        batches = []
        while True:
            leases = self.call("POST", "/v1/queues/walked/lease", {"max": 1000})["leases"]
            if not leases:
                break
            batches.append(leases)
        self.assertEqual([lease["task"] for batch in batches for lease in batch], ids)
        self.assert_pages(batches, lambda lease: stored(lease["payload"]))


class BadBudgetTest(BudgetCase):
    head_env = {"MUSTER_TEST_REPLY_BUDGET": "lots"}

    def test_a_bad_value_is_said_and_ignored(self):
        self.queue("bad")
        ids = self.put("bad", [text(i, SMALL) for i in range(8)])
        reply = self.call("GET", "/v1/queues/bad/tasks?limit=1000")
        self.assertEqual([t["id"] for t in reply["tasks"]], ids)  # the 16 MiB budget
        self.assertIn("MUSTER_TEST_REPLY_BUDGET=lots is not 1 to 16777216", self.head.log())


if __name__ == "__main__":
    unittest.main()
