"""Task ids are never given twice (docs/api.md, "Task ids"): not after the task with the
highest id was removed by a queue delete, a purge or a session close, and not after a
restart, with or without a clean stop.  SQLite's own choice for a new row, the highest id
+ 1, would give such a task's id to the next put, and a client holding it would read
another task.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_api_common import OwnHeadTestCase  # noqa: E402


class TaskIdTest(OwnHeadTestCase):

    def assert_gone(self, *ids):
        for tid in ids:
            self.expect_error("GET", "/v1/tasks/%d" % tid, None, 404, "task_not_found")

    def test_ids_grow_by_one_in_put_order(self):
        self.create_queue()
        first = self.put("a")
        batch = self.put(*range(100))  # chunked inserts: 64 + 32 + 4 rows
        self.assertEqual(batch, list(range(first[0] + 1, first[0] + 101)))

    def test_queue_delete_does_not_give_ids_again(self):
        self.create_queue()
        ids = self.put("a", "b", "c")
        self.expect("DELETE", "/v1/queues/" + self.q)
        self.create_queue()
        self.assertEqual(self.put("d"), [ids[-1] + 1])
        self.assert_gone(*ids)

    def test_purge_does_not_give_ids_again(self):
        self.create_queue()
        ids = self.put("a", "b")
        self.assertEqual(self.expect("POST", "/v1/queues/%s/purge" % self.q), {"purged": 2})
        new = self.put("c")[0]
        self.assertEqual(new, ids[-1] + 1)
        self.assert_gone(*ids)
        self.assertEqual(self.get_task(new)["payload"], "c")

    def test_session_close_does_not_give_ids_again(self):
        self.create_queue()
        before = self.put("plain")[0]
        sid = self.expect("POST", "/v1/sessions", {"queue": self.q}, status=201)["id"]
        ids = [t["id"] for t in self.expect("POST", "/v1/sessions/%s/tasks" % sid,
                                            {"tasks": [{"payload": i} for i in range(3)]},
                                            status=201)["tasks"]]
        self.expect("DELETE", "/v1/sessions/" + sid)
        self.assert_gone(*ids)
        self.assertEqual(self.put("after")[0], ids[-1] + 1)
        self.assertEqual(self.get_task(before)["payload"], "plain")

    def restart_after_deleting_the_newest(self, restart):
        self.create_queue()
        ids = self.put("a", "b", "c")
        self.expect("DELETE", "/v1/queues/" + self.q)
        restart()
        self.create_queue()
        self.assertEqual(self.put("d"), [ids[-1] + 1])
        self.assert_gone(*ids)

    def test_no_id_given_again_after_a_stop(self):
        self.restart_after_deleting_the_newest(lambda: (self.head.stop(), self.head.start()))

    def test_no_id_given_again_after_kill9(self):
        self.restart_after_deleting_the_newest(lambda: (self.head.kill(), self.head.start()))

    def test_ids_go_on_after_a_restart_without_a_gap(self):
        self.create_queue()
        last = self.put("a", "b")[-1]
        self.head.kill()
        self.head.start()
        self.assertEqual(self.put("c"), [last + 1])


if __name__ == "__main__":
    unittest.main()
