#!/usr/bin/env python3
"""Benchmark (not a test): what lbbsp.torch costs a step against plain DDP, on 2 gloo ranks pinned one per core.

    python3 bench/torch_step_cost.py [--rounds 3] [--steps 300] [--profile] [--lag L] [--runners plain,lbbsp,...]

The co-tenant benchmark's CNN (bench/torch_cotenant.py), global batch 128, no co-tenant. In each round the same two
processes hold five DDP models and take their steps in turn (a step of each, then again), so that the machine's
drift, which moves a whole run's mean step by 2-4% between runs here, falls on all alike: plain DDP (its own
C++ hook, the equal split), DDP + lbbsp with `--balancer bsp` (the equal split kept: the control plane alone),
DDP + lbbsp with lbbsp-cpu (the defaults: deciding each step, the loss as plain DDP's, weighted in the C++
hook), the same with the loss through lb.scale (lbbsp-scale, as loops written for it do) and on the Python step path
(lbbsp-python), in an order rotated each step (the first to run after
another model's step may meet colder caches, so none always goes first). The other models' steps run in
lb.untimed(), outside each LoadBalancer's windows. Per runner: the mean step (wall, from its data to the end of
lb.step()) and CPU a step (process time of the rank, gloo's threads included), steps after the first 50, and the
difference to plain DDP's; medians over rounds. --profile: rank 0's CPU (this thread's) in each lbbsp.torch function
of the per-step path (lbbsp-cpu alone), in us a step, from wrappers around them (a few us each): where the cost is.
--lag L: the LoadBalancers decide L steps ahead (what a DataLoader with workers needs).
"""
import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cotenant as tc  # the model and data of the co-tenant benchmark

import lbbsp
import lbbsp.torch.controller as controller
import lbbsp.torch.ddp as ddp_hook
import lbbsp.torch.native as native
from lbbsp.torch import LoadBalancer

# name: (balancer, lbbsp.torch's per-step path: "auto" its C++ one where it builds, "0" the Python one, whether the
# loop calls lb.scale(loss) or leaves the mean loss to the hook), the LoadBalancer's defaults otherwise
RUNNERS = {"plain": None, "lbbsp-bsp": ("bsp", "auto", False), "lbbsp": ("lbbsp-cpu", "auto", False),
           "lbbsp-scale": ("lbbsp-cpu", "auto", True), "lbbsp-python": ("lbbsp-cpu", "0", False)}
WARMUP = 50


def profile(lb, spent):
    """Wraps the per-step path's functions so that each adds this thread's CPU seconds to spent[name]."""
    def wrap(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a, **k):
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.thread_time() - t
        setattr(owner, name, timed)
    wrap(ddp_hook, "_sum_and_report", "comm hook (all of it)")
    for name in ("report", "step", "scale", "indices"):
        wrap(lb, name, f"lb.{name}")
    wrap(lb.exchange, "piggyback", "  report block")
    wrap(lb.exchange, "take", "  reports taken")
    wrap(lb._decisions, "_apply", "  decision")
    wrap(native, "decide_step", "  usual course (one C++ call)")
    wrap(controller, "read_metrics", "  monitor")
    wrap(ddp_hook, "allreduce_sum_coalesced", "  allreduce launch")


class Runner:
    """One DDP model, plain or with a LoadBalancer, and its steps' wall and CPU seconds."""

    def __init__(self, name, world, x, y, do_profile, lag):
        self.name, self.x, self.y, self.world = name, x, y, world
        self.model = DDP(tc.make_model())
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.lb, self.spent = None, collections.defaultdict(float)
        if RUNNERS[name]:
            balancer, path, self.scaled = RUNNERS[name]
            os.environ["LBBSP_TORCH_NATIVE"] = path  # read when the LoadBalancer is built
            self.lb = LoadBalancer(self.model, dataset_size=len(x), global_batch=tc.X, balancer=balancer, lag=lag)
            if do_profile:
                profile(self.lb, self.spent)
        self.equal = np.full(world, tc.X // world, dtype=np.int64)
        self.wall, self.cpu, self.perm = [], [], (-1, None)

    def step(self, k):
        epoch, step = divmod(k, tc.STEPS_PER_EPOCH)
        t, c = time.perf_counter(), time.process_time()
        if self.lb is not None:
            idx = self.lb.indices(epoch, step)
        else:  # the same cut of the same order, the epoch's permutation made once as the LoadBalancer does
            if self.perm[0] != epoch:
                self.perm = (epoch, lbbsp.epoch_permutation(len(self.x), 1, epoch))
            idx = lbbsp._lbbsp.rank_indices(self.perm[1], step, self.equal, dist.get_rank())  # as lb.indices
        idx = torch.from_numpy(idx)
        loss = F.cross_entropy(self.model(self.x[idx]), self.y[idx])
        if self.lb is not None and self.scaled:
            loss = self.lb.scale(loss)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        if self.lb is not None:
            self.lb.step()
        self.wall.append(time.perf_counter() - t)
        self.cpu.append(time.process_time() - c)


def rank_main(rank, world, port, names, steps, do_profile, lag, out):
    os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x, y = tc.data()
    runners = [Runner(n, world, x, y, do_profile, lag) for n in names]
    for k in range(steps):
        if k == WARMUP:
            for r in runners:
                r.spent.clear()
        for r in runners[k % len(runners):] + runners[:k % len(runners)]:  # rotated: none always runs first
            with contextlib.ExitStack() as others_untimed:
                for other in runners:
                    if other is not r and other.lb is not None:
                        others_untimed.enter_context(other.lb.untimed())
                r.step(k)
    mine = torch.tensor([[np.mean(r.wall[WARMUP:]), np.mean(r.cpu[WARMUP:])] for r in runners],
                        dtype=torch.float64)
    both = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(both, mine)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({r.name: {"step_s": max(float(b[i, 0]) for b in both),
                                "cpu_s": float(np.mean([float(b[i, 1]) for b in both])),
                                "profile_us": {k: 1e6 * v / (steps - WARMUP) for k, v in r.spent.items()}}
                       for i, r in enumerate(runners)}, f)
    dist.destroy_process_group()


def run(names, steps, do_profile, lag):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        mp.spawn(rank_main, args=(2, tc.free_port(), names, steps, do_profile, lag, out), nprocs=2)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--profile", action="store_true",
                    help="rank 0's CPU in lbbsp.torch's functions (the first LoadBalancer runner of --runners)")
    ap.add_argument("--lag", type=int, default=0, help="the LoadBalancers' lag (steps decided ahead)")
    ap.add_argument("--runners", default=",".join(RUNNERS), help=f"of {', '.join(RUNNERS)} (plain always runs)")
    a = ap.parse_args()
    names = ["plain"] + [n for n in a.runners.split(",") if n != "plain"]
    if a.steps <= WARMUP:
        sys.exit(f"torch_step_cost.py: --steps must exceed the {WARMUP} warm-up steps, got {a.steps}")
    if any(n not in RUNNERS for n in names):
        sys.exit(f"torch_step_cost.py: --runners takes names of {', '.join(RUNNERS)}, got {a.runners!r}")
    if a.profile:
        name = next((n for n in names if n != "plain"), "lbbsp")
        got = run([name], a.steps, True, a.lag)[name]
        print(f"rank 0's CPU in lbbsp.torch a step (thread time, us), {name}, {a.steps - WARMUP} steps:")
        for label, us in sorted(got["profile_us"].items(), key=lambda kv: -kv[1]):
            print(f"  {label:28s} {us:7.1f}")
        return
    rounds = []
    for r in range(a.rounds):
        rounds.append(run(names, a.steps, False, a.lag))
        print(f"round {r + 1}: " + ", ".join(f"{n} {1e3 * rounds[-1][n]['step_s']:.2f} ms" for n in names),
              flush=True)
    print(f"\n{a.rounds} rounds of {a.steps} steps of each runner, in turn (the first {WARMUP} left out), 2 ranks "
          f"pinned, global batch {tc.X}; medians over rounds (over plain: the median of the rounds' differences)")
    print_over_plain(rounds, names)


def print_over_plain(rounds, names):
    """The Markdown table of each runner's step and CPU a step against "plain"'s, from rounds of
    {name: {"step_s": wall, "cpu_s": CPU}} (medians over rounds, the differences' range)."""
    print("| runner | step, ms | over plain, us (rounds' range) | CPU a step per rank, ms | over plain, us |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        step, cpu = (np.array([g[n][key] for g in rounds]) for key in ("step_s", "cpu_s"))
        ds, dc = (1e6 * (v - [g["plain"][key] for g in rounds]) for v, key in ((step, "step_s"), (cpu, "cpu_s")))
        print(f"| {n} | {1e3 * np.median(step):.2f} | {np.median(ds):+.0f} ({ds.min():+.0f} to {ds.max():+.0f}) | "
              f"{1e3 * np.median(cpu):.2f} | {np.median(dc):+.0f} ({dc.min():+.0f} to {dc.max():+.0f}) |")


if __name__ == "__main__":
    main()
