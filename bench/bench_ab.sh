#!/usr/bin/env bash
# Two builds of bench_models side by side (before/after a change) on the same machine in the same run: train-step
# samples/s of A and B per model, batch and thread count, alternating A and B each round, best round each. One
# thread: process CPU time; more: wall time (as bench_models reports them).
#
# usage: bench/bench_ab.sh A_BENCH B_BENCH [--threads 1,2] [--rounds 3] [--min-time 0.5]
#   e.g. bench/bench_ab.sh ../main/build/bench/bench_models build/bench/bench_models --threads 1,2
set -euo pipefail
(($# >= 2)) || { sed -n '2,7p' "$0" >&2; exit 2; }
a=$1 b=$2
shift 2
threads=1,2 rounds=3 min_time=0.5
while (($#)); do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    *) echo "bench_ab.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for bin in "$a" "$b"; do [[ -x $bin ]] || { echo "bench_ab.sh: '$bin' is not an executable bench_models" >&2; exit 1; }; done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
IFS=, read -ra thread_counts <<<"$threads"
for ((r = 0; r < rounds; ++r)); do
  for t in "${thread_counts[@]}"; do
    OMP_NUM_THREADS=$t "$a" --threads="$t" --benchmark_filter='^train_step/' --benchmark_min_time="$min_time" \
      --benchmark_format=json >"$out/A.$t.$r.json" 2>/dev/null
    OMP_NUM_THREADS=$t "$b" --threads="$t" --benchmark_filter='^train_step/' --benchmark_min_time="$min_time" \
      --benchmark_format=json >"$out/B.$t.$r.json" 2>/dev/null
  done
done
python3 - "$out" "$threads" <<'PY'
import glob, json, os, re, sys
best = {}
for path in glob.glob(os.path.join(sys.argv[1], "*.json")):
    side, t = os.path.basename(path).split(".")[:2]
    for x in json.load(open(path))["benchmarks"]:
        m = re.match(r"train_step/(\w+)/batch:(\d+)", x["name"])
        if m and x.get("run_type") != "aggregate":
            k = (side, int(t), m.group(1), int(m.group(2)))
            best[k] = max(best.get(k, 0.0), x["items_per_second"])
threads = [int(t) for t in sys.argv[2].split(",")]
print("| model | batch | threads | A samples/s | B samples/s | B / A |")
print("|---|---:|---:|---:|---:|---:|")
for model, batch in sorted({k[2:] for k in best}, key=lambda k: (["logreg", "mlp", "cnn"].index(k[0]), k[1])):
    for t in threads:
        a, b = best.get(("A", t, model, batch)), best.get(("B", t, model, batch))
        if a and b:
            print(f"| {model} | {batch} | {t} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")
PY
