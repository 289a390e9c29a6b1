#!/usr/bin/env python3
"""Markdown tables (and optionally plots) from the folder dev/device_check.sh wrote, for docs/results.

  dev/device_tables.py OUT [--plots]     tables on stdout; --plots writes OUT/plots/*.png (matplotlib)

Sections: machine and step status (machine.txt, status.tsv); GPU tests and seconds per forward_backward vs batch
(gpu/summary.txt, gpu/bench_gpu.csv); scaling efficiency per model, balancer and sweep (scaling/*/{strong,weak},
through bench/scaling/plot_scaling.py); interference (interference/runs/*/summary.json: speed-up vs BSP under the same
co-tenants, efficiency vs the oracle); predictors on the recorded telemetry (interference/runs/*/predict_eval.csv,
RMSE pooled over ranks and runs as in dev/experiments/telemetry_eval.py). Only the standard library is needed
for the tables. A missing section says why and the others still print; exit status 1 when OUT has no status.tsv.
"""
import argparse
import csv
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "scaling"))
import plot_scaling  # noqa: E402

PREDICTORS = ["narx", "arima", "ema", "last"]


def read(path):
    with open(path) as f:
        return f.read()


def status_section(out):
    lines = ["## Machine and steps", "", "```", read(os.path.join(out, "machine.txt")).rstrip(), "```", "",
             "| step | status | seconds | note |", "|---|---|---:|---|"]
    with open(os.path.join(out, "status.tsv")) as f:
        for row in csv.DictReader(f, delimiter="\t"):
            lines.append(f"| {row['step']} | {row['status']} | {row['seconds']} | {row['note'] or ''} |")
    return lines


def gpu_section(out):
    lines = ["## GPU (step 1)", ""]
    summary = os.path.join(out, "gpu", "summary.txt")
    if not os.path.exists(summary):
        return lines + ["No gpu/summary.txt: the GPU step did not run (see the status table)."]
    text = read(summary).splitlines()
    lines += [ln.strip() for ln in text if "PASSED" in ln or "FAILED" in ln or "RESULT" in ln][:10]
    bench = os.path.join(out, "gpu", "bench_gpu.csv")
    if os.path.exists(bench):
        with open(bench) as f:
            rows = list(csv.reader(f))
        if rows:
            lines += ["", "Seconds per forward_backward vs batch (bench_gpu.csv):", "",
                      "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
            lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    tables = [ln for ln in text if ln.startswith("|")]
    if tables:
        lines += ["", "Training runs on the GPU (gpu_check.sh's tables):", ""] + tables
    return lines


def scaling_section(out, plots):
    lines = ["## Scaling (step 2): parallel efficiency, one core per rank", ""]
    base = os.path.join(out, "scaling")
    sweeps = sorted(d for d in os.listdir(base)) if os.path.isdir(base) else []
    rows, ranks = [], set()
    for sweep in sweeps:
        for kind in ("strong", "weak"):
            folder = os.path.join(base, sweep, kind)
            if not os.path.isdir(folder):
                continue
            try:
                table = plot_scaling.analyse(plot_scaling.collect(folder))
            except SystemExit as e:
                lines.append(f"- {sweep}/{kind}: {e}")
                continue
            ranks.update(r["ranks"] for r in table)
            rows.append((sweep, kind, table))
            if plots:
                os.makedirs(os.path.join(out, "plots"), exist_ok=True)
                plot_scaling.plot(kind, table, os.path.join(out, "plots", f"{sweep}_{kind}.png"), sweep, 0)
    if not rows:
        return lines + ["No scaling results under scaling/."]
    ranks = sorted(ranks)
    lines += ["Efficiency (speed-up over the fewest ranks / ideal), samples/s in brackets; strong: fixed global batch, "
              "weak: fixed batch per rank.", "",
              "| model_balancer | sweep | batch | "
              + " | ".join(f"{n} rank{'s' if n > 1 else ''}" for n in ranks) + " |",
              "|---|---|---|" + "---:|" * len(ranks)]
    for sweep, kind, table in rows:
        by = {r["ranks"]: r for r in table}
        cells = [f"{by[n]['efficiency']:.0%} ({by[n]['samples_per_s']:.0f}/s)" if n in by else "-" for n in ranks]
        t0 = table[0]
        batch = f"{t0['global_batch']}" if kind == "strong" else f"{t0['global_batch'] // t0['ranks']} per rank"
        lines.append(f"| {sweep} | {kind} | {batch} | " + " | ".join(cells) + " |")
    return lines


def runs(out):
    base = os.path.join(out, "interference", "runs")
    return [(n, os.path.join(base, n)) for n in sorted(os.listdir(base))] if os.path.isdir(base) else []


def interference_section(out):
    lines = ["## Interference (step 3): pinned stress-ng co-tenants", ""]
    summaries = {}
    for name, d in runs(out):
        path = os.path.join(d, "summary.json")
        if os.path.exists(path):
            summaries[name] = json.loads(read(path))
    if not summaries:
        return lines + ["No interference/runs/*/summary.json."]
    bsp = next((s for n, s in summaries.items() if n.startswith("pinned-bsp")), None)
    oracle = next((s for n, s in summaries.items() if n.startswith("pinned-oracle")), None)
    lines += ["| run | ranks | balancer | mean iteration ms | wait fraction | samples/s | speed-up vs pinned BSP "
              "| of oracle |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, s in summaries.items():
        it = s["mean_iteration_s"]
        sp = f"{bsp['mean_iteration_s'] / it:.2f}x" if bsp else "-"
        eff = f"{oracle['mean_iteration_s'] / it:.3f}" if oracle else "-"
        lines.append(f"| {name} | {s.get('ranks', '?')} | {s.get('balancer', '?')} | {1e3 * it:.2f} | "
                     f"{s.get('wait_fraction', float('nan')):.3f} | {s.get('samples_per_s', float('nan')):.0f} | "
                     f"{sp} | {eff} |")
    cmd = os.path.join(runs(out)[0][1], "command.txt")
    if os.path.exists(cmd):
        lines += ["", f"Command (first run): `{read(cmd).strip()}`"]
    return lines


def predictor_section(out):
    lines = ["## Predictors on the recorded telemetry (step 3, `lbbsp predict-eval --telemetry-exo barrier`)", ""]
    scored = {}
    for name, d in runs(out):
        path = os.path.join(d, "predict_eval.csv")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            rows = {r["predictor"]: (int(r["steps"]), float(r["rmse"])) for r in csv.DictReader(f)
                    if r.get("family") == "all"}
        if all(p in rows for p in PREDICTORS):
            scored[name] = rows
    if not scored:
        return lines + ["No interference/runs/*/predict_eval.csv with all of " + ", ".join(PREDICTORS) + "."]
    lines += ["| runs | scored steps | NARX RMSE | ARIMA | EMA | last | NARX / EMA | NARX / ARIMA |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def row(label, group):
        n = sum(g["narx"][0] for g in group)
        r = {p: math.sqrt(sum(g[p][0] * g[p][1] ** 2 for g in group) / max(1, sum(g[p][0] for g in group)))
             for p in PREDICTORS}

        def ratio(a, b):
            return f"**{a / b:.3f}**" if b > 0 else "-"

        lines.append(f"| {label} | {n} | {r['narx']:.4g} | {r['arima']:.4g} | {r['ema']:.4g} | {r['last']:.4g} | "
                     f"{ratio(r['narx'], r['ema'])} | {ratio(r['narx'], r['arima'])} |")

    pinned = [s for n, s in scored.items() if n.startswith("pinned-")]
    if pinned:
        row(f"all pinned runs ({len(pinned)})", pinned)
    for name, s in scored.items():
        row(name, [s])
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the folder dev/device_check.sh wrote ($OUT, fetched)")
    ap.add_argument("--plots", action="store_true", help="also OUT/plots/*.png (needs matplotlib)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.out, "status.tsv")):
        sys.exit(f"device_tables: error: {a.out}/status.tsv missing: give the folder device_check.sh wrote")
    md = [f"# Device check: {os.path.basename(os.path.normpath(a.out))}", ""]
    for section in (status_section, gpu_section, lambda o: scaling_section(o, a.plots), interference_section,
                    predictor_section):
        try:
            md += section(a.out) + [""]
        except (OSError, ValueError, KeyError) as e:  # one broken section must not hide the others
            md += [f"(section failed: {type(e).__name__}: {e})", ""]
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
