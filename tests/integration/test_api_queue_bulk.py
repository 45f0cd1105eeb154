"""Deleting or purging a queue of many tasks does not stall the head (docs/api.md,
DELETE /v1/queues/{queue} and its purge): the tasks go in chunks between other requests,
the queue is gone for clients at once, and a head killed during a deletion finishes it
after its restart."""
import http.client
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import ApiTestCase, OwnHeadTestCase, harness  # noqa: E402

TASKS = 200000
BATCH = [{"payload": {"n": i, "pad": "x" * 40}} for i in range(1000)]


class Ordered:
    """Replies noted in the order they arrived, from any thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = []

    def note(self, what):
        with self.lock:
            self.events.append(what)


def fill(case, name, n=TASKS):
    """Puts n tasks into `name`; returns the first and the last id."""
    first = last = None
    for _ in range(n // len(BATCH)):
        ids = [t["id"] for t in case.put_tasks(BATCH, name=name)]
        first = first or ids[0]
        last = ids[-1]
    return first, last


def send_in_thread(head, method, path, order, what):
    """Sends a request on a connection of its own; returns (thread, replies): the reply
    lands in replies[0] and is noted in `order` as `what` when it arrives (a connection
    the head closed, killed, lands as the exception)."""
    replies = []

    def run():
        conn = head.connection(timeout=120)
        try:
            replies.append(head.request(method, path, conn=conn))
            order.note(what)
        except (ConnectionError, http.client.HTTPException) as e:
            replies.append(e)
        finally:
            conn.close()
    thread = threading.Thread(target=run)
    thread.start()
    return thread, replies


class BulkTest(ApiTestCase):

    def queue_gone(self):
        return self.call("GET", "/v1/queues/" + self.q).status == 404

    def test_delete_answers_other_requests_meanwhile(self):
        self.create_queue()
        other = self.qname("other")
        self.create_queue(other)
        first, last = fill(self, self.q)
        order = Ordered()
        thread, replies = send_in_thread(self.head, "DELETE", "/v1/queues/" + self.q, order,
                                         "delete")
        try:
            # Gone for clients at once, while its tasks are still being deleted.
            harness.wait_until(self.queue_gone, timeout=30, interval=0.005,
                               what="the queue to be gone")
            self.expect_error("POST", "/v1/queues/%s/tasks" % self.q, {"tasks": [{"payload": 1}]},
                              404, "queue_not_found")
            self.expect_error("POST", "/v1/queues/%s/lease" % self.q, {}, 404, "queue_not_found")
            r = self.expect_error("PUT", "/v1/queues/" + self.q, {}, 409, "invalid_state")
            self.assertIn("still being deleted", r.json["error"]["message"])
            # The last task is deleted by the last chunk: it is still there, in the trash.
            r = self.expect_error("GET", "/v1/tasks/%d" % last, None, 404, "task_not_found")
            self.assertIn("which was deleted", r.json["error"]["message"])
            self.put("meanwhile", name=other)
            self.assert_counts(other, queued=1)
            order.note("other")
        finally:
            thread.join(120)
        self.assertEqual(order.events, ["other", "delete"],
                         "the other client's requests must be answered before the deletion ends")
        self.assertEqual((replies[0].status, replies[0].json),
                         (200, {"deleted": self.q, "tasks": TASKS, "sessions_closed": 0}))
        # Once answered, the name is free and the new queue never sees the old tasks.
        self.create_queue()
        self.assert_counts()
        self.assertEqual(self.list_tasks(), [])
        for tid in (first, last):
            self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")

    def test_purge_answers_other_requests_meanwhile(self):
        self.create_queue()
        other = self.qname("other")
        self.create_queue(other)
        fill(self, self.q)
        kept = self.lease_one()
        order = Ordered()
        thread, replies = send_in_thread(self.head, "POST", "/v1/queues/%s/purge" % self.q,
                                         order, "purge")
        try:
            # The first chunk is gone with the request's first turn: then ask elsewhere.
            harness.wait_until(lambda: self.counts()["queued"] < TASKS - 1, timeout=30,
                               interval=0.005, what="the purge to start")
            self.put("meanwhile", name=other)
            order.note("other")
        finally:
            thread.join(120)
        self.assertEqual(order.events, ["other", "purge"])
        self.assertEqual((replies[0].status, replies[0].json), (200, {"purged": TASKS - 1}))
        self.assert_counts(leased=1)
        self.assertEqual([t["id"] for t in self.list_tasks()], [kept["task"]])


    def test_purge_not_held_up_by_a_big_delete(self):
        # The trash and the purges take turns: a purge of a few chunks is answered long
        # before the deletion of many (it waited for the whole deletion).
        self.create_queue()
        small = self.qname("small")
        self.create_queue(small)
        fill(self, self.q)
        fill(self, small, n=5000)
        order = Ordered()
        deleting, deleted = send_in_thread(self.head, "DELETE", "/v1/queues/" + self.q, order,
                                           "delete")
        try:
            harness.wait_until(self.queue_gone, timeout=30, interval=0.005,
                               what="the queue to be gone")
            purging, purged = send_in_thread(self.head, "POST", "/v1/queues/%s/purge" % small,
                                             order, "purge")
            purging.join(120)
        finally:
            deleting.join(120)
        self.assertEqual(order.events, ["purge", "delete"])
        self.assertEqual((purged[0].status, purged[0].json), (200, {"purged": 5000}))
        self.assertEqual(deleted[0].status, 200)
        self.assert_counts(small)


class DeleteKilledTest(OwnHeadTestCase):

    def test_kill9_during_a_delete_finishes_after_restart(self):
        self.create_queue()
        first, last = fill(self, self.q)
        order = Ordered()
        thread, replies = send_in_thread(self.head, "DELETE", "/v1/queues/" + self.q, order,
                                         "delete")
        try:
            harness.wait_until(lambda: self.call("GET", "/v1/queues/" + self.q).status == 404,
                               timeout=30, interval=0.005, what="the queue to be gone")
            # Mid-deletion: its tasks are not all gone yet.
            self.expect_error("PUT", "/v1/queues/" + self.q, {}, 409, "invalid_state")
            self.head.kill()
        finally:
            thread.join(120)
        self.assertEqual(order.events, [], "killed before its reply: %r" % replies)
        self.head.start()
        self.expect_error("GET", "/v1/queues/" + self.q, None, 404, "queue_not_found")
        harness.wait_until(lambda: self.call("PUT", "/v1/queues/" + self.q, {}).status == 201,
                           timeout=60, interval=0.05, what="the deletion to finish")
        self.assert_counts()
        self.assertEqual(self.list_tasks(), [])
        for tid in (first, last):
            self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")
        self.assertGreater(self.put("new")[0], last)
        self.assert_counts(queued=1)


if __name__ == "__main__":
    unittest.main()
