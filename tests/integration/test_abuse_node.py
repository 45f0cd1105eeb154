"""The node agent's port under a hostile or careless client: what a walk of its surface
found that test_node_wire.py and test_node_forward.py did not cover.  Each test fails
without its fix.

- A request the agent would serve itself with a body (the node-local iterations' routes:
  POST /v1/iterations, .../next, .../ack, .../heartbeat) had its body read whole, up to
  8 MiB, before its token was looked at, so anyone who could reach the port made the
  agent hold 8 MiB per connection.  One whose token is not the agent's now goes to the
  head as it comes, which refuses it (401, 403) before its body, and the agent keeps
  none of it; the connection goes on.
- A request for a node-local iteration without a body, with a token other than the
  agent's, was answered 401 by the agent itself: the head's read-only token, which the
  head takes for every GET, could not read a node-local iteration, and a write with it
  was told to send a token rather than that the token may only read.  A read with
  another token is now served when the head takes that token for a read (the agent
  asks it); a write, and a token the head refuses, get the head's own answer (403 for
  the read-only token, 401 saying what is wrong).  The agent's own token is compared in
  constant time, as the head compares its tokens (one helper, core/auth.c).
- "." and ".." are no names for a node-local iteration either.
- An agent started without a token of its own (no --token, no MUSTER_TOKEN) took every
  token as its own, none included: until the head refused its registration, which it
  cannot while it is out of reach, anyone who reached the port created, leased and
  deleted node-local iterations without a token.  Such an agent now sends all of them
  to the head, which judges the token (503 while it cannot be reached).
- Without --cache-dir and --state-dir the agent keeps its cache and iterations.db in
  /var/tmp/muster-node-NAME, and took that directory whoever had made it: another local
  user who made it first (the name is the hostname's) could replace the cached levels
  workers open by path, and the database.  The agent now takes it only when it is a
  directory of its own user (or root's) that no one else may write to.
"""
import os
import select
import shutil
import socket
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from node_harness import Agent, AgentsCase, SharedAgentCase  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402

READ_TOKEN = "read-only-token-0123"
REPLY_WAIT_S = 5  # a reply that is due comes within this


class AgentBodyTest(SharedAgentCase):
    head_args = ["--dashboard-token", READ_TOKEN]
    dir_prefix = "muster-abuse-node-"
    agent_name = "abuse"

    def test_a_body_with_another_token_is_not_read_first(self):
        r = self.agent.request("POST", "/v1/iterations", body={
            "name": "local", "dataset": {"num_samples": 10}, "cluster_sync": False})
        self.assertEqual(r.status, 201, r)
        length = 6 << 20
        for path in ("/v1/iterations", "/v1/iterations/local/next",
                     "/v1/iterations/local/heartbeat", "/v1/iterations/elsewhere/ack"):
            for auth, status in ((None, 401), ("wrong-token-0123456789", 401),
                                 (READ_TOKEN, 403)):
                with self.subTest(path=path, token=auth), Wire(self.agent.port) as w:
                    w.send(request("POST", path, auth, None, headers=[
                        "Content-Type: application/json", "Content-Length: %d" % length]))
                    w.send(b" " * 1000)
                    # Refused while nearly all of the body is still to come.
                    ready, _, _ = select.select([w.sock], [], [], REPLY_WAIT_S)
                    self.assertTrue(ready, "no reply within %d s" % REPLY_WAIT_S)
                    r = w.read_reply()
                    self.assertEqual(r.status, status, r)
                    w.send(b" " * (length - 1000))
                    w.send(request("GET", "/v1/health"))
                    self.assertEqual(w.read_reply().status, 200)
        # The agent's own token is served by the agent, its body read whole.
        r = self.agent.request("POST", "/v1/iterations/local/next", body={"rank": 0})
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.json.get("blocks"), r)

    def test_tokens_without_a_body_as_the_head_takes_them(self):
        r = self.agent.request("POST", "/v1/iterations", body={
            "name": "reads", "dataset": {"num_samples": 10}, "cluster_sync": False})
        self.assertEqual(r.status, 201, r)
        own = self.agent.request("GET", "/v1/iterations/reads").json
        # The head's read-only token reads what the agent holds, as it reads the head's.
        for path in ("/v1/iterations/reads", "/v1/iterations/reads/checkpoint",
                     "/v1/iterations/reads/held?rank=0"):
            with self.subTest(path=path):
                r = self.agent.request("GET", path, token=READ_TOKEN)
                self.assertEqual(r.status, 200, r)
        self.assertEqual(self.agent.request("GET", "/v1/iterations/reads",
                                            token=READ_TOKEN).json, own)
        # It may not write; a wrong token or none is refused: in the head's words.
        forbidden = "the read-only (dashboard) token may only read; this needs the admin token"
        for method, path, token, status, says in (
                ("DELETE", "/v1/iterations/reads", READ_TOKEN, 403, forbidden),
                ("POST", "/v1/iterations/reads/next", READ_TOKEN, 403, forbidden),
                ("POST", "/v1/iterations/reads/heartbeat", READ_TOKEN, 403, forbidden),
                ("GET", "/v1/iterations/reads", "wrong-token-0123456789", 401,
                 "the token sent is not valid for this head"),
                ("GET", "/v1/iterations/reads/held", None, 401, "no token sent"),
                ("DELETE", "/v1/iterations/reads", "wrong-token-0123456789", 401,
                 "the token sent is not valid for this head")):
            with self.subTest(method=method, path=path, token=token):
                r = self.agent.request(method, path, token=token)
                self.assertEqual(r.status, status, r)
                self.assertIn(says, r.json["error"]["message"], r)
        self.assertEqual(self.agent.request("GET", "/v1/iterations/reads").json, own)
        self.assertEqual(self.agent.request("DELETE", "/v1/iterations/reads").status, 200)

    def test_dots_name_no_local_iteration(self):
        for name in (".", ".."):
            r = self.agent.request("POST", "/v1/iterations", body={
                "name": name, "dataset": {"num_samples": 10}, "cluster_sync": False})
            self.assertEqual((r.status, r.error_code), (400, "name_invalid"), r)
            self.assertIn("'.' and '..' are no names: URLs collapse them",
                          r.json["error"]["message"], r)


class TokenlessAgent(Agent):
    """An agent started with no token at all: none on its command line, none in its
    environment, no data dir with a token file."""

    def argv(self):
        argv = super().argv()
        i = argv.index("--token")
        return argv[:i] + argv[i + 2:]


class TokenlessAgentTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-abuse-node-")
        # A port bound but not listening: the head is out of reach (refused at once),
        # so the agent keeps retrying its registration and its port stays up.
        self.closed = socket.socket()
        self.closed.bind(("127.0.0.1", 0))
        head = types.SimpleNamespace(
            url="http://127.0.0.1:%d" % self.closed.getsockname()[1], token=None)
        self.agent = TokenlessAgent(head, self.dir, "tokenless", env={
            "MUSTER_TOKEN": "", "MUSTER_DATA_DIR": os.path.join(self.dir, "no-data-dir")})
        self.agent.start()

    def tearDown(self):
        self.agent.kill()
        self.closed.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_no_token_is_no_pass(self):
        for token in (None, "any-token-0123456789"):
            with self.subTest(token=token):
                r = self.agent.request("POST", "/v1/iterations", token=token, body={
                    "name": "open", "dataset": {"num_samples": 10}, "cluster_sync": False})
                self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
                r = self.agent.request("POST", "/v1/iterations/open/next", token=token,
                                       body={"rank": 0})
                self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)


class DefaultDirsAgent(Agent):
    """An agent with the default --cache-dir and --state-dir."""

    def argv(self):
        argv = super().argv()
        for option in ("--cache-dir", "--state-dir"):
            i = argv.index(option)
            argv = argv[:i] + argv[i + 2:]
        return argv


class AgentHomeTest(AgentsCase):
    dir_prefix = "muster-abuse-node-"

    def setUp(self):
        super().setUp()
        self.name = "abuse-home-%d" % os.getpid()
        self.home = "/var/tmp/muster-node-" + self.name
        shutil.rmtree(self.home, ignore_errors=True)
        self.addCleanup(self.remove_home)

    def remove_home(self):
        if os.path.islink(self.home):
            os.unlink(self.home)
        shutil.rmtree(self.home, ignore_errors=True)

    def refused(self, says):
        agent = DefaultDirsAgent(self.head, self.dir, self.name)
        self.agents.append(agent)
        agent.start(wait_listen=False)
        self.assertEqual(agent.proc.wait(timeout=20), 1, agent.log())
        self.assertIn("muster node: %s, where the agent keeps its cache and state unless told "
                      "otherwise, %s" % (self.home, says), agent.log())
        self.assertEqual(sorted(os.listdir(self.home)), [])  # nothing kept there

    def test_a_home_others_may_write_is_refused(self):
        os.mkdir(self.home)
        os.chmod(self.home, 0o777)  # as another user's would be, who made it first
        self.refused("is writable by other users (mode 777), who could replace what is "
                     "kept in it: remove it (the agent makes it anew), or give --cache-dir "
                     "and --state-dir")
        os.chmod(self.home, 0o755)
        # A link is refused too, even to a directory of this user's.
        os.rename(self.home, self.home + ".real")
        self.addCleanup(shutil.rmtree, self.home + ".real", True)
        os.symlink(self.home + ".real", self.home)
        agent = DefaultDirsAgent(self.head, self.dir, self.name)
        self.agents.append(agent)
        agent.start(wait_listen=False)
        self.assertEqual(agent.proc.wait(timeout=20), 1, agent.log())
        self.assertIn("is not a directory (a link, or a file)", agent.log())

    def test_its_own_home_is_taken(self):
        agent = DefaultDirsAgent(self.head, self.dir, self.name)
        self.agents.append(agent)
        agent.start()
        r = agent.request("POST", "/v1/iterations", body={
            "name": "home", "dataset": {"num_samples": 10}, "cluster_sync": False})
        self.assertEqual(r.status, 201, r)
        self.assertTrue(os.path.exists(os.path.join(self.home, "state", "iterations.db")))
        self.assertEqual(os.stat(self.home).st_mode & 0o022, 0)


if __name__ == "__main__":
    unittest.main()
