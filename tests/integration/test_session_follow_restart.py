"""`muster session results --follow` outlasting its head: stopped (SIGTERM) or killed
(SIGKILL) mid-stream and started again on the same data dir, the follower waits for it,
says so once when it goes and once when it is back, and reads on from its cursor, so
every result is printed exactly once and in order; it ends by itself once every task of
the session has its result.  SIGINT ends it (the head up or away) with the cursor on
stderr, and reading again from that cursor prints the rest.  Without --follow a head
that does not answer is an error at once, as before.

The head listens on a fixed port (picked free at the start), so a restart on the same
data dir is reachable at the same URL.  The test is the session's worker: it leases and
completes the tasks itself, so it decides which results exist before, during and after
the restart.  The follower's stderr is read line by line to wait for what it says.

Through a node agent (the follower given the agent's URL) the words name the agent:
the head behind it is away while the agent answers unavailable, the agent itself when
it is killed, and the agent answers again either way.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
QUEUE = "follow"
INPUTS = 6
AWAY = "is unreachable or restarting; still following session"
BACK = "answers again; following on from cursor"


class Follower:
    """`muster session results SESSION --follow --values ...` with its stdout and stderr
    collected line by line by two threads."""

    def __init__(self, env, session, *extra):
        self.proc = subprocess.Popen(
            [MUSTER, "session", "results", session, "--follow", "--values"] + list(extra),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out, self.err = [], []
        self.readers = [threading.Thread(target=self._collect, args=(f, into))
                        for f, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self.readers:
            t.start()

    @staticmethod
    def _collect(stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))

    def stderr(self):
        return "\n".join(self.err)

    def wait_for(self, predicate, what):
        harness.wait_until(lambda: predicate() or self.proc.poll() is not None, timeout=60,
                           what=what)
        if not predicate():
            self.finish()
            raise AssertionError("the follower ended (exit %s) before %s; stderr:\n%s"
                                 % (self.proc.returncode, what, self.stderr()))

    def said(self, text):
        return any(text in line for line in self.err)

    def finish(self, timeout=60):
        self.proc.wait(timeout=timeout)
        for t in self.readers:
            t.join(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode


class FollowCase(unittest.TestCase):
    """A head on a fixed port, a session of INPUTS tasks, and the test as its worker."""

    def setUp(self):
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()]).start()
        self.addCleanup(self.head.cleanup)
        self.env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        self.cli("queue", "create", QUEUE)
        # --no-cleanup: nothing but the follower heart-beats the session.
        self.session = self.cli("session", "create", "--queue", QUEUE, "--no-cleanup").strip()
        self.cli("session", "put", self.session,
                 input="".join("in%d\n" % i for i in range(INPUTS)))
        self.completed = []  # the results, in the order the tasks were completed

    def cli(self, *args, input=None):
        r = subprocess.run([MUSTER] + list(args), env=self.env, input=input, text=True,
                           capture_output=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def complete(self, n, reverse=False):
        """Leases the next n tasks and completes them (in reverse order when asked), each
        with its payload's number prefixed "r"."""
        reply = self.head.request("POST", "/v1/queues/%s/lease" % QUEUE, {"max": n})
        self.assertEqual(reply.status, 200, reply)
        leases = reply.json["leases"]
        self.assertEqual(len(leases), n)
        for lease in reversed(leases) if reverse else leases:
            result = "r" + lease["payload"][2:]
            reply = self.head.request("POST", "/v1/leases/complete", {"leases": [
                {"task": lease["task"], "token": lease["token"], "result": result}]})
            self.assertEqual(reply.status, 200, reply)
            self.completed.append(result)

    def restart_while_following(self, follower, stop):
        """Stops the head with `stop` once the follower printed what is done, waits until
        the follower says the head is away, and starts the head again."""
        done = len(self.completed)
        follower.wait_for(lambda: len(follower.out) >= done, "the results before the restart")
        stop()
        follower.wait_for(lambda: follower.said(AWAY), "the follower says the head is away")
        self.assertIsNone(follower.proc.poll())
        self.head.start()

    def check_ends_with_every_result(self, follower, expected):
        self.assertEqual(follower.finish(), 0, follower.stderr())
        self.assertEqual(follower.out, expected, follower.stderr())
        self.assertEqual(sum(AWAY in line for line in follower.err), 1, follower.stderr())
        self.assertEqual(sum(BACK in line for line in follower.err), 1, follower.stderr())
        self.assertIn("cursor: ", follower.err[-1])



class FollowHeadRestartTest(FollowCase):

    def test_submission_order_through_a_stop_and_start(self):
        self.complete(2)
        follower = Follower(self.env, self.session)
        self.restart_while_following(follower, self.head.stop)
        self.complete(2, reverse=True)  # indexes 3 then 2: printed as 2, 3
        follower.wait_for(lambda: follower.said(BACK) and len(follower.out) >= 4,
                          "the results after the restart")
        self.complete(2)
        self.check_ends_with_every_result(follower, ["r%d" % i for i in range(INPUTS)])
        self.assertEqual(follower.err[-1], "cursor: %d" % INPUTS)
        self.assertIn("muster: the head at %s %s 2" % (self.head.url, BACK), follower.err)

    def test_completion_order_through_a_kill_and_start(self):
        self.complete(3, reverse=True)
        follower = Follower(self.env, self.session, "--order", "completion")
        self.restart_while_following(follower, self.head.kill)
        self.complete(3, reverse=True)
        self.check_ends_with_every_result(follower, self.completed)
        self.assertEqual(self.completed, ["r2", "r1", "r0", "r5", "r4", "r3"])
        self.assertEqual(follower.err[-1], "cursor: %d" % INPUTS)  # the last result's seq

    def test_interrupted_while_the_head_is_away(self):
        self.complete(2)
        follower = Follower(self.env, self.session)
        follower.wait_for(lambda: len(follower.out) >= 2, "the first results")
        self.head.kill()
        follower.wait_for(lambda: follower.said(AWAY), "the follower says the head is away")
        follower.proc.send_signal(signal.SIGINT)
        self.assertEqual(follower.finish(), 1, follower.stderr())
        self.assertEqual(follower.out, ["r0", "r1"])
        self.assertIn("cursor: 2", follower.err, follower.stderr())
        self.assertIn("muster: stopped by a signal; read on with --cursor 2", follower.err)
        # Without --follow a head that does not answer is an error at once.
        r = subprocess.run([MUSTER, "session", "results", self.session], env=self.env,
                           text=True, capture_output=True, timeout=60)
        self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
        self.assertIn("muster: network: ", r.stderr)
        self.assertNotIn(AWAY, r.stderr)
        # Back from where it stopped: the rest, once each.
        self.head.start()
        self.complete(4)
        rest = Follower(self.env, self.session, "--cursor", "2")
        self.assertEqual(rest.finish(), 0, rest.stderr())
        self.assertEqual(rest.out, ["r2", "r3", "r4", "r5"], rest.stderr())

    def test_interrupted_while_waiting_for_results(self):
        self.complete(1)
        follower = Follower(self.env, self.session)
        follower.wait_for(lambda: len(follower.out) >= 1, "the first result")
        follower.proc.send_signal(signal.SIGINT)
        self.assertEqual(follower.finish(), 1, follower.stderr())
        self.assertEqual(follower.out, ["r0"])
        self.assertEqual(follower.err, ["cursor: 1",
                                        "muster: stopped by a signal; read on with --cursor 1"])


class FollowThroughAgentTest(FollowCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="muster-follow-agent-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.agent = node_harness.Agent(self.head, self.tmp, "follow", args=[
            "--listen", "127.0.0.1:%d" % harness.free_port(),
            "--cache-dir", os.path.join(self.tmp, "cache"),
            "--state-dir", os.path.join(self.tmp, "state")]).start()
        self.addCleanup(self.agent.kill)
        self.env = dict(self.env, MUSTER_URL=self.agent.url)

    def test_the_head_away_behind_the_agent(self):
        self.complete(2)
        follower = Follower(self.env, self.session)
        self.restart_while_following(follower, self.head.kill)
        self.complete(4)
        self.check_ends_with_every_result(follower, ["r%d" % i for i in range(INPUTS)])
        self.assertIn("muster: the head behind the node agent at %s %s %s from cursor 2, trying "
                      "again every 2 s at most (Ctrl-C stops, printing the cursor to resume "
                      "from)" % (self.agent.url, AWAY, self.session), follower.err)
        self.assertIn("muster: the node agent at %s %s 2" % (self.agent.url, BACK), follower.err)

    def test_the_agent_away(self):
        self.complete(2)
        follower = Follower(self.env, self.session)
        follower.wait_for(lambda: len(follower.out) >= 2, "the results before the agent goes")
        self.agent.kill()
        follower.wait_for(lambda: follower.said(AWAY), "the follower says the agent is away")
        self.agent.start()  # on the same port: its --listen names it
        self.complete(4)
        self.check_ends_with_every_result(follower, ["r%d" % i for i in range(INPUTS)])
        self.assertIn("muster: the node agent at %s %s %s from cursor 2, trying again every "
                      "2 s at most (Ctrl-C stops, printing the cursor to resume from)"
                      % (self.agent.url, AWAY, self.session), follower.err)
        self.assertIn("muster: the node agent at %s %s 2" % (self.agent.url, BACK), follower.err)


if __name__ == "__main__":
    unittest.main()
