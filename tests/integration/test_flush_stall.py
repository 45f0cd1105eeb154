"""A disk that holds a flush of the write-ahead log (a network disk's hiccup) counts as a
stall of the head.

With --sync full the WAL is flushed on a helper thread, and the event loop goes on reading
and executing requests while the disk works; but no reply that waits for a flush can
leave.  A node agent or worker that registered while the disk held a flush had its
registration committed and not answered: it could not heartbeat, not knowing it was
registered, and once the flush outlasted the node or worker timeout the sweep ended it.
Now a flush in flight for over HEAD_STALL_MS (1 s) counts as a stall, as a loop that
did not run does (test_fault_walk_stall.py): while it lasts the sweep ends nobody for
silence, its end gives every worker, node and session its whole timeout, task leases
keep their deadlines, and the log says once how long the disk held the flush
(docs/operations.md, "Restarts"; design-notes "A flush the disk holds is a stall").

The head takes the test-only MUSTER_TEST_FLUSH_HOLD_FILE=PATH: each flush of its helper
thread waits, before its fdatasync, while PATH exists, so a test holds exactly the
flush that covers a registration, for as long as it chooses; MUSTER_FLUSH_THREAD_MIN=1
sends every group's flush to that thread (a lone client's are flushed on the loop
otherwise, which would stall the loop instead).
"""
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402
from node_harness import Agent  # noqa: E402

TIMEOUT_MS = 1500  # the head's node and worker timeouts
LONG_HOLD_S = 3.0  # twice those timeouts, and under the agent's 5 s request timeout
SHORT_HOLD_S = 0.4  # well under HEAD_STALL_MS
HELD = "a flush of the write-ahead log waits while"  # the thread's line, once per flush held
STALL = re.compile(r"WARN  the disk held a flush of the write-ahead log for (\d+\.\d) s")


class Registration(threading.Thread):
    """A Python worker registering on its own connection, timed: its reply waits for the
    flush that covers it."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client, self.reply, self.error, self.took = client, None, None, None
        self.start()

    def run(self):
        started = time.monotonic()
        try:
            self.reply = self.client.register_worker(nickname="held")
        except Exception as e:  # noqa: BLE001 (reported by result)
            self.error = e
        self.took = time.monotonic() - started

    def result(self, timeout=20):
        self.join(timeout)
        if self.is_alive() or self.error is not None:
            raise AssertionError("the registration: %s" % (self.error or "no answer"))
        return self.reply["id"]


class FlushStallCase(unittest.TestCase):
    """A head with short node and worker timeouts whose flushes wait while self.hold
    exists."""
    hold_env = None  # the knob's value, when not self.hold

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-flush-stall-")
        self.hold = os.path.join(self.dir, "hold")
        env = {"MUSTER_TEST_FLUSH_HOLD_FILE": self.hold_env or self.hold,
               "MUSTER_FLUSH_THREAD_MIN": "1"}
        # env --chdir: a relative knob would name a file in self.dir (HoldFileRefusedTest).
        self.head = harness.Head(["--node-timeout-ms", str(TIMEOUT_MS), "--worker-timeout-ms",
                                  str(TIMEOUT_MS), "--sweep-ms", "50"], env=env,
                                 prefix=["env", "--chdir=" + self.dir]).start()
        self.client = muster.Client(self.head.url, self.head.token)
        self.agents = []

    def tearDown(self):
        self.release()  # a held flush would hold the head's stop
        for a in self.agents:
            a.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def hold_flushes(self):
        open(self.hold, "w").close()

    def release(self):
        try:
            os.unlink(self.hold)
        except FileNotFoundError:
            pass

    def log(self):
        with open(self.head.log_path, errors="replace") as f:
            return f.read()

    def holds(self):
        """How many flushes the thread has held so far."""
        return self.log().count(HELD)


class FlushStallTest(FlushStallCase):
    def test_what_registers_during_a_long_held_flush_is_not_timed_out(self):
        self.client.request("PUT", "/v1/queues/fs", {"lease_ms": 1000, "backoff_ms": 0})
        tid = self.client.request("POST", "/v1/queues/fs/tasks",
                                  {"tasks": [{"payload": "lapses"}]})["tasks"][0]["id"]
        self.client.request("POST", "/v1/queues/fs/lease", {"max": 1})
        self.hold_flushes()
        agent = Agent(self.head, self.dir, "held")
        self.agents.append(agent)
        agent.start()  # it registers in the background: the only write, whose flush is held
        harness.wait_until(lambda: self.holds() == 1, what="the registration's flush held")
        worker = Registration(self.client)  # committed behind that flush, answered after it
        time.sleep(LONG_HOLD_S)  # the stall itself, twice the node and worker timeouts
        self.assertFalse(agent.registered(), "the agent's answer left during the hold")
        self.release()

        wid = worker.result()
        self.assertGreaterEqual(worker.took, LONG_HOLD_S - 0.1)
        # Answered at last, the worker beats: it was not timed out.
        self.assertEqual(self.client.heartbeat(wid)["state"], "active", self.log())
        harness.wait_until(agent.registered, what=lambda: "the agent registered:\n" +
                           agent.log())
        released_ms = int(time.time() * 1000)
        harness.wait_until(
            lambda: self.client.request("GET", "/v1/nodes/held")["last_seen_ms"] > released_ms,
            what=lambda: "a heartbeat of the agent after the hold:\n" + agent.log())
        self.assertEqual(self.client.request("GET", "/v1/nodes/held")["state"], "active")
        self.assertEqual(self.client.worker(wid)["state"], "active")
        self.assertNotIn("registering again", agent.log())
        self.assertNotIn("registered with the head again", agent.log())
        self.assertNotIn("timed out", self.log())
        # Leases keep their deadlines: the one of 1 s lapsed during the hold.
        harness.wait_until(
            lambda: self.client.request("GET", "/v1/tasks/%d" % tid)["state"] == "queued",
            what="the task whose lease lapsed during the hold requeued")
        said = STALL.findall(self.log())
        self.assertEqual(len(said), 1, self.log())
        self.assertGreaterEqual(float(said[0]), LONG_HOLD_S - 0.1)
        self.assertIn("get their whole timeout from now", self.log())

    def test_a_short_held_flush_says_nothing(self):
        self.hold_flushes()
        worker = Registration(self.client)
        harness.wait_until(lambda: self.holds() == 1, what="the registration's flush held")
        time.sleep(SHORT_HOLD_S)  # the stall itself, under a second
        self.release()
        wid = worker.result()
        self.assertGreaterEqual(worker.took, SHORT_HOLD_S)
        # A write after it is answered once the loop heard that flush end, where the
        # line would be said.
        self.assertEqual(self.client.heartbeat(wid)["state"], "active")
        self.assertEqual(self.holds(), 1)
        self.assertNotIn("the disk held a flush", self.log())


    def test_a_name_held_through_a_long_held_flush_is_not_taken_over(self):
        """The first agent's silence while the disk held the flush of its heartbeat is not
        its own: a second agent naming its node as the hold ends is refused, as it would
        be without the stall, and takes nothing over (node.c counts a holder's silence
        from the stall's end, as the sweep does)."""
        first = Agent(self.head, self.dir, "twin")
        self.agents.append(first)
        first.start()
        harness.wait_until(first.registered, what=lambda: "the first registered:\n" +
                           first.log())
        self.hold_flushes()
        harness.wait_until(lambda: self.holds() == 1, what="the flush of a heartbeat held")
        time.sleep(LONG_HOLD_S)  # the stall: the first agent waits for that heartbeat's reply
        second = Agent(self.head, self.dir, "twin")
        second.lock = os.path.join(self.dir, "agent-twin-2.lock")
        second.log_path = os.path.join(self.dir, "agent-twin-2.log")
        self.agents.append(second)
        second.start(wait_listen=False)  # its registration comes before the first's next beat
        self.release()
        harness.wait_until(lambda: "is held by another running agent" in second.log(),
                           what=lambda: "the second agent refused:\n" + second.log())
        self.assertEqual(self.client.request("GET", "/v1/nodes/twin")["address"],
                         first.url[len("http://"):])
        self.assertNotIn("registered again", self.log())


class HoldFileRefusedTest(FlushStallCase):
    hold_env = "hold"  # relative: refused, though the head runs in self.dir

    def test_a_relative_hold_file_holds_nothing(self):
        self.assertIn("MUSTER_TEST_FLUSH_HOLD_FILE=hold is not an absolute path; no flush is "
                      "held", self.log())
        self.hold_flushes()  # self.dir/hold: what the relative name would reach
        worker = Registration(self.client)
        wid = worker.result()
        self.assertEqual(self.client.heartbeat(wid)["state"], "active")
        self.assertEqual(self.holds(), 0)


if __name__ == "__main__":
    unittest.main()
