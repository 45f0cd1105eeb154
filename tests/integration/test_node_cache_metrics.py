"""Node cache counters reach the head: a node agent reports its cache's hits, misses and
other counters with every heartbeat; the head shows them in GET /v1/nodes/{name} ("cache")
and in /metrics (muster_node_cache_*_total{node=...}); bad counters are refused."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402


class NodeCacheMetricsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="muster-cache-metrics-")
        # A short node timeout makes the agent heart-beat every 500 ms.
        cls.head = harness.Head(args=["--node-timeout-ms", "1500"]).start()
        cls.agent = Agent(cls.head, cls.dir, "cm1",
                          args=["--cache-dir", os.path.join(cls.dir, "cache")]).start()
        # The agent registers from a thread of its own, after it listens.
        harness.wait_until(lambda: cls.head.request("GET", "/v1/nodes/cm1").status == 200,
                           timeout=20, what="node cm1 to register with the head")

    @classmethod
    def tearDownClass(cls):
        cls.agent.kill()
        cls.head.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def node_cache(self):
        r = self.head.request("GET", "/v1/nodes/cm1")
        self.assertEqual(r.status, 200, r)
        return r.json["cache"]

    def test_counters_travel_with_heartbeats(self):
        data = b"weights" * 1000
        r = self.head.request("PUT", "/v1/shared/models/w", raw=data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        for _ in range(3):  # one miss, then two hits
            r = self.agent.request("GET", "/v1/shared/models/w?level=1")
            self.assertEqual((r.status, r.raw), (200, data))
        local = self.agent.request("GET", "/v1/node/cache").json
        self.assertEqual((local["hits"], local["misses"]), (2, 1))

        cache = harness.wait_until(
            lambda: (lambda c: c if c and c["hits"] == 2 else None)(self.node_cache()),
            what="the node's cache counters at the head")
        self.assertEqual((cache["misses"], cache["bytes_served"], cache["upstream_fetches"]),
                         (1, 3 * len(data), local["upstream_fetches"]))
        metrics = self.head.request("GET", "/metrics").raw.decode()
        self.assertIn('muster_node_cache_hits_total{node="cm1"} 2\n', metrics)
        self.assertIn('muster_node_cache_misses_total{node="cm1"} 1\n', metrics)
        self.assertIn('muster_node_cache_served_bytes_total{node="cm1"} %d\n' % (3 * len(data)),
                      metrics)

    def test_bad_counters_are_refused(self):
        for body in ({"cache": {"hits": -1}}, {"cache": {"hits": "2"}}, {"cache": {"bogus": 1}},
                     {"cache": [1]}):
            r = self.head.request("POST", "/v1/nodes/cm1/heartbeat", body)
            self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), body)
            self.assertIn("cache", r.json["error"]["message"], body)
        # Nothing a refused heartbeat carried was stored.
        cache = self.node_cache() or {}
        self.assertNotIn("bogus", cache)
        self.assertNotEqual(cache.get("hits"), -1)


if __name__ == "__main__":
    unittest.main()
