"""An iteration ack sent again after its epoch completed (its reply was lost, and another
rank completed the epoch meanwhile) is answered as a repeat, as long as that epoch is the
last completed one: every block of the request under the token and from the rank that
acknowledged it, "repeated" = the blocks of the request, nothing counted twice, also with the epoch left to
default and after a head restart.  Any other element of that epoch is lease_lost, naming
it and what became of its block; once the next epoch completes the retry gets the older
epoch's answer (docs/api.md, "POST /v1/iterations/{name}/ack").

A lost reply is simulated by sending the ack and not looking at its reply: the head did
it, the client heard nothing."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_iter_api import ack, create, lease, status  # noqa: E402


def counted(head, name):
    """What counts blocks: per rank (blocks, samples), the epoch, its done blocks and the
    checkpoint's done ranges."""
    st = status(head, name)
    ck = head.request("GET", "/v1/iterations/%s/checkpoint" % name)
    assert ck.status == 200, ck
    return ([(r["blocks"], r["samples"]) for r in st["ranks"]], st["epoch"],
            st["blocks"]["done"], ck.json["done"])


def lost_then_completed(test, head, name, epochs=3):
    """Rank 0 acks blocks 0 and 1 of epoch 0 and its reply is lost; rank 1 acks blocks 2
    and 3, which completes the epoch (and the iteration, with `epochs` 1).  Returns (rank
    0's blocks, rank 1's blocks, what rank 1's ack answered)."""
    r = create(head, name, dataset={"num_samples": 20}, block_size=5, strategy="dynamic",
               world_size=2, epochs=epochs, rank_timeout_ms=60000)
    test.assertEqual(r.status, 201, r)
    early = lease(head, name, 0, 0, 2)["blocks"]
    ack(head, name, 0, early)  # the reply is lost: rank 0 never reads it
    test.assertEqual(counted(head, name)[0], [(2, 10), (0, 0)])  # but the head counted it
    final = lease(head, name, 1, 0, 2)["blocks"]
    test.assertEqual([b["block"] for b in early + final], [0, 1, 2, 3])
    completed = ack(head, name, 1, final)
    test.assertEqual(completed.json, {"acked": 2, "epoch": 1, "epoch_complete": True,
                                      "finished": epochs == 1})
    return early, final, completed.json


# What rank 0's ack of two blocks answered then, sent again: a repeat.
REPEAT = {"acked": 2, "epoch": 0, "epoch_complete": False, "finished": False, "repeated": 2}
# What counts after epoch 0: 2 blocks of 5 samples per rank, epoch 1 with nothing done.
AFTER_EPOCH_0 = ([(2, 10), (2, 10)], 1, 0, [])


class HeadCase(unittest.TestCase):
    """One head for the class's tests."""

    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head().start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()


class IterRetryTest(HeadCase):

    def test_retry_after_the_epoch_completed(self):
        """The retry of an ack that counted before another rank completed the epoch: 200,
        a repeat, naming epoch 0 or letting the epoch default, whole or in part, also
        after its blocks were leased again in the next epoch; nothing counted twice."""
        h = self.head
        early, _, _ = lost_then_completed(self, h, "lost")
        for epoch in (0, None):  # None: the default, now epoch 1
            r = ack(h, "lost", 0, early, epoch)
            self.assertEqual((r.status, r.json), (200, REPEAT), (epoch, r))
        r = ack(h, "lost", 0, early[1:], 0)
        self.assertEqual((r.status, r.json), (200, dict(REPEAT, acked=1, repeated=1)), r)
        self.assertEqual(counted(h, "lost"), AFTER_EPOCH_0)
        # Blocks 0 and 1 leased again in epoch 1, under new tokens: still a repeat.
        again = lease(h, "lost", 1, 1, 2)["blocks"]
        self.assertEqual([b["block"] for b in again], [0, 1])
        for epoch in (0, None):
            r = ack(h, "lost", 0, early, epoch)
            self.assertEqual((r.status, r.json), (200, REPEAT), (epoch, r))
        self.assertEqual(counted(h, "lost")[0], AFTER_EPOCH_0[0])
        st = status(h, "lost")
        self.assertEqual((st["blocks"]["leased"], st["blocks"]["done"]), (2, 0))

    def test_other_tokens_refused(self):
        """In the completed epoch, a wrong token, a block under the token of another block
        or a block the epoch never leased: lease_lost naming the element and what became
        of the block; all or nothing, nothing counted."""
        h = self.head
        early, final, _ = lost_then_completed(self, h, "wrong")
        wrong = dict(early[0], token=early[0]["token"] + 1000)
        swapped = dict(final[0], block=early[0]["block"])
        never = dict(early[0], block=99)
        other = "the block was acknowledged in it under another token"
        for body, bad, why in (([wrong], 0, other), ([early[1], wrong], 1, other),
                               ([early[0], swapped], 1, other),
                               ([never], 0, "no acknowledgement of the block in it is on "
                                            "record")):
            r = ack(h, "wrong", 0, body, 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            msg = r.json["error"]["message"]
            want = ("blocks[%d]: block %d of epoch 0 under token %d: epoch 0 is complete and %s"
                    % (bad, body[bad]["block"], body[bad]["token"], why))
            self.assertTrue(msg.startswith(want), msg)
            self.assertIn("token %d holds nothing" % body[bad]["token"], msg)
            self.assertNotIn("reply was lost", msg)
        # The epoch left to default names the current one: said of epoch 1.
        r = ack(h, "wrong", 0, [early[0], wrong])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertEqual(r.json["error"]["message"],
                         "blocks[1]: block 0 of epoch 1 is not leased under token %d: it has not "
                         "been leased in this epoch, so there is no lease to acknowledge: "
                         "acknowledge only the blocks a next gave this rank, each with the token "
                         "it came with (check the block and the epoch)" % wrong["token"])
        self.assertEqual(counted(h, "wrong"), AFTER_EPOCH_0)

    def test_repeat_from_another_rank_refused(self):
        """Only the rank that holds a block's lease acknowledges it, and a repeat is a
        retry of the rank that acknowledged the blocks: the same blocks and tokens from
        another rank are lease_lost, naming the block and the rank that
        acknowledged it, in the current epoch and in the last completed one (named or
        left to default); nothing counted, and the right rank's retry is still a repeat."""
        h = self.head
        r = create(h, "ranked", dataset={"num_samples": 20}, block_size=5,
                   strategy="dynamic", world_size=2, epochs=3, rank_timeout_ms=60000)
        self.assertEqual(r.status, 201, r)
        mine = lease(h, "ranked", 0, 0, 2)["blocks"]

        check_rank = ("drop this ack, and check the rank it is sent as (a token is no "
                      "credential another rank may use)")

        def refused_from_rank_1(why):
            before = counted(h, "ranked")
            r = ack(h, "ranked", 1, mine)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertEqual(r.json["error"]["message"],
                             "blocks[0]: block %d of epoch 0 is not leased under token %d: %s; %s"
                             % (mine[0]["block"], mine[0]["token"], why, check_rank))
            self.assertEqual(counted(h, "ranked"), before)

        # A first ack of them from another rank is no ack either: rank 0 holds them.
        refused_from_rank_1("it is leased under that token to rank 0, not 1 (the rank of this "
                            "ack): only the rank that holds a lease acknowledges it, once it has "
                            "read the block")
        self.assertEqual(ack(h, "ranked", 0, mine).status, 200)
        refused_from_rank_1("it was acknowledged under that token by rank 0, not 1 (the rank of "
                            "this ack): rank 0 held that lease and acknowledged it")
        r = ack(h, "ranked", 0, mine)
        self.assertEqual((r.status, r.json.get("repeated")), (200, 2), r)

        early, final, _ = lost_then_completed(self, h, "ranked-past")
        for rank, body in ((1, early), (0, final)):
            r = ack(h, "ranked-past", rank, body, 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertIn("blocks[0]: block %d of epoch 0 under token %d: epoch 0 is complete "
                          "and the block was acknowledged in it under that token by rank %d, "
                          "not %d" % (body[0]["block"], body[0]["token"], 1 - rank, rank),
                          r.json["error"]["message"])
            r = ack(h, "ranked-past", rank, body)  # the epoch left to default: epoch 1
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertEqual(r.json["error"]["message"],
                             "blocks[0]: block %d of epoch 1 is not leased under token %d: it was "
                             "acknowledged under that token in the last completed epoch by rank "
                             "%d, not %d (the rank of this ack): rank %d held that lease and "
                             "acknowledged it; %s" % (body[0]["block"], body[0]["token"],
                                                      1 - rank, rank, 1 - rank, check_rank))
        self.assertEqual(counted(h, "ranked-past"), AFTER_EPOCH_0)
        self.assertEqual((ack(h, "ranked-past", 0, early, 0).status,
                          ack(h, "ranked-past", 1, final).status), (200, 200))

    def test_retry_after_the_next_epoch_completed(self):
        """Once epoch 1 completes too, epoch 0's acks get the older epoch's answer, and
        epoch 1's are the ones answered as repeats."""
        h = self.head
        early, final, _ = lost_then_completed(self, h, "older")
        blocks = lease(h, "older", 0, 1, 4)["blocks"]
        self.assertEqual(ack(h, "older", 0, blocks[:2], 1).json["epoch_complete"], False)
        self.assertEqual(ack(h, "older", 0, blocks[2:], 1).json["epoch_complete"], True)
        for body in (early, final):
            r = ack(h, "older", 0, body, 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertIn("epoch 0 is complete: every block of it was acknowledged, once",
                          r.json["error"]["message"])
        r = ack(h, "older", 0, blocks[:2], 1)
        self.assertEqual((r.status, r.json), (200, dict(REPEAT, epoch=1)), r)
        self.assertEqual(counted(h, "older")[:3], ([(6, 30), (2, 10)], 2, 0))

    def test_retry_after_the_last_epoch_finished_the_iteration(self):
        """The last epoch's acks repeat after the iteration finished, also with the epoch
        left to default; a wrong token then says the iteration is finished."""
        h = self.head
        early, final, completed = lost_then_completed(self, h, "done", epochs=1)
        for epoch in (0, None):
            r = ack(h, "done", 0, early, epoch)
            self.assertEqual((r.status, r.json), (200, REPEAT), (epoch, r))
            r = ack(h, "done", 1, final, epoch)  # the final ack: what it answered then
            self.assertEqual((r.status, r.json), (200, dict(completed, repeated=2)), r)
        r = ack(h, "done", 0, [dict(early[0], token=early[0]["token"] + 1000)])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertIn("(the iteration is finished)", r.json["error"]["message"])
        self.assertTrue(status(h, "done")["finished"])


def next_held(head, name, rank, max_blocks, held=True):
    r = head.request("POST", "/v1/iterations/%s/next" % name,
                     {"rank": rank, "epoch": 0, "max": max_blocks, "indices": True,
                      "held": held})
    assert r.status == 200, r
    return r.json


class NextRetryTest(HeadCase):
    """A next whose reply was lost leased blocks the rank never heard of: its retry with
    "held": true gets them again, under their tokens and with fresh deadlines, then new
    blocks up to max; without it they stay leased to the rank (docs/api.md, "Retrying a
    next")."""

    def test_held_resends_what_a_lost_reply_leased(self):
        h = self.head
        r = create(h, "held", dataset={"num_samples": 40}, block_size=5, strategy="contiguous",
                   world_size=2, rank_timeout_ms=60000, lease_ms=60000)
        self.assertEqual(r.status, 201, r)
        lost = lease(h, "held", 0, 0, 2)["blocks"]  # the reply is lost
        again = next_held(h, "held", 0, 3)
        keys = ("block", "token", "rank", "begin", "end", "takeover", "indices")
        self.assertEqual([{k: b[k] for k in keys} for b in again["blocks"][:2]],
                         [{k: b[k] for k in keys} for b in lost])
        self.assertGreaterEqual(again["blocks"][0]["deadline_ms"], lost[0]["deadline_ms"])
        # The third is a new block, after them in the rank's lane.
        self.assertEqual([b["block"] for b in again["blocks"]],
                         [lost[0]["block"], lost[1]["block"], lost[1]["block"] + 1])
        self.assertNotIn(again["blocks"][2]["token"], [b["token"] for b in lost])
        # Sent again with max 1, the lowest held block only; nothing new is leased.
        self.assertEqual([b["block"] for b in next_held(h, "held", 0, 1)["blocks"]],
                         [lost[0]["block"]])
        self.assertEqual(status(h, "held")["blocks"]["leased"], 3)
        # Without "held", the next call leases new blocks: the lost ones stay the rank's.
        fresh = next_held(h, "held", 0, 1, held=False)["blocks"]
        self.assertEqual(fresh[0]["block"], lost[1]["block"] + 2)
        # Acked under the re-sent tokens, every block counts once.
        for b in again["blocks"] + fresh:
            self.assertEqual(ack(h, "held", 0, [b], 0).status, 200)
        st = status(h, "held")
        self.assertEqual((st["blocks"]["done"], st["blocks"]["leased"]), (4, 0))
        self.assertEqual([r["blocks"] for r in st["ranks"]], [4, 0])
        self.assertEqual([r["taken_over"] for r in st["ranks"]], [0, 0])

    def test_held_is_a_boolean(self):
        r = self.head.request("POST", "/v1/iterations/held/next",
                              {"rank": 0, "held": "yes"})
        self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), r)
        self.assertIn("held", r.json["error"]["message"])


class IterRetryRestartTest(unittest.TestCase):
    def test_retry_after_restart(self):
        """The completed epoch's acks are on disk: after a head restart their retries are
        still repeats, naming the epoch or letting it default, and other tokens are still
        refused."""
        with harness.Head() as h:
            early, final, completed = lost_then_completed(self, h, "rs")
            h.kill()
            h.start()
            for epoch in (0, None):
                r = ack(h, "rs", 0, early, epoch)
                self.assertEqual((r.status, r.json), (200, REPEAT), (epoch, r))
                r = ack(h, "rs", 1, final, epoch)
                self.assertEqual((r.status, r.json), (200, dict(completed, repeated=2)), r)
            r = ack(h, "rs", 0, [dict(early[0], token=final[0]["token"])], 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertIn("acknowledged in it under another token", r.json["error"]["message"])
            self.assertEqual(counted(h, "rs"), AFTER_EPOCH_0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
