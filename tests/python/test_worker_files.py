"""The files of ``python3 -m muster.worker``'s resident processes ($TMPDIR/muster-py-UID/
wPID-START.sock, .lock, .log, and wPID-START-N.sock of a later generation) do not outlive
their ``muster worker``: the resident removes them when its worker is gone, however it
went (SIGKILL with its agent included), and a new resident sweeps those of dead workers
whose resident could not."""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from common import ROOT  # first: it puts python/ on sys.path
from muster import worker_resident


def wait_until(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


class ResidentFilesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="muster-py-files-")
        self.old_tmpdir = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = self.tmp
        self.dir = worker_resident._runtime_dir()

    def tearDown(self):
        if self.old_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = self.old_tmpdir
        shutil.rmtree(self.tmp, ignore_errors=True)

    def files(self):
        return sorted(os.listdir(self.dir))

    def make_files(self, pid, start, log=b""):
        base = worker_resident._resident_base(pid, start)
        for suffix in (".sock", ".lock"):
            open(base + suffix, "w").close()
        with open(base + ".log", "wb") as f:
            f.write(log)
        return os.path.basename(base)

    def start_resident(self):
        """A resident for a stand-in ``muster worker`` (`sleep`), with its three files;
        returns (stand-in, resident)."""
        parent = subprocess.Popen(["sleep", "600"])
        start = worker_resident._proc_start_time(parent.pid)
        base = worker_resident._resident_base(parent.pid, start)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(base + ".sock")
        lsock.listen(1)
        open(base + ".lock", "w").close()
        with open(base + ".log", "ab") as log:
            resident = subprocess.Popen(
                [sys.executable, "-m", "muster.worker", "--resident", str(lsock.fileno()),
                 "--parent", "%d:%s" % (parent.pid, start)], pass_fds=(lsock.fileno(),),
                stderr=log, env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        lsock.close()
        return parent, resident

    def test_resident_removes_its_files_when_its_worker_is_killed(self):
        parent, resident = self.start_resident()
        self.assertEqual(len(self.files()), 3)
        parent.kill()
        parent.wait()
        self.assertEqual(resident.wait(20), 0)
        self.assertEqual(self.files(), [])

    def test_a_resident_does_not_make_its_removed_directory_again(self):
        # A test (or a user) that removes its TMPDIR once its agent stopped: the
        # resident, noticing its worker gone a moment later, made muster-py-UID again
        # to remove its files from it, and left it behind.
        parent, resident = self.start_resident()
        shutil.rmtree(self.dir)
        parent.kill()
        parent.wait()
        self.assertEqual(resident.wait(20), 0)
        self.assertFalse(os.path.exists(self.dir))

    def test_a_new_resident_sweeps_the_files_of_dead_workers(self):
        gone = subprocess.Popen(["true"])
        gone.wait()
        me = worker_resident._proc_start_time(os.getpid())
        live = self.make_files(os.getpid(), me)
        dead = self.make_files(gone.pid, "12345", log=b"a crash\n")   # its worker is gone
        # A later generation's socket (a resident started because the code changed).
        for base in (live, dead):
            open(os.path.join(self.dir, base + "-2.sock"), "w").close()
        self.make_files(os.getpid(), str(int(me) + 1))   # a pid reused: another process
        open(os.path.join(self.dir, "unrelated.txt"), "w").close()
        worker_resident._sweep_stale_files()
        self.assertEqual(self.files(), sorted([live + ".lock", live + ".log", live + ".sock",
                                              live + "-2.sock", "unrelated.txt"]))


if __name__ == "__main__":
    unittest.main()
