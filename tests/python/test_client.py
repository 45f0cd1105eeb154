"""muster.Client against a real head: every queue, task, lease and worker call,
keep-alive reuse, and the error mapping of every code the head sends."""
import json
import os
import re
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from unittest import mock

from common import HeadTestCase, harness, muster
from muster import client as client_module
from muster import errors


class TestQueues(HeadTestCase):
    def test_health_needs_no_token(self):
        h = muster.Client(self.head.url, token="wrong").health()
        self.assertEqual(h["status"], "ok")
        self.assertIn("version", h)

    def test_create_get_update_list_delete(self):
        q, n = self.qname(), self.qname("next")
        self.assertEqual(self.c.put_queue(n)["name"], n)
        created = self.c.put_queue(q, lease_ms=5000, max_attempts=3, next=n)
        self.assertEqual((created["lease_ms"], created["max_attempts"], created["next"]), (5000, 3, n))
        self.assertEqual(self.c.update_queue(q, max_flags=2)["max_flags"], 2)
        got = self.c.queue(q)
        self.assertEqual((got["lease_ms"], got["max_flags"], got["next"]), (5000, 2, n))
        self.assertEqual(self.c.put_queue(q, next=None)["next"], None)
        names = [x["name"] for x in self.c.queues()]
        self.assertIn(q, names)
        self.assertEqual(names, sorted(names))
        self.c.put(q, "x")
        self.assertEqual(self.c.delete_queue(q), {"deleted": q, "tasks": 1, "sessions_closed": 0})
        with self.assertRaises(muster.QueueNotFound):
            self.c.queue(q)

    def test_purge_and_requeue(self):
        q = self.qname()
        self.c.put_queue(q, max_attempts=1)
        self.c.put_payloads(q, [1, 2, 3])
        lease = self.c.lease_one(q)
        lease.fail("boom", permanent=True)
        self.assertEqual(self.c.purge_queue(q), 2)
        self.assertEqual(self.c.requeue_queue(q), 1)
        self.assertEqual(self.c.queue(q)["counts"]["queued"], 1)


    def test_queue_counts_ready_when_asked(self):
        # Client.queue had no way to send ?ready=true: a caller had to build the path.
        q = self.qname()
        self.c.put_queue(q)
        self.c.put(q, "now")
        self.c.put(q, "later", delay_ms=600000)
        plain = self.c.queue(q)
        self.assertEqual(plain["counts"]["queued"], 2)
        self.assertNotIn("ready", plain["counts"])
        counts = self.c.queue(q, ready=True)["counts"]
        self.assertEqual((counts["queued"], counts["ready"]), (2, 1))
        self.assertNotIn("ready", self.c.queue(q, ready=False)["counts"])


class TestTasks(HeadTestCase):
    def test_put_options_and_get(self):
        q = self.qname()
        self.c.put_queue(q)
        tid = self.c.put(q, {"u": "a"}, priority=5, delay_ms=60000, key="k1")
        self.assertEqual(self.c.put(q, {"u": "other"}, key="k1"), tid)  # idempotent
        t = self.c.task(tid)
        self.assertEqual((t["payload"], t["priority"], t["key"], t["state"]), ({"u": "a"}, 5, "k1", "queued"))
        self.assertGreater(t["run_at_ms"], t["created_ms"] + 50000)
        self.assertEqual(self.c.lease(q), [])  # delayed

    def test_put_many_and_pages(self):
        q = self.qname()
        self.c.put_queue(q)
        got = self.c.put_many(q, [{"payload": i, "key": "k%d" % (i % 5)} for i in range(7)])
        self.assertEqual([g["created"] for g in got], [True] * 5 + [False] * 2)
        self.c.put_payloads(q, list(range(20)))
        page = self.c.tasks(q, limit=10)
        self.assertEqual(len(page["tasks"]), 10)
        self.assertIsNotNone(page["next"])
        all_tasks = list(self.c.iter_tasks(q, page=7))
        self.assertEqual(len(all_tasks), 25)
        self.assertEqual([t["id"] for t in all_tasks], sorted(t["id"] for t in all_tasks))
        self.assertEqual(list(self.c.iter_tasks(q, state="done")), [])

    def test_requeue_task(self):
        q = self.qname()
        self.c.put_queue(q)
        tid = self.c.put(q, 1)
        self.c.lease_one(q).fail("no", permanent=True)
        self.assertEqual(self.c.task(tid)["state"], "failed")
        self.assertEqual(self.c.requeue_task(tid)["state"], "queued")

    def test_ids_as_text_or_of_a_wrong_type(self):
        """An id as the CLI prints it works; a wrong type says what an id is (it raised
        '%d format: a real number is required, not str')."""
        q = self.qname()
        self.c.put_queue(q)
        tid = self.c.put(q, 1)
        self.assertEqual(self.c.task(str(tid))["id"], tid)
        w = self.c.register_worker(nickname="ids")
        self.assertEqual(self.c.worker(" %d " % w["id"])["id"], w["id"])
        self.c.heartbeat(str(w["id"]))
        for call, what in ((self.c.task, "task"), (self.c.requeue_task, "task"),
                           (self.c.worker, "worker"), (self.c.bye, "worker")):
            for bad in ("t-1", 1.5, None, True):
                with self.assertRaises(TypeError) as cm:
                    call(bad)
                self.assertIn("%s id: expected an integer (the id the head returned), got %r"
                              % (what, bad), str(cm.exception))
        self.c.bye(str(w["id"]))

    def test_payload_kinds_round_trip(self):
        q = self.qname()
        self.c.put_queue(q)
        payloads = ["text", "nul\u0000inside", 3, 2.5, None, True, [1, [2]], {"a": {"b": "é"}}]
        ids = self.c.put_payloads(q, payloads)
        self.assertEqual([self.c.task(i)["payload"] for i in ids], payloads)

    def test_a_payload_nested_deeper_than_python_reads_says_how_to_read_it(self):
        # The head takes JSON nested up to 2048 levels; Python's json module stops at its
        # recursion limit (about 1000): a bare RecursionError came out of the client, on
        # the way out and on the way back.
        import sys
        q = self.qname()
        self.c.put_queue(q)
        deep = 1500
        nested = []
        for _ in range(deep - 1):
            nested = [nested]
        limit = sys.getrecursionlimit()
        self.assertLess(limit, 2 * deep)
        with self.assertRaises(ValueError) as cm:
            self.c.put(q, nested)
        self.assertIn("the body nests too deep to send", str(cm.exception))
        self.assertIn("sys.setrecursionlimit", str(cm.exception))
        self.assertEqual(self.c.queue(q)["counts"]["queued"], 0)  # nothing sent
        # Sent as text, the head keeps it; reading it back says what to do.
        text = "[" * deep + "]" * deep
        raw = self.c.request_raw("POST", "/v1/queues/%s/tasks" % q,
                                 body='{"tasks": [{"payload": %s}]}' % text,
                                 content_type="application/json")
        tid = json.loads(raw[2])["tasks"][0]["id"]
        with self.assertRaises(errors.ProtocolError) as cm:
            self.c.task(tid)
        self.assertIn("the reply nests too deep to read", str(cm.exception))
        self.assertIn("sys.setrecursionlimit", str(cm.exception))
        sys.setrecursionlimit(2 * deep + 1000)
        try:
            got = self.c.task(tid)["payload"]
        finally:
            sys.setrecursionlimit(limit)
        depth = 0
        while got is not None and isinstance(got, list):
            depth += 1
            got = got[0] if got else None
        self.assertEqual(depth, deep)


class TestLeases(HeadTestCase):
    def test_complete_with_next_stage(self):
        q, n = self.qname(), self.qname("next")
        self.c.put_queue(n)
        self.c.put_queue(q, next=n)
        self.c.put(q, {"x": 1})
        lease = self.c.lease_one(q)
        self.assertEqual((lease.payload, lease.attempt), ({"x": 1}, 1))
        done = lease.complete({"y": 2})
        self.assertEqual(done["task"], lease.task)
        nxt = self.c.task(done["next_task"])
        self.assertEqual((nxt["payload"], nxt["parent"]), ({"y": 2}, lease.task))
        self.assertEqual(self.c.task(lease.task)["result"], {"y": 2})

    def test_a_repeated_completion_says_so(self):
        """A completion sent again under its token returns the head's marks: "repeated", and
        "result_ignored" when its result differs from the stored one, which stays."""
        q = self.qname()
        self.c.put_queue(q)
        self.c.put(q, 1)
        lease = self.c.lease_one(q)
        self.assertEqual(lease.complete("first"), {"task": lease.task, "next_task": None})
        self.assertEqual(lease.complete("first"),
                         {"task": lease.task, "next_task": None, "repeated": True})
        self.assertEqual(self.c.complete(lease.task, lease.token, "second"),
                         {"task": lease.task, "next_task": None, "repeated": True,
                          "result_ignored": True})
        self.assertEqual(self.c.task(lease.task)["result"], "first")

    def test_batch_lease_and_batch_calls(self):
        q = self.qname()
        self.c.put_queue(q)
        self.c.put_payloads(q, list(range(6)))
        leases = self.c.lease(q, max=6)
        self.assertEqual([l.payload for l in leases], list(range(6)))
        done = self.c.complete_many([{"task": l.task, "token": l.token, "result": l.payload * 10}
                                     for l in leases[:2]])
        self.assertEqual(len(done), 2)
        ext = self.c.extend_many([{"task": l.task, "token": l.token, "lease_ms": 90000} for l in leases[2:4]])
        self.assertEqual(len(ext), 2)
        self.assertEqual(self.c.release_many([{"task": l.task, "token": l.token} for l in leases[2:4]]), 2)
        failed = self.c.fail_many([{"task": l.task, "token": l.token, "error": "e"} for l in leases[4:5]])
        self.assertEqual(failed[0]["state"], "queued")
        flagged = self.c.flag_many([{"task": leases[5].task, "token": leases[5].token, "reason": "bad"}])
        self.assertEqual(flagged[0]["state"], "queued")

    def test_extend_release_fail_flag(self):
        q = self.qname()
        self.c.put_queue(q, lease_ms=10000, max_flags=1)
        self.c.put(q, "a")
        lease = self.c.lease_one(q)
        before = lease.deadline_ms
        lease.extend(60000)
        self.assertGreater(lease.deadline_ms, before)
        self.assertEqual(lease.release(), 1)
        self.assertEqual(lease.release(), 1)  # sent again (a lost reply): a repeat, still 1
        lease = self.c.lease_one(q)
        self.assertEqual(lease.attempt, 1)  # a release does not count
        f = lease.fail("transient")
        self.assertEqual(f["state"], "queued")
        self.assertEqual(self.c.task(lease.task)["error"], "transient")
        self.c.put(q, "b")
        lease = self.c.lease_one(q)
        self.assertEqual(lease.payload, "b")
        self.assertEqual(lease.flag("corrupt")["state"], "dead")  # max_flags 1, no parent

    def test_long_poll_wakes_on_put(self):
        import threading
        q = self.qname()
        self.c.put_queue(q)
        got = []
        t = threading.Thread(target=lambda: got.append(self.c.lease(q, wait_ms=20000)))
        t.start()
        # The waiting thread has its own connection; put from this one.  The lease returns
        # as soon as the task exists (well before its 20 s wait).
        harness.wait_until(lambda: self._waiting(), what="the lease to wait")
        self.c.put(q, "wake")
        t.join(15)
        self.assertFalse(t.is_alive())
        self.assertEqual(got[0][0].payload, "wake")

    def _waiting(self):
        import urllib.request
        try:
            with urllib.request.urlopen(self.head.url + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except Exception:
            return True  # no metrics to look at: the put below still wakes it
        for line in text.splitlines():
            if line.startswith("muster_lease_waiters") and not line.endswith(" 0"):
                return True
        return "muster_lease_waiters" not in text

    def test_updates_with_lease(self):
        q = self.qname()
        self.c.put_queue(q)
        if not self.has_route("/v1/queues/%s/updates" % q):
            self.skipTest("updates are not in this head yet")
        self.assertEqual(self.c.post_update(q, {"w": 1})["seq"], 1)
        self.c.post_update(q, {"w": 2})
        self.assertEqual([u["data"] for u in self.c.updates(q)["updates"]], [{"w": 1}, {"w": 2}])
        self.assertEqual(self.c.updates(q, after=1)["last"], 2)
        self.c.put(q, 1)
        leases = self.c.lease(q, updates_after=1)
        self.assertEqual([u["seq"] for u in leases.updates], [2])
        self.assertEqual(leases.updates_last, 2)

    def test_complete_and_lease(self):
        q, n = self.qname(), self.qname("next")
        self.c.put_queue(n)
        self.c.put_queue(q, next=n)
        self.c.put_payloads(q, [1, 2, 3])
        first = self.c.lease_one(q)
        self.c.post_update(q, "u1")
        got = first.complete_and_lease(q, {"r": 1}, updates_after=0)
        self.assertEqual(len(got.completed), 1)
        self.assertEqual(got.completed[0]["task"], first.task)
        self.assertEqual(self.c.task(got.completed[0]["next_task"])["payload"], {"r": 1})
        self.assertEqual([l.payload for l in got], [2])
        self.assertEqual(([u["data"] for u in got.updates], got.updates_last), (["u1"], 1))
        # A batch; another queue; no updates asked for: none in the reply.
        self.c.put(q, 4)
        more = self.c.lease(q, max=1)
        items = [{"task": l.task, "token": l.token} for l in list(got) + list(more)]
        got = self.c.complete_and_lease(items, n, max=5)
        self.assertEqual([c["task"] for c in got.completed], [l["task"] for l in items])
        self.assertEqual([l.payload for l in got], [{"r": 1}, None, None])  # put order
        self.assertEqual((got.updates, got.updates_last), ((), None))
        # Nothing ready: an empty LeaseList at once; the completions stand.
        last = got
        got = self.c.complete_and_lease([{"task": l.task, "token": l.token} for l in last], n)
        self.assertEqual((list(got), len(got.completed)), ([], 3))
        # All or nothing: a bad "lease" raises and completes nothing.
        [l4] = self.c.lease(q, max=1)
        with self.assertRaises(muster.InvalidArgument):
            l4.complete_and_lease(q, updates_after=-1)
        with self.assertRaises(muster.NotFound):
            l4.complete_and_lease(self.qname("missing"))
        self.assertEqual(self.c.task(l4.task)["state"], "leased")
        self.assertEqual(l4.complete_and_lease(q), [])
        self.assertEqual(self.c.task(l4.task)["state"], "done")


class TestWorkers(HeadTestCase):
    def test_register_heartbeat_list_bye(self):
        q = self.qname()
        self.c.put_queue(q)
        w = self.c.register_worker(nickname="alice", queues=[q], node="box", labels={"gpu": "0"},
                                   timeout_ms=30000)
        self.assertEqual((w["nickname"], w["timeout_ms"]), ("alice", 30000))
        self.assertTrue(w["name"])
        self.assertEqual(self.c.heartbeat(w["id"], "50%"), {"id": w["id"], "state": "active"})
        got = self.c.worker(w["id"])
        self.assertEqual((got["progress"], got["node"], got["labels"], got["queues"]),
                         ("50%", "box", {"gpu": "0"}, [q]))
        self.assertIn(w["id"], [x["id"] for x in self.c.workers()])
        self.c.put(q, 1)
        lease = self.c.lease_one(q, worker=w["id"])
        lease.complete()
        self.c.put(q, 2)
        self.c.lease_one(q, worker=w["id"])
        board = {x["nickname"]: x for x in self.c.leaderboard()}
        self.assertGreaterEqual(board["alice"]["completed"], 1)
        self.assertEqual(self.c.bye(w["id"]), {"id": w["id"], "released": 1})
        self.assertEqual(self.c.worker(w["id"])["state"], "gone")
        with self.assertRaises(muster.WorkerNotFound):
            self.c.heartbeat(w["id"])

    def test_crashed_bye_counts_the_attempt(self):
        if not self.has_route("/v1/nodes"):
            self.skipTest("crashed=true comes with nodes, not in this head yet")
        q = self.qname()
        self.c.put_queue(q)
        w = self.c.register_worker(queues=[q])
        tid = self.c.put(q, 1)
        self.c.lease_one(q, worker=w["id"])
        self.c.bye(w["id"], crashed=True)
        self.assertEqual(self.c.task(tid)["attempts"], 1)


class TestBackup(HeadTestCase):
    def test_backup_named_and_by_time(self):
        """The head writes the backup under its data dir and says where; a name in use
        is refused (409 invalid_state) and the first backup stays."""
        self.c.put_queue(self.qname())
        r = self.c.backup("pytest-nightly")
        where = os.path.join(os.path.realpath(self.head.data_dir), "backups", "pytest-nightly")
        self.assertEqual((r["name"], os.path.realpath(r["path"])), ("pytest-nightly", where))
        self.assertTrue(os.path.isfile(os.path.join(r["path"], "muster.db")))
        self.assertGreaterEqual(r["holds"]["queues"], 1)
        with self.assertRaises(muster.InvalidState) as cm:
            self.c.backup("pytest-nightly")
        self.assertEqual((cm.exception.code, cm.exception.status), ("invalid_state", 409))
        self.assertIn("backup 'pytest-nightly' exists already", cm.exception.message)
        self.assertTrue(os.path.isfile(os.path.join(r["path"], "muster.db")))
        self.assertRegex(self.c.backup()["name"], r"^[0-9]{8}T[0-9]{6}Z$")
        with self.assertRaises(muster.NameInvalid):
            self.c.backup("../elsewhere")


class TestConnection(HeadTestCase):
    def test_keep_alive_reuses_one_connection(self):
        c = muster.Client(self.head.url, self.head.token)
        c.health()
        sock = c._local.conn.sock
        for _ in range(20):
            c.queues()
        self.assertIs(c._local.conn.sock, sock)
        c.close()

    def test_a_call_interrupted_mid_reply_leaves_no_half_read_connection(self):
        """Ctrl-C while a reply is read (the body, or the status line of a long-poll):
        the reply still owed on that connection must not be taken for the next call's,
        nor refuse the next call (a POST would not be sent again)."""
        import http.client
        from unittest import mock
        c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(c.close)
        q = self.qname()
        c.put_queue(q)
        for where in ("read", "begin"):
            real = getattr(http.client.HTTPResponse, where)
            calls = []

            def interrupted(resp, *args, real=real, calls=calls):
                if not calls:
                    calls.append(1)
                    raise KeyboardInterrupt
                return real(resp, *args)

            with mock.patch.object(http.client.HTTPResponse, where, interrupted):
                with self.assertRaises(KeyboardInterrupt):
                    c.queue(q)
            self.assertIsInstance(c.put(q, where), int)
            self.assertEqual(c.queue(q)["counts"]["queued"], 1 + (where == "begin"))

    def test_a_forked_process_opens_its_own_connection(self):
        """A client used before a fork (multiprocessing's or a DataLoader's workers) went on
        with the parent's connection in every child: processes sharing one socket read
        each other's replies (a third of 400 calls in four children failed or got another
        call's reply).  The child now opens its own; the parent keeps its."""
        import multiprocessing
        c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(c.close)
        c.health()
        parent = c._local.conn.sock.getsockname()
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()

        def child():
            try:
                c.health()
                out.put(("ok", c._local.conn.sock.getsockname(), c.queue(q)["name"]))
            except BaseException as e:   # reported by the parent
                out.put(("error", repr(e), None))

        q = self.qname()
        c.put_queue(q)
        p = ctx.Process(target=child)
        p.start()
        status, child_sock, name = out.get(timeout=30)
        p.join(30)
        self.assertEqual(status, "ok", child_sock)
        self.assertNotEqual(child_sock, parent)
        self.assertEqual(name, q)
        self.assertEqual(c._local.conn.sock.getsockname(), parent)
        self.assertEqual(c.health()["status"], "ok")

    def test_a_pickled_client_connects_on_its_own(self):
        """A Client pickled for a process started with spawn (a DataLoader worker's) could
        not be pickled at all (its per-thread connections and lock); the copy has the URL,
        token and settings, and opens a connection of its own."""
        import pickle
        c = muster.Client(self.head.url, self.head.token, timeout=12.5)
        self.addCleanup(c.close)
        c.queues()
        copy = pickle.loads(pickle.dumps(c))
        self.addCleanup(copy.close)
        self.assertEqual((copy.url, copy.token, copy.timeout), (c.url, c.token, 12.5))
        self.assertEqual(copy._all, [])   # nothing of the original's connections
        self.assertEqual(copy.queues(), c.queues())
        self.assertEqual(len(copy._all), 1)
        self.assertIsNot(copy._all[0], c._all[0])
        self.assertIs(copy.shared._c, copy)

    def test_reconnects_after_head_restart(self):
        head = harness.Head().start()
        try:
            c = muster.Client(head.url, head.token)
            c.put_queue("q")
            head.stop()
            with self.assertRaises(muster.NetworkError):
                c.queues()
            data_dir = head.data_dir
            head2 = harness.Head(["--listen", head.url.split("//")[1]], data_dir=data_dir)
            head2.args = []  # same data dir; a new port is fine: point the client at it
            head2.start()
            c2 = muster.Client(head2.url, head2.token)
            self.assertEqual([q["name"] for q in c2.queues()], ["q"])
            head2.kill()
        finally:
            head.cleanup()

    def test_defaults_from_environment_and_data_dir(self):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "url"), "w") as f:
            f.write(self.head.url + "\n")
        with open(os.path.join(d, "token"), "w") as f:
            f.write(self.head.token + "\n")
        saved = {k: os.environ.pop(k, None) for k in ("MUSTER_URL", "MUSTER_TOKEN", "MUSTER_DATA_DIR")}
        try:
            c = muster.Client(data_dir=d)
            self.assertEqual((c.url, c.token), (self.head.url, self.head.token))
            c.queues()
            os.environ["MUSTER_DATA_DIR"] = d
            self.assertEqual(muster.Client().token, self.head.token)
            os.environ["MUSTER_URL"] = "http://127.0.0.1:1"
            os.environ["MUSTER_TOKEN"] = "from-env"
            c = muster.Client()
            self.assertEqual((c.url, c.token), ("http://127.0.0.1:1", "from-env"))
            self.assertEqual(muster.Client("http://x:2", "t").url, "http://x:2")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


class TestUrlChecks(unittest.TestCase):
    """Client's URL is checked as the CLI checks --url (src/core/url.c), before any call."""

    BAD = ("127.0.0.1:7500", "http://h:7500/v1", "http://h:7500/v1/", "ftp://h:1", "http://:1",
           "http://h:0", "http://h:99999", "http://h:1?x=1", "http://h:1x", "http://[]:1")

    def cli_problem(self, url):
        """What `muster queue ls --url URL` says is wrong with URL."""
        r = subprocess.run([os.environ["MUSTER_BIN"], "queue", "ls", "--url", url, "--token", "t"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        first = r.stderr.splitlines()[0]
        self.assertTrue(first.startswith("muster: --url '%s' is not a head's URL (http://HOST:PORT): "
                                         % url), first)
        return first.split("(http://HOST:PORT): ", 1)[1]

    def test_urls_that_name_no_head_are_refused_as_the_cli_refuses_them(self):
        # "127.0.0.1:7500" was taken as http://; ".../v1" failed at the first call with
        # "no endpoint at /v1/v1/...".
        for url in self.BAD:
            with self.subTest(url=url), self.assertRaises(ValueError) as cm:
                muster.Client(url, "t")
            said = str(cm.exception)
            self.assertTrue(said.startswith("url '%s' is not a head's URL (http://HOST:PORT): " % url),
                            said)
            self.assertEqual(said.split("(http://HOST:PORT): ", 1)[1],
                             self.cli_problem(url).replace("the commands add", "the client adds"))
        for url in ("http://127.0.0.1:7370", "https://h", "http://[::1]:7370", "http://h:1/proxy/"):
            self.assertEqual(muster.Client(url, "t").url, url.rstrip("/"))

    def test_a_named_data_dir_without_url_file_is_refused(self):
        # It fell back to http://127.0.0.1:7370, maybe another head, as the CLI did.
        saved = {k: os.environ.pop(k, None) for k in ("MUSTER_URL", "MUSTER_TOKEN", "MUSTER_DATA_DIR")}
        try:
            d = tempfile.mkdtemp()
            nope = os.path.join(d, "nope")
            with self.assertRaises(ValueError) as cm:
                muster.Client(data_dir=nope)
            self.assertEqual(str(cm.exception),
                             "data_dir '%s' has no url file (%s/url: No such file or directory), "
                             "which a head writes while it runs: start the head with this data dir, "
                             "name the data dir of a running head, or pass url= (or set MUSTER_URL)"
                             % (nope, nope))
            os.environ["MUSTER_DATA_DIR"] = d
            with self.assertRaises(ValueError) as cm:
                muster.Client()
            self.assertTrue(str(cm.exception).startswith("MUSTER_DATA_DIR '%s' has no url file" % d))
            self.assertEqual(muster.Client("http://h:1", data_dir=nope).url, "http://h:1")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v


class ScriptedServer:
    """A loopback server that answers each connection's requests from `replies` (None:
    read the request, then close without answering; BEFORE_BODY: read its head only,
    then close) and counts its connections;
    `requests` has their request lines, `heads` their heads, `bodies` their bodies (of a
    Content-Length, or chunked).  A request that asks for "100 Continue" gets it with
    `answer_continue`, else it is ignored, as many servers do."""

    BEFORE_BODY = "before-body"

    def __init__(self, *per_connection, answer_continue=False):
        self.per_connection, self.accepts, self.requests = list(per_connection), 0, []
        self.heads, self.bodies = [], []
        self.answer_continue = answer_continue
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read_request(self, conn, buf, body=True):
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None, b""
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        self.heads.append(head)
        if not body:
            return head.split(b"\r\n")[0], b""
        lines = [line.lower() for line in head.split(b"\r\n")]
        if self.answer_continue and b"expect: 100-continue" in lines:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if b"transfer-encoding: chunked" in lines:
            body, rest = self._read_chunked(conn, rest)
            self.bodies.append(body)
            return head.split(b"\r\n")[0], rest
        length = 0
        for line in lines:
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            piece = conn.recv(65536)
            if not piece:  # the client went away mid-body: keep what came
                break
            rest += piece
        self.bodies.append(rest[:length])
        return head.split(b"\r\n")[0], rest[length:]

    @staticmethod
    def _read_chunked(conn, buf):
        """A chunked body (without trailers) that begins ``buf``: (its bytes, what came
        after it).  A client that went away mid-body leaves what came."""
        body = b""
        while True:
            while b"\r\n" not in buf:
                piece = conn.recv(65536)
                if not piece:
                    return body, b""
                buf += piece
            line, _, buf = buf.partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            while len(buf) < size + 2:
                piece = conn.recv(65536)
                if not piece:
                    return body + buf[:size], b""
                buf += piece
            body, buf = body + buf[:size], buf[size + 2:]
            if size == 0:
                return body, buf

    def _run(self):
        for replies in self.per_connection:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return   # the test closed the listener: it expects no more connections
            self.accepts += 1
            buf = b""
            for reply in replies:
                line, buf = self._read_request(conn, buf, reply is not self.BEFORE_BODY)
                if line is None:
                    break
                self.requests.append(line)
                if reply is None or reply is self.BEFORE_BODY:
                    break
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(reply), reply))
            conn.close()
            self.closed.set()
        self.listener.close()

    def pending_connection(self):
        try:
            return bool(select.select([self.listener], [], [], 0.5)[0])
        except (OSError, ValueError):
            return False


class TestRetries(unittest.TestCase):
    def test_post_without_reply_is_not_sent_again(self):
        """The head did the POST and died before its reply: sending it again could put
        the batch twice, so the client says no reply came and sends nothing more."""
        srv = ScriptedServer([b'{"queues": []}', None],
                             [b'{"tasks": [{"id": 2, "created": true}]}'])  # a resend's
        c = muster.Client(srv.url, "token-123456", timeout=5)
        self.assertEqual(c.queues(), [])
        with self.assertRaises(muster.NetworkError) as cm:
            c.put("q", "x")
        self.assertIn("POST /v1/queues/q/tasks (%s): " % srv.url, str(cm.exception))
        self.assertFalse(srv.pending_connection())
        self.assertEqual((srv.accepts, len(srv.requests)), (1, 2))
        srv.listener.close()

    def test_idle_closed_connection_is_replaced_before_sending(self):
        """A connection the server closed while idle is found closed before a POST is
        sent on it: the POST goes once, on a new connection."""
        srv = ScriptedServer([b'{"queues": []}'], [b'{"tasks": [{"id": 1, "created": true}]}'])
        c = muster.Client(srv.url, "token-123456", timeout=5)
        c.queues()
        self.assertTrue(srv.closed.wait(5))
        # The idle time itself is what is tested: a connection is looked at only once it
        # has been idle for IDLE_CHECK_S.
        time.sleep(client_module.IDLE_CHECK_S * 1.5)
        self.assertEqual(c.put("q", "x"), 1)
        srv.thread.join(5)
        self.assertEqual((srv.accepts, len(srv.requests)), (2, 2))


class TestErrors(HeadTestCase):
    head_args = ("--sweep-ms", "50", "--max-body", "200000", "--max-payload", "50000")

    def check(self, cls, code, status, fn, *args, **kw):
        with self.assertRaises(cls) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertIsInstance(e, muster.MusterError)
        self.assertEqual((e.code, e.status), (code, status))
        self.assertTrue(e.message)
        return e

    def test_every_code_the_head_sends(self):
        q, n = self.qname(), self.qname("next")
        self.c.put_queue(n)
        self.c.put_queue(q, next=n)
        r = self.c.request
        self.check(errors.BadRequest, "bad_request", 400, r, "GET", "/v1/tasks/abc")
        self.check(errors.BadRequest, "bad_json", 400, r, "POST", "/v1/queues/%s/tasks" % q, b"{nope")
        e = self.check(muster.InvalidArgument, "invalid_argument", 400, self.c.put, q, 1, priority="x")
        self.assertIn("priority", e.message)
        self.check(errors.NameInvalid, "name_invalid", 400, self.c.put_queue, "bad name!")
        # A name no queue could have is name_invalid wherever a queue is named, not
        # QueueNotFound.
        for call in (self.c.queue, lambda name: self.c.put(name, 1)):
            self.check(errors.NameInvalid, "name_invalid", 400, call, "bad name!")
        self.assertTrue(issubclass(errors.NameInvalid, muster.InvalidArgument))
        self.check(muster.Unauthorized, "unauthorized", 401, muster.Client(self.head.url, "wrong").queues)
        self.check(muster.Unauthorized, "unauthorized", 401, muster.Client(self.head.url, None).queues) \
            if not os.environ.get("MUSTER_TOKEN") else None
        self.check(muster.NotFound, "not_found", 404, r, "GET", "/v1/nope")
        self.check(muster.QueueNotFound, "queue_not_found", 404, self.c.queue, "no-such-queue")
        self.check(muster.TaskNotFound, "task_not_found", 404, self.c.task, 999999)
        self.check(muster.WorkerNotFound, "worker_not_found", 404, self.c.heartbeat, 999999)
        self.check(errors.MethodNotAllowed, "method_not_allowed", 405, r, "PATCH", "/v1/queues")
        self.c.put(q, 1)
        lease = self.c.lease_one(q)
        self.check(muster.LeaseLost, "lease_lost", 409, self.c.complete, lease.task, lease.token + 1000)
        self.check(muster.InvalidState, "invalid_state", 409, self.c.requeue_task, lease.task)
        self.check(muster.QueueInUse, "queue_in_use", 409, self.c.delete_queue, n)
        self.assertTrue(issubclass(muster.LeaseLost, muster.Conflict))
        self.check(errors.PayloadTooLarge, "payload_too_large", 413, self.c.put, q, "x" * 60000)
        self.check(errors.BatchTooLarge, "batch_too_large", 413, self.c.put_payloads, q, [0] * 1001)
        self.check(errors.BodyTooLarge, "body_too_large", 413, self.c.put_payloads, q, ["y" * 40000] * 6)
        self.check(errors.UnsupportedMediaType, "unsupported_media_type", 415, r, "POST",
                   "/v1/queues/%s/tasks" % q, b'{"tasks": []}', content_type="text/plain")
        # Nothing of the refused calls was applied.
        self.assertEqual(self.c.queue(q)["counts"]["queued"], 0)

    def test_node_and_session_not_found(self):
        for path, cls, code in (("/v1/nodes/none", muster.NodeNotFound, "node_not_found"),
                                ("/v1/sessions/s-none", muster.SessionNotFound, "session_not_found")):
            with self.assertRaises(muster.NotFound) as cm:
                self.c.request("GET", path)
            if cm.exception.code != "not_found":  # the route exists
                self.assertIsInstance(cm.exception, cls)
                self.assertEqual(cm.exception.code, code)

    def test_network_error(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        with self.assertRaises(muster.NetworkError) as cm:
            muster.Client("http://127.0.0.1:%d" % port, "t").queues()
        self.assertEqual((cm.exception.code, cm.exception.status), ("network", 0))
        self.assertIsInstance(cm.exception, ConnectionError)

    def test_no_head_there_says_what_to_do_by_where_the_url_came_from(self):
        """A refused connection said only "[Errno 111] Connection refused": the CLI's
        advice, which follows where the URL came from, is now said by the client too."""
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        with open(os.path.join(d, "url"), "w") as f:
            f.write(url + "\n")   # left behind by a head killed with -9
        saved = {k: os.environ.pop(k, None) for k in ("MUSTER_URL", "MUSTER_TOKEN", "MUSTER_DATA_DIR")}
        cwd = os.getcwd()
        try:
            for client, advice in (
                    (lambda: muster.Client(url, "t"),
                     "is a muster head or node agent running there? The URL is the one url= "
                     "gives: start it, or give the URL of a running one"),
                    (lambda: muster.Client(data_dir=d),
                     "is the head running there? The URL was read from %s/url, which a head "
                     "writes when it listens and leaves behind when it is killed: start that "
                     "head again, or pass url= (or set MUSTER_URL)" % d)):
                with self.assertRaises(muster.NetworkError) as cm:
                    client().queues()
                self.assertEqual(str(cm.exception), "network: GET /v1/queues (%s): [Errno 111] "
                                 "Connection refused; %s" % (url, advice))
            os.environ["MUSTER_URL"] = url
            with self.assertRaises(muster.NetworkError) as cm:
                muster.Client().health()
            self.assertIn("; is a muster head or node agent running there? The URL is the one "
                          "MUSTER_URL gives",
                          str(cm.exception))
            del os.environ["MUSTER_URL"]
            os.chdir(d)   # no muster-data here: the default URL, a guess
            c = muster.Client(token="t")
            self.assertEqual(c.url, client_module.DEFAULT_URL)
            c._port = int(url.rsplit(":", 1)[1])   # where nothing listens, whatever runs on 7370
            with self.assertRaises(muster.NetworkError) as cm:
                c.queues()
            self.assertTrue(str(cm.exception).endswith(
                "; is a muster head or node agent running there? No URL was given and "
                "./muster-data has no url file, so the default URL was tried: start a head "
                "(muster head, or muster.start_head()), pass url= (or set MUSTER_URL), or name "
                "a running head's data dir with data_dir= (or MUSTER_DATA_DIR)"),
                str(cm.exception))
        finally:
            os.chdir(cwd)
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v

    def test_no_token_says_where_the_client_looked(self):
        """A client without a token got the head's advice, which speaks of HTTP headers;
        it now says where it looked and how to give one, as the CLI does."""
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        saved = {k: os.environ.pop(k, None) for k in ("MUSTER_URL", "MUSTER_TOKEN", "MUSTER_DATA_DIR")}
        try:
            c = muster.Client(self.head.url, data_dir=d)
            self.assertIsNone(c.token)
            with self.assertRaises(muster.Unauthorized) as cm:
                c.queues()
            self.assertEqual(cm.exception.message,
                             "the head needs a token, and no token was given: not by token=, "
                             "not by MUSTER_TOKEN, and not in %s/token (No such file or "
                             "directory, from data_dir=); pass token=, set MUSTER_TOKEN, or "
                             "point data_dir= (or MUSTER_DATA_DIR) at the head's data dir, "
                             "which holds the file 'token'" % d)
            self.assertEqual((cm.exception.code, cm.exception.status), ("unauthorized", 401))
            with self.assertRaises(muster.Unauthorized) as cm:   # a wrong token: the head's words
                muster.Client(self.head.url, "wrong-token").queues()
            self.assertIn("the token sent is not valid for this head", cm.exception.message)
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v

    def test_a_server_that_is_not_a_head_is_named(self):
        # A reply without muster's error envelope names the server and the request, and
        # says it is likely not a muster head (the C client says the same).
        with harness.not_muster_server() as url, self.assertRaises(muster.NotFound) as cm:
            muster.Client(url, "t").queues()
        self.assertEqual(cm.exception.message,
                         "the server at %s answered HTTP 404 to GET /v1/queues without a muster "
                         "error body: it is likely not a muster head; check the URL and its path"
                         % url)

    def test_mapping_of_codes_the_head_cannot_be_made_to_send(self):
        table = {"forbidden": (muster.Forbidden, 403), "version_mismatch": (muster.VersionMismatch, 409),
                 "iteration_not_found": (muster.IterationNotFound, 404),
                 "node_not_found": (muster.NodeNotFound, 404),
                 "session_not_found": (muster.SessionNotFound, 404),
                 "internal": (muster.ServerError, 500), "store_error": (errors.StoreError, 500),
                 "unavailable": (muster.Unavailable, 503)}
        for code, (cls, status) in table.items():
            e = errors.from_reply(status, {"error": {"code": code, "message": "m"}})
            self.assertIsInstance(e, cls)
            self.assertEqual((e.code, e.status, e.message), (code, status, "m"))
        self.assertIsInstance(errors.from_reply(409, {"error": {"code": "new_code", "message": ""}}),
                              muster.Conflict)
        self.assertIsInstance(errors.from_reply(502, None), muster.ServerError)
        self.assertIsInstance(errors.from_reply(404, b"x"), muster.NotFound)
        for sub in (muster.QueueNotFound, muster.TaskNotFound, muster.WorkerNotFound, muster.NodeNotFound,
                    muster.SessionNotFound, muster.IterationNotFound):
            self.assertTrue(issubclass(sub, muster.NotFound))
        # Every code of include/muster.h's table has a class.
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "include", "muster.h")) as f:
            header = f.read()
        import re
        for code, status in re.findall(r'XX\(\w+, "(\w+)", (\d+),', header):
            if code in ("ok", "out_of_memory", "io_error"):  # libmuster's own (docs/python.md)
                continue
            self.assertIn(code, errors._BY_CODE, code)


class TestProcesses(unittest.TestCase):
    def test_start_head_stop_and_is_running(self):
        d = tempfile.mkdtemp(prefix="muster-py-")
        self.assertFalse(muster.is_head_running(d))
        head = muster.start_head(data_dir=d, listen="127.0.0.1:0")
        try:
            self.assertTrue(muster.is_head_running(d))
            self.assertTrue(head.running())
            self.assertEqual(head.client().health()["status"], "ok")
            with open(os.path.join(d, "token")) as f:
                self.assertEqual(head.token, f.read().strip())
            with self.assertRaises(muster.Conflict):
                muster.start_head(data_dir=d, listen="127.0.0.1:0")
        finally:
            self.assertEqual(head.stop(), 0)
        self.assertEqual(head.wait(), 0)
        self.assertFalse(muster.is_head_running(d))

    def test_start_server_with_token(self):
        d = tempfile.mkdtemp(prefix="muster-py-")
        with muster.start_server(data_dir=d, listen="127.0.0.1:0", token="tok-0123456789abcdef") as head:
            self.assertEqual(head.token, "tok-0123456789abcdef")
            c = muster.Client(head.url, "tok-0123456789abcdef")
            c.put_queue("q")
            self.assertEqual(c.queues()[0]["name"], "q")
            c.close()
        self.assertFalse(head.running())

    def test_start_node(self):
        d = tempfile.mkdtemp(prefix="muster-py-")
        lock = os.path.join(d, "node.lock")
        with muster.start_server(data_dir=d, listen="127.0.0.1:0") as head:
            try:
                node = muster.start_node(join=head.url, token=head.token, name="py-node", listen="none",
                                         lock_file=lock, log_path=os.path.join(d, "node.log"))
            except NotImplementedError:
                self.skipTest("no `muster node` in this binary yet")
            try:
                c = head.client()
                # start_node returns once the agent joined: the head has the node (it
                # returned at once, before the agent had even asked).
                self.assertEqual(c.node("py-node")["state"], "active")
                self.assertTrue(muster.is_node_running(lock))
            finally:
                node.stop()
            self.assertFalse(muster.is_node_running(lock))
            c.close()

    def start_node_error(self, **kwargs):
        """The text of the RuntimeError start_node(**kwargs) raises; a node it returns
        instead is stopped, and the test fails."""
        try:
            node = muster.start_node(**kwargs)
        except RuntimeError as e:
            return str(e)
        node.kill()
        self.fail("start_node returned %r" % node)

    def test_start_node_with_a_wrong_token_raises_the_agent_s_reason(self):
        d = tempfile.mkdtemp(prefix="muster-py-")
        self.addCleanup(shutil.rmtree, d, True)
        with muster.start_server(data_dir=d, listen="127.0.0.1:0") as head:
            started = time.monotonic()
            text = self.start_node_error(join=head.url, token="not-the-token", name="py-bad",
                                         listen="none", lock_file=os.path.join(d, "node.lock"),
                                         log_path=os.path.join(d, "node.log"))
            self.assertLess(time.monotonic() - started, 20)   # not its 30 s timeout
            self.assertTrue(text.startswith(
                "muster node exited with status 1 before it joined the head at %s: muster "
                "node: register: unauthorized: the token sent is not valid for this head"
                % head.url), text)
            self.assertIn("; stopping (the agent's token comes from --token or MUSTER_TOKEN) "
                          "(log: %s/node.log)" % d, text)
            self.assertFalse(muster.is_node_running(os.path.join(d, "node.lock")))

    def test_start_node_that_cannot_join_in_time_is_stopped(self):
        d = tempfile.mkdtemp(prefix="muster-py-")
        self.addCleanup(shutil.rmtree, d, True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = "http://127.0.0.1:%d" % s.getsockname()[1]   # no head there
        lock = os.path.join(d, "node.lock")
        text = self.start_node_error(join=url, token="tok-0123456789abcdef", name="py-away",
                                     listen="none", args=["--lock-file", lock],
                                     log_path=os.path.join(d, "node.log"), timeout=1.5)
        self.assertRegex(text, r"^muster node did not join the head at %s within "
                         r"1\.5 s, and was stopped; its last line: muster node: register: "
                         r"network: .*\(retrying\) \(log: %s/node\.log\)$"
                         % (re.escape(url), re.escape(d)))
        self.assertFalse(muster.is_node_running(lock))

    def test_distributed_computing_s_positional_calls_are_refused(self):
        """distributed_computing's start_node(password, address) and
        start_server(password, port), called so on muster: the node was started with
        the password as its head's URL (it exited at once, while start_node returned a
        Process as if it ran), and start_server made a data dir named after the
        password before failing on the port ('expected str, bytes or os.PathLike
        object, not int')."""
        d = tempfile.mkdtemp(prefix="muster-py-")
        self.addCleanup(shutil.rmtree, d, True)
        cwd = os.getcwd()
        os.chdir(d)
        try:
            with mock.patch("subprocess.Popen") as popen:
                with self.assertRaises(ValueError) as cm:
                    muster.start_node("12345678", "194.173.121.37")
                self.assertEqual(str(cm.exception), "join: the head's URL (http://HOST:7370), "
                                 "and the one given is not: it must start with http:// or "
                                 "https://; distributed_computing's start_node(password, "
                                 "address, port) is muster.start_node("
                                 "join='http://ADDRESS:7370', token=PASSWORD)")
                self.assertNotIn("12345678", str(cm.exception))   # it may be a password
                for start in (muster.start_server, muster.start_head):
                    with self.assertRaises(TypeError) as cm:
                        start("12345678", 8899)
                    self.assertTrue(str(cm.exception).startswith(
                        "listen: 'ADDR:PORT' text such as '0.0.0.0:7370', not 8899; "
                        "distributed_computing's start_server(password, port) is "
                        "muster.start_server(data_dir, listen='0.0.0.0:PORT', token=PASSWORD)"),
                        str(cm.exception))
                popen.assert_not_called()
            self.assertEqual(os.listdir(d), [])   # no data dir named after the password
        finally:
            os.chdir(cwd)

if __name__ == "__main__":
    unittest.main()
