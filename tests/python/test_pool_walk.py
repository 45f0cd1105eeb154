"""What a user coming from distributed_computing's or multiprocessing's pools meets first:
mistakes said at once and naming what is wrong (a class that is no class or cannot travel,
arguments that cannot be pickled, an input too large, a closed pool), queue_settings that
were not applied, a call that waits for workers that are not there, and a failed job that
does not end imap/imap_unordered (docs/python.md "Pools", docs/coming-from.md)."""
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from common import ROOT, HeadTestCase, harness, muster

import pool_workers


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


class PoolMistakesTest(HeadTestCase):
    """No worker runs: each mistake is said by the client, before or instead of waiting."""

    def pool(self, q, **kw):
        return muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, client=self.c, queue=q, **kw)

    def assert_no_queue(self, q):
        with self.assertRaises(muster.QueueNotFound):
            self.c.queue(q)

    def test_an_instance_for_the_class_is_refused_before_anything_is_made(self):
        """An instance made a pool whose every job failed, after all its attempts (~15 s),
        with "'Echo' object is not callable"."""
        q = self.qname()
        with self.assertRaises(TypeError) as caught:
            muster.Pool(pool_workers.Echo({"k": 1, "dir": "."}), client=self.c, queue=q)
        self.assertIn("worker_class must be a class", str(caught.exception))
        self.assertIn("pass the class itself, not an instance", str(caught.exception))
        self.assert_no_queue(q)

    def test_a_class_defined_in_a_function_is_refused_naming_it(self):
        """pickle's own words ("Can't pickle local object ...") named neither the pool nor
        the fix."""
        class Local(muster.WorkerInterface):
            def run(self, x):
                return x
        q = self.qname()
        with self.assertRaises(TypeError) as caught:
            muster.Pool(Local, client=self.c, queue=q)
        text = str(caught.exception)
        self.assertIn("the worker class " + Local.__qualname__ + " cannot be sent", text)
        self.assertIn("define it at the top level of a module", text)
        self.assert_no_queue(q)

    def test_unpicklable_init_data_is_refused_naming_it(self):
        q = self.qname()
        with self.assertRaises(TypeError) as caught:
            muster.Pool(pool_workers.Echo, {"f": lambda: 1}, client=self.c, queue=q)
        self.assertIn("muster.Pool: init_data cannot be pickled", str(caught.exception))
        self.assert_no_queue(q)

    def test_unpicklable_inputs_and_updates_are_named_and_nothing_is_sent(self):
        with self.pool(self.qname()) as p:
            for call in (p.map, p.imap, p.imap_unordered):
                with self.assertRaises(TypeError) as caught:
                    call([1, 2, lambda: 3])
                self.assertIn("muster.Pool.%s: input 2 cannot be pickled" % call.__name__,
                              str(caught.exception))
            with self.assertRaises(TypeError) as caught:
                p.update_workers({"args": [open(os.devnull)]})
            self.assertIn("muster.Pool.update_workers: data cannot be pickled",
                          str(caught.exception))
            self.assertEqual(self.c.session(p.session)["counts"]["total"], 0)
            self.assertEqual(self.c.updates(p.queue)["updates"], [])

    def test_an_input_too_large_is_named(self):
        """The head names the task's place in its batch (tasks[1]), not the input's."""
        with self.pool(self.qname()) as p:
            p.map([], timeout=5)
            with self.assertRaises(muster.PayloadTooLarge) as caught:
                p.map([1, b"x" * (1 << 20)])
        text = str(caught.exception)
        self.assertIn("muster.Pool.map: input 1 is too large once pickled", text)
        self.assertIn("as shared data", text)

    def test_a_closed_pool_says_so_for_every_call(self):
        """update_workers on a closed pool raised the head's SessionNotFound."""
        p = self.pool(self.qname())
        p.close()
        for name, call in (("map", lambda: p.map([1])), ("imap", lambda: p.imap([1])),
                           ("imap_unordered", lambda: p.imap_unordered([1])),
                           ("update_workers", lambda: p.update_workers(1))):
            with self.assertRaises(ValueError) as caught:
                call()
            self.assertIn("muster.Pool.%s: the pool is closed" % name, str(caught.exception))
            self.assertIn(p.session, str(caught.exception))

    def test_queue_settings_not_applied_to_an_existing_queue_are_said(self):
        """They only set up a queue the pool creates: given for an existing queue they were
        ignored without a word (max_attempts=1 asked, 5 kept)."""
        q = self.qname()
        self.c.put_queue(q, max_attempts=5)
        with self.assertLogs("muster.pool", "WARNING") as logs:
            self.pool(q, queue_settings={"max_attempts": 1, "lease_ms": 60000}).close()
        self.assertEqual(len(logs.output), 1, logs.output)
        self.assertIn("queue %r exists already, so queue_settings were not applied" % q,
                      logs.output[0])
        self.assertIn("max_attempts 5 (queue_settings: 1)", logs.output[0])
        self.assertNotIn("lease_ms", logs.output[0])   # that one is the queue's already
        self.assertEqual(self.c.queue(q)["max_attempts"], 5)
        with self.assertNoLogs("muster.pool", "WARNING"):
            self.pool(q, queue_settings={"max_attempts": 5}).close()
            fresh = self.qname("new")
            self.pool(fresh, queue_settings={"max_attempts": 1}).close()
        self.assertEqual(self.c.queue(fresh)["max_attempts"], 1)

    def test_a_call_no_worker_serves_says_what_it_waits_for(self):
        """A mistyped queue name made a new queue, and map waited on it in silence (or for
        its timeout, saying nothing of workers), where `muster map` says so after 3 s."""
        q = self.qname("typo")
        with self.pool(q) as p:
            with self.assertLogs("muster.pool", "WARNING") as logs:
                with self.assertRaises(TimeoutError) as caught:
                    p.map([1, 2], timeout=4)
            self.assertEqual(len(logs.output), 1, logs.output)
            self.assertIn("no worker serves queue %r: the jobs wait in it" % q, logs.output[0])
            self.assertIn("queue %r did not exist before this pool, which created it" % q,
                          logs.output[0])
            self.assertIn("no worker serves queue %r" % q, str(caught.exception))
        q = self.qname("existing")
        self.c.put_queue(q)
        with self.pool(q) as p:
            with self.assertLogs("muster.pool", "WARNING") as logs:
                with self.assertRaises(TimeoutError):
                    list(p.imap_unordered([1], timeout=4))
            self.assertIn("no worker serves queue %r" % q, logs.output[0])
            self.assertNotIn("did not exist", logs.output[0])


class PoolFailedJobsTest(HeadTestCase):
    """A standalone ``python3 -m muster.worker`` runs the jobs; max_attempts=1."""

    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q, max_attempts=1)
        work = tempfile.mkdtemp(prefix="muster-pool-walk-")
        self.addCleanup(shutil.rmtree, work, True)
        log = open(os.path.join(work, "worker.log"), "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen(["/usr/bin/python3", "-m", "muster.worker", "--queue", self.q,
                                 "--url", self.head.url, "--token", self.head.token],
                                env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
                                stdout=subprocess.DEVNULL, stderr=log)
        self.addCleanup(harness.stop_process, proc)
        self.dir = work

    def test_a_failed_job_does_not_end_imap_and_says_what_dead_means(self):
        """A generator that raised TaskError was over: the call's other results were lost
        to the caller, where multiprocessing's next() goes on after a failed job."""
        raising = [{"args": [i], "kwargs": {"mode": "raise"}} for i in range(2)]
        inputs = [10, raising[0], 12, raising[1], 14]
        with muster.Pool(pool_workers.Echo, {"k": 1, "dir": self.dir}, client=self.c,
                         queue=self.q) as p:
            wait_until(lambda: p.get_workers_count() == 1, what="the worker")
            with self.assertNoLogs("muster.pool", "WARNING"):   # a worker serves the queue
                for call, want in ((p.imap, [10, "E1", 12, "E3", 14]),
                                   (p.imap_unordered, None)):
                    it, got, errors = call(inputs, timeout=60), [], []
                    while True:
                        try:
                            got.append(next(it)["x"])
                        except muster.TaskError as e:
                            got.append("E%d" % e.index)
                            errors.append(e)
                        except StopIteration:
                            break
                    if want is not None:
                        self.assertEqual(got, want)
                    self.assertEqual(sorted(got, key=str), sorted(["E1", "E3", 10, 12, 14], key=str))
                    self.assertEqual([e.state for e in errors], ["dead", "dead"])
                    self.assertIn("is dead (it failed on every attempt the queue's max_attempts "
                                  "allows", str(errors[0]))
                    self.assertIn("ValueError: boom", errors[0].error)
            with self.assertRaises(muster.TaskError) as caught:
                p.map(inputs, timeout=60)
            self.assertEqual(caught.exception.index, 1)


if __name__ == "__main__":
    unittest.main()
