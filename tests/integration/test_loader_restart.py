"""libmuster's coordinated loader outlasts its head: an open (create or join) whose reply
was lost or that was answered 503 is sent again and joins; a `next` whose reply was lost is sent
again with "held" and gets its blocks back, skipping those it has already (without it the
blocks stayed leased to the rank and the epoch never ended; without the skip they were
read twice); an ack whose reply was lost is sent again and answered as a repeat, one
answered 503 (unavailable) by what stands in front of the head is sent again; a head
killed mid-epoch is waited for, also by a checkpoint; a head that stays down ends the rank
after opts.head_wait_ms with an error that says so.  Every index of the epoch is read
exactly once.  The rank is tests/integration/driver_loader.c (one line per index; it says
"retrying" when it first sends a request again, and the test acts on that)."""
import json
import os
import queue
import subprocess
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402

N, BLOCK = 60, 4
DRIVER = os.path.join(os.environ.get("MUSTER_BUILD_DIR") or os.path.dirname(harness.MUSTER_BIN),
                      "driver_loader")


class Rank:
    """A driver_loader process; its lines are read by a thread.  Prefetch 8 with two
    blocks per request: when the loader asks for more, it holds blocks not yet
    acknowledged, which a retry's reply lists again."""

    def __init__(self, url, token, name, head_wait_ms=600000, pause_after=0):
        self.proc = subprocess.Popen(
            [DRIVER, url, token, name, str(N), str(BLOCK), "8", "2", str(head_wait_ms),
             str(pause_after)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.indices = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word, timeout=60):
        """Reads lines (indices kept) up to the first that starts with `word`."""
        while True:
            line = self.lines.get(timeout=timeout)
            if line is None:
                raise AssertionError("the rank exited before %r" % word)
            if line.isdigit():
                self.indices.append(int(line))
            elif line.startswith(word):
                return line

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self):
        """The "end" line as (error, acked, retries, message), after the exit."""
        end = self.expect("end").split(" ", 4)
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.lines.get(timeout=60)  # the reader thread saw the end of the output
        return end[1], int(end[2].split("=")[1]), int(end[3].split("=")[1]), end[4]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if not f.closed:
                f.close()


class LoaderRestartTest(harness.RestartableHeadCase):
    def rank(self, url, name, **kw):
        r = Rank(url, self.head.token, name, **kw)
        self.addCleanup(r.kill)
        return r

    def assert_read_once(self, rank, name):
        error, _, retries, message = rank.finish()
        self.assertEqual((error, rank.proc.returncode), ("ok", 0), message)
        self.assertGreaterEqual(retries, 1)
        self.assertEqual(sorted(rank.indices), list(range(N)))
        client = muster.Client(self.head.url, self.head.token)
        self.addCleanup(client.close)
        st = client.iteration(name)
        self.assertEqual((st["finished"], st["ranks"][0]["blocks"]), (True, N // BLOCK))

    def test_a_next_whose_reply_was_lost_is_sent_again_with_held(self):
        # The second next leases two blocks at the head; its reply is lost.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path.endswith("/next"),
            lambda n: "drop" if n == 2 else "forward")
        self.assert_read_once(self.rank(self.proxy.url, "lost-next"), "lost-next")

    def test_an_ack_whose_reply_was_lost_is_sent_again(self):
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path.endswith("/ack"),
            lambda n: "drop" if n == 2 else "forward")
        self.assert_read_once(self.rank(self.proxy.url, "lost-ack"), "lost-ack")

    def test_an_ack_the_head_could_not_take_is_sent_again(self):
        # A node agent or proxy in front of the head answers 503: the ack never reached
        # the head, and only sending it again ends the epoch.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path.endswith("/ack"),
            lambda n: harness.UNAVAILABLE if n in (2, 3) else "forward")
        self.assert_read_once(self.rank(self.proxy.url, "503-ack"), "503-ack")

    def test_an_open_whose_reply_was_lost_joins_what_it_created(self):
        # The create reaches the head, which makes the iteration; its reply is lost.  Sent
        # again, it joins that iteration as any other rank would.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/iterations",
            lambda n: "drop" if n == 1 else "forward")
        self.assert_read_once(self.rank(self.proxy.url, "lost-open"), "lost-open")
        self.assertEqual(self.proxy.count, 2)

    def test_an_open_answered_503_is_sent_again(self):
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/iterations",
            lambda n: harness.UNAVAILABLE if n <= 3 else "forward")
        self.assert_read_once(self.rank(self.proxy.url, "503-open"), "503-open")
        self.assertEqual(self.proxy.count, 4)

    def test_an_open_the_head_never_answers_fails_after_head_wait_ms(self):
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/iterations",
            lambda n: harness.UNAVAILABLE)
        r = self.rank(self.proxy.url, "never", head_wait_ms=300)
        error, _, _, message = r.finish()
        self.assertEqual((error, r.proc.returncode), ("unavailable", 1))
        self.assertIn("the head is unreachable", message)
        self.assertIn("opts.head_wait_ms", message)
        self.assertGreater(self.proxy.count, 2)  # at once, then after pauses

    def test_a_head_killed_mid_epoch_is_waited_for(self):
        r = self.rank(self.head.url, "kill", pause_after=10)
        r.expect("paused")
        self.head.kill()
        r.send("go")
        r.expect("retrying")
        self.head.start()
        self.assert_read_once(r, "kill")

    def test_a_checkpoint_waits_for_a_head_that_restarts(self):
        r = self.rank(self.head.url, "ck", pause_after=10)
        r.expect("paused")
        self.head.kill()
        r.send("checkpoint")
        r.expect("retrying")
        self.head.start()
        line = r.expect("checkpoint")
        self.assertTrue(line.startswith("checkpoint ok "), line)
        ck = json.loads(line[len("checkpoint ok "):])
        self.assertEqual((ck["name"], ck["epoch"]), ("ck", 0))
        # 10 indices taken: the two whole blocks are done, the third (2 of 4) is not.
        self.assertEqual(sum(end - begin for begin, end in ck["done"]), 2)
        r.send("go")
        self.assert_read_once(r, "ck")

    def test_acks_the_rank_gave_up_on_are_sent_at_close(self):
        # The head stays down past head_wait_ms with finished blocks not acknowledged: the
        # rank ends, and its close sends those acks to the head started again meanwhile.
        r = self.rank(self.head.url, "late", head_wait_ms=300, pause_after=10)
        r.expect("paused")
        self.head.kill()
        r.send("go")
        self.assertTrue(r.expect("end").startswith("end network "))
        self.head.start()
        r.send("close")
        r.expect("closed")
        self.assertGreater(len(r.indices), 2 * BLOCK)  # blocks finished while it was down
        client = muster.Client(self.head.url, self.head.token)
        self.addCleanup(client.close)
        self.assertEqual(client.iteration("late")["ranks"][0]["blocks"], len(r.indices) // BLOCK)

    def test_a_head_that_stays_down_ends_the_rank_after_head_wait_ms(self):
        r = self.rank(self.head.url, "gone", head_wait_ms=300, pause_after=10)
        r.expect("paused")
        self.head.kill()
        r.send("go")
        error, _, retries, message = r.finish()
        self.assertEqual((error, r.proc.returncode), ("network", 1))
        self.assertGreaterEqual(retries, 1)
        self.assertIn(self.head.url, message)
        self.assertIn("opts.head_wait_ms", message)


if __name__ == "__main__":
    unittest.main(verbosity=2)
