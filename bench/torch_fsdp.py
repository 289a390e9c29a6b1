#!/usr/bin/env python3
"""lbbsp.torch over FSDP2 (fully_shard per block and at the root) against plain FSDP2, side by side in one run.

A GPT-like model (token embedding, --blocks transformer blocks of width --width, a language-model head) on
synthetic tokens (--seq tokens a sample), global batch --batch, SGD, gloo, one torch thread a rank.

    capacities  4 ranks; rank r's forward stretched to 1/c_r of its speed (a sleep of (1/c_r - 1) x its own
                measured compute, per sample) with --capacities (default 1,1,0.5,0.25)
    cotenant    2 ranks pinned to cores 0 and 1, a process spinning on core 1 for the whole run (rank 1 gets about
                half its core): real interference

Runners, each a fresh set of ranks, in rotating order over --repeats rounds:

    plain    FSDP2 as a user runs it: an equal split, FSDP's own averaging reduce-scatter
    lbbsp    FSDP2 + lbbsp.torch.LoadBalancer (--balancer, --predictor)
    oracle   (capacities) the split proportional to the capacities, fixed, gradients summed: the best a balancer
             can do; (cotenant) the equal split with each rank's own time measured by the LoadBalancer (bsp): the
             ideal step is X / sum of the ranks' measured speeds

Prints a Markdown table: mean step after warm-up (min-max over rounds), speed-up over plain, the fraction of the
oracle's (or ideal) speed-up, the slowest rank's mean share, and lbbsp's time in step() per step (its control
plane's cost on the host, as a fraction of the step).

    python3 bench/torch_fsdp.py --scenario capacities --repeats 3
"""

import argparse
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import lbbsp
from lbbsp.torch import LoadBalancer

RUNNERS = ["plain", "lbbsp", "oracle"]


class GPT(nn.Module):
    """Token embedding, pre-norm transformer blocks (causal attention), a tied-free language-model head."""

    def __init__(self, vocab: int, width: int, blocks: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:tokens.shape[1]]
        for block in self.blocks:
            h = block(h, src_mask=self.mask, is_causal=True)
        return self.head(h)


class Stretched(nn.Module):
    """The model, a rank of capacity c: after the real forward, a sleep of (1/c - 1) x the seconds a sample's
    forward and backward take on one core (measured once, before the run: timing this rank's own forward would
    take in its waits for the others in FSDP's all-gathers)."""

    def __init__(self, net: nn.Module, capacity: float, sample_s: float) -> None:
        super().__init__()
        self.net, self.extra_s = net, (1.0 / capacity - 1.0) * sample_s

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.net(tokens)
        if self.extra_s > 0:
            time.sleep(len(tokens) * self.extra_s)
        return out


def sample_seconds(args: argparse.Namespace) -> float:
    """Seconds one sample's forward and backward take here on one thread (the median of 5 batches of 16)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net, data = GPT(args.vocab, args.width, args.blocks, args.seq), tokens(args)[:16]
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        F.cross_entropy(net(data[:, :-1]).reshape(-1, args.vocab), data[:, 1:].reshape(-1)).backward()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:])) / 16


def shard(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard
    for block in model.net.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def tokens(args: argparse.Namespace) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, args.vocab, (args.samples, args.seq + 1), generator=g)


def worker(rank: int, world: int, port: int, args: argparse.Namespace, runner: str, capacities, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.scenario == "cotenant":
        os.sched_setaffinity(0, {rank})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    data = tokens(args)
    net = GPT(args.vocab, args.width, args.blocks, args.seq)
    model = shard(Stretched(net, capacities[rank] if args.scenario == "capacities" else 1.0, args.sample_s))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lb, fixed = None, None
    if runner == "lbbsp" or (runner == "oracle" and args.scenario == "cotenant"):
        lb = LoadBalancer(model, dataset_size=len(data), global_batch=args.batch, seed=1,
                          balancer=args.balancer if runner == "lbbsp" else "bsp", predictor=args.predictor,
                          lag=args.lag)
    else:
        speeds = capacities if runner == "oracle" else [1.0] * world
        fixed = lbbsp.assign_by_speed(np.array(speeds, dtype=np.float64), args.batch)
        if runner == "oracle":
            for m in model.modules():
                if hasattr(m, "set_gradient_divide_factor"):
                    m.set_gradient_divide_factor(1.0)
                    m.set_force_sum_reduction_for_comms(True)
    per_epoch = len(data) // args.batch
    steps, shares, measured = [], [], []
    dist.barrier()
    for g in range(args.steps):
        t0 = time.perf_counter()
        epoch, step = divmod(g, per_epoch)
        sizes = lb.batch_sizes if lb is not None else fixed
        idx = lbbsp.rank_indices(lbbsp.epoch_permutation(len(data), 1, epoch), step, sizes, rank)
        batch = data[torch.from_numpy(idx)]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1), reduction="sum")
        if lb is not None:
            loss = lb.scale(loss, reduction="sum") / args.seq
        elif runner == "oracle":
            loss = loss / (args.batch * args.seq)
        else:
            loss = loss / max(1, len(idx) * args.seq)  # the mean over this rank's tokens, averaged by FSDP
        loss.backward()
        opt.step()
        opt.zero_grad()
        if lb is not None:
            lb.step()
            measured.append(lb.figures()["lbbsp/measured_s"])
        steps.append(time.perf_counter() - t0)  # the collectives keep the ranks in step: rank 0's times are the run's
        shares.append(int(sizes[rank]))
    record = {"steps": steps, "shares": shares, "measured": measured,
              "step_s": lb.timing["step_s"] if lb is not None else 0.0,
              "wait_s": lb.timing["wait_s"] if lb is not None else 0.0}
    with open(os.path.join(out, f"{runner}-{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spin(stop_at: float) -> None:
    os.sched_setaffinity(0, {1})
    while time.time() < stop_at:
        pass


def run(args: argparse.Namespace, runner: str, capacities, out: str) -> list:
    world = len(capacities)
    cotenant = None
    if args.scenario == "cotenant":
        cotenant = mp.get_context("spawn").Process(target=spin, args=(time.time() + 3600,), daemon=True)
        cotenant.start()
    try:
        mp.start_processes(worker, args=(world, free_port(), args, runner, capacities, out), nprocs=world,
                           start_method="spawn")
    finally:
        if cotenant is not None:
            cotenant.kill()
    ranks = []
    for r in range(world):
        with open(os.path.join(out, f"{runner}-{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def summary(ranks: list, warmup: int, batch: int) -> dict:
    step = float(np.mean(ranks[0]["steps"][warmup:]))
    slowest = int(np.argmin([np.mean(r["shares"][warmup:]) for r in ranks]))
    out = {"step": step, "slowest_share": float(np.mean(ranks[slowest]["shares"][warmup:])),
           "step_s": (ranks[0]["step_s"] - ranks[0]["wait_s"]) / len(ranks[0]["steps"]),
           "wait_s": ranks[0]["wait_s"] / len(ranks[0]["steps"])}
    if ranks[0]["measured"]:  # the ideal from each rank's own time (equal split, bsp): X / sum of speeds
        t = np.array([r["measured"][warmup:] for r in ranks])
        n = np.array([r["shares"][warmup:] for r in ranks])
        out["ideal_compute"] = float(np.mean(batch / (n / np.maximum(t, 1e-9)).sum(axis=0)))
        out["bsp_compute"] = float(np.mean(t.max(axis=0)))
    return out


def table(args: argparse.Namespace, results: dict) -> str:
    plain = np.mean([r["step"] for r in results["plain"]])
    if args.scenario == "capacities":
        best = plain / np.mean([r["step"] for r in results["oracle"]])
        what = "oracle"
    else:
        best = np.mean([r["bsp_compute"] / r["ideal_compute"] for r in results["oracle"]])
        what = "ideal"
    rows = [f"| runner | mean step (ms) | vs plain | of the {what} speed-up | slowest rank's share | "
            f"lbbsp step() per step, less its wait (the wait) |", "|---|---:|---:|---:|---:|---:|"]
    for name in RUNNERS:
        steps = [r["step"] * 1e3 for r in results[name]]
        speedup = plain * 1e3 / np.mean(steps)
        cost = np.mean([r["step_s"] for r in results[name]]) * 1e6
        wait = np.mean([r["wait_s"] for r in results[name]]) * 1e6
        rows.append(f"| {name} | {np.mean(steps):.1f} ({min(steps):.1f}-{max(steps):.1f}) | {speedup:.2f}x | "
                    f"{(speedup - 1) / (best - 1) if best > 1 else math.nan:.2f} | "
                    f"{np.mean([r['slowest_share'] for r in results[name]]):.1f} | "
                    f"{cost:.0f} us ({cost / (np.mean(steps) * 1e3) * 100:.2f}%) ({wait:.0f} us) |")
    rows.append(f"\n{what} speed-up over plain: {best:.2f}x")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=["capacities", "cotenant"], default="capacities")
    p.add_argument("--capacities", default="1,1,0.5,0.25")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--balancer", default="lbbsp-cpu")
    p.add_argument("--predictor", default="narx")
    p.add_argument("--lag", type=int, default=0, help="lbbsp's lag (>= 1: step() decides from earlier reports)")
    p.add_argument("--out", default="results/fsdp")
    args = p.parse_args()
    capacities = [float(c) for c in args.capacities.split(",")] if args.scenario == "capacities" else [1.0, 1.0]
    os.makedirs(args.out, exist_ok=True)
    args.sample_s = sample_seconds(args)
    print(f"a sample's forward and backward: {args.sample_s * 1e3:.2f} ms", file=sys.stderr)
    results = {name: [] for name in RUNNERS}
    for round_ in range(args.repeats):
        for name in RUNNERS[round_ % 3:] + RUNNERS[:round_ % 3]:
            results[name].append(summary(run(args, name, capacities, args.out), args.warmup, args.batch))
            print(f"round {round_} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    print(f"torch {torch.__version__}, {args.scenario} {capacities}, {args.blocks} blocks of width {args.width}, "
          f"seq {args.seq}, batch {args.batch}, {args.repeats} rounds")
    print(table(args, results))


if __name__ == "__main__":
    main()
