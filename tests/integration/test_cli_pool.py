"""The pool commands of the CLI against a real head: map (ordered, unordered, failures,
the progress bar on a terminal), session create|ls|show|put|results|close, update,
nodes and workers.

One `muster worker` squares numbers for every test (a line starting with "bad" makes
it fail); each test uses its own inputs.  Nothing waits on a timer: commands run to
completion and state is polled with harness.wait_until.
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
QUEUE = "cp"
SQUARE = 'read x; case "$x" in bad*) echo "refused $x" >&2; exit 3;; esac; echo $((x * x))'
COMMANDS = [["map"], ["nodes"], ["workers"], ["update"], ["session", "create"],
            ["session", "ls"], ["session", "show"], ["session", "put"],
            ["session", "results"], ["session", "close"]]


class CliPoolTest(unittest.TestCase):
    head = None

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head()
        cls.head.start()
        cls.env = dict(os.environ, MUSTER_URL=cls.head.url, MUSTER_TOKEN=cls.head.token)
        cls.tmp = tempfile.mkdtemp(prefix="muster-cli-pool-")
        cls.run_cli("queue", "create", QUEUE, "--max-attempts", "1")
        cls.worker_log = open(os.path.join(cls.tmp, "worker.log"), "wb")
        cls.worker = subprocess.Popen(
            [MUSTER, "worker", "--queue", QUEUE, "--concurrency", "2", "--", "sh", "-c", SQUARE],
            env=cls.env, stdout=cls.worker_log, stderr=subprocess.STDOUT)

    @classmethod
    def tearDownClass(cls):
        cls.worker.terminate()
        cls.worker.wait(timeout=20)
        cls.worker_log.close()
        cls.head.cleanup()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def run_cli(cls, *args, stdin=""):
        return subprocess.run([MUSTER] + list(args), input=stdin, env=cls.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)

    def ok(self, *args, stdin=""):
        proc = self.run_cli(*args, stdin=stdin)
        self.assertEqual(proc.returncode, 0, "%s: %s" % (args, proc.stderr))
        return proc

    def test_help(self):
        for words in COMMANDS:
            proc = self.run_cli(*words, "--help")
            self.assertEqual(proc.returncode, 0, words)
            self.assertIn("usage: muster " + " ".join(words), proc.stdout)
        self.assertIn("map", self.ok("--help").stdout)
        self.assertIn("session results", self.ok("session", "--help").stdout)

    def test_map_ordered(self):
        proc = self.ok("map", "--queue", QUEUE, "--ordered",
                       stdin="".join("%d\n" % i for i in range(1, 201)))
        self.assertEqual(proc.stdout.splitlines(), [str(i * i) for i in range(1, 201)])
        self.assertEqual(proc.stderr, "")  # not a terminal: no progress bar

    def test_map_unordered_with_index(self):
        proc = self.ok("map", "--queue", QUEUE, "--with-index",
                       stdin="".join("%d\n" % i for i in range(60)))
        pairs = [line.split("\t") for line in proc.stdout.splitlines()]
        self.assertEqual(sorted(int(i) for i, _ in pairs), list(range(60)))
        for index, value in pairs:
            self.assertEqual(int(value), int(index) ** 2)

    def test_map_failure_keeps_lines_aligned(self):
        proc = self.run_cli("map", "--queue", QUEUE, "--ordered", stdin="2\nbad one\n\n3\n")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertEqual(proc.stdout.splitlines(), ["4", "", "9"])
        self.assertIn("input 1", proc.stderr)
        self.assertIn("refused bad one", proc.stderr)
        self.assertIn("1 of 3 inputs failed", proc.stderr)
        proc = self.run_cli("map", "--queue", QUEUE, "--ordered", "--json-output",
                            stdin="2\nbad two\n")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertEqual(proc.stdout.splitlines(), ['"4"', "null"])

    def test_map_json_and_usage_errors(self):
        proc = self.run_cli("map", "--queue", QUEUE, "--json", stdin="1\n{bad\n")
        self.assertEqual(proc.returncode, 1)
        self.assertIn("stdin line 2", proc.stderr)
        self.assertEqual(self.run_cli("map", stdin="1\n").returncode, 2)
        self.assertEqual(self.run_cli("map", "--queue", QUEUE, "--timeout-ms", "x").returncode, 2)
        proc = self.ok("map", "--queue", QUEUE, "--json", "--ordered", stdin="4\n5\n")
        self.assertEqual(proc.stdout.splitlines(), ["16", "25"])

    def test_map_says_when_no_worker_serves_its_queue(self):
        # It waited in silence for ever: a node agent started without --queue, or a
        # typo in the queue's name (map creates the queue it is given), looked like a hang.
        proc = subprocess.Popen([MUSTER, "map", "--queue", "cp-idle"], env=self.env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdin.write("3\n")
        proc.stdin.close()
        try:
            ready, _, _ = select.select([proc.stderr], [], [], 30)
            self.assertTrue(ready, "map said nothing about the queue without workers")
            self.assertEqual(proc.stderr.readline(),
                             "muster: no worker serves queue 'cp-idle' yet: the inputs wait for "
                             "one; start one with `muster worker --queue cp-idle -- CMD`, or a "
                             "node agent with --queue cp-idle\n")
            # Its session's heartbeat timeout is the default `map --help` states for
            # --timeout-ms (it said "the head's", which no head option sets).
            text = " ".join(self.ok("map", "--help").stdout.split())
            stated = re.search(r"--timeout-ms MS [^-]*\(default (\d+)\)", text)
            self.assertIsNotNone(stated, text)
            sessions = json.loads(self.ok("session", "ls", "--json").stdout)["sessions"]
            self.assertEqual([s["timeout_ms"] for s in sessions if s["queue"] == "cp-idle"],
                             [int(stated.group(1))])
            # The inputs did wait: a worker that comes now runs them, and map ends well.
            self.ok("worker", "--queue", "cp-idle", "--max-tasks", "1", "--", "sh", "-c", SQUARE)
            self.assertEqual(proc.stdout.read(), "9\n")
            self.assertEqual(proc.wait(timeout=60), 0)
            # map made the queue (a typo makes a new one): the hint says so, which a queue
            # that existed before it does not hear (test_map_idle_hint_on_an_existing_queue);
            # and it is said once.
            self.assertEqual(proc.stderr.read(),
                             "muster: queue 'cp-idle' did not exist before this map, which "
                             "created it: if the name is mistyped, stop map (Ctrl-C) and see "
                             "`muster queue ls`\n")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def test_map_idle_hint_on_an_existing_queue(self):
        # A queue made before map, whose workers are late, is not called new.
        self.ok("queue", "create", "cp-idle-old")
        proc = subprocess.Popen([MUSTER, "map", "--queue", "cp-idle-old"], env=self.env,
                                text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdin.write("5\n")
        proc.stdin.close()
        try:
            ready, _, _ = select.select([proc.stderr], [], [], 30)
            self.assertTrue(ready, "map said nothing about the queue without workers")
            self.assertTrue(proc.stderr.readline().startswith(
                "muster: no worker serves queue 'cp-idle-old' yet: "))
            self.ok("worker", "--queue", "cp-idle-old", "--max-tasks", "1", "--", "sh", "-c",
                    SQUARE)
            self.assertEqual(proc.stdout.read(), "25\n")
            self.assertEqual(proc.wait(timeout=60), 0)
            self.assertEqual(proc.stderr.read(), "")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def test_map_progress_on_a_terminal(self):
        master, slave = os.openpty()
        proc = subprocess.Popen([MUSTER, "map", "--queue", QUEUE, "--ordered"], env=self.env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks = []

        def drain():  # the terminal must be read while map writes to it
            while True:
                ready, _, _ = select.select([master], [], [], 30)
                try:
                    data = os.read(master, 4096) if ready else b""
                except OSError:
                    data = b""
                if not data:
                    return
                chunks.append(data)

        reader = threading.Thread(target=drain)
        reader.start()
        out, _ = proc.communicate("".join("%d\n" % i for i in range(40)).encode(), timeout=120)
        reader.join(timeout=30)
        os.close(master)
        bar = b"".join(chunks).decode(errors="replace")
        self.assertEqual(proc.returncode, 0, bar)
        self.assertEqual(len(out.splitlines()), 40)
        self.assertIn("40/40", bar)
        self.assertIn("100%", bar)
        self.assertIn("/s", bar)
        self.assertIn("ETA", bar)
        proc = self.ok("map", "--queue", QUEUE, "--quiet", stdin="1\n")
        self.assertEqual(proc.stderr, "")

    def test_session_commands(self):
        sid = self.ok("session", "create", "--queue", QUEUE, "--no-cleanup",
                      "--init-data", '{"k": 1}').stdout.strip()
        self.assertTrue(sid.startswith("s-"), sid)
        put = self.ok("session", "put", sid, stdin="1\n2\n3\n4\n5\n").stdout.splitlines()
        self.assertEqual([line.split("\t")[0] for line in put], ["0", "1", "2", "3", "4"])
        self.assertIn(sid, self.ok("session", "ls").stdout)
        listed = json.loads(self.ok("session", "ls", "--json").stdout)["sessions"]
        self.assertIn(sid, [s["id"] for s in listed])
        values = self.ok("session", "results", sid, "--follow", "--values").stdout.splitlines()
        self.assertEqual(values, ["1", "4", "9", "16", "25"])
        first = self.ok("session", "results", sid, "--max", "2")
        rows = [json.loads(line) for line in first.stdout.splitlines()]
        self.assertEqual([r["index"] for r in rows], [0, 1])
        self.assertEqual(rows[1]["result"], "4")
        self.assertIn("cursor: 2", first.stderr)
        rest = self.ok("session", "results", sid, "--cursor", "2").stdout.splitlines()
        self.assertEqual([json.loads(line)["index"] for line in rest], [2, 3, 4])
        done = self.ok("session", "results", sid, "--order", "completion")
        seqs = [json.loads(line)["seq"] for line in done.stdout.splitlines()]
        self.assertEqual(len(seqs), 5)
        self.assertEqual(seqs, sorted(seqs))
        self.assertIn("cursor: %d" % seqs[-1], done.stderr)
        self.assertEqual(self.run_cli("session", "results", sid, "--order", "x").returncode, 2)
        shown = json.loads(self.ok("session", "show", sid).stdout)
        self.assertEqual(shown["init_data"], {"k": 1})
        self.assertEqual(shown["counts"]["done"], 5)
        self.assertIn("closed session " + sid, self.ok("session", "close", sid).stdout)
        gone = self.run_cli("session", "show", sid)
        self.assertEqual(gone.returncode, 1)
        self.assertIn("session_not_found", gone.stderr)
        self.assertEqual(self.run_cli("session", "create").returncode, 2)
        self.assertIn("queue_not_found",
                      self.run_cli("session", "create", "--queue", "nope").stderr)

    def test_session_results_at_a_gap(self):
        """Explicit indexes 0 and 3 (put over HTTP: `session put` numbers its inputs) leave
        1-2 without a task: once both have their results, `session results` says so and
        exits 1 where it stopped, with --follow too, rather than wait for ever; read past the
        gap or in completion order it is fine, and once the gap is filled it reads through."""
        sid = self.ok("session", "create", "--queue", QUEUE, "--no-cleanup").stdout.strip()
        path = "/v1/sessions/%s/tasks" % sid

        def put(*indexes):
            tasks = [{"payload": str(i + 1), "index": i} for i in indexes]
            self.assertEqual(self.head.request("POST", path, {"tasks": tasks}).status, 201)

        def done(n):
            harness.wait_until(
                lambda: json.loads(self.ok("session", "show", sid).stdout)["counts"]["done"] == n,
                timeout=30, what="%d results" % n)
        put(0, 3)
        done(2)
        for args, printed in ((["--follow", "--values"], ["1"]), ([], [0]),
                              (["--cursor", "1", "--follow"], [])):
            proc = self.run_cli("session", "results", sid, *args)
            self.assertEqual(proc.returncode, 1, (args, proc.stderr))
            lines = proc.stdout.splitlines()
            self.assertEqual(lines if "--values" in args else
                             [json.loads(line)["index"] for line in lines], printed)
            self.assertIn("muster: index_gap: session %s: index 1 has no task (indexes 1-2 were"
                          " never submitted, or purged)" % sid, proc.stderr)
            self.assertIn("cursor: 1", proc.stderr)
        self.assertEqual(self.ok("session", "results", sid, "--cursor", "3", "--follow",
                                 "--values").stdout.splitlines(), ["16"])
        unordered = self.ok("session", "results", sid, "--order", "completion", "--follow",
                            "--values")
        self.assertEqual(sorted(unordered.stdout.splitlines()), ["1", "16"])
        put(2, 1)
        done(4)
        proc = self.ok("session", "results", sid, "--follow", "--values")
        self.assertEqual(proc.stdout.splitlines(), ["1", "4", "9", "16"])
        self.assertIn("cursor: 4", proc.stderr)
        self.ok("session", "close", sid)

    def test_update(self):
        first = int(self.ok("update", "--queue", QUEUE, "--json", '{"lr": 0.1}').stdout)
        second = int(self.ok("update", "--queue", QUEUE, "plain text").stdout)
        self.assertEqual(second, first + 1)
        reply = self.head.request("GET", "/v1/queues/%s/updates?after=%d" % (QUEUE, first - 1))
        data = [u["data"] for u in reply.json["updates"]]
        self.assertEqual(data, [{"lr": 0.1}, "plain text"])
        self.assertEqual(self.run_cli("update", "--queue", QUEUE, "--json", "{bad").returncode, 1)
        self.assertEqual(self.run_cli("update", "x").returncode, 2)
        self.assertIn("queue_not_found", self.run_cli("update", "--queue", "nope", "1").stderr)

    def test_workers_table_shows_no_control_characters(self):
        # A worker's progress is any text it sends (through the DistCompute routes,
        # anyone's, no token needed), and `muster workers` prints it to an operator's
        # terminal: an ESC there could clear the screen or retitle the window, a line
        # break forge a row.  Each control character shows as '?'.
        reply = self.head.request("POST", "/v1/workers", body={"queues": ["esc"]})
        self.assertEqual(reply.status, 201, reply)
        progress = "50%\x1b[2J\x1b]0;title\x07\r\n7  forged  -  active\x7f\u009b31m!"
        reply = self.head.request("POST", "/v1/workers/%d/heartbeat" % reply.json["id"],
                                  body={"progress": progress})
        self.assertEqual(reply.status, 200, reply)
        table = self.ok("workers", "--queue", "esc").stdout
        self.assertEqual(len(table.splitlines()), 2, table)
        self.assertTrue(table.splitlines()[1].endswith(
            "50%?[2J?]0;title???7  forged  -  active??31m!"), table)

    def test_workers_and_nodes(self):
        harness.wait_until(lambda: QUEUE in self.ok("workers").stdout, what="the worker listed")
        table = self.ok("workers", "--queue", QUEUE).stdout.splitlines()
        self.assertTrue(table[0].split()[:3] == ["ID", "NAME", "NODE"], table)
        self.assertIn("active", table[1])
        self.assertEqual(len(self.ok("workers", "--queue", "other").stdout.splitlines()), 1)
        workers = json.loads(self.ok("workers", "--json").stdout)["workers"]
        self.assertTrue(any(QUEUE in w["queues"] for w in workers))
        self.assertEqual(self.ok("nodes").stdout.split()[:2], ["NAME", "STATE"])
        self.assertIsInstance(json.loads(self.ok("nodes", "--all", "--json").stdout)["nodes"], list)


class RequestLog:
    """A TCP proxy to a head's `port` that forwards everything and notes the target
    (path and query) of every request line it forwards, with the time it came, in
    `requests`: how often, and asking what, a client calls."""

    REQUEST_LINE = re.compile(rb"(?:GET|POST|PUT|DELETE) (\S+) HTTP/1\.1\r\n")

    def __init__(self, port):
        self.port, self.requests, self.lock = port, [], threading.Lock()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def targets(self, prefix):
        with self.lock:
            return [(t, at) for t, at in self.requests if t.startswith(prefix)]

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            head = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pipe, args=(client, head, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(head, client, False), daemon=True).start()

    def _pipe(self, source, sink, note):
        """Forwards `source` to `sink` until either ends; then ends both, and closes
        `source` (the other direction's thread closes `sink`)."""
        pending = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if note:  # a request line may come in pieces: look at what is complete
                    pending += data
                    end = pending.rfind(b"\r\n")
                    with self.lock:
                        for m in self.REQUEST_LINE.finditer(pending, 0, end + 2):
                            self.requests.append((m.group(1).decode(), time.monotonic()))
                    pending = pending[end + 2:] if end >= 0 else pending
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        source.close()


class FollowWaitTest(unittest.TestCase):
    """How `session results --follow` (and `map`, through libmuster's pool) waits on an
    idle session: each read as long as the head lets one wait, no more often than once a
    second, and a signal ends it at once all the same."""

    def follow(self, head_args):
        head = harness.Head(head_args).start()
        self.addCleanup(head.cleanup)
        proxy = RequestLog(head.port)
        self.addCleanup(proxy.close)
        env = dict(os.environ, MUSTER_URL=proxy.url, MUSTER_TOKEN=head.token)
        cli = dict(env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(subprocess.run([MUSTER, "queue", "create", "idle"], **cli).returncode, 0)
        sid = subprocess.run([MUSTER, "session", "create", "--queue", "idle", "--no-cleanup"],
                             **cli).stdout.strip()
        subprocess.run([MUSTER, "session", "put", sid], input="1\n", **cli)  # no worker runs it
        follower = subprocess.Popen([MUSTER, "session", "results", sid, "--follow"], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(follower.kill)
        return follower, proxy, "/v1/sessions/%s/results" % sid

    def test_follow_waits_as_long_as_the_head_allows(self):
        # It long-polled a second at a time: an idle follow cost a request a second.
        follower, proxy, path = self.follow(["--max-wait-ms", "45000"])
        waits = harness.wait_until(
            lambda: [t for t, _ in proxy.targets(path) if "wait_ms=" in t],
            what="a read that waits")
        self.assertEqual(waits[0].split("wait_ms=")[1].split("&")[0], "45000", waits)
        # A signal ends it at once, not when the head answers the read under way.
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=20)
        self.assertEqual((follower.returncode, out), (1, ""), err)
        self.assertEqual(err, "cursor: 0\nmuster: stopped by a signal; read on with --cursor 0\n")
        self.assertEqual(len(proxy.targets(path)), 2)  # the first read, which never waits

    def test_follow_paces_a_head_that_lets_no_read_wait(self):
        # With --max-wait-ms 0 every read is answered at once: read again at once, the
        # follower kept the head busy.
        follower, proxy, path = self.follow(["--max-wait-ms", "0"])
        reads = harness.wait_until(lambda: [at for _, at in proxy.targets(path)][2:4]
                                   if len(proxy.targets(path)) >= 4 else None,
                                   timeout=30, what="four reads")
        self.assertGreaterEqual(reads[1] - reads[0], 0.9, reads)
        follower.send_signal(signal.SIGTERM)
        err = follower.communicate(timeout=20)[1]
        self.assertEqual(follower.returncode, 1, err)
        self.assertTrue(err.endswith("muster: stopped by a signal; read on with --cursor 0\n"),
                        err)


    def test_map_paces_a_head_that_lets_no_read_wait(self):
        # libmuster's pool read results again at once when the head answered at once
        # (--max-wait-ms 0): `muster map` waiting for a worker kept the head busy.
        head = harness.Head(["--max-wait-ms", "0"]).start()
        self.addCleanup(head.cleanup)
        proxy = RequestLog(head.port)
        self.addCleanup(proxy.close)
        env = dict(os.environ, MUSTER_URL=proxy.url, MUSTER_TOKEN=head.token)
        mapper = subprocess.Popen([MUSTER, "map", "--queue", "unserved"], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.addCleanup(lambda: mapper.poll() is None and (mapper.kill(), mapper.wait()))
        mapper.stdin.write("1\n")
        mapper.stdin.close()
        reads = harness.wait_until(
            lambda: [at for t, at in proxy.targets("/v1/sessions/") if "/results" in t][1:4]
            if len([t for t, _ in proxy.targets("/v1/sessions/") if "/results" in t]) >= 4
            else None, timeout=30, what="four result reads")
        self.assertGreaterEqual(min(b - a for a, b in zip(reads, reads[1:])), 0.9, reads)

if __name__ == "__main__":
    unittest.main(verbosity=2)
