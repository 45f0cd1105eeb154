"""``python3 -m muster.worker`` under ``muster worker``: the per-task process and the
*resident* Python process it hands each task to (see worker.py's docstring and
docs/python.md, "python3 -m muster.worker under a node agent").

A resident belongs to one ``muster worker`` (its pid and start time name its files in
$TMPDIR/muster-py-UID/: socket, start lock, stderr log) and runs one task at a time with
a worker.Runner.  A new session whose code changed since the resident imported it runs
in a resident of the next generation (_hand_over).
"""
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

from .worker import PermanentError, Runner, _error_text, _permanent_exit
from .worker_code import CodeChanged


def _proc_start_time(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[19]


def _worker_pid():
    """The ``muster worker`` process that runs us: $MUSTER_WORKER_PID (our parent is a
    guard process of its own for each task), else our parent (an older muster)."""
    try:
        return int(os.environ["MUSTER_WORKER_PID"])
    except (KeyError, ValueError):
        return os.getppid()


def _runtime_dir(create=True):
    """$TMPDIR/muster-py-UID, made when ``create`` and missing.  Removing files makes
    nothing: a resident outliving its worker by a moment must not make the directory
    again after whoever made its TMPDIR removed it."""
    base = os.environ.get("TMPDIR") or "/tmp"
    path = os.path.join(base, "muster-py-%d" % os.getuid())
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _resident_base(pid, start, create=True):
    """The path, without its suffix, of the files of ``muster worker`` ``pid`` (started at
    ``start``): its resident's socket (.sock), start lock (.lock) and stderr (.log)."""
    return os.path.join(_runtime_dir(create), "w%d-%s" % (pid, start))


def _sock_path(base, generation):
    """The socket of the worker's resident of ``generation``: 0 for the first (BASE.sock),
    N for the Nth started because the code the one before had imported changed while
    that one still had an open session to finish on it (BASE-N.sock; _hand_over)."""
    return base + ".sock" if generation == 0 else "%s-%d.sock" % (base, generation)


def _generations(base):
    """The generations of the residents whose sockets are there, oldest first."""
    folder, name = os.path.split(base)
    out = []
    for entry in os.listdir(folder):
        if entry == name + ".sock":
            out.append(0)
        elif entry.startswith(name + "-") and entry.endswith(".sock"):
            number = entry[len(name) + 1:-len(".sock")]
            if number.isdigit():
                out.append(int(number))
    return sorted(out)


def _remove_resident_files(base, keep_log=False):
    """Removes the .sock and .lock of ``base``, and its .log unless ``keep_log`` and the
    log holds something (a resident's own crash output, kept while its worker runs)."""
    for suffix in (".sock", ".lock", ".log"):
        try:
            if suffix == ".log" and keep_log and os.path.getsize(base + suffix) > 0:
                continue
            os.unlink(base + suffix)
        except OSError:
            pass


def _sweep_stale_files():
    """Removes the files of resident processes whose ``muster worker`` is gone (its pid
    has no process, or one started at another time): a worker killed with its agent
    (SIGKILL) left its resident no chance to remove them."""
    try:
        names = os.listdir(_runtime_dir(create=False))
    except OSError:
        return
    for name in names:
        stem, dot, suffix = name.rpartition(".")
        pid, dash, start = stem[1:].partition("-")
        start, _, generation = start.partition("-")   # wPID-START-N.sock: a later resident
        if (not name.startswith("w") or not dot or suffix not in ("sock", "lock", "log")
                or not dash or not pid.isdigit() or not (generation or "0").isdigit()):
            continue
        if _proc_start_time(int(pid)) != start:
            _remove_resident_files(os.path.join(_runtime_dir(create=False), stem))


def _send(sock, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock):
    (n,) = struct.unpack("!Q", _recv_exact(sock, 8))
    return json.loads(_recv_exact(sock, n))


class _UpdatesFile:
    """Reads the ``muster worker``'s MUSTER_UPDATES_FILE up to a sequence number."""

    def __init__(self):
        self.path = None
        self.offset = 0

    def read(self, path, upto):
        if not path:
            return []
        if path != self.path:
            self.path, self.offset = path, 0
        out = []
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                for line in f:
                    if not line.endswith(b"\n"):
                        break
                    u = json.loads(line)
                    if u["seq"] > upto:
                        break
                    out.append(u)
                    self.offset += len(line)
        except OSError:
            pass
        return out


def serve_resident(listen_fd, parent_pid, parent_start, generation=0):
    """The resident process: one task at a time from the per-task processes."""
    lsock = socket.socket(fileno=listen_fd)
    base = _resident_base(parent_pid, parent_start, create=False)
    sock = _sock_path(base, generation)

    def watch_parent():
        while _proc_start_time(parent_pid) == parent_start:
            time.sleep(0.5)
        # Its worker is gone, so no task will come: leave nothing behind (an empty log
        # too; a log with output goes at the next start's sweep).
        _unlink(sock)
        _remove_resident_files(base, keep_log=True)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    # The first task's process started us: its required files are no other task's.
    for name in [n for n in os.environ if n == "MUSTER_REQUIRES" or n.startswith("MUSTER_SHARED_")]:
        del os.environ[name]
    runner = [None]
    updates = _UpdatesFile()
    while True:
        conn, _ = lsock.accept()
        try:
            msg = _recv(conn)
        except (EOFError, OSError, ValueError):
            conn.close()
            continue
        reply = _serve_one(conn, lambda: _resident_reply(runner, msg, updates, sock))
        if reply.get("changed") and not reply["kept"]:
            os._exit(0)   # on changed code with no session of its own left: no use


def _serve_one(conn, answer):
    """Sends ``answer()`` (the reply to the task ``conn`` handed over) and returns it.  The
    process exits when the task's process dies first: the task was abandoned (its
    process was killed: a hard stop, a lost lease), and its job with it."""
    state = {"running": True}
    guard = threading.Lock()

    def watch_caller():
        try:
            conn.recv(1)
        except OSError:
            pass
        with guard:
            if state["running"]:
                os._exit(3)

    threading.Thread(target=watch_caller, daemon=True).start()
    reply = answer()
    with guard:
        state["running"] = False
    try:
        _send(conn, reply)
    except OSError:
        pass
    conn.close()
    return reply


def _resident_reply(runner, msg, updates, sock):
    """A resident's reply to one task: its result, its failure, or, for a new session
    when a module file the process imported changed since (CodeChanged), ``changed``
    (the file) and ``kept`` (the sessions the process keeps, to finish on the old code;
    with none left it exits, its socket ``sock`` removed first).  ``runner``: [Runner or
    None]."""
    from .client import Client
    try:
        if runner[0] is None:
            runner[0] = Runner(Client(msg.get("url")), cache_url=os.environ.get("MUSTER_CACHE_URL"))
        runner[0].apply_updates(updates.read(msg.get("updates_file"), int(msg.get("update_seq") or 0)))
        requires = json.loads(msg["requires"]) if msg.get("requires") else None
        return {"ok": True, "result": runner[0].run_payload(msg["payload"], requires=requires)}
    except CodeChanged as e:
        kept = runner[0].open_sessions()
        if not kept:
            _unlink(sock)   # the next task must not ask this process
        return {"ok": False, "changed": e.path, "session": e.session, "pid": os.getpid(),
                "kept": kept}
    except PermanentError as e:
        return {"ok": False, "error": "muster.worker: %s" % e, "permanent": True}
    except BaseException:   # noqa: B902 - a task's failure, whatever it is
        return {"ok": False, "error": _error_text()}


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _connect(path):
    """A connection to the resident listening at ``path``; None when none is there (a
    socket nobody listens on any more is removed: its resident died)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except ConnectionRefusedError:
        s.close()
        _unlink(path)
        return None
    except OSError:
        s.close()
        return None
    return s


def _exchange(sock, msg):
    """Sends a task and returns the reply; EOFError or OSError when the resident died."""
    try:
        _send(sock, msg)
        return _recv(sock)
    finally:
        sock.close()


def _hand_over(msg):
    """The reply to a task from the worker's resident that runs its session.

    One resident normally runs every session.  When a new session's class would run on
    code that changed since the resident imported it (a module file of the user's edited
    between two runs: worker_code.py), that resident answers ``changed`` and the task
    goes to a new resident, of the next generation, which imports the code as it is now;
    the older one keeps the sessions it has open, which finish on the code they started
    with, and exits once it has none (a pool closed, as it finds the next time a task of
    another session asks it).  So each task asks the residents oldest first: one that
    has the session runs it, one on changed code passes it on, and the newest takes a
    new session.  Each resident is a process of its own: two versions of the code cannot
    share one, as Python imports a module once per process."""
    parent = (_worker_pid(), _proc_start_time(_worker_pid()) or "0")
    base = _resident_base(*parent)
    generations, changed = _generations(base), None
    for generation in generations:
        s = _connect(_sock_path(base, generation))
        if s is not None:
            reply = _exchange(s, msg)
            if "changed" not in reply:
                return reply
            changed = reply
    s, pid = _start_resident(parent, generations[-1] + 1 if generations else 0)
    if changed is not None and pid is not None:
        _say_changed(changed, pid)
    return _exchange(s, msg)


def _say_changed(reply, pid):
    """Says once, on the ``muster worker``'s stderr (a node agent's log), why a session
    runs in a new resident: a task's own stderr is not shown when it succeeds."""
    kept = reply["kept"]
    text = ("muster.worker: %s changed since the worker's Python process (pid %d) imported "
            "it: session %s runs in a new one (pid %d), on the code as it is now; %s\n"
            % (reply["changed"], reply["pid"], reply["session"], pid,
               "the old one finishes session%s %s on the old code" % (
                   "s" if len(kept) > 1 else "", ", ".join(kept))
               if kept else "the old one had no open session left and exited"))
    try:
        fd = os.open("/proc/%d/fd/2" % _worker_pid(), os.O_WRONLY | os.O_APPEND)
    except OSError:
        sys.stderr.write(text)
        return
    try:
        os.write(fd, text.encode())
    except OSError:
        pass   # the agent is gone (a broken pipe): nobody would read it
    finally:
        os.close(fd)


def _start_resident(parent, generation):
    """A connection to the resident of ``generation`` of the worker ``parent`` (its pid and
    start time) and the resident's pid, None when another task's process started it."""
    base = _resident_base(*parent)
    path = _sock_path(base, generation)
    with open(base + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(path)
        if s is not None:
            return s, None
        _sweep_stale_files()   # a new resident: the time to forget the ones of dead workers
        _unlink(path)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(path)
        lsock.listen(16)
        with open(base + ".log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "muster.worker", "--resident", str(lsock.fileno()),
                 "--parent", "%d:%s" % parent, "--generation", str(generation)],
                pass_fds=(lsock.fileno(),), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        lsock.close()
        s = _connect(path)
        if s is None:
            raise RuntimeError("muster.worker: the resident process did not start (see %s.log)"
                               % base)
        return s, proc.pid


def _parent_url():
    """The head URL of the ``muster worker`` that runs us: $MUSTER_URL, else its ``--url``."""
    url = os.environ.get("MUSTER_URL")
    if url:
        return url
    try:
        with open("/proc/%d/cmdline" % _worker_pid(), "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == "--":
            break
        if arg == "--url":
            return argv[i + 1]
        if arg.startswith("--url="):
            return arg[6:]
    return None


def run_one_task():
    """One task under ``muster worker``: stdin is the payload, stdout the result.  Exits
    0 with the result, MUSTER_PERMANENT_EXIT for a failure known to be permanent (not a
    Pool task, its session closed or not a Pool's) when the worker set it, else 1."""
    payload = sys.stdin.buffer.read().decode("utf-8")
    # MUSTER_REQUIRES: the files `muster worker` made of the shared data the task requires.
    msg = {"payload": payload, "url": _parent_url(), "updates_file": os.environ.get("MUSTER_UPDATES_FILE"),
           "update_seq": os.environ.get("MUSTER_UPDATE_SEQ") or 0,
           "task": os.environ.get("MUSTER_TASK_ID"),
           "requires": os.environ.get("MUSTER_REQUIRES")}
    try:
        reply = _hand_over(msg)
    except (EOFError, OSError):
        sys.stderr.write("muster.worker: the Python worker process died while running task %s\n"
                         % os.environ.get("MUSTER_TASK_ID"))
        return 1
    if reply["ok"]:
        sys.stdout.write(reply["result"])
        return 0
    sys.stderr.write(reply["error"])
    return (reply.get("permanent") and _permanent_exit()) or 1
