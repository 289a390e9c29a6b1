#!/usr/bin/env bash
# Train-step throughput of our models (bench_models) against PyTorch on the same machine, in the same run, with
# the same thread count: PyTorch from PyPI (in a venv, what users have; oneDNN + MKL) and Debian's python3-torch.
# Prints the peak-FLOP/s assumption and a markdown table per thread count: samples/s of ours and of each peer,
# the ratios, our GFLOP/s and its fraction of the peak; with several thread counts, our wall-time scaling.
#
# usage: bench/bench_vs_pytorch.sh [--threads N[,M...]] [--build-dir DIR] [--min-time SECONDS] [--rounds R]
#            [--peers pypi,debian] [--create-venv] [--ghz GHZ] [--out FILE]
#   --threads 1,2    thread counts to measure (default 1)
#   --rounds R       the programs alternate R times (default 2) and each keeps its best round, so a burst of load
#                    from other jobs on a shared machine hits all alike. One thread: process CPU time; more: wall.
#   --peers LIST     pypi: $TORCH_VENV/bin/python (default .venv-torch, ignored by git); debian: /usr/bin/python3
#                    with python3-torch (apt-get install python3-torch). A missing peer is an error.
#   --create-venv    create $TORCH_VENV with `pip install torch` from PyPI first (about 0.55 GB for the torch
#                    wheel plus about 3 GB of CUDA libraries it depends on; the CPU kernels need none of them)
#   --ghz GHZ        clock for the peak estimate (default: the highest 'cpu MHz' in /proc/cpuinfo; a VM often
#                    reports its base clock there while the cores run faster)
#   --out FILE       also append the tables, with date, machine, commit and this command, to FILE
#                    (docs/results/kernels.md)
set -euo pipefail

threads_list=1 build_dir=build min_time=1 rounds=2 peers=pypi,debian create_venv=0 ghz="" out_file=""
command_line="bench/bench_vs_pytorch.sh $*"
while (($#)); do
  case $1 in
    --threads) threads_list=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --create-venv) create_venv=1; shift ;;
    --ghz) ghz=$2; shift 2 ;;
    --out) out_file=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
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

venv=${TORCH_VENV:-$root/.venv-torch}
if ((create_venv)) && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "creating $venv with torch from PyPI (large download) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch
fi
declare -A peer_python=([pypi]="$venv/bin/python" [debian]=/usr/bin/python3)
declare -A peer_fix=([pypi]="run with --create-venv, or set TORCH_VENV to a venv with torch"
                     [debian]="apt-get install python3-torch")
IFS=, read -ra peer_names <<<"$peers"
for p in "${peer_names[@]}"; do
  [[ -n ${peer_python[$p]:-} ]] || { echo "bench_vs_pytorch.sh: unknown peer '$p' (pypi or debian)" >&2; exit 2; }
  if ! "${peer_python[$p]}" -c 'import torch' 2>/dev/null; then
    echo "bench_vs_pytorch.sh: peer '$p': ${peer_python[$p]} cannot import torch (${peer_fix[$p]})" >&2
    exit 1
  fi
done

IFS=, read -ra thread_counts <<<"$threads_list"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The BLAS runs one thread per call inside our kernels (docs/threads.md); PyTorch gets the same thread count.
# bench_models bounds its idle threads' spinning as lbbsp does (runtime/platform/kernel_env.hpp); PyTorch runs with its
# own defaults, as its users run it.
for ((r = 0; r < rounds; ++r)); do
  for t in "${thread_counts[@]}"; do
    OMP_NUM_THREADS=$t "$bench" --threads="$t" --benchmark_filter='^(train_step/|peak/)' --benchmark_min_time="$min_time" \
      --benchmark_format=json >"$out/ours.$t.$r.json"
    for p in "${peer_names[@]}"; do
      OMP_NUM_THREADS=$t "${peer_python[$p]}" dev/peers/pytorch_step.py --threads "$t" \
        --min-seconds "$min_time" >"$out/$p.$t.$r.jsonl"
    done
  done
done

report=$(python3 - "$out" "$rounds" "$threads_list" "$peers" "${ghz:-0}" <<'PY'
import glob, json, os, re, sys

out, rounds, thread_counts, peers, ghz_arg = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")], sys.argv[4].split(","), float(sys.argv[5])
order = {"logreg": 0, "mlp": 1, "cnn": 2}

def best(mapping, key, value):
    mapping[key] = max(mapping.get(key, 0.0), value)

ours, wall, cpu, flops, simd, fma_peak = {}, {}, {}, {}, "?", 0.0
for path in glob.glob(os.path.join(out, "ours.*.json")):
    t = int(path.split(".")[-3])
    doc = json.load(open(path))
    simd = doc["context"].get("lbbsp_simd", simd)
    for b in doc["benchmarks"]:
        if b["name"].startswith("peak/fma") and "GFLOP/s" in b:
            fma_peak = max(fma_peak, b["GFLOP/s"])
        m = re.match(r"train_step/(\w+)/batch:(\d+)", b["name"])
        if not m or b.get("run_type") == "aggregate":
            continue
        key = (t, m.group(1), int(m.group(2)))
        best(ours, key, b["items_per_second"])
        best(wall, key, key[2] / (b["real_time"] * 1e-6))  # real_time is in microseconds
        best(flops, key, b["GFLOP/s"])
        cpu[key] = min(cpu.get(key, float("inf")), b["cpu_time"])  # per step, all threads together
theirs, versions = {p: {} for p in peers}, {}
for p in peers:
    for path in glob.glob(os.path.join(out, f"{p}.*.jsonl")):
        t = int(path.split(".")[-3])
        for line in open(path):
            r = json.loads(line)
            best(theirs[p], (t, r["model"], r["batch"]), r["cpu_samples_per_s"] if t == 1 else r["samples_per_s"])
            versions[p] = r["torch"]

# Peak FLOP/s: two FMA pipes per core (Zen 2-5, Intel cores since Haswell), 2 flops per FMA lane, lanes from
# the CPU flags, at the clock /proc/cpuinfo reports (or --ghz). Zen 4 (AMD family 25) runs AVX-512 on 256-bit
# pipes, so its FMA peak is the AVX2 one; counting 16 lanes there would double the peak.
info = open("/proc/cpuinfo").read()
flags = set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
amd_family = int(re.search(r"^cpu family\s*:\s*(\d+)", info, re.M).group(1)) if "AuthenticAMD" in info else 0
lanes = 16 if "avx512f" in flags and not 0 < amd_family <= 25 else 8 if {"avx2", "fma"} <= flags else 4
isa = ("AVX-512" if "avx512f" in flags else "AVX2+FMA" if {"avx2", "fma"} <= flags else "SSE") + \
      (" on 256-bit FMA pipes" if "avx512f" in flags and lanes == 8 else "")
mhz = [float(x) for x in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)]
ghz = ghz_arg or (max(mhz) / 1000 if mhz else 2.0)
model_name = (re.search(r"^model name\s*:\s*(.*)$", info, re.M) or [None, "unknown CPU"])[1]
spec_peak = ghz * lanes * 2 * 2
core_peak = fma_peak or spec_peak
names = {"pypi": "PyTorch (PyPI)", "debian": "PyTorch (Debian)"}
print(f"Build: {simd} kernels. PyTorch: " + ", ".join(f"{names[p]} {versions.get(p, '?')}" for p in peers) + ".")
print(f"Peak: {core_peak:.0f} GFLOP/s per core, " + (f"measured (bench_models peak/fma: 12 FMA chains in registers, "
      f"process CPU time); " if fma_peak else "") + f"from the spec sheet: {model_name}, {isa} ({lanes} fp32 FMA "
      f"lanes) x 2 FMA pipes x 2 flops at {ghz:.2f} GHz = {spec_peak:.0f} GFLOP/s. GFLOP/s counts GEMM-shaped work "
      f"only (Model::flops_per_sample).")
keys = sorted({k[1:] for k in ours}, key=lambda k: (order.get(k[0], 9), k[1]))
for t in thread_counts:
    peak = core_peak * t
    print()
    print(f"{t} thread(s), {'process CPU time' if t == 1 else 'wall time'}, best of {rounds} alternating rounds:")
    print()
    head = "| model | batch | ours samples/s | " + " | ".join(f"{names[p]} | ours / {names[p]}" for p in peers)
    print(head + " | ours GFLOP/s | of peak |")
    print("|---|---:|---:|" + "---:|---:|" * len(peers) + "---:|---:|")
    for kind, batch in keys:
        k = (t, kind, batch)
        if k not in ours:
            continue
        cells = []
        for p in peers:
            v = theirs[p].get(k)
            cells += [f"{v:,.0f}" if v else "n/a", f"{ours[k] / v:.2f}x" if v else "n/a"]
        print(f"| {kind} | {batch} | {ours[k]:,.0f} | " + " | ".join(cells) +
              f" | {flops[k]:.1f} | {flops[k] / peak:.0%} |")
if len(thread_counts) > 1:
    base = thread_counts[0]
    print()
    print(f"Our scaling at N threads against {base}, best rounds: wall-time samples/s ratio (what the machine gave "
          f"us), and the CPU time of a step summed over the threads, against {base} thread(s) (the cost of "
          f"threading itself; near 1.00x means N idle cores would give close to N times the speed):")
    print()
    print("| model | batch | " + " | ".join(f"{t} threads: wall speed-up | CPU time" for t in thread_counts[1:]) + " |")
    print("|---|---:|" + "---:|---:|" * (len(thread_counts) - 1))
    for kind, batch in keys:
        b, c = wall.get((base, kind, batch)), cpu.get((base, kind, batch))
        print(f"| {kind} | {batch} | " + " | ".join(
            f"{wall[(t, kind, batch)] / b:.2f}x | {cpu[(t, kind, batch)] / c:.2f}x" for t in thread_counts[1:]) + " |")
PY
)
echo "$report"
if [[ -n $out_file ]]; then
  {
    echo
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- models bench || echo ' (+ uncommitted changes)')"
    echo
    echo "Machine: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores," \
      "load average at the end $(cut -d' ' -f1-3 /proc/loadavg). Command: \`$command_line\`"
    echo
    echo "$report"
  } >>"$out_file"
  echo "appended to $out_file" >&2
fi
