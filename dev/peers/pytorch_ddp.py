#!/usr/bin/python3
"""PyTorch DDP peer of `lbbsp train` with the bsp balancer: the same MLP (784-256-128-10 ReLU) or CNN, the same
data order (lbbsp.epoch_permutation: the Python package's binding of balancer/sampling.cpp, the permutation
`lbbsp train` cuts its global batches from; so lbbsp must be importable), the same global batch cut into equal
slices (DDP cannot rebalance), SGD with momentum, and the same static straggler emulation: a rank at capacity c
stretches its compute (forward + backward) to compute / c (or, with --cost-slope S, to S x batch / c, lbbsp's
linear cost gpu=0:0:S:CAP) by sleeping the difference before its gradients enter the allreduce (a DDP
communication hook sleeps, then runs the default allreduce).

Ranks are torch.multiprocessing processes on localhost with the gloo backend, one thread each.

usage: dev/peers/pytorch_ddp.py --data data/fmnist.h5 --ranks 4 --global-batch 512 --lr 0.1 \
           --max-iterations 1200 --straggle 1,1,0.5,0.25 --eval-every 100 --test-subset 5000 \
           --target-accuracy 0.87 --summary-json out.json
Writes a summary JSON with the fields of lbbsp's that apply (mean_iteration_s, train_time_s, time_to_target_s,
accuracy_curve, test_accuracy, ...). Initial weights are PyTorch's defaults, not lbbsp's.
"""
import argparse
import json
import os
import socket
import time

import h5py
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import lbbsp


def make_model(kind, dim, classes):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, classes))
    if kind == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(1568, classes))
    raise ValueError(f"unknown model {kind!r} (mlp or cnn)")


def load(path, split, limit=0):
    with h5py.File(path, "r") as f:
        x = f[f"{split}/images"]
        y = f[f"{split}/labels"]
        n = x.shape[0] if not limit else min(limit, x.shape[0])
        xs = np.asarray(x[:n], dtype=np.float32) / 255.0
        return xs, np.asarray(y[:n], dtype=np.int64)


class Stretch:
    """Sleeps in the first bucket's hook of an iteration until compute / capacity has passed."""

    def __init__(self, capacity, slope=0.0, batch=0):
        self.capacity = capacity
        self.floor = slope * batch / capacity  # linear emulated cost (lbbsp's gpu=0:0:SLOPE:CAP), 0 if unused
        self.t_start = 0.0
        self.done = False
        self.compute_s = 0.0

    def begin(self):
        self.t_start = time.perf_counter()
        self.done = False

    def hook(self, state, bucket):
        if not self.done:
            self.done = True
            real = time.perf_counter() - self.t_start
            target = max(real, self.floor) if self.floor > 0 else real / self.capacity
            if target > real:
                time.sleep(target - real)
            self.compute_s = time.perf_counter() - self.t_start
        return default_hooks.allreduce_hook(state, bucket)


def worker(rank, a, port, caps):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(a.seed)
    xtr, ytr = load(a.data, "train", a.train_subset)
    shape = xtr.shape[1:]
    classes = int(max(ytr.max(), 9)) + 1
    if a.model == "cnn":
        xtr = xtr.reshape(-1, 1, 28, 28)
    xte = yte = None
    if rank == 0:
        xte, yte = load(a.data, "test", a.test_subset)
        if a.model == "cnn":
            xte = xte.reshape(-1, 1, 28, 28)
        xte, yte = torch.from_numpy(xte), torch.from_numpy(yte)
    dim = int(np.prod(shape))
    model = make_model(a.model, dim, classes)
    n, X, R = xtr.shape[0], a.global_batch, a.ranks
    # Equal split as lbbsp's bsp: X // R each, the remainder to the first ranks.
    sizes = [X // R + (1 if r < X % R else 0) for r in range(R)]
    stretch = Stretch(caps[rank % len(caps)], a.cost_slope, sizes[rank])
    ddp = DDP(model, bucket_cap_mb=64)
    ddp.register_comm_hook(dist.group.WORLD, stretch.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay)
    per_epoch = n // X
    total = per_epoch * a.epochs
    if a.max_iterations:
        total = min(total, a.max_iterations)
    offset = sum(sizes[:rank])
    curve, train_time, time_to_target, compute_sum, last_loss = [], 0.0, None, 0.0, float("nan")
    perm = None
    dist.barrier()

    def evaluate(it):
        nonlocal time_to_target
        model.eval()
        with torch.no_grad():
            logits = model(xte)
            loss = F.cross_entropy(logits, yte).item()
            acc = (logits.argmax(1) == yte).float().mean().item()
        model.train()
        curve.append({"iteration": it, "epoch": it / per_epoch, "train_time_s": train_time, "test_accuracy": acc,
                      "test_loss": loss})
        if a.target_accuracy and time_to_target is None and acc >= a.target_accuracy:
            time_to_target = train_time

    for it in range(total):
        epoch, pos = divmod(it, per_epoch)
        if pos == 0:
            perm = lbbsp.epoch_permutation(n, a.seed, epoch)
        t = time.perf_counter()
        rows = perm[pos * X + offset: pos * X + offset + sizes[rank]]
        xb, yb = torch.from_numpy(xtr[rows]), torch.from_numpy(ytr[rows])
        stretch.begin()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xb), yb)  # mean over the slice; DDP averages over equal slices = sum / X
        loss.backward()
        opt.step()
        train_time += time.perf_counter() - t
        compute_sum += stretch.compute_s
        last_loss = loss.item()
        if rank == 0 and a.eval_every and (it + 1) % a.eval_every == 0:
            evaluate(it + 1)
    if rank == 0 and (not curve or curve[-1]["iteration"] != total):
        evaluate(total)
    dist.barrier()
    if rank == 0:
        s = {"model": a.model, "ranks": R, "threads": 1, "global_batch": X, "iterations": total,
             "train_time_s": train_time, "mean_iteration_s": train_time / max(total, 1),
             "samples_per_s": total * X / train_time if train_time > 0 else 0.0, "train_loss": last_loss,
             "test_loss": curve[-1]["test_loss"], "test_accuracy": curve[-1]["test_accuracy"],
             "balancer": "pytorch-ddp", "predictor": "", "straggle": "static:" + ",".join(map(str, caps)),
             "wait_fraction": None, "balancer_overhead_fraction": 0.0, "target_accuracy": a.target_accuracy,
             "time_to_target_s": time_to_target, "accuracy_curve": curve, "torch": torch.__version__,
             "rank0_mean_compute_s": compute_sum / max(total, 1)}
        if a.summary_json:
            with open(a.summary_json, "w") as f:
                json.dump(s, f, indent=1)
        print(json.dumps({k: v for k, v in s.items() if k != "accuracy_curve"}))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--max-iterations", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--straggle", default="1", help="capacity factor per rank, cycled, e.g. 1,1,0.5,0.25")
    ap.add_argument("--cost-slope", type=float, default=0.0,
                    help="linear emulated cost: stretch compute to SLOPE s/sample x batch / capacity (as lbbsp's "
                         "gpu=0:0:SLOPE:CAP); 0: compute / capacity")
    ap.add_argument("--train-subset", type=int, default=0)
    ap.add_argument("--test-subset", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--target-accuracy", type=float, default=None)
    ap.add_argument("--summary-json", default=None)
    a = ap.parse_args()
    caps = [float(c) for c in a.straggle.split(",")]
    if any(not c > 0 or c > 1 for c in caps):
        raise SystemExit("pytorch_ddp.py: --straggle factors must be in (0, 1]")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a, port, caps), nprocs=a.ranks, join=True)


if __name__ == "__main__":
    main()
