"""The note a Pool call's TimeoutError carries (python/muster/pool_why.py): which of the
call's unfinished jobs failed, the newest first, and how many more there are with the
errors named and with others; its C twin is checked by ctest_pool_why."""
import unittest

import common  # noqa: F401  (puts python/ on sys.path)
from muster import pool_why


class PageClient:
    """A client whose task listing answers one page of `tasks`."""

    def __init__(self, tasks):
        self.page = tasks

    def tasks(self, queue, after=0, limit=100, brief=False):
        return {"tasks": [t for t in self.page if t["id"] > after][:limit]}


def task(tid, index, error, updated, state="queued", session="s-1", attempts=1):
    return {"id": tid, "index": index, "error": error, "updated_ms": updated, "state": state,
            "session": session, "attempts": attempts}


class FailingJobsNoteTest(unittest.TestCase):
    def note(self, tasks, first=0, n=10):
        return pool_why.failing_jobs_note(PageClient(tasks), "q", "s-1", 1, first, n)

    def test_more_with_the_errors_named_and_with_others(self):
        tasks = [task(1, 0, "e-a", 10), task(2, 1, "e-b", 20), task(3, 2, "e-c", 30),
                 task(4, 3, "e-a", 40), task(5, 4, "e-d", 50)]
        self.assertEqual(self.note(tasks), "; 5 of this call's unfinished jobs failed at least "
                         "once and wait to be tried again, the newest first: job 4 (attempt 1): "
                         "e-d; job 3 (attempt 1): e-a; job 2 (attempt 1): e-c (and 2 more: 1 "
                         "with these errors, 1 with others)")

    def test_more_with_the_errors_named_only(self):
        tasks = [task(1, 0, "e-a", 10), task(2, 1, "e-a", 20)]
        self.assertTrue(self.note(tasks).endswith("job 1 (attempt 1): e-a (and 1 more with "
                                                  "these errors)"), self.note(tasks))

    def test_only_the_calls_unfinished_failed_jobs(self):
        tasks = [task(1, 0, "e-a", 10, state="done"), task(2, 1, None, 20),
                 task(3, 2, "e-b", 30, session="s-2"), task(4, 12, "e-c", 40)]
        self.assertEqual(self.note(tasks), "")


if __name__ == "__main__":
    unittest.main()
