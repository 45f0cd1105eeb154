"""A worker process that dies between its registration and telling its node agent its
worker id (docs/node.md, "Workers under supervision"; docs/api.md, `DELETE
/v1/workers/instance/{instance}`).

The agent gives each worker process the instance it registers with
(MUSTER_WORKER_INSTANCE: the agent's instance, the slot, the slot's start count), so a
crash report can name the worker when its id never came.  The window is made
deterministic with the test-only MUSTER_TEST_HOLD_REGISTERED=PATH: a worker that has
registered waits there, before it tells its agent its id, until PATH exists.  The head's
worker timeout is 300 s, so only the crash report can end the worker within the test.

Also: the endpoint itself (the worker an instance registered, none, bad input), a
registration that comes after the report of its instance (refused: no worker), and
`muster worker` started by hand (its own random instance, or MUSTER_WORKER_INSTANCE, and
one reported ended, which stops); a head older than the route, which answers the
report by instance 404 (OlderHeadTest): an answer, so the report is not sent again; and
an instance reported ended forgotten after the time it is kept, shortened with the
test-only MUSTER_TEST_ENDED_KEEP_MS (EndedInstanceForgottenTest).
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402
from test_api_common import ApiTestCase  # noqa: E402

WORKER_TIMEOUT = ["--worker-timeout-ms", "300000"]
# Well below the worker timeout: what ends the worker in time is the crash report.
PROMPT_S = 20
# An agent or worker reaching a head started again after a kill (test_node.py's).
AFTER_RESTART_S = 30
# The worker's line as it holds: its worker id and the instance it registered with.
HOLDING = (r"^worker 1 \(pid (\d+)\): muster worker: MUSTER_TEST_HOLD_REGISTERED: registered "
           r"as worker (\d+) \(instance ([A-Za-z0-9._-]+)\); waiting for ")
REPORTED = ("muster node: reported the crash of worker 1 (pid %d), which died before it told "
            "its worker id, by its instance %s")


class HeldWorkerCase(AgentsCase):
    """An agent whose one worker holds after its registration (MUSTER_TEST_HOLD_REGISTERED)."""
    head_args = WORKER_TIMEOUT

    def start_agent(self):
        self.gate = os.path.join(self.dir, "gate")  # never made: the worker holds until killed
        a = Agent(self.head, self.dir, "held", args=["--queue", "q", "--workers", "1"],
                  cmd=["sleep", "300"], env={"MUSTER_TEST_HOLD_REGISTERED": self.gate})
        self.agents.append(a)
        return a.start()

    def holding(self, agent, count=1):
        """(pid, worker id, instance) of the worker holding for the `count`th time."""
        def found():
            held = re.findall(HOLDING, agent.log(), re.M)
            return held[count - 1] if len(held) >= count else None
        pid, worker_id, instance = harness.wait_until(
            found, timeout=AFTER_RESTART_S,
            what=lambda: "worker hold #%d:\n%s" % (count, agent.log()))
        return int(pid), int(worker_id), instance

    def worker(self, worker_id):
        return self.head.request("GET", "/v1/workers/%d" % worker_id).json

    def wait_gone(self, worker_id, timeout=PROMPT_S):
        harness.wait_until(lambda: self.worker(worker_id)["state"] == "gone", timeout=timeout,
                           what=lambda: "worker %d ended on the head:\n%s\nthe head:\n%s" % (
                               worker_id, self.agents[-1].log(), self.head.log()))


class WorkerKilledBeforeItToldItsIdTest(HeldWorkerCase):

    def test_the_head_ends_it_at_once(self):
        # The agent knew no worker id and sent nothing: the head showed the worker active,
        # and would have for the whole worker timeout.
        a = self.start_agent()
        pid, worker_id, instance = self.holding(a)
        self.assertEqual(self.worker(worker_id)["state"], "active")
        # The instance is the agent's, for this slot and start, given in the environment.
        self.assertEqual(instance, "%s-1-1" % a.lock_info()["instance"])
        self.assertEqual(node_harness.environ_of(pid).get("MUSTER_WORKER_INSTANCE"), instance)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        self.wait_gone(worker_id)
        self.assertLess(time.monotonic() - killed, PROMPT_S)
        said = REPORTED % (pid, instance) + (": the head ended worker %d, which it had "
                                              "registered (0 leases lapsed)\n" % worker_id)
        harness.wait_until(lambda: said in a.log(), what=lambda: "the agent's line:\n" + a.log())
        self.assertIn("muster node: worker 1 (pid %d) crashed: killed by signal 9" % pid, a.log())
        self.assertNotIn("worker %d timed out" % worker_id, self.head.log())
        # Its successor in the slot gets an instance of its own, and registers anew.
        pid2, worker_id2, instance2 = self.holding(a, 2)
        self.assertEqual(instance2, "%s-1-2" % a.lock_info()["instance"])
        self.assertNotEqual(worker_id2, worker_id)
        self.assertEqual(self.worker(worker_id2)["state"], "active")
        # A stop signal ends the hold: the agent stops its held worker as any other.
        a.stop_checked()
        self.assertEqual(self.worker(worker_id2)["state"], "gone")


class WorkerKilledBeforeItToldItsNewIdTest(HeldWorkerCase):
    """The head forgot a worker (here a goodbye sent for it; a timeout does the same), which
    registered anew under another id and died before it told the agent that one: the report
    by its old id finds it gone, and goes on by its instance, which names the new one."""

    def test_the_head_ends_the_worker_it_registered_anew(self):
        r = self.head.request("PUT", "/v1/queues/q", {})
        self.assertEqual(r.status, 201, r)
        a = self.start_agent()
        pid, first_id, instance = self.holding(a)
        open(self.gate, "w").close()  # let it go on: it tells the agent, and leases
        harness.wait_until(lambda: re.search(r"^worker 1 \(pid %d\): muster worker: \S+ \(id %d\) "
                                             r"on queue q" % (pid, first_id), a.log(), re.M),
                           what=lambda: "the worker running:\n" + a.log())
        os.unlink(self.gate)
        r = self.head.request("DELETE", "/v1/workers/%d" % first_id)
        self.assertEqual(r.status, 200, r)
        # Its next lease request finds it gone: it registers again, and holds.
        held_pid, second_id, held_instance = self.holding(a, 2)
        self.assertEqual((held_pid, held_instance), (pid, instance))
        self.assertNotEqual(second_id, first_id)
        self.assertEqual(self.worker(second_id)["state"], "active")
        os.kill(pid, signal.SIGKILL)
        self.wait_gone(second_id)
        said = ("muster node: reported the crash of worker %d: the head had ended that id "
                "already, but the worker had registered again, as worker %d, and died before it "
                "told that id; the head ended worker %d by its instance %s (0 leases lapsed)\n"
                % (first_id, second_id, second_id, instance))
        harness.wait_until(lambda: said in a.log(), what=lambda: "the agent's line:\n" + a.log())
        self.assertIn("muster node: worker 1 (pid %d, worker id %d) crashed" % (pid, first_id),
                      a.log())
        self.assertNotIn("timed out", self.head.log())
        a.stop_checked()


class WorkerKilledBeforeItToldItsIdWhileHeadAwayTest(HeldWorkerCase):
    """The report by instance waits for the head like a report by id: kept, sent again,
    and answered once the head is back; one of a worker that never registered finds
    nothing to end."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.dir_prefix)
        port = harness.free_port()
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % port] + self.head_args)
        self.head.url = "http://127.0.0.1:%d" % port
        self.head.start()
        self.agents = []

    def test_the_report_waits_for_the_head(self):
        a = self.start_agent()
        pid, worker_id, instance = self.holding(a)
        self.head.kill()
        os.kill(pid, signal.SIGKILL)
        kept = ("muster node: reporting the crash of worker 1 (pid %d, instance %s, which died "
                "before it told its worker id): network: " % (pid, instance))
        harness.wait_until(lambda: kept in a.log(),
                           what=lambda: "the report to fail and be kept:\n" + a.log())
        # The slot's next worker waits for the head, unregistered: killed there, its
        # report finds nothing to end.
        waiting = r"^worker 1 \(pid (\d+)\): muster worker: waiting for the head at "
        found = harness.wait_until(lambda: re.search(waiting + r".*\((.*)\)$", a.log(), re.M),
                                   what=lambda: "the next worker waiting:\n" + a.log())
        pid2 = int(found.group(1))
        # Its URL is the agent's --join, which the user gave the agent, not the worker.
        self.assertEqual(found.group(2), "the URL is the node agent's --join", found.group(0))
        self.assertNotEqual(pid2, pid)
        instance2 = node_harness.environ_of(pid2).get("MUSTER_WORKER_INSTANCE")
        self.assertEqual(instance2, "%s-1-2" % a.lock_info()["instance"])
        os.kill(pid2, signal.SIGKILL)
        harness.wait_until(lambda: "(pid %d) crashed" % pid2 in a.log(),
                           what=lambda: "the agent to see it die:\n" + a.log())
        self.head.start()
        self.wait_gone(worker_id, timeout=AFTER_RESTART_S)
        ended = re.escape(REPORTED % (pid, instance)) + (
            r" after \d+ tries, \d+\.\d s after it died: the head ended worker %d, which it "
            r"had registered \(0 leases lapsed\)\n" % worker_id)
        nothing = re.escape(REPORTED % (pid2, instance2)) + (
            r" after 1 try, \d+\.\d s after it died: the head has no active worker of that "
            r"instance, so nothing to end \(it died before its registration reached the head, "
            r"or the head had ended it already\)\n")
        harness.wait_until(lambda: re.search(ended + nothing, a.log()),
                           what=lambda: "the agent to say both reports got through, in "
                           "order:\n" + a.log())
        self.assertNotIn("worker %d timed out" % worker_id, self.head.log())
        self.assertEqual(a.log().count("muster node: reporting the crash of"), 1, a.log())
        a.stop_checked()


def old_head_refusal(path):
    """What a head older than DELETE /v1/workers/instance/{instance} answers it: the
    route layer's 404 for a path no route matches (src/server/http_route.c), as
    (status, body) for a harness.RequestProxy decision.  `path` is without its query.
    OlderHeadTest checks it against the real head's answer to an unknown path."""
    return 404, {"error": {"code": "not_found",
                           "message": "no endpoint at %s; see docs/api.md" % path}}


def is_report_or_beat(method, path):
    """A crash report (by id or by instance) or a node heartbeat: what OlderHeadTest's
    proxy records, in order."""
    return (method == "DELETE" and path.startswith("/v1/workers/")) or (
        method == "POST" and re.fullmatch(r"/v1/nodes/[^/]+/heartbeat", path) is not None)


class OlderHeadTest(HeldWorkerCase):
    """The agent's crash report by instance sent to a head older than the route, which
    answers it 404 not_found (a RequestProxy answers that in the real head's place): an
    answer of the head's, so the report is done, not kept and sent again at every
    heartbeat; the worker is left to the head's worker timeout.  Heartbeats every 0.5 s
    (the node timeout's third), so that "not sent again" is seen in a second or two."""
    head_args = WORKER_TIMEOUT + ["--node-timeout-ms", "1500"]

    def setUp(self):
        super().setUp()

        def decide(n):
            method, path, _ = self.proxy.requests[n - 1]
            if path.startswith("/v1/workers/instance/"):
                return old_head_refusal(path)
            return "forward"
        self.proxy = harness.RequestProxy(self.head, is_report_or_beat, decide)
        self.addCleanup(self.proxy.close)

    def start_agent(self):
        """The held agent, joined to the head through the proxy."""
        behind = self.head
        self.head = types.SimpleNamespace(url=self.proxy.url, token=behind.token)
        try:
            return super().start_agent()
        finally:
            self.head = behind

    def seen(self):
        """The proxy's record: [(method, path)] in the order they came."""
        return [(m, p) for m, p, _ in list(self.proxy.requests)]

    def after(self, method, path, beats=2):
        """Waits for `beats` heartbeats after the first (method, path) the proxy saw (the
        background thread sends reports and heartbeats in turn, so by then the report's
        answer was taken), and returns what came from that request on."""
        def later():
            seen = self.seen()
            if (method, path) not in seen:
                return None
            since = seen[seen.index((method, path)):]
            return since if sum(p.endswith("/heartbeat") for _, p in since) >= beats else None
        return harness.wait_until(later, timeout=PROMPT_S,
                                  what=lambda: "%s %s and %d heartbeats after it: %r\n%s" % (
                                      method, path, beats, self.seen(),
                                      self.agents[-1].log()))

    def test_the_refusal_is_the_real_heads_own(self):
        # The fake answer is the one the head gives a path that no route matches.
        path = "/v1/workers/instance/x/y"
        r = self.head.request("DELETE", path + "?crashed=true")
        self.assertEqual((r.status, r.json), old_head_refusal(path), r)

    def test_a_report_by_instance_is_refused_once(self):
        a = self.start_agent()
        pid, worker_id, instance = self.holding(a)
        os.kill(pid, signal.SIGKILL)
        route = "/v1/workers/instance/" + instance
        since = self.after("DELETE", route)
        # Sent once: the refusal is an answer.  The agent says it, with the head's words.
        self.assertEqual([r for r in self.seen() if r[0] == "DELETE"], [("DELETE", route)])
        self.assertEqual(since[1:], [("POST", "/v1/nodes/held/heartbeat")] * (len(since) - 1))
        said = ("muster node: reporting the crash of worker 1 (pid %d, instance %s, which died "
                "before it told its worker id): not_found: no endpoint at %s; see docs/api.md "
                "(not sent again: the head refused it)\n" % (pid, instance, route))
        self.assertIn(said, a.log())
        self.assertNotIn("the report is kept", a.log())
        # Nothing ended the worker on the head: its worker timeout will.
        self.assertEqual(self.worker(worker_id)["state"], "active")
        # The agent goes on: the slot's next worker registers (and holds).
        _, worker_id2, instance2 = self.holding(a, 2)
        self.assertEqual(instance2, "%s-1-2" % a.lock_info()["instance"])
        self.assertEqual(self.worker(worker_id2)["state"], "active")
        a.stop_checked()

    def test_a_report_by_id_found_gone_ends_as_the_id_was_answered(self):
        """The report by id finds the id gone and goes on by instance, which the old head
        refuses: the answer stays the id's (worker_not_found: the head had ended it), said
        nowhere, as a report answered at once by id is not; no refusal is said."""
        r = self.head.request("PUT", "/v1/queues/q", {})
        self.assertEqual(r.status, 201, r)
        a = self.start_agent()
        pid, first_id, instance = self.holding(a)
        open(self.gate, "w").close()  # it tells the agent its id, and leases
        harness.wait_until(lambda: re.search(r"^worker 1 \(pid %d\): muster worker: \S+ "
                                             r"\(id %d\) on queue q" % (pid, first_id),
                                             a.log(), re.M),
                           what=lambda: "the worker running:\n" + a.log())
        os.unlink(self.gate)
        r = self.head.request("DELETE", "/v1/workers/%d" % first_id)  # not through the proxy
        self.assertEqual(r.status, 200, r)
        _, second_id, _ = self.holding(a, 2)
        os.kill(pid, signal.SIGKILL)
        route = "/v1/workers/instance/" + instance
        self.after("DELETE", route)
        self.assertEqual([r for r in self.seen() if r[0] == "DELETE"],
                         [("DELETE", "/v1/workers/%d" % first_id), ("DELETE", route)])
        self.assertIn("muster node: worker 1 (pid %d, worker id %d) crashed" % (pid, first_id),
                      a.log())
        self.assertNotIn("reporting the crash of", a.log())
        self.assertNotIn("reported the crash of", a.log())
        # The worker it registered anew is left to the head's worker timeout.
        self.assertEqual(self.worker(second_id)["state"], "active")
        a.stop_checked()


READ_TOKEN = "read-only-token-wi"


class EndByInstanceTest(ApiTestCase):
    """DELETE /v1/workers/instance/{instance} (docs/api.md)."""
    head_args = ("--sweep-ms", "50", "--worker-timeout-ms", "300000",
                 "--dashboard-token", READ_TOKEN)

    def lease_one(self, worker_id):
        self.expect("POST", "/v1/queues/%s/tasks" % self.q, {"tasks": [{"payload": 1}]},
                    status=201)
        [lease] = self.expect("POST", "/v1/queues/%s/lease" % self.q,
                              {"max": 1, "worker": worker_id})["leases"]
        return lease["task"]

    def test_crashed_ends_the_worker_the_instance_registered(self):
        self.create_queue(max_attempts=5, backoff_ms=0)
        other = self.register(instance="inst-other")["id"]
        w = self.register(instance="inst-a.1-1")["id"]
        task = self.lease_one(w)
        r = self.expect("DELETE", "/v1/workers/instance/inst-a.1-1?crashed=true")
        self.assertEqual(r, {"id": w, "released": 1, "instance": "inst-a.1-1"})
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w)["state"], "gone")
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % other)["state"], "active")
        t = self.expect("GET", "/v1/tasks/%d" % task)
        self.assertEqual((t["state"], t["error"], t["attempts"]), ("queued", "worker crashed", 1))
        # Sent again (its answer lost), or for a worker gone already: nothing to end.
        r = self.expect("DELETE", "/v1/workers/instance/inst-a.1-1?crashed=true")
        self.assertEqual(r, {"id": None, "released": 0, "instance": "inst-a.1-1"})
        # A copy of its registration sent again, coming after the report: no worker.
        self.assert_refused("inst-a.1-1", "crashed")
        # A worker that registers anew once its first is gone by other means (a goodbye
        # by id, a timeout) is ended by the call: the active one.
        first = self.register(instance="inst-b.1-1")["id"]
        self.expect("DELETE", "/v1/workers/%d" % first)
        again = self.register(instance="inst-b.1-1")["id"]
        self.assertNotEqual(again, first)
        r = self.expect("DELETE", "/v1/workers/instance/inst-b.1-1?crashed=true")
        self.assertEqual(r["id"], again)

    def assert_refused(self, instance, how):
        """A registration with `instance`, reported `how` ("crashed" or "gone"), is refused
        with the head's words and makes no worker."""
        before = [(w["id"], w["state"]) for w in self.expect("GET", "/v1/workers")["workers"]]
        r = self.expect_error("POST", "/v1/workers", {"instance": instance, "queues": [self.q]},
                              409, "invalid_state")
        said = re.escape("instance '%s' was reported %s " % (instance, how)) + r"\d+\.\d" + \
            re.escape(" s ago (DELETE /v1/workers/instance/%s%s): no worker is registered under "
                      "an instance reported ended; a live process registers with an instance "
                      "of its own" % (instance, "?crashed=true" if how == "crashed" else ""))
        self.assertRegex(r.json["error"]["message"], "^" + said + "$")
        after = [(w["id"], w["state"]) for w in self.expect("GET", "/v1/workers")["workers"]]
        self.assertEqual(after, before)

    def test_a_registration_after_the_crash_report_makes_no_worker(self):
        # The worker process died with its registration on its way (forwarded by its
        # agent on another connection), and the agent's crash report got there first.
        r = self.expect("DELETE", "/v1/workers/instance/inst-late.1-1?crashed=true")
        self.assertEqual(r, {"id": None, "released": 0, "instance": "inst-late.1-1"})
        self.assert_refused("inst-late.1-1", "crashed")
        self.assertFalse([w for w in self.expect("GET", "/v1/workers")["workers"]
                          if w["queues"] == [self.q]])
        # Sent again, the same; the head says it in its log.
        self.assert_refused("inst-late.1-1", "crashed")
        self.assertRegex(self.head.log(), r"INFO  worker registration with instance "
                         r"inst-late\.1-1 refused: it was reported crashed \d+\.\d s before")
        # Other instances register as ever.
        self.register(instance="inst-late.1-2", queues=[self.q])

    def test_no_worker_registered_with_it(self):
        r = self.expect("DELETE", "/v1/workers/instance/never-registered?crashed=true")
        self.assertEqual(r, {"id": None, "released": 0, "instance": "never-registered"})

    def test_without_crashed_it_is_a_goodbye(self):
        self.create_queue(max_attempts=5, backoff_ms=0)
        w = self.register(instance="inst-bye")["id"]
        task = self.lease_one(w)
        r = self.expect("DELETE", "/v1/workers/instance/inst-bye")
        self.assertEqual(r, {"id": w, "released": 1, "instance": "inst-bye"})
        t = self.expect("GET", "/v1/tasks/%d" % task)
        self.assertEqual((t["state"], t["attempts"]), ("queued", 0))
        # Remembered as a crash report is.
        self.assert_refused("inst-bye", "gone")

    def test_bad_input(self):
        w = self.register(instance="inst-kept")["id"]
        for path, words in (
                ("/v1/workers/instance/", "instance '' is invalid: use 1 to 128 characters of "
                                          "letters, digits, '.', '_' and '-'"),
                ("/v1/workers/instance/a%2Fb", "instance 'a/b' is invalid: use 1 to 128"),
                ("/v1/workers/instance/a%20b?crashed=true", "instance 'a b' is invalid"),
                ("/v1/workers/instance/" + "x" * 129, "instance '%s' is invalid" % ("x" * 129)),
                ("/v1/workers/instance/inst-kept?crashed=yes",
                 "query crashed: 'yes' is not true or false")):
            with self.subTest(path=path):
                r = self.expect_error("DELETE", path, None, 400, "invalid_argument")
                self.assertIn(words, r.json["error"]["message"])
        r = self.expect_error("DELETE", "/v1/workers/instance/inst-kept", {"id": w}, 400,
                              "invalid_argument")
        # The admin token only, as for the goodbye by id.
        self.expect_error("DELETE", "/v1/workers/instance/inst-kept", None, 401, "unauthorized",
                          token=None)
        self.expect_error("DELETE", "/v1/workers/instance/inst-kept", None, 403, "forbidden",
                          token=READ_TOKEN)
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % w)["state"], "active")


# How long EndedInstanceForgottenTest's head remembers an instance reported ended
# (MUSTER_TEST_ENDED_KEEP_MS; 10 minutes without it): long enough that the refusal right
# after the report is never late, short enough for a test.
KEEP_MS = 3000


class EndedInstanceForgottenTest(unittest.TestCase):
    """An instance reported ended is remembered for a while, then forgotten (docs/api.md,
    `DELETE /v1/workers/instance/{instance}`; docs/design-notes.md): the reaper's timer,
    which looks a tenth of that time apart, deletes its row, and a registration with it
    makes a worker again.  The head's debug line says when the reaper deleted it."""

    def setUp(self):
        self.head = harness.Head(WORKER_TIMEOUT + ["--log-level", "debug"],
                                 env={"MUSTER_TEST_ENDED_KEEP_MS": str(KEEP_MS)}).start()
        self.addCleanup(self.head.cleanup)

    def register(self, instance):
        return self.head.request("POST", "/v1/workers", {"instance": instance})

    def ended_rows(self):
        """The rows of ended_instances, read once the head stopped (it holds the store)."""
        self.assertEqual(self.head.stop(), 0, self.head.log())
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.head.data_dir, "muster.db"),
                             uri=True)
        try:
            return db.execute("SELECT instance FROM ended_instances").fetchall()
        finally:
            db.close()

    def test_an_instance_is_forgotten_after_the_time_it_is_kept(self):
        self.assertIn("MUSTER_TEST_ENDED_KEEP_MS=%d: instances reported ended are remembered "
                      "%d ms (for tests only)" % (KEEP_MS, KEEP_MS), self.head.log())
        r = self.register("tomb-1-1")
        self.assertEqual(r.status, 201, r)
        first = r.json["id"]
        r = self.head.request("DELETE", "/v1/workers/instance/tomb-1-1?crashed=true")
        reported = time.monotonic()
        self.assertEqual((r.status, r.json["id"]), (200, first), r)
        r = self.register("tomb-1-1")
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertLess(time.monotonic() - reported, KEEP_MS / 1000, "too slow to tell")
        forgot = "forgot 1 worker instances reported ended over %.1f s ago" % (KEEP_MS / 1000)
        harness.wait_until(lambda: forgot in self.head.log(), timeout=KEEP_MS / 1000 + 10,
                           what=lambda: "the reaper to forget it:\n" + self.head.log())
        self.assertGreaterEqual(time.monotonic() - reported, KEEP_MS / 1000)
        r = self.register("tomb-1-1")
        self.assertEqual(r.status, 201, r)
        self.assertNotEqual(r.json["id"], first)
        again = self.head.request("GET", "/v1/workers/%d" % r.json["id"]).json
        self.assertEqual(again["state"], "active")
        self.assertEqual(self.ended_rows(), [])

    def test_a_bad_value_is_said_and_ignored(self):
        self.head.stop()
        self.head.env["MUSTER_TEST_ENDED_KEEP_MS"] = "600001"
        self.head.start()
        self.assertIn("MUSTER_TEST_ENDED_KEEP_MS=600001 is not 1 to 600000; instances reported "
                      "ended are remembered 600000 ms", self.head.log())


class HandStartedWorkerTest(unittest.TestCase):
    """`muster worker` without an agent: a random instance as before, or the one
    MUSTER_WORKER_INSTANCE gives, which its commands do not inherit."""

    def setUp(self):
        self.head = harness.Head(WORKER_TIMEOUT).start()
        self.addCleanup(self.head.cleanup)
        r = self.head.request("PUT", "/v1/queues/hand", {})
        self.assertEqual(r.status, 201, r)

    def worker(self, cmd, instance=None, stderr=subprocess.DEVNULL):
        """`muster worker` on queue hand running `cmd`, given MUSTER_WORKER_INSTANCE when
        `instance` is not None (never the test's own)."""
        env = {k: v for k, v in os.environ.items() if k != "MUSTER_WORKER_INSTANCE"}
        env.update(MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        if instance is not None:
            env["MUSTER_WORKER_INSTANCE"] = instance
        proc = subprocess.Popen([harness.MUSTER_BIN, "worker", "--queue", "hand", "--"] + cmd,
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env, text=True)
        self.addCleanup(harness.stop_process, proc)
        return proc

    def active(self):
        return [w for w in self.head.request("GET", "/v1/workers").json["workers"]
                if w["state"] == "active"]

    def run_task(self):
        r = self.head.request("POST", "/v1/queues/hand/tasks", {"tasks": [{"payload": 1}]})
        tid = r.json["tasks"][0]["id"]
        return harness.wait_until(
            lambda: (lambda t: t if t["state"] == "done" else None)(
                self.head.request("GET", "/v1/tasks/%d" % tid).json),
            timeout=20, what="the task done")["result"]

    def test_the_instance_from_the_environment(self):
        self.worker(["sh", "-c", 'printf "%s" "${MUSTER_WORKER_INSTANCE-unset}"'], "by-hand.7")
        [w] = harness.wait_until(self.active, timeout=20, what="the worker registered")
        self.assertEqual(self.run_task(), "unset")  # not passed on to its commands
        r = self.head.request("DELETE", "/v1/workers/instance/by-hand.7?crashed=true")
        self.assertEqual((r.status, r.json["id"]), (200, w["id"]), r)

    def test_an_instance_reported_ended_stops_it(self):
        """A live process given an instance reported ended (against its agent's word, or
        by hand) is told so and stops, rather than working on unseen."""
        r = self.head.request("DELETE", "/v1/workers/instance/by-hand.8?crashed=true")
        self.assertEqual((r.status, r.json["id"]), (200, None), r)
        proc = self.worker(["cat"], "by-hand.8", stderr=subprocess.PIPE)
        err = proc.communicate(timeout=20)[1]
        self.assertEqual(proc.returncode, 1, err)
        self.assertRegex(err, r"muster worker: invalid_state: instance 'by-hand\.8' was reported "
                              r"crashed \d+\.\d s ago \(DELETE /v1/workers/instance/by-hand\.8"
                              r"\?crashed=true\): no worker is registered under an instance "
                              r"reported ended; a live process registers with an instance of "
                              r"its own\n")
        self.assertEqual(self.head.request("GET", "/v1/workers").json["workers"], [])

    def test_a_random_instance_without_it(self):
        proc = self.worker(["cat"])
        harness.wait_until(self.active, timeout=20, what="the worker registered")
        self.assertEqual(self.run_task(), "1")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(20), 0)

    def test_a_bad_instance_is_refused(self):
        for bad in ("a/b", "x" * 33, ".."):
            with self.subTest(instance=bad):
                proc = self.worker(["cat"], bad, stderr=subprocess.PIPE)
                err = proc.communicate(timeout=20)[1]
                self.assertEqual(proc.returncode, 2, err)
                self.assertIn("muster: MUSTER_WORKER_INSTANCE '%s': use 1 to 32 characters of "
                              "letters, digits, '.', '_' and '-', other than '.' and '..' (a "
                              "node agent sets it for the workers it starts; unset, a worker "
                              "makes a random one)" % bad, err)
                self.assertEqual(self.active(), [])

if __name__ == "__main__":
    unittest.main()
