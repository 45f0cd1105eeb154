#!/usr/bin/env python3
"""Training on a tiny synthetic dataset that survives `kill -9` mid-epoch.

The sampler's position is saved with the model in one checkpoint after every step
(written to a temporary file and renamed, so a kill never leaves half a checkpoint).
Run it again with the same --dir after a kill: it resumes from the checkpoint, and every
epoch trains on every sample exactly once: none repeated, none skipped.

    PYTHONPATH=python /usr/bin/python3 examples/python/train_resume.py --dir /tmp/run   # kill -9 it
    PYTHONPATH=python /usr/bin/python3 examples/python/train_resume.py --dir /tmp/run   # resumes

With --url (and --token) the sampler is a coordinated one on the head (an iteration
named --name); without, the standalone sampler (no server).  The checkpoint also
records the samples trained on per epoch (``seen``), which is how the test checks the
promise.  --workers gives the DataLoader worker processes, which take indices ahead of
the step (two batches each): the sampler's state is saved with ``consumed=`` the samples
trained on, so what they had taken beyond it is trained on after a resume.
--step-delay slows each step down (a stand-in for real work).  --device picks
where the model trains (default: cuda when PyTorch sees a GPU, else cpu); a checkpoint
saved on one device resumes on another.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.utils.data

from muster.torch import DistributedSampler


class Synthetic(torch.utils.data.Dataset):
    """N samples of y = x . w + noise, each returned with its index."""

    def __init__(self, n, dim=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        w = torch.arange(1, dim + 1, dtype=torch.float32)
        self.y = self.x @ w + 0.01 * torch.randn(n, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def save_atomic(obj, path, json_text=False):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        if json_text:
            f.write(json.dumps(obj).encode())
        else:
            torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-delay", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--name", default="train-example")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    ckpt_path = os.path.join(args.dir, "checkpoint.pt")

    torch.manual_seed(args.seed)
    data = Synthetic(args.samples, seed=args.seed)
    options = {}
    if args.url:
        import muster
        options = dict(coordinated=True, client=muster.Client(args.url, args.token), name=args.name,
                       block_size=4)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=args.seed, **options)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler,
                                         num_workers=args.workers)
    device = torch.device(args.device)
    model = torch.nn.Linear(data.x.shape[1], 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step, seen = 0, {}
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optim"])
        sampler.load_state_dict(ckpt["sampler"])
        step, seen = ckpt["step"], ckpt["seen"]
        print("resumed at step %d, epoch %d" % (step, sampler.epoch), flush=True)

    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        trained = 0   # samples trained on since the loader began this epoch (or the resume)
        for idx, x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            trained += len(idx)
            seen.setdefault(epoch, []).extend(int(i) for i in idx)
            save_atomic({"model": model.state_dict(), "optim": opt.state_dict(),
                         "sampler": sampler.state_dict(consumed=trained), "step": step,
                         "seen": seen}, ckpt_path)
            save_atomic({"step": step, "epoch": epoch, "in_epoch": len(seen[epoch]), "loss": loss.item()},
                        os.path.join(args.dir, "progress.json"), json_text=True)
            if args.step_delay:
                time.sleep(args.step_delay)
        print("epoch %d on %s: %d samples, loss %.4f"
              % (epoch, device, len(seen.get(epoch, [])), loss.item()), flush=True)
    save_atomic({"step": step, "seen": {str(k): v for k, v in seen.items()}},
                os.path.join(args.dir, "done.json"), json_text=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
