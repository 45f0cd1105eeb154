"""muster.Pool's lines about an outage name what answers at its URL, in the CLI's words.

The pool's warning (`... is unreachable or restarting`), its info line (`... answers
again`) and the errors it raises at the end (`... did not answer for N s`, `... has been
unreachable for the last N s`) said "the head at URL" also when the pool talked to a node
agent.  They now say, as `muster map` does (src/cli/conn.c): "the node agent at URL"
when the agent itself is away or answers again, "the head behind the node agent at URL"
while the agent answers that it cannot reach the head, and "the muster head or node
agent at URL" when no reply said what answers there (a proxy that drops the `Server`
header).  Talking to the head, they keep saying "the head at URL"
(test_py_pool_restart.py)."""
import logging
import os
import shutil
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402
import node_harness  # noqa: E402

QUEUE = "words"
TIMEOUT = 1.5  # a call's timeout


class Idle(muster.WorkerInterface):
    """No worker runs here: the pool's jobs stay queued."""


class PoolServerWordsTest(harness.RestartableHeadCase):

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.mkdtemp(prefix="muster-pool-words-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def start_agent(self):
        agent = node_harness.Agent(self.head, self.tmp, "words", args=[
            "--cache-dir", os.path.join(self.tmp, "cache"),
            "--state-dir", os.path.join(self.tmp, "state")])
        self.addCleanup(agent.kill)
        return agent.start()

    def pool(self, url, timeout_ms=60000):
        return muster.Pool(Idle, url=url, token=self.head.token, queue=QUEUE,
                           timeout_ms=timeout_ms)

    def logged(self, logs, level):
        return [r.getMessage() for r in logs.records if r.levelno == level]

    def close_across_an_outage(self, pool, end_outage):
        """Closes `pool` in a thread while its server is away; once the pool has warned,
        `end_outage()`; returns the (warning, info) lines it logged."""
        with self.assertLogs("muster", level="INFO") as logs:
            errors = []

            def close():
                try:
                    pool.close()
                except Exception as e:  # noqa: BLE001 (the test looks at it)
                    errors.append(e)
            closing = threading.Thread(target=close, daemon=True)
            closing.start()
            harness.wait_until(lambda: self.logged(logs, logging.WARNING) or errors,
                               timeout=30, what="the pool's warning")
            end_outage()
            closing.join(timeout=60)
        self.assertFalse(closing.is_alive(), "close() did not end")
        self.assertEqual(errors, [])
        warnings, infos = self.logged(logs, logging.WARNING), self.logged(logs, logging.INFO)
        self.assertEqual((len(warnings), len(infos)), (1, 1), warnings + infos)
        return warnings[0], infos[0]

    def test_the_head_behind_an_agent_and_the_agent_answering_again(self):
        agent = self.start_agent()
        pool = self.pool(agent.url)
        self.assertEqual(pool.client.server, "node")
        self.head.kill()   # the agent answers unavailable: it cannot reach the head
        warning, info = self.close_across_an_outage(pool, self.head.start)
        self.assertIn("closing the session failed (unavailable: ", warning)
        self.assertIn("): the head behind the node agent at %s is unreachable or restarting; "
                      "trying again every 1 s" % agent.url, warning)
        self.assertIn("session %s: the node agent at %s answers again after "
                      % (pool.session, agent.url), info)

    def test_a_pool_gives_up_on_the_head_behind_an_agent(self):
        agent = self.start_agent()
        pool = self.pool(agent.url, timeout_ms=3000)
        self.head.kill()
        with self.assertLogs("muster", level="WARNING"), \
                self.assertRaises(muster.Unavailable) as caught:
            pool.close()
        text = str(caught.exception)
        self.assertIn("session %s: the head behind the node agent at %s did not answer for 3 s"
                      % (pool.session, agent.url), text)
        self.assertIn("Call close() again once the head is back", text)

    def test_an_agent_that_is_away(self):
        agent = self.start_agent()
        pool = self.pool(agent.url, timeout_ms=3000)
        put = pool.client.session_put

        def put_then_stop_the_agent(*args):
            reply = put(*args)
            self.assertEqual(agent.stop(), 0, agent.log())
            return reply
        pool.client.session_put = put_then_stop_the_agent   # the jobs are stored, not read
        with self.assertLogs("muster", level="WARNING") as logs:
            with self.assertRaises(TimeoutError) as caught:
                pool.map(range(3), timeout=TIMEOUT)
        text = str(caught.exception)
        self.assertIn("the node agent at %s has been unreachable for the last " % agent.url,
                      text)
        self.assertIn("once the node agent is back, read the rest (session indexes 0-2)", text)
        warnings = self.logged(logs, logging.WARNING)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("the node agent at %s is unreachable or restarting" % agent.url,
                      warnings[0])
        with self.assertLogs("muster", level="WARNING"), \
                self.assertRaises(muster.NetworkError) as caught:
            pool.close()
        text = str(caught.exception)
        self.assertIn("session %s: the node agent at %s did not answer for 3 s"
                      % (pool.session, agent.url), text)
        self.assertIn("Call close() again once the node agent is back", text)

    def test_a_server_that_never_said_what_it_is(self):
        # The proxy drops the head's Server header: no reply says what answers there.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "DELETE" and path.startswith("/v1/sessions/"),
            lambda n: harness.UNAVAILABLE if n == 1 else "forward")
        pool = self.pool(self.proxy.url)
        self.assertIsNone(pool.client.server)
        warning, info = self.close_across_an_outage(pool, lambda: None)
        self.assertIn("the muster head or node agent at %s is unreachable or restarting"
                      % self.proxy.url, warning)
        self.assertIn("the muster head or node agent at %s answers again" % self.proxy.url, info)

    def test_a_pool_gives_up_on_a_server_that_never_said_what_it_is(self):
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "DELETE" and path.startswith("/v1/sessions/"),
            lambda n: harness.UNAVAILABLE)
        pool = self.pool(self.proxy.url, timeout_ms=3000)
        with self.assertLogs("muster", level="WARNING"), \
                self.assertRaises(muster.Unavailable) as caught:
            pool.close()
        text = str(caught.exception)
        self.assertIn("session %s: the muster head or node agent at %s did not answer for 3 s"
                      % (pool.session, self.proxy.url), text)
        self.assertIn("Call close() again once the server is back", text)


if __name__ == "__main__":
    unittest.main()
