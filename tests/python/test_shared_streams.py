"""client.shared with files: uploads read as they are sent, downloads written as they
arrive and checked against the level's checksum (docs/python.md, "Shared data")."""
import filecmp
import io
import json
import os
import pathlib
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

from common import ROOT, HeadTestCase, harness, muster
from muster import _continue, _xxh64
from test_client import ScriptedServer

sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import node_harness  # noqa: E402

MIB = 1 << 20
SCOPE = "pytest-files"


def write_random(path, size, seed=1):
    """A file of ``size`` pseudo-random bytes, written a MiB at a time."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for start in range(0, size, MIB):
            f.write(rng.randbytes(min(MIB, size - start)))


# The child of the memory test: uploads SRC from a path and downloads it to DEST with a
# client of its own, and says how far its peak resident memory grew meanwhile.
MEMORY_CHILD = r"""
import json, pathlib, resource, sys
sys.path.insert(0, sys.argv[1])
import muster
url, token, src, dest = sys.argv[2:6]
c = muster.Client(url, token)
c.shared.set("pytest-files", "warm-up", b"x" * 1000)   # imports, connection, hasher
c.shared.get_to("pytest-files", "warm-up", dest + ".warm-up")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
put = c.shared.set("pytest-files", "big", pathlib.Path(src))
info = c.shared.get_to("pytest-files", "big", dest)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"put": put, "info": info, "grew_kib": grew}))
"""


class Checksum(unittest.TestCase):
    """XXH64, the ETag of a level: the pure-Python one against known values and
    libxxhash, fed in pieces of any size."""

    def test_known_values_and_libxxhash(self):
        self.assertEqual(_xxh64.XXH64().hexdigest(), "ef46db3751d8e999")  # XXH64("", 0)
        lib = _xxh64._load_library()
        if lib is None:
            self.skipTest("no libxxhash to compare with")
        rng = random.Random(7)
        for size in list(range(0, 80)) + [1000, 4096 + 17, 70001, 300000]:
            data = rng.randbytes(size)
            pure, fast = _xxh64.XXH64(), _xxh64._LibXXH64(lib)
            at = 0
            while at < size:
                step = rng.randint(1, 40 if size < 1000 else 70000)
                pure.update(data[at:at + step])
                at += step
            fast.update(data)
            self.assertEqual(pure.hexdigest(), fast.hexdigest(), "%d bytes" % size)
            fast.close()

    def test_any_bytes_like_object_is_hashed_whole(self):
        # libxxhash's update was given len() of the object, which for a memoryview of
        # 4-byte items counts items: it hashed the first quarter of the bytes.
        import array
        words = array.array("I", range(1000))
        want = _xxh64.XXH64()
        want.update(words.tobytes())
        for hasher in (_xxh64.hasher(), _xxh64.XXH64()):
            hasher.update(memoryview(words))
            self.assertEqual((type(hasher).__name__, hasher.hexdigest()),
                             (type(hasher).__name__, want.hexdigest()))
            hasher.close()

    def test_threads_that_hash_first_at_once_all_get_libxxhash(self):
        # A thread that asked for a hasher while another was still loading libxxhash got
        # the pure-Python XXH64 (the module said "none" during the search): its download
        # hashed at 40 MiB/s instead of gigabytes a second.
        import ctypes
        if _xxh64._load_library() is None:
            self.skipTest("no libxxhash")
        real_cdll, loading, go, arrived = ctypes.CDLL, threading.Event(), threading.Event(), \
            threading.Event()

        def slow_cdll(*args, **kwargs):   # the first thread's search, held until `go`
            loading.set()
            self.assertTrue(go.wait(30))
            return real_cdll(*args, **kwargs)

        class SpyLock:   # says when the second thread waits for the first one's search
            def __init__(self):
                self.lock = threading.Lock()

            def __enter__(self):
                if threading.current_thread().name == "second":
                    arrived.set()
                return self.lock.__enter__()

            def __exit__(self, *exc):
                return self.lock.__exit__(*exc)

        got = {}

        def hash_in(name):
            got[name] = _xxh64.hasher()

        with mock.patch.object(_xxh64, "_library", None), \
                mock.patch.object(_xxh64, "_library_lock", SpyLock(), create=True), \
                mock.patch("ctypes.CDLL", slow_cdll):
            threads = [threading.Thread(target=hash_in, args=(n,), name=n)
                       for n in ("first", "second")]
            threads[0].start()
            self.assertTrue(loading.wait(30))
            threads[1].start()
            harness.wait_until(lambda: arrived.is_set() or not threads[1].is_alive(),
                               what="the second thread to wait for the search or to finish")
            go.set()
            for t in threads:
                t.join(30)
        self.assertEqual({n: type(h).__name__ for n, h in got.items()},
                         {"first": "_LibXXH64", "second": "_LibXXH64"})
        for h in got.values():
            h.close()


class FilesTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp(prefix="muster-shared-files-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_a_large_blob_goes_from_a_file_and_to_a_path_in_little_memory(self):
        """64 MiB uploaded from a path and downloaded to one by a process whose peak
        memory grows by less than a quarter of it (reading the file, or the body, whole
        would grow it by the blob)."""
        size = 64 * MIB
        src, dest = self.path("src.bin"), self.path("dest.bin")
        write_random(src, size)
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, os.path.join(ROOT, "python"),
                              self.head.url, self.head.token, src, dest],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr)
        got = json.loads(out.stdout)
        self.assertEqual((got["put"]["level"], got["put"]["size"]), (1, size))
        self.assertEqual(got["info"], {"level": 1, "etag": got["put"]["checksum"],
                                       "expires_ms": got["info"]["expires_ms"], "size": size})
        self.assertTrue(filecmp.cmp(src, dest, shallow=False))
        self.assertLess(got["grew_kib"] * 1024, size // 4, "peak memory grew by %d KiB"
                        % got["grew_kib"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["dest.bin", "dest.bin.warm-up",
                                                        "src.bin"])

    def test_file_objects_and_a_pipe(self):
        """A binary file object is sent from its position; a pipe, whose size is not
        known, goes chunked; get_to writes into a file object."""
        data = random.Random(3).randbytes(3 * MIB + 5)
        f = io.BytesIO(b"skip" + data)
        f.seek(4)
        self.assertEqual(self.c.shared.set(SCOPE, "obj", f)["size"], len(data))
        self.assertEqual(f.tell(), 4 + len(data))
        out = io.BytesIO(b"x")
        out.seek(1)
        info = self.c.shared.get_to(SCOPE, "obj", out)
        self.assertEqual((out.getvalue(), info["size"], info["level"]), (b"x" + data, len(data), 1))
        read_end, write_end = os.pipe()
        writer = threading.Thread(target=self.feed, args=(write_end, data))
        writer.start()
        with open(read_end, "rb") as pipe:
            reply = self.c.shared.update(SCOPE, "obj", pipe, level=2)
        writer.join()
        self.assertEqual((reply["level"], reply["size"]), (2, len(data)))
        self.assertEqual(self.c.shared.get(SCOPE, "obj"), data)

    def test_a_file_object_over_another_file_sends_its_own_bytes(self):
        # gzip.open(path, "rb") is a binary file whose fileno() is the compressed file's:
        # its size was taken for the body's, and the upload failed saying that the file
        # "changed size while it was sent".  Such a file goes chunked, its bytes whole.
        import bz2
        import gzip
        import lzma
        data = random.Random(4).randbytes(200000) + b"z" * 300000
        for level, opener in enumerate((gzip.open, bz2.open, lzma.open), start=1):
            src = self.path("packed.%d" % level)
            with opener(src, "wb") as f:
                f.write(data)
            with opener(src, "rb") as f:
                self.assertEqual(f.read(7), data[:7])   # sent from its position
                reply = (self.c.shared.set if level == 1 else self.c.shared.update)(
                    SCOPE, "packed", f, level=level)
            self.assertEqual((reply["level"], reply["size"]), (level, len(data) - 7), opener)
            self.assertEqual(self.c.shared.get(SCOPE, "packed", level=level), data[7:])

    @staticmethod
    def feed(fd, data):
        with open(fd, "wb") as f:
            for start in range(0, len(data), 100000):
                f.write(data[start:start + 100000])

    def test_a_str_is_text_and_a_path_is_a_file(self):
        src = self.path("text.txt")
        with open(src, "wb") as f:
            f.write(b"the file's bytes")
        self.c.shared.set(SCOPE, "str", src)
        self.assertEqual(self.c.shared.get(SCOPE, "str"), src.encode())
        self.c.shared.update(SCOPE, "str", pathlib.Path(src), level=2)
        self.assertEqual(self.c.shared.get(SCOPE, "str"), b"the file's bytes")
        dest = self.path("out")
        self.c.shared.get_to(SCOPE, "str", dest, level=1)  # a str dest is a path
        with open(dest, "rb") as f:
            self.assertEqual(f.read(), src.encode())

    def test_bad_arguments_are_refused_before_anything_is_sent(self):
        """Against a port where nothing listens: a request would raise NetworkError."""
        c = muster.Client("http://127.0.0.1:%d" % harness.free_port(), "t")
        src = self.path("src")
        with open(src, "wb") as f:
            f.write(b"abc")
        with open(src, "r") as text, self.assertRaises(TypeError) as cm:
            c.shared.set(SCOPE, "a", text)
        self.assertIn("data: %r is open in text mode ('r')" % src, str(cm.exception))
        with open(src, "ab") as wrong, self.assertRaises(ValueError) as cm:
            c.shared.set(SCOPE, "a", wrong)
        self.assertIn("data: the file is not open for reading", str(cm.exception))
        closed = open(src, "rb")
        closed.close()
        with self.assertRaisesRegex(ValueError, "data: the file is closed"):
            c.shared.set(SCOPE, "a", closed)
        with self.assertRaises(FileNotFoundError) as cm:
            c.shared.set(SCOPE, "a", pathlib.Path(self.path("missing")))
        self.assertIn("data: cannot open the file to upload as shared data 'a'", str(cm.exception))
        self.assertEqual(cm.exception.filename, self.path("missing"))
        with self.assertRaises(FileNotFoundError) as cm:
            c.shared.get_to(SCOPE, "a", self.path("no-dir/out"))
        self.assertIn("dest: cannot create a file beside it", str(cm.exception))
        with self.assertRaisesRegex(IsADirectoryError, "dest: a directory"):
            c.shared.get_to(SCOPE, "a", self.dir)
        with open(self.path("t"), "w") as text, self.assertRaisesRegex(TypeError, "dest: .*text"):
            c.shared.get_to(SCOPE, "a", text)
        with self.assertRaisesRegex(TypeError, "dest: expected a path .* got int"):
            c.shared.get_to(SCOPE, "a", 3)
        self.assertEqual(sorted(os.listdir(self.dir)), ["src", "t"])

    def test_get_to_writes_through_a_symbolic_link(self):
        """A link to a file: the file gets the bytes (its temporary file beside it, in its
        own directory), the link stays; a dangling link's target is created; a loop of
        links is refused as open() refuses it."""
        self.c.shared.set(SCOPE, "linked", b"the new bytes")
        os.mkdir(self.path("real"))
        with open(self.path("real/file"), "wb") as f:
            f.write(b"old")
        os.symlink("real/file", self.path("link"))
        os.symlink("link", self.path("link-to-link"))
        for link in ("link", "link-to-link"):
            info = self.c.shared.get_to(SCOPE, "linked", pathlib.Path(self.path(link)))
            self.assertEqual(info["size"], 13)
            self.assertTrue(os.path.islink(self.path(link)))
            with open(self.path("real/file"), "rb") as f:
                self.assertEqual(f.read(), b"the new bytes")
        os.symlink("real/made", self.path("dangling"))
        self.c.shared.get_to(SCOPE, "linked", self.path("dangling"))
        self.assertEqual(os.readlink(self.path("dangling")), "real/made")
        with open(self.path("real/made"), "rb") as f:
            self.assertEqual(f.read(), b"the new bytes")
        os.symlink("loop-b", self.path("loop-a"))
        os.symlink("loop-a", self.path("loop-b"))
        with self.assertRaises(OSError) as cm:
            self.c.shared.get_to(SCOPE, "linked", self.path("loop-a"))
        self.assertIn("dest: cannot create a file beside it", str(cm.exception))
        self.assertEqual(sorted(os.listdir(self.dir)), ["dangling", "link", "link-to-link",
                                                        "loop-a", "loop-b", "real"])
        self.assertEqual(sorted(os.listdir(self.path("real"))), ["file", "made"])

    def test_get_to_writes_into_a_fifo(self):
        """A device or a FIFO is written into, as open() writes into it, not replaced by a
        file.  (/dev/null is not tried: replaced, as root, it would break the machine.)"""
        self.c.shared.set(SCOPE, "fifo", b"through the pipe")
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # the writer's open need not wait
        self.addCleanup(os.close, reader)
        self.assertEqual(self.c.shared.get_to(SCOPE, "fifo", fifo)["size"], 16)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        self.assertEqual(os.read(reader, 65536), b"through the pipe")
        self.assertEqual(os.listdir(self.dir), ["fifo"])

    def test_get_to_gives_a_file_the_mode_open_would(self):
        """A new file gets 0666 less the umask; one that is replaced keeps its
        permission bits (as cp and a shell's > do), even some the umask would not give."""
        self.c.shared.set(SCOPE, "mode", b"bytes")
        old_umask = os.umask(0o027)
        try:
            self.c.shared.get_to(SCOPE, "mode", self.path("new"))
            for mode in (0o600, 0o755):
                with open(self.path("old"), "wb"):
                    pass
                os.chmod(self.path("old"), mode)
                self.c.shared.get_to(SCOPE, "mode", self.path("old"))
                self.assertEqual(oct(os.stat(self.path("old")).st_mode & 0o7777), oct(mode))
        finally:
            os.umask(old_umask)
        self.assertEqual(oct(os.stat(self.path("new")).st_mode & 0o7777), oct(0o640))

    def test_a_file_that_changes_size_while_sent_stores_nothing(self):
        src = self.path("changing")
        write_random(src, 3 * MIB)
        for change, message in ((lambda f: f.truncate(MIB + MIB // 2),
                                 "ended after %d" % (MIB + MIB // 2)),
                                (lambda f: f.write(b"more"), "has more now")):
            with self.subTest(message=message):
                reader = ChangingReader(src, change)
                with self.assertRaises(OSError) as cm:
                    self.c.shared.set(SCOPE, "changing", reader)
                self.assertNotIsInstance(cm.exception, muster.MusterError)
                self.assertIn("shared data 'changing' in scope %r changed size while it was "
                              "sent: it had %d bytes when the upload began and %s; nothing "
                              "was stored" % (SCOPE, 3 * MIB, message), str(cm.exception))
                with self.assertRaises(muster.SharedNotFound):
                    self.c.shared.get(SCOPE, "changing")
                write_random(src, 3 * MIB)

    def test_truncated_or_corrupt_bodies_raise_and_leave_the_path_as_it_was(self):
        data = random.Random(5).randbytes(2 * MIB)
        self.c.shared.set(SCOPE, "checked", data)
        half = len(data) // 2

        def cut(pieces):
            sent = 0
            for piece in pieces:
                if sent + len(piece) >= half:
                    yield piece[:half - sent]
                    return
                sent += len(piece)
                yield piece

        def flip(pieces):
            for i, piece in enumerate(pieces):
                yield bytes([piece[0] ^ 1]) + piece[1:] if i == 0 else piece

        plan = {1: cut, 2: flip, 3: flip, 4: "forward", 5: cut}
        proxy = harness.RequestProxy(self.head, lambda m, p: p.endswith("/checked"), plan.get)
        self.addCleanup(proxy.close)
        c = muster.Client(proxy.url, self.head.token)
        dest = self.path("dest")
        with open(dest, "wb") as f:
            f.write(b"before")
        with self.assertRaises(muster.NetworkError) as cm:
            c.shared.get_to(SCOPE, "checked", dest)
        self.assertIn("shared data 'checked' in scope %r: the body ended after %d of its %d "
                      "bytes" % (SCOPE, half, len(data)), str(cm.exception))
        with self.assertRaises(muster.ProtocolError) as cm:
            c.shared.get_to(SCOPE, "checked", dest)
        self.assertIn("the bytes of shared data 'checked' in scope %r do not match their "
                      "checksum" % SCOPE, str(cm.exception))
        self.assertEqual(os.listdir(self.dir), ["dest"])
        with open(dest, "rb") as f:
            self.assertEqual(f.read(), b"before")
        with self.assertRaises(muster.ProtocolError):
            c.shared.get(SCOPE, "checked")
        self.assertEqual(c.shared.get_to(SCOPE, "checked", dest)["size"], len(data))
        with open(dest, "rb") as f:
            self.assertEqual(f.read(), data)
        with self.assertRaises(muster.NetworkError) as cm:   # get says it in the same words
            c.shared.get(SCOPE, "checked")
        self.assertIn("shared data 'checked' in scope %r: the body ended after %d of its %d "
                      "bytes" % (SCOPE, half, len(data)), str(cm.exception))
        self.assertEqual(proxy.count, 5)

    def test_an_upload_sent_again_on_a_new_connection_starts_from_the_file_start(self):
        """A PUT whose reused connection closed without a reply goes again, from the
        file's first byte; a pipe, which cannot go back, says so instead once it was
        sent, by a server that ignores Expect or one that answers 100 Continue.  A pipe's
        upload (of a size not known in advance) waits for the 100 before its body: when
        the connection closes before that, nothing was read and it goes again whole."""
        reply = json.dumps({"level": 1}).encode()
        srv = ScriptedServer([b'{"blobs": []}', None], [reply])
        c = muster.Client(srv.url, "token-123456", timeout=10)
        c.shared.list(SCOPE)
        self.assertEqual(c.shared.set(SCOPE, "again", io.BytesIO(b"0123456789")), {"level": 1})
        self.assertEqual(srv.bodies[1:], [b"0123456789", b"0123456789"])
        for answer_continue in (False, True):
            srv = ScriptedServer([b'{"blobs": []}', None], [reply],
                                 answer_continue=answer_continue)
            c = muster.Client(srv.url, "token-123456", timeout=10)
            c.shared.list(SCOPE)
            with self.pipe(b"0123456789") as pipe, self.assertRaises(muster.NetworkError) as cm, \
                    mock.patch.object(_continue, "CONTINUE_WAIT_S", 0.1):
                c.shared.set(SCOPE, "again", pipe)
            self.assertIn("a file that cannot seek cannot be sent again", str(cm.exception))
            self.assertEqual(srv.bodies[1:], [b"0123456789"])
            srv.listener.close()
        srv = ScriptedServer([b'{"blobs": []}', ScriptedServer.BEFORE_BODY], [reply],
                             answer_continue=True)
        c = muster.Client(srv.url, "token-123456", timeout=10)
        c.shared.list(SCOPE)
        with self.pipe(b"0123456789") as pipe:
            self.assertEqual(c.shared.set(SCOPE, "again", pipe), {"level": 1})
        self.assertEqual((srv.accepts, len(srv.heads), srv.bodies[1:]), (2, 3, [b"0123456789"]))

    @staticmethod
    def pipe(data):
        """A pipe's read end (a binary file) that gives ``data``, then its end."""
        read_end, write_end = os.pipe()
        os.write(write_end, data)
        os.close(write_end)
        return open(read_end, "rb")

    def test_get_to_through_a_node_agents_cache(self):
        data = random.Random(9).randbytes(MIB + 3)
        self.c.shared.set(SCOPE, "cached", data)
        agent = node_harness.Agent(self.head, self.dir, "pytest-files",
                                   args=["--cache-dir", self.path("cache")]).start()
        self.addCleanup(agent.kill)
        c = muster.Client(agent.url, self.head.token)
        for n in (1, 2):
            info = c.shared.get_to(SCOPE, "cached", self.path("out%d" % n))
            with open(self.path("out%d" % n), "rb") as f:
                self.assertEqual((f.read(), info["size"]), (data, len(data)))
        stats = c.request("GET", "/v1/node/cache")
        self.assertEqual((stats["misses"], stats["hits"]), (1, 1))


class ChangingReader(io.BufferedReader):
    """A file that changes (``change(file open for appending)``) after its first read."""

    def __init__(self, path, change):
        super().__init__(io.FileIO(path, "rb"))
        self.path, self.change = path, change

    def read(self, size=-1):
        piece = super().read(size)
        if self.change is not None:
            with open(self.path, "r+b") as f:
                f.seek(0, os.SEEK_END)
                self.change(f)
            self.change = None
        return piece


if __name__ == "__main__":
    unittest.main()
