#!/usr/bin/env bash
# Slurm integration test: starts a private single-node Slurm (munged, slurmctld, slurmd; tests/slurm/minicluster.sh),
# submits scripts/slurm/train.sbatch with sbatch -- srun --mpi=pmix with 2 ranks x 2 CPUs, and mpirun with
# 4 ranks (more ranks than cores: --overcommit) -- and a third with CONFIG (an `lbbsp train --config` file), waits for
# all (bounded), and checks job state, exit-code file, summary JSON, and that the runs trained the same model (same
# parameters up to float summation order).
# Needs root and the Debian packages slurm-wlm munge iproute2 (scripts/setup.sh). Usage: $0 LBBSP SCRATCH
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/single_node_setup.sh
source "$here/single_node_setup.sh"

iters=20 batch=64
common=(LBBSP_BIN="$LBBSP" DATA="$SCRATCH/data.h5" RESULTS_DIR="$SCRATCH/results" MODEL=logreg EPOCHS=1 LR=0.2
  SEED=11 "GLOBAL_BATCH=$batch" "MAX_ITERATIONS=$iters" SAVE_PARAMS=1)
# srun: submitted from the scratch folder without LBBSP_ROOT, so the script must find the repository by itself.
# -c 2 checks that SRUN_CPUS_PER_TASK carries --cpus-per-task to srun (Slurm >= 22.05 no longer does).
job_srun=$(cd "$SCRATCH" && env -u LBBSP_ROOT "${common[@]}" LAUNCHER=srun \
  timeout 30 sbatch --parsable -J lbbsp-srun -n 2 -c 2 --overcommit -t 5 -o "$SCRATCH/job-srun-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (srun variant) refused the job"
# mpirun: 4 ranks on fewer cores (--overcommit), no binding (Slurm's task/none does not bind either).
job_mpirun=$(cd "$SCRATCH" && env "${common[@]}" LBBSP_ROOT="$SRC" LAUNCHER=mpirun MPIRUN_BIND=none \
  timeout 30 sbatch --parsable -J lbbsp-mpirun -n 4 --overcommit -t 5 -o "$SCRATCH/job-mpirun-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (mpirun variant) refused the job"
# CONFIG: the training flags from an `lbbsp train --config` file; a setting in the environment wins over it
# (MAX_ITERATIONS here against the file's 999), and none of the script's defaults (model logreg, lr 0.1) is passed.
printf '[train]\ndata = "%s"\nmodel = "logreg"\nepochs = 1\nlr = 0.2\nseed = 11\n' "$SCRATCH/data.h5" >"$SCRATCH/run.toml"
printf 'global-batch = %s\nmax-iterations = 999\n' "$batch" >>"$SCRATCH/run.toml"
job_config=$(cd "$SCRATCH" && env LBBSP_BIN="$LBBSP" RESULTS_DIR="$SCRATCH/results" CONFIG=run.toml \
  "MAX_ITERATIONS=$iters" SAVE_PARAMS=1 LBBSP_ROOT="$SRC" LAUNCHER=srun \
  timeout 30 sbatch --parsable -J lbbsp-config -n 2 --overcommit -t 5 -o "$SCRATCH/job-config-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (CONFIG variant) refused the job"
echo "submitted jobs $job_srun (srun, 2 ranks), $job_mpirun (mpirun, 4 ranks) and $job_config (CONFIG, 2 ranks)"
# A real time limit (1 min, Slurm's smallest; it ends after 60-90 s, checked at the end of this test): Slurm sends
# SIGTERM to every process of the job, and each rank gets it twice (taken as a second request, it killed the ranks
# before their checkpoint in 3 of 3 such jobs). The ranks must stop together with a checkpoint, and the batch shell
# must stay to record exit 143 (it was killed too and its exit_code file said 0).
# The jobs that are stopped by a signal: long runs (logreg, srun) of an emulated slow device.
long_run=(LBBSP_BIN="$LBBSP" DATA="$SCRATCH/data.h5" RESULTS_DIR="$SCRATCH/results" MODEL=logreg LR=0.2 SEED=11
  "GLOBAL_BATCH=$batch" LBBSP_ROOT="$SRC" LAUNCHER=srun)
job_tl=$(cd "$SCRATCH" && env "${long_run[@]}" EPOCHS=100000 CHECKPOINT_DIR="$SCRATCH/ckpt_tl" \
  TRAIN_ARGS="--progress-every 1000" STRAGGLE="static:1;gpu=0.02:1000000:0:1000000" \
  timeout 30 sbatch --parsable -J lbbsp-timelimit -n 2 --overcommit -t 1 -o "$SCRATCH/job-timelimit-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (time limit variant) refused the job"
# One budget for all jobs (they run side by side), so that the test ends well inside CTest's 600 s.
JOBS_BUDGET=300
deadline=$((SECONDS + JOBS_BUDGET))

check_job() { # check_job JOBID NAME RANKS
  local job=$1 name=$2 ranks=$3 state info run=$SCRATCH/results/train-$1
  state=$(minicluster_wait "$job" $((deadline > SECONDS + 5 ? deadline - SECONDS : 5))) ||
    fail "job $job ($name) did not finish within ${JOBS_BUDGET}s of submission"
  info=$(timeout 10 scontrol -o show job "$job")
  echo "job $job ($name): $(grep -oE 'JobState=[^ ]+|ExitCode=[^ ]+' <<<"$info" | tr '\n' ' ')"
  echo "----- $SCRATCH/job-$name-$job.out"
  cat "$SCRATCH/job-$name-$job.out" || true
  [[ $state == COMPLETED ]] || fail "job $job ($name) ended $state, expected COMPLETED (output above)"
  grep -q 'ExitCode=0:0' <<<"$info" || fail "job $job ($name): $(grep -oE 'ExitCode=[^ ]+' <<<"$info"), expected 0:0"
  [[ -f $run/exit_code ]] || fail "job $job ($name) wrote no $run/exit_code"
  [[ $(cat "$run/exit_code") == 0 ]] || fail "job $job ($name): exit_code file says $(cat "$run/exit_code")"
  "$PYTHON" "$here/check_results.py" summary "$run/summary.json" --ranks "$ranks" --iterations "$iters" \
    --model logreg --global-batch "$batch" || fail "job $job ($name): summary JSON is not sane"
  [[ -s $run/params.h5 ]] || fail "job $job ($name) saved no parameters ($run/params.h5)"
}
check_job "$job_srun" srun 2
check_job "$job_mpirun" mpirun 4
check_job "$job_config" config 2
cfg_cmd=$(cat "$SCRATCH/results/train-$job_config/command.sh")
grep -q -- "--config $SCRATCH/run.toml" <<<"$cfg_cmd" || fail "CONFIG variant did not pass --config: $cfg_cmd"
! grep -qE -- '--(model|lr|data|global-batch) ' <<<"$cfg_cmd" ||
  fail "CONFIG variant passed settings that were not in the environment: $cfg_cmd"
{ grep -q -- '--cpus-per-task=2' "$SCRATCH/results/train-$job_srun/command.sh" &&
  grep -q -- '--threads 2' "$SCRATCH/results/train-$job_srun/command.sh"; } ||
  fail "srun variant did not pass 2 CPUs per task on to srun and lbbsp: $(cat "$SCRATCH/results/train-$job_srun/command.sh")"
grep -qE '^srun --mpi=pmix' "$SCRATCH/results/train-$job_srun/command.sh" || fail "srun variant did not launch with srun"
grep -qE '^mpirun ' "$SCRATCH/results/train-$job_mpirun/command.sh" || fail "mpirun variant did not launch with mpirun"

# Same data, seed and global batch: 2 and 4 ranks must end with the same parameters (float summation order aside).
"$PYTHON" "$here/check_results.py" compare "$SCRATCH/results/train-$job_srun/summary.json" \
  "$SCRATCH/results/train-$job_mpirun/summary.json" --rtol 1e-5 \
  --params "$SCRATCH/results/train-$job_srun/params.h5" "$SCRATCH/results/train-$job_mpirun/params.h5" ||
  fail "the 2-rank (srun) and 4-rank (mpirun) jobs disagree"
"$PYTHON" "$here/check_results.py" compare "$SCRATCH/results/train-$job_srun/summary.json" \
  "$SCRATCH/results/train-$job_config/summary.json" --rtol 1e-5 \
  --params "$SCRATCH/results/train-$job_srun/params.h5" "$SCRATCH/results/train-$job_config/params.h5" ||
  fail "the job configured by CONFIG trained a different model from the one configured by the environment"

# Time limits: SIGUSR1 to the batch shell alone (what `sbatch --signal=B:USR1@SECONDS` sends) reaches the ranks
# through train.sbatch and srun; they checkpoint into CHECKPOINT_DIR and stop (exit 138); the next job with the
# same CHECKPOINT_DIR resumes at that iteration. (A constant learning rate: the resume shortens the run, which a
# cosine schedule's horizon would refuse, tests/mpi/test_checkpoint.sh.)
ck=("${long_run[@]}" EPOCHS=1000 CHECKPOINT_DIR="$SCRATCH/ckpt")
job_long=$(cd "$SCRATCH" && env "${ck[@]}" MAX_ITERATIONS=100000 TRAIN_ARGS="--progress-every 1 --lr-schedule constant" \
  STRAGGLE="static:1;gpu=0.005:1000000:0:1000000" \
  timeout 30 sbatch --parsable -J lbbsp-long -n 2 --overcommit -t 5 -o "$SCRATCH/job-long-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (CHECKPOINT_DIR variant) refused the job"
log=$SCRATCH/results/train-$job_long/train.log
wait_for_iteration "$log" 30 60
timeout 10 scancel --signal=USR1 --batch "$job_long" || fail "scancel --signal=USR1 --batch $job_long failed"
state=$(minicluster_wait "$job_long" 60) || fail "job $job_long did not stop within 60 s of SIGUSR1"
cat "$SCRATCH/job-long-$job_long.out"
[[ $(cat "$SCRATCH/results/train-$job_long/exit_code") == 138 ]] ||
  fail "job $job_long ($state): exit_code $(cat "$SCRATCH/results/train-$job_long/exit_code"), expected 138"
stopped=$(grep -oE 'SIGUSR1: stopped after iteration [0-9]+' "$log" | grep -oE '[0-9]+$') ||
  fail "job $job_long: no stop message in $log"
[[ -f $SCRATCH/ckpt/$(printf 'ckpt-%012d.h5' "$stopped") ]] || fail "no checkpoint of iteration $stopped"
job_resume=$(cd "$SCRATCH" && env "${ck[@]}" MAX_ITERATIONS=$((stopped + 10)) TRAIN_ARGS="--lr-schedule constant" \
  timeout 30 sbatch --parsable -J lbbsp-resume -n 2 --overcommit -t 5 -o "$SCRATCH/job-resume-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (resume) refused the job"
state=$(minicluster_wait "$job_resume" 120) || fail "job $job_resume did not finish"
[[ $state == COMPLETED ]] || fail "job $job_resume ended $state: $(cat "$SCRATCH/job-resume-$job_resume.out")"
grep -q -- '--resume' "$SCRATCH/results/train-$job_resume/command.sh" || fail "the second job did not pass --resume"
"$PYTHON" - "$SCRATCH/results/train-$job_resume/summary.json" "$stopped" <<'PY'
import json, sys
s, stopped = json.load(open(sys.argv[1])), int(sys.argv[2])
assert s["start_iteration"] == stopped and s["iterations"] == stopped + 10 and s["stopped_by"] is None, s
print(f"ok: SIGUSR1 to the batch shell stopped the run at iteration {stopped}; the next job resumed there")
PY

# REQUEUE=1: the job stopped by SIGUSR1 puts itself back in the queue (scontrol requeue); its next start (same job
# id, SLURM_RESTART_COUNT=1, folder train-JOBID-restart1) resumes from the checkpoint and finishes the run.
rq=("${long_run[@]}" EPOCHS=1000 CHECKPOINT_DIR="$SCRATCH/ckpt_rq" REQUEUE=1 MAX_ITERATIONS=200
  TRAIN_ARGS="--progress-every 1" STRAGGLE="static:1;gpu=0.05:1000000:0:1000000")
# Slurm ends a job it requeues with SIGTERM, usually after the batch shell has exited; when the shell still ran
# (once in CI) it recorded exit 143. An scontrol that sends the shell SIGTERM after the requeue makes that certain.
mkdir -p "$SCRATCH/rqbin"
printf '#!/bin/sh\n%q "$@" || exit\n[ "$1" != requeue ] || kill -TERM "$PPID"\n' "$(command -v scontrol)" \
  >"$SCRATCH/rqbin/scontrol"
chmod +x "$SCRATCH/rqbin/scontrol"
job_rq=$(cd "$SCRATCH" && env "${rq[@]}" PATH="$SCRATCH/rqbin:$PATH" \
  timeout 30 sbatch --parsable --requeue -J lbbsp-requeue -n 2 --overcommit -t 5 -o "$SCRATCH/job-requeue-%j.out" \
  "$SRC/scripts/slurm/train.sbatch") || fail "sbatch (REQUEUE variant) refused the job"
first=$SCRATCH/results/train-$job_rq
wait_for_iteration "$first/train.log" 30 60
timeout 10 scancel --signal=USR1 --batch "$job_rq" || fail "scancel --signal=USR1 --batch $job_rq failed"
# Slurm holds a requeued job back (BeginTime, about 2 min here) while the node cleans up after its first start:
# started again at once, its step launch fails. Here it may start 10 s after the requeue instead.
info=
for _ in $(seq 60); do
  info=$(timeout 10 scontrol -o show job "$job_rq") || true
  grep -q 'JobState=PENDING' <<<"$info" && grep -q 'Restarts=1 ' <<<"$info" && break
  sleep 0.5
done
grep -q 'Restarts=1 ' <<<"$info" || fail "job $job_rq was not requeued within 30 s of SIGUSR1: $info"
echo "requeued: $(grep -oE 'JobState=[^ ]+|Reason=[^ ]+|StartTime=[^ ]+' <<<"$info" | tr '\n' ' ')"
timeout 10 scontrol update JobId="$job_rq" StartTime=now+10 || fail "scontrol update StartTime failed for $job_rq"
state=$(minicluster_wait "$job_rq" 120) || fail "requeued job $job_rq did not finish within 120 s"
cat "$SCRATCH/job-requeue-$job_rq.out"
[[ $state == COMPLETED ]] || fail "requeued job $job_rq ended $state, expected COMPLETED"
grep -q 'Restarts=1 ' <<<"$(timeout 10 scontrol -o show job "$job_rq")" ||
  fail "job $job_rq: expected Restarts=1: $(timeout 10 scontrol -o show job "$job_rq")"
[[ $(cat "$first/exit_code") == 138 ]] || fail "first start of $job_rq: exit_code $(cat "$first/exit_code"), expected 138"
stopped=$(grep -oE 'SIGUSR1: stopped after iteration [0-9]+' "$first/train.log" | grep -oE '[0-9]+$') ||
  fail "job $job_rq: no stop message in $first/train.log"
[[ $(cat "$first-restart1/exit_code") == 0 ]] || fail "second start of $job_rq: exit_code $(cat "$first-restart1/exit_code")"
grep -q -- '--resume' "$first-restart1/command.sh" || fail "the requeued start did not pass --resume"
"$PYTHON" - "$first-restart1/summary.json" "$stopped" <<'PY'
import json, sys
s, stopped = json.load(open(sys.argv[1])), int(sys.argv[2])
assert s["start_iteration"] == stopped and s["iterations"] == 200 and s["stopped_by"] is None, s
print(f"ok: REQUEUE=1: stopped at iteration {stopped}, requeued itself, resumed there and finished at 200")
PY

# The time-limited job (submitted at the start).
state=$(minicluster_wait "$job_tl" 150) || fail "job $job_tl did not end within 150 s of its 1-min time limit"
tl=$SCRATCH/results/train-$job_tl
grep -v '^iteration ' "$SCRATCH/job-timelimit-$job_tl.out"
[[ $state == TIMEOUT ]] || fail "job $job_tl ended $state, expected TIMEOUT"
[[ $(cat "$tl/exit_code") == 143 ]] || fail "job $job_tl: exit_code $(cat "$tl/exit_code"), expected 143 (SIGTERM)"
stopped=$(grep -oE 'SIGTERM: stopped after iteration [0-9]+' "$tl/train.log" | grep -oE '[0-9]+$') ||
  fail "job $job_tl: the ranks did not stop gracefully at the time limit: $(grep -v '^iteration ' "$tl/train.log")"
[[ -f $SCRATCH/ckpt_tl/$(printf 'ckpt-%012d.h5' "$stopped") ]] ||
  fail "job $job_tl: no checkpoint of iteration $stopped: $(ls "$SCRATCH/ckpt_tl")"
"$PYTHON" - "$tl/summary.json" "$stopped" <<'PY'
import json, sys
s, stopped = json.load(open(sys.argv[1])), int(sys.argv[2])
assert s["stopped_by"] == "SIGTERM" and s["iterations"] == stopped, s
print(f"ok: at the time limit the ranks stopped after iteration {stopped} with a checkpoint; exit_code 143")
PY

# REQUEUE's guards, without the cluster: a bad value or no CHECKPOINT_DIR is refused before anything runs, and a
# start that stopped where it began is not requeued (that would loop), while one that got further is.
out=$(env SLURM_JOB_ID=1 LBBSP_BIN="$LBBSP" LBBSP_ROOT="$SRC" RESULTS_DIR="$SCRATCH/guard" REQUEUE=1 \
  bash "$SRC/scripts/slurm/train.sbatch" 2>&1) && fail "REQUEUE=1 without CHECKPOINT_DIR was accepted: $out"
grep -q 'REQUEUE=1 needs CHECKPOINT_DIR' <<<"$out" || fail "REQUEUE=1 without CHECKPOINT_DIR: $out"
out=$(env SLURM_JOB_ID=1 LBBSP_BIN="$LBBSP" LBBSP_ROOT="$SRC" RESULTS_DIR="$SCRATCH/guard" REQUEUE=yes \
  CHECKPOINT_DIR="$SCRATCH/guard/ck" bash "$SRC/scripts/slurm/train.sbatch" 2>&1) && fail "REQUEUE=yes was accepted"
grep -q "REQUEUE='yes': use REQUEUE=1" <<<"$out" || fail "REQUEUE=yes: $out"
mkdir -p "$SCRATCH/guard/bin"
printf '#!/bin/sh\necho "$@" >>"%s"\n' "$SCRATCH/guard/scontrol.calls" >"$SCRATCH/guard/bin/scontrol"
chmod +x "$SCRATCH/guard/bin/scontrol"
printf '{\n  "iterations": 40,\n  "start_iteration": 40\n}\n' >"$SCRATCH/guard/same.json"
printf '{\n  "iterations": 41,\n  "start_iteration": 40\n}\n' >"$SCRATCH/guard/further.json"
out=$(PATH="$SCRATCH/guard/bin:$PATH" SLURM_JOB_ID=77 CHECKPOINT_DIR=/ck bash -c \
  "source '$SRC/scripts/slurm/lib.sh'; lbbsp_requeue '$SCRATCH/guard/same.json'" 2>&1)
grep -q 'not requeued: the run stopped at iteration 40, where it started' <<<"$out" || fail "no-progress guard: $out"
[[ ! -e $SCRATCH/guard/scontrol.calls ]] || fail "a start without progress was requeued"
PATH="$SCRATCH/guard/bin:$PATH" SLURM_JOB_ID=77 CHECKPOINT_DIR=/ck bash -c \
  "source '$SRC/scripts/slurm/lib.sh'; lbbsp_requeue '$SCRATCH/guard/further.json'" >/dev/null
[[ $(cat "$SCRATCH/guard/scontrol.calls") == "requeue 77" ]] || fail "a start with progress was not requeued"
echo "ok: REQUEUE guards"
