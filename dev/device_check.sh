#!/usr/bin/env bash
# lbbsp on a GPU machine with many cores (written for one H200, 16 cores), in one go within one time budget
# (--budget, 9 minutes), into the folder $OUT names (docs/device_check.md: how to run it and read the results):
#   1. gpu        the GPU tests and the time-vs-batch table: dev/gpu_check.sh --bundle (status "no GPU" when
#                 nvidia-smi sees none)
#   2. scaling    strong and weak scaling of `lbbsp train`, MLP and CNN, 1 2 4 8 16 ranks, one core per rank
#                 (mpirun --bind-to core --map-by core), BSP and lbbsp-cpu: bench/scaling/run_scaling.sh
#   3. interference  ranks pinned to their own cores, 100% stress-ng co-tenants pinned on some of them, on/off every
#                 PERIOD s: BSP vs lbbsp-cpu/narx vs oracle (+ BSP without co-tenants), each run's telemetry
#                 (--log-dir) scored by `lbbsp predict-eval` (NARX vs ARIMA, EMA, last)
#   4. torch      lbbsp.torch's CUDA tests (tests/python/test_torch_cuda.py, on the GPU) and bench/torch_bench.sh
#                 (status "not present" where python3 cannot import lbbsp.torch: the bundle carries a wheel)
#   5. kernels    test_models_kernels and bench_models' train steps (MLP, CNN) at 1 2 4 8 16 threads, one core each:
#                 the AVX-512 build (bundle bin/x86-64-v4/) when the CPU has AVX-512, else the bundle's portable one
#   6. telemetry  bench/telemetry_overhead.sh: 4 ranks x 120,000 iterations with and without --log-dir/--timeline
# Every step runs under `timeout` within one overall budget and the script goes on past a failed step; each step's
# status is a line of $OUT/status.tsv (step, status, seconds, note), the log is $OUT/summary.txt. With a python3
# (h5py/matplotlib optional) it also writes $OUT/tables.md (dev/device_tables.py OUT, to run again elsewhere).
#
#   dev/device_check.sh                         with this checkout's build (build/lbbsp, build/bench, build/tests)
#   dev/device_check.sh --bundle DIR[.tar.xz]   with a bundle from dev/gpu_bundle.sh (a machine without build tools)
#   dev/device_check.sh --dry-run               every step at toy size, on any machine (2 cores: oversubscribed)
# Options: --lbbsp PATH (without --bundle; default build/lbbsp), --ranks "1 2 4 8 16" (scaling), --budget S (overall
# seconds, default 540; dry run 300), --steps gpu,scaling,interference,torch,kernels,telemetry (a subset, same
# order; torch_cuda: the torch step without its CPU benchmark).
# Environment: OUT (default results/device_check-DATE), DEVICE_CHECK_FMNIST=FILE.h5 (scaling and interference on
# that dataset instead of synthetic data), DEVICE_CHECK_TORCH_K=EXPR (pytest -k for test_torch_cuda.py, e.g. "not
# fake and not memory_cap and not fast_ranks": the real-GPU tests only), DEVICE_CHECK_CUDA_PAIRS="1 2 3" and
# DEVICE_CHECK_CUDA_MODELS="mlp cnn" (the CUDA cost step's alternated pairs and models). Exit status 0 only when
# no step failed ("no GPU"/"not present" are not failures).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
die() { echo "device_check: error: $*" >&2; exit 2; }

bundle="" dry=0 lbbsp=$root/build/lbbsp ranks="" budget="" steps=gpu,scaling,interference,torch,kernels,telemetry
while (($#)); do
  case $1 in
    --bundle) bundle=${2:?--bundle needs the folder or .tar.xz made by dev/gpu_bundle.sh}; shift ;;
    --dry-run) dry=1 ;;
    --lbbsp) lbbsp=${2:?--lbbsp needs a path}; shift ;;
    --ranks) ranks=${2:?--ranks needs a list like \"1 2 4\"}; shift ;;
    --budget) budget=${2:?--budget needs seconds}; shift ;;
    --steps) steps=${2:?--steps needs a list like gpu,scaling}; shift ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  case $s in
    gpu | scaling | interference | torch | torch_cuda | kernels | telemetry) ;;
    *) die "--steps: unknown step '$s' (gpu,scaling,interference,torch,torch_cuda,kernels,telemetry)" ;;
  esac
done
budget=${budget:-$((dry ? 300 : 540))}
[[ $budget =~ ^[1-9][0-9]*$ ]] || die "--budget '$budget': expected positive seconds"
out=${OUT:-$root/results/device_check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out" || die "cannot create the output folder '$out'"
out=$(cd "$out" && pwd)
: >"$out/summary.txt"
printf 'step\tstatus\tseconds\tnote\n' >"$out/status.tsv"
failed=0 t_start=$SECONDS

log() { echo "[device_check $(date -u +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }
status() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >>"$out/status.tsv"; log "$1: $2 ($3 s) ${4:-}"; }
left() { echo $((budget - (SECONDS - t_start))); }
wanted() { [[ ,$steps, == *,$1,* ]]; }

# run_step NAME LIMIT CMD...: CMD under timeout (LIMIT or what is left of the budget), output in $out/NAME.log, one
# status line. Returns CMD's exit status.
run_step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  ((limit > $(left))) && limit=$(left)
  if ((limit < 10)); then
    status "$name" "skipped" 0 "overall budget of ${budget}s spent"
    failed=1  # not measured counts as not passed
    return 1
  fi
  log "$name: start (timeout ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if ((rc == 0)); then
    status "$name" ok $((SECONDS - t0))
  else
    local what="failed (exit $rc)"
    ((rc == 124 || rc == 137)) && what="timed out (${limit}s)"
    status "$name" "$what" $((SECONDS - t0)) "log: $name.log"
    tail -n 15 "$out/$name.log" | sed 's/^/    /' | tee -a "$out/summary.txt"
    failed=1
  fi
  return $rc
}

# ---- the programs: from the bundle (libraries copied onto /, CUDA's found on this machine) or this checkout ----
mpirun=mpirun
if [[ -n $bundle ]]; then
  if [[ -f $bundle && $bundle == *.tar.xz ]]; then
    mkdir -p /tmp/lbbsp-bundle && tar -C /tmp/lbbsp-bundle -xJf "$bundle" || die "cannot unpack $bundle"
    bundle=/tmp/lbbsp-bundle/$(basename "$bundle" .tar.xz)
  fi
  [[ -x $bundle/bin/lbbsp ]] || die "$bundle/bin/lbbsp missing: make the bundle with dev/gpu_bundle.sh"
  bundle=$(realpath "$bundle")
  cp -a --update=none "$bundle/root/." / 2>/dev/null || cp -an "$bundle/root/." /
  ldconfig 2>/dev/null
  lbbsp=$bundle/bin/lbbsp mpirun=/usr/bin/orterun
  export PATH=$bundle/bin:$PATH  # stress-ng for the co-tenants
  for lib in $(ldd "$lbbsp" | awk '/not found/ {print $1}' | sort -u); do
    found=$(find /usr/local/cuda* /usr/local/nvidia /opt /usr/lib -name "$lib" 2>/dev/null | head -n 1)
    [[ -n $found ]] && LD_LIBRARY_PATH=$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && export LD_LIBRARY_PATH
  done
fi
[[ -x $lbbsp ]] || die "lbbsp binary '$lbbsp' not found: build it (cmake --build build --target lbbsp), pass --lbbsp" \
  "PATH or --bundle DIR"
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc honours OMP_NUM_THREADS
python=""
for p in python3 /usr/bin/python3; do command -v "$p" >/dev/null && python=$p && break; done
# The bundle's lbbsp wheel (dev/gpu_bundle.sh) for the torch step, installed beside the image's PyTorch.
if [[ -n $bundle && -n $python ]] && ls "$bundle"/wheels/lbbsp-*.whl >/dev/null 2>&1; then
  if "$python" -m pip install -q --no-index --no-deps --target /tmp/lbbsp-site "$bundle"/wheels/lbbsp-*.whl \
    >"$out/wheel.log" 2>&1; then
    export PYTHONPATH=/tmp/lbbsp-site${PYTHONPATH:+:$PYTHONPATH}
  else
    log "wheel: $python cannot install the bundle's lbbsp wheel ($(tail -n 1 "$out/wheel.log"))"
  fi
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "mode: $( ((dry)) && echo dry-run || echo full)"
  echo "commit: $(cat "$bundle/commit.txt" 2>/dev/null || git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "host: $(uname -nrm)"
  echo "cores: $cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'))"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "lbbsp: $lbbsp"
  echo "mpirun: $("$mpirun" --version 2>/dev/null | head -n 1)"
  echo "stress-ng: $(command -v stress-ng || echo none)"
  echo "python3: ${python:-none}"
  command -v nvidia-smi >/dev/null &&
    echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)"
} >"$out/machine.txt"
log "machine: $(tr '\n' ';' <"$out/machine.txt")"

# ---- sizes: the real ones, or toy ones for the 2-core dry run ----
if ((dry)); then
  ranks=${ranks:-"1 2"} samples=2048 scal_iters=6 cnn_iters=3 gb_mlp=256 pb_mlp=64 gb_cnn=32 pb_cnn=16
  irank=2 ipin=0,1 itenants=1 iperiod=0.5 igb=512 iiters=40 iextra=""
  kthreads="1 2" kmin=0.05 titers=300 tpairs=1
else
  ranks=${ranks:-"1 2 4 8 16"} samples=16384 scal_iters=30 cnn_iters=15 gb_mlp=1024 pb_mlp=128 gb_cnn=256 pb_cnn=32
  irank=8 ipin=0,1,2,3,4,5,6,7 itenants=5,6,7 iperiod=2 igb=4096 iiters=600 iextra=1
  kthreads="1 2 4 8 16" kmin=0.5 titers=120000 tpairs=2
fi

# ---- 1. GPU tests and time vs batch ----
if wanted gpu; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    status gpu "no GPU" 0 "nvidia-smi sees no GPU here: GPU tests and bench_gpu not run"
  else
    gpu_args=()
    [[ -n $bundle ]] && gpu_args=(--bundle "$bundle")
    OUT=$out/gpu run_step gpu 200 dev/gpu_check.sh "${gpu_args[@]}"
  fi
fi

# ---- data: synthetic (Fashion-MNIST-shaped) made here, or DEVICE_CHECK_FMNIST ----
data=${DEVICE_CHECK_FMNIST:-}
torch_data=0
{ wanted torch || wanted torch_cuda; } && ((!dry)) && torch_data=1
if [[ -z $data ]] && { wanted scaling || wanted interference || wanted telemetry || ((torch_data)); }; then
  # Full size (50 MB) outside $OUT, so that it does not travel back with the results.
  ddir=$out/data
  ((dry)) || ddir=${TMPDIR:-/tmp}/lbbsp-device-check
  data=$ddir/synth-${samples}x784.h5
  mkdir -p "$ddir"
  run_step data_synth 60 "$lbbsp" data synth --samples "$samples" --features 784 --classes 10 --seed 1 --out "$data" ||
    data=""
fi

# ---- 2. strong and weak scaling, one core per rank ----
if wanted scaling; then
  if [[ -z $data ]]; then
    status scaling "skipped" 0 "no dataset (data_synth failed)"
  else
    scal_flags=(--no-plot)
    [[ -n $python ]] || scal_flags=(--no-tables)
    ((dry)) || scal_flags+=(--busy-poll)  # dedicated cores: spinning at the allreduce is fastest
    for model in mlp cnn; do
      iters=$scal_iters gb=$gb_mlp pb=$pb_mlp
      [[ $model == cnn ]] && iters=$cnn_iters gb=$gb_cnn pb=$pb_cnn
      for bal in bsp lbbsp-cpu; do
        run_step "scaling_${model}_$bal" 120 bench/scaling/run_scaling.sh --lbbsp "$lbbsp" --mpirun "$mpirun" \
          --bind core --ranks "$ranks" --model "$model" --data "$data" --global-batch "$gb" --per-rank-batch "$pb" \
          --iterations "$iters" --epochs 1000 --out "$out/scaling/${model}_$bal" \
          --train-args "--balancer $bal --eval-every 1000000 --test-subset 1000" \
          "${scal_flags[@]}"
      done
    done
  fi
fi

# ---- 3. pinned stress-ng interference, telemetry scored by predict-eval ----
# interference_run NAME BALANCER STRAGGLE [TRAIN_ARGS...]: one run into $out/interference/runs/NAME (mpirun
# binding: ibind).
interference_run() {
  local name=$1 bal=$2 straggle=$3 dir=$out/interference/runs/$1
  shift 3
  mkdir -p "$dir"
  local cmd=("$mpirun" -n "$irank" --oversubscribe "${ibind[@]}" "$lbbsp" train --data "$data" --model mlp
    --global-batch "$igb" --lr 0.05 --epochs 1000 --max-iterations "$iiters" --seed 1 --balancer "$bal"
    --straggle "$straggle" --eval-every 1000000 --test-subset 1000 --log-dir "$dir" --summary-json
    "$dir/summary.json" --quiet "$@")
  echo "${cmd[*]}" >"$dir/command.txt"
  run_step "interference_$name" 90 "${cmd[@]}" || return 1
  # The recorded speeds one step ahead through the predictors (what the balancer's predictor saw at the barrier).
  "$lbbsp" predict-eval --telemetry "$dir" --telemetry-exo barrier --format csv --predictors narx,arima,ema,last \
    --seed 1 >"$dir/predict_eval.csv" 2>"$dir/predict_eval.err" ||
    { status "predict_eval_$name" "failed" 0 "$(tail -n 1 "$dir/predict_eval.err")"; failed=1; }
}
if wanted interference; then
  if [[ -z $data ]]; then
    status interference "skipped" 0 "no dataset (data_synth failed)"
  elif ! command -v stress-ng >/dev/null; then
    status interference "failed" 0 "no stress-ng on PATH (the bundle carries it: dev/gpu_bundle.sh with stress-ng installed)"
    failed=1
  else
    tenants=""
    for r in ${itenants//,/ }; do tenants+="${tenants:+,}$r=100"; done
    pinned="stress:$tenants;pin=$ipin;period=$iperiod"
    # Setting names follow telemetry_eval.py's NAME = SETTING-pPERIOD-sSEED, so --eval-only pools them per setting.
    ibind=(--bind-to none)  # lbbsp pins rank r to CPU pin[r] itself, and each co-tenant beside its rank
    interference_run "pinned-bsp-p$iperiod-s1" bsp "$pinned"
    interference_run "pinned-narx-p$iperiod-s1" lbbsp-cpu "$pinned" --predictor narx
    interference_run "pinned-oracle-p$iperiod-s1" oracle "$pinned"
    # One more recording for the predictors: faster switching (iextra s on, iextra s off).
    for p in $iextra; do
      interference_run "pinned-narx-p$p-s1" lbbsp-cpu "stress:$tenants;pin=$ipin;period=$p" --predictor narx
    done
    # The same cores without co-tenants: rank r on core r, as pin=0,1,... places it.
    ibind=(--bind-to core --map-by core)
    interference_run "quiet-bsp-p0-s1" bsp none
  fi
fi

# ---- 4. the PyTorch integration's benchmark, once it has landed ----
if wanted torch || wanted torch_cuda; then
  torch_bench=$(ls bench/torch_bench* 2>/dev/null | head -n 1)
  torch_py=${LBBSP_TORCH_PYTHON:-python3}
  if [[ -z $torch_bench ]]; then
    status torch "not present" 0 "no bench/torch_bench* in this checkout"
  elif ! "$torch_py" -c "import lbbsp.torch" 2>/dev/null; then
    status torch "not present" 0 "$torch_py cannot import lbbsp.torch (pip install . into a venv with torch; LBBSP_TORCH_PYTHON=PY)"
  else
    # lbbsp.torch's CUDA path: the stand-in runs everywhere, the real device's runs must not skip where one is.
    has_gpu=0
    command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && has_gpu=1
    # -rP: each run's sizes and per-rank step times (printed by the tests) go to the log, passed or not.
    run_step torch_cuda 200 env LBBSP_REQUIRE_CUDA=$has_gpu "$torch_py" -m pytest -q -rsP -p no:cacheprovider \
      ${DEVICE_CHECK_TORCH_K:+-k "$DEVICE_CHECK_TORCH_K"} tests/python/test_torch_cuda.py
    if ((has_gpu)); then
      # The equal-split scenario of test_cuda_fast_ranks_do_not_count_their_wait_for_the_slow_one on the real
      # device, printed rather than asserted (3 ranks time-slice one GPU): what the fast and slow ranks report.
      run_step torch_cuda_equal 90 env PYTHONPATH="tests/python${PYTHONPATH:+:$PYTHONPATH}" "$torch_py" -c '
import pathlib, tempfile, test_torch_cuda as t
t.run(pathlib.Path(tempfile.mkdtemp()), "cuda", "equal", 3)'
    fi
    if ((has_gpu)) && [[ -n $data ]]; then
      # What the CUDA path costs a step: 1 rank on the GPU (NCCL), nothing to balance (bsp) against plain DDP,
      # 500 iterations (16 epochs of the synthetic data's 32), alternated; the MLP (a step the host holds up) and
      # the CNN (more of it on the device). Then each runner of the MLP once more under cProfile: where the host's
      # time goes.
      mkdir -p "$out/torch_cuda_cost" && pairs=${DEVICE_CHECK_CUDA_PAIRS:-"1 2 3"}
      models=${DEVICE_CHECK_CUDA_MODELS:-"mlp cnn"}
      cost_run() {  # NAME MODEL RUNNER [examples/torch_fmnist.py flags...]
        local name=$1 model=$2 runner=$3 flags=(--balancer bsp)
        shift 3
        [[ $runner == plain-ddp ]] && flags=(--plain-ddp)
        run_step "$name" 60 "$torch_py" examples/torch_fmnist.py --data "$data" --device cuda --spawn 1 --epochs 16 \
          --max-iterations 500 --global-batch 512 --lr 0.2 --workers 0 --read memory --model "$model" "${flags[@]}" \
          "$@"
      }
      for model in $models; do
        for pair in $pairs; do
          for runner in plain-ddp bsp; do
            cost_run "torch_cuda_cost_${model}_${runner}_$pair" "$model" "$runner" \
              --summary-json "$out/torch_cuda_cost/$model-$runner-$pair.json"
          done
        done
      done
      for runner in plain-ddp bsp; do
        cost_run "torch_cuda_profile_$runner" mlp "$runner" --profile "$out/torch_cuda_cost/profile-mlp-$runner.txt"
      done
      log "torch_cuda_cost: $("$torch_py" -c 'import json, os, sys
ms = lambda m, r, p: 1e3 * json.load(open(f"{sys.argv[1]}/{m}-{r}-{p}.json"))["mean_iteration_s"]
rows = [(m, int(p), ms(m, "plain-ddp", p), ms(m, "bsp", p)) for m in sys.argv[2].split() for p in sys.argv[3:]
        if all(os.path.exists(f"{sys.argv[1]}/{m}-{r}-{p}.json") for r in ("plain-ddp", "bsp"))]
print("; ".join("%s pair %d: plain DDP %.3f ms, DDP + lbbsp (bsp) %.3f ms" % r for r in rows))' \
        "$out/torch_cuda_cost" "$models" $pairs 2>&1 | tail -n 1)"
    fi
    # The benchmark on the synthetic data, 60 iterations (its 700 on Fashion-MNIST take ~15 min): 4 ranks on
    # cores of their own, where the 2-core VM oversubscribes them. Not with --steps torch_cuda (the CUDA part only).
    if wanted torch; then
      torch_args=(--python "$torch_py" --lbbsp "$lbbsp" --out "$out/torch")
      if ((dry)); then
        torch_args+=(--dry-run)
      elif [[ -n $data ]]; then
        torch_args+=(--data "$data" --iterations 60)
      fi
      run_step torch 180 "$torch_bench" "${torch_args[@]}"
    fi
  fi
fi

# ---- 5. kernels: the model tests, then train-step throughput by thread count, one core per thread ----
if wanted kernels; then
  kbench=$root/build/bench/bench_models ktest=$root/build/tests/test_models_kernels
  if [[ -n $bundle ]]; then
    kbench=$bundle/bin/bench_models ktest=$bundle/bin/test_models_kernels
    if grep -qw avx512f /proc/cpuinfo && [[ -x $bundle/bin/x86-64-v4/bench_models ]]; then
      kbench=$bundle/bin/x86-64-v4/bench_models ktest=$bundle/bin/x86-64-v4/test_models_kernels
    fi
  fi
  log "kernels: $kbench (the CPU $(grep -qw avx512f /proc/cpuinfo && echo has || echo lacks) AVX-512)"
  mkdir -p "$out/kernels"
  run_step kernels_tests 120 "$ktest" --gtest_brief=1
  for t in $kthreads; do
    ((t > cores)) && continue
    run_step "kernels_threads_$t" 60 env OMP_NUM_THREADS="$t" OMP_PROC_BIND=close OMP_PLACES=cores "$kbench" \
      --threads="$t" --benchmark_filter='^(peak/fma|train_step/(mlp|cnn)/batch:(64|256))' \
      --benchmark_min_time="$kmin" --benchmark_out="$out/kernels/threads-$t.json" --benchmark_out_format=json
  done
fi

# ---- 6. rank 0's logs: the long run with and without --log-dir and --timeline, alternating ----
if wanted telemetry; then
  if [[ -z $data ]]; then
    status telemetry "skipped" 0 "no dataset (data_synth failed)"
  else
    tdir=$out/telemetry
    ((dry)) || tdir=${TMPDIR:-/tmp}/lbbsp-device-check/telemetry  # ~220 MB of logs that need not travel back
    run_step telemetry 240 bench/telemetry_overhead.sh --lbbsp "$lbbsp" --mpirun "$mpirun" --data "$data" \
      --ranks 4 --iterations "$titers" --pairs "$tpairs" --out "$tdir"
  fi
fi

# ---- tables (when this machine has a python3; otherwise dev/device_tables.py OUT later) ----
if [[ -n $python ]]; then
  "$python" dev/device_tables.py "$out" >"$out/tables.md" 2>"$out/tables.err" ||
    log "tables: dev/device_tables.py failed ($(tail -n 1 "$out/tables.err")); rerun it where the files land"
fi
log "RESULT: $( ((failed)) && echo "some steps FAILED" || echo "no step failed") in $((SECONDS - t_start)) s" \
  "(status.tsv, results in $out)"
exit $failed
