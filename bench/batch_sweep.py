#!/usr/bin/env python3
"""Train-step throughput of each model over batch sizes 1..512 (bench_models' train_sweep family) at the given
thread counts: a markdown table of samples/s per batch (and each thread count's ratio to one thread), and with
--png a log-log plot of it. A rank's batch changes every iteration, so a cliff where the code switches paths
(vector tiles, im2col, the GEMM's thread threshold) shows here.

usage: bench/batch_sweep.py [--bench build/bench/bench_models] [--threads 1,2] [--min-time 0.2] [--rounds 3]
                              [--png FILE]
Wall time at every thread count (bench_models' sweep polls 200 us before each step, as after an allreduce).
Each round runs every thread count once, one after the other; a cell is the best of the rounds (a noisy host
only ever slows a run down).
"""
import argparse
import json
import os
import subprocess
import sys

MODELS = ("logreg", "mlp", "cnn")


def measure(bench, threads, min_time):
    """{(model, batch): samples/s} from one bench_models run of the sweep at `threads` threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))  # bench_models bounds the spinning as lbbsp does
    run = subprocess.run([bench, f"--threads={threads}", "--benchmark_filter=train_sweep/",
                          f"--benchmark_min_time={min_time}", "--benchmark_format=json"], env=env,
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"batch_sweep.py: {bench} failed: {run.stderr[-2000:]}")
    out = {}
    for b in json.loads(run.stdout)["benchmarks"]:
        _, model, arg = b["name"].split("/")[:3]
        out[(model, int(arg.split(":")[1]))] = b["items_per_second"]
    return out


def table(results, threads):
    batches = sorted({b for (_, b) in results[threads[0]]})
    head = "| batch | " + " | ".join(f"{m} {t}t" for m in MODELS for t in threads) + " |"
    if len(threads) > 1:
        head += " " + " | ".join(f"{m} {t}t/1t" for m in MODELS for t in threads[1:]) + " |"
    lines = [head, "|" + "---:|" * (head.count("|") - 1)]
    for b in batches:
        cells = [f"{results[t][(m, b)]:,.0f}" for m in MODELS for t in threads]
        cells += [f"{results[t][(m, b)] / results[threads[0]][(m, b)]:.2f}" for m in MODELS for t in threads[1:]]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, threads, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(MODELS), figsize=(4 * len(MODELS), 3.2))
    for ax, m in zip(axes, MODELS):
        for t in threads:
            pts = sorted((b, v) for (mm, b), v in results[t].items() if mm == m)
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", ms=3, label=f"{t} thread(s)")
        ax.set(xscale="log", yscale="log", title=m, xlabel="batch (samples)", ylabel="samples/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", default="build/bench/bench_models")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--min-time", default="0.2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--png")
    a = p.parse_args()
    if not os.access(a.bench, os.X_OK):
        sys.exit(f"batch_sweep.py: --bench {a.bench} is not an executable (build it: cmake --build build)")
    try:
        threads = [int(t) for t in a.threads.split(",")]
    except ValueError:
        sys.exit(f"batch_sweep.py: --threads {a.threads!r} must be a comma-separated list of integers")
    if a.rounds < 1:
        sys.exit(f"batch_sweep.py: --rounds {a.rounds} must be at least 1")
    if a.png:  # before minutes of measuring, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit(f"batch_sweep.py: --png needs matplotlib in {sys.executable} (apt-get install "
                     "python3-matplotlib and run /usr/bin/python3, or pip install matplotlib)")
    results = {t: {} for t in threads}
    for _ in range(a.rounds):
        for t in threads:
            for key, value in measure(a.bench, t, a.min_time).items():
                results[t][key] = max(value, results[t].get(key, 0.0))
    print(table(results, threads))
    if a.png:
        plot(results, threads, a.png)


if __name__ == "__main__":
    main()
