"""Nodes: register, re-register, heartbeat, leave, list, get, the node timeout that
reschedules its workers' tasks, and DELETE /v1/workers/{id}?crashed=true
(docs/api.md, "Nodes")."""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase, is_int, now_ms  # noqa: E402

NODE_KEYS = {"name", "hostname", "address", "cpus", "gpus", "labels", "state", "timeout_ms",
             "last_seen_ms", "created_ms", "workers", "cache"}
GPU = {"index": 0, "name": "NVIDIA H100", "memory_total_mb": 81559, "memory_free_mb": 80000}


def hold(seconds, step=None):
    """Lets time pass, calling `step` meanwhile (to show that something did NOT happen)."""
    end = time.monotonic() + seconds

    def done():
        if step:
            step()
        return time.monotonic() >= end
    harness.wait_until(done, timeout=seconds + 5, interval=0.05, what="time")


class NodeCase(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--node-timeout-ms", "40000")

    def node_name(self, suffix=""):
        return self.qname(suffix).replace(type(self).__name__ + ".", "n.")

    def register_node(self, status=201, **body):
        body.setdefault("name", self.node_name())
        n = self.expect("POST", "/v1/nodes", body, status=status)
        self.assert_node_shape(n)
        return n

    def get_node(self, name):
        n = self.expect("GET", "/v1/nodes/" + name)
        self.assert_node_shape(n)
        return n

    def assert_node_shape(self, n):
        self.assertEqual(set(n), NODE_KEYS, n)
        for k in ("cpus", "timeout_ms", "last_seen_ms", "created_ms", "workers"):
            self.assertTrue(is_int(n[k]), "%s: %r" % (k, n))
        self.assertIn(n["state"], ("active", "gone"), n)

    def worker_on(self, node, **body):
        return self.register(node=node, queues=[self.q], **body)

    def worker_state(self, wid):
        return self.expect("GET", "/v1/workers/%d" % wid)["state"]


class NodeTest(NodeCase):

    def test_register_and_get(self):
        name = self.node_name()
        t0 = now_ms()
        n = self.register_node(name=name, hostname="gpu-box-1", address="10.0.0.2:7371", cpus=16,
                               gpus=[GPU, {"index": 1}], labels={"rack": "a", "n": 2},
                               timeout_ms=20000)
        t1 = now_ms()
        self.assertEqual(
            {k: n[k] for k in NODE_KEYS - {"last_seen_ms", "created_ms"}},
            {"name": name, "hostname": "gpu-box-1", "address": "10.0.0.2:7371", "cpus": 16,
             "gpus": [GPU, {"index": 1}], "labels": {"rack": "a", "n": 2}, "state": "active",
             "timeout_ms": 20000, "workers": 0, "cache": None})
        self.assert_between(n["created_ms"], t0, t1, "created_ms")
        self.assert_between(n["last_seen_ms"], t0, t1, "last_seen_ms")
        self.assertEqual(self.get_node(name), n)
        # Defaults: the head's --node-timeout-ms, no GPUs, no labels, nulls.
        d = self.register_node(name=self.node_name("defaults"))
        self.assertEqual((d["hostname"], d["address"], d["cpus"], d["gpus"], d["labels"],
                          d["timeout_ms"], d["state"], d["workers"]),
                         (None, None, 0, [], {}, 40000, "active", 0))
        # null stands for absent.
        e = self.register_node(name=self.node_name("nulls"), hostname=None, gpus=None,
                               labels=None, timeout_ms=None, cpus=None)
        self.assertEqual((e["hostname"], e["gpus"], e["labels"], e["timeout_ms"], e["cpus"]),
                         (None, [], {}, 40000, 0))

    def test_list(self):
        names = [self.node_name(s) for s in ("c", "a", "b")]
        for name in names:
            self.register_node(name=name)
        nodes = self.expect("GET", "/v1/nodes")["nodes"]
        all_names = [n["name"] for n in nodes]
        self.assertEqual(all_names, sorted(all_names), "nodes are ordered by name")
        mine = [n for n in nodes if n["name"] in names]
        self.assertEqual([n["name"] for n in mine], sorted(names))
        for n in mine:
            self.assert_node_shape(n)
            self.assertEqual(n, self.get_node(n["name"]))

    def test_workers_count(self):
        self.create_queue()
        name = self.node_name()
        self.register_node(name=name)
        ws = [self.worker_on(name) for _ in range(3)]
        self.register(node=self.node_name("other"))
        self.assertEqual(self.get_node(name)["workers"], 3)
        self.expect("DELETE", "/v1/workers/%d" % ws[0]["id"])
        self.assertEqual(self.get_node(name)["workers"], 2)
        self.assertEqual(self.expect("GET", "/v1/workers/%d" % ws[1]["id"])["node"], name)

    def test_heartbeat(self):
        name = self.node_name()
        before = self.register_node(name=name)
        harness.wait_until(lambda: now_ms() > before["last_seen_ms"] + 20, what="time")
        r = self.expect("POST", "/v1/nodes/%s/heartbeat" % name, {})
        self.assertEqual(r, {"name": name, "state": "active"})
        self.assertGreater(self.get_node(name)["last_seen_ms"], before["last_seen_ms"])
        # No body at all is {} too.
        r = self.call("POST", "/v1/nodes/%s/heartbeat" % name, None, content_type=None)
        self.assertEqual((r.status, r.json), (200, {"name": name, "state": "active"}), r)
        self.expect_error("POST", "/v1/nodes/%s/heartbeat" % name, {"progress": "x"}, 400,
                          "invalid_argument")
        self.expect_error("POST", "/v1/nodes/no-such-node/heartbeat", {}, 404, "node_not_found")

    def test_heartbeat_keeps_node(self):
        self.create_queue(lease_ms=60000)
        name = self.node_name()
        self.register_node(name=name, timeout_ms=400)
        w = self.worker_on(name)
        self.put("p")
        lease = self.lease_one(worker=w["id"])
        hold(1.2, lambda: self.expect("POST", "/v1/nodes/%s/heartbeat" % name, {}))
        self.assertEqual(self.get_node(name)["state"], "active")
        self.assertEqual(self.worker_state(w["id"]), "active")
        self.assertEqual(self.get_task(lease["task"])["state"], "leased")

    def test_reregister(self):
        self.create_queue(lease_ms=60000)
        name = self.node_name()
        first = self.register_node(name=name, hostname="old", cpus=2, labels={"v": 1})
        ws = [self.worker_on(name) for _ in range(2)]
        self.put("a", "b", "c")
        held = [self.lease_one(worker=w["id"]) for w in ws]
        harness.wait_until(lambda: now_ms() > first["last_seen_ms"] + 20, what="time")
        again = self.register_node(status=200, name=name, hostname="new", cpus=4)
        # The record is taken over: new fields, same creation, no workers.
        self.assertEqual((again["hostname"], again["cpus"], again["labels"], again["state"],
                          again["workers"], again["created_ms"]),
                         ("new", 4, {}, "active", 0, first["created_ms"]))
        self.assertGreater(again["last_seen_ms"], first["last_seen_ms"])
        for w in ws:
            self.assertEqual(self.worker_state(w["id"]), "gone")
        for lease in held:
            t = self.get_task(lease["task"])
            # Released, not counted: the agent restarted, the task is not at fault.
            self.assertEqual((t["state"], t["attempts"]), ("queued", 0), t)
        self.ack("complete", [{"task": held[0]["task"], "token": held[0]["token"]}], status=409)
        # A worker of the new agent leases them.
        w = self.worker_on(name)
        self.assertEqual(len(self.lease(worker=w["id"], max=3)), 3)
        self.assertEqual(self.get_node(name)["workers"], 1)

    def test_second_agent_under_a_held_name_refused(self):
        """Two agents (instances) under one node name: the second is refused while the first
        is heard from, and takes nothing over; the same instance, and a registration without
        an instance, re-register as before."""
        self.create_queue(lease_ms=60000)
        name = self.node_name()
        first = self.register_node(name=name, hostname="box-a", instance="aaaa1111")
        w = self.worker_on(name)
        self.put("a")
        held = self.lease_one(worker=w["id"])
        r = self.expect_error("POST", "/v1/nodes",
                              {"name": name, "hostname": "box-b", "instance": "bbbb2222"},
                              409, "invalid_state")
        msg = r.json["error"]["message"]
        for part in ("node '%s' is held by another running agent" % name, "box-a",
                     "--name", "timeout (40000 ms)"):
            self.assertIn(part, msg)
        node = self.get_node(name)
        self.assertEqual((node["hostname"], node["workers"], node["created_ms"]),
                         ("box-a", 1, first["created_ms"]))
        self.assertEqual(self.worker_state(w["id"]), "active")
        self.assertEqual(self.get_task(held["task"])["state"], "leased")
        # The same instance registers again (as after the head forgot the node).
        self.assertEqual(self.register_node(status=200, name=name, hostname="box-a",
                                            instance="aaaa1111")["state"], "active")
        # A registration that names no instance (an older agent) is not refused.
        self.register_node(status=200, name=name, hostname="box-c")
        # An instance that is not a name.
        self.expect_error("POST", "/v1/nodes", {"name": name, "instance": "a b"}, 400,
                          "invalid_argument")
        # A holder that gave no hostname is not called "host ''".
        bare = self.node_name("bare")
        self.register_node(name=bare, instance="cccc3333")
        msg = self.expect_error("POST", "/v1/nodes", {"name": bare, "instance": "dddd4444"},
                                409, "invalid_state").json["error"]["message"]
        self.assertIn("another running agent (which gave no hostname, heard from", msg)

    def test_new_instance_accepted_once_the_old_one_is_silent(self):
        """A restarted agent (a new instance) after a crash: accepted once the old one has
        been silent for the node's timeout; after a goodbye, at once."""
        name = self.node_name()
        self.register_node(name=name, instance="old1", timeout_ms=1500)
        self.expect_error("POST", "/v1/nodes", {"name": name, "instance": "new1"}, 409,
                          "invalid_state")
        harness.wait_until(
            lambda: self.call("POST", "/v1/nodes", {"name": name, "instance": "new1"}).status
            in (200, 201), what="the new instance to be accepted")
        self.expect("DELETE", "/v1/nodes/" + name)
        self.register_node(status=200, name=name, instance="new2")

    def test_heartbeat_of_an_instance_taken_over(self):
        """An agent paused past its timeout, whose name a second agent took over meanwhile,
        resumes: its heartbeat is refused (the node and its workers are the other's now),
        while the holder's and one naming no instance (an older agent) go through."""
        name = self.node_name()
        self.register_node(name=name, instance="paused1", timeout_ms=300)
        harness.wait_until(
            lambda: self.call("POST", "/v1/nodes", {"name": name, "instance": "holder1",
                                                    "timeout_ms": 60000}).status in (200, 201),
            what="the second agent to take the name over")
        r = self.expect_error("POST", "/v1/nodes/%s/heartbeat" % name, {"instance": "paused1"},
                              409, "invalid_state")
        for part in ("registered by another agent", "--name"):
            self.assertIn(part, r.json["error"]["message"])
        self.expect("POST", "/v1/nodes/%s/heartbeat" % name, {"instance": "holder1"})
        self.expect("POST", "/v1/nodes/%s/heartbeat" % name, {})

    def test_leave(self):
        self.create_queue(lease_ms=60000)
        name = self.node_name()
        self.register_node(name=name)
        ws = [self.worker_on(name) for _ in range(2)]
        other = self.worker_on(self.node_name("other"))
        self.put("a", "b", "c", "d")
        self.lease(worker=ws[0]["id"], max=2)
        self.lease(worker=ws[1]["id"], max=1)
        kept = self.lease_one(worker=other["id"])
        r = self.expect("DELETE", "/v1/nodes/" + name)
        self.assertEqual(r, {"name": name, "workers": 2, "released": 3})
        n = self.get_node(name)
        self.assertEqual((n["state"], n["workers"]), ("gone", 0))
        self.assertEqual([self.worker_state(w["id"]) for w in ws], ["gone", "gone"])
        self.assertEqual(self.worker_state(other["id"]), "active")
        self.assert_counts(queued=3, leased=1)
        for t in self.list_tasks(state="queued"):
            self.assertEqual(t["attempts"], 0, t)
        self.assertEqual(self.get_task(kept["task"])["state"], "leased")
        # Gone: heartbeat and leave again are refused; the list still shows it.
        self.expect_error("POST", "/v1/nodes/%s/heartbeat" % name, {}, 404, "node_not_found")
        self.expect_error("DELETE", "/v1/nodes/" + name, None, 404, "node_not_found")
        self.assertIn(name, [x["name"] for x in self.expect("GET", "/v1/nodes")["nodes"]])
        # Registering again brings it back.
        back = self.register_node(status=200, name=name)
        self.assertEqual(back["state"], "active")

    def test_errors(self):
        name = self.node_name()
        for bad in ("", "has space", "slash/x", "x" * 129, "émoji"):
            self.expect_error("POST", "/v1/nodes", {"name": bad}, 400, "name_invalid")
        cases = [
            {}, {"hostname": "h"}, {"name": 5}, {"name": name, "hostname": 5},
            {"name": name, "address": []}, {"name": name, "cpus": -1}, {"name": name, "cpus": "4"},
            {"name": name, "cpus": 1.5}, {"name": name, "gpus": {}}, {"name": name, "gpus": [1]},
            {"name": name, "gpus": [{"name": "x"}]}, {"name": name, "gpus": [{"index": -1}]},
            {"name": name, "gpus": [{"index": 0, "uuid": "x"}]},
            {"name": name, "gpus": [{"index": 0, "memory_free_mb": "1"}]},
            {"name": name, "labels": []}, {"name": name, "timeout_ms": 0},
            {"name": name, "timeout_ms": "1000"}, {"name": name, "node": "x"},
            {"name": name, "hostname": "h" * 257},
        ]
        for body in cases:
            self.expect_error("POST", "/v1/nodes", body, 400, "invalid_argument")
        self.expect_error("GET", "/v1/nodes/" + name, None, 404, "node_not_found")
        self.expect_error("DELETE", "/v1/nodes/" + name, None, 404, "node_not_found")
        self.assertNotIn(name, [n["name"] for n in self.expect("GET", "/v1/nodes")["nodes"]])
        self.register_node(name=name)
        for method, path in (("PUT", "/v1/nodes"), ("DELETE", "/v1/nodes"),
                             ("PUT", "/v1/nodes/" + name), ("POST", "/v1/nodes/" + name),
                             ("GET", "/v1/nodes/%s/heartbeat" % name)):
            self.expect_error(method, path, None, 405, "method_not_allowed")
        self.expect_error("POST", "/v1/nodes", {"name": name}, 401, "unauthorized", token=None)


class NodeTimeoutTest(NodeCase):

    def test_timeout_reschedules(self):
        """A silent node's workers go and their leases lapse (counted); other nodes
        re-lease the tasks."""
        self.create_queue(lease_ms=60000, backoff_ms=0, backoff_max_ms=0)
        dying, alive = self.node_name("dying"), self.node_name("alive")
        self.register_node(name=dying, timeout_ms=300)
        self.register_node(name=alive)
        w1 = self.worker_on(dying, timeout_ms=60000)
        w2 = self.worker_on(alive)
        ids = self.put("a", "b")
        taken = self.lease(worker=w1["id"], max=2)
        self.assertEqual(sorted(x["task"] for x in taken), sorted(ids))
        t0 = time.monotonic()
        harness.wait_until(lambda: self.get_node(dying)["state"] == "gone", timeout=10,
                           what="the node to time out")
        self.assertGreater(time.monotonic() - t0, 0.1)
        self.assertEqual(self.worker_state(w1["id"]), "gone")
        self.assertEqual(self.worker_state(w2["id"]), "active")
        self.assertEqual(self.get_node(alive)["state"], "active")
        for tid in ids:
            t = self.get_task(tid)
            self.assertEqual((t["state"], t["attempts"], t["error"]),
                             ("queued", 1, "node timed out"), t)
        again = self.wait_lease(worker=w2["id"], max=2)
        self.assertEqual(sorted(x["task"] for x in again), sorted(ids))
        self.assertEqual({x["attempt"] for x in again}, {2})
        # The old holder's tokens are stale.
        self.ack("complete", [{"task": taken[0]["task"], "token": taken[0]["token"]}],
                 status=409)
        self.ack("complete", [{"task": x["task"], "token": x["token"]} for x in again])
        self.assert_counts(done=2)
        # The timed-out node registers again and is active.
        self.assertEqual(self.register_node(status=200, name=dying)["state"], "active")

    def test_its_agent_back_after_the_timeout_keeps_its_workers(self):
        """An agent the head timed out (it was paused, or cut off) registers again with
        its own instance.  Its workers registered again meanwhile (the head had forgotten
        them too) and lease: they are that agent's live workers, so they stay, and their
        leases with them.  Ending them, as for a restarted agent, released a lease whose
        command was running, and its task ran twice."""
        self.create_queue(lease_ms=60000, backoff_ms=0, backoff_max_ms=0)
        name = self.node_name()
        self.register_node(name=name, timeout_ms=300, instance="agent-a")
        old = self.worker_on(name)
        [tid] = self.put("a")
        self.assertEqual(self.lease_one(worker=old["id"])["task"], tid)
        harness.wait_until(lambda: self.get_node(name)["state"] == "gone", timeout=10,
                           what="the node to time out")
        self.assertEqual(self.worker_state(old["id"]), "gone")
        # The agent's worker is back before its agent: it registers again and leases.
        new = self.worker_on(name)
        lease = self.wait_lease(worker=new["id"])[0]
        self.assertEqual((lease["task"], lease["attempt"]), (tid, 2))
        again = self.register_node(status=200, name=name, timeout_ms=60000, instance="agent-a")
        self.assertEqual((again["state"], again["workers"]), ("active", 1))
        self.assertEqual(self.worker_state(new["id"]), "active")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["lease"]["worker"]), ("leased", new["id"]), t)
        self.ack("complete", [{"task": tid, "token": lease["token"], "result": "ok"}])
        self.assert_counts(done=1)

    def test_node_killing_task_goes_dead(self):
        """Each node that runs the task dies: the attempts count, the task goes dead."""
        self.create_queue(max_attempts=2, lease_ms=60000, backoff_ms=0, backoff_max_ms=0)
        [tid] = self.put("poison")
        for i in range(2):
            name = self.node_name("n%d" % i)
            self.register_node(name=name, timeout_ms=200)
            w = self.worker_on(name)
            self.assertEqual(self.wait_lease(worker=w["id"])[0]["task"], tid)
            harness.wait_until(lambda: self.get_node(name)["state"] == "gone", timeout=10,
                               what="node %s to time out" % name)
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"]), ("dead", 2), t)


class CrashedWorkerTest(NodeCase):

    def test_crashed_counts_the_attempt(self):
        self.create_queue(lease_ms=60000, backoff_ms=0, backoff_max_ms=0)
        w = self.register(queues=[self.q])
        [tid] = self.put("x")
        lease = self.lease_one(worker=w["id"])
        r = self.expect("DELETE", "/v1/workers/%d?crashed=true" % w["id"])
        self.assertEqual(r, {"id": w["id"], "released": 1})
        self.assertEqual(self.worker_state(w["id"]), "gone")
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"], t["error"]),
                         ("queued", 1, "worker crashed"), t)
        self.ack("complete", [{"task": tid, "token": lease["token"]}], status=409)
        self.expect_error("DELETE", "/v1/workers/%d?crashed=true" % w["id"], None, 404,
                          "worker_not_found")

    def test_crashed_false_is_a_goodbye(self):
        self.create_queue(lease_ms=60000)
        w = self.register(queues=[self.q])
        [tid] = self.put("x")
        self.lease_one(worker=w["id"])
        r = self.expect("DELETE", "/v1/workers/%d?crashed=false" % w["id"])
        self.assertEqual(r, {"id": w["id"], "released": 1})
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"]), ("queued", 0), t)

    def test_crash_loop_goes_dead(self):
        self.create_queue(max_attempts=3, lease_ms=60000, backoff_ms=0, backoff_max_ms=0)
        [tid] = self.put("crashes every worker")
        for attempt in range(1, 4):
            w = self.register(queues=[self.q])
            lease = self.wait_lease(worker=w["id"])[0]
            self.assertEqual((lease["task"], lease["attempt"]), (tid, attempt))
            self.expect("DELETE", "/v1/workers/%d?crashed=true" % w["id"])
        t = self.get_task(tid)
        self.assertEqual((t["state"], t["attempts"], t["error"]), ("dead", 3, "worker crashed"), t)
        w = self.register(queues=[self.q])
        self.assertEqual(self.lease(worker=w["id"]), [])

    def test_crashed_bad_value(self):
        w = self.register()
        for bad in ("yes", "1", "", "TRUE"):
            self.expect_error("DELETE", "/v1/workers/%d?crashed=%s" % (w["id"], bad), None, 400,
                              "invalid_argument")
        self.assertEqual(self.worker_state(w["id"]), "active")


if __name__ == "__main__":
    unittest.main()
