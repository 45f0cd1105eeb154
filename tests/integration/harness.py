"""Test harness: starts the real `muster head` on a free port with a temporary data dir.

Used by every Python integration test.  Standard library only; runs on /usr/bin/python3.
MUSTER_BIN names the binary (ctest sets it); the head's log is DATA_DIR/head.log.
"""
import contextlib
import fcntl
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.parse

MUSTER_BIN = os.environ.get("MUSTER_BIN") or os.path.join(
    os.path.dirname(__file__), "..", "..", "build", "muster")
TOKEN = "test-token-0123456789"


# Tests run side by side (ctest -j): two that miss a tool at once would both run
# apt-get, and the second would fail on dpkg's lock ("Could not get lock
# /var/lib/dpkg/lock-frontend").  One lock file serialises this suite's installs.
APT_LOCK = os.path.join(tempfile.gettempdir(), "muster-tests-apt.lock")
APT_LOCK_WAIT_S = 600  # apt-get's own wait for dpkg's lock held outside the suite


def ensure_tool(tool, package):
    """The path of `tool`, installing Debian's `package` first when it is missing.

    The look is repeated under an exclusive lock on APT_LOCK, so a test that waited
    while another installed the same package finds it there and installs nothing.
    apt-get also waits up to APT_LOCK_WAIT_S for dpkg's lock (an unattended upgrade
    or a person's apt-get).  Raises RuntimeError when the tool is still missing."""
    path = shutil.which(tool)
    if path is not None:
        return path
    with open(APT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = shutil.which(tool)
        if path is None:
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            apt = ([] if os.geteuid() == 0 else ["sudo"]) + [
                "apt-get", "-o", "DPkg::Lock::Timeout=%d" % APT_LOCK_WAIT_S]
            subprocess.run(apt + ["update", "-qq"], env=env, check=True)
            subprocess.run(apt + ["install", "-y", "-qq", "--no-install-recommends", package],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            path = shutil.which(tool)
    if path is None:
        raise RuntimeError("%s is not available even after installing %s" % (tool, package))
    return path


class Reply:
    """An HTTP reply: status, headers, raw body and (when JSON) the parsed body."""

    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = headers
        self.raw = raw
        try:
            self.json = json.loads(raw) if raw else None
        except ValueError:
            self.json = None

    @property
    def error_code(self):
        return (self.json or {}).get("error", {}).get("code")

    def __repr__(self):
        return "Reply(%d, %r)" % (self.status, self.raw[:300])


class Head:
    """A head process.  start() waits until it listens; stop()/kill() end it."""

    def __init__(self, args=(), data_dir=None, token=TOKEN, prefix=(), env=None):
        self.args = list(args)
        self.env = dict(env or {})  # added to the test's environment for the head
        self.prefix = list(prefix)  # e.g. a tracer the head runs under
        self.own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="muster-test-")
        self.token = token
        self.proc = None
        self.url = None
        self.log_path = os.path.join(self.data_dir, "head.log")
        self._conn = None

    def start(self, timeout=20.0):
        url_file = os.path.join(self.data_dir, "url")
        if os.path.exists(url_file):
            os.unlink(url_file)
        # --server-only: the head under test runs without its local node agent
        # (which would register this machine as a node); test_node*.py start agents.
        cmd = self.prefix + [MUSTER_BIN, "head", "--server-only", "--listen", "127.0.0.1:0",
               "--data-dir", self.data_dir]
        if self.token:
            cmd += ["--token", self.token]
        cmd += self.args
        log = open(self.log_path, "ab")
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        # The head writes its URL to DATA_DIR/url once it listens.
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("head exited with %s:\n%s" % (self.proc.returncode, self.log()))
            if os.path.exists(url_file):
                with open(url_file) as f:
                    url = f.read().strip()
                if url:
                    self.url = url
                    self._close_conn()
                    return self
            time.sleep(0.02)
        raise RuntimeError("head did not start:\n" + self.log())

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    @property
    def port(self):
        return urllib.parse.urlparse(self.url).port

    def connection(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, token="default", headers=None, raw=None,
                content_type="application/json", conn=None):
        """Sends one request on a keep-alive connection and returns a Reply."""
        hdrs = dict(headers or {})
        if token == "default":
            token = self.token
        if token:
            hdrs["Authorization"] = "Bearer " + token
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None and content_type:
            hdrs["Content-Type"] = content_type
        own = conn is None
        for attempt in (1, 2):
            c = conn or self._conn or self.connection()
            try:
                c.request(method, path, body=data, headers=hdrs)
                r = c.getresponse()
                reply = Reply(r.status, dict(r.getheaders()), r.read())
                if own:
                    self._conn = c
                return reply
            except (ConnectionError, http.client.HTTPException):
                c.close()
                if own:
                    self._conn = None
                if attempt == 2 or not own:
                    raise

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        """kill -9 and wait."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_conn()

    def _close_conn(self):
        # Close (not just drop) the keep-alive socket: a dropped one leaks until GC
        # and shows up as a ResourceWarning in every test that restarts the head.
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def stop(self, timeout=20):
        """SIGTERM, wait for a clean exit, return the exit status."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("head ignored SIGTERM")
        self._close_conn()
        return self.proc.returncode if self.proc else None

    def stop_checked(self):
        """Stops the head cleanly and removes it (cleanup), failing on an exit status other
        than 0 or a sanitizer report in its log: under the sanitizers its exit reports
        what a test leaked or broke."""
        try:
            status = self.stop()
            log = self.log()
        finally:
            self.cleanup()
        if status != 0 or "Sanitizer" in log:
            raise AssertionError("the head exited with %s:\n%s" % (status, log))

    def cleanup(self):
        self.kill()
        if self.own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


@contextlib.contextmanager
def not_muster_server():
    """An HTTP server on loopback that answers every GET 404 with an empty body (no
    muster error envelope), as a web server at a wrong URL would; yields its URL."""
    class NotMuster(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMuster)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class RestartableHeadCase(unittest.TestCase):
    """A head per test on a port of its own, so that it can be killed and started again
    at the same URL (self.head.kill(), self.head.start()); self.proxy, when a test sets
    one (a RequestProxy), is closed after it."""

    def setUp(self):
        self.head = Head(["--listen", "127.0.0.1:%d" % free_port()]).start()
        self.proxy = None

    def tearDown(self):
        if self.proxy:
            self.proxy.close()
        self.head.cleanup()


# What a node agent or proxy in front of a head that does not answer replies (a
# RequestProxy decision): the request never reached the head.
UNAVAILABLE = (503, {"error": {"code": "unavailable", "message": "the head is unreachable"}})


class RequestProxy:
    """An HTTP/1.1 proxy in front of `head` that forwards every request but hands those
    for which `match(method, path)` is true (the path without its query) to `decide(n)`,
    n from 1, which returns "forward"; "drop" (forward it, then close the connection
    without a reply: the head did it, the client heard nothing); (status, body) to
    answer in the head's place (body: a dict, sent as JSON); or a function that takes
    the head's reply body as an iterator of pieces and yields what to send instead, as
    it comes (the head's status and Content-Length go first; a body that ends short
    closes the connection); or {"headers": {NAME: VALUE}} to forward it and set those
    headers in the head's reply.  `count` counts them; `requests` lists them as (method,
    path, client address), the n-th at n - 1 (there when `decide(n)` is asked);
    `targets` lists the target (path and query) of every request, matched or not."""

    def __init__(self, head, match, decide):
        self.head, self.match, self.decide, self.count = head, match, decide, 0
        self.requests = []
        self.targets = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                what = "forward"
                with proxy.lock:
                    proxy.targets.append(self.path)
                if proxy.match(self.command, self.path.split("?")[0]):
                    with proxy.lock:
                        proxy.count += 1
                        proxy.requests.append(
                            (self.command, self.path.split("?")[0], self.client_address))
                        what = proxy.decide(proxy.count)
                overrides = {}
                if isinstance(what, dict):
                    overrides, what = what["headers"], "forward"
                if isinstance(what, tuple):
                    return self.reply(what[0], {"Content-Type": "application/json"},
                                      json.dumps(what[1]).encode())
                conn = http.client.HTTPConnection("127.0.0.1", proxy.head.port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers={
                        k: v for k, v in self.headers.items() if k.lower() != "connection"})
                    r = conn.getresponse()
                    if callable(what):
                        return self.stream(r, what)
                    status, headers, data = r.status, dict(r.getheaders()), r.read()
                    headers.update(overrides)
                finally:
                    conn.close()
                if what == "drop":
                    self.close_connection = True
                    return None
                return self.reply(status, headers, data)

            def reply(self, status, headers, data, length=None):
                self.send_response(status)
                for k, v in headers.items():
                    if k.lower() not in ("content-length", "connection", "transfer-encoding",
                                         "date", "server"):
                        self.send_header(k, v)
                if length is None and self.command == "HEAD":
                    length = headers.get("Content-Length", "0")  # of the body a GET gets
                self.send_header("Content-Length", str(len(data) if length is None else length))
                self.end_headers()
                self.wfile.write(data)

            def stream(self, r, body):
                length = int(r.getheader("Content-Length"))
                self.reply(r.status, dict(r.getheaders()), b"", length)
                self.wfile.flush()
                sent = 0
                try:
                    for piece in body(iter(lambda: r.read(1 << 16), b"")):
                        self.wfile.write(piece)
                        self.wfile.flush()
                        sent += len(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (an agent that stopped, say)
                self.close_connection = sent != length

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class SubmissionProxy(RequestProxy):
    """A RequestProxy deciding the task submissions (POST /v1/sessions/ID/tasks), counted
    in `submissions`."""

    def __init__(self, head, decide):
        super().__init__(head, lambda method, path: method == "POST" and re.fullmatch(
            r"/v1/sessions/[^/]+/tasks", path) is not None, decide)

    @property
    def submissions(self):
        return self.count


class CliChecks:
    """ok() and fails() for a unittest.TestCase whose muster(*args, **kw) runs the CLI
    and returns its CompletedProcess."""

    def ok(self, *args, **kw):
        r = self.muster(*args, **kw)
        self.assertEqual(r.returncode, 0, "muster %s failed: %s" % (" ".join(args), r.stderr))
        return r.stdout

    def fails(self, code, *args, **kw):
        r = self.muster(*args, **kw)
        self.assertEqual(r.returncode, code, "muster %s: rc %d, stderr %r"
                         % (" ".join(args), r.returncode, r.stderr))
        return r.stderr


class CliHead(CliChecks):
    """A mixin for a unittest.TestCase whose tests run the CLI against one head of the
    class (started with HEAD_ARGS) from a working directory of the class's own (`cwd`,
    removed with the head): muster(*args, stdin=None, url=True, token=True) runs it with
    the head's URL and token in the environment (url: False leaves it out, a string
    gives another; token: False leaves it out)."""
    HEAD_ARGS = ()
    head = None

    @classmethod
    def setUpClass(cls):
        cls.head = Head(list(cls.HEAD_ARGS))
        cls.head.start()
        cls.cwd = tempfile.mkdtemp(prefix="muster-cli-")

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()
        shutil.rmtree(cls.cwd, ignore_errors=True)

    def muster(self, *args, stdin=None, url=True, token=True):
        env = cli_env(self.head, bool(url), token)
        if isinstance(url, str):
            env["MUSTER_URL"] = url
        return subprocess.run([MUSTER_BIN] + list(args), input=stdin, capture_output=True,
                              text=True, env=env, cwd=self.cwd, timeout=60)


def free_port():
    """A TCP port of 127.0.0.1 free now: for a head that must come back on the same URL
    after a restart (the port is not held; another process could take it meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_env(head, url=True, token=True):
    """The environment for a `muster` CLI command against `head`: this process's, less
    every MUSTER_* variable, plus MUSTER_URL and MUSTER_TOKEN unless told not to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    if url:
        env["MUSTER_URL"] = head.url
    if token:
        env["MUSTER_TOKEN"] = head.token
    return env


def stop_process(proc, timeout=20):
    """SIGTERM to ``proc`` (a Popen) unless it has exited, then wait up to ``timeout`` s
    and SIGKILL it past that: for a helper process a test started, whose clean stop is not
    what the test checks (Head.stop and Agent.stop raise when SIGTERM is ignored)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Polls `predicate` until it returns a truthy value; fails after `timeout` seconds.
    `what` names the condition in the failure; a callable is called then, so that a log
    it quotes is the log at the deadline, not at the start of the wait."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + (what() if callable(what) else what))
        time.sleep(interval)
