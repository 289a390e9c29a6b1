#!/usr/bin/env bash
# The one prepared check for a GPU machine (e.g. one H200, 16 cores, a fresh Debian-like image with CUDA):
#   1. installs missing Debian -dev packages with scripts/setup.sh --no-build (fails clearly when apt cannot),
#   2. configures with -DLBBSP_WITH_CUDA=ON and builds lbbsp, test_gpu_models and bench_gpu,
#   3. runs `ctest -L gpu` (CPU vs GPU agreement; fails if the tests skip although nvidia-smi sees a GPU),
#   4. measures seconds per forward_backward vs batch (1..4096, powers of 2) per model: bench_gpu.csv,
#   5. trains 2 ranks on the GPU with a static straggler: mpirun -n 2 lbbsp train --device cuda ...
# Results (logs, CSV, telemetry, summary.txt) go to $OUT if set, else results/gpu_check. About 4-6 minutes;
# every step runs under `timeout`. Exit status 0 only when every step passed.
#   scripts/gpu_check.sh            environment: BUILD_DIR (build-gpu), LBBSP_CUDA_ARCHITECTURES (from nvidia-smi)
set -uo pipefail
cd "$(dirname "$0")/.."

out=${OUT:-results/gpu_check}
build=${BUILD_DIR:-build-gpu}
jobs=$(nproc)
mkdir -p "$out"
: >"$out/summary.txt"
failed=()

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }

# step NAME SECONDS CMD...: runs CMD under timeout, output in $out/NAME.log; on failure the log's tail goes to the
# summary and NAME to the failed list.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  log "$name: start (timeout ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    log "$name: ok in $((SECONDS - t0))s"
  else
    ((rc == 124 || rc == 137)) && log "$name: TIMED OUT after ${limit}s" || log "$name: FAILED (exit $rc)"
    tail -n 25 "$out/$name.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
    failed+=("$name")
  fi
  return $rc
}

finish() {
  if ((${#failed[@]})); then
    log "RESULT: FAILED steps: ${failed[*]} (logs in $out)"
    exit 1
  fi
  log "RESULT: all steps passed (logs in $out)"
  exit 0
}

# ---- 0. the machine ----
gpu_visible=0
if command -v nvidia-smi >/dev/null && nvidia-smi >"$out/nvidia-smi.txt" 2>&1; then
  gpu_visible=1
  log "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | head -n 1)"
else
  log "WARNING: nvidia-smi sees no GPU; the gpu tests will skip and bench/train will fail"
fi
{ command -v nvcc && nvcc --version; } >"$out/nvcc.txt" 2>&1 || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { log "FAILED: nvcc not found (PATH or /usr/local/cuda/bin)"; exit 1; }
log "nvcc: $(nvcc --version | tail -n 1); cores: $jobs"

# ---- 1. Debian packages the build needs ----
needed=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev libeigen3-dev libopenblas-dev
        libhwloc-dev libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev zlib1g-dev)
if command -v dpkg-query >/dev/null; then
  missing=()
  for p in "${needed[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "missing packages: ${missing[*]}"
    if ! command -v apt-get >/dev/null; then
      log "FAILED: no apt-get to install them; install: ${missing[*]}"
      exit 1
    fi
    if ! step setup 240 scripts/setup.sh --no-build; then
      log "FAILED: scripts/setup.sh --no-build could not install the packages (no network or no root?);" \
        "install by hand: ${missing[*]}"
      finish
    fi
  else
    log "all build packages present"
  fi
else
  log "no dpkg-query (not Debian): relying on cmake to find the dependencies"
fi

# ---- 2. configure and build ----
arch=${LBBSP_CUDA_ARCHITECTURES:-}
if [[ -z $arch ]] && ((gpu_visible)); then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
fi
arch=${arch:-90}
step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLBBSP_WITH_CUDA=ON \
  -DLBBSP_CUDA_ARCHITECTURES="$arch" || finish
step build 300 cmake --build "$build" -j "$jobs" --target lbbsp test_gpu_models bench_gpu || finish

# ---- 3. GPU tests ----
step ctest_gpu 240 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 180 \
  --output-junit "$(realpath "$out")/ctest_gpu.xml"
if ((gpu_visible)) && grep -q "Skipped" "$out/ctest_gpu.log"; then
  log "FAILED: nvidia-smi sees a GPU but gpu tests skipped:"
  grep -i "skipped" "$out/ctest_gpu.log" | head -n 5 | sed 's/^/    /' | tee -a "$out/summary.txt"
  failed+=(ctest_gpu_skipped)
fi

# ---- 4. time vs batch per model ----
if step bench_gpu 150 bash -c "'$build/bench/bench_gpu' --max-batch 4096 --min-seconds 0.1 >'$out/bench_gpu.csv'"; then
  log "bench_gpu.csv: $(($(wc -l <"$out/bench_gpu.csv") - 1)) rows"
  if command -v column >/dev/null; then column -s, -t <"$out/bench_gpu.csv"; else cat "$out/bench_gpu.csv"; fi \
    >>"$out/summary.txt"
fi

# ---- 5. 2-rank training on the GPU with a static straggler ----
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
data=$build/gpu_check_synth.h5  # 50 MB: kept out of $out
if ! "$build/lbbsp" train --help 2>/dev/null | grep -q -- "--device"; then
  log "NOTE: 'lbbsp train' has no --device flag yet; the training step below will fail on it"
fi
if [[ -f $data ]] || step synth_data 60 "$build/lbbsp" data synth --samples 16384 --features 784 --classes 10 \
  --seed 1 --out "$data"; then
  mkdir -p "$out/train"
  step train_2ranks 150 mpirun -n 2 --oversubscribe --bind-to none "$build/lbbsp" train --device cuda \
    --data "$data" --model cnn --global-batch 512 --lr 0.05 --momentum 0.9 --epochs 2 --max-iterations 60 \
    --seed 1 --balancer lbbsp-gpu --straggle "static:1,0.5" --eval-every 30 --test-subset 2048 \
    --progress-every 10 --log-dir "$out/train" --summary-json "$out/train/summary.json" &&
    log "train summary: $(tr -d '\n' <"$out/train/summary.json" | head -c 600)"
fi

finish
