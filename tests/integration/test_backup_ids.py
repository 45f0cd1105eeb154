"""Ids after a restore (docs/operations.md, "Backup and restore"; store_restore.c).

A head (the lost one) goes on after a backup: it puts tasks, registers a worker, posts
updates (also to a queue the backup does not have), records session results and numbers
DistCompute jobs (also of a pipeline the backup does not have), then dies.  A head started on the backup hands out none of those ids
and numbers again: each is above every one the lost head gave, and says so in one log
line.  The ids stay below 2^53, so a client that reads JSON numbers as doubles (as
JavaScript does) keeps them exact.  The jump happens once: the restored head's own
restart continues one by one, and the original's plain restart never jumps.  A second
restore from the same backup jumps above the first restored head's ids too.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from test_backup import BackupCase, all_tasks, put  # noqa: E402

EXACT = 2 ** 53  # doubles hold every integer below it
STARTED_ON_BACKUP = re.compile(
    r"store: started on a backup \(taken [0-9T:.Z-]+\); task ids continue from (\d+) so none "
    r"the lost head gave is given again")


def register(head, nickname):
    r = head.request("POST", "/v1/workers", {"nickname": nickname})
    assert r.status == 201, r
    return r.json["id"]


def post_update(head, queue, data):
    r = head.request("POST", "/v1/queues/%s/updates" % queue, {"data": data})
    assert r.status == 201, r
    return r.json["seq"]


def job_number(head, queue, task):
    r = head.request("POST", "/v1/distcompute/jobs", {"pipeline": queue, "task": task})
    assert r.status == 200, r
    return r.json["number"]


def make_queue(head, name):
    r = head.request("PUT", "/v1/queues/" + name, {})
    assert r.status in (200, 201), r


def finish_session_task(head, session, payload):
    """Puts one task in `session`, leases and completes it; its result's seq."""
    r = head.request("POST", "/v1/sessions/%s/tasks" % session, {"tasks": [{"payload": payload}]})
    assert r.status == 201, r
    r = head.request("POST", "/v1/queues/s/lease", {"max": 1})
    (lease,) = r.json["leases"]
    r = head.request("POST", "/v1/leases/complete", {"leases": [
        {"task": lease["task"], "token": lease["token"], "result": payload}]})
    assert r.status == 200, r
    r = head.request("GET", "/v1/sessions/%s/results?order=completion&max=1000" % session)
    assert r.status == 200, r
    return max(x["seq"] for x in r.json["results"])


def restore_lines(head):
    with open(head.log_path, errors="replace") as f:
        return [int(n) for n in STARTED_ON_BACKUP.findall(f.read())]


class IdsAfterRestoreTest(BackupCase):
    def lost_head(self):
        """A head that is backed up, goes on, and is killed: the backup's path and
        the highest id or number of each kind it handed out, before and after."""
        h = self.start()
        make_queue(h, "q")
        make_queue(h, "s")  # the session's
        session = h.request("POST", "/v1/sessions", {"queue": "s"}).json["id"]
        before = {"tasks": put(h, "q", ["b%d" % i for i in range(10)]),
                  "worker": register(h, "before"), "update": post_update(h, "q", "before"),
                  "seq": finish_session_task(h, session, "before")}
        before["job"] = job_number(h, "q", before["tasks"][0])
        r = self.backup(h, "early")
        self.assertEqual(r.status, 201, r)
        path = r.json["path"]
        make_queue(h, "later")  # a queue the backup does not have
        lost = {"tasks": put(h, "q", ["a%d" % i for i in range(100)]),
                "worker": max(register(h, "after%d" % i) for i in range(3)),
                "update": max(post_update(h, "q", i) for i in range(3)),
                "later_update": max(post_update(h, "later", i) for i in range(3)),
                "seq": max(finish_session_task(h, session, "after%d" % i) for i in range(3))}
        lost["job"] = max(job_number(h, "q", t) for t in lost["tasks"][:3])
        lost["later_job"] = max(job_number(h, "later", t) for t in put(h, "later", [1, 2]))
        lost["highest_task"] = max(max(all_tasks(h, q)) for q in ("q", "s", "later"))
        h.kill()
        return h, path, session, before, lost

    def start_on(self, path, token):
        b = self.start(data_dir=path, token=None)  # the token comes from the backup
        b.token = token
        return b

    def test_nothing_the_lost_head_gave_is_given_again(self):
        h, path, session, before, lost = self.lost_head()
        b = self.start_on(path, h.token)
        (next_id,) = restore_lines(b)
        ids = put(b, "q", ["r%d" % i for i in range(10)])
        self.assertEqual(ids[0], next_id, "the log line names the next task id")
        self.assertEqual(ids, list(range(ids[0], ids[0] + 10)), "consecutive after the jump")
        self.assertGreater(ids[0], lost["highest_task"], "a task id of the lost head again")
        self.assertGreaterEqual(ids[0], (int(time.time()) - 3600) * 1000 * 1024)
        self.assertLess(ids[-1], EXACT)
        self.assertGreater(register(b, "restored"), lost["worker"])
        self.assertGreater(post_update(b, "q", "restored"), lost["update"])
        make_queue(b, "later")
        self.assertGreater(post_update(b, "later", "restored"), lost["later_update"])
        (later,) = put(b, "later", ["restored"])
        self.assertGreater(job_number(b, "later", later), lost["later_job"])
        self.assertGreater(finish_session_task(b, session, "restored"), lost["seq"])
        self.assertGreater(job_number(b, "q", before["tasks"][1]), lost["job"])
        # What the backup holds reads as it was.
        r = b.request("GET", "/v1/tasks/%d" % before["tasks"][0])
        self.assertEqual((r.status, r.json["payload"]), (200, "b0"), r)
        r = b.request("GET", "/v1/tasks/%d" % lost["tasks"][0])
        self.assertEqual(r.error_code, "task_not_found", r)

    def test_ids_stay_exact_as_doubles(self):
        """A client that reads JSON numbers as doubles (JavaScript, Python's
        parse_int=float) reads the restored head's ids exactly and finds their tasks."""
        h, path, _, _, _ = self.lost_head()
        b = self.start_on(path, h.token)
        r = b.request("POST", "/v1/queues/q/tasks", {"tasks": [{"payload": "x"}]})
        (task,) = json.loads(r.raw, parse_int=float)["tasks"]
        r = b.request("GET", "/v1/tasks/%d" % int(task["id"]))
        self.assertEqual((r.status, r.json["payload"]), (200, "x"), r)
        self.assertEqual(json.loads(r.raw, parse_int=float)["id"], r.json["id"])
        self.assertEqual(restore_lines(b), [r.json["id"]], "not an id after the jump")
        self.assertLess(r.json["id"], EXACT)
        # The CLI (libmuster) takes and prints it whole too.
        p = subprocess.run([harness.MUSTER_BIN, "tasks", "show", str(r.json["id"])],
                           env=harness.cli_env(b), capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["id"], r.json["id"])

    def test_the_jump_happens_once(self):
        """The restored head's restart continues one by one, as the original's does."""
        h, path, _, before, lost = self.lost_head()
        b = self.start_on(path, h.token)
        first = put(b, "q", ["r1"])[0]
        worker = register(b, "r1")
        self.assertEqual(b.stop(), 0, b.log())
        b.start()
        self.assertEqual(restore_lines(b), [first], "the restart jumped again")
        self.assertEqual(put(b, "q", ["r2"]), [first + 1])
        self.assertEqual(register(b, "r2"), worker + 1)
        self.assertEqual(b.stop(), 0, b.log())
        h.start()  # the original data dir: a plain restart, never marked
        self.assertEqual(put(h, "q", ["h"]), [lost["highest_task"] + 1])
        self.assertEqual(register(h, "h"), lost["worker"] + 1)
        self.assertEqual(restore_lines(h), [])
        self.assertEqual(h.stop(), 0, h.log())

    def test_a_second_restore_jumps_above_the_first(self):
        """Two heads started in turn on copies of one backup: the second gives none of
        the ids the first gave."""
        h, path, _, _, lost = self.lost_head()
        copies = []
        for n in range(2):
            d = tempfile.mkdtemp(prefix="muster-restore-")
            self.addCleanup(shutil.rmtree, d, True)
            shutil.copytree(path, d, dirs_exist_ok=True)
            copies.append(d)
        first = self.start_on(copies[0], h.token)
        given = [i for _ in range(5) for i in put(first, "q", ["f"] * 1000)]
        workers = [register(first, "f%d" % i) for i in range(5)]
        self.assertGreater(min(given), lost["highest_task"])
        first.kill()
        second = self.start_on(copies[1], h.token)
        self.assertGreater(put(second, "q", ["s"])[0], max(given))
        self.assertGreater(register(second, "s"), max(workers))


if __name__ == "__main__":
    unittest.main()
