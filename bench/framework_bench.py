#!/usr/bin/env python3
"""Benchmark (not a test): Lightning and Accelerate, each with its plain DDP and with lbbsp, on 4 gloo ranks.

The MLP (784-256-128-10) on Fashion-MNIST, global batch 512, lr 0.2, momentum 0.9, capacities 1, 1, 0.5, 0.25
with the modelled cost of the other benchmarks (a rank at capacity c takes max(forward, SLOPE x batch / c) in its
forward, docs/results/torch.md). Prints, per run, the mean step time and the time to the target test accuracy
(rank 0's training time, its evaluations every 25 steps left out), and the table of lbbsp against plain DDP.

    bench/framework_bench.py --python PY --data data/fmnist.h5 [--steps 300] [--out results/framework-bench]
    bench/framework_bench.py ... --only lightning:plain    # one run (lightning|accelerate : plain|lbbsp)
--dry-run: 2 ranks, 12 steps on synthetic data (checks that everything runs, measures nothing).
"""
import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F

CAPS, SLOPE, X, LR = [1.0, 1.0, 0.5, 0.25], 0.0003, 512, 0.2
RUNS = ["lightning:plain", "lightning:lbbsp", "accelerate:plain", "accelerate:lbbsp"]


def load(path, split):
    import h5py
    with h5py.File(path, "r") as f:
        x = torch.from_numpy(np.asarray(f[f"{split}/images"], dtype=np.float32).reshape(-1, 784) / 255.0)
        y = torch.from_numpy(np.asarray(f[f"{split}/labels"], dtype=np.int64))
    return x, y


def mlp():
    torch.manual_seed(1)
    n = torch.nn
    return n.Sequential(n.Linear(784, 256), n.ReLU(), n.Linear(256, 128), n.ReLU(), n.Linear(128, 10))


def emulate(capacity, n, real_s):
    """Sleeps so that this step's forward takes max(real, SLOPE x n / capacity) seconds."""
    target = SLOPE * n / capacity
    if target > real_s:
        time.sleep(target - real_s)


class Clock:
    """Rank 0's training time (evaluations left out) and the time it first reached the target accuracy."""

    def __init__(self, a, test):
        self.a, self.test, self.train_s, self.to_target, self.acc, self.steps = a, test, 0.0, None, float("nan"), 0
        self.t0 = None

    def start(self):
        self.t0 = time.perf_counter()

    def stop(self, model, untimed):
        self.train_s += time.perf_counter() - self.t0
        self.steps += 1
        if self.steps % 25 == 0 or self.steps == self.a.steps:
            with untimed():
                with torch.no_grad():
                    x, y = self.test
                    self.acc = (model(x).argmax(1) == y).double().mean().item()
            if self.to_target is None and self.acc >= self.a.target:
                self.to_target = self.train_s

    def summary(self, framework, mode, sizes):
        return {"framework": framework, "mode": mode, "steps": self.steps, "mean_step_s": self.train_s / self.steps,
                "train_s": self.train_s, "time_to_target_s": self.to_target, "test_accuracy": self.acc,
                "target_accuracy": self.a.target, "final_batch_sizes": sizes}


class LightningMLP(pl.LightningModule):
    """The MLP with the modelled cost in its forward; rank 0 keeps the Clock."""

    def __init__(self, a):
        super().__init__()
        self.a, self.net = a, mlp()

    def _lb(self):
        return getattr(self.trainer.strategy, "load_balancer", None)

    def on_train_batch_start(self, batch, batch_idx):
        if self.global_rank == 0:
            self.clock.start()

    def training_step(self, batch, batch_idx):
        x, y = batch
        t = time.perf_counter()
        loss = F.cross_entropy(self.net(x), y)
        emulate(CAPS[self.global_rank % len(CAPS)], len(y), time.perf_counter() - t)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_rank == 0:
            lb = self._lb()
            self.clock.stop(self.net, lb.untimed if lb is not None else contextlib.nullcontext)

    def on_train_end(self):
        if self.global_rank == 0:
            lb, world = self._lb(), self.trainer.world_size
            sizes = lb.batch_sizes.tolist() if lb is not None else [X // world] * world
            mode = "plain" if lb is None else "lbbsp"
            print(json.dumps(self.clock.summary("lightning", mode, sizes)), flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)

    def train_dataloader(self):
        self.clock = Clock(self.a, load(self.a.data, "test"))
        ds = torch.utils.data.TensorDataset(*load(self.a.data, "train"))
        return torch.utils.data.DataLoader(ds, batch_size=X // self.a.ranks, shuffle=True, drop_last=True)


def run_lightning(a, mode):
    from lightning.pytorch.strategies import DDPStrategy

    from lbbsp.lightning import LoadBalancedDDP
    strategy = DDPStrategy(start_method="spawn") if mode == "plain" else \
        LoadBalancedDDP(balancer="lbbsp-cpu", predictor="narx", start_method="spawn")
    torch.set_num_threads(1)
    pl.Trainer(accelerator="cpu", devices=a.ranks, strategy=strategy, max_steps=a.steps, logger=False,
               enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
               limit_val_batches=0).fit(LightningMLP(a))


def run_accelerate(a, mode):
    import accelerate

    import lbbsp.accelerate

    torch.set_num_threads(1)
    acc = accelerate.Accelerator(cpu=True)
    rank, world = acc.process_index, acc.num_processes
    net = mlp()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*load(a.data, "train")),
                                         batch_size=X // world, shuffle=True, drop_last=True)
    if mode == "plain":
        model, opt, loader = acc.prepare(net, opt, loader)
        lb, untimed = None, contextlib.nullcontext
    else:
        model, opt, loader, lb = lbbsp.accelerate.prepare(acc, net, opt, loader, balancer="lbbsp-cpu")
        untimed = lb.untimed
    clock = Clock(a, load(a.data, "test"))
    while clock.steps < a.steps:
        for x, y in loader:
            clock.start()
            t = time.perf_counter()
            loss = F.cross_entropy(model(x), y)
            emulate(CAPS[rank % len(CAPS)], len(y), time.perf_counter() - t)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if rank == 0:
                clock.stop(net, untimed)
            else:
                clock.steps += 1
            if clock.steps == a.steps:
                break
    if rank == 0:
        sizes = lb.batch_sizes.tolist() if lb is not None else [X // world] * world
        print(json.dumps(clock.summary("accelerate", mode, sizes)), flush=True)
    acc.wait_for_everyone()


def one(a):
    framework, mode = a.only.split(":")
    if framework == "lightning":
        run_lightning(a, mode)
    elif "LOCAL_RANK" in os.environ:  # one rank under torchrun
        run_accelerate(a, mode)
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(a.ranks), "--master_port",
               str(port), __file__, *sys.argv[1:]]
        sys.exit(subprocess.call(cmd))


def table(rows):
    out = ["| framework | run | mean step | vs plain DDP | time to %.2f | final sizes |" % rows[0]["target_accuracy"],
           "|---|---|---:|---:|---:|---|"]
    for r in rows:
        base = next(b for b in rows if b["framework"] == r["framework"] and b["mode"] == "plain")
        t = "%.1f s" % r["time_to_target_s"] if r["time_to_target_s"] is not None else "not reached"
        out.append("| %s | %s | %.1f ms | %.2fx | %s | %s |" % (
            r["framework"], "plain DDP" if r["mode"] == "plain" else "DDP + lbbsp", 1e3 * r["mean_step_s"],
            base["mean_step_s"] / r["mean_step_s"], t, r["final_batch_sizes"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch, lightning, accelerate")
    ap.add_argument("--lbbsp", default="build/lbbsp")
    ap.add_argument("--data", default="data/fmnist.h5")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", default="results/framework-bench")
    ap.add_argument("--only", choices=RUNS)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    if a.only:
        return one(a)
    os.makedirs(a.out, exist_ok=True)
    extra = []
    if a.dry_run:
        a.data = os.path.join(a.out, "dry.h5")
        subprocess.run([a.lbbsp, "data", "synth", "--samples", "2000", "--features", "784", "--classes", "10",
                        "--seed", "1", "--out", a.data], check=True, stdout=subprocess.DEVNULL)
        extra = ["--steps", "12", "--ranks", "2"]
    rows = []
    for run in RUNS:
        print(f"== {run}", flush=True)
        cmd = [a.python, __file__, "--data", a.data, "--steps", str(a.steps), "--target", str(a.target), "--ranks",
               str(a.ranks), *extra, "--only", run]
        p = subprocess.run(cmd, capture_output=True, text=True)
        found = [line for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not found:
            sys.exit(f"framework_bench.py: {run} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
        rows.append(json.loads(found[-1]))
        print(found[-1], flush=True)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
