"""Sessions: create, get, list, heartbeat, submit with automatic and explicit
indexes, results streams in submission and completion order with cursors and
long-poll, gaps in the indexes, exactly-once results, close, and cleanup_on_exit
when the client goes silent (docs/api.md, "Sessions")."""
import json
import os
import sqlite3
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from test_api_common import ApiTestCase, is_int, now_ms  # noqa: E402

SESSION_KEYS = {"id", "queue", "state", "cleanup_on_exit", "timeout_ms", "init_data",
                "created_ms", "last_seen_ms", "counts", "next_index", "updates", "sealed"}
RESULT_KEYS = {"index", "task", "state", "result", "error", "seq"}


def hold(seconds, step=None):
    """Lets time pass, calling `step` meanwhile (to show that something did NOT happen)."""
    end = time.monotonic() + seconds

    def done():
        if step:
            step()
        return time.monotonic() >= end
    harness.wait_until(done, timeout=seconds + 5, interval=0.05, what="time")


class Reader(threading.Thread):
    """One results read on its own connection (for long-polls)."""

    def __init__(self, head, path):
        super().__init__(daemon=True)
        self.head, self.path = head, path
        self.reply = self.error = None
        self.finished_at = None
        self.sent, self.port = threading.Event(), None

    def taken(self):
        """Whether the head has read the whole request off its socket: sent, acknowledged
        by the head's kernel, none of it left unread there.  The head reads, parses and
        routes a request in one callback of its one loop, so a read taken is a read
        parked (or answered): a signal the head handles later finds it there."""
        if not self.sent.is_set():
            return False
        sockets = node_harness.tcp_sockets()
        ours = [s for s in sockets if (s.local_port, s.remote_port) == (self.port, self.head.port)]
        heads = [s for s in sockets if (s.local_port, s.remote_port) == (self.head.port, self.port)]
        return len(ours) == len(heads) == 1 and ours[0].tx_queue == 0 and heads[0].rx_queue == 0

    def run(self):
        conn = self.head.connection(timeout=60)
        getresponse = conn.getresponse

        def sent_then_wait(*args, **kw):
            self.port = conn.sock.getsockname()[1]
            self.sent.set()  # the whole request is in the socket
            return getresponse(*args, **kw)
        conn.getresponse = sent_then_wait
        try:
            self.reply = self.head.request("GET", self.path, conn=conn)
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            self.finished_at = time.monotonic()
            conn.close()


class SessionCase(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "30000")

    def open_session(self, **body):
        body.setdefault("queue", self.q)
        s = self.expect("POST", "/v1/sessions", body, status=201)
        self.assert_session_shape(s)
        return s

    def assert_session_shape(self, s):
        self.assertEqual(set(s), SESSION_KEYS, s)
        self.assertEqual(set(s["counts"]), {"total", "done", "failed", "pending"}, s)
        self.assertTrue(s["id"].startswith("s-"), s)
        for k in ("timeout_ms", "created_ms", "last_seen_ms", "next_index", "updates"):
            self.assertTrue(is_int(s[k]), "%s: %r" % (k, s))

    def get_session(self, sid):
        s = self.expect("GET", "/v1/sessions/" + sid)
        self.assert_session_shape(s)
        return s

    def submit(self, sid, tasks, status=201):
        r = self.expect("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": tasks}, status=status)
        self.assertEqual(len(r["tasks"]), len(tasks), r)
        for e in r["tasks"]:
            self.assertEqual(set(e), {"id", "index"}, e)
        return r["tasks"]

    def store_count(self, sql, *args):
        """A count read from the store of the head, which must not run."""
        db = sqlite3.connect(os.path.join(self.head.data_dir, "muster.db"))
        try:
            return db.execute(sql, args).fetchone()[0]
        finally:
            db.close()

    def deleted(self, sid):
        """Whether the head logged that the last of session `sid`'s tasks went."""
        with open(self.head.log_path, errors="replace") as f:
            return "session %s: the last of its" % sid in f.read()

    def results(self, sid, **query):
        path = "/v1/sessions/%s/results" % sid
        if query:
            path += "?" + "&".join("%s=%s" % kv for kv in query.items())
        r = self.expect("GET", path)
        self.assertEqual(set(r), {"results", "cursor", "total", "done", "gap", "sealed"}, r)
        for x in r["results"]:
            self.assertEqual(set(x), RESULT_KEYS, x)
        return r

    def complete(self, lease, result):
        self.ack("complete", [{"task": lease["task"], "token": lease["token"],
                               "result": result}])

    def lease_by_index(self, n):
        """Leases n tasks; returns {index: lease}."""
        leases = self.lease(max=n)
        self.assertEqual(len(leases), n, leases)
        return {x["index"]: x for x in leases}

    def stream_all(self, sid, order, max_per_call=3):
        """Reads a whole stream from cursor 0 in pages; returns (results, cursor)."""
        out, cursor = [], 0
        for _ in range(1000):
            r = self.results(sid, order=order, cursor=cursor, max=max_per_call)
            if not r["results"]:
                return out, cursor
            out += r["results"]
            cursor = r["cursor"]
        self.fail("stream does not end")


class SessionTest(SessionCase):

    def test_create_get_list(self):
        self.create_queue()
        t0 = now_ms()
        s = self.open_session(cleanup_on_exit=False, timeout_ms=5000,
                              init_data={"model": "m", "n": [1, 2]})
        t1 = now_ms()
        self.assertEqual({k: s[k] for k in SESSION_KEYS - {"id", "created_ms", "last_seen_ms"}},
                         {"queue": self.q, "state": "open", "cleanup_on_exit": False,
                          "timeout_ms": 5000, "init_data": {"model": "m", "n": [1, 2]},
                          "counts": {"total": 0, "done": 0, "failed": 0, "pending": 0},
                          "next_index": 0, "updates": 0, "sealed": False})
        self.assert_between(s["created_ms"], t0, t1, "created_ms")
        self.assertEqual(len(s["id"]), 18, s)
        got = self.get_session(s["id"])
        self.assertEqual({k: got[k] for k in SESSION_KEYS - {"last_seen_ms"}},
                         {k: s[k] for k in SESSION_KEYS - {"last_seen_ms"}})
        # Defaults.
        d = self.open_session()
        self.assertEqual((d["cleanup_on_exit"], d["timeout_ms"], d["init_data"]),
                         (True, 60000, None))
        self.assertNotEqual(d["id"], s["id"])
        # A string init_data stays a string.
        self.assertEqual(self.open_session(init_data="text")["init_data"], "text")
        listed = {x["id"]: x for x in self.expect("GET", "/v1/sessions")["sessions"]}
        self.assertTrue({s["id"], d["id"]} <= set(listed), listed.keys())
        for x in listed.values():
            self.assert_session_shape(x)
            self.assertEqual(x["state"], "open")

    def test_create_errors(self):
        self.create_queue()
        self.expect_error("POST", "/v1/sessions", {}, 400, "invalid_argument")
        self.expect_error("POST", "/v1/sessions", {"queue": "no-such-queue"}, 404,
                          "queue_not_found")
        self.expect_error("POST", "/v1/sessions", {"queue": "bad name"}, 400, "name_invalid")
        for bad in ({"queue": 5}, {"queue": self.q, "cleanup_on_exit": "yes"},
                    {"queue": self.q, "timeout_ms": 0}, {"queue": self.q, "timeout_ms": "5"},
                    {"queue": self.q, "timeout": 5}, {"queue": self.q, "index": 1}):
            self.expect_error("POST", "/v1/sessions", bad, 400, "invalid_argument")
        for sid in ("s-0000000000000000", "nope"):
            self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")
            self.expect_error("POST", "/v1/sessions/%s/heartbeat" % sid, {}, 404,
                              "session_not_found")
            self.expect_error("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": [{"payload": 1}]},
                              404, "session_not_found")
            self.expect_error("GET", "/v1/sessions/%s/results" % sid, None, 404,
                              "session_not_found")
            self.expect_error("DELETE", "/v1/sessions/" + sid, None, 404, "session_not_found")
        for method, path in (("PUT", "/v1/sessions"), ("DELETE", "/v1/sessions"),
                             ("PUT", "/v1/sessions/x"), ("POST", "/v1/sessions/x"),
                             ("GET", "/v1/sessions/x/heartbeat"), ("PUT", "/v1/sessions/x/tasks"),
                             ("POST", "/v1/sessions/x/results")):
            self.expect_error(method, path, None, 405, "method_not_allowed")

    def test_heartbeat(self):
        self.create_queue()
        s = self.open_session()
        harness.wait_until(lambda: now_ms() > s["last_seen_ms"] + 20, what="time")
        r = self.expect("POST", "/v1/sessions/%s/heartbeat" % s["id"], {})
        self.assertEqual(r, {"id": s["id"], "state": "open"})
        seen = self.get_session(s["id"])["last_seen_ms"]
        self.assertGreater(seen, s["last_seen_ms"])
        self.expect_error("POST", "/v1/sessions/%s/heartbeat" % s["id"], {"x": 1}, 400,
                          "invalid_argument")
        # Any call naming the session counts: a results read.
        harness.wait_until(lambda: now_ms() > seen + 20, what="time")
        self.results(s["id"])
        self.assertGreater(self.get_session(s["id"])["last_seen_ms"], seen)

    def test_submit_indexes(self):
        self.create_queue()
        s = self.open_session()
        sid = s["id"]
        got = self.submit(sid, [{"payload": "a"}, {"payload": {"b": 1}, "priority": 3},
                                {"payload": "c"}])
        self.assertEqual([e["index"] for e in got], [0, 1, 2])
        t = self.get_task(got[1]["id"])
        self.assertEqual((t["queue"], t["session"], t["index"], t["payload"], t["priority"]),
                         (self.q, sid, 1, {"b": 1}, 3))
        # An explicit index above next_index moves it past; a gap below may be filled.
        got = self.submit(sid, [{"payload": "x", "index": 10}, {"payload": "y"},
                                {"payload": "z", "index": 5}])
        self.assertEqual([e["index"] for e in got], [10, 11, 5])
        s = self.get_session(sid)
        self.assertEqual((s["next_index"], s["counts"]),
                         (12, {"total": 6, "done": 0, "failed": 0, "pending": 6}))
        # Leases carry the session and the index.
        lease = self.lease_one()
        self.assertEqual((lease["session"], lease["index"]), (sid, 1))

    def test_submit_conflicts_refuse_the_batch(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 1, "index": 4}])
        before = (self.get_session(sid)["next_index"], self.list_tasks())
        for tasks in ([{"payload": "n"}, {"payload": "dup", "index": 4}],
                      [{"payload": "dup", "index": 0}],
                      [{"payload": "p", "index": 7}, {"payload": "q", "index": 7}]):
            r = self.expect_error("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": tasks}, 409,
                                  "invalid_state")
            self.assertIn("index", r.json["error"]["message"])
        self.assertEqual((self.get_session(sid)["next_index"], self.list_tasks()), before)
        # Another session may use the same index.
        other = self.open_session()["id"]
        self.assertEqual(self.submit(other, [{"payload": 1, "index": 4}])[0]["index"], 4)

    def test_submit_sent_again_is_a_repeat(self):
        # A batch whose reply was lost is sent again: the same payloads at the same
        # explicit indexes are answered with the stored tasks and change nothing.
        self.create_queue()
        sid = self.open_session()["id"]
        batch = [{"payload": "a", "index": 0}, {"payload": {"k": [1, 2.5]}, "index": 1,
                                                 "priority": 3}]
        first = self.submit(sid, batch)

        def state():  # a put counts as the session's heartbeat: last_seen_ms moves
            return ({k: v for k, v in self.get_session(sid).items() if k != "last_seen_ms"},
                    self.list_tasks())
        before = state()
        path = "/v1/sessions/%s/tasks" % sid
        for body in (json.dumps({"tasks": batch}),
                     # the scanner's path and the parsed tree's: written another way
                     '{"tasks":[{"index":0,"payload":"a"},'
                     '{"priority":3,"index":1,"payload":{ "k" : [1, 2.5] }}]}'):
            r = self.head.request("POST", path, raw=body.encode())
            self.assertEqual((r.status, r.json), (200, {"tasks": first, "repeated": True}), body)
        self.assertEqual(state(), before)
        # Not a repeat: another payload or priority, a new index beside stored ones, an
        # automatic index; each is refused whole or (automatic) stored as new.
        for tasks in ([{"payload": "b", "index": 0}],
                      [{"payload": "a", "index": 0, "priority": 1}],
                      [{"payload": "a", "index": 0}, {"payload": "c", "index": 2}]):
            with self.subTest(tasks=tasks):
                r = self.expect_error("POST", path, {"tasks": tasks}, 409, "invalid_state")
                self.assertIn("index: 0 is already in use in session " + sid,
                              r.json["error"]["message"])
        self.assertEqual(self.list_tasks(), before[1])
        self.assertEqual(self.submit(sid, [{"payload": "a"}])[0]["index"], 2)

    def test_submit_with_requires_sent_again_is_a_repeat(self):
        # A pool's jobs that require shared data are sent again as they are when the reply
        # was lost: the same required levels (keys in any order) make it a repeat, another
        # level or list does not.
        self.create_queue()
        sid = self.open_session()["id"]
        need = [{"scope": "models", "name": "weights", "level": 2},
                {"scope": sid, "name": "table", "level": 1}]
        batch = [{"payload": "a", "index": 0, "requires": need}, {"payload": "b", "index": 1}]
        first = self.submit(sid, batch)
        before = self.list_tasks()
        path = "/v1/sessions/%s/tasks" % sid
        reordered = [{"level": 2, "name": "weights", "scope": "models"}, need[1]]
        for tasks in (batch, [dict(batch[0], requires=reordered), batch[1]]):
            r = self.head.request("POST", path, {"tasks": tasks})
            self.assertEqual((r.status, r.json), (200, {"tasks": first, "repeated": True}), tasks)
        for tasks in ([dict(batch[0], requires=[dict(need[0], level=3), need[1]])],
                      [dict(batch[0], requires=need[::-1])],
                      [dict(batch[0], requires=need[:1])],
                      [{"payload": "a", "index": 0}],
                      [batch[0], dict(batch[1], requires=need)]):
            with self.subTest(tasks=tasks):
                r = self.expect_error("POST", path, {"tasks": tasks}, 409, "invalid_state")
                self.assertIn("index: 0 is already in use in session " + sid,
                              r.json["error"]["message"])
        self.assertEqual(self.list_tasks(), before)

    def test_submit_errors(self):
        self.create_queue()
        sid = self.open_session()["id"]
        path = "/v1/sessions/%s/tasks" % sid
        for body in ({}, {"tasks": []}, {"tasks": {}}, {"tasks": [1]}, {"tasks": [{}]},
                     {"tasks": [{"payload": 1, "index": -1}]},
                     {"tasks": [{"payload": 1, "index": "1"}]},
                     {"tasks": [{"payload": 1, "priority": 1.5}]},
                     {"tasks": [{"payload": 1, "key": "k"}]},
                     {"tasks": [{"payload": 1}], "extra": 1}):
            self.expect_error("POST", path, body, 400, "invalid_argument")
        self.expect_error("POST", path, {"tasks": [{"payload": i} for i in range(1001)]}, 413,
                          "batch_too_large")
        self.assertEqual(self.get_session(sid)["counts"]["total"], 0)
        self.assertEqual(self.list_tasks(), [])

    def test_ordered_stream_and_cursor(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": i} for i in range(6)])
        leases = self.lease_by_index(6)
        # Finish 1, 2 and 4: index 0 is not finished, so nothing is in order yet.
        for i in (1, 2, 4):
            self.complete(leases[i], {"r": i})
        r = self.results(sid)
        self.assertEqual((r["results"], r["cursor"], r["total"], r["done"]), ([], 0, 6, 3))
        self.complete(leases[0], {"r": 0})
        r = self.results(sid, order="submission", cursor=0)
        self.assertEqual([x["index"] for x in r["results"]], [0, 1, 2])
        self.assertEqual([x["result"] for x in r["results"]], [{"r": 0}, {"r": 1}, {"r": 2}])
        self.assertEqual(r["cursor"], 3)
        x = r["results"][0]
        self.assertEqual((x["task"], x["state"], x["error"]), (leases[0]["task"], "done", None))
        # Resume from the cursor: index 3 is missing.
        self.assertEqual(self.results(sid, cursor=3)["results"], [])
        self.complete(leases[3], {"r": 3})
        self.complete(leases[5], {"r": 5})
        r = self.results(sid, cursor=3, max=2)
        self.assertEqual(([x["index"] for x in r["results"]], r["cursor"]), ([3, 4], 5))
        r = self.results(sid, cursor=5)
        self.assertEqual(([x["index"] for x in r["results"]], r["cursor"], r["done"]),
                         ([5], 6, 6))
        # Reading again from any cursor gives the same results (the stream is resumable).
        again, cursor = self.stream_all(sid, "submission")
        self.assertEqual(([x["index"] for x in again], cursor), (list(range(6)), 6))
        s = self.get_session(sid)
        self.assertEqual(s["counts"], {"total": 6, "done": 6, "failed": 0, "pending": 0})

    def test_completion_stream(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": i} for i in range(5)])
        leases = self.lease_by_index(5)
        order = [3, 0, 4, 1, 2]
        for i in order[:3]:
            self.complete(leases[i], i * 10)
        r = self.results(sid, order="completion")
        self.assertEqual([x["index"] for x in r["results"]], order[:3])
        seqs = [x["seq"] for x in r["results"]]
        self.assertEqual(seqs, sorted(seqs))
        self.assertEqual(len(set(seqs)), 3)
        self.assertEqual(r["cursor"], seqs[-1])
        self.assertEqual(self.results(sid, order="completion", cursor=r["cursor"])["results"], [])
        for i in order[3:]:
            self.complete(leases[i], i * 10)
        r2 = self.results(sid, order="completion", cursor=r["cursor"])
        self.assertEqual([x["index"] for x in r2["results"]], order[3:])
        self.assertEqual([x["result"] for x in r2["results"]], [10, 20])
        # Paging through the whole stream.
        whole, cursor = self.stream_all(sid, "completion", max_per_call=2)
        self.assertEqual([x["index"] for x in whole], order)
        self.assertEqual(cursor, whole[-1]["seq"])
        # The same results in submission order carry the same seq numbers.
        by_index = {x["index"]: x for x in self.results(sid)["results"]}
        self.assertEqual({x["index"]: x for x in whole}, by_index)

    def test_failed_and_dead_are_results(self):
        self.create_queue(max_attempts=1, backoff_ms=0, backoff_max_ms=0)
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": i} for i in range(3)])
        leases = self.lease_by_index(3)
        self.ack("fail", [{"task": leases[0]["task"], "token": leases[0]["token"],
                           "error": "bad input", "permanent": True}])
        self.ack("fail", [{"task": leases[1]["task"], "token": leases[1]["token"],
                           "error": "flaky"}])
        self.complete(leases[2], "ok")
        r = self.results(sid)
        self.assertEqual([(x["index"], x["state"], x["result"], x["error"]) for x in r["results"]],
                         [(0, "failed", None, "bad input"), (1, "dead", None, "flaky"),
                          (2, "done", "ok", None)])
        s = self.get_session(sid)
        self.assertEqual(s["counts"], {"total": 3, "done": 1, "failed": 2, "pending": 0})
        # A requeued failed task that then completes gives no second result.
        self.expect("POST", "/v1/tasks/%d/requeue" % leases[0]["task"])
        again = self.lease_one()
        self.complete(again, "late")
        r = self.results(sid, order="completion")
        self.assertEqual([x["index"] for x in r["results"]], [0, 1, 2])
        self.assertEqual(self.get_session(sid)["counts"]["done"], 1)

    def test_exactly_once_when_a_task_runs_twice(self):
        self.create_queue(lease_ms=200, backoff_ms=0, backoff_max_ms=0)
        sid = self.open_session()["id"]
        [t] = self.submit(sid, [{"payload": "slow"}])
        first = self.lease_one()
        # The lease expires; another worker runs the task too.
        second = self.wait_lease()[0]
        self.assertEqual((second["task"], second["attempt"]), (t["id"], 2))
        self.complete(second, "second")
        self.ack("complete", [{"task": first["task"], "token": first["token"],
                               "result": "first"}], status=409)
        r = self.results(sid, order="completion")
        self.assertEqual([(x["index"], x["result"]) for x in r["results"]], [(0, "second")])
        self.assertEqual(self.results(sid)["results"], r["results"])

    def test_pipeline_next_stage_is_not_a_second_result(self):
        nxt = self.create_queue(self.qname("next"))["name"]
        self.create_queue(next=nxt)
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": "a"}])
        lease = self.lease_one()
        self.complete(lease, "stage1")
        child = self.lease_one(name=nxt)
        self.assertEqual((child["session"], child["index"]), (sid, 0))
        self.complete(child, "stage2")
        r = self.results(sid, order="completion")
        self.assertEqual([(x["index"], x["result"]) for x in r["results"]], [(0, "stage1")])

    def test_gap_in_reply(self):
        """Explicit indexes 0 and 5 leave 1..4 without a task: a read in submission order
        that stops there says so in "gap"; one that stops at an unfinished task, at the end
        of what was submitted, or after a full page does not; completion order has none."""
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 5, "index": 5}])
        leases = self.lease_by_index(2)
        r = self.results(sid)
        self.assertEqual((r["results"], r["cursor"], r["gap"]), ([], 0, None))
        self.complete(leases[0], "r0")
        r = self.results(sid)
        self.assertEqual(([x["index"] for x in r["results"]], r["cursor"], r["gap"], r["done"],
                          r["total"]), ([0], 1, {"first": 1, "last": 4}, 1, 2))
        self.assertEqual(self.results(sid, max=1)["gap"], None)
        self.assertEqual(self.results(sid, cursor=3)["gap"], {"first": 3, "last": 4})
        self.assertEqual(self.results(sid, cursor=5)["gap"], None)  # 5 has a task, unfinished
        self.complete(leases[5], "r5")
        r = self.results(sid, cursor=1)
        self.assertEqual((r["results"], r["cursor"], r["gap"], r["done"], r["total"]),
                         ([], 1, {"first": 1, "last": 4}, 2, 2))
        r = self.results(sid, cursor=5)
        self.assertEqual(([x["index"] for x in r["results"]], r["cursor"], r["gap"]),
                         ([5], 6, None))
        self.assertEqual(self.results(sid, cursor=6)["gap"], None)
        self.assertEqual(self.results(sid, cursor=100)["gap"], None)
        r = self.results(sid, order="completion")
        self.assertEqual(([x["index"] for x in r["results"]], r["gap"]), ([0, 5], None))

    def test_gap_filled_later(self):
        """A gap is accepted as before (an explicit index below next_index fills it, one in
        use is refused) and the stream then reads the filled indexes in order, each once."""
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 3, "index": 3}])
        leases = self.lease_by_index(2)
        for i in (0, 3):
            self.complete(leases[i], i)
        r = self.results(sid)
        self.assertEqual(([x["index"] for x in r["results"]], r["gap"], r["done"], r["total"]),
                         ([0], {"first": 1, "last": 2}, 2, 2))
        self.assertEqual([e["index"] for e in self.submit(sid, [{"payload": 2, "index": 2}])],
                         [2])
        self.expect_error("POST", "/v1/sessions/%s/tasks" % sid,
                          {"tasks": [{"payload": 9, "index": 2}]}, 409, "invalid_state")
        self.assertEqual(self.results(sid, cursor=1)["gap"], {"first": 1, "last": 1})
        self.assertEqual(self.submit(sid, [{"payload": 1, "index": 1}])[0]["index"], 1)
        self.assertEqual(self.get_session(sid)["next_index"], 4)
        r = self.results(sid, cursor=1)
        self.assertEqual((r["results"], r["cursor"], r["gap"]), ([], 1, None))
        more = self.lease_by_index(2)
        self.complete(more[2], 2)
        self.complete(more[1], 1)
        whole, cursor = self.stream_all(sid, "submission", max_per_call=2)
        self.assertEqual(([(x["index"], x["result"]) for x in whole], cursor),
                         ([(0, 0), (1, 1), (2, 2), (3, 3)], 4))
        r = self.results(sid, cursor=4)
        self.assertEqual((r["results"], r["gap"], r["done"], r["total"]), ([], None, 4, 4))

    def test_results_query_errors(self):
        self.create_queue()
        sid = self.open_session()["id"]
        for query in ("order=random", "order=", "cursor=-1", "cursor=x", "max=0", "max=1001",
                      "max=x", "wait_ms=-5", "wait_ms=soon"):
            self.expect_error("GET", "/v1/sessions/%s/results?%s" % (sid, query), None, 400,
                              "invalid_argument")

    def test_close(self):
        self.create_queue(lease_ms=60000)
        s = self.open_session()
        sid = s["id"]
        got = self.submit(sid, [{"payload": i} for i in range(4)])
        leases = self.lease_by_index(2)
        self.complete(leases[0], "r0")
        other = self.open_session()["id"]
        [kept] = self.submit(other, [{"payload": "keep"}])
        self.expect("POST", "/v1/queues/%s/updates" % self.q, {"data": "s", "session": sid},
                    status=201)
        self.expect("POST", "/v1/queues/%s/updates" % self.q, {"data": "q"}, status=201)
        r = self.expect("DELETE", "/v1/sessions/" + sid)
        self.assertEqual(r, {"id": sid, "cancelled": 3, "deleted": 4})
        for e in got:
            self.expect_error("GET", "/v1/tasks/%d" % e["id"], None, 404, "task_not_found")
        # The worker that held a lease learns that its task is gone.
        self.expect_error("POST", "/v1/leases/complete",
                          {"leases": [{"task": leases[1]["task"], "token": leases[1]["token"]}]},
                          404, "task_not_found")
        ups = self.expect("GET", "/v1/queues/%s/updates" % self.q)
        self.assertEqual(([u["data"] for u in ups["updates"]], ups["last"]), (["q"], 2))
        r = self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")
        self.assertIn("closed", r.json["error"]["message"])
        self.expect_error("DELETE", "/v1/sessions/" + sid, None, 404, "session_not_found")
        self.expect_error("POST", "/v1/queues/%s/updates" % self.q,
                          {"data": 1, "session": sid}, 404, "session_not_found")
        self.assertNotIn(sid, [x["id"] for x in self.expect("GET", "/v1/sessions")["sessions"]])
        # The other session is untouched.
        self.assertEqual(self.get_task(kept["id"])["state"], "queued")
        self.assertEqual(self.get_session(other)["counts"]["total"], 1)


class SessionLongPollTest(SessionCase):
    # A long sweep: readers must be woken by the completion itself.
    head_args = ("--sweep-ms", "10000", "--max-wait-ms", "30000")

    def reader(self, sid, query):
        t = Reader(self.head, "/v1/sessions/%s/results?%s" % (sid, query))
        t.start()
        return t

    def finished(self, t, timeout=10):
        t.join(timeout)
        self.assertFalse(t.is_alive(), "long-poll did not return")
        self.assertIsNone(t.error, t.error)
        return t.reply

    def test_woken_by_completion(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 1}])
        leases = self.lease_by_index(2)
        ordered = self.reader(sid, "wait_ms=20000")
        unordered = self.reader(sid, "order=completion&wait_ms=20000")
        hold(0.3)
        self.assertTrue(ordered.is_alive() and unordered.is_alive())
        # Index 1 finishing wakes the completion reader only.
        self.complete(leases[1], "one")
        done_at = time.monotonic()
        r = self.finished(unordered)
        self.assertLess(unordered.finished_at - done_at, 2.0)
        self.assertEqual((r.status, [x["index"] for x in r.json["results"]]), (200, [1]), r)
        hold(0.3)
        self.assertTrue(ordered.is_alive(), "woken without a result at its cursor")
        self.complete(leases[0], "zero")
        r = self.finished(ordered)
        self.assertEqual([x["index"] for x in r.json["results"]], [0, 1])
        self.assertEqual(r.json["cursor"], 2)

    def test_parked_at_gap_answered_when_the_stream_stalls(self):
        """A reader parked at a gap is answered, empty, as soon as the last task without a
        result finishes: nothing can come at its cursor any more.  Before that, results
        elsewhere do not wake it."""
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 4, "index": 4},
                          {"payload": 6, "index": 6}])
        leases = self.lease_by_index(3)
        self.complete(leases[0], "r0")
        t = self.reader(sid, "cursor=1&wait_ms=20000")
        hold(0.3)
        self.complete(leases[6], "r6")
        hold(0.3)
        self.assertTrue(t.is_alive(), "woken while index 4 was unfinished")
        self.complete(leases[4], "r4")
        done_at = time.monotonic()
        r = self.finished(t)
        self.assertLess(t.finished_at - done_at, 2.0)
        self.assertEqual(r.json, {"results": [], "cursor": 1, "total": 3, "done": 3,
                                  "gap": {"first": 1, "last": 3}, "sealed": False})

    def test_purge_takes_tasks_out_of_the_stream(self):
        """A purge deletes a session's queued tasks: they leave its total, and a reader
        parked at them is answered at once with the gap they leave (it waited for
        results that could never come)."""
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": i} for i in range(3)])
        leases = self.lease_by_index(1)
        self.complete(leases[0], "r0")
        t = self.reader(sid, "cursor=1&wait_ms=20000")
        hold(0.3)
        self.assertTrue(t.is_alive())
        self.assertEqual(self.expect("POST", "/v1/queues/%s/purge" % self.q, {}),
                         {"purged": 2})
        purged_at = time.monotonic()
        r = self.finished(t)
        self.assertLess(t.finished_at - purged_at, 2.0)
        self.assertEqual(r.json, {"results": [], "cursor": 1, "total": 1, "done": 1,
                                  "gap": {"first": 1, "last": 2}, "sealed": False})
        self.assertEqual(self.get_session(sid)["counts"],
                         {"total": 1, "done": 1, "failed": 0, "pending": 0})
        # A purge of another queue, or of one with no session tasks left, changes nothing.
        self.expect("POST", "/v1/queues/%s/purge" % self.q, {})
        self.assertEqual(self.get_session(sid)["counts"]["total"], 1)

    def test_read_at_a_stalled_gap_waits_for_a_fill(self):
        """A read that arrives at a gap of a stalled stream waits as any other (another
        producer may fill the gap): it times out with the gap, or is answered with the
        filled index once its task finishes."""
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 2, "index": 2}])
        leases = self.lease_by_index(2)
        for i in (0, 2):
            self.complete(leases[i], i)
        t0 = time.monotonic()
        r = self.expect("GET", "/v1/sessions/%s/results?cursor=1&wait_ms=300" % sid)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(r, {"results": [], "cursor": 1, "total": 2, "done": 2,
                             "gap": {"first": 1, "last": 1}, "sealed": False})
        t = self.reader(sid, "cursor=1&wait_ms=20000")
        hold(0.3)
        self.assertTrue(t.is_alive(), "a read at a stalled gap did not wait")
        self.submit(sid, [{"payload": 1, "index": 1}])
        self.complete(self.lease_one(), 1)
        r = self.finished(t)
        self.assertEqual(([(x["index"], x["result"]) for x in r.json["results"]],
                          r.json["cursor"], r.json["gap"]), ([(1, 1), (2, 2)], 3, None))

    def test_times_out_empty(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}])
        t0 = time.monotonic()
        r = self.expect("GET", "/v1/sessions/%s/results?cursor=0&wait_ms=300" % sid)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        self.assertEqual(r, {"results": [], "cursor": 0, "total": 1, "done": 0, "gap": None,
                             "sealed": False})
        r = self.expect("GET", "/v1/sessions/%s/results?order=completion&cursor=7&wait_ms=100"
                        % sid)
        self.assertEqual(r, {"results": [], "cursor": 7, "total": 1, "done": 0, "gap": None,
                             "sealed": False})

    def test_woken_by_close(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}])
        t = self.reader(sid, "wait_ms=20000")
        hold(0.3)
        self.assertTrue(t.is_alive())
        self.expect("DELETE", "/v1/sessions/" + sid)
        r = self.finished(t)
        self.assertEqual((r.status, r.error_code), (404, "session_not_found"), r)

    def test_woken_by_queue_delete(self):
        """Deleting a session's queue deletes its tasks and closes the session (and no
        other): a parked reader is answered session_not_found naming why, instead of
        waiting for results that cannot come."""
        self.create_queue()
        other_q = self.q + "-other"
        self.expect("PUT", "/v1/queues/" + other_q, {}, status=201)
        sid = self.open_session()["id"]
        other = self.open_session(queue=other_q)["id"]
        self.submit(sid, [{"payload": 0}, {"payload": 1}])
        t = self.reader(sid, "wait_ms=20000")
        hold(0.3)
        self.assertTrue(t.is_alive())
        self.assertEqual(self.expect("DELETE", "/v1/queues/" + self.q),
                         {"deleted": self.q, "tasks": 2, "sessions_closed": 1})
        r = self.finished(t)
        self.assertEqual((r.status, r.error_code), (404, "session_not_found"), r)
        r = self.head.request("GET", "/v1/sessions/%s/results" % sid)
        self.assertEqual(r.status, 404, r)
        self.assertIn("its queue '%s' was deleted" % self.q, r.json["error"]["message"])
        self.assertEqual(self.get_session(other)["state"], "open")

    def test_woken_by_dead_task(self):
        self.create_queue(max_attempts=1)
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}])
        lease = self.lease_one()
        t = self.reader(sid, "order=completion&wait_ms=20000")
        hold(0.2)
        self.ack("fail", [{"task": lease["task"], "token": lease["token"], "error": "boom"}])
        r = self.finished(t)
        self.assertEqual([(x["state"], x["error"]) for x in r.json["results"]], [("dead", "boom")])


class SessionCleanupTest(SessionCase):
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "30000")

    def test_cleanup_on_client_silence(self):
        self.create_queue(lease_ms=60000)
        s = self.open_session(timeout_ms=300)
        sid = s["id"]
        got = self.submit(sid, [{"payload": i} for i in range(3)])
        self.lease_one()
        self.expect("POST", "/v1/queues/%s/updates" % self.q, {"data": 1, "session": sid},
                    status=201)
        keep = self.open_session(timeout_ms=300, cleanup_on_exit=False)["id"]
        self.submit(keep, [{"payload": "stays"}])
        # Reading the session object does not keep it alive: only its client's calls do.
        harness.wait_until(
            lambda: self.call("GET", "/v1/sessions/" + sid).status == 404, timeout=10,
            what="the silent session to be closed")
        r = self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")
        self.assertIn("did not call", r.json["error"]["message"])
        for e in got:
            self.expect_error("GET", "/v1/tasks/%d" % e["id"], None, 404, "task_not_found")
        self.assertEqual(self.expect("GET", "/v1/queues/%s/updates" % self.q)["updates"], [])
        # Without cleanup_on_exit the session outlives its timeout.
        s2 = self.get_session(keep)
        self.assertEqual((s2["state"], s2["counts"]["total"]), ("open", 1))

    def test_calls_keep_it_open(self):
        self.create_queue()
        sid = self.open_session(timeout_ms=300)["id"]
        hold(1.0, lambda: self.expect("POST", "/v1/sessions/%s/heartbeat" % sid, {}))
        self.assertEqual(self.get_session(sid)["state"], "open")
        # A parked results read is a call in progress: the client is there.
        r = self.expect("GET", "/v1/sessions/%s/results?wait_ms=900" % sid)
        self.assertEqual(r["results"], [])
        self.assertEqual(self.get_session(sid)["state"], "open")
        # Silence closes it (the list does not count as a call naming it).
        harness.wait_until(
            lambda: sid not in [x["id"] for x in self.expect("GET", "/v1/sessions")["sessions"]],
            timeout=10, what="the session to expire")
        self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")


class SessionRestartTest(SessionCase):
    """Sessions, their results and their numbering survive kill -9 of the head."""

    def test_survives_kill(self):
        self.create_queue()
        s = self.open_session(init_data={"k": 1})
        sid = s["id"]
        self.submit(sid, [{"payload": i} for i in range(3)])
        leases = self.lease_by_index(3)
        self.complete(leases[1], "one")
        self.complete(leases[0], "zero")
        self.expect("POST", "/v1/queues/%s/updates" % self.q, {"data": "u", "session": sid},
                    status=201)
        self.head.kill()
        self.head.start()
        r = self.results(sid, order="completion")
        self.assertEqual([(x["index"], x["result"], x["seq"]) for x in r["results"]],
                         [(1, "one", 1), (0, "zero", 2)])
        self.complete(leases[2], "two")
        r = self.results(sid, cursor=0)
        self.assertEqual(([x["index"] for x in r["results"]], r["cursor"], r["done"]),
                         ([0, 1, 2], 3, 3))
        self.assertEqual([x["seq"] for x in self.results(sid, order="completion",
                                                        cursor=2)["results"]], [3])
        got = self.get_session(sid)
        self.assertEqual((got["init_data"], got["next_index"], got["updates"]), ({"k": 1}, 3, 1))
        self.assertEqual(self.submit(sid, [{"payload": 3}])[0]["index"], 3)

    def test_put_sent_again_after_a_restart_is_a_repeat(self):
        # The head stored a batch and died before its reply left: sent again to the
        # restarted head, it is the same batch, not a second one.
        self.create_queue()
        sid = self.open_session()["id"]
        batch = [{"payload": i, "index": i} for i in range(5)]
        first = self.submit(sid, batch)
        self.head.kill()
        self.head.start()
        r = self.expect("POST", "/v1/sessions/%s/tasks" % sid, {"tasks": batch}, status=200)
        self.assertEqual(r, {"tasks": first, "repeated": True})
        got = self.get_session(sid)
        self.assertEqual((got["next_index"], got["counts"]["total"]), (5, 5))


class SessionBigCloseTest(SessionCase):
    """A session with more tasks than one chunk (1000) is closed at once: the close deletes
    one chunk and records the rest, which the head deletes in the background, a chunk per
    loop turn; none of them is leased meanwhile, also after a kill -9 right after the
    reply (docs/api.md, DELETE /v1/sessions/{id})."""

    BIG = 20000

    def test_close_drops_init_data(self):
        """A closed session's init_data (which may be megabytes) leaves the store with
        it; another session's stays."""
        self.create_queue()
        gone = self.open_session(init_data={"weights": "w" * 100000})["id"]
        kept = self.open_session(init_data={"weights": "k"})["id"]
        self.expect("DELETE", "/v1/sessions/" + gone)
        self.assertEqual(self.expect("GET", "/v1/sessions/" + kept)["init_data"],
                         {"weights": "k"})
        self.head.kill()
        self.assertEqual(self.store_count("SELECT count(*) FROM session_data WHERE session = ?",
                                          gone), 0)
        self.assertEqual(self.store_count("SELECT count(*) FROM session_data WHERE session = ?",
                                          kept), 1)
        self.head.start()

    def test_close_is_durable_and_finishes_after_kill9(self):
        self.create_queue()
        sid = self.open_session()["id"]
        ids = []
        for first in range(0, self.BIG, 1000):
            ids += [t["id"] for t in self.submit(sid, [{"payload": i}
                                                       for i in range(first, first + 1000)])]
        [after] = self.put("after")  # behind all of the session's tasks in lease order
        r = self.expect("DELETE", "/v1/sessions/" + sid)
        self.head.kill()
        self.assertEqual(r, {"id": sid, "cancelled": self.BIG, "deleted": self.BIG})
        # The reply came after one chunk, with the rest recorded for the background.
        left = self.store_count("SELECT count(*) FROM tasks WHERE session = ?", sid)
        self.assertGreater(left, 0, "every task was deleted before the reply")
        self.assertLessEqual(left, self.BIG - 1000)
        self.assertEqual(self.store_count(
            "SELECT count(*) FROM session_trash WHERE session = ?", sid), 1)
        self.head.start()
        # Out of the queue's counts at the reply, which the kill kept.
        self.assert_counts(queued=1)
        # Listings skip them, a bounded number a page (a page may come back empty
        # with a `next` past those it skipped).
        listed, cursor = [], 0
        while cursor is not None:
            page = self.expect("GET", "/v1/queues/%s/tasks?limit=1000&after=%d" % (self.q, cursor))
            listed += [t["id"] for t in page["tasks"]]
            cursor = page["next"]
        self.assertEqual(listed, [after])
        # Closed for good, and none of its tasks is leased: the lease steps over them
        # to the task behind them, whatever the background deletion has reached.
        r = self.expect_error("GET", "/v1/sessions/" + sid, None, 404, "session_not_found")
        self.assertIn("closed", r.json["error"]["message"])
        leases = self.lease(max=100)
        self.assertEqual([(x["task"], x["session"]) for x in leases], [(after, None)])
        self.expect_error("GET", "/v1/tasks/%d" % ids[-1], None, 404, "task_not_found")
        harness.wait_until(lambda: self.deleted(sid), timeout=20,
                           what="the closed session's tasks to be deleted")
        self.assert_counts(leased=1)
        self.assertEqual([t["id"] for t in self.list_tasks()], [after])
        self.assertEqual(self.head.stop(), 0)
        self.assertEqual(self.store_count("SELECT count(*) FROM session_trash"), 0)
        self.assertEqual(self.store_count("SELECT count(*) FROM session_results"), 0)
        self.head.start()


class Leaser(threading.Thread):
    """One long-poll lease on its own connection."""

    def __init__(self, head, queue, body):
        super().__init__(daemon=True)
        self.head, self.queue, self.body = head, queue, body
        self.reply = self.error = None

    def run(self):
        conn = self.head.connection(timeout=60)
        try:
            self.reply = self.head.request("POST", "/v1/queues/%s/lease" % self.queue,
                                           self.body, conn=conn)
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            conn.close()


class SessionLeftoverTest(SessionCase):
    """What a big closed session leaves to the background deletion is stepped over: the
    tasks behind it in lease order, other clients' in a queue they share with it, are
    leased and counted ready at once, however many it left, also by a long-poll lease
    that waited from before the close, and after a stop or a kill -9 in the middle of
    the deletion (docs/api.md, DELETE /v1/sessions/{id}).  The head runs with
    MUSTER_TEST_HOLD_LEFTOVERS=1, which holds that deletion for as long as it runs: the
    tasks left stay in the store throughout, as they would behind millions."""

    BIG = 3000  # a chunk deleted at the close, 2000 left
    HOLD = {"MUSTER_TEST_HOLD_LEFTOVERS": "1"}

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(list(cls.head_args), env=cls.HOLD).start()

    def waiters(self):
        r = self.call("GET", "/metrics")
        for line in r.raw.decode().splitlines():
            if line.startswith("muster_lease_waiters "):
                return int(line.split()[1])
        self.fail("no muster_lease_waiters in /metrics")

    def fill(self):
        """Queue q shared by session B (closed with BIG tasks, put in batches between
        which the others put theirs), an open session O and plain puts; two of O's
        tasks done.  Returns B's id and the tasks a lease may take, in lease order."""
        self.create_queue()
        big = self.open_session()["id"]
        other = self.open_session()["id"]
        for first in range(0, self.BIG, 1000):
            self.submit(big, [{"payload": i} for i in range(first, first + 1000)])
            self.submit(other, [{"payload": "o%d" % first, "priority": p} for p in (0, 0, 1)])
            self.put("plain%d" % first)
        done = self.lease(max=2)  # O's of priority 1, ahead of the others
        self.assertEqual({x["session"] for x in done}, {other})
        self.ack("complete", [{"task": x["task"], "token": x["token"], "result": 1}
                              for x in done])
        r = self.expect("DELETE", "/v1/sessions/" + big)
        self.assertEqual(r, {"id": big, "cancelled": self.BIG, "deleted": self.BIG})
        [behind] = self.put("behind")
        tasks = [t for t in self.list_tasks(state="queued")]
        self.assertTrue(all(t["session"] != big for t in tasks), tasks)
        want = [t["id"] for t in sorted(tasks, key=lambda t: (-t["priority"], t["id"]))]
        self.assertEqual(len(want), 3 * 3 - 2 + 3 + 1)
        self.assertEqual(want[-1], behind)
        return big, want

    def assert_leased_at_once(self, want, step, combined=False):
        """`ready` counts the tasks of `want`, and a lease takes them, in that order: one
        batch lease, or (`combined`) one task, then the rest by the lease of the call
        that completes it."""
        self.assertEqual(self.get_queue()["counts"]["queued"], len(want), step)
        self.assertEqual(self.expect("GET", "/v1/queues/%s?ready=true" % self.q)
                         ["counts"]["ready"], len(want), step)
        if combined:
            [first] = self.lease(max=1)
            r = self.expect("POST", "/v1/leases/complete", {
                "leases": [{"task": first["task"], "token": first["token"], "result": 1}],
                "lease": {"queue": self.q, "max": 100}})
            leases = [first] + r["leases"]
        else:
            leases = self.lease(max=100)
        self.assertEqual([x["task"] for x in leases], want, step)
        self.assertEqual(self.expect("GET", "/v1/queues/%s?ready=true" % self.q)
                         ["counts"]["ready"], 0, step)

    def assert_held(self, big):
        """The store (of a head that must not run) still holds B's tasks left."""
        self.assertEqual(self.store_count(
            "SELECT count(*) FROM session_trash WHERE session = ?", big), 1)
        self.assertEqual(self.store_count(
            "SELECT count(*) FROM tasks WHERE session = ?", big), self.BIG - 1000)

    def test_leased_past_what_is_left(self):
        big, want = self.fill()
        self.assert_leased_at_once(want, "the close", combined=True)
        # A long-poll lease parked behind them is answered by the put of a task behind.
        poller = Leaser(self.head, self.q, {"wait_ms": 20000})
        poller.start()
        harness.wait_until(lambda: self.waiters() == 1, what="the lease to wait")
        [later] = self.put("later")
        poller.join(20)
        self.assertIsNone(poller.error, poller.error)
        self.assertEqual([x["task"] for x in poller.reply.json["leases"]], [later])
        self.head.kill()
        self.assert_held(big)
        self.head.start()

    def restart_during_the_deletion(self, end):
        """Closes B, ends the head by `end` (stop or kill) with B's tasks still left,
        starts it again (still holding them): what is behind them is leased at once;
        then without the hold the deletion ends and the counts stay exact."""
        big, want = self.fill()
        if end == "stop":
            self.assertEqual(self.head.stop(), 0)
        else:
            self.head.kill()
        self.assert_held(big)
        self.head.start()
        self.assert_leased_at_once(want, "a restart after a " + end)
        [later] = self.put("later")
        self.assert_leased_at_once([later], "a put after the restart")
        self.assertEqual(self.head.stop(), 0)
        self.assert_held(big)
        self.head.env = {}
        try:
            self.head.start()
            harness.wait_until(lambda: self.deleted(big), timeout=30,
                               what="the closed session's tasks to be deleted")
            self.assert_counts(leased=len(want) + 1, done=2)
            self.assertEqual(self.head.stop(), 0)
            self.assertEqual(self.store_count(
                "SELECT count(*) FROM tasks WHERE session = ?", big), 0)
        finally:
            self.head.env = dict(self.HOLD)
            self.head.start()

    def test_after_a_stop_during_the_deletion(self):
        self.restart_during_the_deletion("stop")

    def test_after_a_kill9_during_the_deletion(self):
        self.restart_during_the_deletion("kill")

    def test_long_poll_waiting_from_before_the_close(self):
        """A lease that waits on the queue before the close, while B's tasks wait out a
        delay, is answered with the task behind them once it is ready, B's having become
        ready before it (2000 of them left: more than a lease once looked past)."""
        self.create_queue()
        big = self.open_session()["id"]
        start = time.monotonic()
        for first in range(0, self.BIG, 1000):  # a plain put may name any session
            self.put_tasks([{"payload": i, "session": big, "delay_ms": 8000}
                            for i in range(first, first + 1000)])
        [behind] = self.put("behind", delay_ms=8500)
        poller = Leaser(self.head, self.q, {"wait_ms": 30000})
        poller.start()
        harness.wait_until(lambda: self.waiters() == 1, what="the lease to wait")
        self.expect("DELETE", "/v1/sessions/" + big)
        self.assertLess(time.monotonic() - start, 7.5,
                        "the close came after B's tasks were ready: the machine was too slow")
        poller.join(30)
        self.assertIsNone(poller.error, poller.error)
        self.assertEqual([x["task"] for x in poller.reply.json["leases"]], [behind])
        self.assertGreaterEqual(time.monotonic() - start, 8.5)
        self.head.kill()
        self.assert_held(big)
        self.head.start()


class SessionLeftoverHoldValueTest(SessionCase):
    """MUSTER_TEST_HOLD_LEFTOVERS holds the deletion only when it is 1: another value is
    said in the log and ignored (the deletion goes on)."""

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(list(cls.head_args),
                                env={"MUSTER_TEST_HOLD_LEFTOVERS": "yes"}).start()

    def test_other_values_are_ignored(self):
        self.create_queue()
        sid = self.open_session()["id"]
        for first in range(0, 2000, 1000):
            self.submit(sid, [{"payload": i} for i in range(first, first + 1000)])
        self.expect("DELETE", "/v1/sessions/" + sid)
        harness.wait_until(lambda: self.deleted(sid), timeout=20,
                           what="the closed session's tasks to be deleted")
        self.assertIn("MUSTER_TEST_HOLD_LEFTOVERS=yes is not 1 or 0", self.head.log())


class SessionShutdownTest(SessionCase):
    """Parked reads are answered, not dropped, when the head stops."""

    def test_parked_reads_answered_on_stop(self):
        self.create_queue()
        sid = self.open_session()["id"]
        self.submit(sid, [{"payload": 0}])
        t = Reader(self.head, "/v1/sessions/%s/results?wait_ms=20000" % sid)
        t.start()
        # Parked before the stop, not merely started: a read the head takes after its
        # SIGTERM is answered 503 (the head is shutting down), not with the results.
        harness.wait_until(t.taken, what="the read to reach the head")
        self.assertTrue(t.is_alive(), t.reply)
        self.assertEqual(self.head.stop(), 0)
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertIsNone(t.error, t.error)
        self.assertEqual((t.reply.status, t.reply.json),
                         (200, {"results": [], "cursor": 0, "total": 1, "done": 0, "gap": None,
                                "sealed": False}),
                         t.reply)
        self.head.start()


if __name__ == "__main__":
    unittest.main()
