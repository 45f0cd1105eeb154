"""The node cache's directory layout (docs/shared-data.md "Node cache", "Files"): the
cache's own directories have names no scope can have, and a cache dir an older agent
left is taken over safely.

- Scopes named `tmp` and `links` (valid scope names) shared their directory with the
  cache's own: `DIR/tmp` (fetches in progress, emptied at each start) and `DIR/links`
  (the workers' link directories).  Their cached levels were removed or skipped when the
  agent started again, so a restart lost them, and a worker's link directories were made
  among the files of the scope `links`.  The cache's own are `DIR/@tmp` and `DIR/@links`
  now ('@' cannot be in a scope), next to `DIR/@agent.lock`.
- An agent started on an older agent's cache dir removes what the older one left in
  `DIR/tmp` (fetch-XXXXXX files) and `DIR/links` (the link directories of workers that
  are gone), takes over the cached levels it stored there (of the scopes `tmp` and
  `links`), and follows no symbolic link out of the cache dir: the older agent's start
  emptied a directory a link named `DIR/links/PID-XXXXXX` pointed to, anywhere.
"""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from node_harness import Agent  # noqa: E402

OCTET = "application/octet-stream"


class CacheDirsCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-cache-dirs-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.head = harness.Head().start()
        self.addCleanup(self.head.cleanup)
        self.cache = os.path.join(self.dir, "cache")
        self.agents = []

    def tearDown(self):
        for a in self.agents:
            a.kill()

    def start_agent(self):
        a = Agent(self.head, self.dir, "dirs", args=["--cache-dir", self.cache])
        self.agents.append(a)
        return a.start()

    def put(self, scope, name, data):
        r = self.head.request("PUT", "/v1/shared/%s/%s" % (scope, name), raw=data,
                              content_type=OCTET)
        self.assertEqual(r.status, 201, r)
        return r.json["checksum"]

    def read(self, agent, scope, name):
        r = agent.request("GET", "/v1/shared/%s/%s" % (scope, name))
        self.assertEqual(r.status, 200, r)
        return r.raw, r.headers["X-Muster-Cache"]

    def stats(self, agent):
        r = agent.request("GET", "/v1/node/cache")
        self.assertEqual(r.status, 200, r)
        return r.json


class ScopeNamesTest(CacheDirsCase):
    def test_scopes_named_like_the_caches_directories_survive_a_restart(self):
        # (A name may start with '.': such a level was not taken over either.)
        blobs = {(scope, name): os.urandom(100_000)
                 for scope, name in (("tmp", "w"), ("links", "w"), ("models", ".w"))}
        sums = {key: self.put(*key, data) for key, data in blobs.items()}
        a = self.start_agent()
        for key, data in blobs.items():
            self.assertEqual(self.read(a, *key), (data, "miss"), key)
        for (scope, name), checksum in sums.items():
            path = os.path.join(self.cache, scope, "%s@1@%s" % (name, checksum))
            self.assertTrue(os.path.isfile(path), (path, os.listdir(self.cache)))
        # A worker's link directories are not made among the files of the scope `links`.
        r = a.request("GET", "/v1/node/cache/links/w")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["links_dir"], os.path.join(self.cache, "@links"), r.json)
        self.assertEqual(os.path.dirname(r.json["path"]), os.path.join(self.cache, "links"))

        a.kill()
        a = self.start_agent()
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"]), (3, 300_000), s)
        for key, data in blobs.items():  # taken over, checked, served: no fetch
            self.assertEqual(self.read(a, *key), (data, "hit"), key)
        s = self.stats(a)
        self.assertEqual((s["upstream_fetches"], s["verify_failures"]), (0, 0), s)
        self.assertEqual(sorted(os.listdir(self.cache)),
                         ["@agent.lock", "@links", "@tmp", "links", "models", "tmp"])
        self.assertEqual(os.listdir(os.path.join(self.cache, "@tmp")), [])


class OlderLayoutTest(CacheDirsCase):
    def test_an_older_agents_cache_dir_is_taken_over(self):
        outside = os.path.join(self.dir, "outside")  # never the cache's to touch
        os.mkdir(outside)
        with open(os.path.join(outside, "keep"), "wb") as f:
            f.write(b"not the cache's")
        tmp_level, links_level, model = os.urandom(5000), os.urandom(6000), os.urandom(7000)
        sums = {"tmp": self.put("tmp", "t", tmp_level),
                "links": self.put("links", "l", links_level),
                "models": self.put("models", "m", model)}
        with open("/proc/sys/kernel/pid_max") as f:
            gone_pid = int(f.read())  # above every pid
        files = {
            "tmp/fetch-Ab12Cd": b"an older agent's fetch in progress",
            "tmp/t@1@" + sums["tmp"]: tmp_level,  # scope tmp, stored by an older agent
            "links/%d-Xy34Zw/m@1@%s" % (gone_pid, sums["models"]): model,
            "links/%d-Qr56St/keep" % os.getpid(): b"a running worker's link",
            "links/l@1@" + sums["links"]: links_level,  # scope links, likewise
            "models/m@1@" + sums["models"]: model,
            "@tmp/fetch-Ef78Gh": b"a newer agent's fetch in progress",
            "@links/%d-Uv90Wx/m@1@%s" % (gone_pid, sums["models"]): model,
        }
        for rel, data in files.items():
            path = os.path.join(self.cache, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        # Links out of the cache dir named as its own files and directories are.
        os.symlink(outside, os.path.join(self.cache, "links", "%d-Ln12Ks" % gone_pid))
        os.symlink(outside, os.path.join(self.cache, "@links", "%d-Ln34Ks" % gone_pid))
        os.symlink(os.path.join(outside, "keep"), os.path.join(self.cache, "tmp", "fetch-Ln56Ks"))
        os.symlink(os.path.join(outside, "keep"), os.path.join(self.cache, "@tmp", "fetch-Ln78Ks"))
        a = self.start_agent()

        self.assertEqual(os.listdir(outside), ["keep"])
        left = sorted(os.path.relpath(os.path.join(d, n), self.cache)
                      for d, dirs, names in os.walk(self.cache) for n in dirs + names)
        self.assertEqual(left, sorted([
            "@agent.lock", "@links", "@links/%d-Ln34Ks" % gone_pid, "@tmp",
            "links", "links/%d-Qr56St" % os.getpid(), "links/%d-Qr56St/keep" % os.getpid(),
            "links/%d-Ln12Ks" % gone_pid, "links/l@1@" + sums["links"],
            "models", "models/m@1@" + sums["models"],
            "tmp", "tmp/fetch-Ln56Ks", "tmp/t@1@" + sums["tmp"]]))
        s = self.stats(a)
        self.assertEqual((s["entries"], s["bytes_cached"]), (3, 18000), s)
        for scope, name, data in (("tmp", "t", tmp_level), ("links", "l", links_level),
                                  ("models", "m", model)):
            self.assertEqual(self.read(a, scope, name), (data, "hit"), scope)
        self.assertEqual(self.stats(a)["upstream_fetches"], 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
