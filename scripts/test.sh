#!/usr/bin/env bash
# Set up, build and run the test suite with CTest. Extra arguments go to ctest (e.g. -L unit). Without arguments
# everything runs, including label asan: tests/sanitize/run_asan.sh builds lbbsp and the unit tests again with
# ASan+UBSan in build/build-asan (its own folder) and runs the unit and MPI tests there (~5-6 min on 2 cores; the
# whole suite ~13-14 min of ctest).
# LBBSP_SKIP_ASAN=1 ./scripts/test.sh leaves that out for a quicker local run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
# As many tests at once as there are cores: the unit, cli and mpi tests wait on their ranks much of the time;
# the ones that build or start daemons (asan, fuzz, python, multihost, package) are RUN_SERIAL; the slurm ones,
# mostly waiting on their jobs, only exclude each other.
jobs=(-j "$(nproc)")
if (($#)); then
  args=("$@")
elif [[ ${LBBSP_SKIP_ASAN:-0} == 1 ]]; then
  args=(-LE asan)
else
  args=()
fi
rc=0
ctest --output-on-failure --timeout 900 "${jobs[@]}" "${args[@]}" || rc=$?
if ((rc)); then
  # A recap at the very end, where a log cut to its tail still shows it: what each failed test said failed
  # (pytest's FAILED/ERROR lines, GoogleTest's [  FAILED  ], our scripts' FAIL:, a sanitizer's SUMMARY).
  echo "scripts/test.sh: what failed, from Testing/Temporary/LastTest.log:"
  grep -E '^(FAILED|ERROR) |\[  FAILED  \]|^FAIL|^SUMMARY: [A-Za-z]+Sanitizer' Testing/Temporary/LastTest.log |
    cut -c1-300 | tail -n 40 || true
  exit "$rc"
fi
