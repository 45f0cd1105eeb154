"""Crash test: clients put tasks in batches (each task with a unique idempotency key)
and complete leased tasks while the head is killed with `kill -9` (or stopped with
SIGTERM) at a random moment.
After each restart on the same data dir:

- every task whose put was acknowledged exists exactly once, with the id it was given;
- no batch is half-applied: all of a batch's tasks are there, or none;
- no task exists that no client put;
- every acknowledged completion is still `done` with its result;
- re-sending a batch (same keys) creates exactly what was missing: nothing when the
  batch was applied, all of it when it was not.

Rounds: MUSTER_CRASH_ROUNDS (default 8); seed: MUSTER_CRASH_SEED (printed).
"""
import collections
import http.client
import json
import os
import random
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

QUEUE = "crash"
PUTTERS = 2


class Ledger:
    """What the clients sent and what the head acknowledged (shared by the threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.attempted = {}     # batch id -> [key, ...] (before the request is sent)
        self.acked = {}         # batch id -> [task id, ...] (after a 201)
        self.completed = {}     # task id -> result (after a 200)
        self.errors = []        # unexpected replies: the test fails on them

    def acked_count(self):
        with self.lock:
            return len(self.acked)


class Client(threading.Thread):
    """Base: one keep-alive connection, no retries; stops at the first network error."""

    def __init__(self, head, ledger, rng):
        super().__init__(daemon=True)
        self.head, self.ledger, self.rng = head, ledger, rng
        self.conn = head.connection(timeout=30)
        self.stopping = threading.Event()

    def post(self, path, body):
        data = json.dumps(body).encode()
        self.conn.request("POST", path, body=data, headers={
            "Authorization": "Bearer " + self.head.token,
            "Content-Type": "application/json"})
        r = self.conn.getresponse()
        raw = r.read()
        reply = json.loads(raw) if raw else None
        if r.status == 503 and (reply or {}).get("error", {}).get("code") == "unavailable":
            # A stopping head refuses new requests before touching anything: for the
            # client it is the head going away, as a cut connection is.
            raise ConnectionError("the head is shutting down")
        return r.status, reply

    def run(self):
        try:
            while not self.stopping.is_set():
                self.step()
        except (OSError, http.client.HTTPException, ValueError):
            pass  # the head was killed (a reply cut short is not an acknowledgement)
        finally:
            self.conn.close()


class Putter(Client):
    def __init__(self, head, ledger, rng, prefix):
        super().__init__(head, ledger, rng)
        self.prefix, self.n = prefix, 0

    def step(self):
        batch = "%s-b%d" % (self.prefix, self.n)
        self.n += 1
        size = self.rng.choice((1, 2, 5, 17, 64, 200))
        keys = ["%s-%d" % (batch, i) for i in range(size)]
        with self.ledger.lock:
            self.ledger.attempted[batch] = keys
        body = {"tasks": [{"payload": {"batch": batch, "i": i}, "key": k,
                           "priority": self.rng.randint(0, 3)} for i, k in enumerate(keys)]}
        status, reply = self.post("/v1/queues/%s/tasks" % QUEUE, body)
        with self.ledger.lock:
            if status != 201:
                self.ledger.errors.append(("put", batch, status, reply))
                self.stopping.set()
                return
            entries = reply["tasks"]
            if len(entries) != size or not all(e["created"] is True for e in entries):
                self.ledger.errors.append(("put reply", batch, reply))
            self.ledger.acked[batch] = [e["id"] for e in entries]


class Completer(Client):
    def step(self):
        status, reply = self.post("/v1/queues/%s/lease" % QUEUE,
                                  {"max": self.rng.randint(1, 30)})
        if status != 200:
            with self.ledger.lock:
                self.ledger.errors.append(("lease", status, reply))
            self.stopping.set()
            return
        leases = reply["leases"]
        if not leases:
            time.sleep(0.005)   # polling interval for an empty queue
            return
        items = [{"task": x["task"], "token": x["token"],
                  "result": {"of": x["payload"]["batch"], "i": x["payload"]["i"]}}
                 for x in leases]
        status, reply = self.post("/v1/leases/complete", {"leases": items})
        with self.ledger.lock:
            if status == 409 and (reply or {}).get("error", {}).get("code") == "lease_lost":
                return  # a lease from before a restart may have expired meanwhile
            if status != 200:
                self.ledger.errors.append(("complete", status, reply))
                self.stopping.set()
                return
            for it in items:
                self.ledger.completed[it["task"]] = it["result"]


class CrashTest(unittest.TestCase):

    def setUp(self):
        seed = int(os.environ.get("MUSTER_CRASH_SEED") or time.time() * 1000) % (2 ** 32)
        print("\ncrash test seed: MUSTER_CRASH_SEED=%d" % seed, file=sys.stderr)
        self.rng = random.Random(seed)
        self.rounds = int(os.environ.get("MUSTER_CRASH_ROUNDS") or 8)
        self.head = harness.Head(["--sweep-ms", "50"])
        self.head.start()
        self.ledger = Ledger()

    def tearDown(self):
        self.head.cleanup()

    def request(self, method, path, body=None):
        r = self.head.request(method, path, body)
        self.assertLess(r.status, 300, "%s %s -> %r" % (method, path, r))
        return r.json

    def all_tasks(self):
        tasks, after = [], 0
        while True:
            page = self.request("GET", "/v1/queues/%s/tasks?limit=1000&after=%d"
                                % (QUEUE, after))
            tasks += page["tasks"]
            if page["next"] is None:
                return tasks
            after = page["next"]

    in_flight = applied = 0

    def test_kill9_under_load(self):
        self.request("PUT", "/v1/queues/" + QUEUE,
                     {"lease_ms": 1500, "backoff_ms": 0, "max_attempts": 1000})
        for rnd in range(self.rounds):
            self.run_round(rnd)
            self.verify(rnd)
            self.resend(rnd)
        led = self.ledger
        print("crash test: %d rounds, %d batches, %d tasks completed; %d batches in flight "
              "at a kill, %d of them applied" % (self.rounds, len(led.attempted),
                                                 len(led.completed), self.in_flight,
                                                 self.applied), file=sys.stderr)

    def test_sigterm_under_load(self):
        # A clean stop in the middle of the load: the group the head was gathering while
        # a flush ran is committed, flushed and answered; nothing acknowledged is lost.
        self.request("PUT", "/v1/queues/" + QUEUE,
                     {"lease_ms": 1500, "backoff_ms": 0, "max_attempts": 1000})
        for rnd in range(max(2, self.rounds // 3)):
            self.run_round(rnd, end=lambda: self.assertEqual(self.head.stop(), 0,
                                                             self.head.log()))
            self.verify(rnd)
            self.resend(rnd)

    def run_round(self, rnd, end=None):
        led = self.ledger
        start = led.acked_count()
        clients = [Putter(self.head, led, random.Random(self.rng.random()), "r%d-p%d" % (rnd, i))
                   for i in range(PUTTERS)]
        clients.append(Completer(self.head, led, random.Random(self.rng.random())))
        for c in clients:
            c.start()
        # A random moment: after a random number of acknowledged batches, plus a random
        # fraction of a request's time, so that the kill lands anywhere in a commit.
        target = start + self.rng.randint(3, 60)
        harness.wait_until(lambda: led.acked_count() >= target or led.errors, timeout=60,
                           interval=0.002, what="%d acknowledged batches" % (target - start))
        time.sleep(self.rng.uniform(0, 0.02))   # the random kill moment, not a synchronisation
        (end or self.head.kill)()
        for c in clients:
            c.stopping.set()
            c.join(30)
            self.assertFalse(c.is_alive(), "a client thread hung after the kill")
        self.assertEqual(led.errors, [], "unexpected replies before the kill")
        self.head.start()

    def verify(self, rnd):
        led = self.ledger
        tasks = self.all_tasks()
        by_key = {}
        dup = collections.Counter(t["key"] for t in tasks)
        self.assertEqual([k for k, n in dup.items() if n > 1], [],
                         "round %d: keys stored more than once" % rnd)
        self.assertEqual(len({t["id"] for t in tasks}), len(tasks))
        for t in tasks:
            by_key[t["key"]] = t
        known = set()
        for batch, keys in led.attempted.items():
            known.update(keys)
            present = [k in by_key for k in keys]
            self.assertTrue(all(present) or not any(present),
                            "round %d: batch %s half-applied: %d of %d tasks"
                            % (rnd, batch, sum(present), len(keys)))
            if batch in led.acked:
                self.assertTrue(all(present), "round %d: acknowledged batch %s lost"
                                % (rnd, batch))
                self.assertEqual([by_key[k]["id"] for k in keys], led.acked[batch],
                                 "round %d: ids of batch %s changed" % (rnd, batch))
                for i, k in enumerate(keys):
                    self.assertEqual(by_key[k]["payload"], {"batch": batch, "i": i})
        phantoms = [t["key"] for t in tasks if t["key"] not in known]
        self.assertEqual(phantoms, [], "round %d: tasks nobody put" % rnd)
        by_id = {t["id"]: t for t in tasks}
        for tid, result in led.completed.items():
            self.assertIn(tid, by_id, "round %d: completed task %d lost" % (rnd, tid))
            self.assertEqual((by_id[tid]["state"], by_id[tid]["result"]), ("done", result),
                             "round %d: acknowledged completion of %d lost" % (rnd, tid))
        counts = self.request("GET", "/v1/queues/" + QUEUE)["counts"]
        self.assertEqual(sum(counts.values()), len(tasks), counts)

    def resend(self, rnd):
        """Re-sends unacknowledged batches (as a client retrying would) and one acknowledged
        batch: the keys make the retry create exactly what is missing."""
        led = self.ledger
        tasks = {t["key"]: t for t in self.all_tasks()}
        unacked = [b for b in led.attempted if b not in led.acked]
        acked = list(led.acked)
        for batch in unacked + acked[-1:]:
            keys = led.attempted[batch]
            was_there = keys[0] in tasks
            if batch in unacked:
                self.in_flight += 1
                self.applied += was_there
            body = {"tasks": [{"payload": {"batch": batch, "i": i}, "key": k}
                              for i, k in enumerate(keys)]}
            r = self.request("POST", "/v1/queues/%s/tasks" % QUEUE, body)
            created = [e["created"] for e in r["tasks"]]
            self.assertEqual(created, [not was_there] * len(keys),
                             "round %d: re-sent batch %s" % (rnd, batch))
            ids = [e["id"] for e in r["tasks"]]
            if was_there:
                self.assertEqual(ids, [tasks[k]["id"] for k in keys])
            led.acked[batch] = ids


if __name__ == "__main__":
    unittest.main()
