"""The dashboard in headless Chromium (test_dashboard_browser.Browser): the order and the
completeness of its tables. The leaderboard must order ties the same way on the main
page and in a pipeline's view; the nodes table must order names as the head does, and
the shared-data table its scopes likewise (and a scope name the head refuses must not
hide the rest of the page); the queues table must list a pipeline's stages in their
order along `next` (a loop of `next`s included), not by name; a queue that never had a
task must not be called done, and one whose done tasks its retention removed must
still be; its progress counts those as done; and a workers table cut at its limit must
say so.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_dashboard_browser import DashboardCase  # noqa: E402

MAX_WORKERS_SHOWN = 500  # web/workers.js


class DashboardOrderTest(DashboardCase):
    READ_TOKEN = "order-read-token"
    HEAD_ARGS = ["--distcompute", "ord=ord_scrape,ord_filter"]

    def rows(self, table, key):
        return self.browser.js(
            "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
            ".map(r => r.dataset[arguments[1]]).filter(Boolean);", table, key)

    def worker(self, nickname, queues):
        return self.api("POST", "/v1/workers", {"nickname": nickname, "queues": queues},
                        status=201)

    def complete_one(self, queue, worker):
        self.api("POST", "/v1/queues/%s/tasks" % queue, {"tasks": [{"payload": "x"}]},
                 status=201)
        [lease] = self.api("POST", "/v1/queues/%s/lease" % queue,
                           {"worker": worker["id"], "max": 1})["leases"]
        self.api("POST", "/v1/leases/complete", {"leases": [
            {"task": lease["task"], "token": lease["token"]}]})

    def test_leaderboard_ties_in_one_order(self):
        # One task each: a three-way tie. The head orders ties by nickname in code point
        # order ("Zed" before "alice"); the pipeline's view used to sort by the locale
        # ("alice" before "Zed"), so the two pages disagreed.
        nicknames = ["alice", "Zed", "bob"]
        for nickname in nicknames:
            self.complete_one("ord_scrape", self.worker(nickname, ["ord_scrape"]))
        pages = {}
        for path in ("/", "/compat/distcompute/ord/", "/compat/distcompute/ord/leaderboard"):
            self.open(path)
            pages[path] = [n for n in self.rows("#leaderboard-table", "nickname")
                           if n in nicknames]
        self.assertEqual(pages["/"], ["Zed", "alice", "bob"], pages)
        for path, order in pages.items():
            self.assertEqual(order, pages["/"], path)

    def test_nodes_in_the_heads_order(self):
        # GET /v1/nodes orders by name in code point order ("ordnode-Zulu" before
        # "ordnode-alpha"); the nodes table sorted by the locale ("alpha" before "Zulu"),
        # so the page and the API disagreed.  Gone nodes still come after active ones.
        for name in ("ordnode-beta", "ordnode-alpha", "ordnode-Zulu", "ordnode-Gone",
                     "ordnode-gone"):
            self.api("POST", "/v1/nodes", {"name": name}, status=201)
        for name in ("ordnode-gone", "ordnode-Gone"):
            self.api("DELETE", "/v1/nodes/" + name)
        by_head = [n["name"] for n in self.api("GET", "/v1/nodes")["nodes"]
                   if n["name"].startswith("ordnode-")]
        self.assertEqual(by_head, ["ordnode-Gone", "ordnode-Zulu", "ordnode-alpha",
                                   "ordnode-beta", "ordnode-gone"])
        self.open("/")
        shown = [n for n in self.rows("#nodes-table", "node") if n.startswith("ordnode-")]
        self.assertEqual(shown, ["ordnode-Zulu", "ordnode-alpha", "ordnode-beta",
                                 "ordnode-Gone", "ordnode-gone"])

    def test_queues_in_pipeline_order(self):
        # A pipeline whose stages' names are not in alphabetical order, a loop of
        # `next`s (the head allows one), and two queues of no pipeline.
        for name in ("ord_m3", "ord_a2", "ord_z1", "ord_b_alone", "ord_c_alone",
                     "ord_loop2", "ord_loop1"):
            self.api("PUT", "/v1/queues/" + name, {}, status=201)
        self.api("PUT", "/v1/queues/ord_z1", {"next": "ord_a2"})
        self.api("PUT", "/v1/queues/ord_a2", {"next": "ord_m3"})
        self.api("PUT", "/v1/queues/ord_loop2", {"next": "ord_loop1"})
        self.api("PUT", "/v1/queues/ord_loop1", {"next": "ord_loop2"})
        self.open("/")
        mine = ["ord_scrape", "ord_filter", "ord_z1", "ord_a2", "ord_m3", "ord_loop1",
                "ord_loop2", "ord_b_alone", "ord_c_alone"]
        shown = [q for q in self.rows("#queues-table", "queue") if q in mine]
        # Pipelines by the name of their first stage, each along its `next`s; a loop
        # (no first stage) from its first name; then the queues of no pipeline, by name.
        self.assertEqual(shown, ["ord_scrape", "ord_filter", "ord_z1", "ord_a2", "ord_m3",
                                 "ord_loop1", "ord_loop2", "ord_b_alone", "ord_c_alone"])
        # The pipeline's own view lists its stages in their order too.
        self.open("/compat/distcompute/ord/")
        self.assertEqual(self.rows("#queues-table", "queue"), ["ord_scrape", "ord_filter"])

    def test_eta_of_a_queue_without_tasks(self):
        self.api("PUT", "/v1/queues/ord_never", {}, status=201)
        self.api("PUT", "/v1/queues/ord_finished", {}, status=201)
        self.complete_one("ord_finished", self.worker("finisher", ["ord_finished"]))
        self.open("/")
        eta = '#queues-table tr[data-queue="%s"] td[data-field="eta"]'
        self.assertEqual(self.browser.text(eta % "ord_never"), "no tasks")
        self.assertEqual(self.browser.text(eta % "ord_finished"), "done")

    def attr(self, css, name):
        return self.browser.js("const e = document.querySelector(arguments[0]);"
                               "return e ? e.getAttribute(arguments[1]) : null;", css, name)

    def wait_reaped(self, queue, reaped):
        """Waits until `queue`'s retention removed `reaped` done tasks, none being left,
        and its completions are in whole seconds of the throughput (the page leaves out
        the current, partial one)."""
        def settled():
            q = self.api("GET", "/v1/queues/" + queue)
            tp = self.api("GET", "/v1/throughput?seconds=600")["queues"].get(queue, [])
            return q["reaped"] == reaped and q["counts"]["done"] == 0 and sum(tp[:-1]) == reaped
        harness.wait_until(settled, timeout=15, interval=0.05,
                           what="%d done tasks of %s removed" % (reaped, queue))

    def test_progress_counts_removed_tasks_as_done(self):
        # Retention removes done tasks (counts.done drops, `reaped` grows): the progress
        # counted only the kept ones, so it shrank as they went (0% with half done) and a
        # queue whose done tasks had all gone had "no tasks" where it was done.
        self.api("PUT", "/v1/queues/ord_kept", {"keep_done_ms": 0}, status=201)
        worker = self.worker("keeper", ["ord_kept"])
        self.api("POST", "/v1/queues/ord_kept/tasks", {"tasks": [{"payload": i} for i in range(4)]},
                 status=201)
        row = '#queues-table tr[data-queue="ord_kept"] '
        seen = {}
        for n in (2, 4):
            leases = self.api("POST", "/v1/queues/ord_kept/lease",
                              {"worker": worker["id"], "max": 2})["leases"]
            self.api("POST", "/v1/leases/complete", {"leases": [
                {"task": lease["task"], "token": lease["token"]} for lease in leases]})
            self.wait_reaped("ord_kept", n)
            self.open("/")
            text = lambda field: self.browser.text(row + 'td[data-field="%s"]' % field)
            seen[n] = {"progress": self.attr(row + ".bar", "title"), "done": text("done"),
                       "done_title": self.attr(row + 'td[data-field="done"]', "title"),
                       "eta": text("eta")}
            # The rate counts completions, which removals do not take back.
            self.assertNotEqual(text("rate"), "0.0")
        self.assertRegex(seen[2].pop("eta"), r"^\d+[dhms]")  # two left at that rate: a time
        removed = "done and kept; %d more done and removed by the queue's retention"
        self.assertEqual(seen, {
            2: {"progress": "50% done", "done": "0", "done_title": removed % 2},
            4: {"progress": "100% done", "done": "0", "done_title": removed % 4, "eta": "done"}})

    def test_show_gone_workers_at_once(self):
        # The toggle re-renders at once, through muster.refresh: app.js's refresh, which
        # workers.js reaches across files.  The page refreshes by itself only once a
        # minute here, so a toggle that did not re-render would time out.
        b = self.browser
        gone = self.worker("ord-leaver", ["ord_filter"])
        self.api("DELETE", "/v1/workers/%d" % gone["id"])
        self.open("/?refresh=60000")
        self.assertNotIn(gone["name"], self.rows("#workers-table", "worker"))
        b.click("#show-gone")
        harness.wait_until(lambda: gone["name"] in self.rows("#workers-table", "worker"),
                           what="the gone worker's row after the toggle")
        self.assertFalse(b.visible("#error"), b.text("#error"))

    def test_workers_table_says_how_many_it_shows(self):
        b = self.browser
        self.open("/")
        self.assertIsNone(b.text("#workers-unlisted"))  # all shown: nothing to say
        for _ in range(MAX_WORKERS_SHOWN + 1):
            self.worker("crowd", ["ord_filter"])
        active = sum(w["state"] == "active" for w in self.api("GET", "/v1/workers")["workers"])
        self.assertGreater(active, MAX_WORKERS_SHOWN)
        self.open("/")
        self.assertEqual(len(self.rows("#workers-table", "worker")), MAX_WORKERS_SHOWN)
        self.assertEqual(b.text("#workers-unlisted"),
                         "Showing 500 of %s workers, those seen most recently "
                         "(GET /v1/workers lists them all)." % format(active, ","))

    def put_blob(self, scope, name):
        r = self.head.request("PUT", "/v1/shared/%s/%s?level=1" % (scope, name), raw=b"blob",
                              content_type="application/octet-stream")
        self.assertEqual(r.status, 201, r)

    def test_shared_scopes_in_code_point_order(self):
        # The scopes looked at (here given in ?shared= in no order) are listed by name in
        # code point order, as nodes and the head's lists are: "ord-Zed" before
        # "ord-alpha", not the locale's "ord-alpha" before "ord-Zed".
        scopes = ["ord-beta", "ord-alpha", "ord-Zed", "ord-_under"]
        for scope in scopes:
            self.put_blob(scope, "w")
        self.open("/?shared=" + ",".join(scopes))
        self.assertEqual(self.rows("#shared-table", "scope"),
                         ["ord-Zed", "ord-_under", "ord-alpha", "ord-beta"])
        self.assertEqual(self.browser.text("#shared-summary"),
                         "4 blobs, 16 B at their newest levels, in 4 scopes looked at")

    def test_bad_scope_in_the_url_leaves_the_rest(self):
        # A scope the head refuses (a typo in ?shared=) is said in the shared-data
        # section; it used to fail the whole refresh, so that the page showed "Could not
        # refresh" and none of its sections.
        self.put_blob("ord-good", "w")
        self.open("/?shared=ord-good,bad%20name")
        b = self.browser
        self.assertFalse(b.visible("#error"), b.text("#error"))
        self.assertEqual(self.rows("#shared-table", "scope"), ["ord-good"])
        self.assertEqual(b.text("#shared-summary"),
                         "1 blob, 4 B at their newest levels, in 1 scope looked at")
        self.assertEqual(b.text("#shared-invalid"),
                         "Not looked at (check ?shared= in the URL): scope 'bad name': a session "
                         "id (s-...) or 1 to 128 characters of letters, digits, '.', '_' and '-'")


if __name__ == "__main__":
    unittest.main(verbosity=2)
