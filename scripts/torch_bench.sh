#!/usr/bin/env bash
# Benchmark (not a test): 4 gloo ranks, the MLP on Fashion-MNIST, capacities 1,1,0.5,0.25 with the modelled cost
# the C++ experiments use (SLOPE s/sample / capacity; lbbsp train's `;gpu=0:0:SLOPE:1000000`): plain DDP vs
# DDP + lbbsp (lbbsp.torch) vs `lbbsp train` with the same settings, mean iteration time, time to the target test
# accuracy, efficiency against the modelled ideal (every rank busy: SLOPE x X / sum of capacities) and the
# controller's own cost.
#   scripts/torch_bench.sh [--python PY] [--lbbsp build/lbbsp] [--data data/fmnist.h5] [--iterations 300]
#                          [--out results/torch-bench]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3 LBBSP=build/lbbsp DATA=data/fmnist.h5 IT=300 OUT=results/torch-bench SLOPE=0.0003 X=512
while (($#)); do
  case $1 in
    --python) PY=$2; shift ;;
    --lbbsp) LBBSP=$2; shift ;;
    --data) DATA=$2; shift ;;
    --iterations) IT=$2; shift ;;
    --out) OUT=$2; shift ;;
    *) echo "torch_bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
"$PY" -c "import lbbsp.torch" 2>/dev/null || { echo "torch_bench.sh: $PY cannot import lbbsp.torch (pip install . into its venv)" >&2; exit 1; }
[[ -f $DATA ]] || "$LBBSP" data import-fashion-mnist --out "$DATA"
mkdir -p "$OUT"
common=(--data "$DATA" --model mlp --global-batch $X --lr 0.2 --seed 1 --max-iterations "$IT" --eval-every 25
        --test-subset 5000 --target-accuracy 0.85)
caps=1,1,0.5,0.25
echo "== plain DDP"; "$PY" scripts/torch_train.py "${common[@]}" --spawn 4 --plain-ddp --straggle $caps \
  --cost-slope $SLOPE --summary-json "$OUT/plain-ddp.json" | tail -1
echo "== DDP + lbbsp"; "$PY" scripts/torch_train.py "${common[@]}" --spawn 4 --balancer lbbsp-cpu --predictor narx \
  --straggle $caps --cost-slope $SLOPE --summary-json "$OUT/ddp-lbbsp.json" | tail -1
for b in lbbsp-cpu oracle; do
  echo "== lbbsp train $b"
  mpirun -n 4 --oversubscribe --bind-to none "$LBBSP" train "${common[@]}" --balancer $b --predictor narx \
    --lr-schedule constant --straggle "static:$caps;gpu=0:0:$SLOPE:1000000" --summary-json "$OUT/lbbsp-$b.json" \
    --quiet >/dev/null
done
"$PY" - "$OUT" $SLOPE $X $caps <<'PY'
import json, sys
out, slope, X, caps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), [float(c) for c in sys.argv[4].split(",")]
ideal = slope * X / sum(caps)
rows = [("plain DDP (torch %s)", "plain-ddp"), ("DDP + lbbsp lbbsp-cpu/narx", "ddp-lbbsp"),
        ("lbbsp train lbbsp-cpu/narx", "lbbsp-lbbsp-cpu"), ("lbbsp train oracle", "lbbsp-oracle")]
s = {k: json.load(open(f"{out}/{k}.json")) for _, k in rows}
base = s["plain-ddp"]["mean_iteration_s"]
print(f"\nideal iteration (every rank busy): {ideal * 1e3:.1f} ms\n")
print("| run | mean iteration | vs plain DDP | efficiency vs ideal | time to 0.85 | decide / step cost |")
print("|---|---:|---:|---:|---:|---:|")
for label, k in rows:
    r = s[k]
    it = r["mean_iteration_s"]
    t = r.get("time_to_target_s")
    cost = "%.2f%% / %.1f%%" % (100 * r["decide_fraction"], 100 * r["controller_fraction"]) if "decide_fraction" in r \
        else "%.2f%%" % (100 * r.get("balancer_overhead_fraction", 0.0))
    label = label % r.get("torch", "") if "%s" in label else label
    print(f"| {label} | {it * 1e3:.1f} ms | {base / it:.2f}x | {ideal / it:.3f} | "
          f"{'%.1f s' % t if t is not None else 'not reached'} | {cost} |")
PY
