"""Sealed sessions (docs/api.md, `POST /v1/sessions/{id}/seal`; docs/cli.md "session").

A producer seals its session to say that no more tasks will come: later puts are
refused with a message that names the session, the session and its results replies say
`sealed`, a results read parked on it is answered by the seal once nothing more can come,
and the seal survives a kill of the head.  `muster session results --follow
--until-sealed` follows a producer across the pause between two puts (where plain
`--follow` ends, as before) and ends once the session is sealed and every result was
printed.  Bad input (a body with a field, a `seal` that is not a boolean, an unknown or
closed session) gets a clear 4xx.

The test is the session's worker: it leases and completes the tasks itself, so it
decides when the follower has caught up.  Bodies go both ways the head reads a put: as
Python's json.dumps writes them (parsed into a tree) and compact (the scanner's path).
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, OwnHeadTestCase  # noqa: E402
from test_api_sessions import Reader  # noqa: E402
from test_session_follow_restart import Follower  # noqa: E402

MUSTER = harness.MUSTER_BIN
WAITING = "has its result; it is not sealed, so waiting for more tasks or the seal"


class SealCase(ApiTestCase):
    head_args = ("--sweep-ms", "10000", "--max-wait-ms", "30000")

    def open_session(self):
        if self.call("GET", "/v1/queues/" + self.q).status == 404:
            self.create_queue()
        return self.expect("POST", "/v1/sessions", {"queue": self.q, "cleanup_on_exit": False},
                           status=201)["id"]

    def put(self, sid, tasks, status=201, compact=False, **extra):
        """A put of `tasks` with `extra` fields; the reply's JSON (or the Reply when it is
        an error).  `compact`: the body as the scanner takes it."""
        body = dict({"tasks": tasks}, **extra)
        path = "/v1/sessions/%s/tasks" % sid
        if compact:
            r = self.call("POST", path, raw=json.dumps(body, separators=(",", ":")).encode())
        else:
            r = self.call("POST", path, body)
        self.assertEqual(r.status, status, r)
        return r.json if status < 300 else r

    def seal(self, sid, body=None, status=200):
        r = self.call("POST", "/v1/sessions/%s/seal" % sid, body)
        self.assertEqual(r.status, status, r)
        return r.json

    def session(self, sid):
        return self.expect("GET", "/v1/sessions/" + sid)

    def complete_all(self, n):
        leases = self.lease(max=n)
        self.assertEqual(len(leases), n, leases)
        for lease in leases:
            self.ack("complete", [{"task": lease["task"], "token": lease["token"],
                                   "result": "r%d" % lease["payload"]}])

    def assert_refused_sealed(self, r, sid):
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertEqual(r.json["error"]["message"],
                         "session %s was sealed (its producer said that no more tasks would "
                         "come): it takes no more; put these tasks into a new session" % sid)


class SealApiTest(SealCase):

    def test_seal_refuses_later_puts(self):
        sid = self.open_session()
        self.put(sid, [{"payload": 0}, {"payload": 1}])
        self.assertIs(self.session(sid)["sealed"], False)
        s = self.seal(sid)
        self.assertEqual((s["id"], s["sealed"], s["already_sealed"], s["counts"]["total"]),
                         (sid, True, False, 2), s)
        self.assertIs(self.session(sid)["sealed"], True)
        listed = [x for x in self.expect("GET", "/v1/sessions")["sessions"] if x["id"] == sid]
        self.assertIs(listed[0]["sealed"], True)
        again = self.seal(sid, {})  # idempotent, and says so
        self.assertEqual((again["sealed"], again["already_sealed"]), (True, True), again)
        for compact in (False, True):
            self.assert_refused_sealed(self.put(sid, [{"payload": 2}], 409, compact), sid)
            self.assert_refused_sealed(
                self.put(sid, [{"payload": 2}], 409, compact, seal=True), sid)
        s = self.session(sid)
        self.assertEqual((s["counts"]["total"], s["next_index"]), (2, 2), s)
        self.assertEqual(self.counts()["queued"], 2)
        # Another session of the queue is not sealed, and takes tasks.
        other = self.open_session()
        self.assertIs(self.session(other)["sealed"], False)
        self.put(other, [{"payload": 9}])

    def test_seal_with_the_last_put(self):
        for compact in (False, True):
            sid = self.open_session()
            r = self.put(sid, [{"payload": 0}], compact=compact, seal=False)
            self.assertNotIn("sealed", r)
            self.assertIs(self.session(sid)["sealed"], False)
            r = self.put(sid, [{"payload": 1, "index": 1}], compact=compact, seal=True)
            self.assertEqual(r, {"tasks": [{"id": r["tasks"][0]["id"], "index": 1}],
                                 "sealed": True})
            self.assertIs(self.session(sid)["sealed"], True)
            self.assertEqual(self.session(sid)["counts"]["total"], 2)
            # Its retry (the reply was lost) is answered as a repeat; other tasks are not.
            again = self.put(sid, [{"payload": 1, "index": 1}], 200, compact, seal=True)
            self.assertEqual(again, dict(r, repeated=True))
            self.assert_refused_sealed(self.put(sid, [{"payload": 2, "index": 1}], 409), sid)
            self.assertEqual(self.seal(sid)["already_sealed"], True)

    def test_results_say_sealed(self):
        sid = self.open_session()
        self.put(sid, [{"payload": 0}])
        path = "/v1/sessions/%s/results" % sid
        self.assertIs(self.expect("GET", path)["sealed"], False)
        self.complete_all(1)
        r = self.expect("GET", path)
        self.assertEqual((r["done"], r["total"], r["sealed"]), (1, 1, False), r)
        self.seal(sid)
        r = self.expect("GET", path + "?cursor=1&order=completion")
        self.assertEqual((r["results"], r["sealed"]), ([], True), r)

    def test_parked_read_answered_by_the_seal(self):
        sid = self.open_session()
        self.put(sid, [{"payload": 0}])
        self.complete_all(1)
        # Caught up, not sealed: the read waits (the head's cap is 30 s) until the seal.
        reader = Reader(self.head, "/v1/sessions/%s/results?cursor=1&wait_ms=25000" % sid)
        reader.start()
        harness.wait_until(reader.taken, what="the read to park on the head")
        self.seal(sid)
        reader.join(10)  # far below its 25 s: the seal answered it
        self.assertFalse(reader.is_alive(), "the seal did not answer the parked read")
        self.assertIsNone(reader.error, reader.error)
        self.assertEqual((reader.reply.status, reader.reply.json["results"],
                          reader.reply.json["sealed"], reader.reply.json["cursor"]),
                         (200, [], True, 1), reader.reply)
        # A sealed session with every result: a read that could wait is answered at once.
        reader = Reader(self.head, "/v1/sessions/%s/results?cursor=1&wait_ms=25000" % sid)
        reader.start()
        reader.join(10)
        self.assertFalse(reader.is_alive(), "a read of an ended stream waited")
        self.assertEqual(reader.reply.json["sealed"], True, reader.reply)

    def test_seal_with_a_task_unfinished_leaves_the_read_parked(self):
        # The seal wakes the reader, which reads again and goes on waiting: the task's
        # result is what answers it (a read the seal had answered would hold none).
        sid = self.open_session()
        self.put(sid, [{"payload": 0}])
        reader = Reader(self.head, "/v1/sessions/%s/results?wait_ms=25000" % sid)
        reader.start()
        harness.wait_until(reader.taken, what="the read to park on the head")
        self.seal(sid)
        self.complete_all(1)
        reader.join(10)
        self.assertFalse(reader.is_alive())
        self.assertEqual(([x["result"] for x in reader.reply.json["results"]],
                          reader.reply.json["sealed"]), (["r0"], True), reader.reply)

    def test_bad_input(self):
        sid = self.open_session()
        r = self.expect_error("POST", "/v1/sessions/%s/seal" % sid, {"force": True}, 400,
                              "invalid_argument")
        self.assertEqual(r.json["error"]["message"],
                         "force: unknown field; this endpoint takes no body (send none, or {})")
        self.expect_error("POST", "/v1/sessions/%s/seal" % sid, [], 400, "bad_json")
        for value in ("yes", 1, [True]):
            for compact in (False, True):
                r = self.put(sid, [{"payload": 0}], 400, compact, seal=value)
                self.assertEqual((r.error_code, r.json["error"]["message"]),
                                 ("invalid_argument", "seal: expected true or false"), r)
        s = self.session(sid)
        self.assertEqual((s["sealed"], s["counts"]["total"]), (False, 0), s)
        # seal: null is the default, as for any boolean field.
        self.assertNotIn("sealed", self.put(sid, [{"payload": 0}], compact=True, seal=None))
        self.assertIs(self.session(sid)["sealed"], False)

    def test_unknown_or_closed_session(self):
        r = self.expect_error("POST", "/v1/sessions/s-0123456789abcdef/seal", None, 404,
                              "session_not_found")
        self.assertIn("session 's-0123456789abcdef' does not exist", r.json["error"]["message"])
        sid = self.open_session()
        self.expect("DELETE", "/v1/sessions/" + sid)
        r = self.expect_error("POST", "/v1/sessions/%s/seal" % sid, {}, 404, "session_not_found")
        self.assertIn("was closed (by its client)", r.json["error"]["message"])


class SealRestartTest(OwnHeadTestCase, SealCase):
    """The seal is durable: it survives a kill -9 of the head."""

    def test_survives_kill(self):
        sid = self.open_session()
        self.put(sid, [{"payload": 0}])
        kept = self.open_session()
        self.seal(sid)
        self.head.kill()
        self.head.start()
        self.assertIs(self.session(sid)["sealed"], True)
        self.assertIs(self.session(kept)["sealed"], False)
        self.assert_refused_sealed(self.put(sid, [{"payload": 1}], 409), sid)
        self.assertEqual(self.seal(sid)["already_sealed"], True)
        self.put(kept, [{"payload": 1}])


class SealCliTest(SealCase):
    """`muster session seal`, `session put --seal` and `session results --follow
    --until-sealed`, the test as the session's worker."""

    def setUp(self):
        super().setUp()
        self.env = harness.cli_env(self.head)

    def cli(self, *args, input="", code=0):
        r = subprocess.run([MUSTER] + list(args), env=self.env, input=input, text=True,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, code, r.stderr)
        return r

    def follow(self, sid, *extra):
        follower = Follower(self.env, sid, *extra)
        self.addCleanup(lambda: follower.proc.poll() is None and follower.proc.kill())
        return follower

    def test_follow_until_sealed_across_a_pause_between_puts(self):
        sid = self.open_session()
        follower = self.follow(sid, "--until-sealed")
        self.cli("session", "put", sid, "--json", input="0\n1\n")
        self.complete_all(2)
        follower.wait_for(lambda: len(follower.out) == 2 and follower.said(WAITING),
                          "the first results and the waiting line")
        self.assertIn("muster: session %s: every task put so far (2) %s (`muster session seal "
                      "%s`; Ctrl-C stops)" % (sid, WAITING, sid), follower.err)
        # The producer's second put comes after the follower caught up.
        self.cli("session", "put", sid, "--json", input="2\n3\n")
        self.complete_all(2)
        follower.wait_for(lambda: len(follower.out) == 4, "the results of the second put")
        r = self.cli("session", "seal", sid)
        self.assertEqual(r.stdout, "session %s sealed; it takes no more tasks\n" % sid)
        self.assertEqual(follower.finish(), 0, follower.stderr())
        self.assertEqual(follower.out, ["r0", "r1", "r2", "r3"])
        self.assertEqual(sum(WAITING in line for line in follower.err), 1, follower.stderr())
        self.assertEqual(follower.err[-1], "cursor: 4")

    def test_put_seal_ends_the_follow(self):
        sid = self.open_session()
        follower = self.follow(sid, "--until-sealed", "--order", "completion")
        self.cli("session", "put", sid, "--json", input="0\n")
        self.complete_all(1)
        follower.wait_for(lambda: follower.out == ["r0"] and follower.said(WAITING),
                          "the first result and the waiting line")
        r = self.cli("session", "put", sid, "--json", "--seal", input="1\n")
        self.assertEqual((r.stdout.split("\t")[0], r.stderr),
                         ("1", "muster: session %s sealed; it takes no more tasks\n" % sid))
        self.complete_all(1)
        self.assertEqual(follower.finish(), 0, follower.stderr())
        self.assertEqual(follower.out, ["r0", "r1"])
        r = self.cli("session", "put", sid, input="2\n", code=1)
        self.assertIn("muster: invalid_state: session %s was sealed (its producer said that no "
                      "more tasks would come): it takes no more; put these tasks into a new "
                      "session" % sid, r.stderr)

    def test_without_until_sealed_ends_when_caught_up(self):
        sid = self.open_session()
        self.cli("session", "put", sid, "--json", input="0\n1\n")
        follower = self.follow(sid)
        self.complete_all(2)
        self.assertEqual(follower.finish(), 0, follower.stderr())
        self.assertEqual(follower.out, ["r0", "r1"])
        self.assertFalse(follower.said(WAITING), follower.stderr())
        self.assertIs(self.session(sid)["sealed"], False)

    def test_sealed_without_tasks_ends_at_once(self):
        sid = self.open_session()
        r = self.cli("session", "put", sid, "--seal")  # an empty stdin only seals
        self.assertEqual((r.stdout, r.stderr),
                         ("", "muster: session %s sealed; it takes no more tasks\n" % sid))
        r = self.cli("session", "results", sid, "--follow", "--until-sealed")
        self.assertEqual((r.stdout, r.stderr), ("", "cursor: 0\n"))
        r = self.cli("session", "seal", sid)
        self.assertEqual(r.stdout, "session %s was sealed already; it takes no more tasks\n"
                         % sid)
        rows = [line.split() for line in self.cli("session", "ls").stdout.splitlines()]
        self.assertEqual((rows[0][-1], [row[-1] for row in rows if row[0] == sid]),
                         ("SEALED", ["yes"]), rows)

    def test_errors(self):
        r = self.cli("session", "seal", "s-0123456789abcdef", code=1)
        self.assertIn("muster: session_not_found: session 's-0123456789abcdef' does not exist",
                      r.stderr)
        sid = self.open_session()
        r = self.cli("session", "results", sid, "--until-sealed", code=2)
        self.assertIn("--until-sealed goes with --follow", r.stderr)
        self.assertIs(self.session(sid)["sealed"], False)
        for cmd in (["session", "seal"], ["session", "put"], ["session", "results"]):
            text = self.cli(*cmd, "--help").stdout
            self.assertIn("seal", text, cmd)


class OlderHeadCliTest(SealCase):
    """The CLI against a head older than sealing (as muster before schema version 23 was:
    a session object without "sealed", no seal route), played by a proxy in front of this
    head.  `session put --seal` must put nothing: it used to put every input and then fail
    on the seal, and a user who ran the failed command again put them all twice."""

    cli = SealCliTest.cli

    def setUp(self):
        super().setUp()
        self.proxy = harness.RequestProxy(self.head, self.older_route, self.as_older)
        self.addCleanup(self.proxy.close)
        self.env = harness.cli_env(self.head)
        self.env["MUSTER_URL"] = self.proxy.url

    @staticmethod
    def older_route(method, path):
        return re.fullmatch(r"/v1/sessions/[^/]+(/seal|/results)?", path) is not None

    @staticmethod
    def unsealed_results(pieces):
        """A results reply without its "sealed" (blanked out, so its length holds)."""
        body = b"".join(pieces)
        yield body.replace(b',"sealed":false', b" " * len(b',"sealed":false'))

    def as_older(self, n):
        method, path, _ = self.proxy.requests[n - 1]
        if path.endswith("/results"):
            return self.unsealed_results
        if path.endswith("/seal"):
            return 404, {"error": {"code": "not_found",
                                   "message": "no endpoint at %s; see docs/api.md" % path}}
        if method != "GET":
            return "forward"
        session = self.session(path.rsplit("/", 1)[1])
        del session["sealed"]
        return 200, session

    def test_put_seal_puts_nothing(self):
        sid = self.open_session()
        r = self.cli("session", "put", sid, "--seal", input="0\n1\n2\n", code=1)
        self.assertEqual(r.stdout, "")
        self.assertIn("muster: the head cannot seal sessions (session %s has no \"sealed\": the "
                      "head is older than this muster): nothing was put. Upgrade the head, or put "
                      "without --seal" % sid, r.stderr)
        self.assertEqual(self.session(sid)["counts"]["total"], 0)
        r = self.cli("session", "put", sid, input="0\n1\n")  # without --seal: as before
        self.assertEqual(len(r.stdout.splitlines()), 2)
        self.assertEqual(self.session(sid)["counts"]["total"], 2)

    def test_follow_until_sealed_ends_failing(self):
        # An older head does not say whether a session is sealed: the follow ends with
        # the tasks put so far, and exit status 1, so that a script waiting for the seal
        # does not take it for the end of the stream.
        sid = self.open_session()
        self.put(sid, [{"payload": 0}])
        self.complete_all(1)
        r = self.cli("session", "results", sid, "--follow", "--until-sealed", "--values", code=1)
        self.assertEqual(r.stdout, "r0\n")
        self.assertIn("--until-sealed cannot be honoured, so the follow ends once every task "
                      "put so far has its result, with exit status 1\n", r.stderr)
        self.assertIn("muster: ended without knowing whether session %s was sealed "
                      "(--until-sealed needs a newer head)\n" % sid, r.stderr)

    def test_seal_says_the_head_is_older(self):
        sid = self.open_session()
        for args, stdin in ((["session", "seal", sid], ""), (["session", "put", sid, "--seal"],
                                                             "")):
            r = self.cli(*args, input=stdin, code=1)
            self.assertIn("muster: not_found: the head at %s has no endpoint POST "
                          "/v1/sessions/%s/seal: it is older than this client and cannot seal "
                          "sessions; upgrade the head" % (self.proxy.url, sid), r.stderr)
        self.assertIs(self.session(sid)["sealed"], False)


if __name__ == "__main__":
    unittest.main()
