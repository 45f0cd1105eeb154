"""A head killed while it makes a backup.

The backup was made in DATA_DIR/backups/NAME itself, so a kill -9 in the middle left a
directory under the backup's name holding part of a database: it looked like a backup,
a restore could be started on it, and the name could not be used again ("exists
already").  A backup is now made in DATA_DIR/backups/.NAME.partial and renamed to NAME
once whole; the next head removes what a killed one left, and says so.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


class KilledDuringBackupTest(unittest.TestCase):
    def setUp(self):
        # One page per step: the copy of a few thousand pages takes long enough to be
        # caught in the middle.
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port()],
                                 env={"MUSTER_BACKUP_STEP_PAGES": "1"})
        self.addCleanup(self.head.cleanup)
        self.head.start()
        self.backups = os.path.join(self.head.data_dir, "backups")

    def fill(self):
        r = self.head.request("PUT", "/v1/queues/q", {})
        self.assertEqual(r.status, 201, r)
        for _ in range(4):
            tasks = [{"payload": "x" * 2000} for _ in range(1000)]
            r = self.head.request("POST", "/v1/queues/q/tasks", {"tasks": tasks})
            self.assertEqual(r.status, 201, r)

    def test_an_unfinished_backup_never_has_the_name_and_is_removed(self):
        self.fill()
        conn = self.head.connection()
        conn.request("POST", "/v1/backup", body=b'{"name": "nightly"}',
                     headers={"Authorization": "Bearer " + self.head.token,
                              "Content-Type": "application/json"})
        partial = os.path.join(self.backups, ".nightly.partial")
        harness.wait_until(lambda: os.path.exists(os.path.join(partial, "muster.db")),
                           what="the backup's copy to begin")
        self.assertNotIn("nightly", os.listdir(self.backups))
        self.head.kill()
        conn.close()
        self.assertIn(".nightly.partial", os.listdir(self.backups))  # what the kill left
        self.assertNotIn("nightly", os.listdir(self.backups))

        self.head.start()
        self.assertEqual(os.listdir(self.backups), [])
        self.assertIn("backup 'nightly' was left unfinished in %s by a head that stopped while "
                      "making it (no backup has its name): removed it; run the backup again"
                      % partial, self.head.log())
        r = self.head.request("POST", "/v1/backup", {"name": "nightly"})
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["path"], os.path.realpath(os.path.join(self.backups, "nightly")))
        self.assertEqual(sorted(os.listdir(self.backups)), ["nightly"])
        self.assertEqual(r.json["holds"]["tasks"]["queued"], 4000, r.json)

        # A name that is taken is refused before anything is made.
        r = self.head.request("POST", "/v1/backup", {"name": "nightly"})
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertEqual(sorted(os.listdir(self.backups)), ["nightly"])

    def test_a_python_client_waits_for_a_backup_longer_than_its_timeout(self):
        """Client.backup waits however long the copy takes, as `muster backup` does, not the
        client's timeout: with it, a backup the head went on to finish raised NetworkError."""
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "python"))
        import muster
        self.fill()
        client = muster.Client(self.head.url, self.head.token, timeout=0.01)
        self.addCleanup(client.close)
        reply = client.backup("py")
        self.assertGreater(reply["duration_ms"], 10, "the copy did not outlast the timeout")
        self.assertEqual(reply["path"], os.path.realpath(os.path.join(self.backups, "py")))
        self.assertEqual(reply["holds"]["tasks"]["queued"], 4000, reply)


if __name__ == "__main__":
    unittest.main()
