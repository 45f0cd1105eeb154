#!/usr/bin/python3
"""Full disks, as an operator meets them (test_disk_full.py has the store's own promises).

- A node agent whose --state-dir is full refuses a node-local iteration's write saying
  the disk is full and that the agent (not the head, which has nothing to do with it)
  goes on by itself; it does once there is room.
- Room again after a full disk was not said: the agent logged the full disk of its
  --state-dir (the store's line) and of its --cache-dir (a level served uncached), but
  nothing when writes succeeded again.  It now says so once for the state dir, with how
  many requests were refused meanwhile, and the cache says it stores levels again, once.
- A shared data upload that fills the head's disk is refused saying so, as the store
  says it, to the client and in the head's log (it said only "cannot write the upload to
  PATH: No space left on device", and the log nothing).
- A head started again on a full disk after a kill -9 cannot write DATA_DIR/url: the
  file the killed head left named its old port, and the CLI sent its requests there.
  The head now removes a url file it cannot replace (unless it names the same URL) and
  says which --url reaches it, leaving no temporary file behind.

The dirs are on a small tmpfs the test mounts (and unmounts): needs root
(CAP_SYS_ADMIN); without it the test says so and skips.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import Head
from node_harness import Agent
from test_disk_full import skip_unless_mount, try_mount


def fill(directory):
    """Writes a file into `directory` until its disk is full.  Unbuffered: a buffered
    file's close writes out what the last write left in its buffer, and failed with
    ENOSPC whenever the room left was not a whole number of writes."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


class TinyDiskCase(unittest.TestCase):
    size = "1m"

    def setUp(self):
        # Cleaned up however far a setUp gets (addCleanup runs then too), the mount last.
        self.dir = tempfile.mkdtemp(prefix="muster-test-fw-disk-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        proc = try_mount(self.mnt, self.size)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.addCleanup(subprocess.run, ["umount", self.mnt], check=False)


class NodeStateDiskFullTest(TinyDiskCase):
    def setUp(self):
        super().setUp()
        self.head = Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.agent = Agent(self.head, self.dir, "fw-full",
                           args=["--state-dir", os.path.join(self.mnt, "state")])
        self.addCleanup(self.agent.kill)
        self.agent.start()

    def create(self, name):
        return self.agent.request("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 100000}, "world_size": 8,
            "cluster_sync": False})

    def test_a_full_state_dir_names_the_agent(self):
        self.assertEqual(self.create("first").status, 201)  # the store exists
        fill(self.mnt)
        refused = None
        for i in range(200):  # the store's pages still free take a few
            r = self.create("it-%d" % i)
            if r.status != 201:
                refused = r
                break
        self.assertIsNotNone(refused, "no create was refused on a full disk")
        self.assertEqual((refused.status, refused.error_code), (500, "store_error"), refused)
        message = refused.json["error"]["message"]
        self.assertIn("is full: nothing of this request was applied; free space there and "
                      "retry (node agent fw-full goes on by itself)", message)
        self.assertNotIn("the head", message)

        # Room again: the same agent takes the write, and the refused one left nothing.
        os.unlink(os.path.join(self.mnt, "filler"))
        again = self.create("it-%d" % i)
        self.assertEqual(again.status, 201, again)


class NodeDiskRoomAgainTest(TinyDiskCase):
    def setUp(self):
        super().setUp()
        self.head = Head()
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.state = os.path.join(self.mnt, "state")
        self.cache = os.path.join(self.mnt, "cache")
        self.agent = Agent(self.head, self.dir, "fw-room",
                           args=["--state-dir", self.state, "--cache-dir", self.cache])
        self.addCleanup(self.agent.kill)
        self.agent.start()

    def create(self, name):
        return self.agent.request("POST", "/v1/iterations", {
            "name": name, "dataset": {"num_samples": 100000}, "world_size": 8,
            "cluster_sync": False})

    def read(self, name, data):
        r = self.head.request("PUT", "/v1/shared/sc/" + name, raw=data,
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        r = self.agent.request("GET", "/v1/shared/sc/" + name)
        self.assertEqual((r.status, r.raw == data), (200, True), r)
        return r.headers.get("X-Muster-Cache")

    def test_room_again_is_said_once(self):
        self.assertEqual(self.create("first").status, 201)  # the store exists
        fill(self.mnt)
        refused = 0
        for i in range(200):  # the store's pages still free take a few
            if self.create("full-%d" % i).status != 201:
                refused += 1
                if refused == 3:
                    break
        self.assertEqual(refused, 3, "no create was refused on a full disk")
        self.assertEqual(self.read("one", os.urandom(300000)), "uncached")
        log = self.agent.log()
        self.assertIn("the disk holding %s/iterations.db is full" % self.state, log)
        self.assertIn("cache: no room for 300000 bytes in %s" % self.cache, log)
        self.assertNotIn("room again", log)

        os.unlink(os.path.join(self.mnt, "filler"))
        for i in range(3):
            self.assertEqual(self.create("again-%d" % i).status, 201)
            self.assertEqual(self.read("two-%d" % i, os.urandom(1000)), "miss")
        log = self.agent.log()
        said = ("muster node: iterations: the disk holding %s/iterations.db has room again: "
                "requests that write are taken again (3 refused while it was full)\n"
                % self.state)
        self.assertEqual(log.count(said), 1, log)
        self.assertEqual(log.count("muster node: cache: storing levels in %s again\n"
                                   % self.cache), 1, log)

    def test_a_refused_sweep_adds_no_line_of_its_own(self):
        r = self.agent.request("POST", "/v1/iterations", {
            "name": "lapse", "dataset": {"num_samples": 400}, "block_size": 4,
            "world_size": 1, "strategy": "dynamic", "lease_ms": 200,
            "rank_timeout_ms": 600000, "cluster_sync": False})
        self.assertEqual(r.status, 201, r)
        r = self.agent.request("POST", "/v1/iterations/lapse/next", {"rank": 0, "max": 1})
        self.assertEqual(r.status, 200, r)
        fill(self.mnt)
        # No request comes now: the first write to find the disk full is the sweep's,
        # which expires the block's lease (every 100 ms, refused each time).
        full = "the disk holding %s/iterations.db is full" % self.state
        harness.wait_until(lambda: full in self.agent.log(),
                           what=lambda: "the sweep's write refused:\n" + self.agent.log())
        os.unlink(os.path.join(self.mnt, "filler"))
        said = ("muster node: iterations: the disk holding %s/iterations.db has room again: "
                "requests that write are taken again\n" % self.state)  # none was refused
        harness.wait_until(lambda: said in self.agent.log(),
                           what=lambda: "the sweep's write taken:\n" + self.agent.log())
        self.assertNotIn("iterations: sweep:", self.agent.log())  # the store's line says it
        ranks = self.agent.request("GET", "/v1/iterations/lapse").json["ranks"]
        self.assertEqual(ranks[0]["expired"], 1, ranks)


class SharedUploadDiskFullTest(TinyDiskCase):
    size = "2m"

    def setUp(self):
        super().setUp()
        self.head = Head(data_dir=os.path.join(self.mnt, "data"))
        os.mkdir(self.head.data_dir)
        self.head.log_path = os.path.join(self.dir, "head.log")  # off the full disk
        self.addCleanup(self.head.kill)
        self.head.start()

    def put(self, data):
        return self.head.request("PUT", "/v1/shared/sc/weights", raw=data,
                                 content_type="application/octet-stream")

    def test_an_upload_the_disk_cannot_hold_says_so_to_client_and_log(self):
        data = os.urandom(3 << 20)  # more than the whole disk
        r = self.put(data)
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        message = r.json["error"]["message"]
        self.assertRegex(message, r"^shared data 'weights' in scope 'sc': cannot write "
                         r"\S+/shared/tmp/\w+\.part: the disk holding it is full: nothing of "
                         r"this upload was stored; free space there and retry \(the head goes "
                         r"on by itself\)$")
        self.assertIn("ERROR " + message, self.head.log())
        # Its temp file went before the answer: a retry finds the room it took.
        self.assertEqual(os.listdir(os.path.join(self.head.data_dir, "shared", "tmp")), [])
        self.assertEqual(self.head.request("GET", "/v1/shared/sc/weights").status, 404)

        # Room again: the same upload is stored, without a restart.
        subprocess.run(["mount", "-o", "remount,size=16m", self.mnt], check=True)
        r = self.put(data)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(self.head.request("GET", "/v1/shared/sc/weights").raw, data)


class HeadUrlOnFullDiskTest(TinyDiskCase):
    def setUp(self):
        super().setUp()
        self.data = os.path.join(self.mnt, "data")
        os.mkdir(self.data)
        self.proc = None
        self.addCleanup(lambda: self.proc is not None and harness.stop_process(self.proc))

    def start(self):
        """A head on the tiny disk, its log beside it; waits for its start line and
        returns what it logged."""
        log_path = os.path.join(self.dir, "head.log")
        start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [harness.MUSTER_BIN, "head", "--server-only", "--listen", "127.0.0.1:0",
                 "--data-dir", self.data], stdout=log, stderr=subprocess.STDOUT)

        def log_text():  # this head's lines
            with open(log_path, "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        harness.wait_until(lambda: "listening on port" in log_text(), timeout=20,
                           what=lambda: "the head's start line in:\n" + log_text())
        return log_text()

    def url_file(self):
        try:
            with open(os.path.join(self.data, "url")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None

    def test_a_url_it_cannot_write_is_not_left_naming_a_killed_head(self):
        self.start()
        killed_url = self.url_file()
        self.assertTrue(killed_url and killed_url.startswith("http://127.0.0.1:"), killed_url)
        self.proc.kill()
        self.proc.wait()
        fill(self.mnt)
        log = self.start()
        port = log.rsplit("listening on port ", 1)[1].split()[0]
        url = "http://127.0.0.1:" + port
        self.assertNotEqual(url, killed_url)  # port 0: another port
        self.assertIsNone(self.url_file(), "the killed head's url file is left: " + log)
        self.assertIn("cannot write %s/url: No space left on device; the CLI does not find "
                      "this head through its data dir, so give it --url %s (or MUSTER_URL)"
                      % (self.data, url), log)
        self.assertNotIn("url.tmp", os.listdir(self.data))
        # The CLI says there is no head there, rather than asking the killed head's port.
        cli = subprocess.run([harness.MUSTER_BIN, "status", "--data-dir", self.data],
                             capture_output=True, text=True, timeout=30)
        self.assertNotEqual(cli.returncode, 0)
        self.assertNotIn(killed_url, cli.stderr)


if __name__ == "__main__":
    skip_unless_mount()
    unittest.main(verbosity=2)
