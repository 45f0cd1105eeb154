"""The DistCompute-style worker interface (muster.init) driving a 3-stage pipeline."""
import threading
import time
import unittest

from common import HeadTestCase, muster


class TestDistCompute(HeadTestCase):
    def pipeline(self, **settings):
        a, b, c = self.qname("a"), self.qname("b"), self.qname("c")
        self.c.put_queue(c, **settings)
        self.c.put_queue(b, next=c, **settings)
        self.c.put_queue(a, next=b, **settings)
        return a, b, c

    def worker(self, stage, pipeline, nickname="tester"):
        return muster.init(self.head.url, stage=stage, nickname=nickname, verbose=False,
                           pipeline=pipeline, token=self.head.token)

    def test_three_stages_end_to_end(self):
        a, b, c = self.pipeline()
        self.c.put_payloads(a, ["u%d" % i for i in range(5)])
        wa, wb, wc = (self.worker(s, a, nickname="n" + s) for s in "abc")
        self.assertEqual((wa.stage_name, wb.stage_name, wc.stage_name), (a, b, c))
        self.assertEqual((wa.project, wb.project_name), (a, a))
        self.assertTrue(wa.display_name)
        self.assertEqual(wa.job_count(), 5)
        self.assertEqual(wb.job_count(), 0)
        with self.assertRaises(muster.ZeroJobError):
            wb.new_job()
        last = {}
        for stage_worker, transform in ((wa, str.upper), (wb, lambda s: s + "!"), (wc, lambda s: [s])):
            while stage_worker.job_count():
                stage_worker.new_job()
                last[stage_worker] = stage_worker.job_id
                self.assertIsInstance(stage_worker.job_id, int)
                stage_worker.log("working on %d" % stage_worker.job_id)
                stage_worker.complete_job(transform(stage_worker.job))
                self.assertIsNone(stage_worker.job)
        results = sorted(t["result"] for t in self.c.iter_tasks(c, state="done"))
        self.assertEqual(results, [["U%d!" % i] for i in range(5)])
        done = {x["nickname"]: x["completed"] for x in self.c.leaderboard()}
        self.assertEqual((done["na"], done["nb"], done["nc"]), (5, 5, 5))
        self.assertEqual(self.c.worker(wa.worker_id)["progress"], "working on %d" % last[wa])
        for w in (wa, wb, wc):
            self.assertTrue(w.is_alive())
            w.bye()
            self.assertFalse(w.is_alive())

    def test_flag_invalid_data_reopens_the_previous_stage(self):
        a, b, _ = self.pipeline(max_flags=2)
        self.c.put(a, "raw")
        wa, wb = self.worker("a", a), self.worker("b", a)
        wa.new_job()
        first = wa.job_id
        wa.complete_job("bad output")
        for _ in range(2):
            wb.new_job()
            self.assertEqual((wb.job, wb.job_id), ("bad output", first))
            wb.flag_invalid_data()
        with self.assertRaises(muster.ZeroJobError):
            wb.new_job()
        self.assertEqual(wa.job_count(), 1)  # the stage-a job is open again
        wa.new_job()
        self.assertEqual((wa.job_id, wa.job), (first, "raw"))
        wa.complete_job("good output")
        wb.new_job()
        self.assertEqual((wb.job, wb.job_id), ("good output", first))  # the same job
        wb.complete_job("ok")
        wa.bye()
        wb.bye()

    def test_job_count_leaves_out_a_job_waiting_out_its_retry_delay(self):
        # The reference loop: `if job_count() == 0: sleep, else: new_job()`.  A job failed a
        # moment ago is queued but not leasable until its backoff passed; counting it made
        # new_job raise ZeroJobError right after a non-zero count.
        a, _, _ = self.pipeline(backoff_ms=3000, backoff_max_ms=3000)
        tid = self.c.put(a, "retry me")
        w = self.worker("a", a)
        w.new_job()
        w.fail_job("transient")
        count = w.job_count()
        run_at_ms = self.c.task(tid)["run_at_ms"]
        self.assertLess(time.time() * 1000, run_at_ms, "the check ran after the delay")
        self.assertEqual((count, self.c.queue(a)["counts"]["queued"]), (0, 1))
        with self.assertRaises(muster.ZeroJobError):
            w.new_job()
        deadline = time.monotonic() + 20
        while w.job_count() == 0:
            self.assertLess(time.monotonic(), deadline, "the job never became open again")
            time.sleep(0.05)
        self.assertGreaterEqual(time.time() * 1000, run_at_ms)
        w.new_job()   # a positive count means a job to take
        self.assertEqual((w.job, w.task_id), ("retry me", tid))
        w.complete_job("ok")
        w.bye()

    @staticmethod
    def job_requests(w):
        """A function that gives the requests ``w`` sent since, other than its keepalive's."""
        sent, exchange = [], w.client._exchange

        def counted(method, path, *args):
            if not path.startswith(("/v1/workers", "/v1/leases/extend")):
                sent.append(path)
            return exchange(method, path, *args)
        w.client._exchange = counted
        return lambda: list(sent)

    def test_job_id_is_the_job_number_through_the_stages(self):
        # DistCompute's job_id names a job's files at every stage: the job's number, 1, 2,
        # 3... per pipeline (the tracker's "job #1 = 1"), while task_id is the task of the
        # stage at hand.  One request finds it at any stage.
        a, _, _ = self.pipeline()
        ids = [self.c.put(a, "job%d" % i) for i in range(3)]
        workers = [self.worker(s, a) for s in "abc"]
        seen = {}   # job_id -> [(task_id, job) at each stage]
        for w in workers:
            sent = self.job_requests(w)
            for _ in ids:
                w.new_job()
                self.assertEqual(self.c.task(w.task_id)["queue"], w.stage_name)
                seen.setdefault(w.job_id, []).append((w.task_id, w.job))
                w.complete_job(w.job + "+")
            self.assertEqual(len(sent()), 3 * 3, sent())   # lease, number, complete per job
        self.assertEqual(sorted(seen), [1, 2, 3])
        for job_id, stages in seen.items():
            self.assertEqual(stages[0][0], ids[job_id - 1])   # numbered as leased, in put order
            self.assertEqual(len({t for t, _ in stages}), 3, stages)   # three stages' tasks
            self.assertEqual([d for _, d in stages],
                             ["job%d" % (job_id - 1) + "+" * n for n in range(3)])
        # Counted from the pipeline's first queue, also when a queue before it feeds it.
        before = self.qname("before")
        self.c.put_queue(before, next=a)
        self.c.put(before, "from before")
        self.c.lease_one(before).complete("fed")
        workers[0].new_job()
        self.assertEqual((workers[0].job, workers[0].job_id), ("fed", 4))
        workers[0].complete_job("fed+")
        for w in workers:
            w.bye()

    def test_job_numbers_are_per_pipeline(self):
        a, b, _ = self.pipeline()
        other = self.qname("other")
        self.c.put_queue(other)
        self.c.put(a, "x")
        self.c.put(other, "y")
        wa, wo = self.worker("a", a), muster.init(self.head.url, stage=other, verbose=False,
                                                  token=self.head.token)
        wa.new_job()
        wo.new_job()
        self.assertEqual((wa.job_id, wo.job_id), (1, 1))
        for w in (wa, wo):
            w.complete_job("done")
        # A stage that is not in the pipeline named is refused at once, not at new_job.
        with self.assertRaises(muster.InvalidArgument) as e:
            muster.init(self.head.url, stage=other, pipeline=a, verbose=False,
                        token=self.head.token)
        self.assertIn("not a stage of pipeline", str(e.exception))
        wb = muster.init(self.head.url, stage=b, pipeline=a, verbose=False, token=self.head.token)
        wb.new_job()
        self.assertEqual((wb.job, wb.job_id), ("done", 1))
        wb.complete_job("ok")
        for w in (wa, wo, wb):
            w.bye()

    def test_bye_reopens_the_current_job_and_new_job_waits(self):
        a, _, _ = self.pipeline()
        w = self.worker("a", a)
        self.c.put(a, 1)
        w.new_job()
        w.bye()
        self.assertEqual(self.c.queue(a)["counts"]["queued"], 1)
        w2 = self.worker("a", a)
        w2.new_job()
        w2.complete_job(2)
        got = []
        t = threading.Thread(target=lambda: (w2.new_job(wait_ms=20000), got.append(w2.job)))
        t.start()
        self.c.put(a, 3)  # the long-poll lease returns once it is there
        t.join(15)
        self.assertEqual(got, [3])
        w2.complete_job()
        w2.bye()

    def test_stages_and_pipelines_are_checked(self):
        a, _, c = self.pipeline()
        with self.assertRaises(muster.InvalidArgument):
            self.worker("d", a)   # only three stages
        with self.assertRaises(muster.QueueNotFound):
            self.worker("a", "no-such-pipeline")
        # A letter past e is told the stages, not only that no queue has that name.
        with self.assertRaises(muster.QueueNotFound) as caught:
            self.worker("f", a)
        self.assertIn("stage 'f': the stages are a to e (along the pipeline's next links), "
                      "or a queue's name, and no queue is named 'f'", str(caught.exception))
        with self.assertRaises(muster.InvalidArgument):
            muster.init(self.head.url, stage="a", token=self.head.token, verbose=False)
        w = muster.init(self.head.url, stage=c, token=self.head.token, verbose=False)  # a queue name
        self.assertEqual(w.stage_name, c)
        with self.assertRaises(muster.InvalidState):
            w.complete_job(1)   # no job
        w.bye()

    def test_timed_out_worker_is_not_alive(self):
        a, _, _ = self.pipeline()
        w = muster.WorkerClient(self.head.url, stage="a", pipeline=a, token=self.head.token,
                                verbose=False, keepalive=False)
        self.c.bye(w.worker_id)   # as if it had timed out
        self.assertFalse(w.is_alive())
        with self.assertRaises(muster.WorkerNotFound):
            w.new_job()


class TestPipelineExposedToDistCompute(HeadTestCase):
    """A user coming from DistCompute (docs/coming-from.md) knows the pipeline by the
    name the head exposes it under to unchanged workers (--distcompute NAME=...), and
    may keep the tracker's address.  muster.init(pipeline=NAME) raised QueueNotFound
    ("queue 'laion' does not exist"), the compatibility address failed at its first
    request (no endpoint at /compat/distcompute/laion/v1/queues/...), and a stage
    without a pipeline did not say which pipelines the head has."""

    head_args = ("--sweep-ms", "50", "--distcompute", "laion=dc-scrape,dc-download,dc-filter")

    def init(self, url=None, **kw):
        return muster.init(url or self.head.url, verbose=False, token=self.head.token, **kw)

    def test_the_exposed_name_names_the_pipeline(self):
        self.c.put_payloads("dc-scrape", ["https://example.com/a"])
        a = self.init(stage="a", pipeline="laion")
        self.assertEqual((a.stage_name, a.project), ("dc-scrape", "laion"))
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("https://example.com/a", 1))
        a.complete_job({"page": 1})
        a.bye()
        b = self.init(stage="b", pipeline="laion")
        self.assertEqual(b.stage_name, "dc-download")
        b.new_job()
        self.assertEqual((b.job, b.job_id), ({"page": 1}, 1))   # the job's number, kept
        b.bye()
        by_queue = self.init(stage="c", pipeline="dc-scrape")
        self.assertEqual((by_queue.stage_name, by_queue.project), ("dc-filter", "dc-scrape"))
        by_queue.bye()

    def test_what_the_head_has_is_named(self):
        hint = ("this head's pipelines: dc-scrape; exposed to DistCompute clients as laion "
                "(its first queue dc-scrape)")
        with self.assertRaises(muster.InvalidArgument) as cm:
            self.init(stage="a")
        self.assertIn("name the pipeline (its first queue) with pipeline= or $MUSTER_PIPELINE "
                      "(%s)" % hint, cm.exception.message)
        with self.assertRaises(muster.QueueNotFound) as cm:
            self.init(stage="a", pipeline="laion-5b")
        self.assertEqual(cm.exception.message,
                         "pipeline 'laion-5b': no queue has that name, and the head exposes no "
                         "DistCompute pipeline by it; a pipeline is named by its first queue "
                         "(%s)" % hint)

    def test_the_compatibility_address_is_refused_with_the_head_s(self):
        workers = len(self.c.workers())
        with self.assertRaises(ValueError) as cm:
            self.init(url=self.head.url + "/compat/distcompute/laion/", stage="a")
        self.assertEqual(str(cm.exception),
                         "url '%s/compat/distcompute/laion' is the DistCompute compatibility "
                         "address of pipeline 'laion', which the unchanged distcompute_client "
                         "talks to; muster.init talks to the head's own API with its token: "
                         "muster.init('%s', stage=..., pipeline='laion')"
                         % (self.head.url, self.head.url))
        self.assertEqual(len(self.c.workers()), workers)   # nothing registered


if __name__ == "__main__":
    unittest.main()
