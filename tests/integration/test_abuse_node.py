"""The node agent's port under a hostile or careless client: what a walk of its surface
found that test_node_wire.py and test_node_forward.py did not cover.  Each test fails
without its fix.

- A request the agent would serve itself with a body (the node-local iterations' routes:
  POST /v1/iterations, .../next, .../ack, .../heartbeat) had its body read whole, up to
  8 MiB, before its token was looked at, so anyone who could reach the port made the
  agent hold 8 MiB per connection.  One whose token is not the agent's now goes to the
  head as it comes, which refuses it (401, 403) before its body, and the agent keeps
  none of it; the connection goes on.
"""
import os
import select
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402
from test_http_wire import Wire, request  # noqa: E402

READ_TOKEN = "read-only-token-0123"
REPLY_WAIT_S = 5  # a reply that is due comes within this


class AgentBodyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-abuse-node-")
        cls.head = harness.Head(["--dashboard-token", READ_TOKEN]).start()
        cls.agent = Agent(cls.head, cls.dir, "abuse",
                          args=["--cache-dir", os.path.join(cls.dir, "cache"),
                                "--state-dir", os.path.join(cls.dir, "state")]).start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.agent.stop_checked()
        finally:
            cls.head.cleanup()
            shutil.rmtree(cls.dir, ignore_errors=True)

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


if __name__ == "__main__":
    unittest.main()
