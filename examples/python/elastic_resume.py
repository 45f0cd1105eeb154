"""One rank of a job that reads a dataset through a coordinated iteration, saves every
rank's state every few steps, and when started again resumes where the last complete
set of states stopped, on any number of ranks (docs/python.md, "Coordinated iterations
without PyTorch").

Start one process per rank, as torchrun does (RANK and WORLD_SIZE in the environment),
with the head in MUSTER_URL and MUSTER_TOKEN:

    for r in 0 1 2 3; do RANK=$r WORLD_SIZE=4 python3 elastic_resume.py --dir run & done
    # ... kill them (kill -9 included) part-way through the epoch, then on 3 GPUs:
    for r in 0 1 2; do RANK=$r WORLD_SIZE=3 python3 elastic_resume.py --dir run --run 2 & done

(--run names a start, the same on every rank of it: a start that fails before it saves
states of its own and is started again from the same states reads from them again.)

Each rank appends the indices it trained on to DIR/trained-STEPS.RANK (STEPS: the step of
the states it resumed from, 0 for a fresh start): the first `step` lines of each file of
a run that stopped after saving states at `step`, and every line of the files of the
run that resumed from them, are each sample of the epoch exactly once.
"""
import argparse
import glob
import json
import os
import time

import muster


def save_state(directory, step, rank, state):
    """DIR/states-STEP/rank-RANK.json, replaced atomically (a crash leaves none or all)."""
    folder = os.path.join(directory, "states-%d" % step)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "rank-%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def last_complete_states(directory):
    """(step, every rank's states) of the newest set that every rank of its world saved,
    or (0, None)."""
    steps = sorted((int(p.rsplit("-", 1)[1]) for p in glob.glob(directory + "/states-*")),
                   reverse=True)
    for step in steps:
        files = glob.glob(os.path.join(directory, "states-%d" % step, "rank-*.json"))
        states = [json.load(open(p)) for p in sorted(files)]
        if states and len(states) == states[0]["world_size"]:
            return step, states
    return 0, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", default="elastic-example")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--save-every", type=int, default=10, help="steps between saved states")
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds per step")
    ap.add_argument("--run", help="this start's name, the same on every rank (a job id): a "
                    "later start that loads the same states reads from them again rather "
                    "than going on where this one's ranks left off")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.makedirs(args.dir, exist_ok=True)
    stream = muster.CoordinatedStream(args.name, args.samples, rank, world, shuffle="global",
                                      seed=args.seed, block_size=16, epochs=1)
    with stream:
        start, states = last_complete_states(args.dir)
        if states is not None:
            stream.load_state_dict(states, run=args.run)   # any world size
        trained = open(os.path.join(args.dir, "trained-%d.%d" % (start, rank)), "w")
        step = start
        for index in stream:
            trained.write("%d\n" % index)         # "train" on sample `index`
            trained.flush()
            step += 1
            if step % args.save_every == 0:       # every rank at the same step
                save_state(args.dir, step, rank, stream.state_dict())
            time.sleep(args.step_delay)
    print("rank %d of %d: done at step %d (iteration %s)" % (rank, world, step, stream.name))


if __name__ == "__main__":
    main()
