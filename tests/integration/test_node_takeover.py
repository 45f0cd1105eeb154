"""A node agent restarted after a crash takes its node back at once: its lock file names
the dead agent's instance, which it sends as `previous_instance`, and the head hands the
node over without waiting for the node timeout (docs/node.md, docs/api.md "Nodes").
The heads here wait 60 s for a silent node, so every "at once" below is far shorter."""
import http.server
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

AT_ONCE_S = 10  # bound on a takeover; the node timeout is 60 s
NODE_TIMEOUT = ["--node-timeout-ms", "60000", "--worker-timeout-ms", "60000"]


class TakeoverCase(AgentsCase):
    head_args = NODE_TIMEOUT
    dir_prefix = "muster-takeover-test-"

    def agent(self, name, log, lock=None, **kw):
        """An agent logging to `log`.log, with lock file `lock` (default: the name's)."""
        a = Agent(self.head, self.dir, name, **kw)
        a.log_path = os.path.join(self.dir, log + ".log")
        if lock:
            a.lock = os.path.join(self.dir, lock)
        self.agents.append(a)
        return a

    def start(self, a):
        return start_agent(a)

    def lock_when(self, agent, ready, what):
        """`agent`'s lock text (Agent.lock_info) once `ready` holds of it: the agent
        rewrites its lock file as its state changes, which the head does not wait for."""
        seen = []

        def check():
            info = agent.lock_info()
            seen[:] = [info]
            return info if ready(info) else None
        try:
            return harness.wait_until(check, timeout=AT_ONCE_S, what=what)
        except AssertionError as e:
            raise AssertionError("%s; the lock file says %r:\n%s" % (e, seen[0], agent.log()))

    def call(self, method, path, body=None, status=200):
        r = self.head.request(method, path, body)
        self.assertEqual(r.status, status, "%s %s -> %r" % (method, path, r))
        return r.json

    def node(self, name):
        r = self.head.request("GET", "/v1/nodes")
        return {n["name"]: n for n in r.json["nodes"]}.get(name)

    def node_at(self, name, agent):
        """The node while it is active and registered with `agent`'s address."""
        n = self.node(name)
        ok = n and n["state"] == "active" and n["address"] == agent.url[len("http://"):]
        return n if ok else None

    def task(self, tid):
        return self.call("GET", "/v1/tasks/%d" % tid)

    def put(self, queue, payload):
        r = self.call("POST", "/v1/queues/%s/tasks" % queue, {"tasks": [{"payload": payload}]},
                      status=201)
        return r["tasks"][0]["id"]

    def held_lease(self, node, queue):
        """A worker of `node` registered over HTTP (no process: nobody says its goodbye)
        holding a lease on a new task of `queue`; returns the task id."""
        tid = self.put(queue, "held")
        wid = self.call("POST", "/v1/workers", {"node": node, "queues": [queue]}, 201)["id"]
        leases = self.call("POST", "/v1/queues/%s/lease" % queue, {"worker": wid})["leases"]
        self.assertEqual([l["task"] for l in leases], [tid])
        return tid


class RestartTakeoverTest(TakeoverCase):
    def test_restart_after_kill_9_takes_the_node_back_at_once(self):
        """SIGKILL of an agent whose worker runs a task blocked on a FIFO; the agent started
        again with the same name and lock file registers at once, its predecessor's workers
        end and their leases are released (a lease no process gives back included), and the
        blocked task runs again on the new agent's worker."""
        for q in ("blocked", "held"):
            self.call("PUT", "/v1/queues/" + q, {"max_attempts": 5, "backoff_ms": 0}, 201)
        fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(fifo)
        cmd = ["sh", "-c", "cat '%s'" % fifo]
        first = self.agent("crash", "first", args=["--queue", "blocked", "--workers", "1"],
                           cmd=cmd)
        self.start(first)
        dead = first.lock_info()["instance"]
        harness.wait_until(lambda: (self.node("crash") or {}).get("workers") == 1,
                           timeout=20, what=lambda: "the first agent's worker:\n" + first.log())
        blocked = self.put("blocked", "x")
        old_worker = harness.wait_until(
            lambda: (self.task(blocked)["lease"] or {}).get("worker"), timeout=20,
            what=lambda: "the blocked task leased:\n" + first.log())
        held = self.held_lease("crash", "held")
        below = node_harness.descendants(first.proc.pid)
        first.kill()
        harness.wait_until(lambda: not any(node_harness.alive(p) for p in below), timeout=15,
                           what="the first agent's workers gone (PR_SET_PDEATHSIG)")
        # The dying worker said goodbye; the HTTP-registered one cannot.
        harness.wait_until(lambda: self.node("crash")["workers"] == 1, timeout=15,
                           what="the first agent's worker said goodbye")
        self.assertEqual(self.task(held)["state"], "leased")

        second = self.start(self.agent("crash", "second",
                                       args=["--queue", "blocked", "--workers", "1"], cmd=cmd))
        self.assertIn("taking over from instance %s" % dead, second.log())
        harness.wait_until(lambda: self.node_at("crash", second), timeout=AT_ONCE_S,
                           what="the restarted agent registered at once:\n%s\n%s" % (
                               second.log(), self.head.log()))
        self.assertNotIn("held by another running agent", second.log())
        line = ("node crash: a restarted agent took over from instance %s (its lock proved %s "
                "gone); 1 workers ended, 1 leases released" % (dead, dead))
        harness.wait_until(lambda: line in self.head.log(), timeout=5,
                           what=lambda: "the head's account:\n" + self.head.log())
        self.assertEqual(self.task(held)["state"], "queued")
        harness.wait_until(
            lambda: (lambda t: t if t["state"] == "leased" and
                     t["lease"]["worker"] != old_worker else None)(self.task(blocked)),
            timeout=AT_ONCE_S, what=lambda: "the blocked task on the new worker:\n" + second.log())
        # The new node's lock file names the new agent alone, once the agent rewrote it
        # after its registration (on its own thread, after the head already had it).
        info = self.lock_when(second, lambda i: "instance" in i and "previous_instance" not in i,
                              "the lock to name the new agent alone")
        self.assertNotEqual(info["instance"], dead)
        # Let the command finish: the task completes on the new node.
        fd = harness.wait_until(lambda: _open_writer(fifo), what="the command reading")
        os.write(fd, b"done\n")
        os.close(fd)
        harness.wait_until(lambda: self.task(blocked)["state"] == "done", timeout=20,
                           what=lambda: "the task done:\n" + second.log())
        self.assertEqual(second.stop(), 0, second.log())

    def test_an_agent_that_failed_before_registering_passes_the_instance_on(self):
        """An agent killed, one started after it that fails before registering (a bad
        --gpus), then a third: the third still takes over at once, from the first."""
        first = self.start(self.agent("chain", "first"))
        dead = first.lock_info()["instance"]
        harness.wait_until(lambda: self.node_at("chain", first), what="the first registered")
        first.kill()
        failed = self.agent("chain", "failed", args=["--gpus", "x"])
        failed.start(wait_listen=False)
        self.assertEqual(failed.proc.wait(20), 2, failed.log())
        self.assertEqual(failed.lock_info().get("previous_instance"), dead)
        third = self.start(self.agent("chain", "third"))
        self.assertIn("taking over from instance %s" % dead, third.log())
        harness.wait_until(lambda: self.node_at("chain", third), timeout=AT_ONCE_S,
                           what=lambda: "the third agent registered at once:\n" + third.log())
        self.assertIn("took over from instance %s" % dead, self.head.log())
        self.assertEqual(third.stop(), 0, third.log())


class NoTakeoverTest(TakeoverCase):
    def test_clean_stop_leaves_nothing_to_take_over(self):
        """An agent that stopped cleanly said goodbye: its lock file names no instance,
        and the next agent neither sends previous_instance nor says it took over."""
        first = self.start(self.agent("calm", "first"))
        # Registered by the agent's word too (Agent.registered): one stopped while it
        # registered again (its first try outlasted its 5 s request timeout on a loaded
        # machine, though the head took it) says no goodbye and keeps its instance.
        harness.wait_until(lambda: self.node_at("calm", first) and first.registered(),
                           what=lambda: "the first registered:\n" + first.log())
        self.assertEqual(first.stop(), 0, first.log())
        info = first.lock_info()
        self.assertNotIn("instance", info, info)
        self.assertNotIn("previous_instance", info, info)
        second = self.start(self.agent("calm", "second"))
        harness.wait_until(lambda: self.node_at("calm", second), what="the second registered")
        self.assertNotIn("taking over", second.log())
        self.assertNotIn("took over", self.head.log())
        self.assertEqual(second.stop(), 0, second.log())

    def test_other_lock_file_is_refused_while_the_holder_runs(self):
        """A second agent under the name with another lock file is refused while the first
        runs, also when its lock file holds a copy of the first's (a copy proves nothing:
        it names a running agent)."""
        first = self.start(self.agent("twin", "first"))
        harness.wait_until(lambda: self.node_at("twin", first), what="the first registered")
        with open(first.lock) as f:
            text = f.read()
        for lock, copy in (("fresh.lock", None), ("copied.lock", text)):
            with self.subTest(lock=lock):
                if copy:
                    with open(os.path.join(self.dir, lock), "w") as f:
                        f.write(copy)
                second = self.start(self.agent("twin", lock, lock=lock))
                harness.wait_until(lambda: "is held by another running agent" in second.log(),
                                   timeout=20, what=lambda: "the refusal:\n" + second.log())
                self.assertTrue(self.node_at("twin", first))
                self.assertNotIn("taking over", second.log())
                self.assertNotIn("took over", self.head.log())
                # Refused its name to the end: it did not start (exit 1, node.md).
                self.assertEqual(second.stop(), 1, second.log())
                self.assertIn("node twin did not start: the head refused its registration",
                              second.log())
        self.assertEqual(first.stop(), 0, first.log())

    def test_registration_previous_instance(self):
        """Over HTTP: a wrong previous_instance takes nothing over; the holder's does, at
        once, and releases its workers' leases; malformed ones are refused with 400."""
        self.call("PUT", "/v1/queues/q", {}, 201)
        self.call("POST", "/v1/nodes", {"name": "box", "instance": "live1"}, 201)
        held = self.held_lease("box", "q")
        r = self.head.request("POST", "/v1/nodes", {"name": "box", "instance": "new1",
                                                     "previous_instance": "wrong1"})
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertIn("held by another running agent", r.json["error"]["message"])
        self.assertEqual(self.task(held)["state"], "leased")
        bad = [(7, "previous_instance: expected a string"),
               ("x" * 129, "previous_instance: '%s' is invalid: use 1 to 128 characters"
                % ("x" * 129)),
               ("x" * 600, "previous_instance: longer than 512 bytes"),
               ("a b", "previous_instance: 'a b' is invalid")]
        for value, message in bad:
            with self.subTest(value=value):
                r = self.head.request("POST", "/v1/nodes", {
                    "name": "box", "instance": "new1", "previous_instance": value})
                self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), r)
                self.assertIn(message, r.json["error"]["message"])
        r = self.head.request("POST", "/v1/nodes", {"name": "box", "previous_instance": "live1"})
        self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), r)
        self.assertIn("previous_instance: sent without instance", r.json["error"]["message"])
        self.assertEqual(self.task(held)["state"], "leased")
        # The holder's own instance, as an agent that took its lock sends it.
        node = self.call("POST", "/v1/nodes", {"name": "box", "instance": "new1",
                                               "previous_instance": "live1"})
        self.assertEqual((node["state"], node["workers"]), ("active", 0))
        self.assertEqual(self.task(held)["state"], "queued")
        self.assertIn("node box: a restarted agent took over from instance live1 (its lock "
                      "proved live1 gone); 1 workers ended, 1 leases released", self.head.log())
        # The old instance is the one refused now.
        r = self.head.request("POST", "/v1/nodes/box/heartbeat", {"instance": "live1"})
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)


class OlderHeadTest(unittest.TestCase):
    def test_a_head_without_previous_instance(self):
        """A head that does not know previous_instance (400 unknown field): the restarted
        agent registers without it."""
        bodies = []

        class OldHead(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/v1/nodes":
                    bodies.append(body)
                if "previous_instance" in body:
                    self.reply(400, {"error": {"code": "invalid_argument",
                                               "message": "previous_instance: unknown field"}})
                elif self.path == "/v1/nodes":
                    self.reply(201, {"name": body["name"], "timeout_ms": 60000})
                else:
                    self.reply(200, {"name": "old", "state": "active"})

            def do_DELETE(self):
                self.reply(200, {})

            def reply(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OldHead)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        work = tempfile.mkdtemp(prefix="muster-takeover-test-")
        head = type("H", (), {"url": "http://127.0.0.1:%d" % server.server_address[1],
                              "token": "t" * 32})()
        agents = []
        try:
            first = Agent(head, work, "old")
            agents.append(first)
            start_agent(first)
            harness.wait_until(lambda: len(bodies) == 1, what="the first registration")
            dead = first.lock_info()["instance"]
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
            second = Agent(head, work, "old")
            second.log_path = os.path.join(work, "second.log")
            agents.append(second)
            start_agent(second)
            harness.wait_until(lambda: len(bodies) == 3, timeout=AT_ONCE_S,
                               what=lambda: "the registration without it:\n" + second.log())
            self.assertEqual(bodies[1].get("previous_instance"), dead)
            self.assertNotIn("previous_instance", bodies[2])
            harness.wait_until(lambda: "registering without it" in second.log(),
                               what=lambda: "the agent's account:\n" + second.log())
            self.assertEqual(second.stop(), 0, second.log())
        finally:
            for a in agents:
                a.kill()
            server.shutdown()
            server.server_close()
            thread.join()
            shutil.rmtree(work, ignore_errors=True)


def start_agent(a):
    """Starts agent `a` and waits for its own lock text (Agent.start() would take the
    API address its dead predecessor left in the lock file for this one's)."""
    a.start(wait_listen=False)

    def ready():
        info = a.lock_info()
        mine = info.get("pid") == str(a.proc.pid) and info.get("listen", "").startswith("http")
        if a.proc.poll() is not None:
            raise AssertionError("agent exited with %s:\n%s" % (a.proc.returncode, a.log()))
        return info if mine else None
    a.url = harness.wait_until(ready, timeout=20, what=lambda: "the agent started:\n" + a.log())["listen"]
    return a


def _open_writer(path):
    """A write end of FIFO `path` once a reader has it open, else None."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


if __name__ == "__main__":
    unittest.main()
