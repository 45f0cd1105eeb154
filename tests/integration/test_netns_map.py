"""A multi-machine map: a head and two node agents in three network namespaces.

The test builds its own little network: namespaces NS-h (the head, on a bridge at
10.213.0.1/24), NS-1 and NS-2 (the nodes, 10.213.0.2 and .3), joined by veth pairs.
Every address lives inside those namespaces, none in the caller's.  Each node agent
runs 2 CPU workers whose command burns a little CPU per input and tags its result
with its node.  `muster map --ordered` of 2,000 inputs runs in the head's namespace;
halfway through, node 1's agent is killed with `kill -9`.  Checks: every result
arrives exactly once and in input order; the inputs node 1 had started but not
finished were run by node 2; no process of node 1 (agent, worker or command) is left;
node 1 goes `gone` at the head.  The namespaces are removed whatever happens.

Needs root (CAP_NET_ADMIN) for `ip netns`; without it the test says so and skips.
MUSTER_BIN names the binary (ctest sets it).
"""
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machines  # noqa: E402
from machines import describe_pids, log, run, tagged_pids, wait_for  # noqa: E402

MUSTER_BIN = os.path.abspath(os.environ.get("MUSTER_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "muster"))
TOKEN = "netns-token-0123456789"
QUEUE = "netns-map"
INPUTS = 2000
TAG = "mst%d" % (os.getpid() % 100000)  # unique per run: names, node tags
NET = machines.Machines(TAG, "10.213.0")  # the head at 10.213.0.1:7370, nodes at .2 and .3
HEAD_URL = NET.head_url
# The worker command: mark the input as started on this node, hold while the node's
# gate file exists (marking the input "held": a held input cannot finish while the gate
# stands, so the test can catch every worker of node 1 mid-task), burn a little CPU
# and answer "INPUT SQUARE NODE".  NODE_DIR and NODE_TAG come from the
# agent's environment.
WORK = ('read x; touch "$NODE_DIR/started-$x"; '
        'while [ -e "$NODE_DIR/gate" ]; do touch "$NODE_DIR/held-$x"; sleep 0.05; done; i=0; '
        'while [ $i -lt 3000 ]; do i=$((i+1)); done; '
        'echo "$x $((x*x)) $NODE_TAG"')


def cli(*args):
    """Runs a muster CLI command in the head's namespace against the head."""
    return run(*NET.wrap("h", [MUSTER_BIN] + list(args) + ["--url", HEAD_URL, "--token", TOKEN]))


def active_workers(node):
    workers = json.loads(cli("workers", "--json"))["workers"]
    return [w for w in workers if w["node"] == node and w["state"] == "active"]


def node_state(node):
    for n in json.loads(cli("nodes", "--json", "--all"))["nodes"]:
        if n["name"] == node:
            return n["state"]
    return None


def markers(node_dir, kind):
    """Inputs with a `kind` ("started", "held") marker in `node_dir`."""
    return {int(n.split("-", 1)[1]) for n in os.listdir(node_dir) if n.startswith(kind + "-")}


def run_map(cluster, dir1, kill_at):
    """Runs the map, kills node 1's agent with kill -9 after `kill_at` results,
    and returns the output lines."""
    inputs = "".join("%d\n" % i for i in range(INPUTS))
    errf = open(os.path.join(cluster.tmp, "map.err"), "wb")
    proc = subprocess.Popen(
        NET.wrap("h", [MUSTER_BIN, "map", "--queue", QUEUE, "--ordered", "--url", HEAD_URL,
                   "--token", TOKEN]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errf, text=True)
    errf.close()
    cluster.procs["map"] = proc
    proc.stdin.write(inputs)
    proc.stdin.close()
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if len(lines) == kill_at:
            # Close node 1's gate and wait until both its workers are held at it. A
            # task past the gate when it closed still finishes; a held one cannot, so
            # the kill always catches exactly the held tasks in flight.
            open(os.path.join(dir1, "gate"), "w").close()
            wait_for("both workers of node 1 held at the gate",
                     lambda: len(markers(dir1, "held")) == 2)
            log("%d results in; kill -9 of node 1's agent (pid %d) with inputs %s held" %
                (kill_at, cluster.procs["node1"].pid, sorted(markers(dir1, "held"))))
            os.kill(cluster.procs["node1"].pid, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    return rc, lines


def main():
    machines.skip_unless_netns("test_netns_map", TAG)
    if not os.path.exists(MUSTER_BIN):
        raise SystemExit("no muster binary at " + MUSTER_BIN)
    with machines.cluster_on(NET, "muster-netns-") as cluster:
        tmp = cluster.tmp
        cluster.start_head(MUSTER_BIN, TOKEN)
        cli("queue", "create", QUEUE, "--lease-ms", "10000", "--backoff-ms", "0")
        dir1, dir2 = (os.path.join(tmp, "node" + key) for key in ("1", "2"))
        tag1 = cluster.start_node("1", MUSTER_BIN, TOKEN, QUEUE, WORK, NODE_DIR=dir1)
        tag2 = cluster.start_node("2", MUSTER_BIN, TOKEN, QUEUE, WORK, NODE_DIR=dir2)
        for tag in (tag1, tag2):
            wait_for("2 workers on " + tag, lambda: len(active_workers(tag)) == 2)
        log("head at %s, nodes %s and %s with 2 workers each" % (HEAD_URL, tag1, tag2))

        rc, lines = run_map(cluster, dir1, INPUTS // 2)
        by_node = machines.check_map_results(rc, lines, tmp, INPUTS)
        log("results: %s" % {k: len(v) for k, v in by_node.items()})
        assert by_node.get(tag1) and by_node.get(tag2), "both nodes should have run inputs"

        started1 = markers(dir1, "started")
        lost = started1 - by_node[tag1]
        log("node 1 started %d inputs and finished %d; %d were lost with it: %s" %
            (len(started1), len(by_node[tag1]), len(lost), sorted(lost)[:10]))
        held = markers(dir1, "held")
        assert lost == held, "node 1 had inputs %s held when killed; lost %s" % (
            sorted(held), sorted(lost))
        assert lost <= by_node[tag2], "lost inputs not run by node 2: %s" % (lost - by_node[tag2])

        try:
            wait_for("no process of node 1 left", lambda: not tagged_pids(tag1), timeout=15)
        except AssertionError:
            log("still alive:\n" + describe_pids(tagged_pids(tag1)))
            raise
        wait_for("node 1 gone at the head", lambda: node_state(tag1) == "gone", timeout=20)
        assert node_state(tag2) == "active"
        log("node 1: no orphan processes, gone at the head; node 2 active")
    log("ok")


if __name__ == "__main__":
    main()
