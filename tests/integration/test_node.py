"""Node agent: GPU detection (a fake nvidia-smi), one agent per machine, worker
supervision (a crash-looping task goes dead), and no orphans after `kill -9`."""
import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

# How long an agent or worker may take to reach a head started again after a kill: its
# next retry, then a call that the restarted head answers once its store is open; longer
# than harness.wait_until's default for a loaded machine running the sanitizer build.
AFTER_RESTART_S = 30

UUID0 = "GPU-a1599801-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
UUID1 = "GPU-a1b2c3d4-5e6f-4a1b-9c2d-3e4f5a6b7c8d"
FAKE_SMI = textwrap.dedent("""\
    #!/bin/sh
    # A fake nvidia-smi with two GPUs: 0 (16 GB) and 1 (8 GB; a comma in its name).
    case "$*" in
      *--query-gpu=index,uuid,name,memory.total,memory.free*)
        echo "0, %(u0)s, Fake GPU Alpha, 16160, 15000"
        echo "1, %(u1)s, Fake GPU Beta, 8GB, 8080, 7000" ;;
      -L)
        echo "GPU 0: Fake GPU Alpha (UUID: %(u0)s)"
        echo "GPU 1: Fake GPU Beta, 8GB (UUID: %(u1)s)" ;;
      *) exit 1 ;;
    esac
    """) % {"u0": UUID0, "u1": UUID1}
# The same GPUs from an nvidia-smi whose --query-gpu fails: only -L answers (names and
# UUIDs, no memory), with a MIG instance listed under GPU 0 as a GPU in MIG mode shows it
# (then the instance stands for GPU 0: test_node_mig.py).
FAKE_SMI_LIST_ONLY = textwrap.dedent("""\
    #!/bin/sh
    case "$*" in
      -L)
        echo "GPU 0: Fake GPU Alpha (UUID: %(u0)s)"
        echo "  MIG 1g.10gb     Device  0: (UUID: MIG-0d1e2f3a-4b5c-5d6e-8f7a-8b9c0d1e2f3a)"
        echo "GPU 1: Fake GPU Beta, 8GB (UUID: %(u1)s)" ;;
      *) exit 1 ;;
    esac
    """) % {"u0": UUID0, "u1": UUID1}
# An nvidia-smi too old to know the uuid field of --query-gpu (it refuses the query).
FAKE_SMI_NO_UUID = textwrap.dedent("""\
    #!/bin/sh
    case "$*" in
      *--query-gpu=index,name,memory.total,memory.free*)
        echo "0, Fake GPU Alpha, 16160, 15000"
        echo "1, Fake GPU Beta, 8GB, 8080, 7000" ;;
      *) echo 'Field "uuid" is not a valid field to query.' >&2; exit 2 ;;
    esac
    """)


def busy_head(port):
    """An HTTP server on `port` (the head's) that answers every request 503, as a head
    that is starting; returns it and the (method, path) of the requests it got."""
    paths = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def answer(self):
            paths.append((self.command, self.path))
            body = b'{"error": {"code": "unavailable", "message": "the head is starting"}}'
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = answer

        def log_message(self, *args):
            pass

    busy = http.server.HTTPServer(("127.0.0.1", port), Busy)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    return busy, paths


class NodeTestCase(AgentsCase):
    head_args = ["--node-timeout-ms", "1500", "--worker-timeout-ms", "60000"]

    def agent(self, *args, **kw):
        a = Agent(self.head, self.dir, *args, **kw)
        self.agents.append(a)
        return a

    def fake_smi_env(self, script=FAKE_SMI):
        bin_dir = os.path.join(self.dir, "bin-%x" % abs(hash(script)))
        os.makedirs(bin_dir, exist_ok=True)
        path = os.path.join(bin_dir, "nvidia-smi")
        with open(path, "w") as f:
            f.write(script)
        os.chmod(path, 0o755)
        return {"PATH": bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin")}

    def refusal(self, name, args, visible=None, script=FAKE_SMI, env=None):
        """The log of an agent that exits 2 at start, as for any bad argument."""
        env = dict(env or {}, **self.fake_smi_env(script))
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        a = self.agent(name, args=args, env=env)
        a.start(wait_listen=False)
        self.assertEqual(a.proc.wait(20), 2, a.log())
        return a.log()

    def make_queue(self, name, **settings):
        r = self.head.request("PUT", "/v1/queues/" + name, settings)
        self.assertIn(r.status, (200, 201), r)

    def put(self, queue, payloads):
        r = self.head.request("POST", "/v1/queues/%s/tasks" % queue,
                              {"tasks": [{"payload": p} for p in payloads]})
        self.assertEqual(r.status, 201, r)
        return [t["id"] for t in r.json["tasks"]]

    def task(self, tid):
        return self.head.request("GET", "/v1/tasks/%d" % tid).json

    def node(self, name):
        r = self.head.request("GET", "/v1/nodes/" + name)
        return r.json if r.status == 200 else None

    def wait_workers(self, agent, count, what="workers"):
        """Waits until the agent has `count` worker processes registered as workers, each
        of which told the agent its worker id.  The head counts a worker as it registers,
        before the worker reads the reply and writes its id down the agent's pipe: one
        killed in between has its crash reported by its instance, not by its id ("which
        died before it told its worker id, by its instance ..."), which a test counting
        reports by id would miss.  A worker's first line naming its id ("registered as NAME (id N); waiting for
        queue Q" or "NAME (id N) on queue Q") comes after it told the agent, and after its
        heartbeat started."""
        def told_agent(pid, log):
            line = r"^worker \d+ \((?:gpu [^()]*, )?pid %d\): muster worker: .*\(id \d+\)" % pid
            return re.search(line, log, re.M)

        def ready():
            pids = agent.workers()
            node = self.node(agent.name)
            if len(pids) != count or not node or node["workers"] != count:
                return None
            log = agent.log()
            return pids if all(told_agent(pid, log) for pid in pids) else None
        return harness.wait_until(ready, timeout=20, what=lambda: what + ":\n" + agent.log())


class HeadLocalNodeTest(unittest.TestCase):
    def test_missing_command_refused_before_the_head_starts(self):
        data = tempfile.mkdtemp(prefix="muster-node-test-")
        try:
            r = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                "--data-dir", data, "--queue", "q", "--", "/nonexistent/cmd"],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("muster head: cannot run '/nonexistent/cmd'", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(data, "url")))
        finally:
            shutil.rmtree(data, ignore_errors=True)

    def test_options_of_the_agents_port_refused_with_the_reason(self):
        """--cache-dir, --cache-bytes and --state-dir are for an agent's API port, which
        the head's local agent does not open: `muster head` says so (it said
        "unrecognized option"), with or without --server-only, before starting."""
        data = tempfile.mkdtemp(prefix="muster-node-test-")
        self.addCleanup(shutil.rmtree, data, True)
        for args in (["--cache-dir", data], ["--state-dir=" + data], ["--cache-bytes", "5G"],
                     ["--server-only", "--cache-dir", data]):
            r = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                "--data-dir", data] + args,
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            option = [a for a in args if a != "--server-only"][0].split("=")[0]
            self.assertIn("muster head: %s is an option of `muster node`" % option, r.stderr)
            self.assertIn("opens no API port", r.stderr)
            self.assertNotIn("unrecognized", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(data, "url")), r.stderr)

    def start_head_with_node(self, workers, command):
        """`muster head` without --server-only: the head and a local node agent with
        `workers` workers running `command` on queue q, which it creates."""
        work = tempfile.mkdtemp(prefix="muster-head-node-test-")
        self.addCleanup(shutil.rmtree, work, True)
        head = harness.Head(data_dir=os.path.join(work, "data"))
        head.work = work
        os.makedirs(head.data_dir)
        env = node_harness.no_gpu_env(
            dict(os.environ, MUSTER_NODE_LOCK=os.path.join(work, "node.lock")))
        with open(head.log_path, "ab") as log:
            proc = subprocess.Popen([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                     "--data-dir", head.data_dir, "--token", head.token,
                                     "--queue", "q", "--workers", str(workers), "--"] + command,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        self.addCleanup(lambda: proc.poll() is None and os.killpg(proc.pid, signal.SIGKILL))
        url_file = os.path.join(head.data_dir, "url")

        def listening():
            if proc.poll() is not None:
                raise AssertionError("head exited:\n" + head.log())
            with open(url_file) if os.path.exists(url_file) else open(os.devnull) as f:
                return f.read().strip()
        head.url = harness.wait_until(listening, timeout=20, what="the head's URL")
        harness.wait_until(lambda: head.request("GET", "/v1/nodes").json["nodes"],
                           timeout=20, what=lambda: "the local node:\n" + head.log())
        self.assertEqual(head.request("PUT", "/v1/queues/q", {}).status, 201)
        # A worker registers before its queue exists, then polls for it twice a second:
        # each says "on queue q" once it found it, and a stop before that ends it as
        # "stopped while waiting for queue q" (not what these tests stop).
        harness.wait_until(lambda: (lambda n: n and n[0]["workers"] == workers)(
            head.request("GET", "/v1/nodes").json["nodes"]),
            timeout=20, what=lambda: "the workers joined:\n" + head.log())
        harness.wait_until(lambda: head.log().count(" on queue q, ") == workers,
                           timeout=20, what=lambda: "the workers found q:\n" + head.log())
        return head, proc

    def exit_status(self, proc, head):
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError("the head did not exit:\n" + head.log()) from None

    def test_ctrl_c_stops_the_head_and_its_node_quietly(self):
        # Ctrl-C reaches the head (the agent has a process group of its own), which
        # stops its local node first.  All stop cleanly, and a goodbye or a long-poll
        # lease that meets the head stopping is no error to print.
        head, proc = self.start_head_with_node(2, ["cat"])
        r = head.request("POST", "/v1/queues/q/tasks", {"tasks": [{"payload": "a"},
                                                                 {"payload": "b"}]})
        self.assertEqual(r.status, 201, r)
        harness.wait_until(
            lambda: head.request("GET", "/v1/queues/q").json["counts"]["done"] == 2,
            timeout=20, what=lambda: "the workers' tasks:\n" + head.log())
        os.killpg(proc.pid, signal.SIGINT)
        self.assertEqual(self.exit_status(proc, head), 0, head.log())
        log = head.log()
        self.assertIn("stopping the local node first", log)
        self.assertIn("the local node stopped; shutting down", log)
        self.assertIn("stopped cleanly", log)
        self.assertRegex(log, r"\(local node\): node \S+ stopped")
        self.assertEqual(len(re.findall(r"muster worker: \S+ stopped: ", log)), 2, log)
        self.assertNotIn("leaving:", log)
        self.assertNotIn("unavailable", log)

    def test_a_head_killed_leaves_a_local_node_that_says_why_it_stops(self):
        # kill -9 of the head: its local node gets SIGHUP from the kernel (the parent's
        # death signal) and stops.  It said "got SIGHUP", a signal nobody sent; found
        # by walk-chaos.
        head, proc = self.start_head_with_node(1, ["cat"])
        proc.kill()
        proc.wait(10)
        harness.wait_until(lambda: re.search(r"\(local node\): node \S+ stopped", head.log()),
                           timeout=20, what=lambda: "the local node stopped:\n" + head.log())
        log = head.log()
        self.assertIn("muster head (local node): the head (pid %d) exited without stopping "
                      "its local node: stopping the workers now\n" % proc.pid, log)
        self.assertNotIn("(local node): got SIGHUP", log)

    def running_task_on_fifo(self, script='read go < "$0"; cat'):
        """A head with one local worker whose task runs `script` (sh; $0 is a FIFO):
        (head, proc, fifo path) once that task's command runs.  Leased is not enough:
        a worker told to stop between its lease and the command's start gives the
        task back at once."""
        fifo = os.path.join(tempfile.mkdtemp(prefix="muster-fifo-"), "go")
        self.addCleanup(shutil.rmtree, os.path.dirname(fifo), True)
        os.mkfifo(fifo)
        started = fifo + ".started"
        head, proc = self.start_head_with_node(
            1, ["sh", "-c", ': > "$0.started"; ' + script, fifo])
        r = head.request("POST", "/v1/queues/q/tasks", {"tasks": [{"payload": "slow"}]})
        self.assertEqual(r.status, 201, r)
        harness.wait_until(lambda: os.path.exists(started), timeout=20,
                           what=lambda: "the task's command running:\n" + head.log())
        self.assertEqual(head.request("GET", "/v1/queues/q").json["counts"]["leased"], 1)
        return head, proc, fifo

    def test_ctrl_c_lets_the_local_workers_finish_and_stores_their_results(self):
        # The head outlives its local node's stop: a task running at Ctrl-C finishes
        # and its result is stored before the head exits.
        head, proc, fifo = self.running_task_on_fifo()
        os.killpg(proc.pid, signal.SIGINT)
        harness.wait_until(lambda: "finishing running tasks" in head.log(), timeout=20,
                           what=lambda: "the worker told to stop:\n" + head.log())
        # The head still answers while its node's worker finishes.
        self.assertEqual(head.request("GET", "/v1/queues/q").json["counts"]["leased"], 1)
        with open(fifo, "w") as f:
            f.write("go\n")
        self.assertEqual(self.exit_status(proc, head), 0, head.log())
        again = harness.Head(data_dir=head.data_dir)
        again.token = head.token
        again.start()
        self.addCleanup(again.stop)
        tasks = again.request("GET", "/v1/queues/q/tasks?state=done").json["tasks"]
        self.assertEqual([t["result"] for t in tasks], ["slow"], head.log())

    def test_second_ctrl_c_stops_the_running_tasks(self):
        head, proc, fifo = self.running_task_on_fifo()
        os.killpg(proc.pid, signal.SIGINT)
        harness.wait_until(lambda: "finishing running tasks" in head.log(), timeout=20,
                           what=lambda: "the worker told to stop:\n" + head.log())
        os.killpg(proc.pid, signal.SIGINT)
        # The worker terminates its command (nothing writes to the FIFO) and gives the
        # task back; the head, still up, takes it, then stops.
        self.assertEqual(self.exit_status(proc, head), 0, head.log())
        log = head.log()
        self.assertIn("the local node stops its workers now", log)
        self.assertIn("the local node stopped; shutting down", log)
        again = harness.Head(data_dir=head.data_dir)
        again.token = head.token
        again.start()
        self.addCleanup(again.stop)
        counts = again.request("GET", "/v1/queues/q").json["counts"]
        self.assertEqual((counts["leased"], counts["queued"]), (0, 1), (counts, log))


    def test_third_ctrl_c_stops_the_head_at_once(self):
        # A task that ignores SIGTERM outlives the second signal; the third stops the
        # head at once, and its death (SIGHUP to the agent) kills the command.
        head, proc, fifo = self.running_task_on_fifo(
            'trap "" TERM; echo $$ > "$0.pid"; read go < "$0"; cat')
        pid_file = fifo + ".pid"
        pid = harness.wait_until(
            lambda: os.path.exists(pid_file) and open(pid_file).read().strip(),
            timeout=20, what=lambda: "the command's pid:\n" + head.log())
        for stage in ("finishing running tasks", "terminating running commands"):
            os.killpg(proc.pid, signal.SIGINT)
            harness.wait_until(lambda: stage in head.log(), timeout=20,
                               what=lambda: stage + ":\n" + head.log())
        self.assertIsNone(proc.poll(), head.log())
        os.killpg(proc.pid, signal.SIGINT)
        self.assertEqual(self.exit_status(proc, head), 0, head.log())
        self.assertIn("received SIGINT; shutting down", head.log())

        def command_gone():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            return False
        harness.wait_until(command_gone, timeout=20, what=lambda: "the command killed:\n" + head.log())


class GpuDetectionTest(NodeTestCase):
    def gpu_env_of_workers(self, agent, count):
        pids = self.wait_workers(agent, count)
        envs = [node_harness.environ_of(p) for p in pids]
        return sorted((e.get("CUDA_VISIBLE_DEVICES"), e.get("CUDA_DEVICE_ORDER")) for e in envs)

    def test_one_worker_per_gpu(self):
        self.make_queue("gpu")
        a = self.agent("gpu1", args=["--queue", "gpu"], env=self.fake_smi_env(),
                       cmd=["sh", "-c", "sleep 0.3; echo $CUDA_VISIBLE_DEVICES/$CUDA_DEVICE_ORDER"])
        a.start()
        self.assertEqual(self.gpu_env_of_workers(a, 2),
                         [("0", "PCI_BUS_ID"), ("1", "PCI_BUS_ID")])
        node = self.node("gpu1")
        # A comma in a name keeps the name whole and the memory right; the UUIDs stay on
        # the node (the registration has no field for them).
        self.assertEqual(node["gpus"], [
            {"index": 0, "name": "Fake GPU Alpha", "memory_total_mb": 16160,
             "memory_free_mb": 15000},
            {"index": 1, "name": "Fake GPU Beta, 8GB", "memory_total_mb": 8080,
             "memory_free_mb": 7000}])
        self.assertIn("GPU detection (nvidia-smi): 2 found, 2 used: "
                      "0 (Fake GPU Alpha, 16160 MiB, GPU-a1599801), "
                      "1 (Fake GPU Beta, 8GB, 8080 MiB, GPU-a1b2c3d4)", a.log())
        # The commands the workers run see their worker's GPU.
        ids = self.put("gpu", ["x"] * 6)
        results = harness.wait_until(
            lambda: [t["result"] for t in map(self.task, ids) if t["state"] == "done"]
            if all(self.task(i)["state"] == "done" for i in ids) else None,
            timeout=30, what=lambda: "tasks done:\n" + a.log())
        self.assertTrue(set(results) <= {"0/PCI_BUS_ID", "1/PCI_BUS_ID"}, results)
        self.assertIn("nvidia-smi", a.log())

    def test_worker_lines_name_their_worker(self):
        # The workers wrote their lines straight into the agent's stderr: with one
        # worker per GPU nobody could tell which worker, or GPU, a line came from.  The
        # agent reads them and tags each line with the worker, its GPU and its pid.
        self.make_queue("tagged", max_attempts=1)
        a = self.agent("tags", args=["--queue", "tagged"], env=self.fake_smi_env(),
                       cmd=["sh", "-c", 'echo "bad on $MUSTER_GPU" >&2; exit 3'])
        a.start()
        pids = self.wait_workers(a, 2)
        ids = self.put("tagged", ["x"] * 6)
        harness.wait_until(lambda: all(self.task(i)["state"] == "dead" for i in ids),
                           timeout=30, what=lambda: "the tasks failed:\n" + a.log())
        self.assertEqual(a.stop(), 0, a.log())
        log = a.log()
        tagged = re.compile(r"worker ([12]) \(gpu ([01]), pid (\d+)\): muster worker: (.*)")
        failed = re.compile(r"task \d+ failed \(exit status 3\): ")
        lines = [line for line in log.splitlines() if "muster worker:" in line]
        seen = {}
        for line in lines:
            m = tagged.fullmatch(line)
            self.assertTrue(m, "an untagged worker line: %r\n%s" % (line, log))
            slot, gpu, pid, text = int(m[1]), m[2], int(m[3]), m[4]
            self.assertEqual((gpu, pid in pids), (str(slot - 1), True), line)
            seen.setdefault(pid, []).append(text)
            if failed.match(text):  # the command's stderr says which GPU it ran on
                self.assertIn("bad on %s" % gpu, text, line)
        self.assertEqual(sorted(seen), sorted(pids), log)
        for pid, texts in seen.items():  # each worker's start and stop, under its own tag
            self.assertRegex(texts[0], r"^\S+ \(id \d+\) on queue tagged", log)
            self.assertRegex(texts[-1], r"^\S+ stopped: 0 completed, \d+ failed$", log)
        self.assertEqual(sum(len([t for t in texts if failed.match(t)])
                             for texts in seen.values()), 6, log)
        self.assertNotRegex(log, r"(?m)^muster worker:")

    def test_gpus_option(self):
        self.make_queue("gpu")
        a = self.agent("gpu2", args=["--queue", "gpu", "--gpus", "1"], env=self.fake_smi_env(),
                       cmd=["true"])
        a.start()
        self.assertEqual(self.gpu_env_of_workers(a, 1), [("1", "PCI_BUS_ID")])
        self.assertEqual([g["index"] for g in self.node("gpu2")["gpus"]], [1])

    def test_cuda_visible_devices_restricts(self):
        self.make_queue("gpu")
        env = self.fake_smi_env()
        env["CUDA_VISIBLE_DEVICES"] = "1"
        a = self.agent("gpu3", args=["--queue", "gpu"], env=env, cmd=["true"])
        a.start()
        self.assertEqual(self.gpu_env_of_workers(a, 1), [("1", "PCI_BUS_ID")])

    def test_gpus_by_uuid(self):
        # As CUDA_VISIBLE_DEVICES allows: a whole UUID, a unique start of one, mixed
        # with indexes; from --gpus or the agent's CUDA_VISIBLE_DEVICES; UUIDs read from
        # --query-gpu or, where only `nvidia-smi -L` answers, from its list.  Workers
        # are still given the index.
        self.make_queue("gpu")
        cases = (("uuid1", ["--gpus", UUID1], None, FAKE_SMI, [("1", "PCI_BUS_ID")]),
                 ("uuid2", ["--gpus", "GPU-A15"], None, FAKE_SMI, [("0", "PCI_BUS_ID")]),
                 ("uuid3", ["--gpus", "GPU-a15, 1"], None, FAKE_SMI,
                  [("0", "PCI_BUS_ID"), ("1", "PCI_BUS_ID")]),
                 ("uuid4", [], "GPU-a1b", FAKE_SMI, [("1", "PCI_BUS_ID")]),
                 ("uuid5", ["--gpus", "GPU-a1b2"], None, FAKE_SMI_LIST_ONLY,
                  [("1", "PCI_BUS_ID")]))
        for name, args, visible, script, workers in cases:
            env = self.fake_smi_env(script)
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            a = self.agent(name, args=["--queue", "gpu"] + args, env=env, cmd=["true"])
            a.start()
            self.assertEqual(self.gpu_env_of_workers(a, len(workers)), workers, name)
            self.assertEqual([g["index"] for g in self.node(name)["gpus"]],
                             [int(w[0]) for w in workers])
            a.stop()
        # -L gives no memory (none printed); GPU 0 is its MIG instance 0:0 there.
        self.assertIn("GPU detection (nvidia-smi -L): 2 found, 1 used: "
                      "1 (Fake GPU Beta, 8GB, GPU-a1b2c3d4)\n", a.log())

    def test_gpu_uuids_refused(self):
        both = "0 %s, 1 %s" % (UUID0, UUID1)
        self.assertIn("--gpus: 'GPU-a1' matches 2 GPUs (%s); give more of the UUID, or the "
                      "index" % both, self.refusal("bad1", ["--gpus", "0,GPU-a1"]))
        self.assertIn("CUDA_VISIBLE_DEVICES: 'GPU-ffff' matches no GPU of this machine; its "
                      "GPUs are %s (name them by index or UUID)" % both,
                      self.refusal("bad2", [], visible="GPU-ffff"))
        self.assertIn("--gpus: 'MIG-0d1f' matches no MIG instance of this machine; its GPUs "
                      "and MIG instances are 0:0 MIG-0d1e2f3a-4b5c-5d6e-8f7a-8b9c0d1e2f3a, 1 %s "
                      "(name them by index or UUID, an instance also as GPU:INSTANCE)" % UUID1,
                      self.refusal("bad3", ["--gpus", "MIG-0d1f"], script=FAKE_SMI_LIST_ONLY))
        self.assertIn("'GPU-a15' matches no GPU of this machine: detection (nvidia-smi) found 2 "
                      "GPUs and no UUIDs; name GPUs by index instead",
                      self.refusal("bad4", ["--gpus", "GPU-a15"], script=FAKE_SMI_NO_UUID))
        self.assertIn("--gpus: 'MIG-a15' matches no MIG instance of this machine: detection "
                      "(none) found no GPU\n",
                      self.refusal("bad5", ["--gpus", "MIG-a15"], script="#!/bin/sh\nexit 9\n"))

    def test_nvidia_smi_without_uuid_field(self):
        # An nvidia-smi that refuses the uuid field is asked again without it: memory
        # is still known, and indexes still select.
        self.make_queue("gpu")
        a = self.agent("olddrv", args=["--queue", "gpu", "--gpus", "1"],
                       env=self.fake_smi_env(FAKE_SMI_NO_UUID), cmd=["true"])
        a.start()
        self.assertEqual(self.gpu_env_of_workers(a, 1), [("1", "PCI_BUS_ID")])
        self.assertIn("GPU detection (nvidia-smi): 2 found, 1 used: 1 (Fake GPU Beta, 8GB, "
                      "8080 MiB)\n", a.log())

    def test_min_gpu_memory(self):
        self.make_queue("gpu")
        a = self.agent("gpu4", args=["--queue", "gpu", "--min-gpu-memory", "10000"],
                       env=self.fake_smi_env(), cmd=["true"])
        a.start()
        self.assertEqual(self.gpu_env_of_workers(a, 1), [("0", "PCI_BUS_ID")])

    def test_cpu_workers_without_gpu(self):
        self.make_queue("cpu")
        a = self.agent("cpu1", args=["--queue", "cpu", "--workers", "3"], cmd=["true"])
        a.start()
        pids = self.wait_workers(a, 3)
        for p in pids:
            env = node_harness.environ_of(p)
            self.assertNotIn("CUDA_VISIBLE_DEVICES", env)
            self.assertEqual(env.get("MUSTER_NODE"), "cpu1")
        node = self.node("cpu1")
        self.assertEqual(node["gpus"], [])
        self.assertGreaterEqual(node["cpus"], 1)

    def test_no_gpu_asked_for_runs_cpu_workers(self):
        # "none" and "-1" (CUDA's own spelling) mean CPU workers on a GPU machine too.
        self.make_queue("cpu")
        for name, args, visible in (("nogpu1", ["--gpus", "none"], None),
                                    ("nogpu2", [], "-1")):
            env = self.fake_smi_env()
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            a = self.agent(name, args=["--queue", "cpu", "--workers", "2"] + args, env=env,
                           cmd=["true"])
            a.start()
            self.assertEqual(self.gpu_env_of_workers(a, 2), [(None, None), (None, None)])
            self.assertIn("GPU detection (nvidia-smi): 2 found, 0 used", a.log())
            self.assertEqual(self.node(name)["gpus"], [])
            a.stop()

    def test_no_gpu_kept_says_which_filter(self):
        self.make_queue("gpu")
        for name, args, visible, why in (
                ("kept1", [], "5", "passes CUDA_VISIBLE_DEVICES=5: starting no workers"),
                ("kept2", ["--gpus", "1", "--min-gpu-memory", "10000"], None,
                 "passes --gpus 1 and --min-gpu-memory 10000: starting no workers")):
            env = self.fake_smi_env()
            if visible is not None:
                env["CUDA_VISIBLE_DEVICES"] = visible
            a = self.agent(name, args=["--queue", "gpu"] + args, env=env, cmd=["true"])
            a.start()
            harness.wait_until(lambda: "none of the 2 GPUs found " + why in a.log(),
                               timeout=20, what=lambda: "the refusal:\n" + a.log())
            self.assertIn("--gpus none for CPU workers", a.log())
            node = harness.wait_until(lambda: self.node(name), timeout=20,
                                      what=lambda: "the node registered:\n" + a.log())
            self.assertEqual((node["workers"], node["gpus"], a.workers()), (0, [], []))
            a.stop()

    def test_gpus_named_on_a_machine_without_gpus(self):
        # --gpus asks for GPU work: where detection finds no GPU the agent starts no
        # workers and says why, as where the GPUs found do not pass; a
        # CUDA_VISIBLE_DEVICES inherited from the environment gets a note, and the CPU
        # workers a machine without GPUs runs.
        self.make_queue("q")
        a = self.agent("nogpu3", args=["--queue", "q", "--workers", "2", "--gpus", "0"],
                       cmd=["true"])
        a.start()
        harness.wait_until(lambda: "--gpus 0 names GPUs, but detection (none) found none on "
                           "this machine: starting no workers (use --gpus none for CPU "
                           "workers)" in a.log(), timeout=20, what=lambda: "the refusal:\n" + a.log())
        node = harness.wait_until(lambda: self.node("nogpu3"), timeout=20,
                                  what=lambda: "the node registered:\n" + a.log())
        self.assertEqual(node["workers"], 0)
        self.assertEqual(a.workers(), [])
        a.stop()
        b = self.agent("nogpu4", args=["--queue", "q", "--workers", "2"],
                       env={"CUDA_VISIBLE_DEVICES": "0"}, cmd=["true"])
        b.start()
        self.assertEqual(len(self.wait_workers(b, 2)), 2)
        self.assertIn("CUDA_VISIBLE_DEVICES=0 names GPUs, but detection (none) found none on "
                      "this machine: CPU workers", b.log())

    def test_bad_gpus_list(self):
        a = self.agent("gpu5", args=["--gpus", "zero"], env=self.fake_smi_env())
        a.start(wait_listen=False)
        self.assertEqual(a.proc.wait(20), 2)  # a bad argument, like every other one
        self.assertIn("--gpus: 'zero' is not a list of GPU indexes or UUIDs such as 0,2 or "
                      "GPU-8f1c (a MIG instance: 0:1 or MIG-5a2e)\n", a.log())
        self.assertIn("--gpus: '0,GPU-' is not a list of GPU indexes or UUIDs such as 0,2 or "
                      "GPU-8f1c (a MIG instance: 0:1 or MIG-5a2e): 'GPU-' is neither",
                      self.refusal("gpu6", ["--gpus", "0,GPU-"]))

    def test_an_agent_that_failed_to_start_leaves_nothing_to_take_over(self):
        # An agent that failed before registering (a bad --gpus; a port taken) left its
        # instance in the lock file, so the next agent said it took over from it, an
        # agent the head never knew.
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        port.listen(1)
        self.addCleanup(port.close)
        for args, status in ((["--gpus", "zero"], 2),
                             (["--listen", "127.0.0.1:%d" % port.getsockname()[1]], 1)):
            failed = self.agent("failstart", args=args, env=self.fake_smi_env())
            failed.start(wait_listen=False)
            self.assertEqual(failed.proc.wait(20), status, failed.log())
            info = failed.lock_info()
            self.assertEqual(info.get("stopping:"), "it failed to start, before registering",
                             info)
            self.assertNotIn("instance", info, info)
            self.assertNotIn("previous_instance", info, info)
            self.assertIsNone(self.node("failstart"))
        second = self.agent("failstart").start()
        harness.wait_until(lambda: (self.node("failstart") or {}).get("state") == "active",
                           what=lambda: "the next agent registered:\n" + second.log())
        self.assertNotIn("taking over", second.log())
        self.assertNotIn("took over", self.head.log())
        self.assertEqual(second.stop(), 0, second.log())

    def test_bad_name(self):
        a = self.agent("bad name")
        a.start(wait_listen=False)
        self.assertEqual(a.proc.wait(20), 2)
        self.assertIn("node name 'bad name': use 1 to 128 characters", a.log())


class AgentLifeTest(NodeTestCase):
    def test_a_dead_workers_last_lines_come_before_its_death(self):
        # The agent read at most 64 KiB of a dead worker's pipe before logging its end,
        # so whatever it had written beyond came after the line saying it died.  Here the
        # worker's pipe holds 512 KiB when it dies: the command writes them into its
        # worker's stderr (the pipe, made 1 MiB) while the agent is stopped, the worker
        # is killed, and the agent is let go.
        self.make_queue("lastwords", max_attempts=1)
        gate, done = os.path.join(self.dir, "lw-gate"), os.path.join(self.dir, "lw-done")
        os.mkfifo(gate)
        os.mkfifo(done)
        writer = textwrap.dedent("""\
            import fcntl, os
            with open("/proc/%s/fd/2" % os.environ["MUSTER_WORKER_PID"], "w") as f:
                fcntl.fcntl(f, fcntl.F_SETPIPE_SZ, 1 << 20)
                for i in range(8192):
                    f.write("line %05d %s\\n" % (i, "x" * 52))
                f.write("THE LAST LINE\\n")""")
        a = self.agent("lastwords", args=["--queue", "lastwords", "--workers", "1"],
                       cmd=["sh", "-c", 'read x; read g < "%s"; %s -c \'%s\'; echo d > "%s"'
                            % (gate, sys.executable, writer, done)])
        a.start()
        [worker] = self.wait_workers(a, 1)
        self.put("lastwords", ["x"])
        a.proc.send_signal(signal.SIGSTOP)
        try:
            with open(gate, "w") as f:  # the command runs on
                f.write("go\n")
            with open(done) as f:  # it has written everything
                f.read()
            os.kill(worker, signal.SIGKILL)
            harness.wait_until(lambda: node_harness._stat(worker) is None, timeout=10,
                           what="the worker dead")  # a zombie: None as gone
        finally:
            a.proc.send_signal(signal.SIGCONT)

        def logged():
            with open(a.log_path) as f:
                text = f.read()
            return text if "killed by signal 9" in text and "THE LAST LINE" in text else None
        lines = harness.wait_until(logged, timeout=10, what=lambda: "the worker's end logged:\n" +
                                   a.log()).splitlines()
        death = next(i for i, line in enumerate(lines) if "killed by signal 9" in line)
        last = [i for i, line in enumerate(lines) if line.endswith(": THE LAST LINE")]
        self.assertEqual(len(last), 1, "\n".join(lines[-20:]))
        self.assertLess(last[0], death, "\n".join(lines[death - 3:death + 3]))
        written = re.compile(r"worker 1 \(pid %d\): line \d{5} x{52}" % worker)
        self.assertEqual(sum(1 for line in lines if written.fullmatch(line)), 8192)

    def test_second_agent_refused(self):
        first = self.agent("one").start()
        second = Agent(self.head, self.dir, "one")  # same lock file
        self.agents.append(second)
        second.start(wait_listen=False)
        self.assertEqual(second.proc.wait(20), 1)
        log = second.log()
        self.assertIn("another node agent is already running on this machine", log)
        self.assertIn("pid %d" % first.proc.pid, log)
        # The way to try several agents on one machine is said too: a new user who
        # started the README's second node beside the first read only "stop it first".
        self.assertIn("); stop it first: one agent per machine (to try several on one "
                      "machine, give each its own --lock-file PATH, --name NAME and --listen "
                      "ADDR:PORT)\n", log)
        self.assertIsNone(first.proc.poll())
        # Once the first one is gone, an agent may start again.
        self.assertEqual(first.stop(), 0)
        harness.wait_until(lambda: (self.node("one") or {}).get("state") != "active",
                           what="node left")
        Agent(self.head, self.dir, "one")  # (constructed only: same lock is free now)
        again = self.agent("one").start()
        harness.wait_until(lambda: (self.node("one") or {}).get("state") == "active",
                           what="node registered again")
        self.assertEqual(again.stop(), 0)

    def test_second_agent_on_a_taken_port_says_to_give_another(self):
        # A second agent with its own name and lock but the first one's port (both left
        # at the default 127.0.0.1:7371 on one machine) said "(in use, or not an address of
        # this machine)" and not which option to change.
        first = self.agent("port-one").start()
        taken = first.url[len("http://"):]
        second = self.agent("port-two", args=["--listen", taken])
        second.start(wait_listen=False)
        self.assertEqual(second.proc.wait(20), 1, second.log())
        self.assertIn("muster node: cannot listen on %s: Address already in use: another "
                      "process (another node agent, a head?) listens there; give this agent a "
                      "port of its own with --listen ADDR:PORT, or --listen none for no API "
                      "port\n" % taken, second.log())
        self.assertIsNone(first.proc.poll())

    def test_head_beside_a_running_agent_runs_on_and_says_so(self):
        # The head's local agent that found the machine's lock taken logged the advice
        # of `muster node`, "stop it first", though the head runs on without it.
        first = self.agent("held").start()
        data = os.path.join(self.dir, "head-data")
        log_path = os.path.join(self.dir, "head-beside.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                     "--data-dir", data, "--token", self.head.token],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env=node_harness.no_gpu_env(
                                        dict(os.environ, MUSTER_NODE_LOCK=first.lock)))
        self.addCleanup(lambda: proc.poll() is None and proc.kill())

        def said():
            with open(log_path) as f:
                text = f.read()
            return text if "another node agent is already running" in text else None
        text = harness.wait_until(said, timeout=20, what="the local agent's refusal")
        self.assertIn("muster head (local node): another node agent is already running on "
                      "this machine (pid %d, name held" % first.proc.pid, text)
        self.assertIn("lock %s); the head runs on without a local node agent, so no worker of "
                      "its own: to run one beside that agent, start the head with a --lock-file "
                      "PATH and a --name NAME of its own; --server-only runs the head alone\n"
                      % first.lock, text)
        self.assertNotIn("stop it first", text)
        self.assertIsNone(proc.poll(), text)  # the head runs on
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(20), 0, text)
        self.assertIsNone(first.proc.poll())

    def test_two_agents_one_name(self):
        """A second agent under the node name a running agent holds (each with its own lock
        file, as on cloned machines) is refused, says why and waits; it takes nothing over.
        Once the first is killed (no goodbye), it registers when the first has been silent
        for the node's timeout."""
        first = self.agent("twin").start()
        harness.wait_until(lambda: (self.node("twin") or {}).get("state") == "active",
                           what="the first agent registered")
        second = self.agent("twin")
        second.lock = os.path.join(self.dir, "agent-twin-2.lock")
        second.log_path = os.path.join(self.dir, "agent-twin-2.log")
        second.start()
        harness.wait_until(lambda: "is held by another running agent" in second.log(),
                           what="the refusal in the second agent's log")
        self.assertIn("muster node --name NAME", second.log())
        self.assertEqual(self.node("twin")["address"], first.url[len("http://"):])
        self.assertNotIn("registered again", self.head.log())
        first.kill()
        harness.wait_until(
            lambda: (self.node("twin") or {}).get("address") == second.url[len("http://"):],
            what="the second agent registered")
        self.assertEqual(second.stop(), 0)

    def test_a_paused_agent_whose_name_was_taken_over(self):
        """An agent stopped (SIGSTOP) past the node's timeout while a second agent takes its
        name over: when it resumes, its heartbeat is refused, it tries to register again and
        is refused while the second runs; the node stays the second's."""
        first = self.agent("paused").start()
        # Registered by the agent's word too (Agent.registered): one paused before the
        # head's answer reached it (a registration that outlasted its request timeout,
        # retried) registers again on resuming, is refused, and never sends the heartbeat
        # whose refusal this test reads.
        harness.wait_until(lambda: (self.node("paused") or {}).get("state") == "active" and
                           first.registered(),
                           what=lambda: "the first agent registered:\n" + first.log())
        first.proc.send_signal(signal.SIGSTOP)
        second = self.agent("paused")
        second.lock = os.path.join(self.dir, "agent-paused-2.lock")
        second.log_path = os.path.join(self.dir, "agent-paused-2.log")
        second.start()
        harness.wait_until(
            lambda: (self.node("paused") or {}).get("address") == second.url[len("http://"):],
            timeout=20, what="the second agent took the name over")
        first.proc.send_signal(signal.SIGCONT)
        harness.wait_until(lambda: "is held by another running agent" in first.log(),
                           timeout=20, what=lambda: "the first agent refused:\n" + first.log())
        self.assertIn("registered by another agent since", first.log())
        self.assertEqual(self.node("paused")["address"], second.url[len("http://"):])
        self.assertEqual(second.stop(), 0)

    def test_join_url_is_checked_before_anything_starts(self):
        """--join is checked as the CLI checks --url: a URL ending in /v1 (the agent used to
        call the head one "with no node API" and retry for ever) or without a scheme (it
        registered the address ':80') is refused with exit status 2; nothing registers and
        the lock is not taken."""
        for url, why in ((self.head.url + "/v1", "must not end in /v1"),
                         (self.head.url[len("http://"):], "must start with http:// or https://"),
                         ("http://:7370", "names no host")):
            with self.subTest(url=url):
                a = self.agent("badjoin")
                a.log_path = os.path.join(self.dir, "badjoin-%d.log" % len(self.agents))
                a.argv = lambda a=a, url=url: [u if u != self.head.url else url
                                               for u in Agent.argv(a)]
                a.start(wait_listen=False)
                self.assertEqual(a.proc.wait(20), 2, a.log())
                self.assertIn("muster: --join '%s' is not a head's URL (http://HOST:PORT): "
                              % url, a.log())
                self.assertIn(why, a.log())
                self.assertFalse(os.path.exists(a.lock))
        self.assertIsNone(self.node("badjoin"))

    def test_wrong_token_stops_the_agent(self):
        self.make_queue("tok")
        a = self.agent("badtok", args=["--queue", "tok", "--workers", "1"], cmd=["cat"],
                       token="not-the-token-0123456789")
        a.start(wait_listen=False)
        self.assertEqual(a.proc.wait(30), 1, a.log())
        log = a.log()
        self.assertIn("register: unauthorized", log)
        # The head's refusal says where its token is; the agent adds where its own came
        # from, not the data dir a second time.
        self.assertIn("stopping (the agent's token comes from --token or MUSTER_TOKEN)", log)
        self.assertEqual(log.count("data dir"), 2, log)  # the head's "this head's" and "another"
        self.assertNotIn("retrying", log)
        self.assertNotIn("started 1 worker", log)
        self.assertIsNone(self.node("badtok"))

    def test_missing_command_refused_at_start(self):
        self.make_queue("nocmd", max_attempts=3)
        [tid] = self.put("nocmd", ["x"])
        for cmd in ("/nonexistent/cmd", "nonexistent-tool-0417"):
            a = self.agent("nocmd", args=["--queue", "nocmd", "--workers", "2"], cmd=[cmd])
            a.start(wait_listen=False)
            self.assertEqual(a.proc.wait(20), 2, a.log())
            self.assertIn("muster node: cannot run '%s'" % cmd, a.log())
            self.assertIn("no worker was started", a.log())
        self.assertIsNone(self.node("nocmd"))
        task = self.task(tid)
        self.assertEqual((task["state"], task["attempts"]), ("queued", 0))

    def test_register_heartbeat_leave(self):
        a = self.agent("n-life").start()
        node = harness.wait_until(lambda: self.node("n-life"), what="node registered")
        self.assertEqual(node["state"], "active")
        self.assertEqual(node["address"], a.url[len("http://"):])
        # Heart-beats keep it active past its timeout (1.5 s).
        time.sleep(0)  # (no sleep as synchronisation: poll last_seen_ms instead)
        first_seen = node["last_seen_ms"]
        harness.wait_until(lambda: self.node("n-life")["last_seen_ms"] > first_seen,
                           timeout=10, what="a heartbeat")
        self.assertEqual(a.stop(), 0)
        self.assertEqual(self.node("n-life")["state"] if self.node("n-life") else "gone", "gone")

    def test_listen_none_registers_no_address(self):
        """An agent with --listen none has no address of its own: it registers none (not
        the head's), also over the address it registered before, and `muster nodes` shows
        '-' for it."""
        a = self.agent("n-quiet").start()
        node = harness.wait_until(lambda: self.node("n-quiet"), what="node registered")
        self.assertEqual(node["address"], a.url[len("http://"):])
        self.assertEqual(a.stop(), 0)
        b = self.agent("n-quiet", args=["--listen", "none"])
        b.start(wait_listen=False)
        seen = node["last_seen_ms"]
        node = harness.wait_until(
            lambda: (lambda n: n if n and n["last_seen_ms"] > seen and
                     n["state"] == "active" else None)(self.node("n-quiet")),
            what=lambda: "the node registered again:\n" + b.log())
        self.assertIsNone(node["address"], node)
        self.assertIsNone(b.proc.poll(), b.log())
        env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
        p = subprocess.run([harness.MUSTER_BIN, "nodes"], env=env, capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        [row] = [line.split() for line in p.stdout.splitlines() if line.startswith("n-quiet ")]
        self.assertEqual(row[:3], ["n-quiet", "active", "-"], p.stdout)
        self.assertNotIn(self.head.url[len("http://"):], p.stdout)

    def test_crash_looping_task_goes_dead(self):
        self.make_queue("crashy", max_attempts=3, backoff_ms=0, backoff_max_ms=0)
        plugin = os.path.join(node_harness.build_dir(), "libplugin_echo.so")
        a = self.agent("crash1", args=["--queue", "crashy", "--workers", "1", "--plugin", plugin],
                       env={"PLUGIN_LOG": os.path.join(self.dir, "plugin.log")})
        a.start()
        [crash] = self.put("crashy", ["crash"])
        t = harness.wait_until(lambda: (lambda t: t if t["state"] == "dead" else None)(
            self.task(crash)), timeout=60, what=lambda: "the crashing task dead:\n" + a.log())
        self.assertEqual(t["attempts"], 3)
        self.assertIn("crashed", a.log())
        # The worker was restarted and still works.
        [ok] = self.put("crashy", ["fine"])
        done = harness.wait_until(lambda: (lambda t: t if t["state"] == "done" else None)(
            self.task(ok)), timeout=30, what=lambda: "a task after the crashes:\n" + a.log())
        self.assertEqual(done["result"]["payload"], "fine")


class QueueLaterTest(NodeTestCase):
    def test_workers_wait_for_their_queue(self):
        a = self.agent("early", args=["--queue", "later", "--workers", "1"], cmd=["rev"])
        a.start()
        harness.wait_until(lambda: "waiting for queue later" in a.log(), timeout=20,
                           what=lambda: "the worker to wait:\n" + a.log())
        self.make_queue("later")
        [tid] = self.put("later", ["abc"])
        t = harness.wait_until(lambda: (lambda t: t if t["state"] == "done" else None)(
            self.task(tid)), timeout=20, what=lambda: "the task done:\n" + a.log())
        self.assertEqual(t["result"], "cba")
        self.assertNotIn("restarting", a.log())

    def test_a_stop_while_waiting_for_the_queue_is_no_error(self):
        a = self.agent("idle", args=["--queue", "never", "--workers", "2"], cmd=["rev"])
        a.start()
        harness.wait_until(lambda: a.log().count("waiting for queue never") == 2, timeout=20,
                           what=lambda: "both workers to wait:\n" + a.log())
        self.assertEqual(a.stop(), 0, a.log())
        log = a.log()
        self.assertEqual(log.count("stopped while waiting for queue never; nothing was leased"),
                         2, log)
        self.assertNotIn("queue_not_found", log)
        self.assertNotIn("exit status", log)


class HeadAwayTest(NodeTestCase):
    """The agent's calls to a head that goes away (`kill -9`) and comes back on the same
    port and data dir: one line when the head stops answering, however long it stays
    away (the retries are quiet), and one when it answers again, per outage."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.dir_prefix)
        port = harness.free_port()
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % port] + self.head_args)
        self.head.url = "http://127.0.0.1:%d" % port  # for an agent started before it
        self.agents = []

    def test_heartbeat_says_once_per_outage_that_the_head_is_back(self):
        self.head.start()
        a = self.agent("away").start()
        harness.wait_until(lambda: self.node("away") and a.registered(),
                           what=lambda: "node registered:\n" + a.log())
        for outage in (1, 2):
            self.head.kill()
            harness.wait_until(lambda: a.log().count("heartbeat: network") == outage,
                               what=lambda: "the agent to miss the head:\n" + a.log())
            time.sleep(2.5)  # the outage: five heartbeat intervals (the node's 1.5 s / 3)
            self.head.start()
            harness.wait_until(
                lambda: a.log().count("heartbeat: reached the head again after") == outage,
                timeout=AFTER_RESTART_S, what=lambda: "the agent to say the head is back:\n" +
                a.log() + "\nthe head:\n" + self.head.log())
        log = a.log()
        self.assertEqual(log.count("(retrying)"), 2, log)
        away = re.findall(r"heartbeat: reached the head again after (\d+\.\d) s\n", log)
        self.assertEqual(len(away), 2, log)
        self.assertTrue(all(float(s) >= 2.4 for s in away), log)  # from the first miss
        self.assertEqual(self.node("away")["state"], "active")

    def test_a_new_reason_in_a_streak_is_said_once(self):
        # Only the streak's first failure was logged: a head that first refused
        # connections, then answered 503 showed the first reason alone.  Each distinct
        # reason is said once; its repeats are not.
        self.head.start()
        a = self.agent("reasons").start()
        harness.wait_until(lambda: self.node("reasons") and a.registered(),
                           what=lambda: "node registered:\n" + a.log())
        self.head.kill()
        harness.wait_until(lambda: "heartbeat: network" in a.log(),
                           what=lambda: "the agent to miss the head:\n" + a.log())
        busy, paths = busy_head(self.head.port)
        try:
            harness.wait_until(lambda: len(paths) >= 4, what="heartbeats answered 503")
        finally:
            busy.shutdown()
            busy.server_close()
        self.head.start()
        harness.wait_until(lambda: "heartbeat: reached the head again after" in a.log(),
                           timeout=AFTER_RESTART_S,
                           what=lambda: "the agent to say the head is back:\n" + a.log())
        log = a.log()
        said = [line for line in log.splitlines() if line.endswith("(retrying)")]
        self.assertEqual(len(said), len(set(said)), log)  # no reason twice
        self.assertEqual(len([line for line in said if "Connection refused" in line]), 1, log)
        self.assertIn("muster node: heartbeat: unavailable: the head is starting (retrying)",
                      said, log)

    def test_an_agent_started_before_its_head_says_when_it_reached_it(self):
        a = self.agent("early").start()
        harness.wait_until(lambda: "register: network" in a.log(),
                           what=lambda: "the agent to miss the head:\n" + a.log())
        self.head.start()
        harness.wait_until(lambda: "registered with the head" in a.log(),
                           timeout=AFTER_RESTART_S,
                           what=lambda: "the agent to register:\n" + a.log())
        log = a.log()
        self.assertRegex(log, r"register: reached the head after \d+\.\d s\n")
        self.assertNotIn("again", log)
        self.assertEqual(log.count("(retrying)"), 1, log)

    def test_an_agent_that_never_reaches_its_head_says_what_to_check(self):
        # It said "register: network: ... Connection refused (retrying)" once and then
        # nothing more, however long it waited: a wrong --join looked like a slow start.
        a = self.agent("nowhere").start()
        line = harness.wait_until(
            lambda: re.search(r"register: the head at (\S+) has not been reached in (\d+) s: "
                              r"is `muster head` running there, and is --join right .*"
                              r"Still retrying every 1 s\n", a.log()),
            timeout=30, what=lambda: "the agent to say what to check:\n" + a.log())
        self.assertEqual(line.group(1), self.head.url)
        self.assertGreaterEqual(int(line.group(2)), 10)
        self.head.start()
        harness.wait_until(lambda: "registered with the head" in a.log(),
                           timeout=AFTER_RESTART_S,
                           what=lambda: "the agent to register:\n" + a.log())
        log = a.log()
        self.assertEqual(log.count("has not been reached"), 1, log)  # said once
        self.assertEqual(log.count("(retrying)"), 1, log)


class WorkerHeadAwayTest(NodeTestCase):
    """A worker of the agent whose heartbeats and leases fail while the head is away:
    one line when they start failing, one when they reach the head again, per outage."""
    head_args = ["--node-timeout-ms", "1500", "--worker-timeout-ms", "1500"]
    setUp = HeadAwayTest.setUp

    def lease_waiters(self):
        text = self.head.request("GET", "/metrics").raw.decode()
        return int(re.search(r"^muster_lease_waiters (\d+)$", text, re.M).group(1))

    def test_a_worker_says_once_that_its_heartbeats_reach_the_head_again(self):
        # The worker said every failed heartbeat (one per beat while the head was
        # away) and never that they worked again.  Its slot said the second outage
        # neither failing nor leasing again: the first lease after a failure was a
        # long-poll, so one parked at a head that went away again was the same streak.
        self.head.start()
        self.make_queue("hb")
        a = self.agent("hb", args=["--queue", "hb", "--workers", "1"], cmd=["cat"]).start()
        [pid] = self.wait_workers(a, 1)
        said = "worker 1 (pid %d): muster worker: heartbeat: " % pid
        slot = "worker 1 (pid %d): muster worker: slot 1: " % pid
        for outage in (1, 2):
            self.head.kill()
            harness.wait_until(lambda: a.log().count(said + "network: ") == outage,
                               what=lambda: "the worker's heartbeat to fail:\n" + a.log())
            harness.wait_until(lambda: a.log().count(slot + "lease from hb: network") == outage,
                               what=lambda: "the slot's lease to fail:\n" + a.log())
            time.sleep(2)  # the outage: four of the worker's heartbeat intervals (1.5 s / 3)
            self.head.start()
            harness.wait_until(
                lambda: a.log().count(said + "reached the head again after") == outage,
                timeout=AFTER_RESTART_S, what=lambda: "the worker to say its heartbeats work "
                "again:\n" + a.log() + "\nthe head:\n" + self.head.log())
            # A long-poll parked again: the next kill cuts it, a new failure.
            harness.wait_until(lambda: self.lease_waiters() > 0, timeout=AFTER_RESTART_S,
                               what=lambda: "the slot's lease parked at the head:\n" + a.log())
        harness.wait_until(lambda: a.log().count(slot + "leasing again\n") == 2,
                           what=lambda: "the slot to say it leases again:\n" + a.log())
        log = a.log()
        self.assertEqual(log.count(said + "network: "), 2, log)  # once per outage
        self.assertEqual(len(re.findall(re.escape(said) + r"network: .*\(retrying\)\n", log)),
                         2, log)
        away = re.findall(re.escape(said) + r"reached the head again after (\d+\.\d) s\n", log)
        self.assertEqual(len(away), 2, log)
        self.assertTrue(all(float(s) >= 1.9 for s in away), log)  # from the first failure
        self.assertEqual(log.count(slot + "lease from hb: network"), 2, log)
        self.assertEqual(a.workers(), [pid])


class CrashWhileHeadAwayTest(NodeTestCase):
    """A worker killed while the head is away: its agent keeps the crash report until the
    head answers it, so the head ends the worker and lapses its lease ("worker crashed")
    once it is back, not a worker timeout (here 300 s) later."""
    head_args = ["--node-timeout-ms", "1500", "--worker-timeout-ms", "300000"]
    setUp = HeadAwayTest.setUp

    def test_crash_reports_wait_for_the_head(self):
        # The report that got no answer was logged and dropped: the head, back, kept the
        # dead workers active and the tasks leased to them until the worker timeout.
        self.head.start()
        self.make_queue("away", lease_ms=300000, backoff_ms=0)
        a = self.agent("away", args=["--queue", "away", "--workers", "2"],
                       cmd=["sleep", "300"]).start()
        pids = self.wait_workers(a, 2)
        tids = self.put("away", ["a", "b"])
        harness.wait_until(lambda: all(self.task(t)["state"] == "leased" for t in tids),
                           timeout=20, what=lambda: "both tasks leased:\n" + a.log())
        self.head.kill()
        dead = [self.kill_worker(a, pid) for pid in pids]  # worker ids, in the order they died
        first = "reporting the crash of worker %d: network: " % dead[0]
        harness.wait_until(lambda: first in a.log(),
                           what=lambda: "the crash report refused a connection:\n" + a.log())
        # Then the head answers 503 (it is starting) for three heartbeats: no answer of the
        # head's either.  The report goes again after each heartbeat, not in a loop.  The
        # node's heartbeats are told by their path: the workers the agent started again
        # post their registrations to the same head.
        busy, paths = busy_head(self.head.port)

        def beats_and_reports():
            beats = [p for m, p in paths if m == "POST" and re.fullmatch(
                r"/v1/nodes/[^/]+/heartbeat", p)]
            return beats, [p for m, p in paths if m == "DELETE"]

        try:
            # The report follows each heartbeat: wait for the one after the third.
            harness.wait_until(
                lambda: (lambda b, d: len(b) >= 3 and len(d) >= len(b))(*beats_and_reports()),
                what=lambda: "three heartbeats answered 503, each followed by the crash "
                "report:\n%s\n%s" % (paths, a.log()))
        finally:
            busy.shutdown()
            busy.server_close()
        beats, deletes = beats_and_reports()
        self.assertEqual(set(deletes), {"/v1/workers/%d?crashed=true" % dead[0]})
        self.assertLessEqual(len(deletes), len(beats) + 1,
                             "crash reports sent while the head answered 503, against %d "
                             "heartbeats: %s" % (len(beats), paths))
        self.head.start()
        for tid in tids:
            task = harness.wait_until(
                lambda: (lambda t: t if t["error"] == "worker crashed" else None)(self.task(tid)),
                timeout=20, what=lambda: "the task's lease lapsed as its worker crashed:\n" + a.log())
            self.assertNotIn((task.get("lease") or {}).get("worker"), dead, task)
        for worker_id in dead:
            self.assertEqual(
                self.head.request("GET", "/v1/workers/%d" % worker_id).json["state"], "gone")
        said = harness.wait_until(lambda: (lambda found: found if len(found) == 2 else None)(
            re.findall(r"reported the crash of worker (\d+) after (\d+) tr(?:y|ies), "
                       r"\d+\.\d s after it died: the head ended it \(1 lease lapsed\)\n",
                       a.log())), what=lambda: "the agent to say the reports got through:\n" + a.log())
        self.assertEqual([int(worker) for worker, _ in said], dead)  # in order
        self.assertGreaterEqual(int(said[0][1]), 3)  # refused, 503, answered
        self.assertEqual(int(said[1][1]), 1)  # it waited behind the first, unsent
        log = a.log()
        self.assertEqual(log.count("reporting the crash of worker"), 1, log)  # the first failure

    def kill_worker(self, agent, pid):
        """kill -9 of worker process `pid`; its worker id, once its agent said it crashed."""
        os.kill(pid, signal.SIGKILL)
        line = harness.wait_until(
            lambda: re.search(r"\(pid %d, worker id (\d+)\) crashed" % pid, agent.log()),
            what=lambda: "the agent to see worker pid %d crash:\n%s" % (pid, agent.log()))
        return int(line.group(1))

    def test_a_stop_drops_the_report_the_head_did_not_answer(self):
        # The stop tries once more, then says what becomes of the worker on the head.
        self.head.start()
        self.make_queue("away")
        a = self.agent("gone", args=["--queue", "away", "--workers", "1"],
                       cmd=["sleep", "300"]).start()
        [pid] = self.wait_workers(a, 1)
        [worker_id] = [w["id"] for w in self.head.request("GET", "/v1/workers").json["workers"]
                       if w["node"] == "gone" and w["state"] == "active"]
        self.head.kill()
        os.kill(pid, signal.SIGKILL)
        harness.wait_until(lambda: "reporting the crash of worker %d: network: " % worker_id
                           in a.log(), what=lambda: "the crash report to fail:\n" + a.log())
        a.proc.send_signal(signal.SIGTERM)
        self.assertEqual(a.proc.wait(30), 0, a.log())
        log = a.log()
        self.assertRegex(log, r"muster node: stopping with the crash report of worker %d not "
                         r"sent: the head did not answer \(DELETE .*\); its worker timeout "
                         r"\(--worker-timeout-ms, 60 s by default\) ends the worker and returns "
                         r"its leases\n" % worker_id)
        self.assertEqual(log.count("reporting the crash of worker"), 1, log)


class CrashQueueOverflowTest(NodeTestCase):
    """More workers die while the head is away than the crash-report queue keeps (made 2
    by the test-only MUSTER_TEST_CRASH_QUEUE_MAX, for 4 workers): the oldest reports are
    dropped, the first drop is said at once and how many were once the head has the
    rest, and the head still ends the dropped reports' workers, by its worker timeout."""
    head_args = ["--node-timeout-ms", "1500", "--worker-timeout-ms", "3000"]
    setUp = HeadAwayTest.setUp
    kill_worker = CrashWhileHeadAwayTest.kill_worker

    def test_the_oldest_reports_are_dropped_and_counted(self):
        # 257 reports in one outage were never tried; the queue dropped the oldest with a
        # line per report, and no line said how many were lost.
        self.head.start()
        self.make_queue("over")
        a = self.agent("over", args=["--queue", "over", "--workers", "4"], cmd=["sleep", "300"],
                       env={"MUSTER_TEST_CRASH_QUEUE_MAX": "2"}).start()
        pids = self.wait_workers(a, 4)
        self.head.kill()
        dead = [self.kill_worker(a, pid) for pid in pids]  # worker ids, in the order they died
        # Each report drops the oldest then: the two that died first, whichever is said
        # first (the agent may be sending the oldest when the next comes).
        first = harness.wait_until(
            lambda: re.search(r"muster node: crash reports: 2 wait for the head, the most kept; "
                              r"dropping the oldest, of worker (\d+), ", a.log()),
            what=lambda: "the agent to say it drops a report:\n" + a.log())
        self.assertIn(int(first.group(1)), dead[:2], a.log())
        self.head.start()
        said = harness.wait_until(
            lambda: re.search(r"muster node: crash reports: 2 dropped unsent while the head did "
                              r"not answer \(the first of worker (\d+), the last of worker "
                              r"(\d+); 2 are kept at most\): the head's worker timeout "
                              r"\(--worker-timeout-ms\) ends those workers\n", a.log()),
            timeout=AFTER_RESTART_S, what=lambda: "the agent to say how many it dropped:\n" +
            a.log())
        self.assertEqual(sorted(int(w) for w in said.groups()), sorted(dead[:2]), a.log())
        reported = re.findall(r"reported the crash of worker (\d+) after \d+ tr(?:y|ies), "
                              r"\d+\.\d s after it died: the head ended it", a.log())
        self.assertEqual([int(w) for w in reported], dead[2:], a.log())  # said before the count
        # The head ends every dead worker: the kept reports at once, the dropped ones by
        # its worker timeout.
        for worker_id in dead:
            harness.wait_until(
                lambda: self.head.request("GET", "/v1/workers/%d" % worker_id).json["state"]
                == "gone", timeout=20, what=lambda: "worker %d ended:\n%s" % (worker_id,
                                                                             self.head.log()))
        for worker_id in dead[:2]:
            self.assertIn("worker %d timed out" % worker_id, self.head.log())
        for worker_id in dead[2:]:
            self.assertNotIn("worker %d timed out" % worker_id, self.head.log())
        log = a.log()
        self.assertEqual(log.count("crash reports: 2 wait for the head"), 1, log)
        self.assertEqual(log.count("dropped unsent"), 1, log)
        self.assertIn("MUSTER_TEST_CRASH_QUEUE_MAX=2: the crash-report queue keeps 2 (for tests "
                      "only)", log)

    def test_a_bad_test_capacity_is_said_and_ignored(self):
        self.head.start()
        for value in ("0", "257", "2x", "-1", "+2", " 2"):
            with self.subTest(value=value):
                a = self.agent("knob" + str(len(self.agents)),
                               env={"MUSTER_TEST_CRASH_QUEUE_MAX": value}).start()
                harness.wait_until(lambda: "crash-report queue keeps" in a.log(),
                                   what=lambda: "the agent to say its queue:\n" + a.log())
                self.assertIn("muster node: MUSTER_TEST_CRASH_QUEUE_MAX=%s is not 1 to 256; the "
                              "crash-report queue keeps 256\n" % value, a.log())


class KillNineTest(NodeTestCase):
    def test_kill_9_leaves_no_orphans(self):
        self.make_queue("slow", max_attempts=5, backoff_ms=0)
        a = self.agent("k9", args=["--queue", "slow", "--workers", "2"],
                       cmd=["sh", "-c", "sleep 300 & sleep 300; wait"])
        a.start()
        self.wait_workers(a, 2)
        ids = self.put("slow", ["a", "b"])
        harness.wait_until(lambda: all(self.task(i)["state"] == "leased" for i in ids),
                           timeout=20, what=lambda: "both tasks leased:\n" + a.log())
        # The commands (and their own children) are running under the workers.
        below = harness.wait_until(
            lambda: (lambda d: d if len(d) >= 2 + 2 * 3 else None)(
                node_harness.descendants(a.proc.pid)),
            timeout=10, what="commands running")
        a.kill()
        harness.wait_until(lambda: not any(node_harness.alive(p) for p in below), timeout=15,
                           what="no process of the agent left: %r" % [
                               p for p in below if node_harness.alive(p)])
        # The head's node timeout (1.5 s) or the workers' goodbyes give the tasks back.
        harness.wait_until(lambda: all(self.task(i)["state"] == "queued" for i in ids),
                           timeout=20, what="tasks back in the queue")
        harness.wait_until(lambda: (self.node("k9") or {}).get("state") == "gone", timeout=20,
                           what="node gone")

    def test_kill_9_of_a_worker_kills_its_commands(self):
        self.make_queue("slow1", max_attempts=5, backoff_ms=0)
        # A sleep in the command's process group (the guard kills it) and a python that
        # leaves the group but not the worker's session (the agent's sweep kills it).
        leaver = "import os, time; os.setpgid(0, 0); time.sleep(300)"
        a = self.agent("k9w", args=["--queue", "slow1", "--workers", "1"],
                       cmd=["sh", "-c", "sleep 300 & %s -c '%s' & wait" % (sys.executable, leaver)])
        a.start()
        [worker] = self.wait_workers(a, 1)
        [tid] = self.put("slow1", ["a"])
        harness.wait_until(lambda: self.task(tid)["state"] == "leased", timeout=20,
                           what=lambda: "the task leased:\n" + a.log())

        def running():
            """The guard, sh, sleep and python, once python has its own group."""
            below = node_harness.descendants(worker)
            leaders = [p for p in below if (node_harness._stat(p) or (0, 0))[1] == p]
            return below if len(below) >= 4 and len(leaders) >= 2 else None
        below = harness.wait_until(running, timeout=10, what="the command running")
        os.kill(worker, signal.SIGKILL)
        harness.wait_until(lambda: not any(node_harness.alive(p) for p in below), timeout=15,
                           what="the dead worker's commands gone: %r\n%s" % (
                               [p for p in below if node_harness.alive(p)], a.log()))
        # The agent logs the kill of the python just after it (so wait for the line).
        harness.wait_until(lambda: "died with commands still running" in a.log(), timeout=10,
                           what=lambda: "the agent's account of the kill:\n" + a.log())
        # The crash report let the lease lapse; the restarted worker runs the task again.
        harness.wait_until(
            lambda: (lambda t: t if t["state"] == "leased" and t["attempts"] == 2 else None)(
                self.task(tid)), timeout=30, what=lambda: "the task leased again:\n" + a.log())
        self.assertIsNone(a.proc.poll(), "the agent survives its worker")
        self.assertNotIn(worker, a.workers())


if __name__ == "__main__":
    unittest.main()
