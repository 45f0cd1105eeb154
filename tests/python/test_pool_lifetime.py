"""What a muster.Pool leaves behind: nothing once closed (no socket, no thread), and a
pool nobody holds any more is closed by the garbage collector, its session with it; a
pool whose worker class no worker could load is refused when it is made.  No worker
runs: a pool's lifetime needs none."""
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from common import ROOT, HeadTestCase, muster

import pool_workers


def open_sockets():
    """How many sockets this process has open."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink("/proc/self/fd/" + fd).startswith("socket:")
        except OSError:
            pass   # the listing's own descriptor, closed meanwhile
    return n


@unittest.skipUnless(os.path.isdir("/proc/self/fd"), "needs /proc to count sockets")
class PoolLifetimeTest(HeadTestCase):
    def setUp(self):
        super().setUp()
        self.q = self.qname()
        self.c.put_queue(self.q)

    def pool(self):
        return muster.Pool(pool_workers.Echo, {"k": 1, "dir": "."}, url=self.head.url,
                           token=self.head.token, queue=self.q)

    def test_close_leaves_no_socket_and_no_thread(self):
        """The pool's own client kept its keep-alive connection open after close, one
        socket per pool a program ever made."""
        before = open_sockets()
        with self.pool() as p:
            p.update_workers("u")   # the pool's client has a connection now
            self.assertGreater(open_sockets(), before)
        self.assertFalse(p._hb.is_alive())
        self.assertEqual(open_sockets(), before)
        p2 = self.pool()
        p2.map([], timeout=5)
        p2.close()
        self.assertFalse(p2._hb.is_alive())
        self.assertEqual(open_sockets(), before)

    def test_a_pool_nobody_holds_is_closed(self):
        """The heartbeat thread held the pool, so a pool dropped without close() was never
        collected: its thread heart-beat its session, open, for the life of the process."""
        p = self.pool()
        session, thread = p.session, p._hb
        self.assertEqual(self.c.session(session)["state"], "open")
        del p
        gc.collect()
        thread.join(10)
        self.assertFalse(thread.is_alive())
        with self.assertRaises(muster.SessionNotFound):
            self.c.session(session)

    def test_a_class_of_a_main_without_script_is_refused(self):
        """A class defined in `python3 -` (or -c, a notebook) made a pool whose every job
        failed after all its attempts, with "Can't get attribute 'W' on <module
        'muster.worker'>": the pool now says so at once and makes nothing on the head."""
        q = self.qname("stdin")
        program = ("import muster\n"
                   "class W(muster.WorkerInterface):\n"
                   "    def run(self, x): return x\n"
                   "try:\n"
                   "    muster.Pool(W, url=%r, token=%r, queue=%r).close()\n"
                   "    print('made a pool')\n"
                   "except ValueError as e:\n"
                   "    print(e)\n" % (self.head.url, self.head.token, q))
        out = subprocess.run([sys.executable, "-"], input=program.encode(), timeout=60,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        text = out.stdout.decode()
        self.assertIn("the worker class W is defined in __main__ of a program that has no "
                      "script file", text)
        with self.assertRaises(muster.QueueNotFound):
            self.c.queue(q)

    def test_a_script_that_opens_its_pool_unguarded_is_told_so(self):
        """A worker loads the script that defines the worker class (as __mp_main__); a
        script without `if __name__ == "__main__":` opened its pool again in there, which
        talked to the head and then failed to pickle the class: every job died with
        "Can't pickle <class '__mp_main__.W'>: it's not the same object".  The pool opened
        during that load now raises at once, naming the script and the fix."""
        q = self.qname("unguarded")
        tmp = tempfile.mkdtemp(prefix="muster-unguarded-")
        self.addCleanup(shutil.rmtree, tmp, True)
        script = os.path.join(tmp, "unguarded.py")
        with open(script, "w") as f:
            f.write("import muster\n"
                    "class W(muster.WorkerInterface):\n"
                    "    def run(self, x): return x\n"
                    "with muster.Pool(W, url=%r, token=%r, queue=%r) as p:\n"
                    "    p.map([1], timeout=5)\n" % (self.head.url, self.head.token, q))
        # As a node agent's worker runs it: `python3 -m muster.worker`, a module of its
        # own beside the muster.worker that muster.pool imports.
        program = ("import runpy, sys\n"
                   "worker = runpy.run_module('muster.worker', run_name='as_with_dash_m')\n"
                   "try:\n"
                   "    worker['_main_module'](sys.argv[1])\n"
                   "    print('loaded')\n"
                   "except RuntimeError as e:\n"
                   "    print(e)\n"
                   "from muster import _main_load\n"
                   "print('loading after:', _main_load.script)\n")
        out = subprocess.run([sys.executable, "-c", program, script], timeout=60,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        text = out.stdout.decode()
        self.assertIn("muster.Pool: a worker loads %s to find the worker class defined there"
                      % script, text)
        self.assertIn('put that code under `if __name__ == "__main__":`', text)
        self.assertIn("loading after: None", text)
        with self.assertRaises(muster.QueueNotFound):   # nothing was made on the head
            self.c.queue(q)


if __name__ == "__main__":
    unittest.main()
