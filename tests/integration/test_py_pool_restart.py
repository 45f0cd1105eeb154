"""muster.Pool outlasting its head: kill -9 mid-map, restart, and the pool carries on.

The Python twin of test_cli_map_restart.py.  The head listens on a fixed port (picked
free at the start) so a restart on the same data dir is reachable at the same URL.  Two
`muster worker` processes run `python3 -m muster.worker` (as a node agent would) with
the class Gated below, which squares numbers; inputs from GATED on wait until the test
creates a gate file, so the pool is mid-run (the first GATED results read, the rest
held back) when the head is killed, whatever the machine's speed.
Checks: `map` returns every result exactly once and in order across a kill -9 and a
restart, and `imap_unordered` yields each index once; submitting is tried again while
the head is down, and a batch whose reply was lost (stored, then the connection dropped)
is sent again and answered as a repeat, nothing stored twice (also when its jobs require
shared data); and when the head does not
come back within the session's timeout the pool raises NetworkError naming the session,
how long the head was silent and how to read the rest, and leaves the session open:
read as the message says once the head is back, the rest comes, each result once.
A call's `timeout` is kept while the head is down (submitting or reading), its
TimeoutError saying so; the pool logs one warning when it starts trying again and one
info line when the head answers, not one per try; and `close()` waits for a head that
is down as the calls do (a close whose reply was lost is sent again, and the session is
found closed), then says what to do, and may be called again once the head is back.
"""
import logging
import os
import re
import shutil
import subprocess
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
import muster.worker  # noqa: E402 (decode_result, as the give-up message says)

MUSTER = harness.MUSTER_BIN
PYTHONPATH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
QUEUE = "pyq"
INPUTS = 300
GATED = 100  # inputs 0..GATED-1 run at once; the others wait for the gate file
TIMEOUT = 1.5  # a call's timeout, off the pool's one-second retry beat
LATE = 0.75  # how late a TimeoutError may come (a request, a wake-up of a loaded machine)


def count_calls(obj, method):
    """Wraps obj.method to note each call: the list it grows by one per call."""
    calls, call = [], getattr(obj, method)

    def counted(*args):
        calls.append(1)
        return call(*args)

    setattr(obj, method, counted)
    return calls


class Gated(muster.WorkerInterface):
    """Squares its input; from GATED on only once the file init_data["gate"] exists.
    The workers load this script as __mp_main__ (the Pool sends its path)."""

    def __init__(self, init_data):
        self.gate = init_data["gate"]

    def run(self, x):
        # The worker stands in for a long job here: it polls, the test never does.
        while x >= GATED and not os.path.exists(self.gate):
            time.sleep(0.02)
        return x * x


class Run(threading.Thread):
    """Runs one pool call in a thread: items it yields go to `got` as they come, the
    error it raised (if any) to `error`."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.got, self.error = call, [], None
        self.start()

    def run(self):
        try:
            for value in self.call():
                self.got.append(value)
        except Exception as e:  # noqa: BLE001 (the test looks at it)
            self.error = e

    def finish(self, test):
        self.join(timeout=180)
        test.assertFalse(self.is_alive(), "the pool call did not end")
        return self.got


class PoolHeadRestartTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-pypool-restart-")
        self.gate = os.path.join(self.tmp, "gate")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()])
        self.head.start()
        self.client = muster.Client(self.head.url, self.head.token)
        self.client.put_queue(QUEUE)
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token,
                   PYTHONPATH=PYTHONPATH, TMPDIR=self.tmp)
        self.worker_log = open(os.path.join(self.tmp, "worker.log"), "wb")
        self.workers = [subprocess.Popen(
            [MUSTER, "worker", "--queue", QUEUE, "--", "/usr/bin/python3", "-m", "muster.worker"],
            env=env, stdout=self.worker_log, stderr=subprocess.STDOUT) for _ in range(2)]
        self.pools = []

    def tearDown(self):
        open(self.gate, "w").close()  # lets the workers' held jobs end
        for pool in self.pools:
            try:
                pool.close()
            except muster.NetworkError:
                pass  # the head is down: the session goes with its timeout
        for w in self.workers:
            w.terminate()
        for w in self.workers:
            w.wait(timeout=30)
        self.worker_log.close()
        self.client.close()
        self.head.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pool(self, timeout_ms, url=None):
        pool = muster.Pool(Gated, {"gate": self.gate}, url=url or self.head.url,
                           token=self.head.token, queue=QUEUE, timeout_ms=timeout_ms)
        self.pools.append(pool)
        return pool

    def done(self, pool):
        """How many of the pool's jobs have their result (GET session: not a heartbeat)."""
        return self.client.session(pool.session)["counts"]["done"]

    def wait_mid_run(self, run, pool, read=None):
        """Waits until the ungated jobs are done (and `read` of them yielded, if given)."""
        harness.wait_until(lambda: run.error or (self.done(pool) >= GATED and
                                                 (read is None or len(run.got) >= read)),
                           timeout=120, what="the ungated jobs\n" + self.worker_output())
        self.assertIsNone(run.error)
        self.assertEqual(self.done(pool), GATED)

    def worker_output(self):
        with open(os.path.join(self.tmp, "worker.log"), errors="replace") as f:
            return f.read()[-3000:]

    def restart_head(self):
        self.head.kill()
        self.head.start()
        self.client.close()

    def test_map_survives_head_kill_and_restart(self):
        pool = self.pool(timeout_ms=60000)
        run = Run(lambda: [pool.map(range(INPUTS))])
        self.wait_mid_run(run, pool)
        self.restart_head()
        open(self.gate, "w").close()
        got = run.finish(self)
        self.assertIsNone(run.error)
        self.assertEqual(got, [[i * i for i in range(INPUTS)]])
        self.assertEqual(self.client.session(pool.session)["state"], "open")

    def test_imap_unordered_survives_head_kill_and_restart(self):
        pool = self.pool(timeout_ms=60000)
        run = Run(lambda: pool.imap_unordered(range(INPUTS)))
        self.wait_mid_run(run, pool, read=GATED)
        self.assertEqual(sorted(run.got), [i * i for i in range(GATED)])
        self.restart_head()
        open(self.gate, "w").close()
        got = run.finish(self)
        self.assertIsNone(run.error)
        self.assertEqual(len(got), INPUTS)  # each index once: no repeat, none lost
        self.assertEqual(sorted(got), [i * i for i in range(INPUTS)])

    def test_gives_up_naming_the_session(self):
        pool = self.pool(timeout_ms=3000)
        url = self.head.url
        run = Run(lambda: pool.imap(range(INPUTS)))
        self.wait_mid_run(run, pool, read=GATED)
        self.head.kill()
        run.finish(self)
        self.assertEqual(run.got, [i * i for i in range(GATED)])
        err = run.error
        self.assertIsInstance(err, muster.NetworkError, err)
        text = str(err)
        self.assertIn("session %s: the head at %s did not answer for 3 s" % (pool.session, url),
                      text)
        self.assertIn("%d of this call's %d results were read" % (GATED, INPUTS), text)
        self.assertIn("The session is left open", text)
        self.assertIn("read the rest (session indexes %d-%d) with muster.Client(%r, TOKEN)"
                      ".iter_results(%r, order='submission', cursor=%d)"
                      % (GATED, INPUTS - 1, url, pool.session, GATED), text)
        self.assertEqual((err.session, err.order, err.cursor), (pool.session, "submission", GATED))
        pool.close()  # leaves the session open: no call to the head, which is down
        # What the message says works: a restarted head gives the session its timeout
        # again, and the rest is read from the cursor, each result once.
        self.head.start()
        open(self.gate, "w").close()
        with muster.Client(url, self.head.token) as reader:
            rest = [muster.worker.decode_result(r["result"]) for r in
                    reader.iter_results(pool.session, order="submission", cursor=GATED)]
        self.assertEqual(rest, [i * i for i in range(GATED, INPUTS)])

    def test_leaving_with_an_error_while_the_head_is_down_keeps_the_error(self):
        # close() fails (the head is down); the exception that left the block is the
        # one raised, with a note on the close, not the NetworkError of the close.
        pool = self.pool(timeout_ms=60000)
        with self.assertRaises(KeyError) as caught:
            with pool:
                self.head.kill()
                raise KeyError("the caller's own error")
        self.assertIn("closing the pool failed too", " ".join(
            getattr(caught.exception, "__notes__", [])))
        self.assertIn(pool.session, " ".join(getattr(caught.exception, "__notes__", [])))

    def test_submitting_outlasts_a_head_that_is_down(self):
        open(self.gate, "w").close()
        pool = self.pool(timeout_ms=60000)
        tries = count_calls(pool.client, "session_put")
        self.head.kill()
        with self.assertLogs("muster", level="INFO") as logs:
            run = Run(lambda: [pool.map(range(50))])
            # The first try and the one sent at once failed, and one after a pause.
            harness.wait_until(lambda: len(tries) >= 3 or run.error, timeout=30,
                               what="three tries of the submission")
            self.head.start()
            got = run.finish(self)
        self.assertIsNone(run.error)
        self.assertEqual(got, [[i * i for i in range(50)]])
        self.assertGreaterEqual(len(tries), 4)
        # One line when it starts trying again, one when the head is back: none per try.
        warnings = self.logged(logs, logging.WARNING)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("muster.Pool: session %s: submitting jobs at session indexes 0-49 failed"
                      % pool.session, warnings[0])
        self.assertIn("the head at %s is unreachable or restarting; trying again every 1 s for "
                      "up to 60.0 s (the session's timeout_ms)" % self.head.url, warnings[0])
        infos = self.logged(logs, logging.INFO)
        self.assertEqual(len(infos), 1, infos)
        self.assertRegex(infos[0], r"session %s: the head at \S+ answers again after \d+\.\d "
                         r"s; carrying on \(submitting jobs at session indexes 0-49\)"
                         % pool.session)
        self.assertEqual({r.name for r in logs.records}, {"muster.pool"})

    def test_a_submission_whose_reply_was_lost_is_sent_again(self):
        open(self.gate, "w").close()
        # The first submission is stored, but its reply never reaches the pool.
        proxy = harness.SubmissionProxy(self.head, lambda n: "drop" if n == 1 else "forward")
        self.addCleanup(proxy.close)
        pool = self.pool(timeout_ms=60000, url=proxy.url)
        self.assertEqual(pool.map(range(40)), [i * i for i in range(40)])
        self.assertEqual(proxy.submissions, 2)  # stored, reply lost; sent again: a repeat
        self.assertEqual(self.client.session(pool.session)["counts"]["total"], 40)

    def test_a_submission_requiring_shared_data_whose_reply_was_lost_is_sent_again(self):
        # The same, for jobs that require shared data: the batch sent again names the same
        # levels, which the head answers as a repeat too (not as another producer's tasks).
        open(self.gate, "w").close()
        self.client.shared.set("pyq-data", "table", b"a table")
        proxy = harness.SubmissionProxy(self.head, lambda n: "drop" if n == 1 else "forward")
        self.addCleanup(proxy.close)
        pool = self.pool(timeout_ms=60000, url=proxy.url)
        self.assertEqual(pool.map(range(40), requires=[("pyq-data", "table", 1)]),
                         [i * i for i in range(40)])
        self.assertEqual(proxy.submissions, 2)
        self.assertEqual(self.client.session(pool.session)["counts"]["total"], 40)

    def logged(self, logs, level):
        return [r.getMessage() for r in logs.records if r.levelno == level]

    def kill_after_submitting(self, pool):
        """Makes the head die as soon as the pool's next jobs are stored: the call reads
        its results from a head that is down from the start."""
        put = pool.client.session_put

        def put_then_kill(*args):
            reply = put(*args)
            self.head.kill()
            return reply

        pool.client.session_put = put_then_kill

    def timed_out(self, call):
        """The TimeoutError `call()` raised, checked to have come after TIMEOUT s and
        not more than LATE s after it."""
        started = time.monotonic()
        with self.assertRaises(TimeoutError) as caught:
            call()
        took = time.monotonic() - started
        self.assertGreaterEqual(took, TIMEOUT)
        self.assertLess(took, TIMEOUT + LATE, "the TimeoutError came %.2f s late: %s"
                        % (took - TIMEOUT, caught.exception))
        return caught.exception

    def check_read_timeout_while_the_head_is_down(self, call, order):
        pool = self.pool(timeout_ms=60000)
        self.kill_after_submitting(pool)
        with self.assertLogs("muster", level="INFO") as logs:
            err = self.timed_out(lambda: call(pool))
        text = str(err)
        self.assertIn("session %s: this call's results were not all in after %.1f s (the "
                      "call's timeout); the head at %s has been unreachable for the last "
                      % (pool.session, TIMEOUT, self.head.url), text)
        unreachable = float(re.search(r"unreachable for the last (\d+\.\d) s", text).group(1))
        self.assertLessEqual(unreachable, TIMEOUT)
        self.assertIn("0 of this call's 10 results were read. The session is still open", text)
        self.assertIn("once the head is back, read the rest (session indexes 0-9) with "
                      "pool.client.iter_results(%r, order=%r, cursor=0)" % (pool.session, order),
                      text)
        self.assertEqual((err.session, err.order, err.cursor), (pool.session, order, 0))
        warnings = self.logged(logs, logging.WARNING)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("session %s: reading results failed" % pool.session, warnings[0])
        self.assertIn("(the call's timeout)", warnings[0])
        # The pool and its session outlive the timeout: read as the message says.
        self.head.start()
        rest = [muster.worker.decode_result(r["result"])
                for r in pool.client.iter_results(pool.session, order=order, cursor=0)]
        self.assertEqual(sorted(rest), [i * i for i in range(10)])

    def test_map_timeout_is_kept_while_the_head_is_down(self):
        self.check_read_timeout_while_the_head_is_down(
            lambda pool: pool.map(range(10), timeout=TIMEOUT), "submission")

    def test_imap_unordered_timeout_is_kept_while_the_head_is_down(self):
        self.check_read_timeout_while_the_head_is_down(
            lambda pool: list(pool.imap_unordered(range(10), timeout=TIMEOUT)), "completion")

    def test_map_timeout_is_kept_while_submitting_to_a_head_that_is_down(self):
        pool = self.pool(timeout_ms=60000)
        self.head.kill()
        err = self.timed_out(lambda: pool.map(range(10), timeout=TIMEOUT))
        text = str(err)
        self.assertIn("session %s: this call's jobs were not all submitted after %.1f s (the "
                      "call's timeout); the head at %s has been unreachable for the last "
                      % (pool.session, TIMEOUT, self.head.url), text)
        self.assertIn("submitting this call's jobs at session indexes 0-9 did not succeed in "
                      "time", text)
        self.assertEqual((err.session, err.order, err.cursor), (pool.session, None, None))
        self.head.start()
        open(self.gate, "w").close()
        self.assertEqual(pool.map(range(5)), [i * i for i in range(5)])  # still usable

    def test_a_timeout_with_the_head_up_names_the_session(self):
        pool = self.pool(timeout_ms=60000)
        with self.assertRaises(TimeoutError) as caught:
            pool.map(range(GATED, GATED + 3), timeout=1.0)  # the gate stays shut
        text = str(caught.exception)
        self.assertIn("session %s: this call's results were not all in after 1.0 s (the "
                      "call's timeout): 0 of this call's 3 results were read. The session is "
                      "still open and its jobs run on: read the rest (session indexes 0-2) with "
                      "pool.client.iter_results(%r, order='submission', cursor=0)"
                      % (pool.session, pool.session), text)
        self.assertNotIn("unreachable", text)

    def test_results_ready_when_the_deadline_passes_are_still_yielded(self):
        """A call's timeout bounds the wait for results, not the consumer: what is ready
        is yielded after the deadline passed, as multiprocessing's next(timeout) returns a
        ready result; TimeoutError comes once a read past it brings nothing new."""
        pool = self.pool(timeout_ms=60000)
        for base, call in ((0, pool.imap), (3, pool.imap_unordered)):
            inputs = [base, base + 1, base + 2]
            results = call(inputs + [GATED + base], timeout=TIMEOUT)  # the last never ends
            deadline = time.monotonic() + TIMEOUT
            harness.wait_until(lambda: self.done(pool) >= base + 3, what="three results")
            # The consumer is slow: the deadline passes before it reads (the time is what
            # this test is about, not a stand-in for an event).
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.05)
            got = [next(results) for _ in inputs]
            self.assertEqual(sorted(got), [i * i for i in inputs], call.__name__)
            with self.assertRaises(TimeoutError):
                next(results)

    def test_close_outlasts_a_head_that_is_down(self):
        open(self.gate, "w").close()
        pool = self.pool(timeout_ms=60000)
        self.assertEqual(pool.map(range(5)), [i * i for i in range(5)])
        tries = count_calls(pool.client, "close_session")
        self.head.kill()
        with self.assertLogs("muster", level="INFO") as logs:
            run = Run(lambda: [pool.close()])
            # Two tries at once, the third after a pause: one warning for all of them.
            harness.wait_until(lambda: len(tries) >= 3 or not run.is_alive(), timeout=30,
                               what="three tries of the close")
            self.head.start()
            run.finish(self)
        self.assertIsNone(run.error)
        self.client.close()
        with self.assertRaises(muster.SessionNotFound) as caught:
            self.client.session(pool.session)
        self.assertIn("was closed (by its client)", str(caught.exception))
        warnings = self.logged(logs, logging.WARNING)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("session %s: closing the session failed" % pool.session, warnings[0])
        self.assertIn("the head at %s is unreachable or restarting; trying again every 1 s for "
                      "up to 60.0 s (the session's timeout_ms)" % self.head.url, warnings[0])
        infos = self.logged(logs, logging.INFO)
        self.assertEqual(len(infos), 1, infos)
        self.assertRegex(infos[0], r"the head at \S+ answers again after \d+\.\d s; carrying "
                         r"on \(closing the session\)")

    def test_close_gives_up_naming_the_session_and_can_be_called_again(self):
        pool = self.pool(timeout_ms=3000)
        url = self.head.url
        self.head.kill()
        with self.assertRaises(muster.NetworkError) as caught:
            pool.close()
        text = str(caught.exception)
        self.assertIn("session %s: the head at %s did not answer for 3 s" % (pool.session, url),
                      text)
        self.assertIn("the pool could not close its session: it is left open", text)
        self.assertIn("Call close() again once the head is back (or run `muster session close "
                      "%s --url %s`)" % (pool.session, url), text)
        self.assertEqual(caught.exception.session, pool.session)
        # As the message says: the restarted head gives the session its timeout again,
        # and close() closes it.
        self.head.start()
        pool.close()
        self.client.close()
        with self.assertRaises(muster.SessionNotFound) as caught:
            self.client.session(pool.session)
        self.assertIn("was closed (by its client)", str(caught.exception))

    def test_a_close_whose_reply_was_lost_is_sent_again(self):
        open(self.gate, "w").close()
        # The close reaches the head, which closes the session, but the reply is lost;
        # so is the reply to the one the client sends again itself (a DELETE is sent once
        # more when a reused connection closes without a reply): the pool's own retry
        # finds the session closed (404 session_not_found) and that is its close.
        proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "DELETE" and path.startswith("/v1/sessions/"),
            lambda n: "drop" if n <= 2 else "forward")
        self.addCleanup(proxy.close)
        pool = self.pool(timeout_ms=60000, url=proxy.url)
        self.assertEqual(pool.map(range(10)), [i * i for i in range(10)])
        pool.close()
        self.assertEqual(proxy.count, 3)
        with self.assertRaises(muster.SessionNotFound) as caught:
            self.client.session(pool.session)
        self.assertIn("was closed (by its client)", str(caught.exception))



if __name__ == "__main__":
    unittest.main()
