# An error on one rank ends the whole job promptly with a non-zero exit and a message naming the rank and cause.
# Every run here has an iteration budget it cannot reach (100,000 epochs), so it ends only through its fault; the
# time that counts is from the fault's iteration to the end of the job, whatever the machine's speed.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null
TRAIN=(train --data "$DATA" --model mlp --hidden 32 --epochs 100000 --global-batch 32 --lr 0.05 --progress-every 1)

# expect_fault_end NAME RANKS ITERATION LIMIT PATTERN ARGS...: the run (RANKS ranks, ARGS added) reaches
# ITERATION - 1 or dies; from then it ends within LIMIT s, non-zero, printing PATTERN (grep -E).
expect_fault_end() {
  local name=$1 ranks=$2 it=$3 limit=$4 pattern=$5; shift 5
  local log=$SCRATCH/$name.log
  mpirun_n "$ranks" "$LBBSP" "${TRAIN[@]}" "$@" >"$log" 2>&1 &
  local job=$! start
  wait_for_iteration_or_end "$log" $((it - 1)) $job 120
  start=$SECONDS
  wait_job $job "$limit" "$name: the job after its fault at iteration $it"
  ((JOB_RC != 0)) || fail "$name: exit 0: $(tail -n 5 "$log")"
  grep -qE -- "$pattern" "$log" || fail "$name: expected /$pattern/, got: $(grep -v '^iteration' "$log" | tail -n 20)"
  echo "ok: $name: exit $JOB_RC $((SECONDS - start)) s after iteration $((it - 1)): $pattern"
}

expect_fault_end throw 2 3 30 "rank 1: error: injected fault \(throw\) at iteration 3" --inject-fault 1:3:throw
expect_fault_end nan 2 2 30 "loss is NaN at iteration 2" --inject-fault 1:2:nan
expect_fault_end abort 2 4 30 "rank 1.*(signal 6|Abort)" --inject-fault 1:4:abort
# A hung rank: the others' watchdog ends the job --iteration-timeout (4 s) after their last progress.
expect_fault_end hang 3 5 40 "rank [0-9]: error: no progress for" --inject-fault 2:5:hang --iteration-timeout 4
# Bad configuration: one message from rank 0, non-zero exit, before any iteration.
expect_fail "inject-fault: rank 9 is not in 0..1 \(in '9:1:throw'" mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --inject-fault 9:1:throw
out=$(mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --balancer nosuch 2>&1 || true)
[[ $(grep -c "error:" <<<"$out") -eq 1 ]] || fail "a bad --balancer should be reported once, got: $out"
grep -q "nosuch" <<<"$out" || fail "the message should name the bad balancer: $out"

# SIGKILL of one rank mid-run (past iteration 20, so set-up is over): the job ends promptly, non-zero.
mpirun_n 3 "$LBBSP" "${TRAIN[@]}" --seed 424242 >"$SCRATCH/kill.log" 2>&1 &
job=$!
victim=$(find_rank_pid "--seed 424242")
wait_for_iteration "$SCRATCH/kill.log" 20 120
kill_rank_expect_prompt_end "$victim" $job
echo "fault tests passed"
