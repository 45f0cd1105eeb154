"""A coordinated sampler rank (muster.coordinated.CoordinatedRankSampler, the engine of
muster.torch.DistributedSampler(coordinated=True)) outlasts its head: a `next` whose
reply was lost is sent again with "held" and gets its block back (without it the block
stayed leased to the rank and the epoch never ended), an ack is sent again and answered
as a repeat, a create (or a resume's) whose reply was lost or answered 503 is sent again
and joins, and a head killed mid-epoch and restarted is waited for.  Every index of
the epoch is read exactly once, and the rank logs one warning per outage and one line
when the head answers again (docs/python.md, "Coordinated sampler")."""
import logging
import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402
from muster.coordinated import CoordinatedRankSampler  # noqa: E402

N = 60
CONFIG = {"dataset": {"num_samples": N}, "seed": 3, "shuffle": "global",
          "strategy": "dynamic", "world_size": 1, "block_size": 4, "epochs": 1}


class Signal(logging.Handler):
    """Sets `event` when a record of `level` comes (the test acts on the rank's warning,
    not after a guessed delay)."""

    def __init__(self, level):
        super().__init__(level)
        self.event = threading.Event()

    def emit(self, record):
        self.event.set()


class SamplerRestartTest(harness.RestartableHeadCase):
    def sampler(self, url, name, wait=True):
        client = muster.Client(url, self.head.token)
        self.addCleanup(client.close)
        return CoordinatedRankSampler(client, name, CONFIG, 0, wait=wait)

    def status(self, name):
        return muster.Client(self.head.url, self.head.token).iteration(name)

    def test_a_next_whose_reply_was_lost_is_sent_again_with_held(self):
        # The second next reaches the head, which leases a block, but its reply is lost.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path.endswith("/next"),
            lambda n: "drop" if n == 2 else "forward")
        # wait=False: were the lost block not sent again, the rank would be told to wait
        # for it (it is its own, leased) and end its epoch short, not hang.
        s = self.sampler(self.proxy.url, "lost", wait=False)
        with self.assertLogs("muster.iteration", level="INFO") as logs:
            got = list(s)
        self.assertEqual(sorted(got), list(range(N)))
        st = self.status("lost")
        self.assertEqual((st["finished"], st["ranks"][0]["blocks"]), (True, N // 4))
        self.assertEqual([r.levelname for r in logs.records], ["WARNING", "INFO"])
        self.assertIn("leasing a block failed", logs.records[0].getMessage())

    def test_an_ack_whose_reply_was_lost_is_sent_again(self):
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path.endswith("/ack"),
            lambda n: "drop" if n == 3 else "forward")
        s = self.sampler(self.proxy.url, "ack")
        with self.assertLogs("muster.iteration", level="INFO"):
            got = list(s)
        self.assertEqual(sorted(got), list(range(N)))
        self.assertEqual(self.status("ack")["ranks"][0]["blocks"], N // 4)
        self.assertEqual(self.proxy.count, N // 4 + 1)  # one ack sent twice

    def test_a_create_whose_reply_was_lost_joins_what_it_made(self):
        # The head makes the iteration, the reply is lost: sent again, the create joins it.
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/iterations",
            lambda n: "drop" if n == 1 else "forward")
        s = self.sampler(self.proxy.url, "open")
        with self.assertLogs("muster.iteration", level="INFO") as logs:
            got = list(s)
        self.assertEqual(sorted(got), list(range(N)))
        self.assertEqual(self.proxy.count, 2)
        self.assertEqual([r.levelname for r in logs.records], ["WARNING", "INFO"])
        self.assertIn("creating or joining the iteration failed", logs.records[0].getMessage())

    def test_a_resume_whose_create_was_answered_503_is_sent_again(self):
        # A rank resumes from a state while what stands before the head answers 503 twice:
        # it joins the restored iteration, and the two runs read every index once.
        first = self.sampler(self.head.url, "resume")
        it = iter(first)
        got = [next(it) for _ in range(10)]  # mid-block
        state = first.state_dict()
        unavailable = {"error": {"code": "unavailable", "message": "the head is unreachable"}}
        self.proxy = harness.RequestProxy(
            self.head, lambda method, path: method == "POST" and path == "/v1/iterations",
            lambda n: (503, unavailable) if n <= 2 else "forward")
        second = self.sampler(self.proxy.url, "resume")
        second.load_state_dict(state)
        with self.assertLogs("muster.iteration", level="INFO"):
            got += list(second)
        self.assertEqual(sorted(got), list(range(N)))
        self.assertEqual(self.proxy.count, 3)

    def test_a_head_killed_mid_epoch_is_waited_for(self):
        s = self.sampler(self.head.url, "kill")
        it = iter(s)
        got = [next(it) for _ in range(10)]  # mid-block: block 2 is being read
        self.head.kill()
        warned = Signal(logging.WARNING)

        def restart():
            if warned.event.wait(60):
                self.head.start()

        helper = threading.Thread(target=restart)
        helper.start()
        with self.assertLogs("muster.iteration", level="INFO") as logs:
            # Beside assertLogs' handler, which replaces the logger's own.
            logging.getLogger("muster.iteration").addHandler(warned)
            try:
                got += list(it)
            finally:
                warned.event.set()  # the helper ends, whatever happened
        helper.join()
        self.assertEqual(sorted(got), list(range(N)))
        self.assertEqual(self.status("kill")["ranks"][0]["blocks"], N // 4)
        self.assertEqual([r.levelname for r in logs.records], ["WARNING", "INFO"])

    def test_a_head_that_stays_down_ends_the_rank_after_head_wait_s(self):
        s = self.sampler(self.head.url, "gone")
        s.head_wait_s = 0.5
        it = iter(s)
        next(it)
        self.head.kill()
        with self.assertLogs("muster.iteration", level="WARNING"):
            with self.assertRaises(muster.errors.NetworkError):
                list(it)


if __name__ == "__main__":
    unittest.main(verbosity=2)
