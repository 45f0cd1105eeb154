"""`muster worker --permanent-exit N` (docs/cli.md, "worker"): a command that exits N
fails its task for good at once (`permanent` in POST /v1/leases/fail: state `failed`,
one attempt), its error saying so above the stderr tail; any other failure is retried
as before.  The command finds N in MUSTER_PERMANENT_EXIT, which the worker takes out of
its commands' environment without the option.  `muster node` and the local agent of
`muster head` pass the option on to their workers, and `python3 -m muster.worker`
exits N for a failure it knows is permanent (a payload that is not a muster.Pool
task) only when the variable is set.  Bad values (0, 256, 127, not a number) and the
option with --plugin are refused with a usage error, nothing leased or started.

Nothing waits on a timer: the workers run --max-tasks and exit, and the agents' tasks
are waited for with harness.wait_until.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

MUSTER = harness.MUSTER_BIN
HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
sys.path.insert(0, PYTHONPATH)
import muster.worker  # noqa: E402

NOTE = ("exit status %d is this worker's permanent-failure status (--permanent-exit %d): "
        "the task is not retried")
PERMANENTLY = "it failed permanently and will not be retried"
NOT_POOL = "muster.worker: the payload is not a muster.Pool task"
# Says what it saw in MUSTER_PERMANENT_EXIT on stderr, then exits with the status its
# payload names ("quiet 3": the same, saying nothing).
SAY_AND_EXIT = ('read word status; [ "$word" = quiet ] || '
                'echo "saw ${MUSTER_PERMANENT_EXIT-unset}" >&2; exit "$status"')
# A refusal comes at once; a command that took the value runs on, and is stopped then.
REFUSED_S = 10
# Values refused, and what the refusal says.
BAD_VALUES = (("0", "--permanent-exit: must be at least 1, got 0"),
              ("256", "--permanent-exit: must be at most 255, got 256"),
              ("abc", "--permanent-exit: expected an integer, got 'abc'"),
              ("3x", "--permanent-exit: expected an integer, got '3x'"),
              ("127", "--permanent-exit: 127 is not a status a command chooses: a shell exits "
                      "126 or 127"),
              ("137", "--permanent-exit: 137 is not a status a command chooses"),
              ("126", "--permanent-exit: 126 is not a status a command chooses"))


class WorkerPermanentExitTest(harness.CliHead, unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-perm-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def queue(self, *opts):
        name = self.id().rsplit(".", 1)[-1].replace("_", "-")
        self.ok("queue", "create", name, *opts)
        return name

    def task(self, task_id):
        return self.head.request("GET", "/v1/tasks/%s" % task_id).json

    def worker(self, queue, opts, cmd, env=None):
        """Runs `muster worker` to its end (give --max-tasks); its stderr."""
        full = dict(harness.cli_env(self.head), **(env or {}))
        r = subprocess.run([MUSTER, "worker", "--queue", queue] + opts + ["--"] + cmd,
                           env=full, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stderr

    def test_exit_n_fails_the_task_for_good_at_once(self):
        q = self.queue("--max-attempts", "3", "--backoff-ms", "10", "--backoff-max-ms", "20")
        loud, quiet, other = self.ok("put", "--queue", q, "loud 3", "quiet 3", "other 4").split()
        err = self.worker(q, ["--permanent-exit", "3", "--max-tasks", "5"],
                          ["sh", "-c", SAY_AND_EXIT])
        self.assertIn("0 completed, 5 failed", err)
        # Exit 3: failed at its first attempt, the note above the stderr tail (or alone).
        got = self.task(loud)
        self.assertEqual((got["state"], got["attempts"]), ("failed", 1), got)
        self.assertEqual(got["error"], NOTE % (3, 3) + "\nsaw 3")
        got = self.task(quiet)
        self.assertEqual((got["state"], got["attempts"], got["error"]),
                         ("failed", 1, NOTE % (3, 3)))
        # Another status: retried until its attempts are used up, its error as before.
        got = self.task(other)
        self.assertEqual((got["state"], got["attempts"], got["error"]), ("dead", 3, "saw 3"))
        self.assertIn("task %s failed (exit status 3): saw 3 (the last line of its error; "
                      "'muster tasks show %s' has all of it); %s" % (loud, loud, PERMANENTLY), err)
        self.assertIn("task %s failed: %s; %s" % (quiet, NOTE % (3, 3), PERMANENTLY), err)
        self.assertIn("task %s failed (exit status 4): saw 3; it is dead after 3 attempts" % other,
                      err)

    def test_without_the_option_nothing_changes(self):
        # An inherited MUSTER_PERMANENT_EXIT is not this worker's: taken out, and exit 3
        # is retried as any failure.
        q = self.queue("--max-attempts", "2", "--backoff-ms", "10", "--backoff-max-ms", "20")
        task = self.ok("put", "--queue", q, "loud 3").strip()
        err = self.worker(q, ["--max-tasks", "2"], ["sh", "-c", SAY_AND_EXIT],
                          env={"MUSTER_PERMANENT_EXIT": "3"})
        got = self.task(task)
        self.assertEqual((got["state"], got["attempts"], got["error"]), ("dead", 2, "saw unset"))
        self.assertIn("task %s failed (exit status 3): saw unset; it will be retried" % task, err)
        self.assertNotIn(PERMANENTLY, err)

    def refused(self, argv, env):
        """Runs `argv`, which must be refused at once with exit status 2; its stderr.  A
        command that takes the value runs on (a worker, an agent, a head): it is stopped
        after REFUSED_S and the test fails."""
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=REFUSED_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            self.fail("not refused: %s still runs after %d s" % (" ".join(argv), REFUSED_S))
        self.assertEqual(proc.returncode, 2, err)
        return err

    def test_bad_values_are_refused(self):
        q = self.queue()
        task = self.ok("put", "--queue", q, "loud 3").strip()
        lock = os.path.join(self.tmp, "agent.lock")
        node = [MUSTER, "node", "--join", self.head.url, "--lock-file", lock, "--listen",
                "127.0.0.1:0", "--queue", q, "--workers", "1"]
        head = [MUSTER, "head", "--listen", "127.0.0.1:0", "--data-dir",
                os.path.join(self.tmp, "data"), "--lock-file", lock, "--queue", q,
                "--workers", "1"]
        worker = [MUSTER, "worker", "--queue", q]
        env = node_harness.no_gpu_env(harness.cli_env(self.head))
        for value, said in BAD_VALUES:
            for argv in (worker, node, head):
                with self.subTest(value=value, command=argv[1]):
                    err = self.refused(argv + ["--permanent-exit", value, "--", "cat"], env)
                    self.assertIn("muster: " + said, err)
                    self.assertIn("Try 'muster %s --help'" % argv[1], err)
        plugin = os.path.join(self.tmp, "work.so")  # refused before it is looked for
        for argv, said in ((worker, "--permanent-exit is for a command's exit status"),
                           (node, "--permanent-exit is for a worker command's exit status")):
            err = self.refused(argv + ["--permanent-exit", "3", "--plugin", plugin], env)
            self.assertIn(said + "; a plugin fails a task for good with out->permanent", err)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "data")))  # no head started
        got = self.task(task)
        self.assertEqual((got["state"], got["attempts"]), ("queued", 0), got)

    def test_python_worker_exits_n_for_a_payload_not_a_pools(self):
        q = self.queue("--max-attempts", "2", "--backoff-ms", "10", "--backoff-max-ms", "20")
        env = {"PYTHONPATH": PYTHONPATH, "TMPDIR": self.tmp}  # the resident's socket there
        cmd = [sys.executable, "-m", "muster.worker"]
        first = self.ok("put", "--queue", q, "not a pool task").strip()
        err = self.worker(q, ["--permanent-exit", "5", "--max-tasks", "1"], cmd, env)
        got = self.task(first)
        self.assertEqual((got["state"], got["attempts"], got["error"]),
                         ("failed", 1, NOTE % (5, 5) + "\n" + NOT_POOL), err)
        # Without the option the same failure exits 1, retried as before.
        second = self.ok("put", "--queue", q, "not a pool task either").strip()
        err = self.worker(q, ["--max-tasks", "1"], cmd, env)
        got = self.task(second)
        self.assertEqual((got["state"], got["attempts"], got["error"]), ("queued", 1, NOT_POOL))
        self.assertIn("task %s failed (exit status 1): %s; it will be retried" % (second, NOT_POOL),
                      err)

    def test_python_worker_takes_only_a_status_the_worker_sets(self):
        for text, status in (("5", 5), ("125", 125), ("126", None), ("", None), ("0", None), ("256", None),
                             (" 5", None), ("\u00b2", None), ("x", None)):
            with mock.patch.dict(os.environ, {"MUSTER_PERMANENT_EXIT": text}):
                self.assertEqual(muster.worker._permanent_exit(), status, repr(text))
        with mock.patch.dict(os.environ):
            os.environ.pop("MUSTER_PERMANENT_EXIT", None)
            self.assertIsNone(muster.worker._permanent_exit())


class NodePassesItOnTest(AgentsCase):

    def fail_one(self, head, log):
        """Puts a task that exits 9 on queue q of `head` (made here, 3 attempts) and
        waits for it to end; the task."""
        self.assertEqual(head.request("PUT", "/v1/queues/q", {"max_attempts": 3}).status, 201)
        r = head.request("POST", "/v1/queues/q/tasks", {"tasks": [{"payload": "loud 9"}]})
        self.assertLess(r.status, 300, r)
        path = "/v1/tasks/%s" % r.json["tasks"][0]["id"]
        return harness.wait_until(
            lambda: (lambda t: t if t["state"] not in ("queued", "leased") else None)(
                head.request("GET", path).json),
            timeout=30, what=lambda: "the task to end:\n" + log())

    @staticmethod
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    def test_node_workers_fail_for_good(self):
        a = Agent(self.head, self.dir, args=["--queue", "q", "--workers", "1",
                                             "--permanent-exit", "9"],
                  cmd=["sh", "-c", SAY_AND_EXIT])
        self.agents.append(a)
        a.start()
        got = self.fail_one(self.head, a.log)
        self.assertEqual((got["state"], got["attempts"], got["error"]),
                         ("failed", 1, NOTE % (9, 9) + "\nsaw 9"), a.log())
        a.stop_checked()

    def test_head_local_agent_workers_fail_for_good(self):
        head = harness.Head(data_dir=os.path.join(self.dir, "data"))  # its requests
        env = node_harness.no_gpu_env(harness.cli_env(self.head, url=False, token=False))
        with open(os.path.join(self.dir, "head.log"), "w+") as log:
            proc = subprocess.Popen(
                [MUSTER, "head", "--listen", "127.0.0.1:0", "--data-dir", head.data_dir,
                 "--token", head.token, "--lock-file", os.path.join(self.dir, "local.lock"),
                 "--queue", "q", "--workers", "1", "--permanent-exit", "9", "--", "sh", "-c",
                 SAY_AND_EXIT], stdout=log, stderr=log, env=env)
        self.addCleanup(harness.stop_process, proc)
        def listening():
            self.assertIsNone(proc.poll(), self.read(log.name))  # it refused its options
            return self.read(os.path.join(head.data_dir, "url"))
        head.url = harness.wait_until(listening, timeout=30, what="the head's url file")
        got = self.fail_one(head, lambda: self.read(log.name))
        self.assertEqual((got["state"], got["attempts"], got["error"]),
                         ("failed", 1, NOTE % (9, 9) + "\nsaw 9"))
        head._close_conn()
        proc.send_signal(signal.SIGINT)
        self.assertEqual(proc.wait(timeout=60), 0, self.read(log.name))


if __name__ == "__main__":
    unittest.main()
