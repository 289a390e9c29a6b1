#!/usr/bin/python3
"""The predictor table: speed predictors on telemetry recorded by real `lbbsp train` runs.

Records runs from scratch (mpirun, 4 ranks, MLP on Fashion-MNIST, `--balancer lbbsp-cpu --predictor narx
--log-dir`), then replays each run's telemetry through the predictors with
`lbbsp predict-eval --telemetry RUN --telemetry-exo barrier --format csv` (the exogenous inputs are what the
runtime measured at the barrier before each iteration, exactly what the balancer's predictor got) and prints
one markdown table: per setting, RMSE pooled over its runs and ranks, NARX's RMSE relative to EMA's and ARIMA's.

Settings (each run over every trace in --traces x every seed in --seeds, stress once per period):
  linear  trace replay with an emulated linear cost, 0.3 ms/sample / capacity (the demo's setting)
  heavy   the same at 1 ms/sample: the emulated time dwarfs the real compute, so the speed follows the trace
          and the shared cores' noise matters less
  sleep   trace replay, the real compute stretched to compute/capacity by sleeping (speed noise = the real
          compute's noise on the shared cores)
  sleep4k the same with global batch 4096 instead of 256: iterations of tens of ms, as on a real cluster, so the
          shared cores' scheduling noise (quanta of a few ms) is small against the compute
  stress  real stress-ng co-tenants on ranks 1 and 3 switching on and off every PERIOD s (exogenous inputs from
          /proc); only with --stress. All 4 ranks share both cores, so the co-tenants slow every rank.
  *-tick  with --tick S: the same trace settings replayed by iteration (the replay clock advances S s per
          iteration), so the cpu_avail measured at the barrier is exactly the coming iteration's capacity: the
          upper end of what the exogenous input is worth (wall-clock replay moves on between the barrier and the
          iteration's start, and a trace step changing in that gap is missed)
  pinned  ranks pinned 0,0,1,1 to the 2 CPUs, two 100% stress-ng co-tenants on CPU 1 switching on and off every
          PERIOD s, global batch 4096 (the experiment driver's stress scenario): only ranks 2 and 3 slow down, and
          their cpu_avail (measured on the CPU they are pinned to) shows it; only with --stress

usage: dev/experiments/telemetry_eval.py [--lbbsp build/lbbsp] [--out DIR] [--iterations 400]
           [--traces A,B,C] [--seeds 1,2] [--scale 0.5] [--settings heavy,linear,sleep] [--tick S] [--stress]
           [--per-run]
       dev/experiments/telemetry_eval.py --eval-only DIR   (re-score runs already recorded in DIR/runs)
Needs mpirun (Open MPI), and stress-ng for --stress. About 30 s per run on a 2-core machine.
"""
import argparse
import csv
import datetime
import io
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREDICTORS = ["narx", "arima", "ema", "last"]
ORDER = ["heavy", "linear", "sleep", "sleep4k", "stress", "pinned"]
# Trace-replay settings: (emulated cost appended to the --straggle spec, global batch).
TRACE_SETTINGS = {"linear": (";gpu=0:0:0.0003:1000000", 256), "heavy": (";gpu=0:0:0.001:1000000", 256),
                  "sleep": ("", 256), "sleep4k": ("", 4096)}


def setting_of(run_name):
    """The setting a recorded run belongs to, from its folder name: heavy-alibaba-s1 -> heavy,
    heavy-tick-alibaba-s1 -> heavy-tick, stress-p1 -> stress."""
    return run_name.rsplit("-", 2)[0]


def run(cmd, log=None):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout)
    if out.returncode != 0:
        sys.exit(f"telemetry_eval: command failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-3000:]}")
    return out.stdout


def mpi_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # ranks waiting at the allreduce give their core to the others
    return env


def record(a, name, straggle, seed, runs_dir, global_batch=256):
    d = os.path.join(runs_dir, name)
    if os.path.exists(os.path.join(d, "telemetry.h5")) and not a.force:
        print(f"telemetry_eval: {d} exists, reused (--force re-records)", file=sys.stderr)
        return d
    os.makedirs(d, exist_ok=True)
    cmd = ["mpirun", "-n", str(a.ranks), "--oversubscribe", "--bind-to", "none", a.lbbsp, "train",
           "--data", a.data, "--model", "mlp", "--global-batch", str(global_batch), "--lr", "0.1", "--epochs", "100",
           "--lr-schedule", "constant", "--max-iterations", str(a.iterations), "--seed", str(seed),
           "--balancer", "lbbsp-cpu", "--predictor", "narx", "--straggle", straggle, "--eval-every", "1000000",
           "--test-subset", "1000", "--log-dir", d]
    if a.allreduce != "auto":
        cmd += ["--allreduce", a.allreduce]
    with open(os.path.join(d, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    with open(os.path.join(d, "train.log"), "w") as f:
        f.write(out.stdout)
    if out.returncode != 0:
        sys.exit(f"telemetry_eval: training run failed, see {d}/train.log\n{out.stdout[-3000:]}")
    return d


def score(a, d):
    """{predictor: (steps, rmse)} of one run's telemetry (all ranks)."""
    text = run([a.lbbsp, "predict-eval", "--telemetry", d, "--telemetry-exo", "barrier", "--format", "csv",
                "--predictors", ",".join(PREDICTORS), "--seed", "1"])
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row["family"] == "all":
            out[row["predictor"]] = (int(row["steps"]), float(row["rmse"]))
    return out


def pooled(scores):
    """Pooled RMSE per predictor over runs (sum of squared errors / steps)."""
    out = {}
    for p in PREDICTORS:
        n = sum(s[p][0] for s in scores)
        sq = sum(s[p][0] * s[p][1] ** 2 for s in scores)
        out[p] = math.sqrt(sq / n) if n else float("nan")
    return out, sum(s["narx"][0] for s in scores)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lbbsp", default=os.path.join(ROOT, "build", "lbbsp"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
    ap.add_argument("--out", default=None, help="default results/telemetry-eval-DATE")
    ap.add_argument("--eval-only", default=None, metavar="DIR", help="score DIR/runs/* without training")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--traces", default="../shared/traces/alibaba_v2018_machine_usage,"
                    "../shared/traces/bitbrains_rnd,../shared/traces/planetlab_cloudsim")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--scale", type=float, default=0.5, help="seconds of training per trace step")
    ap.add_argument("--settings", default="heavy,linear,sleep")
    ap.add_argument("--tick", type=float, default=0.0,
                    help="replay the trace settings by iteration, S s per iteration (settings named SETTING-tick)")
    ap.add_argument("--stress", action="store_true", help="also real stress-ng co-tenants")
    ap.add_argument("--periods", default="1,2", help="stress on/off periods (s), one run each")
    ap.add_argument("--per-run", action="store_true", help="also one table row per run")
    ap.add_argument("--force", action="store_true", help="re-record runs that exist")
    ap.add_argument("--allreduce", choices=["auto", "mpi", "node"], default="auto",
                    help="lbbsp train --allreduce; mpi also counts the modelled compute from each rank's own start, "
                         "as the runs before 2026-11-30 did")
    a = ap.parse_args()
    out = a.eval_only or a.out or os.path.join(
        ROOT, "results", "telemetry-eval-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    runs_dir = os.path.join(out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    if not os.path.exists(a.lbbsp):
        sys.exit(f"telemetry_eval: no binary '{a.lbbsp}' (build it: cmake --build build --target lbbsp)")

    runs = []  # (setting, name, dir)
    if a.eval_only:
        for name in sorted(os.listdir(runs_dir)):
            if os.path.exists(os.path.join(runs_dir, name, "telemetry.h5")):
                runs.append((setting_of(name), name, os.path.join(runs_dir, name)))
    else:
        if not os.path.exists(a.data):
            os.makedirs(os.path.dirname(a.data), exist_ok=True)
            run([a.lbbsp, "data", "import-fashion-mnist", "--out", a.data])
        traces = [t for t in a.traces.split(",") if t]
        for t in traces:
            if not os.path.exists(os.path.join(ROOT, t)):
                sys.exit(f"telemetry_eval: no trace '{t}' (relative to {ROOT}; set --traces)")
        settings = [s for s in a.settings.split(",") if s]
        for setting in settings:
            if setting not in TRACE_SETTINGS:
                sys.exit(f"telemetry_eval: unknown setting '{setting}' ({', '.join(TRACE_SETTINGS)}; --stress "
                         "adds stress)")
            cost, batch = TRACE_SETTINGS[setting]
            cost += f";tick={a.tick:g}" if a.tick > 0 else ""
            label = setting + ("-tick" if a.tick > 0 else "")
            for t in traces:
                family = os.path.basename(os.path.normpath(t)).split("_")[0]
                for seed in [int(s) for s in a.seeds.split(",") if s]:
                    name = f"{label}-{family}-s{seed}"
                    spec = f"trace:{t};scale={a.scale:g};seed={seed}{cost}"
                    runs.append((label, name, record(a, name, spec, seed, runs_dir, global_batch=batch)))
        if a.stress:
            for period in [p for p in a.periods.split(",") if p]:
                name = f"stress-p{period}"
                spec = f"stress:1=90,3=60;period={period}"
                runs.append(("stress", name, record(a, name, spec, 1, runs_dir)))
                name = f"pinned-p{period}"
                spec = f"stress:2=100,3=100;pin=0,0,1,1;period={period}"
                runs.append(("pinned", name, record(a, name, spec, 1, runs_dir, global_batch=4096)))

    scored = [(setting, name, score(a, d)) for setting, name, d in runs]
    lines = ["| setting | runs | scored steps | NARX RMSE | ARIMA | EMA | last | NARX / EMA | NARX / ARIMA |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def row(label, count, scores):
        r, steps = pooled(scores)
        lines.append(f"| {label} | {count} | {steps} | {r['narx']:.4g} | {r['arima']:.4g} | {r['ema']:.4g} | "
                     f"{r['last']:.4g} | **{r['narx'] / r['ema']:.3f}** | **{r['narx'] / r['arima']:.3f}** |")

    def order(s):
        base = s.removesuffix("-tick")
        return (ORDER.index(base) if base in ORDER else 9, s != base)

    for setting in sorted({s for s, _, _ in scored}, key=order):
        group = [sc for s, _, sc in scored if s == setting]
        row(setting, len(group), group)
        if a.per_run:
            for s, name, sc in scored:
                if s == setting:
                    row("&nbsp;&nbsp;" + name, 1, [sc])
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "table_b.md"), "w") as f:
        f.write(table + "\n")
    print(f"\n(runs and table in {out})", file=sys.stderr)


if __name__ == "__main__":
    main()
