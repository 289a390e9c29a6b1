#!/usr/bin/env bash
# Benchmark (not a test): 4 gloo ranks, the MLP on Fashion-MNIST, capacities 1,1,0.5,0.25 with the modelled cost
# the C++ experiments use (SLOPE s/sample / capacity; lbbsp train's `;gpu=0:0:SLOPE:1000000`): plain DDP vs
# DDP + lbbsp (lbbsp.torch) vs `lbbsp train` with the same settings, mean iteration time, time to the target test
# accuracy, efficiency against the modelled ideal (every rank busy: SLOPE x X / sum of capacities) and the
# controller's own cost.
#   bench/torch_bench.sh [--python PY] [--lbbsp build/lbbsp] [--data data/fmnist.h5] [--iterations 300]
#                          [--out results/torch-bench] [--pairs 1] [--dry-run]
# --pairs N: N runs each of DDP + lbbsp and its oracle per placement, alternated (the first N-1 extra after the
#   main table's), and a table of lbbsp's ratio to its oracle pair by pair with the median: on a noisy machine one
#   pair moves several %.
# Last, with no straggler, lbbsp-cpu against the equal split (--pairs N alternated pairs): it should keep the split.
# --dry-run: 2 ranks, 12 iterations, no accuracy target (checks that everything runs, measures nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3 LBBSP=build/lbbsp DATA=data/fmnist.h5 IT=700 OUT=results/torch-bench SLOPE=0.0003 X=512 DRY=0 PAIRS=1
while (($#)); do
  case $1 in
    --python) PY=$2; shift ;;
    --lbbsp) LBBSP=$2; shift ;;
    --data) DATA=$2; shift ;;
    --iterations) IT=$2; shift ;;
    --out) OUT=$2; shift ;;
    --pairs) PAIRS=$2; shift ;;
    --dry-run) DRY=1 ;;
    *) echo "torch_bench.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
[[ $PAIRS =~ ^[1-9][0-9]*$ ]] ||
  { echo "torch_bench.sh: --pairs must be a whole number >= 1, got '$PAIRS'" >&2; exit 2; }
"$PY" -c "import lbbsp.torch" 2>/dev/null || { echo "torch_bench.sh: $PY cannot import lbbsp.torch (pip install . into its venv)" >&2; exit 1; }
mkdir -p "$OUT"
[[ $(id -u) -ne 0 ]] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
caps=1,1,0.5,0.25 R=4
if ((DRY)); then  # synthetic data of the Fashion-MNIST layout, tiny run
  DATA=$OUT/dry.h5 IT=12 caps=1,0.5 R=2 X=64
  "$LBBSP" data synth --samples 2000 --features 784 --classes 10 --seed 1 --out "$DATA" >/dev/null
fi
[[ -f $DATA ]] || "$LBBSP" data import-fashion-mnist --out "$DATA"
common=(--data "$DATA" --model mlp --global-batch $X --lr 0.2 --seed 1 --epochs 20 --max-iterations "$IT" --eval-every 25
        --test-subset 5000 --target-accuracy 0.85)
# lbbsp.torch's runs: examples/torch_fmnist.py with the batches sliced from memory in the loop (no DataLoader).
torch_run() { "$PY" examples/torch_fmnist.py --workers 0 --read memory "$@"; }
# Where the emulated cost lands in the step (forward, loading, after backward) and, as "loader", the forward
# placement with the batches read by a DataLoader with 2 workers: plain DDP and DDP + lbbsp for each.
variants=("forward:--cost-at forward" "load:--cost-at load" "after-backward:--cost-at after-backward"
          "loader:--cost-at forward --workers 2")
# DDP + lbbsp and its oracle (the best fixed split for the known capacities, the cost in the same place, the
# same runtime) for one placement; $3 ends the JSON's name.
lbbsp_and_oracle() {
  local name=$1 args=$2 tag=$3
  echo "== DDP + lbbsp, $name$tag"; torch_run "${common[@]}" --spawn $R --balancer lbbsp-cpu \
    --predictor narx --straggle $caps --cost-slope $SLOPE $args --summary-json "$OUT/ddp-lbbsp-$name$tag.json" |
    tail -1
  echo "== DDP, oracle split, $name$tag"; torch_run "${common[@]}" --spawn $R --oracle \
    --straggle $caps --cost-slope $SLOPE $args --summary-json "$OUT/ddp-oracle-$name$tag.json" | tail -1
}
for v in "${variants[@]}"; do
  name=${v%%:*} args=${v#*:}
  echo "== plain DDP, $name"; torch_run "${common[@]}" --spawn $R --plain-ddp --straggle $caps \
    --cost-slope $SLOPE $args --summary-json "$OUT/plain-ddp-$name.json" | tail -1
  lbbsp_and_oracle "$name" "$args" ""
done
for ((pair = 2; pair <= PAIRS; pair++)); do
  for v in "${variants[@]}"; do lbbsp_and_oracle "${v%%:*}" "${v#*:}" "-$pair"; done
done
# No straggler: lbbsp-cpu against the equal split it should keep (every rank's modelled cost alike), alternated.
for ((pair = 1; pair <= PAIRS; pair++)); do
  for b in bsp lbbsp-cpu; do
    echo "== DDP + lbbsp $b, no straggler, pair $pair"; torch_run "${common[@]}" --spawn $R \
      --balancer $b --predictor narx --straggle 1 --cost-slope $SLOPE --summary-json "$OUT/even-$b-$pair.json" |
      tail -1
  done
done
for b in lbbsp-cpu oracle; do
  echo "== lbbsp train $b"
  mpirun -n $R --oversubscribe --bind-to none "$LBBSP" train "${common[@]}" --balancer $b --predictor narx \
    --lr-schedule constant --straggle "static:$caps;gpu=0:0:$SLOPE:1000000" --summary-json "$OUT/lbbsp-$b.json" \
    --quiet >/dev/null
done
"$PY" - "$OUT" $SLOPE $X $caps $PAIRS <<'PY'
import json, statistics, sys
out, slope, X, caps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), [float(c) for c in sys.argv[4].split(",")]
pairs = int(sys.argv[5])
def modelled(r):
    """The cost model's slowest rank (samples / capacity), mean over the run's steps: the split's quality alone,
    free of the machine's noise (None where the run kept no batch sizes)."""
    bs = r.get("batch_sizes")
    return sum(max(b / caps[i % len(caps)] for i, b in enumerate(v)) for v in bs) / len(bs) if bs else None
def row(label, r, base, oracle, oracle_split=None):
    it, t = r["mean_iteration_s"], r.get("time_to_target_s")
    mine = modelled(r) if oracle_split else None
    split = "%.3f" % (oracle_split / mine) if mine else "-"
    cost = "%.2f%% / %.2f%%" % (100 * r["decide_fraction"], 100 * r["controller_fraction"]) if "decide_fraction" in r \
        else "%.2f%%" % (100 * r.get("balancer_overhead_fraction", 0.0))
    vs = f"{base / it:.2f}x" if base else "-"
    print(f"| {label} | {it * 1e3:.1f} ms | {vs} | {oracle / it:.3f} | {split} | {ideal / it:.3f} | "
          f"{'%.1f s' % t if t is not None else 'not reached'} | {cost} |")
load = lambda k: json.load(open(f"{out}/{k}.json"))
ideal = slope * X / sum(caps)
print(f"\nideal iteration (every rank busy): {ideal * 1e3:.1f} ms; torch {load('ddp-oracle-forward')['torch']}\n")
print("| run | mean iteration | vs plain DDP | vs its oracle | split vs the oracle's (modelled) | vs ideal | "
      "time to 0.85 | decide / step() cost |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name in ("forward", "load", "after-backward", "loader"):
    plain, oracle = load(f"plain-ddp-{name}"), load(f"ddp-oracle-{name}")
    base, best, best_split = plain["mean_iteration_s"], oracle["mean_iteration_s"], modelled(oracle)
    row(f"plain DDP, cost {name}", plain, base, best, best_split)
    row(f"DDP + lbbsp, cost {name}", load(f"ddp-lbbsp-{name}"), base, best, best_split)
    row(f"DDP, oracle split, cost {name}", oracle, base, best, best_split)
lo = load("lbbsp-oracle")["mean_iteration_s"]
row("lbbsp train lbbsp-cpu/narx", load("lbbsp-lbbsp-cpu"), 0, lo)
row("lbbsp train oracle", load("lbbsp-oracle"), 0, lo)
print(f"\nNo straggler (`--straggle 1`): lbbsp-cpu against the equal split, {pairs} alternated pair(s); the split's "
      "distance from equal in samples (the largest over the run, and the mean over steps of the largest rank's):\n")
print("| pair | equal split | lbbsp-cpu | equal / lbbsp-cpu | largest distance | mean distance |\n|---|---:|---:|---:|---:|---:|")
for p in range(1, pairs + 1):
    even, mine = load(f"even-bsp-{p}"), load(f"even-lbbsp-cpu-{p}")
    share = X / len(mine["final_batch_sizes"])
    dist = [max(abs(b - share) for b in v) for v in mine["batch_sizes"]]
    print(f"| {p} | {even['mean_iteration_s'] * 1e3:.1f} ms | {mine['mean_iteration_s'] * 1e3:.1f} ms | "
          f"{even['mean_iteration_s'] / mine['mean_iteration_s']:.3f} | {max(dist):.0f} of {share:.0f} | "
          f"{sum(dist) / len(dist):.1f} |")
if pairs > 1:
    print(f"\nDDP + lbbsp against its oracle, {pairs} alternated pairs (mean iteration of the oracle / of lbbsp):\n")
    print("| placement | pair by pair | median |\n|---|---|---:|")
    tags = [""] + [f"-{p}" for p in range(2, pairs + 1)]  # the first pair is the main table's
    for name in ("forward", "load", "after-backward", "loader"):
        ratios = [load(f"ddp-oracle-{name}{t}")["mean_iteration_s"] / load(f"ddp-lbbsp-{name}{t}")["mean_iteration_s"]
                  for t in tags]
        print(f"| {name} | {', '.join('%.3f' % r for r in ratios)} | {statistics.median(ratios):.3f} |")
PY
