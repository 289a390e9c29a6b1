#!/usr/bin/env bash
# Train-step throughput of our models (bench_models) against PyTorch on the same machine, in the same run,
# with the same thread count. Prints a markdown table: model, batch, ours and PyTorch samples/s, the ratio,
# our GFLOP/s and its fraction of the estimated peak of the cores used.
#
# usage: scripts/bench_vs_pytorch.sh [--threads N] [--build-dir DIR] [--min-time SECONDS] [--rounds R]
#   The two programs alternate R times (default 2) and each keeps its best round, so a burst of load from
#   other jobs on a shared machine hits both alike. With one thread both sides are timed in process CPU
#   time; with more, in wall time. Needs a python3 that imports torch (set PYTHON to choose one).
set -euo pipefail

threads=1 build_dir=build min_time=1 rounds=2
while (($#)); do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench_vs_pytorch.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bench="$build_dir/bench/bench_models"
if [[ ! -x $bench ]]; then
  echo "building bench_models in $build_dir ..." >&2
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build_dir" -j2 --target bench_models >/dev/null
fi

python=""
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [[ -z $python ]]; then
  echo "bench_vs_pytorch.sh: no python3 with torch found (apt-get install python3-torch, or set PYTHON)" >&2
  exit 1
fi

# Both sides get the same threads, in OpenMP and in OpenBLAS (PyTorch's Debian build calls OpenBLAS too).
# Passive OpenMP waiting: spinning OpenMP workers would fight the BLAS's pthreads (see models/model.cpp).
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((r = 0; r < rounds; ++r)); do
  "$bench" --threads="$threads" --benchmark_filter='^train_step/' --benchmark_min_time="$min_time" \
    --benchmark_format=json >"$out/ours.$r.json"
  "$python" scripts/peers/pytorch_step.py --threads "$threads" --min-seconds "$min_time" >"$out/torch.$r.jsonl"
done

"$python" - "$out" "$threads" "$rounds" <<'PY'
import glob, json, os, re, subprocess, sys

out, threads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
use_cpu = threads == 1

ours, flops = {}, {}
for path in glob.glob(os.path.join(out, "ours.*.json")):
    for b in json.load(open(path))["benchmarks"]:
        m = re.match(r"train_step/(\w+)/batch:(\d+)", b["name"])
        if not m or b.get("run_type") == "aggregate":
            continue
        key = (m.group(1), int(m.group(2)))
        ours[key] = max(ours.get(key, 0.0), b["items_per_second"])
        flops[key] = max(flops.get(key, 0.0), b["GFLOP/s"])
theirs, torch_version = {}, "?"
for path in glob.glob(os.path.join(out, "torch.*.jsonl")):
    for line in open(path):
        r = json.loads(line)
        key = (r["model"], r["batch"])
        rate = r["cpu_samples_per_s"] if use_cpu else r["samples_per_s"]
        theirs[key] = max(theirs.get(key, 0.0), rate)
        torch_version = r["torch"]

# Peak FLOP/s: vector width from the CPU flags, two FMA pipes per core (true of Zen 2/3/4 and Intel cores
# since Haswell), 2 flops per FMA lane, at the clock /proc/cpuinfo reports.
info = open("/proc/cpuinfo").read()
flags = set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
lanes = 16 if "avx512f" in flags else 8 if {"avx2", "fma"} <= flags else 4
isa = "AVX-512" if lanes == 16 else "AVX2+FMA" if lanes == 8 else "SSE"
mhz = [float(x) for x in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)]
ghz = max(mhz) / 1000 if mhz else 2.0
model_name = (re.search(r"^model name\s*:\s*(.*)$", info, re.M) or [None, "unknown CPU"])[1]
peak = ghz * lanes * 2 * 2 * threads  # GFLOP/s

print(f"Train step (forward_backward + SGD step), samples/s, {threads} thread(s), "
      f"{'process CPU time' if use_cpu else 'wall time'}, best of {rounds} alternating rounds; "
      f"PyTorch {torch_version}.")
print(f"Peak assumption: {model_name}, {isa} ({lanes} fp32 lanes) x 2 FMA pipes x 2 flops at {ghz:.2f} GHz "
      f"x {threads} core(s) = {peak:.0f} GFLOP/s. GFLOP/s counts GEMM-shaped work only (Model::flops_per_sample).")
print()
print("| model | batch | ours samples/s | PyTorch samples/s | ours / PyTorch | ours GFLOP/s | of peak |")
print("|---|---:|---:|---:|---:|---:|---:|")
for key in sorted(ours, key=lambda k: (["logreg", "mlp", "cnn"].index(k[0]) if k[0] in ("logreg", "mlp", "cnn") else 9, k[1])):
    t = theirs.get(key)
    ratio = f"{ours[key] / t:.2f}x" if t else "n/a"
    print(f"| {key[0]} | {key[1]} | {ours[key]:,.0f} | {t:,.0f} | {ratio} | {flops[key]:.1f} | {flops[key] / peak:.0%} |"
          if t else f"| {key[0]} | {key[1]} | {ours[key]:,.0f} | n/a | n/a | {flops[key]:.1f} | {flops[key] / peak:.0%} |")
PY
