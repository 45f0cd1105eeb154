"""An operator's walk through docs/operations.md: what the walk found wrong or rough in
`muster backup`, its answer and its log, and in the document's own commands.

- `muster backup --json` prints the head's answer as one JSON document, indented as
  every other --json, with no blank line after it (the reply's own line end used to be
  doubled), and the head's log says "1 step of 64 pages", not "1 steps".
- A backup that cannot start on the head's side (DATA_DIR/backups is a file, or is on a
  read-only disk) is said in the head's log, and its answer names the backup: before, the
  head logged nothing and the answer did not say which backup failed.  A name that
  exists is the caller's mistake: answered as before, not logged as an error.
- A blob file that does not fit on the backups disk is said as the database that does
  not fit is ("the disk holding it is full"), not in the system's words alone.
- `muster backup --help` tells how to restore (stop, mv or cp -a, start) rather than to
  start a head on the backup in place, inside the live data dir.
- The nightly timer's `find` in the document, run as written on a backups dir that is a
  mount point: it removes an old backup and keeps a new one, `lost+found` and a backup
  being made (`.NAME.partial`).
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")


class OpsWalkCase(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head().start()

    def tearDown(self):
        self.head.cleanup()

    def muster(self, *args):
        return subprocess.run([harness.MUSTER_BIN] + list(args) +
                              ["--data-dir", self.head.data_dir],
                              capture_output=True, text=True, timeout=60)


class BackupCliTest(OpsWalkCase):
    def test_json_is_one_indented_document_without_a_blank_line(self):
        p = self.muster("backup", "--name", "j1", "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertTrue(p.stdout.endswith("}\n") and not p.stdout.endswith("\n\n"),
                        repr(p.stdout[-20:]))
        answer = json.loads(p.stdout)
        self.assertEqual(answer["name"], "j1")
        self.assertEqual(answer["path"], os.path.realpath(
            os.path.join(self.head.data_dir, "backups", "j1")))
        self.assertIn('\n  "holds": {', p.stdout)  # indented as `session create --json`
        # A small store is copied in one step of 64 pages: said in the singular.
        self.assertRegex(self.head.log(), r"backup 'j1': made in .*the database in 1 step "
                         r"of 64 pages \(the longest")

    def test_help_says_how_to_restore(self):
        p = subprocess.run([harness.MUSTER_BIN, "backup", "--help"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("stop the head, move the backup into its data dir's place (mv,",
                      p.stdout)
        self.assertIn("cp -a", p.stdout)
        self.assertNotIn("muster head --data-dir DATA_DIR/backups/NAME", p.stdout)


class BackupCannotStartTest(OpsWalkCase):
    def backup(self, name):
        return self.head.request("POST", "/v1/backup", {"name": name})

    def test_a_backups_path_that_is_a_file(self):
        with open(os.path.join(self.head.data_dir, "backups"), "w") as f:
            f.write("in the way\n")
        r = self.backup("nightly")
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        said = ("backup 'nightly' could not start: cannot create %s/backups/.nightly.partial: "
                "Not a directory" % self.head.data_dir)
        self.assertEqual(r.json["error"]["message"], said)
        harness.wait_until(lambda: "ERROR " + said in self.head.log(), what="the log line")
        p = self.muster("backup", "--name", "nightly")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr, "muster: store_error: %s\n" % said)

    def test_a_name_that_exists_is_answered_not_logged(self):
        self.assertEqual(self.backup("once").status, 201)
        r = self.backup("once")
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertTrue(r.json["error"]["message"].startswith("backup 'once' exists already ("),
                        r)
        # The head logs before it answers (stderr, unbuffered): a line would be there.
        self.assertNotIn("exists already", self.head.log())
        self.assertNotIn("could not start", self.head.log())


class FullBackupsDiskTest(OpsWalkCase):
    """DATA_DIR/backups on a tmpfs (another disk) too small for a blob file: the copy of
    the blob fails with the words the database's copy uses, and nothing is left."""

    def test_a_blob_file_that_does_not_fit(self):
        mnt = os.path.join(self.head.data_dir, "backups")
        os.mkdir(mnt)
        if os.geteuid() != 0 or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt],
                capture_output=True).returncode != 0:
            self.skipTest("cannot mount a tmpfs here (needs root)")
        # After tearDown (the head gone), last in first out: unmount, then remove the
        # data dir, whose backups dir tearDown could not remove while mounted.
        self.addCleanup(shutil.rmtree, self.head.data_dir, True)
        self.addCleanup(subprocess.run, ["umount", mnt], check=False)
        r = self.head.request("PUT", "/v1/shared/global/big", raw=os.urandom(3 << 20),
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)
        r = self.head.request("POST", "/v1/backup", {"name": "b"})
        self.assertEqual((r.status, r.error_code), (500, "store_error"), r)
        self.assertRegex(r.json["error"]["message"],
                         r"^backup 'b' failed and was removed: cannot write %s/\.b\.partial/"
                         r"shared/[0-9a-f]{16}\.blob: the disk holding it is full \(No space "
                         r"left on device\)$" % re.escape(mnt))
        self.assertEqual(os.listdir(mnt), [])


class TimerFindTest(unittest.TestCase):
    """The ExecStartPost line of the document's muster-backup.service, run by hand."""

    def doc_find(self):
        with open(os.path.join(DOCS, "operations.md")) as f:
            text = f.read()
        m = re.search(r"ExecStartPost=(/usr/bin/find .*?\+)\n", text.replace("\\\n", " "))
        self.assertIsNotNone(m, "no ExecStartPost=/usr/bin/find line in operations.md")
        return shlex.split(m.group(1))

    def test_find_keeps_lost_and_found_and_a_backup_being_made(self):
        argv = self.doc_find()
        self.assertEqual(argv[1], "/var/lib/muster/backups")
        root = tempfile.mkdtemp(prefix="muster-ops-walk-")
        self.addCleanup(shutil.rmtree, root, True)
        old = time.time() - 10 * 86400
        for name in ("old", "new", "lost+found", ".20250101T000000Z.partial"):
            os.mkdir(os.path.join(root, name))
            if name != "new":
                os.utime(os.path.join(root, name), (old, old))
        argv[1] = root
        subprocess.run([shutil.which("find") or argv[0]] + argv[1:], check=True, timeout=30)
        self.assertEqual(sorted(os.listdir(root)),
                         [".20250101T000000Z.partial", "lost+found", "new"])


if __name__ == "__main__":
    unittest.main()
