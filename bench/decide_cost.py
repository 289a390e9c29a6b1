#!/usr/bin/env python3
"""Benchmark (not a test): what one balancer decision costs as the ranks grow. In lbbsp.torch every rank runs the
same balancer on the same reports each step (no sizes travel back), so this is paid on every rank, every step.

    bench/decide_cost.py [--workers 4,16,64,256] [--steps 300]

Prints, per predictor and rank count, the median, 90th percentile and maximum of Balancer.next_unchecked (the call
LoadBalancer.step() makes) over the steps after 50 of warm-up, with speeds that drift per rank and 5% noise. A tight
loop: caches stay warm, so a training step, where they are cold, pays somewhat more."""
import argparse
import time

import numpy as np

import lbbsp


def decide_ms(predictor: str, workers: int, steps: int) -> np.ndarray:
    b = lbbsp.Balancer("lbbsp-cpu", workers=workers, global_batch=64 * workers, predictor=predictor, seed=1,
                       num_exo=3, capacity_exo=lbbsp.RANK_CAPACITY_EXO)
    sizes, rng = b.initial(), np.random.default_rng(0)
    no_cap = np.full(workers, np.iinfo(np.int64).max, dtype=np.int64)
    exo = np.tile([1.0, 0.5, 0.0], workers)
    times = []
    for k in range(steps):
        speed = 1000 * (1 + 0.5 * np.sin(np.arange(workers) + k / 10)) * (1 + 0.05 * rng.standard_normal(workers))
        compute = np.ascontiguousarray(sizes / speed)
        t = time.perf_counter()
        sizes = b.next_unchecked(sizes.astype(np.int64), compute, exo, exo, no_cap)
        times.append(time.perf_counter() - t)
    return np.array(times[50:]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="4,16,64,256", help="rank counts, comma-separated")
    ap.add_argument("--steps", type=int, default=300, help="decisions per rank count (the first 50 not timed)")
    args = ap.parse_args()
    try:
        counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        ap.error(f"--workers '{args.workers}': expected rank counts like 4,16,64")
    if args.steps <= 50 or min(counts) < 1:
        ap.error("--steps must be > 50 and every rank count >= 1")
    print("| predictor | ranks | median ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|")
    for predictor in ("narx", "ema"):
        for w in counts:
            ms = decide_ms(predictor, w, args.steps)
            print(f"| {predictor} | {w} | {np.median(ms):.3f} | {np.percentile(ms, 90):.3f} | {ms.max():.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
