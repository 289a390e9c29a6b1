#!/usr/bin/env python3
"""Experiment (not the product): the on/off co-tenant's ideal as issue #51 words it, beside the benchmark's.

    python3 dev/experiments/phase_ideal.py results/cotenant/onoff/plain-*.json [--period 1.5] [--warmup 40]

Reads plain DDP's runs of `bench/torch_cotenant.py --scenario onoff` (their per-step records) and prints, per run,
the benchmark's ideal speed-up (each step split by that step's measured speeds: it knows every step's noise
beforehand) and the ideal "from each rank's measured speed alone and under its co-tenant": each phase's mean speeds
(co-tenant on, co-tenant off), the split switched at the right step, the ranks at their measured speeds of each
step. Both count the same steps as the benchmark (whole on/off cycles after warm-up).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import cotenants

X = 128  # the benchmark's global batch


def ideals(rec, period, warmup):
    """(plain's mean step, the per-step oracle's speed-up, the per-phase ideal's speed-up) of one plain run."""
    end, start = np.array(rec["end"]), rec["tenant_start"]
    lo, hi = cotenants.whole_cycles(end, warmup, start, 2 * period)
    steps = np.diff(end)[lo:hi]
    t = np.array(rec["compute_all"])[:, lo + 1:hi + 1]  # ranks x steps, seconds of compute
    b = np.array(rec["sizes"])[lo + 1:hi + 1].T
    speeds = b / t
    phase = (np.floor(((end[lo:hi] + end[lo + 1:hi + 1]) / 2 - start) / period) % 2).astype(int)  # 0: on
    by_phase = np.zeros(speeds.shape[1])
    for p in (0, 1):
        m = phase == p
        mean = b[:, m].sum(axis=1) / t[:, m].sum(axis=1)
        by_phase[m] = (X * mean[:, None] / mean.sum() / speeds[:, m]).max(axis=0)
    plain, slowest = steps.mean(), t.max(axis=0).mean()
    oracle = (X / speeds.sum(axis=0)).mean()
    return plain, plain / (plain - slowest + oracle), plain / (plain - slowest + by_phase.mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="plain-*.json records of bench/torch_cotenant.py --scenario onoff")
    ap.add_argument("--period", type=float, default=1.5, help="the benchmark's --period")
    ap.add_argument("--warmup", type=int, default=40, help="the benchmark's --warmup")
    a = ap.parse_args()
    rows = []
    for path in a.runs:
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"phase_ideal.py: cannot read {path}: {e}")
        if rec.get("tenant_start") is None:
            sys.exit(f"phase_ideal.py: {path} has no tenant_start: a record of torch_cotenant.py --scenario onoff")
        rows.append(ideals(rec, a.period, a.warmup))
        print(f"{path}: plain {1e3 * rows[-1][0]:.2f} ms; per-step oracle {rows[-1][1]:.3f}x; "
              f"by phase {rows[-1][2]:.3f}x")
    mean = np.mean(rows, axis=0)
    print(f"mean: per-step oracle {mean[1]:.3f}x; by phase {mean[2]:.3f}x")


if __name__ == "__main__":
    main()
