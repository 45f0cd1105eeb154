"""muster.Pool jobs that require shared data (docs/python.md, "Shared data in jobs").

One head and one node agent (its cache in the test's directory), and the pool's workers
three ways, each on a queue of its own:

- "agent": 2 workers of the agent running `python3 -m muster.worker` (the `muster worker`
  runner makes the levels local files and hands them over in MUSTER_REQUIRES);
- "standalone-cache": 2 standalone `python3 -m muster.worker --queue Q --cache-url AGENT`
  (the Python worker links the node cache's files itself);
- "standalone": 2 standalone workers without a node cache (they download from the head).

Checks: the jobs of a pool requiring a level see its bytes in `self.shared_files`, the
node cache fetching the level once for all workers and tasks (its statistics), and each
worker asking for it once (it keeps the file between tasks); a newer level required by a
later call is used and the older one's files go; a pool's own session's blob named as
(name, level); a missing level fails the job with `required shared data SCOPE/NAME level
N: CODE: MESSAGE` after the queue's attempts, and a level uploaded between two attempts
is used by the retry; the pool's class is read through the node cache where there is one
(the cache holds the session's worker_class level); a standalone worker lets go of a level
the node cache dropped unless its running job uses it, and its files go when it exits; a download is checked against the
level's checksum; and bad `requires` arguments raise before anything is sent.
"""
import glob
import os
import re
import shutil
import signal
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
import muster._xxh64  # noqa: E402 (a level's checksum)
import node_harness  # noqa: E402
from muster.worker_shared import _download_level  # noqa: E402


def xxh64(data):
    """The checksum the head gives a level of ``data`` (its ETag)."""
    h = muster._xxh64.hasher()
    h.update(data)
    return h.hexdigest()

PYTHONPATH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
WORKER = ["/usr/bin/python3", "-m", "muster.worker"]
SETUPS = ("agent", "standalone-cache", "standalone")
BACKOFF_MS = 1000   # between two attempts: time to upload a level a first attempt missed
MAX_ATTEMPTS = 3
WORKER_TIMEOUT_MS = 6000


class Reader(muster.WorkerInterface):
    """Returns what its job's shared files hold; with ``gate``, once the file ``gate``
    exists (it writes its pid to GATE.started first).  The workers load this script as
    __mp_main__ (the Pool sends its path)."""

    def run(self, x, gate=None):
        if gate:
            with open(gate + ".started", "w") as f:
                f.write(str(os.getpid()))
            # The worker stands in for a long job: it polls, the test never does.
            while not os.path.exists(gate):
                time.sleep(0.01)
        files = {}
        for key, f in self.shared_files.items():
            with open(f, "rb") as fh:
                files[key] = (f.scope, f.name, f.level, fh.read(), f.size, f.checksum)
        # The directories of the files (PID-..., PID its worker's): whose they are.
        dirs = sorted({os.path.dirname(f.path) for f in self.shared_files.values()})
        return {"x": x, "pid": os.getpid(), "files": files, "dirs": dirs}


class PoolSharedDataTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="muster-pypool-shared-")
        cls.cache_dir = os.path.join(cls.tmp, "cache")
        # Workers heart-beat every WORKER_TIMEOUT_MS / 3: a standalone one looks then
        # for levels whose node cache file went.
        cls.head = harness.Head(["--worker-timeout-ms", str(WORKER_TIMEOUT_MS)]).start()
        cls.client = muster.Client(cls.head.url, cls.head.token)
        for setup in SETUPS:
            cls.client.put_queue(setup, backoff_ms=BACKOFF_MS, backoff_max_ms=BACKOFF_MS,
                                 max_attempts=MAX_ATTEMPTS)
        cls.env = dict(os.environ, PYTHONPATH=PYTHONPATH, TMPDIR=cls.tmp)
        cls.env.pop("MUSTER_CACHE_URL", None)
        cls.agent = node_harness.Agent(
            cls.head, cls.tmp, name="pyshared", cmd=WORKER, env=cls.env,
            args=["--queue", "agent", "--workers", "2", "--cache-dir", cls.cache_dir]).start()
        cls.log = open(os.path.join(cls.tmp, "standalone.log"), "ab")
        cls.standalone = [cls.start_standalone(q, url) for q, url in
                          (("standalone-cache", cls.agent.url), ("standalone", None))
                          for _ in range(2)]

    @classmethod
    def start_standalone(cls, queue, cache_url):
        argv = WORKER + ["--queue", queue, "--url", cls.head.url, "--token", cls.head.token]
        if cache_url:
            argv += ["--cache-url", cache_url]
        return subprocess.Popen(argv, env=cls.env, stdout=cls.log, stderr=subprocess.STDOUT)

    @classmethod
    def tearDownClass(cls):
        for w in cls.standalone:
            w.terminate()
        for w in cls.standalone:
            w.wait(timeout=30)
        cls.agent.stop()
        cls.log.close()
        cls.client.close()
        cls.head.cleanup()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.pools = []

    def tearDown(self):
        for pool in self.pools:
            pool.close()

    # ---- helpers -----------------------------------------------------------------------

    def pool(self, setup, **kwargs):
        pool = muster.Pool(Reader, url=self.head.url, token=self.head.token, queue=setup,
                           **kwargs)
        self.pools.append(pool)
        return pool

    def logs(self):
        with open(os.path.join(self.tmp, "standalone.log"), errors="replace") as f:
            return "standalone workers:\n%s\nagent:\n%s" % (f.read()[-3000:], self.agent.log())

    def cache_stats(self):
        with muster.Client(self.agent.url, self.head.token) as c:
            return c.request("GET", "/v1/node/cache")

    def fetched(self, before):
        """(upstream fetches, reads) of the node cache since the statistics ``before``."""
        now = self.cache_stats()
        return (now["upstream_fetches"] - before["upstream_fetches"],
                now["hits"] + now["misses"] - before["hits"] - before["misses"])

    def worker_files(self, pattern):
        """The shared-data files of every worker (the agent's workers' and the standalone
        ones' links in the cache, the downloads under TMPDIR) whose name matches."""
        return (glob.glob(os.path.join(self.cache_dir, "@links", "*", pattern)) +
                glob.glob(os.path.join(self.tmp, "[0-9]*-*", pattern)))

    def upload(self, scope, name, level):
        data = ("%s/%s level %d " % (scope, name, level)).encode() + os.urandom(50000)
        if level == 1:
            self.client.shared.set(scope, name, data)
        else:
            self.client.shared.update(scope, name, data, level=level)
        return data

    # ---- tests -------------------------------------------------------------------------

    def test_jobs_read_their_levels_through_the_node_cache(self):
        for setup in SETUPS:
            with self.subTest(setup=setup):
                self.levels_in_jobs(setup, "weights-" + setup, cached=setup != "standalone")

    def levels_in_jobs(self, setup, name, cached):
        level1 = self.upload("models", name, 1)
        before = self.cache_stats()
        pool = self.pool(setup, requires=[("models", name, 1)])
        out = pool.map(range(16), timeout=120)
        self.assertEqual([r["x"] for r in out], list(range(16)))
        for r in out:
            self.assertEqual(r["files"], {name: ("models", name, 1, level1, len(level1),
                                                 xxh64(level1))})
        # The class and level 1, each fetched from the head once for every worker and job.
        self.assertEqual(self.fetched(before)[0], 2 if cached else 0, self.logs())

        level2 = self.upload("models", name, 2)
        before = self.cache_stats()
        out = pool.map(range(16), requires=[{"scope": "models", "name": name, "level": 2}])
        self.assertEqual({r["files"][name][2:4] for r in out}, {(2, level2)})
        self.assertEqual({tuple(r["files"]) for r in out}, {(name,)})
        pids = {r["pid"] for r in out}
        # One fetch of level 2, and each worker asked for it once: kept between jobs.
        self.assertEqual(self.fetched(before), (1, len(pids)) if cached else (0, 0))
        # Level 1 went from each worker that ran a job of level 2, which holds level 2: a
        # level goes when a job requires a newer one, so a worker that ran none of the 16
        # (the other took them all: a busy machine) keeps level 1, and is not looked at,
        # as in test_node_cache_workers.
        ran = {d for r in out for d in r["dirs"]}
        held = {level: {os.path.dirname(f) for f in self.worker_files("models@%s@%d" % (
            name, level))} for level in (1, 2)}
        self.assertEqual(held[1] & ran, set(), "level 1 went when level 2 was required")
        self.assertEqual(held[2] & ran, ran)

        # A blob of the pool's own session, named (name, level), besides the pool's level.
        table = b"the pool's own table"
        pool.client.shared.set(pool.session, "table", table)
        out = pool.map([0, 1], requires=[("table", 1)])
        for r in out:
            self.assertEqual(r["files"]["table"][:4], (pool.session, "table", 1, table))
            self.assertEqual(r["files"][name][2:4], (1, level1))

    def test_a_missing_level_fails_the_job_after_its_attempts(self):
        for setup in SETUPS:
            with self.subTest(setup=setup):
                pool = self.pool(setup)
                name = "never-" + setup
                with self.assertRaises(muster.TaskError) as caught:
                    pool.map([7], requires=[("models", name, 1)], timeout=120)
                err = caught.exception
                self.assertEqual(err.state, "dead")
                self.assertEqual(err.error, "required shared data models/%s level 1: "
                                 "shared_not_found: shared data not found: '%s' in scope "
                                 "'models' ('%s' was never set, or was deleted)"
                                 % (name, name, name), self.logs())
                task = self.client.tasks(setup, state="dead")["tasks"][-1]
                self.assertEqual(task["attempts"], MAX_ATTEMPTS)

    def test_a_timeout_says_what_the_jobs_keep_failing_with(self):
        # Jobs that fail on every attempt give no result until their attempts are spent: a
        # call that runs out of time first said only that its results were not all in.
        self.client.put_queue("standalone", max_attempts=1000, backoff_ms=100,
                              backoff_max_ms=100)
        self.addCleanup(self.client.put_queue, "standalone", max_attempts=MAX_ATTEMPTS,
                        backoff_ms=BACKOFF_MS, backoff_max_ms=BACKOFF_MS)
        pool = self.pool("standalone")
        results = pool.imap([1, 2], requires=[("models", "never-there", 1)], timeout=1)

        def failed_twice():
            tasks = [t for t in self.client.iter_tasks("standalone")
                     if t["session"] == pool.session]
            return len(tasks) == 2 and all(t["attempts"] >= 2 for t in tasks)
        harness.wait_until(failed_twice, timeout=60, what="both jobs failed\n" + self.logs())
        with self.assertRaises(TimeoutError) as caught:
            next(results)
        text = str(caught.exception)
        error = ("required shared data models/never-there level 1: shared_not_found: shared "
                 "data not found: 'never-there' in scope 'models' ('never-there' was never "
                 "set, or was deleted)")
        self.assertRegex(text, r"0 of this call's 2 results were read; 2 of this call's "
                         r"unfinished jobs failed at least once and wait to be tried again, "
                         r"the newest first: job [01] \(attempt \d+\): %s \(and 1 more with "
                         r"these errors\)\. The session is still open" % re.escape(error))

    def test_a_level_uploaded_between_attempts_is_used_by_the_retry(self):
        for setup in SETUPS:
            with self.subTest(setup=setup):
                pool = self.pool(setup)
                name = "late-" + setup
                got = {}
                run = threading.Thread(target=lambda: got.update(out=pool.map(
                    [3], requires=[("models", name, 1)], timeout=120)))
                run.start()

                def failed_once():
                    tasks = self.client.tasks(setup)["tasks"]
                    return tasks and tasks[-1]["session"] == pool.session and \
                        tasks[-1]["attempts"] >= 1 and tasks[-1].get("error")
                harness.wait_until(failed_once, timeout=60, what="a first attempt\n" + self.logs())
                self.assertIn("required shared data models/%s level 1: shared_not_found"
                              % name, self.client.tasks(setup)["tasks"][-1]["error"])
                data = self.upload("models", name, 1)
                run.join(timeout=120)
                self.assertEqual(got["out"][0]["files"][name][3], data, self.logs())

    def test_the_class_is_read_through_the_node_cache(self):
        for setup in SETUPS:
            with self.subTest(setup=setup):
                before = self.cache_stats()
                pool = self.pool(setup)
                self.assertEqual([r["x"] for r in pool.map(range(8), timeout=120)],
                                 list(range(8)))
                cached = glob.glob(os.path.join(self.cache_dir, pool.session, "worker_class@1@*"))
                if setup == "standalone":
                    self.assertEqual((self.fetched(before)[0], cached), (0, []))
                else:
                    self.assertEqual(self.fetched(before)[0], 1, self.logs())
                    self.assertEqual(len(cached), 1)

    def test_a_standalone_worker_removes_its_files_when_it_exits(self):
        self.client.put_queue("exits")
        data = self.upload("models", "exits", 1)
        workers = [self.start_standalone("exits", url) for url in (self.agent.url, None)]
        try:
            pool = self.pool("exits", requires=[("models", "exits", 1)])
            harness.wait_until(lambda: pool.get_workers_count() == 2, timeout=30,
                               what="2 workers\n" + self.logs())
            # One job held at a gate on each worker (a worker runs one at a time), so that
            # both fetch the level: with free jobs, a worker registered but slow to lease
            # (a loaded machine) could see the other run them all and hold no files.
            gates = [os.path.join(self.tmp, "gate-exits-%d" % i) for i in range(2)]
            got = {}
            run = threading.Thread(target=lambda: got.update(out=pool.map(
                [{"args": [i], "kwargs": {"gate": g}} for i, g in enumerate(gates)],
                timeout=120)))
            run.start()
            try:
                harness.wait_until(lambda: all(os.path.exists(g + ".started") for g in gates),
                                   timeout=60, what=lambda: "a job held on each worker\n" +
                                   self.logs())
            finally:
                for g in gates:
                    open(g, "w").close()
            run.join(timeout=120)
            out = got["out"]
            self.assertEqual({r["files"]["exits"][3] for r in out}, {data})
            dirs = {w.pid: glob.glob(os.path.join(self.cache_dir, "@links", "%d-*" % w.pid)) +
                    glob.glob(os.path.join(self.tmp, "%d-*" % w.pid)) for w in workers}
            for w in workers:
                self.assertEqual(len(dirs[w.pid]), 1, dirs)
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(timeout=30)
        for w in workers:
            self.assertEqual(w.returncode, 0)
            self.assertFalse(os.path.exists(dirs[w.pid][0]), dirs[w.pid][0])

    def test_a_standalone_worker_lets_go_of_a_level_the_node_cache_dropped(self):
        data = self.upload("models", "dropped", 1)
        pool = self.pool("standalone-cache", requires=[("models", "dropped", 1)])
        self.assertEqual({r["files"]["dropped"][3] for r in pool.map(range(4), timeout=120)},
                         {data})
        self.assertNotEqual(self.worker_files("models@dropped@1"), [])
        # Deleted at the head: the node cache removes its file at the next read of it, and
        # the workers their links at their next heartbeat.
        self.client.shared.delete("models", "dropped")
        with muster.Client(self.agent.url, self.head.token) as c:
            with self.assertRaises(muster.SharedNotFound):
                c.shared.get("models", "dropped", level=1)
        harness.wait_until(lambda: not self.worker_files("models@dropped@1"), timeout=30,
                           what="the workers' links to go\n" + self.logs())

    def test_a_level_in_use_stays_when_the_node_cache_drops_it(self):
        # A running job's level is not let go of, even when the node cache's file goes.
        data = self.upload("models", "in-use", 1)
        pool = self.pool("standalone-cache", requires=[("models", "in-use", 1)])
        gate = os.path.join(self.tmp, "gate-in-use")
        got = {}
        run = threading.Thread(target=lambda: got.update(out=pool.map(
            [{"args": [0], "kwargs": {"gate": gate}}], timeout=120)))
        run.start()
        try:
            harness.wait_until(lambda: os.path.exists(gate + ".started"), timeout=60,
                               what="the job to start\n" + self.logs())
            self.client.shared.delete("models", "in-use")
            with muster.Client(self.agent.url, self.head.token) as c:
                with self.assertRaises(muster.SharedNotFound):
                    c.shared.get("models", "in-use", level=1)
            self.assertEqual(glob.glob(os.path.join(self.cache_dir, "models", "in-use@*")), [])
            # Two heartbeats of the worker running the job: it looked for levels to drop
            # (it says "running" from its first heartbeat after the job started).
            running = harness.wait_until(lambda: [
                w for w in self.client.workers() if w.get("progress") == "running"
                and w.get("queues") == ["standalone-cache"]], timeout=30, what="the worker")
            self.assertEqual(len(running), 1, running)
            seen = [running[0]["last_seen_ms"]]

            def beat():
                now = self.client.worker(running[0]["id"])["last_seen_ms"]
                if now != seen[-1]:
                    seen.append(now)
                return len(seen) >= 3
            harness.wait_until(beat, timeout=30, what="two heartbeats")
        finally:
            open(gate, "w").close()
        run.join(timeout=120)
        self.assertEqual(got["out"][0]["files"]["in-use"][3], data, self.logs())

    def test_a_download_is_a_read_only_file_of_the_level(self):
        # What a standalone worker without a node cache writes (client.shared.get_to
        # checks the bytes against the checksum: tests/python/test_shared_streams.py).
        data = os.urandom(100)
        self.client.shared.set("sums", "sum-100", data)
        path = os.path.join(self.tmp, "sum-100")
        size, checksum = _download_level(self.client, "sums", "sum-100", 1, path)
        self.assertEqual((size, checksum), (100, xxh64(data)))
        with open(path, "rb") as f:
            self.assertEqual(f.read(), data)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o444)
        # A level that is not there: nothing stored.
        with self.assertRaises(muster.SharedNotFound):
            _download_level(self.client, "sums", "sum-100", 2, path + "-missing")
        self.assertEqual(glob.glob(path + "-missing*"), [])

    def test_bad_requires_arguments_raise_before_anything_is_sent(self):
        sessions = len(self.client.sessions())
        for requires, error, text in (
                ({"scope": "m", "name": "w", "level": 1}, TypeError,
                 "muster.Pool: requires must be a list of shared-data levels"),
                (("m", "w", 1), TypeError, "write requires=[('m', 'w', 1)]"),
                ([("m", "w", 0)], ValueError, "requires[0]: level 0 of 'w': levels count from 1"),
                ([("m", "w", "1")], TypeError, "requires[0]: level '1' of 'w' is not an int"),
                ([("m", "w x", 1)], ValueError, "requires[0]: name 'w x' is not a blob's name"),
                ([("m/x", "w", 1)], ValueError, "requires[0]: scope 'm/x' is not a scope"),
                ([("m", "..", 1)], ValueError, "requires[0]: name '..' is not a blob's name: "
                 "1 to 128 characters of [A-Za-z0-9._-] other than '.' and '..' ('.' and '..' "
                 "are no names: URLs collapse them)"),
                ([(".", "w", 1)], ValueError, "requires[0]: scope '.' is not a scope"),
                ([("m", "w", 1), ("m", "w", 2)], ValueError,
                 "requires[1]: 'w' of scope 'm' is required twice (levels 1 and 2)"),
                ([{"name": "w", "lvl": 1}], ValueError, "requires[0]: unknown key 'lvl'"),
                ([("m", "w", 1, 2)], TypeError, "requires[0]: expected"),
                ([("m", "w%d" % i, 1) for i in range(17)], ValueError,
                 "requires names 17 levels; a task may require at most 16")):
            with self.subTest(requires=requires):
                with self.assertRaises(error) as caught:
                    muster.Pool(Reader, url=self.head.url, token=self.head.token,
                                queue="never-made", requires=requires)
                self.assertIn(text, str(caught.exception))
        with self.assertRaises(muster.QueueNotFound):
            self.client.queue("never-made")
        self.assertEqual(len(self.client.sessions()), sessions)

        pool = self.pool("standalone", requires=[("m", "w%d" % i, 1) for i in range(10)])
        for call in (pool.map, pool.imap, pool.imap_unordered):
            with self.subTest(call=call.__name__):
                with self.assertRaises(ValueError) as caught:
                    call([1], requires=[("m", "w", -1)])
                self.assertIn("muster.Pool.%s: requires[0]: level -1" % call.__name__,
                              str(caught.exception))
                with self.assertRaises(ValueError) as caught:
                    call([1], requires=[("m", "x%d" % i, 1) for i in range(7)])
                self.assertIn("with the pool's, its tasks would require 17 levels",
                              str(caught.exception))
                # A blob of the pool's session named both ways is one blob twice.
                with self.assertRaises(ValueError) as caught:
                    call([1], requires=[("w", 1), (pool.session, "w", 2)])
                self.assertIn("muster.Pool.%s: requires: 'w' of the pool's session is required "
                              "twice (levels 1 and 2)" % call.__name__, str(caught.exception))
        self.assertEqual(self.client.session(pool.session)["counts"]["total"], 0)


if __name__ == "__main__":
    unittest.main()
