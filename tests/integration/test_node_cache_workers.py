"""Workers and shared data (docs/shared-data.md "Workers"): tasks that require levels get
them as local files through their node's cache before they run.  A session run where
the first batch requires level 1, the client updates to level 2 between two batches, and
every task ran with the level it required (command workers: MUSTER_SHARED_<NAME> and
MUSTER_REQUIRES); the cache fetched each level once for all workers; plugins (ABI 2) get
the paths in their task and keep what they loaded until the level changes; a worker
without a node cache downloads from the head and removes its files when it exits."""
import json
import os
import shutil
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import node_harness  # noqa: E402
from node_harness import Agent, AgentsCase  # noqa: E402

OCTET = "application/octet-stream"
PLUGIN = os.path.join(node_harness.build_dir(), "libplugin_shared.so")
# Prints the content of the required "params" level, then MUSTER_REQUIRES.
COMMAND = ["sh", "-c", 'printf "%s|%s" "$(cat "$MUSTER_SHARED_PARAMS")" "$MUSTER_REQUIRES"']


class SharedWorkersTest(AgentsCase):
    dir_prefix = "muster-cache-workers-"

    def setUp(self):
        super().setUp()
        r = self.head.request("PUT", "/v1/queues/sq", {"backoff_ms": 0})
        self.assertEqual(r.status, 201, r)

    def agent(self, name, args, cmd=None):
        """An agent of queue sq, unless `args` name another (an option given twice with
        two values is refused)."""
        queue = [] if "--queue" in args else ["--queue", "sq"]
        a = Agent(self.head, self.dir, name, cmd=cmd,
                  args=queue + ["--cache-dir", os.path.join(self.dir, "cache-" + name)] + args)
        self.agents.append(a)
        return a.start()

    def put(self, scope, name, data, level):
        r = self.head.request("PUT", "/v1/shared/%s/%s?level=%d" % (scope, name, level),
                              raw=data, content_type=OCTET)
        self.assertEqual(r.status, 201, r)

    def results(self, sid, count, agent):
        def read():
            r = self.head.request("GET", "/v1/sessions/%s/results?max=1000" % sid)
            self.assertEqual(r.status, 200, r)
            return r.json["results"] if len(r.json["results"]) >= count else None
        return harness.wait_until(read, timeout=60, what=lambda: "%d results:\n%s" % (count, agent.log()))

    def submit(self, sid, level, count):
        req = [{"scope": sid, "name": "params", "level": level}]
        r = self.head.request("POST", "/v1/sessions/%s/tasks" % sid,
                              {"tasks": [{"payload": level, "requires": req}
                                         for _ in range(count)]})
        self.assertEqual(r.status, 201, r)
        return [t["index"] for t in r.json["tasks"]]

    def test_session_levels_with_command_workers(self):
        a = self.agent("cmd", ["--workers", "2"], cmd=COMMAND)
        r = self.head.request("POST", "/v1/sessions", {"queue": "sq"})
        self.assertEqual(r.status, 201, r)
        sid = r.json["id"]
        data = {level: "params-level-%d-%s" % (level, os.urandom(8).hex()) for level in (1, 2)}
        self.put(sid, "params", data[1].encode(), 1)
        first = self.submit(sid, 1, 10)
        self.results(sid, 3, a)  # level 1 is in use when level 2 comes
        self.put(sid, "params", data[2].encode(), 2)
        second = self.submit(sid, 2, 10)
        results = {x["index"]: x for x in self.results(sid, 20, a)}
        self.assertEqual(sorted(results), sorted(first + second))
        paths, ran = set(), {1: set(), 2: set()}
        for index, x in results.items():
            level = 1 if index in first else 2
            self.assertEqual(x["state"], "done", x)
            text, requires = x["result"].split("|", 1)
            self.assertEqual(text, data[level], x)
            requires = json.loads(requires)
            self.assertEqual(len(requires), 1)
            self.assertEqual((requires[0]["scope"], requires[0]["name"], requires[0]["level"],
                              requires[0]["size"]), (sid, "params", level, len(data[level])))
            paths.add(requires[0]["path"])
            ran[level].add(os.path.basename(os.path.dirname(requires[0]["path"])))
        s = a.request("GET", "/v1/node/cache").json
        self.assertEqual(s["upstream_fetches"], 2, s)  # each level once, for both workers
        # Each worker linked each level it used once and kept it between tasks:
        # at most 2 workers x 2 levels distinct paths for 20 tasks.
        self.assertLessEqual(len(paths), 4, paths)
        # Level 1 went from the directory of each worker that ran a task of level 2: a
        # level goes when a task requires a newer one, so a worker that ran none of them
        # (the other took all ten: a busy machine) keeps level 1, and is not looked at.
        links = os.path.join(self.dir, "cache-cmd", "@links")
        self.assertTrue(ran[2], results)
        for d in ran[2]:
            held = os.listdir(os.path.join(links, d))
            self.assertTrue(held and all(f.endswith("@params@2") for f in held), (d, held))
        # A worker killed outright cannot clean up: the agent removes its links.
        victim = next(p for p in a.workers() if any(d.startswith("%d-" % p)
                                                    for d in os.listdir(links)))
        os.kill(victim, signal.SIGKILL)
        harness.wait_until(
            lambda: not any(d.startswith("%d-" % victim) for d in os.listdir(links)),
            what="the killed worker's links removed")
        self.assertEqual(a.stop(), 0)
        self.assertEqual(os.listdir(links), [])  # the workers removed their directories

    def test_a_removed_cache_dir_is_fetched_again(self):
        # After the node's cache dir was removed while the agent ran (rm -rf), a worker
        # went on giving its tasks the path of a level's file that was gone, and could
        # link no new level: its own directory inside the cache had gone too.
        a = self.agent("removed", ["--workers", "1"], cmd=COMMAND)
        r = self.head.request("POST", "/v1/sessions", {"queue": "sq"})
        self.assertEqual(r.status, 201, r)
        sid = r.json["id"]
        data = {level: "params-%d-%s" % (level, os.urandom(8).hex()) for level in (1, 2)}
        self.put(sid, "params", data[1].encode(), 1)
        self.submit(sid, 1, 1)
        self.results(sid, 1, a)
        shutil.rmtree(os.path.join(self.dir, "cache-removed"))
        self.submit(sid, 1, 1)  # the level the worker holds: fetched again
        self.put(sid, "params", data[2].encode(), 2)
        self.submit(sid, 2, 1)  # a new level: linked into a directory made again
        results = sorted(self.results(sid, 3, a), key=lambda x: x["index"])
        self.assertEqual([(x["state"], (x["result"] or "").split("|")[0]) for x in results],
                         [("done", data[1]), ("done", data[1]), ("done", data[2])], a.log())
        s = a.request("GET", "/v1/node/cache").json
        self.assertEqual((s["upstream_fetches"], s["entries"]), (3, 2), s)

    def test_an_expired_level_leaves_the_workers_too(self):
        # The agent removes a level's cached file once the head says it expired, but a
        # worker that had linked the level kept it (and its disk) until it exited.
        a = self.agent("expiring", ["--workers", "1"], cmd=COMMAND)
        r = self.head.request("POST", "/v1/sessions", {"queue": "sq"})
        self.assertEqual(r.status, 201, r)
        sid = r.json["id"]
        r = self.head.request("PUT", "/v1/shared/%s/params?level=1&ttl_ms=3000" % sid,
                              raw=b"short-lived", content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        self.submit(sid, 1, 1)
        [x] = self.results(sid, 1, a)
        self.assertEqual((x["state"], x["result"].split("|")[0]), ("done", "short-lived"), x)
        links = os.path.join(self.dir, "cache-expiring", "@links")
        held = [f for d in os.listdir(links) for f in os.listdir(os.path.join(links, d))]
        self.assertEqual(held, ["%s@params@1" % sid], held)  # kept between tasks
        harness.wait_until(
            lambda: not any(os.listdir(os.path.join(links, d)) for d in os.listdir(links)),
            timeout=15, what=lambda: "the worker's link of the expired level removed:\n" + a.log())
        s = a.request("GET", "/v1/node/cache").json
        self.assertEqual((s["entries"], s["bytes_cached"], s["expired"]), (0, 0, 1), s)

    def test_plugin_gets_the_paths_and_keeps_its_load(self):
        a = self.agent("plug", ["--workers", "1", "--plugin", PLUGIN])
        self.put("models", "w", b"weights-one", 1)
        req = [{"scope": "models", "name": "w", "level": 1}]

        def run(level, n):
            req[0]["level"] = level
            r = self.head.request("POST", "/v1/queues/sq/tasks",
                                  {"tasks": [{"payload": i, "requires": req} for i in range(n)]})
            self.assertEqual(r.status, 201, r)
            ids = [t["id"] for t in r.json["tasks"]]

            def done():
                tasks = [self.head.request("GET", "/v1/tasks/%d" % i).json for i in ids]
                return tasks if all(t["state"] == "done" for t in tasks) else None
            return [t["result"] for t in harness.wait_until(done, timeout=60, what=a.log)]
        for x in run(1, 4):
            self.assertEqual((x["level"], x["data"], x["loads"]), (1, "weights-one", 1), x)
        self.put("models", "w", b"weights-two", 2)
        for x in run(2, 4):
            self.assertEqual((x["level"], x["data"], x["loads"]), (2, "weights-two", 2), x)
        # A task that requires a level the head no longer has fails with the reason.
        self.assertEqual(self.head.request("DELETE", "/v1/shared/models/w").status, 200)
        r = self.head.request("PUT", "/v1/queues/once", {"max_attempts": 1})
        self.assertEqual(r.status, 201, r)
        b = self.agent("plug2", ["--workers", "1", "--plugin", PLUGIN, "--queue", "once"])
        r = self.head.request("POST", "/v1/queues/once/tasks", {"tasks": [{"payload": 0,
                                                                           "requires": req}]})
        tid = r.json["tasks"][0]["id"]
        t = harness.wait_until(lambda: (lambda t: t if t["state"] == "dead" else None)(
            self.head.request("GET", "/v1/tasks/%d" % tid).json), timeout=30, what=b.log)
        self.assertIn("shared_not_found", t["error"])
        self.assertIn("models/w level 2", t["error"])

    def run_tasks(self, agent, scope, name, level, count):
        """Submits `count` tasks requiring the level; their results once all are done."""
        req = [{"scope": scope, "name": name, "level": level}]
        r = self.head.request("POST", "/v1/queues/sq/tasks",
                              {"tasks": [{"payload": i, "requires": req} for i in range(count)]})
        self.assertEqual(r.status, 201, r)
        ids = [t["id"] for t in r.json["tasks"]]

        def done():
            tasks = [self.head.request("GET", "/v1/tasks/%d" % i).json for i in ids]
            failed = [t for t in tasks if t["attempts"] > 1 or t["error"]]
            self.assertEqual(failed, [], agent.log())
            return tasks if all(t["state"] == "done" for t in tasks) else None
        return [t["result"] for t in harness.wait_until(done, timeout=60, what=agent.log)]

    def test_level_larger_than_the_cache_runs(self):
        # A level larger than --cache-bytes is dropped once its readers are done, so
        # the file a worker was told to link was gone: every task failed ("evicted 3
        # times").  The worker is told to read the bytes instead.
        data = os.urandom(6000)
        self.put("models", "params", data, 1)
        a = self.agent("small", ["--workers", "2", "--cache-bytes", "4096"],
                       cmd=["sh", "-c", 'cmp -s "$MUSTER_SHARED_PARAMS" "$1" && echo same',
                            "sh", os.path.join(self.dir, "want")])
        with open(os.path.join(self.dir, "want"), "wb") as f:
            f.write(data)
        self.assertEqual(self.run_tasks(a, "models", "params", 1, 4), ["same"] * 4)
        r = a.request("GET", "/v1/node/cache/models/params?level=1")
        self.assertEqual(r.status, 200, r)
        self.assertEqual((r.json["path"], r.json["cache"], r.json["size"]),
                         (None, "uncached", 6000), r.json)
        self.assertIn("larger than the cache", r.json["reason"])

    def test_a_level_the_cache_cannot_keep_is_downloaded_under_tmpdir(self):
        # A worker that had linked a level made its directory in the cache dir, and
        # then downloaded every level the cache could not keep into it, onto the disk
        # the cache had just found full: the task failed with "No space left on
        # device" where TMPDIR had room (found by walk-shared).  Downloads go under
        # TMPDIR, as shared-data.md says, links stay in the cache dir.
        tmp = os.path.join(self.dir, "tmp-mixed")
        os.mkdir(tmp)
        self.put("fits", "params", b"small-level", 1)
        self.put("large", "params", b"L" * 6000, 1)  # larger than --cache-bytes
        cache = os.path.join(self.dir, "cache-mixed")
        a = Agent(self.head, self.dir, "mixed", cmd=COMMAND, env={"TMPDIR": tmp},
                  args=["--queue", "sq", "--workers", "1", "--cache-bytes", "4096",
                        "--cache-dir", cache])
        self.agents.append(a)
        a.start()

        def path(result):
            return json.loads(result.split("|", 1)[1])[0]["path"]
        linked = path(self.run_tasks(a, "fits", "params", 1, 1)[0])
        self.assertTrue(linked.startswith(os.path.join(cache, "@links") + "/"), linked)
        downloaded = path(self.run_tasks(a, "large", "params", 1, 1)[0])
        self.assertEqual(os.path.dirname(os.path.dirname(downloaded)), tmp, downloaded)
        # The worker holds both, each in its own directory; both go when it exits.
        self.assertTrue(os.path.exists(linked) and os.path.exists(downloaded))
        a.stop()
        self.assertEqual(os.listdir(tmp), [])
        self.assertEqual(os.listdir(os.path.join(cache, "@links")), [])

    def test_cache_that_cannot_store_runs(self):
        # A cache dir where no file can be made (read-only, full): workers were
        # answered 503 and every task requiring shared data failed, while readers of
        # the bytes were served from the head.  Workers now read the bytes too.
        cache = os.path.join(self.dir, "cache-broken")
        os.makedirs(cache)
        open(os.path.join(cache, "@tmp"), "w").close()  # no fetch file can be made
        self.put("models", "params", b"bytes-from-the-head", 1)
        a = Agent(self.head, self.dir, "broken", cmd=COMMAND,
                  args=["--queue", "sq", "--workers", "2", "--cache-dir", cache])
        self.agents.append(a)
        a.start()
        results = self.run_tasks(a, "models", "params", 1, 4)
        self.assertTrue(all(x.startswith("bytes-from-the-head|") for x in results), results)
        r = a.request("GET", "/v1/node/cache/models/params?level=1")
        self.assertEqual((r.status, r.json["path"], r.json["cache"]), (200, None, "uncached"), r)
        self.assertIn("@tmp", r.json["reason"])
        # The reason is logged once, not once per read.
        self.assertEqual(a.log().count("cannot create a file in"), 1, a.log())

    def test_path_refusal_says_why(self):
        # A worker's task error is the agent's answer to its path request: it said
        # "shared data not found" alone, where the head says why (expired, a level
        # no longer kept), which is what the operator acts on (shared-data.md).
        a = Agent(self.head, self.dir, "why",
                  args=["--cache-dir", os.path.join(self.dir, "cache-why")])
        self.agents.append(a)
        a.start()
        for level in (1, 2, 3):
            self.put("models", "w", b"level-%d" % level, level)
        r = a.request("GET", "/v1/node/cache/models/w?level=1")
        self.assertEqual((r.status, r.json["error"]["code"]), (404, "shared_not_found"), r)
        self.assertIn("level 1 of 'w' was deleted: the head keeps the newest levels only",
                      r.json["error"]["message"])
        r = self.head.request("PUT", "/v1/shared/tmp/gone?ttl_ms=1", raw=b"x", content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        harness.wait_until(lambda: self.head.request("HEAD", "/v1/shared/tmp/gone").status == 404)
        r = a.request("GET", "/v1/node/cache/tmp/gone")
        self.assertEqual(r.status, 404, r)
        self.assertIn("'gone' expired", r.json["error"]["message"])
        r = a.request("GET", "/v1/node/cache/models/w", token="wrong-token")
        self.assertEqual(r.status, 401, r)
        self.assertEqual(r.json["error"]["code"], "unauthorized")
        self.assertIn("the token sent is not valid for this head", r.json["error"]["message"])
        self.assertEqual(a.request("GET", "/v1/node/cache/models/w").json["level"], 3)

    def test_worker_without_a_node_cache_downloads(self):
        self.put("global", "params", b"direct-from-the-head", 1)
        tmp = os.path.join(self.dir, "tmp")
        os.mkdir(tmp)
        env = dict(os.environ, TMPDIR=tmp, MUSTER_TOKEN=self.head.token)
        env.pop("MUSTER_CACHE_URL", None)
        req = [{"scope": "global", "name": "params", "level": 1}]
        r = self.head.request("POST", "/v1/queues/sq/tasks",
                              {"tasks": [{"payload": i, "requires": req} for i in range(3)]})
        ids = [t["id"] for t in r.json["tasks"]]
        log = open(os.path.join(self.dir, "worker.log"), "wb")
        proc = subprocess.run([harness.MUSTER_BIN, "worker", "--url", self.head.url,
                               "--queue", "sq", "--max-tasks", "3", "--"] + COMMAND,
                              env=env, stdout=log, stderr=subprocess.STDOUT, timeout=60)
        log.close()
        self.assertEqual(proc.returncode, 0)
        for i in ids:
            t = self.head.request("GET", "/v1/tasks/%d" % i).json
            self.assertEqual(t["state"], "done", t)
            self.assertTrue(t["result"].startswith("direct-from-the-head|"), t)
        self.assertEqual(os.listdir(tmp), [])  # its files went with it


if __name__ == "__main__":
    unittest.main()
