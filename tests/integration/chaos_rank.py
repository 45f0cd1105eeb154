"""One rank of a training job's data stream for test_chaos_iteration.py: a coordinated sampler
(muster.coordinated.CoordinatedRankSampler, what DistributedSampler(coordinated=True)
runs) driven by commands on stdin, one per line, as a training loop would drive it:

  take K      yields the rank's next K indices ("i INDEX" each), then "took"; "end"
              instead when the epoch ended first
  state       prints "state JSON": the rank's state_dict() (acknowledges what was read)
  load JSON   load_state_dict(JSON): a list of every rank's states (an exact resume)
  rest        yields the rest of the epoch ("i INDEX" each), then "end"

It prints "retrying" when the sampler first waits for a head that does not answer (its
WARNING on the muster.iteration logger), so the test acts on that, not on a guess.

  chaos_rank.py URL TOKEN NAME RANK WORLD_SIZE NUM_SAMPLES BLOCK_SIZE SEED
"""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import muster  # noqa: E402
from muster.coordinated import CoordinatedRankSampler  # noqa: E402


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class SayRetrying(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            say("retrying")


def main():
    url, token, name = sys.argv[1:4]
    rank, world, n, block, seed = (int(a) for a in sys.argv[4:9])
    logging.getLogger("muster.iteration").addHandler(SayRetrying())
    logging.getLogger("muster.iteration").propagate = False
    config = {"dataset": {"num_samples": n}, "seed": seed, "shuffle": "global",
              "strategy": "dynamic", "world_size": world, "block_size": block, "epochs": 1,
              "lease_ms": 30000, "rank_timeout_ms": 30000}
    sampler = CoordinatedRankSampler(muster.Client(url, token), name, config, rank)
    stream = None
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "load":
            sampler.load_state_dict(json.loads(arg))
        elif cmd == "state":
            say("state " + json.dumps(sampler.state_dict()))
        elif cmd in ("take", "rest"):
            stream = stream or iter(sampler)
            count = int(arg) if cmd == "take" else -1
            for index in stream:
                say("i %d" % index)
                count -= 1
                if count == 0:
                    break
            say("took" if count == 0 else "end")
    sampler.close()


if __name__ == "__main__":
    main()
