"""Several "machines" on one host for multi-node tests: a head and two node agents.

Machines keys them "h" (the head), "1" and "2" (nodes).  With network namespaces (root
and iproute2), each is a namespace: NS-h holds a bridge at SUBNET.1/24, NS-1 and NS-2
are SUBNET.2 and .3, joined to it by veth pairs; every address lives inside those
namespaces, none in the caller's, so tests running side by side cannot collide.  A test
that can do without them passes netns=False: every machine is then this host's loopback
(the head on a free port), told apart by node names and lock files only.

Cluster starts the processes of a test on those machines (each in a session of its own,
logging to TMP/NAME.log) so that the test's finally can end exactly those.  The /proc
helpers find what a killed process left behind: processes by an environment tag, a
process's children, a session's members.
"""
import contextlib
import os
import signal
import shutil
import subprocess
import tempfile

import harness
import node_harness  # no_gpu_env: CPU workers on a GPU machine too

HEAD_PORT = 7370  # the head's port inside its namespace (nothing else listens there)


def log(*args):
    print(*args, flush=True)


def run(*cmd, check=True):
    """Runs a command to completion; returns its stdout (text)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), proc.returncode, proc.stderr))
    return proc.stdout


def wait_for(what, predicate, timeout=30.0):
    """harness.wait_until with the description first: returns `predicate`'s first true
    value, or raises AssertionError naming `what` after `timeout` s."""
    return harness.wait_until(predicate, timeout=timeout, interval=0.05, what=what)


def skip_unless_netns(test, tag):
    """Exits 0 with a clear message when network namespaces cannot be made here."""
    why = netns_unavailable(tag)
    if why:
        log("SKIP: %s needs network namespaces: %s" % (test, why))
        raise SystemExit(0)


def netns_unavailable(tag):
    """None when network namespaces can be made here, else why not (a sentence)."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if os.geteuid() != 0:
        return "it needs root (CAP_NET_ADMIN)"
    probe = tag + "-probe"
    proc = subprocess.run(["ip", "netns", "add", probe], stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        return "ip netns add failed (no CAP_NET_ADMIN?): " + proc.stderr.strip()
    run("ip", "netns", "del", probe)
    return None


class Machines:
    """The head's machine and two nodes' (see the module's comment).  `tag` makes the
    namespace and interface names unique (at most 8 characters: interface names are
    short); `subnet` is the first three octets."""

    def __init__(self, tag, subnet="10.213.0", netns=True):
        self.tag, self.subnet, self.netns = tag, subnet, netns
        self.ns = {"h": tag + "-h", "1": tag + "-1", "2": tag + "-2"}
        if netns:
            self.head_addr = "%s.1:%d" % (subnet, HEAD_PORT)
        else:
            self.head_addr = "127.0.0.1:%d" % harness.free_port()
        self.head_url = "http://" + self.head_addr

    def wrap(self, key, cmd):
        """`cmd` (a list) as run on machine `key`."""
        if not self.netns:
            return list(cmd)
        return ["ip", "netns", "exec", self.ns[key]] + list(cmd)

    def make(self):
        """Builds the namespaces and their network (nothing on loopback)."""
        if not self.netns:
            return
        for ns in self.ns.values():
            run("ip", "netns", "add", ns)
        run(*self.wrap("h", ["ip", "link", "add", "br0", "type", "bridge"]))
        run(*self.wrap("h", ["ip", "addr", "add", self.subnet + ".1/24", "dev", "br0"]))
        run(*self.wrap("h", ["ip", "link", "set", "br0", "up"]))
        for key, host in (("1", 2), ("2", 3)):
            outer, inner = self.tag + "h" + key, self.tag + "n" + key
            run("ip", "link", "add", outer, "netns", self.ns["h"], "type", "veth", "peer", "name",
                inner, "netns", self.ns[key])
            run(*self.wrap("h", ["ip", "link", "set", outer, "master", "br0", "up"]))
            run(*self.wrap(key, ["ip", "addr", "add", "%s.%d/24" % (self.subnet, host), "dev",
                                 inner]))
            run(*self.wrap(key, ["ip", "link", "set", inner, "up"]))
            run(*self.wrap(key, ["ip", "link", "set", "lo", "up"]))
        run(*self.wrap("h", ["ip", "link", "set", "lo", "up"]))

    def remove(self):
        if not self.netns:
            return
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)


class Cluster:
    """The processes a test starts on `machines`, by name, so that finally can end
    exactly those.  Each logs to TMP/NAME.log (appended to, so a restart under the same
    name keeps the first life's lines)."""

    def __init__(self, tmp, machines):
        self.tmp = tmp
        self.machines = machines
        self.procs = {}

    def start(self, name, key, cmd, env=None):
        with open(os.path.join(self.tmp, name + ".log"), "ab") as logf:
            self.procs[name] = subprocess.Popen(
                self.machines.wrap(key, cmd), stdout=logf, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        return self.procs[name]

    def start_head(self, muster_bin, token):
        """`muster head` on the head's machine, data in TMP/head-data (kept across
        restarts: a second call starts a new head on the first one's data)."""
        data = os.path.join(self.tmp, "head-data")
        os.makedirs(data, exist_ok=True)
        url_file = os.path.join(data, "url")
        if os.path.exists(url_file):
            os.unlink(url_file)  # a killed head leaves its own: wait for the new one's
        self.start("head", "h", [muster_bin, "head", "--server-only", "--listen",
                                 self.machines.head_addr, "--data-dir", data, "--token", token,
                                 "--node-timeout-ms", "3000"])
        wait_for("the head's url file", lambda: os.path.exists(url_file))

    def start_node(self, key, muster_bin, token, queue, work, **env):
        """The agent of node `key` ("1", "2"), named TAG-nKEY, with 2 CPU workers
        running `sh -c WORK` on `queue`; its lock file in TMP/nodeKEY (kept across
        restarts).  NODE_TAG and `env` go into its environment.  Returns its name."""
        tag = "%s-n%s" % (self.machines.tag, key)
        node_dir = os.path.join(self.tmp, "node" + key)
        os.makedirs(node_dir, exist_ok=True)
        env = node_harness.no_gpu_env(dict(os.environ, NODE_TAG=tag, **env))
        self.start("node" + key, key, [
            muster_bin, "node", "--join", self.machines.head_url, "--token", token, "--name",
            tag, "--listen", "none", "--lock-file", os.path.join(node_dir, "lock"),
            "--workers", "2", "--queue", queue, "--", "sh", "-c", work], env=env)
        return tag

    def kill(self, name):
        """kill -9 of process `name` (on a namespace, `ip netns exec` has exec'd it: the
        pid is the program's), and waits for it."""
        proc = self.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def log(self, name, tail=3000):
        """The last `tail` characters of process `name`'s log (None: all of it)."""
        try:
            with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
                return f.read()[-tail:] if tail else f.read()
        except OSError:
            return ""

    def stop_all(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def check_map_results(rc, lines, tmp, inputs, ordered=True):
    """Checks the output of a `muster map` of the inputs 0 .. `inputs`-1 whose command
    answers "INPUT SQUARE NODE ..." (the map's stderr in TMP/map.err): exit status 0, one
    line per input, each input once (and in input order when `ordered`), each square
    right.  Returns {node: set of its inputs}."""
    with open(os.path.join(tmp, "map.err"), errors="replace") as f:
        err = f.read()
    assert rc == 0, "map exited %d: %s" % (rc, err[-2000:])
    assert len(lines) == inputs, "%d result lines for %d inputs" % (len(lines), inputs)
    by_node, seen = {}, set()
    for i, line in enumerate(lines):
        parts = line.split()
        assert len(parts) >= 3, "line %d: %r" % (i, line)
        x = int(parts[0])
        assert not ordered or x == i, "line %d holds input %d: out of order" % (i, x)
        assert x not in seen and 0 <= x < inputs, "line %d: input %d again or unknown" % (i, x)
        assert int(parts[1]) == x * x, "line %d: wrong result %r" % (i, line)
        seen.add(x)
        by_node.setdefault(parts[2], set()).add(x)
    return by_node


def _stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _live_pids(keep):
    """Pids of live (not zombie) processes whose stat fields `keep` accepts."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(name)
            if fields and fields[0] != "Z" and keep(int(name), fields):
                pids.append(int(name))
    return pids


def alive(pid):
    """Whether process `pid` lives (a zombie does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def stopped(pid):
    """Whether process `pid` is stopped (SIGSTOP); one that is gone counts as stopped.
    So does one blocked in vfork for a child that is stopped: it cannot run before the
    child execs (dash starts commands with vfork, and a SIGSTOP sent to the parent in
    that wait takes effect only after it)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("T", "t", "Z"):
        return True
    return fields[0] == "D" and any(_stat(c) and _stat(c)[0] in ("T", "t")
                                    for c in children(pid))


def parent(pid):
    """The parent of process `pid`, or None when it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def children(pid):
    """Live child processes of `pid`."""
    return _live_pids(lambda _, fields: int(fields[1]) == pid)


def session_pids(sid):
    """Live processes of session `sid` (a worker started with setsid: its pid)."""
    return _live_pids(lambda _, fields: int(fields[3]) == sid)


def tagged_pids(tag):
    """Pids of live processes whose environment carries NODE_TAG=`tag`."""
    needle = ("NODE_TAG=" + tag).encode() + b"\0"

    def tagged(pid, _):
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                return needle in f.read() + b"\0"
        except OSError:
            return False
    return _live_pids(tagged)


def describe_pids(pids):
    """One line per process: pid, state, where it waits and its command line."""
    lines = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            with open("/proc/%d/wchan" % pid) as f:
                wchan = f.read().strip()
        except OSError as e:
            lines.append("%d: gone (%s)" % (pid, e))
            continue
        state = (_stat(pid) or ["?"])[0]
        lines.append("%d %s %s: %s" % (pid, state, wchan or "-", cmd[:200]))
    return "\n".join(lines)


def kill_all(pids):
    """kill -9 of each of `pids`; one that ended since it was listed is no error (the
    failure a test is reporting stays the one it reports)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextlib.contextmanager
def cluster_on(net, prefix):
    """A Cluster on `net`'s machines, made for the with-block and taken down after it:
    on a failure the head's and nodes' log tails are printed first; then every process
    is stopped, anything of the nodes still alive killed, the namespaces and the
    temporary directory removed; a clean block that left node processes behind, or a
    sanitizer report in a log (an ASan build's), fails."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tmp, 0o755)
    cluster = Cluster(tmp, net)
    try:
        net.make()
        yield cluster
    except Exception:
        for name in ("head", "node1", "node2"):
            log("---- %s log (tail) ----\n%s" % (name, cluster.log(name)))
        raise
    finally:
        cluster.stop_all()
        leftover = tagged_pids(net.tag + "-n1") + tagged_pids(net.tag + "-n2")
        kill_all(leftover)
        reports = sanitizer_reports(tmp)
        net.remove()
        shutil.rmtree(tmp, ignore_errors=True)
    assert not leftover, "processes left after the agents stopped: %s" % leftover
    assert not reports, "sanitizer reports (an ASan build's) in %s" % reports


def sanitizer_reports(tmp):
    """The logs in `tmp` (the processes' and the map's stderr) that hold a sanitizer's
    report, each printed."""
    found = []
    for name in sorted(os.listdir(tmp)):
        if name.endswith((".log", ".err")):
            with open(os.path.join(tmp, name), errors="replace") as f:
                text = f.read()
            at = text.find("Sanitizer")
            if at >= 0:
                log("---- %s: sanitizer report ----\n%s" % (name, text[max(0, at - 200):][:6000]))
                found.append(name)
    return found
