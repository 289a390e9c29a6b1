#!/usr/bin/python3
"""Run the LB-BSP experiment end to end on this machine and write a results folder.

Scenarios (trainer runs under mpirun, 4 ranks, MLP on Fashion-MNIST):
  static   --straggle static:1,1,0.5,0.25 with a linear emulated cost (gpu=0:0:SLOPE:CAP, see --slope): 4 ranks on
           2 loaded cores make compute / capacity (pure sleep) measure CPU contention, not the capacities
  static-sleep  the same without the linear cost (pure sleep-by-capacity), to show that effect
  trace    replay of real co-tenant CPU traces (Alibaba 2018 co-located machines): each rank replays its own
           machine, all from one moment of the cluster (align=time), by the trace's timestamps compressed 30x
           (rate=30: a median 60 s sample lasts 2 s of training, ~15 iterations); capacity = 1 - CPU util
  trace-indep  the same machines, each rank from its own random moment (align=random, the old placement: more
           heterogeneous than a real job, whose workers run at the same time on machines of one cluster)
  stress   real stress-ng co-tenants: ranks pinned 0,0,1,1 to the 2 CPUs, two 100% co-tenants on CPU 1, on/off
           every 2 s of wall clock; global batch 4096 so that the ranks' real compute, not the allreduce, dominates
  gpu-emu  GPU-like cost profile (flat to saturation, then linear, memory cap) emulated in the trainer
  gpu-sim  the same kind of profile through `lbbsp simulate --profile gpu` (many workers, trace-driven)
For each scenario and balancer: mean iteration time, wait fraction, efficiency vs the oracle (oracle mean iteration
time / this one's), speed-up vs BSP, time to the target test accuracy; plots of per-rank batch sizes, iteration time,
predicted vs actual speed and accuracy over time. A PyTorch DDP peer (dev/peers/pytorch_ddp.py: same MLP, data
order, global batch and static straggler emulation, equal split) adds a "pytorch-ddp" row to the static scenario.

usage: dev/experiment.py [--quick | --smoke | --full] [--lbbsp PATH] [--data PATH] [--out DIR] [--repeats N]
       dev/experiment.py --scenarios trace --balancers bsp,lbbsp-cpu/narx,oracle --repeats 3
       dev/experiment.py --rebuild --out DIR     (tables and plots again from DIR/runs, no training)
Run with /usr/bin/python3 (numpy, h5py, matplotlib; torch for the DDP peer).
"""
import argparse
import csv
import datetime
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.normpath(os.path.join(ROOT, "..", "shared", "traces"))

# name -> (--balancer, --predictor)
BALANCERS = {
    "bsp": ("bsp", None),
    "static": ("static", None),
    "lbbsp-cpu/narx": ("lbbsp-cpu", "narx"),
    "lbbsp-cpu/arima": ("lbbsp-cpu", "arima"),
    "lbbsp-cpu/ema": ("lbbsp-cpu", "ema"),
    "lbbsp-cpu/last": ("lbbsp-cpu", "last"),
    "lbbsp-gpu": ("lbbsp-gpu", None),
    "lbbsp-gpu-model": ("lbbsp-gpu-model", None),
    "oracle": ("oracle", None),
}
ALL_CPU = ["bsp", "static", "lbbsp-cpu/narx", "lbbsp-cpu/arima", "lbbsp-cpu/ema", "lbbsp-cpu/last", "lbbsp-gpu",
           "lbbsp-gpu-model", "oracle"]
GPU_EMU = "gpu=0.02:32:0.0004:640"  # FLOOR s to SAT samples, + SLOPE s/sample, CAP samples (per rank, / capacity)


def log(*a):
    print(*a, flush=True)


def mode_config(a):
    """Parameters of each mode: which scenarios, balancers, iterations."""
    alibaba = os.path.join(TRACES, "alibaba_v2018_machine_usage")
    # Linear cost: a rank's compute is stretched to SLOPE s/sample x batch / capacity (never below its real time),
    # so 4 ranks sharing 2 loaded cores still see the emulated speeds rather than CPU contention.
    lin = f";gpu=0:0:{a.slope}:1000000" if a.slope > 0 else ""
    # The trace's capacities are milder (about 0.3-0.95) than the static pattern's: a steeper slope keeps compute,
    # not the ~50-80 ms allreduce of 4 processes on 2 loaded cores, the bigger part of an iteration.
    tlin = f";gpu=0:0:{a.trace_slope}:1000000" if a.trace_slope > 0 else ""
    # {seed} is filled per repeat (--trace-seed + repeat): repeats sample other machines and moments.
    clock = f"rate={a.trace_rate}" if a.trace_rate > 0 else f"scale={a.trace_scale}"
    align = ";align=time" if a.trace_rate > 0 else ""  # (row-indexed replay has no common clock)
    # --trace-tick S: the replay clock advances S s per iteration, so every balancer meets the same capacities.
    clock += f";tick={a.trace_tick}" if a.trace_tick > 0 else ""
    trace_spec = f"trace:{alibaba};{clock}{align};seed={{seed}}{tlin}"
    indep_spec = f"trace:{alibaba};{clock};seed={{seed}}{tlin}"
    scen = {
        "static": {"straggle": f"static:1,1,0.5,0.25{lin}", "balancers": ALL_CPU},
        "trace": {"straggle": trace_spec, "balancers": ALL_CPU},
        "trace-indep": {"straggle": indep_spec, "balancers": ["bsp", "lbbsp-cpu/narx", "oracle"]},
        # Ranks 0,1 on CPU 0 and 2,3 on CPU 1 with two 100% co-tenants: only ranks 2 and 3 slow down (to half of
        # the others' speed while the co-tenants run, by CFS's equal shares; capacity() gives the oracle that
        # model). The MLP's compute at 128 samples per rank is ~3 ms, smaller than the allreduce: 1024 per rank.
        "stress": {"straggle": "stress:2=100,3=100;pin=0,0,1,1;period=2", "global_batch": 4096,
                   "balancers": ["bsp", "lbbsp-cpu/narx", "lbbsp-cpu/ema", "oracle"]},
        "gpu-emu": {"straggle": f"static:1,1,0.5,0.25;{GPU_EMU}",
                    "balancers": ["bsp", "lbbsp-cpu/narx", "lbbsp-gpu", "lbbsp-gpu-model", "oracle"]},
        "static-sleep": {"straggle": "static:1,1,0.5,0.25", "balancers": ["bsp", "lbbsp-cpu/narx", "oracle"]},
    }
    cfg = dict(model="mlp", ranks=a.ranks, global_batch=a.global_batch, lr=a.lr, target=0.85, eval_every=50,
               test_subset=5000, iterations=a.iterations or 300, gpu_iterations=150, sim=True, peer=True,
               scenarios=scen, repeats=a.repeats)
    if a.quick:
        cfg.update(iterations=a.iterations or 120, gpu_iterations=60, eval_every=40, test_subset=2000, target=0.8)
        quick = ["bsp", "lbbsp-cpu/narx", "oracle"]
        for k in ("static", "trace"):
            scen[k]["balancers"] = quick
        del scen["trace-indep"]
        scen["stress"]["balancers"] = ["bsp", "lbbsp-cpu/narx", "oracle"]
        scen["gpu-emu"]["balancers"] = ["bsp", "lbbsp-gpu-model", "oracle"]
        del scen["static-sleep"]
    if a.smoke:
        cfg.update(iterations=a.iterations or 40, gpu_iterations=0, eval_every=20, test_subset=500, target=0.3,
                   sim=False, peer=False, lr=0.05, global_batch=256)
        cfg["scenarios"] = {"static": {"straggle": f"static:1,1,0.5,0.25{lin}",
                                       "balancers": ["bsp", "lbbsp-cpu/last", "oracle"]}}
    if a.target is not None:
        cfg["target"] = a.target
    cfg["target2"] = a.target2 if a.target2 is not None else round(cfg["target"] - 0.02, 4)
    if a.full:
        cfg["cnn"] = True
    if a.lr_schedule != "constant" and cfg["peer"] and not a.no_peer:
        log("experiment.py: no PyTorch DDP peer with --lr-schedule cosine (the peer's schedule is constant)")
        cfg["peer"] = False
    if a.scenarios:
        keep = a.scenarios.split(",")
        cfg["scenarios"] = {k: v for k, v in cfg["scenarios"].items() if k in keep}
        cfg["sim"] = cfg["sim"] and "gpu-sim" in keep
    if a.balancers:
        for v in cfg["scenarios"].values():
            v["balancers"] = [b for b in a.balancers.split(",") if b in BALANCERS]
    if not os.path.isdir(alibaba):
        for k in ("trace", "trace-indep"):
            if k in cfg["scenarios"]:
                log(f"experiment.py: {alibaba} not found; skipping the {k} scenario")
                del cfg["scenarios"][k]
    if shutil.which("stress-ng") is None and "stress" in cfg["scenarios"]:
        log("experiment.py: stress-ng not installed; skipping the stress scenario")
        del cfg["scenarios"]["stress"]
    return cfg


def mpirun_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Waiting ranks yield the CPU instead of spinning: 4 ranks share 2 cores here.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def train_samples(path):
    with h5py.File(path, "r") as f:
        return int(f["train/labels"].shape[0])


def mlp_lr(cfg, global_batch):
    """The MLP's learning rate: --lr (or the mode's), else the default for this global batch (see --help)."""
    return cfg["lr"] if cfg["lr"] is not None else (0.2 if global_batch <= 512 else 0.1)


def train_cmd(a, cfg, model, straggle, balancer, run_dir, iterations, target, global_batch=None):
    bal, pred = BALANCERS[balancer]
    gb = (global_batch or cfg["global_batch"]) if model == "mlp" else a.cnn_global_batch
    # --lr-schedule cosine: the schedule ends at the iteration cap (its epochs = the cap's epochs, rounded up)
    epochs = math.ceil(iterations * gb / train_samples(a.data)) if a.lr_schedule == "cosine" else 100
    cmd = ["mpirun", "-n", str(cfg["ranks"]), "--oversubscribe", "--bind-to", "none", a.lbbsp, "train",
           "--data", a.data, "--model", model, "--global-batch", str(gb),
           "--lr", str(mlp_lr(cfg, gb) if model == "mlp" else 0.05), "--momentum", "0.9", "--epochs", str(epochs),
           "--lr-schedule", a.lr_schedule,
           "--max-iterations", str(iterations), "--seed", "1", "--balancer", bal, "--straggle", straggle,
           "--lag", str(a.lag), "--eval-every", str(cfg["eval_every"]), "--test-subset", str(cfg["test_subset"]),
           "--quiet", "--log-dir", run_dir, "--summary-json", os.path.join(run_dir, "summary.json")]
    if pred:
        cmd += ["--predictor", pred]
    if target:
        cmd += ["--target-accuracy", str(target)]
    if a.min_batch is not None:
        cmd += ["--min-batch", str(a.min_batch)]
    if a.allreduce != "auto":
        cmd += ["--allreduce", a.allreduce]
    return cmd


def run_failed(failed, what, p):
    """Notes a failed run in `failed` ("scenario/balancer rN: first error line"; any makes the exit status 1)."""
    text = (p.stderr or p.stdout or "").strip()
    first = next((line for line in text.splitlines() if "error" in line.lower()), text.splitlines()[0] if text else "")
    failed.append(f"{what}: {first[:300]}")
    log(f"  {what}: FAILED (exit {p.returncode}): {text[-600:]}")


def run_train(a, cfg, failed, scenario, model, straggle, balancer, rep, iterations, target, global_batch=None):
    run_dir = os.path.join(a.out, "runs", f"{scenario}", f"{balancer.replace('/', '_')}-r{rep}")
    os.makedirs(run_dir, exist_ok=True)
    straggle = straggle.replace("{seed}", str(a.trace_seed + rep))
    cmd = train_cmd(a, cfg, model, straggle, balancer, run_dir, iterations, target, global_batch)
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(f"'{c}'" if (";" in c or " " in c) else c for c in cmd) + "\n")
    t = time.time()
    p = subprocess.run(cmd, env=mpirun_env(), cwd=ROOT, capture_output=True, text=True, timeout=a.run_timeout)
    if p.returncode != 0:
        run_failed(failed, f"{scenario}/{balancer} r{rep}", p)
        return None
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    s["run_dir"] = run_dir
    s["wall_clock_s"] = time.time() - t
    return s


def run_peer(a, cfg, failed, scenario, straggle, rep, iterations, target):
    run_dir = os.path.join(a.out, "runs", scenario, f"pytorch-ddp-r{rep}")
    os.makedirs(run_dir, exist_ok=True)
    factors = straggle.split(";")[0].split(":", 1)[1]
    cmd = [a.torch_python, os.path.join(ROOT, "dev", "peers", "pytorch_ddp.py"), "--data", a.data,
           "--ranks", str(cfg["ranks"]), "--global-batch", str(cfg["global_batch"]),
           "--lr", str(mlp_lr(cfg, cfg["global_batch"])),
           "--momentum", "0.9", "--max-iterations", str(iterations), "--seed", "1", "--straggle", factors,
           "--eval-every", str(cfg["eval_every"]), "--test-subset", str(cfg["test_subset"]),
           "--cost-slope", str(a.slope), "--summary-json", os.path.join(run_dir, "summary.json")]
    if target:
        cmd += ["--target-accuracy", str(target)]
    with open(os.path.join(run_dir, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=a.run_timeout)
    except subprocess.TimeoutExpired:
        log(f"  {scenario}/pytorch-ddp: timed out")
        return None
    if p.returncode != 0:
        run_failed(failed, f"{scenario}/pytorch-ddp r{rep}", p)
        return None
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    s["run_dir"] = run_dir
    return s


def load_run(a, scenario, balancer, rep):
    run_dir = os.path.join(a.out, "runs", scenario, f"{balancer.replace('/', '_')}-r{rep}")
    try:
        s = json.load(open(os.path.join(run_dir, "summary.json")))
    except (OSError, ValueError):
        return None
    s["run_dir"] = run_dir
    return s


def run_sim(a, cfg, failed):
    """GPU-like profile on 32 simulated workers, trace-driven: JSON from lbbsp simulate."""
    out = os.path.join(a.out, "runs", "gpu-sim")
    os.makedirs(out, exist_ok=True)
    if a.rebuild and os.path.exists(os.path.join(out, "simulate.json")):
        return sim_rows(json.load(open(os.path.join(out, "simulate.json"))))
    cmd = [a.lbbsp, "simulate", "--workers", "32", "--traces", os.path.join(TRACES, "alibaba_v2018_machine_usage"),
           "--balancers", "bsp,static,lbbsp-cpu:narx,lbbsp-cpu:arima,lbbsp-cpu:ema,lbbsp-cpu:last,lbbsp-gpu,"
           "lbbsp-gpu-model,oracle", "--iterations", str(500 if not a.quick else 200), "--profile", "gpu",
           "--global-batch", "2048", "--seed", "1", "--format", "json",
           "--trace-out", os.path.join(out, "batches.csv")]
    with open(os.path.join(out, "command.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.run_timeout)
    if p.returncode != 0:
        run_failed(failed, "gpu-sim", p)
        return []
    j = json.loads(p.stdout)
    json.dump(j, open(os.path.join(out, "simulate.json"), "w"), indent=1)
    return sim_rows(j)


def sim_rows(j):
    rows = []
    for r in j["results"]:
        name = r["balancer"].replace(":", "/")
        if name == "static:" or name.startswith("static"):
            name = "static"
        rows.append({"scenario": "gpu-sim", "balancer": name, "mean_iteration_s": r["mean_iteration_s"],
                     "wait_fraction": r["wait_fraction"], "efficiency_vs_oracle": r["efficiency_vs_oracle"],
                     "speedup_vs_bsp": r["speedup_vs_bsp"], "time_to_target_s": None, "test_accuracy": None,
                     "n": 1, "iter_min": r["mean_iteration_s"], "iter_max": r["mean_iteration_s"]})
    return rows


def name_of(s):
    return s["balancer"] + (f"/{s['predictor']}" if s.get("balancer") == "lbbsp-cpu" else "")


def mean_or_none(v):
    v = [x for x in v if x is not None]
    return float(np.mean(v)) if v else None


def time_to(summary, threshold):
    """Training time to the first evaluation at >= threshold, from the summary's accuracy_curve (None if never)."""
    for p in summary.get("accuracy_curve") or []:
        if p["test_accuracy"] >= threshold:
            return p["train_time_s"]
    return None


def ideal_speedup(cap):
    """Speed-up of a perfect split over an equal one for capacities cap[t, i] (iteration t, rank i), compute linear
    in the batch and no fixed cost: mean_t(max_i 1/c_i) / mean_t(R / sum_i c_i), the ceiling of any balancer."""
    return float((1 / cap.min(1)).mean() / (cap.shape[1] / cap.sum(1)).mean())


def decomposition(run_dir):
    """From a run's telemetry: the mean slowest compute per iteration (s), and the ideal_speedup of the capacities
    this run saw. None if absent."""
    try:
        r = telemetry(run_dir)
    except (OSError, KeyError):
        return None, None
    it, rank = r["iteration"], r["rank"]
    n, R = int(it.max()) + 1, int(rank.max()) + 1
    comp = np.zeros((n, R))
    cap = np.ones((n, R))
    comp[it, rank] = r["compute_s"]
    cap[it, rank] = np.clip(r["capacity"], 1e-3, None)
    return float(comp.max(1).mean()), ideal_speedup(cap)


# Final test accuracy at or below this is chance level for the driver's 10-class datasets (Fashion-MNIST, synth).
CHANCE_ACCURACY = 0.15


def collapsed(summary):
    """A run whose training diverged to chance accuracy (e.g. lr 0.2 at global batch >= 1024): its iteration
    times stay valid, its accuracy columns do not."""
    acc = summary.get("test_accuracy")
    return acc is not None and acc <= CHANCE_ACCURACY


def accuracy_cell(row):
    cell = fmt(row.get("test_accuracy"), ".4f")
    if row.get("collapsed"):
        cell += f" ({row['collapsed']} of {row['n']} collapsed)" if row["n"] > 1 else " (collapsed)"
    return cell


def aggregate(scenario, runs_by_balancer, target2=None):
    """runs_by_balancer: name -> [summary, ...] (repeats). Returns table rows with derived columns."""
    rows = []
    for name, runs in runs_by_balancer.items():
        runs = [r for r in runs if r]
        if not runs:
            continue
        it = [r["mean_iteration_s"] for r in runs]
        tta = [r.get("time_to_target_s") for r in runs]
        reached = [t for t in tta if t is not None and t >= 0]
        low = [time_to(r, target2) for r in runs] if target2 else [None]
        low_ok = [t for t in low if t is not None]
        dec = [decomposition(r["run_dir"]) for r in runs if r.get("run_dir")]
        comp = [d[0] for d in dec if d[0] is not None]
        ceil = [d[1] for d in dec if d[1] is not None]
        rows.append({"scenario": scenario, "balancer": name, "mean_iteration_s": float(np.mean(it)),
                     "iter_min": min(it), "iter_max": max(it), "n": len(runs),
                     "wait_fraction": mean_or_none([r.get("wait_fraction") for r in runs]),
                     "overhead_fraction": mean_or_none([r.get("balancer_overhead_fraction") for r in runs]),
                     "time_to_target_s": float(np.mean(reached)) if len(reached) == len(runs) else None,
                     "target_accuracy": runs[0].get("target_accuracy"),
                     "time_to_target2_s": float(np.mean(low_ok)) if low_ok and len(low_ok) == len(low) else None,
                     "test_accuracy": float(np.mean([r["test_accuracy"] for r in runs])),
                     "collapsed": sum(collapsed(r) for r in runs),
                     # what no balancer removes: iteration time beyond the slowest rank's compute (allreduce,
                     # SGD step, balancer, data gather), and the capacity ceiling of the runs' traces
                     "fixed_s": float(np.mean(it)) - float(np.mean(comp)) if comp else None,
                     "ideal_speedup": float(np.mean(ceil)) if ceil else None,
                     "run_dir": runs[-1].get("run_dir")})
    base = {r["balancer"]: r["mean_iteration_s"] for r in rows}
    for r in rows:
        r["efficiency_vs_oracle"] = base["oracle"] / r["mean_iteration_s"] if "oracle" in base else None
        r["speedup_vs_bsp"] = base["bsp"] / r["mean_iteration_s"] if "bsp" in base else None
    return rows


def fmt(v, spec, suffix=""):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{suffix}"


def write_tables(a, cfg, rows, scen_specs, commands):
    cols = ["scenario", "balancer", "n", "mean_iteration_s", "iter_min", "iter_max", "wait_fraction",
            "efficiency_vs_oracle", "speedup_vs_bsp", "time_to_target_s", "time_to_target2_s", "test_accuracy",
            "fixed_s", "ideal_speedup", "collapsed"]
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    lines = [f"# LB-BSP experiment ({cfg['mode']} mode, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC)", "",
             f"{cfg['ranks']} ranks under mpirun on {os.cpu_count()} cores (oversubscribed), MLP 784-256-128-10 on "
             f"Fashion-MNIST, global batch {cfg['global_batch']}, lr {mlp_lr(cfg, cfg['global_batch'])} "
             f"({a.lr_schedule}"
             f"{'' if cfg['lr'] is not None else '; 0.1 for a scenario at global batch > 512'}) momentum 0.9, "
             f"{cfg['iterations']} iterations ({cfg['gpu_iterations']} for gpu-emu), --lag {a.lag}, "
             f"--allreduce {a.allreduce}, "
             f"evaluation every {cfg['eval_every']} iterations on {cfg['test_subset']} test samples; "
             f"time to target = training time (no evaluation time) to the first evaluation at >= {cfg['target']} "
             f"test accuracy (and, from the same accuracy curve, >= {cfg['target2']}). "
             f"{cfg['repeats']} repeat(s) per cell (mean; min-max of the mean iteration time in brackets)." +
             (f" static-cnn: the CNN, global batch {a.cnn_global_batch}, lr 0.05, target 0.89, static scenario."
              if cfg.get("cnn") else ""), "",
             "Scenarios:", ""]
    for k, v in scen_specs.items():
        lines.append(f"- **{k}**: `{v}`")
    lines += ["", "| scenario | balancer | mean iteration | wait fraction | efficiency vs oracle | speed-up vs BSP | "
              f"time to {cfg['target']} | time to {cfg['target2']} | final test acc. | fixed | ideal |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rng = f" [{r['iter_min']*1000:.1f}-{r['iter_max']*1000:.1f}]" if r.get("n", 1) > 1 else ""
        tta = fmt(r.get("time_to_target_s"), ".1f", " s")
        if r["scenario"] != "gpu-sim" and r.get("time_to_target_s") is None:
            tta = "not reached"
        tta2 = fmt(r.get("time_to_target2_s"), ".1f", " s")
        if r["scenario"] != "gpu-sim" and r.get("time_to_target2_s") is None:
            tta2 = "not reached"
        if r["scenario"] in ("gpu-sim", "gpu-emu", "static-sleep"):
            tta = tta2 = "-"
        lines.append(f"| {r['scenario']} | {r['balancer']} | {r['mean_iteration_s']*1000:.1f} ms{rng} | "
                     f"{fmt(r.get('wait_fraction') and 100*r['wait_fraction'], '.1f', '%')} | "
                     f"{fmt(r.get('efficiency_vs_oracle'), '.3f')} | {fmt(r.get('speedup_vs_bsp'), '.2f', 'x')} | "
                     f"{tta} | {tta2} | {accuracy_cell(r)} | "
                     f"{fmt(r.get('fixed_s') and 1000 * r['fixed_s'], '.1f', ' ms')} | "
                     f"{fmt(r.get('ideal_speedup'), '.2f', 'x')} |")
    lines += ["", "fixed: mean iteration time beyond the slowest rank's compute (allreduce, SGD step, balancer), "
              "which no balancer removes. ideal: mean_t(max_i 1/c_i) / mean_t(R / sum_i c_i) over the capacities c the "
              "run saw (telemetry), the speed-up of a perfect split over an equal one with compute linear in the "
              "batch and no fixed cost: the ceiling for that scenario and window (stress: the share model).",
              "gpu-sim rows: `lbbsp simulate --profile gpu` (simulated seconds; no training, so no accuracy).",
              f"collapsed: a run ended at chance accuracy (<= {CHANCE_ACCURACY}): training diverged at this lr; every "
              "split follows the same SGD trajectory only up to float summation order, which momentum can amplify "
              "into a different outcome, so one balancer's run may collapse where another's does not. Its time "
              "columns stay valid, its accuracy columns do not; rerun with a lower --lr.",
              "pytorch-ddp: dev/peers/pytorch_ddp.py, equal split (DDP cannot rebalance), same sleep-by-capacity "
              "emulation; its efficiency/speed-up columns compare against lbbsp's oracle/BSP rows.", "",
              "## Commands", "", "```"] + commands + ["```", "", "Plots: " + ", ".join(
                  sorted(f for f in os.listdir(a.out) if f.endswith(".png")))]
    open(os.path.join(a.out, "results.md"), "w").write("\n".join(lines) + "\n")


def telemetry(run_dir):
    with h5py.File(os.path.join(run_dir, "telemetry.h5"), "r") as f:
        g = f["records"]
        return {k: g[k][:] for k in g.keys()}


def per_iteration_time(r):
    """Iteration time from rank 0's rows: compute + wait + allreduce + balancer."""
    m = r["rank"] == 0
    return r["iteration"][m], (r["compute_s"] + r["wait_s"] + r["allreduce_s"] + r["balancer_s"])[m]


def smooth(y, w=10):
    if len(y) < w:
        return y
    return np.convolve(y, np.ones(w) / w, mode="valid")


def per_rank_panels(a, tel, names, height, ylabel, legend_size, draw, title, filename):
    """One panel per balancer in `names`, draw(ax, records, rank, mask) once per rank, saved as a.out/filename."""
    fig, axes = plt.subplots(len(names), 1, figsize=(9, height * len(names) + 0.6), sharex=True, squeeze=False)
    for ax, n in zip(axes[:, 0], names):
        r = tel[n]
        for k in sorted(set(r["rank"].tolist())):
            draw(ax, r, k, r["rank"] == k)
        ax.set_ylabel(ylabel)
        ax.set_title(n, fontsize=9, loc="left")
    axes[0, 0].legend(ncol=4, fontsize=legend_size)
    axes[-1, 0].set_xlabel("iteration")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, filename), dpi=100)
    plt.close(fig)


def plots(a, scenario, runs_by_balancer):
    dirs = {n: rs[-1]["run_dir"] for n, rs in runs_by_balancer.items()
            if rs and rs[-1] and os.path.exists(os.path.join(rs[-1]["run_dir"], "telemetry.h5"))}
    tel = {n: telemetry(d) for n, d in dirs.items()}
    if not tel:
        return
    # per-rank batch size over time
    names = list(tel)

    def batch_panel(ax, r, k, m):
        ax.plot(r["iteration"][m], r["batch"][m], lw=0.8, label=f"rank {k}")

    per_rank_panels(a, tel, names, 1.8, "batch", 7, batch_panel, f"Per-rank batch size · {scenario}",
                    f"batch_sizes_{scenario}.png")
    # iteration time over time per balancer
    fig, ax = plt.subplots(figsize=(9, 4))
    for n in names:
        it, t = per_iteration_time(tel[n])
        s = smooth(t)
        ax.plot(it[len(it) - len(s):], s * 1000, lw=1, label=n)
    ax.set(xlabel="iteration", ylabel="ms (moving mean of 10)", title=f"Iteration time · {scenario}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, f"iteration_time_{scenario}.png"), dpi=100)
    plt.close(fig)
    # predicted vs actual speed for the predictor-based balancers
    preds = [n for n in names if n.startswith("lbbsp") and np.any(tel[n]["predicted_speed"] > 0)]

    def speed_panel(ax, r, k, m):
        line = ax.plot(r["iteration"][m], r["actual_speed"][m], lw=0.8, label=f"rank {k} actual")
        ax.plot(r["iteration"][m], r["predicted_speed"][m], "--", lw=0.8, color=line[0].get_color(),
                label=f"rank {k} predicted")

    if preds:
        per_rank_panels(a, tel, preds, 2.2, "samples/s", 6, speed_panel, f"Predicted vs actual speed · {scenario}",
                        f"speed_{scenario}.png")
    # time-to-accuracy curves
    fig, ax = plt.subplots(figsize=(8, 4))
    for n, rs in runs_by_balancer.items():
        if rs and rs[-1] and rs[-1].get("accuracy_curve"):
            c = rs[-1]["accuracy_curve"]
            ax.plot([p["train_time_s"] for p in c], [p["test_accuracy"] for p in c], "-o", ms=2, lw=1, label=n)
    tgt = next((rs[-1].get("target_accuracy") for rs in runs_by_balancer.values() if rs and rs[-1]), None)
    if tgt:
        ax.axhline(tgt, color="k", lw=0.6, ls=":")
    ax.set(xlabel="training time (s)", ylabel="test accuracy", title=f"Time to accuracy · {scenario}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, f"accuracy_{scenario}.png"), dpi=100)
    plt.close(fig)


def summary_plot(a, rows):
    scen = sorted(set(r["scenario"] for r in rows), key=[r["scenario"] for r in rows].index)
    fig, axes = plt.subplots(1, len(scen), figsize=(4 * len(scen), 4), squeeze=False)
    for ax, s in zip(axes[0], scen):
        rs = [r for r in rows if r["scenario"] == s and r.get("speedup_vs_bsp")]
        ax.barh([r["balancer"] for r in rs], [r["speedup_vs_bsp"] for r in rs])
        ax.axvline(1, color="k", lw=0.6)
        ax.set(title=s, xlabel="speed-up vs BSP")
        ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "speedup.png"), dpi=100)
    plt.close(fig)


CEILING_TRACES = {"alibaba": os.path.join("alibaba_v2018_machine_usage", "machine_usage.csv.gz"),
                  "bitbrains": "bitbrains_rnd", "planetlab": "planetlab_cloudsim"}


def capacity_series(lbbsp, path):
    """{series: array of (time s, capacity)} of a trace file or folder, read by `lbbsp data export-traces` (the
    reader the replay uses: every format of ../shared/traces, gzip or plain)."""
    out = subprocess.run([lbbsp, "data", "export-traces", "--traces", path], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"experiment.py: cannot read utilisation trace '{path}': {out.stderr.strip()}")
    rows = {}
    for r in csv.DictReader(io.StringIO(out.stdout)):
        rows.setdefault(r["series"], []).append((float(r["time_s"]), float(r["capacity"])))
    ser = {m: np.array(sorted(v)) for m, v in rows.items() if v}
    if not ser:
        sys.exit(f"experiment.py: no utilisation series in '{path}'")
    return ser


def trace_ceiling(lbbsp, path, ranks_list, window_s, rate, windows, seed):
    """Ideal speed-up of a perfect split over an equal one (compute linear in the batch, no fixed cost) on a CPU
    utilisation trace (capacity_series), over `windows` random replay windows of `window_s` training seconds at
    `rate` trace seconds per second: co-located (ranks on distinct machines at one moment, align=time) vs
    independent (each rank its own machine and moment). Capacity = 1 - CPU util, clamped to [0.05, 1], as the
    replay does. Where fewer series than ranks cover a window, ranks share them in turn (as align=time does)."""
    ser = capacity_series(lbbsp, path)
    span = window_s * rate
    ts = np.arange(0.0, span, 2.0 * rate / 15)  # one point per ~iteration (15 iterations per 2 s)
    rng = np.random.default_rng(seed)

    def caps(m, start):
        t, c = ser[m][:, 0], ser[m][:, 1]
        i = np.clip(np.searchsorted(t, start + ts, side="right") - 1, 0, len(t) - 1)
        return np.clip(c[i], 0.05, 1)

    lo = min(v[0, 0] for v in ser.values())
    hi = max(v[-1, 0] for v in ser.values())
    lines = [f"Ideal speed-up over BSP on {os.path.basename(path)}: {windows} random windows of {window_s:.0f} s "
             f"of training at rate {rate:g} ({span / 60:.0f} min of trace), capacity = 1 - CPU util", "",
             "| ranks | placement | mean | median | p25 | p75 | share of windows >= 1.4x |",
             "|---|---|---|---|---|---|---|"]
    for R in ranks_list:
        res = {"co-located (align=time)": [], "independent (align=random)": []}
        for _ in range(windows):
            t0 = rng.uniform(lo, hi - span)
            cover = [m for m, v in ser.items() if v[0, 0] <= t0 and v[-1, 0] >= t0 + span]
            if not cover:
                continue
            # Fewer covering series than ranks: ranks share them in turn, as the replay's align=time does.
            ms = np.resize(rng.choice(sorted(cover), min(R, len(cover)), replace=False), R)
            res["co-located (align=time)"].append(ideal_speedup(np.array([caps(m, t0) for m in ms]).T))
            ms = np.resize(rng.choice(sorted(ser), min(R, len(ser)), replace=False), R)
            res["independent (align=random)"].append(ideal_speedup(np.array(
                [caps(m, rng.uniform(ser[m][0, 0], max(ser[m][0, 0], ser[m][-1, 0] - span))) for m in ms]).T))
        for k, v in res.items():
            v = np.array(v)
            if not len(v):
                lines.append(f"| {R} | {k} | no window is covered by any series |  |  |  |  |")
                continue
            lines.append(f"| {R} | {k} | {v.mean():.2f}x | {np.median(v):.2f}x | {np.percentile(v, 25):.2f}x | "
                         f"{np.percentile(v, 75):.2f}x | {np.mean(v >= 1.4):.0%} |")
    return "\n".join(lines)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lbbsp", default=os.path.join(ROOT, "build", "lbbsp"))
    ap.add_argument("--data", default=None, help="HDF5 dataset (default data/fmnist.h5; --smoke: synthetic)")
    ap.add_argument("--target", type=float, default=None, help="target test accuracy (default 0.85; smoke 0.3)")
    ap.add_argument("--out", default=None)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="fewer balancers and iterations (~3-5 min)")
    g.add_argument("--smoke", action="store_true", help="tiny run on synthetic data (< 60 s), for the test")
    ap.add_argument("--target2", type=float, default=None, help="second threshold read off the accuracy curves "
                    "(default target - 0.02)")
    ap.add_argument("--rebuild", action="store_true", help="no runs: rebuild tables and plots from --out's runs/")
    ap.add_argument("--full", action="store_true", help="also the CNN (to 0.89) on the static scenario (slow)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=4, help="MPI ranks (the stress scenario's pin= assumes 4)")
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--slope", type=float, default=0.0003,
                    help="linear emulated cost, s/sample at capacity 1, for static/trace (0: pure sleep-by-capacity)")
    ap.add_argument("--cnn-global-batch", type=int, default=256)
    ap.add_argument("--trace-slope", type=float, default=0.0006, help="the same for the trace scenario")
    ap.add_argument("--lr", type=float, default=None,
                    help="MLP learning rate (default 0.2 up to global batch 512, 0.1 above: 0.2 with momentum 0.9 "
                         "sometimes collapses to chance accuracy at >= 1024)")
    ap.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant",
                    help="cosine decays to 0 at --iterations (for time-to-accuracy runs)")
    ap.add_argument("--lag", type=int, default=0)
    ap.add_argument("--min-batch", type=int, default=None)
    ap.add_argument("--allreduce", choices=["auto", "mpi", "node"], default="auto",
                    help="lbbsp train --allreduce; mpi also counts the modelled compute from each rank's own start, "
                         "as every run before 2026-11-30 did")
    ap.add_argument("--trace-scale", type=float, default=2.0,
                    help="with --trace-rate 0: seconds of training per trace row (the old row-indexed replay)")
    ap.add_argument("--trace-rate", type=float, default=30.0,
                    help="trace seconds per second of training, by the trace's timestamps (Alibaba's median "
                         "sample gap of 60 s lasts 2 s); 0: row-indexed replay with --trace-scale")
    ap.add_argument("--trace-tick", type=float, default=0.0,
                    help="trace replay clock in seconds per iteration (0: the wall clock); with it every balancer "
                    "replays the same capacities")
    ap.add_argument("--trace-seed", type=int, default=7,
                    help="seed of the trace placement in repeat 0; repeat k uses this + k")
    ap.add_argument("--scenarios", default=None,
                    help="comma list of static,trace,trace-indep,stress,gpu-emu,gpu-sim,static-sleep")
    ap.add_argument("--balancers", default=None, help="comma list, e.g. bsp,lbbsp-cpu/narx,oracle")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--run-timeout", type=float, default=900)
    ap.add_argument("--trace-ceiling", action="store_true",
                    help="no runs: print the ideal speed-up over BSP that a utilisation trace allows (random "
                         "windows, co-located vs independent placement, --ceiling-ranks) and exit")
    ap.add_argument("--ceiling-trace", default="alibaba",
                    help="alibaba, bitbrains, planetlab (from ../shared/traces) or a path to such a file or folder")
    ap.add_argument("--ceiling-ranks", default="4,8,16")
    ap.add_argument("--ceiling-window", type=float, default=40.0, help="training seconds per window")
    return ap.parse_args()


def print_trace_ceiling(a):
    """--trace-ceiling: the ideal speed-up over BSP that a utilisation trace allows; no runs."""
    path = (os.path.join(TRACES, CEILING_TRACES[a.ceiling_trace]) if a.ceiling_trace in CEILING_TRACES
            else a.ceiling_trace)
    if not os.path.exists(path):
        sys.exit(f"experiment.py: no trace '{path}' (--ceiling-trace: {', '.join(CEILING_TRACES)} or a path)")
    if not os.access(a.lbbsp, os.X_OK):
        sys.exit(f"experiment.py: no lbbsp binary at '{a.lbbsp}' (build it, or pass --lbbsp PATH)")
    print(trace_ceiling(os.path.abspath(a.lbbsp), path,
                        [int(x) for x in a.ceiling_ranks.split(",")], a.ceiling_window,
                        a.trace_rate if a.trace_rate > 0 else 60.0 / a.trace_scale, 2000, a.trace_seed))


def prepare(a):
    """Checks the binary, makes the output folder and (--smoke) the synthetic dataset; returns the mode's config."""
    a.out = a.out or os.path.join(ROOT, "results", f"experiment-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    a.lbbsp = os.path.abspath(a.lbbsp)
    if not os.access(a.lbbsp, os.X_OK):
        sys.exit(f"experiment.py: no lbbsp binary at '{a.lbbsp}' (build it, or pass --lbbsp PATH)")
    os.makedirs(a.out, exist_ok=True)
    cfg = mode_config(a)
    cfg["mode"] = "smoke" if a.smoke else "quick" if a.quick else "default"
    if a.data is None:
        a.data = os.path.join(a.out, "synth.h5") if a.smoke else os.path.join(ROOT, "data", "fmnist.h5")
    a.data = os.path.abspath(a.data)
    if a.smoke and not os.path.exists(a.data):
        subprocess.run([a.lbbsp, "data", "synth", "--samples", "6000", "--features", "784", "--classes", "10",
                        "--seed", "1", "--out", a.data], check=True, capture_output=True)
    if not os.path.exists(a.data):
        sys.exit(f"experiment.py: no dataset at '{a.data}' (lbbsp data import-fashion-mnist --out {a.data})")
    return cfg


def peer_available(a, cfg):
    """Whether the PyTorch DDP peer runs: wanted, and --torch-python imports torch and lbbsp."""
    if a.no_peer or not cfg["peer"]:
        return False
    ok = subprocess.run([a.torch_python, "-c", "import torch, torch.distributed, lbbsp"],
                        capture_output=True).returncode == 0
    if not ok:
        log(f"experiment.py: no torch or lbbsp for {a.torch_python}; skipping the pytorch-ddp peer")
    return ok


def first_command(a, scenario, name):
    """The command line repeat 0 of one run was started with (its runs/ folder's command.txt)."""
    return open(os.path.join(a.out, "runs", scenario, f"{name.replace('/', '_')}-r0", "command.txt")).read().strip()


def run_scenarios(a, cfg, failed, peer, t0):
    """Every scenario x balancer (and the peer on the static scenario), --repeats times, or with --rebuild their
    saved summaries; returns {scenario: {balancer: [summary or None per repeat]}} and the commands of repeat 0."""
    runs = {s: {b: [] for b in v["balancers"]} for s, v in cfg["scenarios"].items()}
    if peer and "static" in runs:
        runs["static"]["pytorch-ddp"] = []
    commands = []
    for rep in range(cfg["repeats"]):
        for scenario, v in cfg["scenarios"].items():
            iters = cfg["gpu_iterations"] if scenario in ("gpu-emu", "static-sleep") else cfg["iterations"]
            if scenario.startswith("trace") and not a.smoke and not a.iterations:
                iters = cfg["iterations"] * 5 // 6
            target = None if scenario in ("gpu-emu", "static-sleep") else cfg["target"]
            for b in v["balancers"]:
                s = (load_run(a, scenario, b, rep) if a.rebuild
                     else run_train(a, cfg, failed, scenario, "mlp", v["straggle"], b, rep, iters, target,
                                    v.get("global_batch")))
                runs[scenario][b].append(s)
                if s:
                    log(f"[{time.time() - t0:6.0f} s] {scenario:8s} {b:16s} iter {s['mean_iteration_s']*1000:7.1f} ms"
                        f"  wait {100*s['wait_fraction']:5.1f}%  tta {s.get('time_to_target_s')}"
                        f"  acc {s['test_accuracy']:.4f}" +
                        ("  COLLAPSED to chance accuracy (lower --lr)" if collapsed(s) else ""))
                if rep == 0:
                    commands.append(first_command(a, scenario, b))
            if scenario == "static" and peer:
                s = (load_run(a, scenario, "pytorch-ddp", rep) if a.rebuild
                     else run_peer(a, cfg, failed, scenario, v["straggle"], rep, iters, target))
                runs[scenario]["pytorch-ddp"].append(s)
                if s:
                    log(f"[{time.time() - t0:6.0f} s] {scenario:8s} pytorch-ddp      iter "
                        f"{s['mean_iteration_s']*1000:7.1f} ms  tta {s.get('time_to_target_s')}")
                if rep == 0:
                    commands.append(first_command(a, scenario, "pytorch-ddp"))
    return runs, commands


def run_cnn(a, cfg, failed, t0):
    """--full: the CNN to 0.89 on the static scenario, BSP, LB-BSP and the oracle, once each."""
    cfg_cnn = dict(cfg, target=0.89)
    runs = {}
    for b in ["bsp", "lbbsp-cpu/narx", "oracle"]:
        s = (load_run(a, "static-cnn", b, 0) if a.rebuild
             else run_train(a, cfg_cnn, failed, "static-cnn", "cnn", cfg["scenarios"]["static"]["straggle"], b, 0,
                            a.iterations or 1500, 0.89))
        runs[b] = [s]
        if s:
            log(f"[{time.time() - t0:6.0f} s] static-cnn {b:16s} iter {s['mean_iteration_s']*1000:7.1f} ms"
                f"  tta {s.get('time_to_target_s')}")
    return runs


def report(a, cfg, failed, runs, commands, t0):
    """The rows of every scenario (and the simulated GPU cluster), the plots, results.md; exits 1 if a run failed."""
    rows = []
    for scenario, rb in runs.items():
        rows += aggregate(scenario, rb, cfg["target2"])
        plots(a, scenario, rb)
    scen_specs = {k: v["straggle"].replace("{seed}", f"{a.trace_seed}+repeat") +
                  (f" (global batch {v['global_batch']})" if v.get("global_batch") else "")
                  for k, v in cfg["scenarios"].items()}
    if cfg["sim"]:
        rows += run_sim(a, cfg, failed)
        commands.append(open(os.path.join(a.out, "runs", "gpu-sim", "command.txt")).read().strip())
        scen_specs["gpu-sim"] = "lbbsp simulate --profile gpu, 32 workers, Alibaba traces"
    if rows:
        summary_plot(a, rows)
    write_tables(a, cfg, rows, scen_specs, commands)
    log(open(os.path.join(a.out, "results.md")).read())
    log(f"experiment.py: {len(rows)} rows in {time.time() - t0:.0f} s; results in {a.out}")
    if failed:
        sys.exit(f"experiment.py: {len(failed)} run(s) failed (logs above, commands in {a.out}/runs):\n  " +
                 "\n  ".join(failed))


def main():
    a = parse_args()
    if a.trace_ceiling:
        print_trace_ceiling(a)
        return
    cfg = prepare(a)
    peer = peer_available(a, cfg)
    failed = []  # every failed run, named with its first error line
    t0 = time.time()
    runs, commands = run_scenarios(a, cfg, failed, peer, t0)
    if cfg.get("cnn") and "static" in cfg["scenarios"]:
        runs["static-cnn"] = run_cnn(a, cfg, failed, t0)
    report(a, cfg, failed, runs, commands, t0)


if __name__ == "__main__":
    main()
