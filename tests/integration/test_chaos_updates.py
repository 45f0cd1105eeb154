"""A session's broadcast updates and shared-data levels outlive kill -9 of the head.

A session's client raises its shared blob's level and tells the workers, over and over:
PUT /v1/shared/SESSION/params?level=K, then an update {"level": K} of the session
(docs/pools.md "update_workers", docs/shared-data.md "Versioning", docs/api.md
"Updates").  Three `muster worker` processes, idle, receive each update through their
long-poll leases and write it to their MUSTER_UPDATES_FILE.  The head is killed with
-9 while the client posts and the workers are being sent updates: the last worker talks
to the head through a proxy that holds the head's reply bringing a chosen update, so
that the kill comes after the head sent it and before the worker has it (the proxy
delivers it once the head is gone).  The head starts again on its data; three times,
the client going on from the head's newest level.  Checks, after each restart:
- every update and level the client was told were stored are there after the restart;
- no worker saw an update the restarted head does not have (same number, same data),
  and no update announces a level the head does not have;
- the newest level's bytes and checksum are the ones uploaded; that level again is
  refused (the client goes on with the newest + 1);
and at the end:
- the next update is numbered past every one a worker saw, and every worker ends on it;
- each worker's updates are 1, 2, 3, ... in order, none skipped or repeated, across the
  restarts, and the levels they announce never fall back;
- tasks submitted then run with that update applied and read that level's bytes.
"""
import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN
WORKERS = 3
KILLS = 3
OCTET = "application/octet-stream"
# What a task prints: the last update applied before it started and the level's bytes.
TASK = 'printf "%s %s" "$MUSTER_UPDATE_SEQ" "$(cat "$MUSTER_SHARED_PARAMS")"'


def params(level):
    """The bytes of level `level` of the session's blob."""
    return b"params of level %d" % level


class Client(threading.Thread):
    """The session's client: raises the level (from `level`, the blob's newest + 1) and
    posts an update announcing it, level after level, on a connection of its own, until
    a request fails (the head is gone).  `stored` holds the levels known stored (the one
    before `level`, then each upload acknowledged), `posted` (seq, level) of each
    update acknowledged."""

    def __init__(self, head, session, level):
        super().__init__(daemon=True)
        self.head, self.session, self.level = head, session, level
        self.stored, self.posted, self.error = [level - 1], [], None

    def run(self):
        conn = self.head.connection(timeout=30)
        level = self.level
        try:
            while True:
                r = self.head.request("PUT", "/v1/shared/%s/params?level=%d" % (self.session, level),
                                      raw=params(level), content_type=OCTET, conn=conn)
                assert r.status == 201, r
                self.stored.append(level)
                r = self.head.request("POST", "/v1/queues/pool/updates",
                                      {"data": {"level": level}, "session": self.session},
                                      conn=conn)
                assert r.status == 201, r
                self.posted.append((r.json["seq"], level))
                level += 1
        except (OSError, http.client.HTTPException) as e:
            self.error = e  # the kill: what was in flight may or may not be stored
        finally:
            conn.close()


class HeldDelivery:
    """The last worker's link to the head (a harness.RequestProxy decision for its lease
    requests): the first lease reply that brings update `seq` or a later one (once
    `arm(seq)` was called) is held, its status and length sent, its body not, until
    `release` is set; `held` is set when it holds one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.threshold = None
        self.held, self.release = threading.Event(), threading.Event()

    def arm(self, seq):
        with self.lock:
            self.threshold = seq
        self.held.clear()
        self.release.clear()

    def __call__(self, n):
        return self.body

    def body(self, pieces):
        data = b"".join(pieces)
        seqs = [u["seq"] for u in json.loads(data).get("updates", [])]
        with self.lock:
            hold = self.threshold is not None and any(seq >= self.threshold for seq in seqs)
            if hold:
                self.threshold = None
        if hold:
            self.held.set()
            self.release.wait(60)
        yield data


class ChaosUpdatesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-chaos-updates-")
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()]).start()
        self.workers = []
        self.delivery = HeldDelivery()
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/queues/pool/lease",
            self.delivery)
        # While the head is down the proxy cannot forward: the worker is then cut off
        # as from the head itself, and the handler's traceback is no news.
        self.proxy.server.handle_error = lambda request, address: None

    def tearDown(self):
        self.delivery.release.set()
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.proxy.close()
        self.head.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_worker(self, n):
        """`muster worker` n with a TMPDIR of its own (where its updates file is); the
        last one talks to the head through the proxy."""
        tmpdir = os.path.join(self.tmp, "w%d" % n)
        os.makedirs(tmpdir)
        env = dict(harness.cli_env(self.head), TMPDIR=tmpdir)
        if n == WORKERS - 1:
            env["MUSTER_URL"] = self.proxy.url
        with open(os.path.join(self.tmp, "w%d.log" % n), "wb") as log:
            self.workers.append(subprocess.Popen(
                [MUSTER, "worker", "--queue", "pool", "--", "sh", "-c", TASK], env=env,
                stdout=subprocess.DEVNULL, stderr=log))

    def updates_of(self, n):
        """The updates worker n applied so far: [(seq, data)] in its file's order."""
        (path,) = glob.glob(os.path.join(self.tmp, "w%d" % n, "muster-updates-*"))
        with open(path) as f:
            lines = [json.loads(line) for line in f.read().splitlines()]
        return [(u["seq"], u["data"]) for u in lines]

    def worker_logs(self):
        text = ""
        for n in range(WORKERS):
            with open(os.path.join(self.tmp, "w%d.log" % n), errors="replace") as f:
                text += "---- worker %d ----\n%s" % (n, f.read()[-2000:])
        return text

    def head_updates(self):
        """The head's updates of the queue: {seq: data}."""
        updates, after = {}, 0
        while True:
            r = self.head.request("GET", "/v1/queues/pool/updates?max=1000&after=%d" % after)
            self.assertEqual(r.status, 200, r)
            if not r.json["updates"]:
                return updates
            updates.update((u["seq"], u["data"]) for u in r.json["updates"])
            after = r.json["updates"][-1]["seq"]

    def lease_waiters(self):
        """The long-poll leases the head holds (muster_lease_waiters)."""
        text = self.head.request("GET", "/metrics").raw.decode()
        match = re.search(r"^muster_lease_waiters (\d+)$", text, re.M)
        return int(match.group(1)) if match else None

    def kill_while_posting(self, session, level, posts):
        """Runs the client from `level` on and kills the head when it has sent the
        last worker the `posts`-th update from now (which the proxy holds), releases
        that reply once the head is gone, starts the head again and checks what it
        kept; returns the blob's newest level."""
        h = self.head
        # Every worker waits in a long-poll lease (after a restart they come back
        # within a second): each post is then sent to all of them at once.
        harness.wait_until(lambda: self.lease_waiters() == WORKERS, timeout=30,
                           what=lambda: "every worker to wait for work:\n" + self.worker_logs())
        target = max(self.head_updates() or [0]) + posts
        self.delivery.arm(target)
        client = Client(h, session, level)
        client.start()
        self.assertTrue(self.delivery.held.wait(30), "update %d was not sent to the last "
                        "worker:\n%s" % (target, self.worker_logs()))
        h.kill()
        self.delivery.release.set()  # the worker gets the update from a head now dead
        client.join(30)
        self.assertIsNotNone(client.error, "the client did not notice the kill")
        last = WORKERS - 1
        harness.wait_until(lambda: self.updates_of(last) and self.updates_of(last)[-1][0] >= target,
                           timeout=30, what="the held update to reach the last worker:\n"
                           + self.worker_logs())
        seen = {n: self.updates_of(n) for n in range(WORKERS)}
        h.start()

        # Everything acknowledged is there; nothing a worker saw is unknown to the head.
        stored = self.head_updates()
        for seq, posted in client.posted:
            self.assertEqual(stored.get(seq), {"level": posted}, "acknowledged update %d" % seq)
        self.assertEqual(sorted(stored), list(range(1, len(stored) + 1)), "holes in the numbers")
        for n, updates in seen.items():
            for seq, data in updates:
                self.assertEqual(stored.get(seq), data,
                                 "worker %d saw update %d, which the head does not have" % (n, seq))
        blob = h.request("GET", "/v1/shared/%s" % session).json["blobs"][0]
        newest = blob["level"]
        self.assertGreaterEqual(newest, client.stored[-1], "an acknowledged level was lost")
        self.assertLessEqual(max(d["level"] for d in stored.values()), newest,
                             "an update announces a level the head does not have")
        r = h.request("GET", "/v1/shared/%s/params" % session)
        self.assertEqual((r.status, r.raw), (200, params(newest)), r)
        self.assertEqual(r.headers["ETag"], '"%s"' % blob["checksum"])
        r = h.request("PUT", "/v1/shared/%s/params?level=%d" % (session, newest),
                      raw=b"again", content_type=OCTET)
        self.assertEqual(r.error_code, "version_mismatch", r)
        return newest

    def test_kill_9_while_workers_are_sent_updates(self):
        h = self.head
        self.assertEqual(h.request("PUT", "/v1/queues/pool", {}).status, 201)
        r = h.request("POST", "/v1/sessions", {"queue": "pool", "timeout_ms": 120000})
        self.assertEqual(r.status, 201, r)
        session = r.json["id"]
        r = h.request("PUT", "/v1/shared/%s/params" % session, raw=params(1), content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        for n in range(WORKERS):
            self.start_worker(n)
        harness.wait_until(lambda: len(h.request("GET", "/v1/workers").json["workers"]) == WORKERS,
                           timeout=20, what="the workers to register")
        level = 2
        for kill in range(KILLS):
            level = self.kill_while_posting(session, level, posts=4 + 3 * kill) + 1

        # Levels stay monotonic: the next one is the newest + 1; its update is numbered
        # past every one a worker saw.
        final = level
        r = h.request("PUT", "/v1/shared/%s/params?level=%d" % (session, final), raw=params(final),
                      content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        stored = self.head_updates()
        r = h.request("POST", "/v1/queues/pool/updates",
                      {"data": {"level": final}, "session": session})
        self.assertEqual(r.status, 201, r)
        last = r.json["seq"]
        self.assertEqual(last, max(stored) + 1)

        # Every worker ends on the newest update, having seen each number once, in order.
        expected = sorted(stored.items()) + [(last, {"level": final})]
        for n in range(WORKERS):
            harness.wait_until(lambda: self.updates_of(n)[-1][0] == last, timeout=30,
                               what=lambda: "worker %d to get update %d:\n%s" % (
                                   n, last, self.worker_logs()))
            got = self.updates_of(n)
            self.assertEqual(got, expected, "worker %d's updates" % n)
            levels = [data["level"] for _, data in got]
            self.assertEqual(levels, sorted(set(levels)), "worker %d's levels fell back" % n)

        # Tasks submitted now run with that update applied and read that level.
        requires = [{"scope": session, "name": "params", "level": final}]
        r = h.request("POST", "/v1/sessions/%s/tasks" % session,
                      {"tasks": [{"payload": i, "requires": requires} for i in range(6)]})
        self.assertEqual(r.status, 201, r)

        def results():
            r = h.request("GET", "/v1/sessions/%s/results?max=100" % session)
            return r.json["done"] == 6 and r.json["results"]
        got = harness.wait_until(results, timeout=30,
                                 what=lambda: "the tasks' results:\n" + self.worker_logs())
        for res in got:
            self.assertEqual((res["state"], res["result"]),
                             ("done", "%d %s" % (last, params(final).decode())), res)
        for proc in self.workers:
            proc.terminate()
        for proc in self.workers:
            self.assertEqual(proc.wait(30), 0, self.worker_logs())
        self.assertNotIn("Sanitizer", self.worker_logs())
        self.assertEqual(h.stop(), 0, h.log())
        self.assertNotIn("Sanitizer", h.log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
