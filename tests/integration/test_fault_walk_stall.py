"""A head that stops running for a while (SIGSTOP, a paused VM, a disk that stalls its
loop, the wall clock jumping ahead) and then goes on.

While it does not run nobody can reach it: the heartbeats of its workers, nodes and
session clients wait unread in its sockets.  The first sweep after it resumes runs
before they are read, so counting that gap as their silence ended every worker, node and
session at once, with the tasks they were running, though all were alive.  The head now
treats such a gap as it treats a restart (docs/operations.md, "Restarts"): each gets its
whole timeout from the moment the head runs again; leases keep their deadlines.
"""
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase  # noqa: E402

TIMEOUT_MS = 3000  # the heartbeat timeout of the worker, node and session below
STALL_S = 4.5      # how long the head is stopped: half as long again as their timeout


class HeadStallTest(ApiTestCase):
    head_args = ("--sweep-ms", "50")

    def state(self, path):
        return self.expect("GET", path)["state"]

    def test_a_stopped_head_gives_timeouts_afresh_when_it_runs_again(self):
        long_q, short_q = self.qname("-long"), self.qname("-short")
        self.create_queue(long_q, lease_ms=600000)
        self.create_queue(short_q, lease_ms=1000, backoff_ms=0)
        wid = self.register(timeout_ms=TIMEOUT_MS)["id"]
        self.expect("POST", "/v1/nodes", {"name": "stall-node", "timeout_ms": TIMEOUT_MS},
                    status=201)
        sid = self.expect("POST", "/v1/sessions", {"queue": long_q, "timeout_ms": TIMEOUT_MS},
                          status=201)["id"]
        held = self.put("kept", name=long_q)[0]
        self.lease_one(long_q, worker=wid)
        lapsing = self.put("lapses", name=short_q)[0]
        self.lease_one(short_q)

        self.head.signal(signal.SIGSTOP)
        try:
            time.sleep(STALL_S)  # the stall itself, longer than every timeout above
        finally:
            self.head.signal(signal.SIGCONT)

        # The lease of 1 s passed its deadline in the stall: the first sweep after it
        # requeues the task (leases keep their deadlines, as across a restart).  Once it
        # has, that sweep has run, and it did not end the others.
        self.wait_state(lapsing, "queued")
        self.assertEqual(self.state("/v1/workers/%d" % wid), "active", self.head.log())
        self.assertEqual(self.state("/v1/nodes/stall-node"), "active", self.head.log())
        self.assertEqual(self.state("/v1/sessions/" + sid), "open", self.head.log())
        self.assertEqual(self.get_task(held)["state"], "leased")
        self.assertIn("the head did not run for ", self.head.log())
        self.assertIn("get their whole timeout from now", self.head.log())

        # Silent from here on, they do time out: the stall moved their start, it did
        # not stop the clock.
        harness.wait_until(lambda: self.state("/v1/workers/%d" % wid) == "gone",
                           timeout=10, what="the silent worker to time out")
        harness.wait_until(lambda: self.state("/v1/nodes/stall-node") == "gone",
                           timeout=10, what="the silent node to time out")
        harness.wait_until(lambda: self.call("GET", "/v1/sessions/" + sid).status == 404,
                           timeout=10, what="the silent session to close")
        self.wait_state(held, "queued")



class HeadWithoutStallTest(ApiTestCase):
    head_args = ("--sweep-ms", "50")

    def test_a_head_that_runs_on_says_nothing_of_stalls(self):
        wid = self.register(timeout_ms=60000)["id"]
        harness.wait_until(lambda: "listening on port" in self.head.log(), timeout=5,
                           what="the head's start line")
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # some sweeps, each on time
            self.expect("POST", "/v1/workers/%d/heartbeat" % wid, {})
        self.assertNotIn("did not run for", self.head.log())


if __name__ == "__main__":
    unittest.main()
