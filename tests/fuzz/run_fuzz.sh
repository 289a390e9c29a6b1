#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in BUILD_DIR (default build-fuzz next to the source) and runs each on
# its committed corpus (tests/fuzz/corpus/<target>/) for SECONDS (default 20). Crashes, leaks, UB and timeouts
# fail; new inputs go to a scratch copy of the corpus, never into the repository.
#   tests/fuzz/run_fuzz.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-20}
build=${2:-$src/build-fuzz}
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ not found (apt-get install clang libclang-rt-dev)" >&2; exit 1; }
t0=$SECONDS
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLBBSP_FUZZ=ON -DLBBSP_BUILD_BENCH=OFF -DLBBSP_WITH_CUDA=OFF -DLBBSP_PORTABLE=ON >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "${LBBSP_FUZZ_JOBS:-$(nproc)}" --target lbbsp_fuzz_all
echo "run_fuzz.sh: built in $((SECONDS - t0)) s"
export UBSAN_OPTIONS=print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1
# fuzz_one TARGET: SECONDS of libFuzzer on a scratch copy of its corpus; the log tail and non-zero on a finding.
fuzz_one() {
  local target=$1 work=$build/fuzz-work/$1
  rm -rf "$work"; mkdir -p "$work"
  cp "$src/tests/fuzz/corpus/$target/"* "$work/"
  (cd "$build/fuzz-work" && "$build/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$work" >"$build/fuzz-work/$target.log" 2>&1) ||
    { tail -n 60 "$build/fuzz-work/$target.log"; echo "run_fuzz.sh: $target FAILED (log: $build/fuzz-work/$target.log)"; return 1; }
  echo "run_fuzz.sh: $target ok ($(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$build/fuzz-work/$target.log" | grep -oE '[0-9]+$') runs)"
}
# One target per core at a time (each fuzzer runs on one thread).
targets=(fuzz_straggle fuzz_traces fuzz_train_cli fuzz_dataset)
per_round=$(nproc)
failed=0
for ((i = 0; i < ${#targets[@]}; i += per_round)); do
  pids=()
  for target in "${targets[@]:i:per_round}"; do
    fuzz_one "$target" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
done
((failed == 0)) || exit 1
echo "run_fuzz.sh: all targets ran clean in $((SECONDS - t0)) s"
