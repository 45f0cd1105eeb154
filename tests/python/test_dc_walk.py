"""muster.init as a user of LAION's DistCompute client meets it (docs/coming-from.md): a
head that restarts under a running worker is waited for, as distcompute_client waits,
and the calls that cannot be made say why, in the words of the pipeline the user named.
"""
import threading
import unittest

from common import HeadTestCase, harness, muster

import muster.distcompute as dc


class TestDistComputeWalkMessages(HeadTestCase):
    head_args = ("--sweep-ms", "50", "--distcompute", "walk=walk-a,walk-b,walk-c")

    def init(self, url=None, **kw):
        kw.setdefault("token", self.head.token)
        return muster.init(url or self.head.url, verbose=False, **kw)

    def test_a_call_after_the_job_ended_says_how_it_ended(self):
        self.c.put_payloads("walk-a", ["one", "two"])
        w = self.init(stage="a", pipeline="walk")
        w.new_job()
        number = w.job_id
        w.complete_job({"page": 1})
        for call in (lambda: w.complete_job("again"), w.flag_invalid_data, w.fail_job):
            with self.assertRaises(muster.InvalidState) as cm:
                call()
            self.assertIn("no current job: job %d was completed (call new_job for the next)"
                          % number, cm.exception.message)
        w.new_job()
        number = w.job_id
        w.flag_invalid_data()
        with self.assertRaises(muster.InvalidState) as cm:
            w.complete_job("late")
        self.assertIn("job %d was flagged invalid" % number, cm.exception.message)
        w.bye()
        fresh = self.init(stage="a", pipeline="walk")
        with self.assertRaises(muster.InvalidState) as cm:
            fresh.complete_job("x")
        self.assertIn("complete_job: no current job (call new_job first)", cm.exception.message)
        fresh.bye()

    def test_stages_are_told_in_the_pipeline_s_own_name(self):
        with self.assertRaises(muster.InvalidArgument) as cm:
            self.init(stage="d", pipeline="walk")
        self.assertEqual(cm.exception.message, "stage 'd': pipeline 'walk' has only 3 stage(s) "
                         "(a: walk-a, b: walk-b, c: walk-c)")
        with self.assertRaises(muster.QueueNotFound) as cm:
            self.init(stage="WALK-B", pipeline="walk")
        self.assertEqual(cm.exception.message,
                         "stage 'WALK-B': no queue has that name; pipeline 'walk' has the "
                         "stages a: walk-a, b: walk-b, c: walk-c (give a letter, or a queue's "
                         "name as it is written)")
        with self.assertRaises(muster.InvalidArgument) as cm:
            self.init(stage="", pipeline="walk")
        self.assertEqual(cm.exception.message,
                         "stage '': give a stage letter, a to e, or a queue's name")

    def test_a_url_that_is_not_a_head_is_told_before_the_pipeline(self):
        with harness.not_muster_server() as url:
            with self.assertRaises(muster.NotFound) as cm:
                self.init(url=url, stage="a")   # no pipeline: that is not the problem
        self.assertIn("it is likely not a muster head", cm.exception.message)
        with self.assertRaises(muster.Unauthorized):
            self.init(stage="a", token="not-this-head-s-token")


class TestDistComputeWalkRestart(harness.RestartableHeadCase):
    """kill -9 of the head under a muster.init worker: its calls wait for the head, as
    distcompute_client's do, and what was acknowledged stays."""

    def setUp(self):
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port(),
                                  "--distcompute", "walk=walk-a,walk-b", "--sweep-ms", "50"])
        self.head.start()
        self.proxy = None
        self.c = muster.Client(self.head.url, self.head.token)
        self.addCleanup(self.c.close)
        self.first_s = dc.RETRY_FIRST_S
        dc.RETRY_FIRST_S = 0.02
        self.addCleanup(setattr, dc, "RETRY_FIRST_S", self.first_s)

    def worker(self, **kw):
        w = muster.init(self.head.url, stage="a", pipeline="walk", nickname="walker",
                        token=self.head.token, verbose=False, **kw)
        said = []
        w._say = said.append    # the retries are said (to stderr with verbose)
        return w, said

    def test_a_call_made_while_the_head_is_down_waits_for_it(self):
        self.c.put_payloads("walk-a", ["p1", "p2"])
        w, said = self.worker()
        w.new_job()
        number, task = w.job_id, w.task_id
        w.log("half way")
        self.head.kill()
        done = []
        t = threading.Thread(target=lambda: done.append(w.complete_job({"n": number})))
        t.start()
        harness.wait_until(lambda: any(m.startswith("complete_job: network") for m in said),
                           what="a retry of complete_job")
        self.head.start()
        t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(done[0]["task"], task)
        self.assertEqual(self.c.task(task)["state"], "done")
        [child] = self.c.iter_tasks("walk-b")
        self.assertEqual(child["payload"], {"n": number})
        self.assertTrue(w.is_alive())
        w.new_job()                         # the worker carries on after the restart
        self.assertEqual((w.job, w.job_id), ("p2", number + 1))
        w.complete_job("ok")
        [me] = [e for e in self.c.leaderboard() if e["nickname"] == "walker"]
        self.assertEqual(me["completed"], 2)
        w.bye()

    def test_without_retry_the_call_raises_at_once(self):
        self.c.put_payloads("walk-a", ["p1"])
        w, said = self.worker(retry=False, keepalive=False)
        w.new_job()
        self.head.kill()
        with self.assertRaises(muster.NetworkError):
            w.log("nobody listens")
        self.assertFalse([m for m in said if "trying again" in m], said)
        self.head.start()
        w.complete_job("after")
        w.bye()

    def test_bye_to_a_head_that_stays_down_gives_up(self):
        """A worker's program can exit when the head is gone for good: bye waits
        BYE_WAIT_S, says so and returns, where the other calls wait for the head."""
        self.addCleanup(setattr, dc, "BYE_WAIT_S", dc.BYE_WAIT_S)
        dc.BYE_WAIT_S = 0.5
        w, said = self.worker(keepalive=False)
        self.head.kill()
        t = threading.Thread(target=w.bye, daemon=True)
        t.start()
        t.join(20)
        self.assertFalse(t.is_alive(), "bye waited for a head that stays down")
        self.assertTrue([m for m in said if m.startswith("bye: network")], said)
        self.assertTrue([m for m in said if m.startswith("bye: the head did not answer")], said)
        self.assertFalse(w.is_alive())


if __name__ == "__main__":
    unittest.main()
