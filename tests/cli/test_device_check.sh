#!/usr/bin/env bash
# dev/device_check.sh --dry-run at its smallest (scaling 1 and 2 ranks, 2-rank interference): every step leaves
# its status line and well-formed result files (summary.json per scaling run, telemetry and a predict-eval score
# per interference run, the tables), "no GPU" and "not present" are statuses, not failures. Then a run whose
# dataset is missing: the scaling and interference steps fail, the script still reaches the last step and exits 1.
source "$(dirname "$0")/common.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
command -v stress-ng >/dev/null || fail "needs stress-ng (scripts/setup.sh installs it)"

out=$SCRATCH/dry
OUT=$out timeout 500 "$ROOT/dev/device_check.sh" --dry-run --lbbsp "$LBBSP" --ranks "1 2" >"$SCRATCH/dry.log" 2>&1 ||
  { cat "$SCRATCH/dry.log"; fail "device_check.sh --dry-run failed"; }

# status.tsv: a header and one line of four tab-separated fields per step, in the script's order.
awk -F'\t' 'NR == 1 && $0 != "step\tstatus\tseconds\tnote" {exit 1} NF != 4 {exit 1}' "$out/status.tsv" ||
  fail "status.tsv is not 'step status seconds note' with 4 fields a line: $(cat "$out/status.tsv")"
steps=$(awk -F'\t' 'NR > 1 {print $1}' "$out/status.tsv" | tr '\n' ' ')
# The dry run times the kernels on 1 and 2 threads, as many of them as the cores it may use (one under taskset).
kernel_steps="kernels_threads_1 "
(($(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) >= 2)) && kernel_steps+="kernels_threads_2 "
# The torch step: lbbsp.torch's CUDA tests, then the benchmark, where the python can import lbbsp.torch.
has_torch=0
compgen -G "$ROOT/bench/torch_bench*" >/dev/null && ${LBBSP_TORCH_PYTHON:-python3} -c "import lbbsp.torch" 2>/dev/null &&
  has_torch=1
torch_steps="torch"
((has_torch)) && torch_steps="torch_cuda torch"
want="gpu data_synth scaling_mlp_bsp scaling_mlp_lbbsp-cpu scaling_cnn_bsp scaling_cnn_lbbsp-cpu \
interference_pinned-bsp-p0.5-s1 interference_pinned-narx-p0.5-s1 interference_pinned-oracle-p0.5-s1 \
interference_quiet-bsp-p0-s1 $torch_steps kernels_tests ${kernel_steps}telemetry "
[[ $steps == "$want" ]] || fail "steps in status.tsv: '$steps', expected '$want'"
st() { awk -F'\t' -v s="$1" '$1 == s {print $2}' "$out/status.tsv"; }
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  [[ $(st gpu) == ok ]] || fail "gpu step: '$(st gpu)' on a machine with a GPU"
else
  [[ $(st gpu) == "no GPU" ]] || fail "gpu step without a GPU: '$(st gpu)', expected 'no GPU'"
fi
if ((has_torch)); then
  [[ $(st torch) == ok ]] || fail "torch step: '$(st torch)'"
else
  [[ $(st torch) == "not present" ]] || fail "torch step: '$(st torch)', expected 'not present'"
fi
for s in $steps; do
  [[ $s == gpu || $s == torch ]] && continue
  [[ $(st "$s") == ok ]] || fail "step $s: '$(st "$s")' ($(tail -n 5 "$out/$s.log" 2>/dev/null))"
done
grep -q "^mode: dry-run" "$out/machine.txt" || fail "machine.txt lacks 'mode: dry-run'"

# Scaling: one summary.json per sweep and rank count, with its rank count and a positive throughput; the ranks
# were bound to cores by mpirun.
$PY - "$out/scaling" <<'PY' || fail "scaling summaries malformed"
import json, sys, os
for sweep in ("mlp_bsp", "mlp_lbbsp-cpu", "cnn_bsp", "cnn_lbbsp-cpu"):
    for kind in ("strong", "weak"):
        for n in (1, 2):
            s = json.load(open(os.path.join(sys.argv[1], sweep, kind, f"ranks-{n}", "summary.json")))
            assert s["ranks"] == n and s["samples_per_s"] > 0, (sweep, kind, n, s)
            assert s["balancer"] == sweep.split("_")[1], (sweep, s["balancer"])
            assert s["model"] == sweep.split("_")[0], (sweep, s["model"])
PY
grep -q "bound to" "$out/scaling/mlp_bsp/strong/ranks-2/train.log" || fail "scaling runs not bound to cores"
grep -q "^| 2 | 256 |" "$out/scaling/mlp_bsp/scaling.md" || fail "no 2-rank row in mlp_bsp/scaling.md"

# Interference: telemetry, a summary with the balancer asked for, and a score for each of the four predictors.
for run in pinned-bsp-p0.5-s1:bsp pinned-narx-p0.5-s1:lbbsp-cpu pinned-oracle-p0.5-s1:oracle quiet-bsp-p0-s1:bsp; do
  d=$out/interference/runs/${run%%:*}
  [[ -s $d/telemetry.h5 ]] || fail "no telemetry in $d"
  grep -q "\"balancer\": *\"${run#*:}\"" "$d/summary.json" || fail "$d/summary.json: balancer is not ${run#*:}"
  for p in narx arima ema last; do
    grep -qE "^all,$p,[1-9][0-9]*," "$d/predict_eval.csv" || fail "$d/predict_eval.csv: no scored row for $p"
  done
done
grep -q "stress:1=100;pin=0,1;period=0.5" "$out/interference/runs/pinned-bsp-p0.5-s1/command.txt" ||
  fail "pinned runs without the pinned co-tenant spec"

# Kernels: one Google Benchmark JSON per thread count with the CNN's train step at batch 256 and the FMA peak.
for t in $(grep -oE 'kernels_threads_[0-9]+' <<<"$kernel_steps" | grep -oE '[0-9]+$'); do
  $PY - "$out/kernels/threads-$t.json" <<'PY' || fail "kernels/threads-$t.json malformed"
import json, sys
names = {b["name"] for b in json.load(open(sys.argv[1]))["benchmarks"]}
assert any(n.startswith("train_step/cnn/batch:256") for n in names), names
assert any(n.startswith("peak/fma") for n in names), names
PY
done
# Telemetry: a pair of runs without and with the logs, and the medians.
grep -q "^pair 1: without logs [0-9.]* s, with --log-dir and --timeline [0-9.]* s" "$out/telemetry.log" ||
  fail "telemetry.log has no pair line: $(tail -n 3 "$out/telemetry.log")"
grep -q "^median wall: without" "$out/telemetry.log" || fail "telemetry.log has no medians"

# The tables: every section, a row per interference run, the pooled predictor row.
for h in "## Machine and steps" "## Scaling" "## Interference" "## Predictors"; do
  grep -q "^$h" "$out/tables.md" || fail "tables.md lacks '$h'"
done
grep -q "^| pinned-narx-p0.5-s1 | 2 | lbbsp-cpu |" "$out/tables.md" || fail "tables.md: no narx interference row"
grep -q "^| all pinned runs (3) |" "$out/tables.md" || fail "tables.md: no pooled predictor row"
grep -q "^| mlp_bsp | weak | 64 per rank |" "$out/tables.md" || fail "tables.md: no mlp_bsp weak row"

# A step that fails does not stop the others: no dataset, so scaling and interference fail, torch still reports.
rc=0
OUT=$SCRATCH/broken DEVICE_CHECK_FMNIST=$SCRATCH/missing.h5 timeout 500 "$ROOT/dev/device_check.sh" --dry-run \
  --lbbsp "$LBBSP" --ranks "1" --steps scaling,interference,torch >"$SCRATCH/broken.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || fail "missing dataset: exit $rc, expected 1 ($(tail -n 5 "$SCRATCH/broken.log"))"
awk -F'\t' '$1 == "scaling_mlp_bsp" && $2 ~ /^failed/ {f = 1} END {exit !f}' "$SCRATCH/broken/status.tsv" ||
  fail "missing dataset: scaling_mlp_bsp not marked failed: $(cat "$SCRATCH/broken/status.tsv")"
awk -F'\t' '$1 == "torch" {f = 1} END {exit !f}' "$SCRATCH/broken/status.tsv" ||
  fail "missing dataset: the torch step did not run after the failures"
expect_fail "unknown step 'gpus'" "$ROOT/dev/device_check.sh" --dry-run --steps gpus
echo "device_check dry run: ok"
