# An error on one rank ends the whole job promptly with a non-zero exit and a message naming the rank and cause.
source "$(dirname "$0")/../cli/common.sh"
DATA=$SCRATCH/synth.h5
"$LBBSP" data synth --samples 2048 --features 64 --classes 4 --seed 1 --out "$DATA" >/dev/null
TRAIN=(train --data "$DATA" --model mlp --hidden 32 --epochs 50 --global-batch 32 --lr 0.05 --quiet)

# expect_prompt_fail SECONDS PATTERN CMD...: fails with PATTERN within SECONDS.
expect_prompt_fail() {
  local limit=$1; shift
  local start=$SECONDS
  expect_fail "$@"
  ((SECONDS - start <= limit)) || fail "took $((SECONDS - start)) s (limit $limit s): $*"
}

expect_prompt_fail 30 "rank 1: error: injected fault \(throw\) at iteration 3" \
  mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --inject-fault 1:3:throw
expect_prompt_fail 30 "loss is NaN at iteration 2" mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --inject-fault 1:2:nan
expect_prompt_fail 30 "rank 1.*(signal 6|Abort)" mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --inject-fault 1:4:abort
expect_prompt_fail 40 "rank [0-9]: error: no progress for" \
  mpirun_n 3 "$LBBSP" "${TRAIN[@]}" --inject-fault 2:5:hang --iteration-timeout 4
# Bad configuration: one message from rank 0, non-zero exit.
expect_prompt_fail 30 "inject-fault: rank 9 is not in 0..1 \(in '9:1:throw'" \
  mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --inject-fault 9:1:throw
out=$(mpirun_n 2 "$LBBSP" "${TRAIN[@]}" --balancer nosuch 2>&1 || true)
[[ $(grep -c "error:" <<<"$out") -eq 1 ]] || fail "a bad --balancer should be reported once, got: $out"
grep -q "nosuch" <<<"$out" || fail "the message should name the bad balancer: $out"

# SIGKILL of one rank mid-run: the job ends promptly with a non-zero exit.
mpirun_n 3 "$LBBSP" "${TRAIN[@]}" --seed 424242 >"$SCRATCH/kill.log" 2>&1 &
job=$!
victim=$(find_rank_pid "--seed 424242")
sleep 1
kill_rank_expect_prompt_end "$victim" $job
