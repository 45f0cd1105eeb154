"""libmuster's muster_pool_iter_failing: a C program whose iterator ran out of time while
its jobs keep failing learns what they fail with, in the words of the TimeoutError of
Python's Pool (test_py_pool_shared.py, test_a_timeout_says_what_the_jobs_keep_failing_with;
docs/pools.md, "The C API").

Through driver_pool_why (a C program calling muster_pool_imap, muster_pool_iter_next with
a short wait, then muster_pool_iter_failing).  Its two jobs require a level of shared
data that was never uploaded; one `muster worker` fails them on every attempt (its queue
allows 1000 attempts, 100 ms apart, so they never die).  Checks: once both jobs failed
twice, the driver's wait for a result runs out and the text names both jobs' newest
distinct error, the job by its input's position with its attempt, and the one more with
that error; before any job failed the text is empty.
"""
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
DRIVER = os.path.join(os.path.dirname(MUSTER), "driver_pool_why")
QUEUE = "cwhy"
ERROR = ("required shared data models/never-there level 1: shared_not_found: shared data "
         "not found: 'never-there' in scope 'models' ('never-there' was never set, or was "
         "deleted)")


class CPoolWhyTest(unittest.TestCase):

    def setUp(self):
        self.head = harness.Head().start()
        self.addCleanup(self.head.cleanup)
        self.env = harness.cli_env(self.head)
        subprocess.run([MUSTER, "queue", "create", QUEUE, "--max-attempts", "1000",
                        "--backoff-ms", "100", "--backoff-max-ms", "100"], env=self.env,
                       check=True, stdout=subprocess.DEVNULL)

    def start_worker(self):
        log = open(os.path.join(self.head.data_dir, "worker.log"), "wb")
        self.addCleanup(log.close)
        worker = subprocess.Popen([MUSTER, "worker", "--queue", QUEUE, "--", "cat"],
                                  env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(harness.stop_process, worker)

    def start_driver(self, count, wait_ms):
        """Starts the driver's imap of `count` inputs; returns it and its session."""
        proc = subprocess.Popen([DRIVER, self.head.url, self.head.token, QUEUE, str(count),
                                 "models", "never-there", "1", str(wait_ms)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        first = proc.stdout.readline()
        if not first.startswith("session s-"):  # the open or imap failed: the driver said why
            self.fail(first + proc.communicate(timeout=60)[0])
        return proc, first.split()[1]

    def tasks(self, session):
        page = self.head.request("GET", "/v1/queues/%s/tasks?limit=1000" % QUEUE).json
        return [t for t in page["tasks"] if t["session"] == session]

    def finish(self, proc):
        """Gives the driver its go-ahead; returns its last line, checking it exited 0."""
        out, _ = proc.communicate("go\n", timeout=60)
        self.assertEqual(proc.returncode, 0, out)
        return out.strip()

    def test_a_late_iterator_says_what_its_jobs_keep_failing_with(self):
        self.start_worker()
        proc, session = self.start_driver(2, 300)

        def failed_twice():
            tasks = self.tasks(session)
            return len(tasks) == 2 and all(t["attempts"] >= 2 for t in tasks)
        harness.wait_until(failed_twice, timeout=60, what=lambda: "both jobs failed twice: %s"
                           % self.tasks(session))
        self.assertRegex(self.finish(proc),
                         r"^late 0 of 2: 2 of this call's unfinished jobs failed at least once "
                         r"and wait to be tried again, the newest first: job [01] \(attempt "
                         r"\d+\): %s \(and 1 more with these errors\)$" % re.escape(ERROR))

    def test_jobs_that_did_not_fail_say_nothing(self):
        # No worker: the jobs wait in the queue, never tried, so none failed.
        proc, session = self.start_driver(2, 0)
        self.assertEqual([t["attempts"] for t in self.tasks(session)], [0, 0])
        self.assertEqual(self.finish(proc), "late 0 of 2:")


if __name__ == "__main__":
    unittest.main()
