#!/usr/bin/python3
"""How predictable are the speeds in recorded telemetry? Bounds for the predictor table.

For every run under DIR/runs/*/telemetry.h5 (as written by dev/experiments/telemetry_eval.py) and every rank,
with s_t the measured speed of iteration t and the exogenous inputs x_t measured at the barrier after it (the
inputs a predictor has before iteration t+1):
  hindsight  ordinary least squares of s_{t+1} on [1, s_t, s_{t-1}, s_{t-2}, EMA_t, cpu_t, mem_t, load_t, cpu_{t-1}]
             fitted on the whole series at once (it sees the future: no online predictor can do better with these
             inputs, up to nonlinearity), its RMSE relative to EMA(0.3)'s one-step RMSE on the same steps;
  oracle     the same fit with, added, what no predictor has at the barrier: the coming iteration's own batch and
             emulated capacity, and every other rank's speed and cpu_avail at t and batch and capacity at t+1 (do
             the run's other ranks or the next step's true conditions explain what the inputs do not?)
  corr_exo   correlation of cpu_avail_t with s_{t+1} (does the barrier measurement announce the next speed?);
  corr_lag   correlation of s_t with s_{t+1} (does the last speed?).
Prints one markdown table per setting (the run name's prefix), pooled over runs and ranks, and with --per-rank one
row per run and rank.
    dev/experiments/telemetry_limits.py results/telemetry-eval-pred [--per-rank]
"""
import argparse
import os
import sys

import h5py
import numpy as np
from telemetry_eval import setting_of  # the same setting names as the predictor-table script

ALPHA = 0.3  # EMA of lbbsp's `ema` predictor


FIELDS = ("actual_speed", "cpu_avail", "mem_avail", "load", "batch", "capacity")


def runs_ranks(path):
    """One matrix per field, ranks x iterations (NaN where a rank has no row), and the rank numbers."""
    with h5py.File(path) as h:
        r = h["records"]
        d = {k: r[k][:] for k in ("iteration", "rank") + FIELDS}
    ranks, its = np.unique(d["rank"]), np.unique(d["iteration"])
    m = {k: np.full((len(ranks), len(its)), np.nan) for k in FIELDS}
    row, col = np.searchsorted(ranks, d["rank"]), np.searchsorted(its, d["iteration"])
    for k in FIELDS:
        m[k][row, col] = d[k]
    return [int(x) for x in ranks], m


def ema_of(v):
    ema = np.empty_like(v)
    e = np.nan
    for t, x in enumerate(v):
        if np.isfinite(x):
            e = x if not np.isfinite(e) else ALPHA * x + (1 - ALPHA) * e
        ema[t] = e
    return ema


def sse_of_fit(X, y):
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return float(np.sum((X @ coef - y) ** 2))


def one(m, i):
    """(steps, hindsight SSE, oracle-input SSE, EMA SSE, corr_exo, corr_lag) of rank row i of run matrices m."""
    v = m["actual_speed"][i]
    v = np.where(np.isfinite(v) & (v > 0), v, np.nan)
    cpu, ema = m["cpu_avail"][i], ema_of(v)
    t = np.arange(3, v.size - 1)  # predict v[t+1] from what is known at t
    known = [np.ones(len(t)), v[t], v[t - 1], v[t - 2], ema[t], cpu[t], m["mem_avail"][i][t], m["load"][i][t],
             cpu[t - 1]]
    unknown = [m["batch"][i][t + 1], m["capacity"][i][t + 1]]
    for j in range(m["actual_speed"].shape[0]):
        if j != i:  # an idle rank (no speed) counts as speed 0
            s_j = np.nan_to_num(m["actual_speed"][j][t], nan=0.0)
            unknown += [s_j, m["cpu_avail"][j][t], m["batch"][j][t + 1], m["capacity"][j][t + 1]]
    X, Xo, y = np.column_stack(known), np.column_stack(known + unknown), v[t + 1]
    # a step this rank is idle at t+1 (no speed) or another rank has no row is left out of both fits alike
    ok = np.all(np.isfinite(Xo), axis=1) & np.isfinite(y)
    X, Xo, y, e_next = X[ok], Xo[ok], y[ok], ema[t][ok]
    ema_sq = float(np.sum((e_next - y) ** 2))

    def corr(a, b):
        return float(np.corrcoef(a, b)[0, 1]) if np.std(a) > 0 and np.std(b) > 0 else float("nan")

    return len(y), sse_of_fit(X, y), sse_of_fit(Xo, y), ema_sq, corr(X[:, 5], y), corr(X[:, 1], y)


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
        ranks, m = runs_ranks(path)
        for i, rank in enumerate(ranks):
            groups.setdefault(setting_of(name), []).append((name, rank, one(m, i)))
    if not groups:
        sys.exit(f"telemetry_limits: no runs/*/telemetry.h5 under '{a.dir}'")
    print("| setting / run | series | steps | hindsight OLS RMSE / EMA RMSE | with oracle inputs "
          "| corr(cpu_t, s_t+1) | corr(s_t, s_t+1) |")
    print("|---|---:|---:|---:|---:|---|---|")
    for setting, rows in groups.items():
        n = sum(r[2][0] for r in rows)
        ema_sq = sum(r[2][3] for r in rows)
        hind, orac = (np.sqrt(sum(r[2][k] for r in rows) / ema_sq) for k in (1, 2))
        ce = [r[2][4] for r in rows if np.isfinite(r[2][4])]
        cl = [r[2][5] for r in rows if np.isfinite(r[2][5])]

        def rng(c):
            return f"{min(c):.2f} to {max(c):.2f}" if c else "-"

        print(f"| {setting} | {len(rows)} | {n} | {hind:.3f} | {orac:.3f} | {rng(ce)} | {rng(cl)} |")
        if a.per_rank:
            for name, rank, (steps, h, o, e, c1, c2) in rows:
                print(f"| &nbsp;&nbsp;{name} rank {rank} | 1 | {steps} | {np.sqrt(h / e):.3f} | {np.sqrt(o / e):.3f} "
                      f"| {c1:.2f} | {c2:.2f} |")

if __name__ == "__main__":
    main()
