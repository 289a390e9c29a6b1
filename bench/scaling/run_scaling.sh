#!/usr/bin/env bash
# Strong and weak scaling of `lbbsp train` on this machine with mpirun (1, 2, 4, 8 ranks by default, oversubscribed
# where there are fewer cores), or tables/plots of runs made elsewhere (the Slurm scripts' results folders).
#
#   bench/scaling/run_scaling.sh [options]                      # run both sweeps here, then tabulate and plot
#   bench/scaling/run_scaling.sh --collect-strong DIR --collect-weak DIR [--out OUT]   # Slurm results, no runs
#
# Options:
#   --lbbsp PATH           lbbsp binary (default: build/lbbsp)
#   --ranks "1 2 4 8"      rank counts
#   --kinds strong,weak    which sweeps to run
#   --model NAME           logreg | mlp | cnn (default mlp: enough compute per sample to be worth splitting)
#   --data FILE            HDF5 dataset (default: a synthetic one, written once into OUT)
#   --features F           features of the synthetic dataset (default 256)
#   --global-batch X       strong scaling: fixed global batch (default 1024)
#   --per-rank-batch B     weak scaling: batch per rank (default 128)
#   --iterations K         iterations per run (default 30; the synthetic set holds enough samples for K)
#   --epochs E             epochs cap (default 1; raise it with a small --data so that K iterations happen)
#   --repeats R            runs per rank count; the tables use the median (default 1)
#   --out DIR              results (default results/scaling-DATE); OUT/{strong,weak}/ranks-N[-rep]/summary.json
#   --collect-strong DIR, --collect-weak DIR   only tabulate/plot existing results (repeatable)
#   --no-plot              tables only
#   --busy-poll            idle MPI ranks spin instead of yielding the CPU (Open MPI's default when ranks <= cores:
#                          best on a dedicated machine, 2x slower here on one shared with other work)
#   --train-args "..."     extra `lbbsp train` arguments (e.g. "--balancer lbbsp-cpu --straggle static:1,1,0.5")
#   --mpirun PATH          the launcher (default: mpirun; e.g. /usr/bin/orterun from a bundle)
#   --bind core|none       core: one core per rank, `--bind-to core --map-by core` (overload-allowed where there are
#                          more ranks than cores); none (default): ranks float, as oversubscribed ranks must
#   --no-tables            runs only (no Python at hand): tabulate later with --collect-strong/--collect-weak
# Writes OUT/scaling.md (speed-up and efficiency tables) and OUT/strong.png, OUT/weak.png (against the ideal line).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
die() {
  echo "run_scaling: error: $*" >&2
  exit 1
}

lbbsp=$root/build/lbbsp ranks="1 2 4 8" kinds=strong,weak model=mlp features=256 data="" gbatch=1024 pbatch=128 iters=30
epochs=1 repeats=1 out="" yield=1 plot=1 tables=1 train_args="" mpirun=mpirun bind=none collect_strong=() collect_weak=()
while (($#)); do
  case $1 in
    --lbbsp) lbbsp=$2 ;;
    --ranks) ranks=$2 ;;
    --kinds) kinds=$2 ;;
    --model) model=$2 ;;
    --data) data=$2 ;;
    --features) features=$2 ;;
    --global-batch) gbatch=$2 ;;
    --per-rank-batch) pbatch=$2 ;;
    --iterations) iters=$2 ;;
    --epochs) epochs=$2 ;;
    --repeats) repeats=$2 ;;
    --out) out=$2 ;;
    --collect-strong) collect_strong+=("$2") ;;
    --collect-weak) collect_weak+=("$2") ;;
    --train-args) train_args=$2 ;;
    --mpirun) mpirun=$2 ;;
    --bind) bind=$2 ;;
    --no-tables) tables=0 plot=0; shift; continue ;;
    --no-plot) plot=0; shift; continue ;;
    --busy-poll) yield=0; shift; continue ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  (($# >= 2)) || die "option $1 needs a value"
  shift 2
done
out=${out:-$root/results/scaling-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# A Python with matplotlib (a pyenv/venv python3 first on PATH often lacks Debian's python3-matplotlib).
python=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && { ((plot == 0)) || "$p" -c 'import matplotlib' 2>/dev/null; }; then
    python=$p
    break
  fi
done
[[ -n $python ]] || ((tables == 0)) ||
  die "no python3 with matplotlib: install the Debian package python3-matplotlib, set PYTHON=..., or use --no-plot"

strong_dirs=("${collect_strong[@]}") weak_dirs=("${collect_weak[@]}")
if ((${#collect_strong[@]} + ${#collect_weak[@]} == 0)); then
  [[ -x $lbbsp ]] || die "lbbsp binary '$lbbsp' not found: build it (cmake -S . -B build && cmake --build build)" \
    "or pass --lbbsp PATH"
  command -v "$mpirun" >/dev/null || die "launcher '$mpirun' not found: install openmpi-bin or pass --mpirun PATH"
  case $bind in core | none) ;; *) die "--bind '$bind': use core or none" ;; esac
  for r in $ranks; do [[ $r =~ ^[1-9][0-9]*$ ]] || die "--ranks '$ranks': expected positive integers"; done
  [[ $iters =~ ^[1-9][0-9]*$ ]] || die "--iterations '$iters': expected a positive integer"
  if [[ -z $data ]]; then
    # Enough samples for K iterations of the largest global batch in one epoch.
    max_r=1
    for r in $ranks; do ((r > max_r)) && max_r=$r; done
    max_gb=$((gbatch > pbatch * max_r ? gbatch : pbatch * max_r))
    data=$out/synth-$((max_gb * iters))x$features.h5
    [[ -s $data ]] || "$lbbsp" data synth --samples "$((max_gb * iters))" --features "$features" --classes 10 --seed 1 \
      --out "$data" >/dev/null || die "'$lbbsp data synth' failed"
  fi
  [[ -r $data ]] || die "--data '$data' is not a readable file"
  extra=()
  [[ -n $train_args ]] && read -ra extra <<<"$train_args"
  # Open MPI: allow root, more ranks than cores, and no binding (oversubscribed ranks must float).
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
  export OMPI_MCA_mpi_yield_when_idle=$yield
  for kind in ${kinds//,/ }; do
    case $kind in strong | weak) ;; *) die "--kinds '$kinds': use strong, weak or strong,weak" ;; esac
    for r in $ranks; do
      gb=$gbatch
      [[ $kind == weak ]] && gb=$((pbatch * r))
      for ((k = 1; k <= repeats; ++k)); do
        dir=$out/$kind/ranks-$r
        ((repeats > 1)) && dir=$dir-$k
        mkdir -p "$dir"
        t0=$SECONDS
        binding=(--bind-to none)
        if [[ $bind == core ]]; then
          binding=(--bind-to core --map-by core --report-bindings)  # train.log shows each rank's core
          ((r > $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc))) && binding=(--bind-to core:overload-allowed --map-by core --report-bindings)
        fi
        if ! timeout 900 "$mpirun" -n "$r" --oversubscribe "${binding[@]}" "$lbbsp" train --data "$data" --model "$model" \
          --epochs "$epochs" --global-batch "$gb" --lr 0.05 --seed 1 --max-iterations "$iters" --threads 1 --bind none \
          --quiet --summary-json "$dir/summary.json" "${extra[@]}" >"$dir/train.log" 2>&1; then
          cat "$dir/train.log" >&2
          die "$kind scaling run with $r ranks failed (log above, $dir/train.log)"
        fi
        echo "run_scaling: $kind ranks=$r global_batch=$gb: $((SECONDS - t0)) s -> $dir/summary.json"
      done
    done
    if [[ $kind == strong ]]; then strong_dirs+=("$out/strong"); else weak_dirs+=("$out/weak"); fi
  done
fi

args=(--out "$out" --cores "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)")
for d in "${strong_dirs[@]}"; do args+=(--strong "$d"); done
for d in "${weak_dirs[@]}"; do args+=(--weak "$d"); done
((plot)) || args+=(--no-plot)
((tables)) || { echo "run_scaling: runs in $out (--no-tables: tabulate with --collect-strong/--collect-weak)"; exit 0; }
"$python" "$root/bench/scaling/plot_scaling.py" "${args[@]}"
