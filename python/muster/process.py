"""Starting muster processes from Python, and finding the ones running here.

    head = muster.start_head(data_dir="muster-data")     # `muster head`
    print(head.url, head.token)
    head.stop(); head.wait()

The binary is $MUSTER_BIN, else ``muster`` on PATH (or ``binary=``).
"""
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time

from . import errors
from .client import Client, DEFAULT_DATA_DIR
from .resolve import url_problem

HEAD_LOCK = "head.lock"
NODE_LOCK = "/tmp/muster-node.lock"


def find_binary(binary=None):
    path = binary or os.environ.get("MUSTER_BIN") or shutil.which("muster")
    if not path:
        raise FileNotFoundError("the muster binary was not found: set MUSTER_BIN or put muster on PATH")
    return path


def _help_mentions(binary, command, flag):
    try:
        out = subprocess.run([binary] + command + ["--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=10).stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag in out


class Process:
    """A muster process started from Python: ``stop()``, ``kill()``, ``wait()``.

    ``url`` and ``token`` are the ones the process serves with (a head's), ``data_dir``
    its data dir, ``proc`` the subprocess.Popen, ``log_path`` where its output goes.
    """

    def __init__(self, proc, data_dir, log_path, kind):
        self.proc = proc
        self.data_dir = data_dir
        self.log_path = log_path
        self.kind = kind
        self.url = None
        self.token = None

    @property
    def pid(self):
        return self.proc.pid

    def running(self):
        return self.proc.poll() is None

    def stop(self, timeout=30):
        """SIGTERM, then wait for a clean exit (SIGKILL after ``timeout`` seconds)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    terminate = stop

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def wait(self, timeout=None):
        """Waits for the process to end; returns its exit status."""
        return self.proc.wait(timeout)

    def client(self):
        return Client(self.url, self.token)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self):
        return "<muster %s pid %d %s>" % (self.kind, self.proc.pid, self.url or "")


def _spawn(cmd, data_dir, log_name, kind):
    os.makedirs(data_dir, exist_ok=True)
    log_path = os.path.join(data_dir, log_name)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Process(proc, data_dir, log_path, kind)


def _check_listen(listen):
    """Refuses a ``listen`` that is no ``ADDR:PORT`` text before anything is made: a
    port alone is how distributed_computing's ``start_server(password, port)`` is
    called, whose password would become the data dir."""
    if not isinstance(listen, str):
        raise TypeError(
            "listen: 'ADDR:PORT' text such as '0.0.0.0:7370', not %.60r; distributed_computing's "
            "start_server(password, port) is muster.start_server(data_dir, "
            "listen='0.0.0.0:PORT', token=PASSWORD), and its start_head_node is "
            "muster.start_head with the same arguments" % (listen,))


def _check_join(join):
    """Refuses a ``join`` that names no head (in the words of the CLI's --join check)
    before the agent is started: distributed_computing's ``start_node(password,
    address)`` called positionally gives the password here.  The value is not repeated:
    it may be that password."""
    problem = url_problem(join) if isinstance(join, str) else "it is not text"
    if problem:
        raise ValueError(
            "join: the head's URL (http://HOST:7370), and the one given is not: %s; "
            "distributed_computing's start_node(password, address, port) is "
            "muster.start_node(join='http://ADDRESS:7370', token=PASSWORD)" % problem)


def start_head(data_dir=DEFAULT_DATA_DIR, listen="127.0.0.1:7370", token=None, args=(), binary=None,
               server_only=False, timeout=30.0):
    """Starts ``muster head`` and waits until it listens (its URL file appears).

    Returns a :class:`Process` with ``url`` and ``token`` set.  ``listen`` may use port 0
    (a free port).  ``args`` are more ``muster head`` options (``["--sync", "normal"]``).
    """
    _check_listen(listen)
    binary = find_binary(binary)
    url_file = os.path.join(data_dir, "url")
    os.makedirs(data_dir, exist_ok=True)
    if is_head_running(data_dir):
        raise errors.Conflict("a head is already running on data dir %s" % data_dir, code="invalid_state")
    try:
        os.unlink(url_file)
    except FileNotFoundError:
        pass
    cmd = [binary, "head", "--listen", listen, "--data-dir", data_dir]
    if token:
        cmd += ["--token", token]
    if server_only:
        cmd.append("--server-only")
    cmd += list(args)
    p = _spawn(cmd, data_dir, "head.log", "head")
    deadline = time.monotonic() + timeout
    while True:
        if p.proc.poll() is not None:
            raise RuntimeError("muster head exited with %s:\n%s" % (p.proc.returncode, p.log()[-4000:]))
        try:
            with open(url_file) as f:
                url = f.read().strip()
        except FileNotFoundError:
            url = ""
        if url:
            break
        if time.monotonic() > deadline:
            p.kill()
            raise RuntimeError("muster head did not start within %.0f s:\n%s" % (timeout, p.log()[-4000:]))
        time.sleep(0.02)  # the head writes DATA_DIR/url once it listens: poll for it
    p.url = url
    p.token = token
    if p.token is None:
        with open(os.path.join(data_dir, "token")) as f:
            p.token = f.read().strip()
    return p


def start_server(data_dir=DEFAULT_DATA_DIR, listen="127.0.0.1:7370", token=None, args=(), binary=None,
                 timeout=30.0):
    """A head without its local node agent (``muster head --server-only``).

    The flag is passed when the binary knows it; an older binary, whose head ran no
    local agent, is started without it."""
    _check_listen(listen)
    binary = find_binary(binary)
    return start_head(data_dir, listen, token, args, binary,
                      server_only=_help_mentions(binary, ["head"], "--server-only"), timeout=timeout)


def start_node(join=None, token=None, queue=None, workers=None, name=None, listen=None, lock_file=None,
               args=(), command=None, binary=None, log_path=None, timeout=30.0):
    """Starts a node agent: ``muster node --join URL [options] [-- COMMAND...]``, and waits
    until it has joined the head (the head took its registration; its workers start then).

    ``queue`` is the queue its workers serve (no workers without it), ``workers`` the
    number of CPU workers where there is no GPU, ``command`` (a list) what each worker
    runs per task, ``listen`` its API address ("none": no port), ``lock_file`` the
    one-agent-per-machine lock (default $MUSTER_NODE_LOCK, /tmp/muster-node.lock).
    Output goes to ``log_path`` (default: a file in a new temporary directory).
    ``timeout``: seconds to wait for the agent to join; None returns at once.  An agent
    that exits first (a wrong token, another agent holding the machine's lock) raises
    RuntimeError with its last line; one that has not joined within ``timeout`` (the head
    not answering, or refusing its name while another agent holds it) is stopped, and
    RuntimeError says so with its last line.  Raises NotImplementedError when the binary
    has no ``muster node``, and ValueError for a ``join`` that is no head's URL (nothing
    is started then)."""
    if join is not None:
        _check_join(join)
    binary = find_binary(binary)
    if not _help_mentions(binary, ["node"], "--join"):
        raise NotImplementedError("this muster binary has no `muster node` command yet")
    cmd = [binary, "node"]
    for flag, value in (("--join", join), ("--token", token), ("--queue", queue), ("--workers", workers),
                        ("--name", name), ("--listen", listen), ("--lock-file", lock_file)):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += list(args)
    if command:
        cmd += ["--"] + list(command)
    if log_path is None:
        log_path = os.path.join(tempfile.mkdtemp(prefix="muster-node-"), "node.log")
    p = _spawn(cmd, os.path.dirname(os.path.abspath(log_path)), os.path.basename(log_path), "node")
    p.url = join
    p.token = token
    if timeout is not None:
        _await_join(p, _lock_path(lock_file, args), timeout)
    return p


def _lock_path(lock_file, args):
    """The lock file the agent takes: ``lock_file``, a --lock-file among ``args``,
    $MUSTER_NODE_LOCK, or the default (as `muster node` finds it)."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--lock-file" and i + 1 < len(args):
            lock_file = lock_file or args[i + 1]
        elif arg.startswith("--lock-file="):
            lock_file = lock_file or arg.split("=", 1)[1]
    return lock_file or os.environ.get("MUSTER_NODE_LOCK") or NODE_LOCK


def _lock_text(path):
    """The lines of a node agent's lock file as a dict ("pid": "4711", ...); {} when it
    cannot be read."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    return dict(line.split(" ", 1) for line in lines if " " in line)


def _last_line(p):
    """The agent's last line that is not blank, or a note that it wrote none."""
    lines = [line for line in p.log().splitlines() if line.strip()]
    return lines[-1] if lines else "(it wrote nothing)"


def _await_join(p, lock_path, timeout):
    """Waits until agent ``p`` says in its lock file (its own text: the pid is its) that
    the head took its registration; see start_node for what is raised when it does not."""
    head = "the head at %s" % p.url if p.url else "its head"
    deadline = time.monotonic() + timeout
    while True:
        if p.proc.poll() is not None:
            raise RuntimeError("muster node exited with status %s before it joined %s: %s "
                               "(log: %s)" % (p.proc.returncode, head, _last_line(p), p.log_path))
        info = _lock_text(lock_path)
        if info.get("pid") == str(p.pid) and "registered" in info:
            return
        if time.monotonic() > deadline:
            last = _last_line(p)   # why it did not join; its stop adds lines of its own
            p.stop()
            raise RuntimeError("muster node did not join %s within %g s, and was stopped; its "
                               "last line: %s (log: %s)" % (head, timeout, last, p.log_path))
        time.sleep(0.02)  # the agent writes `registered` into its lock file: poll for it


def _lock_held(path):
    """True when another process holds an flock on ``path`` (the head's and node's lock files)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def is_head_running(data_dir=None):
    """True when a head holds the lock of ``data_dir`` ($MUSTER_DATA_DIR, ./muster-data)."""
    data_dir = data_dir or os.environ.get("MUSTER_DATA_DIR") or DEFAULT_DATA_DIR
    return _lock_held(os.path.join(data_dir, HEAD_LOCK))


def is_node_running(lock_file=None):
    """True when a node agent holds its lock (``lock_file``, $MUSTER_NODE_LOCK, /tmp/muster-node.lock)."""
    return _lock_held(lock_file or os.environ.get("MUSTER_NODE_LOCK") or NODE_LOCK)
