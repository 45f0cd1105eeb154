"""`muster shared get FILE` as an ML engineer refreshing a local copy of model weights uses
it: the file is replaced only by a complete, verified download, and a download that fails
(a level that expired, a head that went away mid-body) leaves the file that was there.

The CLI used to open FILE with O_TRUNC before asking the head anything, and to unlink it on
any failure: a refresh of weights.bin whose blob had expired deleted weights.bin, and a
FILE that was a symbolic link or a device (/dev/null, as root) was removed.  One head for
the class; nothing waits on a timer.

Two uploads of one level race: the one that finishes first wins, and the other is told
that another upload was committed while its body was sent, rather than only "expected 3,
got 2", which reads as its own mistake.
"""
import os
import socket
import stat
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


class CutReply:
    """A TCP proxy to a head that passes every request on and the first `keep` bytes of
    the reply (its head and the start of its body), then closes the client's connection:
    a head that died mid-download, as the client sees it."""

    def __init__(self, port, keep):
        self.port, self.keep = port, keep
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.url = "http://127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            head = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._to_head, args=(client, head), daemon=True).start()
            threading.Thread(target=self._to_client, args=(client, head), daemon=True).start()

    @staticmethod
    def _to_head(client, head):
        while True:
            try:
                data = client.recv(65536)
                if not data:
                    return
                head.sendall(data)
            except OSError:
                return

    def _to_client(self, client, head):
        sent = 0
        while sent < self.keep:
            data = head.recv(min(65536, self.keep - sent))
            if not data:
                break
            client.sendall(data)
            sent += len(data)
        client.shutdown(socket.SHUT_RDWR)
        client.close()
        head.close()


class SharedWalkTest(harness.CliHead, unittest.TestCase):
    def put(self, scope, name, data, *args):
        path = os.path.join(self.cwd, "upload.bin")
        with open(path, "wb") as f:
            f.write(data)
        self.ok("shared", "put", scope, name, path, *args)

    def path(self, name):
        return os.path.join(self.cwd, name)

    def leftovers(self):
        return sorted(n for n in os.listdir(self.cwd) if n.endswith(".part"))

    def read(self, name):
        with open(self.path(name), "rb") as f:
            return f.read()

    def test_a_failed_get_leaves_the_file_as_it_was(self):
        weights = self.path("weights.bin")
        with open(weights, "wb") as f:
            f.write(b"level 1, kept locally")
        os.chmod(weights, 0o640)
        err = self.fails(1, "shared", "get", "walk-models", "weights", weights)
        self.assertEqual(err, "muster: shared_not_found: shared data not found: 'weights' in "
                         "scope 'walk-models' ('weights' was never set, or was deleted)\n")
        self.assertEqual(self.read("weights.bin"), b"level 1, kept locally")
        self.assertEqual(stat.S_IMODE(os.stat(weights).st_mode), 0o640)
        # A level the head never made: the file stays too.
        data = os.urandom(300_000)
        self.put("walk-models", "weights", data)
        self.fails(1, "shared", "get", "walk-models", "weights", weights, "--level", "2")
        self.assertEqual(self.read("weights.bin"), b"level 1, kept locally")
        # A download that succeeds replaces it, with the permission bits it had.
        self.ok("shared", "get", "walk-models", "weights", weights)
        self.assertEqual(self.read("weights.bin"), data)
        self.assertEqual(stat.S_IMODE(os.stat(weights).st_mode), 0o640)
        self.assertEqual(self.leftovers(), [])
        # A new file gets 0666 less the umask (the CLI's own is 022 here).
        self.ok("shared", "get", "walk-models", "weights", self.path("new.bin"))
        self.assertEqual(self.read("new.bin"), data)
        self.assertEqual(stat.S_IMODE(os.stat(self.path("new.bin")).st_mode), 0o666 & ~0o022)

    def test_a_link_is_written_through_and_a_device_written_into(self):
        data = os.urandom(70_000)
        self.put("walk-links", "table", data)
        link, target = self.path("table-link"), self.path("table-target")
        os.symlink("table-target", link)  # dangling: its target does not exist yet
        self.fails(1, "shared", "get", "walk-links", "nope", link)
        self.assertTrue(os.path.islink(link))
        self.assertFalse(os.path.exists(target))  # nothing made for a failed download
        self.ok("shared", "get", "walk-links", "table", link)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(self.read("table-target"), data)
        with open(target, "wb") as f:
            f.write(b"old table")
        self.fails(1, "shared", "get", "walk-links", "nope", link)
        self.assertEqual((os.path.islink(link), self.read("table-target")), (True, b"old table"))
        self.ok("shared", "get", "walk-links", "table", link)
        self.assertEqual(self.read("table-target"), data)
        # A FIFO cannot be replaced: it is written into, and a failure leaves it there.
        fifo = self.path("table-fifo")
        os.mkfifo(fifo)
        got = []

        def read_fifo():
            with open(fifo, "rb") as f:
                got.append(f.read())

        reader = threading.Thread(target=read_fifo)
        reader.start()
        self.ok("shared", "get", "walk-links", "table", fifo)
        reader.join()
        self.assertEqual(got, [data])
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        err = self.fails(1, "shared", "get", "walk-links", "table", self.cwd)
        self.assertEqual(err, "muster: cannot open %s: Is a directory\n" % self.cwd)
        self.assertEqual(self.leftovers(), [])

    def test_a_download_cut_short_says_to_read_it_again(self):
        data = os.urandom(1 << 20)
        self.put("walk-cut", "weights", data)
        weights = self.path("cut.bin")
        with open(weights, "wb") as f:
            f.write(b"the old weights")
        proxy = CutReply(self.head.port, keep=100_000)
        try:
            err = self.fails(1, "shared", "get", "walk-cut", "weights", weights, url=proxy.url)
            self.assertEqual(self.read("cut.bin"), b"the old weights")
            self.assertEqual(self.leftovers(), [])
            self.assertRegex(err, r"^muster: network: GET %s/v1/shared/walk-cut/weights: "
                             % proxy.url)
            # A read is safe to repeat: no "check what the head did before repeating it".
            self.assertRegex(err, r"\nmuster: the download broke off after \d+ of its 1048576 "
                             r"bytes \(the head at %s may have stopped or restarted\); the file "
                             r"was left as it was: read it again\n$" % proxy.url)
            env = harness.cli_env(self.head)
            env["MUSTER_URL"] = proxy.url
            r = subprocess.run([harness.MUSTER_BIN, "shared", "get", "walk-cut", "weights"],
                               capture_output=True, env=env, timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertLess(len(r.stdout), len(data))
            self.assertIn(b"; what reached stdout is incomplete: read it again\n", r.stderr)
        finally:
            proxy.close()
        self.ok("shared", "get", "walk-cut", "weights", weights)
        self.assertEqual(self.read("cut.bin"), data)

    def test_the_loser_of_two_uploads_of_one_level_is_told_why(self):
        self.put("walk-race", "w", b"level 1")
        body = os.urandom(300_000)
        slow = socket.create_connection(("127.0.0.1", self.head.port))
        self.addCleanup(slow.close)
        slow.sendall(b"PUT /v1/shared/walk-race/w?level=2 HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer %s\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: %d\r\n\r\n" % (self.head.token.encode(), len(body)))
        slow.sendall(body[:100_000])
        tmp = os.path.join(self.head.data_dir, "shared", "tmp")
        harness.wait_until(lambda: os.listdir(tmp) != [], what="the slow upload's temp file")
        # Accepted (its level checked), its body under way: another level 2 goes first.
        self.put("walk-race", "w", b"the winner", "--level", "2")
        slow.sendall(body[100_000:])
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}\n"):
            data = slow.recv(65536)
            if not data:
                break
            reply += data
        self.assertTrue(reply.startswith(b"HTTP/1.1 409 "), reply)
        self.assertIn(b'"message":"update level mismatch: expected 3, got 2 (another upload of '
                      b"'w' was committed while this one's body was sent, and the first to "
                      b'finish wins: nothing of this upload was stored)"', reply)
        self.assertEqual(self.head.request("GET", "/v1/shared/walk-race/w").raw, b"the winner")
        harness.wait_until(lambda: os.listdir(tmp) == [], what="the loser's temp file removed")


if __name__ == "__main__":
    unittest.main()
