"""Coordinated iterations over HTTP (docs/api.md "Iterations", docs/iterations.md):
create and join, next and ack, exactly-once per epoch, fencing, takeover of an expired
rank's blocks (dynamic: any rank; static: the rank's replicas), head restart mid-epoch,
checkpoint and elastic resume with another world size, input validation, and the CLI.
"""
import collections
import json
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def create(head, name, **fields):
    body = {"name": name}
    body.update(fields)
    return head.request("POST", "/v1/iterations", body)


def lease(head, name, rank, epoch=None, max_blocks=1000):
    body = {"rank": rank, "max": max_blocks, "indices": True}
    if epoch is not None:
        body["epoch"] = epoch
    r = head.request("POST", "/v1/iterations/%s/next" % name, body)
    assert r.status == 200, r
    return r.json


def ack(head, name, rank, blocks, epoch=None):
    body = {"rank": rank, "blocks": [{"block": b["block"], "token": b["token"]} for b in blocks]}
    if epoch is not None:
        body["epoch"] = epoch
    return head.request("POST", "/v1/iterations/%s/ack" % name, body)


def drain(head, name, ranks, epoch=0, per_call=2):
    """Ranks take turns leasing and acking until the epoch ends; returns rank -> indices."""
    got = collections.defaultdict(list)
    active = list(ranks)
    while active:
        for rank in list(active):
            reply = lease(head, name, rank, epoch, per_call)
            if reply["state"] in ("epoch_end", "finished"):
                active.remove(rank)
                continue
            if reply["state"] == "wait":
                continue
            r = ack(head, name, rank, reply["blocks"], epoch)
            assert r.status == 200, r
            for b in reply["blocks"]:
                got[rank].extend(b["indices"])
    return got


def status(head, name):
    r = head.request("GET", "/v1/iterations/" + name)
    assert r.status == 200, r
    return r.json


class IterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.head = harness.Head(args=["--sweep-ms", "20"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def test_create_join_and_conflicts(self):
        h = self.head
        cfg = {"dataset": {"num_samples": 100}, "world_size": 4, "shuffle": "global", "seed": 3}
        r = create(h, "join", **cfg)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json["config"]["strategy"], "round_robin")
        self.assertTrue(r.json["cluster_sync"])
        self.assertEqual([x["health"] for x in r.json["ranks"]], ["unknown"] * 4)
        # Same configuration, written differently (defaults explicit): joins.
        r = create(h, "join", rank=2, epochs=1, strategy="round_robin", **cfg)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json["ranks"][2]["health"], "idle")
        r = create(h, "join", **dict(cfg, seed=4))
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertIn("(seed is 3 there, 4 in this request)", r.json["error"]["message"])
        # The first field that differs is named with both values, nested ones by path.
        for change, named in (({"world_size": 3}, "world_size is 4 there, 3 in this request"),
                              ({"dataset": {"num_samples": 99}},
                               "dataset.num_samples is 100 there, 99 in this request"),
                              ({"block_size": 7}, "block_size is 256 there, 7 in this request")):
            r = create(h, "join", **dict(cfg, **change))
            self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
            self.assertIn(named, r.json["error"]["message"])
            self.assertIn("every rank must give the same one", r.json["error"]["message"])
        r = create(h, "join", lease_ms=5, **cfg)
        self.assertEqual(r.status, 409, r)
        self.assertIn("lease_ms", r.json["error"]["message"])

    def test_bad_input(self):
        h = self.head
        ds = {"num_samples": 10}
        cases = [
            ({"name": "b", "dataset": ds, "colour": 1}, 400, "colour"),
            ({"name": "b"}, 400, "dataset"),
            ({"name": "b/c", "dataset": ds}, 400,
             "iteration name 'b/c' is invalid: use 1 to 128 characters of letters, digits"),
            ({"dataset": ds}, 400, "name: missing"),
            ({"name": "b", "dataset": ds, "strategy": "spiral"}, 400, "strategy"),
            ({"name": "b", "dataset": ds, "world_size": 0}, 400, "world_size"),
            ({"name": "b", "dataset": ds, "strategy": "range", "world_size": 2,
              "ranges": [[0, 4], [5, 10]]}, 400, "ranges"),
            ({"name": "b", "dataset": ds, "strategy": "stratified"}, 400, "labels"),
            ({"name": "b", "dataset": ds, "replication": 2}, 400, "replication"),
            ({"name": "b", "dataset": ds, "strategy": "dynamic", "tail": "pad"}, 400, "tail"),
            ({"name": "b", "dataset": {"num_samples": 4, "labels": [0, 1]}}, 400, "labels"),
        ]
        for body, want, word in cases:
            r = h.request("POST", "/v1/iterations", body)
            self.assertEqual(r.status, want, (body, r))
            self.assertIn(word, r.json["error"]["message"], (body, r))
        r = h.request("POST", "/v1/iterations", {"name": "b", "dataset": ds, "cluster_sync": False})
        self.assertEqual(r.status, 400, r)
        self.assertIn("node agent", r.json["error"]["message"])
        self.assertEqual(h.request("GET", "/v1/iterations/b").status, 404)
        self.assertEqual(h.request("GET", "/v1/iterations/nope").error_code, "iteration_not_found")
        create(h, "bad2", dataset=ds, world_size=2)
        r = h.request("POST", "/v1/iterations/bad2/next", {"rank": 2})
        self.assertEqual(r.status, 400, r)
        r = h.request("POST", "/v1/iterations/bad2/next", {"rank": 0, "max": 1001})
        self.assertEqual(r.error_code, "batch_too_large", r)
        r = h.request("POST", "/v1/iterations/bad2/ack", {"rank": 0, "blocks": []})
        self.assertEqual(r.status, 400, r)

    def test_exactly_once_every_strategy(self):
        h = self.head
        n = 101
        labels = [i % 3 for i in range(n)]
        strategies = [("round_robin", {}), ("contiguous", {}), ("dynamic", {}),
                      ("hash", {"num_partitions": 5, "hash_seed": 1}),
                      ("range", {"ranges": [[0, 50], [50, 51], [51, 101]]}),
                      ("stratified", {})]
        for strategy, extra in strategies:
            name = "once-" + strategy
            ds = {"num_samples": n}
            if strategy == "stratified":
                ds["labels"] = labels
            r = create(h, name, dataset=ds, world_size=3, block_size=7, shuffle="global",
                       seed=11, strategy=strategy, epochs=2, **extra)
            self.assertEqual(r.status, 201, r)
            for epoch in (0, 1):
                got = drain(h, name, [0, 1, 2], epoch)
                every = sorted(i for rank in got for i in got[rank])
                self.assertEqual(every, list(range(n)), (strategy, epoch))
            self.assertTrue(status(h, name)["finished"])
            self.assertEqual(lease(h, name, 0)["state"], "finished")

    def test_static_matches_standalone_stream(self):
        h = self.head
        create(h, "same", dataset={"num_samples": 10}, world_size=3, block_size=2,
               shuffle="global", seed=42)
        got = drain(h, "same", [0, 1, 2])
        self.assertEqual(got[0], [4, 7, 8, 0])  # docs/iterations.md, "Putting it together"
        self.assertEqual(got[1], [6, 9, 5])
        self.assertEqual(got[2], [1, 2, 3])

    def test_fencing_and_all_or_nothing_ack(self):
        h = self.head
        create(h, "fence", dataset={"num_samples": 20}, block_size=5, strategy="dynamic",
               world_size=2)
        blocks = lease(h, "fence", 0, 0, 2)["blocks"]
        stale = dict(blocks[1], token=blocks[1]["token"] + 1000)
        r = ack(h, "fence", 0, [blocks[0], stale])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertIn("blocks[1]", r.json["error"]["message"])
        self.assertEqual(status(h, "fence")["blocks"]["done"], 0)  # nothing applied
        self.assertEqual(ack(h, "fence", 0, blocks).status, 200)

    def test_repeated_ack_counts_once(self):
        """An ack sent again under the tokens that acknowledged its blocks (its reply was
        lost) succeeds with "repeated" and counts nothing twice; another token is still
        lease_lost, and its message says what became of the block."""
        h = self.head
        create(h, "again", dataset={"num_samples": 25}, block_size=5, strategy="dynamic",
               world_size=2, lease_ms=200, rank_timeout_ms=60000)
        blocks = lease(h, "again", 0, 0, 2)["blocks"]
        r = ack(h, "again", 0, blocks)
        self.assertEqual(r.json, {"acked": 2, "epoch": 0, "epoch_complete": False,
                                  "finished": False})
        for body in (blocks, blocks[:1]):
            r = ack(h, "again", 0, body)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.json, {"acked": len(body), "epoch": 0, "epoch_complete": False,
                                      "finished": False, "repeated": len(body)})
        st = status(h, "again")
        self.assertEqual(st["blocks"]["done"], 2)
        self.assertEqual((st["ranks"][0]["blocks"], st["ranks"][0]["samples"]), (2, 10))
        # A fresh block and a repeat in one ack: the fresh one counts.
        [third] = lease(h, "again", 0, 0, 1)["blocks"]
        r = ack(h, "again", 0, [blocks[0], third])
        self.assertEqual((r.status, r.json.get("repeated")), (200, 1), r)
        self.assertEqual(status(h, "again")["blocks"]["done"], 3)
        # Another token: refused, and the message says what became of the block and what
        # to do; a token newer than the one that acknowledged it was never its lease.
        wrong = blocks[0]["token"] + 1000
        r = ack(h, "again", 0, [dict(blocks[0], token=wrong)])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertEqual(r.json["error"]["message"],
                         "blocks[0]: block %d of epoch 0 is not leased under token %d: it was "
                         "acknowledged under another token, older than %d, so token %d was never "
                         "this block's lease in this epoch: acknowledge a block with the token "
                         "its lease came with" % (blocks[0]["block"], wrong, wrong, wrong))
        # A lease that expired: its block waits to be leased again.
        [late] = lease(h, "again", 0, 0, 1)["blocks"]
        harness.wait_until(lambda: status(h, "again")["ranks"][0]["expired"] == 1,
                           what="the lease to expire")
        r = ack(h, "again", 0, [late])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertEqual(r.json["error"]["message"],
                         "blocks[0]: block %d of epoch 0 is not leased under token %d: it is "
                         "waiting to be leased again (its lease expired or its rank failed), and "
                         "its indices will be read under that new lease; drop this ack (a rank "
                         "keeps its leases by calling the head within lease_ms)"
                         % (late["block"], late["token"]))
        self.assertEqual(status(h, "again")["blocks"]["done"], 3)
        # Leased again, to another rank and then (that lease expired too) to this one: the
        # message says the lease the ack names ended if it was the block's (the head keeps no
        # history of a block's tokens) and the ack is to be dropped.
        ended = ("block %d of epoch 0 is leased again, to %s under a token newer than %d: if "
                 "token %d was this block's lease, that lease ended (it expired or its rank "
                 "failed) and the block's indices are read under the new lease; either way, "
                 "drop this ack")
        [other] = lease(h, "again", 1, 0, 1)["blocks"]
        self.assertEqual(other["block"], late["block"])
        r = ack(h, "again", 0, [late])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertEqual(r.json["error"]["message"], "blocks[0]: " + ended % (
            late["block"], "rank 1 (not 0, the rank of this ack)", late["token"], late["token"]))
        harness.wait_until(lambda: status(h, "again")["ranks"][1]["expired"] == 1,
                           what="rank 1's lease to expire")
        [mine] = lease(h, "again", 0, 0, 1)["blocks"]
        self.assertEqual(mine["block"], late["block"])
        for stale in (late, other):
            r = ack(h, "again", 0, [stale])
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertEqual(r.json["error"]["message"], "blocks[0]: " + ended % (
                late["block"], "rank 0 (the rank of this ack)", stale["token"], stale["token"]))
        # A token newer than the block's lease was never its lease.
        r = ack(h, "again", 0, [dict(mine, token=mine["token"] + 1000)])
        self.assertEqual(r.json["error"]["message"],
                         "blocks[0]: block %d of epoch 0 is leased to rank 0 (the rank of this "
                         "ack) under a token older than %d, so token %d was never this block's "
                         "lease in this epoch: acknowledge a block with the token its lease came "
                         "with" % (late["block"], mine["token"] + 1000, mine["token"] + 1000))
        r = ack(h, "again", 0, [mine])
        self.assertEqual((r.status, r.json["epoch_complete"]), (200, False), r)  # 4 blocks of 5
        # Acknowledged under the newer lease: the leases the stale tokens name ended, and
        # their block was read under another.
        for stale in (late, other):
            r = ack(h, "again", 0, [stale])
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertEqual(r.json["error"]["message"],
                             "blocks[0]: block %d of epoch 0 is not leased under token %d: it "
                             "was acknowledged under another token, newer than %d: if token %d "
                             "was this block's lease, the block was leased again after that "
                             "lease ended (it expired or its rank failed) and its indices were "
                             "read under the new lease; either way, drop this ack"
                             % (late["block"], stale["token"], stale["token"], stale["token"]))
        [fifth] = lease(h, "again", 0, 0, 1)["blocks"]
        r = ack(h, "again", 0, [fifth])
        self.assertEqual((r.status, r.json["epoch_complete"]), (200, True), r)  # 5 blocks of 5

    def test_repeated_ack_that_completed_the_epoch(self):
        """The ack that completed an epoch, sent again (its reply was lost), answers what it
        answered then, plus "repeated", and counts nothing: also with the epoch left to
        default (now the next one), also after its blocks were leased again in the next
        epoch. Another ack of the completed epoch repeats with the answer it had then (the
        epoch not complete; test_iter_retry.py has more of those); a token that did not
        acknowledge the block is still lease_lost, and says why; so is the final ack of an
        epoch before the last."""
        h = self.head
        create(h, "fin", dataset={"num_samples": 20}, block_size=5, strategy="dynamic",
               world_size=2, epochs=2, rank_timeout_ms=60000)
        early = lease(h, "fin", 0, 0, 2)["blocks"]
        self.assertEqual(ack(h, "fin", 0, early).json["epoch_complete"], False)
        final = lease(h, "fin", 1, 0, 2)["blocks"]
        first = ack(h, "fin", 1, final, 0)
        self.assertEqual(first.json, {"acked": 2, "epoch": 1, "epoch_complete": True,
                                      "finished": False})
        again = dict(first.json, repeated=2)
        for epoch in (0, None):  # None: the default, the current epoch (1)
            r = ack(h, "fin", 1, final, epoch)
            self.assertEqual((r.status, r.json), (200, again), (epoch, r))
        r = ack(h, "fin", 1, final[1:], 0)
        self.assertEqual(r.json, dict(again, acked=1, repeated=1), r)
        st = status(h, "fin")
        self.assertEqual((st["epoch"], st["blocks"]["done"]), (1, 0))
        self.assertEqual((st["ranks"][1]["blocks"], st["ranks"][1]["samples"]), (2, 10))
        # Not the final ack: the epoch was not complete.
        not_final = {"acked": 2, "epoch": 0, "epoch_complete": False, "finished": False,
                     "repeated": 2}
        r = ack(h, "fin", 0, early, 0)
        self.assertEqual((r.status, r.json), (200, not_final), r)
        # Part of the final ack with a block rank 0 acknowledged: no retry of rank 1's.
        r = ack(h, "fin", 1, [final[0], early[0]], 0)
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertIn("blocks[1]: block %d of epoch 0 under token %d: epoch 0 is complete and "
                      "the block was acknowledged in it under that token by rank 0, not 1"
                      % (early[0]["block"], early[0]["token"]), r.json["error"]["message"])
        # Not acknowledged under that token: refused, all of it, naming the element and
        # saying why.
        for rank, body, bad in ((1, [final[0], dict(final[1], token=final[1]["token"] + 1000)],
                                 1),
                                (1, [dict(final[0], block=early[0]["block"])], 0)):
            r = ack(h, "fin", rank, body, 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            msg = r.json["error"]["message"]
            self.assertIn("blocks[%d]: block %d of epoch 0 under token %d: epoch 0 is complete "
                          "and the block was acknowledged in it under another token"
                          % (bad, body[bad]["block"], body[bad]["token"]), msg)
        # Its blocks leased again in epoch 1 (under new tokens): the retry still repeats.
        again_leased = lease(h, "fin", 0, 1, 4)["blocks"]
        self.assertEqual([b["block"] for b in again_leased], [0, 1, 2, 3])
        r = ack(h, "fin", 1, final)
        self.assertEqual((r.status, r.json), (200, again), r)
        r = ack(h, "fin", 1, final, 1)  # naming epoch 1 with those blocks' new leases alive
        self.assertEqual((r.status, r.json), (200, again), r)
        r = ack(h, "fin", 0, early)  # epoch 1's blocks 0 and 1 are leased under other tokens
        self.assertEqual((r.status, r.json), (200, not_final), r)
        r = ack(h, "fin", 0, [dict(early[0], token=early[0]["token"] + 1000)])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertIn("is leased to rank 0 (the rank of this ack) under a token older than",
                      r.json["error"]["message"])
        # The last epoch's final ack finishes the iteration; it repeats as well, and the
        # acks of epoch 0, no longer the last epoch completed, are refused.
        self.assertEqual(ack(h, "fin", 0, again_leased[:3], 1).json["epoch_complete"], False)
        first = ack(h, "fin", 0, again_leased[3:], 1)
        self.assertEqual(first.json, {"acked": 1, "epoch": 2, "epoch_complete": True,
                                      "finished": True})
        for epoch in (1, None):
            r = ack(h, "fin", 0, again_leased[3:], epoch)
            self.assertEqual((r.status, r.json), (200, dict(first.json, repeated=1)), r)
        for epoch in (1, None):
            r = ack(h, "fin", 0, again_leased[:1], epoch)
            self.assertEqual((r.status, r.json), (200, dict(not_final, epoch=1, acked=1,
                                                             repeated=1)), r)
        r = ack(h, "fin", 0, [dict(again_leased[0], token=again_leased[0]["token"] + 1000)])
        self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
        self.assertIn("(the iteration is finished)", r.json["error"]["message"])
        for body in (final, early):
            r = ack(h, "fin", 1, body, 0)
            self.assertEqual((r.status, r.error_code), (409, "lease_lost"), r)
            self.assertIn("epoch 0 is complete: every block of it was acknowledged, once",
                          r.json["error"]["message"])

    def test_dynamic_takeover_after_expiry(self):
        h = self.head
        create(h, "dyn", dataset={"num_samples": 40}, block_size=4, strategy="dynamic",
               world_size=2, lease_ms=100, rank_timeout_ms=60000)
        held = lease(h, "dyn", 0, 0, 3)["blocks"]  # rank 0 goes silent with 3 blocks
        harness.wait_until(lambda: status(h, "dyn")["ranks"][0]["health"] == "failed",
                           what="rank 0 to fail")
        got = drain(h, "dyn", [1])
        self.assertEqual(sorted(got[1]), list(range(40)))
        st = status(h, "dyn")
        self.assertEqual(st["ranks"][1]["taken_over"], 3)
        self.assertEqual(st["ranks"][0]["expired"], 3)
        self.assertEqual(ack(h, "dyn", 0, held, 0).error_code, "lease_lost")

    def test_static_takeover_by_replica_only(self):
        h = self.head
        create(h, "rep", dataset={"num_samples": 30}, block_size=2, world_size=3,
               replication=2, rank_timeout_ms=300)
        create(h, "norep", dataset={"num_samples": 30}, block_size=2, world_size=3,
               rank_timeout_ms=300)
        for name in ("rep", "norep"):
            lease(h, name, 0, 0, 1)  # ranks 0 and 2 work; rank 1 vanishes after one lease
            lease(h, name, 1, 0, 1)
        # Rank 1 stops; ranks 0 and 2 keep heart-beating until it is failed.
        def rank1_failed():
            for name in ("rep", "norep"):
                for rank in (0, 2):
                    h.request("POST", "/v1/iterations/%s/heartbeat" % name, {"rank": rank})
            return all(status(h, n)["ranks"][1]["health"] == "failed" for n in ("rep", "norep"))
        harness.wait_until(rank1_failed, what="rank 1 to fail")
        # With replication 2, rank 2 (rank 1's replica) takes its lane; rank 0 may not.
        got = drain(h, "rep", [0, 2])
        self.assertEqual(sorted(got[0] + got[2]), list(range(30)))
        self.assertEqual(sorted(got[0]), list(range(0, 30, 3)))
        # Without replication, nobody takes rank 1's blocks: the epoch waits for it.
        for rank in (0, 2):
            while lease(h, "norep", rank)["state"] == "blocks":
                pass
        h.request("POST", "/v1/iterations/norep/heartbeat", {"rank": 0})
        reply = lease(h, "norep", 0)
        self.assertEqual(reply["state"], "wait")

    def test_checkpoint_and_elastic_resume(self):
        h = self.head
        n = 997
        for strategy in ("round_robin", "contiguous", "dynamic", "stratified", "hash"):
            for new_world in (3, 6, 4):
                name = "el-%s-%d" % (strategy, new_world)
                ds = {"num_samples": n}
                if strategy == "stratified":
                    ds["labels"] = [(i * 7) % 5 for i in range(n)]
                self.assertEqual(create(h, name, dataset=ds, world_size=4, block_size=16,
                                        shuffle="global", seed=5, strategy=strategy,
                                        epochs=2).status, 201)
                consumed = []
                for rank in range(4):  # every rank consumes part of its share
                    reply = lease(h, name, rank, 0, rank + 1)
                    ack(h, name, rank, reply["blocks"][:rank + 1 - (rank % 2)])
                    consumed += [i for b in reply["blocks"][:rank + 1 - (rank % 2)]
                                 for i in b["indices"]]
                lease(h, name, 1, 0, 2)  # leased, never acked: not consumed
                ck = h.request("GET", "/v1/iterations/%s/checkpoint" % name).json
                self.assertLess(len(json.dumps(ck)), 12000 if strategy == "stratified" else 2000)
                r = h.request("POST", "/v1/iterations",
                              {"name": name + "-r", "checkpoint": ck, "world_size": new_world})
                self.assertEqual(r.status, 201, r)
                self.assertEqual(r.json["config"]["world_size"], new_world)
                got = drain(h, name + "-r", list(range(new_world)), 0, 3)
                rest = [i for rank in got for i in got[rank]]
                self.assertEqual(sorted(rest + consumed), list(range(n)), (strategy, new_world))
                self.assertEqual(len(set(rest) & set(consumed)), 0)
                # The next epoch is a plain one with the new world size.
                got = drain(h, name + "-r", list(range(new_world)), 1, 3)
                self.assertEqual(sorted(i for r_ in got for i in got[r_]), list(range(n)))
                self.assertTrue(status(h, name + "-r")["finished"])

    def test_checkpoint_tampered_or_joined(self):
        h = self.head
        create(h, "ck", dataset={"num_samples": 50}, world_size=2, block_size=5)
        ack(h, "ck", 0, lease(h, "ck", 0, 0, 2)["blocks"])
        ck = h.request("GET", "/v1/iterations/ck/checkpoint").json
        self.assertEqual(ck["done"], [[0, 2]])
        bad = dict(ck, config=dict(ck["config"], seed=9))
        r = h.request("POST", "/v1/iterations", {"name": "ck2", "checkpoint": bad})
        self.assertEqual(r.status, 400, r)
        self.assertIn("fingerprint", r.json["error"]["message"])
        r = h.request("POST", "/v1/iterations", {"name": "ck2", "checkpoint": ck, "seed": 1})
        self.assertEqual(r.status, 400, r)
        r = h.request("POST", "/v1/iterations", {"name": "ck2", "checkpoint": dict(ck, done=[[3, 2]])})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(h.request("POST", "/v1/iterations",
                                   {"name": "ck2", "checkpoint": ck, "rank": 0}).status, 201)
        self.assertEqual(h.request("POST", "/v1/iterations",
                                   {"name": "ck2", "checkpoint": ck, "rank": 1}).status, 200)
        self.assertEqual(status(h, "ck2")["blocks"]["done"], 2)
        # A restore into a name that is taken (by a created iteration, or one restored
        # with another world size): the name is taken, not "every rank must give...".
        for name, extra in (("ck", {}), ("ck2", {"world_size": 1})):
            r = h.request("POST", "/v1/iterations", dict({"name": name, "checkpoint": ck}, **extra))
            self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
            msg = r.json["error"]["message"]
            self.assertIn("a restore makes a new iteration", msg)
            self.assertIn("muster iter rm %s" % name, msg)
            self.assertNotIn("every rank", msg)
            if name == "ck2":  # the same checkpoint: the message names what differs
                self.assertIn("(restored from the same checkpoint with another configuration: "
                              "world_size is 2 there, 1 in this request)", msg)
        # A create meeting a restored iteration.
        r = create(h, "ck2", **ck["config"])
        self.assertEqual((r.status, r.error_code), (409, "invalid_state"), r)
        self.assertIn("restored from a checkpoint", r.json["error"]["message"])

    def test_empty_dataset_refused(self):
        h = self.head
        for dataset in ({"num_samples": 0}, {"shards": [{"count": 0}, {"count": 0}]}):
            r = create(h, "empty", dataset=dataset)
            self.assertEqual((r.status, r.error_code), (400, "invalid_argument"), r)
            self.assertIn("dataset: it has no samples", r.json["error"]["message"])
        self.assertEqual(h.request("GET", "/v1/iterations/empty").status, 404)

    def test_delete(self):
        h = self.head
        create(h, "gone", dataset={"num_samples": 5})
        self.assertEqual(h.request("DELETE", "/v1/iterations/gone").status, 200)
        self.assertEqual(h.request("DELETE", "/v1/iterations/gone").status, 404)
        names = [i["name"] for i in h.request("GET", "/v1/iterations").json["iterations"]]
        self.assertNotIn("gone", names)


class RestartTest(unittest.TestCase):
    def test_head_restart_mid_epoch(self):
        with harness.Head() as h:
            n = 500
            create(h, "rs", dataset={"num_samples": n}, world_size=2, block_size=10,
                   shuffle="global", seed=1, strategy="dynamic", lease_ms=60000)
            consumed = []
            for rank in (0, 1):
                reply = lease(h, "rs", rank, 0, 5)
                self.assertEqual(ack(h, "rs", rank, reply["blocks"]).status, 200)
                consumed += [i for b in reply["blocks"] for i in b["indices"]]
            held = lease(h, "rs", 0, 0, 3)["blocks"]  # leased across the restart
            h.kill()
            h.start()
            st = status(h, "rs")
            self.assertEqual((st["blocks"]["done"], st["blocks"]["leased"]), (10, 3))
            self.assertEqual(ack(h, "rs", 0, held).status, 200)  # the lease survived
            consumed += [i for b in held for i in b["indices"]]
            got = drain(h, "rs", [0, 1])
            rest = [i for r in got for i in got[r]]
            self.assertEqual(sorted(consumed + rest), list(range(n)))

    def test_repeated_final_ack_after_restart(self):
        """The ack that completed an epoch is remembered on disk: its retry after a head
        restart is still a repeat."""
        with harness.Head() as h:
            create(h, "rf", dataset={"num_samples": 10}, block_size=5, strategy="dynamic",
                   epochs=3)
            blocks = lease(h, "rf", 0, 0, 2)["blocks"]
            first = ack(h, "rf", 0, blocks, 0).json
            self.assertEqual(first["epoch_complete"], True)
            h.kill()
            h.start()
            r = ack(h, "rf", 0, blocks, 0)
            self.assertEqual((r.status, r.json), (200, dict(first, repeated=2)), r)
            self.assertEqual(status(h, "rf")["ranks"][0]["blocks"], 2)


class OutageGraceTest(unittest.TestCase):
    def test_leases_and_ranks_get_their_whole_timeout_after_a_restart(self):
        """A head down longer than lease_ms: the ranks could not reach it meanwhile, so
        their leases and heartbeats count from its start, as workers' do.  Its first
        sweeps ended every lease in flight, to be read twice by whichever rank took
        the block next."""
        with harness.Head(args=["--sweep-ms", "50"]) as h:
            self.assertEqual(create(h, "og", dataset={"num_samples": 100}, world_size=2,
                                    block_size=10, strategy="dynamic", lease_ms=5000,
                                    rank_timeout_ms=5000).status, 201)
            held = lease(h, "og", 0, 0, 2)
            silent = lease(h, "og", 1, 0, 1)  # rank 1 is not heard from again
            h.kill()
            deadline = max(b["deadline_ms"] for b in held["blocks"] + silent["blocks"])
            while time.time() * 1000 < deadline + 200:  # the outage outlasts the leases
                time.sleep(0.1)
            h.start()
            # A sweep after the start: a lease of 100 ms taken now ends at one.
            self.assertEqual(create(h, "probe", dataset={"num_samples": 10}, block_size=10,
                                    strategy="dynamic", lease_ms=100).status, 201)
            lease(h, "probe", 0, 0, 1)
            harness.wait_until(lambda: status(h, "probe")["blocks"]["leased"] == 0,
                               timeout=20, what=lambda: "the probe's lease to lapse")
            st = status(h, "og")
            self.assertEqual(st["blocks"]["leased"], 3, st)
            self.assertNotIn("failed", [r["health"] for r in st["ranks"]], st["ranks"])
            self.assertEqual(ack(h, "og", 0, held["blocks"], 0).status, 200)
            # The grace ends: rank 1, still silent, loses its block and fails.
            harness.wait_until(lambda: status(h, "og")["blocks"]["leased"] == 0, timeout=30,
                               what=lambda: "rank 1's lease to lapse after the grace")
            self.assertEqual(status(h, "og")["ranks"][1]["health"], "failed")


class CliTest(unittest.TestCase):
    def run_cli(self, head, *args, stdin=None):
        env = dict(os.environ, MUSTER_URL=head.url, MUSTER_TOKEN=head.token)
        return subprocess.run([harness.MUSTER_BIN] + list(args), input=stdin, env=env,
                              capture_output=True, text=True, timeout=60)

    def test_cli_cycle(self):
        with harness.Head() as h:
            p = self.run_cli(h, "iter", "stream", "--num-samples", "10", "--shuffle", "global",
                             "--seed", "42", "--world-size", "3", "--rank", "0")
            self.assertEqual(p.stdout.split(), ["4", "7", "8", "0"], p.stderr)
            p = self.run_cli(h, "iter", "create", "c", "--num-samples", "10", "--shuffle",
                             "global", "--seed", "42", "--world-size", "3", "--block-size", "2")
            self.assertEqual(p.returncode, 0, p.stderr)
            p = self.run_cli(h, "iter", "next", "c", "--rank", "0", "--max", "2")
            blocks = [json.loads(line) for line in p.stdout.splitlines()]
            self.assertEqual([b["indices"] for b in blocks], [[4, 7], [8, 0]])
            pairs = ["%d:%d" % (b["block"], b["token"]) for b in blocks]
            p = self.run_cli(h, "iter", "ack", "c", "--rank", "0", *pairs)
            self.assertEqual(p.returncode, 0, p.stderr)
            # Again, as after a lost reply: a repeat, counted once.
            p = self.run_cli(h, "iter", "ack", "c", "--rank", "0", *pairs)
            self.assertEqual(p.returncode, 0, p.stderr)
            p = self.run_cli(h, "iter", "status", "c")
            self.assertIn("blocks 2/6 done", p.stdout)
            ck = self.run_cli(h, "iter", "checkpoint", "c").stdout
            p = self.run_cli(h, "iter", "restore", "c2", "-", "--world-size", "2", stdin=ck)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(json.loads(p.stdout)["resumed"], {"epoch": 0, "world_size": 3})
            p = self.run_cli(h, "iter", "create", "c3", "--num-samples", "5", "--cluster-sync",
                             "false")
            self.assertEqual(p.returncode, 1)
            self.assertIn("node agent", p.stderr)
            p = self.run_cli(h, "iter", "next", "c")
            self.assertEqual(p.returncode, 2)

    def test_cli_next_held(self):
        """`iter next --held` (the retry of a next whose output was lost) prints the
        blocks the rank holds first, under their tokens, then new ones up to --max."""
        with harness.Head() as h:
            p = self.run_cli(h, "iter", "create", "hd", "--num-samples", "12", "--block-size",
                             "2", "--strategy", "dynamic")
            self.assertEqual(p.returncode, 0, p.stderr)

            def lease(*extra):
                p = self.run_cli(h, "iter", "next", "hd", "--rank", "0", *extra)
                self.assertEqual(p.returncode, 0, p.stderr)
                return [(b["block"], b["token"]) for b in map(json.loads, p.stdout.splitlines())]

            first = lease()
            self.assertEqual(lease("--held"), first)
            again = lease("--held", "--max", "2")
            self.assertEqual(again[0], first[0])
            self.assertNotEqual(again[1][0], first[0][0])
            self.assertEqual(lease("--held", "--max", "3")[:2], again)

    def test_cli_restore_messages(self):
        with harness.Head() as h:
            # A file that cannot be read: the OS's reason, and no error code (the head
            # was not asked).
            p = self.run_cli(h, "iter", "restore", "y", "/nonexistent/ck.json")
            self.assertEqual((p.returncode, p.stderr), (1, "muster: cannot read the checkpoint "
                             "file '/nonexistent/ck.json': No such file or directory\n"))
            # Text that is not JSON: jansson's reason and where (a column on the one line a
            # checkpoint is written on, line and column in a file of several), as the CLI
            # tells of every JSON text it reads.
            for text, where in (("not json", "invalid token near 'not' (at column 3)"),
                                ('{"version": 1,\n "name": bad}\n',
                                 "invalid token near 'bad' (at line 2, column 12)")):
                p = self.run_cli(h, "iter", "restore", "y", "-", stdin=text)
                self.assertEqual((p.returncode, p.stderr), (1, "muster: the checkpoint file '-' "
                                 "is not JSON: %s; give the file that 'muster iter checkpoint' "
                                 "wrote\n" % where))
            p = self.run_cli(h, "iter", "restore", "y", "-", stdin="[1, 2]")
            self.assertEqual((p.returncode, p.stderr), (1, "muster: the checkpoint file '-' is "
                             "not a JSON object; give the file that 'muster iter checkpoint' "
                             "wrote\n"))
            p = self.run_cli(h, "iter", "create", "c", "--num-samples", "10", "--world-size", "3")
            self.assertEqual(p.returncode, 0, p.stderr)
            ck = self.run_cli(h, "iter", "checkpoint", "c").stdout
            p = self.run_cli(h, "iter", "restore", "cr", "-", "--world-size", "3", stdin=ck)
            self.assertEqual(p.returncode, 0, p.stderr)
            # The same checkpoint with another world size into the taken name.
            p = self.run_cli(h, "iter", "restore", "cr", "-", "--world-size", "2", stdin=ck)
            self.assertEqual(p.returncode, 1)
            self.assertIn("iteration 'cr' exists (restored from the same checkpoint with another "
                          "configuration: world_size is 3 there, 2 in this request)", p.stderr)
            self.assertNotIn("another checkpoint", p.stderr)

    def test_cli_ack_names_the_block(self):
        """`iter ack` errors start with the user's block, not with an index into the body
        the CLI built ("blocks[1]: ..."); an ack of the completed epoch, the one that
        completed it or another, run again with the epoch left to default (now the next
        one) or named, succeeds as a repeat."""
        with harness.Head() as h:
            p = self.run_cli(h, "iter", "create", "a", "--num-samples", "6", "--block-size",
                             "2", "--strategy", "dynamic", "--epochs", "2")
            self.assertEqual(p.returncode, 0, p.stderr)

            def next_pairs(count):
                p = self.run_cli(h, "iter", "next", "a", "--rank", "0", "--max", str(count))
                return ["%d:%d" % (b["block"], b["token"])
                        for b in map(json.loads, p.stdout.splitlines())]

            pairs = next_pairs(2)
            self.assertEqual([x.split(":")[0] for x in pairs], ["0", "1"])
            for args, want in (
                    ([pairs[0], "1:8999999999999999"], "muster: lease_lost: block 1 of epoch 0 is "
                     "leased to rank 0 (the rank of this ack) under a token older than 8999999999999999, "
                     "so token 8999999999999999 was never this block's lease in this epoch"),
                    (["2:8999999999999999"], "muster: lease_lost: block 2 of epoch 0 is not leased under "
                     "token 8999999999999999: it has not been leased in this epoch, so there is no lease "
                     "to acknowledge: acknowledge only the blocks a next gave this rank, each "
                     "with the token it came with (check the block and the epoch)\n")):
                p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", *args)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertTrue(p.stderr.startswith(want), p.stderr)
                self.assertNotIn("blocks[", p.stderr)
            # A block past the epoch's end is no block at all, not one left unleased.
            p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", "9:1")
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertTrue(p.stderr.startswith(
                "muster: invalid_argument: block: 9, and epoch 0 has 3 blocks (0 to 2): "
                "acknowledge only the blocks a next gave this rank"), p.stderr)
            p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", *pairs)
            self.assertEqual(p.returncode, 0, p.stderr)
            [last] = next_pairs(1)
            p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", last)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("epoch 1,", self.run_cli(h, "iter", "status", "a").stdout)
            for epoch in ([], ["--epoch", "0"]):  # a retry after a lost reply
                p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", last, *epoch)
                self.assertEqual((p.returncode, p.stderr), (0, ""), epoch)
                p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", pairs[0], *epoch)
                self.assertEqual((p.returncode, p.stderr), (0, ""), epoch)
            self.assertIn("blocks 0/3 done", self.run_cli(h, "iter", "status", "a").stdout)
            p = self.run_cli(h, "iter", "ack", "a", "--rank", "0", "--epoch", "0", "0:8999999999999999")
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertTrue(p.stderr.startswith(
                "muster: lease_lost: block 0 of epoch 0 under token 8999999999999999: epoch 0 is complete "
                "and the block was acknowledged in it under another token"), p.stderr)

    def test_cli_names_the_bad_choice(self):
        """A standalone `iter stream` (no head asked) and `iter create` (the head asked)
        refuse a name that is not a shuffle, strategy or tail in the same words: the
        field, the value and the names it could be."""
        with harness.Head() as h:
            for option, value, names in (
                    ("--shuffle", "y", "none, global, shard"),
                    ("--strategy", "x", "round_robin, contiguous, hash, range, stratified, "
                     "dynamic"),
                    ("--tail", "nope", "keep, pad, drop"),
                    # tenflowers' names and a slip of the fingers: the one meant is said.
                    ("--strategy", "Adaptive", "round_robin, contiguous, hash, range, "
                     "stratified, dynamic (did you mean 'dynamic'?)"),
                    ("--strategy", "HashBased", "round_robin, contiguous, hash, range, "
                     "stratified, dynamic (did you mean 'hash'?)"),
                    ("--strategy", "dynamc", "round_robin, contiguous, hash, range, "
                     "stratified, dynamic (did you mean 'dynamic'?)")):
                want = "muster: invalid_argument: %s: '%s' is not one of %s\n" % (
                    option[2:], value, names)
                for cmd in (["stream"], ["create", "bad"]):
                    p = self.run_cli(h, "iter", *cmd, "--num-samples", "10", option, value)
                    self.assertEqual((p.returncode, p.stdout), (1, ""), (cmd, p.stderr))
                    self.assertTrue(p.stderr.startswith(want), (cmd, p.stderr))
            self.assertEqual(h.request("GET", "/v1/iterations/bad").status, 404)
            # "shuffle": true, as other loaders write it, is told what to write.
            r = h.request("POST", "/v1/iterations", {"name": "bad", "shuffle": True,
                                                     "dataset": {"num_samples": 4}})
            self.assertEqual((r.status, r.json["error"]["message"]),
                             (400, "shuffle: expected one of none, global, shard, not true "
                                   "(write \"global\": a seed alone does not shuffle)"))
            self.assertEqual(h.request("GET", "/v1/iterations/bad").status, 404)

    def test_cli_status_line_says_the_shuffle_in_words(self):
        # The summary said "none shuffle" of an unshuffled iteration, a reader's guess.
        with harness.Head() as h:
            for shuffle, words in (("none", "no shuffle"), ("global", "global shuffle"),
                                   ("shard", "shard shuffle")):
                name = "shuffle-" + shuffle
                p = self.run_cli(h, "iter", "create", name, "--num-samples", "8",
                                 "--shuffle", shuffle, "--strategy", "dynamic",
                                 "--world-size", "2", "--block-size", "4")
                self.assertEqual(p.returncode, 0, p.stderr)
                p = self.run_cli(h, "iter", "status", name)
                self.assertEqual((p.returncode, p.stdout.splitlines()[0]),
                                 (0, "%s: dynamic, %s, world 2, epoch 0, blocks 0/2 done, "
                                     "0 leased" % (name, words)), p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
