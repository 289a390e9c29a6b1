#!/usr/bin/env bash
# dev/experiments/telemetry_eval.py end to end on a tiny recording: a trace of this test's own (capacity steps
# every 0.5 s of replay), replayed by iteration (--tick) under the heavy and sleep4k settings, 4 ranks, 60
# iterations; the predictors are scored on the run's telemetry (table b) and telemetry_limits.py reads the same
# folder. Then --eval-only re-scores the recorded runs to the same table. Last, telemetry_limits.py on synthetic
# telemetry whose speeds follow only what no predictor has (the next step's capacity, another rank's next batch).
source "$(dirname "$0")/common.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
$PY -c "import numpy, h5py" 2>/dev/null || fail "needs numpy and h5py for $PY (scripts/setup.sh installs them)"

"$LBBSP" data synth --samples 4096 --features 784 --classes 10 --seed 1 --out "$SCRATCH/synth.h5" >/dev/null
mkdir -p "$SCRATCH/traces/steps_test"
$PY - "$SCRATCH/traces/steps_test/steps.csv" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write("time_s,capacity\n")
    for i in range(400):
        f.write(f"{i * 0.5},{(0.3, 1.0, 0.6, 0.8)[(i * 7 + i // 3) % 4]}\n")
PY
timeout 500 $PY "$ROOT/dev/experiments/telemetry_eval.py" --lbbsp "$LBBSP" --data "$SCRATCH/synth.h5" \
  --traces "$SCRATCH/traces/steps_test" --seeds 1 --settings heavy,sleep4k --tick 0.1 --iterations 60 \
  --out "$SCRATCH/te" >"$SCRATCH/log.txt" 2>&1 || { cat "$SCRATCH/log.txt"; fail "telemetry_eval.py failed"; }
[[ -s $SCRATCH/te/runs/heavy-tick-steps-s1/telemetry.h5 ]] || fail "no telemetry recorded under runs/heavy-tick-steps-s1"
grep -q "tick=0.1" "$SCRATCH/te/runs/heavy-tick-steps-s1/command.txt" || fail "--tick did not reach --straggle"
grep -q -- "--global-batch 256 " "$SCRATCH/te/runs/heavy-tick-steps-s1/command.txt" || fail "heavy: not global batch 256"
grep -q -- "--global-batch 4096 " "$SCRATCH/te/runs/sleep4k-tick-steps-s1/command.txt" ||
  fail "sleep4k: not global batch 4096"
grep -q "^| sleep4k-tick | 1 |" "$SCRATCH/te/table_b.md" || fail "no sleep4k-tick row in table (b)"

$PY - "$SCRATCH/te/table_b.md" <<'PY'
import sys
rows = [l for l in open(sys.argv[1]) if l.startswith("| heavy-tick |")]
assert len(rows) == 1, open(sys.argv[1]).read()
cells = [c.strip().strip("*") for c in rows[0].strip().strip("|").split("|")]
runs, steps = int(cells[1]), int(cells[2])
narx, arima, ema, last, vs_ema, vs_arima = map(float, cells[3:9])
assert runs == 1 and steps > 4 * 40, cells
assert min(narx, arima, ema, last) > 0, cells
assert abs(vs_ema - narx / ema) < 0.01 and abs(vs_arima - narx / arima) < 0.01, cells
print("ok: table (b) row", cells)
PY

cp "$SCRATCH/te/table_b.md" "$SCRATCH/table_first.md"
$PY "$ROOT/dev/experiments/telemetry_eval.py" --lbbsp "$LBBSP" --eval-only "$SCRATCH/te" >/dev/null 2>&1 ||
  fail "--eval-only failed"
cmp -s "$SCRATCH/te/table_b.md" "$SCRATCH/table_first.md" || fail "--eval-only scored the run differently"

$PY "$ROOT/dev/experiments/telemetry_limits.py" "$SCRATCH/te" >"$SCRATCH/limits.md" 2>/dev/null ||
  fail "telemetry_limits.py failed"
grep -q "^| heavy-tick | 4 |" "$SCRATCH/limits.md" || { cat "$SCRATCH/limits.md"; fail "no heavy-tick row of 4 series"; }
echo "ok: telemetry_eval.py --tick, --eval-only and telemetry_limits.py agree on the recorded run"

# Synthetic: rank 0's speed follows its own next capacity (i.i.d. per step, reported as cpu_avail one step late),
# rank 1's the batch rank 0 gets next; the past explains neither, the oracle inputs both exactly.
mkdir -p "$SCRATCH/syn/runs/synth-x-s1"
$PY - "$SCRATCH/syn/runs/synth-x-s1/telemetry.h5" <<'PY'
import sys, h5py, numpy as np
rng, n = np.random.default_rng(3), 300
cap, b0 = rng.uniform(0.3, 1.0, n), rng.integers(40, 200, n)
it = np.repeat(np.arange(n), 2)
rank = np.tile([0, 1], n)
speed = np.column_stack([1000 * cap, 500 + 2 * b0]).ravel()
batch = np.column_stack([b0, rng.integers(40, 200, n)]).ravel()  # rank 1 alone does not know b0
capacity = np.column_stack([cap, np.ones(n)]).ravel()
cpu = np.column_stack([np.r_[1.0, cap[:-1]], np.ones(n)]).ravel()  # rank 0 reports its capacity a step late
with h5py.File(sys.argv[1], "w") as f:
    g = f.create_group("records")
    for k, v in dict(iteration=it, rank=rank.astype(np.int32), batch=batch, actual_speed=speed, capacity=capacity,
                     cpu_avail=cpu, mem_avail=np.full(2 * n, 0.5), load=np.full(2 * n, 0.5)).items():
        g[k] = v
PY
$PY "$ROOT/dev/experiments/telemetry_limits.py" --per-rank "$SCRATCH/syn" >"$SCRATCH/syn.md" ||
  fail "telemetry_limits.py failed on synthetic telemetry"
$PY - "$SCRATCH/syn.md" <<'PY'
import sys
text = open(sys.argv[1]).read()
rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in text.splitlines() if "synth-x-s1 rank" in l]
assert len(rows) == 2, text
for cells in rows:
    hindsight, oracle = float(cells[3]), float(cells[4])
    assert hindsight > 0.5, f"the past explained an i.i.d. next step: {cells}"
    assert oracle < 0.01, f"the oracle inputs did not explain the speed: {cells}"
print("ok: telemetry_limits.py oracle column", rows)
PY
