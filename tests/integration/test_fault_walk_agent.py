"""A node agent under an operator's mistakes and failures (docs/node.md).

- Two agents given one --cache-dir: each counted only its own files against
  --cache-bytes, and each removed the other's fetches in progress as it started (it
  empties DIR/tmp).  The first to use the dir holds it (DIR/@agent.lock); the other is
  refused, naming it: it does not start on a dir that is held, and one that was given
  the dir before the first made it serves its reads from the head, uncached.
- An agent whose name another running agent holds is refused by the head (it retries,
  in case that agent is dead and its node times out); stopped, it said "node NAME
  stopped", exit 0, as if it had run.  It now says it did not start and why, and exits
  1, as for a refused token.
- A worker killed with kill -9 was sometimes logged "died with commands still running;
  killed 1 process" though each of its commands' guards kills the command's group as the
  worker dies: the agent looked at the worker's session before a guard had run.  Only
  what escaped the guards (a process that left its command's group) is said now.  The
  test stops the guard (SIGSTOP) before the worker's kill, so that the agent always
  looks first.
"""
import os
import re
import shutil
import signal
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent  # noqa: E402


class SharedCacheDirTest(unittest.TestCase):
    def setUp(self):
        # Each process is cleaned up however far setUp gets (addCleanup runs then too).
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-cache-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.cache = os.path.join(self.dir, "cache")
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.data = os.urandom(100000)
        r = self.head.request("PUT", "/v1/shared/sc/w", raw=self.data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)

    def agent(self, name, **start):
        agent = Agent(self.head, self.dir, name, args=["--cache-dir", self.cache])
        self.addCleanup(agent.kill)
        return agent.start(**start)

    def refusal(self, holder):
        return ("the cache dir %s is in use by another node agent (pid %d, node %s): two agents "
                "cannot share one (each counts only its own files against --cache-bytes, and "
                "removes the other's fetches in progress as it starts); give each its own "
                "--cache-dir (the default, /var/tmp/muster-node-NAME/cache, is one per node "
                "name)" % (self.cache, holder.proc.pid, holder.name))

    def read(self, agent):
        r = agent.request("GET", "/v1/shared/sc/w")
        self.assertEqual((r.status, r.raw == self.data), (200, True), r)
        return r.headers.get("X-Muster-Cache")

    def test_a_cache_dir_serves_one_agent(self):
        # Both start before the dir exists; the first to store a level holds it.
        first, second = self.agent("fw-first"), self.agent("fw-second")
        self.assertFalse(os.path.exists(self.cache))
        self.assertEqual(self.read(first), "miss")
        self.assertEqual(self.read(second), "uncached")  # forwarded from the head
        self.assertEqual(self.read(second), "uncached")
        harness.wait_until(lambda: self.refusal(first) in second.log(),
                           what=lambda: "the refusal in the second agent's log:\n" +
                           second.log())
        self.assertEqual(second.log().count(self.refusal(first)), 1, second.log())  # once
        stats = second.request("GET", "/v1/node/cache").json
        self.assertEqual((stats["uncached"], stats["entries"]), (2, 0), stats)
        self.assertEqual(self.read(first), "hit")

        # An agent started on the held dir, which exists now, does not start.
        third = self.agent("fw-third", wait_listen=False)
        self.assertEqual(third.proc.wait(timeout=20), 1, third.log())
        self.assertIn("muster node: " + self.refusal(first), third.log())

        # Once the first has stopped, another agent takes the dir and its levels on.
        first.stop_checked()
        after = self.agent("fw-after")
        self.assertEqual(self.read(after), "hit")

    def test_a_dir_where_no_lock_can_be_made_is_served_uncached(self):
        # As a dir where nothing can be written (read-only, full): the agent starts and
        # serves its reads from the head, saying why once.
        os.makedirs(os.path.join(self.cache, "@agent.lock"))
        agent = self.agent("fw-nolock")
        self.assertEqual(self.read(agent), "uncached")
        self.assertEqual(self.read(agent), "uncached")
        said = "cannot open the cache dir's lock %s/@agent.lock: Is a directory" % self.cache
        self.assertEqual(agent.log().count(said), 1, agent.log())

    def test_the_lock_removed_with_the_dir_is_taken_again(self):
        first = self.agent("fw-first")
        self.assertEqual(self.read(first), "miss")
        shutil.rmtree(self.cache)  # everything, the lock file too
        self.assertEqual(self.read(first), "miss")  # stored again, the dir claimed again
        second = self.agent("fw-second", wait_listen=False)
        self.assertEqual(second.proc.wait(timeout=20), 1, second.log())
        self.assertIn(self.refusal(first), second.log())


class RefusedNameTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-name-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()

    def agent(self, workdir, name="fw-dup", head=None):
        """An agent with a lock file and log of its own (in `workdir`)."""
        os.makedirs(workdir, exist_ok=True)
        agent = Agent(head or self.head, workdir, name)
        self.addCleanup(agent.kill)
        return agent.start()

    def test_an_agent_refused_its_name_did_not_start(self):
        first = self.agent(self.dir)
        # Registered by the agent's word too (Agent.registered): one stopped while it
        # registered again (its first try outlasted its 5 s request timeout on a loaded
        # machine, though the head took it) says it did not start, not that it stopped.
        harness.wait_until(
            lambda: self.head.request("GET", "/v1/nodes/fw-dup").status == 200 and
            first.registered(), what=lambda: "the first agent to register:\n" + first.log())
        second = self.agent(os.path.join(self.dir, "other-machine"))
        harness.wait_until(lambda: "register: invalid_state: node 'fw-dup' is held by another "
                           "running agent" in second.log(),
                           what=lambda: "the head's refusal:\n" + second.log())
        self.assertEqual(second.stop(), 1, second.log())
        log = second.log()
        self.assertRegex(log, r"muster node: node fw-dup did not start: the head refused its "
                         r"registration \(invalid_state: node 'fw-dup' is held by another "
                         r"running agent [^\n]*\); no worker was started\n")
        self.assertNotIn("node fw-dup stopped", log)
        self.assertEqual(first.stop(), 0, first.log())
        self.assertIn("muster node: node fw-dup stopped\n", first.log())

    def test_an_agent_stopped_while_the_head_was_away_says_so(self):
        away = types.SimpleNamespace(url="http://127.0.0.1:%d" % harness.free_port(),
                                     token=self.head.token)  # no head answers there
        agent = self.agent(self.dir, "fw-away", head=away)
        harness.wait_until(lambda: "register: network: " in agent.log(),
                           what=lambda: "the failed registration:\n" + agent.log())
        self.assertEqual(agent.stop(), 0, agent.log())  # nothing to fix but the head
        self.assertRegex(agent.log(), r"muster node: node fw-away did not start: the head did "
                         r"not take its registration \(network: [^\n]*\); no worker was "
                         r"started\n")


class DeadWorkerLeftoversTest(unittest.TestCase):
    # The command: a sleep in its group (its guard's to end), and a python that leaves the
    # group but not the worker's session (the agent's to find and say) and forks a child
    # back into the command's group.  That child keeps the group from being orphaned when
    # the worker dies: the kernel sends an orphaned group with a stopped process SIGHUP
    # and SIGCONT, which would wake the guard the test stops.
    LEAVER = ("import os, time; g = os.getpgid(0); os.setpgid(0, 0); "
              "(os.setpgid(0, g), time.sleep(300)) if os.fork() == 0 else time.sleep(300)")

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-left-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.head = harness.Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        r = self.head.request("PUT", "/v1/queues/slow", {"max_attempts": 5, "backoff_ms": 0})
        self.assertIn(r.status, (200, 201), r)

    def test_only_what_escaped_the_guard_is_said(self):
        agent = Agent(self.head, self.dir, "fw-leaver", args=["--queue", "slow", "--workers", "1"],
                      cmd=["sh", "-c", "sleep 300 & %s -c '%s' & wait" % (sys.executable,
                                                                          self.LEAVER)])
        self.addCleanup(agent.kill)
        agent.start()
        [worker] = harness.wait_until(lambda: agent.workers() or None,
                                      what=lambda: "the worker:\n" + agent.log())
        r = self.head.request("POST", "/v1/queues/slow/tasks", {"tasks": [{"payload": "a"}]})
        self.assertEqual(r.status, 201, r)

        def running():
            """The guard, sh, sleep and the child in the guard's group, python in its own."""
            below = node_harness.descendants(worker)
            groups = {p: (node_harness._stat(p) or (0, 0))[1] for p in below}
            guards = node_harness.children(worker)  # the command's guard (run_guard.c)
            in_group = [p for p in below if guards and groups[p] == guards[0]]
            leaders = [p for p in below if groups[p] == p and p not in guards]
            return (guards[0], below) if len(in_group) >= 4 and len(leaders) == 1 else None
        guard, below = harness.wait_until(running,
                                          what=lambda: "the command running:\n" + agent.log())
        # The guard cannot kill its group before the agent looks (as when the agent's scan
        # runs before the guard is scheduled), so the agent finds all of it still there.
        os.kill(guard, signal.SIGSTOP)
        os.kill(worker, signal.SIGKILL)
        harness.wait_until(lambda: re.search(r"\(pid %d, worker id \d+\) crashed: killed by "
                                             r"signal 9" % worker, agent.log()),
                           what=lambda: "the agent to see the worker crash:\n" + agent.log())
        harness.wait_until(lambda: not any(node_harness.alive(p) for p in below),
                           what=lambda: "the dead worker's processes gone: %r\n%s" % (
                               [p for p in below if node_harness.alive(p)], agent.log()))
        self.assertIn("muster node: worker 1 (pid %d) died with commands still running; killed "
                      "1 process\n" % worker, agent.log())  # python alone


if __name__ == "__main__":
    unittest.main()
