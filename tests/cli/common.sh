# Shared helpers for the shell integration tests. Source it; it sets LBBSP, SCRATCH and `fail`/`expect_fail`.
set -euo pipefail
LBBSP=${1:?usage: test.sh PATH_TO_LBBSP SCRATCH_DIR}
SCRATCH=${2:?usage: test.sh PATH_TO_LBBSP SCRATCH_DIR}
rm -rf "$SCRATCH"; mkdir -p "$SCRATCH"
MPIEXEC=${MPIEXEC:-mpiexec}
# Open MPI refuses root and more ranks than cores unless told; tests run as root in CI and oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mpirun_n() { local n=$1; shift; timeout 300 "$MPIEXEC" -n "$n" --oversubscribe --bind-to none "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_fail PATTERN CMD...: CMD must exit non-zero and print PATTERN (grep -E) on stderr or stdout.
expect_fail() {
  local pattern=$1; shift
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [[ $rc -ne 0 ]] || fail "expected failure, got exit 0: $*"
  grep -qE -- "$pattern" <<<"$out" || fail "expected message /$pattern/ from: $* ; got: $out"
  echo "ok (exit $rc): $pattern"
}
# find_rank_pid MARKER: pid of one lbbsp rank whose command line contains MARKER (waits up to 30 s). Matches the
# executable, not the name: lbbsp re-executes itself at start-up.
rank_pids() {
  local exe
  exe=$(readlink -f "$LBBSP")
  pgrep -f -- "$1" | while read -r p; do [[ $(readlink /proc/$p/exe 2>/dev/null) == "$exe" ]] && echo "$p"; done || true
}
# The pid is taken from the same look that found it: a second look can miss a rank whose /proc/PID/exe is
# unreadable for a moment while it re-executes itself (seen on one core: `kill: '': not a pid`).
FOUND_RANK_PID=""
has_rank() { FOUND_RANK_PID=$(rank_pids "$1" | tail -n 1); [[ -n $FOUND_RANK_PID ]]; }
find_rank_pid() {
  wait_until 30 has_rank "$1" || fail "no lbbsp rank with '$1' on its command line within 30 s"
  echo "$FOUND_RANK_PID"
}
# kill_rank_expect_prompt_end PID JOB: SIGKILL the rank; the job (a background pid) must end non-zero within 30 s.
kill_rank_expect_prompt_end() {
  local victim=$1 job=$2 start=$SECONDS
  kill -0 "$victim" 2>/dev/null || fail "rank $victim ended before it was killed: give the run an iteration budget it cannot reach"
  kill -9 "$victim"
  wait_job "$job" 30 "the job after rank $victim was killed"
  ((JOB_RC != 0)) || fail "the job exited 0 after a rank was killed"
  echo "ok: killed rank $victim, job ended in $((SECONDS - start)) s with exit $JOB_RC"
}
# Waiting in tests: for a condition, never for a sleep (docs/testing.md, "Tests that do not race the clock").
# wait_until SECONDS CMD...: runs CMD every 0.1 s until it succeeds (status 0) or SECONDS pass (status 1).
wait_until() {
  local limit=$1 start=$SECONDS; shift
  until "$@"; do
    ((SECONDS - start < limit)) || return 1
    sleep 0.1
  done
}
# progress_at LOG: the last iteration LOG (lbbsp train with --progress-every) shows progress at, or -1.
progress_at() {
  local n
  n=$(grep -oE '^iteration [0-9]+/' "$1" 2>/dev/null | tail -n 1 | grep -oE '[0-9]+') || true
  echo "${n:--1}"
}
progress_reached() { (($(progress_at "$1") >= $2)); }
# wait_for_iteration LOG K [SECONDS]: until LOG shows progress at iteration K or later; fails after SECONDS (30).
wait_for_iteration() {
  wait_until "${3:-30}" progress_reached "$1" "$2" ||
    fail "no progress to iteration $2 in $1 within ${3:-30} s: $(tail -n 5 "$1" 2>&1)"
}
# wait_for_iteration_or_end LOG K PID [SECONDS]: until LOG shows iteration K or the process PID has ended.
progress_or_end() { progress_reached "$1" "$2" || ! kill -0 "$3" 2>/dev/null; }
wait_for_iteration_or_end() {
  wait_until "${4:-30}" progress_or_end "$1" "$2" "$3" ||
    fail "no progress to iteration $2 in $1 within ${4:-30} s, process $3 still running: $(tail -n 5 "$1" 2>&1)"
}
# wait_job PID SECONDS WHAT: waits for the background job PID to end and sets JOB_RC to its exit status; a job
# still running after SECONDS is killed and the test fails naming WHAT.
job_ended() { ! kill -0 "$1" 2>/dev/null; }
wait_job() {
  if ! wait_until "$2" job_ended "$1"; then
    kill -9 "$1" 2>/dev/null || true
    fail "$3: still running $2 s later"
  fi
  JOB_RC=0
  wait "$1" || JOB_RC=$?
}
