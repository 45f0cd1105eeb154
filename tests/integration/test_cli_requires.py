"""`--requires SCOPE/NAME@N` of `muster put`, `muster session put` and `muster map`
(docs/cli.md "put", docs/shared-data.md "Tasks that require shared data").

Tasks put with it come back in a lease with exactly those levels, in the order given;
a value without @N carries the level that was the newest when the command ran (asked
with a HEAD), not a later one.  A node agent's `muster worker` runs such a task with
MUSTER_SHARED_<NAME> naming the level's file (map, through a pool).  Every bad value
fails the command before anything is put (the queue, the session and the list of
sessions are counted), naming the option and the rule; a blob without a level stops
it too.  `muster session put` alone takes NAME@N (or NAME) without SCOPE/, for a blob of
its session; `muster put` and `muster map` refuse it, saying how to write it.  A session
put sent again with the same `requires` (a pool retrying a batch
whose reply was lost) is answered as a repeat, not refused.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

MUSTER = harness.MUSTER_BIN
OCTET = "application/octet-stream"


def run_cli(head, args, stdin=None):
    return subprocess.run([MUSTER] + list(args), input=stdin, capture_output=True, text=True,
                          env=harness.cli_env(head), timeout=60)


def level(scope, name, number):
    return {"scope": scope, "name": name, "level": number}


class RequiresCliTest(harness.CliChecks, unittest.TestCase):
    head = None

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head().start()
        for number, data in ((1, b"w-one"), (2, b"w-two")):
            cls.upload("models", "weights", number, data)
        cls.upload("models", "cfg", 1, b"c")

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    @classmethod
    def upload(cls, scope, name, number, data):
        r = cls.head.request("PUT", "/v1/shared/%s/%s?level=%d" % (scope, name, number),
                             raw=data, content_type=OCTET)
        assert r.status == 201, r

    def muster(self, *args, stdin=None):
        return run_cli(self.head, args, stdin)

    def queue(self, name):
        r = self.head.request("PUT", "/v1/queues/" + name, {})
        self.assertIn(r.status, (200, 201), r)

    def session(self, queue):
        r = self.head.request("POST", "/v1/sessions", {"queue": queue})
        self.assertEqual(r.status, 201, r)
        return r.json["id"]

    def lease_all(self, queue, count):
        r = self.head.request("POST", "/v1/queues/%s/lease" % queue, {"max": 100})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(r.json["leases"]), count, r.json)
        return r.json["leases"]

    def queued(self, queue):
        r = self.head.request("GET", "/v1/queues/" + queue)
        self.assertEqual(r.status, 200, r)
        return sum(r.json["counts"].values())

    # ---- what the tasks carry ---------------------------------------------------------

    def test_put_tasks_carry_exactly_the_levels_given(self):
        self.queue("rq-put")
        out = self.ok("put", "--queue", "rq-put", "--requires", "models/weights@1",
                      "--requires=models/cfg@1", "a", "b")
        self.assertEqual(len(out.split()), 2)
        self.ok("put", "--queue", "rq-put", "plain")
        leases = {x["payload"]: x for x in self.lease_all("rq-put", 3)}
        want = [level("models", "weights", 1), level("models", "cfg", 1)]
        self.assertEqual(leases["a"]["requires"], want)
        self.assertEqual(leases["b"]["requires"], want)
        self.assertNotIn("requires", leases["plain"])

    def test_muster_lease_prints_what_a_task_requires(self):
        # A shell worker reads the levels to fetch from `muster lease`'s line; a task
        # that requires nothing has no "requires" key, as in the head's reply.
        self.queue("rq-lease")
        self.ok("put", "--queue", "rq-lease", "--requires", "models/weights@2",
                "--requires", "models/cfg@1", "needs")
        self.ok("put", "--queue", "rq-lease", "plain")
        lines = self.ok("lease", "--queue", "rq-lease", "--max", "2").splitlines()
        leases = [json.loads(line) for line in lines]
        self.assertEqual([x["payload"] for x in leases], ["needs", "plain"])
        self.assertEqual(leases[0]["requires"],
                         [level("models", "weights", 2), level("models", "cfg", 1)])
        self.assertNotIn("requires", leases[1])
        self.assertEqual(list(leases[1]), ["task", "token", "payload", "attempt",
                                           "deadline_ms", "parent", "session", "index"])

    def test_no_level_is_the_newest_when_the_command_runs(self):
        self.queue("rq-newest")
        self.upload("rq", "table", 1, b"t1")
        self.ok("put", "--queue", "rq-newest", "--requires", "rq/table", "first")
        self.upload("rq", "table", 2, b"t2")
        self.ok("put", "--queue", "rq-newest", "--requires", "rq/table", "second")
        self.upload("rq", "table", 3, b"t3")  # after both puts: changes neither
        leases = {x["payload"]: x["requires"] for x in self.lease_all("rq-newest", 2)}
        self.assertEqual(leases, {"first": [level("rq", "table", 1)],
                                  "second": [level("rq", "table", 2)]})

    def test_session_put_takes_a_name_alone_as_a_blob_of_its_session(self):
        # As a Python Pool's requires=[(name, level)]: the scope is the session.
        self.queue("rq-own")
        sid = self.session("rq-own")
        for number in (1, 2):
            self.upload(sid, "table", number, b"t%d" % number)
        self.ok("session", "put", sid, "--requires", "table@1", "--requires", "models/weights",
                stdin="one\n")
        self.ok("session", "put", sid, "--requires", "table", stdin="newest\n")
        leases = {x["payload"]: x["requires"] for x in self.lease_all("rq-own", 2)}
        self.assertEqual(leases, {"one": [level(sid, "table", 1), level("models", "weights", 2)],
                                  "newest": [level(sid, "table", 2)]})
        # The same blob named both ways is one blob, named twice.
        r = self.muster("session", "put", sid, "--requires", "table@1", "--requires",
                        sid + "/table@2", stdin="x\n")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--requires '%s/table@2': %s/table is required already ('table@1')"
                      % (sid, sid), r.stderr)
        # A name alone without a level asks for the session's blob, and says which.
        r = self.muster("session", "put", sid, "--requires", "nothing", stdin="x\n")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--requires %s/nothing: shared data not found" % sid, r.stderr)
        self.assertIn("upload one first ('muster shared put %s nothing FILE')" % sid, r.stderr)
        # The session argument must be able to be a scope.
        r = self.muster("session", "put", "no such", "--requires", "table@1", stdin="x\n")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("muster: --requires 'table@1': without SCOPE/ the scope is the session, "
                      "and 'no such' is not a session id: use 1 to 128 characters", r.stderr)
        self.assertEqual(self.queued("rq-own"), 2)

    def test_put_and_map_refuse_a_name_alone_saying_how_to_write_it(self):
        self.queue("rq-noscope")
        for command, stdin in ((["put", "--queue", "rq-noscope", "a"], None),
                               (["map", "--queue", "rq-noscope", "--quiet"], "a\n")):
            for value in ("weights@2", "weights"):
                r = self.muster(*(command + ["--requires", value]), stdin=stdin)
                with self.subTest(command=command[0], value=value):
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("muster: --requires '%s': expected SCOPE/NAME@N "
                                  "(models/weights@2), or SCOPE/NAME for the newest level; only "
                                  "`muster session put` takes NAME@N or NAME without SCOPE/, for "
                                  "a blob of the session it puts into" % value, r.stderr)
                    self.assertEqual(r.stdout, "")
        self.assertEqual(self.queued("rq-noscope"), 0)
        sessions = self.head.request("GET", "/v1/sessions").json["sessions"]
        self.assertEqual([x for x in sessions if x["queue"] == "rq-noscope"], [])

    def test_session_put_tasks_carry_the_levels(self):
        self.queue("rq-session")
        sid = self.session("rq-session")
        self.upload(sid, "table", 1, b"{}")
        out = self.ok("session", "put", sid, "--requires", sid + "/table@1",
                      "--requires", "models/weights", stdin="x\ny\n")
        self.assertEqual([line.split("\t")[0] for line in out.splitlines()], ["0", "1"])
        want = [level(sid, "table", 1), level("models", "weights", 2)]
        for lease in self.lease_all("rq-session", 2):
            self.assertEqual((lease["session"], lease["requires"]), (sid, want), lease)

    # ---- bad input: nothing is put -------------------------------------------------------

    BAD = [
        (["models/weights@0"], "--requires 'models/weights@0': level 0: levels count from 1"),
        (["models/weights@-2"], "--requires 'models/weights@-2': level '-2': expected a whole "
                                "number, 1 or more"),
        (["models/weights@"], "level '': expected a whole number"),
        (["models/weights@two"], "level 'two': expected a whole number"),
        (["models/weights@1@2"], "level '1@2': expected a whole number"),
        (["mo dels/weights@1"], "--requires 'mo dels/weights@1': scope 'mo dels': use 1 to 128 "
                                "characters of letters, digits, '.', '_' and '-'"),
        (["models/we/ights@1"], "name 'we/ights': use 1 to 128 characters"),
        (["models/" + "w" * 129 + "@1"], "use 1 to 128 characters"),
        (["models/" + "w" * 300], "too long"),
        (["models/weights@1", "models/cfg@1", "models/weights@2"],
         "--requires 'models/weights@2': models/weights is required already "
         "('models/weights@1'): a task requires one level of each blob"),
        (["models/w%d@1" % i for i in range(17)],
         "--requires: given 17 times; a task requires at most 16 levels of shared data"),
    ]
    # A name alone, which only `session put` takes, follows the same rules there.
    SESSION_BAD = [
        (["we ights@1"], "--requires 'we ights@1': name 'we ights': use 1 to 128 characters"),
        (["weights@0"], "--requires 'weights@0': level 0: levels count from 1"),
        (["weights@x"], "--requires 'weights@x': level 'x': expected a whole number"),
    ]

    def check_refused(self, command, stdin, counted, bad=BAD):
        """Runs `command` with each bad --requires list; each fails with status 2 and its
        message, and `counted()` (what a put would have changed) stays as it was."""
        before = counted()
        for values, message in bad:
            args = [word for value in values for word in ("--requires", value)]
            r = self.muster(*(command + args), stdin=stdin)
            with self.subTest(command=command[0], values=values[-1][:40]):
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(message, r.stderr)
                self.assertEqual(r.stdout, "")
        self.assertEqual(counted(), before)

    def test_put_refuses_bad_values_with_nothing_put(self):
        self.queue("rq-bad")
        self.check_refused(["put", "--queue", "rq-bad", "a"], None,
                           lambda: self.queued("rq-bad"))
        self.check_refused(["put", "--queue", "rq-bad"], "a\nb\n", lambda: self.queued("rq-bad"))
        # Sixteen values are allowed: the limit is the head's.
        ok = ["models/w%d@1" % i for i in range(16)]
        self.ok("put", "--queue", "rq-bad", *[w for v in ok for w in ("--requires", v)], "a")
        self.assertEqual(len(self.lease_all("rq-bad", 1)[0]["requires"]), 16)

    def test_session_put_refuses_bad_values_with_nothing_put(self):
        self.queue("rq-bad-session")
        sid = self.session("rq-bad-session")

        def total():
            r = self.head.request("GET", "/v1/sessions/" + sid)
            self.assertEqual(r.status, 200, r)
            return (r.json["counts"]["total"], self.queued("rq-bad-session"))
        self.check_refused(["session", "put", sid], "a\nb\n", total,
                           self.BAD + self.SESSION_BAD)

    def test_map_refuses_bad_values_before_any_session(self):
        def made():
            sessions = self.head.request("GET", "/v1/sessions").json["sessions"]
            queue = self.head.request("GET", "/v1/queues/rq-bad-map").status
            return (len(sessions), queue)
        self.assertEqual(made()[1], 404)
        self.check_refused(["map", "--queue", "rq-bad-map", "--quiet"], "a\n", made)

    def test_a_blob_without_a_level_stops_the_command(self):
        self.queue("rq-missing")
        sid = self.session("rq-missing")
        for command, stdin in ((["put", "--queue", "rq-missing", "a"], None),
                               (["session", "put", sid], "a\n"),
                               (["map", "--queue", "rq-missing", "--quiet"], "a\n")):
            r = self.muster(*(command + ["--requires", "models/weights@2",
                                         "--requires", "models/nothing"]), stdin=stdin)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("muster: shared_not_found: --requires models/nothing: shared data not "
                          "found: 'nothing' in scope 'models' ('nothing' was never set, or was "
                          "deleted)\n", r.stderr)
            self.assertIn("nothing was put", r.stderr)
        self.assertEqual(self.queued("rq-missing"), 0)
        sessions = self.head.request("GET", "/v1/sessions").json["sessions"]
        self.assertEqual([s["id"] for s in sessions if s["queue"] == "rq-missing"], [sid])

    def test_a_head_that_refuses_the_head_request_is_said(self):
        self.queue("rq-token")
        r = subprocess.run([MUSTER, "put", "--queue", "rq-token", "--requires", "models/weights",
                            "a"], capture_output=True, text=True, timeout=60,
                           env=dict(harness.cli_env(self.head), MUSTER_TOKEN="wrong-token"))
        self.assertEqual(r.returncode, 1, r.stderr)
        # In the head's words (its reply's headers carry them: a HEAD's has no body).
        self.assertIn("muster: unauthorized: --requires models/weights: the token sent is not "
                      "valid for this head", r.stderr)
        self.assertEqual(self.queued("rq-token"), 0)

    def test_the_head_request_fails_with_the_clis_usual_advice(self):
        # The HEAD's failure was printed apart from every other request's, without the
        # advice they get: where the token was looked for when none was given, and
        # whether a head runs at the URL when nothing answered there.
        self.queue("rq-advice")
        nowhere = tempfile.mkdtemp(prefix="muster-rq-")  # no ./muster-data with a token
        self.addCleanup(shutil.rmtree, nowhere, True)
        r = subprocess.run([MUSTER, "put", "--queue", "rq-advice", "--requires", "models/weights",
                            "a"], capture_output=True, text=True, timeout=60, cwd=nowhere,
                           env=harness.cli_env(self.head, token=False))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("muster: unauthorized: the head needs a token, and no token was given",
                      r.stderr)
        self.assertTrue(r.stderr.endswith("\nmuster: nothing was put: the newest level of "
                                          "models/weights could not be asked\n"), r.stderr)
        port = harness.free_port()
        for command, stdin in ((["put", "--queue", "q", "a"], None),
                               (["session", "put", "s-0123456789abcdef"], "a\n"),
                               (["map", "--queue", "q", "--quiet"], "a\n")):
            env = dict(harness.cli_env(self.head), MUSTER_URL="http://127.0.0.1:%d" % port)
            r = subprocess.run([MUSTER] + command + ["--requires", "models/weights"], input=stdin,
                               capture_output=True, text=True, timeout=60, env=env)
            with self.subTest(command=command[0]):
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertRegex(r.stderr, r"\Amuster: network: --requires models/weights: HEAD "
                                 r"http://127\.0\.0\.1:%d/v1/shared/models/weights: could not "
                                 r"connect to 127\.0\.0\.1 port %d: Connection refused\n"
                                 r"muster: is a muster head or node agent running there\? The "
                                 r"URL is the one MUSTER_URL gives: start it, or give the URL "
                                 r"of a running one\n"
                                 r"muster: nothing was put: the newest level of models/weights "
                                 r"could not be asked\n\Z" % (port, port))

    # ---- a session put sent again ----------------------------------------------------

    def test_a_session_put_sent_again_with_its_requires_is_a_repeat(self):
        # A pool (muster map) retries a batch whose reply was lost; with `requires` the
        # head refused the retry as an index in use, which failed map.
        self.queue("rq-repeat")
        sid = self.session("rq-repeat")
        need = [level("models", "weights", 1)]
        body = {"tasks": [{"payload": i, "index": i, "requires": need} for i in range(3)]}
        first = self.head.request("POST", "/v1/sessions/%s/tasks" % sid, body)
        self.assertEqual(first.status, 201, first)
        again = self.head.request("POST", "/v1/sessions/%s/tasks" % sid, body)
        self.assertEqual(again.status, 200, again)
        self.assertTrue(again.json.get("repeated"), again.json)
        self.assertEqual(again.json["tasks"], first.json["tasks"])
        # Other levels at those indexes are another producer's batch: refused.
        body["tasks"][0]["requires"] = [level("models", "weights", 2)]
        other = self.head.request("POST", "/v1/sessions/%s/tasks" % sid, body)
        self.assertEqual((other.status, other.error_code), (409, "invalid_state"), other)
        body["tasks"][0].pop("requires")
        other = self.head.request("POST", "/v1/sessions/%s/tasks" % sid, body)
        self.assertEqual((other.status, other.error_code), (409, "invalid_state"), other)
        self.assertEqual(self.queued("rq-repeat"), 3)


class RequiresGoneTest(AgentsCase):
    """A blob without a level says why, asked of the head or through a node agent: the
    HEAD that asks for the newest level gets the head's reason in its reply's headers
    (X-Muster-Error, docs/api.md "Errors"), which the agent passes on."""
    dir_prefix = "muster-cli-requires-gone-"
    head_args = ["--sweep-ms", "50"]

    def put_blob(self, scope, name, query=""):
        r = self.head.request("PUT", "/v1/shared/%s/%s%s" % (scope, name, query), raw=b"x",
                              content_type=OCTET)
        self.assertEqual(r.status, 201, r)

    def test_the_reason_reaches_the_cli(self):
        agent = Agent(self.head, self.dir, "why",
                      args=["--cache-dir", os.path.join(self.dir, "cache")])
        self.agents.append(agent)
        agent.start()
        self.assertEqual(self.head.request("PUT", "/v1/queues/rq-why", {}).status, 201)
        self.put_blob("models", "short", "?ttl_ms=200")
        harness.wait_until(lambda: self.head.request("HEAD", "/v1/shared/models/short").status
                           == 404, what="models/short expired")
        self.put_blob("models", "deleted")
        self.assertEqual(self.head.request("DELETE", "/v1/shared/models/deleted").status, 200)
        sid = self.head.request("POST", "/v1/sessions", {"queue": "rq-why"}).json["id"]
        self.put_blob(sid, "table")
        self.assertEqual(self.head.request("DELETE", "/v1/sessions/" + sid).status, 200)
        want = {
            "models/short": "shared data not found: 'short' in scope 'models' ('short' "
                            "expired: it was not updated within its ttl_ms of 200)",
            "models/deleted": "shared data not found: 'deleted' in scope 'models' ('deleted' "
                              "was never set, or was deleted)",
            sid + "/table": "shared data not found for session %s: 'table' (session '%s' was "
                            "closed: by its client; its shared data went with it)" % (sid, sid),
        }
        for url in (self.head.url, agent.url):
            for value, why in want.items():
                with self.subTest(url=url, requires=value):
                    r = subprocess.run([MUSTER, "put", "--queue", "rq-why", "--requires", value,
                                        "a"], capture_output=True, text=True, timeout=60,
                                       env=dict(harness.cli_env(self.head), MUSTER_URL=url))
                    self.assertEqual(r.returncode, 1, r.stderr)
                    self.assertTrue(r.stderr.startswith(
                        "muster: shared_not_found: --requires %s: %s\n" % (value, why)),
                        r.stderr)
        r = self.head.request("GET", "/v1/queues/rq-why")
        self.assertEqual(r.json["counts"]["queued"], 0, r.json)


# Prints the payload, then the content of the required "params" level.
COMMAND = ["sh", "-c", 'printf "%s:%s" "$(cat)" "$(cat "$MUSTER_SHARED_PARAMS")"']


class RequiresWorkersTest(AgentsCase):
    dir_prefix = "muster-cli-requires-"

    def test_map_tasks_run_with_their_level_as_a_file(self):
        a = Agent(self.head, self.dir, "req", cmd=COMMAND,
                  args=["--queue", "rq-map", "--workers", "2",
                        "--cache-dir", os.path.join(self.dir, "cache")])
        self.agents.append(a)
        a.start()
        for number in (1, 2):
            r = self.head.request("PUT", "/v1/shared/cfg/params?level=%d" % number,
                                  raw=b"params-%d" % number, content_type=OCTET)
            self.assertEqual(r.status, 201, r)
        keys = ["k%d" % i for i in range(6)]
        stdin = "".join(k + "\n" for k in keys)
        for value, want in (("cfg/params@1", "params-1"), ("cfg/params", "params-2")):
            r = run_cli(self.head, ["map", "--queue", "rq-map", "--ordered", "--quiet",
                                    "--requires", value], stdin)
            self.assertEqual(r.returncode, 0, r.stderr + a.log())
            self.assertEqual(r.stdout.splitlines(), ["%s:%s" % (k, want) for k in keys])
        s = a.request("GET", "/v1/node/cache").json
        self.assertEqual(s["upstream_fetches"], 2, s)  # each level once, through the cache

    def test_put_tasks_run_with_their_level_as_a_file(self):
        r = self.head.request("PUT", "/v1/queues/rq-run", {})
        self.assertEqual(r.status, 201, r)
        r = self.head.request("PUT", "/v1/shared/cfg/params?level=1", raw=b"from-put",
                              content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        ids = run_cli(self.head, ["put", "--queue", "rq-run", "--requires", "cfg/params@1",
                                  "one", "two"])
        self.assertEqual(ids.returncode, 0, ids.stderr)
        a = Agent(self.head, self.dir, "put", cmd=COMMAND,
                  args=["--queue", "rq-run", "--cache-dir", os.path.join(self.dir, "cache2")])
        self.agents.append(a)
        a.start()

        def results():
            tasks = [self.head.request("GET", "/v1/tasks/" + i).json for i in ids.stdout.split()]
            return tasks if all(t["state"] == "done" for t in tasks) else None
        tasks = harness.wait_until(results, timeout=60, what="both tasks done:\n" + a.log())
        self.assertEqual([t["result"] for t in tasks], ["one:from-put", "two:from-put"])


if __name__ == "__main__":
    unittest.main()
