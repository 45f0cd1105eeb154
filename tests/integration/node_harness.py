"""Node-agent helpers for test_node*.py: start `muster node` next to a harness head.

Each agent gets its own lock file, cache dir and state dir (so tests never collide
with a real agent on this machine, nor with each other, nor with another run of
themselves), --listen 127.0.0.1:0 and a log file.  The
agent writes its pid, name and API address into its lock file once it runs.
"""
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.parse

import harness

_NO_GPU_BIN = None


def no_gpu_env(env):
    """`env` (a dict, changed and returned) made blind to this machine's GPUs, so that a
    test's `--workers N` means N CPU workers on a GPU machine too: NVML pointed at
    nothing, CUDA_VISIBLE_DEVICES removed, and first on PATH an `nvidia-smi` that fails
    (as on a machine without the driver).  A test that wants GPUs puts its own fake
    `nvidia-smi` before it."""
    global _NO_GPU_BIN
    if _NO_GPU_BIN is None:
        _NO_GPU_BIN = tempfile.mkdtemp(prefix="muster-test-no-gpu-")
        atexit.register(shutil.rmtree, _NO_GPU_BIN, True)
        path = os.path.join(_NO_GPU_BIN, "nvidia-smi")
        with open(path, "w") as f:
            f.write("#!/bin/sh\necho 'NVIDIA-SMI has failed: no GPU (muster tests)' >&2\nexit 9\n")
        os.chmod(path, 0o755)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["MUSTER_NVML_LIBRARY"] = "/nonexistent/libnvidia-ml.so.1"
    env["PATH"] = _NO_GPU_BIN + ":" + env.get("PATH", "/usr/bin:/bin")
    return env


class AgentsCase(unittest.TestCase):
    """A head (started with `head_args`), a temporary dir (named from `dir_prefix`) and
    the agents a test starts (append them to self.agents), all stopped and removed
    after each test."""
    head_args = []
    dir_prefix = "muster-node-test-"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.dir_prefix)
        self.head = harness.Head(self.head_args).start()
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


class SharedAgentCase(unittest.TestCase):
    """One head (started with `head_args`) and one agent (`agent_name`, started with
    `agent_args` and the environment of `agent_env()`; its cache and state dirs in a
    temporary dir named from `dir_prefix`) for the whole class.  The agent is stopped
    cleanly at the end (stop_checked), so that the sanitizer build's exit report
    (leaks) fails the class."""
    head_args = []
    agent_args = []
    dir_prefix = "muster-node-test-"
    agent_name = "n1"

    @classmethod
    def agent_env(cls):
        """The agent's environment beside the test's own, or None."""
        return None

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix=cls.dir_prefix)
        cls.head = harness.Head(cls.head_args).start()
        try:
            cls.agent = Agent(cls.head, cls.dir, cls.agent_name, args=cls.agent_args,
                              env=cls.agent_env()).start()
        except BaseException:
            cls.head.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise
        cls.token = cls.head.token

    @classmethod
    def tearDownClass(cls):
        try:
            cls.agent.stop_checked()
        finally:
            cls.head.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)


class Agent:
    def __init__(self, head, workdir, name="n1", args=(), cmd=None, env=None, token=None):
        self.head = head
        self.token = token or head.token
        self.workdir = workdir
        self.name = name
        self.lock = os.path.join(workdir, "agent-%s.lock" % name)
        self.log_path = os.path.join(workdir, "agent-%s.log" % name)
        self.args = list(args)
        self.cmd = cmd
        self.env = no_gpu_env(dict(os.environ))
        self.env.update(env or {})
        self.proc = None
        self.url = None

    def given(self, option):
        """Whether the test's args name `option` ("--listen"), as "--listen X" or "--listen=X"."""
        return any(a == option or a.startswith(option + "=") for a in self.args)

    def argv(self):
        # A free port unless the test names its own --listen: an option given twice with
        # two values is refused.
        argv = [harness.MUSTER_BIN, "node", "--join", self.head.url, "--token", self.token,
                "--name", self.name, "--lock-file", self.lock]
        if not self.given("--listen"):
            argv += ["--listen", "127.0.0.1:0"]
        # The cache and state dirs in the workdir unless the test names its own: the
        # defaults, /var/tmp/muster-node-NAME/..., are one per node name on the machine, so
        # two runs of a test at once (two suites on one machine) shared them (the second
        # agent to cache a level exited: "the cache dir ... is in use by another node
        # agent"), and a run found what an earlier run left there.  An agent without a
        # port (--listen none) keeps neither.
        listen = [v for a, v in zip(self.args, self.args[1:]) if a == "--listen"] + \
            [a.split("=", 1)[1] for a in self.args if a.startswith("--listen=")]
        if "none" not in listen:
            for option, kind in (("--cache-dir", "cache"), ("--state-dir", "state")):
                if not self.given(option):
                    argv += [option, os.path.join(self.workdir, "%s-%s" % (kind, self.name))]
        argv += self.args
        if self.cmd:
            argv += ["--"] + list(self.cmd)
        return argv

    def start(self, wait_listen=True, timeout=20.0):
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                     env=self.env)
        log.close()
        if wait_listen:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError("agent exited with %s:\n%s" % (self.proc.returncode,
                                                                       self.log()))
                # This process's own text: a killed predecessor's (same lock file) names
                # its port until this one writes.
                info = self.lock_info()
                if info.get("pid") == str(self.proc.pid) and \
                        info.get("listen", "").startswith("http://"):
                    self.url = info["listen"]
                    return self
                time.sleep(0.02)
            raise RuntimeError("agent did not start:\n" + self.log())
        return self

    def lock_info(self):
        try:
            with open(self.lock) as f:
                lines = f.read().splitlines()
        except OSError:
            return {}
        return dict(line.split(" ", 1) for line in lines if " " in line)

    def registered(self):
        """Whether this agent has the head's answer to its registration (its lock file
        says `registered yes`): the head listing the node is not enough, as a head
        killed between its commit and its reply leaves the agent registering still."""
        return self.lock_info().get("registered") == "yes"

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    @property
    def port(self):
        return urllib.parse.urlparse(self.url).port

    def request(self, method, path, body=None, token="default", headers=None, raw=None,
                content_type="application/json", timeout=60):
        """One request through the agent's port, on a fresh connection."""
        hdrs = dict(headers or {})
        if token == "default":
            token = self.head.token
        if token:
            hdrs["Authorization"] = "Bearer " + token
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None and content_type:
            hdrs["Content-Type"] = content_type
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=hdrs)
            r = conn.getresponse()
            return harness.Reply(r.status, dict(r.getheaders()), r.read())
        finally:
            conn.close()

    def workers(self):
        """Pids of the agent's worker processes (its direct children)."""
        return children(self.proc.pid)

    def stop(self, timeout=20):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("agent ignored SIGTERM:\n" + self.log())
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop_checked(self, timeout=20):
        """Stops the agent (killed if need be) and raises AssertionError when it did not
        exit 0 or its log holds a sanitizer's report."""
        try:
            status = self.stop(timeout)
            log = self.log()
        finally:
            self.kill()
        if status != 0 or "Sanitizer" in log:
            raise AssertionError("the agent exited with %s:\n%s" % (status, log))


def _stat(pid):
    """(ppid, pgid) of a live process, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None  # a zombie is gone for our purposes
    return int(fields[1]), int(fields[2])


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid):
    out = []
    for p in all_pids():
        st = _stat(p)
        if st and st[0] == pid:
            out.append(p)
    return out


def descendants(pid):
    """Every live process below `pid`."""
    found, frontier = [], [pid]
    while frontier:
        kids = []
        for p in frontier:
            kids += children(p)
        found += kids
        frontier = kids
    return found


def alive(pid):
    return _stat(pid) is not None


def environ_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def build_dir():
    return os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(harness.MUSTER_BIN)


def tcp_queues():
    """{(local, remote): (tx_queue, rx_queue)} of the machine's established IPv4 TCP
    sockets, as /proc/net/tcp writes their addresses ("0100007F:1F90"): the bytes a
    socket sent that its peer has not acknowledged (taken into its receive queue), and
    the bytes it received that its process has not read."""
    return {(s.local, s.remote): (s.tx_queue, s.rx_queue) for s in tcp_sockets()}


def loopback(port):
    """`port` on 127.0.0.1 as /proc/net/tcp writes it."""
    return "0100007F:%04X" % port


class TcpSocket:
    """An established IPv4 TCP socket from /proc/net/tcp: its addresses as written
    there, their ports, its queues (tcp_queues) and its inode."""

    def __init__(self, fields):
        self.local, self.remote = fields[1], fields[2]
        self.local_port = int(self.local.split(":")[1], 16)
        self.remote_port = int(self.remote.split(":")[1], 16)
        tx, rx = fields[4].split(":")
        self.tx_queue, self.rx_queue = int(tx, 16), int(rx, 16)
        self.inode = int(fields[9])


def tcp_sockets():
    """The machine's established IPv4 TCP sockets (state 01), as TcpSocket."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [TcpSocket(fields) for fields in rows if fields[3] == "01"]


EPOLLIN = 0x001


def socket_inodes(pid):
    """The inodes of the sockets process `pid` holds open (its fds "socket:[N]")."""
    found = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            found.add(int(link[len("socket:["):-1]))
    return found


def epoll_watched_for_input(pid):
    """The inodes of the files that an epoll set of process `pid` watches for input
    (EPOLLIN), from the fdinfo of each of its epoll fds.  Raises AssertionError when
    `pid` has no epoll fd: a loop on poll or select, which this cannot see into, would
    make every socket look unwatched."""
    watched, sets = set(), 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) != "anon_inode:[eventpoll]":
                continue
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                info = f.read()
        except OSError:  # closed meanwhile
            continue
        sets += 1
        for events, ino in re.findall(r"^tfd:\s*\d+\s+events:\s*([0-9a-f]+)\s.*?\bino:([0-9a-f]+)",
                                      info, re.M):
            if int(events, 16) & EPOLLIN:
                watched.add(int(ino, 16))
    if sets == 0:
        raise AssertionError("process %d has no epoll set to look into" % pid)
    return watched


def unread_unwatched(pid, local_port=None, remote_port=None):
    """The most bytes waiting unread on one of `pid`'s established TCP sockets from
    `local_port` to `remote_port` (None: any) that no epoll set of `pid` watches for
    input, 0 when there is none.

    An event loop (the agent's: libevent on epoll) that reads a socket as bytes come
    keeps it in an epoll set for input: it is woken while bytes wait, and it takes them.
    A socket with bytes waiting and out of every set is one the process stopped
    reading (its backpressure), not one it is slow to read, whatever the machine's
    load: a test that waits for this waits for an event, not for time to pass."""
    mine = socket_inodes(pid)
    watched = epoll_watched_for_input(pid)
    most = 0
    for s in tcp_sockets():
        if s.inode not in mine or s.inode in watched or s.rx_queue == 0:
            continue
        if local_port not in (None, s.local_port) or remote_port not in (None, s.remote_port):
            continue
        most = max(most, s.rx_queue)
    return most


# The bytes that must wait unread in a socket out of every epoll set before a test
# takes it for a process that stopped reading (stopped_reading): a loopback
# connection's whole receive window fills then, tens of KiB at least; a short reply
# (a heartbeat's, which the agent's background thread reads with libcurl, polling
# outside any epoll set) waits there a moment and is far smaller.
STOPPED_MIN = 32 * 1024


def stopped_reading(pid, local_port=None, remote_port=None):
    """Whether process `pid` stopped reading one of its TCP sockets from `local_port` to
    `remote_port` (None: any) with bytes waiting in it (unread_unwatched)."""
    return unread_unwatched(pid, local_port, remote_port) >= STOPPED_MIN
