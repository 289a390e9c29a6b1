#!/usr/bin/python3
"""Turn one training run's telemetry (--log-dir) into PNG plots.

usage: scripts/plot_run.py RUN_DIR [--out DIR]
Writes batch_sizes.png (per-rank batch size over iterations), iteration_time.png (slowest compute and wait per
iteration), speed.png (predicted vs actual speed per rank) into DIR (default RUN_DIR).
"""
import argparse
import os
import sys
import textwrap

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def load(run_dir):
    path = os.path.join(run_dir, "telemetry.h5")
    if not os.path.exists(path):
        sys.exit(f"plot_run.py: no telemetry.h5 in '{run_dir}' (run lbbsp train with --log-dir {run_dir})")
    with h5py.File(path, "r") as f:
        g = f["records"]
        cols = {k: g[k][:] for k in g.keys()}
        attrs = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in g.attrs.items()}
    return cols, attrs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = a.out or a.run_dir
    os.makedirs(out, exist_ok=True)
    r, attrs = load(a.run_dir)
    # The straggle spec can be longer than the figure is wide: it goes on its own wrapped, smaller line.
    straggle = "\n".join(textwrap.wrap("straggle " + attrs.get("straggle", ""), 110))
    title = f"{attrs.get('model', '?')} · {attrs.get('balancer', '?')}\n{straggle}"
    ranks = sorted(set(r["rank"].tolist()))

    fig, ax = plt.subplots(figsize=(9, 4))
    for k in ranks:
        m = r["rank"] == k
        ax.plot(r["iteration"][m], r["batch"][m], label=f"rank {k}", lw=1)
    ax.set(xlabel="iteration", ylabel="batch size")
    ax.set_title("Per-rank batch size · " + title, fontsize=9)
    ax.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "batch_sizes.png"), dpi=110)

    its = np.unique(r["iteration"])
    slowest = np.array([r["compute_s"][r["iteration"] == i].max() for i in its])
    waits = np.array([r["wait_s"][r["iteration"] == i].mean() for i in its])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(its, slowest, label="slowest rank's compute (s)", lw=1)
    ax.plot(its, waits, label="mean wait at the allreduce (s)", lw=1)
    ax.set(xlabel="iteration", ylabel="seconds")
    ax.set_title("Iteration time · " + title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "iteration_time.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(9, 4))
    for k in ranks:
        m = r["rank"] == k
        line = ax.plot(r["iteration"][m], r["actual_speed"][m], lw=1, label=f"rank {k} actual")
        if np.any(r["predicted_speed"][m] > 0):
            ax.plot(r["iteration"][m], r["predicted_speed"][m], "--", lw=1, color=line[0].get_color(),
                    label=f"rank {k} predicted")
    ax.set(xlabel="iteration", ylabel="samples/s")
    ax.set_title("Predicted vs actual speed · " + title, fontsize=9)
    ax.legend(ncol=4, fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "speed.png"), dpi=110)
    print(f"plots in {out}: batch_sizes.png iteration_time.png speed.png")


if __name__ == "__main__":
    main()
