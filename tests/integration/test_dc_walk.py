"""The DistCompute tracker routes as a user of the unchanged client meets them: what a
404 says (a pipeline that is not exposed, a token this head never gave, a worker that
is gone), and a worker that carries on across a kill -9 of the head with nothing it was
told was done lost (docs/dashboard.md, "DistCompute compatibility")."""
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from test_distcompute import DCClient, TrackerError  # noqa: E402

GONE = "The server could not find this worker. Did the worker time out?"


def raw(url, body=None):
    """(status, text) of one request as the client sends it."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class DistComputeWalkTest(unittest.TestCase):
    def setUp(self):
        self.head = harness.Head(["--listen", "127.0.0.1:%d" % harness.free_port(),
                                  "--sweep-ms", "50", "--distcompute", "walk=wk-a,wk-b"]).start()
        self.addCleanup(self.head.cleanup)
        self.url = self.head.url + "/compat/distcompute/walk"

    def put(self, queue, *payloads):
        r = self.head.request("POST", "/v1/queues/%s/tasks" % queue,
                              {"tasks": [{"payload": p} for p in payloads]})
        self.assertEqual(r.status, 201, r)

    def test_a_pipeline_not_exposed_is_named(self):
        status, text = raw(self.head.url + "/compat/distcompute/laion/api/new?nickname=n&stage=a")
        self.assertEqual(status, 404)
        self.assertEqual(text, "No DistCompute pipeline 'laion' is exposed by this head (it "
                         "exposes 1: the names given to `muster head --distcompute NAME=...`, "
                         "which GET /v1/distcompute lists with the head's token). A client's "
                         "URL is http://HEAD:PORT/compat/distcompute/NAME.")
        self.assertNotIn("walk", text)   # the names are not told to anyone who asks
        status, text = raw(self.head.url + "/compat/distcompute/a%20b/api/jobCount?stage=a")
        self.assertEqual(status, 404)
        self.assertTrue(text.startswith("No DistCompute pipeline of that name is exposed"), text)

    def test_a_client_given_the_heads_root_url_is_told_the_url(self):
        """The tracker's client appends /api/new to the URL it is given; given the head's
        root, it must hear (and the head's log must say) which URL it needs."""
        status, text = raw(self.head.url + "/api/new?nickname=n&stage=a")
        self.assertEqual(status, 404)
        self.assertEqual(text, "This is a muster head's root URL, not a DistCompute "
                         "pipeline's. A DistCompute client's URL is "
                         "http://HEAD:PORT/compat/distcompute/NAME, where NAME is a pipeline "
                         "given to `muster head --distcompute NAME=QUEUE_A,QUEUE_B,...` (this "
                         "head exposes 1).")
        status, again = raw(self.head.url + "/api/newJob", {"token": "f" * 32})
        self.assertEqual((status, again), (404, text))
        said = [ln for ln in self.head.log().splitlines() if "at the head's root URL" in ln]
        self.assertEqual(len(said), 1, self.head.log())   # once a minute at most
        self.assertIn("called /api/new, a DistCompute endpoint", said[0])
        self.assertIn("/compat/distcompute/NAME", said[0])
        # A name the tracker does not have is a JSON 404 that says which it has.
        status, other = raw(self.head.url + "/api/other")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(other)["error"]["code"], "not_found")
        self.assertIn("/api/other is not a DistCompute tracker endpoint", other)
        self.assertIn("(new, newJob, jobCount,", other)

    def test_an_unknown_token_and_a_gone_worker_say_which(self):
        status, text = raw(self.url + "/api/newJob", {"token": "f" * 32})
        self.assertEqual(status, 404)
        self.assertEqual(text, GONE + " (No worker of pipeline 'walk' has this token: it is "
                         "not one this head gave out, but another pipeline's or head's, or "
                         "from before the head's data was replaced. Register with api/new.)")
        c = DCClient(self.url, "a", nickname="walker")
        c.bye()
        status, text = raw(self.url + "/api/updateProgress", {"token": c.token, "progress": "p"})
        self.assertEqual(status, 404)
        self.assertEqual(text, GONE + " (Worker '%s' is gone: it said bye, or was silent longer "
                         "than its timeout of 60000 ms. Register again with api/new.)"
                         % c.display_name)

    def test_a_worker_carries_on_across_a_kill_of_the_head(self):
        self.put("wk-a", "j1", "j2", "j3")
        a = DCClient(self.url, "a", nickname="walker")
        a.new_job()
        a.log("1 / 3")
        a.complete_job({"done": 1})      # acknowledged: it must stay done
        a.new_job()
        a.log("2 / 3 half way")          # held across the kill, with its progress
        held = a.job_id
        self.head.kill()
        self.head.start()
        self.assertTrue(a.is_alive())
        [w] = self.head.request("GET", "/v1/workers").json["workers"]
        self.assertEqual((w["progress"], w["completed"], w["leases"]), ("2 / 3 half way", 1, 1))
        a.complete_job({"done": 2})      # the job held before the kill
        self.assertEqual(held, 2)
        a.new_job()
        self.assertEqual((a.job, a.job_id), ("j3", 3))
        a.complete_job({"done": 3})
        with self.assertRaises(TrackerError) as e:
            a.complete_job("again")
        self.assertEqual((e.exception.status, e.exception.text),
                         (403, "You do not have an open job."))
        b = DCClient(self.url, "b", nickname="walker")
        self.assertEqual(b.job_count(), 3)
        board = self.head.request("GET", "/v1/leaderboard").json["leaderboard"]
        self.assertEqual(board, [{"nickname": "walker", "completed": 3, "failed": 0,
                                  "flagged": 0, "workers": 2}])


if __name__ == "__main__":
    unittest.main()
