"""Any-node access: the agent's port forwards the API to the head, preserving status
codes, error bodies, headers that matter and auth; long-polls and large bodies pass;
a head that cannot be reached is a 503 `unavailable`."""
import os
import shutil
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402


class ForwardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        cls.head = harness.Head().start()
        cls.agent = Agent(cls.head, cls.dir, "fwd").start()

    @classmethod
    def tearDownClass(cls):
        cls.agent.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_health_without_token(self):
        r = self.agent.request("GET", "/v1/health", token=None)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["status"], "ok")
        self.assertIn("muster node", r.headers.get("Via", ""))

    def test_auth_is_the_heads(self):
        r = self.agent.request("GET", "/v1/queues", token=None)
        self.assertEqual(r.status, 401, r)
        self.assertEqual(r.error_code, "unauthorized")
        self.assertIn("Bearer", r.headers.get("WWW-Authenticate", ""))
        r = self.agent.request("GET", "/v1/queues", token="wrong-token-123")
        self.assertEqual(r.status, 401, r)
        r = self.agent.request("GET", "/v1/queues")
        self.assertEqual(r.status, 200, r)

    def test_status_codes_and_error_bodies(self):
        r = self.agent.request("PUT", "/v1/queues/fq", {"lease_ms": 5000})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.headers.get("Content-Type"), "application/json")
        r = self.agent.request("PUT", "/v1/queues/fq", {"lease_ms": 6000})
        self.assertEqual(r.status, 200, r)
        r = self.agent.request("GET", "/v1/queues/nope")
        self.assertEqual((r.status, r.error_code), (404, "queue_not_found"), r)
        direct = self.head.request("GET", "/v1/queues/nope")
        self.assertEqual(r.json, direct.json)
        r = self.agent.request("POST", "/v1/queues/fq/tasks", raw=b"{not json")
        self.assertEqual((r.status, r.error_code), (400, "bad_json"), r)
        r = self.agent.request("POST", "/v1/queues/fq/tasks", raw=b"x", content_type="text/plain")
        self.assertEqual(r.status, 415, r)
        r = self.agent.request("GET", "/v1/no/such/endpoint")
        self.assertEqual(r.status, 404, r)
        r = self.agent.request("DELETE", "/v1/queues/fq")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["deleted"], "fq")

    def test_large_bodies_both_ways(self):
        self.assertIn(self.agent.request("PUT", "/v1/queues/big", {}).status, (200, 201))
        payload = "x" * 700000
        r = self.agent.request("POST", "/v1/queues/big/tasks", {"tasks": [{"payload": payload}]})
        self.assertEqual(r.status, 201, r)
        tid = r.json["tasks"][0]["id"]
        r = self.agent.request("GET", "/v1/tasks/%d" % tid)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json["payload"], payload)
        r = self.agent.request("POST", "/v1/queues/big/tasks",
                               {"tasks": [{"payload": "y" * 1100000}]})
        self.assertEqual((r.status, r.error_code), (413, "payload_too_large"), r)

    def test_long_poll_through_the_agent(self):
        self.assertIn(self.agent.request("PUT", "/v1/queues/lp", {}).status, (200, 201))
        got = {}

        def lease():
            got["reply"] = self.agent.request("POST", "/v1/queues/lp/lease", {"wait_ms": 15000})

        t = threading.Thread(target=lease)
        t.start()
        # Put once the lease is parked on the head (it shows as a waiting request there).
        harness.wait_until(lambda: t.is_alive(), what="lease started")
        r = self.head.request("POST", "/v1/queues/lp/tasks", {"tasks": [{"payload": "wake"}]})
        self.assertEqual(r.status, 201)
        t.join(20)
        self.assertFalse(t.is_alive())
        leases = got["reply"].json["leases"]
        if not leases:  # the put raced ahead of the parked lease: lease again
            leases = self.agent.request("POST", "/v1/queues/lp/lease", {}).json["leases"]
        self.assertEqual([l["payload"] for l in leases], ["wake"])

    def test_many_requests_reuse_connections(self):
        for i in range(50):
            r = self.agent.request("GET", "/v1/health")
            self.assertEqual(r.status, 200)


class UnreachableHeadTest(unittest.TestCase):
    def test_head_down_is_503(self):
        d = tempfile.mkdtemp(prefix="muster-fwd-test-")
        head = harness.Head().start()
        agent = Agent(head, d, "orphan").start()
        try:
            head.stop()
            r = agent.request("GET", "/v1/queues")
            self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
            self.assertIn("cannot reach the head", r.json["error"]["message"])
        finally:
            agent.kill()
            head.cleanup()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
