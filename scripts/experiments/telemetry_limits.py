#!/usr/bin/python3
"""How predictable are the speeds in recorded telemetry? Bounds for table (b) of issue #4.

For every run under DIR/runs/*/telemetry.h5 (as written by scripts/experiments/telemetry_eval.py) and every rank,
with s_t the measured speed of iteration t and the exogenous inputs x_t measured at the barrier after it (the
inputs a predictor has before iteration t+1):
  hindsight  ordinary least squares of s_{t+1} on [1, s_t, s_{t-1}, s_{t-2}, EMA_t, cpu_t, mem_t, load_t, cpu_{t-1}]
             fitted on the whole series at once (it sees the future: no online predictor can do better with these
             inputs, up to nonlinearity), its RMSE relative to EMA(0.3)'s one-step RMSE on the same steps;
  corr_exo   correlation of cpu_avail_t with s_{t+1} (does the barrier measurement announce the next speed?);
  corr_lag   correlation of s_t with s_{t+1} (does the last speed?).
Prints one markdown table per setting (the run name's prefix), pooled over runs and ranks, and with --per-rank one
row per run and rank.
    scripts/experiments/telemetry_limits.py results/telemetry-eval-pred [--per-rank]
"""
import argparse
import os
import sys

import h5py
import numpy as np

from telemetry_eval import setting_of  # the same setting names as the table (b) script

ALPHA = 0.3  # EMA of lbbsp's `ema` predictor


def series(path):
    with h5py.File(path) as h:
        r = h["records"]
        d = {k: r[k][:] for k in ("iteration", "rank", "actual_speed", "cpu_avail", "mem_avail", "load")}
    for rank in np.unique(d["rank"]):
        m = d["rank"] == rank
        o = np.argsort(d["iteration"][m])
        yield int(rank), {k: v[m][o].astype(float) for k, v in d.items()}


def one(s):
    """(steps, hindsight squared error sum, EMA squared error sum, corr_exo, corr_lag) of one rank's series."""
    v, cpu, mem, load = s["actual_speed"], s["cpu_avail"], s["mem_avail"], s["load"]
    good = np.isfinite(v) & (v > 0)
    v = np.where(good, v, np.nan)
    ema = np.empty_like(v)
    e = np.nan
    for t, x in enumerate(v):
        if np.isfinite(x):
            e = x if not np.isfinite(e) else ALPHA * x + (1 - ALPHA) * e
        ema[t] = e
    t = np.arange(3, len(v) - 1)  # predict v[t+1] from what is known at t
    X = np.column_stack([np.ones(len(t)), v[t], v[t - 1], v[t - 2], ema[t], cpu[t], mem[t], load[t], cpu[t - 1]])
    y = v[t + 1]
    ok = np.all(np.isfinite(X), axis=1) & np.isfinite(y)
    X, y, e_next = X[ok], y[ok], ema[t][ok]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    hind = float(np.sum((X @ coef - y) ** 2))
    ema_sq = float(np.sum((e_next - y) ** 2))
    corr = lambda a, b: float(np.corrcoef(a, b)[0, 1]) if np.std(a) > 0 and np.std(b) > 0 else float("nan")
    return len(y), hind, ema_sq, corr(X[:, 5], y), corr(X[:, 1], y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="a telemetry_eval.py output folder (with runs/*/telemetry.h5)")
    ap.add_argument("--per-rank", action="store_true")
    a = ap.parse_args()
    runs_dir = os.path.join(a.dir, "runs")
    if not os.path.isdir(runs_dir):
        sys.exit(f"telemetry_limits: no folder '{runs_dir}' (give the --out folder of telemetry_eval.py)")
    groups = {}
    for name in sorted(os.listdir(runs_dir)):
        path = os.path.join(runs_dir, name, "telemetry.h5")
        if not os.path.exists(path):
            continue
        for rank, s in series(path):
            groups.setdefault(setting_of(name), []).append((name, rank, one(s)))
    if not groups:
        sys.exit(f"telemetry_limits: no runs/*/telemetry.h5 under '{a.dir}'")
    print("| setting / run | series | steps | hindsight OLS RMSE / EMA RMSE | corr(cpu_t, s_t+1) | corr(s_t, s_t+1) |")
    print("|---|---:|---:|---:|---|---|")
    for setting, rows in groups.items():
        n = sum(r[2][0] for r in rows)
        ratio = np.sqrt(sum(r[2][1] for r in rows) / sum(r[2][2] for r in rows))
        ce = [r[2][3] for r in rows if np.isfinite(r[2][3])]
        cl = [r[2][4] for r in rows if np.isfinite(r[2][4])]
        rng = lambda c: f"{min(c):.2f} to {max(c):.2f}" if c else "-"
        print(f"| {setting} | {len(rows)} | {n} | {ratio:.3f} | {rng(ce)} | {rng(cl)} |")
        if a.per_rank:
            for name, rank, (steps, h, e, c1, c2) in rows:
                print(f"| &nbsp;&nbsp;{name} rank {rank} | 1 | {steps} | {np.sqrt(h / e):.3f} | {c1:.2f} | {c2:.2f} |")


if __name__ == "__main__":
    main()
