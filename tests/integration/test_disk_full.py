#!/usr/bin/python3
"""A head whose disk fills up: writes are refused saying the disk is full, nothing
acknowledged is lost, and the head goes on by itself once there is room.

The data dir is on a small tmpfs the test mounts (and unmounts): needs root
(CAP_SYS_ADMIN) for mount; without it the test says so and skips.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import Head

PAYLOAD = "x" * 2000
BATCH = 50


def log(message):
    print(message, file=sys.stderr, flush=True)


def try_mount(path, size):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                          stderr=subprocess.PIPE, text=True)


def skip_unless_mount():
    """Exits 0 with a clear message when a tmpfs cannot be mounted here."""
    if os.geteuid() != 0:
        log("SKIP: test_disk_full needs root (CAP_SYS_ADMIN) to mount a small tmpfs")
        sys.exit(0)
    probe = tempfile.mkdtemp(prefix="muster-test-mount-")
    proc = try_mount(probe, "1m")
    if proc.returncode == 0:
        subprocess.run(["umount", probe], check=True)
    os.rmdir(probe)
    if proc.returncode != 0:
        log("SKIP: cannot mount a tmpfs here: " + proc.stderr.strip())
        sys.exit(0)


class DiskFullTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="muster-test-full-")
        self.mnt = os.path.join(self.dir, "mnt")
        os.mkdir(self.mnt)
        proc = try_mount(self.mnt, "4m")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.head = Head(data_dir=os.path.join(self.mnt, "data"))
        os.mkdir(self.head.data_dir)
        self.head.log_path = os.path.join(self.dir, "head.log")  # off the full disk
        self.head.start()

    def tearDown(self):
        self.head.stop()
        subprocess.run(["umount", self.mnt], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def put(self):
        tasks = [{"payload": PAYLOAD} for _ in range(BATCH)]
        return self.head.request("POST", "/v1/queues/q/tasks", {"tasks": tasks})

    def queued(self):
        r = self.head.request("GET", "/v1/queues/q")
        self.assertEqual(r.status, 200, r)
        return r.json["counts"]["queued"]

    def metric(self, name):
        r = self.head.request("GET", "/metrics")
        self.assertEqual(r.status, 200, r)
        for line in r.raw.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        self.fail("no metric %s in /metrics" % name)

    def test_full_disk_refuses_writes_and_loses_nothing(self):
        self.assertEqual(self.head.request("PUT", "/v1/queues/q", {}).status, 201)
        acknowledged = 0
        for _ in range(200):  # 4 MiB hold about 2 000 tasks of 2 KB: full long before 10 000
            r = self.put()
            if r.status != 201:
                break
            acknowledged += BATCH
        else:
            self.fail("4 MiB never filled up")
        self.assertGreater(acknowledged, 0)
        self.assertEqual(r.status, 500, r)
        self.assertEqual(r.error_code, "store_error", r)
        message = r.json["error"]["message"]
        self.assertIn("is full: nothing of this request was applied; free space there and retry",
                      message)
        self.assertIn(os.path.join(self.head.data_dir, "muster.db"), message)
        self.assertGreaterEqual(self.metric("muster_store_disk_full_total"), 1)
        self.assertIn("is full", self.head.log())

        # Reads go on, and the refused batch left nothing behind.
        self.assertEqual(self.queued(), acknowledged)

        # Room again: the same head takes writes without a restart.
        subprocess.run(["mount", "-o", "remount,size=64m", self.mnt], check=True)
        r = self.put()
        self.assertEqual(r.status, 201, r)
        acknowledged += BATCH
        self.assertEqual(self.queued(), acknowledged)

        # Everything acknowledged survives a kill -9.
        self.head.kill()
        self.head.start()
        self.assertEqual(self.queued(), acknowledged)
        r = self.head.request("POST", "/v1/queues/q/lease", {"max": 3})
        self.assertEqual(r.status, 200, r)
        self.assertEqual([t["payload"] for t in r.json["leases"]], [PAYLOAD] * 3)


if __name__ == "__main__":
    skip_unless_mount()
    unittest.main(verbosity=2)
