"""Rough edges a user walk of the CLI found: `session results --follow` started before
`session put`, the worker's line for a failed task (how its command ended, and what
becomes of the task), a usage
error that names the missing argument, and `queue rm` of an unknown queue (and the
session commands) saying where the existing ones are listed.

The tests share one head; each uses its own queue.  Nothing waits on a timer: a
follower's progress is read from its stderr file, polled with harness.wait_until.
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN


class CliPolishTest(harness.CliHead, unittest.TestCase):
    def start(self, name, *args):
        """Starts `muster ARGS` in the background, its stdout and stderr to files of
        `name`; returns (process, stdout path, stderr path)."""
        out, err = (os.path.join(self.cwd, name + ext) for ext in (".out", ".err"))
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen([MUSTER] + list(args), stdout=o, stderr=e,
                                    env=harness.cli_env(self.head), cwd=self.cwd)
        self.addCleanup(harness.stop_process, proc)
        return proc, out, err

    @staticmethod
    def read(path):
        with open(path) as f:
            return f.read()

    # ---- session results --follow before session put ---------------------------------

    def test_follow_of_a_session_without_tasks_waits_for_them(self):
        self.ok("queue", "create", "polish-follow")
        sid = self.ok("session", "create", "--queue", "polish-follow", "--no-cleanup").strip()
        # Without --follow an empty session is read at once, as before.
        r = self.muster("session", "results", sid)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", "cursor: 0\n"))
        # --follow ended at once (exit 0, `cursor: 0`) before any task was put.
        proc, out, err = self.start("follow", "session", "results", sid, "--follow", "--values")
        waiting = ("muster: session %s has no tasks yet; waiting for tasks to be put and for "
                   "their results (Ctrl-C stops)\n" % sid)
        harness.wait_until(lambda: waiting in self.read(err) or proc.poll() is not None,
                           what=lambda: "the follower to say it waits: %r" % self.read(err))
        self.assertIsNone(proc.poll(), self.read(err))
        self.ok("session", "put", sid, stdin="a\nb\n")
        self.ok("worker", "--queue", "polish-follow", "--max-tasks", "2", "--", "tr", "a-z",
                "A-Z")
        self.assertEqual(proc.wait(timeout=30), 0, self.read(err))
        self.assertEqual(self.read(out), "A\nB\n")
        self.assertEqual(self.read(err), waiting + "cursor: 2\n")

    def test_follow_of_a_session_without_tasks_ends_when_it_is_closed(self):
        self.ok("queue", "create", "polish-follow-close")
        sid = self.ok("session", "create", "--queue", "polish-follow-close").strip()
        proc, out, err = self.start("follow-close", "session", "results", sid, "--follow")
        harness.wait_until(lambda: "has no tasks yet" in self.read(err) or proc.poll() is not None,
                           what=lambda: "the follower to say it waits: %r" % self.read(err))
        self.assertIsNone(proc.poll(), self.read(err))
        self.ok("session", "close", sid)
        self.assertEqual(proc.wait(timeout=30), 1, self.read(err))
        self.assertIn("cursor: 0\nmuster: session_not_found: ", self.read(err))

    # ---- the worker's line for a failed task -------------------------------------------

    def worker_err(self, queue, *cmd, tasks=1):
        r = self.muster("worker", "--queue", queue, "--max-tasks", str(tasks), *cmd)
        self.assertEqual(r.returncode, 0, r.stderr)
        return [line for line in r.stderr.splitlines() if " failed" in line and "task" in line]

    def test_a_failed_task_is_said_with_its_exit_status_and_what_comes_next(self):
        # It said `task N failed: oops` alone: not how the command ended when its stderr
        # said something, nor whether the task would run again.
        q = "polish-retry"
        self.ok("queue", "create", q, "--max-attempts", "3", "--backoff-ms", "1",
                "--backoff-max-ms", "1")
        task = self.ok("put", "--queue", q, "x").strip()
        lines = self.worker_err(q, "--", "sh", "-c", "echo oops >&2; exit 3", tasks=3)
        said = "muster worker: task %s failed (exit status 3): oops; " % task
        self.assertEqual(lines, [
            said + "it will be retried (attempt 2 of 3)",
            said + "it will be retried (attempt 3 of 3)",
            said + "it is dead after 3 attempts: 'muster tasks dead --queue %s' lists it" % q,
        ])
        self.assertEqual(self.head.request("GET", "/v1/tasks/" + task).json["state"], "dead")

    def test_a_failed_task_without_stderr_is_said_once_by_its_status(self):
        q = "polish-quiet"
        self.ok("queue", "create", q, "--max-attempts", "1")
        task = self.ok("put", "--queue", q, "x").strip()
        lines = self.worker_err(q, "--", "sh", "-c", "exit 4")
        self.assertEqual(lines, ["muster worker: task %s failed: exit status 4; it is dead after "
                                 "1 attempt: 'muster tasks dead --queue %s' lists it" % (task, q)])

    def test_a_task_failed_for_good_is_said_not_to_be_retried(self):
        # The suite's shared-data plugin fails a task that requires no shared data
        # permanently: the head makes it `failed`, not retried whatever its attempts.
        q = "polish-permanent"
        self.ok("queue", "create", q, "--max-attempts", "5")
        task = self.ok("put", "--queue", q, "x").strip()
        plugin = os.path.join(os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(MUSTER),
                              "libplugin_shared.so")
        lines = self.worker_err(q, "--plugin", plugin)
        self.assertEqual(lines, ["muster worker: task %s failed: no shared data; it failed "
                                 "permanently and will not be retried: 'muster tasks dead --queue "
                                 "%s' lists it" % (task, q)])
        self.assertEqual(self.head.request("GET", "/v1/tasks/" + task).json["state"], "failed")

    # ---- a usage error names what is missing ------------------------------------------

    def test_a_missing_argument_is_named_with_the_usage_line(self):
        cases = (
            (("update", "--queue", "q"), "'update' needs --queue Q [options] DATA: DATA is "
             "missing"),
            (("queue", "rm"), "'queue rm' needs NAME: NAME is missing"),
            (("tasks", "show"), "'tasks show' needs ID: ID is missing"),
            (("session", "results"), "'session results' needs ID [options]: ID is missing"),
            (("complete",), "'complete' needs TASK TOKEN [RESULT]: TASK and TOKEN are missing"),
            (("shared", "put"), "'shared put' needs SCOPE NAME [FILE] [options]: SCOPE and NAME "
             "are missing"),
            (("shared", "rm", "scope"), "'shared rm' needs SCOPE NAME: NAME is missing"),
            (("iter", "restore"), "'iter restore' needs NAME FILE [options]: NAME and FILE are "
             "missing"),
            # An option's value (--rank R) is not an argument; a repeated one loses its dots.
            (("iter", "ack", "it", "--rank", "0"), "'iter ack' needs NAME --rank R "
             "BLOCK:TOKEN...: BLOCK:TOKEN is missing"),
        )
        for args, says in cases:
            err = self.fails(2, *args)
            self.assertEqual(err, "muster: %s\nTry 'muster %s --help' for more information.\n"
                             % (says, says.split("'")[1]), args)

    # ---- not found: where the existing ones are listed ---------------------------------

    def test_queue_rm_of_an_unknown_queue_says_where_queues_are_listed(self):
        err = self.fails(1, "queue", "rm", "polish-nosuch")
        self.assertEqual(err, "muster: queue_not_found: queue 'polish-nosuch' does not exist\n"
                         "muster: see `muster queue ls` for the queues there are\n")
        # Its siblings say the same, beside the advice to create it.
        for cmd in ("show", "purge"):
            self.assertIn("see `muster queue ls` for the queues there are",
                          self.fails(1, "queue", cmd, "polish-nosuch"))

    def test_session_commands_of_an_unknown_session_say_where_sessions_are_listed(self):
        sid = "s-0123456789abcdef"
        says = ("muster: session_not_found: session '%s' does not exist\n"
                "muster: see `muster session ls` for the open sessions\n" % sid)
        for args in (("show", sid), ("close", sid), ("results", sid),
                     ("results", sid, "--follow")):
            self.assertEqual(self.fails(1, "session", *args), says, args)
        err = self.fails(1, "session", "put", sid, stdin="x\n")
        self.assertEqual(err, says)


if __name__ == "__main__":
    unittest.main()
