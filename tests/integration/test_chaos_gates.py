"""Chaos where the test knows every input in flight at each kill, and counts every run.

test_chaos.py kills a command, a node agent and the head while results flow, and checks
the end alone: which inputs were in flight at a kill it cannot know.  Here each input's
command (WORK) first leaves a file for its run (RUNS/INPUT.NODE.PID), then waits for
the input's gate file (GATES/INPUT) before it answers "INPUT SQUARE NODE PID".  The test
opens the gates of inputs 0 .. MARK-1 and waits until the map has settled: every input
below MARK has its result, and each live worker holds one input at a closed gate.  A
kill comes only then, so the inputs in flight are exactly the held ones and the
acknowledged results exactly those below MARK.  The held runs a kill ends, or whose
lease a freeze takes away, are counted lost.  At the end (`muster map` exits 0 with
every input's result once and right):

- every input ran exactly once more than it was lost: work that was acknowledged never
  ran again, and nothing ran again without a kill that ended it;
- each result is the answer of the input's one run that was not lost (node and pid);
- the session's results read from the head at each kill are all still there, unchanged,
  at the next one (and right after a head restart);
- the queue holds nothing queued, leased or dead.

Each scenario runs on its own head and two node agents of 2 CPU workers in network
namespaces (machines.py):

- a `muster worker` process killed with kill -9, twice: its agent reports the crash (the
  task's error says "worker crashed": its lease lapsed at once, not at its expiry) and
  starts a new worker, which takes work; no process of the dead worker's session is left;
- test_chaos's kills with gates: a held command killed (its worker fails the task, which
  runs again), node 1's agent killed (its held inputs run again; it comes back at once
  with the same lock file, or after the head's restart), the head killed and restarted on
  its data (the held inputs run once: their leases outlive it);
- a power cut of node 1 (SIGSTOP of its agent, workers and commands, then SIGKILL): its
  held inputs come back when the head times the node out ("node timed out") and node 2
  runs them; 15 to 25 results later the head is killed and restarted on its data;
- node 1 frozen (the same SIGSTOP) past its timeout while it holds inputs, which node 2
  then runs and acknowledges, and thawed (SIGCONT): its stale runs finish through their
  open gates and their answers are refused (fencing tokens), its agent and workers
  register again, keep their new leases, and take work.

The marks and victims come from a seed, printed; MUSTER_CHAOS_SEED=N repeats a run.
Needs root (CAP_NET_ADMIN) for `ip netns`; without it the tests skip, saying why.
MUSTER_BIN names the binary (ctest sets it).
"""
import collections
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machines  # noqa: E402
from machines import describe_pids, log, run, tagged_pids, wait_for  # noqa: E402

MUSTER_BIN = os.path.abspath(os.environ.get("MUSTER_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "muster"))
SEED = int(os.environ.get("MUSTER_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
TOKEN = "chaos-gates-token-0123456789"
QUEUE = "gated"
INPUTS = 120
WORKERS = 2  # per node
# A run: its file, then the wait at the input's gate, then the answer.  RUNS, GATES and
# NODE_TAG come from the agent's environment; $$ is the command's pid.
WORK = ('read x; : > "$RUNS/$x.$NODE_TAG.$$"; '
        'while [ ! -e "$GATES/$x" ]; do sleep 0.02; done; '
        'echo "$x $((x*x)) $NODE_TAG $$"')

Run = collections.namedtuple("Run", "input node pid")


class GatedMap:
    """A head, two nodes and one unordered `muster map` of INPUTS inputs whose commands
    wait at gates; what the test knows of it (the mark, the runs lost to kills)."""

    def __init__(self, cluster):
        self.cluster, self.net = cluster, cluster.machines
        self.runs_dir = os.path.join(cluster.tmp, "runs")
        self.gates_dir = os.path.join(cluster.tmp, "gates")
        os.makedirs(self.runs_dir)
        os.makedirs(self.gates_dir)
        self.mark = 0  # the gates of the inputs below it are open
        self.lost = []  # Runs ended by a kill
        self.kept = {}  # the session's results at the last kill, by index
        self.lines, self.lock = [], threading.Lock()
        self.tags = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.open_gates(INPUTS)  # a failed test's commands end: the nodes stop at once

    def cli(self, *args):
        """A muster CLI command in the head's namespace against the head; its stdout."""
        return run(*self.net.wrap("h", [MUSTER_BIN] + list(args) +
                                  ["--url", self.net.head_url, "--token", TOKEN]))

    def start(self):
        self.cluster.start_head(MUSTER_BIN, TOKEN)
        self.cli("queue", "create", QUEUE, "--lease-ms", "10000", "--backoff-ms", "0",
                 "--max-attempts", "10")
        for key in ("1", "2"):
            self.start_node(key)
        for tag in self.tags.values():
            wait_for("%d workers on %s" % (WORKERS, tag),
                     lambda: len(self.active_workers(tag)) == WORKERS)
        self.start_map()
        self.session = wait_for("the map's session", self.map_session)
        log("head at %s, nodes %s and %s with %d workers each, map session %s" %
            (self.net.head_url, self.tags["1"], self.tags["2"], WORKERS, self.session))

    def start_node(self, key):
        self.tags[key] = self.cluster.start_node(key, MUSTER_BIN, TOKEN, QUEUE, WORK,
                                                 RUNS=self.runs_dir, GATES=self.gates_dir)

    def agent(self, key):
        return self.cluster.procs["node" + key].pid

    def start_map(self):
        errf = open(os.path.join(self.cluster.tmp, "map.err"), "wb")
        self.map = subprocess.Popen(
            self.net.wrap("h", [MUSTER_BIN, "map", "--queue", QUEUE, "--url", self.net.head_url,
                                "--token", TOKEN]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True)
        errf.close()
        self.cluster.procs["map"] = self.map
        self.map.stdin.write("".join("%d\n" % i for i in range(INPUTS)))
        self.map.stdin.close()
        self.reader = threading.Thread(target=self.read_map, daemon=True)
        self.reader.start()

    def read_map(self):
        for line in self.map.stdout:
            with self.lock:
                self.lines.append(line.rstrip("\n"))

    # ---- what the head and the files say ----

    def active_workers(self, tag):
        workers = json.loads(self.cli("workers", "--json"))["workers"]
        return [w for w in workers if w["node"] == tag and w["state"] == "active"]

    def worker_state(self, worker_id):
        workers = json.loads(self.cli("workers", "--json", "--all"))["workers"]
        return next(w["state"] for w in workers if w["id"] == worker_id)

    def node_state(self, tag):
        nodes = json.loads(self.cli("nodes", "--json", "--all"))["nodes"]
        return next((n["state"] for n in nodes if n["name"] == tag), None)

    def map_session(self):
        sessions = json.loads(self.cli("session", "ls", "--json"))["sessions"]
        return next((s["id"] for s in sessions if s["queue"] == QUEUE), None)

    def tasks(self):
        """The queue's tasks by input."""
        out = self.cli("tasks", "ls", "--queue", QUEUE, "--json", "--limit", "0")
        tasks = (json.loads(line) for line in out.splitlines() if line.strip())
        return {int(t["payload"]): t for t in tasks}

    def results(self):
        """The session's results at the head, by index."""
        out = self.cli("session", "results", self.session, "--order", "completion")
        results = (json.loads(line) for line in out.splitlines() if line.strip())
        return {r["index"]: r for r in results}

    def printed(self):
        """The map's result lines so far, by input (a repeated input: its last line)."""
        with self.lock:
            return {int(line.split()[0]): line for line in self.lines}

    def runs(self):
        runs = []
        for name in os.listdir(self.runs_dir):
            x, node, pid = name.split(".")
            runs.append(Run(int(x), node, int(pid)))
        return runs

    def held(self):
        """The live runs of inputs whose gate is closed."""
        return sorted(r for r in self.runs() if r.input >= self.mark and machines.alive(r.pid))

    def worker_of(self, run, key):
        """The `muster worker` process of node `key` that runs `run` (an ancestor of its
        command: a guard of the worker's is between them)."""
        agent, pid = self.agent(key), run.pid
        while pid is not None and machines.parent(pid) != agent:
            pid = machines.parent(pid)
        assert pid is not None, "%s: not a command of node %s's workers" % (run, key)
        return pid

    def worker_pids(self, key):
        """The `muster worker` processes node `key`'s agent runs."""
        def is_worker(pid):
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    return f.read().split(b"\0")[1:2] == [b"worker"]
            except OSError:
                return False
        return [p for p in machines.children(self.agent(key)) if is_worker(p)]

    # ---- the gates ----

    def open_gates(self, mark):
        for x in range(self.mark, min(mark, INPUTS)):
            open(os.path.join(self.gates_dir, str(x)), "w").close()
        self.mark = max(self.mark, mark)

    def settle(self, workers):
        """Waits until every input below the mark has its result and `workers` inputs
        are held at their closed gates (one per live worker); returns those runs."""
        def settled():
            held = self.held()
            done = set(range(self.mark)) <= set(self.printed())
            return held if done and len(held) == workers else None
        try:
            held = wait_for("inputs 0-%d done and %d held" % (self.mark - 1, workers), settled)
        except AssertionError:
            missing = sorted(set(range(self.mark)) - set(self.printed()))
            log("not settled: held %s; no result yet for %s" % (self.held(), missing[:10]))
            raise
        early = sorted(x for x in self.printed() if x >= self.mark)
        assert not early, "results of inputs %s came through closed gates" % early
        log("settled at %d results: %s held" % (self.mark, [(r.input, r.node) for r in held]))
        return held

    def keep_results(self):
        """Before a kill: the session's results at the head are those below the mark, and
        every result kept at the last kill is still there, unchanged; keeps them."""
        results = self.results()
        assert sorted(results) == list(range(self.mark)), \
            "the head has results for %s, the map for 0-%d" % (sorted(results), self.mark - 1)
        changed = {i: (r, results.get(i)) for i, r in self.kept.items() if results.get(i) != r}
        assert not changed, "acknowledged results changed or lost (before, now): %s" % changed
        self.kept = results

    def lose(self, runs):
        log("lost with it: inputs %s" % [r.input for r in runs])
        self.lost += runs

    def wait_requeued(self, runs):
        """Waits until each of the lost `runs`'s input is queued again, or runs again."""
        def requeued():
            tasks, live = self.tasks(), self.runs()
            return all(tasks[r.input]["state"] == "queued" or any(
                n.input == r.input and n not in self.lost and machines.alive(n.pid)
                for n in live) for r in runs)
        wait_for("inputs %s queued again" % [r.input for r in runs], requeued)

    def restart_head(self):
        log("kill -9 of the head (pid %d), then a new one on its data" %
            self.cluster.procs["head"].pid)
        self.cluster.kill("head")
        self.cluster.start_head(MUSTER_BIN, TOKEN)
        after = self.results()
        assert after == self.kept, "the restarted head's results differ: %s" % sorted(
            i for i in set(after) | set(self.kept) if after.get(i) != self.kept.get(i))

    # ---- the end ----

    def finish(self):
        """Opens every gate, lets the map end, and checks its results and the runs."""
        self.open_gates(INPUTS)
        rc = self.map.wait(timeout=60)
        self.reader.join(timeout=10)
        self.map.stdout.close()
        by_node = machines.check_map_results(rc, self.lines, self.cluster.tmp, INPUTS,
                                             ordered=False)
        log("results by node: %s" % {k: len(v) for k, v in by_node.items()})
        self.check_runs()
        q = json.loads(self.cli("queue", "show", QUEUE))
        left = {k: q["counts"].get(k, 0) for k in ("queued", "leased", "dead")}
        assert not any(left.values()), "the queue still holds %s: %s" % (left, q)

    def check_runs(self):
        """Each input ran once more than it was lost; its result is its surviving run's."""
        runs, printed = self.runs(), self.printed()
        missing = [r for r in self.lost if r not in runs]
        assert not missing, "lost runs without their run file: %s" % missing
        problems = []
        for x in range(INPUTS):
            mine = [r for r in runs if r.input == x]
            left = [r for r in mine if r not in self.lost]
            if len(left) != 1:
                problems.append("input %d ran %d times, %d of them lost to a kill: %s" %
                                (x, len(mine), len(mine) - len(left), mine))
                continue
            answer = printed[x].split()
            if answer[2:] != [left[0].node, str(left[0].pid)]:
                problems.append("input %d: result %r, but its run that was not lost is %s" %
                                (x, printed[x], left[0]))
        assert not problems, "\n".join(problems[:10])
        twice = collections.Counter(r.input for r in runs) - collections.Counter(range(INPUTS))
        log("every input ran once, and once more per kill that ended it: %s" % dict(twice))


def crash_line(text, pid):
    """The worker id in the agent's line on the crash of worker process `pid`, or None."""
    m = re.search(r"\(pid %d, worker id (\d+)\) crashed: killed by signal 9" % pid, text)
    return int(m.group(1)) if m else None


class GatedChaosTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        why = machines.netns_unavailable("cg%05d" % (os.getpid() % 100000))
        if why:
            raise unittest.SkipTest("needs network namespaces: " + why)
        if not os.path.exists(MUSTER_BIN):
            raise RuntimeError("no muster binary at " + MUSTER_BIN)
        log("seed %d (MUSTER_CHAOS_SEED=%d repeats this run)" % (SEED, SEED))

    def cluster(self, n):
        """The test's cluster (a context): namespaces cgN<pid>, subnet 10.215.N."""
        self.rng = random.Random("%s %d" % (self._testMethodName, SEED))
        net = machines.Machines("cg%d%05d" % (n, os.getpid() % 100000), "10.215.%d" % n)
        return machines.cluster_on(net, "muster-chaos-gates-")

    def next_mark(self, g, low=10, high=25):
        return g.mark + self.rng.randint(low, high)

    def test_worker_process_killed(self):
        with self.cluster(1) as cluster, GatedMap(cluster) as g:
            g.start()
            for _ in range(2):
                g.open_gates(self.next_mark(g))
                held = g.settle(2 * WORKERS)
                g.keep_results()
                self.kill_worker(g, self.rng.choice(held))
            g.finish()

    def kill_worker(self, g, victim):
        """kill -9 of the `muster worker` running `victim` (a held run): its agent
        reports the crash (the lease lapses at once: "worker crashed", where a lost
        report would leave it to expire) and starts a new worker, which takes work."""
        key = "1" if victim.node == g.tags["1"] else "2"
        worker, before = g.worker_of(victim, key), g.worker_pids(key)
        log("kill -9 of node %s's worker pid %d, which holds input %d" %
            (key, worker, victim.input))
        os.kill(worker, signal.SIGKILL)
        g.lose([victim])
        worker_id = wait_for("node %s's agent saying worker %d crashed" % (key, worker),
                             lambda: crash_line(g.cluster.log("node" + key, None), worker))
        wait_for("no process of the killed worker's session left",
                 lambda: not machines.session_pids(worker))
        task = wait_for("input %d's lease taken from worker %d" % (victim.input, worker_id),
                        lambda: self.lease_ended(g, victim.input, worker_id))
        self.assertEqual(task["error"], "worker crashed", task)
        self.assertEqual(g.worker_state(worker_id), "gone")
        new = wait_for("a new worker on node %s" % key,
                       lambda: set(g.worker_pids(key)) - set(before)).pop()
        wait_for("%d workers active on node %s" % (WORKERS, key),
                 lambda: len(g.active_workers(victim.node)) == WORKERS)
        held = g.settle(2 * WORKERS)
        self.assertEqual(len(g.worker_pids(key)), WORKERS)
        took = [r.input for r in held if r.node == victim.node and g.worker_of(r, key) == new]
        self.assertEqual(len(took), 1, "the new worker of node %s holds none of %s" % (key, held))
        log("worker id %d gone; the new worker (pid %d) holds input %d" %
            (worker_id, new, took[0]))

    @staticmethod
    def lease_ended(g, x, worker_id):
        """Input `x`'s task once no longer leased by worker `worker_id`, else None."""
        task = g.tasks()[x]
        lease = task["lease"]
        return task if lease is None or lease["worker"] != worker_id else None

    def test_command_agent_head_killed(self):
        with self.cluster(2) as cluster, GatedMap(cluster) as g:
            g.start()
            tag1 = g.tags["1"]
            g.open_gates(self.next_mark(g))
            victim = self.rng.choice(g.settle(2 * WORKERS))
            g.keep_results()
            log("kill -9 of input %d's command (pid %d on %s)" %
                (victim.input, victim.pid, victim.node))
            os.kill(victim.pid, signal.SIGKILL)
            g.lose([victim])
            wait_for("input %d held again" % victim.input, lambda: [
                r for r in g.held() if r.input == victim.input and r != victim])

            g.open_gates(self.next_mark(g))
            held = g.settle(2 * WORKERS)
            g.keep_results()
            log("kill -9 of node 1's agent (pid %d)" % g.agent("1"))
            cluster.kill("node1")
            g.lose([r for r in held if r.node == tag1])
            try:
                wait_for("no process of node 1 left", lambda: not tagged_pids(tag1))
            except AssertionError:
                log("still alive:\n" + describe_pids(tagged_pids(tag1)))
                raise
            back_at_once = self.rng.random() < 0.5
            if back_at_once:
                log("node 1's agent started again at once (same lock file)")
                g.start_node("1")
            g.wait_requeued([r for r in held if r.node == tag1])

            g.open_gates(self.next_mark(g))
            g.settle(2 * WORKERS if back_at_once else WORKERS)
            g.keep_results()
            g.restart_head()
            if not back_at_once:
                log("node 1's agent started again")
                g.start_node("1")
            g.open_gates(self.next_mark(g))
            g.settle(2 * WORKERS)
            g.keep_results()
            g.finish()
            for tag in g.tags.values():
                wait_for(tag + " active", lambda: g.node_state(tag) == "active", timeout=20)

    def test_power_cut_then_head(self):
        with self.cluster(3) as cluster, GatedMap(cluster) as g:
            g.start()
            tag1, tag2 = g.tags["1"], g.tags["2"]
            g.open_gates(self.next_mark(g))
            held = g.settle(2 * WORKERS)
            g.keep_results()
            lost = [r for r in held if r.node == tag1]
            self.power_cut(g, "1")
            g.lose(lost)
            wait_for("node 1 gone at the head", lambda: g.node_state(tag1) == "gone", timeout=20)
            g.wait_requeued(lost)
            tasks = g.tasks()
            self.assertEqual({tasks[r.input]["error"] for r in lost}, {"node timed out"})

            g.open_gates(self.next_mark(g, 15, 25))  # node 1's held inputs among them
            g.settle(WORKERS)
            g.keep_results()
            g.restart_head()
            g.finish()
            reran = {r.input: r.node for r in g.runs() if r.input in {x.input for x in lost}
                     and r not in g.lost}
            self.assertEqual(reran, {r.input: tag2 for r in lost},
                             "node 1's held inputs were not run again by node 2")
            self.assertEqual(g.node_state(tag1), "gone")
            self.assertEqual(g.node_state(tag2), "active")

    def power_cut(self, g, key):
        """Every process of node `key` stopped, so that none can tell the head or clean
        up, then killed with SIGKILL."""
        pids = self.freeze(g, key)
        log("power cut of node %s: %d processes stopped, now killed:\n%s" %
            (key, len(pids), describe_pids(pids)))
        machines.kill_all(pids)
        g.cluster.procs["node" + key].wait()
        wait_for("no process of node %s left" % key, lambda: not tagged_pids(g.tags[key]))

    @staticmethod
    def freeze(g, key):
        """SIGSTOP of every process of node `key` (agent, workers, their guards and
        commands), again until all are stopped (a process may fork meanwhile); their
        pids."""
        def frozen():
            pids = tagged_pids(g.tags[key])
            running = [p for p in pids if not machines.stopped(p)]
            for pid in running:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
            return pids if not running else None
        try:
            return wait_for("every process of node %s stopped" % key, frozen, timeout=10)
        except AssertionError:
            pids = tagged_pids(g.tags[key])
            log("not stopped:\n" + describe_pids([p for p in pids if not machines.stopped(p)]))
            raise

    @staticmethod
    def thaw(pids):
        """SIGCONT of `pids`, again until none is stopped (a vfork parent, continued
        before its child, stops on the SIGSTOP it got while it waited)."""
        def thawed():
            halted = [p for p in pids if machines.alive(p) and machines.stopped(p)]
            for pid in halted:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            return not halted
        wait_for("every stopped process continued", thawed, timeout=10)

    def test_frozen_node_thaws(self):
        with self.cluster(4) as cluster, GatedMap(cluster) as g:
            g.start()
            tag1 = g.tags["1"]
            g.open_gates(self.next_mark(g))
            held = g.settle(2 * WORKERS)
            g.keep_results()
            stale = [r for r in held if r.node == tag1]
            pids = self.freeze(g, "1")
            log("node 1 frozen (%d processes stopped) holding inputs %s" %
                (len(pids), [r.input for r in stale]))
            g.lose(stale)  # their leases go: their results must not count
            wait_for("node 1 gone at the head", lambda: g.node_state(tag1) == "gone", timeout=20)
            g.wait_requeued(stale)
            g.open_gates(self.next_mark(g))  # node 2 runs node 1's held inputs
            g.settle(WORKERS)
            g.keep_results()

            log("node 1 thaws: its runs of inputs %s pass their open gates" %
                [r.input for r in stale])
            self.thaw(pids)
            wait_for("node 1's stale runs ended",
                     lambda: not any(machines.alive(r.pid) for r in stale))
            wait_for("node 1 active again", lambda: g.node_state(tag1) == "active", timeout=20)
            wait_for("%d workers active on node 1" % WORKERS,
                     lambda: len(g.active_workers(tag1)) == WORKERS)
            g.open_gates(self.next_mark(g))
            held = g.settle(2 * WORKERS)
            self.assertTrue(any(r.node == tag1 for r in held), "node 1 took no work: %s" % held)
            g.keep_results()  # the stale runs' answers changed no acknowledged result
            g.finish()


if __name__ == "__main__":
    unittest.main()
