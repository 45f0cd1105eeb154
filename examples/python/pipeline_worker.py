#!/usr/bin/env python3
"""A DistCompute-style three-stage pipeline: scrape -> download -> filter.

Each stage's worker uses muster.init (the DistCompute client's interface); a completed
job's data becomes a job of the next stage.  Run a head, then:

    PYTHONPATH=python python3 examples/python/pipeline_worker.py --url URL --token T --setup --seed 5
    PYTHONPATH=python python3 examples/python/pipeline_worker.py --url URL --token T --stage a &
    PYTHONPATH=python python3 examples/python/pipeline_worker.py --url URL --token T --stage b &
    PYTHONPATH=python python3 examples/python/pipeline_worker.py --url URL --token T --stage c

``--max-jobs N`` makes a worker stop after N jobs (used by the test).
"""
import argparse
import sys

import muster

PIPELINE = ["scrape", "download", "filter"]


def setup(client, seed):
    """The queues, last stage first (``next`` must exist), and `seed` jobs for stage a."""
    client.put_queue(PIPELINE[2])
    client.put_queue(PIPELINE[1], next=PIPELINE[2])
    client.put_queue(PIPELINE[0], next=PIPELINE[1])
    client.put_payloads(PIPELINE[0], [{"page": i} for i in range(seed)])


def work(stage, data):
    if stage == "a":     # scrape: a page -> the URL of its file
        return {"page": data["page"], "url": "http://example.invalid/file-%d.bin" % data["page"]}
    if stage == "b":     # download: a URL -> where the file went and its size
        return dict(data, path="/tmp/file-%d.bin" % data["page"], size=1000 + data["page"])
    # filter: keep files of an even size
    return dict(data, keep=data["size"] % 2 == 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--stage", choices=["a", "b", "c"])
    ap.add_argument("--setup", action="store_true")
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--max-jobs", type=int, default=0)
    ap.add_argument("--nickname", default="example")
    args = ap.parse_args()
    if args.setup:
        setup(muster.Client(args.url, args.token), args.seed)
        return 0
    client = muster.init(args.url, stage=args.stage, pipeline=PIPELINE[0], nickname=args.nickname,
                         token=args.token, verbose=False)
    done = 0
    try:
        while client.is_alive() and not (args.max_jobs and done >= args.max_jobs):
            try:
                client.new_job(wait_ms=2000)
            except muster.ZeroJobError:
                continue
            client.log("working on job %d" % client.job_id)
            client.complete_job(work(args.stage, client.job))
            done += 1
    finally:
        client.bye()
    print("stage %s (%s): %d jobs" % (args.stage, client.stage_name, done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
