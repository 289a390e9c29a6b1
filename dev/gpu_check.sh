#!/usr/bin/env bash
# The one prepared check for a GPU machine (e.g. one H200, 16 cores, a fresh Debian-like image with CUDA):
#   1. installs missing Debian -dev packages with scripts/setup.sh --no-build (fails clearly when apt cannot),
#   2. configures with -DLBBSP_WITH_CUDA=ON and builds lbbsp, test_gpu_models and bench_gpu,
#   3. runs `ctest -L gpu` (CPU vs GPU agreement; fails if the tests skip although nvidia-smi sees a GPU),
#   4. measures seconds per forward_backward vs batch (1..4096, powers of 2) per model: bench_gpu.csv,
#   5. trains 2 ranks on the GPU with a static straggler: mpirun -n 2 lbbsp train --device cuda ...
#   6. the same with bsp and lbbsp-gpu-model, and prints one table of the three runs; then --gpu-params host vs
#      device (resident parameters and optimizer) for the MLP and the CNN: same trajectory, and the cost of each;
#      and --gpu-allreduce cuda-aware is refused clearly when MPI cannot reduce GPU memory,
#   7. with GPU_CHECK_FMNIST=FILE.h5: time to accuracy on Fashion-MNIST, 4 ranks, MLP and CNN, 4 balancers, and
#      the CNN at global batch 4096 (every rank on the linear part of its time-vs-batch curve).
# Results (logs, CSV, telemetry, summary.txt) go to $OUT if set, else results/gpu_check. About 4-6 minutes;
# every step runs under `timeout`. Exit status 0 only when every step passed.
#   dev/gpu_check.sh                  environment: BUILD_DIR (build-gpu), LBBSP_CUDA_ARCHITECTURES (nvidia-smi)
#   dev/gpu_check.sh --bundle DIR[.tar.xz]   a machine without our packages and network (e.g. a bare CUDA image):
#       skips steps 1-2 and uses the programs and libraries packed by dev/gpu_bundle.sh (see there)
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=
if [[ ${1:-} == --bundle ]]; then
  bundle=${2:?--bundle needs the folder or .tar.xz made by dev/gpu_bundle.sh}
  if [[ -f $bundle && $bundle == *.tar.xz ]]; then
    mkdir -p /tmp/lbbsp-bundle && tar -C /tmp/lbbsp-bundle -xJf "$bundle" || exit 1
    bundle=/tmp/lbbsp-bundle/$(basename "$bundle" .tar.xz)
  fi
  [[ -x $bundle/bin/lbbsp ]] || { echo "gpu_check: $bundle/bin/lbbsp missing: make it with dev/gpu_bundle.sh" >&2; exit 1; }
  bundle=$(realpath "$bundle")
elif (($#)); then
  echo "gpu_check: unknown argument '$1' (usage: gpu_check.sh [--bundle DIR])" >&2
  exit 1
fi

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
if command -v nvcc >/dev/null; then log "nvcc: $(nvcc --version | tail -n 1); cores: $jobs"
elif [[ -z $bundle ]]; then log "FAILED: nvcc not found (PATH or /usr/local/cuda/bin)"; exit 1; fi

if [[ -n $bundle ]]; then
  # No overwriting: a library already on this machine under the same soname is ABI-compatible and stays.
  cp -a --update=none "$bundle/root/." / 2>/dev/null || cp -an "$bundle/root/." /
  ldconfig
  lbbsp=$bundle/bin/lbbsp test_gpu=$bundle/bin/test_gpu_models bench_gpu=$bundle/bin/bench_gpu mpirun=/usr/bin/orterun
  data=$bundle/gpu_check_synth.h5
  log "bundle: $bundle ($(ls "$bundle/bin" | tr '\n' ' '))"
  # CUDA libraries (cudart, cuBLAS) come from this machine: look for any the loader cannot find yet.
  for lib in $(ldd "$lbbsp" "$test_gpu" | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /usr/local/cuda* /usr/local/nvidia /opt /usr/lib -name "$lib" 2>/dev/null | head -n 1)
    [[ -n $found ]] && export LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} &&
      log "bundle: $lib from $found"
  done
  if ! ldd "$lbbsp" "$test_gpu" | grep -q "not found"; then log "bundle: all libraries resolve"; else
    log "FAILED: libraries missing for lbbsp:"; ldd "$lbbsp" "$test_gpu" | grep "not found" | tee -a "$out/summary.txt"; exit 1
  fi
else
# ---- 1. Debian packages the build needs ----
if command -v dpkg-query >/dev/null; then
  if missing=$(scripts/setup.sh --build-deps --check); then
    log "all build packages present"
  else
    log "$missing"
    if ! command -v apt-get >/dev/null; then
      log "FAILED: no apt-get to install them"
      exit 1
    fi
    if ! step setup 240 scripts/setup.sh --no-build --build-deps; then
      log "FAILED: scripts/setup.sh --no-build --build-deps could not install the packages (no network or no" \
        "root?); install them by hand"
      finish
    fi
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
lbbsp=$build/lbbsp test_gpu=$build/tests/test_gpu_models bench_gpu=$build/bench/bench_gpu mpirun=mpirun
data=$build/gpu_check_synth.h5  # 50 MB: kept out of $out
fi

# ---- 3. GPU tests (the test binary itself: ctest's files hold the build machine's paths) ----
step ctest_gpu 240 "$test_gpu" --gtest_output="xml:$(realpath "$out")/test_gpu.xml"
grep -E '^\[ *(PASSED|SKIPPED|FAILED) *\] [0-9]+ test|^\[ *FAILED *\] [A-Z]' "$out/ctest_gpu.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
if ((gpu_visible)) && grep -q "SKIPPED" "$out/ctest_gpu.log"; then
  log "FAILED: nvidia-smi sees a GPU but gpu tests skipped:"
  grep -i "skipped" "$out/ctest_gpu.log" | head -n 5 | sed 's/^/    /' | tee -a "$out/summary.txt"
  failed+=(ctest_gpu_skipped)
fi

# ---- 4. time vs batch per model ----
if step bench_gpu 150 bash -c "'$bench_gpu' --max-batch 4096 --min-seconds 0.1 >'$out/bench_gpu.csv'"; then
  log "bench_gpu.csv: $(($(wc -l <"$out/bench_gpu.csv") - 1)) rows"
  if command -v column >/dev/null; then column -s, -t <"$out/bench_gpu.csv"; else cat "$out/bench_gpu.csv"; fi \
    >>"$out/summary.txt"
fi

# ---- training runs on the GPU, balancers side by side ----
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# compare TAG RANKS "VALUE..." TRAIN_ARGS...: one `lbbsp train --device cuda` per value of the option $VARY
# (default --balancer) into $out/TAG_VALUE, then one table (iteration time, wait, speed-up vs the value $BASE
# (default bsp), time to --target-accuracy, final batch per rank, parameter checksum).
compare() {
  local tag=$1 ranks=$2 values=$3 value run
  shift 3
  for value in $values; do
    run=$out/${tag}_$value
    mkdir -p "$run"
    step "${tag}_$value" 240 "$mpirun" -n "$ranks" --oversubscribe --bind-to none "$lbbsp" train --device cuda \
      "${VARY:---balancer}" "$value" --log-dir "$run" --summary-json "$run/summary.json" "$@"
  done
  command -v python3 >/dev/null || return 0
  log "$tag: $ranks ranks, lbbsp train ${VARY:---balancer} {$values} $*"
  python3 - "$out" "$tag" "${BASE:-bsp}" <<'PY' | tee -a "$out/summary.txt"
import json, pathlib, sys
def last_batches(run, n=20):  # mean batch per rank over the last n iterations, from the telemetry
    try:
        import h5py, numpy as np
        with h5py.File(run / "telemetry.h5") as h:
            it, rank, batch = (h["records"][k][:] for k in ("iteration", "rank", "batch"))
        tail = it > it.max() - n
        return "/".join(f"{batch[tail & (rank == k)].mean():.0f}" for k in np.unique(rank))
    except Exception as e:
        return f"({type(e).__name__})"
out, tag, base = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = {}
for f in sorted(out.glob(f"{tag}_*/summary.json")):
    rows[f.parent.name[len(tag) + 1:]] = dict(json.loads(f.read_text()), batches=last_batches(f.parent))
ref = rows.get(base, {}).get("mean_iteration_s")
print(f"| run | step mode | mean iteration ms | wait fraction | speed-up vs {base} | time to target s |"
      " test accuracy | batch per rank (last 20 it) | params checksum |")
print("|---|---|---|---|---|---|---|---|---|")
for name, r in rows.items():
    sp = f"{ref / r['mean_iteration_s']:.2f}x" if ref else "-"
    ttt = r.get("time_to_target_s")
    ttt = f"{ttt:.2f}" if isinstance(ttt, (int, float)) else "not reached"
    print(f"| {name} | {r.get('step_mode', '?')} | {1e3 * r['mean_iteration_s']:.2f} | {r['wait_fraction']:.3f} |"
          f" {sp} | {ttt} | {r['test_accuracy']:.4f} | {r['batches']} | {r['params_checksum']:.6g} |")
PY
}

# ---- 5./6. 2 ranks, synthetic data, CNN, one rank at half speed ----
if [[ -f $data ]] || step synth_data 60 "$lbbsp" data synth --samples 16384 --features 784 --classes 10 \
  --seed 1 --out "$data"; then
  compare train 2 "lbbsp-gpu bsp lbbsp-gpu-model" --data "$data" --model cnn --global-batch 512 --lr 0.05 \
    --momentum 0.9 --epochs 2 --max-iterations 120 --seed 1 --straggle "static:1,0.5" --eval-every 60 \
    --test-subset 2048 --progress-every 20
fi

# ---- 6b. where the parameters live: --gpu-params host (copied in and out every step, SGD on the CPU) vs device
# (resident; gradient staged through the host for MPI). Same trajectory (checksums within 1e-3), and the cost.
if [[ -f $data ]]; then
  VARY=--gpu-params BASE=host compare params_mlp 2 "host device" --data "$data" --model mlp --global-batch 512 \
    --lr 0.05 --momentum 0.9 --max-iterations 200 --seed 1 --eval-every 100 --test-subset 2048 --progress-every 100
  VARY=--gpu-params BASE=host compare params_cnn 2 "host device" --data "$data" --model cnn --global-batch 4096 \
    --lr 0.05 --momentum 0.9 --epochs 40 --max-iterations 60 --seed 1 --eval-every 60 --test-subset 2048 \
    --progress-every 20
  for tag in params_mlp params_cnn; do
    step "${tag}_agree" 20 python3 - "$out/${tag}_host/summary.json" "$out/${tag}_device/summary.json" <<'PY'
import json, sys
h, d = (json.load(open(f)) for f in sys.argv[1:3])
rel = abs(h["params_checksum"] - d["params_checksum"]) / max(1e-30, abs(h["params_checksum"]))
print(f"{h['step_mode']} vs {d['step_mode']}: checksum {h['params_checksum']:.9g} vs {d['params_checksum']:.9g}, "
      f"relative difference {rel:.2e}; test accuracy {h['test_accuracy']:.4f} vs {d['test_accuracy']:.4f}")
sys.exit(0 if rel < 1e-3 and h["step_mode"] == "host" and d["step_mode"].startswith("device/") else 1)
PY
    tail -n 1 "$out/${tag}_agree.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
  done
  # Debian's Open MPI is not CUDA-aware: asking for it must fail with a message that says so.
  if timeout 60 "$mpirun" -n 1 "$lbbsp" train --device cuda --gpu-allreduce cuda-aware --data "$data" --max-iterations 2 \
    >"$out/cuda_aware.log" 2>&1; then
    log "cuda_aware: MPI reduces GPU memory here (CUDA-aware run passed)"
  elif grep -q "cannot reduce GPU memory" "$out/cuda_aware.log"; then
    log "cuda_aware: refused as expected: $(grep -m1 -o 'cannot reduce GPU memory ([^)]*)' "$out/cuda_aware.log")"
  else
    log "FAILED: cuda_aware: neither ran nor gave the expected message:"
    tail -n 5 "$out/cuda_aware.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
    failed+=(cuda_aware)
  fi
fi

# ---- 7. optional: time to accuracy on Fashion-MNIST, 4 ranks (capacities 1,1,0.5,0.25) ----
# GPU_CHECK_FMNIST=FILE.h5 (from `lbbsp data import-fashion-mnist`): MLP to 0.87 and CNN to 0.89.
if [[ -n ${GPU_CHECK_FMNIST:-} ]]; then
  fm=$GPU_CHECK_FMNIST balancers="bsp lbbsp-gpu lbbsp-gpu-model oracle"
  compare fmnist_mlp 4 "$balancers" --data "$fm" --model mlp --global-batch 256 --lr 0.05 --momentum 0.9 \
    --lr-schedule cosine --epochs 10 --seed 1 --straggle "static:1,1,0.5,0.25" --eval-every 234 \
    --target-accuracy 0.87 --progress-every 500
  compare fmnist_cnn 4 "$balancers" --data "$fm" --model cnn --global-batch 256 --lr 0.05 --momentum 0.9 \
    --lr-schedule cosine --epochs 5 --seed 1 --straggle "static:1,1,0.5,0.25" --eval-every 234 \
    --target-accuracy 0.89 --progress-every 500
  # A global batch large enough that every rank works on the linear part of the curve (above ~256 for the CNN).
  compare fmnist_cnn4096 4 "$balancers" --data "$fm" --model cnn --global-batch 4096 --lr 0.2 --momentum 0.9 \
    --lr-schedule cosine --epochs 20 --max-iterations 300 --seed 1 --straggle "static:1,1,0.5,0.25" \
    --eval-every 100 --target-accuracy 0.89 --progress-every 100
fi

finish
