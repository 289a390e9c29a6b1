#!/usr/bin/env bash
# Builds lbbsp and its unit tests with AddressSanitizer + UndefinedBehaviorSanitizer (-DLBBSP_SANITIZE=ON, g++) in
# BUILD_DIR (default build-asan) and runs `ctest -L 'unit|mpi'` there. Leaks are checked, with the suppressions
# in tests/sanitize/lsan.supp for what Open MPI, PMIx, hwloc and HDF5 allocate once and never free.
#   tests/sanitize/run_asan.sh [BUILD_DIR] [extra ctest args]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-asan}
shift || true
t0=$SECONDS
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLBBSP_SANITIZE=ON -DLBBSP_BUILD_BENCH=OFF \
  -DLBBSP_WITH_CUDA=OFF -DLBBSP_PORTABLE=ON >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "${LBBSP_ASAN_JOBS:-$(nproc)}"
echo "run_asan.sh: built in $((SECONDS - t0)) s"
# abort_on_error: a finding fails the test; the UBSan flags make every UB report fatal and visible.
# fast_unwind_on_malloc=0: Open MPI/PMIx are built without frame pointers; only the slow unwinder reaches the
# library frames the suppressions name.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$src/tests/sanitize/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Open MPI unloads its plugins at MPI_Finalize, so their one-time allocations would be reported from "<unknown
# module>" where no suppression can match: keep them loaded.
export OMPI_MCA_mca_base_component_disable_dlclose=1
# Open MPI forwards the environment to the ranks it starts (mpiexec -x is not needed for local runs).
ctest --test-dir "$build" -L 'unit|mpi' -LE 'fuzz|asan' --output-on-failure --timeout 900 -j 2 "$@"
echo "run_asan.sh: done in $((SECONDS - t0)) s"
