#!/usr/bin/env python3
"""Speed-up and efficiency of lbbsp strong/weak scaling runs: markdown tables and plots against the ideal line.

  plot_scaling.py [--strong DIR]... [--weak DIR]... --out OUTDIR [--title TEXT] [--cores N] [--no-plot]

Each DIR is searched recursively for summary.json files (as written by `lbbsp train --summary-json`), e.g. a sweep
folder of scripts/slurm/strong_scaling.sbatch (RESULTS_DIR/strong-JOBID) or of bench/scaling/run_scaling.sh. Runs
with the same rank count are repeats: their median throughput is used.

Throughput (samples_per_s) is the measure, relative to the smallest rank count N0 in the sweep:
  speed-up S(N) = thr(N) / thr(N0), ideal N / N0, efficiency S(N) / (N / N0).
Strong scaling (fixed global batch) makes S the classic T(N0)/T(N) of fixed work; weak scaling (fixed per-rank
batch) makes S the scaled speed-up and the efficiency T_iter(N0)/T_iter(N).
Writes OUTDIR/scaling.md (the tables) and OUTDIR/strong.png, OUTDIR/weak.png (matplotlib, Debian
python3-matplotlib). Exit status 1 when a folder holds no usable summary.
"""
import argparse
import json
import os
import statistics
import sys


def collect(folder):
    """Rows by rank count: list of summaries (repeats) per rank count."""
    if not os.path.isdir(folder):
        sys.exit(f"plot_scaling: error: {folder} is not a folder")
    runs = {}
    bad = []
    for root, _, files in os.walk(folder):
        if "summary.json" not in files:
            continue
        path = os.path.join(root, "summary.json")
        try:
            with open(path) as f:
                s = json.load(f)
            ranks = int(s["ranks"])
            float(s["samples_per_s"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            bad.append(f"{path}: {e}")
            continue
        runs.setdefault(ranks, []).append(s)
    for b in bad:
        print(f"plot_scaling: warning: skipped {b}", file=sys.stderr)
    if not runs:
        sys.exit(f"plot_scaling: error: no summary.json with 'ranks' and 'samples_per_s' under {folder}")
    return runs


def median(rows, key):
    vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(vals) if vals else float("nan")


def analyse(runs):
    n0 = min(runs)
    thr0 = median(runs[n0], "samples_per_s")
    table = []
    for n in sorted(runs):
        rows = runs[n]
        thr = median(rows, "samples_per_s")
        iters = median(rows, "iterations")
        wall = median(rows, "wall_s")
        speedup = thr / thr0 if thr0 > 0 else float("nan")
        ideal = n / n0
        table.append({
            "ranks": n, "repeats": len(rows), "global_batch": rows[0].get("global_batch"), "iterations": iters,
            "wall_s": wall, "s_per_iter": wall / iters if iters else float("nan"), "samples_per_s": thr,
            "speedup": speedup, "ideal": ideal, "efficiency": speedup / ideal,
            "wait_fraction": median(rows, "wait_fraction"), "model": rows[0].get("model"),
            "balancer": rows[0].get("balancer"),
        })
    return table


def markdown(kind, folder, table, cores):
    what = {"strong": "fixed global batch", "weak": "fixed batch per rank"}[kind]
    t0 = table[0]
    lines = [f"## {kind.capitalize()} scaling ({what})", "",
             f"Source: `{folder}`; model {t0['model']}, balancer {t0['balancer']}; speed-up and efficiency from "
             f"throughput relative to {t0['ranks']} rank{'s' if t0['ranks'] > 1 else ''}."]
    if cores:
        over = [r["ranks"] for r in table if r["ranks"] > cores]
        if over:
            lines.append(f"Measured on {cores} cores: runs with {', '.join(map(str, over))} ranks are oversubscribed "
                         f"(more ranks than cores), so they cannot scale; they show the runtime's overhead.")
    lines += ["", "| ranks | global batch | iterations | wall s | s/iter | samples/s | speed-up | ideal | efficiency "
              "| wait fraction |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        rep = f" (x{r['repeats']})" if r["repeats"] > 1 else ""
        lines.append(f"| {r['ranks']}{rep} | {r['global_batch']} | {r['iterations']:.0f} | {r['wall_s']:.3f} | "
                     f"{r['s_per_iter'] * 1e3:.2f} ms | {r['samples_per_s']:.0f} | {r['speedup']:.2f} | "
                     f"{r['ideal']:.0f} | {r['efficiency']:.0%} | {r['wait_fraction']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(kind, table, path, title, cores):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    n = [r["ranks"] for r in table]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(n, [r["ideal"] for r in table], "k--", label="ideal")
    ax1.plot(n, [r["speedup"] for r in table], "o-", label="lbbsp")
    ax1.set_ylabel("scaled speed-up" if kind == "weak" else "speed-up")
    ax2.axhline(1.0, color="k", linestyle="--", label="ideal")
    ax2.plot(n, [r["efficiency"] for r in table], "o-", label="lbbsp")
    ax2.set_ylabel("parallel efficiency")
    ax2.set_ylim(0, max(1.1, max(r["efficiency"] for r in table) * 1.1))
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(n)
        ax.set_xticklabels([str(x) for x in n])
        ax.set_xlabel("ranks")
        ax.grid(True, alpha=0.3)
        if cores and n[-1] > cores:
            ax.axvspan(cores, n[-1], color="red", alpha=0.07, label=f"> {cores} cores (oversubscribed)")
        ax.legend()
    if len(n) > 1:
        ax1.set_yscale("log", base=2)
        ax1.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    what = {"strong": "fixed global batch", "weak": "fixed batch per rank"}[kind]
    fig.suptitle(f"{title}: {kind} scaling ({what})" if title else f"{kind.capitalize()} scaling ({what})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strong", action="append", default=[], metavar="DIR", help="strong-scaling results folder")
    p.add_argument("--weak", action="append", default=[], metavar="DIR", help="weak-scaling results folder")
    p.add_argument("--out", required=True, help="folder for scaling.md and the plots")
    p.add_argument("--title", default="lbbsp")
    p.add_argument("--cores", type=int, default=0, help="cores of the machine (marks oversubscribed runs)")
    p.add_argument("--no-plot", action="store_true", help="tables only (no matplotlib needed)")
    a = p.parse_args()
    if not a.strong and not a.weak:
        p.error("give at least one --strong DIR or --weak DIR")
    if not a.no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit(f"plot_scaling: error: {sys.executable} has no matplotlib: install the Debian package "
                     "python3-matplotlib, run with /usr/bin/python3, or pass --no-plot for tables only")
    os.makedirs(a.out, exist_ok=True)
    md = [f"# {a.title} scaling", ""]
    for kind in ("strong", "weak"):
        for i, folder in enumerate(getattr(a, kind)):
            table = analyse(collect(folder))
            md.append(markdown(kind, folder, table, a.cores))
            if not a.no_plot:
                suffix = f"-{i + 1}" if len(getattr(a, kind)) > 1 else ""
                path = os.path.join(a.out, f"{kind}{suffix}.png")
                plot(kind, table, path, a.title, a.cores)
                md.append(f"![{kind} scaling]({os.path.basename(path)})\n")
    text = "\n".join(md)
    with open(os.path.join(a.out, "scaling.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"plot_scaling: wrote {os.path.join(a.out, 'scaling.md')}"
          + ("" if a.no_plot else " and the plots beside it"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
