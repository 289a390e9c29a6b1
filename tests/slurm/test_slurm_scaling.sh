#!/usr/bin/env bash
# Slurm scaling-script test: on a private single-node Slurm (tests/slurm/minicluster.sh), runs
# scripts/slurm/strong_scaling.sbatch (srun) and weak_scaling.sbatch (mpirun) over 1 and 2 ranks, checks every
# run's summary (ranks, global batch fixed or per rank) and that bench/scaling/plot_scaling.py makes the tables.
# Needs root and the Debian packages slurm-wlm munge iproute2 (scripts/setup.sh). Usage: $0 LBBSP SCRATCH
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/slurm/single_node_setup.sh
source "$here/single_node_setup.sh"
iters=8
common=(LBBSP_BIN="$LBBSP" LBBSP_ROOT="$SRC" DATA="$SCRATCH/data.h5" RESULTS_DIR="$SCRATCH/results" MODEL=logreg
  LR=0.1 SEED=3 "MAX_ITERATIONS=$iters" RANKS="1 2")
job_strong=$(cd "$SCRATCH" && env "${common[@]}" LAUNCHER=srun GLOBAL_BATCH=96 \
  timeout 30 sbatch --parsable -n 2 -t 5 -o "$SCRATCH/job-strong-%j.out" "$SRC/scripts/slurm/strong_scaling.sbatch") ||
  fail "sbatch refused strong_scaling.sbatch"
job_weak=$(cd "$SCRATCH" && env "${common[@]}" LAUNCHER=mpirun MPIRUN_BIND=none PER_RANK_BATCH=32 \
  timeout 30 sbatch --parsable -n 2 -t 5 -o "$SCRATCH/job-weak-%j.out" "$SRC/scripts/slurm/weak_scaling.sbatch") ||
  fail "sbatch refused weak_scaling.sbatch"
echo "submitted jobs $job_strong (strong, srun) and $job_weak (weak, mpirun)"
# One budget for all jobs (they run side by side), so that the test ends well inside CTest's 600 s.
JOBS_BUDGET=300
deadline=$((SECONDS + JOBS_BUDGET))

check_sweep() { # check_sweep JOBID KIND BATCH_FOR_1 BATCH_FOR_2
  local job=$1 kind=$2 state dir=$SCRATCH/results/$2-$1 r gb
  state=$(minicluster_wait "$job" $((deadline > SECONDS + 5 ? deadline - SECONDS : 5))) ||
    fail "job $job ($kind) did not finish within ${JOBS_BUDGET}s of submission"
  echo "----- $SCRATCH/job-$kind-$job.out"
  cat "$SCRATCH/job-$kind-$job.out" || true
  [[ $state == COMPLETED ]] || fail "job $job ($kind) ended $state, expected COMPLETED (output above)"
  [[ $(cat "$dir/exit_code" 2>/dev/null) == 0 ]] || fail "job $job ($kind): $dir/exit_code missing or not 0"
  for r in 1 2; do
    gb=$3
    ((r == 2)) && gb=$4
    "$PYTHON" "$here/check_results.py" summary "$dir/ranks-$r/summary.json" --ranks "$r" --iterations "$iters" \
      --model logreg --global-batch "$gb" || fail "job $job ($kind): summary of the $r-rank run is not sane"
  done
}
check_sweep "$job_strong" strong 96 96
check_sweep "$job_weak" weak 32 64

"$PYTHON" "$SRC/bench/scaling/plot_scaling.py" --strong "$SCRATCH/results/strong-$job_strong" \
  --weak "$SCRATCH/results/weak-$job_weak" --out "$SCRATCH/plots" --cores 2 >"$SCRATCH/plot.log" 2>&1 ||
  { cat "$SCRATCH/plot.log"; fail "plot_scaling.py failed on the Slurm results"; }
for kind in strong weak; do
  [[ -s $SCRATCH/plots/$kind.png ]] || fail "plot_scaling.py wrote no $kind.png"
  rows=$(awk -v k="## ${kind^} scaling" 'index($0, k) == 1 {on = 1; next} /^## / {on = 0} on && /^\| [12] \|/' \
    "$SCRATCH/plots/scaling.md" | wc -l)
  ((rows == 2)) || fail "scaling.md has $rows rows for $kind scaling, expected 2 (1 and 2 ranks)"
done
cat "$SCRATCH/plots/scaling.md"
