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
# find_rank_pid MARKER: pid of one lbbsp rank whose command line contains MARKER (waits up to 10 s). Matches the
# executable, not the name: lbbsp re-executes itself at start-up.
find_rank_pid() {
  local marker=$1 exe pid=""
  exe=$(readlink -f "$LBBSP")
  for _ in $(seq 100); do
    pid=$(pgrep -f -- "$marker" | while read -r p; do
      [[ $(readlink /proc/$p/exe 2>/dev/null) == "$exe" ]] && echo "$p"; done | tail -n 1 || true)
    [[ -n $pid ]] && break
    sleep 0.1
  done
  [[ -n $pid ]] || fail "could not find a rank to kill (marker '$marker')"
  echo "$pid"
}
# kill_rank_expect_prompt_end PID JOB: SIGKILL the rank; the job (a background pid) must end non-zero within 30 s.
kill_rank_expect_prompt_end() {
  local victim=$1 job=$2 start=$SECONDS rc=0
  kill -9 "$victim"
  wait "$job" || rc=$?
  ((rc != 0)) || fail "the job exited 0 after a rank was killed"
  ((SECONDS - start <= 30)) || fail "the job took $((SECONDS - start)) s to end after a rank was killed"
  echo "ok: killed rank $victim, job ended in $((SECONDS - start)) s with exit $rc"
}
# wait_for_iteration LOG K [SECONDS]: until LOG (lbbsp train with --progress-every) shows progress at iteration K
# or later; fails after SECONDS (30).
wait_for_iteration() {
  local n tries=$((${3:-30} * 10))
  for _ in $(seq "$tries"); do
    n=$(grep -oE '^iteration [0-9]+/' "$1" 2>/dev/null | tail -n 1 | grep -oE '[0-9]+') || true
    [[ -n $n ]] && ((n >= $2)) && return 0
    sleep 0.1
  done
  fail "no progress to iteration $2 in $1 within ${3:-30} s: $(cat "$1" 2>&1)"
}
