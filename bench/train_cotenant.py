#!/usr/bin/env python3
"""`lbbsp train` against a real co-tenant: `--balancer bsp` and `lbbsp-cpu` side by side in one run.

Two MPI ranks bound to cores 0 and 1 (`mpirun --bind-to core --map-by core`), the CNN on a synthetic 28x28 set
(`lbbsp data synth`), global batch --batch. A co-tenant process pinned to core 1 (bench/cotenants.py: steady,
onoff, trace, membw, none) takes rank 1's CPU. Runners (--runners), each a fresh run under the same co-tenant, in
rotating order over --repeats rounds:

    bsp        the equal split (plain BSP)
    lbbsp      --balancer lbbsp-cpu --predictor narx
    omnilearn  OmniLearn's controller (TPDS 2025) as its paper gives it: every 20 iterations each worker moves its
               batch by -(b/t)(t - mean t), 5% dead band
    naive      what a user would write: sizes proportional to the measured speeds, smoothed (EMA 0.5), every
               iteration
The peers (omnilearn, naive) are benchmark code, not the product: bench/train_peers.cpp registers them as balancer
kinds of `build/bench/lbbsp_peers` (the `lbbsp` command with them; --peers), the same two as
bench/torch_cotenant.py's.

The ideal comes from the bsp runs' telemetry: each iteration's per-rank compute time at its batch gives each rank's
speed under its co-tenant; the ideal iteration computes X / (sum of the speeds) where bsp computes the slowest rank's
time and keeps bsp's other costs (the allreduce, which a co-tenant on a rank's core lengthens), so ideal speed-up =
mean bsp iteration / (that - mean(max_r compute_r) + mean(X / sum_r speed_r)), as bench/torch_cotenant.py's. It
knows each iteration's noise beforehand; the ideal by phase, as issue #51 words it ("from each rank's measured speed
alone and under its co-tenant"), splits each iteration by the mean speeds of the co-tenant's phase it falls in (on
or off; the trace sample being burnt; one phase for the others) and knows only when the phases begin.

Prints a Markdown table (mean iteration after warm-up, min-max over rounds; speed-up over bsp; fraction of the ideal
speed-up; how far the slower rank computed above the oracle split of the run's own speeds, in ms: how well the runner
tracks, apart from what the co-tenant and the machine did in its runs; how far the whole iteration was above that
oracle: the tracking plus the allreduce and the control plane, the controllers compared on equal machines; rank 1's
mean share), and what the best causal split of bsp's speeds reaches (bench/oracle_split.py, as torch_cotenant.py:
each iteration split by the last one's speeds or an EMA of them). --tabulate prints the table again from the runs
kept under --out. Under onoff only the iterations of whole on/off cycles after warm-up count, under trace those in
--trace-window (the same stretch of the series for every runner), lined up with the co-tenant by the telemetry's
time_s, as bench/torch_cotenant.py does: --iterations must cover them.

    python3 bench/train_cotenant.py --scenario steady --repeats 3 --out results/train-cotenant
"""

import argparse
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import cotenants  # bench/cotenants.py
import numpy as np
import oracle_split  # bench/oracle_split.py

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = {"bsp": ["--balancer", "bsp"], "lbbsp": ["--balancer", "lbbsp-cpu", "--predictor", "narx"],
           "omnilearn": ["--balancer", "omnilearn"], "naive": ["--balancer", "naive"]}
PEERS = ("omnilearn", "naive")  # balancer kinds of lbbsp_peers only
SAMPLES = 60000  # the synthetic set's


def dataset(args: argparse.Namespace) -> Path:
    path = Path(args.out) / "synth784.h5"
    if not path.exists():
        subprocess.run([args.lbbsp, "data", "synth", "--samples", str(SAMPLES), "--features", "784", "--out",
                        str(path)], check=True)
    return path


def train(args: argparse.Namespace, runner: str, data: Path, tag: str) -> dict:
    log = Path(args.out) / tag
    binary = args.peers if runner in PEERS else args.lbbsp
    cmd = [args.mpirun, "-n", "2", "--bind-to", "core", "--map-by", "core", binary, "train", "--data", str(data),
           "--model", "cnn", "--global-batch", str(args.batch), "--max-iterations", str(args.iterations),
           "--epochs", str(math.ceil(args.iterations * args.batch / SAMPLES)),  # else one epoch ends the run
           "--eval-every", "0", "--quiet", "--log-dir", str(log), "--csv", "--summary-json", str(log / "summary.json"),
           *RUNNERS[runner]]
    tenant = cotenants.start(args.scenario, core=1, period=args.period, tick=args.tick)
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    finally:
        if tenant is not None:
            tenant.kill()
            tenant.join()
    with open(log / "tenant.json", "w") as f:  # onoff, trace: when its phases or series began (Unix time)
        json.dump({"start": cotenants.start_of(tenant, unix=True)}, f)
    return summarise(log, args)


def counted(by_it: dict, args: argparse.Namespace, start: Optional[float]) -> list:
    """The iterations to count (each {rank: row}): after warm-up; under onoff those of whole on/off cycles, under
    trace those in --trace-window, by their telemetry's time_s (as bench/torch_cotenant.py's steps)."""
    its = [by_it[k] for k in sorted(by_it) if len(by_it[k]) == 2]
    began = np.array([float(v[0]["time_s"]) for v in its])
    if start is None or args.scenario not in ("onoff", "trace"):
        return its[args.warmup:]
    if args.scenario == "onoff":
        lo, hi = cotenants.whole_cycles(began, args.warmup, start, 2 * args.period)
    else:
        lo, hi = cotenants.counted(began, args.warmup, start + args.trace_window[0], start + args.trace_window[1])
    return its[lo:hi]  # iterations lo..hi-1 begin and end within the window


def summarise(log: Path, args: argparse.Namespace) -> dict:
    """Mean iteration (the slowest rank's compute + wait + allreduce + balancer), rank 1's share, and the ideal."""
    by_it: dict = {}
    for r in csv.DictReader(open(log / "telemetry.csv")):
        by_it.setdefault(int(r["iteration"]), {})[int(r["rank"])] = r
    start = json.load(open(log / "tenant.json"))["start"] if (log / "tenant.json").exists() else None
    its, batch = counted(by_it, args, start), args.batch
    total = [max(float(v[r]["compute_s"]) + float(v[r]["wait_s"]) + float(v[r]["allreduce_s"]) +
                 float(v[r]["balancer_s"]) for r in v) for v in its]
    compute = np.array([[float(v[r]["compute_s"]) for r in (0, 1)] for v in its])
    sizes = np.array([[float(v[r]["batch"]) for r in (0, 1)] for v in its])
    speeds = sizes / np.maximum(compute, 1e-9)
    mid = np.array([float(v[0]["time_s"]) for v in its]) + np.array(total) / 2  # on the co-tenant's clock
    phase = cotenants.phases(args.scenario, mid, start, args.period, args.tick)
    return {"iteration": float(np.mean(total)), "share1": float(np.mean(sizes[:, 1])), "counted": len(its),
            "slowest": float(np.mean(compute.max(axis=1))), "ideal": float(np.mean(batch / speeds.sum(axis=1))),
            "causal": oracle_split.causal_above_oracle(speeds.T, batch),
            "by_phase": oracle_split.by_phase_above_oracle(speeds.T, phase, batch)}


def table(results: dict) -> str:
    base = np.mean([r["iteration"] for r in results["bsp"]])
    ideal = np.mean([r["iteration"] / (r["iteration"] - r["slowest"] + r["ideal"]) for r in results["bsp"]])
    by_phase = base / np.mean([r["iteration"] - r["slowest"] + r["ideal"] + r["by_phase"] for r in results["bsp"]])
    rows = ["| runner | mean iteration ms (min-max) | vs bsp | of ideal | of ideal by phase | slower rank above own "
            "oracle, ms | iteration above own oracle, ms | rank 1's share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        ms = [r["iteration"] * 1e3 for r in runs]
        speedup = base * 1e3 / np.mean(ms)
        of_ideal, of_phase = oracle_split.of_ideal(speedup, ideal, 0.03), oracle_split.of_ideal(speedup, by_phase, 0.03)
        above = np.mean([(r["slowest"] - r["ideal"]) * 1e3 for r in runs])
        whole = np.mean([(r["iteration"] - r["ideal"]) * 1e3 for r in runs])
        rows.append(f"| {name} | {np.mean(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) | {speedup:.2f}x | {of_ideal:.2f} | "
                    f"{of_phase:.2f} | {above:.1f} | {whole:.1f} | {np.mean([r['share1'] for r in runs]):.1f} |")
    bsp = results["bsp"]
    reachable = base / np.mean([r["iteration"] - r["slowest"] + r["ideal"] + r["causal"] for r in bsp])
    return "\n".join(rows) + (
        f"\n\nideal speed-up over bsp: {ideal:.2f}x; the best causal split of bsp's speeds (last iteration's or an "
        f"EMA's, replayed): {reachable:.2f}x, {oracle_split.of_ideal(reachable, ideal, 0.03):.2f} of "
        f"the ideal, {1e3 * np.mean([r['causal'] for r in bsp]):.1f} ms an iteration above the oracle; the ideal by "
        f"phase (each rank's mean speed alone and under its co-tenant, in each of its phases: on/off, a trace sample, "
        f"else one): {by_phase:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=cotenants.KINDS, default="steady")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--period", type=float, default=1.5, help="onoff: seconds on, then off")
    p.add_argument("--tick", type=float, default=0.5, help="trace: seconds a trace sample lasts")
    p.add_argument("--trace-window", type=lambda v: [float(x) for x in v.split(",")], default=[5.0, 11.0],
                   help="trace: the iterations counted, FROM,TO seconds after the series began (default 5,11)")
    p.add_argument("--lbbsp", default=str(ROOT / "build" / "lbbsp"))
    p.add_argument("--peers", default=str(ROOT / "build" / "bench" / "lbbsp_peers"),
                   help="the lbbsp command with the peers' balancer kinds (bench/train_peers.cpp)")
    p.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated, from: " + ", ".join(RUNNERS))
    p.add_argument("--mpirun", default=os.environ.get("MPIEXEC", "mpirun"))
    p.add_argument("--out", default="results/train-cotenant")
    p.add_argument("--tabulate", action="store_true", help="print the table again from the runs kept under --out")
    args = p.parse_args()
    if args.tabulate:  # every run summarised again from its telemetry
        record = Path(args.out) / f"{args.scenario}.json"
        if not record.exists():
            p.error(f"--tabulate: no {record}: run the scenario with the same --out first")
        kept = json.load(open(record))
        print(table({name: [summarise(Path(args.out) / f"{args.scenario}-{name}-{i}", args)
                            for i in range(len(runs))] for name, runs in kept.items()}))
        return
    names = args.runners.split(",")
    if "bsp" not in names or not set(names) <= set(RUNNERS):
        p.error(f"--runners {args.runners!r}: a comma-separated list from {', '.join(RUNNERS)}, bsp among them "
                "(the baseline)")
    if set(names) & set(PEERS) and not os.access(args.peers, os.X_OK):
        p.error(f"--peers {args.peers}: no such program; build it (cmake --build build --target lbbsp_peers)")
    os.makedirs(args.out, exist_ok=True)
    data = dataset(args)
    results: dict = {name: [] for name in names}
    for round_ in range(args.repeats):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            results[name].append(train(args, name, data, f"{args.scenario}-{name}-{round_}"))
            print(f"round {round_} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    counted_its = np.mean([r["counted"] for runs in results.values() for r in runs])
    print(f"lbbsp train, co-tenant {args.scenario}, 2 ranks bound to cores 0 and 1, CNN, batch {args.batch}, "
          f"{args.iterations} iterations ({args.warmup} not counted; {counted_its:.0f} counted a run on average"
          f"{': whole on/off cycles' if args.scenario == 'onoff' else ''}"
          f"{': the trace window' if args.scenario == 'trace' else ''}), {args.repeats} rounds")
    print(table(results))
    with open(Path(args.out) / f"{args.scenario}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
