# `lbbsp report`: on small real runs (BSP and LB-BSP under static stragglers, 4 ranks), its numbers against the
# telemetry read independently with h5py; side by side and figures; each bad input named, non-zero exit.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3
"$LBBSP" data synth --samples 4096 --features 64 --classes 4 --seed 1 --out "$SCRATCH/d.h5" >/dev/null
# 0.2 ms per sample / capacity (a linear modelled cost), so rank 3 at capacity 0.25 is 4x slower than ranks 0-1.
STRAGGLE="static:1,1,0.5,0.25;gpu=0:0:0.0002:1000000"
run() {
  local dir=$1 np=$2 bal=$3
  mpirun_n "$np" "$LBBSP" train --data "$SCRATCH/d.h5" --model logreg --global-batch 256 --epochs 10 \
    --max-iterations 60 --balancer "$bal" --predictor ema --straggle "$STRAGGLE" --test-subset 256 \
    --log-dir "$SCRATCH/$dir" --summary-json "$SCRATCH/$dir/summary.json" --quiet
}
run bsp 4 bsp
run lb 4 lbbsp-cpu
run two 2 bsp

"$LBBSP" report "$SCRATCH/bsp" "$SCRATCH/lb" --format json >"$SCRATCH/report.json"
"$LBBSP" report "$SCRATCH/bsp" "$SCRATCH/lb" >"$SCRATCH/report.md"
$PY - "$SCRATCH" <<'PY'
import json, sys
import h5py, numpy as np
d = sys.argv[1]
rep = {r["name"]: r for r in json.load(open(d + "/report.json"))}
md = open(d + "/report.md").read()

def close(a, b, what, rel=1e-6):
    assert abs(a - b) <= rel * max(abs(a), abs(b), 1e-12), f"{what}: report {a}, telemetry {b}"

for name in ["bsp", "lb"]:
    with h5py.File(f"{d}/{name}/telemetry.h5", "r") as f:
        t = {k: f["records"][k][:] for k in f["records"].keys()}
    R = 4
    n = len(t["iteration"]) // R
    g = {k: v.reshape(n, R) for k, v in t.items()}
    r = rep[name]
    assert r["ranks"] == R and r["iterations"] == n == 60, (r["ranks"], r["iterations"])
    time = g["compute_s"].max(1) + g["allreduce_s"][:, 0] + g["balancer_s"][:, 0]
    close(r["telemetry_time_s"], time.sum(), "telemetry run time")
    summary = json.load(open(f"{d}/{name}/summary.json"))
    assert r["time_from_summary"], r  # the summary covers the same 60 iterations: its loop time is the run's
    close(r["time_s"], summary["train_time_s"], "run time")
    close(r["mean_iteration_s"], summary["mean_iteration_s"], "mean iteration")
    close(r["wait_rank_s"], g["wait_s"].sum(), "wait")
    close(r["wait_fraction"], g["wait_s"].sum() / (R * summary["train_time_s"]), "wait fraction")
    for k in range(R):
        p = r["per_rank"][k]
        close(p["wait_s"], g["wait_s"][:, k].sum(), f"rank {k} wait")
        close(p["mean_batch"], g["batch"][:, k].mean(), f"rank {k} mean batch")
        close(p["compute_s"], g["compute_s"][:, k].sum(), f"rank {k} compute")
        m = (g["predicted_speed"][:, k] > 0) & (g["batch"][:, k] > 0)
        if m.any():
            a, q = g["actual_speed"][m, k], g["predicted_speed"][m, k]
            close(p["predictor_error"], np.mean(np.abs(q - a) / a), f"rank {k} predictor error")
        else:
            assert p["predictor_error"] is None, p
    # Equal split from the measured speeds (every rank has samples in these runs).
    assert (g["batch"] > 0).all()
    speed = g["batch"] / g["compute_s"]
    close(r["equal_split_s"], (64 / speed).max(1).sum(), "equal split estimate", 1e-5)
    close(r["ideal_s"], (256 / speed.sum(1)).sum(), "ideal estimate", 1e-5)
    close(r["compute_s"], g["compute_s"].max(1).sum(), "slowest compute")
    # Static capacities 0.5 and 0.25 make ranks 2 and 3 slow. The ranks share 2 cores with whatever else runs, so
    # only what holds under any load is checked: rank 3, 4x slower by emulation, straggles most of the run.
    eps = r["episodes"]
    e3 = [e for e in eps if e["rank"] == 3]
    assert len(e3) >= 1 and sum(e["slow_iterations"] for e in e3) >= 30, eps
    for e in eps:
        cap = {2: 0.5, 3: 0.25}.get(e["rank"], 1.0)
        assert abs(e["capacity"] - cap) < 1e-9 and abs(e["cpu_avail"] - cap) < 1e-6, e
        assert e["relative_speed"] < 0.8 and e["last"] - e["first"] + 1 >= 5, e
        assert e["slow_iterations"] <= e["last"] - e["first"] + 1, e
    if name == "bsp":
        # The equal split is what BSP did; rank 3 held the others up by its compute beyond rank 2's.
        close(r["equal_split_s"], r["compute_s"], "bsp equal split = as run", 1e-4)
        e3 = max(e3, key=lambda e: e["slow_iterations"])
        held = np.maximum(0, g["compute_s"][:, 3] - g["compute_s"][:, :3].max(1))
        held_in = held[(g["iteration"][:, 0] >= e3["first"]) & (g["iteration"][:, 0] <= e3["last"])].sum()
        close(e3["delay_s"], held_in, "rank 3 delay", 1e-6)
        assert e3["delay_s"] > 0.2, e3
    else:
        assert r["equal_split_s"] > 1.3 * r["compute_s"], (r["equal_split_s"], r["compute_s"])
    assert r["summary"]["test_accuracy"] == summary["test_accuracy"]
for want in ["## Side by side", "| bsp | bsp |", "| lb | lbbsp-cpu/ema |", "### Straggler episodes",
             "against an equal split", "| 3 | "]:
    assert want in md, f"markdown lacks {want!r}:\n{md}"
print("report numbers agree with the telemetry:", {k: round(v["mean_iteration_s"] * 1e3, 2) for k, v in rep.items()})
PY

# Figures and the HTML page.
"$LBBSP" report "$SCRATCH/bsp" "$SCRATCH/lb" --png "$SCRATCH/png" --html "$SCRATCH/html" >/dev/null
for f in png/iteration_time.png png/batch_split.png png/wait.png html/report.html html/wait.png; do
  [[ -s $SCRATCH/$f ]] || fail "report --png/--html did not write $f"
done
grep -q "<table>" "$SCRATCH/html/report.html" || fail "report.html has no table"
# One rank: no straggler analysis, still a report.
"$LBBSP" train --data "$SCRATCH/d.h5" --model logreg --max-iterations 5 --test-subset 64 --log-dir "$SCRATCH/one" \
  --quiet
"$LBBSP" report "$SCRATCH/one" | grep -q "One rank: no stragglers" || fail "one-rank report"

# Bad input: named, non-zero exit.
mkdir -p "$SCRATCH/empty"
expect_fail "'$SCRATCH/empty/telemetry.h5' not found" "$LBBSP" report "$SCRATCH/empty"
expect_fail "'$SCRATCH/nowhere' is not a folder" "$LBBSP" report "$SCRATCH/nowhere"
mkdir -p "$SCRATCH/trunc" "$SCRATCH/half"
head -c 1000 "$SCRATCH/lb/telemetry.h5" >"$SCRATCH/trunc/telemetry.h5"
expect_fail "'$SCRATCH/trunc/telemetry.h5'.*(truncated|corrupt)" "$LBBSP" report "$SCRATCH/trunc"
size=$(stat -c %s "$SCRATCH/lb/telemetry.h5")
head -c $((size / 2)) "$SCRATCH/lb/telemetry.h5" >"$SCRATCH/half/telemetry.h5"
expect_fail "'$SCRATCH/half/telemetry.h5'.*(truncated|corrupt)" "$LBBSP" report "$SCRATCH/half"
expect_fail "different rank counts: '$SCRATCH/bsp/telemetry.h5' has 4 ranks, '$SCRATCH/two/telemetry.h5' has 2" \
  "$LBBSP" report "$SCRATCH/bsp" "$SCRATCH/two"
cp -r "$SCRATCH/bsp" "$SCRATCH/badsum"
echo '{"model": ' >"$SCRATCH/badsum/summary.json"
expect_fail "'$SCRATCH/badsum/summary.json' is not valid JSON" "$LBBSP" report "$SCRATCH/badsum"
$PY - "$SCRATCH" <<'PY'
import shutil, sys, h5py
d = sys.argv[1]
shutil.copytree(d + "/bsp", d + "/rows")
with h5py.File(d + "/rows/telemetry.h5", "a") as f:
    w = f["records/wait_s"][:]
    del f["records/wait_s"]
    f["records/wait_s"] = w[:-3]
PY
expect_fail "'$SCRATCH/rows/telemetry.h5': /records/wait_s has 237 rows, /records/iteration has 240" \
  "$LBBSP" report "$SCRATCH/rows"
expect_fail "report_figures.py, not found at '$SCRATCH/empty/report_figures.py'" \
  env LBBSP_REPORT_FIGURES="$SCRATCH/empty/report_figures.py" "$LBBSP" report "$SCRATCH/bsp" --png "$SCRATCH/png2"
echo "test_report: ok"
