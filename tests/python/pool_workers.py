"""Worker classes of test_pool.py.  They live in a module of their own so that the
workers (``python3 -m muster.worker`` under a node agent) can import them: the Pool
sends this directory along and the worker adds it to sys.path."""
import os
import time

import muster

DEADLINE_S = 30.0


def _wait_for(predicate, what):
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


class Echo(muster.WorkerInterface):
    inits = {}   # per process: how often it was instantiated here, per pool (its dir)

    def __init__(self, init_data):
        type(self).inits[init_data["dir"]] = type(self).inits.get(init_data["dir"], 0) + 1
        self.k = init_data["k"]
        self.dir = init_data["dir"]
        self.updates = []

    def run(self, x, mode=None, tag=None):
        if mode == "raise":
            raise ValueError("boom %s" % x)
        if mode == "block":
            # Say that this job runs here, then wait until the test releases it.
            open(os.path.join(self.dir, "started-%d-%s" % (os.getpid(), x)), "w").close()
            _wait_for(lambda: os.path.exists(os.path.join(self.dir, "release")), "release")
        if mode == "barrier":
            # Every job of the barrier waits for a job on another process: so two
            # jobs run on two different workers at the same time.
            open(os.path.join(self.dir, "arrived-%s-%d" % (tag, os.getpid())), "w").close()
            _wait_for(lambda: len([f for f in os.listdir(self.dir)
                                   if f.startswith("arrived-%s-" % tag)]) >= 2, "barrier " + tag)
        return {"x": x, "y": x * self.k, "pid": os.getpid(), "inits": type(self).inits[self.dir],
                "updates": list(self.updates)}

    def handle_update(self, value, extra=None):
        self.updates.append(value if extra is None else (value, extra))
