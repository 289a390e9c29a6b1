#!/usr/bin/env python3
"""A PyTorch DDP trainer balanced by lbbsp: the MLP (784-256-128-10) or CNN on Fashion-MNIST (HDF5 from
`lbbsp data import-fashion-mnist`), per-rank batch sizes re-sized every step by lbbsp.torch.LoadBalancer.

Launch with any of (rank and world size come from the launcher's environment):
    torchrun --nproc-per-node 4 scripts/torch_train.py --data data/fmnist.h5
    mpirun -n 4 python3 scripts/torch_train.py --data data/fmnist.h5   # OMPI_COMM_WORLD_* (MASTER_ADDR: rank 0's host)
    srun -n 4 python3 scripts/torch_train.py --data data/fmnist.h5          # SLURM_PROCID / SLURM_NTASKS
    python3 scripts/torch_train.py --data data/fmnist.h5 --spawn 4          # no launcher: 4 local processes

--straggle 1,1,0.5,0.25 --cost-slope S emulates capacities: a rank at capacity c takes max(forward, S x batch / c)
seconds, after the forward pass, after backward or (added) in loading the batch (--cost-at; lbbsp train's
`--straggle static:...;gpu=0:0:S:1000000`). --workers N reads the batches through a DataLoader with N worker
processes (lb.data_loader: the balancer's sampler, its lag set to what the workers read ahead). --plain-ddp runs
stock DDP instead (equal split, averaging allreduce): the baseline. --device cuda trains on the GPUs (local rank r on
GPU r mod count). Rank 0 prints one JSON summary line (and writes --summary-json).
"""
import argparse
import cProfile
import json
import os
import pstats
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import lbbsp
from lbbsp.torch import AllowEmpty, LoadBalancer, init_from_env


def make_model(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, padding=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1568, 10))


def load(path, split, model):
    import h5py
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(np.asarray(f[f"{split}/images"], dtype=np.float32) / 255.0)
        y = torch.from_numpy(np.asarray(f[f"{split}/labels"], dtype=np.int64))
    return (x.reshape(-1, 1, 28, 28) if model == "cnn" else x.reshape(len(x), -1)), y


class H5Samples(torch.utils.data.Dataset):
    """Map-style: training sample i read from the HDF5 file on each access (--read h5: the h5py Dataset a user
    writes from docs/torch.md), the file opened once per DataLoader worker."""

    def __init__(self, path, model):
        import h5py
        self.path, self.model, self.file = path, model, None
        with h5py.File(path, "r") as f:
            self.n = len(f["train/labels"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        x = torch.from_numpy(self.file["train/images"][i].astype(np.float32) / 255.0)
        return x.reshape(1, 28, 28) if self.model == "cnn" else x.flatten(), int(self.file["train/labels"][i])


def emulate(capacity, slope, n, real_s):
    """Sleeps so that this step's compute takes max(real, slope x n / capacity) seconds."""
    target = slope * n / capacity
    if target > real_s:
        time.sleep(target - real_s)


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).double().mean().item()
    model.train()
    return acc


def batches(a, lb, fixed, rank, steps, xtr, ytr):
    """(x, y) of this rank for every step: slices of the tensors, or (--workers N) a DataLoader with N worker
    processes, the balancer's own (lb.data_loader, whose lag it sets) or, for a fixed split, one over the fixed
    split's index lists."""
    controlled = not (a.plain_ddp or a.oracle)
    if not a.workers:
        for g in range(steps):
            epoch, step = divmod(g, lb.steps_per_epoch)
            idx = (lb.indices(epoch, step) if controlled
                   else lbbsp.rank_indices(lb.permutation(epoch), step, fixed, rank))
            idx = torch.from_numpy(idx)
            yield xtr[idx], ytr[idx]
        return
    data = torch.utils.data.TensorDataset(xtr.cpu(), ytr.cpu()) if a.read == "memory" else H5Samples(a.data, a.model)
    if controlled:
        loader = lb.data_loader(data, num_workers=a.workers, prefetch_factor=1, persistent_workers=True)
    else:
        lists = [lbbsp.rank_indices(lb.permutation(g // lb.steps_per_epoch), g % lb.steps_per_epoch, fixed,
                                    rank).tolist() for g in range(steps)]
        loader = torch.utils.data.DataLoader(data, batch_sampler=lists, num_workers=a.workers, prefetch_factor=1,
                                             collate_fn=AllowEmpty(data))
    done = 0
    while done < steps:
        for xy in loader:
            yield xy
            done += 1
            if done == steps:
                return


def train(a, local_rank):
    torch.set_num_threads(a.threads)
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank % torch.cuda.device_count()) if a.device == "cuda" else torch.device("cpu")
    xtr, ytr = (t.to(dev) for t in load(a.data, "train", a.model))
    xte, yte = (t.to(dev) for t in load(a.data, "test", a.model))
    torch.manual_seed(a.seed)
    model = DDP(make_model(a.model).to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    caps = [float(c) for c in a.straggle.split(",")]
    cap = caps[rank % len(caps)]
    balancer = "bsp" if a.plain_ddp else "oracle" if a.oracle else a.balancer
    # Plain DDP keeps its averaging hook (model=None: LoadBalancer registers nothing) and the equal split.
    lb = LoadBalancer(None if a.plain_ddp else model, dataset_size=len(xtr), global_batch=a.global_batch,
                      balancer="bsp" if a.oracle else balancer, predictor=a.predictor, seed=a.seed)
    # Fixed split: equal for plain DDP, the exact assignment for the known capacities for --oracle.
    fixed = lbbsp.assign_by_speed([caps[r % len(caps)] for r in range(world)], a.global_batch) if a.oracle \
        else lb.batch_sizes
    steps = min(a.max_iterations or 1 << 62, lb.steps_per_epoch * a.epochs)
    train_s, control_s, time_to_target, acc = 0.0, 0.0, None, float("nan")
    sizes = []  # every step's batch vector
    data = batches(a, lb, fixed, rank, steps, xtr, ytr)  # plain DDP and --oracle: a fixed split, no controller
    first = next(data)  # DataLoader workers start here, outside the timed steps
    dist.barrier()
    profile = cProfile.Profile() if a.profile and rank == 0 else None
    if profile is not None:  # the host's time in the loop, function by function (where a host-bound step goes)
        profile.enable()
    for g in range(steps):
        t0 = time.perf_counter()
        sizes.append((fixed if a.plain_ddp or a.oracle else lb.batch_sizes).tolist())
        xb, yb = first if g == 0 else next(data)
        xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)  # from a DataLoader: on the host
        # The emulated cost where --cost-at puts it: reading the batch (added), or after the forward pass or
        # after backward (max with the forward's own time); lbbsp.torch measures the whole step either way.
        if a.cost_at == "load":
            emulate(cap, a.cost_slope, len(yb), 0.0)
        t_compute = time.perf_counter()
        out = model(xb)
        if a.plain_ddp:
            loss = F.cross_entropy(out, yb)  # mean over an equal slice; DDP averages: global mean
        else:
            loss = lb.scale(F.cross_entropy(out, yb), count=len(yb))  # this rank's share of the mean
        forward_s = time.perf_counter() - t_compute
        if a.cost_at == "forward":
            emulate(cap, a.cost_slope, len(yb), forward_s)
        loss.backward()
        if a.cost_at == "after-backward":
            emulate(cap, a.cost_slope, len(yb), forward_s)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_control = time.perf_counter()
        if not (a.plain_ddp or a.oracle):
            lb.step()
        control_s += time.perf_counter() - t_control
        if dev.type == "cuda" and (g == steps - 1 or (a.eval_every and (g + 1) % a.eval_every == 0)):
            torch.cuda.synchronize(dev)  # the device's queued steps count before an evaluation and at the end
        train_s += time.perf_counter() - t0
        if rank == 0 and a.eval_every and (g + 1) % a.eval_every == 0:
            with lb.untimed():  # rank 0's evaluation is not part of its step time
                acc = evaluate(model.module, xte[:a.test_subset or None], yte[:a.test_subset or None])
            if a.target_accuracy and time_to_target is None and acc >= a.target_accuracy:
                time_to_target = train_s
    if profile is not None:
        profile.disable()
        with open(a.profile, "w") as f:
            pstats.Stats(profile, stream=f).sort_stats("tottime").print_stats(40)
    if rank == 0:
        runner = "plain-ddp" if a.plain_ddp else "ddp+oracle" if a.oracle else "ddp+lbbsp"
        final = fixed if a.plain_ddp or a.oracle else lb.batch_sizes
        s = {"runner": runner, "balancer": balancer, "ranks": world,
             "model": a.model, "global_batch": a.global_batch, "iterations": steps, "train_time_s": train_s,
             "mean_iteration_s": train_s / max(steps, 1), "controller_fraction": control_s / max(train_s, 1e-12),
             "decide_fraction": lb.timing["decide_s"] / max(train_s, 1e-12),
             "report_wait_fraction": lb.timing["wait_s"] / max(train_s, 1e-12),
             "test_accuracy": acc, "target_accuracy": a.target_accuracy, "time_to_target_s": time_to_target,
             "cost_at": a.cost_at, "workers": a.workers, "device": a.device, "final_batch_sizes": final.tolist(),
             "batch_sizes": sizes, "torch": torch.__version__, "lbbsp": lbbsp.__version__}
        print(json.dumps({k: v for k, v in s.items() if k != "batch_sizes"}), flush=True)  # --summary-json has them
        if a.summary_json:
            with open(a.summary_json, "w") as f:
                json.dump(s, f, indent=1)


def backend(a, world):
    """--spawn: NCCL where every rank has a GPU of its own, else gloo (several ranks on one GPU, or the CPU)."""
    return "nccl" if a.device == "cuda" and world <= torch.cuda.device_count() else "gloo"


def spawned(rank, a, world, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    init_from_env(backend=backend(a, world))
    train(a, rank)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="Fashion-MNIST HDF5 (lbbsp data import-fashion-mnist)")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-iterations", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--balancer", default="lbbsp-cpu")
    ap.add_argument("--predictor", default="narx")
    ap.add_argument("--plain-ddp", action="store_true", help="stock DDP: equal split, averaging allreduce")
    ap.add_argument("--oracle", action="store_true",
                    help="the best fixed split for the --straggle capacities (no controller): the upper bound")
    ap.add_argument("--straggle", default="1", help="capacity per rank, cycled (e.g. 1,1,0.5,0.25)")
    ap.add_argument("--cost-slope", type=float, default=0.0, help="emulated cost: S seconds per sample / capacity")
    ap.add_argument("--cost-at", default="forward", choices=["load", "forward", "after-backward"],
                    help="where the emulated cost lands in the step (default: after the forward pass)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="read batches through a DataLoader with N workers")
    ap.add_argument("--read", default="memory", choices=["memory", "h5"],
                    help="with --workers: samples from the tensors in memory, or read one by one from the HDF5 file")
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--test-subset", type=int, default=0)
    ap.add_argument("--target-accuracy", type=float, default=None)
    ap.add_argument("--summary-json", default=None)
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="rank 0 profiles its training loop (cProfile) and writes the 40 costliest functions here")
    ap.add_argument("--spawn", type=int, default=0, help="start N local processes instead of using a launcher")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: local rank r on GPU r %% count; with --spawn, NCCL where each rank has its own GPU "
                         "(else gloo), under a launcher NCCL")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_train.py: --device cuda, but torch sees no CUDA device")
    if not os.path.exists(a.data):
        sys.exit(f"torch_train.py: --data {a.data} does not exist (make it with: lbbsp data import-fashion-mnist "
                 f"--out {a.data})")
    if a.spawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(spawned, args=(a, a.spawn, port), nprocs=a.spawn, join=True)
        return
    local = init_from_env(backend=None if a.device == "cuda" else "gloo")  # cuda: NCCL
    train(a, local)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
