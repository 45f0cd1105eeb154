"""The DistCompute tracker API (docs/dashboard.md, docs/api.md "DistCompute compatibility"),
end to end with a client that sends exactly what the unmodified DistCompute Python client
sends: `GET api/new` with query parameters, JSON bodies without a bearer token, plain-text
replies, `<!json!>` for lists and dicts, 400/403/404 as its error classes.

Every test works in a pipeline of its own (the head exposes several), so tests do not
see each other's jobs.
"""
import json
import os
import subprocess
import sqlite3
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
import harness  # noqa: E402
import muster  # noqa: E402

PIPELINES = ("reg", "three", "json", "flag", "bye", "file", "errors", "live", "keep", "mixed")


class TrackerError(Exception):
    def __init__(self, status, text):
        super().__init__("%d %s" % (status, text))
        self.status, self.text = status, text


class DCClient:
    """The DistCompute client's requests, one for one (distcompute_client.Client)."""

    def __init__(self, url, stage, nickname="anonymous"):
        self.url = url.rstrip("/")
        self.stage = stage
        data = json.loads(self._request("GET", "/api/new",
                                        params={"nickname": nickname, "stage": stage}))
        self.token = data["token"]
        self.display_name = data["display_name"]
        self.project = data["project"]
        self.stage_name = data["stage_name"]
        self.job = self.job_id = None

    def _request(self, method, endpoint, params=None, json_body=None):
        url = self.url + endpoint
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = headers = None
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise TrackerError(e.code, e.read().decode()) from None

    def job_count(self):
        return int(self._request("GET", "/api/jobCount", params={"stage": self.stage}))

    def new_job(self):
        data = json.loads(self._request("POST", "/api/newJob", json_body={"token": self.token}))
        self.job, self.job_id = data["data"], data["number"]
        if self.job.startswith("<!json!>"):
            self.job = json.loads(self.job[8:])

    def complete_job(self, data):
        if isinstance(data, (dict, list)):
            data = "<!json!>" + json.dumps(data)
        self._request("POST", "/api/completeJob", json_body={"token": self.token, "data": data})
        self.job = self.job_id = None

    def log(self, progress):
        self._request("POST", "/api/updateProgress",
                      json_body={"token": self.token, "progress": progress})

    def is_alive(self):
        return "True" in self._request("POST", "/api/validateWorker",
                                       json_body={"token": self.token})

    def flag_invalid_data(self):
        self._request("POST", "/api/flagInvalidData", json_body={"token": self.token})
        self.job = self.job_id = None

    def bye(self):
        self._request("POST", "/api/bye", json_body={"token": self.token})


class TrackerCase(unittest.TestCase):
    """One head exposing every pipeline of PIPELINES; helpers."""
    head = None
    worker_timeout_ms = 60000

    @classmethod
    def setUpClass(cls):
        args = ["--sweep-ms", "50", "--worker-timeout-ms", str(cls.worker_timeout_ms)]
        for p in PIPELINES:
            args += ["--distcompute", "%s=%s_a,%s_b,%s_c" % (p, p, p, p)]
        cls.head = harness.Head(args).start()

    @classmethod
    def tearDownClass(cls):
        cls.head.cleanup()

    def url(self, pipeline):
        return self.head.url + "/compat/distcompute/" + pipeline

    def put(self, queue, *payloads):
        r = self.head.request("POST", "/v1/queues/%s/tasks" % queue,
                              {"tasks": [{"payload": p} for p in payloads]})
        self.assertEqual(r.status, 201, r)
        return [t["id"] for t in r.json["tasks"]]

    def task_list(self, queue, state=None):
        path = "/v1/queues/%s/tasks" % queue + ("?state=" + state if state else "")
        return self.head.request("GET", path).json["tasks"]

    def worker(self, name):
        workers = self.head.request("GET", "/v1/workers").json["workers"]
        return [w for w in workers if w["name"] == name][0]

    def raw(self, method, path, body=None):
        """One request without the client's conveniences: (status, content type, text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.head.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.headers.get("Content-Type"), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read().decode()


class DistComputeTest(TrackerCase):

    def test_register(self):
        c = DCClient(self.url("reg"), "a", nickname="Cluster 2 on AWS")
        self.assertEqual((c.project, c.stage_name), ("reg", "reg_a"))
        self.assertRegex(c.token, r"^[0-9a-f]{32}$")
        w = self.worker(c.display_name)
        self.assertEqual((w["nickname"], w["queues"], w["state"], w["labels"]),
                         ("Cluster 2 on AWS", ["reg_a"], "active",
                          {"distcompute": "reg", "stage": "a"}))
        b = DCClient(self.url("reg"), "b")
        self.assertEqual((b.stage_name, self.worker(b.display_name)["nickname"]),
                         ("reg_b", "anonymous"))
        self.assertNotEqual(b.token, c.token)
        self.assertTrue(c.is_alive())
        # The pipeline is listed for readers of the API.
        pipes = self.head.request("GET", "/v1/distcompute").json["pipelines"]
        reg = [p for p in pipes if p["name"] == "reg"][0]
        self.assertEqual(reg["stages"], [{"stage": "a", "queue": "reg_a"},
                                         {"stage": "b", "queue": "reg_b"},
                                         {"stage": "c", "queue": "reg_c"}])
        self.assertEqual(reg["prefix"], "/compat/distcompute/reg")

    def test_bad_requests(self):
        for stage, why in (("x", "Invalid worker stage"), ("d", "disabled"), ("", "Invalid")):
            status, ctype, text = self.raw("GET", "/compat/distcompute/errors/api/new?nickname=n"
                                          "&stage=" + stage)
            self.assertEqual(status, 400, text)
            self.assertIn(why, text)
            self.assertTrue(ctype.startswith("text/plain"), ctype)
        status, _, text = self.raw("GET", "/compat/distcompute/nosuch/api/new?nickname=n&stage=a")
        self.assertEqual(status, 404, text)
        status, _, text = self.raw("GET", "/compat/distcompute/errors/api/jobCount?stage=e")
        self.assertEqual(status, 400, text)
        status, _, _ = self.raw("POST", "/compat/distcompute/errors/api/newJob", {})
        self.assertEqual(status, 400)
        status, _, _ = self.raw("POST", "/compat/distcompute/errors/api/newJob", {"token": 5})
        self.assertEqual(status, 400)
        status, _, text = self.raw("POST", "/compat/distcompute/errors/api/newJob",
                                   {"token": "f" * 32})
        self.assertEqual(status, 404, text)
        self.assertIn("time out", text)
        c = DCClient(self.url("errors"), "a")
        status, _, _ = self.raw("POST", "/compat/distcompute/errors/api/completeJob",
                                {"token": c.token})
        self.assertEqual(status, 400)  # no data
        with self.assertRaises(TrackerError) as e:
            c.complete_job("x")        # no open job
        self.assertEqual(e.exception.status, 403)
        with self.assertRaises(TrackerError) as e:
            c.flag_invalid_data()
        self.assertEqual(e.exception.status, 403)
        # An unknown token is simply not alive.
        status, _, text = self.raw("POST", "/compat/distcompute/errors/api/validateWorker",
                                   {"token": "nope"})
        self.assertEqual((status, text), (200, "False"))

    def test_no_jobs_gives_403(self):
        c = DCClient(self.url("errors"), "c")
        self.assertEqual(c.job_count(), 0)
        with self.assertRaises(TrackerError) as e:
            c.new_job()
        self.assertEqual(e.exception.status, 403)
        self.assertIn("no new jobs", e.exception.text)
        self.assertTrue(c.is_alive())  # the poll kept it alive

    def test_three_stages(self):
        first, second = self.put("three_a", "s3://shard-1.tar", "s3://shard-2.tar")
        a = DCClient(self.url("three"), "a", nickname="three-alice")
        b = DCClient(self.url("three"), "b", nickname="three-bob")
        c = DCClient(self.url("three"), "c", nickname="three-carol")
        self.assertEqual((a.job_count(), b.job_count(), c.job_count()), (2, 0, 0))
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("s3://shard-1.tar", 1))
        self.assertEqual(a.job_count(), 1)
        a.log("12 / 100 (12%)")
        w = self.worker(a.display_name)
        self.assertEqual((w["progress"], w["leases"]), ("12 / 100 (12%)", 1))
        a.complete_job({"file": "s3://job_1.tar", "total_scraped": 123})
        self.assertEqual((a.job_count(), b.job_count()), (1, 1))
        # Stage b gets stage a's output, as JSON, under the same job number.
        b.new_job()
        self.assertEqual((b.job, b.job_id), ({"file": "s3://job_1.tar", "total_scraped": 123}, 1))
        b.complete_job("filtered-1")
        c.new_job()
        self.assertEqual((c.job, c.job_id), ("filtered-1", 1))
        c.complete_job(["done", 1])
        # The last stage closes the job: its result is stored as JSON, chained by parents.
        [last] = self.task_list("three_c", "done")
        self.assertEqual(last["result"], ["done", 1])
        chain_b = self.head.request("GET", "/v1/tasks/%d" % last["parent"]).json
        self.assertEqual((chain_b["queue"], chain_b["result"]), ("three_b", "filtered-1"))
        self.assertEqual(chain_b["parent"], first)
        # The second job is number 2 all the way.
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("s3://shard-2.tar", 2))
        a.complete_job("x")
        b.new_job()
        self.assertEqual(b.job_id, 2)
        self.assertEqual(self.task_list("three_a", "done")[1]["id"], second)
        # Workers count on the leaderboard by nickname.
        board = {e["nickname"]: e for e in self.head.request("GET", "/v1/leaderboard").json[
            "leaderboard"]}
        self.assertEqual((board["three-alice"]["completed"], board["three-bob"]["completed"],
                          board["three-carol"]["completed"]), (2, 1, 1))
        for x in (a, b, c):
            x.bye()

    def test_json_round_trip(self):
        value = {"urls": ["a", "b"], "n": 3, "nested": {"ok": True, "none": None},
                 "text": "caf\u00e9 <!json!> \u2713"}
        self.put("json_a", value, [1, 2, 3], "plain string", "ends in <!json!>")
        a = DCClient(self.url("json"), "a")
        seen = []
        for _ in range(4):
            a.new_job()
            seen.append(a.job)
            a.complete_job(a.job if isinstance(a.job, (dict, list)) else "s:" + a.job)
        self.assertEqual(seen, [value, [1, 2, 3], "plain string", "ends in <!json!>"])
        b = DCClient(self.url("json"), "b")
        got = []
        for _ in range(4):
            b.new_job()
            got.append(b.job)
            b.complete_job("ok")
        self.assertEqual(got, [value, [1, 2, 3], "s:plain string", "s:ends in <!json!>"])
        # What muster stored for stage b is real JSON, not an encoded string.
        payloads = [t["payload"] for t in self.task_list("json_b")]
        self.assertEqual(payloads[0], value)
        # The raw wire form carries the prefix.
        self.put("json_a", {"k": 1})
        status, ctype, text = self.raw("POST", "/compat/distcompute/json/api/newJob",
                                       {"token": a.token})
        self.assertEqual((status, json.loads(text)["data"]), (200, '<!json!>{"k":1}'))
        self.assertTrue(ctype.startswith("application/json"))

    def test_flag_five_times_rolls_back_a_stage(self):
        [root] = self.put("flag_a", "input-1")
        a = DCClient(self.url("flag"), "a", nickname="alice")
        a.new_job()
        a.complete_job("bad output")
        b = DCClient(self.url("flag"), "b", nickname="bob")
        for i in range(5):
            self.assertEqual(b.job_count(), 1, "flag %d" % i)
            b.new_job()
            self.assertEqual((b.job, b.job_id), ("bad output", 1))
            b.flag_invalid_data()
        # Five flags: stage b's task is cancelled and the job is back at stage a.
        self.assertEqual((a.job_count(), b.job_count()), (1, 0))
        [cancelled] = self.task_list("flag_b", "cancelled")
        self.assertEqual((cancelled["flags"], cancelled["parent"]), (5, root))
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("input-1", 1))
        a.complete_job("good output")
        b.new_job()
        self.assertEqual((b.job, b.job_id), ("good output", 1))
        self.assertEqual(self.worker(b.display_name)["flagged"], 5)

    def test_bye_reopens_the_job(self):
        self.put("bye_a", "only job")
        a = DCClient(self.url("bye"), "a")
        a.new_job()
        self.assertEqual(a.job_count(), 0)
        a.bye()
        self.assertEqual(a.job_count(), 1)
        self.assertFalse(a.is_alive())
        with self.assertRaises(TrackerError) as e:
            a.log("still here?")
        self.assertEqual(e.exception.status, 404)
        self.assertEqual(self.worker(a.display_name)["state"], "gone")
        other = DCClient(self.url("bye"), "a")
        other.new_job()
        self.assertEqual((other.job, other.job_id), ("only job", 1))
        # A new job request while holding one gives the held one back first (and,
        # being the oldest, it is the one handed out again).
        self.put("bye_a", "second")
        other.new_job()
        self.assertEqual((other.job, other.job_count()), ("only job", 1))
        self.assertEqual(self.worker(other.display_name)["leases"], 1)

    def test_put_file_and_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            txt, js = os.path.join(tmp, "jobs.txt"), os.path.join(tmp, "jobs.json")
            with open(txt, "w") as f:
                f.write("line one\n\nline two\r\n")
            with open(js, "w") as f:
                json.dump(["plain", {"url": "u"}, [1, 2]], f)
            env = dict(os.environ, MUSTER_URL=self.head.url, MUSTER_TOKEN=self.head.token)
            for args in (["--file", txt], ["--json", js]):
                out = subprocess.run([harness.MUSTER_BIN, "put", "--queue", "file_a"] + args,
                                     env=env, capture_output=True, text=True, timeout=60)
                self.assertEqual(out.returncode, 0, out.stderr)
        a = DCClient(self.url("file"), "a")
        jobs = []
        while a.job_count():
            a.new_job()
            jobs.append((a.job, a.job_id))
            a.complete_job("ok")
        self.assertEqual(jobs, [("line one", 1), ("line two", 2), ("plain", 3),
                                ({"url": "u"}, 4), ([1, 2], 5)])


    def test_python_workers_number_the_same_jobs(self):
        # The tracker's workers and muster's Python DistCompute client on one pipeline: a
        # job has one number, whichever kind of worker leases it at whichever stage.
        self.put("mixed_a", "first", "second")
        a = DCClient(self.url("mixed"), "a")
        a.new_job()
        a.complete_job("first+")
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("second", 2))
        b = muster.init(self.head.url, stage="b", pipeline="mixed_a", token=self.head.token,
                        verbose=False)
        b.new_job()
        self.assertEqual((b.job, b.job_id), ("first+", 1))
        b.complete_job("first++")
        a.complete_job("second+")
        b.new_job()
        self.assertEqual((b.job, b.job_id), ("second+", 2))
        b.complete_job("second++")
        c = DCClient(self.url("mixed"), "c")
        c.new_job()
        self.assertEqual((c.job, c.job_id), ("first++", 1))
        c.complete_job("done")
        self.put("mixed_a", "third")
        b.bye()
        for x in (a, c):
            x.bye()
        py = muster.init(self.head.url, stage="a", pipeline="mixed_a", token=self.head.token,
                         verbose=False)
        py.new_job()
        self.assertEqual((py.job, py.job_id), ("third", 3))
        py.bye()


class DistComputeRetentionTest(unittest.TestCase):
    """Job numbers with a retention of done tasks: a job keeps its number after its earlier
    stages' tasks were removed, and the head keeps no number of a job none of whose tasks
    is left (read from the store once the head stopped)."""

    def setUp(self):
        self.head = harness.Head(["--sweep-ms", "50", "--distcompute", "ret=ret_a,ret_b,ret_c"])
        self.head.start()
        for queue in ("ret_a", "ret_b", "ret_c"):
            r = self.head.request("PUT", "/v1/queues/" + queue, {"keep_done_ms": 0})
            self.assertEqual(r.status, 200, r)
        self.url = self.head.url + "/compat/distcompute/ret"

    def tearDown(self):
        self.head.cleanup()

    def removed(self, queue, n):
        """Waits until the retention removed `n` done tasks of `queue`."""
        harness.wait_until(
            lambda: self.head.request("GET", "/v1/queues/" + queue).json["reaped"] >= n,
            timeout=20, what="the retention of %s" % queue)

    def test_numbers_outlive_removed_stages_and_go_with_the_job(self):
        r = self.head.request("POST", "/v1/queues/ret_a/tasks",
                              {"tasks": [{"payload": "one"}, {"payload": "two"}]})
        self.assertEqual(r.status, 201, r)
        a, b, c = (DCClient(self.url, s) for s in "abc")
        for _ in range(2):
            a.new_job()
            a.complete_job(a.job + "+")
        b.new_job()
        self.assertEqual((b.job, b.job_id), ("one+", 1))
        b.complete_job("one++")
        self.removed("ret_a", 2)
        self.removed("ret_b", 1)
        # Job 1's tasks at stages a and b are gone: its stage-c task still is job 1.
        c.new_job()
        self.assertEqual((c.job, c.job_id), ("one++", 1))
        c.complete_job("done")
        b.new_job()
        b.complete_job("two++")
        c.new_job()
        self.assertEqual((c.job, c.job_id), ("two++", 2))
        c.complete_job("done")
        self.removed("ret_c", 2)
        self.removed("ret_b", 2)
        self.assertEqual(self.head.stop(), 0, self.head.log())
        db = sqlite3.connect("file:%s?mode=ro" % os.path.join(self.head.data_dir, "muster.db"),
                             uri=True)
        try:
            self.assertEqual(db.execute("SELECT count(*) FROM tasks").fetchone(), (0,))
            self.assertEqual(db.execute("SELECT count(*) FROM compat_numbers").fetchone(), (0,))
            self.assertEqual(db.execute("SELECT pipeline, last FROM compat_counters").fetchall(),
                             [("ret_a", 2)])
        finally:
            db.close()


    def test_numbers_cross_a_stage_that_numbers_nothing(self):
        # Stage b is worked through the plain API (as `muster worker` does), which asks for
        # no number; the retention removes the job's tasks of stages a and b before stage c
        # leases: stage c still sees the job's number.
        r = self.head.request("POST", "/v1/queues/ret_a/tasks",
                              {"tasks": [{"payload": "one"}, {"payload": "two"}]})
        self.assertEqual(r.status, 201, r)
        a, c = DCClient(self.url, "a"), DCClient(self.url, "c")
        for _ in range(2):
            a.new_job()
            a.complete_job(a.job + "+")
        for _ in range(2):
            r = self.head.request("POST", "/v1/queues/ret_b/lease", {"max": 1})
            self.assertEqual(r.status, 200, r)
            lease = r.json["leases"][0]
            r = self.head.request("POST", "/v1/leases/complete", {"leases": [
                {"task": lease["task"], "token": lease["token"], "result": "b+"}]})
            self.assertEqual(r.status, 200, r)
        self.removed("ret_a", 2)
        self.removed("ret_b", 2)
        for number in (1, 2):
            c.new_job()
            self.assertEqual((c.job, c.job_id), ("b+", number))
            c.complete_job("done")

class DistComputeTimeoutTest(TrackerCase):
    """Timeouts follow the worker heartbeat: a short one here."""
    worker_timeout_ms = 600

    def test_worker_timeout_gives_404_and_reopens(self):
        self.put("live_a", "job")
        a = DCClient(self.url("live"), "a")
        a.new_job()
        self.assertEqual(a.job_count(), 0)
        # (Asking the tracker would heart-beat it: watch it through the API instead.)
        harness.wait_until(lambda: self.worker(a.display_name)["state"] == "gone", timeout=10,
                           what="the worker to time out")
        self.assertFalse(a.is_alive())
        with self.assertRaises(TrackerError) as e:
            a.log("late")
        self.assertEqual(e.exception.status, 404)
        with self.assertRaises(TrackerError) as e:
            a.complete_job("late")
        self.assertEqual(e.exception.status, 404)
        # The job comes back (after the queue's retry backoff) for another worker.
        harness.wait_until(lambda: a.job_count() == 1, timeout=10, what="the job to re-open")
        b = DCClient(self.url("live"), "a")
        b.new_job()
        self.assertEqual((b.job, b.job_id), ("job", 1))
        b.complete_job("done")

    def test_calls_keep_a_worker_and_its_job_alive(self):
        self.put("keep_b", "long job")
        a = DCClient(self.url("keep"), "b")
        a.new_job()
        # Four timeouts' worth of work, reporting progress now and then.
        deadline = time.monotonic() + 2.4
        n = 0
        while time.monotonic() < deadline:
            n += 1
            a.log("step %d" % n)
            time.sleep(0.15)  # the pace of the simulated work, not a synchronisation
        self.assertTrue(a.is_alive())
        a.complete_job("finished")
        self.assertEqual(self.task_list("keep_b", "done")[0]["result"], "finished")


if __name__ == "__main__":
    unittest.main(verbosity=2)
