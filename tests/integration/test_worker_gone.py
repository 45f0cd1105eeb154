"""Why and when a worker went (docs/api.md, "GET /v1/workers": `gone_reason`,
`gone_at_ms`).  The list said only `gone`, and an operator could not tell a worker that
said goodbye from one that went silent, crashed, or went with its node.  Every way the
head ends a worker names its reason, with the time it went; both survive a restart of
the head; `muster workers --all` says them.  (A data dir from before the columns,
upgraded: tests/unit/test_worker_gone.c.)
"""
import os
import re
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

PIPELINE = "gonedc"
# What `muster workers --all` says in STATE for each reason.
CLI_WORDS = {"bye": "said bye", "timeout": "timed out", "crashed": "crashed",
             "node_left": "node left", "node_timeout": "node timed out",
             "node_restarted": "node restarted"}


# What a call of a gone worker is told, by its gone_reason (api.md, heartbeat).
GONE_SAID = {
    "bye": "a goodbye was sent for it",
    "timeout": "it timed out: no sign of life reached the head for its timeout",
    "crashed": "its node agent reported that its process died",
    "node_left": "its node left",
    "node_timeout": "its node timed out",
    "node_restarted": "its node was registered again by another agent process",
}


def now_ms():
    return int(time.time() * 1000)


class WorkerGoneTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head(["--sweep-ms", "50",
                                  "--distcompute", PIPELINE + "=gone_dc"]).start()
        self.addCleanup(self.head.cleanup)

    def api(self, method, path, body=None, status=200):
        r = self.head.request(method, path, body)
        self.assertEqual(r.status, status, r)
        return r.json

    def register(self, **body):
        return self.api("POST", "/v1/workers", body, status=201)["id"]

    def worker(self, wid):
        return self.api("GET", "/v1/workers/%d" % wid)

    def gone(self, wid):
        return self.worker(wid)["state"] == "gone"

    def ended_at_once(self, ended, way, reason, wid, method, path, body=None):
        """Ends worker `wid` with one request; ended[way] = (id, reason, bounds of its time)."""
        before = now_ms()
        r = self.head.request(method, path, body)
        self.assertEqual(r.status, 200, r)
        ended[way] = (wid, reason, before, now_ms())

    def distcompute_worker(self):
        """A DistCompute client's worker: its id and its tracker token."""
        r = self.head.request("GET", "/compat/distcompute/%s/api/new?nickname=dc&stage=a"
                              % PIPELINE, token=None)
        self.assertEqual(r.status, 200, r)
        [wid] = [w["id"] for w in self.api("GET", "/v1/workers")["workers"]
                 if (w["labels"] or {}).get("distcompute") == PIPELINE]
        return wid, r.json["token"]

    def end_every_way(self):
        """Ends one worker in each way the head has; returns {way: (id, reason, earliest,
        latest)}: the reason it must give and the bounds of its gone_at_ms."""
        ended = {}
        # Those that go on their own first, so that their timeouts run meanwhile.
        silent = self.register(nickname="silent", timeout_ms=200)
        self.api("POST", "/v1/nodes", {"name": "silent-node", "timeout_ms": 300}, status=201)
        on_silent = self.register(nickname="on-silent-node", node="silent-node")
        for way, reason in (("bye", "bye"), ("crashed", "crashed")):
            wid = self.register(nickname=way)
            self.ended_at_once(ended, way, reason, wid, "DELETE", "/v1/workers/%d%s"
                               % (wid, "?crashed=true" if way == "crashed" else ""))
        for way, reason, query in (("bye_instance", "bye", ""),
                                   ("crashed_instance", "crashed", "?crashed=true")):
            wid = self.register(nickname=way, instance=way + "-1")
            self.ended_at_once(ended, way, reason, wid, "DELETE",
                               "/v1/workers/instance/%s-1%s" % (way, query))
        wid, token = self.distcompute_worker()
        self.ended_at_once(ended, "bye_distcompute", "bye", wid, "POST",
                           "/compat/distcompute/%s/api/bye" % PIPELINE, {"token": token})
        self.api("POST", "/v1/nodes", {"name": "leaving-node"}, status=201)
        wid = self.register(nickname="on-leaving-node", node="leaving-node")
        self.ended_at_once(ended, "node_left", "node_left", wid, "DELETE", "/v1/nodes/leaving-node")
        self.api("POST", "/v1/nodes", {"name": "restarting-node"}, status=201)
        wid = self.register(nickname="on-restarting-node", node="restarting-node")
        # Registered again without the instance that would say it is the same agent.
        self.ended_at_once(ended, "node_restarted", "node_restarted", wid, "POST", "/v1/nodes",
                           {"name": "restarting-node"})
        harness.wait_until(lambda: self.gone(silent) and self.gone(on_silent),
                           what="the silent worker and the silent node's worker to go")
        w = self.worker(silent)
        ended["timeout"] = (silent, "timeout", w["last_seen_ms"] + w["timeout_ms"], now_ms())
        node = self.api("GET", "/v1/nodes/silent-node")
        ended["node_timeout"] = (on_silent, "node_timeout", node["last_seen_ms"] + 300, now_ms())
        return ended

    def check(self, ended):
        for way, (wid, reason, earliest, latest) in sorted(ended.items()):
            with self.subTest(way=way):
                w = self.worker(wid)
                self.assertEqual((w["state"], w["gone_reason"]), ("gone", reason), w)
                self.assertTrue(earliest <= w["gone_at_ms"] <= latest,
                                (earliest, w["gone_at_ms"], latest))
                # A call the worker makes after says why, in the words clients look for.
                r = self.head.request("POST", "/v1/workers/%d/heartbeat" % wid, {})
                self.assertEqual((r.status, r.error_code), (404, "worker_not_found"), r)
                self.assertEqual(r.json["error"]["message"], "worker %d is gone (%s); register "
                                 "again" % (wid, GONE_SAID[reason]))

    def test_active_worker_has_no_reason(self):
        w = self.worker(self.register(nickname="busy"))
        self.assertEqual((w["state"], w["gone_reason"], w["gone_at_ms"]), ("active", None, None))

    def test_every_way_a_worker_ends_survives_a_restart(self):
        ended = self.end_every_way()
        self.check(ended)
        before = {w["id"]: w for w in self.api("GET", "/v1/workers")["workers"]}
        self.assertEqual(self.head.stop(), 0)
        self.head.start()
        after = {w["id"]: w for w in self.api("GET", "/v1/workers")["workers"]}
        for wid, _, _, _ in ended.values():
            self.assertEqual((after[wid]["gone_reason"], after[wid]["gone_at_ms"]),
                             (before[wid]["gone_reason"], before[wid]["gone_at_ms"]))
        self.check(ended)

    def test_cli_says_why(self):
        ended = self.end_every_way()
        live = self.register(nickname="live")
        names = {wid: self.worker(wid)["name"] for wid in [live] + [e[0] for e in ended.values()]}

        def table(*args):
            r = subprocess.run([harness.MUSTER_BIN, "workers"] + list(args), capture_output=True,
                               text=True, env=harness.cli_env(self.head), timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            return {line.split()[1]: line for line in r.stdout.splitlines()[1:]}

        rows = table("--all")
        self.assertRegex(rows[names[live]], r" active ")
        for way, (wid, reason, _, _) in ended.items():
            with self.subTest(way=way):
                self.assertRegex(rows[names[wid]], r" gone: %s \d+s ago " % re.escape(CLI_WORDS[reason]))
        self.assertEqual(set(table()), {names[live]})


if __name__ == "__main__":
    unittest.main()
