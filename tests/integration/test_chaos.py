"""A user's bad day in one run: a worker, a node agent and the head all die mid-map.

A head and two node agents in three network namespaces (machines.py), each agent with
2 CPU workers whose command burns a little CPU per input and tags its result with its
node.  `muster map --ordered` of INPUTS inputs runs in the head's namespace, and as its
results come (never on a timer):

1. after 1/5 of them, one of node 2's commands is killed with `kill -9` mid-task (its
   worker fails the task, which is leased again);
2. after 2/5, node 1's agent is killed with `kill -9` (its workers and commands go with
   it; its leased tasks go back when the head learns the node is gone);
3. after 3/5, the head is killed with `kill -9` and started again on the same data dir
   and address (the map, node 2 and their leases carry on against the new process);
4. after 4/5, node 1's agent is started again on the same lock file (it takes its node
   back at once).

Checks: `muster map` exits 0 with every input's result exactly once, correct and in
input order; no process of node 1's first life is left after its kill; at the end the
queue has nothing queued or leased and nothing dead, and both nodes are active.

Needs root (CAP_NET_ADMIN) for `ip netns`; without it the test says so and skips.
MUSTER_BIN names the binary (ctest sets it).  MUSTER_CHAOS_SEED picks which of node 2's
commands dies (printed).
"""
import json
import os
import random
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machines  # noqa: E402
from machines import describe_pids, log, run, tagged_pids, wait_for  # noqa: E402

MUSTER_BIN = os.path.abspath(os.environ.get("MUSTER_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "muster"))
TOKEN = "chaos-token-0123456789"
QUEUE = "chaos-map"
INPUTS = 1500
TAG = "mch%d" % (os.getpid() % 100000)  # unique per run: names, node tags
NET = machines.Machines(TAG, "10.214.0")  # the head at 10.214.0.1:7370, nodes at .2 and .3
HEAD_URL = NET.head_url
# The worker command: a little CPU, then "INPUT SQUARE NODE" (NODE_TAG from the agent's
# environment).
WORK = ('read x; i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; '
        'echo "$x $((x*x)) $NODE_TAG"')


def cli(*args):
    """Runs a muster CLI command in the head's namespace against the head."""
    return run(*NET.wrap("h", [MUSTER_BIN] + list(args) + ["--url", HEAD_URL, "--token", TOKEN]))


def start_head(cluster):
    cluster.start_head(MUSTER_BIN, TOKEN)


def start_node(cluster, key):
    return cluster.start_node(key, MUSTER_BIN, TOKEN, QUEUE, WORK)


def workers_of(node, state="active"):
    workers = json.loads(cli("workers", "--json"))["workers"]
    return [w for w in workers if w["node"] == node and w["state"] == state]


def node_state(node):
    for n in json.loads(cli("nodes", "--json", "--all"))["nodes"]:
        if n["name"] == node:
            return n["state"]
    return None


def commands_of(tag):
    """Pids of the running worker commands (`sh -c WORK`) of node `tag`."""
    def is_command(pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                return f.read().split(b"\0")[:2] == [b"sh", b"-c"]
        except OSError:
            return False
    return [pid for pid in tagged_pids(tag) if is_command(pid)]


class Chaos:
    """The kills, each when the map's results reach its mark."""

    def __init__(self, cluster, tag1, tag2, rng):
        self.cluster, self.tag1, self.tag2, self.rng = cluster, tag1, tag2, rng
        step = INPUTS // 5
        self.plan = [(step, self.kill_command), (2 * step, self.kill_node1),
                     (3 * step, self.restart_head), (4 * step, self.restart_node1)]

    def on_result(self, count):
        while self.plan and self.plan[0][0] == count:
            self.plan.pop(0)[1](count)

    def kill_command(self, count):
        pids = wait_for("a running command on node 2", lambda: commands_of(self.tag2))
        victim = self.rng.choice(sorted(pids))
        log("%d results in: kill -9 of node 2's command pid %d" % (count, victim))
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:  # it finished meanwhile: take another
            victim = wait_for("a running command on node 2", lambda: commands_of(self.tag2))[0]
            os.kill(victim, signal.SIGKILL)

    def kill_node1(self, count):
        log("%d results in: kill -9 of node 1's agent (pid %d)" %
            (count, self.cluster.procs["node1"].pid))
        self.cluster.kill("node1")
        try:
            wait_for("no process of node 1 left", lambda: not tagged_pids(self.tag1), timeout=15)
        except AssertionError:
            log("still alive:\n" + describe_pids(tagged_pids(self.tag1)))
            raise

    def restart_head(self, count):
        log("%d results in: kill -9 of the head (pid %d), then a new one on its data" %
            (count, self.cluster.procs["head"].pid))
        self.cluster.kill("head")
        start_head(self.cluster)

    def restart_node1(self, count):
        log("%d results in: node 1's agent started again" % count)
        start_node(self.cluster, "1")


def run_map(cluster, chaos):
    """Runs the map, calling chaos.on_result after each result; (exit status, lines)."""
    inputs = "".join("%d\n" % i for i in range(INPUTS))
    errf = open(os.path.join(cluster.tmp, "map.err"), "wb")
    proc = subprocess.Popen(
        NET.wrap("h", [MUSTER_BIN, "map", "--queue", QUEUE, "--ordered", "--url", HEAD_URL,
                       "--token", TOKEN]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True)
    errf.close()
    cluster.procs["map"] = proc
    proc.stdin.write(inputs)
    proc.stdin.close()
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        chaos.on_result(len(lines))
    return proc.wait(timeout=120), lines


def check_queue():
    """Nothing of the map left queued, leased or dead in its queue."""
    q = json.loads(cli("queue", "show", QUEUE))
    counts = q.get("counts", q)
    left = {k: counts.get(k, 0) for k in ("queued", "leased", "dead")}
    assert not any(left.values()), "the queue still holds %s: %s" % (left, q)


def main():
    machines.skip_unless_netns("test_chaos", TAG)
    if not os.path.exists(MUSTER_BIN):
        raise SystemExit("no muster binary at " + MUSTER_BIN)
    seed = int(os.environ.get("MUSTER_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    log("MUSTER_CHAOS_SEED=%d" % seed)
    with machines.cluster_on(NET, "muster-chaos-") as cluster:
        tmp = cluster.tmp
        start_head(cluster)
        cli("queue", "create", QUEUE, "--lease-ms", "10000", "--backoff-ms", "0")
        tag1, tag2 = start_node(cluster, "1"), start_node(cluster, "2")
        for tag in (tag1, tag2):
            wait_for("2 workers on " + tag, lambda: len(workers_of(tag)) == 2)
        log("head at %s, nodes %s and %s with 2 workers each" % (HEAD_URL, tag1, tag2))

        chaos = Chaos(cluster, tag1, tag2, random.Random(seed))
        rc, lines = run_map(cluster, chaos)
        by_node = machines.check_map_results(rc, lines, tmp, INPUTS)
        log("results by node: %s" % {k: len(v) for k, v in by_node.items()})
        assert not chaos.plan, "the map ended before every kill: %s" % chaos.plan
        check_queue()
        for tag in (tag1, tag2):
            wait_for(tag + " active", lambda: node_state(tag) == "active", timeout=20)
        log("every result once and in order; the queue is empty; both nodes active")
    log("ok")


if __name__ == "__main__":
    main()
