"""What the `muster` command line says when something goes wrong: each message in the
CLI's words (options as typed, paths as looked at), with the advice that fits the case.

The tests share one head (a short --sweep-ms, for shared data that expires); each uses
its own names.  Nothing waits on a timer: tests poll observable state.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

MUSTER = harness.MUSTER_BIN


class CliMessagesTest(unittest.TestCase):
    head = None

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(["--sweep-ms", "50"])
        cls.head.start()
        cls.cwd = tempfile.mkdtemp(prefix="muster-cli-msg-")

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()
        shutil.rmtree(cls.cwd, ignore_errors=True)

    def env(self, url=True, token=True):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
        if url:
            env["MUSTER_URL"] = self.head.url
        if token:
            env["MUSTER_TOKEN"] = self.head.token
        return env

    def muster(self, *args, stdin=None, url=True, token=True):
        return subprocess.run([MUSTER] + list(args), input=stdin, capture_output=True, text=True,
                              env=self.env(url, token), cwd=self.cwd, timeout=60)

    def ok(self, *args, **kw):
        r = self.muster(*args, **kw)
        self.assertEqual(r.returncode, 0, "muster %s failed: %s" % (" ".join(args), r.stderr))
        return r.stdout

    def fails(self, code, *args, **kw):
        r = self.muster(*args, **kw)
        self.assertEqual(r.returncode, code, "muster %s: rc %d, stderr %r"
                         % (" ".join(args), r.returncode, r.stderr))
        return r.stderr

    # ---- url and token -------------------------------------------------------------

    def test_no_token_says_where_it_looked(self):
        nope = os.path.join(self.cwd, "nope")
        err = self.fails(1, "queue", "ls", "--data-dir", nope, token=False)
        self.assertEqual(err, "muster: unauthorized: the head needs a token, and no token was "
                         "given: not by --token, not by MUSTER_TOKEN, and not in %s/token (No such "
                         "file or directory, from --data-dir)\n"
                         "muster: pass --token, set MUSTER_TOKEN, or point --data-dir (or "
                         "MUSTER_DATA_DIR) at the head's data dir, which holds the file "
                         "'token'\n" % nope)
        self.assertNotIn("Authorization", err)
        # Without --data-dir it looked in ./muster-data; an empty token file is named so.
        err = self.fails(1, "queue", "ls", token=False)
        self.assertIn("not in ./muster-data/token (No such file or directory, from the default "
                      "data dir)", err)
        os.mkdir(nope)
        open(os.path.join(nope, "token"), "w").close()
        env = dict(self.env(token=False), MUSTER_DATA_DIR=nope)
        r = subprocess.run([MUSTER, "queue", "ls"], capture_output=True, text=True, env=env,
                           cwd=self.cwd, timeout=60)
        self.assertIn("not in %s/token (it is empty, from MUSTER_DATA_DIR)" % nope, r.stderr)

    # ---- shared data ---------------------------------------------------------------

    def test_shared_put_existing_names_the_option(self):
        self.ok("shared", "put", "msg-exists", "w", stdin="a")
        self.ok("shared", "put", "msg-exists", "w", "--level", "2", stdin="b")
        err = self.fails(1, "shared", "put", "msg-exists", "w", stdin="c")
        self.assertEqual(err, "muster: version_mismatch: shared data 'w' exists at level 2; "
                         "update it with --level 3\n")
        self.ok("shared", "rm", "msg-exists", "w")

    def test_shared_expired_after_the_sweep(self):
        self.ok("shared", "put", "msg-ttl", "gone", "--ttl-ms", "200", stdin="a")
        # The head logs each blob its sweep deletes.
        harness.wait_until(lambda: "shared data 'gone' in scope 'msg-ttl' expired"
                           in self.head.log(), what="the sweep to delete the expired blob")
        expired = "('gone' expired: it was not updated within its ttl_ms of 200)"
        err = self.fails(1, "shared", "get", "msg-ttl", "gone")
        self.assertEqual(err, "muster: shared_not_found: shared data not found: 'gone' in scope "
                         "'msg-ttl' %s\n" % expired)
        err = self.fails(1, "shared", "put", "msg-ttl", "gone", "--level", "2", stdin="b")
        self.assertEqual(err, "muster: version_mismatch: update level mismatch: expected 1, got 2 "
                         "('gone' expired: it was not updated within its ttl_ms of 200; a new "
                         "blob starts at level 1)\n"
                         "muster: put it again without --level to start it at level 1\n")
        self.ok("shared", "put", "msg-ttl", "gone", stdin="c")
        self.ok("shared", "rm", "msg-ttl", "gone")


if __name__ == "__main__":
    unittest.main()
