#!/usr/bin/env python3
"""A complete PyTorch DDP trainer balanced by lbbsp.torch: the MLP (784-256-128-10) or CNN on Fashion-MNIST (HDF5
from `lbbsp data import-fashion-mnist`), per-rank batch sizes re-sized every step by lbbsp.torch.LoadBalancer, the
usual mean loss through lb.scale, a validation pass per epoch, and checkpoints that resume mid-epoch, also at
another world size.

    lbbsp data import-fashion-mnist --out data/fmnist.h5
    python3 examples/torch_fmnist.py --data data/fmnist.h5 --spawn 4 --checkpoint /tmp/ck.pt --stop-after 100
    python3 examples/torch_fmnist.py --data data/fmnist.h5 --spawn 3 --checkpoint /tmp/ck.pt   # resumes there
    torchrun --nproc-per-node 4 examples/torch_fmnist.py --data data/fmnist.h5
    mpirun -n 4 python3 examples/torch_fmnist.py --data data/fmnist.h5   # OMPI_COMM_WORLD_* (MASTER_ADDR: rank 0's)
    srun -n 4 python3 examples/torch_fmnist.py --data data/fmnist.h5     # SLURM_PROCID / SLURM_NTASKS

Data: --workers N (default 2) DataLoader worker processes read the samples from the HDF5 file (--read h5, the
default) or from tensors in memory (--read memory; lb.data_loader: the balancer's sampler, its lag set to what the
workers read ahead); --workers 0 --read memory slices the tensors in the loop, no DataLoader.
Stragglers: --slow RANK:SECONDS makes one rank's samples cost SECONDS more each to read. --straggle 1,1,0.5,0.25
--cost-slope S emulates capacities: a rank at capacity c takes max(forward, S x batch / c) seconds, after the
forward pass, after backward or (added) in loading the batch (--cost-at; lbbsp train's
`--straggle static:...;gpu=0:0:S:1000000`).
Baselines: --plain-ddp runs stock DDP (equal split, averaging allreduce); --oracle the best fixed split for the
--straggle capacities. --device cuda trains on the GPUs (local rank r on GPU r mod count).
Rank 0 prints each epoch's test accuracy and, at the end, one JSON summary line (also written to --summary-json).
"""
import argparse
import cProfile
import json
import os
import pstats
import socket
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


def shaped(x, model):
    """Images as the model takes them: 1 x 28 x 28 for the CNN, flat for the MLP."""
    return x.reshape(*x.shape[:-1], 1, 28, 28) if model == "cnn" else x


def load(path, split, model):
    import h5py
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(np.asarray(f[f"{split}/images"], dtype=np.float32) / 255.0)
        y = torch.from_numpy(np.asarray(f[f"{split}/labels"], dtype=np.int64))
    return shaped(x.reshape(len(x), -1), model), y


class Samples(torch.utils.data.Dataset):
    """Map-style: training sample i, read from the HDF5 file on each access (opened once per DataLoader worker) or
    taken from tensors in memory; delay_s: extra seconds per sample read (--slow)."""

    def __init__(self, path, model, tensors=None, delay_s=0.0):
        self.path, self.model, self.tensors, self.delay_s, self.file = path, model, tensors, delay_s, None
        if tensors is not None:
            self.n = len(tensors[1])
        else:
            import h5py
            with h5py.File(path, "r") as f:
                self.n = len(f["train/labels"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.tensors is not None:
            return self.tensors[0][i], self.tensors[1][i]
        import h5py
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        x = torch.from_numpy(self.file["train/images"][i].astype(np.float32) / 255.0).flatten()
        return shaped(x, self.model), int(self.file["train/labels"][i])


def emulate(capacity, slope, n, real_s):
    """Sleeps so that this step's compute takes max(real, slope x n / capacity) seconds."""
    target = slope * n / capacity
    if target > real_s:
        time.sleep(target - real_s)


def validate(model, x, y, rank, world):
    """Accuracy on the test tensors: each rank counts an equal share (not balanced), summed over ranks."""
    counts = torch.zeros(2, dtype=torch.float64, device=x.device)  # on the device: NCCL reduces only there
    model.eval()
    with torch.no_grad():
        xs, ys = x[rank::world], y[rank::world]
        for i in range(0, len(ys), 1024):
            counts[0] += (model(xs[i:i + 1024]).argmax(1) == ys[i:i + 1024]).sum().item()
        counts[1] = len(ys)
    model.train()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def batches(a, lb, fixed, rank, start, steps, train):
    """(x, y) of this rank for the steps start..steps-1: slices of the tensors in memory (--workers 0 --read
    memory), or a DataLoader with --workers worker processes over `train` (a Samples), the balancer's own
    (lb.data_loader, whose lag it sets; it starts at lb.global_step) or, for a fixed split, one over the fixed
    split's index lists."""
    controlled = not (a.plain_ddp or a.oracle)
    if not a.workers and train.tensors is not None:
        xtr, ytr = train.tensors
        for g in range(start, steps):
            epoch, step = divmod(g, lb.steps_per_epoch)
            idx = (lb.indices(epoch, step) if controlled
                   else lbbsp.rank_indices(lb.permutation(epoch), step, fixed, rank))
            if train.delay_s:
                time.sleep(train.delay_s * len(idx))
            idx = torch.from_numpy(idx)
            yield xtr[idx], ytr[idx]
        return
    prefetch = {"prefetch_factor": 1, "persistent_workers": True} if a.workers else {}
    if controlled:
        loader = lb.data_loader(train, num_workers=a.workers, **prefetch)
    else:
        lists = [lbbsp.rank_indices(lb.permutation(g // lb.steps_per_epoch), g % lb.steps_per_epoch, fixed,
                                    rank).tolist() for g in range(start, steps)]
        loader = torch.utils.data.DataLoader(train, batch_sampler=lists, num_workers=a.workers,
                                             collate_fn=AllowEmpty(train), **prefetch)
    done = start
    while done < steps:
        for xy in loader:
            yield xy
            done += 1
            if done == steps:
                return


def resume(a, model, opt, lb, rank, world):
    """The step to start at: 0, or where --checkpoint was saved (model, optimizer and balancer restored)."""
    if not (a.checkpoint and os.path.exists(a.checkpoint)):
        return 0
    state = torch.load(a.checkpoint)
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    lb.load_state_dict(state["lb"])  # at any step; another world size starts the balancer afresh
    step = state["step"]
    if rank == 0:
        print(f"resumed at step {step} (epoch {step // lb.steps_per_epoch}), saved by {state['world_size']} ranks, "
              f"now {world}", flush=True)
    return step


def save(a, model, opt, lb, step, world):
    """Rank 0 saves; the LoadBalancer's state is the same on every rank."""
    state = lb.state_dict()
    if a.checkpoint and dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "lb": state, "step": step,
                    "world_size": world}, a.checkpoint + ".tmp")
        os.replace(a.checkpoint + ".tmp", a.checkpoint)
        print(f"checkpoint at step {step}: {a.checkpoint}", flush=True)


class Run:
    """One rank's training: the model, its balancer (or the fixed split of --plain-ddp and --oracle), the data, and
    what the summary reports."""

    def __init__(self, a, local_rank):
        self.a = a
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dev = (torch.device("cuda", local_rank % torch.cuda.device_count()) if a.device == "cuda"
                    else torch.device("cpu"))
        self.fixed_split = a.plain_ddp or a.oracle
        caps = [float(c) for c in a.straggle.split(",")]
        self.cap = caps[self.rank % len(caps)]
        slow_rank, slow_s = (int(a.slow.split(":")[0]), float(a.slow.split(":")[1])) if a.slow else (-1, 0.0)
        delay = slow_s if self.rank == slow_rank else 0.0
        tensors = None
        if a.read == "memory":
            tensors = load(a.data, "train", a.model)
            if not a.workers:
                tensors = tuple(t.to(self.dev) for t in tensors)
        self.train_data = Samples(a.data, a.model, tensors, delay)
        self.xte, self.yte = (t[:a.test_subset or None].to(self.dev) for t in load(a.data, "test", a.model))
        torch.manual_seed(a.seed)
        self.model = DDP(make_model(a.model).to(self.dev), device_ids=[self.dev.index] if self.dev.type == "cuda"
                         else None)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=a.lr, momentum=0.9)
        self.balancer = "bsp" if a.plain_ddp else "oracle" if a.oracle else a.balancer
        # Plain DDP keeps its averaging hook (model=None: LoadBalancer registers nothing) and the equal split.
        self.lb = LoadBalancer(None if a.plain_ddp else self.model, dataset_size=len(self.train_data),
                               global_batch=a.global_batch, balancer="bsp" if a.oracle else self.balancer,
                               predictor=a.predictor, seed=a.seed)  # lag: set by data_loader() to what it reads ahead
        # Fixed split: equal for plain DDP, the exact assignment for the known capacities for --oracle.
        self.fixed = (lbbsp.assign_by_speed([caps[r % len(caps)] for r in range(self.world)], a.global_batch)
                      if a.oracle else self.lb.batch_sizes)
        self.steps = min(a.max_iterations or 1 << 62, self.lb.steps_per_epoch * a.epochs)
        self.train_s, self.control_s, self.time_to_target, self.acc = 0.0, 0.0, None, float("nan")
        self.sizes = []  # every step's batch vector

    def validates(self, g):
        """Whether step g ends with a validation: every --eval-every steps and at each epoch's end."""
        done = g + 1
        return done % self.lb.steps_per_epoch == 0 or bool(self.a.eval_every and done % self.a.eval_every == 0)

    def step(self, xb, yb, sync):
        """One training step, timed (train_s); the emulated cost where --cost-at puts it: reading the batch
        (added), or after the forward pass or after backward (max with the forward's own time); lbbsp.torch
        measures the whole step either way. sync: the device's queued steps count here (before a validation and
        at the end)."""
        a, lb = self.a, self.lb
        t0 = time.perf_counter()
        self.sizes.append((self.fixed if self.fixed_split else lb.batch_sizes).tolist())
        xb, yb = xb.to(self.dev, non_blocking=True), yb.to(self.dev, non_blocking=True)  # from a DataLoader: host
        if a.cost_at == "load":
            emulate(self.cap, a.cost_slope, len(yb), 0.0)
        t_compute = time.perf_counter()
        out = self.model(xb)
        if a.plain_ddp:
            loss = F.cross_entropy(out, yb)  # mean over an equal slice; DDP averages: global mean
        else:
            loss = lb.scale(F.cross_entropy(out, yb), count=len(yb))  # this rank's share of the mean
        forward_s = time.perf_counter() - t_compute
        if a.cost_at == "forward":
            emulate(self.cap, a.cost_slope, len(yb), forward_s)
        loss.backward()
        if a.cost_at == "after-backward":
            emulate(self.cap, a.cost_slope, len(yb), forward_s)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t_control = time.perf_counter()
        if not self.fixed_split:
            lb.step()
        self.control_s += time.perf_counter() - t_control
        if sync and self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        self.train_s += time.perf_counter() - t0

    def after_step(self, g):
        """Validation every --eval-every steps and at each epoch's end (untimed: not part of any step's time), the
        checkpoint at each epoch's end."""
        a, lb, done = self.a, self.lb, g + 1
        if not self.validates(g):
            return
        end_of_epoch = done % lb.steps_per_epoch == 0
        with lb.untimed():
            self.acc = validate(self.model.module, self.xte, self.yte, self.rank, self.world)
            if a.target_accuracy and self.time_to_target is None and self.acc >= a.target_accuracy:
                self.time_to_target = self.train_s
            if end_of_epoch:
                save(a, self.model, self.opt, lb, done, self.world)
        if end_of_epoch and self.rank == 0:
            sizes = (self.fixed if self.fixed_split else lb.batch_sizes).tolist()
            print(f"epoch {done // lb.steps_per_epoch - 1}: test accuracy {self.acc:.4f}, batch sizes {sizes}",
                  flush=True)

    def summary(self, steps_run):
        a, lb, train_s = self.a, self.lb, max(self.train_s, 1e-12)
        runner = "plain-ddp" if a.plain_ddp else "ddp+oracle" if a.oracle else "ddp+lbbsp"
        final = self.fixed if self.fixed_split else lb.batch_sizes
        return {"runner": runner, "balancer": self.balancer, "ranks": self.world, "model": a.model,
                "global_batch": a.global_batch, "iterations": steps_run, "train_time_s": self.train_s,
                "mean_iteration_s": self.train_s / max(steps_run, 1), "controller_fraction": self.control_s / train_s,
                "decide_fraction": lb.timing["decide_s"] / train_s,
                "report_wait_fraction": lb.timing["wait_s"] / train_s, "test_accuracy": self.acc,
                "target_accuracy": a.target_accuracy, "time_to_target_s": self.time_to_target,
                "cost_at": a.cost_at, "workers": a.workers, "read": a.read, "device": a.device,
                "final_batch_sizes": final.tolist(), "batch_sizes": self.sizes, "torch": torch.__version__,
                "lbbsp": lbbsp.__version__}


def train(a, local_rank):
    torch.set_num_threads(a.threads)
    run = Run(a, local_rank)
    start = resume(a, run.model, run.opt, run.lb, run.rank, run.world)
    last = min(run.steps, a.stop_after) if a.stop_after > start else run.steps
    data = batches(a, run.lb, run.fixed, run.rank, start, last, run.train_data)
    first = next(data, None)  # DataLoader workers start here, outside the timed steps
    dist.barrier()
    profile = cProfile.Profile() if a.profile and run.rank == 0 else None
    if profile is not None:  # the host's time in the loop, function by function (where a host-bound step goes)
        profile.enable()
    for g in range(start, last):
        run.step(*(first if g == start else next(data)), sync=g == last - 1 or run.validates(g))
        run.after_step(g)
    if profile is not None:
        profile.disable()
        with open(a.profile, "w") as f:
            pstats.Stats(profile, stream=f).sort_stats("tottime").print_stats(40)
    if last < run.steps and last % run.lb.steps_per_epoch:  # --stop-after mid-epoch: saved there
        with run.lb.untimed():
            save(a, run.model, run.opt, run.lb, last, run.world)
    if run.rank == 0:
        s = run.summary(last - start)
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


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="Fashion-MNIST HDF5 (lbbsp data import-fashion-mnist)")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-iterations", type=int, default=0, help="stop after this many steps (0: --epochs)")
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
    ap.add_argument("--slow", default="", help="RANK:SECONDS extra read time per sample on one rank")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    ap.add_argument("--read", default="h5", choices=["h5", "memory"],
                    help="samples read one by one from the HDF5 file, or from tensors in memory (with --workers 0: "
                         "sliced in the loop, no DataLoader)")
    ap.add_argument("--eval-every", type=int, default=0, help="validate every N steps too (always: each epoch's end)")
    ap.add_argument("--test-subset", type=int, default=0, help="validate on the first N test images (0: all)")
    ap.add_argument("--target-accuracy", type=float, default=None)
    ap.add_argument("--summary-json", default=None)
    ap.add_argument("--checkpoint", default=None, help="file to save every epoch and resume from if present")
    ap.add_argument("--stop-after", type=int, default=0, help="save and stop after this global step")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="rank 0 profiles its training loop (cProfile) and writes the 40 costliest functions here")
    ap.add_argument("--spawn", type=int, default=0, help="start N local processes instead of using a launcher")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: local rank r on GPU r %% count; with --spawn, NCCL where each rank has its own GPU "
                         "(else gloo), under a launcher NCCL")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch sees no CUDA device")
    if not os.path.exists(a.data):
        ap.error(f"--data {a.data} does not exist (make it with: lbbsp data import-fashion-mnist --out {a.data})")
    if a.slow and (a.slow.count(":") != 1 or not a.slow.split(":")[0].isdigit()):
        ap.error(f"--slow must be RANK:SECONDS, got {a.slow!r}")
    return a


def main():
    a = parse_args()
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
