#!/usr/bin/env bash
# Wall time of a long run with rank 0's logs (--log-dir and --timeline) against the same run without, alternating
# so that a noisy machine slows both alike; prints every run and the ratio of the medians (docs/results/telemetry.md).
# Logistic regression, 4 ranks, lbbsp-cpu/ema, global batch 64, no evaluation until the end.
#   bench/telemetry_overhead.sh [--iterations 120000] [--pairs 3] [--ranks 4] [--data data/fmnist.h5]
#                               [--lbbsp build/lbbsp] [--mpirun mpirun] [--out DIR]
# The medians need a python3; without one the pairs are printed all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=120000 pairs=3 ranks=4 data=data/fmnist.h5 lbbsp=build/lbbsp out=results/telemetry-overhead mpirun=mpirun
while [[ $# -gt 0 ]]; do
  case $1 in
    --iterations) iterations=$2 ;;
    --pairs) pairs=$2 ;;
    --ranks) ranks=$2 ;;
    --data) data=$2 ;;
    --lbbsp) lbbsp=$2 ;;
    --out) out=$2 ;;
    --mpirun) mpirun=$2 ;;
    *) echo "telemetry_overhead.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -f $data ]] || { echo "no '$data': build/lbbsp data import-fashion-mnist --out $data" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
mkdir -p "$out"
run() {  # run NAME EXTRA_FLAGS...: prints the command's wall seconds
  local name=$1 t0 t1; shift
  rm -rf "${out:?}/$name"; mkdir -p "$out/$name"
  t0=$(date +%s.%N)
  "$mpirun" -n "$ranks" --oversubscribe --bind-to none "$lbbsp" train --data "$data" --model logreg --epochs 100000 \
    --max-iterations "$iterations" --global-batch 64 --balancer lbbsp-cpu --predictor ema --eval-every 1000000 \
    --quiet --summary-json "$out/$name/summary.json" "$@"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", b - a}'
}
plain=() logged=()
for p in $(seq "$pairs"); do
  plain+=("$(run "plain-$p")")
  logged+=("$(run "logged-$p" --log-dir "$out/logged-$p" --timeline "$out/logged-$p/timeline.json")")
  echo "pair $p: without logs ${plain[-1]} s, with --log-dir and --timeline ${logged[-1]} s"
done
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3 || true)
[[ -n $py ]] || { echo "no python3: medians not computed"; exit 0; }
"$py" - "$out" "$pairs" "${plain[@]}" "${logged[@]}" <<'PY'
import json, os, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
plain, logged = [float(x) for x in sys.argv[3:3 + n]], [float(x) for x in sys.argv[3 + n:]]
io = [json.load(open(f"{out}/logged-{p}/summary.json"))["io_s"] for p in range(1, n + 1)]
size = [os.path.getsize(f"{out}/logged-{p}/{f}") / 2**20 for p in range(1, n + 1)
        for f in ("telemetry.h5", "timeline.json")]
print(f"median wall: without {statistics.median(plain):.2f} s, with {statistics.median(logged):.2f} s, "
      f"ratio {statistics.median(logged) / statistics.median(plain):.3f}")
print("pairwise ratios:", " ".join(f"{b / a:.3f}" for a, b in zip(plain, logged)))
print(f"rank 0 io_s: {' '.join(f'{x:.2f}' for x in io)}; telemetry.h5 / timeline.json MB: "
      f"{size[0]:.1f} / {size[1]:.1f}")
PY
