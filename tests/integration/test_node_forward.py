"""Any-node access: the agent's port forwards the API to the head, preserving status
codes, error bodies, headers that matter and auth; long-polls and large bodies pass;
a head that cannot be reached is a 503 `unavailable`."""
import http.client
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import unittest
import urllib.parse

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


class StopWithHeartbeatUnansweredTest(unittest.TestCase):
    """An agent stopped while its heartbeat waits on a head that does not answer."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        # A node timeout of 900 ms: a heartbeat every 300 ms.
        self.head = harness.Head(["--node-timeout-ms", "900"]).start()
        self.agent = Agent(self.head, self.dir, "beating").start()

    def tearDown(self):
        self.agent.kill()
        os.kill(self.head.proc.pid, signal.SIGCONT)
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def unread_by_head(self):
        """Bytes sent to the head on its accepted connections that it has not read:
        the rx_queue of its established sockets (state 01) in /proc/net/tcp."""
        port = "%04X" % urllib.parse.urlparse(self.head.url).port
        with open("/proc/net/tcp") as f:
            return sum(int(fields[4].split(":")[1], 16) for fields in
                       (line.split() for line in f.readlines()[1:])
                       if fields[1].endswith(":" + port) and fields[3] == "01")

    def test_stop_does_not_wait_out_the_heartbeat(self):
        # The stop joins the thread that sends heartbeats.  With libmuster's default
        # request timeout (60 s) a heartbeat to a head that stopped answering held the
        # agent's exit for a minute; the agent's own 5 s bound (and its goodbye's 3 s)
        # end it well within the 15 s given here.
        os.kill(self.head.proc.pid, signal.SIGSTOP)
        harness.wait_until(lambda: self.unread_by_head() > 0, what="a heartbeat sent")
        self.assertEqual(self.agent.stop(timeout=15), 0, self.agent.log())


class StopWhileForwardingTest(unittest.TestCase):
    """An agent stopped (SIGTERM) with a forwarded long-poll parked at the head."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-fwd-test-")
        self.head = harness.Head().start()
        self.agent = Agent(self.head, self.dir, "stopping",
                           args=["--cache-dir", os.path.join(self.dir, "cache")]).start()

    def tearDown(self):
        self.agent.kill()
        self.head.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def lease_waiters(self):
        text = self.head.request("GET", "/metrics").raw.decode()
        return int(re.search(r"^muster_lease_waiters (\d+)$", text, re.M).group(1))

    def assert_stop_reply(self, got):
        """The client waiting when the agent stopped got the stop's 503 (which clients
        retry), not a connection closed under its request."""
        self.assertNotIn("error", got, self.agent.log())
        r = got["reply"]
        self.assertEqual((r.status, r.error_code), (503, "unavailable"), r)
        self.assertIn("is stopping", r.json["error"]["message"])
        self.assertEqual(r.headers.get("Retry-After"), "1", r.headers)
        self.assertEqual(r.headers.get("Connection"), "close", r.headers)

    def test_stop_with_a_long_poll_in_flight_exits_cleanly(self):
        # The forwarded request and its connection to the head were never freed: a
        # leak at exit, which the sanitizer build's leak check turns into exit
        # status 1 (the whole suite runs under it).  And its client had its
        # connection closed (the 503 the agent queued was never written: the loop
        # had ended) instead of an answer it knows to retry.
        self.assertIn(self.agent.request("PUT", "/v1/queues/parked", {}).status, (200, 201))
        got = {}

        def lease():
            try:
                got["reply"] = self.agent.request("POST", "/v1/queues/parked/lease",
                                                  {"wait_ms": 60000}, timeout=30)
            except (OSError, http.client.HTTPException) as e:  # the agent closed it
                got["error"] = e

        t = threading.Thread(target=lease)
        t.start()
        harness.wait_until(lambda: self.lease_waiters() == 1, what="the lease parked at the head")
        self.assertEqual(self.agent.stop(), 0, self.agent.log())
        t.join(10)  # the agent's end closes the client's connection, if nothing else
        self.assertFalse(t.is_alive(), "the client still waits for the stopped agent")
        self.assert_stop_reply(got)
        self.assertNotIn("LeakSanitizer", self.agent.log())
        # The head's long-poll went with the agent's connection to it.
        harness.wait_until(lambda: self.lease_waiters() == 0, what="the head's waiter gone")

    def head_backlog(self):
        """Connections to the head that it has not accepted: the rx_queue of its
        listening socket (state 0A) in /proc/net/tcp."""
        port = "%04X" % urllib.parse.urlparse(self.head.url).port
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[1].endswith(":" + port) and fields[3] == "0A":
                    return int(fields[4].split(":")[1], 16)
        return 0

    def test_stop_with_a_cache_question_in_flight_exits_cleanly(self):
        # The node cache's HEAD to the head (is the level there?) was never freed,
        # nor the client's request waiting on it: a leak at exit, as above.
        r = self.head.request("PUT", "/v1/shared/s/blob", raw=b"x" * 1000,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        os.kill(self.head.proc.pid, signal.SIGSTOP)  # it accepts no connection meanwhile
        try:
            self.stop_with_a_read_waiting()
        finally:
            os.kill(self.head.proc.pid, signal.SIGCONT)

    def stop_with_a_read_waiting(self):
        got = {}

        def read():
            try:
                got["reply"] = self.agent.request("GET", "/v1/shared/s/blob", timeout=30)
            except (OSError, http.client.HTTPException) as e:
                got["error"] = e

        t = threading.Thread(target=read)
        t.start()
        # The agent's first connection to the head of its own: the HEAD waits on it.
        harness.wait_until(lambda: self.head_backlog() >= 1, what="the agent's HEAD sent")
        self.assertEqual(self.agent.stop(), 0, self.agent.log())
        t.join(10)
        self.assertFalse(t.is_alive(), "the client still waits for the stopped agent")
        self.assert_stop_reply(got)
        self.assertNotIn("LeakSanitizer", self.agent.log())


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
