"""`muster worker` sends its lease request again, under the same key, when the reply was
lost after the head committed it (docs/api.md, "Retrying a lease"): it gets the task that
reply carried, with its token, and runs it at once.  Before, that task stayed leased to a
worker that did not know of it until its lease ran out (a stall of the lease time, 60 s by
default, after every restart of the head or broken connection).  The queue's lease here is
ten minutes: a task stranded so would still be leased when the test gives up.

A proxy in front of the head forwards the worker's first lease request (plain, or the
combined complete-and-lease call), reads the head's reply (committed) and closes the
connection before any of its body reaches the worker.  With --concurrency 2 the other
slot leases, under the same worker id, before the first slot sends its request again:
the head keeps a record per slot's stream of keys, so that retry is answered too."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

LONG_LEASE_MS = 600000


class WorkerLeaseRetryTest(unittest.TestCase):

    def setUp(self):
        self.head = harness.Head().start()
        self.addCleanup(self.head.cleanup)
        self.lost = []   # the replies the proxy kept from the worker

    def request(self, method, path, body=None):
        r = self.head.request(method, path, body)
        self.assertLess(r.status, 300, r)
        return r.json

    def swallow(self, pieces):
        """The proxy's stand-in for a reply: the head's body read whole, none of it sent."""
        self.lost.append(json.loads(b"".join(pieces)))
        return
        yield   # a generator that yields nothing: the connection closes short

    def lose_first(self, method_path):
        proxy = harness.RequestProxy(
            self.head, lambda method, path: (method, path) == method_path,
            lambda n: self.swallow if n == 1 else "forward")
        self.addCleanup(proxy.close)
        return proxy

    def run_worker(self, proxy, queue, count, *options):
        """Runs `muster worker` (cat) with `options` through `proxy` until the queue's
        `count` tasks are done; returns the tasks and the worker's log."""
        with tempfile.TemporaryFile("w+") as log:
            proc = subprocess.Popen(
                [harness.MUSTER_BIN, "worker", "--queue", queue, "--url", proxy.url,
                 "--token", self.head.token, *options, "--", "cat"],
                stdout=subprocess.DEVNULL, stderr=log)
            try:
                def tasks():
                    got = self.request("GET", "/v1/queues/%s/tasks?limit=100" % queue)["tasks"]
                    return got if [t["state"] for t in got] == ["done"] * count else None

                def stuck():
                    log.seek(0)
                    return "all tasks done; tasks %s\nworker:\n%s\nhead:\n%s" % (
                        self.request("GET", "/v1/queues/%s/tasks?limit=100" % queue)["tasks"],
                        log.read(), self.head.log())
                done = harness.wait_until(tasks, timeout=30, what=stuck)
            finally:
                proc.terminate()
                proc.wait(30)
            log.seek(0)
            return done, log.read()

    def setup_queue(self, queue, count):
        r = self.head.request("PUT", "/v1/queues/" + queue, {"lease_ms": LONG_LEASE_MS})
        self.assertEqual(r.status, 201, r)
        self.request("POST", "/v1/queues/%s/tasks" % queue,
                     {"tasks": [{"payload": "t%d" % i} for i in range(count)]})

    def check(self, tasks, lost):
        """Every task ran once and is done with its own input; the lost lease is among
        them, done under its first attempt."""
        self.assertEqual([(t["result"], t["attempts"]) for t in tasks],
                         [("t%d" % i, 1) for i in range(len(tasks))])
        self.assertIn(lost["task"], [t["id"] for t in tasks])

    def test_a_lease_whose_reply_was_lost(self):
        self.setup_queue("lq", 3)
        proxy = self.lose_first(("POST", "/v1/queues/lq/lease"))
        tasks, log = self.run_worker(proxy, "lq", 3)
        [reply] = self.lost
        [lost] = reply["leases"]
        self.check(tasks, lost)
        self.assertIn("slot 1: lease from lq", log)   # it did see the error, and retried

    def test_a_complete_and_lease_whose_reply_was_lost(self):
        self.setup_queue("cq", 3)
        proxy = self.lose_first(("POST", "/v1/leases/complete"))
        tasks, log = self.run_worker(proxy, "cq", 3)
        [reply] = self.lost
        self.assertEqual(len(reply["completed"]), 1, reply)
        [lost] = reply["leases"]
        self.check(tasks, lost)

    def test_a_slots_lease_lost_while_another_slot_leases(self):
        """The lost reply is held back (the connection open, its slot waiting) until the
        other slot has done two tasks: it held at most one when the lost lease committed,
        so it leased the second after it, with a key of its own, under the same worker
        id.  With one record per worker that lease replaced the first slot's, whose retry
        then leased anew and left the lost task leased to nobody for ten minutes."""
        self.setup_queue("sq", 6)

        def others_done(lost):
            got = self.request("GET", "/v1/queues/sq/tasks?limit=100")["tasks"]
            return len([t for t in got if t["state"] == "done" and t["id"] != lost]) >= 2

        def swallow_until_the_other_slot_leased(pieces):
            reply = json.loads(b"".join(pieces))
            self.lost.append(reply)
            [lost] = reply["leases"]
            harness.wait_until(lambda: others_done(lost["task"]), timeout=20,
                               what="the other slot to do two tasks")
            return
            yield   # a generator that yields nothing: the connection closes short

        proxy = harness.RequestProxy(
            self.head, lambda method, path: (method, path) == ("POST", "/v1/queues/sq/lease"),
            lambda n: swallow_until_the_other_slot_leased if n == 1 else "forward")
        self.addCleanup(proxy.close)
        tasks, log = self.run_worker(proxy, "sq", 6, "--concurrency", "2")
        [reply] = self.lost
        [lost] = reply["leases"]
        self.check(tasks, lost)
        self.assertRegex(log, r"slot [12]: lease from sq")   # it saw the error, and retried
        self.assertEqual(len(self.request("GET", "/v1/workers")["workers"]), 1, "one worker id")


if __name__ == "__main__":
    unittest.main()
