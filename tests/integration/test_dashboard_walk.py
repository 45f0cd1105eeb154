"""The dashboard in headless Chromium (test_dashboard_browser.Browser), as an operator
watching a pipeline sees it, on what a walk through it found wrong:

- a long name (a queue's is up to 128 characters, a nickname 64 bytes, a progress
  string 1 KiB) widened its table past its card, so the counts of every row were cut
  off or out of sight; on a narrow window the whole page scrolled sideways;
- a stage with nothing left while the stage before it still had tasks queued was
  called "done", with a full bar;
- the queues table had no column for the cancelled tasks (a flag's roll-back, a
  closed session), which `muster status` counts;
- a gone worker's row, with the last progress it sent, looked as live as the others;
- a head that stopped answering was reported as "Could not refresh: Failed to fetch"
  under the last figures, which went on saying "just now" as if live.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_dashboard_browser import DashboardCase  # noqa: E402

LONG_QUEUE = "q" * 60 + "-" + "x" * 67  # 128 characters, the longest queue name


class DashboardWalkTest(DashboardCase):
    READ_TOKEN = "walk-read-token"

    def resize(self, width, height=1150):
        b = self.browser
        b._call("POST", b._s("/window/rect"), {"width": width, "height": height})
        self.addCleanup(b._call, "POST", b._s("/window/rect"), {"width": 1280, "height": 1150})

    def worker(self, nickname, queues):
        return self.api("POST", "/v1/workers", {"nickname": nickname, "queues": queues},
                        status=201)

    def lease(self, queue, worker):
        [lease] = self.api("POST", "/v1/queues/%s/lease" % queue,
                           {"worker": worker["id"], "max": 1})["leases"]
        return {"task": lease["task"], "token": lease["token"]}

    def eta(self, queue):
        return self.browser.text('#queues-table tr[data-queue="%s"] td[data-field="eta"]' % queue)

    def overflow(self, table):
        """How far the table `table` reaches past the right edge of its card (px)."""
        return self.browser.js(
            "const t = document.querySelector(arguments[0]), c = t.closest('section.card');"
            "return t.getBoundingClientRect().right - c.getBoundingClientRect().right;", table)

    def test_long_names_keep_the_counts_in_their_card(self):
        self.api("PUT", "/v1/queues/" + LONG_QUEUE, {}, status=201)
        self.api("PUT", "/v1/queues/walk_long_feed", {"next": LONG_QUEUE}, status=201)
        w = self.worker("N" * 64, [LONG_QUEUE, "walk_long_feed"])
        self.api("POST", "/v1/workers/%d/heartbeat" % w["id"], {"progress": "z" * 1024})
        self.resize(1000)
        self.open("/")
        for table in ("#queues-table", "#workers-table", "#leaderboard-table"):
            self.assertLessEqual(self.overflow(table), 1, table)
        # The long name wraps; the ETA beside it stays in one line.
        b = self.browser
        eta = '#queues-table tr[data-queue="%s"] td[data-field="eta"]' % LONG_QUEUE
        self.assertEqual(b.text(eta), "no tasks")
        self.assertEqual(b.js("const r = document.createRange();"
                              "r.selectNodeContents(document.querySelector(arguments[0]));"
                              "return r.getClientRects().length;", eta), 1)
        # A window too narrow for the tables: each scrolls in its card, the page does not.
        self.resize(500)
        b.js("return muster.refresh();")
        self.assertLessEqual(b.js("return document.documentElement.scrollWidth - window.innerWidth;"), 0)
        self.assertGreater(b.js("const c = document.getElementById('queues');"
                                "return c.scrollWidth - c.clientWidth;"), 0)

    def test_stage_with_work_on_its_way_is_waiting(self):
        for name, nxt in (("walk_c", None), ("walk_b", "walk_c"), ("walk_a", "walk_b")):
            self.api("PUT", "/v1/queues/" + name, {"next": nxt} if nxt else {}, status=201)
        w = self.worker("stager", ["walk_a", "walk_b"])
        # walk_b finished the one task it had; walk_a still has two to pass on, and
        # walk_c, after walk_b, never had one.
        self.api("POST", "/v1/queues/walk_b/tasks", {"tasks": [{"payload": "b"}]}, status=201)
        done = self.lease("walk_b", w)
        self.api("POST", "/v1/leases/complete", {"leases": [done]})
        self.api("POST", "/v1/queues/walk_c/purge", {})
        self.api("POST", "/v1/queues/walk_a/tasks", {"tasks": [{"payload": "a1"}, {"payload": "a2"}]},
                 status=201)
        self.open("/")
        self.assertEqual([self.eta(q) for q in ("walk_b", "walk_c")], ["waiting", "waiting"])
        # walk_a's two tasks: none leased, none done lately; then one leased, no rate yet.
        self.assertEqual(self.eta("walk_a"), "none leased")
        first = self.lease("walk_a", w)
        self.open("/")
        self.assertEqual(self.eta("walk_a"), "—")
        self.api("POST", "/v1/leases/release", {"leases": [first]})
        # With walk_a's tasks gone (failed for good), nothing more is on its way.
        for _ in range(2):
            lease = dict(self.lease("walk_a", w), permanent=True)
            self.api("POST", "/v1/leases/fail", {"leases": [lease]})
        self.open("/")
        self.assertEqual([self.eta(q) for q in ("walk_a", "walk_b", "walk_c")],
                         ["done", "done", "no tasks"])

    def test_gone_workers_are_greyed(self):
        # A gone worker's progress is the last it sent: beside the live rows it read as
        # if the worker were still running that task.
        gone = self.worker("walk-leaver", ["walk_gone"])
        self.api("POST", "/v1/workers/%d/heartbeat" % gone["id"], {"progress": "running task 12"})
        self.api("DELETE", "/v1/workers/%d" % gone["id"])
        live = self.worker("walk-stayer", ["walk_gone"])
        self.open("/")
        self.browser.click("#show-gone")
        row = '#workers-table tr[data-worker="%s"]'
        harness.wait_until(lambda: self.browser.text(row % gone["name"]) is not None,
                           what="the gone worker's row")
        classes = self.browser.js(
            "return [...arguments].map(n => document.querySelector(n).className);",
            row % gone["name"], row % live["name"])
        self.assertEqual(classes, ["gone", ""])

    def test_cancelled_tasks_are_counted(self):
        self.api("PUT", "/v1/queues/walk_flag2", {"max_flags": 1}, status=201)
        self.api("PUT", "/v1/queues/walk_flag1", {"next": "walk_flag2"}, status=201)
        w = self.worker("flagger", ["walk_flag1", "walk_flag2"])
        self.api("POST", "/v1/queues/walk_flag1/tasks", {"tasks": [{"payload": "x"}]}, status=201)
        self.api("POST", "/v1/leases/complete", {"leases": [self.lease("walk_flag1", w)]})
        flagged = self.api("POST", "/v1/leases/flag", {"leases": [self.lease("walk_flag2", w)]})
        self.assertEqual(flagged["flagged"][0]["state"], "cancelled", flagged)
        counts = self.api("GET", "/v1/queues/walk_flag2")["counts"]
        self.open("/")
        cell = '#queues-table tr[data-queue="walk_flag2"] td[data-field="cancelled"]'
        self.assertEqual(self.browser.text(cell), str(counts["cancelled"]))
        self.assertEqual(counts["cancelled"], 1)


class DashboardHeadDownTest(DashboardCase):
    READ_TOKEN = "walk-down-token"
    # A fixed port: the page must find the head again where it was.
    HEAD_ARGS = ["--listen", "127.0.0.1:%d" % harness.free_port()]

    def test_head_that_does_not_answer(self):
        b = self.browser
        # An empty head says how to begin, as its nodes section does.
        self.open("/")
        self.assertEqual(b.text("#queues-empty"),
                         "No queues yet: create one with `muster queue create NAME`.")
        self.api("PUT", "/v1/queues/walk_down", {}, status=201)
        self.open("/?refresh=250")
        self.assertEqual(b.js("return document.getElementById('sections').className;"), "")
        self.head.stop()
        harness.wait_until(lambda: b.visible("#error"), what="the page to miss the head")
        text = b.text("#error")
        self.assertIn("The head did not answer", text)
        self.assertIn("down, restarting", text)
        self.assertIn("Trying again every 250 ms.", text)
        self.assertIn("What is shown is from ", text)
        # The last figures stay, greyed, so that their "just now" is not read as live.
        self.assertEqual(b.js("return document.getElementById('sections').className;"), "stale")
        self.assertIsNotNone(b.text('#queues-table tr[data-queue="walk_down"]'))
        self.head.start()
        harness.wait_until(lambda: not b.visible("#error"), what="the page to find the head again")
        self.assertEqual(b.js("return document.getElementById('sections').className;"), "")


if __name__ == "__main__":
    unittest.main()
