#!/usr/bin/env python3
"""muster.Pool: map with a shared parameter that the pool owner updates between rounds.

Start a head and a node agent whose workers run muster.worker, then this script:

    muster head --data-dir /tmp/h &
    PYTHONPATH=$PWD/examples/python:$PWD/python \\
      muster node --join $(cat /tmp/h/url) --token $(cat /tmp/h/token) --queue pool --workers 2 \\
        -- /usr/bin/python3 -m muster.worker &
    PYTHONPATH=python python3 examples/python/pool_update.py --url $(cat /tmp/h/url) --token $(cat /tmp/h/token)

The worker class is defined in this file; the workers import it from here (the Pool
sends this script's path and directory along; this module must be importable on the
worker machines, e.g. on their PYTHONPATH).  Each round maps the candidates, and the best
one so far is sent to every worker with update_workers: each worker applies it between
two jobs, before any job submitted afterwards.
"""
import argparse
import sys

import muster


class Scorer(muster.WorkerInterface):
    def __init__(self, init_data):
        self.target = init_data["target"]   # once per worker per pool
        self.best = None                    # the shared parameter, updated by the owner

    def run(self, x):
        score = -abs(x - self.target)
        improved = self.best is None or score > self.best[1]
        return {"x": x, "score": score, "best_seen": self.best, "improved": improved}

    def handle_update(self, best):
        self.best = best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--queue", default="pool")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    best = None
    with muster.Pool(Scorer, {"target": 42}, url=args.url, token=args.token, queue=args.queue) as pool:
        print("workers: %d on %d node(s)" % (pool.get_workers_count(), pool.get_nodes_count()))
        for rnd in range(args.rounds):
            candidates = list(range(rnd * 20, rnd * 20 + 20))
            results = pool.map(candidates)
            # every job of this round saw the update of the previous one
            assert all(r["best_seen"] == best for r in results), results
            top = max(results, key=lambda r: r["score"])
            if best is None or top["score"] > best[1]:
                best = (top["x"], top["score"])
            pool.update_workers(best)
            print("round %d: best %r" % (rnd, best))
    print("best:", best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
