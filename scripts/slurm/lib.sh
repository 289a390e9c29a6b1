# Shared by train.sbatch, strong_scaling.sbatch and weak_scaling.sbatch: sourced inside a Slurm batch job, never run.
# Settings come from the environment (sbatch exports the submitter's environment by default); see README.md.
# shellcheck shell=bash

lbbsp_die() {
  echo "lbbsp-slurm: error: $*" >&2
  exit 1
}
lbbsp_log() { echo "lbbsp-slurm: $(date -u +%FT%TZ) $*"; }

# lbbsp_init: checks the job and the settings, fills in defaults, exports the thread settings.
# Sets LBBSP_BIN, LAUNCHER, CPT (CPUs per task), NNODES, TASKS_PER_NODE, RESULTS_DIR and the training settings.
lbbsp_init() {
  [[ -n ${SLURM_JOB_ID:-} ]] ||
    lbbsp_die "not inside a Slurm job: submit this script with sbatch (see scripts/slurm/README.md)"
  LBBSP_BIN=${LBBSP_BIN:-$LBBSP_ROOT/build/lbbsp}
  [[ -x $LBBSP_BIN ]] ||
    lbbsp_die "lbbsp binary '$LBBSP_BIN' is missing or not executable: build it (cmake -S . -B build &&" \
      "cmake --build build) on a filesystem every node sees, or set LBBSP_BIN=/path/to/lbbsp"
  LAUNCHER=${LAUNCHER:-srun}
  case $LAUNCHER in
    srun | mpirun) ;;
    *) lbbsp_die "LAUNCHER='$LAUNCHER' is not supported: use LAUNCHER=srun or LAUNCHER=mpirun" ;;
  esac
  command -v "$LAUNCHER" >/dev/null || lbbsp_die "LAUNCHER=$LAUNCHER but '$LAUNCHER' is not on PATH on $(hostname)"

  # Slurm >= 22.05: srun no longer inherits --cpus-per-task from sbatch/salloc, so without this every rank of a
  # `--cpus-per-task=C` job would get one CPU. SRUN_CPUS_PER_TASK is what srun reads instead.
  CPT=${SLURM_CPUS_PER_TASK:-1}
  export SRUN_CPUS_PER_TASK=$CPT
  # One kernel thread per allocated CPU, and no hidden thread pools on top (OpenMP, OpenBLAS).
  export OMP_NUM_THREADS=$CPT OPENBLAS_NUM_THREADS=$CPT
  THREADS=${THREADS:-$CPT}

  NNODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
  local ntasks=${SLURM_NTASKS:-1}
  TASKS_PER_NODE=$(((ntasks + NNODES - 1) / NNODES))

  # CONFIG: an `lbbsp train --config` file (e.g. a run's logs/config.toml). With it, only the settings given in the
  # environment become flags (they win over the file); without it, these defaults do.
  CONFIG=${CONFIG:-}
  if [[ -n $CONFIG ]]; then
    [[ -r $CONFIG ]] || lbbsp_die "CONFIG=$CONFIG is not a readable file (it must be on a filesystem every node sees)"
    CONFIG=$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")
  else
    MODEL=${MODEL:-logreg}
    EPOCHS=${EPOCHS:-1}
    LR=${LR:-0.1}
    SEED=${SEED:-1}
  fi
  MODEL=${MODEL:-}
  EPOCHS=${EPOCHS:-}
  LR=${LR:-}
  SEED=${SEED:-}
  MAX_ITERATIONS=${MAX_ITERATIONS:-}
  BALANCER=${BALANCER:-}
  PREDICTOR=${PREDICTOR:-}
  STRAGGLE=${STRAGGLE:-}
  SAVE_PARAMS=${SAVE_PARAMS:-0}
  CHECKPOINT_DIR=${CHECKPOINT_DIR:-}
  CHECKPOINT_EVERY=${CHECKPOINT_EVERY:-}
  if [[ -n $CHECKPOINT_DIR ]]; then
    mkdir -p "$CHECKPOINT_DIR" || lbbsp_die "cannot create CHECKPOINT_DIR=$CHECKPOINT_DIR (it must be shared)"
    CHECKPOINT_DIR=$(cd "$CHECKPOINT_DIR" && pwd)
  fi
  TRAIN_ARGS=${TRAIN_ARGS:-}
  # The launcher binds (srun --cpu-bind, mpirun --bind-to), so lbbsp's own hwloc binding stays off by default.
  LBBSP_BIND=${LBBSP_BIND:-none}
  CPU_BIND=${CPU_BIND:-cores}
  MPIRUN_BIND=${MPIRUN_BIND:-core}
  SRUN_MPI=${SRUN_MPI:-pmix}
  RESULTS_DIR=${RESULTS_DIR:-$LBBSP_ROOT/results/slurm}
  mkdir -p "$RESULTS_DIR" || lbbsp_die "cannot create RESULTS_DIR=$RESULTS_DIR (it must be writable from every node)"
  RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
  lbbsp_log "job $SLURM_JOB_ID on ${SLURM_JOB_NODELIST:-?}: $ntasks tasks on $NNODES node(s)," \
    "$CPT CPU(s) per task, launcher $LAUNCHER, binary $LBBSP_BIN"
}

# lbbsp_data DIR: sets DATA; uses $DATA when given, else writes a synthetic set into DIR (once).
lbbsp_data() {
  if [[ -n ${DATA:-} ]]; then
    [[ -r $DATA ]] || lbbsp_die "DATA=$DATA is not a readable file (it must be on a filesystem every node sees)"
    return 0
  fi
  if [[ -n $CONFIG ]]; then # the file's `data` (lbbsp says "--data is required" when it has none)
    DATA=
    return 0
  fi
  DATA=$1/synth.h5
  [[ -s $DATA ]] && return 0
  lbbsp_log "no DATA given: writing a synthetic dataset to $DATA"
  "$LBBSP_BIN" data synth --samples "${SYNTH_SAMPLES:-8192}" --features "${SYNTH_FEATURES:-64}" \
    --classes "${SYNTH_CLASSES:-10}" --seed "$SEED" --out "$DATA" ||
    lbbsp_die "'$LBBSP_BIN data synth' failed (see above)"
}

# lbbsp_train RANKS GLOBAL_BATCH OUTDIR: one training run of RANKS ranks; writes OUTDIR/summary.json, train.log,
# command.sh and exit_code. Returns the launcher's exit status (non-zero also when no summary was written).
lbbsp_train() {
  local ranks=$1 gbatch=$2 out=$3
  mkdir -p "$out" || lbbsp_die "cannot create the run folder '$out'"
  local args=(train --threads "$THREADS" --bind "$LBBSP_BIND" --log-dir "$out/logs" --summary-json "$out/summary.json")
  [[ -n $CONFIG ]] && args+=(--config "$CONFIG")
  [[ -n $DATA ]] && args+=(--data "$DATA")
  [[ -n $MODEL ]] && args+=(--model "$MODEL")
  [[ -n $EPOCHS ]] && args+=(--epochs "$EPOCHS")
  [[ -n $gbatch ]] && args+=(--global-batch "$gbatch")
  [[ -n $LR ]] && args+=(--lr "$LR")
  [[ -n $SEED ]] && args+=(--seed "$SEED")
  [[ -n $MAX_ITERATIONS ]] && args+=(--max-iterations "$MAX_ITERATIONS")
  [[ -n $BALANCER ]] && args+=(--balancer "$BALANCER")
  [[ -n $PREDICTOR ]] && args+=(--predictor "$PREDICTOR")
  [[ -n $STRAGGLE ]] && args+=(--straggle "$STRAGGLE")
  [[ $SAVE_PARAMS == 1 ]] && args+=(--save-params "$out/params.h5")
  if [[ -n $CHECKPOINT_DIR ]]; then
    args+=(--checkpoint-dir "$CHECKPOINT_DIR")
    [[ -n $CHECKPOINT_EVERY ]] && args+=(--checkpoint-every "$CHECKPOINT_EVERY")
    # A checkpoint there is an earlier job of the same run (stopped by its time limit, preempted, crashed).
    compgen -G "$CHECKPOINT_DIR/ckpt-*.h5" >/dev/null && args+=(--resume)
  fi
  local extra=()
  [[ -n $TRAIN_ARGS ]] && read -ra extra <<<"$TRAIN_ARGS"
  args+=("${extra[@]}")

  local cmd=() launcher_extra=()
  case $LAUNCHER in
    srun)
      # Pack the ranks onto as few nodes as hold them (assumes the same task count on every node).
      local nodes=$(((ranks + TASKS_PER_NODE - 1) / TASKS_PER_NODE))
      ((nodes > NNODES)) && nodes=$NNODES
      [[ -n ${SRUN_ARGS:-} ]] && read -ra launcher_extra <<<"$SRUN_ARGS"
      cmd=(srun --mpi="$SRUN_MPI" --ntasks="$ranks" --nodes="$nodes" --cpus-per-task="$CPT"
        --cpu-bind="$CPU_BIND" --kill-on-bad-exit=1 "${launcher_extra[@]}" "$LBBSP_BIN" "${args[@]}")
      ;;
    mpirun)
      # Open MPI reads the allocation from Slurm (slots = tasks per node) and starts its daemons with srun.
      local map=slot
      [[ $MPIRUN_BIND != none ]] && map="slot:PE=$CPT"
      [[ -n ${MPIRUN_ARGS:-} ]] && read -ra launcher_extra <<<"$MPIRUN_ARGS"
      cmd=(mpirun -np "$ranks" --map-by "$map" --bind-to "$MPIRUN_BIND" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS
        "${launcher_extra[@]}" "$LBBSP_BIN" "${args[@]}")
      ;;
  esac
  printf '%q ' "${cmd[@]}" >"$out/command.sh"
  echo >>"$out/command.sh"
  lbbsp_log "run: $(cat "$out/command.sh")"
  # In the background, so that this shell can pass on a SIGUSR1 sent to it alone (sbatch --signal=B:USR1@SECONDS):
  # srun and mpirun forward it to the ranks, which checkpoint and stop together (exit 138).
  # SIGTERM (time limit, scancel) reaches every process of the job: the ranks stop the same way (exit 143; each
  # gets it twice, which lbbsp counts as one), while this shell and tee stay to record it (train.log, exit_code),
  # and a sweep runs nothing more. Not passed on: a second SIGTERM makes srun kill the ranks at once ("forcing job
  # termination").
  local rc=0 pid term=0 term_before
  term_before=$(trap -p TERM)
  "${cmd[@]}" > >(trap '' TERM USR1 && exec tee "$out/train.log") 2>&1 &
  pid=$!
  trap 'lbbsp_log "SIGUSR1: passing it on to the ranks"; kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'term=1; lbbsp_log "SIGTERM: waiting for the ranks to checkpoint and stop"' TERM
  while true; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break # else wait was cut short by a trap
  done
  trap - USR1
  eval "${term_before:-trap - TERM}"
  if ((rc == 0)) && [[ ! -s $out/summary.json ]]; then
    echo "lbbsp-slurm: error: $LAUNCHER exited 0 but no $out/summary.json was written (see the output above)" >&2
    rc=3
  fi
  echo "$rc" >"$out/exit_code"
  lbbsp_log "ranks=$ranks global_batch=$gbatch exit=$rc -> $out"
  ((term == 0)) || exit "$rc" # the job is being ended
  return "$rc"
}

# lbbsp_requeue SUMMARY: puts this job back in the queue (scontrol requeue; Slurm starts the batch script again,
# which resumes from CHECKPOINT_DIR), unless the run in SUMMARY got no further than it started: then a requeue
# would only repeat itself (the warning comes before the first iteration ends), so it says so and leaves it.
lbbsp_requeue() {
  local summary=$1 start stop
  start=$(grep -oE '"start_iteration": [0-9]+' "$summary" 2>/dev/null | grep -oE '[0-9]+$') || start=
  stop=$(grep -oE '"iterations": [0-9]+' "$summary" 2>/dev/null | grep -oE '[0-9]+$') || stop=
  if [[ -z $start || -z $stop ]]; then
    echo "lbbsp-slurm: error: not requeued: no iteration counts in '$summary' (see train.log)" >&2
    return 0
  fi
  if ((stop <= start)); then
    echo "lbbsp-slurm: error: not requeued: the run stopped at iteration $stop, where it started; give the job" \
      "more time than set-up plus one iteration before the signal (sbatch --time, --signal=B:USR1@SECONDS)" >&2
    return 0
  fi
  lbbsp_log "requeueing job $SLURM_JOB_ID: the next start resumes at iteration $stop from $CHECKPOINT_DIR"
  scontrol requeue "$SLURM_JOB_ID" ||
    echo "lbbsp-slurm: error: 'scontrol requeue $SLURM_JOB_ID' failed (a job submitted with --no-requeue, or" \
      "JobRequeue=0 in slurm.conf: submit with sbatch --requeue); resubmit with the same CHECKPOINT_DIR" >&2
}

# lbbsp_rank_list: the rank counts of a scaling sweep: $RANKS if set, else 1 2 4 ... up to SLURM_NTASKS (and it).
lbbsp_rank_list() {
  local max=${SLURM_NTASKS:-1} r=1 list=()
  ((max > 1)) || [[ -n ${RANKS:-} ]] ||
    lbbsp_die "this job has one task, so there is nothing to sweep: submit with --ntasks=N (or --nodes=N" \
      "--ntasks-per-node=M)"
  if [[ -n ${RANKS:-} ]]; then
    read -ra list <<<"$RANKS"
    for r in "${list[@]}"; do
      [[ $r =~ ^[1-9][0-9]*$ ]] || lbbsp_die "RANKS='$RANKS': expected positive integers separated by spaces"
      ((r <= max)) || lbbsp_die "RANKS has $r but the job has only $max tasks: submit with --ntasks=$r or more"
    done
  else
    while ((r < max)); do
      list+=("$r")
      r=$((r * 2))
    done
    list+=("$max")
  fi
  echo "${list[@]}"
}
