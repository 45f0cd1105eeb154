"""The dashboard in headless Chromium (test_dashboard_browser.Browser), on what a walk
found an operator could not see:

- why tasks failed or died: a queue's Failed and Dead counts open a panel of its newest
  failed and dead tasks (at most 20) with their errors, which are a worker's text and
  must show as text, never as markup;
- why a worker left: the State of a gone worker says it ("gone: timed out 3m ago");
- leaderboard ties: nicknames with as many completed tasks share a rank (1, 2, 2, 4);
- the throughput chart draws 8 queues at most: its legend says how many it left out.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_dashboard_browser import DashboardCase  # noqa: E402

# Errors as a worker may send them: markup, which the page must show as text.
MARKUP_ERRORS = ['<img src=x onerror="window.pwned = 1">', "<b>bold</b> & <i>more</i>"]


class DashboardWhyTest(DashboardCase):
    READ_TOKEN = "why-read-token"
    HEAD_ARGS = ["--sweep-ms", "50"]

    def worker(self, nickname, queues, **extra):
        return self.api("POST", "/v1/workers", dict(nickname=nickname, queues=queues, **extra),
                        status=201)

    def put(self, queue, n):
        return self.api("POST", "/v1/queues/%s/tasks" % queue,
                        {"tasks": [{"payload": i} for i in range(n)]}, status=201)

    def lease(self, queue, worker, n=1):
        return self.api("POST", "/v1/queues/%s/lease" % queue,
                        {"worker": worker["id"], "max": n})["leases"]

    def fail_lease(self, lease, error, permanent):
        """Fails `lease`: with max_attempts 1, failed when permanent, else dead."""
        self.api("POST", "/v1/leases/fail", {"leases": [
            {"task": lease["task"], "token": lease["token"], "error": error,
             "permanent": permanent}]})

    def open_failures(self, queue, field):
        b = self.browser
        b.click('#queues-table tr[data-queue="%s"] td[data-field="%s"] button' % (queue, field))
        harness.wait_until(lambda: b.text("#failures-" + queue) is not None,
                           what="the panel of %s's failed and dead tasks" % queue)

    def panel_rows(self, queue):
        """[(id, state, attempts, error)] of the panel of `queue`, as shown."""
        return [tuple(r) for r in self.browser.js(
            "return [...document.querySelectorAll(arguments[0])].map(r =>"
            " [...r.children].filter((c, i) => i !== 3).map(c => c.textContent));",
            "#failures-%s tbody tr" % queue)]

    def test_failures_panel_shows_errors_as_text(self):
        self.api("PUT", "/v1/queues/why_esc", {"max_attempts": 1}, status=201)
        w = self.worker("why-failer", ["why_esc"])
        ids = [t["id"] for t in self.put("why_esc", 3)["tasks"]]
        leases = self.lease("why_esc", w, 3)
        self.fail_lease(leases[0], "first death", False)
        self.fail_lease(leases[1], MARKUP_ERRORS[0], True)
        self.fail_lease(leases[2], MARKUP_ERRORS[1], False)
        # The first task, requeued and dead again, died last: it comes first, though
        # its id is the lowest.
        self.api("POST", "/v1/tasks/%d/requeue" % ids[0])
        self.fail_lease(self.lease("why_esc", w)[0], "died again", False)
        self.open("/")
        b = self.browser
        self.assertIsNone(b.text("#failures-why_esc"))
        toggle = '#queues-table tr[data-queue="why_esc"] td[data-field="dead"] button'
        self.assertEqual(b.js("return document.querySelector(arguments[0]).getAttribute("
                              "'aria-expanded');", toggle), "false")
        self.open_failures("why_esc", "dead")
        self.assertEqual(self.panel_rows("why_esc"), [
            ("#%d" % ids[0], "dead", "1", "died again"),
            ("#%d" % ids[2], "dead", "1", MARKUP_ERRORS[1]),
            ("#%d" % ids[1], "failed", "1", MARKUP_ERRORS[0])])
        # Shown as text: no element came of the markup, and no handler ran.
        self.assertEqual(b.js("return document.querySelectorAll("
                              "'#failures-why_esc img, #failures-why_esc b, #failures-why_esc i')"
                              ".length;"), 0)
        self.assertIsNone(b.js("return window.pwned === undefined ? null : window.pwned;"))
        # It stays open across refreshes, and the count closes it.
        refreshes = int(b.js("return document.body.dataset.refreshes;"))
        harness.wait_until(lambda: int(b.js("return document.body.dataset.refreshes;")) > refreshes,
                           what="a refresh")
        self.assertEqual(len(self.panel_rows("why_esc")), 3)
        b.click('#queues-table tr[data-queue="why_esc"] td[data-field="failed"] button')
        harness.wait_until(lambda: b.text("#failures-why_esc") is None, what="the panel to close")

    def test_failures_panel_lists_the_20_newest(self):
        self.api("PUT", "/v1/queues/why_many", {"max_attempts": 1}, status=201)
        w = self.worker("why-many", ["why_many"])
        self.put("why_many", 30)
        order = []
        for i, lease in enumerate(self.lease("why_many", w, 30)):
            # Both states, mixed: every sixth one failed for good, the others dead.
            self.fail_lease(lease, "error %d" % i, i % 6 == 0)
            order.append(("#%d" % lease["task"], "failed" if i % 6 == 0 else "dead", "1",
                          "error %d" % i))
        # More than 20 dead, and the newest of them has the lowest dead id: a listing
        # by id would show the wrong 20.
        first_dead = order.pop(1)
        self.api("POST", "/v1/tasks/%s/requeue" % first_dead[0][1:])
        self.fail_lease(self.lease("why_many", w)[0], "died again", False)
        order.append(first_dead[:3] + ("died again",))
        self.open("/")
        self.open_failures("why_many", "failed")
        self.assertEqual(self.panel_rows("why_many"), order[::-1][:20])
        self.assertIn("(the 20 newest of 30)", self.browser.text("#failures-why_many p"))

    def test_gone_workers_say_why(self):
        b = self.browser
        bye = self.worker("why-bye", ["why_gone"])
        crashed = self.worker("why-crash", ["why_gone"])
        silent = self.worker("why-silent", ["why_gone"], timeout_ms=200)
        self.api("DELETE", "/v1/workers/%d" % bye["id"])
        self.api("DELETE", "/v1/workers/%d?crashed=true" % crashed["id"])
        harness.wait_until(lambda: self.api("GET", "/v1/workers/%d" % silent["id"])["state"]
                           == "gone", what="the silent worker to time out")
        self.open("/")
        b.click("#show-gone")
        state = '#workers-table tr[data-worker="%s"] td[data-field="state"]'
        harness.wait_until(lambda: b.text(state % bye["name"]) is not None,
                           what="the gone workers' rows")
        ago = r" (just now|\d+s ago)$"
        self.assertRegex(b.text(state % bye["name"]), "^gone: said bye" + ago)
        self.assertRegex(b.text(state % crashed["name"]), "^gone: crashed" + ago)
        self.assertRegex(b.text(state % silent["name"]), "^gone: timed out" + ago)
        self.assertIn("timeout", b.js("return document.querySelector(arguments[0]).title;",
                                      state % silent["name"]))
        self.open("/#/worker/%d" % silent["id"])
        harness.wait_until(lambda: b.visible("#worker-fields"), what="the worker page")
        self.assertRegex(b.text('#worker-fields dd[data-field="state"]'), "^gone: timed out" + ago)

    def test_leaderboard_ties_share_a_rank(self):
        self.api("PUT", "/v1/queues/why_rank", {}, status=201)
        for nickname, done in (("why-r-a", 3), ("why-r-b", 2), ("why-r-c", 2), ("why-r-d", 1)):
            w = self.worker(nickname, ["why_rank"])
            self.put("why_rank", done)
            leases = self.lease("why_rank", w, done)
            self.api("POST", "/v1/leases/complete", {"leases": [
                {"task": l["task"], "token": l["token"]} for l in leases]})
        board = self.api("GET", "/v1/leaderboard")["leaderboard"]
        self.assertTrue(all("rank" not in e for e in board), board)  # the page ranks them
        self.open("/")
        b = self.browser
        shown = dict(b.js("return [...document.querySelectorAll('#leaderboard-table tbody tr')]"
                          ".map(r => [r.dataset.nickname,"
                          " +r.querySelector('[data-field=\"rank\"]').textContent]);"))
        # Competition ranking over the whole board (other tests' nicknames too).
        want = {}
        for i, e in enumerate(board):
            want[e["nickname"]] = (want[board[i - 1]["nickname"]]
                                   if i and board[i - 1]["completed"] == e["completed"] else i + 1)
        self.assertEqual(shown, want)
        first = shown["why-r-a"]
        self.assertEqual([shown["why-r-" + n] for n in "abcd"], [first, first + 1, first + 1,
                                                                   first + 3])

    def complete_one(self, queue, worker, again=False):
        if not again:
            self.api("PUT", "/v1/queues/" + queue, {}, status=201)
        self.put(queue, 1)
        [lease] = self.lease(queue, worker)
        self.api("POST", "/v1/leases/complete", {"leases": [
            {"task": lease["task"], "token": lease["token"]}]})

    def charted(self):
        """The queues of the throughput reply: those the chart may draw."""
        return sorted(self.api("GET", "/v1/throughput?seconds=600")["queues"])

    def test_chart_says_how_many_queues_it_leaves_out(self):
        b = self.browser
        queues = ["why_chart_%02d" % i for i in range(10)]
        w = self.worker("why-charter", queues)
        # Other tests of the class may have completed tasks in queues of their own.
        before = len(self.charted())
        self.assertLessEqual(before, 7)
        for q in queues[:8 - before]:
            self.complete_one(q, w)
        self.open("/")
        self.assertEqual(len(self.charted()), 8)
        self.assertIsNone(b.text("#chart-more"))
        for q in queues[8 - before:]:
            self.complete_one(q, w)
        # The last queue in the table is the busiest: it is drawn, not left out.
        busiest = queues[-1]
        for _ in range(2):
            self.complete_one(busiest, w, again=True)
        all_charted = self.charted()
        b.js("return muster.refresh();")
        self.assertEqual(b.text("#chart-more"), "and %d more" % (len(all_charted) - 8))
        legend = b.js("return [...document.querySelectorAll('.legend span')]"
                      ".filter(s => s.querySelector('i')).map(s => s.textContent);")
        self.assertEqual(len(legend), 8)
        left = b.js("return document.getElementById('chart-more').title;").split(", ")
        self.assertEqual(sorted(legend + left), all_charted)
        self.assertIn(busiest, legend)


if __name__ == "__main__":
    unittest.main()
