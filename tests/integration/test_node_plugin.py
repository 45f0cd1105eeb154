"""Worker plugins and update delivery: the suite's plugin (plugin_echo.c) under a node
agent; init runs once per worker; updates arrive in order between tasks, also to idle
workers and to workers started after the updates were posted; command workers read
them from MUSTER_UPDATES_FILE."""
import collections
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

PLUGIN = os.path.join(node_harness.build_dir(), "libplugin_echo.so")
LOADS = os.path.join(node_harness.build_dir(), "libplugin_loads.so")


class PluginTest(AgentsCase):
    dir_prefix = "muster-plugin-test-"

    def setUp(self):
        super().setUp()
        self.log_path = os.path.join(self.dir, "plugin.log")
        r = self.head.request("PUT", "/v1/queues/pool", {"backoff_ms": 0})
        self.assertEqual(r.status, 201, r)

    def agent(self, name, workers):
        a = Agent(self.head, self.dir, name,
                  args=["--queue", "pool", "--workers", str(workers), "--plugin", PLUGIN,
                        "--init-data", '{"model": "m1"}'],
                  env={"PLUGIN_LOG": self.log_path})
        self.agents.append(a)
        return a.start()

    def update(self, data):
        r = self.head.request("POST", "/v1/queues/pool/updates", {"data": data})
        self.assertEqual(r.status, 201, r)
        return r.json["seq"]

    def run_tasks(self, payloads, agent):
        r = self.head.request("POST", "/v1/queues/pool/tasks",
                              {"tasks": [{"payload": p} for p in payloads]})
        self.assertEqual(r.status, 201, r)
        ids = [t["id"] for t in r.json["tasks"]]

        def done():
            tasks = [self.head.request("GET", "/v1/tasks/%d" % i).json for i in ids]
            return tasks if all(t["state"] == "done" for t in tasks) else None
        return [t["result"] for t in harness.wait_until(done, timeout=30,
                                                         what=lambda: "tasks done:\n" + agent.log())]

    def plugin_log(self):
        with open(self.log_path) as f:
            return [line.split(" ", 3) for line in f.read().splitlines()]

    def test_init_once_and_updates_in_order(self):
        self.assertEqual(self.update({"v": 1}), 1)  # before any worker exists
        a = self.agent("p1", 2)
        first = self.run_tasks(["a%d" % i for i in range(6)], a)
        self.assertTrue(all(r["updates"] == [1] for r in first), first)
        self.assertTrue(all(r["inits"] == 1 for r in first), first)
        self.update({"v": 2})
        self.update({"v": 3})
        second = self.run_tasks(["b%d" % i for i in range(6)], a)
        self.assertTrue(all(r["updates"] == [1, 2, 3] for r in second), second)
        # Idle workers get an update between tasks too (their long-poll wakes).
        pids = set(a.workers())
        self.assertEqual(len(pids), 2)
        self.update({"v": 4})
        harness.wait_until(
            lambda: {int(f[1]) for f in self.plugin_log() if f[0] == "update" and f[2] == "4"}
            >= pids, what=lambda: "update 4 at both idle workers:\n" + a.log())
        entries = self.plugin_log()
        inits = collections.Counter(int(f[1]) for f in entries if f[0] == "init")
        self.assertEqual(dict(inits), {p: 1 for p in pids})
        self.assertTrue(all(" ".join(f[2:]) == '{"model": "m1"}' for f in entries if f[0] == "init"))
        for pid in pids:
            seqs = [int(f[2]) for f in entries if f[0] == "update" and int(f[1]) == pid]
            self.assertEqual(seqs, [1, 2, 3, 4])
            datas = [json.loads(f[3]) for f in entries if f[0] == "update" and int(f[1]) == pid]
            self.assertEqual(datas, [{"v": 1}, {"v": 2}, {"v": 3}, {"v": 4}])
        self.assertTrue({r["pid"] for r in first + second} <= pids)
        # A graceful stop calls fini in every worker.
        self.assertEqual(a.stop(), 0)
        finis = {int(f[1]) for f in self.plugin_log() if f[0] == "fini"}
        self.assertEqual(finis, pids)

    def test_late_worker_gets_every_update_first(self):
        for v in range(1, 4):
            self.update({"v": v})
        a = self.agent("p2", 1)
        [result] = self.run_tasks(["late"], a)
        self.assertEqual(result["updates"], [1, 2, 3])
        self.assertEqual(result["payload"], "late")

    def test_plugin_failure_fails_the_task(self):
        a = self.agent("p3", 1)
        r = self.head.request("POST", "/v1/queues/pool/tasks",
                              {"tasks": [{"payload": "fail"}]})
        tid = r.json["tasks"][0]["id"]
        t = harness.wait_until(
            lambda: (lambda t: t if t["error"] == "asked to fail" else None)(
                self.head.request("GET", "/v1/tasks/%d" % tid).json),
            timeout=20, what=lambda: "the failure recorded:\n" + a.log())
        self.assertIn(t["state"], ("queued", "leased", "dead"))


class PluginRefusedTest(AgentsCase):
    """A --plugin that no worker could load stops the agent (or `muster head`) at its
    start, exit 2, instead of workers that fail and are restarted for ever."""
    dir_prefix = "muster-plugin-test-"

    def unloadable_plugins(self):
        """(path, what the refusal says) for each kind of plugin a worker cannot load."""
        not_elf = os.path.join(self.dir, "notes.so")
        with open(not_elf, "w") as f:
            f.write("not a shared object\n")
        # A real shared object, but not a plugin: it has no muster_plugin().
        no_entry = os.path.join(node_harness.build_dir(), "libfake_nvml.so")
        return [("/nonexistent/libwork.so", "cannot open shared object file"),
                (not_elf, "cannot load plugin " + not_elf),
                (no_entry, "it does not export muster_plugin()")]

    def test_node_refuses_a_plugin_it_cannot_load(self):
        r = self.head.request("PUT", "/v1/queues/pool", {})
        self.assertEqual(r.status, 201, r)
        for i, (path, why) in enumerate(self.unloadable_plugins()):
            a = Agent(self.head, self.dir, "badplugin%d" % i,
                      args=["--queue", "pool", "--workers", "1", "--plugin", path])
            self.agents.append(a)
            a.start(wait_listen=False)
            self.assertEqual(a.proc.wait(15), 2, a.log())
            log = a.log()
            self.assertIn("muster node: ", log)
            self.assertIn(path, log)
            self.assertIn(why, log)
            self.assertIn("no worker was started", log)
            self.assertNotIn("restarting", log)
            self.assertEqual(self.head.request("GET", "/v1/nodes/" + a.name).status, 404, log)

    def test_worker_refuses_a_plugin_it_cannot_load(self):
        # `muster worker --plugin` exited 1 where a command that cannot run exits 2, and
        # without saying that nothing was leased.
        r = self.head.request("PUT", "/v1/queues/pool", {})
        self.assertIn(r.status, (200, 201), r)
        self.head.request("POST", "/v1/queues/pool/tasks", {"tasks": [{"payload": "x"}]})
        for path, why in self.unloadable_plugins():
            r = subprocess.run([harness.MUSTER_BIN, "worker", "--url", self.head.url, "--token",
                                self.head.token, "--queue", "pool", "--plugin", path],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertTrue(r.stderr.startswith("muster worker: "), r.stderr)
            self.assertIn(why, r.stderr)
            self.assertTrue(r.stderr.endswith("; nothing was leased\n"), r.stderr)
        self.assertEqual(self.head.request("GET", "/v1/workers").json["workers"], [])
        self.assertEqual(self.head.request("GET", "/v1/queues/pool").json["counts"]["queued"], 1)

    def test_node_loads_a_good_plugin(self):
        a = Agent(self.head, self.dir, "goodplugin",
                  args=["--queue", "pool", "--workers", "1", "--plugin", PLUGIN])
        self.agents.append(a)
        a.start()
        harness.wait_until(lambda: len(a.workers()) == 1, what=lambda: "a worker:\n" + a.log())
        self.assertEqual(a.stop(), 0, a.log())

    def test_head_refuses_a_plugin_its_local_agent_cannot_load(self):
        for path, why in self.unloadable_plugins():
            data = os.path.join(self.dir, "data")
            r = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                "--data-dir", data, "--queue", "q", "--plugin", path],
                               env=node_harness.no_gpu_env(
                                   dict(os.environ,
                                        MUSTER_NODE_LOCK=os.path.join(self.dir, "head.lock"))),
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("muster head: ", r.stderr)
            self.assertIn(why, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(data, "url")), r.stderr)


    # ---- the start check's time limit, and one check per start -----------------------

    def head_env(self, **extra):
        return node_harness.no_gpu_env(dict(
            os.environ, MUSTER_NODE_LOCK=os.path.join(self.dir, "head.lock"), **extra))

    def loads(self, path):
        with open(path) as f:
            return [line.split() for line in f.read().splitlines()]

    def assert_hang_refused(self, log, loads_path, prog):
        self.assertIn("%s: plugin %s: loading it did not end within 0.3 s (a constructor or "
                      "muster_plugin() that hangs?); MUSTER_PLUGIN_CHECK_TIMEOUT_MS sets the "
                      "limit in milliseconds; no worker was started\n" % (prog, LOADS), log)
        [(_, command, pid)] = self.loads(loads_path)  # the check's child, killed
        self.assertIn(command, ("node", "head"))
        harness.wait_until(lambda: not node_harness.alive(int(pid)), what="the check killed")

    def test_node_refuses_a_plugin_whose_load_hangs(self):
        # The load had no time limit: a constructor that never returned hung the start.
        loads_path = os.path.join(self.dir, "loads-node")
        a = Agent(self.head, self.dir, "hangplugin",
                  args=["--queue", "pool", "--workers", "1", "--plugin", LOADS],
                  env={"PLUGIN_HANG": "1", "PLUGIN_LOADS": loads_path,
                       "MUSTER_PLUGIN_CHECK_TIMEOUT_MS": "300"})
        self.agents.append(a)
        a.start(wait_listen=False)
        self.assertEqual(a.proc.wait(15), 2, a.log())
        self.assert_hang_refused(a.log(), loads_path, "muster node")
        self.assertEqual(self.head.request("GET", "/v1/nodes/" + a.name).status, 404)

    def test_head_refuses_a_plugin_whose_load_hangs(self):
        loads_path = os.path.join(self.dir, "loads-head")
        data = os.path.join(self.dir, "data-hang")
        r = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                            "--data-dir", data, "--queue", "q", "--plugin", LOADS],
                           env=self.head_env(PLUGIN_HANG="1", PLUGIN_LOADS=loads_path,
                                             MUSTER_PLUGIN_CHECK_TIMEOUT_MS="300"),
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assert_hang_refused(r.stderr, loads_path, "muster head")
        self.assertFalse(os.path.exists(os.path.join(data, "url")), r.stderr)

    def test_a_bad_check_timeout_is_said_and_the_default_kept(self):
        r = subprocess.run([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                            "--data-dir", os.path.join(self.dir, "data-bad"), "--queue", "q",
                            "--plugin", "/nonexistent/libwork.so"],
                           env=self.head_env(MUSTER_PLUGIN_CHECK_TIMEOUT_MS="30s"),
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith(
            "muster head: MUSTER_PLUGIN_CHECK_TIMEOUT_MS='30s' is not a number of milliseconds "
            "from 1 to 3600000; the plugin check takes the default, 30 s\n"), r.stderr)

    def test_head_checks_the_plugin_once(self):
        # The head checked it, then its local agent checked it again: two loads (and two
        # waits on a slow constructor) before any worker.
        loads_path = os.path.join(self.dir, "loads-once")
        head = subprocess.Popen([harness.MUSTER_BIN, "head", "--listen", "127.0.0.1:0",
                                 "--data-dir", os.path.join(self.dir, "data-once"),
                                 "--queue", "q", "--workers", "1", "--plugin", LOADS],
                                env=self.head_env(PLUGIN_LOADS=loads_path),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            harness.wait_until(lambda: os.path.exists(loads_path) and any(
                c == "worker" for _, c, _ in self.loads(loads_path)), timeout=30,
                what="a worker to load the plugin")
        finally:
            head.terminate()
            err = head.communicate(timeout=30)[1]
        commands = [c for _, c, _ in self.loads(loads_path)]
        self.assertEqual(commands[0], "head", err)  # the check, before any worker
        self.assertEqual(commands.count("head"), 1, (commands, err))


class CommandUpdatesTest(unittest.TestCase):
    def test_updates_file_for_commands(self):
        with harness.Head() as head:
            head.request("PUT", "/v1/queues/cmdq", {})
            for v in (1, 2):
                self.assertEqual(head.request("POST", "/v1/queues/cmdq/updates",
                                              {"data": {"v": v}}).status, 201)
            head.request("POST", "/v1/queues/cmdq/tasks", {"tasks": [{"payload": "x"}]})
            script = ('printf "%s|%s|%s|%s" "$MUSTER_UPDATE_SEQ" '
                      '"$(wc -l < "$MUSTER_UPDATES_FILE")" "$(tail -n 1 "$MUSTER_UPDATES_FILE")" '
                      '"$MUSTER_UPDATES_FILE"')
            out = subprocess.run(
                [harness.MUSTER_BIN, "worker", "--url", head.url, "--token", head.token,
                 "--queue", "cmdq", "--max-tasks", "1", "--", "sh", "-c", script],
                capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            task = head.request("GET", "/v1/queues/cmdq/tasks?state=done").json["tasks"][0]
            seq, lines, last, path = task["result"].split("|")
            self.assertEqual((seq, lines.strip()), ("2", "2"))
            self.assertEqual(json.loads(last), {"seq": 2, "data": {"v": 2}, "session": None})
            self.assertFalse(os.path.exists(path), "the updates file is removed at exit")

    def test_worker_needs_a_command_or_plugin(self):
        out = subprocess.run([harness.MUSTER_BIN, "worker", "--queue", "q"], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--plugin", out.stderr)


if __name__ == "__main__":
    unittest.main()
