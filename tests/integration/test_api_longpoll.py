"""Long-poll leases: `wait_ms` on an empty queue, woken by a put from another
connection, capped by --max-wait-ms (docs/api.md, `POST /v1/queues/{queue}/lease`)."""
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_api_common import ApiTestCase  # noqa: E402


class Poller(threading.Thread):
    """Sends one lease request on its own connection; records reply and timings."""

    def __init__(self, head, queue, body):
        super().__init__(daemon=True)
        self.head, self.queue, self.body = head, queue, body
        self.reply = None
        self.error = None
        self.started_at = self.finished_at = None

    def run(self):
        conn = self.head.connection(timeout=60)
        try:
            self.started_at = time.monotonic()
            self.reply = self.head.request("POST", "/v1/queues/%s/lease" % self.queue,
                                           self.body, conn=conn)
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            self.finished_at = time.monotonic()
            conn.close()

    def elapsed(self):
        return self.finished_at - self.started_at


def hold(seconds):
    """Lets time pass (to show that something did NOT happen meanwhile)."""
    end = time.monotonic() + seconds
    harness.wait_until(lambda: time.monotonic() >= end, timeout=seconds + 5, what="time")


class LongPollCase(ApiTestCase):
    """Helpers: pollers on their own connections."""

    def start_poller(self, body, queue=None):
        p = Poller(self.head, queue or self.q, body)
        p.start()
        return p

    def finished(self, p, timeout):
        p.join(timeout)
        self.assertFalse(p.is_alive(), "long-poll did not return")
        self.assertIsNone(p.error, p.error)
        self.assertEqual(p.reply.status, 200, p.reply)
        return p.reply.json["leases"]


class LongPollTest(LongPollCase):
    # A long sweep: a waiter must be woken by the put itself, not by a periodic sweep.
    head_args = ("--sweep-ms", "10000", "--max-wait-ms", "30000")

    def test_woken_by_put(self):
        self.create_queue()
        p = self.start_poller({"wait_ms": 20000})
        hold(0.4)
        self.assertTrue(p.is_alive(), "returned early on an empty queue: %r" % p.reply)
        put_at = time.monotonic()
        [tid] = self.put({"wake": 1})
        leases = self.finished(p, 10)
        woke_after = p.finished_at - put_at
        self.assertLess(woke_after, 2.0, "woken %.2fs after the put" % woke_after)
        self.assertLess(p.elapsed(), 10.0)
        self.assertEqual([(x["task"], x["payload"], x["attempt"]) for x in leases],
                         [(tid, {"wake": 1}, 1)])
        self.assertEqual(self.get_task(tid)["state"], "leased")

    def test_unwoken_returns_empty_after_wait(self):
        self.create_queue()
        p = self.start_poller({"wait_ms": 800})
        leases = self.finished(p, 10)
        self.assertEqual(leases, [])
        self.assertGreaterEqual(p.elapsed(), 0.7, "returned after %.2fs" % p.elapsed())
        self.assertLess(p.elapsed(), 3.0, "returned after %.2fs" % p.elapsed())

    def test_put_to_other_queue_does_not_wake(self):
        self.create_queue()
        other = self.qname("other")
        self.create_queue(other)
        p = self.start_poller({"wait_ms": 1000})
        hold(0.2)
        self.put("elsewhere", name=other)
        leases = self.finished(p, 10)
        self.assertEqual(leases, [])
        self.assertGreaterEqual(p.elapsed(), 0.9)
        self.assert_counts(other, queued=1)

    def test_two_waiters_each_get_one(self):
        self.create_queue()
        p1 = self.start_poller({"wait_ms": 15000})
        p2 = self.start_poller({"wait_ms": 15000})
        hold(0.4)
        self.assertTrue(p1.is_alive() and p2.is_alive())
        [t1] = self.put("one")
        harness.wait_until(lambda: not p1.is_alive() or not p2.is_alive(), timeout=5,
                           what="one waiter to be woken")
        first, second = (p1, p2) if not p1.is_alive() else (p2, p1)
        got1 = self.finished(first, 1)
        self.assertEqual([x["task"] for x in got1], [t1])
        hold(0.3)
        self.assertTrue(second.is_alive(), "second waiter returned: %r" % second.reply)
        [t2] = self.put("two")
        got2 = self.finished(second, 5)
        self.assertEqual([x["task"] for x in got2], [t2])
        self.assert_counts(leased=2)

    def test_batch_put_wakes_with_max(self):
        self.create_queue()
        p = self.start_poller({"wait_ms": 15000, "max": 10})
        hold(0.3)
        ids = self.put(*range(5))
        leases = self.finished(p, 5)
        self.assertTrue(leases, "woken with nothing")
        got = [x["task"] for x in leases]
        self.assertEqual(got, ids[:len(got)], "not in put order")
        rest = self.lease(max=10)
        self.assertEqual(got + [x["task"] for x in rest], ids)

    def test_head_serves_others_while_polling(self):
        self.create_queue()
        pollers = [self.start_poller({"wait_ms": 1500}) for _ in range(4)]
        hold(0.2)
        t0 = time.monotonic()
        for _ in range(5):
            r = self.call("GET", "/v1/health", token=None)
            self.assertEqual(r.status, 200)
        self.put("x")
        self.assertLess(time.monotonic() - t0, 2.0, "the head blocked while long-polling")
        got = sum(len(self.finished(p, 10)) for p in pollers)
        self.assertEqual(got, 1)


class DelayedWakeTest(LongPollCase):
    """A waiter also gets a delayed task once its run_at_ms passes (default sweep)."""
    head_args = ("--max-wait-ms", "30000")

    def test_delayed_task_becoming_ready(self):
        self.create_queue()
        [entry] = self.put_tasks([{"payload": "d", "delay_ms": 600}])
        p = self.start_poller({"wait_ms": 10000})
        leases = self.finished(p, 10)
        self.assertEqual([x["task"] for x in leases], [entry["id"]])
        self.assertGreaterEqual(p.elapsed(), 0.4, "leased before run_at_ms")
        self.assertLess(p.elapsed(), 3.0)


class MaxWaitTest(ApiTestCase):
    head_args = ("--sweep-ms", "50", "--max-wait-ms", "500")

    def test_wait_capped(self):
        self.create_queue()
        p = Poller(self.head, self.q, {"wait_ms": 20000})
        p.start()
        p.join(10)
        self.assertFalse(p.is_alive(), "wait_ms not capped by --max-wait-ms")
        self.assertEqual((p.reply.status, p.reply.json), (200, {"leases": []}), p.reply)
        self.assertGreaterEqual(p.elapsed(), 0.4)
        self.assertLess(p.elapsed(), 3.0, "took %.2fs with --max-wait-ms 500" % p.elapsed())

    def test_health_says_the_cap(self):
        # `muster session results --follow` asks for this much per request.
        self.assertEqual(self.expect("GET", "/v1/health", token=None)["max_wait_ms"], 500)


if __name__ == "__main__":
    unittest.main()
