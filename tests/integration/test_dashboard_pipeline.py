"""The dashboard in headless Chromium (test_dashboard_browser.Browser) watching a
pipeline the way a DistCompute operator does, on the cases the main story does not
reach: a worker holding more tasks than one listing of leased tasks returns (its row
and its page must still count them all), a pipeline's DistCompute view must show the
workers that serve its stages without being DistCompute clients (native workers,
muster.distcompute clients), and the throughput chart's axis must be labelled with the
values its grid lines stand for.
"""
import os
import sys
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_dashboard_browser import DashboardCase  # noqa: E402



class DashboardPipelineTest(DashboardCase):
    READ_TOKEN = "pipeline-read-token"
    HEAD_ARGS = ["--distcompute", "laion=pl_scrape,pl_download"]

    def worker(self, nickname, queues, labels=None):
        return self.api("POST", "/v1/workers", {"nickname": nickname, "queues": queues,
                                                "labels": labels}, status=201)

    def lease(self, queue, worker, count):
        got = []
        while len(got) < count:
            got += self.api("POST", "/v1/queues/%s/lease" % queue,
                            {"worker": worker, "max": min(1000, count - len(got))})["leases"]
        return got

    def test_busy_workers_count_every_task_they_hold(self):
        # The page lists the first 1000 leased tasks of a queue: `early` holds all of
        # them, so `late`'s five are not in that listing.
        self.api("PUT", "/v1/queues/busy", {}, status=201)
        for start in range(0, 1005, 1000):
            self.api("POST", "/v1/queues/busy/tasks", {"tasks": [
                {"payload": "t-%d" % i} for i in range(start, min(1005, start + 1000))]},
                status=201)
        early, late = self.worker("early", ["busy"]), self.worker("late", ["busy"])
        first = self.lease("busy", early["id"], 1000)
        self.lease("busy", late["id"], 5)
        self.open("/")
        b = self.browser
        task = '#workers-table tr[data-worker="%s"] td[data-field="task"]'
        self.assertEqual(b.text(task % late["name"]), "5 tasks")
        self.assertEqual(b.text(task % early["name"]),
                         "#%d #%d #%d +997 more" % tuple(x["task"] for x in first[:3]))
        self.open("/#/worker/%d" % late["id"])
        harness.wait_until(lambda: b.visible("#worker-holding"), what="the worker page")
        self.assertEqual(b.text("#worker-holding"), "Working on 5 tasks")
        self.assertIn("5 not shown", b.text("#worker-unlisted"))
        self.open("/#/worker/%d" % early["id"])
        harness.wait_until(lambda: b.visible("#worker-holding"), what="the worker page")
        self.assertEqual(b.text("#worker-holding"), "Working on 1,000 tasks")
        self.assertEqual(b.js("return document.querySelectorAll('#worker pre').length;"), 20)
        self.assertIn("980 more not shown", b.text("#worker-unlisted"))

    def test_refresh_reads_no_payloads(self):
        # Three held tasks of 300 KB each: the page must not read them at every refresh,
        # only the worker's page reads the payloads it shows.
        self.api("PUT", "/v1/queues/fat", {}, status=201)
        self.api("POST", "/v1/queues/fat/tasks", {"tasks": [
            {"payload": {"n": i, "blob": "y" * 300000}} for i in range(3)]}, status=201)
        w = self.worker("fat-holder", ["fat"])
        self.lease("fat", w["id"], 3)
        self.open("/")
        b = self.browser
        self.assertEqual(b.text('#workers-table tr[data-worker="%s"] td[data-field="task"]'
                                % w["name"]).count("#"), 3)
        sizes = b.js("return performance.getEntriesByType('resource')"
                     ".filter(e => e.name.includes('/v1/queues/fat/tasks'))"
                     ".map(e => e.decodedBodySize);")
        self.assertTrue(sizes)
        self.assertLess(max(sizes), 5000, sizes)
        self.open("/#/worker/%d" % w["id"])
        harness.wait_until(lambda: b.visible("#worker-holding"), what="the worker page")
        self.assertEqual(b.text("#worker-holding"), "Working on 3 tasks")
        payloads = b.js("return [...document.querySelectorAll('#worker pre')].map(e => e.textContent);")
        self.assertEqual(len(payloads), 3)
        for text in payloads:
            self.assertTrue(text.startswith('{\n  "n": ') and text.endswith("yyy…"), text[:40])

    def test_pipeline_view_shows_every_worker_of_its_stages(self):
        native = self.worker("native-b", ["pl_download"])
        client = self.worker("py-client-a", ["pl_scrape"], {"stage": "a", "project": "pl_scrape"})
        elsewhere = self.worker("elsewhere", ["unrelated"])
        self.api("POST", "/v1/queues/pl_scrape/tasks", {"tasks": [{"payload": "shard"}]},
                 status=201)
        [lease] = self.lease("pl_scrape", client["id"], 1)
        self.api("POST", "/v1/leases/complete", {"leases": [
            {"task": lease["task"], "token": lease["token"]}]})
        self.open("/compat/distcompute/laion/")
        b = self.browser
        shown = b.js("return [...document.querySelectorAll('#workers-table tbody tr')]"
                     ".map(r => r.dataset.worker).filter(Boolean);")
        self.assertIn(native["name"], shown)
        self.assertIn(client["name"], shown)
        self.assertNotIn(elsewhere["name"], shown)
        # Its link leads to the worker's page of the pipeline, which finds it.
        link = b.js("return document.querySelector(arguments[0]).getAttribute('href');",
                    '#workers-table tr[data-worker="%s"] a' % client["name"])
        self.assertEqual(link, "/compat/distcompute/laion/worker/pl_scrape/" +
                         urllib.parse.quote(client["name"]))
        self.open("/compat/distcompute/laion/leaderboard")
        self.assertEqual(b.text('#leaderboard-table tr[data-nickname="py-client-a"] '
                                'td[data-field="completed"]'), "1")
        self.assertIsNone(b.text('#leaderboard-table tr[data-nickname="elsewhere"]'))

    def test_chart_axis_labels_are_the_grid_values(self):
        # 22 completions within one second: a 10-second bin of 2.2 per second, whose
        # nice top used to be 2.5, with grid lines at 0.625, 1.25 and 1.875 labelled
        # 0.63, 1.3 and 1.9.
        self.api("PUT", "/v1/queues/chart", {}, status=201)
        self.api("POST", "/v1/queues/chart/tasks", {"tasks": [
            {"payload": i} for i in range(22)]}, status=201)
        w = self.worker("charter", ["chart"])
        leases = self.lease("chart", w["id"], 22)
        self.api("POST", "/v1/leases/complete", {"leases": [
            {"task": x["task"], "token": x["token"]} for x in leases]})
        self.open("/?refresh=250")
        b = self.browser
        b.js("window.chartTexts = null;"
             "const draw = CanvasRenderingContext2D.prototype.fillText;"
             "CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {"
             "  if (this.canvas.id === 'chart') {"
             "    if (text === '0/s') window.chartTexts = [];"
             "    if (window.chartTexts) window.chartTexts.push(text);"
             "  }"
             "  return draw.call(this, text, ...rest);"
             "};")
        # The completions' second is left out while it is the current one: wait for a
        # drawing that has them.
        harness.wait_until(lambda: b.js("return window.chartTexts && "
                                        "window.chartTexts.length >= 5 && "
                                        "parseFloat(window.chartTexts[4]) >= 2.2;"),
                           what="the chart drawn with the completions")
        labels = b.js("return window.chartTexts.slice(0, 5);")
        values = [float(t[:-2]) for t in labels]
        for i in range(5):
            self.assertAlmostEqual(values[i], values[4] * i / 4, places=9, msg=labels)


if __name__ == "__main__":
    unittest.main(verbosity=2)
